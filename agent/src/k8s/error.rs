//! [`ApiError`]: one failed request to the API server, classified once, at the call, into what
//! a caller branches on. Its text is what an operator reads: what was asked, of which object,
//! the server's answer, and what to do. It never carries credentials.

use crate::types::api::{by_policy, code, describe, refusal, unavailable};

/// A request to the API server that failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    /// The API is away (transport, timeout, 5xx, a 429 past kube-rs's own retries): waiting
    /// mends it.
    #[error("{what}: {detail}")]
    Unavailable { what: String, detail: String },
    /// The API refused the request (401, 403, 404, 422, …): a configuration error, which
    /// waiting does not mend. `message` says why and what to do.
    #[error("{message}")]
    Refused {
        verb: String,
        resource: String,
        status: Option<u16>,
        /// The server's answer alone (status, reason, first line of its message).
        detail: String,
        message: String,
    },
    /// A ValidatingAdmissionPolicy refused it (`packaging/kubernetes/vap.yaml`).
    #[error("{message}")]
    Policy {
        verb: String,
        resource: String,
        detail: String,
        message: String,
    },
    /// The object changed under ginx on every try of a read-modify-replace.
    #[error("{resource} changed under ginx on each of {tries} tries (others writing at once?)")]
    Conflict { resource: String, tries: usize },
}

impl ApiError {
    /// Classifies `e`, the answer to `verb` on `resource` (e.g. "update", "Lease
    /// ginx-rollout-workers-0 in namespace ginx-system").
    pub fn new(verb: &str, resource: &str, e: &kube::Error) -> Self {
        if unavailable(e) {
            return ApiError::Unavailable {
                what: format!("cannot {verb} {resource}"),
                detail: describe(e),
            };
        }
        let message = refusal(verb, resource, e);
        if code(e) == Some(403) && by_policy(e) {
            return ApiError::Policy {
                verb: verb.to_owned(),
                resource: resource.to_owned(),
                detail: describe(e),
                message,
            };
        }
        ApiError::Refused {
            verb: verb.to_owned(),
            resource: resource.to_owned(),
            status: code(e),
            detail: describe(e),
            message,
        }
    }

    /// The server's answer alone, without what was asked (for messages that say that
    /// themselves).
    pub fn detail(&self) -> String {
        match self {
            ApiError::Unavailable { detail, .. }
            | ApiError::Refused { detail, .. }
            | ApiError::Policy { detail, .. } => detail.clone(),
            ApiError::Conflict { .. } => self.to_string(),
        }
    }

    /// The refusal with what to do (see `refusal`), or the unavailability's detail.
    pub fn explained(&self) -> String {
        match self {
            ApiError::Refused { message, .. } | ApiError::Policy { message, .. } => message.clone(),
            other => other.detail(),
        }
    }

    /// Whether waiting may mend it: the API away, or others writing at once.
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            ApiError::Unavailable { .. } | ApiError::Conflict { .. }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16, message: &str) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure(message, "Forbidden")
                .with_code(code)
                .boxed(),
        )
    }

    #[test]
    fn a_5xx_is_unavailable_and_a_403_is_refused_with_what_to_do() {
        let away = ApiError::new("get", "Lease x", &api(503, "etcd is away"));
        assert!(away.is_unavailable(), "{away:?}");
        assert!(
            away.to_string().starts_with("cannot get Lease x: HTTP 503"),
            "{away}"
        );
        let refused = ApiError::new("update", "Lease x", &api(403, "no"));
        assert!(
            matches!(
                &refused,
                ApiError::Refused {
                    status: Some(403),
                    ..
                }
            ),
            "{refused:?}"
        );
        assert!(refused.to_string().contains("rbac.yaml"), "{refused}");
    }

    #[test]
    fn a_policy_s_refusal_is_told_apart_from_rbac_s() {
        let e = api(403, "ValidatingAdmissionPolicy 'ginx-slot' denied request");
        let policy = ApiError::new("update", "Lease x", &e);
        assert!(matches!(policy, ApiError::Policy { .. }), "{policy:?}");
        assert!(!policy.is_unavailable());
    }
}
