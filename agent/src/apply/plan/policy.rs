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

use crate::types::Disruption;

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
            .map(|(i, u)| glob::Pattern::new(u).map_err(|e| (i, pattern_error(u, &e))))
            .collect::<Result<_, _>>()?;
        Ok(Rule { units, action })
    }

    fn matches(&self, unit: &str) -> bool {
        self.units.iter().any(|p| p.matches(unit))
    }
}

fn pattern_error(glob: &str, e: &glob::PatternError) -> String {
    format!(
        "{glob:?} is not a unit pattern: {} at character {}; write a unit name or a glob like \
         \"kubelet.service\" or \"cilium*.service\"",
        e.msg,
        e.pos + 1
    )
}

/// The rules and what a plan that could not be computed calls for.
#[derive(Clone, Debug)]
pub struct Policy {
    pub rules: Vec<Rule>,
    pub unknown: Disruption,
}

/// The action a plan calls for, and why, one reason per unit or part that decided it (empty
/// for `none`).
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
    let restarted = changes.restarted();
    let mut strongest = Disruption::None;
    let mut because: Vec<(Disruption, String)> = Vec::new();
    for unit in changes.interrupted() {
        let Some((i, rule)) = policy
            .rules
            .iter()
            .enumerate()
            .find(|(_, r)| r.matches(unit))
        else {
            continue;
        };
        if rule.action == Disruption::None {
            continue;
        }
        let verb = if restarted.contains(unit) {
            "restarts"
        } else {
            "stops"
        };
        because.push((rule.action, format!("{verb} {unit} (rule {})", i + 1)));
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
                    "restarts cilium-agent.service (rule 2)".into(),
                    "restarts containerd.service (rule 2)".into()
                ]
            }
        );
        let stop = parse("would stop the following units: containerd.service, data.mount\n");
        assert_eq!(
            decide(&p, Ok(&stop), &[]),
            Verdict {
                action: Disruption::Reboot,
                because: vec!["stops data.mount (rule 3)".into()]
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
