//! Holds placed from a workstation: an operator with rbac.yaml's `ginx-fleet-operator` Role
//! (not cluster-admin) holds a worker with the real `ginxctl` and no daemon; the held worker
//! applies nothing new while the others roll two revisions out; `--until` lets it go by itself
//! and it applies the latest. On the shared control plane, in ginx-system, so vap.yaml's
//! policies are in force on every write; [`RbacGuard`] fails the test on any 403 to the
//! workers' own identities.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

use crate::rollout::{Node, journal, node};
use crate::support::control_plane::ControlPlane;
use crate::support::kubelet::Kubelet;
use crate::support::test_fleet::TestFleet;
use crate::support::{self, wait_for};

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `ginxctl ARGS --kubeconfig KC` as at a workstation: no socket, no configuration file (the
/// default namespace, ginx-system).
fn workstation(kubeconfig: &Path, args: &[&str]) -> Output {
    let out = Command::new(support::ginxctl_bin())
        .args(["--socket", "/nonexistent/ginx.sock"])
        .args(["--config", "/nonexistent/ginx.toml", "--timeout", "60s"])
        .args(args)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .env_remove("GINX_SOCKET")
        .env_remove("KUBECONFIG")
        .output()
        .unwrap();
    support::sweep::collect_ctl(args, &out);
    out
}

fn workstation_ok(kubeconfig: &Path, args: &[&str]) -> String {
    let out = workstation(kubeconfig, args);
    assert!(
        out.status.success(),
        "ginxctl {args:?}: {}\n{}",
        out.status,
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// User `user` with rbac.yaml's operator Role in ginx-system and the viewer ClusterRole, once
/// the API server authorizes by them.
fn operator(cp: &ControlPlane, kubeconfig: &Path, user: &str) {
    cp.kubeconfig_for(kubeconfig, user, &[]);
    let _ = cp.kubectl_output(&[
        "-n",
        "ginx-system",
        "create",
        "rolebinding",
        user,
        "--role=ginx-fleet-operator",
        &format!("--user={user}"),
    ]);
    let _ = cp.kubectl_output(&[
        "create",
        "clusterrolebinding",
        user,
        "--clusterrole=ginx-fleet-viewer",
        &format!("--user={user}"),
    ]);
    let can = |args: &[&str]| {
        let out =
            cp.kubectl_output(&[&["auth", "can-i"][..], args, &[&format!("--as={user}")]].concat());
        text(&out.stdout).trim() == "yes"
    };
    wait_for("the operator's bindings in effect", || {
        (can(&["update", "configmaps/ginx-rollout", "-n", "ginx-system"]) && can(&["get", "nodes"]))
            .then_some(())
    });
}

fn hold_key(cp: &ControlPlane, node: &str) -> Option<Value> {
    let cm = cp.get_path("/api/v1/namespaces/ginx-system/configmaps/ginx-rollout")?;
    serde_json::from_str(cm["data"][format!("held.{node}")].as_str()?).ok()
}

fn starts(journal_path: &Path, node: &str) -> usize {
    journal(journal_path)
        .iter()
        .filter(|(w, n)| w == "start" && n == node)
        .count()
}

#[test]
fn a_hold_from_a_workstation_keeps_a_worker_out_of_two_revisions_until_it_lapses() {
    let Some((cp, mut rbac, origin, _)) = TestFleet::open() else {
        return;
    };
    let journal_path = origin.root.join("journal");
    let names = ["hld-w1", "hld-w2", "hld-w3"];
    let _kubelets: Vec<Kubelet> = names
        .iter()
        .map(|n| Kubelet::start(cp, n, "worker"))
        .collect();
    let nodes: Vec<Node> = names
        .iter()
        .map(|n| {
            rbac.watch(n);
            let made = node(
                cp,
                &origin.repo.path,
                &journal_path,
                n,
                "worker",
                "hld",
                "max_concurrent = 2",
            );
            made.env
                .dropin("90-metrics.toml", "[metrics]\nlisten = \"127.0.0.1:0\"\n");
            made
        })
        .collect();
    // hld-w2 tells a receiver when it is held, as it would tell an on-call channel.
    let receiver = crate::notify::Receiver::start(vec![200], false);
    crate::notify::hook(&nodes[1].env, receiver.port, "[\"Held\"]", "");
    let daemons: Vec<_> = nodes.iter().map(|n| n.env.start()).collect();
    let first = origin.repo.head();
    for d in &daemons {
        d.wait_applied(&first);
    }
    let ws = tempfile::tempdir().unwrap();
    let ann = ws.path().join("ann.kubeconfig");
    operator(cp, &ann, "ann-hold");

    // A name no Node has is refused (a typo must not leave the node meant unheld).
    let out = workstation(&ann, &["hold", "hld-w22"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("no Node hld-w22 in the cluster (a typo?); --force"),
        "{}",
        text(&out.stderr)
    );
    let out = workstation(&ann, &["hold", "hld-w2", "--until", "next tuesday"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("is not a time"));

    let said = workstation_ok(&ann, &["hold", "hld-w2", "--reason", "disk failing"]);
    assert_eq!(
        said,
        "held hld-w2 until `ginxctl release` (disk failing): it starts nothing new; a slot it \
         holds finishes what it started\n"
    );
    let stored = hold_key(cp, "hld-w2").expect("held.hld-w2 in the ConfigMap");
    assert_eq!(
        stored["by"], "ann-hold",
        "named by the API server: {stored}"
    );
    assert_eq!(stored["reason"], "disk failing");
    assert!(stored.get("until").is_none());

    // Two revisions roll out to w1 and w3; w2 starts neither.
    let mut revisions = Vec::new();
    for i in 1..=2 {
        let r = origin
            .repo
            .commit("hive.nix", &format!("{{ r = {i}; }}"), &format!("r{i}"));
        for d in &daemons {
            d.ctl_ok(&["sync"]);
        }
        for d in [&daemons[0], &daemons[2]] {
            d.wait_applied(&r);
        }
        revisions.push(r);
    }
    let s = daemons[1].wait_status("hld-w2 held", |s| s["rollout"]["waiting_for"] == "held");
    assert_eq!(s["apply"]["applied_revision"], first.as_str(), "{s:#}");
    assert_eq!(s["rollout"]["hold"]["by"], "ann-hold");
    assert_eq!(s["rollout"]["hold"]["reason"], "disk failing");
    let reason = s["rollout"]["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("held by ann-hold since ")
            && reason.contains("(disk failing) until `ginxctl release`: nothing new starts here")
            && reason.ends_with("`ginxctl release hld-w2` lifts it"),
        "{reason}"
    );
    assert_eq!(
        starts(&journal_path, "hld-w2"),
        1,
        "{:?}",
        journal(&journal_path)
    );
    let status_text = daemons[1].ctl_ok(&["status"]);
    assert!(
        status_text.contains("hold       by ann-hold since ")
            && status_text.contains(": disk failing: nothing new starts here"),
        "{status_text}"
    );
    // Everywhere a halt shows: the metric, the Node, the cluster view, an Event.
    crate::kubernetes::assert_waiting_metric(&s, "held");
    wait_for("the Node's ginx.io/waiting-for", || {
        let n = cp.node("hld-w2")?;
        (n["metadata"]["annotations"]["ginx.io/waiting-for"] == "held").then_some(())
    });
    let view: Value = serde_json::from_str(&daemons[0].ctl_ok(&["cluster", "--json"])).unwrap();
    assert_eq!(
        view["fleet"]["holds"]["hld-w2"]["by"], "ann-hold",
        "{view:#}"
    );
    let listed = workstation_ok(&ann, &["cluster"]);
    assert!(
        listed.contains("held: hld-w2 by ann-hold since ")
            && listed.contains("until `ginxctl release`: disk failing"),
        "{listed}"
    );
    wait_for("the Held Event on hld-w2", || {
        let items = cp.node_events("hld-w2", "Held");
        (items.len() == 1
            && items[0]["message"]
                .as_str()
                .is_some_and(|m| m.contains("held by ann-hold") && m.contains("disk failing")))
        .then_some(())
    });
    let posted = wait_for("the Held notification", || {
        let got = receiver.got();
        (!got.is_empty()).then_some(got)
    });
    assert_eq!(posted.len(), 1, "once per spell: {posted:#?}");
    let b = &posted[0].body;
    assert_eq!(
        (&b["reason"], &b["node"], &b["group"]),
        (&"Held".into(), &"hld-w2".into(), &"hld".into()),
        "{b:#}"
    );
    assert!(
        b["message"]
            .as_str()
            .is_some_and(|m| m.contains("held by ann-hold") && m.contains("disk failing")),
        "{b:#}"
    );

    // Held again, until 5 s from now: the new hold replaces the old and lapses by itself; w2
    // then applies the latest revision, never the one in between.
    let said = workstation_ok(&ann, &["hold", "hld-w2", "--until", "5s"]);
    assert!(
        said.starts_with("held hld-w2 until 20")
            && said.contains("(replaces the hold by ann-hold since"),
        "{said}"
    );
    daemons[1].wait_applied(&revisions[1]);
    assert_eq!(
        starts(&journal_path, "hld-w2"),
        2,
        "{:?}",
        journal(&journal_path)
    );
    let s = daemons[1].status();
    assert!(s["rollout"]["hold"].is_null(), "{s:#}");
    // The lapsed key stays until the next hold or release removes it, and that is logged.
    assert!(hold_key(cp, "hld-w2").is_some());
    assert_eq!(
        workstation_ok(&ann, &["release", "hld-w2"]),
        "hld-w2 was not held\n"
    );
    assert!(hold_key(cp, "hld-w2").is_none());

    // From a node's own ginxctl: with an operator's credentials, yes; with its own, no.
    let on_node = &nodes[0].env;
    let said = on_node.operator_ok(&cp.admin_kubeconfig, &["hold", "hld-w3", "--until", "1h"]);
    assert!(said.starts_with("held hld-w3 until "), "{said}");
    let out = on_node.operator_ctl(
        &nodes[0].env.root.join("kubeconfig"),
        &["release", "hld-w3"],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("this node's own identity"));
    // A node identity copied elsewhere gets past ginxctl, and the API server's policy says no.
    let thief = ws.path().join("thief.kubeconfig");
    cp.ginx_kubeconfig(&thief, "hld-thief");
    for args in [&["release", "hld-w3"][..], &["hold", "hld-w1"]] {
        let out = workstation(&thief, args);
        assert_eq!(
            out.status.code(),
            Some(1),
            "{args:?}: {}",
            text(&out.stderr)
        );
        let err = text(&out.stderr);
        assert!(
            err.contains("holds are placed and lifted by operators (ginxctl hold|release)"),
            "{args:?}: {err}"
        );
    }
    assert_eq!(
        on_node
            .operator_ok(&cp.admin_kubeconfig, &["release", "hld-w3"])
            .split(" (")
            .next(),
        Some("released hld-w3")
    );
    let events = cp
        .get_path("/api/v1/namespaces/ginx-system/configmaps/ginx-rollout")
        .unwrap();
    let log: Vec<Value> = serde_json::from_str(events["data"]["events"].as_str().unwrap()).unwrap();
    let ours: Vec<(String, String)> = log
        .iter()
        .filter(|e| e["action"].as_str().is_some_and(|a| a.contains("hld-")))
        .map(|e| {
            let action = e["action"].as_str().unwrap();
            let head = action
                .split(" until ")
                .next()
                .unwrap()
                .split(':')
                .next()
                .unwrap();
            (e["by"].as_str().unwrap().to_owned(), head.to_owned())
        })
        .collect();
    let want = [
        ("ann-hold", "hold hld-w2"),
        ("ann-hold", "hold hld-w2"),
        ("ann-hold", "hold hld-w2 lapsed at"),
        ("admin", "hold hld-w3"),
        ("admin", "release hld-w3"),
    ];
    let got: Vec<(&str, &str)> = ours
        .iter()
        .map(|(b, a)| (b.as_str(), a.split(" 20").next().unwrap()))
        .collect();
    assert_eq!(got, want, "{log:#?}");
    drop(daemons);
}
