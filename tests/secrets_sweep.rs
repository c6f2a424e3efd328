//! The secrets sweep: after the `integration` tests, no secret that they made or
//! used appears in anything their ginx processes wrote (see support/sweep.rs for what is
//! collected). Cargo runs test targets one after another in the order of their names, so this
//! one runs after `integration` in `cargo test --workspace`; with `--no-fail-fast` it runs after
//! a failed `integration` too and sweeps what was collected.

#[allow(dead_code)] // The writing half is the integration tests'.
#[path = "support/sweep.rs"]
mod sweep;

use std::io::Read;
use std::path::Path;

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

#[test]
fn no_secret_reaches_anything_ginx_wrote() {
    let root = sweep::root();
    let outcome = match sweep::sweep(&root) {
        Ok(o) => o,
        Err(sweep::NoCollection(why)) => {
            assert!(!in_ci(), "{why}");
            eprintln!("SKIPPED: {why}");
            return;
        }
    };
    let run = std::fs::read_to_string(root.join("run")).unwrap_or_default();
    let summary = format!(
        "secrets sweep: {} secrets, {} files, {} bytes swept; {} findings; {}",
        outcome.secrets,
        outcome.files,
        outcome.bytes,
        outcome.findings.len(),
        run.trim()
    );
    std::fs::write(root.join("summary.txt"), format!("{summary}\n")).unwrap();
    println!("{summary}");
    assert!(
        outcome.missing.is_empty(),
        "collected files gone before the sweep: {:?}",
        outcome.missing
    );
    let shown: Vec<String> = outcome
        .findings
        .iter()
        .take(40)
        .map(|f| format!("- {f}"))
        .collect();
    assert!(
        outcome.findings.is_empty(),
        "{} secrets found in what ginx wrote (the secrets themselves are not shown; open the \
         file at the offset):\n{}",
        outcome.findings.len(),
        shown.join("\n")
    );
}

/// The sweep runs last only while its target's name sorts after every other test target's.
#[test]
fn the_sweep_is_the_last_test_target() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
    let text = std::fs::read_to_string(&manifest).unwrap();
    let doc: toml::Table = toml::from_str(&text).unwrap();
    let names: Vec<&str> = doc["test"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["name"].as_str())
        .collect();
    let last = names.iter().max().copied();
    assert_eq!(
        last,
        Some(env!("CARGO_CRATE_NAME")),
        "{}: the test target that sorts last by name runs last; rename it or the sweep",
        manifest.display()
    );
}

/// A reader that hands out `n` bytes at a time, as writes may have come.
struct Trickle<'a>(&'a [u8], usize);

impl Read for Trickle<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.1.min(buf.len()).min(self.0.len());
        buf[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        Ok(n)
    }
}

const KEY_LINE: &str = "MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgq7Zx1k3N0yWb5cU9";

fn matcher(secrets: &[&str]) -> aho_corasick::AhoCorasick {
    aho_corasick::AhoCorasick::new(secrets).unwrap()
}

#[test]
fn a_planted_secret_is_found_at_its_offset() {
    let m = matcher(&["s3cr3t-t0ken-value", KEY_LINE]);
    let text = format!("level=info fetched\nauth with s3cr3t-t0ken-value\n{KEY_LINE}\n");
    let found = sweep::scan(&m, text.as_bytes()).unwrap();
    let at = |s: &str| text.find(s).unwrap() as u64;
    assert_eq!(found, [(0, at("s3cr3t")), (1, at(KEY_LINE))]);
    assert!(
        sweep::scan(&m, &b"s3cr3t-t0ken-valu\nMIGHAgEAMBMG"[..])
            .unwrap()
            .is_empty()
    );
}

#[test]
fn a_key_line_split_across_reads_is_found() {
    let m = matcher(&[KEY_LINE]);
    let text = format!("{}{KEY_LINE}tail", "x".repeat(10_000));
    for piece in [1, 7, 63, 64, 4096, 8191] {
        let found = sweep::scan(&m, Trickle(text.as_bytes(), piece)).unwrap();
        assert_eq!(found, [(0, 10_000)], "reads of {piece} bytes");
    }
}

#[test]
fn audit_events_are_swept_only_with_their_request_bodies() {
    let m = matcher(&["bs-token-Zq81xv"]);
    let log = concat!(
        r#"{"level":"Metadata","requestURI":"/api/v1/secrets?x=bs-token-Zq81xv"}"#,
        "\n",
        r#"{"level":"Request","requestObject":{"data":"bs-token-Zq81xv"}}"#,
        "\n"
    );
    let (found, swept) = sweep::scan_audit(&m, log.as_bytes()).unwrap();
    let second = log.find('\n').unwrap() as u64 + 1;
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].0, 0);
    assert!(found[0].1 > second);
    assert_eq!(swept, log.len() as u64 - second);
}

/// The whole sweep over a collection made by hand: the finding names the kind, the file and
/// the offset, and nothing it prints holds the secret.
#[test]
fn a_sweep_reports_kind_file_and_offset_never_the_secret() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir_all(root.join("collected")).unwrap();
    let token = "pin-token-Hq72kd";
    let hex: String = token.bytes().map(|b| format!("{b:02x}")).collect();
    std::fs::write(
        root.join("secrets.tsv"),
        format!("pin-endpoint token\ttests/closure.rs:9\t{hex}\n"),
    )
    .unwrap();
    let clean = root.join("collected/000000-log");
    let leaky = root.join("collected/000001-status");
    std::fs::write(&clean, "nothing to see\n").unwrap();
    let status = format!("{{\"error\":\"401 for {token}\"}}");
    std::fs::write(&leaky, &status).unwrap();
    std::fs::write(
        root.join("index.tsv"),
        format!(
            "{}\traw\tt::a\tginx-0.log\n{}\traw\tt::b\tginxctl status --json\n",
            clean.display(),
            leaky.display()
        ),
    )
    .unwrap();
    let outcome = sweep::sweep(root).unwrap();
    assert_eq!((outcome.secrets, outcome.files), (1, 2));
    let [f] = &outcome.findings[..] else {
        panic!("{:?}", outcome.findings)
    };
    assert_eq!(
        (f.file.as_path(), f.offset),
        (leaky.as_path(), status.find(token).unwrap() as u64)
    );
    let said = f.to_string();
    assert!(
        said.contains("pin-endpoint token") && said.contains("t::b"),
        "{said}"
    );
    assert!(!said.contains(token) && !format!("{f:?}").contains(token));
}

#[test]
fn an_empty_collection_is_said_so() {
    let dir = tempfile::tempdir().unwrap();
    let Err(sweep::NoCollection(why)) = sweep::sweep(dir.path()) else {
        panic!("an empty directory swept")
    };
    assert!(why.contains("cargo test --workspace"), "{why}");
}
