//! What the loop publishes for status: the apply part and what the machine runs.

use super::Reconciler;
use crate::apply::system;
use crate::rollout::decide::window::WindowState;
use crate::state::{Activity, AfterGate, AttemptKind, RebootPhase, State, TakenSlot};
use crate::status::{
    ApplyState, ApplyStatus, FreezeStatus, GateProgress, HaltStatus, HoldStatus, PauseStatus,
    Phase, Published, RebootStatus, RolloutStatus, SystemStatus, WaitingFor, WindowStatus,
};
use crate::types::{HaltCause, Revision};
use crate::util;

fn window_status(windows: &[crate::config::Window]) -> Option<WindowStatus> {
    match crate::rollout::decide::window::state(windows, util::now()) {
        WindowState::Always => None,
        WindowState::Open { closes_at } => Some(WindowStatus {
            open: true,
            closes_at: Some(closes_at),
            opens_at: None,
        }),
        WindowState::Closed { opens_at } => Some(WindowStatus {
            open: false,
            closes_at: None,
            opens_at,
        }),
    }
}

/// The change freeze holding now, else the next one.
fn freeze_status(freezes: &[crate::config::Freeze]) -> Option<FreezeStatus> {
    let now = util::now();
    crate::rollout::decide::freeze::current_or_next(freezes, now).map(|f| FreezeStatus {
        active: f.starts_at <= now,
        reason: f.reason,
        starts_at: f.starts_at,
        ends_at: f.ends_at,
    })
}

/// How long until the maintenance windows open or close, or a change freeze begins or ends,
/// next (a moment after, so that the state has changed by then): the loop publishes status
/// again then, also while idle.
pub(super) fn until_window_edge(
    windows: &[crate::config::Window],
    freezes: &[crate::config::Freeze],
) -> Option<std::time::Duration> {
    let now = util::now();
    let window_edge = match crate::rollout::decide::window::state(windows, now) {
        WindowState::Always => None,
        WindowState::Open { closes_at } => Some(closes_at),
        WindowState::Closed { opens_at } => opens_at,
    };
    let freeze_edge = crate::rollout::decide::freeze::current_or_next(freezes, now).map(|f| {
        if f.starts_at <= now {
            f.ends_at
        } else {
            f.starts_at
        }
    });
    let edge = window_edge.into_iter().chain(freeze_edge).min()?;
    let d = now.duration_until(edge);
    // The sleep runs on the monotonic clock and the edge is on the wall clock: cut at a minute,
    // so that a step of the wall clock moves the wake-up with it.
    Some(
        (std::time::Duration::try_from(d).unwrap_or_default()
            + std::time::Duration::from_millis(20))
        .min(WINDOW_EDGE_RECHECK),
    )
}

/// The longest sleep toward a window's edge.
const WINDOW_EDGE_RECHECK: std::time::Duration = std::time::Duration::from_secs(60);

fn h_group(held: Option<&TakenSlot>) -> String {
    held.map(|h| h.group.clone()).unwrap_or_default()
}

/// The rollout phase status shows, from the persisted state and the apply's state.
fn phase_of(st: &State, state: ApplyState) -> Phase {
    let rebooting = st.phase.rebooting().map(|r| r.phase);
    let failed = st.gate_failure.as_ref().map(|g| g.next);
    match (&st.phase.activity, failed) {
        (Activity::Idle, _) if rebooting == Some(RebootPhase::Draining) => Phase::Draining,
        (Activity::Idle, _) if rebooting == Some(RebootPhase::Rebooting) => Phase::Rebooting,
        (Activity::Idle, _) if rebooting == Some(RebootPhase::Finishing) => Phase::Verifying,
        (Activity::Attempt(r), _) if r.kind == AttemptKind::Rollback => Phase::RollingBack,
        (Activity::Attempt(r), _) if r.kind == AttemptKind::Build => Phase::Building,
        (Activity::Attempt(_), _) => Phase::Applying,
        (Activity::Gate(v), _) if v.rollback => Phase::VerifyingRollback,
        (Activity::Gate(_), _) => Phase::Verifying,
        (Activity::Idle, Some(AfterGate::RollBack)) => Phase::RollingBack,
        (Activity::Idle, Some(AfterGate::RollbackUnhealthy)) => Phase::RollbackUnhealthy,
        (Activity::Idle, Some(AfterGate::Manual)) => Phase::Failed,
        (Activity::Idle, Some(AfterGate::RolledBack))
            if st.gate_failure.as_ref().is_some_and(|g| g.quarantined) =>
        {
            Phase::Quarantined
        }
        _ => match state {
            ApplyState::Waiting => Phase::Waiting,
            ApplyState::Succeeded => Phase::Succeeded,
            ApplyState::RolledBack => Phase::RolledBack,
            ApplyState::Failed => Phase::Failed,
            ApplyState::Applying => Phase::Applying,
            ApplyState::Building => Phase::Building,
            ApplyState::Verifying => Phase::Verifying,
            ApplyState::Idle | ApplyState::Pending => Phase::Idle,
        },
    }
}

/// The halt this node's own failed gate wrote (not a quarantine), as status shows it.
fn own_halt(st: &State, node: &str) -> Option<HaltStatus> {
    st.gate_failure
        .as_ref()
        .filter(|g| g.halted && !g.quarantined)
        .map(|g| HaltStatus {
            revision: g.revision.clone(),
            node: node.to_owned(),
            probes: g.failing.clone(),
            reason: "health gate failed on this node".to_owned(),
            at: g.at,
            cause: HaltCause::GateFailed,
            group: None,
        })
}

/// This node's quarantine: its gate failed below the failure budget (`halt_after`) and it
/// rolled back.
fn quarantine_of(st: &State, halt_after: u32) -> Option<crate::status::Quarantine> {
    st.gate_failure
        .as_ref()
        .filter(|g| g.quarantined && g.next == AfterGate::RolledBack)
        .map(|g| crate::status::Quarantine {
            revision: g.revision.clone(),
            failing: g.failing.clone(),
            at: g.at,
            reason: format!(
                "its health gate failed here below the failure budget \
                 (rollout.halt_after = {halt_after}); rolled back and kept out of the rollout of \
                 {}: `ginxctl retry` or a new revision ends it",
                g.revision.short()
            ),
        })
}

impl Reconciler {
    fn system_status(&self) -> SystemStatus {
        let cfg = self.config.borrow();
        let reboot = self.core.state().reboot.as_ref();
        SystemStatus {
            generation: system::generation(&cfg.system.profile),
            current_system: system::resolve(&cfg.system.current_system),
            booted_system: system::resolve(&cfg.system.booted_system),
            reboot_required: reboot.is_some(),
            reboot_reasons: reboot.map(|r| r.reasons.clone()).unwrap_or_default(),
            drift: self.drift.clone(),
        }
    }

    /// The open gate's progress (`rollout.gate`), if a gate is open.
    fn gate_progress(&self, settle: std::time::Duration) -> Option<GateProgress> {
        let v = self.core.state().phase.gate()?;
        Some(GateProgress {
            revision: Some(v.revision.clone()),
            rollback: v.rollback,
            started_at: Some(v.started_at),
            healthy_since: v.healthy_since,
            deadline: Some(v.deadline),
            failing: self.gate_failing.clone(),
            passes_at: v.healthy_since.and_then(|t| t.checked_add(settle).ok()),
        })
    }

    /// `apply.reason` while verifying: a text that stays true until the gate changes (times,
    /// not durations).
    fn gate_reason(&self, cfg: &crate::config::Config) -> String {
        let settle = cfg.rollout.gate.settle.get();
        match (self.gate_progress(settle), &self.core.state().gate_failure) {
            (Some(g), _) => g.describe(None),
            (None, Some(_)) => {
                "health gate failed; rolling back to the previous generation".to_owned()
            }
            (None, None) => "verifying".to_owned(),
        }
    }

    fn rollout_status(&self, target: Option<&Revision>, state: ApplyState) -> RolloutStatus {
        let cfg = self.config.borrow();
        let st = self.core.state();
        let held = st.rollout_held.as_ref();
        // A lost slot says so above all: whatever runs under it started before the loss.
        let phase = if self.gatekeeper.lost() {
            Phase::Lost
        } else {
            phase_of(st, state)
        };
        let waiting_for = if st.suspended && state == ApplyState::Waiting {
            Some(WaitingFor::Suspended)
        } else {
            self.core.waiting.as_ref().map(|w| w.waiting_for)
        };
        let fleet = self.gatekeeper.fleet();
        RolloutStatus {
            lock: crate::rollout::effective(&cfg).as_str().to_owned(),
            group: cfg.rollout.group_for(cfg.node.role),
            max_concurrent: cfg.rollout.max_concurrent,
            phase,
            target_revision: target.cloned(),
            slot: held.and_then(|h| h.slot),
            lease: held.and_then(|h| h.slot).map(|i| {
                format!(
                    "{}/{}",
                    cfg.kubernetes.namespace,
                    crate::config::RolloutConfig::slot_lease(&h_group(held), i)
                )
            }),
            holders: self.gatekeeper.holders().clone(),
            waiting_for,
            reason: self.core.waiting.as_ref().map(|w| w.reason.clone()),
            waiting_since: self.core.waiting.as_ref().map(|w| w.since),
            gate: self.gate_progress(cfg.rollout.gate.settle.get()),
            halt: target
                .and_then(|t| fleet.and_then(|f| f.halt_of(t)))
                .map(HaltStatus::from)
                .or_else(|| own_halt(st, cfg.node_name())),
            paused: fleet.and_then(|f| f.paused.as_ref()).map(PauseStatus::from),
            hold: fleet
                .and_then(|f| f.hold_of(cfg.node_name(), util::now()))
                .map(HoldStatus::from),
            window: window_status(&cfg.rollout.windows),
            freeze: freeze_status(&cfg.rollout.freezes),
            reboot: self.reboot_status(&cfg),
            passed_revision: st.passed.clone(),
            quarantined: quarantine_of(st, cfg.rollout.halt_after),
            after: cfg.rollout.after_for(cfg.node.role),
            canaries: cfg.rollout.first.clone(),
        }
    }

    fn reboot_status(&self, cfg: &crate::config::Config) -> RebootStatus {
        let st = self.core.state();
        let r = st.phase.rebooting();
        let v = &self.reboot_view;
        let active = r.is_some_and(|r| r.phase == RebootPhase::Draining);
        let deferred = st
            .reboot_deferred
            .as_ref()
            .filter(|d| d.until > util::now());
        RebootStatus {
            mode: cfg.reboot.mode.as_str().to_owned(),
            required: !self.reboot_reasons().is_empty() || r.is_some(),
            phase: r.map(|r| r.phase.as_str().to_owned()),
            started_at: r.map(|r| r.started_at),
            cordoned: r.is_some_and(|r| r.cordoned),
            waiting_for: v
                .waiting
                .as_ref()
                .map(|(w, _)| w.as_str().to_owned())
                .or_else(|| deferred.map(|_| WaitingFor::Window.as_str().to_owned())),
            reason: v
                .waiting
                .as_ref()
                .map(|(_, why)| why.clone())
                .or_else(|| deferred.map(|d| d.reason.clone())),
            evicting: if active {
                v.evicting.clone()
            } else {
                Vec::new()
            },
            refused: if active {
                v.refused.clone()
            } else {
                Default::default()
            },
            deferred_until: deferred.map(|d| d.until),
            window: window_status(cfg.reboot.windows(&cfg.rollout)),
        }
    }

    /// Why the apply is in `state`, in words; `held` when it is held only because the state
    /// cannot be written, `failure` the wanted revision's.
    fn apply_reason(
        &self,
        cfg: &crate::config::Config,
        state: ApplyState,
        held: bool,
        failure: Option<&crate::state::Failure>,
    ) -> Option<String> {
        let st = self.core.state();
        match state {
            ApplyState::Idle => Some(
                match self
                    .sources
                    .borrow()
                    .get(&cfg.apply.source)
                    .and_then(|s| s.error.clone())
                {
                    Some(e) => format!("nothing to apply from {}: {e}", cfg.apply.source),
                    None => format!("waiting for the first fetch of {}", cfg.apply.source),
                },
            ),
            ApplyState::Waiting if held => self.unsaved.as_ref().map(|u| {
                format!(
                    "{}: nothing is applied until the state can be written (tried again every {}s)",
                    u.error,
                    super::PERSIST_RETRY.as_secs()
                )
            }),
            ApplyState::Waiting if st.suspended => {
                Some("suspended: run `ginxctl resume` to apply".to_owned())
            }
            ApplyState::Waiting => self.core.waiting.as_ref().map(|w| w.reason.clone()),
            ApplyState::Verifying => Some(self.gate_reason(cfg)),
            ApplyState::Failed if failure.is_none() && st.gate_failure.is_some() => {
                st.gate_failure.as_ref().map(|g| {
                    let failing = g.failing.keys().cloned().collect::<Vec<_>>().join(", ");
                    match g.next {
                        AfterGate::RollbackUnhealthy => format!(
                            "health gate failed ({failing}) and the rolled-back system is \
                             unhealthy too: the rollout slot is kept; fix the node, then \
                             `ginxctl retry` or push a fix"
                        ),
                        _ => format!(
                            "health gate failed ({failing}); halted and kept \
                             (rollout.rollback = \"manual\"): roll back or fix, then \
                             `ginxctl retry` or push a fix"
                        ),
                    }
                })
            }
            ApplyState::Failed => failure.map(|f| {
                if f.exhausted {
                    "given up: waiting for a new revision or `ginxctl retry`".to_owned()
                } else {
                    format!(
                        "attempt {} failed; retrying at {}",
                        f.attempts, f.next_retry_at
                    )
                }
            }),
            ApplyState::RolledBack => {
                Some("rolled back: waiting for a new revision or `ginxctl retry`".to_owned())
            }
            _ => None,
        }
    }

    pub(super) fn publish(&self) {
        let desired = self.desired().map(|(d, _)| d);
        let cfg = self.config.borrow();
        let st = self.core.state();
        let mut state = self.core.apply_state(desired.as_ref());
        // An open gate cannot close either while the state cannot be written: its verdict
        // would not be on disk.
        let held = self.unsaved.is_some()
            && st.phase.attempt().is_none()
            && matches!(
                state,
                ApplyState::Pending | ApplyState::Failed | ApplyState::Verifying
            );
        if held {
            state = ApplyState::Waiting;
        }
        let failure = st
            .failure
            .as_ref()
            .filter(|f| Some(&f.revision) == desired.as_ref().map(|d| &d.revision));
        let revision = match (st.phase.attempt(), state) {
            (Some(r), _) => Some(r.revision.clone()),
            (None, ApplyState::Succeeded) => st.applied.as_ref().map(|a| a.revision.clone()),
            _ => desired.as_ref().map(|d| d.revision.clone()),
        };
        let reason = self.apply_reason(&cfg, state, held, failure);
        let apply = ApplyStatus {
            state,
            source: cfg.apply.source.clone(),
            revision,
            goal: st
                .phase
                .attempt()
                .map(|r| r.goal)
                .or(desired.as_ref().map(|d| d.goal))
                .unwrap_or(cfg.apply.goal),
            started_at: self.last.map(|l| l.0),
            finished_at: self.last.and_then(|l| l.1),
            attempts: failure.map_or(0, |f| f.attempts),
            error: failure.map(|f| f.error.clone()),
            applied_revision: st.applied.as_ref().map(|a| a.revision.clone()),
            applied_at: st.applied.as_ref().map(|a| a.at),
            next_retry_at: failure.filter(|f| !f.exhausted).map(|f| f.next_retry_at),
            given_up: failure.is_some_and(|f| f.exhausted),
            reason,
            isolation: self.isolation.name().to_owned(),
            mode: cfg.apply.mode.as_str().to_owned(),
            closure: st
                .phase
                .attempt()
                .and_then(|r| r.closure.clone())
                .or_else(|| st.closure.clone())
                .filter(|_| cfg.apply.mode == crate::config::ApplyMode::Closure),
            plan: next_plan(st),
            drain: st
                .phase
                .live_drain()
                .map(|d| crate::status::ApplyDrainStatus {
                    revision: d.revision.clone(),
                    because: d.because.clone(),
                    started_at: d.started_at,
                    cordoned: d.cordoned,
                    drained_at: d.drained_at,
                    activated: d.activated,
                }),
        };
        drop(cfg);
        let next = Published {
            apply,
            system: self.system_status(),
            suspended: st.suspended,
            state_write: self.unsaved.clone(),
            rollout: self.rollout_status(desired.as_ref().map(|d| &d.revision), state),
        };
        self.published.send_if_modified(|p| {
            let changed = *p != next;
            if changed {
                if p.rollout.phase != next.rollout.phase {
                    // One line per phase, with the phase as a field: `journalctl -u ginx
                    // PHASE=verifying` finds every gate.
                    tracing::info!(
                        phase = next.rollout.phase.as_str(),
                        revision = next
                            .rollout
                            .target_revision
                            .as_ref()
                            .map_or("-", |r| r.short()),
                        "rollout phase"
                    );
                }
                *p = next;
            }
            changed
        });
    }
}

/// The plan of the revision built and not applied yet, if one was computed.
fn next_plan(st: &crate::state::State) -> Option<crate::status::PlanStatus> {
    let built = st.built.as_ref()?;
    let applied = st.applied.as_ref().map(|a| &a.revision);
    if applied == Some(&built.revision) {
        return None;
    }
    Some(crate::status::PlanStatus::of(
        &built.revision,
        built.plan.as_ref()?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Idle status must not say a window is open after it closed: the loop wakes at the edge.
    #[test]
    fn the_loop_wakes_at_the_next_window_edge() {
        assert_eq!(until_window_edge(&[], &[]), None);
        let now = util::now().in_tz("UTC").unwrap();
        let day = |d: jiff::civil::Weekday| {
            format!("{d:?}")
                .to_lowercase()
                .chars()
                .take(3)
                .collect::<String>()
        };
        // A window that opened a minute ago and lasts two: its close is about a minute away.
        let start = now - jiff::SignedDuration::from_secs(60);
        let w: crate::config::Window = toml::from_str(&format!(
            "days = [\"{}\"]\nstart = \"{:02}:{:02}:{:02}\"\nlength = \"2m\"\n",
            day(start.weekday()),
            start.hour(),
            start.minute(),
            start.second()
        ))
        .unwrap();
        let d = until_window_edge(&[w], &[]).unwrap();
        assert!(
            d > std::time::Duration::from_secs(50) && d <= std::time::Duration::from_secs(61),
            "{d:?}"
        );
    }

    #[test]
    fn the_rollout_phase_follows_the_state() {
        let mut st = State::default();
        assert_eq!(phase_of(&st, ApplyState::Idle), Phase::Idle);
        assert_eq!(phase_of(&st, ApplyState::Waiting), Phase::Waiting);
        st.phase.disrupting = crate::state::Disrupting::Reboot(crate::state::Rebooting {
            phase: RebootPhase::Draining,
            started_at: util::now(),
            reasons: Vec::new(),
            cordoned: false,
            drain_started_at: None,
            drained_at: None,
            boot_id: None,
            reboot_at: None,
            rollback: false,
            baseline: Default::default(),
        });
        assert_eq!(phase_of(&st, ApplyState::Succeeded), Phase::Draining);
        st.phase.disrupting = crate::state::Disrupting::Nothing;
        st.gate_failure = Some(crate::state::GateFailure {
            revision: "a".repeat(40).parse().unwrap(),
            failing: Default::default(),
            at: util::now(),
            next: AfterGate::RolledBack,
            halted: true,
            quarantined: true,
            baseline: Default::default(),
            after_reboot: false,
        });
        assert_eq!(phase_of(&st, ApplyState::RolledBack), Phase::Quarantined);
        assert!(
            own_halt(&st, "makise").is_none(),
            "a quarantine halts nobody"
        );
        assert!(
            quarantine_of(&st, 3)
                .unwrap()
                .reason
                .contains("halt_after = 3")
        );
        if let Some(g) = st.gate_failure.as_mut() {
            g.quarantined = false;
            g.next = AfterGate::Manual;
        }
        assert_eq!(phase_of(&st, ApplyState::Failed), Phase::Failed);
        assert_eq!(own_halt(&st, "makise").unwrap().node, "makise");
        assert!(quarantine_of(&st, 3).is_none());
    }
}
