//! The apply step: what an attempt runs to make a revision the running system. Two
//! implementations, chosen by `apply.mode`: `colmena` runs `apply.command` in the checkout
//! (evaluating and building the hive on the node); `closure` runs `ginx apply-closure` on the
//! store path the revision points at (built elsewhere, fetched from a binary cache). The
//! reconciler starts, follows and records either the same way.

use std::path::{Path, PathBuf};

use super::closure;
use crate::config::{ApplyMode, Config};
use crate::types::{ClosureInfo, Goal, Revision};

/// What the runner is given for one attempt.
#[derive(Clone, Debug)]
pub struct StepCommand {
    pub argv: Vec<String>,
    pub cwd: PathBuf,
    /// Closure mode: the store path and where it came from.
    pub closure: Option<ClosureInfo>,
}

/// The command of an attempt applying `revision` (checked out at `tree`) with `goal`; `dir` is
/// the attempt's directory. `Err` says why it cannot start (nothing has run then).
pub async fn prepare(
    cfg: &Config,
    tree: &Path,
    revision: &Revision,
    goal: Goal,
    dir: &Path,
) -> Result<StepCommand, String> {
    let node = cfg.node_name();
    let source = &cfg.apply.source;
    match (cfg.apply.mode, &cfg.apply.closure) {
        (ApplyMode::Closure, Some(c)) => {
            let (path, origin) = closure::resolve(c, node, source, tree, revision).await?;
            let exe = std::env::current_exe()
                .map_err(|e| format!("cannot find ginx's own binary for apply-closure: {e}"))?;
            let argv = closure::argv(
                &exe,
                c,
                &path,
                &origin,
                goal,
                &closure::Files {
                    profile: &cfg.system.profile,
                    gcroot: &cfg.state_dir.join("gcroots/next"),
                    report: &dir.join(closure::REPORT_FILE),
                },
            );
            Ok(StepCommand {
                argv,
                cwd: tree.to_owned(),
                closure: Some(ClosureInfo {
                    path,
                    origin,
                    closure_size: None,
                    realise_seconds: None,
                    error: None,
                    permanent: false,
                }),
            })
        }
        (ApplyMode::Closure, None) => {
            Err("apply.mode is \"closure\" but [apply.closure] is missing".to_owned())
        }
        (ApplyMode::Colmena, _) => {
            let subdir = cfg.sources.get(source).and_then(|s| s.path.clone());
            let cwd = match &subdir {
                Some(p) => tree.join(p),
                None => tree.to_owned(),
            };
            if !cwd.is_dir() {
                return Err(format!(
                    "directory {} (sources.{source}.path) does not exist in revision {revision}",
                    subdir.unwrap_or_default().display()
                ));
            }
            let mut argv: Vec<String> = cfg
                .apply
                .command
                .iter()
                .map(|a| a.replace("{node}", node))
                .collect();
            argv.push(goal.as_str().to_owned());
            Ok(StepCommand {
                argv,
                cwd,
                closure: None,
            })
        }
    }
}

impl StepCommand {
    /// What the runner needs to compute the plan of the system this step builds: the store
    /// path in closure mode, else `disruption.system_command` run in the checkout.
    pub fn plan_spec(&self, cfg: &Config) -> super::plan::PlanSpec {
        let node = cfg.node_name();
        super::plan::PlanSpec {
            system: self.closure.as_ref().map(|c| PathBuf::from(&c.path)),
            system_command: cfg
                .disruption
                .system_command
                .iter()
                .map(|a| a.replace("{node}", node))
                .collect(),
            cwd: self.cwd.clone(),
            current: cfg.system.current_system.clone(),
            booted: cfg.system.booted_system.clone(),
            nix: cfg
                .apply
                .closure
                .as_ref()
                .map_or_else(|| PathBuf::from("nix"), |c| c.nix.clone()),
            timeout_secs: cfg.disruption.timeout.get().as_secs(),
        }
    }
}
