//! Coordinated rollouts: the lock that lets at most `max_concurrent` nodes of a group apply at
//! once (slot Leases in the cluster, or a FleetLock server), the control-plane quorum and etcd guards,
//! the health gate's verdict, and the cluster-wide halt and pause in the `ginx-rollout`
//! ConfigMap.
//!
//! A worker (layer 5): imports `types`, `config`, `status`, `metrics`, `util`, never another
//! worker. The API clients and the probes' reports come from the daemon. `reconcile` asks it
//! for permission through [`Gatekeeper`].

pub mod admission;
mod after;
pub mod alerts;
mod canary;
pub mod cluster;
mod etcd_guard;
mod evidence;
pub mod fleet;
mod fleet_cache;
mod fleet_state;
pub mod fleetlock;
pub mod freeze;
pub mod gate;
mod holding;
pub mod holds;
mod keeper;
pub mod lease;
pub mod lock;
mod locker;
mod order;
pub mod plan_requests;
pub mod quorum;
pub mod slots;
mod takeover;
pub mod window;

pub use fleet_state::{FailureRecord, FleetEvent, FleetState, Halt, Pause};
pub use holds::Hold;
pub use keeper::{
    CONTROL_PLANE_REQUIRED, Effective, GateStep, Gatekeeper, Later, Look, Permit, Purpose,
    QUEUED_RECHECK, RECHECK, Reach, Toward, Wiring, effective,
};
