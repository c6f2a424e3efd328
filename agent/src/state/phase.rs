//! The node's phase: what it is doing now, as two enums rather than four `Option`s that could
//! be set in any combination.
//!
//! - [`Activity`]: idle, an attempt running, or the health gate after one. Never both: an
//!   attempt that begins closes a gate still open, since that gate judged what ran before.
//! - [`Disrupting`]: what ginx does to the node's service around the activity: nothing, a
//!   drain before a live activation, or a reboot. Never both: a reboot that begins takes over
//!   the cordon a live drain left, and gives the node back when it ends.
//!
//! The two are independent of each other (a reboot's gate is an activity under a reboot).
//! `state.json` keeps the format of earlier versions: the four fields `in_flight`,
//! `verifying`, `rebooting` and `apply_drain`. A file in which an earlier ginx wrote two of a
//! kind at once loads by the same rules as the transitions follow now.

use serde::{Deserialize, Serialize};

use super::{ApplyDrain, InFlight, Rebooting, Verifying};

/// What the node does now.
// One value per daemon: boxing the attempt would save nothing worth a pointer chase.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, Default, PartialEq)]
pub enum Activity {
    #[default]
    Idle,
    /// An attempt runs (an activation, a build, a rollback). Found at start-up, it means ginx
    /// stopped during it.
    Attempt(InFlight),
    /// The health gate after an activation (of a revision, or of the rolled-back system).
    /// Found at start-up, the gate goes on where it was.
    Gate(Verifying),
}

/// What ginx does to the node's service around the activity.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum Disrupting {
    #[default]
    Nothing,
    /// A drain before a live activation its plan called for (`[disruption]`): found at
    /// start-up, it goes on where it was, and the node cordoned by it is uncordoned by it.
    LiveDrain(ApplyDrain),
    /// A reboot ginx carries out (drain, reboot, the gate after it); found at start-up, it goes
    /// on where it was.
    Reboot(Rebooting),
}

/// The node's phase. Stored as the four fields earlier versions wrote.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(from = "Stored", into = "Stored")]
pub struct Phase {
    pub activity: Activity,
    pub disrupting: Disrupting,
}

/// The phase as `state.json` has always carried it.
#[derive(Default, Serialize, Deserialize)]
#[serde(default)]
struct Stored {
    in_flight: Option<InFlight>,
    verifying: Option<Verifying>,
    rebooting: Option<Rebooting>,
    #[serde(skip_serializing_if = "Option::is_none")]
    apply_drain: Option<ApplyDrain>,
}

impl From<Stored> for Phase {
    fn from(s: Stored) -> Phase {
        let activity = match (s.in_flight, s.verifying) {
            (Some(attempt), _) => Activity::Attempt(attempt),
            (None, Some(gate)) => Activity::Gate(gate),
            (None, None) => Activity::Idle,
        };
        let disrupting = match (s.rebooting, s.apply_drain) {
            (Some(reboot), drain) => Disrupting::Reboot(take_over(reboot, drain.as_ref())),
            (None, Some(drain)) => Disrupting::LiveDrain(drain),
            (None, None) => Disrupting::Nothing,
        };
        Phase {
            activity,
            disrupting,
        }
    }
}

impl From<Phase> for Stored {
    fn from(p: Phase) -> Stored {
        let mut s = Stored::default();
        match p.activity {
            Activity::Idle => {}
            Activity::Attempt(a) => s.in_flight = Some(a),
            Activity::Gate(g) => s.verifying = Some(g),
        }
        match p.disrupting {
            Disrupting::Nothing => {}
            Disrupting::LiveDrain(d) => s.apply_drain = Some(d),
            Disrupting::Reboot(r) => s.rebooting = Some(r),
        }
        s
    }
}

/// A reboot that begins while a live drain still keeps the node: the node stays cordoned
/// until the reboot ends, and is uncordoned then if either of them cordoned it.
pub fn take_over(mut reboot: Rebooting, drain: Option<&ApplyDrain>) -> Rebooting {
    reboot.cordoned |= drain.is_some_and(|d| d.cordoned);
    reboot
}

impl Phase {
    pub fn attempt(&self) -> Option<&InFlight> {
        match &self.activity {
            Activity::Attempt(a) => Some(a),
            _ => None,
        }
    }

    pub fn attempt_mut(&mut self) -> Option<&mut InFlight> {
        match &mut self.activity {
            Activity::Attempt(a) => Some(a),
            _ => None,
        }
    }

    pub fn gate(&self) -> Option<&Verifying> {
        match &self.activity {
            Activity::Gate(g) => Some(g),
            _ => None,
        }
    }

    pub fn gate_mut(&mut self) -> Option<&mut Verifying> {
        match &mut self.activity {
            Activity::Gate(g) => Some(g),
            _ => None,
        }
    }

    /// Ends the running attempt, leaving the node idle; `None` (and nothing changed) when none
    /// runs.
    pub fn take_attempt(&mut self) -> Option<InFlight> {
        self.attempt()?;
        match std::mem::take(&mut self.activity) {
            Activity::Attempt(a) => Some(a),
            _ => None,
        }
    }

    /// Closes the open gate, leaving the node idle; `None` (and nothing changed) when none is
    /// open.
    pub fn take_gate(&mut self) -> Option<Verifying> {
        self.gate()?;
        match std::mem::take(&mut self.activity) {
            Activity::Gate(g) => Some(g),
            _ => None,
        }
    }

    pub fn live_drain(&self) -> Option<&ApplyDrain> {
        match &self.disrupting {
            Disrupting::LiveDrain(d) => Some(d),
            _ => None,
        }
    }

    pub fn live_drain_mut(&mut self) -> Option<&mut ApplyDrain> {
        match &mut self.disrupting {
            Disrupting::LiveDrain(d) => Some(d),
            _ => None,
        }
    }

    pub fn rebooting(&self) -> Option<&Rebooting> {
        match &self.disrupting {
            Disrupting::Reboot(r) => Some(r),
            _ => None,
        }
    }

    pub fn rebooting_mut(&mut self) -> Option<&mut Rebooting> {
        match &mut self.disrupting {
            Disrupting::Reboot(r) => Some(r),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{AttemptKind, RebootPhase, State};

    /// `state.json` files as the ginx before this phase wrote them (its transitions, its
    /// serializer), one per combination of the four fields that ginx could write.
    const BEFORE: [(&str, &str); 3] = [
        (
            "live-drain-activating",
            include_str!("../../../tests/golden/state/live-drain-activating.json"),
        ),
        (
            "reboot-gate-after-live-drain",
            include_str!("../../../tests/golden/state/reboot-gate-after-live-drain.json"),
        ),
        (
            "rollback-with-open-gate",
            include_str!("../../../tests/golden/state/rollback-with-open-gate.json"),
        ),
    ];

    fn before(name: &str) -> State {
        let (_, json) = BEFORE.iter().find(|(n, _)| *n == name).unwrap();
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn state_files_of_the_four_fields_load_into_one_phase() {
        let st = before("live-drain-activating");
        let attempt = st.phase.attempt().expect("the attempt is kept");
        assert_eq!((attempt.id, attempt.kind), (1, AttemptKind::Apply));
        let drain = st.phase.live_drain().expect("the live drain is kept");
        assert!(drain.activated && drain.cordoned);
        assert!(st.rollout_held.is_some() && st.applied.is_some());

        // A reboot begun while a live drain still kept the node: one reboot, which owns the
        // cordon now, and its gate.
        let st = before("reboot-gate-after-live-drain");
        let r = st.phase.rebooting().expect("the reboot is kept");
        assert_eq!(r.phase, RebootPhase::Verifying);
        assert!(r.cordoned, "the drain's cordon is the reboot's to lift");
        assert!(st.phase.gate().is_some_and(|g| g.after_reboot));
        assert_eq!(st.took.drains.len(), 2);

        // `ginxctl rollback` while a gate was open: the attempt; the gate judged what ran
        // before it.
        let st = before("rollback-with-open-gate");
        assert_eq!(
            st.phase.attempt().map(|a| a.kind),
            Some(AttemptKind::Rollback)
        );
        assert!(st.phase.gate().is_none());
    }

    #[test]
    fn a_file_of_the_four_fields_loads_from_disk_without_being_moved_aside() {
        let dir = tempfile::tempdir().unwrap();
        for (name, json) in BEFORE {
            let path = dir.path().join(format!("{name}.json"));
            std::fs::write(&path, json).unwrap();
            let (st, moved) = crate::state::load::<State>(&path).unwrap();
            assert!(moved.is_none(), "{name} was moved aside");
            assert_eq!(st, before(name), "{name}");
        }
    }

    #[test]
    fn a_phase_is_stored_as_the_four_fields_it_always_was() {
        for (name, _) in BEFORE {
            let st = before(name);
            let json = serde_json::to_value(&st).unwrap();
            assert_eq!(
                json["in_flight"].is_object(),
                st.phase.attempt().is_some(),
                "{name}"
            );
            assert_eq!(
                json["verifying"].is_object(),
                st.phase.gate().is_some(),
                "{name}"
            );
            assert_eq!(
                json["rebooting"].is_object(),
                st.phase.rebooting().is_some(),
                "{name}"
            );
            assert_eq!(
                json.get("apply_drain").is_some(),
                st.phase.live_drain().is_some(),
                "{name}"
            );
            let again: State = serde_json::from_value(json).unwrap();
            assert_eq!(again, st, "{name} reads back as it was written");
        }
        let idle = serde_json::to_value(State::default()).unwrap();
        assert!(idle["in_flight"].is_null() && idle.get("apply_drain").is_none());
    }

    #[test]
    fn taking_what_is_not_there_changes_nothing() {
        let mut p = Phase {
            activity: Activity::Gate(
                before("reboot-gate-after-live-drain")
                    .phase
                    .gate()
                    .cloned()
                    .unwrap(),
            ),
            ..Phase::default()
        };
        assert!(p.take_attempt().is_none());
        assert!(p.gate().is_some());
        assert!(p.take_gate().is_some());
        assert_eq!(p.activity, Activity::Idle);
    }
}
