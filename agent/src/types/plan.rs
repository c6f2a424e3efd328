//! The plan of a revision on a node: what activating its built system would do, computed
//! without activating it (see `apply::plan`). Stored with the built revision in `state.json`
//! and with the build attempt in `history.json`, so its fields are only ever added.

use std::collections::BTreeSet;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::Disruption;

/// The units an activation would touch, by what would happen to them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnitChanges {
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub stop: BTreeSet<String>,
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub restart: BTreeSet<String>,
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub reload: BTreeSet<String>,
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub start: BTreeSet<String>,
    /// Changed, but marked not to be stopped (`X-RestartIfChanged=false` and the like).
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub skip: BTreeSet<String>,
    /// Swap devices that would be turned off.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub swap_off: BTreeSet<String>,
    /// systemd itself would be re-executed (a new systemd, or a new `system.conf`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub restart_systemd: bool,
}

impl UnitChanges {
    /// The units that would go down for a while: stopped (and maybe started again) or
    /// restarted. A reload keeps a unit's processes; a start of a unit that is not running
    /// takes nothing down.
    pub fn interrupted(&self) -> BTreeSet<&str> {
        self.stop
            .iter()
            .chain(&self.restart)
            .map(String::as_str)
            .collect()
    }

    /// A restart is said as a restart: a unit stopped and started again is one.
    pub fn restarted(&self) -> BTreeSet<&str> {
        self.restart
            .iter()
            .chain(self.stop.intersection(&self.start))
            .map(String::as_str)
            .collect()
    }

    /// What happens to `unit`, as a verb: `restarts` or `stops`.
    pub fn verb(&self, unit: &str) -> &'static str {
        if self.restarted().contains(unit) {
            "restarts"
        } else {
            "stops"
        }
    }
}

/// One package whose versions or size change.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PackageChange {
    pub name: String,
    /// The versions that go; empty when the package is new.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub from: Vec<String>,
    /// The versions that come; empty when the package goes away.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub to: Vec<String>,
    /// How many bytes its paths grow (negative: shrink); absent when Nix did not say (under
    /// 8 KiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<i64>,
}

/// The plan of one revision on this node.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Plan {
    /// The built system the plan is of.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub system: Option<PathBuf>,
    /// What `switch-to-configuration dry-activate` said the activation would do; absent when
    /// it could not say, and then `unknown` says why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub units: Option<UnitChanges>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unknown: Option<String>,
    /// The packages whose versions or sizes change (`nix store diff-closures`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub packages: Vec<PackageChange>,
    /// How many bytes the closure grows by (negative: shrinks); absent when Nix could not
    /// say, and then `packages_unknown` says why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub added_bytes: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub packages_unknown: Option<String>,
    /// Why booting the built system needs a reboot (kernel, initrd, modules changed).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub reboot: Vec<String>,
    /// What the disruption policy calls for, and what decided it.
    pub action: Disruption,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub because: Vec<String>,
    /// How long computing the plan took, the build excluded, in milliseconds.
    pub took_ms: u64,
}

impl Plan {
    /// One line: the action, what calls for it, and the closure's growth, as in
    /// `drain: restarts containerd.service, kubelet.service; +42.0 MiB`.
    pub fn summary(&self) -> String {
        let said = if !self.because.is_empty() {
            Some(merge_verbs(&self.because))
        } else {
            self.units.as_ref().map(|u| {
                let said: Vec<String> = u
                    .interrupted()
                    .into_iter()
                    .map(|n| format!("{} {n}", u.verb(n)))
                    .collect();
                if said.is_empty() {
                    "no unit stopped or restarted".to_owned()
                } else {
                    merge_verbs(&said)
                }
            })
        };
        summary_line(self.action, said, self.added_bytes)
    }
}

/// A plan in a line: `action: what calls for it; growth`, each part when known.
pub(super) fn summary_line(action: Disruption, said: Option<String>, added: Option<i64>) -> String {
    let parts: Vec<String> = said.into_iter().chain(added.map(signed_size)).collect();
    if parts.is_empty() {
        action.label().to_owned()
    } else {
        format!("{}: {}", action.label(), parts.join("; "))
    }
}

/// `["restarts a", "restarts b", "stops c"]` → `restarts a, b; stops c`; a reason that is not
/// a verb and a unit stays as it is.
fn merge_verbs(items: &[String]) -> String {
    let mut groups: Vec<(String, Vec<String>)> = Vec::new();
    for item in items {
        let (verb, rest) = match item.split_once(' ') {
            Some((v, r)) if (v == "restarts" || v == "stops") && !r.contains(' ') => {
                (v.to_owned(), r.to_owned())
            }
            _ => (String::new(), item.clone()),
        };
        match groups.last_mut() {
            Some((v, names)) if *v == verb && !verb.is_empty() => names.push(rest),
            _ => groups.push((verb, vec![rest])),
        }
    }
    groups
        .into_iter()
        .map(|(v, names)| {
            if v.is_empty() {
                names.join("; ")
            } else {
                format!("{v} {}", names.join(", "))
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// A size change with its sign, in the largest binary unit under 1,024 of it.
pub fn signed_size(bytes: i64) -> String {
    let sign = if bytes < 0 { "-" } else { "+" };
    let mut n = bytes.unsigned_abs() as f64;
    for unit in ["B", "KiB", "MiB", "GiB"] {
        if n < 1024.0 {
            return if unit == "B" {
                format!("{sign}{n:.0} B")
            } else {
                format!("{sign}{n:.1} {unit}")
            };
        }
        n /= 1024.0;
    }
    format!("{sign}{n:.1} TiB")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn units(stop: &[&str], restart: &[&str], start: &[&str]) -> UnitChanges {
        let set = |n: &[&str]| n.iter().map(|s| s.to_string()).collect();
        UnitChanges {
            stop: set(stop),
            restart: set(restart),
            start: set(start),
            ..UnitChanges::default()
        }
    }

    #[test]
    fn the_summary_says_the_action_what_calls_for_it_and_the_growth() {
        let drain = Plan {
            units: Some(units(&["containerd.service", "kubelet.service"], &[], &[])),
            added_bytes: Some(42 * 1024 * 1024),
            action: Disruption::Drain,
            because: vec![
                "restarts containerd.service".into(),
                "restarts kubelet.service".into(),
            ],
            ..Plan::default()
        };
        assert_eq!(
            drain.summary(),
            "drain: restarts containerd.service, kubelet.service; +42.0 MiB"
        );
        let live = Plan {
            units: Some(units(&["a.service"], &["nginx.service"], &["a.service"])),
            added_bytes: Some(-2048),
            ..Plan::default()
        };
        assert_eq!(
            live.summary(),
            "live: restarts a.service, nginx.service; -2.0 KiB"
        );
        let quiet = Plan {
            units: Some(UnitChanges::default()),
            ..Plan::default()
        };
        assert_eq!(quiet.summary(), "live: no unit stopped or restarted");
        let reboot = Plan {
            action: Disruption::Reboot,
            because: vec!["kernel changed: a → b".into()],
            added_bytes: Some(10),
            ..Plan::default()
        };
        assert_eq!(reboot.summary(), "reboot: kernel changed: a → b; +10 B");
    }

    #[test]
    fn a_plan_reads_back_as_written_and_an_older_one_still_loads() {
        let p = Plan {
            system: Some("/nix/store/x-nixos-system-a".into()),
            units: Some(units(&["kubelet.service"], &[], &[])),
            action: Disruption::Drain,
            because: vec!["stops kubelet.service".into()],
            took_ms: 812,
            ..Plan::default()
        };
        let text = serde_json::to_string(&p).unwrap();
        assert_eq!(serde_json::from_str::<Plan>(&text).unwrap(), p);
        let old: Plan = serde_json::from_str(r#"{"action":"none"}"#).unwrap();
        assert_eq!(old, Plan::default());
    }
}
