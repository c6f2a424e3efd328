//! Webhook notifications (`[[notify]]`): each notice whose reason a webhook asked for is POSTed
//! to it as one JSON object ([`Body`], documented in docs/src/monitoring.md, "Notifications").
//!
//! Each webhook has a task of its own reading the notices at its own pace: a slow or dead
//! receiver never holds up the apply loop, the Events, or another webhook. A send that fails
//! (no answer, a 5xx, a 429) is tried again `retries` times, 1 s apart doubling up to 30 s, then
//! given up; a webhook more than [`crate::types::notice::BACKLOG`] notices behind loses the
//! oldest. Both are counted in `ginx_notifications_total`. The URL is shown as scheme and host
//! only, and the token is read from `token_file` at each send and never shown.
//!
//! A worker (layer 5): imports `types`, `config`, `metrics`, `util`.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio::sync::{broadcast, watch};

use crate::config::{Config, NotifyConfig, notify_url_shown};
use crate::metrics::Metrics;
use crate::types::{Notice, Notices};

/// The body POSTed for one notice (`Content-Type: application/json`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Body {
    /// Of this body's shape; a field added keeps it, one changed or removed bumps it.
    pub version: u32,
    pub node: String,
    /// The rollout group of the node.
    pub group: String,
    /// The Event reason (`RevisionHalted`, `RolledBack`, …).
    pub reason: String,
    /// `Warning` or `Normal`, as the Event's type.
    #[serde(rename = "type")]
    pub kind: String,
    /// One line for a person (what the journal and the Event say).
    pub message: String,
    /// The revision concerned (full commit id), or null.
    pub revision: Option<String>,
    /// When it happened, RFC 3339 in UTC (the node's clock).
    pub time: String,
    pub ginx_version: String,
}

impl Body {
    pub fn new(cfg: &Config, n: &Notice) -> Self {
        Self {
            version: 1,
            node: cfg.node_name().to_owned(),
            group: cfg.rollout.group_for(cfg.node.role),
            reason: n.reason.as_str().to_owned(),
            kind: if n.reason.warning() {
                "Warning"
            } else {
                "Normal"
            }
            .to_owned(),
            message: n.message.clone(),
            revision: n.revision.clone(),
            time: n.at.to_string(),
            ginx_version: crate::version().to_owned(),
        }
    }
}

const RETRY_BASE: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(30);

/// Runs the webhooks of the configuration, restarting them when it changes.
pub async fn run(
    mut config: watch::Receiver<Arc<Config>>,
    notices: Notices,
    metrics: Arc<Metrics>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let cfg = Arc::clone(&config.borrow_and_update());
        let tasks: Vec<_> = cfg
            .notify
            .iter()
            .enumerate()
            .filter_map(|(i, n)| {
                let rx = notices.subscribe()?;
                Some(tokio::spawn(webhook(
                    Arc::clone(&cfg),
                    n.clone(),
                    n.name_or(i),
                    rx,
                    Arc::clone(&metrics),
                )))
            })
            .collect();
        let stop = tokio::select! {
            r = config.changed() => r.is_err(),
            _ = shutdown.changed() => true,
        };
        for t in tasks {
            t.abort();
        }
        if stop {
            return;
        }
    }
}

async fn webhook(
    cfg: Arc<Config>,
    hook: NotifyConfig,
    name: String,
    mut rx: broadcast::Receiver<Notice>,
    metrics: Arc<Metrics>,
) {
    let shown = notify_url_shown(&hook.url);
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = match reqwest::Client::builder()
        .timeout(hook.timeout.get())
        .connect_timeout(hook.timeout.get())
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("ginx/", env!("CARGO_PKG_VERSION")))
        .build()
    {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(notify = %name, url = %shown, error = %crate::util::http_error(&e),
                "cannot set up the webhook client; notifications to it are off");
            return;
        }
    };
    let mut failing = false;
    loop {
        let n = match rx.recv().await {
            Ok(n) => n,
            Err(broadcast::error::RecvError::Lagged(k)) => {
                metrics.notified(&name, "dropped", k);
                tracing::warn!(notify = %name, dropped = k, "the webhook fell behind; the oldest notices were dropped");
                continue;
            }
            Err(broadcast::error::RecvError::Closed) => return,
        };
        if !hook.events.contains(&n.reason) {
            continue;
        }
        let body = Body::new(&cfg, &n);
        match send(&http, &hook, &body).await {
            Ok(()) => {
                metrics.notified(&name, "sent", 1);
                if failing {
                    failing = false;
                    tracing::info!(notify = %name, url = %shown, "the webhook takes notifications again");
                }
            }
            Err(why) => {
                metrics.notified(&name, "failed", 1);
                if !failing {
                    failing = true;
                    tracing::warn!(notify = %name, url = %shown, reason = %body.reason, error = %why,
                        "a notification was given up after its retries (said once until one gets through)");
                }
            }
        }
    }
}

/// Sends `body`, with the retries the webhook allows. The error names no URL path or token.
async fn send(http: &reqwest::Client, hook: &NotifyConfig, body: &Body) -> Result<(), String> {
    let mut last = String::new();
    for attempt in 0..=hook.retries {
        if attempt > 0 {
            tokio::time::sleep(crate::util::backoff(RETRY_BASE, RETRY_MAX, attempt - 1)).await;
        }
        let mut req = http
            .post(hook.url.url().clone())
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(serde_json::to_vec(body).unwrap_or_default());
        if let Some(f) = &hook.token_file {
            match std::fs::read_to_string(f) {
                Ok(t) => req = req.bearer_auth(t.trim()),
                Err(e) => {
                    return Err(format!(
                        "cannot read notify token_file {}: {e}; check the file",
                        f.display()
                    ));
                }
            }
        }
        match req.send().await {
            Ok(r) if r.status().is_success() => return Ok(()),
            Ok(r) => {
                let code = r.status().as_u16();
                last = format!("HTTP {code}");
                if !(code == 429 || code >= 500) {
                    return Err(format!(
                        "{last}: the receiver refused it (not retried); check its URL and token"
                    ));
                }
            }
            Err(e) => last = crate::util::http_error(&e),
        }
    }
    Err(format!("{last} (after {} retries)", hook.retries))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Reason;

    #[test]
    fn the_body_names_node_group_reason_type_and_revision() {
        let mut cfg = Config::default();
        cfg.node.name = Some("lucy".into());
        let n = Notice {
            reason: Reason::RevisionHalted,
            message: "revision 4a41fb5 halted by lucy: health gate failed".into(),
            revision: Some("4a41fb5".repeat(5) + "4a41f"),
            at: jiff::Timestamp::from_second(1_800_000_000).unwrap(),
        };
        let v = serde_json::to_value(Body::new(&cfg, &n)).unwrap();
        assert_eq!(v["version"], 1);
        assert_eq!(v["node"], "lucy");
        assert_eq!(v["group"], "control-plane");
        assert_eq!(v["reason"], "RevisionHalted");
        assert_eq!(v["type"], "Warning");
        assert_eq!(v["time"], "2027-01-15T08:00:00Z");
        assert_eq!(v["revision"].as_str().unwrap().len(), 40);
    }
}
