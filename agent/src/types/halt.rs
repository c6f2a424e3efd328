//! [`HaltCause`]: why a revision is halted, the one vocabulary the `ginx-rollout` ConfigMap's
//! stored format and the status views both speak.
//!
//! Owns: the causes, their JSON names (kebab-case, fields are added, never renamed) and how they
//! print. What a halt means for applying is the rollout's business, not this file's.

use serde::{Deserialize, Serialize};

/// Why a revision is halted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HaltCause {
    /// Its health gate failed on `node`.
    #[default]
    GateFailed,
    /// `node` held a slot while applying or verifying it and stopped renewing it (died, lost
    /// its network, or was cut off); the node that took the slot over halted it. Lifted by
    /// itself when `node` comes back and its gate passes.
    HolderVanished,
    /// The revision failed to build on `node` (`rollout.halt_on_build_failure`).
    BuildFailed,
}

impl HaltCause {
    pub fn is_gate_failed(&self) -> bool {
        *self == HaltCause::GateFailed
    }

    pub fn as_str(self) -> &'static str {
        match self {
            HaltCause::GateFailed => "gate-failed",
            HaltCause::HolderVanished => "holder-vanished",
            HaltCause::BuildFailed => "build-failed",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cause_serializes_as_it_prints() {
        for c in [
            HaltCause::GateFailed,
            HaltCause::HolderVanished,
            HaltCause::BuildFailed,
        ] {
            assert_eq!(
                serde_json::to_string(&c).unwrap(),
                format!("\"{}\"", c.as_str())
            );
            assert_eq!(
                serde_json::from_str::<HaltCause>(&format!("\"{}\"", c.as_str())).unwrap(),
                c
            );
        }
        assert_eq!(HaltCause::default(), HaltCause::GateFailed);
        assert!(HaltCause::GateFailed.is_gate_failed());
        assert!(!HaltCause::BuildFailed.is_gate_failed());
    }
}
