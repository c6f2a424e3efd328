//! `[[notify]]`: webhooks that are told what happens on this node (a halt, a rollback, a lost
//! slot, a blocked drain, a reboot, a failing apply), with a JSON body documented in docs/src/monitoring.md.

use std::path::PathBuf;

use serde::{Deserialize, Serialize, Serializer};

use super::{ConfigError, Ctx, Duration, bounds};
use crate::types::{EndpointUrl, Reason};

/// One webhook.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NotifyConfig {
    /// Names it in logs and metrics (`ginx_notifications_total{notify=…}`); default
    /// `notify-<n>`, counted from 1 in the order written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Where the JSON body is POSTed (`http://` or `https://`). Shown only as scheme and host:
    /// a webhook URL often carries its secret in the path.
    #[serde(serialize_with = "host_only")]
    pub url: EndpointUrl,
    /// A file whose content (trimmed) is sent as `Authorization: Bearer <token>`; read at each
    /// send, so it can be rotated. Never logged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_file: Option<PathBuf>,
    /// The Event reasons sent (docs/src/monitoring.md lists them); default
    /// [`DEFAULT_EVENTS`].
    #[serde(default = "default_events")]
    pub events: Vec<Reason>,
    /// One send taking longer fails (and is retried).
    #[serde(default = "default_timeout")]
    pub timeout: Duration,
    /// Sends after the first that failed (a transport error, a 5xx, a 429); then the notice
    /// is given up and counted (`result="failed"`).
    #[serde(default = "default_retries")]
    pub retries: u32,
}

/// What a webhook is told unless `events` says otherwise: what needs a person.
pub const DEFAULT_EVENTS: [Reason; 11] = [
    Reason::RevisionHalted,
    Reason::RolledBack,
    Reason::RollbackUnhealthy,
    Reason::SlotLost,
    Reason::HolderVanished,
    Reason::DrainBlocked,
    Reason::PutOff,
    Reason::Rebooting,
    Reason::Rebooted,
    Reason::ApplyFailed,
    Reason::Held,
];

fn default_events() -> Vec<Reason> {
    DEFAULT_EVENTS.to_vec()
}

fn default_timeout() -> Duration {
    Duration::from_secs(10)
}

fn default_retries() -> u32 {
    3
}

fn host_only<S: Serializer>(url: &EndpointUrl, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&shown(url))
}

/// The URL as logs and `check-config` show it: scheme, host and port, the rest hidden.
pub fn shown(url: &EndpointUrl) -> String {
    let u = url.url();
    let host = u.host_str().unwrap_or("");
    match u.port() {
        Some(p) => format!("{}://{host}:{p}/***", u.scheme()),
        None => format!("{}://{host}/***", u.scheme()),
    }
}

impl NotifyConfig {
    /// The name in logs and metrics (`i` counts from 0).
    pub fn name_or(&self, i: usize) -> String {
        self.name
            .clone()
            .unwrap_or_else(|| format!("notify-{}", i + 1))
    }

    pub(super) fn validate(list: &[NotifyConfig], ctx: &Ctx<'_>) -> Result<(), ConfigError> {
        let mut names = std::collections::BTreeSet::new();
        for (i, n) in list.iter().enumerate() {
            let key = |k: &str| format!("notify[{i}].{k}");
            let name = n.name_or(i);
            if name.is_empty()
                || name.len() > 63
                || !name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            {
                return Err(ctx.error(
                    &key("name"),
                    "must be 1 to 63 letters, digits, '-' or '_' (it is a metric label)",
                ));
            }
            if !names.insert(name.clone()) {
                return Err(ctx.error(
                    &key("name"),
                    format!("{name:?} names two webhooks; give each its own"),
                ));
            }
            if n.url.url().username() != "" || n.url.url().password().is_some() {
                return Err(ctx.error(
                    &key("url"),
                    "must not carry credentials; put the token in a file and name it in token_file",
                ));
            }
            if let Some(f) = &n.token_file
                && !f.is_absolute()
            {
                return Err(ctx.error(&key("token_file"), "must be an absolute path"));
            }
            if n.events.is_empty() {
                return Err(ctx.error(
                    &key("events"),
                    format!(
                        "is empty: this webhook would be told nothing; leave it out for the default ({})",
                        DEFAULT_EVENTS.map(Reason::as_str).join(", ")
                    ),
                ));
            }
            bounds::NOTIFY_TIMEOUT.check_at(ctx, &key("timeout"), n.timeout)?;
            bounds::NOTIFY_RETRIES.check_at(ctx, &key("retries"), n.retries)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_webhook_url_is_shown_without_its_path_or_query() {
        let u: EndpointUrl = "https://hooks.example.com:8443/services/T000/B000/XXXXSECRET?x=1"
            .parse()
            .unwrap();
        assert_eq!(shown(&u), "https://hooks.example.com:8443/***");
    }
}
