//! What a stage waits for, looked at once: `None` when it holds, else why not (the object's
//! last condition, or what is missing).

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, ListParams};
use kube::discovery;

use super::{Failure, api_failure};
use crate::config::Wait;

/// The nodes that are not Ready, each with its Ready condition's status and reason.
fn not_ready(nodes: &[Node]) -> Vec<String> {
    nodes
        .iter()
        .filter_map(|n| {
            let ready = n
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"));
            let name = n.metadata.name.as_deref().unwrap_or("?");
            match ready {
                Some(c) if c.status == "True" => None,
                Some(c) => Some(format!(
                    "{name} (Ready={}: {})",
                    c.status,
                    c.reason.as_deref().unwrap_or("")
                )),
                None => Some(format!("{name} (no Ready condition)")),
            }
        })
        .collect()
}

/// Whether `w` holds now.
pub async fn check(client: &kube::Client, w: &Wait) -> Result<Option<String>, Failure> {
    let what = w.to_string();
    let read = |e: kube::Error| api_failure(&format!("cannot read {what}"), &e);
    let missing = || Some("it does not exist".to_owned());
    match w {
        Wait::DaemonSet { namespace, name } => {
            let d = Api::<DaemonSet>::namespaced(client.clone(), namespace)
                .get_opt(name)
                .await
                .map_err(read)?;
            Ok(d.map_or_else(missing, |d| daemon_set_waits(&d)))
        }
        Wait::Deployment { namespace, name } => {
            let d = Api::<Deployment>::namespaced(client.clone(), namespace)
                .get_opt(name)
                .await
                .map_err(read)?;
            Ok(d.map_or_else(missing, |d| deployment_waits(&d)))
        }
        Wait::Crd { name } => {
            let c = Api::<CustomResourceDefinition>::all(client.clone())
                .get_opt(name)
                .await
                .map_err(read)?;
            Ok(c.map_or_else(missing, |c| crd_waits(&c)))
        }
        Wait::Nodes => {
            let nodes = Api::<Node>::all(client.clone())
                .list(&ListParams::default())
                .await
                .map_err(read)?;
            Ok(nodes_wait(&nodes.items))
        }
        Wait::Ready {
            group,
            kind,
            namespace,
            name,
        } => {
            let Some(api) = dynamic_api(client, group, kind, namespace).await else {
                return Ok(Some(format!(
                    "the API has no kind {kind} in group {group} yet"
                )));
            };
            let o = api.get_opt(name).await.map_err(read)?;
            Ok(o.map_or_else(missing, |o| ready_condition_waits(&o)))
        }
    }
}

/// The API of `kind` in `group` at the group's preferred version that has the kind, in
/// `namespace` when the kind is namespaced; `None` while the API does not serve it.
async fn dynamic_api(
    client: &kube::Client,
    group: &str,
    kind: &str,
    namespace: &str,
) -> Option<Api<DynamicObject>> {
    let (ar, caps) = discovery::group(client, group)
        .await
        .ok()
        .and_then(|g| g.recommended_kind(kind))?;
    Some(match caps.scope {
        discovery::Scope::Namespaced => Api::namespaced_with(client.clone(), namespace, &ar),
        discovery::Scope::Cluster => Api::all_with(client.clone(), &ar),
    })
}

/// What a DaemonSet still lacks: its latest generation seen and rolled out to every node it is
/// scheduled on; `None` when it has it.
fn daemon_set_waits(d: &DaemonSet) -> Option<String> {
    let generation = d.metadata.generation.unwrap_or(0);
    let Some(s) = &d.status else {
        return Some("no status yet".into());
    };
    let want = s.desired_number_scheduled;
    let updated = s.updated_number_scheduled.unwrap_or(0);
    let available = s.number_available.unwrap_or(0);
    if s.observed_generation.unwrap_or(0) < generation {
        Some("the controller has not seen its latest generation".into())
    } else if want > 0 && updated >= want && available >= want {
        None
    } else if want == 0 {
        Some("no node to run on yet (0 scheduled)".into())
    } else {
        Some(format!(
            "{available} of {want} available, {updated} updated"
        ))
    }
}

/// What a Deployment still lacks: its latest generation seen and `Available=True`; `None`
/// when it has both.
fn deployment_waits(d: &Deployment) -> Option<String> {
    let generation = d.metadata.generation.unwrap_or(0);
    let s = d.status.clone().unwrap_or_default();
    let available = s
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "Available");
    if s.observed_generation.unwrap_or(0) < generation {
        return Some("the controller has not seen its latest generation".into());
    }
    match available {
        Some(c) if c.status == "True" => None,
        Some(c) => Some(format!(
            "Available={} ({}: {})",
            c.status,
            c.reason.as_deref().unwrap_or(""),
            c.message.as_deref().unwrap_or("")
        )),
        None => Some(format!(
            "no Available condition yet ({} of {} replicas ready)",
            s.ready_replicas.unwrap_or(0),
            s.replicas.unwrap_or(0)
        )),
    }
}

/// What a CRD still lacks: `Established=True`; `None` when it has it.
fn crd_waits(c: &CustomResourceDefinition) -> Option<String> {
    let est = c
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == "Established"));
    match est {
        Some(c) if c.status == "True" => None,
        Some(c) => Some(format!("Established={}", c.status)),
        None => Some("not Established yet".into()),
    }
}

/// What the cluster's nodes still lack: at least one registered, and every one Ready.
fn nodes_wait(nodes: &[Node]) -> Option<String> {
    let not = not_ready(nodes);
    if nodes.is_empty() {
        Some("no node registered yet".into())
    } else if !not.is_empty() {
        Some(format!("not Ready: {}", not.join(", ")))
    } else {
        None
    }
}

/// What any object still lacks: a `Ready=True` condition for its latest generation (the
/// condition's `observedGeneration`, else the status'); `None` when it has it.
fn ready_condition_waits(o: &DynamicObject) -> Option<String> {
    let generation = o.metadata.generation.unwrap_or(0);
    let c = o.data["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"));
    let Some(c) = c else {
        return Some("no Ready condition yet".into());
    };
    let observed = c["observedGeneration"]
        .as_i64()
        .or_else(|| o.data["status"]["observedGeneration"].as_i64())
        .unwrap_or(0);
    let status = c["status"].as_str().unwrap_or("");
    if status == "True" && observed >= generation {
        None
    } else if status == "True" {
        Some(format!(
            "Ready=True but for generation {observed}, not {generation}"
        ))
    } else {
        Some(format!(
            "Ready={status} ({}: {})",
            c["reason"].as_str().unwrap_or(""),
            c["message"].as_str().unwrap_or("")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, ready: Option<&str>) -> Node {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "status": {"conditions": ready.map(|r| vec![serde_json::json!(
                {"type": "Ready", "status": r, "reason": "KubeletNotReady"})]).unwrap_or_default()}
        }))
        .unwrap()
    }

    #[test]
    fn only_nodes_that_are_not_ready_are_named() {
        let nodes = [
            node("a", Some("True")),
            node("b", Some("False")),
            node("c", None),
        ];
        assert_eq!(
            not_ready(&nodes),
            ["b (Ready=False: KubeletNotReady)", "c (no Ready condition)"]
        );
        assert!(not_ready(&nodes[..1]).is_empty());
    }

    fn daemon_set(generation: i64, status: serde_json::Value) -> DaemonSet {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "cilium", "generation": generation},
            "status": status,
        }))
        .unwrap()
    }

    #[test]
    fn a_daemon_set_holds_once_its_generation_is_available_everywhere() {
        let ds = |observed: i64, want: i32, updated: i32, available: i32| {
            daemon_set(
                2,
                serde_json::json!({"observedGeneration": observed,
                    "desiredNumberScheduled": want, "updatedNumberScheduled": updated,
                    "numberAvailable": available, "currentNumberScheduled": want,
                    "numberMisscheduled": 0, "numberReady": available}),
            )
        };
        assert_eq!(daemon_set_waits(&ds(2, 3, 3, 3)), None);
        assert_eq!(
            daemon_set_waits(&ds(1, 3, 3, 3)).as_deref(),
            Some("the controller has not seen its latest generation")
        );
        assert_eq!(
            daemon_set_waits(&ds(2, 3, 3, 2)).as_deref(),
            Some("2 of 3 available, 3 updated")
        );
        assert_eq!(
            daemon_set_waits(&ds(2, 0, 0, 0)).as_deref(),
            Some("no node to run on yet (0 scheduled)")
        );
        let bare: DaemonSet =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "c"}})).unwrap();
        assert_eq!(daemon_set_waits(&bare).as_deref(), Some("no status yet"));
    }

    #[test]
    fn a_deployment_holds_once_available_for_its_generation() {
        let dep = |observed: i64, available: Option<&str>| -> Deployment {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "coredns", "generation": 3},
                "status": {"observedGeneration": observed, "replicas": 2, "readyReplicas": 1,
                    "conditions": available.map(|a| vec![serde_json::json!({"type": "Available",
                        "status": a, "reason": "MinimumReplicasUnavailable", "message": "m"})])
                        .unwrap_or_default()},
            }))
            .unwrap()
        };
        assert_eq!(deployment_waits(&dep(3, Some("True"))), None);
        assert_eq!(
            deployment_waits(&dep(2, Some("True"))).as_deref(),
            Some("the controller has not seen its latest generation")
        );
        assert_eq!(
            deployment_waits(&dep(3, Some("False"))).as_deref(),
            Some("Available=False (MinimumReplicasUnavailable: m)")
        );
        assert_eq!(
            deployment_waits(&dep(3, None)).as_deref(),
            Some("no Available condition yet (1 of 2 replicas ready)")
        );
    }

    #[test]
    fn a_crd_holds_once_established() {
        let crd = |est: Option<&str>| -> CustomResourceDefinition {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "ippools.cilium.io"},
                "spec": {"group": "cilium.io", "scope": "Cluster", "versions": [],
                    "names": {"kind": "IPPool", "plural": "ippools"}},
                "status": {"conditions": est.map(|e| vec![serde_json::json!(
                    {"type": "Established", "status": e})]).unwrap_or_default()},
            }))
            .unwrap()
        };
        assert_eq!(crd_waits(&crd(Some("True"))), None);
        assert_eq!(
            crd_waits(&crd(Some("False"))).as_deref(),
            Some("Established=False")
        );
        assert_eq!(
            crd_waits(&crd(None)).as_deref(),
            Some("not Established yet")
        );
    }

    #[test]
    fn nodes_hold_once_some_are_registered_and_all_ready() {
        assert_eq!(nodes_wait(&[]).as_deref(), Some("no node registered yet"));
        assert_eq!(
            nodes_wait(&[node("a", Some("True")), node("b", None)]).as_deref(),
            Some("not Ready: b (no Ready condition)")
        );
        assert_eq!(nodes_wait(&[node("a", Some("True"))]), None);
    }

    #[test]
    fn an_object_holds_once_ready_for_its_latest_generation() {
        let obj = |status: serde_json::Value| -> DynamicObject {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "example.io/v1", "kind": "Thing",
                "metadata": {"name": "t", "generation": 4},
                "status": status,
            }))
            .unwrap()
        };
        let ready = |status: &str, observed: i64| {
            serde_json::json!({"conditions": [{"type": "Ready", "status": status,
                "observedGeneration": observed, "reason": "Wait", "message": "m"}]})
        };
        assert_eq!(ready_condition_waits(&obj(ready("True", 4))), None);
        assert_eq!(
            ready_condition_waits(&obj(ready("True", 3))).as_deref(),
            Some("Ready=True but for generation 3, not 4")
        );
        assert_eq!(
            ready_condition_waits(&obj(ready("False", 4))).as_deref(),
            Some("Ready=False (Wait: m)")
        );
        let from_status = serde_json::json!({"observedGeneration": 4,
            "conditions": [{"type": "Ready", "status": "True"}]});
        assert_eq!(ready_condition_waits(&obj(from_status)), None);
        assert_eq!(
            ready_condition_waits(&obj(serde_json::json!({}))).as_deref(),
            Some("no Ready condition yet")
        );
    }
}
