//! A slot taken over from a holder that stopped renewing it: what to tell, and what to halt.
//! Pure: the keeper writes the halt and releases the slot.
//!
//! When the vanished holder was activating or verifying a revision, that revision may be what
//! killed it, and the holder may still be at it (cut off, stopped): the revision is halted
//! fleet-wide with the group (`rollout.on_holder_lost = "halt"`), and the group waits until the
//! holder is back and its gate passed, or an operator clears the halt.

use std::collections::BTreeMap;

use jiff::Timestamp;

use crate::config::OnHolderLost;
use crate::rollout::fleet::state::Halt;
use crate::rollout::lock::lease::Vanished;
use crate::types::{HaltCause, Revision};

/// What a take-over comes to.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Takeover {
    /// The vanished holder's revision, when it said which.
    pub theirs: Option<Revision>,
    /// The notice for Events and webhooks.
    pub notice: String,
    /// The halt to write, if any.
    pub halt: Option<Halt>,
    /// The holder was activating, and `on_holder_lost = "proceed"` spares its revision.
    pub spared: bool,
}

/// Who took over what: this node, its group, and the slot Lease's name.
pub(crate) struct Taker<'a> {
    pub me: &'a str,
    pub group: &'a str,
    pub lease: &'a str,
    pub policy: OnHolderLost,
}

pub(crate) fn takeover(v: &Vanished, by: &Taker<'_>, now: Timestamp) -> Takeover {
    let doing = v.doing.clone().unwrap_or_default();
    let theirs: Option<Revision> = doing.revision.as_deref().and_then(|r| r.parse().ok());
    let notice = format!(
        "took over rollout slot {}: its holder {} stopped renewing it while {}{}",
        by.lease,
        v.node,
        doing.phase.as_str(),
        theirs
            .as_ref()
            .map_or(String::new(), |r| format!(" revision {}", r.short()))
    );
    let activating = theirs
        .as_ref()
        .filter(|_| doing.phase.activating() && v.doing.is_some());
    let spared = activating.is_some() && by.policy == OnHolderLost::Proceed;
    let halt = activating
        .filter(|_| by.policy == OnHolderLost::Halt)
        .map(|r| Halt {
            revision: r.clone(),
            node: v.node.clone(),
            probes: BTreeMap::new(),
            reason: format!(
                "holder-vanished: {} stopped renewing its rollout slot ({}) while {} this \
                 revision; {} took the slot over. Lifted by itself if {} comes back and its \
                 gate passes; `ginxctl rollout clear {}` lifts it now",
                v.node,
                by.lease,
                doing.phase.as_str(),
                by.me,
                v.node,
                r.short()
            ),
            at: now,
            cause: HaltCause::HolderVanished,
            group: Some(by.group.to_owned()),
        });
    Takeover {
        theirs,
        notice,
        halt,
        spared,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rollout::lock::lease::{Doing, SlotPhase};

    fn rev() -> Revision {
        "a".repeat(40).parse().unwrap()
    }

    fn vanished(phase: SlotPhase) -> Vanished {
        Vanished {
            node: "makise".into(),
            doing: Some(Doing {
                revision: Some(rev().to_string()),
                phase,
            }),
        }
    }

    fn taker(policy: OnHolderLost) -> Taker<'static> {
        Taker {
            me: "quinn",
            group: "control-plane",
            lease: "ginx-rollout-control-plane-0",
            policy,
        }
    }

    #[test]
    fn a_holder_that_vanished_while_activating_halts_its_revision_with_the_group() {
        let now: Timestamp = "2026-12-04T12:00:00Z".parse().unwrap();
        let t = takeover(
            &vanished(SlotPhase::Applying),
            &taker(OnHolderLost::Halt),
            now,
        );
        let halt = t.halt.expect("a halt");
        assert_eq!(halt.revision, rev());
        assert_eq!(halt.cause, HaltCause::HolderVanished);
        assert_eq!(halt.group.as_deref(), Some("control-plane"));
        assert!(
            halt.reason.contains("quinn took the slot over"),
            "{}",
            halt.reason
        );
        assert!(
            t.notice
                .contains("makise stopped renewing it while applying revision")
        );
    }

    #[test]
    fn nothing_is_halted_when_told_to_proceed_or_when_the_holder_was_done() {
        let now = Timestamp::UNIX_EPOCH;
        let proceed = takeover(
            &vanished(SlotPhase::Applying),
            &taker(OnHolderLost::Proceed),
            now,
        );
        assert!(proceed.halt.is_none());
        assert!(proceed.spared);
        let done = takeover(&vanished(SlotPhase::Done), &taker(OnHolderLost::Halt), now);
        assert!(done.halt.is_none() && !done.spared);
        assert_eq!(done.theirs, Some(rev()));
        let silent = Vanished {
            node: "makise".into(),
            doing: None,
        };
        assert!(
            takeover(&silent, &taker(OnHolderLost::Halt), now)
                .halt
                .is_none()
        );
    }
}
