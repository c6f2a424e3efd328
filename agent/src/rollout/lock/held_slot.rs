//! The lock this node holds, while it holds it: the renewal task that keeps a slot Lease
//! written at a third of its duration, when it was last written (on the monotonic clock, for
//! fencing), and whether it was lost.
//!
//! Owns the rule that makes a slot lost: another node holds it at a renewal, or no renewal
//! succeeded for the slot's whole duration (by then another node may have taken it, and it
//! cannot be known until the API answers). Does not own taking or releasing the lock.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::rollout::lock::{LockError, RolloutLock, SlotError};
use crate::state::TakenSlot;

pub(crate) struct HeldSlot {
    pub held: TakenSlot,
    /// The slot's renewal, for a lock that has a duration (a slot Lease).
    renew: Option<tokio::task::JoinHandle<()>>,
    /// The lock, for what a slot Lease needs done while held (fencing, the phase, a longer
    /// duration for a reboot); `None` for a FleetLock, which the server keeps.
    pub lock: Option<Arc<dyn RolloutLock>>,
    /// When the slot was last written by this node (taken or renewed), on the monotonic clock.
    renewed: Arc<Mutex<Instant>>,
    /// Set when a renewal found another holder, or the slot went unrenewed for its duration.
    lost: Arc<AtomicBool>,
    /// When this process took (or took up again) the slot, for `rollout_slot_held_seconds`.
    pub taken: Instant,
}

impl HeldSlot {
    /// A lock kept by its server until released (FleetLock): nothing to renew.
    pub fn kept(held: TakenSlot) -> Self {
        Self {
            held,
            renew: None,
            lock: None,
            renewed: Arc::new(Mutex::new(Instant::now())),
            lost: Arc::new(AtomicBool::new(false)),
            taken: Instant::now(),
        }
    }

    /// A lock just taken or renewed, renewed from now on by a task of its own (when it has a
    /// duration) that bumps `changes` when the lock is lost.
    pub fn renewed(
        held: TakenSlot,
        lock: Arc<dyn RolloutLock>,
        changes: watch::Sender<u64>,
    ) -> Self {
        let renewed = Arc::new(Mutex::new(Instant::now()));
        let lost = Arc::new(AtomicBool::new(false));
        let renew = lock.duration().map(|_| {
            tokio::spawn(renew(
                Arc::clone(&lock),
                held.slot,
                Arc::clone(&renewed),
                Arc::clone(&lost),
                changes,
            ))
        });
        Self {
            held,
            renew,
            lock: Some(lock),
            renewed,
            lost,
            taken: Instant::now(),
        }
    }

    pub fn lost(&self) -> bool {
        self.lost.load(Ordering::Relaxed)
    }

    fn since_renewal(&self) -> Duration {
        guard(&self.renewed).elapsed()
    }

    /// Fencing: whether an activation or a reboot may start now under this lock. Its last
    /// write must be younger than a third of its duration on the monotonic clock (so no
    /// other node can have judged it expired before the start plus two thirds of it); an
    /// older one is written again first. A lost lock starts nothing.
    pub async fn fence(&self, changes: &watch::Sender<u64>) -> Result<(), SlotError> {
        let Some(lock) = &self.lock else {
            return Ok(());
        };
        let Some(duration) = lock.duration() else {
            return Ok(());
        };
        let name = lock.slot_name(self.held.slot);
        if self.lost() {
            return Err(SlotError::Lost(name));
        }
        if self.since_renewal() < duration / 3 {
            return Ok(());
        }
        match self.renew_now(changes).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(SlotError::TakenByAnother(name)),
            Err(e) => Err(SlotError::Lock(e.context(&format!(
                "cannot renew the rollout slot {name} before starting"
            )))),
        }
    }

    /// Writes the lock now: its renewal time updated, or the lock marked lost when another
    /// node holds it (`Ok(false)`).
    pub async fn renew_now(&self, changes: &watch::Sender<u64>) -> Result<bool, LockError> {
        let Some(lock) = &self.lock else {
            return Ok(true);
        };
        renew_now(
            lock.as_ref(),
            self.held.slot,
            &self.renewed,
            &self.lost,
            changes,
        )
        .await
    }
}

impl Drop for HeldSlot {
    fn drop(&mut self) {
        if let Some(t) = self.renew.take() {
            t.abort();
        }
    }
}

fn guard<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Marks the lock lost (once) and wakes whoever waits on the gatekeeper.
fn mark_lost(
    lock: &dyn RolloutLock,
    slot: Option<u32>,
    lost: &AtomicBool,
    changes: &watch::Sender<u64>,
    why: &str,
) {
    if !lost.swap(true, Ordering::Relaxed) {
        tracing::error!(slot = slot.unwrap_or_default(), lease = %lock.slot_name(slot), why,
            "the rollout slot was lost: nothing new starts until a slot is taken again; an activation or gate under way finishes and is reported");
        changes.send_modify(|n| *n = n.wrapping_add(1));
    }
}

async fn renew_now(
    lock: &dyn RolloutLock,
    slot: Option<u32>,
    renewed: &Mutex<Instant>,
    lost: &AtomicBool,
    changes: &watch::Sender<u64>,
) -> Result<bool, LockError> {
    let held = lock.renew(slot).await?;
    if held {
        *guard(renewed) = Instant::now();
    } else {
        mark_lost(lock, slot, lost, changes, "taken by another node");
    }
    Ok(held)
}

/// What a renewal's outcome means for the lock, `age` after its last successful write.
#[derive(Debug, PartialEq, Eq)]
enum Renewal {
    Renewed,
    Lost(&'static str),
    /// Failed, but the lock cannot have expired yet: try again at the next renewal.
    Retry,
}

/// The rule of the renewal loop, pure.
fn judge(result: &Result<bool, LockError>, age: Duration, duration: Duration) -> Renewal {
    match result {
        Ok(true) if age < duration => Renewal::Renewed,
        // Renewed, but only after the slot could have expired for others: whether another
        // node took and released it meanwhile cannot be told, so it counts as lost.
        Ok(true) => Renewal::Lost("not renewed for its duration"),
        Ok(false) => Renewal::Lost("taken by another node"),
        Err(_) if age >= duration => Renewal::Lost("not renewed for its duration"),
        Err(_) => Renewal::Retry,
    }
}

/// Renews the lock at a third of its duration until aborted or lost.
async fn renew(
    lock: Arc<dyn RolloutLock>,
    slot: Option<u32>,
    renewed: Arc<Mutex<Instant>>,
    lost: Arc<AtomicBool>,
    changes: watch::Sender<u64>,
) {
    let Some(duration) = lock.duration() else {
        return;
    };
    let index = slot.unwrap_or_default();
    loop {
        tokio::time::sleep(duration / 3).await;
        if lost.load(Ordering::Relaxed) {
            // Lost for good: this node never writes the slot again (taking one again is a new
            // acquire).
            return;
        }
        let result = lock.renew(slot).await;
        let age = guard(&renewed).elapsed();
        match judge(&result, age, duration) {
            Renewal::Renewed => *guard(&renewed) = Instant::now(),
            Renewal::Lost(why) => {
                if let Err(e) = &result {
                    tracing::warn!(slot = index, error = %e, "cannot renew the rollout slot");
                }
                mark_lost(lock.as_ref(), slot, &lost, &changes, why);
            }
            Renewal::Retry => {
                if let Err(e) = &result {
                    tracing::warn!(slot = index, error = %e, "cannot renew the rollout slot; trying again");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: Duration = Duration::from_secs(15);

    #[test]
    fn a_renewal_within_the_duration_keeps_the_slot() {
        assert_eq!(judge(&Ok(true), D / 3, D), Renewal::Renewed);
    }

    #[test]
    fn a_renewal_that_came_after_the_duration_counts_as_lost() {
        assert!(matches!(judge(&Ok(true), D, D), Renewal::Lost(_)));
    }

    #[test]
    fn another_holder_means_lost_at_once() {
        assert_eq!(
            judge(&Ok(false), Duration::ZERO, D),
            Renewal::Lost("taken by another node")
        );
    }

    #[test]
    fn a_failed_renewal_is_retried_until_the_duration_is_over() {
        let e = Err(LockError::Unavailable("timed out".into()));
        assert_eq!(judge(&e, D / 2, D), Renewal::Retry);
        assert_eq!(
            judge(&e, D, D),
            Renewal::Lost("not renewed for its duration")
        );
    }
}
