//! ginx: a node agent that keeps NixOS Kubernetes nodes in step with Git, safely.
//!
//! The daemon (`ginx`) pulls Git sources, applies new revisions of one of them with
//! `colmena apply-local`, remembers what it did, and answers `ginxctl` over a unix socket.
//! See DESIGN.md for the architecture and the contracts.

pub mod apply;
pub mod bootstrap;
pub mod cli;
pub mod config;
pub mod control;
pub mod daemon;
#[doc(hidden)]
pub mod fuzz;
pub mod health;
pub mod kube;
pub mod kubeadm;
pub mod logging;
pub mod metrics;
pub mod reconcile;
pub mod rollout;
pub mod source;
pub mod state;
pub mod status;
pub mod types;
pub mod util;

#[cfg(test)]
mod layers;

/// The version of this build, as shown by `--version` and in status.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
