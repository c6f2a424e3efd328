//! The health gate's verdict, as a pure function: the checks' results since the activation
//! in, pending / passed / failed out. No I/O, no clock: the caller passes `now`.
//!
//! "Healthy" means no regression by default: a check that was ok or degraded before the
//! activation must not be failed now, and a check that was failed (or unknown) already does
//! not hold the gate, so that a fix for a partly broken node is not rolled back for what it did not fix.
//! `require = "all-ok"` wants every check ok. Checks named in `required` (the control plane's
//! own: API server, kube-vip, node Ready) must not be failed whatever they were before.

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;

use crate::config::GateRequire;
use crate::state::Verifying;
use crate::status::HealthStatus;

/// One check's result as the gate sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Check {
    pub status: HealthStatus,
    pub message: String,
    /// When it was last run; a result from before the activation is not evidence.
    pub checked_at: Option<Timestamp>,
}

/// What the gate needs besides the checks.
#[derive(Clone, Copy, Debug)]
pub struct Rules<'a> {
    pub require: GateRequire,
    pub settle: Duration,
    /// Checks that must not be failed even if they were before.
    pub required: &'a [&'a str],
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Not settled yet; `failing` holds the checks that block it now (empty while settling,
    /// or while waiting for a fresh result of every check).
    Pending {
        failing: BTreeMap<String, String>,
        /// Checks with no result since the activation yet.
        unchecked: Vec<String>,
    },
    Passed,
    Failed {
        failing: BTreeMap<String, String>,
    },
}

/// The checks that block the gate now, and those with no fresh result.
pub fn blocking(
    v: &Verifying,
    checks: &BTreeMap<String, Check>,
    rules: &Rules<'_>,
) -> (BTreeMap<String, String>, Vec<String>) {
    let mut failing = BTreeMap::new();
    let mut unchecked = Vec::new();
    for (name, c) in checks {
        if c.checked_at.is_none_or(|t| t < v.started_at) {
            unchecked.push(name.clone());
            continue;
        }
        let blocks = match rules.require {
            GateRequire::AllOk => c.status != HealthStatus::Ok,
            // A regression: failed now, ok or degraded before. A check that was failed,
            // unknown or not there yet before the activation tells nothing about it.
            GateRequire::NoRegression => {
                c.status == HealthStatus::Failed
                    && (rules.required.contains(&name.as_str())
                        || matches!(
                            v.baseline.get(name),
                            Some(HealthStatus::Ok | HealthStatus::Degraded)
                        ))
            }
        };
        if blocks {
            let message = if c.message.is_empty() {
                c.status.as_str().to_owned()
            } else {
                format!("{}: {}", c.status.as_str(), c.message)
            };
            failing.insert(name.clone(), message);
        }
    }
    (failing, unchecked)
}

/// One step of the gate at `now`: updates `v.healthy_since` and gives the verdict. The gate
/// passes once every check has a fresh result and nothing blocks for `settle` without a
/// break; it fails at `v.deadline` if it has not passed, naming what blocked it last (or the
/// checks that never answered).
pub fn step(
    v: &mut Verifying,
    checks: &BTreeMap<String, Check>,
    rules: &Rules<'_>,
    now: Timestamp,
) -> Verdict {
    let (failing, unchecked) = blocking(v, checks, rules);
    if failing.is_empty() && unchecked.is_empty() {
        let since = *v.healthy_since.get_or_insert(now);
        let settled = now.duration_since(since).unsigned_abs() >= rules.settle;
        if settled {
            return Verdict::Passed;
        }
    } else {
        v.healthy_since = None;
    }
    if now >= v.deadline {
        let mut failing = failing;
        for name in &unchecked {
            failing.insert(name.clone(), "no result since the activation".to_owned());
        }
        if failing.is_empty() {
            // Healthy, but not for long enough before the deadline.
            failing.insert(
                "settle".to_owned(),
                format!(
                    "healthy only since {}, not for the settle time before the deadline",
                    v.healthy_since
                        .map_or_else(|| "-".to_owned(), |t| t.to_string())
                ),
            );
        }
        return Verdict::Failed { failing };
    }
    Verdict::Pending { failing, unchecked }
}

/// The baseline a gate compares with: each check's status before the activation.
pub fn baseline(checks: &BTreeMap<String, Check>) -> BTreeMap<String, HealthStatus> {
    checks.iter().map(|(n, c)| (n.clone(), c.status)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Revision;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    fn gate(baseline: &[(&str, HealthStatus)]) -> Verifying {
        Verifying {
            revision: "a".repeat(40).parse::<Revision>().unwrap(),
            rollback: false,
            started_at: t(0),
            deadline: t(100),
            healthy_since: None,
            baseline: baseline
                .iter()
                .map(|(n, s)| ((*n).to_owned(), *s))
                .collect(),
            after_reboot: false,
        }
    }

    fn checks(list: &[(&str, HealthStatus, i64)]) -> BTreeMap<String, Check> {
        list.iter()
            .map(|(n, s, at)| {
                (
                    (*n).to_owned(),
                    Check {
                        status: *s,
                        message: format!("{n} says so"),
                        checked_at: Some(t(*at)),
                    },
                )
            })
            .collect()
    }

    const RULES: Rules<'static> = Rules {
        require: GateRequire::NoRegression,
        settle: Duration::from_secs(10),
        required: &["apiserver"],
    };

    use HealthStatus::{Degraded, Failed, Ok, Unknown};

    #[test]
    fn passes_after_settle_without_a_break() {
        let mut v = gate(&[("kubelet", Ok)]);
        let c = checks(&[("kubelet", Ok, 1)]);
        assert!(matches!(
            step(&mut v, &c, &RULES, t(1)),
            Verdict::Pending { .. }
        ));
        assert_eq!(v.healthy_since, Some(t(1)));
        assert!(matches!(
            step(&mut v, &c, &RULES, t(5)),
            Verdict::Pending { .. }
        ));
        assert_eq!(step(&mut v, &c, &RULES, t(11)), Verdict::Passed);
    }

    #[test]
    fn a_break_starts_the_settle_time_again() {
        let mut v = gate(&[("kubelet", Ok)]);
        step(&mut v, &checks(&[("kubelet", Ok, 1)]), &RULES, t(1));
        let bad = checks(&[("kubelet", Failed, 6)]);
        let Verdict::Pending { failing, .. } = step(&mut v, &bad, &RULES, t(6)) else {
            panic!("pending expected");
        };
        assert_eq!(failing["kubelet"], "failed: kubelet says so");
        assert_eq!(v.healthy_since, None);
        let good = checks(&[("kubelet", Ok, 8)]);
        assert!(matches!(
            step(&mut v, &good, &RULES, t(12)),
            Verdict::Pending { .. }
        ));
        assert_eq!(step(&mut v, &good, &RULES, t(22)), Verdict::Passed);
    }

    #[test]
    fn a_result_from_before_the_activation_is_not_evidence() {
        let mut v = gate(&[("kubelet", Ok)]);
        v.started_at = t(5);
        let stale = checks(&[("kubelet", Ok, 4)]);
        let Verdict::Pending { unchecked, .. } = step(&mut v, &stale, &RULES, t(30)) else {
            panic!("pending expected");
        };
        assert_eq!(unchecked, ["kubelet"]);
        assert_eq!(v.healthy_since, None);
    }

    #[test]
    fn a_regression_fails_at_the_deadline_naming_it() {
        let mut v = gate(&[("kubelet", Degraded)]);
        let bad = checks(&[("kubelet", Failed, 50)]);
        assert!(matches!(
            step(&mut v, &bad, &RULES, t(50)),
            Verdict::Pending { .. }
        ));
        let Verdict::Failed { failing } = step(&mut v, &bad, &RULES, t(100)) else {
            panic!("failed expected");
        };
        assert!(failing.contains_key("kubelet"));
    }

    #[test]
    fn a_check_failed_before_does_not_hold_the_gate() {
        let mut v = gate(&[("cilium", Failed), ("kubelet", Ok)]);
        let c = checks(&[("cilium", Failed, 1), ("kubelet", Ok, 1)]);
        step(&mut v, &c, &RULES, t(1));
        assert_eq!(step(&mut v, &c, &RULES, t(11)), Verdict::Passed);
    }

    #[test]
    fn a_required_check_holds_the_gate_even_if_it_failed_before() {
        let mut v = gate(&[("apiserver", Failed)]);
        let c = checks(&[("apiserver", Failed, 1)]);
        let Verdict::Pending { failing, .. } = step(&mut v, &c, &RULES, t(20)) else {
            panic!("pending expected");
        };
        assert!(failing.contains_key("apiserver"));
    }

    #[test]
    fn unknown_and_degraded_are_no_regression_but_not_all_ok() {
        let c = checks(&[("a", Unknown, 1), ("b", Degraded, 1)]);
        let mut v = gate(&[("a", Ok), ("b", Ok)]);
        step(&mut v, &c, &RULES, t(1));
        assert_eq!(step(&mut v, &c, &RULES, t(11)), Verdict::Passed);
        let strict = Rules {
            require: GateRequire::AllOk,
            ..RULES
        };
        let mut v = gate(&[("a", Ok), ("b", Ok)]);
        let Verdict::Pending { failing, .. } = step(&mut v, &c, &strict, t(11)) else {
            panic!("pending expected");
        };
        assert_eq!(failing.len(), 2);
    }

    #[test]
    fn a_check_unknown_before_does_not_hold_the_gate() {
        let mut v = gate(&[("kubelet", Unknown)]);
        let c = checks(&[("kubelet", Failed, 1), ("new", Failed, 1)]);
        step(&mut v, &c, &RULES, t(1));
        assert_eq!(step(&mut v, &c, &RULES, t(11)), Verdict::Passed);
    }

    #[test]
    fn never_answering_fails_at_the_deadline() {
        let mut v = gate(&[("kubelet", Ok)]);
        let c = checks(&[("kubelet", Ok, -5)]);
        let Verdict::Failed { failing } = step(&mut v, &c, &RULES, t(100)) else {
            panic!("failed expected");
        };
        assert_eq!(failing["kubelet"], "no result since the activation");
    }

    #[test]
    fn zero_settle_passes_at_the_first_healthy_look() {
        let mut v = gate(&[("kubelet", Ok)]);
        let rules = Rules {
            settle: Duration::ZERO,
            ..RULES
        };
        assert_eq!(
            step(&mut v, &checks(&[("kubelet", Ok, 1)]), &rules, t(1)),
            Verdict::Passed
        );
    }
}
