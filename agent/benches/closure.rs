//! Closure mode against colmena mode, on the same fake system (run: `cargo bench --bench
//! closure`; `BENCH_ROUNDS` rounds each, default 10):
//!
//! - closure mode: from `ginxctl sync` after the commit that moves `hosts/lucy.closure` to the
//!   start of the new system's `switch-to-configuration` (fetched from a file binary cache,
//!   signatures checked, profile set: real Nix);
//! - colmena mode with the stand-in colmena (tests/support/colmena-stub), for the same change,
//!   to the start of the apply command. Real colmena would first evaluate the hive and build
//!   the system, which cannot run here (no nixpkgs): its time and memory are NOT measured;
//! - the memory high-water mark of each attempt: the largest resident set of any process of
//!   its tree, as the runner records it (`max_rss_kib` in history);
//! - the time the plan adds after each build (`plan.took_ms` of the build attempt:
//!   `switch-to-configuration dry-activate` of the fetched system, here the fake system's,
//!   and the real `nix store diff-closures` against the running system).

#[path = "../../tests/support/mod.rs"]
mod support;

use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;
use support::nix::{Cache, Systems, closure_env, forget, require_nix};
use support::{Env, wait_for};

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

fn ctl(env: &Env, args: &[&str]) -> String {
    let out = std::process::Command::new(support::ginxctl_bin())
        .arg("--socket")
        .arg(&env.socket)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The attempt at `rev`, once it ended.
fn attempt(env: &Env, rev: &str) -> Value {
    wait_for("the attempt", || {
        let h: Value = serde_json::from_str(&ctl(env, &["history", "--json"])).ok()?;
        let a = h["attempts"][0].clone();
        (a["revision"] == rev).then_some(a)
    })
}

/// How long computing the plan of `rev` took after its build (the prebuild's `plan.took_ms`:
/// dry-activate of the built system and `nix store diff-closures`, the build excluded).
fn plan_ms(env: &Env, rev: &str) -> Option<u64> {
    let h: Value = serde_json::from_str(&ctl(env, &["history", "--json"])).ok()?;
    h["attempts"]
        .as_array()?
        .iter()
        .find(|a| a["revision"] == rev && a["kind"] == "build")
        .and_then(|a| a["plan"]["took_ms"].as_u64())
}

/// Closure mode with `apply.prebuild` (the rounds above go without it, so that their latency
/// is the switch's alone): each revision's system is fetched and its plan computed before the
/// activation; returns each plan's `took_ms`.
fn plan_rounds(cache: &Cache, systems: &Systems, rounds: usize) -> Vec<Duration> {
    let env = closure_env(cache, &cache.public, "");
    env.dropin("90-prebuild.toml", "[apply]\nprebuild = true\n");
    let d = env.start();
    let mut plans = Vec::new();
    for i in 0..rounds {
        let name = format!("plan-{i}");
        let path = systems.build(&name, true);
        cache.push(&path);
        forget(&path);
        let rev = env
            .repo
            .commit("hosts/lucy.closure", &format!("{path}\n"), &name);
        ctl(&env, &["sync"]);
        wait_for("the revision applied after its build", || {
            let h: Value = serde_json::from_str(&ctl(&env, &["history", "--json"])).ok()?;
            let applied = h["attempts"].as_array()?.iter().any(|a| {
                a["revision"] == rev.as_str() && a["kind"] == "apply" && a["outcome"] == "succeeded"
            });
            applied.then_some(())
        });
        if let Some(ms) = plan_ms(&env, &rev) {
            plans.push(Duration::from_millis(ms));
        }
    }
    d.stop();
    plans
}

fn stamp(path: &std::path::Path) -> u128 {
    std::fs::read_to_string(path)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

fn summary(name: &str, mut lat: Vec<Duration>, rss: &[u64]) {
    lat.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let p = |q: f64| lat[((lat.len() as f64 - 1.0) * q).round() as usize];
    let rss = match rss.iter().copied().max() {
        Some(kib) => format!("   max RSS {:>6.1} MiB", kib as f64 / 1024.0),
        None => String::new(),
    };
    println!(
        "{name:<34} median {:>8.1} ms   p90 {:>8.1} ms{rss}",
        ms(p(0.5)),
        ms(p(0.9)),
    );
}

fn main() {
    if !require_nix() {
        return;
    }
    let rounds: usize = std::env::var("BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let tmp = tempfile::tempdir().unwrap();

    // Closure mode.
    let cache = Cache::new(tmp.path(), "ginx-bench-1");
    let systems = Systems::new(tmp.path());
    let env = closure_env(&cache, &cache.public, "");
    let d = env.start();
    let (mut lat, mut rss) = (Vec::new(), Vec::new());
    for i in 0..rounds {
        let name = format!("bench-{i}");
        let path = systems.build(&name, true);
        cache.push(&path);
        forget(&path);
        let rev = env
            .repo
            .commit("hosts/lucy.closure", &format!("{path}\n"), &name);
        let t0 = now_ns();
        ctl(&env, &["sync"]);
        let a = attempt(&env, &rev);
        assert_eq!(a["outcome"], "succeeded", "{a:#}");
        let started = stamp(&systems.dir.join(format!("started-{name}")));
        lat.push(Duration::from_nanos((started - t0) as u64));
        rss.push(a["max_rss_kib"].as_u64().unwrap_or(0));
    }
    d.stop();
    let plans = plan_rounds(&cache, &systems, rounds);
    println!("closure mode vs colmena mode ({rounds} rounds each, the same one-line change)");
    summary("closure: sync → switch start", lat, &rss);
    if plans.is_empty() {
        println!("plan: none computed");
    } else {
        summary("plan after the build (real Nix)", plans, &[]);
    }

    // Colmena mode, the stand-in, marking its start.
    let env = Env::new();
    let mark = env.root.join("bin/colmena-marking");
    std::fs::write(
        &mark,
        format!(
            "#!/bin/sh\ndate +%s%N > \"$GINX_STUB_DIR/started-$GINX_REVISION\"\nexec {} \"$@\"\n",
            env.colmena.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&mark, std::fs::Permissions::from_mode(0o755)).unwrap();
    env.dropin(
        "50-colmena.toml",
        &format!(
            "[apply]\ncommand = [\"{}\", \"apply-local\", \"--node\", \"{{node}}\"]\n",
            mark.display()
        ),
    );
    let d = env.start();
    let (mut lat, mut rss) = (Vec::new(), Vec::new());
    for i in 0..rounds {
        let rev = env.repo.commit(
            "hosts/lucy.nix",
            &format!("{{ generation = {i}; }}\n"),
            "change",
        );
        let t0 = now_ns();
        ctl(&env, &["sync"]);
        let a = attempt(&env, &rev);
        assert_eq!(a["outcome"], "succeeded", "{a:#}");
        let started = stamp(&env.stub_dir.join(format!("started-{rev}")));
        lat.push(Duration::from_nanos((started - t0) as u64));
        rss.push(a["max_rss_kib"].as_u64().unwrap_or(0));
    }
    d.stop();
    summary("colmena (stand-in): sync → start", lat, &rss);
    println!(
        "real colmena evaluates the hive and builds the system before its switch: not measured here (no nixpkgs)"
    );
}
