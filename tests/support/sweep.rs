//! The secrets sweep: every secret a test helper makes is registered here when it is
//! made, and every byte the ginx processes of the suite wrote is collected here: daemon logs
//! and sd_notify lines, `ginxctl` and `check-config` output, state directories, scraped
//! metrics, and what reached the API servers. The `secrets_sweep` test target, which cargo runs
//! after `integration` (test targets run in the order of their names), scans the collection for
//! every registered secret.
//!
//! The collection lives under `<target>/tmp/secrets-sweep/`, because the tests' temp dirs are
//! gone when the sweep runs. The first use in a test process clears it:
//! - `run`: which process made this collection;
//! - `secrets.tsv`: `kind \t where registered \t hex bytes`, one secret a line;
//! - `index.tsv`: `path \t mode \t test \t origin` for every collected file; `path` is under
//!   `collected/`, or, for a file still being written when the test process ends (the shared
//!   control plane's audit log), the file itself, swept where it is.
//!
//! Mode `audit` means a Kubernetes audit log: only its events with a `requestObject` are swept
//! (the audit policy logs request bodies for writes by identities other than the tests' admin
//! and the control plane's own, see control_plane.rs).
//!
//! This module owns the registry, the collection and the scanner; it does not decide what to
//! collect: the helpers that start ginx or talk to it call it.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

/// Shorter secrets would be found by chance in megabytes of logs.
pub const MIN_SECRET_LEN: usize = 6;

/// A PEM or base64 line shorter than this is not worth registering (the last line of a body).
const MIN_PEM_LINE: usize = 16;

/// The collection of this build's tests.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("secrets-sweep")
}

struct Writer {
    root: PathBuf,
    secrets: Mutex<File>,
    index: Mutex<File>,
    seq: AtomicU64,
}

/// The collection of this process, cleared on first use. A benchmark (which includes this
/// support code, but is not a test: no `cfg(test)`) collects into a directory of its own that
/// nothing sweeps, so that one running beside the suite cannot clear the suite's collection.
fn writer() -> &'static Writer {
    static WRITER: OnceLock<Writer> = OnceLock::new();
    WRITER.get_or_init(|| {
        let root = if cfg!(test) {
            root()
        } else {
            root().with_file_name(format!("secrets-sweep-bench-{}", std::process::id()))
        };
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("collected")).unwrap();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        std::fs::write(
            root.join("run"),
            format!(
                "collected by {} (pid {}) from {now} (unix time)\n",
                std::env::args().next().unwrap_or_default(),
                std::process::id()
            ),
        )
        .unwrap();
        let append = |name: &str| {
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(root.join(name))
                .unwrap()
        };
        Writer {
            secrets: Mutex::new(append("secrets.tsv")),
            index: Mutex::new(append("index.tsv")),
            root,
            seq: AtomicU64::new(0),
        }
    })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Tabs and newlines would break the index's lines.
fn field(text: &str) -> String {
    text.replace(['\t', '\n', '\r'], " ")
}

/// The running test's name (libtest names each test's thread after it).
fn test_name() -> String {
    std::thread::current()
        .name()
        .unwrap_or("(unnamed thread)")
        .to_owned()
}

fn register(kind: &str, at: &std::panic::Location<'_>, bytes: &[u8]) {
    let bytes = bytes.trim_ascii();
    assert!(
        bytes.len() >= MIN_SECRET_LEN,
        "{}:{}: a {kind} shorter than {MIN_SECRET_LEN} bytes would be found by chance in the \
         secrets sweep: make it longer",
        at.file(),
        at.line()
    );
    let w = writer();
    let mut f = w.secrets.lock().unwrap_or_else(|e| e.into_inner());
    writeln!(
        f,
        "{}\t{}:{}\t{}",
        field(kind),
        at.file(),
        at.line(),
        hex(bytes)
    )
    .unwrap();
}

/// Registers a secret the tests made or use: a token, a password, a key.
#[track_caller]
pub fn secret(kind: &str, bytes: impl AsRef<[u8]>) {
    register(kind, std::panic::Location::caller(), bytes.as_ref());
}

/// Registers a password that may sit in a URL: as it is and percent-encoded.
#[track_caller]
pub fn secret_in_url(kind: &str, password: &str) {
    let at = std::panic::Location::caller();
    register(kind, at, password.as_bytes());
    let encoded: String = url::form_urlencoded::byte_serialize(password.as_bytes()).collect();
    if encoded != password {
        register(kind, at, encoded.as_bytes());
    }
}

/// Registers PEM material (a private key, a kubeconfig's key): every body line of at least
/// 16 characters (not the BEGIN/END lines), and, because kubeconfigs carry PEM base64-encoded
/// once more, its base64 form in aligned pieces of 32 characters (any leak of 63 or more
/// characters of it contains a whole piece).
#[track_caller]
pub fn secret_pem(kind: &str, pem: &str) {
    use base64::Engine;
    let at = std::panic::Location::caller();
    for line in pem.lines().map(str::trim) {
        if line.len() >= MIN_PEM_LINE && !line.starts_with("-----") {
            register(kind, at, line.as_bytes());
        }
    }
    let b64 = base64::engine::general_purpose::STANDARD.encode(pem);
    for piece in b64.as_bytes().chunks(32).filter(|p| p.len() == 32) {
        register(kind, at, piece);
    }
}

/// Registers the private key file at `path` (PEM or OpenSSH format).
#[track_caller]
pub fn secret_key_file(kind: &str, path: &Path) {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    secret_pem(kind, &text);
}

fn index(path: &Path, mode: &str, origin: &str) {
    let w = writer();
    let mut f = w.index.lock().unwrap_or_else(|e| e.into_inner());
    writeln!(
        f,
        "{}\t{mode}\t{}\t{}",
        path.display(),
        field(&test_name()),
        field(origin)
    )
    .unwrap();
}

/// A new file under `collected/`, named after `label`, indexed with `origin`.
fn new_file(label: &str, mode: &str, origin: &str) -> (PathBuf, File) {
    let w = writer();
    let n = w.seq.fetch_add(1, Ordering::Relaxed);
    let label: String = label
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(80)
        .collect();
    let path = w.root.join("collected").join(format!("{n:06}-{label}"));
    let file = File::create(&path).unwrap();
    index(&path, mode, origin);
    (path, file)
}

/// Collects `bytes` that ginx wrote (`origin` says where they came from).
pub fn collect(label: &str, origin: &str, bytes: &[u8]) {
    if bytes.is_empty() {
        return;
    }
    let (_, mut f) = new_file(label, "raw", origin);
    f.write_all(bytes).unwrap();
}

/// Collects a process's stdout and stderr.
pub fn collect_output(label: &str, origin: &str, out: &std::process::Output) {
    collect(&format!("{label}-stdout"), origin, &out.stdout);
    collect(&format!("{label}-stderr"), origin, &out.stderr);
}

/// Collects the output of `ginxctl args…` unless the caller asked it to show secrets.
pub fn collect_ctl(args: &[&str], out: &std::process::Output) {
    if args.contains(&"--show-secrets") {
        return;
    }
    // The collection's own words must hold no secret: arguments may (`kubeadm join TOKEN`),
    // so only subcommands and flags are named.
    let shown: Vec<&str> = args
        .iter()
        .map(|a| {
            let word = a.bytes().all(|b| b.is_ascii_lowercase() || b == b'-');
            if word { a } else { "…" }
        })
        .collect();
    collect_deduplicated(
        "ginxctl",
        &format!("ginxctl {}", shown.join(" ")),
        &[&out.stdout, &out.stderr],
    );
}

/// Collects what a test reads again and again (`ginxctl status` in a wait, a metrics scrape):
/// a test's pieces of one `label` go to one file, each different one once, after a
/// `==> what <==` line.
pub fn collect_deduplicated(label: &str, what: &str, pieces: &[&[u8]]) {
    use std::collections::{HashMap, HashSet};
    use std::hash::{DefaultHasher, Hash, Hasher};
    type Seen = (Sink, HashSet<u64>);
    static SINKS: OnceLock<Mutex<HashMap<(String, String), Seen>>> = OnceLock::new();
    let mut h = DefaultHasher::new();
    pieces.hash(&mut h);
    let mut sinks = SINKS
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let (sink, seen) = sinks
        .entry((test_name(), label.to_owned()))
        .or_insert_with(|| (Sink::new(label, label), HashSet::new()));
    if seen.insert(h.finish()) {
        sink.write(format!("==> {what} <==").as_bytes());
        for piece in pieces {
            sink.write(piece);
        }
    }
}

/// Copies the file at `path` into the collection, if it exists.
pub fn collect_file(label: &str, path: &Path) {
    collect_file_as(label, path, "raw");
}

fn collect_file_as(label: &str, path: &Path, mode: &str) {
    let Ok(mut from) = File::open(path) else {
        return;
    };
    let (_, mut to) = new_file(label, mode, &path.display().to_string());
    std::io::copy(&mut from, &mut to).unwrap();
}

/// Copies an audit log (only its events with request bodies are swept).
pub fn collect_audit_log(label: &str, path: &Path) {
    collect_file_as(label, path, "audit");
}

/// Sweeps the audit log at `path` where it is, at the end: it is written until the test
/// process exits, and kept.
pub fn collect_audit_log_at_end(path: &Path) {
    index(path, "audit", &path.display().to_string());
}

/// Copies every regular file under `dir` (a state directory) into one collected file, each
/// after a `==> path <==` line; not Git's object store: objects are compressed, no secret could
/// be read in them.
pub fn collect_dir(label: &str, dir: &Path) {
    fn walk(dir: &Path, into: &mut File) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        let mut entries: Vec<_> = entries.flatten().collect();
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            let path = entry.path();
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_dir() {
                let git_objects =
                    path.file_name().is_some_and(|n| n == "objects") && dir.join("HEAD").is_file();
                if !git_objects {
                    walk(&path, into);
                }
            } else if kind.is_file()
                && let Ok(mut from) = File::open(&path)
            {
                writeln!(into, "\n==> {} <==", path.display()).unwrap();
                std::io::copy(&mut from, into).unwrap();
            }
        }
    }
    if !dir.is_dir() {
        return;
    }
    let (_, mut into) = new_file(label, "raw", &dir.display().to_string());
    walk(dir, &mut into);
}

/// An append-only collected file, for a server that logs what it is sent.
pub struct Sink(Mutex<File>);

impl Sink {
    pub fn new(label: &str, origin: &str) -> Self {
        Self(Mutex::new(new_file(label, "raw", origin).1))
    }

    pub fn write(&self, bytes: &[u8]) {
        let mut f = self.0.lock().unwrap_or_else(|e| e.into_inner());
        f.write_all(bytes).unwrap();
        f.write_all(b"\n").unwrap();
    }
}

// The sweep.

/// One registered secret (deduplicated: the first registration names it).
#[derive(Debug, Clone)]
pub struct Secret {
    pub kind: String,
    pub registered_at: String,
    pub bytes: Vec<u8>,
}

/// A secret found in collected bytes. It never carries the secret itself.
#[derive(Debug, Clone, PartialEq)]
pub struct Finding {
    pub kind: String,
    pub registered_at: String,
    pub file: PathBuf,
    pub offset: u64,
    pub test: String,
    pub origin: String,
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "a {} (registered at {}) in {} at byte {} (collected by test {} from {})",
            self.kind,
            self.registered_at,
            self.file.display(),
            self.offset,
            self.test,
            self.origin
        )
    }
}

/// What a sweep looked at and found.
#[derive(Debug, Default)]
pub struct Outcome {
    pub secrets: usize,
    pub files: usize,
    pub bytes: u64,
    pub findings: Vec<Finding>,
    /// Indexed files that were gone (an audit log removed before the sweep).
    pub missing: Vec<PathBuf>,
}

/// Why there is nothing to sweep.
#[derive(Debug)]
pub struct NoCollection(pub String);

pub fn load_secrets(root: &Path) -> Vec<Secret> {
    let Ok(text) = std::fs::read_to_string(root.join("secrets.tsv")) else {
        return Vec::new();
    };
    let mut seen = std::collections::HashSet::new();
    text.lines()
        .filter_map(|l| {
            let mut f = l.split('\t');
            let (kind, at, bytes) = (f.next()?, f.next()?, unhex(f.next()?)?);
            seen.insert(bytes.clone()).then(|| Secret {
                kind: kind.to_owned(),
                registered_at: at.to_owned(),
                bytes,
            })
        })
        .collect()
}

/// Where `secrets` occur in `input`, read in whatever pieces it comes: `(secret index, byte
/// offset)`. A secret that spans two reads is found like any other.
pub fn scan(
    matcher: &aho_corasick::AhoCorasick,
    input: impl Read,
) -> std::io::Result<Vec<(usize, u64)>> {
    let mut found = Vec::new();
    for m in matcher.stream_find_iter(input) {
        let m = m?;
        found.push((m.pattern().as_usize(), m.start() as u64));
    }
    Ok(found)
}

/// Like [`scan`], for an audit log: only its events with a `requestObject`, one JSON object a
/// line; offsets are the file's.
pub fn scan_audit(
    matcher: &aho_corasick::AhoCorasick,
    input: impl Read,
) -> std::io::Result<(Vec<(usize, u64)>, u64)> {
    let mut reader = BufReader::new(input);
    let mut line = Vec::new();
    let (mut offset, mut swept) = (0u64, 0u64);
    let mut found = Vec::new();
    loop {
        line.clear();
        let n = reader.read_until(b'\n', &mut line)?;
        if n == 0 {
            return Ok((found, swept));
        }
        if memchr_find(&line, b"\"requestObject\":") {
            swept += n as u64;
            found.extend(
                matcher
                    .find_iter(&line)
                    .map(|m| (m.pattern().as_usize(), offset + m.start() as u64)),
            );
        }
        offset += n as u64;
    }
}

fn memchr_find(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// Scans every collected file under `root` for every secret registered there.
pub fn sweep(root: &Path) -> Result<Outcome, NoCollection> {
    let secrets = load_secrets(root);
    let index = std::fs::read_to_string(root.join("index.tsv")).unwrap_or_default();
    if secrets.is_empty() || index.trim().is_empty() {
        return Err(NoCollection(format!(
            "nothing to sweep in {} ({} secrets registered, {} files collected): the sweep \
             checks what the `integration` tests collected, so run it after them, as \
             `cargo test --workspace` does",
            root.display(),
            secrets.len(),
            index.lines().count()
        )));
    }
    let matcher = aho_corasick::AhoCorasick::new(secrets.iter().map(|s| &s.bytes))
        .expect("an automaton over the registered secrets");
    let mut outcome = Outcome {
        secrets: secrets.len(),
        ..Outcome::default()
    };
    for l in index.lines() {
        let mut f = l.split('\t');
        let (Some(path), Some(mode), Some(test), Some(origin)) =
            (f.next(), f.next(), f.next(), f.next())
        else {
            continue;
        };
        let path = PathBuf::from(path);
        let Ok(file) = File::open(&path) else {
            outcome.missing.push(path);
            continue;
        };
        let (found, bytes) = if mode == "audit" {
            scan_audit(&matcher, file)
        } else {
            let len = file.metadata().map_or(0, |m| m.len());
            scan(&matcher, file).map(|f| (f, len))
        }
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
        outcome.files += 1;
        outcome.bytes += bytes;
        outcome
            .findings
            .extend(found.into_iter().map(|(i, offset)| Finding {
                kind: secrets[i].kind.clone(),
                registered_at: secrets[i].registered_at.clone(),
                file: path.clone(),
                offset,
                test: test.to_owned(),
                origin: origin.to_owned(),
            }));
    }
    Ok(outcome)
}
