//! The one writer of the `ginx-rollout` ConfigMap with an operator's credentials (`ginxctl
//! hold`, `release`, `plan`): an edit of its data, compare-and-swap, the ConfigMap created when
//! missing, made again from a fresh read on a conflict. A failure is typed: the edit's own
//! refusal, or the API's answer with what the operator's kubeconfig lacks.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;

use crate::k8s::{ApiError, Edit, EditError, replace_with_retry};

/// What an edit of the data decided.
pub enum Change<T> {
    /// Write the edited data, and answer `T`.
    Write(T),
    /// Nothing to write (what was asked already stands): answer `T`.
    Keep(T),
}

/// Why an operator's edit was not written.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OperatorError {
    /// The edit itself refused (a full list, a bad argument): its words.
    #[error("{0}")]
    Edit(String),
    /// The API server refused or did not answer; `doing` names the operator's action.
    #[error("{}", api_words(.resource, .doing, .error))]
    Api {
        resource: String,
        doing: &'static str,
        error: ApiError,
    },
}

/// Makes `edit` on the data of the ConfigMap `namespace/name`. `doing` names the operator's
/// action in an error ("placing or lifting a hold").
pub async fn edit_data<T>(
    api: &Api<ConfigMap>,
    namespace: &str,
    name: &str,
    doing: &'static str,
    mut edit: impl FnMut(&mut BTreeMap<String, String>) -> Result<Change<T>, String>,
) -> Result<T, OperatorError> {
    let resource = format!("ConfigMap {namespace}/{name}");
    let written = replace_with_retry(api, name, &resource, None, |existing| {
        let mut cm = existing.unwrap_or_else(|| ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        });
        let mut data = cm.data.take().unwrap_or_default();
        Ok(match edit(&mut data)? {
            Change::Keep(v) => Edit::Keep(v),
            Change::Write(v) => {
                cm.data = Some(data);
                Edit::Write(cm, v)
            }
        })
    })
    .await
    .map_err(|e| match e {
        EditError::Edit(why) => OperatorError::Edit(why),
        EditError::Api(error) => OperatorError::Api {
            resource: resource.clone(),
            doing,
            error,
        },
    })?;
    Ok(written.value)
}

/// A failed request about the ConfigMap, with what to do.
fn api_words(resource: &str, doing: &str, e: &ApiError) -> String {
    match e {
        ApiError::Policy { detail, .. } => format!(
            "{resource}: refused by an admission policy: {detail}; {doing} takes an operator's \
             credentials, never a node's"
        ),
        ApiError::Refused {
            status: Some(401 | 403),
            detail,
            ..
        } => format!(
            "{resource}: forbidden: {detail}; {doing} needs get and update on it, and create \
             for the first write (an operator's kubeconfig: Role ginx-fleet-operator, or \
             cluster-admin)"
        ),
        other => format!("{resource}: {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_names_the_action_and_what_the_kubeconfig_lacks() {
        let api = |status| ApiError::Refused {
            verb: "update".into(),
            resource: "configmaps".into(),
            status: Some(status),
            detail: "403 Forbidden".into(),
            message: "update configmaps: 403 Forbidden".into(),
        };
        let e = OperatorError::Api {
            resource: "ConfigMap ginx-system/ginx-rollout".into(),
            doing: "placing or lifting a hold",
            error: api(403),
        };
        let words = e.to_string();
        assert!(
            words.contains("placing or lifting a hold needs get and update"),
            "{words}"
        );
        assert!(words.contains("ginx-fleet-operator"), "{words}");
        let policy = OperatorError::Api {
            resource: "ConfigMap ginx-system/ginx-rollout".into(),
            doing: "writing a plan request",
            error: ApiError::Policy {
                verb: "update".into(),
                resource: "configmaps".into(),
                detail: "ginx-node-halts".into(),
                message: "denied".into(),
            },
        };
        assert!(
            policy
                .to_string()
                .contains("writing a plan request takes an operator's")
        );
        assert_eq!(OperatorError::Edit("full".into()).to_string(), "full");
    }
}
