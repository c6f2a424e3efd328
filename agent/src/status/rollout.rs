//! The rollout's part of status: the lock (backend, group, slot), what a waiting node waits
//! for, the health gate's progress, and the cluster-wide state of the `ginx-rollout` ConfigMap
//! (halted revisions, the fleet pause) as shown. The reconciler fills in [`RolloutStatus`];
//! `ginxctl cluster` prints a [`ClusterView`].
//!
//! Owns: these views and their JSON. Not the ConfigMap's stored format, which the rollout
//! worker owns (and converts into [`FleetStatus`], [`HaltStatus`], [`PauseStatus`]).

use std::collections::BTreeMap;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use super::gate::GateProgress;
use crate::types::{HaltCause, Revision, Role};

/// `rollout.waiting_for`: the one thing that holds a wanted revision back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WaitingFor {
    /// `ginxctl suspend` on this node.
    Suspended,
    /// `ginxctl rollout pause`: the whole fleet.
    Paused,
    /// The revision's health gate failed on another node.
    Halted,
    /// Every slot of the group is held by other nodes.
    Lock,
    /// Another control-plane node is not Ready and healthy, or the VIP does not answer.
    Quorum,
    /// The cluster exists but its API cannot be reached (`on_api_unavailable = "wait"`).
    Api,
    /// Outside every `[[rollout.windows]]` (or `[[reboot.windows]]`).
    Window,
    /// A reboot waits for pods: a blocking pod runs, or the drain is not done.
    Pods,
    /// The reboot command failed; it runs again.
    Reboot,
    /// The API refused a request (401, 403, 404, 422): an error of configuration, which
    /// `on_api_unavailable = "proceed"` never applies past.
    Refused,
    /// A group of `rollout.after` has not passed its gate on the revision everywhere.
    After,
    /// A node of the group passed its gate on the revision less than `rollout.soak` ago.
    Soak,
    /// A control-plane node's etcd guard: a member is unfit, the quorum would not survive this
    /// node going down, or its member leads and the leadership could not be moved.
    Etcd,
    /// `ginxctl hold`: an operator keeps this node out of rollouts.
    Held,
    /// Inside a `[[rollout.freezes]]` range.
    Freeze,
    /// The alert gate: alerts fire (or Prometheus does not answer and
    /// `on_unavailable = "wait"`).
    Alerts,
    /// A canary of the group (`rollout.first`) has not passed its gate on the revision, or the
    /// soak after it is not over.
    Canary,
    /// Nodes before this one in `rollout.order` have not passed the revision.
    Order,
}

impl WaitingFor {
    /// Every wait, in the order the metric lists them.
    pub const ALL: [WaitingFor; 18] = [
        WaitingFor::Suspended,
        WaitingFor::Paused,
        WaitingFor::Halted,
        WaitingFor::Lock,
        WaitingFor::Quorum,
        WaitingFor::Api,
        WaitingFor::Window,
        WaitingFor::Pods,
        WaitingFor::Reboot,
        WaitingFor::Refused,
        WaitingFor::After,
        WaitingFor::Soak,
        WaitingFor::Etcd,
        WaitingFor::Held,
        WaitingFor::Freeze,
        WaitingFor::Alerts,
        WaitingFor::Canary,
        WaitingFor::Order,
    ];

    /// The wait named `name` (as [`WaitingFor::as_str`] writes it).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|w| w.as_str() == name)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            WaitingFor::Suspended => "suspended",
            WaitingFor::Paused => "paused",
            WaitingFor::Halted => "halted",
            WaitingFor::Lock => "lock",
            WaitingFor::Quorum => "quorum",
            WaitingFor::Api => "api",
            WaitingFor::Window => "window",
            WaitingFor::Pods => "pods",
            WaitingFor::Reboot => "reboot",
            WaitingFor::Refused => "refused",
            WaitingFor::After => "after",
            WaitingFor::Soak => "soak",
            WaitingFor::Etcd => "etcd",
            WaitingFor::Held => "held",
            WaitingFor::Freeze => "freeze",
            WaitingFor::Alerts => "alerts",
            WaitingFor::Canary => "canary",
            WaitingFor::Order => "order",
        }
    }
}

/// Where a node is in the rollout of its target revision (`ginx.io/rollout-phase`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    /// Nothing to roll out: the target is applied, or there is none.
    #[default]
    Idle,
    Waiting,
    /// Building the revision ahead of its activation (`apply.prebuild`); no slot held.
    Building,
    Applying,
    /// The health gate after the activation.
    Verifying,
    /// The gate failed; the previous generation is being activated.
    RollingBack,
    /// The health gate of the rolled-back system.
    VerifyingRollback,
    /// The rolled-back system is unhealthy too: the slot is kept, nobody else proceeds.
    RollbackUnhealthy,
    /// The gate failed and `rollback = "manual"`: the slot is kept until an operator acts.
    Failed,
    Succeeded,
    RolledBack,
    /// Cordoned, pods being evicted before a reboot.
    Draining,
    /// The reboot command ran; the node is going down.
    Rebooting,
    /// The slot this node held was lost (taken by another node, or not renewed for its
    /// duration): nothing new starts until a slot is taken again.
    Lost,
    /// The revision's gate failed here below the failure budget (`rollout.halt_after`): the
    /// node keeps its rolled-back system and the rollout goes on without it.
    Quarantined,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Idle => "idle",
            Phase::Waiting => "waiting",
            Phase::Building => "building",
            Phase::Applying => "applying",
            Phase::Verifying => "verifying",
            Phase::RollingBack => "rolling-back",
            Phase::VerifyingRollback => "verifying-rollback",
            Phase::RollbackUnhealthy => "rollback-unhealthy",
            Phase::Failed => "failed",
            Phase::Succeeded => "succeeded",
            Phase::RolledBack => "rolled-back",
            Phase::Draining => "draining",
            Phase::Rebooting => "rebooting",
            Phase::Lost => "lost",
            Phase::Quarantined => "quarantined",
        }
    }
}

/// A halted revision as status and `ginxctl cluster` show it: nodes refuse it until a new
/// revision or `ginxctl rollout clear`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HaltStatus {
    pub revision: Revision,
    /// The node whose gate failed, or that vanished while applying or verifying it.
    pub node: String,
    /// The failing probes and their messages.
    pub probes: BTreeMap<String, String>,
    pub reason: String,
    pub at: Timestamp,
    /// Why: absent for a failed gate (and in halts written before the field existed).
    #[serde(default, skip_serializing_if = "HaltCause::is_gate_failed")]
    pub cause: HaltCause,
    /// For a `holder-vanished` halt: the rollout group whose slot the holder held. The whole
    /// group waits while it stands (the holder may still be activating or verifying).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
}

/// `ginxctl rollout pause` as shown: no node starts applying until `resume`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PauseStatus {
    /// `user@node` of who paused.
    pub by: String,
    pub at: Timestamp,
}

/// `ginxctl hold` as shown: this node starts nothing new until `ginxctl release` or `until`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HoldStatus {
    /// Who placed it, as the API server named the credentials.
    pub by: String,
    pub at: Timestamp,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// When it lapses by itself; absent: at `ginxctl release`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<Timestamp>,
}

/// A change of the fleet state made by a person, as shown: who, when, what.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FleetEventStatus {
    pub by: String,
    pub at: Timestamp,
    /// `pause`, `resume`, `clear <revision>`, `halt <revision>`.
    pub action: String,
}

/// The `ginx-rollout` ConfigMap's contents as `ginxctl cluster --json` and the answer to
/// `ginxctl rollout pause` show them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FleetStatus {
    pub paused: Option<PauseStatus>,
    /// Halted revisions, by full revision.
    pub halted: BTreeMap<String, HaltStatus>,
    /// The latest changes, newest last (a bounded list).
    pub events: Vec<FleetEventStatus>,
    /// The failures counted against each revision's budget (`rollout.halt_after`): full
    /// revision → node → what failed there.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub failures: BTreeMap<String, BTreeMap<String, FailureStatus>>,
    /// Held nodes (`ginxctl hold`), by node; a lapsed hold stays listed until the next
    /// `ginxctl hold` or `release` removes it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub holds: BTreeMap<String, HoldStatus>,
}

/// One node's failure of a revision, counted against its budget, as shown.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailureStatus {
    pub at: Timestamp,
    pub reason: String,
    pub cause: HaltCause,
}

impl RolloutStatus {
    /// What the node waits for, as the metric and the Node's annotation say it: its apply's
    /// wait, else its pending reboot's (a reboot held by etcd or the quorum is a wait too).
    pub fn waiting(&self) -> Option<WaitingFor> {
        self.waiting_for.or_else(|| {
            self.reboot
                .waiting_for
                .as_deref()
                .and_then(WaitingFor::from_name)
        })
    }
}

/// `rollout` in `ginxctl status --json`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RolloutStatus {
    /// The backend in effect: `kubernetes`, `fleetlock` or `none` (`auto` resolved).
    pub lock: String,
    pub group: String,
    pub max_concurrent: u32,
    pub phase: Phase,
    /// The revision being rolled out to this node.
    pub target_revision: Option<Revision>,
    /// The slot this node holds, and its Lease (`namespace/name`).
    pub slot: Option<u32>,
    pub lease: Option<String>,
    /// Who holds the slots of the group, slot → node (as last seen).
    pub holders: BTreeMap<u32, String>,
    pub waiting_for: Option<WaitingFor>,
    /// Why, in words (which node is unhealthy, which revision is halted and by whom).
    pub reason: Option<String>,
    pub waiting_since: Option<Timestamp>,
    pub gate: Option<GateProgress>,
    /// The halt that concerns this node's target revision, if any.
    pub halt: Option<HaltStatus>,
    pub paused: Option<PauseStatus>,
    /// This node's hold (`ginxctl hold`), while it holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold: Option<HoldStatus>,
    /// The maintenance windows (`[[rollout.windows]]`) now; absent when none are configured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<WindowStatus>,
    /// The change freeze holding now, else the next (`[[rollout.freezes]]`); absent when none
    /// is ahead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub freeze: Option<FreezeStatus>,
    /// The reboot (`[reboot]`): required or not, and how far ginx is with it.
    #[serde(default)]
    pub reboot: RebootStatus,
    /// The last revision whose health gate passed on this node (what `rollout.after` of other
    /// groups waits for).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub passed_revision: Option<Revision>,
    /// This node failed the gate of a revision below the failure budget (`rollout.halt_after`):
    /// it keeps its rolled-back system; the rollout went on without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quarantined: Option<Quarantine>,
    /// `rollout.after`: the groups whose every node passes a revision before this group starts
    /// it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub after: Vec<String>,
    /// `rollout.first`: the canaries named (the selector's are not listed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub canaries: Vec<String>,
}

/// `rollout.quarantined` in `ginxctl status --json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quarantine {
    pub revision: Revision,
    /// The checks that failed, with their messages.
    pub failing: BTreeMap<String, String>,
    pub at: Timestamp,
    /// `ginxctl retry` or a new revision ends it.
    pub reason: String,
}

/// `rollout.reboot` in `ginxctl status --json`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RebootStatus {
    /// `reboot.mode`: `never` or `when-required`.
    pub mode: String,
    pub required: bool,
    /// `draining`, `rebooting`, `verifying`, `held`, `finishing`; absent when no reboot is
    /// under way.
    pub phase: Option<String>,
    pub started_at: Option<Timestamp>,
    /// ginx made the node unschedulable (it uncordons only then).
    pub cordoned: bool,
    /// What a required reboot waits for (window, lock, quorum, api, pods), and why.
    pub waiting_for: Option<String>,
    pub reason: Option<String>,
    /// Pods being evicted or waited for (`namespace/name`).
    pub evicting: Vec<String>,
    /// Pods whose eviction is refused now, with why (the PodDisruptionBudget and what it
    /// allows, or the setting that would allow it).
    pub refused: BTreeMap<String, String>,
    /// After a drain was given up: not tried again before then.
    pub deferred_until: Option<Timestamp>,
    /// `[[reboot.windows]]` (or the rollout's) now; absent when there are none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<WindowStatus>,
}

/// `rollout.freeze` in `ginxctl status --json`: a change freeze holding now (`active`), or the
/// next one, with its span (to the end of the freezes it touches) and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FreezeStatus {
    pub active: bool,
    pub reason: String,
    pub starts_at: Timestamp,
    pub ends_at: Timestamp,
}

/// Whether a maintenance window is open: when it closes, or when the next one opens.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WindowStatus {
    pub open: bool,
    pub closes_at: Option<Timestamp>,
    pub opens_at: Option<Timestamp>,
}

/// One node in `ginxctl cluster`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterNode {
    pub name: String,
    pub role: Option<Role>,
    pub ready: Option<bool>,
    /// `GinxHealthy`: status and reason.
    pub healthy: Option<String>,
    pub health_reason: Option<String>,
    pub applied_revision: Option<String>,
    pub target_revision: Option<String>,
    pub apply_state: Option<String>,
    pub rollout_phase: Option<String>,
    /// Seconds since the heartbeat Lease was renewed.
    pub heartbeat_age_secs: Option<i64>,
    /// `group/slot` held.
    pub slot: Option<String>,
    /// What holds the node's target back (`ginx.io/waiting-for`), e.g. `after control-plane`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_for: Option<String>,
    /// The revision it is quarantined on (`ginx.io/quarantined`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quarantined: Option<String>,
    /// The rollout group (`ginx.io/rollout-group`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Its open health gate (`ginx.io/gate`), the probes' messages left out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gate: Option<GateProgress>,
    /// The plan of the revision it waits for (`ginx.io/plan` on its heartbeat Lease).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<crate::types::PlanMark>,
}

/// How far one revision has come through the fleet, in `ginxctl cluster`: nodes by where they
/// are with it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RevisionCounts {
    pub building: u32,
    pub waiting: u32,
    pub activating: u32,
    pub verifying: u32,
    pub done: u32,
    pub failed: u32,
    pub quarantined: u32,
}

/// `ginxctl cluster --json`: the fleet as the API has it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterView {
    pub nodes: Vec<ClusterNode>,
    /// `group/slot` → holder.
    pub slots: BTreeMap<String, String>,
    pub fleet: FleetStatus,
    pub at: Option<Timestamp>,
    /// Each target revision (full) → its nodes by phase.
    #[serde(default)]
    pub revisions: BTreeMap<String, RevisionCounts>,
    /// Each revision (full) that nodes have a plan for → how many go live, drain or reboot,
    /// and what accounts for it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub plans: BTreeMap<String, crate::types::PlanCounts>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reboot_s_wait_is_the_node_s_wait_when_the_apply_has_none() {
        let mut r = RolloutStatus::default();
        assert_eq!(r.waiting(), None);
        r.reboot.waiting_for = Some("etcd".into());
        assert_eq!(r.waiting(), Some(WaitingFor::Etcd));
        r.waiting_for = Some(WaitingFor::Lock);
        assert_eq!(
            r.waiting(),
            Some(WaitingFor::Lock),
            "the apply's wait first"
        );
        for w in WaitingFor::ALL {
            assert_eq!(WaitingFor::from_name(w.as_str()), Some(w));
        }
    }

    /// Where each wait stands in [`WaitingFor::ALL`]. No wildcard: a new wait does not compile
    /// until it is given a place here, and the test below checks that `ALL` holds exactly the
    /// places given, each once.
    fn place(w: WaitingFor) -> usize {
        match w {
            WaitingFor::Suspended => 0,
            WaitingFor::Paused => 1,
            WaitingFor::Halted => 2,
            WaitingFor::Lock => 3,
            WaitingFor::Quorum => 4,
            WaitingFor::Api => 5,
            WaitingFor::Window => 6,
            WaitingFor::Pods => 7,
            WaitingFor::Reboot => 8,
            WaitingFor::Refused => 9,
            WaitingFor::After => 10,
            WaitingFor::Soak => 11,
            WaitingFor::Etcd => 12,
            WaitingFor::Held => 13,
            WaitingFor::Freeze => 14,
            WaitingFor::Alerts => 15,
            WaitingFor::Canary => 16,
            WaitingFor::Order => 17,
        }
    }

    #[test]
    fn all_lists_every_wait_once() {
        for (i, w) in WaitingFor::ALL.into_iter().enumerate() {
            assert_eq!(place(w), i, "{w:?}");
        }
        let last = WaitingFor::ALL.into_iter().map(place).max().unwrap_or(0);
        assert_eq!(WaitingFor::ALL.len(), last + 1);
    }
}
