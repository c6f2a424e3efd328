//! `[sources.NAME]`: the Git sources, their remotes, branches, credentials and signature policy.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::load::join_key;
use super::{ConfigError, Ctx, Duration, bounds};
use crate::types::Invalid;
use crate::types::{Goal, RemoteUrl, Transport};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceConfig {
    /// The remote. Shown everywhere without credentials. Either this or `urls`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<RemoteUrl>,
    /// Several remotes, tried in order on every fetch; the first that answers serves.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub urls: Vec<RemoteUrl>,
    /// The branch whose head is applied (or, for other sources, reported).
    #[serde(default = "default_branch")]
    pub branch: String,
    /// How often to fetch; each wait is jittered by ±10% so a fleet does not fetch in step.
    #[serde(default = "default_interval")]
    pub interval: Duration,
    /// A fetch (all remotes together) taking longer is abandoned and counted as failed.
    #[serde(default = "default_fetch_timeout")]
    pub fetch_timeout: Duration,
    /// Private key for SSH remotes (a deploy key); must not be readable by group or others. The
    /// only identity `ssh` offers (no agent, no `~/.ssh`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh_key_file: Option<PathBuf>,
    /// Host keys SSH remotes are checked against, by `ssh`, and no other file; an unknown or
    /// changed key is an error.
    #[serde(default = "default_known_hosts_file")]
    pub known_hosts_file: PathBuf,
    /// Token for HTTPS remotes, sent as the password of HTTP basic authentication.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_file: Option<PathBuf>,
    /// The user name sent with `token_file` (some servers want a particular one).
    #[serde(default = "default_token_username")]
    pub username: String,
    /// Git's SSH allowed-signers file (`gpg.format=ssh`): when set, the head must carry a valid
    /// SSH signature by a key listed there for the `git` namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_signers_file: Option<PathBuf>,
    /// OpenPGP public keys (armored or binary): when set, the head must carry a valid OpenPGP
    /// signature by one of them. With `allowed_signers_file` too, either kind is accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub openpgp_keyring_file: Option<PathBuf>,
    /// A per-node branch (`{node}` is replaced) preferred while it descends from `branch`'s
    /// head, applied with `testing_goal`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub testing_branch: Option<String>,
    /// The goal for revisions of the testing branch; `test` does not touch the boot entries, so
    /// a reboot returns to the last deployment of `branch`.
    #[serde(default = "default_testing_goal")]
    pub testing_goal: Goal,
    /// A directory inside the repository to apply in (a hive in a subfolder).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
}

impl SourceConfig {
    /// The remotes in the order they are tried.
    pub fn remotes(&self) -> Vec<RemoteUrl> {
        if self.urls.is_empty() {
            self.url.iter().cloned().collect()
        } else {
            self.urls.clone()
        }
    }

    /// The testing branch of node `node`, if one is configured.
    pub fn testing_branch_for(&self, node: &str) -> Option<String> {
        self.testing_branch
            .as_ref()
            .map(|t| t.replace("{node}", node))
    }
}

fn default_branch() -> String {
    "main".to_owned()
}

fn default_interval() -> Duration {
    Duration::from_secs(60)
}

fn default_fetch_timeout() -> Duration {
    Duration::from_secs(5 * 60)
}

fn default_known_hosts_file() -> PathBuf {
    PathBuf::from("/etc/ssh/ssh_known_hosts")
}

fn default_token_username() -> String {
    "git".to_owned()
}

fn default_testing_goal() -> Goal {
    Goal::Test
}

/// Checks every source; there must be at least one.
pub(super) fn validate(
    sources: &mut BTreeMap<String, SourceConfig>,
    node: &str,
    ctx: &Ctx<'_>,
) -> Result<(), ConfigError> {
    if sources.is_empty() {
        return Err(ctx.error(
            "sources",
            "no sources configured; add a [sources.hephaestus] table with a url",
        ));
    }
    for (name, source) in sources {
        source.validate(&join_key("sources", name), name, node, ctx)?;
    }
    Ok(())
}

impl SourceConfig {
    /// Checks the source named `name`, whose table is `key`; `url` and `urls` set in different
    /// files resolve to the later one.
    fn validate(
        &mut self,
        key: &str,
        name: &str,
        node: &str,
        ctx: &Ctx<'_>,
    ) -> Result<(), ConfigError> {
        check_source_name(name).map_err(|m| ctx.error_at(key, false, m))?;
        let branch_ok = !self.branch.is_empty()
            && git2::Reference::is_valid_name(&format!("refs/heads/{}", self.branch));
        if !branch_ok {
            return Err(ctx.error(
                &join_key(key, "branch"),
                format!("{:?} is not a valid branch name", self.branch),
            ));
        }
        for (field, bound, d) in [
            ("interval", &bounds::SOURCE_INTERVAL, self.interval),
            (
                "fetch_timeout",
                &bounds::SOURCE_FETCH_TIMEOUT,
                self.fetch_timeout,
            ),
        ] {
            bound.check_at(ctx, &join_key(key, field), d)?;
        }
        self.resolve_url_or_urls(key, ctx)?;
        self.check_credentials(key, ctx)?;
        self.check_testing_branch(key, node, ctx)?;
        self.check_path(key, ctx)
    }

    /// Exactly one of `url` and `urls`: when both are set in different files, the later file's
    /// wins (and the other is dropped); both in one file, or neither, is an error.
    fn resolve_url_or_urls(&mut self, key: &str, ctx: &Ctx<'_>) -> Result<(), ConfigError> {
        match (&self.url, self.urls.is_empty()) {
            (Some(_), false) => {
                // Set in different files, the later one wins like any other key.
                let file_of = |k: &str| {
                    let at = ctx.origins.find(&join_key(key, k)).map(|o| &o.key.file);
                    ctx.files.iter().position(|f| Some(f) == at)
                };
                match (file_of("url"), file_of("urls")) {
                    (Some(u), Some(us)) if us > u => self.url = None,
                    (Some(u), Some(us)) if u > us => self.urls.clear(),
                    _ => {
                        return Err(ctx.error_at(
                            &join_key(key, "urls"),
                            false,
                            "set either url or urls in one file, not both",
                        ));
                    }
                }
            }
            (None, true) => {
                return Err(ctx.error_at(
                    key,
                    false,
                    "missing url; give the remote as url = \"...\" (or several as urls = [...])",
                ));
            }
            _ => {}
        }
        Ok(())
    }

    /// The credential files: each set only when a remote uses it, fit to hand to ssh, and
    /// absolute (as are the signature keys and the known hosts).
    fn check_credentials(&self, key: &str, ctx: &Ctx<'_>) -> Result<(), ConfigError> {
        let remotes = self.remotes();
        if self.ssh_key_file.is_some() && !remotes.iter().any(|r| r.transport() == Transport::Ssh) {
            return Err(ctx.error(
                &join_key(key, "ssh_key_file"),
                "is set but no remote of this source uses SSH",
            ));
        }
        if remotes.iter().any(|r| r.transport() == Transport::Ssh) {
            for (field, path) in [
                ("ssh_key_file", self.ssh_key_file.as_ref()),
                ("known_hosts_file", Some(&self.known_hosts_file)),
            ] {
                if let Some(why) = path.and_then(|p| crate::types::unfit_for_ssh_option(p)) {
                    return Err(ctx.error(
                        &join_key(key, field),
                        format!(
                            "{} {why}",
                            path.map(|p| p.display().to_string()).unwrap_or_default()
                        ),
                    ));
                }
            }
        }
        if self.token_file.is_some()
            && !remotes
                .iter()
                .any(|r| matches!(r.transport(), Transport::Http | Transport::Https))
        {
            return Err(ctx.error(
                &join_key(key, "token_file"),
                "is set but no remote of this source uses HTTP(S)",
            ));
        }
        for (field, path) in [
            ("ssh_key_file", &self.ssh_key_file),
            ("token_file", &self.token_file),
            ("allowed_signers_file", &self.allowed_signers_file),
            ("openpgp_keyring_file", &self.openpgp_keyring_file),
            ("known_hosts_file", &Some(self.known_hosts_file.clone())),
        ] {
            if let Some(p) = path
                && !p.is_absolute()
            {
                return Err(ctx.error(
                    &join_key(key, field),
                    format!("{} must be an absolute path", p.display()),
                ));
            }
        }
        Ok(())
    }

    /// The testing branch this node follows, if any: a valid branch name, not the main one.
    fn check_testing_branch(
        &self,
        key: &str,
        node: &str,
        ctx: &Ctx<'_>,
    ) -> Result<(), ConfigError> {
        if let Some(testing) = self.testing_branch_for(node) {
            let valid = !testing.is_empty()
                && git2::Reference::is_valid_name(&format!("refs/heads/{testing}"));
            if !valid {
                return Err(ctx.error(
                    &join_key(key, "testing_branch"),
                    format!("{testing:?} is not a valid branch name"),
                ));
            }
            if testing == self.branch {
                return Err(ctx.error(&join_key(key, "testing_branch"), "must differ from branch"));
            }
        }
        Ok(())
    }

    /// `path`, the hive's directory: relative, inside the repository.
    fn check_path(&self, key: &str, ctx: &Ctx<'_>) -> Result<(), ConfigError> {
        if let Some(p) = &self.path {
            let ok = p.is_relative()
                && p.components().all(|c| {
                    matches!(
                        c,
                        std::path::Component::Normal(_) | std::path::Component::CurDir
                    )
                });
            if !ok {
                return Err(ctx.error(
                    &join_key(key, "path"),
                    format!(
                        "{} must be a relative path inside the repository, without \"..\"",
                        p.display()
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// Source names become directory names and parts of annotation keys.
fn check_source_name(name: &str) -> Result<(), Invalid> {
    let ok = !name.is_empty()
        && name.len() <= 40
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
        && name.starts_with(|c: char| c.is_ascii_lowercase());
    if ok {
        Ok(())
    } else {
        Err(Invalid(format!(
            "source name {name:?} must start with a lowercase letter and use only lowercase \
             letters, digits, '-' and '_' (at most 40)"
        )))
    }
}
