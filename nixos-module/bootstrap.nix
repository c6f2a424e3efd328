# `[bootstrap]` of ginx's configuration from the options of services.ginx.bootstrap (camelCase
# there, the TOML keys of docs/src/bootstrap.md here). Plain Nix, no nixpkgs:
# tests/packaging.rs evaluates it with nix-instantiate and runs `ginx check-config` on the
# result. An option left at null is left out, so ginx's default applies.
{
  afterInit ? false,
  kubeconfig ? null,
  stages ? [ ],
  flux ? null,
}:
let
  present = attrs: builtins.removeAttrs attrs (builtins.filter (n: attrs.${n} == null) (builtins.attrNames attrs));
  stage =
    s:
    present {
      name = s.name;
      source = s.source or null;
      path = s.path;
      wait = s.wait or [ ];
      timeout = s.timeout or null;
    };
  fluxTable =
    f:
    present {
      source = f.source or null;
      version = f.version or null;
      registry = f.registry or null;
      components = f.components or null;
      cluster_type = f.clusterType or null;
      network_policy = f.networkPolicy or null;
      domain = f.domain or null;
      url = f.url or null;
      ref = f.ref or null;
      path = f.path;
      pull_secret = f.pullSecret or null;
      timeout = f.timeout or null;
    };
in
present {
  after_init = if afterInit then true else null;
  kubeconfig = kubeconfig;
  stages = if stages == [ ] then null else map stage stages;
  flux = if flux == null then null else fluxTable flux;
}
