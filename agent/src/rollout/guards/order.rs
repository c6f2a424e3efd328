//! A deterministic walk through a group (`rollout.order`): the nodes of a group sorted by a
//! Node label's value (then by name; a node without the label last), or by name alone
//! (`"name"`). A node starts a revision only while fewer than `max_concurrent` of the nodes
//! before it have not passed it: so with one slot the group goes one node after the other in
//! that order, and with N slots in waves of N. A node before it that is held, not Ready,
//! quarantined on the revision or no longer in the group is not waited for: the walk never
//! stalls on a node that cannot go.
//!
//! Read from the read model's Nodes (their labels, and the annotations each node's ginx
//! writes: its group, the revision it passed, a quarantine). Owns the decision ([`check`],
//! pure). The slots are untouched: order decides who may take one, `max_concurrent` still
//! bounds how many are taken.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};

use jiff::Timestamp;

use crate::config::Config;
use crate::rollout::fleet::state::FleetState;
use crate::rollout::view::NodeFacts;
use crate::types::Revision;

/// `rollout.order = "name"`: by node name alone.
pub const BY_NAME: &str = "name";

/// One node of the group, as its Node says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Walker {
    pub name: String,
    /// The order label's value; `None` sorts last.
    pub key: Option<String>,
    /// It passed the revision (or a later one).
    pub done: bool,
    /// Held, not Ready, or quarantined on the revision: not waited for.
    pub skipped: bool,
}

fn rank(a: &Walker, b: &Walker) -> Ordering {
    match (&a.key, &b.key) {
        (Some(x), Some(y)) => x.cmp(y),
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (None, None) => Ordering::Equal,
    }
    .then_with(|| a.name.cmp(&b.name))
}

/// The nodes before `me` in the walk that have not passed the revision and are waited for;
/// `me` may go while there are fewer than `max`.
pub(crate) fn ahead<'a>(me: &Walker, group: &'a [Walker]) -> Vec<&'a Walker> {
    group
        .iter()
        .filter(|w| w.name != me.name && rank(w, me) == Ordering::Less)
        .filter(|w| !w.done && !w.skipped)
        .collect()
}

/// The reason to wait, or `None` to go.
pub(crate) fn verdict(
    me: &Walker,
    group: &[Walker],
    max: u32,
    order: &str,
    revision: &Revision,
) -> Option<String> {
    let before = ahead(me, group);
    if before.len() < max as usize {
        return None;
    }
    let names: Vec<String> = before
        .iter()
        .map(|w| match &w.key {
            Some(k) if order != BY_NAME => format!("{} ({k})", w.name),
            _ => w.name.clone(),
        })
        .collect();
    Some(format!(
        "rollout.order ({order}): {} come(s) before this node and have not passed {} yet; at \
         most {max} at a time (a node held or not Ready is not waited for)",
        names.join(", "),
        revision.short()
    ))
}

/// Whether it is this node's turn in `rollout.order`, from the read model's Nodes: `None` to
/// go, else why not. `wall` is the wall clock, for the holds' ends.
pub(crate) fn check(
    cfg: &Config,
    nodes: &BTreeMap<String, NodeFacts>,
    fleet: Option<&FleetState>,
    revision: &Revision,
    later: &BTreeSet<Revision>,
    wall: Timestamp,
) -> Option<String> {
    let order = cfg.rollout.order.as_deref()?;
    let group = cfg.rollout.group_for(cfg.node.role);
    let me_name = cfg.node_name();
    let seen = Facts {
        prefix: &cfg.kubernetes.annotation_prefix,
        group: &group,
        order,
        fleet,
        revision,
        later,
        wall,
    };
    let walkers: Vec<Walker> = nodes
        .iter()
        .filter_map(|(name, n)| walker(&seen, name, n))
        .collect();
    let me = walkers
        .iter()
        .find(|w| w.name == me_name)
        .cloned()
        .unwrap_or_else(|| Walker {
            name: me_name.to_owned(),
            key: None,
            done: false,
            skipped: false,
        });
    verdict(&me, &walkers, cfg.rollout.max_concurrent, order, revision)
}

/// What a Node is judged against.
struct Facts<'a> {
    prefix: &'a str,
    group: &'a str,
    order: &'a str,
    fleet: Option<&'a FleetState>,
    revision: &'a Revision,
    later: &'a BTreeSet<Revision>,
    wall: Timestamp,
}

/// A Node as a walker of the group, or `None` when its ginx reports another group.
fn walker(f: &Facts<'_>, name: &str, n: &NodeFacts) -> Option<Walker> {
    let ann = |k: &str| n.annotation(f.prefix, k);
    if ann("rollout-group") != Some(f.group) {
        return None;
    }
    let key = (f.order != BY_NAME)
        .then(|| n.labels.get(f.order).cloned())
        .flatten();
    let passed: Option<Revision> = ann("passed-revision").and_then(|p| p.parse().ok());
    let done = super::after::done(passed.as_ref(), f.revision, f.later);
    let quarantined = ann("quarantined") == Some(f.revision.as_str());
    let held = f.fleet.is_some_and(|s| s.hold_of(name, f.wall).is_some());
    Some(Walker {
        name: name.to_owned(),
        key,
        done,
        skipped: !n.ready() || quarantined || held,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(name: &str, key: Option<&str>, done: bool, skipped: bool) -> Walker {
        Walker {
            name: name.into(),
            key: key.map(str::to_owned),
            done,
            skipped,
        }
    }

    fn rev() -> Revision {
        "a".repeat(40).parse().unwrap()
    }

    fn node(group: &str, rack: &str, passed: Option<&Revision>, ready: bool) -> NodeFacts {
        let mut annotations =
            BTreeMap::from([("ginx.io/rollout-group".to_owned(), group.to_owned())]);
        if let Some(p) = passed {
            annotations.insert("ginx.io/passed-revision".into(), p.as_str().to_owned());
        }
        let status = if ready { "True" } else { "False" };
        NodeFacts {
            labels: [("rack".to_owned(), rack.to_owned())].into(),
            annotations,
            conditions: [("Ready".to_owned(), (status.to_owned(), String::new()))].into(),
        }
    }

    /// From the read model alone: the walk by a label, a node of another group or not Ready
    /// not waited for, a pass of a later revision counted.
    #[test]
    fn the_turn_is_judged_from_the_read_model() {
        let mut cfg = Config::default();
        cfg.node.name = Some("w3".into());
        cfg.rollout.group = Some("workers".into());
        cfg.rollout.order = Some("rack".into());
        cfg.rollout.max_concurrent = 1;
        cfg.kubernetes.annotation_prefix = "ginx.io/".into();
        let r = rev();
        let b: Revision = "b".repeat(40).parse().unwrap();
        let mut nodes: BTreeMap<String, NodeFacts> = [
            ("w1".to_owned(), node("workers", "r1", None, true)),
            ("w2".to_owned(), node("workers", "r2", None, false)),
            ("cp1".to_owned(), node("control-plane", "r0", None, true)),
            ("w3".to_owned(), node("workers", "r3", None, true)),
        ]
        .into();
        let wall = Timestamp::from_second(1000).unwrap();
        let none = BTreeSet::new();
        let why = check(&cfg, &nodes, None, &r, &none, wall).unwrap();
        assert!(why.contains("w1 (r1) come(s) before this node"), "{why}");
        assert!(!why.contains("w2") && !why.contains("cp1"), "{why}");
        nodes.insert("w1".into(), node("workers", "r1", Some(&b), true));
        assert!(
            check(&cfg, &nodes, None, &r, &none, wall).is_some(),
            "b is not known later"
        );
        let later = BTreeSet::from([b]);
        assert_eq!(check(&cfg, &nodes, None, &r, &later, wall), None);
    }

    #[test]
    fn nodes_walk_by_label_then_name_a_missing_label_last() {
        let group = [
            w("w4", Some("b"), false, false),
            w("w1", Some("a"), false, false),
            w("w2", Some("a"), false, false),
            w("w9", None, false, false),
        ];
        let names = |me: &Walker| {
            ahead(me, &group)
                .iter()
                .map(|w| w.name.clone())
                .collect::<Vec<_>>()
        };
        assert!(names(&group[1]).is_empty(), "w1 (a) is first");
        assert_eq!(names(&group[2]), ["w1"]);
        assert_eq!(names(&group[0]), ["w1", "w2"]);
        assert_eq!(names(&group[3]), ["w4", "w1", "w2"], "no label: last");
    }

    #[test]
    fn a_node_goes_while_fewer_than_the_slots_before_it_have_not_passed() {
        let r = rev();
        let group = [
            w("w1", Some("a"), true, false),
            w("w2", Some("a"), false, false),
            w("w3", Some("b"), false, false),
            w("w4", Some("c"), false, false),
        ];
        assert!(verdict(&group[2], &group, 1, "zone", &r).is_some());
        let why = verdict(&group[3], &group, 1, "zone", &r).unwrap();
        assert_eq!(
            why,
            "rollout.order (zone): w2 (a), w3 (b) come(s) before this node and have not passed \
             aaaaaaaaaaaa yet; at most 1 at a time (a node held or not Ready is not waited for)"
        );
        assert_eq!(
            verdict(&group[2], &group, 2, "zone", &r),
            None,
            "two slots: w3 goes"
        );
        assert!(verdict(&group[3], &group, 2, "zone", &r).is_some());
        assert_eq!(verdict(&group[1], &group, 1, "zone", &r), None);
    }

    #[test]
    fn a_node_before_that_cannot_go_is_not_waited_for() {
        let r = rev();
        let group = [
            w("w1", Some("a"), false, true),
            w("w2", Some("b"), false, false),
        ];
        assert_eq!(verdict(&group[1], &group, 1, "zone", &r), None);
        let by_name = [w("w1", None, false, false), w("w2", None, false, false)];
        assert!(
            verdict(&by_name[1], &by_name, 1, BY_NAME, &r)
                .unwrap()
                .contains("w1 come(s)")
        );
    }
}
