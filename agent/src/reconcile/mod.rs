//! The apply loop: watches the apply source's head, decides (with [`core::Core`]) when to run the
//! apply command, runs one attempt at a time, records every attempt, and persists its state so
//! that nothing already applied is applied again after a restart.
//!
//! Not here: fetching (see `source`), running the process (see `apply`).

pub mod core;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot, watch};
use tracing::Instrument;

use crate::apply::{self, Exit, Finished};
use crate::config::{Config, Goal};
use crate::source::{Pin, Revision, SourceStatus, Workspace};
use crate::state::{self, Attempt, History, Outcome, State};
use crate::util;

pub use self::core::{ApplyState, Core, Decision, Desired, RetryPolicy};

/// `apply` in `ginxctl status --json`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ApplyStatus {
    pub state: ApplyState,
    /// The source whose revisions are applied.
    pub source: String,
    /// The revision `state` is about: being applied, failed, waiting, or applied.
    pub revision: Option<Revision>,
    pub goal: Goal,
    /// Start and end of the latest attempt.
    pub started_at: Option<Timestamp>,
    pub finished_at: Option<Timestamp>,
    /// Failed attempts of `revision` so far.
    pub attempts: u32,
    pub error: Option<String>,
    /// The last revision applied successfully.
    pub applied_revision: Option<Revision>,
    pub applied_at: Option<Timestamp>,
    /// When a failed revision is tried again.
    pub next_retry_at: Option<Timestamp>,
    /// Why nothing happens, in words.
    pub reason: Option<String>,
}

/// What the loop publishes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Published {
    pub apply: ApplyStatus,
    pub suspended: bool,
}

/// Requests to the loop.
#[derive(Debug)]
pub enum Command {
    /// Answers whether anything changed; persisted before answering.
    Suspend(oneshot::Sender<bool>),
    Resume(oneshot::Sender<bool>),
    /// Retry a failed revision now (after `ginxctl sync`).
    Retry,
    /// Answered when the loop is responsive (for the watchdog).
    Ping(oneshot::Sender<()>),
    History(oneshot::Sender<Vec<Attempt>>),
}

pub struct Reconciler {
    core: Core,
    history: History,
    state_path: PathBuf,
    history_path: PathBuf,
    config: watch::Receiver<Arc<Config>>,
    sources: watch::Receiver<BTreeMap<String, SourceStatus>>,
    workspace: Arc<Workspace>,
    commands: mpsc::Receiver<Command>,
    published: watch::Sender<Published>,
    shutdown: watch::Receiver<bool>,
    /// The latest attempt, for `started_at`/`finished_at` in status.
    last: Option<(Timestamp, Option<Timestamp>)>,
}

struct Attempting {
    id: u64,
    revision: Revision,
    /// From the testing branch: not a deployment new heads must descend from.
    testing: bool,
    task: tokio::task::JoinHandle<Finished>,
    stop: Option<oneshot::Sender<()>>,
    /// Keeps the tree on disk while the command runs in it.
    _tree: Pin,
}

impl Reconciler {
    /// Loads state and history from `state_dir`, resolving an attempt a previous ginx left
    /// in flight.
    pub fn new(
        config: watch::Receiver<Arc<Config>>,
        sources: watch::Receiver<BTreeMap<String, SourceStatus>>,
        workspace: Arc<Workspace>,
        commands: mpsc::Receiver<Command>,
        published: watch::Sender<Published>,
        shutdown: watch::Receiver<bool>,
    ) -> std::io::Result<Self> {
        let state_dir = config.borrow().state_dir.clone();
        let state_path = state_dir.join("state.json");
        let history_path = state_dir.join("history.json");
        let (st, aside) = state::load::<State>(&state_path)?;
        if let Some(a) = aside {
            tracing::warn!(file = %state_path.display(), moved_to = %a.to.display(), reason = %a.reason,
                "state file unusable; moved aside, starting fresh (applied revisions will be applied again)");
        }
        let (history, aside) = state::load::<History>(&history_path)?;
        if let Some(a) = aside {
            tracing::warn!(file = %history_path.display(), moved_to = %a.to.display(), reason = %a.reason,
                "history file unusable; moved aside, starting with an empty history");
        }
        let last = history
            .attempts
            .last()
            .map(|a| (a.started_at, Some(a.finished_at)));
        let mut me = Self {
            core: Core::new(st),
            history,
            state_path,
            history_path,
            config,
            sources,
            workspace,
            commands,
            published,
            shutdown,
            last,
        };
        me.resolve_interrupted();
        Ok(me)
    }

    /// An attempt in flight at start-up ran under a ginx that is gone: stop what is left of it
    /// and record it as interrupted, so its revision is tried again.
    fn resolve_interrupted(&mut self) {
        let Some(r) = self.core.running().cloned() else {
            return;
        };
        if let Some(pgid) = r.pgid
            && apply::recorded_group_alive(pgid, r.boot_id.as_deref(), r.start_time)
        {
            tracing::warn!(pgid, revision = %r.revision.short(), "stopping an apply left running by a previous ginx");
            apply::kill_group(pgid);
        }
        tracing::warn!(attempt = r.id, revision = %r.revision.short(),
            "ginx stopped during this attempt; recording it as interrupted and trying again");
        let now = util::now();
        let attempt = Attempt {
            id: r.id,
            source: r.source.clone(),
            revision: r.revision.clone(),
            goal: r.goal,
            started_at: r.started_at,
            finished_at: now,
            outcome: Outcome::Interrupted,
            exit_code: None,
            error: Some("ginx stopped while this attempt ran".into()),
            output: Vec::new(),
        };
        let _ = self
            .core
            .complete(r.id, Outcome::Interrupted, None, now, self.policy());
        self.record(attempt);
    }

    fn policy(&self) -> RetryPolicy {
        let c = self.config.borrow();
        RetryPolicy {
            base: c.apply.retry_base.get(),
            max: c.apply.retry_max.get(),
        }
    }

    /// The revision the apply source offers, with the goal it asks for.
    fn desired(&self) -> Option<Desired> {
        let cfg = self.config.borrow();
        let sources = self.sources.borrow();
        let status = sources.get(&cfg.apply.source)?;
        let goal = match (status.testing, cfg.sources.get(&cfg.apply.source)) {
            (true, Some(sc)) => sc.testing_goal,
            _ => cfg.apply.goal,
        };
        Some(Desired {
            revision: status.revision.clone()?,
            goal,
        })
    }

    fn desired_is_testing(&self) -> bool {
        let source = self.config.borrow().apply.source.clone();
        self.sources
            .borrow()
            .get(&source)
            .is_some_and(|s| s.testing)
    }

    fn save_state(&self) {
        if let Err(e) = state::save(&self.state_path, &self.core.state) {
            tracing::error!(file = %self.state_path.display(), error = %e, "cannot write the state file");
        }
    }

    fn record(&mut self, attempt: Attempt) {
        self.last = Some((attempt.started_at, Some(attempt.finished_at)));
        self.history.push(attempt);
        self.save_state();
        if let Err(e) = state::save(&self.history_path, &self.history) {
            tracing::error!(file = %self.history_path.display(), error = %e, "cannot write the history file");
        }
    }

    fn publish(&self) {
        let desired = self.desired();
        let cfg = self.config.borrow();
        let st = &self.core.state;
        let state = self.core.apply_state(desired.as_ref());
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
            ApplyState::Idle => Some(format!(
                "waiting for the first fetch of {}",
                cfg.apply.source
            )),
            ApplyState::Waiting => Some("suspended: run `ginxctl resume` to apply".to_owned()),
            ApplyState::Failed => failure.map(|f| {
                format!(
                    "attempt {} failed; retrying at {}",
                    f.attempts, f.next_retry_at
                )
            }),
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
            next_retry_at: failure.map(|f| f.next_retry_at),
            reason,
        };
        let next = Published {
            apply,
            suspended: st.suspended,
        };
        self.published.send_if_modified(|p| {
            let changed = *p != next;
            if changed {
                *p = next;
            }
            changed
        });
    }

    pub async fn run(mut self) {
        self.seed_anchor().await;
        let mut attempting: Option<Attempting> = None;
        loop {
            self.publish();
            let now = util::now();
            let decision = if attempting.is_some() {
                Decision::Busy
            } else {
                self.core.decide(self.desired().as_ref(), now)
            };
            if let Decision::Start(desired) = &decision {
                attempting = self.start(desired.clone()).await;
                continue;
            }
            let retry = async {
                match decision {
                    Decision::RetryAt(at) => {
                        let wait = now.duration_until(at).unsigned_abs();
                        tokio::time::sleep(wait).await;
                    }
                    _ => std::future::pending().await,
                }
            };
            let finishing = async {
                match attempting.as_mut() {
                    Some(a) => (&mut a.task).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = retry => {}
                finished = finishing => {
                    if let Some(a) = attempting.take() {
                        let finished = finished.unwrap_or_else(|e| Finished {
                            exit: Exit::SpawnFailed(format!("apply task failed: {e}")),
                            output: Vec::new(),
                        });
                        let succeeded = finished.success();
                        self.finish(a.id, finished);
                        if succeeded && !a.testing {
                            self.record_deployed(a.revision).await;
                        }
                    }
                }
                changed = self.sources.changed() => if changed.is_err() { break },
                changed = self.config.changed() => if changed.is_err() { break },
                cmd = self.commands.recv() => match cmd {
                    Some(cmd) => self.handle(cmd),
                    None => break,
                },
                _ = self.shutdown.changed() => break,
            }
        }
        if let Some(a) = attempting.take() {
            self.stop(a).await;
        }
        self.publish();
    }

    fn handle(&mut self, cmd: Command) {
        match cmd {
            Command::Suspend(reply) => {
                let changed = self.core.set_suspended(true);
                if changed {
                    self.save_state();
                    tracing::info!("suspended: sources keep fetching, nothing is applied");
                }
                let _ = reply.send(changed);
            }
            Command::Resume(reply) => {
                let changed = self.core.set_suspended(false);
                if changed {
                    self.save_state();
                    tracing::info!("resumed");
                }
                let _ = reply.send(changed);
            }
            Command::Retry => self.core.request_retry(),
            Command::Ping(reply) => {
                let _ = reply.send(());
            }
            Command::History(reply) => {
                let _ = reply.send(self.history.attempts.clone());
            }
        }
    }

    /// A state written before anchors existed: its applied revision becomes the anchor.
    async fn seed_anchor(&self) {
        let source = self.config.borrow().apply.source.clone();
        let Some(applied) = self
            .core
            .state
            .applied
            .clone()
            .filter(|a| a.source == source)
        else {
            return;
        };
        let workspace = Arc::clone(&self.workspace);
        let _ = tokio::task::spawn_blocking(move || {
            if workspace.anchor(&source).is_none() {
                let _ = workspace.advance_anchor(&source, &applied.revision);
            }
        })
        .await;
    }

    /// Records a deployment of the tracked branch as the commit new heads must descend from.
    async fn record_deployed(&self, revision: Revision) {
        let source = self.config.borrow().apply.source.clone();
        let workspace = Arc::clone(&self.workspace);
        let result =
            tokio::task::spawn_blocking(move || workspace.advance_anchor(&source, &revision)).await;
        if let Ok(Err(e)) = result {
            tracing::warn!(error = %e, "cannot record the deployed commit in the clone");
        }
    }

    async fn start(&mut self, desired: Desired) -> Option<Attempting> {
        let cfg = Arc::clone(&self.config.borrow());
        let source = cfg.apply.source.clone();
        let Desired { revision, goal } = desired;
        let testing = self.desired_is_testing();
        let node = cfg.node_name().to_owned();
        let now = util::now();
        let id = match self.core.begin(&source, revision.clone(), goal, now) {
            Ok(id) => id,
            Err(e) => {
                tracing::error!(error = %e, "cannot start an attempt");
                return None;
            }
        };
        self.last = Some((now, None));
        self.save_state();
        self.publish();
        let span = tracing::info_span!("apply", source = %source, revision = %revision.short(), node = %node, attempt = id);
        tracing::info!(parent: &span, goal = %goal, "applying");

        let trees = self.workspace.trees(&source);
        let clone = self.workspace.clone_of(&source);
        let rev = revision.clone();
        let tree = tokio::task::spawn_blocking(move || trees.checkout(&clone, &rev))
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r.map_err(|e| e.to_string()));
        let tree = match tree {
            Ok(t) => t,
            Err(e) => {
                let _guard = span.enter();
                self.finish(
                    id,
                    Finished {
                        exit: Exit::SpawnFailed(format!("cannot check out the revision: {e}")),
                        output: Vec::new(),
                    },
                );
                return None;
            }
        };

        let subdir = cfg.sources.get(&source).and_then(|s| s.path.clone());
        let cwd = match &subdir {
            Some(p) => tree.path().join(p),
            None => tree.path().to_owned(),
        };
        if !cwd.is_dir() {
            let _guard = span.enter();
            let p = subdir.unwrap_or_default();
            self.finish(
                id,
                Finished {
                    exit: Exit::SpawnFailed(format!(
                        "directory {} (sources.{source}.path) does not exist in revision {revision}",
                        p.display()
                    )),
                    output: Vec::new(),
                },
            );
            return None;
        }
        let mut argv: Vec<String> = cfg
            .apply
            .command
            .iter()
            .map(|a| a.replace("{node}", &node))
            .collect();
        argv.push(goal.as_str().to_owned());
        let spec = apply::Spec {
            argv,
            cwd,
            env: vec![
                ("GINX_NODE".into(), node.clone()),
                ("GINX_SOURCE".into(), source.clone()),
                ("GINX_REVISION".into(), revision.to_string()),
                ("GINX_GOAL".into(), goal.as_str().into()),
            ],
            timeout: cfg.apply.timeout.get(),
            kill_grace: cfg.apply.kill_grace.get(),
        };
        let running = match span.in_scope(|| apply::start(spec)) {
            Ok(r) => r,
            Err(finished) => {
                let _guard = span.enter();
                self.finish(id, finished);
                return None;
            }
        };
        let pgid = running.pgid();
        if self
            .core
            .set_process(pgid, apply::boot_id(), apply::start_time(pgid))
            .is_ok()
        {
            self.save_state();
        }
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let task = tokio::spawn(
            running
                .wait(async move {
                    let _ = stop_rx.await;
                })
                .instrument(span),
        );
        Some(Attempting {
            id,
            revision,
            testing,
            task,
            stop: Some(stop_tx),
            _tree: tree,
        })
    }

    fn finish(&mut self, id: u64, finished: Finished) {
        let now = util::now();
        let (outcome, exit_code, error) = match &finished.exit {
            Exit::Code(0) => (Outcome::Succeeded, Some(0), None),
            Exit::Code(c) => (
                Outcome::Failed,
                Some(*c),
                Some(format!("apply command exited with code {c}")),
            ),
            Exit::Signal(s) => (
                Outcome::Failed,
                None,
                Some(format!("apply command killed by signal {s}")),
            ),
            Exit::TimedOut => {
                let t = self.config.borrow().apply.timeout;
                (
                    Outcome::TimedOut,
                    None,
                    Some(format!("apply command timed out after {t} (apply.timeout)")),
                )
            }
            Exit::Stopped => (
                Outcome::Interrupted,
                None,
                Some("stopped because ginx is shutting down".into()),
            ),
            Exit::SpawnFailed(m) => (Outcome::Failed, None, Some(m.clone())),
        };
        let policy = self.policy();
        let done = match self.core.complete(id, outcome, error.clone(), now, policy) {
            Ok(d) => d,
            Err(e) => {
                tracing::error!(error = %e, "cannot record the end of an attempt");
                return;
            }
        };
        match outcome {
            Outcome::Succeeded => {
                tracing::info!(attempt = id, revision = %done.revision.short(), "applied")
            }
            _ => {
                tracing::warn!(attempt = id, revision = %done.revision.short(), outcome = outcome.as_str(),
                error = error.as_deref().unwrap_or(""), "apply failed")
            }
        }
        self.record(Attempt {
            id,
            source: done.source,
            revision: done.revision,
            goal: done.goal,
            started_at: done.started_at,
            finished_at: now,
            outcome,
            exit_code,
            error,
            output: finished.output,
        });
    }

    /// Shutting down with an attempt running: give it `shutdown_grace` to finish, then stop it.
    async fn stop(&mut self, mut a: Attempting) {
        let grace = self.config.borrow().apply.shutdown_grace.get();
        tracing::info!(?grace, "waiting for the running apply before stopping");
        let finished = match tokio::time::timeout(grace, &mut a.task).await {
            Ok(r) => r,
            Err(_) => {
                if let Some(stop) = a.stop.take() {
                    let _ = stop.send(());
                }
                (&mut a.task).await
            }
        };
        let finished = finished.unwrap_or_else(|e| Finished {
            exit: Exit::SpawnFailed(format!("apply task failed: {e}")),
            output: Vec::new(),
        });
        self.finish(a.id, finished);
    }
}
