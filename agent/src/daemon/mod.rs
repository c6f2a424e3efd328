//! Wiring: loads the configuration, starts the pollers, the apply loop and the control socket,
//! talks to systemd (READY, STATUS, WATCHDOG, STOPPING), reloads on SIGHUP or when the
//! configuration files change, and drains on SIGTERM.
//!
//! Layer 8, the only place that knows every part: it hands each worker the services it needs
//! from another (API clients, source files, the status parts). Nothing below imports it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use sd_notify::NotifyState;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{mpsc, watch};

use crate::config::{self, Config};
use crate::control;
use crate::control::server::{self, Backend};
use crate::k8s::KubeClients;
use crate::metrics::Metrics;
use crate::reconcile::{self, Reconciler, Wiring};
use crate::rollout::view::feed::{FleetFeed, Follows};
use crate::source::{self, PollerCmd, PollerConfig, PollerHandle, ReportMap, Workspace};
use crate::status::{self, ApplyState, Published};
use crate::types::{Notice, Notices};
use crate::util;

mod reload;
mod systemd;

use reload::{ConfigWatcher, Reloader, load_config};
pub use systemd::summary;
use systemd::{Note, Notifier, report_status, watchdog};

/// How long a start waits for the state directory's lock before it says another ginx runs.
const LOCK_PATIENCE: std::time::Duration = std::time::Duration::from_secs(2);

/// Takes `<state_dir>/lock`, held for as long as the returned guard lives (the daemon's run).
fn lock_state_dir(dir: &Path) -> anyhow::Result<nix::fcntl::Flock<std::fs::File>> {
    let path = dir.join("lock");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening {}", path.display()))?;
    // A ginx killed a moment ago may have left a child between its fork and its exec, which
    // holds the lock until it execs: a short wait, not a failure.
    let mut file = file;
    let deadline = std::time::Instant::now() + LOCK_PATIENCE;
    let locked = loop {
        match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
            Err((f, nix::errno::Errno::EWOULDBLOCK)) if std::time::Instant::now() < deadline => {
                file = f;
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            other => break other,
        }
    };
    locked.map_err(|(_, e)| {
        if e == nix::errno::Errno::EWOULDBLOCK {
            anyhow::anyhow!(
                "another ginx is running with state_dir {} (it holds {}); stop it first",
                dir.display(),
                path.display()
            )
        } else {
            anyhow::anyhow!("cannot lock {}: {e}", path.display())
        }
    })
}

/// How the daemon ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Ending {
    /// SIGTERM or SIGINT.
    Stopped,
    /// A new version of ginx was activated: run it.
    Restart(crate::reconcile::SelfRestart),
}

/// How long after start ginx gives back the code pages start-up touched
/// ([`util::memory::release_code_pages`]): by then the first fetches and apply are usually done.
pub const RELEASE_CODE_PAGES_AFTER: Duration = Duration::from_secs(120);

/// The command channels of the running pollers, by source name.
type PollerChannels = Arc<Mutex<BTreeMap<String, mpsc::Sender<PollerCmd>>>>;

/// Runs the daemon until SIGTERM/SIGINT, or until a new version of ginx must take over.
/// Errors are start-up failures.
pub async fn run(config_path: PathBuf) -> anyhow::Result<Ending> {
    let cfg = load_at_start(&config_path).await?;
    private_state_dir(&cfg.state_dir)?;
    // Before anything touches the state: a second ginx on the same state_dir must not, say,
    // stop the first one's running apply as if it were left over.
    let _lock = lock_state_dir(&cfg.state_dir)?;
    let (config_tx, config_rx) = watch::channel(Arc::clone(&cfg));
    let started = start(&cfg, config_rx).await?;
    let Started {
        shutdown,
        sources,
        restart,
        backend,
        commands,
        reconciler_task,
        server_task,
    } = started;

    let notifier = Notifier::start();
    notifier.send(Note::Ready);
    tracing::info!(socket = %cfg.socket.display(), "ready");
    tokio::spawn(report_status(
        Arc::clone(&backend),
        notifier.clone(),
        shutdown.subscribe(),
    ));
    if let Some(period) = sd_notify::watchdog_enabled() {
        tokio::spawn(watchdog(
            period,
            commands,
            notifier.clone(),
            shutdown.subscribe(),
        ));
    }

    let (changes_tx, changes_rx) = mpsc::channel::<()>(16);
    let mut reloads = Reloads {
        watcher: ConfigWatcher::new(&config_path, changes_tx),
        changes: changes_rx,
        reloader: Reloader {
            path: config_path,
            config: config_tx,
        },
        sources,
    };
    let ending = reloads.until_ending(restart).await?;

    notifier.send(Note::Stopping);
    notifier.send(Note::Status("stopping".into()));
    tracing::info!("stopping: no more fetches; waiting for a running apply");
    let _ = shutdown.send(true);
    drop(reloads.watcher);
    reloads.sources.stop_all();
    if let Err(e) = reconciler_task.await {
        tracing::error!(error = %e, "apply loop ended abnormally");
    }
    let _ = server_task.await;
    notifier.flush();
    tracing::info!("stopped");
    Ok(ending)
}

/// Loads the configuration for a start, says what starts, and sets what the configuration
/// sets process-wide (the network timeout of the fetches).
async fn load_at_start(config_path: &Path) -> anyhow::Result<Arc<Config>> {
    let loaded = load_config(config_path).await?;
    let cfg = Arc::new(loaded.config);
    tracing::info!(
        node = cfg.node_name(),
        version = crate::version(),
        files = ?loaded.files,
        "starting ginx"
    );
    if let Some(t) = cfg.sources.values().map(|s| s.fetch_timeout.get()).min() {
        source::set_network_timeout(t);
    }
    Ok(cfg)
}

/// What [`start`] hands back to [`run`]: what it needs to wait for the end and to stop.
struct Started {
    /// Set to `true` to stop every task.
    shutdown: watch::Sender<bool>,
    sources: Sources,
    /// Set by the apply loop when a new version of ginx must take over.
    restart: watch::Receiver<Option<crate::reconcile::SelfRestart>>,
    backend: Arc<Backend>,
    /// The apply loop's command channel (the watchdog pings it).
    commands: mpsc::Sender<reconcile::Command>,
    reconciler_task: tokio::task::JoinHandle<()>,
    server_task: tokio::task::JoinHandle<()>,
}

/// What most parts of the daemon are handed, made once at start.
struct Shared {
    config: watch::Receiver<Arc<Config>>,
    shutdown: watch::Receiver<bool>,
    metrics: Arc<Metrics>,
    notices: Notices,
    statuses: Arc<ReportMap>,
    health: Arc<watch::Sender<status::HealthMap>>,
    kube: watch::Receiver<Option<KubeClients>>,
    observed: Arc<Mutex<crate::rollout::lock::slots::Observed>>,
    /// The sources' clones.
    workspace: Arc<Workspace>,
    pollers: PollerChannels,
}

/// The apply loop, not started yet, and the other ends of its channels.
struct ApplyLoop {
    reconciler: Reconciler,
    commands: mpsc::Sender<reconcile::Command>,
    published: watch::Receiver<Published>,
    /// Set when a new version of ginx must take over.
    restart: watch::Receiver<Option<crate::reconcile::SelfRestart>>,
    /// Set while a health gate is open: how often the probes must run.
    fast_probes: watch::Receiver<Option<Duration>>,
}

/// Makes the apply loop, which loads the state from `state_dir` (the error says so).
fn apply_loop(shared: &Shared, state_dir: &Path, fleet: FleetFeed) -> anyhow::Result<ApplyLoop> {
    let (published_tx, published_rx) = watch::channel(Published::default());
    let (commands_tx, commands_rx) = mpsc::channel(32);
    let (restart_tx, restart_rx) = watch::channel(None);
    let (fast_probes_tx, fast_probes_rx) = watch::channel(None);
    let reconciler = Reconciler::new(Wiring {
        rollout: crate::rollout::Wiring {
            config: shared.config.clone(),
            kube: shared.kube.clone(),
            health: shared.health.subscribe(),
            fast_probes: fast_probes_tx,
            reach_source: Some(reach_apply_source(
                shared.config.clone(),
                Arc::clone(&shared.pollers),
            )),
            observed: Arc::clone(&shared.observed),
            metrics: Arc::clone(&shared.metrics),
            later: Some(later_in(
                shared.config.clone(),
                Arc::clone(&shared.workspace),
            )),
            notices: shared.notices.clone(),
            fleet,
        },
        metrics: Arc::clone(&shared.metrics),
        notices: shared.notices.clone(),
        config: shared.config.clone(),
        sources: shared.statuses.subscribe(),
        workspace: Arc::clone(&shared.workspace),
        commands: commands_rx,
        published: published_tx,
        shutdown: shared.shutdown.clone(),
        restart: restart_tx,
        kube: shared.kube.clone(),
    })
    .with_context(|| format!("loading state from {}", state_dir.display()))?;
    Ok(ApplyLoop {
        reconciler,
        commands: commands_tx,
        published: published_rx,
        restart: restart_rx,
        fast_probes: fast_probes_rx,
    })
}

/// Starts every part of the daemon, from the pollers to the control socket: everything that
/// runs until shutdown.
async fn start(cfg: &Arc<Config>, config: watch::Receiver<Arc<Config>>) -> anyhow::Result<Started> {
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let workspace = Workspace::new(cfg.state_dir.clone());
    let metrics = Metrics::new();
    // What happens on this node, for the Events and the webhooks (subscribed before anything
    // can emit, so that nothing is missed).
    let notices = Notices::new();
    spawn_notice_counter(&notices, &metrics);
    spawn_code_page_release();
    let events_rx = notices.subscribe();
    let metrics_listener = match cfg.metrics.listen {
        Some(addr) => Some(control::metrics::bind(addr).await?),
        None => None,
    };
    let (kube_clients_tx, kube_clients_rx) = watch::channel(None);
    let shared = Shared {
        config,
        shutdown: shutdown_rx,
        metrics,
        notices,
        statuses: Arc::new(watch::channel(BTreeMap::new()).0),
        health: Arc::new(watch::channel(status::HealthMap::new()).0),
        kube: kube_clients_rx,
        observed: Arc::new(Mutex::new(crate::rollout::lock::slots::Observed::default())),
        workspace,
        pollers: Arc::new(Mutex::new(BTreeMap::new())),
    };
    let (kube_status_tx, kube_status_rx) = watch::channel(status::KubeStatus::default());
    let fleet = spawn_fleet_feed(&shared, kube_status_rx.clone());
    let ApplyLoop {
        reconciler,
        commands: commands_tx,
        published: published_rx,
        restart: restart_rx,
        fast_probes: fast_probes_rx,
    } = apply_loop(&shared, &cfg.state_dir, fleet.clone())?;
    let listener = server::bind(&cfg.socket, &cfg.control.group)?;

    let sources = Sources::start(&shared, cfg);

    let (kubeadm_tx, kubeadm_rx) = watch::channel(None);
    let bootstrap_file = cfg.state_dir.join("bootstrap.json");
    let (bootstrap_tx, bootstrap_rx) = watch::channel(server::load_bootstrap(&bootstrap_file));
    let (previews_tx, previews_rx) = watch::channel(Vec::new());
    let parts = status::Parts {
        config: shared.config.clone(),
        sources: shared.statuses.subscribe(),
        published: published_rx,
        health: shared.health.subscribe(),
        kubernetes: kube_status_rx,
        kubeadm: kubeadm_rx,
        bootstrap: bootstrap_rx,
        previews: previews_rx,
        metrics_listen: metrics_listener.as_ref().and_then(|l| l.local_addr().ok()),
        started_at: util::now(),
    };
    let backend = Arc::new(Backend {
        parts: parts.clone(),
        reconciler: commands_tx.clone(),
        pollers: Arc::clone(&shared.pollers),
        workspace: Arc::clone(&shared.workspace),
        kube: shared.kube.clone(),
        bootstrap: bootstrap_tx,
        bootstrap_file,
        observed: Arc::clone(&shared.observed),
        notices: shared.notices.clone(),
    });
    spawn_kubeadm_watcher(&shared, kubeadm_tx);
    if let Some(rx) = events_rx {
        spawn_event_recorder(&shared, rx);
    }
    tokio::spawn(crate::notify::run(
        shared.config.clone(),
        shared.notices.clone(),
        Arc::clone(&shared.metrics),
        shared.shutdown.clone(),
    ));
    spawn_health_probes(&shared, fast_probes_rx);
    spawn_reporter(&shared, parts.clone(), kube_clients_tx, kube_status_tx);
    spawn_previews(&shared, parts.kubernetes.clone(), fleet, previews_tx);
    if let Some(l) = metrics_listener {
        spawn_metrics_server(&shared, l, parts);
    }
    let server_task = tokio::spawn(server::serve(
        listener,
        cfg.socket.clone(),
        Arc::clone(&backend),
        shared.shutdown.clone(),
    ));
    let reconciler_task = tokio::spawn(reconciler.run());
    Ok(Started {
        shutdown: shutdown_tx,
        sources,
        restart: restart_rx,
        backend,
        commands: commands_tx,
        reconciler_task,
        server_task,
    })
}

/// Counts every notice in the metrics, for as long as notices are sent.
fn spawn_notice_counter(notices: &Notices, metrics: &Arc<Metrics>) {
    let Some(mut rx) = notices.subscribe() else {
        return;
    };
    let metrics = Arc::clone(metrics);
    tokio::spawn(async move {
        loop {
            match rx.recv().await {
                Ok(n) => metrics.noticed(n.reason.as_str()),
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            }
        }
    });
}

/// Once start-up is over ([`RELEASE_CODE_PAGES_AFTER`]), gives back the code pages only it
/// touched.
fn spawn_code_page_release() {
    tokio::spawn(async {
        tokio::time::sleep(RELEASE_CODE_PAGES_AFTER).await;
        let before = util::memory::resident_kib();
        match tokio::task::spawn_blocking(util::memory::release_code_pages).await {
            Ok(Ok(advised)) => {
                let mib = |k: Option<u64>| {
                    k.map_or("?".to_owned(), |k| format!("{:.1}", k as f64 / 1024.0))
                };
                tracing::info!(
                    advised_mib = advised / (1 << 20),
                    rss_mib_before = %mib(before),
                    rss_mib_after = %mib(util::memory::resident_kib()),
                    "gave back the code pages start-up touched"
                );
            }
            Ok(Err(e)) => tracing::debug!(error = %e, "cannot give back the start-up code pages"),
            Err(_) => {}
        }
    });
}

/// Starts the kubeadm watcher, which reads the kubeadm configuration from the sources'
/// clones.
fn spawn_kubeadm_watcher(shared: &Shared, status: watch::Sender<Option<status::KubeadmStatus>>) {
    let workspace = Arc::clone(&shared.workspace);
    let read_file: crate::kubeadm::watch::ReadFile = Arc::new(move |name, revision, path| {
        workspace
            .read_file(name, revision, path)
            .map_err(|e| e.to_string())
    });
    tokio::spawn(
        crate::kubeadm::watch::Watcher {
            config: shared.config.clone(),
            sources: shared.statuses.subscribe(),
            read_file,
            kube: shared.kube.clone(),
            status,
            shutdown: shared.shutdown.clone(),
        }
        .run(),
    );
}

/// Starts the recorder that turns this node's notices into Kubernetes Events.
fn spawn_event_recorder(shared: &Shared, notices: tokio::sync::broadcast::Receiver<Notice>) {
    tokio::spawn(
        crate::kube::events::Recorder {
            config: shared.config.clone(),
            clients: shared.kube.clone(),
            notices,
            metrics: Arc::clone(&shared.metrics),
            shutdown: shared.shutdown.clone(),
        }
        .run(),
    );
}

/// Starts the health probes; `fast` says how often they must run while a gate is open.
fn spawn_health_probes(shared: &Shared, fast: watch::Receiver<Option<Duration>>) {
    crate::health::spawn(
        crate::health::Context {
            config: shared.config.clone(),
            kube: shared.kube.clone(),
            fast,
        },
        Arc::clone(&shared.health),
        shared.shutdown.clone(),
    );
}

/// Serves the metrics on `listener`, the state gauges read from `parts` at each scrape.
fn spawn_metrics_server(shared: &Shared, listener: tokio::net::TcpListener, parts: status::Parts) {
    tracing::info!(listen = ?listener.local_addr().ok(), "serving metrics");
    tokio::spawn(control::metrics::serve(
        listener,
        Arc::new(parts),
        Arc::clone(&shared.metrics),
        shared.shutdown.clone(),
    ));
}

/// Starts the one watch of the fleet ConfigMap that the rollout and the plan requests'
/// answerer read, kept while the API accepts the node (`kube`).
fn spawn_fleet_feed(shared: &Shared, kube: watch::Receiver<status::KubeStatus>) -> FleetFeed {
    FleetFeed::spawn(Follows {
        config: shared.config.clone(),
        clients: shared.kube.clone(),
        kube,
        shutdown: shared.shutdown.clone(),
    })
}

/// Starts answering the fleet's plan requests (`ginxctl plan REF`); the answers go to
/// `answers`, which the reporter writes on the heartbeat.
fn spawn_previews(
    shared: &Shared,
    kube: watch::Receiver<status::KubeStatus>,
    fleet: FleetFeed,
    answers: watch::Sender<Vec<crate::types::PreviewAnswer>>,
) {
    tokio::spawn(
        crate::preview::answering::Answering {
            config: shared.config.clone(),
            fleet,
            kube,
            answers,
            shutdown: shared.shutdown.clone(),
        }
        .run(),
    );
}

/// Starts the reporter: it builds the API clients the other parts get through `clients`,
/// and writes the node report and the heartbeat.
fn spawn_reporter(
    shared: &Shared,
    parts: status::Parts,
    clients: watch::Sender<Option<KubeClients>>,
    status: watch::Sender<status::KubeStatus>,
) {
    tokio::spawn(
        crate::kube::reporter::Reporter {
            config: shared.config.clone(),
            parts,
            clients,
            status,
            metrics: Arc::clone(&shared.metrics),
            shutdown: shared.shutdown.clone(),
        }
        .run(),
    );
}

/// What reloads the configuration while the daemon runs, and the pollers it keeps in line.
struct Reloads {
    watcher: Option<ConfigWatcher>,
    /// A configuration file changed (sent by `watcher`).
    changes: mpsc::Receiver<()>,
    reloader: Reloader,
    sources: Sources,
}

impl Reloads {
    /// Reloads on SIGHUP and on changed files until SIGTERM/SIGINT or a restart into a new
    /// version; says which ended it. Errors if a signal handler cannot be installed.
    async fn until_ending(
        &mut self,
        mut restart: watch::Receiver<Option<crate::reconcile::SelfRestart>>,
    ) -> anyhow::Result<Ending> {
        let mut sigterm =
            signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
        let mut sigint =
            signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
        let mut sighup = signal(SignalKind::hangup()).context("installing the SIGHUP handler")?;
        loop {
            tokio::select! {
                _ = sigterm.recv() => return Ok(Ending::Stopped),
                _ = sigint.recv() => return Ok(Ending::Stopped),
                changed = restart.changed() => {
                    if changed.is_ok()
                        && let Some(why) = restart.borrow_and_update().clone()
                    {
                        return Ok(Ending::Restart(why));
                    }
                }
                _ = sighup.recv() => {
                    tracing::info!("SIGHUP: reloading the configuration");
                    self.reloader.reload(&mut self.sources).await;
                }
                Some(()) = self.changes.recv() => {
                    // Editors write in several steps; let them finish.
                    tokio::time::sleep(Duration::from_millis(250)).await;
                    while self.changes.try_recv().is_ok() {}
                    if let Some(w) = self.watcher.as_mut() {
                        w.refresh();
                    }
                    self.reloader.reload(&mut self.sources).await;
                }
            }
        }
    }
}

/// `rollout.after`'s "a later revision": whether one revision descends from another in the
/// apply source's clone (a revision not fetched here yet is not later).
fn later_in(
    config: watch::Receiver<Arc<Config>>,
    workspace: Arc<Workspace>,
) -> crate::rollout::Later {
    Arc::new(move |theirs, ours| {
        let source = config.borrow().apply.source.clone();
        let workspace = Arc::clone(&workspace);
        Box::pin(async move {
            tokio::task::spawn_blocking(move || {
                workspace
                    .clone_of(&source)
                    .descends(&theirs, &ours)
                    .unwrap_or(false)
            })
            .await
            .unwrap_or(false)
        })
    })
}

/// The gate's check that the apply source can still be fetched: a sync of its poller (a real
/// fetch), answered with its error if it failed.
fn reach_apply_source(
    config: watch::Receiver<Arc<Config>>,
    pollers: PollerChannels,
) -> crate::rollout::Reach {
    Arc::new(move || {
        let source = config.borrow().apply.source.clone();
        let tx = pollers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&source)
            .cloned();
        Box::pin(async move {
            let tx = tx.ok_or_else(|| format!("source {source} is not polled"))?;
            let (reply, answer) = tokio::sync::oneshot::channel();
            tx.send(PollerCmd::Sync(reply))
                .await
                .map_err(|_| format!("the poller of {source} is gone"))?;
            let outcome = answer
                .await
                .map_err(|_| format!("the poller of {source} did not answer"))?;
            match outcome.error {
                Some(e) if !outcome.refused => Err(e),
                _ => Ok(()),
            }
        })
    })
}

/// The running pollers, kept in line with the configuration.
struct Sources {
    running: BTreeMap<String, PollerHandle>,
    /// Command channels of the running pollers, shared with the control socket.
    channels: PollerChannels,
    workspace: Arc<Workspace>,
    statuses: Arc<ReportMap>,
    shutdown: watch::Receiver<bool>,
    metrics: Arc<Metrics>,
}

impl Sources {
    /// Starts a poller for every source of `cfg`.
    fn start(shared: &Shared, cfg: &Config) -> Self {
        let mut sources = Self {
            running: BTreeMap::new(),
            channels: Arc::clone(&shared.pollers),
            workspace: Arc::clone(&shared.workspace),
            statuses: Arc::clone(&shared.statuses),
            shutdown: shared.shutdown.clone(),
            metrics: Arc::clone(&shared.metrics),
        };
        sources.reconcile(cfg);
        sources
    }

    /// Starts pollers for new sources, stops removed ones, hands changed settings over.
    fn reconcile(&mut self, cfg: &Config) {
        let removed: Vec<String> = self
            .running
            .keys()
            .filter(|n| !cfg.sources.contains_key(*n))
            .cloned()
            .collect();
        for name in removed {
            if let Some(p) = self.running.remove(&name) {
                p.task.abort();
            }
            self.statuses.send_modify(|m| {
                m.remove(&name);
            });
            tracing::info!(source = %name, "source removed");
        }
        for (name, sc) in &cfg.sources {
            let pc = PollerConfig {
                source: sc.clone(),
                node: cfg.node_name().to_owned(),
                applied: cfg.apply.source == *name,
            };
            match self.running.get(name) {
                Some(p) => {
                    p.config.send_if_modified(|old| {
                        let changed = *old != pc;
                        if changed {
                            *old = pc;
                        }
                        changed
                    });
                }
                None => {
                    let handle = source::spawn_poller(
                        name.clone(),
                        pc,
                        &self.workspace,
                        Arc::clone(&self.statuses),
                        Arc::clone(&self.metrics),
                        self.shutdown.clone(),
                    );
                    self.running.insert(name.clone(), handle);
                }
            }
        }
        let mut channels = self.channels.lock().unwrap_or_else(|p| p.into_inner());
        *channels = self
            .running
            .iter()
            .map(|(n, p)| (n.clone(), p.commands.clone()))
            .collect();
    }

    fn stop_all(&mut self) {
        self.channels
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        for (_, p) in std::mem::take(&mut self.running) {
            // A fetch in progress runs on a blocking thread; it is abandoned, not awaited.
            p.task.abort();
        }
    }
}

/// Creates `state_dir` (and missing parents) mode 0700, and makes an existing one 0700: it
/// holds the clones (`hive.nix`, secrets a hive may name), the attempts' output and the
/// state. systemd's `StateDirectory=` does the same; this holds outside systemd too.
fn private_state_dir(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("creating state_dir {}", dir.display()))?;
    let mode = std::fs::metadata(dir)
        .with_context(|| format!("reading state_dir {}", dir.display()))?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).with_context(
            || {
                format!(
                    "making state_dir {} private (mode {:o}, others may read it)",
                    dir.display(),
                    mode & 0o777
                )
            },
        )?;
        tracing::warn!(state_dir = %dir.display(), was = %format!("{:o}", mode & 0o777),
            "state_dir was readable by others; made it 0700");
    }
    Ok(())
}
