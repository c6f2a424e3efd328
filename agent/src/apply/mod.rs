//! Applying: running the apply command so that it survives the system it changes.
//!
//! Every attempt runs inside `ginx run-attempt` (the [`runner`]), which owns the command's whole
//! process tree, enforces the timeout, streams output to a file and records the result in
//! another. The runner itself is started either as a transient systemd unit (`systemd-run`, so
//! an activation that restarts ginx does not kill it) or as a child process that dies with
//! ginx ([`isolation`]). [`system`] reads what NixOS leaves behind: generations, the booted and
//! the current system. [`plan`] reads what activating a built system would do, and what the
//! disruption policy makes of it.
//!
//! A worker (layer 5): imports `types`, `config`, `state`, `util`, never another worker. Not
//! here: when to apply, retries and what is recorded where (see `reconcile`).

pub mod closure;
pub mod isolation;
pub mod plan;
pub mod process;
pub mod runner;
pub mod step;
pub mod system;

pub use process::{
    Exit, Finished, Spec, boot_id, kill_group, recorded_group_alive, start, start_time,
};
