//! Health probes: kubelet, API server (local and through the VIP), kube-vip, Cilium, systemd and
//! the node's own Ready condition. Each probe runs on its own interval with a timeout and
//! publishes `{status, message, since}`; the overall health is the worst enabled probe.
//!
//! A worker (layer 5): imports `types`, `config`, `status`, `util`, never another worker; the
//! API clients come from the daemon in [`Context`]. The status types are in `status`. Not
//! here: reporting health to the cluster (see `kube`).

pub mod http;
mod probes;

use std::sync::Arc;

use tokio::sync::watch;

use crate::config::Config;
use crate::k8s::KubeClients;
use crate::status::{HealthMap, HealthStatus, ProbeStatus};
use crate::util;

/// What the probes run with.
#[derive(Clone)]
pub struct Context {
    pub config: watch::Receiver<Arc<Config>>,
    pub kube: watch::Receiver<Option<KubeClients>>,
    /// While a health gate is open, every probe runs at least this often.
    pub fast: watch::Receiver<Option<std::time::Duration>>,
}

/// Starts one task per probe; results go into `statuses`.
pub fn spawn(
    ctx: Context,
    statuses: Arc<watch::Sender<HealthMap>>,
    shutdown: watch::Receiver<bool>,
) {
    for probe in probes::ALL {
        let (mut ctx, statuses, mut shutdown) =
            (ctx.clone(), Arc::clone(&statuses), shutdown.clone());
        tokio::spawn(async move {
            loop {
                let cfg = Arc::clone(&ctx.config.borrow());
                let (interval, timeout) = probe.timing(&cfg);
                let interval = match *ctx.fast.borrow_and_update() {
                    Some(fast) => interval.min(fast),
                    None => interval,
                };
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
                    // A gate opened: run now, and at its interval from then on.
                    Ok(()) = ctx.fast.changed() => {}
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
            checked: None,
        });
        let changed = entry.status != status || entry.message != message;
        if entry.status != status {
            tracing::info!(probe = name, from = entry.status.as_str(), to = status.as_str(), detail = %message, "health changed");
            entry.since = Some(now);
        }
        entry.status = status;
        entry.message = message;
        entry.checked_at = Some(now);
        entry.checked = Some(std::time::Instant::now());
        // checked_at alone is not news worth waking everyone for.
        changed
    });
}
