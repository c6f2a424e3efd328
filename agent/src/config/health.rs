//! `[health]`: the probes, each with `enabled` and its own interval and timeout.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{ConfigError, Ctx, Duration, bounds};
use crate::types::EndpointUrl;

/// Health probes. Each has `enabled`, and may override `interval` and `timeout`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HealthConfig {
    /// How often each probe runs, unless it sets its own.
    pub interval: Duration,
    /// How long one probe may take, unless it sets its own.
    pub timeout: Duration,
    /// A file that exists once this machine is a Kubernetes node (kubeadm writes it at init
    /// and join). Before it, an unreachable kubelet or Cilium is `unknown` (no cluster yet),
    /// not `failed`: `failed` means the component is there and broken.
    pub node_marker: std::path::PathBuf,
    pub kubelet: KubeletProbe,
    pub apiserver: ApiserverProbe,
    pub kube_vip: KubeVipProbe,
    pub cilium: CiliumProbe,
    pub systemd: SystemdProbe,
    pub node_ready: NodeReadyProbe,
}

impl Default for HealthConfig {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(30),
            timeout: Duration::from_secs(5),
            node_marker: "/etc/kubernetes/kubelet.conf".into(),
            kubelet: KubeletProbe::default(),
            apiserver: ApiserverProbe::default(),
            kube_vip: KubeVipProbe::default(),
            cilium: CiliumProbe::default(),
            systemd: SystemdProbe::default(),
            node_ready: NodeReadyProbe::default(),
        }
    }
}

fn yes() -> bool {
    true
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubeletProbe {
    /// Whether the kubelet's health endpoint is probed.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// This probe's interval [default: `health.interval`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<Duration>,
    /// This probe's timeout [default: `health.timeout`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Duration>,
    /// The kubelet's healthz endpoint.
    #[serde(default = "default_kubelet_url")]
    pub url: EndpointUrl,
}

/// A built-in default URL.
fn builtin(url: &str) -> EndpointUrl {
    url.parse().expect("the built-in URLs are valid")
}

fn default_kubelet_url() -> EndpointUrl {
    builtin("http://127.0.0.1:10248/healthz")
}

impl Default for KubeletProbe {
    fn default() -> Self {
        Self {
            enabled: true,
            interval: None,
            timeout: None,
            url: default_kubelet_url(),
        }
    }
}

/// `/readyz` on this node's API server (control-plane nodes) and through the VIP, verified
/// against the cluster CA of the kubeconfig.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiserverProbe {
    /// Whether the API server is probed (`/readyz`, on this node and through the VIP).
    #[serde(default = "yes")]
    pub enabled: bool,
    /// This probe's interval [default: `health.interval`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<Duration>,
    /// This probe's timeout [default: `health.timeout`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Duration>,
    /// This node's own API server (probed on control-plane nodes).
    #[serde(default = "default_local_apiserver")]
    pub local_url: EndpointUrl,
    /// Default: the server of the kubeconfig (the control-plane endpoint).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vip_url: Option<EndpointUrl>,
    /// The name the API server's certificate is checked against (kubeadm certificates do not
    /// list 127.0.0.1, but do list `kubernetes`).
    #[serde(
        default = "default_tls_server_name",
        skip_serializing_if = "Option::is_none"
    )]
    pub tls_server_name: Option<String>,
    /// Skip certificate verification. Only when you mean it.
    #[serde(default)]
    pub insecure_skip_tls_verify: bool,
}

fn default_local_apiserver() -> EndpointUrl {
    builtin("https://127.0.0.1:6443")
}

fn default_tls_server_name() -> Option<String> {
    Some("kubernetes".to_owned())
}

impl Default for ApiserverProbe {
    fn default() -> Self {
        Self {
            enabled: true,
            interval: None,
            timeout: None,
            local_url: default_local_apiserver(),
            vip_url: None,
            tls_server_name: default_tls_server_name(),
            insecure_skip_tls_verify: false,
        }
    }
}

/// Whether the VIP is on a local interface, who holds kube-vip's lease, and whether the two
/// agree. Runs only when `address` is set.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubeVipProbe {
    /// Whether kube-vip is probed (the VIP answers, its Lease is held); runs when `address` is
    /// set.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// This probe's interval [default: `health.interval`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<Duration>,
    /// This probe's timeout [default: `health.timeout`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Duration>,
    /// The VIP kube-vip holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<std::net::IpAddr>,
    /// The namespace of kube-vip's leader-election Lease.
    #[serde(default = "default_kube_system")]
    pub lease_namespace: String,
    /// The name of kube-vip's leader-election Lease.
    #[serde(default = "default_kube_vip_lease")]
    pub lease_name: String,
}

fn default_kube_system() -> String {
    "kube-system".to_owned()
}

fn default_kube_vip_lease() -> String {
    "plndr-cp-lock".to_owned()
}

impl Default for KubeVipProbe {
    fn default() -> Self {
        Self {
            enabled: true,
            interval: None,
            timeout: None,
            address: None,
            lease_namespace: default_kube_system(),
            lease_name: default_kube_vip_lease(),
        }
    }
}

/// The Cilium agent's API (`GET /v1/healthz` on its unix socket), else its health port.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CiliumProbe {
    /// Whether the Cilium agent is probed (its API over the unix socket).
    #[serde(default = "yes")]
    pub enabled: bool,
    /// This probe's interval [default: `health.interval`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<Duration>,
    /// This probe's timeout [default: `health.timeout`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Duration>,
    /// The Cilium agent's API socket.
    #[serde(default = "default_cilium_socket")]
    pub socket: PathBuf,
    /// The agent's health endpoint, asked when the socket cannot be.
    #[serde(default = "default_cilium_fallback")]
    pub fallback_url: EndpointUrl,
}

fn default_cilium_socket() -> PathBuf {
    PathBuf::from("/var/run/cilium/cilium.sock")
}

fn default_cilium_fallback() -> EndpointUrl {
    builtin("http://127.0.0.1:9879/healthz")
}

impl Default for CiliumProbe {
    fn default() -> Self {
        Self {
            enabled: true,
            interval: None,
            timeout: None,
            socket: default_cilium_socket(),
            fallback_url: default_cilium_fallback(),
        }
    }
}

/// `systemctl is-system-running` and the failed units.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SystemdProbe {
    /// Whether failed systemd units are probed for.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// This probe's interval [default: `health.interval`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<Duration>,
    /// This probe's timeout [default: `health.timeout`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Duration>,
    /// The `systemctl` program.
    #[serde(default = "default_systemctl")]
    pub systemctl: PathBuf,
}

fn default_systemctl() -> PathBuf {
    PathBuf::from("systemctl")
}

impl Default for SystemdProbe {
    fn default() -> Self {
        Self {
            enabled: true,
            interval: None,
            timeout: None,
            systemctl: default_systemctl(),
        }
    }
}

/// The node's own `Ready` condition, read from the API.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeReadyProbe {
    /// Whether the Node's `Ready` condition is probed (through the API).
    #[serde(default = "yes")]
    pub enabled: bool,
    /// This probe's interval [default: `health.interval`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<Duration>,
    /// This probe's timeout [default: `health.timeout`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Duration>,
}

impl Default for NodeReadyProbe {
    fn default() -> Self {
        Self {
            enabled: true,
            interval: None,
            timeout: None,
        }
    }
}

impl HealthConfig {
    /// Each probe's own interval and timeout, as written (`None`: `[health]`'s).
    pub fn timings(&self) -> [(&'static str, Option<Duration>, Option<Duration>); 6] {
        let h = self;
        [
            ("kubelet", h.kubelet.interval, h.kubelet.timeout),
            ("apiserver", h.apiserver.interval, h.apiserver.timeout),
            ("kube_vip", h.kube_vip.interval, h.kube_vip.timeout),
            ("cilium", h.cilium.interval, h.cilium.timeout),
            ("systemd", h.systemd.interval, h.systemd.timeout),
            ("node_ready", h.node_ready.interval, h.node_ready.timeout),
        ]
    }

    /// Checks the timings of all probes and the URLs they call.
    pub(super) fn validate(&self, ctx: &Ctx<'_>) -> Result<(), ConfigError> {
        let h = self;
        bounds::HEALTH_INTERVAL.check(ctx, h.interval)?;
        bounds::HEALTH_TIMEOUT.check(ctx, h.timeout)?;
        for (probe, interval, timeout) in h.timings() {
            for (what, bound, d) in [
                ("interval", &bounds::PROBE_INTERVAL, interval),
                ("timeout", &bounds::PROBE_TIMEOUT, timeout),
            ] {
                if let Some(d) = d {
                    bound.check_at(ctx, &format!("health.{probe}.{what}"), d)?;
                }
            }
        }
        for (key, url) in [
            ("health.kubelet.url", &h.kubelet.url),
            ("health.cilium.fallback_url", &h.cilium.fallback_url),
        ] {
            if url.scheme() != "http" {
                return Err(ctx.error(key, format!("{url} must be an http:// URL")));
            }
        }
        for (key, url) in [
            ("health.apiserver.local_url", Some(&h.apiserver.local_url)),
            ("health.apiserver.vip_url", h.apiserver.vip_url.as_ref()),
        ] {
            if let Some(url) = url
                && (url.scheme() != "https" || url.as_request_str().parse::<http::Uri>().is_err())
            {
                return Err(ctx.error(key, format!("{url} must be an https:// URL")));
            }
        }
        Ok(())
    }
}
