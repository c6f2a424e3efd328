//! The apply loop: watches the apply source's head, decides (with [`core::Core`]) when to run the
//! apply command, runs one attempt at a time in its runner, records every attempt with the
//! system generation before and after, and persists its state so that nothing already applied
//! is applied again after a restart. It also notices what happens to the system around it:
//! a reboot becoming necessary, someone changing the system by hand (drift), a new version of
//! ginx itself.
//!
//! One concern per file: the pure core in `core` (decisions and the checked transitions, the
//! only way the persisted state changes); here the loop itself (`run`, `handle`); `start`
//! (beginning an attempt), `finish` (recording one) and `outcome` (what its exit means, pure),
//! `slot` (the rollout slot around an attempt and the halt), `verify` (the health gate as the
//! loop runs it), `rollback`, `reboot` (a reboot ginx carries out, with its drain), `drift`,
//! `hooks`, `resume` (after a restart), `stop` (at shutdown) and `publish` (its part of status).
//!
//! Layer 6: drives the workers (`apply`, `source`) and reads `state`, `status`, `config`,
//! `types`. It must not import `control`, `daemon` or `cli`. Not here: fetching (see `source`),
//! running processes and reading the system (see `apply`).

pub mod core;
mod drift;
mod finish;
mod hooks;
mod outcome;
mod publish;
mod reboot;
mod resume;
mod rollback;
mod slot;
mod start;
mod stop;
#[cfg(test)]
mod tests;
mod verify;

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
use crate::state::{self, Attempt, AttemptKind, History, State};
use crate::status::{Drift, Published, StateWriteError, WaitingFor};
use crate::types::{Revision, SourceReports};
use crate::util;

pub use self::core::{Core, Decision, Desired, Ending, RetryPolicy};

/// Requests to the loop.
#[derive(Debug)]
pub enum Command {
    /// Answers whether anything changed; persisted before answering, or answered with why it
    /// could not be (and then nothing changed).
    Suspend(oneshot::Sender<Result<bool, String>>),
    Resume(oneshot::Sender<Result<bool, String>>),
    /// Retry a failed revision now (after `ginxctl sync`), and look at the system again.
    Retry,
    /// `ginxctl retry`: forget failures, give-ups and a rollback; apply again now.
    ForceRetry(oneshot::Sender<Result<(), String>>),
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
    sources: watch::Receiver<SourceReports>,
    workspace: Arc<Workspace>,
    commands: mpsc::Receiver<Command>,
    published: watch::Sender<Published>,
    shutdown: watch::Receiver<bool>,
    /// Asks the daemon to restart into a new version of ginx.
    restart: watch::Sender<Option<SelfRestart>>,
    isolation: Isolation,
    metrics: Arc<crate::metrics::Metrics>,
    notices: crate::types::Notices,
    /// Whether the loss of the slot held was told (once per loss).
    told_lost: bool,
    /// Inside a step whose transitions make one change (an attempt's end and its gate's
    /// opening): published once, at the step's end, not after each.
    publish_held: bool,
    /// ginx's binary and unit as they were when it started.
    self_image: SelfImage,
    /// The latest attempt, for `started_at`/`finished_at` in status.
    last: Option<(Timestamp, Option<Timestamp>)>,
    drift: Option<Drift>,
    /// A revision offered before another was deployed that it does not descend from (a
    /// force-push racing an apply): not applied; the source refuses it on its next fetch.
    blocked: Option<Revision>,
    /// The history has changes not yet written to `history.json`.
    history_dirty: bool,
    /// The last write of the state or the history failed: nothing is applied until one
    /// succeeds (retried every [`PERSIST_RETRY`]); status and health show it.
    unsaved: Option<StateWriteError>,
    /// The rollout: asked before every apply (lock, fleet, quorum), and the gate's checks.
    gatekeeper: crate::rollout::Gatekeeper,
    /// The checks as they were just before the activation: the gate's baseline.
    baseline: BTreeMap<String, crate::status::HealthStatus>,
    /// What blocks the open gate now (for status).
    gate_failing: BTreeMap<String, String>,
    /// When the failed revision's retry is due, on the monotonic clock.
    retry_clock: RetryClock,
    /// The open gate's own times on the monotonic clock, for the gate that started at the
    /// wall-clock time given (the persisted `verifying.started_at`); and whether a step of the
    /// wall clock during it was logged.
    gate_times: Option<(Timestamp, crate::rollout::decide::gate::Times, bool)>,
    /// Steps of the wall clock outside a gate (the gate logs its own).
    wall_steps: util::WallSteps,
    /// A lock release or a halt that failed is tried again after this.
    lock_retry_at: Option<std::time::Instant>,
    /// The API clients as the daemon makes them (none until it has).
    kube: watch::Receiver<Option<crate::k8s::KubeClients>>,
    /// The reboot as far as it is not persisted: what it waits for, the drain's pods.
    reboot_view: reboot::RebootView,
    /// The drain before a live activation, as far as it is not persisted.
    live_drain: reboot::LiveDrain,
}

/// How often a failed write of the state is tried again.
const PERSIST_RETRY: std::time::Duration = std::time::Duration::from_secs(2);

/// Everything the loop is wired to.
pub struct Wiring {
    pub metrics: Arc<crate::metrics::Metrics>,
    /// Where what happens is told (Events, webhooks).
    pub notices: crate::types::Notices,
    pub config: watch::Receiver<Arc<Config>>,
    pub sources: watch::Receiver<SourceReports>,
    pub workspace: Arc<Workspace>,
    pub commands: mpsc::Receiver<Command>,
    pub published: watch::Sender<Published>,
    pub shutdown: watch::Receiver<bool>,
    pub restart: watch::Sender<Option<SelfRestart>>,
    pub rollout: crate::rollout::Wiring,
    /// The API clients, for what the reconciler does to its own Node and pods (the reboot's
    /// cordon and drain); the rollout gets its own receiver of the same watch.
    pub kube: watch::Receiver<Option<crate::k8s::KubeClients>>,
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
        let mut guard_downgrade = false;
        if let Some(a) = aside {
            if a.newer {
                guard_downgrade = true;
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
        if history.dropped_on_load > 0 {
            tracing::warn!(file = %history_path.display(), dropped = history.dropped_on_load, kept = history.attempts.len(),
                "history file held more attempts than are kept; the oldest are left out (the file is rewritten at the next attempt)");
        }
        let last = history
            .attempts
            .last()
            .map(|a| (a.started_at, Some(a.finished_at)));
        let attempts_dir = cfg.state_dir.join("attempts");
        let mut core = Core::new(st);
        core.skip_used_ids(
            history
                .attempts
                .iter()
                .map(|a| a.id)
                .chain(attempt_dirs(&attempts_dir)),
        );
        let isolation = Isolation::resolve(&cfg.apply);
        tracing::info!(
            isolation = isolation.name(),
            "applies are isolated from ginx"
        );
        let mut r = Self {
            core,
            history,
            state_path,
            history_path,
            attempts_dir,
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
            notices: w.notices,
            told_lost: false,
            publish_held: false,
            last,
            drift: None,
            blocked: None,
            history_dirty: false,
            unsaved: None,
            gatekeeper: crate::rollout::Gatekeeper::new(w.rollout),
            kube: w.kube,
            baseline: BTreeMap::new(),
            gate_failing: BTreeMap::new(),
            gate_times: None,
            retry_clock: RetryClock::default(),
            wall_steps: util::WallSteps::default(),
            lock_retry_at: None,
            reboot_view: reboot::RebootView::default(),
            live_drain: reboot::LiveDrain::default(),
        };
        if guard_downgrade {
            // At once: the guard must hold across every restart until an operator resumes,
            // not only this one (a failure shows in status and holds applies back too).
            let _ = r.save_state();
        }
        // Status says what the state file says from the first request on, not "nothing
        // applied" until the loop's first round (which may wait for a source first).
        r.publish();
        Ok(r)
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

    /// Writes the state (and the history, when it changed). A failure is kept in `unsaved`,
    /// shown in status and health, and holds applies back until a later write succeeds.
    /// Writes the history (when it changed) and then the state. In that order: a finished
    /// attempt leaves the state (no longer in flight) only once its record is on disk, so a
    /// stop between the two writes finds it still in flight and records it again (the same
    /// id, replaced), where the other order would lose it.
    fn save_state(&mut self) -> Result<(), String> {
        let history = if self.history_dirty {
            state::save(&self.history_path, &self.history).map_err(|e| {
                format!(
                    "cannot write the history file {}: {e}",
                    self.history_path.display()
                )
            })
        } else {
            Ok(())
        };
        let result = history.and_then(|()| {
            state::save(&self.state_path, self.core.state()).map_err(|e| {
                format!(
                    "cannot write the state file {}: {e}",
                    self.state_path.display()
                )
            })
        });
        match &result {
            Ok(()) => {
                self.history_dirty = false;
                if self.unsaved.take().is_some() {
                    tracing::info!(file = %self.state_path.display(), "the state is written again; applies continue");
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot persist the state; nothing is applied until it can be written");
                let since = self.unsaved.as_ref().map_or_else(util::now, |u| u.since);
                self.unsaved = Some(StateWriteError {
                    error: e.clone(),
                    since,
                });
            }
        }
        result
    }

    /// Applies `change` to the core and persists it, then publishes it: status says it the
    /// moment it is on disk, whichever branch of the loop made it. If it cannot be persisted,
    /// the change is undone (what status says is what is on disk) and the reason returned.
    fn change_persisted<T>(&mut self, change: impl FnOnce(&mut Core) -> T) -> Result<T, String> {
        let before = self.core.clone();
        let out = change(&mut self.core);
        let saved = self.save_state();
        if saved.is_err() {
            self.core = before;
        }
        if !self.publish_held {
            self.publish();
        }
        saved.map(|()| out)
    }

    /// What the apply waits for (or `None`), published at once when it changed; returns
    /// whether it did.
    fn set_wait(&mut self, w: Option<(WaitingFor, String)>) -> bool {
        let changed = self.core.set_waiting(w, util::now());
        if changed && !self.publish_held {
            self.publish();
        }
        changed
    }

    /// Makes a checked transition of the core and persists it. One the core refuses (a bug in
    /// the caller) is logged and changes nothing; one that cannot be persisted is undone, as in
    /// [`change_persisted`](Self::change_persisted). Either way the reason is returned.
    fn transition<T>(
        &mut self,
        change: impl FnOnce(&mut Core) -> Result<T, core::TransitionError>,
    ) -> Result<T, String> {
        match self.change_persisted(change)? {
            Ok(out) => Ok(out),
            Err(e) => {
                tracing::error!(error = %e, "a change of the state was refused");
                Err(e.to_string())
            }
        }
    }

    /// Puts `attempt` in the history in memory; the next write of the state writes it first.
    fn remember(&mut self, attempt: Attempt) {
        self.last = Some((attempt.started_at, Some(attempt.finished_at)));
        self.history.push(attempt);
        self.history_dirty = true;
    }

    /// A slot lost while held is told once per loss (the metric and a `SlotLost` notice).
    fn tell_lost(&mut self) {
        let lost = self.gatekeeper.lost();
        if lost == self.told_lost {
            return;
        }
        self.told_lost = lost;
        if !lost {
            return;
        }
        self.metrics.slot_lost(true);
        let held = self.gatekeeper.held().cloned();
        let revision = held.as_ref().map(|h| h.revision.clone());
        self.notices.emit(
            crate::types::Reason::SlotLost,
            revision.as_ref().map(|r| r.as_str()),
            format!(
                "the rollout slot{} held for revision {} was lost (taken by another node, or not renewed within its duration): nothing new starts until a slot is taken again",
                held.as_ref()
                    .and_then(|h| h.slot)
                    .map_or(String::new(), |s| format!(" {s}")),
                revision.as_ref().map_or("-", |r| r.short())
            ),
        );
    }

    pub async fn run(mut self) {
        self.refresh_reboot_after_boot();
        self.seed_anchor().await;
        let mut attempting = self.resume_in_flight().await;
        let mut drift_tick =
            tokio::time::interval(self.config.borrow().system.drift_check_interval.get());
        drift_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            self.tell_lost();
            self.publish();
            let now = util::now();
            self.look_at_clocks(now);
            let decision = self.decide_turn(attempting.is_some(), now);
            let reboot_turn =
                attempting.is_none() && self.unsaved.is_none() && self.reboot_turn(&decision);
            // A build holds no slot: it goes on whatever the rollout says (a reboot's turn
            // comes first).
            if attempting.is_none() {
                self.settle_live_drain().await;
                self.settle_lock(&decision).await;
                self.write_halt().await;
            }
            let mut reboot_wait = None;
            if reboot_turn {
                match self.step_reboot().await {
                    reboot::Step::Again => continue,
                    other => reboot_wait = Some(other),
                }
            } else if let Acted::Again(started) = self.act(&decision).await {
                if started.is_some() {
                    attempting = started;
                }
                continue;
            }
            if reboot_wait.is_none() {
                reboot_wait = self.live_drain.again.take().map(reboot::Step::After);
            }
            let (sentinel, window_edge) = self.looks();
            let (sentinel, window_edge) = (sleep_for(sentinel), sleep_for(window_edge));
            let rollout = wait_for_rollout(
                &mut self.gatekeeper,
                reboot_wait,
                (decision == Decision::Verify)
                    .then(|| self.config.borrow().rollout.gate.interval.get()),
                self.core.waiting.is_some() || self.lock_retry_at.is_some(),
            );
            let retry = sleep_for(
                matches!(decision, Decision::RetryAt(_))
                    .then(|| self.retry_clock.left(std::time::Instant::now())),
            );
            let finishing = async {
                match attempting.as_mut() {
                    Some(a) => (&mut a.task).await,
                    None => std::future::pending().await,
                }
            };
            let persist_again = sleep_for(self.unsaved.is_some().then_some(PERSIST_RETRY));
            tokio::select! {
                () = retry => {}
                () = rollout => {}
                () = sentinel => {}
                () = window_edge => {}
                () = persist_again => {
                    let _ = self.save_state();
                }
                finished = finishing => {
                    if let Some(a) = attempting.take() {
                        self.finish(a.id, finished_or_failed(finished)).await;
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

    /// What the core decides this turn; `busy` while an attempt runs.
    /// When to look again without being told: `reboot.sentinel` appears without telling
    /// anyone, so it is looked at every few seconds while ginx may reboot; and status says
    /// whether a window is open or a freeze holds, so it is published again when one opens or
    /// closes, begins or ends.
    fn looks(&self) -> (Option<std::time::Duration>, Option<std::time::Duration>) {
        let cfg = self.config.borrow();
        let sentinel = (cfg.reboot.mode == crate::config::RebootMode::WhenRequired
            && self.core.state().phase.rebooting().is_none())
        .then_some(reboot::SENTINEL_POLL);
        (
            sentinel,
            publish::until_window_edge(&cfg.rollout.windows, &cfg.rollout.freezes),
        )
    }

    fn decide_turn(&mut self, busy: bool, now: Timestamp) -> Decision {
        if busy {
            return Decision::Busy;
        }
        if self.unsaved.is_some() {
            // Another attempt would pile an outcome on one that is not on disk.
            return Decision::Idle;
        }
        let desired = self.desired();
        self.core.prebuild = self.config.borrow().apply.prebuild;
        let at = self.core.state().failure.as_ref().map(|f| f.next_retry_at);
        let retry_now = self.retry_clock.now(at, now, std::time::Instant::now());
        self.core
            .decide(desired.as_ref().map(|(d, _)| d), retry_now)
    }

    /// Acts on the core's decision (when the turn is not the reboot's).
    async fn act(&mut self, decision: &Decision) -> Acted {
        match decision {
            Decision::Start(desired) if self.blocked.as_ref() != Some(&desired.revision) => {
                if let Some(why) = self.live_drain.put_off(&desired.revision) {
                    self.set_wait(Some(why));
                } else if self.ask(desired).await {
                    self.live_drain_activated(&desired.revision);
                    let testing = self.desired().is_some_and(|(_, t)| t);
                    return Acted::Again(
                        self.start_apply(desired.clone(), testing, AttemptKind::Apply)
                            .await,
                    );
                }
            }
            Decision::Build(desired) if self.blocked.as_ref() != Some(&desired.revision) => {
                self.set_wait(None);
                let testing = self.desired().is_some_and(|(_, t)| t);
                return Acted::Again(
                    self.start_apply(desired.clone(), testing, AttemptKind::Build)
                        .await,
                );
            }
            Decision::RollBack => {
                if let Some(a) = self.roll_back_after_gate().await {
                    return Acted::Again(Some(a));
                }
            }
            Decision::Verify => {
                if self.step_gate().await {
                    return Acted::Again(None);
                }
            }
            _ => {
                self.set_wait(None);
            }
        }
        Acted::Wait
    }

    async fn handle(&mut self, cmd: Command, busy: bool) -> Option<Attempting> {
        match cmd {
            Command::Suspend(reply) => {
                let result = self
                    .change_persisted(|c| c.set_suspended(true))
                    .map_err(|e| format!("{e}; not suspended"));
                if result == Ok(true) {
                    tracing::info!("suspended: sources keep fetching, nothing is applied");
                }
                let _ = reply.send(result);
            }
            Command::Resume(reply) => {
                let result = self
                    .change_persisted(|c| c.set_suspended(false))
                    .map_err(|e| format!("{e}; not resumed"));
                if result == Ok(true) {
                    tracing::info!("resumed");
                }
                let _ = reply.send(result);
            }
            Command::Retry => {
                self.core.request_retry();
                if !busy {
                    self.check_drift();
                }
            }
            Command::ForceRetry(reply) => {
                let result = self
                    .change_persisted(Core::force_retry)
                    .map_err(|e| format!("{e}; nothing was retried"));
                if result.is_ok() {
                    tracing::info!("retry requested: failures, give-ups and rollbacks forgotten");
                }
                let _ = reply.send(result);
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

/// What acting on a decision led to.
enum Acted {
    /// Go round again at once, with the attempt started, if one was.
    Again(Option<Attempting>),
    /// Wait for something to change.
    Wait,
}

/// An attempt's task's end: what it finished with, or a failure to start when the task itself
/// failed.
fn finished_or_failed(task: Result<Finished, tokio::task::JoinError>) -> Finished {
    task.unwrap_or_else(|e| Finished {
        exit: Exit::SpawnFailed(format!("attempt task failed: {e}")),
        output: Vec::new(),
    })
}

/// Sleeps for `d`, or forever without one.
async fn sleep_for(d: Option<std::time::Duration>) {
    match d {
        Some(d) => tokio::time::sleep(d).await,
        None => std::future::pending().await,
    }
}

/// Waits for what the rollout side of this turn waits for: the reboot's next step, the gate's
/// next look (`gate_interval` while one is open), a change of the rollout while `waiting`, or
/// else the loss of the slot held.
async fn wait_for_rollout(
    gatekeeper: &mut crate::rollout::Gatekeeper,
    reboot_wait: Option<reboot::Step>,
    gate_interval: Option<std::time::Duration>,
    waiting: bool,
) {
    if let Some(step) = reboot_wait {
        match step {
            reboot::Step::After(d) => tokio::time::sleep(d).await,
            _ => gatekeeper.changed().await,
        }
    } else if let Some(interval) = gate_interval {
        tokio::time::sleep(interval).await;
    } else if waiting {
        gatekeeper.changed().await;
    } else {
        gatekeeper.until_lost().await;
    }
}

/// The retry backoff on the monotonic clock: `next_retry_at` (persisted, wall clock, for status
/// and restarts) is turned into a monotonic due time the first time this process sees it, so
/// a step of the wall clock neither brings a retry forward nor holds it back.
#[derive(Debug, Default)]
struct RetryClock {
    /// The persisted retry time, and when it is due on the monotonic clock.
    due: Option<(Timestamp, std::time::Instant)>,
}

impl RetryClock {
    /// The time to decide with: the wall clock's `wall`, but for a pending retry `at`, `at`
    /// less the monotonic time left until it is due.
    fn now(
        &mut self,
        at: Option<Timestamp>,
        wall: Timestamp,
        mono: std::time::Instant,
    ) -> Timestamp {
        let Some(at) = at else {
            self.due = None;
            return wall;
        };
        let due = match self.due {
            Some((t, due)) if t == at => due,
            _ => {
                let left =
                    std::time::Duration::try_from(wall.duration_until(at)).unwrap_or_default();
                let due = mono.checked_add(left).unwrap_or(mono);
                self.due = Some((at, due));
                due
            }
        };
        let left = due.saturating_duration_since(mono);
        util::before(at, left)
    }

    /// How long until the pending retry is due.
    fn left(&self, mono: std::time::Instant) -> std::time::Duration {
        self.due.map_or(std::time::Duration::ZERO, |(_, due)| {
            due.saturating_duration_since(mono)
        })
    }
}

/// The ids of the attempt folders under `dir` (`attempts/<id>`).
fn attempt_dirs(dir: &std::path::Path) -> Vec<u64> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod retry_clock_tests {
    use super::*;

    /// A wall-clock step after a failure neither brings its retry forward nor holds it back.
    #[test]
    fn a_retry_is_due_by_the_monotonic_clock_whatever_the_wall_clock_does() {
        let mut c = RetryClock::default();
        let wall = Timestamp::from_second(1_800_000_000).unwrap();
        let at = wall + jiff::SignedDuration::from_secs(60);
        let mono = std::time::Instant::now();
        // Seen 60 s before it is due.
        assert!(c.now(Some(at), wall, mono) < at);
        // The wall clock jumps an hour ahead 10 s later: still 50 s to go.
        let later = mono + std::time::Duration::from_secs(10);
        let stepped = wall + jiff::SignedDuration::from_secs(3600);
        let now = c.now(Some(at), stepped, later);
        assert!(now < at, "due at once after the step");
        assert_eq!(c.left(later), std::time::Duration::from_secs(50));
        // Or an hour back at 61 s: due.
        let due = mono + std::time::Duration::from_secs(61);
        let back = wall - jiff::SignedDuration::from_secs(3600);
        assert!(c.now(Some(at), back, due) >= at, "held back by the step");
        // No failure: the wall clock.
        assert_eq!(c.now(None, back, due), back);
    }
}
