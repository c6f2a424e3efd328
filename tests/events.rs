//! Kubernetes Events about the Node, read back the way an operator does: with the
//! real `kubectl describe node` against the real control plane.
//!
//! One worker node (a stand-in kubelet, tests/support/kubelet.rs, keeps its Node and pod
//! status) applies a revision, then one that fails its gate and is rolled back and halted, then
//! must reboot while a PodDisruptionBudget forbids evicting its one pod: the drain is blocked
//! until `reboot.drain_timeout` gives the node back. Every Event is ginx's own identity's
//! (`ginx:ev-a`, rbac.yaml and vap.yaml in force; [`RbacGuard`] fails the test on any 403).

use serde_json::json;

use crate::support::kubelet::Kubelet;
use crate::support::reboot::{namespace, node};
use crate::support::test_fleet::TestFleet;
use crate::support::wait_for;

/// The Events section of `kubectl describe node`: (type, reason, age column, from, message).
fn described_events(out: &str) -> Vec<(String, String, String, String, String)> {
    let Some(at) = out.find("\nEvents:") else {
        return Vec::new();
    };
    out[at..]
        .lines()
        .skip(3) // "Events:", the header, the dashes
        .filter(|l| l.starts_with("  "))
        .filter_map(|l| {
            // Columns are separated by runs of two or more spaces (tabwriter).
            let cols: Vec<&str> = l
                .trim()
                .split("  ")
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .collect();
            (cols.len() >= 5).then(|| {
                (
                    cols[0].to_owned(),
                    cols[1].to_owned(),
                    cols[2].to_owned(),
                    cols[3].to_owned(),
                    cols[4..].join("  "),
                )
            })
        })
        .collect()
}

/// Whether `want` occurs in `reasons` in this order (other reasons may come between).
fn in_order(reasons: &[String], want: &[&str]) -> bool {
    let mut it = reasons.iter();
    want.iter().all(|w| it.any(|r| r == w))
}

#[test]
fn kubectl_describe_node_shows_a_rollout_a_gate_failure_and_a_drain_blocked_by_a_budget() {
    let Some((cp, mut rbac, origin, journal)) = TestFleet::open() else {
        return;
    };
    let name = "ev-a";
    let _kubelet = Kubelet::start(cp, name, "worker");
    let ns = "ev-pdb";
    namespace(cp, ns);
    // One pod on the node, and a budget that allows no disruption of it.
    cp.apply(
        &json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": "web-budget", "namespace": ns},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}}})
        .to_string(),
    );
    crate::reboot::replicaset(cp, ns, "web", &[name], &json!({}));
    wait_for("the budget to count the pod healthy", || {
        let b = cp.get_path(&format!(
            "/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/web-budget"
        ))?;
        (b["status"]["currentHealthy"] == 1 && b["status"]["disruptionsAllowed"] == 0).then_some(())
    });
    rbac.watch(name);
    let mut n = node(
        cp,
        &origin.repo.path,
        &journal,
        name,
        "worker",
        "ev",
        ["", "drain_timeout = \"12s\""],
    );
    // The gate fails while the fake system runs the revision written in `bad`; the rollback
    // (the stand-in switch) marks the running system as the previous one, which passes.
    let nix = n.env.stub_dir.join("nix"); // made by node()
    let current = nix.join("run/current-system/revision");
    let bad = n.env.root.join("bad-revision");
    n.env.dropin(
        "85-gate.toml",
        &format!(
            "[system]\nrollback_command = [\"true\"]\n\
             switch_command = [\"sh\", \"-c\", \"echo previous > {c}\"]\n\n\
             [rollout.gate]\nsettle = \"1s\"\ntimeout = \"4s\"\n\
             command = [\"sh\", \"-c\", \"test \\\"$(cat {c} 2>/dev/null)\\\" != \\\"$(cat {b} 2>/dev/null)\\\"\"]\n",
            c = current.display(),
            b = bad.display()
        ),
    );
    n.start();
    let first = origin.repo.head();
    n.d().wait_applied(&first);
    n.d().wait_status("the first gate passed", |s| {
        s["rollout"]["passed_revision"] == first.as_str()
    });

    // A revision whose gate fails: rolled back, halted.
    let x = origin.repo.commit("hive.nix", "{ broken = true; }", "x");
    std::fs::write(&bad, format!("{x}\n")).unwrap();
    n.d().ctl_ok(&["sync"]);
    n.d()
        .wait_status("x rolled back", |s| s["rollout"]["phase"] == "rolled-back");

    // A reboot the budget blocks until the drain times out.
    n.require_reboot();
    n.d().wait_status("the drain given up", |s| {
        s["rollout"]["reboot"]["phase"].is_null()
            && !s["rollout"]["reboot"]["deferred_until"].is_null()
    });

    // The sequence, from the Events' own times (eventTime, in microseconds): `kubectl
    // describe` lists events.k8s.io/v1 Events unsorted (it sorts on the deprecated
    // lastTimestamp, which that API leaves unset), with each one's age.
    let sequence = || -> Vec<String> {
        let list = cp
            .get_path(&format!(
                "/apis/events.k8s.io/v1/namespaces/default/events?fieldSelector=regarding.name%3D{name}"
            ))
            .unwrap();
        let mut items: Vec<(String, String)> = list["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["reportingController"] == "ginx.io/ginx")
            .map(|e| {
                (
                    e["eventTime"].as_str().unwrap_or("").to_owned(),
                    e["reason"].as_str().unwrap_or("").to_owned(),
                )
            })
            .collect();
        items.sort();
        items.into_iter().map(|(_, r)| r).collect()
    };
    let events = wait_for("the Events, the drain's repeats counted", || {
        let out = cp.kubectl(&["describe", "node", name]);
        let events = described_events(&out);
        let counted = events
            .iter()
            .any(|e| e.1 == "DrainBlocked" && e.2.contains("(x") && e.4.contains("web-budget"));
        let reasons = sequence();
        // The rollback and the halt go on side by side: either may be told first.
        let rollout = [
            "Applying",
            "Applied",
            "GatePassed",
            "Applying",
            "Applied",
            "GateFailed",
        ];
        (in_order(
            &reasons,
            &[&rollout[..], &["RolledBack", "Draining", "DrainBlocked"]].concat(),
        ) && in_order(
            &reasons,
            &[&rollout[..], &["RevisionHalted", "Draining"]].concat(),
        ) && counted)
            .then_some((out, events))
    });
    let (out, events) = events;
    println!("{out}");
    // Every reason of the sequence is in what kubectl describe shows.
    for reason in [
        "Applying",
        "Applied",
        "GatePassed",
        "GateFailed",
        "RolledBack",
        "RevisionHalted",
        "Draining",
        "DrainBlocked",
    ] {
        assert!(
            events
                .iter()
                .any(|e| e.1 == reason && e.3 == "ginx.io/ginx"),
            "{reason} is not in kubectl describe node:\n{out}"
        );
    }
    for (kind, reason, _, from, message) in &events {
        if from != "ginx.io/ginx" {
            continue;
        }
        let warning = matches!(
            reason.as_str(),
            "GateFailed" | "RevisionHalted" | "DrainBlocked" | "ApplyFailed"
        );
        assert_eq!(
            kind,
            if warning { "Warning" } else { "Normal" },
            "{reason}: {message}"
        );
    }
    let short = &x[..7];
    let find = |reason: &str| {
        events
            .iter()
            .filter(|e| e.1 == reason)
            .map(|e| e.4.clone())
            .collect::<Vec<_>>()
    };
    assert!(
        find("GateFailed").iter().any(|m| m.contains(short)),
        "{out}"
    );
    assert!(
        find("RevisionHalted")
            .iter()
            .any(|m| m.contains(short) && m.contains(&format!("by {name}"))),
        "the halt names the revision and by whom:\n{out}"
    );
    assert!(
        find("DrainBlocked")
            .iter()
            .any(|m| m.contains("PodDisruptionBudget ev-pdb/web-budget")),
        "the blocked drain names the budget:\n{out}"
    );
    // Written by ginx's own identity, where the kubelet writes: namespace default.
    let list = cp
        .get_path(&format!(
            "/apis/events.k8s.io/v1/namespaces/default/events?fieldSelector=regarding.name%3D{name}"
        ))
        .unwrap();
    // (The node controller's own Events regard the Node too.)
    let items: Vec<&serde_json::Value> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["reportingController"] == "ginx.io/ginx")
        .collect();
    assert!(items.len() >= 10, "{list:#}");
    for e in &items {
        assert_eq!(e["reportingInstance"], name);
        assert_eq!(e["regarding"]["kind"], "Node");
        assert_eq!(e["regarding"]["uid"], name);
        assert_eq!(e["metadata"]["namespace"], "default");
    }
    let series = items
        .iter()
        .find(|e| e["reason"] == "DrainBlocked" && e["series"]["count"].as_i64() >= Some(2))
        .expect("a DrainBlocked Event with a series");
    assert!(
        series["series"]["lastObservedTime"].is_string(),
        "{series:#}"
    );
    let metrics = crate::kubernetes::scrape(n.d().status()["metrics_listen"].as_str().unwrap());
    let count = |series: &str| -> f64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
            .unwrap_or(0.0)
    };
    assert!(
        count("ginx_events_total{result=\"patched\"}") >= 1.0
            && count("ginx_events_total{result=\"created\"}") >= 10.0,
        "{metrics}"
    );
    assert!(
        metrics
            .lines()
            .any(|l| l == "ginx_notices_total{reason=\"RevisionHalted\"} 1"),
        "{metrics}"
    );
}
