//! A strict schema of the kubeadm.k8s.io/v1beta4 types ginx emits (field names and types from
//! kubeadm's `cmd/kubeadm/app/apis/kubeadm/v1beta4/types.go`), and of the kube-vip Pod. Every
//! struct denies unknown fields: kubeadm itself only warns about them and drops them, so a
//! misspelt or v1beta3-only field (`timeoutForControlPlane`, a map-shaped `extraArgs`) would
//! otherwise go unnoticed.

#![allow(dead_code)]

use std::collections::BTreeMap;

use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Arg {
    pub name: String,
    pub value: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Taint {
    pub key: String,
    pub value: Option<String>,
    pub effect: String,
    pub time_added: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NodeRegistration {
    pub name: Option<String>,
    pub cri_socket: Option<String>,
    pub taints: Option<Vec<Taint>>,
    pub kubelet_extra_args: Option<Vec<Arg>>,
    pub ignore_preflight_errors: Option<Vec<String>>,
    pub image_pull_policy: Option<String>,
    pub image_pull_serial: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ApiEndpoint {
    pub advertise_address: Option<String>,
    pub bind_port: Option<i32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BootstrapToken {
    pub token: String,
    pub description: Option<String>,
    pub ttl: Option<String>,
    pub expires: Option<String>,
    pub usages: Option<Vec<String>>,
    pub groups: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Patches {
    pub directory: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Timeouts {
    pub control_plane_component_health_check: Option<String>,
    pub kubelet_health_check: Option<String>,
    #[serde(rename = "kubernetesAPICall")]
    pub kubernetes_api_call: Option<String>,
    #[serde(rename = "etcdAPICall")]
    pub etcd_api_call: Option<String>,
    pub tls_bootstrap: Option<String>,
    pub discovery: Option<String>,
    pub upgrade_manifests: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct InitConfiguration {
    pub api_version: String,
    pub kind: String,
    pub bootstrap_tokens: Option<Vec<BootstrapToken>>,
    pub dry_run: Option<bool>,
    pub node_registration: Option<NodeRegistration>,
    #[serde(rename = "localAPIEndpoint")]
    pub local_api_endpoint: Option<ApiEndpoint>,
    pub certificate_key: Option<String>,
    pub skip_phases: Option<Vec<String>>,
    pub patches: Option<Patches>,
    pub timeouts: Option<Timeouts>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HostPathMount {
    pub name: String,
    pub host_path: String,
    pub mount_path: String,
    pub read_only: Option<bool>,
    pub path_type: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Component {
    pub extra_args: Option<Vec<Arg>>,
    pub extra_volumes: Option<Vec<HostPathMount>>,
    pub extra_envs: Option<Vec<serde_json::Value>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ApiServer {
    pub extra_args: Option<Vec<Arg>>,
    pub extra_volumes: Option<Vec<HostPathMount>>,
    pub extra_envs: Option<Vec<serde_json::Value>>,
    #[serde(rename = "certSANs")]
    pub cert_sans: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Networking {
    pub service_subnet: Option<String>,
    pub pod_subnet: Option<String>,
    pub dns_domain: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Dns {
    pub image_repository: Option<String>,
    pub image_tag: Option<String>,
    pub disabled: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Proxy {
    pub disabled: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ClusterConfiguration {
    pub api_version: String,
    pub kind: String,
    pub etcd: Option<serde_json::Value>,
    pub networking: Option<Networking>,
    pub kubernetes_version: Option<String>,
    pub control_plane_endpoint: Option<String>,
    pub api_server: Option<ApiServer>,
    pub controller_manager: Option<Component>,
    pub scheduler: Option<Component>,
    pub dns: Option<Dns>,
    pub proxy: Option<Proxy>,
    pub certificates_dir: Option<String>,
    pub image_repository: Option<String>,
    pub feature_gates: Option<BTreeMap<String, bool>>,
    pub cluster_name: Option<String>,
    pub encryption_algorithm: Option<String>,
    pub certificate_validity_period: Option<String>,
    pub ca_certificate_validity_period: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BootstrapTokenDiscovery {
    pub token: String,
    pub api_server_endpoint: Option<String>,
    pub ca_cert_hashes: Option<Vec<String>>,
    #[serde(rename = "unsafeSkipCAVerification")]
    pub unsafe_skip_ca_verification: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FileDiscovery {
    pub kube_config_path: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Discovery {
    pub bootstrap_token: Option<BootstrapTokenDiscovery>,
    pub file: Option<FileDiscovery>,
    pub tls_bootstrap_token: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct JoinControlPlane {
    #[serde(rename = "localAPIEndpoint")]
    pub local_api_endpoint: Option<ApiEndpoint>,
    pub certificate_key: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct JoinConfiguration {
    pub api_version: String,
    pub kind: String,
    pub dry_run: Option<bool>,
    pub node_registration: Option<NodeRegistration>,
    pub ca_cert_path: Option<String>,
    pub discovery: Discovery,
    pub control_plane: Option<JoinControlPlane>,
    pub skip_phases: Option<Vec<String>>,
    pub patches: Option<Patches>,
    pub timeouts: Option<Timeouts>,
}

// The kube-vip static Pod, the parts of core/v1 it uses.

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct FieldRef {
    pub field_path: String,
    pub api_version: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct EnvSource {
    pub field_ref: FieldRef,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct EnvVar {
    pub name: String,
    pub value: Option<String>,
    pub value_from: Option<EnvSource>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Capabilities {
    pub add: Vec<String>,
    pub drop: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecurityContext {
    pub capabilities: Capabilities,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct VolumeMount {
    pub name: String,
    pub mount_path: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Container {
    pub name: String,
    pub image: String,
    pub image_pull_policy: Option<String>,
    pub args: Vec<String>,
    pub env: Vec<EnvVar>,
    pub security_context: SecurityContext,
    pub volume_mounts: Vec<VolumeMount>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostAlias {
    pub ip: String,
    pub hostnames: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostPath {
    pub path: String,
    #[serde(rename = "type")]
    pub type_: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Volume {
    pub name: String,
    pub host_path: HostPath,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PodSpec {
    pub containers: Vec<Container>,
    pub host_aliases: Vec<HostAlias>,
    pub host_network: bool,
    pub volumes: Vec<Volume>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Metadata {
    pub name: String,
    pub namespace: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Pod {
    pub api_version: String,
    pub kind: String,
    pub metadata: Metadata,
    pub spec: PodSpec,
}

/// One parsed document.
#[derive(Debug)]
pub enum Doc {
    Init(InitConfiguration),
    Cluster(ClusterConfiguration),
    Join(JoinConfiguration),
    Pod(Pod),
}

/// Parses a YAML stream strictly; panics (failing the test) on anything the schema rejects.
pub fn parse(yaml: &str) -> Vec<Doc> {
    let docs: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(yaml).unwrap_or_else(|e| panic!("not YAML: {e}\n{yaml}"));
    docs.into_iter()
        .map(|d| {
            let kind = d["kind"].as_str().unwrap_or("").to_owned();
            let api = d["apiVersion"].as_str().unwrap_or("").to_owned();
            let strict = |r: Result<Doc, serde_json::Error>| {
                r.unwrap_or_else(|e| panic!("{kind} violates the schema: {e}\n{yaml}"))
            };
            match kind.as_str() {
                "InitConfiguration" | "ClusterConfiguration" | "JoinConfiguration" => {
                    assert_eq!(api, "kubeadm.k8s.io/v1beta4", "{kind}");
                }
                _ => {}
            }
            match kind.as_str() {
                "InitConfiguration" => strict(serde_json::from_value(d).map(Doc::Init)),
                "ClusterConfiguration" => strict(serde_json::from_value(d).map(Doc::Cluster)),
                "JoinConfiguration" => strict(serde_json::from_value(d).map(Doc::Join)),
                "Pod" => strict(serde_json::from_value(d).map(Doc::Pod)),
                other => panic!("unexpected kind {other:?}"),
            }
        })
        .collect()
}
