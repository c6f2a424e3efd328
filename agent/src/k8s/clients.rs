//! The API clients as workers receive them: the daemon builds [`KubeClients`] (in `kube`) and
//! hands them to whoever needs one through a watch, so no worker reaches into another for a
//! client. With them, `/readyz`.

use super::clock::ServerClock;
use super::error::describe;

/// Written on a node that ginx made unschedulable before a reboot (value: when); only such a
/// node is uncordoned by ginx. The reporter, which owns the other `ginx.io/` annotations,
/// leaves it alone.
pub const CORDONED_BY: &str = "ginx.io/cordoned-by-ginx";

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
    pub node: Result<kube::Client, String>,
    /// The API server's clock as ginx's own writes found it: Leases are written in it.
    pub clock: ServerClock,
}

impl KubeClients {
    /// The node's own identity, or why there is none.
    pub fn node(&self) -> Result<kube::Client, String> {
        self.node.clone()
    }
}

/// `/readyz` through `client`: Ok, or why not (the failing checks the server lists, or the
/// transport error).
pub async fn readyz(client: &kube::Client) -> Result<(), String> {
    let request = http::Request::get("/readyz")
        .body(Vec::new())
        .map_err(|e| e.to_string())?;
    match client.request_text(request).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) => {
            let failing: Vec<&str> = s.message.lines().filter(|l| l.starts_with("[-]")).collect();
            Err(if failing.is_empty() {
                let one_line: String = s.message.split_whitespace().collect::<Vec<_>>().join(" ");
                format!(
                    "readyz {}: {}",
                    s.code,
                    one_line.chars().take(200).collect::<String>()
                )
            } else {
                format!("readyz {}: {}", s.code, failing.join(", "))
            })
        }
        Err(e) => Err(format!("unreachable: {}", describe(&e))),
    }
}
