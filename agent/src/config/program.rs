//! Whether a configured program can be run: the one check of the configuration that looks at
//! the file system beyond the configuration files. A typo in `rollout.gate.command` must be
//! refused at load and at reload: a gate whose command cannot run would pass without it.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::types::Invalid;

/// Where a bare name is looked up when `PATH` is not set (glibc's `execvp` default).
const DEFAULT_PATH: &str = "/bin:/usr/bin";

/// The file `program` runs as: a name with a `/` as it is, a bare name through `PATH`, as
/// `execvp` would. `Err` says what is wrong, naming the program.
pub(super) fn find(program: &str) -> Result<PathBuf, Invalid> {
    if program.contains('/') {
        let path = Path::new(program);
        return executable(path).map(|()| path.to_owned());
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| DEFAULT_PATH.into());
    let mut last = None;
    for dir in std::env::split_paths(&path) {
        let candidate = dir.join(program);
        match executable(&candidate) {
            Ok(()) => return Ok(candidate),
            // Found but not runnable says more than "not found".
            Err(e) if candidate.exists() => last = Some(e),
            Err(_) => {}
        }
    }
    Err(last.unwrap_or_else(|| {
        Invalid(format!(
            "{program:?} is not found in PATH ({})",
            path.to_string_lossy()
        ))
    }))
}

/// `Ok` when `path` is a file with an execute bit.
fn executable(path: &Path) -> Result<(), Invalid> {
    let meta =
        std::fs::metadata(path).map_err(|e| format!("{} cannot be run: {e}", path.display()))?;
    if !meta.is_file() {
        return Err(Invalid(format!("{} is not a file", path.display())));
    }
    let mode = meta.permissions().mode();
    if mode & 0o111 == 0 {
        return Err(Invalid(format!(
            "{} is not executable (mode {:o}); chmod +x it",
            path.display(),
            mode & 0o7777
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_name_is_found_through_path() {
        let found = find("sh").unwrap();
        assert!(found.is_absolute() && found.ends_with("sh"), "{found:?}");
    }

    #[test]
    fn a_missing_or_unrunnable_program_is_named() {
        let e = find("ginx-no-such-program-x").unwrap_err();
        assert!(
            e.0.contains("\"ginx-no-such-program-x\" is not found in PATH"),
            "{e}"
        );
        let dir = tempfile::tempdir().unwrap();
        let e = find(&dir.path().join("missing").display().to_string()).unwrap_err();
        assert!(
            e.0.contains("cannot be run") && e.0.contains("missing"),
            "{e}"
        );
        let script = dir.path().join("check");
        std::fs::write(&script, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = find(&script.display().to_string()).unwrap_err();
        assert!(e.0.contains("is not executable (mode 644)"), "{e}");
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(find(&script.display().to_string()).unwrap(), script);
        let e = find(&dir.path().display().to_string()).unwrap_err();
        assert!(e.0.contains("is not a file"), "{e}");
    }
}
