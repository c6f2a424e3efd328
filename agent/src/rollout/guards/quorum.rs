//! The control-plane quorum guard: before a control-plane node takes its slot, every other
//! control-plane node must be Ready and report `GinxHealthy=True`, and the API must answer
//! `/readyz` through the VIP. Taking a control-plane node down while another is unhealthy is
//! how a rollout loses etcd quorum.
//!
//! Admission judges the Nodes as the read model watched them; the last look before a
//! disruption lists them afresh, so that what it stakes the cluster on is the API's answer of
//! that moment, not a watch's.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::ListParams;

use crate::config::Config;
use crate::k8s::{KubeClients, describe, readyz};
use crate::rollout::view;

/// The label kubeadm puts on control-plane nodes.
pub const CONTROL_PLANE_LABEL: &str = "node-role.kubernetes.io/control-plane";

/// What the guard needs to know of a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeFacts {
    pub name: String,
    pub control_plane: bool,
    /// The Ready condition's status (`True`, `False`, `Unknown`), if any.
    pub ready: Option<String>,
    /// The `GinxHealthy` condition's status and reason.
    pub healthy: Option<(String, String)>,
    /// The rollout group ginx reports for it (`ginx.io/rollout-group`); `None` for a node ginx
    /// does not report on.
    pub group: Option<String>,
}

impl NodeFacts {
    /// A Node as the read model keeps it.
    pub fn seen(name: &str, node: &view::NodeFacts, cfg: &Config) -> Self {
        let prefix = &cfg.kubernetes.annotation_prefix;
        Self {
            name: name.to_owned(),
            control_plane: node.labels.contains_key(CONTROL_PLANE_LABEL)
                || node.annotation(prefix, "role") == Some("control-plane"),
            ready: node.conditions.get("Ready").map(|(s, _)| s.clone()),
            healthy: node.conditions.get(&cfg.kubernetes.condition_type).cloned(),
            group: node.annotation(prefix, "rollout-group").map(str::to_owned),
        }
    }

    pub fn of(node: &Node, cfg: &Config) -> Self {
        let meta = &node.metadata;
        let role_annotation = format!("{}role", cfg.kubernetes.annotation_prefix);
        let group_annotation = format!("{}rollout-group", cfg.kubernetes.annotation_prefix);
        let control_plane = meta
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key(CONTROL_PLANE_LABEL))
            || meta
                .annotations
                .as_ref()
                .and_then(|a| a.get(&role_annotation))
                .is_some_and(|r| r == "control-plane");
        let conditions = node.status.as_ref().and_then(|s| s.conditions.as_ref());
        let find = |t: &str| conditions.and_then(|c| c.iter().find(|c| c.type_ == t));
        Self {
            name: meta.name.clone().unwrap_or_default(),
            control_plane,
            ready: find("Ready").map(|c| c.status.clone()),
            healthy: find(&cfg.kubernetes.condition_type)
                .map(|c| (c.status.clone(), c.reason.clone().unwrap_or_default())),
            group: meta
                .annotations
                .as_ref()
                .and_then(|a| a.get(&group_annotation))
                .cloned(),
        }
    }
}

/// Why the other control-plane nodes of `group` (and those ginx does not report on) do not
/// allow `me` to proceed; `None` when they do.
pub fn blockers(nodes: &[NodeFacts], me: &str, group: &str, condition: &str) -> Option<String> {
    let mut why = Vec::new();
    let peers = nodes.iter().filter(|n| {
        n.control_plane && n.name != me && n.group.as_deref().is_none_or(|g| g == group)
    });
    for n in peers {
        if n.ready.as_deref() != Some("True") {
            why.push(format!(
                "{} is not Ready ({})",
                n.name,
                n.ready.as_deref().unwrap_or("no Ready condition")
            ));
        } else {
            match &n.healthy {
                Some((s, _)) if s == "True" => {}
                Some((s, reason)) => why.push(format!("{} is {condition}={s} ({reason})", n.name)),
                None => why.push(format!("{} reports no {condition} condition", n.name)),
            }
        }
    }
    (!why.is_empty()).then(|| why.join("; "))
}

/// Checks the guard: the Nodes as `seen` by the read model (`None`: listed afresh), then
/// `/readyz` through the VIP. `Ok(None)` passes, `Ok(Some(reason))` waits, `Err` means the API
/// could not be asked.
pub async fn check(
    clients: &KubeClients,
    cfg: &Config,
    seen: Option<&BTreeMap<String, view::NodeFacts>>,
) -> Result<Option<String>, crate::rollout::lock::lease::LockError> {
    let facts = match seen {
        Some(nodes) => nodes
            .iter()
            .map(|(name, n)| NodeFacts::seen(name, n, cfg))
            .collect(),
        None => list(clients, cfg).await?,
    };
    let group = cfg.rollout.group_for(cfg.node.role);
    if let Some(why) = blockers(
        &facts,
        cfg.node_name(),
        &group,
        &cfg.kubernetes.condition_type,
    ) {
        return Ok(Some(why));
    }
    let timeout = cfg.kubernetes.request_timeout.get();
    match tokio::time::timeout(timeout, readyz(&clients.vip)).await {
        Ok(Ok(())) => Ok(None),
        Ok(Err(e)) => Ok(Some(format!("the API through the VIP is not ready: {e}"))),
        Err(_) => Ok(Some(
            "the API through the VIP does not answer /readyz".to_owned(),
        )),
    }
}

/// Every Node, listed now.
async fn list(
    clients: &KubeClients,
    cfg: &Config,
) -> Result<Vec<NodeFacts>, crate::rollout::lock::lease::LockError> {
    let nodes = Api::<Node>::all(clients.main.clone())
        .list(&ListParams::default())
        .await
        .map_err(|e| {
            if crate::k8s::unavailable(&e) {
                crate::rollout::lock::lease::LockError::Unavailable(format!(
                    "quorum guard: cannot list the nodes: {}",
                    describe(&e)
                ))
            } else {
                crate::rollout::lock::lease::LockError::Refused(format!(
                    "quorum guard: {}",
                    crate::k8s::refusal("list", "nodes", &e)
                ))
            }
        })?;
    Ok(nodes.items.iter().map(|n| NodeFacts::of(n, cfg)).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, cp: bool, ready: &str, healthy: Option<&str>) -> NodeFacts {
        NodeFacts {
            name: name.into(),
            control_plane: cp,
            ready: Some(ready.into()),
            healthy: healthy.map(|s| (s.into(), "ProbesFailed".into())),
            group: None,
        }
    }

    #[test]
    fn all_others_ready_and_healthy_pass() {
        let n = [
            node("lucy", true, "False", None),
            node("makise", true, "True", Some("True")),
            node("quinn", true, "True", Some("True")),
            node("w1", false, "False", None),
        ];
        assert_eq!(blockers(&n, "lucy", "cp", "GinxHealthy"), None);
    }

    #[test]
    fn a_not_ready_peer_blocks_and_is_named() {
        let n = [
            node("lucy", true, "True", Some("True")),
            node("makise", true, "False", Some("True")),
        ];
        let why = blockers(&n, "lucy", "cp", "GinxHealthy").unwrap();
        assert!(why.contains("makise is not Ready"), "{why}");
    }

    #[test]
    fn an_unhealthy_or_silent_peer_blocks() {
        let n = [
            node("makise", true, "True", Some("False")),
            node("quinn", true, "True", None),
        ];
        let why = blockers(&n, "lucy", "cp", "GinxHealthy").unwrap();
        assert!(why.contains("makise is GinxHealthy=False"), "{why}");
        assert!(why.contains("quinn reports no GinxHealthy"), "{why}");
    }

    #[test]
    fn control_plane_nodes_of_another_group_do_not_count() {
        let mut other = node("far", true, "False", None);
        other.group = Some("rack-b".into());
        let mut same = node("near", true, "False", None);
        same.group = Some("cp".into());
        assert_eq!(
            blockers(std::slice::from_ref(&other), "lucy", "cp", "GinxHealthy"),
            None
        );
        assert!(
            blockers(&[other, same], "lucy", "cp", "GinxHealthy")
                .unwrap()
                .contains("near")
        );
    }

    #[test]
    fn workers_do_not_count() {
        let n = [node("w1", false, "False", Some("False"))];
        assert_eq!(blockers(&n, "lucy", "cp", "GinxHealthy"), None);
    }
}
