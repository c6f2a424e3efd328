//! `[apply]`: the apply command, its goal, timeouts, retries, isolation and hooks.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{ConfigError, Ctx, Duration};
use crate::types::Goal;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ApplyConfig {
    /// The source whose revisions are applied.
    pub source: String,
    /// argv; `{node}` is replaced by the node name and the goal is appended.
    pub command: Vec<String>,
    pub goal: Goal,
    /// An attempt running longer is killed, with its whole process group.
    pub timeout: Duration,
    /// First wait before retrying a failed revision; doubles per failure.
    pub retry_base: Duration,
    /// Cap on that wait.
    pub retry_max: Duration,
    /// Between SIGTERM and SIGKILL when an attempt is stopped.
    pub kill_grace: Duration,
    /// How long a SIGTERM to ginx waits for a running `process` attempt before stopping it
    /// (a `systemd-run` attempt runs on, and the next ginx attaches to it).
    pub shutdown_grace: Duration,
    /// Failed attempts of one revision before it is given up until a new revision or
    /// `ginxctl retry`.
    pub max_attempts: u32,
    /// How attempts are shielded from ginx's own restart.
    pub isolation: IsolationMode,
    /// Programs used for `systemd-run` isolation.
    pub systemd_run: PathBuf,
    pub systemctl: PathBuf,
    /// Run after a successful / failed attempt (argv), with GINX_NODE, GINX_SOURCE,
    /// GINX_REVISION, GINX_GOAL, GINX_STATUS and GINX_ERROR in the environment.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub on_success: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub on_failure: Vec<String>,
    /// A hook running longer is killed; a failing hook is logged, never fatal.
    pub hook_timeout: Duration,
    /// When the running system changes to one ginx did not produce: only `report` it, or
    /// `reapply` the applied revision.
    pub on_drift: DriftPolicy,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum IsolationMode {
    /// `systemd-run` when ginx runs as a systemd service and systemd-run exists, else `process`.
    #[default]
    Auto,
    SystemdRun,
    Process,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DriftPolicy {
    #[default]
    Report,
    Reapply,
}

impl Default for ApplyConfig {
    fn default() -> Self {
        Self {
            source: "hephaestus".to_owned(),
            command: ["colmena", "apply-local", "--node", "{node}"]
                .map(String::from)
                .to_vec(),
            goal: Goal::Switch,
            timeout: Duration::from_secs(30 * 60),
            retry_base: Duration::from_secs(30),
            retry_max: Duration::from_secs(30 * 60),
            kill_grace: Duration::from_secs(10),
            shutdown_grace: Duration::from_secs(60),
            max_attempts: 5,
            isolation: IsolationMode::Auto,
            systemd_run: PathBuf::from("systemd-run"),
            systemctl: PathBuf::from("systemctl"),
            on_success: Vec::new(),
            on_failure: Vec::new(),
            hook_timeout: Duration::from_secs(60),
            on_drift: DriftPolicy::Report,
        }
    }
}

/// Added to `shutdown_grace + kill_grace` for systemd's `TimeoutStopSec`: collecting the
/// attempt's end (at most a second) and ginx's own exit, with room to spare.
pub const STOP_MARGIN: std::time::Duration = std::time::Duration::from_secs(30);

impl ApplyConfig {
    /// The most a SIGTERM to ginx takes with a `process` attempt running: `shutdown_grace` for
    /// the attempt to finish, then one `kill_grace` to stop its whole tree (SIGTERM, SIGKILL),
    /// and [`STOP_MARGIN`]. What `TimeoutStopSec` of ginx.service must be at least, in whole
    /// seconds (nixos-module/stop-timeout.nix computes the same).
    pub fn stop_timeout_secs(&self) -> u64 {
        let d = self.shutdown_grace.get() + self.kill_grace.get();
        d.as_millis().div_ceil(1000) as u64 + STOP_MARGIN.as_secs()
    }

    /// Checks the command, timings, retries and hooks (`source` naming a source is checked by
    /// the caller, which knows the sources).
    pub(super) fn validate(&self, ctx: &Ctx<'_>) -> Result<(), ConfigError> {
        if self.command.first().is_none_or(|c| c.trim().is_empty()) {
            return Err(ctx.error(
                "apply.command",
                "must name a program, e.g. [\"colmena\", \"apply-local\", \"--node\", \"{node}\"]",
            ));
        }
        for (key, d) in [
            ("apply.timeout", self.timeout),
            ("apply.retry_base", self.retry_base),
            ("apply.retry_max", self.retry_max),
        ] {
            if d.is_zero() {
                return Err(ctx.error(key, "must be longer than 0s"));
            }
        }
        if self.retry_max < self.retry_base {
            return Err(ctx.error(
                "apply.retry_max",
                format!(
                    "{} is shorter than apply.retry_base ({})",
                    self.retry_max, self.retry_base
                ),
            ));
        }
        if self.max_attempts == 0 {
            return Err(ctx.error("apply.max_attempts", "must be at least 1"));
        }
        for (key, argv) in [
            ("apply.on_success", &self.on_success),
            ("apply.on_failure", &self.on_failure),
        ] {
            if argv.first().is_some_and(|p| p.trim().is_empty()) {
                return Err(ctx.error(key, "must name a program, or be empty for no hook"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 11.8: the stop bound is one kill_grace after shutdown_grace (plus a margin), the
    /// figure README, the unit and the module use.
    #[test]
    fn the_stop_timeout_is_shutdown_grace_plus_one_kill_grace_plus_margin() {
        let mut a = ApplyConfig::default();
        assert_eq!(a.stop_timeout_secs(), 60 + 10 + 30);
        a.shutdown_grace = Duration::from_millis(1500);
        a.kill_grace = Duration::from_secs(20);
        assert_eq!(a.stop_timeout_secs(), 22 + 30);
    }
}
