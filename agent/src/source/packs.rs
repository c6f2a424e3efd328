//! Keeping a clone's packs few. Every fetch that brings something leaves a pack (libgit2 runs
//! no `git gc`), and every object lookup searches every pack: past [`PACK_LIMIT`] a fetch folds
//! them into one, losing no object, and removes the old ones only once the new one is whole and
//! on disk.

use std::path::{Path, PathBuf};

use super::git::{Clone, GitError};

/// The packs a clone may hold before a fetch folds them into one: `git gc --auto`'s
/// `gc.autoPackLimit`.
pub const PACK_LIMIT: usize = 50;

impl Clone {
    /// The packs in the clone (`objects/pack/pack-*.pack`), by name without extension.
    pub fn packs(&self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(self.dir.join("objects/pack")) else {
            return Vec::new();
        };
        let mut names: Vec<String> = entries
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                let stem = name.strip_suffix(".pack")?;
                stem.starts_with("pack-").then(|| stem.to_owned())
            })
            .collect();
        names.sort();
        names
    }

    /// Folds the packs into one after a fetch left more than [`PACK_LIMIT`]; logs a failure
    /// and carries on (the clone is whole either way, and the next fetch tries again).
    pub(super) fn compact_if_needed(&self, source: &str) {
        /// When a fold of each clone failed: the next is tried an hour later, not at every
        /// fetch (each would read and write the whole clone again).
        static FAILED: std::sync::Mutex<Vec<(PathBuf, std::time::Instant)>> =
            std::sync::Mutex::new(Vec::new());
        const RETRY: std::time::Duration = std::time::Duration::from_secs(3600);
        if self.packs().len() <= PACK_LIMIT {
            return;
        }
        let mut failed = FAILED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        failed.retain(|(_, at)| at.elapsed() < RETRY);
        if failed.iter().any(|(dir, _)| *dir == self.dir) {
            return;
        }
        match self.compact() {
            Ok(folded) => tracing::info!(%source, packs = folded,
                "folded the clone's packs into one (a pack per fetch, as git gc --auto does)"),
            Err(e) => {
                tracing::warn!(%source, error = %e,
                    "cannot fold the clone's packs into one; trying again in an hour");
                failed.push((self.dir.clone(), std::time::Instant::now()));
            }
        }
    }

    /// Writes every object of the clone into one new pack and removes the packs it replaces;
    /// returns how many packs were folded. Every fetch that brings something leaves a pack
    /// (libgit2 runs no `git gc`), and every object lookup searches every pack, so without
    /// this a node that has fetched for months would hold thousands of them. No object is
    /// dropped, reachable or not: the new pack holds all of them, and the old packs are
    /// removed only after it is on disk: written by libgit2's indexer, its index counting
    /// every object, and synced.
    /// A reader holding an old pack open keeps reading it; one that lists packs anew finds
    /// the new one (libgit2 rescans the pack directory when an object is not found). Called
    /// after a fetch, which the poller's busy flag keeps to one per clone at a time; two folds
    /// at once would still lose nothing (each keeps every object it lists).
    pub fn compact(&self) -> Result<usize, GitError> {
        let fail = |what: &str, message: String| GitError::Clone {
            path: self.dir.clone(),
            message: format!("folding the packs: {what}: {message}"),
        };
        let old = self.packs();
        let repo = self.open_existing()?;
        let odb = repo
            .odb()
            .map_err(|e| fail("cannot open the object database", e.message().to_owned()))?;
        // Every copy: an object is in more than one pack when a thin pack's delta base was
        // appended to complete it.
        let mut oids = Vec::new();
        odb.foreach(|oid| {
            oids.push(*oid);
            true
        })
        .map_err(|e| fail("cannot list the objects", e.message().to_owned()))?;
        oids.sort_unstable();
        oids.dedup();
        let mut builder = repo
            .packbuilder()
            .map_err(|e| fail("cannot start a pack", e.message().to_owned()))?;
        for oid in &oids {
            builder
                .insert_object(*oid, None)
                .map_err(|e| fail(&format!("cannot add object {oid}"), e.message().to_owned()))?;
        }
        let pack_dir = self.dir.join("objects/pack");
        builder
            .write(&pack_dir, 0o444)
            .map_err(|e| fail("cannot write the pack", e.message().to_owned()))?;
        let new = match builder.name() {
            Ok(Some(hash)) => format!("pack-{hash}"),
            _ => return Err(fail("the new pack has no name", String::new())),
        };
        drop(builder);
        drop(odb);
        drop(repo);
        // The old packs go only once the new one is on disk, whole: its index counts every
        // object, and both files and the directory are synced (libgit2 syncs nothing unless
        // told to), so a power cut cannot leave the removals without the pack.
        let indexed = pack_index_count(&pack_dir.join(format!("{new}.idx")))
            .map_err(|e| fail(&format!("cannot read {new}.idx"), e.to_string()))?;
        if indexed != oids.len() {
            return Err(fail(
                "the new pack is short",
                format!("{indexed} of {} objects in {new}.idx", oids.len()),
            ));
        }
        for path in [
            pack_dir.join(format!("{new}.pack")),
            pack_dir.join(format!("{new}.idx")),
            pack_dir.clone(),
        ] {
            std::fs::File::open(&path)
                .and_then(|f| f.sync_all())
                .map_err(|e| fail(&format!("cannot sync {}", path.display()), e.to_string()))?;
        }
        for name in old.iter().filter(|n| **n != new) {
            // The index first: a reader listing the directory meanwhile skips the pack.
            for ext in ["idx", "pack", "rev", "bitmap", "mtimes", "promisor"] {
                let path = pack_dir.join(format!("{name}.{ext}"));
                match std::fs::remove_file(&path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => {
                        return Err(fail(
                            &format!("cannot remove {}", path.display()),
                            e.to_string(),
                        ));
                    }
                }
            }
        }
        Ok(old.len())
    }
}

/// How many objects a pack index (version 2, as libgit2 and git write it) lists: the last
/// entry of its fan-out table.
fn pack_index_count(path: &Path) -> std::io::Result<usize> {
    let bytes = std::fs::read(path)?;
    let invalid = || std::io::Error::new(std::io::ErrorKind::InvalidData, "not a pack index v2");
    if bytes.get(..8) != Some(b"\xfftOc\0\0\0\x02".as_slice()) {
        return Err(invalid());
    }
    let last = bytes.get(8 + 255 * 4..8 + 256 * 4).ok_or_else(invalid)?;
    let count = u32::from_be_bytes(last.try_into().map_err(|_| invalid())?);
    usize::try_from(count).map_err(|_| invalid())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pack_index_counts_its_objects_from_the_last_fan_out_entry() {
        let dir = std::env::temp_dir().join(format!("ginx-idx-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let idx = dir.join("pack-x.idx");
        let mut bytes = b"\xfftOc\0\0\0\x02".to_vec();
        for n in 0..256u32 {
            bytes.extend_from_slice(&(n / 64).to_be_bytes());
        }
        std::fs::write(&idx, &bytes).unwrap();
        assert_eq!(pack_index_count(&idx).unwrap(), 3);
        // Version 1, truncated, or not an index at all: refused, never a count.
        std::fs::write(&idx, &bytes[..8 + 255 * 4]).unwrap();
        assert!(pack_index_count(&idx).is_err());
        std::fs::write(&idx, [0u8; 2048]).unwrap();
        assert!(pack_index_count(&idx).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
