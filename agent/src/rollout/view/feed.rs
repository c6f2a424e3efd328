//! The fleet ConfigMap, watched once per node for every reader in the daemon: admission (the
//! [`View`](super::View)'s snapshot) and the answerer of plan requests (`preview`). One task
//! follows the configuration, the API clients and whether the API accepts this node, runs the
//! one reflector while it may, and hands each reflection on.
//!
//! Watched only while the node's report is accepted (`connected`): a node the API refuses (a
//! missing namespace, credentials without the rights) asks nothing more of it than the reporter
//! does. Readers then get `None` and read the ConfigMap themselves if they must (admission's
//! read before a take does).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use tokio::sync::watch;

use super::projections::{self, FleetSeen};
use crate::config::Config;
use crate::k8s::KubeClients;
use crate::k8s::reflect::{Listed, Reflection, Reflector, Source};
use crate::status::{KubeState, KubeStatus};

/// What the feed follows.
pub struct Follows {
    pub config: watch::Receiver<Arc<Config>>,
    pub clients: watch::Receiver<Option<KubeClients>>,
    pub kube: watch::Receiver<KubeStatus>,
    pub shutdown: watch::Receiver<bool>,
}

/// A reader's handle on the one watch of the fleet ConfigMap.
#[derive(Clone)]
pub struct FleetFeed {
    seen: watch::Receiver<Option<Reflection<FleetSeen>>>,
    /// Bumped when a change the projection says matters came, or the watch started or
    /// stopped: what wakes a reader.
    wakes: watch::Receiver<u64>,
}

/// The task's ends of a feed.
struct Feeds {
    seen: watch::Sender<Option<Reflection<FleetSeen>>>,
    wakes: watch::Sender<u64>,
}

impl Feeds {
    fn hand_on(&self, r: Option<Reflection<FleetSeen>>, wake: bool) {
        self.seen.send_replace(r);
        if wake {
            self.wakes.send_modify(|n| *n = n.wrapping_add(1));
        }
    }
}

impl FleetFeed {
    /// Starts the task that keeps the watch.
    pub fn spawn(follows: Follows) -> FleetFeed {
        let (seen_tx, seen) = watch::channel(None);
        let (wakes_tx, wakes) = watch::channel(0);
        let feeds = Feeds {
            seen: seen_tx,
            wakes: wakes_tx,
        };
        tokio::spawn(follow(follows, feeds));
        FleetFeed { seen, wakes }
    }

    /// A feed that never watches: for a rollout without a daemon around it (tests, benches).
    pub fn idle() -> FleetFeed {
        let (seen_tx, seen) = watch::channel(None);
        let (wakes_tx, wakes) = watch::channel(0);
        // Kept open, so that readers wait on them rather than see them closed.
        std::mem::forget((seen_tx, wakes_tx));
        FleetFeed { seen, wakes }
    }

    /// The ConfigMap as the watch holds it; `None` while nothing is watched.
    pub fn now(&self) -> Option<Reflection<FleetSeen>> {
        self.seen.borrow().clone()
    }

    /// [`now`](Self::now), once the watch listed (or failed to), waiting at most `within`.
    pub async fn first(&self, within: Duration) -> Option<Reflection<FleetSeen>> {
        let mut rx = self.seen.clone();
        let listed = rx.wait_for(|r| r.as_ref().is_none_or(|r| r.listed != Listed::NotYet));
        match tokio::time::timeout(within, listed).await {
            Ok(Ok(r)) => r.clone(),
            _ => self.now(),
        }
    }

    /// Returns when the ConfigMap (or whether it is watched) changed since this handle last
    /// looked; never, once the feed stopped.
    pub async fn changed(&mut self) {
        if self.wakes.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
        self.wakes.borrow_and_update();
    }
}

/// What a watch was started for: it is made again when that changes.
#[derive(Clone, PartialEq, Eq)]
struct Key {
    namespace: String,
    configmap: String,
    clients: usize,
}

/// The watch running: what for, the reflector, its reflections and its wake-ups as handed on.
struct Running {
    key: Key,
    reflector: Reflector<FleetSeen>,
    reflections: watch::Receiver<Reflection<FleetSeen>>,
    wakes: watch::Receiver<u64>,
}

/// What came of the running watch.
enum Came {
    Reflection(Reflection<FleetSeen>),
    Wake,
}

async fn follow(mut f: Follows, feeds: Feeds) {
    let mut running: Option<Running> = None;
    let mut generation = 0usize;
    loop {
        let cfg = Arc::clone(&f.config.borrow_and_update());
        let clients = f.clients.borrow_and_update().clone();
        let connected = f.kube.borrow_and_update().state == KubeState::Connected;
        match clients.filter(|_| connected) {
            Some(c) => {
                let key = Key {
                    namespace: cfg.kubernetes.namespace.clone(),
                    configmap: cfg.rollout.configmap.clone(),
                    clients: generation,
                };
                if running.as_ref().is_none_or(|r| r.key != key) {
                    let r = start(key, &c);
                    feeds.hand_on(Some(r.reflector.now()), true);
                    running = Some(r);
                }
            }
            None if running.is_some() => {
                running = None;
                feeds.hand_on(None, true);
            }
            None => {}
        }
        tokio::select! {
            Some(came) = next(running.as_mut()) => match came {
                Came::Reflection(r) => feeds.hand_on(Some(r), false),
                Came::Wake => feeds.hand_on(running.as_ref().map(|r| r.reflector.now()), true),
            },
            r = f.config.changed() => if r.is_err() { return },
            r = f.clients.changed() => {
                if r.is_err() { return }
                generation += 1;
            }
            r = f.kube.changed() => if r.is_err() { return },
            _ = f.shutdown.changed() => return,
        }
    }
}

/// The running watch's next reflection; `None` at once when nothing runs or it stopped.
async fn next(running: Option<&mut Running>) -> Option<Came> {
    let r = running?;
    tokio::select! {
        c = r.wakes.changed() => {
            c.ok()?;
            r.wakes.borrow_and_update();
            Some(Came::Wake)
        }
        c = r.reflections.changed() => {
            c.ok()?;
            Some(Came::Reflection(r.reflections.borrow_and_update().clone()))
        }
    }
}

fn start(key: Key, clients: &KubeClients) -> Running {
    let source = Source {
        api: kube::Api::<ConfigMap>::namespaced(clients.watch.clone(), &key.namespace),
        labels: String::new(),
        fields: Some(format!("metadata.name={}", key.configmap)),
        resource: format!("ConfigMap {}/{}", key.namespace, key.configmap),
    };
    let (wakes_tx, mut wakes) = watch::channel(0);
    wakes.borrow_and_update();
    let reflector = Reflector::start(source, projections::FLEET, wakes_tx);
    let mut reflections = reflector.subscribe();
    reflections.borrow_and_update();
    Running {
        key,
        reflector,
        reflections,
        wakes,
    }
}
