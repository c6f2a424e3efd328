//! Figures for the core loop, printed as a table (run: `cargo bench --bench core_loop`):
//!
//! - `ginxctl sync` to the start of the apply command, local repository, over 20 commits;
//! - latency of `status` over the control socket, 10,000 requests (one connection, and a new
//!   connection per request as `ginxctl` does);
//! - resident memory of a daemon that applied its first revision and then sat idle for
//!   `BENCH_IDLE_SECS` (default 60) seconds.
//!
//! The real binaries, built with the bench (release) profile, in temporary directories; or the
//! `ginx` and `ginxctl` in `$GINX_BENCH_BIN_DIR`, so that two builds are measured side by side
//! in one run (`GINX_BENCH_BIN_DIR=old/ cargo bench …; GINX_BENCH_BIN_DIR=new/ cargo bench …`).

#[path = "../../tests/support/mod.rs"]
mod support;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use support::{Env, wait_for};

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

/// An apply command that only notes when it started.
fn marking_command(env: &Env) -> String {
    let script = env.root.join("bin/mark-start");
    std::fs::write(
        &script,
        "#!/bin/sh\ndate +%s%N > \"$GINX_STUB_DIR/started-$GINX_REVISION\"\n",
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

fn main() {
    if std::env::args().any(|a| a == "--list") {
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

    // sync → apply start.
    let env = Env::new();
    env.dropin("50-bench.toml", &marking_command(&env));
    let d = env.start();
    wait_for("the first apply", || {
        env.stub_dir
            .join(format!("started-{}", env.repo.head()))
            .exists()
            .then_some(())
    });
    d.wait_applied(&env.repo.head());
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
    println!(
        "| `ginxctl sync` → apply command start, median of 20 (p90) | {} ({}) | < 100 ms |",
        ms(percentile(&latencies, 0.5)),
        ms(percentile(&latencies, 0.9))
    );
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
