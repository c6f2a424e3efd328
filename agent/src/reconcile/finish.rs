//! Finishing an attempt: its outcome recorded and persisted, the core told, the system looked at
//! again after an activation, and a deployment of the tracked branch made the new anchor. What
//! the attempt's exit means is decided in `outcome`; here is the I/O around it.

use std::sync::Arc;

use super::core::Ending;
use super::outcome::{self, Aftermath, Classified, RebootNext};
use super::{Reconciler, SelfRestart};
use crate::apply::system::{self, SelfImage};
use crate::apply::{Exit, Finished};
use crate::config::Config;
use crate::state::{Attempt, AttemptKind, InFlight, Outcome};
use crate::types::{ClosureInfo, Goal, Plan, Revision};
use crate::util;

/// An attempt's end as far as it is known before the core records it.
struct Concluded {
    class: Classified,
    closure: Option<ClosureInfo>,
    max_rss_kib: Option<u64>,
    /// A build's plan, decided by the disruption policy.
    plan: Option<Plan>,
}

impl Reconciler {
    pub(super) async fn finish(&mut self, id: u64, ended: Finished) {
        // An attempt's end and what follows from it (its gate opened, the reboot moved on)
        // are one change for status: published once, all of it made. Published alone, the end
        // would say "succeeded" for the moment before the gate opens.
        self.publish_held = true;
        self.end_attempt(id, ended).await;
        self.publish_held = false;
        self.publish();
    }

    /// Records the attempt's end and acts on it.
    async fn end_attempt(&mut self, id: u64, ended: Finished) {
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
        let c = self.conclude(&cfg, id, &finished.exit).await;
        let ending = Ending {
            outcome: c.class.outcome,
            error: c.class.error.clone(),
            give_up: c.class.give_up,
            plan: c.plan.clone(),
        };
        let policy = self.policy();
        let done = match self.core.complete(id, ending, now, policy) {
            Ok(d) => d,
            Err(e) => {
                tracing::error!(error = %e, "cannot record the end of an attempt");
                return;
            }
        };
        let after_reboot = self
            .core
            .state()
            .gate_failure
            .as_ref()
            .is_some_and(|g| g.after_reboot);
        let next = outcome::aftermath(done.kind, c.class.outcome, done.testing, after_reboot);
        let generation_after = system::generation(&cfg.system.profile);
        let generation = generation_after.as_ref().and_then(|g| g.number);
        let attempt = Attempt {
            id,
            kind: done.kind,
            source: done.source.clone(),
            revision: done.revision.clone(),
            goal: done.goal,
            started_at: done.started_at,
            finished_at: now,
            outcome: c.class.outcome,
            exit_code: c.class.exit_code,
            error: c.class.error.clone(),
            output: finished.output,
            generation_before: done.generation_before.clone(),
            generation_after,
            isolation: done.isolation.clone(),
            closure: c.closure,
            max_rss_kib: c.max_rss_kib,
            plan: c.plan,
        };
        // In the history before anything writes the state that no longer has it in flight.
        self.remember(attempt.clone());
        self.report_end(&cfg, id, &done, &c.class, next, generation)
            .await;
        if let Some(plan) = &attempt.plan {
            self.tell_plan(&done.revision, plan);
        }
        let took = attempt.finished_at.duration_since(attempt.started_at);
        self.metrics
            .applied(c.class.outcome.as_str(), took.as_secs_f64().max(0.0));
        self.run_hook(&cfg, &attempt);
        self.follow_up(&cfg, &done, c.class.outcome, next).await;
    }

    /// What the running attempt's exit means, with closure mode's report; a profile a closure
    /// attempt left pointing elsewhere is put back, and the closure is told to the core.
    async fn conclude(&mut self, cfg: &Config, id: u64, exit: &Exit) -> Concluded {
        let running = self.core.running().cloned();
        let kind = running.as_ref().map(|r| r.kind).unwrap_or_default();
        // Closure mode: what `ginx apply-closure` found (its report), else what was started.
        let closure = running.as_ref().and_then(|r| {
            r.dir
                .as_ref()
                .and_then(|d| std::fs::read(d.join(crate::apply::closure::REPORT_FILE)).ok())
                .and_then(|b| outcome::parse_report(&b))
                .or_else(|| {
                    r.closure
                        .clone()
                        .filter(|c| crate::types::check_store_path(&c.path).is_ok())
                })
        });
        let max_rss_kib = running.as_ref().and_then(|r| {
            crate::apply::runner::read_result(r.dir.as_ref()?, r.token.as_deref())?.max_rss_kib
        });
        let timeout = cfg.apply.timeout.to_string();
        let cx = outcome::Context {
            kind,
            closure_mode: cfg.apply.mode == crate::config::ApplyMode::Closure,
            node: cfg.node_name(),
            timeout: &timeout,
        };
        let mut class =
            outcome::with_closure_error(outcome::classify(exit, &cx), exit, closure.as_ref());
        if let Some(r) = &running
            && let Some(said) = self.put_profile_back(cfg, r, closure.is_some(), exit).await
        {
            tracing::warn!(attempt = id, "{said}");
            class.error = Some(format!("{}; {said}", class.error.unwrap_or_default()));
        }
        let seen = closure.clone();
        let _ = self.core.closure_seen(seen, class.outcome);
        let plan = running
            .as_ref()
            .filter(|r| r.kind == AttemptKind::Build && class.outcome == Outcome::Succeeded)
            .and_then(|r| crate::apply::plan::compute::read(r.dir.as_ref()?))
            .map(|p| {
                crate::apply::plan::judged(p, &crate::apply::plan::Policy::new(&cfg.disruption))
            });
        Concluded {
            class,
            closure,
            max_rss_kib,
            plan,
        }
    }

    /// A closure attempt that did not end by itself (timed out, stopped, killed) could not put
    /// the profile back: ginx does, before the attempt is recorded. Returns what it said.
    async fn put_profile_back(
        &self,
        cfg: &Config,
        r: &InFlight,
        closure: bool,
        exit: &Exit,
    ) -> Option<String> {
        let before = r.generation_before.as_ref().and_then(|g| g.number);
        let before = outcome::profile_to_restore(closure, r.kind, r.goal, exit, before, || {
            system::generation(&cfg.system.profile).and_then(|g| g.number)
        })?;
        let nix_env = cfg
            .apply
            .closure
            .as_ref()
            .map_or_else(|| "nix-env".into(), |c| c.nix_env.clone());
        let profile = cfg.system.profile.clone();
        let said = tokio::task::spawn_blocking(move || {
            crate::apply::closure::restore_profile(&nix_env, &profile, before)
        })
        .await
        .unwrap_or_else(|e| format!("the profile could not be put back: {e}"));
        Some(said)
    }

    /// After the core recorded the end: the system looked at again after an activation, a
    /// failed build's halt, the log line and the notice.
    async fn report_end(
        &mut self,
        cfg: &Config,
        id: u64,
        done: &InFlight,
        class: &Classified,
        next: Aftermath,
        generation: Option<u64>,
    ) {
        let error = class.error.as_deref();
        if next.activated {
            self.after_activation(cfg, done.goal, done.kind);
        }
        if next.build_failed {
            self.build_failed(cfg, &done.revision, error.unwrap_or(""))
                .await;
        }
        match class.outcome {
            Outcome::Succeeded => tracing::info!(attempt = id, kind = ?done.kind,
                revision = %done.revision.short(), generation = ?generation,
                "attempt succeeded"),
            o => tracing::warn!(attempt = id, kind = ?done.kind, revision = %done.revision.short(),
                outcome = o.as_str(), error = error.unwrap_or(""), "attempt failed"),
        }
        if let Some((reason, message)) =
            outcome::notice(done.kind, &done.revision, class.outcome, error, generation)
        {
            self.notices
                .emit(reason, Some(done.revision.as_str()), message);
        }
    }

    /// A plan computed after a build: counted, logged, and told as a `Planned` notice.
    fn tell_plan(&self, revision: &crate::types::Revision, plan: &Plan) {
        self.metrics.planned(plan.action);
        let summary = plan.summary();
        tracing::info!(revision = %revision.short(), action = plan.action.as_str(),
            took_ms = plan.took_ms, "the plan of the revision: {summary}");
        self.notices.emit(
            crate::types::Reason::Planned,
            Some(revision.as_str()),
            format!(
                "revision {}: {summary} (computed in {} ms)",
                revision.short(),
                plan.took_ms
            ),
        );
    }

    /// What follows the attempt: its gate opened, the reboot moved on, the state and history
    /// written (then the attempt's directory freed), the anchor, and a restart into a new
    /// ginx.
    async fn follow_up(
        &mut self,
        cfg: &Config,
        done: &InFlight,
        outcome: Outcome,
        next: Aftermath,
    ) {
        if outcome == Outcome::Succeeded && self.open_gate(done.kind, done.goal) {
            self.gatekeeper
                .set_phase(crate::rollout::lock::lease::SlotPhase::Verifying)
                .await;
        }
        match next.reboot {
            Some(RebootNext::IntoRollback) => self.reboot_into_rollback(),
            Some(RebootNext::GateFailed) => self.after_reboot_gate(false),
            None => {}
        }
        // The attempt's directory (its result) goes only once the record is on disk: until
        // then a restart finds the attempt in flight and records it again from the result.
        if self.save_state().is_ok()
            && let Some(dir) = &done.dir
        {
            let _ = std::fs::remove_dir_all(dir);
        }
        if next.record_deployed {
            self.record_deployed(&done.source, done.revision.clone())
                .await;
        }
        if next.look_at_self {
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
        let halt = crate::rollout::Halt {
            revision: revision.clone(),
            node,
            probes: std::collections::BTreeMap::new(),
            reason: format!("build-failed: {error}"),
            at: util::now(),
            cause: crate::types::HaltCause::BuildFailed,
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
        let expected = system::resolve(&cfg.system.current_system);
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
        let boot = system::boot_id(&cfg.system.boot_id);
        let _ = self.transition(|c| c.activated(expected, reasons, boot, util::now()));
        if let Some(r) = &self.core.state().reboot {
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
