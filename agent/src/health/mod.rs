//! Health probes: kubelet, API server (local and through the VIP), kube-vip, Cilium, systemd and
//! the node's own Ready condition. Each probe runs on its own interval with a timeout and
//! publishes `{status, message, since}`; the overall health is the worst enabled probe.
//!
//! Not here: reporting health to the cluster (see `kube`).

pub mod http;
mod probes;

use std::collections::BTreeMap;
use std::sync::Arc;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::config::Config;
use crate::kube::KubeClients;
use crate::util;

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

/// What the probes run with.
#[derive(Clone)]
pub struct Context {
    pub config: watch::Receiver<Arc<Config>>,
    pub kube: watch::Receiver<Option<KubeClients>>,
}

/// Starts one task per probe; results go into `statuses`.
pub fn spawn(
    ctx: Context,
    statuses: Arc<watch::Sender<HealthMap>>,
    shutdown: watch::Receiver<bool>,
) {
    for probe in probes::ALL {
        let (ctx, statuses, mut shutdown) = (ctx.clone(), Arc::clone(&statuses), shutdown.clone());
        tokio::spawn(async move {
            loop {
                let cfg = Arc::clone(&ctx.config.borrow());
                let (interval, timeout) = probe.timing(&cfg);
                match probe.applies(&cfg) {
                    false => {
                        statuses.send_if_modified(|m| m.remove(probe.name()).is_some());
                    }
                    true => {
                        // Each request of a probe is bounded by `timeout` (the Cilium probe may
                        // make two in a row); this only stops a probe that hangs elsewhere.
                        let backstop = timeout * 2 + std::time::Duration::from_secs(1);
                        let (status, message) =
                            tokio::time::timeout(backstop, probe.run(&cfg, &ctx))
                                .await
                                .unwrap_or_else(|_| {
                                    (
                                        HealthStatus::Failed,
                                        format!("no answer within {}s", backstop.as_secs_f32()),
                                    )
                                });
                        record(&statuses, probe.name(), status, message);
                    }
                }
                tokio::select! {
                    () = tokio::time::sleep(util::jitter(interval, 0.05)) => {}
                    _ = shutdown.changed() => return,
                }
            }
        });
    }
}

fn record(statuses: &watch::Sender<HealthMap>, name: &str, status: HealthStatus, message: String) {
    let now = util::now();
    statuses.send_if_modified(|m| {
        let entry = m.entry(name.to_owned()).or_insert(ProbeStatus {
            status,
            message: String::new(),
            since: Some(now),
            checked_at: None,
        });
        let changed = entry.status != status || entry.message != message;
        if entry.status != status {
            tracing::info!(probe = name, from = entry.status.as_str(), to = status.as_str(), message = %message, "health changed");
            entry.since = Some(now);
        }
        entry.status = status;
        entry.message = message;
        entry.checked_at = Some(now);
        // checked_at alone is not news worth waking everyone for.
        changed
    });
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
