//! The rollout's read model: what the guards read of the cluster, each kind watched once by
//! this node through a [`Reflector`] and handed out as one immutable [`Snapshot`]. No guard
//! lists or watches by itself; it answers from the snapshot, as a pure function.
//!
//! - the fleet state (the `ginx-rollout` ConfigMap), decoded: watched once for the whole
//!   daemon by the [`FleetFeed`] (the plan requests' answerer reads the same watch), while the
//!   API accepts the node;
//! - the heartbeat Leases (every node's group, the revision it passed, its renewal): watched
//!   while a guard that reads them waits (`rollout.after`, canaries), since every renewal of
//!   every node is an event, too many to follow all the time in a large fleet;
//! - the Nodes (their labels, Ready, the annotations ginx writes on them): watched while
//!   `rollout.order` or `rollout.first_selector` asks.
//!
//! What is kept of each object is a few fields ([`Heartbeat`], [`NodeFacts`]), not the object.
//! Owns the watches' lifetimes and the projections; not what the guards decide of them.

pub mod feed;
pub mod projections;

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use tokio::sync::watch;

use crate::config::Config;
use crate::k8s::KubeClients;
use crate::k8s::reflect::{Reflection, Reflector, Source};
use crate::rollout::fleet::state::FleetState;
pub use feed::FleetFeed;
pub use projections::{FleetSeen, Heartbeat, NodeFacts};

/// The read model at one moment: each part as its reflector last saw it (empty and
/// [`NotYet`](crate::k8s::reflect::Listed::NotYet) when it is not watched).
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub fleet: Reflection<FleetSeen>,
    pub heartbeats: Reflection<Heartbeat>,
    pub nodes: Reflection<NodeFacts>,
}

impl Snapshot {
    /// The fleet state, once its ConfigMap was listed (none there: the empty state).
    pub fn fleet_state(&self, configmap: &str) -> Option<FleetState> {
        self.fleet.current().ok().map(|m| {
            m.get(configmap)
                .map(|f| f.state.clone())
                .unwrap_or_default()
        })
    }
}

/// What a watch was started for: it is made again when that changes.
#[derive(Clone, PartialEq, Eq)]
struct Key {
    namespace: String,
    configmap: String,
    clients: usize,
}

/// The reflectors this node runs, started when first needed, stopped when dropped.
pub struct View {
    changes: watch::Sender<u64>,
    fleet: FleetFeed,
    heartbeats: Option<(Key, Reflector<Heartbeat>)>,
    nodes: Option<(Key, Reflector<NodeFacts>)>,
}

/// The longest a guard waits for a reflector's first list before it answers with what it has
/// (nothing: the API is then as good as unavailable).
pub const FIRST_LIST: Duration = Duration::from_secs(10);

impl View {
    /// A change any reflector says matters bumps `changes`; the fleet state is `fleet`'s.
    pub fn new(changes: watch::Sender<u64>, fleet: FleetFeed) -> Self {
        View {
            changes,
            fleet,
            heartbeats: None,
            nodes: None,
        }
    }

    /// The snapshot of what is watched now.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            fleet: self.fleet.now().unwrap_or_default(),
            heartbeats: self
                .heartbeats
                .as_ref()
                .map(|(_, r)| r.now())
                .unwrap_or_default(),
            nodes: self
                .nodes
                .as_ref()
                .map(|(_, r)| r.now())
                .unwrap_or_default(),
        }
    }

    /// Returns when the fleet state changed (or whether it is watched).
    pub async fn fleet_changed(&mut self) {
        self.fleet.changed().await;
    }

    /// Watches the heartbeat Leases while `heartbeats`, the Nodes while `nodes`; stops each
    /// when not.
    pub fn watch_guards(
        &mut self,
        (heartbeats, nodes): (bool, bool),
        cfg: &Config,
        clients: &KubeClients,
        generation: usize,
    ) {
        let key = key(cfg, generation);
        let changes = &self.changes;
        keep(&mut self.heartbeats, heartbeats, &key, || {
            let source = Source {
                api: kube::Api::<Lease>::namespaced(clients.watch.clone(), &key.namespace),
                labels: crate::k8s::HEARTBEAT_GROUP_LABEL.to_owned(),
                fields: None,
                resource: format!("leases in namespace {}", key.namespace),
            };
            Reflector::start(source, projections::HEARTBEATS, changes.clone())
        });
        keep(&mut self.nodes, nodes, &key, || {
            let source = Source {
                api: kube::Api::<Node>::all(clients.watch.clone()),
                labels: String::new(),
                fields: None,
                resource: "nodes".to_owned(),
            };
            Reflector::start(source, projections::NODES, changes.clone())
        });
    }

    /// Stops the watches only the guards read (heartbeats, Nodes): once a node was let go,
    /// nothing waits on them. (Not before: a node that waits for a slot looks again, and a
    /// watch made again at each look would cost more than the list it replaced.)
    pub fn stop_guards(&mut self) {
        self.heartbeats = None;
        self.nodes = None;
    }

    /// The snapshot once every watched part listed (or failed to), waiting at most
    /// [`FIRST_LIST`] for each.
    pub async fn listed(&self) -> Snapshot {
        Snapshot {
            fleet: self.fleet.first(FIRST_LIST).await.unwrap_or_default(),
            heartbeats: match &self.heartbeats {
                Some((_, r)) => r.first(FIRST_LIST).await,
                None => Reflection::default(),
            },
            nodes: match &self.nodes {
                Some((_, r)) => r.first(FIRST_LIST).await,
                None => Reflection::default(),
            },
        }
    }
}

/// Keeps `slot` running for `key` while `wanted`: started (again, when the key changed) by
/// `start`, dropped (stopped) when not wanted.
fn keep<V>(
    slot: &mut Option<(Key, Reflector<V>)>,
    wanted: bool,
    key: &Key,
    start: impl FnOnce() -> Reflector<V>,
) {
    if !wanted {
        *slot = None;
    } else if slot.as_ref().is_none_or(|(k, _)| k != key) {
        *slot = Some((key.clone(), start()));
    }
}

fn key(cfg: &Config, generation: usize) -> Key {
    Key {
        namespace: cfg.kubernetes.namespace.clone(),
        configmap: cfg.rollout.configmap.clone(),
        clients: generation,
    }
}
