//! The kubeadm watcher's part of status: what was rendered from which facts, and drift from the
//! cluster's kubeadm-config. The watcher in `kubeadm` fills it in.

use std::path::PathBuf;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

/// `kubeadm` in `ginxctl status --json`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KubeadmStatus {
    /// Where the cluster facts came from besides the configuration (`argus:<file>@<revision>`).
    pub facts_from: Option<String>,
    pub rendered: Vec<PathBuf>,
    pub rendered_at: Option<Timestamp>,
    /// Why the facts cannot be rendered.
    pub error: Option<String>,
    pub warnings: Vec<String>,
    /// Differences between the rendered ClusterConfiguration and the cluster's.
    pub drift: Vec<String>,
    pub drift_checked_at: Option<Timestamp>,
    /// Why the cluster's configuration could not be compared.
    pub drift_error: Option<String>,
}
