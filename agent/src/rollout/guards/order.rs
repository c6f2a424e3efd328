//! A deterministic walk through a group (`rollout.order`): the nodes of a group sorted by a
//! Node label's value (then by name; a node without the label last), or by name alone
//! (`"name"`). A node starts a revision only while fewer than `max_concurrent` of the nodes
//! before it have not passed it: so with one slot the group goes one node after the other in
//! that order, and with N slots in waves of N. A node before it that is held, not Ready,
//! quarantined on the revision or no longer in the group is not waited for: the walk never
//! stalls on a node that cannot go.
//!
//! Read from the Nodes (their labels, and the annotations each node's ginx writes: its group,
//! the revision it passed, a quarantine). Owns the decision ([`ahead`], pure) and that read.
//! The slots are untouched: order decides who may take one, `max_concurrent` still bounds how
//! many are taken.

use std::cmp::Ordering;

use k8s_openapi::api::core::v1::Node;

use super::after::Later;
use crate::config::Config;
use crate::k8s::KubeClients;
use crate::rollout::decide::admission::Verdict;
use crate::rollout::fleet::state::FleetState;
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

/// Reads the group's Nodes and answers: `Ok(None)` to go, else why not.
pub(crate) async fn check(
    cfg: &Config,
    clients: &KubeClients,
    fleet: Option<&FleetState>,
    revision: &Revision,
    later: Option<&Later>,
) -> Result<Option<String>, Verdict> {
    let Some(order) = &cfg.rollout.order else {
        return Ok(None);
    };
    let api = kube::Api::<Node>::all(clients.main.clone());
    let nodes = api
        .list(&kube::api::ListParams::default())
        .await
        .map_err(|e| {
            super::list_failed(
                cfg.rollout.on_api_unavailable,
                "the Nodes for rollout.order",
                "nodes",
                &e,
            )
        })?
        .items;
    let group = cfg.rollout.group_for(cfg.node.role);
    let me_name = cfg.node_name();
    let mut walkers = Vec::new();
    for n in &nodes {
        if let Some(w) = walker(cfg, n, &group, order, fleet, revision, later).await {
            walkers.push(w);
        }
    }
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
    Ok(verdict(
        &me,
        &walkers,
        cfg.rollout.max_concurrent,
        order,
        revision,
    ))
}

/// A Node as a walker of `group`, or `None` when its ginx reports another group.
async fn walker(
    cfg: &Config,
    n: &Node,
    group: &str,
    order: &str,
    fleet: Option<&FleetState>,
    revision: &Revision,
    later: Option<&Later>,
) -> Option<Walker> {
    let name = n.metadata.name.clone()?;
    let prefix = &cfg.kubernetes.annotation_prefix;
    let ann = |k: &str| {
        n.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(&format!("{prefix}{k}")))
            .cloned()
    };
    if ann("rollout-group").as_deref() != Some(group) {
        return None;
    }
    let key = if order == BY_NAME {
        None
    } else {
        n.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(order))
            .cloned()
    };
    let passed = ann("passed-revision");
    let (_, done) = super::after::passed_value(passed.as_deref(), revision, later).await;
    let ready = n
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True");
    let quarantined = ann("quarantined").as_deref() == Some(revision.as_str());
    let held = fleet.is_some_and(|f| f.hold_of(&name, crate::util::now()).is_some());
    Some(Walker {
        name,
        key,
        done,
        skipped: !ready || quarantined || held,
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
