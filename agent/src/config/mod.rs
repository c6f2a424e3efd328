//! The configuration: schema, defaults, drop-in merge and validation.
//!
//! Pure apart from reading the files and looking up `rollout.gate.command`'s program (see
//! `program`): [`load`] returns a validated [`Config`] or a [`ConfigError`] naming
//! `file:line:column` and the key. Defaults live here and only here, in the `Default` impls
//! and `default_*` functions; `ginx --print-default-config` prints them (the
//! the manual (docs/src/configuration.md) lists the same values and a test checks that its example is valid).
//!
//! One file per section; each section validates itself, and [`Config`]'s validation calls them
//! in order and checks only what crosses sections (`apply.source` and `kubeadm.source` name a
//! source, the heartbeat Lease's name is built from the node's).
//!
//! Imports only `types` and `util`. Not here: what the daemon does when the configuration
//! changes (see `daemon`).

mod apply;
mod bootstrap;
pub mod bounds;
mod control;
mod disruption;
mod duration;
mod etcd;
mod freeze;
mod health;
pub mod kubeadm;
mod kubernetes;
mod load;
mod metrics;
mod node;
mod notify;
mod program;
mod prometheus;
mod reboot;
pub mod reference;
mod rollout;
pub mod selector;
mod sources;
mod system;
mod window;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use apply::{
    ApplyConfig, ApplyMode, ClosureConfig, DEFAULT_CLOSURE_FILE, DriftPolicy, IsolationMode,
};
pub use bootstrap::{BootstrapConfig, FluxConfig, Stage, Wait};
pub use control::ControlConfig;
pub use disruption::{DEFAULT_DRAIN_UNITS, DisruptionConfig, DisruptionRule, check_glob};
pub use duration::Duration;
pub use etcd::{DEFAULT_ETCD_MANIFEST, EtcdConfig};
pub use freeze::{CivilPoint, Freeze};
pub use health::{
    ApiserverProbe, CiliumProbe, HealthConfig, KubeVipProbe, KubeletProbe, NodeReadyProbe,
    SystemdProbe,
};
pub use kubeadm::{ClusterFacts, KubeVipFacts, KubeadmConfig};
pub use kubernetes::KubernetesConfig;
pub use load::{Location, config_files};
use load::{Origins, join_index, join_key};
pub use metrics::MetricsConfig;
pub use node::NodeConfig;
pub use notify::{
    DEFAULT_EVENTS as NOTIFY_DEFAULT_EVENTS, NotifyConfig, shown as notify_url_shown,
};
pub use prometheus::{DEFAULT_ALERT_QUERY, OnPrometheusUnavailable, PrometheusConfig};
pub use reboot::{RebootConfig, RebootMode};
pub use rollout::{
    FleetLockConfig, GateConfig, GateRequire, LockBackend, OnApiUnavailable, OnHolderLost,
    RollbackPolicy, RolloutConfig,
};
pub use sources::SourceConfig;
pub use system::SystemConfig;
pub use window::{CivilDate, ClockTime, Day, Week, Window};

/// The longest path a unix socket can be bound at: `sun_path` holds 108 bytes with the
/// terminating NUL.
pub const MAX_SOCKET_PATH: usize = 107;

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
    pub rollout: RolloutConfig,
    pub reboot: RebootConfig,
    /// What a revision's changes call for before its activation (`[disruption]`).
    pub disruption: DisruptionConfig,
    /// The etcd guard of control-plane nodes with a stacked member (`[etcd]`).
    pub etcd: EtcdConfig,
    pub bootstrap: BootstrapConfig,
    /// Webhooks told of halts, rollbacks, lost slots, blocked drains, reboots and failing
    /// applies (`[[notify]]`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notify: Vec<NotifyConfig>,
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
            rollout: RolloutConfig::default(),
            reboot: RebootConfig::default(),
            disruption: DisruptionConfig::default(),
            etcd: EtcdConfig::default(),
            bootstrap: BootstrapConfig::default(),
            notify: Vec::new(),
        }
    }
}

/// A configuration that could not be read or is not valid.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    // The I/O error is part of the message, not a `source()`: a chain printer (`{:#}`) would
    // print it twice.
    #[error("cannot read configuration file {}: {error}", path.display())]
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("cannot list drop-in directory {}: {error}", path.display())]
    ReadDir {
        path: PathBuf,
        error: std::io::Error,
    },
    /// A FIFO, a device, a directory: reading one could block or never end.
    #[error(
        "configuration file {} is {kind}, not a regular file; configuration files must be \
         regular files of at most {} (remove it or move it out of config.d)",
        path.display(),
        load::MAX_FILE_SIZE_TEXT
    )]
    NotRegular { path: PathBuf, kind: &'static str },
    #[error(
        "configuration file {} is larger than {} ({size} bytes); is it the right file?",
        path.display(),
        load::MAX_FILE_SIZE_TEXT
    )]
    TooLarge { path: PathBuf, size: u64 },
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
///
/// `Ok(None)` when the files do not set it (or the main file does not exist); an error when
/// they cannot be read, so that the caller can say which file is broken.
pub fn peek_socket(main: &Path) -> Result<Option<PathBuf>, ConfigError> {
    if !main.exists() {
        return Ok(None);
    }
    let files = config_files(main)?;
    let (merged, _) = load::read_merged(&files)?;
    Ok(merged
        .get("socket")
        .and_then(|v| v.as_str())
        .map(PathBuf::from))
}

/// The `[kubernetes]` and `[rollout]` tables of the configuration at `main` (and its drop-ins),
/// the rest left at the defaults, read without the daemon's validation: for `ginxctl cluster`
/// at an operator's workstation, whose file names only the cluster's namespace and names (no
/// sources, and a hostname that need not be a node's). The defaults when `main` does not exist.
pub fn peek_cluster(main: &Path) -> Result<Config, ConfigError> {
    let mut config = Config::default();
    if !main.exists() {
        return Ok(config);
    }
    let files = config_files(main)?;
    let (merged, _) = load::read_merged(&files)?;
    let invalid = |key: &str, e: toml::de::Error| ConfigError::Invalid {
        place: main.display().to_string(),
        key: key.to_owned(),
        message: without_string_value(e.message().trim()),
    };
    if let Some(k) = merged.get("kubernetes") {
        config.kubernetes = k.clone().try_into().map_err(|e| invalid("kubernetes", e))?;
    }
    if let Some(r) = merged.get("rollout") {
        config.rollout = r.clone().try_into().map_err(|e| invalid("rollout", e))?;
    }
    Ok(config)
}

fn load_files(files: &[PathBuf]) -> Result<Config, ConfigError> {
    let (merged, origins) = load::read_merged(files)?;
    validated(merged, &origins, files)
}

/// What [`load`] does once the files are read: `files` are the main file and its drop-ins in
/// merge order, with their texts (the fuzzer's way in: no file system).
pub fn load_texts(files: &[(PathBuf, String)]) -> Result<Config, ConfigError> {
    let (merged, origins) = load::merge_texts(files)?;
    let names: Vec<PathBuf> = files.iter().map(|(f, _)| f.clone()).collect();
    validated(merged, &origins, &names)
}

fn validated(
    merged: toml::Table,
    origins: &Origins,
    files: &[PathBuf],
) -> Result<Config, ConfigError> {
    let Some(main) = files.first() else {
        return Err(ConfigError::Invalid {
            place: "(no file)".into(),
            key: String::new(),
            message: "no configuration file".into(),
        });
    };
    let ctx = Ctx {
        origins,
        main,
        files,
    };
    let mut config: Config =
        serde_path_to_error::deserialize(toml::Value::Table(merged)).map_err(|e| {
            let key = path_string(e.path());
            // A misplaced URL may carry a token, under any key (`substituters = "https://u:pw@…"`
            // expects a list): never echo a string value.
            let message = without_string_value(e.inner().message().trim());
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

    /// Whether `key` itself is written in one of the files (not a default).
    fn written(&self, key: &str) -> bool {
        self.origins.has(key)
    }

    /// `value` of `key` as an error message about another key shows it: `"30m"`, or
    /// `"30m, the default"` when no file sets it.
    fn shown(&self, key: &str, value: impl std::fmt::Display) -> String {
        if self.written(key) {
            value.to_string()
        } else {
            format!("{value}, the default")
        }
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

    /// Each section checks itself, in this order (the first error found is the one reported);
    /// between them, what crosses sections.
    fn validate(&mut self, ctx: &Ctx<'_>) -> Result<(), ConfigError> {
        for (key, path) in [("state_dir", &self.state_dir), ("socket", &self.socket)] {
            if !path.is_absolute() {
                return Err(ctx.error(key, format!("{} must be an absolute path", path.display())));
            }
        }
        if self
            .state_dir
            .components()
            .all(|c| c == std::path::Component::RootDir)
        {
            return Err(ctx.error(
                "state_dir",
                "must be a directory of its own, like /var/lib/ginx: ginx creates, moves aside \
                 and deletes files and directories under it",
            ));
        }
        let socket_len = self.socket.as_os_str().len();
        if socket_len > MAX_SOCKET_PATH {
            return Err(ctx.error(
                "socket",
                format!(
                    "the path is {socket_len} bytes; a unix socket path can have at most \
                     {MAX_SOCKET_PATH} (sun_path); choose a shorter one"
                ),
            ));
        }
        self.node.validate(ctx)?;
        let node = self.node_name().to_owned();
        sources::validate(&mut self.sources, &node, ctx)?;
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
        self.apply.validate(ctx)?;
        self.system.validate(ctx)?;
        self.kubernetes.validate(ctx)?;
        let k = &self.kubernetes;
        let lease = k.lease_name_for(&node);
        if !is_dns_subdomain(&lease) || !is_dns_label(&k.namespace) {
            return Err(ctx.error(
                "kubernetes.lease_name",
                format!(
                    "lease {:?} in namespace {:?} is not a valid Kubernetes name",
                    lease, k.namespace
                ),
            ));
        }
        self.health.validate(ctx)?;
        self.etcd.validate(ctx)?;
        if let (Some(src), Some(_)) = (&self.kubeadm.source, &self.kubeadm.cluster_file)
            && !self.sources.contains_key(src)
        {
            return Err(ctx.error("kubeadm.source", format!("{src:?} names no source")));
        }
        self.kubeadm.validate(ctx)?;
        let vip = self
            .kubeadm
            .control_plane_endpoint
            .as_deref()
            .and_then(|e| kubeadm::Endpoint::parse(e).ok())
            .and_then(|e| e.ip());
        if let Some(vip) = vip {
            kubeadm::check_node_addresses(
                vip,
                &[
                    ("node.advertise_address", self.node.advertise_address),
                    ("node.node_ip", self.node.node_ip),
                ],
            )
            .map_err(|(key, m)| ctx.error(key, m))?;
        }
        self.rollout.validate(ctx)?;
        self.reboot.validate(&self.rollout, ctx)?;
        self.disruption.validate(ctx)?;
        self.bootstrap.validate(&self.sources, ctx)?;
        if self.rollout.lock == LockBackend::Kubernetes && self.kubernetes.kubeconfig.is_none() {
            return Err(ctx.error(
                "rollout.lock",
                "\"kubernetes\" needs kubernetes.kubeconfig (the slot Leases live in the \
                 cluster); set it, or use \"auto\" to take no lock until the cluster exists",
            ));
        }
        NotifyConfig::validate(&self.notify, ctx)?;
        self.control.validate(ctx)
    }
}

/// RFC 1123 subdomain, as Kubernetes object (and node) names.
pub fn is_dns_subdomain(s: &str) -> bool {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{Goal, Role};

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
    fn calendars_and_freezes_load_and_bad_ones_are_named_where_they_are() {
        let ok = format!(
            "{BASE}\n[[rollout.windows]]\ndays = [\"tue\"]\nweeks = [\"first\", \"last\"]\n\
             start = \"02:00\"\nlength = \"3h\"\n\n\
             [[rollout.windows]]\ndates = [\"2026-12-24\"]\nstart = \"23:00\"\nlength = \"1h\"\n\n\
             [[rollout.freezes]]\nstart = \"2026-12-20\"\nend = \"2027-01-03\"\n\
             time_zone = \"Europe/Berlin\"\nreason = \"year-end\"\n\n\
             [[rollout.freezes]]\nstart = \"2027-01-03T23:00\"\nend = \"2027-01-05\"\n\
             reason = \"touching the first is fine\"\n"
        );
        let c = load_text(&ok).unwrap();
        assert_eq!(c.rollout.windows[0].weeks.len(), 2);
        assert_eq!(c.rollout.freezes.len(), 2);
        let window = |body: &str| {
            err_text(&format!(
                "{BASE}\n[[rollout.windows]]\nstart = \"02:00\"\nlength = \"1h\"\n{body}"
            ))
        };
        let e = window("days = [\"sat\"]\ndates = [\"2026-12-24\"]\n");
        assert!(
            e.contains("rollout.windows[0].dates: give days") && e.contains("not both"),
            "{e}"
        );
        let e = window("weeks = [\"first\"]\ndates = [\"2026-12-24\"]\n");
        assert!(e.contains("rollout.windows[0].weeks: needs days"), "{e}");
        let e = window("dates = [\"2026-12-24\", \"2026-12-24\"]\n");
        assert!(e.contains("names 2026-12-24 twice"), "{e}");
        let e = window("dates = [\"2026-02-30\"]\n");
        assert!(e.contains("\"2026-02-30\" is not a date"), "{e}");
        let e = window("days = [\"tue\"]\nweeks = [\"fifth\"]\n");
        assert!(e.contains("rollout.windows") && e.contains("fifth"), "{e}");
        let freeze = |start: &str, end: &str, extra: &str| {
            err_text(&format!(
                "{BASE}\n[[rollout.freezes]]\nstart = \"2026-12-20\"\nend = \"2027-01-03\"\n\
                 reason = \"first\"\n\n[[rollout.freezes]]\nstart = \"{start}\"\n\
                 end = \"{end}\"\n{extra}"
            ))
        };
        let e = freeze("2027-02-10", "2027-02-09", "reason = \"x\"\n");
        assert!(
            e.contains("rollout.freezes[1].end: 2027-02-09 is not after start (2027-02-10)"),
            "{e}"
        );
        let e = freeze("2027-02-01", "2027-06-01", "reason = \"x\"\n");
        assert!(
            e.contains("at most 92") && e.contains("rollout pause"),
            "{e}"
        );
        let e = freeze(
            "2026-12-24",
            "2026-12-31",
            "reason = \"x\"\ntime_zone = \"Asia/Tokyo\"\n",
        );
        assert!(
            e.contains(
                "rollout.freezes[1]: (2026-12-24 … 2026-12-31, Asia/Tokyo) overlaps \
                        rollout.freezes[0] (2026-12-20 … 2027-01-03, UTC): merge them"
            ),
            "{e}"
        );
        let e = freeze(
            "2027-02-01",
            "2027-02-02",
            "reason = \"x\"\ntime_zone = \"Mars/Base\"\n",
        );
        assert!(
            e.contains("rollout.freezes[1].time_zone: unknown time zone"),
            "{e}"
        );
        let e = freeze("2027-02-01", "2027-02-02", "reason = \" \"\n");
        assert!(e.contains("rollout.freezes[1].reason: must say why"), "{e}");
        let e = freeze("2027-02-01", "2027-02-02T25:00", "reason = \"x\"\n");
        assert!(e.contains("neither a date nor a local time"), "{e}");
        // Across zones: Tokyo's 2027-01-03 ends before UTC's does, so this one touches nothing.
        let e = freeze(
            "2027-01-04",
            "2027-01-05",
            "reason = \"x\"\ntime_zone = \"Asia/Tokyo\"\n",
        );
        assert!(
            e.contains("overlaps rollout.freezes[0]"),
            "Tokyo's 01-04 00:00 is 01-03 15:00Z: {e}"
        );
    }

    #[test]
    fn canaries_are_node_names_or_a_selector_with_a_lock() {
        let ok = format!(
            "{BASE}\n[rollout]\nfirst = [\"w3\"]\nfirst_selector = \"ginx.io/canary=true\"\n"
        );
        assert_eq!(load_text(&ok).unwrap().rollout.first, ["w3"]);
        let e = err_text(&format!("{BASE}\n[rollout]\nfirst = [\"W3\"]\n"));
        assert!(
            e.contains("rollout.first[0]: \"W3\" is not a node name"),
            "{e}"
        );
        let e = err_text(&format!("{BASE}\n[rollout]\nfirst_selector = \"a in (\"\n"));
        assert!(e.contains("rollout.first_selector"), "{e}");
        let e = err_text(&format!(
            "{BASE}\n[rollout]\nlock = \"none\"\nfirst = [\"w3\"]\n"
        ));
        assert!(
            e.contains("rollout.first: canaries need the cluster's heartbeats"),
            "{e}"
        );
        let many: Vec<String> = (0..17).map(|i| format!("\"w{i}\"")).collect();
        let e = err_text(&format!(
            "{BASE}\n[rollout]\nfirst = [{}]\n",
            many.join(", ")
        ));
        assert!(e.contains("names 17 nodes; at most 16"), "{e}");
    }

    #[test]
    fn maintenance_windows_load_and_bad_ones_are_named_where_they_are() {
        let ok = format!(
            "{BASE}\n[[rollout.windows]]\ndays = [\"sat\", \"sun\"]\nstart = \"02:00\"\n\
             length = \"3h\"\ntime_zone = \"Europe/Berlin\"\n\n\
             [[rollout.windows]]\ndays = [\"wed\"]\nstart = \"23:30:15\"\nlength = \"1h\"\n"
        );
        let c = load_text(&ok).unwrap();
        assert_eq!(c.rollout.windows.len(), 2);
        assert_eq!(c.rollout.windows[1].time_zone, "UTC");
        assert_eq!(String::from(c.rollout.windows[1].start), "23:30:15");

        let tz = err_text(&format!(
            "{BASE}\n[[rollout.windows]]\ndays = [\"sat\"]\nstart = \"02:00\"\nlength = \"3h\"\n\
             time_zone = \"Mars/Olympus_Mons\"\n"
        ));
        assert!(tz.contains("rollout.windows[0].time_zone"), "{tz}");
        assert!(tz.contains("config.toml:"), "{tz}");
        assert!(tz.contains("Mars/Olympus_Mons"), "{tz}");

        let start = err_text(&format!(
            "{BASE}\n[[rollout.windows]]\ndays = [\"sat\"]\nstart = \"25:00\"\nlength = \"3h\"\n"
        ));
        assert!(start.contains("rollout.windows[0].start"), "{start}");
        assert!(start.contains("HH:MM"), "{start}");

        let day = err_text(&format!(
            "{BASE}\n[[rollout.windows]]\ndays = [\"someday\"]\nstart = \"02:00\"\nlength = \"3h\"\n"
        ));
        assert!(day.contains("rollout.windows[0].days"), "{day}");

        let none = err_text(&format!(
            "{BASE}\n[[rollout.windows]]\ndays = []\nstart = \"02:00\"\nlength = \"3h\"\n"
        ));
        assert!(none.contains("at least one day"), "{none}");
        let long = err_text(&format!(
            "{BASE}\n[[rollout.windows]]\ndays = [\"mon\"]\nstart = \"02:00\"\nlength = \"8d\"\n"
        ));
        assert!(long.contains("rollout.windows[0].length"), "{long}");
    }

    #[test]
    fn reboot_settings_load_default_to_the_rollout_windows_and_bad_ones_are_named() {
        let c = load_text(BASE).unwrap();
        assert_eq!(c.reboot.mode, RebootMode::Never);
        assert_eq!(c.reboot.reboot_command, ["systemctl", "reboot"]);
        assert_eq!(c.reboot.sentinel, PathBuf::from("/run/reboot-required"));
        assert_eq!(c.reboot.lock_ttl, Duration::from_secs(1800));
        assert_eq!(c.reboot.drain_timeout, Duration::from_secs(900));
        assert_eq!(
            c.system.boot_id,
            PathBuf::from("/proc/sys/kernel/random/boot_id")
        );

        let rollout_only = load_text(&format!(
            "{BASE}\n[reboot]\nmode = \"when-required\"\nblocking_pod_selector = \"app=backup\"\n\n\
             [[rollout.windows]]\ndays = [\"sat\"]\nstart = \"02:00\"\nlength = \"3h\"\n"
        ))
        .unwrap();
        assert_eq!(rollout_only.reboot.mode, RebootMode::WhenRequired);
        assert_eq!(
            rollout_only.reboot.windows(&rollout_only.rollout),
            &rollout_only.rollout.windows[..]
        );
        let own = load_text(&format!(
            "{BASE}\n[[rollout.windows]]\ndays = [\"sat\"]\nstart = \"02:00\"\nlength = \"3h\"\n\n\
             [[reboot.windows]]\ndays = [\"sun\"]\nstart = \"04:00\"\nlength = \"1h\"\n"
        ))
        .unwrap();
        assert_eq!(own.reboot.windows(&own.rollout)[0].days, [Day::Sun]);

        let e = err_text(&format!(
            "{BASE}\n[[reboot.windows]]\ndays = [\"sun\"]\nstart = \"4am\"\nlength = \"1h\"\n"
        ));
        assert!(e.contains("reboot.windows[0].start"), "{e}");
        let e = err_text(&format!("{BASE}\n[reboot]\nmode = \"always\"\n"));
        assert!(
            e.contains("reboot.mode") && e.contains("when-required"),
            "{e}"
        );
        let e = err_text(&format!("{BASE}\n[reboot]\nlock_ttl = \"10s\"\n"));
        assert!(
            e.contains("reboot.lock_ttl") && e.contains("lease_duration"),
            "{e}"
        );
        let e = err_text(&format!("{BASE}\n[reboot]\nreboot_command = []\n"));
        assert!(e.contains("reboot.reboot_command"), "{e}");
        let e = err_text(&format!(
            "{BASE}\n[reboot]\nblocking_pod_selector = \"app in (a,b\"\n"
        ));
        assert!(e.contains("reboot.blocking_pod_selector"), "{e}");
        assert!(e.contains("config.toml:"), "{e}");
    }

    #[test]
    fn a_misplaced_url_with_a_password_is_not_echoed_under_any_key() {
        // A string where a list is expected, outside `sources`: the message says so without it.
        let e = err_text(&format!(
            "{BASE}\n[apply.closure]\nsubstituters = \"https://ci:hunter2x@cache.example.com\"\n\
             trusted_public_keys = []\n"
        ));
        assert!(e.contains("apply.closure.substituters"), "{e}");
        assert!(e.contains("invalid type: a string"), "{e}");
        assert!(!e.contains("hunter2x"), "{e}");
    }

    #[test]
    fn a_flux_url_with_credentials_is_refused_without_echoing_them() {
        let flux = |url: &str| {
            format!(
                "{BASE}\n[bootstrap.flux]\nsource = \"hephaestus\"\npath = \"clusters/lab\"\n\
                 url = \"{url}\"\n"
            )
        };
        for url in [
            "https://git:hunter2x@git.example.com/argus.git",
            "https://hunter2x@git.example.com/argus.git",
            "https://git.example.com/argus.git?private_token=hunter2x",
        ] {
            let e = err_text(&flux(url));
            assert!(
                e.contains("bootstrap.flux.url") && e.contains("carries credentials"),
                "{e}"
            );
            assert!(!e.contains("hunter2x"), "{e}");
        }
        let ok = load_text(&flux("ssh://git@git.example.com/argus.git")).unwrap();
        assert!(ok.bootstrap.flux.is_some());
    }

    #[test]
    fn bootstrap_stages_load_and_bad_ones_are_named() {
        let ok = load_text(&format!(
            "{BASE}\n[[bootstrap.stages]]\nname = \"cni\"\nsource = \"hephaestus\"\n\
             path = \"bootstrap/cilium.yaml\"\nwait = [\"daemonset/kube-system/cilium\", \"nodes\"]\n"
        ))
        .unwrap();
        assert_eq!(ok.bootstrap.stages[0].timeout, Duration::from_secs(600));
        assert_eq!(BootstrapConfig::waits(&ok.bootstrap.stages[0]).len(), 2);
        let e = err_text(&format!(
            "{BASE}\n[[bootstrap.stages]]\nname = \"cni\"\npath = \"/x.yaml\"\nwait = [\"pods/x\"]\n"
        ));
        assert!(
            e.contains("bootstrap.stages[0].wait[0]") && e.contains("daemonset/<ns>/<name>"),
            "{e}"
        );
        let e = err_text(&format!(
            "{BASE}\n[[bootstrap.stages]]\nname = \"cni\"\npath = \"relative.yaml\"\n"
        ));
        assert!(
            e.contains("bootstrap.stages[0].path") && e.contains("absolute"),
            "{e}"
        );
        let e = err_text(&format!(
            "{BASE}\n[[bootstrap.stages]]\nname = \"a\"\npath = \"/a\"\n\n\
             [[bootstrap.stages]]\nname = \"a\"\npath = \"/b\"\n"
        ));
        assert!(e.contains("bootstrap.stages[1].name"), "{e}");
        let e = err_text(&format!(
            "{BASE}\n[[bootstrap.stages]]\nname = \"a\"\nsource = \"argus\"\npath = \"x\"\n"
        ));
        assert!(
            e.contains("bootstrap.stages[0].source") && e.contains("argus"),
            "{e}"
        );
        let e = err_text(&format!("{BASE}\n[bootstrap]\nafter_init = true\n"));
        assert!(
            e.contains("bootstrap.after_init") && e.contains("nothing to run"),
            "{e}"
        );
    }

    #[test]
    fn closure_mode_loads_and_bad_settings_are_named() {
        let ok = load_text(&format!(
            "{BASE}\n[apply]\nmode = \"closure\"\n\n[apply.closure]\n\
             substituters = [\"https://cache.example.com\"]\n\
             trusted_public_keys = [\"cache.example.com-1:abc=\"]\n"
        ))
        .unwrap();
        let c = ok.apply.closure.as_ref().unwrap();
        assert_eq!(ok.apply.mode, ApplyMode::Closure);
        assert_eq!(c.file_for("lucy").as_deref(), Some("hosts/lucy.closure"));
        assert_eq!(c.realise_timeout, Duration::from_secs(20 * 60));
        // A pin URL is printed without its credentials.
        let shown =
            crate::config::apply::shown_url("https://u:secret@pins.example.com/{node}?k=tok");
        assert!(
            !shown.contains("secret") && !shown.contains("tok") && shown.contains("{node}"),
            "{shown}"
        );
        let e = err_text(&format!("{BASE}\n[apply]\nmode = \"closure\"\n"));
        assert!(
            e.contains("apply.mode") && e.contains("[apply.closure]"),
            "{e}"
        );
        for (body, key) in [
            (
                "substituters = []\ntrusted_public_keys = [\"k:1\"]\n",
                "apply.closure.substituters",
            ),
            (
                "substituters = [\"s\"]\ntrusted_public_keys = []\n",
                "apply.closure.trusted_public_keys",
            ),
            (
                "substituters = [\"s\"]\ntrusted_public_keys = [\"no-colon\"]\n",
                "apply.closure.trusted_public_keys[0]",
            ),
            (
                "substituters = [\"s\"]\ntrusted_public_keys = [\"k:1\"]\nfile = \"a\"\nurl = \"https://x/{node}\"\n",
                "apply.closure.url",
            ),
            (
                "substituters = [\"s\"]\ntrusted_public_keys = [\"k:1\"]\nfile = \"../x\"\n",
                "apply.closure.file",
            ),
            (
                "substituters = [\"s\"]\ntrusted_public_keys = [\"k:1\"]\nurl = \"ftp://x/{node}\"\n",
                "apply.closure.url",
            ),
            (
                "substituters = [\"s\"]\ntrusted_public_keys = [\"k:1\"]\ntoken_file = \"/t\"\n",
                "apply.closure.token_file",
            ),
            (
                "substituters = [\"https://c?trusted=1\"]\ntrusted_public_keys = [\"k:1\"]\n",
                "apply.closure.substituters[0]",
            ),
            (
                "substituters = [\"https://u:p@c\"]\ntrusted_public_keys = [\"k:1\"]\n",
                "netrc-file",
            ),
            (
                "substituters = [\"s\"]\ntrusted_public_keys = [\"k:1\"]\nurl = \"http://pins.example.com/{node}\"\n",
                "plain http",
            ),
            (
                "substituters = [\"s\"]\ntrusted_public_keys = [\"k:1\"]\npin_timeout = \"1m\"\n",
                "apply.closure.pin_timeout",
            ),
            (
                "substituters = [\"s\"]\ntrusted_public_keys = [\"k:1\"]\nrealise_timeout = \"2h\"\n",
                "apply.closure.realise_timeout",
            ),
        ] {
            let e = err_text(&format!(
                "{BASE}\n[apply]\nmode = \"closure\"\n\n[apply.closure]\n{body}"
            ));
            assert!(e.contains(key), "{key}: {e}");
        }
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
    fn a_bad_disruption_rule_is_named_where_it_is() {
        let rule = |units: &str, action: &str| {
            format!("{BASE}\n[[disruption.rules]]\nunits = {units}\naction = {action}\n")
        };
        let ok = load_text(&rule(r#"["kubelet.service", "cilium*"]"#, r#""drain""#)).unwrap();
        assert_eq!(
            ok.disruption.rules.len(),
            1,
            "written rules replace the defaults"
        );
        let e = err_text(&rule(r#"["ok.service", "kube[let"]"#, r#""drain""#));
        assert!(
            e.contains("config.toml:11:24: disruption.rules[0].units[1]: \"kube[let\" is not a unit pattern"),
            "{e}"
        );
        let e = err_text(&rule(r#"["ok.service"]"#, r#""evict""#));
        assert!(
            e.contains("config.toml:12:10: disruption.rules[0].action"),
            "{e}"
        );
        assert!(e.contains("unknown variant `evict`"), "{e}");
        let e = err_text(&format!("{BASE}\n[disruption]\ntimeout = \"2h\"\n"));
        assert!(e.contains("config.toml:11:11: disruption.timeout"), "{e}");
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
            e.contains(
                "config.toml:11:11: health.kube_vip.timeout: 0s is below the floor of 100ms"
            ),
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
    fn health_urls_are_redacted_when_printed_and_in_errors() {
        let c = load_text(&format!(
            "{BASE}\n[health.kubelet]\nurl = \"http://u:SECRET@127.0.0.1:10248/healthz?token=QSECRET\"\n\
             [health.apiserver]\nvip_url = \"https://u:SECRET@10.0.0.1:6443\"\n"
        ))
        .unwrap();
        let out = c.to_toml();
        assert!(!out.contains("SECRET"), "{out}");
        assert!(
            out.contains("http://127.0.0.1:10248/healthz?token=***"),
            "{out}"
        );
        for bad in [
            "https://u:SECRET@127.0.0.1:10248/healthz",
            "http:/u:SECRET@127.0.0.1:10248/healthz",
            "http://u:SE@CRET@127.0.0.1/healthz",
        ] {
            let e = err_text(&format!("{BASE}\n[health.kubelet]\nurl = \"{bad}\"\n"));
            assert!(
                e.contains("config.toml:11:7: health.kubelet.url: ")
                    && !e.contains("SECRET")
                    && !e.contains("CRET"),
                "{e}"
            );
        }
    }

    /// `{BASE}` plus `[kubeadm]` with `body`: its first line is line 11.
    fn kubeadm_err(body: &str) -> String {
        err_text(&format!("{BASE}\n[kubeadm]\n{body}"))
    }

    #[test]
    fn check_config_refuses_overlapping_pod_and_service_subnets() {
        let e = kubeadm_err("pod_subnet = \"10.96.0.0/16\"\nservice_subnet = \"10.96.0.0/12\"\n");
        assert!(
            e.contains("config.toml:11:14: kubeadm.pod_subnet: pod_subnet 10.96.0.0/16 and service_subnet 10.96.0.0/12 overlap"),
            "{e}"
        );
    }

    #[test]
    fn check_config_refuses_a_vip_inside_the_pod_subnet() {
        let e = kubeadm_err(
            "control_plane_endpoint = \"10.244.1.1:6443\"\npod_subnet = \"10.244.0.0/16\"\n",
        );
        assert!(
            e.contains("config.toml:11:26: kubeadm.control_plane_endpoint: the control-plane endpoint 10.244.1.1 lies inside 10.244.0.0/16"),
            "{e}"
        );
    }

    #[test]
    fn check_config_refuses_an_advertise_address_equal_to_the_vip() {
        let e = err_text(&format!(
            "{}\n[kubeadm]\ncontrol_plane_endpoint = \"10.0.0.100:6443\"\n",
            BASE.replace(
                "name = \"lucy\"",
                "name = \"lucy\"\nadvertise_address = \"10.0.0.100\""
            )
        ));
        assert!(
            e.contains("config.toml:6:21: node.advertise_address: node.advertise_address is 10.0.0.100, the control-plane VIP"),
            "{e}"
        );
    }

    #[test]
    fn a_dns_domain_that_is_not_a_domain_is_refused() {
        let e = kubeadm_err("dns_domain = \"not a domain!\"\n");
        assert!(
            e.contains(
                "config.toml:11:14: kubeadm.dns_domain: \"not a domain!\" is not a DNS domain"
            ),
            "{e}"
        );
    }

    #[test]
    fn empty_or_spaced_cert_sans_are_refused() {
        let e = kubeadm_err("cert_sans = [\"\", \"a b\"]\n");
        assert!(
            e.contains("config.toml:11:14: kubeadm.cert_sans[0]: \"\" is neither an IP address nor a DNS name"),
            "{e}"
        );
        let e = kubeadm_err("cert_sans = [\"api.example.com\", \"a b\"]\n");
        assert!(
            e.contains("config.toml:11:33: kubeadm.cert_sans[1]: \"a b\" is neither"),
            "{e}"
        );
        assert!(
            kubeadm_err("cert_sans = [\"10.0.0.1\", \"*.example.com\", \"x\"]\nbogus = 1\n")
                .contains("bogus")
        );
    }

    #[test]
    fn a_cluster_name_with_a_newline_is_refused() {
        let e = kubeadm_err("cluster_name = \"prod\\nkind: Evil\"\n");
        assert!(
            e.contains(
                "config.toml:11:16: kubeadm.cluster_name: must not contain control characters"
            ),
            "{e}"
        );
    }

    #[test]
    fn an_overflowing_kubernetes_version_is_refused() {
        let e = kubeadm_err("kubernetes_version = \"v99999999999999999999.0.0\"\n");
        assert!(
            e.contains("config.toml:11:22: kubeadm.kubernetes_version: \"v99999999999999999999.0.0\" is not a version"),
            "{e}"
        );
    }

    #[test]
    fn a_socket_path_over_the_unix_limit_is_refused() {
        let long = format!("/run/{}/ginx.sock", "d".repeat(100));
        let e = err_text(&format!("socket = \"{long}\"\n{BASE}"));
        assert!(
            e.contains("config.toml:1:10: socket: the path is 115 bytes; a unix socket path can have at most 107"),
            "{e}"
        );
        let ok = format!("/run/{}/g.sock", "d".repeat(95));
        assert_eq!(ok.len(), 107);
        assert!(load_text(&format!("socket = \"{ok}\"\n{BASE}")).is_ok());
    }

    #[test]
    fn state_dir_root_is_refused() {
        for root in ["/", "//", "/."] {
            let e = err_text(&BASE.replace("\"/var/lib/ginx\"", &format!("\"{root}\"")));
            assert!(
                e.contains("config.toml:2:13: state_dir: must be a directory of its own"),
                "{root}: {e}"
            );
        }
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

    #[test]
    fn invalid_utf8_is_located_at_file_line_column() {
        let dir = tempfile::tempdir().unwrap();
        let main = dir.path().join("config.toml");
        let mut bytes = BASE.as_bytes().to_vec();
        bytes.extend(b"branch = \"ma\xffin\"\n");
        std::fs::write(&main, bytes).unwrap();
        let e = load(&main).unwrap_err().to_string();
        let line = BASE.lines().count() + 1;
        assert!(
            e.contains(&format!("config.toml:{line}:13: invalid UTF-8")),
            "{e}"
        );
    }

    #[test]
    fn a_duplicate_table_names_its_key() {
        let e = err_text(&format!("{BASE}[node]\nrole = \"worker\"\n"));
        assert!(e.contains("duplicate key `node`"), "{e}");
        let e = err_text(&format!("{BASE}[sources.hephaestus]\nbranch = \"dev\"\n"));
        assert!(e.contains("duplicate key `sources.hephaestus`"), "{e}");
    }

    #[test]
    fn a_huge_integer_names_its_key() {
        let e = err_text(&format!(
            "{BASE}[apply]\nmax_attempts = 99999999999999999999999\n"
        ));
        assert!(
            e.contains("apply.max_attempts: integer out of range"),
            "{e}"
        );
    }

    #[test]
    fn a_read_error_is_printed_once_in_an_error_chain() {
        let dir = tempfile::tempdir().unwrap();
        let e = anyhow::Error::from(load(&dir.path().join("missing.toml")).unwrap_err());
        let chain = format!("{e:#}");
        assert_eq!(chain.matches("os error 2").count(), 1, "{chain}");
    }

    #[test]
    fn a_fifo_is_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let main = write(dir.path(), "config.toml", BASE);
        let fifo = dir.path().join("config.d/50-fifo.toml");
        std::fs::create_dir_all(fifo.parent().unwrap()).unwrap();
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
        let e = load(&main).unwrap_err().to_string();
        assert!(
            e.contains("50-fifo.toml is a FIFO (named pipe), not a regular file"),
            "{e}"
        );
    }

    #[test]
    fn a_file_over_1_mib_is_refused_naming_the_bound() {
        let dir = tempfile::tempdir().unwrap();
        let main = write(dir.path(), "config.toml", BASE);
        let big = "# padding\n".repeat(110_000);
        write(dir.path(), "config.d/50-big.toml", &big);
        let e = load(&main).unwrap_err().to_string();
        assert!(
            e.contains("50-big.toml is larger than 1 MiB (1100000 bytes)"),
            "{e}"
        );
    }

    /// A lease_duration longer than the default lock_ttl is lease_duration's
    /// error, at its place, saying how it relates to the default.
    #[test]
    fn a_long_lease_duration_blames_itself_not_the_default_lock_ttl() {
        let e = err_text(&format!("{BASE}\n[rollout]\nlease_duration = \"45m\"\n"));
        assert!(
            e.contains(
                "config.toml:11:18: rollout.lease_duration: 45m is longer than reboot.lock_ttl \
                 (30m, the default), the slot's duration while its holder reboots"
            ),
            "{e}"
        );
        assert!(e.contains("raise reboot.lock_ttl (at most 24h)"), "{e}");
        // Both written: the check is lock_ttl's, which is then named.
        let e = err_text(&format!(
            "{BASE}\n[rollout]\nlease_duration = \"45m\"\n[reboot]\nlock_ttl = \"40m\"\n"
        ));
        assert!(
            e.contains("config.toml:13:12: reboot.lock_ttl: 40m is shorter than rollout.lease_duration (45m)"),
            "{e}"
        );
        assert!(
            load_text(&format!(
                "{BASE}\n[rollout]\nlease_duration = \"45m\"\n[reboot]\nlock_ttl = \"1h\"\n"
            ))
            .is_ok()
        );
    }

    #[test]
    fn cross_key_checks_blame_the_key_written_in_the_files() {
        for (body, expected) in [
            (
                "[apply]\nretry_base = \"1h\"\n",
                "config.toml:11:14: apply.retry_base: 1h is longer than apply.retry_max (30m, the default)",
            ),
            (
                "[apply]\nretry_max = \"10s\"\n",
                "config.toml:11:13: apply.retry_max: 10s is shorter than apply.retry_base (30s, the default)",
            ),
            (
                "[rollout.gate]\ntimeout = \"30s\"\n",
                "config.toml:11:11: rollout.gate.timeout: 30s is not longer than rollout.gate.settle (1m, the default)",
            ),
            (
                "[rollout.gate]\nsettle = \"20m\"\n",
                "config.toml:11:10: rollout.gate.settle: must be shorter than rollout.gate.timeout (10m, the default)",
            ),
            (
                "[kubernetes]\nlease_duration = \"5s\"\n",
                "config.toml:11:18: kubernetes.lease_duration: 5s is not longer than kubernetes.renew_interval (10s, the default)",
            ),
            (
                "[kubernetes]\nrenew_interval = \"1m\"\n",
                "config.toml:11:18: kubernetes.renew_interval: must be shorter than kubernetes.lease_duration (40s, the default)",
            ),
            (
                "[apply]\ntimeout = \"5m\"\nmode = \"closure\"\n[apply.closure]\n\
                 substituters = [\"s\"]\ntrusted_public_keys = [\"k:1\"]\n",
                "config.toml:11:11: apply.timeout: 5m is shorter than apply.closure.realise_timeout (20m, the default)",
            ),
        ] {
            let e = err_text(&format!("{BASE}\n{body}"));
            assert!(e.contains(expected), "{e}");
        }
    }

    /// The dangerous values seen in the field are refused, each at its place with its bound.
    #[test]
    fn the_dangerous_values_seen_are_refused() {
        for (body, expected) in [
            (
                "[rollout.gate]\ninterval = \"1ns\"\n",
                "config.toml:11:12: rollout.gate.interval: 1ns is below the floor of 100ms",
            ),
            (
                "[[rollout.windows]]\ndays = [\"sat\"]\nstart = \"02:00\"\nlength = \"1ns\"\n",
                "config.toml:13:10: rollout.windows[0].length: 1ns is below the floor of 1m",
            ),
            (
                "[reboot]\ngrace_period = \"0s\"\n",
                "config.toml:11:16: reboot.grace_period: 0s is below the floor of 1s",
            ),
            (
                "[reboot]\ngrace_period = \"1s 500ms\"\n",
                "config.toml:11:16: reboot.grace_period: 1s 500ms is not a whole number of seconds",
            ),
            (
                "[rollout.gate]\ncommand_timeout = \"1ns\"\n",
                "config.toml:11:19: rollout.gate.command_timeout: 1ns is below the floor of 1s",
            ),
            (
                "[rollout.gate]\ntimeout = \"100000h\"\n",
                "config.toml:11:11: rollout.gate.timeout: 100000h is above the ceiling of 24h",
            ),
            (
                "[reboot]\nlock_ttl = \"600000h\"\n",
                "config.toml:11:12: reboot.lock_ttl: 600000h is above the ceiling of 24h",
            ),
            (
                "[kubernetes]\nrequest_timeout = \"1ns\"\n",
                "config.toml:11:19: kubernetes.request_timeout: 1ns is below the floor of 1s",
            ),
            (
                "[health]\ntimeout = \"9223372036854775807s 999ms\"\n",
                "config.toml:11:11: health.timeout: 2562047788015215h 30m 7s 999ms is above the ceiling of 5m",
            ),
            (
                "[health.kubelet]\ntimeout = \"9223372036854775807s 999ms\"\n",
                "config.toml:11:11: health.kubelet.timeout: 2562047788015215h 30m 7s 999ms is above",
            ),
            (
                "[health.systemd]\ntimeout = \"9223372036854775807s 999ms\"\n",
                "config.toml:11:11: health.systemd.timeout: 2562047788015215h 30m 7s 999ms is above",
            ),
            (
                "[apply]\ntimeout = \"9223372036854775807s\"\n",
                "config.toml:11:11: apply.timeout: 2562047788015215h 30m 7s is above the ceiling of 24h",
            ),
            (
                "[apply]\nkill_grace = \"9223372036854775807s\"\n",
                "config.toml:11:14: apply.kill_grace: 2562047788015215h 30m 7s is above the ceiling of 10m",
            ),
            (
                "interval = \"1ns\"\n",
                "config.toml:9:12: sources.hephaestus.interval: 1ns is below the floor of 1s",
            ),
            (
                "[health]\ninterval = \"1ns\"\n",
                "config.toml:11:12: health.interval: 1ns is below the floor of 100ms",
            ),
            (
                "[system]\ndrift_check_interval = \"1ns\"\n",
                "config.toml:11:24: system.drift_check_interval: 1ns is below the floor of 1s",
            ),
            (
                "[kubernetes]\nrenew_interval = \"1ns\"\n",
                "config.toml:11:18: kubernetes.renew_interval: 1ns is below the floor of 100ms",
            ),
            (
                "[reboot]\nblocking_pod_selector = \"app==x y\"\n",
                "config.toml:11:25: reboot.blocking_pod_selector: \"app==x y\" is not a label selector: expected ',' or the end after a requirement, found \"y\"",
            ),
        ] {
            let text = if body.starts_with('[') {
                format!("{BASE}\n{body}")
            } else {
                format!("{BASE}{body}")
            };
            let e = err_text(&text);
            assert!(e.contains(expected), "{body}: {e}");
        }
    }

    /// A typo in the gate command is refused at load (and so at reload), naming
    /// the key and what to do; a program found through PATH, like the tests' `sh`, loads.
    #[test]
    fn a_gate_command_that_cannot_run_is_refused() {
        let e = err_text(&format!(
            "{BASE}\n[rollout.gate]\ncommand = [\"chekc-health\", \"--all\"]\n"
        ));
        assert!(
            e.contains(
                "config.toml:11:12: rollout.gate.command[0]: \"chekc-health\" is not found in PATH"
            ),
            "{e}"
        );
        assert!(e.contains("give the program's absolute path"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let script = write(dir.path(), "check", "#!/bin/sh\n");
        let e = err_text(&format!(
            "{BASE}\n[rollout.gate]\ncommand = [\"{}\"]\n",
            script.display()
        ));
        assert!(
            e.contains("rollout.gate.command[0]: ") && e.contains("is not executable"),
            "{e}"
        );
        for ok in [
            "\"sh\", \"-c\", \"true\"",
            &format!("\"{}\"", std::env::current_exe().unwrap().display()),
        ] {
            let c = load_text(&format!("{BASE}\n[rollout.gate]\ncommand = [{ok}]\n"));
            assert!(c.is_ok(), "{ok}: {:?}", c.err());
        }
    }
}
