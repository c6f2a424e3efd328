//! Cluster facts, checked and completed with defaults: what the kubeadm documents and the
//! kube-vip manifest are rendered from. Pure.

use std::net::IpAddr;
use std::path::PathBuf;

use crate::config::ClusterFacts;
use crate::config::kubeadm::{Endpoint, check_node_addresses, check_partial, check_relations};
use crate::types::Role;

/// The kube-vip release the manifest uses unless told otherwise.
pub const KUBE_VIP_IMAGE: &str = "ghcr.io/kube-vip/kube-vip:v1.2.3";
pub const KUBE_VIP_MANIFEST: &str = "/etc/kubernetes/manifests/kube-vip.yaml";

/// Everything the renderer needs, complete and checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cluster {
    pub cluster_name: String,
    pub kubernetes_version: String,
    pub endpoint: Endpoint,
    pub pod_subnet: String,
    pub service_subnet: String,
    pub dns_domain: String,
    pub cert_sans: Vec<String>,
    pub kube_proxy_replacement: bool,
    pub cri_socket: String,
    pub kube_vip: KubeVip,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KubeVip {
    pub image: String,
    pub interface: Option<String>,
    pub manifest_path: PathBuf,
    pub lease_duration: u32,
    pub renew_deadline: u32,
    pub retry_period: u32,
}

/// This node, for the documents.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeFacts {
    pub name: String,
    pub role: Role,
    pub advertise_address: Option<IpAddr>,
    pub node_ip: Option<IpAddr>,
}

/// This node against the cluster: its own addresses must not be the VIP (kube-vip moves the
/// VIP between nodes; an API server advertising it breaks as soon as it moves).
pub fn check_node(cluster: &Cluster, node: &NodeFacts) -> Result<(), String> {
    let Some(vip) = cluster.endpoint.ip() else {
        return Ok(());
    };
    check_node_addresses(
        vip,
        &[
            ("node.advertise_address", node.advertise_address),
            ("node.node_ip", node.node_ip),
        ],
    )
    .map_err(|(_, m)| m)
}

/// Completes `f` with defaults and checks the facts against each other. `Err` names the fact.
pub fn resolve(f: &ClusterFacts) -> Result<Cluster, String> {
    check_partial(f).map_err(|(k, m)| format!("{k}: {m}"))?;
    let need = |v: &Option<String>, key: &str, example: &str| {
        v.clone().ok_or_else(|| {
            format!("{key} is not set (e.g. {key} = {example:?}) in [kubeadm] or the cluster file")
        })
    };
    let kubernetes_version = need(&f.kubernetes_version, "kubernetes_version", "v1.33.4")?;
    let endpoint = Endpoint::parse(&need(
        &f.control_plane_endpoint,
        "control_plane_endpoint",
        "10.0.0.100:6443",
    )?)?;
    let pod_subnet = need(&f.pod_subnet, "pod_subnet", "10.244.0.0/16")?;
    let service_subnet = f
        .service_subnet
        .clone()
        .unwrap_or_else(|| "10.96.0.0/12".to_owned());
    check_relations(&ClusterFacts {
        pod_subnet: Some(pod_subnet.clone()),
        service_subnet: Some(service_subnet.clone()),
        control_plane_endpoint: Some(endpoint.to_string()),
        ..ClusterFacts::default()
    })
    .map_err(|(_, m)| m)?;
    let mut cert_sans: Vec<String> = vec![endpoint.host.clone()];
    for san in f.cert_sans.clone().unwrap_or_default() {
        if !cert_sans.contains(&san) {
            cert_sans.push(san);
        }
    }
    let kv = &f.kube_vip;
    let kube_vip = KubeVip {
        image: kv
            .image
            .clone()
            .unwrap_or_else(|| KUBE_VIP_IMAGE.to_owned()),
        interface: kv.interface.clone(),
        manifest_path: kv
            .manifest_path
            .clone()
            .unwrap_or_else(|| PathBuf::from(KUBE_VIP_MANIFEST)),
        lease_duration: kv.lease_duration.unwrap_or(15),
        renew_deadline: kv.renew_deadline.unwrap_or(10),
        retry_period: kv.retry_period.unwrap_or(2),
    };
    if !(kube_vip.lease_duration > kube_vip.renew_deadline
        && kube_vip.renew_deadline > kube_vip.retry_period
        && kube_vip.retry_period > 0)
    {
        return Err(format!(
            "kube_vip: lease_duration ({}) > renew_deadline ({}) > retry_period ({}) > 0 is required",
            kube_vip.lease_duration, kube_vip.renew_deadline, kube_vip.retry_period
        ));
    }
    Ok(Cluster {
        cluster_name: f
            .cluster_name
            .clone()
            .unwrap_or_else(|| "kubernetes".to_owned()),
        kubernetes_version,
        endpoint,
        pod_subnet,
        service_subnet,
        dns_domain: f
            .dns_domain
            .clone()
            .unwrap_or_else(|| "cluster.local".to_owned()),
        cert_sans,
        kube_proxy_replacement: f.kube_proxy_replacement.unwrap_or(false),
        cri_socket: f
            .cri_socket
            .clone()
            .unwrap_or_else(|| "unix:///run/containerd/containerd.sock".to_owned()),
        kube_vip,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::kubeadm::Cidr;

    fn facts() -> ClusterFacts {
        ClusterFacts {
            kubernetes_version: Some("v1.33.4".into()),
            control_plane_endpoint: Some("10.0.0.100:6443".into()),
            pod_subnet: Some("10.244.0.0/16".into()),
            ..ClusterFacts::default()
        }
    }

    #[test]
    fn defaults_fill_what_the_facts_leave_out() {
        let c = resolve(&facts()).unwrap();
        assert_eq!(c.service_subnet, "10.96.0.0/12");
        assert_eq!(c.dns_domain, "cluster.local");
        assert_eq!(c.cluster_name, "kubernetes");
        assert_eq!(c.cert_sans, ["10.0.0.100"]);
        assert_eq!(c.kube_vip.lease_duration, 15);
        assert_eq!(c.kube_vip.image, KUBE_VIP_IMAGE);
    }

    #[test]
    fn cidrs_must_parse_and_not_overlap() {
        let mut f = facts();
        f.pod_subnet = Some("10.96.0.0/16".into());
        assert!(resolve(&f).unwrap_err().contains("overlap"));
        f.pod_subnet = Some("10.244.0.1/16".into());
        assert!(resolve(&f).unwrap_err().contains("host bits"));
        f.pod_subnet = Some("10.244.0.0/33".into());
        assert!(resolve(&f).unwrap_err().contains("prefix"));
        f.pod_subnet = Some("fd00:10::/56,10.244.0.0/16".into());
        assert!(resolve(&f).is_ok());
    }

    #[test]
    fn the_vip_must_lie_outside_pods_and_services() {
        let mut f = facts();
        f.control_plane_endpoint = Some("10.244.1.1:6443".into());
        let e = resolve(&f).unwrap_err();
        assert!(e.contains("10.244.1.1 lies inside 10.244.0.0/16"), "{e}");
    }

    #[test]
    fn versions_and_ports_are_checked() {
        let mut f = facts();
        f.kubernetes_version = Some("1.33".into());
        assert_eq!(check_partial(&f).unwrap_err().0, "kubernetes_version");
        let mut f = facts();
        f.control_plane_endpoint = Some("10.0.0.100:70000".into());
        assert!(
            check_partial(&f)
                .unwrap_err()
                .1
                .contains("not a valid port")
        );
        f.control_plane_endpoint = Some("10.0.0.100".into());
        assert!(check_partial(&f).is_err());
    }

    #[test]
    fn missing_facts_are_named() {
        let mut f = facts();
        f.kubernetes_version = None;
        assert!(
            resolve(&f)
                .unwrap_err()
                .contains("kubernetes_version is not set")
        );
    }

    #[test]
    fn cidr_arithmetic() {
        let c = Cidr::parse("10.96.0.0/12").unwrap();
        assert!(c.contains("10.111.255.255".parse().unwrap()));
        assert!(!c.contains("10.112.0.0".parse().unwrap()));
        assert!(c.overlaps(&Cidr::parse("10.100.0.0/16").unwrap()));
        assert!(!c.overlaps(&Cidr::parse("10.244.0.0/16").unwrap()));
        assert!(
            Cidr::parse("0.0.0.0/0")
                .unwrap()
                .contains("1.2.3.4".parse().unwrap())
        );
    }
}
