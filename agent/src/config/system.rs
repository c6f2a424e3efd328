//! `[system]`: where NixOS keeps what ginx inspects, and the rollback commands.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{ConfigError, Ctx, Duration, bounds};

/// Where NixOS keeps what ginx inspects, and the commands it uses to roll back. Paths are
/// configurable for tests.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SystemConfig {
    /// The system profile; `<profile>-N-link` are its generations.
    pub profile: PathBuf,
    /// The running system (`/run/current-system`): what an activation changed, drift is
    /// measured on.
    pub current_system: PathBuf,
    /// The booted system (`/run/booted-system`): a kernel or initrd differing from the current
    /// system's means a reboot is required.
    pub booted_system: PathBuf,
    /// `ginxctl rollback`: first this (`{profile}` replaced)...
    pub rollback_command: Vec<String>,
    /// ...then this activates the rolled-back generation.
    pub switch_command: Vec<String>,
    /// After a failed gate after a reboot, this (instead of `switch_command`) makes the
    /// rolled-back generation the one booted next; ginx then reboots into it.
    pub boot_command: Vec<String>,
    /// When, after an activation, either resolves to a different file than when ginx started,
    /// ginx restarts itself into the new version.
    pub ginx_binary: PathBuf,
    /// ginx's systemd unit file: a new one after an activation makes ginx restart into the new
    /// version.
    pub ginx_unit: PathBuf,
    /// How often the running system is compared with the one ginx last produced.
    pub drift_check_interval: Duration,
    /// This boot's id: a reboot is known to have happened when it changed.
    pub boot_id: PathBuf,
}

impl Default for SystemConfig {
    fn default() -> Self {
        Self {
            profile: PathBuf::from("/nix/var/nix/profiles/system"),
            current_system: PathBuf::from("/run/current-system"),
            booted_system: PathBuf::from("/run/booted-system"),
            rollback_command: ["nix-env", "--profile", "{profile}", "--rollback"]
                .map(String::from)
                .to_vec(),
            switch_command: ["{profile}/bin/switch-to-configuration", "switch"]
                .map(String::from)
                .to_vec(),
            boot_command: ["{profile}/bin/switch-to-configuration", "boot"]
                .map(String::from)
                .to_vec(),
            ginx_binary: PathBuf::from("/run/current-system/sw/bin/ginx"),
            ginx_unit: PathBuf::from("/etc/systemd/system/ginx.service"),
            drift_check_interval: Duration::from_secs(30),
            boot_id: PathBuf::from("/proc/sys/kernel/random/boot_id"),
        }
    }
}

impl SystemConfig {
    pub(super) fn validate(&self, ctx: &Ctx<'_>) -> Result<(), ConfigError> {
        for (key, argv) in [
            ("system.rollback_command", &self.rollback_command),
            ("system.switch_command", &self.switch_command),
            ("system.boot_command", &self.boot_command),
        ] {
            if argv.first().is_none_or(|p| p.trim().is_empty()) {
                return Err(ctx.error(key, "must name a program"));
            }
        }
        bounds::DRIFT_CHECK_INTERVAL.check(ctx, self.drift_check_interval)
    }
}
