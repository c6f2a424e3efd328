//! The rollout around an attempt: asking the [`Gatekeeper`](crate::rollout::Gatekeeper) before
//! an apply, keeping the lock exactly as long as it is needed, the health gate after an
//! activation (and after a rollback), the automatic rollback, and the cluster-wide halt.

use std::time::Instant;

use super::core::{Decision, Desired};
use super::{Attempting, Reconciler};
use crate::config::RollbackPolicy;
use crate::rollout::gate::{self, Rules, Verdict};
use crate::rollout::lease::SlotPhase;
use crate::rollout::{CONTROL_PLANE_REQUIRED, Permit};
use crate::state::{AfterGate, AttemptKind, Verifying};
use crate::status::{Halt, WaitingFor};
use crate::types::{Goal, Reason, Role};
use crate::util;

impl Reconciler {
    /// Asks the rollout whether `desired` may be applied now; `true` with the lock (if any)
    /// held and recorded. Otherwise the wait is recorded for status.
    pub(super) async fn ask(&mut self, desired: &Desired) -> bool {
        self.lift_unstarted_vanished().await;
        let held = self.core.state.rollout_held.clone();
        let permit = self
            .gatekeeper
            .permit(&desired.revision, held.as_ref())
            .await;
        let now = util::now();
        match permit {
            Permit::Wait(waiting_for, reason) => {
                let first = self.core.waiting.as_ref().map(|w| w.waiting_for) != Some(waiting_for);
                if self
                    .core
                    .set_waiting(Some((waiting_for, reason.clone())), now)
                    && first
                {
                    tracing::info!(revision = %desired.revision.short(), waiting_for = waiting_for.as_str(),
                        reason = %reason, "waiting to apply");
                }
                false
            }
            Permit::Granted(lock) => {
                self.core.set_waiting(None, now);
                if lock != self.core.state.rollout_held
                    && let Err(e) = self.change_persisted(|c| c.state.rollout_held = lock)
                {
                    tracing::error!(error = %e, "cannot record the rollout lock; not applying");
                    return false;
                }
                if gated(desired.goal) {
                    self.gatekeeper.new_gate();
                    self.baseline = gate::baseline(&self.gatekeeper.baseline_checks().await);
                }
                // Fencing, last before the activation: the slot's last renewal is fresh (or
                // renewed now), and the slot is not lost.
                if let Err(why) = self.gatekeeper.fence().await {
                    if self
                        .core
                        .set_waiting(Some((WaitingFor::Lock, why.clone())), util::now())
                    {
                        tracing::warn!(revision = %desired.revision.short(), reason = %why,
                            "not starting the activation: the rollout slot is not fresh");
                    }
                    return false;
                }
                true
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
        let st = &self.core.state;
        for halt in fleet.halted.values() {
            if halt.cause != crate::status::HaltCause::HolderVanished || halt.node != node {
                continue;
            }
            let running = st
                .in_flight
                .as_ref()
                .is_some_and(|f| f.revision == halt.revision)
                || st
                    .verifying
                    .as_ref()
                    .is_some_and(|v| v.revision == halt.revision);
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

    /// Logs a step of the wall clock, once, outside a gate (an open gate logs its own): the
    /// maintenance windows follow it; no duration ginx measures does.
    pub(super) fn look_at_clocks(&mut self, now: jiff::Timestamp) {
        let step = self.wall_steps.look(
            now,
            Instant::now(),
            std::time::Duration::from_secs(CLOCK_STEP_SECS.unsigned_abs()),
        );
        if let Some(step) = step
            && self.core.state.verifying.is_none()
        {
            tracing::warn!(step = %format!("{step:#}"),
                "the wall clock stepped; maintenance windows follow it, every duration ginx measures keeps its own (monotonic) time");
        }
    }

    /// Releases the lock once nothing needs it: no attempt running, no gate open, no failed
    /// gate keeping it, and no apply of the revision it was taken for about to start.
    pub(super) async fn settle_lock(&mut self, decision: &Decision) {
        let Some(held) = self.core.state.rollout_held.clone() else {
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
        let st = &self.core.state;
        let kept = st.gate_failure.as_ref().is_some_and(|g| {
            matches!(
                g.next,
                AfterGate::RollBack | AfterGate::RollbackUnhealthy | AfterGate::Manual
            )
        });
        let about_to = matches!(decision, Decision::Start(d) if d.revision == held.revision);
        let needed = st.in_flight.is_some()
            || st.verifying.is_some()
            || kept
            || about_to
            || self.reboot_keeps_slot();
        if needed {
            if self.gatekeeper.held().is_none() {
                // After a restart: take the slot up again (and renew it from now on).
                let phase = if st.rebooting.is_some() {
                    SlotPhase::Rebooting
                } else if st.verifying.is_some() {
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
            }
            return;
        }
        match self.gatekeeper.release(&held).await {
            Ok(()) => {
                self.lock_retry_at = None;
                let _ = self.change_persisted(|c| c.state.rollout_held = None);
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot release the rollout lock; trying again");
                self.lock_retry_at = Some(Instant::now() + crate::rollout::RECHECK);
            }
        }
    }

    /// Writes the halt of a revision whose gate failed, until it is written.
    pub(super) async fn write_halt(&mut self) {
        let Some(g) = self.core.state.gate_failure.clone() else {
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
            cause: crate::status::HaltCause::GateFailed,
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
                let _ = self.change_persisted(|c| {
                    if let Some(g) = c.state.gate_failure.as_mut() {
                        g.halted = true;
                        g.quarantined = quarantined;
                    }
                });
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot halt the revision cluster-wide; trying again");
                self.lock_retry_at = Some(Instant::now() + crate::rollout::RECHECK);
            }
        }
    }

    /// Opens the health gate after a successful activation (of a revision, or of the
    /// rolled-back system). Returns whether one was opened.
    pub(super) fn open_gate(&mut self, kind: AttemptKind, goal: Goal) -> bool {
        let cfg = std::sync::Arc::clone(&self.config.borrow());
        let now = util::now();
        let v = match kind {
            AttemptKind::Apply if gated(goal) => self
                .core
                .state
                .applied
                .as_ref()
                .map(|a| (a.revision.clone(), false)),
            // After a reboot, the rolled-back generation is verified once it is booted.
            AttemptKind::Rollback
                if self
                    .core
                    .state
                    .gate_failure
                    .as_ref()
                    .is_some_and(|g| g.next == AfterGate::RolledBack && !g.after_reboot) =>
            {
                self.core.state.rolled_back.clone().map(|r| (r, true))
            }
            _ => None,
        };
        let Some((revision, rollback)) = v else {
            return false;
        };
        self.gate_times = Some((
            now,
            gate::Times::open(Instant::now(), cfg.rollout.gate.timeout.get()),
            false,
        ));
        let verifying = Verifying {
            revision: revision.clone(),
            rollback,
            started_at: now,
            deadline: util::after(now, cfg.rollout.gate.timeout.get()),
            healthy_since: None,
            baseline: match (rollback, &self.core.state.gate_failure) {
                (true, Some(g)) => g.baseline.clone(),
                _ => std::mem::take(&mut self.baseline),
            },
            after_reboot: false,
        };
        let before = verifying
            .baseline
            .iter()
            .map(|(n, s)| format!("{n}={}", s.as_str()))
            .collect::<Vec<_>>()
            .join(",");
        match self.core.begin_verifying(verifying) {
            Ok(()) => {
                tracing::info!(revision = %revision.short(), rollback, settle = %cfg.rollout.gate.settle,
                    timeout = %cfg.rollout.gate.timeout, baseline = %before, "health gate open");
                self.gatekeeper.new_gate();
                self.gatekeeper.fast_probes(true);
                self.gate_failing.clear();
                true
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot open the health gate");
                false
            }
        }
    }

    /// One look at the open gate. Returns whether it closed (passed or failed).
    pub(super) async fn step_gate(&mut self) -> bool {
        let cfg = std::sync::Arc::clone(&self.config.borrow());
        let checks = self.gatekeeper.checks().await;
        let now = util::now();
        let required: &[&str] = if cfg.node.role == Role::ControlPlane {
            CONTROL_PLANE_REQUIRED
        } else {
            &[]
        };
        let rules = Rules {
            require: cfg.rollout.gate.require,
            settle: cfg.rollout.gate.settle.get(),
            required,
        };
        let Some(v) = self.core.verifying_mut() else {
            return false;
        };
        let before = v.healthy_since;
        let rollback = v.rollback;
        let after_reboot = v.after_reboot;
        let revision = v.revision.clone();
        let mono = Instant::now();
        let wall_elapsed = now.duration_since(v.started_at);
        // The gate's monotonic times: kept since it opened in this process, or set again from
        // the persisted wall-clock times once (after a restart, or a gate opened after a reboot).
        let (_, times, step_logged) = match &mut self.gate_times {
            Some(g) if g.0 == v.started_at => g,
            slot => {
                let left = v.deadline.duration_since(now);
                slot.insert((
                    v.started_at,
                    gate::Times::resumed(mono, non_negative(wall_elapsed), non_negative(left)),
                    false,
                ))
            }
        };
        let mono_elapsed = mono.saturating_duration_since(times.opened);
        let drift =
            (wall_elapsed - jiff::SignedDuration::try_from(mono_elapsed).unwrap_or_default()).abs();
        if drift > jiff::SignedDuration::from_secs(CLOCK_STEP_SECS) && !*step_logged {
            *step_logged = true;
            tracing::warn!(revision = %revision.short(), wall_elapsed = %format!("{:#}", wall_elapsed),
                gate_elapsed = %format!("{:#}", jiff::SignedDuration::try_from(mono_elapsed).unwrap_or_default()),
                "the wall clock stepped during the health gate; the gate keeps its own (monotonic) time");
        }
        let verdict = gate::step(v, times, &checks, &rules, mono, now);
        let label = if rollback { "rollback-" } else { "" };
        match verdict {
            Verdict::Pending { failing, .. } => {
                self.gate_failing = failing;
                let after = self
                    .core
                    .state
                    .verifying
                    .as_ref()
                    .and_then(|v| v.healthy_since);
                if after != before {
                    let _ = self.save_state();
                }
                false
            }
            Verdict::Passed => {
                self.gatekeeper.fast_probes(false);
                self.gate_failing.clear();
                if self.change_persisted(|c| c.gate_passed()).is_err() {
                    return false;
                }
                self.metrics.gate(&format!("{label}passed"));
                if after_reboot {
                    self.after_reboot_gate(true);
                }
                if rollback {
                    tracing::warn!(revision = %revision.short(), "the rolled-back system passed its health gate; the revision stays rolled back");
                    self.notices.emit(
                        Reason::GatePassed,
                        Some(revision.as_str()),
                        format!("the rolled-back system passed its health gate; revision {} stays rolled back", revision.short()),
                    );
                } else {
                    tracing::info!(revision = %revision.short(), "health gate passed");
                    self.notices.emit(
                        Reason::GatePassed,
                        Some(revision.as_str()),
                        format!("revision {} passed its health gate", revision.short()),
                    );
                    self.gatekeeper.set_phase(SlotPhase::Done).await;
                    self.gatekeeper.lift_vanished(&revision).await;
                }
                true
            }
            Verdict::Failed { failing } => {
                self.gatekeeper.fast_probes(false);
                let policy = self.reboot_gate_policy(cfg.rollout.rollback);
                let list = failing
                    .iter()
                    .map(|(k, m)| format!("{k} ({m})"))
                    .collect::<Vec<_>>()
                    .join("; ");
                self.gate_failing = failing.clone();
                let Ok(Ok(next)) = self.change_persisted(|c| c.gate_failed(failing, now, policy))
                else {
                    return false;
                };
                self.metrics.gate(&format!("{label}failed"));
                if after_reboot {
                    self.after_reboot_gate(false);
                }
                let (reason, what) = match next {
                    AfterGate::RollbackUnhealthy => (
                        Reason::RollbackUnhealthy,
                        "the rolled-back system failed its health gate too: the node keeps its rollout slot so that no other node proceeds; fix the node, then `ginxctl retry` or push a fix",
                    ),
                    AfterGate::Manual => (
                        Reason::GateFailed,
                        "halting it and keeping the slot (rollout.rollback = \"manual\")",
                    ),
                    _ if rollback => (Reason::GateFailed, "on the rolled-back system"),
                    _ => (
                        Reason::GateFailed,
                        "rolling back to the previous generation",
                    ),
                };
                self.notices.emit(
                    reason,
                    Some(revision.as_str()),
                    format!(
                        "health gate of revision {} failed: {list}; {what}",
                        revision.short()
                    ),
                );
                match next {
                    AfterGate::RollBack => {
                        tracing::error!(revision = %revision.short(), failing = %list,
                        "health gate failed; rolling back to the previous generation and halting the revision")
                    }
                    AfterGate::Manual => {
                        tracing::error!(revision = %revision.short(), failing = %list,
                        "health gate failed; halting the revision and keeping the slot (rollout.rollback = \"manual\")")
                    }
                    AfterGate::RollbackUnhealthy => {
                        tracing::error!(revision = %revision.short(), failing = %list,
                        "the rolled-back system is unhealthy too: keeping the rollout slot so that no other node proceeds; fix the node, then `ginxctl retry` or push a fix")
                    }
                    AfterGate::RolledBack => {}
                }
                true
            }
        }
    }

    /// The rollback a failed gate asks for (`rollback = "auto"`).
    pub(super) async fn roll_back_after_gate(&mut self) -> Option<Attempting> {
        if self.config.borrow().rollout.rollback == RollbackPolicy::Manual {
            return None;
        }
        match self.start_rollback().await {
            Ok((id, a)) => {
                self.metrics.rolled_back();
                tracing::warn!(
                    attempt = id,
                    "automatic rollback after a failed health gate"
                );
                a
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot roll back after the failed health gate; the node keeps its slot");
                let _ = self.change_persisted(|c| {
                    if let Some(g) = c.state.gate_failure.as_mut() {
                        g.next = AfterGate::RollbackUnhealthy;
                    }
                });
                None
            }
        }
    }
}

/// A gap this large between the wall clock's and the monotonic clock's time since a gate opened
/// is a step of the wall clock (NTP slews far less).
/// Whether a lock retry due at `at` still waits at `now`: it does until it is due, unless the
/// API clients it may have lacked were made meanwhile.
fn retry_waits(at: Option<Instant>, now: Instant, clients_changed: bool) -> bool {
    at.is_some_and(|t| t > now) && !clients_changed
}

const CLOCK_STEP_SECS: i64 = 5;

fn non_negative(d: jiff::SignedDuration) -> std::time::Duration {
    std::time::Duration::try_from(d).unwrap_or_default()
}

/// Whether an apply with `goal` activates something the gate must verify.
fn gated(goal: Goal) -> bool {
    matches!(goal, Goal::Switch | Goal::Test)
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
