//! The FleetLock backend of the rollout lock: a client of the FleetLock protocol
//! (coreos/zincati's `docs/development/fleetlock/protocol.md`) as served by coreos/airlock and
//! poseidon/fleetlock.
//!
//! Owns: the node's FleetLock identity (zincati's app-specific machine id, so that a node
//! running both zincati and ginx holds one lock under one name), the two requests
//! (`/v1/pre-reboot` takes a slot, `/v1/steady-state` gives it back; both recursive on the
//! server), and what their answers mean. A slot is held only after an HTTP 200; every other
//! answer is a refusal, and no answer at all is told apart from one.
//!
//! Not here: when to ask or how often (the rollout gate's schedule), what a refusal does to the
//! node (it waits), and the Kubernetes Lease backend.

use std::fmt;
use std::path::Path;
use std::time::Duration;

use hmac::{Hmac, Mac};
use serde::Deserialize;
use sha2::Sha256;

use crate::config::FleetLockConfig;
use crate::types::EndpointUrl;

/// zincati's application id for `sd_id128_get_machine_app_specific()`: the FleetLock id ginx
/// sends is the one zincati sends from the same machine.
const ZINCATI_APP_ID: [u8; 16] = [
    0xde, 0x35, 0x10, 0x6b, 0x6e, 0xc2, 0x46, 0x88, 0xb6, 0x3a, 0xfd, 0xda, 0xa1, 0x56, 0x67, 0x9b,
];

/// The protocol's header; servers refuse a request without it, so that a redirected or
/// forged request from elsewhere does not take a slot.
const PROTOCOL_HEADER: &str = "fleet-lock-protocol";

/// The most of an error body that is read. The protocol's bodies are a few dozen bytes.
const MAX_ERROR_BODY: usize = 16 * 1024;

/// The most of the server's `kind` and `value` that goes into a message.
const MAX_SHOWN: usize = 300;

/// The two operations of the protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Operation {
    PreReboot,
    SteadyState,
}

impl Operation {
    fn path(self) -> [&'static str; 2] {
        match self {
            Operation::PreReboot => ["v1", "pre-reboot"],
            Operation::SteadyState => ["v1", "steady-state"],
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Operation::PreReboot => "the request for a slot (pre-reboot)",
            Operation::SteadyState => "the release of its slot (steady-state)",
        }
    }
}

/// One endpoint: where the request goes and what humans are shown.
struct Endpoint {
    /// With credentials, if the configuration has any. Never printed.
    url: url::Url,
    /// Without them.
    shown: String,
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Endpoint({})", self.shown)
    }
}

impl Endpoint {
    /// `/v1/…` appended to the base URL's path, its query kept (a token there goes along).
    fn new(base: &EndpointUrl, op: Operation) -> Self {
        let mut url = base.url().clone();
        if let Ok(mut segments) = url.path_segments_mut() {
            segments.pop_if_empty().extend(op.path());
        }
        // Parsed again so that the shown form is made by the same rule as the base URL's.
        let shown = match url.as_str().parse::<EndpointUrl>() {
            Ok(u) => u.to_string(),
            Err(_) => format!("{base} ({})", op.path().join("/")),
        };
        Self { url, shown }
    }
}

/// A FleetLock client for one node in one group.
#[derive(Debug)]
pub struct FleetLock {
    http: reqwest::Client,
    pre_reboot: Endpoint,
    steady_state: Endpoint,
    /// The app-specific machine id: the lock holder's name on the server.
    id: String,
    group: String,
    /// `{"client_params":{"id":…,"group":…}}`, the same for every request.
    body: String,
    /// For messages about requests that got no answer in time.
    timeout: Duration,
}

/// Why a request did not end with HTTP 200.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FleetLockError {
    /// The server answered, with another status than 200: the slot is not taken (or not
    /// given back). `kind` and `value` are the protocol's error body, when it sent one.
    Refused {
        /// The endpoint that answered, without credentials.
        url: String,
        status: u16,
        kind: Option<String>,
        value: Option<String>,
    },
    /// No answer: the connection, TLS or the timeout failed. The message names the URL
    /// without credentials.
    Unreachable(String),
}

impl FleetLockError {
    /// Whether the server answered (and said no), rather than not answering.
    pub fn is_refused(&self) -> bool {
        matches!(self, FleetLockError::Refused { .. })
    }
}

impl fmt::Display for FleetLockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FleetLockError::Refused {
                url,
                status,
                kind,
                value,
            } => {
                write!(f, "FleetLock server {url} answered HTTP {status}")?;
                match (kind, value) {
                    (Some(k), Some(v)) => write!(f, " ({k}: {v})")?,
                    (Some(k), None) => write!(f, " ({k})")?,
                    (None, Some(v)) => write!(f, " ({v})")?,
                    (None, None) => {}
                }
                write!(f, "; {}", advice(*status))
            }
            FleetLockError::Unreachable(message) => f.write_str(message),
        }
    }
}

impl std::error::Error for FleetLockError {}

/// What an operator can do about a refusal with `status`.
fn advice(status: u16) -> &'static str {
    match status {
        400 => {
            "the server did not accept the request: check that it knows the group \
             (rollout.fleetlock.group, or rollout.group) and speaks the FleetLock protocol"
        }
        401 | 403 => "the server refused ginx's credentials: check those in rollout.fleetlock.url",
        404 | 405 => {
            "no FleetLock endpoint there: rollout.fleetlock.url must be the base URL, without \
             /v1/…"
        }
        409 | 423 => {
            "other nodes of the group hold its slots; this node can go on once one of them \
             releases"
        }
        300..=399 => {
            "the server redirected the request, which FleetLock clients do not follow: point \
             rollout.fleetlock.url at the server itself"
        }
        500..=599 => {
            "the server failed, or the group's slots are all taken (airlock answers 500 for \
             that): check the server's logs"
        }
        _ => "the slot is not held: see the server's message and logs",
    }
}

/// The protocol's error body.
#[derive(Deserialize)]
struct RemoteError {
    kind: Option<String>,
    value: Option<String>,
}

impl FleetLock {
    /// Reads the machine id file, derives the app-specific id. `group` is the resolved group
    /// (fleetlock.group or rollout.group default). `timeout` bounds every request.
    pub fn new(cfg: &FleetLockConfig, group: &str, timeout: Duration) -> Result<Self, SetupError> {
        check_group(group)?;
        let id = read_machine_id(&cfg.machine_id)?;
        // The protocol header exists so that a redirected request is not taken for one meant
        // for the server: the builder follows no redirect.
        let http = crate::util::http_client(timeout)
            .build()
            .map_err(|e| SetupError::Client(crate::util::http_error(&e)))?;
        let body = serde_json::json!({ "client_params": { "id": id, "group": group } }).to_string();
        Ok(Self {
            http,
            pre_reboot: Endpoint::new(&cfg.url, Operation::PreReboot),
            steady_state: Endpoint::new(&cfg.url, Operation::SteadyState),
            id,
            group: group.to_owned(),
            body,
            timeout,
        })
    }

    /// The id the server knows this node by (zincati's, on the same machine).
    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn group(&self) -> &str {
        &self.group
    }

    /// POST {url}/v1/pre-reboot. Ok only on HTTP 200.
    pub async fn pre_reboot(&self) -> Result<(), FleetLockError> {
        self.call(Operation::PreReboot).await
    }

    /// POST {url}/v1/steady-state. Ok only on HTTP 200.
    pub async fn steady_state(&self) -> Result<(), FleetLockError> {
        self.call(Operation::SteadyState).await
    }

    async fn call(&self, op: Operation) -> Result<(), FleetLockError> {
        let endpoint = match op {
            Operation::PreReboot => &self.pre_reboot,
            Operation::SteadyState => &self.steady_state,
        };
        let unreachable = |e: reqwest::Error| {
            let cause = if e.is_timeout() {
                format!("no answer within {:?}", self.timeout)
            } else {
                crate::util::http_error(&e)
            };
            FleetLockError::Unreachable(format!(
                "FleetLock server {}: no answer to {} for group {:?}: {cause}; check that the \
                 server runs and that rollout.fleetlock.url points at it",
                endpoint.shown,
                op.describe(),
                self.group
            ))
        };
        let mut response = self
            .http
            .post(endpoint.url.clone())
            .header(PROTOCOL_HEADER, "true")
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(self.body.clone())
            .send()
            .await
            .map_err(unreachable)?;
        let status = response.status().as_u16();
        if status == 200 {
            return Ok(());
        }
        // What the server says about it; a body cut short leaves the refusal a refusal.
        let mut body = Vec::new();
        while body.len() < MAX_ERROR_BODY {
            match response.chunk().await {
                Ok(Some(chunk)) => body.extend_from_slice(&chunk),
                Ok(None) | Err(_) => break,
            }
        }
        let remote = serde_json::from_slice::<RemoteError>(&body).ok();
        let shown = |s: Option<String>| s.map(|s| clip(&s)).filter(|s| !s.is_empty());
        let (kind, value) = match remote {
            Some(r) => (shown(r.kind), shown(r.value)),
            None => (None, None),
        };
        Err(FleetLockError::Refused {
            url: endpoint.shown.clone(),
            status,
            kind,
            value,
        })
    }
}

/// Why a FleetLock client cannot be set up: the configuration or the node's files must be
/// fixed, which waiting does not do.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SetupError {
    #[error(
        "FleetLock group {0:?} must be letters, digits, '.' and '-' (the protocol's group \
         syntax); set rollout.fleetlock.group"
    )]
    Group(String),
    #[error(
        "rollout.fleetlock.machine_id {path}: cannot read it: {detail}; the FleetLock id is \
         derived from it (systemd writes /etc/machine-id at first boot)"
    )]
    Unreadable { path: String, detail: String },
    #[error("rollout.fleetlock.machine_id {path}: {why}")]
    MachineId { path: String, why: MachineIdError },
    #[error("cannot set up the FleetLock client: {0}")]
    Client(String),
}

/// Why the contents of a machine id file are not a machine id, as systemd reads it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MachineIdError {
    #[error(
        "the machine id is not set yet (\"uninitialized\"): systemd sets it at first boot, or \
         run systemd-machine-id-setup"
    )]
    Uninitialized,
    #[error(
        "not a machine id: expected 32 hexadecimal digits and a newline, found {chars} \
         characters{}; see machine-id(5)",
        if *.all_hex { "" } else { " with some that are not hexadecimal digits" }
    )]
    Malformed { chars: usize, all_hex: bool },
    #[error(
        "the machine id is all zeros, which systemd treats as unset; run systemd-machine-id-setup"
    )]
    AllZeros,
}

/// The protocol's group syntax, `^[a-zA-Z0-9.-]+$`.
fn check_group(group: &str) -> Result<(), SetupError> {
    if group.is_empty()
        || !group
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-')
    {
        return Err(SetupError::Group(group.to_owned()));
    }
    Ok(())
}

fn read_machine_id(path: &Path) -> Result<String, SetupError> {
    let shown = path.display().to_string();
    let contents = std::fs::read_to_string(path).map_err(|e| SetupError::Unreadable {
        path: shown.clone(),
        detail: e.to_string(),
    })?;
    app_machine_id(&contents).map_err(|why| SetupError::MachineId { path: shown, why })
}

/// zincati's app-specific machine id: what `systemd-id128 machine-id -a
/// de35106b6ec24688b63afddaa156679b` prints, i.e. systemd's
/// `sd_id128_get_machine_app_specific()`: HMAC-SHA256 keyed with the 16 machine-id bytes over
/// the 16 app-id bytes, its first 16 bytes made a v4 UUID (version nibble 4, variant 10),
/// printed as 32 lowercase hex digits.
///
/// `machine_id` is the file's contents, read as systemd reads `/etc/machine-id`: 32 hex digits,
/// optionally one newline; "uninitialized" and all zeros are refused as systemd refuses them.
pub fn app_machine_id(machine_id: &str) -> Result<String, MachineIdError> {
    let text = machine_id.strip_suffix('\n').unwrap_or(machine_id);
    if text == "uninitialized" {
        return Err(MachineIdError::Uninitialized);
    }
    let all_hex = text.bytes().all(|b| b.is_ascii_hexdigit());
    let malformed = || MachineIdError::Malformed {
        chars: text.chars().count(),
        all_hex,
    };
    if text.len() != 32 || !all_hex {
        return Err(malformed());
    }
    let mut key = [0u8; 16];
    for (i, byte) in key.iter_mut().enumerate() {
        // Checked above: 32 ASCII hex digits.
        *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).map_err(|_| malformed())?;
    }
    if key == [0; 16] {
        return Err(MachineIdError::AllZeros);
    }
    // HMAC takes a key of any length.
    let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(&key) else {
        return Err(malformed());
    };
    mac.update(&ZINCATI_APP_ID);
    let digest = mac.finalize().into_bytes();
    let mut id = [0u8; 16];
    id.copy_from_slice(&digest[..16]);
    id[6] = (id[6] & 0x0f) | 0x40;
    id[8] = (id[8] & 0x3f) | 0x80;
    Ok(id.iter().map(|b| format!("{b:02x}")).collect())
}

/// At most [`MAX_SHOWN`] characters, on one line.
fn clip(s: &str) -> String {
    let one_line: String = s
        .trim()
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    match one_line.char_indices().nth(MAX_SHOWN) {
        Some((at, _)) => format!("{}…", &one_line[..at]),
        None => one_line,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Computed on Debian 12 with systemd 252's own tool, the machine id bind-mounted over
    // /etc/machine-id: `systemd-id128 machine-id -a de35106b6ec24688b63afddaa156679b`.
    const VECTORS: &[(&str, &str)] = &[
        (
            "0123456789abcdef0123456789abcdef",
            "583627a932274834a8ebd99f4ed41c0d",
        ),
        (
            "c988d2509fdf4cdcbed39037c56406fb",
            "501ec20cfa2540778193fbc73db10236",
        ),
        (
            "ffffffffffffffffffffffffffffffff",
            "01e17ff8056e4c079b0bac70864eb9b5",
        ),
        (
            "00000000000000000000000000000001",
            "a2a5385f64d54b22b0eca8f3deb0cd10",
        ),
    ];

    #[test]
    fn app_id_is_what_systemd_id128_prints() {
        for (machine, app) in VECTORS {
            assert_eq!(app_machine_id(&format!("{machine}\n")).unwrap(), *app);
        }
    }

    #[test]
    fn app_id_accepts_what_systemd_accepts() {
        // No newline, and upper case: systemd 252 read both, and printed the same id.
        assert_eq!(
            app_machine_id("c988d2509fdf4cdcbed39037c56406fb").unwrap(),
            "501ec20cfa2540778193fbc73db10236"
        );
        assert_eq!(
            app_machine_id("C988D2509FDF4CDCBED39037C56406FB\n").unwrap(),
            "501ec20cfa2540778193fbc73db10236"
        );
    }

    #[test]
    fn app_id_is_a_v4_uuid() {
        for (machine, _) in VECTORS {
            let id = app_machine_id(machine).unwrap();
            assert_eq!(id.len(), 32);
            assert_eq!(&id[12..13], "4", "{id}");
            assert!(matches!(&id[16..17], "8" | "9" | "a" | "b"), "{id}");
        }
    }

    #[test]
    fn bad_machine_id_contents_are_refused_with_the_reason() {
        for (contents, says) in [
            ("", "found 0 characters"),
            ("\n", "found 0 characters"),
            ("c988d2509fdf4cdcbed39037c56406f\n", "found 31 characters"),
            ("c988d2509fdf4cdcbed39037c56406fbb\n", "found 33 characters"),
            ("c988d250-9fdf-4cdc-bed3-9037c56406fb\n", "not hexadecimal"),
            ("g988d2509fdf4cdcbed39037c56406fb\n", "not hexadecimal"),
            (
                "c988d2509fdf4cdcbed39037c56406fb\n\n",
                "found 33 characters",
            ),
            (" c988d2509fdf4cdcbed39037c56406fb\n", "found 33 characters"),
            ("uninitialized\n", "not set yet"),
            ("00000000000000000000000000000000\n", "all zeros"),
        ] {
            let e = app_machine_id(contents).unwrap_err().to_string();
            assert!(e.contains(says), "{contents:?}: {e}");
        }
    }

    #[test]
    fn a_missing_machine_id_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = config("http://127.0.0.1:1", &dir.path().join("machine-id"));
        let e = FleetLock::new(&cfg, "workers", Duration::from_secs(5))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("rollout.fleetlock.machine_id") && e.contains("machine-id"),
            "{e}"
        );
    }

    #[test]
    fn a_group_outside_the_protocol_syntax_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("machine-id");
        std::fs::write(&path, "c988d2509fdf4cdcbed39037c56406fb\n").unwrap();
        let cfg = config("http://127.0.0.1:1", &path);
        for group in ["", "a b", "work/ers", "wörkers"] {
            let e = FleetLock::new(&cfg, group, Duration::from_secs(5)).unwrap_err();
            assert_eq!(e, SetupError::Group(group.to_owned()));
            assert!(
                e.to_string().contains("rollout.fleetlock.group"),
                "{group:?}: {e}"
            );
        }
        let lock = FleetLock::new(&cfg, "control-plane.v1", Duration::from_secs(5)).unwrap();
        assert_eq!(lock.group(), "control-plane.v1");
        assert_eq!(lock.id(), "501ec20cfa2540778193fbc73db10236");
    }

    #[test]
    fn endpoints_are_appended_to_the_base_path_and_keep_the_query() {
        let base: EndpointUrl = "https://u:SECRET@fl.example/base/?token=SECRET"
            .parse()
            .unwrap();
        let e = Endpoint::new(&base, Operation::PreReboot);
        assert_eq!(
            e.url.as_str(),
            "https://u:SECRET@fl.example/base/v1/pre-reboot?token=SECRET"
        );
        assert_eq!(e.shown, "https://fl.example/base/v1/pre-reboot?token=***");
        let bare: EndpointUrl = "http://127.0.0.1:8080".parse().unwrap();
        let e = Endpoint::new(&bare, Operation::SteadyState);
        assert_eq!(e.url.as_str(), "http://127.0.0.1:8080/v1/steady-state");
        assert_eq!(e.shown, "http://127.0.0.1:8080/v1/steady-state");
    }

    #[test]
    fn refusals_show_the_server_s_words_and_no_secret() {
        let base: EndpointUrl = "https://u:SECRET@fl.example/?token=SECRET".parse().unwrap();
        let url = Endpoint::new(&base, Operation::PreReboot).shown;
        let e = FleetLockError::Refused {
            url: url.clone(),
            status: 423,
            kind: Some("lock_held".into()),
            value: Some("reboot lease lock unavailable, held by b".into()),
        };
        let text = e.to_string();
        assert!(e.is_refused());
        assert!(!text.contains("SECRET"), "{text}");
        for part in [
            "https://fl.example/v1/pre-reboot?token=***",
            "HTTP 423",
            "lock_held",
            "held by b",
            "other nodes of the group hold its slots",
        ] {
            assert!(text.contains(part), "{part:?} not in {text}");
        }
        let bare = FleetLockError::Refused {
            url,
            status: 500,
            kind: None,
            value: None,
        };
        let text = bare.to_string();
        assert!(text.contains("HTTP 500") && text.contains("logs"), "{text}");
        assert!(!text.contains("SECRET"), "{text}");
    }

    #[test]
    fn no_answer_is_unreachable_and_names_no_secret() {
        // A server that takes the connection and closes it without a word.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            for stream in listener.incoming().take(1) {
                drop(stream);
            }
        });
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("machine-id");
        std::fs::write(&path, "c988d2509fdf4cdcbed39037c56406fb\n").unwrap();
        let cfg = config(
            &format!("http://u:SECRET@127.0.0.1:{port}/?token=SECRET"),
            &path,
        );
        let lock = FleetLock::new(&cfg, "workers", Duration::from_secs(30)).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let e = rt.block_on(lock.pre_reboot()).unwrap_err();
        server.join().unwrap();
        let text = e.to_string();
        assert!(!e.is_refused(), "{text}");
        assert!(
            !text.contains("SECRET") && !format!("{e:?}").contains("SECRET"),
            "{text}"
        );
        assert!(
            text.contains(&format!("http://127.0.0.1:{port}/v1/pre-reboot?token=***")),
            "{text}"
        );
        assert!(text.contains("rollout.fleetlock.url"), "{text}");
    }

    #[test]
    fn server_words_are_clipped_to_one_line() {
        assert_eq!(clip(" a\nb\tc "), "a b c");
        let long = "x".repeat(MAX_SHOWN + 50);
        assert_eq!(clip(&long).chars().count(), MAX_SHOWN + 1);
    }

    fn config(url: &str, machine_id: &Path) -> FleetLockConfig {
        FleetLockConfig {
            url: url.parse().unwrap(),
            group: None,
            machine_id: machine_id.to_owned(),
        }
    }
}
