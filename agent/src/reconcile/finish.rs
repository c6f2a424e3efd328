//! Finishing an attempt: its outcome recorded and persisted, the core told, the system looked at
//! again after an activation, and a deployment of the tracked branch made the new anchor.

use std::sync::Arc;

use super::core::Ending;
use super::{COLMENA_CONFIG_ERROR, Reconciler, SelfRestart};
use crate::apply::system::{self, SelfImage};
use crate::apply::{Exit, Finished};
use crate::config::Config;
use crate::state::{Attempt, AttemptKind, Outcome, RebootRequired};
use crate::types::{Goal, Revision};
use crate::util;

impl Reconciler {
    pub(super) async fn finish(&mut self, id: u64, ended: Finished) {
        // However it ends: the apply and its output are freed by then, so give the memory back.
        struct Trim;
        impl Drop for Trim {
            fn drop(&mut self) {
                util::memory::trim();
            }
        }
        let _trim = Trim;
        // A local declared after the guard (an argument would outlive it): freed before it trims.
        let finished = ended;
        let now = util::now();
        let cfg = Arc::clone(&self.config.borrow());
        let kind = self.core.running().map(|r| r.kind).unwrap_or_default();
        let running_goal = self.core.running().map(|r| r.goal);
        let running_before = self
            .core
            .running()
            .and_then(|r| r.generation_before.as_ref())
            .and_then(|g| g.number);
        // Closure mode: what `ginx apply-closure` found (its report), else what was started.
        let closure = self.core.running().and_then(|r| {
            r.dir
                .as_ref()
                .and_then(|d| std::fs::read(d.join(crate::apply::closure::REPORT_FILE)).ok())
                .and_then(|b| serde_json::from_slice::<crate::types::ClosureInfo>(&b).ok())
                .or_else(|| r.closure.clone())
                // Read back from a file: its path is what was checked, or it is not taken.
                .filter(|c| crate::types::check_store_path(&c.path).is_ok())
        });
        let closure_mode = cfg.apply.mode == crate::config::ApplyMode::Closure;
        let max_rss_kib = self.core.running().and_then(|r| {
            crate::apply::runner::read_result(r.dir.as_ref()?, r.token.as_deref())?.max_rss_kib
        });
        let (outcome, exit_code, error, give_up) = match &finished.exit {
            Exit::Code(0) => (Outcome::Succeeded, Some(0), None, false),
            Exit::Code(COLMENA_CONFIG_ERROR) if kind != AttemptKind::Rollback && !closure_mode => (
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
        // Closure mode says why in its own words (the signature, the missing path, not a
        // NixOS system, the switch and where the profile points now).
        let (error, give_up) = match closure.as_ref().and_then(|c| c.error.clone()) {
            Some(e) if matches!(finished.exit, Exit::Code(c) if c != 0) => (
                Some(e),
                give_up || closure.as_ref().is_some_and(|c| c.permanent),
            ),
            _ => (error, give_up),
        };
        // A closure attempt that did not end by itself (timed out, stopped, killed) could not
        // put the profile back: ginx does, before the attempt is recorded.
        let mut error = error;
        if closure.is_some()
            && kind == AttemptKind::Apply
            && matches!(running_goal, Some(Goal::Switch | Goal::Boot))
            && !matches!(finished.exit, Exit::Code(_))
            && let Some(before) = running_before
            && system::generation(&cfg.system.profile).and_then(|g| g.number) != Some(before)
        {
            let (nix_env, profile) = (
                cfg.apply
                    .closure
                    .as_ref()
                    .map_or_else(|| "nix-env".into(), |c| c.nix_env.clone()),
                cfg.system.profile.clone(),
            );
            let said = tokio::task::spawn_blocking(move || {
                crate::apply::closure::restore_profile(&nix_env, &profile, before)
            })
            .await
            .unwrap_or_else(|e| format!("the profile could not be put back: {e}"));
            tracing::warn!(attempt = id, "{said}");
            error = Some(format!("{}; {said}", error.unwrap_or_default()));
        }
        if closure.is_some() {
            self.core.state.closure = closure.clone();
        } else if kind == AttemptKind::Rollback && outcome == Outcome::Succeeded {
            // The closure shown is no longer what runs.
            self.core.state.closure = None;
        }
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
        if outcome == Outcome::Succeeded && done.kind != AttemptKind::Build {
            self.after_activation(&cfg, done.goal, done.kind);
        }
        if done.kind == AttemptKind::Build && outcome != Outcome::Succeeded {
            self.build_failed(&cfg, &done.revision, error.as_deref().unwrap_or(""))
                .await;
        }
        match outcome {
            Outcome::Succeeded => tracing::info!(attempt = id, kind = ?done.kind,
                revision = %done.revision.short(), generation = ?generation_after.as_ref().and_then(|g| g.number),
                "attempt succeeded"),
            _ => tracing::warn!(attempt = id, kind = ?done.kind, revision = %done.revision.short(),
                outcome = outcome.as_str(), error = error.as_deref().unwrap_or(""), "attempt failed"),
        }
        self.tell_outcome(
            done.kind,
            &done.revision,
            outcome,
            error.as_deref(),
            generation_after.as_ref().and_then(|g| g.number),
        );
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
            closure,
            max_rss_kib,
        };
        let took = attempt.finished_at.duration_since(attempt.started_at);
        self.metrics
            .applied(outcome.as_str(), took.as_secs_f64().max(0.0));
        self.run_hook(&cfg, &attempt);
        if outcome == Outcome::Succeeded {
            // Before the record is written: a restart finds the gate open, never skipped.
            if self.open_gate(done.kind, done.goal) {
                self.gatekeeper
                    .set_phase(crate::rollout::lease::SlotPhase::Verifying)
                    .await;
            }
        }
        let after_reboot = self
            .core
            .state
            .gate_failure
            .as_ref()
            .is_some_and(|g| g.after_reboot);
        if done.kind == AttemptKind::Rollback && after_reboot {
            if outcome == Outcome::Succeeded {
                self.reboot_into_rollback();
            } else {
                self.after_reboot_gate(false);
            }
        }
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

    /// The notice of an attempt's end.
    fn tell_outcome(
        &self,
        kind: AttemptKind,
        revision: &Revision,
        outcome: Outcome,
        error: Option<&str>,
        generation: Option<u64>,
    ) {
        use crate::types::Reason;
        let short = revision.short();
        let gen_ = generation.map_or(String::new(), |g| format!(" (generation {g})"));
        let error = error.unwrap_or(outcome.as_str());
        let (reason, message) = match (kind, outcome == Outcome::Succeeded) {
            (AttemptKind::Build, true) => return,
            (AttemptKind::Apply, true) => {
                (Reason::Applied, format!("applied revision {short}{gen_}"))
            }
            (AttemptKind::Rollback, true) => (
                Reason::RolledBack,
                format!("rolled back from revision {short} to the previous system{gen_}"),
            ),
            (AttemptKind::Build, false) => (
                Reason::ApplyFailed,
                format!("build of revision {short} failed (no slot taken): {error}"),
            ),
            (AttemptKind::Apply, false) => (
                Reason::ApplyFailed,
                format!("apply of revision {short} failed: {error}"),
            ),
            (AttemptKind::Rollback, false) => (
                Reason::RollbackUnhealthy,
                format!(
                    "the rollback from revision {short} failed: {error}; the node needs a person"
                ),
            ),
        };
        self.notices.emit(reason, Some(revision.as_str()), message);
    }

    /// A build that failed took no slot and halts nothing, unless
    /// `rollout.halt_on_build_failure` says a revision that fails to build anywhere is halted
    /// fleet-wide (best effort: a halt that cannot be written is logged).
    async fn build_failed(&mut self, cfg: &Config, revision: &Revision, error: &str) {
        if !cfg.rollout.halt_on_build_failure {
            tracing::info!(revision = %revision.short(),
                "the build failed before any slot was asked for; the rest of the fleet goes on (rollout.halt_on_build_failure = false)");
            return;
        }
        if !self.gatekeeper.can_halt() {
            return;
        }
        let node = cfg.node_name().to_owned();
        let halt = crate::status::Halt {
            revision: revision.clone(),
            node,
            probes: std::collections::BTreeMap::new(),
            reason: format!("build-failed: {error}"),
            at: util::now(),
            cause: crate::status::HaltCause::BuildFailed,
            group: None,
        };
        match self.gatekeeper.halt(halt).await {
            Ok(()) => {
                tracing::warn!(revision = %revision.short(),
                    "the build failed: revision halted cluster-wide (rollout.halt_on_build_failure)");
                self.notices.emit(
                    crate::types::Reason::RevisionHalted,
                    Some(revision.as_str()),
                    format!(
                        "revision {} halted fleet-wide by {}: its build failed here (rollout.halt_on_build_failure); `ginxctl rollout clear {}` lifts it",
                        revision.short(),
                        cfg.node_name(),
                        revision.short()
                    ),
                );
            }
            Err(e) => tracing::warn!(revision = %revision.short(), error = %e,
                "the build failed and the revision could not be halted cluster-wide"),
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
            boot_id: system::boot_id(&cfg.system.boot_id),
        });
        if let Some(r) = &self.core.state.reboot {
            tracing::info!(reasons = ?r.reasons, "a reboot is required");
        }
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
}
