//! Blocking Git operations with git2: the bare clone under `<state_dir>/sources/<name>`, fetches
//! of the tracked branch, and reading commits. Called from `spawn_blocking`.
//!
//! Messages never contain the configured URL as written (it may carry credentials): every
//! libgit2 message passes through [`scrub`] before it leaves this module.

use std::path::{Path, PathBuf};

use git2::{AutotagOption, FetchOptions, Repository, RepositoryInitOptions};

use super::{RemoteUrl, Revision};

#[derive(Debug, thiserror::Error)]
pub enum GitError {
    #[error("cannot create or open the clone at {}: {message}", path.display())]
    Clone { path: PathBuf, message: String },
    #[error("fetching {url}: {message}")]
    Fetch { url: String, message: String },
    #[error("branch {branch:?} does not exist at {url}; check sources.<name>.branch")]
    NoBranch { branch: String, url: String },
    #[error("reading commit {revision}: {message}")]
    Read { revision: String, message: String },
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
    /// aside (never deleted) and a fresh clone started.
    pub fn open(&self) -> Result<Repository, GitError> {
        let err = |e: git2::Error| GitError::Clone {
            path: self.dir.clone(),
            message: e.message().to_owned(),
        };
        if self.dir.exists() {
            match Repository::open_bare(&self.dir) {
                Ok(repo) => return Ok(repo),
                Err(e) => {
                    let aside = aside_path(&self.dir);
                    tracing::warn!(
                        clone = %self.dir.display(),
                        moved_to = %aside.display(),
                        error = e.message(),
                        "clone cannot be opened; moving it aside and cloning afresh"
                    );
                    std::fs::rename(&self.dir, &aside).map_err(|io| GitError::Clone {
                        path: self.dir.clone(),
                        message: format!("cannot move it aside: {io}"),
                    })?;
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
        Repository::init_opts(&self.dir, &opts).map_err(err)
    }

    /// Fetches `branch` from `url` into `refs/remotes/origin/<branch>` and returns its head.
    /// Only that branch is fetched, without tags; objects already present are not downloaded
    /// again.
    pub fn fetch(&self, url: &RemoteUrl, branch: &str) -> Result<Revision, GitError> {
        let repo = self.open()?;
        let fetch_err = |e: git2::Error| GitError::Fetch {
            url: url.to_string(),
            message: scrub(e.message(), url),
        };
        let mut remote = repo.remote_anonymous(url.as_git_url()).map_err(fetch_err)?;
        let tracking = tracking_ref(branch);
        let refspec = format!("+refs/heads/{branch}:{tracking}");
        let mut opts = FetchOptions::new();
        opts.download_tags(AutotagOption::None);
        remote
            .fetch(&[refspec.as_str()], Some(&mut opts), None)
            .map_err(fetch_err)?;
        let wanted = format!("refs/heads/{branch}");
        let advertised = remote
            .list()
            .map_err(fetch_err)?
            .iter()
            .any(|head| head.name() == wanted);
        if !advertised {
            return Err(GitError::NoBranch {
                branch: branch.to_owned(),
                url: url.to_string(),
            });
        }
        let oid = repo.refname_to_id(&tracking).map_err(fetch_err)?;
        let commit = repo.find_commit(oid).map_err(|e| GitError::Read {
            revision: oid.to_string(),
            message: e.message().to_owned(),
        })?;
        Ok(Revision::from_oid(commit.id()))
    }
}

pub fn tracking_ref(branch: &str) -> String {
    format!("refs/remotes/origin/{branch}")
}

fn aside_path(dir: &Path) -> PathBuf {
    let stamp = jiff::Timestamp::now()
        .strftime("%Y%m%dT%H%M%SZ")
        .to_string();
    let mut p = dir.as_os_str().to_owned();
    p.push(format!(".broken-{stamp}"));
    PathBuf::from(p)
}

/// Removes the URL as configured (and its password) from a libgit2 message.
pub fn scrub(message: &str, url: &RemoteUrl) -> String {
    let mut out = message.replace(url.as_git_url(), &url.to_string());
    if let Ok(parsed) = url::Url::parse(url.as_git_url()) {
        if let Some(pw) = parsed.password().filter(|p| !p.is_empty()) {
            out = out.replace(pw, "***");
        }
        if !parsed.username().is_empty() && url.has_inline_credentials() {
            out = out.replace(parsed.username(), "***");
        }
    }
    out
}
