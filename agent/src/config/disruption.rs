//! `[disruption]`: what a revision's changes call for before it is activated, decided from its
//! plan (the units `switch-to-configuration dry-activate` says it would stop or restart): a live
//! activation, a drain first, or a reboot. The rules are read here and checked at load; the
//! decision is `apply::plan::policy`'s.

use serde::{Deserialize, Serialize};

use super::{ConfigError, Ctx, Duration, bounds};
use crate::types::Disruption;
use crate::types::Invalid;

/// The disruption policy.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DisruptionConfig {
    /// Unit patterns and the action each calls for; for each unit the activation would stop or
    /// restart, the first rule that matches decides, no rule means `none`, and across the units
    /// the strongest action wins. Writing `[[disruption.rules]]` replaces every default rule.
    pub rules: Vec<DisruptionRule>,
    /// What a plan that could not be computed (dry-activate failed or timed out) calls for.
    pub unknown: Disruption,
    /// How long each step of computing a plan may take (finding the built system,
    /// dry-activate, the closure difference); past it, the step is killed and the plan is
    /// unknown.
    pub timeout: Duration,
    /// `apply.mode = "colmena"`: the command, run in the checkout after the build, that prints
    /// the built system's store path (`{node}` replaced), as a JSON string or a plain line. The
    /// default asks colmena for the node's `system.build.toplevel`.
    pub system_command: Vec<String>,
}

/// One rule of the policy.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DisruptionRule {
    /// Unit names or globs (`*`, `?`, `[…]`), like `kubelet.service` or `cilium*.service`.
    pub units: Vec<String>,
    /// `none` (activate live), `drain` (cordon and drain first, uncordon after the gate) or
    /// `reboot` (activate for the next boot and reboot).
    pub action: Disruption,
}

impl Default for DisruptionConfig {
    fn default() -> Self {
        Self {
            rules: default_rules(),
            unknown: Disruption::Drain,
            timeout: Duration::from_secs(120),
            system_command: [
                "colmena",
                "eval",
                "-E",
                "{ nodes, ... }: nodes.\"{node}\".config.system.build.toplevel.outPath",
            ]
            .map(String::from)
            .to_vec(),
        }
    }
}

/// The default rules: what takes a Kubernetes node's pods down with it when it restarts (the
/// container runtimes, the kubelet, Cilium's agent) or cuts them off the network (networkd, the
/// scripted network units, the firewall) is drained for; everything else goes live.
pub const DEFAULT_DRAIN_UNITS: [&str; 11] = [
    "containerd.service",
    "cri-o.service",
    "crio.service",
    "kubelet.service",
    "cilium*.service",
    "systemd-networkd.service",
    "network-setup.service",
    "network-addresses-*.service",
    "firewall.service",
    "nftables.service",
    "iptables.service",
];

fn default_rules() -> Vec<DisruptionRule> {
    vec![DisruptionRule {
        units: DEFAULT_DRAIN_UNITS.map(String::from).to_vec(),
        action: Disruption::Drain,
    }]
}

impl DisruptionConfig {
    pub(super) fn validate(&self, ctx: &Ctx<'_>) -> Result<(), ConfigError> {
        for (i, rule) in self.rules.iter().enumerate() {
            if rule.units.is_empty() {
                return Err(ctx.error(
                    &format!("disruption.rules[{i}].units"),
                    "is empty: a rule must name at least one unit or glob",
                ));
            }
            for (j, unit) in rule.units.iter().enumerate() {
                if let Err(why) = check_glob(unit) {
                    return Err(ctx.error(&format!("disruption.rules[{i}].units[{j}]"), why));
                }
            }
        }
        if self
            .system_command
            .first()
            .is_none_or(|p| p.trim().is_empty())
        {
            return Err(ctx.error("disruption.system_command", "must name a program"));
        }
        bounds::DISRUPTION_TIMEOUT.check(ctx, self.timeout)
    }
}

/// Whether `glob` is a unit pattern; `Err` says where it breaks and what to write.
pub fn check_glob(glob: &str) -> Result<glob::Pattern, Invalid> {
    if glob.trim().is_empty() || glob.chars().any(char::is_whitespace) {
        return Err(Invalid(format!(
            "{glob:?} is not a unit pattern: unit names have no spaces; write a unit name or a \
             glob like \"kubelet.service\" or \"cilium*.service\""
        )));
    }
    glob::Pattern::new(glob)
        .map_err(|e| {
            format!(
                "{glob:?} is not a unit pattern: {} at character {}; write a unit name or a glob \
             like \"kubelet.service\" or \"cilium*.service\"",
                e.msg,
                e.pos + 1
            )
        })
        .map_err(Invalid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_default_glob_is_a_pattern_and_matches_what_it_is_for() {
        for g in DEFAULT_DRAIN_UNITS {
            check_glob(g).unwrap();
        }
        let any = |unit: &str| {
            DEFAULT_DRAIN_UNITS
                .iter()
                .any(|g| glob::Pattern::new(g).unwrap().matches(unit))
        };
        assert!(any("cilium-agent.service") && any("network-addresses-eth0.service"));
        assert!(!any("nginx.service") && !any("systemd-journald.service"));
    }

    #[test]
    fn a_bad_glob_says_where_it_breaks() {
        let e = check_glob("kube[let").unwrap_err();
        assert!(
            e.0.starts_with("\"kube[let\" is not a unit pattern: "),
            "{e}"
        );
        assert!(e.0.contains("at character"), "{e}");
        assert!(check_glob("two words").is_err() && check_glob("").is_err());
    }
}
