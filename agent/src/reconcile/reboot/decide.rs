//! The reboot's decisions, without I/O and with the clock passed in: whether a reboot is due and
//! whether this turn of the loop is the reboot's, how long the drain may take and when a reboot
//! put off is tried again, when the reboot command runs again, which pods are due to be asked to
//! go again, and the words status shows meanwhile. The steps that act on them are in `mod.rs`
//! and `draining.rs`; the Kubernetes calls in `drain.rs`.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use jiff::Timestamp;

use super::super::core::Decision;
use super::{COMMAND_AGAIN, EVICT_AGAIN, REBOOT_AGAIN};
use crate::config::{RebootMode, RollbackPolicy, Window};
use crate::rollout::decide::window::{self, WindowState};
use crate::state::{AfterGate, RebootPhase, Rebooting, State, Verifying};
use crate::types::{Disruption, Plan, Revision};
use crate::util;

/// Whether the sentinel file, modified at `modified`, asks for a reboot: it does unless the last
/// reboot ginx carried out (done at `rebooted_at`) came after it, which was then for it.
pub(super) fn sentinel_fresh(modified: Option<Timestamp>, rebooted_at: Option<Timestamp>) -> bool {
    let Some(done) = rebooted_at else {
        return true;
    };
    modified.is_none_or(|t| t > done)
}

/// Whether a new reboot may begin at `now` (not whether the lock allows it): the mode, no
/// reboot under way, no suspend, no failed gate waiting for a person, not put off; and
/// `required` (called last: it reads the sentinel file).
pub(super) fn may_begin(
    mode: RebootMode,
    st: &State,
    now: Timestamp,
    required: impl FnOnce() -> bool,
) -> bool {
    mode == RebootMode::WhenRequired
        && st.phase.rebooting().is_none()
        && !st.suspended
        && st
            .gate_failure
            .as_ref()
            .is_none_or(|g| g.next == AfterGate::RolledBack)
        && st.reboot_deferred.as_ref().is_none_or(|d| now >= d.until)
        && required()
}

/// Whether this turn of the loop works on the reboot, given the apply's decision: a reboot
/// under way goes first (the node is cordoned); a new one begins when nothing is to be applied,
/// or what is wanted is halted. `may_begin` and `halted` are called only when they matter.
pub(super) fn turn(
    decision: &Decision,
    st: &State,
    may_begin: impl FnOnce() -> bool,
    halted: impl FnOnce(&Revision) -> bool,
) -> bool {
    if matches!(
        decision,
        Decision::Busy | Decision::Verify | Decision::RollBack
    ) {
        return false;
    }
    if let Some(r) = st.phase.rebooting() {
        return match r.phase {
            RebootPhase::Draining | RebootPhase::Rebooting | RebootPhase::Finishing => true,
            // The gate is the loop's (Decision::Verify); with none open and no rollback
            // coming (one that could not start), what comes next is decided here.
            RebootPhase::Verifying => st.phase.gate().is_none(),
            RebootPhase::Kept => st.gate_failure.is_none(),
        };
    }
    if !may_begin() {
        return false;
    }
    match decision {
        Decision::Idle | Decision::RetryAt(_) => true,
        Decision::Start(d) => halted(&d.revision),
        _ => false,
    }
}

/// Whether the slot held after an apply is kept for the reboot that follows it: one is under
/// way, or one may begin and its window is open now.
pub(super) fn keeps_slot(rebooting: bool, may_begin: bool, window: &WindowState) -> bool {
    rebooting || (may_begin && !matches!(window, WindowState::Closed { .. }))
}

/// When a reboot's drain began (persisted): the cordon, or else the reboot's start.
pub(super) fn drain_started(r: &Rebooting) -> Timestamp {
    r.drain_started_at.unwrap_or(r.started_at)
}

/// A deadline on this process's monotonic clock for a span that began at `started` (its
/// persisted start, which tells one span from the next): a drain, or the wait of a drained
/// node that the last look before the disruption holds back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::reconcile) struct DrainClock {
    started: Timestamp,
    deadline: Instant,
}

impl DrainClock {
    /// The drain that began at `started`: the deadline `kept` while it is that drain's; else
    /// `timeout` from `now` less the time the persisted start says has passed (on the wall
    /// clock, once, when this process first looks at the drain: after a restart; clamped to
    /// 0 … `timeout`). A later step of the wall clock moves no deadline.
    pub fn of(
        kept: Option<DrainClock>,
        started: Timestamp,
        timeout: Duration,
        wall: Timestamp,
        now: Instant,
    ) -> Self {
        if let Some(k) = kept.filter(|k| k.started == started) {
            return k;
        }
        let passed = wall
            .duration_since(started)
            .try_into()
            .unwrap_or(Duration::ZERO)
            .min(timeout);
        Self {
            started,
            deadline: now.checked_add(timeout - passed).unwrap_or(now),
        }
    }

    /// Whether the drain has run past its timeout at `now`.
    pub fn overdue(&self, now: Instant) -> bool {
        now >= self.deadline
    }

    /// The persisted start this deadline runs from.
    pub fn started(&self) -> Timestamp {
        self.started
    }
}

/// What in `plan` calls for a drain before the activation, when its action is `drain`; `None`
/// when it does not call for one (activated live, or a reboot, which drains as ever) or when
/// there is no plan (not built first: `apply.prebuild` off).
pub(in crate::reconcile) fn drain_wanted(plan: Option<&Plan>) -> Option<Vec<String>> {
    let p = plan?;
    (p.action == Disruption::Drain).then(|| p.because.clone())
}

/// Whether the drain before an activation is over and the node can be uncordoned: the
/// activation ran, no attempt runs, no gate is open, no reboot is under way (it keeps its own
/// cordon), and no failed gate of that revision still holds the node (a rollback to come, an
/// unhealthy rollback, a manual one).
pub(in crate::reconcile) fn apply_drain_over(st: &State) -> bool {
    let Some(d) = st.phase.live_drain() else {
        return false;
    };
    let held = st.gate_failure.as_ref().is_some_and(|g| {
        g.revision == d.revision
            && matches!(
                g.next,
                AfterGate::RollBack | AfterGate::RollbackUnhealthy | AfterGate::Manual
            )
    });
    d.activated
        && st.phase.attempt().is_none()
        && st.phase.gate().is_none()
        && st.phase.rebooting().is_none()
        && !held
}

/// When a given-up drain is tried again: when the next window opens after the current one
/// (with windows), else after the drain timeout once more.
pub(super) fn next_try(windows: &[Window], drain_timeout: Duration, now: Timestamp) -> Timestamp {
    match window::state(windows, now) {
        WindowState::Open { closes_at } => match window::state(windows, closes_at) {
            WindowState::Closed {
                opens_at: Some(t), ..
            } => t,
            _ => util::after(now, drain_timeout),
        },
        WindowState::Closed {
            opens_at: Some(t), ..
        } => t,
        _ => util::after(now, drain_timeout),
    }
}

/// How long to wait before running a reboot command that failed `since_failure` ago again;
/// `None`: now (or it did not fail).
pub(super) fn command_retry_wait(since_failure: Option<Duration>) -> Option<Duration> {
    since_failure
        .filter(|e| *e < COMMAND_AGAIN)
        .map(|e| COMMAND_AGAIN - e)
}

/// Still in the boot the reboot command was run in: how long to wait before running it again,
/// or `None` to run it now. `since_command` is what this process measured, `since_recorded`
/// the persisted time's age (after a restart); a failed command is run again on its own pace.
pub(super) fn rerun_wait(
    since_command: Option<Duration>,
    since_recorded: Option<Duration>,
    since_failure: Option<Duration>,
) -> Option<Duration> {
    let since = since_command.or(since_recorded).unwrap_or(REBOOT_AGAIN);
    if since < REBOOT_AGAIN && since_failure.is_none() {
        return Some(REBOOT_AGAIN - since);
    }
    command_retry_wait(since_failure)
}

/// Whether a pod last asked to go at `tried` is asked again at `now`.
pub(super) fn evict_due(tried: Option<Instant>, now: Instant) -> bool {
    tried.is_none_or(|t| now.saturating_duration_since(t) >= EVICT_AGAIN)
}

/// Why an eviction was refused, with the PodDisruptionBudgets that hold it when known.
pub(super) fn refusal(msg: &str, budgets: &[String]) -> String {
    if budgets.is_empty() {
        format!("eviction refused (429): {msg}")
    } else {
        format!(
            "eviction refused (429) by PodDisruptionBudget {}: {msg}",
            budgets.join(", ")
        )
    }
}

/// The refused pods and why, on one line.
pub(super) fn refused_list(refused: &BTreeMap<String, String>) -> String {
    refused
        .iter()
        .map(|(p, why)| format!("{p}: {why}"))
        .collect::<Vec<_>>()
        .join("; ")
}

/// What a drain under way waits for, for status.
pub(super) fn drain_waiting(evicting: &[String], refused: &BTreeMap<String, String>) -> String {
    if refused.is_empty() {
        format!("draining: waiting for {}", evicting.join(", "))
    } else {
        format!("draining: {}", refused_list(refused))
    }
}

/// Why a drain was given up after `timeout` (as configured), with what held it.
pub(super) fn given_up(
    timeout: &str,
    evicting: &[String],
    refused: &BTreeMap<String, String>,
) -> String {
    let held = if refused.is_empty() {
        format!("pods still going: {}", evicting.join(", "))
    } else {
        refused_list(refused)
    };
    format!(
        "drain given up after {timeout} (reboot.drain_timeout): {held}; the node is uncordoned \
         and the slot released"
    )
}

/// Why an attempt is given up when the last look held the drained node past `timeout`
/// (`reboot.guard_timeout`): the guard's own reason, and what was done.
pub(in crate::reconcile) fn guards_gave_up(timeout: &str, why: &str) -> String {
    format!(
        "the guards did not let the drained node go down within {timeout} \
         (reboot.guard_timeout): {why}; the node is uncordoned and the slot released"
    )
}

/// The rollback policy for the open gate: a gate after a reboot that followed no activation
/// (only the sentinel asked for it) has nothing to roll back to; it is held for a person.
pub(super) fn gate_policy(
    verifying: Option<&Verifying>,
    rebooting: Option<&Rebooting>,
    policy: RollbackPolicy,
) -> RollbackPolicy {
    match verifying {
        Some(v) if v.after_reboot && !v.rollback => {
            let followed_activation =
                rebooting.is_some_and(|r| r.reasons.iter().any(|x| !x.ends_with(" exists")));
            if followed_activation {
                policy
            } else {
                RollbackPolicy::Manual
            }
        }
        _ => policy,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reconcile::core::Desired;
    use crate::state::{GateFailure, RebootDeferred};
    use crate::types::Goal;

    fn t(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    fn rev(c: char) -> Revision {
        c.to_string().repeat(40).parse().unwrap()
    }

    fn rebooting(phase: RebootPhase, reasons: &[&str]) -> Rebooting {
        Rebooting {
            phase,
            started_at: t(0),
            reasons: reasons.iter().map(|r| (*r).to_owned()).collect(),
            cordoned: false,
            drain_started_at: None,
            drained_at: None,
            boot_id: None,
            reboot_at: None,
            rollback: false,
            baseline: BTreeMap::new(),
        }
    }

    fn gate_failure(next: AfterGate) -> GateFailure {
        GateFailure {
            revision: rev('a'),
            failing: BTreeMap::new(),
            at: t(0),
            next,
            halted: false,
            quarantined: false,
            baseline: BTreeMap::new(),
            after_reboot: false,
        }
    }

    fn verifying(after_reboot: bool, rollback: bool) -> Verifying {
        Verifying {
            revision: rev('a'),
            rollback,
            started_at: t(0),
            deadline: t(100),
            healthy_since: None,
            baseline: BTreeMap::new(),
            after_reboot,
        }
    }

    #[test]
    fn a_sentinel_older_than_the_last_reboot_was_rebooted_for() {
        assert!(sentinel_fresh(Some(t(5)), None));
        assert!(sentinel_fresh(Some(t(5)), Some(t(4))));
        assert!(!sentinel_fresh(Some(t(5)), Some(t(5))));
        assert!(sentinel_fresh(None, Some(t(5))), "no time: taken as new");
    }

    #[test]
    fn a_reboot_may_begin_only_when_nothing_holds_it_back() {
        let st = State::default();
        let yes = || true;
        assert!(may_begin(RebootMode::WhenRequired, &st, t(0), yes));
        assert!(
            !may_begin(RebootMode::WhenRequired, &st, t(0), || false),
            "not required"
        );
        assert!(!may_begin(RebootMode::Never, &st, t(0), yes));
        let mut s = st.clone();
        s.suspended = true;
        assert!(!may_begin(RebootMode::WhenRequired, &s, t(0), yes));
        let mut s = st.clone();
        s.phase.disrupting =
            crate::state::Disrupting::Reboot(rebooting(RebootPhase::Draining, &[]));
        assert!(
            !may_begin(RebootMode::WhenRequired, &s, t(0), yes),
            "one is under way"
        );
        let mut s = st.clone();
        s.gate_failure = Some(gate_failure(AfterGate::Manual));
        assert!(!may_begin(RebootMode::WhenRequired, &s, t(0), yes));
        s.gate_failure = Some(gate_failure(AfterGate::RolledBack));
        assert!(
            may_begin(RebootMode::WhenRequired, &s, t(0), yes),
            "rolled back: fine"
        );
        let mut s = st;
        s.reboot_deferred = Some(RebootDeferred {
            until: t(10),
            reason: "drain given up".into(),
        });
        assert!(
            !may_begin(RebootMode::WhenRequired, &s, t(9), yes),
            "put off"
        );
        assert!(may_begin(RebootMode::WhenRequired, &s, t(10), yes));
    }

    #[test]
    fn the_not_required_check_is_made_last() {
        let s = State {
            suspended: true,
            ..State::default()
        };
        let asked = std::cell::Cell::new(false);
        may_begin(RebootMode::WhenRequired, &s, t(0), || {
            asked.set(true);
            true
        });
        assert!(
            !asked.get(),
            "the sentinel is not looked for while suspended"
        );
    }

    #[test]
    fn a_reboot_under_way_takes_the_turn_unless_an_attempt_or_a_gate_runs() {
        let mut st = State {
            phase: crate::state::Phase {
                disrupting: crate::state::Disrupting::Reboot(rebooting(RebootPhase::Draining, &[])),
                ..Default::default()
            },
            ..State::default()
        };
        let never = || -> bool { panic!("not asked while one is under way") };
        assert!(turn(&Decision::Idle, &st, never, |_| false));
        assert!(!turn(&Decision::Busy, &st, || true, |_| true));
        assert!(!turn(&Decision::Verify, &st, || true, |_| true));
        assert!(!turn(&Decision::RollBack, &st, || true, |_| true));
        st.phase.disrupting =
            crate::state::Disrupting::Reboot(rebooting(RebootPhase::Verifying, &[]));
        assert!(
            turn(&Decision::Idle, &st, || false, |_| false),
            "no gate open"
        );
        st.phase.activity = crate::state::Activity::Gate(verifying(true, false));
        assert!(!turn(&Decision::Idle, &st, || false, |_| false));
        st.phase.disrupting = crate::state::Disrupting::Reboot(rebooting(RebootPhase::Kept, &[]));
        st.gate_failure = Some(gate_failure(AfterGate::Manual));
        assert!(
            !turn(&Decision::Idle, &st, || true, |_| false),
            "held for a person"
        );
        st.gate_failure = None;
        assert!(turn(&Decision::Idle, &st, || false, |_| false));
    }

    #[test]
    fn a_new_reboot_waits_for_what_is_to_be_applied_unless_it_is_halted() {
        let st = State::default();
        let start = Decision::Start(Desired {
            revision: rev('b'),
            goal: Goal::Switch,
        });
        assert!(turn(&Decision::Idle, &st, || true, |_| false));
        assert!(turn(&Decision::RetryAt(t(5)), &st, || true, |_| false));
        assert!(!turn(&Decision::Idle, &st, || false, |_| false), "none due");
        assert!(!turn(&start, &st, || true, |_| false));
        assert!(turn(&start, &st, || true, |r| *r == rev('b')), "halted");
        assert!(!turn(&Decision::Suspended, &st, || true, |_| true));
    }

    #[test]
    fn the_slot_is_kept_for_a_reboot_in_an_open_window() {
        let closed = WindowState::Closed { opens_at: None };
        assert!(keeps_slot(true, false, &closed));
        assert!(keeps_slot(false, true, &WindowState::Always));
        assert!(!keeps_slot(false, true, &closed));
        assert!(!keeps_slot(false, false, &WindowState::Always));
    }

    #[test]
    fn the_drain_deadline_runs_from_the_cordon_or_else_the_start() {
        let mut r = rebooting(RebootPhase::Draining, &[]);
        assert_eq!(drain_started(&r), r.started_at);
        r.drain_started_at = Some(t(30));
        assert_eq!(drain_started(&r), t(30));
    }

    #[test]
    fn a_drain_deadline_is_kept_on_the_monotonic_clock_whatever_the_wall_clock_does() {
        let timeout = Duration::from_secs(60);
        let m = Instant::now();
        let secs = Duration::from_secs;
        // Seen as it begins: the full timeout.
        let c = DrainClock::of(None, t(0), timeout, t(0), m);
        assert!(!c.overdue(m + secs(59)));
        assert!(c.overdue(m + secs(60)));
        // The wall clock steps an hour forward, or back: the same deadline.
        assert_eq!(
            DrainClock::of(Some(c), t(0), timeout, t(3600), m + secs(1)),
            c
        );
        assert_eq!(
            DrainClock::of(Some(c), t(0), timeout, t(-3600), m + secs(1)),
            c
        );
        // After a restart, 20 s after the persisted start: 40 s left.
        let resumed = DrainClock::of(None, t(0), timeout, t(20), m);
        assert!(!resumed.overdue(m + secs(39)));
        assert!(resumed.overdue(m + secs(40)));
        // A start in the future (the clock went back) counts as just begun; one long past is
        // overdue now.
        assert!(!DrainClock::of(None, t(50), timeout, t(0), m).overdue(m + secs(59)));
        assert!(DrainClock::of(None, t(0), timeout, t(500), m).overdue(m));
        // A new drain (another start) is not the kept one's.
        let next = DrainClock::of(Some(c), t(100), timeout, t(100), m + secs(100));
        assert!(!next.overdue(m + secs(159)));
        assert!(next.overdue(m + secs(160)));
    }

    #[test]
    fn a_drain_given_up_without_windows_is_tried_again_after_its_timeout() {
        let timeout = Duration::from_secs(600);
        assert_eq!(next_try(&[], timeout, t(0)), t(600));
    }

    #[test]
    fn a_drain_given_up_in_a_window_is_tried_again_in_the_next_one() {
        let now = t(0).in_tz("UTC").unwrap();
        // A ten-minute window every day that opened a minute ago.
        let start = now - jiff::SignedDuration::from_secs(60);
        let w: Window = toml::from_str(&format!(
            "days = [\"mon\", \"tue\", \"wed\", \"thu\", \"fri\", \"sat\", \"sun\"]\n\
             start = \"{:02}:{:02}:{:02}\"\nlength = \"10m\"\n",
            start.hour(),
            start.minute(),
            start.second()
        ))
        .unwrap();
        let next = next_try(&[w], Duration::from_secs(600), t(0));
        assert_eq!(next, t(86_400 - 60), "tomorrow's window");
    }

    #[test]
    fn the_reboot_command_runs_again_on_its_own_pace() {
        let s = Duration::from_secs;
        assert_eq!(command_retry_wait(None), None);
        assert_eq!(command_retry_wait(Some(s(10))), Some(COMMAND_AGAIN - s(10)));
        assert_eq!(command_retry_wait(Some(COMMAND_AGAIN)), None);
        // Commanded 100 s ago: the machine gets the rest of its time to go down.
        assert_eq!(
            rerun_wait(Some(s(100)), None, None),
            Some(REBOOT_AGAIN - s(100))
        );
        // After a restart, the recorded time counts.
        assert_eq!(
            rerun_wait(None, Some(s(200)), None),
            Some(REBOOT_AGAIN - s(200))
        );
        assert_eq!(rerun_wait(None, None, None), None, "nothing known: now");
        assert_eq!(rerun_wait(Some(REBOOT_AGAIN), None, None), None);
        // A failed command: its own retry pace, not the reboot's.
        assert_eq!(
            rerun_wait(Some(s(5)), None, Some(s(5))),
            Some(COMMAND_AGAIN - s(5))
        );
        assert_eq!(rerun_wait(Some(s(5)), None, Some(COMMAND_AGAIN)), None);
    }

    #[test]
    fn a_pod_is_asked_to_go_again_every_few_seconds() {
        let now = Instant::now();
        assert!(evict_due(None, now));
        assert!(!evict_due(Some(now), now + Duration::from_secs(1)));
        assert!(evict_due(Some(now), now + EVICT_AGAIN));
    }

    #[test]
    fn the_words_of_a_drain() {
        assert_eq!(refusal("no", &[]), "eviction refused (429): no");
        assert_eq!(
            refusal("no", &["ns/pdb".into()]),
            "eviction refused (429) by PodDisruptionBudget ns/pdb: no"
        );
        let refused: BTreeMap<String, String> = [("ns/a".into(), "held".into())].into();
        let evicting = ["ns/a".to_owned(), "ns/b".to_owned()];
        assert_eq!(
            drain_waiting(&evicting, &BTreeMap::new()),
            "draining: waiting for ns/a, ns/b"
        );
        assert_eq!(drain_waiting(&evicting, &refused), "draining: ns/a: held");
        let why = given_up("10m", &evicting, &BTreeMap::new());
        assert!(why.starts_with(
            "drain given up after 10m (reboot.drain_timeout): pods still going: ns/a, ns/b;"
        ));
        assert!(given_up("10m", &evicting, &refused).contains(": ns/a: held;"));
    }

    #[test]
    fn a_gate_after_a_sentinel_reboot_has_nothing_to_roll_back() {
        let auto = RollbackPolicy::Auto;
        let after = verifying(true, false);
        let sentinel = rebooting(RebootPhase::Verifying, &["/run/reboot-required exists"]);
        let kernel = rebooting(RebootPhase::Verifying, &["kernel changed"]);
        assert_eq!(
            gate_policy(Some(&after), Some(&sentinel), auto),
            RollbackPolicy::Manual
        );
        assert_eq!(gate_policy(Some(&after), Some(&kernel), auto), auto);
        assert_eq!(
            gate_policy(Some(&verifying(false, false)), Some(&sentinel), auto),
            auto
        );
        assert_eq!(
            gate_policy(Some(&verifying(true, true)), Some(&sentinel), auto),
            auto
        );
        assert_eq!(gate_policy(None, None, auto), auto);
    }

    #[test]
    fn only_a_plan_that_says_drain_drains_before_the_activation() {
        assert_eq!(drain_wanted(None), None);
        let mut p = Plan {
            because: vec!["restarts kubelet.service".into()],
            ..Plan::default()
        };
        assert_eq!(drain_wanted(Some(&p)), None);
        p.action = Disruption::Reboot;
        assert_eq!(drain_wanted(Some(&p)), None);
        p.action = Disruption::Drain;
        assert_eq!(
            drain_wanted(Some(&p)),
            Some(vec!["restarts kubelet.service".to_owned()])
        );
    }

    #[test]
    fn a_drain_is_over_once_its_activation_and_gate_are_and_nothing_holds_the_node() {
        use crate::state::{ApplyDrain, GateFailure, InFlight};
        let r = Revision::from_oid(git2::Oid::from_bytes(&[1; 20]).unwrap());
        let mut st = State {
            phase: crate::state::Phase {
                disrupting: crate::state::Disrupting::LiveDrain(ApplyDrain {
                    revision: r.clone(),
                    because: vec![],
                    started_at: Timestamp::UNIX_EPOCH,
                    cordoned: true,
                    drained_at: Some(Timestamp::UNIX_EPOCH),
                    activated: false,
                }),
                ..Default::default()
            },
            ..State::default()
        };
        // Drained, not activated yet: the node stays cordoned.
        assert!(!apply_drain_over(&st));
        st.phase.live_drain_mut().unwrap().activated = true;
        assert!(apply_drain_over(&st));
        st.phase.activity = crate::state::Activity::Attempt(InFlight {
            id: 1,
            kind: crate::state::AttemptKind::Apply,
            source: "h".into(),
            revision: r.clone(),
            goal: crate::types::Goal::Switch,
            started_at: Timestamp::UNIX_EPOCH,
            testing: false,
            isolation: "process".into(),
            unit: None,
            dir: None,
            token: None,
            generation_before: None,
            pgid: None,
            boot_id: None,
            start_time: None,
            closure: None,
        });
        assert!(!apply_drain_over(&st), "the activation runs");
        st.phase.activity = crate::state::Activity::Idle;
        let failed = |next| GateFailure {
            revision: r.clone(),
            failing: BTreeMap::new(),
            at: Timestamp::UNIX_EPOCH,
            next,
            halted: false,
            quarantined: false,
            baseline: BTreeMap::new(),
            after_reboot: false,
        };
        for (next, over) in [
            (AfterGate::RollBack, false),
            (AfterGate::RollbackUnhealthy, false),
            (AfterGate::Manual, false),
            (AfterGate::RolledBack, true),
        ] {
            st.gate_failure = Some(failed(next));
            assert_eq!(apply_drain_over(&st), over, "{next:?}");
        }
        assert!(!apply_drain_over(&State::default()));
    }
}
