//! Blocking Git operations with git2: the bare clone under `<state_dir>/sources/<name>`, fetches
//! of the tracked branches from one of several remotes, the checks a new head must pass, the
//! anchor ref that keeps force-push protection across a lost state file, and reading files at a
//! revision. Called from `spawn_blocking`.
//!
//! Messages never contain the configured URL as written (it may carry credentials): they name
//! the remote by its redacted form, and libgit2's messages pass through [`RemoteUrl::scrub`],
//! which replaces the whole URL as written, before they leave this module.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use git2::{AutotagOption, ErrorClass, FetchOptions, Repository, RepositoryInitOptions};
use serde::{Deserialize, Serialize};

use super::auth::Auth;
use super::verify::Policy;
use crate::types::{AcceptedSignature, RemoteUrl, Revision};

/// Where ginx keeps the last deployed (or accepted) commit of the tracked branch. New heads
/// must descend from it.
pub const ANCHOR_REF: &str = "refs/ginx/deployed";

#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum GitError {
    #[error("cannot create or open the clone at {}: {message}", path.display())]
    Clone { path: PathBuf, message: String },
    #[error("fetching {url}: {message}")]
    Fetch { url: String, message: String },
    #[error("branch {branch:?} does not exist at {url}; check sources.{name}.branch")]
    NoBranch {
        /// The source's name in the configuration.
        name: String,
        branch: String,
        url: String,
    },
    #[error("all {} remotes failed: {}", .0.len(), .0.iter().map(|r| format!("{}: {}", r.url, r.error.as_deref().unwrap_or("?"))).collect::<Vec<_>>().join("; "))]
    AllRemotes(Vec<RemoteResult>),
    #[error("source {name}: the local path {} does not exist; create the repository there \
             or correct sources.{name}.url", path.display())]
    NoPath { name: String, path: PathBuf },
    #[error("fetch cancelled")]
    Cancelled,
    #[error("reading commit {revision}: {message}")]
    Read { revision: String, message: String },
    #[error("{0}")]
    Auth(String),
}

impl GitError {
    /// Whether the error points at a damaged clone rather than the network or the remote.
    pub fn is_corruption(&self) -> bool {
        match self {
            GitError::Clone { .. } => false,
            GitError::Read { message, .. } | GitError::Fetch { message, .. } => {
                message.starts_with(CORRUPT)
            }
            _ => false,
        }
    }
}

/// Prefix of messages classified as local corruption.
const CORRUPT: &str = "the local clone is damaged: ";

/// How one remote fared in a fetch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteResult {
    /// Without credentials.
    pub url: String,
    /// `None` when this remote served the fetch.
    pub error: Option<String>,
}

/// The heads a fetch found.
#[derive(Clone, Debug)]
pub struct Fetched {
    pub main: Revision,
    pub testing: Option<Revision>,
    /// The remote that served, without credentials.
    pub served_by: String,
    /// Every remote tried, in order.
    pub remotes: Vec<RemoteResult>,
}

/// What to fetch.
pub struct FetchSpec<'a> {
    /// The source's name, for messages that point at its configuration.
    pub source: &'a str,
    pub remotes: &'a [RemoteUrl],
    pub branch: &'a str,
    pub testing: Option<&'a str>,
    pub auth: &'a Auth,
    pub cancel: &'a AtomicBool,
}

/// The revision a source offers after the checks, and why others were refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Evaluation {
    pub accepted: Option<Candidate>,
    /// The head that was refused and why (history rewritten, behind, bad signature).
    pub refused: Option<(Revision, String)>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub revision: Revision,
    pub branch: String,
    pub testing: bool,
    pub signed: Option<AcceptedSignature>,
}

/// The clone of one source.
pub struct Clone {
    pub dir: PathBuf,
}

impl Clone {
    pub fn new(dir: PathBuf) -> Self {
        Self { dir }
    }

    /// Opens the bare clone, creating it when missing. A directory git cannot open is moved
    /// aside and a fresh clone started.
    pub fn open(&self) -> Result<Repository, GitError> {
        if self.dir.exists() {
            match Repository::open_bare(&self.dir) {
                Ok(repo) => return Ok(repo),
                Err(e) => {
                    tracing::warn!(clone = %self.dir.display(), error = e.message(),
                        "clone cannot be opened; moving it aside and cloning afresh");
                    self.move_aside()?;
                }
            }
        }
        if let Some(parent) = self.dir.parent() {
            std::fs::create_dir_all(parent).map_err(|io| GitError::Clone {
                path: self.dir.clone(),
                message: io.to_string(),
            })?;
        }
        let mut opts = RepositoryInitOptions::new();
        opts.bare(true).mkpath(true);
        Repository::init_opts(&self.dir, &opts).map_err(|e| GitError::Clone {
            path: self.dir.clone(),
            message: e.message().to_owned(),
        })
    }

    /// Removes the lock files a killed ginx left in the clone: `*.lock` at the top of the git
    /// directory (`HEAD.lock`, `packed-refs.lock`, `config.lock`, `shallow.lock`, …) and under
    /// `refs/`. libgit2 refuses to update a ref whose lock file exists, so one left by a
    /// SIGKILL in the middle of a fetch would fail every later fetch of the source. Call it
    /// only at start, before this process fetches, while ginx holds the state_dir lock (so no
    /// other ginx uses the clone). Also removes what the killed fetch was writing in
    /// `objects/pack`: the partial pack (`pack_git2_*`, libgit2's temporary name), its index's
    /// lock file, and an index whose pack never got into place, which nothing else would ever
    /// remove. Returns the files removed.
    pub fn remove_stale_locks(&self) -> Vec<PathBuf> {
        fn walk(dir: &Path, recurse: bool, removed: &mut Vec<PathBuf>) {
            let Ok(entries) = std::fs::read_dir(dir) else {
                return;
            };
            for entry in entries.flatten() {
                let path = entry.path();
                let Ok(kind) = entry.file_type() else {
                    continue;
                };
                if kind.is_dir() {
                    if recurse {
                        walk(&path, true, removed);
                    }
                } else if path.extension().is_some_and(|e| e == "lock")
                    && std::fs::remove_file(&path).is_ok()
                {
                    removed.push(path);
                }
            }
        }
        let mut removed = Vec::new();
        walk(&self.dir, false, &mut removed);
        walk(&self.dir.join("refs"), true, &mut removed);
        if let Ok(entries) = std::fs::read_dir(self.dir.join("objects/pack")) {
            for entry in entries.flatten() {
                let name = entry.file_name();
                let name = name.to_string_lossy();
                // An index renamed into place before its pack was: no pack to go with it.
                let orphan = name.strip_suffix(".idx").is_some_and(|stem| {
                    !self.dir.join(format!("objects/pack/{stem}.pack")).exists()
                });
                let partial = name.starts_with("pack_git2_") || name.ends_with(".lock") || orphan;
                if partial
                    && entry.file_type().is_ok_and(|t| t.is_file())
                    && std::fs::remove_file(entry.path()).is_ok()
                {
                    removed.push(entry.path());
                }
            }
        }
        removed
    }

    /// Opens the clone for reading or updating refs; never creates or moves anything (only
    /// a fetch does that).
    pub fn open_existing(&self) -> Result<Repository, GitError> {
        Repository::open_bare(&self.dir).map_err(|e| GitError::Clone {
            path: self.dir.clone(),
            message: e.message().to_owned(),
        })
    }

    /// Moves a damaged clone to `<dir>.broken-<timestamp>` for inspection, keeping only the
    /// newest such copy.
    pub fn move_aside(&self) -> Result<PathBuf, GitError> {
        let stamp = jiff::Timestamp::now()
            .strftime("%Y%m%dT%H%M%SZ")
            .to_string();
        let name = self
            .dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if let Some(parent) = self.dir.parent()
            && let Ok(entries) = std::fs::read_dir(parent)
        {
            for e in entries.flatten() {
                if e.file_name()
                    .to_string_lossy()
                    .starts_with(&format!("{name}.broken-"))
                {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
        let mut aside = self.dir.as_os_str().to_owned();
        aside.push(format!(".broken-{stamp}"));
        let aside = PathBuf::from(aside);
        std::fs::rename(&self.dir, &aside).map_err(|io| GitError::Clone {
            path: self.dir.clone(),
            message: format!("cannot move it aside: {io}"),
        })?;
        Ok(aside)
    }

    /// Fetches the tracked branches from the first remote that answers. Only those branches
    /// are fetched, without tags; objects already present are not downloaded again.
    pub fn fetch(&self, spec: &FetchSpec<'_>) -> Result<Fetched, GitError> {
        let repo = self.open()?;
        let mut results = Vec::new();
        let mut last_error = None;
        for url in spec.remotes {
            if spec.cancel.load(Ordering::Relaxed) {
                return Err(GitError::Cancelled);
            }
            match fetch_one(&repo, url, spec) {
                Ok((main, testing)) => {
                    drop(repo);
                    self.compact_if_needed(spec.source);
                    results.push(RemoteResult {
                        url: url.to_string(),
                        error: None,
                    });
                    return Ok(Fetched {
                        main,
                        testing,
                        served_by: url.to_string(),
                        remotes: results,
                    });
                }
                Err(e) if e.is_corruption() => return Err(e),
                Err(e) => {
                    results.push(RemoteResult {
                        url: url.to_string(),
                        error: Some(e.to_string()),
                    });
                    last_error = Some(e);
                }
            }
        }
        match (results.len(), last_error) {
            (1, Some(e)) => Err(e),
            _ => Err(GitError::AllRemotes(results)),
        }
    }

    /// Decides which revision to offer: the main head if it descends from the anchor, the
    /// testing head if it descends from the main head, each only with a valid signature when
    /// `policy` requires one.
    pub fn evaluate(
        &self,
        fetched: &Fetched,
        branch: &str,
        testing_branch: Option<&str>,
        anchor: Option<&Revision>,
        policy: &Policy,
    ) -> Result<Evaluation, GitError> {
        let repo = self.open_existing()?;
        let main = &fetched.main;
        if let Some(anchor) = anchor
            && anchor != main
        {
            let refused = |why: String| {
                Ok(Evaluation {
                    accepted: None,
                    refused: Some((main.clone(), why)),
                })
            };
            match descends(&repo, main, anchor) {
                Ok(true) => {}
                Ok(false) if descends(&repo, anchor, main).unwrap_or(false) => {
                    return refused(format!(
                        "branch {branch} at {main} is behind the deployed revision {anchor}; \
                         keeping {anchor}"
                    ));
                }
                Ok(false) => {
                    return refused(format!(
                        "history rewritten: {main} does not descend from {anchor}; \
                         `ginxctl accept` it to move on"
                    ));
                }
                Err(e) => {
                    // The clone's own anchor ref names a commit the clone lost: damage, not a
                    // rewrite. (A copy from anchors.json may name a commit a fresh clone never
                    // had: that is a rewrite.)
                    if repo.refname_to_id(ANCHOR_REF).ok() == Some(anchor.oid()) {
                        return Err(read_error(anchor, &e));
                    }
                    return refused(format!(
                        "history rewritten: {main} does not descend from {anchor} (the deployed \
                         commit is no longer in the repository); `ginxctl accept` it to move on"
                    ));
                }
            }
        }
        let mut refused = None;
        if let (Some(t), Some(tb)) = (&fetched.testing, testing_branch)
            && t != main
            && descends(&repo, t, main).unwrap_or(false)
        {
            match sign_check(&repo, t, policy) {
                Ok(signed) => {
                    return Ok(Evaluation {
                        accepted: Some(Candidate {
                            revision: t.clone(),
                            branch: tb.to_owned(),
                            testing: true,
                            signed,
                        }),
                        refused: None,
                    });
                }
                Err(why) => refused = Some((t.clone(), why)),
            }
        }
        match sign_check(&repo, main, policy) {
            Ok(signed) => Ok(Evaluation {
                accepted: Some(Candidate {
                    revision: main.clone(),
                    branch: branch.to_owned(),
                    testing: false,
                    signed,
                }),
                refused,
            }),
            Err(why) => Ok(Evaluation {
                accepted: None,
                refused: Some((main.clone(), why)),
            }),
        }
    }

    /// The anchor recorded in the clone, if any.
    pub fn anchor(&self) -> Option<Revision> {
        let repo = Repository::open_bare(&self.dir).ok()?;
        let oid = repo.refname_to_id(ANCHOR_REF).ok()?;
        Some(Revision::from_oid(oid))
    }

    /// Records `rev` as the anchor; fails when the clone does not have that commit.
    pub fn set_anchor(&self, rev: &Revision) -> Result<(), GitError> {
        let repo = self.open_existing()?;
        repo.find_commit(rev.oid())
            .map_err(|e| read_error(rev, &e))?;
        repo.reference(ANCHOR_REF, rev.oid(), true, "ginx: deployed")
            .map(|_| ())
            .map_err(|e| read_error(rev, &e))
    }

    /// Whether the clone has commit `rev`.
    pub fn has_commit(&self, rev: &Revision) -> bool {
        Repository::open_bare(&self.dir).is_ok_and(|r| r.find_commit(rev.oid()).is_ok())
    }

    /// Whether `new` is `old` or descends from it; an error when `old` is not in the clone.
    pub fn descends(&self, new: &Revision, old: &Revision) -> Result<bool, GitError> {
        let repo = self.open_existing()?;
        descends(&repo, new, old).map_err(|e| read_error(old, &e))
    }

    /// Resolves a revision an operator typed (full id or unambiguous prefix) to a commit.
    pub fn resolve(&self, spec: &str) -> Result<Revision, GitError> {
        let repo = self.open_existing()?;
        let fail = |m: String| GitError::Read {
            revision: spec.to_owned(),
            message: m,
        };
        if !(4..=64).contains(&spec.len()) || !spec.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(fail("give a commit id (hex, at least 4 digits)".into()));
        }
        let object = repo
            .revparse_single(spec)
            .map_err(|e| fail(format!("not in the clone: {}", e.message())))?;
        let commit = object
            .peel_to_commit()
            .map_err(|e| fail(format!("not a commit: {}", e.message())))?;
        Ok(Revision::from_oid(commit.id()))
    }

    /// The contents of `path` in the tree of `rev`.
    pub fn read_file(&self, rev: &Revision, path: &Path) -> Result<Vec<u8>, GitError> {
        let repo = self.open_existing()?;
        let commit = repo
            .find_commit(rev.oid())
            .map_err(|e| read_error(rev, &e))?;
        let tree = commit.tree().map_err(|e| read_error(rev, &e))?;
        let entry = tree.get_path(path).map_err(|e| GitError::Read {
            revision: rev.to_string(),
            message: format!("{}: {}", path.display(), e.message()),
        })?;
        let blob = entry
            .to_object(&repo)
            .and_then(|o| o.peel_to_blob())
            .map_err(|e| GitError::Read {
                revision: rev.to_string(),
                message: format!("{} is not a file: {}", path.display(), e.message()),
            })?;
        Ok(blob.content().to_vec())
    }
}

fn sign_check(
    repo: &Repository,
    rev: &Revision,
    policy: &Policy,
) -> Result<Option<AcceptedSignature>, String> {
    if !policy.is_required() {
        return Ok(None);
    }
    policy
        .check(repo, rev.oid())
        .map(Some)
        .map_err(|r| r.to_string())
}

/// Whether `new` is `old` or one of its descendants.
fn descends(repo: &Repository, new: &Revision, old: &Revision) -> Result<bool, git2::Error> {
    if new == old {
        return Ok(true);
    }
    repo.find_commit(old.oid())?;
    repo.graph_descendant_of(new.oid(), old.oid())
}

fn read_error(rev: &Revision, e: &git2::Error) -> GitError {
    GitError::Read {
        revision: rev.to_string(),
        message: classify(e),
    }
}

/// libgit2's message, marked when it means the local clone is damaged.
pub(super) fn classify(e: &git2::Error) -> String {
    let corrupt = matches!(
        e.class(),
        ErrorClass::Odb
            | ErrorClass::Zlib
            | ErrorClass::Object
            | ErrorClass::Tree
            | ErrorClass::Sha1
    ) || (e.class() == ErrorClass::Reference
        && e.code() != git2::ErrorCode::NotFound);
    if corrupt {
        format!("{CORRUPT}{}", e.message())
    } else {
        e.message().to_owned()
    }
}

/// Fetches the branch (and the testing branch) of `spec` from `url` into their tracking refs.
/// Returns the branch's head and the testing branch's, `None` when upstream has none.
fn fetch_one(
    repo: &Repository,
    url: &RemoteUrl,
    spec: &FetchSpec<'_>,
) -> Result<(Revision, Option<Revision>), GitError> {
    let fetch_err = |e: &git2::Error| fetch_error(url, spec.cancel, e);
    let mut remote = anonymous_remote(repo, url, spec.source, spec.cancel)?;
    let mut branches = vec![spec.branch];
    branches.extend(spec.testing);
    download(&mut remote, &branches, spec).map_err(|e| fetch_err(&e))?;
    let advertised: Vec<(String, git2::Oid)> = remote
        .list()
        .map_err(|e| fetch_err(&e))?
        .iter()
        .map(|h| (h.name().to_owned(), h.oid()))
        .collect();
    update_tracking(repo, &branches, &advertised).map_err(|e| fetch_err(&e))?;
    let has = |b: &str| {
        advertised
            .iter()
            .any(|(n, _)| n == &format!("refs/heads/{b}"))
    };
    if !has(spec.branch) {
        return Err(GitError::NoBranch {
            name: spec.source.to_owned(),
            branch: spec.branch.to_owned(),
            url: url.to_string(),
        });
    }
    let head = |b: &str| -> Result<Revision, GitError> {
        let oid = repo
            .refname_to_id(&tracking_ref(b))
            .map_err(|e| fetch_err(&e))?;
        let commit = repo.find_commit(oid).map_err(|e| GitError::Read {
            revision: oid.to_string(),
            message: classify(&e),
        })?;
        Ok(Revision::from_oid(commit.id()))
    };
    let main = head(spec.branch)?;
    let testing = match spec.testing {
        Some(t) if has(t) => Some(head(t)?),
        Some(t) => {
            // The branch is gone upstream; forget the stale copy.
            if let Ok(mut r) = repo.find_reference(&tracking_ref(t)) {
                let _ = r.delete();
            }
            None
        }
        None => None,
    };
    Ok((main, testing))
}

/// An anonymous remote for `url` of source `source`. A local path that does not exist is said
/// to be missing: libgit2 takes a missing directory for an unknown protocol.
pub(super) fn anonymous_remote<'r>(
    repo: &'r Repository,
    url: &RemoteUrl,
    source: &str,
    cancel: &AtomicBool,
) -> Result<git2::Remote<'r>, GitError> {
    if let Some(path) = url.local_path()
        && !path.exists()
    {
        return Err(GitError::NoPath {
            name: source.to_owned(),
            path,
        });
    }
    repo.remote_anonymous(url.as_git_url())
        .map_err(|e| fetch_error(url, cancel, &e))
}

/// Fetch options without tags whose transfer gives up once `cancel` is set (the fetch's
/// timeout sets it).
pub(super) fn cancellable(cancel: &AtomicBool) -> FetchOptions<'_> {
    let mut callbacks = git2::RemoteCallbacks::new();
    callbacks.transfer_progress(move |_| !cancel.load(Ordering::Relaxed));
    callbacks.sideband_progress(move |_| !cancel.load(Ordering::Relaxed));
    let mut opts = FetchOptions::new();
    opts.remote_callbacks(callbacks)
        .download_tags(AutotagOption::None);
    opts
}

/// A fetch's libgit2 error as the fetch of `url` failing, its credentials scrubbed; an error
/// from the progress callback after `cancel` is the timeout's doing.
pub(super) fn fetch_error(url: &RemoteUrl, cancel: &AtomicBool, e: &git2::Error) -> GitError {
    let message = if e.class() == ErrorClass::Callback && cancel.load(Ordering::Relaxed) {
        "fetch cancelled (fetch_timeout)".to_owned()
    } else {
        classify(e)
    };
    GitError::Fetch {
        url: url.to_string(),
        message: url.scrub(&message),
    }
}

/// Downloads the objects of `branches` from `remote`, without tags, given up when the
/// fetch's `cancel` is set. Touches no ref: see [`update_tracking`].
fn download(
    remote: &mut git2::Remote<'_>,
    branches: &[&str],
    spec: &FetchSpec<'_>,
) -> Result<(), git2::Error> {
    let refspecs: Vec<String> = branches
        .iter()
        .map(|b| format!("+refs/heads/{b}:{}", tracking_ref(b)))
        .collect();
    // https://, http:// and ssh:// go through source/transport/, which takes the
    // credentials of this fetch from here.
    let _transport = super::transport::scope(spec.auth);
    let mut opts = cancellable(spec.cancel);
    // A download, not `fetch`: libgit2's tip update (1.9) truncates FETCH_HEAD on every
    // fetch, even told not to write it, so an idle node would rewrite a file in the clone
    // every interval. The tracking refs are updated after, and only when they move.
    // Disconnected whether or not the download worked, as `fetch` does.
    // A signal (an apply's child exiting: SIGCHLD) can interrupt libgit2's own socket reads
    // of git:// with EINTR, which it does not retry (its sockets have a receive timeout, so
    // the kernel does not restart the call): nothing was changed, so the download is tried
    // again, a few times.
    let mut tries = 0;
    loop {
        tries += 1;
        let downloaded = remote.download(&refspecs, Some(&mut opts));
        let disconnected = remote.disconnect();
        match downloaded.and(disconnected) {
            Err(e)
                if interrupted(&e)
                    && tries < DOWNLOAD_TRIES
                    && !spec.cancel.load(Ordering::Relaxed) =>
            {
                tracing::debug!(error = %e, tries, "the download was interrupted by a signal; trying again");
            }
            done => return done,
        }
    }
}

/// Downloads tried when a signal interrupts them.
const DOWNLOAD_TRIES: u32 = 3;

/// Whether libgit2 gave up because a system call was interrupted by a signal (EINTR). Its
/// socket stream reports a failed read as a network error with strerror's text (libgit2 1.9,
/// streams/socket.c); other reads report it as an OS error.
fn interrupted(e: &git2::Error) -> bool {
    matches!(e.class(), ErrorClass::Net | ErrorClass::Os)
        && e.message().ends_with(": Interrupted system call")
}

/// Points the tracking ref of each of `branches` the remote `advertised` at its head, writing
/// only the refs that move.
fn update_tracking(
    repo: &Repository,
    branches: &[&str],
    advertised: &[(String, git2::Oid)],
) -> Result<(), git2::Error> {
    for b in branches {
        let name = format!("refs/heads/{b}");
        let Some((_, oid)) = advertised.iter().find(|(n, _)| *n == name) else {
            continue;
        };
        let tracking = tracking_ref(b);
        // Forced, not compared-and-swapped: one fetch per clone runs at a time (the poller's
        // busy flag, and the state dir's lock between processes).
        if repo.refname_to_id(&tracking).ok() != Some(*oid) {
            repo.reference(&tracking, *oid, true, "ginx: fetch")?;
        }
    }
    Ok(())
}

pub fn tracking_ref(branch: &str) -> String {
    format!("refs/remotes/origin/{branch}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_interrupted_system_call_is_tried_again() {
        let os = |m: &str| git2::Error::new(git2::ErrorCode::GenericError, ErrorClass::Os, m);
        assert!(interrupted(&os(
            "error receiving data from socket: Interrupted system call"
        )));
        assert!(!interrupted(&os(
            "failed to connect to 127.0.0.1: Connection refused"
        )));
        // How libgit2's socket stream reports it: a network error.
        let net = |m: &str| git2::Error::new(git2::ErrorCode::GenericError, ErrorClass::Net, m);
        assert!(interrupted(&net(
            "error receiving data from socket: Interrupted system call"
        )));
        assert!(!interrupted(&net(
            "error receiving data from socket: Connection reset by peer"
        )));
        let odb = git2::Error::new(
            git2::ErrorCode::GenericError,
            ErrorClass::Odb,
            "read: Interrupted system call",
        );
        assert!(!interrupted(&odb), "only what a socket or the OS reports");
    }

    #[test]
    fn a_missing_branch_names_the_sources_key_with_its_real_name() {
        let e = GitError::NoBranch {
            name: "argus".into(),
            branch: "mian".into(),
            url: "https://git.example.com/argus.git".into(),
        };
        let text = e.to_string();
        assert!(text.contains("check sources.argus.branch"), "{text}");
        assert!(!text.contains("<name>"), "{text}");
    }
}
