//! Remote locations of Git sources and the revisions fetched from them.
//!
//! A [`RemoteUrl`] keeps the URL exactly as configured (git needs the credentials in it, if any)
//! and, when it is parsed, builds once the form that is shown: without a password, without any
//! user name for HTTP(S) and git:// (a token is often written there), and with the value of
//! every query parameter and the fragment replaced by `***`. Everything that prints a URL —
//! logs, status, errors, `check-config` — goes through `Display`/`Serialize`, which print only
//! that form. Credentials are never searched for in text to be masked after the fact: a URL
//! whose credentials cannot be told apart from its host or path unambiguously is refused, with
//! a message that does not echo it.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::Invalid;

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
    /// What humans see, built from the parsed parts without the credentials.
    shown: String,
    /// Whether `raw` carries something `shown` leaves out (a password, a user name over
    /// HTTP(S)/git://, a query or fragment).
    hides_credentials: bool,
    transport: Transport,
}

/// Schemes a remote may be written with.
const SCHEMES: [&str; 7] = ["ssh", "git+ssh", "ssh+git", "git", "http", "https", "file"];

const ACCEPTED: &str = "use ssh://, https://, git://, file://, user@host:path or an absolute path";

impl RemoteUrl {
    /// The URL to hand to git. Do not log it.
    pub fn as_git_url(&self) -> &str {
        &self.raw
    }

    pub fn transport(&self) -> Transport {
        self.transport
    }

    /// The directory of a local remote (an absolute path or a `file://` URL).
    pub fn local_path(&self) -> Option<std::path::PathBuf> {
        if self.transport != Transport::File {
            return None;
        }
        if self.raw.starts_with('/') {
            return Some(self.raw.clone().into());
        }
        url::Url::parse(&self.raw).ok()?.to_file_path().ok()
    }

    /// Whether the configured URL itself carries a password, token or query.
    pub fn has_inline_credentials(&self) -> bool {
        self.hides_credentials
    }

    /// `message` (from git) with every occurrence of the whole URL as configured replaced by the
    /// URL as shown. Parts of the URL are not searched for: git's messages name the remote by
    /// its whole URL, and masking fragments of a message mangles it.
    pub fn scrub(&self, message: &str) -> String {
        if self.raw == self.shown {
            message.to_owned()
        } else {
            message.replace(&self.raw, &self.shown)
        }
    }

    fn url_form(raw: &str, scheme: &str, rest: &str) -> Result<Self, Invalid> {
        let transport = match scheme.to_ascii_lowercase().as_str() {
            "ssh" | "git+ssh" | "ssh+git" => Transport::Ssh,
            "git" => Transport::Git,
            "http" => Transport::Http,
            "https" => Transport::Https,
            "file" => Transport::File,
            other => {
                return Err(Invalid(format!(
                    "unsupported URL scheme {other:?}; use ssh://, https://, http://, git://, \
                     file:// or an absolute path"
                )));
            }
        };
        one_at_in_authority(rest)?;
        let url = url::Url::parse(raw).map_err(|e| {
            // The url crate's messages never echo the input, so no credential leaks here.
            format!("invalid URL: {e}")
        })?;
        if transport == Transport::File {
            if url.path().is_empty() || url.path() == "/" {
                return Err("file:// URL without a path".into());
            }
        } else if url.host_str().is_none_or(str::is_empty) {
            return Err(Invalid(format!("{scheme}:// URL without a host")));
        }
        let keep_user = transport == Transport::Ssh;
        let shown = redacted(&url, keep_user);
        Ok(Self {
            raw: raw.to_owned(),
            hides_credentials: hides_credentials(&url, keep_user),
            shown,
            transport,
        })
    }

    /// `[user[:password]@]host:path`. An `@` may appear once, between the user information and
    /// the host; anything else cannot be split into credentials and location unambiguously.
    fn scp_form(raw: &str) -> Result<Self, Invalid> {
        let ambiguous = "an `@` in a user@host:path remote must separate the user (and \
                         password) from the host, and may appear only once; write the remote as \
                         ssh://user@host/path with `@` in the user name or password written as %40";
        let (userinfo, rest) = match raw.split_once('@') {
            Some((u, r)) if !r.contains('@') => (Some(u), r),
            Some(_) => return Err(Invalid(ambiguous.to_owned())),
            None => (None, raw),
        };
        let Some((host, path)) = split_host(rest) else {
            return Err(match userinfo {
                Some(_) => Invalid(ambiguous.to_owned()),
                None => Invalid(format!(
                    "the value is neither a URL nor an absolute path; {ACCEPTED} (relative \
                     paths are ambiguous for a daemon)"
                )),
            });
        };
        let (user, password) = match userinfo {
            Some(u) => {
                let (user, password) = u.split_once(':').unwrap_or((u, ""));
                if user.is_empty() || user.contains('/') {
                    return Err(Invalid(ambiguous.to_owned()));
                }
                (Some(user), password)
            }
            None => (None, ""),
        };
        let shown = match user {
            Some(user) => format!("{user}@{host}:{path}"),
            None => format!("{host}:{path}"),
        };
        Ok(Self {
            raw: raw.to_owned(),
            shown,
            hides_credentials: !password.is_empty(),
            transport: Transport::Ssh,
        })
    }
}

/// `host:path` of an SCP-like remote (the host may be a bracketed IPv6 address); `None` when
/// `rest` is not of that shape.
fn split_host(rest: &str) -> Option<(&str, &str)> {
    let (host, path) = if rest.starts_with('[') {
        let end = rest.find(']')?;
        let (host, after) = rest.split_at(end + 1);
        (host, after.strip_prefix(':')?)
    } else {
        rest.split_once(':')?
    };
    (!host.is_empty() && !host.contains('/') && !path.is_empty()).then_some((host, path))
}

/// Refuses an authority (`rest` is what follows `scheme://`) with more than one `@`: parsers
/// disagree on which one ends the user information.
fn one_at_in_authority(rest: &str) -> Result<(), Invalid> {
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    if authority.matches('@').count() > 1 {
        return Err(Invalid(
            "more than one `@` before the host: write an `@` in the user name or \
                    password as %40"
                .to_owned(),
        ));
    }
    // Another URL with a password further on (`https://proxy/https://u:pw@host/x`): it is
    // part of the path, which is shown, and whoever wrote it meant it as credentials (found by
    // the fuzzer: fuzz/regressions/config/a-url-in-the-path-with-a-password).
    no_url_with_password_in(
        rest[authority.len()..]
            .split(['?', '#'])
            .next()
            .unwrap_or(""),
    )
}

/// Refuses a path (shown as written) that holds a URL with a user name and password.
fn no_url_with_password_in(path: &str) -> Result<(), Invalid> {
    // `//` rather than `://`: the scheme's `:` may end the authority (`https://h:/…`, found
    // by the fuzzer), and `//user:pw@host` is a URL too.
    for (at, _) in path.match_indices("//") {
        let inner = path[at + 2..].split(['/', '?', '#']).next().unwrap_or("");
        if let Some((userinfo, _)) = inner.rsplit_once('@')
            && userinfo.contains(':')
        {
            return Err(Invalid(
                "a URL with a user name and password is written into the path: ginx would \
                 show it; give credentials with token_file (or write the inner `:` and `@` as \
                 %3A and %40 if they are not credentials)"
                    .to_owned(),
            ));
        }
    }
    Ok(())
}

/// Whether `raw` is `scheme:/` without the second `/` (`https:/user:pw@host/x`): git would
/// take it for an SCP-like remote on a host named like the scheme, and show its credentials as
/// part of the path.
fn mistyped_scheme(raw: &str) -> Option<String> {
    let (head, rest) = raw.split_once(':')?;
    (rest.starts_with('/') && SCHEMES.iter().any(|s| s.eq_ignore_ascii_case(head))).then(|| {
        format!(
            "the value starts like a {head}:// URL but lacks `://` after the scheme; write \
                 {head}://host/path"
        )
    })
}

/// `url` as shown: no password; no user name unless `keep_user`; every query value and the
/// fragment replaced by `***` (tokens are passed there: `?private_token=…`, `?sig=…`).
pub(crate) fn redacted(url: &url::Url, keep_user: bool) -> String {
    let mut url = url.clone();
    let _ = url.set_password(None);
    if !keep_user {
        let _ = url.set_username("");
    }
    if let Some(query) = url.query().filter(|q| !q.is_empty()) {
        let hidden: Vec<String> = query
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((name, _)) => format!("{name}=***"),
                None => "***".to_owned(),
            })
            .collect();
        url.set_query(Some(&hidden.join("&")));
    }
    if url.fragment().is_some_and(|f| !f.is_empty()) {
        url.set_fragment(Some("***"));
    }
    url.to_string()
}

/// Whether [`redacted`] leaves something out of `url`.
pub(crate) fn hides_credentials(url: &url::Url, keep_user: bool) -> bool {
    url.password().is_some()
        || (!keep_user && !url.username().is_empty())
        || url.query().is_some_and(|q| !q.is_empty())
        || url.fragment().is_some_and(|f| !f.is_empty())
}

/// Refuses `scheme:/` with one slash and an authority with more than one `@` (see
/// [`mistyped_scheme`], [`one_at_in_authority`]); for other URL types that share the rule.
pub(crate) fn check_unambiguous(raw: &str) -> Result<(), Invalid> {
    match raw.split_once("://") {
        Some((_, rest)) => one_at_in_authority(rest),
        None => Err(Invalid(mistyped_scheme(raw).unwrap_or_else(|| {
            "not a URL: write scheme://host/path".to_owned()
        }))),
    }
}

impl FromStr for RemoteUrl {
    type Err = Invalid;

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
            // `/ttps://git:pw@host`, a URL mistyped into a path (found by the fuzzer).
            no_url_with_password_in(raw)?;
            return Ok(Self {
                raw: raw.to_owned(),
                shown: raw.to_owned(),
                hides_credentials: false,
                transport: Transport::File,
            });
        }
        if let Some((scheme, rest)) = raw.split_once("://") {
            return Self::url_form(raw, scheme, rest);
        }
        if let Some(e) = mistyped_scheme(raw) {
            return Err(Invalid(e));
        }
        Self::scp_form(raw)
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
    type Err = Invalid;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let ok = matches!(s.len(), 40 | 64) && s.bytes().all(|b| b.is_ascii_hexdigit());
        if ok {
            Ok(Self(s.to_ascii_lowercase()))
        } else {
            Err(Invalid(format!(
                "{s:?} is not a full commit id (40 or 64 hex digits)"
            )))
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

/// Why `path` cannot be handed to `ssh -o Option="path"` (OpenSSH expands `%` and `~` in
/// file options and splits on quotes): `None` when it can.
pub fn unfit_for_ssh_option(path: &std::path::Path) -> Option<&'static str> {
    match path.to_str() {
        None => Some("is not UTF-8"),
        Some(s) if s.contains(['"', '\'', '\\', '%', '\n']) || s.starts_with('~') => Some(
            "contains a quote, backslash, `%` or newline, or begins with `~`, which ssh's options \
             cannot carry; move the file to a plain path",
        ),
        Some(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_with_a_password_in_the_path_is_refused_without_echoing_it() {
        for raw in [
            "https://proxy.example/https://u:hunter2x@git.example/x.git",
            "ssh://git@proxy.example/git+ssh://u:hunter2x@git.example/x",
            "/ttps://git:hunter2x@git.example/x",
            "https://proxy.example://u:hunter2x@git.example/x",
            "https://proxy.example//u:hunter2x@git.example/x",
        ] {
            let e = raw.parse::<RemoteUrl>().unwrap_err();
            assert!(e.0.contains("a URL with a user name and password"), "{e}");
            assert!(!e.0.contains("hunter2x"), "{e}");
        }
        // Without a password, or in the query (which is masked), it is a path like any other.
        "https://proxy.example/https://git.example/x.git"
            .parse::<RemoteUrl>()
            .unwrap();
        let u: RemoteUrl = "https://h.example/x?next=https://u:hunter2x@g"
            .parse()
            .unwrap();
        assert!(!u.to_string().contains("hunter2x"));
    }

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
            u.scrub("ssh://git:pw@git.example.com:2222/infra/h.git: git-upload-pack failed"),
            "ssh://git@git.example.com:2222/infra/h.git: git-upload-pack failed"
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
            u.scrub("cannot reach git:hunter2@git.example.com:infra/h.git"),
            "cannot reach git@git.example.com:infra/h.git"
        );
        let e = "https//deploy:TOKEN@host/x"
            .parse::<RemoteUrl>()
            .unwrap_err();
        assert!(!e.0.contains("TOKEN"), "{e}");
    }

    #[test]
    fn a_single_slash_after_the_scheme_is_refused_without_echo() {
        for raw in [
            "https:/user:SECRET@host/x",
            "https:user:SECRET@host/x",
            "ssh:/host/x",
        ] {
            let e = raw.parse::<RemoteUrl>().map(|u| u.to_string()).unwrap_err();
            assert!(!e.0.contains("SECRET") && e.0.contains("://"), "{raw}: {e}");
        }
    }

    #[test]
    fn a_slash_in_an_scp_password_is_not_shown() {
        let u: RemoteUrl = "deploy:SEC/RET+x==@git.example.com:infra/h.git"
            .parse()
            .unwrap();
        assert_eq!(u.to_string(), "deploy@git.example.com:infra/h.git");
        assert!(!format!("{u:?}").contains("SEC"));
        assert!(u.has_inline_credentials());
    }

    #[test]
    fn an_at_sign_in_a_password_is_refused_without_echo() {
        for raw in [
            "git:SE@CRET@host:x",
            "git@SE@CRET.host:x",
            "https://u:SE@CRET@host/x",
            "ssh://git:SE@CRET@host/x",
        ] {
            let e = raw.parse::<RemoteUrl>().map(|u| u.to_string()).unwrap_err();
            assert!(!e.0.contains("CRET") && e.0.contains("%40"), "{raw}: {e}");
        }
    }

    #[test]
    fn query_tokens_are_never_shown() {
        for raw in [
            "https://git.example.com/r.git?private_token=SECRET",
            "https://git.example.com/r.git?ref=x&access_token=SECRET",
            "http://git.example.com/r.git?sig=SECRET#SECRET",
            "ssh://git@git.example.com/r.git?key=SECRET",
        ] {
            let u: RemoteUrl = raw.parse().unwrap();
            let shown = u.to_string();
            assert!(!shown.contains("SECRET"), "{raw}: {shown}");
            assert!(u.has_inline_credentials(), "{raw}");
        }
        let u: RemoteUrl = "https://h.example/r.git?private_token=SECRET&ref=x"
            .parse()
            .unwrap();
        assert_eq!(
            u.to_string(),
            "https://h.example/r.git?private_token=***&ref=***"
        );
    }

    #[test]
    fn a_one_letter_user_name_does_not_mangle_git_messages() {
        let raw = "https://t:PASSWORD@git.example.com/infra/h.git";
        let u: RemoteUrl = raw.parse().unwrap();
        let m = "failed to connect to git.example.com: Connection refused";
        assert_eq!(u.scrub(m), m);
        assert_eq!(
            u.scrub(&format!("cannot fetch {raw}: no route")),
            "cannot fetch https://git.example.com/infra/h.git: no route"
        );
    }

    #[test]
    fn paths_and_file_urls_are_local() {
        let p: RemoteUrl = "/srv/git/h.git".parse().unwrap();
        assert_eq!(p.transport(), Transport::File);
        assert_eq!(p.to_string(), "/srv/git/h.git");
        let f: RemoteUrl = "file:///srv/git/h.git".parse().unwrap();
        assert_eq!(f.transport(), Transport::File);
        assert_eq!(p.local_path(), f.local_path());
        assert_eq!(f.local_path(), Some("/srv/git/h.git".into()));
        assert!(!f.has_inline_credentials());
    }

    #[test]
    fn bad_urls_say_what_is_accepted() {
        assert!("".parse::<RemoteUrl>().unwrap_err().0.contains("empty URL"));
        assert!(
            "relative/path"
                .parse::<RemoteUrl>()
                .unwrap_err()
                .0
                .contains("absolute path")
        );
        assert!(
            "ftp://x/y"
                .parse::<RemoteUrl>()
                .unwrap_err()
                .0
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
