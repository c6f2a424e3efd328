//! The reporter task: keeps a client from the kubeconfig (rebuilt when the file appears or
//! changes), renews the heartbeat every `renew_interval` (±5%), and writes annotations and the
//! condition when what they describe changes, plus a full resync every `resync_interval`.
//!
//! When the API goes away: local work goes on, renewals back off (capped at the renew
//! interval), one log line per change of state; when it comes back the current values are
//! written after a fresh read of the Node — no backlog is replayed.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use tokio::sync::watch;

use super::report::{self, NodeReport, Written};
use crate::config::Config;
use crate::k8s::heartbeat::{Heartbeat, Marks, RenewError};
use crate::k8s::{KubeClients, code, describe};
use crate::metrics::Metrics;
use crate::status::{KubeState, KubeStatus, Parts, Status};
use crate::types::PlanMark;
use crate::util;

/// First wait after a failed renewal; doubles up to the renew interval.
const RETRY_BASE: Duration = Duration::from_secs(1);
/// Changes arriving within this are written together.
const DEBOUNCE: Duration = Duration::from_millis(300);

pub struct Reporter {
    pub config: watch::Receiver<Arc<Config>>,
    /// What the node report is written from.
    pub parts: Parts,
    pub clients: watch::Sender<Option<KubeClients>>,
    pub status: watch::Sender<KubeStatus>,
    pub metrics: Arc<Metrics>,
    pub shutdown: watch::Receiver<bool>,
}

/// What the reporter keeps between ticks.
#[derive(Default)]
struct Session {
    /// The kubeconfig version the clients were built from.
    stamp: Option<(std::time::SystemTime, u64)>,
    /// The files the node's own identity came from, and their versions then.
    node_files: Vec<std::path::PathBuf>,
    node_stamps: Vec<Option<(std::time::SystemTime, u64)>>,
    heartbeat: Option<Heartbeat>,
    /// The node report, written with the node's own identity; or why there is none.
    node: Option<Result<NodeReport, String>>,
    /// ginx's annotations as last written (or read); `None`: read the Node first.
    annotations: Option<BTreeMap<String, String>>,
    condition: Option<Written>,
    last_resync: Option<Instant>,
    failures: u32,
}

impl Reporter {
    pub async fn run(mut self) {
        let mut session = Session::default();
        let mut published = self.parts.published.clone();
        let mut sources = self.parts.sources.clone();
        let mut health = self.parts.health.clone();
        let mut previews = self.parts.previews.clone();
        let mut next = Instant::now();
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(next.into()) => {
                    let wait = self.tick(&mut session).await;
                    next = Instant::now() + wait;
                }
                r = published.changed() => {
                    if r.is_err() { return; }
                    self.changed(&mut session).await;
                }
                r = sources.changed() => {
                    if r.is_err() { return; }
                    self.changed(&mut session).await;
                }
                r = health.changed() => {
                    if r.is_err() { return; }
                    self.changed(&mut session).await;
                }
                r = previews.changed() => {
                    if r.is_err() { return; }
                    self.changed(&mut session).await;
                }
                r = self.config.changed() => {
                    if r.is_err() { return; }
                    // Rebuild everything from the new settings at once.
                    session = Session::default();
                    self.drop_clients();
                    next = Instant::now();
                }
                _ = self.shutdown.changed() => return,
            }
        }
    }

    /// Forgets the clients; wakes the probes and the kubeadm watcher only if there were some.
    fn drop_clients(&self) {
        self.clients.send_if_modified(|c| c.take().is_some());
    }

    fn cfg(&self) -> Arc<Config> {
        Arc::clone(&self.config.borrow())
    }

    fn set_state(&self, state: KubeState, error: Option<String>) {
        let now = util::now();
        self.status.send_if_modified(|s| {
            if s.state == state && s.error == error {
                return false;
            }
            match (&error, state) {
                // Still unreachable, another transport error (a reset after a TLS EOF): status
                // shows it; the log keeps one line per change of state.
                (Some(e), KubeState::Unreachable) if s.state == state => {
                    tracing::debug!(state = state.as_str(), error = %e, "kubernetes")
                }
                (Some(e), _) => tracing::warn!(state = state.as_str(), error = %e, "kubernetes"),
                (None, KubeState::Connected) => {
                    tracing::info!("kubernetes: connected; heartbeat renewed")
                }
                (None, _) => tracing::info!(state = state.as_str(), "kubernetes"),
            }
            if s.state != state {
                s.since = Some(now);
            }
            s.state = state;
            s.error = error;
            true
        });
    }

    /// Makes sure there is a client for the current kubeconfig; `false` when there cannot be.
    async fn ensure_client(&self, session: &mut Session) -> bool {
        let cfg = self.cfg();
        let Some(path) = &cfg.kubernetes.kubeconfig else {
            self.set_state(KubeState::NotConfigured, None);
            return false;
        };
        let Some(stamp) = super::stamp(path) else {
            self.set_state(
                KubeState::NotConfigured,
                Some(format!("waiting for the kubeconfig {}", path.display())),
            );
            *session = Session::default();
            self.drop_clients();
            return false;
        };
        if session.heartbeat.is_some()
            && session.stamp == Some(stamp)
            && super::stamps(&session.node_files) == session.node_stamps
        {
            return true;
        }
        match super::connect(&cfg, &self.metrics).await {
            Ok(clients) => {
                let k = &cfg.kubernetes;
                let node = cfg.node_name().to_owned();
                let lease = k.lease_name_for(&node);
                self.status
                    .send_modify(|s| s.lease = Some(format!("{}/{lease}", k.namespace)));
                session.heartbeat = Some(Heartbeat::new(
                    kube::Api::<Lease>::namespaced(clients.main.clone(), &k.namespace),
                    lease,
                    node.clone(),
                    i32::try_from(k.lease_duration.get().as_secs()).unwrap_or(i32::MAX),
                    clients.clock.clone(),
                ));
                session.node = Some(
                    clients
                        .node()
                        .map(|c| {
                            NodeReport::new(
                                kube::Api::<Node>::all(c),
                                node,
                                k.annotation_prefix.clone(),
                                k.condition_type.clone(),
                            )
                        })
                        .map_err(|e| e.to_string()),
                );
                session.annotations = None;
                session.condition = None;
                session.stamp = Some(stamp);
                session.node_files = super::credential_files(&k.node_kubeconfig);
                session.node_stamps = super::stamps(&session.node_files);
                let _ = self.clients.send(Some(clients));
                if self.status.borrow().state == KubeState::NotConfigured {
                    self.set_state(KubeState::Connecting, None);
                }
                true
            }
            Err(e) => {
                self.set_state(KubeState::Refused, Some(e.to_string()));
                self.drop_clients();
                false
            }
        }
    }

    /// One heartbeat; returns how long to wait for the next.
    async fn tick(&self, session: &mut Session) -> Duration {
        let cfg = self.cfg();
        let interval = cfg.kubernetes.renew_interval.get();
        if !self.ensure_client(session).await {
            return interval;
        }
        let Some(hb) = session.heartbeat.as_mut() else {
            return interval;
        };
        hb.set_marks(marks(&self.parts.status()));
        match hb.renew().await {
            Ok(()) => {
                let was_failing = session.failures > 0;
                session.failures = 0;
                let now = util::now();
                self.metrics.heartbeat_succeeded(now);
                self.status.send_modify(|s| s.last_heartbeat = Some(now));
                self.set_state(KubeState::Connected, None);
                if was_failing {
                    // Whatever we wrote before may be stale now: read the Node again.
                    session.annotations = None;
                    session.condition = None;
                }
                let resync_due = session
                    .last_resync
                    .is_none_or(|t| t.elapsed() >= cfg.kubernetes.resync_interval.get());
                self.report(session, resync_due).await;
                util::jitter(interval, 0.05)
            }
            Err(e) => {
                hb.forget();
                session.failures = session.failures.saturating_add(1);
                let (state, message) = self.classify(&cfg, &e);
                self.set_state(state, Some(message));
                util::jitter(util::backoff(RETRY_BASE, interval, session.failures), 0.1)
            }
        }
    }

    fn classify(&self, cfg: &Config, e: &RenewError) -> (KubeState, String) {
        let k = &cfg.kubernetes;
        let lease = format!("{}/{}", k.namespace, k.lease_name_for(cfg.node_name()));
        match e {
            RenewError::Conflict { .. } => (
                KubeState::Unreachable,
                format!("lease {lease} kept changing under ginx (another writer?)"),
            ),
            RenewError::Unavailable { detail, .. } => (KubeState::Unreachable, detail.clone()),
            RenewError::Policy { detail, .. } => (
                KubeState::Refused,
                format!(
                    "refused by an admission policy: {detail}; packaging/kubernetes/vap.yaml lets \
                     a node write only its own heartbeat, {lease}"
                ),
            ),
            RenewError::Refused { status, detail, .. } => match status {
                Some(401) => (
                    KubeState::Refused,
                    format!(
                        "the API server rejects ginx's credentials ({}): {detail}; renew the \
                         kubeconfig",
                        k.kubeconfig
                            .as_deref()
                            .map(|p| p.display().to_string())
                            .unwrap_or_default(),
                    ),
                ),
                Some(403) => (
                    KubeState::Refused,
                    format!(
                        "forbidden: {detail}; ginx needs get/create/update on leases in {} — apply \
                         packaging/kubernetes/rbac.yaml",
                        k.namespace
                    ),
                ),
                Some(404) => (
                    KubeState::Refused,
                    format!(
                        "{detail}; does namespace {} exist? apply packaging/kubernetes/rbac.yaml",
                        k.namespace
                    ),
                ),
                _ => (KubeState::Unreachable, detail.clone()),
            },
        }
    }

    async fn changed(&self, session: &mut Session) {
        if session.heartbeat.is_none() || session.failures > 0 {
            return;
        }
        tokio::time::sleep(DEBOUNCE).await;
        // A passed gate is told to the groups that come after this one at once, not a renewal
        // later, and so is a new plan: one extra write per revision.
        let status = self.parts.status();
        if let Some(hb) = session.heartbeat.as_mut()
            && hb.set_marks(marks(&status))
            && let Err(e) = hb.renew().await
        {
            tracing::debug!(error = ?e, "cannot write the passed revision on the heartbeat now; the next renewal does");
        }
        self.report(session, false).await;
    }

    /// Writes annotations and the condition if they differ from what the Node has.
    async fn report(&self, session: &mut Session, resync: bool) {
        let cfg = self.cfg();
        let node = match session.node.as_ref() {
            None => return,
            Some(Ok(node)) => node,
            Some(Err(e)) => {
                self.report_unable(e.clone());
                return;
            }
        };
        let status = self.parts.status();
        let desired = report::annotations(&status, &cfg.kubernetes.annotation_prefix);
        let condition = report::node_condition(&status);
        if resync || session.annotations.is_none() {
            match node.read().await {
                Ok(Some((annotations, written))) => {
                    session.annotations = Some(annotations);
                    session.condition = written;
                    session.last_resync = Some(Instant::now());
                }
                Ok(None) => {
                    self.status.send_modify(|s| s.reported = false);
                    tracing::debug!("node not registered yet; nothing to annotate");
                    return;
                }
                Err(e) => {
                    self.report_failed("cannot read the node", "get on nodes", &e);
                    return;
                }
            }
        }
        let mut ok = true;
        if let Some(current) = &session.annotations
            && let Some(patch) = report::annotation_patch(current, &desired)
        {
            match node.patch_annotations(&patch).await {
                Ok(()) => session.annotations = Some(desired),
                Err(e) => {
                    session.annotations = None;
                    self.report_failed("cannot annotate the node", "patch on nodes", &e);
                    // Not the condition too: one reason at a time, or the two would take turns
                    // in status and in the log.
                    return;
                }
            }
        }
        let stale = match &session.condition {
            None => true,
            Some(w) => {
                (w.status.as_str(), w.reason.as_str(), w.message.as_str())
                    != (
                        condition.0.as_str(),
                        condition.1.as_str(),
                        condition.2.as_str(),
                    )
                    || resync
            }
        };
        if stale {
            match node
                .write_condition(condition, session.condition.as_ref(), util::now())
                .await
            {
                Ok(w) => session.condition = Some(w),
                Err(e) => {
                    ok = false;
                    session.condition = None;
                    self.report_failed(
                        "cannot write the node condition",
                        "patch on nodes/status",
                        &e,
                    );
                }
            }
        }
        if ok {
            let mut recovered = false;
            self.status.send_modify(|s| {
                s.reported = true;
                recovered = s.report_error.take().is_some();
            });
            if recovered {
                tracing::info!("node report written again");
            }
        }
    }

    /// Records why the node report could not be written: in status (`report_error`), and in
    /// the log once per distinct reason, not once per retry. A 403 says which permission of
    /// rbac.yaml is missing.
    fn report_failed(&self, what: &str, needs: &str, e: &kube::Error) {
        let msg = match code(e) {
            Some(403) => format!(
                "{what}: {}; the node's own identity (kubernetes.node_kubeconfig, \
                 system:node:<name>) needs {needs} of its own Node: is the API server's \
                 authorization mode Node and its admission NodeRestriction?",
                describe(e)
            ),
            _ => format!("{what}: {}", describe(e)),
        };
        self.report_unable(msg);
    }

    /// Records that the node report cannot be written, and why.
    fn report_unable(&self, msg: String) {
        let mut changed = false;
        self.status.send_modify(|s| {
            s.reported = false;
            if s.report_error.as_deref() != Some(msg.as_str()) {
                changed = true;
                s.report_error = Some(msg.clone());
            }
        });
        if changed {
            tracing::warn!(error = %msg, "cannot report to the node");
        }
    }
}

/// What the heartbeat Lease says of the node's rollout: its group, the last revision whose
/// gate passed, and the plan of the revision it waits for.
fn marks(status: &Status) -> Marks {
    Marks {
        group: status.rollout.group.clone(),
        passed: status
            .rollout
            .passed_revision
            .as_ref()
            .map(|r| r.as_str().to_owned()),
        plan: status.apply.plan.as_ref().map(|p| {
            PlanMark::new(
                &p.revision,
                p.action,
                &p.because,
                p.added_bytes,
                p.unknown.as_deref(),
            )
            .encode()
        }),
        previews: (!status.previews.is_empty())
            .then(|| crate::types::preview::encode_answers(&status.previews)),
    }
}
