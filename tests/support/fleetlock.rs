//! A FleetLock server on 127.0.0.1 that answers as the real ones do, so that the client is
//! tested against the protocol (coreos/zincati `docs/development/fleetlock/protocol.md`) and
//! not against our reading of it.
//!
//! Two dialects, each following its server's source:
//! - [`Dialect::Airlock`] — coreos/airlock (`internal/server/{http_params,pre_reboot,
//!   steady_state}.go`, `internal/lock/semaphore.go`, `internal/herrors/herrors.go`): a
//!   counting semaphore per configured group, held by id, recursive. Any method is served. A
//!   missing or wrong `fleet-lock-protocol` header, a body that is not
//!   `{"client_params":{"id":…,"group":…}}` or an empty id or group: 400
//!   `invalid_client_identity`. A group not configured: 400 `unknown_group`. All slots taken:
//!   **500** `failed_lock` ("all N semaphore slots currently locked"). Steady-state from an id
//!   that holds nothing: 200. Errors go out through Go's `http.Error`: `text/plain`, the JSON
//!   body and a newline; 200 has an empty body.
//! - [`Dialect::Poseidon`] — poseidon/fleetlock (`internal/{server,handlers,encode,decode}.go`):
//!   one slot per group (a Lease `fleetlock-<group>`), any group. Not POST: 405
//!   `method_not_allowed`. Header missing: 400 `missing_header`. Bad body or empty id/group:
//!   400 `decode_error`. Held by another id: **423** `lock_held` ("… held by <id>"), for
//!   steady-state too. Errors are `application/json`; 200 carries a short text.
//!
//! Both: the endpoints are exactly `/v1/pre-reboot` and `/v1/steady-state` (anything else is
//! Go's `404 page not found`), 200 means done, and the error body is `{"kind","value"}`.
//!
//! What it does not imitate: airlock's etcd (and its 500s when etcd is away), poseidon's drain
//! and uncordon of the node named by the id, metrics endpoints, TLS.
//!
//! Every request is recorded, in the order the server decided them. [`FleetLockServer::answer_next`]
//! and [`FleetLockServer::answer_all`] make it answer a fixed status (or hang up) before
//! looking at the request, as a failing proxy or server in front would; such requests change
//! no lock.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use serde_json::{Value, json};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    Airlock,
    Poseidon,
}

/// A fixed answer, given instead of the protocol's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// This status with a protocol error body (`kind` `stand_in`).
    Status(u16),
    /// This status with an empty body.
    Bare(u16),
    /// The connection closed without an answer.
    HangUp,
}

/// One request as the server saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    /// The `fleet-lock-protocol` header's value.
    pub protocol_header: Option<String>,
    pub content_type: Option<String>,
    pub authorization: Option<String>,
    /// `client_params.id` and `.group`, when the body had them as strings.
    pub id: Option<String>,
    pub group: Option<String>,
    /// What it answered; `None` when it hung up.
    pub status: Option<u16>,
}

pub struct FleetLockServer {
    pub addr: SocketAddr,
    /// `http://127.0.0.1:PORT`
    pub base_url: String,
    pub dialect: Dialect,
    state: Arc<Mutex<State>>,
    runtime: Option<tokio::runtime::Runtime>,
}

struct State {
    dialect: Dialect,
    /// Airlock: the configured groups and their slots. Poseidon: unused (any group, 1 slot).
    slots: BTreeMap<String, u64>,
    /// The ids holding a slot, per group.
    holders: BTreeMap<String, BTreeSet<String>>,
    requests: Vec<Recorded>,
    next: VecDeque<Answer>,
    always: Option<Answer>,
    /// Every request line and body, for the secrets sweep (not the headers: credentials are
    /// meant to reach this server).
    sent: super::sweep::Sink,
}

/// What the handler does with one request.
enum Reply {
    Send(Response<Full<Bytes>>),
    HangUp,
}

impl FleetLockServer {
    /// Airlock with these groups and their slot counts.
    pub fn airlock(groups: &[(&str, u64)]) -> Self {
        Self::start(
            Dialect::Airlock,
            groups.iter().map(|(g, n)| ((*g).to_owned(), *n)).collect(),
        )
    }

    /// poseidon/fleetlock: one slot in every group.
    pub fn poseidon() -> Self {
        Self::start(Dialect::Poseidon, BTreeMap::new())
    }

    fn start(dialect: Dialect, slots: BTreeMap<String, u64>) -> Self {
        let (runtime, listener) = super::loopback_server(1);
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(State {
            dialect,
            slots,
            holders: BTreeMap::new(),
            requests: Vec::new(),
            next: VecDeque::new(),
            always: None,
            sent: super::sweep::Sink::new("fleetlock-requests", "the stand-in FleetLock server"),
        }));
        let shared = Arc::clone(&state);
        runtime.spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let state = Arc::clone(&shared);
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| {
                        let state = Arc::clone(&state);
                        async move {
                            match handle(&state, req).await {
                                Reply::Send(r) => Ok(r),
                                // A service error makes hyper close the connection unanswered.
                                Reply::HangUp => Err("hang up"),
                            }
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(tcp), svc)
                        .await;
                });
            }
        });
        Self {
            addr,
            base_url: format!("http://127.0.0.1:{}", addr.port()),
            dialect,
            state,
            runtime: Some(runtime),
        }
    }

    /// Every request so far, in the order they were decided.
    pub fn requests(&self) -> Vec<Recorded> {
        self.state.lock().unwrap().requests.clone()
    }

    /// The ids holding a slot of `group`.
    pub fn holders(&self, group: &str) -> Vec<String> {
        let state = self.state.lock().unwrap();
        state
            .holders
            .get(group)
            .map(|h| h.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// The next request gets `answer` (queued after any earlier such answers).
    pub fn answer_next(&self, answer: Answer) {
        self.state.lock().unwrap().next.push_back(answer);
    }

    /// Every request gets `answer` from now on (after the queued ones); `None` goes back to
    /// the protocol.
    pub fn answer_all(&self, answer: Option<Answer>) {
        self.state.lock().unwrap().always = answer;
    }

    /// Sends one request by hand (for what the client never sends), returns the status and
    /// the body.
    pub fn post(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> (u16, String) {
        let mut tcp = std::net::TcpStream::connect(self.addr).unwrap();
        tcp.set_read_timeout(Some(super::PATIENCE)).unwrap();
        let mut req = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nContent-Length: {}\r\n",
            self.addr,
            body.len()
        );
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str("\r\n");
        req.push_str(body);
        tcp.write_all(req.as_bytes()).unwrap();
        let mut answer = String::new();
        tcp.read_to_string(&mut answer).unwrap();
        let status = answer
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("not an HTTP answer: {answer:?}"));
        let body = answer
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default();
        (status, body)
    }
}

impl Drop for FleetLockServer {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

async fn handle(state: &Mutex<State>, req: Request<Incoming>) -> Reply {
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    let mut seen = Recorded {
        method: req.method().to_string(),
        path: req.uri().path().to_owned(),
        protocol_header: header("fleet-lock-protocol"),
        content_type: header("content-type"),
        authorization: header("authorization"),
        id: None,
        group: None,
        status: None,
    };
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => return Reply::HangUp,
    };
    {
        let s = state.lock().unwrap_or_else(|e| e.into_inner());
        s.sent
            .write(format!("{} {}", seen.method, seen.path).as_bytes());
        s.sent.write(&body);
    }
    let params = serde_json::from_slice::<Value>(&body).ok();
    let param = |key: &str| {
        params.as_ref()?["client_params"][key]
            .as_str()
            .map(str::to_owned)
    };
    seen.id = param("id");
    seen.group = param("group");

    // Decided and recorded under one lock, so that the record's order is the decisions'.
    let mut state = state.lock().unwrap();
    let injected = state.next.pop_front().or(state.always);
    let reply = match injected {
        Some(Answer::Status(status)) => json_reply(
            status,
            "stand_in",
            &format!("the stand-in was told to answer {status}"),
        ),
        Some(Answer::Bare(status)) => plain(status, ""),
        Some(Answer::HangUp) => Reply::HangUp,
        None => match state.dialect {
            Dialect::Airlock => state.airlock(&seen, &body),
            Dialect::Poseidon => state.poseidon(&seen, &body),
        },
    };
    seen.status = match &reply {
        Reply::Send(r) => Some(r.status().as_u16()),
        Reply::HangUp => None,
    };
    state.requests.push(seen);
    reply
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    Lock,
    Unlock,
}

fn route(path: &str) -> Option<Op> {
    match path {
        "/v1/pre-reboot" => Some(Op::Lock),
        "/v1/steady-state" => Some(Op::Unlock),
        _ => None,
    }
}

impl State {
    fn airlock(&mut self, seen: &Recorded, body: &[u8]) -> Reply {
        let Some(op) = route(&seen.path) else {
            return plain(404, "404 page not found\n");
        };
        // http.Error: text/plain, the JSON, a newline.
        let error = |status: u16, kind: &str, value: &str| {
            let mut text = json!({ "kind": kind, "value": value }).to_string();
            text.push('\n');
            with_type(plain(status, &text), "text/plain; charset=utf-8")
        };
        let invalid = |why: &str| {
            error(
                400,
                "invalid_client_identity",
                &format!("failed to validate client identity: {why}"),
            )
        };
        if seen.protocol_header.as_deref() != Some("true") {
            return invalid("wrong 'fleet-lock-protocol' header");
        }
        // Go decodes into a struct: absent fields are empty, a wrong type is an error.
        let Ok(v) = serde_json::from_slice::<Value>(body) else {
            return invalid("invalid character in JSON body");
        };
        let field = |key: &str| -> Result<String, ()> {
            match &v["client_params"][key] {
                Value::Null => Ok(String::new()),
                Value::String(s) => Ok(s.clone()),
                _ => Err(()),
            }
        };
        let (Ok(group), Ok(id)) = (field("group"), field("id")) else {
            return invalid("json: cannot unmarshal into Go struct field");
        };
        if group.is_empty() {
            return invalid("empty client group");
        }
        if id.is_empty() {
            return invalid("empty client ID");
        }
        let Some(&slots) = self.slots.get(&group) else {
            return error(400, "unknown_group", &format!("unknown group {group:?}"));
        };
        let holders = self.holders.entry(group).or_default();
        match op {
            Op::Lock => {
                if !holders.contains(&id) {
                    if holders.len() as u64 >= slots {
                        return error(
                            500,
                            "failed_lock",
                            &format!("all {slots} semaphore slots currently locked"),
                        );
                    }
                    holders.insert(id);
                }
            }
            Op::Unlock => {
                holders.remove(&id);
            }
        }
        plain(200, "")
    }

    fn poseidon(&mut self, seen: &Recorded, body: &[u8]) -> Reply {
        let Some(op) = route(&seen.path) else {
            return plain(404, "404 page not found\n");
        };
        if seen.method != "POST" {
            return json_reply(405, "method_not_allowed", "required method POST");
        }
        if seen.protocol_header.as_deref() != Some("true") {
            return json_reply(
                400,
                "missing_header",
                "missing required header fleet-lock-protocol: true",
            );
        }
        let parsed = serde_json::from_slice::<Value>(body).ok().and_then(|v| {
            let p = &v["client_params"];
            let id = p["id"].as_str().filter(|s| !s.is_empty())?.to_owned();
            let group = p["group"].as_str().filter(|s| !s.is_empty())?.to_owned();
            Some((id, group))
        });
        let Some((id, group)) = parsed else {
            return json_reply(400, "decode_error", "error decoding message");
        };
        let holders = self.holders.entry(group).or_default();
        let holder = holders.iter().next().cloned();
        match (op, holder) {
            (Op::Lock, Some(h)) if h == id => plain(200, "retained reboot lease"),
            (Op::Lock, None) => {
                holders.insert(id);
                plain(200, "obtained reboot lease")
            }
            (Op::Lock, Some(h)) => json_reply(
                423,
                "lock_held",
                &format!("reboot lease lock unavailable, held by {h}"),
            ),
            (Op::Unlock, Some(h)) if h == id => {
                holders.clear();
                plain(200, &format!("unlocked reboot lease for {h}"))
            }
            (Op::Unlock, None) => plain(200, "reboot lease already unlocked"),
            (Op::Unlock, Some(h)) => json_reply(
                423,
                "lock_held",
                &format!("reboot lease unlock unavailable, held by {h}"),
            ),
        }
    }
}

fn plain(status: u16, body: &str) -> Reply {
    let mut r = Response::new(Full::new(Bytes::from(body.to_owned())));
    *r.status_mut() = hyper::StatusCode::from_u16(status).unwrap();
    Reply::Send(r)
}

fn with_type(reply: Reply, content_type: &'static str) -> Reply {
    match reply {
        Reply::Send(mut r) => {
            let h = r.headers_mut();
            h.insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static(content_type),
            );
            h.insert(
                "x-content-type-options",
                hyper::header::HeaderValue::from_static("nosniff"),
            );
            Reply::Send(r)
        }
        Reply::HangUp => Reply::HangUp,
    }
}

/// poseidon's `encodeReply`: JSON (with the encoder's newline).
fn json_reply(status: u16, kind: &str, value: &str) -> Reply {
    let mut text = json!({ "kind": kind, "value": value }).to_string();
    text.push('\n');
    with_type(plain(status, &text), "application/json")
}
