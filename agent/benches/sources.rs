//! Figures for Git sources (run: `cargo bench --bench sources`): a repository of 5,000 commits
//! and 20,000 files served by `git daemon` on 127.0.0.1; ginx (libgit2) against the `git` CLI
//! on the same remote, in the same run: initial clone of the branch, incremental fetch of one
//! new commit; and push-to-tree-ready through the daemon with `ginxctl sync`.
//!
//! `BENCH_COMMITS` and `BENCH_FILES` change the size.

#[path = "../../tests/support/mod.rs"]
mod support;

use std::io::Write;
use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use ginx::config::SourceConfig;
use ginx::source::auth::Auth;
use ginx::source::git::{Clone, FetchSpec};
use support::{Env, inetd};

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Builds a bare repository with `commits` commits and `files` files with `git fast-import`.
fn build_repo(bare: &Path, commits: usize, files: usize) {
    let status = support::git::git_cmd()
        .args(["init", "-q", "--bare", "-b", "main"])
        .arg(bare)
        .status()
        .unwrap();
    assert!(status.success());
    let mut child = support::git::git_cmd()
        .arg("-C")
        .arg(bare)
        .args(["fast-import", "--quiet"])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    let mut w = std::io::BufWriter::new(child.stdin.take().unwrap());
    let mut t = 1_700_000_000u64;
    for c in 0..commits {
        t += 60;
        let msg = format!("commit {c}");
        writeln!(w, "commit refs/heads/main").unwrap();
        writeln!(w, "committer Bench <bench@example.com> {t} +0000").unwrap();
        writeln!(w, "data {}\n{msg}", msg.len()).unwrap();
        let changed: Box<dyn Iterator<Item = usize>> = if c == 0 {
            Box::new(0..files)
        } else {
            Box::new(std::iter::once((c * 7919) % files))
        };
        if c == 0 {
            writeln!(w, "M 644 inline hive.nix\ndata 4\n{{ }}\n").unwrap();
        }
        for f in changed {
            let body = format!("{{ file = {f}; commit = {c}; }}\n");
            writeln!(w, "M 644 inline hosts/{:03}/{f}.nix", f % 500).unwrap();
            writeln!(w, "data {}\n{body}", body.len()).unwrap();
        }
        writeln!(w).unwrap();
    }
    drop(w);
    assert!(child.wait().unwrap().success());
}

fn add_commit(bare: &Path, n: usize) {
    let work = bare.with_extension("work");
    if !work.exists() {
        let ok = support::git::git_cmd()
            .args(["clone", "-q"])
            .arg(bare)
            .arg(&work)
            .status()
            .unwrap();
        assert!(ok.success());
    }
    let repo = support::GitRepo { path: work };
    repo.commit(&format!("bench/{n}.nix"), "{ }\n", "one more");
    repo.git(&["push", "-q", "origin", "main"]);
}

fn time(f: impl FnOnce()) -> Duration {
    let t = Instant::now();
    f();
    t.elapsed()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn secs(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        format!("{:.0} ms", d.as_secs_f64() * 1000.0)
    } else {
        format!("{:.2} s", d.as_secs_f64())
    }
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let commits = env_or("BENCH_COMMITS", 5000);
    let files = env_or("BENCH_FILES", 20_000);
    let env = Env::new();
    let served = env.root.join("served");
    std::fs::create_dir_all(&served).unwrap();
    let bare = served.join("big.git");
    let built = time(|| build_repo(&bare, commits, files));
    eprintln!("built {commits} commits / {files} files in {}", secs(built));
    let server = inetd::git_daemon(&served);
    let url = format!("git://127.0.0.1:{}/big.git", server.port);

    let cfg: SourceConfig = toml::from_str(&format!("url = \"{url}\"")).unwrap();
    let auth = Auth::load(&cfg).unwrap();
    let remotes = cfg.remotes();
    let cancel = AtomicBool::new(false);
    let spec = FetchSpec {
        source: "hephaestus",
        remotes: &remotes,
        branch: "main",
        testing: None,
        auth: &auth,
        cancel: &cancel,
    };

    let ginx_dir = env.root.join("ginx-clone");
    let clone = Clone::new(ginx_dir);
    let ginx_clone = time(|| {
        clone.fetch(&spec).unwrap();
    });
    let git_dir = env.root.join("git-clone.git");
    let git_clone = time(|| {
        let ok = support::git::git_cmd()
            .args([
                "clone",
                "-q",
                "--bare",
                "--single-branch",
                "--branch",
                "main",
                "--no-tags",
            ])
            .arg(&url)
            .arg(&git_dir)
            .status()
            .unwrap();
        assert!(ok.success());
    });

    let rounds = 5;
    let (mut ginx_inc, mut git_inc) = (Vec::new(), Vec::new());
    for n in 0..rounds {
        add_commit(&bare, n);
        // Alternate who goes first, so neither always meets a warm server cache.
        let mut run_ginx = || {
            ginx_inc.push(time(|| {
                clone.fetch(&spec).unwrap();
            }))
        };
        let mut run_git = || {
            git_inc.push(time(|| {
                let ok = support::git::git_cmd()
                    .arg("-C")
                    .arg(&git_dir)
                    .args([
                        "fetch",
                        "-q",
                        "--no-tags",
                        &url,
                        "+refs/heads/main:refs/heads/main",
                    ])
                    .status()
                    .unwrap();
                assert!(ok.success());
            }))
        };
        if n % 2 == 0 {
            run_ginx();
            run_git();
        } else {
            run_git();
            run_ginx();
        }
    }
    let (ginx_inc, git_inc) = (median(ginx_inc), median(git_inc));

    // Push to tree ready, through the daemon.
    env.dropin(
        "10-remote.toml",
        &format!("[sources.hephaestus]\nurl = \"{url}\"\nfetch_timeout = \"10m\"\n"),
    );
    let started = Instant::now();
    let d = env.start();
    d.wait_status("the first tree", |s| {
        s["sources"]["hephaestus"]["tree"].is_string()
    });
    let daemon_initial = started.elapsed();
    let (mut push_times, mut sync_times) = (Vec::new(), Vec::new());
    for n in rounds..rounds + 5 {
        push_times.push(time(|| add_commit(&bare, n)));
        sync_times.push(time(|| {
            let out = d.ctl(&["sync", "hephaestus"]);
            assert!(out.status.success());
        }));
    }
    let push = median(push_times);
    let sync = median(sync_times);

    println!("Repository: {commits} commits, {files} files, served by git daemon on 127.0.0.1.");
    println!();
    println!("| figure | ginx (libgit2) | git CLI | ginx / git |");
    println!("| --- | --- | --- | --- |");
    println!(
        "| initial clone of the branch | {} | {} | {:.2} |",
        secs(ginx_clone),
        secs(git_clone),
        ginx_clone.as_secs_f64() / git_clone.as_secs_f64()
    );
    println!(
        "| incremental fetch of one new commit, median of {rounds} | {} | {} | {:.2} |",
        secs(ginx_inc),
        secs(git_inc),
        ginx_inc.as_secs_f64() / git_inc.as_secs_f64()
    );
    println!();
    println!("| figure | value |");
    println!("| --- | --- |");
    println!(
        "| daemon start to first tree ready (clone + checkout of {files} files) | {} |",
        secs(daemon_initial)
    );
    println!("| `git push` of one commit, median of 5 | {} |", secs(push));
    println!(
        "| `ginxctl sync` until the new tree is ready, median of 5 | {} |",
        secs(sync)
    );
    println!("| push to tree ready | {} |", secs(push + sync));
}
