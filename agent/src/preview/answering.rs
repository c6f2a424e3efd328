//! The daemon's side of `ginxctl plan REF`: watch the fleet's ConfigMap for plan requests,
//! answer each once (fetch, build, plan: [`plan_ref`](super::plan_ref)), one at a time, and
//! publish the answers, which the reporter writes on the node's heartbeat Lease
//! (`ginx.io/previews`).
//!
//! The ConfigMap is watched (one long-lived request per node, as the rollout's cache does) and
//! read when the watch sees a change, and every [`LOOK_EVERY`] besides. Nothing here takes a
//! slot, writes the state or the history, or activates anything.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use tokio::sync::watch;

use super::store::{self, Answered};
use crate::config::Config;
use crate::k8s::{KubeClients, watch_objects};
use crate::rollout::fleet::plan_requests;
use crate::status::{KubeState, KubeStatus};
use crate::types::{PlanRequest, PreviewAnswer, PreviewOutcome};

/// The ConfigMap is read this often even when its watch says nothing.
const LOOK_EVERY: Duration = Duration::from_secs(300);

pub struct Answering {
    pub config: watch::Receiver<Arc<Config>>,
    pub clients: watch::Receiver<Option<KubeClients>>,
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
        let (changes_tx, mut changes) = watch::channel(0u64);
        let mut watch: Option<tokio::task::JoinHandle<()>> = None;
        loop {
            let clients = self.clients.borrow_and_update().clone();
            let connected = self.kube.borrow_and_update().state == KubeState::Connected;
            if let Some(c) = clients.as_ref().filter(|_| connected) {
                let cfg = Arc::clone(&self.config.borrow());
                if watch.is_none() {
                    watch = Some(start_watch(&cfg, c, changes_tx.clone()));
                }
                if let Some(standing) = read(&cfg, c).await
                    && self.answer_one(&cfg, &file, &mut done, &standing).await
                {
                    // Another may be waiting: look again at once.
                    continue;
                }
            }
            tokio::select! {
                r = changes.changed() => if r.is_err() { return },
                r = self.clients.changed() => {
                    if r.is_err() { return }
                    if let Some(w) = watch.take() { w.abort() }
                }
                r = self.kube.changed() => {
                    if r.is_err() { return }
                    if self.kube.borrow().state != KubeState::Connected
                        && let Some(w) = watch.take()
                    {
                        w.abort();
                    }
                }
                () = tokio::time::sleep(LOOK_EVERY) => {}
                _ = self.shutdown.changed() => {
                    if let Some(w) = watch.take() { w.abort() }
                    return;
                }
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
        standing: &std::collections::BTreeMap<String, PlanRequest>,
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

/// Watches the fleet's ConfigMap; each change bumps `changes`.
fn start_watch(
    cfg: &Config,
    clients: &KubeClients,
    changes: watch::Sender<u64>,
) -> tokio::task::JoinHandle<()> {
    let api = kube::Api::<ConfigMap>::namespaced(clients.watch.clone(), &cfg.kubernetes.namespace);
    let fields = format!("metadata.name={}", cfg.rollout.configmap);
    tokio::spawn(watch_objects(
        api,
        String::new(),
        Some(fields),
        changes,
        None,
    ))
}

/// The requests standing in the fleet's ConfigMap; `None` when it cannot be read now.
async fn read(
    cfg: &Config,
    clients: &KubeClients,
) -> Option<std::collections::BTreeMap<String, PlanRequest>> {
    let api = kube::Api::<ConfigMap>::namespaced(clients.main.clone(), &cfg.kubernetes.namespace);
    match api.get_opt(&cfg.rollout.configmap).await {
        Ok(cm) => Some(plan_requests::decode(
            &cm.and_then(|c| c.data).unwrap_or_default(),
        )),
        Err(e) => {
            tracing::debug!(error = %e, "cannot read the plan requests now; looking again later");
            None
        }
    }
}
