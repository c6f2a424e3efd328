//! How long this node's recent drains, health gates and reboots took: what the estimate of a
//! previewed revision (`ginxctl plan`) is made of, beside the history's builds and
//! activations. Measured between two of this node's own timestamps; an estimate is told to an
//! operator, never decided on, so a clock stepped in between costs one sample of the few kept,
//! and a sample below zero or over a week is not kept at all.

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

/// Samples kept per kind, the newest last.
pub const KEPT: usize = 5;
/// A sample longer than this is a clock's step or a node left alone, not a duration.
const MAX_SECS: u64 = 7 * 24 * 3600;

/// What was measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Measured {
    /// From the cordon to the last pod gone, before an activation or a reboot.
    Drain,
    /// From the gate's opening to its passing.
    Gate,
    /// From the reboot command to the gate after it opening, in the new boot.
    Reboot,
}

/// The recent samples, seconds each, the newest last.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Durations {
    pub drains: Vec<u64>,
    pub gates: Vec<u64>,
    pub reboots: Vec<u64>,
}

impl Durations {
    pub fn is_empty(&self) -> bool {
        self.drains.is_empty() && self.gates.is_empty() && self.reboots.is_empty()
    }

    /// The samples of `what`.
    pub fn of(&self, what: Measured) -> &[u64] {
        match what {
            Measured::Drain => &self.drains,
            Measured::Gate => &self.gates,
            Measured::Reboot => &self.reboots,
        }
    }

    /// Keeps `to - from` as a sample of `what` (none below zero or over a week), the oldest
    /// going past [`KEPT`].
    pub fn record(&mut self, what: Measured, from: Timestamp, to: Timestamp) {
        let secs = to.duration_since(from).as_secs();
        let Ok(secs) = u64::try_from(secs) else {
            return;
        };
        if secs > MAX_SECS {
            return;
        }
        let list = match what {
            Measured::Drain => &mut self.drains,
            Measured::Gate => &mut self.gates,
            Measured::Reboot => &mut self.reboots,
        };
        list.push(secs);
        let over = list.len().saturating_sub(KEPT);
        list.drain(..over);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_000_000 + s).unwrap()
    }

    #[test]
    fn the_newest_five_are_kept_and_a_stepped_clock_s_samples_are_not() {
        let mut d = Durations::default();
        for s in 1..=7 {
            d.record(Measured::Drain, t(0), t(s));
        }
        assert_eq!(d.of(Measured::Drain), [3, 4, 5, 6, 7]);
        d.record(Measured::Gate, t(10), t(4));
        d.record(Measured::Gate, t(0), t(8 * 24 * 3600));
        assert!(d.of(Measured::Gate).is_empty());
        d.record(Measured::Reboot, t(0), t(95));
        assert_eq!(d.reboots, [95]);
        assert!(!d.is_empty() && Durations::default().is_empty());
    }
}
