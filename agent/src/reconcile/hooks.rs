//! `apply.on_success` / `apply.on_failure`, run on a task of their own; a failing hook is logged,
//! never fatal.

use super::Reconciler;
use crate::apply;
use crate::config::Config;
use crate::state::{Attempt, AttemptKind, Outcome};

impl Reconciler {
    /// Runs `apply.on_success` / `apply.on_failure` on a task of its own: a failing hook is
    /// logged, never fatal.
    pub(super) fn run_hook(&self, cfg: &Config, a: &Attempt) {
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
            AttemptKind::Build => "build".to_owned(),
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
            whole_tree: false,
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
}
