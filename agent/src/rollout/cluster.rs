//! `ginxctl cluster`: the fleet as the API has it, in one [`ClusterView`] — every node ginx
//! reports on (a `<prefix>version` annotation or a heartbeat Lease) and every control-plane
//! node, with its readiness, `GinxHealthy`, ginx's annotations, the age of its heartbeat and
//! the rollout slot it holds; the slots; the fleet state of the `ginx-rollout` ConfigMap.
//!
//! Three reads (the Nodes, the Leases of `kubernetes.namespace`, the ConfigMap), then
//! [`build`], a pure function of what was read, the time and each Lease's age. A Lease's age is
//! how long this daemon has seen it unchanged on its own monotonic clock ([`Observed`]), never
//! its `renewTime` against this machine's wall clock: a node whose clock is off shows its true
//! age. A Lease seen for the first time has no age yet (shown as unknown; the next look has
//! one). Owns nothing in the cluster and writes nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::ListParams;

use crate::config::{Config, KubernetesConfig};
use crate::k8s::heartbeat::{PLAN_ANNOTATION, heartbeat_node};
use crate::k8s::{code, describe};
use crate::rollout::fleet::Fleet;
use crate::rollout::fleet::state::FleetState;
use crate::rollout::lock::lease::SLOT_GROUP_LABEL;
use crate::rollout::lock::slots::Observed;
use crate::status::{ClusterNode, ClusterView, FleetStatus, RevisionCounts};
use crate::types::{PlanMark, Role, plan_counts};

/// The label kubeadm puts on control-plane nodes.
pub const CONTROL_PLANE_LABEL: &str = "node-role.kubernetes.io/control-plane";
/// The prefix of slot Leases: `ginx-rollout-<group>-<slot>`.
const SLOT_PREFIX: &str = "ginx-rollout-";

/// Reads the Nodes, the Leases and the ConfigMap, and builds the view at the current time.
pub async fn view(
    client: &kube::Client,
    cfg: &Config,
    observed: &Mutex<Observed>,
) -> Result<ClusterView, String> {
    let k = &cfg.kubernetes;
    let forbidden = |what: &str, e: &kube::Error, needs: &str| match code(e) {
        Some(403) => format!(
            "cannot list {what}: {}; ginx needs {needs} — apply packaging/kubernetes/rbac.yaml",
            describe(e)
        ),
        _ => format!("cannot list {what}: {}", describe(e)),
    };
    let nodes = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(|e| forbidden("nodes", &e, "list on nodes (ClusterRole ginx-node-report)"))?
        .items;
    let leases = Api::<Lease>::namespaced(client.clone(), &k.namespace)
        .list(&ListParams::default())
        .await
        .map_err(|e| {
            forbidden(
                &format!("leases in {}", k.namespace),
                &e,
                "list on leases (Role ginx-rollout)",
            )
        })?
        .items;
    let fleet = Fleet::new(client.clone(), &k.namespace, &cfg.rollout.configmap);
    let state = fleet.read().await.map_err(|e| {
        let what = format!("cannot read ConfigMap {}: {}", fleet.object(), describe(&e));
        match code(&e) {
            Some(403) => format!(
                "{what}; ginx needs get on it (Role ginx-rollout) — apply \
                 packaging/kubernetes/rbac.yaml"
            ),
            _ => what,
        }
    })?;
    let now = Instant::now();
    let ages: BTreeMap<String, Option<Duration>> = {
        let mut seen = observed.lock().unwrap_or_else(|e| e.into_inner());
        leases
            .iter()
            .filter_map(|l| {
                let name = l.metadata.name.clone()?;
                let rv = l.metadata.resource_version.as_deref().unwrap_or("");
                let age = seen.age(&name, rv, now);
                Some((name, age))
            })
            .collect()
    };
    let age = |l: &Lease| {
        l.metadata
            .name
            .as_ref()
            .and_then(|n| ages.get(n).copied().flatten())
    };
    Ok(build(&nodes, &leases, state, cfg, crate::util::now(), &age))
}

/// How long a Lease has been seen unchanged (`None`: not known yet).
type LeaseAge<'a> = &'a dyn Fn(&Lease) -> Option<Duration>;

/// The view of `nodes`, `leases` and `fleet` at `now`; `age` says how long a Lease has been
/// seen unchanged (`None`: not known yet).
pub fn build(
    nodes: &[Node],
    leases: &[Lease],
    fleet: FleetState,
    cfg: &Config,
    now: Timestamp,
    age: LeaseAge<'_>,
) -> ClusterView {
    let k = &cfg.kubernetes;
    let by_name: BTreeMap<&str, &Lease> = leases
        .iter()
        .filter_map(|l| Some((l.metadata.name.as_deref()?, l)))
        .collect();
    let (slots, held) = held_slots(&by_name, age);
    let mut out: Vec<ClusterNode> = nodes
        .iter()
        .filter_map(|node| registered_node(node, k, &by_name, &held, age))
        .collect();
    let seen: BTreeSet<String> = out.iter().map(|n| n.name.clone()).collect();
    out.extend(unregistered_nodes(
        &k.lease_name,
        &by_name,
        &held,
        seen,
        age,
    ));
    out.sort_by(|a, b| a.name.cmp(&b.name));
    ClusterView {
        revisions: revision_counts(&out),
        plans: plan_counts(out.iter().filter_map(|n| n.plan.as_ref())),
        nodes: out,
        slots,
        fleet: FleetStatus::from(&fleet),
        at: Some(now),
    }
}

/// The slots held by a live holder, as `group/slot` → holder, and each holder's slots.
fn held_slots(
    by_name: &BTreeMap<&str, &Lease>,
    age: LeaseAge<'_>,
) -> (BTreeMap<String, String>, BTreeMap<String, Vec<String>>) {
    let mut slots = BTreeMap::new();
    let mut held: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, lease) in by_name {
        let Some((group, slot)) = slot_of(name, lease) else {
            continue;
        };
        if let Some(holder) = live_holder(lease, age(lease)) {
            let key = format!("{group}/{slot}");
            held.entry(holder.clone()).or_default().push(key.clone());
            slots.insert(key, holder);
        }
    }
    (slots, held)
}

/// The entry of a registered Node: one ginx reports on (a `version` annotation or a heartbeat)
/// or a control-plane node; `None` for any other node.
fn registered_node(
    node: &Node,
    k: &KubernetesConfig,
    by_name: &BTreeMap<&str, &Lease>,
    held: &BTreeMap<String, Vec<String>>,
    age: LeaseAge<'_>,
) -> Option<ClusterNode> {
    let name = node.metadata.name.as_deref()?;
    let prefix = k.annotation_prefix.as_str();
    let annotations = node.metadata.annotations.clone().unwrap_or_default();
    let annotation = |key: &str| annotations.get(&format!("{prefix}{key}")).cloned();
    let heartbeat = by_name.get(k.lease_name_for(name).as_str()).copied();
    let control_plane = node
        .metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(CONTROL_PLANE_LABEL));
    let reported = annotation("version").is_some() || heartbeat.is_some();
    if !(reported || control_plane) {
        return None;
    }
    let role = if control_plane {
        Some(Role::ControlPlane)
    } else {
        match annotation("role").as_deref() {
            Some("control-plane") => Some(Role::ControlPlane),
            Some("worker") => Some(Role::Worker),
            _ => None,
        }
    };
    let conditions = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default();
    let condition = |t: &str| conditions.iter().find(|c| c.type_ == t);
    let ready = condition("Ready").and_then(|c| match c.status.as_str() {
        "True" => Some(true),
        "False" => Some(false),
        _ => None,
    });
    let healthy = condition(&k.condition_type);
    Some(ClusterNode {
        name: name.to_owned(),
        role,
        ready,
        healthy: healthy.map(|c| c.status.clone()),
        health_reason: healthy.and_then(|c| c.reason.clone()),
        applied_revision: annotation("applied-revision"),
        target_revision: annotation("target-revision"),
        apply_state: annotation("apply-state"),
        rollout_phase: annotation("rollout-phase"),
        heartbeat_age_secs: heartbeat.and_then(|l| age_secs(age(l))),
        slot: held.get(name).map(|s| s.join(",")),
        waiting_for: annotation("waiting-for"),
        quarantined: annotation("quarantined"),
        group: annotation("rollout-group"),
        // Written by a newer or older ginx: what cannot be read is left out, not an error.
        gate: annotation("gate").and_then(|g| serde_json::from_str(&g).ok()),
        plan: heartbeat.and_then(plan_of),
    })
}

/// The nodes known only by their heartbeat Lease, not in `seen`: a ginx whose kubelet has not
/// registered the Node yet (a node being set up) still renews its heartbeat, and is part of
/// the fleet.
fn unregistered_nodes(
    lease_name: &str,
    by_name: &BTreeMap<&str, &Lease>,
    held: &BTreeMap<String, Vec<String>>,
    mut seen: BTreeSet<String>,
    age: LeaseAge<'_>,
) -> Vec<ClusterNode> {
    let mut out = Vec::new();
    for (name, lease) in by_name {
        if slot_of(name, lease).is_some() {
            continue;
        }
        let Some(node) = heartbeat_node(lease_name, name, lease) else {
            continue;
        };
        if !seen.insert(node.to_owned()) {
            continue;
        }
        out.push(ClusterNode {
            name: node.to_owned(),
            heartbeat_age_secs: age_secs(age(lease)),
            slot: held.get(node).map(|s| s.join(",")),
            plan: plan_of(lease),
            ..ClusterNode::default()
        });
    }
    out
}

/// The plan a heartbeat Lease tells ([`PLAN_ANNOTATION`]); one this ginx cannot read is left
/// out.
fn plan_of(lease: &Lease) -> Option<PlanMark> {
    let a = lease.metadata.annotations.as_ref()?;
    PlanMark::decode(a.get(PLAN_ANNOTATION)?)
}

/// Each target revision's nodes by where they are with it: from the rollout phase each node
/// reports (`ginx.io/rollout-phase`) for its target.
pub fn revision_counts(nodes: &[ClusterNode]) -> BTreeMap<String, RevisionCounts> {
    let mut out: BTreeMap<String, RevisionCounts> = BTreeMap::new();
    for n in nodes {
        let Some(target) = n.target_revision.clone() else {
            continue;
        };
        let c = out.entry(target.clone()).or_default();
        let applied = n.applied_revision.as_deref() == Some(target.as_str());
        match n.rollout_phase.as_deref().unwrap_or("") {
            "building" => c.building += 1,
            "applying" | "rolling-back" | "draining" | "rebooting" => c.activating += 1,
            "verifying" | "verifying-rollback" => c.verifying += 1,
            "quarantined" => c.quarantined += 1,
            "failed" | "rollback-unhealthy" | "rolled-back" | "lost" => c.failed += 1,
            "succeeded" => c.done += 1,
            "idle" if applied => c.done += 1,
            _ if n.apply_state.as_deref() == Some("failed") => c.failed += 1,
            _ => c.waiting += 1,
        }
    }
    out
}

/// `(group, slot)` of a slot Lease: the group from its label as the lock writes it (else from
/// the name), the slot from the name `ginx-rollout-<group>-<slot>`.
fn slot_of<'a>(name: &'a str, lease: &'a Lease) -> Option<(&'a str, u32)> {
    let rest = name.strip_prefix(SLOT_PREFIX)?;
    let labelled = lease
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(SLOT_GROUP_LABEL))
        .map(String::as_str);
    let (group, slot) = match labelled {
        Some(g) => (g, rest.strip_prefix(g)?.strip_prefix('-')?),
        None => rest.rsplit_once('-')?,
    };
    if group.is_empty() || slot.is_empty() || !slot.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((group, slot.parse().ok()?))
}

/// The holder of a slot `lease` unless the slot is free, by the lock's own rule
/// ([`crate::rollout::lock::slots::Slot::live_holder`]); a Lease of unknown age counts as live, as it does for
/// the lock.
fn live_holder(lease: &Lease, age: Option<Duration>) -> Option<String> {
    let spec = lease.spec.as_ref()?;
    crate::rollout::lock::slots::Slot {
        index: 0,
        holder: spec.holder_identity.clone(),
        unchanged_for: age.unwrap_or_default(),
        duration: Duration::from_secs(
            spec.lease_duration_seconds
                .and_then(|d| u64::try_from(d).ok())
                .unwrap_or(0),
        ),
        next: Vec::new(),
    }
    .live_holder()
    .map(str::to_owned)
}

/// Whole seconds of a Lease's age, when known.
fn age_secs(age: Option<Duration>) -> Option<i64> {
    age.map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::api::core::v1::{NodeCondition, NodeStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};

    use super::*;

    const NOW: &str = "2026-12-01T12:00:00Z";
    const REV: &str = "0123456789abcdef0123456789abcdef01234567";

    fn now() -> Timestamp {
        NOW.parse().unwrap()
    }

    fn node(
        name: &str,
        labels: &[&str],
        annotations: &[(&str, &str)],
        conds: &[(&str, &str, &str)],
    ) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                labels: Some(
                    labels
                        .iter()
                        .map(|l| ((*l).to_owned(), String::new()))
                        .collect(),
                ),
                annotations: Some(
                    annotations
                        .iter()
                        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                        .collect(),
                ),
                ..ObjectMeta::default()
            },
            status: Some(NodeStatus {
                conditions: Some(
                    conds
                        .iter()
                        .map(|(t, s, r)| NodeCondition {
                            type_: (*t).to_owned(),
                            status: (*s).to_owned(),
                            reason: Some((*r).to_owned()),
                            ..NodeCondition::default()
                        })
                        .collect(),
                ),
                ..NodeStatus::default()
            }),
            ..Node::default()
        }
    }

    /// A test's Lease ages: its `renewTime` against [`now`] (as if seen since then).
    fn by_renew_time(l: &Lease) -> Option<Duration> {
        let renewed = l.spec.as_ref()?.renew_time.as_ref()?.0;
        Some(now().duration_since(renewed).unsigned_abs())
    }

    fn lease(name: &str, holder: &str, secs_ago: i64, duration: i32) -> Lease {
        let renewed = now() - jiff::SignedDuration::from_secs(secs_ago);
        Lease {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.to_owned()),
                lease_duration_seconds: Some(duration),
                renew_time: Some(MicroTime(renewed)),
                ..LeaseSpec::default()
            }),
        }
    }

    #[test]
    fn nodes_carry_role_readiness_health_annotations_heartbeat_and_slot() {
        let nodes = [
            node(
                "lucy",
                &[CONTROL_PLANE_LABEL],
                &[
                    ("ginx.io/version", "0.1.0"),
                    ("ginx.io/applied-revision", REV),
                    ("ginx.io/target-revision", REV),
                    ("ginx.io/apply-state", "succeeded"),
                    ("ginx.io/rollout-phase", "applying"),
                ],
                &[
                    ("Ready", "True", "KubeletReady"),
                    ("GinxHealthy", "True", "AllProbesOk"),
                ],
            ),
            node(
                "w1",
                &[],
                &[("ginx.io/version", "0.1.0"), ("ginx.io/role", "worker")],
                &[
                    ("Ready", "Unknown", "NodeStatusUnknown"),
                    ("GinxHealthy", "False", "ProbesFailed"),
                ],
            ),
        ];
        let leases = [
            lease("ginx-lucy", "lucy", 3, 40),
            lease("ginx-w1", "w1", 120, 40),
            lease("ginx-rollout-control-plane-0", "lucy", 5, 60),
        ];
        let v = build(
            &nodes,
            &leases,
            FleetState::default(),
            &Config::default(),
            now(),
            &by_renew_time,
        );
        assert_eq!(v.at, Some(now()));
        let [lucy, w1] = v.nodes.as_slice() else {
            panic!("{:?}", v.nodes);
        };
        assert_eq!(lucy.name, "lucy");
        assert_eq!(lucy.role, Some(Role::ControlPlane));
        assert_eq!(lucy.ready, Some(true));
        assert_eq!(lucy.healthy.as_deref(), Some("True"));
        assert_eq!(lucy.health_reason.as_deref(), Some("AllProbesOk"));
        assert_eq!(lucy.applied_revision.as_deref(), Some(REV));
        assert_eq!(lucy.target_revision.as_deref(), Some(REV));
        assert_eq!(lucy.apply_state.as_deref(), Some("succeeded"));
        assert_eq!(lucy.rollout_phase.as_deref(), Some("applying"));
        assert_eq!(lucy.heartbeat_age_secs, Some(3));
        assert_eq!(lucy.slot.as_deref(), Some("control-plane/0"));
        assert_eq!(w1.role, Some(Role::Worker));
        assert_eq!(w1.ready, None, "Unknown is neither");
        assert_eq!(w1.healthy.as_deref(), Some("False"));
        assert_eq!(w1.heartbeat_age_secs, Some(120));
        assert_eq!(w1.slot, None);
        assert_eq!(
            v.slots,
            BTreeMap::from([("control-plane/0".to_owned(), "lucy".to_owned())])
        );
    }

    #[test]
    fn only_nodes_ginx_reports_on_and_control_plane_nodes_are_shown() {
        let nodes = [
            node("plain-worker", &[], &[], &[("Ready", "True", "")]),
            node("cp-without-ginx", &[CONTROL_PLANE_LABEL], &[], &[]),
            node("annotated", &[], &[("ginx.io/version", "0.1.0")], &[]),
            node("heartbeating", &[], &[], &[]),
        ];
        let leases = [
            lease("ginx-heartbeating", "heartbeating", 1, 40),
            // A ginx whose Node is not registered yet.
            lease("ginx-newcomer", "newcomer", 2, 40),
            // Not a heartbeat: the holder is not the node the name says.
            lease("ginx-something", "someone-else", 2, 40),
        ];
        let v = build(
            &nodes,
            &leases,
            FleetState::default(),
            &Config::default(),
            now(),
            &by_renew_time,
        );
        let names: Vec<&str> = v.nodes.iter().map(|n| n.name.as_str()).collect();
        assert_eq!(
            names,
            ["annotated", "cp-without-ginx", "heartbeating", "newcomer"]
        );
        let cp = &v.nodes[1];
        assert_eq!(cp.role, Some(Role::ControlPlane));
        assert_eq!(cp.heartbeat_age_secs, None);
        let newcomer = &v.nodes[3];
        assert_eq!((newcomer.role, newcomer.ready), (None, None));
        assert_eq!(newcomer.heartbeat_age_secs, Some(2));
        assert_eq!(v.nodes[0].role, None, "no label, no role annotation");
    }

    #[test]
    fn a_slot_is_free_when_unheld_or_expired() {
        let leases = [
            lease("ginx-rollout-worker-0", "w1", 10, 60),
            lease("ginx-rollout-worker-1", "w2", 62, 60),
            lease("ginx-rollout-worker-2", "", 1, 60),
            lease("ginx-rollout-edge-nodes-12", "e1", 0, 60),
            // Renewed one duration and a second ago (the server's stamps are whole seconds):
            // expired, as the lock sees it.
            lease("ginx-rollout-worker-3", "w4", 61, 60),
            lease("ginx-rollout-worker-x", "w3", 0, 60),
        ];
        let v = build(
            &[],
            &leases,
            FleetState::default(),
            &Config::default(),
            now(),
            &by_renew_time,
        );
        assert_eq!(
            v.slots,
            BTreeMap::from([
                ("edge-nodes/12".to_owned(), "e1".to_owned()),
                ("worker/0".to_owned(), "w1".to_owned()),
            ])
        );
        // Slot Leases are not heartbeats, even though their names fit ginx-{node}.
        assert!(v.nodes.is_empty(), "{:?}", v.nodes);
    }

    #[test]
    fn the_configured_names_are_used() {
        let mut cfg = Config::default();
        cfg.kubernetes.annotation_prefix = "example.com/".into();
        cfg.kubernetes.lease_name = "hb-{node}-ginx".into();
        cfg.kubernetes.condition_type = "FleetHealthy".into();
        let nodes = [node(
            "n1",
            &[],
            &[
                ("example.com/apply-state", "failed"),
                ("ginx.io/version", "x"),
            ],
            &[("FleetHealthy", "False", "ProbesFailed")],
        )];
        let leases = [lease("hb-n1-ginx", "n1", 4, 40)];
        let v = build(
            &nodes,
            &leases,
            FleetState::default(),
            &cfg,
            now(),
            &by_renew_time,
        );
        let n = &v.nodes[0];
        assert_eq!(n.apply_state.as_deref(), Some("failed"));
        assert_eq!(n.healthy.as_deref(), Some("False"));
        assert_eq!(n.heartbeat_age_secs, Some(4));
    }
}
