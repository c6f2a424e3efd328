//! The core loop: clone, apply with colmena, remember, retry with backoff, survive restarts.

use std::path::PathBuf;

use jiff::Timestamp;
use nix::sys::signal::Signal;
use serde_json::Value;

use crate::support::{self, Env, GitRepo, inetd, process_running, wait_for};

fn ts(v: &Value) -> Timestamp {
    v.as_str().expect("a timestamp").parse().expect("RFC 3339")
}

#[test]
fn first_clone_is_applied_with_colmena_in_a_clean_tree() {
    let env = Env::new();
    let head = env.repo.head();
    let d = env.start();
    let s = d.wait_applied(&head);
    assert_eq!(s["node"], "lucy");
    assert_eq!(s["sources"]["hephaestus"]["revision"], head.as_str());
    assert_eq!(s["sources"]["hephaestus"]["error"], Value::Null);
    assert!(s["sources"]["hephaestus"]["fetched_at"].is_string());

    let calls = env.calls();
    assert_eq!(calls.len(), 1);
    let call = &calls[0];
    assert_eq!(call.argv, ["apply-local", "--node", "lucy", "switch"]);
    assert!(
        call.cwd.join("hive.nix").is_file(),
        "runs in the checked-out tree"
    );
    assert!(
        !call.cwd.join(".git").exists(),
        "a clean tree, not a work tree"
    );
    assert!(
        call.cwd.starts_with(&env.state_dir),
        "{}",
        call.cwd.display()
    );
    assert_eq!(call.env["GINX_REVISION"], head);
    assert_eq!(call.env["GINX_NODE"], "lucy");
    assert!(
        env.state_dir.join("sources/hephaestus").is_dir(),
        "clone under state_dir/sources"
    );
    assert!(env.state_dir.join("state.json").is_file());
}

/// The state directory holds the clones (hive.nix) and the attempts' output: created 0700
/// outside systemd too, and an existing one readable by others made 0700, with a warning.
#[test]
fn the_state_dir_is_private() {
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    let env = Env::new();
    let d = env.start();
    d.wait_applied(&env.repo.head());
    assert_eq!(mode(&env.state_dir), 0o700);
    assert!(!d.log().contains("made it 0700"), "{}", d.log());
    d.stop();
    std::fs::set_permissions(&env.state_dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let d = env.start();
    d.wait_status("running", |s| s["node"] == "lucy");
    assert_eq!(mode(&env.state_dir), 0o700);
    assert_eq!(
        d.log()
            .matches("state_dir was readable by others; made it 0700")
            .count(),
        1,
        "{}",
        d.log()
    );
}

#[test]
fn new_commit_and_sync_is_applied() {
    let env = Env::new();
    let d = env.start();
    d.wait_applied(&env.repo.head());
    let second = env.repo.commit("hosts/lucy.nix", "{ }\n", "configure lucy");
    let out = d.ctl_ok(&["sync"]);
    assert!(
        out.contains("hephaestus:") && out.contains("(new)"),
        "{out}"
    );
    d.wait_applied(&second);
    let calls = env.calls();
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[1].env["GINX_REVISION"], second);
    assert!(calls[1].cwd.join("hosts/lucy.nix").is_file());
    // The tree of the old revision is gone; the new one stays.
    assert!(!calls[0].cwd.exists(), "old trees are cleaned up");
    assert!(calls[1].cwd.exists());

    let history: Value = serde_json::from_str(&d.ctl_ok(&["history", "--json"])).unwrap();
    let attempts = history["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2);
    assert_eq!(attempts[0]["revision"], second.as_str(), "newest first");
    assert_eq!(attempts[0]["outcome"], "succeeded");
    assert_eq!(attempts[0]["exit_code"], 0);
    let lines: Vec<&str> = attempts[0]["output"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["line"].as_str().unwrap())
        .collect();
    assert!(
        lines
            .iter()
            .any(|l| l.contains("Activation of lucy (switch) done")),
        "{lines:?}"
    );
    assert!(lines.contains(&"a warning on stderr"));
}

#[test]
fn apply_failure_is_recorded_and_backed_off() {
    let env = Env::new();
    env.stub("exit_code", "1");
    let head = env.repo.head();
    let d = env.start();
    let s = d.wait_status("the first failure", |s| s["apply"]["state"] == "failed");
    assert_eq!(s["apply"]["revision"], head.as_str());
    assert_eq!(s["apply"]["attempts"], 1);
    assert!(
        s["apply"]["error"]
            .as_str()
            .unwrap()
            .contains("exited with code 1")
    );
    // retry_base is 1h: the next try is an hour after the failure, not in a tight loop.
    let wait = ts(&s["apply"]["next_retry_at"]).duration_since(ts(&s["apply"]["finished_at"]));
    assert_eq!(wait.as_secs(), 3600);
    assert_eq!(env.calls().len(), 1);
    let again = d.status();
    assert_eq!(again["apply"]["attempts"], 1, "not retried before its time");

    // `ginxctl sync` asks again at once; the wait doubles.
    d.ctl_ok(&["sync"]);
    let s = d.wait_status("the second failure", |s| s["apply"]["attempts"] == 2);
    let wait = ts(&s["apply"]["next_retry_at"]).duration_since(ts(&s["apply"]["finished_at"]));
    assert_eq!(wait.as_secs(), 7200);
    assert_eq!(env.calls().len(), 2);

    let history: Value = serde_json::from_str(&d.ctl_ok(&["history", "--json"])).unwrap();
    let last = &history["attempts"][0];
    assert_eq!(last["outcome"], "failed");
    assert_eq!(last["exit_code"], 1);

    // A fixed revision is applied at once, whatever the backoff of the broken one.
    env.unstub("exit_code");
    let fixed = env.repo.commit("fix.nix", "{ }\n", "fix");
    d.ctl_ok(&["sync"]);
    let s = d.wait_applied(&fixed);
    assert_eq!(s["apply"]["error"], Value::Null);
}

#[test]
fn timeout_kills_the_whole_process_group() {
    let env = Env::new();
    env.dropin("50-timeout.toml", "[apply]\ntimeout = \"1s\"\n");
    env.stub("hang", "");
    let d = env.start();
    let s = d.wait_status("the timeout", |s| s["apply"]["state"] == "failed");
    assert!(
        s["apply"]["error"].as_str().unwrap().contains("timed out"),
        "{s}"
    );
    let call = &env.calls()[0];
    let grandchildren = call.grandchildren();
    assert_eq!(
        grandchildren.len(),
        3,
        "the stand-in started its grandchildren"
    );
    // One grandchild ignores SIGTERM; SIGKILL after kill_grace ends it too.
    call.wait_gone();
    let history: Value = serde_json::from_str(&d.ctl_ok(&["history", "--json"])).unwrap();
    assert_eq!(history["attempts"][0]["outcome"], "timed-out");
}

/// The daemon runs with glibc's malloc tuned (one arena, no tcache). It starts
/// itself again with `GLIBC_TUNABLES` set, in the same process, and the command it runs gets
/// the environment ginx was given. An operator's own `GLIBC_TUNABLES` is left as it is.
#[test]
fn the_daemon_tunes_malloc_for_itself_and_not_for_the_commands_it_runs() {
    // What the process was executed with (glibc's loader may cut the value at its colons
    // in place while it reads it, hence the two parts).
    let tuned = |pid: i32| -> bool {
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
        let environ = String::from_utf8_lossy(&environ);
        environ.contains("GLIBC_TUNABLES=glibc.malloc.arena_max=1")
            && environ.contains("glibc.malloc.tcache_count=0")
    };
    for operators in [None, Some("glibc.malloc.perturb=0")] {
        let mut env = Env::new();
        if let Some(t) = operators {
            env.daemon_env.push(("GLIBC_TUNABLES".into(), t.into()));
        }
        let head = env.repo.head();
        let d = env.start();
        d.wait_applied(&head);
        // The process the harness started, its argv as it was.
        let cmdline = std::fs::read(format!("/proc/{}/cmdline", d.pid)).unwrap();
        let arg0 = cmdline.split(|b| *b == 0).next().unwrap();
        assert_eq!(arg0, support::ginx_bin().as_os_str().as_encoded_bytes());
        let call = &env.calls()[0];
        assert!(
            !call.env.contains_key("GINX_MALLOC_TUNED"),
            "{:?}",
            call.env
        );
        match operators {
            None => {
                assert!(tuned(d.pid), "not started again with malloc tuned");
                assert!(!call.env.contains_key("GLIBC_TUNABLES"), "{:?}", call.env);
            }
            Some(t) => {
                assert!(!tuned(d.pid), "started again over the operator's tunables");
                assert_eq!(call.env.get("GLIBC_TUNABLES").map(String::as_str), Some(t));
            }
        }
    }
}

#[test]
fn restart_does_not_apply_again() {
    let env = Env::new();
    let head = env.repo.head();
    let d = env.start();
    d.wait_applied(&head);
    assert!(d.stop().success());

    let d = env.start();
    let started = d.status()["apply"]["started_at"].clone();
    // Two syncs: the first one's fetch publishes the revision, the second is answered only
    // after the loop has had every chance to act on it.
    d.ctl_ok(&["sync"]);
    d.ctl_ok(&["sync"]);
    let s = d.wait_applied(&head);
    assert_eq!(s["apply"]["state"], "succeeded");
    assert_eq!(s["apply"]["started_at"], started, "no new attempt");
    let history: Value = serde_json::from_str(&d.ctl_ok(&["history", "--json"])).unwrap();
    assert_eq!(history["attempts"].as_array().unwrap().len(), 1);
    assert_eq!(env.calls().len(), 1, "applied once, across the restart");
}

#[test]
fn a_second_ginx_on_the_same_state_dir_leaves_the_first_alone() {
    let env = Env::new();
    env.stub("hang", "");
    let d = env.start();
    let call = env.wait_hanging_call(0);
    let out = std::process::Command::new(support::ginx_bin())
        .arg("--config")
        .arg(&env.config)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("another ginx is running with state_dir"),
        "{err}"
    );
    assert!(
        process_running(call.pid()),
        "the first ginx's apply is untouched"
    );
    assert_eq!(d.status()["apply"]["state"], "applying");
}

#[test]
fn suspend_survives_a_restart_and_holds_back_applies() {
    let env = Env::new();
    let first = env.repo.head();
    let d = env.start();
    d.wait_applied(&first);
    assert!(d.ctl_ok(&["suspend"]).contains("suspended"));
    assert!(d.ctl_ok(&["suspend"]).contains("already suspended"));
    assert!(d.stop().success());

    let d = env.start();
    assert_eq!(d.status()["suspended"], true);
    let second = env.repo.commit("b.nix", "{ }\n", "second");
    d.ctl_ok(&["sync"]);
    let s = d.wait_status("the new revision waiting", |s| {
        s["apply"]["state"] == "waiting"
    });
    assert_eq!(
        s["sources"]["hephaestus"]["revision"],
        second.as_str(),
        "still fetching"
    );
    assert_eq!(s["apply"]["applied_revision"], first.as_str());
    assert_eq!(env.calls().len(), 1);
    let human = d.ctl_ok(&["status"]);
    assert!(human.contains("suspended  yes"), "{human}");

    assert!(d.ctl_ok(&["resume"]).contains("resumed"));
    d.wait_applied(&second);
    assert_eq!(env.calls().len(), 2);
}

#[test]
fn a_corrupt_state_file_is_moved_aside_and_ginx_starts_fresh() {
    let env = Env::new();
    let head = env.repo.head();
    let d = env.start();
    d.wait_applied(&head);
    assert!(d.stop().success());
    std::fs::write(
        env.state_dir.join("state.json"),
        b"{\"version\": 1, \"applied\": {\"sou",
    )
    .unwrap();

    let d = env.start();
    d.wait_status("a fresh state", |s| s["apply"]["state"] == "succeeded");
    let aside: Vec<PathBuf> = std::fs::read_dir(&env.state_dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().contains("state.json.corrupt-"))
        .collect();
    assert_eq!(aside.len(), 1, "the corrupt file is kept");
    assert!(
        std::fs::read_to_string(&aside[0])
            .unwrap()
            .contains("\"sou")
    );
    assert!(
        d.log().contains("state file unusable; moved aside"),
        "{}",
        d.log()
    );
}

#[test]
fn invalid_config_exits_1_naming_file_line_column() {
    let env = Env::new();
    env.dropin(
        "20-bad.toml",
        "[apply]\ngoal = \"switch\"\ntimeout = \"soon\"\n",
    );
    let out = std::process::Command::new(support::ginx_bin())
        .arg("--config")
        .arg(&env.config)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("config.d/20-bad.toml:3:11: apply.timeout: invalid duration"),
        "{err}"
    );

    let check = support::check_config(&env.config);
    assert_eq!(check.status.code(), Some(1));

    env.dropin("20-bad.toml", "[apply]\ntimeout = \"45m\"\n");
    let check = support::check_config(&env.config);
    assert_eq!(
        check.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
    let shown = String::from_utf8_lossy(&check.stdout);
    assert!(shown.contains("timeout = \"45m\""), "{shown}");
    assert!(shown.contains("retry_base = \"1h\""), "{shown}");
}

/// `ginx check-config` with the drop-ins beside `config`, failing the test if it hangs.
fn check_config_within_patience(config: &std::path::Path) -> std::process::Output {
    support::output_within_patience(
        std::process::Command::new(support::ginx_bin())
            .args(["check-config", "--config"])
            .arg(config),
    )
    .expect("check-config to finish")
}

/// Regression: a FIFO in config.d blocked the daemon's runtime thread on reload (the
/// socket, fetching and applying all stopped) and hung check-config.
#[test]
fn a_fifo_in_config_d_hangs_neither_the_daemon_nor_check_config() {
    let env = Env::new();
    let d = env.start();
    d.wait_applied(&env.repo.head());
    let dir = env.config.parent().unwrap().join("config.d");
    std::fs::create_dir_all(&dir).unwrap();
    nix::unistd::mkfifo(
        &dir.join("50-fifo.toml"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    d.signal(Signal::SIGHUP);
    wait_for("the refused reload in the log", || {
        d.log()
            .contains("50-fifo.toml is a FIFO (named pipe), not a regular file")
            .then_some(())
    });
    assert_eq!(d.status()["node"], "lucy");

    let out = check_config_within_patience(&env.config);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("config.d/50-fifo.toml is a FIFO (named pipe), not a regular file"),
        "{err}"
    );
}

/// Regression: a drop-in symlinked to /dev/zero grew check-config by about 1 GB/s.
#[test]
fn a_dropin_linked_to_dev_zero_is_refused_with_the_size_bound() {
    let env = Env::new();
    let dir = env.config.parent().unwrap().join("config.d");
    std::fs::create_dir_all(&dir).unwrap();
    std::os::unix::fs::symlink("/dev/zero", dir.join("60-zero.toml")).unwrap();
    let out = check_config_within_patience(&env.config);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("60-zero.toml is a character device, not a regular file"),
        "{err}"
    );
    assert!(err.contains("regular files of at most 1 MiB"), "{err}");
}

/// Regression: every key's location was found by scanning the file from its start, so
/// 40,000 `cert_sans` took 17 s (and a reload froze the socket meanwhile).
#[test]
fn forty_thousand_cert_sans_are_read_in_full() {
    let env = Env::new();
    let sans: Vec<String> = (0..40_000)
        .map(|i| format!("\"10.{}.{}.1\"", i / 256, i % 256))
        .collect();
    env.dropin(
        "70-sans.toml",
        &format!("[kubeadm]\ncert_sans = [{}]\n", sans.join(", ")),
    );
    let out = check_config_within_patience(&env.config);
    let shown = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(shown.contains("\"10.0.0.1\""), "the first SAN");
    assert!(shown.contains("\"10.156.63.1\""), "the last SAN");
}

#[test]
fn reload_with_an_invalid_config_keeps_the_old_one() {
    let env = Env::new();
    let d = env.start();
    d.wait_applied(&env.repo.head());

    // Picked up by the file watcher, refused, logged with its location.
    env.dropin("30-goal.toml", "[apply]\ngoal = \"reboot-now\"\n");
    wait_for("the refused reload in the log", || {
        d.log()
            .contains("configuration reload failed")
            .then_some(())
    });
    assert!(
        d.log()
            .contains("30-goal.toml:2:8: apply.goal: unknown variant `reboot-now`"),
        "{}",
        d.log()
    );
    let second = env.repo.commit("c.nix", "{ }\n", "c");
    d.ctl_ok(&["sync"]);
    d.wait_applied(&second);
    assert_eq!(
        env.calls().last().unwrap().argv.last().unwrap(),
        "switch",
        "old config in force"
    );

    // A valid change, announced with SIGHUP, takes effect.
    env.dropin("30-goal.toml", "[apply]\ngoal = \"boot\"\n");
    d.signal(Signal::SIGHUP);
    wait_for("the reload", || {
        d.log().contains("configuration reloaded").then_some(())
    });
    let third = env.repo.commit("d.nix", "{ }\n", "d");
    d.ctl_ok(&["sync"]);
    d.wait_applied(&third);
    assert_eq!(env.calls().last().unwrap().argv.last().unwrap(), "boot");
}

#[test]
fn git_daemon_remote_is_cloned_and_fetched() {
    if !support::require("git") {
        return;
    }
    let env = Env::new();
    let served = env.root.join("served");
    std::fs::create_dir_all(&served).unwrap();
    let bare = served.join("hephaestus.git");
    crate::support::git::git_cmd()
        .args(["clone", "-q", "--bare"])
        .arg(&env.repo.path)
        .arg(&bare)
        .status()
        .unwrap();
    let server = inetd::git_daemon(&served);
    env.dropin(
        "10-url.toml",
        &format!(
            "[sources.hephaestus]\nurl = \"git://127.0.0.1:{}/hephaestus.git\"\n",
            server.port
        ),
    );
    let d = env.start();
    d.wait_applied(&env.repo.head());

    let next = env.repo.commit("e.nix", "{ }\n", "e");
    env.repo
        .git(&["push", "-q", bare.to_str().unwrap(), "main"]);
    d.ctl_ok(&["sync", "hephaestus"]);
    let s = d.wait_applied(&next);
    assert!(
        s["sources"]["hephaestus"]["url"]
            .as_str()
            .unwrap()
            .starts_with("git://127.0.0.1:")
    );
}

#[test]
fn https_remote_is_cloned_and_fetched() {
    if !support::require("git") {
        return;
    }
    let env = Env::new();
    let served = env.root.join("served");
    std::fs::create_dir_all(&served).unwrap();
    let bare = served.join("hephaestus.git");
    crate::support::git::git_cmd()
        .args(["clone", "-q", "--bare"])
        .arg(&env.repo.path)
        .arg(&bare)
        .status()
        .unwrap();
    let server = support::http::GitHttpServer::start(
        &served,
        support::http::Options {
            tls: true,
            ..Default::default()
        },
    );
    env.dropin(
        "10-url.toml",
        &format!(
            "[sources.hephaestus]\nurl = \"{}/hephaestus.git\"\n",
            server.base_url
        ),
    );
    let mut env = env;
    let ca = server.ca.as_ref().unwrap().pem_path.display().to_string();
    env.daemon_env.push(("SSL_CERT_FILE".into(), ca));
    let d = env.start();
    d.wait_applied(&env.repo.head());
    let next = env.repo.commit("f.nix", "{ }\n", "f");
    env.repo
        .git(&["push", "-q", bare.to_str().unwrap(), "main"]);
    d.ctl_ok(&["sync"]);
    d.wait_applied(&next);
    assert!(
        server
            .requests()
            .iter()
            .any(|r| r.uri.contains("git-upload-pack"))
    );
}

#[test]
fn file_url_and_fetch_errors_are_reported_then_recover() {
    let env = Env::new();
    let moved = env.root.join("moved-away");
    env.dropin(
        "10-url.toml",
        &format!(
            "[sources.hephaestus]\nurl = \"file://{}\"\n",
            moved.display()
        ),
    );
    let d = env.start();
    let s = d.wait_status("the fetch error", |s| {
        s["sources"]["hephaestus"]["error"].is_string()
    });
    assert!(s["sources"]["hephaestus"]["failing_since"].is_string());
    assert_eq!(s["apply"]["state"], "idle");
    let out = d.ctl(&["sync"]);
    assert_eq!(out.status.code(), Some(1), "a failed fetch fails the sync");
    assert!(String::from_utf8_lossy(&out.stdout).contains("fetch failed"));

    std::fs::rename(&env.repo.path, &moved).unwrap();
    let moved_repo = GitRepo { path: moved };
    d.ctl_ok(&["sync"]);
    let s = d.wait_applied(&moved_repo.head());
    assert_eq!(s["sources"]["hephaestus"]["error"], Value::Null);
    assert_eq!(s["sources"]["hephaestus"]["failing_since"], Value::Null);
}

#[test]
fn sigterm_during_an_apply_waits_then_stops_it_and_exits_0() {
    let env = Env::new();
    env.dropin("50-grace.toml", "[apply]\nshutdown_grace = \"1s\"\n");
    env.stub("hang", "");
    let mut d = env.start();
    d.wait_status("the apply to run", |s| s["apply"]["state"] == "applying");
    let call = env.wait_hanging_call(0);
    d.signal(Signal::SIGTERM);
    let status = d.wait_exit();
    assert_eq!(status.code(), Some(0), "log:\n{}", d.log());
    assert!(d.notes.iter().any(|n| n == "STOPPING=1"));
    call.wait_gone();
    assert!(!env.socket.exists(), "the socket is removed");
    let history: Value =
        serde_json::from_str(&std::fs::read_to_string(env.state_dir.join("history.json")).unwrap())
            .unwrap();
    assert_eq!(history["attempts"][0]["outcome"], "interrupted");
    drop(d);

    // The interrupted revision is applied on the next start.
    env.unstub("hang");
    let d = env.start();
    d.wait_applied(&env.repo.head());
}

#[test]
fn killed_mid_apply_resolves_the_attempt_on_the_next_start() {
    let env = Env::new();
    env.stub("hang", "");
    let d = env.start();
    let call = env.wait_hanging_call(0);
    d.crash();
    // The runner notices its parent died and stops the whole tree, grandchildren included,
    // without waiting for a new ginx.
    call.wait_gone();
    env.unstub("hang");
    // The next ginx finds the attempt recorded in flight, records it as interrupted, retries.
    let d = env.start();
    d.wait_applied(&env.repo.head());
    let history: Value = serde_json::from_str(&d.ctl_ok(&["history", "--json"])).unwrap();
    let outcomes: Vec<&str> = history["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(outcomes, ["succeeded", "interrupted"]);
}

/// The complete configuration in the manual (docs/src/configuration.md) is a real, valid
/// configuration; so is README's minimal one.
#[test]
fn the_manuals_configuration_example_is_valid() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let minimal = std::fs::read_to_string(root.join("README.md")).unwrap();
    let start = minimal
        .find("```toml")
        .expect("README's minimal configuration")
        + "```toml".len();
    let end = minimal[start..].find("```").unwrap() + start;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("minimal.toml");
    std::fs::write(&path, &minimal[start..end]).unwrap();
    let out = support::check_config(&path);
    assert!(
        out.status.success(),
        "README's minimal configuration: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let readme = std::fs::read_to_string(root.join("docs/src/configuration.md")).unwrap();
    let at = readme
        .find("A complete configuration")
        .expect("the reference section");
    let start = readme[at..].find("```toml").unwrap() + at + "```toml".len();
    let end = readme[start..].find("```").unwrap() + start;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.toml");
    std::fs::write(&path, &readme[start..end]).unwrap();
    let out = support::check_config(&path);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn sigterm_waits_for_a_running_apply_within_the_grace_period() {
    let env = Env::new();
    env.dropin("50-grace.toml", "[apply]\nshutdown_grace = \"5m\"\n");
    let go = env.root.join("go");
    env.stub("wait_for", &go.display().to_string());
    let head = env.repo.head();
    let mut d = env.start();
    d.wait_status("the apply to run", |s| s["apply"]["state"] == "applying");
    wait_for("the stand-in to run", || env.calls().into_iter().next());
    d.signal(Signal::SIGTERM);
    wait_for("ginx to announce it is stopping", || {
        d.poll_notes();
        d.notes.iter().any(|n| n == "STOPPING=1").then_some(())
    });
    // The apply finishes during the grace period and is recorded as the success it is.
    std::fs::write(&go, "").unwrap();
    assert_eq!(d.wait_exit().code(), Some(0));
    let history: Value =
        serde_json::from_str(&std::fs::read_to_string(env.state_dir.join("history.json")).unwrap())
            .unwrap();
    assert_eq!(history["attempts"][0]["outcome"], "succeeded");
    assert_eq!(history["attempts"][0]["revision"], head.as_str());
}

/// The suspension that guards a downgrade (a state file from a newer ginx) is
/// persisted at once, so it holds across every later restart, not just the first.
#[test]
fn the_downgrade_guard_lasts_beyond_one_restart() {
    let env = Env::new();
    std::fs::create_dir_all(&env.state_dir).unwrap();
    std::fs::write(env.state_dir.join("state.json"), b"{\"version\": 99}").unwrap();
    for start in 0..2 {
        let d = env.start();
        let s = d.wait_status("the revision to be wanted", |s| {
            s["sources"]["hephaestus"]["revision"].is_string() && s["apply"]["state"] != "idle"
        });
        assert_eq!(s["suspended"], true, "start {start}: {s:#}");
        assert_eq!(s["apply"]["state"], "waiting", "start {start}: {s:#}");
        assert!(d.stop().success());
    }
    assert!(env.calls().is_empty(), "nothing was applied");
}

/// Makes every write of `<state_dir>/<name>` fail, for root too: a non-empty directory where
/// the file is makes the atomic rename fail. Returns the way back.
fn break_writes(env: &Env, name: &str) -> impl Fn() {
    let path = env.state_dir.join(name);
    let kept = env.state_dir.join(format!("{name}.kept"));
    std::fs::rename(&path, &kept).unwrap();
    std::fs::create_dir_all(path.join("in-the-way")).unwrap();
    move || {
        std::fs::remove_dir_all(&path).unwrap();
        std::fs::rename(&kept, &path).unwrap();
    }
}

/// A command whose effect cannot be persisted fails (exit 1, the reason), instead
/// of saying it worked.
#[test]
fn a_suspend_that_cannot_be_persisted_fails() {
    let env = Env::new();
    let d = env.start();
    d.wait_applied(&env.repo.head());
    let repair = break_writes(&env, "state.json");
    let out = d.ctl(&["suspend"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("state.json") && stderr.contains("not suspended"),
        "{stderr}"
    );
    assert_eq!(
        d.status()["suspended"],
        false,
        "what status says is what is on disk"
    );
    repair();
    assert!(d.ctl_ok(&["suspend"]).contains("suspended"));
    let on_disk: Value =
        serde_json::from_slice(&std::fs::read(env.state_dir.join("state.json")).unwrap()).unwrap();
    assert_eq!(on_disk["suspended"], true);
}

/// An apply whose outcome cannot be persisted shows that in status and health,
/// and nothing more is applied until the state can be written again; then ginx recovers by
/// itself and nothing is lost.
#[test]
fn an_apply_outcome_that_cannot_be_persisted_stops_applies_until_it_can() {
    let env = Env::new();
    let first = env.repo.head();
    let d = env.start();
    d.wait_applied(&first);
    let go = env.root.join("go");
    env.stub("wait_for", &go.display().to_string());
    let second = env.repo.commit("b.nix", "{ }\n", "second");
    d.ctl_ok(&["sync"]);
    d.wait_status("the second apply to run", |s| {
        s["apply"]["state"] == "applying"
    });
    let repair = break_writes(&env, "state.json");
    std::fs::write(&go, "").unwrap();
    let s = d.wait_status("the failed write to show", |s| {
        s["health"]["state"]["status"] == "failed"
    });
    let message = s["health"]["state"]["message"].as_str().unwrap();
    assert!(message.contains("state.json"), "{s:#}");
    let health = d.ctl_ok(&["health"]);
    assert!(health.contains("state"), "{health}");

    // A newer revision waits while the state cannot be written.
    let third = env.repo.commit("c.nix", "{ }\n", "third");
    d.ctl_ok(&["sync"]);
    let s = d.wait_status("the third revision to be held", |s| {
        s["sources"]["hephaestus"]["revision"] == third.as_str() && s["apply"]["state"] == "waiting"
    });
    assert!(
        s["apply"]["reason"]
            .as_str()
            .unwrap()
            .contains("state.json"),
        "{s:#}"
    );
    assert_eq!(
        env.calls().len(),
        2,
        "no apply while the state cannot be written"
    );

    repair();
    let s = d.wait_applied(&third);
    assert!(
        s["health"].get("state").is_none_or(|p| p["status"] == "ok"),
        "{s:#}"
    );
    let history: Value = serde_json::from_str(&d.ctl_ok(&["history", "--json"])).unwrap();
    let revisions: Vec<&str> = history["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["revision"].as_str().unwrap())
        .collect();
    assert_eq!(revisions, [third.as_str(), second.as_str(), first.as_str()]);
    assert!(d.stop().success());
    // After a restart the second revision is not applied again: its outcome was persisted.
    let d = env.start();
    d.wait_applied(&third);
    assert_eq!(env.calls().len(), 3);
}

/// Regression: check-config accepted what rendering the kubeadm documents
/// refuses (overlapping subnets, the VIP inside a subnet or equal to the node's address) and
/// checked neither names nor the socket path length; each is now refused at its position.
#[test]
fn check_config_refuses_what_render_refuses_at_its_position() {
    let env = Env::new();
    for (dropin, expected) in [
        (
            "[kubeadm]\npod_subnet = \"10.96.0.0/16\"\nservice_subnet = \"10.96.0.0/12\"\n",
            "config.d/20-bad.toml:2:14: kubeadm.pod_subnet: pod_subnet 10.96.0.0/16 and \
             service_subnet 10.96.0.0/12 overlap",
        ),
        (
            "[node]\nadvertise_address = \"10.0.0.100\"\n\
             [kubeadm]\ncontrol_plane_endpoint = \"10.0.0.100:6443\"\n",
            "config.d/20-bad.toml:2:21: node.advertise_address: node.advertise_address is \
             10.0.0.100, the control-plane VIP",
        ),
        (
            "[kubeadm]\ncert_sans = [\"ok.example.com\", \"a b\"]\n",
            "config.d/20-bad.toml:2:32: kubeadm.cert_sans[1]: \"a b\" is neither",
        ),
    ] {
        env.dropin("20-bad.toml", dropin);
        let check = support::check_config(&env.config);
        let err = String::from_utf8_lossy(&check.stderr);
        assert_eq!(check.status.code(), Some(1), "{err}");
        assert!(err.contains(expected), "{err}");
    }
}
