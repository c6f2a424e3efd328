//! The disruption policy: which changes of a revision call for which [`Disruption`].
//!
//! Rules map unit names (globs, as systemd matches unit patterns: `*`, `?`, `[…]`) to an
//! action. For each unit the activation would stop or restart, the first rule that matches
//! decides, and no rule means `none`; across the units, the strongest action wins. A reload or
//! a start of a unit that is not running takes nothing down, so neither counts. A change of
//! the kernel, initrd or kernel modules is `reboot`, whatever the units say; a plan that could
//! not be computed takes the policy's `unknown` action.
//!
//! Pure: the plan's parts in, the action and its reasons out.

use crate::config::{DisruptionConfig, check_glob};
use crate::types::{Disruption, Plan};

use super::dry_activate::UnitChanges;

/// One rule: units matching any of `units` call for `action`.
#[derive(Clone, Debug)]
pub struct Rule {
    pub units: Vec<glob::Pattern>,
    pub action: Disruption,
}

impl Rule {
    /// A rule from its globs; `Err` names the glob that is not one and why.
    pub fn new(units: &[&str], action: Disruption) -> Result<Rule, (usize, String)> {
        let units = units
            .iter()
            .enumerate()
            .map(|(i, u)| check_glob(u).map_err(|e| (i, e.0)))
            .collect::<Result<_, _>>()?;
        Ok(Rule { units, action })
    }

    fn matches(&self, unit: &str) -> bool {
        self.units.iter().any(|p| p.matches(unit))
    }
}

/// The rules and what a plan that could not be computed calls for.
#[derive(Clone, Debug)]
pub struct Policy {
    pub rules: Vec<Rule>,
    pub unknown: Disruption,
}

impl Policy {
    /// The policy `[disruption]` configures. Its globs were checked when the configuration was
    /// loaded; one that is not a pattern would match nothing.
    pub fn new(cfg: &DisruptionConfig) -> Policy {
        let rules = cfg
            .rules
            .iter()
            .map(|r| Rule {
                units: r.units.iter().filter_map(|u| check_glob(u).ok()).collect(),
                action: r.action,
            })
            .collect();
        Policy {
            rules,
            unknown: cfg.unknown,
        }
    }
}

/// The action a plan calls for, and why: one reason per unit or part that decided it, as in
/// `restarts kubelet.service` (empty for `none`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub action: Disruption,
    pub because: Vec<String>,
}

/// What the plan calls for: `units` is `None` when dry-activate could not say (`why`), and
/// `reboot` the reasons a reboot is needed (a changed kernel, initrd or modules).
pub fn decide(policy: &Policy, units: Result<&UnitChanges, &str>, reboot: &[String]) -> Verdict {
    if !reboot.is_empty() {
        return Verdict {
            action: Disruption::Reboot,
            because: reboot.to_vec(),
        };
    }
    let changes = match units {
        Ok(c) => c,
        Err(why) => {
            return Verdict {
                action: policy.unknown,
                because: vec![format!("the plan is unknown ({why}): disruption.unknown")],
            };
        }
    };
    let mut strongest = Disruption::None;
    let mut because: Vec<(Disruption, String)> = Vec::new();
    for unit in changes.interrupted() {
        let Some(rule) = policy.rules.iter().find(|r| r.matches(unit)) else {
            continue;
        };
        if rule.action == Disruption::None {
            continue;
        }
        because.push((rule.action, format!("{} {unit}", changes.verb(unit))));
        strongest = strongest.max(rule.action);
    }
    Verdict {
        action: strongest,
        because: because
            .into_iter()
            .filter(|(a, _)| *a == strongest)
            .map(|(_, b)| b)
            .collect(),
    }
}

/// `plan` with the action `policy` calls for, and why, filled in.
pub fn judged(mut plan: Plan, policy: &Policy) -> Plan {
    let why = plan.unknown.clone().unwrap_or_default();
    let units = plan.units.as_ref().ok_or(why.as_str());
    let v = decide(policy, units, &plan.reboot);
    plan.action = v.action;
    plan.because = v.because;
    plan
}

#[cfg(test)]
mod tests {
    use super::super::dry_activate::parse;
    use super::*;

    fn policy() -> Policy {
        Policy {
            rules: vec![
                Rule::new(&["nginx.service"], Disruption::None).unwrap(),
                Rule::new(&["containerd.service", "cilium*"], Disruption::Drain).unwrap(),
                Rule::new(&["*.mount"], Disruption::Reboot).unwrap(),
            ],
            unknown: Disruption::Drain,
        }
    }

    #[test]
    fn the_strongest_action_of_the_stopped_or_restarted_units_wins() {
        let p = policy();
        let live = parse("would restart the following units: nginx.service, logrotate.timer\n");
        assert_eq!(
            decide(&p, Ok(&live), &[]),
            Verdict {
                action: Disruption::None,
                because: vec![]
            }
        );
        let drain = parse(
            "would stop the following units: cilium-agent.service, containerd.service\n\
             would start the following units: cilium-agent.service, containerd.service\n\
             would reload the following units: data.mount\n",
        );
        assert_eq!(
            decide(&p, Ok(&drain), &[]),
            Verdict {
                action: Disruption::Drain,
                because: vec![
                    "restarts cilium-agent.service".into(),
                    "restarts containerd.service".into()
                ]
            }
        );
        let stop = parse("would stop the following units: containerd.service, data.mount\n");
        assert_eq!(
            decide(&p, Ok(&stop), &[]),
            Verdict {
                action: Disruption::Reboot,
                because: vec!["stops data.mount".into()]
            }
        );
    }

    #[test]
    fn the_first_matching_rule_decides_for_a_unit() {
        let p = Policy {
            rules: vec![
                Rule::new(&["cilium-operator*"], Disruption::None).unwrap(),
                Rule::new(&["cilium*"], Disruption::Drain).unwrap(),
            ],
            unknown: Disruption::Drain,
        };
        let c = parse("would restart the following units: cilium-operator.service\n");
        assert_eq!(decide(&p, Ok(&c), &[]).action, Disruption::None);
    }

    #[test]
    fn a_kernel_change_reboots_and_an_unknown_plan_takes_the_fallback() {
        let p = policy();
        let reasons = vec!["kernel changed: a → b".to_owned()];
        let v = decide(&p, Ok(&UnitChanges::default()), &reasons);
        assert_eq!((v.action, v.because), (Disruption::Reboot, reasons.clone()));
        let v = decide(&p, Err("dry-activate timed out after 2m"), &[]);
        assert_eq!(v.action, Disruption::Drain);
        assert!(v.because[0].contains("timed out"), "{v:?}");
        // A reboot is a reboot, known plan or not.
        assert_eq!(decide(&p, Err("x"), &reasons).action, Disruption::Reboot);
    }

    #[test]
    fn a_bad_glob_is_named_with_where_it_breaks() {
        let (index, message) =
            Rule::new(&["ok.service", "kube[let"], Disruption::Drain).unwrap_err();
        assert_eq!(index, 1);
        assert!(
            message.starts_with("\"kube[let\" is not a unit pattern: "),
            "{message}"
        );
        assert!(message.contains("at character"), "{message}");
    }
}

#[cfg(test)]
mod default_tests {
    use super::super::dry_activate::parse;
    use super::*;

    #[test]
    fn the_default_policy_drains_for_the_runtime_and_the_network_and_not_for_nginx() {
        let p = Policy::new(&DisruptionConfig::default());
        let judge = |out: &str| {
            let plan = Plan {
                units: Some(parse(out)),
                ..Plan::default()
            };
            judged(plan, &p)
        };
        let nginx = judge("would restart the following units: nginx.service\n");
        assert_eq!((nginx.action, nginx.because.len()), (Disruption::None, 0));
        let c = judge(
            "would stop the following units: containerd.service\n\
             would start the following units: containerd.service\n\
             would restart the following units: firewall.service, nginx.service\n",
        );
        assert_eq!(c.action, Disruption::Drain);
        assert_eq!(
            c.because,
            vec!["restarts containerd.service", "restarts firewall.service"]
        );
        let unknown = judged(
            Plan {
                unknown: Some("dry-activate timed out".into()),
                ..Plan::default()
            },
            &p,
        );
        assert_eq!(unknown.action, Disruption::Drain);
        assert!(unknown.because[0].contains("timed out"));
    }
}
