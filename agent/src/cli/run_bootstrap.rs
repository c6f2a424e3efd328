//! `ginxctl bootstrap`: the stages of `[bootstrap]` applied to the cluster in order, each waited
//! for, progress printed line by line. Runs on the node, as root, with `bootstrap.kubeconfig`
//! (default `kubeadm.admin_kubeconfig`); manifests in a source's checkout are read through the
//! daemon, absolute ones from the file system. Exit 0 when every stage holds, 1 when one does
//! not (naming the objects), 2 when the API (or ginx, for a source's file) cannot be reached.

use std::io::{IsTerminal, Write};
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use super::render;
use crate::bootstrap::flux::PullSecret;
use crate::bootstrap::{Bootstrap, Event, Failure, Prepared};
use crate::config::{self, BootstrapConfig, Config};
use crate::control::client::{Client, ClientError};
use crate::control::protocol::{Command, SourceFileReport};
use crate::status::{BootstrapPhase, BootstrapStatus};

pub fn main(config_path: &Path, client: &Client, dry_run: bool, only: Option<String>) -> ExitCode {
    let opts = Options {
        dry_run,
        only,
        wait_for_api: None,
    };
    match run(config_path, client, opts) {
        Ok(()) => ExitCode::SUCCESS,
        Err((message, code)) => {
            eprintln!("ginxctl bootstrap: {}", render::terminal_safe(&message));
            ExitCode::from(code)
        }
    }
}

/// The stage `[bootstrap.flux]` generates, with the source's credentials read from their files
/// (as root); their contents never reach a message.
fn flux_stage(cfg: &Config, f: &config::FluxConfig) -> Result<Prepared, (String, u8)> {
    let src = cfg.sources.get(&f.source).ok_or_else(|| {
        (
            format!("bootstrap.flux.source {:?} names no source", f.source),
            1,
        )
    })?;
    let url = match &f.url {
        Some(u) => u.clone(),
        None => {
            let remote = src.remotes().into_iter().next().ok_or_else(|| {
                (
                    format!("source {} has no URL for bootstrap.flux", f.source),
                    1,
                )
            })?;
            if remote.has_inline_credentials() {
                return Err((
                    format!(
                        "the URL of source {} carries credentials ({remote}); Flux would get them \
                         in the FluxInstance: give them as token_file, or set bootstrap.flux.url",
                        f.source
                    ),
                    1,
                ));
            }
            flux_url(remote.as_git_url())
        }
    };
    let git_ref = f
        .git_ref
        .clone()
        .unwrap_or_else(|| format!("refs/heads/{}", src.branch));
    let read = |p: &Path, what: &str| {
        std::fs::read_to_string(p).map_err(|e| {
            (
                format!(
                    "cannot read {} (source {}'s {what}): {e}",
                    p.display(),
                    f.source
                ),
                1,
            )
        })
    };
    let secret = if let Some(t) = &src.token_file {
        Some(PullSecret::Token {
            username: src.username.clone(),
            password: read(t, "token_file")?.trim().to_owned(),
        })
    } else if let Some(k) = &src.ssh_key_file {
        Some(PullSecret::Ssh {
            identity: read(k, "ssh_key_file")?,
            known_hosts: read(&src.known_hosts_file, "known_hosts_file")?,
        })
    } else {
        None
    };
    Ok(Prepared {
        name: "flux".into(),
        origin: "[bootstrap.flux]".into(),
        text: crate::bootstrap::flux::render(f, &url, &git_ref, secret.as_ref()),
        waits: vec![config::Wait::Ready {
            group: "fluxcd.controlplane.io".into(),
            kind: "FluxInstance".into(),
            namespace: crate::bootstrap::flux::NAMESPACE.into(),
            name: crate::bootstrap::flux::NAME.into(),
        }],
        timeout: f.timeout.get(),
    })
}

/// A remote as Flux's GitRepository wants it: `user@host:path` becomes `ssh://user@host/path`.
fn flux_url(raw: &str) -> String {
    if raw.contains("://") || raw.starts_with('/') {
        return raw.to_owned();
    }
    match raw.split_once(':') {
        Some((host, path)) if host.contains('@') => {
            format!("ssh://{host}/{}", path.trim_start_matches('/'))
        }
        _ => raw.to_owned(),
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
    let flux = cfg
        .bootstrap
        .flux
        .as_ref()
        .filter(|_| only.is_none_or(|o| o == "flux"));
    if stages.is_empty() && flux.is_none() {
        let mut names: Vec<&str> = cfg
            .bootstrap
            .stages
            .iter()
            .map(|s| s.name.as_str())
            .collect();
        if cfg.bootstrap.flux.is_some() {
            names.push("flux");
        }
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
    if let Some(f) = flux {
        out.push(flux_stage(cfg, f)?);
    }
    Ok(out)
}

/// Where the output goes: lines as they come; on a terminal, the wait under way as one live
/// line redrawn at every look (with the time it has taken), cleared before the next line.
/// Each step is also reported to the daemon for `ginxctl status` (not for a dry run).
struct Progress {
    /// Reports go through a client of their own with a short timeout: a daemon that does not
    /// answer never holds the run up (the Lease, the waits, Ctrl-C).
    client: Client,
    tty: bool,
    /// A live line is on the terminal.
    live: bool,
    /// The last wait printed (off a terminal, a wait is printed when what it says changes).
    said: String,
    report: Option<BootstrapStatus>,
    /// The last report did not reach the daemon (said once; sent again at the next step).
    unsent: bool,
}

/// How long one progress report may take.
const REPORT_TIMEOUT: Duration = Duration::from_secs(2);

/// The terminal's width in columns (80 when it cannot be told).
fn columns() -> usize {
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    // SAFETY: TIOCGWINSZ writes a winsize into the valid struct given.
    let rc = unsafe { libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut ws) };
    if rc == 0 && ws.ws_col > 0 {
        usize::from(ws.ws_col)
    } else {
        80
    }
}

impl Progress {
    fn new(client: &Client, dry_run: bool, only: Option<&str>) -> Self {
        let now = crate::util::now();
        Self {
            client: client.with_timeout(REPORT_TIMEOUT),
            tty: std::io::stdout().is_terminal(),
            live: false,
            said: String::new(),
            report: (!dry_run).then(|| BootstrapStatus {
                phase: BootstrapPhase::Applying,
                started_at: Some(now),
                only: only.map(str::to_owned),
                ..BootstrapStatus::pending()
            }),
            unsent: false,
        }
    }

    fn print(&mut self, line: &str) {
        let mut out = std::io::stdout().lock();
        if self.live {
            let _ = write!(out, "\r\x1b[2K");
            self.live = false;
        }
        let _ = writeln!(out, "{}", render::terminal_safe(line));
        let _ = out.flush();
    }

    fn event(&mut self, e: Event<'_>) {
        match e {
            Event::Line(l) => self.print(l),
            Event::Stage(name) => {
                self.said.clear();
                self.update(|r| {
                    r.phase = BootstrapPhase::Applying;
                    r.stage = Some(name.to_owned());
                    r.waiting_for = None;
                });
            }
            Event::Satisfied(name) => {
                self.said.clear();
                self.update(|r| {
                    r.done.push(name.to_owned());
                    r.waiting_for = None;
                });
            }
            Event::Waiting { wait, why, since } => {
                let what = format!("{wait}: {why}");
                if self.tty {
                    // One physical row: no line breaks, cut to the terminal's width.
                    let line = format!(
                        "  waiting for {} ({}s)",
                        render::one_line(&what),
                        since.elapsed().as_secs()
                    );
                    let cut: String = line.chars().take(columns().saturating_sub(1)).collect();
                    let mut out = std::io::stdout().lock();
                    let _ = write!(out, "\r\x1b[2K{cut}");
                    let _ = out.flush();
                    self.live = true;
                } else if what != self.said {
                    self.print(&format!("  waiting for {what}"));
                }
                if what != self.said {
                    self.said = what.clone();
                    self.update(|r| {
                        r.phase = BootstrapPhase::Waiting;
                        r.waiting_for = Some(what);
                    });
                }
            }
        }
    }

    /// Changes the report and sends it. A daemon that refuses it (another run's progress is
    /// under way there) is said once and not asked again; one that cannot be reached (it may
    /// be restarting) is said once, and the whole report goes again at the next step.
    fn update(&mut self, change: impl FnOnce(&mut BootstrapStatus)) {
        let Some(r) = self.report.as_mut() else {
            return;
        };
        change(r);
        let report = r.clone();
        match self
            .client
            .call::<serde_json::Value>(Command::BootstrapReport { report })
        {
            Ok(_) => self.unsent = false,
            Err(ClientError::Daemon(b)) => {
                self.report = None;
                self.print(&format!(
                    "(progress is not kept in `ginxctl status`: {})",
                    b.message
                ));
            }
            Err(e) => {
                if !self.unsent {
                    self.print(&format!(
                        "(progress did not reach `ginxctl status`: {e}; trying again at the next step)"
                    ));
                }
                self.unsent = true;
            }
        }
    }

    /// The run's end, reported.
    fn finish(&mut self, error: Option<&str>) {
        self.update(|r| {
            r.phase = if error.is_some() {
                BootstrapPhase::Failed
            } else {
                BootstrapPhase::Done
            };
            r.error = error.map(|e| e.chars().take(4096).collect());
            r.waiting_for = None;
            if error.is_none() {
                r.stage = None;
            }
            r.finished_at = Some(crate::util::now());
        });
    }
}

/// How `ginxctl bootstrap` runs.
pub struct Options {
    pub dry_run: bool,
    /// Only this stage.
    pub only: Option<String>,
    /// Wait this long for the API to answer first (after `kubeadm init`).
    pub wait_for_api: Option<Duration>,
}

/// Exit code of a run stopped by Ctrl-C (128 + SIGINT, as a shell reports it).
const INTERRUPTED: u8 = 130;

pub fn run(config_path: &Path, client: &Client, opts: Options) -> Result<(), (String, u8)> {
    let cfg = config::load(config_path)
        .map_err(|e| (e.to_string(), 1))?
        .config;
    let stages = prepare(&cfg, client, opts.only.as_deref())?;
    let kubeconfig = cfg
        .bootstrap
        .kubeconfig
        .clone()
        .unwrap_or_else(|| cfg.kubeadm.admin_kubeconfig.clone());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| (e.to_string(), 1))?;
    let holder = Bootstrap::holder(cfg.node_name());
    let dry_run = opts.dry_run;
    let mut progress = Progress::new(client, dry_run, opts.only.as_deref());
    let result = runtime.block_on(async {
        let kc = crate::kube::client_config(&kubeconfig, None, Duration::from_secs(10))
            .await
            .map_err(|e| (e, 2))?;
        // The server as the kubeconfig names it (a URL there carries no credentials).
        let server = kc.cluster_url.to_string();
        let code = |f: Failure| match f {
            Failure::Stage(m) => (m, 1),
            Failure::Api(m) => (
                format!(
                    "{m}; is the API server at {server} up? (credentials: {})",
                    kubeconfig.display()
                ),
                2,
            ),
        };
        let api = kube::Client::try_from(kc).map_err(|e| (e.to_string(), 2))?;
        let mut b = Bootstrap::new(api, dry_run, &holder);
        let deadline = opts.wait_for_api.map(|d| Instant::now() + d);
        let mut recorded = loop {
            match b.recorded().await {
                Err(Failure::Api(m)) if deadline.is_some_and(|d| Instant::now() < d) => {
                    progress.print(&format!("waiting for the API server to answer: {m}"));
                    tokio::time::sleep(Duration::from_secs(3)).await;
                }
                r => break r.map_err(code)?,
            }
        };
        // Nothing to apply: the waits are only read, and the lock (a write) is not needed.
        let writes = stages
            .iter()
            .any(|s| recorded.get(&s.name) != Some(&crate::bootstrap::checksum(&s.text)));
        if writes {
            b.lock().await.map_err(code)?;
        }
        let outcome = tokio::select! {
            r = async {
                for s in &stages {
                    b.stage(s, &mut recorded, &mut |e| progress.event(e)).await?;
                }
                Ok::<(), Failure>(())
            } => r.map_err(code),
            Ok(()) = tokio::signal::ctrl_c() => Err((
                "interrupted; stages that held are recorded, run `ginxctl bootstrap` again to go on"
                    .to_owned(),
                INTERRUPTED,
            )),
        };
        if writes {
            b.unlock().await;
        }
        outcome
    });
    match &result {
        Ok(()) => {
            progress.finish(None);
            progress.print(if dry_run {
                "bootstrap: every stage accepted by the API (dry run: nothing written, nothing waited for)"
            } else {
                "bootstrap: every stage holds"
            });
        }
        Err((m, _)) => {
            if progress.live {
                progress.print("");
            }
            progress.finish(Some(m));
        }
    }
    result
}

#[cfg(test)]
mod tests {
    use super::flux_url;

    #[test]
    fn scp_like_remotes_become_ssh_urls_for_flux() {
        assert_eq!(
            flux_url("git@git.example.com:infra/argus.git"),
            "ssh://git@git.example.com/infra/argus.git"
        );
        assert_eq!(
            flux_url("https://git.example.com/argus.git"),
            "https://git.example.com/argus.git"
        );
        assert_eq!(flux_url("ssh://git@h:2222/a.git"), "ssh://git@h:2222/a.git");
    }
}
