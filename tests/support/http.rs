//! Git's smart HTTP protocol on 127.0.0.1: `git http-backend` (the real CGI program) behind a
//! small hyper server, optionally with TLS (a test CA) and HTTP basic authentication, logging
//! every request so tests can check what a client sent.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use tokio::io::AsyncWriteExt;

use super::tls::TestCa;

#[derive(Clone, Debug)]
pub struct LoggedRequest {
    pub method: String,
    pub uri: String,
    pub authorization: Option<String>,
}

#[derive(Default)]
pub struct Options {
    pub tls: bool,
    /// `(user, password)` required on every request.
    pub basic_auth: Option<(String, String)>,
    /// Requests wait until this turns true.
    pub gate: Option<tokio::sync::watch::Receiver<bool>>,
}

pub struct GitHttpServer {
    pub addr: SocketAddr,
    /// `http(s)://127.0.0.1:PORT`
    pub base_url: String,
    /// The CA to trust (`SSL_CERT_FILE`) when serving TLS.
    pub ca: Option<TestCa>,
    pub requests: Arc<Mutex<Vec<LoggedRequest>>>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl GitHttpServer {
    /// Serves the repositories under `root` at `<base_url>/<name>`.
    pub fn start(root: &Path, opts: Options) -> Self {
        let (runtime, listener) = super::loopback_server(1);
        let addr = listener.local_addr().unwrap();
        let ca = opts.tls.then(|| TestCa::new(root));
        let acceptor = ca
            .as_ref()
            .map(|ca| tokio_rustls::TlsAcceptor::from(ca.server_config()));
        let requests = Arc::new(Mutex::new(Vec::new()));
        if let Some((_, password)) = &opts.basic_auth {
            super::sweep::secret_in_url("HTTPS token", password);
        }
        let state = Arc::new(Shared {
            root: root.to_owned(),
            gate: opts.gate,
            auth: opts.basic_auth,
            requests: Arc::clone(&requests),
        });
        runtime.spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let state = Arc::clone(&state);
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| {
                        let state = Arc::clone(&state);
                        async move { Ok::<_, std::convert::Infallible>(state.handle(req).await) }
                    });
                    let http = hyper::server::conn::http1::Builder::new();
                    match acceptor {
                        Some(a) => {
                            if let Ok(tls) = a.accept(tcp).await {
                                let _ = http
                                    .serve_connection(hyper_util::rt::TokioIo::new(tls), svc)
                                    .await;
                            }
                        }
                        None => {
                            let _ = http
                                .serve_connection(hyper_util::rt::TokioIo::new(tcp), svc)
                                .await;
                        }
                    }
                });
            }
        });
        let scheme = if opts.tls { "https" } else { "http" };
        Self {
            addr,
            base_url: format!("{scheme}://127.0.0.1:{}", addr.port()),
            ca,
            requests,
            runtime: Some(runtime),
        }
    }

    pub fn requests(&self) -> Vec<LoggedRequest> {
        self.requests.lock().unwrap().clone()
    }
}

impl Drop for GitHttpServer {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

struct Shared {
    root: PathBuf,
    gate: Option<tokio::sync::watch::Receiver<bool>>,
    auth: Option<(String, String)>,
    requests: Arc<Mutex<Vec<LoggedRequest>>>,
}

type Reply = Response<Full<Bytes>>;

fn reply(status: StatusCode, body: &str) -> Reply {
    let mut r = Response::new(Full::new(Bytes::from(body.to_owned())));
    *r.status_mut() = status;
    r
}

impl Shared {
    async fn handle(&self, req: Request<Incoming>) -> Reply {
        let authorization = req
            .headers()
            .get(hyper::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        self.requests.lock().unwrap().push(LoggedRequest {
            method: req.method().to_string(),
            uri: req.uri().to_string(),
            authorization: authorization.clone(),
        });
        if let Some(gate) = &self.gate {
            let mut gate = gate.clone();
            let _ = gate.wait_for(|open| *open).await;
        }
        if let Some((user, password)) = &self.auth {
            use base64::Engine;
            let token =
                base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
            let expected = format!("Basic {token}");
            if authorization.as_deref() != Some(expected.as_str()) {
                let mut r = reply(StatusCode::UNAUTHORIZED, "authentication required\n");
                r.headers_mut().insert(
                    hyper::header::WWW_AUTHENTICATE,
                    hyper::header::HeaderValue::from_static("Basic realm=\"git\""),
                );
                return r;
            }
        }
        match self.cgi(req).await {
            Ok(r) => r,
            Err(e) => reply(StatusCode::INTERNAL_SERVER_ERROR, &format!("{e}\n")),
        }
    }

    /// Runs `git http-backend` as a CGI program for one request.
    async fn cgi(&self, req: Request<Incoming>) -> std::io::Result<Reply> {
        let (parts, body) = req.into_parts();
        let body = body
            .collect()
            .await
            .map_err(std::io::Error::other)?
            .to_bytes();
        let header = |name: hyper::header::HeaderName| {
            parts
                .headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_owned()
        };
        let mut cmd = tokio::process::Command::new("git");
        cmd.arg("http-backend")
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_PROJECT_ROOT", &self.root)
            .env("GIT_HTTP_EXPORT_ALL", "1")
            .env("REQUEST_METHOD", parts.method.as_str())
            .env("PATH_INFO", parts.uri.path())
            .env("QUERY_STRING", parts.uri.query().unwrap_or(""))
            .env("CONTENT_TYPE", header(hyper::header::CONTENT_TYPE))
            .env("CONTENT_LENGTH", body.len().to_string())
            .env(
                "HTTP_CONTENT_ENCODING",
                header(hyper::header::CONTENT_ENCODING),
            )
            .env(
                "GIT_PROTOCOL",
                header(hyper::header::HeaderName::from_static("git-protocol")),
            )
            .env("REMOTE_ADDR", "127.0.0.1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let mut child = cmd.spawn()?;
        let mut stdin = child.stdin.take().expect("piped stdin");
        let writer = tokio::spawn(async move {
            let _ = stdin.write_all(&body).await;
        });
        let out = child.wait_with_output().await?;
        let _ = writer.await;
        Ok(parse_cgi(&out.stdout))
    }
}

/// Turns a CGI response (headers, blank line, body) into an HTTP response.
fn parse_cgi(raw: &[u8]) -> Reply {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| (i, 4))
        .or_else(|| raw.windows(2).position(|w| w == b"\n\n").map(|i| (i, 2)));
    let Some((end, sep)) = split else {
        return reply(StatusCode::BAD_GATEWAY, "bad CGI response\n");
    };
    let head = String::from_utf8_lossy(&raw[..end]);
    let mut headers = HashMap::new();
    let mut status = StatusCode::OK;
    for line in head.lines() {
        if let Some((k, v)) = line.split_once(':') {
            let (k, v) = (k.trim(), v.trim());
            if k.eq_ignore_ascii_case("status") {
                if let Some(code) = v.split_whitespace().next().and_then(|c| c.parse().ok()) {
                    status = StatusCode::from_u16(code).unwrap_or(StatusCode::OK);
                }
            } else {
                headers.insert(k.to_owned(), v.to_owned());
            }
        }
    }
    let mut r = Response::new(Full::new(Bytes::copy_from_slice(&raw[end + sep..])));
    *r.status_mut() = status;
    for (k, v) in headers {
        if let (Ok(k), Ok(v)) = (
            hyper::header::HeaderName::from_bytes(k.as_bytes()),
            hyper::header::HeaderValue::from_str(&v),
        ) {
            r.headers_mut().insert(k, v);
        }
    }
    r
}
