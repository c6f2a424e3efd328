//! The rollout slot around an attempt: asking the [`Gatekeeper`](crate::rollout::Gatekeeper)
//! before an apply, keeping the slot exactly as long as something needs it, and writing the
//! cluster-wide halt of a revision whose health gate failed here. Not here: the health gate
//! itself (see `verify`) and the verdict on its checks (see `crate::rollout::decide::gate`).

use std::time::Instant;

use super::Reconciler;
use super::core::{Core, Decision, Desired};
use super::verify::gated;
use crate::rollout::decide::gate;
use crate::rollout::lock::lease::SlotPhase;
use crate::rollout::{Halt, Permit};
use crate::state::{AfterGate, AttemptKind};
use crate::status::WaitingFor;
use crate::types::{HaltCause, Reason};

impl Reconciler {
    /// Asks the rollout whether `desired` may be applied now; `true` with the lock (if any)
    /// held and recorded. Otherwise the wait is recorded for status.
    pub(super) async fn ask(&mut self, desired: &Desired) -> bool {
        self.lift_unstarted_vanished().await;
        let held = self.core.state().rollout_held.clone();
        let permit = self
            .gatekeeper
            .permit(&desired.revision, held.as_ref())
            .await;
        match permit {
            Permit::Wait(waiting_for, reason) => {
                let first = self.core.waiting.as_ref().map(|w| w.waiting_for) != Some(waiting_for);
                if self.set_wait(Some((waiting_for, reason.clone()))) && first {
                    tracing::info!(revision = %desired.revision.short(), waiting_for = waiting_for.as_str(),
                        reason = %reason, "waiting to apply");
                }
                false
            }
            Permit::Granted(lock) => {
                self.set_wait(None);
                if lock != self.core.state().rollout_held
                    && let Err(e) = self.transition(|c| c.lock_granted(lock))
                {
                    tracing::error!(error = %e, "cannot record the rollout lock; not applying");
                    return false;
                }
                match self.before_activation(desired).await {
                    Ok(()) => true,
                    Err((waiting_for, why)) => {
                        if self.set_wait(Some((waiting_for, why.clone()))) {
                            tracing::info!(revision = %desired.revision.short(), waiting_for = waiting_for.as_str(),
                                reason = %why, "waiting to activate");
                        }
                        false
                    }
                }
            }
        }
    }

    /// With the slot held, what comes before the activation: the drain the plan calls for
    /// (before the baseline: the gate compares with the drained node), the last look (the
    /// guards asked again, etcd's leadership handed over: the activation may restart etcd),
    /// the gate's baseline, and fencing, last. `Err` with what the activation waits for.
    async fn before_activation(&mut self, desired: &Desired) -> Result<(), (WaitingFor, String)> {
        self.drain_before_activation(&desired.revision).await?;
        if let Err(held) = self
            .gatekeeper
            .last_look(&desired.revision, crate::rollout::Toward::Forward)
            .await
        {
            return Err(self.held_before_activation(&desired.revision, held).await);
        }
        self.live_drain.looked();
        if gated(desired.goal) {
            self.gatekeeper.new_gate();
            self.baseline = gate::baseline(
                &self
                    .gatekeeper
                    .baseline_checks(Some(&desired.revision))
                    .await,
            );
        }
        // Fencing, last before the activation: the slot's last renewal is fresh (or renewed
        // now), and the slot is not lost.
        if let Err(why) = self.gatekeeper.fence().await {
            tracing::warn!(revision = %desired.revision.short(), reason = %why,
                "not starting the activation: the rollout slot is not fresh");
            return Err((why.waiting_for(), why.to_string()));
        }
        Ok(())
    }

    /// Gives the slot back now: an attempt given up must not keep it until the loop next
    /// settles it. A release that fails is tried again by [`settle_lock`](Self::settle_lock).
    pub(super) async fn give_slot_back(&mut self) {
        let Some(held) = self.core.state().rollout_held.clone() else {
            return;
        };
        match self.gatekeeper.release(&held).await {
            Ok(()) => {
                self.lock_retry_at = None;
                let _ = self.transition(Core::lock_released);
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot release the rollout lock; trying again");
                self.lock_retry_at = Some(Instant::now() + crate::rollout::RECHECK);
            }
        }
    }

    /// A `holder-vanished` halt naming this node, of a revision it never started (it lost its
    /// slot before the activation: fencing held it back), is lifted: that revision did not
    /// kill it. One it started stays: only its passed gate, or an operator, lifts that.
    async fn lift_unstarted_vanished(&mut self) {
        let node = self.config.borrow().node_name().to_owned();
        let Some(fleet) = self.gatekeeper.fleet().cloned() else {
            return;
        };
        let st = self.core.state();
        for halt in fleet.halted.values() {
            if halt.cause != HaltCause::HolderVanished || halt.node != node {
                continue;
            }
            let running = st
                .phase
                .attempt()
                .is_some_and(|f| f.revision == halt.revision)
                || st.phase.gate().is_some_and(|v| v.revision == halt.revision);
            let started = running
                || self
                    .history
                    .attempts
                    .iter()
                    .any(|a| a.kind == AttemptKind::Apply && a.revision == halt.revision);
            if !started {
                tracing::warn!(revision = %halt.revision.short(),
                    "a holder-vanished halt names this node for a revision it never started: lifting it");
                self.gatekeeper.lift_vanished(&halt.revision).await;
            }
        }
    }

    /// Releases the lock once nothing needs it: no attempt running, no gate open, no failed
    /// gate keeping it, and no apply of the revision it was taken for about to start.
    pub(super) async fn settle_lock(&mut self, decision: &Decision) {
        let Some(held) = self.core.state().rollout_held.clone() else {
            return;
        };
        // A retry waits, unless the API client it lacked has come meanwhile (after a reboot,
        // the slot is taken up the moment the connection is there, not a retry later).
        if retry_waits(
            self.lock_retry_at,
            Instant::now(),
            self.gatekeeper.clients_changed(),
        ) {
            return;
        }
        let st = self.core.state();
        let kept = st.gate_failure.as_ref().is_some_and(|g| {
            matches!(
                g.next,
                AfterGate::RollBack | AfterGate::RollbackUnhealthy | AfterGate::Manual
            )
        });
        let about_to = matches!(decision, Decision::Start(d) if d.revision == held.revision)
            && self.live_drain.put_off(&held.revision).is_none();
        let needed = st.phase.attempt().is_some()
            || st.phase.gate().is_some()
            || kept
            || about_to
            || self.reboot_keeps_slot();
        if needed {
            if self.gatekeeper.held().is_none() {
                // After a restart: take the slot up again (and renew it from now on).
                let phase = if st.phase.rebooting().is_some() {
                    SlotPhase::Rebooting
                } else if st.phase.gate().is_some() {
                    SlotPhase::Verifying
                } else {
                    SlotPhase::Applying
                };
                if let Err(e) = self.gatekeeper.resume(&held, phase).await {
                    tracing::debug!(error = %e, "cannot resume the rollout lock yet");
                    self.lock_retry_at = Some(Instant::now() + crate::rollout::RECHECK);
                } else {
                    self.lock_retry_at = None;
                }
                // Taken up again, or found lost: status says which now.
                self.publish();
            }
            return;
        }
        self.give_slot_back().await;
    }

    /// Writes the halt of a revision whose gate failed, until it is written.
    pub(super) async fn write_halt(&mut self) {
        let Some(g) = self.core.state().gate_failure.clone() else {
            return;
        };
        if g.halted || !self.gatekeeper.can_halt() {
            return;
        }
        if self.lock_retry_at.is_some_and(|t| t > Instant::now()) {
            return;
        }
        let node = self.config.borrow().node_name().to_owned();
        let reason = format!(
            "health gate failed: {}",
            g.failing
                .iter()
                .map(|(k, m)| format!("{k} ({m})"))
                .collect::<Vec<_>>()
                .join("; ")
        );
        let halt = Halt {
            revision: g.revision.clone(),
            node,
            probes: g.failing.clone(),
            reason,
            at: g.at,
            cause: HaltCause::GateFailed,
            group: None,
        };
        match self.gatekeeper.fail(halt).await {
            Ok(counted) => {
                let budget = self.config.borrow().rollout.halt_after;
                if counted.halted {
                    tracing::warn!(revision = %g.revision.short(), failures = counted.failures, budget,
                        "revision halted cluster-wide: no other node applies it");
                    let me = self.config.borrow().node_name().to_owned();
                    self.notices.emit(
                        Reason::RevisionHalted,
                        Some(g.revision.as_str()),
                        format!(
                            "revision {} halted fleet-wide by {me}: its health gate failed here ({} failure(s), rollout.halt_after = {budget}); `ginxctl rollout clear {}` lifts it",
                            g.revision.short(),
                            counted.failures,
                            g.revision.short()
                        ),
                    );
                } else {
                    self.metrics.quarantined();
                    tracing::warn!(revision = %g.revision.short(), failures = counted.failures, budget,
                        "health gate failed here below the failure budget (rollout.halt_after): this node is quarantined on its rolled-back system; the rollout goes on");
                }
                let quarantined = !counted.halted;
                let _ = self.transition(|c| c.gate_halted(quarantined));
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot halt the revision cluster-wide; trying again");
                self.lock_retry_at = Some(Instant::now() + crate::rollout::RECHECK);
            }
        }
    }
}

/// Whether a lock retry due at `at` still waits at `now`: it does until it is due, unless the
/// API clients it may have lacked were made meanwhile.
fn retry_waits(at: Option<Instant>, now: Instant, clients_changed: bool) -> bool {
    at.is_some_and(|t| t > now) && !clients_changed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_retry_waits_until_due_or_until_the_clients_come() {
        let now = Instant::now();
        let later = now + crate::rollout::RECHECK;
        assert!(!retry_waits(None, now, false), "no retry pending");
        assert!(retry_waits(Some(later), now, false), "not due yet");
        assert!(
            !retry_waits(Some(later), now, true),
            "the clients came: at once"
        );
        assert!(!retry_waits(Some(now), later, false), "due");
    }
}
