//! Prometheus metrics (prometheus-client), served on `[metrics] listen` when set.
//!
//! Counters are counted where things happen (fetches, applies, API requests, heartbeats);
//! gauges describing the current state are set from the one `Status` value at scrape time.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Instant;

use http_body_util::Full;
use hyper::body::Bytes;
use jiff::Timestamp;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;
use tokio::sync::watch;

use crate::control::Status;
use crate::control::server::Backend;
use crate::health::HealthStatus;
use crate::reconcile::ApplyState;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceLabels {
    pub source: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FetchLabels {
    pub source: String,
    /// ok | error | refused
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RevisionLabels {
    pub source: String,
    pub revision: String,
    pub branch: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    pub state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProbeLabels {
    pub probe: String,
    pub status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub verb: String,
    /// The HTTP status, or `error` when no response came.
    pub code: String,
}

pub struct Metrics {
    registry: Registry,
    fetches: Family<FetchLabels, Counter>,
    fetch_last_success: Family<SourceLabels, Gauge<f64, AtomicU64>>,
    revision: Family<RevisionLabels, Gauge>,
    applies: Family<ResultLabels, Counter>,
    apply_duration: Histogram,
    apply_state: Family<StateLabels, Gauge>,
    suspended: Gauge,
    reboot_required: Gauge,
    probes: Family<ProbeLabels, Gauge>,
    kube_requests: Family<RequestLabels, Counter>,
    heartbeat_last_success: Gauge<f64, AtomicU64>,
    /// Held by `render` from setting the state gauges to encoding them: two scrapes at once
    /// (an HA Prometheus pair) would otherwise see each other's cleared families.
    rendering: std::sync::Mutex<()>,
}

const APPLY_STATES: [ApplyState; 8] = [
    ApplyState::Idle,
    ApplyState::Pending,
    ApplyState::Waiting,
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

fn seconds(t: Timestamp) -> f64 {
    t.as_millisecond() as f64 / 1000.0
}

impl Metrics {
    pub fn new() -> Arc<Self> {
        let mut registry = Registry::with_prefix("ginx");
        let m = Self {
            fetches: Family::default(),
            fetch_last_success: Family::default(),
            revision: Family::default(),
            applies: Family::default(),
            apply_duration: Histogram::new(exponential_buckets(1.0, 2.0, 14)),
            apply_state: Family::default(),
            suspended: Gauge::default(),
            reboot_required: Gauge::default(),
            probes: Family::default(),
            kube_requests: Family::default(),
            heartbeat_last_success: Gauge::default(),
            rendering: std::sync::Mutex::new(()),
            registry: Registry::default(),
        };
        registry.register(
            "build",
            "Version of this ginx",
            Info::new(vec![("version", crate::VERSION)]),
        );
        registry.register("fetches", "Fetches by source and result", m.fetches.clone());
        registry.register(
            "fetch_last_success_timestamp_seconds",
            "When a fetch of the source last succeeded",
            m.fetch_last_success.clone(),
        );
        registry.register(
            "source_revision",
            "The revision each source offers (value 1)",
            m.revision.clone(),
        );
        registry.register("applies", "Apply attempts by result", m.applies.clone());
        registry.register(
            "apply_duration_seconds",
            "Duration of apply attempts",
            m.apply_duration.clone(),
        );
        registry.register(
            "apply_state",
            "The apply state (1 for the current one)",
            m.apply_state.clone(),
        );
        registry.register(
            "suspended",
            "1 while applying is suspended",
            m.suspended.clone(),
        );
        registry.register(
            "reboot_required",
            "1 when the booted system is not the activated one",
            m.reboot_required.clone(),
        );
        registry.register(
            "probe_status",
            "Health probe status (1 for the current one)",
            m.probes.clone(),
        );
        registry.register(
            "kubernetes_requests",
            "Kubernetes API requests by verb and HTTP status",
            m.kube_requests.clone(),
        );
        registry.register(
            "heartbeat_last_success_timestamp_seconds",
            "When the heartbeat Lease was last renewed",
            m.heartbeat_last_success.clone(),
        );
        Arc::new(Self { registry, ..m })
    }

    pub fn fetched(&self, source: &str, result: &str, at: Option<Timestamp>) {
        self.fetches
            .get_or_create(&FetchLabels {
                source: source.to_owned(),
                result: result.to_owned(),
            })
            .inc();
        if let Some(t) = at {
            self.fetch_last_success
                .get_or_create(&SourceLabels {
                    source: source.to_owned(),
                })
                .set(seconds(t));
        }
    }

    pub fn applied(&self, result: &str, seconds: f64) {
        self.applies
            .get_or_create(&ResultLabels {
                result: result.to_owned(),
            })
            .inc();
        self.apply_duration.observe(seconds);
    }

    pub fn heartbeat_succeeded(&self, at: Timestamp) {
        self.heartbeat_last_success.set(seconds(at));
    }

    pub fn kube_request(&self, verb: &str, code: Option<u16>) {
        self.kube_requests
            .get_or_create(&RequestLabels {
                verb: verb.to_owned(),
                code: code.map_or_else(|| "error".to_owned(), |c| c.to_string()),
            })
            .inc();
    }

    /// The exposition, with the state gauges set from `status`.
    pub fn render(&self, status: &Status) -> String {
        let _rendering = self
            .rendering
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        self.revision.clear();
        for (name, s) in &status.sources {
            if let Some(r) = &s.revision {
                self.revision
                    .get_or_create(&RevisionLabels {
                        source: name.clone(),
                        revision: r.to_string(),
                        branch: s
                            .revision_branch
                            .clone()
                            .unwrap_or_else(|| s.branch.clone()),
                    })
                    .set(1);
            }
        }
        for st in APPLY_STATES {
            self.apply_state
                .get_or_create(&StateLabels {
                    state: st.as_str().to_owned(),
                })
                .set(i64::from(st == status.apply.state));
        }
        self.suspended.set(i64::from(status.suspended));
        self.reboot_required
            .set(i64::from(status.system.reboot_required));
        self.probes.clear();
        for (probe, p) in &status.health {
            for h in HEALTH {
                self.probes
                    .get_or_create(&ProbeLabels {
                        probe: probe.clone(),
                        status: h.as_str().to_owned(),
                    })
                    .set(i64::from(h == p.status));
            }
        }
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::warn!(error = %e, "cannot encode metrics");
        }
        out
    }
}

/// A tower layer counting Kubernetes requests by verb (kube tags each request with the name of
/// the call: get, create, replace, patch, patch_status, …) and final HTTP status.
#[derive(Clone)]
pub struct KubeMetricsLayer(pub Arc<Metrics>);

impl<S> tower::Layer<S> for KubeMetricsLayer {
    type Service = KubeMetricsService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        KubeMetricsService {
            inner,
            metrics: Arc::clone(&self.0),
        }
    }
}

#[derive(Clone)]
pub struct KubeMetricsService<S> {
    inner: S,
    metrics: Arc<Metrics>,
}

type BoxFuture<T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>>;

impl<S, B> tower::Service<http::Request<kube::client::Body>> for KubeMetricsService<S>
where
    S: tower::Service<http::Request<kube::client::Body>, Response = http::Response<B>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Result<S::Response, S::Error>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<kube::client::Body>) -> Self::Future {
        let verb = req
            .extensions()
            .get::<&'static str>()
            .copied()
            .unwrap_or("raw");
        let metrics = Arc::clone(&self.metrics);
        let fut = self.inner.call(req);
        Box::pin(async move {
            let res = fut.await;
            metrics.kube_request(verb, res.as_ref().ok().map(|r| r.status().as_u16()));
            res
        })
    }
}

/// Serves `GET /metrics` on `listener` until `shutdown`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    backend: Arc<Backend>,
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
        let (backend, metrics) = (Arc::clone(&backend), Arc::clone(&metrics));
        tokio::spawn(async move {
            let svc =
                hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let (backend, metrics) = (Arc::clone(&backend), Arc::clone(&metrics));
                    async move {
                        let started = Instant::now();
                        let response = if req.uri().path() == "/metrics" {
                            let body = metrics.render(&backend.status());
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
