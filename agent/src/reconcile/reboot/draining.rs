//! The reboot's drain as steps of the loop: waiting for blocking pods, cordoning, one pass of
//! evictions per turn, and giving the drain up when it takes too long (the node uncordoned, the
//! reboot put off). The Kubernetes calls are in `drain`; what is due and the words for status in
//! `decide`.

use std::sync::Arc;
use std::time::Instant;

use super::drain::{self, Eviction};
use super::{DRAIN_POLL, EVICT_AGAIN, Step, decide};
use crate::config::Config;
use crate::reconcile::Reconciler;
use crate::state::Rebooting;
use crate::status::WaitingFor;
use crate::types::Reason;
use crate::util;

impl Reconciler {
    /// Steps 4–7: blocking pods, cordon, drain; then the last look and the reboot. A node
    /// drained already (the last look held it) is not drained again.
    pub(super) async fn drain_step(&mut self, r: Rebooting) -> Step {
        let cfg = Arc::clone(&self.config.borrow());
        if self.gatekeeper.can_halt() && r.drained_at.is_none() {
            if let Some(step) = self.before_drain(&cfg, &r).await {
                return step;
            }
            let r = self.core.state().phase.rebooting().cloned().unwrap_or(r);
            if let Some(step) = self.evict_all(&cfg, &r).await {
                return step;
            }
            if self.transition(|c| c.reboot_drained(util::now())).is_err() {
                return Step::After(EVICT_AGAIN);
            }
            self.set_reboot_waiting(None);
        }
        self.reboot_now(&cfg).await
    }

    /// Before the first eviction: no blocking pod on the node (only before the drain began),
    /// and the node cordoned (once per process). `Some` while it has to wait.
    async fn before_drain(&mut self, cfg: &Config, r: &Rebooting) -> Option<Step> {
        let node = cfg.node_name();
        if r.drain_started_at.is_none() {
            let client = match self.node_client() {
                Ok(c) => c,
                Err(e) => {
                    self.set_reboot_waiting(Some((
                        WaitingFor::Api,
                        format!("{e}: the node is not cordoned or drained yet"),
                    )));
                    return Some(Step::After(EVICT_AGAIN));
                }
            };
            if let Some(sel) = &cfg.reboot.blocking_pod_selector
                && let Some(step) = self.blocking_pods(&client, node, sel).await
            {
                return Some(step);
            }
        }
        if !self.reboot_view.cordon_checked {
            let client = match self.node_client() {
                Ok(c) => c,
                Err(e) => {
                    self.set_reboot_waiting(Some((WaitingFor::Api, e.to_string())));
                    return Some(Step::After(EVICT_AGAIN));
                }
            };
            return self.cordon(&client, node).await;
        }
        None
    }

    /// Waits while a pod matching `reboot.blocking_pod_selector` runs on the node. `Some`
    /// while it has to wait; `None` when there is none.
    async fn blocking_pods(
        &mut self,
        client: &kube::Client,
        node: &str,
        sel: &str,
    ) -> Option<Step> {
        match drain::blocking(client, node, sel).await {
            Ok(pods) if !pods.is_empty() => {
                self.reboot_view.blocking = pods.clone();
                self.set_reboot_waiting(Some((
                    WaitingFor::Pods,
                    format!(
                        "pods matching reboot.blocking_pod_selector {sel:?} run on the node: {}",
                        pods.join(", ")
                    ),
                )));
                Some(Step::After(EVICT_AGAIN))
            }
            Ok(_) => {
                self.reboot_view.blocking.clear();
                None
            }
            Err(e) => {
                self.set_reboot_waiting(Some((e.waiting_for(), e.to_string())));
                Some(Step::After(EVICT_AGAIN))
            }
        }
    }

    /// Cordons the node and records whether ginx did (it uncordons only then) and when the
    /// drain began. `None` once that is recorded.
    async fn cordon(&mut self, client: &kube::Client, node: &str) -> Option<Step> {
        let ours = match drain::cordon(client, node).await {
            Ok(ours) => ours,
            Err(e) => {
                self.set_reboot_waiting(Some((e.waiting_for(), e.to_string())));
                return Some(Step::After(EVICT_AGAIN));
            }
        };
        self.reboot_view.cordon_checked = true;
        let reasons = self.reboot_reasons().join("; ");
        self.notices.emit(
            Reason::Draining,
            None,
            format!(
                "cordoned{}; draining before the reboot ({reasons})",
                if ours { "" } else { " already (not by ginx)" }
            ),
        );
        if ours {
            tracing::info!(node = %node, "cordoned");
        } else {
            tracing::info!(node = %node, "the node was cordoned already (not by ginx): it stays cordoned after the reboot");
        }
        let now = util::now();
        if self.transition(|c| c.reboot_cordoned(ours, now)).is_err() {
            return Some(Step::After(EVICT_AGAIN));
        }
        None
    }

    /// One pass of evictions; `None` once the node is drained (the time it took counted).
    async fn evict_all(&mut self, cfg: &Config, r: &Rebooting) -> Option<Step> {
        let node = cfg.node_name();
        let (client, main) = match (self.node_client(), self.main_client()) {
            (Ok(c), Some(m)) => (c, m),
            (Err(e), _) => {
                self.set_reboot_waiting(Some((WaitingFor::Api, format!("{e}, while draining"))));
                return Some(self.drain_deadline(cfg, r).await);
            }
            (_, None) => {
                self.set_reboot_waiting(Some((
                    WaitingFor::Api,
                    "no connection to the Kubernetes API while draining".into(),
                )));
                return Some(self.drain_deadline(cfg, r).await);
            }
        };
        match self.drain_pass(cfg, &client, &main, node).await {
            Ok(true) => {}
            Ok(false) => return Some(self.drain_deadline(cfg, r).await),
            Err(e) => {
                self.set_reboot_waiting(Some((WaitingFor::Api, e)));
                return Some(self.drain_deadline(cfg, r).await);
            }
        }
        if let Some(t) = r.drain_started_at {
            let took = util::now().duration_since(t).as_secs_f64().max(0.0);
            self.metrics.drained(took);
            tracing::info!(node = %node, seconds = took, "drained");
        }
        None
    }

    /// One look at the node's pods: evicts what is due. `Ok(true)` when the node is drained.
    /// `client` is the node's own identity (its pods, their evictions); `main` ginx's (the
    /// budgets that hold an eviction).
    pub(super) async fn drain_pass(
        &mut self,
        cfg: &Config,
        client: &kube::Client,
        main: &kube::Client,
        node: &str,
    ) -> Result<bool, String> {
        let pods = drain::pods_on(client, node).await?;
        let plan = drain::plan(&pods, cfg.reboot.force, cfg.reboot.delete_emptydir_data);
        let v = &mut self.reboot_view;
        v.evicting = plan
            .evict
            .iter()
            .chain(&plan.terminating)
            .map(ToString::to_string)
            .collect();
        v.refused = plan.refused.clone();
        let live: std::collections::BTreeSet<&str> =
            plan.evict.iter().map(|p| p.uid.as_str()).collect();
        v.tried.retain(|uid, _| live.contains(uid.as_str()));
        v.budgets.retain(|uid, _| live.contains(uid.as_str()));
        if plan.done() {
            return Ok(true);
        }
        let grace = cfg.reboot.grace_period.map(|d| d.get());
        for p in &plan.evict {
            let due =
                decide::evict_due(self.reboot_view.tried.get(&p.uid).copied(), Instant::now());
            if !due {
                if let Some(b) = self.reboot_view.budgets.get(&p.uid) {
                    self.reboot_view.refused.insert(p.to_string(), b.clone());
                }
                continue;
            }
            self.reboot_view.tried.insert(p.uid.clone(), Instant::now());
            match drain::evict(client, p, grace).await? {
                Eviction::Accepted => {
                    self.reboot_view.budgets.remove(&p.uid);
                    tracing::info!(pod = %p, "evicted");
                }
                Eviction::Gone => {}
                Eviction::Refused(msg) => {
                    self.metrics.eviction_refused();
                    let known = self.reboot_view.budgets.contains_key(&p.uid);
                    if !known {
                        let pod = pods
                            .iter()
                            .find(|x| x.metadata.uid.as_deref() == Some(&p.uid));
                        let budgets = match pod {
                            Some(pod) => drain::budgets_for(main, pod)
                                .await
                                .unwrap_or_else(|e| vec![e.to_string()]),
                            None => Vec::new(),
                        };
                        let why = decide::refusal(&msg, &budgets);
                        tracing::warn!(pod = %p, reason = %why, "eviction refused; trying again every 5s");
                        self.reboot_view.budgets.insert(p.uid.clone(), why);
                    }
                    if let Some(b) = self.reboot_view.budgets.get(&p.uid) {
                        self.reboot_view.refused.insert(p.to_string(), b.clone());
                        // Each refusal: repeats are counted in the Event's series.
                        self.notices
                            .emit(Reason::DrainBlocked, None, format!("pod {p}: {b}"));
                    }
                }
            }
        }
        Ok(false)
    }

    /// A drain not done: wait, or give it up after `reboot.drain_timeout`.
    async fn drain_deadline(&mut self, cfg: &Config, r: &Rebooting) -> Step {
        let now = util::now();
        let clock = decide::DrainClock::of(
            self.reboot_view.drain_clock,
            decide::drain_started(r),
            cfg.reboot.drain_timeout.get(),
            now,
            Instant::now(),
        );
        self.reboot_view.drain_clock = Some(clock);
        if !clock.overdue(Instant::now()) {
            let v = &mut self.reboot_view;
            if v.waiting.is_none() || !v.refused.is_empty() {
                let what = decide::drain_waiting(&v.evicting, &v.refused);
                v.waiting = Some((WaitingFor::Pods, what));
            }
            // The pods going and the budgets refusing, as this pass found them.
            self.publish();
            return Step::After(DRAIN_POLL);
        }
        // Given up: give the node back as it was, release the slot, try in the next window.
        let reason = decide::given_up(
            &cfg.reboot.drain_timeout.to_string(),
            &self.reboot_view.evicting,
            &self.reboot_view.refused,
        );
        let wait = (WaitingFor::Pods, reason);
        let timeout = cfg.reboot.drain_timeout.get();
        let step = self
            .put_reboot_off(cfg, r, wait, timeout, Reason::DrainBlocked)
            .await;
        if self.core.state().phase.rebooting().is_none() {
            let started = r.drain_started_at.unwrap_or(r.started_at);
            self.metrics
                .drained(now.duration_since(started).as_secs_f64().max(0.0));
        }
        step
    }
}
