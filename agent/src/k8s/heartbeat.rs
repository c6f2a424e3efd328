//! The heartbeat Lease `ginx-<node>`, its one owner: what it says and how it is written.
//!
//! It says that the node's ginx is alive (`renewTime`, renewed as the kubelet's node lease
//! controller renews the node's Lease), the node's rollout group and the last revision whose
//! gate passed on it ([`HEARTBEAT_GROUP_LABEL`], [`HEARTBEAT_PASSED_ANNOTATION`]: how `rollout.after` of another
//! group finds it), the plan of the revision it waits for ([`PLAN_ANNOTATION`]: how
//! `ginxctl cluster` tells what a revision will disrupt), its answers to plan requests
//! ([`PREVIEWS_ANNOTATION`]: how `ginxctl plan REF` learns the fleet's plan of a ref), and, while the node queues for a slot of a large group, which slot
//! ([`WAITS_GROUP_LABEL`], [`WAITS_SLOT_LABEL`]: how a releasing holder finds it). The reporter
//! renews it ([`Heartbeat`]); the rollout lock sets and clears the queue marks
//! ([`queue_mark`]). Every write is a compare-and-swap through
//! [`replace_with_retry`](super::replace_with_retry), so the two never overwrite each other.

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Api;

use super::{ApiError, Edit, EditError, ServerClock, replace_with_retry};

/// The label naming a node's rollout group on its heartbeat Lease `ginx-<node>`: how
/// `rollout.after` of another group finds every node of this one.
pub const HEARTBEAT_GROUP_LABEL: &str = "ginx.io/group";
/// On the heartbeat Lease: the last revision whose health gate passed on the node (full
/// commit id).
pub const HEARTBEAT_PASSED_ANNOTATION: &str = "ginx.io/passed-revision";

/// On the heartbeat Lease: the plan of the revision the node waits for or is about to apply
/// ([`PlanMark`](crate::types::PlanMark) as compact JSON); absent when none is computed.
pub const PLAN_ANNOTATION: &str = "ginx.io/plan";

/// On the heartbeat Lease: the node's answers to the plan requests that stand (`ginxctl plan
/// REF`; a list of [`PreviewAnswer`](crate::types::PreviewAnswer) as compact JSON); absent
/// when there are none.
pub const PREVIEWS_ANNOTATION: &str = "ginx.io/previews";

/// On a heartbeat Lease, while its node queues for a slot: the group.
pub const WAITS_GROUP_LABEL: &str = "ginx.io/waits-group";
/// On a heartbeat Lease, while its node queues for a slot: the slot Lease's name.
pub const WAITS_SLOT_LABEL: &str = "ginx.io/waits-slot";

pub struct Heartbeat {
    api: Api<Lease>,
    name: String,
    holder: String,
    duration_seconds: i32,
    /// The Lease as last written; its resourceVersion makes the next PUT conditional.
    cached: Option<Lease>,
    /// The API server's clock, learned from each write and written in.
    clock: ServerClock,
    /// What the Lease says of the node's rollout.
    marks: Marks,
}

/// What a heartbeat Lease says of its node's rollout, besides that it is alive.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Marks {
    /// The rollout group ([`HEARTBEAT_GROUP_LABEL`]); empty: none written.
    pub group: String,
    /// The last revision whose gate passed on the node ([`HEARTBEAT_PASSED_ANNOTATION`]).
    pub passed: Option<String>,
    /// The next revision's plan, encoded ([`PLAN_ANNOTATION`]).
    pub plan: Option<String>,
    /// The answers to plan requests, encoded ([`PREVIEWS_ANNOTATION`]).
    pub previews: Option<String>,
}

/// Why a renewal failed.
pub type RenewError = ApiError;

impl Heartbeat {
    pub fn new(
        api: Api<Lease>,
        name: String,
        holder: String,
        duration_seconds: i32,
        clock: ServerClock,
    ) -> Self {
        Self {
            api,
            name,
            holder,
            duration_seconds,
            cached: None,
            clock,
            marks: Marks::default(),
        }
    }

    /// Sets what the Lease says of the node's rollout (written with the next renewal); returns
    /// whether it changed.
    pub fn set_marks(&mut self, marks: Marks) -> bool {
        let changed = marks != self.marks;
        self.marks = marks;
        changed
    }

    /// Writes `renewTime = now` (creating the Lease when it is missing); one PUT per call in
    /// the steady state, from the Lease as last written.
    pub async fn renew(&mut self) -> Result<(), RenewError> {
        let resource = format!("Lease {}", self.name);
        let cached = self.cached.take();
        let written = replace_with_retry(&self.api, &self.name, &resource, cached, |lease| {
            Ok::<_, ApiError>(Edit::Write(self.renewed(lease), ()))
        })
        .await
        .map_err(|e| match e {
            EditError::Api(e) | EditError::Edit(e) => e,
        })?;
        if let Some((lease, sent, received)) = written.object {
            self.clock.learn(&lease.metadata, sent, received);
            self.cached = Some(lease);
        }
        Ok(())
    }

    /// `lease` (or a new one) held by this node and renewed now, with its marks.
    fn renewed(&self, lease: Option<Lease>) -> Lease {
        let now = MicroTime(self.clock.now());
        let mut lease = lease.unwrap_or_else(|| Lease {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                ..ObjectMeta::default()
            },
            spec: None,
        });
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if spec.holder_identity.as_deref() != Some(self.holder.as_str()) {
            spec.acquire_time = Some(now.clone());
        }
        spec.holder_identity = Some(self.holder.clone());
        spec.lease_duration_seconds = Some(self.duration_seconds);
        spec.renew_time = Some(now);
        mark(&mut lease.metadata, &self.marks);
        lease
    }

    /// Forget the cached object (after the API went away, it may be stale).
    pub fn forget(&mut self) {
        self.cached = None;
    }
}

/// Writes the node's rollout marks on the Lease's metadata.
fn mark(meta: &mut ObjectMeta, marks: &Marks) {
    if !marks.group.is_empty() {
        meta.labels
            .get_or_insert_with(Default::default)
            .insert(HEARTBEAT_GROUP_LABEL.to_owned(), marks.group.clone());
    }
    let a = meta.annotations.get_or_insert_with(Default::default);
    for (key, value) in [
        (HEARTBEAT_PASSED_ANNOTATION, &marks.passed),
        (PLAN_ANNOTATION, &marks.plan),
        (PREVIEWS_ANNOTATION, &marks.previews),
    ] {
        match value {
            Some(v) => {
                a.insert(key.to_owned(), v.clone());
            }
            None => {
                a.remove(key);
            }
        }
    }
}

/// Sets the queue marks of `meta`: `Some((group, slot))` while queued, `None` after; whether
/// that changed anything.
fn set_queue(meta: &mut ObjectMeta, queued: Option<(&str, &str)>) -> bool {
    let labels = meta.labels.get_or_insert_with(Default::default);
    let before = labels.clone();
    match queued {
        Some((group, slot)) => {
            labels.insert(WAITS_GROUP_LABEL.to_owned(), group.to_owned());
            labels.insert(WAITS_SLOT_LABEL.to_owned(), slot.to_owned());
        }
        None => {
            labels.remove(WAITS_GROUP_LABEL);
            labels.remove(WAITS_SLOT_LABEL);
        }
    }
    *labels != before
}

/// Says on the heartbeat Lease `name` that its node queues for `slot` of `group` (`Some`), or no
/// longer queues (`None`). Nothing is written when it already says so, or when the Lease does
/// not exist yet (the reporter creates it). `resource` names what is written in messages.
pub async fn queue_mark(
    api: &Api<Lease>,
    name: &str,
    resource: &str,
    queued: Option<(&str, &str)>,
) -> Result<(), ApiError> {
    replace_with_retry(api, name, resource, None, |lease| {
        Ok::<_, ApiError>(match lease {
            Some(mut lease) => {
                if set_queue(&mut lease.metadata, queued) {
                    Edit::Write(lease, ())
                } else {
                    Edit::Keep(())
                }
            }
            None => Edit::Keep(()),
        })
    })
    .await
    .map(|_| ())
    .map_err(|e| match e {
        EditError::Api(e) | EditError::Edit(e) => e,
    })
}

/// The node whose heartbeat Lease `name` is, by `pattern` (`kubernetes.lease_name`, with
/// `{node}`): the name fits the pattern and the holder is that node, as ginx writes it.
pub fn heartbeat_node<'a>(pattern: &str, name: &'a str, lease: &Lease) -> Option<&'a str> {
    node_of(
        pattern,
        name,
        lease.spec.as_ref()?.holder_identity.as_deref(),
    )
}

/// [`heartbeat_node`] from the Lease's name and holder alone.
pub fn node_of<'a>(pattern: &str, name: &'a str, holder: Option<&str>) -> Option<&'a str> {
    let (before, after) = pattern.split_once("{node}")?;
    let node = name.strip_prefix(before)?.strip_suffix(after)?;
    (!node.is_empty() && holder == Some(node)).then_some(node)
}

/// How far each heartbeat trails the freshest of a set, in whole seconds. Renewal times are all
/// written in the API server's time, so they compare with each other; never with this
/// machine's clock.
pub struct Freshness {
    freshest: Option<jiff::Timestamp>,
}

impl Freshness {
    pub fn of(leases: &[Lease]) -> Self {
        Self::of_times(leases.iter().map(renewed))
    }

    /// The same from the renewal times alone.
    pub fn of_times(renewals: impl Iterator<Item = Option<jiff::Timestamp>>) -> Self {
        Self {
            freshest: renewals.flatten().max(),
        }
    }

    /// Seconds `lease` was renewed before the freshest; `None` when either was never renewed.
    pub fn lag_secs(&self, lease: &Lease) -> Option<i64> {
        self.lag_of(renewed(lease))
    }

    /// Seconds a heartbeat renewed at `renewed` trails the freshest.
    pub fn lag_of(&self, renewed: Option<jiff::Timestamp>) -> Option<i64> {
        Some(self.freshest?.duration_since(renewed?).as_secs())
    }
}

fn renewed(l: &Lease) -> Option<jiff::Timestamp> {
    l.spec.as_ref()?.renew_time.as_ref().map(|t| t.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_marks_are_set_and_cleared_and_only_a_change_is_written() {
        let mut meta = ObjectMeta::default();
        assert!(set_queue(
            &mut meta,
            Some(("workers", "ginx-rollout-workers-3"))
        ));
        let labels = meta.labels.clone().unwrap_or_default();
        assert_eq!(labels[WAITS_SLOT_LABEL], "ginx-rollout-workers-3");
        assert!(!set_queue(
            &mut meta,
            Some(("workers", "ginx-rollout-workers-3"))
        ));
        assert!(set_queue(&mut meta, None));
        assert!(meta.labels.unwrap_or_default().is_empty());
    }

    #[test]
    fn the_marks_say_the_group_the_revision_passed_and_the_plan_or_nothing() {
        let mut meta = ObjectMeta::default();
        let marks = Marks {
            group: "workers".into(),
            passed: Some("abc".into()),
            plan: Some("{}".into()),
            previews: Some("[]".into()),
        };
        mark(&mut meta, &marks);
        assert_eq!(
            meta.labels.as_ref().unwrap()[HEARTBEAT_GROUP_LABEL],
            "workers"
        );
        let a = meta.annotations.clone().unwrap();
        assert_eq!(a[HEARTBEAT_PASSED_ANNOTATION], "abc");
        assert_eq!(a[PLAN_ANNOTATION], "{}");
        assert_eq!(a[PREVIEWS_ANNOTATION], "[]");
        mark(
            &mut meta,
            &Marks {
                group: "workers".into(),
                ..Marks::default()
            },
        );
        let a = meta.annotations.unwrap();
        assert!(!a.contains_key(HEARTBEAT_PASSED_ANNOTATION));
        assert!(!a.contains_key(PLAN_ANNOTATION));
        assert!(!a.contains_key(PREVIEWS_ANNOTATION));
    }
}
