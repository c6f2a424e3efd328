//! The Kubernetes API as workers receive it: the daemon builds [`KubeClients`] (in `kube`) and
//! hands them to the probes and the kubeadm watcher through a watch, so no worker reaches into
//! another for a client. With them, how a client error is described and its HTTP status.
//!
//! Must not import anything else of the crate.

/// Written on a node that ginx made unschedulable before a reboot (value: when); only such a
/// node is uncordoned by ginx. The reporter, which owns the other `ginx.io/` annotations,
/// leaves it alone.
pub const CORDONED_BY: &str = "ginx.io/cordoned-by-ginx";

/// Clients for the API, shared with the probes.
#[derive(Clone)]
pub struct KubeClients {
    /// The kubeconfig's server (normally the control-plane endpoint, the VIP).
    pub main: kube::Client,
    /// The same credentials against `health.apiserver.local_url`.
    pub local: Option<kube::Client>,
    /// The same credentials against `health.apiserver.vip_url` (default: the kubeconfig's
    /// server).
    pub vip: kube::Client,
    /// `main` for watches: its read timeout outlasts a watch request, which may be silent
    /// for minutes (`main`'s `request_timeout` would cut every watch after that long).
    pub watch: kube::Client,
    /// The node's own identity (`kubernetes.node_kubeconfig`, the kubelet's): what ginx does
    /// to its own Node and its pods. Or why there is none (named with its file).
    pub node: Result<kube::Client, String>,
    /// The API server's clock as ginx's own writes found it: Leases are written in it.
    pub clock: ServerClock,
}

/// The API server's wall clock as seen from this node: the time the server stamps in
/// `managedFields` on each of ginx's Lease writes, carried forward on this node's monotonic
/// clock. Leases are written in it (`renewTime`, `acquireTime`), so a node whose wall clock is
/// off, or steps, still writes times the server (and `vap.yaml`, which allows 30 s) takes for
/// now. Nothing ginx decides rests on it: slots expire by observation on the monotonic clock.
#[derive(Clone, Debug, Default)]
pub struct ServerClock(
    std::sync::Arc<std::sync::Mutex<Option<(jiff::Timestamp, std::time::Instant)>>>,
);

/// A difference this small is within what a whole-second stamp can tell: taken as none.
const CLOCK_PRECISION: jiff::SignedDuration = jiff::SignedDuration::from_millis(1500);

impl ServerClock {
    /// The server's time now: this node's wall clock when it agrees with the last stamp
    /// carried forward (within a second and a half), else that estimate.
    pub fn now(&self) -> jiff::Timestamp {
        let local = jiff::Timestamp::now();
        match self.estimate() {
            Some(server) if server.duration_since(local).abs() > CLOCK_PRECISION => server,
            _ => local,
        }
    }

    /// How far the server's clock is ahead of this node's (negative: behind), once learned.
    pub fn offset(&self) -> Option<jiff::SignedDuration> {
        self.estimate()
            .map(|server| server.duration_since(jiff::Timestamp::now()))
    }

    fn estimate(&self) -> Option<jiff::Timestamp> {
        let (at, seen) = (*self.0.lock().unwrap_or_else(|e| e.into_inner()))?;
        let ran = jiff::SignedDuration::try_from(seen.elapsed()).ok()?;
        at.checked_add(ran).ok()
    }

    /// Learns from the answer `meta` to a write of ginx's sent at `sent` and answered at
    /// `received` (monotonic) that changed a field, so that the server stamped it. Logs when
    /// the offset first is, or stops being, more than a few seconds.
    pub fn learn(
        &self,
        meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
        sent: std::time::Instant,
        received: std::time::Instant,
    ) {
        let stamp = meta
            .managed_fields
            .iter()
            .flatten()
            .filter(|m| {
                m.manager.as_deref() == Some(FIELD_MANAGER)
                    && m.operation.as_deref() == Some("Update")
            })
            .filter_map(|m| m.time.as_ref().map(|t| t.0))
            .max();
        let Some(stamp) = stamp else { return };
        let before = self.offset();
        // The stamp is cut to the second: the server's time was within the second after it,
        // at about the middle of the request.
        let server = stamp + jiff::SignedDuration::from_millis(500);
        let middle = sent + received.saturating_duration_since(sent) / 2;
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some((server, middle));
        let (Some(offset), before) = (self.offset(), before.unwrap_or_default()) else {
            return;
        };
        let far = |o: jiff::SignedDuration| o.abs() > jiff::SignedDuration::from_secs(5);
        if far(offset) && (offset - before).abs() > jiff::SignedDuration::from_secs(5) {
            tracing::warn!(offset = %format!("{offset:#}"),
                "the API server's clock is this far from this node's: ginx writes its Leases in the server's time; fix this node's clock (NTP)");
        } else if far(before) && !far(offset) {
            tracing::info!("this node's clock agrees with the API server's again");
        }
    }
}

impl KubeClients {
    /// The node's own identity, or why there is none.
    pub fn node(&self) -> Result<kube::Client, String> {
        self.node.clone()
    }
}

/// A short description of a client error: the HTTP status and reason for API errors, the root
/// cause for transport errors. Never contains credentials.
pub fn describe(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => {
            let msg = s.message.lines().next().unwrap_or("").trim();
            if s.reason.is_empty() || s.reason == "Failed to parse error data" {
                format!("HTTP {}: {msg}", s.code)
            } else {
                format!("HTTP {} {}: {msg}", s.code, s.reason)
            }
        }
        other => {
            let mut cause: &dyn std::error::Error = other;
            while let Some(next) = cause.source() {
                cause = next;
            }
            let root = cause.to_string();
            let top = other.to_string();
            if root == top {
                top
            } else {
                format!("{top}: {root}")
            }
        }
    }
}

/// The label naming a node's rollout group on its heartbeat Lease `ginx-<node>`: how
/// `rollout.after` of another group finds every node of this one.
pub const HEARTBEAT_GROUP_LABEL: &str = "ginx.io/group";
/// On the heartbeat Lease: the last revision whose health gate passed on the node (full
/// commit id).
pub const HEARTBEAT_PASSED_ANNOTATION: &str = "ginx.io/passed-revision";

/// The HTTP status of an API error.
pub fn code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) if s.code != 0 => Some(s.code),
        _ => None,
    }
}

/// `/readyz` through `client`: Ok, or why not (the failing checks the server lists, or the
/// transport error).
pub async fn readyz(client: &kube::Client) -> Result<(), String> {
    let request = http::Request::get("/readyz")
        .body(Vec::new())
        .map_err(|e| e.to_string())?;
    match client.request_text(request).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) => {
            let failing: Vec<&str> = s.message.lines().filter(|l| l.starts_with("[-]")).collect();
            Err(if failing.is_empty() {
                let one_line: String = s.message.split_whitespace().collect::<Vec<_>>().join(" ");
                format!(
                    "readyz {}: {}",
                    s.code,
                    one_line.chars().take(200).collect::<String>()
                )
            } else {
                format!("readyz {}: {}", s.code, failing.join(", "))
            })
        }
        Err(e) => Err(format!("unreachable: {}", describe(&e))),
    }
}

/// The field manager of every write ginx makes: the API server stamps each write's time in
/// `managedFields` under it, which the admission policies read as the server's clock.
pub const FIELD_MANAGER: &str = "ginx";

/// `PostParams` with ginx's field manager.
pub fn post_params() -> kube::api::PostParams {
    kube::api::PostParams {
        dry_run: false,
        field_manager: Some(FIELD_MANAGER.to_owned()),
    }
}

/// `PatchParams` (merge and strategic patches) with ginx's field manager.
pub fn patch_params() -> kube::api::PatchParams {
    kube::api::PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..kube::api::PatchParams::default()
    }
}

/// Whether `e` means the API is unavailable (a transport error, a timeout, a 5xx, or a 429
/// that kube-rs's retries did not get past), as opposed to a request the API refused (401,
/// 403, 404, 422, …: an error of configuration, which waiting does not mend).
pub fn unavailable(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(s) if s.code != 0 => s.code >= 500 || s.code == 429,
        // Credentials that cannot be loaded or refreshed are configuration too.
        kube::Error::Auth(_) => false,
        _ => true,
    }
}

/// Whether a refusal came from a ValidatingAdmissionPolicy rather than RBAC.
pub fn by_policy(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.message.contains("ValidatingAdmissionPolicy"))
}

/// Why the API refused `verb` on `resource` (`e` is not [`unavailable`]), and what to do. Only
/// a 403 is RBAC's doing; a 404 of ginx's namespace is the manifest not applied either.
pub fn refusal(verb: &str, resource: &str, e: &kube::Error) -> String {
    let hint = match code(e) {
        Some(401) => {
            "the credentials of kubernetes.kubeconfig are not accepted: check that file (an \
             expired or revoked certificate?)"
        }
        Some(403) if by_policy(e) => {
            "an admission policy of packaging/kubernetes/vap.yaml refused it (its message says \
             which rule): if this node's request was right, check that the policies match this \
             ginx's version"
        }
        Some(403) => {
            "ginx's identity may not do this: apply packaging/kubernetes/rbac.yaml and \
             vap.yaml to the cluster"
        }
        Some(404) => {
            "it does not exist: check kubernetes.namespace and apply \
             packaging/kubernetes/rbac.yaml, which creates the namespace"
        }
        Some(422) => "the API found the object ginx wrote invalid: report this as a bug",
        _ => "check the configuration of [kubernetes]",
    };
    format!("the API refused {verb} {resource}: {}; {hint}", describe(e))
}

#[cfg(test)]
mod server_clock_tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, ObjectMeta, Time};

    fn stamped(t: jiff::Timestamp) -> ObjectMeta {
        ObjectMeta {
            managed_fields: Some(vec![ManagedFieldsEntry {
                manager: Some(FIELD_MANAGER.to_owned()),
                operation: Some("Update".to_owned()),
                time: Some(Time(t.round(jiff::Unit::Second).unwrap())),
                ..ManagedFieldsEntry::default()
            }]),
            ..ObjectMeta::default()
        }
    }

    #[test]
    fn the_servers_time_is_carried_on_the_monotonic_clock() {
        let c = ServerClock::default();
        let local = jiff::Timestamp::now();
        assert!(c.offset().is_none());
        assert!(c.now().duration_since(local).abs() < jiff::SignedDuration::from_secs(1));
        // A server 10 minutes ahead.
        let i = std::time::Instant::now();
        c.learn(&stamped(local + jiff::SignedDuration::from_mins(10)), i, i);
        let ahead = c.now().duration_since(jiff::Timestamp::now());
        assert!(
            (ahead - jiff::SignedDuration::from_mins(10)).abs()
                < jiff::SignedDuration::from_secs(2),
            "{ahead:?}"
        );
        // A server that agrees: this node's own clock, exactly.
        let i = std::time::Instant::now();
        c.learn(&stamped(jiff::Timestamp::now()), i, i);
        let before = jiff::Timestamp::now();
        let now = c.now();
        assert!(
            now >= before && now.duration_since(before) < jiff::SignedDuration::from_millis(100)
        );
        // Writes of others (no entry of ginx's) teach nothing.
        c.learn(&ObjectMeta::default(), i, i);
        assert!(c.offset().unwrap().abs() < jiff::SignedDuration::from_secs(2));
    }
}
