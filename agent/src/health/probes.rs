//! The probes themselves. Each returns a status and a message an operator can act on.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;

use super::Context;
use super::http::{Target, get, parse_http_url};
use crate::config::Config;
use crate::k8s::describe;
use crate::status::HealthStatus;
use crate::types::{EndpointUrl, Role};
use crate::util;

type Verdict = (HealthStatus, String);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Probe {
    Kubelet,
    Apiserver,
    KubeVip,
    Cilium,
    Systemd,
    NodeReady,
    Etcd,
}

pub const ALL: [Probe; 7] = [
    Probe::Kubelet,
    Probe::Apiserver,
    Probe::KubeVip,
    Probe::Cilium,
    Probe::Systemd,
    Probe::NodeReady,
    Probe::Etcd,
];

impl Probe {
    pub fn name(self) -> &'static str {
        match self {
            Probe::Kubelet => "kubelet",
            Probe::Apiserver => "apiserver",
            Probe::KubeVip => "kube-vip",
            Probe::Cilium => "cilium",
            Probe::Systemd => "systemd",
            Probe::NodeReady => "node-ready",
            Probe::Etcd => "etcd",
        }
    }

    /// Whether the probe runs with this configuration.
    pub fn applies(self, cfg: &Config) -> bool {
        let h = &cfg.health;
        match self {
            Probe::Kubelet => h.kubelet.enabled,
            Probe::Apiserver => h.apiserver.enabled,
            Probe::KubeVip => h.kube_vip.enabled && h.kube_vip.address.is_some(),
            Probe::Cilium => h.cilium.enabled,
            Probe::Systemd => h.systemd.enabled,
            Probe::NodeReady => h.node_ready.enabled,
            Probe::Etcd => cfg.etcd.applies(cfg.node.role),
        }
    }

    /// Interval and timeout, the probe's own or the defaults of `[health]`.
    pub fn timing(self, cfg: &Config) -> (Duration, Duration) {
        let h = &cfg.health;
        let (i, t) = match self {
            Probe::Kubelet => (h.kubelet.interval, h.kubelet.timeout),
            Probe::Apiserver => (h.apiserver.interval, h.apiserver.timeout),
            Probe::KubeVip => (h.kube_vip.interval, h.kube_vip.timeout),
            Probe::Cilium => (h.cilium.interval, h.cilium.timeout),
            Probe::Systemd => (h.systemd.interval, h.systemd.timeout),
            Probe::NodeReady => (h.node_ready.interval, h.node_ready.timeout),
            Probe::Etcd => (None, Some(cfg.etcd.timeout)),
        };
        (i.unwrap_or(h.interval).get(), t.unwrap_or(h.timeout).get())
    }

    pub async fn run(self, cfg: &Config, ctx: &Context) -> Verdict {
        let timeout = self.timing(cfg).1;
        match self {
            Probe::Kubelet => not_yet(cfg, kubelet(&cfg.health.kubelet.url, timeout).await),
            Probe::Apiserver => apiserver(cfg, ctx, timeout).await,
            Probe::KubeVip => kube_vip(cfg, ctx).await,
            Probe::Cilium => not_yet(cfg, cilium(cfg, timeout).await),
            Probe::Systemd => systemd(cfg, timeout).await,
            Probe::NodeReady => node_ready(cfg, ctx).await,
            Probe::Etcd => etcd(cfg).await,
        }
    }
}

/// This node's etcd member: it answers, carries no alarm and is caught up with the leader
/// (`etcd.max_lag`). Required by the gate of a control-plane node, so that the slot is
/// released only once the member is back in step.
async fn etcd(cfg: &Config) -> Verdict {
    let client = match crate::etcd::Client::new(&cfg.etcd) {
        Ok(c) => c,
        Err(e) => return (HealthStatus::Failed, e.to_string()),
    };
    match crate::etcd::observe(&client).await {
        Err(e) => (HealthStatus::Failed, e.to_string()),
        Ok(view) => match view.own_trouble(u64::from(cfg.etcd.max_lag)) {
            Some(why) => (HealthStatus::Failed, why),
            None => (
                HealthStatus::Ok,
                format!(
                    "member {} is caught up with the leader {}",
                    view.name(view.me),
                    view.leader().map(|l| view.name(l)).unwrap_or_default()
                ),
            ),
        },
    }
}

fn snippet(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let one_line: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    one_line.chars().take(200).collect()
}

/// The rule for components of a Kubernetes node (kubelet, Cilium): on a machine that is not a
/// node yet (`health.node_marker` absent: before `kubeadm init` or join), a component that
/// cannot be reached is `unknown`, "no cluster yet"; on a node, it is `failed`. A component
/// that answers is judged by its answer either way: there and broken is `failed`.
pub fn unreachable_verdict(is_node: bool, marker: &std::path::Path, why: String) -> Verdict {
    if is_node {
        (HealthStatus::Failed, why)
    } else {
        (
            HealthStatus::Unknown,
            format!(
                "no cluster yet ({} absent: not a Kubernetes node): {why}",
                marker.display()
            ),
        )
    }
}

/// Nothing answered a probe's request (what was asked, and the error): before the cluster
/// exists, that is expected.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Unreachable(String);

/// A probe's verdict, [`unreachable_verdict`] when nothing answered.
fn not_yet(cfg: &Config, v: Result<Verdict, Unreachable>) -> Verdict {
    let marker = &cfg.health.node_marker;
    match v {
        Ok(v) => v,
        Err(Unreachable(why)) => unreachable_verdict(marker.exists(), marker, why),
    }
}

/// The kubelet's healthz; `Err` when nothing answers.
async fn kubelet(url: &EndpointUrl, timeout: Duration) -> Result<Verdict, Unreachable> {
    let (target, path) = match parse_http_url(url) {
        Ok(x) => x,
        Err(e) => return Ok((HealthStatus::Failed, e)),
    };
    match get(&target, &path, timeout).await {
        Ok((200, _)) => Ok((HealthStatus::Ok, "healthz ok".into())),
        Ok((code, body)) => Ok((
            HealthStatus::Failed,
            format!("healthz answered {code}: {}", snippet(&body)),
        )),
        Err(e) => Err(Unreachable(format!("kubelet at {url}: unreachable: {e}"))),
    }
}

async fn apiserver(cfg: &Config, ctx: &Context, timeout: Duration) -> Verdict {
    let clients = ctx.kube.borrow().clone();
    let Some(clients) = clients else {
        return (
            HealthStatus::Unknown,
            "kubernetes is not configured or not reachable yet".into(),
        );
    };
    let bounded = |c: kube::Client| async move {
        tokio::time::timeout(timeout, async move { crate::k8s::readyz(&c).await })
            .await
            .unwrap_or_else(|_| Err(crate::k8s::NotReady::Unreachable("no answer".into())))
    };
    // Both at once: a VIP that nobody answers must not use up the time of the local check.
    let (vip, local) = tokio::join!(bounded(clients.vip.clone()), async {
        match (&clients.local, cfg.node.role) {
            (Some(c), Role::ControlPlane) => Some(bounded(c.clone()).await),
            _ => None,
        }
    });
    match (local, vip) {
        (None, Ok(())) => (HealthStatus::Ok, "ready through the VIP".into()),
        (None, Err(e)) => (HealthStatus::Failed, format!("VIP: {e}")),
        (Some(Ok(())), Ok(())) => (HealthStatus::Ok, "local and VIP ready".into()),
        (Some(Ok(())), Err(e)) => (HealthStatus::Degraded, format!("local ready; VIP: {e}")),
        (Some(Err(e)), Ok(())) => (HealthStatus::Degraded, format!("VIP ready; local: {e}")),
        (Some(Err(l)), Err(v)) => (HealthStatus::Failed, format!("local: {l}; VIP: {v}")),
    }
}

async fn kube_vip(cfg: &Config, ctx: &Context) -> Verdict {
    let probe = &cfg.health.kube_vip;
    let Some(vip) = probe.address else {
        return (HealthStatus::Unknown, "no VIP configured".into());
    };
    let here = match util::interface_with(vip).map(|i| i.is_some()) {
        Ok(h) => h,
        Err(e) => return (HealthStatus::Unknown, e),
    };
    let me = cfg.node_name();
    let clients = ctx.kube.borrow().clone();
    let holder = match clients {
        None => Err("kubernetes is not configured or not reachable".to_owned()),
        Some(c) => {
            let leases: kube::Api<Lease> = kube::Api::namespaced(c.main, &probe.lease_namespace);
            match leases.get_opt(&probe.lease_name).await {
                Ok(l) => Ok(l
                    .and_then(|l| l.spec)
                    .and_then(|s| s.holder_identity)
                    .filter(|h| !h.is_empty())),
                Err(e) => Err(describe(&e)),
            }
        }
    };
    let lease = format!("{}/{}", probe.lease_namespace, probe.lease_name);
    match (here, holder) {
        (true, Ok(Some(h))) if h == me => (
            HealthStatus::Ok,
            format!("VIP {vip} is here; {lease} held here"),
        ),
        (false, Ok(Some(h))) if h != me => (HealthStatus::Ok, format!("VIP {vip} is held by {h}")),
        (true, Ok(Some(h))) => (
            HealthStatus::Failed,
            format!("split brain: VIP {vip} is on this node but {lease} is held by {h}"),
        ),
        (false, Ok(Some(_))) => (
            HealthStatus::Degraded,
            format!("this node holds {lease} but VIP {vip} is not on any interface here"),
        ),
        (true, Ok(None)) => (
            HealthStatus::Degraded,
            format!("VIP {vip} is here but {lease} has no holder"),
        ),
        (false, Ok(None)) => (
            HealthStatus::Failed,
            format!("nobody holds {lease} and VIP {vip} is not here"),
        ),
        (true, Err(e)) => (
            HealthStatus::Unknown,
            format!("VIP {vip} is here; lease holder unknown: {e}"),
        ),
        (false, Err(e)) => (
            HealthStatus::Unknown,
            format!("VIP {vip} is not here; lease holder unknown: {e}"),
        ),
    }
}

/// What the cilium agent's `/v1/healthz` answer of 200 says.
fn cilium_healthz(body: &[u8]) -> Verdict {
    let v: serde_json::Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => {
            return (
                HealthStatus::Unknown,
                format!("cilium API answered something else: {e}"),
            );
        }
    };
    let state = v
        .pointer("/cilium/state")
        .and_then(|s| s.as_str())
        .unwrap_or("?");
    let msg = v
        .pointer("/cilium/msg")
        .and_then(|s| s.as_str())
        .unwrap_or("");
    let kpr = v
        .pointer("/kube-proxy-replacement/mode")
        .and_then(|s| s.as_str())
        .unwrap_or("unknown");
    let status = match state {
        "Ok" => HealthStatus::Ok,
        "Warning" => HealthStatus::Degraded,
        "Failure" => HealthStatus::Failed,
        _ => HealthStatus::Unknown,
    };
    let mut message = format!("cilium {state}, kube-proxy replacement {kpr}");
    if !msg.is_empty() {
        message.push_str(&format!(": {msg}"));
    }
    (status, message)
}

/// The cilium agent, through its API socket, else its health port; `Err` when neither
/// answers.
async fn cilium(cfg: &Config, timeout: Duration) -> Result<Verdict, Unreachable> {
    let probe = &cfg.health.cilium;
    let api = get(&Target::Unix(probe.socket.clone()), "/v1/healthz", timeout).await;
    match api {
        Ok((200, body)) => Ok(cilium_healthz(&body)),
        Ok((code, body)) => Ok((
            HealthStatus::Failed,
            format!("cilium API answered {code}: {}", snippet(&body)),
        )),
        Err(api_err) => {
            let (target, path) = match parse_http_url(&probe.fallback_url) {
                Ok(x) => x,
                Err(e) => return Ok((HealthStatus::Failed, e)),
            };
            match get(&target, &path, timeout).await {
                Ok((200, _)) => Ok((
                    HealthStatus::Ok,
                    format!("agent healthy on its health port (API socket: {api_err})"),
                )),
                Ok((code, body)) => Ok((
                    HealthStatus::Failed,
                    format!("health port answered {code}: {}", snippet(&body)),
                )),
                Err(e) => Err(Unreachable(format!(
                    "cilium agent unreachable: API socket: {api_err}; health port: {e}"
                ))),
            }
        }
    }
}

async fn systemctl(
    program: &std::path::Path,
    args: &[&str],
    timeout: Duration,
) -> Result<String, String> {
    let run = tokio::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(timeout, run)
        .await
        .map_err(|_| {
            format!(
                "{} gave no answer within {}s",
                program.display(),
                timeout.as_secs_f32()
            )
        })?
        .map_err(|e| format!("cannot run {}: {e}", program.display()))?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

async fn systemd(cfg: &Config, timeout: Duration) -> Verdict {
    let program = &cfg.health.systemd.systemctl;
    let state = match systemctl(program, &["is-system-running"], timeout).await {
        Ok(s) => s,
        Err(e) => return (HealthStatus::Unknown, e),
    };
    match state.as_str() {
        "running" => (HealthStatus::Ok, "running".into()),
        "degraded" => {
            let failed = systemctl(
                program,
                &["list-units", "--state=failed", "--plain", "--no-legend"],
                timeout,
            )
            .await
            .unwrap_or_default();
            let units: Vec<&str> = failed
                .lines()
                .filter_map(|l| l.split_whitespace().next())
                .collect();
            (
                HealthStatus::Degraded,
                format!("degraded; failed units: {}", units.join(", ")),
            )
        }
        "initializing" | "starting" => (HealthStatus::Unknown, format!("system is {state}")),
        "maintenance" | "stopping" => (HealthStatus::Failed, format!("system is {state}")),
        other => (
            HealthStatus::Unknown,
            format!("systemd reports {other:?} (not running as PID 1?)"),
        ),
    }
}

async fn node_ready(cfg: &Config, ctx: &Context) -> Verdict {
    let clients = ctx.kube.borrow().clone();
    let Some(c) = clients else {
        return (
            HealthStatus::Unknown,
            "kubernetes is not configured or not reachable yet".into(),
        );
    };
    let nodes: kube::Api<Node> = kube::Api::all(c.main);
    let node = match nodes.get_opt(cfg.node_name()).await {
        Ok(Some(n)) => n,
        Ok(None) => {
            return (
                HealthStatus::Unknown,
                "this node is not registered (yet)".into(),
            );
        }
        Err(e) => {
            return (
                HealthStatus::Unknown,
                format!("cannot read the node: {}", describe(&e)),
            );
        }
    };
    let ready = node
        .status
        .and_then(|s| s.conditions)
        .and_then(|cs| cs.into_iter().find(|c| c.type_ == "Ready"));
    match ready {
        None => (
            HealthStatus::Unknown,
            "the node has no Ready condition yet".into(),
        ),
        Some(c) => {
            let why = format!(
                "{}{}",
                c.reason.unwrap_or_default(),
                c.message.map(|m| format!(": {m}")).unwrap_or_default()
            );
            match c.status.as_str() {
                "True" => (HealthStatus::Ok, format!("Ready ({why})")),
                "False" => (HealthStatus::Failed, format!("NotReady ({why})")),
                _ => (
                    HealthStatus::Unknown,
                    format!("Ready is {} ({why})", c.status),
                ),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unreachable_is_unknown_before_the_cluster_and_failed_on_a_node() {
        let marker = std::path::Path::new("/etc/kubernetes/kubelet.conf");
        let (s, m) =
            unreachable_verdict(false, marker, "kubelet at x: unreachable: refused".into());
        assert_eq!(s, HealthStatus::Unknown);
        assert!(
            m.starts_with("no cluster yet (/etc/kubernetes/kubelet.conf absent"),
            "{m}"
        );
        let (s, _) = unreachable_verdict(true, marker, "refused".into());
        assert_eq!(s, HealthStatus::Failed);
        // There and broken is failed, node or not.
        let mut cfg = Config::default();
        cfg.health.node_marker = "/nonexistent/ginx-marker".into();
        let broken = (HealthStatus::Failed, "healthz answered 500: no".to_owned());
        assert_eq!(not_yet(&cfg, Ok(broken.clone())), broken);
        // Told by what happened, not by the words: an answer that says "unreachable" is an
        // answer.
        let says = (HealthStatus::Failed, "upstream unreachable".to_owned());
        assert_eq!(not_yet(&cfg, Ok(says.clone())), says);
        let away = Unreachable("kubelet at u: unreachable: refused".to_owned());
        assert_eq!(not_yet(&cfg, Err(away)).0, HealthStatus::Unknown);
    }
}
