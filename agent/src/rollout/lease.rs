//! The rollout lock on Leases: slots `ginx-rollout-<group>-<slot>` in the namespace of the
//! heartbeat Lease, labelled with their group, holder the node name.
//!
//! Taking a slot is a create, or a PUT carrying the `resourceVersion` read, of a slot that is
//! free; a 409 means another node won it, and the slots are read again. Renewing re-reads the
//! Lease and PUTs a new `renewTime` only while the node is still its holder. Releasing clears
//! the holder. The slots are watched (list, then watch from its `resourceVersion`), so that a
//! waiting node hears of a release at once instead of polling.

use std::collections::BTreeMap;
use std::time::Duration;

use futures_util::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Api;
use kube::api::{ListParams, PostParams, WatchEvent, WatchParams};
use tokio::sync::watch;

use super::slots::{self, Choice, Slot};
use crate::config::RolloutConfig;
use crate::types::api::{code, describe};

/// The label that marks a slot Lease and names its group.
pub const GROUP_LABEL: &str = "ginx.io/rollout-group";

/// Attempts at a slot when other nodes keep winning the race.
const MAX_RACES: u32 = 5;

/// What came of asking for a slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Acquired {
    /// Held: newly taken, or resumed.
    Slot { index: u32, resumed: bool },
    /// All slots held; slot → holder.
    Full(BTreeMap<u32, String>),
}

/// One group's slots, seen from one node.
#[derive(Clone)]
pub struct LeaseLock {
    api: Api<Lease>,
    pub group: String,
    pub node: String,
    pub max: u32,
    pub duration: Duration,
}

impl LeaseLock {
    pub fn new(
        client: kube::Client,
        namespace: &str,
        group: &str,
        node: &str,
        cfg: &RolloutConfig,
    ) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            group: group.to_owned(),
            node: node.to_owned(),
            max: cfg.max_concurrent,
            duration: cfg.lease_duration.get(),
        }
    }

    pub fn name(&self, index: u32) -> String {
        RolloutConfig::slot_lease(&self.group, index)
    }

    fn selector(&self) -> String {
        format!("{GROUP_LABEL}={}", self.group)
    }

    fn duration_secs(&self) -> i32 {
        i32::try_from(self.duration.as_secs()).unwrap_or(i32::MAX)
    }

    /// The group's slot Leases, by index.
    pub async fn read(&self) -> Result<BTreeMap<u32, Lease>, kube::Error> {
        let list = self
            .api
            .list(&ListParams::default().labels(&self.selector()))
            .await?;
        let prefix = format!("ginx-rollout-{}-", self.group);
        Ok(list
            .items
            .into_iter()
            .filter_map(|l| {
                let index = l
                    .metadata
                    .name
                    .as_deref()?
                    .strip_prefix(&prefix)?
                    .parse()
                    .ok()?;
                Some((index, l))
            })
            .collect())
    }

    /// The slots as [`slots::choose`] sees them.
    pub fn view(leases: &BTreeMap<u32, Lease>) -> Vec<Slot> {
        leases
            .iter()
            .map(|(i, l)| {
                let spec = l.spec.as_ref();
                Slot {
                    index: *i,
                    holder: spec.and_then(|s| s.holder_identity.clone()),
                    renewed: spec
                        .and_then(|s| s.renew_time.as_ref().or(s.acquire_time.as_ref()))
                        .map(|t| t.0),
                    duration: Duration::from_secs(
                        spec.and_then(|s| s.lease_duration_seconds)
                            .and_then(|d| u64::try_from(d).ok())
                            .unwrap_or(0),
                    ),
                }
            })
            .collect()
    }

    /// Takes a free slot, or resumes the one this node holds.
    pub async fn acquire(&self) -> Result<Acquired, String> {
        for _ in 0..MAX_RACES {
            let leases = self.read().await.map_err(|e| self.error("list", &e))?;
            let now = jiff::Timestamp::now();
            let index = match slots::choose(&Self::view(&leases), &self.node, self.max, now) {
                Choice::Full(holders) => return Ok(Acquired::Full(holders)),
                Choice::Held(i) => {
                    // Ours already: renew it at once, so that it cannot expire under us now.
                    match self.write(i, leases.get(&i).cloned(), now, true).await {
                        Ok(()) => {
                            return Ok(Acquired::Slot {
                                index: i,
                                resumed: true,
                            });
                        }
                        Err(None) => continue,
                        Err(Some(e)) => return Err(e),
                    }
                }
                Choice::Take(i) => i,
            };
            match self
                .write(index, leases.get(&index).cloned(), now, false)
                .await
            {
                Ok(()) => {
                    return Ok(Acquired::Slot {
                        index,
                        resumed: false,
                    });
                }
                // Another node won that slot: look again, and try the next one.
                Err(None) => continue,
                Err(Some(e)) => return Err(e),
            }
        }
        Err(format!(
            "the slots of group {} kept changing under ginx ({MAX_RACES} races lost in a row)",
            self.group
        ))
    }

    /// Creates slot `index`, or PUTs it on the `resourceVersion` read. `Err(None)`: a 409.
    async fn write(
        &self,
        index: u32,
        existing: Option<Lease>,
        now: jiff::Timestamp,
        keep: bool,
    ) -> Result<(), Option<String>> {
        let now = MicroTime(now);
        let name = self.name(index);
        let result = match existing {
            None => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(name.clone()),
                        labels: Some([(GROUP_LABEL.to_owned(), self.group.clone())].into()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(LeaseSpec {
                        holder_identity: Some(self.node.clone()),
                        lease_duration_seconds: Some(self.duration_secs()),
                        acquire_time: Some(now.clone()),
                        renew_time: Some(now),
                        lease_transitions: Some(0),
                        ..LeaseSpec::default()
                    }),
                };
                self.api
                    .create(&PostParams::default(), &lease)
                    .await
                    .map(|_| ())
            }
            Some(mut lease) => {
                let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
                if !keep {
                    spec.acquire_time = Some(now.clone());
                    spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
                }
                spec.holder_identity = Some(self.node.clone());
                spec.lease_duration_seconds = Some(self.duration_secs());
                spec.renew_time = Some(now);
                self.api
                    .replace(&name, &PostParams::default(), &lease)
                    .await
                    .map(|_| ())
            }
        };
        match result {
            Ok(()) => Ok(()),
            Err(e) if code(&e) == Some(409) => Err(None),
            Err(e) => Err(Some(self.error("write", &e))),
        }
    }

    /// Renews slot `index`; `Ok(false)` when this node is no longer its holder (it expired
    /// and another node took it).
    pub async fn renew(&self, index: u32) -> Result<bool, String> {
        for _ in 0..MAX_RACES {
            let name = self.name(index);
            let lease = self
                .api
                .get_opt(&name)
                .await
                .map_err(|e| self.error("get", &e))?;
            let Some(lease) = lease else { return Ok(false) };
            let holder = lease
                .spec
                .as_ref()
                .and_then(|s| s.holder_identity.as_deref());
            if holder != Some(self.node.as_str()) {
                return Ok(false);
            }
            match self
                .write(index, Some(lease), jiff::Timestamp::now(), true)
                .await
            {
                Ok(()) => return Ok(true),
                Err(None) => continue,
                Err(Some(e)) => return Err(e),
            }
        }
        Err(format!(
            "slot Lease {} kept changing under ginx",
            self.name(index)
        ))
    }

    /// Clears the holder of slot `index` if it is this node.
    pub async fn release(&self, index: u32) -> Result<(), String> {
        let name = self.name(index);
        for _ in 0..MAX_RACES {
            let lease = self
                .api
                .get_opt(&name)
                .await
                .map_err(|e| self.error("get", &e))?;
            let Some(mut lease) = lease else {
                return Ok(());
            };
            let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
            if spec.holder_identity.as_deref() != Some(self.node.as_str()) {
                return Ok(());
            }
            spec.holder_identity = None;
            match self
                .api
                .replace(&name, &PostParams::default(), &lease)
                .await
            {
                Ok(_) => return Ok(()),
                Err(e) if code(&e) == Some(409) => continue,
                Err(e) => return Err(self.error("update", &e)),
            }
        }
        Err(format!("slot Lease {name} kept changing under ginx"))
    }

    fn error(&self, verb: &str, e: &kube::Error) -> String {
        match code(e) {
            Some(403) => format!(
                "rollout lock (group {}): {}; ginx needs {verb} on leases — apply \
                 packaging/kubernetes/rbac.yaml",
                self.group,
                describe(e)
            ),
            _ => format!("rollout lock (group {}): {}", self.group, describe(e)),
        }
    }

    /// Watches the group's slots until `stop` fires; bumps `changes` on every change (and
    /// after every (re)list). Backs off while the API is away.
    pub async fn watch(self, changes: watch::Sender<u64>, mut stop: watch::Receiver<bool>) {
        let selector = self.selector();
        let api = self.api.clone();
        tokio::select! {
            () = watch_objects(api, selector, None, changes) => {}
            _ = stop.changed() => {}
        }
    }
}

/// How long one watch request lasts (`timeoutSeconds`); the server ends it then, and it is
/// made again from the last `resourceVersion` seen, without a list.
pub const WATCH_SECONDS: u32 = 290;

/// List, then watch from the list's `resourceVersion`, forever: every event (and every
/// relist) bumps `changes`. A watch the server ends is made again from the last
/// `resourceVersion` seen (bookmarks, on by default, keep it current); an expired one (410) or a broken
/// stream relists.
pub async fn watch_objects<K>(
    api: Api<K>,
    labels: String,
    fields: Option<String>,
    changes: watch::Sender<u64>,
) where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    let bump = || changes.send_modify(|n| *n = n.wrapping_add(1));
    let mut failures = 0u32;
    let mut from: Option<String> = None;
    loop {
        let rv = match from.take() {
            Some(rv) => rv,
            None => {
                let mut lp = ListParams::default().labels(&labels);
                if let Some(f) = &fields {
                    lp = lp.fields(f);
                }
                match api.list_metadata(&lp).await {
                    Ok(list) => {
                        failures = 0;
                        bump();
                        list.metadata.resource_version.unwrap_or_default()
                    }
                    Err(e) => {
                        failures = failures.saturating_add(1);
                        tracing::debug!(error = %describe(&e), "rollout watch: list failed");
                        tokio::time::sleep(crate::util::backoff(
                            Duration::from_millis(500),
                            Duration::from_secs(10),
                            failures,
                        ))
                        .await;
                        continue;
                    }
                }
            }
        };
        let mut wp = WatchParams::default()
            .labels(&labels)
            .timeout(WATCH_SECONDS);
        if let Some(f) = &fields {
            wp = wp.fields(f);
        }
        let stream = match api.watch(&wp, &rv).await {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(error = %describe(&e), "rollout watch failed");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let mut stream = std::pin::pin!(stream);
        let mut last = rv;
        // Whether the stream ended the way the server ends a watch at its timeout.
        let mut clean = true;
        while let Some(event) = stream.next().await {
            match event {
                Ok(WatchEvent::Added(o) | WatchEvent::Modified(o) | WatchEvent::Deleted(o)) => {
                    if let Some(v) = o.meta().resource_version.clone() {
                        last = v;
                    }
                    bump();
                }
                Ok(WatchEvent::Bookmark(b)) => last = b.metadata.resource_version,
                Ok(WatchEvent::Error(e)) => {
                    tracing::debug!(code = e.code, message = %e.message, "rollout watch ended");
                    clean = false;
                    break;
                }
                Err(e) => {
                    tracing::debug!(error = %describe(&e), "rollout watch stream broke");
                    clean = false;
                    break;
                }
            }
        }
        if clean {
            from = Some(last);
        }
    }
}
