//! The plan of a revision on this node: what activating the built system would do, computed
//! without activating it. The units it would stop, restart, reload or start
//! (`dry_activate.rs`), the packages whose versions or sizes change (`closure_diff.rs`), and
//! the action the disruption policy calls for (`policy.rs`).
//!
//! Owns asking for these answers (`compute.rs`, for the build attempt's runner; not wired yet), reading
//! them, and deciding from them.

pub mod closure_diff;
pub mod compute;
pub mod dry_activate;
pub mod policy;

pub use closure_diff::PackageChange;
pub use compute::{PLAN_FILE, PlanSpec, SPEC_FILE};
pub use dry_activate::UnitChanges;
pub use policy::{Policy, Rule, Verdict, decide, judged};
