//! Checked-out trees of a source, one directory per revision under
//! `<state_dir>/trees/<name>/<revision>`, plus a `current` symlink to the newest head.
//!
//! A tree is built in a temporary directory beside its final place and renamed into place, so
//! a directory named after a revision is always complete. Trees in use are pinned (a [`Pin`]
//! guard) and survive garbage collection; every other tree is removed after each checkout.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use git2::build::CheckoutBuilder;

use super::Revision;
use super::git::{Clone, GitError, classify};

/// The trees of one source.
#[derive(Debug)]
pub struct Trees {
    root: PathBuf,
    pins: Mutex<HashMap<Revision, usize>>,
    /// Serialises checkouts and garbage collection of this source's trees.
    building: Mutex<()>,
}

/// Keeps a tree on disk while held.
#[derive(Debug)]
pub struct Pin {
    trees: Arc<Trees>,
    revision: Revision,
    path: PathBuf,
}

impl Pin {
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn revision(&self) -> &Revision {
        &self.revision
    }
}

impl Drop for Pin {
    fn drop(&mut self) {
        let mut pins = self.trees.pins.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = pins.get_mut(&self.revision) {
            *n -= 1;
            if *n == 0 {
                pins.remove(&self.revision);
            }
        }
    }
}

impl Trees {
    pub fn new(root: PathBuf) -> Arc<Self> {
        Arc::new(Self {
            root,
            pins: Mutex::new(HashMap::new()),
            building: Mutex::new(()),
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn path_of(&self, revision: &Revision) -> PathBuf {
        self.root.join(revision.as_str())
    }

    /// Materialises `revision` from `clone` (unless already there), pins it, and removes every
    /// unpinned tree. Blocking.
    pub fn checkout(self: &Arc<Self>, clone: &Clone, revision: &Revision) -> Result<Pin, GitError> {
        let pin = self.pin(revision);
        let _building = self.building.lock().unwrap_or_else(|p| p.into_inner());
        let dest = self.path_of(revision);
        if !dest.is_dir() {
            self.build(clone, revision, &dest)?;
        }
        self.collect_garbage();
        Ok(pin)
    }

    /// Points `current` at `revision`'s tree, atomically.
    pub fn set_current(&self, revision: &Revision) -> std::io::Result<()> {
        let tmp = self.root.join(".current.tmp");
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(revision.as_str(), &tmp)?;
        std::fs::rename(&tmp, self.root.join("current"))
    }

    fn pin(self: &Arc<Self>, revision: &Revision) -> Pin {
        *self
            .pins
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(revision.clone())
            .or_default() += 1;
        Pin {
            trees: Arc::clone(self),
            revision: revision.clone(),
            path: self.path_of(revision),
        }
    }

    fn build(&self, clone: &Clone, revision: &Revision, dest: &Path) -> Result<(), GitError> {
        let fail = |message: String| GitError::Read {
            revision: revision.to_string(),
            message,
        };
        std::fs::create_dir_all(&self.root)
            .map_err(|e| fail(format!("creating {}: {e}", self.root.display())))?;
        let tmp = self.root.join(format!(".tmp-{}", revision.as_str()));
        if tmp.exists() {
            std::fs::remove_dir_all(&tmp)
                .map_err(|e| fail(format!("removing stale {}: {e}", tmp.display())))?;
        }
        std::fs::create_dir(&tmp).map_err(|e| fail(format!("creating {}: {e}", tmp.display())))?;
        let result = (|| {
            let repo = clone.open()?;
            let commit = repo
                .find_commit(revision.oid())
                .map_err(|e| fail(classify(&e)))?;
            let mut co = CheckoutBuilder::new();
            co.target_dir(&tmp).force().update_index(false);
            repo.checkout_tree(commit.as_object(), Some(&mut co))
                .map_err(|e| fail(classify(&e)))?;
            std::fs::rename(&tmp, dest)
                .map_err(|e| fail(format!("moving {} into place: {e}", tmp.display())))?;
            std::fs::File::open(&self.root)
                .and_then(|d| d.sync_all())
                .map_err(|e| fail(format!("syncing {}: {e}", self.root.display())))
        })();
        if result.is_err() {
            let _ = std::fs::remove_dir_all(&tmp);
        }
        result
    }

    /// Removes every tree that is not pinned, and leftovers of interrupted checkouts.
    fn collect_garbage(&self) {
        let Ok(entries) = std::fs::read_dir(&self.root) else {
            return;
        };
        let pins = self.pins.lock().unwrap_or_else(|p| p.into_inner());
        for entry in entries.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name == "current" || name == ".current.tmp" {
                continue;
            }
            let keep = name
                .parse::<Revision>()
                .is_ok_and(|r| pins.contains_key(&r));
            let building = name
                .strip_prefix(".tmp-")
                .and_then(|r| r.parse::<Revision>().ok())
                .is_some_and(|r| pins.contains_key(&r));
            if !keep && !building {
                let path = entry.path();
                if let Err(e) = std::fs::remove_dir_all(&path) {
                    tracing::warn!(tree = %path.display(), error = %e, "cannot remove old tree");
                }
            }
        }
    }
}
