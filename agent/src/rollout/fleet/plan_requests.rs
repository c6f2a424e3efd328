//! Plan requests in the fleet's ConfigMap (`ginx-rollout`): `plan.<id>` →
//! `{"ref":…,"by":…,"at":…}`, one key per request, written by `ginxctl plan REF` with an
//! operator's credentials and read by every node, which answers each once on its heartbeat.
//!
//! Nodes never write these keys (the admission policy refuses a node's write that adds,
//! changes or removes one), and the fleet state's own writes leave them as they are (they are
//! not among its keys). At most [`MAX_REQUESTS`] stand; a request for a ref that already
//! stands is answered from what the nodes published for it; a request over an hour old
//! (`REQUEST_LIFETIME_SECS`, by the asker's clock) is removed by the next `ginxctl plan`.

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;

use k8s_openapi::api::coordination::v1::Lease;

use super::operator::{Change, OperatorError, edit_data};
use crate::k8s::heartbeat::{HEARTBEAT_GROUP_LABEL, PREVIEWS_ANNOTATION};
use crate::types::preview::{
    MAX_REQUESTS, REQUEST_LIFETIME_SECS, check_groups, check_reference, decode_answers,
    valid_request_id,
};
use crate::types::{PlanRequest, PreviewAnswer};

/// The prefix of a request's key; its id follows.
pub const PLAN_PREFIX: &str = "plan.";

/// The requests in a ConfigMap's data; a key whose id or value cannot be read, or that names
/// a ref or a group `ginxctl plan` would refuse, is left out.
pub fn decode(data: &BTreeMap<String, String>) -> BTreeMap<String, PlanRequest> {
    data.iter()
        .filter_map(|(k, v)| {
            let id = k.strip_prefix(PLAN_PREFIX)?;
            let request: PlanRequest = serde_json::from_str(v).ok()?;
            let sound = valid_request_id(id)
                && check_reference(&request.reference).is_ok()
                && check_groups(&request.groups).is_ok();
            sound.then(|| (id.to_owned(), request))
        })
        .collect()
}

/// What asking for a plan of a ref does to the requests that stand.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Admission {
    /// A request for the same ref stands, younger than an hour: its answers serve.
    Reuse(String),
    /// Add this request; remove the ones over an hour old.
    Add { id: String, expired: Vec<String> },
    /// [`MAX_REQUESTS`] younger than an hour stand: say which, and when the oldest goes.
    Full(String),
}

/// Whether a request made at `at` is over an hour old at `now` (both the asker's clock).
fn expired(at: Timestamp, now: Timestamp) -> bool {
    now.duration_since(at).as_secs() >= REQUEST_LIFETIME_SECS
}

/// The decision for a request of `reference` at `now` (the asker's clock), given what stands;
/// `new_id` names it when it is added.
pub fn admit(
    standing: &BTreeMap<String, PlanRequest>,
    asked: &PlanRequest,
    now: Timestamp,
    new_id: &str,
) -> Admission {
    let (old, live): (Vec<_>, Vec<_>) = standing.iter().partition(|(_, r)| expired(r.at, now));
    let same = |r: &PlanRequest| r.reference == asked.reference && r.groups == asked.groups;
    if let Some((id, _)) = live.iter().find(|(_, r)| same(r)) {
        return Admission::Reuse((*id).clone());
    }
    if live.len() >= MAX_REQUESTS {
        let oldest = live.iter().map(|(_, r)| r.at).min().unwrap_or(now);
        let names: Vec<String> = live
            .iter()
            .map(|(id, r)| format!("{} ({id})", r.reference))
            .collect();
        return Admission::Full(format!(
            "{MAX_REQUESTS} plan requests stand ({}); the oldest is removed at {}, an hour after \
             it was made",
            names.join(", "),
            oldest + jiff::SignedDuration::from_secs(REQUEST_LIFETIME_SECS)
        ));
    }
    Admission::Add {
        id: new_id.to_owned(),
        expired: old.into_iter().map(|(id, _)| id.clone()).collect(),
    }
}

/// A fresh request id: 12 lowercase hex digits.
pub fn new_id() -> String {
    format!("{:012x}", fastrand::u64(..) & 0xffff_ffff_ffff)
}

/// Writes `request` in the ConfigMap `namespace/name` (created when missing), unless the same
/// stands; returns the request's id and whether it was already standing.
pub async fn ask(
    api: &Api<ConfigMap>,
    namespace: &str,
    name: &str,
    request: &PlanRequest,
) -> Result<(String, bool), OperatorError> {
    let now = request.at;
    let id = new_id();
    edit_data(
        api,
        namespace,
        name,
        "writing a plan request",
        |data| match admit(&decode(data), request, now, &id) {
            Admission::Reuse(id) => Ok(Change::Keep((id, true))),
            Admission::Full(why) => Err(why),
            Admission::Add { id, expired } => {
                for old in expired {
                    data.remove(&format!("{PLAN_PREFIX}{old}"));
                }
                data.insert(
                    format!("{PLAN_PREFIX}{id}"),
                    serde_json::to_string(request).unwrap_or_default(),
                );
                Ok(Change::Write((id, false)))
            }
        },
    )
    .await
}

/// The nodes whose heartbeat Leases are among `leases` (named by `pattern`,
/// `kubernetes.lease_name`), each with its answer to request `id`, if it gave one. A node whose
/// heartbeat was renewed more than `stale_secs` before the freshest one is left out: its ginx
/// is down and will not answer. (Renewal times are all written in the API server's time, so
/// they compare with each other.)
pub fn answers_of(
    leases: &[Lease],
    pattern: &str,
    request: (&str, &PlanRequest),
    stale_secs: i64,
) -> BTreeMap<String, Option<PreviewAnswer>> {
    let (id, asked) = request;
    let freshness = crate::k8s::heartbeat::Freshness::of(leases);
    leases
        .iter()
        .filter_map(|l| {
            let node =
                crate::k8s::heartbeat::heartbeat_node(pattern, l.metadata.name.as_deref()?, l)?;
            let alive = freshness.lag_secs(l).is_some_and(|lag| lag <= stale_secs);
            let group = l
                .metadata
                .labels
                .as_ref()
                .and_then(|m| m.get(HEARTBEAT_GROUP_LABEL));
            if !alive || !asked.asks(group.map_or("", String::as_str)) {
                return None;
            }
            let answer = l
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(PREVIEWS_ANNOTATION))
                .map(|text| decode_answers(text))
                .and_then(|all| all.into_iter().find(|a| a.id == id));
            Some((node.to_owned(), answer))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    fn request(reference: &str, s: i64) -> PlanRequest {
        PlanRequest {
            reference: reference.into(),
            by: "alice@desk".into(),
            at: at(s),
            groups: Vec::new(),
        }
    }

    #[test]
    fn only_good_keys_are_requests() {
        let data = BTreeMap::from([
            (
                "plan.a1".to_owned(),
                serde_json::to_string(&request("main", 0)).unwrap(),
            ),
            (
                "plan.BAD".to_owned(),
                serde_json::to_string(&request("x", 0)).unwrap(),
            ),
            ("plan.b2".to_owned(), "{".to_owned()),
            (
                "plan.c3".to_owned(),
                serde_json::to_string(&request("-x", 0)).unwrap(),
            ),
            (
                "plan.d4".to_owned(),
                serde_json::to_string(&PlanRequest {
                    groups: vec!["Not A Group".into()],
                    ..request("main", 0)
                })
                .unwrap(),
            ),
            ("paused".to_owned(), "{}".to_owned()),
        ]);
        let r = decode(&data);
        assert_eq!(r.keys().collect::<Vec<_>>(), ["a1"]);
        assert_eq!(r["a1"].reference, "main");
    }

    #[test]
    fn a_standing_ref_is_reused_old_ones_go_and_the_count_is_bounded() {
        let mut standing = BTreeMap::from([
            ("old".to_owned(), request("feature", 0)),
            ("live".to_owned(), request("kernel", 3000)),
        ]);
        let now = at(3700);
        assert_eq!(
            admit(&standing, &request("kernel", 3700), now, "new"),
            Admission::Reuse("live".into())
        );
        // The same ref for other groups is another request.
        let for_cp = PlanRequest {
            groups: vec!["cp".into()],
            ..request("kernel", 3700)
        };
        assert!(matches!(
            admit(&standing, &for_cp, now, "new"),
            Admission::Add { .. }
        ));
        // The same ref, but its request is over an hour old: asked again, the old one removed.
        assert_eq!(
            admit(&standing, &request("feature", 3700), now, "new"),
            Admission::Add {
                id: "new".into(),
                expired: vec!["old".into()]
            }
        );
        for i in 0..MAX_REQUESTS {
            standing.insert(format!("r{i}"), request(&format!("b{i}"), 3600));
        }
        match admit(&standing, &request("other", 3700), now, "new") {
            Admission::Full(why) => {
                assert!(why.starts_with("8 plan requests stand ("), "{why}");
                assert!(
                    why.contains("the oldest is removed at 2027-01-15T09:50:00Z"),
                    "{why}"
                );
            }
            other => panic!("{other:?}"),
        }
        assert!(new_id().len() == 12 && valid_request_id(&new_id()));
    }

    #[test]
    fn the_answers_of_live_heartbeats_are_found_by_request() {
        use k8s_openapi::api::coordination::v1::LeaseSpec;
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
        let lease = |node: &str, renewed: i64, answers: Option<&str>| Lease {
            metadata: ObjectMeta {
                name: Some(format!("ginx-{node}")),
                annotations: answers
                    .map(|a| BTreeMap::from([(PREVIEWS_ANNOTATION.to_owned(), a.to_owned())])),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(node.to_owned()),
                renew_time: Some(MicroTime(at(renewed))),
                ..LeaseSpec::default()
            }),
        };
        let answer = r#"[{"id":"r1","ref":"f","outcome":"refused","took_ms":1,"at":"2026-01-01T00:00:00Z"}]"#;
        // A rollout slot, held by a: not a heartbeat.
        let mut slot = lease("rollout-x", 100, None);
        slot.spec.as_mut().unwrap().holder_identity = Some("a".into());
        let leases = [
            lease("a", 100, Some(answer)),
            lease("b", 90, None),
            lease("c", 0, Some(answer)),
            slot,
        ];
        let all = request("f", 0);
        let found = answers_of(&leases, "ginx-{node}", ("r1", &all), 30);
        assert_eq!(
            found.keys().collect::<Vec<_>>(),
            ["a", "b"],
            "c is down: {found:?}"
        );
        assert_eq!(found["a"].as_ref().unwrap().reference, "f");
        assert!(found["b"].is_none());
        assert!(answers_of(&leases, "ginx-{node}", ("r2", &all), 30)["a"].is_none());
        // Asked of group g only: a is in it, b is not.
        let mut leases = leases;
        leases[0].metadata.labels = Some(BTreeMap::from([(
            HEARTBEAT_GROUP_LABEL.to_owned(),
            "g".to_owned(),
        )]));
        let of_g = PlanRequest {
            groups: vec!["g".into()],
            ..all
        };
        let found = answers_of(&leases, "ginx-{node}", ("r1", &of_g), 30);
        assert_eq!(found.keys().collect::<Vec<_>>(), ["a"]);
    }
}
