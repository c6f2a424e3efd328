//! The rollout lock: at most `max_concurrent` nodes of a group hold a slot at once. Slot
//! Leases in the cluster ([`lease`]) or a FleetLock server ([`fleetlock`]), behind one trait
//! ([`backend`]); which slot to take ([`slots`], pure); a held slot's renewal ([`held_slot`]).

pub mod backend;
pub mod fleetlock;
pub mod held_slot;
pub mod lease;
pub mod slots;

pub use backend::{RolloutLock, Taken};
pub use lease::{LockError, Released, SlotError, SlotPhase};
