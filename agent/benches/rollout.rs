//! Figures for coordinated rollouts (run: `cargo bench --bench rollout`), against the real
//! control plane of tests/support/control_plane.rs (skipped with a note when its binary is
//! missing). `BENCH_NODES` (default 30) real ginx daemons, each with a stand-in kubelet for its
//! Node, fetch one Git repository; every stand-in colmena apply takes 2 s and writes `start` and
//! `end` to one journal; the gate settles for 1 s; the group has `max_concurrent = 3`.
//!
//! 1. Idle API requests per node per hour, all daemons at the default intervals (heartbeat
//!    renewal 10 s, resync 10 min), counted from the audit log over `BENCH_IDLE_SECONDS`
//!    (default 120): once with `lock = "none"`, once with the Lease lock (after a rollout, so
//!    that its watches are running; over at least 300 s, longer than one watch request).
//! 2. One commit rolled through every node: the most nodes applying at once (journal) and
//!    applying or in their gate at once (journal, the gate command writes `verify`), the total time against the ideal
//!    ⌈nodes/3⌉ × (2 s + 1 s), and the lock hand-off — from a holder's last write of a slot
//!    Lease (its release) to the next holder's first write of it — p50, p99 and max.
//! 3. Build before the lock: the same fleet, each stand-in build taking
//!    `BENCH_BUILD_SECONDS` (default 20 s; once per node and revision, as Nix builds), one commit
//!    rolled through with `apply.prebuild` off and then on, side by side: the total against the
//!    ideal 20 s + ⌈nodes/3⌉ × (2 s + 1 s), and how long each slot was held (from the audit log:
//!    a holder's first write of a slot Lease to its release) p50 and p99.
//!    `BENCH_ONLY=prebuild` runs this part alone.

#[path = "../../tests/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use support::control_plane::{self, AuditEvent, ControlPlane};
use support::daemon::Daemon;
use support::kubelet::Kubelet;
use support::{Env, wait_for};

const GROUP: &str = "bench";
const SLOTS: usize = 3;
const APPLY_SECONDS: f64 = 2.0;
const SETTLE_SECONDS: f64 = 1.0;

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A node `name` fetching from `origin`, reporting to `cp`, with the lock `lock`.
fn node(cp: &ControlPlane, origin: &Path, journal: &Path, name: &str, lock: &str) -> Env {
    let env = Env::new();
    env.dropin(
        "10-node.toml",
        &format!("[node]\nname = \"{name}\"\nrole = \"worker\"\n"),
    );
    env.dropin(
        "20-remote.toml",
        &format!("[sources.hephaestus]\nurl = \"{}\"\n", origin.display()),
    );
    let kc = env.root.join("kubeconfig");
    cp.ginx_kubeconfig(&kc, name);
    env.dropin(
        "70-kube.toml",
        &format!(
            "[kubernetes]\nkubeconfig = \"{}\"\n\n[health.kubelet]\nenabled = false\n\
             [health.apiserver]\nenabled = false\n[health.cilium]\nenabled = false\n\
             [health.systemd]\nenabled = false\n[health.node_ready]\nenabled = false\n",
            kc.display()
        ),
    );
    set_lock(&env, name, journal, lock);
    env.stub("journal", &journal.display().to_string());
    env.stub("sleep", &APPLY_SECONDS.to_string());
    env
}

fn set_lock(env: &Env, name: &str, journal: &Path, lock: &str) {
    env.dropin(
        "80-rollout.toml",
        &format!(
            "[rollout]\nlock = \"{lock}\"\ngroup = \"{GROUP}\"\nmax_concurrent = {SLOTS}\n\n\
             [rollout.gate]\nsettle = \"{SETTLE_SECONDS}s\"\ninterval = \"200ms\"\n\
             command = [\"sh\", \"-c\", \"echo verify {name} >> {journal}\"]\n",
            journal = journal.display()
        ),
    );
}

/// Requests by ginx daemons (users `ginx:*`) in `events`, per node per hour over `window`.
fn idle_per_node_hour(
    events: &[AuditEvent],
    nodes: usize,
    window: Duration,
) -> BTreeMap<String, f64> {
    let scale = 3600.0 / window.as_secs_f64() / nodes as f64;
    let mut m = BTreeMap::new();
    for e in events.iter().filter(|e| e.user.starts_with("ginx:")) {
        let what = if e.subresource.is_empty() {
            format!("{} {}", e.verb, e.resource)
        } else {
            format!("{} {}/{}", e.verb, e.resource, e.subresource)
        };
        *m.entry(what).or_insert(0.0) += scale;
    }
    m
}

fn start_all(envs: &[Env]) -> Vec<Daemon> {
    envs.iter().map(Env::start).collect()
}

fn wait_all_applied(daemons: &[Daemon], revision: &str) {
    for d in daemons {
        d.wait_status(&format!("{revision} applied"), |s| {
            s["apply"]["state"] == "succeeded" && s["apply"]["applied_revision"] == revision
        });
    }
}

fn idle(cp: &ControlPlane, nodes: usize, window: Duration, label: &str) -> f64 {
    // Let start-up requests (lists, the first report) pass.
    std::thread::sleep(Duration::from_secs(5));
    let mark = cp.audit_mark();
    std::thread::sleep(window);
    let counts = idle_per_node_hour(&cp.audit_since(mark), nodes, window);
    let total: f64 = counts.values().sum();
    println!(
        "Idle, {label}: requests per node per hour, {nodes} nodes over {}s",
        window.as_secs()
    );
    println!();
    println!("| request | per node per hour |");
    println!("| --- | --- |");
    for (k, v) in &counts {
        println!("| {k} | {v:.0} |");
    }
    println!("| **total** | **{total:.0}** |");
    println!();
    total
}

fn micros(t: &str) -> i64 {
    let ts: jiff::Timestamp = t
        .parse()
        .unwrap_or_else(|e| panic!("audit time {t:?}: {e}"));
    ts.as_microsecond()
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

/// Slot Lease writes in `events`, in order: per slot, runs of one writer. Returns each run's
/// length (first write to last: how long a node held the slot, in ms) and each hand-off (a
/// run's last write, the release, to the next run's first, in ms).
fn slot_runs(events: &[AuditEvent]) -> (Vec<f64>, Vec<f64>) {
    let mut held: Vec<f64> = Vec::new();
    let mut handoffs: Vec<f64> = Vec::new();
    // slot → (writer, first write, last write)
    let mut runs: BTreeMap<String, (String, i64, i64)> = BTreeMap::new();
    for e in events.iter().filter(|e| {
        e.resource == "leases"
            && e.name.starts_with(&format!("ginx-rollout-{GROUP}-"))
            && matches!(e.verb.as_str(), "create" | "update")
            && e.code < 300
    }) {
        let t = micros(&e.time);
        match runs.get_mut(&e.name) {
            Some((user, _, last)) if *user == e.user => *last = t,
            Some((_, first, last)) => {
                held.push((*last - *first) as f64 / 1000.0);
                handoffs.push((t - *last) as f64 / 1000.0);
                runs.insert(e.name.clone(), (e.user.clone(), t, t));
            }
            None => {
                runs.insert(e.name.clone(), (e.user.clone(), t, t));
            }
        }
    }
    held.extend(runs.values().map(|(_, a, b)| (b - a) as f64 / 1000.0));
    held.sort_by(f64::total_cmp);
    handoffs.sort_by(f64::total_cmp);
    (held, handoffs)
}

/// Part 3: one commit through `envs` with prebuild off, then on; returns nothing, prints the
/// table.
fn prebuild(cp: &ControlPlane, origin: &Env, envs: &[Env], names: &[String], journal: &Path) {
    let nodes = envs.len();
    let build = env_number("BENCH_BUILD_SECONDS", 20) as f64;
    for (e, n) in envs.iter().zip(names) {
        set_lock(e, n, journal, "auto");
    }
    let rounds = nodes.div_ceil(SLOTS) as f64;
    let ideal = build + rounds * (APPLY_SECONDS + SETTLE_SECONDS);
    let mut rows = Vec::new();
    for on in [false, true] {
        for e in envs {
            e.dropin("90-prebuild.toml", &format!("[apply]\nprebuild = {on}\n"));
        }
        let daemons = start_all(envs);
        wait_all_applied(&daemons, &origin.repo.head());
        // Builds take their time from the measured commit on (the one before is built).
        for e in envs {
            e.stub("build_sleep", &build.to_string());
        }
        let revision = origin.repo.commit(
            "hive.nix",
            &format!("{{ prebuild = {on}; }}"),
            "bench prebuild",
        );
        let mark = cp.audit_mark();
        let t0 = Instant::now();
        for d in &daemons {
            d.ctl_ok(&["sync"]);
        }
        // Without prebuild the rollout takes minutes: longer than a test's patience.
        let deadline = t0 + Duration::from_secs(30 * 60);
        while !daemons.iter().all(|d| {
            let s = d.status();
            s["apply"]["state"] == "succeeded" && s["apply"]["applied_revision"] == revision
        }) {
            assert!(
                Instant::now() < deadline,
                "the rollout took over 30 minutes"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let total = t0.elapsed().as_secs_f64();
        // The last release is written right after the last gate passed.
        std::thread::sleep(Duration::from_secs(2));
        let (held, handoffs) = slot_runs(&cp.audit_since(mark));
        rows.push((on, total, held, handoffs));
        drop(daemons);
        for e in envs {
            e.unstub("build_sleep");
        }
    }
    println!(
        "Build before the lock: {nodes} nodes, max_concurrent = {SLOTS}, a {build} s stand-in build, {APPLY_SECONDS} s activation, {SETTLE_SECONDS} s settle (ideal with prebuild: {build} s + ⌈{nodes}/{SLOTS}⌉ × {} s = {ideal:.0} s):",
        APPLY_SECONDS + SETTLE_SECONDS
    );
    println!();
    println!(
        "| apply.prebuild | total | against the ideal {ideal:.0} s | slot held p50 / p99 | hand-off p50 / p99 |"
    );
    println!("| --- | --- | --- | --- | --- |");
    for (on, total, held, handoffs) in &rows {
        println!(
            "| {on} | {total:.1} s | {:+.0} % | {:.1} / {:.1} s | {:.0} / {:.0} ms |",
            100.0 * (total - ideal) / ideal,
            percentile(held, 0.5) / 1000.0,
            percentile(held, 0.99) / 1000.0,
            percentile(handoffs, 0.5),
            percentile(handoffs, 0.99),
        );
    }
    println!();
}

fn main() {
    let Some(bin) = control_plane::require() else {
        println!("rollout benchmark skipped: no control-plane binary");
        return;
    };
    let nodes = env_number("BENCH_NODES", 30) as usize;
    let window = Duration::from_secs(env_number("BENCH_IDLE_SECONDS", 120));
    let cp = ControlPlane::start(&bin);
    let origin = Env::new();
    let journal = origin.root.join("journal");
    let names: Vec<String> = (0..nodes).map(|i| format!("bench-{i:02}")).collect();
    let _kubelets: Vec<Kubelet> = names
        .iter()
        .map(|n| Kubelet::start(&cp, n, "worker"))
        .collect();
    let envs: Vec<Env> = names
        .iter()
        .map(|n| node(&cp, &origin.repo.path, &journal, n, "none"))
        .collect();
    if std::env::var("BENCH_ONLY").as_deref() == Ok("prebuild") {
        prebuild(&cp, &origin, &envs, &names, &journal);
        return;
    }

    // 1a. Idle without the lock.
    let daemons = start_all(&envs);
    wait_all_applied(&daemons, &origin.repo.head());
    let without = idle(&cp, nodes, window, "lock = \"none\"");
    drop(daemons);

    // 2. One commit through every node, with the Lease lock.
    for (e, n) in envs.iter().zip(&names) {
        set_lock(e, n, &journal, "auto");
    }
    let daemons = start_all(&envs);
    wait_all_applied(&daemons, &origin.repo.head());
    std::fs::write(&journal, "").unwrap();
    let revision = origin.repo.commit("hive.nix", "{ bench = true; }", "bench");
    let mark = cp.audit_mark();
    let t0 = Instant::now();
    for d in &daemons {
        d.ctl_ok(&["sync"]);
    }
    wait_all_applied(&daemons, &revision);
    let total = t0.elapsed();
    let events = cp.audit_since(mark);

    let lines: Vec<(String, String)> = std::fs::read_to_string(&journal)
        .unwrap()
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            Some((w.next()?.to_owned(), w.next()?.to_owned()))
        })
        .collect();
    let mut applying = 0usize;
    let mut most_applying = 0usize;
    for (what, _) in &lines {
        match what.as_str() {
            "start" => {
                applying += 1;
                most_applying = most_applying.max(applying);
            }
            "end" => applying = applying.saturating_sub(1),
            _ => {}
        }
    }
    let starts = lines.iter().filter(|(w, _)| w == "start").count();

    // Holding a slot: from a node's `start` to its last `verify` (the gate's last step).
    let mut spans: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    for (i, (what, n)) in lines.iter().enumerate() {
        let s = spans.entry(n.as_str()).or_insert((i, i));
        if what == "start" {
            s.0 = i;
        }
        s.1 = i;
    }
    let held_at_once = (0..lines.len())
        .map(|i| spans.values().filter(|(a, b)| *a <= i && i <= *b).count())
        .max()
        .unwrap_or(0);

    // Slot writes, in order: per slot, runs of one writer; a hand-off is from the last write
    // of one run (the release) to the first write of the next.
    let (_, handoffs) = slot_runs(&events);
    let rounds = nodes.div_ceil(SLOTS) as f64;
    let ideal = rounds * (APPLY_SECONDS + SETTLE_SECONDS);

    println!(
        "Rollout of one commit, {nodes} nodes, max_concurrent = {SLOTS}, {APPLY_SECONDS} s apply, {SETTLE_SECONDS} s settle:"
    );
    println!();
    println!("| figure | value |");
    println!("| --- | --- |");
    println!("| activations (journal) | {starts} |");
    println!("| most nodes applying at once (journal) | {most_applying} |");
    println!("| most nodes applying or in their gate at once (journal) | {held_at_once} |");
    println!(
        "| total, `ginxctl sync` on every node to the last one applied | {:.1} s |",
        total.as_secs_f64()
    );
    println!(
        "| ideal ⌈{nodes}/{SLOTS}⌉ × ({APPLY_SECONDS} s + {SETTLE_SECONDS} s) | {ideal:.1} s ({:.0} % of the total) |",
        100.0 * ideal / total.as_secs_f64()
    );
    println!(
        "| lock hand-off, release to the next acquire: p50 / p99 / max ({} hand-offs) | {:.0} / {:.0} / {:.0} ms |",
        handoffs.len(),
        percentile(&handoffs, 0.5),
        percentile(&handoffs, 0.99),
        handoffs.last().copied().unwrap_or(f64::NAN)
    );
    println!();

    // 1b. Idle with the lock, its watches running.
    wait_for("every slot free", || {
        (0..SLOTS)
            .all(|i| {
                cp.lease("ginx-system", &format!("ginx-rollout-{GROUP}-{i}"))
                    .is_none_or(|l| {
                        l["spec"]["holderIdentity"]
                            .as_str()
                            .is_none_or(str::is_empty)
                    })
            })
            .then_some(())
    });
    // At least one watch request's length, so that each node's watches are made again once.
    let lock_window = window.max(Duration::from_secs(300));
    let with = idle(&cp, nodes, lock_window, "Lease lock (after the rollout)");
    println!(
        "Idle requests per node per hour: {without:.0} without the lock, {with:.0} with it; \
         the lock's two watches (slot Leases, ginx-rollout) are made again every 290 s from \
         the last resourceVersion (~{:.0} requests an hour), without a list.",
        2.0 * 3600.0 / 290.0
    );
    drop(daemons);
    prebuild(&cp, &origin, &envs, &names, &journal);
    assert!(
        most_applying <= SLOTS,
        "more than {SLOTS} nodes applied at once"
    );
    assert!(
        held_at_once <= SLOTS,
        "more than {SLOTS} slots held at once"
    );
}
