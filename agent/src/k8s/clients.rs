//! The API clients as workers receive them: the daemon builds [`KubeClients`] (in `kube`) and
//! hands them to whoever needs one through a watch, so no worker reaches into another for a
//! client. With them, `/readyz`.

use super::clock::ServerClock;
use super::error::describe;

/// Written on a node that ginx made unschedulable before a reboot (value: when); only such a
/// node is uncordoned by ginx. The reporter, which owns the other `ginx.io/` annotations,
/// leaves it alone.
pub const CORDONED_BY: &str = "ginx.io/cordoned-by-ginx";

/// Why there is no client for the API.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    /// A kubeconfig or URL that cannot be used: the text names the file or the setting, what is
    /// wrong with it and what to do, never its contents.
    #[error("{0}")]
    Setup(String),
    /// The clients are not built yet (no kubeconfig so far, or it is being read again).
    #[error("no connection to the Kubernetes API")]
    NotConnected,
}

/// Why `/readyz` did not say ready.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NotReady {
    /// No answer (transport, timeout): the server is unreachable.
    #[error("unreachable: {0}")]
    Unreachable(String),
    /// The server answered that it is not ready: its status and the failing checks it lists.
    #[error("readyz {status}: {checks}")]
    Answered { status: u16, checks: String },
}

/// Clients for the API, shared with the probes.
#[derive(Clone)]
pub struct KubeClients {
    /// The kubeconfig's server (normally the control-plane endpoint, the VIP).
    pub main: kube::Client,
    /// The same credentials against `health.apiserver.local_url`.
    pub local: Option<kube::Client>,
    /// The same credentials against `health.apiserver.vip_url` (default: the kubeconfig's
    /// server).
    pub vip: kube::Client,
    /// `main` for watches: its read timeout outlasts a watch request, which may be silent
    /// for minutes (`main`'s `request_timeout` would cut every watch after that long).
    pub watch: kube::Client,
    /// The node's own identity (`kubernetes.node_kubeconfig`, the kubelet's): what ginx does
    /// to its own Node and its pods. Or why there is none (named with its file).
    pub node: Result<kube::Client, ClientError>,
    /// The API server's clock as ginx's own writes found it: Leases are written in it.
    pub clock: ServerClock,
}

impl KubeClients {
    /// The node's own identity, or why there is none.
    pub fn node(&self) -> Result<kube::Client, ClientError> {
        self.node.clone()
    }
}

/// `/readyz` through `client`: Ok, or why not (the failing checks the server lists, or the
/// transport error).
pub async fn readyz(client: &kube::Client) -> Result<(), NotReady> {
    let request = http::Request::get("/readyz")
        .body(Vec::new())
        .map_err(|e| NotReady::Unreachable(e.to_string()))?;
    match client.request_text(request).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) => {
            let failing: Vec<&str> = s.message.lines().filter(|l| l.starts_with("[-]")).collect();
            let checks = if failing.is_empty() {
                let one_line: String = s.message.split_whitespace().collect::<Vec<_>>().join(" ");
                one_line.chars().take(200).collect::<String>()
            } else {
                failing.join(", ")
            };
            Err(NotReady::Answered {
                status: s.code,
                checks,
            })
        }
        Err(e) => Err(NotReady::Unreachable(describe(&e))),
    }
}
