//! Canaries (`rollout.first`, `rollout.first_selector`): named nodes of a group take each
//! revision before any other node of that group. The others start a revision only once every
//! canary of their group passed its gate on it (its heartbeat's passed revision is it, or a
//! later one) and `rollout.soak` has elapsed since this node first saw the last of those passes
//! (on its monotonic clock). A canary that is held, down (its heartbeat not renewed), unknown
//! or behind makes the group wait, named in the reason: it is never skipped.
//!
//! Owns the read of the canaries (their heartbeats, the selector's Nodes), the decision
//! ([`verdict`], pure) and the watch of the group's heartbeats while it waits. A canary itself
//! is not held back by this (the slots and the other guards are what it waits for).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use tokio::sync::watch;

use super::after::{Later, watch_heartbeats};
use crate::config::Config;
use crate::k8s::{HEARTBEAT_GROUP_LABEL, KubeClients};
use crate::rollout::decide::admission::Verdict;
use crate::rollout::fleet::state::FleetState;
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
    /// The watch of the group's heartbeats (group, clients generation), while waiting.
    watching: Option<(String, usize, watch::Sender<bool>)>,
}

impl CanaryGroup {
    /// Whether canaries are to be asked about `revision`.
    pub fn pending(&mut self, cfg: &Config, revision: &Revision) -> bool {
        let r = &cfg.rollout;
        if (r.first.is_empty() && r.first_selector.is_none())
            || self.passed.as_ref() == Some(revision)
        {
            self.watching = None;
            self.soak_left = None;
            return false;
        }
        true
    }

    /// How long until the soak after the canaries is over, while waiting for it.
    pub fn soak_left(&self) -> Option<Duration> {
        let (at, left) = self.soak_left?;
        Some(left.saturating_sub(at.elapsed()))
    }

    /// Reads the canaries: `Ok(None)` when this node may start `revision`, else why not (the
    /// group's heartbeats are then watched); `Err` with the verdict for a failed read.
    pub async fn check(
        &mut self,
        cfg: &Config,
        clients: &KubeClients,
        fleet: Option<&FleetState>,
        revision: &Revision,
        later: Option<&Later>,
        wake: (usize, &watch::Sender<u64>),
    ) -> Result<Option<String>, Verdict> {
        let me = cfg.node_name();
        let names = names(cfg, clients).await?;
        if names.contains(me) {
            self.passed = Some(revision.clone());
            return Ok(None);
        }
        let ns = &cfg.kubernetes.namespace;
        let api = kube::Api::<Lease>::namespaced(clients.main.clone(), ns);
        let leases = api
            .list(&kube::api::ListParams::default().labels(HEARTBEAT_GROUP_LABEL))
            .await
            .map_err(|e| {
                read_error(
                    cfg,
                    "the canaries' heartbeats",
                    &format!("leases in namespace {ns}"),
                    &e,
                )
            })?
            .items;
        let group = cfg.rollout.group_for(cfg.node.role);
        let canaries = canaries_of(cfg, &leases, &names, &group, fleet, revision, later).await;
        let now = Instant::now();
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
                self.watching = None;
                self.soak_left = None;
                Ok(None)
            }
            CanaryVerdict::Soak(why, left) => {
                self.soak_left = Some((now, left));
                Ok(Some(why))
            }
            CanaryVerdict::Wait(why) => {
                self.soak_left = None;
                let selector = format!("{HEARTBEAT_GROUP_LABEL}={group}");
                if self
                    .watching
                    .as_ref()
                    .is_none_or(|(g, c, _)| *g != group || *c != wake.0)
                {
                    let stop = watch_heartbeats(clients, ns, &selector, wake.1);
                    self.watching = Some((group, wake.0, stop));
                }
                Ok(Some(why))
            }
        }
    }
}

/// The canaries' names: `rollout.first` and the Nodes `rollout.first_selector` selects.
async fn names(cfg: &Config, clients: &KubeClients) -> Result<BTreeSet<String>, Verdict> {
    let mut names: BTreeSet<String> = cfg.rollout.first.iter().cloned().collect();
    if let Some(sel) = &cfg.rollout.first_selector {
        let api = kube::Api::<Node>::all(clients.main.clone());
        let nodes = api
            .list(&kube::api::ListParams::default().labels(sel))
            .await
            .map_err(|e| read_error(cfg, "the canaries (rollout.first_selector)", "nodes", &e))?;
        names.extend(nodes.items.into_iter().filter_map(|n| n.metadata.name));
    }
    Ok(names)
}

fn read_error(cfg: &Config, what: &str, object: &str, e: &kube::Error) -> Verdict {
    super::list_failed(cfg.rollout.on_api_unavailable, what, object, e)
}

/// The canaries of `group` among `names`, from the heartbeats: a name whose heartbeat is in
/// another group is that group's canary, not this one's; a name with no heartbeat at all is
/// kept (and waited for: a typo must not let the group go without its canary).
async fn canaries_of(
    cfg: &Config,
    leases: &[Lease],
    names: &BTreeSet<String>,
    group: &str,
    fleet: Option<&FleetState>,
    revision: &Revision,
    later: Option<&Later>,
) -> Vec<Canary> {
    let pattern = &cfg.kubernetes.lease_name;
    let freshness = crate::k8s::heartbeat::Freshness::of(leases);
    let now = crate::util::now();
    let mut out = Vec::new();
    for name in names {
        let lease = leases.iter().find(|l| {
            l.metadata.name.as_deref().is_some_and(|n| {
                crate::k8s::heartbeat::heartbeat_node(pattern, n, l) == Some(name.as_str())
            })
        });
        let held = fleet
            .and_then(|f| f.hold_of(name, now))
            .map(crate::rollout::fleet::holds::Hold::describe);
        let Some(l) = lease else {
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
        let label = |k: &str| l.metadata.labels.as_ref().and_then(|m| m.get(k)).cloned();
        if label(HEARTBEAT_GROUP_LABEL).as_deref() != Some(group) {
            continue;
        }
        let (passed, done) = super::after::passed(l, revision, later).await;
        let duration = l
            .spec
            .as_ref()
            .and_then(|s| s.lease_duration_seconds)
            .map_or(40, i64::from);
        let stale_secs = freshness.lag_secs(l).filter(|lag| *lag > duration);
        out.push(Canary {
            node: name.clone(),
            found: true,
            passed,
            done,
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
