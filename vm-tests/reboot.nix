# A kernel change makes the node reboot through ginx and come back. The machine boots through
# its boot loader (virtualisation.useBootLoader), so that what `switch-to-configuration boot`
# installs is what the next boot runs. Its specialisation "newkernel" has another initrd (an
# extra module in it: a change only a reboot brings into use, as a new kernel is). The apply
# command makes that specialisation the system profile's new generation with goal `boot`, as
# `colmena apply-local boot` would; ginx sees the reboot is required, and with
# reboot.mode = "when-required" (no cluster: no lock, no drain) runs `systemctl reboot`. After
# the boot, the booted system is the new one, the requirement is gone, and the history holds
# one attempt.
{ self }:
{ pkgs, lib, ... }:
let
  applyNewKernel = pkgs.writeShellScript "colmena-apply-local-newkernel" ''
    # argv: apply-local --node NODE GOAL
    set -eu
    new=$(readlink -f /run/current-system/specialisation/newkernel)
    nix-env --profile /nix/var/nix/profiles/system --set "$new"
    exec "$new/bin/switch-to-configuration" boot
  '';
in
{
  name = "ginx-reboot";

  nodes.machine = {
    imports = [ (import ./common.nix self) ];
    virtualisation.useBootLoader = true;
    virtualisation.useEFIBoot = true;
    boot.loader.systemd-boot.enable = true;
    boot.loader.efi.canTouchEfiVariables = true;
    services.ginx.settings = {
      apply.goal = "boot";
      apply.command = [
        "${applyNewKernel}"
        "apply-local"
        "--node"
        "{node}"
      ];
      rollout.lock = "none";
      reboot.mode = "when-required";
    };
    specialisation.newkernel.configuration = {
      boot.initrd.kernelModules = [ "dm-snapshot" ];
    };
  };

  testScript = ''
    machine.wait_for_unit("ginx.service")
    first_boot = machine.succeed("cat /proc/sys/kernel/random/boot_id").strip()
    booted = machine.succeed("readlink -f /run/booted-system").strip()

    machine.succeed(
        "git init -q --bare -b main /srv/hephaestus.git",
        "git init -q -b main /srv/work",
        "echo '{ }' > /srv/work/hive.nix",
        "cd /srv/work && git add hive.nix && git -c user.name=t -c user.email=t@example.com commit -q -m kernel",
        "git -C /srv/work push -q /srv/hephaestus.git main",
    )
    machine.succeed("ginxctl sync")

    with subtest("ginx reboots the machine into the new system"):
        machine.wait_for_shutdown()
        machine.start()
        machine.wait_for_unit("ginx.service")
        machine.wait_until_succeeds(
            "test \"$(cat /proc/sys/kernel/random/boot_id)\" != " + first_boot
        )
        machine.succeed("test \"$(readlink -f /run/booted-system)\" != " + booted)

    with subtest("back: the reboot is done and nothing is required any more"):
        machine.wait_until_succeeds(
            "ginxctl status --json | jq -e '.rollout.reboot.phase == null"
            + " and .system.reboot_required == false'"
        )
        machine.succeed(
            "ginxctl history --json | jq -e '.attempts | length == 1 and .[0].outcome == \"succeeded\"'"
        )
  '';
}
