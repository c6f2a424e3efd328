//! `ginxctl bootstrap`: the stages of `[bootstrap]` applied to the cluster in order, each waited
//! for, progress printed line by line. Runs on the node, as root, with `bootstrap.kubeconfig`
//! (default `kubeadm.admin_kubeconfig`); manifests in a source's checkout are read through the
//! daemon, absolute ones from the file system. Exit 0 when every stage holds, 1 when one does
//! not (naming the objects), 2 when the API (or ginx, for a source's file) cannot be reached.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use crate::bootstrap::{Bootstrap, Failure, Prepared};
use crate::config::{self, BootstrapConfig, Config};
use crate::control::client::Client;
use crate::control::protocol::{Command, SourceFileReport};

pub fn main(config_path: &Path, client: &Client, dry_run: bool, only: Option<String>) -> ExitCode {
    match run(config_path, client, dry_run, only) {
        Ok(()) => ExitCode::SUCCESS,
        Err((message, code)) => {
            eprintln!("ginxctl bootstrap: {message}");
            ExitCode::from(code)
        }
    }
}

fn prepare(
    cfg: &Config,
    client: &Client,
    only: Option<&str>,
) -> Result<Vec<Prepared>, (String, u8)> {
    let stages: Vec<&config::Stage> = cfg
        .bootstrap
        .stages
        .iter()
        .filter(|s| only.is_none_or(|o| o == s.name))
        .collect();
    if stages.is_empty() {
        let names: Vec<&str> = cfg
            .bootstrap
            .stages
            .iter()
            .map(|s| s.name.as_str())
            .collect();
        return Err((
            match only {
                Some(o) => format!(
                    "no stage {o:?} in [bootstrap]; the stages are: {}",
                    names.join(", ")
                ),
                None => "no [[bootstrap.stages]] configured; nothing to do".to_owned(),
            },
            1,
        ));
    }
    let mut out = Vec::new();
    for s in stages {
        let (origin, text) = match &s.source {
            Some(source) => {
                let r: SourceFileReport = client
                    .call(Command::SourceFile {
                        source: source.clone(),
                        path: s.path.clone(),
                    })
                    .map_err(|e| {
                        (
                            format!(
                                "stage {}: reading {source}:{} through ginx: {e}",
                                s.name, s.path
                            ),
                            e.exit_code(),
                        )
                    })?;
                (
                    format!("{source}:{}@{}", r.path, r.revision.short()),
                    r.content,
                )
            }
            None => (
                s.path.clone(),
                std::fs::read_to_string(&s.path)
                    .map_err(|e| (format!("stage {}: cannot read {}: {e}", s.name, s.path), 1))?,
            ),
        };
        out.push(Prepared {
            name: s.name.clone(),
            origin,
            text,
            waits: BootstrapConfig::waits(s),
            timeout: s.timeout.get(),
        });
    }
    Ok(out)
}

fn run(
    config_path: &Path,
    client: &Client,
    dry_run: bool,
    only: Option<String>,
) -> Result<(), (String, u8)> {
    let cfg = config::load(config_path)
        .map_err(|e| (e.to_string(), 1))?
        .config;
    let stages = prepare(&cfg, client, only.as_deref())?;
    let kubeconfig = cfg
        .bootstrap
        .kubeconfig
        .clone()
        .unwrap_or_else(|| cfg.kubeadm.admin_kubeconfig.clone());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| (e.to_string(), 1))?;
    let holder = cfg.node_name().to_owned();
    runtime.block_on(async move {
        let kc = crate::kube::client_config(&kubeconfig, None, Duration::from_secs(10))
            .await
            .map_err(|e| (e, 2))?;
        let client = kube::Client::try_from(kc).map_err(|e| (e.to_string(), 2))?;
        let mut b = Bootstrap::new(client, dry_run, &holder);
        let code = |f: Failure| match f {
            Failure::Stage(m) => (m, 1),
            Failure::Api(m) => (
                format!("{m}; is the API server up? (credentials: {})", kubeconfig.display()),
                2,
            ),
        };
        let mut recorded = b.recorded().await.map_err(code)?;
        // Nothing to apply: the waits are only read, and the lock (a write) is not needed.
        let writes = stages
            .iter()
            .any(|s| recorded.get(&s.name) != Some(&crate::bootstrap::checksum(&s.text)));
        if writes {
            b.lock().await.map_err(code)?;
        }
        let mut progress = |line: &str| {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{line}");
            let _ = out.flush();
        };
        let result = async {
            for s in &stages {
                b.stage(s, &mut recorded, &mut progress).await?;
            }
            Ok::<(), Failure>(())
        }
        .await;
        if writes {
            b.unlock().await;
        }
        result.map_err(code)?;
        progress(if dry_run {
            "bootstrap: every stage accepted by the API (dry run: nothing written, nothing waited for)"
        } else {
            "bootstrap: every stage holds"
        });
        Ok(())
    })
}
