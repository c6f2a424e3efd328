//! The fault suite's nemesis over a stacked etcd: three control-plane nodes, each guarding with
//! its own member of a real three-member etcd (tests/support/etcd.rs), roll revisions whose
//! plans drain (they restart containerd) through one slot. Each node's drain is held by a
//! PodDisruptionBudget until the nemesis has struck: it kills the etcd member of a node other
//! than the slot holder (SIGKILL), and either brings it back before the drain ends or only once
//! the holder was seen waiting on etcd.
//!
//! The disruption itself is a stand-in: restarting containerd restarts the kubelet's static
//! pods, etcd among them, so the harness kills the holder's member when its stand-in colmena
//! starts the activation (the journal's `start` line) and starts it again at its `end`. What is
//! judged is etcd's own view, every member's status polled every 100 ms: no sample taken while
//! a member was down for ginx's disruption may show etcd without a quorum.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;

use crate::etcd::guard;
use crate::reboot::{bind, pods, replicaset};
use crate::rollout::most_at_once;
use crate::support::control_plane::{self, ControlPlane};
use crate::support::etcd::EtcdCluster;
use crate::support::kubelet::Kubelet;
use crate::support::reboot::{Node, namespace, node};
use crate::support::{Env, wait_for};

/// No member is down for a disruption.
const NONE: usize = usize::MAX;

/// One poll of etcd: which members answered their status, and which member the harness had
/// down for ginx's disruption at that moment (if any).
#[derive(Clone, Debug)]
struct Sample {
    answered: Vec<bool>,
    disrupted: Option<usize>,
}

/// The checker: no sample taken while a member was down for ginx's disruption shows fewer
/// than a quorum of the members answering. Returns how many samples fell in a disruption.
fn check_quorum(samples: &[Sample]) -> usize {
    let mut during = 0;
    for (i, s) in samples.iter().enumerate() {
        let Some(d) = s.disrupted else { continue };
        during += 1;
        let up = s.answered.iter().filter(|a| **a).count();
        let quorum = s.answered.len() / 2 + 1;
        assert!(
            up >= quorum,
            "etcd lost its quorum while member {d} was down for ginx's disruption (sample {i}: \
             {up} of {} answered): {:?}",
            s.answered.len(),
            &samples[i.saturating_sub(5)..(i + 5).min(samples.len())]
        );
    }
    during
}

#[test]
fn check_quorum_catches_a_disruption_beside_a_dead_member() {
    let s = |answered: [bool; 3], disrupted: Option<usize>| Sample {
        answered: answered.to_vec(),
        disrupted,
    };
    let fine = [
        s([true, false, true], None),
        s([true, true, true], None),
        s([false, true, true], Some(0)),
        s([false, false, true], None),
    ];
    assert_eq!(check_quorum(&fine), 1);
    let bad = [
        s([true, false, true], None),
        s([false, false, true], Some(0)),
    ];
    assert!(std::panic::catch_unwind(|| check_quorum(&bad)).is_err());
}

/// Polls every member's status every 100 ms, each sample with the disruption the harness
/// has in progress, until the flag is set.
fn poll(
    etcd: Arc<EtcdCluster>,
    disrupted: Arc<AtomicUsize>,
) -> (Arc<AtomicBool>, Arc<Mutex<Vec<Sample>>>) {
    let stop = Arc::new(AtomicBool::new(false));
    let samples: Arc<Mutex<Vec<Sample>>> = Arc::default();
    let (s, out) = (Arc::clone(&stop), Arc::clone(&samples));
    std::thread::spawn(move || {
        while !s.load(Ordering::Relaxed) {
            // Read before the statuses: a disruption that began during the poll counts from
            // the next sample, one that ended counts in this one.
            let before = disrupted.load(Ordering::SeqCst);
            let answered = (0..etcd.members.len())
                .map(|i| etcd.status(i).is_some())
                .collect();
            let after = disrupted.load(Ordering::SeqCst);
            let d = if before != NONE { before } else { after };
            out.lock().unwrap().push(Sample {
                answered,
                disrupted: (d != NONE).then_some(d),
            });
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    (stop, samples)
}

/// The stand-in disruption: follows the journal, killing a node's member at its activation's
/// `start` line and starting it again at its `end`, and says which member is down for it.
fn disrupt(
    etcd: Arc<EtcdCluster>,
    journal: std::path::PathBuf,
    names: Vec<String>,
    disrupted: Arc<AtomicUsize>,
) -> Arc<AtomicBool> {
    let stop = Arc::new(AtomicBool::new(false));
    let s = Arc::clone(&stop);
    // What is in the journal already was before the harness took the disruptions on.
    let mut read = std::fs::read_to_string(&journal)
        .unwrap_or_default()
        .lines()
        .count();
    std::thread::spawn(move || {
        while !s.load(Ordering::Relaxed) {
            let text = std::fs::read_to_string(&journal).unwrap_or_default();
            for line in text.lines().skip(read) {
                read += 1;
                let mut w = line.split_whitespace();
                let (Some(what), Some(node)) = (w.next(), w.next()) else {
                    continue;
                };
                let Some(i) = names.iter().position(|n| n == node) else {
                    continue;
                };
                match what {
                    "start" => {
                        disrupted.store(i, Ordering::SeqCst);
                        etcd.kill(i);
                    }
                    "end" => {
                        etcd.start(i);
                        disrupted.store(NONE, Ordering::SeqCst);
                    }
                    _ => {}
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    });
    stop
}

/// What the nemesis does during one node's drain.
#[derive(Clone, Copy, Debug)]
enum Strike {
    /// Nothing.
    None,
    /// Another node's member killed, and started again only once the holder waits on etcd.
    Kill,
    /// Another node's member killed and started again before the drain ends.
    KillAndBack,
}

/// The pods of node `i` under a budget that allows no eviction: its drain waits.
fn block(cp: &ControlPlane, ns: &str, i: usize) {
    cp.apply(
        &json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": format!("web-{i}"), "namespace": ns},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": format!("web-{i}")}}}})
        .to_string(),
    );
}

/// Waits until member `i` answers and trails the others by a few entries at most.
fn caught_up(etcd: &EtcdCluster, i: usize) {
    let applied = |k: usize| {
        etcd.status(k)
            .map(|s| crate::etcd::number(&s["raftAppliedIndex"]))
    };
    wait_for("the member back and caught up", || {
        let own = applied(i)?;
        let top = (0..3).filter_map(applied).max()?;
        (top.saturating_sub(own) <= crate::etcd::MAX_LAG / 2).then_some(())
    });
}

/// Three control-plane nodes of group `group`, each guarding with its own member, each
/// revision built first and planned as a drain, each node with a pod its drain must evict.
fn fleet(
    cp: &'static ControlPlane,
    etcd: &EtcdCluster,
    origin: &Env,
    names: &[String],
    ns: &str,
) -> Vec<Node> {
    let journal = origin.root.join("journal");
    namespace(cp, ns);
    names
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let mut n = node(
                cp,
                &origin.repo.path,
                &journal,
                name,
                "control-plane",
                ns,
                ["quorum_guard = false", ""],
            );
            guard(&n, etcd, &etcd.members[i].client_url, "");
            n.env
                .dropin("90-prebuild.toml", "[apply]\nprebuild = true\n");
            n.env.stub(
                "dry_activate",
                "would stop the following units: containerd.service\n\
                 would start the following units: containerd.service\n",
            );
            n.env.stub("sleep", "1");
            n.start();
            n
        })
        .collect()
}

/// `rounds` revisions over three control-plane nodes; during each node's drain a strike drawn
/// from `seed` (printed). Returns what it did, one line a drain.
fn run_etcd_nemesis(rounds: usize, seed: u64) -> Vec<String> {
    println!("etcd nemesis: seed {seed} (NEMESIS_SEED), {rounds} rounds");
    let mut rng = fastrand::Rng::with_seed(seed);
    let Some(cp) = control_plane::shared() else {
        return Vec::new();
    };
    let group = "fe";
    let names: Vec<String> = ["lucy", "makise", "quinn"]
        .map(|n| format!("{group}-{n}"))
        .to_vec();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let bin = control_plane::binary().unwrap();
    let etcd = Arc::new(EtcdCluster::new(&bin, &refs));
    let _kubelets: Vec<Kubelet> = names
        .iter()
        .map(|n| Kubelet::start(cp, n, "control-plane"))
        .collect();
    let origin = Env::new();
    origin
        .repo
        .commit("group.nix", &format!("\"{group}\"\n"), group);
    let journal = origin.root.join("journal");
    let nodes = fleet(cp, &etcd, &origin, &names, group);
    for n in &nodes {
        n.d().wait_applied(&origin.repo.head());
        n.d().wait_status("the first slot given back", |s| {
            s["rollout"]["slot"].is_null()
        });
    }
    for (i, name) in names.iter().enumerate() {
        replicaset(cp, group, &format!("web-{i}"), &[name], &json!({}));
        block(cp, group, i);
    }
    let disrupted = Arc::new(AtomicUsize::new(NONE));
    let stop_disrupting = disrupt(
        Arc::clone(&etcd),
        journal.clone(),
        names.clone(),
        Arc::clone(&disrupted),
    );
    let (stop_polling, samples) = poll(Arc::clone(&etcd), Arc::clone(&disrupted));
    let lease = format!("ginx-rollout-{group}-0");
    let mut done = Vec::new();
    for round in 0..rounds {
        let r = origin
            .repo
            .commit("hive.nix", &format!("{{ round = {round}; }}"), "round");
        for n in &nodes {
            n.d().ctl_ok(&["sync"]);
        }
        let mut finished: Vec<usize> = Vec::new();
        while finished.len() < names.len() {
            let h = wait_for("the next node to hold the slot", || {
                let l = cp.lease("ginx-system", &lease)?;
                if l["metadata"]["annotations"]["ginx.io/revision"] != r.as_str() {
                    return None;
                }
                let holder = l["spec"]["holderIdentity"].as_str()?.to_owned();
                names
                    .iter()
                    .position(|n| *n == holder)
                    .filter(|i| !finished.contains(i))
            });
            let strike = match rng.u8(0..3) {
                0 => Strike::None,
                1 => Strike::Kill,
                _ => Strike::KillAndBack,
            };
            let victim = (h + 1 + rng.usize(0..2)) % 3;
            let line = drain_round(cp, &etcd, &nodes[h], (h, victim), strike, group, &r);
            println!("etcd nemesis: round {round}: {line}");
            done.push(line);
            finished.push(h);
        }
    }
    stop_disrupting.store(true, Ordering::Relaxed);
    stop_polling.store(true, Ordering::Relaxed);
    std::thread::sleep(Duration::from_millis(300));
    let samples = samples.lock().unwrap().clone();
    let during = check_quorum(&samples);
    println!(
        "etcd nemesis: {} samples of etcd's status, {during} taken during a disruption",
        samples.len()
    );
    assert!(
        during > 0,
        "no sample fell in a disruption: the check saw nothing"
    );
    // And the rollout's own promise: one node at a time in its activation or gate.
    let text = std::fs::read_to_string(&journal).unwrap();
    let pairs: Vec<(String, String)> = text
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let (what, node) = (w.next()?, w.next()?);
            matches!(what, "start" | "end" | "verify" | "baseline")
                .then(|| (what.to_owned(), node.to_owned()))
        })
        .collect();
    assert!(most_at_once(&pairs) <= 1, "{text}");
    cp.kubectl(&["delete", "namespace", group, "--wait=false"]);
    done
}

/// Node `h`'s drain of revision `r`, held by its budget while the nemesis strikes member
/// `victim`; then the budget lifted, and the node seen through its activation and gate. Its
/// evicted pod's replacement is bound back and its budget put back for the next round.
fn drain_round(
    cp: &ControlPlane,
    etcd: &EtcdCluster,
    n: &Node,
    (h, victim): (usize, usize),
    strike: Strike,
    ns: &str,
    r: &str,
) -> String {
    let mark = cp.audit_mark();
    let me = format!("system:node:{}", n.name);
    wait_for("the drain held by the budget", || {
        let refused = cp
            .audit_since(mark)
            .iter()
            .any(|e| e.subresource == "eviction" && e.code == 429 && e.user == me);
        let s = n.status()?;
        (refused || s["apply"]["drain"]["drained_at"].is_string()).then_some(())
    });
    let mut waited = false;
    match strike {
        Strike::None => {}
        Strike::Kill => etcd.kill(victim),
        Strike::KillAndBack => {
            etcd.kill(victim);
            etcd.start(victim);
            caught_up(etcd, victim);
        }
    }
    cp.kubectl(&[
        "delete",
        "poddisruptionbudget",
        &format!("web-{h}"),
        "-n",
        ns,
        "--wait=false",
    ]);
    if matches!(strike, Strike::Kill) {
        let s = n.d().wait_status("the holder waiting on etcd", |s| {
            s["rollout"]["waiting_for"] == "etcd"
        });
        let why = s["rollout"]["reason"].as_str().unwrap_or("");
        assert!(why.contains(&etcd.members[victim].name), "{why}");
        assert_ne!(
            s["apply"]["applied_revision"], r,
            "activated with a member down"
        );
        waited = true;
        etcd.start(victim);
    }
    n.d()
        .wait_status("the node through its activation and gate", |s| {
            s["apply"]["applied_revision"] == r && s["rollout"]["slot"].is_null()
        });
    let pending = wait_for("the evicted pod's replacement", || {
        pods(cp, ns, &format!("web-{h}"))
            .into_iter()
            .find(|p| p.2.is_empty())
    });
    bind(cp, ns, &pending.0, &n.name);
    block(cp, ns, h);
    format!(
        "{}'s drain: {strike:?} of {}{}",
        n.name,
        etcd.members[victim].name,
        if waited { ", waited on etcd" } else { "" }
    )
}

/// The nemesis's etcd fault: a member of a node other than the slot holder killed during its
/// drain. etcd's own view never shows a disruption by ginx while it has no quorum.
#[test]
fn a_randomised_nemesis_kills_etcd_members_during_drains() {
    let seed = std::env::var("NEMESIS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4_417_233_019_815_227_113);
    let rounds = std::env::var("NEMESIS_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2);
    let done = run_etcd_nemesis(rounds, seed);
    assert_eq!(done.len(), rounds * 3, "{done:#?}");
}
