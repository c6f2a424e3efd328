//! The fleet state as the gatekeeper knows it: the `ginx-rollout` ConfigMap, watched while
//! the node has a cluster, read before a take unless the watch has seen no change since the
//! last read (and that read is young), and always read again after a take.
//!
//! The read after the take is the one a halt or a pause must pass: it is ordered after the
//! slot's write, so a halt written before the take is seen. The read before it only spares a
//! waiting node a request per look. Owns the watch and the copy; does not own what the state
//! means (admission).

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use tokio::sync::watch;

use crate::config::Config;
use crate::k8s::{KubeClients, describe, refusal, unavailable};
use crate::rollout::decide::admission::{self, Purpose, Verdict};
use crate::rollout::fleet::Fleet;
use crate::rollout::fleet::state::FleetState;
use crate::rollout::lock::lease;
use crate::status::WaitingFor;
use crate::types::Revision;

/// The read before a take is taken from the last read while the watch has seen no change
/// since, and that read is younger than this.
const CACHED_FOR: Duration = Duration::from_secs(30);

/// What is watched, to restart the watch when it changes.
#[derive(Clone, PartialEq, Eq)]
struct Key {
    namespace: String,
    name: String,
    clients: usize,
}

#[derive(Default)]
pub(crate) struct FleetCache {
    /// The fleet state as last read.
    pub state: Option<FleetState>,
    watching: Option<(Key, watch::Sender<bool>)>,
    /// Bumped by the watch (after its list, and at every change).
    seen: Option<watch::Receiver<u64>>,
    /// When [`state`](Self::state) was last read: the watch's count then, and the time.
    read: Option<(u64, Instant)>,
}

/// Whether a copy read at `read` (the watch's count then, and when) still stands for the
/// ConfigMap at `now`, the watch's count being `seen` (0: the watch has not listed yet).
fn current(read: Option<(u64, Instant)>, seen: u64, have: bool, now: Instant) -> bool {
    seen > 0
        && have
        && read.is_some_and(|(n, at)| n == seen && now.saturating_duration_since(at) < CACHED_FOR)
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
    /// Starts (or restarts, when the clients are made again) the watch of the ConfigMap; a
    /// change bumps `changes`, which wakes a waiting node like any other change.
    pub fn watch(
        &mut self,
        cfg: &Config,
        clients: &KubeClients,
        generation: usize,
        changes: &watch::Sender<u64>,
    ) {
        let key = Key {
            namespace: cfg.kubernetes.namespace.clone(),
            name: cfg.rollout.configmap.clone(),
            clients: generation,
        };
        if self.watching.as_ref().is_some_and(|(k, _)| *k == key) {
            return;
        }
        let (stop_tx, mut stop) = watch::channel(false);
        let api = kube::Api::<ConfigMap>::namespaced(clients.watch.clone(), &key.namespace);
        let fields = format!("metadata.name={}", key.name);
        let (seen_tx, seen) = watch::channel(0);
        let mut forward = seen.clone();
        let changes = changes.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = lease::watch_objects(api, String::new(), Some(fields), seen_tx, None) => {}
                _ = stop.changed() => {}
            }
        });
        tokio::spawn(async move {
            while forward.changed().await.is_ok() {
                changes.send_modify(|n| *n = n.wrapping_add(1));
            }
        });
        self.watching = Some((key, stop_tx));
        self.seen = Some(seen);
        self.read = None;
    }

    /// The fleet state before a take: the copy, while it stands, or a fresh read. A failed
    /// read is the verdict to answer with.
    pub async fn before_take(
        &mut self,
        cfg: &Config,
        clients: &KubeClients,
    ) -> Result<(), Verdict> {
        let seen = self.seen.as_ref().map_or(0, |r| *r.borrow());
        if current(self.read, seen, self.state.is_some(), Instant::now()) {
            return Ok(());
        }
        let fleet = fleet_of(cfg, clients);
        match fleet.read().await {
            Ok(s) => {
                self.state = Some(s);
                self.read = Some((seen, Instant::now()));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_stands_while_the_watch_saw_no_change_and_it_is_young() {
        let t0 = Instant::now();
        let later = |s| t0 + Duration::from_secs(s);
        assert!(current(Some((3, t0)), 3, true, later(29)));
        assert!(!current(Some((3, t0)), 4, true, later(1)), "a change seen");
        assert!(!current(Some((3, t0)), 3, true, later(30)), "too old");
        assert!(
            !current(Some((0, t0)), 0, true, later(1)),
            "the watch never listed"
        );
        assert!(!current(None, 3, true, later(1)), "never read");
        assert!(!current(Some((3, t0)), 3, false, later(1)), "no copy");
    }
}
