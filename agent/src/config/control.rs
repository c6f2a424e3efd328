//! `[control]`: who may change what over the control socket.

use serde::{Deserialize, Serialize};

use super::{ConfigError, Ctx};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ControlConfig {
    /// Members (and root) may sync, suspend and resume; anyone who can open the socket may
    /// read status.
    pub group: String,
}

impl Default for ControlConfig {
    fn default() -> Self {
        Self {
            group: "wheel".to_owned(),
        }
    }
}

impl ControlConfig {
    pub(super) fn validate(&self, ctx: &Ctx<'_>) -> Result<(), ConfigError> {
        if self.group.trim().is_empty() {
            return Err(ctx.error("control.group", "must name a group"));
        }
        Ok(())
    }
}
