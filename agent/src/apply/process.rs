//! Running one command in its own process group, with a timeout, its output delivered line by
//! line to the caller and the last lines kept; and the process bookkeeping around it (whose
//! group is alive, killing every descendant).

use std::collections::VecDeque;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

use crate::state::{OutputLine, Stream};

use crate::state::MAX_LINE;
pub use crate::state::{OUTPUT_TAIL, OUTPUT_TAIL_BYTES, keep};

/// Variables systemd sets for ginx's own service; a command ginx runs must not inherit them
/// (it would talk sd_notify to ginx's unit, or be taken for ginx).
pub const SERVICE_ONLY_ENV: &[&str] = &[
    "INVOCATION_ID",
    "NOTIFY_SOCKET",
    "WATCHDOG_USEC",
    "WATCHDOG_PID",
    "LISTEN_FDS",
    "LISTEN_PID",
    "LISTEN_FDNAMES",
    "JOURNAL_STREAM",
    "MAINPID",
    "MANAGERPID",
    "SYSTEMD_EXEC_PID",
];

/// What to run.
#[derive(Clone, Debug)]
pub struct Spec {
    pub argv: Vec<String>,
    pub cwd: PathBuf,
    pub env: Vec<(String, String)>,
    pub timeout: Duration,
    /// Between SIGTERM and SIGKILL.
    pub kill_grace: Duration,
    /// The caller is the subreaper of the command's tree (the runner): stopping signals every
    /// descendant, also those that left the process group, within the same grace period.
    pub whole_tree: bool,
}

/// After SIGKILL, how long output is still collected from pipes (everything holding them is
/// dead by then; this only bounds the wait).
pub const DRAIN_AFTER_KILL: Duration = Duration::from_secs(1);

/// When each step of stopping a command happens, counted from the stop request: SIGTERM to the
/// whole tree at once, SIGKILL to what is left after `kill_grace`, done once the last output is
/// collected. One grace period in all, not one per step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StopSchedule {
    pub sigkill_after: Duration,
    pub done_within: Duration,
}

impl StopSchedule {
    pub fn new(kill_grace: Duration) -> Self {
        Self {
            sigkill_after: kill_grace,
            done_within: kill_grace + DRAIN_AFTER_KILL,
        }
    }
}

/// How the command ended.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "kind", content = "value", rename_all = "kebab-case")]
pub enum Exit {
    /// It exited with this code.
    Code(i32),
    /// A signal ended it (not one of ours).
    Signal(i32),
    /// It ran past the timeout and was killed.
    TimedOut,
    /// It was stopped on request (ginx shutting down).
    Stopped,
    /// It could not be started.
    SpawnFailed(String),
}

#[derive(Clone, Debug)]
pub struct Finished {
    pub exit: Exit,
    pub output: Vec<OutputLine>,
}

impl Finished {
    pub fn success(&self) -> bool {
        self.exit == Exit::Code(0)
    }
}

/// A started attempt.
pub struct Running {
    child: Child,
    pgid: Pid,
    spec: Spec,
    lines: mpsc::Receiver<OutputLine>,
    readers: Vec<tokio::task::JoinHandle<()>>,
}

/// Starts `spec.argv` in `spec.cwd` as the leader of a new process group.
pub fn start(spec: Spec) -> Result<Running, Finished> {
    let spawn_failed = |msg: String| Finished {
        exit: Exit::SpawnFailed(msg),
        output: Vec::new(),
    };
    let Some((program, args)) = spec.argv.split_first() else {
        return Err(spawn_failed("empty apply command".into()));
    };
    let mut cmd = Command::new(program);
    for k in SERVICE_ONLY_ENV {
        cmd.env_remove(k);
    }
    cmd.args(args)
        .current_dir(&spec.cwd)
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(false);
    let mut child = cmd.spawn().map_err(|e| {
        let hint = if e.kind() == std::io::ErrorKind::NotFound {
            "; is it installed and on ginx's PATH? (apply.command)"
        } else {
            ""
        };
        spawn_failed(format!(
            "cannot start {program:?} in {}: {e}{hint}",
            spec.cwd.display()
        ))
    })?;
    // A pid of 0 would make every later killpg signal ginx's own group.
    let Some(pid) = child
        .id()
        .and_then(|p| i32::try_from(p).ok())
        .filter(|p| *p > 0)
    else {
        let _ = child.start_kill();
        return Err(spawn_failed(format!(
            "{program:?} started without a process id"
        )));
    };
    let (tx, rx) = mpsc::channel(256);
    let mut readers = Vec::new();
    if let Some(out) = child.stdout.take() {
        readers.push(tokio::spawn(read_lines(out, Stream::Stdout, tx.clone())));
    }
    if let Some(err) = child.stderr.take() {
        readers.push(tokio::spawn(read_lines(err, Stream::Stderr, tx)));
    }
    Ok(Running {
        child,
        pgid: Pid::from_raw(pid),
        spec,
        lines: rx,
        readers,
    })
}

impl Running {
    /// Waits for the command, killing its group on timeout or when `stop` resolves. Every output
    /// line is handed to `on_line` as it arrives.
    pub async fn wait(
        mut self,
        stop: impl std::future::Future<Output = ()>,
        mut on_line: impl FnMut(&OutputLine),
    ) -> Finished {
        let mut tail: VecDeque<OutputLine> = VecDeque::with_capacity(OUTPUT_TAIL);
        let deadline = tokio::time::sleep(self.spec.timeout);
        tokio::pin!(deadline);
        tokio::pin!(stop);
        let mut lines_open = true;
        let exit = loop {
            // Biased: a command that has exited (or printed) wins over a stop that arrives at
            // the same moment, so a finished attempt is never reported as stopped.
            tokio::select! {
                biased;
                line = self.lines.recv(), if lines_open => match line {
                    Some(l) => {
                        on_line(&l);
                        keep(&mut tail, l);
                    }
                    None => lines_open = false,
                },
                status = self.child.wait() => break match status {
                    Ok(s) => match (s.code(), std::os::unix::process::ExitStatusExt::signal(&s)) {
                        (Some(c), _) => Exit::Code(c),
                        (None, Some(sig)) => Exit::Signal(sig),
                        (None, None) => Exit::Code(-1),
                    },
                    Err(e) => Exit::SpawnFailed(format!("waiting for the command: {e}")),
                },
                () = &mut deadline => {
                    tracing::warn!(timeout = ?self.spec.timeout, "apply command timed out; stopping its process group");
                    self.terminate(&mut tail, &mut on_line).await;
                    break Exit::TimedOut;
                }
                () = &mut stop => {
                    tracing::warn!(pgid = self.pgid.as_raw(), reason = "ginx is stopping or the attempt was cancelled", "stopping the apply command");
                    self.terminate(&mut tail, &mut on_line).await;
                    break Exit::Stopped;
                }
            }
        };
        // Whatever the command left behind in its group goes with it.
        let _ = killpg(self.pgid, Signal::SIGKILL);
        // After a stop everything is dead: the pipes close at once. After a normal exit a
        // process that escaped the group may still write for a while.
        let drain = if matches!(exit, Exit::Stopped | Exit::TimedOut) {
            DRAIN_AFTER_KILL
        } else {
            self.spec.kill_grace
        };
        self.drain(drain, &mut tail, &mut on_line).await;
        Finished {
            exit,
            output: tail.into(),
        }
    }

    /// SIGTERM to the group (and, with `whole_tree`, every descendant), then SIGKILL to all
    /// of it after the grace period ([`StopSchedule`]).
    async fn terminate(
        &mut self,
        tail: &mut VecDeque<OutputLine>,
        on_line: &mut impl FnMut(&OutputLine),
    ) {
        let schedule = StopSchedule::new(self.spec.kill_grace);
        self.signal_tree(Signal::SIGTERM);
        let grace = tokio::time::sleep(schedule.sigkill_after);
        tokio::pin!(grace);
        // Closed pipes end the output, not the grace period: wait for the exit or the end of
        // the grace, whichever comes first.
        let mut lines_open = true;
        loop {
            tokio::select! {
                line = self.lines.recv(), if lines_open => match line {
                    Some(l) => {
                        on_line(&l);
                        keep(tail, l);
                    }
                    None => lines_open = false,
                },
                _ = self.child.wait() => break,
                () = &mut grace => break,
            }
        }
        self.signal_tree(Signal::SIGKILL);
        let _ = self.child.wait().await;
    }

    fn signal_tree(&self, signal: Signal) {
        let _ = killpg(self.pgid, signal);
        if self.spec.whole_tree {
            for p in descendants(std::process::id() as i32) {
                let _ = nix::sys::signal::kill(Pid::from_raw(p), signal);
            }
        }
    }

    /// Collects the last lines; a process that escaped the group and still holds the pipes
    /// cannot keep us waiting past the grace period.
    async fn drain(
        &mut self,
        limit: Duration,
        tail: &mut VecDeque<OutputLine>,
        on_line: &mut impl FnMut(&OutputLine),
    ) {
        let limit_for = limit;
        let limit = tokio::time::sleep(limit);
        tokio::pin!(limit);
        loop {
            tokio::select! {
                line = self.lines.recv() => match line {
                    Some(l) => {
                        on_line(&l);
                        keep(tail, l);
                    }
                    None => break,
                },
                () = &mut limit => {
                    tracing::warn!(pgid = self.pgid.as_raw(), waited = ?limit_for, "apply command left processes holding its output open; its last lines may be missing");
                    break;
                }
            }
        }
        for r in self.readers.drain(..) {
            r.abort();
        }
    }
}

async fn read_lines(pipe: impl AsyncRead + Unpin, stream: Stream, tx: mpsc::Sender<OutputLine>) {
    let mut reader = BufReader::new(pipe);
    let mut line = Vec::with_capacity(256);
    // Bytes past MAX_LINE are dropped as they arrive: a command that prints megabytes without
    // a newline costs no memory.
    loop {
        let (end_of_line, eof, used) = match reader.fill_buf().await {
            Ok([]) | Err(_) => (false, true, 0),
            Ok(buf) => {
                let newline = buf.iter().position(|b| *b == b'\n');
                let take = newline.unwrap_or(buf.len());
                let room = MAX_LINE.saturating_sub(line.len());
                line.extend_from_slice(&buf[..take.min(room)]);
                match newline {
                    Some(i) => (true, false, i + 1),
                    None => (false, false, buf.len()),
                }
            }
        };
        reader.consume(used);
        if !end_of_line && !eof {
            continue;
        }
        if eof && line.is_empty() {
            return;
        }
        while line.last() == Some(&b'\r') {
            line.pop();
        }
        let text = String::from_utf8_lossy(&line).into_owned();
        line.clear();
        if tx.send(OutputLine { stream, line: text }).await.is_err() || eof {
            return;
        }
    }
}

/// Every process below `pid` in the process tree, found through `/proc/*/stat`.
pub fn descendants(pid: i32) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let parents: Vec<(i32, i32)> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|p| {
            let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).ok()?;
            let rest = &stat[stat.rfind(')')? + 2..];
            let mut fields = rest.split_whitespace();
            let state = fields.next()?;
            let ppid = fields.next()?.parse().ok()?;
            (state != "Z" && state != "X").then_some((p, ppid))
        })
        .collect();
    let mut found = Vec::new();
    let mut frontier = vec![pid];
    while let Some(parent) = frontier.pop() {
        for (child, _) in parents.iter().filter(|(_, pp)| *pp == parent) {
            found.push(*child);
            frontier.push(*child);
        }
    }
    found
}

/// Stops every descendant of this process (SIGTERM, then SIGKILL after `grace`) and reaps
/// them. Processes that left their process group (`setsid`) are found too, because the caller
/// is their subreaper. Blocking.
pub fn kill_descendants(grace: Duration) {
    use nix::sys::signal::kill;
    use nix::sys::wait::{WaitPidFlag, waitpid};
    let me = std::process::id() as i32;
    let reap = || {
        while let Ok(status) = waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            if status == nix::sys::wait::WaitStatus::StillAlive {
                break;
            }
        }
    };
    let mut signal = Signal::SIGTERM;
    let deadline = std::time::Instant::now() + grace;
    loop {
        reap();
        let left = descendants(me);
        if left.is_empty() {
            return;
        }
        for p in &left {
            let _ = kill(Pid::from_raw(*p), signal);
        }
        if signal == Signal::SIGTERM && std::time::Instant::now() >= deadline {
            signal = Signal::SIGKILL;
            continue;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Whether a process group still has members.
pub fn group_alive(pgid: i32) -> bool {
    pgid > 0 && killpg(Pid::from_raw(pgid), None).is_ok()
}

/// Kills what is left of a process group, e.g. from a previous ginx that died mid-apply.
pub fn kill_group(pgid: i32) {
    if pgid > 0 {
        let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
    }
}

/// How a blocking child that [`wait_bounded`] waited for ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ended {
    /// Its exit code; `None` when it was ended at the timeout or by a signal.
    pub code: Option<i32>,
    pub timed_out: bool,
}

/// Waits for a blocking `child`, looking every `poll`; past `timeout` it is killed (with its
/// process group `pgid`, when it leads one) and waited for.
pub fn wait_bounded(
    child: &mut std::process::Child,
    timeout: Option<Duration>,
    poll: Duration,
    pgid: Option<i32>,
) -> std::io::Result<Ended> {
    let start = std::time::Instant::now();
    loop {
        if let Some(st) = child.try_wait()? {
            return Ok(Ended {
                code: st.code(),
                timed_out: false,
            });
        }
        if timeout.is_some_and(|t| start.elapsed() >= t) {
            match pgid {
                Some(g) => kill_group(g),
                None => {
                    let _ = child.kill();
                }
            }
            let _ = child.wait();
            return Ok(Ended {
                code: None,
                timed_out: true,
            });
        }
        std::thread::sleep(poll);
    }
}

/// This boot's id, to tell whether a recorded pid belongs to it.
pub fn boot_id() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|s| s.trim().to_owned())
}

/// A process's start time in clock ticks since boot (field 22 of `/proc/<pid>/stat`).
pub fn start_time(pid: i32) -> Option<u64> {
    crate::util::process_start_time(u32::try_from(pid).ok()?)
}

/// Whether process group `pgid` is still the one recorded (same boot, same leader start time)
/// and has members. A pid reused by an unrelated process is never taken for it.
pub fn recorded_group_alive(pgid: i32, boot: Option<&str>, started: Option<u64>) -> bool {
    let same_boot = boot.is_some() && boot == boot_id().as_deref();
    if !same_boot || !group_alive(pgid) {
        return false;
    }
    // The leader may have exited while others in its group live on; then the start time cannot
    // be checked, and the group (same boot, recorded by us) is taken as ours.
    match (started, start_time(pgid)) {
        (Some(want), Some(have)) => want == have,
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(script: &str, timeout: Duration) -> Spec {
        Spec {
            argv: vec!["/bin/sh".into(), "-c".into(), script.into()],
            cwd: std::env::temp_dir(),
            env: vec![("GINX_TEST".into(), "yes".into())],
            timeout,
            kill_grace: Duration::from_millis(200),
            whole_tree: false,
        }
    }

    async fn run(script: &str, timeout: Duration) -> Finished {
        let running = start(spec(script, timeout)).map_err(|f| f.exit).unwrap();
        running.wait(std::future::pending(), |_| {}).await
    }

    #[tokio::test]
    async fn captures_output_and_exit_code() {
        let f = run(
            "echo out; echo err >&2; echo $GINX_TEST; exit 3",
            Duration::from_secs(30),
        )
        .await;
        assert_eq!(f.exit, Exit::Code(3));
        let lines: Vec<&str> = f.output.iter().map(|l| l.line.as_str()).collect();
        assert!(lines.contains(&"out") && lines.contains(&"err") && lines.contains(&"yes"));
        assert!(
            f.output
                .iter()
                .any(|l| l.stream == Stream::Stderr && l.line == "err")
        );
    }

    #[tokio::test]
    async fn an_endless_line_is_cut_not_buffered() {
        let f = run(
            "head -c 3000000 /dev/zero | tr '\\0' x; echo; echo next",
            Duration::from_secs(30),
        )
        .await;
        assert_eq!(f.exit, Exit::Code(0));
        assert_eq!(f.output[0].line.len(), MAX_LINE);
        assert_eq!(f.output[1].line, "next");
    }

    #[tokio::test]
    async fn sigterm_grace_holds_even_with_closed_pipes() {
        let dir = tempfile::tempdir().unwrap();
        let mark = dir.path().join("graceful");
        let script = format!(
            "exec >/dev/null 2>&1; trap 'sleep 0.1; touch {}; exit 0' TERM; while :; do sleep 0.01; done",
            mark.display()
        );
        // A grace far longer than the handler needs, so that a loaded machine (the suite runs
        // tests in parallel) cannot make it miss; the wait ends when the command exits.
        let mut graced = spec(&script, Duration::from_millis(1000));
        graced.kill_grace = Duration::from_secs(10);
        let running = start(graced).map_err(|f| f.exit).unwrap();
        let f = running.wait(std::future::pending(), |_| {}).await;
        assert_eq!(f.exit, Exit::TimedOut);
        assert!(
            mark.exists(),
            "the command got its grace period to clean up"
        );
    }

    #[tokio::test]
    async fn keeps_only_the_last_lines() {
        let f = run(
            "i=0; while [ $i -lt 500 ]; do echo line$i; i=$((i+1)); done",
            Duration::from_secs(30),
        )
        .await;
        assert_eq!(f.output.len(), OUTPUT_TAIL);
        assert_eq!(f.output.last().unwrap().line, "line499");
        assert_eq!(f.output[0].line, "line300");
    }

    #[tokio::test]
    async fn timeout_kills_the_whole_group() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("grandchild.pid");
        let script = format!("sleep 1000 & echo $! > {}; wait", pidfile.display());
        let f = run(&script, Duration::from_millis(1000)).await;
        assert_eq!(f.exit, Exit::TimedOut);
        let pid: i32 = std::fs::read_to_string(&pidfile)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        // SIGKILL is delivered asynchronously: give the kernel a moment to finish the
        // process off. Reaped, or a zombie at worst; never running.
        let running = || {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|s| !s.contains(") Z ") && !s.contains(") X "))
        };
        for _ in 0..100 {
            if !running() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(!running(), "grandchild {pid} survived the timeout");
    }

    /// Stopping took one grace period per step (SIGTERM → SIGKILL, waiting for the
    /// pipes, then stopping what had left the group): three in all. Now the whole tree gets
    /// SIGTERM at once and SIGKILL after one grace period.
    #[test]
    fn a_stop_takes_one_kill_grace_not_one_per_step() {
        let s = StopSchedule::new(Duration::from_secs(20));
        assert_eq!(s.sigkill_after, Duration::from_secs(20));
        assert_eq!(s.done_within, Duration::from_secs(20) + DRAIN_AFTER_KILL);
        assert!(DRAIN_AFTER_KILL < Duration::from_secs(20));
    }

    #[tokio::test]
    async fn missing_program_is_a_spawn_failure_with_a_hint() {
        let mut s = spec("", Duration::from_secs(1));
        s.argv = vec!["/nonexistent/colmena".into()];
        let err = start(s).err().unwrap();
        match err.exit {
            Exit::SpawnFailed(m) => assert!(m.contains("is it installed"), "{m}"),
            other => panic!("{other:?}"),
        }
    }
}
