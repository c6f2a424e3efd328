//! Halts the gatekeeper writes or lifts: a revision whose gate failed here (or that counts
//! against its failure budget), the halt a slot taken over from a vanished holder owes the
//! fleet, and the lifting of such a halt once the holder is back and its gate passed.

use super::*;
use crate::rollout::decide::admission::Owed;
use crate::rollout::decide::takeover::{Taker, takeover};
use crate::rollout::fleet::Counted;
use crate::rollout::keeper::fleet_cache::fleet_of;
use crate::rollout::lock::lease::{LockError, Vanished};

impl Gatekeeper {
    /// This node took over a slot from `v`, which stopped renewing it (see `takeover.rs`).
    /// `Some(wait)` when this node must not go on now; a halt that cannot be written yet is
    /// owed (written first at the next ask), the slot kept meanwhile.
    pub(crate) async fn took_over(
        &mut self,
        cfg: &Config,
        v: Vanished,
        revision: &Revision,
    ) -> Option<Verdict> {
        let group = cfg.rollout.group_for(cfg.node.role);
        let lease = self
            .locker
            .held()
            .and_then(|h| h.slot)
            .map(|i| crate::config::RolloutConfig::slot_lease(&group, i))
            .unwrap_or_default();
        let taker = Taker {
            me: cfg.node_name(),
            group: &group,
            lease: &lease,
            policy: cfg.rollout.on_holder_lost,
        };
        let t = takeover(&v, &taker, util::now());
        let doing = v.doing.clone().unwrap_or_default();
        tracing::warn!(holder = %v.node, lease = %lease, phase = doing.phase.as_str(),
            revision = t.theirs.as_ref().map_or("-", |r| r.short()),
            "took over a rollout slot whose holder stopped renewing it");
        self.w.notices.emit(
            Reason::HolderVanished,
            t.theirs.as_ref().map(Revision::as_str),
            t.notice,
        );
        if t.spared
            && let Some(theirs) = &t.theirs
        {
            tracing::warn!(holder = %v.node, revision = %theirs.short(),
                "not halting the revision of the vanished holder (rollout.on_holder_lost = \"proceed\")");
        }
        debug_assert!(t.halt.is_none() || cfg.rollout.on_holder_lost == OnHolderLost::Halt);
        let halt = t.halt?;
        let theirs = halt.revision.clone();
        Some(match self.write_owed_halt(halt).await {
            Ok(()) => Verdict::Wait(admission::Wait {
                waiting_for: WaitingFor::Halted,
                reason: format!(
                    "{} vanished while rolling out {}: halted, and the group waits{}",
                    v.node,
                    theirs.short(),
                    if &theirs == revision {
                        ""
                    } else {
                        " (this node's revision too)"
                    }
                ),
                until: None,
            }),
            // A refusal stays a refusal: never a reason to go on without the lock.
            Err(e) => admission::lock_error(
                cfg.rollout.on_api_unavailable,
                e.context(&format!(
                    "cannot halt revision {} of the vanished holder {}",
                    theirs.short(),
                    v.node
                )),
            ),
        })
    }

    /// Writes the halt this node owes, and says whether the fleet now halts `revision`.
    pub(crate) async fn pay_owed_halt(&mut self, revision: &Revision) -> Result<Owed, LockError> {
        let Some(halt) = self.owed_halt.clone() else {
            return Ok(Owed::None);
        };
        self.write_owed_halt(halt).await?;
        let halts_this = self.fleet().and_then(|f| f.halt_of(revision)).is_some();
        Ok(Owed::Written { halts_this })
    }

    /// Writes a `holder-vanished` halt (owed until it is written); once written, the slot
    /// taken over is released: the group waits for the vanished holder.
    async fn write_owed_halt(&mut self, halt: Halt) -> Result<(), LockError> {
        let revision = halt.revision.clone();
        let node = halt.node.clone();
        self.owed_halt = Some(halt.clone());
        self.halt(halt).await?;
        self.owed_halt = None;
        tracing::error!(revision = %revision.short(), holder = %node, reason = "holder-vanished",
            "revision halted cluster-wide: its holder vanished while rolling it out");
        let me = self.w.config.borrow().node_name().to_owned();
        self.w.notices.emit(
            Reason::RevisionHalted,
            Some(revision.as_str()),
            format!(
                "revision {} halted fleet-wide by {me}: its holder {node} vanished while rolling it out; `ginxctl rollout clear {}` lifts it",
                revision.short(),
                revision.short()
            ),
        );
        if let Some(h) = self.locker.held().cloned()
            && let Err(e) = self.release(&h).await
        {
            tracing::warn!(error = %e, "cannot release the slot taken over; it expires by itself");
            self.locker.forget();
        }
        Ok(())
    }

    /// `revision`'s gate passed on this node: a `holder-vanished` halt naming this node is
    /// lifted (the revision did not kill it; it was cut off).
    pub async fn lift_vanished(&mut self, revision: &Revision) {
        let cfg = self.cfg();
        if effective(&cfg) != Effective::Kubernetes {
            return;
        }
        let halted_here = self
            .fleet()
            .and_then(|f| f.halt_of(revision))
            .is_none_or(|h| h.cause == HaltCause::HolderVanished && h.node == cfg.node_name());
        if !halted_here || !self.can_halt() {
            return;
        }
        let Some(clients) = self.clients() else {
            return;
        };
        match fleet_of(&cfg, &clients)
            .lift_vanished(revision, cfg.node_name())
            .await
        {
            Ok(u) => {
                if u.changed {
                    tracing::warn!(revision = %revision.short(),
                        "lifted the holder-vanished halt of this revision: this node came back and its gate passed");
                }
                self.fleet.state = Some(u.state);
            }
            Err(e) => {
                tracing::warn!(revision = %revision.short(), error = %e, "cannot lift the holder-vanished halt naming this node; `ginxctl rollout clear` lifts it")
            }
        }
    }

    /// Halts `halt.revision` cluster-wide.
    pub async fn halt(&mut self, halt: Halt) -> Result<(), LockError> {
        let cfg = self.cfg();
        let Some(clients) = self.clients() else {
            return Err(LockError::Unavailable(
                "no connection to the Kubernetes API".into(),
            ));
        };
        let u = fleet_of(&cfg, &clients).halt(halt).await?;
        self.fleet.state = Some(u.state);
        if u.changed {
            self.w.metrics.halted();
        }
        Ok(())
    }

    /// Counts this node's failure of `halt.revision` against its budget
    /// (`rollout.halt_after`): the revision is halted when the count reaches it, else this node
    /// is quarantined and the rollout goes on.
    pub async fn fail(&mut self, halt: Halt) -> Result<Counted, LockError> {
        let cfg = self.cfg();
        let Some(clients) = self.clients() else {
            return Err(LockError::Unavailable(
                "no connection to the Kubernetes API".into(),
            ));
        };
        let (state, counted) = fleet_of(&cfg, &clients)
            .fail(halt, cfg.rollout.halt_after)
            .await?;
        self.fleet.state = Some(state);
        if counted.changed && counted.halted {
            self.w.metrics.halted();
        }
        Ok(counted)
    }
}
