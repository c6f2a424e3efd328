{
  description = "ginx: keeps NixOS Kubernetes nodes in step with Git, safely";

  # Rust 1.95 (edition 2024) is needed to build ginx.
  inputs.nixpkgs.url = "github:NixOS/nixpkgs/nixos-unstable";

  outputs =
    { self, nixpkgs }:
    let
      inherit (nixpkgs) lib;
      systems = [
        "x86_64-linux"
        "aarch64-linux"
      ];
      forAllSystems = f: lib.genAttrs systems (system: f nixpkgs.legacyPackages.${system});
    in
    {
      overlays.default = final: _prev: {
        ginx = final.callPackage ./packaging/nix/package.nix { };
      };

      packages = forAllSystems (pkgs: {
        ginx = pkgs.callPackage ./packaging/nix/package.nix { };
        default = self.packages.${pkgs.stdenv.hostPlatform.system}.ginx;
      });

      # The module, with this flake's ginx as the default package.
      nixosModules.ginx =
        { lib, pkgs, ... }:
        {
          imports = [ ./nixos-module ];
          services.ginx.package = lib.mkDefault self.packages.${pkgs.stdenv.hostPlatform.system}.ginx;
        };
      nixosModules.default = self.nixosModules.ginx;

      checks = forAllSystems (
        pkgs:
        let
          ginx = self.packages.${pkgs.stdenv.hostPlatform.system}.ginx;
          vmTest = file: pkgs.testers.runNixOSTest (import file { inherit self; });
        in
        {
          vm-single-node = vmTest ./vm-tests/single-node.nix;
          vm-self-update = vmTest ./vm-tests/self-update.nix;
          vm-cluster = vmTest ./vm-tests/cluster.nix;
          vm-reboot = vmTest ./vm-tests/reboot.nix;

          fmt =
            pkgs.runCommand "ginx-fmt"
              {
                nativeBuildInputs = [
                  pkgs.cargo
                  pkgs.rustfmt
                ];
              }
              ''
                cd ${self}
                cargo fmt --all --check
                touch $out
              '';

          clippy = ginx.overrideAttrs (old: {
            pname = "ginx-clippy";
            nativeBuildInputs = old.nativeBuildInputs ++ [ pkgs.clippy ];
            buildPhase = ''
              runHook preBuild
              cargo clippy --workspace --all-targets --offline -- -D warnings
              runHook postBuild
            '';
            installPhase = "touch $out";
            postInstall = "";
          });
        }
      );

      devShells = forAllSystems (pkgs: {
        default = pkgs.mkShell {
          inputsFrom = [ self.packages.${pkgs.stdenv.hostPlatform.system}.ginx ];
          packages = [
            pkgs.cargo
            pkgs.rustc
            pkgs.clippy
            pkgs.rustfmt
            pkgs.rust-analyzer
            pkgs.cargo-nextest
            # What the integration tests run: real Git servers, sshd, openssl, namespaces.
            pkgs.git
            pkgs.openssh
            pkgs.openssl
            pkgs.gnupg
            pkgs.iproute2
            pkgs.util-linux
          ];
        };
      });
    };
}
