//! Rollouts as fast as the fleet allows, and no faster than the operator says: the
//! build before the lock (`apply.prebuild`), the soak between nodes (`rollout.soak`), the order
//! across groups (`rollout.after`) and the failure budget (`rollout.halt_after`), with real ginx
//! daemons against the real control plane.
//!
//! Every node's stand-in colmena writes to one journal: `build-start`/`build-end` for a build
//! (`apply-local build`, what prebuild runs), `start`/`end` for an activation. This file's
//! [`Passes`] adds `pass NODE` the moment a node logs that its health gate passed, so that what
//! happened is read as an order of events in one file.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::rollout::{Node, breaks_on, journal, node, writers};
use crate::support::control_plane::{self, ControlPlane};
use crate::support::daemon::Daemon;
use crate::support::kubelet::Kubelet;
use crate::support::test_fleet::TestFleet;
use crate::support::{Env, wait_for};

/// Appends `pass NODE` to the journal when a node's log says its health gate passed, and, with
/// `soaked`, `soaked NODE` that long after it (on this process's monotonic clock): the journal
/// then says, as an order of lines, whether anything started within that time of a pass.
struct Passes {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Passes {
    fn watch(journal: &Path, logs: Vec<(String, PathBuf)>, soaked: Option<Duration>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let journal = journal.to_owned();
        let flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut seen = vec![0usize; logs.len()];
            let mut due: Vec<(Instant, String)> = Vec::new();
            let append = |line: String| {
                use std::io::Write;
                let mut f = std::fs::OpenOptions::new()
                    .append(true)
                    .create(true)
                    .open(&journal)
                    .unwrap();
                writeln!(f, "{line}").unwrap();
            };
            while !flag.load(Ordering::Relaxed) {
                for (i, (name, log)) in logs.iter().enumerate() {
                    let text = std::fs::read_to_string(log).unwrap_or_default();
                    let n = text.matches("health gate passed").count();
                    while seen[i] < n {
                        seen[i] += 1;
                        append(format!("pass {name}"));
                        if let Some(d) = soaked {
                            due.push((Instant::now() + d, name.clone()));
                        }
                    }
                }
                let now = Instant::now();
                due.retain(|(at, name)| {
                    if *at <= now {
                        append(format!("soaked {name}"));
                        false
                    } else {
                        true
                    }
                });
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        Self {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Passes {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn names(prefix: &str, n: usize) -> Vec<String> {
    (1..=n).map(|i| format!("{prefix}{i}")).collect()
}

/// `names` as workers of rollout group `group` with `extra` in `[rollout]`, each with a
/// stand-in kubelet for its Node.
fn workers(
    cp: &ControlPlane,
    origin: &Env,
    journal: &Path,
    names: &[String],
    group: &str,
    extra: &str,
) -> (Vec<Kubelet>, Vec<Node>) {
    let kubelets = names
        .iter()
        .map(|n| Kubelet::start(cp, n, "worker"))
        .collect();
    let nodes = names
        .iter()
        .map(|n| node(cp, &origin.repo.path, journal, n, "worker", group, extra))
        .collect();
    (kubelets, nodes)
}

fn logs(names: &[String], daemons: &[Daemon]) -> Vec<(String, PathBuf)> {
    names
        .iter()
        .cloned()
        .zip(daemons.iter().map(|d| d.log.clone()))
        .collect()
}

/// What each call of a node's stand-in colmena was asked to do (its goal) and what it found
/// of the build (`built`, `cached`, `failed`).
fn calls(n: &Node) -> Vec<(String, String)> {
    n.env
        .calls()
        .iter()
        .map(|c| {
            let goal = c.argv.last().cloned().unwrap_or_default();
            let build = std::fs::read_to_string(c.dir.join("build"))
                .unwrap_or_default()
                .trim()
                .to_owned();
            (goal, build)
        })
        .collect()
}

/// With `apply.prebuild` (the default) each node builds
/// before it asks for a slot and the activation under the slot builds nothing; a revision that
/// fails to build on one node takes no slot there, and the others go on.
#[test]
fn a_build_comes_before_the_slot_and_a_failed_one_takes_none() {
    let Some((cp, mut rbac, origin, _)) = TestFleet::open() else {
        return;
    };
    let journal_path = origin.root.join("journal");
    let names = names("tpb-", 3);
    let nodes: Vec<Node> = names
        .iter()
        .map(|n| {
            rbac.watch(n);
            let node = node(cp, &origin.repo.path, &journal_path, n, "worker", "tpb", "");
            node.env
                .dropin("90-prebuild.toml", "[apply]\nprebuild = true\n");
            node.env.stub("build_sleep", "1");
            node
        })
        .collect();
    // The second node cannot build anything.
    nodes[1].env.stub("build_exit_code", "1");
    let daemons: Vec<Daemon> = nodes.iter().map(|n| n.env.start()).collect();
    let head = origin.repo.head();
    daemons[0].wait_applied(&head);
    daemons[2].wait_applied(&head);
    let failed = daemons[1].wait_status("the failed build", |s| s["apply"]["state"] == "failed");
    assert!(
        failed["apply"]["error"]
            .as_str()
            .unwrap_or("")
            .contains("code 1"),
        "{failed:#}"
    );
    // The nodes that built: one build, then one activation that found the system built.
    for i in [0, 2] {
        assert_eq!(
            calls(&nodes[i]),
            [
                ("build".to_owned(), "built".to_owned()),
                ("switch".to_owned(), "cached".to_owned())
            ],
            "{}",
            names[i]
        );
    }
    // The node whose build failed only ever built: never an activation...
    let c = calls(&nodes[1]);
    assert!(
        !c.is_empty() && c.iter().all(|(g, b)| g == "build" && b == "failed"),
        "{c:?}"
    );
    // ...and never wrote the group's slot Lease: it took no slot.
    let w = writers(&rbac.requests(), "ginx-rollout-tpb-0");
    let user = format!("ginx:{}", names[1]);
    assert!(!w.contains(&user), "the failed build took a slot: {w:?}");
    assert!(
        w.contains(&format!("ginx:{}", names[0])) && w.contains(&format!("ginx:{}", names[2])),
        "{w:?}"
    );
    // Its history says what failed: a build (the prebuild attempt).
    let history = daemons[1].ctl_ok(&["history"]);
    assert!(history.contains("prebuild"), "{history}");
    // In the journal, every activation comes after its node's build ended.
    let lines = journal(&journal_path);
    for n in [&names[0], &names[2]] {
        let build_end = lines
            .iter()
            .position(|(w, who)| w == "build-end" && who == n)
            .unwrap();
        let start = lines
            .iter()
            .position(|(w, who)| w == "start" && who == n)
            .unwrap();
        assert!(build_end < start, "{lines:?}");
    }
    // A failed build halts nothing by default (rollout.halt_on_build_failure = false).
    let cm = cp.get_path("/api/v1/namespaces/ginx-system/configmaps/ginx-rollout");
    let halted = cm
        .as_ref()
        .and_then(|cm| cm["data"].get(format!("halted.{head}")).cloned());
    assert!(halted.is_none(), "{cm:?}");
}

/// With `soak = "5s"`, no node of the group starts the revision within 5 s
/// of another's gate passing. Three nodes, two slots: without the soak the third would take the
/// first slot released, right after that gate passed. The journal gets `pass N` when N's
/// gate passes and `soaked N` 4 s later (a second of slack for this process's polling): no
/// `start` may fall between the two.
#[test]
fn with_a_soak_no_node_starts_within_it_of_the_previous_gate_pass() {
    let Some(cp) = control_plane::shared() else {
        return;
    };
    let origin = Env::new();
    let journal_path = origin.root.join("journal");
    let names = names("tps-", 3);
    let (_kubelets, nodes) = workers(
        cp,
        &origin,
        &journal_path,
        &names,
        "tps",
        "max_concurrent = 2\nsoak = \"5s\"",
    );
    let daemons: Vec<Daemon> = nodes.iter().map(|n| n.env.start()).collect();
    let passes = Passes::watch(
        &journal_path,
        logs(&names, &daemons),
        Some(Duration::from_secs(4)),
    );
    let head = origin.repo.head();
    for d in &daemons {
        d.wait_applied(&head);
    }
    // The last soaked line is written after the last pass.
    wait_for("every pass soaked in the journal", || {
        let lines = journal(&journal_path);
        let count = |w: &str| lines.iter().filter(|(what, _)| what == w).count();
        let passes = count("pass");
        (passes >= names.len() && count("soaked") == passes).then_some(())
    });
    drop(passes);
    let lines = journal(&journal_path);
    let mut soaking: Vec<&str> = Vec::new();
    let mut starts = 0;
    for (what, who) in &lines {
        match what.as_str() {
            "pass" => soaking.push(who),
            "soaked" => {
                if let Some(i) = soaking.iter().position(|n| n == who) {
                    soaking.remove(i);
                }
            }
            "start" => {
                starts += 1;
                assert!(
                    soaking.iter().all(|n| n == who),
                    "{who} started within the soak of {soaking:?}: {lines:?}"
                );
            }
            _ => {}
        }
    }
    assert_eq!(starts, 3, "{lines:?}");
    // The third node started after a pass: the soak was put to the test.
    let first_pass = lines.iter().position(|(w, _)| w == "pass").unwrap();
    assert!(
        lines[first_pass..].iter().any(|(w, _)| w == "start"),
        "{lines:?}"
    );
    // It said so while it waited.
    let waited = daemons.iter().any(|d| {
        d.log()
            .lines()
            .any(|l| l.contains("waiting to apply") && l.contains("rollout.soak"))
    });
    assert!(waited, "no node logged that it waited for the soak");
}

/// With `after = [<the control-plane group>]`, no worker starts a revision
/// before every node of that group has passed its gate on it; while it waits, its status,
/// its Node's `ginx.io/waiting-for` and `ginxctl cluster` name the group.
#[test]
fn with_after_no_worker_starts_before_every_control_plane_node_passed() {
    let Some(cp) = control_plane::shared() else {
        return;
    };
    let origin = Env::new();
    let journal_path = origin.root.join("journal");
    let cps = names("tac-cp", 2);
    let workers = names("tac-w", 2);
    let all: Vec<String> = cps.iter().chain(&workers).cloned().collect();
    let _kubelets: Vec<Kubelet> = all
        .iter()
        .map(|n| Kubelet::start(cp, n, "worker"))
        .collect();
    let mut nodes: Vec<Node> = cps
        .iter()
        .map(|n| {
            let node = node(
                cp,
                &origin.repo.path,
                &journal_path,
                n,
                "worker",
                "tac-control-plane",
                "",
            );
            node.env.stub("sleep", "2");
            node
        })
        .collect();
    nodes.extend(workers.iter().map(|n| {
        node(
            cp,
            &origin.repo.path,
            &journal_path,
            n,
            "worker",
            "tac-workers",
            "max_concurrent = 2\nafter = [\"tac-control-plane\"]",
        )
    }));
    // The workers first: they must wait, however early they come.
    let mut daemons: Vec<Daemon> = nodes[2..].iter().map(|n| n.env.start()).collect();
    let s = daemons[0].wait_status("a worker waiting for the control plane", |s| {
        s["rollout"]["waiting_for"] == "after"
    });
    assert!(
        s["rollout"]["reason"]
            .as_str()
            .unwrap()
            .contains("tac-control-plane"),
        "{s:#}"
    );
    wait_for("the worker's Node saying what it waits for", || {
        let n = cp.node(&workers[0])?;
        (n["metadata"]["annotations"]["ginx.io/waiting-for"] == "after tac-control-plane")
            .then_some(())
    });
    let cluster = daemons[0].ctl_ok(&["cluster"]);
    assert!(
        cluster.contains(&format!("{} (after tac-control-plane)", workers[0])),
        "{cluster}"
    );
    let cp_daemons: Vec<Daemon> = nodes[..2].iter().map(|n| n.env.start()).collect();
    let mut order: Vec<Daemon> = cp_daemons;
    order.append(&mut daemons);
    let passes = Passes::watch(&journal_path, logs(&all, &order), None);
    let head = origin.repo.head();
    for d in &order {
        d.wait_applied(&head);
    }
    wait_for("every node's pass in the journal", || {
        let passes = journal(&journal_path)
            .iter()
            .filter(|(what, _)| what == "pass")
            .count();
        (passes >= order.len()).then_some(())
    });
    drop(passes);
    let lines = journal(&journal_path);
    let first_worker_start = lines
        .iter()
        .position(|(w, who)| w == "start" && workers.contains(who))
        .unwrap();
    for c in &cps {
        let passed = lines
            .iter()
            .position(|(w, who)| w == "pass" && who == c)
            .unwrap_or_else(|| panic!("{c} never passed: {lines:?}"));
        assert!(
            passed < first_worker_start,
            "a worker started before {c} passed: {lines:?}"
        );
    }
    // The heartbeat Leases carry the group and the passed revision it was read from.
    let lease = cp
        .lease("ginx-system", &format!("ginx-{}", cps[0]))
        .unwrap();
    assert_eq!(
        lease["metadata"]["labels"]["ginx.io/group"],
        "tac-control-plane"
    );
    assert_eq!(
        lease["metadata"]["annotations"]["ginx.io/passed-revision"],
        head.as_str()
    );
}

/// With `halt_after = 2` the first failed gate of a revision quarantines
/// its node (rolled back, marked in status, annotation, condition and cluster view) and the
/// rollout goes on; the second failure halts the revision, and a third node waits.
#[test]
fn a_failure_below_the_budget_quarantines_and_the_one_at_it_halts() {
    let Some(cp) = control_plane::shared() else {
        return;
    };
    let origin = Env::new();
    let journal_path = origin.root.join("journal");
    let names = names("tph-", 3);
    let (kubelets, nodes) = workers(cp, &origin, &journal_path, &names, "tph", "halt_after = 2");
    // x is the first revision the two nodes apply, and it breaks both; their rollback (to
    // the fake system's first generation) heals them.
    let x = origin.repo.commit("hive.nix", "{ broken = true; }", "x");
    for n in &nodes[..2] {
        breaks_on(n, &x, true);
    }
    let daemons: Vec<Daemon> = nodes[..2].iter().map(|n| n.env.start()).collect();
    let ended: Vec<Value> = daemons
        .iter()
        .map(|d| {
            d.wait_status("x failed its gate and was rolled back", |s| {
                s["apply"]["state"] == "rolled-back"
                    && (s["rollout"]["phase"] == "quarantined" || !s["rollout"]["halt"].is_null())
            })
        })
        .collect();
    let quarantined: Vec<usize> = (0..2)
        .filter(|&i| ended[i]["rollout"]["phase"] == "quarantined")
        .collect();
    assert_eq!(quarantined.len(), 1, "{ended:#?}");
    let (q, h) = (quarantined[0], 1 - quarantined[0]);
    // The quarantined node: status, annotation, condition, cluster view.
    let s = &ended[q];
    assert_eq!(s["rollout"]["quarantined"]["revision"], x.as_str(), "{s:#}");
    let text = daemons[q].ctl_ok(&["status"]);
    assert!(
        text.contains(&format!("quarantine {}: its gate failed here", &x[..12])),
        "{text}"
    );
    wait_for("the quarantine on the Node", || {
        let n = cp.node(&names[q])?;
        let a = &n["metadata"]["annotations"];
        let condition = n["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == "GinxHealthy")?
            .clone();
        (a["ginx.io/quarantined"] == x.as_str()
            && a["ginx.io/rollout-phase"] == "quarantined"
            && condition["reason"] == "Quarantined")
            .then_some(())
    });
    // The rollout went on after the first failure: the other node started x after it, and
    // its failure, the second, halted x.
    let halt = &ended[h]["rollout"]["halt"];
    assert_eq!(halt["revision"], x.as_str(), "{:#}", ended[h]);
    assert_eq!(halt["node"], names[h].as_str(), "{:#}", ended[h]);
    let cm = cp
        .get_path("/api/v1/namespaces/ginx-system/configmaps/ginx-rollout")
        .unwrap();
    for n in &names[..2] {
        assert!(
            cm["data"].get(format!("failed.{x}.{n}")).is_some(),
            "{n}'s failure is not counted: {cm:#}"
        );
    }
    // A third node does not apply x: it is halted.
    let third = nodes[2].env.start();
    third.wait_status("the third node held back by the halt", |s| {
        s["rollout"]["waiting_for"] == "halted"
    });
    assert!(
        nodes[2]
            .env
            .calls()
            .iter()
            .all(|c| c.env.get("GINX_REVISION") != Some(&x)),
        "the third node applied the halted revision"
    );
    // ginxctl cluster counts the revision's nodes, the quarantined one among them.
    let view: Value = serde_json::from_str(&third.ctl_ok(&["cluster", "--json"])).unwrap();
    assert_eq!(view["revisions"][x.as_str()]["quarantined"], 1, "{view:#}");
    let text = third.ctl_ok(&["cluster"]);
    assert!(
        text.contains(&format!("quarantined: {} on", names[q])),
        "{text}"
    );
    drop(kubelets);
}
