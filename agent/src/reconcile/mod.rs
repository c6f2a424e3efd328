//! The apply loop: watches the apply source's head, decides (with [`core::Core`]) when to run the
//! apply command, runs one attempt at a time in its runner, records every attempt with the
//! system generation before and after, and persists its state so that nothing already applied
//! is applied again after a restart. It also notices what happens to the system around it:
//! a reboot becoming necessary, someone changing the system by hand (drift), a new version of
//! ginx itself.
//!
//! Layer 6: drives the workers (`apply`, `source`) and reads `state`, `status`, `config`,
//! `types`. It must not import `control`, `daemon` or `cli`. Not here: fetching (see `source`),
//! running processes and reading the system (see `apply`).

pub mod core;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use jiff::Timestamp;
use tokio::sync::{mpsc, oneshot, watch};
use tracing::Instrument;

use crate::apply::isolation::{self, Isolation, Launch};
use crate::apply::system::{self, SelfImage};
use crate::apply::{self, Exit, Finished};
use crate::config::{Config, DriftPolicy};
use crate::source::{Pin, Workspace};
use crate::state::{self, Attempt, AttemptKind, History, InFlight, Outcome, RebootRequired, State};
use crate::status::{ApplyState, ApplyStatus, Drift, Published, SourceStatus, SystemStatus};
use crate::types::{Goal, Revision};
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

    fn publish(&self) {
        let desired = self.desired().map(|(d, _)| d);
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

    /// After a reboot, what required it is gone: compute it afresh.
    fn refresh_reboot_after_boot(&mut self) {
        let Some(r) = &self.core.state.reboot else {
            return;
        };
        if r.boot_id.is_some() && r.boot_id == apply::boot_id() {
            return;
        }
        let reasons = {
            let cfg = self.config.borrow();
            system::reboot_reasons(&cfg.system.booted_system, &cfg.system.current_system)
        };
        self.core.state.reboot = (!reasons.is_empty()).then(|| RebootRequired {
            reasons,
            since: util::now(),
            boot_id: apply::boot_id(),
        });
        self.save_state();
    }

    /// A state written before anchors existed: its applied revision becomes the anchor.
    async fn seed_anchor(&self) {
        let (source, goal) = {
            let cfg = self.config.borrow();
            (cfg.apply.source.clone(), cfg.apply.goal)
        };
        // Only a deployment of the main branch (its goal is apply.goal; a testing branch's
        // revision is not an anchor).
        let Some(applied) = self
            .core
            .state
            .applied
            .clone()
            .filter(|a| a.source == source && a.goal == goal)
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

    /// An attempt in flight at start-up ran under a ginx that is gone. If its runner finished,
    /// record its result; if its transient unit still runs, follow it again; otherwise stop
    /// whatever is left and record it as interrupted.
    async fn resume_in_flight(&mut self) -> Option<Attempting> {
        let r = self.core.running().cloned()?;
        if let Some(finished) = r.dir.as_deref().and_then(isolation::collect) {
            tracing::info!(attempt = r.id, revision = %r.revision.short(),
                "an attempt finished while ginx was away; recording its result");
            self.finish(r.id, finished).await;
            return None;
        }
        if r.isolation == "systemd-run"
            && let (Some(dir), Some(unit)) = (&r.dir, &r.unit)
            && let Some(handle) = isolation::attach(&self.isolation, dir, unit).await
        {
            tracing::info!(attempt = r.id, unit = %unit, revision = %r.revision.short(),
                "an attempt started by a previous ginx is still running; following it");
            let tree = self.pin_tree(&r.source, &r.revision).await.ok();
            return Some(self.follow(r.id, &r.revision, handle, tree));
        }
        if let Some(pgid) = r.pgid
            && apply::recorded_group_alive(pgid, r.boot_id.as_deref(), r.start_time)
        {
            tracing::warn!(pgid, revision = %r.revision.short(), "stopping an apply left running by a previous ginx");
            apply::kill_group(pgid);
        }
        tracing::warn!(attempt = r.id, revision = %r.revision.short(),
            "ginx stopped during this attempt; recording it as interrupted");
        self.finish(
            r.id,
            Finished {
                exit: Exit::Stopped,
                output: Vec::new(),
            },
        )
        .await;
        None
    }

    /// The tree of `revision`, checked out (or already there) and kept while the pin lives.
    async fn pin_tree(&self, source: &str, revision: &Revision) -> Result<Pin, String> {
        let trees = self.workspace.trees(source);
        let clone = self.workspace.clone_of(source);
        let rev = revision.clone();
        tokio::task::spawn_blocking(move || trees.checkout(&clone, &rev))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())
    }

    /// Starts following `handle` on a task of its own.
    fn follow(
        &self,
        id: u64,
        revision: &Revision,
        handle: isolation::Handle,
        tree: Option<Pin>,
    ) -> Attempting {
        let node = self.config.borrow().node_name().to_owned();
        let span =
            tracing::info_span!("apply", revision = %revision.short(), node = %node, attempt = id);
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let task = tokio::spawn(
            handle
                .wait(
                    async move {
                        let _ = stop_rx.await;
                    },
                    |line| {
                        tracing::info!(target: "ginx::apply::output", stream = ?line.stream, "{}", line.line);
                    },
                )
                .instrument(span),
        );
        Attempting {
            id,
            task,
            stop: Some(stop_tx),
            _tree: tree,
        }
    }

    fn attempt_dir(&self, id: u64) -> PathBuf {
        self.attempts_dir.join(id.to_string())
    }

    /// Begins an attempt; returns its id, or records the failure to begin.
    fn begin(&mut self, attempt: InFlight) -> Option<u64> {
        match self.core.begin(attempt) {
            Ok(id) => {
                let dir = self.attempt_dir(id);
                let _ = self.core.update_running(|r| r.dir = Some(dir));
                self.last = Some((util::now(), None));
                self.save_state();
                self.publish();
                Some(id)
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot start an attempt");
                None
            }
        }
    }

    /// Whether `revision` descends from what was deployed since the source offered it.
    async fn descends_from_deployed(&self, source: &str, revision: &Revision) -> bool {
        let workspace = Arc::clone(&self.workspace);
        let (source, revision) = (source.to_owned(), revision.clone());
        tokio::task::spawn_blocking(move || match workspace.anchor(&source) {
            Some(anchor) => workspace
                .clone_of(&source)
                .descends(&revision, &anchor)
                .unwrap_or(false),
            None => true,
        })
        .await
        .unwrap_or(true)
    }

    async fn start_apply(&mut self, desired: Desired, testing: bool) -> Option<Attempting> {
        let cfg = Arc::clone(&self.config.borrow());
        let source = cfg.apply.source.clone();
        let Desired { revision, goal } = desired;
        if !testing && !self.descends_from_deployed(&source, &revision).await {
            tracing::warn!(revision = %revision.short(),
                "not applying: it does not descend from the revision deployed since it was offered");
            self.blocked = Some(revision);
            return None;
        }
        self.blocked = None;
        let node = cfg.node_name().to_owned();
        let unit = format!("ginx-apply-{}", revision.short());
        let id = self.begin(InFlight {
            id: 0,
            kind: AttemptKind::Apply,
            source: source.clone(),
            revision: revision.clone(),
            goal,
            started_at: util::now(),
            testing,
            isolation: self.isolation.name().to_owned(),
            unit: matches!(self.isolation, Isolation::SystemdRun { .. }).then(|| unit.clone()),
            dir: None,
            generation_before: system::generation(&cfg.system.profile),
            pgid: None,
            boot_id: None,
            start_time: None,
        })?;
        tracing::info!(source = %source, revision = %revision.short(), node = %node, attempt = id,
            goal = %goal, isolation = self.isolation.name(), "applying");

        let tree = match self.pin_tree(&source, &revision).await {
            Ok(tree) => tree,
            Err(e) => {
                self.fail_to_start(id, format!("cannot check out the revision: {e}"))
                    .await;
                return None;
            }
        };
        let subdir = cfg.sources.get(&source).and_then(|s| s.path.clone());
        let cwd = match &subdir {
            Some(p) => tree.path().join(p),
            None => tree.path().to_owned(),
        };
        if !cwd.is_dir() {
            let p = subdir.unwrap_or_default();
            self.fail_to_start(
                id,
                format!(
                    "directory {} (sources.{source}.path) does not exist in revision {revision}",
                    p.display()
                ),
            )
            .await;
            return None;
        }
        let mut argv: Vec<String> = cfg
            .apply
            .command
            .iter()
            .map(|a| a.replace("{node}", &node))
            .collect();
        argv.push(goal.as_str().to_owned());
        let launch = Launch {
            dir: self.attempt_dir(id),
            unit,
            cwd,
            argv,
            env: vec![
                ("GINX_NODE".into(), node.clone()),
                ("GINX_SOURCE".into(), source.clone()),
                ("GINX_REVISION".into(), revision.to_string()),
                ("GINX_GOAL".into(), goal.as_str().into()),
            ],
            timeout: cfg.apply.timeout.get(),
            kill_grace: cfg.apply.kill_grace.get(),
            description: format!("ginx: apply {source} {revision} ({goal})"),
        };
        self.launch(id, &revision, &launch, Some(tree)).await
    }

    async fn launch(
        &mut self,
        id: u64,
        revision: &Revision,
        launch: &Launch,
        tree: Option<Pin>,
    ) -> Option<Attempting> {
        let handle = match isolation::launch(&self.isolation, launch).await {
            Ok(h) => h,
            Err(e) => {
                self.fail_to_start(id, e).await;
                return None;
            }
        };
        if let Some(pid) = handle.pid() {
            let (boot, started) = (apply::boot_id(), apply::start_time(pid));
            let _ = self.core.update_running(|r| {
                r.pgid = Some(pid);
                r.boot_id = boot;
                r.start_time = started;
            });
            self.save_state();
        }
        Some(self.follow(id, revision, handle, tree))
    }

    async fn fail_to_start(&mut self, id: u64, message: String) {
        self.finish(
            id,
            Finished {
                exit: Exit::SpawnFailed(message),
                output: Vec::new(),
            },
        )
        .await;
    }

    /// `ginxctl rollback`: the previous generation, activated in the same runner as applies.
    async fn start_rollback(&mut self) -> Result<(u64, Option<Attempting>), String> {
        let cfg = Arc::clone(&self.config.borrow());
        let revision = self
            .core
            .state
            .applied
            .as_ref()
            .map(|a| a.revision.clone())
            .or_else(|| self.desired().map(|(d, _)| d.revision))
            .ok_or_else(|| {
                "nothing to roll back from: ginx has applied nothing yet (use `nixos-rebuild \
                 switch --rollback` by hand)"
                    .to_owned()
            })?;
        let generation = system::generation(&cfg.system.profile).ok_or_else(|| {
            format!(
                "no system generation at {} (system.profile)",
                cfg.system.profile.display()
            )
        })?;
        let profile = cfg.system.profile.display().to_string();
        let script: Vec<String> = [&cfg.system.rollback_command, &cfg.system.switch_command]
            .iter()
            .map(|argv| {
                argv.iter()
                    .map(|a| shell_quote(&a.replace("{profile}", &profile)))
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect();
        let unit = format!("ginx-rollback-{}", self.core.state.next_attempt_id);
        let id = self
            .begin(InFlight {
                id: 0,
                kind: AttemptKind::Rollback,
                source: cfg.apply.source.clone(),
                revision: revision.clone(),
                goal: Goal::Switch,
                started_at: util::now(),
                testing: false,
                isolation: self.isolation.name().to_owned(),
                unit: matches!(self.isolation, Isolation::SystemdRun { .. }).then(|| unit.clone()),
                dir: None,
                generation_before: Some(generation.clone()),
                pgid: None,
                boot_id: None,
                start_time: None,
            })
            .ok_or_else(|| "cannot start the rollback (see the log)".to_owned())?;
        tracing::warn!(attempt = id, from_generation = ?generation.number, "rolling back to the previous generation");
        let launch = Launch {
            dir: self.attempt_dir(id),
            unit,
            cwd: cfg.state_dir.clone(),
            argv: vec![
                "/bin/sh".into(),
                "-c".into(),
                format!("set -e; {}", script.join("; ")),
            ],
            env: vec![("GINX_NODE".into(), cfg.node_name().to_owned())],
            timeout: cfg.apply.timeout.get(),
            kill_grace: cfg.apply.kill_grace.get(),
            description: "ginx: roll back to the previous generation".into(),
        };
        let a = self.launch(id, &revision, &launch, None).await;
        Ok((id, a))
    }

    async fn finish(&mut self, id: u64, finished: Finished) {
        let now = util::now();
        let cfg = Arc::clone(&self.config.borrow());
        let kind = self.core.running().map(|r| r.kind).unwrap_or_default();
        let (outcome, exit_code, error, give_up) = match &finished.exit {
            Exit::Code(0) => (Outcome::Succeeded, Some(0), None, false),
            Exit::Code(COLMENA_CONFIG_ERROR) if kind == AttemptKind::Apply => (
                Outcome::Failed,
                Some(COLMENA_CONFIG_ERROR),
                Some(format!(
                    "apply command exited with code 2: colmena says node {:?} is not in the \
                     hive, or the hive does not allow local deployment \
                     (deployment.allowLocalDeployment = true); fix the hive — not retried until \
                     a new revision or `ginxctl retry`",
                    cfg.node_name()
                )),
                true,
            ),
            Exit::Code(c) => (
                Outcome::Failed,
                Some(*c),
                Some(format!("command exited with code {c}")),
                false,
            ),
            Exit::Signal(s) => (
                Outcome::Failed,
                None,
                Some(format!("command killed by signal {s}")),
                false,
            ),
            Exit::TimedOut => (
                Outcome::TimedOut,
                None,
                Some(format!(
                    "command timed out after {} (apply.timeout)",
                    cfg.apply.timeout
                )),
                false,
            ),
            Exit::Stopped => (
                Outcome::Interrupted,
                None,
                Some("stopped: ginx or the machine went down during the attempt".into()),
                false,
            ),
            Exit::SpawnFailed(m) => (Outcome::Failed, None, Some(m.clone()), false),
        };
        let ending = Ending {
            outcome,
            error: error.clone(),
            give_up,
        };
        let policy = self.policy();
        let done = match self.core.complete(id, ending, now, policy) {
            Ok(d) => d,
            Err(e) => {
                tracing::error!(error = %e, "cannot record the end of an attempt");
                return;
            }
        };
        let generation_after = system::generation(&cfg.system.profile);
        if outcome == Outcome::Succeeded {
            self.after_activation(&cfg, done.goal, done.kind);
        }
        match outcome {
            Outcome::Succeeded => tracing::info!(attempt = id, kind = ?done.kind,
                revision = %done.revision.short(), generation = ?generation_after.as_ref().and_then(|g| g.number),
                "attempt succeeded"),
            _ => tracing::warn!(attempt = id, kind = ?done.kind, revision = %done.revision.short(),
                outcome = outcome.as_str(), error = error.as_deref().unwrap_or(""), "attempt failed"),
        }
        if let Some(dir) = &done.dir {
            let _ = std::fs::remove_dir_all(dir);
        }
        let attempt = Attempt {
            id,
            kind: done.kind,
            source: done.source.clone(),
            revision: done.revision.clone(),
            goal: done.goal,
            started_at: done.started_at,
            finished_at: now,
            outcome,
            exit_code,
            error: error.clone(),
            output: finished.output,
            generation_before: done.generation_before.clone(),
            generation_after,
            isolation: done.isolation.clone(),
        };
        let took = attempt.finished_at.duration_since(attempt.started_at);
        self.metrics
            .applied(outcome.as_str(), took.as_secs_f64().max(0.0));
        self.run_hook(&cfg, &attempt);
        self.record(attempt);
        if outcome == Outcome::Succeeded && done.kind == AttemptKind::Apply {
            if !done.testing {
                self.record_deployed(&done.source, done.revision.clone())
                    .await;
            }
            let now_image = SelfImage::read(&cfg.system.ginx_binary, &cfg.system.ginx_unit);
            if let Some(why) = self.self_image.changed(&now_image) {
                tracing::info!(reason = %why, "a new version of ginx was activated; restarting into it");
                let _ = self.restart.send(Some(SelfRestart {
                    reason: why,
                    binary: now_image.binary,
                }));
            }
        }
    }

    /// After a successful activation: remember the system it produced (drift is measured
    /// against it) and whether a reboot is needed.
    fn after_activation(&mut self, cfg: &Config, goal: Goal, kind: AttemptKind) {
        self.core.state.expected_system = system::resolve(&cfg.system.current_system);
        self.drift = None;
        let mut reasons =
            system::reboot_reasons(&cfg.system.booted_system, &cfg.system.current_system);
        if goal == Goal::Boot && kind == AttemptKind::Apply {
            reasons.extend(
                system::reboot_reasons(&cfg.system.booted_system, &cfg.system.profile)
                    .into_iter()
                    .filter(|r| !reasons.contains(r))
                    .collect::<Vec<_>>(),
            );
            reasons.push(
                "goal boot: the new configuration becomes active at the next boot".to_owned(),
            );
        }
        let since = self
            .core
            .state
            .reboot
            .as_ref()
            .map_or_else(util::now, |r| r.since);
        self.core.state.reboot = (!reasons.is_empty()).then(|| RebootRequired {
            reasons,
            since,
            boot_id: apply::boot_id(),
        });
        if let Some(r) = &self.core.state.reboot {
            tracing::info!(reasons = ?r.reasons, "a reboot is required");
        }
    }

    /// Compares the running system with the one ginx produced last.
    fn check_drift(&mut self) {
        let (current_path, policy) = {
            let cfg = self.config.borrow();
            (cfg.system.current_system.clone(), cfg.apply.on_drift)
        };
        let expected = self.core.state.expected_system.clone();
        let current = system::resolve(&current_path);
        match (expected, current) {
            (Some(expected), Some(current)) if expected != current => {
                if self.drift.as_ref().is_some_and(|d| d.current == current) {
                    return;
                }
                tracing::warn!(expected = %expected.display(), current = %current.display(), policy = ?policy,
                    "the running system is not the one ginx produced (changed by hand?)");
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

    /// Runs `apply.on_success` / `apply.on_failure` on a task of its own: a failing hook is
    /// logged, never fatal.
    fn run_hook(&self, cfg: &Config, a: &Attempt) {
        let argv = if a.outcome == Outcome::Succeeded {
            cfg.apply.on_success.clone()
        } else {
            cfg.apply.on_failure.clone()
        };
        if argv.is_empty() {
            return;
        }
        let goal = match a.kind {
            AttemptKind::Apply => a.goal.as_str().to_owned(),
            AttemptKind::Rollback => "rollback".to_owned(),
        };
        let spec = apply::Spec {
            argv,
            cwd: cfg.state_dir.clone(),
            env: vec![
                ("GINX_NODE".into(), cfg.node_name().to_owned()),
                ("GINX_SOURCE".into(), a.source.clone()),
                ("GINX_REVISION".into(), a.revision.to_string()),
                ("GINX_GOAL".into(), goal),
                ("GINX_STATUS".into(), a.outcome.as_str().to_owned()),
                ("GINX_ERROR".into(), a.error.clone().unwrap_or_default()),
            ],
            timeout: cfg.apply.hook_timeout.get(),
            kill_grace: cfg.apply.kill_grace.get(),
        };
        let attempt = a.id;
        tokio::spawn(async move {
            let program = spec.argv[0].clone();
            let finished = match apply::start(spec) {
                Ok(r) => {
                    r.wait(std::future::pending(), |l| {
                        tracing::info!(target: "ginx::hook", attempt, "{}", l.line);
                    })
                    .await
                }
                Err(f) => f,
            };
            if !finished.success() {
                tracing::warn!(attempt, hook = %program, exit = ?finished.exit, "hook failed (ignored)");
            }
        });
    }

    /// Records a deployment of the tracked branch as the commit new heads must descend from.
    async fn record_deployed(&self, source: &str, revision: Revision) {
        let source = source.to_owned();
        let workspace = Arc::clone(&self.workspace);
        let result =
            tokio::task::spawn_blocking(move || workspace.advance_anchor(&source, &revision)).await;
        if let Ok(Err(e)) = result {
            tracing::warn!(error = %e, "cannot record the deployed commit in the clone");
        }
    }

    /// Shutting down with an attempt running. A `systemd-run` attempt runs on: the next ginx
    /// follows it. A `process` attempt gets `shutdown_grace` to finish, then is stopped.
    async fn stop(&mut self, mut a: Attempting) {
        if matches!(self.isolation, Isolation::SystemdRun { .. }) {
            tracing::info!(
                attempt = a.id,
                "leaving the running attempt to its unit; the next ginx follows it"
            );
            a.task.abort();
            return;
        }
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
            exit: Exit::SpawnFailed(format!("attempt task failed: {e}")),
            output: Vec::new(),
        });
        self.finish(a.id, finished).await;
    }
}

/// Quotes `s` for `/bin/sh`.
fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_quoting_survives_quotes_and_spaces() {
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
    }
}
