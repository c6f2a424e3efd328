//! The etcd guard against a real three-member etcd cluster (tests/support/etcd.rs) beside the
//! real control plane: a rolling reboot of three control-plane nodes whose stand-in reboot
//! stops and restarts their member, an alarm, and bad input. What matters is asserted from
//! etcd's own view, its members' status polled every 100 ms, never from ginx's logs.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::control_plane::{self, ControlPlane, RbacGuard};
use crate::support::etcd::EtcdCluster;
use crate::support::kubelet::Kubelet;
use crate::support::reboot::{Node, node, tend_until};
use crate::support::stacked::Stacked;
use crate::support::vip::Vip;
use crate::support::{Env, wait_for};

/// What `max_lag` the tests give ginx: small, so that a member restarted a moment ago counts
/// as behind until it replayed what it missed.
pub(crate) const MAX_LAG: u64 = 20;

fn status(n: &Node) -> Option<Value> {
    n.status()
}

/// Points node `n`'s ginx at member `url` of `etcd`, with `extra` lines in `[etcd]`.
pub(crate) fn guard(n: &Node, etcd: &EtcdCluster, url: &str, extra: &str) {
    n.env.dropin(
        "85-etcd.toml",
        &format!(
            "[etcd]\nmanifest = \"\"\nendpoint = \"{url}\"\nca_file = \"{}\"\ncert_file = \"{}\"\n\
             key_file = \"{}\"\ntimeout = \"1s\"\nmax_lag = {MAX_LAG}\n{extra}\n",
            etcd.ca_file.display(),
            etcd.cert_file.display(),
            etcd.key_file.display()
        ),
    );
}

/// One poll of every member: (leader id, applied index, term), or `None` for a member that
/// did not answer.
pub(crate) type Sample = Vec<Option<(String, u64, u64)>>;

pub(crate) fn number(v: &Value) -> u64 {
    v.as_str().and_then(|s| s.parse().ok()).unwrap_or(0)
}

/// Polls every member's status every 100 ms until the returned flag is set.
pub(crate) fn poll(etcd: Arc<EtcdCluster>) -> (Arc<AtomicBool>, Arc<Mutex<Vec<Sample>>>) {
    let stop = Arc::new(AtomicBool::new(false));
    let samples: Arc<Mutex<Vec<Sample>>> = Arc::default();
    let (s, out) = (Arc::clone(&stop), Arc::clone(&samples));
    std::thread::spawn(move || {
        while !s.load(Ordering::Relaxed) {
            let sample: Sample = (0..etcd.members.len())
                .map(|i| {
                    etcd.status(i).map(|st| {
                        (
                            st["leader"].as_str().unwrap_or("0").to_owned(),
                            number(&st["raftAppliedIndex"]),
                            number(&st["raftTerm"]),
                        )
                    })
                })
                .collect();
            out.lock().unwrap().push(sample);
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    (stop, samples)
}

/// Three control-plane nodes of group `group`, each guarding with its own member of `etcd`.
fn three(
    cp: &'static ControlPlane,
    etcd: &EtcdCluster,
    origin: &Env,
    names: &[String],
    etcd_extra: &str,
) -> Vec<Node> {
    let journal = origin.root.join("journal");
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
                &names[0],
                ["", ""],
            );
            guard(&n, etcd, &etcd.members[i].client_url, etcd_extra);
            n.down_for = Duration::from_secs(3);
            n.slot_lease = Some((cp, format!("ginx-rollout-{}-0", names[0])));
            n.start();
            n
        })
        .collect()
}

/// What one rolling reboot left: etcd's view polled, the members' ids, the writes made
/// through the VIP.
struct Rolled {
    samples: Vec<Sample>,
    ids: Vec<String>,
    writes: Vec<Write>,
}

/// Rolls a new kernel over three control-plane nodes of a stacked control plane (a member and
/// an API server per node), stopping the node's API server and member while its ginx is
/// "rebooted" and starting them when ginx comes back, while a client writes through the VIP.
fn rolling_reboot(cp: &'static ControlPlane, prefix: &str, hand_over: bool) -> Rolled {
    let names: Vec<String> = ["lucy", "makise", "quinn"]
        .map(|n| format!("{prefix}-{n}"))
        .to_vec();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let bin = control_plane::binary().unwrap();
    let etcd = Arc::new(EtcdCluster::new(&bin, &refs));
    let ids: Vec<String> = (0..3).map(|i| etcd.id(i)).collect();
    let api = Stacked::start_on(&bin, &etcd);
    let vip = Vip::start(api.addrs());
    let kubeconfig = etcd.dir.join("vip.kubeconfig");
    api.admin_kubeconfig(&etcd, &kubeconfig, &format!("https://{}", vip.addr));
    let _kubelets: Vec<Kubelet> = names
        .iter()
        .map(|n| Kubelet::start(cp, n, "control-plane"))
        .collect();
    let origin = Env::new();
    let extra = if hand_over { "" } else { "hand_over = false" };
    let mut nodes = three(cp, &etcd, &origin, &names, extra);
    let first = origin.repo.head();
    for n in &nodes {
        n.d().wait_applied(&first);
    }
    let writer = Writer::start(kubeconfig);
    let (stop, samples) = poll(Arc::clone(&etcd));
    for n in &nodes {
        n.env.stub("kernel", "kernel-2");
    }
    let second = origin
        .repo
        .commit("hive.nix", "{ kernel = 2; }", "kernel 2");
    for n in &nodes {
        n.d().ctl_ok(&["sync"]);
    }
    tend_until(&mut nodes, "three nodes rebooted, members back", |ns| {
        for (i, n) in ns.iter().enumerate() {
            // The machine is down while ginx is: its API server and member go with it, and
            // come back when ginx does (systemd and the kubelet start them at boot). They go
            // down hard (SIGKILL), as in a reboot that gives etcd no time to hand its
            // leadership over itself (a graceful stop does; a power cut, a panic, a shutdown
            // cut short or a network stopped first do not): the case the hand-over is for.
            if n.down.is_some() && etcd.running(i) {
                api.kill(i);
                etcd.kill(i);
            } else if n.down.is_none() && !etcd.running(i) {
                etcd.start(i);
                api.start(i);
            }
        }
        ns.iter().all(|n| {
            n.boots == 1
                && status(n).is_some_and(|s| {
                    s["apply"]["applied_revision"] == second.as_str()
                        && s["rollout"]["reboot"]["phase"].is_null()
                        && s["rollout"]["slot"].is_null()
                })
        })
    });
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    let writes = writer.stop();
    // Shown when an assertion on etcd's view fails (a test's output is printed only then).
    for n in &nodes {
        let log = n.d().log();
        let lines: Vec<&str> = log
            .lines()
            .filter(|l| {
                ["etcd", "slot", "reboot", "gate"]
                    .iter()
                    .any(|w| l.contains(w))
            })
            .collect();
        eprintln!("--- {} (boots {}):\n{}", n.name, n.boots, lines.join("\n"));
    }
    let samples = samples.lock().unwrap().clone();
    Rolled {
        samples,
        ids,
        writes,
    }
}

/// One write of the availability client: when it started, how long it took, whether the API
/// accepted it.
#[derive(Clone, Debug)]
struct Write {
    at: Instant,
    took: Duration,
    ok: bool,
}

/// A client that patches a ConfigMap every 100 ms through the VIP, one write at a time, each
/// given up after 10 s.
struct Writer {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Vec<Write>>,
}

impl Writer {
    fn start(kubeconfig: std::path::PathBuf) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let s = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(write_until(kubeconfig, s))
        });
        Self { stop, thread }
    }

    fn stop(self) -> Vec<Write> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap()
    }
}

async fn write_until(kubeconfig: std::path::PathBuf, stop: Arc<AtomicBool>) -> Vec<Write> {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::{Api, Patch, PatchParams};
    let client = crate::support::kubelet::client(&kubeconfig).await;
    let api: Api<ConfigMap> = Api::namespaced(client, "default");
    let apply = PatchParams::apply("availability").force();
    let mut writes = Vec::new();
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let at = Instant::now();
        n += 1;
        let body = serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "availability"}, "data": {"n": n.to_string()}
        });
        let ok = matches!(
            tokio::time::timeout(
                Duration::from_secs(10),
                api.patch("availability", &apply, &Patch::Apply(&body))
            )
            .await,
            Ok(Ok(_))
        );
        writes.push(Write {
            at,
            took: at.elapsed(),
            ok,
        });
        tokio::time::sleep(Duration::from_millis(100).saturating_sub(at.elapsed())).await;
    }
    writes
}

/// The availability figures of a run's writes: (writes, failed, slower than 1 s, the longest
/// time without a write completing).
fn availability(writes: &[Write]) -> (usize, usize, usize, Duration) {
    let failed = writes.iter().filter(|w| !w.ok).count();
    let slow = writes
        .iter()
        .filter(|w| w.ok && w.took > Duration::from_secs(1))
        .count();
    let done: Vec<Instant> = writes
        .iter()
        .filter(|w| w.ok)
        .map(|w| w.at + w.took)
        .collect();
    let longest = done
        .windows(2)
        .map(|p| p[1] - p[0])
        .max()
        .unwrap_or_default();
    (writes.len(), failed, slow, longest)
}

/// What etcd's own view says of a rolling reboot: asserts that no two members were ever
/// down at once and that every member went down only while all others were caught up, and,
/// with the hand-over, never while leading. Returns (elections, members that went down
/// leading).
fn judge(samples: &[Sample], ids: &[String], names: &[&str]) -> (u64, usize) {
    assert!(samples.len() > 20, "too few samples: {}", samples.len());
    let mut downs = vec![0; ids.len()];
    let mut down_leading = 0;
    for (k, s) in samples.iter().enumerate() {
        let down = s.iter().filter(|m| m.is_none()).count();
        assert!(
            down <= 1,
            "two members down at once in sample {k}: {s:?}\n{:#?}",
            &samples[k.saturating_sub(30)..(k + 5).min(samples.len())]
        );
        let Some(before) = k.checked_sub(1).map(|p| &samples[p]) else {
            continue;
        };
        for j in 0..ids.len() {
            if !(before[j].is_some() && s[j].is_none()) {
                continue;
            }
            downs[j] += 1;
            // The last look before it went: every member answered, one leader, all caught up.
            let leader = before[j].as_ref().unwrap().0.clone();
            if leader == ids[j] {
                down_leading += 1;
                eprintln!(
                    "{} went down leading; the samples before:\n{:?}",
                    names[j],
                    &samples[k.saturating_sub(40)..=k]
                );
            }
            let top = before.iter().flatten().map(|m| m.1).max().unwrap();
            for (i, m) in before.iter().enumerate() {
                let m = m.as_ref().unwrap_or_else(|| {
                    panic!(
                        "{} went down while {} was down: {before:?}",
                        names[j], names[i]
                    )
                });
                // The members are polled one after the other, a few milliseconds apart, while
                // writes go on: a slack of 5 entries for that skew.
                assert!(
                    top - m.1 <= MAX_LAG + 5,
                    "{} went down while {} was {} entries behind: {before:?}",
                    names[j],
                    names[i],
                    top - m.1
                );
            }
        }
    }
    assert_eq!(downs, vec![1; ids.len()], "each member down exactly once");
    let terms: Vec<u64> = samples.iter().flatten().flatten().map(|m| m.2).collect();
    let elections = terms.iter().max().unwrap() - terms.iter().min().unwrap();
    (elections, down_leading)
}

/// Two rolling reboots of a stacked control plane in one run, with the hand-over and without:
/// both keep etcd's quorum and wait for each member to catch up; with the hand-over no member
/// goes down leading and the API takes writes on with no stall over 2 s. The figures are
/// printed (`FIGURE`).
#[test]
fn a_rolling_reboot_hands_etcd_s_leadership_over_and_the_api_never_stalls_long() {
    let Some(cp) = control_plane::shared() else {
        return;
    };
    let mut rbac = RbacGuard::new(cp);
    for prefix in ["eh", "en"] {
        for n in ["lucy", "makise", "quinn"] {
            rbac.watch(&format!("{prefix}-{n}"));
        }
    }
    let mut figures = Vec::new();
    for (prefix, hand_over) in [("eh", true), ("en", false)] {
        let r = rolling_reboot(cp, prefix, hand_over);
        let names: Vec<String> = ["lucy", "makise", "quinn"]
            .map(|n| format!("{prefix}-{n}"))
            .to_vec();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let (elections, down_leading) = judge(&r.samples, &r.ids, &refs);
        let (writes, failed, slow, longest) = availability(&r.writes);
        let line = format!(
            "FIGURE etcd rolling reboot, hand-over {}: {writes} writes, {failed} failed, \
             {slow} slower than 1 s, longest without a write {:.2} s; {elections} term \
             changes (elections), {down_leading} member(s) down while leading",
            if hand_over { "on" } else { "off" },
            longest.as_secs_f64()
        );
        eprintln!("{line}");
        figures.push((hand_over, down_leading, longest, line));
    }
    for (hand_over, down_leading, longest, line) in &figures {
        if *hand_over {
            assert_eq!(*down_leading, 0, "a member went down leading: {line}");
            assert!(
                *longest < Duration::from_secs(2),
                "a write stall of 2 s or more: {line}"
            );
        } else {
            // Every member goes down once: without the hand-over, one of them led then.
            assert!(
                *down_leading >= 1,
                "the comparison run never downed a leader: {line}"
            );
        }
    }
    // The hand-over was told: an Event on a node of the first run.
    let events = cp.kubectl(&[
        "get",
        "events",
        "-n",
        "default",
        "--field-selector",
        "reason=EtcdLeaderMoved",
        "-o",
        "json",
    ]);
    let events: Value = serde_json::from_str(&events).unwrap();
    let moved = events["items"].as_array().unwrap().iter().any(|e| {
        e["involvedObject"]["name"]
            .as_str()
            .is_some_and(|n| n.starts_with("eh-"))
    });
    assert!(moved, "no EtcdLeaderMoved Event: {events:#}");
}

#[test]
fn an_alarm_on_one_member_holds_the_control_plane_node_and_names_it() {
    let Some(cp) = control_plane::shared() else {
        return;
    };
    let names = ["ea-lucy", "ea-makise", "ea-quinn"];
    let bin = control_plane::binary().unwrap();
    let etcd = EtcdCluster::new(&bin, &names);
    let _kubelet = Kubelet::start(cp, names[0], "control-plane");
    let origin = Env::new();
    let journal = origin.root.join("journal");
    let mut n = node(
        cp,
        &origin.repo.path,
        &journal,
        names[0],
        "control-plane",
        "ea",
        ["quorum_guard = false", ""],
    );
    guard(&n, &etcd, &etcd.members[0].client_url, "");
    n.start();
    let first = origin.repo.head();
    n.d().wait_applied(&first);
    etcd.alarm(0, 2, "NOSPACE", true);
    let second = origin.repo.commit("hive.nix", "{ x = 2; }", "two");
    n.d().ctl_ok(&["sync"]);
    let reason = wait_for("the etcd guard to hold lucy", || {
        let s = status(&n)?;
        (s["rollout"]["waiting_for"] == "etcd")
            .then(|| s["rollout"]["reason"].as_str().unwrap().to_owned())
    });
    assert!(
        reason.contains("ea-quinn has the alarm NOSPACE"),
        "{reason}"
    );
    let s = status(&n).unwrap();
    assert_eq!(
        s["apply"]["applied_revision"],
        first.as_str(),
        "nothing applied while held"
    );
    // The wait shows in the metric, in the cluster view, and as an Event on the Node.
    crate::kubernetes::assert_waiting_metric(&s, "etcd");
    wait_for("the cluster view to show the wait", || {
        let view: Value = serde_json::from_str(&n.d().ctl_ok(&["cluster", "--json"])).ok()?;
        let me = view["nodes"]
            .as_array()?
            .iter()
            .find(|v| v["name"] == names[0])?
            .clone();
        (me["waiting_for"] == "etcd").then_some(())
    });
    wait_for("the EtcdUnhealthy Event", || {
        let events = cp.node_events("ea-lucy", "EtcdUnhealthy");
        let e = events.first()?;
        e["message"]
            .as_str()
            .is_some_and(|m| m.contains("ea-quinn has the alarm NOSPACE"))
            .then_some(())
    });
    etcd.alarm(0, 2, "NOSPACE", false);
    n.d().ctl_ok(&["sync"]);
    n.d().wait_applied(&second);
}

#[test]
fn missing_certificates_a_wrong_ca_and_a_silent_endpoint_each_hold_with_a_reason() {
    let Some(cp) = control_plane::shared() else {
        return;
    };
    let bin = control_plane::binary().unwrap();
    let etcd = EtcdCluster::new(&bin, &["eb-lucy", "eb-makise", "eb-quinn"]);
    let other = etcd.dir.join("other");
    std::fs::create_dir_all(&other).unwrap();
    let other_ca = crate::support::tls::TestCa::new(&other);
    // Accepts connections (the kernel's backlog) and never answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_url = format!("https://{}", silent.local_addr().unwrap());
    let origin = Env::new();
    let journal = origin.root.join("journal");
    let cases: [(&str, String, String, &str); 3] = [
        (
            "eb-nocert",
            etcd.members[0].client_url.clone(),
            "cert_file = \"/nonexistent/healthcheck-client.crt\"".into(),
            "cannot read etcd.cert_file /nonexistent/healthcheck-client.crt",
        ),
        (
            "eb-wrongca",
            etcd.members[0].client_url.clone(),
            format!("ca_file = \"{}\"", other_ca.pem_path.display()),
            "certificate",
        ),
        (
            "eb-silent",
            silent_url,
            String::new(),
            "no answer within etcd.timeout",
        ),
    ];
    // Each node applies its first revision with a good configuration, then gets the bad one
    // (a reload) and a reboot to do: the reboot waits, and nothing reboots.
    let mut nodes = Vec::new();
    let mut kubelets = Vec::new();
    for (name, _, _, _) in &cases {
        kubelets.push(Kubelet::start(cp, name, "control-plane"));
        let mut n = node(
            cp,
            &origin.repo.path,
            &journal,
            name,
            "control-plane",
            name,
            ["quorum_guard = false", ""],
        );
        guard(&n, &etcd, &etcd.members[0].client_url, "");
        n.start();
        nodes.push(n);
    }
    let first = origin.repo.head();
    for ((_, url, extra, _), n) in cases.iter().zip(nodes.iter_mut()) {
        n.d().wait_applied(&first);
        // Stopped, given the bad configuration (a later drop-in overrides the good key) and
        // a reboot to do, started again.
        assert!(n.daemon.take().unwrap().stop().success());
        n.env.dropin(
            "86-bad.toml",
            &format!("[etcd]\nendpoint = \"{url}\"\n{extra}\n"),
        );
        std::fs::write(n.env.stub_dir.join("sentinel"), "").unwrap();
        n.start();
    }
    for ((name, _, _, want), n) in cases.iter().zip(&nodes) {
        let s = n
            .d()
            .wait_status(&format!("{name}'s reboot held by the etcd guard"), |s| {
                s["rollout"]["reboot"]["waiting_for"] == "etcd"
            });
        let reason = s["rollout"]["reboot"]["reason"].as_str().unwrap_or("");
        assert!(reason.contains(want), "{name}: {reason}");
    }
    // A reboot held by etcd is the node's wait in the metric and in the cluster view too.
    let s = status(&nodes[0]).unwrap();
    crate::kubernetes::assert_waiting_metric(&s, "etcd");
    wait_for("the cluster view to show the reboot's wait", || {
        let view: Value =
            serde_json::from_str(&nodes[0].d().ctl_ok(&["cluster", "--json"])).ok()?;
        let me = view["nodes"]
            .as_array()?
            .iter()
            .find(|v| v["name"] == cases[0].0)?
            .clone();
        (me["waiting_for"] == "etcd").then_some(())
    });
    // Held, not just slow: after 15 more heartbeats (3 s of the daemon's work) still nothing
    // rebooted.
    let mark = cp.audit_mark();
    for (name, _, _, _) in &cases {
        cp.wait_renewals(name, mark, 15);
    }
    for ((name, _, _, _), n) in cases.iter().zip(&nodes) {
        assert!(n.reboots().is_empty(), "{name} rebooted");
        let s = status(n).unwrap();
        assert_eq!(
            s["rollout"]["reboot"]["waiting_for"], "etcd",
            "{name}: {s:#}"
        );
    }
    drop(silent);
    drop(kubelets);
}

#[test]
fn a_member_kept_behind_holds_the_control_plane_node_until_it_caught_up() {
    let Some(cp) = control_plane::shared() else {
        return;
    };
    let names = ["ek-lucy", "ek-makise", "ek-quinn"];
    let bin = control_plane::binary().unwrap();
    let cuts = crate::support::peer_cut::Cuts::default();
    let etcd = EtcdCluster::with_cuts(&bin, &names, Some(cuts.clone()));
    let _kubelet = Kubelet::start(cp, names[0], "control-plane");
    let origin = Env::new();
    let journal = origin.root.join("journal");
    let mut n = node(
        cp,
        &origin.repo.path,
        &journal,
        names[0],
        "control-plane",
        "ek",
        ["quorum_guard = false", ""],
    );
    guard(&n, &etcd, &etcd.members[0].client_url, "");
    n.start();
    let first = origin.repo.head();
    n.d().wait_applied(&first);
    // A member that does not lead (cutting the leader off would elect another) hears nothing
    // from its peers while the others take writes: it answers its clients, and falls behind.
    let cut = if etcd.wait_leader() == 2 { 1 } else { 2 };
    cuts.cut(&etcd.hex_id(cut));
    for k in 0..3 * MAX_LAG {
        assert!(etcd.put(0, &format!("k{k}"), "v"), "a write failed");
    }
    let second = origin.repo.commit("hive.nix", "{ x = 2; }", "two");
    n.d().ctl_ok(&["sync"]);
    let reason = wait_for("the etcd guard to hold lucy", || {
        let s = status(&n)?;
        (s["rollout"]["waiting_for"] == "etcd")
            .then(|| s["rollout"]["reason"].as_str().unwrap().to_owned())
    });
    assert!(reason.contains(names[cut]), "{reason}");
    assert!(
        reason.contains("entries behind") || reason.contains("knows no leader"),
        "{reason}"
    );
    // Held while the member is behind, as etcd's own view shows it (it answers, and trails).
    let behind = |etcd: &EtcdCluster| {
        let top = number(&etcd.status(0)?["raftAppliedIndex"]);
        let q = number(&etcd.status(cut)?["raftAppliedIndex"]);
        Some(top.saturating_sub(q))
    };
    let lag = behind(&etcd).expect("the member cut off answers its clients");
    assert!(lag > MAX_LAG, "{} is only {lag} behind", names[cut]);
    // Given 10 more heartbeats (2 s of the daemon's work) to apply, it still has not.
    cp.wait_renewals(names[0], cp.audit_mark(), 10);
    let s = status(&n).unwrap();
    assert_eq!(
        s["apply"]["applied_revision"],
        first.as_str(),
        "applied while quinn was behind"
    );
    assert_eq!(s["rollout"]["waiting_for"], "etcd");
    cuts.heal();
    wait_for("quinn to catch up", || {
        (behind(&etcd)? <= MAX_LAG).then_some(())
    });
    n.d().ctl_ok(&["sync"]);
    n.d().wait_applied(&second);
}
