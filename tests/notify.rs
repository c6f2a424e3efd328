//! Webhook notifications (`[[notify]]`) against a receiver on 127.0.0.1: the
//! documented body, the bearer token from `token_file`, bounded retries, a receiver that never
//! answers holding up nothing, and no secret (the token, the URL's path) anywhere ginx writes.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

use serde_json::Value;

use crate::support::{Env, wait_for};

/// One request as the receiver read it.
#[derive(Clone, Debug)]
pub(crate) struct Received {
    pub(crate) path: String,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: Value,
}

/// An HTTP/1.1 receiver on 127.0.0.1 that answers each request with the next status of
/// `answers` (the last one repeats), or, with `hang`, reads requests and never answers.
pub(crate) struct Receiver {
    pub(crate) port: u16,
    got: Arc<Mutex<Vec<Received>>>,
    /// Connections held open unanswered (`hang`).
    _held: Arc<Mutex<Vec<TcpStream>>>,
}

impl Receiver {
    pub(crate) fn start(answers: Vec<u16>, hang: bool) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let got = Arc::new(Mutex::new(Vec::new()));
        let held = Arc::new(Mutex::new(Vec::new()));
        let (g, h) = (Arc::clone(&got), Arc::clone(&held));
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                let Some(r) = read_request(&stream) else {
                    continue;
                };
                let n = {
                    let mut g = g.lock().unwrap();
                    g.push(r);
                    g.len()
                };
                if hang {
                    h.lock().unwrap().push(stream);
                    continue;
                }
                let code = answers[(n - 1).min(answers.len() - 1)];
                let mut s = stream;
                let _ = write!(
                    s,
                    "HTTP/1.1 {code} X\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                );
            }
        });
        Self {
            port,
            got,
            _held: held,
        }
    }

    pub(crate) fn got(&self) -> Vec<Received> {
        self.got.lock().unwrap().clone()
    }
}

fn read_request(stream: &TcpStream) -> Option<Received> {
    let mut r = BufReader::new(stream.try_clone().ok()?);
    let mut line = String::new();
    r.read_line(&mut line).ok()?;
    let path = line.split_whitespace().nth(1)?.to_owned();
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        r.read_line(&mut h).ok()?;
        let h = h.trim_end();
        if h.is_empty() {
            break;
        }
        let (k, v) = h.split_once(':')?;
        headers.push((k.trim().to_ascii_lowercase(), v.trim().to_owned()));
    }
    let len: usize = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; len];
    r.read_exact(&mut body).ok()?;
    Some(Received {
        path,
        headers,
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
    })
}

const TOKEN: &str = "tok-5ecret-4242";
const SECRET_PATH: &str = "services/T0/B0/pathsecret77";

/// Notifies the receiver on `port` of `events` (a TOML list), with a token and a secret path.
pub(crate) fn hook(env: &Env, port: u16, events: &str, extra: &str) {
    let token = env.root.join("notify-token");
    std::fs::write(&token, format!("{TOKEN}\n")).unwrap();
    env.dropin(
        "60-notify.toml",
        &format!(
            "[[notify]]\nname = \"ops\"\nurl = \"http://127.0.0.1:{port}/{SECRET_PATH}\"\n\
             token_file = \"{}\"\nevents = {events}\n{extra}\n",
            token.display()
        ),
    );
}

#[test]
fn a_failing_apply_is_posted_with_its_token_after_a_retry_and_no_secret_shows() {
    let recv = Receiver::start(vec![503, 200], false);
    let env = Env::new();
    hook(
        &env,
        recv.port,
        "[\"ApplyFailed\"]",
        "retries = 2\ntimeout = \"5s\"\n\n[metrics]\nlisten = \"127.0.0.1:0\"",
    );
    env.stub("exit_code", "1");
    let d = env.start();
    let head = env.repo.head();
    d.ctl_ok(&["sync"]);
    let got = wait_for("the notification, sent again after a 503", || {
        let g = recv.got();
        (g.len() >= 2).then_some(g)
    });
    // The first answer was a 503: the same body came again.
    assert_eq!(got[0].body, got[1].body);
    let r = &got[1];
    assert_eq!(r.path, format!("/{SECRET_PATH}"));
    let header = |k: &str| {
        r.headers
            .iter()
            .find(|(h, _)| h == k)
            .map(|(_, v)| v.clone())
            .unwrap_or_default()
    };
    assert_eq!(header("authorization"), format!("Bearer {TOKEN}"));
    assert_eq!(header("content-type"), "application/json");
    let b = &r.body;
    assert_eq!(b["version"], 1, "{b:#}");
    assert_eq!(b["node"], "lucy");
    assert_eq!(b["group"], "control-plane");
    assert_eq!(b["reason"], "ApplyFailed");
    assert_eq!(b["type"], "Warning");
    assert_eq!(b["revision"], head.as_str());
    assert!(
        b["message"]
            .as_str()
            .is_some_and(|m| m.contains(&head[..7]) && m.contains("failed")),
        "{b:#}"
    );
    assert!(b["time"].as_str().is_some_and(|t| t.ends_with('Z')));
    assert!(b["ginx_version"].is_string());
    let s = d.status();
    let metrics = crate::kubernetes::scrape(s["metrics_listen"].as_str().unwrap());
    assert!(
        metrics
            .lines()
            .any(|l| l == "ginx_notifications_total{notify=\"ops\",result=\"sent\"} 1"),
        "{metrics}"
    );
    // Nothing ginx writes shows the token or the URL's path.
    let checked = crate::support::check_config(&env.config);
    let shown = [
        d.log(),
        s.to_string(),
        String::from_utf8_lossy(&checked.stdout).into_owned(),
        String::from_utf8_lossy(&checked.stderr).into_owned(),
        d.ctl_ok(&["status"]),
        d.ctl_ok(&["history"]),
    ];
    for text in &shown {
        for secret in [TOKEN, "pathsecret77"] {
            assert!(!text.contains(secret), "{secret} shown in:\n{text}");
        }
    }
    assert!(
        String::from_utf8_lossy(&checked.stdout).contains("http://127.0.0.1"),
        "check-config shows the webhook's host"
    );
}

#[test]
fn a_receiver_that_never_answers_holds_up_no_apply() {
    let recv = Receiver::start(Vec::new(), true);
    let env = Env::new();
    hook(
        &env,
        recv.port,
        "[\"Applying\", \"Applied\"]",
        "retries = 0\ntimeout = \"1m\"",
    );
    let d = env.start();
    let first = env.repo.head();
    d.ctl_ok(&["sync"]);
    d.wait_applied(&first);
    let second = env.repo.commit("hive.nix", "{ second = true; }", "second");
    d.ctl_ok(&["sync"]);
    d.wait_applied(&second);
    // Both revisions applied while the receiver held the first notification unanswered (one
    // request, in its minute-long timeout): the sends wait, the applies did not.
    let got = recv.got();
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].body["reason"], "Applying");
    assert_eq!(got[0].body["revision"], first.as_str());
    let s = d.ctl_ok(&["status"]);
    assert!(s.contains(&second[..7]), "{s}");
}
