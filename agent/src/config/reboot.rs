//! `[reboot]`: whether and how ginx reboots its node when a reboot is required (a new kernel,
//! initrd or modules, goal `boot`, or the sentinel file), and how it drains the node first.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{ConfigError, Ctx, Duration, RolloutConfig, Window, bounds};

/// `reboot.mode`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RebootMode {
    /// ginx only reports that a reboot is required.
    #[default]
    Never,
    /// ginx reboots the node through the rollout lock, drained, inside a window.
    WhenRequired,
}

impl RebootMode {
    pub fn as_str(self) -> &'static str {
        match self {
            RebootMode::Never => "never",
            RebootMode::WhenRequired => "when-required",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RebootConfig {
    /// `never`, or `when-required`: reboot (drained, in a window, one slot at a time) when the
    /// booted and current systems differ or the sentinel exists.
    pub mode: RebootMode,
    /// Run (argv, no shell) once the node is drained.
    pub reboot_command: Vec<String>,
    /// When this file exists, a reboot counts as required too.
    pub sentinel: PathBuf,
    /// The slot Lease's duration while the node reboots, so that a rebooting holder is not
    /// taken for a dead one.
    pub lock_ttl: Duration,
    /// A drain not done by then is given up: the node is uncordoned and the slot released.
    pub drain_timeout: Duration,
    /// A drained node whose last look (the etcd, quorum and alert guards asked again right
    /// before the reboot or the activation) holds it this long gives the attempt up as a
    /// drain that timed out does: uncordoned, its slot released, tried again later.
    pub guard_timeout: Duration,
    /// A label selector: while a pod matching it runs on the node, the reboot waits.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blocking_pod_selector: Option<String>,
    /// Evict pods that no controller manages (they are not recreated anywhere).
    pub force: bool,
    /// Evict pods with emptyDir volumes (their data is lost).
    pub delete_emptydir_data: bool,
    /// The grace period given to evicted pods; default: each pod's own.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grace_period: Option<Duration>,
    /// `[[reboot.windows]]`; absent: the rollout's windows.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub windows: Option<Vec<Window>>,
}

impl Default for RebootConfig {
    fn default() -> Self {
        Self {
            mode: RebootMode::Never,
            reboot_command: ["systemctl", "reboot"].map(String::from).to_vec(),
            sentinel: PathBuf::from("/run/reboot-required"),
            lock_ttl: Duration::from_secs(30 * 60),
            drain_timeout: Duration::from_secs(15 * 60),
            guard_timeout: Duration::from_secs(10 * 60),
            blocking_pod_selector: None,
            force: false,
            delete_emptydir_data: false,
            grace_period: None,
            windows: None,
        }
    }
}

impl RebootConfig {
    /// The windows a reboot may start in: its own, else the rollout's.
    pub fn windows<'a>(&'a self, rollout: &'a RolloutConfig) -> &'a [Window] {
        self.windows.as_deref().unwrap_or(&rollout.windows)
    }

    pub(super) fn validate(
        &self,
        rollout: &RolloutConfig,
        ctx: &Ctx<'_>,
    ) -> Result<(), ConfigError> {
        if self
            .reboot_command
            .first()
            .is_none_or(|p| p.trim().is_empty())
        {
            return Err(ctx.error(
                "reboot.reboot_command",
                "must name a program, like [\"systemctl\", \"reboot\"]",
            ));
        }
        if !self.sentinel.is_absolute() {
            return Err(ctx.error(
                "reboot.sentinel",
                format!("{} must be an absolute path", self.sentinel.display()),
            ));
        }
        bounds::LOCK_TTL.check(ctx, self.lock_ttl)?;
        if self.lock_ttl < rollout.lease_duration {
            let (ttl, lease) = ("reboot.lock_ttl", "rollout.lease_duration");
            // Blame the key the files set: a long lease_duration against the default lock_ttl
            // is lease_duration's error.
            return Err(if ctx.written(ttl) || !ctx.written(lease) {
                ctx.error(
                    ttl,
                    format!(
                        "{} is shorter than {lease} ({}); it must cover a whole reboot, like \
                         \"30m\"",
                        self.lock_ttl,
                        ctx.shown(lease, rollout.lease_duration)
                    ),
                )
            } else {
                ctx.error(
                    lease,
                    format!(
                        "{} is longer than {ttl} ({}), the slot's duration while its holder \
                         reboots, which must be at least this; shorten this, or raise {ttl} \
                         (at most {})",
                        rollout.lease_duration,
                        ctx.shown(ttl, self.lock_ttl),
                        bounds::LOCK_TTL.ceiling
                    ),
                )
            });
        }
        bounds::DRAIN_TIMEOUT.check(ctx, self.drain_timeout)?;
        bounds::GUARD_TIMEOUT.check(ctx, self.guard_timeout)?;
        if let Some(g) = self.grace_period {
            bounds::GRACE_PERIOD.check(ctx, g)?;
        }
        if let Some(s) = &self.blocking_pod_selector
            && let Err(e) = super::selector::check(s)
        {
            return Err(ctx.error("reboot.blocking_pod_selector", e));
        }
        if let Some(w) = &self.windows {
            super::window::validate(w, "reboot.windows", &bounds::REBOOT_WINDOW_LENGTH, ctx)?;
        }
        Ok(())
    }
}
