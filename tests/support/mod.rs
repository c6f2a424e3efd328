//! Support for the integration tests: the real binaries in temp directories, real Git servers on
//! 127.0.0.1, a stand-in colmena, and helpers to wait for behaviour (never for wall-clock time).

#![allow(dead_code)] // Each test module uses a different part of the support code.

pub mod apiserver;
pub mod blackhole;
pub mod control_plane;
pub mod daemon;
pub mod etcd;
pub mod fakes;
pub mod faketime;
pub mod fleetlock;
pub mod git;
pub mod http;
pub mod inetd;
pub mod kubeadm_schema;
pub mod kubelet;
pub mod netns;
pub mod nix;
pub mod nspawn;
pub mod peer_cut;
pub mod prometheus;
pub mod qemu;
pub mod reboot;
pub mod soak;
pub mod ssh;
pub mod stacked;
pub mod sweep;
pub mod test_fleet;
pub mod tls;
pub mod vip;
pub mod webhook;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub use daemon::Env;
pub use git::GitRepo;

/// How long a wait for some behaviour may take before the test fails. Generous, because CI
/// machines are slow and shared; tests never assert on how long things take.
pub const PATIENCE: Duration = Duration::from_secs(90);

/// The `ginx` under test: the one cargo built, or the one in `$GINX_BENCH_BIN_DIR` (benchmarks
/// measure two builds side by side in one run with it, e.g. `cargo bench --bench core_loop`).
pub fn ginx_bin() -> PathBuf {
    bench_bin("ginx").unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_ginx")))
}

/// The `ginxctl` beside [`ginx_bin`].
pub fn ginxctl_bin() -> PathBuf {
    bench_bin("ginxctl").unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_ginxctl")))
}

fn bench_bin(name: &str) -> Option<PathBuf> {
    std::env::var_os("GINX_BENCH_BIN_DIR").map(|d| PathBuf::from(d).join(name))
}

/// A tokio runtime with `worker_threads` workers for a test server, and a listener on a free
/// port of 127.0.0.1.
pub fn loopback_server(
    worker_threads: usize,
) -> (tokio::runtime::Runtime, tokio::net::TcpListener) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(worker_threads)
        .enable_all()
        .build()
        .unwrap();
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    (runtime, listener)
}

/// Runs `ginx check-config --config <config>` (with the drop-ins beside it).
pub fn check_config(config: &Path) -> std::process::Output {
    let out = std::process::Command::new(ginx_bin())
        .args(["check-config", "--config"])
        .arg(config)
        .output()
        .unwrap();
    sweep::collect_output("check-config", &config.display().to_string(), &out);
    out
}

/// Runs `cmd`, failing the test with its output unless it exits 0.
pub fn succeed(cmd: &mut std::process::Command) -> std::process::Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The tests/support directory (fixtures and stand-ins live here).
pub fn support_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/support")
}

/// Whether `tool` can be run. In CI (`CI=true`) a missing tool fails the test; on a developer
/// machine the test is skipped with a note saying why.
pub fn require(tool: &str) -> bool {
    let found = which(tool).is_some();
    if !found {
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("{tool} is required in CI but was not found; .ci/run must install it");
        }
        eprintln!("SKIPPED: {tool} is not installed on this machine");
    }
    found
}

/// Makes the process `cmd` starts die with the test (SIGKILL when the test's thread that
/// started it ends), so nothing a test starts outlives it.
pub fn dies_with_test(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: prctl is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
}

pub fn which(tool: &str) -> Option<PathBuf> {
    if tool.contains('/') {
        return Path::new(tool).exists().then(|| PathBuf::from(tool));
    }
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(tool))
            .find(|p| p.is_file())
    })
}

/// The shell words a test's gate command starts with: one journal line per run, `baseline
/// NODE` for a baseline (ginx tells the step in `GINX_GATE_STEP`) and `verify NODE` for a look
/// at the open gate. No double quotes: it goes into a TOML string inside a Rust one.
pub(crate) fn gate_writes(name: &str, journal: &Path) -> String {
    format!(
        "w=verify; [ $GINX_GATE_STEP = baseline ] && w=baseline; echo $w {name} >> {}",
        journal.display()
    )
}

/// Polls `f` until it returns `Some`, failing the test with `what` after [`PATIENCE`].
pub fn wait_for<T>(what: &str, f: impl FnMut() -> Option<T>) -> T {
    wait_for_up_to(what, PATIENCE, f)
}

/// [`wait_for`] with a patience of its own: for what takes longer by nature (a watchdog's
/// minute, a machine's boot), never a bound on how long ginx may take.
pub fn wait_for_up_to<T>(what: &str, patience: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        if start.elapsed() > patience {
            panic!("timed out waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(25));
    }
}

/// Whether process `pid` is running (not gone, not a zombie).
pub fn process_running(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| !s.contains(") Z ") && !s.contains(") X "))
}

/// Runs `cmd` to its end, or kills it after [`PATIENCE`] and returns `None` (a hang).
pub fn output_within_patience(cmd: &mut std::process::Command) -> Option<std::process::Output> {
    use std::io::Read;
    use std::process::Stdio;
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    // Drained meanwhile, so that a full pipe never stops the child.
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = r.read_to_end(&mut buf);
            buf
        })
    };
    let stdout = drain(Box::new(child.stdout.take().unwrap()));
    let stderr = drain(Box::new(child.stderr.take().unwrap()));
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > PATIENCE {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(25));
    };
    Some(std::process::Output {
        status,
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
    })
}

/// A copy of the `ginx` binary at `to` whose version (its stamp, see `ginx::version`) says
/// `version` instead: what a packager's in-place stamp does, without building again.
pub fn stamped_ginx(to: &Path, version: &str) {
    let mut bytes = std::fs::read(ginx_bin()).unwrap();
    let mark = b"ginx-version-stamp:";
    // The whole 64 bytes, NUL padding included: the mark and the version also sit side by side
    // as two string literals elsewhere in the binary, as the linker happens to lay them out.
    let mut stamp = [&mark[..], ginx::VERSION.as_bytes()].concat();
    stamp.resize(64, 0);
    let at: Vec<usize> = bytes
        .windows(stamp.len())
        .enumerate()
        .filter(|(_, w)| *w == stamp)
        .map(|(i, _)| i)
        .collect();
    assert_eq!(at.len(), 1, "the version stamp is in the binary once");
    let start = at[0] + mark.len();
    let room = 64 - mark.len();
    assert!(version.len() < room);
    bytes[start..start + room].fill(0);
    bytes[start..start + version.len()].copy_from_slice(version.as_bytes());
    std::fs::write(to, bytes).unwrap();
    std::fs::set_permissions(to, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
}
