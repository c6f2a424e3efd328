//! The fuzz targets: one function per parser of input ginx does not control, each
//! taking arbitrary bytes, never panicking on them, and asserting the invariants that must
//! hold whatever the bytes (a panic here is a finding). `fuzz/` drives them with libFuzzer
//! (`cargo fuzz`, nightly); `cargo test` replays the committed seed corpus (`fuzz/corpus/`)
//! and every regression input through the same functions on stable.
//!
//! Owns: the targets and their invariants. Must not: touch the file system, the network or
//! the clock beyond what the parsers themselves do (so a run is reproducible; the configuration
//! loader looks up `rollout.gate.command`'s program, and the configuration target reads the
//! clocks only as the base of the arithmetic it checks).

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

use crate::cli::render;
use crate::config;
use crate::control::protocol::{self, HistoryReport};
use crate::kubeadm::{self, facts, render as kubeadm_render};
use crate::source::{auth, verify};
use crate::status::{ClusterView, Status};
use crate::types::{EndpointUrl, RemoteUrl, Role};

/// A fuzz target: bytes in, a panic when an invariant breaks.
pub type Target = fn(&[u8]);

/// The targets by name, as `fuzz/fuzz_targets/<name>.rs` and `fuzz/corpus/<name>/` call them.
pub const TARGETS: &[(&str, Target)] = &[
    ("config", config_files),
    ("control_request", control_request),
    ("kubeadm_cluster", kubeadm_cluster),
    ("trust_files", trust_files),
    ("url_secrets", url_secrets),
    ("render", renderers),
];

/// The secret the URL and configuration targets put into every password position.
pub const SECRET: &str = "Zq7xS3cr3tVw";

/// Where the configuration target's files are said to be (nothing is read from there).
const MAIN: &str = "/fuzz/etc/ginx/config.toml";

/// The configuration loader, from bytes to the outcome of `check-config`: the input is the
/// main file and up to three drop-ins, separated by lines `#---`. `$PW` becomes [`SECRET`].
///
/// Invariants: an error names one of the files; neither an error nor the effective
/// configuration shows the secret; the effective configuration loads again to the same
/// rendering; every duration it holds survives the arithmetic ginx does with it (once,
/// `check-config` passed values that then panicked a probe task).
pub fn config_files(data: &[u8]) {
    let text = String::from_utf8_lossy(data).replace("$PW", SECRET);
    if has_secret_outside_urls(&text) {
        return;
    }
    let mut files = Vec::new();
    for (i, part) in text.split("\n#---\n").take(4).enumerate() {
        let path = if i == 0 {
            PathBuf::from(MAIN)
        } else {
            PathBuf::from(format!("/fuzz/etc/ginx/config.d/{i:02}-fuzz.toml"))
        };
        files.push((path, part.to_owned()));
    }
    match config::load_texts(&files) {
        Ok(cfg) => {
            let (now, wall) = (std::time::Instant::now(), jiff::Timestamp::now());
            for (key, d) in config::bounds::durations(&cfg) {
                if let Err(e) = config::bounds::arithmetic(d, now, wall) {
                    panic!("{key} was accepted, then: {e}");
                }
            }
            let shown = cfg.to_toml();
            assert!(
                !shown.contains(SECRET),
                "the effective configuration shows the secret:\n{shown}"
            );
            // What check-config prints is a configuration again, and the same one.
            let again = config::load_texts(&[(PathBuf::from(MAIN), shown.clone())]);
            if let Ok(again) = again {
                assert_eq!(
                    again.to_toml(),
                    shown,
                    "check-config's output does not round-trip"
                );
            }
        }
        Err(e) => {
            let message = e.to_string();
            assert!(
                files
                    .iter()
                    .any(|(f, _)| message.contains(&f.display().to_string())),
                "the error names no file: {message}"
            );
            assert!(
                !message.contains(SECRET),
                "the error shows the secret: {message}"
            );
        }
    }
}

/// Whether the secret is somewhere other than a URL's password (`://user:SECRET@`) on a line
/// of a key that holds URLs (`url`, `urls`, `*_url`, `substituters`, as far as the text before
/// its `=` tells): a node name or a key that happens to hold a URL-like string is echoed in
/// errors on purpose, and is not what the invariant is about.
fn has_secret_outside_urls(text: &str) -> bool {
    let mut rest = text;
    while let Some(at) = rest.find(SECRET) {
        let before = &rest[..at];
        let after = &rest[at + SECRET.len()..];
        let line = &before[before.rfind('\n').map_or(0, |i| i + 1)..];
        let key = line.split('=').next().unwrap_or_default();
        let key = key
            .rsplit('.')
            .next()
            .unwrap_or_default()
            .to_ascii_lowercase();
        let url_key = key.contains("url") || key.contains("substituters");
        let user_start = before.rfind("://").map(|i| i + 3);
        let in_password = url_key
            && after.starts_with('@')
            && user_start.is_some_and(|s| {
                let user = &before[s..];
                user.ends_with(':')
                    && user[..user.len() - 1]
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"-._~".contains(&b))
            });
        if !in_password {
            return true;
        }
        rest = after;
    }
    false
}

/// The control socket's request parser, on one request line.
///
/// Invariants: a parsed request serialises and parses back to itself; a refusal serialises
/// and is bounded; the command's name and privilege are defined.
pub fn control_request(data: &[u8]) {
    if data.len() > protocol::MAX_REQUEST {
        return;
    }
    match protocol::parse_request(data) {
        Ok(request) => {
            let _ = (request.command.name(), request.command.mutates());
            let line = serde_json::to_vec(&request).expect("a request serialises");
            let back = protocol::parse_request(&line).expect("a serialised request parses");
            assert_eq!(back, request, "the request does not round-trip");
        }
        Err(refusal) => {
            assert!(!refusal.ok);
            let line = serde_json::to_vec(&refusal).expect("a refusal serialises");
            assert!(
                line.len() <= protocol::MAX_REQUEST + 1024,
                "a refusal of {} bytes for a request of {}",
                line.len(),
                data.len()
            );
        }
    }
}

/// The kubeadm cluster file and the fact checks, then the documents rendered from them.
///
/// Invariants: a parse error names the file; masked documents hold neither the bootstrap
/// token nor the certificate key; every document reads back from its YAML unchanged.
pub fn kubeadm_cluster(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let origin = "argus:clusters/fuzz.toml@0123456";
    let facts_in = match kubeadm::parse_cluster_file(origin, &text) {
        Ok(f) => f,
        Err(e) => {
            assert!(e.0.starts_with(origin), "the error names no file: {e}");
            return;
        }
    };
    let Ok(cluster) = facts::resolve(&facts_in) else {
        return;
    };
    let token = "abcdef.0123456789abcdef";
    let key = "f".repeat(64);
    let secrets = kubeadm_render::Secrets {
        token: Some(token.into()),
        certificate_key: Some(key.clone()),
        ca_cert_hashes: vec![format!("sha256:{}", "0".repeat(64))],
    };
    for (name, role, address) in [
        (
            "cp-1",
            Role::ControlPlane,
            Some(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 11))),
        ),
        ("worker-1", Role::Worker, None),
    ] {
        let node = facts::NodeFacts {
            name: name.into(),
            role,
            advertise_address: address,
            node_ip: address,
        };
        if facts::check_node(&cluster, &node).is_err() {
            continue;
        }
        let mut docs = kubeadm_render::init(&cluster, &node, &secrets);
        docs.push(kubeadm_render::join(&cluster, &node, &secrets, true));
        docs.push(kubeadm_render::join(&cluster, &node, &secrets, false));
        docs.push(kubeadm_render::kube_vip(
            &cluster,
            "/etc/kubernetes/admin.conf",
        ));
        for d in &docs {
            let yaml = kubeadm_render::to_yaml(std::slice::from_ref(d)).expect("documents write");
            let back: serde_json::Value =
                serde_saphyr::from_str(&yaml).expect("a written document reads back");
            assert_eq!(&back, d, "the YAML does not read back:\n{yaml}");
        }
        kubeadm_render::mask(&mut docs);
        let shown = kubeadm_render::to_yaml(&docs).expect("documents write");
        // A secret the input itself holds (the fuzzer wrote 64 f's into cert_sans) is the
        // input's, shown on purpose.
        let from_input = |s: &str| text.contains(s);
        assert!(
            (from_input(token) || !shown.contains(token))
                && (from_input(&key) || !shown.contains(&key)),
            "masked documents show a secret:\n{shown}"
        );
    }
}

/// `known_hosts` and `allowed_signers`: the first line of the input is the host name, the rest
/// the file (both parsers read the same text).
///
/// Invariants: an allowed_signers error names a line of the file; a host-key check's error names
/// the file; a host key is accepted only when a line that is not a marker (`@revoked`,
/// `@cert-authority`) lists exactly that key.
pub fn trust_files(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let (name, file) = text.split_once('\n').unwrap_or(("git.example", &text));
    let lines = file.lines().count();
    if let Err((line, message)) = verify::parse_allowed_signers(file) {
        assert!(
            (1..=lines).contains(&line),
            "line {line} of {lines}: {message}"
        );
    }
    let key = ssh_key::PublicKey::from_openssh(HOST_KEY).expect("the fixed host key");
    let path = Path::new("/fuzz/known_hosts");
    match auth::check_host_key_in(file, path, name, &key) {
        Ok(()) => {
            // Some line without a marker has a field that reads as this very key. (Not the same
            // text: ssh-key reads an Ed25519 blob whose length prefix is off as the same key, as
            // the fuzzer found: fuzz/regressions/trust_files/.)
            let lists_it = |l: &str| {
                let fields: Vec<&str> = l.split_whitespace().collect();
                fields.windows(2).any(|w| {
                    // A comment may follow the key, even without a space.
                    let blob = w[1].split('#').next().unwrap_or_default();
                    ssh_key::PublicKey::from_openssh(&format!("{} {blob}", w[0]))
                        .is_ok_and(|k| k.key_data() == key.key_data())
                })
            };
            assert!(
                file.lines()
                    .any(|l| !l.trim_start().starts_with('@') && lists_it(l)),
                "the host key of {name:?} is accepted, but no plain line lists it"
            );
        }
        Err(e) => assert!(
            e.contains("/fuzz/known_hosts"),
            "the error names no file: {e}"
        ),
    }
}

/// The host key the known_hosts target offers.
const HOST_KEY: &str =
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIG7oKscui8sXH7Lf0hBWsgRK1/CWfvNbr013Z9uff8Vw";

/// URL parsing and credential masking. The first byte picks how the URL is written (its low
/// three bits the scheme, the next two where [`SECRET`] goes: the password, the user name of an
/// HTTP(S) or git:// URL, a query value, the fragment); the rest is split at the first newline
/// into the user name and what follows the `@`. The input is also parsed as written.
///
/// Invariant: the secret appears in no output and no error: `Display`, `Debug`, the serialised
/// form, and a message naming the URL as configured once scrubbed.
pub fn url_secrets(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    // As written: no panic.
    if let Ok(u) = text.parse::<RemoteUrl>() {
        let _ = (u.to_string(), u.transport(), u.local_path(), u.scrub(&text));
    }
    if let Ok(u) = text.parse::<EndpointUrl>() {
        let _ = (u.to_string(), u.as_request_str().len());
    }
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let rest = String::from_utf8_lossy(rest);
    let mut parts = rest.splitn(2, '\n');
    let user: String = parts
        .next()
        .unwrap_or_default()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || "-._~".contains(*c))
        .collect();
    let tail = parts.next().unwrap_or("example.org/repo.git");
    // The url crate drops tabs and line breaks anywhere in a URL: a copy of the secret split
    // by them in the tail is the tail's, shown as its path (the fuzzer's find:
    // fuzz/regressions/url_secrets/).
    if tail.replace(['\t', '\n', '\r'], "").contains(SECRET) || user.contains(SECRET) {
        return;
    }
    let scheme = [
        "https://",
        "http://",
        "ssh://",
        "git://",
        "git+ssh://",
        "file://",
        "HTTPS://",
        "",
    ][usize::from(first) % 8];
    let raw = match (first >> 3) % 4 {
        // Over SSH the user name is shown on purpose; an SCP-like path has no query.
        1 if ["https://", "http://", "git://", "HTTPS://"].contains(&scheme) => {
            format!("{scheme}{SECRET}@{tail}")
        }
        2 if !scheme.is_empty() => format!("{scheme}{user}@{tail}?private_token={SECRET}"),
        3 if !scheme.is_empty() => format!("{scheme}{user}@{tail}#{SECRET}"),
        _ => format!("{scheme}{user}:{SECRET}@{tail}"),
    };
    let hidden = |what: &str, shown: &str| {
        assert!(
            !shown.contains(SECRET),
            "{what} of {raw:?} shows the secret: {shown}"
        );
    };
    match raw.parse::<RemoteUrl>() {
        Ok(u) => {
            hidden("Display", &u.to_string());
            hidden("Debug", &format!("{u:?}"));
            hidden("the JSON", &serde_json::to_string(&u).unwrap_or_default());
            hidden(
                "scrub",
                &u.scrub(&format!("fatal: unable to access '{raw}': refused")),
            );
        }
        Err(e) => hidden("the error", &e.to_string()),
    }
    match raw.parse::<EndpointUrl>() {
        Ok(u) => {
            hidden("Display", &u.to_string());
            hidden("Debug", &format!("{u:?}"));
            hidden("the JSON", &serde_json::to_string(&u).unwrap_or_default());
        }
        Err(e) => hidden("the error", &e.to_string()),
    }
}

/// The status, health, history and cluster renderers, over any JSON that deserialises into
/// their input. The first byte picks the renderer.
///
/// Invariant: rendering does not panic, and what `ginxctl` writes to a terminal after
/// [`render::terminal_safe`] holds no control character but newlines and tabs.
pub fn renderers(data: &[u8]) {
    let Some((&which, json)) = data.split_first() else {
        return;
    };
    let out = match which % 4 {
        0 => serde_json::from_slice::<Status>(json)
            .ok()
            .map(|s| render::status(&s)),
        1 => serde_json::from_slice::<Status>(json)
            .ok()
            .map(|s| render::health(&s)),
        2 => serde_json::from_slice::<HistoryReport>(json)
            .ok()
            .map(|h| render::history(&h, which & 4 != 0)),
        _ => serde_json::from_slice::<ClusterView>(json)
            .ok()
            .map(|v| render::cluster(&v)),
    };
    if let Some(out) = out {
        let safe = render::terminal_safe(&out);
        assert!(
            !safe
                .chars()
                .any(|c| c.is_control() && c != '\n' && c != '\t'),
            "a control character reaches the terminal"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The committed corpus of every target, replayed on stable: every file under
    /// `fuzz/corpus/<target>/` and `fuzz/regressions/<target>/`.
    #[test]
    fn the_seed_corpus_and_every_regression_replay() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
        for (name, target) in TARGETS {
            let mut replayed = 0;
            for dir in ["corpus", "regressions"] {
                let Ok(entries) = std::fs::read_dir(root.join(dir).join(name)) else {
                    continue;
                };
                for e in entries.flatten() {
                    let bytes = std::fs::read(e.path()).unwrap();
                    let r = std::panic::catch_unwind(|| target(&bytes));
                    assert!(r.is_ok(), "{name}: {} fails", e.path().display());
                    replayed += 1;
                }
            }
            assert!(replayed > 0, "no corpus for fuzz target {name}");
        }
    }

    #[test]
    fn the_invariants_can_fail() {
        // A secret the URL target must catch, shown where it is not a password.
        assert!(has_secret_outside_urls(&format!("key = \"{SECRET}\"")));
        assert!(has_secret_outside_urls(&format!(
            "name = \"https://git:{SECRET}@example.org/x\""
        )));
        assert!(!has_secret_outside_urls(&format!(
            "url = \"https://git:{SECRET}@example.org/x\""
        )));
        // A renderer fed something that is not its input renders nothing.
        renderers(b"\x00not json");
    }
}
