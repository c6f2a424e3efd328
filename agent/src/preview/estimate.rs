//! How long applying a previewed revision would take on this node, from what it recorded: the
//! median of its recent builds and activations (the history) and of its recent drains, health
//! gates and reboots (the state's `took`).
//!
//! Each is measured between two of this node's own timestamps, so they compare like with like.
//! What this node has not done yet (no drain, no reboot, no gate passed) is stood in for by
//! what is known to be less (nothing; the gate's settle time), and the estimate says it is a
//! lower bound.

use std::time::Duration;

use crate::state::{Attempt, AttemptKind, Durations, Measured, Outcome};
use crate::types::{Disruption, Goal};

/// Recent attempts of a kind taken into the median.
const RECENT: usize = 5;

/// An estimate: seconds (`None` when nothing at all is known) and what it is made of.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Estimate {
    pub secs: Option<u64>,
    pub of: String,
    /// A part was never recorded: the sum is a lower bound.
    pub lower: bool,
}

/// The middle one of `samples` (the upper of the two middle ones), `None` for none.
fn middle(mut samples: Vec<Duration>) -> Option<(Duration, usize)> {
    if samples.is_empty() {
        return None;
    }
    samples.sort();
    Some((samples[samples.len() / 2], samples.len()))
}

/// The median duration of the newest [`RECENT`] successful attempts that `pick` accepts.
fn median(attempts: &[Attempt], pick: impl Fn(&Attempt) -> bool) -> Option<(Duration, usize)> {
    let took: Vec<Duration> = attempts
        .iter()
        .rev()
        .filter(|a| a.outcome == Outcome::Succeeded && pick(a))
        .take(RECENT)
        .filter_map(|a| {
            let secs = a.finished_at.duration_since(a.started_at).as_secs_f64();
            (secs >= 0.0).then(|| Duration::from_secs_f64(secs))
        })
        .collect();
    middle(took)
}

/// The median of the recorded samples of `what`.
fn median_of(took: &Durations, what: Measured) -> Option<(Duration, usize)> {
    middle(
        took.of(what)
            .iter()
            .rev()
            .take(RECENT)
            .map(|s| Duration::from_secs(*s))
            .collect(),
    )
}

/// What goes into an estimate: the sum so far, its parts in words, and whether a part is
/// missing (a lower bound).
#[derive(Default)]
struct Sum {
    total: Duration,
    parts: Vec<String>,
    lower: bool,
}

impl Sum {
    /// Adds `what`'s median, or says it is not recorded yet (the sum becomes a lower bound,
    /// `instead` standing in).
    fn add(&mut self, what: &str, known: Option<(Duration, usize)>, instead: Option<Duration>) {
        match (known, instead) {
            (Some((d, n)), _) => {
                self.total += d;
                self.parts
                    .push(format!("{what} {} s (median of {n})", d.as_secs()));
            }
            (None, Some(d)) => {
                self.total += d;
                self.lower = true;
                self.parts.push(format!(
                    "{what} {} s (none recorded yet: its least)",
                    d.as_secs()
                ));
            }
            (None, None) => {
                self.lower = true;
                self.parts.push(format!("{what} not recorded yet"));
            }
        }
    }
}

/// The estimate for applying a revision whose plan calls for `action`: the build (recorded,
/// else `built_now`, this preview's own), a drain (for a drain or a reboot), the activation (a
/// switch for a live or drained one, a boot for a reboot), the reboot, and the gate (recorded,
/// else its `settle`, the least a gate takes).
pub fn estimate(
    attempts: &[Attempt],
    took: &Durations,
    action: Disruption,
    settle: Duration,
    built_now: Option<Duration>,
) -> Estimate {
    let mut sum = Sum::default();
    match (
        median(attempts, |a| a.kind == AttemptKind::Build),
        built_now,
    ) {
        (None, Some(d)) => {
            sum.total += d;
            sum.parts
                .push(format!("build {} s (this preview's)", d.as_secs()));
        }
        (known, _) => sum.add("build", known, None),
    }
    if action != Disruption::None {
        sum.add("drain", median_of(took, Measured::Drain), None);
    }
    let goal = if action == Disruption::Reboot {
        Goal::Boot
    } else {
        Goal::Switch
    };
    let activation = median(attempts, |a| a.kind == AttemptKind::Apply && a.goal == goal);
    sum.add("activation", activation, None);
    if action == Disruption::Reboot {
        sum.add("reboot", median_of(took, Measured::Reboot), None);
    }
    sum.add("gate", median_of(took, Measured::Gate), Some(settle));
    let mut of = sum.parts.join(" + ");
    if sum.lower {
        of.push_str(" (a lower bound)");
    }
    Estimate {
        secs: Some(sum.total.as_secs()),
        of,
        lower: sum.lower,
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
    fn the_median_of_each_recorded_part() {
        use AttemptKind::{Apply, Build};
        let history = vec![
            attempt(Build, Goal::Switch, 100, Outcome::Succeeded),
            attempt(Build, Goal::Switch, 30, Outcome::Succeeded),
            attempt(Build, Goal::Switch, 999, Outcome::Failed),
            attempt(Build, Goal::Switch, 40, Outcome::Succeeded),
            attempt(Apply, Goal::Switch, 8, Outcome::Succeeded),
            attempt(Apply, Goal::Boot, 50, Outcome::Succeeded),
        ];
        let took = Durations {
            drains: vec![100, 20, 30, 25, 40, 35],
            gates: vec![70],
            reboots: vec![90, 110],
        };
        let settle = Duration::from_secs(60);
        let e = estimate(&history, &took, Disruption::None, settle, None);
        assert_eq!(e.secs, Some(40 + 8 + 70));
        assert_eq!(
            e.of,
            "build 40 s (median of 3) + activation 8 s (median of 1) + gate 70 s (median of 1)"
        );
        // The newest five drains: 20 25 30 35 40.
        let e = estimate(&history, &took, Disruption::Drain, settle, None);
        assert_eq!(e.secs, Some(40 + 30 + 8 + 70));
        let e = estimate(&history, &took, Disruption::Reboot, settle, None);
        assert_eq!(e.secs, Some(40 + 30 + 50 + 110 + 70));
        assert_eq!(
            e.of,
            "build 40 s (median of 3) + drain 30 s (median of 5) + activation 50 s (median of 1) \
             + reboot 110 s (median of 2) + gate 70 s (median of 1)"
        );
    }

    #[test]
    fn what_was_never_done_here_makes_a_lower_bound() {
        let e = estimate(
            &[],
            &Durations::default(),
            Disruption::Reboot,
            Duration::from_secs(10),
            Some(Duration::from_secs(3)),
        );
        assert_eq!(e.secs, Some(13));
        assert!(e.lower);
        assert_eq!(
            e.of,
            "build 3 s (this preview's) + drain not recorded yet + activation not recorded yet \
             + reboot not recorded yet + gate 10 s (none recorded yet: its least) (a lower bound)"
        );
        let live = estimate(
            &[attempt(
                AttemptKind::Apply,
                Goal::Switch,
                5,
                Outcome::Succeeded,
            )],
            &Durations {
                gates: vec![30],
                ..Durations::default()
            },
            Disruption::None,
            Duration::from_secs(10),
            Some(Duration::from_secs(3)),
        );
        assert_eq!(live.secs, Some(3 + 5 + 30));
        assert!(!live.lower, "{}", live.of);
        assert!(!live.of.contains("lower bound"), "{}", live.of);
    }
}
