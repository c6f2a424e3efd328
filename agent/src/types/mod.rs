//! Value types that several layers share, below everything else in the crate: commit ids
//! ([`Revision`]), Git remotes ([`RemoteUrl`], [`Transport`]), probe endpoints
//! ([`EndpointUrl`]), the apply goal ([`Goal`]), the node's [`Role`], a system [`Generation`],
//! what a source's poller reports ([`SourceReport`]), why a revision is halted
//! ([`HaltCause`]), what an activation does to the node's workloads ([`Disruption`]), a revision's
//! [`Plan`], a plan asked for before a merge ([`PlanRequest`], [`PreviewAnswer`]), and a value a
//! person wrote that cannot be used ([`Invalid`]).
//!
//! Owns: their parsing, validation and how they print. Must not import anything else of the
//! crate; `config`, `status`, `state` and the workers take these from here.

mod closure;
mod disruption;
mod endpoint;
mod halt;
mod invalid;
pub mod notice;
mod plan;
mod plan_mark;
pub mod preview;
mod remote;
mod source;

use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use closure::{ClosureInfo, ClosureOrigin, STORE_DIR, check_store_path};
pub use disruption::Disruption;
pub use endpoint::EndpointUrl;
pub use halt::HaltCause;
pub use invalid::Invalid;
pub use notice::{Notice, Notices, Reason};
pub use plan::{PackageChange, Plan, UnitChanges, signed_size};
pub use plan_mark::{PlanCounts, PlanMark, plan_counts};
pub use preview::{PlanRequest, PreviewAnswer, PreviewOutcome};
pub use remote::{RemoteUrl, Revision, Transport, unfit_for_ssh_option};
pub use source::{AcceptedSignature, RefusedHead, RemoteReport, SourceReport, SourceReports};

/// The node's role in the cluster (`node.role`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    #[default]
    ControlPlane,
    Worker,
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::ControlPlane => "control-plane",
            Role::Worker => "worker",
        })
    }
}

/// The `colmena apply-local` goal, appended to `apply.command`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Goal {
    #[default]
    Switch,
    Boot,
    Test,
    DryActivate,
    Build,
}

impl Goal {
    pub fn as_str(self) -> &'static str {
        match self {
            Goal::Switch => "switch",
            Goal::Boot => "boot",
            Goal::Test => "test",
            Goal::DryActivate => "dry-activate",
            Goal::Build => "build",
        }
    }
}

impl std::str::FromStr for Goal {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [
            Goal::Switch,
            Goal::Boot,
            Goal::Test,
            Goal::DryActivate,
            Goal::Build,
        ]
        .into_iter()
        .find(|g| g.as_str() == s)
        .ok_or_else(|| format!("{s:?}: the goal is one of switch, boot, test, dry-activate, build"))
    }
}

impl fmt::Display for Goal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A generation of the system profile.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Generation {
    /// N of `<profile>-N-link`.
    pub number: Option<u64>,
    /// The system it points to (a store path).
    pub path: PathBuf,
}
