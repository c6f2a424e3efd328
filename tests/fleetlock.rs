//! The FleetLock client (`ginx::rollout::lock::fleetlock`) against stand-ins that answer as coreos/airlock
//! and poseidon/fleetlock do: who holds a slot, what a refusal looks like, what goes over the
//! wire.

use std::path::Path;
use std::time::Duration;

use ginx::config::FleetLockConfig;
use ginx::rollout::lock::fleetlock::{FleetLock, FleetLockError};

use crate::support::fleetlock::{Answer, Dialect, FleetLockServer};
use crate::support::{Env, wait_for};

/// Machine ids and the ids systemd derives from them for zincati's app id (systemd 252's
/// `systemd-id128 machine-id -a de35106b6ec24688b63afddaa156679b`).
const LUCY: (&str, &str) = (
    "c988d2509fdf4cdcbed39037c56406fb",
    "501ec20cfa2540778193fbc73db10236",
);
const MAKISE: (&str, &str) = (
    "0123456789abcdef0123456789abcdef",
    "583627a932274834a8ebd99f4ed41c0d",
);
const QUINN: (&str, &str) = (
    "ffffffffffffffffffffffffffffffff",
    "01e17ff8056e4c079b0bac70864eb9b5",
);

/// A client for `url` with the machine id `machine` (written to a file under `dir`).
fn client(dir: &Path, url: &str, machine: (&str, &str), group: &str) -> FleetLock {
    let path = dir.join(format!("machine-id-{}", machine.0));
    std::fs::write(&path, format!("{}\n", machine.0)).unwrap();
    let cfg = FleetLockConfig {
        url: url.parse().unwrap(),
        group: None,
        machine_id: path,
    };
    FleetLock::new(&cfg, group, crate::support::PATIENCE).unwrap()
}

/// Runs `f` on one runtime shared by these tests, which outlives every client (as the
/// daemon's does), so that pooled connections are never left on a runtime that is gone.
fn block<T>(f: impl std::future::Future<Output = T>) -> T {
    static RT: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap()
    })
    .block_on(f)
}

fn refusal(e: FleetLockError) -> (u16, Option<String>, Option<String>) {
    match e {
        FleetLockError::Refused {
            status,
            kind,
            value,
            ..
        } => (status, kind, value),
        e => panic!("expected a refusal, got: {e}"),
    }
}

/// One slot: lucy takes it, makise is refused while lucy holds it (in the server's own words),
/// lucy's second lock is still hers, and once she releases it makise gets it.
fn one_slot_is_held_by_one_node_until_released(server: FleetLockServer) {
    let dir = tempfile::tempdir().unwrap();
    let lucy = client(dir.path(), &server.base_url, LUCY, "workers");
    let makise = client(dir.path(), &server.base_url, MAKISE, "workers");

    block(lucy.pre_reboot()).unwrap();
    assert_eq!(server.holders("workers"), [LUCY.1]);

    let e = block(makise.pre_reboot()).unwrap_err();
    assert!(e.is_refused(), "{e}");
    let text = e.to_string();
    let (status, kind, value) = refusal(e);
    match server.dialect {
        Dialect::Airlock => {
            assert_eq!(
                (status, kind.as_deref()),
                (500, Some("failed_lock")),
                "{text}"
            );
            assert!(value.unwrap().contains("slots currently locked"), "{text}");
        }
        Dialect::Poseidon => {
            assert_eq!(
                (status, kind.as_deref()),
                (423, Some("lock_held")),
                "{text}"
            );
            assert!(value.unwrap().contains(LUCY.1), "{text}");
        }
    }
    assert!(text.contains("/v1/pre-reboot"), "{text}");
    assert_eq!(server.holders("workers"), [LUCY.1]);

    // The protocol's locks are recursive.
    block(lucy.pre_reboot()).unwrap();

    // Releasing a slot one does not hold: airlock says yes, poseidon says who holds it.
    let released = block(makise.steady_state());
    match server.dialect {
        Dialect::Airlock => released.unwrap(),
        Dialect::Poseidon => assert_eq!(refusal(released.unwrap_err()).0, 423),
    }
    assert_eq!(server.holders("workers"), [LUCY.1]);

    block(lucy.steady_state()).unwrap();
    assert!(server.holders("workers").is_empty());
    block(makise.pre_reboot()).unwrap();
    assert_eq!(server.holders("workers"), [MAKISE.1]);

    let seen: Vec<_> = server
        .requests()
        .into_iter()
        .map(|r| (r.path, r.id.unwrap(), r.group.unwrap()))
        .collect();
    let expect =
        |path: &str, who: (&str, &str)| (path.to_owned(), who.1.to_owned(), "workers".to_owned());
    assert_eq!(
        seen,
        [
            expect("/v1/pre-reboot", LUCY),
            expect("/v1/pre-reboot", MAKISE),
            expect("/v1/pre-reboot", LUCY),
            expect("/v1/steady-state", MAKISE),
            expect("/v1/steady-state", LUCY),
            expect("/v1/pre-reboot", MAKISE),
        ]
    );
}

#[test]
fn airlock_slot_is_held_by_one_node_until_released() {
    one_slot_is_held_by_one_node_until_released(FleetLockServer::airlock(&[("workers", 1)]));
}

#[test]
fn poseidon_slot_is_held_by_one_node_until_released() {
    one_slot_is_held_by_one_node_until_released(FleetLockServer::poseidon());
}

#[test]
fn airlock_admits_as_many_nodes_as_the_group_has_slots() {
    let server = FleetLockServer::airlock(&[("workers", 2), ("control-plane", 1)]);
    let dir = tempfile::tempdir().unwrap();
    let url = &server.base_url;
    let lucy = client(dir.path(), url, LUCY, "workers");
    let makise = client(dir.path(), url, MAKISE, "workers");
    let quinn = client(dir.path(), url, QUINN, "workers");
    let quinn_cp = client(dir.path(), url, QUINN, "control-plane");

    block(lucy.pre_reboot()).unwrap();
    block(makise.pre_reboot()).unwrap();
    assert!(block(quinn.pre_reboot()).unwrap_err().is_refused());
    // Groups are counted apart.
    block(quinn_cp.pre_reboot()).unwrap();

    block(makise.steady_state()).unwrap();
    block(quinn.pre_reboot()).unwrap();
    let mut holders = server.holders("workers");
    holders.sort();
    let mut expected = vec![LUCY.1, QUINN.1];
    expected.sort();
    assert_eq!(holders, expected);
    assert_eq!(server.holders("control-plane"), [QUINN.1]);
}

#[test]
fn the_id_sent_is_the_app_specific_id_of_the_machine_id_file() {
    let server = FleetLockServer::airlock(&[("control-plane", 1)]);
    let dir = tempfile::tempdir().unwrap();
    let lucy = client(dir.path(), &server.base_url, LUCY, "control-plane");
    assert_eq!(lucy.id(), LUCY.1);
    assert_eq!(lucy.group(), "control-plane");
    block(lucy.pre_reboot()).unwrap();
    let r = &server.requests()[0];
    assert_eq!(r.method, "POST");
    assert_eq!(r.protocol_header.as_deref(), Some("true"));
    assert_eq!(r.content_type.as_deref(), Some("application/json"));
    assert_eq!(r.id.as_deref(), Some(LUCY.1));
    assert_eq!(r.group.as_deref(), Some("control-plane"));
    assert_eq!(r.authorization, None);
}

#[test]
fn injected_423_and_500_are_refusals_and_a_hang_up_is_unreachable() {
    let server = FleetLockServer::airlock(&[("workers", 1)]);
    let dir = tempfile::tempdir().unwrap();
    let lucy = client(dir.path(), &server.base_url, LUCY, "workers");

    server.answer_next(Answer::Status(423));
    server.answer_next(Answer::Bare(500));
    server.answer_next(Answer::HangUp);

    let (status, kind, _) = refusal(block(lucy.pre_reboot()).unwrap_err());
    assert_eq!((status, kind.as_deref()), (423, Some("stand_in")));

    let e = block(lucy.pre_reboot()).unwrap_err();
    let text = e.to_string();
    assert_eq!(refusal(e), (500, None, None), "{text}");
    assert!(text.contains("HTTP 500"), "{text}");

    let e = block(lucy.pre_reboot()).unwrap_err();
    assert!(
        matches!(e, FleetLockError::Unreachable(_)),
        "a hang-up is no answer: {e}"
    );
    assert!(e.to_string().contains(&server.base_url), "{e}");

    // None of them took the slot; the server's own answer does.
    assert!(server.holders("workers").is_empty());
    block(lucy.pre_reboot()).unwrap();
    assert_eq!(server.holders("workers"), [LUCY.1]);

    // Every request fails until told otherwise, release included.
    server.answer_all(Some(Answer::Status(503)));
    assert_eq!(refusal(block(lucy.steady_state()).unwrap_err()).0, 503);
    assert_eq!(refusal(block(lucy.steady_state()).unwrap_err()).0, 503);
    server.answer_all(None);
    block(lucy.steady_state()).unwrap();
    assert!(server.holders("workers").is_empty());

    let statuses: Vec<_> = server.requests().iter().map(|r| r.status).collect();
    assert_eq!(
        statuses,
        [
            Some(423),
            Some(500),
            None,
            Some(200),
            Some(503),
            Some(503),
            Some(200)
        ]
    );
}

#[test]
fn requests_without_the_protocol_header_get_400() {
    let body = format!(
        r#"{{"client_params":{{"id":"{}","group":"workers"}}}}"#,
        LUCY.1
    );
    for (server, kind) in [
        (
            FleetLockServer::airlock(&[("workers", 1)]),
            "invalid_client_identity",
        ),
        (FleetLockServer::poseidon(), "missing_header"),
    ] {
        for path in ["/v1/pre-reboot", "/v1/steady-state"] {
            let (status, answer) = server.post("POST", path, &[], &body);
            assert_eq!(status, 400, "{:?} {path}: {answer}", server.dialect);
            assert!(
                answer.contains(kind),
                "{:?} {path}: {answer}",
                server.dialect
            );
            let (status, answer) =
                server.post("POST", path, &[("fleet-lock-protocol", "false")], &body);
            assert_eq!(status, 400, "{:?} {path}: {answer}", server.dialect);
        }
        assert!(server.holders("workers").is_empty());
        // With the header, the same request takes the slot.
        let (status, _) = server.post(
            "POST",
            "/v1/pre-reboot",
            &[("fleet-lock-protocol", "true")],
            &body,
        );
        assert_eq!(status, 200, "{:?}", server.dialect);
        assert_eq!(server.holders("workers"), [LUCY.1]);
    }
}

#[test]
fn an_unknown_group_is_refused_in_the_server_s_words() {
    let server = FleetLockServer::airlock(&[("workers", 1)]);
    let dir = tempfile::tempdir().unwrap();
    let lucy = client(dir.path(), &server.base_url, LUCY, "storage");
    let e = block(lucy.pre_reboot()).unwrap_err();
    let text = e.to_string();
    let (status, kind, value) = refusal(e);
    assert_eq!((status, kind.as_deref()), (400, Some("unknown_group")));
    assert!(value.unwrap().contains("storage"));
    assert!(text.contains("rollout.fleetlock.group"), "{text}");
}

#[test]
fn credentials_in_the_url_are_sent_and_never_shown() {
    crate::support::sweep::secret_in_url("FleetLock password and token in its URL", "SECRET");
    let server = FleetLockServer::poseidon();
    let dir = tempfile::tempdir().unwrap();
    let url = format!(
        "http://ginx:SECRET@127.0.0.1:{}/?token=SECRET",
        server.addr.port()
    );
    let lucy = client(dir.path(), &url, LUCY, "workers");
    block(lucy.pre_reboot()).unwrap();
    let r = &server.requests()[0];
    use base64::Engine;
    let basic = base64::engine::general_purpose::STANDARD.encode("ginx:SECRET");
    assert_eq!(r.authorization, Some(format!("Basic {basic}")));
    assert_eq!(r.path, "/v1/pre-reboot");

    server.answer_next(Answer::Status(500));
    let refused = block(lucy.steady_state()).unwrap_err();
    server.answer_next(Answer::HangUp);
    let unreachable = block(lucy.steady_state()).unwrap_err();
    for e in [refused, unreachable] {
        let text = format!("{e} {e:?}");
        assert!(!text.contains("SECRET"), "{text}");
        assert!(text.contains("token=***"), "{text}");
    }
    assert!(!format!("{lucy:?}").contains("SECRET"));
}

#[test]
fn a_server_that_never_answers_is_unreachable_within_the_timeout() {
    // Takes connections (the kernel's backlog) and never reads them.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("machine-id");
    std::fs::write(&path, format!("{}\n", LUCY.0)).unwrap();
    let cfg = FleetLockConfig {
        url: format!("http://127.0.0.1:{}", listener.local_addr().unwrap().port())
            .parse()
            .unwrap(),
        group: None,
        machine_id: path,
    };
    let lucy = FleetLock::new(&cfg, "workers", Duration::from_millis(300)).unwrap();
    let e = block(lucy.pre_reboot()).unwrap_err();
    assert!(!e.is_refused(), "{e}");
    assert!(e.to_string().contains("no answer within"), "{e}");
    drop(listener);
}

/// Through the daemon: a node with `lock = "fleetlock"` and no cluster asks the
/// server before it activates (pre-reboot), gives the slot back only once its health gate has
/// passed (steady-state), and applies nothing while the server answers 423 or 500.
#[test]
fn the_daemon_takes_the_fleetlock_before_activating_and_gives_it_back_after_the_gate() {
    let server = FleetLockServer::poseidon();
    let env = Env::new();
    let machine_id = env.root.join("machine-id");
    std::fs::write(&machine_id, format!("{}\n", LUCY.0)).unwrap();
    let hold = env.root.join("hold");
    env.dropin(
        "80-fleetlock.toml",
        &format!(
            "[node]\nrole = \"worker\"\n\n[rollout]\nlock = \"fleetlock\"\n\n\
             [rollout.fleetlock]\nurl = \"{}\"\nmachine_id = \"{}\"\n\n\
             [rollout.gate]\ncommand = [\"sh\", \"-c\", \"test ! -e {}\"]\n",
            server.base_url,
            machine_id.display(),
            hold.display()
        ),
    );
    // The server refuses first: poseidon's "held by another", then a failing server.
    server.answer_all(Some(Answer::Status(423)));
    let d = env.start();
    let s = d.wait_status("waiting for the FleetLock", |s| {
        s["rollout"]["waiting_for"] == "lock"
    });
    assert_eq!(s["apply"]["state"], "waiting", "{s:#}");
    let reason = s["rollout"]["reason"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
        + s["apply"]["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("HTTP 423"), "{s:#}");
    server.answer_all(Some(Answer::Status(500)));
    let before = server.requests().len();
    wait_for("a request answered 500", || {
        server.requests()[before..]
            .iter()
            .any(|r| r.status == Some(500))
            .then_some(())
    });
    d.ctl_ok(&["sync"]);
    let s = d.wait_status("still waiting", |s| {
        s["rollout"]["waiting_for"] == "lock"
            && s["apply"]["reason"]
                .as_str()
                .is_some_and(|r| r.contains("HTTP 500"))
    });
    assert!(
        env.calls().is_empty(),
        "nothing applied while refused: {s:#}"
    );

    // The server grants: the slot is taken before the activation starts.
    let go = env.root.join("go");
    env.stub("wait_for", &go.display().to_string());
    server.answer_all(None);
    wait_for("the activation to start", || env.calls().first().cloned());
    assert_eq!(server.holders("worker"), [LUCY.1]);
    let seen: Vec<(String, Option<u16>)> = server
        .requests()
        .into_iter()
        .map(|r| (r.path, r.status))
        .collect();
    assert_eq!(
        seen.last(),
        Some(&("/v1/pre-reboot".to_owned(), Some(200))),
        "{seen:?}"
    );
    assert!(
        !seen.iter().any(|(p, _)| p == "/v1/steady-state"),
        "{seen:?}"
    );

    // The operator's check fails after the activation (it passed before): the gate holds,
    // and so does the slot.
    std::fs::write(&hold, "").unwrap();
    std::fs::write(&go, "").unwrap();
    d.wait_status("the gate to hold on the command", |s| {
        s["apply"]["state"] == "verifying" && s["rollout"]["gate"]["failing"]["command"].is_string()
    });
    assert_eq!(server.holders("worker"), [LUCY.1]);
    assert!(
        !server
            .requests()
            .iter()
            .any(|r| r.path == "/v1/steady-state"),
        "no steady-state before the gate passes"
    );

    // The check recovers: the gate passes, then steady-state gives the slot back.
    std::fs::remove_file(&hold).unwrap();
    let s = d.wait_applied(&env.repo.head());
    wait_for("the slot given back", || {
        server.holders("worker").is_empty().then_some(())
    });
    let last = server.requests().into_iter().last().unwrap();
    assert_eq!(
        (
            last.path.as_str(),
            last.status,
            last.id.as_deref(),
            last.group.as_deref()
        ),
        ("/v1/steady-state", Some(200), Some(LUCY.1), Some("worker")),
        "{s:#}"
    );
    assert_eq!(s["rollout"]["lock"], "fleetlock", "{s:#}");
    // Logged once the server's answer is in: the server may count it released a moment before.
    let log = wait_for("the release logged", || {
        let log = d.log();
        log.contains("rollout lock released").then_some(log)
    });
    assert!(log.contains("FleetLock held"), "{log}");
}
