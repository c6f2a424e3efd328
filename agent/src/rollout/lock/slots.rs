//! Which slot Lease to take, as a pure function of the slots as read, and how long this node
//! has seen each of them unchanged.
//!
//! A slot is free when it does not exist, has no holder (released), or this node has seen it
//! unchanged (the same `resourceVersion`) for its `leaseDurationSeconds` on its own monotonic
//! clock (expired: its holder stopped renewing). That is client-go's leader-election rule:
//! another node's `renewTime` is never compared with this node's wall clock, so a clock that is
//! minutes off on either side neither takes a live slot nor keeps a dead one. A node that
//! already holds a slot keeps that one (after a restart it resumes, never taking a second).
//! Otherwise it takes a free slot, and only while fewer than `max` nodes hold one. A slot its
//! last holder handed to a named waiting node (see `lease.rs`, the queue) is that node's first:
//! it takes it before any other, and the others leave it alone until they have seen it
//! unchanged for [`RESERVE`].

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

/// A slot Lease as read from the API.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Slot {
    pub index: u32,
    pub holder: Option<String>,
    /// How long this node has seen the Lease unchanged (see [`Observed`]).
    pub unchanged_for: Duration,
    pub duration: Duration,
    /// The waiting nodes its last holder handed it to on release, if any.
    pub next: Vec<String>,
}

/// How long a slot handed to a named node is left to it by the others, as each sees it
/// unchanged on its own monotonic clock; then it is free for any node.
pub const RESERVE: Duration = Duration::from_secs(2);

/// Added to a slot's duration before it counts as expired: the API server's policy
/// (`packaging/kubernetes/vap.yaml`) judges expiry by the whole-second times it stamps, and
/// refuses a take-over within the second after the exact expiry.
pub const STAMP_GRAIN: Duration = Duration::from_secs(1);

impl Slot {
    fn expired(&self) -> bool {
        self.unchanged_for >= self.duration + STAMP_GRAIN
    }

    /// The live holder: set, and not seen unchanged for the Lease's duration (and a second).
    pub fn live_holder(&self) -> Option<&str> {
        let holder = self.holder.as_deref().filter(|h| !h.is_empty())?;
        (!self.expired()).then_some(holder)
    }

    /// Free, but handed to other nodes than `node`, and not yet seen unchanged for
    /// [`RESERVE`].
    fn reserved_against(&self, node: &str) -> bool {
        self.holder.as_deref().is_none_or(str::is_empty)
            && !self.next.is_empty()
            && !self.next.iter().any(|n| n == node)
            && self.unchanged_for < RESERVE
    }

    /// Whether the slot has a holder that stopped renewing it (not released: expired).
    pub fn expired_holder(&self) -> Option<&str> {
        let holder = self.holder.as_deref().filter(|h| !h.is_empty())?;
        self.expired().then_some(holder)
    }
}

/// When this node first saw each Lease at its current `resourceVersion`, on the monotonic
/// clock. A Lease seen for the first time (after a start of ginx, or a change) counts as just
/// renewed: its holder gets a whole duration from now, which errs on the side of waiting.
#[derive(Debug, Default)]
pub struct Observed {
    seen: HashMap<String, (String, Instant)>,
    /// Each slot Lease's last gate pass (`<revision> <node>`) and when this node first saw it:
    /// `rollout.soak` counts from then, on this node's monotonic clock.
    passes: HashMap<String, (String, Instant)>,
}

impl Observed {
    /// How long `name` has been seen at `resource_version`, as of `now`.
    pub fn unchanged_for(&mut self, name: &str, resource_version: &str, now: Instant) -> Duration {
        match self.seen.get(name) {
            Some((rv, since)) if rv == resource_version => now.saturating_duration_since(*since),
            _ => {
                self.seen
                    .insert(name.to_owned(), (resource_version.to_owned(), now));
                Duration::ZERO
            }
        }
    }

    /// Like [`unchanged_for`](Self::unchanged_for), but `None` when this is the first sight of
    /// `name` (nothing is known of its age yet). A Lease seen before at another version was
    /// written since the last look: its age counts from now.
    pub fn age(&mut self, name: &str, resource_version: &str, now: Instant) -> Option<Duration> {
        let known = self.seen.contains_key(name);
        let d = self.unchanged_for(name, resource_version, now);
        known.then_some(d)
    }

    /// Forgets the Leases of `prefix` not in `names` (deleted ones), so the table stays as
    /// small as the Leases that exist.
    pub fn retain(&mut self, prefix: &str, names: &[&str]) {
        self.seen
            .retain(|n, _| !n.starts_with(prefix) || names.contains(&n.as_str()));
        self.passes
            .retain(|n, _| !n.starts_with(prefix) || names.contains(&n.as_str()));
    }

    /// Slot Lease `name` records the gate pass `pass` (`<revision> <node>`): remembered with
    /// the moment it was first seen.
    pub fn saw_pass(&mut self, name: &str, pass: &str, now: Instant) {
        match self.passes.get(name) {
            Some((p, _)) if p == pass => {}
            _ => {
                self.passes.insert(name.to_owned(), (pass.to_owned(), now));
            }
        }
    }

    /// The latest gate pass of `revision` seen on the slots of `prefix`: when it was first
    /// seen, and on which node.
    pub fn last_pass(&self, prefix: &str, revision: &str) -> Option<(Instant, String)> {
        self.passes
            .iter()
            .filter(|(n, _)| n.starts_with(prefix))
            .filter_map(|(_, (p, at))| {
                let (r, node) = p.split_once(' ')?;
                (r == revision).then(|| (*at, node.to_owned()))
            })
            .max_by_key(|(at, _)| *at)
    }
}

/// The home slot of `node` among `max`: spread by the name (FNV-1a, stable across processes
/// and versions, unlike std's hasher).
pub fn home(node: &str, max: u32) -> u32 {
    (fnv(node) % u64::from(max.max(1))) as u32
}

/// FNV-1a of `s`, 64 bits.
pub fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Choice {
    /// This node holds this slot already.
    Own(u32),
    /// This slot is free: take it (create it when it does not exist).
    Take(u32),
    /// All taken; slot → holder.
    Full(BTreeMap<u32, String>),
}

/// `slots` are the group's Leases that exist (any index); `max` the slots allowed. Of the free
/// slots, the one at `pick` (modulo how many are free) is taken: the caller picks at random, so
/// that the nodes woken by one release do not all race for the lowest free slot (at 300 nodes
/// that race cost 64 lost writes per slot taken).
pub fn choose(slots: &[Slot], node: &str, max: u32, pick: u32) -> Choice {
    // Ours even if it expired: nobody took it over, so the lock never left this node.
    if let Some(s) = slots.iter().find(|s| s.holder.as_deref() == Some(node)) {
        return Choice::Own(s.index);
    }
    let holders: BTreeMap<u32, String> = slots
        .iter()
        .filter_map(|s| s.live_holder().map(|h| (s.index, h.to_owned())))
        .collect();
    if holders.len() >= max as usize {
        return Choice::Full(holders);
    }
    // A slot whose holder stopped renewing is taken over first: the taker finds out what the
    // vanished holder was doing (and halts its revision), however many other slots are free.
    if let Some(s) = slots
        .iter()
        .find(|s| s.index < max && s.expired_holder().is_some())
    {
        return Choice::Take(s.index);
    }
    let slot = |i: u32| slots.iter().find(|s| s.index == i);
    // Handed to this node by name: its own first.
    if let Some(s) = slots.iter().find(|s| {
        s.index < max && !holders.contains_key(&s.index) && s.next.iter().any(|n| n == node)
    }) {
        return Choice::Take(s.index);
    }
    let free: Vec<u32> = (0..max)
        .filter(|i| !holders.contains_key(i))
        .filter(|i| !slot(*i).is_some_and(|s| s.reserved_against(node)))
        .collect();
    match free.len() {
        0 => Choice::Full(holders),
        n => Choice::Take(free[pick as usize % n]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A slot seen unchanged for `unchanged` seconds, of duration 60 s.
    fn slot(index: u32, holder: Option<&str>, unchanged: u64) -> Slot {
        Slot {
            index,
            holder: holder.map(str::to_owned),
            unchanged_for: Duration::from_secs(unchanged),
            duration: Duration::from_secs(60),
            next: Vec::new(),
        }
    }

    #[test]
    fn a_slot_handed_to_a_node_is_its_own_first_and_left_to_it_for_the_reserve() {
        let handed = |unchanged_ms: u64| Slot {
            next: vec!["quinn".into(), "makise".into()],
            unchanged_for: Duration::from_millis(unchanged_ms),
            ..slot(1, None, 0)
        };
        // The named node takes it before any other free slot, whatever its pick.
        for pick in 0..4 {
            assert_eq!(
                choose(&[slot(0, Some("a"), 0), handed(0)], "makise", 4, pick),
                Choice::Take(1)
            );
        }
        // Another node leaves it alone while it is fresh, and takes another free one...
        for pick in 0..4 {
            assert_ne!(
                choose(&[slot(0, Some("a"), 0), handed(1900)], "lucy", 4, pick),
                Choice::Take(1)
            );
        }
        // ...or finds none when it was the only free one.
        assert!(matches!(
            choose(&[slot(0, Some("a"), 0), handed(0)], "lucy", 2, 0),
            Choice::Full(_)
        ));
        // Once seen unchanged for the reserve, it is free for any node.
        assert_eq!(
            choose(&[slot(0, Some("a"), 0), handed(2000)], "lucy", 2, 0),
            Choice::Take(1)
        );
        // Taken by the node named: held, like any slot.
        let taken = Slot {
            holder: Some("makise".into()),
            ..handed(0)
        };
        assert!(
            matches!(choose(&[slot(0, Some("a"), 0), taken], "lucy", 2, 0), Choice::Full(h) if h.len() == 2)
        );
    }

    #[test]
    fn no_leases_yet_takes_slot_zero() {
        assert_eq!(choose(&[], "lucy", 1, 0), Choice::Take(0));
    }

    #[test]
    fn a_held_slot_is_full_and_names_the_holder() {
        let s = [slot(0, Some("makise"), 10)];
        assert_eq!(
            choose(&s, "lucy", 1, 0),
            Choice::Full([(0, "makise".to_owned())].into())
        );
    }

    #[test]
    fn a_released_slot_is_free() {
        assert_eq!(choose(&[slot(0, None, 0)], "lucy", 1, 0), Choice::Take(0));
        assert_eq!(
            choose(&[slot(0, Some(""), 0)], "lucy", 1, 0),
            Choice::Take(0)
        );
        assert_eq!(slot(0, None, 600).expired_holder(), None);
    }

    #[test]
    fn a_slot_seen_unchanged_for_its_duration_and_a_second_is_free() {
        let s = [slot(0, Some("makise"), 61)];
        assert_eq!(choose(&s, "lucy", 1, 0), Choice::Take(0));
        assert_eq!(s[0].expired_holder(), Some("makise"));
        // Within the second the server's whole-second stamps cannot tell: still live.
        let s = [slot(0, Some("makise"), 60)];
        assert!(matches!(choose(&s, "lucy", 1, 0), Choice::Full(_)));
        assert_eq!(s[0].expired_holder(), None);
    }

    #[test]
    fn the_own_slot_is_resumed_not_a_second_taken() {
        let s = [slot(0, Some("makise"), 0), slot(1, Some("lucy"), 500)];
        assert_eq!(choose(&s, "lucy", 3, 0), Choice::Own(1));
    }

    #[test]
    fn the_lowest_free_slot_is_taken_while_fewer_than_max_hold() {
        let s = [slot(0, Some("a"), 0), slot(2, Some("b"), 0)];
        assert_eq!(choose(&s, "lucy", 3, 0), Choice::Take(1));
        let full = [
            slot(0, Some("a"), 0),
            slot(1, Some("b"), 0),
            slot(2, Some("c"), 0),
        ];
        assert!(matches!(choose(&full, "lucy", 3, 0), Choice::Full(h) if h.len() == 3));
    }

    #[test]
    fn the_free_slot_taken_is_the_one_picked() {
        let s = [slot(1, Some("a"), 0)];
        assert_eq!(choose(&s, "lucy", 4, 0), Choice::Take(0));
        assert_eq!(choose(&s, "lucy", 4, 1), Choice::Take(2));
        assert_eq!(choose(&s, "lucy", 4, 2), Choice::Take(3));
        assert_eq!(
            choose(&s, "lucy", 4, 3),
            Choice::Take(0),
            "modulo the free ones"
        );
    }

    #[test]
    fn home_slots_are_stable_and_spread_over_the_slots() {
        assert_eq!(home("lucy", 1), 0);
        assert_eq!(home("lucy", 50), home("lucy", 50));
        let mut per = [0u32; 50];
        for i in 0..1000 {
            per[home(&format!("worker-{i:04}"), 50) as usize] += 1;
        }
        // 20 each on average; none empty, none with more than twice its share.
        assert!(per.iter().all(|&n| (1..=40).contains(&n)), "{per:?}");
    }

    #[test]
    fn an_expired_slot_is_taken_over_before_a_free_one() {
        let s = [slot(1, Some("makise"), 61)];
        for pick in 0..4 {
            assert_eq!(choose(&s, "lucy", 3, pick), Choice::Take(1));
        }
    }

    #[test]
    fn holders_above_a_lowered_max_still_count() {
        // max_concurrent went from 3 to 1 while slot 2 was held.
        let s = [slot(2, Some("a"), 0)];
        assert!(matches!(choose(&s, "lucy", 1, 0), Choice::Full(_)));
    }

    #[test]
    fn a_soak_counts_from_when_this_node_first_saw_the_latest_pass_of_the_revision() {
        let mut o = Observed::default();
        let t0 = Instant::now();
        let s = |n: u64| t0 + Duration::from_secs(n);
        assert_eq!(o.last_pass("g-", "r1"), None);
        o.saw_pass("g-0", "r1 makise", s(0));
        // Seen again unchanged: still counted from the first sight.
        o.saw_pass("g-0", "r1 makise", s(5));
        assert_eq!(o.last_pass("g-", "r1"), Some((s(0), "makise".into())));
        // Another node's pass of the same revision in another slot is the latest.
        o.saw_pass("g-1", "r1 quinn", s(7));
        assert_eq!(o.last_pass("g-", "r1"), Some((s(7), "quinn".into())));
        // Another revision, and another group's slots, do not count.
        o.saw_pass("g-2", "r2 lucy", s(9));
        o.saw_pass("h-0", "r1 lucy", s(9));
        assert_eq!(o.last_pass("g-", "r1"), Some((s(7), "quinn".into())));
        // The slot held by another node passing: a new pass, counted from now.
        o.saw_pass("g-0", "r1 lucy", s(10));
        assert_eq!(o.last_pass("g-", "r1"), Some((s(10), "lucy".into())));
    }

    #[test]
    fn a_lease_counts_from_when_this_node_saw_its_version_and_a_change_starts_again() {
        let mut o = Observed::default();
        let t0 = Instant::now();
        let s = |n: u64| t0 + Duration::from_secs(n);
        // First sight: just renewed, whatever its renewTime says.
        assert_eq!(o.unchanged_for("l", "1", s(0)), Duration::ZERO);
        assert_eq!(o.unchanged_for("l", "1", s(30)), Duration::from_secs(30));
        // Renewed: a new resourceVersion starts the count again.
        assert_eq!(o.unchanged_for("l", "2", s(31)), Duration::ZERO);
        assert_eq!(o.unchanged_for("l", "2", s(40)), Duration::from_secs(9));
        // A deleted Lease is forgotten; one of another prefix is kept.
        o.unchanged_for("other", "7", s(0));
        o.retain("l", &[]);
        assert_eq!(o.unchanged_for("l", "2", s(50)), Duration::ZERO);
        assert_eq!(
            o.unchanged_for("other", "7", s(50)),
            Duration::from_secs(50)
        );
    }
}
