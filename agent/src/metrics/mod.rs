//! Prometheus metric families (prometheus-client): a handle any worker may count on.
//!
//! Counters are counted where things happen (fetches, applies, API requests, heartbeats);
//! gauges describing the current state are set at scrape time from [`Gauges`], which the
//! exposition in `control::metrics` reads from the one `Status` value.
//!
//! Owns: the families, their names and labels. Imports nothing of the crate but the version
//! and the notice reasons (`types`, to start each reason's counter at 0); it must not import
//! `status`, a worker, `reconcile` or `control` (serving is `control`'s).

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use jiff::Timestamp;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

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

/// `none`, `drain` or `reboot`: what a plan calls for.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ActionLabels {
    pub action: String,
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

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeLabels {
    pub node: String,
    pub role: String,
    pub group: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AppliedLabels {
    pub revision: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WaitingLabels {
    /// What the node waits for (`ginxctl status`'s `waiting_for`).
    pub waiting_for: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NotifyLabels {
    /// The webhook's `name`.
    pub notify: String,
    /// sent | failed (retries used up) | dropped (fell behind)
    pub result: String,
}

pub struct Metrics {
    registry: Registry,
    notices: Family<ReasonLabels, Counter>,
    node_info: Family<NodeLabels, Gauge>,
    waiting: Family<WaitingLabels, Gauge>,
    halted: Gauge,
    drift: Gauge,
    applied: Family<AppliedLabels, Gauge>,
    events: Family<ResultLabels, Counter>,
    notifications: Family<NotifyLabels, Counter>,
    fetches: Family<FetchLabels, Counter>,
    fetch_last_success: Family<SourceLabels, Gauge<f64, AtomicU64>>,
    revision: Family<RevisionLabels, Gauge>,
    applies: Family<ResultLabels, Counter>,
    plans: Family<ActionLabels, Counter>,
    apply_duration: Histogram,
    apply_state: Family<StateLabels, Gauge>,
    suspended: Gauge,
    reboot_required: Gauge,
    probes: Family<ProbeLabels, Gauge>,
    kube_requests: Family<RequestLabels, Counter>,
    heartbeat_last_success: Gauge<f64, AtomicU64>,
    rollout_lock_held: Gauge,
    rollout_slot_lost: Gauge,
    rollout_slots_lost: Counter,
    rollout_lock_wait: Histogram,
    rollout_slot_held: Histogram,
    rollout_quarantines: Counter,
    rollout_gates: Family<ResultLabels, Counter>,
    rollout_rollbacks: Counter,
    rollout_halts: Counter,
    reboots: Counter,
    drain_duration: Histogram,
    evictions_refused: Counter,
    reboots_rolled_back: Counter,
    /// Held by `render` from setting the state gauges to encoding them: two scrapes at once
    /// (an HA Prometheus pair) would otherwise see each other's cleared families.
    rendering: std::sync::Mutex<()>,
}

/// The state gauges' values at one scrape.
pub struct Gauges<'a> {
    /// `ginx_node_info`: the node's name, role and rollout group.
    pub node: &'a str,
    pub role: &'a str,
    pub group: &'a str,
    /// Every `waiting_for` name (each gets a series), and the current one.
    pub waiting: &'a [&'static str],
    pub waiting_for: Option<&'static str>,
    /// The revision this node targets is halted fleet-wide.
    pub halted: bool,
    /// The revision last applied (full commit id), if any.
    pub applied: Option<&'a str>,
    /// The running system is not the one ginx produced.
    pub drift: bool,
    /// Each source that offers a revision: source, revision, branch.
    pub revisions: Vec<RevisionLabels>,
    /// Every apply state's name (each gets a series), and the current one.
    pub apply_states: &'a [&'static str],
    pub apply_state: &'static str,
    pub suspended: bool,
    pub reboot_required: bool,
    /// Every probe status's name (each probe gets a series per status)...
    pub health_statuses: &'a [&'static str],
    /// ...and each probe's current status.
    pub probes: Vec<(&'a str, &'static str)>,
}

fn seconds(t: Timestamp) -> f64 {
    t.as_millisecond() as f64 / 1000.0
}

impl Metrics {
    pub fn new() -> Arc<Self> {
        let mut registry = Registry::with_prefix("ginx");
        let m = Self {
            notices: Family::default(),
            node_info: Family::default(),
            waiting: Family::default(),
            halted: Gauge::default(),
            drift: Gauge::default(),
            applied: Family::default(),
            events: Family::default(),
            notifications: Family::default(),
            fetches: Family::default(),
            fetch_last_success: Family::default(),
            revision: Family::default(),
            applies: Family::default(),
            plans: Family::default(),
            apply_duration: Histogram::new(exponential_buckets(1.0, 2.0, 14)),
            apply_state: Family::default(),
            suspended: Gauge::default(),
            reboot_required: Gauge::default(),
            probes: Family::default(),
            kube_requests: Family::default(),
            heartbeat_last_success: Gauge::default(),
            rollout_lock_held: Gauge::default(),
            rollout_slot_lost: Gauge::default(),
            rollout_slots_lost: Counter::default(),
            rollout_lock_wait: Histogram::new(exponential_buckets(0.1, 2.0, 16)),
            rollout_slot_held: Histogram::new(exponential_buckets(0.5, 2.0, 16)),
            rollout_quarantines: Counter::default(),
            rollout_gates: Family::default(),
            rollout_rollbacks: Counter::default(),
            rollout_halts: Counter::default(),
            reboots: Counter::default(),
            drain_duration: Histogram::new(exponential_buckets(1.0, 2.0, 12)),
            evictions_refused: Counter::default(),
            reboots_rolled_back: Counter::default(),
            rendering: std::sync::Mutex::new(()),
            registry: Registry::default(),
        };
        m.register_source_families(&mut registry);
        m.register_apply_families(&mut registry);
        m.register_health_and_api_families(&mut registry);
        m.register_rollout_families(&mut registry);
        m.register_reboot_families(&mut registry);
        m.register_node_families(&mut registry);
        m.register_notice_families(&mut registry);
        m.start_counters_at_zero();
        Arc::new(Self { registry, ..m })
    }

    /// This ginx's version, the fetches and what each source offers.
    fn register_source_families(&self, registry: &mut Registry) {
        registry.register(
            "build",
            "Version of this ginx",
            Info::new(vec![("version", crate::version())]),
        );
        registry.register(
            "fetches",
            "Fetches by source and result",
            self.fetches.clone(),
        );
        registry.register(
            "fetch_last_success_timestamp_seconds",
            "When a fetch of the source last succeeded",
            self.fetch_last_success.clone(),
        );
        registry.register(
            "source_revision",
            "The revision each source offers (value 1)",
            self.revision.clone(),
        );
    }

    /// The apply attempts and the state they leave the node in.
    fn register_apply_families(&self, registry: &mut Registry) {
        registry.register("applies", "Apply attempts by result", self.applies.clone());
        registry.register(
            "plans",
            "Plans computed after a build, by the action the disruption policy calls for: none (live), drain, reboot",
            self.plans.clone(),
        );
        registry.register(
            "apply_duration_seconds",
            "Duration of apply attempts",
            self.apply_duration.clone(),
        );
        registry.register(
            "apply_state",
            "The apply state (1 for the current one)",
            self.apply_state.clone(),
        );
        registry.register(
            "suspended",
            "1 while applying is suspended",
            self.suspended.clone(),
        );
        registry.register(
            "reboot_required",
            "1 when the booted system is not the activated one",
            self.reboot_required.clone(),
        );
    }

    /// The health probes, and the node's traffic with the Kubernetes API.
    fn register_health_and_api_families(&self, registry: &mut Registry) {
        registry.register(
            "probe_status",
            "Health probe status (1 for the current one)",
            self.probes.clone(),
        );
        registry.register(
            "kubernetes_requests",
            "Kubernetes API requests by verb and HTTP status",
            self.kube_requests.clone(),
        );
        registry.register(
            "heartbeat_last_success_timestamp_seconds",
            "When the heartbeat Lease was last renewed",
            self.heartbeat_last_success.clone(),
        );
    }

    /// The rollout: slots, gates, quarantines, rollbacks and halts.
    fn register_rollout_families(&self, registry: &mut Registry) {
        registry.register(
            "rollout_lock_held",
            "1 while this node holds a rollout slot (or the FleetLock)",
            self.rollout_lock_held.clone(),
        );
        registry.register(
            "rollout_slot_lost",
            "1 while the slot this node took was lost (taken by another node, or not renewed for its duration): nothing new starts until a slot is taken again",
            self.rollout_slot_lost.clone(),
        );
        registry.register(
            "rollout_slots_lost",
            "Rollout slots this node lost while holding them",
            self.rollout_slots_lost.clone(),
        );
        registry.register(
            "rollout_lock_wait_seconds",
            "How long the node waited for a rollout slot before it got one",
            self.rollout_lock_wait.clone(),
        );
        registry.register(
            "rollout_slot_held_seconds",
            "How long this node held a rollout slot, from taking it to releasing it (with prebuild: the activation and its gate)",
            self.rollout_slot_held.clone(),
        );
        registry.register(
            "rollout_quarantines",
            "Failed gates of this node counted below the failure budget (rollout.halt_after): quarantined, the rollout went on",
            self.rollout_quarantines.clone(),
        );
        registry.register(
            "rollout_gates",
            "Health gates by result (passed, failed; rollback- for the rolled-back system)",
            self.rollout_gates.clone(),
        );
        registry.register(
            "rollout_rollbacks",
            "Automatic rollbacks after a failed health gate",
            self.rollout_rollbacks.clone(),
        );
        registry.register(
            "rollout_halts",
            "Revisions this node halted cluster-wide",
            self.rollout_halts.clone(),
        );
    }

    /// Reboots and the drains before them.
    fn register_reboot_families(&self, registry: &mut Registry) {
        registry.register(
            "reboots",
            "Reboots ginx carried out (counted when the node is up in the new boot)",
            self.reboots.clone(),
        );
        registry.register(
            "drain_duration_seconds",
            "How long draining the node before a reboot took (given-up drains included)",
            self.drain_duration.clone(),
        );
        registry.register(
            "evictions_refused",
            "Evictions the API refused because a PodDisruptionBudget forbade them (429)",
            self.evictions_refused.clone(),
        );
        registry.register(
            "reboots_rolled_back",
            "Reboots into the previous generation after a health gate failed after a reboot (counted in the new boot)",
            self.reboots_rolled_back.clone(),
        );
    }

    /// Who the node is and where its rollout stands, set at each scrape.
    fn register_node_families(&self, registry: &mut Registry) {
        registry.register(
            "node_info",
            "The node's name, role and rollout group (value 1): join on it to name the node",
            self.node_info.clone(),
        );
        registry.register(
            "rollout_waiting",
            "What the next apply waits for (1 for the current one, none while nothing waits)",
            self.waiting.clone(),
        );
        registry.register(
            "applied_revision",
            "The revision this node applied last (value 1; none before the first): count by revision for the fleet's",
            self.applied.clone(),
        );
        registry.register(
            "rollout_halted",
            "1 while the revision this node would apply is halted fleet-wide",
            self.halted.clone(),
        );
        registry.register(
            "drift",
            "1 while the running system is not the one ginx produced",
            self.drift.clone(),
        );
    }

    /// What happened on the node, and how it was told (Events, webhooks).
    fn register_notice_families(&self, registry: &mut Registry) {
        registry.register(
            "notices",
            "What happened on this node, by reason (each one an Event on the Node and a webhook notification, when configured)",
            self.notices.clone(),
        );
        registry.register(
            "events",
            "Kubernetes Events by what became of them: created, patched (a repeat counted in its series), dropped (rate limit or backlog), failed (refused by the API)",
            self.events.clone(),
        );
        registry.register(
            "notifications",
            "Webhook notifications by webhook and result: sent, failed (retries used up), dropped (fell behind)",
            self.notifications.clone(),
        );
    }

    /// Every series a counter family is known to have starts at 0: a series that appears with its
    /// first increment already counted is invisible to increase() and rate(), so the first apply,
    /// gate or halt would never show on a dashboard or fire an alert.
    fn start_counters_at_zero(&self) {
        for result in ["succeeded", "failed", "timed-out", "interrupted"] {
            let _ = self.applies.get_or_create(&ResultLabels {
                result: result.to_owned(),
            });
        }
        for action in crate::types::Disruption::ALL {
            let _ = self.plans.get_or_create(&ActionLabels {
                action: action.as_str().to_owned(),
            });
        }
        for result in ["passed", "failed", "rollback-passed", "rollback-failed"] {
            let _ = self.rollout_gates.get_or_create(&ResultLabels {
                result: result.to_owned(),
            });
        }
        for reason in crate::types::Reason::ALL {
            let _ = self.notices.get_or_create(&ReasonLabels {
                reason: reason.as_str().to_owned(),
            });
        }
        for result in ["created", "patched", "dropped", "failed"] {
            let _ = self.events.get_or_create(&ResultLabels {
                result: result.to_owned(),
            });
        }
    }

    pub fn noticed(&self, reason: &str) {
        self.notices
            .get_or_create(&ReasonLabels {
                reason: reason.to_owned(),
            })
            .inc();
    }

    /// `result`: created, patched, dropped or failed; `n` of them.
    pub fn events(&self, result: &str, n: u64) {
        self.events
            .get_or_create(&ResultLabels {
                result: result.to_owned(),
            })
            .inc_by(n);
    }

    pub fn notified(&self, notify: &str, result: &str, n: u64) {
        self.notifications
            .get_or_create(&NotifyLabels {
                notify: notify.to_owned(),
                result: result.to_owned(),
            })
            .inc_by(n);
    }

    pub fn lock_held(&self, held: bool) {
        self.rollout_lock_held.set(i64::from(held));
    }

    /// The held slot was lost (`true`), or the loss is over (a slot taken again or released).
    pub fn slot_lost(&self, lost: bool) {
        if lost && self.rollout_slot_lost.get() == 0 {
            self.rollout_slots_lost.inc();
        }
        self.rollout_slot_lost.set(i64::from(lost));
    }

    pub fn lock_waited(&self, seconds: f64) {
        self.rollout_lock_wait.observe(seconds);
    }

    pub fn slot_held(&self, seconds: f64) {
        self.rollout_slot_held.observe(seconds);
    }

    pub fn quarantined(&self) {
        self.rollout_quarantines.inc();
    }

    pub fn gate(&self, result: &str) {
        self.rollout_gates
            .get_or_create(&ResultLabels {
                result: result.to_owned(),
            })
            .inc();
    }

    pub fn rolled_back(&self) {
        self.rollout_rollbacks.inc();
    }

    pub fn rebooted(&self) {
        self.reboots.inc();
    }

    pub fn drained(&self, seconds: f64) {
        self.drain_duration.observe(seconds);
    }

    pub fn eviction_refused(&self) {
        self.evictions_refused.inc();
    }

    pub fn reboot_rolled_back(&self) {
        self.reboots_rolled_back.inc();
    }

    pub fn halted(&self) {
        self.rollout_halts.inc();
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

    pub fn planned(&self, action: crate::types::Disruption) {
        self.plans
            .get_or_create(&ActionLabels {
                action: action.as_str().to_owned(),
            })
            .inc();
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

    /// The exposition, with the state gauges set from `gauges`.
    pub fn render(&self, gauges: &Gauges<'_>) -> String {
        let _rendering = self
            .rendering
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        self.revision.clear();
        for labels in &gauges.revisions {
            self.revision.get_or_create(labels).set(1);
        }
        for st in gauges.apply_states {
            self.apply_state
                .get_or_create(&StateLabels {
                    state: (*st).to_owned(),
                })
                .set(i64::from(*st == gauges.apply_state));
        }
        self.suspended.set(i64::from(gauges.suspended));
        self.node_info.clear();
        self.node_info
            .get_or_create(&NodeLabels {
                node: gauges.node.to_owned(),
                role: gauges.role.to_owned(),
                group: gauges.group.to_owned(),
            })
            .set(1);
        for w in gauges.waiting {
            self.waiting
                .get_or_create(&WaitingLabels {
                    waiting_for: (*w).to_owned(),
                })
                .set(i64::from(gauges.waiting_for == Some(*w)));
        }
        self.halted.set(i64::from(gauges.halted));
        self.applied.clear();
        if let Some(r) = gauges.applied {
            self.applied
                .get_or_create(&AppliedLabels {
                    revision: r.to_owned(),
                })
                .set(1);
        }
        self.drift.set(i64::from(gauges.drift));
        self.reboot_required.set(i64::from(gauges.reboot_required));
        self.probes.clear();
        for (probe, current) in &gauges.probes {
            for h in gauges.health_statuses {
                self.probes
                    .get_or_create(&ProbeLabels {
                        probe: (*probe).to_owned(),
                        status: (*h).to_owned(),
                    })
                    .set(i64::from(h == current));
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
