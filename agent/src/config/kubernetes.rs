//! `[kubernetes]`: ginx's kubeconfig and what it writes to the cluster (Lease, annotations,
//! condition).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{ConfigError, Ctx, Duration, bounds, is_dns_subdomain};

/// How ginx reports to the cluster. Without `kubeconfig` nothing is reported (and nothing
/// waits for it).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KubernetesConfig {
    /// ginx's own credentials (client certificate or token); see packaging/kubernetes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig's context [default: its current one].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context: Option<String>,
    /// The node's own identity, the kubelet's (`system:node:<name>`): what ginx does to its
    /// own Node and its pods (annotations, the condition, cordon, the drain's list and
    /// evictions) is done with it, so that the API server's Node authorizer and NodeRestriction
    /// refuse it for any other node. kubeadm writes it; the client certificate it names is
    /// read again when it is rotated.
    pub node_kubeconfig: PathBuf,
    /// Where the heartbeat Lease lives.
    pub namespace: String,
    /// `{node}` is replaced by the node name.
    pub lease_name: String,
    /// The heartbeat Lease's duration: other nodes count a heartbeat older than this as gone.
    pub lease_duration: Duration,
    /// How often the heartbeat Lease is renewed (±5 %); within `lease_duration`.
    pub renew_interval: Duration,
    /// Annotations are compared with the node's and the condition's heartbeat refreshed this
    /// often, even when nothing changed.
    pub resync_interval: Duration,
    /// The type of the node condition ginx writes (`GinxHealthy`).
    pub condition_type: String,
    /// Prefix of the node annotations ginx owns.
    pub annotation_prefix: String,
    /// One API request (connect, read or write) taking longer fails.
    pub request_timeout: Duration,
    /// Write Kubernetes Events about the Node (`events.k8s.io/v1`, namespace `default`, what
    /// `kubectl describe node` shows): applies, gates, rollbacks, halts, drains, reboots,
    /// drift, bootstrap stages. Rate-limited; repeats are counted in a series.
    pub events: bool,
}

impl Default for KubernetesConfig {
    fn default() -> Self {
        Self {
            kubeconfig: None,
            context: None,
            node_kubeconfig: PathBuf::from(DEFAULT_NODE_KUBECONFIG),
            namespace: "ginx-system".to_owned(),
            lease_name: "ginx-{node}".to_owned(),
            lease_duration: Duration::from_secs(40),
            renew_interval: Duration::from_secs(10),
            resync_interval: Duration::from_secs(600),
            condition_type: "GinxHealthy".to_owned(),
            annotation_prefix: "ginx.io/".to_owned(),
            request_timeout: Duration::from_secs(10),
            events: true,
        }
    }
}

/// Where kubeadm writes the kubelet's kubeconfig.
pub const DEFAULT_NODE_KUBECONFIG: &str = "/etc/kubernetes/kubelet.conf";

impl KubernetesConfig {
    pub fn lease_name_for(&self, node: &str) -> String {
        self.lease_name.replace("{node}", node)
    }
}

impl KubernetesConfig {
    /// Checks timings, the kubeconfig path and the names written to the cluster (the Lease's
    /// name, built from the node's, is checked by the caller).
    pub(super) fn validate(&self, ctx: &Ctx<'_>) -> Result<(), ConfigError> {
        let k = self;
        for (bound, d) in [
            (&bounds::HEARTBEAT_LEASE_DURATION, k.lease_duration),
            (&bounds::RENEW_INTERVAL, k.renew_interval),
            (&bounds::RESYNC_INTERVAL, k.resync_interval),
            (&bounds::REQUEST_TIMEOUT, k.request_timeout),
        ] {
            bound.check(ctx, d)?;
        }
        if k.renew_interval >= k.lease_duration {
            let (renew, lease) = ("kubernetes.renew_interval", "kubernetes.lease_duration");
            return Err(if ctx.written(renew) || !ctx.written(lease) {
                ctx.error(
                    renew,
                    format!(
                        "must be shorter than {lease} ({}), or the lease expires between renewals",
                        ctx.shown(lease, k.lease_duration)
                    ),
                )
            } else {
                ctx.error(
                    lease,
                    format!(
                        "{} is not longer than {renew} ({}): the lease would expire between \
                         renewals; make it a few renewals long",
                        k.lease_duration,
                        ctx.shown(renew, k.renew_interval)
                    ),
                )
            });
        }
        for (key, path) in [
            ("kubernetes.kubeconfig", k.kubeconfig.as_deref()),
            (
                "kubernetes.node_kubeconfig",
                Some(k.node_kubeconfig.as_path()),
            ),
        ] {
            if let Some(p) = path
                && !p.is_absolute()
            {
                return Err(ctx.error(key, format!("{} must be an absolute path", p.display())));
            }
        }
        let prefix_ok = k.annotation_prefix.ends_with('/')
            && is_dns_subdomain(k.annotation_prefix.trim_end_matches('/'));
        if !prefix_ok {
            return Err(ctx.error(
                "kubernetes.annotation_prefix",
                "must be a DNS subdomain followed by '/', like \"ginx.io/\"",
            ));
        }
        if k.condition_type.is_empty()
            || !k.condition_type.chars().all(|c| c.is_ascii_alphanumeric())
        {
            return Err(ctx.error(
                "kubernetes.condition_type",
                "must be a CamelCase word, like \"GinxHealthy\"",
            ));
        }
        Ok(())
    }
}
