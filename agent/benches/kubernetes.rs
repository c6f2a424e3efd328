//! Figures for reporting to Kubernetes (run: `cargo bench --bench kubernetes`), against the
//! real control plane of tests/support/control_plane.rs (etcd, kube-apiserver,
//! kube-controller-manager from tests/control-plane/; skipped with a note when the binary is
//! missing) and, for comparison, the stand-in API server (real TLS, real HTTP, in this process):
//!
//! 0. The real control plane: start to `/readyz` (rbac.yaml applied), and its memory (RSS of
//!    each component) after the benchmark.
//! 1. API requests per node per hour at steady state: the real daemon with its intervals
//!    scaled down 100× (renew 100 ms instead of 10 s, resync 6 s instead of 10 min) for 36 s,
//!    i.e. one scaled hour, after a warm-up; counts scaled back per hour. Against the real
//!    API they are counted from its audit log.
//! 2. One process running 300 heartbeats (the library's `Heartbeat`, one shared client) for
//!    `BENCH_SECONDS` (default 30): writes per second and heartbeat latency, at the real 10 s
//!    interval and at 1 s, against each server.

#[path = "../../tests/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ginx::k8s::heartbeat::Heartbeat;
use k8s_openapi::api::coordination::v1::Lease;
use support::apiserver::ApiServer;
use support::control_plane::{AuditEvent, ControlPlane};
use support::kubelet::Kubelet;
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

/// The same table from the real API's audit log: requests by `user`.
fn per_hour_audit(events: &[AuditEvent], user: &str, scale: f64) -> BTreeMap<String, f64> {
    let mut m = BTreeMap::new();
    for e in events.iter().filter(|e| e.user == user) {
        let kind = match (e.resource.as_str(), e.subresource.as_str()) {
            ("leases", _) => "lease",
            ("nodes", "status") => "node status",
            _ => "node",
        };
        let method = match e.verb.as_str() {
            "update" => "PUT",
            "patch" => "PATCH",
            "create" => "POST",
            _ => "GET",
        };
        *m.entry(format!("{method} {kind}")).or_insert(0.0) += scale;
    }
    m
}

/// Where the steady-state daemon reports.
enum Server<'a> {
    StandIn(&'a ApiServer),
    Real(&'a ControlPlane),
}

fn steady_state(server: Server) {
    let env = Env::new();
    let kc = env.root.join("kubeconfig");
    let node = match server {
        Server::StandIn(api) => {
            api.add_node("lucy");
            api.kubeconfig_token(&kc);
            "lucy"
        }
        Server::Real(cp) => {
            cp.ginx_kubeconfig(&kc, "steady");
            env.dropin("10-node.toml", "[node]\nname = \"steady\"\n");
            "steady"
        }
    };
    let _kubelet = match server {
        Server::Real(cp) => Some(Kubelet::start(cp, node, "worker")),
        Server::StandIn(_) => None,
    };
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
    let node_json = |name: &str| match server {
        Server::StandIn(api) => api.node(name),
        Server::Real(cp) => cp.node(name),
    };
    wait_for("the condition", || {
        node_json(node)?["status"]["conditions"]
            .as_array()?
            .iter()
            .any(|c| c["type"] == "GinxHealthy")
            .then_some(())
    });
    std::thread::sleep(Duration::from_secs(2));
    let window = Duration::from_secs(36);
    // 36 s at 100× is one hour.
    let scale = 3600.0 / (window.as_secs_f64() * 100.0);
    let (label, counts) = match server {
        Server::StandIn(api) => {
            let from = api.log().len();
            std::thread::sleep(window);
            ("the stand-in", per_hour(api, from, scale))
        }
        Server::Real(cp) => {
            let mark = cp.audit_mark();
            std::thread::sleep(window);
            (
                "the real API server, from its audit log",
                per_hour_audit(&cp.audit_since(mark), "ginx:steady", scale),
            )
        }
    };
    let total: f64 = counts.values().sum();
    println!(
        "Steady state, one node, requests per hour against {label} (intervals scaled 100×, measured over one scaled hour):"
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
    kc: &std::path::Path,
    n: usize,
    interval: Duration,
    seconds: u64,
) -> (f64, Vec<Duration>) {
    let kc = kc.to_owned();
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
            let mut hb = Heartbeat::new(
                api,
                format!("ginx-node-{i}"),
                format!("node-{i}"),
                40,
                Default::default(),
            );
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

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        .unwrap_or(0)
}

fn heartbeat_table(label: &str, kc: &std::path::Path, seconds: u64) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    println!(
        "300 heartbeats in one process (one client, one worker thread), {seconds} s each, against {label}:"
    );
    println!();
    println!("| renew interval | writes/s | p50 | p99 | max |");
    println!("| --- | --- | --- | --- | --- |");
    for interval in [Duration::from_secs(10), Duration::from_secs(1)] {
        let (rate, l) = rt.block_on(heartbeats(kc, 300, interval, seconds));
        println!(
            "| {} s | {rate:.1} | {} | {} | {} |",
            interval.as_secs(),
            pct(&l, 0.5),
            pct(&l, 0.99),
            pct(&l, 1.0)
        );
    }
    println!();
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    ginx::kube::install_crypto();
    let seconds = std::env::var("BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);

    match support::control_plane::binary() {
        None => println!(
            "SKIPPED the real control plane: no binary (build tests/control-plane, see README)\n"
        ),
        Some(bin) => {
            let cp = ControlPlane::start(&bin);
            println!(
                "Real control plane (Kubernetes {}): start to /readyz with rbac.yaml applied: {:.1} s\n",
                support::control_plane::KUBERNETES_VERSION,
                cp.started_in.as_secs_f64()
            );
            steady_state(Server::Real(&cp));
            let kc = cp.dir.join("bench.kubeconfig");
            cp.ginx_kubeconfig(&kc, "bench");
            heartbeat_table("the real API server", &kc, seconds);
            println!("Control plane memory after the benchmark:\n");
            println!("| component | RSS |");
            println!("| --- | --- |");
            let mut total = 0;
            for (name, pid) in cp.pids() {
                let kib = rss_kib(pid);
                total += kib;
                println!("| {name} | {:.0} MiB |", kib as f64 / 1024.0);
            }
            println!("| **total** | **{:.0} MiB** |\n", total as f64 / 1024.0);
        }
    }

    let env = Env::new();
    let api = ApiServer::start(&env.root);
    steady_state(Server::StandIn(&api));
    let kc = env.root.join("kubeconfig");
    api.kubeconfig_token(&kc);
    heartbeat_table("the stand-in", &kc, seconds);
}
