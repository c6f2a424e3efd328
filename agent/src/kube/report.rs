//! What ginx writes on its Node: annotations under `ginx.io/` and the `GinxHealthy` condition.
//!
//! Annotations are merge-patched key by key — only those that changed, never anyone else's —
//! and compared with the Node every resync. The condition goes to the status subresource with a
//! strategic-merge patch (merged by `type`, so the kubelet's conditions stay), its
//! `lastTransitionTime` moving only when its status changes and `lastHeartbeatTime` refreshed on
//! a change or a resync, as node-problem-detector does.

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Node, NodeCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Api;
use kube::api::Patch;

use crate::status::{self, HealthStatus, Status};

/// The annotations that describe `status`, keyed with `prefix` (e.g. `ginx.io/`).
pub fn annotations(status: &Status, prefix: &str) -> BTreeMap<String, String> {
    let mut a = BTreeMap::new();
    let mut put = |k: &str, v: String| {
        a.insert(format!("{prefix}{k}"), v);
    };
    put("version", status.version.clone());
    // `ginxctl cluster` tells workers from control-plane nodes that carry no kubeadm label.
    put("role", status.role.to_string());
    put("apply-state", status.apply.state.as_str().to_owned());
    if let Some(r) = &status.apply.applied_revision {
        put("applied-revision", r.to_string());
    }
    if let Some(t) = status.apply.applied_at {
        put("last-apply", t.to_string());
    }
    put("reboot-required", status.system.reboot_required.to_string());
    put("suspended", status.suspended.to_string());
    put("rollout-phase", status.rollout.phase.as_str().to_owned());
    put("rollout-group", status.rollout.group.clone());
    if let Some(r) = &status.rollout.target_revision {
        put("target-revision", r.to_string());
    }
    if let Some(r) = &status.rollout.passed_revision {
        put("passed-revision", r.to_string());
    }
    if let Some(q) = &status.rollout.quarantined {
        put("quarantined", q.revision.to_string());
    }
    if let Some(g) = &status.rollout.gate {
        // Times and names only: it changes when the gate does, not with every probe message.
        put(
            "gate",
            serde_json::to_string(&g.without_messages()).unwrap_or_default(),
        );
    }
    if let Some(what) = waiting_for(&status.rollout) {
        put("waiting-for", what);
    }
    put(
        "health",
        status::overall(&status.health).status.as_str().to_owned(),
    );
    for (name, s) in &status.sources {
        if let Some(r) = &s.revision {
            put(&format!("revision-{name}"), r.to_string());
        }
    }
    a
}

/// `ginx.io/waiting-for`: what the node waits for, with what `ginxctl cluster` should show
/// beside it (the groups it comes after, when a freeze ends).
fn waiting_for(r: &status::RolloutStatus) -> Option<String> {
    Some(match r.waiting()? {
        status::WaitingFor::After => format!("after {}", r.after.join(",")),
        status::WaitingFor::Freeze => match &r.freeze {
            Some(f) if f.active => format!("freeze until {}", f.ends_at),
            _ => "freeze".to_owned(),
        },
        other => other.as_str().to_owned(),
    })
}

/// A merge patch turning `current` (ginx's keys as they are) into `desired`; `None` when they
/// agree. Keys of ours that are no longer wanted are removed (`null`).
pub fn annotation_patch(
    current: &BTreeMap<String, String>,
    desired: &BTreeMap<String, String>,
) -> Option<serde_json::Value> {
    let mut changes = serde_json::Map::new();
    for (k, v) in desired {
        if current.get(k) != Some(v) {
            changes.insert(k.clone(), serde_json::Value::String(v.clone()));
        }
    }
    for k in current.keys() {
        if !desired.contains_key(k) {
            changes.insert(k.clone(), serde_json::Value::Null);
        }
    }
    (!changes.is_empty()).then(|| serde_json::json!({ "metadata": { "annotations": changes } }))
}

/// `(status, reason, message)` of the condition for the node: the probes' results, unless the
/// rolled-back system failed its health gate too (`RollbackUnhealthy`, whatever the probes say
/// now: the node holds its rollout slot until someone looks).
pub fn node_condition(status: &Status) -> (String, String, String) {
    if status.rollout.phase == status::Phase::RollbackUnhealthy {
        let revision = status
            .rollout
            .target_revision
            .as_ref()
            .map_or("-", |r| r.short());
        return (
            "False".to_owned(),
            "RollbackUnhealthy".to_owned(),
            format!(
                "revision {revision} failed its health gate and the rolled-back system is \
                 unhealthy too; the node keeps its rollout slot so that no other node proceeds"
            ),
        );
    }
    let (s, reason, message) = condition(&status.health);
    if let Some(q) = &status.rollout.quarantined {
        return (
            s,
            "Quarantined".to_owned(),
            format!(
                "revision {} failed its health gate here below the failure budget; the node \
                 runs its rolled-back system and the rollout goes on without it; {message}",
                q.revision.short()
            ),
        );
    }
    if status.rollout.phase == status::Phase::Lost {
        return (
            s,
            "RolloutSlotLost".to_owned(),
            format!(
                "the rollout slot {} was lost (taken by another node, or not renewed in time): \
                 nothing new starts until a slot is taken again; {message}",
                status.rollout.lease.as_deref().unwrap_or("-")
            ),
        );
    }
    let r = &status.rollout.reboot;
    match status.rollout.phase {
        status::Phase::Draining | status::Phase::Rebooting => {
            let what = if status.rollout.phase == status::Phase::Draining {
                "Draining"
            } else {
                "Rebooting"
            };
            let why = r
                .reason
                .clone()
                .unwrap_or_else(|| status.system.reboot_reasons.join("; "));
            (
                s,
                what.to_owned(),
                format!(
                    "ginx is rebooting the node ({}): {why}; {message}",
                    what.to_lowercase()
                ),
            )
        }
        _ if r.phase.as_deref() == Some("verifying") => (
            s,
            "VerifyingReboot".to_owned(),
            format!("health gate after the reboot; {message}"),
        ),
        _ => (s, reason, message),
    }
}

/// `(status, reason, message)` of the condition for the probes' results.
pub fn condition(health_map: &status::HealthMap) -> (String, String, String) {
    let o = status::overall(health_map);
    let list = |filter: HealthStatus| {
        o.failing
            .iter()
            .filter(|(_, p)| p.status == filter)
            .map(|(n, p)| format!("{n} ({})", p.message))
            .collect::<Vec<_>>()
            .join("; ")
    };
    let (status, reason, mut message) = match o.status {
        HealthStatus::Ok => (
            "True",
            "AllProbesOk",
            format!(
                "all probes ok: {}",
                health_map.keys().cloned().collect::<Vec<_>>().join(", ")
            ),
        ),
        HealthStatus::Degraded => (
            "True",
            "ProbesDegraded",
            format!("degraded: {}", list(HealthStatus::Degraded)),
        ),
        HealthStatus::Failed => {
            let mut m = format!("failed: {}", list(HealthStatus::Failed));
            let degraded = list(HealthStatus::Degraded);
            if !degraded.is_empty() {
                m.push_str(&format!("; degraded: {degraded}"));
            }
            ("False", "ProbesFailed", m)
        }
        HealthStatus::Unknown if health_map.is_empty() => (
            "Unknown",
            "NoProbes",
            "no health probes have run yet".to_owned(),
        ),
        HealthStatus::Unknown => (
            "Unknown",
            "ProbesUnknown",
            format!("unknown: {}", list(HealthStatus::Unknown)),
        ),
    };
    if message.len() > 1024 {
        let mut cut = 1021;
        while !message.is_char_boundary(cut) {
            cut -= 1;
        }
        message.truncate(cut);
        message.push_str("...");
    }
    (status.to_owned(), reason.to_owned(), message)
}

/// The condition as it stands on the node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Written {
    pub status: String,
    pub reason: String,
    pub message: String,
    pub transition: Timestamp,
}

/// Reads and writes ginx's part of one Node.
pub struct NodeReport {
    api: Api<Node>,
    node: String,
    prefix: String,
    condition_type: String,
}

impl NodeReport {
    pub fn new(api: Api<Node>, node: String, prefix: String, condition_type: String) -> Self {
        Self {
            api,
            node,
            prefix,
            condition_type,
        }
    }

    /// ginx's annotations and condition as the Node has them now; `None` if there is no such
    /// Node (the kubelet has not registered it).
    pub async fn read(
        &self,
    ) -> Result<Option<(BTreeMap<String, String>, Option<Written>)>, kube::Error> {
        let Some(node) = self.api.get_opt(&self.node).await? else {
            return Ok(None);
        };
        let ours = node
            .metadata
            .annotations
            .unwrap_or_default()
            .into_iter()
            // The cordon mark belongs to the reboot, not to the report.
            .filter(|(k, _)| k.starts_with(&self.prefix) && k != crate::k8s::CORDONED_BY)
            .collect();
        let written = node
            .status
            .and_then(|s| s.conditions)
            .and_then(|cs| cs.into_iter().find(|c| c.type_ == self.condition_type))
            .map(|c| Written {
                status: c.status,
                reason: c.reason.unwrap_or_default(),
                message: c.message.unwrap_or_default(),
                transition: c
                    .last_transition_time
                    .map_or(Timestamp::UNIX_EPOCH, |t| t.0),
            });
        Ok(Some((ours, written)))
    }

    /// Merge-patches only the annotations that differ.
    pub async fn patch_annotations(&self, patch: &serde_json::Value) -> Result<(), kube::Error> {
        self.api
            .patch(
                &self.node,
                &crate::k8s::patch_params(),
                &Patch::Merge(patch),
            )
            .await
            .map(|_| ())
    }

    /// Writes the condition; returns what was written.
    pub async fn write_condition(
        &self,
        (status, reason, message): (String, String, String),
        previous: Option<&Written>,
        now: Timestamp,
    ) -> Result<Written, kube::Error> {
        let transition = match previous {
            Some(p) if p.status == status => p.transition,
            _ => now,
        };
        let condition = NodeCondition {
            type_: self.condition_type.clone(),
            status: status.clone(),
            reason: Some(reason.clone()),
            message: Some(message.clone()),
            last_heartbeat_time: Some(Time(now)),
            last_transition_time: Some(Time(transition)),
        };
        let patch = serde_json::json!({ "status": { "conditions": [condition] } });
        self.api
            .patch_status(
                &self.node,
                &crate::k8s::patch_params(),
                &Patch::Strategic(&patch),
            )
            .await?;
        Ok(Written {
            status,
            reason,
            message,
            transition,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::{HealthMap, ProbeStatus};

    fn map(entries: &[(&str, HealthStatus, &str)]) -> HealthMap {
        entries
            .iter()
            .map(|(n, s, m)| {
                (
                    (*n).to_owned(),
                    ProbeStatus {
                        status: *s,
                        message: (*m).to_owned(),
                        since: None,
                        checked_at: None,
                        checked: None,
                    },
                )
            })
            .collect()
    }

    #[test]
    fn the_waiting_for_annotation_names_the_wait_and_a_freeze_s_end() {
        let mut st = status::RolloutStatus::default();
        assert_eq!(waiting_for(&st), None);
        st.waiting_for = Some(status::WaitingFor::Held);
        assert_eq!(waiting_for(&st).as_deref(), Some("held"));
        st.waiting_for = Some(status::WaitingFor::Freeze);
        st.freeze = Some(status::FreezeStatus {
            active: true,
            reason: "year-end".into(),
            starts_at: "2026-12-19T23:00:00Z".parse().unwrap(),
            ends_at: "2027-01-03T23:00:00Z".parse().unwrap(),
        });
        assert_eq!(
            waiting_for(&st).as_deref(),
            Some("freeze until 2027-01-03T23:00:00Z")
        );
    }

    #[test]
    fn only_changed_keys_are_patched_and_stale_ones_removed() {
        let cur: BTreeMap<String, String> = [
            ("ginx.io/a", "1"),
            ("ginx.io/b", "2"),
            ("ginx.io/gone", "x"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let mut want = cur.clone();
        want.remove("ginx.io/gone");
        want.insert("ginx.io/b".into(), "3".into());
        let p = annotation_patch(&cur, &want).unwrap();
        assert_eq!(
            p,
            serde_json::json!({"metadata": {"annotations": {"ginx.io/b": "3", "ginx.io/gone": null}}})
        );
        assert!(annotation_patch(&want, &want).is_none());
    }

    #[test]
    fn condition_names_the_failing_probes() {
        let (s, r, m) = condition(&map(&[
            ("kubelet", HealthStatus::Ok, "healthz ok"),
            ("cilium", HealthStatus::Failed, "agent unreachable"),
            ("apiserver", HealthStatus::Degraded, "VIP: no answer"),
        ]));
        assert_eq!((s.as_str(), r.as_str()), ("False", "ProbesFailed"));
        assert_eq!(
            m,
            "failed: cilium (agent unreachable); degraded: apiserver (VIP: no answer)"
        );
        let (s, r, _) = condition(&map(&[("kubelet", HealthStatus::Ok, "")]));
        assert_eq!((s.as_str(), r.as_str()), ("True", "AllProbesOk"));
        let (s, r, _) = condition(&map(&[("kubelet", HealthStatus::Unknown, "?")]));
        assert_eq!((s.as_str(), r.as_str()), ("Unknown", "ProbesUnknown"));
        let (_, _, long) = condition(&map(&[("x", HealthStatus::Failed, &"é".repeat(2000))]));
        assert!(long.len() <= 1024);
    }
}
