//! Figures for reporting to Kubernetes (run: `cargo bench --bench kubernetes`), against the
//! stand-in API server of tests/support (real TLS, real HTTP, in this process):
//!
//! 1. API requests per node per hour at steady state: the real daemon with its intervals
//!    scaled down 100× (renew 100 ms instead of 10 s, resync 6 s instead of 10 min) for 36 s,
//!    i.e. one scaled hour, after a warm-up; counts scaled back per hour.
//! 2. One process running 300 heartbeats (the library's `Heartbeat`, one shared client) for
//!    `BENCH_SECONDS` (default 30): writes per second and heartbeat latency, at the real 10 s
//!    interval and at 1 s.

#[path = "../../tests/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ginx::kube::heartbeat::Heartbeat;
use k8s_openapi::api::coordination::v1::Lease;
use support::apiserver::ApiServer;
use support::{Env, wait_for};

fn per_hour(api: &ApiServer, from: usize, scale: f64) -> BTreeMap<String, f64> {
    let mut m = BTreeMap::new();
    for r in &api.log()[from..] {
        let kind = if r.path.contains("/leases/") {
            "lease"
        } else if r.path.ends_with("/status") {
            "node status"
        } else {
            "node"
        };
        *m.entry(format!("{} {kind}", r.method)).or_insert(0.0) += scale;
    }
    m
}

fn steady_state() {
    let env = Env::new();
    let api = ApiServer::start(&env.root);
    api.add_node("lucy");
    let kc = env.root.join("kubeconfig");
    api.kubeconfig_token(&kc);
    let (kubelet, _k) = support::fakes::tcp(200, "ok");
    env.dropin(
        "70-kube.toml",
        &format!(
            "[kubernetes]\nkubeconfig = \"{}\"\nrenew_interval = \"100ms\"\nresync_interval = \"6s\"\n\
             [health]\ninterval = \"300ms\"\n[health.kubelet]\nurl = \"{kubelet}\"\n\
             [health.apiserver]\nenabled = false\n[health.cilium]\nenabled = false\n\
             [health.systemd]\nenabled = false\n[health.node_ready]\nenabled = false\n",
            kc.display()
        ),
    );
    let d = env.start();
    d.wait_applied(&env.repo.head());
    wait_for("the condition", || {
        api.node("lucy")?["status"]["conditions"]
            .as_array()?
            .iter()
            .any(|c| c["type"] == "GinxHealthy")
            .then_some(())
    });
    std::thread::sleep(Duration::from_secs(2));
    let from = api.log().len();
    let window = Duration::from_secs(36);
    std::thread::sleep(window);
    // 36 s at 100× is one hour.
    let counts = per_hour(&api, from, 3600.0 / (window.as_secs_f64() * 100.0));
    let total: f64 = counts.values().sum();
    println!(
        "Steady state, one node, requests per hour (intervals scaled 100×, measured over one scaled hour):"
    );
    println!();
    println!("| request | per hour |");
    println!("| --- | --- |");
    for (k, v) in &counts {
        println!("| {k} | {v:.0} |");
    }
    println!("| **total** | **{total:.0}** |");
    println!();
}

async fn heartbeats(
    api: &ApiServer,
    env: &Env,
    n: usize,
    interval: Duration,
    seconds: u64,
) -> (f64, Vec<Duration>) {
    let kc = env.root.join("kubeconfig");
    api.kubeconfig_token(&kc);
    let mut cfg = ginx::config::Config::default();
    cfg.kubernetes.kubeconfig = Some(kc);
    cfg.node.name = Some("bench".into());
    let clients = ginx::kube::connect(&cfg, &ginx::metrics::Metrics::new())
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let latencies = Arc::new(std::sync::Mutex::new(Vec::new()));
    let writes = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let steady_from = Instant::now() + interval;
    let mut tasks = Vec::new();
    for i in 0..n {
        let api: kube::Api<Lease> = kube::Api::namespaced(clients.main.clone(), "ginx-system");
        let (latencies, writes) = (Arc::clone(&latencies), Arc::clone(&writes));
        tasks.push(tokio::spawn(async move {
            let mut hb = Heartbeat::new(api, format!("ginx-node-{i}"), format!("node-{i}"), 40);
            // Spread the first renewals over one interval, as nodes started at different times.
            tokio::time::sleep(interval.mul_f64(fastrand::f64())).await;
            let mut first = true;
            while Instant::now() < deadline {
                let t = Instant::now();
                if hb.renew().await.is_ok() {
                    // Count only the steady state: after every heartbeat has started.
                    if !first && t >= steady_from {
                        latencies.lock().unwrap().push(t.elapsed());
                        writes.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    first = false;
                }
                tokio::time::sleep(ginx::util::jitter(interval, 0.05).saturating_sub(t.elapsed()))
                    .await;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    // Writes are counted when they start in [steady_from, deadline).
    let window = deadline
        .saturating_duration_since(steady_from)
        .as_secs_f64();
    let rate = writes.load(std::sync::atomic::Ordering::Relaxed) as f64 / window;
    let mut l = latencies.lock().unwrap().clone();
    l.sort();
    (rate, l)
}

fn pct(v: &[Duration], p: f64) -> String {
    let d = v[((v.len() as f64 - 1.0) * p).round() as usize];
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    ginx::kube::install_crypto();
    steady_state();
    let seconds = std::env::var("BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    let env = Env::new();
    let api = ApiServer::start(&env.root);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    println!("300 heartbeats in one process (one client, one worker thread), {seconds} s each:");
    println!();
    println!("| renew interval | writes/s | p50 | p99 | max |");
    println!("| --- | --- | --- | --- | --- |");
    for interval in [Duration::from_secs(10), Duration::from_secs(1)] {
        let (rate, l) = rt.block_on(heartbeats(&api, &env, 300, interval, seconds));
        println!(
            "| {} s | {rate:.1} | {} | {} | {} |",
            interval.as_secs(),
            pct(&l, 0.5),
            pct(&l, 0.99),
            pct(&l, 1.0)
        );
    }
}
