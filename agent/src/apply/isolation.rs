//! Starting the runner (`ginx run-attempt`) for an attempt, and following it to its end.
//!
//! - `systemd-run`: the runner is a transient unit `ginx-apply-<short revision>`, outside
//!   ginx's cgroup, so an activation that restarts ginx.service leaves it running; a ginx that
//!   starts while it runs attaches to it again.
//! - `process`: the runner is a child of ginx in its own process group, with a parent-death
//!   signal: if ginx dies, the runner stops the command's whole tree.
//!
//! Either way ginx follows the attempt through files the runner writes (`output.jsonl`,
//! `result.json`) in the attempt's directory, woken by a watch on that directory (and by a
//! child runner's exit) rather than by a clock. That directory is created afresh for each
//! attempt (never reused), and a result counts only when it carries the token this attempt's
//! runner was given.
//!
//! Not here: what the runner does inside (see `runner`), nor what an attempt's end means to the
//! node (see `reconcile`).

use std::collections::VecDeque;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
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
    /// A build's plan: the runner computes it after the command succeeded (`plan-spec.json`).
    pub plan: Option<crate::apply::plan::PlanSpec>,
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
    make_attempt_dir(&l.dir)?;
    if let Some(spec) = &l.plan {
        let path = l.dir.join(crate::apply::plan::SPEC_FILE);
        serde_json::to_vec(spec)
            .map_err(std::io::Error::other)
            .and_then(|b| crate::state::write_atomic(&path, &b))
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    let runner = std::env::current_exe()
        .map_err(|e| format!("cannot find ginx's own binary to run the attempt: {e}"))?;
    match iso {
        Isolation::Process => launch_child(&runner, l),
        Isolation::SystemdRun {
            systemd_run,
            systemctl,
        } => {
            launch_unit(systemd_run, &runner, l).await?;
            Ok(Handle::Unit {
                unit: l.unit.clone(),
                systemctl: systemctl.clone(),
                dir: l.dir.clone(),
                token: Some(l.token.clone()),
            })
        }
    }
}

/// The attempt's own folder: created here, empty, or the attempt does not start.
fn make_attempt_dir(dir: &Path) -> Result<(), String> {
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
    }
    std::fs::create_dir(dir).map_err(|e| {
        if e.kind() == std::io::ErrorKind::AlreadyExists {
            format!(
                "attempt folder {} exists already (left by an earlier run); not reusing it",
                dir.display()
            )
        } else {
            format!("cannot create {}: {e}", dir.display())
        }
    })
}

/// The runner as a child of ginx's, in a process group of its own, dying with ginx.
fn launch_child(runner: &Path, l: &Launch) -> Result<Handle, String> {
    let mut cmd = tokio::process::Command::new(runner);
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

/// The runner as transient unit `l.unit`, which outlives ginx.
async fn launch_unit(systemd_run: &Path, runner: &Path, l: &Launch) -> Result<(), String> {
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
    // ginx's own environment by name only: systemd-run takes the values from its environment
    // (inherited from ginx), so none of them is on a command line that every local user can
    // read in /proc.
    for (k, v) in std::env::vars() {
        if !SERVICE_ONLY_ENV.contains(&k.as_str()) && !v.contains('\n') {
            cmd.arg(format!("--setenv={k}"));
        }
    }
    for (k, v) in &l.env {
        cmd.arg(format!("--setenv={k}={v}"));
    }
    cmd.arg("--").arg(runner).args(l.runner_args());
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
    Ok(())
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
    ///
    /// Woken by what happens, not by a clock: a change in the attempt's directory (a line
    /// appended to the output, the result renamed into place) and, for a process runner, its
    /// exit. Only what sends no event is looked at on a timer (see [`timers`]).
    pub async fn wait(
        mut self,
        stop: impl std::future::Future<Output = ()>,
        mut on_line: impl FnMut(&OutputLine),
    ) -> Finished {
        let dir = self.dir().to_owned();
        let token = self.token();
        let mut tail = Tail::new(dir.join(OUTPUT_FILE));
        let watch = DirWatch::arm(&dir)
            .inspect_err(|e| {
                tracing::warn!(dir = %dir.display(), error = %e,
                    "cannot watch the attempt's folder; looking at it every 100 ms instead");
            })
            .ok();
        let timers = timers(watch.is_some(), matches!(self, Handle::Unit { .. }));
        let mut look = timers.look.map(every);
        let mut unit_check = timers.unit_check.map(every);
        tokio::pin!(stop);
        let mut stopping = false;
        loop {
            // The first look comes after the watch is armed: a result written before it is
            // found here, one written after it wakes the watch.
            tail.read(&mut on_line);
            if let Some(result) = read_result(&dir, token.as_deref()) {
                tail.read(&mut on_line);
                return Finished {
                    exit: result.exit,
                    output: tail.lines.into(),
                };
            }
            let runner = match &mut self {
                Handle::Process { child, .. } => Some(child),
                Handle::Unit { .. } => None,
            };
            let woke = tokio::select! {
                () = changed(watch.as_ref()) => Wake::Changed,
                () = tick(look.as_mut()) => Wake::Changed,
                () = tick(unit_check.as_mut()) => Wake::UnitCheck,
                status = exited(runner) => Wake::RunnerExited(status),
                () = &mut stop, if !stopping => Wake::Stop,
            };
            let gone = match woke {
                Wake::Changed => None,
                Wake::Stop => {
                    stopping = true;
                    self.request_stop().await;
                    None
                }
                Wake::RunnerExited(Ok(status)) => Some(format!(
                    "the attempt's runner exited ({status}) without a result"
                )),
                Wake::RunnerExited(Err(e)) => {
                    Some(format!("cannot wait for the attempt's runner: {e}"))
                }
                Wake::UnitCheck => self.unit_gone().await,
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

    /// Why the attempt's unit is over, if systemd says it is.
    async fn unit_gone(&self) -> Option<String> {
        let Handle::Unit {
            unit, systemctl, ..
        } = self
        else {
            return None;
        };
        let state = unit_state(systemctl, unit).await;
        (!running_state(&state))
            .then(|| format!("unit {unit}.service ended ({state}) without a result"))
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

/// What woke [`Handle::wait`].
enum Wake {
    /// Something changed in the attempt's folder (or, without a watch, the look is due).
    Changed,
    /// Time to ask systemd whether the attempt's unit still runs.
    UnitCheck,
    RunnerExited(std::io::Result<std::process::ExitStatus>),
    Stop,
}

/// How often [`Handle::wait`] looks at the attempt's folder when it cannot watch it.
const LOOK_WITHOUT_WATCH: Duration = Duration::from_millis(100);
/// How often it asks systemd about the attempt's unit.
const UNIT_CHECK: Duration = Duration::from_secs(1);

/// The clocks [`Handle::wait`] needs: only for what sends it no event.
#[derive(Debug, PartialEq, Eq)]
struct Timers {
    look: Option<Duration>,
    unit_check: Option<Duration>,
}

/// With the folder watched, a process runner needs no clock at all: every line, the result and
/// the runner's exit are events (an overflowing event queue is one too), and the exit comes
/// last even if the folder's events were lost. No safety poll is kept for that case.
///
/// A unit keeps a check every second: one that ends without a result (SIGKILL, systemd's
/// `RuntimeMaxSec`, the OOM killer) changes nothing in the folder, and ginx is not its parent,
/// so only systemd knows. That check is also what would see a result whose event was lost.
///
/// Without a watch (no inotify instance left, say) the folder is looked at as it used to be.
fn timers(watching: bool, unit: bool) -> Timers {
    Timers {
        look: (!watching).then_some(LOOK_WITHOUT_WATCH),
        unit_check: unit.then_some(UNIT_CHECK),
    }
}

/// A clock whose first tick is one period away.
fn every(period: Duration) -> tokio::time::Interval {
    let mut i = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    i
}

async fn tick(clock: Option<&mut tokio::time::Interval>) {
    match clock {
        Some(c) => {
            c.tick().await;
        }
        None => std::future::pending().await,
    }
}

async fn changed(watch: Option<&DirWatch>) {
    match watch {
        Some(w) => w.changed.notified().await,
        None => std::future::pending().await,
    }
}

async fn exited(
    runner: Option<&mut tokio::process::Child>,
) -> std::io::Result<std::process::ExitStatus> {
    match runner {
        Some(child) => child.wait().await,
        None => std::future::pending().await,
    }
}

/// A watch (inotify) on the attempt's folder: each change there wakes [`Handle::wait`] once
/// (changes while it is busy are folded into one wake).
struct DirWatch {
    _watcher: notify::RecommendedWatcher,
    changed: Arc<tokio::sync::Notify>,
}

impl DirWatch {
    fn arm(dir: &Path) -> notify::Result<Self> {
        use notify::Watcher;
        let changed = Arc::new(tokio::sync::Notify::new());
        let wake = Arc::clone(&changed);
        let mut watcher =
            notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
                // An error may stand for changes that were lost: look again.
                let news = match &event {
                    Ok(e) => is_news(&e.kind),
                    Err(_) => true,
                };
                if news {
                    wake.notify_one();
                }
            })?;
        watcher.watch(dir, notify::RecursiveMode::NonRecursive)?;
        Ok(Self {
            _watcher: watcher,
            changed,
        })
    }
}

/// Whether an event in the attempt's folder may be news. A file opened, read or closed after
/// reading is not: that is `wait` looking, and waking on it would wake it for ever.
fn is_news(kind: &notify::EventKind) -> bool {
    use notify::event::{AccessKind, AccessMode};
    match kind {
        notify::EventKind::Access(a) => matches!(a, AccessKind::Close(AccessMode::Write)),
        _ => true,
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

#[cfg(test)]
mod tests {
    use super::super::runner::{RESULT_FILE, RunResult};
    use super::*;
    use crate::state::Stream;

    const TOKEN: &str = "0123456789abcdef";

    fn result_bytes(token: &str) -> Vec<u8> {
        serde_json::to_vec(&RunResult {
            exit: Exit::Code(0),
            finished_at: crate::util::now(),
            token: Some(token.to_owned()),
            max_rss_kib: None,
        })
        .unwrap()
    }

    /// An attempt's folder, and a stand-in runner (`sh -c script`) that is killed with the
    /// handle.
    fn attempt(script: &str) -> (tempfile::TempDir, PathBuf, Handle) {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("attempt");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(tmp.path().join("staged.json"), result_bytes(TOKEN)).unwrap();
        let child = tokio::process::Command::new("sh")
            .arg("-c")
            .arg(script)
            .current_dir(tmp.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let handle = Handle::Process {
            child,
            dir: dir.clone(),
            token: Some(TOKEN.to_owned()),
        };
        (tmp, dir, handle)
    }

    #[test]
    fn a_watched_process_runner_needs_no_clock() {
        let none = Timers {
            look: None,
            unit_check: None,
        };
        assert_eq!(timers(true, false), none);
    }

    #[test]
    fn a_unit_is_asked_about_once_a_second_watched_or_not() {
        for watching in [true, false] {
            assert_eq!(timers(watching, true).unit_check, Some(UNIT_CHECK));
        }
        assert_eq!(UNIT_CHECK, Duration::from_secs(1));
        assert_eq!(timers(true, true).look, None);
    }

    #[test]
    fn without_a_watch_the_folder_is_looked_at_as_before() {
        assert_eq!(timers(false, false).look, Some(Duration::from_millis(100)));
        assert_eq!(timers(false, true).look, Some(Duration::from_millis(100)));
    }

    #[test]
    fn the_folder_being_read_is_no_news_and_everything_else_is() {
        use notify::EventKind;
        use notify::event::{
            AccessKind, AccessMode, CreateKind, DataChange, ModifyKind, RenameMode,
        };
        let quiet = [
            EventKind::Access(AccessKind::Open(AccessMode::Any)),
            EventKind::Access(AccessKind::Read),
            EventKind::Access(AccessKind::Close(AccessMode::Read)),
        ];
        for k in quiet {
            assert!(!is_news(&k), "{k:?}");
        }
        let news = [
            EventKind::Access(AccessKind::Close(AccessMode::Write)),
            EventKind::Create(CreateKind::File),
            EventKind::Modify(ModifyKind::Data(DataChange::Any)),
            EventKind::Modify(ModifyKind::Name(RenameMode::To)),
            EventKind::Other,
        ];
        for k in news {
            assert!(is_news(&k), "{k:?}");
        }
    }

    // The clock is paused: when the runtime has nothing to do it jumps to the next timer. A
    // wait that needed a tick would therefore end with the clock moved on; one woken by events
    // ends with it where it started.

    #[tokio::test(start_paused = true)]
    async fn the_result_wakes_the_wait_without_a_tick() {
        // The stand-in runs on after its result: only the folder's watch can end the wait.
        let line = r#"{"stream":"stdout","line":"built"}"#;
        let (_tmp, _, handle) = attempt(&format!(
            "sleep 0.2; echo '{line}' >> attempt/{OUTPUT_FILE}; \
             cp staged.json attempt/.result.tmp; mv attempt/.result.tmp attempt/{RESULT_FILE}; \
             exec sleep 60"
        ));
        let t0 = tokio::time::Instant::now();
        let mut seen = Vec::new();
        let finished = handle
            .wait(std::future::pending(), |l| seen.push(l.clone()))
            .await;
        assert_eq!(t0.elapsed(), Duration::ZERO, "a tick was needed");
        assert_eq!(finished.exit, Exit::Code(0));
        let built = OutputLine {
            stream: Stream::Stdout,
            line: "built".to_owned(),
        };
        assert_eq!(seen, finished.output);
        assert_eq!(finished.output, [built]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_runner_that_exits_without_a_result_wakes_the_wait_without_a_tick() {
        let (_tmp, _, handle) = attempt("sleep 0.2; exit 3");
        let t0 = tokio::time::Instant::now();
        let finished = handle.wait(std::future::pending(), |_| {}).await;
        assert_eq!(t0.elapsed(), Duration::ZERO, "a tick was needed");
        match finished.exit {
            Exit::SpawnFailed(m) => assert!(m.contains("without a result"), "{m}"),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_result_written_before_the_watch_is_found() {
        let (_tmp, dir, handle) = attempt("exec sleep 60");
        std::fs::write(dir.join(RESULT_FILE), result_bytes(TOKEN)).unwrap();
        let t0 = tokio::time::Instant::now();
        let finished = handle.wait(std::future::pending(), |_| {}).await;
        assert_eq!(t0.elapsed(), Duration::ZERO);
        assert_eq!(finished.exit, Exit::Code(0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_result_with_another_token_does_not_end_the_wait() {
        // Another run's result lands first; this runner's end is what ends the wait.
        let (tmp, _, handle) = attempt(&format!(
            "sleep 0.1; cp foreign.json attempt/{RESULT_FILE}; sleep 0.2; exit 3"
        ));
        std::fs::write(tmp.path().join("foreign.json"), result_bytes("another")).unwrap();
        let finished = handle.wait(std::future::pending(), |_| {}).await;
        assert!(
            matches!(finished.exit, Exit::SpawnFailed(_)),
            "{finished:?}"
        );
    }
}
