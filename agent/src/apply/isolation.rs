//! Starting the runner (`ginx run-attempt`) for an attempt, and following it to its end.
//!
//! - `systemd-run`: the runner is a transient unit `ginx-apply-<short revision>`, outside
//!   ginx's cgroup, so an activation that restarts ginx.service leaves it running; a ginx that
//!   starts while it runs attaches to it again.
//! - `process`: the runner is a child of ginx in its own process group, with a parent-death
//!   signal: if ginx dies, the runner stops the command's whole tree.
//!
//! Either way ginx follows the attempt through files the runner writes (`output.jsonl`,
//! `result.json`) in the attempt's directory. That directory is created afresh for each attempt
//! (never reused), and a result counts only when it carries the token this attempt's runner was
//! given.

use std::collections::VecDeque;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use super::process::{Exit, Finished, OUTPUT_TAIL, SERVICE_ONLY_ENV, keep};
use super::runner::{OUTPUT_FILE, read_result};
use crate::config::{ApplyConfig, IsolationMode};
use crate::state::OutputLine;

/// How attempts are isolated from ginx itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Isolation {
    Process,
    SystemdRun {
        systemd_run: PathBuf,
        systemctl: PathBuf,
    },
}

impl Isolation {
    /// `auto` means `systemd-run` when ginx runs as a systemd service (`INVOCATION_ID` set and
    /// `/run/systemd/system` present — `NOTIFY_SOCKET` alone proves nothing) and `systemd-run`
    /// can be found; otherwise `process`.
    pub fn resolve(cfg: &ApplyConfig) -> Self {
        let systemd = || Isolation::SystemdRun {
            systemd_run: cfg.systemd_run.clone(),
            systemctl: cfg.systemctl.clone(),
        };
        match cfg.isolation {
            IsolationMode::Process => Isolation::Process,
            IsolationMode::SystemdRun => systemd(),
            IsolationMode::Auto => {
                let under_systemd = std::env::var_os("INVOCATION_ID").is_some()
                    && Path::new("/run/systemd/system").is_dir();
                if under_systemd && find_program(&cfg.systemd_run).is_some() {
                    systemd()
                } else {
                    Isolation::Process
                }
            }
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Isolation::Process => "process",
            Isolation::SystemdRun { .. } => "systemd-run",
        }
    }
}

fn find_program(p: &Path) -> Option<PathBuf> {
    if p.components().count() > 1 {
        return p.is_file().then(|| p.to_owned());
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(p))
        .find(|c| c.is_file())
}

/// Everything needed to start the runner for one attempt.
#[derive(Clone, Debug)]
pub struct Launch {
    /// Holds `output.jsonl` and `result.json`.
    pub dir: PathBuf,
    /// Transient unit name (without `.service`), for `systemd-run`.
    pub unit: String,
    pub cwd: PathBuf,
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub timeout: Duration,
    pub kill_grace: Duration,
    pub description: String,
    /// Given to the runner, which writes it into `result.json`.
    pub token: String,
}

impl Launch {
    fn runner_args(&self) -> Vec<String> {
        let mut a = vec![
            "run-attempt".to_owned(),
            "--dir".to_owned(),
            self.dir.display().to_string(),
            "--cwd".to_owned(),
            self.cwd.display().to_string(),
            "--timeout".to_owned(),
            format!("{}ms", self.timeout.as_millis()),
            "--kill-grace".to_owned(),
            format!("{}ms", self.kill_grace.as_millis()),
            "--token".to_owned(),
            self.token.clone(),
            "--".to_owned(),
        ];
        a.extend(self.argv.iter().cloned());
        a
    }
}

/// A running attempt.
pub enum Handle {
    Process {
        child: tokio::process::Child,
        dir: PathBuf,
        token: Option<String>,
    },
    Unit {
        unit: String,
        systemctl: PathBuf,
        dir: PathBuf,
        token: Option<String>,
    },
}

/// Starts the runner.
pub async fn launch(iso: &Isolation, l: &Launch) -> Result<Handle, String> {
    // The attempt's own folder: created here, empty, or the attempt does not start.
    if let Some(parent) = l.dir.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
    }
    std::fs::create_dir(&l.dir).map_err(|e| {
        if e.kind() == std::io::ErrorKind::AlreadyExists {
            format!(
                "attempt folder {} exists already (left by an earlier run); not reusing it",
                l.dir.display()
            )
        } else {
            format!("cannot create {}: {e}", l.dir.display())
        }
    })?;
    let runner = std::env::current_exe()
        .map_err(|e| format!("cannot find ginx's own binary to run the attempt: {e}"))?;
    match iso {
        Isolation::Process => {
            let mut cmd = tokio::process::Command::new(&runner);
            for k in SERVICE_ONLY_ENV {
                cmd.env_remove(k);
            }
            cmd.args(l.runner_args())
                .envs(l.env.iter().map(|(k, v)| (k, v)))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .process_group(0)
                .kill_on_drop(false);
            let parent = std::process::id();
            // SAFETY: only async-signal-safe calls between fork and exec.
            unsafe {
                cmd.pre_exec(move || {
                    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGTERM)?;
                    // ginx may have died before the signal was armed.
                    if nix::unistd::getppid().as_raw() as u32 != parent {
                        return Err(std::io::Error::other("ginx exited"));
                    }
                    Ok(())
                });
            }
            let child = cmd
                .spawn()
                .map_err(|e| format!("cannot start {}: {e}", runner.display()))?;
            Ok(Handle::Process {
                child,
                dir: l.dir.clone(),
                token: Some(l.token.clone()),
            })
        }
        Isolation::SystemdRun {
            systemd_run,
            systemctl,
        } => {
            let mut cmd = tokio::process::Command::new(systemd_run);
            cmd.arg(format!("--unit={}", l.unit))
                .arg("--collect")
                .arg("--quiet")
                .arg(format!("--description={}", l.description))
                .arg(format!(
                    "--property=TimeoutStopSec={}",
                    (l.kill_grace * 2).as_secs().max(1) + 5
                ))
                .arg(format!(
                    "--property=RuntimeMaxSec={}",
                    (l.timeout + l.kill_grace * 4).as_secs() + 60
                ));
            // ginx's own environment by name only: systemd-run takes the values from its
            // environment (inherited from ginx), so none of them is on a command line that
            // every local user can read in /proc.
            for (k, v) in std::env::vars() {
                if !SERVICE_ONLY_ENV.contains(&k.as_str()) && !v.contains('\n') {
                    cmd.arg(format!("--setenv={k}"));
                }
            }
            for (k, v) in &l.env {
                cmd.arg(format!("--setenv={k}={v}"));
            }
            cmd.arg("--").arg(&runner).args(l.runner_args());
            let out = cmd
                .stdin(Stdio::null())
                .output()
                .await
                .map_err(|e| format!("cannot run {}: {e}", systemd_run.display()))?;
            if !out.status.success() {
                return Err(format!(
                    "{} could not start unit {}.service ({}): {}",
                    systemd_run.display(),
                    l.unit,
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
            }
            Ok(Handle::Unit {
                unit: l.unit.clone(),
                systemctl: systemctl.clone(),
                dir: l.dir.clone(),
                token: Some(l.token.clone()),
            })
        }
    }
}

/// The state of a transient unit, as `systemctl show` reports it (`inactive` when unknown).
pub async fn unit_state(systemctl: &Path, unit: &str) -> String {
    let out = tokio::process::Command::new(systemctl)
        .args(["show", "--property=ActiveState", "--value"])
        .arg(format!("{unit}.service"))
        .stdin(Stdio::null())
        .output()
        .await;
    match out {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).trim().to_owned(),
        _ => "unknown".to_owned(),
    }
}

fn running_state(s: &str) -> bool {
    matches!(
        s,
        "active" | "activating" | "deactivating" | "reloading" | "refreshing"
    )
}

/// Re-attaches to an attempt a previous ginx started, if its unit still runs. `token` is the
/// one its runner was given (none for a runner started by a ginx that gave none).
pub async fn attach(
    iso: &Isolation,
    dir: &Path,
    unit: &str,
    token: Option<&str>,
) -> Option<Handle> {
    match iso {
        Isolation::SystemdRun { systemctl, .. } => {
            running_state(&unit_state(systemctl, unit).await).then(|| Handle::Unit {
                unit: unit.to_owned(),
                systemctl: systemctl.clone(),
                dir: dir.to_owned(),
                token: token.map(str::to_owned),
            })
        }
        Isolation::Process => None,
    }
}

impl Handle {
    /// The runner's process id (its process group), for a process runner.
    pub fn pid(&self) -> Option<i32> {
        match self {
            Handle::Process { child, .. } => child.id().and_then(|p| i32::try_from(p).ok()),
            Handle::Unit { .. } => None,
        }
    }

    pub fn dir(&self) -> &Path {
        match self {
            Handle::Process { dir, .. } | Handle::Unit { dir, .. } => dir,
        }
    }

    fn token(&self) -> Option<String> {
        match self {
            Handle::Process { token, .. } | Handle::Unit { token, .. } => token.clone(),
        }
    }

    /// Follows the attempt to its end, handing each output line to `on_line`; when `stop`
    /// resolves, asks the runner to stop (it then stops the command's tree and records that).
    pub async fn wait(
        mut self,
        stop: impl std::future::Future<Output = ()>,
        mut on_line: impl FnMut(&OutputLine),
    ) -> Finished {
        let dir = self.dir().to_owned();
        let token = self.token();
        let mut tail = Tail::new(dir.join(OUTPUT_FILE));
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::pin!(stop);
        let mut stopping = false;
        let mut ticks = 0u64;
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                () = &mut stop, if !stopping => {
                    stopping = true;
                    self.request_stop().await;
                }
            }
            ticks += 1;
            tail.read(&mut on_line);
            if let Some(result) = read_result(&dir, token.as_deref()) {
                tail.read(&mut on_line);
                return Finished {
                    exit: result.exit,
                    output: tail.lines.into(),
                };
            }
            let gone = match &mut self {
                Handle::Process { child, .. } => match child.try_wait() {
                    Ok(Some(status)) => Some(format!(
                        "the attempt's runner exited ({status}) without a result"
                    )),
                    Ok(None) => None,
                    Err(e) => Some(format!("cannot wait for the attempt's runner: {e}")),
                },
                // Asking systemd is dearer: once a second.
                Handle::Unit {
                    unit, systemctl, ..
                } if ticks.is_multiple_of(10) => {
                    let state = unit_state(systemctl, unit).await;
                    (!running_state(&state))
                        .then(|| format!("unit {unit}.service ended ({state}) without a result"))
                }
                Handle::Unit { .. } => None,
            };
            if let Some(why) = gone {
                // The result may have landed between the two checks.
                tail.read(&mut on_line);
                let exit =
                    read_result(&dir, token.as_deref()).map_or(Exit::SpawnFailed(why), |r| r.exit);
                return Finished {
                    exit,
                    output: tail.lines.into(),
                };
            }
        }
    }

    async fn request_stop(&mut self) {
        match self {
            Handle::Process { child, .. } => {
                if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid),
                        nix::sys::signal::Signal::SIGTERM,
                    );
                }
            }
            Handle::Unit {
                unit, systemctl, ..
            } => {
                let _ = tokio::process::Command::new(&*systemctl)
                    .args(["stop", "--no-block"])
                    .arg(format!("{unit}.service"))
                    .stdin(Stdio::null())
                    .output()
                    .await;
            }
        }
    }
}

/// The outcome of an attempt whose runner finished (while no ginx was watching), read from
/// its files; `None` while it has not finished (or the result there is not its runner's).
pub fn collect(dir: &Path, token: Option<&str>) -> Option<Finished> {
    let result = read_result(dir, token)?;
    let mut tail = Tail::new(dir.join(OUTPUT_FILE));
    tail.read(&mut |_| {});
    Some(Finished {
        exit: result.exit,
        output: tail.lines.into(),
    })
}

/// Follows `output.jsonl` as the runner appends to it.
struct Tail {
    path: PathBuf,
    /// Opened once the runner has created the file; reads continue where the last one ended.
    file: Option<std::fs::File>,
    partial: Vec<u8>,
    lines: VecDeque<OutputLine>,
}

impl Tail {
    fn new(path: PathBuf) -> Self {
        Self {
            path,
            file: None,
            partial: Vec::new(),
            lines: VecDeque::with_capacity(OUTPUT_TAIL),
        }
    }

    fn read(&mut self, on_line: &mut impl FnMut(&OutputLine)) {
        if self.file.is_none() {
            self.file = std::fs::File::open(&self.path).ok();
        }
        let Some(f) = &mut self.file else {
            return;
        };
        if f.read_to_end(&mut self.partial).is_err() {
            return;
        }
        while let Some(end) = self.partial.iter().position(|b| *b == b'\n') {
            let raw: Vec<u8> = self.partial.drain(..=end).collect();
            if let Ok(line) = serde_json::from_slice::<OutputLine>(&raw) {
                on_line(&line);
                keep(&mut self.lines, line);
            }
        }
    }
}
