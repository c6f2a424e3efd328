//! The control socket protocol, shared by the daemon and `ginxctl`: newline-delimited JSON, one
//! request per line, one response per request, each carrying the protocol version.
//!
//! ```text
//! → {"version":1,"command":"sync","source":"hephaestus"}
//! ← {"version":1,"ok":true,"result":{"sources":[...]}}
//! ← {"version":1,"ok":false,"error":{"kind":"forbidden","message":"..."}}
//! ```

use serde::{Deserialize, Serialize};

use crate::source::SyncOutcome;
use crate::state::Attempt;
use crate::status::{BootstrapStatus, FleetStatus, HaltStatus};
use crate::types::Revision;

pub const PROTOCOL_VERSION: u32 = 1;
/// Longest request line accepted; longer ones get an error and the connection is closed.
pub const MAX_REQUEST: usize = 64 * 1024;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Request {
    pub version: u32,
    #[serde(flatten)]
    pub command: Command,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "command", rename_all = "kebab-case")]
pub enum Command {
    Status,
    Sync {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        source: Option<String>,
    },
    Suspend,
    Resume,
    /// Make REVISION the commit new heads of SOURCE must descend from (after a deliberate
    /// history rewrite).
    Accept {
        source: String,
        revision: String,
    },
    History {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        limit: Option<usize>,
    },
    /// Forget failures, give-ups and a rollback; apply the wanted revision again now.
    Retry,
    /// Switch to the previous system generation.
    Rollback,
    /// A file of a source at the revision it offers (how `ginxctl kubeadm` reads Argus).
    SourceFile {
        source: String,
        path: String,
    },
    /// Fleet-wide: no node starts applying a new revision until `rollout-resume`.
    RolloutPause,
    RolloutResume,
    /// Fleet-wide: lift the halt of REVISION (full, or a unique prefix of a halted one).
    RolloutClear {
        revision: String,
    },
    /// The fleet as the API has it: nodes, slots, the fleet state.
    Cluster,
    /// `ginxctl bootstrap` saying where its run is (kept for `status`).
    BootstrapReport {
        report: BootstrapStatus,
    },
}

/// One request line (without its newline) as the daemon reads it: valid JSON, the protocol
/// version, a known command. The refusal is the response to send.
pub fn parse_request(line: &[u8]) -> Result<Request, Response> {
    let value: serde_json::Value = serde_json::from_slice(line).map_err(|e| {
        Response::error(
            ErrorKind::BadRequest,
            format!("request is not valid JSON: {e}"),
        )
    })?;
    match value.get("version").and_then(serde_json::Value::as_u64) {
        Some(v) if v == u64::from(PROTOCOL_VERSION) => {}
        Some(v) => {
            return Err(Response::error(
                ErrorKind::UnsupportedVersion,
                format!(
                    "protocol version {v} is not supported; this ginx speaks {PROTOCOL_VERSION}: use a matching ginxctl"
                ),
            ));
        }
        None => {
            return Err(Response::error(
                ErrorKind::BadRequest,
                "request has no \"version\" number",
            ));
        }
    }
    serde_json::from_value(value)
        .map_err(|e| Response::error(ErrorKind::BadRequest, format!("not a valid request: {e}")))
}

impl Command {
    /// Whether the command changes what ginx does (root or the control group only).
    pub fn mutates(&self) -> bool {
        matches!(
            self,
            Command::Sync { .. }
                | Command::Suspend
                | Command::Resume
                | Command::Accept { .. }
                | Command::Retry
                | Command::Rollback
                | Command::RolloutPause
                | Command::RolloutResume
                | Command::RolloutClear { .. }
                | Command::BootstrapReport { .. }
                // Not a change, but repository content is more than status.
                | Command::SourceFile { .. }
        )
    }

    pub fn name(&self) -> &'static str {
        match self {
            Command::Status => "status",
            Command::Sync { .. } => "sync",
            Command::Suspend => "suspend",
            Command::Resume => "resume",
            Command::Accept { .. } => "accept",
            Command::Retry => "retry",
            Command::Rollback => "rollback",
            Command::SourceFile { .. } => "source-file",
            Command::History { .. } => "history",
            Command::RolloutPause => "rollout-pause",
            Command::RolloutResume => "rollout-resume",
            Command::RolloutClear { .. } => "rollout-clear",
            Command::Cluster => "cluster",
            Command::BootstrapReport { .. } => "bootstrap-report",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Response {
    pub version: u32,
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<ErrorBody>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub kind: ErrorKind,
    pub message: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ErrorKind {
    /// The request is not valid JSON or not a known command.
    BadRequest,
    TooLarge,
    UnsupportedVersion,
    Forbidden,
    NotFound,
    Unavailable,
    Internal,
}

impl Response {
    pub fn ok(result: impl Serialize) -> Self {
        match serde_json::to_value(result) {
            Ok(v) => Self {
                version: PROTOCOL_VERSION,
                ok: true,
                result: Some(v),
                error: None,
            },
            Err(e) => Self::error(
                ErrorKind::Internal,
                format!("cannot encode the result: {e}"),
            ),
        }
    }

    pub fn error(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            version: PROTOCOL_VERSION,
            ok: false,
            result: None,
            error: Some(ErrorBody {
                kind,
                message: message.into(),
            }),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SyncReport {
    pub sources: Vec<SyncOutcome>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AcceptReport {
    pub source: String,
    /// The full commit id accepted.
    pub revision: Revision,
    /// The fetch that followed.
    pub outcome: SyncOutcome,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SuspendReport {
    pub suspended: bool,
    /// False when it already was in that state.
    pub changed: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SourceFileReport {
    pub source: String,
    pub revision: Revision,
    pub path: String,
    pub content: String,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RollbackReport {
    /// The attempt that performs it (see `ginxctl history`).
    pub attempt: u64,
}

/// The answer to `rollout-pause` and `rollout-resume`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FleetReport {
    /// False when the fleet already was in that state (nothing was written).
    pub changed: bool,
    /// The fleet state as the ConfigMap has it now.
    pub fleet: FleetStatus,
}

/// The answer to `rollout-clear`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClearReport {
    /// The halt that was lifted.
    pub cleared: HaltStatus,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HistoryReport {
    /// Newest first.
    pub attempts: Vec<Attempt>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_tagged_by_command() {
        let r: Request =
            serde_json::from_str(r#"{"version":1,"command":"sync","source":"argus"}"#).unwrap();
        assert_eq!(
            r.command,
            Command::Sync {
                source: Some("argus".into())
            }
        );
        let r: Request = serde_json::from_str(r#"{"version":1,"command":"status"}"#).unwrap();
        assert_eq!(r.command, Command::Status);
        let r: Request =
            serde_json::from_str(r#"{"version":1,"command":"rollout-clear","revision":"0123456"}"#)
                .unwrap();
        assert_eq!(
            r.command,
            Command::RolloutClear {
                revision: "0123456".into()
            }
        );
        let r: Request = serde_json::from_str(r#"{"version":1,"command":"cluster"}"#).unwrap();
        assert_eq!(r.command, Command::Cluster);
        assert!(serde_json::from_str::<Request>(r#"{"version":1,"command":"explode"}"#).is_err());
        assert!(serde_json::from_str::<Request>(r#"{"command":"status"}"#).is_err());
    }

    #[test]
    fn only_changes_need_the_group() {
        assert!(!Command::Status.mutates());
        assert!(!Command::History { limit: None }.mutates());
        assert!(Command::Suspend.mutates());
        assert!(Command::Resume.mutates());
        assert!(Command::Sync { source: None }.mutates());
        assert!(!Command::Cluster.mutates());
        assert!(
            Command::BootstrapReport {
                report: BootstrapStatus::pending()
            }
            .mutates()
        );
        assert!(Command::RolloutPause.mutates());
        assert!(Command::RolloutResume.mutates());
        assert!(
            Command::RolloutClear {
                revision: "0123456".into()
            }
            .mutates()
        );
        assert!(
            Command::Accept {
                source: "h".into(),
                revision: "abc".into()
            }
            .mutates()
        );
    }
}
