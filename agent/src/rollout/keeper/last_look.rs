//! The last look: right before a disruption (the reboot command, an activation), with the slot
//! held and the node drained if it had to be, the guards that protect the cluster's
//! availability are asked again. Admission asked them before the slot, but a drain can take
//! up to `reboot.drain_timeout`, and a member or a control-plane node may fail meanwhile: the
//! node goes down only if the rest of the cluster can lose it as of now.
//!
//! In order: the quorum guard, the alert gate, then etcd, whose look hands the leadership over
//! in the same look that found the cluster fit, so that the disruption follows at once.

use super::*;

/// Where a disruption takes the node: to a new revision, or back from one whose gate failed.
/// A way back is not held by the alert gate: the revision it undoes may be what fires the
/// alerts. It is held by the quorum and etcd guards all the same, since a node going down
/// while the cluster cannot lose it costs the cluster whatever the reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Toward {
    Forward,
    Back,
}

impl Gatekeeper {
    /// Asks the guards again right before a disruption. `Err` with what to wait for and why:
    /// the node stays as it is (its slot, its cordon) and asks again later.
    pub async fn last_look(
        &mut self,
        revision: &Revision,
        toward: Toward,
    ) -> Result<(), (WaitingFor, String)> {
        let cfg = self.cfg();
        let backend = effective(&cfg);
        if cfg.node.role == Role::ControlPlane
            && cfg.rollout.quorum_guard
            && matches!(backend, Effective::Kubernetes | Effective::Fleetlock)
        {
            let answer = match self.clients() {
                Some(c) => crate::rollout::guards::quorum::check(&c, &cfg, None)
                    .await
                    .map_err(|e| admission::lock_error(cfg.rollout.on_api_unavailable, e)),
                None => Err(admission::unavailable(
                    cfg.rollout.on_api_unavailable,
                    "no connection to the Kubernetes API".to_owned(),
                )),
            };
            match answer {
                Ok(None) => {}
                Ok(Some(why)) => return Err((WaitingFor::Quorum, why)),
                // Going on without the API is never going on without etcd's look.
                Err(Verdict::GoWithoutApi(_) | Verdict::Go(_)) => {}
                Err(Verdict::Wait(w)) => return Err((w.waiting_for, w.reason)),
            }
        }
        if let Some(p) = &cfg.rollout.gate.prometheus
            && backend != Effective::Bootstrap
            && toward == Toward::Forward
            && let Some(why) = self.alerts.check(p, revision).await
        {
            return Err((WaitingFor::Alerts, why));
        }
        if cfg.etcd.applies(cfg.node.role) {
            self.etcd
                .last_look(&cfg.etcd, &self.w.notices, revision)
                .await
                .map_err(|why| (WaitingFor::Etcd, why))?;
        }
        Ok(())
    }
}
