//! Coordinated rollouts: the lock that lets at most `max_concurrent` nodes of a group apply at
//! once (slot Leases in the cluster, or a FleetLock server), the control-plane quorum and etcd guards,
//! the health gate's verdict, and the cluster-wide halt and pause in the `ginx-rollout`
//! ConfigMap.
//!
//! A worker (layer 5): imports `types`, `config`, `status`, `metrics`, `util`, never another
//! worker. The API clients and the probes' reports come from the daemon. `reconcile` asks it
//! for permission through [`Gatekeeper`].
//!
//! Cut by mechanism, each sub-module importing only those below it (the `layers` test keeps
//! it so):
//! - [`lock`]: the slot Leases, the FleetLock client, the choice of a slot, a held slot's renewal;
//! - [`fleet`]: the `ginx-rollout` ConfigMap — its stored format, its keys (halts, pause, holds,
//!   plan requests), its one event log, its writers;
//! - [`decide`]: the pure decisions — admission, windows, freezes, the gate's verdict, a takeover;
//! - [`view`]: the read model — the fleet state, heartbeats and Nodes, each watched once and
//!   handed out as one immutable snapshot;
//! - [`guards`]: the guards beyond the fleet state — pure over the read model (the `after`
//!   groups, canaries, order), or asking a peer first (the quorum, etcd, Prometheus, the gate's
//!   evidence);
//! - [`keeper`]: the controller `reconcile` talks to, and this node's side of the lock;
//! - [`cluster`]: the fleet as `ginxctl cluster` shows it, read with an operator's credentials.

pub mod cluster;
pub mod decide;
pub mod fleet;
pub mod guards;
mod keeper;
pub mod lock;
pub mod view;

pub use fleet::state::{FailureRecord, FleetState, Halt, Pause};
pub use fleet::{FleetEvent, Hold};
pub use keeper::{
    CONTROL_PLANE_REQUIRED, Effective, GateStep, Gatekeeper, Later, Look, Permit, Purpose,
    QUEUED_RECHECK, RECHECK, Reach, Toward, Wiring, effective,
};
