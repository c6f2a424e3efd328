//! What the read model keeps of each object it watches, and which changes wake a waiting
//! node: a heartbeat's group or passed revision (not its renewals), a Node's labels, Ready and
//! ginx's annotations, the fleet state as decoded.

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Node};

use crate::k8s::reflect::Projection;
use crate::k8s::{HEARTBEAT_GROUP_LABEL, HEARTBEAT_PASSED_ANNOTATION};
use crate::rollout::fleet::configmap::decode_lenient;
use crate::rollout::fleet::plan_requests;
use crate::rollout::fleet::state::FleetState;
use crate::types::{PlanRequest, Revision};

/// A heartbeat Lease, as the guards read it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Heartbeat {
    /// The Lease's name.
    pub name: String,
    /// Its holder: the node, as ginx writes it.
    pub holder: Option<String>,
    pub group: String,
    pub passed: Option<Revision>,
    /// When it was last renewed, in the API server's time (compared only with other
    /// heartbeats' renewals, never with this machine's clock).
    pub renewed: Option<Timestamp>,
    pub duration_secs: i64,
}

impl Heartbeat {
    /// The node whose heartbeat this is, by `pattern` (`kubernetes.lease_name`, with
    /// `{node}`): the name fits the pattern and the holder is that node.
    pub fn node_by(&self, pattern: &str) -> Option<&str> {
        crate::k8s::heartbeat::node_of(pattern, &self.name, self.holder.as_deref())
    }

    /// The node as the `after` groups name it: the holder, else the Lease's name.
    pub fn node(&self) -> &str {
        self.holder.as_deref().unwrap_or(&self.name)
    }
}

/// How far `one` trails the freshest heartbeat of `all`, in whole seconds (see
/// [`Freshness`](crate::k8s::heartbeat::Freshness)).
pub fn lag_secs<'a>(all: impl Iterator<Item = &'a Heartbeat>, one: &Heartbeat) -> Option<i64> {
    crate::k8s::heartbeat::Freshness::of_times(all.map(|h| h.renewed)).lag_of(one.renewed)
}

fn heartbeat(l: &Lease) -> Option<Heartbeat> {
    let spec = l.spec.as_ref();
    Some(Heartbeat {
        name: l.metadata.name.clone()?,
        holder: spec.and_then(|s| s.holder_identity.clone()),
        group: l
            .metadata
            .labels
            .as_ref()?
            .get(HEARTBEAT_GROUP_LABEL)?
            .clone(),
        passed: l
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(HEARTBEAT_PASSED_ANNOTATION))
            .and_then(|p| p.parse().ok()),
        renewed: spec.and_then(|s| s.renew_time.as_ref()).map(|t| t.0),
        duration_secs: spec
            .and_then(|s| s.lease_duration_seconds)
            .map_or(40, i64::from),
    })
}

/// Heartbeats: a change of group or passed revision (or holder) wakes; a renewal does not.
pub const HEARTBEATS: Projection<Lease, Heartbeat> = Projection {
    keep: heartbeat,
    wakes: |a, b| a.group != b.group || a.passed != b.passed || a.holder != b.holder,
};

/// The annotations ginx writes on a Node that the guards read, by the name after the
/// configured prefix (`kubernetes.annotation_prefix`).
pub const NODE_ANNOTATIONS: [&str; 4] = ["rollout-group", "passed-revision", "quarantined", "role"];

/// A Node, as the guards read it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeFacts {
    pub labels: BTreeMap<String, String>,
    /// Its annotations whose name ends in one of [`NODE_ANNOTATIONS`], by full name.
    pub annotations: BTreeMap<String, String>,
    /// Its conditions: type → (status, reason).
    pub conditions: BTreeMap<String, (String, String)>,
}

impl NodeFacts {
    /// The annotation `name` under `prefix`.
    pub fn annotation(&self, prefix: &str, name: &str) -> Option<&str> {
        self.annotations
            .get(&format!("{prefix}{name}"))
            .map(String::as_str)
    }

    /// Its `Ready` condition is `True`.
    pub fn ready(&self) -> bool {
        self.conditions
            .get("Ready")
            .is_some_and(|(s, _)| s == "True")
    }
}

fn node(n: &Node) -> Option<NodeFacts> {
    let annotations = n
        .metadata
        .annotations
        .iter()
        .flatten()
        .filter(|(k, _)| NODE_ANNOTATIONS.iter().any(|a| k.ends_with(a)))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let conditions = n
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .iter()
        .copied()
        .flatten()
        .map(|c| {
            let reason = c.reason.clone().unwrap_or_default();
            (c.type_.clone(), (c.status.clone(), reason))
        })
        .collect();
    Some(NodeFacts {
        labels: n.metadata.labels.clone().unwrap_or_default(),
        annotations,
        conditions,
    })
}

/// Nodes: any change of what is kept wakes (a kubelet's status beats, which only move the
/// conditions' times, do not change it).
pub const NODES: Projection<Node, NodeFacts> = Projection {
    keep: node,
    wakes: |a, b| a != b,
};

/// The fleet ConfigMap, as its readers read it: the rollout's state, and the plan requests
/// standing in it (each read only when sound).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FleetSeen {
    pub state: FleetState,
    pub requests: BTreeMap<String, PlanRequest>,
}

fn fleet(cm: &ConfigMap) -> Option<FleetSeen> {
    let data = cm.data.clone().unwrap_or_default();
    Some(FleetSeen {
        state: decode_lenient(&data).0,
        requests: plan_requests::decode(&data),
    })
}

/// The fleet ConfigMap: any change wakes.
pub const FLEET: Projection<ConfigMap, FleetSeen> = Projection {
    keep: fleet,
    wakes: |a, b| a != b,
};

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    fn lease(name: &str, holder: &str, group: &str, passed: Option<&str>, at: i64) -> Lease {
        let mut l = Lease::default();
        l.metadata.name = Some(name.into());
        l.metadata.labels = Some([(HEARTBEAT_GROUP_LABEL.to_owned(), group.to_owned())].into());
        l.metadata.annotations =
            passed.map(|p| [(HEARTBEAT_PASSED_ANNOTATION.to_owned(), p.to_owned())].into());
        l.spec = Some(LeaseSpec {
            holder_identity: Some(holder.into()),
            renew_time: Some(MicroTime(Timestamp::from_second(at).unwrap())),
            lease_duration_seconds: Some(40),
            ..LeaseSpec::default()
        });
        l
    }

    #[test]
    fn a_heartbeat_keeps_its_group_pass_and_renewal_and_only_a_pass_wakes() {
        let a = "a".repeat(40);
        let h = heartbeat(&lease("ginx-w1", "w1", "workers", Some(&a), 100)).unwrap();
        assert_eq!(h.group, "workers");
        assert_eq!(h.passed.as_ref().map(Revision::as_str), Some(a.as_str()));
        assert_eq!(h.node_by("ginx-{node}"), Some("w1"));
        assert_eq!(h.node_by("hb-{node}"), None);
        let renewed = heartbeat(&lease("ginx-w1", "w1", "workers", Some(&a), 110)).unwrap();
        assert!(!(HEARTBEATS.wakes)(&h, &renewed), "a renewal");
        let passed = heartbeat(&lease(
            "ginx-w1",
            "w1",
            "workers",
            Some(&"b".repeat(40)),
            110,
        ));
        assert!((HEARTBEATS.wakes)(&h, &passed.unwrap()));
        let mut unlabelled = lease("x", "x", "g", None, 1);
        unlabelled.metadata.labels = None;
        assert_eq!(heartbeat(&unlabelled), None, "not a heartbeat");
    }

    #[test]
    fn lag_is_measured_against_the_freshest_heartbeat() {
        let hs: Vec<Heartbeat> = [("a", 100), ("b", 160)]
            .iter()
            .map(|(n, t)| heartbeat(&lease(n, n, "g", None, *t)).unwrap())
            .collect();
        assert_eq!(lag_secs(hs.iter(), &hs[0]), Some(60));
        assert_eq!(lag_secs(hs.iter(), &hs[1]), Some(0));
    }

    #[test]
    fn a_node_keeps_only_ginx_annotations_and_its_readiness() {
        let mut n = Node::default();
        n.metadata.name = Some("w1".into());
        n.metadata.annotations = Some(
            [
                ("ginx.io/passed-revision", "x"),
                ("kubeadm.alpha.kubernetes.io/cri-socket", "y"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect(),
        );
        let f = node(&n).unwrap();
        assert_eq!(f.annotation("ginx.io/", "passed-revision"), Some("x"));
        assert_eq!(f.annotations.len(), 1);
        assert!(!f.ready(), "no condition: not Ready");
    }
}
