//! The core's transitions of a drain before a live activation (`[disruption]` said `drain`):
//! begun, cordoned, drained, activated, ended. Like the rest of the core: no I/O, no clock (the
//! caller passes `now`), and a transition asked for in a state it does not apply to is refused
//! with an error and changes nothing. Whether such a drain is due, and whether one is over, is
//! `reconcile::reboot::decide`'s; the steps that act on the node are `reboot::live`'s.

use jiff::Timestamp;

use super::{Core, TransitionError};
use crate::state::{ApplyDrain, Disrupting, Measured};
use crate::types::Revision;

impl Core {
    /// A drain before the activation of `revision` begins (nothing cordoned yet).
    pub fn begin_apply_drain(
        &mut self,
        revision: &Revision,
        because: Vec<String>,
        now: Timestamp,
    ) -> Result<(), TransitionError> {
        match &self.state.phase.disrupting {
            Disrupting::LiveDrain(d) => {
                return Err(TransitionError::AlreadyDraining(d.revision.clone()));
            }
            Disrupting::Reboot(_) => return Err(TransitionError::AlreadyRebooting),
            Disrupting::Nothing => {}
        }
        self.state.phase.disrupting = Disrupting::LiveDrain(ApplyDrain {
            revision: revision.clone(),
            because,
            started_at: now,
            cordoned: false,
            drained_at: None,
            activated: false,
        });
        Ok(())
    }

    fn apply_drain_mut(&mut self) -> Result<&mut ApplyDrain, TransitionError> {
        self.state
            .phase
            .live_drain_mut()
            .ok_or(TransitionError::NotDraining)
    }

    /// The node is cordoned; `ours` when ginx made it so (it uncordons it only then).
    pub fn apply_drain_cordoned(&mut self, ours: bool) -> Result<(), TransitionError> {
        let d = self.apply_drain_mut()?;
        d.cordoned = d.cordoned || ours;
        Ok(())
    }

    /// No pod is left to evict: the activation may start.
    pub fn apply_drained(&mut self, now: Timestamp) -> Result<(), TransitionError> {
        let d = self.apply_drain_mut()?;
        if d.drained_at.is_none() {
            d.drained_at = Some(now);
            let started = d.started_at;
            self.state.took.record(Measured::Drain, started, now);
        }
        Ok(())
    }

    /// The activation of the drained revision begins.
    pub fn apply_drain_activated(&mut self) -> Result<(), TransitionError> {
        let d = self.apply_drain_mut()?;
        if d.drained_at.is_none() {
            return Err(TransitionError::NotDrained(d.revision.clone()));
        }
        d.activated = true;
        Ok(())
    }

    /// The drain is over (the node uncordoned if ginx cordoned it, or given up): what it was.
    pub fn end_apply_drain(&mut self) -> Result<ApplyDrain, TransitionError> {
        if self.state.phase.live_drain().is_none() {
            return Err(TransitionError::NotDraining);
        }
        match std::mem::take(&mut self.state.phase.disrupting) {
            Disrupting::LiveDrain(d) => Ok(d),
            _ => Err(TransitionError::NotDraining),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{core, rev, t};
    use super::*;

    #[test]
    fn a_drain_goes_from_begun_to_cordoned_drained_activated_and_ended() {
        let mut c = core();
        let r = rev('a');
        assert_eq!(
            c.apply_drain_cordoned(true),
            Err(TransitionError::NotDraining)
        );
        c.begin_apply_drain(&r, vec!["restarts kubelet.service".into()], t(1))
            .unwrap();
        assert_eq!(
            c.begin_apply_drain(&rev('b'), vec![], t(2)),
            Err(TransitionError::AlreadyDraining(r.clone()))
        );
        // Not drained yet: the activation may not begin.
        assert_eq!(
            c.apply_drain_activated(),
            Err(TransitionError::NotDrained(r.clone()))
        );
        c.apply_drain_cordoned(true).unwrap();
        // A second look finds it cordoned already: still ginx's to uncordon.
        c.apply_drain_cordoned(false).unwrap();
        c.apply_drained(t(5)).unwrap();
        c.apply_drained(t(9)).unwrap();
        // The drain's time is kept for a preview's estimate: once, from the start.
        assert_eq!(c.state().took.drains, [4]);
        c.apply_drain_activated().unwrap();
        let d = c.end_apply_drain().unwrap();
        assert!(d.cordoned && d.activated);
        assert_eq!(d.drained_at, Some(t(5)));
        assert_eq!(d.because, vec!["restarts kubelet.service".to_owned()]);
        assert!(c.state().phase.live_drain().is_none());
        assert_eq!(c.end_apply_drain(), Err(TransitionError::NotDraining));
    }
}
