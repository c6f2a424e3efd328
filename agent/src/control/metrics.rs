//! The Prometheus exposition: `GET /metrics` on `[metrics] listen`, the metric families with the
//! state gauges set from the one `Status` value at scrape time. Beside the control socket
//! because, like it, it only reads status.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use http_body_util::Full;
use hyper::body::Bytes;
use tokio::sync::watch;

use crate::metrics::{Gauges, Metrics, RevisionLabels};
use crate::status::{ApplyState, HealthStatus, Parts, Status, WaitingFor};

const APPLY_STATES: [ApplyState; 9] = [
    ApplyState::Idle,
    ApplyState::Pending,
    ApplyState::Waiting,
    ApplyState::Building,
    ApplyState::Applying,
    ApplyState::Verifying,
    ApplyState::Succeeded,
    ApplyState::Failed,
    ApplyState::RolledBack,
];

const HEALTH: [HealthStatus; 4] = [
    HealthStatus::Ok,
    HealthStatus::Unknown,
    HealthStatus::Degraded,
    HealthStatus::Failed,
];

/// The exposition of `metrics`, with the state gauges set from `status`.
pub fn render(metrics: &Metrics, status: &Status) -> String {
    let revisions = status
        .sources
        .iter()
        .filter_map(|(name, s)| {
            let r = s.revision.as_ref()?;
            Some(RevisionLabels {
                source: name.clone(),
                revision: r.to_string(),
                branch: s
                    .revision_branch
                    .clone()
                    .unwrap_or_else(|| s.branch.clone()),
            })
        })
        .collect();
    let apply_states = APPLY_STATES.map(ApplyState::as_str);
    let health_statuses = HEALTH.map(HealthStatus::as_str);
    let waiting = WaitingFor::ALL.map(WaitingFor::as_str);
    let role = status.role.to_string();
    metrics.render(&Gauges {
        node: &status.node,
        role: &role,
        group: &status.rollout.group,
        waiting: &waiting,
        waiting_for: status.rollout.waiting().map(WaitingFor::as_str),
        halted: status.rollout.halt.is_some(),
        applied: status.apply.applied_revision.as_ref().map(|r| r.as_str()),
        drift: status.system.drift.is_some(),
        revisions,
        apply_states: &apply_states,
        apply_state: status.apply.state.as_str(),
        suspended: status.suspended,
        reboot_required: status.system.reboot_required,
        health_statuses: &health_statuses,
        probes: status
            .health
            .iter()
            .map(|(probe, p)| (probe.as_str(), p.status.as_str()))
            .collect(),
    })
}

/// Serves `GET /metrics` on `listener` until `shutdown`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    parts: Arc<Parts>,
    metrics: Arc<Metrics>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let stream = tokio::select! {
            a = listener.accept() => match a {
                Ok((s, _)) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "accept on the metrics listener failed");
                    continue;
                }
            },
            _ = shutdown.changed() => return,
        };
        let (parts, metrics) = (Arc::clone(&parts), Arc::clone(&metrics));
        tokio::spawn(async move {
            let svc =
                hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let (parts, metrics) = (Arc::clone(&parts), Arc::clone(&metrics));
                    async move {
                        let started = Instant::now();
                        let response = if req.uri().path() == "/metrics" {
                            let body = render(&metrics, &parts.status());
                            http::Response::builder()
                                .header(
                                    http::header::CONTENT_TYPE,
                                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                                )
                                .body(Full::new(Bytes::from(body)))
                        } else {
                            http::Response::builder()
                                .status(404)
                                .body(Full::new(Bytes::from_static(b"metrics are at /metrics\n")))
                        };
                        tracing::trace!(elapsed = ?started.elapsed(), "metrics scraped");
                        response
                    }
                });
            let _ = tokio::time::timeout(
                std::time::Duration::from_secs(30),
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), svc),
            )
            .await;
        });
    }
}

/// Binds the metrics listener; the error names the address.
pub async fn bind(addr: SocketAddr) -> anyhow::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen for metrics on {addr} ([metrics] listen): {e}"))
}
