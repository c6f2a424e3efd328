//! The pure core of the apply loop: given what was applied, what failed, whether ginx is
//! suspended and which revision the source offers, decide what to do next. No I/O, no clock:
//! the caller passes `now`.

use std::time::Duration;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::config::Goal;
use crate::source::Revision;
use crate::state::{Applied, Failure, InFlight, Outcome, State};
use crate::util;

/// `apply.state` in `ginxctl status --json`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ApplyState {
    /// Nothing to apply yet (no revision fetched).
    #[default]
    Idle,
    /// A new revision is about to be applied.
    Pending,
    /// A revision is wanted but a gate holds it back (suspended).
    Waiting,
    Applying,
    /// After activation, while health is being verified (later).
    Verifying,
    /// The wanted revision is applied.
    Succeeded,
    /// The wanted revision failed; see `next_retry_at`.
    Failed,
    RolledBack,
}

impl ApplyState {
    pub fn as_str(self) -> &'static str {
        match self {
            ApplyState::Idle => "idle",
            ApplyState::Pending => "pending",
            ApplyState::Waiting => "waiting",
            ApplyState::Applying => "applying",
            ApplyState::Verifying => "verifying",
            ApplyState::Succeeded => "succeeded",
            ApplyState::Failed => "failed",
            ApplyState::RolledBack => "rolled-back",
        }
    }
}

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
    /// Nothing is wanted, or it is applied already.
    Idle,
    /// Apply this revision now.
    Start(Desired),
    /// The wanted revision failed; try again at this time.
    RetryAt(Timestamp),
    /// Something is wanted but ginx is suspended.
    Suspended,
    /// An attempt is running.
    Busy,
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
}

/// Retry policy for failed revisions.
#[derive(Clone, Copy, Debug)]
pub struct RetryPolicy {
    pub base: Duration,
    pub max: Duration,
}

/// The persisted state plus what only lives in memory.
#[derive(Clone, Debug)]
pub struct Core {
    pub state: State,
    /// `ginxctl sync` asked to retry a failed revision without waiting for its backoff.
    retry_now: bool,
}

impl Core {
    pub fn new(state: State) -> Self {
        Self {
            state,
            retry_now: false,
        }
    }

    pub fn running(&self) -> Option<&InFlight> {
        self.state.in_flight.as_ref()
    }

    /// Whether `desired` is what was applied last (same revision, same goal).
    fn is_applied(&self, desired: &Desired) -> bool {
        self.state
            .applied
            .as_ref()
            .is_some_and(|a| a.revision == desired.revision && a.goal == desired.goal)
    }

    pub fn decide(&self, desired: Option<&Desired>, now: Timestamp) -> Decision {
        if self.state.in_flight.is_some() {
            return Decision::Busy;
        }
        let Some(desired) = desired else {
            return Decision::Idle;
        };
        if self.is_applied(desired) {
            return Decision::Idle;
        }
        if self.state.suspended {
            return Decision::Suspended;
        }
        match &self.state.failure {
            Some(f)
                if f.revision == desired.revision && !self.retry_now && now < f.next_retry_at =>
            {
                Decision::RetryAt(f.next_retry_at)
            }
            _ => Decision::Start(desired.clone()),
        }
    }

    /// Idle → applying.
    pub fn begin(
        &mut self,
        source: &str,
        revision: Revision,
        goal: Goal,
        now: Timestamp,
    ) -> Result<u64, TransitionError> {
        if let Some(r) = &self.state.in_flight {
            return Err(TransitionError::AlreadyRunning(r.id));
        }
        let id = self.state.next_attempt_id;
        self.state.next_attempt_id += 1;
        self.state.in_flight = Some(InFlight {
            id,
            source: source.to_owned(),
            revision,
            goal,
            started_at: now,
            pgid: None,
            boot_id: None,
            start_time: None,
        });
        self.retry_now = false;
        Ok(id)
    }

    /// Records the process group of the running attempt.
    pub fn set_process(
        &mut self,
        pgid: i32,
        boot_id: Option<String>,
        start_time: Option<u64>,
    ) -> Result<(), TransitionError> {
        let r = self
            .state
            .in_flight
            .as_mut()
            .ok_or(TransitionError::NotRunning)?;
        r.pgid = Some(pgid);
        r.boot_id = boot_id;
        r.start_time = start_time;
        Ok(())
    }

    /// Applying → idle, recording the outcome.
    pub fn complete(
        &mut self,
        id: u64,
        outcome: Outcome,
        error: Option<String>,
        now: Timestamp,
        policy: RetryPolicy,
    ) -> Result<InFlight, TransitionError> {
        let running = self
            .state
            .in_flight
            .as_ref()
            .ok_or(TransitionError::NotRunning)?;
        if running.id != id {
            return Err(TransitionError::WrongAttempt {
                running: running.id,
                finished: id,
            });
        }
        let done = self
            .state
            .in_flight
            .take()
            .ok_or(TransitionError::NotRunning)?;
        match outcome {
            Outcome::Succeeded => {
                self.state.applied = Some(Applied {
                    source: done.source.clone(),
                    revision: done.revision.clone(),
                    goal: done.goal,
                    at: now,
                });
                self.state.failure = None;
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
                });
            }
            // Not the revision's fault: it is tried again without counting a failure.
            Outcome::Interrupted => {}
        }
        Ok(done)
    }

    /// Returns whether anything changed.
    pub fn set_suspended(&mut self, suspended: bool) -> bool {
        let changed = self.state.suspended != suspended;
        self.state.suspended = suspended;
        changed
    }

    /// A failed revision is retried at once instead of after its backoff.
    pub fn request_retry(&mut self) {
        self.retry_now = true;
    }

    /// The state shown for the apply, given what the source offers.
    pub fn apply_state(&self, desired: Option<&Desired>) -> ApplyState {
        if self.state.in_flight.is_some() {
            return ApplyState::Applying;
        }
        let Some(desired) = desired else {
            return if self.state.applied.is_some() {
                ApplyState::Succeeded
            } else {
                ApplyState::Idle
            };
        };
        if self.is_applied(desired) {
            return ApplyState::Succeeded;
        }
        if self.state.suspended {
            return ApplyState::Waiting;
        }
        match &self.state.failure {
            Some(f) if f.revision == desired.revision => ApplyState::Failed,
            _ => ApplyState::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: RetryPolicy = RetryPolicy {
        base: Duration::from_secs(30),
        max: Duration::from_secs(300),
    };

    fn rev(c: char) -> Revision {
        c.to_string().repeat(40).parse().unwrap()
    }

    fn want(c: char) -> Desired {
        Desired {
            revision: rev(c),
            goal: Goal::Switch,
        }
    }

    fn t(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    fn core() -> Core {
        Core::new(State::default())
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
        let id = c.begin("h", rev('a'), Goal::Switch, t(0)).unwrap();
        assert_eq!(c.apply_state(Some(&want('a'))), ApplyState::Applying);
        assert_eq!(c.decide(Some(&want('b')), t(1)), Decision::Busy);
        assert_eq!(
            c.begin("h", rev('b'), Goal::Switch, t(1)),
            Err(TransitionError::AlreadyRunning(id))
        );
    }

    #[test]
    fn success_records_applied_and_is_never_applied_again() {
        let mut c = core();
        let id = c.begin("h", rev('a'), Goal::Switch, t(0)).unwrap();
        c.complete(id, Outcome::Succeeded, None, t(5), POLICY)
            .unwrap();
        assert_eq!(c.state.applied.as_ref().unwrap().revision, rev('a'));
        assert_eq!(c.decide(Some(&want('a')), t(6)), Decision::Idle);
        assert_eq!(c.apply_state(Some(&want('a'))), ApplyState::Succeeded);
        // After a restart the persisted state says the same.
        let again = Core::new(c.state.clone());
        assert_eq!(again.decide(Some(&want('a')), t(100)), Decision::Idle);
    }

    #[test]
    fn failure_backs_off_exponentially() {
        let mut c = core();
        let mut expected = [30, 60, 120, 240, 300, 300].into_iter();
        let mut now = t(0);
        for n in 1..=6 {
            let id = c.begin("h", rev('a'), Goal::Switch, now).unwrap();
            c.complete(id, Outcome::Failed, Some("exit 1".into()), now, POLICY)
                .unwrap();
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
    fn a_new_revision_is_not_held_back_by_the_old_failure() {
        let mut c = core();
        let id = c.begin("h", rev('a'), Goal::Switch, t(0)).unwrap();
        c.complete(id, Outcome::Failed, None, t(1), POLICY).unwrap();
        assert_eq!(c.decide(Some(&want('b')), t(2)), Decision::Start(want('b')));
        let id = c.begin("h", rev('b'), Goal::Switch, t(2)).unwrap();
        c.complete(id, Outcome::Failed, None, t(3), POLICY).unwrap();
        assert_eq!(
            c.state.failure.as_ref().unwrap().attempts,
            1,
            "counts per revision"
        );
    }

    #[test]
    fn sync_retries_a_failed_revision_at_once() {
        let mut c = core();
        let id = c.begin("h", rev('a'), Goal::Switch, t(0)).unwrap();
        c.complete(id, Outcome::TimedOut, None, t(1), POLICY)
            .unwrap();
        assert!(matches!(
            c.decide(Some(&want('a')), t(2)),
            Decision::RetryAt(_)
        ));
        c.request_retry();
        assert_eq!(c.decide(Some(&want('a')), t(2)), Decision::Start(want('a')));
        c.begin("h", rev('a'), Goal::Switch, t(2)).unwrap();
        // The request is used up by the attempt it caused.
        let id = c.running().unwrap().id;
        c.complete(id, Outcome::Failed, None, t(3), POLICY).unwrap();
        assert!(matches!(
            c.decide(Some(&want('a')), t(4)),
            Decision::RetryAt(_)
        ));
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
    fn interrupted_is_retried_without_counting_a_failure() {
        let mut c = core();
        let id = c.begin("h", rev('a'), Goal::Switch, t(0)).unwrap();
        c.complete(id, Outcome::Interrupted, None, t(1), POLICY)
            .unwrap();
        assert!(c.state.failure.is_none());
        assert_eq!(c.decide(Some(&want('a')), t(1)), Decision::Start(want('a')));
    }

    #[test]
    fn completing_the_wrong_attempt_is_refused() {
        let mut c = core();
        assert_eq!(
            c.complete(0, Outcome::Succeeded, None, t(0), POLICY)
                .unwrap_err(),
            TransitionError::NotRunning
        );
        let id = c.begin("h", rev('a'), Goal::Switch, t(0)).unwrap();
        assert_eq!(
            c.complete(id + 1, Outcome::Succeeded, None, t(0), POLICY)
                .unwrap_err(),
            TransitionError::WrongAttempt {
                running: id,
                finished: id + 1
            }
        );
        assert!(c.running().is_some());
    }

    #[test]
    fn the_same_revision_with_another_goal_is_applied_again() {
        let mut c = core();
        let id = c.begin("h", rev('a'), Goal::Test, t(0)).unwrap();
        c.complete(id, Outcome::Succeeded, None, t(1), POLICY)
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
    fn attempt_ids_are_never_reused() {
        let mut c = core();
        let a = c.begin("h", rev('a'), Goal::Switch, t(0)).unwrap();
        c.complete(a, Outcome::Succeeded, None, t(1), POLICY)
            .unwrap();
        let b = c.begin("h", rev('b'), Goal::Switch, t(2)).unwrap();
        assert!(b > a);
    }
}
