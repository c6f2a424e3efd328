//! The health gate's progress as status shows it ([`GateProgress`], `rollout.gate` in
//! `ginxctl status --json`, and the Node annotation `ginx.io/gate` that `ginxctl cluster`
//! reads), and the one sentence that says where it stands: how long the node has been
//! healthy, when the gate passes if nothing regresses, and when it gives up.
//!
//! Pure: the clock comes in as an argument. The gate's decisions are `rollout::decide::gate`'s.

use std::collections::BTreeMap;

use jiff::{Timestamp, Unit};
use serde::{Deserialize, Serialize};

use crate::types::Revision;

/// The health gate's progress.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GateProgress {
    /// What is being verified: the new revision, or the rolled-back system.
    pub revision: Option<Revision>,
    pub rollback: bool,
    pub started_at: Option<Timestamp>,
    /// Healthy without a break since then; `null` while unhealthy.
    pub healthy_since: Option<Timestamp>,
    /// Passes at `healthy_since + settle`, fails at `deadline`.
    pub deadline: Option<Timestamp>,
    /// Probes (or checks) that block the gate now, with their messages.
    pub failing: BTreeMap<String, String>,
    /// When the gate passes if nothing regresses (`healthy_since + settle`); `null` while
    /// unhealthy.
    #[serde(default)]
    pub passes_at: Option<Timestamp>,
}

impl GateProgress {
    /// Where the gate stands, for a person: with `now`, "healthy for 12 s of the 60 s settle";
    /// without (a text that is stored and read later), "healthy since T".
    ///
    /// `health gate after the activation: healthy for 12 s of the 60 s settle; passes at
    /// 2026-12-04T14:34:35Z if nothing regresses; gives up at 2026-12-04T14:36:00Z`
    pub fn describe(&self, now: Option<Timestamp>) -> String {
        let what = if self.rollback {
            "the rolled-back system"
        } else {
            "the activation"
        };
        let state = match (self.healthy_since, self.passes_at) {
            (Some(since), Some(passes)) => {
                let settle = secs(passes.duration_since(since));
                let healthy = match now {
                    Some(now) => format!(
                        "healthy for {} s of the {settle} s settle",
                        secs(now.duration_since(since)).min(settle)
                    ),
                    None => format!("healthy since {} ({settle} s settle)", time(since)),
                };
                format!("{healthy}; passes at {} if nothing regresses", time(passes))
            }
            _ if !self.failing.is_empty() => format!(
                "failing {}",
                self.failing.keys().cloned().collect::<Vec<_>>().join(", ")
            ),
            _ => "waiting for a fresh result of every check".to_owned(),
        };
        let gives_up = self
            .deadline
            .map(|d| format!("; gives up at {}", time(d)))
            .unwrap_or_default();
        format!("health gate after {what}: {state}{gives_up}")
    }

    /// The same progress without the probes' messages, which change far more often than the
    /// gate does: what the Node annotation holds.
    pub fn without_messages(&self) -> GateProgress {
        GateProgress {
            failing: self
                .failing
                .keys()
                .map(|k| (k.clone(), String::new()))
                .collect(),
            ..self.clone()
        }
    }
}

/// Whole seconds, never negative (another machine's clock may be ahead of ours).
fn secs(d: jiff::SignedDuration) -> i64 {
    d.as_secs().max(0)
}

fn time(t: Timestamp) -> String {
    t.round(Unit::Second)
        .unwrap_or(t)
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn healthy() -> GateProgress {
        GateProgress {
            started_at: Some(at("2026-12-04T14:32:00Z")),
            healthy_since: Some(at("2026-12-04T14:33:35Z")),
            passes_at: Some(at("2026-12-04T14:34:35Z")),
            deadline: Some(at("2026-12-04T14:37:00Z")),
            ..GateProgress::default()
        }
    }

    #[test]
    fn a_healthy_gate_says_how_long_when_it_passes_and_when_it_gives_up() {
        assert_eq!(
            healthy().describe(Some(at("2026-12-04T14:33:47.600Z"))),
            "health gate after the activation: healthy for 12 s of the 60 s settle; passes at \
             2026-12-04T14:34:35Z if nothing regresses; gives up at 2026-12-04T14:37:00Z"
        );
        assert_eq!(
            healthy().describe(None),
            "health gate after the activation: healthy since 2026-12-04T14:33:35Z (60 s \
             settle); passes at 2026-12-04T14:34:35Z if nothing regresses; gives up at \
             2026-12-04T14:37:00Z"
        );
        // A reader whose clock is off shows neither a negative nor an overlong time.
        let early = healthy().describe(Some(at("2026-12-04T14:30:00Z")));
        assert!(early.contains("healthy for 0 s of the 60 s"), "{early}");
        let late = healthy().describe(Some(at("2026-12-04T15:00:00Z")));
        assert!(late.contains("healthy for 60 s of the 60 s"), "{late}");
    }

    #[test]
    fn an_unhealthy_gate_names_what_fails() {
        let g = GateProgress {
            rollback: true,
            healthy_since: None,
            passes_at: None,
            failing: [("kubelet".to_owned(), "not active".to_owned())].into(),
            ..healthy()
        };
        assert_eq!(
            g.describe(Some(at("2026-12-04T14:33:00Z"))),
            "health gate after the rolled-back system: failing kubelet; gives up at \
             2026-12-04T14:37:00Z"
        );
        assert_eq!(g.without_messages().failing["kubelet"], "");
        let waiting = GateProgress {
            failing: BTreeMap::new(),
            ..g
        };
        assert!(
            waiting
                .describe(None)
                .contains("waiting for a fresh result of every check")
        );
    }
}
