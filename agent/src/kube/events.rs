//! Kubernetes Events about this Node (`events.k8s.io/v1`), from the node's notices.
//!
//! Where the kubelet writes its node Events: namespace `default`, `regarding` the Node with
//! `uid` = the node's name (the kubelet's convention, which `kubectl describe node` searches),
//! `reportingController` `ginx.io/ginx`, `reportingInstance` the node's name. Written with
//! ginx's own identity (`kubernetes.kubeconfig`); rbac.yaml grants it `create` and `patch` on
//! `events.k8s.io` Events in `default`, and vap.yaml lets a node write only Events regarding
//! itself, reported by itself.
//!
//! A repeat of an Event (same reason and message) within [`SERIES_FINISH`] of the last one is
//! counted in its `series`, as client-go's `tools/events` recorder does, not written again: the
//! count is patched at most every [`SERIES_FLUSH`] (client-go waits for a 30-minute heartbeat;
//! an operator wants the count sooner). Unlike client-go, the message is part of what makes a
//! repeat: a new revision is a new Event, not a count on the old one's.
//!
//! Writes are rate-limited (a bucket of [`BURST`], one more every [`REFILL`]) and run in this
//! task only: emitting a notice never waits for the API. While the API is away, or the bucket
//! empty, at most [`BACKLOG`] new Events wait; beyond that the oldest are dropped and counted
//! (`ginx_events_total{result="dropped"}`).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, Patch};
use tokio::sync::{broadcast, watch};

use crate::config::Config;
use crate::k8s::{KubeClients, describe, patch_params, post_params, refusal, unavailable};
use crate::metrics::Metrics;
use crate::types::{Notice, Reason};

/// Where node Events go (the Node is cluster-scoped; the kubelet writes its own here).
pub const NAMESPACE: &str = "default";
/// `reportingController` of every Event ginx writes.
pub const CONTROLLER: &str = "ginx.io/ginx";
/// A series ends this long after its last occurrence (client-go's `finishTime`).
pub const SERIES_FINISH: Duration = Duration::from_secs(6 * 60);
/// A series' count is patched at most this often.
pub const SERIES_FLUSH: Duration = Duration::from_secs(10);
/// Writes allowed at once, and how fast more come.
pub const BURST: u32 = 25;
pub const REFILL: Duration = Duration::from_secs(10);
/// New Events kept while they cannot be written.
pub const BACKLOG: usize = 100;
/// `note` is limited to 1 kB by the API.
const NOTE_MAX: usize = 1000;
/// First wait after a write failed because the API is away; doubles up to a minute.
const RETRY_BASE: Duration = Duration::from_secs(2);

type Key = (Reason, String);

/// One Event as ginx keeps it.
#[derive(Clone, Debug)]
struct Series {
    name: String,
    reason: Reason,
    note: String,
    first: jiff::Timestamp,
    /// Occurrences, and how many the API has.
    count: u32,
    written: u32,
    /// The last occurrence (monotonic, for the series' end; wall, for `lastObservedTime`).
    last: Instant,
    last_wall: jiff::Timestamp,
    /// When the count was last patched.
    flushed: Option<Instant>,
}

/// What to write next.
#[derive(Clone, Debug, PartialEq)]
pub enum Write {
    Create(Key),
    Patch(Key),
}

/// The Events of one node and what of them is written: pure (the monotonic time is handed in),
/// so the series, the limit and the backlog are unit-tested without an API.
pub struct Book {
    node: String,
    series: HashMap<Key, Series>,
    /// Events not created yet, oldest first.
    queue: VecDeque<Key>,
    tokens: f64,
    refilled: Instant,
    seq: u64,
    /// Dropped since the caller last asked (see [`Book::take_dropped`]).
    dropped: u64,
}

impl Book {
    pub fn new(node: &str, now: Instant) -> Self {
        Self {
            node: node.to_owned(),
            series: HashMap::new(),
            queue: VecDeque::new(),
            tokens: f64::from(BURST),
            refilled: now,
            seq: 0,
            dropped: 0,
        }
    }

    /// Takes a notice in: a repeat counts in its series, anything else waits to be created.
    pub fn note(&mut self, n: &Notice, now: Instant) {
        let note = cut(&n.message);
        let key = (n.reason, note.clone());
        if let Some(s) = self.series.get_mut(&key)
            && now.duration_since(s.last) < SERIES_FINISH
        {
            s.count += 1;
            s.last = now;
            s.last_wall = n.at;
            return;
        }
        if self.series.remove(&key).is_some() {
            self.queue.retain(|k| *k != key);
        }
        self.seq += 1;
        let name = format!(
            "{}.{:x}{:04x}",
            self.node,
            n.at.as_nanosecond() as u64,
            self.seq & 0xffff
        );
        self.series.insert(
            key.clone(),
            Series {
                name,
                reason: n.reason,
                note,
                first: n.at,
                count: 1,
                written: 0,
                last: now,
                last_wall: n.at,
                flushed: None,
            },
        );
        self.queue.push_back(key);
        while self.queue.len() > BACKLOG {
            if let Some(old) = self.queue.pop_front() {
                self.series.remove(&old);
                self.dropped += 1;
            }
        }
    }

    fn refill(&mut self, now: Instant) {
        let earned = now.duration_since(self.refilled).as_secs_f64() / REFILL.as_secs_f64();
        self.tokens = (self.tokens + earned).min(f64::from(BURST));
        self.refilled = now;
    }

    /// The next write due now and allowed by the limit (a token is spent), or `None` and
    /// when to look again.
    pub fn next(&mut self, now: Instant) -> Result<Write, Option<Instant>> {
        self.refill(now);
        // Series over and fully written are forgotten: the next occurrence is a new Event.
        // (Queued ones are not written at all, so they stay.)
        self.series
            .retain(|_, s| now.duration_since(s.last) < SERIES_FINISH || s.written < s.count);
        let create = self.queue.front().cloned();
        let patch = self
            .series
            .iter()
            .filter(|(k, s)| s.written > 0 && s.count > s.written && !self_queued(&self.queue, k))
            .map(|(k, s)| (k, s.flushed.map_or(now, |f| f + SERIES_FLUSH)))
            .min_by_key(|(_, due)| *due)
            .map(|(k, due)| (k.clone(), due));
        let want = match (create, patch) {
            (Some(k), _) => Some((Write::Create(k), now)),
            (None, Some((k, due))) => Some((Write::Patch(k), due)),
            (None, None) => None,
        };
        let Some((write, due)) = want else {
            // Look again when the oldest live series ends.
            return Err(self.series.values().map(|s| s.last + SERIES_FINISH).min());
        };
        if due > now {
            return Err(Some(due));
        }
        if self.tokens < 1.0 {
            let wait = REFILL.mul_f64(1.0 - self.tokens);
            return Err(Some(now + wait));
        }
        self.tokens -= 1.0;
        Ok(write)
    }

    /// The Event (or its series patch) for `write`.
    pub fn event(&self, write: &Write) -> Option<(String, Event)> {
        let key = match write {
            Write::Create(k) | Write::Patch(k) => k,
        };
        let s = self.series.get(key)?;
        let series = (s.count > 1).then(|| EventSeries {
            count: i32::try_from(s.count).unwrap_or(i32::MAX),
            last_observed_time: MicroTime(s.last_wall),
        });
        let event = Event {
            metadata: ObjectMeta {
                name: Some(s.name.clone()),
                namespace: Some(NAMESPACE.to_owned()),
                ..ObjectMeta::default()
            },
            event_time: Some(MicroTime(s.first)),
            action: Some(s.reason.action().to_owned()),
            reason: Some(s.reason.as_str().to_owned()),
            note: Some(s.note.clone()),
            type_: Some(
                if s.reason.warning() {
                    "Warning"
                } else {
                    "Normal"
                }
                .to_owned(),
            ),
            regarding: Some(ObjectReference {
                api_version: Some("v1".to_owned()),
                kind: Some("Node".to_owned()),
                name: Some(self.node.clone()),
                uid: Some(self.node.clone()),
                ..ObjectReference::default()
            }),
            reporting_controller: Some(CONTROLLER.to_owned()),
            reporting_instance: Some(self.node.clone()),
            series,
            ..Event::default()
        };
        Some((s.name.clone(), event))
    }

    /// `write` is done: the API has the count it was sent with.
    pub fn written(&mut self, write: &Write, now: Instant) {
        match write {
            Write::Create(k) => {
                self.queue.retain(|q| q != k);
                if let Some(s) = self.series.get_mut(k) {
                    s.written = s.count;
                    s.flushed = Some(now);
                }
            }
            Write::Patch(k) => {
                if let Some(s) = self.series.get_mut(k) {
                    s.written = s.count;
                    s.flushed = Some(now);
                }
            }
        }
    }

    /// The Event behind a patch is gone (expired by the API's TTL): it is created again.
    pub fn recreate(&mut self, write: &Write) {
        if let Write::Patch(k) = write
            && self.series.contains_key(k)
        {
            self.queue.push_back(k.clone());
        }
    }

    /// `write` was refused: it is given up.
    pub fn refused(&mut self, write: &Write) {
        let (Write::Create(k) | Write::Patch(k)) = write;
        self.queue.retain(|q| q != k);
        self.series.remove(k);
    }

    /// A write failed for a while (the API away): its token comes back.
    pub fn retry(&mut self) {
        self.tokens = (self.tokens + 1.0).min(f64::from(BURST));
    }

    pub fn take_dropped(&mut self) -> u64 {
        std::mem::take(&mut self.dropped)
    }
}

fn self_queued(queue: &VecDeque<Key>, k: &Key) -> bool {
    queue.contains(k)
}

/// The message as a one-line note within the API's limit (cut on a character boundary).
fn cut(message: &str) -> String {
    let one: String = message
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if one.len() <= NOTE_MAX {
        return one;
    }
    let mut end = NOTE_MAX - 3;
    while !one.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &one[..end])
}

/// The recorder task.
pub struct Recorder {
    pub config: watch::Receiver<Arc<Config>>,
    pub clients: watch::Receiver<Option<KubeClients>>,
    pub notices: broadcast::Receiver<Notice>,
    pub metrics: Arc<Metrics>,
    pub shutdown: watch::Receiver<bool>,
}

impl Recorder {
    pub async fn run(mut self) {
        let node = self.config.borrow().node_name().to_owned();
        let mut book = Book::new(&node, Instant::now());
        let mut wake: Option<Instant> = None;
        let mut writer = Writer {
            metrics: Arc::clone(&self.metrics),
            failures: 0,
            said_refused: false,
        };
        loop {
            if !self.wait(&mut book, wake).await {
                return;
            }
            let dropped = book.take_dropped();
            if dropped > 0 {
                self.metrics.events("dropped", dropped);
            }
            let client = self.clients.borrow().as_ref().map(|c| c.main.clone());
            let Some(client) = client else {
                // Kept until the clients come (the change wakes this loop).
                wake = None;
                continue;
            };
            let api: Api<Event> = Api::namespaced(client, NAMESPACE);
            wake = writer.flush(&api, &mut book).await;
        }
    }

    /// Waits for a notice (noted in `book` while Events are on), for `wake`, or for new
    /// clients. `false`: the recorder is to stop.
    async fn wait(&mut self, book: &mut Book, wake: Option<Instant>) -> bool {
        let sleep = async {
            match wake {
                Some(t) => tokio::time::sleep_until(t.into()).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            n = self.notices.recv() => match n {
                Ok(n) => {
                    if self.config.borrow().kubernetes.events {
                        book.note(&n, Instant::now());
                    }
                }
                Err(broadcast::error::RecvError::Lagged(k)) => {
                    self.metrics.events("dropped", k);
                    tracing::debug!(dropped = k, "node Events fell behind the notices");
                }
                Err(broadcast::error::RecvError::Closed) => return false,
            },
            () = sleep => {}
            r = self.clients.changed() => if r.is_err() { return false; },
            _ = self.shutdown.changed() => return false,
        }
        true
    }
}

/// Writes the Events a [`Book`] has due, remembering between flushes how writing went.
struct Writer {
    metrics: Arc<Metrics>,
    /// Consecutive writes the API was not there for.
    failures: u32,
    /// A refusal was logged already: it is said once, not per Event.
    said_refused: bool,
}

impl Writer {
    /// Writes everything `book` has due now. Returns when to come back: the next write's time,
    /// a backoff while the API is away, `None` when nothing waits.
    async fn flush(&mut self, api: &Api<Event>, book: &mut Book) -> Option<Instant> {
        loop {
            let write = match book.next(Instant::now()) {
                Ok(w) => w,
                Err(at) => return at,
            };
            let Some((name, event)) = book.event(&write) else {
                book.refused(&write);
                continue;
            };
            match send(api, &write, &name, &event).await {
                Ok(what) => {
                    self.failures = 0;
                    book.written(&write, Instant::now());
                    self.metrics.events(what, 1);
                }
                Err(e) if matches!(write, Write::Patch(_)) && crate::k8s::code(&e) == Some(404) => {
                    book.recreate(&write);
                }
                Err(e) if unavailable(&e) => {
                    book.retry();
                    self.failures += 1;
                    tracing::debug!(error = %describe(&e), "cannot write a node Event yet");
                    return Some(
                        Instant::now()
                            + crate::util::backoff(
                                RETRY_BASE,
                                Duration::from_secs(60),
                                self.failures,
                            ),
                    );
                }
                Err(e) => {
                    book.refused(&write);
                    self.metrics.events("failed", 1);
                    if !self.said_refused {
                        self.said_refused = true;
                        tracing::warn!(error = %refusal("create", "events.k8s.io events in default", &e),
                            "cannot write node Events (said once)");
                    }
                }
            }
        }
    }
}

/// Creates `event`, or patches its series into the Event `name`; says which it did.
async fn send(
    api: &Api<Event>,
    write: &Write,
    name: &str,
    event: &Event,
) -> Result<&'static str, kube::Error> {
    match write {
        Write::Create(_) => api.create(&post_params(), event).await.map(|_| "created"),
        Write::Patch(_) => {
            let body = serde_json::json!({ "series": event.series });
            api.patch(name, &patch_params(), &Patch::Merge(&body))
                .await
                .map(|_| "patched")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn notice(reason: Reason, message: &str) -> Notice {
        Notice {
            reason,
            message: message.to_owned(),
            revision: None,
            at: jiff::Timestamp::from_second(1_800_000_000).unwrap(),
        }
    }

    #[test]
    fn a_repeat_is_counted_in_its_series_and_patched_at_most_every_flush() {
        let t0 = Instant::now();
        let mut b = Book::new("lucy", t0);
        let n = notice(Reason::DrainBlocked, "eviction of web-1 refused by web-pdb");
        b.note(&n, t0);
        let w = b.next(t0).unwrap();
        assert!(matches!(w, Write::Create(_)));
        let (name, e) = b.event(&w).unwrap();
        assert!(name.starts_with("lucy."), "{name}");
        assert_eq!(e.type_.as_deref(), Some("Warning"));
        assert_eq!(e.action.as_deref(), Some("Drain"));
        assert_eq!(e.reporting_controller.as_deref(), Some(CONTROLLER));
        assert_eq!(e.reporting_instance.as_deref(), Some("lucy"));
        let r = e.regarding.unwrap();
        assert_eq!(
            (r.kind.as_deref(), r.name.as_deref(), r.uid.as_deref()),
            (Some("Node"), Some("lucy"), Some("lucy"))
        );
        assert!(e.series.is_none());
        b.written(&w, t0);
        // Two repeats: one patch, not before the flush interval, counting both.
        b.note(&n, t0 + Duration::from_secs(1));
        b.note(&n, t0 + Duration::from_secs(2));
        assert_eq!(
            b.next(t0 + Duration::from_secs(3)),
            Err(Some(t0 + SERIES_FLUSH))
        );
        let w = b.next(t0 + SERIES_FLUSH).unwrap();
        assert!(matches!(w, Write::Patch(_)));
        let (same, e) = b.event(&w).unwrap();
        assert_eq!(same, name);
        assert_eq!(e.series.unwrap().count, 3);
        b.written(&w, t0 + SERIES_FLUSH);
        assert!(b.next(t0 + SERIES_FLUSH).is_err());
        // Another message is another Event; after the series ends, the same one is new too.
        b.note(
            &notice(Reason::DrainBlocked, "eviction of web-2 refused by web-pdb"),
            t0 + SERIES_FLUSH,
        );
        let w2 = b.next(t0 + SERIES_FLUSH).unwrap();
        assert!(matches!(w2, Write::Create(_)));
        b.written(&w2, t0 + SERIES_FLUSH);
        let later = t0 + Duration::from_secs(2) + SERIES_FINISH + Duration::from_secs(1);
        b.note(&n, later);
        let w = b.next(later).unwrap();
        let (other, e) = b.event(&w).unwrap();
        assert!(matches!(w, Write::Create(_)) && other != name && e.series.is_none());
    }

    #[test]
    fn writes_are_limited_to_a_burst_then_one_per_refill_and_the_backlog_drops_the_oldest() {
        let t0 = Instant::now();
        let mut b = Book::new("lucy", t0);
        for i in 0..(BURST as usize + BACKLOG + 5) {
            b.note(&notice(Reason::Applied, &format!("applied {i}")), t0);
        }
        assert_eq!(b.take_dropped(), BURST as u64 + 5);
        let mut writes = 0;
        while let Ok(w) = b.next(t0) {
            b.written(&w, t0);
            writes += 1;
        }
        assert_eq!(writes, BURST);
        // The oldest kept is number BURST + 5; the next write waits a refill.
        assert_eq!(b.next(t0), Err(Some(t0 + REFILL)));
        let w = b.next(t0 + REFILL).unwrap();
        assert_eq!(
            b.event(&w).unwrap().1.note.as_deref(),
            Some(format!("applied {}", 2 * BURST as usize + 5).as_str())
        );
    }

    #[test]
    fn a_note_is_one_line_within_the_limit() {
        assert_eq!(cut("a\nb"), "a b");
        let long = "é".repeat(800);
        let c = cut(&long);
        assert!(c.len() <= NOTE_MAX && c.ends_with("..."), "{}", c.len());
    }
}
