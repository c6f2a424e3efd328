//! `[apply]`: the apply command, its goal, timeouts, retries, isolation and hooks.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{ConfigError, Ctx, Duration, bounds};
use crate::types::Goal;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ApplyConfig {
    /// The source whose revisions are applied.
    pub source: String,
    /// argv; `{node}` is replaced by the node name and the goal is appended.
    pub command: Vec<String>,
    /// The goal appended to `command`: `switch`, `boot`, `test`, `dry-activate` or `build`.
    pub goal: Goal,
    /// An attempt running longer is killed, with its whole process group.
    pub timeout: Duration,
    /// First wait before retrying a failed revision; doubles per failure.
    pub retry_base: Duration,
    /// Cap on that wait.
    pub retry_max: Duration,
    /// Between SIGTERM and SIGKILL when an attempt is stopped.
    pub kill_grace: Duration,
    /// How long a SIGTERM to ginx waits for a running `process` attempt before stopping it
    /// (a `systemd-run` attempt runs on, and the next ginx attaches to it).
    pub shutdown_grace: Duration,
    /// Failed attempts of one revision before it is given up until a new revision or
    /// `ginxctl retry`.
    pub max_attempts: u32,
    /// How attempts are shielded from ginx's own restart.
    pub isolation: IsolationMode,
    /// Programs used for `systemd-run` isolation.
    pub systemd_run: PathBuf,
    /// The `systemctl` program (isolation `systemd-run`: stopping an attempt's unit).
    pub systemctl: PathBuf,
    /// Run after a successful / failed attempt (argv), with GINX_NODE, GINX_SOURCE,
    /// GINX_REVISION, GINX_GOAL, GINX_STATUS and GINX_ERROR in the environment.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub on_success: Vec<String>,
    /// A hook (argv) run after each failed attempt, with the attempt in its environment.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub on_failure: Vec<String>,
    /// A hook running longer is killed; a failing hook is logged, never fatal.
    pub hook_timeout: Duration,
    /// When the running system changes to one ginx did not produce: only `report` it, or
    /// `reapply` the applied revision.
    pub on_drift: DriftPolicy,
    /// How a revision becomes the running system: `colmena` runs `command` on the checkout;
    /// `closure` fetches the prebuilt system the revision points at (`[apply.closure]`).
    pub mode: ApplyMode,
    /// `[apply.closure]`, for `mode = "closure"`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub closure: Option<ClosureConfig>,
    /// Build (colmena: `apply-local build`; closure: the realise) before asking for a rollout
    /// slot, so that only the activation and its gate run under the lock; a revision that does
    /// not build takes no slot.
    pub prebuild: bool,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ApplyMode {
    #[default]
    Colmena,
    Closure,
}

impl ApplyMode {
    pub fn as_str(self) -> &'static str {
        match self {
            ApplyMode::Colmena => "colmena",
            ApplyMode::Closure => "closure",
        }
    }
}

/// `[apply.closure]`: where the store path of this node's system comes from, and the binary
/// caches it is fetched from, signatures always checked.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClosureConfig {
    /// A file in the apply source's checkout holding the store path (`{node}` replaced); the
    /// commit that changes it is verified like any other.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// Or an http(s) pin endpoint answering with the store path (`{node}` replaced); plain
    /// http only on loopback. Printed without credentials.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        serialize_with = "shown_pin_url"
    )]
    pub url: Option<String>,
    /// Sent as HTTP basic auth with `username`, as for sources.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_file: Option<PathBuf>,
    /// With `url`: the user name of HTTP basic auth (the password is `token_file`'s content).
    #[serde(default = "default_username")]
    pub username: String,
    /// Nix's `substituters` for the fetch (the only ones used).
    pub substituters: Vec<String>,
    /// Nix's `trusted-public-keys`; `require-sigs` is always on.
    pub trusted_public_keys: Vec<String>,
    /// The store path's name must be this node's system, `nixos-system-<node>-…`.
    #[serde(default = "default_true")]
    pub require_node_name: bool,
    /// How long fetching the closure may take (within `apply.timeout`).
    #[serde(default = "default_realise_timeout")]
    pub realise_timeout: Duration,
    /// How long the pin endpoint may take to answer.
    #[serde(default = "default_pin_timeout")]
    pub pin_timeout: Duration,
    /// The Nix programs.
    #[serde(default = "default_nix_store")]
    pub nix_store: PathBuf,
    /// The `nix-env` program (the system profile's new generation).
    #[serde(default = "default_nix_env")]
    pub nix_env: PathBuf,
    /// The `nix` program (the closure's signatures and size).
    #[serde(default = "default_nix")]
    pub nix: PathBuf,
}

/// The file when neither `file` nor `url` is given.
pub const DEFAULT_CLOSURE_FILE: &str = "hosts/{node}.closure";

fn default_username() -> String {
    "git".into()
}
fn default_true() -> bool {
    true
}

/// A pin URL as shown: no user name or password, query values masked (`{node}` kept).
fn shown_pin_url<S: serde::Serializer>(url: &Option<String>, s: S) -> Result<S::Ok, S::Error> {
    match url {
        Some(u) => s.serialize_str(&shown_url(u)),
        None => s.serialize_none(),
    }
}

const NODE_MARK: &str = "ginx-node-placeholder";

/// `u` with its credentials left out, by the rule of every URL ginx prints.
pub fn shown_url(u: &str) -> String {
    match u
        .replace("{node}", NODE_MARK)
        .parse::<crate::types::EndpointUrl>()
    {
        Ok(e) => e.to_string().replace(NODE_MARK, "{node}"),
        Err(_) => "<an invalid URL>".to_owned(),
    }
}
fn default_realise_timeout() -> Duration {
    Duration::from_secs(20 * 60)
}
fn default_pin_timeout() -> Duration {
    Duration::from_secs(15)
}
fn default_nix_store() -> PathBuf {
    "nix-store".into()
}
fn default_nix_env() -> PathBuf {
    "nix-env".into()
}
fn default_nix() -> PathBuf {
    "nix".into()
}

impl ClosureConfig {
    /// Where the pointer is read: the file in the checkout unless a URL is given.
    pub fn file_for(&self, node: &str) -> Option<String> {
        if self.url.is_some() && self.file.is_none() {
            return None;
        }
        Some(
            self.file
                .as_deref()
                .unwrap_or(DEFAULT_CLOSURE_FILE)
                .replace("{node}", node),
        )
    }

    fn validate(&self, ctx: &Ctx<'_>) -> Result<(), ConfigError> {
        if self.file.is_some() && self.url.is_some() {
            return Err(ctx.error(
                "apply.closure.url",
                "give `file` (a path in the checkout) or `url` (a pin endpoint), not both",
            ));
        }
        if let Some(f) = &self.file
            && (f.trim().is_empty() || f.starts_with('/') || f.split('/').any(|p| p == ".."))
        {
            return Err(ctx.error(
                "apply.closure.file",
                format!("{f:?} must be a path relative to the checkout, without .."),
            ));
        }
        if let Some(u) = &self.url {
            let parsed = u
                .replace("{node}", "node")
                .parse::<crate::types::EndpointUrl>()
                .map_err(|e| ctx.error("apply.closure.url", e))?;
            let loopback = match parsed.url().host() {
                Some(url::Host::Ipv4(a)) => a.is_loopback(),
                Some(url::Host::Ipv6(a)) => a.is_loopback(),
                Some(url::Host::Domain(d)) => d == "localhost",
                None => false,
            };
            if parsed.scheme() == "http" && !loopback {
                return Err(ctx.error(
                    "apply.closure.url",
                    format!(
                        "{} is plain http: the pointer and the token would travel in clear; use \
                         https (http is for 127.0.0.1 only)",
                        shown_url(u)
                    ),
                ));
            }
        }
        if self.token_file.is_some() && self.url.is_none() {
            return Err(ctx.error(
                "apply.closure.token_file",
                "is sent to the pin endpoint: set apply.closure.url, or drop it",
            ));
        }
        if self.substituters.iter().all(|s| s.trim().is_empty()) {
            return Err(ctx.error(
                "apply.closure.substituters",
                "name at least one binary cache, e.g. [\"https://cache.example.com\"]",
            ));
        }
        if self.trusted_public_keys.iter().all(|s| s.trim().is_empty()) {
            return Err(ctx.error(
                "apply.closure.trusted_public_keys",
                "name the key the cache signs with (\"name:base64\"); signatures are always checked",
            ));
        }
        for (i, k) in self.trusted_public_keys.iter().enumerate() {
            if !k.contains(':') || k.split_whitespace().count() != 1 {
                return Err(ctx.error(
                    &format!("apply.closure.trusted_public_keys[{i}]"),
                    format!("{k:?} is not a Nix public key (\"name:base64\", one per entry)"),
                ));
            }
        }
        for (i, s) in self.substituters.iter().enumerate() {
            let key = format!("apply.closure.substituters[{i}]");
            if s.split_whitespace().count() != 1 {
                return Err(ctx.error(&key, "one URL per entry, without spaces"));
            }
            // `?trusted=1` makes Nix skip the signature check for that cache.
            let query = s.split_once('?').map_or("", |(_, q)| q);
            if query
                .split('&')
                .any(|p| p.split('=').next() == Some("trusted"))
            {
                return Err(ctx.error(
                    &key,
                    "has a `trusted` parameter, which turns Nix's signature check off for that \
                     cache; signatures are always checked: remove it",
                ));
            }
            if let Some((_, rest)) = s.split_once("://")
                && rest
                    .split('/')
                    .next()
                    .is_some_and(|auth| auth.contains('@'))
                && !s.starts_with("ssh")
            {
                return Err(ctx.error(
                    &key,
                    "carries credentials in the URL; give them to Nix in a netrc-file instead",
                ));
            }
        }
        bounds::CLOSURE_REALISE_TIMEOUT.check(ctx, self.realise_timeout)?;
        bounds::CLOSURE_PIN_TIMEOUT.check(ctx, self.pin_timeout)
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum IsolationMode {
    /// `systemd-run` when ginx runs as a systemd service and systemd-run exists, else `process`.
    #[default]
    Auto,
    SystemdRun,
    Process,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DriftPolicy {
    #[default]
    Report,
    Reapply,
}

impl Default for ApplyConfig {
    fn default() -> Self {
        Self {
            source: "hephaestus".to_owned(),
            command: ["colmena", "apply-local", "--node", "{node}"]
                .map(String::from)
                .to_vec(),
            goal: Goal::Switch,
            timeout: Duration::from_secs(30 * 60),
            retry_base: Duration::from_secs(30),
            retry_max: Duration::from_secs(30 * 60),
            kill_grace: Duration::from_secs(10),
            shutdown_grace: Duration::from_secs(60),
            max_attempts: 5,
            isolation: IsolationMode::Auto,
            systemd_run: PathBuf::from("systemd-run"),
            systemctl: PathBuf::from("systemctl"),
            on_success: Vec::new(),
            on_failure: Vec::new(),
            hook_timeout: Duration::from_secs(60),
            on_drift: DriftPolicy::Report,
            mode: ApplyMode::Colmena,
            closure: None,
            prebuild: true,
        }
    }
}

/// Added to `shutdown_grace + kill_grace` for systemd's `TimeoutStopSec`: collecting the
/// attempt's end (at most a second) and ginx's own exit, with room to spare.
pub const STOP_MARGIN: std::time::Duration = std::time::Duration::from_secs(30);

impl ApplyConfig {
    /// The most a SIGTERM to ginx takes with a `process` attempt running: `shutdown_grace` for
    /// the attempt to finish, then one `kill_grace` to stop its whole tree (SIGTERM, SIGKILL),
    /// and [`STOP_MARGIN`]. What `TimeoutStopSec` of ginx.service must be at least, in whole
    /// seconds (nixos-module/stop-timeout.nix computes the same).
    pub fn stop_timeout_secs(&self) -> u64 {
        let d = self.shutdown_grace.get() + self.kill_grace.get();
        d.as_millis().div_ceil(1000) as u64 + STOP_MARGIN.as_secs()
    }

    /// Checks the command, timings, retries and hooks (`source` naming a source is checked by
    /// the caller, which knows the sources).
    pub(super) fn validate(&self, ctx: &Ctx<'_>) -> Result<(), ConfigError> {
        if self.command.first().is_none_or(|c| c.trim().is_empty()) {
            return Err(ctx.error(
                "apply.command",
                "must name a program, e.g. [\"colmena\", \"apply-local\", \"--node\", \"{node}\"]",
            ));
        }
        for (bound, d) in [
            (&bounds::APPLY_TIMEOUT, self.timeout),
            (&bounds::APPLY_RETRY_BASE, self.retry_base),
            (&bounds::APPLY_RETRY_MAX, self.retry_max),
            (&bounds::APPLY_KILL_GRACE, self.kill_grace),
            (&bounds::APPLY_SHUTDOWN_GRACE, self.shutdown_grace),
            (&bounds::APPLY_HOOK_TIMEOUT, self.hook_timeout),
        ] {
            bound.check(ctx, d)?;
        }
        if self.retry_max < self.retry_base {
            // Blame the key the files set: a retry_base raised past the default retry_max is
            // retry_base's error.
            return Err(
                if ctx.written("apply.retry_max") || !ctx.written("apply.retry_base") {
                    ctx.error(
                        "apply.retry_max",
                        format!(
                            "{} is shorter than apply.retry_base ({}); the cap must be at least \
                             the first wait",
                            self.retry_max,
                            ctx.shown("apply.retry_base", self.retry_base)
                        ),
                    )
                } else {
                    ctx.error(
                        "apply.retry_base",
                        format!(
                            "{} is longer than apply.retry_max ({}), the cap on the wait; raise \
                             apply.retry_max too, or shorten this",
                            self.retry_base,
                            ctx.shown("apply.retry_max", self.retry_max)
                        ),
                    )
                },
            );
        }
        bounds::MAX_ATTEMPTS.check(ctx, self.max_attempts)?;
        match (self.mode, &self.closure) {
            (ApplyMode::Closure, None) => {
                return Err(ctx.error(
                    "apply.mode",
                    "\"closure\" needs [apply.closure] with substituters and trusted_public_keys",
                ));
            }
            (_, Some(c)) => {
                c.validate(ctx)?;
                if c.realise_timeout > self.timeout {
                    let realise = "apply.closure.realise_timeout";
                    return Err(if ctx.written(realise) || !ctx.written("apply.timeout") {
                        ctx.error(
                            realise,
                            format!(
                                "{} is longer than apply.timeout ({}), which ends the whole \
                                 attempt",
                                c.realise_timeout,
                                ctx.shown("apply.timeout", self.timeout)
                            ),
                        )
                    } else {
                        ctx.error(
                            "apply.timeout",
                            format!(
                                "{} is shorter than {realise} ({}), the closure's fetch within \
                                 it; raise this, or shorten {realise}",
                                self.timeout,
                                ctx.shown(realise, c.realise_timeout)
                            ),
                        )
                    });
                }
            }
            _ => {}
        }
        for (key, argv) in [
            ("apply.on_success", &self.on_success),
            ("apply.on_failure", &self.on_failure),
        ] {
            if argv.first().is_some_and(|p| p.trim().is_empty()) {
                return Err(ctx.error(key, "must name a program, or be empty for no hook"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The stop bound is one kill_grace after shutdown_grace (plus a margin), the
    /// figure README, the unit and the module use.
    #[test]
    fn the_stop_timeout_is_shutdown_grace_plus_one_kill_grace_plus_margin() {
        let mut a = ApplyConfig::default();
        assert_eq!(a.stop_timeout_secs(), 60 + 10 + 30);
        a.shutdown_grace = Duration::from_millis(1500);
        a.kill_grace = Duration::from_secs(20);
        assert_eq!(a.stop_timeout_secs(), 22 + 30);
    }
}
