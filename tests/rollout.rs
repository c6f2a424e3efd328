//! Coordinated rollouts across several real ginx daemons, one Git remote and the real control
//! plane (tests/support/control_plane.rs): the slot Leases, the health gate, the automatic
//! rollback and the cluster-wide halt, the quorum guard, the API being away, a holder killed.
//!
//! Each node is an [`Env`] of its own whose source points at one shared repository; the
//! stand-in colmena of every node appends `start`/`end` to one journal, and the gate command
//! appends `verify`, so the order in which nodes applied and verified is read from one file.
//! Group and node names are unique per test: the control plane is shared by every test.

use std::path::Path;

use serde_json::Value;

use crate::support::control_plane::{self, AuditEvent, ControlPlane};
use crate::support::daemon::Daemon;
use crate::support::kubelet::Kubelet;
use crate::support::test_fleet::{TestFleet, fetch_from, in_group, use_cluster};
use crate::support::{Env, wait_for};

/// A node of a test fleet.
pub(crate) struct Node {
    pub(crate) env: Env,
}

/// Makes a node `name` in rollout group `group`, fetching from `origin`'s repository, every
/// activation and gate step recorded in `journal`.
pub(crate) fn node(
    cp: &ControlPlane,
    origin: &Path,
    journal: &Path,
    name: &str,
    role: &str,
    group: &str,
    extra: &str,
) -> Node {
    let env = Env::new();
    fetch_from(&env, origin);
    use_cluster(&env, cp, name, "");
    in_group(name, role, group, journal)
        .merge("rollout", extra)
        .write(&env, "80-rollout.toml");
    env.stub("journal", &journal.display().to_string());
    env.stub("sleep", "0.5");
    Node { env }
}

/// The journal's lines as (what, node).
pub(crate) fn journal(path: &Path) -> Vec<(String, String)> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            Some((w.next()?.to_owned(), w.next()?.to_owned()))
        })
        .collect()
}

/// The most nodes that were between their `start` and their last `verify` (or `end`) before
/// their next `start` at once: applying or in their gate. A `baseline` line (the gate command
/// run before an activation, read-only, again each time the activation is put off) is in no
/// span.
pub(crate) fn most_at_once(lines: &[(String, String)]) -> usize {
    let mut own: std::collections::BTreeMap<&str, Vec<(usize, &str)>> = Default::default();
    for (i, (what, node)) in lines.iter().enumerate() {
        if what != "baseline" {
            own.entry(node).or_default().push((i, what));
        }
    }
    let mut all: Vec<(usize, usize)> = Vec::new();
    for entries in own.values() {
        let mut span: Option<(usize, usize)> = None;
        for &(i, what) in entries {
            if what == "start" {
                all.extend(span.take());
                span = Some((i, i));
            } else if let Some(s) = span.as_mut() {
                s.1 = i;
            }
        }
        all.extend(span);
    }
    (0..lines.len())
        .map(|i| all.iter().filter(|(a, b)| *a <= i && i <= *b).count())
        .max()
        .unwrap_or(0)
}

#[test]
fn most_at_once_counts_activations_and_gates_and_no_baseline() {
    let l = |v: &[(&str, &str)]| -> Vec<(String, String)> {
        v.iter()
            .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
            .collect()
    };
    // One at a time; a's baseline for its second activation is taken three times (put off
    // twice), the first while b is in its gate.
    let serial = l(&[
        ("baseline", "a"),
        ("start", "a"),
        ("end", "a"),
        ("verify", "a"),
        ("baseline", "b"),
        ("start", "b"),
        ("baseline", "a"),
        ("end", "b"),
        ("verify", "b"),
        ("baseline", "a"),
        ("baseline", "a"),
        ("start", "a"),
        ("end", "a"),
    ]);
    assert_eq!(most_at_once(&serial), 1);
    // b starts while a is still in its gate.
    let overlap = l(&[
        ("start", "a"),
        ("end", "a"),
        ("verify", "a"),
        ("baseline", "b"),
        ("start", "b"),
        ("verify", "a"),
        ("end", "b"),
    ]);
    assert_eq!(most_at_once(&overlap), 2);
}

/// The users that wrote the slot Lease `name`, in order, consecutive repeats folded.
pub(crate) fn writers(events: &[AuditEvent], name: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for e in events.iter().filter(|e| {
        e.resource == "leases"
            && e.name == name
            && matches!(e.verb.as_str(), "create" | "update")
            && e.code < 300
    }) {
        if out.last() != Some(&e.user) {
            out.push(e.user.clone());
        }
    }
    out
}

fn start_all(nodes: &[Node]) -> Vec<Daemon> {
    nodes.iter().map(|n| n.env.start()).collect()
}

#[test]
fn one_commit_rolls_through_three_control_plane_nodes_one_at_a_time() {
    let Some((cp, mut rbac, origin, _)) = TestFleet::open() else {
        return;
    };
    let journal_path = origin.root.join("journal");
    let names = ["ro3-lucy", "ro3-makise", "ro3-quinn"];
    let _kubelets: Vec<Kubelet> = names
        .iter()
        .map(|n| Kubelet::start(cp, n, "control-plane"))
        .collect();
    let nodes: Vec<Node> = names
        .iter()
        .map(|n| {
            rbac.watch(n);
            node(
                cp,
                &origin.repo.path,
                &journal_path,
                n,
                "control-plane",
                "ro3",
                "",
            )
        })
        .collect();
    let daemons = start_all(&nodes);
    let first = origin.repo.head();
    for d in &daemons {
        d.wait_applied(&first);
    }
    let second = origin
        .repo
        .commit("hive.nix", "{ second = true; }", "second");
    for d in &daemons {
        d.ctl_ok(&["sync"]);
    }
    for d in &daemons {
        d.wait_applied(&second);
    }
    let lines = journal(&journal_path);
    assert_eq!(
        lines.iter().filter(|(w, _)| w == "start").count(),
        6,
        "{lines:?}"
    );
    // With one slot, nobody else starts before the holder's gate passed. (Not "each node's
    // lines form one run": the node that applied the first revision last may take the slot
    // first for the second, and its two activations then follow each other.)
    assert_eq!(
        most_at_once(&lines),
        1,
        "two nodes applied or verified at once: {lines:?}"
    );
    // The Lease's history in the real audit log: one holder after the other, each one
    // writing (take, renew, release) without another's write in between. Six holds; the
    // node that held it last for the first revision may hold it first for the second, and
    // its two holds then fold into one run of writes: at least five runs.
    let w = writers(&rbac.requests(), "ginx-rollout-ro3-0");
    assert!(w.len() >= 5, "six holds, one after the other: {w:?}");
    for pair in w.windows(2) {
        assert_ne!(pair[0], pair[1]);
    }
    for d in &daemons {
        let s = d.wait_status("the slot released", |s| s["rollout"]["slot"].is_null());
        assert_eq!(s["rollout"]["lock"], "kubernetes");
        assert_eq!(s["rollout"]["group"], "ro3");
        assert_eq!(s["rollout"]["phase"], "succeeded");
    }
    let lease = cp.lease("ginx-system", "ginx-rollout-ro3-0").unwrap();
    assert!(lease["spec"]["holderIdentity"].is_null(), "{lease:#}");
    wait_for("the phase and target on the node", || {
        let n = cp.node("ro3-lucy")?;
        let a = &n["metadata"]["annotations"];
        (a["ginx.io/rollout-phase"] == "succeeded"
            && a["ginx.io/target-revision"] == second.as_str())
        .then_some(())
    });
}

#[test]
fn five_workers_never_more_than_two_at_once() {
    let Some((cp, mut rbac, origin, _)) = TestFleet::open() else {
        return;
    };
    let journal_path = origin.root.join("journal");
    let nodes: Vec<Node> = (1..=5)
        .map(|i| {
            let name = format!("ro5-w{i}");
            rbac.watch(&name);
            node(
                cp,
                &origin.repo.path,
                &journal_path,
                &name,
                "worker",
                "ro5",
                "max_concurrent = 2",
            )
        })
        .collect();
    let daemons = start_all(&nodes);
    let head = origin.repo.head();
    for d in &daemons {
        d.wait_applied(&head);
    }
    let lines = journal(&journal_path);
    assert_eq!(
        lines.iter().filter(|(w, _)| w == "start").count(),
        5,
        "{lines:?}"
    );
    let most = most_at_once(&lines);
    assert!(most <= 2, "{most} at once: {lines:?}");
    drop(daemons);
}

/// A group of more than 4 slots is a queue (agent/src/rollout/lock/lease.rs): a node that finds
/// every slot held says on its heartbeat which slot it queues on, and a release hands the slot
/// to queued nodes by name. Seven workers, five slots, activations long enough that two
/// nodes queue: from the audit log, every node a release named (one or two) had queued on its
/// heartbeat before, named nodes took the slots handed to them, and when all is done no
/// heartbeat is queued.
#[test]
fn a_release_in_a_large_group_hands_the_slot_to_a_queued_node() {
    let Some((cp, mut rbac, origin, _)) = TestFleet::open() else {
        return;
    };
    let journal_path = origin.root.join("journal");
    let names: Vec<String> = (1..=7).map(|i| format!("rq7-w{i}")).collect();
    let nodes: Vec<Node> = names
        .iter()
        .map(|name| {
            rbac.watch(name);
            let n = node(
                cp,
                &origin.repo.path,
                &journal_path,
                name,
                "worker",
                "rq7",
                "max_concurrent = 5",
            );
            // Held long enough that the last two find all five slots held.
            n.env.stub("sleep", "6");
            n
        })
        .collect();
    let mark = cp.audit_mark();
    let daemons = start_all(&nodes);
    let head = origin.repo.head();
    for d in &daemons {
        d.wait_applied(&head);
    }
    let lines = journal(&journal_path);
    let most = most_at_once(&lines);
    assert!(most <= 5, "{most} at once: {lines:?}");

    let events = cp.audit_since(mark);
    let writes: Vec<&AuditEvent> = events
        .iter()
        .filter(|e| {
            e.resource == "leases"
                && e.namespace == "ginx-system"
                && matches!(e.verb.as_str(), "create" | "update")
                && e.code < 300
        })
        .collect();
    // In the order the API server received them: a release is sent after the list that read
    // the queue marks came back, so it was received after every mark it read. Neither the
    // audit log's order nor the completion stamps promise that (seen under load: a queue mark
    // logged, and stamped, after the release that had read it).
    let mut writes = writes;
    writes.sort_by(|a, b| a.received.cmp(&b.received));
    let label = |e: &AuditEvent, k: &str| {
        e.request["metadata"]["labels"][k]
            .as_str()
            .map(str::to_owned)
    };
    // (heartbeat writer, slot Lease it queued on), in order; and the slot hand-offs.
    let mut queued: std::collections::BTreeSet<String> = Default::default();
    let mut named: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    let (mut handed, mut to_named) = (0, 0);
    for e in &writes {
        let user = e.user.trim_start_matches("ginx:").to_owned();
        if e.name.starts_with("ginx-rollout-rq7-") {
            let holder = e.request["spec"]["holderIdentity"].as_str().unwrap_or("");
            let next = e.request["metadata"]["annotations"]["ginx.io/next"].as_str();
            if holder.is_empty() {
                if let Some(next) = next {
                    handed += 1;
                    let next: Vec<String> = next.split(' ').map(str::to_owned).collect();
                    assert!(
                        (1..=2).contains(&next.len()),
                        "a release names one or two nodes: {next:?}"
                    );
                    for n in &next {
                        assert!(
                            queued.contains(n),
                            "{user} handed {} to {n}, which had not queued: {queued:?}",
                            e.name
                        );
                        let l = e.request["metadata"]["labels"]
                            .as_object()
                            .map(|m| m.keys().filter(|k| k.starts_with("ginx.io/next-")).count());
                        assert_eq!(l, Some(next.len()), "one label per node named");
                    }
                    named.insert(e.name.clone(), next);
                }
            } else if holder == user
                && let Some(next) = named.remove(&e.name)
                && next.contains(&user)
            {
                to_named += 1;
            }
        } else if names.iter().any(|n| e.name == format!("ginx-{n}")) {
            // Once queued counts: a node may stop queuing (it took another slot) between the
            // releaser's list and its release, and that is no fault of the release.
            if let Some(slot) = label(e, "ginx.io/waits-slot") {
                assert!(slot.starts_with("ginx-rollout-rq7-"), "{slot}");
                assert_eq!(label(e, "ginx.io/waits-group").as_deref(), Some("rq7"));
                queued.insert(user);
            }
        }
    }
    assert!(handed >= 1, "no release named a queued node: {lines:?}");
    assert!(
        to_named >= 1,
        "no named node took the slot handed to it ({handed} handed)"
    );
    for n in &names {
        let hb = cp.lease("ginx-system", &format!("ginx-{n}")).unwrap();
        let labels = &hb["metadata"]["labels"];
        assert!(
            labels.get("ginx.io/waits-slot").is_none()
                && labels.get("ginx.io/waits-group").is_none(),
            "{n} still queued when done: {labels}"
        );
    }
    drop(daemons);
}

/// Makes `n` break when `revision` is activated: its gate command fails while the fake
/// system's current revision is `revision`. `heals` says whether the rollback restores a system
/// the gate accepts (the stand-in switch marks the running system as the previous one) or not.
pub(crate) fn breaks_on(n: &Node, revision: &str, heals: bool) {
    let nix = n.env.fake_nix();
    let current = nix.join("run/current-system/revision");
    let switch = if heals {
        format!(
            "[\"sh\", \"-c\", \"echo previous > {}\"]",
            current.display()
        )
    } else {
        "[\"true\"]".to_owned()
    };
    n.env.dropin(
        "85-gate.toml",
        &format!(
            "[system]\nrollback_command = [\"true\"]\nswitch_command = {switch}\n\n\
             [rollout.gate]\nsettle = \"1s\"\ntimeout = \"4s\"\n\
             command = [\"sh\", \"-c\", \"test \\\"$(cat {c} 2>/dev/null)\\\" != {revision}\"]\n",
            c = current.display()
        ),
    );
}

#[test]
fn a_failed_gate_rolls_back_halts_the_revision_and_a_later_one_rolls_out() {
    let Some((cp, mut rbac, origin, _)) = TestFleet::open() else {
        return;
    };
    let journal_path = origin.root.join("journal");
    let a = node(
        cp,
        &origin.repo.path,
        &journal_path,
        "rog-a",
        "worker",
        "rog",
        "",
    );
    let b = node(
        cp,
        &origin.repo.path,
        &journal_path,
        "rog-b",
        "worker",
        "rog",
        "",
    );
    rbac.watch("rog-a");
    rbac.watch("rog-b");
    let kubelet = Kubelet::start(cp, "rog-a", "worker");
    // A system generation to roll back to.
    a.env.fake_nix();
    a.env.dropin(
        "85-gate.toml",
        "[system]\nrollback_command = [\"true\"]\nswitch_command = [\"true\"]\n\n\
         [rollout.gate]\nsettle = \"1s\"\ntimeout = \"4s\"\n\n\
         [metrics]\nlisten = \"127.0.0.1:0\"\n",
    );
    let x = origin.repo.commit("hive.nix", "{ broken = true; }", "x");
    let da = a.env.start();
    // Revision X breaks a's kubelet: its node goes NotReady when X is activated, and is Ready
    // again once the rolled-back system is up. The node-ready probe is what the gate sees.
    let s = std::thread::scope(|scope| {
        scope.spawn(|| {
            // X is the first revision a applies: its first `start` is X's activation.
            wait_for("x activated on a", || {
                journal(&journal_path)
                    .iter()
                    .any(|(w, n)| w == "start" && n == "rog-a")
                    .then_some(())
            });
            kubelet.set_ready(false);
        });
        da.wait_status("the rolled-back system's gate", |s| {
            s["rollout"]["gate"]["rollback"] == true
        });
        kubelet.set_ready(true);
        da.wait_status("x rolled back", |s| s["rollout"]["phase"] == "rolled-back")
    });
    assert_eq!(s["apply"]["state"], "rolled-back");
    assert_eq!(s["rollout"]["halt"]["revision"], x.as_str(), "{s:#}");
    let cm = wait_for("the halt in ginx-rollout", || {
        let cm = cp.get_path("/api/v1/namespaces/ginx-system/configmaps/ginx-rollout")?;
        cm["data"].get(format!("halted.{x}"))?;
        Some(cm)
    });
    let halt: Value =
        serde_json::from_str(cm["data"][format!("halted.{x}")].as_str().unwrap()).unwrap();
    assert_eq!(halt["node"], "rog-a");
    assert!(halt["probes"]["node-ready"].is_string(), "{halt:#}");
    wait_for("the rolled-back phase on the node", || {
        let n = cp.node("rog-a")?;
        (n["metadata"]["annotations"]["ginx.io/rollout-phase"] == "rolled-back").then_some(())
    });
    let addr = s["metrics_listen"].as_str().unwrap().to_owned();
    let metrics = crate::kubernetes::scrape(&addr);
    for line in [
        "ginx_rollout_gates_total{result=\"failed\"} 1",
        "ginx_rollout_gates_total{result=\"rollback-passed\"} 1",
        "ginx_rollout_rollbacks_total 1",
        "ginx_rollout_halts_total 1",
        "ginx_rollout_lock_held 0",
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line} in\n{metrics}");
    }
    // b never applies X: it waits, saying why.
    let db = b.env.start();
    let s = db.wait_status("b held back by the halt", |s| {
        s["rollout"]["waiting_for"] == "halted"
    });
    assert!(
        s["apply"]["reason"].as_str().unwrap().contains("halted"),
        "{s:#}"
    );
    assert!(
        b.env
            .calls()
            .iter()
            .all(|c| c.env.get("GINX_REVISION") != Some(&x)),
        "b applied the halted revision"
    );
    // A later commit rolls out everywhere.
    let y = origin.repo.commit("hive.nix", "{ fixed = true; }", "y");
    da.ctl_ok(&["sync"]);
    db.ctl_ok(&["sync"]);
    da.wait_applied(&y);
    db.wait_applied(&y);
    // a's gate command is its own (it writes no journal lines): its activations and b's
    // never overlap.
    let starts_ends: Vec<String> = journal(&journal_path)
        .into_iter()
        .map(|(w, _)| w)
        .filter(|w| w == "start" || w == "end")
        .collect();
    assert!(
        starts_ends.chunks(2).all(|c| c == ["start", "end"]),
        "{starts_ends:?}"
    );
}

#[test]
fn an_unhealthy_rolled_back_system_keeps_the_slot() {
    let Some((cp, mut rbac, origin, _)) = TestFleet::open() else {
        return;
    };
    let journal_path = origin.root.join("journal");
    let a = node(
        cp,
        &origin.repo.path,
        &journal_path,
        "rou-a",
        "worker",
        "rou",
        "",
    );
    let b = node(
        cp,
        &origin.repo.path,
        &journal_path,
        "rou-b",
        "worker",
        "rou",
        "",
    );
    rbac.watch("rou-a");
    rbac.watch("rou-b");
    let _kubelet = Kubelet::start(cp, "rou-a", "worker");
    let x = origin.repo.commit("hive.nix", "{ broken = true; }", "x");
    breaks_on(&a, &x, false);
    let da = a.env.start();
    let s = da.wait_status("rollback unhealthy", |s| {
        s["rollout"]["phase"] == "rollback-unhealthy"
    });
    assert_eq!(s["rollout"]["slot"], 0, "{s:#}");
    assert_eq!(s["apply"]["state"], "failed", "{s:#}");
    assert!(
        s["apply"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("unhealthy too")),
        "{s:#}"
    );
    let lease = cp.lease("ginx-system", "ginx-rollout-rou-0").unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], "rou-a");
    let cond = wait_for("RollbackUnhealthy on the node", || {
        let n = cp.node("rou-a")?;
        let c = n["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == "GinxHealthy")?
            .clone();
        (c["reason"] == "RollbackUnhealthy").then_some(c)
    });
    assert_eq!(cond["status"], "False");
    // b has the old revision to apply (it never ran) and must wait for the slot.
    let db = b.env.start();
    let s = db.wait_status("b waiting", |s| s["apply"]["state"] == "waiting");
    assert!(
        matches!(
            s["rollout"]["waiting_for"].as_str(),
            Some("lock" | "halted")
        ),
        "{s:#}"
    );
    assert!(b.env.calls().is_empty(), "no other node proceeds");
}

#[test]
fn with_the_api_away_nothing_is_applied_and_before_the_cluster_no_lock_is_taken() {
    let Some(_cp) = control_plane::shared() else {
        return;
    };
    // A kubeconfig whose server does not answer: the cluster exists, its API is away.
    let env = Env::new();
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let kc = env.root.join("kubeconfig");
    std::fs::write(
        &kc,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:{port}\n    insecure-skip-tls-verify: true\nusers:\n- name: u\n  user:\n    token: t\ncontexts:\n- name: c\n  context: {{cluster: c, user: u}}\ncurrent-context: c\n"
        ),
    )
    .unwrap();
    crate::kubernetes::kube_dropin(&env, &kc, "request_timeout = \"1s\"");
    env.dropin("80-rollout.toml", "[rollout]\nlock = \"auto\"\n");
    let d = env.start();
    let s = d.wait_status("waiting for the API", |s| {
        s["rollout"]["waiting_for"] == "api"
    });
    assert_eq!(s["apply"]["state"], "waiting");
    assert!(
        env.calls().is_empty(),
        "nothing applied while the API is away"
    );
    drop(d);

    // Before the kubeconfig exists (a fresh node, before kubeadm init): applied, no lock.
    let fresh = Env::new();
    crate::kubernetes::kube_dropin(&fresh, &fresh.root.join("not-yet/kubeconfig"), "");
    fresh.dropin("80-rollout.toml", "[rollout]\nlock = \"auto\"\n");
    let d = fresh.start();
    let s = d.wait_applied(&fresh.repo.head());
    assert_eq!(s["rollout"]["lock"], "none");
    assert!(
        d.log()
            .contains("applying without the rollout lock (bootstrap)")
    );
}

#[test]
fn the_quorum_guard_holds_a_control_plane_node_while_another_is_not_ready() {
    let Some((cp, mut rbac, origin, _)) = TestFleet::open() else {
        return;
    };
    let journal_path = origin.root.join("journal");
    let lucy = node(
        cp,
        &origin.repo.path,
        &journal_path,
        "roq-lucy",
        "control-plane",
        "roq",
        "",
    );
    let makise = node(
        cp,
        &origin.repo.path,
        &journal_path,
        "roq-makise",
        "control-plane",
        "roq",
        "",
    );
    rbac.watch("roq-lucy");
    rbac.watch("roq-makise");
    let _kl = Kubelet::start(cp, "roq-lucy", "control-plane");
    let km = Kubelet::start(cp, "roq-makise", "control-plane");
    // makise runs ginx (reporting its group), applies what there is (lucy has no ginx yet,
    // so without the guard), then goes NotReady.
    makise
        .env
        .dropin("90-noguard.toml", "[rollout]\nquorum_guard = false\n");
    let dm = makise.env.start();
    dm.wait_applied(&origin.repo.head());
    km.set_ready(false);
    wait_for("makise NotReady", || {
        let n = cp.node("roq-makise")?;
        n["status"]["conditions"]
            .as_array()?
            .iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "False")
            .then_some(())
    });
    let dl = lucy.env.start();
    let s = dl.wait_status("lucy held by the quorum guard", |s| {
        s["rollout"]["waiting_for"] == "quorum"
    });
    assert!(
        s["rollout"]["reason"]
            .as_str()
            .unwrap()
            .contains("roq-makise is not Ready"),
        "{s:#}"
    );
    assert!(lucy.env.calls().is_empty());
    km.set_ready(true);
    dl.wait_applied(&origin.repo.head());
}

#[test]
fn a_killed_holder_s_slot_expires_and_it_never_takes_a_second() {
    let Some((cp, mut rbac, origin, _)) = TestFleet::open() else {
        return;
    };
    let journal_path = origin.root.join("journal");
    let a = node(
        cp,
        &origin.repo.path,
        &journal_path,
        "rok-a",
        "worker",
        "rok",
        "max_concurrent = 2",
    );
    let b = node(
        cp,
        &origin.repo.path,
        &journal_path,
        "rok-b",
        "worker",
        "rok",
        "max_concurrent = 2",
    );
    rbac.watch("rok-a");
    rbac.watch("rok-b");
    // a's apply hangs while it holds its slot; it is SIGKILLed and restarted at once.
    let gate = a.env.root.join("go");
    a.env.stub("wait_for", &gate.display().to_string());
    // Which of the two slots a holds: a free one is taken at random.
    let held_by_a = || {
        (0..2).find(|i| {
            cp.lease("ginx-system", &format!("ginx-rollout-rok-{i}"))
                .is_some_and(|l| l["spec"]["holderIdentity"] == "rok-a")
        })
    };
    let da = a.env.start();
    let first = wait_for("a holding a slot", held_by_a);
    da.crash();
    let da = a.env.start();
    std::fs::write(&gate, "").unwrap();
    da.wait_applied(&origin.repo.head());
    // Its gate over and its slot given back: stopped before, it would keep it for a resume.
    da.wait_status("a's slot given back", |s| s["rollout"]["slot"].is_null());
    // It resumed its slot: the other one was never held by it.
    assert!(
        cp.lease("ginx-system", &format!("ginx-rollout-rok-{}", 1 - first))
            .is_none_or(|l| l["spec"]["holderIdentity"] != "rok-a"),
        "a took a second slot"
    );
    drop(da);

    // Killed for good while holding: the slot expires, the next node takes it over, and the
    // revision the dead holder was applying is halted (holder-vanished), never applied by it;
    // a later revision proceeds.
    let x = origin.repo.commit("hive.nix", "{ x = true; }", "x");
    let _ = std::fs::remove_file(&gate);
    // One slot from here on, so that b can only have a's slot once it expired.
    a.env
        .dropin("81-one.toml", "[rollout]\nmax_concurrent = 1\n");
    let da = a.env.start();
    da.ctl_ok(&["sync"]);
    wait_for("a holding a slot for x", held_by_a);
    da.crash();
    let b_cfg = "max_concurrent = 1";
    b.env
        .dropin("81-one.toml", &format!("[rollout]\n{b_cfg}\n"));
    let db = b.env.start();
    let s = db.wait_status("b held back by the vanished holder's halt", |s| {
        s["rollout"]["waiting_for"] == "halted"
    });
    assert_eq!(s["rollout"]["halt"]["cause"], "holder-vanished", "{s:#}");
    assert_eq!(s["rollout"]["halt"]["node"], "rok-a", "{s:#}");
    assert!(
        b.env
            .calls()
            .iter()
            .all(|c| c.env.get("GINX_REVISION") != Some(&x)),
        "b applied the vanished holder's revision"
    );
    // The group waits for the vanished holder until an operator clears its halt.
    let y = origin.repo.commit("hive.nix", "{ y = true; }", "y");
    db.ctl_ok(&["sync"]);
    db.wait_status("b waiting for the vanished holder", |s| {
        s["apply"]["revision"] == y.as_str() && s["rollout"]["waiting_for"] == "halted"
    });
    b.env
        .operator_ok(&cp.admin_kubeconfig, &["rollout", "clear", &x]);
    db.wait_applied(&y);
    let _ = std::fs::write(&gate, "");
}

/// The lock's watches are not cut by `kubernetes.request_timeout`: a quiet watch stays open
/// (its own client's read timeout outlasts the watch request), so an idle node neither lists
/// nor watches again every few seconds.
#[test]
fn a_quiet_watch_outlasts_the_request_timeout() {
    let Some((cp, mut rbac, origin, _)) = TestFleet::open() else {
        return;
    };
    let journal_path = origin.root.join("journal");
    let n = node(
        cp,
        &origin.repo.path,
        &journal_path,
        "row-quiet",
        "worker",
        "row",
        "",
    );
    n.env.dropin(
        "90-timeout.toml",
        "[kubernetes]\nrequest_timeout = \"1s\"\n",
    );
    rbac.watch("row-quiet");
    let _kubelet = Kubelet::start(cp, "row-quiet", "worker");
    let d = n.env.start();
    d.wait_applied(&origin.repo.head());
    let mark = cp.audit_mark();
    // Five request timeouts of quiet: 25 heartbeats of the daemon's work.
    cp.wait_renewals("row-quiet", mark, 25);
    let again: Vec<String> = cp
        .audit_since(mark)
        .into_iter()
        .filter(|e| {
            e.user == "ginx:row-quiet"
                && matches!(e.verb.as_str(), "list" | "watch")
                && matches!(e.resource.as_str(), "leases" | "configmaps")
        })
        .map(|e| format!("{} {} {}", e.verb, e.resource, e.time))
        .collect();
    assert!(again.is_empty(), "watches made again while idle: {again:?}");
}

/// A maintenance window that opens a few seconds after the start. Nothing starts
/// before it (`waiting_for: window`, status says when it opens), the apply starts in it, runs on
/// past its end, and the next revision waits for the next window. The window is one minute,
/// the shortest there is (every duration has a floor), so the apply takes a little longer.
#[test]
fn a_window_gates_the_start_of_an_apply_and_never_cuts_one_off() {
    let env = Env::new();
    let opens = jiff::Timestamp::now()
        .checked_add(jiff::SignedDuration::from_secs(8))
        .unwrap()
        .round(jiff::Unit::Second)
        .unwrap();
    let local = opens.to_zoned(jiff::tz::TimeZone::UTC);
    let day = match local.weekday() {
        jiff::civil::Weekday::Monday => "mon",
        jiff::civil::Weekday::Tuesday => "tue",
        jiff::civil::Weekday::Wednesday => "wed",
        jiff::civil::Weekday::Thursday => "thu",
        jiff::civil::Weekday::Friday => "fri",
        jiff::civil::Weekday::Saturday => "sat",
        jiff::civil::Weekday::Sunday => "sun",
    };
    let start = local.strftime("%H:%M:%S").to_string();
    env.dropin(
        "80-window.toml",
        &format!("[[rollout.windows]]\ndays = [\"{day}\"]\nstart = \"{start}\"\nlength = \"1m\"\n"),
    );
    // An apply that outlasts the window.
    env.stub("sleep", "62");
    let d = env.start();
    let s = d.wait_status("waiting for the window", |s| {
        s["rollout"]["waiting_for"] == "window"
    });
    assert_eq!(s["apply"]["state"], "waiting", "{s:#}");
    assert_eq!(s["rollout"]["window"]["open"], false, "{s:#}");
    let opens_at: jiff::Timestamp = s["rollout"]["window"]["opens_at"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(opens_at, opens, "{s:#}");
    assert!(
        s["apply"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("maintenance windows")),
        "{s:#}"
    );
    assert!(env.calls().is_empty(), "nothing before the window opens");

    let s = d.wait_applied(&env.repo.head());
    let history: Value = serde_json::from_str(&d.ctl_ok(&["history", "--json"])).unwrap();
    let attempt = &history["attempts"][0];
    let started: jiff::Timestamp = attempt["started_at"].as_str().unwrap().parse().unwrap();
    let finished: jiff::Timestamp = attempt["finished_at"].as_str().unwrap().parse().unwrap();
    let closes = opens
        .checked_add(jiff::SignedDuration::from_secs(60))
        .unwrap();
    assert!(
        started >= opens && started < closes,
        "started {started}: {s:#}"
    );
    assert!(
        finished > closes,
        "the apply ran past the window's end: {s:#}"
    );
    assert_eq!(attempt["outcome"], "succeeded", "{history:#}");

    // The window is over: a new revision waits for next week's.
    let next = env.repo.commit("b.nix", "{ }\n", "after the window");
    d.ctl_ok(&["sync"]);
    let s = d.wait_status("the next revision to wait", |s| {
        s["sources"]["hephaestus"]["revision"] == next.as_str()
            && s["rollout"]["waiting_for"] == "window"
    });
    let next_opens: jiff::Timestamp = s["rollout"]["window"]["opens_at"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(
        next_opens,
        opens
            .checked_add(jiff::SignedDuration::from_hours(7 * 24))
            .unwrap()
    );
    assert_eq!(env.calls().len(), 1);
}
