//! [`Reflector`]: one list, then a watch from the list's `resourceVersion`, for ever, kept as a
//! map of what the caller needs of each object (its [`Projection`], a few fields, not the
//! object) and handed out as an immutable [`Reflection`]. Readers never ask the API server:
//! they look at the last reflection. A change the projection says matters also bumps a counter,
//! which wakes whoever waits on these objects (a node waiting for a slot, a group waiting for
//! another).
//!
//! A watch the server ends at its timeout is made again from the last `resourceVersion` seen
//! (bookmarks, on by default, keep it current); an expired one (410) or a broken stream
//! relists, a failed list backs off and is told to readers as the typed [`ApiError`] a list
//! of their own would have met, while they keep the objects of the last good list.
//!
//! The store's rules (what a list or an event does to the map, and whether it wakes) are the
//! pure [`Store`]; the task around it does the requests.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use kube::Api;
use kube::api::{ListParams, WatchEvent, WatchParams};
use tokio::sync::watch;

use crate::k8s::{ApiError, describe};

/// How long one watch request lasts (`timeoutSeconds`); the server ends it then, and it is
/// made again from the last `resourceVersion` seen, without a list.
pub const WATCH_SECONDS: u32 = 290;

/// What a reflector keeps of an object, and which changes of it wake the waiters.
pub struct Projection<K, V> {
    /// What is kept of an object; `None`: not kept (as if it did not exist).
    pub keep: fn(&K) -> Option<V>,
    /// Whether a change from the first to the second wakes the waiters (an object added or
    /// removed always does).
    pub wakes: fn(&V, &V) -> bool,
}

impl<K, V> Clone for Projection<K, V> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<K, V> Copy for Projection<K, V> {}

/// Where the reflector's list stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Listed {
    /// Not listed yet: the objects are empty, not known to be none.
    NotYet,
    /// Listed, and watched since.
    Yes,
    /// The last list failed: the objects are those of the last good list, if any.
    Failed(ApiError),
}

/// The objects as last seen, by name: an immutable value, cheap to clone and hand out.
#[derive(Clone, Debug)]
pub struct Reflection<V> {
    pub objects: Arc<BTreeMap<String, V>>,
    pub listed: Listed,
}

impl<V> Default for Reflection<V> {
    fn default() -> Self {
        Reflection {
            objects: Arc::new(BTreeMap::new()),
            listed: Listed::NotYet,
        }
    }
}

impl<V> Reflection<V> {
    /// The objects, once listed; else why they cannot be read (a failed list's error, or
    /// `None` while the first list is under way).
    pub fn current(&self) -> Result<&BTreeMap<String, V>, Option<&ApiError>> {
        match &self.listed {
            Listed::Yes => Ok(&self.objects),
            Listed::Failed(e) => Err(Some(e)),
            Listed::NotYet => Err(None),
        }
    }
}

/// The map and its rules, without I/O.
pub struct Store<K, V> {
    projection: Projection<K, V>,
    pub reflection: Reflection<V>,
    /// The first list wakes the waiters: they do not read the reflection, only wake on it, and
    /// may have missed a change made before the watch began.
    first_wakes: bool,
}

impl<K: kube::Resource, V: Clone> Store<K, V> {
    pub fn new(projection: Projection<K, V>) -> Self {
        Store {
            projection,
            reflection: Reflection::default(),
            first_wakes: false,
        }
    }

    /// A list replaces every object; whether the waiters are woken: something they care about
    /// differs, or the list comes after a failed one (they answered with the failure). The
    /// first list wakes nobody whose readers read the reflection (they wait for it, or read for
    /// themselves), and everybody when they only wake on it.
    pub fn listed(&mut self, items: &[K]) -> bool {
        let fresh: BTreeMap<String, V> = items
            .iter()
            .filter_map(|o| Some((name(o), (self.projection.keep)(o)?)))
            .collect();
        let old = &self.reflection.objects;
        let wakes = match self.reflection.listed {
            Listed::NotYet => self.first_wakes,
            Listed::Failed(_) => true,
            Listed::Yes => {
                old.len() != fresh.len()
                    || fresh
                        .iter()
                        .any(|(n, v)| old.get(n).is_none_or(|was| (self.projection.wakes)(was, v)))
            }
        };
        self.reflection = Reflection {
            objects: Arc::new(fresh),
            listed: Listed::Yes,
        };
        wakes
    }

    /// A list that failed: readers are told, and keep the last good objects.
    pub fn failed(&mut self, e: ApiError) {
        self.reflection.listed = Listed::Failed(e);
    }

    /// An object added or changed; whether the waiters are woken.
    pub fn seen(&mut self, o: &K) -> bool {
        let key = name(o);
        let objects = Arc::make_mut(&mut self.reflection.objects);
        match (self.projection.keep)(o) {
            Some(v) => {
                let wakes = objects
                    .get(&key)
                    .is_none_or(|was| (self.projection.wakes)(was, &v));
                objects.insert(key, v);
                wakes
            }
            None => objects.remove(&key).is_some(),
        }
    }

    /// An object deleted; whether the waiters are woken.
    pub fn deleted(&mut self, o: &K) -> bool {
        Arc::make_mut(&mut self.reflection.objects)
            .remove(&name(o))
            .is_some()
    }
}

fn name<K: kube::Resource>(o: &K) -> String {
    o.meta().name.clone().unwrap_or_default()
}

/// What to list and watch: an `Api`, its selectors, and how a failed list names it.
pub struct Source<K> {
    pub api: Api<K>,
    pub labels: String,
    pub fields: Option<String>,
    /// The objects as a failed list names them (e.g. "leases in namespace ginx-system").
    pub resource: String,
}

/// A running reflector; dropping it stops the list and watch.
pub struct Reflector<V> {
    rx: watch::Receiver<Reflection<V>>,
    task: tokio::task::JoinHandle<()>,
}

impl<V> Drop for Reflector<V> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl<V: Clone + Send + Sync + 'static> Reflector<V> {
    /// Starts listing and watching `source`, keeping what `projection` keeps; a change that
    /// wakes bumps `changes`.
    pub fn start<K>(
        source: Source<K>,
        projection: Projection<K, V>,
        changes: watch::Sender<u64>,
    ) -> Self
    where
        K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
    {
        let (tx, rx) = watch::channel(Reflection::default());
        let task = tokio::spawn(run(source, Store::new(projection), tx, changes));
        Reflector { rx, task }
    }

    /// Follows the objects: the receiver sees every reflection handed out from now on.
    pub fn subscribe(&self) -> watch::Receiver<Reflection<V>> {
        self.rx.clone()
    }

    /// The objects as last seen.
    pub fn now(&self) -> Reflection<V> {
        self.rx.borrow().clone()
    }

    /// The objects once the first list answered (or failed), waiting at most `within` for it.
    pub async fn first(&self, within: Duration) -> Reflection<V> {
        let mut rx = self.rx.clone();
        let listed = rx.wait_for(|r| r.listed != Listed::NotYet);
        match tokio::time::timeout(within, listed).await {
            Ok(Ok(r)) => r.clone(),
            _ => self.now(),
        }
    }
}

/// What of an object wakes the waiters of [`watch_objects`] (`None`: any change).
pub type Wake<K> = Option<fn(&K) -> Option<String>>;

/// A reflector nobody reads, for its wake-ups alone: its first list, and every change of the
/// objects after it (or, with `wake`, of what `wake` says of one, and every object added or
/// deleted) bumps `changes`. Runs until dropped.
pub async fn watch_objects<K>(
    api: Api<K>,
    labels: String,
    fields: Option<String>,
    changes: watch::Sender<u64>,
    wake: Wake<K>,
) where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
    K::DynamicType: Default,
{
    let keep = match wake {
        Some(key) => key,
        None => |o: &K| o.meta().resource_version.clone(),
    };
    let projection = Projection {
        keep,
        wakes: |a: &String, b: &String| a != b,
    };
    let source = Source {
        api,
        labels,
        fields,
        resource: K::plural(&Default::default()).into_owned(),
    };
    let (tx, _) = watch::channel(Reflection::default());
    let mut store = Store::new(projection);
    store.first_wakes = true;
    run(source, store, tx, changes).await;
}

/// List, then watch from the list's `resourceVersion`, forever.
async fn run<K, V>(
    source: Source<K>,
    mut store: Store<K, V>,
    tx: watch::Sender<Reflection<V>>,
    changes: watch::Sender<u64>,
) where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
    V: Clone + Send + Sync + 'static,
{
    let mut failures = 0u32;
    let mut from: Option<String> = None;
    loop {
        let rv = match from.take() {
            Some(rv) => rv,
            None => match list(&source, &mut store, &tx, &changes).await {
                Ok(rv) => rv,
                Err(()) => {
                    failures = failures.saturating_add(1);
                    tokio::time::sleep(backoff(failures)).await;
                    continue;
                }
            },
        };
        match follow(&source, rv, &mut store, &tx, &changes).await {
            Ok(next) => {
                failures = 0;
                from = next;
            }
            Err(e) => {
                // A watch refused (RBAC without `watch`) is told like a refused list: the
                // objects would otherwise go stale without anyone knowing.
                store.failed(e);
                publish(&tx, &store.reflection, &changes, true);
                failures = failures.saturating_add(1);
                tokio::time::sleep(backoff(failures)).await;
            }
        }
    }
}

/// The pause after `failures` failed lists or watches in a row.
fn backoff(failures: u32) -> Duration {
    crate::util::backoff(
        Duration::from_millis(500),
        Duration::from_secs(10),
        failures,
    )
}

fn publish<V: Clone>(
    tx: &watch::Sender<Reflection<V>>,
    r: &Reflection<V>,
    changes: &watch::Sender<u64>,
    wakes: bool,
) {
    tx.send_replace(r.clone());
    if wakes {
        changes.send_modify(|n| *n = n.wrapping_add(1));
    }
}

/// Lists the objects into the store: the `resourceVersion` to watch from.
async fn list<K, V>(
    source: &Source<K>,
    store: &mut Store<K, V>,
    tx: &watch::Sender<Reflection<V>>,
    changes: &watch::Sender<u64>,
) -> Result<String, ()>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
    V: Clone,
{
    let mut lp = ListParams::default().labels(&source.labels);
    if let Some(f) = &source.fields {
        lp = lp.fields(f);
    }
    match source.api.list(&lp).await {
        Ok(list) => {
            let wakes = store.listed(&list.items);
            tracing::debug!(resource = %source.resource, objects = list.items.len(), wakes, "listed for a watch");
            publish(tx, &store.reflection, changes, wakes);
            Ok(list.metadata.resource_version.unwrap_or_default())
        }
        Err(e) => {
            tracing::debug!(error = %describe(&e), resource = %source.resource, "list for a watch failed");
            store.failed(ApiError::new("list", &source.resource, &e));
            // A failed list wakes the waiters: they answer with it instead of waiting on.
            publish(tx, &store.reflection, changes, true);
            Err(())
        }
    }
}

/// Watches from `rv` until the server ends the watch: the `resourceVersion` to go on from
/// when it ended cleanly, `None` when a relist is needed; `Err` when the watch was refused.
async fn follow<K, V>(
    source: &Source<K>,
    rv: String,
    store: &mut Store<K, V>,
    tx: &watch::Sender<Reflection<V>>,
    changes: &watch::Sender<u64>,
) -> Result<Option<String>, ApiError>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
    V: Clone,
{
    let mut wp = WatchParams::default()
        .labels(&source.labels)
        .timeout(WATCH_SECONDS);
    if let Some(f) = &source.fields {
        wp = wp.fields(f);
    }
    let stream = match source.api.watch(&wp, &rv).await {
        Ok(s) => s,
        Err(e) => {
            tracing::debug!(error = %describe(&e), resource = %source.resource, "watch failed");
            let e = ApiError::new("watch", &source.resource, &e);
            if !e.is_unavailable() {
                return Err(e);
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
            return Ok(None);
        }
    };
    let mut stream = std::pin::pin!(stream);
    let mut last = rv;
    while let Some(event) = stream.next().await {
        let wakes = match event {
            Ok(WatchEvent::Added(o) | WatchEvent::Modified(o)) => {
                last = o.meta().resource_version.clone().unwrap_or(last);
                store.seen(&o)
            }
            Ok(WatchEvent::Deleted(o)) => {
                last = o.meta().resource_version.clone().unwrap_or(last);
                store.deleted(&o)
            }
            Ok(WatchEvent::Bookmark(b)) => {
                last = b.metadata.resource_version;
                continue;
            }
            Ok(WatchEvent::Error(e)) => {
                tracing::debug!(code = e.code, status_message = %e.message, "watch ended");
                return Ok(None);
            }
            Err(e) => {
                tracing::debug!(error = %describe(&e), "watch stream broke");
                return Ok(None);
            }
        };
        tracing::debug!(resource = %source.resource, wakes, "watch event");
        publish(tx, &store.reflection, changes, wakes);
    }
    Ok(Some(last))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;

    fn cm(name: &str, value: &str) -> ConfigMap {
        let mut c = ConfigMap::default();
        c.metadata.name = Some(name.into());
        c.data = Some([("k".to_owned(), value.to_owned())].into());
        c
    }

    /// Keeps the value of `k`, drops objects without one; a change of its first letter wakes.
    fn projection() -> Projection<ConfigMap, String> {
        Projection {
            keep: |c| c.data.as_ref()?.get("k").cloned(),
            wakes: |a, b| a.chars().next() != b.chars().next(),
        }
    }

    #[test]
    fn a_list_wakes_when_what_wakes_changed_or_after_a_failure() {
        let mut s = Store::new(projection());
        assert_eq!(s.reflection.current().unwrap_err(), None);
        assert!(
            !s.listed(&[cm("a", "x1")]),
            "the first list: readers wait for it"
        );
        assert!(!s.listed(&[cm("a", "x2")]), "nothing that wakes changed");
        assert_eq!(
            s.reflection.current().unwrap()["a"],
            "x2",
            "kept all the same"
        );
        assert!(s.listed(&[cm("a", "y")]));
        assert!(s.listed(&[cm("a", "y"), cm("b", "y")]), "one more");
        assert!(s.listed(&[cm("b", "y")]), "one fewer");
    }

    #[test]
    fn events_change_the_map_and_wake_only_as_the_projection_says() {
        let mut s = Store::new(projection());
        s.listed(&[]);
        assert!(s.seen(&cm("a", "x1")), "added");
        assert!(!s.seen(&cm("a", "x2")), "changed, not in what wakes");
        assert_eq!(s.reflection.objects["a"], "x2");
        assert!(s.seen(&cm("a", "z")));
        assert!(
            s.seen(&ConfigMap {
                metadata: cm("a", "").metadata,
                ..ConfigMap::default()
            }),
            "no longer kept: removed"
        );
        assert!(s.reflection.objects.is_empty());
        assert!(!s.deleted(&cm("a", "z")), "already gone");
        s.seen(&cm("b", "x"));
        assert!(s.deleted(&cm("b", "x")));
    }

    #[test]
    fn a_failed_list_is_told_and_the_last_good_objects_are_kept() {
        let mut s = Store::new(projection());
        s.listed(&[cm("a", "x")]);
        let e = ApiError::Unavailable {
            what: "cannot list configmaps".into(),
            detail: "connection refused".into(),
        };
        s.failed(e.clone());
        assert_eq!(s.reflection.current().unwrap_err(), Some(&e));
        assert_eq!(s.reflection.objects["a"], "x");
        assert!(
            s.listed(&[cm("a", "x")]),
            "waiters answered with the failure"
        );
        assert!(s.reflection.current().is_ok());
    }

    /// A reflection handed out stays as it was while the store goes on.
    #[test]
    fn a_reflection_handed_out_does_not_change() {
        let mut s = Store::new(projection());
        s.listed(&[cm("a", "x")]);
        let kept = s.reflection.clone();
        s.seen(&cm("b", "y"));
        s.deleted(&cm("a", "x"));
        assert_eq!(kept.objects.len(), 1);
        assert_eq!(kept.objects["a"], "x");
        assert_eq!(s.reflection.objects.len(), 1);
        assert!(s.reflection.objects.contains_key("b"));
    }
}
