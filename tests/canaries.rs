//! Canaries (`rollout.first`) on the shared control plane: five workers of one group, `first =
//! ["cnr-w3"]`, `max_concurrent = 2`, `soak = "4s"`. Judged from the journal every node's
//! stand-in activation and gate write to (one file, one clock: this machine's): for each of
//! three revisions, cnr-w3 starts first, no other node starts before cnr-w3's gate passed plus
//! the soak, and never more than two apply or verify at once. Then cnr-w3 stopped: the group
//! waits, naming it, and nothing starts until it is back and passed. And canaries chosen by a
//! label on their Nodes (`rollout.first_selector`), read again for each revision.

use std::path::Path;

use crate::rollout::most_at_once;
use crate::support::Env;
use crate::support::control_plane::ControlPlane;
use crate::support::daemon::Daemon;
use crate::support::kubelet::Kubelet;
use crate::support::test_fleet::{NodeToml, TestFleet, fetch_from, use_cluster};

const SOAK: f64 = 4.0;
const CANARY: &str = "cnr-w3";

/// One line of the journal: what, node, revision, time (seconds since the epoch).
struct Line {
    what: String,
    node: String,
    revision: String,
    at: f64,
}

fn lines(path: &Path) -> Vec<Line> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            Some(Line {
                what: (*w.first()?).to_owned(),
                node: (*w.get(1)?).to_owned(),
                revision: w.get(2).map_or("", |s| s).to_owned(),
                at: w.get(3).and_then(|t| t.parse().ok()).unwrap_or(0.0),
            })
        })
        .collect()
}

fn worker(cp: &ControlPlane, origin: &Path, journal: &Path, name: &str, rollout: &str) -> Env {
    let env = Env::new();
    fetch_from(&env, origin);
    use_cluster(&env, cp, name, "");
    // The gate command writes "verify NODE REVISION TIME" (and "baseline …" before).
    let gate = format!(
        "w=verify; [ $GINX_GATE_STEP = baseline ] && w=baseline; \
         echo $w {name} $GINX_REVISION $(date +%s.%N) >> {}",
        journal.display()
    );
    NodeToml::new()
        .set("node.role", "worker")
        .set("rollout.lock", "auto")
        .set("rollout.lease_duration", "5s")
        .gate(&gate)
        .merge("rollout", rollout)
        .write(&env, "80-rollout.toml");
    env.stub("journal", &journal.display().to_string());
    env.stub("journal_times", "");
    env.stub("sleep", "0.5");
    env
}

fn d(daemons: &[Option<Daemon>], i: usize) -> &Daemon {
    daemons[i].as_ref().expect("a running daemon")
}

/// For `revision`: cnr-w3 started first of the five, and every other start came after its
/// gate passed plus the soak.
fn canary_first(all: &[Line], revision: &str) {
    canary_went_first(all, revision, CANARY, 5, SOAK);
}

/// For `revision`: `canary` started first of `nodes` activations, and every other start came
/// after the canary's gate passed (its last `verify` line) plus `soak` seconds.
fn canary_went_first(all: &[Line], revision: &str, canary: &str, nodes: usize, soak: f64) {
    let of_rev: Vec<&Line> = all.iter().filter(|l| l.revision == revision).collect();
    let starts: Vec<&&Line> = of_rev.iter().filter(|l| l.what == "start").collect();
    assert_eq!(starts.len(), nodes, "{nodes} activations of {revision}");
    assert_eq!(starts[0].node, canary, "the canary starts {revision} first");
    let passed = of_rev
        .iter()
        .filter(|l| l.what == "verify" && l.node == canary)
        .map(|l| l.at)
        .fold(0.0, f64::max);
    assert!(passed > 0.0, "the canary's gate ran on {revision}");
    for s in &starts[1..] {
        assert!(
            s.at >= passed + soak,
            "{} started {revision} {:.2}s after the canary's gate passed; the soak is {soak}s",
            s.node,
            s.at - passed
        );
    }
}

#[test]
fn a_canary_goes_first_and_its_gate_and_soak_hold_the_group() {
    let Some((cp, mut rbac, origin, journal)) = TestFleet::open() else {
        return;
    };
    let names: Vec<String> = (1..=5).map(|i| format!("cnr-w{i}")).collect();
    let envs: Vec<Env> = names
        .iter()
        .map(|n| {
            rbac.watch(n);
            let rollout = format!(
                "group = \"cnr\"\nmax_concurrent = 2\nsoak = \"4s\"\nfirst = [\"{CANARY}\"]"
            );
            worker(cp, &origin.repo.path, &journal, n, &rollout)
        })
        .collect();
    let mut daemons: Vec<Option<Daemon>> = envs.iter().map(|e| Some(e.start())).collect();
    let mut revisions = vec![origin.repo.head()];
    for i in 0..5 {
        d(&daemons, i).wait_applied(&revisions[0]);
    }
    for k in 1..=2 {
        let r = origin
            .repo
            .commit("hive.nix", &format!("{{ r = {k}; }}"), &format!("r{k}"));
        for i in 0..5 {
            d(&daemons, i).ctl_ok(&["sync"]);
        }
        for i in 0..5 {
            d(&daemons, i).wait_applied(&r);
        }
        revisions.push(r);
    }
    let all = lines(&journal);
    for r in &revisions {
        canary_first(&all, r.as_str());
    }
    let pairs: Vec<(String, String)> = all
        .iter()
        .map(|l| (l.what.clone(), l.node.clone()))
        .collect();
    assert!(most_at_once(&pairs) <= 2, "more than two at once");

    // The canary stopped: a new revision waits for it on every other node, named.
    daemons[2] = None;
    let r4 = origin.repo.commit("hive.nix", "{ r = 4; }", "r4");
    for i in [0, 1, 3, 4] {
        d(&daemons, i).ctl_ok(&["sync"]);
    }
    for i in [0, 1, 3, 4] {
        let s = d(&daemons, i).wait_status("waiting for the canary", |s| {
            s["rollout"]["waiting_for"] == "canary"
        });
        let reason = s["rollout"]["reason"].as_str().unwrap();
        assert!(
            reason.starts_with(&format!("canary {CANARY} has not passed its gate on "))
                || reason.starts_with(&format!("canary {CANARY} has not renewed its heartbeat")),
            "{reason}"
        );
        assert!(reason.ends_with("the group waits for it"), "{reason}");
    }
    assert!(
        lines(&journal).iter().all(|l| l.revision != r4.as_str()),
        "nothing started r4 without its canary"
    );
    // Back: it goes first, the rest follow.
    daemons[2] = Some(envs[2].start());
    for i in 0..5 {
        d(&daemons, i).wait_applied(&r4);
    }
    canary_first(&lines(&journal), r4.as_str());
}

/// `rollout.order` by a Node label: four workers, one slot, zones set by the admin as a
/// cloud's node controller would; a revision walks through them by zone, then name.
#[test]
fn workers_take_a_revision_in_zone_order() {
    let Some((cp, mut rbac, origin, journal)) = TestFleet::open() else {
        return;
    };
    let zones = [
        ("ord-w1", "c"),
        ("ord-w2", "a"),
        ("ord-w3", "b"),
        ("ord-w4", "a"),
    ];
    let _kubelets: Vec<Kubelet> = zones
        .iter()
        .map(|(n, _)| Kubelet::start(cp, n, "worker"))
        .collect();
    for (n, z) in zones {
        cp.kubectl(&[
            "label",
            "node",
            n,
            &format!("topology.kubernetes.io/zone={z}"),
            "--overwrite",
        ]);
    }
    let envs: Vec<Env> = zones
        .iter()
        .map(|(n, _)| {
            rbac.watch(n);
            let rollout = "group = \"ord\"\norder = \"topology.kubernetes.io/zone\"";
            worker(cp, &origin.repo.path, &journal, n, rollout)
        })
        .collect();
    let daemons: Vec<Daemon> = envs.iter().map(Env::start).collect();
    for d in &daemons {
        d.wait_applied(&origin.repo.head());
    }
    // Every node's group and passed revision on its Node, as the walk reads them.
    for (n, _) in zones {
        crate::support::wait_for("the Node's rollout annotations", || {
            let node = cp.node(n)?;
            let a = &node["metadata"]["annotations"];
            (a["ginx.io/rollout-group"] == "ord"
                && a["ginx.io/passed-revision"] == origin.repo.head().as_str())
            .then_some(())
        });
    }
    let r = origin.repo.commit("hive.nix", "{ r = 1; }", "r1");
    for d in &daemons {
        d.ctl_ok(&["sync"]);
    }
    for d in &daemons {
        d.wait_applied(&r);
    }
    let starts: Vec<String> = lines(&journal)
        .into_iter()
        .filter(|l| l.what == "start" && l.revision == r.as_str())
        .map(|l| l.node)
        .collect();
    assert_eq!(
        starts,
        ["ord-w2", "ord-w4", "ord-w3", "ord-w1"],
        "zone a, a, b, c"
    );
}

/// `rollout.first_selector`: the canary is whichever Node carries the label when a revision
/// comes. Three workers with room for all three at once; the label moves from sel-w2 to
/// sel-w1 between two revisions, and the canary with it.
#[test]
fn a_label_on_the_node_makes_the_canary_and_moving_it_moves_the_canary() {
    let Some((cp, mut rbac, origin, journal)) = TestFleet::open() else {
        return;
    };
    let names = ["sel-w1", "sel-w2", "sel-w3"];
    let _kubelets: Vec<Kubelet> = names
        .iter()
        .map(|n| Kubelet::start(cp, n, "worker"))
        .collect();
    let label = |node: &str, value: &str| {
        cp.kubectl(&["label", "node", node, value, "--overwrite"]);
    };
    label("sel-w2", "ginx.io/canary=true");
    let envs: Vec<Env> = names
        .iter()
        .map(|n| {
            rbac.watch(n);
            let rollout = "group = \"sel\"\nmax_concurrent = 3\nsoak = \"2s\"\n\
                           first_selector = \"ginx.io/canary=true\"";
            worker(cp, &origin.repo.path, &journal, n, rollout)
        })
        .collect();
    let daemons: Vec<Daemon> = envs.iter().map(Env::start).collect();
    let first = origin.repo.head();
    for d in &daemons {
        d.wait_applied(&first);
    }
    canary_went_first(&lines(&journal), first.as_str(), "sel-w2", 3, 2.0);

    label("sel-w2", "ginx.io/canary-");
    label("sel-w1", "ginx.io/canary=true");
    let r = origin.repo.commit("hive.nix", "{ r = 1; }", "r1");
    for d in &daemons {
        d.ctl_ok(&["sync"]);
    }
    for d in &daemons {
        d.wait_applied(&r);
    }
    canary_went_first(&lines(&journal), r.as_str(), "sel-w1", 3, 2.0);
}
