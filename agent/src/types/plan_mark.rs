//! A node's plan as the fleet sees it: what activating the revision it waits for (or is about to
//! apply) calls for, and why. Each node writes its own on its heartbeat Lease, as compact JSON
//! in one annotation; `ginxctl cluster` reads every node's and counts them per revision. It is
//! a stored format read by other versions of ginx: fields are only ever added, and a value
//! that cannot be read is left out, never an error.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{Disruption, Plan, Revision};

/// At most this many reasons are told (the units that call for the action, a kernel change):
/// the annotation stays small whatever a revision restarts.
pub const MAX_REASONS: usize = 16;
/// Each reason, and the unknown plan's why, is cut to this many characters.
const MAX_REASON_CHARS: usize = 200;

/// One node's plan for one revision.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanMark {
    pub revision: Revision,
    /// `none` (live), `drain` or `reboot`.
    pub action: Disruption,
    /// What calls for the action (`restarts containerd.service`), at most [`MAX_REASONS`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub because: Vec<String>,
    /// How many reasons were left out past [`MAX_REASONS`].
    #[serde(default, skip_serializing_if = "is_zero")]
    pub more: usize,
    /// How many bytes the closure grows (negative: shrinks), when Nix said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub added_bytes: Option<i64>,
    /// The plan could not be computed, and why: the action is the policy's fallback.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unknown: Option<String>,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

fn cut(s: &str) -> String {
    s.chars().take(MAX_REASON_CHARS).collect()
}

impl PlanMark {
    /// The mark of `plan`, the plan of `revision`, within its bounds.
    pub fn of(revision: &Revision, plan: &Plan) -> Self {
        Self::new(
            revision,
            plan.action,
            &plan.because,
            plan.added_bytes,
            plan.unknown.as_deref(),
        )
    }

    /// A mark within its bounds: at most [`MAX_REASONS`] reasons, each cut short.
    pub fn new(
        revision: &Revision,
        action: Disruption,
        because: &[String],
        added_bytes: Option<i64>,
        unknown: Option<&str>,
    ) -> Self {
        let kept: Vec<String> = because.iter().take(MAX_REASONS).map(|b| cut(b)).collect();
        PlanMark {
            revision: revision.clone(),
            action,
            more: because.len() - kept.len(),
            because: kept,
            added_bytes,
            unknown: unknown.map(cut),
        }
    }

    /// As written in the annotation: compact JSON.
    pub fn encode(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The annotation read back; `None` when it is not a plan this ginx can read.
    pub fn decode(text: &str) -> Option<Self> {
        serde_json::from_str(text).ok()
    }

    /// One line, as `ginxctl cluster` prints it: `drain: restarts containerd.service; +4.0 MiB`.
    pub fn summary(&self) -> String {
        let said = (!self.because.is_empty()).then(|| {
            let more = match self.more {
                0 => String::new(),
                n => format!(" and {n} more"),
            };
            format!("{}{more}", self.because.join(", "))
        });
        super::plan::summary_line(self.action, said, self.added_bytes)
    }
}

/// One revision's plans across the fleet: how many nodes go live, drain or reboot, and what
/// accounts for the drains and reboots (each reason, with how many nodes give it).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanCounts {
    pub live: u32,
    pub drain: u32,
    pub reboot: u32,
    /// Plans that could not be computed (counted in their fallback's action too).
    #[serde(default)]
    pub unknown: u32,
    /// Reason → how many nodes' drains or reboots it accounts for.
    #[serde(default)]
    pub because: BTreeMap<String, u32>,
}

/// The plans of `marks`, counted per revision (full commit id).
pub fn plan_counts<'a>(
    marks: impl IntoIterator<Item = &'a PlanMark>,
) -> BTreeMap<String, PlanCounts> {
    let mut out: BTreeMap<String, PlanCounts> = BTreeMap::new();
    for m in marks {
        let c = out.entry(m.revision.as_str().to_owned()).or_default();
        match m.action {
            Disruption::None => c.live += 1,
            Disruption::Drain => c.drain += 1,
            Disruption::Reboot => c.reboot += 1,
        }
        if m.unknown.is_some() {
            c.unknown += 1;
        }
        if m.action != Disruption::None {
            for b in &m.because {
                *c.because.entry(b.clone()).or_default() += 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rev(c: char) -> Revision {
        c.to_string().repeat(40).parse().unwrap()
    }

    fn plan(action: Disruption, because: &[&str]) -> Plan {
        Plan {
            action,
            because: because.iter().map(|b| b.to_string()).collect(),
            added_bytes: Some(4 << 20),
            ..Plan::default()
        }
    }

    #[test]
    fn a_mark_reads_back_as_written_and_says_its_plan_in_a_line() {
        let m = PlanMark::of(
            &rev('a'),
            &plan(Disruption::Drain, &["restarts containerd.service"]),
        );
        let text = m.encode();
        assert_eq!(
            text,
            format!(
                r#"{{"revision":"{}","action":"drain","because":["restarts containerd.service"],"added_bytes":4194304}}"#,
                "a".repeat(40)
            )
        );
        assert_eq!(PlanMark::decode(&text), Some(m.clone()));
        assert_eq!(m.summary(), "drain: restarts containerd.service; +4.0 MiB");
        assert_eq!(PlanMark::decode("{not json"), None);
        // Written by a newer ginx, with a field this one does not know: still read.
        let newer = text.replacen('{', r#"{"eta_secs":3,"#, 1);
        assert_eq!(PlanMark::decode(&newer), Some(m));
    }

    #[test]
    fn a_mark_stays_small_whatever_the_plan_says() {
        let many: Vec<String> = (0..100).map(|i| format!("restarts u{i}.service")).collect();
        let refs: Vec<&str> = many.iter().map(String::as_str).collect();
        let mut p = plan(Disruption::Drain, &refs);
        p.unknown = Some("x".repeat(10_000));
        let m = PlanMark::of(&rev('b'), &p);
        assert_eq!(m.because.len(), MAX_REASONS);
        assert_eq!(m.more, 100 - MAX_REASONS);
        assert!(m.encode().len() < 4096, "{}", m.encode().len());
        assert!(m.summary().contains("and 84 more"), "{}", m.summary());
    }

    #[test]
    fn plans_are_counted_per_revision_with_what_accounts_for_them() {
        let c = "restarts containerd.service";
        let marks = [
            PlanMark::of(&rev('a'), &plan(Disruption::Drain, &[c])),
            PlanMark::of(
                &rev('a'),
                &plan(Disruption::Drain, &[c, "restarts kubelet.service"]),
            ),
            PlanMark::of(&rev('a'), &plan(Disruption::None, &[])),
            PlanMark::of(&rev('a'), &plan(Disruption::Reboot, &["kernel changed"])),
            PlanMark::of(&rev('b'), &plan(Disruption::None, &[])),
        ];
        let mut unknown = PlanMark::of(
            &rev('b'),
            &plan(Disruption::Drain, &["the plan is unknown"]),
        );
        unknown.unknown = Some("dry-activate exited with 1".into());
        let counts = plan_counts(marks.iter().chain([&unknown]));
        let a = &counts[&"a".repeat(40)];
        assert_eq!((a.live, a.drain, a.reboot, a.unknown), (1, 2, 1, 0));
        assert_eq!(a.because[c], 2);
        assert_eq!(a.because["restarts kubelet.service"], 1);
        assert_eq!(a.because["kernel changed"], 1);
        let b = &counts[&"b".repeat(40)];
        assert_eq!((b.live, b.drain, b.reboot, b.unknown), (1, 1, 0, 1));
    }
}
