//! A reboot carried out by ginx (`reboot.mode = "when-required"`), one step per turn of the
//! loop so that the loop stays responsive (status, commands, the watchdog) throughout:
//!
//! 1. wait for a window (`[[reboot.windows]]`, default the rollout's);
//! 2. take a slot, or keep the one held since the apply;
//! 3. pass the quorum guard (control-plane nodes);
//! 4. wait while a pod matching `reboot.blocking_pod_selector` runs on the node;
//! 5. cordon, writing `ginx.io/cordoned-by-ginx` only when ginx made the node unschedulable;
//! 6. drain through the Eviction API (a 429 is tried again every [`EVICT_AGAIN`]; given up
//!    after `reboot.drain_timeout`: uncordoned, released, put off to the next window);
//! 7. raise the slot Lease's duration to `reboot.lock_ttl`;
//! 8. record `rebooting` with the boot id, then run `reboot.reboot_command`.
//!
//! In the new boot: the health gate; then uncordon (only what ginx cordoned), release the
//! slot, clear the requirement. A gate that fails after a reboot that followed an activation
//! rolls back with `system.boot_command` and reboots again in the same slot; the revision is
//! halted as for a failed activation.
//!
//! Every step is persisted before it is acted on: a ginx killed at any point resumes where it
//! was (the node cordoned by it is uncordoned by it, the slot it held is taken up again).

mod drain;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use self::drain::Eviction;
use super::Reconciler;
use super::core::{Core, Decision};
use crate::apply::system;
use crate::config::{Config, RebootMode, RollbackPolicy};
use crate::rollout::gate;
use crate::rollout::window::{self, WindowState};
use crate::rollout::{Permit, Purpose};
use crate::state::{AfterGate, RebootPhase, Rebooting, Verifying};
use crate::status::WaitingFor;
use crate::types::{Reason, Revision};
use crate::util;

/// How often `reboot.sentinel` is looked for.
pub(super) const SENTINEL_POLL: Duration = Duration::from_secs(5);
/// An eviction a PodDisruptionBudget refused is tried again this often.
pub(super) const EVICT_AGAIN: Duration = Duration::from_secs(5);
/// While draining, the node's pods are looked at this often.
const DRAIN_POLL: Duration = Duration::from_secs(1);
/// A reboot command that failed is run again after this.
const COMMAND_AGAIN: Duration = Duration::from_secs(60);
/// Still up in the same boot this long after the reboot command: run it again.
const REBOOT_AGAIN: Duration = Duration::from_secs(300);
/// The reboot command must exit within this (`systemctl reboot` returns at once).
const COMMAND_TIMEOUT: Duration = Duration::from_secs(120);

/// What the loop does after a step.
pub(super) enum Step {
    /// Go on at once.
    Again,
    /// Look again after this (or when something changes).
    After(Duration),
    /// Wait for the rollout (a window, a slot, the quorum) to change.
    Rollout,
}

/// What is known of the reboot beyond the persisted state: for status, and to pace the API.
#[derive(Default)]
pub(super) struct RebootView {
    pub waiting: Option<(WaitingFor, String)>,
    pub blocking: Vec<String>,
    pub evicting: Vec<String>,
    pub refused: BTreeMap<String, String>,
    /// When each pod (by UID) was last asked to go.
    tried: BTreeMap<String, Instant>,
    /// The budgets of a refused pod, looked up once per refusal streak.
    budgets: BTreeMap<String, String>,
    cordon_checked: bool,
    command_failed_at: Option<Instant>,
    /// This process ran the reboot command (and waits to be stopped).
    commanded_at: Option<Instant>,
}

impl RebootView {
    /// The refused pods and why, on one line.
    fn refused_list(&self) -> String {
        self.refused
            .iter()
            .map(|(p, why)| format!("{p}: {why}"))
            .collect::<Vec<_>>()
            .join("; ")
    }
}

impl Reconciler {
    /// Why a reboot is required now: what an activation left, and the sentinel file.
    pub(super) fn reboot_reasons(&self) -> Vec<String> {
        let cfg = self.config.borrow();
        let mut reasons = self
            .core
            .state()
            .reboot
            .as_ref()
            .map(|r| r.reasons.clone())
            .unwrap_or_default();
        let fresh = |m: std::fs::Metadata| {
            let Some(done) = self.core.state().rebooted_at else {
                return true;
            };
            m.modified()
                .ok()
                .and_then(|t| jiff::Timestamp::try_from(t).ok())
                .is_none_or(|t| t > done)
        };
        if std::fs::metadata(&cfg.reboot.sentinel).is_ok_and(fresh) {
            reasons.push(format!("{} exists", cfg.reboot.sentinel.display()));
        }
        reasons
    }

    /// Whether a new reboot may begin now (not whether the lock allows it): mode, a reason,
    /// no suspend, no failed gate waiting for an operator, not put off.
    fn reboot_may_begin(&self, cfg: &Config) -> bool {
        let st = self.core.state();
        cfg.reboot.mode == RebootMode::WhenRequired
            && st.rebooting.is_none()
            && !st.suspended
            && st
                .gate_failure
                .as_ref()
                .is_none_or(|g| g.next == AfterGate::RolledBack)
            && st
                .reboot_deferred
                .as_ref()
                .is_none_or(|d| util::now() >= d.until)
            && !self.reboot_reasons().is_empty()
    }

    /// Whether this turn of the loop works on the reboot, given the apply's decision: a reboot
    /// under way goes first (the node is cordoned); a new one begins when nothing is to be
    /// applied (or what is wanted is halted).
    pub(super) fn reboot_turn(&self, decision: &Decision) -> bool {
        if matches!(
            decision,
            Decision::Busy | Decision::Verify | Decision::RollBack
        ) {
            return false;
        }
        let st = self.core.state();
        if let Some(r) = &st.rebooting {
            return match r.phase {
                RebootPhase::Draining | RebootPhase::Rebooting | RebootPhase::Finishing => true,
                // The gate is the loop's (Decision::Verify); with none open and no rollback
                // coming (one that could not start), what comes next is decided here.
                RebootPhase::Verifying => st.verifying.is_none(),
                RebootPhase::Held => st.gate_failure.is_none(),
            };
        }
        let cfg = Arc::clone(&self.config.borrow());
        if !self.reboot_may_begin(&cfg) {
            return false;
        }
        match decision {
            Decision::Idle | Decision::RetryAt(_) => true,
            Decision::Start(d) => self
                .gatekeeper
                .fleet
                .as_ref()
                .is_some_and(|f| f.halt_of(&d.revision).is_some()),
            _ => false,
        }
    }

    /// Whether the slot held after an apply is kept for the reboot that follows it: a reboot
    /// is required, allowed, and its window is open now.
    pub(super) fn reboot_keeps_slot(&self) -> bool {
        let cfg = Arc::clone(&self.config.borrow());
        self.core.state().rebooting.is_some()
            || (self.reboot_may_begin(&cfg)
                && !matches!(
                    window::state(cfg.reboot.windows(&cfg.rollout), util::now()),
                    WindowState::Closed { .. }
                ))
    }

    /// The revision recorded with the reboot's lock: the applied one.
    fn reboot_revision(&self) -> Revision {
        self.core
            .state()
            .applied
            .as_ref()
            .map(|a| a.revision.clone())
            .or_else(|| self.desired().map(|(d, _)| d.revision))
            .unwrap_or_else(|| Revision::from_oid(git2::Oid::ZERO_SHA1))
    }

    /// The client for the API (the kubeconfig's server), when there is one.
    fn main_client(&self) -> Option<kube::Client> {
        self.kube.borrow().as_ref().map(|c| c.main.clone())
    }

    /// The node's own identity, for what ginx does to its own Node and pods (cordon, drain);
    /// or why there is none.
    fn node_client(&self) -> Result<kube::Client, String> {
        match self.kube.borrow().as_ref() {
            Some(c) => c.node(),
            None => Err("no connection to the Kubernetes API".to_owned()),
        }
    }

    fn set_reboot_waiting(&mut self, w: Option<(WaitingFor, String)>) {
        if let Some((what, why)) = &w
            && self.reboot_view.waiting.as_ref().map(|(k, _)| k) != Some(what)
        {
            tracing::info!(waiting_for = what.as_str(), reason = %why, "reboot required; waiting");
        }
        self.reboot_view.waiting = w;
    }

    /// One step of the reboot.
    pub(super) async fn step_reboot(&mut self) -> Step {
        let Some(r) = self.core.state().rebooting.clone() else {
            return self.begin_reboot().await;
        };
        match r.phase {
            RebootPhase::Draining => self.drain_step(r).await,
            RebootPhase::Rebooting => self.reboot_step(r).await,
            RebootPhase::Finishing | RebootPhase::Held => self.finish_reboot(r).await,
            RebootPhase::Verifying => {
                self.after_reboot_gate(false);
                Step::Again
            }
        }
    }

    /// Steps 1–3: window, slot, quorum.
    async fn begin_reboot(&mut self) -> Step {
        let held = self.core.state().rollout_held.clone();
        let revision = self.reboot_revision();
        match self
            .gatekeeper
            .permit_for(&revision, held.as_ref(), Purpose::Reboot)
            .await
        {
            Permit::Wait(what, why) => {
                self.set_reboot_waiting(Some((what, why)));
                Step::Rollout
            }
            Permit::Granted(lock) => {
                self.set_reboot_waiting(None);
                self.reboot_view = RebootView::default();
                let reasons = self.reboot_reasons();
                let now = util::now();
                let result = self.transition(|c| c.begin_reboot(lock, reasons, now));
                match result {
                    Ok(()) => {
                        tracing::info!(reasons = ?self.core.state().rebooting.as_ref().map(|r| &r.reasons),
                            "reboot: slot held; draining the node");
                        Step::Again
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "cannot record the reboot; not rebooting");
                        Step::After(COMMAND_AGAIN)
                    }
                }
            }
        }
    }

    /// Steps 4–7: blocking pods, cordon, drain; then the reboot.
    async fn drain_step(&mut self, r: Rebooting) -> Step {
        let cfg = Arc::clone(&self.config.borrow());
        let node = cfg.node_name().to_owned();
        let cluster = self.gatekeeper.can_halt();
        let client = self.node_client();
        let main = self.main_client();
        if cluster && r.drain_started_at.is_none() {
            let client = match &client {
                Ok(c) => c.clone(),
                Err(e) => {
                    self.set_reboot_waiting(Some((
                        WaitingFor::Api,
                        format!("{e}: the node is not cordoned or drained yet"),
                    )));
                    return Step::After(EVICT_AGAIN);
                }
            };
            if let Some(sel) = &cfg.reboot.blocking_pod_selector {
                match drain::blocking(&client, &node, sel).await {
                    Ok(pods) if !pods.is_empty() => {
                        self.reboot_view.blocking = pods.clone();
                        self.set_reboot_waiting(Some((
                            WaitingFor::Pods,
                            format!(
                                "pods matching reboot.blocking_pod_selector {sel:?} run on the node: {}",
                                pods.join(", ")
                            ),
                        )));
                        return Step::After(EVICT_AGAIN);
                    }
                    Ok(_) => self.reboot_view.blocking.clear(),
                    Err(e) => {
                        self.set_reboot_waiting(Some((WaitingFor::Api, e)));
                        return Step::After(EVICT_AGAIN);
                    }
                }
            }
        }
        if cluster && !self.reboot_view.cordon_checked {
            let client = match &client {
                Ok(c) => c.clone(),
                Err(e) => {
                    self.set_reboot_waiting(Some((WaitingFor::Api, e.clone())));
                    return Step::After(EVICT_AGAIN);
                }
            };
            match drain::cordon(&client, &node).await {
                Ok(ours) => {
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
                        return Step::After(EVICT_AGAIN);
                    }
                }
                Err(e) => {
                    self.set_reboot_waiting(Some((WaitingFor::Api, e)));
                    return Step::After(EVICT_AGAIN);
                }
            }
        }
        let r = self.core.state().rebooting.clone().unwrap_or(r);
        if cluster {
            let (client, main) = match (client, main) {
                (Ok(c), Some(m)) => (c, m),
                (Err(e), _) => {
                    self.set_reboot_waiting(Some((
                        WaitingFor::Api,
                        format!("{e}, while draining"),
                    )));
                    return self.drain_deadline(&cfg, &r).await;
                }
                (_, None) => {
                    self.set_reboot_waiting(Some((
                        WaitingFor::Api,
                        "no connection to the Kubernetes API while draining".into(),
                    )));
                    return self.drain_deadline(&cfg, &r).await;
                }
            };
            match self.drain_pass(&cfg, &client, &main, &node).await {
                Ok(true) => {}
                Ok(false) => return self.drain_deadline(&cfg, &r).await,
                Err(e) => {
                    self.set_reboot_waiting(Some((WaitingFor::Api, e)));
                    return self.drain_deadline(&cfg, &r).await;
                }
            }
            if let Some(t) = r.drain_started_at {
                let took = util::now().duration_since(t).as_secs_f64().max(0.0);
                self.metrics.drained(took);
                tracing::info!(node = %node, seconds = took, "drained");
            }
        }
        self.set_reboot_waiting(None);
        self.reboot_now(&cfg).await
    }

    /// One look at the node's pods: evicts what is due. `Ok(true)` when the node is drained.
    /// `client` is the node's own identity (its pods, their evictions); `main` ginx's (the
    /// budgets that hold an eviction).
    async fn drain_pass(
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
            let due = self
                .reboot_view
                .tried
                .get(&p.uid)
                .is_none_or(|t| t.elapsed() >= EVICT_AGAIN);
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
                                .unwrap_or_else(|e| vec![e]),
                            None => Vec::new(),
                        };
                        let why = if budgets.is_empty() {
                            format!("eviction refused (429): {msg}")
                        } else {
                            format!(
                                "eviction refused (429) by PodDisruptionBudget {}: {msg}",
                                budgets.join(", ")
                            )
                        };
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
        let started = r.drain_started_at.unwrap_or(r.started_at);
        let timeout = cfg.reboot.drain_timeout.get();
        if util::now() < util::after(started, timeout) {
            if self.reboot_view.waiting.is_none() || !self.reboot_view.refused.is_empty() {
                let what = if self.reboot_view.refused.is_empty() {
                    format!(
                        "draining: waiting for {}",
                        self.reboot_view.evicting.join(", ")
                    )
                } else {
                    format!("draining: {}", self.reboot_view.refused_list())
                };
                self.reboot_view.waiting = Some((WaitingFor::Pods, what));
            }
            return Step::After(DRAIN_POLL);
        }
        // Given up: give the node back as it was, release the slot, try in the next window.
        let node = cfg.node_name().to_owned();
        if r.cordoned {
            let Ok(client) = self.node_client() else {
                return Step::After(EVICT_AGAIN);
            };
            if let Err(e) = drain::uncordon(&client, &node).await {
                tracing::warn!(error = %e, "drain given up, but cannot uncordon yet; trying again");
                return Step::After(EVICT_AGAIN);
            }
        }
        let held = if self.reboot_view.refused.is_empty() {
            format!("pods still going: {}", self.reboot_view.evicting.join(", "))
        } else {
            self.reboot_view.refused_list()
        };
        let reason = format!(
            "drain given up after {} (reboot.drain_timeout): {held}; the node is uncordoned and \
             the slot released",
            cfg.reboot.drain_timeout
        );
        let until = next_try(cfg);
        self.metrics
            .drained(util::now().duration_since(started).as_secs_f64().max(0.0));
        tracing::error!(node = %node, reason = %reason, next_try = %until, "reboot put off");
        // Without the time it is tried again: a drain given up again counts in the series.
        self.notices.emit(
            Reason::DrainBlocked,
            None,
            format!("reboot put off: {reason}"),
        );
        let _ = self.transition(|c| c.drain_given_up(until, reason.clone()));
        self.reboot_view = RebootView::default();
        self.set_reboot_waiting(Some((WaitingFor::Pods, reason)));
        Step::Again
    }

    /// Step 7 and 8: the baseline, the Lease's duration, the record, the command.
    async fn reboot_now(&mut self, cfg: &Config) -> Step {
        if let Some(t) = self.reboot_view.command_failed_at
            && t.elapsed() < COMMAND_AGAIN
        {
            return Step::After(COMMAND_AGAIN - t.elapsed());
        }
        let baseline = match self.core.state().rebooting.as_ref() {
            Some(r) if !r.baseline.is_empty() => r.baseline.clone(),
            _ => gate::baseline(&self.gatekeeper.baseline_checks().await),
        };
        if self.core.state().rollout_held.is_some()
            && let Err(e) = self.gatekeeper.raise_ttl(cfg.reboot.lock_ttl.get()).await
        {
            tracing::warn!(error = %e, "cannot raise the slot Lease's duration before the reboot; trying again");
            self.set_reboot_waiting(Some((WaitingFor::Lock, e)));
            return Step::After(EVICT_AGAIN);
        }
        let boot = system::boot_id(&cfg.system.boot_id);
        let now = util::now();
        if self
            .transition(|c| c.reboot_commanded(boot, baseline, now))
            .is_err()
        {
            return Step::After(EVICT_AGAIN);
        }
        self.run_reboot_command(cfg).await
    }

    async fn run_reboot_command(&mut self, cfg: &Config) -> Step {
        let argv = &cfg.reboot.reboot_command;
        tracing::warn!(command = ?argv, "rebooting the node");
        self.notices.emit(
            Reason::Rebooting,
            None,
            format!("rebooting ({})", self.reboot_reasons().join("; ")),
        );
        self.publish();
        let mut cmd = tokio::process::Command::new(&argv[0]);
        cmd.args(&argv[1..])
            .env("GINX_NODE", cfg.node_name())
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true);
        let outcome = match tokio::time::timeout(COMMAND_TIMEOUT, cmd.output()).await {
            Err(_) => Err(format!(
                "did not finish within {}s",
                COMMAND_TIMEOUT.as_secs()
            )),
            Ok(Err(e)) => Err(format!("cannot run {}: {e}", argv[0])),
            Ok(Ok(out)) if out.status.success() => Ok(()),
            Ok(Ok(out)) => {
                let text = String::from_utf8_lossy(&out.stderr);
                let last = text
                    .lines()
                    .rev()
                    .find(|l| !l.trim().is_empty())
                    .unwrap_or("");
                Err(format!(
                    "exited with {}: {}",
                    out.status,
                    last.chars().take(200).collect::<String>()
                ))
            }
        };
        match outcome {
            Ok(()) => {
                self.reboot_view.command_failed_at = None;
                self.reboot_view.commanded_at = Some(Instant::now());
                self.set_reboot_waiting(None);
                Step::After(REBOOT_AGAIN)
            }
            Err(e) => {
                let why = format!(
                    "reboot.reboot_command {argv:?} {e}; run again in {}s",
                    COMMAND_AGAIN.as_secs()
                );
                tracing::error!(reason = %why, "the reboot command failed");
                self.reboot_view.command_failed_at = Some(Instant::now());
                self.set_reboot_waiting(Some((WaitingFor::Reboot, why)));
                Step::After(COMMAND_AGAIN)
            }
        }
    }

    /// Rebooting: in a new boot, the gate opens; still in the same boot, the command runs
    /// again once it has had its time.
    async fn reboot_step(&mut self, r: Rebooting) -> Step {
        let cfg = Arc::clone(&self.config.borrow());
        let boot = system::boot_id(&cfg.system.boot_id);
        if boot != r.boot_id {
            self.booted(r);
            return Step::Again;
        }
        let since = self
            .reboot_view
            .commanded_at
            .map(|t| t.elapsed())
            .or_else(|| {
                r.reboot_at
                    .map(|t| util::now().duration_since(t).unsigned_abs())
            })
            .unwrap_or(REBOOT_AGAIN);
        if since < REBOOT_AGAIN && self.reboot_view.command_failed_at.is_none() {
            return Step::After(REBOOT_AGAIN - since);
        }
        if let Some(t) = self.reboot_view.command_failed_at
            && t.elapsed() < COMMAND_AGAIN
        {
            return Step::After(COMMAND_AGAIN - t.elapsed());
        }
        tracing::warn!("still up in the same boot after the reboot command; running it again");
        if self.core.state().rollout_held.is_some()
            && let Err(e) = self.gatekeeper.raise_ttl(cfg.reboot.lock_ttl.get()).await
        {
            self.set_reboot_waiting(Some((WaitingFor::Lock, e)));
            return Step::After(EVICT_AGAIN);
        }
        self.run_reboot_command(&cfg).await
    }

    /// Up in a new boot: count it, and open the health gate (or finish, with nothing to
    /// verify).
    pub(super) fn booted(&mut self, r: Rebooting) {
        let cfg = Arc::clone(&self.config.borrow());
        self.metrics.rebooted();
        if r.rollback {
            self.metrics.reboot_rolled_back();
        }
        tracing::info!(
            previous_boot = r.boot_id.as_deref().unwrap_or("-"),
            rollback = r.rollback,
            "up in a new boot after the reboot"
        );
        self.notices.emit(
            Reason::Rebooted,
            None,
            if r.rollback {
                "up in a new boot, into the previous generation (rolled back)"
            } else {
                "up in a new boot after the reboot"
            },
        );
        let now = util::now();
        let revision = if r.rollback {
            self.core.state().rolled_back.clone()
        } else {
            self.core
                .state()
                .applied
                .as_ref()
                .map(|a| a.revision.clone())
        };
        let Some(revision) = revision else {
            let _ = self.transition(Core::reboot_finishing);
            return;
        };
        let verifying = Verifying {
            revision: revision.clone(),
            rollback: r.rollback,
            started_at: now,
            deadline: util::after(now, cfg.rollout.gate.timeout.get()),
            healthy_since: None,
            baseline: r.baseline.clone(),
            after_reboot: true,
        };
        let result = self.change_persisted(|c| c.verify_after_reboot(verifying));
        match result {
            Ok(Ok(())) => {
                tracing::info!(revision = %revision.short(), rollback = r.rollback, "health gate open after the reboot");
                self.gatekeeper.new_gate();
                self.gatekeeper.fast_probes(true);
                self.gate_failing.clear();
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "no health gate after the reboot; finishing");
                let _ = self.transition(Core::reboot_finishing);
            }
            Err(_) => {}
        }
    }

    /// After the gate after a reboot: passed → finishing; failed → rollback (if it followed
    /// an activation) or held.
    pub(super) fn after_reboot_gate(&mut self, passed: bool) {
        // A failed gate that asks for a rollback waits for it: the rollback reboots into the
        // previous generation (see `finish`).
        if self.transition(|c| c.reboot_gate_closed(passed)) == Ok(RebootPhase::Held) {
            tracing::error!(
                "the node stays cordoned and keeps its slot until an operator acts (`ginxctl retry`) or a fixed revision passes its gate"
            );
        }
    }

    /// The rollback after a failed gate after a reboot made the previous generation the boot
    /// default: reboot into it, in the same slot.
    pub(super) fn reboot_into_rollback(&mut self) {
        tracing::warn!("the previous generation is the boot default now; rebooting into it");
        self.reboot_view.cordon_checked = false;
        self.reboot_view.commanded_at = None;
        let _ = self.transition(Core::reboot_into_rollback);
    }

    /// The rollback policy for a gate after a reboot: a reboot that followed no activation
    /// (the sentinel only) has nothing to roll back; it is held for an operator.
    pub(super) fn reboot_gate_policy(&self, policy: RollbackPolicy) -> RollbackPolicy {
        match self.core.state().verifying.as_ref() {
            Some(v) if v.after_reboot && !v.rollback => {
                let followed_activation = self
                    .core
                    .state()
                    .rebooting
                    .as_ref()
                    .is_some_and(|r| r.reasons.iter().any(|x| !x.ends_with(" exists")));
                if followed_activation {
                    policy
                } else {
                    RollbackPolicy::Manual
                }
            }
            _ => policy,
        }
    }

    /// The last steps: uncordon what ginx cordoned, clear the reboot (the slot is released by
    /// `settle_lock` once nothing needs it).
    async fn finish_reboot(&mut self, r: Rebooting) -> Step {
        let cfg = Arc::clone(&self.config.borrow());
        if r.cordoned && self.gatekeeper.can_halt() {
            let client = match self.node_client() {
                Ok(c) => c,
                Err(e) => {
                    self.set_reboot_waiting(Some((
                        WaitingFor::Api,
                        format!("rebooted; waiting to uncordon the node: {e}"),
                    )));
                    return Step::After(EVICT_AGAIN);
                }
            };
            match drain::uncordon(&client, cfg.node_name()).await {
                Ok(changed) => {
                    if changed {
                        tracing::info!(node = %cfg.node_name(), "uncordoned");
                    }
                }
                Err(e) => {
                    self.set_reboot_waiting(Some((WaitingFor::Api, e)));
                    return Step::After(EVICT_AGAIN);
                }
            }
        }
        let reasons =
            { system::reboot_reasons(&cfg.system.booted_system, &cfg.system.current_system) };
        let now = util::now();
        let result = self.transition(|c| c.reboot_done(!reasons.is_empty(), now));
        if result.is_ok() {
            self.reboot_view = RebootView::default();
            if r.cordoned {
                tracing::info!("reboot done: the node is back, healthy and schedulable again");
            } else {
                // ginx did not cordon it (an admin did, or a drain was not needed): it stays
                // as it was.
                tracing::info!(
                    "reboot done: the node is back and healthy; ginx did not cordon it, so it leaves its schedulability as it was"
                );
            }
        }
        Step::Again
    }
}

/// When a given-up drain is tried again: when the next window opens after the current one
/// (with windows), else after the drain timeout once more.
fn next_try(cfg: &Config) -> jiff::Timestamp {
    let now = util::now();
    let windows = cfg.reboot.windows(&cfg.rollout);
    match window::state(windows, now) {
        WindowState::Open { closes_at } => match window::state(windows, closes_at) {
            WindowState::Closed {
                opens_at: Some(t), ..
            } => t,
            _ => util::after(now, cfg.reboot.drain_timeout.get()),
        },
        WindowState::Closed {
            opens_at: Some(t), ..
        } => t,
        _ => util::after(now, cfg.reboot.drain_timeout.get()),
    }
}
