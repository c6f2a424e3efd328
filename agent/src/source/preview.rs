//! Fetching a ref that is not deployed, for a plan asked for before a merge (`ginxctl plan REF`,
//! `ginx plan --revision REF`): a branch, a tag or a commit id of the source.
//!
//! It uses a clone of its own (`<state_dir>/previews/<source>`), never the clone the poller
//! fetches into: a preview must not move the source's tracking refs or its anchor, and it
//! must not wait for, or be waited on by, the poller's fetch. Every branch and tag is fetched
//! (a hive's repository is small), so that a commit id on any of them is found. The commit
//! found goes through the same signature policy as a deployed one.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use git2::Repository;

use super::auth::Auth;
use super::git::{self, GitError};
use super::verify::Policy;
use crate::types::{RemoteUrl, Revision};

/// Where a preview's refs live in its clone.
const PREFIX: &str = "refs/preview/";

/// What to fetch, from where.
pub struct RefFetch<'a> {
    /// The source's name, for messages.
    pub source: &'a str,
    pub remotes: &'a [RemoteUrl],
    pub auth: &'a Auth,
    pub cancel: &'a AtomicBool,
    /// A branch, a tag (with or without `refs/heads/`, `refs/tags/`), or a commit id.
    pub reference: &'a str,
}

/// Why a ref could not be planned: the fetch failed, or the commit is refused.
#[derive(Debug, thiserror::Error)]
pub enum RefError {
    #[error(transparent)]
    Git(#[from] GitError),
    /// Not a branch or tag of the source, nor a commit on one of them.
    #[error("{0}")]
    NotFound(String),
    /// The commit's signature is not one the source trusts.
    #[error("{0}")]
    Refused(String),
}

/// Fetches every branch and tag of the source into the preview clone at `dir`, from the first
/// remote that answers, and returns the commit `spec.reference` names, checked against
/// `policy`. Blocking.
pub fn fetch_ref(dir: &Path, spec: &RefFetch<'_>, policy: &Policy) -> Result<Revision, RefError> {
    let clone = git::Clone::new(dir.to_owned());
    let repo = clone.open()?;
    let mut failures = Vec::new();
    let mut advertised = None;
    for url in spec.remotes {
        if spec.cancel.load(Ordering::Relaxed) {
            return Err(GitError::Cancelled.into());
        }
        match fetch_all(&repo, url, spec) {
            Ok(heads) => {
                advertised = Some(heads);
                break;
            }
            Err(e) => failures.push(git::RemoteResult {
                url: url.to_string(),
                error: Some(e.to_string()),
            }),
        }
    }
    let Some(advertised) = advertised else {
        return Err(GitError::AllRemotes(failures).into());
    };
    let oid = find(&repo, &advertised, spec.reference).ok_or_else(|| {
        RefError::NotFound(format!(
            "{:?} is not a branch, a tag or a commit of source {}",
            spec.reference, spec.source
        ))
    })?;
    if policy.is_required() {
        policy
            .check(&repo, oid)
            .map_err(|r| RefError::Refused(r.to_string()))?;
    }
    Ok(Revision::from_oid(oid))
}

/// Downloads every branch and tag from `url` and points the preview refs at them; returns
/// what the remote advertised.
fn fetch_all(
    repo: &Repository,
    url: &RemoteUrl,
    spec: &RefFetch<'_>,
) -> Result<Vec<(String, git2::Oid)>, GitError> {
    let fail = |e: &git2::Error| git::fetch_error(url, spec.cancel, e);
    let mut remote = git::anonymous_remote(repo, url, spec.source, spec.cancel)?;
    let refspecs = [
        format!("+refs/heads/*:{PREFIX}heads/*"),
        format!("+refs/tags/*:{PREFIX}tags/*"),
    ];
    let _transport = super::transport::scope(spec.auth);
    let mut opts = git::cancellable(spec.cancel);
    let downloaded = remote.download(&refspecs, Some(&mut opts));
    let listed: Result<Vec<(String, git2::Oid)>, git2::Error> = remote.list().map(|heads| {
        heads
            .iter()
            .map(|h| (h.name().to_owned(), h.oid()))
            .collect()
    });
    let _ = remote.disconnect();
    downloaded.map_err(|e| fail(&e))?;
    let listed = listed.map_err(|e| fail(&e))?;
    for (name, oid) in &listed {
        let local = match name.strip_prefix("refs/") {
            Some(rest) if rest.starts_with("heads/") || rest.starts_with("tags/") => {
                format!("{PREFIX}{rest}")
            }
            _ => continue,
        };
        if name.ends_with("^{}") || repo.refname_to_id(&local).ok() == Some(*oid) {
            continue;
        }
        // A ref the download did not bring (none should be) is skipped, not an error.
        let _ = repo.reference(&local, *oid, true, "ginx: preview fetch");
    }
    Ok(listed)
}

/// The commit `reference` names: a branch, then a tag (peeled), as the remote advertised
/// them; else a commit id (or an unambiguous prefix of at least 7 digits) in the clone.
fn find(
    repo: &Repository,
    advertised: &[(String, git2::Oid)],
    reference: &str,
) -> Option<git2::Oid> {
    let names = if reference.starts_with("refs/") {
        vec![reference.to_owned()]
    } else {
        vec![
            format!("refs/heads/{reference}"),
            format!("refs/tags/{reference}"),
        ]
    };
    for name in &names {
        if let Some((_, oid)) = advertised.iter().find(|(n, _)| n == name) {
            return repo
                .find_object(*oid, None)
                .and_then(|o| o.peel_to_commit())
                .ok()
                .map(|c| c.id());
        }
    }
    let hex =
        (7..=64).contains(&reference.len()) && reference.bytes().all(|b| b.is_ascii_hexdigit());
    if !hex {
        return None;
    }
    repo.revparse_single(reference)
        .and_then(|o| o.peel_to_commit())
        .ok()
        .map(|c| c.id())
}
