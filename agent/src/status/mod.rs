//! The one [`Status`] value (what `ginxctl status --json` prints) and every part's status type.
//! Producers fill in their part through a watch: the pollers their
//! [`SourceReport`](crate::types::SourceReport) (shown as [`SourceStatus`]), the reconciler
//! [`Published`] ([`ApplyStatus`], [`SystemStatus`]), the probes [`HealthMap`], the reporter
//! [`KubeStatus`], the kubeadm watcher [`KubeadmStatus`]. [`Parts`] assembles them; the socket,
//! metrics, sd-notify STATUS and the cluster report only read the result.
//!
//! Owns: the status types and their JSON shape (fields are added, never renamed). Imports only
//! `types`, `util` and `config`; it must not import a worker, `reconcile` or `control`.

mod apply;
mod bootstrap;
mod gate;
mod health;
mod kubeadm;
mod kubernetes;
mod rollout;
mod source;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

pub use apply::{
    ApplyDrainStatus, ApplyState, ApplyStatus, Drift, PlanStatus, Published, StateWriteError,
    SystemStatus,
};
pub use bootstrap::{BootstrapPhase, BootstrapStatus};
pub use gate::GateProgress;
pub use health::{HealthMap, HealthStatus, Overall, ProbeStatus, overall};
pub use kubeadm::KubeadmStatus;
pub use kubernetes::{KubeState, KubeStatus};
pub use rollout::{
    ClusterNode, ClusterView, FailureStatus, FleetEventStatus, FleetStatus, FreezeStatus,
    HaltStatus, HoldStatus, PauseStatus, Phase, Quarantine, RebootStatus, RevisionCounts,
    RolloutStatus, WaitingFor, WindowStatus,
};
pub use source::{Refused, RemoteStatus, Signed, SourceStatus};

use crate::config::Config;
use crate::types::{Role, SourceReports};

/// The `health` entry that says the state file cannot be written.
pub const STATE_HEALTH: &str = "state";

/// What `ginxctl status --json` prints. Fields are added, never renamed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Status {
    pub node: String,
    pub role: Role,
    pub version: String,
    pub suspended: bool,
    pub sources: BTreeMap<String, SourceStatus>,
    pub apply: ApplyStatus,
    /// What the machine runs: generation, reboot required, drift.
    pub system: SystemStatus,
    /// Probe → `{status, message, since}`.
    pub health: HealthMap,
    /// The overall health: the worst probe.
    pub health_overall: HealthStatus,
    pub kubernetes: KubeStatus,
    /// Rendering of the kubeadm files and drift from the cluster's kubeadm-config; `null` when
    /// `[kubeadm]` says nothing.
    pub kubeadm: Option<KubeadmStatus>,
    /// The rollout of the apply source's revisions through the fleet: lock, gate, halt.
    pub rollout: RolloutStatus,
    /// The last `ginxctl bootstrap` on this node; `null` when `[bootstrap]` configures no stage
    /// and none has run.
    #[serde(default)]
    pub bootstrap: Option<BootstrapStatus>,
    /// This node's answers to the plan requests that stand (`ginxctl plan REF`), oldest
    /// first; empty when none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub previews: Vec<crate::types::PreviewAnswer>,
    /// Where metrics are served (`[metrics] listen`, with the port actually bound).
    pub metrics_listen: Option<SocketAddr>,
    pub started_at: Timestamp,
    pub now: Timestamp,
}

/// The watches [`Status`] is assembled from, one per producer. Every reader holds a clone and
/// calls [`Parts::status`] when it needs the whole value.
#[derive(Clone)]
pub struct Parts {
    pub config: watch::Receiver<Arc<Config>>,
    /// What the pollers report; shown as [`SourceStatus`].
    pub sources: watch::Receiver<SourceReports>,
    pub published: watch::Receiver<Published>,
    pub health: watch::Receiver<HealthMap>,
    pub kubernetes: watch::Receiver<KubeStatus>,
    pub kubeadm: watch::Receiver<Option<KubeadmStatus>>,
    /// The last report of `ginxctl bootstrap` (the control socket keeps it).
    pub bootstrap: watch::Receiver<Option<BootstrapStatus>>,
    /// This node's answers to plan requests (the preview task).
    pub previews: watch::Receiver<Vec<crate::types::PreviewAnswer>>,
    pub metrics_listen: Option<SocketAddr>,
    pub started_at: Timestamp,
}

impl Parts {
    /// The one status value; the socket, STATUS=, metrics and the cluster report read it.
    pub fn status(&self) -> Status {
        let cfg = self.config.borrow();
        let published = self.published.borrow();
        let mut health = self.health.borrow().clone();
        // Not a probe, but as much the node's health: a state that cannot be written.
        if let Some(w) = &published.state_write {
            health.insert(
                STATE_HEALTH.to_owned(),
                ProbeStatus {
                    status: HealthStatus::Failed,
                    message: format!("{}; nothing is applied until it can be written", w.error),
                    since: Some(w.since),
                    checked_at: None,
                    checked: None,
                },
            );
        }
        Status {
            node: cfg.node_name().to_owned(),
            role: cfg.node.role,
            version: crate::version().to_owned(),
            suspended: published.suspended,
            sources: self
                .sources
                .borrow()
                .iter()
                .map(|(name, report)| (name.clone(), SourceStatus::from(report)))
                .collect(),
            apply: published.apply.clone(),
            system: published.system.clone(),
            health: health.clone(),
            health_overall: overall(&health).status,
            kubernetes: self.kubernetes.borrow().clone(),
            kubeadm: self.kubeadm.borrow().clone(),
            rollout: published.rollout.clone(),
            bootstrap: match self.bootstrap.borrow().clone() {
                Some(b) => Some(b.settled(crate::util::process_is)),
                None if cfg.bootstrap.configured() => Some(BootstrapStatus::pending()),
                None => None,
            },
            metrics_listen: self.metrics_listen,
            previews: self.previews.borrow().clone(),
            started_at: self.started_at,
            now: crate::util::now(),
        }
    }
}
