//! Notices: what happened on this node that an operator wants told where they look (a
//! Kubernetes Event on the Node, a webhook), as opposed to what the journal records.
//!
//! Emitting never blocks and never fails: a [`Notices`] handle sends into a bounded broadcast
//! channel, and each sink (the Event recorder, each `[[notify]]` webhook) reads at its own pace;
//! a sink that falls behind loses the oldest notices and counts them.

use std::fmt;

use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;

use super::Invalid;

/// Why a notice is given: the Event's `reason`, the webhook body's `reason`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Reason {
    /// An activation of a revision started (under the rollout slot, if any).
    Applying,
    /// An activation succeeded.
    Applied,
    /// A build or an activation failed.
    ApplyFailed,
    GatePassed,
    GateFailed,
    /// The previous system is active again after a failed gate (or by hand).
    RolledBack,
    /// The rolled-back system failed its own health gate: the node needs a person.
    RollbackUnhealthy,
    /// A revision was halted fleet-wide (by this node, or found halted by another).
    RevisionHalted,
    /// The rollout slot this node held was taken or not renewed in time.
    SlotLost,
    /// This node took over a slot whose holder stopped renewing it mid-rollout.
    HolderVanished,
    Draining,
    /// An eviction is refused by a PodDisruptionBudget (named in the message).
    DrainBlocked,
    Rebooting,
    Rebooted,
    /// The running system is not the one ginx produced.
    DriftDetected,
    /// A stage of `ginxctl bootstrap` began, held, or failed.
    BootstrapStage,
    /// A revision was built and its plan computed: what activating it will disrupt.
    Planned,
    /// This node's etcd member led and handed the leadership to another before a disruption.
    EtcdLeaderMoved,
    /// The etcd guard holds this control-plane node back: a member is unfit, or the quorum
    /// would not survive it going down.
    EtcdUnhealthy,
    /// An operator's hold (`ginxctl hold`) keeps this node out of the rollout.
    Held,
    /// The last look (the guards asked again right before a reboot or an activation) held
    /// the drained node past `reboot.guard_timeout`: the attempt was given up, the node
    /// uncordoned and its slot released, and it is tried again later.
    PutOff,
}

impl Reason {
    pub const ALL: [Reason; 21] = [
        Reason::Applying,
        Reason::Applied,
        Reason::ApplyFailed,
        Reason::GatePassed,
        Reason::GateFailed,
        Reason::RolledBack,
        Reason::RollbackUnhealthy,
        Reason::RevisionHalted,
        Reason::SlotLost,
        Reason::HolderVanished,
        Reason::Draining,
        Reason::DrainBlocked,
        Reason::Rebooting,
        Reason::Rebooted,
        Reason::DriftDetected,
        Reason::BootstrapStage,
        Reason::Planned,
        Reason::EtcdLeaderMoved,
        Reason::EtcdUnhealthy,
        Reason::Held,
        Reason::PutOff,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Applying => "Applying",
            Reason::Applied => "Applied",
            Reason::ApplyFailed => "ApplyFailed",
            Reason::GatePassed => "GatePassed",
            Reason::GateFailed => "GateFailed",
            Reason::RolledBack => "RolledBack",
            Reason::RollbackUnhealthy => "RollbackUnhealthy",
            Reason::RevisionHalted => "RevisionHalted",
            Reason::SlotLost => "SlotLost",
            Reason::HolderVanished => "HolderVanished",
            Reason::Draining => "Draining",
            Reason::DrainBlocked => "DrainBlocked",
            Reason::Rebooting => "Rebooting",
            Reason::Rebooted => "Rebooted",
            Reason::DriftDetected => "DriftDetected",
            Reason::BootstrapStage => "BootstrapStage",
            Reason::Planned => "Planned",
            Reason::EtcdLeaderMoved => "EtcdLeaderMoved",
            Reason::EtcdUnhealthy => "EtcdUnhealthy",
            Reason::Held => "Held",
            Reason::PutOff => "PutOff",
        }
    }

    /// `Warning` Events are the ones an operator must look at; the rest are `Normal`.
    pub fn warning(self) -> bool {
        matches!(
            self,
            Reason::ApplyFailed
                | Reason::GateFailed
                | Reason::RollbackUnhealthy
                | Reason::RevisionHalted
                | Reason::SlotLost
                | Reason::HolderVanished
                | Reason::DrainBlocked
                | Reason::PutOff
                | Reason::DriftDetected
                | Reason::EtcdUnhealthy
        )
    }

    /// The Event's `action` (what ginx was doing), as `events.k8s.io/v1` requires one.
    pub fn action(self) -> &'static str {
        match self {
            Reason::Applying | Reason::Applied | Reason::ApplyFailed => "Apply",
            Reason::GatePassed | Reason::GateFailed => "HealthGate",
            Reason::RolledBack | Reason::RollbackUnhealthy => "Rollback",
            Reason::RevisionHalted | Reason::SlotLost | Reason::HolderVanished | Reason::Held => {
                "Rollout"
            }
            Reason::Draining | Reason::DrainBlocked | Reason::PutOff => "Drain",
            Reason::Rebooting | Reason::Rebooted => "Reboot",
            Reason::DriftDetected => "DriftCheck",
            Reason::BootstrapStage => "Bootstrap",
            Reason::Planned => "Plan",
            Reason::EtcdLeaderMoved | Reason::EtcdUnhealthy => "EtcdGuard",
        }
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Reason {
    type Err = Invalid;
    fn from_str(s: &str) -> Result<Self, Invalid> {
        Reason::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| {
                format!(
                    "unknown reason {s:?}; one of {}",
                    Reason::ALL.map(Reason::as_str).join(", ")
                )
            })
            .map_err(Invalid)
    }
}

/// One notice. `message` is for a person (one line, no secrets: only what the journal says).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Notice {
    pub reason: Reason,
    pub message: String,
    /// The revision concerned (full commit id), when there is one.
    pub revision: Option<String>,
    /// When it happened (this node's wall clock; for people, never for decisions).
    pub at: jiff::Timestamp,
}

/// Where notices are sent: cheap to clone, never blocks. A handle made by
/// [`Notices::disabled`] drops everything (tests, and the parts run without a daemon).
#[derive(Clone, Debug)]
pub struct Notices(Option<broadcast::Sender<Notice>>);

/// How many notices a slow sink may fall behind before it loses the oldest.
pub const BACKLOG: usize = 256;

impl Notices {
    pub fn new() -> Self {
        Self(Some(broadcast::channel(BACKLOG).0))
    }

    pub fn disabled() -> Self {
        Self(None)
    }

    /// Sends a notice to every sink subscribed now.
    pub fn emit(&self, reason: Reason, revision: Option<&str>, message: impl Into<String>) {
        if let Some(tx) = &self.0 {
            // No receiver is not an error: no sink is configured.
            let _ = tx.send(Notice {
                reason,
                message: message.into(),
                revision: revision.map(str::to_owned),
                at: jiff::Timestamp::now(),
            });
        }
    }

    /// A receiver of every notice emitted from now on.
    pub fn subscribe(&self) -> Option<broadcast::Receiver<Notice>> {
        self.0.as_ref().map(broadcast::Sender::subscribe)
    }
}

impl Default for Notices {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_read_back_and_name_the_choices_when_unknown() {
        for r in Reason::ALL {
            assert_eq!(r.as_str().parse::<Reason>(), Ok(r));
        }
        let e = "Halted".parse::<Reason>().unwrap_err();
        assert!(
            e.0.contains("RevisionHalted") && e.0.contains("\"Halted\""),
            "{e}"
        );
    }

    #[test]
    fn emitting_never_blocks_and_a_slow_sink_loses_only_the_oldest() {
        let n = Notices::new();
        n.emit(Reason::Applied, None, "nobody listens yet");
        let mut rx = n.subscribe().unwrap();
        for i in 0..BACKLOG + 10 {
            n.emit(Reason::Applying, Some("abc"), format!("{i}"));
        }
        assert!(matches!(
            rx.try_recv(),
            Err(broadcast::error::TryRecvError::Lagged(10))
        ));
        assert_eq!(rx.try_recv().unwrap().message, "10");
        Notices::disabled().emit(Reason::Applied, None, "dropped");
        assert!(Notices::disabled().subscribe().is_none());
    }
}
