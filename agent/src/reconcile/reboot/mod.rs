//! A reboot carried out by ginx (`reboot.mode = "when-required"`), one step per turn of the
//! loop so that the loop stays responsive (status, commands, the watchdog) throughout:
//!
//! 1. wait for a window (`[[reboot.windows]]`, default the rollout's);
//! 2. take a slot, or keep the one held since the apply;
//! 3. pass the quorum and etcd guards (control-plane nodes);
//! 4. wait while a pod matching `reboot.blocking_pod_selector` runs on the node;
//! 5. cordon, writing `ginx.io/cordoned-by-ginx` only when ginx made the node unschedulable;
//! 6. drain through the Eviction API (a 429 is tried again every [`EVICT_AGAIN`]; given up
//!    after `reboot.drain_timeout`: uncordoned, released, put off to the next window), and
//!    record the node drained;
//! 7. the last look: the quorum guard, the alert gate and the etcd guard asked again, for the
//!    cluster may have changed during the drain, and etcd's leadership handed over in the look
//!    that found it fit (held: the node waits drained, keeping its slot and cordon, and looks
//!    again every [`EVICT_AGAIN`]; given up after `reboot.guard_timeout` as a drain is);
//!    then raise the slot Lease's duration to `reboot.lock_ttl`;
//! 8. record `rebooting` with the boot id, then run `reboot.reboot_command`.
//!
//! In the new boot: the health gate; then uncordon (only what ginx cordoned), release the
//! slot, clear the requirement. A gate that fails after a reboot that followed an activation
//! rolls back with `system.boot_command` and reboots again in the same slot; the revision is
//! halted as for a failed activation.
//!
//! Every step is persisted before it is acted on: a ginx killed at any point resumes where it
//! was (the node cordoned by it is uncordoned by it, the slot it held is taken up again).
//!
//! Here: the steps and their order. The decisions they take are in `decide` (pure, clock
//! passed in); the drain's steps in `draining`, its Kubernetes calls in `drain`; the persisted
//! record changes only through the core's reboot transitions.

pub(super) mod decide;
mod drain;
mod draining;
mod live;

pub(super) use live::LiveDrain;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::Reconciler;
use super::core::{Core, Decision};
use crate::apply::system;
use crate::config::{Config, RollbackPolicy};
use crate::k8s::ClientError;
use crate::rollout::decide::gate;
use crate::rollout::decide::window;
use crate::rollout::{Permit, Purpose, Toward};
use crate::state::{RebootPhase, Rebooting, Verifying};
use crate::status::WaitingFor;
use crate::types::{Reason, Revision};
use crate::util;

/// How often `reboot.sentinel` is looked for.
pub(super) const SENTINEL_POLL: Duration = Duration::from_secs(5);
/// An eviction a PodDisruptionBudget refused is tried again this often.
pub(super) const EVICT_AGAIN: Duration = Duration::from_secs(5);
/// While draining, the node's pods are looked at this often.
pub(super) const DRAIN_POLL: Duration = Duration::from_secs(1);
/// A reboot command that failed is run again after this.
pub(super) const COMMAND_AGAIN: Duration = Duration::from_secs(60);
/// Still up in the same boot this long after the reboot command: run it again.
pub(super) const REBOOT_AGAIN: Duration = Duration::from_secs(300);
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
    /// The drain's deadline, on the monotonic clock.
    drain_clock: Option<decide::DrainClock>,
    /// While the last look holds the drained node: when it gives up (`reboot.guard_timeout`).
    last_look: Option<decide::DrainClock>,
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
            let modified = m
                .modified()
                .ok()
                .and_then(|t| jiff::Timestamp::try_from(t).ok());
            decide::sentinel_fresh(modified, self.core.state().rebooted_at)
        };
        if std::fs::metadata(&cfg.reboot.sentinel).is_ok_and(fresh) {
            reasons.push(format!("{} exists", cfg.reboot.sentinel.display()));
        }
        reasons
    }

    /// Whether a new reboot may begin now (not whether the lock allows it).
    fn reboot_may_begin(&self, cfg: &Config) -> bool {
        decide::may_begin(cfg.reboot.mode, self.core.state(), util::now(), || {
            !self.reboot_reasons().is_empty()
        })
    }

    /// Whether this turn of the loop works on the reboot, given the apply's decision.
    pub(super) fn reboot_turn(&self, decision: &Decision) -> bool {
        decide::turn(
            decision,
            self.core.state(),
            || self.reboot_may_begin(&self.config.borrow()),
            |revision| {
                self.gatekeeper
                    .fleet()
                    .is_some_and(|f| f.halt_of(revision).is_some())
            },
        )
    }

    /// Whether the slot held after an apply is kept for the reboot that follows it: a reboot
    /// is required, allowed, and its window is open now.
    pub(super) fn reboot_keeps_slot(&self) -> bool {
        let cfg = Arc::clone(&self.config.borrow());
        let rebooting = self.core.state().phase.rebooting().is_some();
        rebooting || {
            let window = window::state(cfg.reboot.windows(&cfg.rollout), util::now());
            decide::keeps_slot(false, self.reboot_may_begin(&cfg), &window)
        }
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
    fn node_client(&self) -> Result<kube::Client, ClientError> {
        match self.kube.borrow().as_ref() {
            Some(c) => c.node(),
            None => Err(ClientError::NotConnected),
        }
    }

    /// What the reboot waits for (or `None`), published at once when it changed.
    pub(super) fn set_reboot_waiting(&mut self, w: Option<(WaitingFor, String)>) {
        if let Some((what, why)) = &w
            && self.reboot_view.waiting.as_ref().map(|(k, _)| k) != Some(what)
        {
            tracing::info!(waiting_for = what.as_str(), reason = %why, "reboot required; waiting");
        }
        if self.reboot_view.waiting != w {
            self.reboot_view.waiting = w;
            self.publish();
        }
    }

    /// One step of the reboot.
    pub(super) async fn step_reboot(&mut self) -> Step {
        let Some(r) = self.core.state().phase.rebooting().cloned() else {
            return self.begin_reboot().await;
        };
        match r.phase {
            RebootPhase::Draining => self.drain_step(r).await,
            RebootPhase::Rebooting => self.reboot_step(r).await,
            RebootPhase::Finishing | RebootPhase::Kept => self.finish_reboot(r).await,
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
                        tracing::info!(reasons = ?self.core.state().phase.rebooting().map(|r| &r.reasons),
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

    /// Step 7 and 8: the baseline, the Lease's duration, the record, the command.
    async fn reboot_now(&mut self, cfg: &Config) -> Step {
        if let Some(wait) =
            decide::command_retry_wait(self.reboot_view.command_failed_at.map(|t| t.elapsed()))
        {
            return Step::After(wait);
        }
        let baseline = match self.core.state().phase.rebooting() {
            Some(r) if !r.baseline.is_empty() => r.baseline.clone(),
            _ => gate::baseline(&self.gatekeeper.baseline_checks(None).await),
        };
        // Drained, about to go down: the guards asked again, etcd's leadership handed over.
        let toward = match self.core.state().phase.rebooting() {
            Some(r) if r.rollback => Toward::Back,
            _ => Toward::Forward,
        };
        if let Err(held) = self
            .gatekeeper
            .last_look(&self.reboot_revision(), toward)
            .await
        {
            return self.held_before_reboot(cfg, held).await;
        }
        self.reboot_view.last_look = None;
        if self.core.state().rollout_held.is_some()
            && let Err(e) = self.gatekeeper.raise_ttl(cfg.reboot.lock_ttl.get()).await
        {
            tracing::warn!(error = %e, "cannot raise the slot Lease's duration before the reboot; trying again");
            self.set_reboot_waiting(Some((e.waiting_for(), e.to_string())));
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

    /// The last look held the drained node: it waits, keeping its slot and its cordon, and
    /// looks again; held past `reboot.guard_timeout` since it was drained, the reboot is given
    /// up as a drain that timed out is.
    pub(super) async fn held_before_reboot(
        &mut self,
        cfg: &Config,
        (what, why): (WaitingFor, String),
    ) -> Step {
        let Some(r) = self.core.state().phase.rebooting().cloned() else {
            return Step::Again;
        };
        // A node going back from a failed revision is not given back to the cluster on it:
        // it waits, cordoned with its slot, however long the guards hold.
        if r.rollback {
            self.set_reboot_waiting(Some((what, why)));
            return Step::After(EVICT_AGAIN);
        }
        let timeout = cfg.reboot.guard_timeout.get();
        let now = util::now();
        let since = r.drained_at.unwrap_or(now);
        let clock = decide::DrainClock::of(
            self.reboot_view.last_look,
            since,
            timeout,
            now,
            Instant::now(),
        );
        self.reboot_view.last_look = Some(clock);
        if !clock.overdue(Instant::now()) {
            self.set_reboot_waiting(Some((what, why)));
            return Step::After(EVICT_AGAIN);
        }
        let reason = decide::guards_gave_up(&cfg.reboot.guard_timeout.to_string(), &why);
        self.put_reboot_off(cfg, &r, (what, reason), timeout, Reason::PutOff)
            .await
    }

    /// Gives the reboot up: the node back as it was (uncordoned if ginx cordoned it) and the
    /// slot released at once, and the reboot put off to the next window (with none, by
    /// `retry`), told as `told`. Status says what it waited for and why.
    pub(super) async fn put_reboot_off(
        &mut self,
        cfg: &Config,
        r: &Rebooting,
        (what, reason): (WaitingFor, String),
        retry: Duration,
        told: Reason,
    ) -> Step {
        if r.cordoned {
            let Ok(client) = self.node_client() else {
                return Step::After(EVICT_AGAIN);
            };
            if let Err(e) = drain::uncordon(&client, cfg.node_name()).await {
                tracing::warn!(error = %e, "the reboot is given up, but the node cannot be uncordoned yet; trying again");
                return Step::After(EVICT_AGAIN);
            }
        }
        let now = util::now();
        let until = decide::next_try(cfg.reboot.windows(&cfg.rollout), retry, now);
        tracing::error!(node = %cfg.node_name(), reason = %reason, next_try = %until, "reboot put off");
        // Without the time it is tried again: a reboot put off again counts in the series.
        self.notices
            .emit(told, None, format!("reboot put off: {reason}"));
        // Status shows the give-up with its reason from the first publish that shows it.
        self.reboot_view = RebootView {
            waiting: Some((what, reason.clone())),
            ..RebootView::default()
        };
        let _ = self.transition(|c| c.drain_given_up(until, reason));
        self.give_slot_back().await;
        Step::Again
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
        let now = util::now();
        if let Some(wait) = decide::rerun_wait(
            self.reboot_view.commanded_at.map(|t| t.elapsed()),
            r.reboot_at.map(|t| now.duration_since(t).unsigned_abs()),
            self.reboot_view.command_failed_at.map(|t| t.elapsed()),
        ) {
            return Step::After(wait);
        }
        tracing::warn!(
            boot_id = ?boot,
            reboot_at = ?r.reboot_at,
            "still up in the same boot after the reboot command; running it again"
        );
        if self.core.state().rollout_held.is_some()
            && let Err(e) = self.gatekeeper.raise_ttl(cfg.reboot.lock_ttl.get()).await
        {
            self.set_reboot_waiting(Some((e.waiting_for(), e.to_string())));
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
        if self.transition(|c| c.reboot_gate_closed(passed)) == Ok(RebootPhase::Kept) {
            tracing::error!(
                reason = "the health gate after the reboot failed",
                "the node stays cordoned and keeps its slot until an operator acts (`ginxctl retry`) or a fixed revision passes its gate"
            );
        }
    }

    /// The rollback after a failed gate after a reboot made the previous generation the boot
    /// default: reboot into it, in the same slot.
    pub(super) fn reboot_into_rollback(&mut self) {
        tracing::warn!(
            reason = "the health gate after the reboot failed",
            "the previous generation is the boot default now; rebooting into it"
        );
        self.reboot_view.cordon_checked = false;
        self.reboot_view.commanded_at = None;
        let _ = self.transition(Core::reboot_into_rollback);
    }

    /// The rollback policy for the open gate, which may be one after a reboot.
    pub(super) fn reboot_gate_policy(&self, policy: RollbackPolicy) -> RollbackPolicy {
        let st = self.core.state();
        decide::gate_policy(st.phase.gate(), st.phase.rebooting(), policy)
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
                    self.set_reboot_waiting(Some((e.waiting_for(), e.to_string())));
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
