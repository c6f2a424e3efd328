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
    match w {
        Wait::DaemonSet { namespace, name } => {
            let Some(d) = Api::<DaemonSet>::namespaced(client.clone(), namespace)
                .get_opt(name)
                .await
                .map_err(read)?
            else {
                return Ok(Some("it does not exist".into()));
            };
            let generation = d.metadata.generation.unwrap_or(0);
            let Some(s) = d.status else {
                return Ok(Some("no status yet".into()));
            };
            let want = s.desired_number_scheduled;
            let updated = s.updated_number_scheduled.unwrap_or(0);
            let available = s.number_available.unwrap_or(0);
            if s.observed_generation.unwrap_or(0) < generation {
                return Ok(Some(
                    "the controller has not seen its latest generation".into(),
                ));
            }
            if want > 0 && updated >= want && available >= want {
                Ok(None)
            } else if want == 0 {
                Ok(Some("no node to run on yet (0 scheduled)".into()))
            } else {
                Ok(Some(format!(
                    "{available} of {want} available, {updated} updated"
                )))
            }
        }
        Wait::Deployment { namespace, name } => {
            let Some(d) = Api::<Deployment>::namespaced(client.clone(), namespace)
                .get_opt(name)
                .await
                .map_err(read)?
            else {
                return Ok(Some("it does not exist".into()));
            };
            let generation = d.metadata.generation.unwrap_or(0);
            let s = d.status.unwrap_or_default();
            let available = s
                .conditions
                .iter()
                .flatten()
                .find(|c| c.type_ == "Available");
            if s.observed_generation.unwrap_or(0) < generation {
                return Ok(Some(
                    "the controller has not seen its latest generation".into(),
                ));
            }
            match available {
                Some(c) if c.status == "True" => Ok(None),
                Some(c) => Ok(Some(format!(
                    "Available={} ({}: {})",
                    c.status,
                    c.reason.as_deref().unwrap_or(""),
                    c.message.as_deref().unwrap_or("")
                ))),
                None => Ok(Some(format!(
                    "no Available condition yet ({} of {} replicas ready)",
                    s.ready_replicas.unwrap_or(0),
                    s.replicas.unwrap_or(0)
                ))),
            }
        }
        Wait::Crd { name } => {
            let Some(c) = Api::<CustomResourceDefinition>::all(client.clone())
                .get_opt(name)
                .await
                .map_err(read)?
            else {
                return Ok(Some("it does not exist".into()));
            };
            let est = c
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .into_iter()
                .find(|c| c.type_ == "Established");
            Ok(match est {
                Some(c) if c.status == "True" => None,
                Some(c) => Some(format!("Established={}", c.status)),
                None => Some("not Established yet".into()),
            })
        }
        Wait::Nodes => {
            let nodes = Api::<Node>::all(client.clone())
                .list(&ListParams::default())
                .await
                .map_err(read)?;
            let not = not_ready(&nodes.items);
            Ok(if nodes.items.is_empty() {
                Some("no node registered yet".into())
            } else if !not.is_empty() {
                Some(format!("not Ready: {}", not.join(", ")))
            } else {
                None
            })
        }
        Wait::Ready {
            group,
            kind,
            namespace,
            name,
        } => {
            // The group's preferred version that has the kind.
            let found = discovery::group(client, group)
                .await
                .ok()
                .and_then(|g| g.recommended_kind(kind));
            let Some((ar, caps)) = found else {
                return Ok(Some(format!(
                    "the API has no kind {kind} in group {group} yet"
                )));
            };
            let api: Api<DynamicObject> = match caps.scope {
                kube::discovery::Scope::Namespaced => {
                    Api::namespaced_with(client.clone(), namespace, &ar)
                }
                kube::discovery::Scope::Cluster => Api::all_with(client.clone(), &ar),
            };
            let Some(o) = api.get_opt(name).await.map_err(read)? else {
                return Ok(Some("it does not exist".into()));
            };
            let generation = o.metadata.generation.unwrap_or(0);
            let ready = o.data["status"]["conditions"]
                .as_array()
                .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
                .cloned();
            Ok(match ready {
                None => Some("no Ready condition yet".into()),
                Some(c) => {
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
            })
        }
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
}
