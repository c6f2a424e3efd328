//! The last look: the guards asked again right before the disruption, against a real
//! three-member etcd (tests/support/etcd.rs) and the real control plane. A control-plane node
//! whose drain a PodDisruptionBudget holds up has another node's etcd member killed under it;
//! what must never happen (two members down at once) is judged from etcd's own view, its
//! members' status polled every 100 ms, and what ginx did from the API server's audit log and
//! its status.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use serde_json::{Value, json};

use crate::etcd::{MAX_LAG, Sample, guard, number, poll};
use crate::reboot::{bind, pods, replicaset, unschedulable};
use crate::support::control_plane::{self, ControlPlane, RbacGuard};
use crate::support::etcd::EtcdCluster;
use crate::support::kubelet::Kubelet;
use crate::support::prometheus::{Exporter, Prometheus};
use crate::support::reboot::{Node, namespace, node, tend_until};
use crate::support::{Env, wait_for};

/// One node (`<prefix>-lucy`, guarding with member 0) of a three-member etcd, a pod of it
/// under a budget its drain has to wait for.
struct Rig {
    cp: &'static ControlPlane,
    etcd: Arc<EtcdCluster>,
    names: Vec<String>,
    node: Node,
    origin: Env,
    ns: String,
    _kubelet: Kubelet,
}

/// `extra` goes into `[reboot]`; `live` has each revision built first and its plan restart
/// nginx (live) until the test says otherwise.
fn rig(cp: &'static ControlPlane, prefix: &str, extra: &str, live: bool) -> Rig {
    rig_with(cp, prefix, extra, live, "", "quorum_guard = false")
}

/// [`rig`] with `toml` added to the node's configuration and `rollout` to its `[rollout]`.
fn rig_with(
    cp: &'static ControlPlane,
    prefix: &str,
    extra: &str,
    live: bool,
    toml: &str,
    rollout: &str,
) -> Rig {
    let names: Vec<String> = ["lucy", "makise", "quinn"]
        .map(|n| format!("{prefix}-{n}"))
        .to_vec();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let bin = control_plane::binary().unwrap();
    let etcd = Arc::new(EtcdCluster::new(&bin, &refs));
    let kubelet = Kubelet::start(cp, &names[0], "control-plane");
    let origin = Env::new();
    let journal = origin.root.join("journal");
    let mut n = node(
        cp,
        &origin.repo.path,
        &journal,
        &names[0],
        "control-plane",
        prefix,
        [rollout, extra],
    );
    guard(&n, &etcd, &etcd.members[0].client_url, "");
    if !toml.is_empty() {
        n.env.dropin("88-extra.toml", toml);
    }
    if live {
        n.env
            .dropin("90-prebuild.toml", "[apply]\nprebuild = true\n");
        n.env.stub(
            "dry_activate",
            "would restart the following units: nginx.service\n",
        );
    }
    n.down_for = Duration::from_secs(2);
    n.slot_lease = Some((cp, format!("ginx-rollout-{prefix}-0")));
    n.start();
    n.d().wait_applied(&origin.repo.head());
    n.d().wait_status("the first slot given back", |s| {
        s["rollout"]["slot"].is_null()
    });
    let ns = prefix.to_owned();
    namespace(cp, &ns);
    replicaset(cp, &ns, "web", &[&names[0]], &json!({}));
    Rig {
        cp,
        etcd,
        names,
        node: n,
        origin,
        ns,
        _kubelet: kubelet,
    }
}

impl Rig {
    /// A budget that allows no eviction of the node's pod: its drain waits.
    fn block(&self) {
        self.cp.apply(
            &json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                "metadata": {"name": "web", "namespace": self.ns},
                "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}}})
            .to_string(),
        );
        wait_for("the budget to allow no disruption", || {
            let b = self.cp.get_path(&format!(
                "/apis/policy/v1/namespaces/{}/poddisruptionbudgets/web",
                self.ns
            ))?;
            (b["status"]["expectedPods"] == 1 && b["status"]["disruptionsAllowed"] == 0)
                .then_some(())
        });
    }

    /// The budget gone: the drain goes on.
    fn unblock(&self) {
        self.cp.kubectl(&[
            "delete",
            "poddisruptionbudget",
            "web",
            "-n",
            &self.ns,
            "--wait=false",
        ]);
    }

    /// The evicted pod's replacement bound to the node again (there is no scheduler), Ready.
    fn rebind(&self) {
        let pending = wait_for("the evicted pod's replacement", || {
            pods(self.cp, &self.ns, "web")
                .into_iter()
                .find(|p| p.2.is_empty())
        });
        bind(self.cp, &self.ns, &pending.0, &self.names[0]);
        wait_for("the replacement Ready", || {
            pods(self.cp, &self.ns, "web")
                .iter()
                .all(|p| p.3)
                .then_some(())
        });
    }

    /// The node's rebooting: its etcd member goes down with it (SIGKILL, as in a reboot that
    /// gives etcd no time to hand its leadership over) and comes back when ginx does.
    fn tend_until(&mut self, what: &str, done: impl Fn(&Node) -> bool) {
        let etcd = Arc::clone(&self.etcd);
        tend_until(std::slice::from_mut(&mut self.node), what, |ns| {
            let n = &ns[0];
            if n.down.is_some() && etcd.running(0) {
                etcd.kill(0);
            } else if n.down.is_none() && !etcd.running(0) {
                etcd.start(0);
            }
            done(n)
        });
    }

    /// Waits until member `i` answers and trails the others by at most `MAX_LAG`.
    fn caught_up(&self, i: usize) {
        wait_for("the member back and caught up", || {
            let own = number(&self.etcd.status(i)?["raftAppliedIndex"]);
            let top = (0..3)
                .filter_map(|k| self.etcd.status(k))
                .map(|s| number(&s["raftAppliedIndex"]))
                .max()?;
            (top.saturating_sub(own) <= MAX_LAG / 2).then_some(())
        });
    }

    /// Every line ginx logged, over every start of it.
    fn logs(&self) -> String {
        let mut files: Vec<_> = std::fs::read_dir(&self.node.env.root)
            .unwrap()
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.file_name()
                    .and_then(|f| f.to_str())
                    .is_some_and(|f| f.starts_with("ginx-") && f.ends_with(".log"))
            })
            .collect();
        files.sort();
        files
            .iter()
            .map(|f| std::fs::read_to_string(f).unwrap_or_default())
            .collect()
    }

    /// How often etcd's leadership was handed over before a disruption.
    fn hand_overs(&self) -> usize {
        self.logs()
            .matches("etcd's leadership handed over before the disruption")
            .count()
    }
}

/// The node's reboot, as its status shows it.
fn reboot(n: &Node) -> Value {
    n.status()
        .map(|s| s["rollout"]["reboot"].clone())
        .unwrap_or(Value::Null)
}

/// Asserts from etcd's polled view that lucy's member (0) was never down while another was.
fn never_two_down(samples: &[Sample], what: &str) {
    let both = samples
        .iter()
        .position(|s| s[0].is_none() && s.iter().skip(1).any(Option::is_none));
    assert!(
        both.is_none(),
        "{what}: lucy's member went down while another was down (sample {both:?} of {})",
        samples.len()
    );
}

/// A reboot's drain held by a budget, under three faults in turn. A member killed and back
/// during the drain costs no wait at the last look. A member killed during the drain keeps
/// the drained node from rebooting while it is down, the reboot waiting on etcd and naming
/// it, with its slot and cordon kept; once it is back the node reboots after one hand-over
/// of the leadership it held. Two members killed: the last look says etcd has no quorum and
/// names the member that answers; the node reboots once they are back. etcd's own view never
/// shows the node's member down beside another.
#[test]
fn a_member_killed_during_a_reboot_drain_holds_the_reboot_until_it_is_back() {
    let Some(cp) = control_plane::shared() else {
        return;
    };
    let mut r = rig(cp, "lk", "", false);
    let (stop, samples) = poll(Arc::clone(&r.etcd));
    let refused = |n: &Node| {
        reboot(n)["refused"]
            .as_object()
            .is_some_and(|m| !m.is_empty())
    };

    // Killed and back while the pod is held: no wait at the last look.
    r.block();
    r.node.require_reboot();
    wait_for("the drain held by the budget", || {
        refused(&r.node).then_some(())
    });
    r.etcd.kill(1);
    r.etcd.start(1);
    r.caught_up(1);
    let from = r.logs().len();
    r.unblock();
    r.tend_until("the first reboot done", |n| {
        n.boots == 1 && n.status().is_some_and(|s| s["rollout"]["slot"].is_null())
    });
    let after = r.logs()[from..].to_owned();
    assert!(
        !after
            .lines()
            .any(|l| l.contains("reboot required; waiting") && l.contains("etcd")),
        "a member back before the last look cost a wait:\n{after}"
    );
    r.rebind();

    // Killed during the drain, and still down at the last look.
    r.etcd.move_leader(0);
    let moved_before = r.hand_overs();
    r.block();
    r.node.require_reboot();
    wait_for("the drain held by the budget", || {
        refused(&r.node).then_some(())
    });
    r.etcd.kill(1);
    r.unblock();
    let held = wait_for("the reboot held at the last look", || {
        let b = reboot(&r.node);
        (b["waiting_for"] == "etcd").then(|| b["reason"].as_str().unwrap_or("").to_owned())
    });
    assert!(held.contains(&r.names[1]), "{held}");
    let s = r.node.status().unwrap();
    assert!(!s["rollout"]["slot"].is_null(), "the slot is kept: {s:#}");
    assert_eq!(s["rollout"]["reboot"]["phase"], "draining", "{s:#}");
    assert!(unschedulable(cp, &r.names[0]), "the cordon is kept");
    // Held, not slow: still so a while later.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(r.node.reboots().len(), 1, "rebooted with a member down");
    assert_eq!(reboot(&r.node)["waiting_for"], "etcd");
    r.etcd.start(1);
    r.tend_until("the second reboot done", |n| {
        n.boots == 2 && n.status().is_some_and(|s| s["rollout"]["slot"].is_null())
    });
    assert_eq!(r.hand_overs() - moved_before, 1, "one hand-over");
    r.caught_up(0);
    r.rebind();

    // Two members killed: no quorum.
    r.block();
    r.node.require_reboot();
    wait_for("the drain held by the budget", || {
        refused(&r.node).then_some(())
    });
    r.etcd.kill(1);
    r.etcd.kill(2);
    r.unblock();
    let held = wait_for("the reboot held for want of a quorum", || {
        let b = reboot(&r.node);
        let why = b["reason"].as_str().unwrap_or("");
        (b["waiting_for"] == "etcd" && why.contains("no quorum")).then(|| why.to_owned())
    });
    assert!(
        held.contains(&format!("1 of 3 voting members answer ({})", r.names[0])),
        "{held}"
    );
    assert!(
        held.contains(&r.names[1]) && held.contains(&r.names[2]),
        "{held}"
    );
    assert_eq!(r.node.reboots().len(), 2);
    r.etcd.start(1);
    r.etcd.start(2);
    r.tend_until("the third reboot done", |n| {
        n.boots == 3 && n.status().is_some_and(|s| s["rollout"]["slot"].is_null())
    });
    stop.store(true, Ordering::Relaxed);
    never_two_down(&samples.lock().unwrap(), "three reboots");
    cp.kubectl(&["delete", "namespace", &r.ns, "--wait=false"]);
}

/// What `ginxctl status` said, sampled every 50 ms: when, the slot, whether ginx's drain
/// record is there and cordoned.
#[derive(Clone, Debug)]
struct Seen {
    at: SystemTime,
    slot: bool,
    drain: bool,
    cordoned: bool,
}

/// Samples the node's status until the flag is set.
fn sample_status(socket: std::path::PathBuf) -> (Arc<AtomicBool>, Arc<Mutex<Vec<Seen>>>) {
    let stop = Arc::new(AtomicBool::new(false));
    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let (s, out) = (Arc::clone(&stop), Arc::clone(&seen));
    std::thread::spawn(move || {
        while !s.load(Ordering::Relaxed) {
            let o = crate::support::daemon::ctl_at(&socket, &["status", "--json"]);
            if let Ok(v) = serde_json::from_slice::<Value>(&o.stdout) {
                let d = &v["apply"]["drain"];
                out.lock().unwrap().push(Seen {
                    at: SystemTime::now(),
                    slot: !v["rollout"]["slot"].is_null(),
                    drain: !d.is_null(),
                    cordoned: d["cordoned"] == true,
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    (stop, seen)
}

fn time_of(stamp: &str) -> SystemTime {
    let t: jiff::Timestamp = stamp.parse().unwrap();
    SystemTime::UNIX_EPOCH + Duration::from_nanos(t.as_nanosecond() as u64)
}

/// How long after `at` status first showed `shows`; `None` if it never did.
fn shown_after(seen: &[Seen], at: SystemTime, shows: impl Fn(&Seen) -> bool) -> Option<Duration> {
    seen.iter()
        .find(|s| s.at >= at && shows(s))
        .map(|s| s.at.duration_since(at).unwrap_or_default())
}

/// A live activation whose plan drains, with a member killed during its drain: the last look
/// holds it (slot and cordon kept, the wait naming the member); held past
/// `reboot.guard_timeout` the node is uncordoned and the slot released in the same turn, and
/// the slot Lease is never renewed after that; once the member is back the activation runs,
/// after one hand-over. Every change ginx made to its slot Lease and its Node shows in
/// `ginxctl status` within a second, measured from the audit log's timestamps.
#[test]
fn a_live_drain_held_at_the_last_look_gives_its_slot_back_and_status_keeps_up() {
    let Some(cp) = control_plane::shared() else {
        return;
    };
    let mut rbac = RbacGuard::new(cp);
    let r = rig(cp, "lv", "guard_timeout = \"5s\"", true);
    let lucy = r.names[0].clone();
    rbac.watch(&lucy);
    let first = r.origin.repo.head();
    let (stop_etcd, samples) = poll(Arc::clone(&r.etcd));
    let (stop_status, seen) = sample_status(r.node.d().socket.clone());
    r.etcd.move_leader(0);
    let moved_before = r.hand_overs();
    r.block();
    r.node.env.stub(
        "dry_activate",
        "would stop the following units: containerd.service\n\
         would start the following units: containerd.service\n",
    );
    let mark = cp.audit_mark();
    let second = r
        .origin
        .repo
        .commit("two", "containerd", "restart containerd");
    r.node.d().ctl_ok(&["sync"]);
    let node_user = format!("system:node:{lucy}");
    wait_for("the drain held by the budget", || {
        cp.audit_since(mark)
            .iter()
            .any(|e| e.subresource == "eviction" && e.code == 429 && e.user == node_user)
            .then_some(())
    });
    r.etcd.kill(1);
    r.unblock();
    let held = wait_for("the activation held at the last look", || {
        let s = r.node.status()?;
        (s["rollout"]["waiting_for"] == "etcd").then_some(s)
    });
    let why = held["rollout"]["reason"].as_str().unwrap_or("");
    assert!(why.contains(&r.names[1]), "{held:#}");
    assert!(
        !held["rollout"]["slot"].is_null(),
        "the slot kept: {held:#}"
    );
    assert_eq!(held["apply"]["applied_revision"], first.as_str());
    let put_off = r.node.d().wait_status("the activation put off", |s| {
        s["rollout"]["reason"]
            .as_str()
            .is_some_and(|w| w.contains("activation put off"))
    });
    let why = put_off["rollout"]["reason"].as_str().unwrap();
    assert!(
        why.contains("reboot.guard_timeout") && why.contains(&r.names[1]),
        "{why}"
    );
    assert_eq!(put_off["apply"]["applied_revision"], first.as_str());
    let given_back = cp.audit_mark();
    // A while past the give-up (less than the put-off): the slot stays given back.
    std::thread::sleep(Duration::from_secs(3));
    let quiet = cp.audit_range(given_back, cp.audit_mark());
    r.etcd.start(1);
    r.node.d().ctl_ok(&["sync"]);
    r.node.d().wait_applied(&second);
    r.node.d().wait_status("the node given back", |s| {
        s["rollout"]["slot"].is_null() && s["apply"]["drain"].is_null()
    });
    // The sampler sees it too before it stops: its last sample is one taken after this.
    let back_at = SystemTime::now();
    wait_for("the sampler's look at the node given back", || {
        let seen = seen.lock().unwrap();
        seen.last().filter(|s| s.at > back_at).map(|_| ())
    });
    stop_status.store(true, Ordering::Relaxed);
    stop_etcd.store(true, Ordering::Relaxed);
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(r.hand_overs() - moved_before, 1, "one hand-over");
    never_two_down(&samples.lock().unwrap(), "the live drain");

    let ginx_user = format!("ginx:{lucy}");
    let lease = format!("ginx-rollout-{}-0", "lv");
    let all = cp.audit_since(mark);
    let writes = |e: &&control_plane::AuditEvent| {
        matches!(e.verb.as_str(), "create" | "update" | "patch") && e.code < 300
    };
    let lease_writes: Vec<_> = all
        .iter()
        .filter(writes)
        .filter(|e| e.resource == "leases" && e.name == lease && e.user == ginx_user)
        .collect();
    let holder = |e: &control_plane::AuditEvent| {
        e.request["spec"]["holderIdentity"]
            .as_str()
            .map(str::to_owned)
    };
    // ginx's cordons and uncordons of its Node (made as the node), told by their bodies.
    let cordoned_by = |e: &control_plane::AuditEvent| {
        e.request["metadata"]["annotations"]
            .as_object()
            .and_then(|a| a.get("ginx.io/cordoned-by-ginx"))
            .cloned()
    };
    let node_writes: Vec<_> = all
        .iter()
        .filter(writes)
        .filter(|e| e.resource == "nodes" && e.name == lucy && e.subresource.is_empty())
        .filter(|e| e.user == node_user && cordoned_by(e).is_some())
        .collect();
    // The give-up: the uncordon, then the release, no renewal between or after them.
    let taken = lease_writes
        .iter()
        .position(|e| holder(e).as_deref() == Some(lucy.as_str()))
        .expect("the slot taken");
    let release = taken
        + lease_writes[taken..]
            .iter()
            .position(|e| holder(e).is_none())
            .expect("the slot released");
    let acquired = lease_writes[taken].request["spec"]["acquireTime"]
        .as_str()
        .map(str::to_owned);
    assert!(
        node_writes.len() >= 2,
        "a cordon and an uncordon: {node_writes:?}"
    );
    let (cordon, uncordon) = (node_writes[0], node_writes[1]);
    assert!(
        cordoned_by(cordon).is_some_and(|v| v.is_string())
            && cordoned_by(uncordon).is_some_and(|v| v.is_null()),
        "a cordon, then an uncordon: {node_writes:?}"
    );
    assert!(
        uncordon.time <= lease_writes[release].time,
        "uncordoned after the release"
    );
    assert!(
        !lease_writes[..release]
            .iter()
            .any(|e| e.time > uncordon.time),
        "the slot Lease renewed between the uncordon and the release: {:#?}\n{:#?}",
        lease_writes
            .iter()
            .map(|e| (e.verb.clone(), e.time.clone(), e.request["spec"].clone()))
            .collect::<Vec<_>>(),
        node_writes
            .iter()
            .map(|e| e.short() + " " + &e.time)
            .collect::<Vec<_>>()
    );
    for e in &lease_writes[release + 1..] {
        assert!(
            e.request["spec"]["acquireTime"].as_str().map(str::to_owned) != acquired
                || holder(e).is_none(),
            "the slot Lease renewed after it was given back: {e:?}"
        );
    }
    assert!(
        !quiet.iter().any(|e| e.resource == "leases"
            && e.name == lease
            && e.user == ginx_user
            && holder(e).as_deref() == Some(lucy.as_str())),
        "the slot Lease written as held while the activation was put off: {quiet:?}"
    );

    // Status within a second of each change ginx made.
    let seen = seen.lock().unwrap().clone();
    let mut figures = Vec::new();
    let mut check = |what: &str, at: &str, shows: &dyn Fn(&Seen) -> bool| {
        let lag = shown_after(&seen, time_of(at), shows)
            .unwrap_or_else(|| panic!("{what} at {at} never shown: {seen:?}"));
        assert!(lag < Duration::from_secs(1), "{what} shown {lag:?} late");
        figures.push((what.to_owned(), lag));
    };
    // Every take and release of the slot, every cordon and uncordon, through the give-up,
    // the retry, the activation and its gate.
    let mut held_before = false;
    for e in &lease_writes {
        let held_now = holder(e).as_deref() == Some(lucy.as_str());
        match (held_before, held_now) {
            (false, true) => check("slot taken", &e.time, &|s| s.slot),
            (true, false) => check("slot released", &e.time, &|s| !s.slot),
            _ => {}
        }
        held_before = held_now;
    }
    for e in &node_writes {
        if cordoned_by(e).is_some_and(|v| v.is_string()) {
            check("cordoned", &e.time, &|s| s.cordoned);
        } else {
            check("uncordoned", &e.time, &|s| !s.drain);
        }
    }
    assert!(
        figures.len() >= 8,
        "two attempts, each taken, cordoned, uncordoned, released"
    );
    for (what, lag) in &figures {
        println!(
            "FIGURE status shows '{what}' {} ms after the audit log",
            lag.as_millis()
        );
    }
    let worst = figures.iter().map(|f| f.1).max().unwrap();
    println!(
        "FIGURE status lag, worst of {}: {} ms (sampled every 50 ms)",
        figures.len(),
        worst.as_millis()
    );
    cp.kubectl(&["delete", "namespace", &r.ns, "--wait=false"]);
}

/// Makes `name` a control-plane peer of group `group` that ginx reports healthy (an admin
/// writes what its ginx would: the group annotation and `GinxHealthy=True`), so that only its
/// Ready condition, which its stand-in kubelet posts, decides the quorum guard.
fn healthy_peer(cp: &ControlPlane, name: &str, group: &str) {
    cp.kubectl(&[
        "annotate",
        "node",
        name,
        &format!("ginx.io/rollout-group={group}"),
        "--overwrite",
    ]);
    let now = jiff::Timestamp::now().to_string();
    let (code, body) = cp.request(
        "PATCH",
        &format!("/api/v1/nodes/{name}/status"),
        "application/strategic-merge-patch+json",
        &json!({"status": {"conditions": [{"type": "GinxHealthy", "status": "True",
            "reason": "Healthy", "message": "test", "lastHeartbeatTime": now,
            "lastTransitionTime": now}]}}),
    );
    assert!(code < 300, "{code} {body}");
}

/// The other guards at the last look: a control-plane peer that goes NotReady during a
/// reboot's drain holds the drained node (`waiting_for: quorum`, naming it), and so does a
/// critical alert that starts firing (`waiting_for: alerts`); each time the node keeps its
/// slot and cordon, does not reboot, and reboots once the guard lets it.
#[test]
fn a_peer_not_ready_or_an_alert_firing_during_a_drain_holds_the_reboot() {
    let Some(cp) = control_plane::shared() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    if !crate::support::require("prometheus") {
        return;
    }
    let exporter = Exporter::start(&tmp.path().join("flags"));
    let prom = Prometheus::start(&tmp.path().join("prometheus"), &exporter.addr);
    let prom_toml = format!(
        "[rollout.gate.prometheus]\nurl = \"{}\"\ntimeout = \"2s\"\n",
        prom.url
    );
    let mut r = rig_with(cp, "lq", "", false, &prom_toml, "");
    let peer = Kubelet::start(cp, &r.names[1], "control-plane");
    healthy_peer(cp, &r.names[1], "lq");
    let refused = |n: &Node| {
        reboot(n)["refused"]
            .as_object()
            .is_some_and(|m| !m.is_empty())
    };
    let held = |r: &Rig, what: &str| {
        let s = wait_for(
            &format!("the reboot held at the last look ({what})"),
            || {
                let s = r.node.status()?;
                (s["rollout"]["reboot"]["waiting_for"] == what).then_some(s)
            },
        );
        assert!(!s["rollout"]["slot"].is_null(), "the slot is kept: {s:#}");
        assert!(unschedulable(r.cp, &r.names[0]), "the cordon is kept");
        s["rollout"]["reboot"]["reason"]
            .as_str()
            .unwrap_or("")
            .to_owned()
    };

    r.block();
    r.node.require_reboot();
    wait_for("the drain held by the budget", || {
        refused(&r.node).then_some(())
    });
    peer.set_ready(false);
    r.unblock();
    let why = held(&r, "quorum");
    assert!(
        why.contains(&format!("{} is not Ready", r.names[1])),
        "{why}"
    );
    assert!(r.node.reboots().is_empty(), "rebooted with a peer NotReady");
    peer.set_ready(true);
    r.tend_until("the reboot after the peer is Ready", |n| {
        n.boots == 1 && n.status().is_some_and(|s| s["rollout"]["slot"].is_null())
    });
    r.rebind();

    r.block();
    r.node.require_reboot();
    wait_for("the drain held by the budget", || {
        refused(&r.node).then_some(())
    });
    std::fs::write(exporter.flag("during"), "").unwrap();
    prom.wait_firing(&["TestBroken{during}"]);
    r.unblock();
    let why = held(&r, "alerts");
    assert!(why.contains("TestBroken"), "{why}");
    assert_eq!(r.node.reboots().len(), 1, "rebooted with an alert firing");
    std::fs::remove_file(exporter.flag("during")).unwrap();
    prom.wait_firing(&[]);
    r.tend_until("the reboot after the alert resolved", |n| {
        n.boots == 2 && n.status().is_some_and(|s| s["rollout"]["slot"].is_null())
    });
    cp.kubectl(&["delete", "namespace", &r.ns, "--wait=false"]);
}
