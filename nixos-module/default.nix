# services.ginx: the ginx node agent on NixOS.
#
# The configuration is `settings`, written as TOML to /etc/ginx/config.toml (ginxctl and the
# daemon read the same file). Only what differs from ginx's own defaults is set here: every
# typed option below defaults to null (left out of the file) unless NixOS knows better, like the
# node name or the colmena to run. See docs/src/reference.md for every key.
{
  config,
  lib,
  pkgs,
  ...
}:

let
  inherit (lib)
    concatMap
    filterAttrs
    getExe
    getExe'
    hasPrefix
    literalExpression
    mapAttrs
    mapAttrsToList
    mkDefault
    mkEnableOption
    mkIf
    mkMerge
    mkOption
    mkPackageOption
    optional
    optionalString
    types
    ;

  cfg = config.services.ginx;
  settingsFormat = pkgs.formats.toml { };

  # TOML has no null: an option left at null is not written, so ginx's default applies; a
  # table left empty by that is not written either.
  prune =
    value:
    if builtins.isAttrs value then
      filterAttrs (_: v: v != null && v != { }) (mapAttrs (_: prune) value)
    else
      value;
  # SIGTERM with a `process` apply running takes at most shutdown_grace + kill_grace (plus a
  # margin): computed from the settings, ginx's defaults where they are not set. Drop-ins in
  # /etc/ginx/config.d are not seen here.
  timeoutStopSec = import ./stop-timeout.nix (
    filterAttrs (_: v: v != null) {
      shutdown_grace = cfg.settings.apply.shutdown_grace or null;
      kill_grace = cfg.settings.apply.kill_grace or null;
    }
  );
  settingsFile = settingsFormat.generate "ginx-config.toml" (prune cfg.settings);

  # Checked at build time with the ginx that will read it (drop-ins are not seen here).
  checkedSettingsFile =
    pkgs.runCommand "ginx-config-checked.toml"
      {
        nativeBuildInputs = [ cfg.package ];
      }
      ''
        ginx check-config --config ${settingsFile} > /dev/null
        cp ${settingsFile} $out
      '';

  configFile =
    if cfg.checkConfig && pkgs.stdenv.buildPlatform.canExecute pkgs.stdenv.hostPlatform then
      checkedSettingsFile
    else
      settingsFile;

  optionalSetting = type: description: extra:
    mkOption (
      {
        type = types.nullOr type;
        default = null;
        inherit description;
      }
      // extra
    );

  # A path given as a string: a Nix path literal would copy the secret into the
  # world-readable Nix store.
  secretPath =
    description:
    optionalSetting types.str "${description} A string, not a Nix path (that would copy the secret into the world-readable Nix store); mode 0600, owned by root." {
      example = "/etc/ginx/deploy_key";
    };

  sourceModule = {
    freeformType = settingsFormat.type;
    options = {
      url = optionalSetting types.str "The repository: ssh://, https://, http://, git://, file:// or a path." {
        example = "ssh://git@git.example.com/infra/hephaestus.git";
      };
      urls = optionalSetting (types.listOf types.str) "Remotes tried in order on every fetch (failover)." { };
      branch = optionalSetting types.str "The branch to follow; null: ginx's default." { };
      interval = optionalSetting types.str "How often to fetch, e.g. \"60s\"; null: ginx's default." { };
      ssh_key_file = secretPath "The SSH deploy key.";
      token_file = secretPath "A file holding the HTTPS token (the password of HTTP basic auth).";
      known_hosts_file = optionalSetting types.str "SSH host keys of the server; null: ginx's default." { };
      allowed_signers_file = optionalSetting types.str "Require heads signed by these SSH keys (git's allowed_signers format)." { };
      openpgp_keyring_file = optionalSetting types.str "Require heads signed by these OpenPGP keys." { };
    };
  };

  # Secret file paths that must not point into the Nix store.
  secretPaths =
    concatMap (
      s:
      builtins.filter (p: p.value != null) [
        {
          name = "settings.sources.${s.name}.ssh_key_file";
          value = s.value.ssh_key_file;
        }
        {
          name = "settings.sources.${s.name}.token_file";
          value = s.value.token_file;
        }
      ]
    ) (mapAttrsToList (name: value: { inherit name value; }) cfg.settings.sources)
    ++ optional (cfg.settings.kubernetes.kubeconfig or null != null) {
      name = "settings.kubernetes.kubeconfig";
      value = cfg.settings.kubernetes.kubeconfig;
    }
    ++ optional (cfg.settings.apply.closure.token_file or null != null) {
      name = "settings.apply.closure.token_file";
      value = cfg.settings.apply.closure.token_file;
    }
    ++ optional (cfg.bootstrap.kubeconfig != null) {
      name = "bootstrap.kubeconfig";
      value = cfg.bootstrap.kubeconfig;
    };

  # services.ginx.bootstrap: the options, and the `[bootstrap]` table made of them.
  stageModule = {
    options = {
      name = mkOption {
        type = types.str;
        example = "cni";
        description = "The stage's name (recorded with its checksum in kube-system/ginx-bootstrap).";
      };
      source = optionalSetting types.str "The source whose checkout holds `path`; null: `path` is absolute (a file the system puts in place, e.g. in the store)." {
        example = "argus";
      };
      path = mkOption {
        type = types.str;
        example = "bootstrap/cilium.yaml";
        description = "The manifests (YAML, rendered ahead of time): relative to the source's checkout, or absolute without `source`.";
      };
      wait = mkOption {
        type = types.listOf types.str;
        default = [ ];
        example = [
          "daemonset/kube-system/cilium"
          "nodes"
        ];
        description = "What must hold before the next stage: `daemonset/<ns>/<name>`, `deployment/<ns>/<name>`, `crd/<name>`, `nodes`, `<group>/<kind>/<ns>/<name>` (Ready=True at its generation).";
      };
      timeout = optionalSetting types.str "How long the waits may take, e.g. \"10m\"; null: ginx's default." { };
    };
  };
  fluxModule = {
    options = {
      source = optionalSetting types.str "The source Flux syncs from (its URL, branch and credentials); null: argus." { };
      version = optionalSetting types.str "`spec.distribution.version`; null: ginx's default (2.x)." { };
      registry = optionalSetting types.str "`spec.distribution.registry`; null: ghcr.io/fluxcd." { };
      components = optionalSetting (types.listOf types.str) "The Flux controllers; null: source, kustomize, helm and notification." { };
      clusterType = optionalSetting types.str "`spec.cluster.type`; null: kubernetes." { };
      networkPolicy = optionalSetting types.bool "`spec.cluster.networkPolicy`; null: true." { };
      domain = optionalSetting types.str "`spec.cluster.domain`; null: cluster.local." { };
      url = optionalSetting types.str "`spec.sync.url`; null: the source's URL." { };
      ref = optionalSetting types.str "`spec.sync.ref`; null: refs/heads/<the source's branch>." { };
      path = mkOption {
        type = types.str;
        example = "clusters/lab";
        description = "`spec.sync.path`: the cluster's directory in the repository.";
      };
      pullSecret = optionalSetting types.str "The Secret in flux-system made from the source's credentials; null: flux-system." { };
      timeout = optionalSetting types.str "How long the FluxInstance may take to become Ready; null: ginx's default." { };
    };
  };
  bootstrapTable = import ./bootstrap.nix {
    inherit (cfg.bootstrap)
      afterInit
      kubeconfig
      stages
      flux
      ;
  };

  ginxctl = getExe' cfg.package "ginxctl";

  initKubeadm = pkgs.writeShellScriptBin "initKubeadm" ''
    # Initialise the first control-plane node: ginxctl kubeadm init (see docs/src/bootstrap.md).
    # With services.ginx.bootstrap.afterInit, the bootstrap ([bootstrap]) runs once the control
    # plane answers; --no-bootstrap skips it.
    exec ${ginxctl} kubeadm init ${optionalString cfg.bootstrap.afterInit "--bootstrap "}"$@"
  '';

  joinCPKubeadm = pkgs.writeShellScriptBin "joinCPKubeadm" ''
    # Join as a control-plane node: joinCPKubeadm TOKEN CERT_KEY [--ca-cert-hash sha256:...]
    # (add --worker, and no CERT_KEY, for a worker).
    exec ${ginxctl} kubeadm join "$@"
  '';
in
{
  options.services.ginx = {
    enable = mkEnableOption "ginx, the agent that keeps this node in step with Git";

    package = mkPackageOption pkgs "ginx" { };

    group = mkOption {
      type = types.nullOr types.str;
      default = null;
      example = "ops";
      description = ''
        Group whose members may run `ginxctl sync`, `suspend`, `resume`, `retry`, `rollback` and
        `accept` (`control.group`; ginx's default is wheel). Created if NixOS does not know it.
      '';
    };

    checkConfig = mkOption {
      type = types.bool;
      default = cfg.settings.sources != { };
      defaultText = literalExpression "config.services.ginx.settings.sources != { }";
      description = ''
        Validate the generated configuration with `ginx check-config` at build time. Off by
        default when no source is declared here (on kaas VMs they come from a cloud-init
        drop-in, which the build cannot see).
      '';
    };

    settings = mkOption {
      default = { };
      description = ''
        The ginx configuration, written to /etc/ginx/config.toml. Any key of docs/src/reference.md,
        "Configuration", may be set; drop-ins in /etc/ginx/config.d/ (cloud-init) override it
        key by key.
      '';
      example = literalExpression ''
        {
          node.role = "control-plane";
          sources.hephaestus = {
            url = "ssh://git@git.example.com/infra/hephaestus.git";
            ssh_key_file = "/etc/ginx/deploy_key";
          };
          sources.argus.url = "https://git.example.com/infra/argus.git";
          kubernetes.kubeconfig = "/etc/ginx/kubeconfig";
        }
      '';
      type = types.submodule {
        freeformType = settingsFormat.type;
        options = {
          node = {
            name = mkOption {
              type = types.nullOr types.str;
              default = if config.networking.hostName != "" then config.networking.hostName else null;
              defaultText = literalExpression ''
                if config.networking.hostName != "" then config.networking.hostName else null
              '';
              description = "The node's name (in the hive and in Kubernetes); null: the kernel hostname at run time.";
            };
            role = optionalSetting (types.enum [
              "control-plane"
              "worker"
            ]) "The node's role; null: ginx's default." { };
          };

          sources = mkOption {
            type = types.attrsOf (types.submodule sourceModule);
            default = { };
            description = "Named Git sources: hephaestus (applied) and argus (read), or any others.";
          };

          apply.command = mkOption {
            type = types.listOf types.str;
            default = [
              (getExe pkgs.colmena)
              "apply-local"
              "--node"
              "{node}"
            ];
            defaultText = literalExpression ''[ (lib.getExe pkgs.colmena) "apply-local" "--node" "{node}" ]'';
            description = "The apply command (argv; `{node}` is replaced, the goal appended).";
          };
        };
      };
    };

    bootstrap = {
      afterInit = mkOption {
        type = types.bool;
        default = false;
        description = ''
          `initKubeadm` runs the bootstrap (`ginxctl bootstrap`) once the control plane answers
          (`bootstrap.after_init`).
        '';
      };
      kubeconfig = secretPath "The credentials of the bootstrap (cluster-admin); null: kubeadm's admin.conf.";
      stages = mkOption {
        type = types.listOf (types.submodule stageModule);
        default = [ ];
        description = "`[[bootstrap.stages]]`: applied in order, each waited for before the next.";
        example = literalExpression ''
          [
            {
              name = "cni";
              source = "argus";
              path = "bootstrap/cilium.yaml";
              wait = [ "daemonset/kube-system/cilium" "nodes" ];
            }
            {
              name = "flux-operator";
              source = "argus";
              path = "bootstrap/flux-operator.yaml";
              wait = [ "deployment/flux-system/flux-operator" "crd/fluxinstances.fluxcd.controlplane.io" ];
            }
          ]
        '';
      };
      flux = mkOption {
        type = types.nullOr (types.submodule fluxModule);
        default = null;
        example = literalExpression ''{ path = "clusters/lab"; }'';
        description = "`[bootstrap.flux]`: the last stage, the FluxInstance `flux` syncing from Argus.";
      };
    };

    kubeadm = {
      enable = mkEnableOption "the `initKubeadm` and `joinCPKubeadm` commands (ginxctl kubeadm init / join)";
      package = mkPackageOption pkgs "kubernetes" {
        extraDescription = "Its kubeadm is the one the commands run.";
      };
    };
  };

  config = mkIf cfg.enable (mkMerge [
    {
      assertions =
        map (p: {
          assertion = !(hasPrefix "${builtins.storeDir}/" (toString p.value));
          message = "ginx: services.ginx.${p.name} is in the Nix store (${toString p.value}), which every user can read; point it at a file outside the store, e.g. under /etc/ginx or /run/secrets.";
        }) secretPaths
        ++ [
          {
            assertion = cfg.bootstrap.afterInit -> (cfg.bootstrap.stages != [ ] || cfg.bootstrap.flux != null);
            message = "ginx: services.ginx.bootstrap.afterInit is set, but there is nothing to run: add services.ginx.bootstrap.stages or services.ginx.bootstrap.flux.";
          }
          {
            assertion = cfg.group != "";
            message = "ginx: services.ginx.group is empty; set a group name, or null for ginx's default (wheel).";
          }
        ];

      warnings = optional (cfg.settings.sources == { } && !config.services.cloud-init.enable) "ginx: services.ginx.settings.sources is empty and cloud-init is off: ginx will not start until a drop-in in /etc/ginx/config.d defines a source.";

      services.ginx.settings.control.group = mkIf (cfg.group != null) cfg.group;

      services.ginx.settings.bootstrap = mkIf (bootstrapTable != { }) bootstrapTable;

      users.groups = mkIf (cfg.group != null) { ${cfg.group} = { }; };

      environment.etc."ginx/config.toml".source = configFile;
      environment.systemPackages = [ cfg.package ];

      systemd.tmpfiles.rules = [
        "d /etc/ginx/config.d 0755 root root -"
        "d /etc/ginx/kubeadm 0700 root root -"
      ];

      # The same directives as packaging/systemd/ginx.service.
      systemd.services.ginx = {
        description = "ginx: keep this node in step with Git";
        documentation = [
          "man:ginx(1)"
          "man:ginxctl(1)"
        ];
        wantedBy = [ "multi-user.target" ];
        wants = [ "network-online.target" ];
        after = [ "network-online.target" ];
        path = [
          pkgs.git
          # `ssh`: ginx fetches ssh:// sources through OpenSSH's client (agent/src/source/transport.rs).
          pkgs.openssh
          config.nix.package
          pkgs.colmena
          config.systemd.package
        ];
        # ginx restarts itself after an activation that changed its binary or unit (once the
        # apply has been recorded); a restart by switch-to-configuration would cut the apply
        # that is running it.
        restartIfChanged = false;
        # A new configuration is a reload (SIGHUP): the running apply is not disturbed.
        reloadTriggers = [ configFile ];
        serviceConfig = {
          Type = "notify";
          ExecStart = "${getExe' cfg.package "ginx"} --config /etc/ginx/config.toml run";
          ExecReload = "${getExe' pkgs.coreutils "kill"} -HUP $MAINPID";
          Restart = "always";
          RestartSec = "5s";
          WatchdogSec = "60s";
          KillMode = "mixed";
          TimeoutStopSec = timeoutStopSec;
          StateDirectory = "ginx";
          StateDirectoryMode = "0700";
          RuntimeDirectory = "ginx";
          RuntimeDirectoryPreserve = "yes";
        };
      };
    }

    (mkIf cfg.kubeadm.enable {
      environment.systemPackages = [
        initKubeadm
        joinCPKubeadm
      ];
      services.ginx.settings.kubeadm.kubeadm_path = mkDefault (getExe' cfg.kubeadm.package "kubeadm");
    })
  ]);

  meta.maintainers = [ ];
}
