//! What a test of ginx nodes on the shared control plane starts from, and the one way their
//! configuration is written.
//!
//! - [`TestFleet`]: the shared control plane (or a skip where it cannot run outside CI), the
//!   [`RbacGuard`] that fails the test when a node's request was refused, the origin repository
//!   the nodes fetch from, and the journal their gates and activations write. A test opens
//!   with `let Some((cp, mut rbac, origin, journal)) = TestFleet::open() else { return; };`.
//! - [`NodeToml`]: a node's configuration as a TOML table built key by key
//!   (`set("rollout.soak", "4s")`) or merged from a fragment, written as one drop-in. A key set
//!   twice keeps the last value instead of making the file invalid, and strings are quoted by
//!   the serializer, not by hand.
//! - [`use_cluster`]: a node of the control plane with ginx's own identity, fast renewals and
//!   every probe off.

use std::path::{Path, PathBuf};

use super::Env;
use super::control_plane::{self, ControlPlane, RbacGuard};

/// A fleet test's common parts. Fields are public so that a test destructures what it uses.
pub struct TestFleet {
    pub cp: &'static ControlPlane,
    pub rbac: RbacGuard<'static>,
    pub origin: Env,
    pub journal: PathBuf,
}

impl TestFleet {
    /// `None` where the control plane cannot run (outside CI, with its binaries missing): the
    /// test returns, having said why.
    pub fn new() -> Option<TestFleet> {
        let cp = control_plane::shared()?;
        let origin = Env::new();
        let journal = origin.root.join("journal");
        Some(TestFleet {
            cp,
            rbac: RbacGuard::new(cp),
            origin,
            journal,
        })
    }

    /// [`TestFleet::new`] in parts, in the order a test names them.
    #[allow(clippy::type_complexity)]
    pub fn open() -> Option<(&'static ControlPlane, RbacGuard<'static>, Env, PathBuf)> {
        TestFleet::new().map(|f| (f.cp, f.rbac, f.origin, f.journal))
    }
}

/// A node's configuration, as a TOML table.
#[derive(Default)]
pub struct NodeToml(toml::Table);

impl NodeToml {
    pub fn new() -> NodeToml {
        NodeToml::default()
    }

    /// Sets the dotted `key` (`"rollout.gate.settle"`), making the tables on the way.
    pub fn set(mut self, key: &str, value: impl Into<toml::Value>) -> NodeToml {
        let mut parts: Vec<&str> = key.split('.').collect();
        let last = parts.pop().expect("a key");
        let mut table = &mut self.0;
        for part in parts {
            table = table
                .entry(part)
                .or_insert_with(|| toml::Value::Table(toml::Table::new()))
                .as_table_mut()
                .unwrap_or_else(|| panic!("{key}: {part} is not a table"));
        }
        table.insert(last.to_owned(), value.into());
        self
    }

    /// Merges `fragment`, TOML whose bare keys belong to the table `under` (`""` for the
    /// top): what it sets wins over what was set before.
    pub fn merge(mut self, under: &str, fragment: &str) -> NodeToml {
        let text = if under.is_empty() {
            fragment.to_owned()
        } else {
            format!("[{under}]\n{fragment}")
        };
        let parsed: toml::Table = text
            .parse()
            .unwrap_or_else(|e| panic!("a test's TOML fragment does not parse: {e}\n{text}"));
        merge_into(&mut self.0, parsed);
        self
    }

    /// A gate command of `sh -c` words: `[rollout.gate]` with a quick settle and interval.
    pub fn gate(self, words: &str) -> NodeToml {
        self.set("rollout.gate.settle", "1s")
            .set("rollout.gate.interval", "200ms")
            .set("rollout.gate.command", vec!["sh", "-c", words])
    }

    /// Writes the table as `env`'s drop-in `name`.
    pub fn write(&self, env: &Env, name: &str) {
        let text = toml::to_string(&self.0).expect("a TOML table serializes");
        env.dropin(name, &text);
    }
}

fn merge_into(into: &mut toml::Table, from: toml::Table) {
    for (k, v) in from {
        match (into.get_mut(&k), v) {
            (Some(toml::Value::Table(old)), toml::Value::Table(new)) => merge_into(old, new),
            (_, v) => {
                into.insert(k, v);
            }
        }
    }
}

/// A node `name` of rollout `group` with the `role`, the slot Lease lock (5 s Leases), its
/// Node's readiness probed, and a gate that writes each look into `journal`.
pub fn in_group(name: &str, role: &str, group: &str, journal: &Path) -> NodeToml {
    NodeToml::new()
        .set("node.role", role)
        .set("health.node_ready.enabled", true)
        .set("rollout.lock", "auto")
        .set("rollout.group", group)
        .set("rollout.lease_duration", "5s")
        .gate(&super::gate_writes(name, journal))
}

/// The probes a node of these tests runs: none, at a quick interval.
pub fn probes_off(node_ready: bool) -> NodeToml {
    NodeToml::new()
        .set("health.interval", "200ms")
        .set("health.kubelet.enabled", false)
        .set("health.apiserver.enabled", false)
        .set("health.cilium.enabled", false)
        .set("health.systemd.enabled", false)
        .set("health.node_ready.enabled", node_ready)
}

/// Points `env`'s ginx at `kubeconfig` with fast renewals and every probe off; `extra` is TOML
/// for `[kubernetes]`. The rollout lock is off in a drop-in a later one overrides: a test of
/// reporting alone is not given the RBAC of a rollout.
pub fn kube_dropin(env: &Env, kubeconfig: &Path, extra: &str) {
    probes_off(false)
        .set("kubernetes.kubeconfig", kubeconfig.display().to_string())
        .set("kubernetes.renew_interval", "200ms")
        .set("kubernetes.resync_interval", "1h")
        .merge("kubernetes", extra)
        .write(env, "70-kube.toml");
    NodeToml::new()
        .set("rollout.lock", "none")
        .write(env, "65-rollout-off.toml");
}

/// Makes `env`'s ginx the node `node` of the real control plane, with ginx's own identity
/// (`CN=ginx:<node>`, `O=ginx:nodes`), fast renewals and every probe off. Returns the path of
/// its kubeconfig.
pub fn use_cluster(env: &Env, cp: &ControlPlane, node: &str, extra: &str) -> PathBuf {
    NodeToml::new()
        .set("node.name", node)
        .write(env, "10-node.toml");
    let kc = env.root.join("kubeconfig");
    cp.ginx_kubeconfig(&kc, node);
    kube_dropin(env, &kc, extra);
    kc
}

/// Fetches from `origin`'s repository.
pub fn fetch_from(env: &Env, origin: &Path) {
    NodeToml::new()
        .set("sources.hephaestus.url", origin.display().to_string())
        .write(env, "20-remote.toml");
}

#[test]
fn a_key_set_twice_keeps_the_last_and_a_fragment_merges_into_its_table() {
    let t = NodeToml::new()
        .set("rollout.lock", "auto")
        .set("rollout.gate.settle", "1s")
        .merge(
            "rollout",
            "lock = \"none\"\nmax_concurrent = 2\n[rollout.gate]\ninterval = \"2s\"",
        )
        .set("rollout.lock", "auto");
    let text = toml::to_string(&t.0).unwrap();
    let back: toml::Table = text.parse().unwrap();
    assert_eq!(back["rollout"]["lock"].as_str(), Some("auto"));
    assert_eq!(back["rollout"]["max_concurrent"].as_integer(), Some(2));
    assert_eq!(back["rollout"]["gate"]["settle"].as_str(), Some("1s"));
    assert_eq!(back["rollout"]["gate"]["interval"].as_str(), Some("2s"));
}
