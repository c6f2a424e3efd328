//! Order across groups (`rollout.after`): a group waits until every node of the groups it
//! comes after passed its gate on the revision (or on a later one). Every heartbeat Lease
//! labelled with such a group counts (a node removed for good has its heartbeat Lease
//! deleted); while waiting, the read model watches them, so that the last pass wakes the group.
//!
//! Owns the decision ([`verdict`], pure over the read model's heartbeats) and the revision seen
//! passed (it stays passed). Does not own whether one revision is later than another: the
//! daemon answers that from the apply source's clone ([`Later`]), before the decision.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::k8s::HEARTBEAT_GROUP_LABEL;
use crate::rollout::view::Heartbeat;
use crate::types::Revision;

/// `later(theirs, ours)`: whether `theirs` descends from `ours`.
pub type Later =
    Arc<dyn Fn(Revision, Revision) -> Pin<Box<dyn Future<Output = bool> + Send>> + Send + Sync>;

/// Whether a node that passed `passed` is done with `revision`: it passed it, or one of the
/// revisions known to be later (`later`, asked before the decision).
pub(crate) fn done(
    passed: Option<&Revision>,
    revision: &Revision,
    later: &BTreeSet<Revision>,
) -> bool {
    passed.is_some_and(|p| p == revision || later.contains(p))
}

/// One node of a group this node's group comes after, as its heartbeat says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Peer {
    pub group: String,
    pub node: String,
    pub passed: Option<Revision>,
    /// Whether what it passed is this revision or a later one.
    pub done: bool,
}

/// Who is behind: the peers not done, and the groups with no node at all (a misspelt group in
/// `rollout.after` would otherwise wait for ever without saying why).
pub(crate) fn behind(peers: &[Peer], groups: &[String]) -> Vec<String> {
    let mut out: Vec<String> = peers
        .iter()
        .filter(|p| !p.done)
        .map(|p| {
            format!(
                "{} ({}, passed {})",
                p.node,
                p.group,
                p.passed.as_ref().map_or("nothing yet", |r| r.short())
            )
        })
        .collect();
    let seen: BTreeSet<&str> = peers.iter().map(|p| p.group.as_str()).collect();
    for g in groups.iter().filter(|g| !seen.contains(g.as_str())) {
        out.push(format!(
            "group {g} has no node (no heartbeat Lease labelled {HEARTBEAT_GROUP_LABEL}={g}; \
             check rollout.after)"
        ));
    }
    out
}

/// Whether every node of `groups` passed `revision` (or a later one): `None`, or who is behind.
pub(crate) fn verdict(
    heartbeats: &BTreeMap<String, Heartbeat>,
    groups: &[String],
    revision: &Revision,
    later: &BTreeSet<Revision>,
) -> Option<String> {
    let peers: Vec<Peer> = heartbeats
        .values()
        .filter(|h| groups.contains(&h.group))
        .map(|h| Peer {
            group: h.group.clone(),
            node: h.node().to_owned(),
            passed: h.passed.clone(),
            done: done(h.passed.as_ref(), revision, later),
        })
        .collect();
    let behind = behind(&peers, groups);
    (!behind.is_empty()).then(|| {
        format!(
            "after {}: not every node passed its gate on {} yet: {}",
            groups.join(", "),
            revision.short(),
            behind.join(", ")
        )
    })
}

/// The revision every group this one comes after was seen to have passed.
#[derive(Default)]
pub(crate) struct AfterGroups {
    passed: Option<Revision>,
}

impl AfterGroups {
    /// Whether `groups` still have to be asked about `revision`.
    pub fn pending(&self, groups: &[String], revision: &Revision) -> bool {
        !groups.is_empty() && self.passed.as_ref() != Some(revision)
    }

    /// Answers from the read model's heartbeats, remembering a pass.
    pub fn check(
        &mut self,
        heartbeats: &BTreeMap<String, Heartbeat>,
        groups: &[String],
        revision: &Revision,
        later: &BTreeSet<Revision>,
    ) -> Option<String> {
        let why = verdict(heartbeats, groups, revision, later);
        if why.is_none() {
            self.passed = Some(revision.clone());
        }
        why
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rev(c: char) -> Revision {
        std::iter::repeat_n(c, 40)
            .collect::<String>()
            .parse()
            .unwrap()
    }

    fn peer(node: &str, passed: Option<char>, done: bool) -> Peer {
        Peer {
            group: "control-plane".into(),
            node: node.into(),
            passed: passed.map(rev),
            done,
        }
    }

    #[test]
    fn nobody_is_behind_once_every_node_of_every_group_is_done() {
        let groups = ["control-plane".to_owned()];
        assert!(behind(&[peer("lucy", Some('a'), true)], &groups).is_empty());
    }

    #[test]
    fn a_node_behind_is_named_with_what_it_passed() {
        let groups = ["control-plane".to_owned()];
        let out = behind(
            &[peer("lucy", Some('b'), false), peer("quinn", None, false)],
            &groups,
        );
        assert_eq!(
            out,
            [
                "lucy (control-plane, passed bbbbbbbbbbbb)".to_owned(),
                "quinn (control-plane, passed nothing yet)".to_owned()
            ]
        );
    }

    fn hb(node: &str, group: &str, passed: Option<char>) -> (String, Heartbeat) {
        let h = Heartbeat {
            name: format!("ginx-{node}"),
            holder: Some(node.into()),
            group: group.into(),
            passed: passed.map(rev),
            renewed: None,
            duration_secs: 40,
        };
        (h.name.clone(), h)
    }

    #[test]
    fn a_group_passes_when_every_node_passed_this_or_a_later_revision() {
        let groups = ["control-plane".to_owned()];
        let later: BTreeSet<Revision> = [rev('b')].into();
        let hbs: BTreeMap<_, _> = [
            hb("cp1", "control-plane", Some('a')),
            hb("cp2", "control-plane", Some('b')),
            hb("w1", "workers", None),
        ]
        .into();
        assert_eq!(verdict(&hbs, &groups, &rev('a'), &later), None);
        let mut g = AfterGroups::default();
        assert!(g.pending(&groups, &rev('a')));
        assert_eq!(g.check(&hbs, &groups, &rev('a'), &later), None);
        assert!(!g.pending(&groups, &rev('a')), "a pass is remembered");
        let why = verdict(&hbs, &groups, &rev('a'), &BTreeSet::new()).unwrap();
        assert!(
            why.contains("cp2 (control-plane, passed bbbbbbbbbbbb)"),
            "{why}"
        );
        assert!(!why.contains("w1"), "{why}");
    }

    #[test]
    fn a_group_without_any_node_is_named_as_such() {
        let groups = ["control-plane".to_owned(), "storage".to_owned()];
        let out = behind(&[peer("lucy", Some('a'), true)], &groups);
        assert_eq!(out.len(), 1);
        assert!(
            out[0].starts_with("group storage has no node"),
            "{}",
            out[0]
        );
    }
}
