//! Canaries (`rollout.first`, `rollout.first_selector`): named nodes of a group take each
//! revision before any other node of that group. The others start a revision only once every
//! canary of their group passed its gate on it (its heartbeat's passed revision is it, or a
//! later one) and `rollout.soak` has elapsed since this node first saw the last of those passes
//! (on its monotonic clock). A canary that is held, down (its heartbeat not renewed), unknown
//! or behind makes the group wait, named in the reason: it is never skipped.
//!
//! Owns the decision ([`verdict`], pure over the read model's heartbeats and Nodes) and the
//! memory between looks (when every canary was first seen passed). The read model watches the
//! group's heartbeats while it waits. A canary itself is not held back by this (the slots and
//! the other guards are what it waits for).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use jiff::Timestamp;

use crate::config::Config;
use crate::config::selector::Selector;
use crate::rollout::fleet::state::FleetState;
use crate::rollout::view::{Heartbeat, NodeFacts, projections::lag_secs};
use crate::types::Revision;

/// One canary of this node's group, as its heartbeat (and the fleet state) say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Canary {
    pub node: String,
    /// Its heartbeat Lease exists.
    pub found: bool,
    pub passed: Option<Revision>,
    /// What it passed is this revision or a later one.
    pub done: bool,
    /// Its heartbeat's renewal lags the freshest heartbeat's by more than its duration (both
    /// times the API server's): its ginx is down or cut off.
    pub stale_secs: Option<i64>,
    /// An operator's hold on it, described.
    pub held: Option<String>,
}

/// What the canaries say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum CanaryVerdict {
    Go,
    /// Wait, and why.
    Wait(String),
    /// Every canary passed; the soak has this much left.
    Soak(String, Duration),
}

/// Whether a node of the group may start `revision`, given its canaries, when this node first
/// saw them all pass (`all_passed_since`, monotonic) and `now`.
pub(crate) fn verdict(
    canaries: &[Canary],
    revision: &Revision,
    soak: Duration,
    all_passed_since: Option<Instant>,
    now: Instant,
) -> CanaryVerdict {
    let mut why = Vec::new();
    for c in canaries {
        let name = &c.node;
        if let Some(h) = &c.held {
            why.push(format!(
                "canary {name} (rollout.first) is held {h}: `ginxctl release {name}`, or take it \
                 out of rollout.first"
            ));
        } else if !c.found {
            why.push(format!(
                "canary {name} (rollout.first) has no heartbeat Lease: it never ran ginx, or \
                 the name is wrong"
            ));
        } else if let Some(secs) = c.stale_secs.filter(|_| !c.done) {
            why.push(format!(
                "canary {name} has not renewed its heartbeat for {secs}s (down or cut off)"
            ));
        } else if !c.done {
            why.push(format!(
                "canary {name} has not passed its gate on {} yet (it passed {})",
                revision.short(),
                c.passed.as_ref().map_or("nothing yet", |r| r.short())
            ));
        }
    }
    if !why.is_empty() {
        return CanaryVerdict::Wait(format!("{}; the group waits for it", why.join("; ")));
    }
    let since = all_passed_since.unwrap_or(now);
    let left = soak.saturating_sub(now.saturating_duration_since(since));
    if left.is_zero() {
        return CanaryVerdict::Go;
    }
    let names: Vec<&str> = canaries.iter().map(|c| c.node.as_str()).collect();
    CanaryVerdict::Soak(
        format!(
            "canaries {} passed their gates on {}; rollout.soak has {}s left",
            names.join(", "),
            revision.short(),
            left.as_secs_f64().ceil()
        ),
        left,
    )
}

#[derive(Default)]
pub(crate) struct CanaryGroup {
    /// The revision the group may start (canaries passed, soak over).
    passed: Option<Revision>,
    /// When this node first saw every canary pass a revision.
    all_passed: Option<(Revision, Instant)>,
    soak_left: Option<(Instant, Duration)>,
}

/// What the canaries are read from: the read model's heartbeats and (for
/// `rollout.first_selector`) Nodes, the fleet state (holds), the revisions known later than
/// the one asked about, and the clocks.
pub(crate) struct Seen<'a> {
    pub heartbeats: &'a BTreeMap<String, Heartbeat>,
    pub nodes: &'a BTreeMap<String, NodeFacts>,
    pub fleet: Option<&'a FleetState>,
    pub later: &'a BTreeSet<Revision>,
    /// Monotonic, for the soak.
    pub now: Instant,
    /// The wall clock, for the holds' ends.
    pub wall: Timestamp,
}

impl CanaryGroup {
    /// Whether canaries are to be asked about `revision`.
    pub fn pending(&mut self, cfg: &Config, revision: &Revision) -> bool {
        let r = &cfg.rollout;
        if (r.first.is_empty() && r.first_selector.is_none())
            || self.passed.as_ref() == Some(revision)
        {
            self.soak_left = None;
            return false;
        }
        true
    }

    /// How long after `now` (monotonic) the soak after the canaries is over, while waiting for
    /// it.
    pub fn soak_left(&self, now: Instant) -> Option<Duration> {
        let (at, left) = self.soak_left?;
        Some(left.saturating_sub(now.saturating_duration_since(at)))
    }

    /// Whether the canaries let this node start `revision`: `None`, or why not.
    pub fn check(&mut self, cfg: &Config, seen: &Seen<'_>, revision: &Revision) -> Option<String> {
        let names = names(cfg, seen.nodes);
        if names.contains(cfg.node_name()) {
            self.passed = Some(revision.clone());
            return None;
        }
        let group = cfg.rollout.group_for(cfg.node.role);
        let canaries = canaries_of(cfg, seen, &names, &group, revision);
        let now = seen.now;
        if canaries.iter().all(|c| c.done && c.held.is_none()) {
            if self.all_passed.as_ref().is_none_or(|(r, _)| r != revision) {
                self.all_passed = Some((revision.clone(), now));
            }
        } else {
            self.all_passed = None;
        }
        let since = self.all_passed.as_ref().map(|(_, t)| *t);
        match verdict(&canaries, revision, cfg.rollout.soak.get(), since, now) {
            CanaryVerdict::Go => {
                self.passed = Some(revision.clone());
                self.soak_left = None;
                None
            }
            CanaryVerdict::Soak(why, left) => {
                self.soak_left = Some((now, left));
                Some(why)
            }
            CanaryVerdict::Wait(why) => {
                self.soak_left = None;
                Some(why)
            }
        }
    }
}

/// The canaries' names: `rollout.first` and the Nodes `rollout.first_selector` selects.
fn names(cfg: &Config, nodes: &BTreeMap<String, NodeFacts>) -> BTreeSet<String> {
    let mut names: BTreeSet<String> = cfg.rollout.first.iter().cloned().collect();
    // The selector was checked at load; one that no longer parses selects nothing.
    if let Some(sel) = cfg
        .rollout
        .first_selector
        .as_deref()
        .and_then(|s| Selector::parse(s).ok())
    {
        names.extend(
            nodes
                .iter()
                .filter(|(_, n)| sel.matches(&n.labels))
                .map(|(name, _)| name.clone()),
        );
    }
    names
}

/// The canaries of `group` among `names`, from the heartbeats: a name whose heartbeat is in
/// another group is that group's canary, not this one's; a name with no heartbeat at all is
/// kept (and waited for: a typo must not let the group go without its canary).
fn canaries_of(
    cfg: &Config,
    seen: &Seen<'_>,
    names: &BTreeSet<String>,
    group: &str,
    revision: &Revision,
) -> Vec<Canary> {
    let pattern = &cfg.kubernetes.lease_name;
    let mut out = Vec::new();
    for name in names {
        let lease = seen
            .heartbeats
            .values()
            .find(|h| h.node_by(pattern) == Some(name.as_str()));
        let held = seen
            .fleet
            .and_then(|f| f.hold_of(name, seen.wall))
            .map(crate::rollout::fleet::holds::Hold::describe);
        let Some(h) = lease else {
            out.push(Canary {
                node: name.clone(),
                found: false,
                passed: None,
                done: false,
                stale_secs: None,
                held,
            });
            continue;
        };
        if h.group != group {
            continue;
        }
        let stale_secs = lag_secs(seen.heartbeats.values(), h).filter(|lag| *lag > h.duration_secs);
        out.push(Canary {
            node: name.clone(),
            found: true,
            passed: h.passed.clone(),
            done: super::after::done(h.passed.as_ref(), revision, seen.later),
            stale_secs,
            held,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rev(c: char) -> Revision {
        std::iter::repeat_n(c, 40)
            .collect::<String>()
            .parse()
            .unwrap()
    }

    fn canary(node: &str) -> Canary {
        Canary {
            node: node.into(),
            found: true,
            passed: Some(rev('a')),
            done: true,
            stale_secs: None,
            held: None,
        }
    }

    fn heartbeat(node: &str, group: &str, passed: Option<char>, renewed: i64) -> Heartbeat {
        Heartbeat {
            name: format!("ginx-{node}"),
            holder: Some(node.into()),
            group: group.into(),
            passed: passed.map(rev),
            renewed: Some(Timestamp::from_second(renewed).unwrap()),
            duration_secs: 40,
        }
    }

    fn labelled(canary: bool) -> NodeFacts {
        NodeFacts {
            labels: [("ginx.io/canary".to_owned(), canary.to_string())].into(),
            annotations: BTreeMap::new(),
            conditions: [("Ready".to_owned(), ("True".to_owned(), String::new()))].into(),
        }
    }

    /// From the read model alone: the selector picks the canaries among the Nodes, a canary of
    /// another group is not this group's, one whose heartbeat lags is named as down, and a pass
    /// of a later revision counts.
    #[test]
    fn canaries_are_judged_from_the_read_model() {
        let mut cfg = Config::default();
        cfg.node.name = Some("w9".into());
        cfg.rollout.group = Some("workers".into());
        cfg.rollout.first_selector = Some("ginx.io/canary=true".into());
        cfg.rollout.soak = crate::config::Duration::from_secs(0);
        let nodes: BTreeMap<String, NodeFacts> = [
            ("w1".to_owned(), labelled(true)),
            ("cp1".to_owned(), labelled(true)),
            ("w9".to_owned(), labelled(false)),
        ]
        .into();
        let mut heartbeats: BTreeMap<String, Heartbeat> = BTreeMap::new();
        for h in [
            heartbeat("w1", "workers", Some('b'), 1000),
            heartbeat("cp1", "control-plane", None, 1000),
            heartbeat("w9", "workers", None, 1000),
        ] {
            heartbeats.insert(h.name.clone(), h);
        }
        let later: BTreeSet<Revision> = [rev('b')].into();
        fn seen<'a>(
            heartbeats: &'a BTreeMap<String, Heartbeat>,
            nodes: &'a BTreeMap<String, NodeFacts>,
            later: &'a BTreeSet<Revision>,
        ) -> Seen<'a> {
            Seen {
                heartbeats,
                nodes,
                fleet: None,
                later,
                now: Instant::now(),
                wall: Timestamp::from_second(2000).unwrap(),
            }
        }
        let mut group = CanaryGroup::default();
        assert!(group.pending(&cfg, &rev('a')));
        let none = BTreeSet::new();
        let why = group
            .check(&cfg, &seen(&heartbeats, &nodes, &none), &rev('a'))
            .unwrap();
        assert!(why.contains("canary w1 has not passed"), "{why}");
        assert!(!why.contains("cp1"), "{why}");
        assert_eq!(
            group.check(&cfg, &seen(&heartbeats, &nodes, &later), &rev('a')),
            None
        );
        assert!(!group.pending(&cfg, &rev('a')), "a pass is remembered");
        let stale = heartbeat("w1", "workers", None, 900);
        heartbeats.insert(stale.name.clone(), stale);
        let why = group
            .check(&cfg, &seen(&heartbeats, &nodes, &later), &rev('c'))
            .unwrap();
        assert!(
            why.contains("canary w1 has not renewed its heartbeat for 100s"),
            "{why}"
        );
    }

    #[test]
    fn the_group_goes_once_every_canary_passed_and_the_soak_is_over() {
        let r = rev('a');
        let t0 = Instant::now();
        let soak = Duration::from_secs(10);
        let all = [canary("w3"), canary("w4")];
        match verdict(&all, &r, soak, Some(t0), t0 + Duration::from_secs(4)) {
            CanaryVerdict::Soak(why, left) => {
                assert_eq!(left, Duration::from_secs(6));
                assert_eq!(
                    why,
                    "canaries w3, w4 passed their gates on aaaaaaaaaaaa; rollout.soak has 6s left"
                );
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            verdict(&all, &r, soak, Some(t0), t0 + soak),
            CanaryVerdict::Go
        );
        // First seen now: the soak starts now.
        assert!(matches!(
            verdict(&all, &r, soak, None, t0),
            CanaryVerdict::Soak(_, left) if left == soak
        ));
        assert_eq!(
            verdict(&all, &r, Duration::ZERO, None, t0),
            CanaryVerdict::Go
        );
        assert_eq!(
            verdict(&[], &r, Duration::ZERO, None, t0),
            CanaryVerdict::Go
        );
    }

    #[test]
    fn a_canary_held_down_unknown_or_behind_holds_the_group_and_is_named() {
        let r = rev('b');
        let t0 = Instant::now();
        let wait = |c: Canary| match verdict(&[canary("w1"), c], &r, Duration::ZERO, None, t0) {
            CanaryVerdict::Wait(why) => why,
            other => panic!("{other:?}"),
        };
        let behind = Canary {
            done: false,
            ..canary("w3")
        };
        assert_eq!(
            wait(behind.clone()),
            "canary w3 has not passed its gate on bbbbbbbbbbbb yet (it passed aaaaaaaaaaaa); \
             the group waits for it"
        );
        let down = Canary {
            stale_secs: Some(95),
            ..behind.clone()
        };
        assert!(wait(down).starts_with("canary w3 has not renewed its heartbeat for 95s"));
        let held = Canary {
            held: Some("by ann since T (disk) until U".into()),
            ..canary("w3")
        };
        assert!(wait(held).starts_with(
            "canary w3 (rollout.first) is held by ann since T (disk) until U: `ginxctl release w3`"
        ));
        let unknown = Canary {
            found: false,
            done: false,
            passed: None,
            ..canary("w9")
        };
        assert!(wait(unknown).contains("canary w9 (rollout.first) has no heartbeat Lease"));
    }
}
