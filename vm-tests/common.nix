# What every VM test node has: the module with this flake's ginx, a Hephaestus source in a
# local bare repository (/srv/hephaestus.git, created by the test), git and jq for the script.
# Each test sets apply.command: colmena cannot build a system inside the VM (no nixpkgs, no
# network), so a small stand-in takes its place.
self:
{ pkgs, ... }:
{
  imports = [ self.nixosModules.default ];
  environment.systemPackages = [
    pkgs.git
    pkgs.jq
  ];
  services.ginx = {
    enable = true;
    settings.sources.hephaestus = {
      url = "/srv/hephaestus.git";
      interval = "1h";
    };
  };
}
