//! The rollout lock as the gatekeeper uses it, whatever keeps it: slot Leases in the cluster
//! ([`LeaseLock`]) or a FleetLock server ([`FleetLock`]). One trait, [`RolloutLock`], so that
//! the gatekeeper asks, renews, fences, releases and raises a lock's duration the same way for
//! both, and the difference between them lives here, in two small `impl`s.
//!
//! Owns the mapping of each backend's answers onto one vocabulary ([`Taken`], [`LockError`],
//! [`Released`]). Does not own when to ask (admission), nor the renewal task (`held_slot.rs`).

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use super::fleetlock::{FleetLock, FleetLockError};
use super::lease::{self, Acquired, LeaseLock, Vanished};
pub use super::lease::{LockError, Released, SlotPhase};
use crate::state::SlotBackend;

/// A lock operation's future (boxed: the gatekeeper holds its lock as a trait object).
pub type LockFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, LockError>> + Send + 'a>>;

/// What came of asking for the lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Taken {
    /// Taken: `slot` for a slot Lease (resumed, or taken over from a holder that vanished).
    Slot {
        slot: Option<u32>,
        resumed: bool,
        vanished: Option<Vanished>,
    },
    /// A slot is free but a node of the group passed the revision's gate less than
    /// `rollout.soak` ago: nothing taken.
    Soaking { left: Duration, after: String },
    /// Every slot is held (slot → holder, as read).
    Full(BTreeMap<u32, String>),
    /// The lock server said no (another node holds the group's lock): the server's words.
    Refused(String),
}

/// A rollout lock for this node and its group.
pub trait RolloutLock: Send + Sync {
    /// `kubernetes` or `fleetlock`: what the state file records with a held lock.
    fn backend(&self) -> SlotBackend;

    /// The group the lock is for.
    fn group(&self) -> &str;

    /// What to call slot `slot` in a message.
    fn slot_name(&self, slot: Option<u32>) -> String;

    /// Takes (or takes up again) the lock; `soak`: how long after a node of the group passed
    /// its gate on the revision no slot is taken.
    fn acquire(&self, soak: Duration) -> LockFuture<'_, Taken>;

    /// Writes the lock again now; `Ok(false)` when it is no longer this node's.
    fn renew(&self, slot: Option<u32>) -> LockFuture<'_, bool>;

    /// Gives the lock back.
    fn release(&self, slot: Option<u32>) -> LockFuture<'_, Released>;

    /// How long one write keeps the lock for this node in other nodes' eyes: it is renewed
    /// at a third of it, and an activation starts under it only while its last write is
    /// younger than a third (fencing). `None`: the server keeps the lock until it is
    /// released, so there is nothing to renew or fence.
    fn duration(&self) -> Option<Duration>;

    /// Says what this node does with the lock (`revision`, `phase`), written with the next
    /// write; `false` when that is what it already said, or the backend says nothing.
    fn set_doing(&self, revision: Option<String>, phase: SlotPhase) -> bool;

    /// The same lock with its duration raised to `ttl` (a rebooting holder's), or the same
    /// lock when the backend has no duration of its own.
    fn with_ttl(self: Arc<Self>, ttl: Duration) -> Arc<dyn RolloutLock>;
}

impl RolloutLock for LeaseLock {
    fn backend(&self) -> SlotBackend {
        SlotBackend::Kubernetes
    }

    fn group(&self) -> &str {
        &self.group
    }

    fn slot_name(&self, slot: Option<u32>) -> String {
        self.name(slot.unwrap_or_default())
    }

    fn acquire(&self, soak: Duration) -> LockFuture<'_, Taken> {
        Box::pin(async move {
            Ok(match LeaseLock::acquire(self, soak).await? {
                Acquired::Slot {
                    index,
                    resumed,
                    vanished,
                } => Taken::Slot {
                    slot: Some(index),
                    resumed,
                    vanished,
                },
                Acquired::Full(holders) => Taken::Full(holders),
                Acquired::Soaking { left, after } => Taken::Soaking { left, after },
            })
        })
    }

    fn renew(&self, slot: Option<u32>) -> LockFuture<'_, bool> {
        Box::pin(async move {
            match slot {
                Some(i) => LeaseLock::renew(self, i).await,
                None => Ok(false),
            }
        })
    }

    fn release(&self, slot: Option<u32>) -> LockFuture<'_, Released> {
        Box::pin(async move {
            match slot {
                Some(i) => LeaseLock::release(self, i).await,
                None => Ok(Released::NotHeld),
            }
        })
    }

    fn duration(&self) -> Option<Duration> {
        Some(self.duration)
    }

    fn set_doing(&self, revision: Option<String>, phase: SlotPhase) -> bool {
        let mut d = self.doing.lock().unwrap_or_else(|e| e.into_inner());
        let new = lease::Doing {
            revision: revision.or_else(|| d.revision.clone()),
            phase,
        };
        let changed = *d != new;
        *d = new;
        changed
    }

    fn with_ttl(self: Arc<Self>, ttl: Duration) -> Arc<dyn RolloutLock> {
        let mut lock = (*self).clone();
        lock.duration = ttl;
        Arc::new(lock)
    }
}

impl RolloutLock for FleetLock {
    fn backend(&self) -> SlotBackend {
        SlotBackend::Fleetlock
    }

    fn group(&self) -> &str {
        FleetLock::group(self)
    }

    fn slot_name(&self, _: Option<u32>) -> String {
        format!("FleetLock group {}", FleetLock::group(self))
    }

    fn acquire(&self, _soak: Duration) -> LockFuture<'_, Taken> {
        Box::pin(async move {
            match self.pre_reboot().await {
                Ok(()) => Ok(Taken::Slot {
                    slot: None,
                    resumed: false,
                    vanished: None,
                }),
                Err(e) if e.is_refused() => Ok(Taken::Refused(e.to_string())),
                Err(e) => Err(LockError::Unavailable(e.to_string())),
            }
        })
    }

    /// The server keeps the lock until steady-state: there is nothing to renew.
    fn renew(&self, _: Option<u32>) -> LockFuture<'_, bool> {
        Box::pin(async { Ok(true) })
    }

    fn release(&self, _: Option<u32>) -> LockFuture<'_, Released> {
        Box::pin(async move {
            match self.steady_state().await {
                Ok(()) => Ok(Released::Yes),
                // poseidon/fleetlock answers 423 to a steady-state from an id that does not
                // hold the group's slot: there is nothing of this node's to give back, and
                // asking again would never end.
                Err(FleetLockError::Refused {
                    status: 409 | 423, ..
                }) => {
                    tracing::warn!(group = %FleetLock::group(self), id = self.id(),
                        "the FleetLock server says another node holds the group's slot; this node holds nothing to release");
                    Ok(Released::NotHeld)
                }
                Err(e) => Err(LockError::Unavailable(e.to_string())),
            }
        })
    }

    fn duration(&self) -> Option<Duration> {
        None
    }

    fn set_doing(&self, _: Option<String>, _: SlotPhase) -> bool {
        false
    }

    fn with_ttl(self: Arc<Self>, _: Duration) -> Arc<dyn RolloutLock> {
        self
    }
}
