//! What each source shows in status: the revision it offers, how its remotes fared, what was
//! refused and which signature was accepted. The pollers in `source` fill it in.

use std::path::PathBuf;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::types::Revision;

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
