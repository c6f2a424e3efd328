//! `[bootstrap]`: what `ginxctl bootstrap` applies to a new cluster after `kubeadm init`, stage
//! by stage, and what each stage waits for before the next.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{ConfigError, Ctx, Duration, bounds};
use crate::types::Invalid;

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BootstrapConfig {
    /// The credentials the bootstrap uses; default `kubeadm.admin_kubeconfig`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kubeconfig: Option<PathBuf>,
    /// `ginxctl kubeadm init` runs the bootstrap once the control plane answers.
    pub after_init: bool,
    /// In order; each stage's waits hold before the next starts.
    pub stages: Vec<Stage>,
    /// Generates the last stage: the FluxInstance `flux` in `flux-system` and its pull secret.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flux: Option<FluxConfig>,
}

/// `[bootstrap.flux]`: the FluxInstance that hands the cluster over to Flux, syncing from the
/// Argus source (its URL and branch by default, its credentials as the pull secret).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FluxConfig {
    /// The source Flux syncs from: its URL, branch and credentials.
    #[serde(default = "default_flux_source")]
    pub source: String,
    /// `spec.distribution.version`.
    #[serde(default = "default_flux_version")]
    pub version: String,
    /// `spec.distribution.registry`.
    #[serde(default = "default_flux_registry")]
    pub registry: String,
    /// The Flux controllers installed.
    #[serde(default = "default_flux_components")]
    pub components: Vec<String>,
    /// `spec.cluster.type`.
    #[serde(default = "default_cluster_type")]
    pub cluster_type: String,
    /// Whether Flux's NetworkPolicies are installed.
    #[serde(default = "default_true")]
    pub network_policy: bool,
    /// The cluster's DNS domain, as Flux needs it.
    #[serde(default = "default_domain")]
    pub domain: String,
    /// `spec.sync.url`; default: the source's URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// `spec.sync.ref`; default `refs/heads/<the source's branch>`.
    #[serde(default, rename = "ref", skip_serializing_if = "Option::is_none")]
    pub git_ref: Option<String>,
    /// `spec.sync.path`, like `clusters/lab`.
    pub path: String,
    /// The Secret in `flux-system` made from the source's credentials (`spec.sync.pullSecret`).
    #[serde(default = "default_pull_secret")]
    pub pull_secret: String,
    /// How long the FluxInstance may take to become Ready.
    #[serde(default = "default_timeout")]
    pub timeout: Duration,
}

fn default_flux_source() -> String {
    "argus".into()
}
fn default_flux_version() -> String {
    "2.x".into()
}
fn default_flux_registry() -> String {
    "ghcr.io/fluxcd".into()
}
fn default_flux_components() -> Vec<String> {
    [
        "source-controller",
        "kustomize-controller",
        "helm-controller",
        "notification-controller",
    ]
    .map(String::from)
    .to_vec()
}
fn default_cluster_type() -> String {
    "kubernetes".into()
}
fn default_true() -> bool {
    true
}
fn default_domain() -> String {
    "cluster.local".into()
}
fn default_pull_secret() -> String {
    "flux-system".into()
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Stage {
    /// The stage's name (in status, `--only`, the Events).
    pub name: String,
    /// A source whose checkout holds `path`; without it, `path` is absolute.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// The manifests: one YAML file of one or more documents.
    pub path: String,
    /// What must hold before the next stage: `daemonset/<ns>/<name>`,
    /// `deployment/<ns>/<name>`, `crd/<name>`, `nodes`, `<group>/<kind>/<ns>/<name>`.
    #[serde(default)]
    pub wait: Vec<String>,
    /// How long the stage's objects may take to be ready.
    #[serde(default = "default_timeout")]
    pub timeout: Duration,
}

fn default_timeout() -> Duration {
    Duration::from_secs(600)
}

/// One thing a stage waits for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Wait {
    /// Rolled out: every scheduled pod updated and available at the current generation.
    DaemonSet { namespace: String, name: String },
    /// `Available=True` at the current generation.
    Deployment { namespace: String, name: String },
    /// `Established=True`.
    Crd { name: String },
    /// Every node Ready.
    Nodes,
    /// `Ready=True` with `observedGeneration` at the object's generation.
    Ready {
        group: String,
        kind: String,
        namespace: String,
        name: String,
    },
}

impl Wait {
    pub fn parse(s: &str) -> Result<Self, Invalid> {
        let parts: Vec<&str> = s.split('/').collect();
        let ok = |p: &str| !p.is_empty() && !p.contains(char::is_whitespace);
        if !parts.iter().all(|p| ok(p)) {
            return Err(Invalid(format!("{s:?}: empty or blank part")));
        }
        Ok(match parts.as_slice() {
            ["nodes"] => Wait::Nodes,
            ["crd", name] => Wait::Crd {
                name: (*name).to_owned(),
            },
            ["daemonset", ns, name] => Wait::DaemonSet {
                namespace: (*ns).to_owned(),
                name: (*name).to_owned(),
            },
            ["deployment", ns, name] => Wait::Deployment {
                namespace: (*ns).to_owned(),
                name: (*name).to_owned(),
            },
            [group, kind, ns, name] => Wait::Ready {
                group: (*group).to_owned(),
                kind: (*kind).to_owned(),
                namespace: (*ns).to_owned(),
                name: (*name).to_owned(),
            },
            _ => {
                return Err(Invalid(format!(
                    "{s:?} is not one of daemonset/<ns>/<name>, deployment/<ns>/<name>, \
                     crd/<name>, nodes, <group>/<kind>/<ns>/<name>"
                )));
            }
        })
    }
}

impl std::fmt::Display for Wait {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Wait::DaemonSet { namespace, name } => write!(f, "daemonset/{namespace}/{name}"),
            Wait::Deployment { namespace, name } => write!(f, "deployment/{namespace}/{name}"),
            Wait::Crd { name } => write!(f, "crd/{name}"),
            Wait::Nodes => write!(f, "nodes"),
            Wait::Ready {
                group,
                kind,
                namespace,
                name,
            } => write!(f, "{group}/{kind}/{namespace}/{name}"),
        }
    }
}

impl BootstrapConfig {
    /// Whether there is anything to bootstrap.
    pub fn configured(&self) -> bool {
        !self.stages.is_empty() || self.flux.is_some()
    }

    pub(super) fn validate(
        &self,
        sources: &std::collections::BTreeMap<String, super::SourceConfig>,
        ctx: &Ctx<'_>,
    ) -> Result<(), ConfigError> {
        let mut names = std::collections::BTreeSet::new();
        for (i, s) in self.stages.iter().enumerate() {
            check_stage(i, s, &mut names, sources, ctx)?;
        }
        if let Some(f) = &self.flux {
            check_flux(f, &names, sources, ctx)?;
        }
        if self.after_init && !self.configured() {
            return Err(ctx.error(
                "bootstrap.after_init",
                "there is nothing to run: add [[bootstrap.stages]] or [bootstrap.flux], or drop it",
            ));
        }
        Ok(())
    }

    /// The stages' waits, parsed (validated at load).
    pub fn waits(stage: &Stage) -> Vec<Wait> {
        stage
            .wait
            .iter()
            .filter_map(|w| Wait::parse(w).ok())
            .collect()
    }
}

/// Stage `i`: a name of its own (added to `names`), a manifest where its source says, waits
/// that parse, a timeout in bounds.
fn check_stage(
    i: usize,
    s: &Stage,
    names: &mut std::collections::BTreeSet<String>,
    sources: &std::collections::BTreeMap<String, super::SourceConfig>,
    ctx: &Ctx<'_>,
) -> Result<(), ConfigError> {
    let key = |k: &str| format!("bootstrap.stages[{i}].{k}");
    if s.name.trim().is_empty() || !names.insert(s.name.clone()) {
        return Err(ctx.error(
            &key("name"),
            format!("{:?}: every stage needs a name of its own", s.name),
        ));
    }
    match &s.source {
        Some(src) if !sources.contains_key(src) => {
            return Err(ctx.error(&key("source"), format!("{src:?} names no source")));
        }
        Some(_) if s.path.starts_with('/') || s.path.split('/').any(|p| p == "..") => {
            return Err(ctx.error(
                &key("path"),
                format!(
                    "{:?} must be relative to the source's checkout, without ..",
                    s.path
                ),
            ));
        }
        None if !s.path.starts_with('/') => {
            return Err(ctx.error(
                &key("path"),
                format!(
                    "{:?}: without `source` the path must be absolute (a file the \
                     system puts in place)",
                    s.path
                ),
            ));
        }
        _ => {}
    }
    for (j, w) in s.wait.iter().enumerate() {
        if let Err(e) = Wait::parse(w) {
            return Err(ctx.error(&format!("bootstrap.stages[{i}].wait[{j}]"), e));
        }
    }
    bounds::STAGE_TIMEOUT.check_at(ctx, &key("timeout"), s.timeout)?;
    Ok(())
}

/// `[bootstrap.flux]`: a configured source, a URL without credentials, a path in the
/// repository, and no configured stage (of `stage_names`) taking the name of the one it makes.
fn check_flux(
    f: &FluxConfig,
    stage_names: &std::collections::BTreeSet<String>,
    sources: &std::collections::BTreeMap<String, super::SourceConfig>,
    ctx: &Ctx<'_>,
) -> Result<(), ConfigError> {
    if !sources.contains_key(&f.source) {
        return Err(ctx.error(
            "bootstrap.flux.source",
            format!(
                "{:?} names no source; Flux syncs from a configured source",
                f.source
            ),
        ));
    }
    // The URL goes into the FluxInstance as written, which anyone who can read the
    // cluster's custom resources sees, and into check-config's output: credentials go
    // into the pull secret (the source's token_file or deploy key), never into it.
    if let Some(url) = &f.url {
        let parsed = url.parse::<crate::types::RemoteUrl>().map_err(|e| {
            ctx.error(
                "bootstrap.flux.url",
                format!("is not a Git URL Flux can use: {e}"),
            )
        })?;
        if parsed.has_inline_credentials() {
            return Err(ctx.error(
                "bootstrap.flux.url",
                format!(
                    "{parsed} carries credentials (a password, a user name over HTTP(S), \
                     a query or a fragment): they would be readable in the FluxInstance; \
                     drop them, the pull secret carries the source's token_file or \
                     deploy key"
                ),
            ));
        }
    }
    if f.path.trim().is_empty() || f.path.starts_with('/') {
        return Err(ctx.error(
            "bootstrap.flux.path",
            "must be a path in the repository, like \"clusters/lab\"",
        ));
    }
    if stage_names.contains("flux") {
        return Err(ctx.error(
            "bootstrap.flux",
            "generates the stage \"flux\"; rename the configured stage of that name",
        ));
    }
    bounds::FLUX_TIMEOUT.check(ctx, f.timeout)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_parse_and_print_back() {
        for s in [
            "daemonset/kube-system/cilium",
            "deployment/flux-system/flux-operator",
            "crd/fluxinstances.fluxcd.controlplane.io",
            "nodes",
            "fluxcd.controlplane.io/FluxInstance/flux-system/flux",
        ] {
            assert_eq!(Wait::parse(s).unwrap().to_string(), s);
        }
        for bad in ["", "pods/x", "daemonset/x", "a//b/c", "crd/ x"] {
            assert!(Wait::parse(bad).is_err(), "{bad}");
        }
    }
}
