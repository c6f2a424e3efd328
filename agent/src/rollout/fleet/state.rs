//! The `ginx-rollout` ConfigMap's stored format: the fleet pause, the halted revisions, the
//! change log and the failures counted against each revision's budget, as [`FleetState`]. It is
//! versioned by its keys, as [`fleet`](crate::rollout::fleet) describes the layout: fields are added,
//! never renamed, because nodes of different versions read and write the same object.
//!
//! Owns: these types, the questions the rollout asks of them, and their conversion into the
//! views of status ([`FleetStatus`], [`HaltStatus`], [`PauseStatus`]). Not the encoding into
//! keys or the writes (`configmap.rs`), nor what a halt means for applying (`admission.rs`).

use std::collections::BTreeMap;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use super::events::FleetEvent;
use super::holds::Hold;
use crate::status::{
    FailureStatus, FleetEventStatus, FleetStatus, HaltStatus, HoldStatus, PauseStatus,
};
use crate::types::{HaltCause, Revision};

/// A revision whose health gate failed: nodes refuse it until a new revision or
/// `ginxctl rollout clear`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Halt {
    pub revision: Revision,
    /// The node whose gate failed, or that vanished while applying or verifying it.
    pub node: String,
    /// The failing probes and their messages.
    pub probes: BTreeMap<String, String>,
    pub reason: String,
    pub at: Timestamp,
    /// Why: absent for a failed gate (and in halts written before the field existed).
    #[serde(default, skip_serializing_if = "HaltCause::is_gate_failed")]
    pub cause: HaltCause,
    /// For a `holder-vanished` halt: the rollout group whose slot the holder held. The whole
    /// group waits while it stands (the holder may still be activating or verifying).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
}

/// `ginxctl rollout pause`: no node starts applying until `resume`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pause {
    /// `user@node` of who paused.
    pub by: String,
    pub at: Timestamp,
}

/// The `ginx-rollout` ConfigMap's contents.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FleetState {
    pub paused: Option<Pause>,
    /// Halted revisions, by full revision.
    pub halted: BTreeMap<String, Halt>,
    /// The latest changes, newest last (a bounded list).
    pub events: Vec<FleetEvent>,
    /// The failures counted against each revision's budget (`rollout.halt_after`): full
    /// revision → node → what failed there.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub failures: BTreeMap<String, BTreeMap<String, FailureRecord>>,
    /// Held nodes (`ginxctl hold`), by node: read by nodes, written by operators only (see
    /// `holds.rs`), so never encoded among the fleet state's own keys.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub holds: BTreeMap<String, Hold>,
}

/// One node's failure of a revision, counted against its budget.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FailureRecord {
    pub at: Timestamp,
    pub reason: String,
    /// Last, so that the admission policy can anchor on it (see packaging/kubernetes/vap.yaml).
    pub cause: HaltCause,
}

impl FleetState {
    /// `node`'s hold, while it holds at `now`.
    pub fn hold_of(&self, node: &str, now: Timestamp) -> Option<&Hold> {
        self.holds.get(node).filter(|h| h.active_at(now))
    }

    pub fn halt_of(&self, revision: &Revision) -> Option<&Halt> {
        self.halted.get(revision.as_str())
    }

    /// How many failures count against `revision`'s budget.
    pub fn failures_of(&self, revision: &Revision) -> usize {
        self.failures
            .get(revision.as_str())
            .map_or(0, BTreeMap::len)
    }

    /// A `holder-vanished` halt in `group`: a holder of the group's slots stopped renewing
    /// while activating or verifying, and may still be doing so (partitioned, stopped), so no
    /// node of the group starts anything until it comes back and its gate passes, or an
    /// operator clears the halt.
    pub fn vanished_in(&self, group: &str) -> Option<&Halt> {
        self.halted
            .values()
            .find(|h| h.cause == HaltCause::HolderVanished && h.group.as_deref() == Some(group))
    }
}

impl From<&Halt> for HaltStatus {
    fn from(h: &Halt) -> Self {
        HaltStatus {
            revision: h.revision.clone(),
            node: h.node.clone(),
            probes: h.probes.clone(),
            reason: h.reason.clone(),
            at: h.at,
            cause: h.cause,
            group: h.group.clone(),
        }
    }
}

impl From<&Pause> for PauseStatus {
    fn from(p: &Pause) -> Self {
        PauseStatus {
            by: p.by.clone(),
            at: p.at,
        }
    }
}

impl From<&FailureRecord> for FailureStatus {
    fn from(f: &FailureRecord) -> Self {
        FailureStatus {
            at: f.at,
            reason: f.reason.clone(),
            cause: f.cause,
        }
    }
}

impl From<&FleetState> for FleetStatus {
    fn from(s: &FleetState) -> Self {
        FleetStatus {
            paused: s.paused.as_ref().map(PauseStatus::from),
            halted: s
                .halted
                .iter()
                .map(|(r, h)| (r.clone(), HaltStatus::from(h)))
                .collect(),
            events: s.events.iter().map(FleetEventStatus::from).collect(),
            failures: s
                .failures
                .iter()
                .map(|(r, nodes)| {
                    let nodes = nodes
                        .iter()
                        .map(|(n, f)| (n.clone(), FailureStatus::from(f)))
                        .collect();
                    (r.clone(), nodes)
                })
                .collect(),
            holds: s
                .holds
                .iter()
                .map(|(n, h)| (n.clone(), HoldStatus::from(h)))
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::RolloutStatus;

    const A: &str = "0123456789abcdef0123456789abcdef01234567";
    const B: &str = "1111111111111111111111111111111111111111";
    const C: &str = "2222222222222222222222222222222222222222";

    fn t(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn halt(rev: &str, cause: HaltCause, group: Option<&str>) -> Halt {
        Halt {
            revision: rev.parse().unwrap(),
            node: "makise".into(),
            probes: BTreeMap::from([("kubelet".into(), "healthz answered 500".into())]),
            reason: "health gate failed".into(),
            at: t("2026-12-01T10:00:00Z"),
            cause,
            group: group.map(str::to_owned),
        }
    }

    /// A pause, a halt of each cause (with a group and without), events and failures.
    fn everything() -> FleetState {
        let failure = |cause| FailureRecord {
            at: t("2026-12-01T09:59:00Z"),
            reason: "health gate failed".into(),
            cause,
        };
        FleetState {
            paused: Some(Pause {
                by: "alice@lucy".into(),
                at: t("2026-12-01T11:57:00.123Z"),
            }),
            halted: BTreeMap::from([
                (A.into(), halt(A, HaltCause::GateFailed, None)),
                (
                    B.into(),
                    halt(B, HaltCause::HolderVanished, Some("workers")),
                ),
                (C.into(), halt(C, HaltCause::BuildFailed, None)),
            ]),
            events: vec![
                FleetEvent {
                    by: "alice@lucy".into(),
                    at: t("2026-12-01T11:57:00.123Z"),
                    action: "pause".into(),
                },
                FleetEvent {
                    by: "bob@okabe".into(),
                    at: t("2026-12-01T12:00:00Z"),
                    action: format!("clear {A}"),
                },
            ],
            failures: BTreeMap::from([(
                A.into(),
                BTreeMap::from([
                    ("makise".into(), failure(HaltCause::GateFailed)),
                    ("okabe".into(), failure(HaltCause::HolderVanished)),
                ]),
            )]),
            holds: BTreeMap::from([(
                "lucy".into(),
                Hold {
                    by: "ann".into(),
                    at: t("2026-12-01T10:00:00Z"),
                    reason: "disk failing".into(),
                    until: Some(t("2026-12-01T18:00:00Z")),
                },
            )]),
        }
    }

    const HALT_A: &str = r#"{"revision":"0123456789abcdef0123456789abcdef01234567","node":"makise","probes":{"kubelet":"healthz answered 500"},"reason":"health gate failed","at":"2026-12-01T10:00:00Z"}"#;
    const HALT_B: &str = r#"{"revision":"1111111111111111111111111111111111111111","node":"makise","probes":{"kubelet":"healthz answered 500"},"reason":"health gate failed","at":"2026-12-01T10:00:00Z","cause":"holder-vanished","group":"workers"}"#;
    const HALT_C: &str = r#"{"revision":"2222222222222222222222222222222222222222","node":"makise","probes":{"kubelet":"healthz answered 500"},"reason":"health gate failed","at":"2026-12-01T10:00:00Z","cause":"build-failed"}"#;
    const PAUSE: &str = r#"{"by":"alice@lucy","at":"2026-12-01T11:57:00.123Z"}"#;

    /// The stored state and its view print the same JSON, byte for byte, and that JSON is
    /// pinned: renaming a field on either side fails here.
    #[test]
    fn the_fleet_view_prints_exactly_what_is_stored() {
        let stored = everything();
        let expected = format!(
            concat!(
                r#"{{"paused":{pause},"halted":{{"{a}":{ha},"{b}":{hb},"{c}":{hc}}},"#,
                r#""events":[{{"by":"alice@lucy","at":"2026-12-01T11:57:00.123Z","action":"pause"}},"#,
                r#"{{"by":"bob@okabe","at":"2026-12-01T12:00:00Z","action":"clear {a}"}}],"#,
                r#""failures":{{"{a}":{{"#,
                r#""makise":{{"at":"2026-12-01T09:59:00Z","reason":"health gate failed","cause":"gate-failed"}},"#,
                r#""okabe":{{"at":"2026-12-01T09:59:00Z","reason":"health gate failed","cause":"holder-vanished"}}}}}},"#,
                r#""holds":{{"lucy":{{"by":"ann","at":"2026-12-01T10:00:00Z","reason":"disk failing","until":"2026-12-01T18:00:00Z"}}}}}}"#,
            ),
            pause = PAUSE,
            a = A,
            b = B,
            c = C,
            ha = HALT_A,
            hb = HALT_B,
            hc = HALT_C,
        );
        let as_stored = serde_json::to_string(&stored).unwrap();
        let as_shown = serde_json::to_string(&FleetStatus::from(&stored)).unwrap();
        assert_eq!(as_stored, expected);
        assert_eq!(as_shown, expected);
        // ginxctl reads the view back; the stored format reads it too.
        let back: FleetState = serde_json::from_str(&as_shown).unwrap();
        assert_eq!(back, stored);
        let empty = serde_json::to_string(&FleetStatus::from(&FleetState::default())).unwrap();
        assert_eq!(empty, r#"{"paused":null,"halted":{},"events":[]}"#);
    }

    /// `rollout.halt` and `rollout.paused` of `ginxctl status --json`: what the ConfigMap
    /// stores, each cause with and without its optional fields.
    #[test]
    fn the_status_halt_prints_exactly_what_is_stored() {
        let stored = everything();
        let pause = stored.paused.as_ref().unwrap();
        for (rev, expected) in [(A, HALT_A), (B, HALT_B), (C, HALT_C)] {
            let h = stored.halt_of(&rev.parse().unwrap()).unwrap();
            let status = RolloutStatus {
                halt: Some(HaltStatus::from(h)),
                paused: Some(PauseStatus::from(pause)),
                ..RolloutStatus::default()
            };
            assert_eq!(serde_json::to_string(h).unwrap(), expected);
            assert_eq!(serde_json::to_string(pause).unwrap(), PAUSE);
            let shown = serde_json::to_string(&status).unwrap();
            let part = format!(r#","halt":{expected},"paused":{PAUSE},"#);
            assert!(shown.contains(&part), "{shown}\nlacks {part}");
        }
    }
}
