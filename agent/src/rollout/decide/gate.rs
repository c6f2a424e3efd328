//! The health gate's verdict, as a pure function: the checks' results since the activation
//! in, pending / passed / failed out. No I/O, no clock: the caller passes `now`.
//!
//! The gate's times (when it opened, since when it has been healthy, its deadline, when each
//! check last ran) are on the monotonic clock ([`Times`]): a step of the wall clock never
//! shortens the settle, never makes a result fresh or stale, and never decides the gate. The
//! wall-clock times in [`Verifying`] are what status shows.
//!
//! "Healthy" means no regression by default: a check that was ok or degraded before the
//! activation must not be failed now, and a check that was failed (or unknown) already does
//! not hold the gate, so that a fix for a partly broken node is not rolled back for what it did not fix.
//! `require = "all-ok"` wants every check ok. Checks named in `required` (the control plane's
//! own: API server, kube-vip, node Ready) must not be failed whatever they were before.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use jiff::Timestamp;

use crate::config::GateRequire;
use crate::state::Verifying;
use crate::status::HealthStatus;

/// The name a check for an alert of the alert gate begins with. The gate gives such a check a
/// rule of its own: it is a regression whenever it was not firing before the activation.
pub const ALERT_CHECK_PREFIX: &str = "alert:";

/// One check's result as the gate sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Check {
    pub status: HealthStatus,
    pub message: String,
    /// When it was last run (status).
    pub checked_at: Option<Timestamp>,
    /// When it was last run, on the monotonic clock; a result from before the gate opened is
    /// not evidence.
    pub checked: Option<Instant>,
}

/// The gate's own times, on the monotonic clock. Not persisted: after a restart they are set
/// again from the persisted wall-clock times once ([`Times::resumed`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Times {
    pub opened: Instant,
    pub healthy_since: Option<Instant>,
    pub deadline: Instant,
}

impl Times {
    /// A gate opening now, failing `timeout` from now.
    pub fn open(now: Instant, timeout: Duration) -> Self {
        Self {
            opened: now,
            healthy_since: None,
            deadline: now.checked_add(timeout).unwrap_or(now),
        }
    }

    /// A gate that opened `elapsed` ago by the persisted times (after a restart), and fails at
    /// `left` from now. The settle starts again: healthy-since is not carried over.
    pub fn resumed(now: Instant, elapsed: Duration, left: Duration) -> Self {
        Self {
            opened: now.checked_sub(elapsed).unwrap_or(now),
            healthy_since: None,
            deadline: now.checked_add(left).unwrap_or(now),
        }
    }
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
    opened: Instant,
    checks: &BTreeMap<String, Check>,
    rules: &Rules<'_>,
) -> (BTreeMap<String, String>, Vec<String>) {
    let mut failing = BTreeMap::new();
    let mut unchecked = Vec::new();
    for (name, c) in checks {
        if c.checked.is_none_or(|t| t < opened) {
            unchecked.push(name.clone());
            continue;
        }
        let blocks = match rules.require {
            GateRequire::AllOk => c.status != HealthStatus::Ok,
            // A regression: failed now, ok or degraded before. A check that was failed,
            // unknown or not there yet before the activation tells nothing about it.
            // An alert (the alert gate) is a regression when it was not firing before.
            GateRequire::NoRegression => {
                c.status == HealthStatus::Failed
                    && (rules.required.contains(&name.as_str())
                        || matches!(
                            v.baseline.get(name),
                            Some(HealthStatus::Ok | HealthStatus::Degraded)
                        )
                        || (name.starts_with(ALERT_CHECK_PREFIX)
                            && v.baseline.get(name) != Some(&HealthStatus::Failed)))
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

/// One step of the gate at `now` (monotonic; `wall` is recorded for status): updates
/// `t.healthy_since` (and `v.healthy_since`) and gives the verdict. The gate passes once every
/// check has a fresh result and nothing blocks for `settle` without a break; it fails at
/// `t.deadline` if it has not passed, naming what blocked it last (or the checks that never
/// answered).
pub fn step(
    v: &mut Verifying,
    t: &mut Times,
    checks: &BTreeMap<String, Check>,
    rules: &Rules<'_>,
    now: Instant,
    wall: Timestamp,
) -> Verdict {
    let (failing, unchecked) = blocking(v, t.opened, checks, rules);
    if failing.is_empty() && unchecked.is_empty() {
        if t.healthy_since.is_none() {
            t.healthy_since = Some(now);
            v.healthy_since = Some(wall);
        }
        let since = t.healthy_since.unwrap_or(now);
        if now.saturating_duration_since(since) >= rules.settle {
            return Verdict::Passed;
        }
    } else {
        t.healthy_since = None;
        v.healthy_since = None;
    }
    if now >= t.deadline {
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

    /// Second `s` of the test on the monotonic clock.
    fn tm(s: i64) -> Instant {
        use std::sync::OnceLock;
        static BASE: OnceLock<Instant> = OnceLock::new();
        let base = *BASE.get_or_init(|| Instant::now() + Duration::from_secs(1000));
        if s >= 0 {
            base + Duration::from_secs(s.unsigned_abs())
        } else {
            base - Duration::from_secs(s.unsigned_abs())
        }
    }

    /// A gate and its times, opened at second 0 with its deadline at 100.
    struct G {
        v: Verifying,
        t: Times,
    }

    fn step(g: &mut G, c: &BTreeMap<String, Check>, rules: &Rules<'_>, s: i64) -> Verdict {
        super::step(&mut g.v, &mut g.t, c, rules, tm(s), t(s))
    }

    fn gate(baseline: &[(&str, HealthStatus)]) -> G {
        G {
            t: Times {
                opened: tm(0),
                healthy_since: None,
                deadline: tm(100),
            },
            v: gate_record(baseline),
        }
    }

    fn gate_record(baseline: &[(&str, HealthStatus)]) -> Verifying {
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
                        checked: Some(tm(*at)),
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
            step(&mut v, &c, &RULES, 1),
            Verdict::Pending { .. }
        ));
        assert_eq!(v.t.healthy_since, Some(tm(1)));
        assert_eq!(v.v.healthy_since, Some(t(1)));
        assert!(matches!(
            step(&mut v, &c, &RULES, 5),
            Verdict::Pending { .. }
        ));
        assert_eq!(step(&mut v, &c, &RULES, 11), Verdict::Passed);
    }

    #[test]
    fn a_break_starts_the_settle_time_again() {
        let mut v = gate(&[("kubelet", Ok)]);
        step(&mut v, &checks(&[("kubelet", Ok, 1)]), &RULES, 1);
        let bad = checks(&[("kubelet", Failed, 6)]);
        let Verdict::Pending { failing, .. } = step(&mut v, &bad, &RULES, 6) else {
            panic!("pending expected");
        };
        assert_eq!(failing["kubelet"], "failed: kubelet says so");
        assert_eq!(v.t.healthy_since, None);
        let good = checks(&[("kubelet", Ok, 8)]);
        assert!(matches!(
            step(&mut v, &good, &RULES, 12),
            Verdict::Pending { .. }
        ));
        assert_eq!(step(&mut v, &good, &RULES, 22), Verdict::Passed);
    }

    #[test]
    fn a_result_from_before_the_activation_is_not_evidence() {
        let mut v = gate(&[("kubelet", Ok)]);
        v.t.opened = tm(5);
        let stale = checks(&[("kubelet", Ok, 4)]);
        let Verdict::Pending { unchecked, .. } = step(&mut v, &stale, &RULES, 30) else {
            panic!("pending expected");
        };
        assert_eq!(unchecked, ["kubelet"]);
        assert_eq!(v.t.healthy_since, None);
    }

    #[test]
    fn a_regression_fails_at_the_deadline_naming_it() {
        let mut v = gate(&[("kubelet", Degraded)]);
        let bad = checks(&[("kubelet", Failed, 50)]);
        assert!(matches!(
            step(&mut v, &bad, &RULES, 50),
            Verdict::Pending { .. }
        ));
        let Verdict::Failed { failing } = step(&mut v, &bad, &RULES, 100) else {
            panic!("failed expected");
        };
        assert!(failing.contains_key("kubelet"));
    }

    #[test]
    fn a_check_failed_before_does_not_hold_the_gate() {
        let mut v = gate(&[("cilium", Failed), ("kubelet", Ok)]);
        let c = checks(&[("cilium", Failed, 1), ("kubelet", Ok, 1)]);
        step(&mut v, &c, &RULES, 1);
        assert_eq!(step(&mut v, &c, &RULES, 11), Verdict::Passed);
    }

    #[test]
    fn a_required_check_holds_the_gate_even_if_it_failed_before() {
        let mut v = gate(&[("apiserver", Failed)]);
        let c = checks(&[("apiserver", Failed, 1)]);
        let Verdict::Pending { failing, .. } = step(&mut v, &c, &RULES, 20) else {
            panic!("pending expected");
        };
        assert!(failing.contains_key("apiserver"));
    }

    #[test]
    fn unknown_and_degraded_are_no_regression_but_not_all_ok() {
        let c = checks(&[("a", Unknown, 1), ("b", Degraded, 1)]);
        let mut v = gate(&[("a", Ok), ("b", Ok)]);
        step(&mut v, &c, &RULES, 1);
        assert_eq!(step(&mut v, &c, &RULES, 11), Verdict::Passed);
        let strict = Rules {
            require: GateRequire::AllOk,
            ..RULES
        };
        let mut v = gate(&[("a", Ok), ("b", Ok)]);
        let Verdict::Pending { failing, .. } = step(&mut v, &c, &strict, 11) else {
            panic!("pending expected");
        };
        assert_eq!(failing.len(), 2);
    }

    #[test]
    fn a_check_unknown_before_does_not_hold_the_gate() {
        let mut v = gate(&[("kubelet", Unknown)]);
        let c = checks(&[("kubelet", Failed, 1), ("new", Failed, 1)]);
        step(&mut v, &c, &RULES, 1);
        assert_eq!(step(&mut v, &c, &RULES, 11), Verdict::Passed);
    }

    #[test]
    fn never_answering_fails_at_the_deadline() {
        let mut v = gate(&[("kubelet", Ok)]);
        let c = checks(&[("kubelet", Ok, -5)]);
        let Verdict::Failed { failing } = step(&mut v, &c, &RULES, 100) else {
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
            step(&mut v, &checks(&[("kubelet", Ok, 1)]), &rules, 1),
            Verdict::Passed
        );
    }

    #[test]
    fn an_alert_that_appears_after_the_activation_fails_the_gate_one_firing_before_does_not() {
        let new = "alert:TestBroken{cause=\"activation\"}";
        let old = "alert:TestBroken{cause=\"before\"}";
        // The baseline saw the old alert firing, and Prometheus answering.
        let mut g = gate(&[("prometheus", Ok), (old, Failed)]);
        let c = checks(&[("prometheus", Ok, 1), (old, Failed, 1)]);
        let (failing, _) = blocking(&g.v, g.t.opened, &c, &RULES);
        assert!(failing.is_empty(), "{failing:?}");
        let c = checks(&[("prometheus", Ok, 2), (old, Failed, 2), (new, Failed, 2)]);
        let (failing, _) = blocking(&g.v, g.t.opened, &c, &RULES);
        assert_eq!(failing.keys().collect::<Vec<_>>(), [new]);
        // Held to the deadline, it fails the gate naming the alert.
        assert!(
            matches!(step(&mut g, &c, &RULES, 100), Verdict::Failed { failing } if failing.contains_key(new))
        );
        // Prometheus going silent after the activation is a regression (on_unavailable = wait).
        let c = checks(&[("prometheus", Failed, 3)]);
        let (failing, _) = blocking(&g.v, g.t.opened, &c, &RULES);
        assert!(failing.contains_key("prometheus"));
        // All-ok: every alert blocks, the old one too.
        let all_ok = Rules {
            require: GateRequire::AllOk,
            ..RULES
        };
        let c = checks(&[("prometheus", Ok, 2), (old, Failed, 2)]);
        let (failing, _) = blocking(&g.v, g.t.opened, &c, &all_ok);
        assert_eq!(failing.keys().collect::<Vec<_>>(), [old]);
    }
}

#[cfg(test)]
mod clock_tests {
    use super::*;
    use crate::types::Revision;

    /// A wall-clock step of +15 min two seconds into a gate neither passes it (the settle takes
    /// its full time) nor fails it (the deadline is the gate's own), and results keep counting
    /// as fresh whatever their wall-clock stamp says.
    #[test]
    fn a_wall_clock_step_neither_shortens_the_settle_nor_decides_the_gate() {
        let base = Instant::now();
        let at = |s: u64| base + Duration::from_secs(s);
        let wall0 = Timestamp::from_second(1_800_000_000).unwrap();
        let step15 = jiff::SignedDuration::from_secs(15 * 60);
        let mut v = Verifying {
            revision: "a".repeat(40).parse::<Revision>().unwrap(),
            rollback: false,
            started_at: wall0,
            deadline: wall0 + jiff::SignedDuration::from_secs(100),
            healthy_since: None,
            baseline: [("kubelet".to_owned(), HealthStatus::Ok)].into(),
            after_reboot: false,
        };
        let mut times = Times::open(base, Duration::from_secs(100));
        let rules = Rules {
            require: GateRequire::NoRegression,
            settle: Duration::from_secs(60),
            required: &[],
        };
        let check = |s: u64, status: HealthStatus, wall: Timestamp| {
            BTreeMap::from([(
                "kubelet".to_owned(),
                Check {
                    status,
                    message: String::new(),
                    checked_at: Some(wall),
                    checked: Some(at(s)),
                },
            )])
        };
        let ok = |s| check(s, HealthStatus::Ok, wall0 + step15);
        assert!(matches!(
            step(&mut v, &mut times, &ok(1), &rules, at(1), wall0),
            Verdict::Pending { .. }
        ));
        // The clock jumps 15 minutes ahead at second 2: past settle and deadline by the wall.
        for s in [2, 10, 60] {
            assert!(
                matches!(
                    step(&mut v, &mut times, &ok(s), &rules, at(s), wall0 + step15),
                    Verdict::Pending { .. }
                ),
                "decided at second {s}"
            );
        }
        assert_eq!(
            step(&mut v, &mut times, &ok(61), &rules, at(61), wall0 + step15),
            Verdict::Passed
        );
        // A check failing right after the step: pending, not failed at once.
        let mut times = Times::open(base, Duration::from_secs(100));
        let bad = check(3, HealthStatus::Failed, wall0 - step15);
        assert!(matches!(
            step(&mut v, &mut times, &bad, &rules, at(3), wall0 - step15),
            Verdict::Pending { failing, .. } if failing.contains_key("kubelet")
        ));
        assert!(matches!(
            step(&mut v, &mut times, &bad, &rules, at(100), wall0 - step15),
            Verdict::Failed { .. }
        ));
    }
}
