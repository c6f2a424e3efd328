//! Which slot Lease to take, as a pure function of the slots as read.
//!
//! A slot is free when it does not exist, has no holder (released), or was not renewed within
//! its duration (expired: its holder is gone). A node that already holds a slot keeps that one
//! (after a restart it resumes, never taking a second). Otherwise it takes the lowest free
//! slot, and only while fewer than `max` nodes hold one.

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;

/// A slot Lease as read from the API.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Slot {
    pub index: u32,
    pub holder: Option<String>,
    pub renewed: Option<Timestamp>,
    pub duration: Duration,
}

impl Slot {
    /// The live holder: set and renewed within the duration.
    pub fn live_holder(&self, now: Timestamp) -> Option<&str> {
        let holder = self.holder.as_deref().filter(|h| !h.is_empty())?;
        let renewed = self.renewed?;
        let age = now.duration_since(renewed);
        (age.is_negative() || age.unsigned_abs() < self.duration).then_some(holder)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Choice {
    /// This node holds this slot already.
    Held(u32),
    /// This slot is free: take it (create it when it does not exist).
    Take(u32),
    /// All taken; slot → holder.
    Full(BTreeMap<u32, String>),
}

/// `slots` are the group's Leases that exist (any index); `max` the slots allowed.
pub fn choose(slots: &[Slot], node: &str, max: u32, now: Timestamp) -> Choice {
    // Ours even if it expired: nobody took it over, so the lock never left this node.
    if let Some(s) = slots.iter().find(|s| s.holder.as_deref() == Some(node)) {
        return Choice::Held(s.index);
    }
    let holders: BTreeMap<u32, String> = slots
        .iter()
        .filter_map(|s| s.live_holder(now).map(|h| (s.index, h.to_owned())))
        .collect();
    if holders.len() >= max as usize {
        return Choice::Full(holders);
    }
    match (0..max).find(|i| !holders.contains_key(i)) {
        Some(i) => Choice::Take(i),
        None => Choice::Full(holders),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    fn slot(index: u32, holder: Option<&str>, renewed: i64) -> Slot {
        Slot {
            index,
            holder: holder.map(str::to_owned),
            renewed: Some(t(renewed)),
            duration: Duration::from_secs(60),
        }
    }

    #[test]
    fn no_leases_yet_takes_slot_zero() {
        assert_eq!(choose(&[], "lucy", 1, t(0)), Choice::Take(0));
    }

    #[test]
    fn a_held_slot_is_full_and_names_the_holder() {
        let s = [slot(0, Some("makise"), 0)];
        assert_eq!(
            choose(&s, "lucy", 1, t(10)),
            Choice::Full([(0, "makise".to_owned())].into())
        );
    }

    #[test]
    fn a_released_slot_is_free() {
        assert_eq!(
            choose(&[slot(0, None, 0)], "lucy", 1, t(10)),
            Choice::Take(0)
        );
        assert_eq!(
            choose(&[slot(0, Some(""), 0)], "lucy", 1, t(10)),
            Choice::Take(0)
        );
    }

    #[test]
    fn an_expired_slot_is_free() {
        let s = [slot(0, Some("makise"), 0)];
        assert_eq!(choose(&s, "lucy", 1, t(60)), Choice::Take(0));
        assert!(matches!(choose(&s, "lucy", 1, t(59)), Choice::Full(_)));
    }

    #[test]
    fn the_own_slot_is_resumed_not_a_second_taken() {
        let s = [slot(0, Some("makise"), 0), slot(1, Some("lucy"), -500)];
        assert_eq!(choose(&s, "lucy", 3, t(10)), Choice::Held(1));
    }

    #[test]
    fn the_lowest_free_slot_is_taken_while_fewer_than_max_hold() {
        let s = [slot(0, Some("a"), 0), slot(2, Some("b"), 0)];
        assert_eq!(choose(&s, "lucy", 3, t(1)), Choice::Take(1));
        let full = [
            slot(0, Some("a"), 0),
            slot(1, Some("b"), 0),
            slot(2, Some("c"), 0),
        ];
        assert!(matches!(choose(&full, "lucy", 3, t(1)), Choice::Full(h) if h.len() == 3));
    }

    #[test]
    fn holders_above_a_lowered_max_still_count() {
        // max_concurrent went from 3 to 1 while slot 2 was held.
        let s = [slot(2, Some("a"), 0)];
        assert!(matches!(choose(&s, "lucy", 1, t(1)), Choice::Full(_)));
    }
}
