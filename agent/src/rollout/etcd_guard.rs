//! The etcd guard of a control-plane node with a stacked member, as admission asks it before
//! the node takes a slot: one look at etcd, the verdict of `etcd::View::blockers`, and the
//! hand-over of the leadership when this node's member leads. The node's own member catching
//! up after the disruption is the `etcd` health probe's (the gate requires it).
//!
//! A member that cannot be asked is the guard's failure, never a pass: a control-plane node
//! whose etcd does not answer waits, whatever `rollout.on_api_unavailable` says.

use crate::config::EtcdConfig;
use crate::etcd::{Client, HandOver, hand_over, observe};
use crate::types::{Notices, Reason, Revision};

/// What the guard remembers between looks: whether it held the node at the last look, so
/// that the `EtcdUnhealthy` notice is given once per spell, not once per look.
#[derive(Debug, Default)]
pub struct EtcdGuard {
    holding: bool,
}

/// One look's outcome.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Look {
    Pass(HandOver),
    /// The node waits: why.
    Hold(String),
}

impl EtcdGuard {
    /// Looks at etcd; `None` lets the node through (the leadership moved first if this node's
    /// member led), `Some(reason)` holds it. Gives the notices.
    pub async fn check(
        &mut self,
        cfg: &EtcdConfig,
        notices: &Notices,
        revision: &Revision,
    ) -> Option<String> {
        let look = look(cfg).await;
        let (told, reason) = self.told(&look);
        if let Some((kind, message)) = told {
            match kind {
                Reason::EtcdUnhealthy => {
                    tracing::warn!(revision = %revision.short(), reason = %message,
                        "the etcd guard holds this control-plane node back");
                }
                _ => tracing::info!(revision = %revision.short(), detail = %message,
                    "etcd's leadership handed over before the disruption"),
            }
            notices.emit(kind, Some(revision.as_str()), message);
        }
        reason
    }

    /// The notice a look calls for (a hold that starts a spell, a leadership moved) and the
    /// wait's reason, if any.
    fn told(&mut self, look: &Look) -> (Option<(Reason, String)>, Option<String>) {
        match look {
            Look::Hold(why) => {
                let first = !self.holding;
                self.holding = true;
                let reason = format!("etcd: {why}");
                (
                    first.then(|| (Reason::EtcdUnhealthy, reason.clone())),
                    Some(reason),
                )
            }
            Look::Pass(moved) => {
                self.holding = false;
                let told = match moved {
                    HandOver::NotLeader => None,
                    HandOver::Moved { from, to } => Some((
                        Reason::EtcdLeaderMoved,
                        format!("etcd's leadership moved from {from} to {to}"),
                    )),
                };
                (told, None)
            }
        }
    }
}

/// One look at etcd, and the hand-over when it lets the node through and the node leads.
pub async fn look(cfg: &EtcdConfig) -> Look {
    let client = match Client::new(cfg) {
        Ok(c) => c,
        Err(e) => return Look::Hold(e.to_string()),
    };
    let view = match observe(&client).await {
        Ok(v) => v,
        Err(e) => return Look::Hold(format!("{e}; a member that cannot be asked is not passed")),
    };
    let max_lag = u64::from(cfg.max_lag);
    if let Some(why) = view.blockers(max_lag) {
        return Look::Hold(why);
    }
    if !cfg.hand_over {
        return Look::Pass(HandOver::NotLeader);
    }
    match hand_over(&client, view, max_lag, cfg.hand_over_attempts).await {
        Ok(done) => Look::Pass(done),
        Err(why) => Look::Hold(format!(
            "{why}; this node's member leads, and it is not taken down while it does \
             (etcd.hand_over)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hold_is_told_once_per_spell_and_a_move_each_time() {
        let mut g = EtcdGuard::default();
        let hold = Look::Hold("quinn has the alarm NOSPACE".into());
        let (told, why) = g.told(&hold);
        assert_eq!(
            told,
            Some((
                Reason::EtcdUnhealthy,
                "etcd: quinn has the alarm NOSPACE".into()
            ))
        );
        assert_eq!(why.as_deref(), Some("etcd: quinn has the alarm NOSPACE"));
        assert_eq!(g.told(&hold).0, None, "the same spell is told once");
        let pass = Look::Pass(HandOver::NotLeader);
        assert_eq!(g.told(&pass), (None, None));
        assert!(g.told(&hold).0.is_some(), "a new spell is told again");
        let moved = Look::Pass(HandOver::Moved {
            from: "lucy".into(),
            to: "quinn".into(),
        });
        assert_eq!(
            g.told(&moved),
            (
                Some((
                    Reason::EtcdLeaderMoved,
                    "etcd's leadership moved from lucy to quinn".into()
                )),
                None
            )
        );
    }
}
