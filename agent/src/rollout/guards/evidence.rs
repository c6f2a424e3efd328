//! What the health gate looks at: the probes' latest results, the API's `/readyz`, whether
//! the apply source can still be fetched, and the operator's `rollout.gate.command`. Gathered
//! here (I/O), judged in `gate.rs` (pure).
//!
//! Owns the probes' fast mode while a gate is open and the cached result of the source's
//! fetch (at most one fetch per [`REACH_EVERY`]). Does not own the verdict.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::config::Config;
use crate::k8s::{KubeClients, readyz};
use crate::rollout::decide::gate::Check;
use crate::status::{HealthMap, HealthStatus, STATE_HEALTH};
use crate::types::Revision;
use crate::util;

/// Checks that the node can still fetch its apply source (a fetch of it), handed in by the
/// daemon.
pub type Reach =
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> + Send + Sync>;

/// The longest the gate's baseline waits for a fresh round of the probes.
const FRESH_ROUND: Duration = Duration::from_secs(15);

/// The source is fetched at most this often while a gate is open.
const REACH_EVERY: Duration = Duration::from_secs(10);

/// Which look the checks are for, told to the operator's command in `GINX_GATE_STEP`: its
/// log can then tell a baseline (taken again when the activation is put off) from the gate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GateStep {
    /// Before an activation or a reboot: what "no regression" compares with.
    Baseline,
    /// After the activation, while the gate is open.
    Gate,
}

impl GateStep {
    pub fn as_str(self) -> &'static str {
        match self {
            GateStep::Baseline => "baseline",
            GateStep::Gate => "gate",
        }
    }
}

/// What the operator's command is told, in its environment.
#[derive(Clone, Copy, Debug)]
pub struct Look<'a> {
    pub step: GateStep,
    /// The revision being (or about to be) activated, when there is one.
    pub revision: Option<&'a Revision>,
}

pub(crate) struct Evidence {
    pub health: watch::Receiver<HealthMap>,
    /// Set while a gate is open: the probes run at this interval.
    pub fast_probes: watch::Sender<Option<Duration>>,
    pub reach_source: Option<Reach>,
    last_reach: Option<(Instant, Check)>,
    prometheus: super::alerts::Client,
}

impl Evidence {
    pub fn new(
        health: watch::Receiver<HealthMap>,
        fast_probes: watch::Sender<Option<Duration>>,
        reach_source: Option<Reach>,
    ) -> Self {
        Self {
            health,
            fast_probes,
            reach_source,
            last_reach: None,
            prometheus: super::alerts::Client::default(),
        }
    }

    /// Runs the probes at `interval` (while a gate is open), or at their own (`None`).
    pub fn fast_probes(&self, interval: Option<Duration>) {
        self.fast_probes.send_if_modified(|v| {
            let changed = *v != interval;
            *v = interval;
            changed
        });
    }

    /// Forgets the cached source check (a new gate wants fresh evidence).
    pub fn forget(&mut self) {
        self.last_reach = None;
    }

    /// Every check now: the probes, the API (when there are clients), the apply source, and
    /// the operator's command (told `look`).
    pub async fn checks(
        &mut self,
        cfg: &Config,
        clients: Option<&KubeClients>,
        look: Look<'_>,
    ) -> BTreeMap<String, Check> {
        let mut out = self.probes();
        if let Some(clients) = clients {
            out.insert("api".into(), api(cfg, clients).await);
        }
        if let Some(reach) = self.reach_source.clone() {
            out.insert("source".into(), self.source(cfg, &reach).await);
        }
        if let Some(argv) = &cfg.rollout.gate.command {
            out.insert(
                "command".into(),
                run_command(argv, cfg.rollout.gate.command_timeout.get(), look).await,
            );
        }
        // Asked last: the baseline's alerts are those firing right before the activation.
        if let Some(p) = &cfg.rollout.gate.prometheus {
            let answer = self.prometheus.query(p).await;
            out.extend(super::alerts::checks(
                p,
                &answer,
                Instant::now(),
                util::now(),
            ));
        }
        out
    }

    /// The probes' latest results.
    fn probes(&self) -> BTreeMap<String, Check> {
        self.health
            .borrow()
            .iter()
            // ginx's own state file is not the node's health: a write that fails says
            // nothing about the activation, and it has no result to be fresh.
            .filter(|(n, _)| n.as_str() != STATE_HEALTH)
            .map(|(n, p)| {
                (
                    n.clone(),
                    Check {
                        status: p.status,
                        message: p.message.clone(),
                        checked_at: p.checked_at,
                        checked: p.checked,
                    },
                )
            })
            .collect()
    }

    /// Whether the apply source can be fetched: the last answer while it is young, else a
    /// fetch.
    async fn source(&mut self, cfg: &Config, reach: &Reach) -> Check {
        if let Some((_, c)) = self
            .last_reach
            .as_ref()
            .filter(|(at, _)| at.elapsed() < REACH_EVERY)
        {
            return c.clone();
        }
        let (status, message) = match reach().await {
            Ok(()) => (
                HealthStatus::Ok,
                format!("{} can be fetched", cfg.apply.source),
            ),
            Err(e) => (
                HealthStatus::Failed,
                format!("cannot fetch {}: {e}", cfg.apply.source),
            ),
        };
        let c = checked_now(status, message);
        self.last_reach = Some((Instant::now(), c.clone()));
        c
    }

    /// The probes' names whose last result is older than `since`.
    fn stale(&self, since: Instant) -> Vec<String> {
        self.health
            .borrow()
            .iter()
            .filter(|(_, p)| p.checked.is_none_or(|t| t < since))
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// Waits (at most [`FRESH_ROUND`]) for one fresh round of the probes at `interval`: the
    /// baseline a gate compares with must be evidence from just before the activation, not
    /// whatever the probes said last (right after startup, before the API connection, the
    /// API-based ones say "unknown", which no later failure would count as a regression
    /// of). A probe slower than that keeps its last result.
    pub async fn fresh_round(&self, interval: Duration) {
        let since = Instant::now();
        self.fast_probes(Some(interval));
        // Polled: the health watch wakes nobody for a new `checked_at` alone. Every 2 ms, as
        // this wait is on the way of every apply: at 20 ms it was most of `ginxctl sync` to the
        // apply's start (core_loop bench, 36.7 ms against 20.2 ms now).
        loop {
            let stale = self.stale(since);
            if stale.is_empty() {
                break;
            }
            if since.elapsed() >= FRESH_ROUND {
                tracing::info!(probes = %stale.join(","), "no fresh result before the activation; the gate's baseline keeps their last ones");
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        self.fast_probes(None);
    }
}

fn checked_now(status: HealthStatus, message: String) -> Check {
    Check {
        status,
        message,
        checked_at: Some(util::now()),
        checked: Some(Instant::now()),
    }
}

/// The API's `/readyz` through the kubeconfig's server, within the request timeout.
async fn api(cfg: &Config, clients: &KubeClients) -> Check {
    let t = cfg.kubernetes.request_timeout.get();
    let (status, message) = match tokio::time::timeout(t, readyz(&clients.main)).await {
        Ok(Ok(())) => (HealthStatus::Ok, "the API answers /readyz".to_owned()),
        Ok(Err(e)) => (HealthStatus::Failed, e.to_string()),
        Err(_) => (HealthStatus::Failed, "the API does not answer".to_owned()),
    };
    checked_now(status, message)
}

/// `rollout.gate.command`: exit 0 within `timeout` is healthy. It finds the step in
/// `GINX_GATE_STEP` and the revision in `GINX_REVISION` (unset when there is none).
async fn run_command(argv: &[String], timeout: Duration, look: Look<'_>) -> Check {
    let now = util::now();
    let started = Instant::now();
    let mut cmd = tokio::process::Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .stdin(std::process::Stdio::null())
        .env("GINX_GATE_STEP", look.step.as_str())
        .env_remove("GINX_REVISION")
        .kill_on_drop(true);
    if let Some(r) = look.revision {
        cmd.env("GINX_REVISION", r.as_str());
    }
    let (status, message) = match tokio::time::timeout(timeout, cmd.output()).await {
        Err(_) => (
            HealthStatus::Failed,
            format!("{} did not finish within {}s", argv[0], timeout.as_secs()),
        ),
        Ok(Err(e)) => (HealthStatus::Failed, format!("cannot run {}: {e}", argv[0])),
        Ok(Ok(out)) if out.status.success() => (HealthStatus::Ok, "exit 0".to_owned()),
        Ok(Ok(out)) => (
            HealthStatus::Failed,
            format!(
                "{} exited with {}: {}",
                argv[0],
                out.status,
                last_line(&out.stdout, &out.stderr)
            ),
        ),
    };
    Check {
        status,
        message,
        checked_at: Some(now),
        checked: Some(started),
    }
}

/// The last non-empty line of what a failed command said (stderr, or stdout when it said
/// nothing there), at most 200 characters.
fn last_line(stdout: &[u8], stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(if stderr.is_empty() { stdout } else { stderr });
    let last = text
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim();
    last.chars().take(200).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_command_is_told_by_its_last_words_on_stderr_else_stdout() {
        assert_eq!(last_line(b"out\n", b"first\nlast\n\n"), "last");
        assert_eq!(last_line(b"only out\n", b""), "only out");
        assert_eq!(last_line(&[b'x'; 300], b"").len(), 200);
    }

    const GATE: Look<'static> = Look {
        step: GateStep::Gate,
        revision: None,
    };

    #[tokio::test]
    async fn the_command_check_is_ok_on_exit_zero_and_failed_with_its_words_otherwise() {
        let ok = run_command(&["true".into()], Duration::from_secs(5), GATE).await;
        assert_eq!(ok.status, HealthStatus::Ok);
        let argv = ["sh".into(), "-c".into(), "echo broken >&2; exit 3".into()];
        let failed = run_command(&argv, Duration::from_secs(5), GATE).await;
        assert_eq!(failed.status, HealthStatus::Failed);
        assert!(failed.message.ends_with(": broken"), "{}", failed.message);
    }

    #[tokio::test]
    async fn the_command_is_told_the_step_and_the_revision() {
        let rev: Revision = "0123456789abcdef0123456789abcdef01234567".parse().unwrap();
        let script = |want: &str| {
            vec![
                "sh".to_owned(),
                "-c".to_owned(),
                format!(
                    "test \"$GINX_GATE_STEP/${{GINX_REVISION-unset}}\" = \"{want}\" || {{ echo \"$GINX_GATE_STEP/${{GINX_REVISION-unset}}\" >&2; exit 1; }}"
                ),
            ]
        };
        let t = Duration::from_secs(5);
        let baseline = Look {
            step: GateStep::Baseline,
            revision: Some(&rev),
        };
        let c = run_command(&script(&format!("baseline/{}", rev.as_str())), t, baseline).await;
        assert_eq!(c.status, HealthStatus::Ok, "{}", c.message);
        let c = run_command(&script("gate/unset"), t, GATE).await;
        assert_eq!(c.status, HealthStatus::Ok, "{}", c.message);
    }
}
