//! What a source's poller publishes about its source, for the workers that act on it (the
//! reconciler takes the revision to apply, the kubeadm watcher the revision of its facts, the
//! control socket the revision to read files from) and for the status that shows it.
//!
//! Owns: the internal shape of that report. It is deliberately not serialised: what
//! `ginxctl status` prints is `status::SourceStatus`, built from a [`SourceReport`], so the
//! workers' needs and the status' JSON can change apart from each other.

use std::collections::BTreeMap;
use std::path::PathBuf;

use jiff::Timestamp;

use super::Revision;

/// The reports of all sources, by source name; each poller writes its own entry.
pub type SourceReports = BTreeMap<String, SourceReport>;

/// Where a source stands: the revision it offers, its last fetch, and why a head was refused.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SourceReport {
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
    pub remotes: Vec<RemoteReport>,
    /// A head that was fetched but not accepted, and why.
    pub refused: Option<RefusedHead>,
    /// The commit new heads must descend from (last deployed or accepted).
    pub deployed: Option<Revision>,
    /// The accepted signature of `revision`, when a policy is configured.
    pub signature: Option<AcceptedSignature>,
}

/// How one configured remote fared in the last fetch.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RemoteReport {
    /// The remote, without credentials.
    pub url: String,
    /// `Some(true)` served the last fetch, `Some(false)` failed, `None` not tried.
    pub ok: Option<bool>,
    pub error: Option<String>,
}

/// A fetched head that was not accepted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RefusedHead {
    pub revision: Revision,
    pub reason: String,
}

/// A commit signature that the source's policy accepted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AcceptedSignature {
    /// `ssh` or `openpgp`.
    pub format: String,
    /// `SHA256:…` for SSH keys, the hex fingerprint for OpenPGP keys.
    pub key: String,
    /// The allowed-signers principal, or the key's first user id.
    pub signer: String,
}
