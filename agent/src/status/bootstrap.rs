//! The cluster bootstrap's part of status: how the last `ginxctl bootstrap` on this node went.
//! `ginxctl bootstrap` runs the stages itself and reports each step to the daemon (the
//! `bootstrap-report` request); the daemon keeps the last report, in memory and in
//! `<state_dir>/bootstrap.json`, and says `pending` when `[bootstrap]` is configured and no run
//! has reported yet.

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

/// Where a bootstrap is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BootstrapPhase {
    /// Configured; no run has reported on this node yet.
    Pending,
    /// Applying a stage's manifests.
    Applying,
    /// Waiting for a stage's objects.
    Waiting,
    /// Every stage held.
    Done,
    /// The run ended without every stage holding (`error` says why).
    Failed,
}

impl BootstrapPhase {
    pub fn as_str(self) -> &'static str {
        match self {
            BootstrapPhase::Pending => "pending",
            BootstrapPhase::Applying => "applying",
            BootstrapPhase::Waiting => "waiting",
            BootstrapPhase::Done => "done",
            BootstrapPhase::Failed => "failed",
        }
    }

    /// A run is under way.
    pub fn running(self) -> bool {
        matches!(self, BootstrapPhase::Applying | BootstrapPhase::Waiting)
    }
}

/// `bootstrap` in `ginxctl status --json`; `null` when `[bootstrap]` configures no stage.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BootstrapStatus {
    pub phase: BootstrapPhase,
    /// The stage being applied or waited for (the failed one, once failed).
    #[serde(default)]
    pub stage: Option<String>,
    /// What is waited for and why it does not hold yet
    /// (`daemonset/kube-system/cilium: 1 of 3 pods ready`).
    #[serde(default)]
    pub waiting_for: Option<String>,
    /// Why the last run failed.
    #[serde(default)]
    pub error: Option<String>,
    /// The stages that held in this run, in order.
    #[serde(default)]
    pub done: Vec<String>,
    #[serde(default)]
    pub started_at: Option<Timestamp>,
    #[serde(default)]
    pub updated_at: Option<Timestamp>,
    #[serde(default)]
    pub finished_at: Option<Timestamp>,
    /// The `ginxctl` process running it (taken from the socket peer, not from the report),
    /// and its start time (so that a reused pid is not taken for it).
    #[serde(default)]
    pub pid: Option<u32>,
    #[serde(default)]
    pub pid_start: Option<u64>,
    /// `--stage NAME`: the run was of that stage only.
    #[serde(default)]
    pub only: Option<String>,
}

impl BootstrapStatus {
    pub fn pending() -> Self {
        Self {
            phase: BootstrapPhase::Pending,
            stage: None,
            waiting_for: None,
            error: None,
            done: Vec::new(),
            started_at: None,
            updated_at: None,
            finished_at: None,
            pid: None,
            pid_start: None,
            only: None,
        }
    }

    /// A run that reported it was under way, but whose process is gone (interrupted, killed),
    /// is failed: status never claims a bootstrap that nobody runs.
    pub fn settled(mut self, alive: impl Fn(u32, Option<u64>) -> bool) -> Self {
        if self.phase.running()
            && let Some(pid) = self.pid
            && !alive(pid, self.pid_start)
        {
            self.phase = BootstrapPhase::Failed;
            self.error = Some(format!(
                "ginxctl bootstrap (pid {pid}) ended before it finished{}; run `ginxctl bootstrap` \
                 again (stages that held are not applied again)",
                self.stage
                    .as_ref()
                    .map(|s| format!(", in stage {s}"))
                    .unwrap_or_default()
            ));
            self.waiting_for = None;
        }
        self
    }

    /// The one line of `ginxctl status`.
    pub fn line(&self) -> String {
        let mut l = self.phase.as_str().to_owned();
        if let Some(o) = &self.only {
            l.push_str(&format!(" (--stage {o} only)"));
        }
        match self.phase {
            BootstrapPhase::Pending => l.push_str(": not run on this node (`ginxctl bootstrap`)"),
            BootstrapPhase::Done => {
                if !self.done.is_empty() {
                    l.push_str(&format!(": {}", self.done.join(", ")));
                }
            }
            _ => {
                if let Some(s) = &self.stage {
                    l.push_str(&format!(", stage {s}"));
                }
                if let Some(w) = &self.waiting_for {
                    l.push_str(&format!(": {w}"));
                }
                if let Some(e) = &self.error {
                    // The engine's messages start with the stage; it is said already.
                    let e = self
                        .stage
                        .as_ref()
                        .and_then(|s| e.strip_prefix(&format!("stage {s}: ")))
                        .unwrap_or(e);
                    l.push_str(&format!(": {e}"));
                }
            }
        }
        l
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_whose_process_is_gone_is_failed_and_the_line_says_where() {
        let mut s = BootstrapStatus::pending();
        s.phase = BootstrapPhase::Waiting;
        s.stage = Some("cni".into());
        s.waiting_for = Some("daemonset/kube-system/cilium: 0 of 3 pods ready".into());
        s.pid = Some(4242);
        assert_eq!(
            s.line(),
            "waiting, stage cni: daemonset/kube-system/cilium: 0 of 3 pods ready"
        );
        assert_eq!(s.clone().settled(|_, _| true), s);
        let gone = s.settled(|_, _| false);
        assert_eq!(gone.phase, BootstrapPhase::Failed);
        assert!(gone.waiting_for.is_none());
        assert!(
            gone.line()
                .starts_with("failed, stage cni: ginxctl bootstrap (pid 4242) ended"),
            "{}",
            gone.line()
        );
        // Finished runs are what they are, whatever became of the process.
        let mut done = BootstrapStatus::pending();
        done.phase = BootstrapPhase::Done;
        done.done = vec!["cni".into(), "flux".into()];
        done.pid = Some(1);
        assert_eq!(done.clone().settled(|_, _| false), done);
        assert_eq!(done.line(), "done: cni, flux");
        let json = serde_json::to_value(&done).unwrap();
        assert_eq!(json["phase"], "done");
    }
}
