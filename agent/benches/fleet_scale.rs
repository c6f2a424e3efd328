//! Fleet scale (run: `bench/fleet-scale.sh` or
//! `cargo bench --bench fleet_scale`): many simulated nodes in this one process against one real
//! kube-apiserver (tests/support/control_plane.rs, a fresh one per fleet size), as kubemark
//! does for kubelets. Skipped with a note when the control-plane binary is missing.
//!
//! Each simulated node runs ginx's own library code, not a model of it:
//! - its heartbeat: [`Heartbeat::renew`] every `kubernetes.renew_interval` (±5 %, as the
//!   reporter does), the Lease `ginx-<node>`;
//! - its rollout: a [`Gatekeeper`] (slot Leases through `LeaseLock`, the fleet ConfigMap read,
//!   the renewal task, the watches of the group's slot Leases and of `ginx-rollout`), driven as
//!   the reconciler drives it: `permit`, and on `Wait` `changed()` then `permit` again; once
//!   granted `fence`, a stand-in activation (a sleep), `set_phase(Verifying)`,
//!   `set_phase(Done)`, `release` (the gate's settle is left out).
//!
//! Each node has its own identity (`CN=ginx:<node>`, `O=ginx:nodes`: vap.yaml lets a node write
//! only its own heartbeat and hold slots as itself) and so its own `kube::Client`s, built by
//! `ginx::kube::client_config` as the daemon builds them: `main` (requests) and `watch` (the
//! long read timeout). What the process shares: one tokio runtime (2 workers), one `Metrics`.
//! The watch client carries a counting layer: it counts the watch events each node's watches
//! receive (lines of the watch responses), by resource, bookmarks apart.
//!
//! Per fleet size N (`SCALE_NODES`, default "100,300,1000"), `max_concurrent` =
//! `SCALE_SLOTS` (50), `rollout.order` = `SCALE_ORDER` (unset by default), phases:
//! 1. steady state, heartbeats only (no rollout yet, so no watches), `SCALE_STEADY_SECONDS`;
//! 2. a rollout of every node, activations of `SCALE_ACTIVATION_SECONDS` (1 s): total against
//!    the ideal ⌈N/slots⌉ × activation; slot Lease writes by kind (acquire, phase, renewal,
//!    release, lost races) from the audit log; watch events received per slot write; the
//!    hand-off from a release to the next acquire of the slot (audit log, and the harness's
//!    monotonic clock); cut short (and reported so) after `SCALE_ROLLOUT_SECONDS` (300);
//! 3. steady state again, now with every node's two watches open;
//! 4. held slots: `slots` nodes take a slot and hold it (longer than a renewal period,
//!    `rollout.lease_duration` / 3 = 20 s) while the other N − slots wait, over
//!    `SCALE_HOLD_SECONDS` (25): renewal writes, the watch events they cause, and the requests
//!    of the waiting nodes.
//!
//! In each phase: the requests by ginx's identities (audit log), the API server's and etcd's
//! CPU (utime + stime from /proc/<pid>/stat) and RSS (VmRSS), and this process's CPU.

#[path = "../../tests/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ginx::config::Config;
use ginx::k8s::heartbeat::Heartbeat;
use ginx::k8s::{KubeClients, ServerClock};
use ginx::metrics::Metrics;
use ginx::rollout::lock::lease::SlotPhase;
use ginx::rollout::lock::slots::Observed;
use ginx::rollout::view::feed::{FleetFeed, Follows};
use ginx::rollout::{Gatekeeper, Permit, Wiring};
use ginx::status::{HealthMap, KubeState, KubeStatus};
use ginx::types::Revision;
use http_body_util::BodyExt;
use hyper::body::{Bytes, Frame};
use k8s_openapi::api::coordination::v1::Lease;
use serde_json::Value;
use support::control_plane::{self, ControlPlane};
use tokio::sync::watch;

const GROUP: &str = "scale";
const NAMESPACE: &str = "ginx-system";

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

// ---------------------------------------------------------------------------------------------
// Watch events received, counted on the watch client's responses.

/// Watch events received by every simulated node's watches.
#[derive(Default)]
struct WatchCounts {
    lease_events: AtomicU64,
    lease_bookmarks: AtomicU64,
    configmap_events: AtomicU64,
    configmap_bookmarks: AtomicU64,
    /// Watch requests made (each opens a stream).
    watches: AtomicU64,
}

#[derive(Clone, Copy, Default, Debug)]
struct WatchSnapshot {
    lease_events: u64,
    lease_bookmarks: u64,
    configmap_events: u64,
    configmap_bookmarks: u64,
    watches: u64,
}

impl WatchCounts {
    fn snapshot(&self) -> WatchSnapshot {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        WatchSnapshot {
            lease_events: g(&self.lease_events),
            lease_bookmarks: g(&self.lease_bookmarks),
            configmap_events: g(&self.configmap_events),
            configmap_bookmarks: g(&self.configmap_bookmarks),
            watches: g(&self.watches),
        }
    }
}

impl std::ops::Sub for WatchSnapshot {
    type Output = WatchSnapshot;
    fn sub(self, o: Self) -> Self {
        WatchSnapshot {
            lease_events: self.lease_events - o.lease_events,
            lease_bookmarks: self.lease_bookmarks - o.lease_bookmarks,
            configmap_events: self.configmap_events - o.configmap_events,
            configmap_bookmarks: self.configmap_bookmarks - o.configmap_bookmarks,
            watches: self.watches - o.watches,
        }
    }
}

#[derive(Clone)]
struct CountLayer(Arc<WatchCounts>);

impl<S> tower::Layer<S> for CountLayer {
    type Service = CountService<S>;
    fn layer(&self, inner: S) -> Self::Service {
        CountService {
            inner,
            counts: Arc::clone(&self.0),
        }
    }
}

#[derive(Clone)]
struct CountService<S> {
    inner: S,
    counts: Arc<WatchCounts>,
}

type BoxFuture<T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>>;
type CountedBody<E> = http_body_util::combinators::UnsyncBoxBody<Bytes, E>;

impl<S, B> tower::Service<http::Request<kube::client::Body>> for CountService<S>
where
    S: tower::Service<http::Request<kube::client::Body>, Response = http::Response<B>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: hyper::body::Body<Data = Bytes> + Send + 'static,
{
    type Response = http::Response<CountedBody<B::Error>>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, S::Error>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<kube::client::Body>) -> Self::Future {
        let uri = req.uri();
        let watching = uri.query().is_some_and(|q| q.contains("watch=true"));
        let kind = if !watching {
            None
        } else if uri.path().ends_with("/leases") {
            Some(true)
        } else if uri.path().ends_with("/configmaps") {
            Some(false)
        } else {
            None
        };
        let counts = Arc::clone(&self.counts);
        let fut = self.inner.call(req);
        Box::pin(async move {
            let res = fut.await?;
            let Some(lease) = kind else {
                return Ok(res.map(|b| b.boxed_unsync()));
            };
            counts.watches.fetch_add(1, Ordering::Relaxed);
            // The first bytes of the line being read: enough to tell a bookmark.
            let mut head: Vec<u8> = Vec::with_capacity(24);
            Ok(res.map(move |b| {
                b.map_frame(move |f: Frame<Bytes>| {
                    if let Some(d) = f.data_ref() {
                        for &byte in d.iter() {
                            if byte == b'\n' {
                                let bookmark = head.starts_with(b"{\"type\":\"BOOKMARK\"");
                                let c = match (lease, bookmark) {
                                    (true, false) => &counts.lease_events,
                                    (true, true) => &counts.lease_bookmarks,
                                    (false, false) => &counts.configmap_events,
                                    (false, true) => &counts.configmap_bookmarks,
                                };
                                c.fetch_add(1, Ordering::Relaxed);
                                head.clear();
                            } else if head.len() < 24 {
                                head.push(byte);
                            }
                        }
                    }
                    f
                })
                .boxed_unsync()
            }))
        })
    }
}

// ---------------------------------------------------------------------------------------------
// The simulated nodes.

/// What the harness asks a node to do.
#[derive(Clone, Debug)]
enum Order {
    Idle,
    /// Roll `revision` out: take a slot, hold it for `hold`, release it.
    Roll {
        revision: Revision,
        hold: Duration,
    },
    /// Stop what it does (releasing a slot it holds).
    Stop,
}

#[derive(Clone, Copy, Debug)]
enum Step {
    Acquired(u32),
    Released(u32),
}

/// What the nodes did, on the monotonic clock.
#[derive(Default)]
struct Log {
    steps: Mutex<Vec<(Instant, usize, Step)>>,
    permits: AtomicU64,
    waits: AtomicU64,
    errors: Mutex<BTreeMap<String, u64>>,
}

impl Log {
    fn step(&self, node: usize, s: Step) {
        self.steps.lock().unwrap().push((Instant::now(), node, s));
    }

    fn error(&self, what: String) {
        *self.errors.lock().unwrap().entry(what).or_insert(0) += 1;
    }
}

struct SimNode {
    index: usize,
    gatekeeper: Gatekeeper,
    // Kept: the Gatekeeper watches these.
    _config: watch::Sender<Arc<Config>>,
    _kube: watch::Sender<Option<KubeClients>>,
    _health: watch::Sender<HealthMap>,
    _kube_status: watch::Sender<KubeStatus>,
    _shutdown: watch::Sender<bool>,
}

fn config_of(name: &str, kubeconfig: &Path, slots: u32) -> Config {
    // `SCALE_ORDER` sets `rollout.order`: a guard that reads the Nodes at every look.
    let order = std::env::var("SCALE_ORDER")
        .map(|o| format!("order = \"{o}\"\n"))
        .unwrap_or_default();
    let text = format!(
        "[node]\nname = \"{name}\"\nrole = \"worker\"\n\n\
         [kubernetes]\nkubeconfig = \"{}\"\n\n\
         [rollout]\nlock = \"kubernetes\"\ngroup = \"{GROUP}\"\nmax_concurrent = {slots}\n{order}\n\
         [sources.hephaestus]\nurl = \"/var/lib/simulated/hephaestus\"\n",
        kubeconfig.display()
    );
    ginx::config::load_texts(&[(PathBuf::from("/etc/ginx/config.toml"), text)])
        .unwrap_or_else(|e| panic!("simulated node's configuration: {e}"))
}

/// The clients of one node, as `ginx::kube::connect` makes them (its `main` and `watch`; no
/// probe clients, no node identity), the watch client counting what it receives.
async fn clients_of(cfg: &Config, counts: &Arc<WatchCounts>) -> KubeClients {
    let k = &cfg.kubernetes;
    let path = k.kubeconfig.as_deref().unwrap();
    let config = ginx::kube::client_config(path, None, k.request_timeout.get())
        .await
        .unwrap();
    let main = kube::client::ClientBuilder::try_from(config.clone())
        .unwrap()
        .build();
    let mut watching = config;
    watching.read_timeout = Some(Duration::from_secs(300));
    let watch = kube::client::ClientBuilder::try_from(watching)
        .unwrap()
        .with_layer(&CountLayer(Arc::clone(counts)))
        .build();
    KubeClients {
        main: main.clone(),
        local: None,
        vip: main,
        watch,
        node: Err(ginx::k8s::ClientError::Setup(
            "simulated node: no node identity".into(),
        )),
        clock: ServerClock::default(),
    }
}

/// Renews the heartbeat every `every` (±5 %), first after `first`; stops with `stop`.
async fn heartbeat(mut hb: Heartbeat, every: Duration, first: Duration, log: Arc<Log>) {
    tokio::time::sleep(first).await;
    loop {
        let next = match hb.renew().await {
            Ok(()) => ginx::util::jitter(every, 0.05),
            Err(e) => {
                log.error(format!("heartbeat: {e:?}").chars().take(120).collect());
                hb.forget();
                Duration::from_secs(1)
            }
        };
        tokio::time::sleep(next).await;
    }
}

/// Takes a slot as the reconciler does, holds it for `hold`, writes the phases and releases.
async fn roll(n: &mut SimNode, revision: &Revision, hold: Duration, log: &Log) {
    let held = loop {
        log.permits.fetch_add(1, Ordering::Relaxed);
        match n.gatekeeper.permit(revision, None).await {
            Permit::Granted(Some(held)) => break held,
            Permit::Granted(None) => panic!("granted without a lock"),
            Permit::Wait(waiting_for, why) => {
                if waiting_for != ginx::status::WaitingFor::Lock {
                    log.error(
                        format!("wait {}: {why}", waiting_for.as_str())
                            .chars()
                            .take(160)
                            .collect(),
                    );
                }
                log.waits.fetch_add(1, Ordering::Relaxed);
                n.gatekeeper.changed().await;
            }
        }
    };
    let slot = held.slot.unwrap_or(u32::MAX);
    log.step(n.index, Step::Acquired(slot));
    if let Err(e) = n.gatekeeper.fence().await {
        log.error(format!("fence: {e}"));
    }
    tokio::time::sleep(hold).await;
    n.gatekeeper.set_phase(SlotPhase::Verifying).await;
    n.gatekeeper.set_phase(SlotPhase::Done).await;
    release(n, &held, log).await;
}

async fn release(n: &mut SimNode, held: &ginx::state::TakenSlot, log: &Log) {
    loop {
        match n.gatekeeper.release(held).await {
            Ok(()) => break,
            Err(e) => {
                log.error(format!("release: {e}").chars().take(120).collect());
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
    log.step(n.index, Step::Released(held.slot.unwrap_or(u32::MAX)));
}

/// Runs the orders given to node `n` until the order channel closes.
async fn node_task(mut n: SimNode, mut orders: watch::Receiver<Order>, log: Arc<Log>) {
    loop {
        if orders.changed().await.is_err() {
            return;
        }
        let order = orders.borrow_and_update().clone();
        let Order::Roll { revision, hold } = order else {
            continue;
        };
        let stopped = tokio::select! {
            () = roll(&mut n, &revision, hold, &log) => false,
            _ = async {
                loop {
                    if orders.changed().await.is_err()
                        || matches!(*orders.borrow_and_update(), Order::Stop)
                    {
                        return;
                    }
                }
            } => true,
        };
        if stopped && let Some(held) = n.gatekeeper.held().cloned() {
            release(&mut n, &held, &log).await;
        }
    }
}

struct Fleet {
    orders: Vec<watch::Sender<Order>>,
    log: Arc<Log>,
    counts: Arc<WatchCounts>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Fleet {
    fn order(&self, nodes: std::ops::Range<usize>, order: &Order) {
        for tx in &self.orders[nodes] {
            tx.send_replace(order.clone());
        }
    }

    fn stop(&self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

fn start_fleet(
    rt: &tokio::runtime::Runtime,
    cp: &ControlPlane,
    dir: &Path,
    nodes: usize,
    slots: u32,
) -> Fleet {
    let log = Arc::new(Log::default());
    let counts = Arc::new(WatchCounts::default());
    let metrics = Metrics::new();
    let mut orders = Vec::new();
    let mut tasks = Vec::new();
    for i in 0..nodes {
        let name = format!("sim-{i:04}");
        let kubeconfig = dir.join(&name).join("kubeconfig");
        std::fs::create_dir_all(kubeconfig.parent().unwrap()).unwrap();
        cp.kubeconfig_for(&kubeconfig, &format!("ginx:{name}"), &["ginx:nodes"]);
        let cfg = config_of(&name, &kubeconfig, slots);
        let clients = rt.block_on(clients_of(&cfg, &counts));
        let hb = Heartbeat::new(
            kube::Api::<Lease>::namespaced(clients.main.clone(), NAMESPACE),
            format!("ginx-{name}"),
            name.clone(),
            i32::try_from(cfg.kubernetes.lease_duration.get().as_secs()).unwrap(),
            clients.clock.clone(),
        );
        let every = cfg.kubernetes.renew_interval.get();
        // Nodes start at different moments: their heartbeats spread over the interval.
        let first = every.mul_f64(i as f64 / nodes as f64);
        tasks.push(rt.spawn(heartbeat(hb, every, first, Arc::clone(&log))));
        let (config_tx, config) = watch::channel(Arc::new(cfg));
        let (kube_tx, kube) = watch::channel(Some(clients));
        let (health_tx, health) = watch::channel(HealthMap::new());
        let (fast_probes, _) = watch::channel(None);
        // Every node's one watch of the fleet ConfigMap, as its daemon runs it.
        let (kube_status_tx, kube_status) = watch::channel(KubeStatus {
            state: KubeState::Connected,
            ..KubeStatus::default()
        });
        let (shutdown_tx, shutdown) = watch::channel(false);
        let fleet = {
            let _runtime = rt.enter();
            FleetFeed::spawn(Follows {
                config: config.clone(),
                clients: kube.clone(),
                kube: kube_status,
                shutdown,
            })
        };
        let gatekeeper = Gatekeeper::new(Wiring {
            notices: ginx::types::Notices::disabled(),
            config,
            kube,
            health,
            fast_probes,
            reach_source: None,
            metrics: Arc::clone(&metrics),
            observed: Arc::new(Mutex::new(Observed::default())),
            later: None,
            fleet,
        });
        let (tx, rx) = watch::channel(Order::Idle);
        orders.push(tx);
        let node = SimNode {
            index: i,
            gatekeeper,
            _config: config_tx,
            _kube: kube_tx,
            _health: health_tx,
            _kube_status: kube_status_tx,
            _shutdown: shutdown_tx,
        };
        tasks.push(rt.spawn(node_task(node, rx, Arc::clone(&log))));
    }
    Fleet {
        orders,
        log,
        counts,
        tasks,
    }
}

// ---------------------------------------------------------------------------------------------
// Measuring: /proc and the audit log.

/// CPU seconds (utime + stime) of `pid`.
fn cpu_seconds(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return f64::NAN;
    };
    // Fields after the command's closing parenthesis; utime and stime are fields 14 and 15.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    ticks / hz
}

/// A field of /proc/<pid>/status in MiB (VmRSS, VmHWM).
fn status_mib(pid: u32, field: &str) -> f64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(f64::NAN, |kib| kib / 1024.0)
}

/// The state of the world at the start of a window.
struct Mark {
    at: Instant,
    audit: u64,
    cpu: Vec<f64>,
    watch: WatchSnapshot,
    permits: u64,
}

/// What a window measured.
struct Window {
    seconds: f64,
    audit: Vec<Audited>,
    /// CPU seconds per process: kube-apiserver, etcd, this process.
    cpu: BTreeMap<&'static str, f64>,
    rss: BTreeMap<&'static str, f64>,
    watch: WatchSnapshot,
    permits: u64,
}

fn pids(cp: &ControlPlane) -> Vec<(&'static str, u32)> {
    let mut p: Vec<(&'static str, u32)> = cp
        .pids()
        .into_iter()
        .filter(|(n, _)| *n != "kube-controller-manager")
        .collect();
    p.push(("bench (simulated nodes)", std::process::id()));
    p
}

fn mark(cp: &ControlPlane, fleet: &Fleet) -> Mark {
    Mark {
        at: Instant::now(),
        audit: cp.audit_mark(),
        cpu: pids(cp).iter().map(|(_, p)| cpu_seconds(*p)).collect(),
        watch: fleet.counts.snapshot(),
        permits: fleet.log.permits.load(Ordering::Relaxed),
    }
}

fn measure(cp: &ControlPlane, fleet: &Fleet, m: &Mark) -> Window {
    let seconds = m.at.elapsed().as_secs_f64();
    let end = cp.audit_mark();
    let p = pids(cp);
    let cpu = p
        .iter()
        .zip(&m.cpu)
        .map(|((n, pid), before)| (*n, cpu_seconds(*pid) - before))
        .collect();
    let rss = p
        .iter()
        .map(|(n, pid)| (*n, status_mib(*pid, "VmRSS")))
        .collect();
    Window {
        seconds,
        audit: read_audit(&cp.audit_log, m.audit, end),
        cpu,
        rss,
        watch: fleet.counts.snapshot() - m.watch,
        permits: fleet.log.permits.load(Ordering::Relaxed) - m.permits,
    }
}

/// One completed request, with what a slot write says (from its logged request body).
#[derive(Clone, Debug)]
struct Audited {
    verb: String,
    user: String,
    resource: String,
    name: String,
    code: u16,
    micros: i64,
    holder: Option<String>,
    phase: Option<String>,
    /// The nodes a release handed the slot to (`ginx.io/next`, separated by spaces).
    next: Option<String>,
}

impl Audited {
    fn by_node(&self) -> bool {
        self.user.starts_with("ginx:sim-")
    }

    fn write(&self) -> bool {
        matches!(
            self.verb.as_str(),
            "create" | "update" | "patch" | "delete" | "deletecollection"
        )
    }

    fn slot(&self) -> bool {
        self.resource == "leases" && self.name.starts_with(&format!("ginx-rollout-{GROUP}-"))
    }
}

fn read_audit(path: &Path, from: u64, to: u64) -> Vec<Audited> {
    let Ok(mut f) = std::fs::File::open(path) else {
        return Vec::new();
    };
    f.seek(SeekFrom::Start(from)).unwrap();
    let mut r = BufReader::new(std::io::Read::take(f, to.saturating_sub(from)));
    let mut out = Vec::new();
    let mut line = String::new();
    while r.read_line(&mut line).unwrap_or(0) > 0 {
        if let Ok(e) = serde_json::from_str::<Value>(&line)
            && e["stage"] == "ResponseComplete"
        {
            let s = |v: &Value| v.as_str().unwrap_or("").to_owned();
            let time = s(&e["stageTimestamp"]);
            let micros = time
                .parse::<jiff::Timestamp>()
                .map_or(0, |t| t.as_microsecond());
            let body = &e["requestObject"];
            out.push(Audited {
                verb: s(&e["verb"]),
                user: s(&e["user"]["username"]),
                resource: s(&e["objectRef"]["resource"]),
                name: s(&e["objectRef"]["name"]),
                code: e["responseStatus"]["code"].as_u64().unwrap_or(0) as u16,
                micros,
                holder: body["spec"]["holderIdentity"]
                    .as_str()
                    .filter(|h| !h.is_empty())
                    .map(str::to_owned),
                phase: body["metadata"]["annotations"]["ginx.io/phase"]
                    .as_str()
                    .map(str::to_owned),
                next: body["metadata"]["annotations"]["ginx.io/next"]
                    .as_str()
                    .map(str::to_owned),
            });
        }
        line.clear();
    }
    out
}

/// Successful slot writes by kind, and lost races.
#[derive(Default, Debug, Clone, Copy)]
struct SlotWrites {
    acquire: u64,
    phase: u64,
    renewal: u64,
    release: u64,
    /// Writes refused with 409 (another node won the slot, or wrote it first).
    conflicts: u64,
    /// Of those, creates of a slot another node created first (the rollout's start).
    conflicts_create: u64,
    other_failures: u64,
    /// Acquires after a release that named nodes: by one of them / by another; after a
    /// release that named nobody.
    to_named: u64,
    to_other: u64,
    to_unnamed: u64,
}

impl SlotWrites {
    fn ok(&self) -> u64 {
        self.acquire + self.phase + self.renewal + self.release
    }
}

/// Slot writes in `audit` by kind, counting those from `since` (µs since the epoch) on: the
/// earlier ones only say who held each slot. `handoffs` gets release → next acquire of the
/// same slot, in ms (the server's stage timestamps).
fn slot_writes(audit: &[Audited], since: i64, handoffs: &mut Vec<f64>) -> SlotWrites {
    let mut w = SlotWrites::default();
    let mut ignored = SlotWrites::default();
    // Per slot: the holder and phase its last successful write left, and when; the node a
    // release named.
    let mut last: BTreeMap<&str, (Option<&str>, Option<&str>, i64)> = BTreeMap::new();
    let mut named: BTreeMap<&str, Option<&str>> = BTreeMap::new();
    for e in audit
        .iter()
        .filter(|e| e.by_node() && e.slot() && e.write())
    {
        let w = if e.micros >= since {
            &mut w
        } else {
            &mut ignored
        };
        if e.code == 409 {
            w.conflicts += 1;
            if e.verb == "create" {
                w.conflicts_create += 1;
            }
            continue;
        }
        if e.code >= 300 {
            w.other_failures += 1;
            continue;
        }
        let prev = last.get(e.name.as_str()).copied();
        match (&e.holder, prev) {
            (None, _) => w.release += 1,
            (Some(h), Some((Some(ph), pphase, _))) if ph == h.as_str() => {
                if pphase == e.phase.as_deref() {
                    w.renewal += 1;
                } else {
                    w.phase += 1;
                }
            }
            (Some(h), prev) => {
                w.acquire += 1;
                if let Some((None, _, released)) = prev
                    && e.micros >= since
                {
                    handoffs.push((e.micros - released) as f64 / 1000.0);
                    match named.get(e.name.as_str()).copied().flatten() {
                        Some(n) if n.split(' ').any(|n| n == h) => w.to_named += 1,
                        Some(_) => w.to_other += 1,
                        None => w.to_unnamed += 1,
                    }
                }
            }
        }
        if e.holder.is_none() {
            named.insert(e.name.as_str(), e.next.as_deref());
        }
        last.insert(
            e.name.as_str(),
            (e.holder.as_deref(), e.phase.as_deref(), e.micros),
        );
    }
    w
}

/// Requests by the simulated nodes per `verb resource`, and how many were refused with 429.
fn requests(audit: &[Audited]) -> BTreeMap<String, u64> {
    let mut m = BTreeMap::new();
    for e in audit.iter().filter(|e| e.by_node()) {
        *m.entry(format!("{} {}", e.verb, e.resource)).or_insert(0) += 1;
    }
    m
}

fn count_code(audit: &[Audited], code: u16) -> u64 {
    audit
        .iter()
        .filter(|e| e.by_node() && e.code == code)
        .count() as u64
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

// ---------------------------------------------------------------------------------------------
// The phases.

/// Figures of one fleet size, in the order printed.
type Figures = Vec<(String, String)>;

fn put(f: &mut Figures, k: &str, v: String) {
    f.push((k.to_owned(), v));
}

fn window_figures(f: &mut Figures, label: &str, w: &Window, nodes: usize) {
    let per = |x: u64| x as f64 / w.seconds / nodes as f64;
    let writes = w.audit.iter().filter(|e| e.by_node() && e.write()).count() as u64;
    let reads = w
        .audit
        .iter()
        .filter(|e| e.by_node() && matches!(e.verb.as_str(), "get" | "list"))
        .count() as u64;
    put(
        f,
        &format!("{label}: API writes /s /node"),
        format!("{:.4}", per(writes)),
    );
    put(
        f,
        &format!("{label}: API reads (get, list) /s /node"),
        format!("{:.4}", per(reads)),
    );
    put(
        f,
        &format!("{label}: 429s"),
        format!("{}", count_code(&w.audit, 429)),
    );
    put(
        f,
        &format!("{label}: kube-apiserver CPU (cores)"),
        format!("{:.3}", w.cpu["kube-apiserver"] / w.seconds),
    );
    put(
        f,
        &format!("{label}: etcd CPU (cores)"),
        format!("{:.3}", w.cpu["etcd"] / w.seconds),
    );
    put(
        f,
        &format!("{label}: bench process CPU (cores)"),
        format!("{:.3}", w.cpu["bench (simulated nodes)"] / w.seconds),
    );
    put(
        f,
        &format!("{label}: kube-apiserver RSS (MiB)"),
        format!("{:.0}", w.rss["kube-apiserver"]),
    );
}

fn print_requests(label: &str, w: &Window, nodes: usize) {
    println!(
        "{label}, {nodes} nodes, {:.0} s: requests by the simulated nodes",
        w.seconds
    );
    println!();
    println!("| request | count | /s /node |");
    println!("| --- | --- | --- |");
    for (k, v) in requests(&w.audit) {
        println!("| {k} | {v} | {:.4} |", v as f64 / w.seconds / nodes as f64);
    }
    println!();
}

fn revision(n: u64) -> Revision {
    format!("{n:040x}").parse().unwrap()
}

fn run(bin: &Path, nodes: usize) -> Figures {
    let slots = env_number("SCALE_SLOTS", 50) as u32;
    let steady = Duration::from_secs(env_number("SCALE_STEADY_SECONDS", 60));
    let hold = Duration::from_secs(env_number("SCALE_HOLD_SECONDS", 25));
    let activation = Duration::from_secs_f64(
        std::env::var("SCALE_ACTIVATION_SECONDS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1.0),
    );
    let began = Instant::now();
    let mut f = Figures::new();
    let cp = ControlPlane::start(bin);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("simulated-nodes")
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::Builder::new()
        .prefix("ginx-fleet-scale-")
        .tempdir()
        .unwrap();
    let t = Instant::now();
    let fleet = start_fleet(&rt, &cp, dir.path(), nodes, slots);
    eprintln!(
        "fleet_scale: {nodes} nodes started in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    put(
        &mut f,
        "set-up: nodes started (identities, clients) s",
        format!("{:.1}", t.elapsed().as_secs_f64()),
    );
    // Every heartbeat written once (they spread over one interval), and the connections made.
    std::thread::sleep(Duration::from_secs(12));

    // 1. Steady state, heartbeats only.
    let m = mark(&cp, &fleet);
    std::thread::sleep(steady);
    let w1 = measure(&cp, &fleet, &m);
    window_figures(&mut f, "steady, no watches", &w1, nodes);
    print_requests("Steady state before any rollout", &w1, nodes);

    // 2. A rollout of every node.
    let m = mark(&cp, &fleet);
    let started = fleet.log.steps.lock().unwrap().len();
    fleet.order(
        0..nodes,
        &Order::Roll {
            revision: revision(1),
            hold: activation,
        },
    );
    // A shared machine: a rollout that takes too long is cut short and reported so.
    let deadline = Duration::from_secs(env_number("SCALE_ROLLOUT_SECONDS", 300));
    let (done, released) = loop {
        let released = fleet.log.steps.lock().unwrap()[started..]
            .iter()
            .filter(|(_, _, s)| matches!(s, Step::Released(_)))
            .count();
        if released >= nodes {
            break (true, released);
        }
        if m.at.elapsed() > deadline {
            eprintln!("fleet_scale: rollout: only {released} of {nodes} nodes done; stopped");
            fleet.order(0..nodes, &Order::Stop);
            std::thread::sleep(Duration::from_secs(5));
            break (false, released);
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let steps: Vec<(Instant, usize, Step)> = fleet.log.steps.lock().unwrap()[started..].to_vec();
    let total = steps
        .iter()
        .map(|(t, _, _)| t.duration_since(m.at))
        .max()
        .unwrap_or_default();
    // Let the last writes reach the audit log.
    std::thread::sleep(Duration::from_millis(500));
    let w2 = measure(&cp, &fleet, &m);
    let mut handoffs = Vec::new();
    let sw = slot_writes(&w2.audit, 0, &mut handoffs);
    handoffs.sort_by(f64::total_cmp);
    // The harness's own clock: a node's release returned → the next node granted that slot.
    let mut own: Vec<f64> = Vec::new();
    let mut released_at: BTreeMap<u32, Instant> = BTreeMap::new();
    let mut sorted = steps.clone();
    sorted.sort_by_key(|(t, _, _)| *t);
    let (mut inside, mut most) = (0usize, 0usize);
    for (t, _, s) in &sorted {
        match s {
            Step::Acquired(i) => {
                inside += 1;
                most = most.max(inside);
                if let Some(r) = released_at.remove(i) {
                    own.push(t.duration_since(r).as_secs_f64() * 1000.0);
                }
            }
            Step::Released(i) => {
                inside = inside.saturating_sub(1);
                released_at.insert(*i, *t);
            }
        }
    }
    own.sort_by(f64::total_cmp);
    let ideal = nodes.div_ceil(slots as usize) as f64 * activation.as_secs_f64();
    put(
        &mut f,
        "rollout: completed",
        if done {
            "yes".into()
        } else {
            format!(
                "NO: {released} of {nodes} nodes in {}s, then stopped",
                deadline.as_secs()
            )
        },
    );
    put(
        &mut f,
        "rollout: total s (ideal)",
        format!("{:.1} ({ideal:.0})", total.as_secs_f64()),
    );
    put(
        &mut f,
        "rollout: most slots held at once",
        format!("{most}"),
    );
    put(
        &mut f,
        "rollout: slot writes acquire / phase / renewal / release",
        format!(
            "{} / {} / {} / {}",
            sw.acquire, sw.phase, sw.renewal, sw.release
        ),
    );
    put(
        &mut f,
        "rollout: slot writes lost to a race (409; of them creates) / other failures",
        format!(
            "{} ({}) / {}",
            sw.conflicts, sw.conflicts_create, sw.other_failures
        ),
    );
    let ok = sw.ok().max(1) as f64;
    put(
        &mut f,
        "rollout: lease watch events received per slot write",
        format!("{:.1}", w2.watch.lease_events as f64 / ok),
    );
    put(
        &mut f,
        "rollout: permit calls per slot write",
        format!("{:.1}", w2.permits as f64 / ok),
    );
    let reads = w2
        .audit
        .iter()
        .filter(|e| e.by_node() && matches!(e.verb.as_str(), "get" | "list"))
        .count() as f64;
    put(
        &mut f,
        "rollout: API reads per slot write",
        format!("{:.1}", reads / ok),
    );
    put(
        &mut f,
        "rollout: hand-off release → next acquire p50 / p99 / max ms (audit)",
        format!(
            "{:.0} / {:.0} / {:.0} (n={})",
            percentile(&handoffs, 0.5),
            percentile(&handoffs, 0.99),
            handoffs.last().copied().unwrap_or(f64::NAN),
            handoffs.len()
        ),
    );
    put(
        &mut f,
        "rollout: hand-offs to a node named / to another / after a release naming nobody",
        format!("{} / {} / {}", sw.to_named, sw.to_other, sw.to_unnamed),
    );
    put(
        &mut f,
        "rollout: hand-off p50 / p99 / max ms (harness clock)",
        format!(
            "{:.0} / {:.0} / {:.0} (n={})",
            percentile(&own, 0.5),
            percentile(&own, 0.99),
            own.last().copied().unwrap_or(f64::NAN),
            own.len()
        ),
    );
    window_figures(&mut f, "rollout", &w2, nodes);
    print_requests("Rollout", &w2, nodes);

    // 3. Steady state with every node's watches open.
    std::thread::sleep(Duration::from_secs(3));
    let m = mark(&cp, &fleet);
    std::thread::sleep(steady);
    let w3 = measure(&cp, &fleet, &m);
    window_figures(&mut f, "steady, watches open", &w3, nodes);
    put(
        &mut f,
        "steady, watches open: lease watch events (bookmarks) received",
        format!("{} ({})", w3.watch.lease_events, w3.watch.lease_bookmarks),
    );
    print_requests("Steady state after the rollout (watches open)", &w3, nodes);

    // 4. Slots held while the rest of the fleet waits.
    let waiters = nodes.saturating_sub(slots as usize);
    let holders = nodes.min(slots as usize);
    let before = fleet.log.steps.lock().unwrap().len();
    let from = cp.audit_mark();
    fleet.order(
        0..holders,
        &Order::Roll {
            revision: revision(2),
            hold: Duration::from_secs(3600),
        },
    );
    let patience = Instant::now() + Duration::from_secs(90);
    let taken = loop {
        let n = fleet.log.steps.lock().unwrap()[before..]
            .iter()
            .filter(|(_, _, s)| matches!(s, Step::Acquired(_)))
            .count();
        if n >= holders || Instant::now() > patience {
            break n;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    'held: {
        if taken < holders {
            put(
                &mut f,
                "held slots",
                format!("skipped: only {taken} of {holders} slots taken within 90 s"),
            );
            fleet.order(0..nodes, &Order::Stop);
            break 'held;
        }
        fleet.order(
            holders..nodes,
            &Order::Roll {
                revision: revision(2),
                hold: activation,
            },
        );
        // Past the waiters' first asks.
        std::thread::sleep(Duration::from_secs(2));
        let m = mark(&cp, &fleet);
        let since = jiff::Timestamp::now().as_microsecond();
        std::thread::sleep(hold);
        let w4 = measure(&cp, &fleet, &m);
        let until = cp.audit_mark();
        fleet.order(0..nodes, &Order::Stop);
        // Read from before the holders' takes: who holds what.
        let sw4 = slot_writes(
            &read_audit(&cp.audit_log, from, until),
            since,
            &mut Vec::new(),
        );
        put(
            &mut f,
            "held slots: holders / waiters",
            format!("{holders} / {waiters}"),
        );
        put(
            &mut f,
            "held slots: slot writes acquire / phase / renewal / release",
            format!(
                "{} / {} / {} / {}",
                sw4.acquire, sw4.phase, sw4.renewal, sw4.release
            ),
        );
        put(
            &mut f,
            "held slots: lease watch events received",
            format!("{}", w4.watch.lease_events),
        );
        put(
            &mut f,
            "held slots: lease watch events per renewal write",
            format!(
                "{:.1}",
                w4.watch.lease_events as f64 / sw4.ok().max(1) as f64
            ),
        );
        put(
            &mut f,
            "held slots: permit calls by waiters per renewal write",
            format!("{:.1}", w4.permits as f64 / sw4.ok().max(1) as f64),
        );
        let reads4 = w4
            .audit
            .iter()
            .filter(|e| e.by_node() && matches!(e.verb.as_str(), "get" | "list"))
            .count() as f64;
        put(
            &mut f,
            "held slots: API reads /s",
            format!("{:.0}", reads4 / w4.seconds),
        );
        window_figures(&mut f, "held slots", &w4, nodes);
        print_requests("Slots held, the rest waiting", &w4, nodes);
    }

    let errors = fleet.log.errors.lock().unwrap().clone();
    if !errors.is_empty() {
        println!("Errors and unexpected waits seen by the simulated nodes ({nodes} nodes):");
        println!();
        for (e, n) in errors.iter().take(20) {
            println!("- {n} × {e}");
        }
        println!();
    }
    put(
        &mut f,
        "errors and unexpected waits seen by the nodes",
        format!("{}", errors.values().sum::<u64>()),
    );
    put(
        &mut f,
        "run: wall-clock s",
        format!("{:.0}", began.elapsed().as_secs_f64()),
    );
    // Let the stopped nodes release their slots, then stop everything.
    std::thread::sleep(Duration::from_secs(2));
    fleet.stop();
    drop(fleet);
    rt.shutdown_timeout(Duration::from_secs(5));
    // The audit log was read: not copied into the bench's sweep collection on drop.
    let _ = std::fs::File::create(&cp.audit_log);
    drop(cp);
    f
}

fn main() {
    let Some(bin) = control_plane::require() else {
        println!("fleet_scale benchmark skipped: no control-plane binary");
        return;
    };
    ginx::kube::install_crypto();
    let sizes: Vec<usize> = std::env::var("SCALE_NODES")
        .unwrap_or_else(|_| "100,300,1000".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let mut all: Vec<(usize, Figures)> = Vec::new();
    for &n in &sizes {
        eprintln!("fleet_scale: {n} simulated nodes");
        let f = run(&bin, n);
        println!("Fleet scale, {n} simulated nodes:");
        println!();
        println!("| figure | {n} nodes |");
        println!("| --- | --- |");
        for (k, v) in &f {
            println!("| {k} | {v} |");
        }
        println!();
        all.push((n, f));
    }
    if all.len() > 1 {
        println!("Fleet scale, all sizes:");
        println!();
        let head: Vec<String> = all.iter().map(|(n, _)| format!("{n} nodes")).collect();
        println!("| figure | {} |", head.join(" | "));
        println!("|---{}", " | ---".repeat(all.len()) + " |");
        for (i, (k, _)) in all[0].1.iter().enumerate() {
            let row: Vec<&str> = all
                .iter()
                .map(|(_, f)| f.get(i).map_or("-", |(_, v)| v.as_str()))
                .collect();
            println!("| {k} | {} |", row.join(" | "));
        }
        println!();
    }
    // This process's sweep collection (the support code's): nothing sweeps a bench's.
    let _ = std::fs::remove_dir_all(
        support::sweep::root()
            .with_file_name(format!("secrets-sweep-bench-{}", std::process::id())),
    );
}
