//! `[node]`: who this node is (name, role, addresses). Its name defaults to the kernel hostname,
//! filled in by validation.

use serde::{Deserialize, Serialize};

use super::{ConfigError, Ctx, is_dns_subdomain};
use crate::types::Invalid;
use crate::types::Role;

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NodeConfig {
    /// The node's name in the hive and in Kubernetes. Filled from the kernel hostname when
    /// absent, so once the configuration is loaded it is always set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Control-plane nodes are the ones a rollout must never take down together, so an
    /// unspecified role errs on that side.
    pub role: Role,
    /// The address the API server advertises on this node (kubeadm's localAPIEndpoint).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub advertise_address: Option<std::net::IpAddr>,
    /// The kubelet's `--node-ip`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_ip: Option<std::net::IpAddr>,
}

impl NodeConfig {
    /// Checks the name, or fills it from the kernel hostname.
    pub(super) fn validate(&mut self, ctx: &Ctx<'_>) -> Result<(), ConfigError> {
        match &self.name {
            Some(name) => {
                check_node_name(name).map_err(|m| ctx.error("node.name", m))?;
            }
            None => {
                let host = nix::unistd::gethostname()
                    .ok()
                    .and_then(|h| h.into_string().ok())
                    .map(|h| h.trim().to_ascii_lowercase())
                    .filter(|h| !h.is_empty())
                    .ok_or_else(|| {
                        ctx.error(
                            "node.name",
                            "not set and the hostname cannot be read; set it",
                        )
                    })?;
                check_node_name(&host).map_err(|m| {
                    ctx.error(
                        "node.name",
                        format!("not set, and the hostname is unusable: {m}"),
                    )
                })?;
                self.name = Some(host);
            }
        }
        Ok(())
    }
}

/// Kubernetes node names are DNS subdomains; colmena node names must match them here.
fn check_node_name(name: &str) -> Result<(), Invalid> {
    if is_dns_subdomain(name) {
        Ok(())
    } else {
        Err(Invalid(format!(
            "{name:?} is not a valid node name (lowercase letters, digits, '-' and '.', \
             each dot-separated part starting and ending with a letter or digit)"
        )))
    }
}
