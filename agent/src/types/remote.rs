//! Remote locations of Git sources and the revisions fetched from them.
//!
//! A [`RemoteUrl`] keeps the URL exactly as configured (git needs the credentials in it, if any)
//! but only ever *shows* it without a password, and without any userinfo at all for HTTP(S),
//! where a token is often written in the username position. Everything that prints a URL —
//! logs, status, errors, `check-config` — goes through `Display`/`Serialize`, which redact.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The transport a remote is reached by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    Ssh,
    Git,
    Http,
    Https,
    File,
}

/// A Git remote from the configuration: `ssh://`, `git://`, `http(s)://`, `file://`, an SCP-like
/// `user@host:path`, or an absolute path.
#[derive(Clone, PartialEq, Eq)]
pub struct RemoteUrl {
    /// What git is given. May carry credentials; never printed.
    raw: String,
    /// What humans see.
    shown: String,
    /// The parts of `raw` that `shown` hides because they may be credentials: a password, and
    /// for HTTP(S) and git:// the user name (tokens are often written there).
    secrets: Vec<String>,
    transport: Transport,
}

impl RemoteUrl {
    /// The URL to hand to git. Do not log it.
    pub fn as_git_url(&self) -> &str {
        &self.raw
    }

    pub fn transport(&self) -> Transport {
        self.transport
    }

    /// Whether the configured URL itself carries a password or token.
    pub fn has_inline_credentials(&self) -> bool {
        !self.secrets.is_empty()
    }

    /// `message` (from git) with the URL as configured replaced by the URL as shown, and any
    /// credential in it masked.
    pub fn scrub(&self, message: &str) -> String {
        let mut out = message.replace(&self.raw, &self.shown);
        for secret in &self.secrets {
            out = out.replace(secret.as_str(), "***");
        }
        out
    }
}

impl FromStr for RemoteUrl {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let raw = s.trim();
        if raw.is_empty() {
            return Err(
                "empty URL; give the remote as ssh://, https://, git://, file:// or an \
                        absolute path"
                    .into(),
            );
        }
        if raw.starts_with('/') {
            return Ok(Self {
                raw: raw.to_owned(),
                shown: raw.to_owned(),
                secrets: Vec::new(),
                transport: Transport::File,
            });
        }
        if let Some((scheme, _)) = raw.split_once("://") {
            let transport = match scheme.to_ascii_lowercase().as_str() {
                "ssh" | "git+ssh" | "ssh+git" => Transport::Ssh,
                "git" => Transport::Git,
                "http" => Transport::Http,
                "https" => Transport::Https,
                "file" => Transport::File,
                other => {
                    return Err(format!(
                        "unsupported URL scheme {other:?}; use ssh://, https://, http://, \
                         git://, file:// or an absolute path"
                    ));
                }
            };
            let mut url = url::Url::parse(raw).map_err(|e| {
                // The url crate's messages never echo the input, so no credential leaks here.
                format!("invalid URL: {e}")
            })?;
            if transport == Transport::File {
                if url.path().is_empty() || url.path() == "/" {
                    return Err("file:// URL without a path".into());
                }
            } else if url.host_str().is_none_or(str::is_empty) {
                return Err(format!("{scheme}:// URL without a host"));
            }
            let mut secrets: Vec<String> = url.password().map(str::to_owned).into_iter().collect();
            let _ = url.set_password(None);
            if matches!(
                transport,
                Transport::Http | Transport::Https | Transport::Git
            ) {
                secrets.push(url.username().to_owned());
                let _ = url.set_username("");
            }
            secrets.retain(|s| !s.is_empty());
            return Ok(Self {
                raw: raw.to_owned(),
                shown: url.to_string(),
                secrets,
                transport,
            });
        }
        // SCP-like syntax: [user[:password]@]host:path, with no slash before the colon that
        // ends the host.
        let (userinfo, rest) = match raw.split_once('@') {
            Some((u, r)) if !u.contains('/') => (Some(u), r),
            _ => (None, raw),
        };
        if let Some((host, path)) = rest.split_once(':')
            && !host.contains('/')
            && !host.is_empty()
            && !path.is_empty()
        {
            let (user, password) = match userinfo.map(|u| u.split_once(':').unwrap_or((u, ""))) {
                Some((user, password)) => (Some(user), password),
                None => (None, ""),
            };
            let shown = match user {
                Some(user) => format!("{user}@{host}:{path}"),
                None => format!("{host}:{path}"),
            };
            return Ok(Self {
                raw: raw.to_owned(),
                shown,
                secrets: (!password.is_empty())
                    .then(|| password.to_owned())
                    .into_iter()
                    .collect(),
                transport: Transport::Ssh,
            });
        }
        // Never echo the value: a mistyped URL may carry a token.
        Err(
            "the value is neither a URL nor an absolute path; use ssh://, https://, git://, \
             file://, user@host:path or an absolute path (relative paths are ambiguous for a \
             daemon)"
                .to_owned(),
        )
    }
}

impl fmt::Display for RemoteUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.shown)
    }
}

impl fmt::Debug for RemoteUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RemoteUrl({})", self.shown)
    }
}

impl Serialize for RemoteUrl {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.shown)
    }
}

impl<'de> Deserialize<'de> for RemoteUrl {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// A commit id: 40 (SHA-1) or 64 (SHA-256) lowercase hex digits.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Revision(String);

impl Revision {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The abbreviation used in status lines, unit names and logs.
    pub fn short(&self) -> &str {
        &self.0[..12]
    }

    pub fn from_oid(oid: git2::Oid) -> Self {
        Self(oid.to_string())
    }

    pub fn oid(&self) -> git2::Oid {
        // Validated at construction.
        git2::Oid::from_str(&self.0).unwrap_or(git2::Oid::ZERO_SHA1)
    }
}

impl FromStr for Revision {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let ok = matches!(s.len(), 40 | 64) && s.bytes().all(|b| b.is_ascii_hexdigit());
        if ok {
            Ok(Self(s.to_ascii_lowercase()))
        } else {
            Err(format!(
                "{s:?} is not a full commit id (40 or 64 hex digits)"
            ))
        }
    }
}

impl fmt::Display for Revision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for Revision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Revision({})", self.short())
    }
}

impl Serialize for Revision {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Revision {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn https_credentials_are_never_shown() {
        let u: RemoteUrl = "https://deploy:s3cr3t@git.example.com/infra/hephaestus.git"
            .parse()
            .unwrap();
        assert_eq!(
            u.to_string(),
            "https://git.example.com/infra/hephaestus.git"
        );
        assert!(!format!("{u:?}").contains("s3cr3t"));
        assert!(u.has_inline_credentials());
        assert!(u.as_git_url().contains("s3cr3t"));
        let t: RemoteUrl = "https://ghp_token@github.com/o/r.git".parse().unwrap();
        assert_eq!(t.to_string(), "https://github.com/o/r.git");
    }

    #[test]
    fn ssh_keeps_the_user_but_not_a_password() {
        let u: RemoteUrl = "ssh://git:pw@git.example.com:2222/infra/h.git"
            .parse()
            .unwrap();
        assert_eq!(u.to_string(), "ssh://git@git.example.com:2222/infra/h.git");
        assert_eq!(u.transport(), Transport::Ssh);
        // The user name is not a secret over SSH: git's messages keep it, the password goes.
        assert_eq!(
            u.scrub("git@git.example.com: git-upload-pack failed, password pw"),
            "git@git.example.com: git-upload-pack failed, password ***"
        );
        let scp: RemoteUrl = "git@github.com:org/repo.git".parse().unwrap();
        assert_eq!(scp.transport(), Transport::Ssh);
        assert_eq!(scp.to_string(), "git@github.com:org/repo.git");
    }

    #[test]
    fn a_password_in_scp_syntax_or_a_typo_is_never_shown() {
        let u: RemoteUrl = "git:hunter2@git.example.com:infra/h.git".parse().unwrap();
        assert_eq!(u.to_string(), "git@git.example.com:infra/h.git");
        assert_eq!(u.transport(), Transport::Ssh);
        assert!(u.has_inline_credentials());
        assert_eq!(
            u.scrub("cannot reach git:hunter2@git.example.com:infra/h.git (hunter2)"),
            "cannot reach git@git.example.com:infra/h.git (***)"
        );
        let e = "https//deploy:TOKEN@host/x"
            .parse::<RemoteUrl>()
            .unwrap_err();
        assert!(!e.contains("TOKEN"), "{e}");
    }

    #[test]
    fn paths_and_file_urls_are_local() {
        let p: RemoteUrl = "/srv/git/h.git".parse().unwrap();
        assert_eq!(p.transport(), Transport::File);
        assert_eq!(p.to_string(), "/srv/git/h.git");
        let f: RemoteUrl = "file:///srv/git/h.git".parse().unwrap();
        assert_eq!(f.transport(), Transport::File);
        assert!(!f.has_inline_credentials());
    }

    #[test]
    fn bad_urls_say_what_is_accepted() {
        assert!("".parse::<RemoteUrl>().unwrap_err().contains("empty URL"));
        assert!(
            "relative/path"
                .parse::<RemoteUrl>()
                .unwrap_err()
                .contains("absolute path")
        );
        assert!(
            "ftp://x/y"
                .parse::<RemoteUrl>()
                .unwrap_err()
                .contains("unsupported")
        );
        assert!("https://".parse::<RemoteUrl>().is_err());
    }

    #[test]
    fn revisions_are_full_hex_ids() {
        let r: Revision = "0123456789ABCDEF0123456789abcdef01234567".parse().unwrap();
        assert_eq!(r.as_str(), "0123456789abcdef0123456789abcdef01234567");
        assert_eq!(r.short(), "0123456789ab");
        assert!("abc".parse::<Revision>().is_err());
        assert!(
            "zz23456789abcdef0123456789abcdef01234567"
                .parse::<Revision>()
                .is_err()
        );
    }
}
