//! Git sources: keeping a clone of each configured remote up to date, checking every new head
//! (fast-forward from the deployed commit, signature policy, testing branch), and keeping a
//! checked-out tree of the accepted revision ready for whoever needs it.
//!
//! One [`Poller`] task per source fetches on `interval` (±10% jitter) or at once on a sync
//! request, backs off exponentially with jitter on failure (capped at the interval), and
//! publishes a [`SourceReport`] into the shared [`ReportMap`]. A revision is published only once
//! its tree is complete on disk. A fetch that outlives `fetch_timeout` is abandoned: the poller
//! moves on and nothing else waits for it.
//!
//! A worker (layer 5): imports `types`, `config`, `metrics`, `state`, `util`, never
//! another worker. Who else needs a source's files gets them from the daemon. Not here:
//! deciding what to apply (see `reconcile`).

pub mod auth;
pub mod git;
mod packs;
pub mod preview;
pub mod transport;
pub mod trees;
pub mod verify;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot, watch};

use crate::config::SourceConfig;
use crate::state::{self, Anchors};
use crate::types::{RefusedHead, RemoteReport, Revision, SourceReport, SourceReports};
use crate::util;

pub use git::{GitError, RemoteResult};
pub use trees::{Pin, Trees};

/// The answer to a sync request, per source.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SyncOutcome {
    pub source: String,
    pub revision: Option<Revision>,
    /// The fetch moved the accepted revision.
    pub changed: bool,
    pub error: Option<String>,
    /// `error` says why the fetched head was refused (the fetch itself worked).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub refused: bool,
}

/// How the remote `url` fared in a fetch that tried `results`.
fn remote_after(url: String, results: &[RemoteResult]) -> RemoteReport {
    let tried = results.iter().find(|r| r.url == url);
    RemoteReport {
        ok: tried.map(|r| r.error.is_none()),
        error: tried.and_then(|r| r.error.clone()),
        url,
    }
}

/// What every source's poller reports, by source name; each poller writes its own entry.
pub type ReportMap = watch::Sender<SourceReports>;

/// Requests to a poller.
#[derive(Debug)]
pub enum PollerCmd {
    /// Fetch now; answered after the fetch.
    Sync(oneshot::Sender<SyncOutcome>),
    /// Make this commit (id or prefix) the one new heads must descend from, then fetch.
    Accept(String, AcceptReply),
}

type AcceptReply = oneshot::Sender<Result<(Revision, SyncOutcome), String>>;

/// What a poller is told about its job.
#[derive(Clone, Debug, PartialEq)]
pub struct PollerConfig {
    pub source: SourceConfig,
    pub node: String,
    /// The apply loop records this source's deployments; others record them on publication.
    pub applied: bool,
}

/// The on-disk places of every source under `state_dir`, shared by pollers and the apply loop.
#[derive(Debug)]
pub struct Workspace {
    state_dir: PathBuf,
    trees: Mutex<HashMap<String, Arc<Trees>>>,
    anchors: Mutex<Anchors>,
}

impl Workspace {
    pub fn new(state_dir: PathBuf) -> Arc<Self> {
        let path = state_dir.join("anchors.json");
        let anchors = match state::load::<Anchors>(&path) {
            Ok((a, aside)) => {
                if let Some(a) = aside {
                    tracing::warn!(file = %path.display(), moved_to = %a.to.display(), reason = %a.reason,
                        "anchor file unusable; moved aside (the anchor refs in the clones remain)");
                }
                a
            }
            Err(e) => {
                tracing::warn!(file = %path.display(), error = %e, "cannot read the anchor file");
                Anchors::default()
            }
        };
        let workspace = Self {
            state_dir,
            trees: Mutex::new(HashMap::new()),
            anchors: Mutex::new(anchors),
        };
        workspace.remove_stale_locks();
        Arc::new(workspace)
    }

    /// Removes the git lock files a killed ginx left in every clone (see
    /// [`git::Clone::remove_stale_locks`]). Runs once, when the daemon starts.
    fn remove_stale_locks(&self) {
        let Ok(entries) = std::fs::read_dir(self.state_dir.join("sources")) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.contains(".broken-") || !entry.path().is_dir() {
                continue;
            }
            let removed = self.clone_of(&name).remove_stale_locks();
            if !removed.is_empty() {
                let files: Vec<String> = removed.iter().map(|p| p.display().to_string()).collect();
                tracing::warn!(source = %name, files = %files.join(", "),
                    "removed git lock files and partial packs left by an interrupted fetch");
            }
        }
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

    /// The commit new heads of `name` must descend from: the anchor ref in the clone, or its
    /// copy in `anchors.json` when the clone lost it. Blocking.
    pub fn anchor(&self, name: &str) -> Option<Revision> {
        self.clone_of(name).anchor().or_else(|| {
            self.anchors
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .anchors
                .get(name)
                .cloned()
        })
    }

    /// Makes `rev` the anchor of `name`, whatever it was (an operator's `accept`). Blocking.
    pub fn set_anchor(&self, name: &str, rev: &Revision) -> Result<(), GitError> {
        let mut anchors = self.anchors.lock().unwrap_or_else(|p| p.into_inner());
        self.write_anchor(&mut anchors, name, rev)
    }

    /// Moves the anchor of `name` forward to a deployed `rev`, only when `rev` descends from
    /// the current anchor (or there is none): a deployment that finishes after an operator's
    /// `accept` never moves the anchor back. Returns whether it moved. Blocking.
    pub fn advance_anchor(&self, name: &str, rev: &Revision) -> Result<bool, GitError> {
        let mut anchors = self.anchors.lock().unwrap_or_else(|p| p.into_inner());
        let clone = self.clone_of(name);
        let current = clone
            .anchor()
            .or_else(|| anchors.anchors.get(name).cloned());
        if let Some(current) = current
            && (current == *rev || !clone.descends(rev, &current)?)
        {
            return Ok(false);
        }
        self.write_anchor(&mut anchors, name, rev)?;
        Ok(true)
    }

    /// Records `rev` in the clone and in `anchors.json`.
    fn write_anchor(
        &self,
        anchors: &mut Anchors,
        name: &str,
        rev: &Revision,
    ) -> Result<(), GitError> {
        self.clone_of(name).set_anchor(rev)?;
        if anchors.anchors.get(name) != Some(rev) {
            anchors.anchors.insert(name.to_owned(), rev.clone());
            let path = self.state_dir.join("anchors.json");
            if let Err(e) = state::save(&path, &*anchors) {
                tracing::error!(file = %path.display(), error = %e, "cannot write the anchor file");
            }
        }
        Ok(())
    }

    /// The contents of `path` in source `name` at `rev` (read from the clone's objects, not a
    /// work tree). Blocking. This is how other parts read Argus.
    pub fn read_file(&self, name: &str, rev: &Revision, path: &Path) -> Result<Vec<u8>, GitError> {
        self.clone_of(name).read_file(rev, path)
    }
}

/// How a caller reaches a running poller.
pub struct PollerHandle {
    pub config: watch::Sender<PollerConfig>,
    pub commands: mpsc::Sender<PollerCmd>,
    pub task: tokio::task::JoinHandle<()>,
}

/// First wait after a failed fetch; doubles per failure up to the interval.
const FETCH_RETRY_BASE: Duration = Duration::from_secs(5);

/// Applies the network timeouts of libgit2 and of ginx's own transports (connect, and each read
/// or write), process-wide. Call before any fetch runs: libgit2 reads these settings without
/// synchronisation.
pub fn set_network_timeout(timeout: Duration) {
    transport::set_timeout(timeout);
    let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: called once at start-up, before any thread uses libgit2.
    unsafe {
        let _ = git2::opts::set_server_connect_timeout_in_milliseconds(ms);
        let _ = git2::opts::set_server_timeout_in_milliseconds(ms);
    }
}

/// Starts the poller of source `name`.
pub fn spawn_poller(
    name: String,
    config: PollerConfig,
    workspace: &Arc<Workspace>,
    reports: Arc<ReportMap>,
    metrics: Arc<crate::metrics::Metrics>,
    shutdown: watch::Receiver<bool>,
) -> PollerHandle {
    let (config_tx, config_rx) = watch::channel(config);
    let (cmd_tx, cmd_rx) = mpsc::channel(64);
    let poller = Poller {
        trees: workspace.trees(&name),
        workspace: Arc::clone(workspace),
        name,
        config: config_rx,
        commands: cmd_rx,
        reports,
        metrics,
        shutdown,
        head: None,
        failures: 0,
        busy: Arc::new(AtomicBool::new(false)),
    };
    PollerHandle {
        config: config_tx,
        commands: cmd_tx,
        task: tokio::spawn(poller.run()),
    }
}

struct Poller {
    name: String,
    config: watch::Receiver<PollerConfig>,
    commands: mpsc::Receiver<PollerCmd>,
    reports: Arc<ReportMap>,
    metrics: Arc<crate::metrics::Metrics>,
    workspace: Arc<Workspace>,
    trees: Arc<Trees>,
    shutdown: watch::Receiver<bool>,
    /// The published revision and the pin keeping its tree.
    head: Option<Pin>,
    /// Consecutive failed fetches.
    failures: u32,
    /// A fetch is running on a blocking thread (possibly one abandoned after its timeout).
    busy: Arc<AtomicBool>,
}

/// What one fetch produced, off the async thread.
struct Round {
    fetched: git::Fetched,
    anchor: Option<Revision>,
    refused: Option<(Revision, String)>,
    published: Option<(git::Candidate, Pin)>,
}

impl Poller {
    async fn run(mut self) {
        self.show_config();
        let mut waiters: Vec<oneshot::Sender<SyncOutcome>> = Vec::new();
        let mut accepts: Vec<(String, AcceptReply)> = Vec::new();
        loop {
            // Accepted revisions become the new base first; the fetch below then judges the
            // head against them and answers every request.
            let mut accepted = Vec::new();
            for (spec, reply) in accepts.drain(..) {
                match self.accept(spec).await {
                    Ok(rev) => accepted.push((rev, reply)),
                    Err(e) => {
                        let _ = reply.send(Err(e));
                    }
                }
            }
            let outcome = self.fetch_once().await;
            for (rev, reply) in accepted {
                let _ = reply.send(Ok((rev, outcome.clone())));
            }
            for w in waiters.drain(..) {
                let _ = w.send(outcome.clone());
            }
            let wait = self.next_wait();
            self.update(|s| s.next_fetch_at = Some(util::after(util::now(), wait)));
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                cmd = self.commands.recv() => match cmd {
                    Some(PollerCmd::Sync(w)) => waiters.push(w),
                    Some(PollerCmd::Accept(spec, reply)) => accepts.push((spec, reply)),
                    None => return,
                },
                changed = self.config.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    self.config.borrow_and_update();
                    self.failures = 0;
                    self.show_config();
                }
                _ = self.shutdown.changed() => return,
            }
            // Coalesce: every request already queued is answered by the next fetch.
            while let Ok(cmd) = self.commands.try_recv() {
                match cmd {
                    PollerCmd::Sync(w) => waiters.push(w),
                    PollerCmd::Accept(spec, reply) => accepts.push((spec, reply)),
                }
            }
            if *self.shutdown.borrow() {
                return;
            }
        }
    }

    fn show_config(&self) {
        let cfg = self.config.borrow().source.clone();
        self.update(|s| {
            let remotes = cfg.remotes();
            s.url = remotes.first().map(ToString::to_string).unwrap_or_default();
            s.branch = cfg.branch.clone();
            s.remotes = remotes
                .iter()
                .map(|u| RemoteReport {
                    url: u.to_string(),
                    ..RemoteReport::default()
                })
                .collect();
        });
    }

    fn next_wait(&self) -> Duration {
        let interval = self.config.borrow().source.interval.get();
        let base = if self.failures == 0 {
            interval
        } else {
            util::backoff(FETCH_RETRY_BASE, interval, self.failures)
        };
        util::jitter(base, 0.1)
    }

    /// Makes the revision `spec` names the deployed base of this source.
    async fn accept(&mut self, spec: String) -> Result<Revision, String> {
        let workspace = Arc::clone(&self.workspace);
        let name = self.name.clone();
        let rev = tokio::task::spawn_blocking(move || {
            let rev = workspace.clone_of(&name).resolve(&spec)?;
            workspace.set_anchor(&name, &rev)?;
            Ok::<_, GitError>(rev)
        })
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
        tracing::warn!(source = %self.name, revision = %rev, "accepted by an operator as the new base for fast-forward checks");
        self.update(|s| s.deployed = Some(rev.clone()));
        Ok(rev)
    }

    /// One fetch of the source, answered as a sync request is: on success the new head is
    /// published (or refused) and the report updated, on failure the previous revision stays.
    async fn fetch_once(&mut self) -> SyncOutcome {
        let cfg = self.config.borrow().clone();
        let previous = self.head.as_ref().map(|p| p.revision().clone());
        if self.busy.swap(true, Ordering::SeqCst) {
            return self.failed(
                previous,
                "the previous fetch is still running (a stalled remote?); it was abandoned and \
                 ginx waits for it to give up"
                    .into(),
                None,
            );
        }
        match self.run_round(&cfg, previous.is_some()).await {
            Ok(round) => self.succeeded(&cfg, previous, round),
            Err(e) => {
                let per_remote = match &e {
                    GitError::AllRemotes(r) => Some(r.clone()),
                    _ => None,
                };
                self.failed(previous, e.to_string(), per_remote)
            }
        }
    }

    /// Runs [`round`] on a blocking thread, abandoned (and told to cancel) after the source's
    /// `fetch_timeout`. `busy` is cleared when the thread ends, not when it is abandoned, so
    /// no second fetch of this clone starts while the first still runs.
    async fn run_round(&self, cfg: &PollerConfig, have_published: bool) -> Result<Round, GitError> {
        let cancel = Arc::new(AtomicBool::new(false));
        let timeout = cfg.source.fetch_timeout;
        let job = {
            let workspace = Arc::clone(&self.workspace);
            let trees = Arc::clone(&self.trees);
            let name = self.name.clone();
            let busy = Arc::clone(&self.busy);
            let cancel = Arc::clone(&cancel);
            let cfg = cfg.clone();
            tokio::task::spawn_blocking(move || {
                // Cleared however the round ends, a panic included.
                struct Idle(Arc<AtomicBool>);
                impl Drop for Idle {
                    fn drop(&mut self) {
                        self.0.store(false, Ordering::SeqCst);
                    }
                }
                let _idle = Idle(busy);
                round(&workspace, &trees, &name, &cfg, &cancel, have_published)
            })
        };
        match tokio::time::timeout(timeout.get(), job).await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => Err(GitError::Fetch {
                url: self.report().url,
                message: format!("fetch task failed: {e}"),
            }),
            Err(_) => {
                cancel.store(true, Ordering::SeqCst);
                Err(GitError::Fetch {
                    url: self.report().url,
                    message: format!(
                        "timed out after {timeout} (sources.{}.fetch_timeout)",
                        self.name
                    ),
                })
            }
        }
    }

    /// Records a fetch that worked: publishes its accepted revision, if any, and reports how
    /// every remote fared and whether the head was refused.
    fn succeeded(
        &mut self,
        cfg: &PollerConfig,
        previous: Option<Revision>,
        round: Round,
    ) -> SyncOutcome {
        let now = util::now();
        if self.failures > 0 {
            tracing::info!(source = %self.name, served_by = %round.fetched.served_by, "fetching works again");
        }
        self.failures = 0;
        let remotes: Vec<RemoteReport> = cfg
            .source
            .remotes()
            .iter()
            .map(|u| remote_after(u.to_string(), &round.fetched.remotes))
            .collect();
        let changed = match round.published {
            Some((candidate, pin)) => self.publish(previous.as_ref(), &candidate, pin),
            None => false,
        };
        let outcome = if round.refused.is_some() {
            "refused"
        } else {
            "ok"
        };
        self.metrics.fetched(&self.name, outcome, Some(now));
        let refusal = round.refused.map(|(rev, why)| RefusedHead {
            revision: rev,
            reason: why,
        });
        let error = refusal.as_ref().map(|r| r.reason.clone());
        let refused = refusal.is_some();
        self.log_refusal_change(error.as_deref());
        let served_by = round.fetched.served_by;
        let anchor = round.anchor;
        self.update(|s| {
            s.url = served_by;
            s.remotes = remotes;
            s.fetched_at = Some(now);
            s.deployed = anchor;
            s.failing_since = if error.is_some() {
                s.failing_since.or(Some(now))
            } else {
                None
            };
            s.error = error.clone();
            s.refused = refusal;
        });
        SyncOutcome {
            source: self.name.clone(),
            revision: self.head.as_ref().map(|p| p.revision().clone()),
            changed,
            error,
            refused,
        }
    }

    /// Makes `candidate`, whose tree `pin` keeps, the revision this source offers. Returns
    /// whether it differs from `previous`.
    fn publish(
        &mut self,
        previous: Option<&Revision>,
        candidate: &git::Candidate,
        pin: Pin,
    ) -> bool {
        let changed = previous != Some(&candidate.revision);
        if changed {
            tracing::info!(source = %self.name, revision = %candidate.revision.short(),
                branch = %candidate.branch, "new revision");
        }
        let tree = pin.path().to_owned();
        self.head = Some(pin);
        self.update(|s| {
            s.revision = Some(candidate.revision.clone());
            s.revision_branch = Some(candidate.branch.clone());
            s.testing = candidate.testing;
            s.signature = candidate.signed.clone();
            s.tree = Some(tree);
        });
        changed
    }

    /// One log line when the source starts or stops refusing its fetched head (`error` is the
    /// refusal now), not one per fetch.
    fn log_refusal_change(&self, error: Option<&str>) {
        let previous_error = self.report().error;
        if error == previous_error.as_deref() {
            return;
        }
        match error {
            Some(why) => {
                tracing::warn!(source = %self.name, "refusing the fetched head: {why}")
            }
            None if previous_error.is_some() => {
                tracing::info!(source = %self.name, "source healthy again")
            }
            None => {}
        }
    }

    fn failed(
        &mut self,
        previous: Option<Revision>,
        message: String,
        per_remote: Option<Vec<RemoteResult>>,
    ) -> SyncOutcome {
        let now = util::now();
        // One line per change of state, not one per retry.
        if self.report().error.as_deref() != Some(message.as_str()) {
            tracing::warn!(source = %self.name, error = %message,
                "fetch failed; keeping the previous revision and retrying with backoff");
        }
        self.failures = self.failures.saturating_add(1);
        self.metrics.fetched(&self.name, "error", None);
        let remotes_failed = message.clone();
        self.update(|s| {
            s.error = Some(message.clone());
            s.failing_since.get_or_insert(now);
            match per_remote {
                Some(results) => {
                    for r in &mut s.remotes {
                        *r = remote_after(std::mem::take(&mut r.url), &results);
                    }
                }
                None if s.remotes.len() == 1 => {
                    s.remotes[0].ok = Some(false);
                    s.remotes[0].error = Some(remotes_failed);
                }
                None => {}
            }
        });
        SyncOutcome {
            source: self.name.clone(),
            revision: previous,
            changed: false,
            error: Some(message),
            refused: false,
        }
    }

    fn report(&self) -> SourceReport {
        self.reports
            .borrow()
            .get(&self.name)
            .cloned()
            .unwrap_or_default()
    }

    fn update(&self, f: impl FnOnce(&mut SourceReport)) {
        self.reports
            .send_modify(|map| f(map.entry(self.name.clone()).or_default()));
    }
}

/// One fetch, check and checkout, on a blocking thread. A damaged clone is moved aside and the
/// round is run once more from a fresh clone.
fn round(
    workspace: &Workspace,
    trees: &Arc<Trees>,
    name: &str,
    cfg: &PollerConfig,
    cancel: &AtomicBool,
    have_published: bool,
) -> Result<Round, GitError> {
    let auth = auth::Auth::load(&cfg.source).map_err(|e| GitError::Auth(e.to_string()))?;
    let policy = verify::Policy {
        allowed_signers: cfg.source.allowed_signers_file.clone(),
        openpgp_keyring: cfg.source.openpgp_keyring_file.clone(),
    };
    let remotes = cfg.source.remotes();
    let testing = cfg.source.testing_branch_for(&cfg.node);
    let clone = workspace.clone_of(name);
    let attempt = || -> Result<Round, GitError> {
        let started = std::time::Instant::now();
        let fetched = clone.fetch(&git::FetchSpec {
            source: name,
            remotes: &remotes,
            branch: &cfg.source.branch,
            testing: testing.as_deref(),
            auth: &auth,
            cancel,
        })?;
        let anchor = workspace.anchor(name);
        let eval = clone.evaluate(
            &fetched,
            &cfg.source.branch,
            testing.as_deref(),
            anchor.as_ref(),
            &policy,
        )?;
        let candidate = match eval.accepted {
            Some(c) => Some(c),
            // Nothing acceptable and nothing offered yet (a restart): offer the deployed commit.
            None if !have_published => {
                anchor
                    .clone()
                    .filter(|a| clone.has_commit(a))
                    .map(|revision| git::Candidate {
                        revision,
                        branch: cfg.source.branch.clone(),
                        testing: false,
                        signed: None,
                    })
            }
            None => None,
        };
        let published = match candidate {
            Some(c) => {
                let fetched_in = started.elapsed();
                let pin = trees.checkout(&clone, &c.revision)?;
                tracing::debug!(source = name, ?fetched_in, ready_in = ?started.elapsed(), "tree ready");
                if let Err(e) = trees.set_current(&c.revision) {
                    tracing::warn!(error = %e, "cannot update the current-tree symlink");
                }
                Some((c, pin))
            }
            None => None,
        };
        let mut anchor = anchor;
        if !cfg.applied
            && let Some((c, _)) = &published
            && !c.testing
            && anchor.as_ref() != Some(&c.revision)
            && workspace.advance_anchor(name, &c.revision)?
        {
            anchor = Some(c.revision.clone());
        }
        Ok(Round {
            fetched,
            anchor,
            refused: eval.refused,
            published,
        })
    };
    match attempt() {
        Err(e) if e.is_corruption() => {
            let aside = clone.move_aside()?;
            tracing::warn!(source = name, error = %e, moved_to = %aside.display(),
                "the clone is damaged; moved it aside, cloning afresh");
            attempt()
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_read_from_a_revision_of_a_source() {
        let tmp = tempfile::tempdir().unwrap();
        let workspace = Workspace::new(tmp.path().join("state"));
        let clone = workspace.clone_of("argus");
        let repo = clone.open().unwrap();
        let sig = git2::Signature::now("t", "t@example.com").unwrap();
        let blob = repo.blob(b"cluster_name = \"kaas\"\n").unwrap();
        let mut inner = repo.treebuilder(None).unwrap();
        inner.insert("kubeadm.toml", blob, 0o100644).unwrap();
        let inner = inner.write().unwrap();
        let mut root = repo.treebuilder(None).unwrap();
        root.insert("clusters", inner, 0o040000).unwrap();
        let tree = repo.find_tree(root.write().unwrap()).unwrap();
        let oid = repo.commit(None, &sig, &sig, "facts", &tree, &[]).unwrap();
        let rev = Revision::from_oid(oid);

        let got = workspace
            .read_file("argus", &rev, Path::new("clusters/kubeadm.toml"))
            .unwrap();
        assert_eq!(got, b"cluster_name = \"kaas\"\n");
        let e = workspace
            .read_file("argus", &rev, Path::new("clusters/missing.toml"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("clusters/missing.toml"), "{e}");
        assert!(
            workspace
                .read_file("argus", &rev, Path::new("clusters"))
                .is_err()
        );
    }
}
