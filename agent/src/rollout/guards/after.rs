//! Order across groups (`rollout.after`): a group waits until every node of the groups it
//! comes after passed its gate on the revision (or on a later one). Every heartbeat Lease
//! labelled with such a group counts (a node removed for good has its heartbeat Lease
//! deleted); while waiting, those Leases are watched, so that the last pass wakes the group.
//!
//! Owns the read of those heartbeats, their watch, and the revision seen passed (it stays
//! passed). Does not own whether one revision is later than another: the daemon answers
//! that from the apply source's clone ([`Later`]).

use std::collections::BTreeSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use k8s_openapi::api::coordination::v1::Lease;
use tokio::sync::watch;

use crate::config::Config;
use crate::k8s::{HEARTBEAT_GROUP_LABEL, HEARTBEAT_PASSED_ANNOTATION, KubeClients};
use crate::rollout::decide::admission::Verdict;
use crate::rollout::lock::lease;
use crate::types::Revision;

/// `later(theirs, ours)`: whether `theirs` descends from `ours`.
pub type Later =
    Arc<dyn Fn(Revision, Revision) -> Pin<Box<dyn Future<Output = bool> + Send>> + Send + Sync>;

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

#[derive(Default)]
pub(crate) struct AfterGroups {
    /// The revision every group was seen to have passed.
    passed: Option<Revision>,
    /// The watch of the groups' heartbeats (groups, clients generation), while waiting.
    watching: Option<(Vec<String>, usize, watch::Sender<bool>)>,
}

impl AfterGroups {
    /// Whether `groups` still have to be asked about `revision`; the watch stops when not.
    pub fn pending(&mut self, groups: &[String], revision: &Revision) -> bool {
        if groups.is_empty() || self.passed.as_ref() == Some(revision) {
            self.watching = None;
            return false;
        }
        true
    }

    /// Reads the groups' heartbeats: `Ok(None)` when every node passed `revision`, else who is
    /// behind (and the heartbeats are watched); `Err` with the verdict for a failed read.
    pub async fn check(
        &mut self,
        cfg: &Config,
        clients: &KubeClients,
        revision: &Revision,
        later: Option<&Later>,
        wake: (usize, &watch::Sender<u64>),
    ) -> Result<Option<String>, Verdict> {
        let groups = cfg.rollout.after_for(cfg.node.role);
        let ns = &cfg.kubernetes.namespace;
        let api = kube::Api::<Lease>::namespaced(clients.main.clone(), ns);
        let selector = format!("{} in ({})", HEARTBEAT_GROUP_LABEL, groups.join(","));
        let leases = api
            .list(&kube::api::ListParams::default().labels(&selector))
            .await
            .map_err(|e| {
                super::list_failed(
                    cfg.rollout.on_api_unavailable,
                    &format!(
                        "the heartbeats of group(s) {} (rollout.after)",
                        groups.join(", ")
                    ),
                    &format!("leases in namespace {ns}"),
                    &e,
                )
            })?
            .items;
        let mut peers = Vec::with_capacity(leases.len());
        for l in &leases {
            peers.push(peer(l, revision, later).await);
        }
        let behind = behind(&peers, &groups);
        if behind.is_empty() {
            self.passed = Some(revision.clone());
            self.watching = None;
            return Ok(None);
        }
        self.watch(&groups, clients, ns, &selector, wake);
        Ok(Some(format!(
            "after {}: not every node passed its gate on {} yet: {}",
            groups.join(", "),
            revision.short(),
            behind.join(", ")
        )))
    }

    /// Watches the groups' heartbeat Leases (while waiting for them).
    fn watch(
        &mut self,
        groups: &[String],
        clients: &KubeClients,
        ns: &str,
        selector: &str,
        (generation, changes): (usize, &watch::Sender<u64>),
    ) {
        if self
            .watching
            .as_ref()
            .is_some_and(|(g, c, _)| g == groups && *c == generation)
        {
            return;
        }
        let stop_tx = watch_heartbeats(clients, ns, selector, changes);
        self.watching = Some((groups.to_vec(), generation, stop_tx));
    }
}

/// Watches the heartbeat Leases `selector` names, bumping `changes` when one's group or
/// passed revision changes (not its renewals), until the returned sender is dropped.
pub(crate) fn watch_heartbeats(
    clients: &KubeClients,
    ns: &str,
    selector: &str,
    changes: &watch::Sender<u64>,
) -> watch::Sender<bool> {
    let (stop_tx, mut stop) = watch::channel(false);
    let api = kube::Api::<Lease>::namespaced(clients.watch.clone(), ns);
    let changes = changes.clone();
    let selector = selector.to_owned();
    tokio::spawn(async move {
        tokio::select! {
            () = lease::watch_objects(api, selector, None, changes, Some(passed_of)) => {}
            _ = stop.changed() => {}
        }
    });
    stop_tx
}

/// A heartbeat Lease as a [`Peer`], asking `later` whether what it passed is later than ours.
async fn peer(l: &Lease, revision: &Revision, later: Option<&Later>) -> Peer {
    let group = l
        .metadata
        .labels
        .as_ref()
        .and_then(|m| m.get(HEARTBEAT_GROUP_LABEL))
        .cloned()
        .unwrap_or_default();
    let node = l
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.clone())
        .unwrap_or_else(|| l.metadata.name.clone().unwrap_or_default());
    let (passed, done) = passed(l, revision, later).await;
    Peer {
        group,
        node,
        passed,
        done,
    }
}

/// What a heartbeat Lease says its node passed, and whether that is `revision` or a later one
/// (as `later` answers).
pub(crate) async fn passed(
    l: &Lease,
    revision: &Revision,
    later: Option<&Later>,
) -> (Option<Revision>, bool) {
    let value = l
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(HEARTBEAT_PASSED_ANNOTATION));
    passed_value(value.map(String::as_str), revision, later).await
}

/// A passed revision as written (an annotation's value), and whether it is `revision` or a
/// later one.
pub(crate) async fn passed_value(
    value: Option<&str>,
    revision: &Revision,
    later: Option<&Later>,
) -> (Option<Revision>, bool) {
    let passed: Option<Revision> = value.and_then(|p| p.parse().ok());
    let done = match (&passed, later) {
        (Some(p), _) if p == revision => true,
        (Some(p), Some(later)) => later(p.clone(), revision.clone()).await,
        _ => false,
    };
    (passed, done)
}

/// What of a heartbeat Lease wakes a node waiting for its group: the group and the revision
/// passed, not the renewals.
fn passed_of(lease: &Lease) -> String {
    let m = &lease.metadata;
    format!(
        "{} {}",
        m.labels
            .as_ref()
            .and_then(|l| l.get(HEARTBEAT_GROUP_LABEL))
            .map_or("", String::as_str),
        m.annotations
            .as_ref()
            .and_then(|a| a.get(HEARTBEAT_PASSED_ANNOTATION))
            .map_or("", String::as_str)
    )
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
