//! [`watch_objects`]: list, then watch from the list's `resourceVersion`, for ever, and say
//! that something changed by bumping a counter. What waits on it (a node waiting for a slot,
//! the fleet state's cache, a group waiting for another) looks again when the counter moves.
//!
//! A watch the server ends at its timeout is made again from the last `resourceVersion` seen
//! (bookmarks, on by default, keep it current); an expired one (410) or a broken stream
//! relists, a failed list backs off.

use std::collections::HashMap;
use std::time::Duration;

use futures_util::StreamExt;
use kube::Api;
use kube::api::{ListParams, WatchEvent, WatchParams};
use tokio::sync::watch;

use crate::k8s::describe;

/// How long one watch request lasts (`timeoutSeconds`); the server ends it then, and it is
/// made again from the last `resourceVersion` seen, without a list.
pub const WATCH_SECONDS: u32 = 290;

/// What of an object wakes the waiters (`None`: any change).
pub type Wake<K> = Option<fn(&K) -> String>;

/// List, then watch from the list's `resourceVersion`, forever: every event (and every
/// relist) bumps `changes` — or, with `wake`, only an event that adds or deletes an object or
/// changes what `wake` says of it.
pub async fn watch_objects<K>(
    api: Api<K>,
    labels: String,
    fields: Option<String>,
    changes: watch::Sender<u64>,
    wake: Wake<K>,
) where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    let mut w = Watcher {
        api,
        labels,
        fields,
        changes,
        wake,
        keys: HashMap::new(),
        failures: 0,
    };
    let mut from: Option<String> = None;
    loop {
        let rv = match from.take() {
            Some(rv) => rv,
            None => match w.list().await {
                Some(rv) => rv,
                None => continue,
            },
        };
        from = w.follow(rv).await;
    }
}

struct Watcher<K: kube::Resource> {
    api: Api<K>,
    labels: String,
    fields: Option<String>,
    changes: watch::Sender<u64>,
    wake: Wake<K>,
    /// With `wake`: each object's name and what `wake` said of it last.
    keys: HashMap<String, String>,
    /// Lists failed in a row.
    failures: u32,
}

fn name<K: kube::Resource>(o: &K) -> String {
    o.meta().name.clone().unwrap_or_default()
}

impl<K> Watcher<K>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    fn bump(&self) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Lists the objects (their metadata only, unless `wake` reads more): the
    /// `resourceVersion` to watch from, or `None` after a failure (backed off).
    async fn list(&mut self) -> Option<String> {
        let mut lp = ListParams::default().labels(&self.labels);
        if let Some(f) = &self.fields {
            lp = lp.fields(f);
        }
        let listed = match self.wake {
            // What wakes may be in the spec: the objects themselves.
            Some(key) => self.api.list(&lp).await.map(|list| {
                self.keys = list.items.iter().map(|o| (name(o), key(o))).collect();
                list.metadata.resource_version
            }),
            None => self
                .api
                .list_metadata(&lp)
                .await
                .map(|list| list.metadata.resource_version),
        };
        match listed {
            Ok(rv) => {
                self.failures = 0;
                self.bump();
                Some(rv.unwrap_or_default())
            }
            Err(e) => {
                self.failures = self.failures.saturating_add(1);
                tracing::debug!(error = %describe(&e), "rollout watch: list failed");
                let wait = crate::util::backoff(
                    Duration::from_millis(500),
                    Duration::from_secs(10),
                    self.failures,
                );
                tokio::time::sleep(wait).await;
                None
            }
        }
    }

    /// Watches from `rv` until the server ends the watch: the `resourceVersion` to go on from
    /// when it ended cleanly, `None` when a relist is needed.
    async fn follow(&mut self, rv: String) -> Option<String> {
        let mut wp = WatchParams::default()
            .labels(&self.labels)
            .timeout(WATCH_SECONDS);
        if let Some(f) = &self.fields {
            wp = wp.fields(f);
        }
        let stream = match self.api.watch(&wp, &rv).await {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(error = %describe(&e), "rollout watch failed");
                tokio::time::sleep(Duration::from_secs(1)).await;
                return None;
            }
        };
        let mut stream = std::pin::pin!(stream);
        let mut last = rv;
        while let Some(event) = stream.next().await {
            match event {
                Ok(WatchEvent::Added(o) | WatchEvent::Modified(o)) => {
                    if let Some(v) = o.meta().resource_version.clone() {
                        last = v;
                    }
                    self.seen(&o);
                }
                Ok(WatchEvent::Deleted(o)) => {
                    if let Some(v) = o.meta().resource_version.clone() {
                        last = v;
                    }
                    self.keys.remove(&name(&o));
                    self.bump();
                }
                Ok(WatchEvent::Bookmark(b)) => last = b.metadata.resource_version,
                Ok(WatchEvent::Error(e)) => {
                    tracing::debug!(code = e.code, status_message = %e.message, "rollout watch ended");
                    return None;
                }
                Err(e) => {
                    tracing::debug!(error = %describe(&e), "rollout watch stream broke");
                    return None;
                }
            }
        }
        Some(last)
    }

    /// An object added or changed: a wake when what `wake` says of it changed.
    fn seen(&mut self, o: &K) {
        match self.wake {
            Some(key) => {
                let k = key(o);
                if self.keys.insert(name(o), k.clone()).as_ref() != Some(&k) {
                    self.bump();
                }
            }
            None => self.bump(),
        }
    }
}
