//! `ginxctl rollback`: switching to the previous generation, in the same runner as applies.

use std::sync::Arc;

use super::{Attempting, Reconciler};
use crate::apply::isolation::{Isolation, Launch};
use crate::apply::system;
use crate::state::{AttemptKind, InFlight};
use crate::types::Goal;
use crate::util;

impl Reconciler {
    /// `ginxctl rollback`: the previous generation, activated in the same runner as applies.
    pub(super) async fn start_rollback(&mut self) -> Result<(u64, Option<Attempting>), String> {
        let cfg = Arc::clone(&self.config.borrow());
        let revision = self
            .core
            .state()
            .applied
            .as_ref()
            .map(|a| a.revision.clone())
            .or_else(|| self.desired().map(|(d, _)| d.revision))
            .ok_or_else(|| {
                "nothing to roll back from: ginx has applied nothing yet (use `nixos-rebuild \
                 switch --rollback` by hand)"
                    .to_owned()
            })?;
        let generation = system::generation(&cfg.system.profile).ok_or_else(|| {
            format!(
                "no system generation at {} (system.profile)",
                cfg.system.profile.display()
            )
        })?;
        let profile = cfg.system.profile.display().to_string();
        // After a failed gate after a reboot: the previous generation becomes the boot
        // default, and ginx reboots into it.
        let boot = self
            .core
            .state()
            .gate_failure
            .as_ref()
            .is_some_and(|g| g.after_reboot && g.next == crate::state::AfterGate::RollBack);
        let activate = if boot {
            &cfg.system.boot_command
        } else {
            &cfg.system.switch_command
        };
        let script: Vec<String> = [&cfg.system.rollback_command, activate]
            .iter()
            .map(|argv| {
                argv.iter()
                    .map(|a| shell_quote(&a.replace("{profile}", &profile)))
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect();
        let unit = format!("ginx-rollback-{}", self.core.state().next_attempt_id);
        let id = self
            .begin(InFlight {
                id: 0,
                kind: AttemptKind::Rollback,
                source: cfg.apply.source.clone(),
                revision: revision.clone(),
                goal: if boot { Goal::Boot } else { Goal::Switch },
                started_at: util::now(),
                testing: false,
                isolation: self.isolation.name().to_owned(),
                unit: matches!(self.isolation, Isolation::SystemdRun { .. }).then(|| unit.clone()),
                dir: None,
                token: None,
                generation_before: Some(generation.clone()),
                pgid: None,
                boot_id: None,
                start_time: None,
                closure: None,
            })
            .map_err(|e| format!("cannot start the rollback: {e}"))?;
        tracing::warn!(attempt = id, from_generation = ?generation.number, "rolling back to the previous generation");
        let launch = Launch {
            plan: None,
            dir: self.attempt_dir(id),
            unit,
            cwd: cfg.state_dir.clone(),
            argv: vec![
                "/bin/sh".into(),
                "-c".into(),
                format!("set -e; {}", script.join("; ")),
            ],
            env: vec![("GINX_NODE".into(), cfg.node_name().to_owned())],
            timeout: cfg.apply.timeout.get(),
            kill_grace: cfg.apply.kill_grace.get(),
            description: "ginx: roll back to the previous generation".into(),
            token: self.running_token(),
        };
        let a = self.launch(id, &revision, &launch, None).await;
        Ok((id, a))
    }
}

/// Quotes `s` for `/bin/sh`.
fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_quoting_survives_quotes_and_spaces() {
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
    }
}
