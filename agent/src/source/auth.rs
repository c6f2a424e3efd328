//! Credentials and server authentication for fetches: SSH deploy keys with host keys checked
//! against a known_hosts file, HTTPS tokens, and the refusal of secret files others can read.
//!
//! Secrets are read here and handed to the fetch transports (`transport/`); they are never
//! formatted into a message.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use hmac::{Hmac, Mac};
use ssh_key::known_hosts::{HostPatterns, KnownHosts, Marker};
use ssh_key::{HashAlg, PublicKey};

use crate::config::SourceConfig;

#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum AuthError {
    #[error("{what} {}: {message}", path.display())]
    File {
        what: &'static str,
        path: PathBuf,
        message: String,
    },
}

/// What a source authenticates with.
#[derive(Clone)]
pub struct Auth {
    ssh_key: Option<PathBuf>,
    known_hosts: PathBuf,
    /// `(username, token)`.
    token: Option<(String, String)>,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth")
            .field("ssh_key", &self.ssh_key)
            .field("known_hosts", &self.known_hosts)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// Refuses a secret file that is not a regular file owned by us and private to us.
pub fn check_secret_file(what: &'static str, path: &Path) -> Result<(), AuthError> {
    let err = |message: String| AuthError::File {
        what,
        path: path.to_owned(),
        message,
    };
    let meta = std::fs::metadata(path).map_err(|e| err(format!("cannot read it: {e}")))?;
    if !meta.is_file() {
        return Err(err("is not a regular file".into()));
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(err(format!(
            "is accessible by group or others (mode {mode:04o}); refusing to use it: run \
             `chmod 600 {}`",
            path.display()
        )));
    }
    let me = nix::unistd::geteuid().as_raw();
    if meta.uid() != me {
        return Err(err(format!(
            "is owned by uid {}, not by ginx's user (uid {me}); refusing to use it",
            meta.uid()
        )));
    }
    Ok(())
}

impl Auth {
    /// Reads and checks the secret files `cfg` names.
    pub fn load(cfg: &SourceConfig) -> Result<Self, AuthError> {
        if let Some(key) = &cfg.ssh_key_file {
            check_secret_file("ssh_key_file", key)?;
        }
        let token = match &cfg.token_file {
            Some(path) => {
                check_secret_file("token_file", path)?;
                let raw = std::fs::read_to_string(path).map_err(|e| AuthError::File {
                    what: "token_file",
                    path: path.clone(),
                    message: format!("cannot read it: {e}"),
                })?;
                let token = raw.trim().to_owned();
                if token.is_empty() {
                    return Err(AuthError::File {
                        what: "token_file",
                        path: path.clone(),
                        message: "is empty".into(),
                    });
                }
                Some((cfg.username.clone(), token))
            }
            None => None,
        };
        Ok(Self {
            ssh_key: cfg.ssh_key_file.clone(),
            known_hosts: cfg.known_hosts_file.clone(),
            token,
        })
    }

    /// The deploy key for SSH remotes.
    pub fn ssh_key(&self) -> Option<&Path> {
        self.ssh_key.as_deref()
    }

    /// The known_hosts file SSH host keys are checked against.
    pub fn known_hosts(&self) -> &Path {
        &self.known_hosts
    }

    /// `(username, token)` for HTTPS remotes.
    pub fn token(&self) -> Option<&(String, String)> {
        self.token.as_ref()
    }
}

impl Default for Auth {
    /// No credentials; host keys checked against the default known_hosts file.
    fn default() -> Self {
        Self {
            ssh_key: None,
            known_hosts: PathBuf::from("/etc/ssh/ssh_known_hosts"),
            token: None,
        }
    }
}

/// Checks `key` (offered by an SSH server) against the entries for `name` in the known_hosts
/// file at `path`. The error says what to do.
pub fn check_host_key(path: &Path, name: &str, key: &PublicKey) -> Result<(), String> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        format!(
            "cannot read known_hosts_file {}: {e}; the host key of {name} ({}) \
             cannot be checked",
            path.display(),
            key.fingerprint(HashAlg::Sha256)
        )
    })?;
    check_host_key_in(&text, path, name, key)
}

/// [`check_host_key`] against the known_hosts `text` read from `path`.
pub fn check_host_key_in(
    text: &str,
    path: &Path,
    name: &str,
    key: &PublicKey,
) -> Result<(), String> {
    let fingerprint = key.fingerprint(HashAlg::Sha256);
    let offered = key
        .to_openssh()
        .map(|s| s.split_whitespace().take(2).collect::<Vec<_>>().join(" "))
        .unwrap_or_default();
    let entries: Vec<_> = KnownHosts::new(text)
        .flatten()
        .filter(|e| patterns_match(e.host_patterns(), name))
        .collect();
    let same = |e: &ssh_key::known_hosts::Entry| e.public_key().key_data() == key.key_data();
    // A revocation anywhere in the file wins, as in OpenSSH.
    if entries
        .iter()
        .any(|e| matches!(e.marker(), Some(Marker::Revoked)) && same(e))
    {
        return Err(format!(
            "the host key of {name} ({fingerprint}) is marked @revoked in {}",
            path.display()
        ));
    }
    let plain: Vec<_> = entries.iter().filter(|e| e.marker().is_none()).collect();
    if plain.iter().any(|e| same(e)) {
        return Ok(());
    }
    let other_keys = plain;
    if other_keys.is_empty() {
        Err(format!(
            "the host key of {name} is unknown: {fingerprint} is not in known_hosts_file {}; \
             after checking the fingerprint with the server's operator, add the line \
             `{name} {offered}`",
            path.display()
        ))
    } else {
        Err(format!(
            "the host key of {name} has CHANGED: the server offered {fingerprint}, which is not \
             the key known_hosts_file {} lists for it; someone may be intercepting the \
             connection. If the server's key was replaced on purpose, update that file",
            path.display()
        ))
    }
}

fn patterns_match(patterns: &HostPatterns, name: &str) -> bool {
    match patterns {
        HostPatterns::HashedName { salt, hash } => {
            let Ok(mut mac) = Hmac::<sha1::Sha1>::new_from_slice(salt) else {
                return false;
            };
            mac.update(name.as_bytes());
            mac.verify_slice(hash).is_ok()
        }
        HostPatterns::Patterns(list) => {
            let mut matched = false;
            for p in list {
                if let Some(negated) = p.strip_prefix('!') {
                    if glob(negated, name) {
                        return false;
                    }
                } else if glob(p, name) {
                    matched = true;
                }
            }
            matched
        }
    }
}

/// OpenSSH host pattern matching: `*` any run, `?` one character, case-insensitive.
fn glob(pattern: &str, name: &str) -> bool {
    let p: Vec<char> = pattern.to_ascii_lowercase().chars().collect();
    let n: Vec<char> = name.to_ascii_lowercase().chars().collect();
    let (mut pi, mut ni) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == n[ni]) {
            pi += 1;
            ni += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ni));
            pi += 1;
        } else if let Some((sp, sn)) = star {
            pi = sp + 1;
            ni = sn + 1;
            star = Some((sp, sn + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    const KEY: &str =
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHTJ2ZdvRmi0nPZxYZlR2jDRdFDg/rTkNRoHzwNh7Rbf";
    const OTHER: &str =
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIMb5D9XJbHQTc5Iz3fxw7yk4rMAbJ5T2fR1N7rZgd0Dz";

    fn blob(openssh: &str) -> PublicKey {
        PublicKey::from_openssh(openssh).unwrap()
    }

    fn file(text: &str) -> tempfile::NamedTempFile {
        let f = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(f.path(), text).unwrap();
        f
    }

    #[test]
    fn a_listed_key_is_accepted_with_port_brackets() {
        let f = file(&format!("# comment\n[127.0.0.1]:2222 {KEY}\n"));
        assert!(check_host_key(f.path(), "[127.0.0.1]:2222", &blob(KEY)).is_ok());
        let e = check_host_key(f.path(), "127.0.0.1", &blob(KEY)).unwrap_err();
        assert!(e.contains("unknown"), "{e}");
    }

    #[test]
    fn an_unknown_host_says_what_line_to_add() {
        let f = file("");
        let e = check_host_key(f.path(), "git.example.com", &blob(KEY)).unwrap_err();
        assert!(e.contains("is unknown") && e.contains("SHA256:"), "{e}");
        assert!(e.contains(&format!("`git.example.com {KEY}`")), "{e}");
    }

    #[test]
    fn a_changed_key_is_called_out() {
        let f = file(&format!("git.example.com {OTHER}\n"));
        let e = check_host_key(f.path(), "git.example.com", &blob(KEY)).unwrap_err();
        assert!(e.contains("CHANGED") && e.contains("intercepting"), "{e}");
    }

    #[test]
    fn hashed_wildcard_negated_and_revoked_entries() {
        // `ssh-keygen -H` form of "git.example.com" with salt "salt-bytes-16...".
        let salt = b"0123456789abcdefghij";
        let mut mac = Hmac::<sha1::Sha1>::new_from_slice(salt).unwrap();
        mac.update(b"git.example.com");
        let hash = mac.finalize().into_bytes();
        use base64::Engine;
        let b64 = base64::engine::general_purpose::STANDARD;
        let hashed = format!("|1|{}|{}", b64.encode(salt), b64.encode(hash));
        let f = file(&format!("{hashed} {KEY}\n"));
        assert!(check_host_key(f.path(), "git.example.com", &blob(KEY)).is_ok());
        assert!(check_host_key(f.path(), "other.example.com", &blob(KEY)).is_err());

        let f = file(&format!("*.example.com,!bad.example.com {KEY}\n"));
        assert!(check_host_key(f.path(), "git.example.com", &blob(KEY)).is_ok());
        assert!(check_host_key(f.path(), "bad.example.com", &blob(KEY)).is_err());

        for text in [
            format!("@revoked * {KEY}\ngit.example.com {KEY}\n"),
            format!("git.example.com {KEY}\n@revoked * {KEY}\n"),
        ] {
            let f = file(&text);
            let e = check_host_key(f.path(), "git.example.com", &blob(KEY)).unwrap_err();
            assert!(e.contains("@revoked"), "{e}");
        }
    }

    #[test]
    fn secret_files_must_be_private() {
        let f = file("token\n");
        std::fs::set_permissions(f.path(), std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = check_secret_file("token_file", f.path())
            .unwrap_err()
            .to_string();
        assert!(e.contains("mode 0644") && e.contains("chmod 600"), "{e}");
        std::fs::set_permissions(f.path(), std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(check_secret_file("token_file", f.path()).is_ok());
    }

    #[test]
    fn globs() {
        assert!(glob("*.example.com", "a.example.com"));
        assert!(glob("git?.example.com", "git1.example.com"));
        assert!(!glob("*.example.com", "example.com"));
        assert!(glob("*", "anything"));
        assert!(glob("GIT.example.com", "git.EXAMPLE.com"));
    }
}
