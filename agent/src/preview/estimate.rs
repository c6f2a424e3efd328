//! How long applying a previewed revision would take on this node, from what its history
//! recorded: the median of its recent builds and activations, and the gate's settle time.
//!
//! The history records each attempt's start and end by this node's own clock, so the
//! durations compare like with like. Drains and reboots are not recorded as durations, so a
//! plan that drains or reboots gets a lower bound, and says so.

use std::time::Duration;

use crate::state::{Attempt, AttemptKind, Outcome};
use crate::types::{Disruption, Goal};

/// Recent attempts of a kind taken into the median.
const RECENT: usize = 5;

/// An estimate: seconds (`None` when nothing at all is known) and what it is made of.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Estimate {
    pub secs: Option<u64>,
    pub of: String,
}

/// The median duration of the newest [`RECENT`] successful attempts that `pick` accepts.
fn median(attempts: &[Attempt], pick: impl Fn(&Attempt) -> bool) -> Option<(Duration, usize)> {
    let mut took: Vec<Duration> = attempts
        .iter()
        .rev()
        .filter(|a| a.outcome == Outcome::Succeeded && pick(a))
        .take(RECENT)
        .filter_map(|a| {
            let secs = a.finished_at.duration_since(a.started_at).as_secs_f64();
            (secs >= 0.0).then(|| Duration::from_secs_f64(secs))
        })
        .collect();
    if took.is_empty() {
        return None;
    }
    took.sort();
    Some((took[took.len() / 2], took.len()))
}

/// The estimate for applying a revision whose plan calls for `action`: the build (recorded,
/// else `built_now`, this preview's own), the activation (recorded: a switch for a live or
/// drained one, a boot for a reboot) and the gate's `settle`.
pub fn estimate(
    attempts: &[Attempt],
    action: Disruption,
    settle: Duration,
    built_now: Option<Duration>,
) -> Estimate {
    let mut total = Duration::ZERO;
    let mut parts = Vec::new();
    match median(attempts, |a| a.kind == AttemptKind::Build) {
        Some((d, n)) => {
            total += d;
            parts.push(format!("build {} s (median of {n})", d.as_secs()));
        }
        None => {
            if let Some(d) = built_now {
                total += d;
                parts.push(format!("build {} s (this preview's)", d.as_secs()));
            }
        }
    }
    let goal = if action == Disruption::Reboot {
        Goal::Boot
    } else {
        Goal::Switch
    };
    let activation = median(attempts, |a| a.kind == AttemptKind::Apply && a.goal == goal);
    match activation {
        Some((d, n)) => {
            total += d;
            parts.push(format!("activation {} s (median of {n})", d.as_secs()));
        }
        None => parts.push("activation not recorded yet".to_owned()),
    }
    total += settle;
    parts.push(format!("gate settle {} s", settle.as_secs()));
    let unrecorded = match action {
        Disruption::None => None,
        Disruption::Drain => Some("the drain"),
        Disruption::Reboot => Some("the reboot"),
    };
    let lower = unrecorded.is_some() || activation.is_none();
    let mut of = parts.join(" + ");
    if let Some(what) = unrecorded {
        of.push_str(&format!("; {what} is not recorded as a duration"));
    }
    if lower {
        of.push_str(" (a lower bound)");
    }
    Estimate {
        secs: Some(total.as_secs()),
        of,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use jiff::Timestamp;

    fn attempt(kind: AttemptKind, goal: Goal, secs: i64, outcome: Outcome) -> Attempt {
        let started = Timestamp::from_second(1_000_000).unwrap();
        Attempt {
            id: 1,
            kind,
            source: "hephaestus".into(),
            revision: "ab".repeat(20).parse().unwrap(),
            goal,
            started_at: started,
            finished_at: started + jiff::SignedDuration::from_secs(secs),
            outcome,
            exit_code: Some(0),
            error: None,
            output: Vec::new(),
            generation_before: None,
            generation_after: None,
            isolation: "process".into(),
            closure: None,
            max_rss_kib: None,
            plan: None,
        }
    }

    #[test]
    fn the_median_of_recent_successes_plus_the_settle() {
        use AttemptKind::{Apply, Build};
        let history = vec![
            attempt(Build, Goal::Switch, 100, Outcome::Succeeded),
            attempt(Build, Goal::Switch, 30, Outcome::Succeeded),
            attempt(Build, Goal::Switch, 999, Outcome::Failed),
            attempt(Build, Goal::Switch, 40, Outcome::Succeeded),
            attempt(Apply, Goal::Switch, 8, Outcome::Succeeded),
            attempt(Apply, Goal::Boot, 50, Outcome::Succeeded),
        ];
        let e = estimate(&history, Disruption::None, Duration::from_secs(60), None);
        assert_eq!(e.secs, Some(40 + 8 + 60));
        assert_eq!(
            e.of,
            "build 40 s (median of 3) + activation 8 s (median of 1) + gate settle 60 s"
        );
        let e = estimate(&history, Disruption::Reboot, Duration::from_secs(60), None);
        assert_eq!(e.secs, Some(40 + 50 + 60));
        assert!(
            e.of.ends_with("the reboot is not recorded as a duration (a lower bound)"),
            "{}",
            e.of
        );
    }

    #[test]
    fn without_a_history_the_preview_s_own_build_and_a_lower_bound() {
        let e = estimate(
            &[],
            Disruption::Drain,
            Duration::from_secs(10),
            Some(Duration::from_secs(3)),
        );
        assert_eq!(e.secs, Some(13));
        assert_eq!(
            e.of,
            "build 3 s (this preview's) + activation not recorded yet + gate settle 10 s; \
             the drain is not recorded as a duration (a lower bound)"
        );
    }
}
