//! The health gate after an activation (and after a rollback) as the loop runs it: opening it,
//! one look at it per turn, what a pass or a failure leads to, and the automatic rollback. The
//! verdict on the checks is `crate::rollout::decide::gate`'s; the slot held meanwhile is `slot`'s.

use std::time::Instant;

use super::core::Core;
use super::{Attempting, Reconciler};
use crate::config::RollbackPolicy;
use crate::rollout::decide::gate::{self, Rules, Verdict};
use crate::rollout::lock::lease::SlotPhase;
use crate::rollout::{CONTROL_PLANE_REQUIRED, GateStep, Look};
use crate::state::{AfterGate, AttemptKind, Verifying};
use crate::types::{Goal, Reason, Role};
use crate::util;

impl Reconciler {
    /// Logs a step of the wall clock, once, outside a gate (an open gate logs its own): the
    /// maintenance windows follow it; no duration ginx measures does.
    pub(super) fn look_at_clocks(&mut self, now: jiff::Timestamp) {
        let step = self.wall_steps.look(
            now,
            Instant::now(),
            std::time::Duration::from_secs(CLOCK_STEP_SECS.unsigned_abs()),
        );
        if let Some(step) = step
            && self.core.state().phase.gate().is_none()
        {
            tracing::warn!(step = %format!("{step:#}"),
                "the wall clock stepped; maintenance windows follow it, every duration ginx measures keeps its own (monotonic) time");
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
                .state()
                .applied
                .as_ref()
                .map(|a| (a.revision.clone(), false)),
            // After a reboot, the rolled-back generation is verified once it is booted.
            AttemptKind::Rollback
                if self
                    .core
                    .state()
                    .gate_failure
                    .as_ref()
                    .is_some_and(|g| g.next == AfterGate::RolledBack && !g.after_reboot) =>
            {
                self.core.state().rolled_back.clone().map(|r| (r, true))
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
            baseline: match (rollback, &self.core.state().gate_failure) {
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
        let revision = self.core.state().phase.gate().map(|v| v.revision.clone());
        let look = Look {
            step: GateStep::Gate,
            revision: revision.as_ref(),
        };
        let checks = self.gatekeeper.checks(look).await;
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
        let gate_times = &mut self.gate_times;
        let looked = self.core.look_at_gate(|v| {
            let before = v.healthy_since;
            let open = Open {
                rollback: v.rollback,
                after_reboot: v.after_reboot,
                revision: v.revision.clone(),
            };
            let mono = Instant::now();
            let times = gate_clock(gate_times, v, now, mono);
            (
                before,
                open,
                gate::step(v, times, &checks, &rules, mono, now),
            )
        });
        let Ok((before, open, verdict)) = looked else {
            return false;
        };
        match verdict {
            Verdict::Pending { failing, .. } => {
                self.gate_failing = failing;
                let after = self.core.state().phase.gate().and_then(|v| v.healthy_since);
                if after != before {
                    let _ = self.save_state();
                }
                false
            }
            Verdict::Passed => self.gate_passed_now(&open).await,
            Verdict::Failed { failing } => {
                let policy = self.reboot_gate_policy(cfg.rollout.rollback);
                self.gate_failed_now(&open, failing, now, policy)
            }
        }
    }

    /// The open gate passed: recorded, counted and told; a revision's slot is done with.
    async fn gate_passed_now(&mut self, open: &Open) -> bool {
        let revision = &open.revision;
        self.gatekeeper.fast_probes(false);
        self.gate_failing.clear();
        if self.transition(|c| c.gate_passed(util::now())).is_err() {
            return false;
        }
        self.metrics.gate(&format!("{}passed", open.label()));
        if open.after_reboot {
            self.after_reboot_gate(true);
        }
        if open.rollback {
            tracing::warn!(revision = %revision.short(), "the rolled-back system passed its health gate; the revision stays rolled back");
            self.notices.emit(
                Reason::GatePassed,
                Some(revision.as_str()),
                format!(
                    "the rolled-back system passed its health gate; revision {} stays rolled back",
                    revision.short()
                ),
            );
        } else {
            tracing::info!(revision = %revision.short(), "health gate passed");
            self.notices.emit(
                Reason::GatePassed,
                Some(revision.as_str()),
                format!("revision {} passed its health gate", revision.short()),
            );
            self.gatekeeper.set_phase(SlotPhase::Done).await;
            self.gatekeeper.lift_vanished(revision).await;
        }
        true
    }

    /// The open gate failed: recorded with what comes next under `policy`, counted and told.
    fn gate_failed_now(
        &mut self,
        open: &Open,
        failing: std::collections::BTreeMap<String, String>,
        now: jiff::Timestamp,
        policy: RollbackPolicy,
    ) -> bool {
        let revision = &open.revision;
        self.gatekeeper.fast_probes(false);
        let list = failing
            .iter()
            .map(|(k, m)| format!("{k} ({m})"))
            .collect::<Vec<_>>()
            .join("; ");
        self.gate_failing = failing.clone();
        let Ok(next) = self.transition(|c| c.gate_failed(failing, now, policy)) else {
            return false;
        };
        self.metrics.gate(&format!("{}failed", open.label()));
        if open.after_reboot {
            self.after_reboot_gate(false);
        }
        let (reason, what) = failed_notice(next, open.rollback);
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
                let _ = self.transition(Core::rollback_not_started);
                None
            }
        }
    }
}

/// A gap this large between the wall clock's and the monotonic clock's time since a gate opened
/// is a step of the wall clock (NTP slews far less).
const CLOCK_STEP_SECS: i64 = 5;

fn non_negative(d: jiff::SignedDuration) -> std::time::Duration {
    std::time::Duration::try_from(d).unwrap_or_default()
}

/// Whether an apply with `goal` activates something the gate must verify.
pub(super) fn gated(goal: Goal) -> bool {
    matches!(goal, Goal::Switch | Goal::Test)
}

/// What the open gate was for, kept while it is stepped.
struct Open {
    rollback: bool,
    after_reboot: bool,
    revision: crate::types::Revision,
}

impl Open {
    /// The metric's prefix: the rolled-back system's gate is counted apart.
    fn label(&self) -> &'static str {
        if self.rollback { "rollback-" } else { "" }
    }
}

/// The open gate's monotonic times: kept since it opened in this process, or set again from the
/// persisted wall-clock times once (after a restart, or a gate opened after a reboot). A step of
/// the wall clock seen meanwhile is logged once per gate.
fn gate_clock<'a>(
    slot: &'a mut Option<(jiff::Timestamp, gate::Times, bool)>,
    v: &Verifying,
    now: jiff::Timestamp,
    mono: Instant,
) -> &'a mut gate::Times {
    let wall_elapsed = now.duration_since(v.started_at);
    if slot.as_ref().is_some_and(|g| g.0 != v.started_at) {
        *slot = None;
    }
    let (_, times, step_logged) = slot.get_or_insert_with(|| {
        let left = v.deadline.duration_since(now);
        (
            v.started_at,
            gate::Times::resumed(mono, non_negative(wall_elapsed), non_negative(left)),
            false,
        )
    });
    let mono_elapsed = mono.saturating_duration_since(times.opened);
    let drift =
        (wall_elapsed - jiff::SignedDuration::try_from(mono_elapsed).unwrap_or_default()).abs();
    if drift > jiff::SignedDuration::from_secs(CLOCK_STEP_SECS) && !*step_logged {
        *step_logged = true;
        tracing::warn!(revision = %v.revision.short(), wall_elapsed = %format!("{:#}", wall_elapsed),
            gate_elapsed = %format!("{:#}", jiff::SignedDuration::try_from(mono_elapsed).unwrap_or_default()),
            "the wall clock stepped during the health gate; the gate keeps its own (monotonic) time");
    }
    times
}

/// The notice's reason and words for a gate that failed, given what comes next.
fn failed_notice(next: AfterGate, rollback: bool) -> (Reason, &'static str) {
    match next {
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_gate_is_told_by_what_comes_next() {
        assert_eq!(
            failed_notice(AfterGate::RollBack, false).0,
            Reason::GateFailed
        );
        assert!(
            failed_notice(AfterGate::RollBack, false)
                .1
                .starts_with("rolling back")
        );
        assert_eq!(
            failed_notice(AfterGate::RollbackUnhealthy, true).0,
            Reason::RollbackUnhealthy
        );
        assert!(failed_notice(AfterGate::Manual, false).1.contains("manual"));
        assert_eq!(
            failed_notice(AfterGate::RolledBack, true).1,
            "on the rolled-back system"
        );
    }

    #[test]
    fn only_activations_that_run_the_new_system_are_gated() {
        assert!(gated(Goal::Switch) && gated(Goal::Test));
        assert!(!gated(Goal::Boot) && !gated(Goal::Build) && !gated(Goal::DryActivate));
    }
}
