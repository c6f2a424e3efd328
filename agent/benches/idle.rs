//! Idle cost of one node (run: `cargo bench --bench idle`, or `bench/idle.sh`), against the real
//! control plane of tests/support/control_plane.rs (skipped with a note when its binary is
//! missing).
//!
//! The release `ginx` runs with the default intervals (nothing scaled down: the poll interval,
//! the heartbeat renewal, the resync, the health probes and the drift check are whatever the
//! configuration's defaults are; the benchmark prints them), two sources (Hephaestus and Argus)
//! served by `git daemon` on 127.0.0.1, Kubernetes configured against the real control plane
//! with a stand-in kubelet for its Node, and every health probe enabled against a stand-in
//! (kubelet `/healthz`, the Cilium agent API, a `systemctl` script answering `running`). Once
//! it has settled (both sources fetched, the first revision applied with the stand-in colmena
//! and through its health gate, the heartbeat Lease and the node condition written), nothing
//! changes for `IDLE_SECONDS` (default 600), over which are measured:
//!
//! - CPU: `utime + stime` of the ginx process (every thread, living or gone) from
//!   `/proc/PID/stat`, and apart from it `cutime + cstime`, the processes ginx started and
//!   reaped (probe commands); as % of one core.
//! - Wake-ups per second: what is counted is context switches, voluntary and involuntary
//!   (`voluntary_ctxt_switches + nonvoluntary_ctxt_switches` of every
//!   `/proc/PID/task/*/status`), summed over the threads, sampled every second so that a thread
//!   that ends within the window still counts up to its last sample (one that lives and dies
//!   between two samples is missed). A thread going to sleep and being woken is one voluntary
//!   switch, so this is an upper bound on wake-ups. ginx's child processes are not in it.
//! - Disk writes per hour: `write_bytes` (what reached the block layer; 0 on tmpfs) and `wchar`
//!   (every byte passed to write(2), the log to its file included) from `/proc/PID/io`, which
//!   add reaped children's; and independently, every file and directory under the state dir
//!   whose mtime, size or inode changed during the window (expected: none).
//! - RSS: `VmRSS` and `VmHWM` at the start and the end of the window.
//!
//! The floor runs over the same window, side by side: a loop (this benchmark binary again,
//! `--floor`) that runs `git fetch` in a clone of each of the same two repositories from the
//! same server, on the same interval as ginx's poll interval, measured the same way; its
//! wake-ups and the RSS of one `git fetch` come from `getrusage(RUSAGE_CHILDREN)` of the loop
//! (context switches and `ru_maxrss` of the reaped fetches) plus the loop's own.
//!
//! Every directory (state, clones, control plane) is under the target directory
//! (`CARGO_TARGET_TMPDIR`) unless `TMPDIR` is set, so that it is on the disk rather than a
//! tmpfs `/tmp`; the filesystem is printed.

#[path = "../../tests/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use support::control_plane::ControlPlane;
use support::kubelet::Kubelet;
use support::{Env, GitRepo, wait_for};

const NODE: &str = "idle";

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn clock_ticks() -> f64 {
    // SAFETY: sysconf has no preconditions.
    (unsafe { libc::sysconf(libc::_SC_CLK_TCK) }) as f64
}

/// CPU seconds from `/proc/PID/stat`: (utime + stime, cutime + cstime).
fn cpu(pid: u32) -> (f64, f64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // The command name may hold spaces; the fields after it start at `state` (field 3).
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<f64> = rest
        .split_whitespace()
        .map(|v| v.parse().unwrap_or(0.0))
        .collect();
    let t = clock_ticks();
    // utime, stime, cutime, cstime are fields 14–17, i.e. 11–14 after `state`.
    ((f[11] + f[12]) / t, (f[13] + f[14]) / t)
}

fn status_kib(path: &str, key: &str) -> u64 {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// `(write_bytes, wchar)` from `/proc/PID/io`.
fn io(pid: u32) -> (u64, u64) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/io")).unwrap();
    let field = |k: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(k))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    (field("write_bytes:"), field("wchar:"))
}

/// Context switches of each thread of `pid`, by thread id.
fn switches(pid: u32) -> BTreeMap<u32, u64> {
    let mut m = BTreeMap::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return m;
    };
    for t in tasks.flatten() {
        let Some(tid) = t.file_name().to_str().and_then(|s| s.parse().ok()) else {
            continue;
        };
        let Ok(text) = std::fs::read_to_string(t.path().join("status")) else {
            continue;
        };
        let n: u64 = text
            .lines()
            .filter_map(|l| {
                l.strip_prefix("voluntary_ctxt_switches:")
                    .or_else(|| l.strip_prefix("nonvoluntary_ctxt_switches:"))
            })
            .filter_map(|v| v.trim().parse::<u64>().ok())
            .sum();
        m.insert(tid, n);
    }
    m
}

/// Context switches of `pid`'s threads over a window, from samples taken along it.
struct Switches {
    first: BTreeMap<u32, u64>,
    last: BTreeMap<u32, u64>,
}

impl Switches {
    fn new(pid: u32) -> Self {
        let first = switches(pid);
        Self {
            last: first.clone(),
            first,
        }
    }

    fn sample(&mut self, pid: u32) {
        self.last.extend(switches(pid));
    }

    /// Threads born in the window count from 0.
    fn total(&self) -> u64 {
        self.last
            .iter()
            .map(|(tid, n)| n - self.first.get(tid).copied().unwrap_or(0))
            .sum()
    }
}

/// Everything under `dir` with what identifies a version of it.
fn tree(dir: &Path) -> BTreeMap<PathBuf, (SystemTime, u64, u64)> {
    let mut m = BTreeMap::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        if let Ok(md) = std::fs::symlink_metadata(&d) {
            m.insert(d.clone(), (md.modified().unwrap(), md.len(), md.ino()));
        }
        for e in entries.flatten() {
            let Ok(md) = e.path().symlink_metadata() else {
                continue;
            };
            if md.is_dir() {
                stack.push(e.path());
            } else {
                m.insert(e.path(), (md.modified().unwrap(), md.len(), md.ino()));
            }
        }
    }
    m
}

fn changed(
    before: &BTreeMap<PathBuf, (SystemTime, u64, u64)>,
    after: &BTreeMap<PathBuf, (SystemTime, u64, u64)>,
    root: &Path,
) -> Vec<String> {
    let rel = |p: &Path| p.strip_prefix(root).unwrap_or(p).display().to_string();
    let mut out = Vec::new();
    for (p, v) in after {
        match before.get(p) {
            None => out.push(format!("{} (new)", rel(p))),
            Some(b) if b != v => out.push(format!("{} (rewritten)", rel(p))),
            Some(_) => {}
        }
    }
    for p in before.keys().filter(|p| !after.contains_key(*p)) {
        out.push(format!("{} (removed)", rel(p)));
    }
    out
}

/// The filesystem type of the mount holding `path`.
fn filesystem(path: &Path) -> String {
    let path = path.canonicalize().unwrap_or_else(|_| path.to_owned());
    std::fs::read_to_string("/proc/self/mounts")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_, mnt, fs) = (f.next()?, f.next()?, f.next()?);
            path.starts_with(mnt).then(|| (mnt.len(), fs.to_owned()))
        })
        .max()
        .map_or_else(|| "unknown".into(), |(_, fs)| fs)
}

/// One process's figures over the window.
#[derive(Default)]
struct Figures {
    cpu: f64,
    children_cpu: f64,
    switches: Option<u64>,
    write_bytes: u64,
    wchar: u64,
    rss_kib: (u64, u64),
    hwm_kib: (u64, u64),
}

/// A snapshot of `pid` at one end of the window.
struct Mark {
    cpu: (f64, f64),
    io: (u64, u64),
    rss: u64,
    hwm: u64,
}

fn mark(pid: u32) -> Mark {
    let status = format!("/proc/{pid}/status");
    Mark {
        cpu: cpu(pid),
        io: io(pid),
        rss: status_kib(&status, "VmRSS:"),
        hwm: status_kib(&status, "VmHWM:"),
    }
}

fn figures(a: &Mark, b: &Mark) -> Figures {
    Figures {
        cpu: b.cpu.0 - a.cpu.0,
        children_cpu: b.cpu.1 - a.cpu.1,
        switches: None,
        write_bytes: b.io.0 - a.io.0,
        wchar: b.io.1 - a.io.1,
        rss_kib: (a.rss, b.rss),
        hwm_kib: (a.hwm, b.hwm),
    }
}

/// `getrusage` of the floor loop, as it prints it: (self, children) context switches and the
/// children's `ru_maxrss` in KiB.
struct Usage {
    switches: u64,
    children_switches: u64,
    children_maxrss_kib: u64,
}

fn rusage(who: libc::c_int) -> libc::rusage {
    // SAFETY: getrusage writes the struct it is given; zeroed is a valid rusage.
    unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(who, &mut u);
        u
    }
}

/// The floor: `git fetch` in each clone every `interval` seconds, for ever; on each line read
/// from stdin, prints its resource usage so far.
fn floor(interval: u64, clones: &[String]) {
    std::thread::spawn(|| {
        let stdin = std::io::stdin();
        for _ in stdin.lock().lines() {
            let (s, c) = (rusage(libc::RUSAGE_SELF), rusage(libc::RUSAGE_CHILDREN));
            println!(
                "{} {} {}",
                s.ru_nvcsw + s.ru_nivcsw,
                c.ru_nvcsw + c.ru_nivcsw,
                c.ru_maxrss
            );
            let _ = std::io::stdout().flush();
        }
        std::process::exit(0);
    });
    let start = Instant::now();
    for round in 1.. {
        for c in clones {
            let _ = support::git::git_cmd()
                .args(["-C", c, "fetch", "-q", "origin"])
                .stdin(Stdio::null())
                .status();
        }
        let next = start + Duration::from_secs(interval * round);
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
}

struct Floor {
    child: Child,
    lines: std::io::Lines<std::io::BufReader<std::process::ChildStdout>>,
}

impl Floor {
    fn start(interval: Duration, clones: &[PathBuf]) -> Self {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .arg("--floor")
            .arg(interval.as_secs().max(1).to_string())
            .args(clones)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
        Self { child, lines }
    }

    fn usage(&mut self) -> Usage {
        writeln!(self.child.stdin.as_mut().unwrap()).unwrap();
        let line = self.lines.next().unwrap().unwrap();
        let f: Vec<u64> = line.split(' ').map(|v| v.parse().unwrap()).collect();
        Usage {
            switches: f[0],
            children_switches: f[1],
            children_maxrss_kib: f[2],
        }
    }
}

impl Drop for Floor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A stand-in `systemctl` for the systemd probe: the system is running, nothing failed.
fn systemctl(dir: &Path) -> PathBuf {
    let p = dir.join("systemctl");
    std::fs::write(
        &p,
        "#!/bin/sh\ncase \"$1\" in is-system-running) echo running ;; esac\nexit 0\n",
    )
    .unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

fn bytes(b: f64) -> String {
    if b >= 1024.0 * 1024.0 {
        format!("{:.1} MiB", b / 1024.0 / 1024.0)
    } else if b >= 1024.0 {
        format!("{:.1} KiB", b / 1024.0)
    } else {
        format!("{b:.0} B")
    }
}

fn run(cp: &ControlPlane, seconds: u64) {
    let env = Env::new();
    let argus = GitRepo::init(&env.root.join("argus"));
    argus.commit("cluster.yaml", "endpoint: 10.0.0.100:6443\n", "facts");
    let served = env.bare().parent().unwrap().to_owned();
    support::succeed(
        support::git::git_cmd()
            .args(["clone", "-q", "--bare"])
            .arg(&argus.path)
            .arg(served.join("argus.git")),
    );
    let server = support::inetd::git_daemon(&served);
    let url = |name: &str| format!("git://127.0.0.1:{}/{name}.git", server.port);

    let kc = env.root.join("kubeconfig");
    cp.ginx_kubeconfig(&kc, NODE);
    let _kubelet = Kubelet::start(cp, NODE, "worker");
    let (kubelet_url, _k) = support::fakes::tcp(200, "ok");
    let cilium = env.root.join("cilium.sock");
    let _c = support::fakes::unix(
        &cilium,
        200,
        r#"{"cilium":{"state":"Ok"},"kube-proxy-replacement":{"mode":"True"}}"#,
    );
    // The node marker is a file of its own: kubelet.conf beside the kubeconfig is the node's
    // identity (`ginx_kubeconfig` writes it), which the condition is written with.
    let marker = env.root.join("node-marker");
    std::fs::write(&marker, "").unwrap();
    let node_kc = support::control_plane::node_kubeconfig(&kc);
    let systemctl = systemctl(&env.root.join("bin"));

    // Only what a node must set, and where the stand-ins are: every interval is the default.
    env.write_config(&format!(
        r#"state_dir = "{state}"
socket = "{socket}"

[node]
name = "{NODE}"
role = "worker"

[sources.hephaestus]
url = "{heph}"

[sources.argus]
url = "{argus}"

[apply]
command = ["{colmena}", "apply-local", "--node", "{{node}}"]

[control]
group = "root"

[kubernetes]
kubeconfig = "{kc}"
node_kubeconfig = "{node_kc}"

[health]
node_marker = "{marker}"

[health.kubelet]
url = "{kubelet_url}"

[health.cilium]
socket = "{cilium}"

[health.systemd]
systemctl = "{systemctl}"
"#,
        state = env.state_dir.display(),
        socket = env.socket.display(),
        heph = url("hephaestus"),
        argus = url("argus"),
        colmena = env.colmena.display(),
        kc = kc.display(),
        node_kc = node_kc.display(),
        marker = marker.display(),
        cilium = cilium.display(),
        systemctl = systemctl.display(),
    ));
    // A fake NixOS system for the stand-in colmena to activate; its drop-in slows the drift
    // check down for tests, so the default is put back.
    env.fake_nix();
    let defaults = ginx::config::Config::default();
    env.dropin(
        "46-drift.toml",
        &format!(
            "[system]\ndrift_check_interval = \"{}s\"\n",
            defaults.system.drift_check_interval.get().as_secs()
        ),
    );
    let cfg = ginx::config::load(&env.config).unwrap().config;
    let poll = cfg.sources["hephaestus"].interval.get();
    println!(
        "Intervals (the defaults): poll {}s, heartbeat renewal {}s, resync {}s, health {}s, drift check {}s",
        poll.as_secs(),
        cfg.kubernetes.renew_interval.get().as_secs(),
        cfg.kubernetes.resync_interval.get().as_secs(),
        cfg.health.interval.get().as_secs(),
        cfg.system.drift_check_interval.get().as_secs(),
    );

    // The floor's clones, made before the window.
    let mut clones = Vec::new();
    for name in ["hephaestus", "argus"] {
        let to = env.root.join("floor").join(name);
        support::succeed(
            support::git::git_cmd()
                .args(["clone", "-q"])
                .arg(url(name))
                .arg(&to),
        );
        clones.push(to);
    }

    let d = env.start();
    let settle_start = Instant::now();
    d.wait_applied(&env.repo.head());
    d.wait_status("argus fetched", |s| {
        s["sources"]["argus"]["revision"] == argus.head()
    });
    wait_for("the heartbeat Lease", || {
        cp.lease("ginx-system", &format!("ginx-{NODE}"))
    });
    wait_for("the node condition", || {
        cp.node(NODE)?["status"]["conditions"]
            .as_array()?
            .iter()
            .any(|c| c["type"] == "GinxHealthy" && c["status"] == "True")
            .then_some(())
    });
    let s = d.status();
    println!(
        "Settled in {:.0} s: applied {}, health {}",
        settle_start.elapsed().as_secs_f64(),
        s["apply"]["applied_revision"],
        s["health_overall"]
    );
    let mut floor = Floor::start(poll, &clones);
    // The floor's first round and ginx's start-up requests pass before the window.
    std::thread::sleep(Duration::from_secs(10));

    let pid = d.pid as u32;
    let fpid = floor.child.id();
    let files_before = tree(&env.state_dir);
    let log_before = std::fs::metadata(&d.log).map_or(0, |m| m.len());
    let (g0, f0) = (mark(pid), mark(fpid));
    let u0 = floor.usage();
    let mut sw = Switches::new(pid);
    let window_start = Instant::now();
    let window = Duration::from_secs(seconds);
    while window_start.elapsed() < window {
        std::thread::sleep(
            Duration::from_secs(1).min(window.saturating_sub(window_start.elapsed())),
        );
        sw.sample(pid);
    }
    let (g1, f1) = (mark(pid), mark(fpid));
    let u1 = floor.usage();
    let elapsed = window_start.elapsed().as_secs_f64();
    let files_after = tree(&env.state_dir);
    let log_growth = std::fs::metadata(&d.log).map_or(0, |m| m.len()) - log_before;

    let mut g = figures(&g0, &g1);
    g.switches = Some(sw.total());
    let f = figures(&f0, &f1);
    let floor_switches =
        (u1.switches - u0.switches) + (u1.children_switches - u0.children_switches);
    let pct = |s: f64| format!("{:.4} %", s / elapsed * 100.0);
    let per_hour = |b: u64| bytes(b as f64 * 3600.0 / elapsed);

    println!();
    println!(
        "Idle window: {elapsed:.0} s; state dir {} on {}",
        env.state_dir.display(),
        filesystem(&env.state_dir)
    );
    println!();
    println!("| figure | ginx | `git fetch` floor |");
    println!("| --- | --- | --- |");
    println!(
        "| CPU, % of one core (process and its reaped children) | {} | {} |",
        pct(g.cpu + g.children_cpu),
        pct(f.cpu + f.children_cpu)
    );
    println!(
        "| of which the process itself / its children | {} / {} | {} / {} |",
        pct(g.cpu),
        pct(g.children_cpu),
        pct(f.cpu),
        pct(f.children_cpu)
    );
    println!(
        "| wake-ups (context switches) per second | {:.2} (threads) | {:.2} (loop and fetches) |",
        g.switches.unwrap_or(0) as f64 / elapsed,
        floor_switches as f64 / elapsed
    );
    println!(
        "| disk writes per hour, `write_bytes` | {} | {} |",
        per_hour(g.write_bytes),
        per_hour(f.write_bytes)
    );
    println!(
        "| bytes written per hour, `wchar` | {} (log: {}) | {} |",
        per_hour(g.wchar),
        per_hour(log_growth),
        per_hour(f.wchar)
    );
    println!(
        "| RSS at start → end (peak) | {} → {} ({}) | one `git fetch`: {} (`ru_maxrss`) |",
        mib(g.rss_kib.0),
        mib(g.rss_kib.1),
        mib(g.hwm_kib.1),
        mib(u1.children_maxrss_kib)
    );
    let changes = changed(&files_before, &files_after, &env.state_dir);
    println!();
    if changes.is_empty() {
        println!(
            "Files under the state dir rewritten during the window: none (of {}).",
            files_after.len()
        );
    } else {
        println!(
            "Files under the state dir rewritten during the window ({} of {}):",
            changes.len(),
            files_after.len()
        );
        for c in &changes {
            println!("- {c}");
        }
    }
    drop(floor);
    d.stop();
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--list") {
        return;
    }
    if args.get(1).map(String::as_str) == Some("--floor") {
        floor(args[2].parse().unwrap(), &args[3..]);
        return;
    }
    if std::env::var_os("TMPDIR").is_none() {
        // SAFETY: no other thread runs yet.
        unsafe { std::env::set_var("TMPDIR", env!("CARGO_TARGET_TMPDIR")) };
    }
    ginx::kube::install_crypto();
    let seconds = env_number("IDLE_SECONDS", 600);
    match support::control_plane::binary() {
        None => {
            println!("SKIPPED: no control-plane binary (build tests/control-plane, see README)")
        }
        Some(bin) => {
            let cp = ControlPlane::start(&bin);
            run(&cp, seconds);
        }
    }
}
