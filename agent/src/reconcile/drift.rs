//! Drift: the running system compared with the one ginx produced last.

use super::Reconciler;
use crate::apply::system;
use crate::config::DriftPolicy;
use crate::status::Drift;
use crate::util;

impl Reconciler {
    /// Compares the running system with the one ginx produced last.
    pub(super) fn check_drift(&mut self) {
        let (current_path, policy) = {
            let cfg = self.config.borrow();
            (cfg.system.current_system.clone(), cfg.apply.on_drift)
        };
        let expected = self.core.state().expected_system.clone();
        let current = system::resolve(&current_path);
        match (expected, current) {
            (Some(expected), Some(current)) if expected != current => {
                if self.drift.as_ref().is_some_and(|d| d.current == current) {
                    return;
                }
                tracing::warn!(expected = %expected.display(), current = %current.display(), policy = ?policy,
                    "the running system is not the one ginx produced (changed by hand?)");
                self.notices.emit(
                    crate::types::Reason::DriftDetected,
                    None,
                    format!(
                        "the running system {} is not the one ginx produced ({}); changed by hand? apply.on_drift = {}",
                        current.display(),
                        expected.display(),
                        match policy {
                            DriftPolicy::Report => "report",
                            DriftPolicy::Reapply => "reapply",
                        }
                    ),
                );
                self.drift = Some(Drift {
                    expected,
                    current,
                    since: util::now(),
                });
                if policy == DriftPolicy::Reapply {
                    self.core.request_reapply();
                }
            }
            _ => {
                if self.drift.take().is_some() {
                    tracing::info!("the running system is the one ginx produced again");
                }
            }
        }
    }
}
