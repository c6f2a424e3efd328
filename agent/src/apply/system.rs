//! What NixOS leaves behind that ginx reads: system generations, the booted and the current
//! system (for reboot and drift detection), and ginx's own binary and unit (for self-update).

use std::path::{Path, PathBuf};

use crate::types::Generation;

/// The generation `profile` points at now.
pub fn generation(profile: &Path) -> Option<Generation> {
    let link = std::fs::read_link(profile).ok()?;
    let prefix = format!("{}-", profile.file_name()?.to_str()?);
    let number = link
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix(&prefix))
        .and_then(|n| n.strip_suffix("-link"))
        .and_then(|n| n.parse().ok());
    let path = std::fs::canonicalize(profile).ok()?;
    Some(Generation { number, path })
}

/// What a system path resolves to (`/run/current-system` → a store path).
pub fn resolve(p: &Path) -> Option<PathBuf> {
    std::fs::canonicalize(p).ok()
}

/// The boot id read from `path` (`system.boot_id`, the kernel's
/// `/proc/sys/kernel/random/boot_id` by default): a reboot happened when it changed.
pub fn boot_id(path: &Path) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
}

/// The parts of a system that only a reboot brings into use.
const BOOT_PARTS: [&str; 3] = ["kernel", "initrd", "kernel-modules"];

/// Why booting `target` would differ from what is booted: one line per changed part.
pub fn reboot_reasons(booted: &Path, target: &Path) -> Vec<String> {
    let short = |p: &Path| {
        p.file_name().map_or_else(
            || p.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        )
    };
    BOOT_PARTS
        .iter()
        .filter_map(|part| {
            let a = resolve(&booted.join(part))?;
            let b = resolve(&target.join(part))?;
            (a != b).then(|| format!("{part} changed: {} → {}", short(&a), short(&b)))
        })
        .collect()
}

/// The files ginx runs from, as resolved when it started, and which file each was: NixOS
/// changes the path (a new store path), a package manager replaces the file at the same path
/// (a new inode, size or time).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SelfImage {
    pub binary: Option<PathBuf>,
    pub unit: Option<PathBuf>,
    pub binary_file: Option<FileId>,
    pub unit_file: Option<FileId>,
}

/// Which file a path resolved to: device, inode, size and modification time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileId {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
}

impl FileId {
    fn of(path: &Path) -> Option<Self> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(path).ok()?;
        Some(Self {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime: (m.mtime(), m.mtime_nsec()),
        })
    }
}

impl SelfImage {
    pub fn read(binary: &Path, unit: &Path) -> Self {
        Self {
            binary: resolve(binary),
            unit: resolve(unit),
            binary_file: FileId::of(binary),
            unit_file: FileId::of(unit),
        }
    }

    /// What changed between `self` (at start) and `now`, if anything did. A file that is gone
    /// now is not an update.
    pub fn changed(&self, now: &SelfImage) -> Option<String> {
        let mut what = Vec::new();
        let differs =
            |a: &Option<PathBuf>, b: &Option<PathBuf>, fa: &Option<FileId>, fb: &Option<FileId>| {
                b.is_some() && (a != b || (fb.is_some() && fa != fb))
            };
        if differs(
            &self.binary,
            &now.binary,
            &self.binary_file,
            &now.binary_file,
        ) {
            what.push("binary");
        }
        if differs(&self.unit, &now.unit, &self.unit_file, &now.unit_file) {
            what.push("unit");
        }
        (!what.is_empty()).then(|| format!("ginx's {} changed", what.join(" and ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn generations_are_read_from_the_profile_links() {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("store/abc-nixos-system");
        std::fs::create_dir_all(&store).unwrap();
        symlink(&store, dir.path().join("system-42-link")).unwrap();
        symlink("system-42-link", dir.path().join("system")).unwrap();
        let g = generation(&dir.path().join("system")).unwrap();
        assert_eq!(g.number, Some(42));
        assert_eq!(g.path, std::fs::canonicalize(&store).unwrap());
        assert!(generation(&dir.path().join("missing")).is_none());
    }

    #[test]
    fn reboot_is_needed_when_kernel_initrd_or_modules_differ() {
        let dir = tempfile::tempdir().unwrap();
        let mk = |name: &str, kernel: &str| {
            let sys = dir.path().join(name);
            std::fs::create_dir_all(&sys).unwrap();
            for (part, target) in [
                ("kernel", kernel),
                ("initrd", "initrd-1"),
                ("kernel-modules", "mods-1"),
            ] {
                let t = dir.path().join(target);
                std::fs::write(&t, "").unwrap();
                let _ = symlink(&t, sys.join(part));
            }
            sys
        };
        let booted = mk("booted", "linux-6.6");
        let same = mk("same", "linux-6.6");
        let newer = mk("newer", "linux-6.12");
        assert!(reboot_reasons(&booted, &same).is_empty());
        let r = reboot_reasons(&booted, &newer);
        assert_eq!(r, ["kernel changed: linux-6.6 → linux-6.12"]);
    }

    #[test]
    fn self_image_changes_are_named() {
        let a = SelfImage {
            binary: Some("/nix/store/a/bin/ginx".into()),
            unit: Some("/u1".into()),
            ..Default::default()
        };
        let b = SelfImage {
            binary: Some("/nix/store/b/bin/ginx".into()),
            unit: Some("/u1".into()),
            ..Default::default()
        };
        assert_eq!(a.changed(&a), None);
        assert_eq!(a.changed(&b).unwrap(), "ginx's binary changed");
        assert_eq!(
            a.changed(&SelfImage::default()),
            None,
            "a missing file is not an update"
        );
    }

    /// A package manager replaces the binary at the same path: a new file, an update.
    #[test]
    fn a_binary_replaced_in_place_is_a_change() {
        let dir = tempfile::tempdir().unwrap();
        let (bin, unit) = (dir.path().join("ginx"), dir.path().join("ginx.service"));
        std::fs::write(&bin, "v1").unwrap();
        std::fs::write(&unit, "[Service]").unwrap();
        let before = SelfImage::read(&bin, &unit);
        assert_eq!(before.changed(&SelfImage::read(&bin, &unit)), None);
        let new = dir.path().join("ginx.new");
        std::fs::write(&new, "v2 longer").unwrap();
        std::fs::rename(&new, &bin).unwrap();
        assert_eq!(
            before.changed(&SelfImage::read(&bin, &unit)).unwrap(),
            "ginx's binary changed"
        );
    }
}
