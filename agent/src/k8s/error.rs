//! [`ApiError`]: one failed request to the API server, classified once, at the call, into what
//! a caller branches on. Its text is what an operator reads: what was asked, of which object,
//! the server's answer, and what to do. It never carries credentials.

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

/// A short description of a client error: the HTTP status and reason for API errors, the root
/// cause for transport errors. Never contains credentials.
pub fn describe(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => {
            let msg = s.message.lines().next().unwrap_or("").trim();
            if s.reason.is_empty() || s.reason == "Failed to parse error data" {
                format!("HTTP {}: {msg}", s.code)
            } else {
                format!("HTTP {} {}: {msg}", s.code, s.reason)
            }
        }
        other => {
            let mut cause: &dyn std::error::Error = other;
            while let Some(next) = cause.source() {
                cause = next;
            }
            let root = cause.to_string();
            let top = other.to_string();
            if root == top {
                top
            } else {
                format!("{top}: {root}")
            }
        }
    }
}

/// The HTTP status of an API error.
pub fn code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) if s.code != 0 => Some(s.code),
        _ => None,
    }
}

/// Whether `e` means the API is unavailable (a transport error, a timeout, a 5xx, or a 429
/// that kube-rs's retries did not get past), as opposed to a request the API refused (401,
/// 403, 404, 422, …: an error of configuration, which waiting does not mend).
pub fn unavailable(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(s) if s.code != 0 => s.code >= 500 || s.code == 429,
        // Credentials that cannot be loaded or refreshed are configuration too.
        kube::Error::Auth(_) => false,
        _ => true,
    }
}

/// Whether a refusal came from a ValidatingAdmissionPolicy rather than RBAC.
pub fn by_policy(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.message.contains("ValidatingAdmissionPolicy"))
}

/// Why the API refused `verb` on `resource` (`e` is not [`unavailable`]), and what to do. Only
/// a 403 is RBAC's doing; a 404 of ginx's namespace is the manifest not applied either.
pub fn refusal(verb: &str, resource: &str, e: &kube::Error) -> String {
    let hint = match code(e) {
        Some(401) => {
            "the credentials of kubernetes.kubeconfig are not accepted: check that file (an \
             expired or revoked certificate?)"
        }
        Some(403) if by_policy(e) => {
            "an admission policy of packaging/kubernetes/vap.yaml refused it (its message says \
             which rule): if this node's request was right, check that the policies match this \
             ginx's version"
        }
        Some(403) => {
            "ginx's identity may not do this: apply packaging/kubernetes/rbac.yaml and \
             vap.yaml to the cluster"
        }
        Some(404) => {
            "it does not exist: check kubernetes.namespace and apply \
             packaging/kubernetes/rbac.yaml, which creates the namespace"
        }
        Some(422) => "the API found the object ginx wrote invalid: report this as a bug",
        _ => "check the configuration of [kubernetes]",
    };
    format!("the API refused {verb} {resource}: {}; {hint}", describe(e))
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
