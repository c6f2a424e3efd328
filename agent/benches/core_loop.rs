//! Figures for the core loop, printed as a table (run: `cargo bench --bench core_loop`):
//!
//! - `ginxctl sync` to the start of the apply command, local repository, over 20 commits, with
//!   `apply.prebuild` off and on (an instant build: the command returns at once for `build`);
//! - latency of `status` over the control socket, 10,000 requests (one connection, and a new
//!   connection per request as `ginxctl` does);
//! - resident memory of a daemon that applied its first revision and then sat idle for
//!   `BENCH_IDLE_SECS` (default 60) seconds.
//!
//! The real binaries, built with the bench (release) profile, in temporary directories; or the
//! `ginx` and `ginxctl` in `$GINX_BENCH_BIN_DIR`, so that two builds are measured side by side
//! in one run (`GINX_BENCH_BIN_DIR=old/ cargo bench …; GINX_BENCH_BIN_DIR=new/ cargo bench …`).
//! With `GINX_BENCH_BEFORE_BIN_DIR` naming another build's directory, the sync figures are
//! measured for that build too, in the same run, and printed in a column of their own.

#[path = "../../tests/support/mod.rs"]
mod support;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use support::daemon::Daemon;
use support::{Env, wait_for};

/// Set in the run of this benchmark that measures only the sync figures of another build.
const SYNC_ONLY: &str = "GINX_BENCH_SYNC_ONLY";

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

/// An apply command that only notes when it started; its build (`apply.prebuild`, the goal
/// `build` last on its command line) does nothing and notes nothing.
fn marking_command(env: &Env) -> String {
    let script = env.root.join("bin/mark-start");
    std::fs::write(
        &script,
        "#!/bin/sh\nfor goal; do :; done\n[ \"$goal\" = build ] && exit 0\n\
         date +%s%N > \"$GINX_STUB_DIR/started-$GINX_REVISION\"\n",
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    format!(
        "[apply]\ncommand = [\"{}\", \"apply-local\", \"--node\", \"{{node}}\"]\n",
        script.display()
    )
}

fn rss_kib(pid: i32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

fn status_request(stream: &mut UnixStream, reader: &mut BufReader<UnixStream>) {
    stream
        .write_all(b"{\"version\":1,\"command\":\"status\"}\n")
        .unwrap();
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    assert!(line.contains("\"ok\":true"));
}

/// A daemon whose apply command notes when it starts, with `apply.prebuild` as given, once it
/// applied its first revision.
fn daemon_marking_starts(prebuild: bool) -> (Env, Daemon) {
    let env = Env::new();
    env.dropin(
        "50-bench.toml",
        &format!("{}prebuild = {prebuild}\n", marking_command(&env)),
    );
    let d = env.start();
    wait_for("the first apply", || {
        env.stub_dir
            .join(format!("started-{}", env.repo.head()))
            .exists()
            .then_some(())
    });
    d.wait_applied(&env.repo.head());
    (env, d)
}

/// `ginxctl sync` → the start of the activation, over 20 commits, sorted.
fn sync_latencies(env: &Env, d: &Daemon) -> Vec<Duration> {
    let mut latencies = Vec::new();
    for i in 0..20 {
        let rev = env.repo.commit(&format!("bench/{i}.nix"), "{ }\n", "bench");
        let marker = env.stub_dir.join(format!("started-{rev}"));
        let t0 = now_ns();
        let out = d.ctl(&["sync", "hephaestus"]);
        assert!(out.status.success());
        wait_for("the apply command to start", || {
            marker.exists().then_some(())
        });
        let started: u128 = wait_for("the start mark", || {
            std::fs::read_to_string(&marker)
                .ok()
                .and_then(|s| s.trim().parse().ok())
        });
        latencies.push(Duration::from_nanos((started - t0) as u64));
        d.wait_applied(&rev);
    }
    latencies.sort();
    latencies
}

/// Median and p90 of the sync figures (prebuild off, then on) of the build in `bin_dir`,
/// measured by this benchmark run again in a process of its own.
fn sync_figures_of(bin_dir: &std::ffi::OsStr) -> Vec<(Duration, Duration)> {
    let out = Command::new(std::env::current_exe().unwrap())
        .env("GINX_BENCH_BIN_DIR", bin_dir)
        .env(SYNC_ONLY, "1")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    text.lines()
        .filter_map(|l| l.strip_prefix("sync "))
        .map(|l| {
            let (p50, p90) = l.split_once(' ').unwrap();
            let nanos = |n: &str| Duration::from_nanos(n.parse().unwrap());
            (nanos(p50), nanos(p90))
        })
        .collect()
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    if std::env::var_os(SYNC_ONLY).is_some() {
        for prebuild in [false, true] {
            let (env, d) = daemon_marking_starts(prebuild);
            let l = sync_latencies(&env, &d);
            println!(
                "sync {} {}",
                percentile(&l, 0.5).as_nanos(),
                percentile(&l, 0.9).as_nanos()
            );
        }
        return;
    }
    let idle = Duration::from_secs(
        std::env::var("BENCH_IDLE_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(60),
    );

    // A daemon that only idles, for the memory figure.
    let idle_env = Env::new();
    let idle_daemon = idle_env.start();
    idle_daemon.wait_applied(&idle_env.repo.head());
    let idle_since = Instant::now();

    // sync → apply start, without and with the build before it.
    let (env, d) = daemon_marking_starts(false);
    let latencies = sync_latencies(&env, &d);
    let prebuilt = {
        let (env, d) = daemon_marking_starts(true);
        sync_latencies(&env, &d)
    };
    let before = std::env::var_os("GINX_BENCH_BEFORE_BIN_DIR").map(|dir| sync_figures_of(&dir));

    // status latency.
    let n = 10_000;
    let mut one_conn = Vec::with_capacity(n);
    let mut stream = UnixStream::connect(&env.socket).unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    for _ in 0..n {
        let t = Instant::now();
        status_request(&mut stream, &mut reader);
        one_conn.push(t.elapsed());
    }
    one_conn.sort();
    let mut per_conn = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let mut s = UnixStream::connect(&env.socket).unwrap();
        let mut r = BufReader::new(s.try_clone().unwrap());
        status_request(&mut s, &mut r);
        per_conn.push(t.elapsed());
    }
    per_conn.sort();
    let (rss_busy, hwm_busy) = rss_kib(d.pid);

    // ginxctl status as a user runs it (process start included), 200 times.
    let mut ctl_runs = Vec::new();
    for _ in 0..200 {
        let t = Instant::now();
        let out = Command::new(support::ginxctl_bin())
            .arg("--socket")
            .arg(&env.socket)
            .arg("status")
            .output()
            .unwrap();
        assert!(out.status.success());
        ctl_runs.push(t.elapsed());
    }
    ctl_runs.sort();

    if let Some(rest) = idle.checked_sub(idle_since.elapsed()) {
        std::thread::sleep(rest);
    }
    let (rss_idle, hwm_idle) = rss_kib(idle_daemon.pid);

    println!("| figure | value | target |");
    println!("| --- | --- | --- |");
    let sync_rows = [
        ("apply.prebuild off", &latencies, "< 100 ms"),
        ("apply.prebuild on, instant build", &prebuilt, "< 50 ms"),
    ];
    for (i, (what, now, target)) in sync_rows.into_iter().enumerate() {
        let before = before.as_ref().map_or(String::new(), |b| {
            format!("before: {} ({}); now: ", ms(b[i].0), ms(b[i].1))
        });
        println!(
            "| `ginxctl sync` → apply command start, {what}, median of 20 (p90) | {before}{} ({}) | {target} |",
            ms(percentile(now, 0.5)),
            ms(percentile(now, 0.9))
        );
    }
    println!(
        "| `status` over one connection, p50 / p99 / max of {n} | {} / {} / {} | p99 < 5 ms |",
        ms(percentile(&one_conn, 0.5)),
        ms(percentile(&one_conn, 0.99)),
        ms(*one_conn.last().unwrap())
    );
    println!(
        "| `status`, new connection each, p50 / p99 of {n} | {} / {} | p99 < 5 ms |",
        ms(percentile(&per_conn, 0.5)),
        ms(percentile(&per_conn, 0.99))
    );
    println!(
        "| `ginxctl status` process, p50 / p99 of 200 | {} / {} | |",
        ms(percentile(&ctl_runs, 0.5)),
        ms(percentile(&ctl_runs, 0.99))
    );
    println!(
        "| daemon RSS after {}s idle (peak) | {:.1} MiB ({:.1} MiB) | < 15 MiB |",
        idle.as_secs(),
        rss_idle as f64 / 1024.0,
        hwm_idle as f64 / 1024.0
    );
    println!(
        "| daemon RSS after the runs above (peak) | {:.1} MiB ({:.1} MiB) | |",
        rss_busy as f64 / 1024.0,
        hwm_busy as f64 / 1024.0
    );
    let size = std::fs::metadata(support::ginx_bin())
        .map(|m| m.len())
        .unwrap_or(0);
    println!(
        "| `ginx` binary size | {:.1} MiB | |",
        size as f64 / (1024.0 * 1024.0)
    );
}
