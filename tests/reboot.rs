//! Coordinated reboots against the real control plane (tests/support/control_plane.rs): real
//! PodDisruptionBudgets computed by the real disruption controller, the real Eviction API,
//! real ReplicaSets and DaemonSets, the slot Leases.
//!
//! The nodes and their stand-in reboots are tests/support/reboot.rs's. No scheduler runs:
//! pods are bound to nodes by the test ([`bind`]), and a ReplicaSet's replacement for an
//! evicted pod stays Pending, so a PodDisruptionBudget that allowed one eviction allows no
//! second until the test binds it.

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::control_plane::{self, ControlPlane};
use crate::support::kubelet::Kubelet;
use crate::support::reboot::{Node, Unschedulable, namespace, node, tend_until};
use crate::support::test_fleet::{NodeToml, TestFleet};
use crate::support::{Env, wait_for};

fn status(n: &Node) -> Option<Value> {
    n.status()
}

pub(crate) fn unschedulable(cp: &ControlPlane, node: &str) -> bool {
    cp.node(node).unwrap()["spec"]["unschedulable"] == true
}

fn cordoned_by_ginx(cp: &ControlPlane, node: &str) -> bool {
    !cp.node(node).unwrap()["metadata"]["annotations"]["ginx.io/cordoned-by-ginx"].is_null()
}

/// Binds `pod` to `node`, as the scheduler would (there is none).
pub(crate) fn bind(cp: &ControlPlane, ns: &str, pod: &str, node: &str) {
    let (code, body) = cp.request(
        "POST",
        &format!("/api/v1/namespaces/{ns}/pods/{pod}/binding"),
        "application/json",
        &json!({"apiVersion": "v1", "kind": "Binding",
                "metadata": {"name": pod, "namespace": ns},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node}}),
    );
    assert!(code < 300, "binding {ns}/{pod} to {node}: {code} {body}");
}

/// The pods of `ns` with label app=`app`: (name, uid, node, ready).
pub(crate) fn pods(cp: &ControlPlane, ns: &str, app: &str) -> Vec<(String, String, String, bool)> {
    let list = cp
        .get_path(&format!(
            "/api/v1/namespaces/{ns}/pods?labelSelector=app%3D{app}"
        ))
        .unwrap();
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .map(|p| {
            let ready = p["status"]["conditions"].as_array().is_some_and(|c| {
                c.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            });
            (
                p["metadata"]["name"].as_str().unwrap().to_owned(),
                p["metadata"]["uid"].as_str().unwrap().to_owned(),
                p["spec"]["nodeName"].as_str().unwrap_or("").to_owned(),
                ready,
            )
        })
        .collect()
}

/// A ReplicaSet `app` of `replicas` pods in `ns`, its pods bound one to each of `on`, all
/// Ready (the stand-in kubelets mark them so).
pub(crate) fn replicaset(
    cp: &ControlPlane,
    ns: &str,
    app: &str,
    on: &[&str],
    extra_annotations: &Value,
) {
    cp.apply(
        &json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": app, "namespace": ns},
            "spec": {"replicas": on.len(), "selector": {"matchLabels": {"app": app}},
                "template": {"metadata": {"labels": {"app": app}, "annotations": extra_annotations},
                    "spec": {"terminationGracePeriodSeconds": 5,
                        "containers": [{"name": "c", "image": "registry.invalid/web:1"}]}}}})
        .to_string(),
    );
    let unbound = wait_for(&format!("{} pods of {app}", on.len()), || {
        let p = pods(cp, ns, app);
        (p.len() == on.len()).then_some(p)
    });
    for ((name, _, _, _), node) in unbound.iter().zip(on) {
        bind(cp, ns, name, node);
    }
    wait_for(&format!("{app}'s pods Ready"), || {
        pods(cp, ns, app).iter().all(|p| p.3).then_some(())
    });
}

/// The value of the metric line `name` (with its labels, if any) of the node's ginx now.
fn metric(n: &Node, name: &str) -> f64 {
    let addr = n.d().status()["metrics_listen"]
        .as_str()
        .expect("metrics listen")
        .to_owned();
    let text = crate::kubernetes::scrape(&addr);
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

#[test]
fn a_drain_respects_the_pod_disruption_budget_and_gives_the_node_back_after_the_timeout() {
    let Some((cp, mut rbac, origin, journal)) = TestFleet::open() else {
        return;
    };
    let names = ["rb-pdb-a", "rb-pdb-b"];
    let _kubelets: Vec<Kubelet> = names
        .iter()
        .map(|n| Kubelet::start(cp, n, "worker"))
        .collect();
    let ns = "rb-pdb";
    namespace(cp, ns);
    cp.apply(
        &json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": "web", "namespace": ns},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}}})
        .to_string(),
    );
    replicaset(cp, ns, "web", &names, &json!({}));
    wait_for("the budget to allow one disruption", || {
        let b = cp.get_path(&format!(
            "/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/web"
        ))?;
        (b["status"]["disruptionsAllowed"] == 1).then_some(())
    });
    let mut nodes: Vec<Node> = names
        .iter()
        .map(|n| {
            rbac.watch(n);
            node(
                cp,
                &origin.repo.path,
                &journal,
                n,
                "worker",
                "rb-pdb",
                ["", "drain_timeout = \"6s\""],
            )
        })
        .collect();
    for n in nodes.iter_mut() {
        n.start();
    }
    let head = origin.repo.head();
    for n in &nodes {
        n.d().wait_applied(&head);
    }
    let before = pods(cp, ns, "web");
    let on_b = before.iter().find(|p| p.2 == "rb-pdb-b").unwrap().clone();

    // a: its pod is evicted (the budget allows one), the node reboots and comes back.
    nodes[0].require_reboot();
    tend_until(&mut nodes, "a rebooted and back", |n| {
        n[0].boots == 1 && status(&n[0]).is_some_and(|s| s["rollout"]["reboot"]["phase"].is_null())
    });
    assert_eq!(nodes[0].reboots().len(), 1);
    assert!(!unschedulable(cp, "rb-pdb-a"), "a is uncordoned");
    assert!(!cordoned_by_ginx(cp, "rb-pdb-a"));
    let s = nodes[0]
        .d()
        .wait_status("a's slot released", |s| s["rollout"]["slot"].is_null());
    assert_eq!(s["rollout"]["reboot"]["required"], false, "{s:#}");
    assert_eq!(metric(&nodes[0], "ginx_reboots_total"), 1.0);
    let now = pods(cp, ns, "web");
    assert!(
        !now.iter()
            .any(|p| p.1 == before.iter().find(|p| p.2 == "rb-pdb-a").unwrap().1),
        "a's pod was evicted: {now:?}"
    );
    // Its replacement is Pending (no scheduler): the budget allows nothing now.
    wait_for("the budget to allow no disruption", || {
        let b = cp.get_path(&format!(
            "/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/web"
        ))?;
        (b["status"]["disruptionsAllowed"] == 0).then_some(())
    });

    // b: the eviction is refused while a's replacement is not back; ginx waits, says which
    // budget holds it, and after drain_timeout gives the node back and the slot up.
    nodes[1].require_reboot();
    let s = wait_for("b's drain refused by the budget", || {
        let s = status(&nodes[1])?;
        let refused = s["rollout"]["reboot"]["refused"].as_object()?;
        refused
            .values()
            .any(|why| {
                why.as_str()
                    .is_some_and(|w| w.contains("rb-pdb/web") && w.contains("429"))
            })
            .then_some(s)
    });
    assert_eq!(s["rollout"]["phase"], "draining", "{s:#}");
    assert_eq!(s["rollout"]["reboot"]["cordoned"], true, "{s:#}");
    // The cluster sees it: the phase annotation (`ginxctl cluster`) and the condition.
    wait_for("b draining in ginxctl cluster", || {
        let v: Value = serde_json::from_str(&nodes[0].d().ctl_ok(&["cluster", "--json"])).ok()?;
        v["nodes"]
            .as_array()?
            .iter()
            .any(|n| n["name"] == "rb-pdb-b" && n["rollout_phase"] == "draining")
            .then_some(())
    });
    wait_for("b's condition says Draining", || {
        let n = cp.node("rb-pdb-b")?;
        n["status"]["conditions"]
            .as_array()?
            .iter()
            .any(|c| c["type"] == "GinxHealthy" && c["reason"] == "Draining")
            .then_some(())
    });
    assert!(unschedulable(cp, "rb-pdb-b") && cordoned_by_ginx(cp, "rb-pdb-b"));
    let s = nodes[1].d().wait_status("b's drain given up", |s| {
        s["rollout"]["reboot"]["phase"].is_null()
            && !s["rollout"]["reboot"]["deferred_until"].is_null()
    });
    assert!(
        s["rollout"]["reboot"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("drain given up") && r.contains("rb-pdb/web")),
        "{s:#}"
    );
    assert!(
        !unschedulable(cp, "rb-pdb-b"),
        "b is uncordoned after the timeout"
    );
    assert!(!cordoned_by_ginx(cp, "rb-pdb-b"));
    nodes[1]
        .d()
        .wait_status("b's slot released", |s| s["rollout"]["slot"].is_null());
    assert!(nodes[1].reboots().is_empty(), "b was not rebooted");
    assert!(metric(&nodes[1], "ginx_evictions_refused_total") >= 1.0);
    assert_eq!(metric(&nodes[1], "ginx_drain_duration_seconds_count"), 1.0);
    // Never deleted past the budget: b's pod is the same pod.
    assert!(
        pods(cp, ns, "web").iter().any(|p| p.1 == on_b.1),
        "b's pod is still there"
    );
    // The evictions went through the Eviction API, with the node's own credentials.
    let evictions: Vec<_> = rbac
        .requests()
        .into_iter()
        .filter(|e| e.resource == "pods" && e.subresource == "eviction")
        .collect();
    assert!(
        evictions
            .iter()
            .any(|e| e.code == 429 && e.user == "system:node:rb-pdb-b"),
        "{evictions:?}"
    );
    assert!(
        evictions
            .iter()
            .any(|e| e.code < 300 && e.user == "system:node:rb-pdb-a"),
        "{evictions:?}"
    );
    // What the drain asked of the API beyond what ginx did before: its pods and evictions as
    // the node, the budgets as ginx (rbac.yaml's ginx-drain-budgets); RbacGuard fails the test
    // on any 403.
    let mut used: Vec<String> = rbac
        .requests()
        .into_iter()
        .filter(|e| matches!(e.resource.as_str(), "pods" | "poddisruptionbudgets"))
        .map(|e| {
            let sub = if e.subresource.is_empty() {
                String::new()
            } else {
                format!("/{}", e.subresource)
            };
            format!("{} {}{sub}", e.verb, e.resource)
        })
        .collect();
    used.sort();
    used.dedup();
    assert_eq!(
        used,
        [
            "create pods/eviction",
            "list poddisruptionbudgets",
            "list pods"
        ],
        "{used:?}"
    );
    cp.kubectl(&["delete", "namespace", ns, "--wait=false"]);
}

#[test]
fn daemonset_and_mirror_pods_stay_and_an_admin_cordon_is_never_lifted() {
    let Some((cp, mut rbac, origin, journal)) = TestFleet::open() else {
        return;
    };
    let name = "rb-ds";
    let _kubelet = Kubelet::start(cp, name, "worker");
    let ns = "rb-ds";
    namespace(cp, ns);
    cp.kubectl(&["label", "node", name, "rb-ds=yes", "--overwrite"]);
    cp.apply(
        &json!({"apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": "agent", "namespace": ns},
            "spec": {"selector": {"matchLabels": {"app": "agent"}},
                "template": {"metadata": {"labels": {"app": "agent"}},
                    "spec": {"nodeSelector": {"rb-ds": "yes"},
                        "containers": [{"name": "c", "image": "registry.invalid/agent:1"}]}}}})
        .to_string(),
    );
    let ds_pod = wait_for("the DaemonSet's pod", || {
        pods(cp, ns, "agent").into_iter().next()
    });
    if ds_pod.2.is_empty() {
        bind(cp, ns, &ds_pod.0, name);
    }
    cp.apply(
        &json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("static-{name}"), "namespace": ns,
                "labels": {"app": "static"},
                "annotations": {"kubernetes.io/config.mirror": "0123", "kubernetes.io/config.source": "file"}},
            "spec": {"nodeName": name, "containers": [{"name": "c", "image": "registry.invalid/s:1"}]}})
        .to_string(),
    );
    let mirror = wait_for("the mirror pod", || {
        pods(cp, ns, "static").into_iter().next()
    });
    // A backup runs on the node: the reboot waits for it (reboot.blocking_pod_selector).
    cp.apply(
        &json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "backup", "namespace": ns, "labels": {"app": "backup"}},
            "spec": {"nodeName": name, "containers": [{"name": "c", "image": "registry.invalid/b:1"}]}})
        .to_string(),
    );
    // The admin cordons the node first.
    cp.kubectl(&["cordon", name]);

    let mut nodes = vec![node(
        cp,
        &origin.repo.path,
        &journal,
        name,
        "worker",
        "rb-ds",
        ["", "blocking_pod_selector = \"app=backup\""],
    )];
    rbac.watch(name);
    nodes[0].start();
    nodes[0].d().wait_applied(&origin.repo.head());
    nodes[0].require_reboot();
    let s = nodes[0]
        .d()
        .wait_status("the reboot waiting for the backup", |s| {
            s["rollout"]["reboot"]["waiting_for"] == "pods"
        });
    assert!(
        s["rollout"]["reboot"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("rb-ds/backup")),
        "{s:#}"
    );
    assert!(nodes[0].reboots().is_empty());
    cp.kubectl(&["delete", "pod", "-n", ns, "backup", "--wait=true"]);
    tend_until(&mut nodes, "the reboot done", |n| {
        n[0].boots == 1 && status(&n[0]).is_some_and(|s| s["rollout"]["reboot"]["phase"].is_null())
    });
    assert_eq!(nodes[0].reboots().len(), 1);
    assert!(unschedulable(cp, name), "the admin's cordon stays");
    assert!(!cordoned_by_ginx(cp, name));
    // And the log does not say otherwise (it once said "schedulable").
    let log = nodes[0].d().log();
    assert!(
        log.contains("reboot done")
            && log.contains("ginx did not cordon it")
            && !log.contains("and schedulable"),
        "{log}"
    );
    let after_ds = pods(cp, ns, "agent");
    assert_eq!(
        after_ds.iter().map(|p| &p.1).collect::<Vec<_>>(),
        [&ds_pod.1],
        "the DaemonSet pod stays"
    );
    let after_mirror = pods(cp, ns, "static");
    assert_eq!(
        after_mirror.iter().map(|p| &p.1).collect::<Vec<_>>(),
        [&mirror.1],
        "the mirror pod stays"
    );
    let evictions = rbac
        .requests()
        .into_iter()
        .filter(|e| e.subresource == "eviction")
        .count();
    assert_eq!(
        evictions, 0,
        "nothing was evicted (the backup was deleted by the admin)"
    );
    cp.kubectl(&["uncordon", name]);
    cp.kubectl(&["delete", "namespace", ns, "--wait=false"]);
}

/// Makes the next commit's activation need a reboot: a new kernel.
fn new_kernel(nodes: &[Node]) {
    for n in nodes {
        n.env.stub("kernel", "kernel-2");
    }
}

#[test]
fn a_new_kernel_reboots_three_control_plane_nodes_one_at_a_time() {
    let Some((cp, mut rbac, origin, journal)) = TestFleet::open() else {
        return;
    };
    let names: Vec<String> = ["rb3-lucy", "rb3-makise", "rb3-quinn"]
        .map(String::from)
        .to_vec();
    let _kubelets: Vec<Kubelet> = names
        .iter()
        .map(|n| Kubelet::start(cp, n, "control-plane"))
        .collect();
    let ns = "rb3";
    namespace(cp, ns);
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    replicaset(cp, ns, "app", &refs, &json!({}));
    let watch = Unschedulable::watch(cp, &names);
    let mut nodes: Vec<Node> = names
        .iter()
        .map(|n| {
            rbac.watch(n);
            node(
                cp,
                &origin.repo.path,
                &journal,
                n,
                "control-plane",
                "rb3",
                ["", ""],
            )
        })
        .collect();
    for n in nodes.iter_mut() {
        // Down longer than the slot Lease's duration (5 s): only the raised one (lock_ttl)
        // keeps the others from taking the rebooting holder for a dead one.
        n.down_for = Duration::from_secs(8);
        n.slot_lease = Some((cp, "ginx-rollout-rb3-0".to_owned()));
        n.start();
    }
    let first = origin.repo.head();
    for n in &nodes {
        n.d().wait_applied(&first);
    }
    new_kernel(&nodes);
    let second = origin
        .repo
        .commit("hive.nix", "{ kernel = 2; }", "kernel 2");
    for n in &nodes {
        n.d().ctl_ok(&["sync"]);
    }
    let mut leases_down: Vec<(String, Value)> = Vec::new();
    tend_until(&mut nodes, "three nodes rebooted and back", |n| {
        for n in n.iter() {
            if let Some((_, Some(l))) = &n.down
                && !leases_down.iter().any(|(who, _)| *who == n.name)
            {
                leases_down.push((n.name.clone(), l.clone()));
            }
        }
        n.iter().all(|n| {
            n.boots == 1
                && status(n).is_some_and(|s| {
                    s["apply"]["applied_revision"] == second.as_str()
                        && s["rollout"]["reboot"]["phase"].is_null()
                        && s["rollout"]["slot"].is_null()
                        && s["system"]["reboot_required"] == false
                })
        })
    });
    for n in &nodes {
        // Generation 2 is the first revision, 3 the new kernel: booted once, into 3.
        assert_eq!(n.reboots(), ["system-3"], "{}", n.name);
        assert!(!unschedulable(cp, &n.name), "{} uncordoned", n.name);
    }
    assert_eq!(watch.most(), 1, "at most one node unschedulable at once");
    // While each node was down, the slot was its own with the raised duration.
    assert_eq!(leases_down.len(), 3, "{leases_down:?}");
    for (who, l) in &leases_down {
        assert_eq!(l["spec"]["holderIdentity"], who.as_str(), "{l:#}");
        assert_eq!(l["spec"]["leaseDurationSeconds"], 30, "lock_ttl: {l:#}");
    }
    // The journal: each node's reboot comes after its activation, and no other node starts
    // applying between a node's start and its reboot's gate (one slot for the group).
    let lines: Vec<(String, String)> = std::fs::read_to_string(&journal)
        .unwrap()
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            Some((w.next()?.to_owned(), w.next()?.to_owned()))
        })
        .collect();
    let reboots = lines.iter().filter(|(w, _)| w == "reboot").count();
    assert_eq!(reboots, 3, "{lines:?}");
    for who in &names {
        // From a node's activation of the new kernel to its reboot, nobody else starts: the
        // slot taken for the apply is kept for the reboot.
        let from = lines
            .iter()
            .rposition(|(w, n)| w == "start" && n == who)
            .unwrap();
        let to = lines
            .iter()
            .position(|(w, n)| w == "reboot" && n == who)
            .unwrap();
        assert!(from < to, "{lines:?}");
        assert!(
            lines[from..to]
                .iter()
                .all(|(w, n)| w != "start" || n == who),
            "another node applied while {who} held the slot for its reboot: {lines:?}"
        );
        // From its reboot to its gate in the new boot (down for 8 s), nobody else starts.
        let back = to
            + lines[to..]
                .iter()
                .position(|(w, n)| w == "verify" && n == who)
                .unwrap();
        assert!(
            lines[to..back].iter().all(|(w, _)| w != "start"),
            "another node applied while {who} was rebooting: {lines:?}"
        );
    }
    cp.kubectl(&["delete", "namespace", ns, "--wait=false"]);
}

#[test]
fn a_gate_failing_after_the_reboot_rolls_back_reboots_again_and_halts() {
    let Some((cp, mut rbac, origin, journal)) = TestFleet::open() else {
        return;
    };
    let name = "rb-fail";
    let _kubelet = Kubelet::start(cp, name, "worker");
    rbac.watch(name);
    let mut nodes = vec![node(
        cp,
        &origin.repo.path,
        &journal,
        name,
        "worker",
        "rb-fail",
        ["", ""],
    )];
    let nix: PathBuf = nodes[0].env.stub_dir.join("nix");
    // The gate fails while the booted kernel is kernel-2: the new kernel does not come up
    // healthy. The rollback makes generation 2 the boot default again.
    nodes[0].env.dropin(
        "90-breaks.toml",
        &format!(
            "[rollout.gate]\ntimeout = \"5s\"\ncommand = [\"sh\", \"-c\", \"{gate}; ! readlink -f {b}/kernel | grep -q kernel-2\"]\n\n\
             [system]\nrollback_command = [\"ln\", \"-sfn\", \"system-2-link\", \"{{profile}}\"]\n\
             boot_command = [\"true\"]\n",
            gate = crate::support::gate_writes(name, &journal),
            b = nix.join("run/booted-system").display(),
        ),
    );
    nodes[0].start();
    nodes[0].d().wait_applied(&origin.repo.head());
    new_kernel(&nodes);
    let bad = origin
        .repo
        .commit("hive.nix", "{ kernel = 2; }", "kernel 2");
    nodes[0].d().ctl_ok(&["sync"]);
    tend_until(&mut nodes, "rolled back, rebooted again, done", |n| {
        n[0].boots == 2
            && status(&n[0]).is_some_and(|s| {
                s["rollout"]["reboot"]["phase"].is_null() && s["rollout"]["phase"] == "rolled-back"
            })
    });
    // Generation 2 is the first revision, 3 the new kernel.
    assert_eq!(
        nodes[0].reboots(),
        ["system-3", "system-2"],
        "into the new kernel, then back"
    );
    nodes[0]
        .d()
        .wait_status("slot released", |s| s["rollout"]["slot"].is_null());
    assert!(
        !unschedulable(cp, name),
        "uncordoned after the rolled-back system passed"
    );
    let cm = cp
        .get_path("/api/v1/namespaces/ginx-system/configmaps/ginx-rollout")
        .unwrap();
    assert!(
        cm.to_string().contains(&bad),
        "the revision is halted: {cm}"
    );
    let history = nodes[0].d().ctl_ok(&["history", "--json"]);
    let h: Value = serde_json::from_str(&history).unwrap();
    let last = h["attempts"][0].clone();
    assert_eq!(last["kind"], "rollback", "{last:#}");
    assert_eq!(last["goal"], "boot", "{last:#}");
    // Counters are per process and count in the new boot: this ginx counted the second
    // reboot, the one into the previous generation.
    assert_eq!(metric(&nodes[0], "ginx_reboots_total"), 1.0);
    assert_eq!(metric(&nodes[0], "ginx_reboots_rolled_back_total"), 1.0);
    let before: String = std::fs::read_to_string(nodes[0].env.root.join("ginx-1.log")).unwrap();
    assert!(before.contains("rebooting into it"), "{before}");
    assert!(before.contains("health gate failed"), "{before}");
    cp.kubectl(&[
        "delete",
        "configmap",
        "-n",
        "ginx-system",
        "ginx-rollout",
        "--ignore-not-found",
    ]);
}

#[test]
fn a_holder_killed_mid_drain_resumes_with_its_slot_and_never_leaves_the_node_cordoned() {
    let Some((cp, mut rbac, origin, journal)) = TestFleet::open() else {
        return;
    };
    let name = "rb-kill";
    let _kubelet = Kubelet::start(cp, name, "worker");
    rbac.watch(name);
    let ns = "rb-kill";
    namespace(cp, ns);
    // One pod and a budget that wants it: no eviction is allowed until the budget goes.
    cp.apply(
        &json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": "solo", "namespace": ns},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "solo"}}}})
        .to_string(),
    );
    replicaset(cp, ns, "solo", &[name], &json!({}));
    let mut nodes = vec![node(
        cp,
        &origin.repo.path,
        &journal,
        name,
        "worker",
        "rb-kill",
        ["", "drain_timeout = \"10m\""],
    )];
    nodes[0].start();
    nodes[0].d().wait_applied(&origin.repo.head());
    nodes[0].require_reboot();
    nodes[0].d().wait_status("draining, refused", |s| {
        s["rollout"]["phase"] == "draining"
            && s["rollout"]["reboot"]["refused"]
                .as_object()
                .is_some_and(|r| !r.is_empty())
    });
    assert!(unschedulable(cp, name) && cordoned_by_ginx(cp, name));
    // SIGKILL mid-drain.
    nodes[0].daemon.take().unwrap().crash();
    nodes[0].start();
    let s = nodes[0]
        .d()
        .wait_status("draining again after the restart", |s| {
            s["rollout"]["phase"] == "draining" && s["rollout"]["slot"] == 0
        });
    assert_eq!(s["rollout"]["reboot"]["cordoned"], true, "{s:#}");
    let lease = cp.lease("ginx-system", "ginx-rollout-rb-kill-0").unwrap();
    assert_eq!(
        lease["spec"]["holderIdentity"], name,
        "the same slot, held by the same node"
    );
    // The budget goes: the drain finishes, the node reboots, comes back uncordoned.
    cp.kubectl(&["delete", "pdb", "-n", ns, "solo"]);
    tend_until(&mut nodes, "the reboot done", |n| {
        n[0].boots == 1 && status(&n[0]).is_some_and(|s| s["rollout"]["reboot"]["phase"].is_null())
    });
    assert!(!unschedulable(cp, name) && !cordoned_by_ginx(cp, name));
    nodes[0]
        .d()
        .wait_status("slot released", |s| s["rollout"]["slot"].is_null());
    cp.kubectl(&["delete", "namespace", ns, "--wait=false"]);
}

#[test]
fn a_reboot_waits_for_its_window_and_starts_in_it() {
    let Some((cp, mut rbac, origin, journal)) = TestFleet::open() else {
        return;
    };
    let name = "rb-win";
    let _kubelet = Kubelet::start(cp, name, "worker");
    rbac.watch(name);
    // A window that opens 10 s from now (at a whole second, in UTC), for a minute.
    let opens = jiff::Timestamp::now()
        .checked_add(jiff::SignedDuration::from_secs(10))
        .unwrap()
        .round(jiff::Unit::Second)
        .unwrap();
    let z = opens.to_zoned(jiff::tz::TimeZone::UTC);
    let day = z.strftime("%a").to_string().to_lowercase();
    let start = z.strftime("%H:%M:%S").to_string();
    let mut nodes = vec![node(
        cp,
        &origin.repo.path,
        &journal,
        name,
        "worker",
        "rb-win",
        [
            "",
            &format!(
                "\n[[reboot.windows]]\ndays = [\"{day}\"]\nstart = \"{start}\"\nlength = \"1m\"\n"
            ),
        ],
    )];
    nodes[0].start();
    nodes[0].d().wait_applied(&origin.repo.head());
    nodes[0].require_reboot();
    let s = nodes[0].d().wait_status("waiting for the window", |s| {
        s["rollout"]["reboot"]["waiting_for"] == "window"
    });
    assert_eq!(s["rollout"]["reboot"]["window"]["open"], false, "{s:#}");
    assert!(jiff::Timestamp::now() < opens, "the test asked in time");
    assert!(nodes[0].reboots().is_empty(), "nothing before the window");
    tend_until(&mut nodes, "the reboot in the window", |n| n[0].boots == 1);
    let rebooted_at: jiff::Timestamp = std::fs::metadata(nodes[0].env.stub_dir.join("reboots"))
        .unwrap()
        .modified()
        .unwrap()
        .try_into()
        .unwrap();
    assert!(
        rebooted_at >= opens,
        "rebooted at {rebooted_at}, the window opens at {opens}"
    );
}

/// A worker `name` of `group` that builds each revision first (`apply.prebuild`), its plan
/// from the stand-in dry-activate saying `dry` (`extra` appended to the prebuild drop-in).
fn planning_node(
    cp: &ControlPlane,
    origin: &Env,
    journal: &std::path::Path,
    (name, group): (&str, &str),
    dry: &str,
    extra: &str,
) -> Node {
    let n = node(
        cp,
        &origin.repo.path,
        journal,
        name,
        "worker",
        group,
        ["", ""],
    );
    NodeToml::new()
        .set("apply.prebuild", true)
        .merge("apply", extra)
        .write(&n.env, "90-prebuild.toml");
    n.env.stub("journal", &journal.display().to_string());
    n.env.stub("dry_activate", dry);
    n
}

/// The plan decides the drain (`[disruption]`, default rules): a revision whose dry-activate
/// restarts only nginx is activated live, and the node is never unschedulable; one that
/// restarts containerd is cordoned before its activation starts, its pod under a
/// PodDisruptionBudget evicted, then activated, its gate passed, and the node uncordoned.
/// Asserted from a watch of the Node, the pods, the audit of the node's writes and the
/// journal of activations.
#[test]
fn a_plan_that_restarts_containerd_drains_first_and_one_that_restarts_nginx_goes_live() {
    let Some((cp, mut rbac, origin, journal)) = TestFleet::open() else {
        return;
    };
    let name = "dr-plan";
    let _kubelet = Kubelet::start(cp, name, "worker");
    let ns = "dr-plan";
    namespace(cp, ns);
    cp.apply(
        &json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": "web", "namespace": ns},
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "web"}}}})
        .to_string(),
    );
    replicaset(cp, ns, "web", &[name], &json!({}));
    wait_for("the budget to allow one disruption", || {
        let b = cp.get_path(&format!(
            "/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/web"
        ))?;
        (b["status"]["disruptionsAllowed"] == 1).then_some(())
    });
    let mut n = planning_node(
        cp,
        &origin,
        &journal,
        (name, "dr-plan"),
        "would restart the following units: nginx.service\n",
        "",
    );
    let watch = Unschedulable::watch(cp, &[name.to_owned()]);
    rbac.watch(name);
    n.start();
    n.d().wait_applied(&origin.repo.head());
    let s = n.d().ctl_ok(&["history"]);
    assert!(s.contains("plan    live: restarts nginx.service"), "{s}");
    assert_eq!(
        watch.most.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "a live activation never cordons"
    );
    let before = pods(cp, ns, "web");
    assert_eq!(before.len(), 1, "{before:?}");

    // containerd restarts: drained first.
    n.env.stub(
        "dry_activate",
        "would stop the following units: containerd.service\n\
         would start the following units: containerd.service\n",
    );
    let head = origin
        .repo
        .commit("two", "containerd", "restart containerd");
    n.d().ctl_ok(&["sync"]);
    n.d().wait_applied(&head);
    let s = n
        .d()
        .wait_status("the gate over and the node given back", |s| {
            s["rollout"]["slot"].is_null()
        });
    assert!(s["apply"]["plan"].is_null(), "applied: no next plan: {s:#}");
    assert!(!unschedulable(cp, name), "uncordoned after the gate");
    assert_eq!(watch.most.load(std::sync::atomic::Ordering::SeqCst), 1);
    let after = pods(cp, ns, "web");
    assert!(
        !after.iter().any(|p| p.1 == before[0].1),
        "the pod under the budget was evicted: {after:?}"
    );
    let evictions: Vec<_> = rbac
        .requests()
        .into_iter()
        .filter(|e| e.subresource == "eviction")
        .collect();
    assert_eq!(evictions.len(), 1, "{evictions:?}");
    // In the journal: cordoned, drained, then the activation; after the gate, uncordoned.
    let log = n.d().log();
    let at = |what: &str| {
        log.find(what)
            .unwrap_or_else(|| panic!("{what:?} is not in the log:\n{log}"))
    };
    assert!(at("cordoned before the activation") < at("drained; the activation starts"));
    let applying = log.rfind("applying").unwrap();
    assert!(at("drained; the activation starts") < applying, "{log}");
    assert!(
        at("health gate passed") < log.rfind("uncordoned").unwrap(),
        "{log}"
    );
    let h = n.d().ctl_ok(&["history"]);
    assert!(
        h.contains("plan    drain: restarts containerd.service"),
        "{h}"
    );
    cp.kubectl(&["delete", "namespace", ns, "--wait=false"]);
}

/// A plan that cannot be computed takes the policy's fallback (`disruption.unknown`, `drain` by
/// default): a dry-activate that fails is told with its exit code and last line, one that hangs
/// is killed at `disruption.timeout` (2 s here) and told so; each revision is drained first and
/// then activated, and the daemon goes on (the second revision is applied at all: nothing
/// waited on the hung process).
#[test]
fn a_plan_that_cannot_be_computed_takes_the_fallback_and_nothing_hangs() {
    let Some((cp, mut rbac, origin, journal)) = TestFleet::open() else {
        return;
    };
    let name = "dr-unknown";
    let _kubelet = Kubelet::start(cp, name, "worker");
    let mut n = planning_node(
        cp,
        &origin,
        &journal,
        (name, "dr-unknown"),
        "error: the activation script is broken\n",
        "\n[disruption]\ntimeout = \"2s\"\n",
    );
    n.env.stub("dry_activate_exit", "1");
    let watch = Unschedulable::watch(cp, &[name.to_owned()]);
    rbac.watch(name);
    n.start();
    n.d().wait_applied(&origin.repo.head());
    let h = n.d().ctl_ok(&["history"]);
    assert!(
        h.contains("switch-to-configuration dry-activate exited with 1: error: the activation script is broken"),
        "{h}"
    );
    assert!(h.contains("plan    drain: the plan is unknown"), "{h}");
    n.d().wait_status("the first drain over", |s| {
        s["rollout"]["slot"].is_null() && s["apply"]["drain"].is_null()
    });
    assert_eq!(watch.most.load(std::sync::atomic::Ordering::SeqCst), 1);

    n.env.stub("dry_activate_exit", "0");
    n.env.stub("dry_activate_hang", "");
    let head = origin.repo.commit("two", "hang", "dry-activate hangs");
    n.d().ctl_ok(&["sync"]);
    n.d().wait_applied(&head);
    let h = n.d().ctl_ok(&["history"]);
    assert!(
        h.contains(
            "switch-to-configuration dry-activate did not finish within 2s (disruption.timeout)"
        ),
        "{h}"
    );
    n.d().wait_status("the second drain over", |s| {
        s["rollout"]["slot"].is_null() && s["apply"]["drain"].is_null()
    });
    assert!(!unschedulable(cp, name), "uncordoned after the gate");
    let cordons = rbac
        .requests()
        .into_iter()
        .filter(|e| e.resource == "nodes" && e.verb == "patch" && e.code < 300)
        .count();
    assert!(
        cordons >= 4,
        "a cordon and an uncordon per revision: {cordons}"
    );
}

/// Plans reach the fleet: three nodes of one group, one slot, each activation held long
/// enough that every node has built the revision and waits with its plan. Each node's plan is
/// on its own heartbeat Lease (`ginx.io/plan`, written by its own identity: the audit log), the
/// cluster view counts them for the revision with what accounts for the drains, each Node has
/// a `Planned` Event and each ginx counts its plan in `ginx_plans_total{action}`; once
/// applied, no heartbeat carries a plan.
#[test]
fn every_node_publishes_its_plan_and_the_cluster_view_counts_them() {
    let Some((cp, mut rbac, origin, journal)) = TestFleet::open() else {
        return;
    };
    let names = ["pl-a", "pl-b", "pl-c"];
    let said = [
        "would restart the following units: containerd.service\n",
        "would restart the following units: nginx.service\n",
        "would restart the following units: containerd.service, kubelet.service\n",
    ];
    let _kubelets: Vec<Kubelet> = names
        .iter()
        .map(|n| Kubelet::start(cp, n, "worker"))
        .collect();
    let mark = cp.audit_mark();
    let mut nodes: Vec<Node> = names
        .iter()
        .zip(said)
        .map(|(name, dry)| {
            rbac.watch(name);
            let n = planning_node(cp, &origin, &journal, (name, "pl"), dry, "");
            // Long enough that all three have built and wait while the first activates.
            n.env.stub("sleep", "8");
            n
        })
        .collect();
    for n in &mut nodes {
        n.start();
    }
    let head = origin.repo.head();
    let view = wait_for("three plans for the revision in the cluster view", || {
        let v: Value = serde_json::from_str(&nodes[1].d().ctl_ok(&["cluster", "--json"])).ok()?;
        let p = &v["plans"][&head];
        (p["live"].as_u64()? + p["drain"].as_u64()? == 3).then_some(v)
    });
    let p = &view["plans"][&head];
    assert_eq!(
        (&p["live"], &p["drain"], &p["reboot"]),
        (&json!(1), &json!(2), &json!(0)),
        "{view:#}"
    );
    assert_eq!(p["because"]["restarts containerd.service"], 2, "{p}");
    assert_eq!(p["because"]["restarts kubelet.service"], 1, "{p}");
    let text = nodes[1].d().ctl_ok(&["cluster"]);
    assert!(
        text.contains(&format!(
            "plan for {}: 1 live, 2 drain, 0 reboot; restarts containerd.service (2), restarts kubelet.service (1)",
            &head[..12]
        )),
        "{text}"
    );
    let hb = cp.lease("ginx-system", "ginx-pl-b").unwrap();
    let plan: Value = serde_json::from_str(
        hb["metadata"]["annotations"]["ginx.io/plan"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(plan["revision"], head.as_str());
    assert_eq!(plan["action"], "none");

    for n in &nodes {
        n.d().wait_applied(&head);
    }
    for (n, action) in nodes.iter().zip(["drain", "none", "drain"]) {
        let name = &n.name;
        let events = cp
            .get_path(&format!(
                "/apis/events.k8s.io/v1/namespaces/default/events?fieldSelector=regarding.name%3D{name}"
            ))
            .unwrap();
        let planned: Vec<&Value> = events["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["reason"] == "Planned")
            .collect();
        assert_eq!(planned.len(), 1, "{name}: {events:#}");
        let label = if action == "none" { "live" } else { action };
        assert!(
            planned[0]["note"]
                .as_str()
                .unwrap()
                .contains(&format!("{}: {label}", &head[..12])),
            "{name}: {}",
            planned[0]["note"]
        );
        assert_eq!(
            metric(n, &format!("ginx_plans_total{{action=\"{action}\"}}")),
            1.0,
            "{name}"
        );
        wait_for("the plan gone from the heartbeat once applied", || {
            let hb = cp.lease("ginx-system", &format!("ginx-{name}"))?;
            hb["metadata"]["annotations"]
                .get("ginx.io/plan")
                .is_none()
                .then_some(())
        });
    }
    // Each plan was written by its node's own identity, on its own heartbeat.
    let plans: Vec<(String, String)> = cp
        .audit_since(mark)
        .into_iter()
        .filter(|e| e.resource == "leases" && e.code < 300)
        .filter(|e| !e.request["metadata"]["annotations"]["ginx.io/plan"].is_null())
        .map(|e| (e.user.clone(), e.name.clone()))
        .collect();
    assert!(plans.len() >= 3, "{plans:?}");
    for (user, lease) in &plans {
        assert_eq!(
            lease,
            &format!("ginx-{}", user.trim_start_matches("ginx:")),
            "{plans:?}"
        );
    }
}

/// A plan before the merge (`ginxctl plan REF`): three nodes of a group, a branch that is not
/// deployed. An operator's request is answered by every node on its heartbeat: the plan of the
/// one whose dry-activate restarts containerd drains, the nginx one goes live, and the one
/// whose build fails says so. Nothing is activated (no activation in the stand-in's journal,
/// every node still on the deployed revision) and no slot Lease is written (the audit log). A
/// second request for the same ref is answered from what was published, without a build.
#[test]
fn a_plan_request_for_an_unmerged_branch_is_answered_by_every_node_and_activates_nothing() {
    let Some(cp) = control_plane::shared() else {
        return;
    };
    let origin = Env::new();
    let journal = origin.root.join("journal");
    let names = ["pp-a", "pp-b", "pp-c"];
    let said = [
        "would restart the following units: containerd.service\n",
        "would restart the following units: nginx.service\n",
        "would restart the following units: nginx.service\n",
    ];
    let _kubelets: Vec<Kubelet> = names
        .iter()
        .map(|n| Kubelet::start(cp, n, "worker"))
        .collect();
    // The request names the group pp: the shared control plane's other nodes, in other
    // groups, read it from the same ConfigMap and leave it alone.
    let mut nodes: Vec<Node> = names
        .iter()
        .zip(said)
        .map(|(name, dry)| planning_node(cp, &origin, &journal, (name, "pp"), dry, ""))
        .collect();
    let born = cp.audit_mark();
    for n in &mut nodes {
        n.start();
    }
    let deployed = origin.repo.head();
    for n in &nodes {
        n.d().wait_applied(&deployed);
        n.d()
            .wait_status("the slot given back", |s| s["rollout"]["slot"].is_null());
    }
    nodes[2].env.stub("build_exit_code", "1");
    origin.repo.git(&["checkout", "-q", "-b", "kernel-x"]);
    let branch = origin
        .repo
        .commit("kernel", "6.12", "a new kernel, not merged");
    origin.repo.git(&["checkout", "-q", "main"]);
    let calls_before: Vec<usize> = nodes.iter().map(|n| n.env.calls().len()).collect();
    let mark = cp.audit_mark();

    let started = std::time::Instant::now();
    let out = nodes[0].env.operator_ctl(
        &cp.admin_kubeconfig,
        &["plan", "kernel-x", "--group", "pp", "--json"],
    );
    let took = started.elapsed();
    assert_eq!(
        out.status.code(),
        Some(1),
        "a failed build: exit 1: {out:?}"
    );
    let plan: Value = serde_json::from_slice(&out.stdout).unwrap();
    println!("figure: ginxctl plan on three nodes, request to the full table: {took:.1?}");
    assert_eq!(plan["complete"], true, "{plan:#}");
    assert_eq!(plan["reused"], false, "{plan:#}");
    let a = &plan["nodes"];
    assert_eq!(a.as_object().unwrap().len(), 3, "{plan:#}");
    for n in names {
        assert_eq!(a[n]["revision"], branch.as_str(), "{n}: {plan:#}");
    }
    assert_eq!(a["pp-a"]["outcome"], "planned");
    assert_eq!(a["pp-a"]["plan"]["action"], "drain");
    assert_eq!(
        a["pp-a"]["plan"]["because"][0],
        "restarts containerd.service"
    );
    assert_eq!(a["pp-b"]["plan"]["action"], "none");
    assert_eq!(a["pp-c"]["outcome"], "build-failed");
    assert!(
        a["pp-c"]["error"]
            .as_str()
            .unwrap()
            .starts_with("the build exited with 1"),
        "{plan:#}"
    );
    assert!(
        a["pp-a"]["estimate_secs"].as_u64().unwrap() >= 1,
        "{plan:#}"
    );
    // pp-a drained and passed a gate for the deployed revision: both are in its estimate.
    let of = a["pp-a"]["estimate_of"].as_str().unwrap();
    println!("pp-a's estimate: {} s: {of}", a["pp-a"]["estimate_secs"]);
    assert!(
        of.contains(" + drain ") && of.contains(" s (median of 1)") && of.contains(" + gate "),
        "{of}"
    );
    assert!(
        !of.contains("gate") || !of.contains("none recorded yet"),
        "the gate pp-a passed is recorded: {of}"
    );

    // Nothing activated, no slot taken.
    let activations = std::fs::read_to_string(&journal).unwrap_or_default();
    assert!(
        !activations
            .lines()
            .any(|l| l.starts_with("start ") && l.ends_with(&branch)),
        "{activations}"
    );
    for (n, before) in nodes.iter().zip(&calls_before) {
        assert_eq!(
            n.d().status()["apply"]["applied_revision"],
            deployed.as_str()
        );
        let goals: Vec<String> = n.env.calls()[*before..]
            .iter()
            .map(|c| c.argv.last().cloned().unwrap_or_default())
            .collect();
        assert!(goals.iter().all(|g| g == "build"), "{}: {goals:?}", n.name);
    }
    let slots: Vec<_> = cp
        .audit_since(mark)
        .into_iter()
        .filter(|e| {
            e.resource == "leases"
                && e.name.starts_with("ginx-rollout-pp")
                && e.verb != "get"
                && e.verb != "list"
                && e.verb != "watch"
        })
        .collect();
    assert!(slots.is_empty(), "no slot written: {slots:?}");
    // The rollout and the answerer read the fleet ConfigMap from one watch per node, listed
    // once in the test's few minutes (the audit logs a watch only when it ends); the request
    // was read from it, not fetched.
    let on_fleet = |since, verb: &str, name: &str| {
        cp.audit_since(since)
            .into_iter()
            .filter(|e| {
                e.user == format!("ginx:{name}") && e.resource == "configmaps" && e.verb == verb
            })
            .count()
    };
    for name in names {
        assert_eq!(
            on_fleet(born, "list", name),
            1,
            "{name}'s lists of the ConfigMap"
        );
        assert_eq!(on_fleet(mark, "get", name), 0, "{name} fetched the request");
    }

    // Asked again: answered from what was published, nothing built again.
    let calls_after: Vec<usize> = nodes.iter().map(|n| n.env.calls().len()).collect();
    let again = nodes[1]
        .env
        .operator_ctl(&cp.admin_kubeconfig, &["plan", "kernel-x", "--group", "pp"]);
    let text = String::from_utf8_lossy(&again.stdout);
    assert!(
        text.starts_with(&format!(
            "plan of kernel-x (request {}, asked before: its answers): 3 of 3 nodes answered",
            plan["request"].as_str().unwrap()
        )),
        "{text}"
    );
    let row = |n: &str| {
        text.lines()
            .find(|l| l.starts_with(n))
            .unwrap_or_default()
            .to_owned()
    };
    assert!(
        row("pp-a").contains("drain") && row("pp-a").contains("restarts containerd.service"),
        "{text}"
    );
    assert!(row("pp-b").contains("live"), "{text}");
    assert!(
        row("pp-c").contains("build failed: the build exited with 1"),
        "{text}"
    );
    let calls_now: Vec<usize> = nodes.iter().map(|n| n.env.calls().len()).collect();
    assert_eq!(calls_now, calls_after, "no build for a request that stood");
}
