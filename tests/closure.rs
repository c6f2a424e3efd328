//! Closure mode with real Nix (Debian's nix-bin): signed test systems in a file binary cache,
//! absent from the store until ginx fetches them (tests/support/nix.rs).

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::support::daemon::Daemon;
use crate::support::nix::{Cache, Systems, closure_env, forget, require_nix};
use crate::support::{self, Env};

fn profile(env: &Env) -> String {
    let p = env.stub_dir.join("nix/profiles/system");
    std::fs::read_link(&p).unwrap().display().to_string()
}

fn last_attempt(d: &Daemon) -> Value {
    let h: Value = serde_json::from_str(&d.ctl_ok(&["history", "--json"])).unwrap();
    h["attempts"][0].clone()
}

/// Commits the pointer and waits for the attempt at that revision to end.
fn point_at(env: &Env, d: &Daemon, path: &str) -> Value {
    let rev = env.repo.commit(
        "hosts/lucy.closure",
        &format!("{path}\n"),
        "point lucy at a system",
    );
    d.ctl_ok(&["sync"]);
    support::wait_for("the attempt at the new revision", || {
        let a = last_attempt(d);
        (a["revision"] == rev.as_str()).then_some(a)
    })
}

#[test]
fn a_commit_of_the_pointer_is_fetched_set_as_the_profile_and_switched_and_a_failed_switch_points_back()
 {
    if !require_nix() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let cache = Cache::new(tmp.path(), "ginx-test-1");
    let systems = Systems::new(tmp.path());
    let a = systems.build("a", true);
    cache.push(&a);
    forget(&a);
    let env = closure_env(&cache, &cache.public, "");
    let d = env.start();
    let att = point_at(&env, &d, &a);
    assert_eq!(att["outcome"], "succeeded", "{att:#}\n{}", d.log());
    // Fetched, made the profile's generation 2, switched.
    assert!(Path::new(&a).join("nixos-version").exists());
    assert_eq!(profile(&env), "system-2-link");
    assert_eq!(
        std::fs::read_link(env.stub_dir.join("nix/profiles/system-2-link")).unwrap(),
        PathBuf::from(&a)
    );
    assert_eq!(systems.log(), format!("{a} switch\n"));
    // History: the path, its size, the time to fetch it, the pointer's origin.
    let c = &att["closure"];
    assert_eq!(c["path"], a.as_str(), "{att:#}");
    assert!(c["closure_size"].as_u64().unwrap() > 0, "{c:#}");
    assert!(c["realise_seconds"].as_f64().is_some(), "{c:#}");
    assert_eq!(c["origin"]["kind"], "file");
    assert_eq!(c["origin"]["file"], "hosts/lucy.closure");
    assert_eq!(c["origin"]["revision"], att["revision"]);
    let st = d.status();
    assert_eq!(st["apply"]["mode"], "closure");
    assert_eq!(st["apply"]["closure"]["path"], a.as_str());
    let text = d.ctl_ok(&["status"]);
    let hash = &a["/nix/store/".len()..][..8];
    assert!(
        text.contains(&format!(
            "closure    /nix/store/{hash}…-nixos-system-lucy-a"
        )),
        "{text}"
    );

    // A system whose switch fails: the attempt fails, the profile is back at generation 2,
    // the failed generation 3 is gone, and system a is the boot default again.
    let b = systems.build("b", true);
    cache.push(&b);
    forget(&b);
    systems.mark("b", "fail");
    let att = point_at(&env, &d, &b);
    assert_eq!(att["outcome"], "failed", "{att:#}");
    let err = att["error"].as_str().unwrap();
    assert!(
        err.contains("bin/switch-to-configuration switch failed (exit 1)")
            && err.contains(
                "the profile points back at generation 2 (generation 3 deleted), and it boots by default again"
            ),
        "{err}"
    );
    assert_eq!(profile(&env), "system-2-link");
    assert!(!env.stub_dir.join("nix/profiles/system-3-link").exists());
    assert!(
        systems.log().ends_with(&format!("{b} switch\n{a} boot\n")),
        "{}",
        systems.log()
    );
    d.stop();
}

#[test]
fn a_switch_that_hangs_past_the_timeout_is_stopped_and_ginx_puts_the_profile_back() {
    if !require_nix() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let cache = Cache::new(tmp.path(), "ginx-test-4");
    let systems = Systems::new(tmp.path());
    let a = systems.build("hangs", true);
    cache.push(&a);
    forget(&a);
    systems.mark("hangs", "hang");
    let env = closure_env(&cache, &cache.public, "realise_timeout = \"5s\"\n");
    env.dropin("60-timeout.toml", "[apply]\ntimeout = \"6s\"\n");
    let d = env.start();
    let att = point_at(&env, &d, &a);
    // The runner stops apply-closure with the switch; the daemon puts the profile back.
    assert_eq!(att["outcome"], "timed-out", "{att:#}");
    let err = att["error"].as_str().unwrap();
    assert!(
        err.contains("timed out") && err.contains("the profile points back at generation 1"),
        "{err}"
    );
    assert_eq!(profile(&env), "system-1-link");
    assert!(!env.stub_dir.join("nix/profiles/system-2-link").exists());
    d.stop();
}

#[test]
fn a_pointer_in_an_unsigned_commit_is_refused_at_the_source() {
    if !require_nix() || !support::require("ssh-keygen") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let cache = Cache::new(tmp.path(), "ginx-test-5");
    let systems = Systems::new(tmp.path());
    let a = systems.build("signed", true);
    let b = systems.build("unsigned", true);
    for p in [&a, &b] {
        cache.push(p);
        forget(p);
    }
    let env = closure_env(&cache, &cache.public, "");
    let key = env.root.join("alice");
    let public = crate::support::ssh::keygen(&key, "alice");
    let signers = env.root.join("allowed_signers");
    std::fs::write(
        &signers,
        format!("alice@example.com namespaces=\"git\" {public}\n"),
    )
    .unwrap();
    env.repo.git(&["config", "gpg.format", "ssh"]);
    env.repo
        .git(&["config", "user.signingkey", key.to_str().unwrap()]);
    std::fs::create_dir_all(env.repo.path.join("hosts")).unwrap();
    std::fs::write(env.repo.path.join("hosts/lucy.closure"), format!("{a}\n")).unwrap();
    env.repo.git(&["add", "-A"]);
    env.repo
        .git(&["commit", "-q", "-S", "-m", "signed pointer"]);
    let signed = env.repo.head();
    env.dropin(
        "20-sig.toml",
        &format!(
            "[sources.hephaestus]\nallowed_signers_file = \"{}\"\n",
            signers.display()
        ),
    );
    let d = env.start();
    d.wait_applied(&signed);
    assert_eq!(profile(&env), "system-2-link");
    // An unsigned commit moving the pointer: refused by the source, never realised.
    let unsigned = env
        .repo
        .commit("hosts/lucy.closure", &format!("{b}\n"), "unsigned pointer");
    d.ctl(&["sync"]);
    let st = d.status();
    let src = &st["sources"]["hephaestus"];
    assert_eq!(src["refused"]["revision"], unsigned.as_str(), "{src:#}");
    assert!(
        src["error"].as_str().unwrap().contains("it is not signed"),
        "{src:#}"
    );
    assert_eq!(last_attempt(&d)["revision"], signed.as_str());
    assert!(
        !Path::new(&b).exists(),
        "the unsigned pointer's path was fetched"
    );
    assert_eq!(profile(&env), "system-2-link");
    d.stop();
}

#[test]
fn a_wrong_key_a_missing_path_a_malformed_pointer_and_no_nixos_system_are_refused_before_the_profile_changes()
 {
    if !require_nix() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let cache = Cache::new(tmp.path(), "ginx-test-2");
    let other = Cache::new(tmp.path(), "ginx-other-1");
    let systems = Systems::new(tmp.path());

    // Signed by the cache's key, but the node trusts another: Nix refuses it.
    let a = systems.build("signed", true);
    cache.push(&a);
    forget(&a);
    let env = closure_env(&cache, &other.public, "");
    let d = env.start();
    let att = point_at(&env, &d, &a);
    assert_eq!(att["outcome"], "failed", "{att:#}");
    let err = att["error"].as_str().unwrap();
    assert!(
        err.contains("the signature check refused it")
            && err.contains("is not signed by any of the keys"),
        "{err}"
    );
    assert!(
        !Path::new(&a).exists(),
        "the unsigned path entered the store"
    );
    assert_eq!(profile(&env), "system-1-link");
    d.stop();

    // With the right key: a path the cache lacks, a malformed one, one that is no NixOS system.
    let env = closure_env(&cache, &cache.public, "");
    let d = env.start();
    let missing = systems.build("missing", true);
    forget(&missing);
    let att = point_at(&env, &d, &missing);
    let err = att["error"].as_str().unwrap_or_default().to_owned();
    assert!(err.contains("no substituter has it"), "{att:#}");

    let att = point_at(&env, &d, "/nix/store/not-a-store-path");
    let err = att["error"].as_str().unwrap_or_default().to_owned();
    assert!(
        err.contains("hosts/lucy.closure") && err.contains("must be 32 characters"),
        "{att:#}"
    );

    let other_host = systems.build("nixos-system-makise-26.05", true);
    cache.push(&other_host);
    forget(&other_host);
    let att = point_at(&env, &d, &other_host);
    let err = att["error"].as_str().unwrap_or_default().to_owned();
    assert!(
        err.contains("is not a system of this node") && err.contains("\"nixos-system-lucy-\""),
        "{att:#}"
    );
    assert!(
        !Path::new(&other_host).exists(),
        "refused before anything ran"
    );

    let plain = systems.build("plain", false);
    cache.push(&plain);
    forget(&plain);
    let att = point_at(&env, &d, &plain);
    let err = att["error"].as_str().unwrap_or_default().to_owned();
    assert!(
        err.contains("is not a NixOS system: it has no nixos-version"),
        "{att:#}"
    );
    assert_eq!(profile(&env), "system-1-link");
    assert_eq!(systems.log(), "", "nothing was switched to");
    d.stop();
}

/// A pin endpoint on 127.0.0.1 answering `path` to requests with `user:token` (basic auth),
/// 401 to others. The Authorization headers it got are kept.
fn pin_server(
    path: String,
    user: &str,
    token: &str,
) -> (String, std::sync::mpsc::Receiver<String>) {
    use base64::Engine;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/pins/lucy", listener.local_addr().unwrap());
    let want = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{token}"))
    );
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut auth = String::new();
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
                if let Some(v) = line
                    .strip_prefix("authorization: ")
                    .or(line.strip_prefix("Authorization: "))
                {
                    auth = v.trim().to_owned();
                }
                line.clear();
            }
            let _ = tx.send(auth.clone());
            let (status, body) = if auth == want {
                ("200 OK", path.clone())
            } else {
                ("401 Unauthorized", String::new())
            };
            let mut s = stream;
            let _ = write!(
                s,
                "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (url, rx)
}

#[test]
fn a_pin_endpoint_with_a_token_points_the_node_and_the_token_stays_secret() {
    if !require_nix() {
        return;
    }
    const TOKEN: &str = "pin-token-Hq72kd";
    support::sweep::secret("pin-endpoint token", TOKEN);
    let tmp = tempfile::tempdir().unwrap();
    let cache = Cache::new(tmp.path(), "ginx-test-3");
    let systems = Systems::new(tmp.path());
    let a = systems.build("pinned", true);
    cache.push(&a);
    forget(&a);
    let (url, requests) = pin_server(format!("{a}\n"), "ginx", TOKEN);
    let token = tmp.path().join("pin.token");
    std::fs::write(&token, format!("{TOKEN}\n")).unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let env = closure_env(
        &cache,
        &cache.public,
        &format!(
            "url = \"{url}\"\ntoken_file = \"{}\"\nusername = \"ginx\"\n",
            token.display()
        ),
    );
    let d = env.start();
    // Any revision of the apply source makes an attempt; the pointer comes from the endpoint.
    let rev = env.repo.commit("README", "closure mode\n", "a revision");
    d.ctl_ok(&["sync"]);
    let att = support::wait_for("the attempt", || {
        let a = last_attempt(&d);
        (a["revision"] == rev.as_str()).then_some(a)
    });
    assert_eq!(att["outcome"], "succeeded", "{att:#}\n{}", d.log());
    assert_eq!(att["closure"]["origin"]["kind"], "url");
    assert_eq!(att["closure"]["origin"]["url"], url.as_str());
    assert_eq!(profile(&env), "system-2-link");
    assert!(
        requests
            .try_iter()
            .next()
            .is_some_and(|h| h.starts_with("Basic "))
    );
    let status = d.ctl_ok(&["status", "--json"]);
    let history = d.ctl_ok(&["history", "--json", "--output"]);
    let log = d.log();
    d.stop();
    for (what, text) in [
        ("status", &status),
        ("history", &history),
        ("the log", &log),
    ] {
        assert!(!text.contains(TOKEN), "the token in {what}");
    }
}
