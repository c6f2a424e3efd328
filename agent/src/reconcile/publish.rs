//! What the loop publishes for status: the apply part and what the machine runs.

use super::Reconciler;
use crate::apply::system;
use crate::status::{ApplyState, ApplyStatus, Published, SystemStatus};

impl Reconciler {
    fn system_status(&self) -> SystemStatus {
        let cfg = self.config.borrow();
        let reboot = self.core.state.reboot.as_ref();
        SystemStatus {
            generation: system::generation(&cfg.system.profile),
            current_system: system::resolve(&cfg.system.current_system),
            booted_system: system::resolve(&cfg.system.booted_system),
            reboot_required: reboot.is_some(),
            reboot_reasons: reboot.map(|r| r.reasons.clone()).unwrap_or_default(),
            drift: self.drift.clone(),
        }
    }

    pub(super) fn publish(&self) {
        let desired = self.desired().map(|(d, _)| d);
        let cfg = self.config.borrow();
        let st = &self.core.state;
        let mut state = self.core.apply_state(desired.as_ref());
        let held = self.unsaved.is_some()
            && st.in_flight.is_none()
            && matches!(state, ApplyState::Pending | ApplyState::Failed);
        if held {
            state = ApplyState::Waiting;
        }
        let failure = st
            .failure
            .as_ref()
            .filter(|f| Some(&f.revision) == desired.as_ref().map(|d| &d.revision));
        let revision = match (&st.in_flight, state) {
            (Some(r), _) => Some(r.revision.clone()),
            (None, ApplyState::Succeeded) => st.applied.as_ref().map(|a| a.revision.clone()),
            _ => desired.as_ref().map(|d| d.revision.clone()),
        };
        let reason = match state {
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
            ApplyState::Waiting => Some("suspended: run `ginxctl resume` to apply".to_owned()),
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
        };
        let apply = ApplyStatus {
            state,
            source: cfg.apply.source.clone(),
            revision,
            goal: st
                .in_flight
                .as_ref()
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
        };
        drop(cfg);
        let next = Published {
            apply,
            system: self.system_status(),
            suspended: st.suspended,
            state_write: self.unsaved.clone(),
            rollout: crate::status::RolloutStatus::default(),
        };
        self.published.send_if_modified(|p| {
            let changed = *p != next;
            if changed {
                *p = next;
            }
            changed
        });
    }
}
