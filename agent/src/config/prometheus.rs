//! `[rollout.gate.prometheus]`: the alert gate. A PromQL query against a Prometheus server;
//! a non-empty result holds a node before it takes its slot, and a series that appears after
//! the activation fails its gate. What the answer means is `rollout::guards::alerts`' business; this
//! file owns the keys and what is refused at load.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{ConfigError, Ctx, Duration, bounds};
use crate::types::EndpointUrl;

/// The default query: the critical alerts that fire, as Prometheus' own `ALERTS` series says.
pub const DEFAULT_ALERT_QUERY: &str = r#"ALERTS{alertstate="firing",severity="critical"}"#;
/// The longest query kept (it is sent in the URL).
pub const MAX_QUERY: usize = 2000;

/// What an unreachable Prometheus means.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OnPrometheusUnavailable {
    /// Nothing starts, and an open gate does not pass, until it answers.
    #[default]
    Wait,
    /// Go on as if no alert fired (the journal says so).
    Ignore,
}

/// The alert gate: a PromQL query whose series are the alerts that fire. They hold a node
/// before it takes its slot, and one that was not firing before an activation fails its gate.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrometheusConfig {
    /// The server's base URL; `/api/v1/query` is appended (a path prefix is kept).
    pub url: EndpointUrl,
    /// An instant-vector PromQL query; every series it returns is an alert that holds the node.
    /// Scope it to what concerns a rollout (e.g. leave ginx's own alerts out with
    /// `alertname!~"Ginx.*"`).
    #[serde(default = "default_query")]
    pub query: String,
    /// One query taking longer counts as Prometheus not answering.
    #[serde(default = "default_timeout")]
    pub timeout: Duration,
    /// A file whose content (trimmed) is sent as `Authorization: Bearer <token>`; read at each
    /// query, so it can be rotated. Never logged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bearer_token_file: Option<PathBuf>,
    /// The CA that signed the server's certificate (PEM), for an `https://` url; default: the
    /// system's roots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_file: Option<PathBuf>,
    /// When Prometheus does not answer: `wait` (nothing starts, an open gate does not pass) or
    /// `ignore` (go on as if no alert fired, and say so in the journal).
    #[serde(default)]
    pub on_unavailable: OnPrometheusUnavailable,
}

fn default_query() -> String {
    DEFAULT_ALERT_QUERY.to_owned()
}

fn default_timeout() -> Duration {
    Duration::from_secs(10)
}

impl PrometheusConfig {
    pub(super) fn validate(&self, ctx: &Ctx<'_>) -> Result<(), ConfigError> {
        let key = |k: &str| format!("rollout.gate.prometheus.{k}");
        bounds::PROMETHEUS_TIMEOUT.check(ctx, self.timeout)?;
        let q = self.query.trim();
        if q.is_empty() {
            return Err(ctx.error(
                &key("query"),
                format!("is empty; leave it out for the default, {DEFAULT_ALERT_QUERY}"),
            ));
        }
        if q.chars().count() > MAX_QUERY {
            return Err(ctx.error(
                &key("query"),
                format!("has {} characters; at most {MAX_QUERY}", q.chars().count()),
            ));
        }
        if q.chars().any(|c| c.is_control() && c != '\n' && c != '\t') {
            return Err(ctx.error(&key("query"), "holds a control character"));
        }
        for (name, file) in [
            ("bearer_token_file", &self.bearer_token_file),
            ("ca_file", &self.ca_file),
        ] {
            if let Some(f) = file.as_ref().filter(|f| !f.is_absolute()) {
                return Err(ctx.error(
                    &key(name),
                    format!("{} is not an absolute path", f.display()),
                ));
            }
        }
        if self.ca_file.is_some() && self.url.scheme() != "https" {
            return Err(ctx.error(
                &key("ca_file"),
                format!("is for an https:// url; url is {}", self.url),
            ));
        }
        Ok(())
    }
}
