//! `ginx run-attempt`: the wrapper every apply attempt runs in, whether as a transient systemd
//! unit or as a child of ginx.
//!
//! It makes itself the subreaper of the command's tree, runs the command in its own process
//! group with the timeout, appends every output line to `<dir>/output.jsonl` (and echoes it, so
//! a transient unit's journal has it), and when the command ends — or on SIGTERM, SIGINT or
//! SIGHUP, which is also what it gets when ginx dies (parent-death signal) — stops every
//! process left below it, even ones that left the group, then writes `<dir>/result.json`
//! atomically. A result file therefore means the attempt is over and nothing of it runs.
//!
//! After a build that succeeded, it computes the revision's plan (`apply::plan::compute`) when
//! the attempt's folder holds a `plan-spec.json`, and writes `plan.json` before the result.
//!
//! The result carries the token ginx gave the runner (`--token`), so a result left in a folder
//! by some other run is never taken for this attempt's.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use super::process::{self, Exit, Spec};
use crate::state::{OutputLine, Stream};

pub const OUTPUT_FILE: &str = "output.jsonl";
pub const RESULT_FILE: &str = "result.json";

/// What `result.json` holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunResult {
    pub exit: Exit,
    pub finished_at: Timestamp,
    /// The `--token` the runner was started with.
    #[serde(default)]
    pub token: Option<String>,
    /// The memory high-water mark of the attempt: the largest resident set of any process of
    /// its tree (`ru_maxrss` of the runner's reaped descendants), in KiB.
    #[serde(default)]
    pub max_rss_kib: Option<u64>,
}

/// `ru_maxrss` of every descendant reaped so far (the runner is their subreaper), in KiB.
fn children_max_rss_kib() -> Option<u64> {
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes one rusage into the valid struct given.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) };
    (rc == 0).then(|| u64::try_from(usage.ru_maxrss).unwrap_or(0))
}

/// Reads `<dir>/result.json`, if the attempt is over. With `token`, only a result written by
/// the runner started with that token counts; another one is ignored.
pub fn read_result(dir: &Path, token: Option<&str>) -> Option<RunResult> {
    let bytes = std::fs::read(dir.join(RESULT_FILE)).ok()?;
    let result: RunResult = serde_json::from_slice(&bytes).ok()?;
    match token {
        Some(t) if result.token.as_deref() != Some(t) => None,
        _ => Some(result),
    }
}

/// A fresh random token for one attempt's runner.
pub fn new_token() -> String {
    format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..))
}

#[derive(Clone, Debug)]
pub struct RunArgs {
    pub dir: PathBuf,
    pub cwd: PathBuf,
    pub timeout: Duration,
    pub kill_grace: Duration,
    /// Written into the result, so ginx knows it is this runner's.
    pub token: Option<String>,
    pub argv: Vec<String>,
}

/// The wrapper's main.
pub fn run(args: RunArgs) -> ExitCode {
    if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
        eprintln!("ginx run-attempt: cannot become a subreaper: {e}");
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("ginx run-attempt: {e}");
            return ExitCode::from(1);
        }
    };
    let output = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(args.dir.join(OUTPUT_FILE));
    let mut output = match output {
        Ok(f) => Some(f),
        Err(e) => {
            eprintln!(
                "ginx run-attempt: cannot open {}: {e}",
                args.dir.join(OUTPUT_FILE).display()
            );
            None
        }
    };
    let spec = Spec {
        argv: args.argv.clone(),
        cwd: args.cwd.clone(),
        env: Vec::new(),
        timeout: args.timeout,
        kill_grace: args.kill_grace,
        whole_tree: true,
    };
    let finished = runtime.block_on(supervise(spec, output.as_mut()));
    drop(runtime);
    // Whatever escaped the process group is still below us: stop it before declaring the end.
    // After a stop it got SIGKILL already with the group (one grace period in all); after a
    // normal exit it gets its own grace.
    let grace = match finished.exit {
        Exit::Stopped | Exit::TimedOut => std::time::Duration::ZERO,
        _ => args.kill_grace,
    };
    process::kill_descendants(grace);
    if finished.exit == Exit::Code(0) {
        plan(&args.dir, output.as_mut());
    }
    if let Exit::SpawnFailed(m) = &finished.exit {
        record_line(
            output.as_mut(),
            &OutputLine {
                stream: Stream::Stderr,
                line: format!("ginx: {m}"),
            },
        );
    }
    let result = RunResult {
        exit: finished.exit.clone(),
        finished_at: crate::util::now(),
        token: args.token.clone(),
        max_rss_kib: children_max_rss_kib(),
    };
    let written = serde_json::to_vec(&result)
        .map_err(std::io::Error::other)
        .and_then(|b| crate::state::write_atomic(&args.dir.join(RESULT_FILE), &b));
    if let Err(e) = written {
        eprintln!("ginx run-attempt: cannot write the result: {e}");
        return ExitCode::from(1);
    }
    match finished.exit {
        Exit::Code(c) => ExitCode::from(u8::try_from(c).unwrap_or(1)),
        _ => ExitCode::from(1),
    }
}

/// Runs `spec` to its end, each line of its output recorded; SIGTERM, SIGINT or SIGHUP to the
/// runner stops it.
async fn supervise(spec: Spec, mut output: Option<&mut std::fs::File>) -> process::Finished {
    let stop = async {
        use tokio::signal::unix::{SignalKind, signal};
        let (Ok(mut term), Ok(mut int), Ok(mut hup)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
            signal(SignalKind::hangup()),
        ) else {
            return std::future::pending().await;
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
            _ = hup.recv() => {}
        }
    };
    match process::start(spec) {
        Ok(running) => {
            running
                .wait(stop, |line| {
                    record_line(output.as_deref_mut(), line);
                })
                .await
        }
        Err(finished) => finished,
    }
}

/// After a build that succeeded, with a `plan-spec.json` in `dir`: computes the plan and
/// writes `plan.json`, before the result says the attempt is over. Its steps are bounded
/// (`disruption.timeout` each); what could not be learned is said in the plan.
fn plan(dir: &Path, output: Option<&mut std::fs::File>) {
    use crate::apply::plan::{PLAN_FILE, PlanSpec, SPEC_FILE, compute};
    let Ok(bytes) = std::fs::read(dir.join(SPEC_FILE)) else {
        return;
    };
    let say = |output: Option<&mut std::fs::File>, line: String| {
        record_line(
            output,
            &OutputLine {
                stream: Stream::Stderr,
                line,
            },
        );
    };
    let spec: PlanSpec = match serde_json::from_slice(&bytes) {
        Ok(s) => s,
        Err(e) => {
            say(
                output,
                format!("ginx: cannot read {SPEC_FILE}: {e}; no plan"),
            );
            return;
        }
    };
    let plan = compute::compute(&spec);
    let what = match (&plan.unknown, &plan.units) {
        (Some(why), _) => format!("the plan is unknown: {why}"),
        (None, Some(u)) => format!(
            "the plan: {} unit(s) stopped or restarted, {} reloaded, {} started",
            u.interrupted().len(),
            u.reload.len(),
            u.start.len()
        ),
        (None, None) => "the plan: nothing known".to_owned(),
    };
    let written = serde_json::to_vec(&plan)
        .map_err(std::io::Error::other)
        .and_then(|b| crate::state::write_atomic(&dir.join(PLAN_FILE), &b));
    let mut output = output;
    say(
        output.as_deref_mut(),
        format!("ginx: {what} ({} ms)", plan.took_ms),
    );
    if let Err(e) = written {
        say(output, format!("ginx: cannot write {PLAN_FILE}: {e}"));
    }
}

fn record_line(output: Option<&mut std::fs::File>, line: &OutputLine) {
    if let Some(f) = output
        && let Ok(mut bytes) = serde_json::to_vec(line)
    {
        bytes.push(b'\n');
        let _ = f.write_all(&bytes);
    }
    // For the journal of a transient unit.
    let _ = match line.stream {
        Stream::Stdout => writeln!(std::io::stdout(), "{}", line.line),
        Stream::Stderr => writeln!(std::io::stderr(), "{}", line.line),
    };
}
