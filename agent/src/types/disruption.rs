//! What a revision's activation does to the node's workloads, weakest first: nothing
//! ([`Disruption::None`], activated live), a drain before it ([`Disruption::Drain`]), or a
//! reboot ([`Disruption::Reboot`]). The disruption policy maps changed units to one of these,
//! and the strongest a revision calls for wins; so the order of the variants is the order of
//! strength.

use std::fmt;

use serde::{Deserialize, Serialize};

#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum Disruption {
    /// Activated live, with the node serving its pods.
    #[default]
    None,
    /// Cordoned and drained (through PodDisruptionBudgets) before the activation, uncordoned
    /// once its gate passes.
    Drain,
    /// Activated for the next boot, then rebooted, drained first.
    Reboot,
}

impl Disruption {
    /// Weakest first.
    pub const ALL: [Disruption; 3] = [Disruption::None, Disruption::Drain, Disruption::Reboot];

    /// As a plan's line says it: `live`, `drain`, `reboot`.
    pub fn label(self) -> &'static str {
        match self {
            Disruption::None => "live",
            a => a.as_str(),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Disruption::None => "none",
            Disruption::Drain => "drain",
            Disruption::Reboot => "reboot",
        }
    }
}

impl fmt::Display for Disruption {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_strongest_is_the_greatest_and_each_prints_as_it_is_written() {
        assert!(Disruption::None < Disruption::Drain && Disruption::Drain < Disruption::Reboot);
        for d in [Disruption::None, Disruption::Drain, Disruption::Reboot] {
            assert_eq!(serde_json::to_string(&d).unwrap(), format!("\"{d}\""));
        }
    }
}
