# ginx and ginxctl, with shell completions and man pages generated from their argument
# definitions (`ginx generate-assets`, clap_complete and clap_mangen).
{
  lib,
  stdenv,
  rustPlatform,
  pkg-config,
  installShellFiles,
  zlib,
}:

let
  root = ../..;
  workspace = lib.importTOML (root + "/Cargo.toml");
in
rustPlatform.buildRustPackage {
  pname = "ginx";
  inherit (workspace.workspace.package) version;

  src = lib.fileset.toSource {
    inherit root;
    fileset = lib.fileset.unions [
      (root + "/Cargo.toml")
      (root + "/Cargo.lock")
      (root + "/agent")
      # agent/Cargo.toml names the integration tests, so cargo wants them present.
      (root + "/tests")
    ];
  };

  cargoLock.lockFile = root + "/Cargo.lock";
  cargoBuildFlags = [
    "--package"
    "ginx"
  ];

  nativeBuildInputs = [
    pkg-config
    installShellFiles
  ];
  # libgit2 without HTTPS or SSH of its own: ginx carries those itself (rustls, OpenSSH's client).
  buildInputs = [
    zlib
  ];

  # The tests need git daemon, sshd, openssl and network namespaces; they run in CI
  # (`bash .ci/run`) and the VM tests (`nix flake check`), not in the sandbox.
  doCheck = false;

  # `kubectl ginx cluster`: kubectl runs its plugins by name from PATH.
  postInstall = ''
    ln -s ginxctl $out/bin/kubectl-ginx
  ''
  + lib.optionalString (stdenv.buildPlatform.canExecute stdenv.hostPlatform) ''
    $out/bin/ginx generate-assets --out assets
    installShellCompletion --cmd ginx \
      --bash assets/completions/ginx.bash \
      --zsh assets/completions/_ginx \
      --fish assets/completions/ginx.fish
    installShellCompletion --cmd ginxctl \
      --bash assets/completions/ginxctl.bash \
      --zsh assets/completions/_ginxctl \
      --fish assets/completions/ginxctl.fish
    installManPage assets/man/*.1
  '';

  meta = {
    description = "Node agent that keeps NixOS Kubernetes nodes in step with Git, safely";
    homepage = workspace.workspace.package.repository;
    license = lib.licenses.asl20;
    mainProgram = "ginx";
    platforms = lib.platforms.linux;
  };
}
