//! A plan asked for before a merge: an operator's request (`ginxctl plan REF`), stored in the
//! fleet's ConfigMap, and each node's answer, written on its own heartbeat Lease. Both are
//! stored formats read by other versions of ginx: fields are only ever added, and a value that
//! cannot be read is left out, never an error.

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use super::Invalid;
use super::{PackageChange, Plan, PlanMark, Revision};

/// At most this many plan requests stand in the ConfigMap at once; `ginxctl plan` refuses
/// another until one is an hour old.
pub const MAX_REQUESTS: usize = 8;
/// A request is answered for this long after it was made; `ginxctl plan` removes older ones.
pub const REQUEST_LIFETIME_SECS: i64 = 3600;
/// At most this many packages are told per answer (the heartbeat stays small).
pub const MAX_PACKAGES: usize = 16;
/// The longest ref a request may name (git allows longer; no branch of a hive needs it).
pub const MAX_REF_LEN: usize = 200;
/// An answer's error is cut to this many characters.
const MAX_ERROR_CHARS: usize = 400;

/// `ginxctl plan REF`: plan `reference` on every node, activating nothing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanRequest {
    /// A branch, a tag or a commit id of the apply source.
    #[serde(rename = "ref")]
    pub reference: String,
    /// `user@host` of who asked.
    pub by: String,
    /// When it was asked, by the asker's clock: only `ginxctl plan` reads it, to remove
    /// requests over an hour old.
    pub at: Timestamp,
    /// Only the nodes of these rollout groups answer (`ginxctl plan --group`); empty: all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<String>,
}

impl PlanRequest {
    /// Whether a node of rollout group `group` answers it.
    pub fn asks(&self, group: &str) -> bool {
        self.groups.is_empty() || self.groups.iter().any(|g| g == group)
    }
}

/// Whether `id` can name a request: 1 to 32 lowercase letters and digits (it is part of a
/// ConfigMap key).
pub fn valid_request_id(id: &str) -> bool {
    (1..=32).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_digit() || b.is_ascii_lowercase())
}

/// At most this many groups a request may name.
pub const MAX_GROUPS: usize = 16;

/// Why `groups` cannot be asked for: too many, or one that no node's `rollout.group` can be
/// (a lowercase DNS label of at most 40 characters).
pub fn check_groups(groups: &[String]) -> Result<(), Invalid> {
    if groups.len() > MAX_GROUPS {
        return Err(Invalid(format!(
            "{} groups named; at most {MAX_GROUPS}",
            groups.len()
        )));
    }
    for g in groups {
        let label = (1..=40).contains(&g.len())
            && g.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !g.starts_with('-')
            && !g.ends_with('-');
        if !label {
            return Err(Invalid(format!(
                "group {g:?} is not a rollout group's name: lowercase letters, digits and '-', \
                 at most 40 characters (see rollout.group)"
            )));
        }
    }
    Ok(())
}

/// Why a ref cannot be asked for: empty, too long, or not a name git accepts for a branch,
/// a tag or a commit id (no spaces, no `..`, no control characters, no leading `-`).
pub fn check_reference(reference: &str) -> Result<(), Invalid> {
    if reference.is_empty() {
        return Err("the ref is empty: give a branch, a tag or a commit id".into());
    }
    if reference.len() > MAX_REF_LEN {
        return Err(Invalid(format!("the ref is over {MAX_REF_LEN} characters")));
    }
    let bad = reference.starts_with('-')
        || reference.starts_with('/')
        || reference.ends_with('/')
        || reference.ends_with(".lock")
        || reference.contains("..")
        || reference.contains("@{")
        || reference
            .chars()
            .any(|c| c.is_control() || " ~^:?*[\\\"".contains(c));
    if bad {
        return Err(Invalid(format!(
            "{reference:?} is not a branch, tag or commit name git accepts"
        )));
    }
    Ok(())
}

/// How a node's plan of a requested ref ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PreviewOutcome {
    /// Built, and its plan computed (which may still say the plan is unknown, with why).
    Planned,
    /// The build failed: the error says how.
    BuildFailed,
    /// The commit was refused (no signature a node trusts), or the ref is not in the source.
    Refused,
    /// Anything else stopped it (a fetch that failed, a full disk): the error says what.
    Failed,
}

impl PreviewOutcome {
    pub fn label(self) -> &'static str {
        match self {
            PreviewOutcome::Planned => "planned",
            PreviewOutcome::BuildFailed => "build failed",
            PreviewOutcome::Refused => "refused",
            PreviewOutcome::Failed => "failed",
        }
    }
}

/// One node's answer to one request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreviewAnswer {
    /// The request's id (its ConfigMap key is `plan.<id>`).
    pub id: String,
    #[serde(rename = "ref")]
    pub reference: String,
    /// The commit the ref named on this node, when the fetch found it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<Revision>,
    pub outcome: PreviewOutcome,
    /// The plan: action, why, closure growth.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<PlanMark>,
    /// The packages that change, `name: old → new`, at most [`MAX_PACKAGES`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub packages: Vec<String>,
    /// Packages left out past [`MAX_PACKAGES`].
    #[serde(default, skip_serializing_if = "is_zero")]
    pub more_packages: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// How long applying it would take here, from this node's recorded durations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub estimate_secs: Option<u64>,
    /// What the estimate is made of, or why there is none (`build 40 s + activation 12 s + …`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub estimate_of: String,
    /// The estimate is a lower bound: a part of it was never recorded on this node. Absent
    /// (false) in the answers of nodes that do not tell.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub estimate_lower: bool,
    /// How long answering took: fetch, build and plan.
    pub took_ms: u64,
    /// When it was answered, by the node's clock.
    pub at: Timestamp,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// `name: 1.0 → 1.1` for one package change (`∅` for none).
pub fn package_line(p: &PackageChange) -> String {
    let side = |v: &[String]| {
        if v.is_empty() {
            "∅".to_owned()
        } else {
            v.join(", ")
        }
    };
    let size = p.bytes.map(|b| format!(", {}", super::signed_size(b)));
    format!(
        "{}: {} → {}{}",
        p.name,
        side(&p.from),
        side(&p.to),
        size.unwrap_or_default()
    )
}

impl PreviewAnswer {
    /// An answer to request `id` for `reference` that says nothing yet: outcome `failed`, no
    /// revision, no plan, no estimate; what ends the preview fills it in.
    pub fn new(id: &str, reference: &str, at: Timestamp) -> Self {
        PreviewAnswer {
            id: id.to_owned(),
            reference: reference.to_owned(),
            revision: None,
            outcome: PreviewOutcome::Failed,
            plan: None,
            packages: Vec::new(),
            more_packages: 0,
            error: None,
            estimate_secs: None,
            estimate_of: String::new(),
            estimate_lower: false,
            took_ms: 0,
            at,
        }
    }

    /// The answer for a plan computed of `revision`, within its bounds.
    pub fn planned(base: PreviewAnswer, revision: &Revision, plan: &Plan) -> Self {
        let packages: Vec<String> = plan.packages.iter().map(package_line).collect();
        let kept: Vec<String> = packages.iter().take(MAX_PACKAGES).cloned().collect();
        PreviewAnswer {
            revision: Some(revision.clone()),
            outcome: PreviewOutcome::Planned,
            plan: Some(PlanMark::of(revision, plan)),
            more_packages: packages.len() - kept.len(),
            packages: kept,
            ..base
        }
    }

    /// The answer of a plan that did not come to be, and why (cut short).
    pub fn failed(base: PreviewAnswer, outcome: PreviewOutcome, why: &str) -> Self {
        PreviewAnswer {
            outcome,
            error: Some(why.chars().take(MAX_ERROR_CHARS).collect()),
            ..base
        }
    }

    /// One line, as `ginxctl plan` and `ginx plan` print it.
    pub fn summary(&self) -> String {
        match (&self.plan, &self.error) {
            (Some(p), _) if self.outcome == PreviewOutcome::Planned => p.summary(),
            (_, Some(e)) => format!("{}: {e}", self.outcome.label()),
            _ => self.outcome.label().to_owned(),
        }
    }
}

/// The answers as written on the heartbeat Lease (`ginx.io/previews`): compact JSON, a list.
pub fn encode_answers(answers: &[PreviewAnswer]) -> String {
    serde_json::to_string(answers).unwrap_or_default()
}

/// The answers read back; what cannot be read is left out.
pub fn decode_answers(text: &str) -> Vec<PreviewAnswer> {
    let Ok(values) = serde_json::from_str::<Vec<serde_json::Value>>(text) else {
        return Vec::new();
    };
    values
        .into_iter()
        .filter_map(|v| serde_json::from_value(v).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Disruption;

    fn base() -> PreviewAnswer {
        PreviewAnswer {
            took_ms: 5,
            ..PreviewAnswer::new("a1", "feature", Timestamp::UNIX_EPOCH)
        }
    }

    #[test]
    fn ids_and_refs_are_checked_before_they_become_keys() {
        assert!(valid_request_id("0a9z"));
        for bad in ["", "A1", "a.b", "a/b", &"a".repeat(33)] {
            assert!(!valid_request_id(bad), "{bad:?}");
        }
        for good in ["main", "feature/kernel-6.12", "v1.2", "0123abcd"] {
            assert!(check_reference(good).is_ok(), "{good}");
        }
        for bad in [
            "",
            "-x",
            "a..b",
            "a b",
            "a:b",
            "x.lock",
            "a/",
            &"b".repeat(201),
        ] {
            assert!(check_reference(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn groups_must_be_names_a_rollout_group_can_have() {
        let owned = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(check_groups(&[]).is_ok());
        assert!(check_groups(&owned(&["control-plane", "pp", "w2"])).is_ok());
        for bad in ["", "PP", "a_b", "-a", "a-", &"g".repeat(41)] {
            assert!(check_groups(&owned(&[bad])).is_err(), "{bad:?}");
        }
        assert!(check_groups(&vec!["g".to_string(); MAX_GROUPS + 1]).is_err());
    }

    #[test]
    fn an_answer_keeps_its_bounds_and_reads_back() {
        let rev: Revision = "ab".repeat(20).parse().unwrap();
        let plan = Plan {
            action: Disruption::Drain,
            because: vec!["restarts containerd.service".into()],
            added_bytes: Some(4 * 1024 * 1024),
            packages: (0..20)
                .map(|i| PackageChange {
                    name: format!("p{i}"),
                    from: vec!["1".into()],
                    to: vec!["2".into()],
                    bytes: None,
                })
                .collect(),
            ..Plan::default()
        };
        let a = PreviewAnswer::planned(base(), &rev, &plan);
        assert_eq!(a.packages.len(), MAX_PACKAGES);
        assert_eq!(a.more_packages, 4);
        assert_eq!(a.packages[0], "p0: 1 → 2");
        assert_eq!(a.summary(), "drain: restarts containerd.service; +4.0 MiB");
        let failed = PreviewAnswer::failed(base(), PreviewOutcome::BuildFailed, &"x".repeat(999));
        assert_eq!(failed.error.as_ref().unwrap().len(), MAX_ERROR_CHARS);
        let text = encode_answers(&[a.clone(), failed.clone()]);
        assert_eq!(decode_answers(&text), vec![a, failed]);
        // Another version's answer this one cannot read is left out, not an error.
        let mixed = format!("[{{\"id\":1}},{}]", &text[1..text.len() - 1]);
        assert_eq!(decode_answers(&mixed).len(), 2);
        assert!(decode_answers("not json").is_empty());
    }
}
