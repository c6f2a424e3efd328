//! Git sources an operator can trust: deploy keys over real sshd, tokens over smart HTTP,
//! failover, force-push protection, signed commits, testing branches, damaged clones, stalled
//! remotes.

use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::Value;

use crate::support::daemon::Daemon;
use crate::support::{self, Env, http, inetd, ssh, wait_for};

fn source<'a>(s: &'a Value, name: &str) -> &'a Value {
    &s["sources"][name]
}

/// The error status reports for source `name` (the test fails when there is none).
fn source_error(s: &Value, name: &str) -> String {
    source(s, name)["error"]
        .as_str()
        .unwrap_or_else(|| panic!("no error for source {name}: {s:#}"))
        .to_owned()
}

/// Waits until source `name` reports an error that `pred` accepts; returns the status and it.
fn wait_source_error(
    d: &Daemon,
    name: &str,
    what: &str,
    pred: impl Fn(&str) -> bool,
) -> (Value, String) {
    let s = d.wait_status(what, |s| {
        source(s, name)["error"].as_str().is_some_and(&pred)
    });
    let e = source_error(&s, name);
    (s, e)
}

/// Points the hephaestus source at `url` (plus any extra keys).
fn use_remote(env: &Env, url: &str, extra: &str) {
    env.dropin(
        "10-remote.toml",
        &format!("[sources.hephaestus]\nurl = \"{url}\"\n{extra}"),
    );
}

fn ssh_ready() -> bool {
    support::require(ssh::SSHD) && support::require("ssh-keygen")
}

#[test]
fn ssh_deploy_key_with_known_hosts_fetches() {
    if !ssh_ready() {
        return;
    }
    let env = Env::new();
    let bare = env.bare();
    let sshd = ssh::SshServer::start(&env.root.join("sshd"));
    use_remote(&env, &sshd.url(&bare), &sshd.source_keys(&sshd.known_hosts));
    let d = env.start();
    let s = d.wait_applied(&env.repo.head());
    assert!(
        source(&s, "hephaestus")["url"]
            .as_str()
            .unwrap()
            .starts_with("ssh://root@127.0.0.1:")
    );

    let next = env.repo.commit("ssh.nix", "{ }\n", "over ssh");
    env.push("main", false);
    d.ctl_ok(&["sync"]);
    d.wait_applied(&next);
    assert!(sshd.log().contains("Accepted publickey"), "{}", sshd.log());
}

#[test]
fn ssh_unknown_and_changed_host_keys_are_refused_saying_so() {
    if !ssh_ready() {
        return;
    }
    let env = Env::new();
    let bare = env.bare();
    let sshd = ssh::SshServer::start(&env.root.join("sshd"));
    let empty = env.root.join("empty_known_hosts");
    std::fs::write(&empty, "").unwrap();
    use_remote(&env, &sshd.url(&bare), &sshd.source_keys(&empty));
    let d = env.start();
    let (s, e) = wait_source_error(&d, "hephaestus", "the unknown host key", |_| true);
    assert!(
        e.contains("host key of [127.0.0.1]:") && e.contains("is unknown"),
        "{e}"
    );
    assert!(
        e.contains(&sshd.host_key_line),
        "says which line to add: {e}"
    );
    assert_eq!(s["apply"]["state"], "idle");

    // A different key listed for the host: a changed key.
    let other = ssh::keygen(&env.root.join("other_host_key"), "other");
    let changed = env.root.join("changed_known_hosts");
    std::fs::write(
        &changed,
        format!("[127.0.0.1]:{} {other}\n", sshd.server.port),
    )
    .unwrap();
    use_remote(&env, &sshd.url(&bare), &sshd.source_keys(&changed));
    d.signal(nix::sys::signal::Signal::SIGHUP);
    let (_, e) = wait_source_error(&d, "hephaestus", "the changed host key", |e| {
        e.contains("CHANGED")
    });
    assert!(e.contains("intercepting"), "{e}");
    assert!(
        !sshd.log().contains("Accepted publickey"),
        "no key was offered to an untrusted host"
    );
}

#[test]
fn a_deploy_key_others_can_read_is_refused() {
    if !ssh_ready() {
        return;
    }
    let env = Env::new();
    let bare = env.bare();
    let sshd = ssh::SshServer::start(&env.root.join("sshd"));
    std::fs::set_permissions(&sshd.client_key, std::fs::Permissions::from_mode(0o644)).unwrap();
    use_remote(&env, &sshd.url(&bare), &sshd.source_keys(&sshd.known_hosts));
    let d = env.start();
    let (_, e) = wait_source_error(&d, "hephaestus", "the refusal", |_| true);
    assert!(
        e.contains("ssh_key_file") && e.contains("mode 0644") && e.contains("chmod 600"),
        "{e}"
    );
}

/// A Git smart-HTTP server over TLS serving `env`'s bare repository (with HTTP basic
/// authentication when `basic_auth` is given), and the remote's URL; the daemon trusts the
/// server's CA (`SSL_CERT_FILE`) when `trusted`.
fn https_server(
    env: &mut Env,
    basic_auth: Option<(&str, &str)>,
    trusted: bool,
) -> (http::GitHttpServer, String) {
    let bare = env.bare();
    let server = http::GitHttpServer::start(
        bare.parent().unwrap(),
        http::Options {
            tls: true,
            basic_auth: basic_auth.map(|(u, p)| (u.into(), p.into())),
            ..Default::default()
        },
    );
    if trusted {
        env.daemon_env.push((
            "SSL_CERT_FILE".into(),
            server.ca.as_ref().unwrap().pem_path.display().to_string(),
        ));
    }
    let url = format!("{}/hephaestus.git", server.base_url);
    (server, url)
}

#[test]
fn ssh_without_a_key_or_with_one_the_server_refuses_says_which_setting() {
    if !ssh_ready() {
        return;
    }
    let env = Env::new();
    let bare = env.bare();
    let sshd = ssh::SshServer::start(&env.root.join("sshd"));
    // No key: ssh offers none (no agent, no ~/.ssh), and the message names the setting.
    use_remote(
        &env,
        &sshd.url(&bare),
        &format!("known_hosts_file = \"{}\"\n", sshd.known_hosts.display()),
    );
    let d = env.start();
    let (_, e) = wait_source_error(&d, "hephaestus", "no key", |_| true);
    assert!(e.contains("wants a key; configure ssh_key_file"), "{e}");

    // A key the server does not list.
    let stranger = env.root.join("stranger_key");
    ssh::keygen(&stranger, "not authorised");
    use_remote(
        &env,
        &sshd.url(&bare),
        &format!(
            "ssh_key_file = \"{}\"\nknown_hosts_file = \"{}\"\n",
            stranger.display(),
            sshd.known_hosts.display()
        ),
    );
    d.signal(nix::sys::signal::Signal::SIGHUP);
    let (_, e) = wait_source_error(&d, "hephaestus", "a refused key", |e| {
        e.contains("rejected")
    });
    assert!(
        e.contains("rejected the configured credentials (ssh_key_file)"),
        "{e}"
    );
    assert!(!sshd.log().contains("Accepted publickey"), "{}", sshd.log());

    // The right key: fetched.
    use_remote(&env, &sshd.url(&bare), &sshd.source_keys(&sshd.known_hosts));
    d.signal(nix::sys::signal::Signal::SIGHUP);
    d.wait_applied(&env.repo.head());
}

#[test]
fn https_with_a_token_the_server_refuses_says_the_credentials_were_rejected() {
    let mut env = Env::new();
    let (_server, url) = https_server(&mut env, Some(("deploy", "the-right-one")), true);
    let token_file = env.root.join("token");
    std::fs::write(&token_file, "a-wrong-token-value\n").unwrap();
    std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    use_remote(
        &env,
        &url,
        &format!(
            "token_file = \"{}\"\nusername = \"deploy\"\n",
            token_file.display()
        ),
    );
    let d = env.start();
    let (_, e) = wait_source_error(&d, "hephaestus", "the refused token", |_| true);
    assert!(
        e.contains("rejected the configured credentials (token_file)"),
        "{e}"
    );
    assert!(!e.contains("a-wrong-token-value"), "{e}");
}

#[test]
fn https_to_a_server_whose_certificate_is_not_trusted_is_refused() {
    let mut env = Env::new();
    // No SSL_CERT_FILE: the test CA is not among the system's roots.
    let (server, url) = https_server(&mut env, None, false);
    use_remote(&env, &url, "");
    let d = env.start();
    let (s, e) = wait_source_error(&d, "hephaestus", "the untrusted certificate", |_| true);
    assert!(e.to_lowercase().contains("certificate"), "{e}");
    assert_eq!(s["apply"]["state"], "idle");
    assert!(
        server.requests().is_empty(),
        "no request reached an untrusted server"
    );
}

/// libgit2 is built without its OpenSSL and libssh2 transports (source/transport.rs carries
/// HTTPS over rustls and SSH over OpenSSH's client): nothing loads OpenSSL into ginx, which
/// the idle-memory figure counts on.
#[test]
fn ginx_links_no_openssl() {
    if !support::require("ldd") {
        return;
    }
    let out = std::process::Command::new("ldd")
        .arg(support::ginx_bin())
        .output()
        .unwrap();
    let libs = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{libs}");
    for lib in ["libssl", "libcrypto", "libssh2"] {
        assert!(!libs.contains(lib), "ginx links {lib}:\n{libs}");
    }
}

#[test]
fn https_token_is_used_and_never_shown() {
    let mut env = Env::new();
    let token = "s3cr3t-t0ken-value";
    let (server, url) = https_server(&mut env, Some(("deploy", token)), true);

    // Without the token: refused, and the message says what to configure.
    use_remote(&env, &url, "");
    let d = env.start();
    let (_, e) = wait_source_error(&d, "hephaestus", "the 401", |_| true);
    assert!(e.contains("token_file"), "{e}");

    let token_file = env.root.join("token");
    std::fs::write(&token_file, format!("{token}\n")).unwrap();
    std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    use_remote(
        &env,
        &url,
        &format!(
            "token_file = \"{}\"\nusername = \"deploy\"\n",
            token_file.display()
        ),
    );
    d.signal(nix::sys::signal::Signal::SIGHUP);
    d.wait_applied(&env.repo.head());
    assert!(server.requests().iter().any(|r| r.authorization.is_some()));

    // The token appears nowhere ginx writes: log, status, history, check-config.
    let status = d.ctl_ok(&["status", "--json"]);
    let human = d.ctl_ok(&["status"]);
    let history = d.ctl_ok(&["history", "--json", "--output"]);
    let check = support::check_config(&env.config);
    let check = String::from_utf8_lossy(&check.stdout).into_owned();
    drop(d);
    for (what, text) in [
        (
            "log",
            std::fs::read_to_string(env.root.join("ginx-0.log")).unwrap(),
        ),
        ("status", status),
        ("human status", human),
        ("history", history),
        ("check-config", check),
    ] {
        assert!(!text.contains(token), "the token leaked into {what}");
    }
}

#[test]
fn failover_uses_the_first_remote_that_answers() {
    let env = Env::new();
    let bare = env.bare();
    // Nothing listens on a port we bound and closed... which is racy; use a listener that
    // refuses instead: accept and close at once.
    let refusing = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = refusing.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for c in refusing.incoming() {
            drop(c);
        }
    });
    env.dropin(
        "10-remote.toml",
        &format!(
            "[sources.hephaestus]\nurls = [\"git://127.0.0.1:{port}/hephaestus.git\", \"{}\"]\n",
            bare.display()
        ),
    );
    let d = env.start();
    let s = d.wait_applied(&env.repo.head());
    let src = source(&s, "hephaestus");
    assert_eq!(
        src["url"],
        bare.display().to_string(),
        "served by the second"
    );
    let remotes = src["remotes"].as_array().unwrap();
    assert_eq!(remotes.len(), 2);
    assert_eq!(remotes[0]["ok"], false);
    assert!(remotes[0]["error"].is_string());
    assert_eq!(remotes[1]["ok"], true);
    let human = d.ctl_ok(&["status"]);
    assert!(
        human.contains("remote git://127.0.0.1:") && human.contains("failed"),
        "{human}"
    );
    assert!(human.contains("served"), "{human}");
}

#[test]
fn force_push_is_refused_then_accepted() {
    let env = Env::new();
    let bare = env.bare();
    use_remote(&env, &bare.display().to_string(), "");
    let first = env.repo.head();
    let d = env.start();
    d.wait_applied(&first);
    let second = env.repo.commit("a.nix", "{ }\n", "second");
    env.push("main", false);
    d.ctl_ok(&["sync"]);
    d.wait_applied(&second);

    // Rewrite history: drop `second`, commit something else, force-push.
    env.repo.git(&["reset", "-q", "--hard", &first]);
    let rewritten = env.repo.commit("b.nix", "{ }\n", "rewritten");
    env.push("main", true);
    let out = d.ctl(&["sync"]);
    assert_eq!(out.status.code(), Some(1));
    let s = d.status();
    let src = source(&s, "hephaestus");
    let expected = format!("history rewritten: {rewritten} does not descend from {second}");
    assert!(src["error"].as_str().unwrap().contains(&expected), "{src}");
    assert_eq!(src["refused"]["revision"], rewritten.as_str());
    assert_eq!(
        src["revision"],
        second.as_str(),
        "keeps the current revision"
    );
    assert_eq!(s["apply"]["applied_revision"], second.as_str());
    assert_eq!(env.calls().len(), 2);
    assert!(d.ctl_ok(&["status"]).contains("history rewritten"));

    // Deleting the state files does not lose the protection: the anchor ref in the clone holds.
    assert!(d.stop().success());
    std::fs::remove_file(env.state_dir.join("state.json")).unwrap();
    std::fs::remove_file(env.state_dir.join("anchors.json")).unwrap();
    let d = env.start();
    let s = d.wait_status("the refusal after restart", |s| {
        source(s, "hephaestus")["refused"].is_object()
    });
    assert_eq!(source(&s, "hephaestus")["revision"], second.as_str());

    // The deliberate way on.
    let out = d.ctl_ok(&["accept", "hephaestus", &rewritten[..10]]);
    assert!(out.contains(&format!("accepted {rewritten}")), "{out}");
    let s = d.wait_applied(&rewritten);
    assert_eq!(source(&s, "hephaestus")["error"], Value::Null);
    assert_eq!(source(&s, "hephaestus")["deployed"], rewritten.as_str());
}

#[test]
fn accept_is_for_the_group_only_and_needs_a_known_commit() {
    let env = Env::new();
    let d = env.start();
    d.wait_applied(&env.repo.head());
    let out = d.ctl(&["accept", "hephaestus", "deadbeefdeadbeef"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not in the clone"));
    let out = d.ctl(&["accept", "nosuch", "deadbeef"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no source named"));
}

/// Makes `repo` sign commits with the SSH key at `key`.
fn sign_with(env: &Env, key: &Path) {
    env.repo.git(&["config", "gpg.format", "ssh"]);
    env.repo
        .git(&["config", "user.signingkey", key.to_str().unwrap()]);
}

fn signed_commit(env: &Env, file: &str) -> String {
    std::fs::write(env.repo.path.join(file), "{ }\n").unwrap();
    env.repo.git(&["add", "-A"]);
    env.repo.git(&["commit", "-q", "-S", "-m", file]);
    env.repo.head()
}

#[test]
fn ssh_signed_heads_are_accepted_unsigned_and_wrong_signer_refused() {
    if !support::require("ssh-keygen") {
        return;
    }
    let env = Env::new();
    let alice = env.root.join("alice");
    let alice_pub = ssh::keygen(&alice, "alice");
    let mallory = env.root.join("mallory");
    ssh::keygen(&mallory, "mallory");
    let signers = env.root.join("allowed_signers");
    std::fs::write(
        &signers,
        format!("alice@example.com namespaces=\"git\" {alice_pub}\n"),
    )
    .unwrap();
    sign_with(&env, &alice);
    let good = signed_commit(&env, "good.nix");
    env.dropin(
        "20-sig.toml",
        &format!(
            "[sources.hephaestus]\nallowed_signers_file = \"{}\"\n",
            signers.display()
        ),
    );
    let d = env.start();
    let s = d.wait_applied(&good);
    let sig = &source(&s, "hephaestus")["signature"];
    assert_eq!(sig["format"], "ssh");
    assert_eq!(sig["signer"], "alice@example.com");
    assert!(sig["key"].as_str().unwrap().starts_with("SHA256:"));

    // Unsigned.
    let unsigned = env.repo.commit("unsigned.nix", "{ }\n", "unsigned");
    d.ctl(&["sync"]);
    let s = d.status();
    let src = source(&s, "hephaestus");
    assert_eq!(src["refused"]["revision"], unsigned.as_str());
    assert!(
        src["error"]
            .as_str()
            .unwrap()
            .contains(&format!("commit {unsigned} refused: it is not signed"))
    );
    assert_eq!(s["apply"]["applied_revision"], good.as_str());

    // Signed by a key that is not allowed: the status names the key.
    sign_with(&env, &mallory);
    let wrong = signed_commit(&env, "wrong.nix");
    d.ctl(&["sync"]);
    let s = d.status();
    let e = source_error(&s, "hephaestus");
    assert!(e.contains(&format!("commit {wrong} refused")), "{e}");
    assert!(
        e.contains("not in allowed_signers_file") && e.contains("(key SHA256:"),
        "{e}"
    );
    assert_eq!(env.calls().len(), 1);

    // Signed properly again: accepted.
    sign_with(&env, &alice);
    let fixed = signed_commit(&env, "fixed.nix");
    d.ctl_ok(&["sync"]);
    d.wait_applied(&fixed);
}

#[test]
fn openpgp_signed_heads_are_accepted_and_others_refused() {
    if !support::require("gpg") {
        return;
    }
    let env = Env::new();
    let gnupg = env.root.join("gnupg");
    std::fs::create_dir_all(&gnupg).unwrap();
    std::fs::set_permissions(&gnupg, std::fs::Permissions::from_mode(0o700)).unwrap();
    let gpg = |args: &[&str]| {
        support::succeed(
            std::process::Command::new("gpg")
                .env("GNUPGHOME", &gnupg)
                .args(["--batch", "--pinentry-mode", "loopback", "--passphrase", ""])
                .args(args),
        )
        .stdout
    };
    gpg(&[
        "--quick-generate-key",
        "Alice <alice@example.com>",
        "ed25519",
        "sign",
        "never",
    ]);
    let keyring = env.root.join("keyring.asc");
    std::fs::write(&keyring, gpg(&["--armor", "--export", "alice@example.com"])).unwrap();
    env.repo.git(&["config", "gpg.format", "openpgp"]);
    env.repo
        .git(&["config", "user.signingkey", "alice@example.com"]);
    let commit_signed = |file: &str| {
        std::fs::write(env.repo.path.join(file), "{ }\n").unwrap();
        env.repo.git(&["add", "-A"]);
        support::succeed(
            support::git::git_cmd()
                .arg("-C")
                .arg(&env.repo.path)
                .env("GNUPGHOME", &gnupg)
                .args(["commit", "-q", "-S", "-m", file]),
        );
        env.repo.head()
    };
    let good = commit_signed("pgp.nix");
    env.dropin(
        "20-sig.toml",
        &format!(
            "[sources.hephaestus]\nopenpgp_keyring_file = \"{}\"\n",
            keyring.display()
        ),
    );
    let d = env.start();
    let s = d.wait_applied(&good);
    assert_eq!(source(&s, "hephaestus")["signature"]["format"], "openpgp");
    assert!(
        source(&s, "hephaestus")["signature"]["signer"]
            .as_str()
            .unwrap()
            .contains("alice@example.com")
    );

    // Another key, not in the keyring.
    gpg(&[
        "--quick-generate-key",
        "Mallory <mallory@example.com>",
        "ed25519",
        "sign",
        "never",
    ]);
    env.repo
        .git(&["config", "user.signingkey", "mallory@example.com"]);
    let wrong = commit_signed("mallory.nix");
    d.ctl(&["sync"]);
    let s = d.status();
    let e = source_error(&s, "hephaestus");
    assert!(
        e.contains(&format!("commit {wrong} refused"))
            && e.contains("not by a key in openpgp_keyring_file"),
        "{e}"
    );
    assert_eq!(s["apply"]["applied_revision"], good.as_str());
}

#[test]
fn testing_branch_is_applied_with_goal_test_then_main_wins() {
    let env = Env::new();
    env.dropin(
        "20-testing.toml",
        "[sources.hephaestus]\ntesting_branch = \"testing-{node}\"\n",
    );
    let main1 = env.repo.head();
    let d = env.start();
    d.wait_applied(&main1);

    env.repo.git(&["checkout", "-q", "-b", "testing-lucy"]);
    let testing = env.repo.commit("try.nix", "{ }\n", "try something on lucy");
    env.repo.git(&["checkout", "-q", "main"]);
    d.ctl_ok(&["sync"]);
    let s = d.wait_applied(&testing);
    let src = source(&s, "hephaestus");
    assert_eq!(src["revision_branch"], "testing-lucy");
    assert_eq!(src["testing"], true);
    assert_eq!(s["apply"]["goal"], "test");
    assert_eq!(env.calls().last().unwrap().argv.last().unwrap(), "test");
    assert!(
        d.ctl_ok(&["status"])
            .contains("testing branch testing-lucy")
    );

    // main moves past it: main wins, with the normal goal.
    let main2 = env.repo.commit("main2.nix", "{ }\n", "main moves on");
    d.ctl_ok(&["sync"]);
    let s = d.wait_applied(&main2);
    assert_eq!(source(&s, "hephaestus")["revision_branch"], "main");
    assert_eq!(source(&s, "hephaestus")["testing"], false);
    assert_eq!(env.calls().last().unwrap().argv.last().unwrap(), "switch");
}

#[test]
fn a_hive_in_a_subdirectory_is_applied_there() {
    let env = Env::new();
    let rev = env
        .repo
        .commit("infra/hive/hive.nix", "{ }\n", "hive in a subfolder");
    env.dropin(
        "20-path.toml",
        "[sources.hephaestus]\npath = \"infra/hive\"\n",
    );
    let d = env.start();
    d.wait_applied(&rev);
    let call = env.calls().pop().unwrap();
    assert!(call.cwd.ends_with("infra/hive"), "{}", call.cwd.display());

    env.dropin(
        "20-path.toml",
        "[sources.hephaestus]\npath = \"no/such/dir\"\n",
    );
    d.signal(nix::sys::signal::Signal::SIGHUP);
    wait_for("the reload", || {
        d.log().contains("configuration reloaded").then_some(())
    });
    let next = env.repo.commit("x.nix", "{ }\n", "x");
    d.ctl_ok(&["sync"]);
    let s = d.wait_status("the failure", |s| s["apply"]["state"] == "failed");
    assert!(
        s["apply"]["error"]
            .as_str()
            .unwrap()
            .contains("no/such/dir"),
        "{s}"
    );
    assert_eq!(s["apply"]["revision"], next.as_str());
}

#[test]
fn a_damaged_clone_is_moved_aside_and_cloned_afresh() {
    let env = Env::new();
    let d = env.start();
    d.wait_applied(&env.repo.head());
    let clone = env.state_dir.join("sources/hephaestus");
    // Delete every object file of the clone.
    let objects = clone.join("objects");
    for entry in walk(&objects) {
        if entry.is_file() && !entry.to_string_lossy().contains("/info/") {
            std::fs::remove_file(entry).unwrap();
        }
    }
    let next = env.repo.commit("after.nix", "{ }\n", "after the damage");
    d.ctl_ok(&["sync"]);
    d.wait_applied(&next);
    let aside = std::fs::read_dir(env.state_dir.join("sources"))
        .unwrap()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("hephaestus.broken-")
        })
        .count();
    assert_eq!(aside, 1, "the damaged clone is kept aside");
    assert!(d.log().contains("the clone is damaged"), "{}", d.log());
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk(&p));
            } else {
                out.push(p);
            }
        }
    }
    out
}

#[test]
fn a_remote_that_goes_down_and_comes_back() {
    let env = Env::new();
    let bare = env.bare();
    let up = Arc::new(AtomicBool::new(true));
    let served = bare.parent().unwrap().to_owned();
    let flag = Arc::clone(&up);
    let server = inetd::InetdServer::start(move || {
        if flag.load(Ordering::SeqCst) {
            let mut c = support::git::git_cmd();
            c.args(["daemon", "--inetd", "--export-all"])
                .arg(format!("--base-path={}", served.display()))
                .arg(&served);
            c
        } else {
            std::process::Command::new("true")
        }
    });
    use_remote(
        &env,
        &format!("git://127.0.0.1:{}/hephaestus.git", server.port),
        "",
    );
    let d = env.start();
    d.wait_applied(&env.repo.head());

    up.store(false, Ordering::SeqCst);
    let next = env.repo.commit("down.nix", "{ }\n", "while down");
    env.push("main", false);
    let out = d.ctl(&["sync"]);
    assert_eq!(out.status.code(), Some(1));
    let s = d.status();
    assert!(source(&s, "hephaestus")["failing_since"].is_string());
    assert!(d.ctl_ok(&["status"]).contains("failing since"));

    up.store(true, Ordering::SeqCst);
    d.ctl_ok(&["sync"]);
    let s = d.wait_applied(&next);
    assert_eq!(source(&s, "hephaestus")["failing_since"], Value::Null);
    // One warning for the failure, not one per retry, and one line for the recovery.
    assert_eq!(
        d.log()
            .matches("fetch failed; keeping the previous revision")
            .count(),
        1,
        "{}",
        d.log()
    );
    assert!(d.log().contains("fetching works again"));
}

#[test]
fn a_stalled_remote_times_out_while_another_source_keeps_working() {
    let env = Env::new();
    // Accepts connections and never says a word.
    let stalled = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = stalled.local_addr().unwrap().port();
    let held = Arc::new(std::sync::Mutex::new(Vec::new()));
    let keep = Arc::clone(&held);
    std::thread::spawn(move || {
        for c in stalled.incoming().flatten() {
            keep.lock().unwrap().push(c);
        }
    });
    let argus = support::GitRepo::init(&env.root.join("argus"));
    env.dropin(
        "20-argus.toml",
        &format!(
            "[sources.argus]\nurl = \"git://127.0.0.1:{port}/argus.git\"\nfetch_timeout = \"2s\"\ninterval = \"1h\"\n"
        ),
    );
    let d = env.start();
    d.wait_applied(&env.repo.head());
    let (_, e) = wait_source_error(&d, "argus", "the timeout", |e| e.contains("timed out"));
    assert!(e.contains("fetch_timeout"), "{e}");
    // Hephaestus keeps fetching and applying while argus is stuck.
    let next = env.repo.commit("go.nix", "{ }\n", "go on");
    d.ctl_ok(&["sync", "hephaestus"]);
    d.wait_applied(&next);
    drop(argus);
}

#[test]
fn argus_is_fetched_and_reported_but_not_applied() {
    let env = Env::new();
    let argus = support::GitRepo::init(&env.root.join("argus"));
    let facts = argus.commit(
        "clusters/openstack/kubeadm.toml",
        "cluster_name = \"kaas\"\n",
        "facts",
    );
    env.dropin(
        "20-argus.toml",
        &format!(
            "[sources.argus]\nurl = \"{}\"\ninterval = \"1h\"\n",
            argus.path.display()
        ),
    );
    let d = env.start();
    let s = d.wait_status("argus fetched", |s| {
        source(s, "argus")["revision"] == facts.as_str()
    });
    d.wait_applied(&env.repo.head());
    assert_eq!(env.calls().len(), 1, "only hephaestus is applied");
    assert_eq!(
        source(&s, "argus")["deployed"],
        facts.as_str(),
        "argus records what it offered"
    );
    let tree = source(&s, "argus")["tree"].as_str().unwrap().to_owned();
    assert!(
        Path::new(&tree)
            .join("clusters/openstack/kubeadm.toml")
            .is_file()
    );
}

#[test]
fn concurrent_syncs_share_fetches() {
    let env = Env::new();
    let bare = env.bare();
    let (open, gate) = tokio::sync::watch::channel(true);
    let server = http::GitHttpServer::start(
        bare.parent().unwrap(),
        http::Options {
            gate: Some(gate),
            ..Default::default()
        },
    );
    use_remote(&env, &format!("{}/hephaestus.git", server.base_url), "");
    let d = env.start();
    d.wait_applied(&env.repo.head());
    let fetches = || {
        server
            .requests()
            .iter()
            .filter(|r| r.uri.contains("info/refs"))
            .count()
    };
    let before = fetches();

    // Hold the server: the first sync's fetch hangs; the others queue behind it.
    open.send(false).unwrap();
    let first = std::thread::spawn({
        let socket = env.socket.clone();
        move || crate::support::daemon::ctl_at(&socket, &["sync"])
    });
    wait_for("the held fetch to reach the server", || {
        (fetches() > before).then_some(())
    });
    let rest: Vec<_> = (0..5)
        .map(|_| {
            let socket = env.socket.clone();
            std::thread::spawn(move || crate::support::daemon::ctl_at(&socket, &["sync"]))
        })
        .collect();
    // Give the five requests time to reach ginx (setup, not an assertion on time).
    std::thread::sleep(std::time::Duration::from_secs(2));
    open.send(true).unwrap();
    for t in std::iter::once(first).chain(rest) {
        assert!(t.join().unwrap().status.success());
    }
    // One fetch held, one more shared by the five that waited.
    assert_eq!(fetches() - before, 2, "{:?}", server.requests());
}

/// Regression: URL credentials leaked verbatim into check-config, status,
/// `ginxctl health` and the log — a `scheme:/` typo, a `/` or `@` in an SCP-like password,
/// query tokens, health probe URLs, and a one-letter HTTPS user name that turned git's messages
/// into `failed ***o connec***`.
#[test]
fn url_credentials_reach_no_output_check_config_status_health_or_log() {
    let env = Env::new();
    let text = |o: &std::process::Output| {
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    };
    for password in ["SECRET1", "SE@CRET2", "SEC/RET3+x==", "SECRET4"] {
        support::sweep::secret_in_url("password in a URL", password);
    }
    for token in ["SECRET5", "SECRET6", "SECRET7", "SECRET8"] {
        support::sweep::secret_in_url("token in a URL", token);
    }
    // Ambiguous credentials are refused, and the refusal does not echo them.
    for url in ["https:/user:SECRET1@host/x", "git:SE@CRET2@host:x"] {
        env.dropin(
            "10-leaky.toml",
            &format!("[sources.leaky]\nurl = \"{url}\"\n"),
        );
        let out = support::check_config(&env.config);
        let said = text(&out);
        assert_eq!(out.status.code(), Some(1), "{url}: {said}");
        assert!(
            said.contains("10-leaky.toml:2:7: sources.leaky.url:")
                && !said.contains("SECRET1")
                && !said.contains("CRET2"),
            "{url}: {said}"
        );
    }

    // Accepted URLs whose credentials are shown nowhere. Every remote fails: the listener
    // accepts and closes at once.
    let refusing = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = refusing.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for c in refusing.incoming() {
            drop(c);
        }
    });
    env.dropin(
        "10-leaky.toml",
        &format!(
            "[sources.leaky]\nfetch_timeout = \"10s\"\nurls = [\
             \"deploy:SEC/RET3+x==@127.0.0.1:infra/h.git\", \
             \"https://t:SECRET4@127.0.0.1:{port}/h.git\", \
             \"https://127.0.0.1:{port}/h.git?private_token=SECRET5&access_token=SECRET6\"]\n\
             [health]\nnode_marker = \"{marker}\"\n\
             [health.kubelet]\nurl = \"http://u:SECRET7@127.0.0.1:{port}/healthz?token=SECRET8\"\n",
            // A Kubernetes node (the marker exists): an unreachable kubelet is failed.
            marker = env.config.display()
        ),
    );
    let check = support::check_config(&env.config);
    assert!(check.status.success(), "{}", text(&check));
    let d = env.start();
    let (s, _) = wait_source_error(&d, "leaky", "all remotes failing", |e| {
        e.contains("all 3 remotes failed")
    });
    let remotes = source(&s, "leaky")["remotes"].as_array().unwrap().clone();
    let one_letter = remotes[1]["error"].as_str().unwrap();
    assert!(!one_letter.contains("***"), "mangled: {one_letter}");
    d.wait_status("the kubelet probe failing", |s| {
        s["health"]["kubelet"]["status"] == "failed"
            && s["health"]["kubelet"]["message"]
                .as_str()
                .is_some_and(|m| m.contains(&format!("127.0.0.1:{port}")))
    });
    let outputs = [
        ("check-config", text(&check)),
        ("status --json", d.ctl_ok(&["status", "--json"])),
        ("status", d.ctl_ok(&["status"])),
        ("health", text(&d.ctl(&["health"]))),
        ("health --json", text(&d.ctl(&["health", "--json"]))),
    ];
    let log = d.log();
    drop(d);
    for (what, said) in outputs.iter().chain([&("log", log)]) {
        for secret in [
            "SEC/RET3", "RET3", "SECRET4", "SECRET5", "SECRET6", "SECRET7", "SECRET8",
        ] {
            assert!(
                !said.contains(secret),
                "{secret} leaked into {what}: {said}"
            );
        }
    }
}

/// Regression: a source at a local path that does not exist said
/// "unsupported URL protocol".
#[test]
fn a_missing_local_source_path_says_it_does_not_exist() {
    let env = Env::new();
    let missing = env.root.join("no-such-repo.git");
    use_remote(&env, &missing.display().to_string(), "");
    let d = env.start();
    let (_, e) = wait_source_error(&d, "hephaestus", "the fetch error", |_| true);
    assert!(
        e.contains(&format!("{} does not exist", missing.display()))
            && e.contains("hephaestus")
            && !e.contains("unsupported URL protocol"),
        "{e}"
    );
}

/// Regression: `ginxctl sync` said "fetch failed: history rewritten" when
/// the fetch worked and its head was refused.
#[test]
fn a_refused_revision_is_not_called_a_failed_fetch() {
    let env = Env::new();
    let bare = env.bare();
    use_remote(&env, &bare.display().to_string(), "");
    let first = env.repo.head();
    let d = env.start();
    d.wait_applied(&first);
    let second = env.repo.commit("a.nix", "{ }\n", "second");
    env.push("main", false);
    d.ctl_ok(&["sync"]);
    d.wait_applied(&second);
    env.repo.git(&["reset", "-q", "--hard", &first]);
    let rewritten = env.repo.commit("b.nix", "{ }\n", "rewritten");
    env.push("main", true);
    let out = d.ctl(&["sync"]);
    assert_eq!(out.status.code(), Some(1));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains(&format!(
            "hephaestus: revision refused: history rewritten: {rewritten} does not descend \
             from {second}"
        )) && !said.contains("fetch failed"),
        "{said}"
    );
}

/// Regression: a SIGKILL in the middle of a fetch left `refs/remotes/origin/main.lock` in the
/// clone, and libgit2 then refused every later fetch of the source (found by the crash test).
/// The partial pack and index lock it was writing (libgit2's temporary names) are removed too:
/// nothing else would ever remove them.
#[test]
fn a_ref_lock_left_by_a_killed_fetch_does_not_stop_later_fetches() {
    let env = Env::new();
    let d = env.start();
    d.wait_applied(&env.repo.head());
    d.crash();
    let clone = env.state_dir.join("sources/hephaestus");
    let locks = [
        clone.join("refs/remotes/origin/main.lock"),
        clone.join("packed-refs.lock"),
        clone.join("objects/pack/pack_git2_0f1e2d3c4b5a6978"),
        clone.join("objects/pack/pack_git2_0f1e2d3c4b5a6978.idx.lock"),
        clone.join("objects/pack/pack-0123456789abcdef0123456789abcdef01234567.idx"),
    ];
    for lock in &locks {
        std::fs::write(lock, "").unwrap();
    }
    let next = env
        .repo
        .commit("after-crash.nix", "{ }\n", "after the crash");
    let d = env.start();
    d.ctl_ok(&["sync"]);
    d.wait_applied(&next);
    for lock in &locks {
        assert!(!lock.exists(), "{} removed", lock.display());
    }
    assert!(
        d.log()
            .contains("removed git lock files and partial packs left by an interrupted fetch"),
        "{}",
        d.log()
    );
}

/// Serves the Hephaestus repo over `git daemon` on 127.0.0.1 and points the source at it.
fn serve_over_git_daemon(env: &Env) -> inetd::InetdServer {
    let bare = env.bare();
    let server = inetd::git_daemon(bare.parent().unwrap());
    use_remote(
        env,
        &format!("git://127.0.0.1:{}/hephaestus.git", server.port),
        "",
    );
    server
}

/// Every file and directory under `dir`, with what changes when it is written or replaced.
fn versions(dir: &Path) -> std::collections::BTreeMap<std::path::PathBuf, (i64, i64, u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let mut m = std::collections::BTreeMap::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let md = e.path().symlink_metadata().unwrap();
            if md.is_dir() {
                stack.push(e.path());
            }
            m.insert(e.path(), (md.mtime(), md.mtime_nsec(), md.len(), md.ino()));
        }
    }
    m
}

/// Regression: libgit2's fetch truncated `FETCH_HEAD` in each clone on every fetch (even with
/// `update_fetchhead(false)`), so an idle node rewrote a file under the state dir every poll
/// interval.
#[test]
fn a_fetch_that_finds_nothing_new_rewrites_no_file() {
    let env = Env::new();
    let _server = serve_over_git_daemon(&env);
    let d = env.start();
    d.wait_applied(&env.repo.head());
    d.ctl_ok(&["sync"]);
    let before = versions(&env.state_dir);
    for _ in 0..3 {
        d.ctl_ok(&["sync"]);
    }
    let after = versions(&env.state_dir);
    let changed: Vec<_> = after
        .iter()
        .filter(|(p, v)| before.get(*p) != Some(v))
        .map(|(p, _)| p.display().to_string())
        .chain(
            before
                .keys()
                .filter(|p| !after.contains_key(*p))
                .map(|p| format!("{} (removed)", p.display())),
        )
        .collect();
    assert!(changed.is_empty(), "rewritten: {changed:#?}");
    let fetch_head = env.state_dir.join("sources/hephaestus/FETCH_HEAD");
    assert!(!fetch_head.exists(), "{} written", fetch_head.display());
    // A new commit still arrives.
    let next = env.repo.commit("next.nix", "{ }\n", "next");
    env.push("main", false);
    d.ctl_ok(&["sync"]);
    d.wait_applied(&next);
}

/// The objects of a clone, as git itself lists them.
fn objects(clone: &Path) -> std::collections::BTreeSet<String> {
    let out = support::succeed(support::git::git_cmd().arg("-C").arg(clone).args([
        "cat-file",
        "--batch-all-objects",
        "--batch-check=%(objectname)",
    ]));
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

fn packs(clone: &Path) -> usize {
    std::fs::read_dir(clone.join("objects/pack"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".pack"))
        .count()
}

/// Regression (found by the soak): every fetch that brings something leaves a pack in the
/// clone and libgit2 runs no `git gc`, so a node that fetched for months held thousands of
/// packs, each searched by every object lookup. A fetch that leaves more than 50 (git's
/// `gc.autoPackLimit`) folds them into one, keeping every object; git reads the result.
#[test]
fn a_fetch_folds_the_clones_packs_into_one_past_fifty_keeping_every_object() {
    let env = Env::new();
    let _server = serve_over_git_daemon(&env);
    let clone = env.state_dir.join("sources/hephaestus");
    let d = env.start();
    d.wait_applied(&env.repo.head());
    let mut commits = vec![env.repo.head()];
    // A file big enough that git daemon sends each change as a delta against the previous
    // blob (a thin pack): libgit2 completes it with a copy of that base, so an object is in
    // more than one pack.
    let body: String = (0..400)
        .map(|j| format!("  line{j} = \"{j:08}\";\n"))
        .collect();
    let mut next = |i: usize| {
        let text = format!("{{\n  n = {i};\n{body}}}\n");
        commits.push(env.repo.commit("n.nix", &text, "next"));
        env.push("main", false);
        d.ctl_ok(&["sync"]);
    };
    let mut i = 0;
    while packs(&clone) < 50 {
        i += 1;
        assert!(
            i <= 60,
            "no pack per fetch? {} packs after {i} fetches",
            packs(&clone)
        );
        next(i);
    }
    let before = objects(&clone);
    next(i + 1);
    assert_eq!(packs(&clone), 1, "51 packs were not folded into one");
    let after = objects(&clone);
    let lost: Vec<_> = before.difference(&after).collect();
    assert!(lost.is_empty(), "objects lost by the fold: {lost:?}");
    // git itself finds the folded clone whole.
    support::succeed(
        support::git::git_cmd()
            .arg("-C")
            .arg(&clone)
            .args(["fsck", "--no-dangling"]),
    );
    // Fetches and applies go on from the folded clone.
    next(i + 2);
    assert_eq!(packs(&clone), 2);
    d.wait_applied(commits.last().unwrap());
    assert!(
        d.log().contains("folded the clone's packs into one"),
        "{}",
        d.log()
    );
}
