//! The cluster connection's part of status: connected or why not, the heartbeat, whether the
//! node report is written. The reporter in `kube` fills it in.

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

/// `kubernetes.state` in status.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum KubeState {
    /// No `kubernetes.kubeconfig`, or the file does not exist yet.
    #[default]
    NotConfigured,
    Connecting,
    Connected,
    /// The API cannot be reached, or answers with server errors.
    Unreachable,
    /// The API refuses ginx's credentials (401) or permissions (403, missing namespace).
    Refused,
}

impl KubeState {
    pub fn as_str(self) -> &'static str {
        match self {
            KubeState::NotConfigured => "not-configured",
            KubeState::Connecting => "connecting",
            KubeState::Connected => "connected",
            KubeState::Unreachable => "unreachable",
            KubeState::Refused => "refused",
        }
    }
}

/// `kubernetes` in `ginxctl status --json`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KubeStatus {
    pub state: KubeState,
    /// When `state` last changed.
    pub since: Option<Timestamp>,
    pub error: Option<String>,
    /// `namespace/name` of the heartbeat Lease.
    pub lease: Option<String>,
    pub last_heartbeat: Option<Timestamp>,
    /// Annotations and condition written for the current state.
    pub reported: bool,
    /// Why the node report (annotations, condition) cannot be written, while it cannot.
    pub report_error: Option<String>,
}
