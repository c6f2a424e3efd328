//! Figures for coordinated reboots (run: `cargo bench --bench reboot`), against the real
//! control plane of tests/support/control_plane.rs (skipped with a note when its binary is
//! missing).
//!
//! `BENCH_NODES` (default 10) real ginx daemons, workers of one group with `max_concurrent = 2`,
//! each with a stand-in kubelet for its Node and one pod on it whose containers take
//! `BENCH_DRAIN_SECONDS` (default 60) to stop once evicted (no PodDisruptionBudget), and a
//! stand-in reboot that keeps the machine down for `BENCH_DOWN_SECONDS` (default 5); the gate
//! settles for 1 s. A reboot is asked of every node at once (the sentinel file). Printed:
//!
//! - the total time from the request to the last node back, schedulable and its slot released,
//!   against the ideal ⌈nodes/2⌉ × (drain + down + settle);
//! - the most nodes unschedulable at once, from a watch of the Nodes (every event): it must
//!   not exceed 2.

#[path = "../../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use serde_json::json;

use support::Env;
use support::control_plane;
use support::kubelet::{Kubelet, STOP_SECONDS};
use support::reboot::{Node, Unschedulable, node, tend_within};

const GROUP: &str = "bench-reboot";
const SLOTS: u64 = 2;
const SETTLE_SECONDS: u64 = 1;

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let Some(cp) = control_plane::shared() else {
        println!(
            "reboot bench: skipped (no control-plane binary; see tests/control-plane/build.sh)"
        );
        return;
    };
    let count = env_number("BENCH_NODES", 10);
    let drain = env_number("BENCH_DRAIN_SECONDS", 60);
    let down = env_number("BENCH_DOWN_SECONDS", 5);
    let origin = Env::new();
    let journal = origin.root.join("journal");
    let names: Vec<String> = (1..=count).map(|i| format!("rbb-w{i:02}")).collect();
    let _kubelets: Vec<Kubelet> = names
        .iter()
        .map(|n| Kubelet::start(cp, n, "worker"))
        .collect();
    let ns = "bench-reboot";
    support::reboot::namespace(cp, ns);
    for n in &names {
        cp.apply(
            &json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": format!("work-{n}"), "namespace": ns,
                    "annotations": {STOP_SECONDS: drain.to_string()}},
                "spec": {"nodeName": n, "terminationGracePeriodSeconds": drain + 30,
                    "containers": [{"name": "c", "image": "registry.invalid/work:1"}]}})
            .to_string(),
        );
    }
    let watch = Unschedulable::watch(cp, &names);
    let mut nodes: Vec<Node> = names
        .iter()
        .map(|n| {
            let mut node = node(
                cp,
                &origin.repo.path,
                &journal,
                n,
                "worker",
                GROUP,
                [
                    &format!("max_concurrent = {SLOTS}"),
                    // Bare pods (no controller): evicted all the same.
                    "force = true\ndrain_timeout = \"10m\"",
                ],
            );
            node.env.dropin(
                "90-bench.toml",
                &format!("[rollout.gate]\nsettle = \"{SETTLE_SECONDS}s\"\n"),
            );
            node.down_for = Duration::from_secs(down);
            node
        })
        .collect();
    for n in nodes.iter_mut() {
        n.start();
    }
    let head = origin.repo.head();
    for n in &nodes {
        n.d().wait_applied(&head);
    }
    let t0 = Instant::now();
    for n in &nodes {
        n.require_reboot();
    }
    let patience = Duration::from_secs(count.div_ceil(SLOTS) * (drain + down + 60) + 120);
    tend_within(
        &mut nodes,
        "every node rebooted and back",
        patience,
        |nodes| {
            nodes.iter().all(|n| {
                n.boots == 1
                    && n.daemon.as_ref().is_some_and(|d| {
                        let out = d.ctl(&["status", "--json"]);
                        let s: serde_json::Value =
                            serde_json::from_slice(&out.stdout).unwrap_or_default();
                        s["rollout"]["reboot"]["phase"].is_null() && s["rollout"]["slot"].is_null()
                    })
            })
        },
    );
    let total = t0.elapsed().as_secs_f64();
    let rounds = count.div_ceil(SLOTS);
    let ideal = (rounds * (drain + down + SETTLE_SECONDS)) as f64;
    println!(
        "reboot bench: {count} nodes, max_concurrent {SLOTS}, drain {drain} s, down {down} s, settle {SETTLE_SECONDS} s"
    );
    println!(
        "  total {total:.1} s against the ideal {ideal:.0} s ({rounds} rounds): {:.0} % of ideal speed",
        100.0 * ideal / total
    );
    println!(
        "  most nodes unschedulable at once: {} (limit {SLOTS})",
        watch.most()
    );
    let mut downs: Vec<f64> = nodes
        .iter()
        .flat_map(|n| {
            n.went_down
                .iter()
                .map(|t| t.duration_since(t0).as_secs_f64())
        })
        .collect();
    downs.sort_by(f64::total_cmp);
    let list: Vec<String> = downs.iter().map(|d| format!("{d:.1}")).collect();
    println!(
        "  each reboot (ginx gone), seconds after the request: {}",
        list.join(", ")
    );
    assert!(
        watch.most() as u64 <= SLOTS,
        "more than {SLOTS} unschedulable at once"
    );
    cp.kubectl(&["delete", "namespace", ns, "--wait=false"]);
}
