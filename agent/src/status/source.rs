//! What each source shows in status: the revision it offers, how its remotes fared, what was
//! refused and which signature was accepted.
//!
//! Owns: the JSON shape `ginxctl status` prints for a source, built from what the pollers in
//! `source` report ([`SourceReport`]). Not here: the report itself, which the workers read;
//! this view only follows it, so its fields stay as users know them.

use std::path::PathBuf;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::types::{AcceptedSignature, RefusedHead, RemoteReport, Revision, SourceReport};

/// What `ginxctl status` shows for a source.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SourceStatus {
    /// The remote that served the last fetch (else the first configured), without credentials.
    pub url: String,
    /// The configured branch.
    pub branch: String,
    /// The accepted revision, whose tree is checked out.
    pub revision: Option<Revision>,
    /// The branch `revision` came from: `branch`, or the testing branch.
    pub revision_branch: Option<String>,
    /// `revision` comes from the node's testing branch.
    pub testing: bool,
    /// When a fetch last succeeded.
    pub fetched_at: Option<Timestamp>,
    /// Why the last fetch failed or its head was refused; `None` when all is well.
    pub error: Option<String>,
    /// When the current run of failures or refusals began.
    pub failing_since: Option<Timestamp>,
    /// When the next scheduled fetch is due.
    pub next_fetch_at: Option<Timestamp>,
    /// The checked-out tree of `revision`.
    pub tree: Option<PathBuf>,
    /// Every configured remote and how it fared in the last fetch.
    pub remotes: Vec<RemoteStatus>,
    /// A head that was fetched but not accepted, and why.
    pub refused: Option<Refused>,
    /// The commit new heads must descend from (last deployed or accepted).
    pub deployed: Option<Revision>,
    /// The accepted signature of `revision`, when a policy is configured.
    pub signature: Option<Signed>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteStatus {
    pub url: String,
    /// `Some(true)` served the last fetch, `Some(false)` failed, `None` not tried.
    pub ok: Option<bool>,
    pub error: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refused {
    pub revision: Revision,
    pub reason: String,
}

/// A signature that was accepted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Signed {
    /// `ssh` or `openpgp`.
    pub format: String,
    /// `SHA256:…` for SSH keys, the hex fingerprint for OpenPGP keys.
    pub key: String,
    /// The allowed-signers principal, or the key's first user id.
    pub signer: String,
}

impl From<&SourceReport> for SourceStatus {
    fn from(r: &SourceReport) -> Self {
        Self {
            url: r.url.clone(),
            branch: r.branch.clone(),
            revision: r.revision.clone(),
            revision_branch: r.revision_branch.clone(),
            testing: r.testing,
            fetched_at: r.fetched_at,
            error: r.error.clone(),
            failing_since: r.failing_since,
            next_fetch_at: r.next_fetch_at,
            tree: r.tree.clone(),
            remotes: r.remotes.iter().map(RemoteStatus::from).collect(),
            refused: r.refused.as_ref().map(Refused::from),
            deployed: r.deployed.clone(),
            signature: r.signature.as_ref().map(Signed::from),
        }
    }
}

impl From<&RemoteReport> for RemoteStatus {
    fn from(r: &RemoteReport) -> Self {
        Self {
            url: r.url.clone(),
            ok: r.ok,
            error: r.error.clone(),
        }
    }
}

impl From<&RefusedHead> for Refused {
    fn from(r: &RefusedHead) -> Self {
        Self {
            revision: r.revision.clone(),
            reason: r.reason.clone(),
        }
    }
}

impl From<&AcceptedSignature> for Signed {
    fn from(s: &AcceptedSignature) -> Self {
        Self {
            format: s.format.clone(),
            key: s.key.clone(),
            signer: s.signer.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rev(c: char) -> Revision {
        c.to_string().repeat(40).parse().unwrap()
    }

    /// The JSON of a source in `ginxctl status` is a contract: every field of the report
    /// reaches it under the name users know, in the same order.
    #[test]
    fn a_source_report_shows_as_the_known_status_json() {
        let report = SourceReport {
            url: "https://git.example/argus".into(),
            branch: "main".into(),
            revision: Some(rev('a')),
            revision_branch: Some("testing/n1".into()),
            testing: true,
            fetched_at: Some("2026-01-02T03:04:05Z".parse().unwrap()),
            error: Some("behind".into()),
            failing_since: Some("2026-01-02T03:00:00Z".parse().unwrap()),
            next_fetch_at: Some("2026-01-02T03:05:05Z".parse().unwrap()),
            tree: Some(PathBuf::from("/var/lib/ginx/trees/argus/a")),
            remotes: vec![
                RemoteReport {
                    url: "https://git.example/argus".into(),
                    ok: Some(true),
                    error: None,
                },
                RemoteReport {
                    url: "https://mirror.example/argus".into(),
                    ok: Some(false),
                    error: Some("refused".into()),
                },
            ],
            refused: Some(RefusedHead {
                revision: rev('b'),
                reason: "behind".into(),
            }),
            deployed: Some(rev('c')),
            signature: Some(AcceptedSignature {
                format: "ssh".into(),
                key: "SHA256:k".into(),
                signer: "ops".into(),
            }),
        };
        let (a, b, c) = ("a".repeat(40), "b".repeat(40), "c".repeat(40));
        let expected = format!(
            concat!(
                r#"{{"url":"https://git.example/argus","branch":"main","revision":"{a}","#,
                r#""revision_branch":"testing/n1","testing":true,"#,
                r#""fetched_at":"2026-01-02T03:04:05Z","error":"behind","#,
                r#""failing_since":"2026-01-02T03:00:00Z","next_fetch_at":"2026-01-02T03:05:05Z","#,
                r#""tree":"/var/lib/ginx/trees/argus/a","remotes":["#,
                r#"{{"url":"https://git.example/argus","ok":true,"error":null}},"#,
                r#"{{"url":"https://mirror.example/argus","ok":false,"error":"refused"}}],"#,
                r#""refused":{{"revision":"{b}","reason":"behind"}},"deployed":"{c}","#,
                r#""signature":{{"format":"ssh","key":"SHA256:k","signer":"ops"}}}}"#
            ),
            a = a,
            b = b,
            c = c
        );
        let json = serde_json::to_string(&SourceStatus::from(&report)).unwrap();
        assert_eq!(json, expected);
    }

    #[test]
    fn an_empty_report_shows_as_an_empty_status() {
        assert_eq!(
            SourceStatus::from(&SourceReport::default()),
            SourceStatus::default()
        );
    }
}
