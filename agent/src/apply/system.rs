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

/// The files ginx runs from, as resolved when it started.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SelfImage {
    pub binary: Option<PathBuf>,
    pub unit: Option<PathBuf>,
}

impl SelfImage {
    pub fn read(binary: &Path, unit: &Path) -> Self {
        Self {
            binary: resolve(binary),
            unit: resolve(unit),
        }
    }

    /// What changed between `self` (at start) and `now`, if anything did.
    pub fn changed(&self, now: &SelfImage) -> Option<String> {
        let mut what = Vec::new();
        if now.binary.is_some() && now.binary != self.binary {
            what.push("binary");
        }
        if now.unit.is_some() && now.unit != self.unit {
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
        };
        let b = SelfImage {
            binary: Some("/nix/store/b/bin/ginx".into()),
            unit: Some("/u1".into()),
        };
        assert_eq!(a.changed(&a), None);
        assert_eq!(a.changed(&b).unwrap(), "ginx's binary changed");
        let gone = SelfImage {
            binary: None,
            unit: None,
        };
        assert_eq!(a.changed(&gone), None, "a missing file is not an update");
    }
}
