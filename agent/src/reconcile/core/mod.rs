//! The pure core of the apply loop: given what was applied, what failed or was interrupted,
//! whether ginx is suspended or rolled back, and which revision the source offers, decide what
//! to do next; and the checked transitions that record each attempt's start and end. No I/O,
//! no clock: the caller passes `now`.

mod apply_drain;
mod reboot;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use jiff::Timestamp;

use crate::config::RollbackPolicy;
use crate::state::{
    Activity, AfterGate, Applied, AttemptKind, Built, Failure, GateFailure, InFlight, Interrupted,
    Measured, Outcome, RebootRequired, State, TakenSlot, Verifying,
};
use crate::status::{ApplyState, WaitingFor};
use crate::types::ClosureInfo;
use crate::types::{Goal, Plan, Revision};
use crate::util;

/// The revision the source offers and the goal it is to be applied with (the testing branch
/// asks for its own goal).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Desired {
    pub revision: Revision,
    pub goal: Goal,
}

/// What the loop should do now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Nothing is wanted, it is applied already, given up, or rolled back.
    Idle,
    /// Build this revision without activating it (`apply.prebuild`); no slot is needed.
    Build(Desired),
    /// Apply this revision now.
    Start(Desired),
    /// The wanted revision failed; try again at this time.
    RetryAt(Timestamp),
    /// Something is wanted but ginx is suspended.
    Suspended,
    /// An attempt is running.
    Busy,
    /// The health gate after an activation is open: evaluate it.
    Verify,
    /// The health gate failed and `rollback = "auto"`: activate the previous generation.
    RollBack,
}

/// What holds a wanted revision back, as the reconciler found it when it asked the rollout.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Waiting {
    pub waiting_for: WaitingFor,
    pub reason: String,
    pub since: Timestamp,
}

/// A transition requested from the wrong state: a bug in the caller, reported, never a panic.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TransitionError {
    #[error("an attempt ({0}) is already running")]
    AlreadyRunning(u64),
    #[error("no attempt is running")]
    NotRunning,
    #[error("attempt {finished} finished but attempt {running} is the one running")]
    WrongAttempt { running: u64, finished: u64 },
    #[error("a health gate is already open (for {0})")]
    AlreadyVerifying(Revision),
    #[error("no health gate is open")]
    NotVerifying,
    #[error("cannot verify {0}: it is not what the last attempt left active")]
    NotActive(Revision),
    #[error("no rollout slot is recorded as held")]
    NotHeld,
    #[error("no failed health gate is recorded")]
    NoGateFailure,
    #[error("no rollback is due after the failed health gate")]
    NoRollbackDue,
    #[error("a reboot is already under way")]
    AlreadyRebooting,
    #[error("no reboot is under way")]
    NotRebooting,
    #[error("the reboot is {found}, not {expected}")]
    WrongRebootPhase {
        expected: &'static str,
        found: &'static str,
    },
    #[error("a drain before the activation of {0} is already under way")]
    AlreadyDraining(Revision),
    #[error("no drain before an activation is under way")]
    NotDraining,
    #[error("the node is not drained yet for {0}")]
    NotDrained(Revision),
}

/// Retry policy for failed revisions.
#[derive(Clone, Copy, Debug)]
pub struct RetryPolicy {
    pub base: Duration,
    pub max: Duration,
    pub max_attempts: u32,
}

/// How an attempt ended, as the core needs to know it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ending {
    pub outcome: Outcome,
    pub error: Option<String>,
    /// Retrying cannot help (a configuration error): give up at once.
    pub give_up: bool,
    /// A build's plan, kept with the built revision.
    pub plan: Option<Plan>,
}

/// The persisted state plus what only lives in memory.
#[derive(Clone, Debug)]
pub struct Core {
    /// Read by anyone through [`Core::state`]; changed only by the transitions below, each of
    /// which checks that it is asked for in a state it applies to.
    state: State,
    /// `ginxctl sync` asked to retry the failure recorded at that moment (revision, attempts)
    /// without waiting for its backoff; a later failure is not covered by the request.
    retry_now: Option<(Revision, u32)>,
    /// Drift was found and `on_drift = "reapply"`: apply the applied revision again.
    reapply: bool,
    /// The rollout holds the wanted revision back (fleet pause, halt, lock, quorum, API).
    pub waiting: Option<Waiting>,
    /// `apply.prebuild`: a revision is built before its activation is asked for.
    pub prebuild: bool,
}

impl Core {
    pub fn new(state: State) -> Self {
        Self {
            state,
            retry_now: None,
            reapply: false,
            waiting: None,
            prebuild: false,
        }
    }

    /// Whether `desired` must be built before it is activated: with `apply.prebuild`, for a
    /// goal that activates something, unless it was built already.
    fn needs_build(&self, desired: &Desired) -> bool {
        self.prebuild
            && matches!(desired.goal, Goal::Switch | Goal::Boot | Goal::Test)
            && self
                .state
                .built
                .as_ref()
                .is_none_or(|b| b.revision != desired.revision)
    }

    /// The state as persisted, to read.
    pub fn state(&self) -> &State {
        &self.state
    }

    pub fn running(&self) -> Option<&InFlight> {
        self.state.phase.attempt()
    }

    /// Whether `desired` is what was applied last (same revision, same goal).
    fn is_applied(&self, desired: &Desired) -> bool {
        self.state
            .applied
            .as_ref()
            .is_some_and(|a| a.revision == desired.revision && a.goal == desired.goal)
    }

    fn failure_of(&self, desired: &Desired) -> Option<&Failure> {
        self.state
            .failure
            .as_ref()
            .filter(|f| f.revision == desired.revision)
    }

    fn retry_requested(&self, f: &Failure) -> bool {
        self.retry_now
            .as_ref()
            .is_some_and(|(rev, attempts)| *rev == f.revision && *attempts == f.attempts)
    }

    fn rolled_back_from(&self, desired: &Desired) -> bool {
        self.state.rolled_back.as_ref() == Some(&desired.revision)
    }

    pub fn decide(&self, desired: Option<&Desired>, now: Timestamp) -> Decision {
        match self.state.phase.activity {
            Activity::Attempt(_) => return Decision::Busy,
            Activity::Gate(_) => return Decision::Verify,
            Activity::Idle => {}
        }
        if self
            .state
            .gate_failure
            .as_ref()
            .is_some_and(|g| g.next == AfterGate::RollBack)
        {
            return Decision::RollBack;
        }
        let Some(desired) = desired else {
            return Decision::Idle;
        };
        if self.rolled_back_from(desired) {
            return Decision::Idle;
        }
        if self.is_applied(desired) && !self.reapply {
            return Decision::Idle;
        }
        if self.state.suspended {
            return Decision::Suspended;
        }
        match self.failure_of(desired) {
            Some(f) if f.exhausted => Decision::Idle,
            Some(f) if !self.retry_requested(f) && now < f.next_retry_at => {
                Decision::RetryAt(f.next_retry_at)
            }
            _ if self.needs_build(desired) => Decision::Build(desired.clone()),
            _ => Decision::Start(desired.clone()),
        }
    }

    /// Idle → applying.
    pub fn begin(&mut self, attempt: InFlight) -> Result<u64, TransitionError> {
        if let Some(r) = self.state.phase.attempt() {
            return Err(TransitionError::AlreadyRunning(r.id));
        }
        let id = self.state.next_attempt_id;
        self.state.next_attempt_id += 1;
        if attempt.kind == AttemptKind::Apply {
            // A new apply supersedes what a failed gate left (even a kept slot: the node
            // applies with it).
            self.state.gate_failure = None;
        }
        // A gate still open closes: it judged what ran before this attempt.
        self.state.phase.activity = Activity::Attempt(InFlight { id, ..attempt });
        self.retry_now = None;
        self.reapply = false;
        self.waiting = None;
        Ok(id)
    }

    /// Makes sure the next attempt's id is above every id already `used` (in the history, or
    /// as a folder under `attempts/`), so that ids never repeat even when the state file was
    /// lost while the history survived.
    pub fn skip_used_ids(&mut self, used: impl IntoIterator<Item = u64>) {
        if let Some(highest) = used.into_iter().max() {
            self.state.next_attempt_id = self.state.next_attempt_id.max(highest.saturating_add(1));
        }
    }

    /// Records facts about the running attempt learnt after it began (its process group, its
    /// unit).
    pub fn update_running(&mut self, f: impl FnOnce(&mut InFlight)) -> Result<(), TransitionError> {
        let r = self
            .state
            .phase
            .attempt_mut()
            .ok_or(TransitionError::NotRunning)?;
        f(r);
        Ok(())
    }

    /// Applying → idle, recording the outcome.
    pub fn complete(
        &mut self,
        id: u64,
        ending: Ending,
        now: Timestamp,
        policy: RetryPolicy,
    ) -> Result<InFlight, TransitionError> {
        let running = self
            .state
            .phase
            .attempt()
            .ok_or(TransitionError::NotRunning)?;
        if running.id != id {
            return Err(TransitionError::WrongAttempt {
                running: running.id,
                finished: id,
            });
        }
        let done = self
            .state
            .phase
            .take_attempt()
            .ok_or(TransitionError::NotRunning)?;
        if done.kind == AttemptKind::Rollback {
            if let Some(g) = self.state.gate_failure.as_mut()
                && g.next == AfterGate::RollBack
            {
                // After a failed gate: a rollback that ran is verified next; one that failed
                // leaves the node unhealthy, holding its slot.
                g.next = match ending.outcome {
                    Outcome::Succeeded => AfterGate::RolledBack,
                    _ => AfterGate::RollbackUnhealthy,
                };
            }
            if ending.outcome == Outcome::Succeeded {
                self.state.rolled_back = self.state.applied.as_ref().map(|a| a.revision.clone());
            }
            return Ok(done);
        }
        if done.kind == AttemptKind::Build && ending.outcome == Outcome::Succeeded {
            // Built, nothing activated: what is applied stays; the activation comes next.
            self.state.built = Some(Built {
                revision: done.revision.clone(),
                at: now,
                plan: ending.plan,
            });
            self.state.interrupted = None;
            return Ok(done);
        }
        let (mut outcome, mut error) = (ending.outcome, ending.error);
        if outcome == Outcome::Interrupted {
            let count = match &self.state.interrupted {
                Some(i) if i.revision == done.revision => i.count + 1,
                _ => 1,
            };
            self.state.interrupted = Some(Interrupted {
                revision: done.revision.clone(),
                count,
            });
            // Retried once; interrupted again, it counts as a failure.
            if count >= 2 {
                outcome = Outcome::Failed;
                error = Some(format!(
                    "interrupted {count} times in a row ({})",
                    error
                        .as_deref()
                        .unwrap_or("ginx or the machine stopped mid-attempt")
                ));
            }
        }
        match outcome {
            Outcome::Succeeded => {
                self.state.applied = Some(Applied {
                    source: done.source.clone(),
                    revision: done.revision.clone(),
                    goal: done.goal,
                    at: now,
                });
                self.state.failure = None;
                self.state.interrupted = None;
                self.state.rolled_back = None;
            }
            Outcome::Failed | Outcome::TimedOut => {
                let attempts = match &self.state.failure {
                    Some(f) if f.revision == done.revision => f.attempts + 1,
                    _ => 1,
                };
                let wait = util::backoff(policy.base, policy.max, attempts);
                self.state.failure = Some(Failure {
                    revision: done.revision.clone(),
                    attempts,
                    error: error.unwrap_or_else(|| outcome.as_str().to_owned()),
                    next_retry_at: util::after(now, wait),
                    exhausted: ending.give_up || attempts >= policy.max_attempts,
                });
            }
            Outcome::Interrupted => {}
        }
        Ok(done)
    }

    /// Applied → verifying: the health gate opens for what the last attempt activated (the
    /// applied revision, or after a rollback the rolled-back system).
    pub fn begin_verifying(&mut self, v: Verifying) -> Result<(), TransitionError> {
        match &self.state.phase.activity {
            Activity::Attempt(r) => return Err(TransitionError::AlreadyRunning(r.id)),
            Activity::Gate(open) => {
                return Err(TransitionError::AlreadyVerifying(open.revision.clone()));
            }
            Activity::Idle => {}
        }
        let active = if v.rollback {
            self.state.rolled_back.as_ref()
        } else {
            self.state.applied.as_ref().map(|a| &a.revision)
        };
        if active != Some(&v.revision) {
            return Err(TransitionError::NotActive(v.revision));
        }
        self.state.phase.activity = Activity::Gate(v);
        Ok(())
    }

    /// One look at the open gate: `look` is given it to update (how long it has been healthy)
    /// and returns its verdict.
    pub fn look_at_gate<T>(
        &mut self,
        look: impl FnOnce(&mut Verifying) -> T,
    ) -> Result<T, TransitionError> {
        let v = self
            .state
            .phase
            .gate_mut()
            .ok_or(TransitionError::NotVerifying)?;
        Ok(look(v))
    }

    /// Verifying → succeeded (or, for the rolled-back system, rolled back): the gate passed
    /// at `now`.
    pub fn gate_passed(&mut self, now: Timestamp) -> Result<Verifying, TransitionError> {
        let v = self
            .state
            .phase
            .take_gate()
            .ok_or(TransitionError::NotVerifying)?;
        if !v.rollback {
            self.state.gate_failure = None;
            self.state.passed = Some(v.revision.clone());
            self.state.took.record(Measured::Gate, v.started_at, now);
        }
        Ok(v)
    }

    /// Verifying → a failed gate. For a revision: roll back (`auto`) or hold (`manual`); for
    /// the rolled-back system: unhealthy, the slot kept. Returns what comes next.
    pub fn gate_failed(
        &mut self,
        failing: BTreeMap<String, String>,
        now: Timestamp,
        policy: RollbackPolicy,
    ) -> Result<AfterGate, TransitionError> {
        let v = self
            .state
            .phase
            .take_gate()
            .ok_or(TransitionError::NotVerifying)?;
        if v.rollback {
            let g = self.state.gate_failure.get_or_insert(GateFailure {
                revision: v.revision.clone(),
                failing: BTreeMap::new(),
                at: now,
                next: AfterGate::RollbackUnhealthy,
                halted: false,
                quarantined: false,
                baseline: v.baseline.clone(),
                after_reboot: v.after_reboot,
            });
            g.next = AfterGate::RollbackUnhealthy;
            for (k, m) in failing {
                g.failing.insert(format!("after rollback: {k}"), m);
            }
            return Ok(AfterGate::RollbackUnhealthy);
        }
        let next = match policy {
            RollbackPolicy::Auto => AfterGate::RollBack,
            RollbackPolicy::Manual => AfterGate::Manual,
        };
        self.state.gate_failure = Some(GateFailure {
            revision: v.revision,
            failing,
            at: now,
            next,
            halted: false,
            quarantined: false,
            baseline: v.baseline,
            after_reboot: v.after_reboot,
        });
        Ok(next)
    }

    /// What the rollout says holds the wanted revision back; returns whether it changed.
    pub fn set_waiting(&mut self, w: Option<(WaitingFor, String)>, now: Timestamp) -> bool {
        let next = w.map(|(waiting_for, reason)| Waiting {
            since: self
                .waiting
                .as_ref()
                .filter(|o| o.waiting_for == waiting_for)
                .map_or(now, |o| o.since),
            waiting_for,
            reason,
        });
        let changed = next != self.waiting;
        self.waiting = next;
        changed
    }

    /// Returns whether anything changed.
    pub fn set_suspended(&mut self, suspended: bool) -> bool {
        let changed = self.state.suspended != suspended;
        self.state.suspended = suspended;
        changed
    }

    /// A failed revision is retried at once instead of after its backoff (`ginxctl sync`); a
    /// revision given up stays given up.
    pub fn request_retry(&mut self) {
        self.retry_now = self
            .state
            .failure
            .as_ref()
            .map(|f| (f.revision.clone(), f.attempts));
    }

    /// `ginxctl retry`: forget failures, give-ups and a rollback, and apply the wanted revision
    /// now, even if it was applied before.
    pub fn force_retry(&mut self) {
        self.state.failure = None;
        self.state.interrupted = None;
        self.state.rolled_back = None;
        if self
            .state
            .gate_failure
            .as_ref()
            .is_some_and(|g| g.next != AfterGate::RollBack)
        {
            self.state.gate_failure = None;
        }
        self.reapply = true;
    }

    /// Apply the applied revision again (drift with `on_drift = "reapply"`).
    pub fn request_reapply(&mut self) {
        self.reapply = true;
    }

    /// The rollout granted the apply with `lock` (none when the rollout takes no lock): it is
    /// recorded before the activation, so that a restarted holder takes its slot up again
    /// instead of a second one. Returns whether the record changed.
    pub fn lock_granted(&mut self, lock: Option<TakenSlot>) -> Result<bool, TransitionError> {
        if let Some(r) = self.state.phase.attempt() {
            return Err(TransitionError::AlreadyRunning(r.id));
        }
        let changed = self.state.rollout_held != lock;
        self.state.rollout_held = lock;
        Ok(changed)
    }

    /// The slot was released: nothing is held any more.
    pub fn lock_released(&mut self) -> Result<TakenSlot, TransitionError> {
        self.state
            .rollout_held
            .take()
            .ok_or(TransitionError::NotHeld)
    }

    /// The cluster-wide halt of the failed gate's revision (or, below the failure budget, this
    /// node's quarantine) is written: it is not written again.
    pub fn gate_halted(&mut self, quarantined: bool) -> Result<(), TransitionError> {
        let g = self
            .state
            .gate_failure
            .as_mut()
            .ok_or(TransitionError::NoGateFailure)?;
        g.halted = true;
        g.quarantined = quarantined;
        Ok(())
    }

    /// The rollback a failed gate asked for could not even start: the node stays on the
    /// failing system, unhealthy, and keeps its slot so that no other node proceeds.
    pub fn rollback_not_started(&mut self) -> Result<(), TransitionError> {
        let g = self
            .state
            .gate_failure
            .as_mut()
            .ok_or(TransitionError::NoGateFailure)?;
        if g.next != AfterGate::RollBack {
            return Err(TransitionError::NoRollbackDue);
        }
        g.next = AfterGate::RollbackUnhealthy;
        Ok(())
    }

    /// What the running attempt activated in closure mode (its report, or what it was started
    /// with), shown until another attempt replaces it. A rollback that succeeded without one
    /// clears it: what runs is no longer that closure.
    pub fn closure_seen(
        &mut self,
        closure: Option<ClosureInfo>,
        outcome: Outcome,
    ) -> Result<(), TransitionError> {
        let running = self
            .state
            .phase
            .attempt()
            .ok_or(TransitionError::NotRunning)?;
        if closure.is_some() {
            self.state.closure = closure;
        } else if running.kind == AttemptKind::Rollback && outcome == Outcome::Succeeded {
            self.state.closure = None;
        }
        Ok(())
    }

    /// After a successful activation: the system it left running (drift is measured against
    /// it) and why a reboot is needed now, if one is. A reboot that was required already keeps
    /// the time it has been required since.
    pub fn activated(
        &mut self,
        system: Option<PathBuf>,
        reboot_reasons: Vec<String>,
        boot_id: Option<String>,
        now: Timestamp,
    ) -> Result<(), TransitionError> {
        if let Some(r) = self.state.phase.attempt() {
            return Err(TransitionError::AlreadyRunning(r.id));
        }
        self.state.expected_system = system;
        let since = self.state.reboot.as_ref().map_or(now, |r| r.since);
        self.state.reboot = (!reboot_reasons.is_empty()).then_some(RebootRequired {
            reasons: reboot_reasons,
            since,
            boot_id,
        });
        Ok(())
    }

    /// At start-up: a reboot found required in another boot than this one (`boot_id`) is
    /// looked at afresh, since the reboot may have been what it asked for. Returns whether the
    /// record changed.
    pub fn reboot_reassessed(
        &mut self,
        reasons: Vec<String>,
        boot_id: Option<String>,
        now: Timestamp,
    ) -> bool {
        let Some(r) = &self.state.reboot else {
            return false;
        };
        if r.boot_id.is_some() && r.boot_id == boot_id {
            return false;
        }
        self.state.reboot = (!reasons.is_empty()).then_some(RebootRequired {
            reasons,
            since: now,
            boot_id,
        });
        true
    }

    /// The state shown for the apply, given what the source offers.
    pub fn apply_state(&self, desired: Option<&Desired>) -> ApplyState {
        match &self.state.phase.activity {
            Activity::Attempt(r) if r.kind == AttemptKind::Build => return ApplyState::Building,
            Activity::Attempt(_) => return ApplyState::Applying,
            Activity::Gate(_) => return ApplyState::Verifying,
            Activity::Idle => {}
        }
        match self.state.gate_failure.as_ref().map(|g| g.next) {
            Some(AfterGate::RollBack) => return ApplyState::Verifying,
            // Halted and kept: the revision's gate failed and nothing undid it.
            Some(AfterGate::Manual | AfterGate::RollbackUnhealthy)
                if desired.is_none_or(|d| {
                    self.state
                        .gate_failure
                        .as_ref()
                        .is_some_and(|g| g.revision == d.revision)
                }) =>
            {
                return ApplyState::Failed;
            }
            _ => {}
        }
        let Some(desired) = desired else {
            return if self.state.applied.is_some() {
                ApplyState::Succeeded
            } else {
                ApplyState::Idle
            };
        };
        if self.rolled_back_from(desired) {
            return ApplyState::RolledBack;
        }
        if self.is_applied(desired) {
            return ApplyState::Succeeded;
        }
        if self.state.suspended || self.waiting.is_some() {
            return ApplyState::Waiting;
        }
        match self.failure_of(desired) {
            Some(_) => ApplyState::Failed,
            None => ApplyState::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) const POLICY: RetryPolicy = RetryPolicy {
        base: Duration::from_secs(30),
        max: Duration::from_secs(300),
        max_attempts: 100,
    };

    pub(super) fn rev(c: char) -> Revision {
        c.to_string().repeat(40).parse().unwrap()
    }

    pub(super) fn want(c: char) -> Desired {
        Desired {
            revision: rev(c),
            goal: Goal::Switch,
        }
    }

    pub(super) fn t(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    pub(super) fn core() -> Core {
        Core::new(State::default())
    }

    pub(super) fn attempt(c: char, goal: Goal, at: i64) -> InFlight {
        InFlight {
            id: 0,
            kind: AttemptKind::Apply,
            source: "h".into(),
            revision: rev(c),
            goal,
            started_at: t(at),
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
        }
    }

    pub(super) fn ended(outcome: Outcome) -> Ending {
        Ending {
            outcome,
            error: None,
            give_up: false,
            plan: None,
        }
    }

    pub(super) fn run(c: &mut Core, r: char, at: i64, outcome: Outcome) {
        let id = c.begin(attempt(r, Goal::Switch, at)).unwrap();
        c.complete(id, ended(outcome), t(at + 1), POLICY).unwrap();
    }

    #[test]
    fn nothing_fetched_is_idle() {
        let c = core();
        assert_eq!(c.decide(None, t(0)), Decision::Idle);
        assert_eq!(c.apply_state(None), ApplyState::Idle);
    }

    #[test]
    fn a_new_revision_starts() {
        let c = core();
        assert_eq!(c.decide(Some(&want('a')), t(0)), Decision::Start(want('a')));
        assert_eq!(c.apply_state(Some(&want('a'))), ApplyState::Pending);
    }

    #[test]
    fn begin_moves_to_applying_and_refuses_a_second() {
        let mut c = core();
        let id = c.begin(attempt('a', Goal::Switch, 0)).unwrap();
        assert_eq!(c.apply_state(Some(&want('a'))), ApplyState::Applying);
        assert_eq!(c.decide(Some(&want('b')), t(1)), Decision::Busy);
        assert_eq!(
            c.begin(attempt('b', Goal::Switch, 1)),
            Err(TransitionError::AlreadyRunning(id))
        );
    }

    #[test]
    fn success_records_applied_and_is_never_applied_again() {
        let mut c = core();
        run(&mut c, 'a', 0, Outcome::Succeeded);
        assert_eq!(c.state.applied.as_ref().unwrap().revision, rev('a'));
        assert_eq!(c.decide(Some(&want('a')), t(6)), Decision::Idle);
        assert_eq!(c.apply_state(Some(&want('a'))), ApplyState::Succeeded);
        // After a restart the persisted state says the same.
        let again = Core::new(c.state.clone());
        assert_eq!(again.decide(Some(&want('a')), t(100)), Decision::Idle);
    }

    #[test]
    fn attempt_ids_continue_after_every_id_in_use() {
        let mut c = core();
        c.skip_used_ids([]);
        assert_eq!(c.state.next_attempt_id, 0);
        c.skip_used_ids([3, 7, 1]);
        assert_eq!(c.state.next_attempt_id, 8);
        // A state that is ahead already stays ahead.
        c.state.next_attempt_id = 20;
        c.skip_used_ids([7]);
        assert_eq!(c.begin(attempt('a', Goal::Switch, 0)).unwrap(), 20);
    }

    #[test]
    fn failure_backs_off_exponentially() {
        let mut c = core();
        let mut expected = [30, 60, 120, 240, 300, 300].into_iter();
        let mut now = t(0);
        for n in 1..=6 {
            let id = c
                .begin(InFlight {
                    started_at: now,
                    ..attempt('a', Goal::Switch, 0)
                })
                .unwrap();
            c.complete(id, ended(Outcome::Failed), now, POLICY).unwrap();
            let f = c.state.failure.clone().unwrap();
            assert_eq!(f.attempts, n);
            let wait = f.next_retry_at.duration_since(now).as_secs();
            assert_eq!(wait, expected.next().unwrap());
            assert_eq!(
                c.decide(Some(&want('a')), now),
                Decision::RetryAt(f.next_retry_at)
            );
            assert_eq!(c.apply_state(Some(&want('a'))), ApplyState::Failed);
            now = f.next_retry_at;
            assert_eq!(c.decide(Some(&want('a')), now), Decision::Start(want('a')));
        }
    }

    #[test]
    fn max_attempts_gives_up_until_retry() {
        let mut c = core();
        let policy = RetryPolicy {
            max_attempts: 2,
            ..POLICY
        };
        for n in 0..2 {
            let id = c.begin(attempt('a', Goal::Switch, n)).unwrap();
            c.complete(id, ended(Outcome::Failed), t(n), policy)
                .unwrap();
        }
        assert!(c.state.failure.as_ref().unwrap().exhausted);
        assert_eq!(c.decide(Some(&want('a')), t(100_000)), Decision::Idle);
        assert_eq!(c.apply_state(Some(&want('a'))), ApplyState::Failed);
        c.request_retry();
        assert_eq!(
            c.decide(Some(&want('a')), t(100_000)),
            Decision::Idle,
            "sync does not revive it"
        );
        // A new revision is tried.
        assert_eq!(
            c.decide(Some(&want('b')), t(100_000)),
            Decision::Start(want('b'))
        );
        c.force_retry();
        assert_eq!(
            c.decide(Some(&want('a')), t(100_000)),
            Decision::Start(want('a'))
        );
    }

    #[test]
    fn a_configuration_error_gives_up_at_once() {
        let mut c = core();
        let id = c.begin(attempt('a', Goal::Switch, 0)).unwrap();
        let e = Ending {
            outcome: Outcome::Failed,
            error: Some("node missing".into()),
            give_up: true,
            plan: None,
        };
        c.complete(id, e, t(1), POLICY).unwrap();
        let f = c.state.failure.as_ref().unwrap();
        assert!(f.exhausted);
        assert_eq!(f.attempts, 1);
        assert_eq!(c.decide(Some(&want('a')), t(1_000_000)), Decision::Idle);
    }

    #[test]
    fn a_new_revision_is_not_held_back_by_the_old_failure() {
        let mut c = core();
        run(&mut c, 'a', 0, Outcome::Failed);
        assert_eq!(c.decide(Some(&want('b')), t(2)), Decision::Start(want('b')));
        run(&mut c, 'b', 2, Outcome::Failed);
        assert_eq!(
            c.state.failure.as_ref().unwrap().attempts,
            1,
            "counts per revision"
        );
    }

    #[test]
    fn sync_retries_a_failed_revision_at_once() {
        let mut c = core();
        run(&mut c, 'a', 0, Outcome::TimedOut);
        assert!(matches!(
            c.decide(Some(&want('a')), t(2)),
            Decision::RetryAt(_)
        ));
        c.request_retry();
        assert_eq!(c.decide(Some(&want('a')), t(2)), Decision::Start(want('a')));
        // The request is used up by the attempt it caused.
        run(&mut c, 'a', 2, Outcome::Failed);
        assert!(matches!(
            c.decide(Some(&want('a')), t(4)),
            Decision::RetryAt(_)
        ));
    }

    #[test]
    fn a_sync_retries_only_the_failure_it_saw() {
        let mut c = core();
        c.request_retry();
        run(&mut c, 'a', 0, Outcome::Failed);
        assert!(
            matches!(c.decide(Some(&want('a')), t(2)), Decision::RetryAt(_)),
            "a request made before the failure does not cover it"
        );
    }

    #[test]
    fn suspended_holds_back_but_keeps_the_revision_wanted() {
        let mut c = core();
        assert!(c.set_suspended(true));
        assert!(!c.set_suspended(true));
        assert_eq!(c.decide(Some(&want('a')), t(0)), Decision::Suspended);
        assert_eq!(c.apply_state(Some(&want('a'))), ApplyState::Waiting);
        assert!(c.set_suspended(false));
        assert_eq!(c.decide(Some(&want('a')), t(0)), Decision::Start(want('a')));
    }

    #[test]
    fn an_interruption_is_retried_once_then_counts_as_a_failure() {
        let mut c = core();
        run(&mut c, 'a', 0, Outcome::Interrupted);
        assert!(c.state.failure.is_none());
        assert_eq!(c.decide(Some(&want('a')), t(1)), Decision::Start(want('a')));
        run(&mut c, 'a', 2, Outcome::Interrupted);
        let f = c.state.failure.as_ref().unwrap();
        assert_eq!(f.attempts, 1);
        assert!(f.error.contains("interrupted 2 times"));
        assert!(matches!(
            c.decide(Some(&want('a')), t(3)),
            Decision::RetryAt(_)
        ));
        run(&mut c, 'a', 100_000, Outcome::Succeeded);
        assert!(c.state.interrupted.is_none());
    }

    #[test]
    fn completing_the_wrong_attempt_is_refused() {
        let mut c = core();
        assert_eq!(
            c.complete(0, ended(Outcome::Succeeded), t(0), POLICY)
                .unwrap_err(),
            TransitionError::NotRunning
        );
        let id = c.begin(attempt('a', Goal::Switch, 0)).unwrap();
        assert_eq!(
            c.complete(id + 1, ended(Outcome::Succeeded), t(0), POLICY)
                .unwrap_err(),
            TransitionError::WrongAttempt {
                running: id,
                finished: id + 1
            }
        );
        assert!(c.running().is_some());
    }

    #[test]
    fn attempt_ids_are_never_reused() {
        let mut c = core();
        let a = c.begin(attempt('a', Goal::Switch, 0)).unwrap();
        c.complete(a, ended(Outcome::Succeeded), t(1), POLICY)
            .unwrap();
        let b = c.begin(attempt('b', Goal::Switch, 2)).unwrap();
        assert!(b > a);
    }

    #[test]
    fn the_same_revision_with_another_goal_is_applied_again() {
        let mut c = core();
        let id = c.begin(attempt('a', Goal::Test, 0)).unwrap();
        c.complete(id, ended(Outcome::Succeeded), t(1), POLICY)
            .unwrap();
        let tested = Desired {
            revision: rev('a'),
            goal: Goal::Test,
        };
        assert_eq!(c.decide(Some(&tested), t(2)), Decision::Idle);
        // The testing branch was merged: the same commit now comes from main, to be switched to.
        assert_eq!(c.decide(Some(&want('a')), t(2)), Decision::Start(want('a')));
    }

    #[test]
    fn a_rollback_holds_the_revision_until_retry_or_a_new_one() {
        let mut c = core();
        run(&mut c, 'a', 0, Outcome::Succeeded);
        let id = c
            .begin(InFlight {
                kind: AttemptKind::Rollback,
                ..attempt('a', Goal::Switch, 1)
            })
            .unwrap();
        c.complete(id, ended(Outcome::Succeeded), t(2), POLICY)
            .unwrap();
        assert_eq!(c.apply_state(Some(&want('a'))), ApplyState::RolledBack);
        assert_eq!(c.decide(Some(&want('a')), t(3)), Decision::Idle);
        assert_eq!(c.decide(Some(&want('b')), t(3)), Decision::Start(want('b')));
        c.force_retry();
        assert_eq!(c.decide(Some(&want('a')), t(3)), Decision::Start(want('a')));
    }

    #[test]
    fn a_failed_rollback_changes_nothing() {
        let mut c = core();
        run(&mut c, 'a', 0, Outcome::Succeeded);
        let before = c.state.clone();
        let id = c
            .begin(InFlight {
                kind: AttemptKind::Rollback,
                ..attempt('a', Goal::Switch, 1)
            })
            .unwrap();
        c.complete(id, ended(Outcome::Failed), t(2), POLICY)
            .unwrap();
        assert_eq!(c.state.applied, before.applied);
        assert!(c.state.failure.is_none() && c.state.rolled_back.is_none());
    }

    #[test]
    fn drift_reapply_runs_the_applied_revision_again_once() {
        let mut c = core();
        run(&mut c, 'a', 0, Outcome::Succeeded);
        c.request_reapply();
        assert_eq!(c.decide(Some(&want('a')), t(2)), Decision::Start(want('a')));
        run(&mut c, 'a', 2, Outcome::Succeeded);
        assert_eq!(c.decide(Some(&want('a')), t(4)), Decision::Idle);
    }

    pub(super) fn gate(c: char, rollback: bool) -> Verifying {
        Verifying {
            revision: rev(c),
            rollback,
            started_at: t(10),
            deadline: t(100),
            healthy_since: None,
            baseline: BTreeMap::new(),
            after_reboot: false,
        }
    }

    pub(super) fn failing() -> BTreeMap<String, String> {
        [("kubelet".to_owned(), "failed: down".to_owned())].into()
    }

    pub(super) fn rollback(c: &mut Core, at: i64, outcome: Outcome) {
        let id = c
            .begin(InFlight {
                kind: AttemptKind::Rollback,
                ..attempt('a', Goal::Switch, at)
            })
            .unwrap();
        c.complete(id, ended(outcome), t(at + 1), POLICY).unwrap();
    }

    #[test]
    fn applied_to_verifying_opens_the_gate() {
        let mut c = core();
        run(&mut c, 'a', 0, Outcome::Succeeded);
        c.begin_verifying(gate('a', false)).unwrap();
        assert_eq!(c.decide(Some(&want('a')), t(11)), Decision::Verify);
        assert_eq!(c.apply_state(Some(&want('a'))), ApplyState::Verifying);
        // A new revision waits for the gate.
        assert_eq!(c.decide(Some(&want('b')), t(11)), Decision::Verify);
    }

    #[test]
    fn a_rollback_closes_the_open_gate_and_its_own_gate_opens_after_it() {
        let mut c = core();
        run(&mut c, 'a', 0, Outcome::Succeeded);
        c.begin_verifying(gate('a', false)).unwrap();
        rollback(&mut c, 20, Outcome::Succeeded);
        // The gate of `a` judged what ran before the rollback: it is gone, not carried over
        // to the rolled-back system.
        assert!(c.state.phase.gate().is_none());
        assert_eq!(c.decide(Some(&want('a')), t(30)), Decision::Idle);
        c.begin_verifying(gate('a', true)).unwrap();
        assert!(c.state.phase.gate().is_some_and(|g| g.rollback));
    }

    #[test]
    fn verifying_is_refused_for_what_is_not_active_or_twice() {
        let mut c = core();
        assert_eq!(
            c.begin_verifying(gate('a', false)),
            Err(TransitionError::NotActive(rev('a')))
        );
        run(&mut c, 'a', 0, Outcome::Succeeded);
        assert_eq!(
            c.begin_verifying(gate('a', true)),
            Err(TransitionError::NotActive(rev('a'))),
            "nothing was rolled back"
        );
        c.begin_verifying(gate('a', false)).unwrap();
        assert_eq!(
            c.begin_verifying(gate('a', false)),
            Err(TransitionError::AlreadyVerifying(rev('a')))
        );
        assert_eq!(c.gate_passed(t(60)).unwrap().revision, rev('a'));
        assert_eq!(c.gate_passed(t(60)), Err(TransitionError::NotVerifying));
        assert_eq!(
            c.gate_failed(failing(), t(20), RollbackPolicy::Auto),
            Err(TransitionError::NotVerifying)
        );
    }

    #[test]
    fn verifying_to_succeeded_when_the_gate_passes() {
        let mut c = core();
        run(&mut c, 'a', 0, Outcome::Succeeded);
        c.begin_verifying(gate('a', false)).unwrap();
        c.gate_passed(t(60)).unwrap();
        assert_eq!(c.apply_state(Some(&want('a'))), ApplyState::Succeeded);
        assert_eq!(c.decide(Some(&want('a')), t(20)), Decision::Idle);
    }

    #[test]
    fn a_failed_gate_rolls_back_when_auto() {
        let mut c = core();
        run(&mut c, 'a', 0, Outcome::Succeeded);
        c.begin_verifying(gate('a', false)).unwrap();
        assert_eq!(
            c.gate_failed(failing(), t(20), RollbackPolicy::Auto),
            Ok(AfterGate::RollBack)
        );
        assert_eq!(c.decide(Some(&want('a')), t(20)), Decision::RollBack);
        assert_eq!(
            c.decide(Some(&want('b')), t(20)),
            Decision::RollBack,
            "rollback first"
        );
        let g = c.state.gate_failure.as_ref().unwrap();
        assert_eq!(
            (g.revision.clone(), g.failing.clone()),
            (rev('a'), failing())
        );
    }

    #[test]
    fn the_rolled_back_system_is_gated_then_the_revision_is_held() {
        let mut c = core();
        run(&mut c, 'a', 0, Outcome::Succeeded);
        c.begin_verifying(gate('a', false)).unwrap();
        c.gate_failed(failing(), t(20), RollbackPolicy::Auto)
            .unwrap();
        rollback(&mut c, 21, Outcome::Succeeded);
        assert_eq!(
            c.state.gate_failure.as_ref().unwrap().next,
            AfterGate::RolledBack
        );
        c.begin_verifying(gate('a', true)).unwrap();
        assert_eq!(c.decide(Some(&want('a')), t(23)), Decision::Verify);
        c.gate_passed(t(60)).unwrap();
        assert_eq!(c.apply_state(Some(&want('a'))), ApplyState::RolledBack);
        assert_eq!(
            c.decide(Some(&want('a')), t(30)),
            Decision::Idle,
            "bad locally"
        );
        assert_eq!(
            c.decide(Some(&want('b')), t(30)),
            Decision::Start(want('b'))
        );
    }

    #[test]
    fn an_unhealthy_rolled_back_system_holds_until_a_new_revision() {
        let mut c = core();
        run(&mut c, 'a', 0, Outcome::Succeeded);
        c.begin_verifying(gate('a', false)).unwrap();
        c.gate_failed(failing(), t(20), RollbackPolicy::Auto)
            .unwrap();
        rollback(&mut c, 21, Outcome::Succeeded);
        c.begin_verifying(gate('a', true)).unwrap();
        assert_eq!(
            c.gate_failed(failing(), t(40), RollbackPolicy::Auto),
            Ok(AfterGate::RollbackUnhealthy)
        );
        let g = c.state.gate_failure.clone().unwrap();
        assert_eq!(g.next, AfterGate::RollbackUnhealthy);
        assert!(g.failing.contains_key("after rollback: kubelet"));
        assert_eq!(c.decide(Some(&want('a')), t(50)), Decision::Idle);
        // A fix is the way out; its apply clears the failure.
        assert_eq!(
            c.decide(Some(&want('b')), t(50)),
            Decision::Start(want('b'))
        );
        run(&mut c, 'b', 50, Outcome::Succeeded);
        assert!(c.state.gate_failure.is_none());
    }

    #[test]
    fn a_failed_rollback_after_a_gate_is_unhealthy() {
        let mut c = core();
        run(&mut c, 'a', 0, Outcome::Succeeded);
        c.begin_verifying(gate('a', false)).unwrap();
        c.gate_failed(failing(), t(20), RollbackPolicy::Auto)
            .unwrap();
        rollback(&mut c, 21, Outcome::Failed);
        assert_eq!(
            c.state.gate_failure.as_ref().unwrap().next,
            AfterGate::RollbackUnhealthy
        );
        assert_eq!(c.decide(Some(&want('a')), t(30)), Decision::Idle);
    }

    #[test]
    fn a_failed_gate_is_held_when_manual() {
        let mut c = core();
        run(&mut c, 'a', 0, Outcome::Succeeded);
        c.begin_verifying(gate('a', false)).unwrap();
        assert_eq!(
            c.gate_failed(failing(), t(20), RollbackPolicy::Manual),
            Ok(AfterGate::Manual)
        );
        assert_eq!(c.apply_state(Some(&want('a'))), ApplyState::Failed);
        assert_eq!(c.decide(Some(&want('a')), t(30)), Decision::Idle);
        c.force_retry();
        assert!(c.state.gate_failure.is_none());
        assert_eq!(
            c.decide(Some(&want('a')), t(30)),
            Decision::Start(want('a'))
        );
    }

    #[test]
    fn with_prebuild_a_revision_is_built_then_activated_and_never_built_twice() {
        let mut c = core();
        c.prebuild = true;
        assert_eq!(c.decide(Some(&want('a')), t(0)), Decision::Build(want('a')));
        let id = c
            .begin(InFlight {
                kind: AttemptKind::Build,
                ..attempt('a', Goal::Switch, 0)
            })
            .unwrap();
        assert_eq!(c.apply_state(Some(&want('a'))), ApplyState::Building);
        c.complete(id, ended(Outcome::Succeeded), t(1), POLICY)
            .unwrap();
        assert!(c.state.applied.is_none(), "a build activates nothing");
        assert_eq!(c.state.built.as_ref().unwrap().revision, rev('a'));
        assert_eq!(c.apply_state(Some(&want('a'))), ApplyState::Pending);
        assert_eq!(c.decide(Some(&want('a')), t(2)), Decision::Start(want('a')));
        // The activation fails: retried without building again.
        run(&mut c, 'a', 2, Outcome::Failed);
        let at = c.state.failure.as_ref().unwrap().next_retry_at;
        assert_eq!(c.decide(Some(&want('a')), at), Decision::Start(want('a')));
        run(&mut c, 'a', 100_000, Outcome::Succeeded);
        assert_eq!(c.decide(Some(&want('a')), t(100_002)), Decision::Idle);
        // A new revision is built first; a goal that activates nothing is not prebuilt.
        assert_eq!(
            c.decide(Some(&want('b')), t(100_002)),
            Decision::Build(want('b'))
        );
        let dry = Desired {
            revision: rev('b'),
            goal: Goal::DryActivate,
        };
        assert_eq!(c.decide(Some(&dry), t(100_002)), Decision::Start(dry));
        c.prebuild = false;
        assert_eq!(
            c.decide(Some(&want('b')), t(100_002)),
            Decision::Start(want('b'))
        );
    }

    #[test]
    fn a_failed_build_backs_off_and_is_built_again() {
        let mut c = core();
        c.prebuild = true;
        let id = c
            .begin(InFlight {
                kind: AttemptKind::Build,
                ..attempt('a', Goal::Switch, 0)
            })
            .unwrap();
        c.complete(id, ended(Outcome::Failed), t(1), POLICY)
            .unwrap();
        let f = c.state.failure.clone().unwrap();
        assert_eq!(f.attempts, 1);
        assert!(c.state.built.is_none());
        assert_eq!(
            c.decide(Some(&want('a')), t(2)),
            Decision::RetryAt(f.next_retry_at)
        );
        assert_eq!(c.apply_state(Some(&want('a'))), ApplyState::Failed);
        assert_eq!(
            c.decide(Some(&want('a')), f.next_retry_at),
            Decision::Build(want('a'))
        );
    }

    #[test]
    fn a_passed_gate_records_the_revision_passed() {
        let mut c = core();
        run(&mut c, 'a', 0, Outcome::Succeeded);
        c.begin_verifying(gate('a', false)).unwrap();
        assert!(c.state.passed.is_none());
        c.gate_passed(t(60)).unwrap();
        assert_eq!(c.state.passed, Some(rev('a')));
    }

    #[test]
    fn waiting_for_the_rollout_shows_and_keeps_its_start() {
        let mut c = core();
        assert!(c.set_waiting(Some((WaitingFor::Lock, "held by makise".into())), t(0)));
        assert_eq!(c.apply_state(Some(&want('a'))), ApplyState::Waiting);
        assert!(c.set_waiting(Some((WaitingFor::Lock, "held by quinn".into())), t(5)));
        assert_eq!(c.waiting.as_ref().unwrap().since, t(0));
        c.set_waiting(Some((WaitingFor::Quorum, "makise not Ready".into())), t(6));
        assert_eq!(c.waiting.as_ref().unwrap().since, t(6));
        assert!(!c.set_waiting(Some((WaitingFor::Quorum, "makise not Ready".into())), t(7)));
        // Starting the attempt ends the wait.
        c.begin(attempt('a', Goal::Switch, 8)).unwrap();
        assert!(c.waiting.is_none());
    }

    fn held(c: char) -> TakenSlot {
        TakenSlot {
            backend: crate::state::SlotBackend::Kubernetes,
            group: "workers".into(),
            slot: Some(0),
            revision: rev(c),
            since: t(0),
        }
    }

    #[test]
    fn a_granted_lock_is_recorded_and_a_release_forgets_it() {
        let mut c = core();
        assert_eq!(c.lock_released(), Err(TransitionError::NotHeld));
        assert_eq!(c.lock_granted(Some(held('a'))), Ok(true));
        assert_eq!(c.lock_granted(Some(held('a'))), Ok(false), "the same lock");
        assert_eq!(c.lock_released(), Ok(held('a')));
        assert!(c.state.rollout_held.is_none());
    }

    #[test]
    fn no_lock_is_recorded_while_an_attempt_runs() {
        let mut c = core();
        let id = c.begin(attempt('a', Goal::Switch, 0)).unwrap();
        assert_eq!(
            c.lock_granted(Some(held('a'))),
            Err(TransitionError::AlreadyRunning(id))
        );
        assert!(c.state.rollout_held.is_none());
    }

    #[test]
    fn a_halt_is_recorded_on_the_failed_gate_only() {
        let mut c = core();
        assert_eq!(c.gate_halted(false), Err(TransitionError::NoGateFailure));
        run(&mut c, 'a', 0, Outcome::Succeeded);
        c.begin_verifying(gate('a', false)).unwrap();
        c.gate_failed(failing(), t(20), RollbackPolicy::Auto)
            .unwrap();
        c.gate_halted(true).unwrap();
        let g = c.state.gate_failure.as_ref().unwrap();
        assert!(g.halted && g.quarantined);
    }

    #[test]
    fn a_rollback_that_cannot_start_leaves_the_node_unhealthy() {
        let mut c = core();
        assert_eq!(
            c.rollback_not_started(),
            Err(TransitionError::NoGateFailure)
        );
        run(&mut c, 'a', 0, Outcome::Succeeded);
        c.begin_verifying(gate('a', false)).unwrap();
        c.gate_failed(failing(), t(20), RollbackPolicy::Manual)
            .unwrap();
        assert_eq!(
            c.rollback_not_started(),
            Err(TransitionError::NoRollbackDue),
            "manual: no rollback was asked for"
        );
        c.force_retry();
        run(&mut c, 'a', 30, Outcome::Succeeded);
        c.begin_verifying(gate('a', false)).unwrap();
        c.gate_failed(failing(), t(40), RollbackPolicy::Auto)
            .unwrap();
        c.rollback_not_started().unwrap();
        assert_eq!(
            c.state.gate_failure.as_ref().unwrap().next,
            AfterGate::RollbackUnhealthy
        );
        assert_eq!(c.decide(Some(&want('a')), t(50)), Decision::Idle);
    }

    fn closure(path: &str) -> ClosureInfo {
        serde_json::from_value(
            serde_json::json!({"path": path, "origin": {"kind": "url", "url": "https://pins"}}),
        )
        .expect("a closure")
    }

    #[test]
    fn a_closure_is_kept_until_replaced_or_rolled_back_from() {
        let mut c = core();
        assert_eq!(
            c.closure_seen(None, Outcome::Succeeded),
            Err(TransitionError::NotRunning)
        );
        c.begin(attempt('a', Goal::Switch, 0)).unwrap();
        c.closure_seen(Some(closure("/nix/store/a")), Outcome::Succeeded)
            .unwrap();
        assert_eq!(c.state.closure, Some(closure("/nix/store/a")));
        // An apply without one (it failed before) leaves the last one shown.
        c.closure_seen(None, Outcome::Failed).unwrap();
        assert!(c.state.closure.is_some());
        let mut r = core();
        r.state.closure = Some(closure("/nix/store/a"));
        r.begin(InFlight {
            kind: AttemptKind::Rollback,
            ..attempt('a', Goal::Switch, 1)
        })
        .unwrap();
        r.closure_seen(None, Outcome::Failed).unwrap();
        assert!(
            r.state.closure.is_some(),
            "a failed rollback changed nothing"
        );
        r.closure_seen(None, Outcome::Succeeded).unwrap();
        assert!(r.state.closure.is_none());
    }

    #[test]
    fn an_activation_records_the_system_and_keeps_when_a_reboot_was_first_required() {
        let mut c = core();
        let sys = Some(PathBuf::from("/nix/store/sys-a"));
        c.activated(sys.clone(), vec!["kernel".into()], Some("b1".into()), t(5))
            .unwrap();
        assert_eq!(c.state.expected_system, sys);
        assert_eq!(c.state.reboot.as_ref().unwrap().since, t(5));
        c.activated(None, vec!["kernel".into(), "initrd".into()], None, t(9))
            .unwrap();
        let r = c.state.reboot.as_ref().unwrap();
        assert_eq!((r.since, r.reasons.len()), (t(5), 2));
        c.activated(None, Vec::new(), None, t(10)).unwrap();
        assert!(c.state.reboot.is_none(), "nothing requires one any more");
        let id = c.begin(attempt('a', Goal::Switch, 11)).unwrap();
        assert_eq!(
            c.activated(None, Vec::new(), None, t(12)),
            Err(TransitionError::AlreadyRunning(id))
        );
    }

    #[test]
    fn a_reboot_requirement_is_looked_at_afresh_in_a_new_boot_only() {
        let mut c = core();
        assert!(!c.reboot_reassessed(vec!["kernel".into()], Some("b2".into()), t(1)));
        c.activated(None, vec!["kernel".into()], Some("b1".into()), t(0))
            .unwrap();
        assert!(
            !c.reboot_reassessed(Vec::new(), Some("b1".into()), t(1)),
            "same boot"
        );
        assert!(c.reboot_reassessed(vec!["initrd".into()], Some("b2".into()), t(2)));
        let r = c.state.reboot.clone().unwrap();
        assert_eq!((r.reasons, r.since), (vec!["initrd".to_owned()], t(2)));
        assert!(c.reboot_reassessed(Vec::new(), Some("b3".into()), t(3)));
        assert!(c.state.reboot.is_none());
    }

    #[test]
    fn a_look_at_the_gate_needs_one_open() {
        let mut c = core();
        assert_eq!(c.look_at_gate(|_| ()), Err(TransitionError::NotVerifying));
        run(&mut c, 'a', 0, Outcome::Succeeded);
        c.begin_verifying(gate('a', false)).unwrap();
        c.look_at_gate(|v| v.healthy_since = Some(t(15))).unwrap();
        assert_eq!(c.state.phase.gate().unwrap().healthy_since, Some(t(15)));
    }
}
