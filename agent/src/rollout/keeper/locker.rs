//! [`Locker`]: this node's side of the rollout lock — taking it (or taking it up again after a
//! restart), holding it, giving it back — over either backend through [`RolloutLock`]. With
//! it, what waiting for a slot takes: the watch of the group's slots, the queue mark of a
//! large group, the soak.
//!
//! Owns the lock held and the group's holders as last read. Does not decide whether to ask
//! (admission), nor read the fleet state, nor halt anything.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::config::{Config, FleetLockConfig};
use crate::k8s::KubeClients;
use crate::metrics::Metrics;
use crate::rollout::decide::admission::{self, OwnSlot, Purpose, Verdict};
use crate::rollout::lock::fleetlock::{FleetLock, SetupError};
use crate::rollout::lock::held_slot::HeldSlot;
use crate::rollout::lock::lease::{LeaseLock, SlotPhase, Vanished};
use crate::rollout::lock::slots::Observed;
use crate::rollout::lock::{LockError, Released, RolloutLock, SlotError, Taken};
use crate::state::{SlotBackend, TakenSlot};
use crate::types::Revision;
use crate::util;

type FleetLockKey = (FleetLockConfig, String, Duration);

pub(crate) struct Locker {
    /// Bumped when the lock is lost, or a watched slot changes: wakes a waiting node.
    changes: watch::Sender<u64>,
    /// When this process saw each slot Lease change: how it tells a dead holder from a live
    /// one without reading another machine's clock.
    observed: Arc<Mutex<Observed>>,
    metrics: Arc<Metrics>,
    holding: Option<HeldSlot>,
    /// The group's holders as last read.
    pub holders: BTreeMap<u32, String>,
    /// The watch of the group's slot Leases: only while waiting for a slot (a node that holds
    /// one, or waits for nothing, hears of no other node's slot). Keyed by the slot watched
    /// and the clients' generation.
    watching_slots: Option<((String, usize), watch::Sender<bool>)>,
    /// The FleetLock client, kept while its configuration, group and timeout stay the same
    /// (one connection pool, the machine id read once).
    fleetlock: Option<(FleetLockKey, Arc<FleetLock>)>,
    /// The lock this node queues on (its heartbeat says so), while it waits for a slot of a
    /// large group.
    queued: Option<LeaseLock>,
    /// Whether a queue mark a former run of ginx may have left on the heartbeat was cleared.
    queue_checked: bool,
    /// When the node started waiting for a slot.
    waiting_since: Option<Instant>,
    /// While soaking (`rollout.soak`): when the soak is over, on the monotonic clock.
    soak_until: Option<Instant>,
}

impl Locker {
    pub fn new(
        changes: watch::Sender<u64>,
        observed: Arc<Mutex<Observed>>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            changes,
            observed,
            metrics,
            holding: None,
            holders: BTreeMap::new(),
            watching_slots: None,
            fleetlock: None,
            queued: None,
            queue_checked: false,
            waiting_since: None,
            soak_until: None,
        }
    }

    pub fn held(&self) -> Option<&TakenSlot> {
        self.holding.as_ref().map(|h| &h.held)
    }

    pub fn lost(&self) -> bool {
        self.holding.as_ref().is_some_and(HeldSlot::lost)
    }

    /// The lock held, as admission sees it.
    pub fn seen(&self) -> OwnSlot<'_> {
        match &self.holding {
            None => OwnSlot::None,
            Some(h) if h.lost() => OwnSlot::Lost,
            Some(h) => OwnSlot::Live(&h.held),
        }
    }

    /// Whether this node is queued for a slot of a large group.
    pub fn queued(&self) -> bool {
        self.queued.is_some()
    }

    /// How long the soak has to go, while soaking.
    pub fn soak_left(&self) -> Option<Duration> {
        self.soak_until
            .map(|t| t.saturating_duration_since(Instant::now()))
    }

    /// Forgets the lock held without giving it back (it was given back, or expires by
    /// itself).
    pub fn forget(&mut self) {
        self.holding = None;
    }

    fn lease_lock(&self, cfg: &Config, clients: &KubeClients) -> LeaseLock {
        LeaseLock::new(
            clients.main.clone(),
            &cfg.kubernetes.namespace,
            &cfg.rollout.group_for(cfg.node.role),
            cfg.node_name(),
            &cfg.rollout,
            Arc::clone(&self.observed),
            clients.clock.clone(),
        )
        .with_heartbeat(cfg.kubernetes.lease_name_for(cfg.node_name()))
    }

    /// The FleetLock client for `f` and `group`, built once per configuration.
    fn fleetlock_client(
        &mut self,
        f: &FleetLockConfig,
        group: &str,
        timeout: Duration,
    ) -> Result<Arc<FleetLock>, SetupError> {
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

    /// The lock of `backend` for `group`, or why there is none
    /// (`Refused`: it cannot be asked for as configured).
    fn lock(
        &mut self,
        cfg: &Config,
        backend: SlotBackend,
        group: &str,
        clients: Option<&KubeClients>,
    ) -> Result<Arc<dyn RolloutLock>, LockError> {
        match backend {
            SlotBackend::Kubernetes => match clients {
                Some(c) => Ok(Arc::new(self.lease_lock(cfg, c))),
                None => Err(LockError::Unavailable(
                    "no connection to the Kubernetes API".into(),
                )),
            },
            SlotBackend::Fleetlock => {
                let Some(f) = &cfg.rollout.fleetlock else {
                    return Err(LockError::Refused("rollout.fleetlock is not set".into()));
                };
                let group = f.group.clone().unwrap_or_else(|| group.to_owned());
                let timeout = cfg.kubernetes.request_timeout.get();
                match self.fleetlock_client(f, &group, timeout) {
                    Ok(c) => Ok(c),
                    Err(e) => Err(LockError::Refused(e.to_string())),
                }
            }
        }
    }

    /// Starts the watch of the group's slot Leases (in a large group, of the slots handed to
    /// this node: see [`LeaseLock::watch`]), or stops it (`None`). It runs only while this
    /// node waits for a slot: so a slot's hand-off reaches the nodes that wait, not the whole
    /// group, and a node that is done with a rollout costs the API server nothing.
    fn watch_slots(&mut self, cfg: &Config, clients: Option<(&KubeClients, usize)>) {
        let Some((clients, generation)) = clients else {
            self.watching_slots = None;
            return;
        };
        let watching = KubeClients {
            main: clients.watch.clone(),
            ..clients.clone()
        };
        let lock = self.lease_lock(cfg, &watching);
        let key = (lock.name(lock.home()), generation);
        if self.watching_slots.as_ref().is_some_and(|(k, _)| *k == key) {
            return;
        }
        let (stop_tx, stop) = watch::channel(false);
        tokio::spawn(lock.watch(self.changes.clone(), stop));
        self.watching_slots = Some((key, stop_tx));
    }

    /// Takes the lock of `backend` for `revision`: `Ok` with the holder it was taken over
    /// from, if it vanished; `Err` with the wait (the slots held, the soak, the server's no,
    /// a failed request).
    pub async fn take(
        &mut self,
        cfg: &Config,
        backend: SlotBackend,
        revision: &Revision,
        purpose: Purpose,
        clients: Option<(&KubeClients, usize)>,
    ) -> Result<Option<Vanished>, Verdict> {
        self.waiting_since.get_or_insert_with(Instant::now);
        let group = cfg.rollout.group_for(cfg.node.role);
        let lock = match self.lock(cfg, backend, &group, clients.map(|(c, _)| c)) {
            Ok(lock) => lock,
            Err(LockError::Refused(why)) if backend == SlotBackend::Fleetlock => {
                return Err(admission::refused_lock(why));
            }
            Err(e) => return Err(admission::lock_error(cfg.rollout.on_api_unavailable, e)),
        };
        lock.set_doing(Some(revision.to_string()), phase_of(purpose));
        let soak = match purpose {
            Purpose::Apply => cfg.rollout.soak.get(),
            Purpose::Reboot => Duration::ZERO,
        };
        self.soak_until = None;
        match lock.acquire(soak).await {
            Ok(Taken::Slot {
                slot,
                resumed,
                vanished,
            }) => {
                self.hold(cfg, &lock, revision, slot, resumed);
                Ok(vanished)
            }
            Ok(Taken::Soaking { left, after }) => {
                self.soak_until = Some(Instant::now() + left);
                let soak = cfg.rollout.soak.to_string();
                Err(admission::soaking(revision, &after, &soak, left))
            }
            Ok(Taken::Full(holders)) => {
                self.wait_for_slot(cfg, clients).await;
                let v = admission::busy(lock.group(), cfg.rollout.max_concurrent, &holders);
                self.holders = holders;
                Err(v)
            }
            Ok(Taken::Refused(why)) => Err(admission::refused_lock(why)),
            Err(e) => Err(admission::lock_error(cfg.rollout.on_api_unavailable, e)),
        }
    }

    /// The lock was taken: held from now on (renewed, when it has a duration).
    fn hold(
        &mut self,
        cfg: &Config,
        lock: &Arc<dyn RolloutLock>,
        revision: &Revision,
        slot: Option<u32>,
        resumed: bool,
    ) {
        let group = lock.group().to_owned();
        if let Some(index) = slot {
            tracing::info!(group = %group, slot = index, resumed, revision = %revision.short(), "rollout slot held");
            self.holders.insert(index, cfg.node_name().to_owned());
            self.metrics.slot_lost(false);
        } else {
            tracing::info!(group = %group, lock = %lock.slot_name(None), revision = %revision.short(), "FleetLock held");
        }
        let held = TakenSlot {
            backend: lock.backend(),
            group,
            slot,
            revision: revision.clone(),
            since: util::now(),
        };
        self.holding = Some(HeldSlot::renewed(
            held,
            Arc::clone(lock),
            self.changes.clone(),
        ));
    }

    /// The lock is held and granted: the wait is over.
    pub fn granted(&mut self, cfg: &Config) {
        if let Some(since) = self.waiting_since.take() {
            self.metrics.lock_waited(since.elapsed().as_secs_f64());
        }
        self.watch_slots(cfg, None);
        self.metrics.lock_held(true);
    }

    /// Every slot is held: watch the slots, and in a large group queue on the home slot (the
    /// heartbeat says so), so that a release names this node.
    async fn wait_for_slot(&mut self, cfg: &Config, clients: Option<(&KubeClients, usize)>) {
        let Some((c, _)) = clients else { return };
        self.watch_slots(cfg, clients);
        let lock = self.lease_lock(cfg, c);
        if !lock.queue() || self.queued.is_some() {
            return;
        }
        match lock.queue_on(Some(lock.home())).await {
            Ok(()) => {
                self.queue_checked = true;
                self.queued = Some(lock);
            }
            Err(e) => {
                tracing::debug!(error = %e, "cannot queue for a slot on the heartbeat; looking for free slots instead");
            }
        }
    }

    /// Leaves the queue of a large group's slots, if this node is in it (or, the first time
    /// with slot Leases, may be: a former run of ginx may have left its mark on the
    /// heartbeat).
    pub async fn unqueue(&mut self, cfg: &Config, leases: Option<&KubeClients>) {
        let lock = match (self.queued.take(), leases) {
            (Some(lock), _) => lock,
            (None, Some(clients)) if !self.queue_checked => self.lease_lock(cfg, clients),
            (None, _) => return,
        };
        match lock.queue_on(None).await {
            Ok(()) => self.queue_checked = true,
            Err(e) => {
                tracing::debug!(error = %e, "cannot clear the slot queue mark on the heartbeat; a release may name this node in vain");
            }
        }
    }

    /// After a restart, the slot Lease the state says this node holds: taken up again
    /// (renewed from now on, saying the node is in `phase`), or found lost to another node.
    /// `Ok(Some(vanished))` when it is held (taken over from `vanished`, if it had expired
    /// and another holder took it meanwhile and vanished), `Ok(None)` when not.
    pub async fn resume(
        &mut self,
        cfg: &Config,
        clients: &KubeClients,
        held: &TakenSlot,
        phase: SlotPhase,
    ) -> Result<Option<Option<Vanished>>, SlotError> {
        let lock: Arc<dyn RolloutLock> = Arc::new(self.lease_lock(cfg, clients));
        lock.set_doing(Some(held.revision.to_string()), phase);
        match lock.acquire(Duration::ZERO).await? {
            Taken::Slot {
                slot,
                resumed,
                vanished,
            } => {
                let index = slot.unwrap_or_default();
                if resumed {
                    tracing::info!(
                        slot = index,
                        "resumed the rollout slot held before the restart"
                    );
                } else {
                    tracing::warn!(
                        slot = index,
                        "the slot held before the restart had expired; took a free one"
                    );
                }
                let held = TakenSlot {
                    slot,
                    ..held.clone()
                };
                self.holding = Some(HeldSlot::renewed(held, lock, self.changes.clone()));
                self.metrics.lock_held(true);
                self.metrics.slot_lost(false);
                Ok(Some(vanished))
            }
            Taken::Soaking { .. } | Taken::Refused(_) => Ok(None),
            Taken::Full(holders) => {
                tracing::warn!(
                    ?holders,
                    "the slot held before the restart expired and was taken; going on without it"
                );
                self.holders = holders;
                Ok(None)
            }
        }
    }

    /// After a restart, a lock the server keeps until steady-state (FleetLock): nothing to
    /// renew, held as recorded.
    pub fn resume_kept(&mut self, held: &TakenSlot) {
        self.holding = Some(HeldSlot::kept(held.clone()));
    }

    /// Releases the lock `held`; an error leaves it held (the caller tries again).
    pub async fn release(
        &mut self,
        cfg: &Config,
        held: &TakenSlot,
        clients: Option<&KubeClients>,
    ) -> Result<(), SlotError> {
        let released = match held.backend {
            // The FleetLock configuration was removed since: nothing to give back to.
            SlotBackend::Fleetlock if cfg.rollout.fleetlock.is_none() => Released::NotHeld,
            backend => {
                let lock = self.lock(cfg, backend, &held.group, clients)?;
                lock.release(held.slot).await?
            }
        };
        match released {
            Released::Yes => {
                tracing::info!(backend = %held.backend, group = %held.group, slot = ?held.slot, "rollout lock released");
            }
            Released::NotHeld if held.backend == SlotBackend::Kubernetes => {
                tracing::warn!(group = %held.group, slot = ?held.slot,
                    "the rollout slot was no longer this node's (lost while held); nothing to release");
            }
            Released::NotHeld => {}
        }
        if let Some(i) = held.slot
            && self.holders.get(&i).map(String::as_str) == Some(cfg.node_name())
        {
            self.holders.remove(&i);
        }
        if let Some(h) = self.holding.take() {
            self.metrics.slot_held(h.taken.elapsed().as_secs_f64());
        }
        self.metrics.lock_held(false);
        self.metrics.slot_lost(false);
        Ok(())
    }

    /// Fencing: whether this node may start an activation or a reboot now under the lock it
    /// holds (see [`HeldSlot::fence`]). Without a lock there is nothing to fence.
    pub async fn fence(&self) -> Result<(), SlotError> {
        match &self.holding {
            Some(h) => h.fence(&self.changes).await,
            None => Ok(()),
        }
    }

    /// What this node now does with its slot, written on the slot Lease at once (and with
    /// every renewal).
    pub async fn set_phase(&self, phase: SlotPhase) {
        let Some(h) = &self.holding else { return };
        let Some(lock) = &h.lock else { return };
        if !lock.set_doing(None, phase) || h.lost() {
            return;
        }
        if let Err(e) = h.renew_now(&self.changes).await {
            let slot = h.held.slot.unwrap_or_default();
            tracing::warn!(slot, error = %e, phase = phase.as_str(), "cannot write the slot's phase now; the next renewal writes it");
        }
    }

    /// Before a reboot: the held slot Lease's duration raised to `ttl` (and renewed at a third
    /// of it from now on), its phase `rebooting`, so that other nodes take a rebooting holder
    /// for a live one. Nothing to do for a FleetLock, which the server holds until
    /// steady-state.
    pub async fn raise_ttl(&mut self, ttl: Duration) -> Result<(), SlotError> {
        let Some(h) = &self.holding else {
            return Err(SlotError::NotHeld);
        };
        let Some(lock) = h.lock.clone().filter(|l| l.duration().is_some()) else {
            return Ok(());
        };
        if h.held.slot.is_none() {
            return Ok(());
        }
        if h.lost() {
            return Err(SlotError::Lost(lock.slot_name(h.held.slot)));
        }
        let held = h.held.clone();
        let lock = lock.with_ttl(ttl);
        lock.set_doing(Some(held.revision.to_string()), SlotPhase::Rebooting);
        let name = lock.slot_name(held.slot);
        if !lock.renew(held.slot).await? {
            return Err(SlotError::TakenByAnother(name));
        }
        let slot = held.slot.unwrap_or_default();
        self.holding = Some(HeldSlot::renewed(held, lock, self.changes.clone()));
        tracing::info!(slot, lease = %name, ttl_secs = ttl.as_secs(), "rollout slot's duration raised for the reboot");
        Ok(())
    }
}

/// What a holder says it does with the lock it takes for `purpose`.
fn phase_of(purpose: Purpose) -> SlotPhase {
    match purpose {
        Purpose::Apply => SlotPhase::Applying,
        Purpose::Reboot => SlotPhase::Rebooting,
    }
}
