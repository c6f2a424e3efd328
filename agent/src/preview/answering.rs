//! The daemon's side of `ginxctl plan REF`: read the plan requests in the fleet's ConfigMap,
//! answer each once (fetch, build, plan: [`plan_ref`](super::plan_ref)), one at a time, and
//! publish the answers, which the reporter writes on the node's heartbeat Lease
//! (`ginx.io/previews`).
//!
//! The requests come from the daemon's one watch of the ConfigMap (the rollout's read model,
//! [`FleetFeed`]), looked at when it changes. Nothing here takes a slot, writes the state or
//! the history, or activates anything.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::watch;

use super::store::{self, Answered};
use crate::config::Config;
use crate::rollout::view::FleetFeed;
use crate::status::{KubeState, KubeStatus};
use crate::types::{PlanRequest, PreviewAnswer, PreviewOutcome};

pub struct Answering {
    pub config: watch::Receiver<Arc<Config>>,
    /// The fleet ConfigMap as the daemon's one watch of it holds it.
    pub fleet: FleetFeed,
    /// Requests are read only while the node's report is accepted (`connected`): a node the
    /// API refuses (a missing namespace, credentials without the rights) asks nothing more of
    /// it than the reporter does.
    pub kube: watch::Receiver<KubeStatus>,
    /// The answers shown: what the reporter writes on the heartbeat.
    pub answers: watch::Sender<Vec<PreviewAnswer>>,
    pub shutdown: watch::Receiver<bool>,
}

/// The file this node keeps its answers in.
pub fn answers_file(cfg: &Config) -> PathBuf {
    super::root(cfg).join("answers.json")
}

impl Answering {
    pub async fn run(mut self) {
        let file = answers_file(&self.config.borrow());
        let mut done = store::load(&file);
        self.answers.send_replace(done.answers.clone());
        loop {
            let connected = self.kube.borrow_and_update().state == KubeState::Connected;
            let cfg = Arc::clone(&self.config.borrow());
            if let Some(standing) = connected.then(|| standing(&self.fleet, &cfg)).flatten()
                && self.answer_one(&cfg, &file, &mut done, &standing).await
            {
                // Another may be waiting: look again at once.
                continue;
            }
            tokio::select! {
                () = self.fleet.changed() => {}
                r = self.kube.changed() => if r.is_err() { return },
                _ = self.shutdown.changed() => return,
            }
        }
    }

    /// Drops the answers to requests gone, and answers the oldest request not answered yet;
    /// whether it answered one.
    async fn answer_one(
        &mut self,
        cfg: &Arc<Config>,
        file: &std::path::Path,
        done: &mut Answered,
        standing: &BTreeMap<String, PlanRequest>,
    ) -> bool {
        if done.retain(standing) {
            self.publish(file, done);
        }
        let Some((id, request)) = done
            .to_answer(standing, &cfg.rollout.group_for(cfg.node.role))
            .first()
            .map(|(id, r)| ((*id).clone(), (*r).clone()))
        else {
            return false;
        };
        tracing::info!(request = %id, reference = %request.reference, asked_by = %request.by,
            "planning a ref for a plan request: fetching, building and computing its plan; nothing is activated and no slot is taken");
        let mut shutdown = self.shutdown.clone();
        let answer = tokio::select! {
            a = super::plan_ref(cfg, &id, &request.reference) => a,
            _ = shutdown.changed() => return false,
        };
        if answer.outcome == PreviewOutcome::Planned {
            tracing::info!(request = %id, reference = %request.reference,
                revision = %answer.revision.as_ref().map(|r| r.short()).unwrap_or("-"),
                plan = %answer.summary(), took_ms = answer.took_ms, "plan request answered");
        } else {
            tracing::warn!(request = %id, reference = %request.reference,
                outcome = answer.outcome.label(), error = %answer.error.as_deref().unwrap_or("-"),
                "plan request answered without a plan");
        }
        done.record(answer);
        self.publish(file, done);
        true
    }

    /// Shows `done`'s answers and keeps them on disk.
    fn publish(&self, file: &std::path::Path, done: &Answered) {
        if let Err(e) = store::save(file, done) {
            tracing::warn!(file = %file.display(), error = %e,
                "cannot keep the plan answers; a request may be answered again after a restart");
        }
        self.answers.send_replace(done.answers.clone());
    }
}

/// The requests standing in the fleet's ConfigMap; `None` while it is not read (not watched,
/// not listed yet, or its list failed: the watch tries again and says so when it can).
fn standing(fleet: &FleetFeed, cfg: &Config) -> Option<BTreeMap<String, PlanRequest>> {
    let seen = fleet.now()?;
    let objects = seen.current().ok()?;
    Some(
        objects
            .get(&cfg.rollout.configmap)
            .map(|f| f.requests.clone())
            .unwrap_or_default(),
    )
}
