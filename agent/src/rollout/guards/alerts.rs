//! The alert gate's look at Prometheus: one instant query (`GET <url>/api/v1/query`) of
//! `rollout.gate.prometheus.query`, its answer read as the alerts that fire. Admission asks
//! before a node takes its slot; the health gate asks every round, and an alert that was not
//! firing before the activation fails it.
//!
//! Owns the request and the reading of Prometheus' answer (pure: [`parse`]). The envelope is
//! Prometheus' HTTP API's: `{"status":"success","data":{"resultType":"vector","result":[…]}}`,
//! or `{"status":"error","errorType":…,"error":…}` with 400 (bad parameters), 422 (the query
//! cannot be executed) or 503 (timed out, aborted).

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::config::{OnPrometheusUnavailable, PrometheusConfig};
use crate::rollout::decide::gate::{ALERT_CHECK_PREFIX, Check};
use crate::status::HealthStatus;
use crate::util::Spell;

/// Alerts kept from one answer; a query that matches more names too little to act on.
pub const MAX_ALERTS: usize = 100;

/// One series of the answer: an alert that fires (or whatever the query matched).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Alert {
    /// `alertname{label="value",…}`: what identifies it from one look to the next.
    pub identity: String,
}

/// What Prometheus said.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// The series the query returned (empty: nothing fires); `more` were left out past
    /// [`MAX_ALERTS`].
    Firing { alerts: Vec<Alert>, more: usize },
    /// No answer (transport, timeout, 5xx): `rollout.gate.prometheus.on_unavailable` decides.
    Unavailable(String),
    /// It answered, and refused or could not run the query: a configuration error, whatever
    /// `on_unavailable` says.
    Refused(String),
}

#[derive(Deserialize)]
struct Envelope {
    status: String,
    #[serde(default)]
    data: Option<Data>,
    #[serde(default, rename = "errorType")]
    error_type: String,
    #[serde(default)]
    error: String,
}

#[derive(Deserialize)]
struct Data {
    #[serde(rename = "resultType")]
    result_type: String,
    /// A list of series for a vector; other shapes for the other result types.
    #[serde(default)]
    result: serde_json::Value,
}

#[derive(Deserialize)]
struct Series {
    #[serde(default)]
    metric: BTreeMap<String, String>,
}

/// Reads Prometheus' answer to the query: `status` is the HTTP status, `body` what came.
pub fn parse(status: u16, body: &[u8]) -> Answer {
    let envelope = serde_json::from_slice::<Envelope>(body).ok();
    match (status, envelope) {
        (200, Some(e)) if e.status == "success" => match e.data {
            Some(d) if d.result_type == "vector" => {
                let Ok(series) = serde_json::from_value::<Vec<Series>>(d.result) else {
                    return Answer::Unavailable("a vector that is not a list of series".into());
                };
                let mut alerts: Vec<Alert> = series
                    .iter()
                    .map(|s| Alert {
                        identity: identity(&s.metric),
                    })
                    .collect();
                alerts.sort_by(|a, b| a.identity.cmp(&b.identity));
                alerts.dedup();
                let more = alerts.len().saturating_sub(MAX_ALERTS);
                alerts.truncate(MAX_ALERTS);
                Answer::Firing { alerts, more }
            }
            Some(d) => Answer::Refused(format!(
                "the query returned a {}, not an instant vector; give a selector like {}",
                d.result_type,
                crate::config::DEFAULT_ALERT_QUERY
            )),
            None => Answer::Unavailable("an answer without data".into()),
        },
        (401 | 403, _) => Answer::Refused(format!(
            "HTTP {status}: not allowed to query; check rollout.gate.prometheus.bearer_token_file"
        )),
        (400 | 422, Some(e)) => {
            Answer::Refused(format!("{}: {}", e.error_type, one_line(&e.error)))
        }
        (s, Some(e)) if s >= 500 || e.status == "error" => Answer::Unavailable(format!(
            "HTTP {s}: {}: {}",
            e.error_type,
            one_line(&e.error)
        )),
        (s, _) if s >= 500 => Answer::Unavailable(format!("HTTP {s}")),
        (s, _) => Answer::Unavailable(format!(
            "HTTP {s} with an answer that is not Prometheus' (a proxy in the way?): {}",
            one_line(&String::from_utf8_lossy(&body[..body.len().min(200)]))
        )),
    }
}

fn one_line(s: &str) -> String {
    let s: String = s
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    s.chars().take(300).collect()
}

/// `alertname{k="v",…}` of a series: the labels sorted, without `__name__` and `alertstate`
/// (an alert that goes from pending to firing stays the same alert); a series without
/// `alertname` is named by its metric.
pub fn identity(metric: &BTreeMap<String, String>) -> String {
    let name = metric
        .get("alertname")
        .or_else(|| metric.get("__name__"))
        .cloned()
        .unwrap_or_default();
    let labels: Vec<String> = metric
        .iter()
        .filter(|(k, _)| !matches!(k.as_str(), "alertname" | "__name__" | "alertstate"))
        .map(|(k, v)| format!("{k}={}", serde_json::Value::String(v.clone())))
        .collect();
    format!("{name}{{{}}}", labels.join(","))
}

/// `A{…}, B{…} and 3 more`, for reasons.
pub fn summary(alerts: &[Alert], more: usize, max: usize) -> String {
    let shown: Vec<&str> = alerts
        .iter()
        .take(max)
        .map(|a| a.identity.as_str())
        .collect();
    let rest = alerts.len().saturating_sub(max) + more;
    if rest == 0 {
        shown.join(", ")
    } else {
        format!("{} and {rest} more", shown.join(", "))
    }
}

/// What admission makes of an answer: `None` lets the node go on, `Some(reason)` holds it.
/// `ignored` is set when Prometheus did not answer and `on_unavailable = "ignore"`: the
/// journal says so.
pub fn verdict(cfg: &PrometheusConfig, answer: &Answer) -> (Option<String>, Option<String>) {
    let shown = &cfg.url;
    match answer {
        Answer::Firing { alerts, .. } if alerts.is_empty() => (None, None),
        Answer::Firing { alerts, more } => (
            Some(format!(
                "{} alert(s) fire (rollout.gate.prometheus.query): {}; nothing starts until none \
                 does",
                alerts.len() + more,
                summary(alerts, *more, 5)
            )),
            None,
        ),
        Answer::Unavailable(why) => match cfg.on_unavailable {
            OnPrometheusUnavailable::Wait => (
                Some(format!(
                    "Prometheus at {shown} does not answer: {why}; nothing starts until it does \
                     (rollout.gate.prometheus.on_unavailable = \"wait\")"
                )),
                None,
            ),
            OnPrometheusUnavailable::Ignore => (
                None,
                Some(format!(
                    "Prometheus at {shown} does not answer: {why}; going on without the alert \
                     gate (rollout.gate.prometheus.on_unavailable = \"ignore\")"
                )),
            ),
        },
        Answer::Refused(why) => (
            Some(format!(
                "Prometheus at {shown} refused the query: {why}; fix rollout.gate.prometheus \
                 (on_unavailable does not apply to a refusal)"
            )),
            None,
        ),
    }
}

/// The HTTP client for Prometheus, built once and again only when `[rollout.gate.prometheus]`
/// or its CA file changed: a TLS client is not set up anew for every look.
#[derive(Debug, Default)]
pub struct Client {
    built: Option<(ClientKey, reqwest::Client)>,
    /// How many clients were built (for the tests).
    builds: u32,
}

/// What a client was built from: the section, and the CA file's modification time.
#[derive(Clone, Debug, PartialEq)]
struct ClientKey {
    cfg: PrometheusConfig,
    ca_modified: Option<std::time::SystemTime>,
}

impl Client {
    /// Asks Prometheus once (the bearer token is read for each ask: it may be rotated).
    pub async fn query(&mut self, cfg: &PrometheusConfig) -> Answer {
        let key = ClientKey {
            cfg: cfg.clone(),
            ca_modified: cfg
                .ca_file
                .as_ref()
                .and_then(|f| std::fs::metadata(f).ok()?.modified().ok()),
        };
        let client = match &self.built {
            Some((k, c)) if *k == key => c.clone(),
            _ => match client(cfg) {
                Ok(c) => {
                    self.built = Some((key, c.clone()));
                    self.builds += 1;
                    c
                }
                Err(e) => return Answer::Refused(e),
            },
        };
        query(cfg, &client).await
    }
}

/// Asks Prometheus once, through `client`.
async fn query(cfg: &PrometheusConfig, client: &reqwest::Client) -> Answer {
    let mut url = cfg.url.url().clone();
    let path = format!("{}/api/v1/query", url.path().trim_end_matches('/'));
    url.set_path(&path);
    url.query_pairs_mut().append_pair("query", cfg.query.trim());
    let mut req = client.get(url);
    if let Some(file) = &cfg.bearer_token_file {
        match std::fs::read_to_string(file) {
            Ok(t) => req = req.bearer_auth(t.trim()),
            Err(e) => {
                return Answer::Refused(format!(
                    "cannot read rollout.gate.prometheus.bearer_token_file {}: {e}",
                    file.display()
                ));
            }
        }
    }
    let resp = match req.send().await {
        Ok(r) => r,
        Err(e) if e.is_timeout() => {
            return Answer::Unavailable(format!(
                "no answer within rollout.gate.prometheus.timeout ({})",
                cfg.timeout
            ));
        }
        Err(e) => return Answer::Unavailable(crate::util::http_error(&e)),
    };
    let status = resp.status().as_u16();
    match resp.bytes().await {
        Ok(body) => parse(status, &body),
        Err(e) => Answer::Unavailable(crate::util::http_error(&e)),
    }
}

fn client(cfg: &PrometheusConfig) -> Result<reqwest::Client, String> {
    let mut builder = crate::util::http_client(cfg.timeout.get());
    if let Some(ca) = &cfg.ca_file {
        let pem = std::fs::read(ca).map_err(|e| {
            format!(
                "cannot read rollout.gate.prometheus.ca_file {}: {e}",
                ca.display()
            )
        })?;
        let certs = reqwest::Certificate::from_pem_bundle(&pem)
            .ok()
            .filter(|c| !c.is_empty())
            .ok_or_else(|| {
                format!(
                    "rollout.gate.prometheus.ca_file {} holds no PEM certificate",
                    ca.display()
                )
            })?;
        builder = builder.tls_certs_only(certs);
    }
    builder.build().map_err(|e| {
        format!(
            "cannot set up the Prometheus client: {}",
            crate::util::http_error(&e)
        )
    })
}

/// What the admission look remembers between looks: whether alerts (or a silent Prometheus)
/// held the node, or Prometheus was ignored, at the last look, so that each is logged once
/// per spell, not once per look.
#[derive(Debug, Default)]
pub struct AlertGuard {
    holding: Spell,
    ignoring: Spell,
    client: Client,
}

impl AlertGuard {
    /// Asks Prometheus before a slot; `None` lets the node through, `Some(reason)` holds it.
    pub async fn check(
        &mut self,
        cfg: &PrometheusConfig,
        revision: &crate::types::Revision,
    ) -> Option<String> {
        let answer = self.client.query(cfg).await;
        let (hold, ignored) = verdict(cfg, &answer);
        if let Some(why) = hold.as_ref().filter(|_| self.holding.starts(true)) {
            tracing::warn!(revision = %revision.short(), reason = %why,
                "the alert gate holds this node back");
        }
        if let Some(note) = ignored.as_ref().filter(|_| self.ignoring.starts(true)) {
            tracing::warn!(revision = %revision.short(), detail = %note,
                "Prometheus does not answer; the alert gate is ignored");
        }
        self.holding.starts(hold.is_some());
        self.ignoring.starts(ignored.is_some());
        hold
    }
}

/// The gate's checks from one answer, run at `at` (monotonic) and `wall`: `prometheus` (the
/// query itself) and one failed `alert:<identity>` per alert that fires.
pub fn checks(
    cfg: &PrometheusConfig,
    answer: &Answer,
    at: std::time::Instant,
    wall: jiff::Timestamp,
) -> BTreeMap<String, Check> {
    let check = |status, message: String| Check {
        status,
        message,
        checked_at: Some(wall),
        checked: Some(at),
    };
    let mut out = BTreeMap::new();
    let query = match answer {
        Answer::Firing { alerts, more: 0 } => {
            check(HealthStatus::Ok, format!("{} series match", alerts.len()))
        }
        Answer::Firing { alerts, more } => check(
            HealthStatus::Failed,
            format!(
                "{} series match; at most {MAX_ALERTS} are told apart: narrow \
                 rollout.gate.prometheus.query",
                alerts.len() + more
            ),
        ),
        Answer::Unavailable(why) if cfg.on_unavailable == OnPrometheusUnavailable::Ignore => check(
            HealthStatus::Ok,
            format!("does not answer ({why}); ignored (on_unavailable = \"ignore\")"),
        ),
        Answer::Unavailable(why) => check(HealthStatus::Failed, format!("does not answer: {why}")),
        Answer::Refused(why) => check(HealthStatus::Failed, format!("refused the query: {why}")),
    };
    out.insert("prometheus".to_owned(), query);
    if let Answer::Firing { alerts, .. } = answer {
        for a in alerts {
            out.insert(
                format!("{ALERT_CHECK_PREFIX}{}", a.identity),
                check(
                    HealthStatus::Failed,
                    "fires (rollout.gate.prometheus.query)".into(),
                ),
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(on_unavailable: OnPrometheusUnavailable) -> PrometheusConfig {
        PrometheusConfig {
            url: "http://prometheus.example:9090".parse().unwrap(),
            query: crate::config::DEFAULT_ALERT_QUERY.into(),
            timeout: crate::config::Duration::from_secs(10),
            bearer_token_file: None,
            ca_file: None,
            on_unavailable,
        }
    }

    fn firing(ids: &[&str]) -> Vec<String> {
        ids.iter().map(|s| s.to_string()).collect()
    }

    fn ids(a: &Answer) -> Vec<String> {
        match a {
            Answer::Firing { alerts, .. } => alerts.iter().map(|a| a.identity.clone()).collect(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_vector_is_the_alerts_that_fire_each_named_by_its_labels() {
        let body = br#"{"status":"success","data":{"resultType":"vector","result":[
            {"metric":{"__name__":"ALERTS","alertname":"TestBroken","alertstate":"firing","severity":"critical","cause":"a\"b"},"value":[1,"1"]},
            {"metric":{"__name__":"ALERTS","alertname":"DiskFull","alertstate":"firing","severity":"critical"},"value":[1,"1"]}
        ]},"warnings":["ignored"]}"#;
        assert_eq!(
            ids(&parse(200, body)),
            firing(&[
                r#"DiskFull{severity="critical"}"#,
                r#"TestBroken{cause="a\"b",severity="critical"}"#,
            ])
        );
        let empty = br#"{"status":"success","data":{"resultType":"vector","result":[]}}"#;
        assert_eq!(
            parse(200, empty),
            Answer::Firing {
                alerts: Vec::new(),
                more: 0
            }
        );
        // A plain metric is named by its name.
        let plain = br#"{"status":"success","data":{"resultType":"vector","result":[
            {"metric":{"__name__":"up","job":"node"},"value":[1,"0"]}]}}"#;
        assert_eq!(ids(&parse(200, plain)), firing(&[r#"up{job="node"}"#]));
    }

    #[test]
    fn errors_are_refusals_or_unavailability_as_prometheus_means_them() {
        let scalar = br#"{"status":"success","data":{"resultType":"scalar","result":[1,"1"]}}"#;
        assert!(
            matches!(parse(200, scalar), Answer::Refused(m) if m.contains("not an instant vector"))
        );
        let bad = br#"{"status":"error","errorType":"bad_data","error":"invalid parameter \"query\": 1:7: parse error"}"#;
        assert!(
            matches!(parse(400, bad), Answer::Refused(m) if m.starts_with("bad_data: invalid parameter"))
        );
        let exec = br#"{"status":"error","errorType":"execution","error":"many-to-many matching"}"#;
        assert!(matches!(parse(422, exec), Answer::Refused(m) if m.starts_with("execution:")));
        let timeout = br#"{"status":"error","errorType":"timeout","error":"query timed out"}"#;
        assert!(
            matches!(parse(503, timeout), Answer::Unavailable(m) if m.contains("timeout: query timed out"))
        );
        assert!(
            matches!(parse(502, b"<html>Bad Gateway</html>"), Answer::Unavailable(m) if m == "HTTP 502")
        );
        assert!(matches!(parse(401, b""), Answer::Refused(m) if m.contains("bearer_token_file")));
        assert!(
            matches!(parse(200, b"<html>login</html>"), Answer::Unavailable(m) if m.contains("a proxy in the way"))
        );
    }

    #[test]
    fn each_alert_is_a_failed_check_of_its_own_beside_the_query_s() {
        let now = std::time::Instant::now();
        let wall: jiff::Timestamp = "2026-12-06T10:00:00Z".parse().unwrap();
        let one = Answer::Firing {
            alerts: vec![Alert {
                identity: "TestBroken{}".into(),
            }],
            more: 0,
        };
        let c = checks(&cfg(OnPrometheusUnavailable::Wait), &one, now, wall);
        assert_eq!(
            c.keys().collect::<Vec<_>>(),
            ["alert:TestBroken{}", "prometheus"]
        );
        assert_eq!(c["alert:TestBroken{}"].status, HealthStatus::Failed);
        assert_eq!(c["prometheus"].status, HealthStatus::Ok);
        assert_eq!(c["prometheus"].checked, Some(now));
        let silent = Answer::Unavailable("refused".into());
        let c = checks(&cfg(OnPrometheusUnavailable::Wait), &silent, now, wall);
        assert_eq!(c["prometheus"].status, HealthStatus::Failed);
        let c = checks(&cfg(OnPrometheusUnavailable::Ignore), &silent, now, wall);
        assert_eq!(c["prometheus"].status, HealthStatus::Ok);
        assert!(c["prometheus"].message.contains("ignored"));
        let many = Answer::Firing {
            alerts: Vec::new(),
            more: 200,
        };
        let c = checks(&cfg(OnPrometheusUnavailable::Wait), &many, now, wall);
        assert_eq!(c["prometheus"].status, HealthStatus::Failed);
    }

    #[test]
    fn past_the_bound_the_rest_is_counted_not_kept() {
        let series: Vec<String> = (0..MAX_ALERTS + 3)
            .map(|i| format!(r#"{{"metric":{{"alertname":"A{i:03}"}},"value":[1,"1"]}}"#))
            .collect();
        let body = format!(
            r#"{{"status":"success","data":{{"resultType":"vector","result":[{}]}}}}"#,
            series.join(",")
        );
        let Answer::Firing { alerts, more } = parse(200, body.as_bytes()) else {
            panic!()
        };
        assert_eq!((alerts.len(), more), (MAX_ALERTS, 3));
        assert_eq!(summary(&alerts[..3], 0, 2), "A000{}, A001{} and 1 more");
        assert_eq!(
            summary(&alerts, more, 1),
            format!("A000{{}} and {} more", MAX_ALERTS + 2)
        );
    }

    #[test]
    fn the_verdict_holds_on_alerts_and_refusals_and_on_silence_as_configured() {
        let wait = cfg(OnPrometheusUnavailable::Wait);
        let ignore = cfg(OnPrometheusUnavailable::Ignore);
        let none = Answer::Firing {
            alerts: Vec::new(),
            more: 0,
        };
        assert_eq!(verdict(&wait, &none), (None, None));
        let one = Answer::Firing {
            alerts: vec![Alert {
                identity: "TestBroken{}".into(),
            }],
            more: 0,
        };
        let (why, _) = verdict(&ignore, &one);
        assert_eq!(
            why.unwrap(),
            "1 alert(s) fire (rollout.gate.prometheus.query): TestBroken{}; nothing starts until \
             none does"
        );
        let silent = Answer::Unavailable("connection refused".into());
        let (why, note) = verdict(&wait, &silent);
        assert!(
            why.unwrap()
                .ends_with("(rollout.gate.prometheus.on_unavailable = \"wait\")")
        );
        assert_eq!(note, None);
        let (why, note) = verdict(&ignore, &silent);
        assert_eq!(why, None);
        assert!(note.unwrap().contains("going on without the alert gate"));
        let refused = Answer::Refused("bad_data: parse error".into());
        assert!(
            verdict(&ignore, &refused)
                .0
                .unwrap()
                .contains("refused the query")
        );
    }

    /// Serves one HTTP request on 127.0.0.1 with `status` and `body`; the request's head
    /// comes back through the handle.
    async fn one_answer(
        status: u16,
        body: &'static str,
    ) -> (String, tokio::task::JoinHandle<String>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/prom/", listener.local_addr().unwrap());
        let served = tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut head = Vec::new();
            let mut buf = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = conn.read(&mut buf).await.unwrap();
                assert!(n > 0, "the client closed before its request ended");
                head.extend_from_slice(&buf[..n]);
            }
            let reply = format!(
                "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
                 Connection: close\r\n\r\n{body}",
                body.len()
            );
            conn.write_all(reply.as_bytes()).await.unwrap();
            String::from_utf8(head).unwrap()
        });
        (url, served)
    }

    #[tokio::test]
    async fn the_client_is_built_once_and_again_only_when_its_settings_change() {
        let ok = r#"{"status":"success","data":{"resultType":"vector","result":[]}}"#;
        let mut client = Client::default();
        let mut c = cfg(OnPrometheusUnavailable::Wait);
        for _ in 0..2 {
            let (url, served) = one_answer(200, ok).await;
            c.url = url.parse().unwrap();
            let _ = client.query(&c).await;
            served.await.unwrap();
        }
        assert_eq!(client.builds, 2, "a new URL is a new client");
        let (url, served) = one_answer(200, ok).await;
        c.url = url.parse().unwrap();
        let _ = client.query(&c).await;
        served.await.unwrap();
        let builds = client.builds;
        // The same URL again (its one answer given: this ask finds no server).
        let _ = client.query(&c).await;
        assert_eq!(client.builds, builds, "the same settings reuse the client");
    }

    #[tokio::test]
    async fn the_token_is_sent_as_a_bearer_trimmed_and_never_shown() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "s3cret-t0ken\n").unwrap();
        let ok = r#"{"status":"success","data":{"resultType":"vector","result":[]}}"#;
        let (url, served) = one_answer(200, ok).await;
        let mut c = cfg(OnPrometheusUnavailable::Wait);
        c.url = url.parse().unwrap();
        c.bearer_token_file = Some(token.clone());
        let answer = Client::default().query(&c).await;
        assert_eq!(
            answer,
            Answer::Firing {
                alerts: Vec::new(),
                more: 0
            }
        );
        let head = served.await.unwrap();
        let request_line = head.lines().next().unwrap();
        assert!(
            request_line
                .starts_with("GET /prom/api/v1/query?query=ALERTS%7Balertstate%3D%22firing%22"),
            "{request_line}"
        );
        let auth: Vec<&str> = head
            .lines()
            .filter(|l| l.to_ascii_lowercase().starts_with("authorization:"))
            .collect();
        assert_eq!(auth, ["authorization: Bearer s3cret-t0ken"]);

        // Refused: the message points at the file and does not echo what was sent.
        let (url, served) = one_answer(401, "").await;
        c.url = url.parse().unwrap();
        let Answer::Refused(why) = Client::default().query(&c).await else {
            panic!("a 401 is a refusal")
        };
        served.await.unwrap();
        assert!(
            why.contains("bearer_token_file") && !why.contains("s3cret"),
            "{why}"
        );
        let (hold, _) = verdict(&c, &Answer::Refused(why));
        assert!(!hold.unwrap().contains("s3cret"));

        // A token file that cannot be read is named, and nothing is sent.
        c.bearer_token_file = Some(dir.path().join("absent"));
        let Answer::Refused(why) = Client::default().query(&c).await else {
            panic!("an unreadable token file is a refusal")
        };
        assert!(
            why.starts_with("cannot read rollout.gate.prometheus.bearer_token_file "),
            "{why}"
        );
        assert!(why.contains("absent"), "{why}");
    }
}
