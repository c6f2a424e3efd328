//! The control socket and systemd integration: protocol errors, permissions, exit codes,
//! sd_notify.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::process::Command;

use serde_json::Value;

use crate::support::{self, Env, daemon::ctl_at};

fn exchange(stream: &mut UnixStream, request: &[u8]) -> Value {
    stream.write_all(request).unwrap();
    let mut line = String::new();
    BufReader::new(&*stream).read_line(&mut line).unwrap();
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"))
}

#[test]
fn malformed_and_oversized_requests_get_errors_and_status_still_answers() {
    let env = Env::new();
    let d = env.start();
    let mut s = UnixStream::connect(&env.socket).unwrap();

    let r = exchange(&mut s, b"this is not json\n");
    assert_eq!(r["ok"], false);
    assert_eq!(r["error"]["kind"], "bad-request");
    // The same connection keeps working.
    let r = exchange(&mut s, b"{\"version\":1,\"command\":\"launch-missiles\"}\n");
    assert_eq!(r["error"]["kind"], "bad-request");
    let r = exchange(&mut s, b"{\"version\":99,\"command\":\"status\"}\n");
    assert_eq!(r["error"]["kind"], "unsupported-version");
    let r = exchange(&mut s, b"{\"version\":1,\"command\":\"status\"}\n");
    assert_eq!(r["ok"], true);
    assert_eq!(r["version"], 1);
    assert_eq!(r["result"]["node"], "lucy");

    // Over 64 KiB: an error, then the connection is closed.
    let mut big = UnixStream::connect(&env.socket).unwrap();
    let mut request = b"{\"version\":1,\"command\":\"status\",\"pad\":\"".to_vec();
    request.extend(std::iter::repeat_n(b'x', 70 * 1024));
    request.extend(b"\"}\n");
    let r = exchange(&mut big, &request);
    assert_eq!(r["error"]["kind"], "too-large");
    let mut rest = Vec::new();
    let _ = std::io::Read::read_to_end(&mut big, &mut rest);
    assert!(rest.is_empty(), "closed after the error");

    // Everyone else is still served.
    assert_eq!(d.status()["node"], "lucy");
}

#[test]
fn a_peer_outside_the_group_can_read_status_but_not_sync() {
    if !support::require("setpriv") {
        return;
    }
    let root = nix::unistd::geteuid().is_root();
    let nogroup = nix::unistd::Group::from_name("nogroup")
        .ok()
        .flatten()
        .is_some();
    if !(root && nogroup) {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI runs as root on Debian, which has the nogroup group"
        );
        eprintln!("SKIPPED: needs root and a nogroup group to run ginxctl as nobody");
        return;
    }
    let env = Env::new();
    let d = env.start();
    d.wait_applied(&env.repo.head());
    let meta = std::fs::metadata(&env.socket).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o660);

    // Let nobody traverse the test's directories up to the socket.
    for dir in env
        .socket
        .ancestors()
        .skip(1)
        .take_while(|p| p.starts_with(&env.root) || *p == env.root)
    {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let as_nobody = |args: &[&str]| {
        Command::new("setpriv")
            .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups"])
            .arg(support::ginxctl_bin())
            .arg("--socket")
            .arg(&env.socket)
            .args(args)
            .output()
            .unwrap()
    };
    // With mode 0660 the kernel refuses nobody outright.
    let out = as_nobody(&["status"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("permission denied")
            && err.contains("even reading ginx's status needs access to its socket")
            && err.contains("control.group"),
        "says what reading needs: {err}"
    );

    // Opened wider, status is for anyone; changes still need root or the group.
    std::fs::set_permissions(&env.socket, std::fs::Permissions::from_mode(0o666)).unwrap();
    let out = as_nobody(&["status", "--json"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for cmd in [
        &["sync"][..],
        &["suspend"],
        &["resume"],
        &["accept", "hephaestus", "abcd"],
        &["retry"],
        &["rollback"],
    ] {
        let out = as_nobody(cmd);
        assert_eq!(out.status.code(), Some(1), "{cmd:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("needs root or membership in group \"root\""),
            "{err}"
        );
    }
    assert_eq!(d.status()["suspended"], false);
    assert_eq!(env.calls().len(), 1);
}

#[test]
fn ginxctl_exits_2_when_ginx_is_not_running() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("ginx.sock");
    let out = ctl_at(&sock, &["status"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("cannot reach ginx at {}", sock.display())),
        "{err}"
    );
    assert!(err.contains("is ginx.service running?"), "{err}");
}

#[test]
fn ginxctl_reports_daemon_errors_with_exit_1() {
    let env = Env::new();
    let d = env.start();
    let out = d.ctl(&["sync", "nosuchsource"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no source named \"nosuchsource\""));
}

#[test]
fn ginxctl_finds_the_socket_through_the_config() {
    let env = Env::new();
    let d = env.start();
    d.wait_applied(&env.repo.head());
    let out = support::succeed(
        Command::new(support::ginxctl_bin())
            .arg("--config")
            .arg(&env.config)
            .arg("status")
            .env_remove("GINX_SOCKET"),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("ginx ") && text.contains(" on lucy (control-plane)"),
        "{text}"
    );
    assert!(text.contains("apply      succeeded"), "{text}");
    assert!(
        text.contains("hephaestus") && text.contains("fetched") && text.contains("ago"),
        "{text}"
    );
}

#[test]
fn ready_status_and_stopping_reach_the_notify_socket() {
    let env = Env::new();
    let head = env.repo.head();
    let mut d = env.start();
    assert_eq!(d.notes.first().map(String::as_str), Some("READY=1"));
    d.wait_applied(&head);
    d.wait_note("STATUS= up to date", |n| {
        n.starts_with("STATUS=up to date: hephaestus")
    });
    assert_eq!(d.stop().code(), Some(0));
}

#[test]
fn stopping_is_announced_before_exit() {
    let env = Env::new();
    let mut d = env.start();
    d.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(d.wait_exit().code(), Some(0));
    assert!(d.notes.iter().any(|n| n == "STOPPING=1"), "{:?}", d.notes);
    assert!(!env.socket.exists());
}

#[test]
fn watchdog_is_fed_when_requested() {
    let env = Env::new();
    let mut d = env.start_with(|c| {
        c.env("WATCHDOG_USEC", "200000");
    });
    d.wait_note("WATCHDOG=1", |n| n == "WATCHDOG=1");
}

#[test]
fn no_watchdog_pings_without_watchdog_usec() {
    let env = Env::new();
    let mut d = env.start();
    d.wait_applied(&env.repo.head());
    d.ctl_ok(&["sync"]);
    d.poll_notes();
    assert!(!d.notes.iter().any(|n| n == "WATCHDOG=1"));
}

/// Regression: sd_notify blocked in `sendmsg` once the notify socket's queue was full, which
/// froze the whole daemon (found by the core-loop benchmark).
#[test]
fn a_notify_socket_nobody_reads_does_not_stall_ginx() {
    let env = Env::new();
    let d = env.start();
    d.wait_applied(&env.repo.head());
    // Each apply changes STATUS= several times; the unread queue holds about ten datagrams.
    for i in 0..8 {
        let rev = env.repo.commit(&format!("n{i}.nix"), "{ }\n", "n");
        d.ctl_ok(&["sync"]);
        d.wait_applied(&rev);
    }
    assert_eq!(d.status()["apply"]["state"], "succeeded");
}

/// Whether ginxctl can be run as `nobody` here (root, setpriv and the nogroup group); in CI
/// it must.
fn can_run_as_nobody() -> bool {
    if !support::require("setpriv") {
        return false;
    }
    let root = nix::unistd::geteuid().is_root();
    let nogroup = nix::unistd::Group::from_name("nogroup")
        .ok()
        .flatten()
        .is_some();
    if !(root && nogroup) {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI runs as root on Debian, which has the nogroup group"
        );
        eprintln!("SKIPPED: needs root and a nogroup group to connect as nobody");
        return false;
    }
    true
}

/// Opens the test's directories and the socket to everyone, as a careless operator might.
fn open_socket_to_everyone(env: &Env) {
    for dir in env
        .socket
        .ancestors()
        .skip(1)
        .take_while(|p| p.starts_with(&env.root) || *p == env.root)
    {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    std::fs::set_permissions(&env.socket, std::fs::Permissions::from_mode(0o666)).unwrap();
}

fn as_nobody() -> Command {
    let mut c = Command::new("setpriv");
    c.args(["--reuid=nobody", "--regid=nogroup", "--clear-groups"]);
    c
}

/// Regression: 64 connections by any user who could open the socket (idle, or one
/// request each and then idle) locked everyone out, root included.
#[test]
fn a_flood_of_connections_by_one_user_does_not_lock_out_root() {
    if !can_run_as_nobody() || !support::require("perl") {
        return;
    }
    let env = Env::new();
    let d = env.start();
    d.wait_applied(&env.repo.head());
    open_socket_to_everyone(&env);
    // 100 connections as nobody, each sends one request and then holds the connection. Past
    // its limit ginx closes the user's new connections, and a write to one of them must not
    // end the script by SIGPIPE before it reports.
    let script = r#"
        use IO::Socket::UNIX;
        $SIG{PIPE} = 'IGNORE';
        my @held;
        for (1..100) {
            my $s = IO::Socket::UNIX->new(Type => SOCK_STREAM(), Peer => $ARGV[0]) or next;
            syswrite($s, "{\"version\":1,\"command\":\"status\"}\n");
            push @held, $s;
        }
        print "held ", scalar(@held), "\n";
        STDOUT->flush();
        sleep 600;
    "#;
    let mut flood = as_nobody()
        .args(["perl", "-e", script])
        .arg(&env.socket)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(flood.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.starts_with("held "), "{line}");

    let out = d.ctl(&["status", "--json"]);
    let more = as_nobody()
        .arg(support::ginxctl_bin())
        .arg("--socket")
        .arg(&env.socket)
        .args(["status"])
        .output()
        .unwrap();
    flood.kill().unwrap();
    flood.wait().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "root is still served: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The flooding user is told why, and ginxctl exits 1.
    assert_eq!(more.status.code(), Some(1));
    let err = String::from_utf8_lossy(&more.stderr);
    assert!(
        err.contains("ginx refused this connection: uid 65534 already holds"),
        "{err}"
    );
}

/// Regression: a client that pipelines requests and never reads the replies blocked its
/// connection's reply write for ever (no write timeout); such a connection is closed.
#[test]
fn a_client_that_pipelines_and_never_reads_is_closed() {
    let env = Env::new();
    let d = env.start();
    d.wait_applied(&env.repo.head());
    let mut s = UnixStream::connect(&env.socket).unwrap();
    s.set_write_timeout(Some(std::time::Duration::from_millis(200)))
        .unwrap();
    let request = b"{\"version\":1,\"command\":\"status\"}\n";
    support::wait_for("ginx to close the connection", || match s.write(request) {
        Ok(_) => None,
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => None,
        Err(e) if e.kind() == std::io::ErrorKind::TimedOut => None,
        Err(_) => Some(()),
    });
    assert_eq!(d.status()["node"], "lucy");
}

/// A fake ginx on a unix socket in a temp dir: `serve` gets each connection after its
/// request line was read.
fn fake_ginx(serve: fn(UnixStream)) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fake.sock");
    let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut line = String::new();
                let _ = BufReader::new(&stream).read_line(&mut line);
                serve(stream);
            });
        }
    });
    (dir, path)
}

fn ctl_within_patience(socket: &std::path::Path, args: &[&str]) -> std::process::Output {
    support::output_within_patience(
        Command::new(support::ginxctl_bin())
            .arg("--socket")
            .arg(socket)
            .args(args)
            .env_remove("GINX_SOCKET"),
    )
    .expect("ginxctl to give up")
}

/// Regression: a reply without a newline grew ginxctl by about 650 MB/s.
#[test]
fn ginxctl_refuses_a_reply_over_its_bound() {
    let (_dir, sock) = fake_ginx(|mut s| {
        let chunk = vec![b'x'; 1 << 20];
        while s.write_all(&chunk).is_ok() {}
    });
    let out = ctl_within_patience(&sock, &["status"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("the reply is longer than 64 MiB"), "{err}");
}

/// Regression: one byte every 0.5 s reset ginxctl's read timeout each time, so
/// `--timeout 5s` took 31 s and more; the timeout covers the whole call.
#[test]
fn ginxctl_timeout_covers_a_server_that_trickles() {
    let (_dir, sock) = fake_ginx(|mut s| {
        while s.write_all(b" ").is_ok() {
            std::thread::sleep(std::time::Duration::from_millis(500));
        }
    });
    let out = ctl_within_patience(&sock, &["--timeout", "3s", "status"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "no answer from ginx at {} within 3s",
            sock.display()
        )),
        "{err}"
    );
}

/// Regression: a daemon that never answers gave exit 1 "Resource temporarily
/// unavailable".
#[test]
fn ginxctl_exits_2_saying_no_answer_when_ginx_is_silent() {
    let (_dir, sock) = fake_ginx(|s| {
        std::thread::sleep(support::PATIENCE);
        drop(s);
    });
    let out = ctl_within_patience(&sock, &["--timeout", "1s", "status"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "no answer from ginx at {} within 1s",
            sock.display()
        )),
        "{err}"
    );
    assert!(!err.contains("Resource temporarily unavailable"), "{err}");
}

/// Regression: with a syntax error in a drop-in, `--config` silently fell back to
/// /run/ginx/ginx.sock.
#[test]
fn ginxctl_names_a_broken_dropin_and_the_socket_it_uses_instead() {
    let env = Env::new();
    env.dropin("80-broken.toml", "[apply\n");
    let out = support::output_within_patience(
        Command::new(support::ginxctl_bin())
            .arg("--config")
            .arg(&env.config)
            .args(["--timeout", "5s", "status"])
            .env_remove("GINX_SOCKET"),
    )
    .expect("ginxctl to finish");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("config.d/80-broken.toml:1:"), "{err}");
    assert!(
        err.contains("using the socket /run/ginx/ginx.sock instead"),
        "{err}"
    );
}

/// Regression: `--socket` at a regular file said "Connection refused … is
/// ginx.service running?".
#[test]
fn ginxctl_says_a_regular_file_is_not_a_socket() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("not-a-socket");
    std::fs::write(&file, "").unwrap();
    let out = ctl_at(&file, &["status"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "{} is not a socket (it is a regular file)",
            file.display()
        )),
        "{err}"
    );
    assert!(!err.contains("is ginx.service running"), "{err}");
}
