//! [`Gatekeeper`]: the one interface `reconcile` asks — may this node apply this revision now,
//! release the lock, halt a revision, what does the gate see. It orchestrates; the decisions
//! are elsewhere and pure:
//!
//! - `decide/admission.rs` decides, from what is known so far, whether to wait, go, or learn
//!   what next; the keeper does the I/O it asks for ([`Gatekeeper::permit_for`] is the loop);
//! - `lock/` is the lock, Lease or FleetLock, behind one trait; `lock/held_slot.rs` keeps the one
//!   held renewed and fenced, and `locker.rs` here is this node's side of it;
//! - `view/` is the read model (the fleet state, heartbeats, Nodes, each watched once), which
//!   the keeper starts and stops as the guards need it; `fleet_cache.rs` keeps the fleet state
//!   as judged, read again after a take; `guards/evidence.rs` gathers what the gate looks at,
//!   `decide/takeover.rs` says what a slot taken over from a vanished holder halts.
//!
//! It owns the watch that wakes a waiting node the moment a slot or the fleet state changes,
//! the queue mark of a large group, and the halt a take-over owes the fleet. It hands out no
//! API clients: the daemon hands those to whoever needs them.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use crate::config::{Config, LockBackend, OnHolderLost};
use crate::k8s::KubeClients;
use crate::metrics::Metrics;
use crate::rollout::decide::admission::{self, Verdict};
pub use crate::rollout::decide::admission::{Effective, Purpose};
use crate::rollout::decide::gate::Check;
use crate::rollout::fleet::state::{FleetState, Halt};
use crate::rollout::guards::after::AfterGroups;
pub use crate::rollout::guards::after::Later;
use crate::rollout::guards::evidence::Evidence;
pub use crate::rollout::guards::evidence::{GateStep, Look, Reach};
use crate::rollout::lock::SlotError;
use crate::rollout::lock::lease::SlotPhase;
use crate::rollout::lock::slots::Observed;
use crate::rollout::view::{FleetFeed, View};
use crate::state::{SlotBackend, TakenSlot};
use crate::status::{HealthMap, WaitingFor};
use crate::types::{HaltCause, Reason, Revision, Role};
use crate::util;
use crate::util::Spell;
use fleet_cache::FleetCache;
use locker::Locker;

/// While waiting, the verdict is looked at again this often even if no watch fired (another
/// node's health is not watched).
pub const RECHECK: Duration = Duration::from_secs(5);

/// The same while queued for a slot of a large group: a release names the next node itself
/// (`lease.rs`), so the looks are only for slots nobody took (a holder that died, a named node
/// that did not come) and can be rarer; with many nodes queued one of them still looks often.
pub const QUEUED_RECHECK: Duration = Duration::from_secs(10);

/// The control plane's own checks, which hold a gate on a control-plane node even when they
/// failed before the activation.
pub const CONTROL_PLANE_REQUIRED: &[&str] = &["apiserver", "kube-vip", "node-ready", "etcd"];

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
    /// The daemon's one watch of the fleet ConfigMap.
    pub fleet: FleetFeed,
}

/// The answer to "may I apply?".
#[derive(Debug)]
pub enum Permit {
    /// Go ahead; with the lock held (to be recorded in the state), or with none.
    Granted(Option<TakenSlot>),
    Wait(WaitingFor, String),
}

/// The backend `cfg` asks for, given whether its kubeconfig file exists.
pub fn effective(cfg: &Config) -> Effective {
    match cfg.rollout.lock {
        LockBackend::None => Effective::None,
        LockBackend::Auto if has_cluster(cfg) => Effective::Kubernetes,
        LockBackend::Auto => Effective::Bootstrap,
        LockBackend::Kubernetes => Effective::Kubernetes,
        LockBackend::Fleetlock => Effective::Fleetlock,
    }
}

/// Whether the cluster exists for this node (its kubeconfig does): halts and the fleet state
/// are read and written only then.
fn has_cluster(cfg: &Config) -> bool {
    cfg.kubernetes
        .kubeconfig
        .as_deref()
        .is_some_and(|p| p.exists())
}

pub struct Gatekeeper {
    w: Wiring,
    changes: watch::Receiver<u64>,
    /// Bumped whenever the API clients are rebuilt.
    clients_generation: usize,
    /// The clients changed while [`changed`](Self::changed) waited (which marks the watch
    /// seen): not used yet.
    kube_pending: bool,
    bootstrap_logged: bool,
    locker: Locker,
    fleet: FleetCache,
    after: AfterGroups,
    evidence: Evidence,
    /// When a wait ends by itself (the next maintenance window opening).
    wait_until: Option<jiff::Timestamp>,
    /// A `holder-vanished` halt this node owes the fleet: written before anything else, the
    /// slot kept until it is.
    owed_halt: Option<Halt>,
    /// The etcd guard's memory between looks (when a hold started).
    etcd: crate::rollout::guards::etcd::EtcdGuard,
    /// The last answer was an operator's hold: its notice is given once per spell.
    held_told: Spell,
    /// The alert gate's memory between looks (what it last logged).
    alerts: crate::rollout::guards::alerts::AlertGuard,
    /// The canaries of this node's group (`rollout.first`).
    canaries: crate::rollout::guards::canary::CanaryGroup,
    /// The read model: the fleet state, heartbeats and Nodes as watched.
    view: View,
    /// Revision pairs `(theirs, ours)` the apply source answered `theirs` later than `ours`
    /// (a yes does not change; a no is asked again, the commit may not be fetched yet).
    later_known: BTreeSet<(Revision, Revision)>,
}

impl Gatekeeper {
    pub fn new(w: Wiring) -> Self {
        let (changes_tx, changes) = watch::channel(0);
        let evidence = Evidence::new(
            w.health.clone(),
            w.fast_probes.clone(),
            w.reach_source.clone(),
        );
        let view = View::new(changes_tx.clone(), w.fleet.clone());
        let locker = Locker::new(
            changes_tx.clone(),
            Arc::clone(&w.observed),
            Arc::clone(&w.metrics),
        );
        Self {
            w,
            changes,
            clients_generation: 0,
            kube_pending: false,
            bootstrap_logged: false,
            locker,
            fleet: FleetCache::default(),
            after: AfterGroups::default(),
            evidence,
            wait_until: None,
            owed_halt: None,
            etcd: Default::default(),
            held_told: Spell::default(),
            alerts: Default::default(),
            canaries: Default::default(),
            view,
            later_known: BTreeSet::new(),
        }
    }

    fn cfg(&self) -> Arc<Config> {
        Arc::clone(&self.w.config.borrow())
    }

    pub fn group(&self) -> String {
        let cfg = self.cfg();
        cfg.rollout.group_for(cfg.node.role)
    }

    /// The fleet state as last read.
    pub fn fleet(&self) -> Option<&FleetState> {
        self.fleet.state.as_ref()
    }

    /// The group's slot holders as last read.
    pub fn holders(&self) -> &BTreeMap<u32, String> {
        &self.locker.holders
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

    /// Waits until something that may change a verdict changed: a slot, the fleet state, the
    /// API clients; or [`RECHECK`] passed.
    pub async fn changed(&mut self) {
        let until_window = self.wait_until.map(|t| {
            let d = util::now().duration_until(t);
            if d.is_negative() {
                Duration::ZERO
            } else {
                d.unsigned_abs()
            }
        });
        let soak = match (
            self.locker.soak_left(),
            self.canaries.soak_left(std::time::Instant::now()),
        ) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let recheck = if self.locker.queued() {
            QUEUED_RECHECK
        } else {
            RECHECK
        };
        tokio::select! {
            _ = self.changes.changed() => {}
            () = self.view.fleet_changed() => {}
            _ = self.w.kube.changed() => self.kube_pending = true,
            () = tokio::time::sleep(util::jitter(recheck, 0.1)) => {}
            // The soak ending, or the next window opening, to the moment.
            () = sleep_for(soak) => {}
            () = sleep_for(until_window) => {}
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
    pub fn held(&self) -> Option<&TakenSlot> {
        self.locker.held()
    }

    /// Whether the slot this node holds was lost (taken by another node, or not renewed for its
    /// duration).
    pub fn lost(&self) -> bool {
        self.locker.lost()
    }

    pub async fn permit(&mut self, revision: &Revision, held: Option<&TakenSlot>) -> Permit {
        self.permit_for(revision, held, Purpose::Apply).await
    }

    /// May this node take (or keep) the lock for `purpose`? For a reboot, `revision` is the
    /// one applied (recorded with the lock). `held` is the lock the state says it holds (after
    /// a restart): resumed, never a second one taken. A node queued for a slot (see
    /// `lease.rs`) leaves the queue once the answer is anything but waiting for one.
    pub async fn permit_for(
        &mut self,
        revision: &Revision,
        held: Option<&TakenSlot>,
        purpose: Purpose,
    ) -> Permit {
        let permit = self.decide(revision, held.is_some(), purpose).await;
        if !matches!(permit, Permit::Wait(WaitingFor::Lock, _)) {
            let cfg = self.cfg();
            // A mark a former run left is looked for with slot Leases only.
            let leases = match effective(&cfg) {
                Effective::Kubernetes => self.w.kube.borrow().clone(),
                _ => None,
            };
            self.locker.unqueue(&cfg, leases.as_ref()).await;
        }
        permit
    }

    /// Takes the lock of the backend in effect, once admission let the node through; a slot
    /// taken over from a vanished holder may halt its revision first; then the fleet state is
    /// read again (a halt or pause written since the read before the take must be seen
    /// before anything starts under it).
    async fn take(
        &mut self,
        cfg: &Config,
        revision: &Revision,
        held_in_state: bool,
        purpose: Purpose,
        clients: Option<KubeClients>,
    ) -> Permit {
        let backend = effective(cfg);
        let with = clients.as_ref().map(|c| (c, self.clients_generation));
        let Some(slot_backend) = backend.slot_backend() else {
            // Admission asks for a take only where a lock is configured.
            let why = format!(
                "no rollout lock to take (rollout.lock is {})",
                backend.as_str()
            );
            return self.answer(admission::refused(why), backend, revision);
        };
        let vanished = match self
            .locker
            .take(cfg, slot_backend, revision, purpose, with)
            .await
        {
            Ok(vanished) => vanished,
            Err(wait) => return self.answer(wait, backend, revision),
        };
        if let Some(v) = vanished
            && let Some(wait) = self.took_over(cfg, v, revision).await
        {
            return self.answer(wait, backend, revision);
        }
        let Some(held) = self.locker.held().cloned() else {
            let wait = admission::refused_lock("the slot taken over was released".into());
            return self.answer(wait, backend, revision);
        };
        if has_cluster(cfg)
            && let Some(c) = &clients
            && let Some(wait) = self
                .fleet
                .after_take(cfg, c, revision, purpose, held_in_state)
                .await
        {
            if let Err(e) = self.release(&held).await {
                tracing::warn!(error = %e, "cannot release the slot just taken; it expires by itself");
            }
            self.locker.forget();
            return self.answer(wait, backend, revision);
        }
        self.locker.granted(cfg);
        Permit::Granted(Some(held))
    }

    /// After a restart, the lock the state says this node holds: its slot taken up again
    /// (renewed from now on, saying the node is in `phase`), or found lost to another node.
    /// `Ok(true)` when it is held.
    pub async fn resume(&mut self, held: &TakenSlot, phase: SlotPhase) -> Result<bool, SlotError> {
        if self.locker.held().is_some() {
            return Ok(true);
        }
        let cfg = self.cfg();
        if held.backend != SlotBackend::Kubernetes {
            // A FleetLock is held by the server until steady-state; nothing to renew.
            self.locker.resume_kept(held);
            return Ok(true);
        }
        let Some(clients) = self.clients() else {
            return Err(SlotError::NoApi);
        };
        let Some(vanished) = self.locker.resume(&cfg, &clients, held, phase).await? else {
            return Ok(false);
        };
        if let Some(v) = vanished {
            let _ = self.took_over(&cfg, v, &held.revision).await;
        }
        Ok(self.locker.held().is_some())
    }

    /// Releases the lock held; an error leaves it held (the caller tries again).
    pub async fn release(&mut self, held: &TakenSlot) -> Result<(), SlotError> {
        let cfg = self.cfg();
        let clients = match held.backend {
            SlotBackend::Kubernetes => self.clients(),
            SlotBackend::Fleetlock => None,
        };
        self.locker.release(&cfg, held, clients.as_ref()).await
    }

    /// Fencing: whether this node may start an activation or a reboot now under the lock it
    /// holds. Without a lock there is nothing to fence.
    pub async fn fence(&mut self) -> Result<(), SlotError> {
        self.locker.fence().await
    }

    /// What this node now does with its slot, written on the slot Lease at once (and with
    /// every renewal).
    pub async fn set_phase(&mut self, phase: SlotPhase) {
        self.locker.set_phase(phase).await;
    }

    /// Before a reboot: the held slot Lease's duration raised to `ttl`, its phase
    /// `rebooting`, so that other nodes take a rebooting holder for a live one. After the
    /// reboot, [`resume`](Self::resume) writes the normal duration again.
    pub async fn raise_ttl(&mut self, ttl: Duration) -> Result<(), SlotError> {
        self.locker.raise_ttl(ttl).await
    }

    /// Whether halts can be written at all (a cluster to write them to).
    pub fn can_halt(&self) -> bool {
        has_cluster(&self.cfg())
    }

    /// Runs the probes at the gate's interval while a gate is open.
    pub fn fast_probes(&self, on: bool) {
        let interval = on.then(|| self.cfg().rollout.gate.interval.get());
        self.evidence.fast_probes(interval);
    }

    /// Every check the gate looks at now: the probes, the API (when there is a client), the
    /// apply source, and the operator's command.
    pub async fn checks(&mut self, look: Look<'_>) -> BTreeMap<String, Check> {
        let cfg = self.cfg();
        let clients = self.clients();
        self.evidence.checks(&cfg, clients.as_ref(), look).await
    }

    /// Every check after one fresh round of the probes (see [`Evidence::fresh_round`]).
    pub async fn baseline_checks(
        &mut self,
        revision: Option<&Revision>,
    ) -> BTreeMap<String, Check> {
        let interval = self.cfg().rollout.gate.interval.get();
        self.evidence.fresh_round(interval).await;
        let step = GateStep::Baseline;
        self.checks(Look { step, revision }).await
    }

    /// Forgets the cached source check (a new gate wants fresh evidence).
    pub fn new_gate(&mut self) {
        self.evidence.forget();
    }
}

/// Sleeps for `d`, or for ever.
async fn sleep_for(d: Option<Duration>) {
    match d {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

mod ask;
pub(crate) mod fleet_cache;
mod halts;
mod last_look;
pub(crate) mod locker;
pub use last_look::Toward;

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
            fleet: FleetFeed::idle(),
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
