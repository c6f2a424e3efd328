//! A minimal HTTP/1.1 GET over TCP or a unix socket (hyper), for the probes that do not need
//! TLS: the kubelet's healthz, the Cilium agent's API socket and health port.

use std::path::PathBuf;
use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;

use crate::types::EndpointUrl;

/// Where to connect.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// `host:port`
    Tcp(String),
    Unix(PathBuf),
}

/// The address and path of a plain `http://` URL. Messages show the URL as redacted.
pub fn parse_http_url(url: &EndpointUrl) -> Result<(Target, String), String> {
    let u = url.url();
    if u.scheme() != "http" {
        return Err(format!("{url}: only http:// is supported here"));
    }
    let host = u.host_str().ok_or_else(|| format!("{url} has no host"))?;
    let port = u.port_or_known_default().unwrap_or(80);
    let mut path = u.path().to_owned();
    if let Some(q) = u.query() {
        path.push('?');
        path.push_str(q);
    }
    Ok((Target::Tcp(format!("{host}:{port}")), path))
}

/// GETs `path` from `target`; the status code and body, or why not.
pub async fn get(target: &Target, path: &str, timeout: Duration) -> Result<(u16, Bytes), String> {
    let exchange = async {
        match target {
            Target::Tcp(addr) => {
                let stream = tokio::net::TcpStream::connect(addr)
                    .await
                    .map_err(|e| format!("cannot connect to {addr}: {e}"))?;
                send(stream, path).await
            }
            Target::Unix(p) => {
                let stream = tokio::net::UnixStream::connect(p)
                    .await
                    .map_err(|e| format!("cannot connect to {}: {e}", p.display()))?;
                send(stream, path).await
            }
        }
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {}s", timeout.as_secs_f32())))
}

async fn send<S>(stream: S, path: &str) -> Result<(u16, Bytes), String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("HTTP handshake failed: {e}"))?;
    let driver = tokio::spawn(conn);
    let request = http::Request::get(path)
        .header(http::header::HOST, "localhost")
        .body(Empty::<Bytes>::new())
        .map_err(|e| e.to_string())?;
    let result = async {
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| format!("request failed: {e}"))?;
        let status = response.status().as_u16();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("reading the answer: {e}"))?
            .to_bytes();
        Ok((status, body))
    }
    .await;
    driver.abort();
    result
}
