//! The drain before a live activation: when a revision's plan calls for `drain`
//! (`[disruption]`: it restarts the container runtime, the kubelet, the CNI or the network),
//! the node is cordoned and drained through PodDisruptionBudgets with the slot held, before the
//! gate's baseline and the fencing check; the activation runs; the node is uncordoned once its
//! gate is over. The same machinery, settings (`reboot.drain_timeout`, `force`,
//! `delete_emptydir_data`, `grace_period`), Events and metrics as a reboot's drain.
//!
//! Every step is persisted (`state.apply_drain`) before it is acted on: a ginx killed mid-drain
//! goes on with it, and uncordons what it cordoned. A drain that takes longer than
//! `reboot.drain_timeout` is given up, and so is an activation the last look (the guards asked
//! again right before it) holds longer than `reboot.guard_timeout`: the node is uncordoned and
//! the slot released at once, and the activation put off to the next reboot window (or the
//! timeout once more).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{DRAIN_POLL, EVICT_AGAIN, RebootView, decide, drain};
use crate::reconcile::Reconciler;
use crate::state::ApplyDrain;
use crate::status::WaitingFor;
use crate::types::{Reason, Revision};
use crate::util;

/// What the drain before an activation keeps in memory.
#[derive(Debug, Default)]
pub(in crate::reconcile) struct LiveDrain {
    /// An attempt given up: that revision's activation waits until then.
    put_off: Option<PutOff>,
    /// Look again after this, even if nothing else changes.
    pub again: Option<Duration>,
    /// "No cluster to drain in" was logged for this revision.
    told_no_cluster: Option<Revision>,
    /// The drain's deadline, on the monotonic clock.
    clock: Option<super::decide::DrainClock>,
    /// While the last look holds the node: when it gives up (`reboot.guard_timeout`).
    last_look: Option<super::decide::DrainClock>,
}

/// An activation put off: until when (monotonic, and shown as the wall-clock time), what it
/// waited for and why.
#[derive(Debug)]
struct PutOff {
    revision: Revision,
    until: Instant,
    shown: jiff::Timestamp,
    waiting_for: WaitingFor,
    why: String,
}

impl LiveDrain {
    /// The activation of `revision` was given up and waits: for what, why, until when.
    pub(in crate::reconcile) fn put_off(&self, revision: &Revision) -> Option<Wait> {
        match &self.put_off {
            Some(p) if p.revision == *revision && Instant::now() < p.until => Some((
                p.waiting_for,
                format!("{}; tried again at {}", p.why, p.shown),
            )),
            _ => None,
        }
    }

    /// The last look let the node go.
    pub(in crate::reconcile) fn looked(&mut self) {
        self.last_look = None;
    }
}

/// A wait: what for and why, in words for status.
type Wait = (WaitingFor, String);

impl Reconciler {
    /// With the slot held, before the baseline and the fencing: the drain `revision`'s plan
    /// calls for. `Ok` when its activation may start; `Err` while it has to wait.
    pub(in crate::reconcile) async fn drain_before_activation(
        &mut self,
        revision: &Revision,
    ) -> Result<(), Wait> {
        if let Some(d) = self.core.state().phase.live_drain().cloned()
            && d.revision != *revision
            && !d.activated
        {
            // Drained for a revision that did not come to be activated: give the node back.
            self.end_live_drain(&d).await?;
        }
        let st = self.core.state();
        let plan = st
            .built
            .as_ref()
            .filter(|b| b.revision == *revision)
            .and_then(|b| b.plan.as_ref());
        let Some(because) = decide::drain_wanted(plan) else {
            return Ok(());
        };
        if st.phase.rebooting().is_some() {
            // A reboot kept after a failed gate keeps the node cordoned and drained; it gives
            // the node back when it ends, after this activation.
            return Ok(());
        }
        if !self.gatekeeper.can_halt() {
            if self.live_drain.told_no_cluster.as_ref() != Some(revision) {
                tracing::info!(revision = %revision.short(), because = %because.join(", "),
                    "the plan calls for a drain, but there is no cluster to drain in: activating live");
                self.live_drain.told_no_cluster = Some(revision.clone());
            }
            return Ok(());
        }
        let d = match self.core.state().phase.live_drain().cloned() {
            Some(d) => d,
            None => self.begin_live_drain(revision, because)?,
        };
        if d.drained_at.is_some() {
            return Ok(());
        }
        let cfg = Arc::clone(&self.config.borrow());
        let node = cfg.node_name().to_owned();
        if !self.reboot_view.cordon_checked {
            let client = self
                .node_client()
                .map_err(|e| (WaitingFor::Api, e.to_string()))?;
            let ours = drain::cordon(&client, &node)
                .await
                .map_err(|e| (e.waiting_for(), e.to_string()))?;
            self.reboot_view.cordon_checked = true;
            if ours {
                tracing::info!(node = %node, revision = %revision.short(), "cordoned before the activation");
            }
            self.transition(|c| c.apply_drain_cordoned(ours))
                .map_err(|e| (WaitingFor::Api, e))?;
        }
        let (client, main) = match (self.node_client(), self.main_client()) {
            (Ok(c), Some(m)) => (c, m),
            (Err(e), _) => return Err(self.drain_late(&d, (WaitingFor::Api, e.to_string())).await),
            (_, None) => {
                let why = "no connection to the Kubernetes API while draining".to_owned();
                return Err(self.drain_late(&d, (WaitingFor::Api, why)).await);
            }
        };
        match self.drain_pass(&cfg, &client, &main, &node).await {
            Ok(true) => {}
            Ok(false) => {
                let v = &self.reboot_view;
                let what = decide::drain_waiting(&v.evicting, &v.refused);
                let why = format!("draining before the activation: {what}");
                return Err(self.drain_late(&d, (WaitingFor::Pods, why)).await);
            }
            Err(e) => return Err(self.drain_late(&d, (WaitingFor::Api, e)).await),
        }
        let now = util::now();
        let took = now.duration_since(d.started_at).as_secs_f64().max(0.0);
        self.metrics.drained(took);
        tracing::info!(node = %node, revision = %revision.short(), seconds = took,
            "drained; the activation starts");
        self.transition(|c| c.apply_drained(now))
            .map_err(|e| (WaitingFor::Api, e))
    }

    /// Records the drain's start and tells of it.
    fn begin_live_drain(
        &mut self,
        revision: &Revision,
        because: Vec<String>,
    ) -> Result<ApplyDrain, Wait> {
        let now = util::now();
        let said = because.join(", ");
        self.transition(|c| c.begin_apply_drain(revision, because, now))
            .map_err(|e| (WaitingFor::Api, e))?;
        self.reboot_view = RebootView::default();
        tracing::info!(revision = %revision.short(), because = %said,
            "the plan calls for a drain: cordoning and draining before the activation");
        self.notices.emit(
            Reason::Draining,
            Some(revision.as_str()),
            format!(
                "draining before the activation of revision {} ({said})",
                revision.short()
            ),
        );
        self.core
            .state()
            .phase
            .live_drain()
            .cloned()
            .ok_or((WaitingFor::Api, "the drain was not recorded".to_owned()))
    }

    /// A drain not done: wait (looking again soon), or give it up past `reboot.drain_timeout`.
    async fn drain_late(&mut self, d: &ApplyDrain, wait: Wait) -> Wait {
        let cfg = Arc::clone(&self.config.borrow());
        let timeout = cfg.reboot.drain_timeout.get();
        let now = util::now();
        let clock = decide::DrainClock::of(
            self.live_drain.clock,
            d.started_at,
            timeout,
            now,
            Instant::now(),
        );
        self.live_drain.clock = Some(clock);
        if !clock.overdue(Instant::now()) {
            self.live_drain.again = Some(DRAIN_POLL);
            return wait;
        }
        let reason = decide::given_up(
            &cfg.reboot.drain_timeout.to_string(),
            &self.reboot_view.evicting,
            &self.reboot_view.refused,
        );
        let wait = (WaitingFor::Pods, reason);
        self.put_activation_off(&d.revision, wait, timeout, Reason::DrainBlocked)
            .await
    }

    /// The last look held the node before the activation: it waits, keeping its slot and its
    /// cordon, and looks again; held past `reboot.guard_timeout` (from when it was drained, or
    /// else first held) it gives the attempt up as a drain that timed out does.
    pub(in crate::reconcile) async fn held_before_activation(
        &mut self,
        revision: &Revision,
        (waiting_for, why): Wait,
    ) -> Wait {
        let cfg = Arc::clone(&self.config.borrow());
        let timeout = cfg.reboot.guard_timeout.get();
        let now = util::now();
        let drained = self
            .core
            .state()
            .phase
            .live_drain()
            .filter(|d| d.revision == *revision)
            .and_then(|d| d.drained_at);
        let since = drained
            .or(self.live_drain.last_look.map(|c| c.started()))
            .unwrap_or(now);
        let clock = decide::DrainClock::of(
            self.live_drain.last_look,
            since,
            timeout,
            now,
            Instant::now(),
        );
        self.live_drain.last_look = Some(clock);
        if !clock.overdue(Instant::now()) {
            return (waiting_for, why);
        }
        let reason = decide::guards_gave_up(&cfg.reboot.guard_timeout.to_string(), &why);
        self.put_activation_off(revision, (waiting_for, reason), timeout, Reason::PutOff)
            .await
    }

    /// Gives the attempt up: the node back (uncordoned if ginx drained it for `revision`) and
    /// the slot released at once, and the activation put off to the next reboot window (with
    /// none, by `retry`), told as `told`.
    async fn put_activation_off(
        &mut self,
        revision: &Revision,
        (waiting_for, reason): Wait,
        retry: Duration,
        told: Reason,
    ) -> Wait {
        let why = format!("activation put off: {reason}");
        // Status shows the give-up with its reason from the first publish that shows it.
        self.core
            .set_waiting(Some((waiting_for, why.clone())), util::now());
        if let Some(d) = self.core.state().phase.live_drain().cloned()
            && d.revision == *revision
            && let Err(e) = self.end_live_drain(&d).await
        {
            return e;
        }
        self.give_slot_back().await;
        let cfg = Arc::clone(&self.config.borrow());
        let now = util::now();
        let until = decide::next_try(cfg.reboot.windows(&cfg.rollout), retry, now);
        let wait_for = until.duration_since(now).unsigned_abs();
        tracing::error!(revision = %revision.short(), reason = %reason, next_try = %until,
            "activation put off: the node is given back and its slot released");
        self.notices
            .emit(told, Some(revision.as_str()), why.clone());
        self.live_drain.put_off = Some(PutOff {
            revision: revision.clone(),
            until: Instant::now() + wait_for,
            shown: until,
            waiting_for,
            why: why.clone(),
        });
        self.live_drain.last_look = None;
        self.live_drain.clock = None;
        // A release that failed is tried again soon, not at the end of the put-off.
        let again = if self.lock_retry_at.is_some() {
            crate::rollout::RECHECK
        } else {
            wait_for.max(DRAIN_POLL)
        };
        self.live_drain.again = Some(again);
        self.publish();
        (waiting_for, why)
    }

    /// Gives the node back: uncordoned if ginx cordoned it, the record ended.
    async fn end_live_drain(&mut self, d: &ApplyDrain) -> Result<(), Wait> {
        if d.cordoned {
            let node = self.config.borrow().node_name().to_owned();
            let client = self.node_client().map_err(|e| {
                self.live_drain.again = Some(EVICT_AGAIN);
                (
                    WaitingFor::Api,
                    format!("waiting to uncordon the node: {e}"),
                )
            })?;
            match drain::uncordon(&client, &node).await {
                Ok(true) => {
                    tracing::info!(node = %node, revision = %d.revision.short(), "uncordoned")
                }
                Ok(false) => {}
                Err(e) => {
                    self.live_drain.again = Some(EVICT_AGAIN);
                    return Err((
                        WaitingFor::Api,
                        format!("waiting to uncordon the node: {e}"),
                    ));
                }
            }
        }
        self.reboot_view = RebootView::default();
        self.transition(|c| c.end_apply_drain().map(|_| ()))
            .map_err(|e| (WaitingFor::Api, e))
    }

    /// Once a drained revision's activation and gate are over: the node is given back.
    pub(in crate::reconcile) async fn settle_live_drain(&mut self) {
        if !decide::apply_drain_over(self.core.state()) {
            return;
        }
        let Some(d) = self.core.state().phase.live_drain().cloned() else {
            return;
        };
        match self.end_live_drain(&d).await {
            Ok(()) => tracing::info!(revision = %d.revision.short(),
                "the activation after the drain is over: the node is schedulable again"),
            Err((_, why)) => tracing::warn!(revision = %d.revision.short(), reason = %why,
                "cannot give the node back yet; trying again"),
        }
    }

    /// The activation of a drained revision begins.
    pub(in crate::reconcile) fn live_drain_activated(&mut self, revision: &Revision) {
        let drained = self
            .core
            .state()
            .phase
            .live_drain()
            .is_some_and(|d| d.revision == *revision && d.drained_at.is_some());
        if drained {
            let _ = self.transition(|c| c.apply_drain_activated());
        }
    }
}
