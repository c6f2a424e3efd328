//! Git sources: keeping a clone of each configured remote up to date, and a checked-out tree of
//! its head ready for whoever needs it.
//!
//! One [`Poller`] task per source fetches on `interval` (±10% jitter) or at once on a sync
//! request, backs off exponentially on failure (capped at the interval), and publishes a
//! [`SourceStatus`] into the shared status map. A revision is published only once its tree is
//! complete on disk.
//!
//! Not here: deciding what to apply (see `reconcile`).

pub mod git;
mod remote;
pub mod trees;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot, watch};

use crate::config::SourceConfig;
use crate::util;

pub use git::GitError;
pub use remote::{RemoteUrl, Revision, Transport};
pub use trees::{Pin, Trees};

/// What `ginxctl status` shows for a source.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SourceStatus {
    /// Without credentials.
    pub url: String,
    pub branch: String,
    /// The head of `branch` at the last successful fetch whose tree is checked out.
    pub revision: Option<Revision>,
    /// When a fetch last succeeded.
    pub fetched_at: Option<Timestamp>,
    /// Why the last fetch failed; `None` once one succeeds.
    pub error: Option<String>,
    /// When the current run of failures began.
    pub failing_since: Option<Timestamp>,
    /// When the next scheduled fetch is due.
    pub next_fetch_at: Option<Timestamp>,
    /// The checked-out tree of `revision`.
    pub tree: Option<PathBuf>,
}

/// The answer to a sync request, per source.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SyncOutcome {
    pub source: String,
    pub revision: Option<Revision>,
    /// The fetch moved the head.
    pub changed: bool,
    pub error: Option<String>,
}

/// Statuses of all sources, by name; every poller writes its own entry.
pub type StatusMap = watch::Sender<BTreeMap<String, SourceStatus>>;

/// The on-disk places of every source under `state_dir`, shared by pollers and the reconciler.
#[derive(Debug)]
pub struct Workspace {
    state_dir: PathBuf,
    trees: Mutex<HashMap<String, Arc<Trees>>>,
}

impl Workspace {
    pub fn new(state_dir: PathBuf) -> Arc<Self> {
        Arc::new(Self {
            state_dir,
            trees: Mutex::new(HashMap::new()),
        })
    }

    pub fn clone_of(&self, name: &str) -> git::Clone {
        git::Clone::new(self.state_dir.join("sources").join(name))
    }

    pub fn trees(&self, name: &str) -> Arc<Trees> {
        let mut map = self.trees.lock().unwrap_or_else(|p| p.into_inner());
        Arc::clone(
            map.entry(name.to_owned())
                .or_insert_with(|| Trees::new(self.state_dir.join("trees").join(name))),
        )
    }
}

/// How a caller reaches a running poller.
pub struct PollerHandle {
    pub config: watch::Sender<SourceConfig>,
    pub sync: mpsc::Sender<oneshot::Sender<SyncOutcome>>,
    pub task: tokio::task::JoinHandle<()>,
}

/// First wait after a failed fetch; doubles per failure up to the interval.
const FETCH_RETRY_BASE: Duration = Duration::from_secs(5);

/// Starts the poller of source `name`.
pub fn spawn_poller(
    name: String,
    config: SourceConfig,
    workspace: &Arc<Workspace>,
    statuses: Arc<StatusMap>,
    shutdown: watch::Receiver<bool>,
) -> PollerHandle {
    let (config_tx, config_rx) = watch::channel(config);
    let (sync_tx, sync_rx) = mpsc::channel(64);
    let poller = Poller {
        clone: Arc::new(workspace.clone_of(&name)),
        trees: workspace.trees(&name),
        name,
        config: config_rx,
        sync: sync_rx,
        statuses,
        shutdown,
        head: None,
        failures: 0,
    };
    PollerHandle {
        config: config_tx,
        sync: sync_tx,
        task: tokio::spawn(poller.run()),
    }
}

struct Poller {
    name: String,
    config: watch::Receiver<SourceConfig>,
    sync: mpsc::Receiver<oneshot::Sender<SyncOutcome>>,
    statuses: Arc<StatusMap>,
    clone: Arc<git::Clone>,
    trees: Arc<Trees>,
    shutdown: watch::Receiver<bool>,
    /// The published head and the pin keeping its tree.
    head: Option<Pin>,
    /// Consecutive failed fetches.
    failures: u32,
}

impl Poller {
    async fn run(mut self) {
        let cfg = self.config.borrow().clone();
        self.update(|s| {
            s.url = cfg.url.to_string();
            s.branch = cfg.branch.clone();
        });
        let mut waiters: Vec<oneshot::Sender<SyncOutcome>> = Vec::new();
        loop {
            let outcome = self.fetch_once().await;
            for w in waiters.drain(..) {
                let _ = w.send(outcome.clone());
            }
            let wait = self.next_wait();
            let due = util::after(util::now(), wait);
            self.update(|s| s.next_fetch_at = Some(due));
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                req = self.sync.recv() => match req {
                    Some(w) => waiters.push(w),
                    None => return,
                },
                changed = self.config.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    let cfg = self.config.borrow_and_update().clone();
                    self.failures = 0;
                    self.update(|s| {
                        s.url = cfg.url.to_string();
                        s.branch = cfg.branch.clone();
                    });
                }
                _ = self.shutdown.changed() => return,
            }
            // Coalesce: every request already queued is answered by the next fetch.
            while let Ok(w) = self.sync.try_recv() {
                waiters.push(w);
            }
            if *self.shutdown.borrow() {
                return;
            }
        }
    }

    fn next_wait(&self) -> Duration {
        let interval = self.config.borrow().interval.get();
        let base = if self.failures == 0 {
            interval
        } else {
            util::backoff(FETCH_RETRY_BASE, interval, self.failures)
        };
        util::jitter(base, 0.1)
    }

    async fn fetch_once(&mut self) -> SyncOutcome {
        let cfg = self.config.borrow().clone();
        let clone = Arc::clone(&self.clone);
        let trees = Arc::clone(&self.trees);
        let previous = self.head.as_ref().map(|p| p.revision().clone());
        let result = tokio::task::spawn_blocking(move || {
            let rev = clone.fetch(&cfg.url, &cfg.branch)?;
            let pin = trees.checkout(&clone, &rev)?;
            if let Err(e) = trees.set_current(&rev) {
                tracing::warn!(error = %e, "cannot update the current-tree symlink");
            }
            Ok::<_, GitError>((rev, pin))
        })
        .await
        .unwrap_or_else(|e| {
            Err(GitError::Fetch {
                url: self.config.borrow().url.to_string(),
                message: format!("fetch task failed: {e}"),
            })
        });
        let now = util::now();
        match result {
            Ok((rev, pin)) => {
                let changed = previous.as_ref() != Some(&rev);
                if self.failures > 0 {
                    tracing::info!(source = %self.name, revision = %rev.short(), "fetching works again");
                }
                if changed {
                    tracing::info!(source = %self.name, revision = %rev.short(), "new revision");
                }
                self.failures = 0;
                let tree = pin.path().to_owned();
                self.head = Some(pin);
                self.update(|s| {
                    s.revision = Some(rev.clone());
                    s.fetched_at = Some(now);
                    s.error = None;
                    s.failing_since = None;
                    s.tree = Some(tree);
                });
                SyncOutcome {
                    source: self.name.clone(),
                    revision: Some(rev),
                    changed,
                    error: None,
                }
            }
            Err(e) => {
                let message = e.to_string();
                let same = self
                    .statuses
                    .borrow()
                    .get(&self.name)
                    .and_then(|s| s.error.clone())
                    == Some(message.clone());
                // One line per change of state, not one per retry.
                if !same {
                    tracing::warn!(source = %self.name, error = %message, "fetch failed; keeping the previous revision and retrying with backoff");
                }
                self.failures = self.failures.saturating_add(1);
                self.update(|s| {
                    s.error = Some(message.clone());
                    s.failing_since.get_or_insert(now);
                });
                SyncOutcome {
                    source: self.name.clone(),
                    revision: previous,
                    changed: false,
                    error: Some(message),
                }
            }
        }
    }

    fn update(&self, f: impl FnOnce(&mut SourceStatus)) {
        self.statuses
            .send_modify(|map| f(map.entry(self.name.clone()).or_default()));
    }
}
