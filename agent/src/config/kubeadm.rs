//! `[kubeadm]`: cluster facts for kubeadm and kube-vip, and where the files go. The checks of
//! facts (versions, endpoints, CIDRs, names; subnets against each other, the VIP against the
//! subnets and the node's addresses) are here, pure, so that both validation (`check-config`)
//! and the `kubeadm` renderer run the same checks without config importing the renderer.

use std::fmt;
use std::net::IpAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{ConfigError, Ctx, is_dns_subdomain};
use crate::types::Invalid;

/// Cluster facts for kubeadm and kube-vip. Each may come from here or from `cluster_file` in
/// the `source` checkout (Argus); the local value wins key by key. Defaults for facts neither
/// gives are in `kubeadm::facts`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterFacts {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_name: Option<String>,
    /// `vX.Y.Z`
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes_version: Option<String>,
    /// `VIP:PORT`
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_endpoint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_subnet: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_subnet: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns_domain: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_sans: Option<Vec<String>>,
    /// Cilium replaces kube-proxy: kubeadm skips it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kube_proxy_replacement: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cri_socket: Option<String>,
    #[serde(default, skip_serializing_if = "KubeVipFacts::is_empty")]
    pub kube_vip: KubeVipFacts,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubeVipFacts {
    /// kube-vip's image in the static pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The interface the VIP is announced on (ARP).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<String>,
    /// Where the kube-vip static pod manifest is written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest_path: Option<PathBuf>,
    /// Seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_duration: Option<u32>,
    /// kube-vip's leader-election renew deadline, in seconds (< `lease_duration`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renew_deadline: Option<u32>,
    /// kube-vip's leader-election retry period, in seconds (< `renew_deadline`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_period: Option<u32>,
}

impl KubeVipFacts {
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

impl ClusterFacts {
    /// `self`, with what it does not say taken from `base`.
    pub fn over(self, base: ClusterFacts) -> ClusterFacts {
        let v = self.kube_vip;
        let b = base.kube_vip;
        ClusterFacts {
            cluster_name: self.cluster_name.or(base.cluster_name),
            kubernetes_version: self.kubernetes_version.or(base.kubernetes_version),
            control_plane_endpoint: self.control_plane_endpoint.or(base.control_plane_endpoint),
            pod_subnet: self.pod_subnet.or(base.pod_subnet),
            service_subnet: self.service_subnet.or(base.service_subnet),
            dns_domain: self.dns_domain.or(base.dns_domain),
            cert_sans: self.cert_sans.or(base.cert_sans),
            kube_proxy_replacement: self.kube_proxy_replacement.or(base.kube_proxy_replacement),
            cri_socket: self.cri_socket.or(base.cri_socket),
            kube_vip: KubeVipFacts {
                image: v.image.or(b.image),
                interface: v.interface.or(b.interface),
                manifest_path: v.manifest_path.or(b.manifest_path),
                lease_duration: v.lease_duration.or(b.lease_duration),
                renew_deadline: v.renew_deadline.or(b.renew_deadline),
                retry_period: v.retry_period.or(b.retry_period),
            },
        }
    }
}

/// `ginxctl kubeadm` and the files behind `initKubeadm` / `joinCPKubeadm`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubeadmConfig {
    /// A source (Argus) holding `cluster_file` with cluster facts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// A TOML file of these keys (without `kubeadm.`) in `source`'s checkout; keys set here
    /// win.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_file: Option<PathBuf>,
    /// The `kubeadm` program.
    #[serde(default = "default_kubeadm_path")]
    pub kubeadm_path: PathBuf,
    /// Rendered files; those with a token or key are written with mode 0600.
    #[serde(default = "default_kubeadm_output")]
    pub output_dir: PathBuf,
    /// The cluster CA, for `discovery.bootstrapToken.caCertHashes`.
    #[serde(default = "default_ca_cert")]
    pub ca_cert: PathBuf,
    /// The kubeconfig kubeadm writes on control-plane nodes, used to see when kube-vip can
    /// leave super-admin.conf.
    #[serde(default = "default_admin_kubeconfig")]
    pub admin_kubeconfig: PathBuf,
    /// `clusterName` of the ClusterConfiguration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_name: Option<String>,
    /// `kubernetesVersion` (vX.Y.Z); required to render.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes_version: Option<String>,
    /// `controlPlaneEndpoint`: the VIP and port; required to render.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_plane_endpoint: Option<String>,
    /// `networking.podSubnet`; `"v4,v6"` for dual stack; required to render.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_subnet: Option<String>,
    /// `networking.serviceSubnet`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_subnet: Option<String>,
    /// `networking.dnsDomain`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns_domain: Option<String>,
    /// Extra `apiServer.certSANs` (the endpoint's host is always included).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cert_sans: Option<Vec<String>>,
    /// Cilium replaces kube-proxy: its addon phase is skipped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kube_proxy_replacement: Option<bool>,
    /// `nodeRegistration.criSocket`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cri_socket: Option<String>,
    #[serde(default, skip_serializing_if = "KubeVipFacts::is_empty")]
    pub kube_vip: KubeVipFacts,
}

fn default_kubeadm_path() -> PathBuf {
    PathBuf::from("kubeadm")
}

fn default_kubeadm_output() -> PathBuf {
    PathBuf::from("/etc/ginx/kubeadm")
}

fn default_ca_cert() -> PathBuf {
    PathBuf::from("/etc/kubernetes/pki/ca.crt")
}

fn default_admin_kubeconfig() -> PathBuf {
    PathBuf::from("/etc/kubernetes/admin.conf")
}

impl Default for KubeadmConfig {
    fn default() -> Self {
        Self {
            source: None,
            cluster_file: None,
            kubeadm_path: default_kubeadm_path(),
            output_dir: default_kubeadm_output(),
            ca_cert: default_ca_cert(),
            admin_kubeconfig: default_admin_kubeconfig(),
            cluster_name: None,
            kubernetes_version: None,
            control_plane_endpoint: None,
            pod_subnet: None,
            service_subnet: None,
            dns_domain: None,
            cert_sans: None,
            kube_proxy_replacement: None,
            cri_socket: None,
            kube_vip: KubeVipFacts::default(),
        }
    }
}

impl KubeadmConfig {
    /// The facts written here.
    pub fn facts(&self) -> ClusterFacts {
        ClusterFacts {
            cluster_name: self.cluster_name.clone(),
            kubernetes_version: self.kubernetes_version.clone(),
            control_plane_endpoint: self.control_plane_endpoint.clone(),
            pod_subnet: self.pod_subnet.clone(),
            service_subnet: self.service_subnet.clone(),
            dns_domain: self.dns_domain.clone(),
            cert_sans: self.cert_sans.clone(),
            kube_proxy_replacement: self.kube_proxy_replacement,
            cri_socket: self.cri_socket.clone(),
            kube_vip: self.kube_vip.clone(),
        }
    }
}

impl KubeadmConfig {
    /// Checks where the facts come from and each fact written here (with those from the source
    /// they are checked again when rendering). That `source` names a source is checked by the
    /// caller, which knows the sources.
    pub(super) fn validate(&self, ctx: &Ctx<'_>) -> Result<(), ConfigError> {
        match (&self.source, &self.cluster_file) {
            (Some(_), None) => {
                return Err(ctx.error("kubeadm.source", "is set but kubeadm.cluster_file is not"));
            }
            (None, Some(_)) => {
                return Err(ctx.error("kubeadm.cluster_file", "is set but kubeadm.source is not"));
            }
            _ => {}
        }
        if let Some(f) = &self.cluster_file
            && !f
                .components()
                .all(|c| matches!(c, std::path::Component::Normal(_)))
        {
            return Err(ctx.error(
                "kubeadm.cluster_file",
                "must be a relative path inside the source, without \"..\"",
            ));
        }
        let facts = self.facts();
        if let Err((key, message)) = check_partial(&facts).and_then(|()| check_relations(&facts)) {
            return Err(ctx.error(&format!("kubeadm.{key}"), message));
        }
        Ok(())
    }
}

/// An IP network: address and prefix length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    pub addr: IpAddr,
    pub prefix: u8,
}

impl Cidr {
    pub fn parse(s: &str) -> Result<Self, Invalid> {
        let (a, p) = s
            .split_once('/')
            .ok_or_else(|| format!("{s:?} is not a CIDR like 10.244.0.0/16"))?;
        let addr: IpAddr = a
            .parse()
            .map_err(|_| format!("{s:?}: {a:?} is not an IP address"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix: u8 = p
            .parse()
            .ok()
            .filter(|p| *p <= max)
            .ok_or_else(|| format!("{s:?}: the prefix length must be 0..={max}"))?;
        let c = Cidr { addr, prefix };
        if c.network() != addr {
            return Err(Invalid(format!(
                "{s:?} has host bits set; the network is {}/{prefix}",
                c.network()
            )));
        }
        Ok(c)
    }

    fn bits(addr: IpAddr) -> (u128, u8) {
        match addr {
            IpAddr::V4(a) => (u128::from(u32::from(a)), 32),
            IpAddr::V6(a) => (u128::from(a), 128),
        }
    }

    fn mask(&self) -> u128 {
        let (_, width) = Self::bits(self.addr);
        if self.prefix == 0 {
            0
        } else {
            (u128::MAX << (width - self.prefix)) & (u128::MAX >> (128 - u32::from(width)))
        }
    }

    fn network(&self) -> IpAddr {
        let (b, _) = Self::bits(self.addr);
        let n = b & self.mask();
        match self.addr {
            IpAddr::V4(_) => IpAddr::V4(std::net::Ipv4Addr::from(n as u32)),
            IpAddr::V6(_) => IpAddr::V6(std::net::Ipv6Addr::from(n)),
        }
    }

    pub fn contains(&self, ip: IpAddr) -> bool {
        if ip.is_ipv4() != self.addr.is_ipv4() {
            return false;
        }
        let (b, _) = Self::bits(ip);
        let (n, _) = Self::bits(self.addr);
        b & self.mask() == n & self.mask()
    }

    pub fn overlaps(&self, other: &Cidr) -> bool {
        self.contains(other.addr) || other.contains(self.addr)
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// One CIDR or a dual-stack pair `a,b`.
pub fn cidrs(s: &str) -> Result<Vec<Cidr>, Invalid> {
    s.split(',').map(|c| Cidr::parse(c.trim())).collect()
}

/// `host:port` of the control-plane endpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    pub host: String,
    pub port: u16,
}

impl Endpoint {
    pub fn parse(s: &str) -> Result<Self, Invalid> {
        let (host, port) = s
            .rsplit_once(':')
            .ok_or_else(|| format!("{s:?} must be VIP:PORT, like 10.0.0.100:6443"))?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let port: u16 = port
            .parse()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("{s:?}: {port:?} is not a valid port (1-65535)"))?;
        if host.is_empty() {
            return Err(Invalid(format!("{s:?} has no host")));
        }
        Ok(Self {
            host: host.to_owned(),
            port,
        })
    }

    pub fn ip(&self) -> Option<IpAddr> {
        self.host.parse().ok()
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.ip() {
            Some(IpAddr::V6(_)) => write!(f, "[{}]:{}", self.host, self.port),
            _ => write!(f, "{}:{}", self.host, self.port),
        }
    }
}

fn version(s: &str) -> Result<(), Invalid> {
    // Each part must fit the integers kubeadm parses it into.
    let ok = s
        .strip_prefix('v')
        .map(|r| r.split('.').collect::<Vec<_>>())
        .is_some_and(|p| {
            p.len() == 3
                && p.iter().all(|n| {
                    !n.is_empty()
                        && n.bytes().all(|b| b.is_ascii_digit())
                        && n.parse::<u32>().is_ok()
                })
        });
    if ok {
        Ok(())
    } else {
        Err(Invalid(format!(
            "{s:?} is not a version like v1.33.4 (vX.Y.Z)"
        )))
    }
}

/// An IP address, or a DNS name (optionally `*.` for a wildcard), as a certificate SAN.
fn is_san(s: &str) -> bool {
    if s.parse::<IpAddr>().is_ok() {
        return true;
    }
    let name = s.strip_prefix("*.").unwrap_or(s);
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

/// Checks each fact that is present, on its own. `Err((key, message))`, the key relative to
/// `[kubeadm]`.
pub fn check_partial(f: &ClusterFacts) -> Result<(), (String, String)> {
    check_each(f).map_err(|(k, m)| (k.to_owned(), m))?;
    for (i, san) in f.cert_sans.iter().flatten().enumerate() {
        if !is_san(san) {
            return Err((
                format!("cert_sans[{i}]"),
                format!("{san:?} is neither an IP address nor a DNS name"),
            ));
        }
    }
    Ok(())
}

/// The facts present, against each other: the pod and service subnets are disjoint, and the
/// VIP lies outside both. The renderer calls it on the completed facts.
pub fn check_relations(f: &ClusterFacts) -> Result<(), (String, String)> {
    let parse = |v: &Option<String>, key: &str| -> Result<Vec<Cidr>, (String, String)> {
        v.as_deref()
            .map(cidrs)
            .transpose()
            .map(Option::unwrap_or_default)
            .map_err(|m| (key.to_owned(), m.0))
    };
    let pods = parse(&f.pod_subnet, "pod_subnet")?;
    let services = parse(&f.service_subnet, "service_subnet")?;
    for p in &pods {
        for s in &services {
            if p.overlaps(s) {
                return Err((
                    "pod_subnet".to_owned(),
                    format!("pod_subnet {p} and service_subnet {s} overlap; pick disjoint ranges"),
                ));
            }
        }
    }
    let vip = f
        .control_plane_endpoint
        .as_deref()
        .and_then(|e| Endpoint::parse(e).ok())
        .and_then(|e| e.ip());
    if let Some(vip) = vip {
        for net in pods.iter().chain(&services) {
            if net.contains(vip) {
                return Err((
                    "control_plane_endpoint".to_owned(),
                    format!(
                        "the control-plane endpoint {vip} lies inside {net}; the VIP must be an \
                         address of the node network, outside the pod and service subnets"
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// This node's own addresses (`(key, address)`) against the VIP: kube-vip moves the VIP between
/// nodes, so an API server advertising it breaks as soon as it moves. `Err((key, message))`.
pub fn check_node_addresses(
    vip: IpAddr,
    addresses: &[(&'static str, Option<IpAddr>)],
) -> Result<(), (&'static str, String)> {
    for (key, addr) in addresses {
        if *addr == Some(vip) {
            return Err((
                key,
                format!("{key} is {vip}, the control-plane VIP; use this node's own address"),
            ));
        }
    }
    Ok(())
}

fn check_each(f: &ClusterFacts) -> Result<(), (&'static str, String)> {
    if let Some(v) = &f.kubernetes_version {
        version(v).map_err(|m| ("kubernetes_version", m.0))?;
    }
    if let Some(e) = &f.control_plane_endpoint {
        Endpoint::parse(e).map_err(|m| ("control_plane_endpoint", m.0))?;
    }
    if let Some(s) = &f.pod_subnet {
        cidrs(s).map_err(|m| ("pod_subnet", m.0))?;
    }
    if let Some(s) = &f.service_subnet {
        cidrs(s).map_err(|m| ("service_subnet", m.0))?;
    }
    if let Some(s) = &f.cri_socket
        && !s.starts_with("unix://")
    {
        return Err(("cri_socket", format!("{s:?} must be a unix:// URL")));
    }
    if let Some(n) = &f.cluster_name {
        if n.trim().is_empty() {
            return Err(("cluster_name", "must not be empty".into()));
        }
        if n.chars().any(char::is_control) {
            return Err((
                "cluster_name",
                "must not contain control characters such as a newline".into(),
            ));
        }
    }
    if let Some(d) = &f.dns_domain {
        if d.trim().is_empty() {
            return Err(("dns_domain", "must not be empty".into()));
        }
        if !is_dns_subdomain(d) {
            return Err((
                "dns_domain",
                format!(
                    "{d:?} is not a DNS domain (lowercase letters, digits, '-' and '.', like \
                     cluster.local)"
                ),
            ));
        }
    }
    let kv = &f.kube_vip;
    for (key, bound, n) in [
        (
            "kube_vip.lease_duration",
            &super::bounds::KUBE_VIP_LEASE_DURATION,
            kv.lease_duration,
        ),
        (
            "kube_vip.renew_deadline",
            &super::bounds::KUBE_VIP_RENEW_DEADLINE,
            kv.renew_deadline,
        ),
        (
            "kube_vip.retry_period",
            &super::bounds::KUBE_VIP_RETRY_PERIOD,
            kv.retry_period,
        ),
    ] {
        if let Some(n) = n {
            bound.check_value(n).map_err(|m| (key, m.0))?;
        }
    }
    if let (Some(d), Some(r), Some(p)) = (kv.lease_duration, kv.renew_deadline, kv.retry_period)
        && !(d > r && r > p && p > 0)
    {
        return Err((
            "kube_vip.lease_duration",
            format!(
                "kube-vip needs lease_duration > renew_deadline > retry_period > 0 (got {d}, {r}, {p})"
            ),
        ));
    }
    Ok(())
}
