//! Cordon, drain and uncordon, the way `kubectl drain` does them, for a reboot.
//!
//! - Cordon sets `spec.unschedulable` and, only when ginx is the one that made the node
//!   unschedulable, the annotation [`CORDONED_BY`]; uncordon undoes only that. A node an admin
//!   cordoned stays cordoned. Both patches carry the `resourceVersion` read
//!   (`k8s::replace_with_retry`), so a concurrent change by an admin is never overwritten (a
//!   409 is read again).
//! - The drain lists the node's pods, skips DaemonSet-managed and mirror pods, refuses (unless
//!   configured) pods without a controller and pods with emptyDir, and evicts the rest
//!   through the Eviction API (`policy/v1`, `pods/<name>/eviction`). The Eviction body is
//!   built here, with `deleteOptions` spelled as the API wants it (kube-rs's `evict` helper
//!   sends `delete_options`, and the grace period is lost). A 429 means a
//!   PodDisruptionBudget forbids it now; the caller tries again later, and never deletes.
//!
//! Only the Kubernetes side: when to drain, how long, and what status says meanwhile are the
//! reboot's (`draining`, `decide`). Pure parts ([`plan`], [`selects`]) are unit-tested; the
//! rest runs against the real control plane in tests/reboot.rs.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::Api;
use kube::api::ListParams;
use serde_json::json;

use crate::k8s::{ApiError, Edit, EditError, code, describe, replace_with_retry};
use crate::status::WaitingFor;

pub use crate::k8s::CORDONED_BY;

/// The kubelet's annotation on a static pod's mirror.
pub const MIRROR: &str = "kubernetes.io/config.mirror";

/// A pod to be evicted.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl std::fmt::Display for PodRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// What a drain does with the pods on the node now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// To be evicted.
    pub evict: Vec<PodRef>,
    /// Being deleted already: waited for.
    pub terminating: Vec<PodRef>,
    /// Left alone (DaemonSet, mirror pods): `namespace/name`.
    pub skipped: Vec<String>,
    /// Not evicted without a setting: `namespace/name` → why, and what to set.
    pub refused: BTreeMap<String, String>,
}

impl Plan {
    /// Nothing left to evict or wait for (refused pods hold the drain; see `refused`).
    pub fn done(&self) -> bool {
        self.evict.is_empty() && self.terminating.is_empty() && self.refused.is_empty()
    }
}

fn pod_ref(p: &Pod) -> PodRef {
    PodRef {
        namespace: p.metadata.namespace.clone().unwrap_or_default(),
        name: p.metadata.name.clone().unwrap_or_default(),
        uid: p.metadata.uid.clone().unwrap_or_default(),
    }
}

/// The drain of `pods` (those on the node), as `kubectl drain` decides it.
pub fn plan(pods: &[Pod], force: bool, delete_emptydir_data: bool) -> Plan {
    let mut out = Plan::default();
    for p in pods {
        let r = pod_ref(p);
        let meta = &p.metadata;
        let mirror = meta
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(MIRROR));
        let controller = meta
            .owner_references
            .as_ref()
            .and_then(|o| o.iter().find(|o| o.controller == Some(true)));
        if mirror || controller.is_some_and(|c| c.kind == "DaemonSet") {
            out.skipped.push(r.to_string());
            continue;
        }
        if meta.deletion_timestamp.is_some() {
            out.terminating.push(r);
            continue;
        }
        let finished = p
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .is_some_and(|ph| ph == "Succeeded" || ph == "Failed");
        if controller.is_none() && !force && !finished {
            out.refused.insert(
                r.to_string(),
                "no controller manages it, so it would not come back anywhere; set \
                 reboot.force = true to evict it anyway"
                    .into(),
            );
            continue;
        }
        let emptydir = p
            .spec
            .as_ref()
            .is_some_and(|s| s.volumes.iter().flatten().any(|v| v.empty_dir.is_some()));
        if emptydir && !delete_emptydir_data && !finished {
            out.refused.insert(
                r.to_string(),
                "it has an emptyDir volume, whose data an eviction deletes; set \
                 reboot.delete_emptydir_data = true to evict it anyway"
                    .into(),
            );
            continue;
        }
        out.evict.push(r);
    }
    out
}

/// Whether `selector` selects a pod with `labels` (matchLabels and matchExpressions; an
/// empty selector selects everything, as for a PodDisruptionBudget in `policy/v1`).
pub fn selects(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let labels_ok = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let exprs_ok = selector.match_expressions.iter().flatten().all(|e| {
        let value = labels.get(&e.key);
        let values = e.values.as_deref().unwrap_or_default();
        match e.operator.as_str() {
            "In" => value.is_some_and(|v| values.contains(v)),
            "NotIn" => value.is_none_or(|v| !values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            _ => false,
        }
    });
    labels_ok && exprs_ok
}

/// The pods bound to `node`, in every namespace.
pub async fn pods_on(client: &kube::Client, node: &str) -> Result<Vec<Pod>, DrainError> {
    let lp = ListParams::default().fields(&format!("spec.nodeName={node}"));
    Api::<Pod>::all(client.clone())
        .list(&lp)
        .await
        .map(|l| l.items)
        .map_err(|e| forbidden_or(&e, "list pods on the node", "pods list"))
}

/// The running pods on `node` that match the label selector `selector`: `namespace/name`.
pub async fn blocking(
    client: &kube::Client,
    node: &str,
    selector: &str,
) -> Result<Vec<String>, DrainError> {
    let lp = ListParams::default()
        .fields(&format!("spec.nodeName={node}"))
        .labels(selector);
    let pods = Api::<Pod>::all(client.clone())
        .list(&lp)
        .await
        .map_err(|e| {
            forbidden_or(
                &e,
                &format!("list the pods matching reboot.blocking_pod_selector {selector:?}"),
                "pods list",
            )
        })?;
    Ok(pods
        .items
        .iter()
        .filter(|p| {
            p.status
                .as_ref()
                .and_then(|s| s.phase.as_deref())
                .is_none_or(|ph| ph == "Running" || ph == "Pending")
        })
        .map(|p| pod_ref(p).to_string())
        .collect())
}

/// What came of one eviction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Eviction {
    /// The API accepted it: the pod is being deleted.
    Accepted,
    /// The pod is gone already (or is another pod now, under the same name).
    Gone,
    /// A PodDisruptionBudget forbids it now (429), with the API's message.
    Refused(String),
}

/// Evicts `pod` through the Eviction API; the UID precondition makes sure it is that pod.
pub async fn evict(
    client: &kube::Client,
    pod: &PodRef,
    grace: Option<Duration>,
) -> Result<Eviction, DrainError> {
    let mut delete_options = json!({ "preconditions": { "uid": pod.uid } });
    if let Some(g) = grace {
        delete_options["gracePeriodSeconds"] = json!(g.as_secs());
    }
    let body = json!({
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": { "name": pod.name, "namespace": pod.namespace },
        "deleteOptions": delete_options,
    });
    let api = Api::<Pod>::namespaced(client.clone(), &pod.namespace);
    match api
        .create_subresource::<_, serde_json::Value>(
            "eviction",
            &pod.name,
            &crate::k8s::post_params(),
            &body,
        )
        .await
    {
        Ok(_) => Ok(Eviction::Accepted),
        // 404: gone; 409: the UID precondition failed, it is another pod now.
        Err(e) if matches!(code(&e), Some(404 | 409)) => Ok(Eviction::Gone),
        Err(e) if code(&e) == Some(429) => Ok(Eviction::Refused(match &e {
            kube::Error::Api(s) => s.message.clone(),
            _ => describe(&e),
        })),
        Err(e) => Err(forbidden_or(
            &e,
            &format!("evict pod {pod}"),
            "pods/eviction create",
        )),
    }
}

/// The PodDisruptionBudgets that select `pod`, each with what it allows now (for the report
/// of what holds a drain).
pub async fn budgets_for(client: &kube::Client, pod: &Pod) -> Result<Vec<String>, DrainError> {
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    let list = Api::<PodDisruptionBudget>::namespaced(client.clone(), &ns)
        .list(&ListParams::default())
        .await
        .map_err(|e| forbidden_or(&e, "list PodDisruptionBudgets", "poddisruptionbudgets list"))?;
    Ok(list
        .items
        .iter()
        .filter(|b| {
            b.spec
                .as_ref()
                .and_then(|s| s.selector.as_ref())
                .is_some_and(|s| selects(s, &labels))
        })
        .map(|b| {
            let name = b.metadata.name.clone().unwrap_or_default();
            match &b.status {
                Some(s) => format!(
                    "{ns}/{name} (allows {} disruption(s); {} of {} wanted healthy)",
                    s.disruptions_allowed.unwrap_or(0),
                    s.current_healthy.unwrap_or(0),
                    s.desired_healthy.unwrap_or(0)
                ),
                None => format!("{ns}/{name}"),
            }
        })
        .collect())
}

/// Makes `node` unschedulable. Returns whether ginx did (and so marked it with
/// [`CORDONED_BY`]); `false` when it was unschedulable already and not by ginx, which leaves it
/// that way for its admin.
pub async fn cordon(client: &kube::Client, node: &str) -> Result<bool, DrainError> {
    let api = Api::<Node>::all(client.clone());
    let resource = format!("node {node}");
    let written = replace_with_retry(&api, node, &resource, None, |n| {
        let Some(n) = n else {
            return Err(format!("cannot read node {node}: it does not exist"));
        };
        if n.spec.as_ref().and_then(|s| s.unschedulable) == Some(true) {
            return Ok(Edit::Keep(cordoned_by_ginx(&n)));
        }
        let patch = json!({
            "metadata": { "annotations": { CORDONED_BY: jiff::Timestamp::now().to_string() } },
            "spec": { "unschedulable": true },
        });
        Ok(Edit::Patch(patch, true))
    })
    .await
    .map_err(|e| node_error(e, node, "cordon"))?;
    Ok(written.value)
}

/// Makes `node` schedulable again, only if ginx cordoned it ([`CORDONED_BY`]). Returns
/// whether it changed anything.
pub async fn uncordon(client: &kube::Client, node: &str) -> Result<bool, DrainError> {
    let api = Api::<Node>::all(client.clone());
    let resource = format!("node {node}");
    let written = replace_with_retry(&api, node, &resource, None, |n| {
        Ok::<_, String>(match n {
            Some(n) if cordoned_by_ginx(&n) => {
                let patch = json!({
                    "metadata": { "annotations": { CORDONED_BY: null } },
                    "spec": { "unschedulable": null },
                });
                Edit::Patch(patch, true)
            }
            _ => Edit::Keep(false),
        })
    })
    .await
    .map_err(|e| node_error(e, node, "uncordon"))?;
    Ok(written.value)
}

/// Whether ginx is the one that made `n` unschedulable.
fn cordoned_by_ginx(n: &Node) -> bool {
    n.metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(CORDONED_BY))
}

/// A failed cordon or uncordon (`what`) of `node`, in words.
fn node_error(e: EditError<String>, node: &str, what: &str) -> DrainError {
    match e {
        EditError::Edit(e) => DrainError::Failed(e),
        EditError::Api(ApiError::Conflict { .. }) => {
            DrainError::Failed(format!("node {node} kept changing while ginx {what}ed it"))
        }
        EditError::Api(e) => {
            let (doing, rule) = match &e {
                ApiError::Refused { verb, .. } | ApiError::Policy { verb, .. } if verb == "get" => {
                    (format!("read node {node}"), "nodes get")
                }
                _ => (format!("{what} node {node}"), "nodes patch"),
            };
            forbidden_in(status_of(&e), &e.detail(), &doing, rule)
        }
    }
}

/// The HTTP status of a refusal.
fn status_of(e: &ApiError) -> Option<u16> {
    match e {
        ApiError::Refused { status, .. } => *status,
        ApiError::Policy { .. } => Some(403),
        ApiError::Unavailable { .. } | ApiError::Conflict { .. } => None,
    }
}

/// "cannot WHAT: …", with the RBAC rule to add when the API says 403.
/// The error of a request made with the node's own identity (`kubernetes.node_kubeconfig`),
/// except `budgets_for`'s, made with ginx's: a 403 says which.
fn forbidden_or(e: &kube::Error, what: &str, rule: &str) -> DrainError {
    forbidden_in(code(e), &describe(e), what, rule)
}

/// [`forbidden_or`] of an answer with `status` and `detail` (its status and reason in words).
fn forbidden_in(status: Option<u16>, detail: &str, what: &str, rule: &str) -> DrainError {
    if status == Some(403) && rule.starts_with("poddisruptionbudgets") {
        DrainError::Refused(format!(
            "cannot {what}: {detail}; ginx needs {rule} — apply packaging/kubernetes/rbac.yaml"
        ))
    } else if status == Some(403) {
        DrainError::Refused(format!(
            "cannot {what}: {detail}; the node's own identity (kubernetes.node_kubeconfig, \
             system:node:<name>) needs {rule} for its own node: is the API server's \
             authorization mode Node and its admission NodeRestriction?"
        ))
    } else {
        DrainError::Failed(format!("cannot {what}: {detail}"))
    }
}

/// A request of the drain (list, evict, cordon, uncordon) that failed: refused by the API's
/// authorization, which waiting does not mend and whose text names the permission to grant,
/// or failed otherwise (no answer, a node that does not exist or kept changing).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DrainError {
    #[error("{0}")]
    Refused(String),
    #[error("{0}")]
    Failed(String),
}

impl DrainError {
    /// What the node waits for while this stands: a refusal is told as one.
    pub fn waiting_for(&self) -> WaitingFor {
        match self {
            DrainError::Refused(_) => WaitingFor::Refused,
            DrainError::Failed(_) => WaitingFor::Api,
        }
    }
}

impl From<DrainError> for String {
    fn from(e: DrainError) -> Self {
        e.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{EmptyDirVolumeSource, PodSpec, PodStatus, Volume};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
        LabelSelectorRequirement, ObjectMeta, OwnerReference, Time,
    };

    fn pod(name: &str, owner: Option<&str>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                uid: Some(format!("uid-{name}")),
                owner_references: owner.map(|kind| {
                    vec![OwnerReference {
                        api_version: "apps/v1".into(),
                        kind: kind.into(),
                        name: "owner".into(),
                        uid: "o".into(),
                        controller: Some(true),
                        ..OwnerReference::default()
                    }]
                }),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec::default()),
            status: Some(PodStatus {
                phase: Some("Running".into()),
                ..PodStatus::default()
            }),
        }
    }

    #[test]
    fn a_drain_skips_daemonsets_and_mirrors_and_refuses_what_would_be_lost() {
        let mut mirror = pod("etcd-lucy", None);
        mirror.metadata.annotations = Some([(MIRROR.to_owned(), "x".to_owned())].into());
        let mut scratch = pod("cache", Some("ReplicaSet"));
        scratch.spec.as_mut().unwrap().volumes = Some(vec![Volume {
            name: "tmp".into(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Volume::default()
        }]);
        let mut going = pod("going", Some("ReplicaSet"));
        going.metadata.deletion_timestamp = Some(Time(jiff::Timestamp::UNIX_EPOCH));
        let mut done = pod("job-done", None);
        done.status.as_mut().unwrap().phase = Some("Succeeded".into());
        let pods = vec![
            pod("web", Some("ReplicaSet")),
            pod("cilium-x", Some("DaemonSet")),
            mirror,
            pod("bare", None),
            scratch,
            going,
            done,
        ];
        let p = plan(&pods, false, false);
        let names = |v: &[PodRef]| v.iter().map(|r| r.name.clone()).collect::<Vec<_>>();
        assert_eq!(names(&p.evict), ["web", "job-done"]);
        assert_eq!(p.skipped, ["ns/cilium-x", "ns/etcd-lucy"]);
        assert_eq!(names(&p.terminating), ["going"]);
        assert_eq!(
            p.refused.keys().collect::<Vec<_>>(),
            ["ns/bare", "ns/cache"]
        );
        assert!(p.refused["ns/bare"].contains("reboot.force"));
        assert!(p.refused["ns/cache"].contains("reboot.delete_emptydir_data"));
        assert!(!p.done());
        let p = plan(&pods, true, true);
        assert_eq!(names(&p.evict), ["web", "bare", "cache", "job-done"]);
        assert!(p.refused.is_empty());
    }

    #[test]
    fn selectors_match_labels_and_expressions() {
        let labels: BTreeMap<String, String> = [("app".to_owned(), "web".to_owned())].into();
        let sel = |labels: &[(&str, &str)], exprs: &[(&str, &str, &[&str])]| LabelSelector {
            match_labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            ),
            match_expressions: Some(
                exprs
                    .iter()
                    .map(|(k, op, v)| LabelSelectorRequirement {
                        key: (*k).to_owned(),
                        operator: (*op).to_owned(),
                        values: Some(v.iter().map(|s| (*s).to_owned()).collect()),
                    })
                    .collect(),
            ),
        };
        assert!(selects(&LabelSelector::default(), &labels));
        assert!(selects(&sel(&[("app", "web")], &[]), &labels));
        assert!(!selects(&sel(&[("app", "db")], &[]), &labels));
        assert!(selects(&sel(&[], &[("app", "In", &["web", "x"])]), &labels));
        assert!(!selects(&sel(&[], &[("app", "NotIn", &["web"])]), &labels));
        assert!(selects(
            &sel(&[], &[("tier", "DoesNotExist", &[])]),
            &labels
        ));
        assert!(!selects(&sel(&[], &[("tier", "Exists", &[])]), &labels));
        assert!(!selects(&sel(&[], &[("app", "Bogus", &[])]), &labels));
    }
}
