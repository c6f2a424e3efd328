# An activation that replaces ginx itself. The machine boots a system whose specialisation
# "updated" has ginx from another store path (a copy of the same build: a new version as far as
# systemd and the store are concerned) and so a different ginx.service. The apply command
# switches to that specialisation, as `colmena apply-local` switches to a new system.
# restartIfChanged = false keeps switch-to-configuration from restarting ginx mid-apply; ginx
# records the outcome, exits, and systemd (Restart=always) starts the new version.
{ self }:
{ pkgs, lib, ... }:
let
  ginx = self.packages.${pkgs.stdenv.hostPlatform.system}.ginx;
  ginxUpdated = pkgs.runCommand "ginx-updated" { } ''
    mkdir -p $out/bin
    cp ${ginx}/bin/ginx ${ginx}/bin/ginxctl $out/bin/
  '';
  switchToUpdated = pkgs.writeShellScript "colmena-apply-local-updated" ''
    # argv: apply-local --node NODE GOAL
    set -eu
    exec /run/booted-system/specialisation/updated/bin/switch-to-configuration "$4"
  '';
in
{
  name = "ginx-self-update";

  nodes.machine = {
    imports = [ (import ./common.nix self) ];
    # The goal is `switch`, which installs the boot loader first; the test VM's root image has
    # no partition table, so grub-install would fail and nothing would be activated (nixpkgs'
    # own switch-test disables GRUB for the same reason). The specialisation inherits this.
    boot.loader.grub.enable = false;
    services.ginx = {
      settings = {
        apply.command = [
          "${switchToUpdated}"
          "apply-local"
          "--node"
          "{node}"
        ];
      };
    };
    specialisation.updated.configuration = {
      services.ginx.package = lib.mkForce ginxUpdated;
    };
  };

  testScript = ''
    machine.wait_for_unit("ginx.service")
    old_pid = machine.succeed("systemctl show -p MainPID --value ginx.service").strip()
    machine.succeed("readlink /proc/" + old_pid + "/exe | grep -v ginx-updated")

    machine.succeed(
        "git init -q --bare -b main /srv/hephaestus.git",
        "git init -q -b main /srv/work",
        "echo '{ }' > /srv/work/hive.nix",
        "cd /srv/work && git add hive.nix && git -c user.name=t -c user.email=t@example.com commit -q -m update",
        "git -C /srv/work push -q /srv/hephaestus.git main",
    )
    rev = machine.succeed("git -C /srv/work rev-parse HEAD").strip()
    machine.succeed("ginxctl sync")

    with subtest("ginx comes back on the new version"):
        machine.wait_until_succeeds(
            "pid=$(systemctl show -p MainPID --value ginx.service);"
            + " test \"$pid\" != 0 && test \"$pid\" != " + old_pid
            + " && readlink /proc/$pid/exe | grep -q ginx-updated"
        )
        machine.wait_for_unit("ginx.service")
        machine.succeed("systemctl cat ginx.service | grep -q ginx-updated")

    with subtest("the activation was recorded once, as a success, and not applied again"):
        machine.wait_until_succeeds(
            "ginxctl status --json | jq -e '.apply.applied_revision == \"" + rev + "\"'"
        )
        machine.succeed(
            "ginxctl history --json | jq -e '[.attempts[] | select(.revision == \"" + rev + "\")]"
            + " | length == 1 and .[0].outcome == \"succeeded\"'"
        )
        machine.succeed("ginxctl sync")
        machine.succeed("ginxctl history --json | jq -e '.attempts | length == 1'")
  '';
}
