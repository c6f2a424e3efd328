//! `ginxctl cluster` without a daemon: the fleet read straight from the API with the operator's
//! own kubeconfig (`--kubeconfig`, or as the `kubectl-ginx` plugin `KUBECONFIG` or
//! `~/.kube/config`), no socket and no root; and `--watch`, which redraws the view as the
//! rollout moves, from the daemon or from the API.
//!
//! The view is the daemon's (`rollout::cluster::view`, rendered by `render::cluster`), so the
//! output is the same as on a node. Only the heartbeat ages differ at first: a node's ginx has
//! watched the Leases for a while and knows how long each has been unchanged; a fresh ginxctl
//! learns it over its first redraws (`-` until then), on its own monotonic clock.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Mutex;
use std::time::Duration;

use super::render;
use crate::config::{self, Config};
use crate::control::client::Client;
use crate::control::protocol::Command;
use crate::rollout::lock::slots::Observed;
use crate::status::ClusterView;

/// How `ginxctl cluster` runs.
pub struct Options {
    pub json: bool,
    /// Read the API with this kubeconfig instead of asking the daemon.
    pub kubeconfig: Option<PathBuf>,
    pub context: Option<String>,
    /// Redraw every `interval` until interrupted.
    pub watch: Option<Duration>,
}

/// Where the view comes from.
enum From<'a> {
    Daemon(&'a Client),
    Api {
        client: kube::Client,
        cfg: Box<Config>,
        observed: Mutex<Observed>,
    },
}

/// The kubeconfig a `kubectl-ginx` plugin uses, as kubectl does: `KUBECONFIG`'s first file,
/// else `~/.kube/config`.
pub fn kubectl_kubeconfig(env: Option<&str>, home: Option<&Path>) -> Option<PathBuf> {
    env.and_then(|v| v.split(':').find(|s| !s.is_empty()))
        .map(PathBuf::from)
        .or_else(|| home.map(|h| h.join(".kube/config")))
}

/// The namespace and names (`[kubernetes]`, `[rollout]`) from the configuration at `path`, read
/// leniently (a workstation's file has no sources); the defaults when there is none. A file
/// that cannot be read or parsed is an error that names it.
fn cluster_config(path: &Path) -> Result<Config, String> {
    config::peek_cluster(path).map_err(|e| e.to_string())
}

pub fn main(config_path: &Path, daemon: &Client, timeout: Duration, opts: Options) -> ExitCode {
    let rt = match super::runtime() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let from = match &opts.kubeconfig {
        None => From::Daemon(daemon),
        Some(path) => {
            let cfg = match cluster_config(config_path) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("ginxctl: {}", render::terminal_safe(&e));
                    return ExitCode::from(2);
                }
            };
            let client = rt.block_on(async {
                let kc = crate::kube::client_config(
                    path,
                    opts.context.clone(),
                    cfg.kubernetes.request_timeout.get(),
                )
                .await?;
                kube::Client::try_from(kc).map_err(|e| {
                    format!(
                        "kubeconfig {}: {}",
                        path.display(),
                        crate::k8s::describe(&e)
                    )
                })
            });
            match client {
                Ok(client) => From::Api {
                    client,
                    cfg: Box::new(cfg),
                    observed: Mutex::new(Observed::default()),
                },
                Err(e) => {
                    eprintln!("ginxctl: {}", render::terminal_safe(&e));
                    return ExitCode::from(2);
                }
            }
        }
    };
    let look = || {
        rt.block_on(async {
            match &from {
                From::Daemon(c) => {
                    if opts.json {
                        c.call_raw(Command::Cluster)
                            .map(|v| render::pretty(&v))
                            .map_err(|e| (e.exit_code(), e.to_string()))
                    } else {
                        c.call::<ClusterView>(Command::Cluster)
                            .map(|v| render::cluster(&v))
                            .map_err(|e| (e.exit_code(), e.to_string()))
                    }
                }
                From::Api {
                    client,
                    cfg,
                    observed,
                } => {
                    let view = tokio::time::timeout(
                        timeout,
                        crate::rollout::cluster::view(client, cfg, observed),
                    )
                    .await
                    .unwrap_or_else(|_| {
                        Err(format!(
                            "no answer from the API within {}s",
                            timeout.as_secs()
                        ))
                    })
                    .map_err(|e| (1, e))?;
                    Ok(if opts.json {
                        render::pretty(&serde_json::to_value(&view).unwrap_or_default())
                    } else {
                        render::cluster(&view)
                    })
                }
            }
        })
    };
    let Some(every) = opts.watch else {
        return match look() {
            Ok(out) => {
                let _ = std::io::stdout().write_all(render::terminal_safe(&out).as_bytes());
                ExitCode::SUCCESS
            }
            Err((code, e)) => {
                eprintln!("ginxctl: {}", render::terminal_safe(&e));
                ExitCode::from(code)
            }
        };
    };
    watch(look, every)
}

/// Redraws `look` every `every` until Ctrl-C (or a closed pipe): on a terminal in place, else
/// each view that differs from the last, under a line with the time. A failed look is shown
/// and tried again.
fn watch(look: impl Fn() -> Result<String, (u8, String)>, every: Duration) -> ExitCode {
    let tty = std::io::stdout().is_terminal();
    let mut last = String::new();
    let interrupted = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    {
        let flag = std::sync::Arc::clone(&interrupted);
        // SIGINT ends the loop between looks (the default action would leave the terminal
        // mid-redraw).
        let _ = ctrlc_flag(flag);
    }
    loop {
        let text = match look() {
            Ok(t) => t,
            Err((_, e)) => format!("ginxctl: {e} (trying again)\n"),
        };
        let text = render::terminal_safe(&text);
        let mut out = std::io::stdout().lock();
        let written = if tty {
            let now = crate::util::now().strftime("%H:%M:%S");
            write!(
                out,
                "\x1b[H\x1b[2J{text}\nevery {}s, {now}; Ctrl-C ends\n",
                every.as_secs()
            )
        } else if text != last {
            write!(out, "--- {}\n{text}", crate::util::now())
        } else {
            Ok(())
        };
        if written.and_then(|()| out.flush()).is_err() {
            return ExitCode::SUCCESS;
        }
        drop(out);
        last = text;
        let until = std::time::Instant::now() + every;
        while std::time::Instant::now() < until {
            if interrupted.load(std::sync::atomic::Ordering::Relaxed) {
                return ExitCode::SUCCESS;
            }
            std::thread::sleep(Duration::from_millis(100).min(every));
        }
    }
}

/// Sets `flag` on SIGINT and SIGTERM instead of dying at once.
fn ctrlc_flag(flag: std::sync::Arc<std::sync::atomic::AtomicBool>) -> Result<(), String> {
    static FLAG: std::sync::OnceLock<std::sync::Arc<std::sync::atomic::AtomicBool>> =
        std::sync::OnceLock::new();
    let _ = FLAG.set(flag);
    extern "C" fn on_signal(_: libc::c_int) {
        if let Some(f) = FLAG.get() {
            f.store(true, std::sync::atomic::Ordering::Relaxed);
        }
    }
    use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};
    let action = SigAction::new(
        SigHandler::Handler(on_signal),
        SaFlags::empty(),
        SigSet::empty(),
    );
    for s in [Signal::SIGINT, Signal::SIGTERM] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe { sigaction(s, &action) }.map_err(|e| e.to_string())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_workstations_configuration_needs_only_the_cluster_names() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        // No sources, no node: the daemon would refuse it; the fleet view reads its names.
        std::fs::write(&path, "[kubernetes]\nnamespace = \"fleet-ws\"\n").unwrap();
        let c = cluster_config(&path).unwrap();
        assert_eq!(c.kubernetes.namespace, "fleet-ws");
        assert_eq!(c.rollout.configmap, "ginx-rollout");
        assert_eq!(
            cluster_config(&dir.path().join("none.toml"))
                .unwrap()
                .kubernetes
                .namespace,
            "ginx-system"
        );
        std::fs::write(&path, "[kubernetes]\nnamespace = 3\n").unwrap();
        let e = cluster_config(&path).unwrap_err();
        assert!(e.contains("config.toml") && e.contains("kubernetes"), "{e}");
    }

    #[test]
    fn a_plugin_reads_kubeconfig_as_kubectl_does() {
        let home = Path::new("/home/ann");
        assert_eq!(
            kubectl_kubeconfig(Some("/a/one:/a/two"), Some(home)),
            Some(PathBuf::from("/a/one"))
        );
        assert_eq!(
            kubectl_kubeconfig(Some(""), Some(home)),
            Some(PathBuf::from("/home/ann/.kube/config"))
        );
        assert_eq!(kubectl_kubeconfig(None, None), None);
    }
}
