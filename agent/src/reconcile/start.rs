//! Starting an attempt: the tree pinned, the attempt recorded as in flight, the runner launched
//! and followed; a revision that no longer descends from what was deployed is not started.

use std::path::PathBuf;
use std::sync::Arc;

use tokio::sync::oneshot;
use tracing::Instrument;

use super::core::Desired;
use super::{Attempting, Reconciler};
use crate::apply::isolation::{self, Isolation, Launch};
use crate::apply::system;
use crate::apply::{self, Exit, Finished};
use crate::source::Pin;
use crate::state::{AttemptKind, InFlight};
use crate::types::{Goal, Revision};
use crate::util;

impl Reconciler {
    /// The tree of `revision`, checked out (or already there) and kept while the pin lives.
    pub(super) async fn pin_tree(&self, source: &str, revision: &Revision) -> Result<Pin, String> {
        let trees = self.workspace.trees(source);
        let clone = self.workspace.clone_of(source);
        let rev = revision.clone();
        tokio::task::spawn_blocking(move || trees.checkout(&clone, &rev))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())
    }

    /// Starts following `handle` on a task of its own.
    pub(super) fn follow(
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

    pub(super) fn attempt_dir(&self, id: u64) -> PathBuf {
        self.attempts_dir.join(id.to_string())
    }

    /// The token the running attempt's runner is given.
    pub(super) fn running_token(&self) -> String {
        self.core
            .running()
            .and_then(|r| r.token.clone())
            .unwrap_or_default()
    }

    /// Begins an attempt; returns its id, or why it could not begin. An attempt whose start
    /// cannot be persisted does not begin: a restart would not know it ran.
    pub(super) fn begin(&mut self, attempt: InFlight) -> Result<u64, String> {
        let attempts_dir = self.attempts_dir.clone();
        let token = crate::apply::runner::new_token();
        let id = self.transition(|core| {
            let id = core.begin(attempt)?;
            core.update_running(|r| {
                r.dir = Some(attempts_dir.join(id.to_string()));
                r.token = Some(token);
            })?;
            Ok(id)
        });
        match id {
            Ok(id) => {
                self.last = Some((util::now(), None));
                self.publish();
                Ok(id)
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot start an attempt");
                Err(e)
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

    /// Starts an apply of `desired` (`AttemptKind::Apply`), or its build without an activation
    /// (`AttemptKind::Build`, `apply.prebuild`: goal `build`, before any slot is asked for).
    pub(super) async fn start_apply(
        &mut self,
        desired: Desired,
        testing: bool,
        kind: AttemptKind,
    ) -> Option<Attempting> {
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
        let building = kind == AttemptKind::Build;
        let unit = format!(
            "ginx-{}-{}",
            if building { "build" } else { "apply" },
            revision.short()
        );
        let step_goal = if building { Goal::Build } else { goal };
        let id = self
            .begin(InFlight {
                id: 0,
                kind,
                source: source.clone(),
                revision: revision.clone(),
                goal,
                started_at: util::now(),
                testing,
                isolation: self.isolation.name().to_owned(),
                unit: matches!(self.isolation, Isolation::SystemdRun { .. }).then(|| unit.clone()),
                dir: None,
                token: None,
                generation_before: system::generation(&cfg.system.profile),
                pgid: None,
                boot_id: None,
                start_time: None,
                closure: None,
            })
            .ok()?;
        self.announce_start(id, kind, &source, &revision, goal);
        let tree = match self.pin_tree(&source, &revision).await {
            Ok(tree) => tree,
            Err(e) => {
                self.fail_to_start(id, format!("cannot check out the revision: {e}"))
                    .await;
                return None;
            }
        };
        // Colmena or closure mode: the one apply step, started and followed alike.
        let step = match apply::step::prepare(
            &cfg,
            tree.path(),
            &revision,
            step_goal,
            &self.attempt_dir(id),
        )
        .await
        {
            Ok(s) => s,
            Err(e) => {
                self.fail_to_start(id, e).await;
                return None;
            }
        };
        if let Some(c) = &step.closure {
            tracing::info!(path = %c.path, from = %c.origin, build = building, "applying a prebuilt closure");
            let _ = self.core.update_running(|r| r.closure = Some(c.clone()));
            let _ = self.save_state();
        }
        let desired = Desired {
            revision: revision.clone(),
            goal,
        };
        let launch = self.apply_launch(&cfg, id, kind, &desired, step, unit);
        self.launch(id, &revision, &launch, Some(tree)).await
    }

    /// Logs the start of an apply or a build, and tells of an apply.
    fn announce_start(
        &self,
        id: u64,
        kind: AttemptKind,
        source: &str,
        revision: &Revision,
        goal: Goal,
    ) {
        let node = self.config.borrow().node_name().to_owned();
        let building = kind == AttemptKind::Build;
        if building {
            tracing::info!(source = %source, revision = %revision.short(), node = %node, attempt = id,
                isolation = self.isolation.name(), "building before the activation (apply.prebuild); no slot is held");
        } else {
            tracing::info!(source = %source, revision = %revision.short(), node = %node, attempt = id,
                goal = %goal, isolation = self.isolation.name(), "applying");
            self.notices.emit(
                crate::types::Reason::Applying,
                Some(revision.as_str()),
                format!(
                    "applying revision {} of {source} ({goal}), attempt {id}",
                    revision.short()
                ),
            );
        }
    }

    /// How the runner is started for an apply (or its build) of `desired`: `step`'s command,
    /// told what it applies through the environment, in the unit named `unit`.
    fn apply_launch(
        &self,
        cfg: &crate::config::Config,
        id: u64,
        kind: AttemptKind,
        desired: &Desired,
        step: apply::step::StepCommand,
        unit: String,
    ) -> Launch {
        let (source, revision, goal) = (&cfg.apply.source, &desired.revision, desired.goal);
        let building = kind == AttemptKind::Build;
        let step_goal = if building { Goal::Build } else { goal };
        let plan = building.then(|| step.plan_spec(cfg));
        Launch {
            plan,
            dir: self.attempt_dir(id),
            unit,
            cwd: step.cwd,
            argv: step.argv,
            env: vec![
                ("GINX_NODE".into(), cfg.node_name().to_owned()),
                ("GINX_SOURCE".into(), source.clone()),
                ("GINX_REVISION".into(), revision.to_string()),
                ("GINX_GOAL".into(), step_goal.as_str().into()),
            ],
            timeout: cfg.apply.timeout.get(),
            kill_grace: cfg.apply.kill_grace.get(),
            description: if building {
                format!("ginx: build {source} {revision}")
            } else {
                format!("ginx: apply {source} {revision} ({goal})")
            },
            token: self.running_token(),
        }
    }

    pub(super) async fn launch(
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
            let _ = self.save_state();
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
}
