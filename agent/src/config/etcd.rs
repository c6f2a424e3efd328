//! `[etcd]`: the etcd guard of control-plane nodes with a stacked member (kubeadm's layout).
//! Before such a node takes a slot for something disruptive, every member must answer, carry
//! no alarm and be caught up, and the cluster without this node must keep a quorum; this
//! node's member hands its leadership over first; and the gate after the disruption waits for
//! the member to catch up again.
//!
//! The defaults are kubeadm's: the local client URL and the health-check client certificate.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::bounds::{ETCD_HAND_OVER_ATTEMPTS, ETCD_MAX_LAG, ETCD_TIMEOUT};
use super::{ConfigError, Ctx, Duration};
use crate::types::EndpointUrl;

/// kubeadm's static pod manifest of the stacked member.
pub const DEFAULT_ETCD_MANIFEST: &str = "/etc/kubernetes/manifests/etcd.yaml";

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EtcdConfig {
    /// Whether control-plane nodes with a stacked member consult etcd (worker nodes never do).
    pub guard: bool,
    /// The guard applies when this file exists (kubeadm writes it on nodes with a stacked
    /// member); `""` applies it on every control-plane node.
    pub manifest: PathBuf,
    /// This node's member, as a client reaches it.
    pub endpoint: EndpointUrl,
    /// The CA that signed the members' serving certificates (https only).
    pub ca_file: PathBuf,
    /// The client certificate (https only): kubeadm's health-check client, which etcd lets
    /// read the members' status and move the leadership.
    pub cert_file: PathBuf,
    /// The client certificate's key (https only).
    pub key_file: PathBuf,
    /// Every request to a member.
    pub timeout: Duration,
    /// How far a member's applied raft index may trail the leader's and count as caught up.
    pub max_lag: u32,
    /// Move the leadership away from this node's member before a disruption.
    pub hand_over: bool,
    /// Moves tried (each confirmed by a member's status) before the node waits instead.
    pub hand_over_attempts: u32,
}

impl Default for EtcdConfig {
    fn default() -> Self {
        let pki = |f: &str| PathBuf::from(format!("/etc/kubernetes/pki/etcd/{f}"));
        Self {
            guard: true,
            manifest: PathBuf::from(DEFAULT_ETCD_MANIFEST),
            endpoint: "https://127.0.0.1:2379".parse().expect("a valid URL"),
            ca_file: pki("ca.crt"),
            cert_file: pki("healthcheck-client.crt"),
            key_file: pki("healthcheck-client.key"),
            timeout: Duration::from_secs(5),
            max_lag: 1000,
            hand_over: true,
            hand_over_attempts: 3,
        }
    }
}

impl EtcdConfig {
    pub(super) fn validate(&self, ctx: &Ctx<'_>) -> Result<(), ConfigError> {
        ETCD_TIMEOUT.check(ctx, self.timeout)?;
        ETCD_MAX_LAG.check(ctx, self.max_lag)?;
        ETCD_HAND_OVER_ATTEMPTS.check(ctx, self.hand_over_attempts)?;
        if self.endpoint.url().path() != "/" {
            return Err(ctx.error(
                "etcd.endpoint",
                "must be a member's client URL without a path, like https://127.0.0.1:2379",
            ));
        }
        for (key, path) in [
            ("etcd.ca_file", &self.ca_file),
            ("etcd.cert_file", &self.cert_file),
            ("etcd.key_file", &self.key_file),
        ] {
            if !path.is_absolute() {
                return Err(ctx.error(key, format!("{} must be an absolute path", path.display())));
            }
        }
        if !self.manifest.as_os_str().is_empty() && !self.manifest.is_absolute() {
            return Err(ctx.error(
                "etcd.manifest",
                "must be an absolute path, or \"\" to guard every control-plane node",
            ));
        }
        Ok(())
    }

    /// Whether a node of `role` with this configuration consults etcd: a control-plane node,
    /// the guard on, and (unless `manifest` is empty) the member's manifest present.
    pub fn applies(&self, role: crate::types::Role) -> bool {
        role == crate::types::Role::ControlPlane
            && self.guard
            && (self.manifest.as_os_str().is_empty() || self.manifest.exists())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Role;

    #[test]
    fn only_control_plane_nodes_with_a_stacked_member_are_guarded() {
        let dir = tempfile::tempdir().unwrap();
        let manifest = dir.path().join("etcd.yaml");
        let cfg = EtcdConfig {
            manifest: manifest.clone(),
            ..EtcdConfig::default()
        };
        assert!(
            !cfg.applies(Role::ControlPlane),
            "no manifest: no stacked member"
        );
        std::fs::write(&manifest, "kind: Pod\n").unwrap();
        assert!(cfg.applies(Role::ControlPlane));
        assert!(!cfg.applies(Role::Worker), "a worker never consults etcd");
        let off = EtcdConfig {
            guard: false,
            ..cfg.clone()
        };
        assert!(!off.applies(Role::ControlPlane));
        let everywhere = EtcdConfig {
            manifest: PathBuf::new(),
            ..EtcdConfig::default()
        };
        assert!(everywhere.applies(Role::ControlPlane));
        assert!(!everywhere.applies(Role::Worker));
    }
}
