//! The rollout lock on Leases: slots `ginx-rollout-<group>-<slot>` in the namespace of the
//! heartbeat Lease, labelled with their group, holder the node name.
//!
//! Taking a slot is a create, or a PUT carrying the `resourceVersion` read, of a slot that is
//! free; a 409 means another node won it, and the slots are read again. Whether another node's
//! slot expired is judged by how long this node has seen it unchanged, on its own monotonic
//! clock ([`Observed`]), never by its `renewTime`. Renewing re-reads the Lease and PUTs a new
//! `renewTime` only while the node is still its holder. Releasing clears the holder. The slots
//! are watched (list, then watch from its `resourceVersion`), so that a waiting node hears of a
//! release at once instead of polling.
//!
//! In a group of more than [`SMALL_GROUP`] slots the slots are also a queue. A node that finds
//! them all held says so on its own heartbeat Lease (labels [`WAITS_GROUP_LABEL`] and
//! [`WAITS_SLOT_LABEL`], its home slot) and watches for its own name on a slot
//! ([`next_label`]), nothing else. A holder that releases its slot lists the nodes queued on
//! that slot (or, when none, on any slot of the group), picks [`NAMED`] of them at random and
//! names them in the release ([`NEXT_ANNOTATION`], [`next_label`]): so one release wakes two
//! nodes, not every node waiting, and at most one write loses the race for it (two rather
//! than one, so that one named node slowed by a busy API server or a hiccup does not hold up
//! the hand-off). The names are advice, not the lock: a named node takes the slot with the
//! same compare-and-swap write as any take, and the others leave it to them for
//! [`slots::RESERVE`] as each sees it unchanged, then take it like any free slot (named nodes
//! that died or stopped waiting cost that much).
//!
//! A slot Lease also says what its holder is doing with it (annotations [`REVISION_ANNOTATION`]
//! and [`PHASE_ANNOTATION`]), so that a node taking over a slot whose holder vanished while
//! applying or verifying a revision knows which revision to halt.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Api;
use kube::api::ListParams;
use tokio::sync::watch;

use super::slots::{self, Choice, Observed, Slot};
use crate::config::RolloutConfig;
pub use crate::k8s::heartbeat::{WAITS_GROUP_LABEL, WAITS_SLOT_LABEL};
pub use crate::k8s::watch_objects;
use crate::k8s::{ApiError, Edit, EditError, Written, heartbeat, replace_with_retry};
use crate::k8s::{ServerClock, code, describe, post_params};
use crate::status::WaitingFor;

/// The label that marks a slot Lease and names its group.
pub const SLOT_GROUP_LABEL: &str = "ginx.io/rollout-group";
/// The revision the holder of a slot is rolling out (full commit id).
pub const REVISION_ANNOTATION: &str = "ginx.io/revision";
/// What the holder of a slot is doing: `applying`, `verifying`, `rebooting` or `done`.
pub const PHASE_ANNOTATION: &str = "ginx.io/phase";
/// The last gate pass under the slot, `<full revision> <node>`: kept after the release, so that
/// the next node of the group soaks (`rollout.soak`) from when it saw it.
pub const SLOT_PASSED_ANNOTATION: &str = "ginx.io/passed";

/// On a released slot: the waiting nodes its holder handed it to (full names, separated by
/// spaces).
pub const NEXT_ANNOTATION: &str = "ginx.io/next";
/// The prefix of the same as labels, one per node: [`next_label`].
const NEXT_LABEL_PREFIX: &str = "ginx.io/next-";
/// Queued nodes a release names.
pub const NAMED: usize = 2;
/// Queued nodes a release chooses from when none is queued on its slot.
const QUEUE_LOOK: u32 = 20;

/// The label (with an empty value) that names `node` on a released slot, what its watch
/// selects: `ginx.io/next-` and 16 hex digits of the name's FNV-1a (names can be longer than
/// a label's 63 characters). Two names with one label wake each other, nothing more: the take
/// compares the full names of the annotation.
pub fn next_label(node: &str) -> String {
    format!("{NEXT_LABEL_PREFIX}{:016x}", slots::fnv(node))
}

/// Attempts at a slot when other nodes keep winning the race.
const MAX_RACES: u32 = 5;

/// What a holder does with its slot.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SlotPhase {
    /// Taken for an activation: from the gate's baseline to the activation's end.
    #[default]
    Applying,
    /// The health gate after the activation.
    Verifying,
    /// Draining and rebooting (the Lease's duration is `reboot.lock_ttl`).
    Rebooting,
    /// The gate passed; the slot is about to be released.
    Done,
}

impl SlotPhase {
    pub fn as_str(self) -> &'static str {
        match self {
            SlotPhase::Applying => "applying",
            SlotPhase::Verifying => "verifying",
            SlotPhase::Rebooting => "rebooting",
            SlotPhase::Done => "done",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "applying" => SlotPhase::Applying,
            "verifying" => SlotPhase::Verifying,
            "rebooting" => SlotPhase::Rebooting,
            "done" => SlotPhase::Done,
            _ => return None,
        })
    }

    /// Whether a holder that vanished in this phase may have left a revision that kills nodes.
    pub fn activating(self) -> bool {
        matches!(self, SlotPhase::Applying | SlotPhase::Verifying)
    }
}

/// What the holder of a slot says it is doing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Doing {
    pub revision: Option<String>,
    pub phase: SlotPhase,
}

impl Doing {
    fn of(lease: &Lease) -> Option<Self> {
        let a = lease.metadata.annotations.as_ref()?;
        Some(Self {
            revision: a.get(REVISION_ANNOTATION).cloned(),
            phase: SlotPhase::parse(a.get(PHASE_ANNOTATION)?)?,
        })
    }
}

/// The holder of a slot this node took over because it expired (not released).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Vanished {
    pub node: String,
    /// What it said it was doing, if it said.
    pub doing: Option<Doing>,
}

/// What came of asking for a slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Acquired {
    /// Held: newly taken (from a holder that vanished, if any), or resumed.
    Slot {
        index: u32,
        resumed: bool,
        vanished: Option<Vanished>,
    },
    /// All slots held; slot → holder.
    Full(BTreeMap<u32, String>),
    /// A slot is free, but `node` passed the revision's gate less than `rollout.soak` ago (as
    /// this node saw it): nothing taken; `left` to go.
    Soaking { left: Duration, after: String },
}

/// A request about the rollout's shared objects (its slots, its fleet state) that failed:
/// unavailable or refused, which decide differently (`admission::lock_error`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LockError {
    /// The API is away (transport, timeout, 5xx): waiting mends it.
    Unavailable(String),
    /// The API refused the request (401, 403, 404, 422): a configuration error.
    Refused(String),
}

impl LockError {
    pub fn message(&self) -> &str {
        match self {
            LockError::Unavailable(m) | LockError::Refused(m) => m,
        }
    }

    /// The same failure, its message led by `what` was being done.
    pub fn context(self, what: &str) -> Self {
        match self {
            LockError::Unavailable(m) => LockError::Unavailable(format!("{what}: {m}")),
            LockError::Refused(m) => LockError::Refused(format!("{what}: {m}")),
        }
    }
}

impl std::fmt::Display for LockError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.message())
    }
}

/// Why this node may not act under the slot it holds now, or could not renew or give it back.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SlotError {
    /// Taken, then lost (another node took it, or it went unrenewed for its duration).
    #[error("the rollout slot {0} was lost; nothing starts until a slot is taken again")]
    Lost(String),
    /// Another node holds it now.
    #[error("the rollout slot {0} was taken by another node")]
    TakenByAnother(String),
    /// There is no slot to act under.
    #[error("no rollout slot is held")]
    NotHeld,
    /// Slot Leases need the API, and there is no connection to it yet.
    #[error("no connection to the Kubernetes API yet")]
    NoApi,
    /// A request about the slot failed: unavailable or refused.
    #[error("{0}")]
    Lock(LockError),
}

impl SlotError {
    /// What a node waits for while this stands: a refused request is a configuration error,
    /// told as such, never a wait for the lock that waiting would end.
    pub fn waiting_for(&self) -> WaitingFor {
        match self {
            SlotError::Lock(LockError::Refused(_)) => WaitingFor::Refused,
            _ => WaitingFor::Lock,
        }
    }
}

impl From<LockError> for SlotError {
    fn from(e: LockError) -> Self {
        SlotError::Lock(e)
    }
}

/// How a release ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Released {
    /// This node held the slot and cleared its holder.
    Yes,
    /// The slot was not this node's any more (taken over after it expired): nothing released.
    NotHeld,
}

/// One group's slots, seen from one node.
#[derive(Clone)]
pub struct LeaseLock {
    api: Api<Lease>,
    namespace: String,
    pub group: String,
    pub node: String,
    pub max: u32,
    pub duration: Duration,
    /// What this node does with its slot, written with every take and renewal.
    pub doing: Arc<Mutex<Doing>>,
    /// When this node saw each slot Lease change (shared by every lock of the process).
    seen: Arc<Mutex<Observed>>,
    /// The API server's clock: `renewTime` and `acquireTime` are written in it.
    clock: ServerClock,
    /// This node's heartbeat Lease, where it says which slot it queues on.
    heartbeat: Option<String>,
}

impl LeaseLock {
    pub fn new(
        client: kube::Client,
        namespace: &str,
        group: &str,
        node: &str,
        cfg: &RolloutConfig,
        seen: Arc<Mutex<Observed>>,
        clock: ServerClock,
    ) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_owned(),
            group: group.to_owned(),
            node: node.to_owned(),
            max: cfg.max_concurrent,
            duration: cfg.lease_duration.get(),
            doing: Arc::default(),
            seen,
            clock,
            heartbeat: None,
        }
    }

    /// Queues (in a large group) on this node's heartbeat Lease `name`.
    pub fn with_heartbeat(mut self, name: String) -> Self {
        self.heartbeat = Some(name);
        self
    }

    /// Whether this group's slots are a queue (see the module's doc).
    pub fn queue(&self) -> bool {
        queued_group(self.max)
    }

    pub fn name(&self, index: u32) -> String {
        RolloutConfig::slot_lease(&self.group, index)
    }

    fn prefix(&self) -> String {
        format!("ginx-rollout-{}-", self.group)
    }

    fn selector(&self) -> String {
        format!("{SLOT_GROUP_LABEL}={}", self.group)
    }

    fn duration_secs(&self) -> i32 {
        i32::try_from(self.duration.as_secs()).unwrap_or(i32::MAX)
    }

    /// The group's slot Leases, by index.
    pub async fn read(&self) -> Result<BTreeMap<u32, Lease>, kube::Error> {
        let list = self
            .api
            .list(&ListParams::default().labels(&self.selector()))
            .await?;
        let prefix = self.prefix();
        Ok(list
            .items
            .into_iter()
            .filter_map(|l| {
                let index = l
                    .metadata
                    .name
                    .as_deref()?
                    .strip_prefix(&prefix)?
                    .parse()
                    .ok()?;
                Some((index, l))
            })
            .collect())
    }

    /// The slots as [`slots::choose`] sees them, each aged by how long this node has seen it
    /// unchanged as of `now` (and the observations brought up to date).
    pub fn view(&self, leases: &BTreeMap<u32, Lease>, now: Instant) -> Vec<Slot> {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let names: Vec<String> = leases.keys().map(|i| self.name(*i)).collect();
        seen.retain(
            &self.prefix(),
            &names.iter().map(String::as_str).collect::<Vec<_>>(),
        );
        leases
            .iter()
            .map(|(i, l)| {
                let spec = l.spec.as_ref();
                let rv = l.metadata.resource_version.as_deref().unwrap_or("");
                if let Some(p) = l
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(SLOT_PASSED_ANNOTATION))
                {
                    seen.saw_pass(&self.name(*i), p, now);
                }
                Slot {
                    index: *i,
                    next: l
                        .metadata
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get(NEXT_ANNOTATION))
                        .map(|n| n.split_whitespace().map(str::to_owned).collect())
                        .unwrap_or_default(),
                    holder: spec.and_then(|s| s.holder_identity.clone()),
                    unchanged_for: seen.unchanged_for(&self.name(*i), rv, now),
                    duration: Duration::from_secs(
                        spec.and_then(|s| s.lease_duration_seconds)
                            .and_then(|d| u64::try_from(d).ok())
                            .unwrap_or(0),
                    ),
                }
            })
            .collect()
    }

    /// How long `revision` still soaks after its latest gate pass in this group, as this node
    /// saw it, and where it passed.
    pub fn soak_left(
        &self,
        revision: &str,
        soak: Duration,
        now: Instant,
    ) -> Option<(Duration, String)> {
        if soak.is_zero() {
            return None;
        }
        let seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let (at, node) = seen.last_pass(&self.prefix(), revision)?;
        let left = (at + soak).saturating_duration_since(now);
        (!left.is_zero()).then_some((left, node))
    }

    /// Takes a free slot, or resumes the one this node holds. With `soak`, a new slot is not
    /// taken for the revision this node is to apply (see [`Doing`]) until `soak` has passed
    /// since this node saw the latest gate pass of it in the group.
    pub async fn acquire(&self, soak: Duration) -> Result<Acquired, LockError> {
        let revision = self
            .doing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .revision
            .clone();
        let mut seen_held = BTreeMap::new();
        for _ in 0..MAX_RACES {
            let leases = self.read().await.map_err(|e| self.error("list", &e))?;
            let now = Instant::now();
            let view = self.view(&leases, now);
            seen_held = view
                .iter()
                .filter_map(|s| s.live_holder().map(|h| (s.index, h.to_owned())))
                .collect();
            let choice = slots::choose(&view, &self.node, self.max, fastrand::u32(..));
            if let (Choice::Take(_), Some(r)) = (&choice, &revision)
                && let Some((left, after)) = self.soak_left(r, soak, now)
            {
                return Ok(Acquired::Soaking { left, after });
            }
            let index = match choice {
                Choice::Full(holders) => return Ok(Acquired::Full(holders)),
                Choice::Own(i) => {
                    // Ours already: renew it at once, so that it cannot expire under us now.
                    match self.write(i, leases.get(&i).cloned(), true).await {
                        Ok(()) => {
                            return Ok(Acquired::Slot {
                                index: i,
                                resumed: true,
                                vanished: None,
                            });
                        }
                        Err(None) => continue,
                        Err(Some(e)) => return Err(e),
                    }
                }
                Choice::Take(i) => i,
            };
            let vanished = view
                .iter()
                .find(|s| s.index == index)
                .and_then(Slot::expired_holder)
                .map(|node| Vanished {
                    node: node.to_owned(),
                    doing: leases.get(&index).and_then(Doing::of),
                });
            match self.write(index, leases.get(&index).cloned(), false).await {
                Ok(()) => {
                    return Ok(Acquired::Slot {
                        index,
                        resumed: false,
                        vanished,
                    });
                }
                // Another node won that slot: look again, and try the next one.
                Err(None) => continue,
                Err(Some(e)) => return Err(e),
            }
        }
        // Other nodes won every race: the slots are busy, not the API away. Wait for the next
        // release like any node that found them full.
        tracing::debug!(group = %self.group, "lost {MAX_RACES} races for a slot in a row; waiting for the next release");
        Ok(Acquired::Full(seen_held))
    }

    /// The Lease's annotations with what this node is doing.
    fn annotate(&self, meta: &mut ObjectMeta) {
        let doing = self.doing.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(l) = meta.labels.as_mut() {
            l.retain(|k, _| !k.starts_with(NEXT_LABEL_PREFIX));
        }
        let a = meta.annotations.get_or_insert_with(BTreeMap::new);
        // Held now: handed to nobody.
        a.remove(NEXT_ANNOTATION);
        match doing.revision.clone() {
            Some(r) => a.insert(REVISION_ANNOTATION.to_owned(), r),
            None => a.remove(REVISION_ANNOTATION),
        };
        a.insert(PHASE_ANNOTATION.to_owned(), doing.phase.as_str().to_owned());
        if let (SlotPhase::Done, Some(r)) = (doing.phase, &doing.revision) {
            a.insert(
                SLOT_PASSED_ANNOTATION.to_owned(),
                format!("{r} {}", self.node),
            );
        }
    }

    /// Creates slot `index`, or PUTs it on the `resourceVersion` read. `Err(None)`: a 409.
    async fn write(
        &self,
        index: u32,
        existing: Option<Lease>,
        keep: bool,
    ) -> Result<(), Option<LockError>> {
        let now = MicroTime(self.clock.now());
        let sent = std::time::Instant::now();
        let name = self.name(index);
        let result = match existing {
            None => {
                let mut lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(name.clone()),
                        labels: Some([(SLOT_GROUP_LABEL.to_owned(), self.group.clone())].into()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(LeaseSpec {
                        holder_identity: Some(self.node.clone()),
                        lease_duration_seconds: Some(self.duration_secs()),
                        acquire_time: Some(now.clone()),
                        renew_time: Some(now),
                        lease_transitions: Some(0),
                        ..LeaseSpec::default()
                    }),
                };
                self.annotate(&mut lease.metadata);
                self.api.create(&post_params(), &lease).await
            }
            Some(mut lease) => {
                self.annotate(&mut lease.metadata);
                let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
                if !keep {
                    spec.acquire_time = Some(now.clone());
                    spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
                }
                spec.holder_identity = Some(self.node.clone());
                spec.lease_duration_seconds = Some(self.duration_secs());
                spec.renew_time = Some(now);
                self.api.replace(&name, &post_params(), &lease).await
            }
        };
        match result {
            Ok(written) => {
                self.clock
                    .learn(&written.metadata, sent, std::time::Instant::now());
                Ok(())
            }
            Err(e) if code(&e) == Some(409) => Err(None),
            Err(e) => Err(Some(self.error("write", &e))),
        }
    }

    /// Renews slot `index`; `Ok(false)` when this node is no longer its holder (it expired
    /// and another node took it).
    pub async fn renew(&self, index: u32) -> Result<bool, LockError> {
        let name = self.name(index);
        let written = replace_with_retry(&self.api, &name, &self.resource(), None, |lease| {
            let Some(mut lease) = lease.filter(|l| holder_of(l) == self.node) else {
                return Ok::<_, LockError>(Edit::Keep(false));
            };
            self.annotate(&mut lease.metadata);
            let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
            spec.lease_duration_seconds = Some(self.duration_secs());
            spec.renew_time = Some(MicroTime(self.clock.now()));
            Ok(Edit::Write(lease, true))
        })
        .await
        .map_err(|e| self.edit_error(&name, e))?;
        self.learn(&written);
        Ok(written.value)
    }

    /// Clears the holder of slot `index` if it is this node; in a queue, handing the slot to a
    /// node queued on it (see the module's doc).
    pub async fn release(&self, index: u32) -> Result<Released, LockError> {
        let name = self.name(index);
        let next = if self.queue() {
            self.next_in_queue(index).await
        } else {
            Vec::new()
        };
        let written = replace_with_retry(&self.api, &name, &self.resource(), None, |lease| {
            let Some(mut lease) = lease.filter(|l| holder_of(l) == self.node) else {
                return Ok::<_, LockError>(Edit::Keep(Released::NotHeld));
            };
            self.hand_over(&mut lease, &next);
            Ok(Edit::Write(lease, Released::Yes))
        })
        .await
        .map_err(|e| self.edit_error(&name, e))?;
        Ok(written.value)
    }

    /// A slot Lease released: no holder, nothing done with it, and (in a queue) the nodes it
    /// is handed to named on it.
    fn hand_over(&self, lease: &mut Lease, next: &[String]) {
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        spec.holder_identity = None;
        let meta = &mut lease.metadata;
        if let Some(a) = meta.annotations.as_mut() {
            a.remove(REVISION_ANNOTATION);
            a.remove(PHASE_ANNOTATION);
        }
        if next.is_empty() {
            return;
        }
        let labels = meta.labels.get_or_insert_with(BTreeMap::new);
        for n in next {
            labels.insert(next_label(n), String::new());
        }
        meta.annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(NEXT_ANNOTATION.to_owned(), next.join(" "));
        // A new value on the Lease makes the API server stamp this write's time, which
        // vap.yaml accepts only on a write with a new renewTime (it checks it against the
        // stamp).
        spec.renew_time = Some(MicroTime(self.clock.now()));
    }

    /// Up to [`NAMED`] nodes queued on slot `index` (or, when none is, on any slot of the
    /// group), at random; none when none is queued, or the list fails (the release then names
    /// nobody).
    async fn next_in_queue(&self, index: u32) -> Vec<String> {
        let on_slot = format!("{WAITS_SLOT_LABEL}={}", self.name(index));
        let in_group = format!("{WAITS_GROUP_LABEL}={}", self.group);
        for (labels, limit) in [(on_slot, None), (in_group, Some(QUEUE_LOOK))] {
            let mut lp = ListParams::default().labels(&labels);
            if let Some(l) = limit {
                lp = lp.limit(l);
            }
            let mut queued: Vec<String> = match self.api.list(&lp).await {
                Ok(list) => list
                    .items
                    .into_iter()
                    .filter_map(|l| l.spec?.holder_identity)
                    .filter(|n| *n != self.node)
                    .collect(),
                Err(e) => {
                    tracing::debug!(error = %describe(&e), "cannot list the nodes queued for a slot; releasing it to nobody");
                    return Vec::new();
                }
            };
            if !queued.is_empty() {
                fastrand::shuffle(&mut queued);
                queued.truncate(NAMED);
                return queued;
            }
        }
        Vec::new()
    }

    /// Says on this node's heartbeat Lease that it queues on slot `index` (`Some`), or no
    /// longer queues (`None`). Nothing to do without a heartbeat Lease.
    pub async fn queue_on(&self, index: Option<u32>) -> Result<(), LockError> {
        let Some(hb) = &self.heartbeat else {
            return Ok(());
        };
        let mark = index.map(|i| (self.group.as_str(), self.name(i)));
        let mark = mark.as_ref().map(|(g, s)| (*g, s.as_str()));
        heartbeat::queue_mark(&self.api, hb, &self.resource(), mark)
            .await
            .map_err(|e| match e {
                ApiError::Conflict { .. } => {
                    LockError::Unavailable(format!("heartbeat Lease {hb} kept changing under ginx"))
                }
                e => self.api_error(e),
            })
    }

    /// "leases in namespace N": what the requests about the slots are on, in messages.
    fn resource(&self) -> String {
        format!("leases in namespace {}", self.namespace)
    }

    /// A failed request about the slots, in the words the rollout's status uses.
    fn api_error(&self, e: ApiError) -> LockError {
        let what = format!("rollout lock (group {})", self.group);
        if e.is_unavailable() {
            LockError::Unavailable(format!("{what}: {}", e.detail()))
        } else {
            LockError::Refused(format!("{what}: {}", e.explained()))
        }
    }

    fn edit_error(&self, name: &str, e: EditError<LockError>) -> LockError {
        match e {
            EditError::Api(ApiError::Conflict { .. }) => {
                LockError::Unavailable(format!("slot Lease {name} kept changing under ginx"))
            }
            EditError::Api(e) => self.api_error(e),
            EditError::Edit(e) => e,
        }
    }

    /// Learns the server's clock from a write of a slot.
    fn learn<T>(&self, written: &Written<Lease, T>) {
        if let Some((lease, sent, received)) = &written.object {
            self.clock.learn(&lease.metadata, *sent, *received);
        }
    }

    fn error(&self, verb: &str, e: &kube::Error) -> LockError {
        self.api_error(ApiError::new(verb, &self.resource(), e))
    }

    /// This node's home slot: the one it queues on in a large group (see the module's doc).
    /// Spread over the slots by the node's name.
    pub fn home(&self) -> u32 {
        slots::home(&self.node, self.max)
    }

    /// Watches the slots this node waits on until `stop` fires, and bumps `changes` when one
    /// is there for it (and after every (re)list). In a group of up to [`SMALL_GROUP`] slots,
    /// every slot, woken when a holder changes (taken, released, taken over, created,
    /// deleted): a release wakes every waiter of the group, which costs a few events and keeps
    /// the hand-off to the next node immediate until the rollout's last node; renewals and
    /// phase writes wake nobody. Beyond, the slots are a queue (see the module's doc): only a
    /// slot released to this node by name wakes it, two nodes per release however many wait.
    /// A slot nobody was handed, or that the node named did not take, and a holder that
    /// stopped renewing, are found at the next look ([`RECHECK`](super::RECHECK),
    /// [`QUEUED_RECHECK`](super::QUEUED_RECHECK) while queued), judged from acquire's
    /// own fresh reads. Backs off while the API is away.
    pub async fn watch(self, changes: watch::Sender<u64>, mut stop: watch::Receiver<bool>) {
        let api = self.api.clone();
        let watching = if self.queue() {
            // Only a slot handed to this node by name (see the module doc).
            let selector = format!("{},{}", self.selector(), next_label(&self.node));
            watch_objects(api, selector, None, changes, None)
        } else {
            watch_objects(
                api,
                self.selector(),
                None,
                changes,
                Some(|l| Some(holder_of(l))),
            )
        };
        tokio::select! {
            () = watching => {}
            _ = stop.changed() => {}
        }
    }
}

/// Groups of up to this many slots are watched whole by a waiting node, and the nodes woken
/// by a release race for it (a few at most); larger ones are a queue (see the module's doc).
/// Measured (docs/src/figures.md, "Fleet scale"): with 3 slots and 30 nodes, watching only a home
/// slot left the rollout's last releases unheard until the 5 s re-look (hand-off p99 3.1 s);
/// with 50 slots and 1,000 nodes, the race cost about 28 refused writes per hand-off.
pub const SMALL_GROUP: u32 = 4;

/// Whether a group of `max` slots is a queue (`true`) or watched whole by its waiters.
pub fn queued_group(max: u32) -> bool {
    max > SMALL_GROUP
}

/// What of a slot Lease wakes a waiting node when it changes: its holder.
pub fn holder_of(lease: &Lease) -> String {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.clone())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_slot_request_is_told_as_a_refusal_not_a_wait_for_the_lock() {
        let refused = SlotError::Lock(LockError::Refused("403 forbidden".into()));
        assert_eq!(refused.waiting_for(), WaitingFor::Refused);
        let away = SlotError::Lock(LockError::Unavailable("connection refused".into()));
        assert_eq!(away.waiting_for(), WaitingFor::Lock);
        assert_eq!(SlotError::Lost("s".into()).waiting_for(), WaitingFor::Lock);
    }

    #[test]
    fn a_node_is_named_on_a_slot_by_a_label_of_its_own_that_any_name_fits_in() {
        let long = "n".repeat(253);
        for node in ["lucy", "worker-0001", long.as_str()] {
            let label = next_label(node);
            let (prefix, name) = label.split_once('/').unwrap();
            assert_eq!(prefix, "ginx.io");
            // A label's name part: at most 63 characters, alphanumerics and '-'.
            assert!(name.len() <= 63, "{label}");
            assert!(name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'));
            assert!(label.starts_with(NEXT_LABEL_PREFIX));
        }
        assert_eq!(next_label("lucy"), next_label("lucy"));
        assert_ne!(next_label("lucy"), next_label("makise"));
    }

    #[test]
    fn small_groups_are_watched_whole_and_large_ones_are_a_queue() {
        for max in 1..=SMALL_GROUP {
            assert!(!queued_group(max), "{max}");
        }
        assert!(queued_group(SMALL_GROUP + 1));
        assert!(queued_group(50));
    }
}
