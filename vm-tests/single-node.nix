# One node, the real ginx.service from the module, a Hephaestus repository in a local bare
# repository. colmena cannot build a system inside the test VM (no nixpkgs, no network), so
# apply.command is a recorder that stands in for `colmena apply-local`: it checks that it runs
# in the revision's checkout (the trivial hive is there) and records node, goal and revision.
# Under systemd ginx runs each apply in a transient unit (systemd-run), as on a real node.
{ self }:
{ pkgs, lib, ... }:
let
  recorder = pkgs.writeShellScript "colmena-apply-local-recorder" ''
    # argv: apply-local --node NODE GOAL
    set -eu
    test -f hive.nix
    echo "$3 $4 $GINX_REVISION" >> /var/lib/recorder/applies
  '';
in
{
  name = "ginx-single-node";

  nodes.machine = {
    imports = [ (import ./common.nix self) ];
    systemd.tmpfiles.rules = [ "d /var/lib/recorder 0755 root root -" ];
    services.ginx = {
      settings = {
        apply.command = [
          "${recorder}"
          "apply-local"
          "--node"
          "{node}"
        ];
      };
    };
  };

  testScript = ''
    def head():
        return machine.succeed("git -C /srv/work rev-parse HEAD").strip()

    def commit(message):
        machine.succeed(
            "cd /srv/work && echo '# " + message + "' >> hive.nix && git add hive.nix"
            + " && git -c user.name=t -c user.email=t@example.com commit -q -m '" + message + "'"
            + " && git push -q origin main"
        )
        return head()

    def wait_applied(rev):
        machine.wait_until_succeeds(
            "ginxctl status --json | jq -e '.apply.applied_revision == \"" + rev + "\"'"
        )

    machine.wait_for_unit("ginx.service")
    machine.succeed(
        "git init -q --bare -b main /srv/hephaestus.git",
        "git init -q -b main /srv/work",
        "echo '{ meta.nixpkgs = <nixpkgs>; machine = { ... }: { }; }' > /srv/work/hive.nix",
        "git -C /srv/work remote add origin /srv/hephaestus.git",
    )
    first = commit("first")

    with subtest("a revision is fetched and applied"):
        machine.succeed("ginxctl sync")
        wait_applied(first)
        machine.succeed("grep -qx 'machine switch " + first + "' /var/lib/recorder/applies")

    with subtest("a new commit, ginxctl sync, applied"):
        second = commit("second")
        machine.succeed("ginxctl sync")
        wait_applied(second)
        machine.succeed("test $(wc -l < /var/lib/recorder/applies) -eq 2")

    with subtest("a restart does not apply again"):
        machine.succeed("systemctl restart ginx.service")
        machine.wait_for_unit("ginx.service")
        machine.succeed("ginxctl sync")
        wait_applied(second)
        machine.succeed("test $(wc -l < /var/lib/recorder/applies) -eq 2")
        machine.succeed("ginxctl status --json | jq -e '.apply.state == \"succeeded\"'")

    with subtest("reload keeps the socket"):
        machine.succeed("systemctl reload ginx.service")
        machine.succeed("ginxctl status")
  '';
}
