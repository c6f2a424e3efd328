//! The fleet state as the gatekeeper judged it: the `ginx-rollout` ConfigMap as the read
//! model's watch saw it before a take, and always read again after a take.
//!
//! The read after the take is the one a halt or a pause must pass: it is ordered after the
//! slot's write, so a halt written before the take is seen. The one before it comes from the
//! watch and costs a waiting node no request. Owns the copy; does not own the watch (the read
//! model) nor what the state means (admission).

use crate::config::Config;
use crate::k8s::{KubeClients, describe, refusal, unavailable};
use crate::rollout::decide::admission::{self, Purpose, Verdict};
use crate::rollout::fleet::Fleet;
use crate::rollout::fleet::state::FleetState;
use crate::status::WaitingFor;
use crate::types::Revision;

#[derive(Default)]
pub(crate) struct FleetCache {
    /// The fleet state as last judged.
    pub state: Option<FleetState>,
}

/// The fleet state's ConfigMap, as ginx's own identity reads and writes it.
pub(crate) fn fleet_of(cfg: &Config, clients: &KubeClients) -> Fleet {
    Fleet::new(
        clients.main.clone(),
        &cfg.kubernetes.namespace,
        &cfg.rollout.configmap,
    )
}

impl FleetCache {
    /// The fleet state before a take: as the read model's watch saw it (`watched`), or, until
    /// that watch listed, a read of its own. A failed read is the verdict to answer with.
    pub async fn before_take(
        &mut self,
        cfg: &Config,
        clients: &KubeClients,
        watched: Option<FleetState>,
    ) -> Result<(), Verdict> {
        if let Some(s) = watched {
            self.state = Some(s);
            return Ok(());
        }
        let fleet = fleet_of(cfg, clients);
        match fleet.read().await {
            Ok(s) => {
                self.state = Some(s);
                Ok(())
            }
            Err(e) if unavailable(&e) => Err(admission::unavailable(
                cfg.rollout.on_api_unavailable,
                format!(
                    "cannot read the rollout state {}: {}",
                    fleet.object(),
                    describe(&e)
                ),
            )),
            Err(e) => Err(admission::refused(refusal(
                "get",
                &format!("ConfigMap {}", fleet.object()),
                &e,
            ))),
        }
    }

    /// The fleet state read again after a slot was taken: the wait it imposes, if any (an
    /// unreadable state is a wait too: the slot is given back).
    pub async fn after_take(
        &mut self,
        cfg: &Config,
        clients: &KubeClients,
        revision: &Revision,
        purpose: Purpose,
        resuming_own: bool,
    ) -> Option<Verdict> {
        let fleet = fleet_of(cfg, clients);
        let state = match fleet.read().await {
            Ok(s) => s,
            Err(e) => {
                let waiting_for = if unavailable(&e) {
                    WaitingFor::Api
                } else {
                    WaitingFor::Refused
                };
                return Some(Verdict::Wait(admission::Wait {
                    waiting_for,
                    reason: format!(
                        "cannot read the rollout state {} again after taking a slot: {}",
                        fleet.object(),
                        describe(&e)
                    ),
                    until: None,
                }));
            }
        };
        let group = cfg.rollout.group_for(cfg.node.role);
        let whom = admission::Whom {
            node: cfg.node_name(),
            group: &group,
            resuming_own,
        };
        let wait = admission::held_back(&state, revision, purpose, &whom, crate::util::now());
        self.state = Some(state);
        if wait.is_some() {
            tracing::info!(revision = %revision.short(),
                "the rollout state changed while the slot was taken; giving it back");
        }
        wait
    }
}
