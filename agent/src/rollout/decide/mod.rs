//! The rollout's pure decisions: whether a node may start (admission), maintenance windows and
//! change freezes, the health gate's verdict, what a slot taken over from a vanished holder
//! owes. No I/O and no clock of their own: the caller passes what was read and `now`.

pub mod admission;
pub mod freeze;
pub mod gate;
pub mod takeover;
pub mod window;
