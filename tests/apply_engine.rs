//! The apply engine: isolation from ginx's own restart, interruptions, failure policy, drift,
//! reboot detection, hooks, rollback, self-update, and crash consistency under SIGKILL.

use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use jiff::Timestamp;
use serde_json::Value;

use crate::support::{Env, process_running, wait_for};

fn history(d: &crate::support::daemon::Daemon) -> Vec<Value> {
    let h: Value = serde_json::from_str(&d.ctl_ok(&["history", "--json"])).unwrap();
    h["attempts"].as_array().unwrap().clone()
}

fn outcomes(d: &crate::support::daemon::Daemon) -> Vec<String> {
    history(d)
        .iter()
        .map(|a| a["outcome"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn an_apply_that_restarts_ginx_completes_and_is_recorded_once() {
    let mut env = Env::new();
    let systemd = env.use_systemd_run();
    // Something secret in ginx's environment (a Nix access token, say).
    crate::support::sweep::secret("secret in ginx's environment", "hunter2-token");
    env.daemon_env
        .push(("NIX_TEST_TOKEN".into(), "hunter2-token".into()));
    let go = env.root.join("go");
    env.stub("wait_for", &go.display().to_string());
    let head = env.repo.head();
    let d = env.start();
    let s = d.wait_status("the apply to start", |s| s["apply"]["state"] == "applying");
    assert_eq!(s["apply"]["isolation"], "systemd-run");
    let call = wait_for("the stand-in to run", || env.calls().into_iter().next());

    // The activation restarts ginx.service: ginx goes, the transient unit stays.
    assert_eq!(d.stop().code(), Some(0));
    assert!(process_running(call.pid()), "the unit outlives ginx");
    let d = env.start();
    wait_for("ginx to follow the running unit", || {
        d.log()
            .contains("still running; following it")
            .then_some(())
    });
    assert_eq!(d.status()["apply"]["state"], "applying");
    std::fs::write(&go, "").unwrap();
    d.wait_applied(&head);

    assert_eq!(env.calls().len(), 1, "colmena ran once");
    assert_eq!(outcomes(&d), ["succeeded"], "recorded once");
    let runs = std::fs::read_to_string(systemd.join("systemd-run.log")).unwrap();
    assert_eq!(runs.lines().count(), 1);
    assert!(
        runs.contains(&format!("--unit=ginx-apply-{}", &head[..12])),
        "{runs}"
    );
    // The unit got ginx's environment explicitly (transient units inherit nothing).
    assert!(runs.contains("--setenv=GINX_REVISION="), "{runs}");
    // ginx's own variables go by name; the unit still gets their values.
    assert!(
        runs.contains("--setenv=NIX_TEST_TOKEN ") && !runs.contains("hunter2"),
        "{runs}"
    );
    assert_eq!(env.calls()[0].env["NIX_TEST_TOKEN"], "hunter2-token");
}

#[test]
fn a_timeout_under_systemd_run_stops_the_whole_tree() {
    let mut env = Env::new();
    env.use_systemd_run();
    env.dropin("50-timeout.toml", "[apply]\ntimeout = \"1s\"\n");
    env.stub("hang", "");
    let d = env.start();
    let s = d.wait_status("the timeout", |s| s["apply"]["state"] == "failed");
    assert!(
        s["apply"]["error"].as_str().unwrap().contains("timed out"),
        "{s}"
    );
    let call = &env.calls()[0];
    assert_eq!(call.grandchildren().len(), 3);
    call.wait_gone();
}

#[test]
fn an_interrupted_process_apply_is_retried_once_then_counts_as_failed() {
    let env = Env::new();
    env.stub("hang", "");
    let head = env.repo.head();
    let d = env.start();
    env.wait_hanging_call(0);
    d.crash();
    // Retried once, at once, on the next start; it hangs again and ginx dies again.
    let d = env.start();
    let second = env.wait_hanging_call(1);
    assert_eq!(second.env["GINX_REVISION"], head);
    d.crash();
    // Interrupted twice in a row: a failure now, with backoff, not a third try.
    let d = env.start();
    let s = d.wait_status("the failure", |s| s["apply"]["state"] == "failed");
    assert!(
        s["apply"]["error"]
            .as_str()
            .unwrap()
            .contains("interrupted 2 times"),
        "{s}"
    );
    assert!(s["apply"]["next_retry_at"].is_string());
    assert_eq!(env.calls().len(), 2);
    assert_eq!(outcomes(&d), ["interrupted", "interrupted"]);
}

#[test]
fn exit_code_2_is_a_hive_error_and_is_not_retried() {
    let env = Env::new();
    env.stub("nodes", "makise\nquinn\n");
    let d = env.start();
    let s = d.wait_status("the failure", |s| s["apply"]["state"] == "failed");
    let e = s["apply"]["error"].as_str().unwrap();
    assert!(
        e.contains("code 2") && e.contains("not in the hive") && e.contains("allowLocalDeployment"),
        "{e}"
    );
    assert_eq!(s["apply"]["given_up"], true);
    assert_eq!(s["apply"]["next_retry_at"], Value::Null);
    // A sync fetches but does not revive a given-up revision...
    d.ctl_ok(&["sync"]);
    assert_eq!(env.calls().len(), 1);
    // ...`ginxctl retry` does.
    env.stub("nodes", "lucy\n");
    assert!(d.ctl_ok(&["retry"]).contains("retrying"));
    d.wait_applied(&env.repo.head());
    assert_eq!(env.calls().len(), 2);
}

#[test]
fn failures_back_off_and_max_attempts_gives_up() {
    let env = Env::new();
    env.dropin("50-attempts.toml", "[apply]\nmax_attempts = 3\n");
    env.stub("exit_code", "1");
    let d = env.start();
    d.wait_status("attempt 1", |s| s["apply"]["attempts"] == 1);
    // `sync` skips the backoff (retry_base is an hour here).
    d.ctl_ok(&["sync"]);
    d.wait_status("attempt 2", |s| s["apply"]["attempts"] == 2);
    d.ctl_ok(&["sync"]);
    let s = d.wait_status("attempt 3", |s| s["apply"]["attempts"] == 3);
    assert_eq!(s["apply"]["given_up"], true);
    assert_eq!(s["apply"]["next_retry_at"], Value::Null);
    assert!(d.ctl_ok(&["status"]).contains("given up"));
    d.ctl_ok(&["sync"]);
    assert_eq!(env.calls().len(), 3, "given up: no fourth attempt");
    let h = history(&d);
    assert_eq!(h.len(), 3);
    assert!(h.iter().all(|a| a["exit_code"] == 1));
}

#[test]
fn drift_is_reported_once_and_reapplied_on_request() {
    let env = Env::new();
    let nix = env.fake_nix();
    let head = env.repo.head();
    let d = env.start();
    d.wait_applied(&head);
    let s = d.status();
    let produced = s["system"]["current_system"].as_str().unwrap().to_owned();
    assert!(produced.ends_with("system-2"), "{produced}");
    assert_eq!(s["system"]["generation"]["number"], 2);
    assert_eq!(s["system"]["drift"], Value::Null);

    // Someone runs nixos-rebuild by hand.
    let manual = nix.join("store/manual");
    std::fs::create_dir_all(&manual).unwrap();
    let current = nix.join("run/current-system");
    std::fs::remove_file(&current).unwrap();
    std::os::unix::fs::symlink(&manual, &current).unwrap();
    d.ctl_ok(&["sync"]);
    let s = d.wait_status("the drift", |s| s["system"]["drift"].is_object());
    assert_eq!(s["system"]["drift"]["expected"], produced.as_str());
    assert!(
        s["system"]["drift"]["current"]
            .as_str()
            .unwrap()
            .ends_with("manual")
    );
    d.ctl_ok(&["sync"]);
    assert_eq!(
        d.log().matches("is not the one ginx produced").count(),
        1,
        "logged once"
    );
    assert_eq!(env.calls().len(), 1, "report only, by default");
    assert!(d.ctl_ok(&["status"]).contains("drift"));

    // With on_drift = "reapply" the revision is applied again, which ends the drift.
    env.dropin("60-drift.toml", "[apply]\non_drift = \"reapply\"\n");
    d.signal(nix::sys::signal::Signal::SIGHUP);
    wait_for("the reload", || {
        d.log().contains("configuration reloaded").then_some(())
    });
    std::fs::remove_file(&current).unwrap();
    std::os::unix::fs::symlink(nix.join("store"), &current).unwrap();
    d.ctl_ok(&["sync"]);
    wait_for("the re-apply", || (env.calls().len() == 2).then_some(()));
    let s = d.wait_status("the drift to end", |s| {
        s["system"]["drift"].is_null() && s["apply"]["state"] == "succeeded"
    });
    assert_eq!(s["system"]["generation"]["number"], 3);
}

#[test]
fn reboot_is_required_for_a_new_kernel_and_for_goal_boot() {
    let env = Env::new();
    env.fake_nix();
    let d = env.start();
    d.wait_applied(&env.repo.head());
    assert_eq!(
        d.status()["system"]["reboot_required"],
        false,
        "same kernel"
    );

    env.stub("kernel", "kernel-2");
    let next = env.repo.commit("k.nix", "{ }\n", "new kernel");
    d.ctl_ok(&["sync"]);
    let s = d.wait_applied(&next);
    assert_eq!(s["system"]["reboot_required"], true);
    let reasons = s["system"]["reboot_reasons"].to_string();
    assert!(
        reasons.contains("kernel changed: kernel-1 → kernel-2"),
        "{reasons}"
    );
    assert!(d.ctl_ok(&["status"]).contains("reboot     required"));

    // goal boot always asks for a reboot, even with the same kernel.
    env.stub("kernel", "kernel-1");
    env.dropin("60-goal.toml", "[apply]\ngoal = \"boot\"\n");
    d.signal(nix::sys::signal::Signal::SIGHUP);
    wait_for("the reload", || {
        d.log().contains("configuration reloaded").then_some(())
    });
    let third = env.repo.commit("b.nix", "{ }\n", "for the next boot");
    d.ctl_ok(&["sync"]);
    let s = d.wait_applied(&third);
    let reasons = s["system"]["reboot_reasons"].to_string();
    assert!(reasons.contains("goal boot"), "{reasons}");
}

fn write_script(path: &Path, body: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn env_file(path: &Path) -> HashMap<String, String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

#[test]
fn hooks_get_the_attempt_in_their_environment_and_never_break_ginx() {
    let env = Env::new();
    let ok_hook = env.root.join("bin/on-success");
    let fail_hook = env.root.join("bin/on-failure");
    write_script(
        &ok_hook,
        &format!(
            "env | grep ^GINX_ > {}/success.env; exit 3",
            env.root.display()
        ),
    );
    write_script(
        &fail_hook,
        &format!("env | grep ^GINX_ > {}/failure.env", env.root.display()),
    );
    env.dropin(
        "50-hooks.toml",
        &format!(
            "[apply]\non_success = [\"{}\"]\non_failure = [\"{}\"]\n",
            ok_hook.display(),
            fail_hook.display()
        ),
    );
    let head = env.repo.head();
    let d = env.start();
    d.wait_applied(&head);
    let e = wait_for("the success hook", || {
        let e = env_file(&env.root.join("success.env"));
        (!e.is_empty()).then_some(e)
    });
    assert_eq!(e["GINX_NODE"], "lucy");
    assert_eq!(e["GINX_SOURCE"], "hephaestus");
    assert_eq!(e["GINX_REVISION"], head);
    assert_eq!(e["GINX_GOAL"], "switch");
    assert_eq!(e["GINX_STATUS"], "succeeded");
    assert_eq!(e.get("GINX_ERROR").map(String::as_str), Some(""));
    wait_for("the hook failure in the log", || {
        d.log().contains("hook failed (ignored)").then_some(())
    });

    env.stub("exit_code", "1");
    let bad = env.repo.commit("bad.nix", "{ }\n", "bad");
    d.ctl_ok(&["sync"]);
    let e = wait_for("the failure hook", || {
        let e = env_file(&env.root.join("failure.env"));
        (!e.is_empty()).then_some(e)
    });
    assert_eq!(e["GINX_REVISION"], bad);
    assert_eq!(e["GINX_STATUS"], "failed");
    assert!(e["GINX_ERROR"].contains("exited with code 1"));
    assert_eq!(d.status()["apply"]["state"], "failed", "ginx goes on");
}

#[test]
fn ginxctl_rollback_runs_the_profile_rollback_then_the_switch() {
    let env = Env::new();
    let nix = env.fake_nix();
    let log = env.root.join("rollback.log");
    // The stand-ins for `nix-env --rollback` and generation 1's switch-to-configuration, doing
    // what the real ones do to the profile and /run/current-system.
    let nix_env = env.root.join("bin/nix-env");
    write_script(
        &nix_env,
        &format!(
            "echo \"nix-env $*\" >> {log}\nln -sfn system-1-link {p}/system.tmp && mv -T {p}/system.tmp {p}/system",
            log = log.display(),
            p = nix.join("profiles").display()
        ),
    );
    write_script(
        &nix.join("store/system-1/bin/switch-to-configuration"),
        &format!(
            "echo \"switch-to-configuration $*\" >> {log}\nln -sfn {s} {r}/cs.tmp && mv -T {r}/cs.tmp {r}/current-system",
            log = log.display(),
            s = nix.join("store/system-1").display(),
            r = nix.join("run").display()
        ),
    );
    env.dropin(
        "46-rollback.toml",
        &format!("[system]\nrollback_command = [\"{}\", \"--profile\", \"{{profile}}\", \"--rollback\"]\n", nix_env.display()),
    );
    let head = env.repo.head();
    let d = env.start();
    d.wait_applied(&head);
    assert_eq!(d.status()["system"]["generation"]["number"], 2);

    let out = d.ctl_ok(&["rollback"]);
    assert!(out.contains("rolling back"), "{out}");
    let s = d.wait_status("the rollback", |s| s["apply"]["state"] == "rolled-back");
    assert_eq!(s["system"]["generation"]["number"], 1);
    let calls = std::fs::read_to_string(&log).unwrap();
    let profile = nix.join("profiles/system");
    assert_eq!(
        calls.lines().collect::<Vec<_>>(),
        [
            format!("nix-env --profile {} --rollback", profile.display()),
            "switch-to-configuration switch".to_owned()
        ]
    );
    let h = history(&d);
    assert_eq!(h[0]["kind"], "rollback");
    assert_eq!(h[0]["outcome"], "succeeded");
    assert_eq!(h[0]["generation_before"]["number"], 2);
    assert_eq!(h[0]["generation_after"]["number"], 1);
    assert!(d.ctl_ok(&["history"]).contains("rollback"));
    // Rolled back: not applied again on a sync...
    d.ctl_ok(&["sync"]);
    assert_eq!(env.calls().len(), 1);
    // ...until `ginxctl retry`.
    d.ctl_ok(&["retry"]);
    d.wait_status("the re-apply", |s| {
        s["apply"]["state"] == "succeeded" && s["system"]["generation"]["number"] == 3
    });
    assert_eq!(env.calls().len(), 2);
}

#[test]
fn a_rollback_is_refused_while_an_apply_runs() {
    let env = Env::new();
    env.fake_nix();
    env.stub("hang", "");
    let d = env.start();
    d.wait_status("the apply", |s| s["apply"]["state"] == "applying");
    let out = d.ctl(&["rollback"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("an attempt is running"));
}

#[test]
fn a_new_ginx_is_restarted_into_after_the_activation_that_brings_it() {
    let env = Env::new();
    let nix = env.fake_nix();
    // Generation 1 has this ginx; the activation brings a different binary (a copy).
    let bin = nix.join("store/system-1/sw/bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink(crate::support::ginx_bin(), bin.join("ginx")).unwrap();
    let v2 = env.root.join("ginx-v2");
    std::fs::copy(crate::support::ginx_bin(), &v2).unwrap();
    env.stub("ginx_binary", &v2.display().to_string());
    let head = env.repo.head();
    let mut d = env.start();
    // The new version starts in the same process and announces itself again.
    wait_for("the re-exec", || {
        d.poll_notes();
        (d.notes.iter().filter(|n| *n == "READY=1").count() == 2).then_some(())
    });
    let exe = std::fs::read_link(format!("/proc/{}/exe", d.pid)).unwrap();
    assert_eq!(exe, v2);
    let s = d.wait_applied(&head);
    assert_eq!(s["apply"]["state"], "succeeded");
    assert_eq!(env.calls().len(), 1, "the new version does not apply again");
    assert_eq!(outcomes(&d), ["succeeded"]);
    assert!(d.log().contains("restarting into it"));
}

/// Kills ginx with SIGKILL at seeded random moments while it fetches and applies, restarts it,
/// and checks after every restart: the state file parses; no process of a `process` attempt
/// outlives ginx by more than the grace period; the interrupted attempt is resolved. At the
/// end: every revision applied, and none applied again after it succeeded.
fn crash_cycles(mut env: Env, cycles: u32, seed: u64, systemd: bool) {
    if systemd {
        env.use_systemd_run();
    }
    env.stub("sleep", "0.15");
    let mut rng = fastrand::Rng::with_seed(seed);
    eprintln!("crash test seed {seed}");
    let mut d = env.start();
    for cycle in 0..cycles {
        env.repo
            .commit(&format!("crash/{cycle}.nix"), "{ }\n", "crash cycle");
        let socket = env.socket.clone();
        let sync = std::thread::spawn(move || crate::support::daemon::ctl_at(&socket, &["sync"]));
        std::thread::sleep(std::time::Duration::from_millis(rng.u64(0..400)));
        d.crash();
        let _ = sync.join();
        let raw =
            std::fs::read(env.state_dir.join("state.json")).unwrap_or_else(|_| b"{}".to_vec());
        let state: Value = serde_json::from_slice(&raw).unwrap_or_else(|e| {
            panic!("cycle {cycle} (seed {seed}): state.json does not parse: {e}")
        });
        if !systemd {
            for call in env.calls() {
                let pid = call.pid();
                wait_for(
                    &format!("cycle {cycle}: colmena {pid} to die with ginx"),
                    || (!process_running(pid)).then_some(()),
                );
            }
        }
        let in_flight = state["in_flight"]["id"].as_u64();
        d = env.start();
        if let Some(id) = in_flight {
            wait_for(
                &format!("cycle {cycle}: attempt {id} to be resolved"),
                || {
                    let h = history(&d);
                    h.iter().any(|a| a["id"] == id).then_some(())
                },
            );
        }
    }
    d.ctl_ok(&["sync"]);
    let head = env.repo.head();
    d.wait_applied(&head);

    // Never applied again after it succeeded.
    let attempts = history(&d);
    let mut succeeded: HashMap<String, Timestamp> = HashMap::new();
    for a in attempts.iter().filter(|a| a["outcome"] == "succeeded") {
        let rev = a["revision"].as_str().unwrap().to_owned();
        let at: Timestamp = a["finished_at"].as_str().unwrap().parse().unwrap();
        assert!(
            succeeded.insert(rev.clone(), at).is_none(),
            "{rev} succeeded twice (seed {seed})"
        );
    }
    for call in env.calls() {
        let rev = &call.env["GINX_REVISION"];
        let started = std::fs::metadata(call.dir.join("argv"))
            .unwrap()
            .modified()
            .unwrap();
        let started = Timestamp::try_from(started).unwrap();
        if let Some(done) = succeeded.get(rev) {
            assert!(
                started <= *done,
                "{rev} was applied again after it succeeded (seed {seed})"
            );
        }
    }
    let state: Value =
        serde_json::from_slice(&std::fs::read(env.state_dir.join("state.json")).unwrap()).unwrap();
    assert_eq!(state["in_flight"], Value::Null);
    let ids: Vec<u64> = attempts.iter().map(|a| a["id"].as_u64().unwrap()).collect();
    let mut unique = ids.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), ids.len(), "attempt ids are unique");
}

fn seed() -> u64 {
    std::env::var("GINX_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..))
}

#[test]
fn crash_consistency_with_process_isolation() {
    crash_cycles(Env::new(), 50, seed(), false);
}

#[test]
fn crash_consistency_with_systemd_run_isolation() {
    crash_cycles(Env::new(), 25, seed(), true);
}

/// A `result.json` left in an attempt's folder (a crash between the runner finishing
/// and ginx recording it) must not be taken for the result of a later attempt, even when a lost
/// `state.json` would have ids start again at 0.
fn leftover_result_case(systemd: bool) {
    let mut env = Env::new();
    if systemd {
        env.use_systemd_run();
    }
    let first = env.repo.head();
    let d = env.start();
    d.wait_applied(&first);
    assert!(d.stop().success());

    // A finished runner's files in the folder of attempt 0, as a crash would leave them.
    let stale = env.state_dir.join("attempts/0");
    std::fs::create_dir_all(&stale).unwrap();
    let out = std::process::Command::new(crate::support::ginx_bin())
        .arg("run-attempt")
        .arg("--dir")
        .arg(&stale)
        .args(["--cwd", "/", "--timeout", "10s", "--kill-grace", "1s", "--"])
        .args(["/bin/echo", "STALE"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(stale.join("result.json").exists());
    std::fs::remove_file(env.state_dir.join("state.json")).unwrap();

    // The next revision's command fails, but only once the test lets it go on.
    let second = env.repo.commit("b.nix", "{ }\n", "second");
    let go = env.root.join("go");
    env.stub("wait_for", &go.display().to_string());
    env.stub("exit_code", "1");
    let d = env.start();
    d.ctl_ok(&["sync"]);
    wait_for("the new revision's command to run", || {
        env.calls()
            .into_iter()
            .find(|c| c.env["GINX_REVISION"] == second)
    });
    let s = d.status();
    assert_eq!(
        s["apply"]["state"], "applying",
        "the command still runs: {s:#}"
    );
    std::fs::write(&go, "").unwrap();
    let s = d.wait_status("the attempt to end", |s| {
        s["apply"]["state"] == "failed" || s["apply"]["state"] == "succeeded"
    });
    assert_eq!(s["apply"]["state"], "failed", "{s:#}");
    assert_eq!(s["apply"]["applied_revision"], Value::Null);

    let attempts = history(&d);
    let ids: Vec<u64> = attempts.iter().map(|a| a["id"].as_u64().unwrap()).collect();
    assert_eq!(ids, [1, 0], "ids never repeat: {attempts:#?}");
    assert_eq!(attempts[0]["revision"], second.as_str());
    assert_eq!(attempts[0]["outcome"], "failed");
    assert!(
        !attempts[0]["output"].to_string().contains("STALE"),
        "{attempts:#?}"
    );
}

#[test]
fn a_leftover_result_is_not_taken_for_a_new_attempt() {
    leftover_result_case(false);
}

#[test]
fn a_leftover_result_is_not_taken_for_a_new_attempt_under_systemd_run() {
    leftover_result_case(true);
}
