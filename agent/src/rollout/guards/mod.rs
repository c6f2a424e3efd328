//! The guards beyond the fleet state: the groups a group comes after, canaries and the order
//! through a group (pure functions of the read model, [`view`](super::view)), and those that
//! must ask a peer first (the control-plane quorum, etcd, the alert gate's Prometheus query, the
//! health gate's evidence), answering through the pure decisions of [`decide`](super::decide).

pub mod after;
pub mod alerts;
pub mod canary;
pub mod etcd;
pub mod evidence;
pub mod order;
pub mod quorum;

use crate::k8s::ApiError;
use crate::rollout::decide::admission::Answer;
use crate::rollout::view::FIRST_LIST;

/// The answer of a guard whose part of the read model cannot be read while reading `what`:
/// `e` is its watch's failed list — unavailable when waiting may mend it (the API away), else
/// the API's refusal; `None` while its first list has not answered (as good as unavailable).
pub(crate) fn unread(what: &str, e: Option<&ApiError>) -> Answer {
    match e {
        Some(e) if !e.is_unavailable() => Answer::Refused(e.explained()),
        Some(e) => Answer::Unavailable(format!("cannot read {what}: {}", e.detail())),
        None => Answer::Unavailable(format!(
            "cannot read {what}: its watch has not listed within {}s",
            FIRST_LIST.as_secs()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16, message: &str) -> ApiError {
        let e = kube::Error::Api(
            kube::core::Status::failure(message, "Forbidden")
                .with_code(code)
                .boxed(),
        );
        ApiError::new("list", "nodes", &e)
    }

    /// A watch whose list was refused (RBAC, a policy) answers as refused, one whose API is
    /// away or that has not listed yet as unavailable; admission's table test shows what each
    /// becomes under `on_api_unavailable`.
    #[test]
    fn a_refused_watch_is_a_refusal_and_an_absent_one_unavailable() {
        for code in [401, 403, 404] {
            let a = unread("the Nodes", Some(&api(code, "no")));
            assert!(matches!(a, Answer::Refused(_)), "{code}: {a:?}");
        }
        let policy = api(403, "ValidatingAdmissionPolicy 'ginx-node' denied request");
        let a = unread("the Nodes", Some(&policy));
        assert!(matches!(a, Answer::Refused(_)), "{a:?}");
        let a = unread("the Nodes", Some(&api(503, "etcd is away")));
        assert!(
            matches!(&a, Answer::Unavailable(m) if m.contains("etcd is away")),
            "{a:?}"
        );
        let a = unread("the Nodes", None);
        assert!(
            matches!(&a, Answer::Unavailable(m) if m.contains("has not listed")),
            "{a:?}"
        );
    }
}
