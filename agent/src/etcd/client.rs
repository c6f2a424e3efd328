//! Requests to etcd's v3 JSON gateway, over HTTPS with the health-check client certificate
//! (or plain HTTP when `etcd.endpoint` says so). Every request is bounded by `etcd.timeout`.
//! Errors name the member's URL (etcd's URLs carry no credentials; the user part is cut off
//! all the same) and, for the certificates, the file and what to do.

use std::time::Duration;

use serde::de::DeserializeOwned;

use super::wire::{ErrorBody, MemberListResponse, StatusResponse};
use crate::config::EtcdConfig;

/// A look at etcd that could not be made.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EtcdError {
    /// The client cannot be set up (a certificate is missing or unreadable): the
    /// configuration or the node's files must be fixed.
    #[error("{0}")]
    Setup(String),
    /// This node's member did not answer, or answered with an error.
    #[error("{0}")]
    Unreachable(String),
}

/// One request to a member that brought no answer ginx can use. The text names the member by
/// its URL without a user part.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// No answer: no connection, or none within `etcd.timeout`.
    #[error("{member}: {detail}")]
    Unavailable { member: String, detail: String },
    /// The member answered with an error status; `said` is its own message.
    #[error("{member}{path} answered {status}: {said}")]
    Answered {
        member: String,
        path: &'static str,
        status: u16,
        said: String,
    },
    /// An answer that is not the gateway's JSON.
    #[error("{member}{path}: an answer ginx cannot read: {detail}")]
    Invalid {
        member: String,
        path: &'static str,
        detail: String,
    },
}

#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    /// `etcd.endpoint`, as written (for the request) and as shown.
    endpoint: String,
    shown: String,
    timeout: Duration,
}

impl Client {
    /// A client with the certificates of `cfg` (read now: a changed file is read by the
    /// next client, which the guard makes for every look).
    pub fn new(cfg: &EtcdConfig) -> Result<Self, EtcdError> {
        let timeout = cfg.timeout.get();
        let mut builder = crate::util::http_client(timeout);
        if cfg.endpoint.scheme() == "https" {
            let read = |key: &str, path: &std::path::Path| {
                std::fs::read(path).map_err(|e| {
                    EtcdError::Setup(format!(
                        "cannot read {key} {}: {e}; kubeadm writes it on control-plane nodes \
                         (`kubeadm init phase certs etcd-ca` / `etcd-healthcheck-client`), or \
                         point {key} at the file",
                        path.display()
                    ))
                })
            };
            let ca = read("etcd.ca_file", &cfg.ca_file)?;
            let mut identity = read("etcd.cert_file", &cfg.cert_file)?;
            identity.push(b'\n');
            identity.extend(read("etcd.key_file", &cfg.key_file)?);
            let certs = reqwest::Certificate::from_pem_bundle(&ca)
                .ok()
                .filter(|c| !c.is_empty())
                .ok_or_else(|| {
                    EtcdError::Setup(format!(
                        "etcd.ca_file {} holds no PEM certificate",
                        cfg.ca_file.display()
                    ))
                })?;
            let identity = reqwest::Identity::from_pem(&identity).map_err(|e| {
                EtcdError::Setup(format!(
                    "etcd.cert_file {} and etcd.key_file {} are not a PEM certificate and its \
                     key: {}",
                    cfg.cert_file.display(),
                    cfg.key_file.display(),
                    crate::util::http_error(&e)
                ))
            })?;
            builder = builder.tls_certs_only(certs).identity(identity);
        }
        let http = builder.build().map_err(|e| {
            EtcdError::Setup(format!(
                "cannot set up the etcd client: {}",
                crate::util::http_error(&e)
            ))
        })?;
        Ok(Self {
            http,
            endpoint: cfg
                .endpoint
                .as_request_str()
                .trim_end_matches('/')
                .to_owned(),
            shown: cfg.endpoint.to_string(),
            timeout,
        })
    }

    /// The member list, asked of this node's member; the header names that member.
    pub async fn members(&self) -> Result<MemberListResponse, EtcdError> {
        self.post(&self.endpoint, "/v3/cluster/member/list", "{}")
            .await
            .map_err(|e| self.unreachable(e))
    }

    /// The status of the member at `url` (one of its client URLs), or why it did not answer.
    pub async fn status(&self, url: &str) -> Result<StatusResponse, RequestError> {
        self.post(url.trim_end_matches('/'), "/v3/maintenance/status", "{}")
            .await
    }

    /// This node's member's status.
    pub async fn own_status(&self) -> Result<StatusResponse, EtcdError> {
        self.status(&self.endpoint.clone())
            .await
            .map_err(|e| self.unreachable(e))
    }

    /// Asks this node's member, the leader, to hand the leadership to `target`.
    pub async fn move_leader(&self, target: u64) -> Result<(), RequestError> {
        let body = format!(r#"{{"targetID":"{target}"}}"#);
        self.post::<serde_json::Value>(&self.endpoint, "/v3/maintenance/transfer-leadership", &body)
            .await
            .map(drop)
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    fn unreachable(&self, e: RequestError) -> EtcdError {
        EtcdError::Unreachable(format!("etcd at {} ({e})", self.shown))
    }

    async fn post<T: DeserializeOwned>(
        &self,
        base: &str,
        path: &'static str,
        body: &str,
    ) -> Result<T, RequestError> {
        let member = shown_url(base);
        let unavailable = |detail: String| RequestError::Unavailable {
            member: member.clone(),
            detail,
        };
        let answer = self
            .http
            .post(format!("{base}{path}"))
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.to_owned())
            .send()
            .await
            .map_err(|e| {
                unavailable(if e.is_timeout() {
                    format!("no answer within etcd.timeout ({:?})", self.timeout)
                } else {
                    crate::util::http_error(&e)
                })
            })?;
        let status = answer.status();
        let text = answer
            .text()
            .await
            .map_err(|e| unavailable(crate::util::http_error(&e)))?;
        if !status.is_success() {
            let err: ErrorBody = serde_json::from_str(&text).unwrap_or_default();
            let said = [err.message, err.error]
                .into_iter()
                .find(|m| !m.is_empty())
                .unwrap_or_else(|| text.chars().take(200).collect());
            return Err(RequestError::Answered {
                member,
                path,
                status: status.as_u16(),
                said,
            });
        }
        serde_json::from_str(&text).map_err(|e| RequestError::Invalid {
            member,
            path,
            detail: e.to_string(),
        })
    }
}

/// A member's URL as shown: scheme, host and port, never a user part.
fn shown_url(base: &str) -> String {
    match url::Url::parse(base) {
        Ok(u) => format!(
            "{}://{}{}",
            u.scheme(),
            u.host_str().unwrap_or("?"),
            u.port().map(|p| format!(":{p}")).unwrap_or_default()
        ),
        Err(_) => "(an invalid URL)".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_member_url_is_shown_without_a_user_part() {
        assert_eq!(
            shown_url("https://root:pw@10.0.0.1:2379"),
            "https://10.0.0.1:2379"
        );
        assert_eq!(shown_url("not a url"), "(an invalid URL)");
    }

    #[test]
    fn a_missing_certificate_names_the_key_the_file_and_what_to_do() {
        let cfg = EtcdConfig {
            ca_file: "/nonexistent/ca.crt".into(),
            ..EtcdConfig::default()
        };
        let Err(EtcdError::Setup(why)) = Client::new(&cfg) else {
            panic!("a missing CA sets up no client");
        };
        assert!(
            why.starts_with("cannot read etcd.ca_file /nonexistent/ca.crt: No such file"),
            "{why}"
        );
        assert!(why.contains("kubeadm"), "{why}");
    }
}
