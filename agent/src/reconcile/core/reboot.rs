//! The core's transitions of a reboot ginx carries out: begun, cordoned, commanded, up in a new
//! boot with its gate open, put off, done. Like the rest of the core: no I/O, no clock (the
//! caller passes `now`), and a transition asked for in a state it does not apply to is refused
//! with an error and changes nothing. Not here: whether a reboot is due or a drain is late (see
//! `reconcile::reboot::decide`), and the steps that act on the node.

use std::collections::BTreeMap;

use jiff::Timestamp;

use super::{Core, TransitionError};
use crate::state::{
    Activity, AfterGate, Disrupting, Measured, RebootDeferred, RebootPhase, Rebooting, TakenSlot,
    Verifying, phase,
};
use crate::status::HealthStatus;

impl Core {
    /// The reboot's slot is held (`lock`, or the one kept since the apply when none is new):
    /// it begins with the drain. A reboot that was put off is not any more.
    pub fn begin_reboot(
        &mut self,
        lock: Option<TakenSlot>,
        reasons: Vec<String>,
        now: Timestamp,
    ) -> Result<(), TransitionError> {
        let drain = match &self.state.phase.disrupting {
            Disrupting::Reboot(_) => return Err(TransitionError::AlreadyRebooting),
            Disrupting::LiveDrain(d) => Some(d),
            Disrupting::Nothing => None,
        };
        if lock.is_some() {
            self.state.rollout_held = lock;
        }
        self.state.reboot_deferred = None;
        let reboot = Rebooting {
            phase: RebootPhase::Draining,
            started_at: now,
            reasons,
            cordoned: false,
            drain_started_at: None,
            drained_at: None,
            boot_id: None,
            reboot_at: None,
            rollback: false,
            baseline: BTreeMap::new(),
        };
        self.state.phase.disrupting = Disrupting::Reboot(phase::take_over(reboot, drain));
        Ok(())
    }

    /// The reboot under way, if it is in one of `phases`.
    fn rebooting_in(
        &mut self,
        phases: &[RebootPhase],
        expected: &'static str,
    ) -> Result<&mut Rebooting, TransitionError> {
        let r = self
            .state
            .phase
            .rebooting_mut()
            .ok_or(TransitionError::NotRebooting)?;
        if !phases.contains(&r.phase) {
            return Err(TransitionError::WrongRebootPhase {
                expected,
                found: r.phase.as_str(),
            });
        }
        Ok(r)
    }

    /// The node is cordoned (`ours`: by ginx, which uncordons it at the end); the drain's
    /// deadline runs from the first time this is recorded.
    pub fn reboot_cordoned(&mut self, ours: bool, now: Timestamp) -> Result<(), TransitionError> {
        let r = self.rebooting_in(&[RebootPhase::Draining], "draining")?;
        // A live drain's cordon taken over stays ginx's.
        r.cordoned |= ours;
        r.drain_started_at.get_or_insert(now);
        Ok(())
    }

    /// Drained: what is left is the last look and the reboot command. Recorded once: a node
    /// the last look holds is not drained again.
    pub fn reboot_drained(&mut self, now: Timestamp) -> Result<(), TransitionError> {
        let r = self.rebooting_in(&[RebootPhase::Draining], "draining")?;
        r.drained_at.get_or_insert(now);
        Ok(())
    }

    /// The last look let the node go: the reboot command is about to run in the boot
    /// `boot_id`, with the checks as they were before it (`baseline`) for the gate after it.
    pub fn reboot_commanded(
        &mut self,
        boot_id: Option<String>,
        baseline: BTreeMap<String, HealthStatus>,
        now: Timestamp,
    ) -> Result<(), TransitionError> {
        let r = self.rebooting_in(&[RebootPhase::Draining], "draining")?;
        r.phase = RebootPhase::Rebooting;
        r.boot_id = boot_id;
        r.reboot_at = Some(now);
        r.baseline = baseline;
        // The drain is over when the node was drained, not when the last look let it go.
        if let Some(drain) = r.drain_started_at {
            let drained = r.drained_at.unwrap_or(now);
            self.state.took.record(Measured::Drain, drain, drained);
        }
        Ok(())
    }

    /// Up in a new boot: the health gate `v` opens for what the reboot brought up (a gate left
    /// open from before the reboot is replaced).
    pub fn verify_after_reboot(&mut self, v: Verifying) -> Result<(), TransitionError> {
        self.rebooting_in(&[RebootPhase::Rebooting], "rebooting")?;
        let open = self.state.phase.take_gate();
        let up = v.started_at;
        if let Err(e) = self.begin_verifying(v) {
            if let Some(open) = open {
                self.state.phase.activity = Activity::Gate(open);
            }
            return Err(e);
        }
        if let Some(r) = self.state.phase.rebooting_mut() {
            r.phase = RebootPhase::Verifying;
            if let Some(commanded) = r.reboot_at {
                self.state.took.record(Measured::Reboot, commanded, up);
            }
        }
        Ok(())
    }

    /// Nothing (more) to verify after the reboot: what is left is to give the node back.
    pub fn reboot_finishing(&mut self) -> Result<(), TransitionError> {
        let r = self
            .state
            .phase
            .rebooting_mut()
            .ok_or(TransitionError::NotRebooting)?;
        r.phase = RebootPhase::Finishing;
        Ok(())
    }

    /// The gate after the reboot closed: passed, the reboot finishes; failed, it waits for the
    /// rollback a failed gate asks for (which reboots again), or is held for a person when
    /// that rollback is not coming or did not help. Returns the reboot's phase now.
    pub fn reboot_gate_closed(&mut self, passed: bool) -> Result<RebootPhase, TransitionError> {
        let next = self.state.gate_failure.as_ref().map(|g| g.next);
        let r = self
            .state
            .phase
            .rebooting_mut()
            .ok_or(TransitionError::NotRebooting)?;
        r.phase = match (passed, next) {
            (true, _) | (false, None | Some(AfterGate::RolledBack)) => RebootPhase::Finishing,
            (false, Some(AfterGate::RollBack)) => RebootPhase::Verifying,
            (false, Some(AfterGate::RollbackUnhealthy | AfterGate::Manual)) => RebootPhase::Kept,
        };
        Ok(r.phase)
    }

    /// The rollback after a failed gate after a reboot made the previous generation the boot
    /// default: the node is drained and rebooted again, into it, in the same slot.
    pub fn reboot_into_rollback(&mut self) -> Result<(), TransitionError> {
        let r = self
            .state
            .phase
            .rebooting_mut()
            .ok_or(TransitionError::NotRebooting)?;
        r.phase = RebootPhase::Draining;
        r.rollback = true;
        r.drained_at = None;
        Ok(())
    }

    /// The drain took too long: the reboot is dropped and not tried again before `until`.
    pub fn drain_given_up(
        &mut self,
        until: Timestamp,
        reason: String,
    ) -> Result<(), TransitionError> {
        self.rebooting_in(&[RebootPhase::Draining], "draining")?;
        self.state.phase.disrupting = Disrupting::Nothing;
        self.state.reboot_deferred = Some(RebootDeferred { until, reason });
        Ok(())
    }

    /// The node is given back after the reboot. What required it is cleared unless something
    /// still does (`still_required`); a sentinel file older than `now` is not a new request.
    pub fn reboot_done(
        &mut self,
        still_required: bool,
        now: Timestamp,
    ) -> Result<(), TransitionError> {
        self.rebooting_in(
            &[RebootPhase::Finishing, RebootPhase::Kept],
            "finishing or held",
        )?;
        self.state.phase.disrupting = Disrupting::Nothing;
        self.state.rebooted_at = Some(now);
        if !still_required {
            self.state.reboot = None;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{core, failing, gate, rev, rollback, run, t};
    use super::*;
    use crate::config::RollbackPolicy;
    use crate::state::Outcome;

    fn held(c: char) -> TakenSlot {
        TakenSlot {
            backend: crate::state::SlotBackend::Kubernetes,
            group: "workers".into(),
            slot: Some(1),
            revision: rev(c),
            since: t(0),
        }
    }

    fn phase(c: &Core) -> Option<RebootPhase> {
        c.state.phase.rebooting().map(|r| r.phase)
    }

    #[test]
    fn a_reboot_takes_over_the_cordon_a_live_drain_left_and_no_drain_begins_under_it() {
        let mut c = core();
        c.begin_apply_drain(&rev('a'), vec!["containerd".into()], t(0))
            .unwrap();
        c.apply_drain_cordoned(true).unwrap();
        c.apply_drained(t(1)).unwrap();
        c.apply_drain_activated().unwrap();
        run(&mut c, 'a', 2, Outcome::Succeeded);
        c.begin_reboot(None, vec!["kernel".into()], t(10)).unwrap();
        assert!(
            c.state.phase.live_drain().is_none(),
            "one disruption at a time"
        );
        // Cordoned already, by ginx's drain: the reboot's cordon is ginx's to lift.
        c.reboot_cordoned(false, t(11)).unwrap();
        assert!(c.state.phase.rebooting().is_some_and(|r| r.cordoned));
        assert_eq!(
            c.begin_apply_drain(&rev('b'), vec![], t(12)),
            Err(TransitionError::AlreadyRebooting)
        );
        assert_eq!(c.end_apply_drain(), Err(TransitionError::NotDraining));
        assert_eq!(phase(&c), Some(RebootPhase::Draining));
    }

    /// A core whose reboot is under way, drained and commanded in boot `b1`.
    fn commanded() -> Core {
        let mut c = core();
        run(&mut c, 'a', 0, Outcome::Succeeded);
        c.begin_reboot(Some(held('a')), vec!["kernel".into()], t(10))
            .unwrap();
        c.reboot_cordoned(true, t(11)).unwrap();
        c.reboot_commanded(Some("b1".into()), BTreeMap::new(), t(12))
            .unwrap();
        c
    }

    #[test]
    fn a_reboot_begins_draining_with_its_slot_and_forgets_a_put_off() {
        let mut c = core();
        c.state.reboot_deferred = Some(RebootDeferred {
            until: t(5),
            reason: "drain given up".into(),
        });
        c.begin_reboot(Some(held('a')), vec!["kernel".into()], t(10))
            .unwrap();
        assert_eq!(phase(&c), Some(RebootPhase::Draining));
        assert_eq!(c.state.rollout_held, Some(held('a')));
        assert!(c.state.reboot_deferred.is_none());
        assert_eq!(
            c.begin_reboot(None, Vec::new(), t(11)),
            Err(TransitionError::AlreadyRebooting)
        );
    }

    #[test]
    fn a_reboot_without_a_new_lock_keeps_the_slot_held_since_the_apply() {
        let mut c = core();
        c.state.rollout_held = Some(held('a'));
        c.begin_reboot(None, Vec::new(), t(10)).unwrap();
        assert_eq!(c.state.rollout_held, Some(held('a')));
    }

    #[test]
    fn the_drain_deadline_starts_at_the_first_cordon() {
        let mut c = core();
        assert_eq!(
            c.reboot_cordoned(true, t(1)),
            Err(TransitionError::NotRebooting)
        );
        c.begin_reboot(None, Vec::new(), t(10)).unwrap();
        c.reboot_cordoned(false, t(11)).unwrap();
        c.reboot_cordoned(true, t(20)).unwrap();
        let r = c.state.phase.rebooting().unwrap();
        assert_eq!((r.cordoned, r.drain_started_at), (true, Some(t(11))));
    }

    #[test]
    fn drained_once_while_the_last_look_holds_and_the_drain_measured_to_it() {
        let mut c = core();
        assert_eq!(c.reboot_drained(t(1)), Err(TransitionError::NotRebooting));
        c.begin_reboot(None, Vec::new(), t(10)).unwrap();
        c.reboot_cordoned(true, t(11)).unwrap();
        c.reboot_drained(t(15)).unwrap();
        c.reboot_drained(t(25)).unwrap();
        let r = c.state.phase.rebooting().unwrap();
        assert_eq!(r.drained_at, Some(t(15)), "the first time it was drained");
        // The last look held it until 40: the drain took 4 s, not 29.
        c.reboot_commanded(None, BTreeMap::new(), t(40)).unwrap();
        assert_eq!(c.state.took.drains, [4]);
        assert!(c.reboot_drained(t(41)).is_err(), "not draining any more");
    }

    #[test]
    fn draining_to_rebooting_records_the_boot_left() {
        let c = commanded();
        let r = c.state.phase.rebooting().unwrap();
        assert_eq!(r.phase, RebootPhase::Rebooting);
        assert_eq!(
            (r.boot_id.as_deref(), r.reboot_at),
            (Some("b1"), Some(t(12)))
        );
        assert_eq!(c.state.took.drains, [1], "cordoned at 11, drained at 12");
        let mut c = c;
        assert_eq!(
            c.reboot_cordoned(true, t(13)),
            Err(TransitionError::WrongRebootPhase {
                expected: "draining",
                found: "rebooting"
            })
        );
    }

    #[test]
    fn up_in_a_new_boot_the_gate_opens() {
        let mut c = commanded();
        let mut v = gate('a', false);
        v.after_reboot = true;
        v.started_at = t(40);
        c.verify_after_reboot(v).unwrap();
        assert_eq!(phase(&c), Some(RebootPhase::Verifying));
        assert_eq!(c.state.took.reboots, [28], "commanded at 12, up at 40");
        assert!(c.state.phase.gate().unwrap().after_reboot);
        assert_eq!(
            c.verify_after_reboot(gate('a', false)),
            Err(TransitionError::WrongRebootPhase {
                expected: "rebooting",
                found: "verifying"
            })
        );
    }

    #[test]
    fn a_gate_refused_after_the_reboot_changes_nothing() {
        let mut c = commanded();
        assert_eq!(
            c.verify_after_reboot(gate('b', false)),
            Err(TransitionError::NotActive(rev('b')))
        );
        assert_eq!(phase(&c), Some(RebootPhase::Rebooting));
        assert!(c.state.phase.gate().is_none());
        c.reboot_finishing().unwrap();
        assert_eq!(phase(&c), Some(RebootPhase::Finishing));
    }

    #[test]
    fn the_gate_after_a_reboot_decides_the_reboot_phase() {
        let mut c = commanded();
        c.verify_after_reboot(gate('a', false)).unwrap();
        c.gate_passed(t(60)).unwrap();
        assert_eq!(c.state.took.gates, [50], "opened at 10, passed at 60");
        assert!(
            c.state.took.reboots.is_empty(),
            "up before the command: no sample"
        );
        assert_eq!(c.reboot_gate_closed(true), Ok(RebootPhase::Finishing));

        let mut c = commanded();
        c.verify_after_reboot(gate('a', false)).unwrap();
        c.gate_failed(failing(), t(20), RollbackPolicy::Auto)
            .unwrap();
        assert_eq!(
            c.reboot_gate_closed(false),
            Ok(RebootPhase::Verifying),
            "waits for the rollback"
        );

        let mut c = commanded();
        c.verify_after_reboot(gate('a', false)).unwrap();
        c.gate_failed(failing(), t(20), RollbackPolicy::Manual)
            .unwrap();
        assert_eq!(c.reboot_gate_closed(false), Ok(RebootPhase::Kept));

        assert_eq!(
            core().reboot_gate_closed(true),
            Err(TransitionError::NotRebooting)
        );
    }

    #[test]
    fn a_rollback_after_the_reboot_drains_and_reboots_again() {
        let mut c = commanded();
        c.verify_after_reboot(gate('a', false)).unwrap();
        c.gate_failed(failing(), t(20), RollbackPolicy::Auto)
            .unwrap();
        c.reboot_gate_closed(false).unwrap();
        rollback(&mut c, 21, Outcome::Succeeded);
        if let Some(r) = c.state.phase.rebooting_mut() {
            r.drained_at = Some(t(12));
        }
        c.reboot_into_rollback().unwrap();
        let r = c.state.phase.rebooting().unwrap();
        assert_eq!((r.phase, r.rollback), (RebootPhase::Draining, true));
        assert_eq!(
            r.drained_at, None,
            "drained again for the rollback's reboot"
        );
        assert_eq!(
            core().reboot_into_rollback(),
            Err(TransitionError::NotRebooting)
        );
    }

    #[test]
    fn a_drain_given_up_puts_the_reboot_off() {
        let mut c = core();
        c.begin_reboot(Some(held('a')), Vec::new(), t(10)).unwrap();
        c.drain_given_up(t(500), "pods refused".into()).unwrap();
        assert!(c.state.phase.rebooting().is_none());
        assert_eq!(c.state.reboot_deferred.as_ref().unwrap().until, t(500));
        assert_eq!(
            c.drain_given_up(t(600), "again".into()),
            Err(TransitionError::NotRebooting)
        );
        let mut c = commanded();
        assert!(c.drain_given_up(t(600), "late".into()).is_err());
        assert_eq!(phase(&c), Some(RebootPhase::Rebooting));
    }

    #[test]
    fn a_reboot_done_clears_what_required_it_unless_something_still_does() {
        let mut c = commanded();
        c.activated(None, vec!["kernel".into()], Some("b1".into()), t(12))
            .unwrap();
        assert!(c.reboot_done(false, t(30)).is_err(), "not finishing yet");
        c.reboot_finishing().unwrap();
        c.reboot_done(true, t(30)).unwrap();
        assert!(c.state.phase.rebooting().is_none() && c.state.reboot.is_some());
        assert_eq!(c.state.rebooted_at, Some(t(30)));

        let mut c = commanded();
        c.reboot_finishing().unwrap();
        c.reboot_done(false, t(31)).unwrap();
        assert!(c.state.reboot.is_none());
    }
}
