//! The Kubernetes API as workers receive it: the daemon builds [`KubeClients`] (in `kube`) and
//! hands them to the probes and the kubeadm watcher through a watch, so no worker reaches into
//! another for a client. With them, how a client error is described and its HTTP status.
//!
//! Must not import anything else of the crate.

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
}

/// A short description of a client error: the HTTP status and reason for API errors, the root
/// cause for transport errors. Never contains credentials.
pub fn describe(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => {
            let msg = s.message.lines().next().unwrap_or("").trim();
            if s.reason.is_empty() || s.reason == "Failed to parse error data" {
                format!("HTTP {}: {msg}", s.code)
            } else {
                format!("HTTP {} {}: {msg}", s.code, s.reason)
            }
        }
        other => {
            let mut cause: &dyn std::error::Error = other;
            while let Some(next) = cause.source() {
                cause = next;
            }
            let root = cause.to_string();
            let top = other.to_string();
            if root == top {
                top
            } else {
                format!("{top}: {root}")
            }
        }
    }
}

/// The HTTP status of an API error.
pub fn code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) if s.code != 0 => Some(s.code),
        _ => None,
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

/// The field manager of every write ginx makes: the API server stamps each write's time in
/// `managedFields` under it, which the admission policies read as the server's clock.
pub const FIELD_MANAGER: &str = "ginx";

/// `PostParams` with ginx's field manager.
pub fn post_params() -> kube::api::PostParams {
    kube::api::PostParams {
        dry_run: false,
        field_manager: Some(FIELD_MANAGER.to_owned()),
    }
}

/// `PatchParams` (merge and strategic patches) with ginx's field manager.
pub fn patch_params() -> kube::api::PatchParams {
    kube::api::PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..kube::api::PatchParams::default()
    }
}

/// Whether `e` means the API is unavailable (a transport error, a timeout, a 5xx, or a 429
/// that kube-rs's retries did not get past), as opposed to a request the API refused (401,
/// 403, 404, 422, …: an error of configuration, which waiting does not mend).
pub fn unavailable(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(s) if s.code != 0 => s.code >= 500 || s.code == 429,
        // Credentials that cannot be loaded or refreshed are configuration too.
        kube::Error::Auth(_) => false,
        _ => true,
    }
}

/// Why the API refused `verb` on `resource` (`e` is not [`unavailable`]), and what to do. Only
/// a 403 is RBAC's doing; a 404 of ginx's namespace is the manifest not applied either.
pub fn refusal(verb: &str, resource: &str, e: &kube::Error) -> String {
    let hint = match code(e) {
        Some(401) => {
            "the credentials of kubernetes.kubeconfig are not accepted: check that file (an \
             expired or revoked certificate?)"
        }
        Some(403) => {
            "ginx's identity may not do this: apply packaging/kubernetes/rbac.yaml (and its \
             admission policies) to the cluster"
        }
        Some(404) => {
            "it does not exist: check kubernetes.namespace and apply \
             packaging/kubernetes/rbac.yaml, which creates the namespace"
        }
        Some(422) => "the API found the object ginx wrote invalid: report this as a bug",
        _ => "check the configuration of [kubernetes]",
    };
    format!("the API refused {verb} {resource}: {}; {hint}", describe(e))
}
