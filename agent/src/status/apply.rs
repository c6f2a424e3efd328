//! The reconciler's part of status: the apply state machine's state, the latest attempt, and
//! what the machine runs (generation, reboot, drift). The reconciler fills it in.

use std::path::PathBuf;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::types::{Disruption, Generation, Goal, Plan, Revision, UnitChanges};

/// `apply.state` in `ginxctl status --json`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ApplyState {
    /// Nothing to apply yet (no revision fetched).
    #[default]
    Idle,
    /// A new revision is about to be applied.
    Pending,
    /// A revision is wanted but a gate holds it back (suspended).
    Waiting,
    /// The revision is being built ahead of its activation (`apply.prebuild`), no slot held.
    Building,
    Applying,
    /// After activation, while health is being verified (later).
    Verifying,
    /// The wanted revision is applied.
    Succeeded,
    /// The wanted revision failed; see `next_retry_at` (absent once given up).
    Failed,
    /// `ginxctl rollback` switched to the previous generation; the revision is not applied
    /// again until a new one arrives or `ginxctl retry`.
    RolledBack,
}

impl ApplyState {
    pub fn as_str(self) -> &'static str {
        match self {
            ApplyState::Idle => "idle",
            ApplyState::Pending => "pending",
            ApplyState::Waiting => "waiting",
            ApplyState::Building => "building",
            ApplyState::Applying => "applying",
            ApplyState::Verifying => "verifying",
            ApplyState::Succeeded => "succeeded",
            ApplyState::Failed => "failed",
            ApplyState::RolledBack => "rolled-back",
        }
    }
}

/// `apply` in `ginxctl status --json`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ApplyStatus {
    pub state: ApplyState,
    /// The source whose revisions are applied.
    pub source: String,
    /// The revision `state` is about: being applied, failed, waiting, or applied.
    pub revision: Option<Revision>,
    pub goal: Goal,
    /// Start and end of the latest attempt.
    pub started_at: Option<Timestamp>,
    pub finished_at: Option<Timestamp>,
    /// Failed attempts of `revision` so far.
    pub attempts: u32,
    pub error: Option<String>,
    /// The last revision applied successfully.
    pub applied_revision: Option<Revision>,
    pub applied_at: Option<Timestamp>,
    /// When a failed revision is tried again; absent when given up.
    pub next_retry_at: Option<Timestamp>,
    /// The failed revision is given up until a new revision or `ginxctl retry`.
    pub given_up: bool,
    /// Why nothing happens, in words.
    pub reason: Option<String>,
    /// `process` or `systemd-run`.
    pub isolation: String,
    /// `colmena` or `closure` (`apply.mode`).
    #[serde(default)]
    pub mode: String,
    /// Closure mode: the store path being applied, or of the last attempt.
    #[serde(default)]
    pub closure: Option<crate::types::ClosureInfo>,
    /// What activating the revision built and not yet applied would do.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<PlanStatus>,
    /// The drain before a live activation that its plan called for, from the cordon until the
    /// uncordon after the gate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain: Option<ApplyDrainStatus>,
}

/// `apply.drain` in `ginxctl status --json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApplyDrainStatus {
    pub revision: Revision,
    /// What in the plan called for it (`restarts containerd.service`).
    #[serde(default)]
    pub because: Vec<String>,
    pub started_at: Timestamp,
    /// ginx cordoned the node (and uncordons it at the end); false when it was already
    /// unschedulable.
    pub cordoned: bool,
    /// When the node was drained; absent while pods are being evicted.
    #[serde(default)]
    pub drained_at: Option<Timestamp>,
    /// The activation started after the drain.
    pub activated: bool,
}

/// `apply.plan` in `ginxctl status --json`: the plan of the built revision that comes next.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanStatus {
    pub revision: Revision,
    /// `none` (live), `drain` or `reboot`.
    pub action: Disruption,
    /// One line, as `ginxctl status` prints it after "next:".
    pub summary: String,
    /// What calls for the action (`restarts kubelet.service`, `kernel changed: …`).
    #[serde(default)]
    pub because: Vec<String>,
    /// Why the activation's effect is not known, when it is not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unknown: Option<String>,
    /// The units dry-activate named, by what would happen to them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub units: Option<UnitChanges>,
    /// Packages whose versions or sizes change, and the closure's growth in bytes.
    #[serde(default)]
    pub packages: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub added_bytes: Option<i64>,
    /// How long computing it took, the build excluded.
    #[serde(default)]
    pub took_ms: u64,
}

impl PlanStatus {
    pub fn of(revision: &Revision, p: &Plan) -> PlanStatus {
        PlanStatus {
            revision: revision.clone(),
            action: p.action,
            summary: p.summary(),
            because: p.because.clone(),
            unknown: p.unknown.clone(),
            units: p.units.clone(),
            packages: p.packages.len(),
            added_bytes: p.added_bytes,
            took_ms: p.took_ms,
        }
    }
}

/// `system` in `ginxctl status --json`: what the machine runs.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SystemStatus {
    /// The system profile's current generation.
    pub generation: Option<Generation>,
    pub current_system: Option<PathBuf>,
    pub booted_system: Option<PathBuf>,
    pub reboot_required: bool,
    pub reboot_reasons: Vec<String>,
    /// The running system is not the one ginx produced last.
    pub drift: Option<Drift>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Drift {
    pub expected: PathBuf,
    pub current: PathBuf,
    pub since: Timestamp,
}

/// The state (or history) file could not be written: why, and since when. Shown as the
/// `state` entry of `health`, failed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateWriteError {
    pub error: String,
    pub since: Timestamp,
}

/// What the loop publishes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Published {
    pub apply: ApplyStatus,
    pub system: SystemStatus,
    pub suspended: bool,
    /// The last write of the state failed; nothing is applied until one succeeds.
    pub state_write: Option<StateWriteError>,
    pub rollout: super::RolloutStatus,
}
