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

use crate::config::OnApiUnavailable;
use crate::k8s::ApiError;
use crate::rollout::decide::admission::{self, Verdict};
use crate::rollout::view::FIRST_LIST;

/// The wait for a guard whose part of the read model cannot be read while reading `what`:
/// `e` is its watch's failed list — unavailable when waiting may mend it (the API away, which
/// `policy` may go past), else the API's refusal, which it never goes past; `None` while its
/// first list has not answered (as good as unavailable).
pub(crate) fn unread(policy: OnApiUnavailable, what: &str, e: Option<&ApiError>) -> Verdict {
    match e {
        Some(e) if !e.is_unavailable() => admission::refused(e.explained()),
        Some(e) => admission::unavailable(policy, format!("cannot read {what}: {}", e.detail())),
        None => admission::unavailable(
            policy,
            format!(
                "cannot read {what}: its watch has not listed within {}s",
                FIRST_LIST.as_secs()
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::WaitingFor;

    fn api(code: u16, message: &str) -> ApiError {
        let e = kube::Error::Api(
            kube::core::Status::failure(message, "Forbidden")
                .with_code(code)
                .boxed(),
        );
        ApiError::new("list", "nodes", &e)
    }

    /// Every guard that reads the read model (the `after` groups' heartbeats, the canaries, the
    /// order's Nodes) answers its watch's refused list with a wait for it, even where an
    /// unavailable API is gone past; only an API that does not answer is, and a watch that has
    /// not listed yet counts as one.
    #[test]
    fn a_refused_list_waits_even_under_proceed() {
        for code in [401, 403, 404] {
            let v = unread(
                OnApiUnavailable::Proceed,
                "the Nodes",
                Some(&api(code, "no")),
            );
            assert!(
                matches!(&v, Verdict::Wait(w) if w.waiting_for == WaitingFor::Refused),
                "{code}: {v:?}"
            );
        }
        let policy = api(403, "ValidatingAdmissionPolicy 'ginx-node' denied request");
        let v = unread(OnApiUnavailable::Proceed, "the Nodes", Some(&policy));
        assert!(
            matches!(&v, Verdict::Wait(w) if w.waiting_for == WaitingFor::Refused),
            "{v:?}"
        );
        let away = api(503, "etcd is away");
        let v = unread(OnApiUnavailable::Proceed, "the Nodes", Some(&away));
        assert!(matches!(v, Verdict::GoWithoutApi(_)), "{v:?}");
        let v = unread(OnApiUnavailable::Wait, "the Nodes", Some(&away));
        assert!(
            matches!(&v, Verdict::Wait(w) if w.waiting_for == WaitingFor::Api),
            "{v:?}"
        );
        let v = unread(OnApiUnavailable::Wait, "the Nodes", None);
        assert!(
            matches!(&v, Verdict::Wait(w) if w.waiting_for == WaitingFor::Api),
            "{v:?}"
        );
    }
}
