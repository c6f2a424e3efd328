//! The Kubernetes side: a client built from ginx's own kubeconfig, the heartbeat Lease, node
//! annotations and the `GinxHealthy` node condition.
//!
//! Nothing here blocks pulling or applying: without a kubeconfig, or with the API away, ginx runs
//! on and retries with backoff, and status says `not-configured` or `unreachable since …`.
//!
//! A worker (layer 5): imports `types`, `config`, `status`, `metrics`, `util`, never another
//! worker. The reporter reads the status it writes to the cluster from `status::Parts`, handed
//! in by the daemon; the clients it builds go out through a watch as `k8s::KubeClients`.

pub mod events;
pub mod report;
pub mod reporter;

use std::path::Path;
use std::sync::Arc;

use kube::client::ClientBuilder;
use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::config::Config;
use crate::k8s::{ClientError, KubeClients, describe};
use crate::metrics::Metrics;

/// Installs ring as rustls's crypto provider (once; later calls do nothing).
pub fn install_crypto() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A client configuration from the kubeconfig at `path`: timeouts on, kube's own retries off
/// (ginx retries on its own schedule; kube's could hold a call for minutes), no proxy from the
/// environment (the API is reached directly).
pub async fn client_config(
    path: &Path,
    context: Option<String>,
    timeout: std::time::Duration,
) -> Result<kube::Config, String> {
    install_crypto();
    let kubeconfig = Kubeconfig::read_from(path).map_err(|e| match e {
        // The YAML parser's message quotes the lines around the error, which may be a token or
        // a client key: only the position goes out.
        kube::config::KubeconfigError::Parse(e) => match e.location() {
            Some(l) => format!(
                "kubeconfig {}:{}:{}: not a valid kubeconfig (YAML); check the file there",
                path.display(),
                l.line(),
                l.column()
            ),
            None => format!(
                "kubeconfig {}: not a valid kubeconfig (YAML); check the file",
                path.display()
            ),
        },
        e => format!("kubeconfig {}: {e}", path.display()),
    })?;
    let options = KubeConfigOptions {
        context,
        ..KubeConfigOptions::default()
    };
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &options)
        .await
        .map_err(|e| format!("kubeconfig {}: {e}", path.display()))?;
    config.connect_timeout = Some(timeout);
    config.read_timeout = Some(timeout);
    config.write_timeout = Some(timeout);
    config.reset_reader_on_write = true;
    config.default_retry = false;
    config.proxy_url = None;
    // The audit log tells ginx's requests from the kubelet's, which share the node's identity.
    if let Ok(ua) = http::HeaderValue::from_str(&format!("ginx/{}", crate::version())) {
        config.headers.push((http::header::USER_AGENT, ua));
    }
    Ok(config)
}

/// Builds the clients from `kubernetes.kubeconfig`. The error names the file and what is wrong
/// with it, without its contents.
pub async fn connect(cfg: &Config, metrics: &Arc<Metrics>) -> Result<KubeClients, ClientError> {
    let k = &cfg.kubernetes;
    let path = k
        .kubeconfig
        .as_deref()
        .ok_or_else(|| ClientError::Setup("kubernetes.kubeconfig is not set".to_owned()))?;
    let config = client_config(path, k.context.clone(), k.request_timeout.get())
        .await
        .map_err(ClientError::Setup)?;
    let build = |c: kube::Config| -> Result<kube::Client, ClientError> {
        ClientBuilder::try_from(c)
            .map(|b| {
                b.with_layer(&crate::metrics::KubeMetricsLayer(Arc::clone(metrics)))
                    .build()
            })
            .map_err(|e| {
                ClientError::Setup(format!("kubeconfig {}: {}", path.display(), describe(&e)))
            })
    };
    let main = build(config.clone())?;
    let probe = &cfg.health.apiserver;
    let probe_client = |url: &str, shown: &dyn std::fmt::Display| {
        let mut c = config.clone();
        c.cluster_url = url
            .parse()
            .map_err(|e| ClientError::Setup(format!("health.apiserver URL {shown}: {e}")))?;
        if probe.tls_server_name.is_some() {
            c.tls_server_name.clone_from(&probe.tls_server_name);
        }
        if probe.insecure_skip_tls_verify {
            c.accept_invalid_certs = true;
        }
        build(c)
    };
    let local = probe_client(probe.local_url.as_request_str(), &probe.local_url).ok();
    let vip = match &probe.vip_url {
        Some(u) => probe_client(u.as_request_str(), u)?,
        None => {
            let server = config.cluster_url.to_string();
            probe_client(&server, &server)?
        }
    };
    let mut watching = config.clone();
    // A watch lasts up to k8s::WATCH_SECONDS and may carry nothing all that time.
    watching.read_timeout = Some(std::time::Duration::from_secs(WATCH_READ_SECONDS));
    let watch = build(watching)?;
    let node = node_client(cfg, metrics).await;
    Ok(KubeClients {
        main,
        local,
        vip,
        watch,
        node,
        clock: crate::k8s::ServerClock::default(),
    })
}

/// The client with the node's own identity (`kubernetes.node_kubeconfig`), against the server
/// its kubeconfig names. The error names the file and what to do, without its contents.
async fn node_client(cfg: &Config, metrics: &Arc<Metrics>) -> Result<kube::Client, ClientError> {
    let k = &cfg.kubernetes;
    let path = &k.node_kubeconfig;
    if !path.exists() {
        return Err(ClientError::Setup(format!(
            "the node's own kubeconfig {} (kubernetes.node_kubeconfig) does not exist: ginx \
             annotates, cordons and drains its node with the node's identity (kubeadm writes it \
             when the node joins)",
            path.display()
        )));
    }
    let config = client_config(path, None, k.request_timeout.get())
        .await
        .map_err(ClientError::Setup)?;
    ClientBuilder::try_from(config)
        .map(|b| {
            b.with_layer(&crate::metrics::KubeMetricsLayer(Arc::clone(metrics)))
                .build()
        })
        .map_err(|e| ClientError::Setup(format!("kubeconfig {}: {}", path.display(), describe(&e))))
}

/// The files a kubeconfig's credentials come from: itself, and the client certificates, keys
/// and CA files it names (the kubelet's client certificate is rotated under the same name).
/// Their stamps tell when the clients must be built again.
pub fn credential_files(path: &Path) -> Vec<std::path::PathBuf> {
    let mut files = vec![path.to_owned()];
    let Ok(kc) = Kubeconfig::read_from(path) else {
        return files;
    };
    let dir = path.parent().unwrap_or(Path::new("/"));
    let named = kc
        .auth_infos
        .iter()
        .filter_map(|a| a.auth_info.as_ref())
        .flat_map(|a| [a.client_certificate.clone(), a.client_key.clone()])
        .chain(
            kc.clusters
                .iter()
                .filter_map(|c| c.cluster.as_ref())
                .map(|c| c.certificate_authority.clone()),
        )
        .flatten();
    files.extend(named.map(|f| dir.join(f)));
    files
}

/// The stamps of `files` (see [`stamp`]), for noticing a rotation.
pub fn stamps(files: &[std::path::PathBuf]) -> Vec<Option<(std::time::SystemTime, u64)>> {
    files.iter().map(|f| stamp(f)).collect()
}

/// The watch client's read timeout: longer than any watch request ginx makes (290 s).
const WATCH_READ_SECONDS: u64 = 300;

/// What identifies a kubeconfig file's version, to notice it being written or rotated.
pub fn stamp(path: &Path) -> Option<(std::time::SystemTime, u64)> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_broken_kubeconfig_is_named_by_position_without_its_contents() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("admin.conf");
        std::fs::write(
            &path,
            "apiVersion: v1\nusers:\n- name: ginx\n  user:\n    token: sekrit-token-value\n   bad: [\n",
        )
        .unwrap();
        let e = client_config(&path, None, std::time::Duration::from_secs(1))
            .await
            .unwrap_err();
        assert!(!e.contains("sekrit"), "{e}");
        assert!(
            e.starts_with(&format!("kubeconfig {}:", path.display()))
                && e.contains("not a valid kubeconfig"),
            "{e}"
        );
    }
}
