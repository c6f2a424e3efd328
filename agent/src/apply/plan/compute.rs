//! Computing the plan of a built system, the I/O half: finding the built system, asking its
//! `switch-to-configuration dry-activate` what an activation would do, and Nix for the closure
//! difference. Each step runs in a process group of its own, bounded by `disruption.timeout`
//! (killed past it, the plan then unknown) and by [`OUTPUT_CAP`] bytes of output.
//!
//! Run by the attempt's runner after a build (`plan-spec.json` in the attempt's folder), so that
//! it is part of the build attempt: isolated like it, followed like it, and over when it is.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::{closure_diff, dry_activate};
use crate::apply::process::wait_bounded;
use crate::apply::system;
use crate::types::Plan;

/// What the runner is told to compute a plan of (`<dir>/plan-spec.json`).
pub const SPEC_FILE: &str = "plan-spec.json";
/// Where it writes the plan (`<dir>/plan.json`).
pub const PLAN_FILE: &str = "plan.json";
/// Output of one step kept at most (the rest is read and dropped).
pub const OUTPUT_CAP: usize = 1024 * 1024;

/// The inputs of one plan.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanSpec {
    /// The built system, when known before the build (closure mode).
    pub system: Option<PathBuf>,
    /// Else this prints it (colmena mode: `disruption.system_command`), run in `cwd`.
    pub system_command: Vec<String>,
    pub cwd: PathBuf,
    /// The running and the booted system (`system.current_system`, `system.booted_system`).
    pub current: PathBuf,
    pub booted: PathBuf,
    /// The `nix` program, for `nix store diff-closures`.
    pub nix: PathBuf,
    /// Each step's bound (`disruption.timeout`).
    pub timeout_secs: u64,
}

/// What one bounded step printed, and how it ended.
struct Captured {
    /// The exit code; `None` when it was killed at the timeout or by a signal.
    code: Option<i32>,
    timed_out: bool,
    stdout: String,
    stderr: String,
}

/// Why a step of the plan told nothing: it could not run, or ended without an answer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StepError {
    #[error("an empty command")]
    Empty,
    #[error("cannot run {program}: {detail}")]
    Spawn { program: String, detail: String },
    #[error("waiting for {program}: {detail}")]
    Wait { program: String, detail: String },
    #[error("{what} did not finish within {secs}s (disruption.timeout)")]
    TimedOut { what: &'static str, secs: u64 },
    #[error("{what} exited with {code}: {last}")]
    Exited {
        what: &'static str,
        code: i32,
        last: String,
    },
    #[error("{what} was killed by a signal: {last}")]
    Killed { what: &'static str, last: String },
    #[error("{what}: {why}")]
    NoSystem { what: &'static str, why: NoSystem },
}

/// Why a system command's output names no system.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NoSystem {
    #[error("it printed nothing")]
    Nothing,
    #[error("{line:?} is not a string: {detail}")]
    NotAString { line: String, detail: String },
    #[error("{0} is not an absolute path")]
    NotAbsolute(String),
}

/// Runs `argv` in `cwd` as a new process group, killed with the group past `timeout`.
fn capture(argv: &[String], cwd: &Path, timeout: Duration) -> Result<Captured, StepError> {
    let (program, args) = argv.split_first().ok_or(StepError::Empty)?;
    let mut child = Command::new(program)
        .args(args)
        .current_dir(cwd)
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| StepError::Spawn {
            program: program.clone(),
            detail: e.to_string(),
        })?;
    let pgid = i32::try_from(child.id()).unwrap_or(0);
    let out = reader(child.stdout.take());
    let err = reader(child.stderr.take());
    let poll = Duration::from_millis(20);
    let ended =
        wait_bounded(&mut child, Some(timeout), poll, Some(pgid)).map_err(|e| StepError::Wait {
            program: program.clone(),
            detail: e.to_string(),
        })?;
    // What the step left behind in its group goes with it: nothing of a plan runs on.
    crate::apply::process::kill_group(pgid);
    Ok(Captured {
        code: ended.code,
        timed_out: ended.timed_out,
        stdout: out.recv_timeout(Duration::from_secs(2)).unwrap_or_default(),
        stderr: err.recv_timeout(Duration::from_secs(2)).unwrap_or_default(),
    })
}

/// Reads `pipe` on a thread of its own, keeping the first [`OUTPUT_CAP`] bytes.
fn reader(pipe: Option<impl Read + Send + 'static>) -> std::sync::mpsc::Receiver<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut kept = Vec::new();
        if let Some(mut p) = pipe {
            let _ = p.by_ref().take(OUTPUT_CAP as u64).read_to_end(&mut kept);
            let _ = std::io::copy(&mut p, &mut std::io::sink());
        }
        let _ = tx.send(String::from_utf8_lossy(&kept).into_owned());
    });
    rx
}

/// Why a step did not answer, in words: `what` timed out, exited with its code and last line.
fn failed(what: &'static str, c: &Captured, timeout: Duration) -> StepError {
    if c.timed_out {
        return StepError::TimedOut {
            what,
            secs: timeout.as_secs(),
        };
    }
    let said = |text: &'_ str| -> Option<String> {
        text.lines()
            .rfind(|l| !l.trim().is_empty())
            .map(str::to_owned)
    };
    let last = said(&c.stderr)
        .or_else(|| said(&c.stdout))
        .unwrap_or_else(|| "no output".to_owned());
    let last: String = last.chars().take(300).collect();
    match c.code {
        Some(code) => StepError::Exited { what, code, last },
        None => StepError::Killed { what, last },
    }
}

/// The store path a system command printed: its last line that is not empty, as a JSON string
/// (what `colmena eval` prints) or as it is.
pub fn system_from(stdout: &str) -> Result<PathBuf, NoSystem> {
    let line = stdout
        .lines()
        .map(str::trim)
        .rfind(|l| !l.is_empty())
        .ok_or(NoSystem::Nothing)?;
    let path = if line.starts_with('"') {
        serde_json::from_str::<String>(line).map_err(|e| NoSystem::NotAString {
            line: line.to_owned(),
            detail: e.to_string(),
        })?
    } else {
        line.to_owned()
    };
    let path = PathBuf::from(path);
    if !path.is_absolute() {
        return Err(NoSystem::NotAbsolute(path.display().to_string()));
    }
    Ok(path)
}

/// The built system: given, or printed by the system command.
fn find_system(spec: &PlanSpec, timeout: Duration) -> Result<PathBuf, StepError> {
    if let Some(s) = &spec.system {
        return Ok(s.clone());
    }
    let c = capture(&spec.system_command, &spec.cwd, timeout)?;
    if c.code != Some(0) {
        return Err(failed("disruption.system_command", &c, timeout));
    }
    system_from(&c.stdout).map_err(|why| StepError::NoSystem {
        what: "disruption.system_command",
        why,
    })
}

/// The plan of the system `spec` names; never fails: what could not be learned is said in
/// `unknown` and `packages_unknown`. The action is left for the policy to decide.
pub fn compute(spec: &PlanSpec) -> Plan {
    let start = Instant::now();
    let timeout = Duration::from_secs(spec.timeout_secs.clamp(1, 3600));
    let mut plan = Plan::default();
    match find_system(spec, timeout) {
        Ok(s) => plan.system = Some(s),
        Err(why) => plan.unknown = Some(format!("the built system is not known: {why}")),
    }
    if let Some(sys) = plan.system.clone() {
        plan.reboot = system::reboot_reasons(&spec.booted, &sys);
        let stc = sys.join("bin/switch-to-configuration");
        let argv = [stc.display().to_string(), "dry-activate".to_owned()];
        match capture(&argv, Path::new("/"), timeout) {
            Ok(c) if c.code == Some(0) => {
                let text = format!("{}\n{}", c.stderr, c.stdout);
                plan.units = Some(dry_activate::parse(&text));
            }
            Ok(c) => {
                let e = failed("switch-to-configuration dry-activate", &c, timeout);
                plan.unknown = Some(e.to_string());
            }
            Err(e) => plan.unknown = Some(e.to_string()),
        }
        let argv = [
            spec.nix.display().to_string(),
            "--extra-experimental-features".to_owned(),
            "nix-command".to_owned(),
            "store".to_owned(),
            "diff-closures".to_owned(),
            spec.current.display().to_string(),
            sys.display().to_string(),
        ];
        match capture(&argv, Path::new("/"), timeout) {
            Ok(c) if c.code == Some(0) => {
                let (packages, bytes) = closure_diff::parse(&c.stdout);
                plan.packages = packages;
                plan.added_bytes = Some(bytes);
            }
            Ok(c) => {
                let e = failed("nix store diff-closures", &c, timeout);
                plan.packages_unknown = Some(e.to_string());
            }
            Err(e) => plan.packages_unknown = Some(e.to_string()),
        }
    }
    plan.took_ms = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
    plan
}

/// Reads the plan an attempt's runner wrote into `dir`, if it wrote one.
pub fn read(dir: &Path) -> Option<Plan> {
    serde_json::from_slice(&std::fs::read(dir.join(PLAN_FILE)).ok()?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Vec<String> {
        vec!["/bin/sh".into(), "-c".into(), script.into()]
    }

    #[test]
    fn a_system_is_read_as_colmena_prints_it_or_as_a_plain_line() {
        let p = "/nix/store/0123456789abcdfghijklmnpqrsvwxyz-nixos-system-a";
        assert_eq!(
            system_from(&format!("warning: x\n\"{p}\"\n")).unwrap(),
            PathBuf::from(p)
        );
        assert_eq!(system_from(&format!("{p}\n\n")).unwrap(), PathBuf::from(p));
        assert_eq!(system_from("").unwrap_err(), NoSystem::Nothing);
        assert_eq!(
            system_from("\"relative\"").unwrap_err(),
            NoSystem::NotAbsolute("relative".into())
        );
    }

    #[test]
    fn a_step_past_its_timeout_is_killed_with_what_it_started() {
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("pid");
        let script = format!("sleep 60 & echo $! > {}; wait", pid_file.display());
        let c = capture(&sh(&script), dir.path(), Duration::from_millis(300)).unwrap();
        assert!(c.timed_out && c.code.is_none());
        let pid: i32 = std::fs::read_to_string(&pid_file)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        // The grandchild went with the group (SIGKILL is delivered, not waited for: it is
        // looked at until it is gone or a zombie, for at most 2 s).
        let alive = || {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .is_ok_and(|s| s.split_whitespace().nth(2).is_none_or(|st| st != "Z"))
        };
        let start = Instant::now();
        while alive() && start.elapsed() < Duration::from_secs(2) {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(!alive(), "the step's grandchild {pid} outlived the timeout");
        assert!(
            failed("x", &c, Duration::from_secs(2))
                .to_string()
                .contains("did not finish within 2s")
        );
    }

    #[test]
    fn output_past_the_cap_is_dropped_and_the_step_still_ends() {
        let dir = tempfile::tempdir().unwrap();
        let c = capture(
            &sh("head -c 3000000 /dev/zero | tr '\\0' x; echo done >&2; exit 3"),
            dir.path(),
            Duration::from_secs(20),
        )
        .unwrap();
        assert_eq!(c.code, Some(3));
        assert_eq!(c.stdout.len(), OUTPUT_CAP);
        assert_eq!(
            failed("x", &c, Duration::from_secs(1)).to_string(),
            "x exited with 3: done"
        );
    }

    #[test]
    fn a_failing_dry_activate_makes_the_plan_unknown_and_says_why() {
        let dir = tempfile::tempdir().unwrap();
        let sys = dir.path().join("system");
        std::fs::create_dir_all(sys.join("bin")).unwrap();
        let stc = sys.join("bin/switch-to-configuration");
        std::fs::write(&stc, "#!/bin/sh\necho 'error: cannot lock' >&2\nexit 1\n").unwrap();
        std::fs::set_permissions(&stc, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let spec = PlanSpec {
            system: Some(sys),
            system_command: Vec::new(),
            cwd: dir.path().to_owned(),
            current: dir.path().join("current"),
            booted: dir.path().join("booted"),
            nix: dir.path().join("no-nix"),
            timeout_secs: 5,
        };
        let plan = compute(&spec);
        assert_eq!(
            plan.unknown.as_deref(),
            Some("switch-to-configuration dry-activate exited with 1: error: cannot lock")
        );
        assert!(plan.units.is_none());
        assert!(plan.packages_unknown.unwrap().contains("cannot run"));
    }
}
