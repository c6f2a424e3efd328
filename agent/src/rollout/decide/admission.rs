//! Admission: may this node start applying (or rebooting) now? A pure function of what the
//! orchestrator (`keeper.rs`) has learned so far, the configuration and the clock. It answers
//! with a [`Verdict`], or names the one thing it must learn (or do) first: [`Next`]. No I/O,
//! no clock of its own, no logging: the caller passes `now`, does what is asked, records the
//! answer in [`Facts`] and asks again.
//!
//! The questions come in a fixed order, cheapest and most general first, and each is asked
//! only when every earlier one let the node through: the backend, the fleet state (pause,
//! an operator's hold on this node, halts, a vanished holder), the maintenance windows, the control plane's quorum, etcd, a halt
//! this node owes the fleet, the slot already held, the groups of `rollout.after`, and only
//! then a take of the lock. So a paused fleet costs one read, not a quorum check and a list.
//!
//! Owns the wording of every wait it answers with. Does not own the lock's outcome beyond
//! its message ([`soaking`], [`busy`]), nor anything the reconciler waits for itself
//! (`suspended`, `pods`, `reboot`).

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;

use super::window::{self, WindowState};
use crate::config::{Freeze, OnApiUnavailable, Window};
use crate::rollout::fleet::state::FleetState;
use crate::rollout::lock::lease::LockError;
use crate::state::{SlotBackend, TakenSlot};
use crate::status::WaitingFor;
use crate::types::{HaltCause, Revision};

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
    /// The lock a slot is taken from, when this backend takes one.
    pub fn slot_backend(self) -> Option<SlotBackend> {
        match self {
            Effective::None | Effective::Bootstrap => None,
            Effective::Kubernetes => Some(SlotBackend::Kubernetes),
            Effective::Fleetlock => Some(SlotBackend::Fleetlock),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Effective::None | Effective::Bootstrap => "none",
            Effective::Kubernetes => "kubernetes",
            Effective::Fleetlock => "fleetlock",
        }
    }
}

/// The lock this process holds, as admission needs to know it.
#[derive(Clone, Copy, Debug)]
pub enum OwnSlot<'a> {
    None,
    /// Held and renewed.
    Live(&'a TakenSlot),
    /// Taken, then lost (another node took it, or it went unrenewed for its duration).
    Lost,
}

/// The question, and what does not change while it is answered.
#[derive(Clone, Debug)]
pub struct Ask<'a> {
    pub revision: &'a Revision,
    pub purpose: Purpose,
    pub backend: Effective,
    /// The cluster's kubeconfig exists: the fleet state is read before anything else.
    pub cluster: bool,
    /// The API clients are built.
    pub connected: bool,
    /// The state file says this node holds a lock (taken before a restart): it is resumed,
    /// never a second one taken.
    pub held_in_state: bool,
    pub own_slot: OwnSlot<'a>,
    /// This node's name (a hold names it) and rollout group.
    pub node: &'a str,
    pub group: &'a str,
    /// A control-plane node with `rollout.quorum_guard` on.
    pub quorum_guard: bool,
    /// A control-plane node with a stacked etcd member and `etcd.guard` on.
    pub etcd_guard: bool,
    /// `[rollout.gate.prometheus]` is set: firing alerts hold the node before its slot.
    pub alerts: bool,
    /// `rollout.after` names groups not yet seen to have passed this revision.
    pub after_pending: bool,
    /// Canaries (`rollout.first`) are configured and not yet seen to have passed this revision.
    pub canary_pending: bool,
    /// `rollout.order` is set.
    pub ordered: bool,
    /// `[[rollout.freezes]]`: nothing new starts inside one, an apply or a reboot.
    pub freezes: &'a [Freeze],
    /// The windows that gate this purpose, and the key they come from (for the message).
    pub windows: &'a [Window],
    pub windows_key: &'static str,
    pub on_api_unavailable: OnApiUnavailable,
}

/// What the orchestrator learned (or did) so far for one ask.
#[derive(Clone, Debug, Default)]
pub struct Facts<'a> {
    /// The fleet state was read for this ask.
    pub fleet_read: bool,
    /// The fleet state as last read (this ask's read, or an older one outside a cluster).
    pub fleet: Option<&'a FleetState>,
    /// The quorum guard's answer.
    pub quorum: Option<Answer>,
    /// The etcd guard's answer (after the hand-over of the leadership, if this node's member
    /// led).
    pub etcd: Option<Answer>,
    /// The alert gate's answer: `Go` when nothing fires (or Prometheus is ignored).
    pub alerts: Option<Answer>,
    pub owed_halt: Owed,
    /// The `rollout.after` groups' answer: `Go` when all passed.
    pub after: Option<Answer>,
    /// The canaries' answer: `Go` when this node may start the revision.
    pub canaries: Option<Answer>,
    /// The walk's answer (`rollout.order`): `Go` when it is this node's turn.
    pub order: Option<Answer>,
}

/// A guard's answer, as admission records it: the four outcomes a guard can have, kept apart
/// so that a refusal can never be taken for an API that is away.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// It lets the node on.
    Go,
    /// It holds the node back, and why.
    Wait(String),
    /// It could not be asked: the API (or the watch it reads) is away. Waiting mends it, and
    /// `rollout.on_api_unavailable` may go past it.
    Unavailable(String),
    /// The API refused what it needs (RBAC, a policy): the node waits, whatever
    /// `on_api_unavailable` says.
    Refused(String),
}

impl From<Option<String>> for Answer {
    /// A guard's reason to wait, or none.
    fn from(why: Option<String>) -> Self {
        why.map_or(Answer::Go, Answer::Wait)
    }
}

impl From<LockError> for Answer {
    fn from(e: LockError) -> Self {
        match e {
            LockError::Unavailable(m) => Answer::Unavailable(m),
            LockError::Refused(m) => Answer::Refused(m),
        }
    }
}

/// A `holder-vanished` halt this node owes the fleet (see `keeper.rs`'s take-over).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Owed {
    #[default]
    None,
    /// Not written yet: written before anything else is done.
    Pending,
    /// Written during this ask; `halts_this`: the fleet now halts the revision asked for.
    Written { halts_this: bool },
}

/// What the orchestrator does next.
#[derive(Debug, PartialEq)]
pub enum Next {
    Answer(Verdict),
    /// Read the fleet state (`ginx-rollout` ConfigMap).
    ReadFleet,
    /// Ask the quorum guard about the other control-plane nodes.
    CheckQuorum,
    /// Ask etcd whether every member is fit and the quorum survives this node, and hand the
    /// leadership over if this node's member leads.
    CheckEtcd,
    /// Ask Prometheus whether alerts fire (`[rollout.gate.prometheus]`).
    CheckAlerts,
    /// Write the halt this node owes.
    WriteOwedHalt,
    /// Read whether every node of the `rollout.after` groups passed the revision.
    CheckAfter,
    /// Read whether this group's canaries passed the revision (and the soak after them).
    CheckCanaries,
    /// Read whether it is this node's turn in `rollout.order`.
    CheckOrder,
    /// Take (or resume) the lock.
    Take,
}

/// The answer to "may I?".
#[derive(Debug, PartialEq)]
pub enum Verdict {
    /// Go ahead, with the lock held (to be recorded in the state) or with none.
    Go(Option<TakenSlot>),
    /// Go ahead without the lock although the cluster exists: its API is unavailable and
    /// `rollout.on_api_unavailable = "proceed"` (the caller says so in the journal).
    GoWithoutApi(String),
    Wait(Wait),
}

/// A wait: for what, why (a sentence for `ginxctl status`), and when it ends by itself if
/// nothing else changes (a window opening).
#[derive(Clone, Debug, PartialEq)]
pub struct Wait {
    pub waiting_for: WaitingFor,
    pub reason: String,
    pub until: Option<Timestamp>,
}

impl Verdict {
    fn wait(waiting_for: WaitingFor, reason: String) -> Self {
        Verdict::Wait(Wait {
            waiting_for,
            reason,
            until: None,
        })
    }
}

/// The next step of an ask, given what is known at `now`.
pub fn next(ask: &Ask<'_>, facts: &Facts<'_>, now: Timestamp) -> Next {
    let resuming = ask.held_in_state || !matches!(ask.own_slot, OwnSlot::None);
    match ask.backend {
        Effective::Bootstrap => {
            return Next::Answer(calendar_wait(ask, resuming, now).unwrap_or(Verdict::Go(None)));
        }
        // No lock to take, but etcd is this node's own business: asked all the same.
        Effective::None => {
            if let Some(wait) = calendar_wait(ask, resuming, now) {
                return Next::Answer(wait);
            }
            return etcd_first(ask, facts, resuming)
                .or_else(|| alerts_first(ask, facts, resuming))
                .unwrap_or(Next::Answer(Verdict::Go(None)));
        }
        Effective::Kubernetes | Effective::Fleetlock => {}
    }
    if let Some(step) = fleet_first(ask, facts, resuming) {
        return step;
    }
    let resuming_own = ask.held_in_state || matches!(ask.own_slot, OwnSlot::Live(_));
    let whom = Whom {
        node: ask.node,
        group: ask.group,
        resuming_own,
    };
    if let Some(wait) = facts
        .fleet
        .and_then(|state| held_back(state, ask.revision, ask.purpose, &whom, now))
    {
        return Next::Answer(wait);
    }
    if let Some(wait) = calendar_wait(ask, resuming, now) {
        return Next::Answer(wait);
    }
    // A reboot passes the quorum guard even with the slot kept since its apply.
    let resuming_apply = ask.purpose == Purpose::Apply && resuming;
    let quorum = !resuming_apply && ask.quorum_guard && ask.connected;
    let quorum = guard(
        ask,
        quorum,
        &facts.quorum,
        Next::CheckQuorum,
        WaitingFor::Quorum,
    );
    if let Some(step) = quorum
        .map(|step| etcd_before_going_without_api(step, ask, facts, resuming))
        .or_else(|| etcd_first(ask, facts, resuming))
        .or_else(|| alerts_first(ask, facts, resuming))
        .or_else(|| owed_halt(ask, facts))
    {
        return step;
    }
    if let OwnSlot::Live(held) = ask.own_slot {
        return Next::Answer(Verdict::Go(Some(held.clone())));
    }
    starting_guards(ask, facts)
}

/// The fleet state is read first on a node of a cluster; without a connection to read it, the
/// API policy decides (after etcd's look).
fn fleet_first(ask: &Ask<'_>, facts: &Facts<'_>, resuming: bool) -> Option<Next> {
    if !ask.cluster || facts.fleet_read {
        return None;
    }
    if !ask.connected {
        let why = "no connection to the Kubernetes API yet".to_owned();
        let verdict = Next::Answer(unavailable(ask.on_api_unavailable, why));
        return Some(etcd_before_going_without_api(verdict, ask, facts, resuming));
    }
    Some(Next::ReadFleet)
}

/// Order across groups, then within the group: nothing of this group starts a revision before
/// every node of the groups it comes after passed its gate on it, nor before its canaries did,
/// nor before the nodes ahead of it in the order did; then the take.
fn starting_guards(ask: &Ask<'_>, facts: &Facts<'_>) -> Next {
    let starting = ask.purpose == Purpose::Apply && !ask.held_in_state && ask.connected;
    let after = starting && ask.after_pending;
    let canaries = starting && ask.canary_pending;
    let order = starting && ask.ordered;
    guard(
        ask,
        after,
        &facts.after,
        Next::CheckAfter,
        WaitingFor::After,
    )
    .or_else(|| {
        guard(
            ask,
            canaries,
            &facts.canaries,
            Next::CheckCanaries,
            WaitingFor::Canary,
        )
    })
    .or_else(|| {
        guard(
            ask,
            order,
            &facts.order,
            Next::CheckOrder,
            WaitingFor::Order,
        )
    })
    .unwrap_or(Next::Take)
}

/// A guard that is asked once per ask: when it applies (`on`), ask it (`step`) until its
/// answer is in `fact`; then wait with `waiting_for` while it names a reason, answer as
/// `rollout.on_api_unavailable` says when it could not be asked, and wait when the API
/// refused it; `None` lets the node on.
fn guard(
    ask: &Ask<'_>,
    on: bool,
    fact: &Option<Answer>,
    step: Next,
    waiting_for: WaitingFor,
) -> Option<Next> {
    let verdict = match fact {
        _ if !on => return None,
        None => return Some(step),
        Some(Answer::Go) => return None,
        Some(Answer::Wait(why)) => Verdict::wait(waiting_for, why.clone()),
        Some(Answer::Unavailable(why)) => unavailable(ask.on_api_unavailable, why.clone()),
        Some(Answer::Refused(why)) => refused(why.clone()),
    };
    Some(Next::Answer(verdict))
}

/// Going on without the API is never going on without etcd's look: a step that would is
/// preceded by it while etcd has not answered.
fn etcd_before_going_without_api(
    step: Next,
    ask: &Ask<'_>,
    facts: &Facts<'_>,
    resuming: bool,
) -> Next {
    match step {
        Next::Answer(Verdict::GoWithoutApi(_)) => etcd_first(ask, facts, resuming).unwrap_or(step),
        other => other,
    }
}

/// The halt a slot taken from a vanished holder owes the fleet: write it first, and an apply
/// of the revision it halts waits.
fn owed_halt(ask: &Ask<'_>, facts: &Facts<'_>) -> Option<Next> {
    match facts.owed_halt {
        Owed::Pending => Some(Next::WriteOwedHalt),
        Owed::Written { halts_this: true } if ask.purpose == Purpose::Apply => {
            Some(Next::Answer(Verdict::wait(
                WaitingFor::Halted,
                format!(
                    "revision {} is halted: its slot's holder vanished while rolling it out",
                    ask.revision.short()
                ),
            )))
        }
        Owed::Written { .. } | Owed::None => None,
    }
}

/// What etcd's guard has to say before the node goes on: ask it, or wait for it; `None` when
/// it let the node through or does not apply. etcd is asked on the node itself, with or
/// without the Kubernetes API or a lock: a member that cannot be asked holds the node,
/// whatever `on_api_unavailable` says. An apply that holds its slot already was asked.
fn etcd_first(ask: &Ask<'_>, facts: &Facts<'_>, resuming: bool) -> Option<Next> {
    if !ask.etcd_guard || ask.purpose == Purpose::Apply && resuming {
        return None;
    }
    guard(ask, true, &facts.etcd, Next::CheckEtcd, WaitingFor::Etcd)
}

/// What the alert gate has to say before the node goes on: ask Prometheus, or wait for the
/// alerts it named; `None` when nothing fires or it does not apply. An apply that holds its
/// slot already was asked; a reboot is asked even with the slot kept.
fn alerts_first(ask: &Ask<'_>, facts: &Facts<'_>, resuming: bool) -> Option<Next> {
    if !ask.alerts || ask.purpose == Purpose::Apply && resuming {
        return None;
    }
    guard(
        ask,
        true,
        &facts.alerts,
        Next::CheckAlerts,
        WaitingFor::Alerts,
    )
}

/// What the calendar says: a freeze holding, else outside every window.
fn calendar_wait(ask: &Ask<'_>, resuming: bool, now: Timestamp) -> Option<Verdict> {
    frozen_wait(ask, resuming, now).or_else(|| outside_window(ask, resuming, now))
}

/// Inside a change freeze, the wait until it (and any freeze it touches) ends; `None` outside
/// every freeze, or when the node already holds its lock for an apply (it finishes what it
/// started). A reboot that is due waits too.
fn frozen_wait(ask: &Ask<'_>, resuming: bool, now: Timestamp) -> Option<Verdict> {
    if ask.purpose == Purpose::Apply && resuming {
        return None;
    }
    let f = super::freeze::frozen(ask.freezes, now)?;
    Some(Verdict::Wait(Wait {
        waiting_for: WaitingFor::Freeze,
        reason: format!(
            "inside the change freeze rollout.freezes[{}] ({:?}) until {}; nothing new starts, \
             a due reboot neither",
            f.index, f.reason, f.ends_at
        ),
        until: Some(f.ends_at),
    }))
}

/// Outside every window, the wait (and when the next opens); `None` inside one, or when the
/// node already holds its lock for an apply (a window gates the start of an apply only; a
/// reboot's always).
fn outside_window(ask: &Ask<'_>, resuming: bool, now: Timestamp) -> Option<Verdict> {
    if ask.purpose == Purpose::Apply && resuming {
        return None;
    }
    let WindowState::Closed { opens_at } = window::state(ask.windows, now) else {
        return None;
    };
    let key = ask.windows_key;
    Some(Verdict::Wait(Wait {
        waiting_for: WaitingFor::Window,
        reason: match opens_at {
            Some(t) => format!("outside the maintenance windows ({key}); the next opens at {t}"),
            None => format!(
                "outside the maintenance windows ({key}), and none opens again: every date they \
                 name is past"
            ),
        },
        until: opens_at,
    }))
}

/// The API is needed but not there: wait, or go on without a lock, as
/// `rollout.on_api_unavailable` says.
pub fn unavailable(policy: OnApiUnavailable, why: String) -> Verdict {
    match policy {
        OnApiUnavailable::Wait => Verdict::wait(
            WaitingFor::Api,
            format!(
                "{why}; nothing is applied until the API answers (rollout.on_api_unavailable = \"wait\")"
            ),
        ),
        OnApiUnavailable::Proceed => Verdict::GoWithoutApi(why),
    }
}

/// The API refused a request: a configuration error, never a reason to go on without the
/// lock, whatever `on_api_unavailable` says.
pub fn refused(why: String) -> Verdict {
    Verdict::wait(
        WaitingFor::Refused,
        format!("{why}; nothing is applied until this is fixed"),
    )
}

/// A failed request about the lock: unavailable (the API policy decides) or refused.
pub fn lock_error(policy: OnApiUnavailable, e: LockError) -> Verdict {
    match e {
        LockError::Unavailable(m) => unavailable(policy, m),
        LockError::Refused(m) => refused(m),
    }
}

/// The node the fleet state is read for.
#[derive(Clone, Copy, Debug)]
pub struct Whom<'a> {
    pub node: &'a str,
    pub group: &'a str,
    /// It resumes a slot it holds: what it started, it finishes.
    pub resuming_own: bool,
}

/// What in the fleet state holds this node back from taking (or keeping) a slot for
/// `revision` at `now`: a pause, an operator's hold on it (unless it resumes its own slot), a
/// halt of the revision (for an apply), or a holder of its group that vanished mid-rollout
/// (unless it resumes its own slot).
pub fn held_back(
    state: &FleetState,
    revision: &Revision,
    purpose: Purpose,
    whom: &Whom<'_>,
    now: Timestamp,
) -> Option<Verdict> {
    if let Some(p) = &state.paused {
        return Some(Verdict::wait(
            WaitingFor::Paused,
            format!(
                "the fleet is paused by {} since {}; `ginxctl rollout resume` lifts it",
                p.by, p.at
            ),
        ));
    }
    if let Some(h) = state.hold_of(whom.node, now).filter(|_| !whom.resuming_own) {
        return Some(Verdict::Wait(Wait {
            waiting_for: WaitingFor::Held,
            reason: format!(
                "held {}: nothing new starts here; `ginxctl release {}` lifts it",
                h.describe(),
                whom.node
            ),
            until: h.until,
        }));
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
        return Some(Verdict::wait(
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
    if whom.resuming_own {
        return None;
    }
    let h = state.vanished_in(whom.group)?;
    Some(Verdict::wait(
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

/// The wait while a node of the group passed its gate on `revision` less than `soak` ago.
pub fn soaking(revision: &Revision, after: &str, soak: &str, left: Duration) -> Verdict {
    Verdict::wait(
        WaitingFor::Soak,
        format!(
            "{after} passed its gate on {} less than rollout.soak ({soak}) ago; {}s to go",
            revision.short(),
            left.as_secs_f64().ceil()
        ),
    )
}

/// The wait while other nodes hold the group's slots (`holders`, as last read).
pub fn busy(group: &str, max: u32, holders: &BTreeMap<u32, String>) -> Verdict {
    let list: Vec<String> = holders
        .iter()
        .map(|(i, h)| format!("slot {i} by {h}"))
        .collect();
    let held = holders.len();
    let what = if held < max as usize {
        format!(
            "other nodes won every race for the free slots of group {group} \
             ({held} of {max} held as last read)"
        )
    } else {
        format!("all {max} slot(s) of group {group} are held")
    };
    Verdict::wait(WaitingFor::Lock, format!("{what}: {}", list.join(", ")))
}

/// The wait while the lock server refused this node the lock, or the lock cannot be asked
/// for at all (`why` says which).
pub fn refused_lock(why: String) -> Verdict {
    Verdict::wait(WaitingFor::Lock, why)
}

#[cfg(test)]
#[path = "admission_tests.rs"]
mod tests;
