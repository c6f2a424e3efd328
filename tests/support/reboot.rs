//! Nodes whose ginx reboots them, for tests/reboot.rs and `cargo bench --bench reboot`.
//!
//! Each node's fake NixOS system ([`Env::fake_nix`]) is rebooted by the stand-in
//! `reboot_command` (tests/support/reboot-stub): it writes a new boot id where the node's ginx
//! reads it (`system.boot_id`), boots the profile's generation, empties the sentinel, and stops
//! ginx with SIGTERM as systemd would; [`Node::tend`] starts it again after
//! [`Node::down_for`], as systemd does at boot. [`Unschedulable`] watches the nodes and keeps
//! the most that were unschedulable at once, from every watch event (not samples).

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::control_plane::ControlPlane;
use super::daemon::Daemon;
use super::test_fleet::{fetch_from, in_group, use_cluster};
use super::{Env, support_dir};

/// A node whose ginx may reboot it.
pub struct Node {
    pub env: Env,
    pub name: String,
    pub daemon: Option<Daemon>,
    /// How often the harness brought ginx back after a stand-in reboot.
    pub boots: u32,
    /// How long the machine stays down in a stand-in reboot before ginx starts again.
    pub down_for: Duration,
    /// Since when ginx is down, and the node's slot Lease as it was then.
    pub down: Option<(Instant, Option<Value>)>,
    /// When ginx was seen gone for each stand-in reboot.
    pub went_down: Vec<Instant>,
    /// The slot Lease (`namespace/name` in ginx-system) looked at when ginx goes down.
    pub slot_lease: Option<(&'static ControlPlane, String)>,
}

/// Makes node `name` in rollout group `group`, fetching from `origin`'s repository, with
/// `[reboot] mode = "when-required"` through the stand-in reboot; every activation, gate check
/// and reboot recorded in `journal`. `extra` goes into `[rollout]` and `[reboot]`.
pub fn node(
    cp: &ControlPlane,
    origin: &Path,
    journal: &Path,
    name: &str,
    role: &str,
    group: &str,
    extra: [&str; 2],
) -> Node {
    let [extra_rollout, extra_reboot] = extra;
    let env = Env::new();
    fetch_from(&env, origin);
    use_cluster(&env, cp, name, "");
    env.fake_nix();
    let boot_id = env.stub_dir.join("boot_id");
    std::fs::write(&boot_id, "boot-0\n").unwrap();
    in_group(name, role, group, journal)
        .set("system.boot_id", boot_id.display().to_string())
        .set("reboot.mode", "when-required")
        .set(
            "reboot.reboot_command",
            vec![support_dir().join("reboot-stub").display().to_string()],
        )
        .set(
            "reboot.sentinel",
            env.stub_dir.join("sentinel").display().to_string(),
        )
        .set("reboot.lock_ttl", "30s")
        .set("metrics.listen", "127.0.0.1:0")
        .merge("rollout", extra_rollout)
        .merge("reboot", extra_reboot)
        .write(&env, "80-rollout.toml");
    env.stub("journal", &journal.display().to_string());
    env.stub("sleep", "0.2");
    Node {
        env,
        name: name.to_owned(),
        daemon: None,
        boots: 0,
        down_for: Duration::ZERO,
        down: None,
        went_down: Vec::new(),
        slot_lease: None,
    }
}

impl Node {
    pub fn start(&mut self) {
        self.daemon = Some(self.env.start());
    }

    /// The node's status, or `None` while its ginx is down (rebooting).
    pub fn status(&self) -> Option<Value> {
        let out = self.daemon.as_ref()?.ctl(&["status", "--json"]);
        out.status
            .success()
            .then(|| serde_json::from_slice(&out.stdout).ok())
            .flatten()
    }

    pub fn d(&self) -> &Daemon {
        self.daemon.as_ref().expect("ginx runs")
    }

    /// Brings ginx back if it exited (after the stand-in reboot stopped it): as systemd does
    /// at boot. Returns whether it did.
    pub fn tend(&mut self) -> bool {
        let Some(d) = self.daemon.as_mut() else {
            return false;
        };
        if self.down.is_none() {
            let Some(status) = d.exited() else {
                return false;
            };
            assert!(status.success(), "ginx exited with {status}:\n{}", d.log());
            let lease = self
                .slot_lease
                .as_ref()
                .and_then(|(cp, name)| cp.lease("ginx-system", name));
            self.down = Some((Instant::now(), lease));
            self.went_down.push(Instant::now());
        }
        if self
            .down
            .as_ref()
            .is_some_and(|(t, _)| t.elapsed() < self.down_for)
        {
            return false;
        }
        self.down = None;
        self.daemon = Some(self.env.start());
        self.boots += 1;
        true
    }

    /// The reboots the stand-in carried out: the generation booted each time.
    pub fn reboots(&self) -> Vec<String> {
        std::fs::read_to_string(self.env.stub_dir.join("reboots"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split_whitespace().nth(1).map(str::to_owned))
            .collect()
    }

    /// Asks for a reboot through the sentinel file, and has ginx look at once (it looks for
    /// it every few seconds on its own).
    pub fn require_reboot(&self) {
        std::fs::write(self.env.stub_dir.join("sentinel"), "").unwrap();
        if let Some(d) = &self.daemon {
            d.ctl_ok(&["sync"]);
        }
    }
}

/// Tends every node until `done` holds (checked between tends), failing after the patience.
pub fn tend_until(nodes: &mut [Node], what: &str, done: impl FnMut(&mut [Node]) -> bool) {
    tend_within(nodes, what, Duration::from_secs(180), done);
}

/// [`tend_until`] with a patience of its own (a benchmark's run is longer than a test's).
pub fn tend_within(
    nodes: &mut [Node],
    what: &str,
    patience: Duration,
    mut done: impl FnMut(&mut [Node]) -> bool,
) {
    let start = Instant::now();
    loop {
        for n in nodes.iter_mut() {
            n.tend();
        }
        if done(nodes) {
            return;
        }
        if start.elapsed() > patience {
            let logs: Vec<String> = nodes
                .iter()
                .map(|n| {
                    format!(
                        "--- {}:\n{}",
                        n.name,
                        n.daemon.as_ref().map(|d| d.log()).unwrap_or_default()
                    )
                })
                .collect();
            panic!("timed out waiting for {what}\n{}", logs.join("\n"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Watches the nodes `names` and records, for every change, how many of them are
/// unschedulable: every watch event, not samples.
pub struct Unschedulable {
    pub most: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Unschedulable {
    pub fn watch(cp: &ControlPlane, names: &[String]) -> Self {
        use futures_util::StreamExt;
        use k8s_openapi::api::core::v1::Node as KNode;
        let most = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let client = cp.admin();
        let names: Vec<String> = names.to_vec();
        let m = std::sync::Arc::clone(&most);
        let (ready_tx, ready) = std::sync::mpsc::channel();
        let task = crate::support::kubelet::runtime().spawn(async move {
            let api: kube::Api<KNode> = kube::Api::all(client);
            let mut now: std::collections::BTreeMap<String, bool> = Default::default();
            let see = |n: &KNode, now: &mut std::collections::BTreeMap<String, bool>| {
                let name = n.metadata.name.clone().unwrap_or_default();
                if names.contains(&name) {
                    let u = n.spec.as_ref().and_then(|s| s.unschedulable) == Some(true);
                    now.insert(name, u);
                }
                let count = now.values().filter(|u| **u).count();
                m.fetch_max(count, std::sync::atomic::Ordering::SeqCst);
            };
            let list = api.list(&Default::default()).await.unwrap();
            for n in &list.items {
                see(n, &mut now);
            }
            let _ = ready_tx.send(());
            let mut rv = list.metadata.resource_version.unwrap_or_default();
            loop {
                let params = kube::api::WatchParams::default().timeout(60);
                let Ok(stream) = api.watch(&params, &rv).await else {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                };
                let mut stream = std::pin::pin!(stream);
                while let Some(Ok(ev)) = stream.next().await {
                    match ev {
                        kube::api::WatchEvent::Added(n) | kube::api::WatchEvent::Modified(n) => {
                            rv = n.metadata.resource_version.clone().unwrap_or(rv);
                            see(&n, &mut now);
                        }
                        kube::api::WatchEvent::Bookmark(b) => rv = b.metadata.resource_version,
                        _ => {}
                    }
                }
            }
        });
        ready.recv().unwrap();
        Self { most, task }
    }

    pub fn most(&self) -> usize {
        self.most.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Drop for Unschedulable {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Creates namespace `ns` and waits for its `default` ServiceAccount, without which the API
/// refuses pods (the controller manager creates it a moment later).
pub fn namespace(cp: &ControlPlane, ns: &str) {
    cp.apply(
        &serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
            .to_string(),
    );
    super::wait_for(&format!("the default ServiceAccount of {ns}"), || {
        cp.get_path(&format!("/api/v1/namespaces/{ns}/serviceaccounts/default"))
    });
}
