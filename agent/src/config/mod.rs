//! The configuration: schema, defaults, drop-in merge and validation.
//!
//! Pure apart from reading the files: [`load`] returns a validated [`Config`] or a
//! [`ConfigError`] naming `file:line:column` and the key. Defaults live here and only here, in
//! the `Default` impls and `default_*` functions; `ginx --print-default-config` prints them (the
//! README's reference lists the same values and a test checks that its example is valid).
//!
//! Not here: what the daemon does when the configuration changes (see `daemon`).

mod duration;
mod load;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use duration::Duration;
pub use load::{Location, config_files};
use load::{Origins, join_index, join_key};

use crate::source::{RemoteUrl, Transport};

/// Where the daemon and `ginxctl` look when no `--config` is given.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/ginx/config.toml";

/// The whole configuration, after merging and validation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Clones, apply trees, the state file and the apply history.
    pub state_dir: PathBuf,
    /// The control socket `ginxctl` talks to.
    pub socket: PathBuf,
    pub node: NodeConfig,
    /// Named Git sources; the name is used in paths, status and annotations.
    pub sources: BTreeMap<String, SourceConfig>,
    pub apply: ApplyConfig,
    pub system: SystemConfig,
    pub control: ControlConfig,
    pub kubernetes: KubernetesConfig,
    pub health: HealthConfig,
    pub metrics: MetricsConfig,
    pub kubeadm: KubeadmConfig,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            state_dir: PathBuf::from("/var/lib/ginx"),
            socket: PathBuf::from("/run/ginx/ginx.sock"),
            node: NodeConfig::default(),
            sources: BTreeMap::new(),
            apply: ApplyConfig::default(),
            system: SystemConfig::default(),
            control: ControlConfig::default(),
            kubernetes: KubernetesConfig::default(),
            health: HealthConfig::default(),
            metrics: MetricsConfig::default(),
            kubeadm: KubeadmConfig::default(),
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NodeConfig {
    /// The node's name in the hive and in Kubernetes. Filled from the kernel hostname when
    /// absent, so after [`load`] it is always set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Control-plane nodes are the ones a rollout must never take down together, so an
    /// unspecified role errs on that side.
    pub role: Role,
    /// The address the API server advertises on this node (kubeadm's localAPIEndpoint).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub advertise_address: Option<std::net::IpAddr>,
    /// The kubelet's `--node-ip`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_ip: Option<std::net::IpAddr>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    #[default]
    ControlPlane,
    Worker,
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::ControlPlane => "control-plane",
            Role::Worker => "worker",
        })
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceConfig {
    /// The remote. Shown everywhere without credentials. Either this or `urls`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<RemoteUrl>,
    /// Several remotes, tried in order on every fetch; the first that answers serves.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub urls: Vec<RemoteUrl>,
    #[serde(default = "default_branch")]
    pub branch: String,
    /// How often to fetch; each wait is jittered by ±10% so a fleet does not fetch in step.
    #[serde(default = "default_interval")]
    pub interval: Duration,
    /// A fetch (all remotes together) taking longer is abandoned and counted as failed.
    #[serde(default = "default_fetch_timeout")]
    pub fetch_timeout: Duration,
    /// Private key for SSH remotes (a deploy key); must not be readable by group or others.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh_key_file: Option<PathBuf>,
    /// Host keys SSH remotes are checked against; an unknown or changed key is an error.
    #[serde(default = "default_known_hosts_file")]
    pub known_hosts_file: PathBuf,
    /// Token for HTTPS remotes, sent as the password of HTTP basic authentication.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_file: Option<PathBuf>,
    /// The user name sent with `token_file` (some servers want a particular one).
    #[serde(default = "default_token_username")]
    pub username: String,
    /// Git's SSH allowed-signers file (`gpg.format=ssh`): when set, the head must carry a valid
    /// SSH signature by a key listed there for the `git` namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_signers_file: Option<PathBuf>,
    /// OpenPGP public keys (armored or binary): when set, the head must carry a valid OpenPGP
    /// signature by one of them. With `allowed_signers_file` too, either kind is accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub openpgp_keyring_file: Option<PathBuf>,
    /// A per-node branch (`{node}` is replaced) preferred while it descends from `branch`'s
    /// head, applied with `testing_goal`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub testing_branch: Option<String>,
    /// The goal for revisions of the testing branch; `test` does not touch the boot entries, so
    /// a reboot returns to the last deployment of `branch`.
    #[serde(default = "default_testing_goal")]
    pub testing_goal: Goal,
    /// A directory inside the repository to apply in (a hive in a subfolder).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
}

impl SourceConfig {
    /// The remotes in the order they are tried.
    pub fn remotes(&self) -> Vec<RemoteUrl> {
        if self.urls.is_empty() {
            self.url.iter().cloned().collect()
        } else {
            self.urls.clone()
        }
    }

    /// The testing branch of node `node`, if one is configured.
    pub fn testing_branch_for(&self, node: &str) -> Option<String> {
        self.testing_branch
            .as_ref()
            .map(|t| t.replace("{node}", node))
    }
}

fn default_branch() -> String {
    "main".to_owned()
}

fn default_interval() -> Duration {
    Duration::from_secs(60)
}

fn default_fetch_timeout() -> Duration {
    Duration::from_secs(5 * 60)
}

fn default_known_hosts_file() -> PathBuf {
    PathBuf::from("/etc/ssh/ssh_known_hosts")
}

fn default_token_username() -> String {
    "git".to_owned()
}

fn default_testing_goal() -> Goal {
    Goal::Test
}

/// The `colmena apply-local` goal, appended to `apply.command`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Goal {
    #[default]
    Switch,
    Boot,
    Test,
    DryActivate,
    Build,
}

impl Goal {
    pub fn as_str(self) -> &'static str {
        match self {
            Goal::Switch => "switch",
            Goal::Boot => "boot",
            Goal::Test => "test",
            Goal::DryActivate => "dry-activate",
            Goal::Build => "build",
        }
    }
}

impl fmt::Display for Goal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ApplyConfig {
    /// The source whose revisions are applied.
    pub source: String,
    /// argv; `{node}` is replaced by the node name and the goal is appended.
    pub command: Vec<String>,
    pub goal: Goal,
    /// An attempt running longer is killed, with its whole process group.
    pub timeout: Duration,
    /// First wait before retrying a failed revision; doubles per failure.
    pub retry_base: Duration,
    /// Cap on that wait.
    pub retry_max: Duration,
    /// Between SIGTERM and SIGKILL when an attempt is stopped.
    pub kill_grace: Duration,
    /// How long a SIGTERM to ginx waits for a running `process` attempt before stopping it
    /// (a `systemd-run` attempt runs on, and the next ginx attaches to it).
    pub shutdown_grace: Duration,
    /// Failed attempts of one revision before it is given up until a new revision or
    /// `ginxctl retry`.
    pub max_attempts: u32,
    /// How attempts are shielded from ginx's own restart.
    pub isolation: IsolationMode,
    /// Programs used for `systemd-run` isolation.
    pub systemd_run: PathBuf,
    pub systemctl: PathBuf,
    /// Run after a successful / failed attempt (argv), with GINX_NODE, GINX_SOURCE,
    /// GINX_REVISION, GINX_GOAL, GINX_STATUS and GINX_ERROR in the environment.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub on_success: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub on_failure: Vec<String>,
    /// A hook running longer is killed; a failing hook is logged, never fatal.
    pub hook_timeout: Duration,
    /// When the running system changes to one ginx did not produce: only `report` it, or
    /// `reapply` the applied revision.
    pub on_drift: DriftPolicy,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum IsolationMode {
    /// `systemd-run` when ginx runs as a systemd service and systemd-run exists, else `process`.
    #[default]
    Auto,
    SystemdRun,
    Process,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DriftPolicy {
    #[default]
    Report,
    Reapply,
}

/// Where NixOS keeps what ginx inspects, and the commands it uses to roll back. Paths are
/// configurable for tests.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SystemConfig {
    /// The system profile; `<profile>-N-link` are its generations.
    pub profile: PathBuf,
    pub current_system: PathBuf,
    pub booted_system: PathBuf,
    /// `ginxctl rollback`: first this (`{profile}` replaced)...
    pub rollback_command: Vec<String>,
    /// ...then this activates the rolled-back generation.
    pub switch_command: Vec<String>,
    /// When, after an activation, either resolves to a different file than when ginx started,
    /// ginx restarts itself into the new version.
    pub ginx_binary: PathBuf,
    pub ginx_unit: PathBuf,
    /// How often the running system is compared with the one ginx last produced.
    pub drift_check_interval: Duration,
}

impl Default for SystemConfig {
    fn default() -> Self {
        Self {
            profile: PathBuf::from("/nix/var/nix/profiles/system"),
            current_system: PathBuf::from("/run/current-system"),
            booted_system: PathBuf::from("/run/booted-system"),
            rollback_command: ["nix-env", "--profile", "{profile}", "--rollback"]
                .map(String::from)
                .to_vec(),
            switch_command: ["{profile}/bin/switch-to-configuration", "switch"]
                .map(String::from)
                .to_vec(),
            ginx_binary: PathBuf::from("/run/current-system/sw/bin/ginx"),
            ginx_unit: PathBuf::from("/etc/systemd/system/ginx.service"),
            drift_check_interval: Duration::from_secs(30),
        }
    }
}

impl Default for ApplyConfig {
    fn default() -> Self {
        Self {
            source: "hephaestus".to_owned(),
            command: ["colmena", "apply-local", "--node", "{node}"]
                .map(String::from)
                .to_vec(),
            goal: Goal::Switch,
            timeout: Duration::from_secs(30 * 60),
            retry_base: Duration::from_secs(30),
            retry_max: Duration::from_secs(30 * 60),
            kill_grace: Duration::from_secs(10),
            shutdown_grace: Duration::from_secs(60),
            max_attempts: 5,
            isolation: IsolationMode::Auto,
            systemd_run: PathBuf::from("systemd-run"),
            systemctl: PathBuf::from("systemctl"),
            on_success: Vec::new(),
            on_failure: Vec::new(),
            hook_timeout: Duration::from_secs(60),
            on_drift: DriftPolicy::Report,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ControlConfig {
    /// Members (and root) may sync, suspend and resume; anyone who can open the socket may
    /// read status.
    pub group: String,
}

impl Default for ControlConfig {
    fn default() -> Self {
        Self {
            group: "wheel".to_owned(),
        }
    }
}

/// How ginx reports to the cluster. Without `kubeconfig` nothing is reported (and nothing
/// waits for it).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KubernetesConfig {
    /// ginx's own credentials (client certificate or token); see packaging/kubernetes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kubeconfig: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub context: Option<String>,
    /// Where the heartbeat Lease lives.
    pub namespace: String,
    /// `{node}` is replaced by the node name.
    pub lease_name: String,
    pub lease_duration: Duration,
    pub renew_interval: Duration,
    /// Annotations are compared with the node's and the condition's heartbeat refreshed this
    /// often, even when nothing changed.
    pub resync_interval: Duration,
    pub condition_type: String,
    /// Prefix of the node annotations ginx owns.
    pub annotation_prefix: String,
    /// One API request (connect, read or write) taking longer fails.
    pub request_timeout: Duration,
}

impl Default for KubernetesConfig {
    fn default() -> Self {
        Self {
            kubeconfig: None,
            context: None,
            namespace: "ginx-system".to_owned(),
            lease_name: "ginx-{node}".to_owned(),
            lease_duration: Duration::from_secs(40),
            renew_interval: Duration::from_secs(10),
            resync_interval: Duration::from_secs(600),
            condition_type: "GinxHealthy".to_owned(),
            annotation_prefix: "ginx.io/".to_owned(),
            request_timeout: Duration::from_secs(10),
        }
    }
}

impl KubernetesConfig {
    pub fn lease_name_for(&self, node: &str) -> String {
        self.lease_name.replace("{node}", node)
    }
}

/// Health probes. Each has `enabled`, and may override `interval` and `timeout`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HealthConfig {
    pub interval: Duration,
    pub timeout: Duration,
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
    #[serde(default = "yes")]
    pub enabled: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<Duration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Duration>,
    #[serde(default = "default_kubelet_url")]
    pub url: String,
}

fn default_kubelet_url() -> String {
    "http://127.0.0.1:10248/healthz".to_owned()
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
    #[serde(default = "yes")]
    pub enabled: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<Duration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Duration>,
    #[serde(default = "default_local_apiserver")]
    pub local_url: String,
    /// Default: the server of the kubeconfig (the control-plane endpoint).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vip_url: Option<String>,
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

fn default_local_apiserver() -> String {
    "https://127.0.0.1:6443".to_owned()
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
    #[serde(default = "yes")]
    pub enabled: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<Duration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Duration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<std::net::IpAddr>,
    #[serde(default = "default_kube_system")]
    pub lease_namespace: String,
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
    #[serde(default = "yes")]
    pub enabled: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<Duration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Duration>,
    #[serde(default = "default_cilium_socket")]
    pub socket: PathBuf,
    #[serde(default = "default_cilium_fallback")]
    pub fallback_url: String,
}

fn default_cilium_socket() -> PathBuf {
    PathBuf::from("/var/run/cilium/cilium.sock")
}

fn default_cilium_fallback() -> String {
    "http://127.0.0.1:9879/healthz".to_owned()
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
    #[serde(default = "yes")]
    pub enabled: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<Duration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Duration>,
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
    #[serde(default = "yes")]
    pub enabled: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<Duration>,
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

/// Prometheus metrics.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// Off unless set, e.g. `"127.0.0.1:9977"`.
    #[serde(
        skip_serializing_if = "Option::is_none",
        deserialize_with = "socket_address"
    )]
    pub listen: Option<std::net::SocketAddr>,
}

/// An `IP:PORT`, with an example when it is not one (a host name is not resolved).
fn socket_address<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<std::net::SocketAddr>, D::Error> {
    let s = String::deserialize(d)?;
    s.parse().map(Some).map_err(|_| {
        serde::de::Error::custom(format!(
            "{s:?} is not an address; write IP:PORT, like \"127.0.0.1:9977\" or \"[::1]:9977\""
        ))
    })
}

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
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The interface the VIP is announced on (ARP).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest_path: Option<PathBuf>,
    /// Seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_duration: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renew_deadline: Option<u32>,
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
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_file: Option<PathBuf>,
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
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes_version: Option<String>,
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
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kube_proxy_replacement: Option<bool>,
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

/// A configuration that could not be read or is not valid.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read configuration file {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot list drop-in directory {}: {source}", path.display())]
    ReadDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{location}: {message}")]
    Parse { location: Location, message: String },
    #[error("{place}: {key}: {message}")]
    Invalid {
        /// `file:line:column` where known, else the main file.
        place: String,
        key: String,
        message: String,
    },
}

/// A validated configuration and the files it was read from.
#[derive(Clone, Debug)]
pub struct Loaded {
    pub config: Config,
    pub files: Vec<PathBuf>,
}

/// Reads `main` and its drop-ins, merges and validates them.
pub fn load(main: &Path) -> Result<Loaded, ConfigError> {
    let files = config_files(main)?;
    let config = load_files(&files)?;
    Ok(Loaded { config, files })
}

/// The `socket` setting of the configuration at `main`, read leniently (for `ginxctl`, which
/// must find the daemon even when the files hold an error the daemon refused).
pub fn peek_socket(main: &Path) -> Option<PathBuf> {
    let files = config_files(main).ok()?;
    let (merged, _) = load::read_merged(&files).ok()?;
    merged.get("socket")?.as_str().map(PathBuf::from)
}

fn load_files(files: &[PathBuf]) -> Result<Config, ConfigError> {
    let (merged, origins) = load::read_merged(files)?;
    let ctx = Ctx {
        origins: &origins,
        main: &files[0],
        files,
    };
    let mut config: Config =
        serde_path_to_error::deserialize(toml::Value::Table(merged)).map_err(|e| {
            let key = path_string(e.path());
            let mut message = e.inner().message().trim().to_owned();
            if key == "sources" || key.starts_with("sources.") {
                // A misplaced URL there may carry a token: never echo the value.
                message = without_string_value(&message);
            }
            let message = if message.starts_with("unknown field") {
                format!("{message}; remove or correct the key")
            } else {
                message
            };
            // A value error points at the value; an unknown key at the key itself.
            ctx.error_at(&key, !message.starts_with("unknown field"), message)
        })?;
    config.validate(&ctx)?;
    Ok(config)
}

/// serde's `invalid type: string "…", expected …` without the string itself.
fn without_string_value(message: &str) -> String {
    match (message.find("string \""), message.rfind("\", expected")) {
        (Some(start), Some(end)) if start < end => {
            format!("{}a string{}", &message[..start], &message[end + 1..])
        }
        _ => message.to_owned(),
    }
}

fn path_string(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    let mut s = String::new();
    for seg in path.iter() {
        s = match seg {
            Segment::Seq { index } => join_index(&s, *index),
            Segment::Map { key } | Segment::Enum { variant: key } => join_key(&s, key),
            Segment::Unknown => s,
        };
    }
    s
}

/// What validation needs to point at the right place.
struct Ctx<'a> {
    origins: &'a Origins,
    main: &'a Path,
    /// All files, in merge order.
    files: &'a [PathBuf],
}

impl Ctx<'_> {
    fn error_at(&self, key: &str, at_value: bool, message: impl Into<String>) -> ConfigError {
        let place = match self.origins.find(key) {
            Some(o) if at_value => o.value.to_string(),
            Some(o) => o.key.to_string(),
            None => self.main.display().to_string(),
        };
        ConfigError::Invalid {
            place,
            key: key.to_owned(),
            message: message.into(),
        }
    }

    fn error(&self, key: &str, message: impl Into<String>) -> ConfigError {
        self.error_at(key, true, message)
    }
}

impl Config {
    /// The node's name; always set once loaded.
    pub fn node_name(&self) -> &str {
        self.node.name.as_deref().unwrap_or("")
    }

    /// The configuration rendered as TOML, with credentials redacted (URLs print without
    /// them; no other key holds a secret, only paths to secrets).
    pub fn to_toml(&self) -> String {
        toml::to_string(self).unwrap_or_else(|e| format!("# cannot render configuration: {e}\n"))
    }

    fn validate(&mut self, ctx: &Ctx<'_>) -> Result<(), ConfigError> {
        for (key, path) in [("state_dir", &self.state_dir), ("socket", &self.socket)] {
            if !path.is_absolute() {
                return Err(ctx.error(key, format!("{} must be an absolute path", path.display())));
            }
        }
        match &self.node.name {
            Some(name) => {
                check_node_name(name).map_err(|m| ctx.error("node.name", m))?;
            }
            None => {
                let host = nix::unistd::gethostname()
                    .ok()
                    .and_then(|h| h.into_string().ok())
                    .map(|h| h.trim().to_ascii_lowercase())
                    .filter(|h| !h.is_empty())
                    .ok_or_else(|| {
                        ctx.error(
                            "node.name",
                            "not set and the hostname cannot be read; set it",
                        )
                    })?;
                check_node_name(&host).map_err(|m| {
                    ctx.error(
                        "node.name",
                        format!("not set, and the hostname is unusable: {m}"),
                    )
                })?;
                self.node.name = Some(host);
            }
        }
        if self.sources.is_empty() {
            return Err(ctx.error(
                "sources",
                "no sources configured; add a [sources.hephaestus] table with a url",
            ));
        }
        let node = self.node_name().to_owned();
        for (name, source) in &mut self.sources {
            let key = join_key("sources", name);
            check_source_name(name).map_err(|m| ctx.error_at(&key, false, m))?;
            let branch_ok = !source.branch.is_empty()
                && git2::Reference::is_valid_name(&format!("refs/heads/{}", source.branch));
            if !branch_ok {
                return Err(ctx.error(
                    &join_key(&key, "branch"),
                    format!("{:?} is not a valid branch name", source.branch),
                ));
            }
            for (field, d) in [
                ("interval", source.interval),
                ("fetch_timeout", source.fetch_timeout),
            ] {
                if d.is_zero() {
                    return Err(ctx.error(&join_key(&key, field), "must be longer than 0s"));
                }
            }
            match (&source.url, source.urls.is_empty()) {
                (Some(_), false) => {
                    // Set in different files, the later one wins like any other key.
                    let file_of = |k: &str| {
                        let at = ctx.origins.find(&join_key(&key, k)).map(|o| &o.key.file);
                        ctx.files.iter().position(|f| Some(f) == at)
                    };
                    match (file_of("url"), file_of("urls")) {
                        (Some(u), Some(us)) if us > u => source.url = None,
                        (Some(u), Some(us)) if u > us => source.urls.clear(),
                        _ => {
                            return Err(ctx.error_at(
                                &join_key(&key, "urls"),
                                false,
                                "set either url or urls in one file, not both",
                            ));
                        }
                    }
                }
                (None, true) => {
                    return Err(ctx.error_at(&key, false,
                        "missing url; give the remote as url = \"...\" (or several as urls = [...])"));
                }
                _ => {}
            }
            let remotes = source.remotes();
            if source.ssh_key_file.is_some()
                && !remotes.iter().any(|r| r.transport() == Transport::Ssh)
            {
                return Err(ctx.error(
                    &join_key(&key, "ssh_key_file"),
                    "is set but no remote of this source uses SSH",
                ));
            }
            if source.token_file.is_some()
                && !remotes
                    .iter()
                    .any(|r| matches!(r.transport(), Transport::Http | Transport::Https))
            {
                return Err(ctx.error(
                    &join_key(&key, "token_file"),
                    "is set but no remote of this source uses HTTP(S)",
                ));
            }
            for (field, path) in [
                ("ssh_key_file", &source.ssh_key_file),
                ("token_file", &source.token_file),
                ("allowed_signers_file", &source.allowed_signers_file),
                ("openpgp_keyring_file", &source.openpgp_keyring_file),
                ("known_hosts_file", &Some(source.known_hosts_file.clone())),
            ] {
                if let Some(p) = path
                    && !p.is_absolute()
                {
                    return Err(ctx.error(
                        &join_key(&key, field),
                        format!("{} must be an absolute path", p.display()),
                    ));
                }
            }
            if let Some(testing) = source.testing_branch_for(&node) {
                let valid = !testing.is_empty()
                    && git2::Reference::is_valid_name(&format!("refs/heads/{testing}"));
                if !valid {
                    return Err(ctx.error(
                        &join_key(&key, "testing_branch"),
                        format!("{testing:?} is not a valid branch name"),
                    ));
                }
                if testing == source.branch {
                    return Err(
                        ctx.error(&join_key(&key, "testing_branch"), "must differ from branch")
                    );
                }
            }
            if let Some(p) = &source.path {
                let ok = p.is_relative()
                    && p.components().all(|c| {
                        matches!(
                            c,
                            std::path::Component::Normal(_) | std::path::Component::CurDir
                        )
                    });
                if !ok {
                    return Err(ctx.error(
                        &join_key(&key, "path"),
                        format!(
                            "{} must be a relative path inside the repository, without \"..\"",
                            p.display()
                        ),
                    ));
                }
            }
        }
        if !self.sources.contains_key(&self.apply.source) {
            let known: Vec<&str> = self.sources.keys().map(String::as_str).collect();
            return Err(ctx.error(
                "apply.source",
                format!(
                    "{:?} names no source; configured sources: {}",
                    self.apply.source,
                    known.join(", ")
                ),
            ));
        }
        if self
            .apply
            .command
            .first()
            .is_none_or(|c| c.trim().is_empty())
        {
            return Err(ctx.error(
                "apply.command",
                "must name a program, e.g. [\"colmena\", \"apply-local\", \"--node\", \"{node}\"]",
            ));
        }
        for (key, d) in [
            ("apply.timeout", self.apply.timeout),
            ("apply.retry_base", self.apply.retry_base),
            ("apply.retry_max", self.apply.retry_max),
        ] {
            if d.is_zero() {
                return Err(ctx.error(key, "must be longer than 0s"));
            }
        }
        if self.apply.retry_max < self.apply.retry_base {
            return Err(ctx.error(
                "apply.retry_max",
                format!(
                    "{} is shorter than apply.retry_base ({})",
                    self.apply.retry_max, self.apply.retry_base
                ),
            ));
        }
        if self.apply.max_attempts == 0 {
            return Err(ctx.error("apply.max_attempts", "must be at least 1"));
        }
        for (key, argv) in [
            ("apply.on_success", &self.apply.on_success),
            ("apply.on_failure", &self.apply.on_failure),
        ] {
            if argv.first().is_some_and(|p| p.trim().is_empty()) {
                return Err(ctx.error(key, "must name a program, or be empty for no hook"));
            }
        }
        for (key, argv) in [
            ("system.rollback_command", &self.system.rollback_command),
            ("system.switch_command", &self.system.switch_command),
        ] {
            if argv.first().is_none_or(|p| p.trim().is_empty()) {
                return Err(ctx.error(key, "must name a program"));
            }
        }
        if self.system.drift_check_interval.is_zero() {
            return Err(ctx.error("system.drift_check_interval", "must be longer than 0s"));
        }
        let k = &self.kubernetes;
        for (key, d) in [
            ("kubernetes.lease_duration", k.lease_duration),
            ("kubernetes.renew_interval", k.renew_interval),
            ("kubernetes.resync_interval", k.resync_interval),
            ("kubernetes.request_timeout", k.request_timeout),
            ("health.interval", self.health.interval),
            ("health.timeout", self.health.timeout),
        ] {
            if d.is_zero() {
                return Err(ctx.error(key, "must be longer than 0s"));
            }
        }
        let h = &self.health;
        for (probe, interval, timeout) in [
            ("kubelet", h.kubelet.interval, h.kubelet.timeout),
            ("apiserver", h.apiserver.interval, h.apiserver.timeout),
            ("kube_vip", h.kube_vip.interval, h.kube_vip.timeout),
            ("cilium", h.cilium.interval, h.cilium.timeout),
            ("systemd", h.systemd.interval, h.systemd.timeout),
            ("node_ready", h.node_ready.interval, h.node_ready.timeout),
        ] {
            for (what, d) in [("interval", interval), ("timeout", timeout)] {
                if d.is_some_and(|d| d.is_zero()) {
                    return Err(
                        ctx.error(&format!("health.{probe}.{what}"), "must be longer than 0s")
                    );
                }
            }
        }
        if k.renew_interval >= k.lease_duration {
            return Err(ctx.error(
                "kubernetes.renew_interval",
                format!(
                    "must be shorter than kubernetes.lease_duration ({}), or the lease expires between renewals",
                    k.lease_duration
                ),
            ));
        }
        if let Some(p) = &k.kubeconfig
            && !p.is_absolute()
        {
            return Err(ctx.error(
                "kubernetes.kubeconfig",
                format!("{} must be an absolute path", p.display()),
            ));
        }
        let lease = k.lease_name_for(self.node_name());
        if !is_dns_subdomain(&lease) || !is_dns_label(&k.namespace) {
            return Err(ctx.error(
                "kubernetes.lease_name",
                format!(
                    "lease {:?} in namespace {:?} is not a valid Kubernetes name",
                    lease, k.namespace
                ),
            ));
        }
        let prefix_ok = k.annotation_prefix.ends_with('/')
            && is_dns_subdomain(k.annotation_prefix.trim_end_matches('/'));
        if !prefix_ok {
            return Err(ctx.error(
                "kubernetes.annotation_prefix",
                "must be a DNS subdomain followed by '/', like \"ginx.io/\"",
            ));
        }
        if k.condition_type.is_empty()
            || !k.condition_type.chars().all(|c| c.is_ascii_alphanumeric())
        {
            return Err(ctx.error(
                "kubernetes.condition_type",
                "must be a CamelCase word, like \"GinxHealthy\"",
            ));
        }
        for (key, url) in [
            ("health.kubelet.url", &self.health.kubelet.url),
            (
                "health.cilium.fallback_url",
                &self.health.cilium.fallback_url,
            ),
        ] {
            if !url.starts_with("http://") || url::Url::parse(url).is_err() {
                return Err(ctx.error(key, format!("{url:?} must be an http:// URL")));
            }
        }
        for (key, url) in [
            (
                "health.apiserver.local_url",
                Some(&self.health.apiserver.local_url),
            ),
            (
                "health.apiserver.vip_url",
                self.health.apiserver.vip_url.as_ref(),
            ),
        ] {
            if let Some(url) = url
                && (!url.starts_with("https://") || url.parse::<http::Uri>().is_err())
            {
                return Err(ctx.error(key, format!("{url:?} must be an https:// URL")));
            }
        }
        let ka = &self.kubeadm;
        match (&ka.source, &ka.cluster_file) {
            (Some(src), Some(_)) if !self.sources.contains_key(src) => {
                return Err(ctx.error("kubeadm.source", format!("{src:?} names no source")));
            }
            (Some(_), None) => {
                return Err(ctx.error("kubeadm.source", "is set but kubeadm.cluster_file is not"));
            }
            (None, Some(_)) => {
                return Err(ctx.error("kubeadm.cluster_file", "is set but kubeadm.source is not"));
            }
            _ => {}
        }
        if let Some(f) = &ka.cluster_file
            && !f
                .components()
                .all(|c| matches!(c, std::path::Component::Normal(_)))
        {
            return Err(ctx.error(
                "kubeadm.cluster_file",
                "must be a relative path inside the source, without \"..\"",
            ));
        }
        // Facts written here are checked now; with those from the source, when rendering.
        if let Err((key, message)) = crate::kubeadm::facts::check_partial(&ka.facts()) {
            return Err(ctx.error(&format!("kubeadm.{key}"), message));
        }
        if self.control.group.trim().is_empty() {
            return Err(ctx.error("control.group", "must name a group"));
        }
        Ok(())
    }
}

/// RFC 1123 subdomain, as Kubernetes object names.
fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns_label)
}

/// RFC 1123 label.
fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// Kubernetes node names are DNS subdomains; colmena node names must match them here.
fn check_node_name(name: &str) -> Result<(), String> {
    if is_dns_subdomain(name) {
        Ok(())
    } else {
        Err(format!(
            "{name:?} is not a valid node name (lowercase letters, digits, '-' and '.', \
             each dot-separated part starting and ending with a letter or digit)"
        ))
    }
}

/// Source names become directory names and parts of annotation keys.
fn check_source_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 40
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
        && name.starts_with(|c: char| c.is_ascii_lowercase());
    if ok {
        Ok(())
    } else {
        Err(format!(
            "source name {name:?} must start with a lowercase letter and use only lowercase \
             letters, digits, '-' and '_' (at most 40)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = r#"
state_dir = "/var/lib/ginx"

[node]
name = "lucy"

[sources.hephaestus]
url = "ssh://git@git.example.com/infra/hephaestus.git"
"#;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, text).unwrap();
        p
    }

    fn load_text(text: &str) -> Result<Config, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        let main = write(dir.path(), "config.toml", text);
        load(&main).map(|l| l.config)
    }

    fn err_text(text: &str) -> String {
        load_text(text).unwrap_err().to_string()
    }

    #[test]
    fn defaults_fill_what_is_not_written() {
        let c = load_text(BASE).unwrap();
        assert_eq!(c.socket, PathBuf::from("/run/ginx/ginx.sock"));
        assert_eq!(c.node.role, Role::ControlPlane);
        let s = &c.sources["hephaestus"];
        assert_eq!(s.branch, "main");
        assert_eq!(s.interval, Duration::from_secs(60));
        assert_eq!(c.apply.source, "hephaestus");
        assert_eq!(c.apply.command[0], "colmena");
        assert_eq!(c.apply.goal, Goal::Switch);
        assert_eq!(c.control.group, "wheel");
    }

    #[test]
    fn dropins_merge_in_lexical_order_later_wins() {
        let dir = tempfile::tempdir().unwrap();
        let main = write(dir.path(), "config.toml", BASE);
        write(
            dir.path(),
            "config.d/20-late.toml",
            "[sources.hephaestus]\nbranch = \"late\"\n",
        );
        write(
            dir.path(),
            "config.d/10-early.toml",
            "[sources.hephaestus]\nbranch = \"early\"\ninterval = \"5m\"\n",
        );
        write(dir.path(), "config.d/notes.txt", "not toml at all [");
        let loaded = load(&main).unwrap();
        let s = &loaded.config.sources["hephaestus"];
        assert_eq!(s.branch, "late");
        assert_eq!(s.interval, Duration::from_secs(300));
        assert_eq!(loaded.files.len(), 3);
    }

    #[test]
    fn unknown_key_names_file_line_column_and_key() {
        let e = err_text(&format!("{BASE}\n[apply]\ncomand = [\"x\"]\n"));
        assert!(
            e.contains("config.toml:11:1: apply.comand: unknown field `comand`"),
            "{e}"
        );
    }

    #[test]
    fn wrong_type_names_the_value() {
        let e = err_text(&format!("{BASE}interval = 60\n"));
        assert!(
            e.contains("config.toml:9:12: sources.hephaestus.interval:"),
            "{e}"
        );
        assert!(e.contains("duration"), "{e}");
    }

    #[test]
    fn a_url_in_the_wrong_place_is_not_echoed() {
        let e = err_text(&format!(
            "{BASE}urls = \"https://u:s3cret@h.example/r.git\"\n"
        ));
        assert!(
            e.contains("sources.hephaestus.urls: invalid type: a string, expected a sequence"),
            "{e}"
        );
        assert!(!e.contains("s3cret"), "{e}");
        let e = err_text("[node]\nname = \"lucy\"\n[sources]\nh = \"https://u:s3cret@h/r.git\"\n");
        assert!(
            e.contains("config.toml:4:5: sources.h:") && !e.contains("s3cret"),
            "{e}"
        );
    }

    #[test]
    fn probe_timings_and_node_names_are_checked() {
        let e = err_text(&format!("{BASE}\n[health.kube_vip]\ntimeout = \"0s\"\n"));
        assert!(
            e.contains("config.toml:11:11: health.kube_vip.timeout: must be longer than 0s"),
            "{e}"
        );
        let e = err_text(&BASE.replace("\"lucy\"", "\"a..b\""));
        assert!(
            e.contains("node.name: \"a..b\" is not a valid node name"),
            "{e}"
        );
    }

    #[test]
    fn a_listen_address_that_is_not_ip_port_says_how_to_write_one() {
        let e = err_text(&format!("{BASE}\n[metrics]\nlisten = \"localhost:9977\"\n"));
        assert!(
            e.contains("metrics.listen: \"localhost:9977\" is not an address; write IP:PORT"),
            "{e}"
        );
        let c = load_text(&format!("{BASE}\n[metrics]\nlisten = \"127.0.0.1:9977\"\n")).unwrap();
        assert_eq!(c.metrics.listen, Some("127.0.0.1:9977".parse().unwrap()));
    }

    #[test]
    fn bad_duration_says_how_to_write_one() {
        let e = err_text(&format!("{BASE}interval = \"10 fortnights\"\n"));
        assert!(
            e.contains(":9:12: sources.hephaestus.interval: invalid duration"),
            "{e}"
        );
        assert!(e.contains("\"30s\""), "{e}");
    }

    #[test]
    fn empty_url_is_an_error() {
        let e = err_text("[node]\nname = \"lucy\"\n[sources.hephaestus]\nurl = \"\"\n");
        assert!(e.contains(":4:7: sources.hephaestus.url: empty URL"), "{e}");
    }

    #[test]
    fn apply_source_must_name_a_source() {
        let e = err_text(&format!("{BASE}\n[apply]\nsource = \"argus\"\n"));
        assert!(
            e.contains(":11:10: apply.source: \"argus\" names no source"),
            "{e}"
        );
        assert!(e.contains("configured sources: hephaestus"), "{e}");
    }

    #[test]
    fn error_in_a_dropin_names_the_dropin() {
        let dir = tempfile::tempdir().unwrap();
        let main = write(dir.path(), "config.toml", BASE);
        write(
            dir.path(),
            "config.d/10-node.toml",
            "[node]\nrole = \"boss\"\n",
        );
        let e = load(&main).unwrap_err().to_string();
        assert!(
            e.contains("10-node.toml:2:8: node.role: unknown variant `boss`"),
            "{e}"
        );
    }

    #[test]
    fn syntax_errors_have_locations() {
        let e = err_text("[node\nname = 1\n");
        assert!(e.contains("config.toml:1:"), "{e}");
    }

    #[test]
    fn missing_url_points_at_the_source_table() {
        let e = err_text("[node]\nname = \"lucy\"\n[sources.hephaestus]\nbranch = \"main\"\n");
        assert!(e.contains(":3:10: sources.hephaestus: missing url"), "{e}");
    }

    #[test]
    fn invalid_names_are_refused() {
        let e = err_text("[node]\nname = \"Lucy_1\"\n[sources.hephaestus]\nurl = \"/r\"\n");
        assert!(
            e.contains("node.name: \"Lucy_1\" is not a valid node name"),
            "{e}"
        );
        let e = err_text("[node]\nname = \"lucy\"\n[sources.\"Bad Name\"]\nurl = \"/r\"\n");
        assert!(e.contains("must start with a lowercase letter"), "{e}");
    }

    #[test]
    fn secrets_are_redacted_when_printed() {
        let c = load_text(
            "[node]\nname = \"lucy\"\n[sources.hephaestus]\nurl = \"https://u:tok3n@h.example/r.git\"\n",
        )
        .unwrap();
        let out = c.to_toml();
        assert!(!out.contains("tok3n"), "{out}");
        assert!(out.contains("https://h.example/r.git"), "{out}");
    }

    #[test]
    fn printed_config_loads_back_identically() {
        let c = load_text(BASE).unwrap();
        let again = load_text(&c.to_toml()).unwrap();
        assert_eq!(c, again);
    }

    #[test]
    fn no_sources_is_an_error() {
        let e = err_text("[node]\nname = \"lucy\"\n");
        assert!(e.contains("sources: no sources configured"), "{e}");
    }
}
