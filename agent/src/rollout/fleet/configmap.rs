//! The cluster-wide rollout state in the ConfigMap `ginx-rollout` (`rollout.configmap`, in
//! `kubernetes.namespace`): the fleet pause, the halted revisions and the latest changes, as a
//! [`FleetState`].
//!
//! The layout is meant to be read with `kubectl get configmap ginx-rollout -o yaml`, one key per
//! fact, each value JSON:
//!
//! ```text
//! paused:                   {"by":"alice@lucy","at":"2026-12-01T11:46:29Z"}   (absent: not paused)
//! halted.<full revision>:   {"revision":…,"node":…,"probes":{…},"reason":…,"at":…}
//! events:                   [{"by":…,"at":…,"action":"pause"}, …]   (the newest 50)
//! failed.<revision>.<node>: {"at":…,"reason":…,"cause":"gate-failed"}   (the failure budget)
//! held.<node>:              {"by":…,"at":…,"reason":…,"until":…}   (ginxctl hold; holds.rs)
//! ```
//!
//! A revision's failures (`failed.<revision>.*`, one key per node, so that a node adds its own
//! without touching another's) count against `rollout.halt_after`: below it the failing node is
//! quarantined and the rollout goes on; the failure that reaches it halts the revision.
//!
//! Other keys are left as they are. Writes are read-modify-write with optimistic concurrency
//! on `resourceVersion`: a 409 means someone else wrote in between, so the object is read again
//! and the change applied to what is there now, a bounded number of times (as the heartbeat
//! does). Owns the encoding and these writes; the types themselves are in `state.rs`;
//! what a halt or a pause means for applying is the gate's business.

use std::collections::BTreeMap;

use jiff::Timestamp;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;

use super::events::{self, EVENTS_KEY, FleetEvent, MAX_EVENTS};
use super::holds;
use super::state::{FailureRecord, FleetState, Halt, Pause};
use crate::k8s::{ApiError, Edit, EditError, MAX_CONFLICT_RETRIES, replace_with_retry};
use crate::rollout::lock::lease::LockError;
use crate::types::{HaltCause, Revision};

/// The key of the fleet pause.
pub const PAUSED_KEY: &str = "paused";
/// The prefix of a halt's key; the full revision follows.
pub const HALTED_PREFIX: &str = "halted.";
/// The prefix of a failure's key; `<full revision>.<node>` follows.
pub const FAILED_PREFIX: &str = "failed.";
/// The shortest revision prefix `ginxctl rollout clear` accepts (as `git` abbreviates).
pub const MIN_PREFIX: usize = 7;

/// The ConfigMap's `data` for `state`: only ginx's keys, events cut to the newest
/// [`MAX_EVENTS`]. Never the holds: operators write those, and a node's write keeps them as
/// they are, byte for byte.
pub fn encode(state: &FleetState) -> BTreeMap<String, String> {
    let mut data = BTreeMap::new();
    if let Some(p) = &state.paused {
        data.insert(PAUSED_KEY.to_owned(), json(p));
    }
    for (revision, halt) in &state.halted {
        data.insert(format!("{HALTED_PREFIX}{revision}"), json(halt));
    }
    for (revision, nodes) in &state.failures {
        for (node, f) in nodes {
            data.insert(format!("{FAILED_PREFIX}{revision}.{node}"), json(f));
        }
    }
    let skip = state.events.len().saturating_sub(MAX_EVENTS);
    let events: Vec<&FleetEvent> = state.events.iter().skip(skip).collect();
    if !events.is_empty() {
        data.insert(EVENTS_KEY.to_owned(), json(&events));
    }
    data
}

/// The JSON of a value: the status types are plain structs with string keys, which always
/// encode.
fn json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

/// The state in `data`. A value that cannot be read is an error naming its key and what is
/// wrong with it; keys that are not ginx's are ignored. An unreadable hold is not: a node never
/// writes holds back, so it cannot spoil a node's write (it still holds, see `holds.rs`).
pub fn decode(data: &BTreeMap<String, String>) -> Result<FleetState, Unreadable> {
    let (mut state, problems) = decode_own(data);
    state.holds = holds::decode(data).0;
    if problems.is_empty() {
        Ok(state)
    } else {
        Err(Unreadable(problems))
    }
}

/// The values of the fleet state's own keys that cannot be read, each naming its key and what
/// is wrong with it. A person must fix them: they are never overwritten.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}", .0.join("; "))]
pub struct Unreadable(pub Vec<String>);

/// The state in `data`, reading past bad values, and what was wrong with them. Errs on the side
/// of holding back: a `halted.<revision>` key whose value cannot be read still halts that
/// revision, and a `paused` key whose value cannot be read still pauses the fleet.
pub fn decode_lenient(data: &BTreeMap<String, String>) -> (FleetState, Vec<String>) {
    let (mut state, mut problems) = decode_own(data);
    let (held, unreadable) = holds::decode(data);
    state.holds = held;
    problems.extend(unreadable);
    (state, problems)
}

/// The fleet state's own keys in `data` (not the holds), read the cautious way.
fn decode_own(data: &BTreeMap<String, String>) -> (FleetState, Vec<String>) {
    let mut state = FleetState::default();
    let mut problems = Vec::new();
    for (key, value) in data {
        if key == PAUSED_KEY {
            match serde_json::from_str::<Pause>(value) {
                Ok(p) => state.paused = Some(p),
                Err(e) => {
                    problems.push(format!(
                        "key {key}: not a pause {{\"by\": \"user@node\", \"at\": \"<RFC 3339>\"}}: {e}"
                    ));
                    state.paused = Some(Pause {
                        by: format!("? (unreadable {key} key)"),
                        at: Timestamp::UNIX_EPOCH,
                    });
                }
            }
        } else if key == EVENTS_KEY {
            match serde_json::from_str::<Vec<FleetEvent>>(value) {
                Ok(events) => state.events = events,
                Err(e) => problems.push(format!(
                    "key {key}: not a JSON array of {{\"by\", \"at\", \"action\"}}: {e}"
                )),
            }
        } else if let Some(rest) = key.strip_prefix(FAILED_PREFIX) {
            let Some((revision, node)) = rest.split_once('.') else {
                problems.push(format!("key {key}: not {FAILED_PREFIX}<revision>.<node>"));
                continue;
            };
            let revision: Revision = match revision.parse() {
                Ok(r) => r,
                Err(e) => {
                    problems.push(format!("key {key}: {e} after \"{FAILED_PREFIX}\""));
                    continue;
                }
            };
            // An unreadable record still counts: the budget errs on the side of halting.
            let record = serde_json::from_str::<FailureRecord>(value).unwrap_or_else(|e| {
                problems.push(format!(
                    "key {key}: not a failure {{\"at\", \"reason\", \"cause\"}}: {e}"
                ));
                FailureRecord {
                    at: Timestamp::UNIX_EPOCH,
                    reason: format!("the {key} key cannot be read; see the ConfigMap"),
                    cause: HaltCause::GateFailed,
                }
            });
            state
                .failures
                .entry(revision.to_string())
                .or_default()
                .insert(node.to_owned(), record);
        } else if let Some(rest) = key.strip_prefix(HALTED_PREFIX) {
            let revision: Revision = match rest.parse() {
                Ok(r) => r,
                Err(e) => {
                    problems.push(format!("key {key}: {e} after \"{HALTED_PREFIX}\""));
                    continue;
                }
            };
            let halt = match serde_json::from_str::<Halt>(value) {
                Ok(h) if h.revision == revision => h,
                Ok(h) => {
                    problems.push(format!(
                        "key {key}: the halt inside is of another revision, {}",
                        h.revision
                    ));
                    unreadable(revision.clone(), key)
                }
                Err(e) => {
                    problems.push(format!(
                        "key {key}: not a halt {{\"revision\", \"node\", \"probes\", \"reason\", \"at\"}}: {e}"
                    ));
                    unreadable(revision.clone(), key)
                }
            };
            state.halted.insert(revision.to_string(), halt);
        }
    }
    (state, problems)
}

fn unreadable(revision: Revision, key: &str) -> Halt {
    Halt {
        revision,
        node: "?".to_owned(),
        probes: BTreeMap::new(),
        reason: format!("the {key} key cannot be read; see the ConfigMap"),
        at: Timestamp::UNIX_EPOCH,
        cause: HaltCause::GateFailed,
        group: None,
    }
}

/// `data` with ginx's keys replaced by `ours` and everyone else's kept.
fn merge(
    existing: Option<&BTreeMap<String, String>>,
    ours: BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut data: BTreeMap<String, String> = existing
        .into_iter()
        .flatten()
        .filter(|(k, _)| !is_ours(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    data.extend(ours);
    data
}

fn is_ours(key: &str) -> bool {
    key == PAUSED_KEY
        || key == EVENTS_KEY
        || key.starts_with(HALTED_PREFIX)
        || key.starts_with(FAILED_PREFIX)
}

/// Why `ginxctl rollout clear REVISION` names no halt.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RevisionError {
    #[error(
        "{0:?} is not a revision: give the full commit id or at least {MIN_PREFIX} of its hex digits"
    )]
    Malformed(String),
    #[error("{revision} is not halted{}", halted_list(.halted))]
    NotHalted {
        revision: String,
        halted: Vec<String>,
    },
    #[error("{prefix} names more than one halted revision ({}); give more digits", .matches.join(", "))]
    Ambiguous {
        prefix: String,
        matches: Vec<String>,
    },
}

fn halted_list(halted: &[String]) -> String {
    if halted.is_empty() {
        " (no revision is halted)".to_owned()
    } else {
        format!("; halted: {}", halted.join(", "))
    }
}

/// The full revision of the halt that `given` names: a full commit id, or a prefix of at least
/// [`MIN_PREFIX`] hex digits that only one halted revision starts with.
pub fn resolve(state: &FleetState, given: &str) -> Result<String, RevisionError> {
    let wanted = given.trim().to_ascii_lowercase();
    if wanted.len() < MIN_PREFIX || !wanted.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(RevisionError::Malformed(given.to_owned()));
    }
    let matches: Vec<&String> = state
        .halted
        .keys()
        .filter(|r| r.starts_with(&wanted))
        .collect();
    match matches.as_slice() {
        [one] => Ok((*one).clone()),
        [] => Err(RevisionError::NotHalted {
            revision: wanted,
            halted: state.halted.keys().cloned().collect(),
        }),
        many => Err(RevisionError::Ambiguous {
            prefix: wanted,
            matches: many
                .iter()
                .map(|r| r[..12.min(r.len())].to_owned())
                .collect(),
        }),
    }
}

/// The fleet pause, by `by` at `at`; `false` when it was paused already (by whoever paused
/// first: that pause stands).
pub fn apply_pause(state: &mut FleetState, by: &str, at: Timestamp) -> bool {
    if state.paused.is_some() {
        return false;
    }
    state.paused = Some(Pause {
        by: by.to_owned(),
        at,
    });
    record(state, by, at, "pause".to_owned());
    true
}

/// Lifts the fleet pause; `false` when there was none.
pub fn apply_resume(state: &mut FleetState, by: &str, at: Timestamp) -> bool {
    if state.paused.take().is_none() {
        return false;
    }
    record(state, by, at, "resume".to_owned());
    true
}

/// Removes the halt `given` names (see [`resolve`]) and returns it.
pub fn apply_clear(
    state: &mut FleetState,
    given: &str,
    by: &str,
    at: Timestamp,
) -> Result<Halt, RevisionError> {
    let revision = resolve(state, given)?;
    let halt = state
        .halted
        .remove(&revision)
        .ok_or_else(|| RevisionError::NotHalted {
            revision: revision.clone(),
            halted: Vec::new(),
        })?;
    // The operator looked: the revision's budget starts again.
    state.failures.remove(&revision);
    record(state, by, at, format!("clear {revision}"));
    Ok(halt)
}

/// Halts `halt.revision` fleet-wide; `false` when it was halted already (the first failure
/// stands: it says where the revision failed first).
pub fn apply_halt(state: &mut FleetState, halt: Halt) -> bool {
    let key = halt.revision.to_string();
    // A vanished holder that came back and whose gate failed: its halt becomes the failed
    // gate's (the revision is bad, and the holder is no longer in flight).
    let replaces_vanished = state.halted.get(&key).is_some_and(|h| {
        h.cause == HaltCause::HolderVanished
            && halt.cause == HaltCause::GateFailed
            && h.node == halt.node
    });
    if state.halted.contains_key(&key) && !replaces_vanished {
        return false;
    }
    let by = format!("ginx@{}", halt.node);
    let at = halt.at;
    count_failure(state, &halt);
    state.halted.insert(key.clone(), halt);
    record(state, &by, at, format!("halt {key}"));
    true
}

/// Counts `halt`'s failure against its revision's budget (once per node; a vanished holder
/// that came back and failed its gate is recorded as the failed gate).
fn count_failure(state: &mut FleetState, halt: &Halt) {
    let record = FailureRecord {
        at: halt.at,
        reason: halt.reason.clone(),
        cause: halt.cause,
    };
    state
        .failures
        .entry(halt.revision.to_string())
        .or_default()
        .entry(halt.node.clone())
        .and_modify(|r| {
            if r.cause == HaltCause::HolderVanished && halt.cause == HaltCause::GateFailed {
                *r = record.clone();
            }
        })
        .or_insert_with(|| record.clone());
}

/// What came of counting a failure against a revision's budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counted {
    /// The failures counted against the revision now (this one included).
    pub failures: usize,
    /// The revision is halted (by this failure, or before it).
    pub halted: bool,
    /// Something was written.
    pub changed: bool,
}

/// Counts `halt.node`'s failure of `halt.revision`; the failure that brings the count to
/// `budget` halts the revision (with `halt`). A node counts once per revision.
pub fn apply_failure(state: &mut FleetState, halt: Halt, budget: u32) -> Counted {
    let key = halt.revision.to_string();
    let known = state
        .failures
        .get(&key)
        .is_some_and(|f| f.contains_key(&halt.node));
    if !known {
        count_failure(state, &halt);
    }
    let failures = state.failures_of(&halt.revision);
    let mut changed = !known;
    if failures >= budget as usize && !state.halted.contains_key(&key) {
        changed |= apply_halt(state, halt.clone());
    } else if !known {
        record(
            state,
            &format!("ginx@{}", halt.node),
            halt.at,
            format!("failure {failures} of {budget} for {key} (quarantined)"),
        );
    }
    Counted {
        failures,
        halted: state.halted.contains_key(&key),
        changed,
    }
}

/// Lifts the halt of `revision` if it is a `holder-vanished` halt naming `node`: that node came
/// back and its gate passed for the revision, so the revision did not kill it. `false` when
/// there is no such halt (a failed gate's halt, or another node's, stays).
pub fn apply_lift_vanished(
    state: &mut FleetState,
    revision: &Revision,
    node: &str,
    at: Timestamp,
) -> bool {
    let key = revision.to_string();
    let ours = state
        .halted
        .get(&key)
        .is_some_and(|h| h.cause == HaltCause::HolderVanished && h.node == node);
    if !ours {
        return false;
    }
    state.halted.remove(&key);
    if let Some(f) = state.failures.get_mut(&key) {
        if f.get(node)
            .is_some_and(|r| r.cause == HaltCause::HolderVanished)
        {
            f.remove(node);
        }
        if f.is_empty() {
            state.failures.remove(&key);
        }
    }
    record(
        state,
        &format!("ginx@{node}"),
        at,
        format!("lift {key} (its holder came back and its gate passed)"),
    );
    true
}

fn record(state: &mut FleetState, by: &str, at: Timestamp, action: String) {
    events::append(&mut state.events, by, at, vec![action]);
}

/// The result of a change that may have found nothing to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Updated {
    /// The state as it is now in the ConfigMap.
    pub state: FleetState,
    /// `false`: it already was so, nothing was written.
    pub changed: bool,
}

/// Why `clear` did not clear.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ClearError {
    #[error(transparent)]
    Revision(#[from] RevisionError),
    #[error("{0}")]
    Api(String),
}

/// Reads and writes the ConfigMap.
#[derive(Clone)]
pub struct Fleet {
    api: Api<ConfigMap>,
    namespace: String,
    name: String,
    /// Written with an operator's credentials (`ginxctl rollout resume|clear`), not ginx's.
    operator: bool,
}

impl Fleet {
    pub fn new(client: kube::Client, namespace: &str, name: &str) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            operator: false,
        }
    }

    /// The same ConfigMap, written with an operator's credentials: errors say so.
    pub fn as_operator(mut self) -> Self {
        self.operator = true;
        self
    }

    /// `namespace/name`, for messages.
    pub fn object(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// The state as the ConfigMap has it (the default when there is none). A value that cannot
    /// be read is logged and read the cautious way (see [`decode_lenient`]).
    pub async fn read(&self) -> Result<FleetState, kube::Error> {
        Ok(match self.api.get_opt(&self.name).await? {
            Some(cm) => self.decode_logged(&cm),
            None => FleetState::default(),
        })
    }

    fn decode_logged(&self, cm: &ConfigMap) -> FleetState {
        let (state, problems) = decode_lenient(&cm.data.clone().unwrap_or_default());
        for p in problems {
            tracing::warn!(configmap = %self.object(), problem = %p, "unreadable rollout state; held back on it");
        }
        state
    }

    /// Reads the state, lets `f` change it (`false`: nothing to change, nothing is written) and
    /// writes it back conditionally on the `resourceVersion` read, creating the ConfigMap when
    /// there is none. On a conflict it starts again from a fresh read, at most
    /// [`MAX_CONFLICT_RETRIES`] times, so `f` may run more than once. Returns the state written
    /// (or found). A ConfigMap with a value ginx cannot read is not overwritten: the error
    /// names the key.
    pub async fn update(
        &self,
        mut f: impl FnMut(&mut FleetState) -> bool,
    ) -> Result<FleetState, LockError> {
        let resource = format!("ConfigMap {}", self.object());
        let written = replace_with_retry(&self.api, &self.name, &resource, None, |existing| {
            let mut state = match &existing {
                // Not overwritten, and not waited out: a person fixes it.
                Some(cm) => decode(&cm.data.clone().unwrap_or_default()).map_err(|e| {
                    LockError::Refused(format!(
                        "ConfigMap {}: {e}; fix or remove that key (kubectl -n {} edit configmap {}) \
                         and try again",
                        self.object(),
                        self.namespace,
                        self.name
                    ))
                })?,
                None => FleetState::default(),
            };
            if !f(&mut state) {
                return Ok(Edit::Keep(state));
            }
            let cm = match existing {
                Some(mut cm) => {
                    cm.data = Some(merge(cm.data.as_ref(), encode(&state)));
                    cm
                }
                None => self.new_configmap(&state),
            };
            Ok(Edit::Write(cm, state))
        })
        .await
        .map_err(|e| match e {
            EditError::Edit(e) => e,
            EditError::Api(e) => self.api_error(&e),
        })?;
        Ok(written.value)
    }

    /// The ConfigMap as ginx creates it, holding `state`.
    fn new_configmap(&self, state: &FleetState) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                namespace: Some(self.namespace.clone()),
                labels: Some(BTreeMap::from([(
                    "app.kubernetes.io/managed-by".to_owned(),
                    "ginx".to_owned(),
                )])),
                ..ObjectMeta::default()
            },
            data: Some(encode(state)),
            ..ConfigMap::default()
        }
    }

    /// A failed request about the ConfigMap, with what to do about it: unavailable when
    /// waiting mends it, refused when only a person does.
    fn api_error(&self, e: &ApiError) -> LockError {
        match e {
            ApiError::Conflict { .. } => LockError::Unavailable(format!(
                "ConfigMap {} changed under ginx on each of {MAX_CONFLICT_RETRIES} tries \
                 (others writing at once?); try again",
                self.object()
            )),
            ApiError::Unavailable { what, detail } => {
                LockError::Unavailable(format!("{what}: {detail}"))
            }
            ApiError::Refused { .. } | ApiError::Policy { .. } => {
                LockError::Refused(self.refusal(e))
            }
        }
    }

    /// A refused request about the ConfigMap, with what to do about it.
    fn refusal(&self, e: &ApiError) -> String {
        let (verb, status, detail) = match e {
            ApiError::Conflict { .. } | ApiError::Unavailable { .. } => return e.to_string(),
            ApiError::Refused {
                verb,
                status,
                detail,
                ..
            } => (verb, *status, detail),
            ApiError::Policy { verb, detail, .. } => (verb, Some(403), detail),
        };
        let what = format!("cannot {verb} ConfigMap {}: {detail}", self.object());
        if self.operator && matches!(status, Some(401 | 403)) {
            return format!(
                "{what}; the credentials given may not: lifting a halt or the pause needs get \
                 and update on it (an operator's, e.g. cluster-admin; never a node's)"
            );
        }
        match (status, e) {
            (Some(403), ApiError::Policy { .. }) => format!(
                "{what}; packaging/kubernetes/vap.yaml lets a node add a halt or the pause, never \
                 lift or change one (an operator does, with `ginxctl rollout resume|clear`)"
            ),
            (Some(403), _) => format!(
                "{what}; ginx needs get, create and update on it (Role ginx-rollout, which names \
                 the ConfigMap ginx-rollout; another rollout.configmap needs the Role changed) — \
                 apply packaging/kubernetes/rbac.yaml"
            ),
            (Some(404), _) => format!(
                "{what}; does namespace {} exist? apply packaging/kubernetes/rbac.yaml",
                self.namespace
            ),
            _ => what,
        }
    }

    /// Pauses the fleet; `changed` is `false` when it was paused already.
    pub async fn pause(&self, by: &str) -> Result<Updated, LockError> {
        let at = crate::util::now();
        self.changed(|s| apply_pause(s, by, at)).await
    }

    /// Lifts the fleet pause; `changed` is `false` when there was none.
    pub async fn resume(&self, by: &str) -> Result<Updated, LockError> {
        let at = crate::util::now();
        self.changed(|s| apply_resume(s, by, at)).await
    }

    /// Halts a revision fleet-wide; `changed` is `false` when it was halted already.
    pub async fn halt(&self, halt: Halt) -> Result<Updated, LockError> {
        self.changed(|s| apply_halt(s, halt.clone())).await
    }

    /// Counts a failure against its revision's budget, halting it at `budget` (see
    /// [`apply_failure`]).
    pub async fn fail(&self, halt: Halt, budget: u32) -> Result<(FleetState, Counted), LockError> {
        let mut counted = None;
        let state = self
            .update(|s| {
                let c = apply_failure(s, halt.clone(), budget);
                counted = Some(c);
                c.changed
            })
            .await?;
        let c = counted.unwrap_or(Counted {
            failures: state.failures_of(&halt.revision),
            halted: state.halt_of(&halt.revision).is_some(),
            changed: false,
        });
        Ok((state, c))
    }

    /// Lifts a `holder-vanished` halt of `revision` naming `node` (see [`apply_lift_vanished`]).
    pub async fn lift_vanished(
        &self,
        revision: &Revision,
        node: &str,
    ) -> Result<Updated, LockError> {
        let at = crate::util::now();
        self.changed(|s| apply_lift_vanished(s, revision, node, at))
            .await
    }

    /// Removes the halt `revision` names (full, or a unique prefix of a halted one) and returns
    /// it.
    pub async fn clear(&self, revision: &str, by: &str) -> Result<Halt, ClearError> {
        let at = crate::util::now();
        let mut outcome = None;
        self.update(|s| match apply_clear(s, revision, by, at) {
            Ok(h) => {
                outcome = Some(Ok(h));
                true
            }
            Err(e) => {
                outcome = Some(Err(e));
                false
            }
        })
        .await
        .map_err(|e| ClearError::Api(e.to_string()))?;
        match outcome {
            Some(Ok(h)) => Ok(h),
            Some(Err(e)) => Err(ClearError::Revision(e)),
            None => Err(ClearError::Api(format!(
                "ConfigMap {}: the change was never applied",
                self.object()
            ))),
        }
    }

    async fn changed(
        &self,
        mut f: impl FnMut(&mut FleetState) -> bool,
    ) -> Result<Updated, LockError> {
        let mut changed = false;
        let state = self
            .update(|s| {
                changed = f(s);
                changed
            })
            .await?;
        Ok(Updated { state, changed })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A failed write of the fleet state is unavailable only when waiting mends it: a 403, a
    /// policy's refusal or a 404 is refused, and stays refused (admission's `lock_error` never
    /// lets a refusal go on without the lock under `on_api_unavailable = "proceed"`).
    #[tokio::test]
    async fn a_refused_write_of_the_fleet_state_stays_a_refusal() {
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let fleet = Fleet::new(
            kube::Client::try_from(config).unwrap(),
            "ginx-system",
            "ginx-rollout",
        );
        let refused = |status| ApiError::Refused {
            verb: "update".into(),
            resource: "configmaps".into(),
            status: Some(status),
            detail: "forbidden".into(),
            message: "forbidden".into(),
        };
        for e in [
            refused(403),
            refused(404),
            refused(422),
            ApiError::Policy {
                verb: "update".into(),
                resource: "configmaps".into(),
                detail: "ginx-node-halts".into(),
                message: "denied".into(),
            },
        ] {
            let got = fleet.api_error(&e);
            assert!(matches!(got, LockError::Refused(_)), "{e:?}: {got:?}");
        }
        for e in [
            ApiError::Unavailable {
                what: "update ConfigMap".into(),
                detail: "connection refused".into(),
            },
            ApiError::Conflict {
                resource: "configmaps".into(),
                tries: 5,
            },
        ] {
            assert!(
                matches!(fleet.api_error(&e), LockError::Unavailable(_)),
                "{e:?}"
            );
        }
        assert_eq!(
            LockError::Refused("403".into()).context("cannot halt"),
            LockError::Refused("cannot halt: 403".into())
        );
    }

    const A: &str = "0123456789abcdef0123456789abcdef01234567";
    const B: &str = "0123456789abffff0123456789abcdef01234567";

    fn t(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn halt(rev: &str, node: &str) -> Halt {
        Halt {
            revision: rev.parse().unwrap(),
            node: node.to_owned(),
            probes: BTreeMap::from([("kubelet".to_owned(), "healthz answered 500".to_owned())]),
            reason: "health gate failed".to_owned(),
            at: t("2026-12-01T10:00:00Z"),
            cause: HaltCause::GateFailed,
            group: None,
        }
    }

    fn state() -> FleetState {
        let mut s = FleetState::default();
        apply_pause(&mut s, "alice@lucy", t("2026-12-01T11:00:00Z"));
        apply_halt(&mut s, halt(A, "makise"));
        s
    }

    #[test]
    fn failures_below_the_budget_quarantine_and_the_one_that_reaches_it_halts() {
        let mut s = FleetState::default();
        let r: Revision = A.parse().unwrap();
        let c = apply_failure(&mut s, halt(A, "makise"), 2);
        assert_eq!(
            c,
            Counted {
                failures: 1,
                halted: false,
                changed: true
            }
        );
        assert!(s.halt_of(&r).is_none(), "below the budget: not halted");
        // The same node again: counted once.
        let c = apply_failure(&mut s, halt(A, "makise"), 2);
        assert_eq!((c.failures, c.halted, c.changed), (1, false, false));
        // A second node reaches the budget: halted, by that node's failure.
        let c = apply_failure(&mut s, halt(A, "quinn"), 2);
        assert_eq!((c.failures, c.halted, c.changed), (2, true, true));
        assert_eq!(s.halt_of(&r).unwrap().node, "quinn");
        // Round trip, one key per node.
        assert_eq!(decode(&encode(&s)).unwrap(), s);
        // The default budget halts at the first failure, as before budgets existed.
        let mut s = FleetState::default();
        assert!(apply_failure(&mut s, halt(A, "makise"), 1).halted);
        // Clearing the halt starts the budget again.
        apply_clear(&mut s, A, "alice@lucy", t("2026-12-01T12:00:00Z")).unwrap();
        assert_eq!(s.failures_of(&r), 0);
        // A vanished holder that comes back and passes takes its failure back with its halt.
        let mut s = FleetState::default();
        let mut v = halt(A, "makise");
        v.cause = HaltCause::HolderVanished;
        apply_halt(&mut s, v);
        assert_eq!(s.failures_of(&r), 1);
        assert!(apply_lift_vanished(
            &mut s,
            &r,
            "makise",
            t("2026-12-01T12:00:00Z")
        ));
        assert_eq!(s.failures_of(&r), 0);
        // An unreadable failure still counts.
        let mut data = encode(&FleetState::default());
        data.insert(format!("failed.{A}.rei"), "garbage".into());
        let (s, problems) = decode_lenient(&data);
        assert_eq!(s.failures_of(&r), 1);
        assert!(
            problems[0].contains(&format!("failed.{A}.rei")),
            "{problems:?}"
        );
    }

    #[test]
    fn the_layout_is_one_key_per_fact_and_round_trips() {
        let s = state();
        let data = encode(&s);
        let keys: Vec<&str> = data.keys().map(String::as_str).collect();
        // A halt counts its node's failure against the revision's budget, a key of its own.
        assert_eq!(
            keys,
            [
                "events",
                &format!("failed.{A}.makise"),
                &format!("halted.{A}"),
                "paused"
            ]
        );
        let f: serde_json::Value =
            serde_json::from_str(&data[&format!("failed.{A}.makise")]).unwrap();
        assert_eq!(f["cause"], "gate-failed");
        assert!(
            data[&format!("failed.{A}.makise")].ends_with(r#","cause":"gate-failed"}"#),
            "the cause comes last (packaging/kubernetes/vap.yaml anchors on it)"
        );
        let paused: serde_json::Value = serde_json::from_str(&data["paused"]).unwrap();
        assert_eq!(
            paused,
            serde_json::json!({"by": "alice@lucy", "at": "2026-12-01T11:00:00Z"})
        );
        let h: serde_json::Value = serde_json::from_str(&data[&format!("halted.{A}")]).unwrap();
        assert_eq!(h["node"], "makise");
        assert_eq!(h["probes"]["kubelet"], "healthz answered 500");
        assert_eq!(decode(&data).unwrap(), s);
        // Nothing paused, nothing halted, no events: no keys at all.
        assert!(encode(&FleetState::default()).is_empty());
        assert_eq!(decode(&BTreeMap::new()).unwrap(), FleetState::default());
    }

    #[test]
    fn events_keep_the_newest_fifty() {
        let mut s = FleetState::default();
        for i in 0..60 {
            let at = Timestamp::from_second(1_800_000_000 + i).unwrap();
            apply_pause(&mut s, &format!("u{i}@lucy"), at);
            apply_resume(&mut s, &format!("u{i}@lucy"), at);
        }
        assert_eq!(s.events.len(), MAX_EVENTS);
        assert_eq!(s.events.last().unwrap().by, "u59@lucy");
        assert_eq!(s.events.last().unwrap().action, "resume");
        // A longer list written by hand is cut when ginx writes it.
        s.events.extend(s.events.clone());
        let back = decode(&encode(&s)).unwrap();
        assert_eq!(back.events.len(), MAX_EVENTS);
        assert_eq!(back.events.last(), s.events.last());
    }

    #[test]
    fn unknown_keys_are_ignored_and_kept_on_write() {
        let mut data = encode(&state());
        data.insert("note".into(), "ask bob before resuming".into());
        assert_eq!(decode(&data).unwrap(), state());
        let merged = merge(Some(&data), encode(&FleetState::default()));
        assert_eq!(
            merged,
            BTreeMap::from([("note".to_owned(), "ask bob before resuming".to_owned())])
        );
    }

    /// The admission policy refuses a node's write that changes a hold, so a node's own write
    /// must carry every `held.*` value exactly as it found it, however it was written.
    #[test]
    fn held_keys_are_read_never_written_and_kept_verbatim() {
        let mut data = encode(&state());
        let by_hand = "{ \"at\": \"2026-12-01T10:00:00Z\",  \"by\": \"ann\" }";
        data.insert("held.lucy".into(), by_hand.into());
        data.insert("held.makise".into(), "not json".into());
        let (s, problems) = decode_lenient(&data);
        assert_eq!(s.holds["lucy"].by, "ann");
        assert!(s.holds["makise"].reason.contains("cannot be read"));
        assert_eq!(problems.len(), 1, "{problems:?}");
        // A node's write does not stumble on an unreadable hold.
        let mut s = decode(&data).unwrap();
        assert!(!encode(&s).keys().any(|k| k.starts_with("held.")));
        assert!(apply_halt(&mut s, halt(B, "lucy")));
        let written = merge(Some(&data), encode(&s));
        assert_eq!(written["held.lucy"], by_hand);
        assert_eq!(written["held.makise"], "not json");
    }

    #[test]
    fn a_bad_value_names_its_key_and_what_is_wrong() {
        let bad = |k: &str, v: &str| {
            let mut data = encode(&state());
            data.insert(k.to_owned(), v.to_owned());
            decode(&data).unwrap_err().to_string()
        };
        let e = bad("paused", "yes");
        assert!(e.starts_with("key paused: not a pause"), "{e}");
        let e = bad("events", "{}");
        assert!(e.starts_with("key events: not a JSON array"), "{e}");
        let e = bad("halted.abc", "{}");
        assert!(
            e.starts_with("key halted.abc: \"abc\" is not a full commit id"),
            "{e}"
        );
        let e = bad(&format!("halted.{B}"), "{\"node\": 1}");
        assert!(e.starts_with(&format!("key halted.{B}: not a halt")), "{e}");
        let e = bad(
            &format!("halted.{B}"),
            &serde_json::to_string(&halt(A, "x")).unwrap(),
        );
        assert!(e.contains("of another revision"), "{e}");
    }

    #[test]
    fn what_cannot_be_read_still_holds_back() {
        let data = BTreeMap::from([
            ("paused".to_owned(), "yes".to_owned()),
            (format!("halted.{A}"), "broken".to_owned()),
            ("halted.zz".to_owned(), "{}".to_owned()),
        ]);
        let (s, problems) = decode_lenient(&data);
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(s.paused.is_some());
        assert!(s.halt_of(&A.parse().unwrap()).is_some());
        assert_eq!(s.halted.len(), 1);
    }

    #[test]
    fn pause_and_resume_change_only_what_is_not_so_and_record_who() {
        let mut s = FleetState::default();
        assert!(apply_pause(&mut s, "alice@lucy", t("2026-12-01T11:00:00Z")));
        assert!(!apply_pause(&mut s, "bob@quinn", t("2026-12-01T11:05:00Z")));
        assert_eq!(
            s.paused.as_ref().unwrap().by,
            "alice@lucy",
            "the first pause stands"
        );
        assert!(apply_resume(&mut s, "bob@quinn", t("2026-12-01T11:10:00Z")));
        assert!(!apply_resume(
            &mut s,
            "bob@quinn",
            t("2026-12-01T11:11:00Z")
        ));
        assert!(s.paused.is_none());
        let log: Vec<(&str, &str)> = s
            .events
            .iter()
            .map(|e| (e.by.as_str(), e.action.as_str()))
            .collect();
        assert_eq!(log, [("alice@lucy", "pause"), ("bob@quinn", "resume")]);
    }

    #[test]
    fn a_second_halt_of_a_revision_keeps_the_first() {
        let mut s = FleetState::default();
        assert!(apply_halt(&mut s, halt(A, "makise")));
        assert!(!apply_halt(&mut s, halt(A, "quinn")));
        assert_eq!(s.halted[A].node, "makise");
        assert_eq!(s.events.len(), 1);
        assert_eq!(s.events[0].by, "ginx@makise");
        assert_eq!(s.events[0].action, format!("halt {A}"));
    }

    #[test]
    fn clear_takes_a_full_revision_or_a_unique_prefix() {
        let mut s = state();
        apply_halt(&mut s, halt(B, "quinn"));
        let at = t("2026-12-01T12:00:00Z");
        // "0123456789ab" starts both.
        let e = apply_clear(&mut s, "0123456789ab", "root@lucy", at).unwrap_err();
        assert!(
            matches!(&e, RevisionError::Ambiguous { matches, .. } if matches.len() == 2),
            "{e}"
        );
        assert!(matches!(
            apply_clear(&mut s, "012345", "root@lucy", at),
            Err(RevisionError::Malformed(_))
        ));
        assert!(matches!(
            apply_clear(&mut s, "not-hex!", "root@lucy", at),
            Err(RevisionError::Malformed(_))
        ));
        let e = apply_clear(&mut s, "fedcba9", "root@lucy", at).unwrap_err();
        assert!(
            e.to_string().starts_with("fedcba9 is not halted; halted: "),
            "{e}"
        );
        let h = apply_clear(&mut s, "0123456789abF", "root@lucy", at).unwrap();
        assert_eq!(h.revision.as_str(), B);
        let h = apply_clear(&mut s, &A.to_uppercase(), "root@lucy", at).unwrap();
        assert_eq!(h.node, "makise");
        assert!(s.halted.is_empty());
        assert_eq!(
            s.events.last().unwrap().action,
            format!("clear {A}"),
            "the full revision is recorded"
        );
        let e = apply_clear(&mut s, A, "root@lucy", at).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("{A} is not halted (no revision is halted)")
        );
    }

    #[test]
    fn only_the_vanished_holder_s_own_halt_is_lifted_by_its_passed_gate() {
        let rev: Revision = "b".repeat(40).parse().unwrap();
        let at = t("2026-12-01T10:00:00Z");
        let mut state = FleetState::default();
        let mut h = halt(&"b".repeat(40), "lucy");
        h.cause = HaltCause::HolderVanished;
        state.halted.insert(rev.to_string(), h.clone());
        // Another node's gate passing says nothing of lucy's death.
        assert!(!apply_lift_vanished(&mut state, &rev, "makise", at));
        assert!(apply_lift_vanished(&mut state, &rev, "lucy", at));
        assert!(state.halted.is_empty());
        assert_eq!(state.events.last().unwrap().by, "ginx@lucy");
        // A failed gate's halt is an operator's to clear.
        state
            .halted
            .insert(rev.to_string(), halt(&"b".repeat(40), "lucy"));
        assert!(!apply_lift_vanished(&mut state, &rev, "lucy", at));
        assert_eq!(state.halted.len(), 1);
    }
}
