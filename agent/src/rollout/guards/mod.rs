//! The guards that must ask the cluster or a peer before they answer: the groups a group comes
//! after, canaries, the order through a group, the control-plane quorum, the etcd guard, the
//! alert gate's Prometheus query, and the health gate's evidence. Each reads, then answers
//! through the pure decisions of [`decide`](super::decide).

pub mod after;
pub mod alerts;
pub mod canary;
pub mod etcd;
pub mod evidence;
pub mod order;
pub mod quorum;

use crate::config::OnApiUnavailable;
use crate::k8s::{describe, refusal, unavailable};
use crate::rollout::decide::admission::{self, Verdict};

/// The wait for a guard whose list of `object` failed while reading `what`: unavailable when
/// waiting may mend it (the API away, which `policy` may go past), else the API's refusal,
/// which it never goes past.
pub(crate) fn list_failed(
    policy: OnApiUnavailable,
    what: &str,
    object: &str,
    e: &kube::Error,
) -> Verdict {
    if unavailable(e) {
        admission::unavailable(policy, format!("cannot read {what}: {}", describe(e)))
    } else {
        admission::refused(refusal("list", object, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::WaitingFor;

    fn api(code: u16, message: &str) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure(message, "Forbidden")
                .with_code(code)
                .boxed(),
        )
    }

    /// The list of every guard that reads the cluster (the `after` groups' heartbeats, the
    /// canaries, the order's Nodes) answers a refusal with a wait for it, even where an
    /// unavailable API is gone past; only an API that does not answer is.
    #[test]
    fn a_refused_list_waits_even_under_proceed() {
        for code in [401, 403, 404] {
            let v = list_failed(
                OnApiUnavailable::Proceed,
                "the Nodes",
                "nodes",
                &api(code, "no"),
            );
            assert!(
                matches!(&v, Verdict::Wait(w) if w.waiting_for == WaitingFor::Refused),
                "{code}: {v:?}"
            );
        }
        let policy = api(403, "ValidatingAdmissionPolicy 'ginx-node' denied request");
        let v = list_failed(OnApiUnavailable::Proceed, "the Nodes", "nodes", &policy);
        assert!(
            matches!(&v, Verdict::Wait(w) if w.waiting_for == WaitingFor::Refused),
            "{v:?}"
        );
        let away = api(503, "etcd is away");
        let v = list_failed(OnApiUnavailable::Proceed, "the Nodes", "nodes", &away);
        assert!(matches!(v, Verdict::GoWithoutApi(_)), "{v:?}");
        let v = list_failed(OnApiUnavailable::Wait, "the Nodes", "nodes", &away);
        assert!(
            matches!(&v, Verdict::Wait(w) if w.waiting_for == WaitingFor::Api),
            "{v:?}"
        );
    }
}
