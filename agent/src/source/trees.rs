//! Checked-out trees of a source, one directory per revision under
//! `<state_dir>/trees/<name>/<revision>`, plus a `current` symlink to the newest head.
//!
//! A tree is built in a temporary directory beside its final place and renamed into place, so
//! a directory named after a revision is always complete. Trees in use are pinned (a [`Pin`]
//! guard) and survive garbage collection; every other tree is removed after each checkout.

use std::collections::HashMap;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use git2::build::CheckoutBuilder;

use super::git::{Clone, GitError, classify};
use crate::types::Revision;

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
        let current = self.root.join("current");
        if std::fs::read_link(&current).is_ok_and(|t| t.as_os_str() == revision.as_str()) {
            return Ok(());
        }
        let tmp = self.root.join(".current.tmp");
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(revision.as_str(), &tmp)?;
        std::fs::rename(&tmp, current)
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
            let repo = clone.open_existing()?;
            let commit = repo
                .find_commit(revision.oid())
                .map_err(|e| fail(classify(&e)))?;
            let tree = commit.tree().map_err(|e| fail(classify(&e)))?;
            match self.base(&repo, revision) {
                Some((base_tree, base_dir)) => {
                    derive(&repo, &base_tree, &base_dir, &tree, &tmp).map_err(|e| match e {
                        Derive::Git(e) => fail(classify(&e)),
                        Derive::Io(p, e) => fail(format!("writing {}: {e}", p.display())),
                        Derive::Unsafe(name) => fail(format!(
                            "refusing a tree entry whose name would leave the tree: {name:?}"
                        )),
                    })?;
                }
                None => {
                    // Raw blobs, as Nix sees a Git flake: no smudge or end-of-line filters.
                    let mut co = CheckoutBuilder::new();
                    co.target_dir(&tmp)
                        .force()
                        .update_index(false)
                        .disable_filters(true);
                    repo.checkout_tree(tree.as_object(), Some(&mut co))
                        .map_err(|e| fail(classify(&e)))?;
                }
            }
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

    /// A complete tree to derive a new one from: the one `current` points at, else any.
    fn base<'r>(
        &self,
        repo: &'r git2::Repository,
        except: &Revision,
    ) -> Option<(git2::Tree<'r>, PathBuf)> {
        let current = std::fs::read_link(self.root.join("current"))
            .ok()
            .and_then(|p| p.to_str().and_then(|s| s.parse::<Revision>().ok()));
        let others = std::fs::read_dir(&self.root)
            .ok()?
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<Revision>().ok());
        current
            .into_iter()
            .chain(others)
            .filter(|r| r != except && self.path_of(r).is_dir())
            .find_map(|r| {
                let tree = repo.find_commit(r.oid()).ok()?.tree().ok()?;
                Some((tree, self.path_of(&r)))
            })
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

enum Derive {
    Git(git2::Error),
    Io(PathBuf, std::io::Error),
    /// A tree entry whose name could escape the tree.
    Unsafe(String),
}

/// A tree entry name that stays inside its directory: not empty, `.`, `..` or `.git` (in any
/// case), without `/`, `\` or NUL.
fn safe_entry_name(name: &[u8]) -> bool {
    !name.is_empty()
        && name != b"."
        && name != b".."
        && !name.eq_ignore_ascii_case(b".git")
        && !name.iter().any(|b| matches!(b, b'/' | b'\\' | 0))
}

impl From<git2::Error> for Derive {
    fn from(e: git2::Error) -> Self {
        Derive::Git(e)
    }
}

/// Builds the tree of `new` in `dest` from the checked-out tree of `base` at `base_dir`:
/// files whose blob and mode did not change are hard-linked (after checking their size, so a
/// tree someone edited in place is not carried over), everything else is written from the
/// object database. Only the entries of `new` are created, so files a command left behind in
/// the base tree are not carried over. Costs a link per file instead of a write per file.
fn derive(
    repo: &git2::Repository,
    base: &git2::Tree<'_>,
    base_dir: &Path,
    new: &git2::Tree<'_>,
    dest: &Path,
) -> Result<(), Derive> {
    use std::os::unix::fs::{OpenOptionsExt, symlink};

    let changed: std::collections::HashSet<PathBuf> = {
        let diff = repo.diff_tree_to_tree(Some(base), Some(new), None)?;
        diff.deltas()
            .filter_map(|d| d.new_file().path().map(Path::to_path_buf))
            .collect()
    };
    let odb = repo.odb()?;
    let mut failure = None;
    new.walk(git2::TreeWalkMode::PreOrder, |parent, entry| {
        // libgit2 does not check names in trees it reads: a crafted tree must not write
        // outside `dest` (`..`, `/etc/x`) nor into a `.git`.
        if !safe_entry_name(entry.name_bytes()) {
            failure = Some(Derive::Unsafe(format!(
                "{parent}{}",
                String::from_utf8_lossy(entry.name_bytes())
            )));
            return git2::TreeWalkResult::Abort;
        }
        let name = std::ffi::OsStr::from_bytes(entry.name_bytes());
        let rel = Path::new(parent).join(name);
        let target = dest.join(&rel);
        let io = |e: std::io::Error| Derive::Io(target.clone(), e);
        let step = (|| -> Result<(), Derive> {
            match entry.filemode() {
                0o040000 | 0o160000 => std::fs::create_dir(&target).map_err(io),
                0o120000 => {
                    let blob = repo.find_blob(entry.id())?;
                    let link = std::ffi::OsStr::from_bytes(blob.content());
                    symlink(link, &target).map_err(io)
                }
                mode => {
                    if !changed.contains(&rel) {
                        let from = base_dir.join(&rel);
                        let (size, _) = odb.read_header(entry.id())?;
                        let same = std::fs::symlink_metadata(&from)
                            .is_ok_and(|m| m.is_file() && m.len() == size as u64);
                        if same && std::fs::hard_link(&from, &target).is_ok() {
                            return Ok(());
                        }
                    }
                    let blob = repo.find_blob(entry.id())?;
                    let perm = if mode == 0o100755 { 0o755 } else { 0o644 };
                    let mut f = std::fs::OpenOptions::new()
                        .write(true)
                        .create_new(true)
                        .mode(perm)
                        .open(&target)
                        .map_err(io)?;
                    std::io::Write::write_all(&mut f, blob.content()).map_err(io)
                }
            }
        })();
        match step {
            Ok(()) => git2::TreeWalkResult::Ok,
            Err(e) => {
                failure = Some(e);
                git2::TreeWalkResult::Abort
            }
        }
    })
    .or_else(|e| if failure.is_some() { Ok(()) } else { Err(e) })?;
    match failure {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    struct Repo {
        _tmp: tempfile::TempDir,
        work: PathBuf,
        repo: git2::Repository,
    }

    impl Repo {
        fn new() -> Self {
            let tmp = tempfile::tempdir().unwrap();
            let work = tmp.path().join("work");
            let repo = git2::Repository::init(&work).unwrap();
            Self {
                _tmp: tmp,
                work,
                repo,
            }
        }

        fn commit(&self) -> Revision {
            let mut index = self.repo.index().unwrap();
            index
                .add_all(["*"], git2::IndexAddOption::DEFAULT, None)
                .unwrap();
            index.update_all(["*"], None).unwrap();
            index.write().unwrap();
            let tree = self.repo.find_tree(index.write_tree().unwrap()).unwrap();
            let sig = git2::Signature::now("t", "t@example.com").unwrap();
            let parent = self.repo.head().ok().and_then(|h| h.peel_to_commit().ok());
            let parents: Vec<&git2::Commit<'_>> = parent.iter().collect();
            let oid = self
                .repo
                .commit(Some("HEAD"), &sig, &sig, "c", &tree, &parents)
                .unwrap();
            Revision::from_oid(oid)
        }

        fn write(&self, path: &str, content: &str, mode: u32) {
            let p = self.work.join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            let _ = std::fs::remove_file(&p);
            std::fs::write(&p, content).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        }

        fn clone(&self) -> Clone {
            Clone::new(self.work.join(".git"))
        }
    }

    /// Everything a checkout must reproduce: paths, kinds, contents, exec bits, link targets.
    fn snapshot(dir: &Path) -> Vec<(PathBuf, String)> {
        let mut out = Vec::new();
        let mut stack = vec![dir.to_owned()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap().flatten() {
                let p = e.path();
                let rel = p.strip_prefix(dir).unwrap().to_owned();
                let meta = std::fs::symlink_metadata(&p).unwrap();
                let what = if meta.file_type().is_symlink() {
                    format!("link {}", std::fs::read_link(&p).unwrap().display())
                } else if meta.is_dir() {
                    stack.push(p.clone());
                    "dir".to_owned()
                } else {
                    let exec = meta.permissions().mode() & 0o111 != 0;
                    format!("file exec={exec} {}", std::fs::read_to_string(&p).unwrap())
                };
                out.push((rel, what));
            }
        }
        out.sort();
        out
    }

    #[test]
    fn entry_names_that_leave_the_tree_are_refused() {
        for bad in [
            &b".."[..],
            b".",
            b"",
            b".git",
            b".GIT",
            b"a/b",
            b"/etc",
            b"a\\b",
            b"a\0b",
        ] {
            assert!(!safe_entry_name(bad), "{:?}", String::from_utf8_lossy(bad));
        }
        for good in [&b"hive.nix"[..], b"..hidden", b".gitignore", b"a b"] {
            assert!(safe_entry_name(good));
        }
    }

    #[test]
    fn a_crafted_tree_cannot_write_outside_its_directory() {
        let r = Repo::new();
        r.write("hive.nix", "{ }\n", 0o644);
        let a = r.commit();
        // A tree object with an entry named "../escaped", written raw: libgit2's tree builder
        // would refuse the name, a remote need not.
        let blob = r.repo.blob(b"pwned\n").unwrap();
        let mut raw = b"100644 ../escaped\0".to_vec();
        raw.extend_from_slice(blob.as_bytes());
        let tree = r
            .repo
            .odb()
            .unwrap()
            .write(git2::ObjectType::Tree, &raw)
            .unwrap();
        let tree = r.repo.find_tree(tree).unwrap();
        let sig = git2::Signature::now("t", "t@example.com").unwrap();
        let parent = r.repo.find_commit(a.oid()).unwrap();
        let bad = Revision::from_oid(
            r.repo
                .commit(None, &sig, &sig, "evil", &tree, &[&parent])
                .unwrap(),
        );

        let clone = r.clone();
        let root = r.work.parent().unwrap().join("trees");
        let trees = Trees::new(root.clone());
        let _a = trees.checkout(&clone, &a).unwrap();
        trees.set_current(&a).unwrap();
        let e = trees.checkout(&clone, &bad).unwrap_err().to_string();
        assert!(e.contains("would leave the tree"), "{e}");
        assert!(!root.parent().unwrap().join("escaped").exists());
        assert!(!root.join("escaped").exists());
        // A fresh checkout (libgit2's own) refuses it too.
        let fresh = Trees::new(r.work.parent().unwrap().join("fresh"));
        assert!(fresh.checkout(&clone, &bad).is_err());
        assert!(!r.work.parent().unwrap().join("escaped").exists());
    }

    #[test]
    fn a_derived_tree_equals_a_fresh_checkout() {
        let r = Repo::new();
        r.write("hive.nix", "{ }\n", 0o644);
        r.write("README", "read me\n", 0o644);
        r.write("hosts/lucy.nix", "lucy\n", 0o644);
        r.write("hosts/makise.nix", "makise\n", 0o644);
        r.write("bin/deploy", "#!/bin/sh\n", 0o755);
        r.write("gone/a.nix", "a\n", 0o644);
        r.write("becomes-dir", "file\n", 0o644);
        std::os::unix::fs::symlink("hosts/lucy.nix", r.work.join("link")).unwrap();
        let a = r.commit();

        r.write("hosts/lucy.nix", "lucy, changed\n", 0o644);
        std::fs::remove_file(r.work.join("hosts/makise.nix")).unwrap();
        r.write("hosts/quinn/default.nix", "quinn\n", 0o644);
        r.write("bin/deploy", "#!/bin/sh\n", 0o644);
        std::fs::remove_dir_all(r.work.join("gone")).unwrap();
        std::fs::remove_file(r.work.join("becomes-dir")).unwrap();
        r.write("becomes-dir/inside.nix", "inside\n", 0o644);
        std::fs::remove_file(r.work.join("link")).unwrap();
        std::os::unix::fs::symlink("hive.nix", r.work.join("link")).unwrap();
        let b = r.commit();

        let clone = r.clone();
        let trees = Trees::new(r.work.parent().unwrap().join("trees"));
        let pin_a = trees.checkout(&clone, &a).unwrap();
        trees.set_current(&a).unwrap();
        // Leftovers in the base tree: an untracked file, and a tracked file edited in place.
        std::fs::write(pin_a.path().join("result"), "built").unwrap();
        std::fs::write(pin_a.path().join("hive.nix"), "edited in the tree!\n").unwrap();
        let pin_b = trees.checkout(&clone, &b).unwrap();

        let fresh = Trees::new(r.work.parent().unwrap().join("fresh"));
        let pin_fresh = fresh.checkout(&clone, &b).unwrap();
        assert_eq!(snapshot(pin_b.path()), snapshot(pin_fresh.path()));
        assert!(!pin_b.path().join("result").exists());
        // Unchanged files share storage with the base tree; changed ones do not.
        let ino = |p: &Path| std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(p).unwrap());
        let same = |f: &str| ino(&pin_a.path().join(f)) == ino(&pin_b.path().join(f));
        assert!(same("README"));
        assert!(!same("bin/deploy"), "mode changed");
        assert!(!same("hive.nix"), "edited in place in the base tree");
    }
}
