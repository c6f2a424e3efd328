//! Closure mode's values: a store path checked for its syntax before anything runs, where the
//! pointer to it came from, and what fetching it found (kept in status and history).

use serde::{Deserialize, Serialize};

use super::Invalid;

/// The store directory a NixOS system lives in.
pub const STORE_DIR: &str = "/nix/store/";

/// Nix's base-32 alphabet (no e, o, u, t).
const BASE32: &str = "0123456789abcdfghijklmnpqrsvwxyz";

/// `/nix/store/<32 base-32 chars>-<name>`, nothing after the name; `Err` says what is wrong
/// without echoing more than a bounded part of the input.
pub fn check_store_path(s: &str) -> Result<(), Invalid> {
    let shown: String = s.chars().take(120).collect();
    let Some(rest) = s.strip_prefix(STORE_DIR) else {
        return Err(Invalid(format!("{shown:?} is not in {STORE_DIR}")));
    };
    let (hash, name) = match rest.split_once('-') {
        Some((h, n)) => (h, n),
        None => (rest, ""),
    };
    if hash.len() != 32 || !hash.chars().all(|c| BASE32.contains(c)) {
        return Err(Invalid(format!(
            "{shown:?}: the hash after {STORE_DIR} must be 32 characters of Nix's base-32 \
             ({BASE32})"
        )));
    }
    let name_ok = |c: char| c.is_ascii_alphanumeric() || "+-._?=".contains(c);
    if name.is_empty() || name.len() > 211 || name.starts_with('.') || !name.chars().all(name_ok) {
        return Err(Invalid(format!(
            "{shown:?}: the name after the hash must be 1 to 211 of A-Z a-z 0-9 + - . _ ? = \
             (not starting with a dot, no /)"
        )));
    }
    Ok(())
}

/// Where the store path came from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum ClosureOrigin {
    /// A file of the apply source at a revision (verified like any commit).
    File {
        source: String,
        revision: String,
        file: String,
    },
    /// A pin endpoint (the URL as shown: no credentials, query values masked).
    Url { url: String },
}

impl std::fmt::Display for ClosureOrigin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClosureOrigin::File {
                source,
                revision,
                file,
            } => write!(
                f,
                "{source}:{file}@{}",
                revision.get(..12).unwrap_or(revision)
            ),
            ClosureOrigin::Url { url } => f.write_str(url),
        }
    }
}

/// One closure-mode attempt: the path, its closure's size, how long it took to fetch, where
/// the pointer came from, and why it failed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClosureInfo {
    pub path: String,
    pub origin: ClosureOrigin,
    /// `closureSize` of `nix path-info -S --json`, in bytes.
    #[serde(default)]
    pub closure_size: Option<u64>,
    /// How long `nix-store --realise` took, in seconds.
    #[serde(default)]
    pub realise_seconds: Option<f64>,
    /// Why the attempt failed, in closure mode's words (the signature problem, the missing
    /// path, not a NixOS system…).
    #[serde(default)]
    pub error: Option<String>,
    /// The failure will not go away by retrying the same revision.
    #[serde(default)]
    pub permanent: bool,
}

impl ClosureInfo {
    /// `/nix/store/pbp9n4v9…-nixos-system-lucy`: the hash cut to 8 characters.
    pub fn short_path(&self) -> String {
        let rest = self.path.strip_prefix(STORE_DIR);
        match (
            rest.and_then(|r| r.get(..8)),
            rest.and_then(|r| r.get(32..)),
        ) {
            (Some(head), Some(tail)) if !tail.is_empty() => format!("{STORE_DIR}{head}…{tail}"),
            _ => self.path.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_paths_are_checked_for_their_syntax() {
        let ok = "/nix/store/pbp9n4v9fkih4zbin8995myqhm4bg0s1-nixos-system-lucy-26.05";
        assert!(check_store_path(ok).is_ok());
        for bad in [
            "",
            "nix/store/pbp9n4v9fkih4zbin8995myqhm4bg0s1-x",
            "/nix/store/pbp9n4v9fkih4zbin8995myqhm4bg0s1",
            "/nix/store/pbp9n4v9fkih4zbin8995myqhm4bg0s1-",
            "/nix/store/pbp9n4v9fkih4zbin8995myqhm4bg0e1-x", // e is not base-32
            "/nix/store/pbp9n4v9fkih4zbin8995myqhm4bg0s-x",  // 31 characters
            "/nix/store/pbp9n4v9fkih4zbin8995myqhm4bg0s1-x/bin/sh",
            "/nix/store/pbp9n4v9fkih4zbin8995myqhm4bg0s1-.hidden",
            "/nix/store/pbp9n4v9fkih4zbin8995myqhm4bg0s1-a b",
            "/tmp/pbp9n4v9fkih4zbin8995myqhm4bg0s1-x",
        ] {
            assert!(check_store_path(bad).is_err(), "{bad:?}");
        }
        let info = ClosureInfo {
            path: ok.into(),
            origin: ClosureOrigin::File {
                source: "hephaestus".into(),
                revision: "0123456789abcdef0123456789abcdef01234567".into(),
                file: "hosts/lucy.closure".into(),
            },
            closure_size: None,
            realise_seconds: None,
            error: None,
            permanent: false,
        };
        assert_eq!(
            info.short_path(),
            "/nix/store/pbp9n4v9…-nixos-system-lucy-26.05"
        );
        // Whatever a report file says, printing it never panics.
        let odd = ClosureInfo {
            path: format!("/nix/store/a{}-x", "é".repeat(16)),
            ..info.clone()
        };
        assert_eq!(odd.short_path(), odd.path);
        assert_eq!(
            info.origin.to_string(),
            "hephaestus:hosts/lucy.closure@0123456789ab"
        );
    }
}
