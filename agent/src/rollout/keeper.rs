//! [`Gatekeeper`]: the one interface `reconcile` asks — may this node apply this revision now
//! (fleet pause, halt, API, quorum, a slot), release the lock, halt a revision, the gate's
//! checks. It owns the lock it holds (renewing a slot Lease in the background) and the watch
//! that wakes a waiting node the moment a slot or the fleet state changes.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use tokio::sync::watch;

use super::fleet::Fleet;
use super::fleetlock::{FleetLock, FleetLockError};
use super::gate::Check;
use super::lease::{self, Acquired, LeaseLock, LockError, Released, SlotPhase, Vanished};
use super::slots::Observed;
use super::window::{self, WindowState};
use crate::config::{Config, LockBackend, OnApiUnavailable, OnHolderLost};
use crate::metrics::Metrics;
use crate::state::Held;
use crate::status::{
    FleetState, Halt, HaltCause, HealthMap, HealthStatus, STATE_HEALTH, WaitingFor,
};
use crate::types::api::{
    HEARTBEAT_GROUP_LABEL, HEARTBEAT_PASSED_ANNOTATION, KubeClients, describe, readyz, refusal,
    unavailable,
};
use crate::types::{Reason, Revision, Role};
use crate::util;

/// Checks that the node can still fetch its apply source (a fetch of it), handed in by the
/// daemon.
pub type Reach =
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> + Send + Sync>;

/// While waiting, the verdict is looked at again this often even if no watch fired (another
/// node's health is not watched).
pub const RECHECK: Duration = Duration::from_secs(5);

/// The same while queued for a slot of a large group: a release names the next node itself
/// (`lease.rs`), so the looks are only for slots nobody took (a holder that died, a named node
/// that did not come) and can be rarer; with many nodes queued one of them still looks often.
pub const QUEUED_RECHECK: Duration = Duration::from_secs(10);

/// The fleet state read before taking a slot is taken from the last read while the watch of
/// the ConfigMap has seen no change since (and it is younger than this): the read after the
/// take (`recheck_fleet`) is what a halt or pause must pass, so this one only spares a waiting
/// node a request per look.
const FLEET_CACHED: Duration = Duration::from_secs(30);

/// The longest the gate's baseline waits for a fresh round of the probes.
const FRESH_ROUND: Duration = Duration::from_secs(15);

/// The source is fetched at most this often while a gate is open.
const REACH_EVERY: Duration = Duration::from_secs(10);

/// The control plane's own checks, which hold a gate on a control-plane node even when they
/// failed before the activation.
pub const CONTROL_PLANE_REQUIRED: &[&str] = &["apiserver", "kube-vip", "node-ready"];

pub struct Wiring {
    pub config: watch::Receiver<Arc<Config>>,
    pub kube: watch::Receiver<Option<KubeClients>>,
    pub health: watch::Receiver<HealthMap>,
    /// Set while a gate is open: the probes run at this interval.
    pub fast_probes: watch::Sender<Option<Duration>>,
    pub reach_source: Option<Reach>,
    pub metrics: Arc<Metrics>,
    /// When this process saw each slot Lease change: how it tells a dead holder from a live
    /// one without reading another machine's clock.
    pub observed: Arc<Mutex<Observed>>,
    /// Whether a revision another group passed is later than this node's (`rollout.after`):
    /// `later(theirs, ours)`, answered from the apply source's clone by the daemon.
    pub later: Option<Later>,
    /// Where what happens is told (Events, webhooks).
    pub notices: crate::types::Notices,
}

/// `later(theirs, ours)`: whether `theirs` descends from `ours`.
pub type Later =
    Arc<dyn Fn(Revision, Revision) -> Pin<Box<dyn Future<Output = bool> + Send>> + Send + Sync>;

/// The answer to "may I apply?".
#[derive(Debug)]
pub enum Permit {
    /// Go ahead; with the lock held (to be recorded in the state), or with none.
    Granted(Option<Held>),
    Wait(WaitingFor, String),
}

/// What the lock is asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Purpose {
    /// Applying a revision: `[[rollout.windows]]`, and a halted revision waits.
    Apply,
    /// Rebooting the node: `[[reboot.windows]]`; a halt concerns applies only.
    Reboot,
}

/// The backend in effect, `auto` resolved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Effective {
    None,
    /// `auto` before the cluster exists.
    Bootstrap,
    Kubernetes,
    Fleetlock,
}

impl Effective {
    pub fn as_str(self) -> &'static str {
        match self {
            Effective::None | Effective::Bootstrap => "none",
            Effective::Kubernetes => "kubernetes",
            Effective::Fleetlock => "fleetlock",
        }
    }
}

/// The backend `cfg` asks for, given whether its kubeconfig file exists.
pub fn effective(cfg: &Config) -> Effective {
    let cluster = cfg
        .kubernetes
        .kubeconfig
        .as_deref()
        .is_some_and(|p| p.exists());
    match cfg.rollout.lock {
        LockBackend::None => Effective::None,
        LockBackend::Auto if cluster => Effective::Kubernetes,
        LockBackend::Auto => Effective::Bootstrap,
        LockBackend::Kubernetes => Effective::Kubernetes,
        LockBackend::Fleetlock => Effective::Fleetlock,
    }
}

struct Holding {
    held: Held,
    /// The slot's renewal (Lease backend).
    renew: Option<tokio::task::JoinHandle<()>>,
    /// The slot's lock (Lease backend): what the renewal writes, with what the node does.
    lock: Option<LeaseLock>,
    /// When the slot was last written by this node (taken or renewed), on the monotonic clock.
    renewed: Arc<Mutex<Instant>>,
    /// Set when a renewal found another holder, or the slot went unrenewed for its duration.
    lost: Arc<AtomicBool>,
    /// When this process took (or took up again) the slot, for `rollout_slot_held_seconds`.
    taken: Instant,
}

impl Holding {
    fn fleetlock(held: Held) -> Self {
        Self {
            held,
            renew: None,
            lock: None,
            renewed: Arc::new(Mutex::new(Instant::now())),
            lost: Arc::new(AtomicBool::new(false)),
            taken: Instant::now(),
        }
    }

    /// A slot Lease just taken or renewed, renewed from now on by a task of its own that bumps
    /// `changes` when the slot is lost.
    fn lease(held: Held, lock: LeaseLock, index: u32, changes: watch::Sender<u64>) -> Self {
        let renewed = Arc::new(Mutex::new(Instant::now()));
        let lost = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn(renew(
            lock.clone(),
            index,
            Arc::clone(&renewed),
            Arc::clone(&lost),
            changes,
        ));
        Self {
            held,
            renew: Some(task),
            lock: Some(lock),
            renewed,
            lost,
            taken: Instant::now(),
        }
    }

    fn since_renewal(&self) -> Duration {
        guard(&self.renewed).elapsed()
    }
}

fn guard<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Drop for Holding {
    fn drop(&mut self) {
        if let Some(t) = self.renew.take() {
            t.abort();
        }
    }
}

/// What is being watched, to restart the watches when it changes.
#[derive(Clone, PartialEq, Eq)]
struct WatchKey {
    namespace: String,
    group: String,
    configmap: String,
    clients: usize,
}

pub struct Gatekeeper {
    w: Wiring,
    changes_tx: watch::Sender<u64>,
    changes: watch::Receiver<u64>,
    watching: Option<(WatchKey, watch::Sender<bool>)>,
    /// The watch of the group's slot Leases: only while waiting for a slot (a node that holds
    /// one, or waits for nothing, hears of no other node's slot).
    watching_slots: Option<(WatchKey, watch::Sender<bool>)>,
    /// Bumped whenever the API clients are rebuilt.
    clients_generation: usize,
    /// The clients changed while [`changed`](Self::changed) waited (which marks the watch
    /// seen): not used yet.
    kube_pending: bool,
    holding: Option<Holding>,
    bootstrap_logged: bool,
    /// The group's holders as last read.
    pub holders: BTreeMap<u32, String>,
    /// The fleet state as last read.
    pub fleet: Option<FleetState>,
    /// When the node started waiting for a slot.
    waiting_since: Option<Instant>,
    last_reach: Option<(Instant, Check)>,
    /// The FleetLock client, kept while its configuration, group and timeout stay the same
    /// (one connection pool, the machine id read once).
    fleetlock: Option<(FleetLockKey, Arc<FleetLock>)>,
    /// When the next maintenance window opens, while waiting for one.
    window_opens: Option<jiff::Timestamp>,
    /// A `holder-vanished` halt this node owes the fleet: written before anything else, the
    /// slot kept until it is.
    owed_halt: Option<Halt>,
    /// While soaking (`rollout.soak`): when the soak is over, on the monotonic clock.
    soak_until: Option<Instant>,
    /// The revision every group of `rollout.after` was seen to have passed (it stays passed).
    after_passed: Option<Revision>,
    /// The watch of the heartbeat Leases of the `rollout.after` groups, while waiting for them.
    watching_after: Option<(Vec<String>, usize, watch::Sender<bool>)>,
    /// The lock this node queues on (its heartbeat says so), while it waits for a slot of a
    /// large group.
    queued: Option<LeaseLock>,
    /// Whether a queue mark a former run of ginx may have left on the heartbeat was cleared.
    queue_checked: bool,
    /// Bumped by the watch of the fleet ConfigMap (after its list, and at every change).
    fleet_seen: Option<watch::Receiver<u64>>,
    /// When [`fleet`](Self::fleet) was last read: the watch's count then, and the time.
    fleet_read: Option<(u64, Instant)>,
}

type FleetLockKey = (crate::config::FleetLockConfig, String, Duration);

impl Gatekeeper {
    pub fn new(w: Wiring) -> Self {
        let (changes_tx, changes) = watch::channel(0);
        Self {
            w,
            changes_tx,
            changes,
            watching: None,
            watching_slots: None,
            clients_generation: 0,
            kube_pending: false,
            holding: None,
            bootstrap_logged: false,
            holders: BTreeMap::new(),
            fleet: None,
            waiting_since: None,
            last_reach: None,
            fleetlock: None,
            window_opens: None,
            owed_halt: None,
            soak_until: None,
            after_passed: None,
            watching_after: None,
            queued: None,
            queue_checked: false,
            fleet_seen: None,
            fleet_read: None,
        }
    }

    /// The FleetLock client for `f` and `group`, built once per configuration.
    fn fleetlock_client(
        &mut self,
        f: &crate::config::FleetLockConfig,
        group: &str,
        timeout: Duration,
    ) -> Result<Arc<FleetLock>, String> {
        let key = (f.clone(), group.to_owned(), timeout);
        if let Some((k, c)) = &self.fleetlock
            && *k == key
        {
            return Ok(Arc::clone(c));
        }
        let c = Arc::new(FleetLock::new(f, group, timeout)?);
        self.fleetlock = Some((key, Arc::clone(&c)));
        Ok(c)
    }

    fn cfg(&self) -> Arc<Config> {
        Arc::clone(&self.w.config.borrow())
    }

    pub fn group(&self) -> String {
        let cfg = self.cfg();
        cfg.rollout.group_for(cfg.node.role)
    }

    /// Whether the API clients changed (made, or made again) since they were last used.
    pub fn clients_changed(&self) -> bool {
        self.kube_pending || self.w.kube.has_changed().unwrap_or(false)
    }

    fn clients(&mut self) -> Option<KubeClients> {
        if self.kube_pending || self.w.kube.has_changed().unwrap_or(false) {
            self.kube_pending = false;
            self.clients_generation += 1;
        }
        self.w.kube.borrow_and_update().clone()
    }

    /// Starts (or restarts) the watches of the group's slots and the fleet ConfigMap.
    fn ensure_watch(&mut self, cfg: &Config, clients: &KubeClients) {
        let key = WatchKey {
            namespace: cfg.kubernetes.namespace.clone(),
            group: cfg.rollout.group_for(cfg.node.role),
            configmap: cfg.rollout.configmap.clone(),
            clients: self.clients_generation,
        };
        if self.watching.as_ref().is_some_and(|(k, _)| *k == key) {
            return;
        }
        let (stop_tx, mut stop) = watch::channel(false);
        let api = kube::Api::<ConfigMap>::namespaced(clients.watch.clone(), &key.namespace);
        let fields = format!("metadata.name={}", key.configmap);
        let (seen_tx, seen) = watch::channel(0);
        let mut forward = seen.clone();
        let changes = self.changes_tx.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = lease::watch_objects(api, String::new(), Some(fields), seen_tx, None) => {}
                _ = stop.changed() => {}
            }
        });
        // A change of the fleet state wakes a waiting node like any other change.
        tokio::spawn(async move {
            while forward.changed().await.is_ok() {
                changes.send_modify(|n| *n = n.wrapping_add(1));
            }
        });
        self.watching = Some((key, stop_tx));
        self.fleet_seen = Some(seen);
        self.fleet_read = None;
    }

    /// Starts (`on`) or stops the watch of the group's slot Leases (in a large group, of the
    /// slots handed to this node: see [`LeaseLock::watch`]). It runs only while this node
    /// waits for a slot: so a slot's hand-off reaches the nodes that wait, not the whole
    /// group, and a node that is done with a rollout costs the API server nothing.
    fn watch_slots(&mut self, cfg: &Config, clients: Option<&KubeClients>, on: bool) {
        let Some(clients) = clients.filter(|_| on) else {
            self.watching_slots = None;
            return;
        };
        let watching = KubeClients {
            main: clients.watch.clone(),
            ..clients.clone()
        };
        let lock = self.lease_lock(cfg, &watching);
        let key = WatchKey {
            namespace: cfg.kubernetes.namespace.clone(),
            group: cfg.rollout.group_for(cfg.node.role),
            configmap: lock.name(lock.home()),
            clients: self.clients_generation,
        };
        if self.watching_slots.as_ref().is_some_and(|(k, _)| *k == key) {
            return;
        }
        let (stop_tx, stop) = watch::channel(false);
        tokio::spawn(lock.watch(self.changes_tx.clone(), stop));
        self.watching_slots = Some((key, stop_tx));
    }

    fn lease_lock(&self, cfg: &Config, clients: &KubeClients) -> LeaseLock {
        LeaseLock::new(
            clients.main.clone(),
            &cfg.kubernetes.namespace,
            &cfg.rollout.group_for(cfg.node.role),
            cfg.node_name(),
            &cfg.rollout,
            Arc::clone(&self.w.observed),
            clients.clock.clone(),
        )
        .with_heartbeat(cfg.kubernetes.lease_name_for(cfg.node_name()))
    }

    /// Waits until something that may change a verdict changed: a slot, the fleet state, the
    /// API clients; or [`RECHECK`] passed.
    pub async fn changed(&mut self) {
        let window = self.window_opens.map(|t| {
            let d = util::now().duration_until(t);
            if d.is_negative() {
                Duration::ZERO
            } else {
                d.unsigned_abs()
            }
        });
        let soak = self
            .soak_until
            .map(|t| t.saturating_duration_since(Instant::now()));
        let recheck = if self.queued.is_some() {
            QUEUED_RECHECK
        } else {
            RECHECK
        };
        tokio::select! {
            _ = self.changes.changed() => {}
            _ = self.w.kube.changed() => self.kube_pending = true,
            () = tokio::time::sleep(util::jitter(recheck, 0.1)) => {}
            // The soak ending, to the moment.
            () = async {
                match soak {
                    Some(d) => tokio::time::sleep(d).await,
                    None => std::future::pending().await,
                }
            } => {}
            // The next window opening, to the moment.
            () = async {
                match window {
                    Some(d) => tokio::time::sleep(d).await,
                    None => std::future::pending().await,
                }
            } => {}
        }
    }

    /// Returns when the slot held becomes lost (never, if it does not): so that status says so
    /// at once, also while an activation runs.
    pub async fn until_lost(&mut self) {
        let was = self.lost();
        loop {
            if self.changes.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
            if self.lost() != was {
                return;
            }
        }
    }

    /// The lock held, if any.
    pub fn held(&self) -> Option<&Held> {
        self.holding.as_ref().map(|h| &h.held)
    }

    /// Whether the slot this node holds was lost (taken by another node, or not renewed for its
    /// duration).
    pub fn lost(&self) -> bool {
        self.holding
            .as_ref()
            .is_some_and(|h| h.lost.load(Ordering::Relaxed))
    }

    /// The API refused a request: a configuration error, never a reason to go on without the
    /// lock, whatever `on_api_unavailable` says.
    fn refused(why: String) -> Permit {
        Permit::Wait(
            WaitingFor::Refused,
            format!("{why}; nothing is applied until this is fixed"),
        )
    }

    /// A failed request about the slots: unavailable or refused.
    fn lock_error(&self, cfg: &Config, e: LockError) -> Permit {
        match e {
            LockError::Unavailable(m) => self.api_unavailable(cfg, m),
            LockError::Refused(m) => Self::refused(m),
        }
    }

    /// The API is needed but not there: wait, or go on without a lock.
    fn api_unavailable(&self, cfg: &Config, why: String) -> Permit {
        match cfg.rollout.on_api_unavailable {
            OnApiUnavailable::Wait => Permit::Wait(
                WaitingFor::Api,
                format!(
                    "{why}; nothing is applied until the API answers (rollout.on_api_unavailable = \"wait\")"
                ),
            ),
            OnApiUnavailable::Proceed => {
                tracing::warn!(reason = %why, "the Kubernetes API is unavailable; applying without the rollout lock (rollout.on_api_unavailable = \"proceed\")");
                Permit::Granted(None)
            }
        }
    }

    /// May this node apply `revision` now? `held` is the lock the state says it holds (after
    /// a restart): resumed, never a second one taken.
    /// Outside every window, the wait (and when the next opens); `None` inside one, or when
    /// the node already holds its lock (a window gates the start of an apply only).
    fn outside_window(
        &mut self,
        cfg: &Config,
        held: Option<&Held>,
        purpose: Purpose,
    ) -> Option<Permit> {
        // A window gates the start of an apply, not one under way; a reboot's always.
        if purpose == Purpose::Apply && (held.is_some() || self.holding.is_some()) {
            return None;
        }
        let (windows, key) = match purpose {
            Purpose::Apply => (&cfg.rollout.windows[..], "rollout.windows"),
            Purpose::Reboot => (
                cfg.reboot.windows(&cfg.rollout),
                if cfg.reboot.windows.is_some() {
                    "reboot.windows"
                } else {
                    "rollout.windows"
                },
            ),
        };
        let WindowState::Closed { opens_at } = window::state(windows, util::now()) else {
            return None;
        };
        self.window_opens = opens_at;
        Some(Permit::Wait(
            WaitingFor::Window,
            match opens_at {
                Some(t) => {
                    format!("outside the maintenance windows ({key}); the next opens at {t}")
                }
                None => format!("outside the maintenance windows ({key})"),
            },
        ))
    }

    pub async fn permit(&mut self, revision: &Revision, held: Option<&Held>) -> Permit {
        self.permit_for(revision, held, Purpose::Apply).await
    }

    /// May this node take (or keep) the lock for `purpose`? For a reboot, `revision` is the
    /// one applied (recorded with the lock). A node queued for a slot (see `lease.rs`) leaves
    /// the queue once the answer is anything but waiting for one.
    pub async fn permit_for(
        &mut self,
        revision: &Revision,
        held: Option<&Held>,
        purpose: Purpose,
    ) -> Permit {
        let permit = self.decide(revision, held, purpose).await;
        if !matches!(permit, Permit::Wait(WaitingFor::Lock, _)) {
            self.unqueue().await;
        }
        permit
    }

    /// Leaves the queue of a large group's slots, if this node is in it (or, the first time,
    /// may be: a former run of ginx may have left its mark on the heartbeat).
    async fn unqueue(&mut self) {
        let lock = match self.queued.take() {
            Some(lock) => lock,
            None if !self.queue_checked && effective(&self.cfg()) == Effective::Kubernetes => {
                let Some(clients) = self.w.kube.borrow().clone() else {
                    return;
                };
                let cfg = self.cfg();
                self.lease_lock(&cfg, &clients)
            }
            None => return,
        };
        match lock.queue_on(None).await {
            Ok(()) => self.queue_checked = true,
            Err(e) => {
                tracing::debug!(error = %e, "cannot clear the slot queue mark on the heartbeat; a release may name this node in vain");
            }
        }
    }

    async fn decide(
        &mut self,
        revision: &Revision,
        held: Option<&Held>,
        purpose: Purpose,
    ) -> Permit {
        let cfg = self.cfg();
        self.window_opens = None;
        let backend = effective(&cfg);
        if backend == Effective::None {
            return self
                .outside_window(&cfg, held, purpose)
                .unwrap_or(Permit::Granted(None));
        }
        if backend == Effective::Bootstrap {
            if let Some(wait) = self.outside_window(&cfg, held, purpose) {
                return wait;
            }
            if !self.bootstrap_logged {
                self.bootstrap_logged = true;
                tracing::info!(
                    "no cluster yet (no kubeconfig): applying without the rollout lock (bootstrap)"
                );
            }
            return Permit::Granted(None);
        }
        let kube_configured = cfg
            .kubernetes
            .kubeconfig
            .as_deref()
            .is_some_and(|p| p.exists());
        let clients = self.clients();
        if kube_configured {
            let Some(clients) = clients.clone() else {
                return self
                    .api_unavailable(&cfg, "no connection to the Kubernetes API yet".into());
            };
            self.ensure_watch(&cfg, &clients);
            let seen = self.fleet_seen.as_ref().map_or(0, |r| *r.borrow());
            let cached = seen > 0
                && self.fleet.is_some()
                && self
                    .fleet_read
                    .is_some_and(|(n, at)| n == seen && at.elapsed() < FLEET_CACHED);
            let fleet = fleet_of(&cfg, &clients);
            let state = if let Some(state) = self.fleet.clone().filter(|_| cached) {
                state
            } else {
                match fleet.read().await {
                    Ok(s) => s,
                    Err(e) if unavailable(&e) => {
                        return self.api_unavailable(
                            &cfg,
                            format!(
                                "cannot read the rollout state {}: {}",
                                fleet.object(),
                                describe(&e)
                            ),
                        );
                    }
                    Err(e) => {
                        return Self::refused(refusal(
                            "get",
                            &format!("ConfigMap {}", fleet.object()),
                            &e,
                        ));
                    }
                }
            };
            if !cached {
                self.fleet_read = Some((seen, Instant::now()));
            }
            self.fleet = Some(state);
        }
        let resuming_own = held.is_some()
            || self
                .holding
                .as_ref()
                .is_some_and(|h| !h.lost.load(Ordering::Relaxed));
        if let Some(wait) = self.fleet.as_ref().and_then(|state| {
            held_back(
                state,
                revision,
                purpose,
                &cfg.rollout.group_for(cfg.node.role),
                resuming_own,
            )
        }) {
            return wait;
        }
        if let Some(wait) = self.outside_window(&cfg, held, purpose) {
            return wait;
        }
        // A reboot passes the quorum guard even with the slot kept since its apply.
        let resuming = purpose == Purpose::Apply && (held.is_some() || self.holding.is_some());
        if !resuming
            && cfg.node.role == Role::ControlPlane
            && cfg.rollout.quorum_guard
            && let Some(clients) = &clients
        {
            match super::quorum::check(clients, &cfg).await {
                Ok(None) => {}
                Ok(Some(why)) => return Permit::Wait(WaitingFor::Quorum, why),
                Err(e) => return self.lock_error(&cfg, e),
            }
        }
        if let Some(halt) = self.owed_halt.clone() {
            // A takeover's halt not written yet: the slot stays held until it is.
            match self.write_owed_halt(halt).await {
                Ok(()) => {}
                Err(e) => return self.api_unavailable(&cfg, e),
            }
            if self
                .fleet
                .as_ref()
                .and_then(|f| f.halt_of(revision))
                .is_some()
                && purpose == Purpose::Apply
            {
                return Permit::Wait(
                    WaitingFor::Halted,
                    format!(
                        "revision {} is halted: its slot's holder vanished while rolling it out",
                        revision.short()
                    ),
                );
            }
        }
        if let Some(h) = &self.holding
            && !h.lost.load(Ordering::Relaxed)
        {
            return Permit::Granted(Some(h.held.clone()));
        }
        // Order across groups: nothing of this group starts a revision before every node of
        // the groups it comes after passed its gate on it.
        if purpose == Purpose::Apply
            && held.is_none()
            && let Some(clients) = &clients
            && let Some(wait) = self.after_groups(&cfg, clients, revision).await
        {
            return wait;
        }
        let started_waiting = *self.waiting_since.get_or_insert_with(Instant::now);
        let granted = match backend {
            Effective::Kubernetes => {
                let Some(clients) = clients else {
                    return self
                        .api_unavailable(&cfg, "no connection to the Kubernetes API".into());
                };
                let lock = self.lease_lock(&cfg, &clients);
                *guard::<lease::Doing>(&lock.doing) = lease::Doing {
                    revision: Some(revision.to_string()),
                    phase: match purpose {
                        Purpose::Apply => SlotPhase::Applying,
                        Purpose::Reboot => SlotPhase::Rebooting,
                    },
                };
                let soak = match purpose {
                    Purpose::Apply => cfg.rollout.soak.get(),
                    Purpose::Reboot => Duration::ZERO,
                };
                self.soak_until = None;
                match lock.acquire(soak).await {
                    Ok(Acquired::Soaking { left, after }) => {
                        self.soak_until = Some(Instant::now() + left);
                        return Permit::Wait(
                            WaitingFor::Soak,
                            format!(
                                "{after} passed its gate on {} less than rollout.soak ({}) ago; \
                                 {}s to go",
                                revision.short(),
                                cfg.rollout.soak,
                                left.as_secs_f64().ceil()
                            ),
                        );
                    }
                    Ok(Acquired::Full(holders)) => {
                        self.watch_slots(&cfg, Some(&clients), true);
                        if lock.queue() && self.queued.is_none() {
                            match lock.queue_on(Some(lock.home())).await {
                                Ok(()) => {
                                    self.queue_checked = true;
                                    self.queued = Some(lock.clone());
                                }
                                Err(e) => {
                                    tracing::debug!(error = %e, "cannot queue for a slot on the heartbeat; looking for free slots instead");
                                }
                            }
                        }
                        let list: Vec<String> = holders
                            .iter()
                            .map(|(i, h)| format!("slot {i} by {h}"))
                            .collect();
                        let held = holders.len();
                        self.holders = holders;
                        let what = if held < cfg.rollout.max_concurrent as usize {
                            format!(
                                "other nodes won every race for the free slots of group {} \
                                 ({} of {} held as last read)",
                                lock.group, held, cfg.rollout.max_concurrent
                            )
                        } else {
                            format!(
                                "all {} slot(s) of group {} are held",
                                cfg.rollout.max_concurrent, lock.group
                            )
                        };
                        return Permit::Wait(
                            WaitingFor::Lock,
                            format!("{what}: {}", list.join(", ")),
                        );
                    }
                    Ok(Acquired::Slot {
                        index,
                        resumed,
                        vanished,
                    }) => {
                        tracing::info!(group = %lock.group, slot = index, resumed, revision = %revision.short(), "rollout slot held");
                        self.holders.insert(index, lock.node.clone());
                        self.w.metrics.slot_lost(false);
                        let holding = Holding::lease(
                            Held {
                                backend: "kubernetes".into(),
                                group: lock.group.clone(),
                                slot: Some(index),
                                revision: revision.clone(),
                                since: util::now(),
                            },
                            lock.clone(),
                            index,
                            self.changes_tx.clone(),
                        );
                        if let Some(v) = vanished {
                            self.holding = Some(holding);
                            if let Some(wait) = self.took_over(&cfg, v, revision).await {
                                return wait;
                            }
                            match self.holding.take() {
                                Some(h) => h,
                                None => {
                                    return Permit::Wait(
                                        WaitingFor::Lock,
                                        "the slot taken over was released".into(),
                                    );
                                }
                            }
                        } else {
                            holding
                        }
                    }
                    Err(e) => return self.lock_error(&cfg, e),
                }
            }
            Effective::Fleetlock => {
                let Some(f) = &cfg.rollout.fleetlock else {
                    return Permit::Wait(WaitingFor::Lock, "rollout.fleetlock is not set".into());
                };
                let group = f.group.clone().unwrap_or_else(|| self.group());
                let client =
                    match self.fleetlock_client(f, &group, cfg.kubernetes.request_timeout.get()) {
                        Ok(c) => c,
                        Err(e) => return Permit::Wait(WaitingFor::Lock, e),
                    };
                match client.pre_reboot().await {
                    Ok(()) => {
                        tracing::info!(group = %group, id = client.id(), revision = %revision.short(), "FleetLock held");
                        Holding::fleetlock(Held {
                            backend: "fleetlock".into(),
                            group,
                            slot: None,
                            revision: revision.clone(),
                            since: util::now(),
                        })
                    }
                    Err(e) if e.is_refused() => {
                        return Permit::Wait(WaitingFor::Lock, e.to_string());
                    }
                    Err(e) => return self.api_unavailable(&cfg, e.to_string()),
                }
            }
            Effective::None | Effective::Bootstrap => return Permit::Granted(None),
        };
        let resuming_own = held.is_some();
        let held = granted.held.clone();
        self.holding = Some(granted);
        // The fleet state was read before the slot was taken; a halt or pause written since
        // (a takeover halts, then releases the very slot this node just took) must be seen
        // before anything starts under it. A read after the slot's write is ordered after it.
        if kube_configured
            && let Some(wait) = self
                .recheck_fleet(&cfg, revision, purpose, resuming_own)
                .await
        {
            if let Err(e) = self.release(&held).await {
                tracing::warn!(error = %e, "cannot release the slot just taken; it expires by itself");
            }
            self.holding = None;
            return wait;
        }
        self.waiting_since = None;
        self.watch_slots(&cfg, None, false);
        self.w
            .metrics
            .lock_waited(started_waiting.elapsed().as_secs_f64());
        self.w.metrics.lock_held(true);
        Permit::Granted(Some(held))
    }

    /// The fleet state read again after a slot was taken: the wait it imposes, if any (an
    /// unreadable state is a wait too: the slot is given back).
    async fn recheck_fleet(
        &mut self,
        cfg: &Config,
        revision: &Revision,
        purpose: Purpose,
        resuming_own: bool,
    ) -> Option<Permit> {
        let clients = self.clients()?;
        let fleet = fleet_of(cfg, &clients);
        let state = match fleet.read().await {
            Ok(s) => s,
            Err(e) => {
                let waiting_for = if unavailable(&e) {
                    WaitingFor::Api
                } else {
                    WaitingFor::Refused
                };
                return Some(Permit::Wait(
                    waiting_for,
                    format!(
                        "cannot read the rollout state {} again after taking a slot: {}",
                        fleet.object(),
                        describe(&e)
                    ),
                ));
            }
        };
        let wait = held_back(
            &state,
            revision,
            purpose,
            &cfg.rollout.group_for(cfg.node.role),
            resuming_own,
        );
        self.fleet = Some(state);
        if wait.is_some() {
            tracing::info!(revision = %revision.short(),
                "the rollout state changed while the slot was taken; giving it back");
        }
        wait
    }

    /// After a restart, the lock the state says this node holds: its slot taken up again
    /// (renewed from now on, saying the node is in `phase`), or found lost to another node.
    /// `Ok(true)` when it is held.
    pub async fn resume(&mut self, held: &Held, phase: SlotPhase) -> Result<bool, String> {
        if self.holding.is_some() {
            return Ok(true);
        }
        let cfg = self.cfg();
        if held.backend != "kubernetes" {
            // A FleetLock is held by the server until steady-state; nothing to renew.
            self.holding = Some(Holding::fleetlock(held.clone()));
            return Ok(true);
        }
        let Some(clients) = self.clients() else {
            return Err("no connection to the Kubernetes API yet".into());
        };
        self.ensure_watch(&cfg, &clients);
        let lock = self.lease_lock(&cfg, &clients);
        *guard::<lease::Doing>(&lock.doing) = lease::Doing {
            revision: Some(held.revision.to_string()),
            phase,
        };
        match lock
            .acquire(Duration::ZERO)
            .await
            .map_err(|e| e.to_string())?
        {
            Acquired::Slot {
                index,
                resumed,
                vanished,
            } => {
                if !resumed {
                    tracing::warn!(
                        slot = index,
                        "the slot held before the restart had expired; took a free one"
                    );
                } else {
                    tracing::info!(
                        slot = index,
                        "resumed the rollout slot held before the restart"
                    );
                }
                self.holding = Some(Holding::lease(
                    Held {
                        slot: Some(index),
                        ..held.clone()
                    },
                    lock,
                    index,
                    self.changes_tx.clone(),
                ));
                self.w.metrics.lock_held(true);
                self.w.metrics.slot_lost(false);
                if let Some(v) = vanished {
                    let _ = self.took_over(&cfg, v, &held.revision).await;
                }
                Ok(self.holding.is_some())
            }
            Acquired::Soaking { .. } => Ok(false),
            Acquired::Full(holders) => {
                tracing::warn!(
                    ?holders,
                    "the slot held before the restart expired and was taken; going on without it"
                );
                self.holders = holders;
                Ok(false)
            }
        }
    }

    /// This node took over a slot from `v`, which stopped renewing it. When `v` was applying or
    /// verifying a revision, that revision may be what killed it, and `v` may still be at it
    /// (cut off, stopped): the revision is halted cluster-wide (`on_holder_lost = "halt"`) with
    /// the group, the slot released, and the group waits (see `FleetState::vanished_in`).
    /// `Some(wait)` when this node must not go on now; a halt that cannot be written yet is
    /// owed (written first at the next ask), the slot kept meanwhile.
    async fn took_over(
        &mut self,
        cfg: &Config,
        v: Vanished,
        revision: &Revision,
    ) -> Option<Permit> {
        let lease = self
            .holding
            .as_ref()
            .and_then(|h| h.held.slot)
            .map(|i| cfg_slot_lease(cfg, i))
            .unwrap_or_default();
        let doing = v.doing.clone().unwrap_or_default();
        let their: Option<Revision> = doing.revision.as_deref().and_then(|r| r.parse().ok());
        tracing::warn!(holder = %v.node, lease = %lease, phase = doing.phase.as_str(),
            revision = their.as_ref().map_or("-", |r| r.short()),
            "took over a rollout slot whose holder stopped renewing it");
        self.w.notices.emit(
            Reason::HolderVanished,
            their.as_ref().map(Revision::as_str),
            format!(
                "took over rollout slot {lease}: its holder {} stopped renewing it while {}{}",
                v.node,
                doing.phase.as_str(),
                their
                    .as_ref()
                    .map_or(String::new(), |r| format!(" revision {}", r.short()))
            ),
        );
        let their = their.filter(|_| v.doing.as_ref().is_some_and(|d| d.phase.activating()))?;
        if cfg.rollout.on_holder_lost == OnHolderLost::Proceed {
            tracing::warn!(holder = %v.node, revision = %their.short(),
                "not halting the revision of the vanished holder (rollout.on_holder_lost = \"proceed\")");
            return None;
        }
        let halt = Halt {
            revision: their.clone(),
            node: v.node.clone(),
            probes: BTreeMap::new(),
            reason: format!(
                "holder-vanished: {} stopped renewing its rollout slot ({lease}) while {} this \
                 revision; {} took the slot over. Lifted by itself if {} comes back and its \
                 gate passes; `ginxctl rollout clear {}` lifts it now",
                v.node,
                doing.phase.as_str(),
                cfg.node_name(),
                v.node,
                their.short()
            ),
            at: util::now(),
            cause: HaltCause::HolderVanished,
            group: Some(cfg.rollout.group_for(cfg.node.role)),
        };
        match self.write_owed_halt(halt).await {
            Ok(()) => Some(Permit::Wait(
                WaitingFor::Halted,
                format!(
                    "{} vanished while rolling out {}: halted, and the group waits{}",
                    v.node,
                    their.short(),
                    if &their == revision {
                        ""
                    } else {
                        " (this node's revision too)"
                    }
                ),
            )),
            Err(e) => Some(self.api_unavailable(
                cfg,
                format!(
                    "cannot halt revision {} of the vanished holder {}: {e}",
                    their.short(),
                    v.node
                ),
            )),
        }
    }

    /// Writes a `holder-vanished` halt (owed until it is written); once written, the slot
    /// taken over is released: the group waits for the vanished holder.
    async fn write_owed_halt(&mut self, halt: Halt) -> Result<(), String> {
        let revision = halt.revision.clone();
        let node = halt.node.clone();
        self.owed_halt = Some(halt.clone());
        self.halt(halt).await?;
        self.owed_halt = None;
        tracing::error!(revision = %revision.short(), holder = %node, reason = "holder-vanished",
            "revision halted cluster-wide: its holder vanished while rolling it out");
        let me = self.w.config.borrow().node_name().to_owned();
        self.w.notices.emit(
            Reason::RevisionHalted,
            Some(revision.as_str()),
            format!(
                "revision {} halted fleet-wide by {me}: its holder {node} vanished while rolling it out; `ginxctl rollout clear {}` lifts it",
                revision.short(),
                revision.short()
            ),
        );
        if let Some(h) = self.holding.as_ref().map(|h| h.held.clone())
            && let Err(e) = self.release(&h).await
        {
            tracing::warn!(error = %e, "cannot release the slot taken over; it expires by itself");
            self.holding = None;
        }
        Ok(())
    }

    /// Releases the lock held; an error leaves it held (the caller tries again).
    pub async fn release(&mut self, held: &Held) -> Result<(), String> {
        let cfg = self.cfg();
        let result = match held.backend.as_str() {
            "kubernetes" => {
                let Some(clients) = self.clients() else {
                    return Err("no connection to the Kubernetes API".into());
                };
                let lock = self.lease_lock(&cfg, &clients);
                match held.slot {
                    Some(i) => lock.release(i).await.map_err(|e| e.to_string()),
                    None => Ok(Released::NotHeld),
                }
            }
            "fleetlock" => match &cfg.rollout.fleetlock {
                Some(f) => {
                    let group = f.group.clone().unwrap_or_else(|| held.group.clone());
                    match self.fleetlock_client(f, &group, cfg.kubernetes.request_timeout.get()) {
                        Ok(c) => match c.steady_state().await {
                            Ok(()) => Ok(Released::Yes),
                            // poseidon/fleetlock answers 423 to a steady-state from an id
                            // that does not hold the group's slot: there is nothing of this
                            // node's to give back, and asking again would never end.
                            Err(FleetLockError::Refused {
                                status: 409 | 423, ..
                            }) => {
                                tracing::warn!(group = %group, id = c.id(),
                                    "the FleetLock server says another node holds the group's slot; this node holds nothing to release");
                                Ok(Released::NotHeld)
                            }
                            Err(e) => Err(e.to_string()),
                        },
                        Err(e) => Err(e),
                    }
                }
                None => Ok(Released::NotHeld),
            },
            _ => Ok(Released::NotHeld),
        };
        if let Ok(released) = result {
            match released {
                Released::Yes => {
                    tracing::info!(backend = %held.backend, group = %held.group, slot = ?held.slot, "rollout lock released");
                }
                Released::NotHeld if held.backend == "kubernetes" => {
                    tracing::warn!(group = %held.group, slot = ?held.slot,
                        "the rollout slot was no longer this node's (lost while held); nothing to release");
                }
                Released::NotHeld => {}
            }
            if let Some(i) = held.slot
                && self.holders.get(&i) == Some(&cfg.node_name().to_owned())
            {
                self.holders.remove(&i);
            }
            if let Some(h) = self.holding.take() {
                self.w.metrics.slot_held(h.taken.elapsed().as_secs_f64());
            }
            self.w.metrics.lock_held(false);
            self.w.metrics.slot_lost(false);
        }
        result.map(|_| ())
    }

    /// Fencing: whether this node may start an activation or a reboot now under the slot it
    /// holds. Its last write of the slot must be younger than a third of `lease_duration` on
    /// the monotonic clock (so no other node can have judged it expired before the start plus
    /// two thirds of it); an older one is renewed first. A lost slot starts nothing. Without a
    /// Lease slot (no lock, bootstrap, FleetLock) there is nothing to fence.
    pub async fn fence(&mut self) -> Result<(), String> {
        let Some(h) = &self.holding else {
            return Ok(());
        };
        let Some(lock) = h.lock.clone() else {
            return Ok(());
        };
        let index = h.held.slot.unwrap_or_default();
        if h.lost.load(Ordering::Relaxed) {
            return Err(format!(
                "the rollout slot {} was lost; nothing starts until a slot is taken again",
                lock.name(index)
            ));
        }
        if h.since_renewal() < lock.duration / 3 {
            return Ok(());
        }
        let (renewed, lost) = (Arc::clone(&h.renewed), Arc::clone(&h.lost));
        match renew_now(&lock, index, &renewed, &lost, &self.changes_tx).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(format!(
                "the rollout slot {} was taken by another node",
                lock.name(index)
            )),
            Err(e) => Err(format!(
                "cannot renew the rollout slot {} before starting: {e}",
                lock.name(index)
            )),
        }
    }

    /// What this node now does with its slot, written on the slot Lease at once (and with
    /// every renewal).
    pub async fn set_phase(&mut self, phase: SlotPhase) {
        let Some(h) = &self.holding else { return };
        let Some(lock) = h.lock.clone() else { return };
        let index = h.held.slot.unwrap_or_default();
        {
            let mut d = guard::<lease::Doing>(&lock.doing);
            if d.phase == phase {
                return;
            }
            d.phase = phase;
        }
        if h.lost.load(Ordering::Relaxed) {
            return;
        }
        let (renewed, lost) = (Arc::clone(&h.renewed), Arc::clone(&h.lost));
        match renew_now(&lock, index, &renewed, &lost, &self.changes_tx).await {
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(slot = index, error = %e, phase = phase.as_str(), "cannot write the slot's phase now; the next renewal writes it");
            }
        }
    }

    /// `revision`'s gate passed on this node: a `holder-vanished` halt naming this node is
    /// lifted (the revision did not kill it; it was cut off).
    pub async fn lift_vanished(&mut self, revision: &Revision) {
        let cfg = self.cfg();
        if effective(&cfg) != Effective::Kubernetes {
            return;
        }
        let halted_here = self
            .fleet
            .as_ref()
            .and_then(|f| f.halt_of(revision))
            .is_none_or(|h| h.cause == HaltCause::HolderVanished && h.node == cfg.node_name());
        if !halted_here || !self.can_halt() {
            return;
        }
        let Some(clients) = self.clients() else {
            return;
        };
        let fleet = fleet_of(&cfg, &clients);
        match fleet.lift_vanished(revision, cfg.node_name()).await {
            Ok(u) => {
                if u.changed {
                    tracing::warn!(revision = %revision.short(),
                        "lifted the holder-vanished halt of this revision: this node came back and its gate passed");
                }
                self.fleet = Some(u.state);
            }
            Err(e) => {
                tracing::warn!(revision = %revision.short(), error = %e, "cannot lift the holder-vanished halt naming this node; `ginxctl rollout clear` lifts it")
            }
        }
    }

    /// The client for the API (the kubeconfig's server), when there is one.
    pub fn client(&mut self) -> Option<kube::Client> {
        self.clients().map(|c| c.main)
    }

    /// The node's own identity, for what ginx does to its own Node and pods (cordon, drain);
    /// or why there is none.
    pub fn node_client(&mut self) -> Result<kube::Client, String> {
        match self.clients() {
            Some(c) => c.node(),
            None => Err("no connection to the Kubernetes API".to_owned()),
        }
    }

    /// Before a reboot: the held slot Lease's duration raised to `ttl` (and renewed at a third
    /// of it from now on), its phase `rebooting`, so that other nodes take a rebooting holder
    /// for a live one. Nothing to do for a FleetLock, which the server holds until
    /// steady-state. After the reboot, [`resume`](Self::resume) writes the normal duration
    /// again.
    pub async fn raise_ttl(&mut self, ttl: Duration) -> Result<(), String> {
        let cfg = self.cfg();
        let Some(h) = &self.holding else {
            return Err("no rollout slot is held".into());
        };
        let Some(index) = h.held.slot.filter(|_| h.held.backend == "kubernetes") else {
            return Ok(());
        };
        if h.lost.load(Ordering::Relaxed) {
            return Err("the rollout slot was lost".into());
        }
        let held = h.held.clone();
        let Some(clients) = self.clients() else {
            return Err("no connection to the Kubernetes API".into());
        };
        let mut lock = self.lease_lock(&cfg, &clients);
        lock.duration = ttl;
        *guard::<lease::Doing>(&lock.doing) = lease::Doing {
            revision: Some(held.revision.to_string()),
            phase: SlotPhase::Rebooting,
        };
        match lock.renew(index).await.map_err(|e| e.to_string())? {
            true => {}
            false => {
                return Err(format!(
                    "slot Lease {} is held by another node",
                    lock.name(index)
                ));
            }
        }
        self.holding = Some(Holding::lease(
            held,
            lock.clone(),
            index,
            self.changes_tx.clone(),
        ));
        tracing::info!(slot = index, lease = %lock.name(index), ttl_secs = ttl.as_secs(), "rollout slot's duration raised for the reboot");
        Ok(())
    }

    /// Halts `halt.revision` cluster-wide.
    pub async fn halt(&mut self, halt: Halt) -> Result<(), String> {
        let cfg = self.cfg();
        let Some(clients) = self.clients() else {
            return Err("no connection to the Kubernetes API".into());
        };
        let fleet = fleet_of(&cfg, &clients);
        let u = fleet.halt(halt).await?;
        self.fleet = Some(u.state);
        if u.changed {
            self.w.metrics.halted();
        }
        Ok(())
    }

    /// Counts this node's failure of `halt.revision` against its budget
    /// (`rollout.halt_after`): the revision is halted when the count reaches it, else this node
    /// is quarantined and the rollout goes on.
    pub async fn fail(&mut self, halt: Halt) -> Result<super::fleet::Counted, String> {
        let cfg = self.cfg();
        let Some(clients) = self.clients() else {
            return Err("no connection to the Kubernetes API".into());
        };
        let fleet = fleet_of(&cfg, &clients);
        let (state, counted) = fleet.fail(halt, cfg.rollout.halt_after).await?;
        self.fleet = Some(state);
        if counted.changed && counted.halted {
            self.w.metrics.halted();
        }
        Ok(counted)
    }

    /// `rollout.after`: the wait while a node of a group this node's group comes after has not
    /// passed its gate on `revision` (or on a later one); `None` once every one has. Every
    /// heartbeat Lease labelled with the group counts (a node removed for good has its
    /// heartbeat Lease deleted). While waiting, those Leases are watched.
    async fn after_groups(
        &mut self,
        cfg: &Config,
        clients: &KubeClients,
        revision: &Revision,
    ) -> Option<Permit> {
        let groups = cfg.rollout.after_for(cfg.node.role);
        if groups.is_empty() || self.after_passed.as_ref() == Some(revision) {
            self.watching_after = None;
            return None;
        }
        let api = kube::Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(
            clients.main.clone(),
            &cfg.kubernetes.namespace,
        );
        let selector = format!("{} in ({})", HEARTBEAT_GROUP_LABEL, groups.join(","));
        let leases = match api
            .list(&kube::api::ListParams::default().labels(&selector))
            .await
        {
            Ok(l) => l.items,
            Err(e) if unavailable(&e) => {
                return Some(self.api_unavailable(
                    cfg,
                    format!(
                        "cannot read the heartbeats of group(s) {} (rollout.after): {}",
                        groups.join(", "),
                        describe(&e)
                    ),
                ));
            }
            Err(e) => {
                return Some(Self::refused(refusal(
                    "list",
                    &format!("leases in namespace {}", cfg.kubernetes.namespace),
                    &e,
                )));
            }
        };
        let mut behind = Vec::new();
        let mut seen = std::collections::BTreeSet::new();
        for l in &leases {
            let group = l
                .metadata
                .labels
                .as_ref()
                .and_then(|m| m.get(HEARTBEAT_GROUP_LABEL))
                .cloned()
                .unwrap_or_default();
            seen.insert(group.clone());
            let node = l
                .spec
                .as_ref()
                .and_then(|s| s.holder_identity.clone())
                .unwrap_or_else(|| l.metadata.name.clone().unwrap_or_default());
            let passed: Option<Revision> = l
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(HEARTBEAT_PASSED_ANNOTATION))
                .and_then(|p| p.parse().ok());
            let ok = match &passed {
                Some(p) if p == revision => true,
                Some(p) => self.later(p, revision).await,
                None => false,
            };
            if !ok {
                behind.push(format!(
                    "{node} ({group}, passed {})",
                    passed.as_ref().map_or("nothing yet", |p| p.short())
                ));
            }
        }
        for g in &groups {
            if !seen.contains(g) {
                behind.push(format!(
                    "group {g} has no node (no heartbeat Lease labelled {}={g}; check \
                     rollout.after)",
                    HEARTBEAT_GROUP_LABEL
                ));
            }
        }
        if behind.is_empty() {
            self.after_passed = Some(revision.clone());
            self.watching_after = None;
            return None;
        }
        self.watch_after(&groups, clients, &cfg.kubernetes.namespace, &selector);
        Some(Permit::Wait(
            WaitingFor::After,
            format!(
                "after {}: not every node passed its gate on {} yet: {}",
                groups.join(", "),
                revision.short(),
                behind.join(", ")
            ),
        ))
    }

    /// Whether `theirs` descends from `ours` in the apply source's clone (a later revision).
    async fn later(&self, theirs: &Revision, ours: &Revision) -> bool {
        match &self.w.later {
            Some(later) => later(theirs.clone(), ours.clone()).await,
            None => false,
        }
    }

    /// Watches the heartbeat Leases of the `rollout.after` groups (while waiting for them).
    fn watch_after(&mut self, groups: &[String], clients: &KubeClients, ns: &str, selector: &str) {
        if self
            .watching_after
            .as_ref()
            .is_some_and(|(g, c, _)| g == groups && *c == self.clients_generation)
        {
            return;
        }
        let (stop_tx, mut stop) = watch::channel(false);
        let api = kube::Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(
            clients.watch.clone(),
            ns,
        );
        let changes = self.changes_tx.clone();
        let selector = selector.to_owned();
        tokio::spawn(async move {
            tokio::select! {
                () = lease::watch_objects(api, selector, None, changes, Some(passed_of)) => {}
                _ = stop.changed() => {}
            }
        });
        self.watching_after = Some((groups.to_vec(), self.clients_generation, stop_tx));
    }

    /// Whether halts can be written at all (a cluster to write them to).
    pub fn can_halt(&self) -> bool {
        let cfg = self.cfg();
        cfg.kubernetes
            .kubeconfig
            .as_deref()
            .is_some_and(|p| p.exists())
    }

    /// Runs the probes at the gate's interval while a gate is open.
    pub fn fast_probes(&self, on: bool) {
        let interval = on.then(|| self.cfg().rollout.gate.interval.get());
        self.w.fast_probes.send_if_modified(|v| {
            let changed = *v != interval;
            *v = interval;
            changed
        });
    }

    /// Every check the gate looks at now: the probes, the API (when there is a client), the
    /// apply source, and the operator's command.
    pub async fn checks(&mut self) -> BTreeMap<String, Check> {
        let cfg = self.cfg();
        let mut out: BTreeMap<String, Check> = self
            .w
            .health
            .borrow()
            .iter()
            // ginx's own state file is not the node's health: a write that fails says
            // nothing about the activation, and it has no result to be fresh.
            .filter(|(n, _)| n.as_str() != STATE_HEALTH)
            .map(|(n, p)| {
                (
                    n.clone(),
                    Check {
                        status: p.status,
                        message: p.message.clone(),
                        checked_at: p.checked_at,
                        checked: p.checked,
                    },
                )
            })
            .collect();
        if let Some(clients) = self.clients() {
            let t = cfg.kubernetes.request_timeout.get();
            let (status, message) = match tokio::time::timeout(t, readyz(&clients.main)).await {
                Ok(Ok(())) => (HealthStatus::Ok, "the API answers /readyz".to_owned()),
                Ok(Err(e)) => (HealthStatus::Failed, e),
                Err(_) => (HealthStatus::Failed, "the API does not answer".to_owned()),
            };
            out.insert(
                "api".into(),
                Check {
                    status,
                    message,
                    checked_at: Some(util::now()),
                    checked: Some(Instant::now()),
                },
            );
        }
        if let Some(reach) = &self.w.reach_source {
            let fresh = self
                .last_reach
                .as_ref()
                .filter(|(at, _)| at.elapsed() < REACH_EVERY)
                .map(|(_, c)| c.clone());
            let check = match fresh {
                Some(c) => c,
                None => {
                    let (status, message) = match reach().await {
                        Ok(()) => (
                            HealthStatus::Ok,
                            format!("{} can be fetched", cfg.apply.source),
                        ),
                        Err(e) => (
                            HealthStatus::Failed,
                            format!("cannot fetch {}: {e}", cfg.apply.source),
                        ),
                    };
                    let c = Check {
                        status,
                        message,
                        checked_at: Some(util::now()),
                        checked: Some(Instant::now()),
                    };
                    self.last_reach = Some((Instant::now(), c.clone()));
                    c
                }
            };
            out.insert("source".into(), check);
        }
        if let Some(argv) = &cfg.rollout.gate.command {
            out.insert(
                "command".into(),
                run_command(argv, cfg.rollout.gate.command_timeout.get()).await,
            );
        }
        out
    }

    /// Every check after one fresh round of the probes: the baseline a gate compares with
    /// must be evidence from just before the activation, not whatever the probes said last
    /// (right after startup, before the API connection, the API-based ones say "unknown",
    /// which no later failure would count as a regression of). Waits at most
    /// [`FRESH_ROUND`]; a probe slower than that keeps its last result.
    pub async fn baseline_checks(&mut self) -> BTreeMap<String, Check> {
        let since = Instant::now();
        self.fast_probes(true);
        // Polled: the health watch wakes nobody for a new `checked_at` alone. Every 2 ms, as
        // this wait is on the way of every apply: at 20 ms it was most of `ginxctl sync` to the
        // apply's start (core_loop bench, 36.7 ms against 20.2 ms now).
        let started = Instant::now();
        loop {
            let stale: Vec<String> = self
                .w
                .health
                .borrow()
                .iter()
                .filter(|(_, p)| p.checked.is_none_or(|t| t < since))
                .map(|(n, _)| n.clone())
                .collect();
            if stale.is_empty() {
                break;
            }
            if started.elapsed() >= FRESH_ROUND {
                tracing::info!(probes = %stale.join(","), "no fresh result before the activation; the gate's baseline keeps their last ones");
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        self.fast_probes(false);
        self.checks().await
    }

    /// Forgets the cached source check (a new gate wants fresh evidence).
    pub fn new_gate(&mut self) {
        self.last_reach = None;
    }
}

/// What of a heartbeat Lease wakes a node waiting for its group (`rollout.after`): the group
/// and the revision passed, not the renewals.
fn passed_of(lease: &k8s_openapi::api::coordination::v1::Lease) -> String {
    let m = &lease.metadata;
    format!(
        "{} {}",
        m.labels
            .as_ref()
            .and_then(|l| l.get(HEARTBEAT_GROUP_LABEL))
            .map_or("", String::as_str),
        m.annotations
            .as_ref()
            .and_then(|a| a.get(HEARTBEAT_PASSED_ANNOTATION))
            .map_or("", String::as_str)
    )
}

/// What in the fleet state holds this node back from taking (or keeping) a slot for
/// `revision`: a pause, a halt of the revision (for an apply), or a holder of its group that
/// vanished mid-rollout (unless this node resumes its own slot).
fn held_back(
    state: &FleetState,
    revision: &Revision,
    purpose: Purpose,
    group: &str,
    resuming_own: bool,
) -> Option<Permit> {
    if let Some(p) = &state.paused {
        return Some(Permit::Wait(
            WaitingFor::Paused,
            format!(
                "the fleet is paused by {} since {}; `ginxctl rollout resume` lifts it",
                p.by, p.at
            ),
        ));
    }
    if let Some(h) = state
        .halt_of(revision)
        .filter(|_| purpose == Purpose::Apply)
    {
        let what = match h.cause {
            HaltCause::GateFailed => format!("its health gate failed on {}", h.node),
            HaltCause::HolderVanished => {
                format!("{} vanished holding a rollout slot for it", h.node)
            }
            HaltCause::BuildFailed => format!("it failed to build on {}", h.node),
        };
        return Some(Permit::Wait(
            WaitingFor::Halted,
            format!(
                "revision {} is halted: {what} at {} ({}); a new revision rolls out \
                 normally, `ginxctl rollout clear {}` lifts the halt",
                revision.short(),
                h.at,
                h.reason,
                revision.short()
            ),
        ));
    }
    // A holder of this group vanished mid-rollout: it may still be activating or verifying
    // (cut off, stopped), so nothing of the group starts until it is back and its gate
    // passed, or an operator clears the halt. A node resuming its own slot goes on.
    if resuming_own {
        return None;
    }
    let h = state.vanished_in(group)?;
    Some(Permit::Wait(
        WaitingFor::Halted,
        format!(
            "{} vanished holding a rollout slot of group {} while rolling out {} and may \
             still be activating it; the group waits until it is back and its gate \
             passes, or `ginxctl rollout clear {}` after checking it",
            h.node,
            h.group.as_deref().unwrap_or("-"),
            h.revision.short(),
            h.revision.short()
        ),
    ))
}

/// The fleet state's ConfigMap, as ginx's own identity reads and writes it.
fn fleet_of(cfg: &Config, clients: &KubeClients) -> Fleet {
    Fleet::new(
        clients.main.clone(),
        &cfg.kubernetes.namespace,
        &cfg.rollout.configmap,
    )
}

/// The slot Lease name of slot `index` of this node's group.
fn cfg_slot_lease(cfg: &Config, index: u32) -> String {
    crate::config::RolloutConfig::slot_lease(&cfg.rollout.group_for(cfg.node.role), index)
}

/// Marks the slot lost (once) and wakes whoever waits on the gatekeeper.
fn mark_lost(
    lock: &LeaseLock,
    index: u32,
    lost: &AtomicBool,
    changes: &watch::Sender<u64>,
    why: &str,
) {
    if !lost.swap(true, Ordering::Relaxed) {
        tracing::error!(slot = index, lease = %lock.name(index), why,
            "the rollout slot was lost: nothing new starts until a slot is taken again; an activation or gate under way finishes and is reported");
        changes.send_modify(|n| *n = n.wrapping_add(1));
    }
}

/// Renews slot `index` now: its renewal time updated, or the slot marked lost when another node
/// holds it (`Ok(false)`).
async fn renew_now(
    lock: &LeaseLock,
    index: u32,
    renewed: &Mutex<Instant>,
    lost: &AtomicBool,
    changes: &watch::Sender<u64>,
) -> Result<bool, LockError> {
    let held = lock.renew(index).await?;
    if held {
        *guard::<Instant>(renewed) = Instant::now();
    } else {
        mark_lost(lock, index, lost, changes, "taken by another node");
    }
    Ok(held)
}

/// Renews slot `index` at a third of its duration until aborted. The slot is lost when a
/// renewal finds another holder, or when no renewal succeeded for the slot's duration (by
/// then another node may have taken it, and it cannot be known until the API answers).
async fn renew(
    lock: LeaseLock,
    index: u32,
    renewed: Arc<Mutex<Instant>>,
    lost: Arc<AtomicBool>,
    changes: watch::Sender<u64>,
) {
    let every = lock.duration / 3;
    loop {
        tokio::time::sleep(every).await;
        if lost.load(Ordering::Relaxed) {
            // Lost for good: this node never writes the slot again (taking one again is a new
            // acquire).
            return;
        }
        let result = lock.renew(index).await;
        let age = guard::<Instant>(&renewed).elapsed();
        match result {
            Ok(true) if age < lock.duration => *guard::<Instant>(&renewed) = Instant::now(),
            // Renewed, but only after the slot could have expired for others: whether another
            // node took and released it meanwhile cannot be told, so it counts as lost.
            Ok(true) => mark_lost(
                &lock,
                index,
                &lost,
                &changes,
                "not renewed for its duration",
            ),
            Ok(false) => mark_lost(&lock, index, &lost, &changes, "taken by another node"),
            Err(e) if age >= lock.duration => {
                tracing::warn!(slot = index, error = %e, "cannot renew the rollout slot");
                mark_lost(
                    &lock,
                    index,
                    &lost,
                    &changes,
                    "not renewed for its duration",
                );
            }
            Err(e) => {
                tracing::warn!(slot = index, error = %e, "cannot renew the rollout slot; trying again")
            }
        }
    }
}

/// `rollout.gate.command`: exit 0 within `timeout` is healthy.
async fn run_command(argv: &[String], timeout: Duration) -> Check {
    let now = util::now();
    let started = Instant::now();
    let mut cmd = tokio::process::Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    let (status, message) = match tokio::time::timeout(timeout, cmd.output()).await {
        Err(_) => (
            HealthStatus::Failed,
            format!("{} did not finish within {}s", argv[0], timeout.as_secs()),
        ),
        Ok(Err(e)) => (HealthStatus::Failed, format!("cannot run {}: {e}", argv[0])),
        Ok(Ok(out)) if out.status.success() => (HealthStatus::Ok, "exit 0".to_owned()),
        Ok(Ok(out)) => {
            let text = String::from_utf8_lossy(if out.stderr.is_empty() {
                &out.stdout
            } else {
                &out.stderr
            });
            let last = text
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("")
                .trim();
            let last: String = last.chars().take(200).collect();
            (
                HealthStatus::Failed,
                format!("{} exited with {}: {last}", argv[0], out.status),
            )
        }
    };
    Check {
        status,
        message,
        checked_at: Some(now),
        checked: Some(started),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gatekeeper() -> (Gatekeeper, watch::Sender<Option<KubeClients>>) {
        let (_config_tx, config) = watch::channel(Arc::new(Config::default()));
        let (kube_tx, kube) = watch::channel(None);
        let (_health_tx, health) = watch::channel(HealthMap::new());
        let (fast_probes, _) = watch::channel(None);
        let g = Gatekeeper::new(Wiring {
            notices: crate::types::Notices::disabled(),
            config,
            kube,
            health,
            fast_probes,
            reach_source: None,
            later: None,
            metrics: Metrics::new(),
            observed: Arc::default(),
        });
        (g, kube_tx)
    }

    /// After a reboot the slot is taken up the moment the API client is made, not a retry
    /// later: the reconciler waits in `changed()`, which marks the client watch seen, and
    /// `clients_changed()` must still say so until the clients are used.
    #[tokio::test]
    async fn clients_made_while_waiting_count_as_changed_until_used() {
        let (mut g, kube_tx) = gatekeeper();
        assert!(!g.clients_changed());
        kube_tx.send_replace(None);
        assert!(g.clients_changed(), "a client made before the wait");
        g.changed().await;
        assert!(g.clients_changed(), "a client made during the wait");
        assert!(g.clients().is_none());
        assert!(!g.clients_changed(), "used");
        assert_eq!(g.clients_generation, 1);
    }
}
