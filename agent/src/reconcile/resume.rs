//! Resuming after a restart: the reboot that was required, the anchor of a state written before
//! anchors existed, and an attempt that was in flight when the previous ginx went away.

use std::sync::Arc;

use super::{Attempting, Reconciler};
use crate::apply::isolation;
use crate::apply::system;
use crate::apply::{self, Exit, Finished};
use crate::util;

impl Reconciler {
    /// After a reboot, what required it is gone: compute it afresh.
    pub(super) fn refresh_reboot_after_boot(&mut self) {
        if self.core.state().reboot.is_none() {
            return;
        }
        let (boot, reasons) = {
            let cfg = self.config.borrow();
            (
                system::boot_id(&cfg.system.boot_id),
                system::reboot_reasons(&cfg.system.booted_system, &cfg.system.current_system),
            )
        };
        if self.core.reboot_reassessed(reasons, boot, util::now()) {
            let _ = self.save_state();
        }
    }

    /// A state written before anchors existed: its applied revision becomes the anchor.
    pub(super) async fn seed_anchor(&self) {
        let (source, goal) = {
            let cfg = self.config.borrow();
            (cfg.apply.source.clone(), cfg.apply.goal)
        };
        // Only a deployment of the main branch (its goal is apply.goal; a testing branch's
        // revision is not an anchor).
        let Some(applied) = self
            .core
            .state()
            .applied
            .clone()
            .filter(|a| a.source == source && a.goal == goal)
        else {
            return;
        };
        let workspace = Arc::clone(&self.workspace);
        let _ = tokio::task::spawn_blocking(move || {
            if workspace.anchor(&source).is_none() {
                let _ = workspace.advance_anchor(&source, &applied.revision);
            }
        })
        .await;
    }

    /// An attempt in flight at start-up ran under a ginx that is gone. If its runner finished,
    /// record its result; if its transient unit still runs, follow it again; otherwise stop
    /// whatever is left and record it as interrupted.
    pub(super) async fn resume_in_flight(&mut self) -> Option<Attempting> {
        let r = self.core.running().cloned()?;
        let token = r.token.as_deref();
        if let Some(finished) = r.dir.as_deref().and_then(|d| isolation::collect(d, token)) {
            tracing::info!(attempt = r.id, revision = %r.revision.short(),
                "an attempt finished while ginx was away; recording its result");
            self.finish(r.id, finished).await;
            return None;
        }
        if r.isolation == "systemd-run"
            && let (Some(dir), Some(unit)) = (&r.dir, &r.unit)
            && let Some(handle) = isolation::attach(&self.isolation, dir, unit, token).await
        {
            tracing::info!(attempt = r.id, apply_unit = %unit, revision = %r.revision.short(),
                "an attempt started by a previous ginx is still running; following it");
            let tree = self.pin_tree(&r.source, &r.revision).await.ok();
            return Some(self.follow(r.id, &r.revision, handle, tree));
        }
        if let Some(pgid) = r.pgid
            && apply::recorded_group_alive(pgid, r.boot_id.as_deref(), r.start_time)
        {
            tracing::warn!(pgid, revision = %r.revision.short(), "stopping an apply left running by a previous ginx");
            apply::kill_group(pgid);
        }
        tracing::warn!(attempt = r.id, revision = %r.revision.short(),
            "ginx stopped during this attempt; recording it as interrupted");
        self.finish(
            r.id,
            Finished {
                exit: Exit::Stopped,
                output: Vec::new(),
            },
        )
        .await;
        None
    }
}
