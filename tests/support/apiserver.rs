//! A stand-in Kubernetes API server for the parts ginx uses. The tests run against the real
//! control plane (control_plane.rs); this one stays only for what a real server cannot be made
//! to do on cue: injected 500s, dropped connections, stalls, an unready `/readyz`, a server
//! inside a network namespace, and the benchmark's comparison. It keeps the real API's
//! behaviour for those parts:
//!
//! - **Objects**: Leases (`coordination.k8s.io/v1`, namespaced: GET, POST, PUT, PATCH merge and
//!   apply, DELETE), Nodes (`v1`: GET, PATCH merge and strategic merge, and the `status`
//!   subresource: GET, PATCH), ConfigMaps and ClusterRoleBindings (GET).
//! - **resourceVersion** changes on every write (one counter for all objects, as etcd's
//!   revision); a PUT whose `metadata.resourceVersion` is stale gets `409` with a `Status`
//!   (`reason: Conflict`); a PUT of an existing object without one gets `422`
//!   (`reason: Invalid`, "must be specified for an update"); a PUT of a missing Lease creates it
//!   (`201`), as the API does for objects whose strategy allows create-on-update.
//! - **POST** of an existing name: `409` `AlreadyExists`; into a namespace that does not exist:
//!   `404` `NotFound` ("namespaces \"x\" not found").
//! - **Missing objects**: `404` with a `Status` (`reason: NotFound`, `details.name/kind`).
//! - **Merge patch** (RFC 7386): objects merge key by key, `null` deletes, lists are replaced.
//!   **Strategic merge patch** on Nodes: the same, except `status.conditions`, merged by `type`
//!   (its `patchMergeKey`). On the main resource status is ignored; on `/status` only status
//!   changes.
//! - **Authentication**: a bearer token or a client certificate signed by the test CA; neither
//!   gets `401` (`reason: Unauthorized`). **Authorization**: forbidden (verb, resource) pairs get
//!   `403` (`reason: Forbidden`).
//! - `/readyz`: `200 ok`, or `500` listing `[-]` checks when made unready.
//! - **Faults**: the next N requests fail with a status, a delay on every request, dropped
//!   connections, or "down" (every connection closed unanswered).
//!
//! Every request is logged for assertions. TLS with a test CA.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use serde_json::{Value, json};

use super::tls::TestCa;

#[derive(Clone, Debug)]
pub struct Logged {
    pub method: String,
    pub path: String,
    pub content_type: String,
    pub status: u16,
}

#[derive(Default)]
struct Faults {
    fail_next: Vec<u16>,
    drop_next: usize,
    delay: Duration,
    down: bool,
    unready: bool,
    /// (verb, resource) pairs answered with 403, e.g. ("update", "leases").
    forbidden: BTreeSet<(String, String)>,
}

#[derive(Default)]
struct Store {
    objects: BTreeMap<String, Value>,
    namespaces: BTreeSet<String>,
    revision: u64,
    log: Vec<Logged>,
    faults: Faults,
}

pub struct ApiServer {
    pub addr: SocketAddr,
    pub url: String,
    pub ca: TestCa,
    pub token: String,
    store: Arc<Mutex<Store>>,
    runtime: Option<tokio::runtime::Runtime>,
}

fn status(code: u16, reason: &str, message: &str, details: Value) -> (u16, Value) {
    (
        code,
        json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "message": message, "reason": reason,
            "details": details, "code": code
        }),
    )
}

fn not_found(kind: &str, group: &str, name: &str) -> (u16, Value) {
    let what = if group.is_empty() {
        kind.to_owned()
    } else {
        format!("{kind}.{group}")
    };
    status(
        404,
        "NotFound",
        &format!("{what} \"{name}\" not found"),
        json!({"name": name, "group": group, "kind": kind}),
    )
}

/// RFC 7386.
pub fn merge(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = json!({});
            }
            let t = target.as_object_mut().expect("object");
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        other => *target = other.clone(),
    }
}

/// Strategic merge for Nodes: `status.conditions` merge by `type`; everything else as RFC 7386.
pub fn strategic_merge(target: &mut Value, patch: &Value) {
    let mut patch = patch.clone();
    let conditions = patch
        .get_mut("status")
        .and_then(|s| s.as_object_mut())
        .and_then(|s| s.remove("conditions"));
    merge(target, &patch);
    if let Some(Value::Array(new)) = conditions {
        let list = target
            .pointer_mut("/status")
            .and_then(|s| s.as_object_mut())
            .map(|s| s.entry("conditions").or_insert(json!([])));
        if let Some(Value::Array(existing)) = list {
            for item in new {
                let ty = item.get("type").cloned();
                match existing.iter_mut().find(|c| c.get("type") == ty.as_ref()) {
                    Some(c) => merge(c, &item),
                    None => existing.push(item),
                }
            }
        }
    }
}

impl ApiServer {
    pub fn start(dir: &std::path::Path) -> Self {
        let (runtime, listener) = super::loopback_server(2);
        let addr = listener.local_addr().unwrap();
        let ca = TestCa::new(dir);
        let acceptor = tokio_rustls::TlsAcceptor::from(
            ca.server_config_for(&["127.0.0.1", "localhost", "kubernetes"], true),
        );
        let token = format!("ginx-test-token-{}", fastrand::u64(..));
        super::sweep::secret("kubeconfig bearer token", &token);
        let store = Arc::new(Mutex::new(Store::default()));
        store
            .lock()
            .unwrap()
            .namespaces
            .extend(["default", "kube-system", "ginx-system"].map(String::from));
        let shared = Arc::new(Shared {
            store: Arc::clone(&store),
            token: token.clone(),
            sent: super::sweep::Sink::new("apiserver-requests", "the stand-in API server"),
        });
        runtime.spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let shared = Arc::clone(&shared);
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let has_cert = tls
                        .get_ref()
                        .1
                        .peer_certificates()
                        .is_some_and(|c| !c.is_empty());
                    if shared.store.lock().unwrap().faults.down {
                        return;
                    }
                    let svc = hyper::service::service_fn(move |req| {
                        let shared = Arc::clone(&shared);
                        async move { shared.handle(req, has_cert).await }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(tls), svc)
                        .await;
                });
            }
        });
        Self {
            url: format!("https://127.0.0.1:{}", addr.port()),
            addr,
            ca,
            token,
            store,
            runtime: Some(runtime),
        }
    }

    /// A kubeconfig with a bearer token.
    pub fn kubeconfig_token(&self, path: &std::path::Path) {
        self.write_kubeconfig(path, &format!("    token: {}\n", self.token));
    }

    fn write_kubeconfig(&self, path: &std::path::Path, user: &str) {
        use base64::Engine;
        let ca = base64::engine::general_purpose::STANDARD.encode(self.ca.pem());
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {url}\n    certificate-authority-data: {ca}\nusers:\n- name: ginx\n  user:\n{user}contexts:\n- name: test\n  context:\n    cluster: test\n    user: ginx\ncurrent-context: test\n",
            url = self.url
        );
        std::fs::write(path, text).unwrap();
        std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .unwrap();
    }

    pub fn log(&self) -> Vec<Logged> {
        self.store.lock().unwrap().log.clone()
    }

    pub fn clear_log(&self) {
        self.store.lock().unwrap().log.clear();
    }

    pub fn object(&self, key: &str) -> Option<Value> {
        self.store.lock().unwrap().objects.get(key).cloned()
    }

    pub fn lease(&self, ns: &str, name: &str) -> Option<Value> {
        self.object(&format!("leases/{ns}/{name}"))
    }

    pub fn node(&self, name: &str) -> Option<Value> {
        self.object(&format!("nodes/{name}"))
    }

    /// Registers a Node as the kubelet would, Ready, with an annotation of somebody else's.
    pub fn add_node(&self, name: &str) {
        let node = json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "annotations": {"node.alpha.kubernetes.io/ttl": "0"}},
            "status": {"conditions": [
                {"type": "Ready", "status": "True", "reason": "KubeletReady",
                 "message": "kubelet is posting ready status",
                 "lastHeartbeatTime": "2026-01-01T00:00:00Z", "lastTransitionTime": "2026-01-01T00:00:00Z"}
            ]}
        });
        self.put_object(&format!("nodes/{name}"), node);
    }

    pub fn put_object(&self, key: &str, mut obj: Value) {
        let mut s = self.store.lock().unwrap();
        s.revision += 1;
        let rv = s.revision.to_string();
        merge(&mut obj, &json!({"metadata": {"resourceVersion": rv}}));
        s.objects.insert(key.to_owned(), obj);
    }

    pub fn remove_namespace(&self, ns: &str) {
        self.store.lock().unwrap().namespaces.remove(ns);
    }

    pub fn fail_next(&self, codes: &[u16]) {
        self.store.lock().unwrap().faults.fail_next = codes.to_vec();
    }

    pub fn drop_next(&self, n: usize) {
        self.store.lock().unwrap().faults.drop_next = n;
    }

    pub fn set_delay(&self, d: Duration) {
        self.store.lock().unwrap().faults.delay = d;
    }

    pub fn set_down(&self, down: bool) {
        self.store.lock().unwrap().faults.down = down;
    }

    pub fn set_unready(&self, unready: bool) {
        self.store.lock().unwrap().faults.unready = unready;
    }

    pub fn forbid(&self, verb: &str, resource: &str) {
        self.store
            .lock()
            .unwrap()
            .faults
            .forbidden
            .insert((verb.to_owned(), resource.to_owned()));
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

struct Shared {
    store: Arc<Mutex<Store>>,
    token: String,
    /// Every request line and body, for the secrets sweep (not the headers: the token is
    /// meant to reach this server).
    sent: super::sweep::Sink,
}

/// An `Err` makes hyper drop the connection without an answer.
type Reply = Result<Response<Full<Bytes>>, std::io::Error>;

fn respond(code: u16, body: &Value) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
    *r.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    r
}

impl Shared {
    async fn handle(&self, req: Request<Incoming>, has_cert: bool) -> Reply {
        let delay = self.store.lock().unwrap().faults.delay;
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let method = req.method().to_string();
        let path = req.uri().path().to_owned();
        self.sent
            .write(format!("{method} {}", req.uri()).as_bytes());
        let content_type = req
            .headers()
            .get(hyper::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        let authorized = has_cert
            || req
                .headers()
                .get(hyper::header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                == Some(format!("Bearer {}", self.token).as_str());
        let body = req
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        self.sent.write(&body);
        let (code, value, drop_it) = {
            let mut s = self.store.lock().unwrap();
            if s.faults.down {
                (0, Value::Null, true)
            } else if s.faults.drop_next > 0 {
                s.faults.drop_next -= 1;
                (0, Value::Null, true)
            } else {
                let (code, value) = if !s.faults.fail_next.is_empty() {
                    let c = s.faults.fail_next.remove(0);
                    status(c, "InternalError", "injected fault", json!({}))
                } else if path == "/readyz" || path == "/livez" {
                    if s.faults.unready {
                        (
                            500,
                            json!(
                                "[+]ping ok\n[-]etcd failed: reason withheld\nreadyz check failed"
                            ),
                        )
                    } else {
                        (200, json!("ok"))
                    }
                } else if !authorized {
                    status(401, "Unauthorized", "Unauthorized", json!({}))
                } else {
                    route(&mut s, &method, &path, &content_type, &body)
                };
                s.log.push(Logged {
                    method: method.clone(),
                    path: path.clone(),
                    content_type,
                    status: code,
                });
                (code, value, false)
            }
        };
        if drop_it {
            return Err(std::io::Error::other("connection dropped (injected fault)"));
        }
        if let Value::String(text) = &value
            && (path == "/readyz" || path == "/livez")
        {
            let mut r = Response::new(Full::new(Bytes::from(text.clone())));
            *r.status_mut() = StatusCode::from_u16(code).unwrap();
            return Ok(r);
        }
        Ok(respond(code, &value))
    }
}

fn verb(method: &str, named: bool, content_type: &str) -> &'static str {
    match (method, named) {
        ("GET", true) => "get",
        ("GET", false) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) if content_type.contains("apply-patch") => "patch",
        ("PATCH", _) => "patch",
        ("DELETE", _) => "delete",
        _ => "unknown",
    }
}

/// The API for the resources above; the store is locked.
fn route(s: &mut Store, method: &str, path: &str, ct: &str, body: &[u8]) -> (u16, Value) {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let parsed: Option<Value> = (!body.is_empty())
        .then(|| serde_json::from_slice(body).ok())
        .flatten();
    match parts.as_slice() {
        [
            "apis",
            "coordination.k8s.io",
            "v1",
            "namespaces",
            ns,
            "leases",
            rest @ ..,
        ] => {
            let name = rest.first().copied();
            if s.faults.forbidden.contains(&(
                verb(method, name.is_some(), ct).to_owned(),
                "leases".to_owned(),
            )) {
                return status(
                    403,
                    "Forbidden",
                    &format!(
                        "leases.coordination.k8s.io is forbidden: User \"ginx\" cannot {} resource \"leases\" in API group \"coordination.k8s.io\" in the namespace \"{ns}\"",
                        verb(method, name.is_some(), ct)
                    ),
                    json!({"group": "coordination.k8s.io", "kind": "leases"}),
                );
            }
            leases(s, method, ns, name, parsed)
        }
        ["api", "v1", "nodes", name, rest @ ..] => {
            let sub = rest.first().copied();
            let resource = if sub == Some("status") {
                "nodes/status"
            } else {
                "nodes"
            };
            if s.faults
                .forbidden
                .contains(&(verb(method, true, ct).to_owned(), resource.to_owned()))
            {
                return status(
                    403,
                    "Forbidden",
                    &format!(
                        "nodes \"{name}\" is forbidden: User \"ginx\" cannot {} resource \"{resource}\"",
                        verb(method, true, ct)
                    ),
                    json!({"name": name, "kind": "nodes"}),
                );
            }
            nodes(s, method, name, sub, ct, parsed)
        }
        ["api", "v1", "namespaces", ns, "configmaps", name] if method == "GET" => {
            match s.objects.get(&format!("configmaps/{ns}/{name}")) {
                Some(o) => (200, o.clone()),
                None => not_found("configmaps", "", name),
            }
        }
        [
            "apis",
            "rbac.authorization.k8s.io",
            "v1",
            "clusterrolebindings",
            name,
        ] if method == "GET" => match s.objects.get(&format!("clusterrolebindings/{name}")) {
            Some(o) => (200, o.clone()),
            None => not_found("clusterrolebindings", "rbac.authorization.k8s.io", name),
        },
        _ => status(
            404,
            "NotFound",
            "the server could not find the requested resource",
            json!({}),
        ),
    }
}

fn bump(s: &mut Store, obj: &mut Value) {
    s.revision += 1;
    let rv = s.revision.to_string();
    merge(obj, &json!({"metadata": {"resourceVersion": rv}}));
}

fn leases(
    s: &mut Store,
    method: &str,
    ns: &str,
    name: Option<&str>,
    body: Option<Value>,
) -> (u16, Value) {
    let key = |n: &str| format!("leases/{ns}/{n}");
    let fill = |mut o: Value, n: &str| {
        merge(
            &mut o,
            &json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": n, "namespace": ns}}),
        );
        o
    };
    if !s.namespaces.contains(ns) && method != "GET" {
        return status(
            404,
            "NotFound",
            &format!("namespaces \"{ns}\" not found"),
            json!({"name": ns, "kind": "namespaces"}),
        );
    }
    match (method, name) {
        ("GET", Some(n)) => match s.objects.get(&key(n)) {
            Some(o) => (200, o.clone()),
            None => not_found("leases", "coordination.k8s.io", n),
        },
        ("POST", None) => {
            let Some(body) = body else {
                return status(400, "BadRequest", "no body", json!({}));
            };
            let Some(n) = body
                .pointer("/metadata/name")
                .and_then(|v| v.as_str())
                .map(str::to_owned)
            else {
                return status(422, "Invalid", "metadata.name: Required value", json!({}));
            };
            if s.objects.contains_key(&key(&n)) {
                return status(
                    409,
                    "AlreadyExists",
                    &format!("leases.coordination.k8s.io \"{n}\" already exists"),
                    json!({"name": n, "group": "coordination.k8s.io", "kind": "leases"}),
                );
            }
            let mut o = fill(body, &n);
            merge(
                &mut o,
                &json!({"metadata": {"uid": format!("uid-{n}"), "creationTimestamp": "2026-01-01T00:00:00Z"}}),
            );
            bump(s, &mut o);
            s.objects.insert(key(&n), o.clone());
            (201, o)
        }
        ("PUT", Some(n)) => {
            let Some(body) = body else {
                return status(400, "BadRequest", "no body", json!({}));
            };
            let sent_rv = body
                .pointer("/metadata/resourceVersion")
                .and_then(|v| v.as_str())
                .map(str::to_owned);
            match s.objects.get(&key(n)) {
                None => {
                    let mut o = fill(body, n);
                    bump(s, &mut o);
                    s.objects.insert(key(n), o.clone());
                    (201, o)
                }
                Some(existing) => {
                    let current = existing
                        .pointer("/metadata/resourceVersion")
                        .and_then(|v| v.as_str())
                        .unwrap_or("")
                        .to_owned();
                    match sent_rv {
                        None => status(
                            422,
                            "Invalid",
                            &format!(
                                "Lease.coordination.k8s.io \"{n}\" is invalid: metadata.resourceVersion: Invalid value: 0x0: must be specified for an update"
                            ),
                            json!({"name": n, "group": "coordination.k8s.io", "kind": "Lease"}),
                        ),
                        Some(rv) if rv != current => status(
                            409,
                            "Conflict",
                            &format!(
                                "Operation cannot be fulfilled on leases.coordination.k8s.io \"{n}\": the object has been modified; please apply your changes to the latest version and try again"
                            ),
                            json!({"name": n, "group": "coordination.k8s.io", "kind": "leases"}),
                        ),
                        Some(_) => {
                            let mut o = fill(body, n);
                            bump(s, &mut o);
                            s.objects.insert(key(n), o.clone());
                            (200, o)
                        }
                    }
                }
            }
        }
        ("PATCH", Some(n)) => {
            let Some(body) = body else {
                return status(400, "BadRequest", "no body", json!({}));
            };
            let Some(mut o) = s.objects.get(&key(n)).cloned() else {
                return not_found("leases", "coordination.k8s.io", n);
            };
            if let Some(rv) = body
                .pointer("/metadata/resourceVersion")
                .and_then(|v| v.as_str())
                && Some(rv)
                    != o.pointer("/metadata/resourceVersion")
                        .and_then(|v| v.as_str())
            {
                return status(
                    409,
                    "Conflict",
                    "the object has been modified",
                    json!({"name": n}),
                );
            }
            merge(&mut o, &body);
            bump(s, &mut o);
            s.objects.insert(key(n), o.clone());
            (200, o)
        }
        ("DELETE", Some(n)) => match s.objects.remove(&key(n)) {
            Some(_) => (
                200,
                json!({"kind": "Status", "apiVersion": "v1", "status": "Success", "details": {"name": n}}),
            ),
            None => not_found("leases", "coordination.k8s.io", n),
        },
        _ => status(405, "MethodNotAllowed", "method not allowed", json!({})),
    }
}

fn nodes(
    s: &mut Store,
    method: &str,
    name: &str,
    sub: Option<&str>,
    ct: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let key = format!("nodes/{name}");
    let Some(mut node) = s.objects.get(&key).cloned() else {
        return not_found("nodes", "", name);
    };
    match (method, sub) {
        ("GET", None | Some("status")) => (200, node),
        ("PATCH", None | Some("status")) => {
            let Some(body) = body else {
                return status(400, "BadRequest", "no body", json!({}));
            };
            let mut patch = body;
            // The main resource ignores status; the subresource ignores everything else.
            match sub {
                None => {
                    if let Some(o) = patch.as_object_mut() {
                        o.remove("status");
                    }
                }
                Some(_) => {
                    patch = json!({"status": patch.get("status").cloned().unwrap_or(json!({}))});
                }
            }
            if ct.contains("strategic-merge-patch") {
                strategic_merge(&mut node, &patch);
            } else if ct.contains("merge-patch") {
                merge(&mut node, &patch);
            } else {
                return status(
                    415,
                    "UnsupportedMediaType",
                    &format!("unsupported patch type {ct:?}"),
                    json!({}),
                );
            }
            bump(s, &mut node);
            s.objects.insert(key, node.clone());
            (200, node)
        }
        _ => status(405, "MethodNotAllowed", "method not allowed", json!({})),
    }
}
