//! The apply loop: watches the apply source's head, decides (with [`core::Core`]) when to run the
//! apply command, runs one attempt at a time in its runner, records every attempt with the
//! system generation before and after, and persists its state so that nothing already applied
//! is applied again after a restart. It also notices what happens to the system around it:
//! a reboot becoming necessary, someone changing the system by hand (drift), a new version of
//! ginx itself.
//!
//! One concern per file: the pure decisions in `core`; here the loop itself (`run`, `handle`);
//! `start` (beginning an attempt), `finish` (recording one), `rollback`, `drift`, `hooks`,
//! `resume` (after a restart), `stop` (at shutdown) and `publish` (its part of status).
//!
//! Layer 6: drives the workers (`apply`, `source`) and reads `state`, `status`, `config`,
//! `types`. It must not import `control`, `daemon` or `cli`. Not here: fetching (see `source`),
//! running processes and reading the system (see `apply`).

pub mod core;
mod drift;
mod finish;
mod hooks;
mod publish;
mod resume;
mod rollback;
mod start;
mod stop;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use jiff::Timestamp;
use tokio::sync::{mpsc, oneshot, watch};

use crate::apply::isolation::Isolation;
use crate::apply::system::SelfImage;
use crate::apply::{Exit, Finished};
use crate::config::Config;
use crate::source::{Pin, Workspace};
use crate::state::{self, Attempt, History, State};
use crate::status::{Drift, Published, SourceStatus};
use crate::types::Revision;
use crate::util;

pub use self::core::{Core, Decision, Desired, Ending, RetryPolicy};

/// colmena's exit code for "node missing from the hive / local deployment not allowed".
const COLMENA_CONFIG_ERROR: i32 = 2;

/// Requests to the loop.
#[derive(Debug)]
pub enum Command {
    /// Answers whether anything changed; persisted before answering.
    Suspend(oneshot::Sender<bool>),
    Resume(oneshot::Sender<bool>),
    /// Retry a failed revision now (after `ginxctl sync`), and look at the system again.
    Retry,
    /// `ginxctl retry`: forget failures, give-ups and a rollback; apply again now.
    ForceRetry(oneshot::Sender<()>),
    /// `ginxctl rollback`: answered with the attempt id, or why not.
    Rollback(oneshot::Sender<Result<u64, String>>),
    /// Answered when the loop is responsive (for the watchdog).
    Ping(oneshot::Sender<()>),
    History(oneshot::Sender<Vec<Attempt>>),
}

/// The running attempt.
struct Attempting {
    id: u64,
    task: tokio::task::JoinHandle<Finished>,
    stop: Option<oneshot::Sender<()>>,
    /// Keeps the tree on disk while the command runs in it.
    _tree: Option<Pin>,
}

pub struct Reconciler {
    core: Core,
    history: History,
    state_path: PathBuf,
    history_path: PathBuf,
    attempts_dir: PathBuf,
    config: watch::Receiver<Arc<Config>>,
    sources: watch::Receiver<BTreeMap<String, SourceStatus>>,
    workspace: Arc<Workspace>,
    commands: mpsc::Receiver<Command>,
    published: watch::Sender<Published>,
    shutdown: watch::Receiver<bool>,
    /// Asks the daemon to restart into a new version of ginx.
    restart: watch::Sender<Option<SelfRestart>>,
    isolation: Isolation,
    metrics: Arc<crate::metrics::Metrics>,
    /// ginx's binary and unit as they were when it started.
    self_image: SelfImage,
    /// The latest attempt, for `started_at`/`finished_at` in status.
    last: Option<(Timestamp, Option<Timestamp>)>,
    drift: Option<Drift>,
    /// A revision offered before another was deployed that it does not descend from (a
    /// force-push racing an apply): not applied; the source refuses it on its next fetch.
    blocked: Option<Revision>,
}

/// Everything the loop is wired to.
pub struct Wiring {
    pub metrics: Arc<crate::metrics::Metrics>,
    pub config: watch::Receiver<Arc<Config>>,
    pub sources: watch::Receiver<BTreeMap<String, SourceStatus>>,
    pub workspace: Arc<Workspace>,
    pub commands: mpsc::Receiver<Command>,
    pub published: watch::Sender<Published>,
    pub shutdown: watch::Receiver<bool>,
    pub restart: watch::Sender<Option<SelfRestart>>,
}

/// A new version of ginx was activated: why, and its binary (resolved when it was found).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SelfRestart {
    pub reason: String,
    pub binary: Option<PathBuf>,
}

impl Reconciler {
    /// Loads state and history from `state_dir`.
    pub fn new(w: Wiring) -> std::io::Result<Self> {
        let cfg = Arc::clone(&w.config.borrow());
        let state_path = cfg.state_dir.join("state.json");
        let history_path = cfg.state_dir.join("history.json");
        let (mut st, aside) = state::load::<State>(&state_path)?;
        if let Some(a) = aside {
            if a.newer {
                // Written by a newer ginx: we cannot tell what it had applied or held back.
                // Applying blindly could undo an operator's suspend; wait for one instead.
                st.suspended = true;
                tracing::warn!(file = %state_path.display(), moved_to = %a.to.display(), reason = %a.reason,
                    "state file from a newer ginx; moved aside, starting SUSPENDED: check, then `ginxctl resume`");
            } else {
                tracing::warn!(file = %state_path.display(), moved_to = %a.to.display(), reason = %a.reason,
                    "state file unusable; moved aside, starting fresh (applied revisions will be applied again)");
            }
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
        let isolation = Isolation::resolve(&cfg.apply);
        tracing::info!(
            isolation = isolation.name(),
            "applies are isolated from ginx"
        );
        Ok(Self {
            core: Core::new(st),
            history,
            state_path,
            history_path,
            attempts_dir: cfg.state_dir.join("attempts"),
            self_image: SelfImage::read(&cfg.system.ginx_binary, &cfg.system.ginx_unit),
            config: w.config,
            sources: w.sources,
            workspace: w.workspace,
            commands: w.commands,
            published: w.published,
            shutdown: w.shutdown,
            restart: w.restart,
            isolation,
            metrics: w.metrics,
            last,
            drift: None,
            blocked: None,
        })
    }

    fn policy(&self) -> RetryPolicy {
        let c = self.config.borrow();
        RetryPolicy {
            base: c.apply.retry_base.get(),
            max: c.apply.retry_max.get(),
            max_attempts: c.apply.max_attempts,
        }
    }

    /// The revision the apply source offers, with the goal it asks for.
    fn desired(&self) -> Option<(Desired, bool)> {
        let cfg = self.config.borrow();
        let sources = self.sources.borrow();
        let status = sources.get(&cfg.apply.source)?;
        let goal = match (status.testing, cfg.sources.get(&cfg.apply.source)) {
            (true, Some(sc)) => sc.testing_goal,
            _ => cfg.apply.goal,
        };
        Some((
            Desired {
                revision: status.revision.clone()?,
                goal,
            },
            status.testing,
        ))
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

    pub async fn run(mut self) {
        self.refresh_reboot_after_boot();
        self.seed_anchor().await;
        let mut attempting = self.resume_in_flight().await;
        let mut drift_tick =
            tokio::time::interval(self.config.borrow().system.drift_check_interval.get());
        drift_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            self.publish();
            let now = util::now();
            let decision = if attempting.is_some() {
                Decision::Busy
            } else {
                let desired = self.desired();
                self.core.decide(desired.as_ref().map(|(d, _)| d), now)
            };
            if let Decision::Start(desired) = &decision
                && self.blocked.as_ref() != Some(&desired.revision)
            {
                let testing = self.desired().is_some_and(|(_, t)| t);
                attempting = self.start_apply(desired.clone(), testing).await;
                continue;
            }
            let retry = async {
                match decision {
                    Decision::RetryAt(at) => {
                        tokio::time::sleep(now.duration_until(at).unsigned_abs()).await;
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
                            exit: Exit::SpawnFailed(format!("attempt task failed: {e}")),
                            output: Vec::new(),
                        });
                        self.finish(a.id, finished).await;
                    }
                }
                _ = drift_tick.tick() => {
                    if attempting.is_none() {
                        self.check_drift();
                    }
                }
                changed = self.sources.changed() => if changed.is_err() { break },
                changed = self.config.changed() => if changed.is_err() { break },
                cmd = self.commands.recv() => match cmd {
                    Some(cmd) => {
                        if let Some(a) = self.handle(cmd, attempting.is_some()).await {
                            attempting = Some(a);
                        }
                    }
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

    async fn handle(&mut self, cmd: Command, busy: bool) -> Option<Attempting> {
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
            Command::Retry => {
                self.core.request_retry();
                if !busy {
                    self.check_drift();
                }
            }
            Command::ForceRetry(reply) => {
                self.core.force_retry();
                self.save_state();
                tracing::info!("retry requested: failures, give-ups and rollbacks forgotten");
                let _ = reply.send(());
            }
            Command::Rollback(reply) => {
                if busy {
                    let _ = reply.send(Err(
                        "an attempt is running; roll back after it finishes".to_owned()
                    ));
                    return None;
                }
                return match self.start_rollback().await {
                    Ok((id, a)) => {
                        let _ = reply.send(Ok(id));
                        a
                    }
                    Err(e) => {
                        let _ = reply.send(Err(e));
                        None
                    }
                };
            }
            Command::Ping(reply) => {
                let _ = reply.send(());
            }
            Command::History(reply) => {
                let _ = reply.send(self.history.attempts.clone());
            }
        }
        None
    }
}
