//! kubeadm.k8s.io/v1beta4 documents and the kube-vip static Pod, from checked facts. Pure and
//! deterministic: the same facts give byte-identical YAML (keys sorted, as kubeadm writes).
//!
//! v1beta4 specifics: `extraArgs`/`kubeletExtraArgs` are lists of `{name, value}`; there is no
//! `timeoutForControlPlane`; kube-proxy is skipped with both `skipPhases: [addon/kube-proxy]`
//! and `proxy.disabled: true`; `certificateKey` and `controlPlane` live in the documents
//! (kubeadm refuses `--certificate-key` / `--control-plane` next to `--config`).

use serde_json::{Value, json};

use super::facts::{Cluster, NodeFacts};

pub const API_VERSION: &str = "kubeadm.k8s.io/v1beta4";
/// The kubeconfig path inside the kube-vip container; only the host side changes.
pub const KUBE_VIP_KUBECONFIG: &str = "/etc/kubernetes/admin.conf";
pub const SUPER_ADMIN_CONF: &str = "/etc/kubernetes/super-admin.conf";
pub const ADMIN_CONF: &str = "/etc/kubernetes/admin.conf";

/// Secrets that go into documents.
#[derive(Clone, Debug, Default)]
pub struct Secrets {
    /// `abcdef.0123456789abcdef`
    pub token: Option<String>,
    /// 64 hex digits.
    pub certificate_key: Option<String>,
    /// `sha256:<hex>`; not secret, but only known once the CA exists.
    pub ca_cert_hashes: Vec<String>,
}

fn node_registration(cluster: &Cluster, node: &NodeFacts) -> Value {
    let mut n = json!({ "name": node.name, "criSocket": cluster.cri_socket });
    if let Some(ip) = node.node_ip {
        n["kubeletExtraArgs"] = json!([{ "name": "node-ip", "value": ip.to_string() }]);
    }
    n
}

fn local_endpoint(cluster: &Cluster, node: &NodeFacts) -> Value {
    let mut e = json!({ "bindPort": cluster.endpoint.port });
    if let Some(a) = node.advertise_address {
        e["advertiseAddress"] = json!(a.to_string());
    }
    e
}

/// InitConfiguration and ClusterConfiguration for the first control-plane node.
pub fn init(cluster: &Cluster, node: &NodeFacts, secrets: &Secrets) -> Vec<Value> {
    let mut init = json!({
        "apiVersion": API_VERSION,
        "kind": "InitConfiguration",
        "localAPIEndpoint": local_endpoint(cluster, node),
        "nodeRegistration": node_registration(cluster, node),
    });
    if let Some(t) = &secrets.token {
        init["bootstrapTokens"] = json!([{
            "token": t,
            "description": "initKubeadm (ginx): joins the other nodes",
            "ttl": "24h0m0s",
            "usages": ["signing", "authentication"],
            "groups": ["system:bootstrappers:kubeadm:default-node-token"],
        }]);
    }
    if let Some(k) = &secrets.certificate_key {
        init["certificateKey"] = json!(k);
    }
    if cluster.kube_proxy_replacement {
        init["skipPhases"] = json!(["addon/kube-proxy"]);
    }
    vec![init, cluster_configuration(cluster)]
}

/// The ClusterConfiguration (also what is compared with the cluster's kubeadm-config).
pub fn cluster_configuration(cluster: &Cluster) -> Value {
    let mut c = json!({
        "apiVersion": API_VERSION,
        "kind": "ClusterConfiguration",
        "clusterName": cluster.cluster_name,
        "kubernetesVersion": cluster.kubernetes_version,
        "controlPlaneEndpoint": cluster.endpoint.to_string(),
        "networking": {
            "podSubnet": cluster.pod_subnet,
            "serviceSubnet": cluster.service_subnet,
            "dnsDomain": cluster.dns_domain,
        },
        "apiServer": { "certSANs": cluster.cert_sans },
    });
    if cluster.kube_proxy_replacement {
        c["proxy"] = json!({ "disabled": true });
    }
    c
}

/// A JoinConfiguration for a control-plane node or a worker. Discovery is pinned to the CA
/// (`caCertHashes`); the caller makes sure there is a hash.
pub fn join(cluster: &Cluster, node: &NodeFacts, secrets: &Secrets, control_plane: bool) -> Value {
    let discovery = json!({
        "apiServerEndpoint": cluster.endpoint.to_string(),
        "token": secrets.token.clone().unwrap_or_default(),
        "caCertHashes": secrets.ca_cert_hashes,
    });
    let mut j = json!({
        "apiVersion": API_VERSION,
        "kind": "JoinConfiguration",
        "discovery": { "bootstrapToken": discovery },
        "nodeRegistration": node_registration(cluster, node),
    });
    if control_plane {
        j["controlPlane"] = json!({
            "localAPIEndpoint": local_endpoint(cluster, node),
            "certificateKey": secrets.certificate_key.clone().unwrap_or_default(),
        });
    }
    j
}

/// The kube-vip static Pod; `host_kubeconfig` is super-admin.conf on the node running
/// `kubeadm init` (admin.conf has no rights until init has created the kubeadm:cluster-admins
/// binding), admin.conf everywhere else.
pub fn kube_vip(cluster: &Cluster, host_kubeconfig: &str) -> Value {
    let kv = &cluster.kube_vip;
    let vip = cluster.endpoint.host.clone();
    let subnet = match cluster.endpoint.ip() {
        Some(std::net::IpAddr::V6(_)) => "128",
        _ => "32",
    };
    let mut env = vec![
        json!({"name": "vip_arp", "value": "true"}),
        json!({"name": "port", "value": cluster.endpoint.port.to_string()}),
        json!({"name": "vip_nodename", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}),
    ];
    if let Some(i) = &kv.interface {
        env.push(json!({"name": "vip_interface", "value": i}));
    }
    env.extend([
        json!({"name": "vip_subnet", "value": subnet}),
        json!({"name": "dns_mode", "value": "first"}),
        json!({"name": "cp_enable", "value": "true"}),
        json!({"name": "cp_namespace", "value": "kube-system"}),
        json!({"name": "svc_enable", "value": "false"}),
        json!({"name": "vip_leaderelection", "value": "true"}),
        json!({"name": "vip_leasename", "value": "plndr-cp-lock"}),
        json!({"name": "vip_leaseduration", "value": kv.lease_duration.to_string()}),
        json!({"name": "vip_renewdeadline", "value": kv.renew_deadline.to_string()}),
        json!({"name": "vip_retryperiod", "value": kv.retry_period.to_string()}),
        json!({"name": "address", "value": vip}),
        json!({"name": "prometheus_server", "value": ":2112"}),
    ]);
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": "kube-vip", "namespace": "kube-system" },
        "spec": {
            "containers": [{
                "name": "kube-vip",
                "image": kv.image,
                "imagePullPolicy": "IfNotPresent",
                "args": ["manager"],
                "env": env,
                "securityContext": {
                    "capabilities": { "add": ["NET_ADMIN", "NET_RAW"], "drop": ["ALL"] }
                },
                "volumeMounts": [{ "name": "kubeconfig", "mountPath": KUBE_VIP_KUBECONFIG }],
            }],
            "hostAliases": [{ "ip": "127.0.0.1", "hostnames": ["kubernetes"] }],
            "hostNetwork": true,
            "volumes": [{ "name": "kubeconfig", "hostPath": { "path": host_kubeconfig, "type": "File" } }],
        }
    })
}

/// Documents as one YAML stream.
pub fn to_yaml(docs: &[Value]) -> Result<String, String> {
    let mut out = String::new();
    for (i, d) in docs.iter().enumerate() {
        if i > 0 {
            out.push_str("---\n");
        }
        let y = serde_saphyr::to_string(d).map_err(|e| format!("cannot write YAML: {e}"))?;
        out.push_str(&y);
        if !out.ends_with('\n') {
            out.push('\n');
        }
    }
    Ok(out)
}

/// Replaces secret values (bootstrap token, certificate key) with a placeholder.
pub fn mask(docs: &mut [Value]) {
    const HIDDEN: &str = "<hidden: use --show-secrets>";
    for d in docs {
        if let Some(tokens) = d.get_mut("bootstrapTokens").and_then(Value::as_array_mut) {
            for t in tokens {
                t["token"] = json!(HIDDEN);
            }
        }
        if d.get("certificateKey").is_some() {
            d["certificateKey"] = json!(HIDDEN);
        }
        if let Some(t) = d.pointer_mut("/discovery/bootstrapToken/token") {
            *t = json!(HIDDEN);
        }
        if let Some(k) = d.pointer_mut("/controlPlane/certificateKey") {
            *k = json!(HIDDEN);
        }
    }
}
