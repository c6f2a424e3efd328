//! The fleet's ConfigMap, `ginx-rollout`: what every node and operator shares — the halted
//! revisions, the fleet pause, the failures counted against a revision's budget, operators'
//! holds and plan requests, and one log of changes. [`state`] is its stored format,
//! [`configmap`] its keys, codec, edits and writer, [`events`] its change log, [`holds`] and [`plan_requests`] the keys
//! operators write, through [`operator`].

pub mod configmap;
pub mod events;
pub mod holds;
pub mod operator;
pub mod plan_requests;
pub mod state;

pub use configmap::{
    ClearError, Counted, FAILED_PREFIX, Fleet, HALTED_PREFIX, MIN_PREFIX, PAUSED_KEY,
    RevisionError, Updated, apply_clear, apply_failure, apply_halt, apply_lift_vanished,
    apply_pause, apply_resume, decode, decode_lenient, encode, resolve,
};
pub use events::{EVENTS_KEY, FleetEvent, MAX_EVENTS};
pub use holds::Hold;
