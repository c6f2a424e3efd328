//! The probes' part of status: each probe's verdict and the overall health (the worst enabled
//! probe). The probes in `health` fill it in; the cluster report and metrics read it.

use std::collections::BTreeMap;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

/// A probe's verdict, ordered from best to worst.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum HealthStatus {
    Ok,
    /// Not known (not checked yet, or what it needs is unavailable).
    #[default]
    Unknown,
    /// Working, but not fully (e.g. one of two API endpoints fails).
    Degraded,
    Failed,
}

impl HealthStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            HealthStatus::Ok => "ok",
            HealthStatus::Unknown => "unknown",
            HealthStatus::Degraded => "degraded",
            HealthStatus::Failed => "failed",
        }
    }
}

/// What `ginxctl status --json` shows per probe.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeStatus {
    pub status: HealthStatus,
    pub message: String,
    /// When `status` last changed.
    pub since: Option<Timestamp>,
    pub checked_at: Option<Timestamp>,
    /// When it was last run, on the monotonic clock (what the health gate compares; not
    /// shown).
    #[serde(skip)]
    pub checked: Option<std::time::Instant>,
}

pub type HealthMap = BTreeMap<String, ProbeStatus>;

/// The worst status of the enabled probes and the probes that have it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Overall {
    pub status: HealthStatus,
    /// Probes that are not ok, worst first.
    pub failing: Vec<(String, ProbeStatus)>,
}

pub fn overall(map: &HealthMap) -> Overall {
    let status = map
        .values()
        .map(|p| p.status)
        .max()
        .unwrap_or(HealthStatus::Unknown);
    let mut failing: Vec<(String, ProbeStatus)> = map
        .iter()
        .filter(|(_, p)| p.status != HealthStatus::Ok)
        .map(|(n, p)| (n.clone(), p.clone()))
        .collect();
    failing.sort_by(|a, b| b.1.status.cmp(&a.1.status).then(a.0.cmp(&b.0)));
    Overall { status, failing }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(status: HealthStatus) -> ProbeStatus {
        ProbeStatus {
            status,
            message: String::new(),
            since: None,
            checked_at: None,
            checked: None,
        }
    }

    #[test]
    fn overall_is_the_worst_probe() {
        let mut m = HealthMap::new();
        assert_eq!(overall(&m).status, HealthStatus::Unknown);
        m.insert("kubelet".into(), p(HealthStatus::Ok));
        assert_eq!(overall(&m).status, HealthStatus::Ok);
        m.insert("cilium".into(), p(HealthStatus::Degraded));
        m.insert("systemd".into(), p(HealthStatus::Unknown));
        let o = overall(&m);
        assert_eq!(o.status, HealthStatus::Degraded);
        assert_eq!(
            o.failing.iter().map(|f| f.0.as_str()).collect::<Vec<_>>(),
            ["cilium", "systemd"]
        );
        m.insert("apiserver".into(), p(HealthStatus::Failed));
        assert_eq!(overall(&m).status, HealthStatus::Failed);
        assert_eq!(overall(&m).failing[0].0, "apiserver");
    }
}
