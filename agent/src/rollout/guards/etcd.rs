//! The etcd guard of a control-plane node with a stacked member: the look admission asks for
//! before the node takes a slot (the verdict of `etcd::View::blockers`), and the last look,
//! made by the slot's holder right before the disruption (the activation, the reboot command):
//! the same verdict again, for a member may have failed while the node drained, and, in the
//! look that found the cluster fit, the hand-over of the leadership. Moved there, not before
//! the slot, so that a node waiting for the slot never moves it for nothing. The node's own
//! member catching up after the disruption is the `etcd` health probe's (the gate requires
//! it).
//!
//! A member that cannot be asked is the guard's failure, never a pass: a control-plane node
//! whose etcd does not answer waits, whatever `rollout.on_api_unavailable` says.

use crate::config::EtcdConfig;
use crate::etcd::{Client, EtcdError, HandOver, Unfit, hand_over, observe};
use crate::types::{Notices, Reason, Revision};
use crate::util::Spell;

/// What the guard remembers between looks: whether it held the node at the last look, so
/// that the `EtcdUnhealthy` notice is given once per spell, not once per look.
#[derive(Debug, Default)]
pub struct EtcdGuard {
    blocking: Spell,
}

/// One look's outcome.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EtcdAnswer {
    Pass(HandOver),
    /// The node waits: why.
    Wait(String),
}

impl EtcdGuard {
    /// Looks at etcd; `None` lets the node through, `Some(reason)` holds it. Gives the
    /// `EtcdUnhealthy` notice when a hold starts.
    pub async fn check(
        &mut self,
        cfg: &EtcdConfig,
        notices: &Notices,
        revision: &Revision,
    ) -> Option<String> {
        let look = look(cfg).await;
        self.tell(look, notices, revision)
    }

    /// Right before a disruption, with the slot held: the cluster must be able to lose this
    /// node's member now, and then the leadership moves away if that member leads.
    /// `Err(reason)` when either fails: the node must not go down.
    pub async fn last_look(
        &mut self,
        cfg: &EtcdConfig,
        notices: &Notices,
        revision: &Revision,
    ) -> Result<(), String> {
        let look = moved(cfg).await;
        match self.tell(look, notices, revision) {
            Some(why) => Err(why),
            None => Ok(()),
        }
    }

    /// Logs and notices a look, and the reason to wait with, if any.
    fn tell(&mut self, look: EtcdAnswer, notices: &Notices, revision: &Revision) -> Option<String> {
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
    fn told(&mut self, look: &EtcdAnswer) -> (Option<(Reason, String)>, Option<String>) {
        match look {
            EtcdAnswer::Wait(why) => {
                let first = self.blocking.starts(true);
                let reason = format!("etcd: {why}");
                (
                    first.then(|| (Reason::EtcdUnhealthy, reason.clone())),
                    Some(reason),
                )
            }
            EtcdAnswer::Pass(moved) => {
                self.blocking.starts(false);
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

/// A client and one look at etcd, or why there is none.
async fn view(cfg: &EtcdConfig) -> Result<(Client, crate::etcd::View), EtcdError> {
    let client = Client::new(cfg)?;
    let view = observe(&client).await?;
    Ok((client, view))
}

/// Why there is no look, as the wait says it.
fn no_look(e: EtcdError) -> String {
    match e {
        EtcdError::Setup(why) => why,
        EtcdError::Unreachable(why) => {
            format!("{why}; a member that cannot be asked is not passed")
        }
    }
}

/// The guard's look: every member fit, and the quorum kept without this node.
pub async fn look(cfg: &EtcdConfig) -> EtcdAnswer {
    match view(cfg).await {
        Err(e) => EtcdAnswer::Wait(no_look(e)),
        Ok((_, v)) => match v.blockers(u64::from(cfg.max_lag)) {
            Some(why) => EtcdAnswer::Wait(why),
            None => EtcdAnswer::Pass(HandOver::NotLeader),
        },
    }
}

/// The last look: every member fit and the quorum kept without this node, as before the slot;
/// then, when this node's member leads (and `etcd.hand_over` is on), the leadership moved to
/// the fittest other member and seen there.
async fn moved(cfg: &EtcdConfig) -> EtcdAnswer {
    let (client, v) = match view(cfg).await {
        Ok(x) => x,
        Err(e) => return EtcdAnswer::Wait(no_look(e)),
    };
    let max_lag = u64::from(cfg.max_lag);
    match hand_over(&client, v, max_lag, cfg.hand_over_attempts, cfg.hand_over).await {
        Ok(done) => EtcdAnswer::Pass(done),
        Err(Unfit::Cluster(why)) => EtcdAnswer::Wait(why),
        Err(Unfit::Leading(why)) => EtcdAnswer::Wait(format!(
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
        let hold = EtcdAnswer::Wait("quinn has the alarm NOSPACE".into());
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
        let pass = EtcdAnswer::Pass(HandOver::NotLeader);
        assert_eq!(g.told(&pass), (None, None));
        assert!(g.told(&hold).0.is_some(), "a new spell is told again");
        let moved = EtcdAnswer::Pass(HandOver::Moved {
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
