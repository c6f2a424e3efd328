//! The control socket server: binds the socket (mode 0660, the configured group), checks each
//! peer's credentials, and answers requests from the daemon's live state.
//!
//! A bad request — not JSON, an unknown command, the wrong version, over 64 KiB — gets an error
//! reply; it never disturbs other connections.

use std::collections::BTreeMap;
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot, watch};

use super::protocol::{
    AcceptReport, Command, ErrorKind, FleetReport, HistoryReport, MAX_REQUEST, Response,
    RollbackReport, SourceFileReport, SuspendReport, SyncReport, parse_request,
};
use crate::k8s::KubeClients;
use crate::reconcile;
use crate::rollout::fleet::Fleet;
use crate::rollout::lock::LockError;
use crate::source::PollerCmd;
use crate::status::{BootstrapStatus, FleetStatus, Parts, Status};

/// Connections served at once; more are refused with a reply that says why.
pub const MAX_CONNECTIONS: usize = 64;
/// Of those, the ones only root, ginx's own user and `control.group` members may take: a
/// flood by other users never locks them out.
pub const RESERVED_CONNECTIONS: usize = 16;
/// Connections one peer uid may hold at once (root: any free slot), so that one user's flood
/// leaves room for everyone else.
pub const MAX_CONNECTIONS_PER_UID: usize = 8;
/// A connection that sends nothing for this long is closed...
const IDLE_TIMEOUT: Duration = Duration::from_secs(300);
/// ...and one that does not send its first request within this.
const FIRST_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// A reply the client does not take within this closes the connection: a client that sends
/// requests and never reads its replies does not hold a slot (and a task) for ever.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// Everything the socket can ask of the daemon.
pub struct Backend {
    /// What status is assembled from.
    pub parts: Parts,
    pub reconciler: mpsc::Sender<reconcile::Command>,
    /// Sync request channels of the running pollers, by source name.
    pub pollers: Arc<Mutex<BTreeMap<String, mpsc::Sender<PollerCmd>>>>,
    pub workspace: Arc<crate::source::Workspace>,
    /// The API clients, once the reporter has built them from `kubernetes.kubeconfig`
    /// (`None` before): the fleet commands and `cluster` talk to the cluster with them.
    pub kube: watch::Receiver<Option<KubeClients>>,
    /// The last report of `ginxctl bootstrap`, and the file it is kept in across restarts.
    pub bootstrap: watch::Sender<Option<BootstrapStatus>>,
    pub bootstrap_file: PathBuf,
    /// When this daemon saw each Lease change (shared with the rollout lock): the ages
    /// `cluster` shows.
    pub observed: Arc<std::sync::Mutex<crate::rollout::lock::slots::Observed>>,
    /// Where a bootstrap's stages are told (`BootstrapStage` Events).
    pub notices: crate::types::Notices,
}

/// The last bootstrap report kept in `path`; a missing or unreadable file is no report (it is
/// status only: the cluster's ConfigMap holds what was applied).
pub fn load_bootstrap(path: &Path) -> Option<BootstrapStatus> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => {
            tracing::warn!(file = %path.display(), error = %e, "cannot read the last bootstrap report; status shows none");
            return None;
        }
    };
    match serde_json::from_slice(&bytes) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(file = %path.display(), error = %e, "the last bootstrap report does not parse; status shows none until the next `ginxctl bootstrap`");
            None
        }
    }
}

impl Backend {
    pub fn status(&self) -> Status {
        self.parts.status()
    }

    async fn sync(&self, source: Option<String>) -> Result<SyncReport, (ErrorKind, String)> {
        let targets: Vec<(String, mpsc::Sender<PollerCmd>)> = match source {
            Some(name) => vec![(name.clone(), self.poller(&name)?)],
            None => self
                .pollers
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .map(|(n, t)| (n.clone(), t.clone()))
                .collect(),
        };
        let mut waits = Vec::new();
        for (name, tx) in targets {
            let (reply, rx) = oneshot::channel();
            if tx.send(PollerCmd::Sync(reply)).await.is_err() {
                return Err((
                    ErrorKind::Unavailable,
                    format!("source {name} is shutting down"),
                ));
            }
            waits.push((name, rx));
        }
        let mut report = SyncReport {
            sources: Vec::new(),
        };
        for (name, rx) in waits {
            match rx.await {
                Ok(outcome) => report.sources.push(outcome),
                Err(_) => {
                    return Err((
                        ErrorKind::Unavailable,
                        format!("source {name} stopped before fetching"),
                    ));
                }
            }
        }
        // A revision that failed before is tried again now rather than after its backoff.
        let _ = self.reconciler.send(reconcile::Command::Retry).await;
        Ok(report)
    }

    fn poller(&self, name: &str) -> Result<mpsc::Sender<PollerCmd>, (ErrorKind, String)> {
        let pollers = self.pollers.lock().unwrap_or_else(|p| p.into_inner());
        pollers.get(name).cloned().ok_or_else(|| {
            let known: Vec<&str> = pollers.keys().map(String::as_str).collect();
            (
                ErrorKind::NotFound,
                format!("no source named {name:?}; configured: {}", known.join(", ")),
            )
        })
    }

    async fn source_file(
        &self,
        source: String,
        path: String,
    ) -> Result<SourceFileReport, (ErrorKind, String)> {
        let revision = self
            .parts
            .sources
            .borrow()
            .get(&source)
            .ok_or_else(|| (ErrorKind::NotFound, format!("no source named {source:?}")))?
            .revision
            .clone()
            .ok_or_else(|| {
                (
                    ErrorKind::Unavailable,
                    format!("{source} has not been fetched yet"),
                )
            })?;
        let workspace = Arc::clone(&self.workspace);
        let (s, r, p) = (
            source.clone(),
            revision.clone(),
            std::path::PathBuf::from(&path),
        );
        let bytes = tokio::task::spawn_blocking(move || workspace.read_file(&s, &r, &p))
            .await
            .map_err(|e| (ErrorKind::Internal, e.to_string()))?
            .map_err(|e| {
                (
                    ErrorKind::NotFound,
                    format!("{source}@{}: {e}", revision.short()),
                )
            })?;
        let content = String::from_utf8(bytes).map_err(|_| {
            (
                ErrorKind::BadRequest,
                format!("{source}:{path} is not UTF-8 text"),
            )
        })?;
        Ok(SourceFileReport {
            source,
            revision,
            path,
            content,
        })
    }

    async fn accept(
        &self,
        source: String,
        revision: String,
    ) -> Result<AcceptReport, (ErrorKind, String)> {
        let tx = self.poller(&source)?;
        let (reply, rx) = oneshot::channel();
        let gone = || {
            (
                ErrorKind::Unavailable,
                format!("source {source} is shutting down"),
            )
        };
        tx.send(PollerCmd::Accept(revision, reply))
            .await
            .map_err(|_| gone())?;
        let (revision, outcome) = rx
            .await
            .map_err(|_| gone())?
            .map_err(|e| (ErrorKind::NotFound, format!("cannot accept: {e}")))?;
        let _ = self.reconciler.send(reconcile::Command::Retry).await;
        Ok(AcceptReport {
            source,
            revision,
            outcome,
        })
    }

    async fn ask<T>(
        &self,
        make: impl FnOnce(oneshot::Sender<T>) -> reconcile::Command,
    ) -> Result<T, (ErrorKind, String)> {
        let (tx, rx) = oneshot::channel();
        let unavailable = || {
            (
                ErrorKind::Unavailable,
                "the apply loop is shutting down".to_owned(),
            )
        };
        self.reconciler
            .send(make(tx))
            .await
            .map_err(|_| unavailable())?;
        rx.await.map_err(|_| unavailable())
    }

    /// A client for the cluster, or why there is none yet.
    fn kube_client(&self, command: &Command) -> Result<kube::Client, (ErrorKind, String)> {
        if let Some(k) = self.kube.borrow().as_ref() {
            return Ok(k.main.clone());
        }
        let cfg = Arc::clone(&self.parts.config.borrow());
        let why = match &cfg.kubernetes.kubeconfig {
            None => "kubernetes.kubeconfig is not set; the fleet commands need \
                     kubernetes.kubeconfig (ginx's own credentials, see packaging/kubernetes) \
                     and the API"
                .to_owned(),
            Some(p) => format!(
                "ginx has no client for kubernetes.kubeconfig {} yet (is the file there?); see \
                 `ginxctl status`, line kubernetes, for why",
                p.display()
            ),
        };
        Err((
            ErrorKind::Unavailable,
            format!("{} needs the Kubernetes API: {why}", command.name()),
        ))
    }

    /// The `ginx-rollout` ConfigMap, through the cluster client.
    fn fleet(&self, command: &Command) -> Result<Fleet, (ErrorKind, String)> {
        let client = self.kube_client(command)?;
        let cfg = self.parts.config.borrow();
        Ok(Fleet::new(
            client,
            &cfg.kubernetes.namespace,
            &cfg.rollout.configmap,
        ))
    }

    /// `rollout-pause`, recorded as done by the peer. Any node may stop the fleet.
    async fn rollout_pause(
        &self,
        command: &Command,
        peer: Option<&Peer>,
    ) -> Result<FleetReport, (ErrorKind, String)> {
        let fleet = self.fleet(command)?;
        let by = self.who(peer).await;
        let updated = fleet.pause(&by).await.map_err(|e| {
            // A refusal (RBAC, a policy) is the caller's to fix, not a wait for the API.
            let kind = match e {
                LockError::Refused(_) => ErrorKind::Forbidden,
                LockError::Unavailable(_) => ErrorKind::Unavailable,
            };
            (kind, e.to_string())
        })?;
        if updated.changed {
            tracing::info!(by = %by, command = command.name(), configmap = %fleet.object(), "rollout paused fleet-wide");
        }
        Ok(FleetReport {
            changed: updated.changed,
            fleet: FleetStatus::from(&updated.state),
        })
    }

    /// `user@node` for the fleet's records: the peer's user name (`uid N` when it has none)
    /// on this node.
    async fn who(&self, peer: Option<&Peer>) -> String {
        let node = self.parts.config.borrow().node_name().to_owned();
        let Some(uid) = peer.map(|p| p.uid) else {
            return format!("an unknown peer@{node}");
        };
        // Reads /etc/passwd (or NSS): not on the runtime's thread.
        let name = tokio::task::spawn_blocking(move || {
            nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
                .ok()
                .flatten()
                .map(|u| u.name)
        })
        .await
        .ok()
        .flatten()
        .unwrap_or_else(|| format!("uid {uid}"));
        format!("{name}@{node}")
    }

    async fn cluster(&self) -> Result<Response, (ErrorKind, String)> {
        let client = self.kube_client(&Command::Cluster)?;
        let cfg = Arc::clone(&self.parts.config.borrow());
        crate::rollout::cluster::view(&client, &cfg, &self.observed)
            .await
            .map(Response::ok)
            .map_err(|e| (ErrorKind::Unavailable, e))
    }

    /// `bootstrap-report`: kept as the node's bootstrap status, with the peer's pid (so that a
    /// run whose process is gone shows as failed). A report from another process while a run
    /// is under way is refused: two runs on one node (one of which the Lease stops) must not
    /// overwrite each other's progress.
    fn bootstrap_report(
        &self,
        mut report: BootstrapStatus,
        peer: Option<&Peer>,
    ) -> Result<Response, (ErrorKind, String)> {
        let pid = peer.and_then(|p| p.pid);
        if let Some(current) = self.bootstrap.borrow().as_ref()
            && current.phase.running()
            && current.pid != pid
            && current
                .pid
                .is_some_and(|p| crate::util::process_is(p, current.pid_start))
        {
            return Err((
                ErrorKind::Unavailable,
                format!(
                    "a bootstrap by pid {} is under way on this node; its progress stays in status",
                    current.pid.unwrap_or_default()
                ),
            ));
        }
        report.pid = pid;
        report.pid_start = pid.and_then(crate::util::process_start_time);
        report.updated_at = Some(crate::util::now());
        if let Ok(bytes) = serde_json::to_vec_pretty(&report)
            && let Err(e) = crate::state::write_atomic(&self.bootstrap_file, &bytes)
        {
            tracing::warn!(file = %self.bootstrap_file.display(), error = %e, "cannot keep the bootstrap report; status has it until ginx restarts");
        }
        for message in bootstrap_notices(self.bootstrap.borrow().as_ref(), &report) {
            self.notices
                .emit(crate::types::Reason::BootstrapStage, None, message);
        }
        self.bootstrap.send_replace(Some(report));
        Ok(Response::ok(serde_json::json!({"kept": true})))
    }

    async fn answer(&self, command: Command, peer: Option<&Peer>) -> Response {
        let result = match command {
            Command::Status => return Response::ok(self.status()),
            Command::Sync { source } => self.sync(source).await.map(Response::ok),
            Command::Suspend => {
                persisted(self.ask(reconcile::Command::Suspend).await).map(|changed| {
                    Response::ok(SuspendReport {
                        suspended: true,
                        changed,
                    })
                })
            }
            Command::Resume => {
                persisted(self.ask(reconcile::Command::Resume).await).map(|changed| {
                    Response::ok(SuspendReport {
                        suspended: false,
                        changed,
                    })
                })
            }
            Command::Retry => persisted(self.ask(reconcile::Command::ForceRetry).await)
                .map(|()| Response::ok(serde_json::json!({"retrying": true}))),
            Command::Rollback => match self.ask(reconcile::Command::Rollback).await {
                Ok(Ok(attempt)) => Ok(Response::ok(RollbackReport { attempt })),
                Ok(Err(why)) => Err((ErrorKind::Unavailable, why)),
                Err(e) => Err(e),
            },
            Command::SourceFile { source, path } => {
                self.source_file(source, path).await.map(Response::ok)
            }
            Command::Accept { source, revision } => {
                self.accept(source, revision).await.map(Response::ok)
            }
            Command::RolloutPause => self.rollout_pause(&command, peer).await.map(Response::ok),
            // Lifting is an operator's act, with the operator's credentials: `ginxctl` does
            // it itself. The node's identity may stop the fleet, never start it again.
            Command::RolloutResume | Command::RolloutClear { .. } => Err((
                ErrorKind::Forbidden,
                format!(
                    "{} lifts with an operator's credentials, never this node's: run a ginxctl of \
                     this version, which does it with --kubeconfig, KUBECONFIG or admin.conf",
                    command.name()
                ),
            )),
            Command::Cluster => self.cluster().await,
            Command::BootstrapReport { report } => self.bootstrap_report(report, peer),
            Command::History { limit } => {
                self.ask(reconcile::Command::History).await.map(|mut a| {
                    a.reverse();
                    a.truncate(limit.unwrap_or(usize::MAX));
                    Response::ok(HistoryReport { attempts: a })
                })
            }
        };
        result.unwrap_or_else(|(kind, message)| Response::error(kind, message))
    }
}

/// What a bootstrap report tells that the previous one did not: a stage begun, a stage that
/// holds, the run failed or done. A wait is not told (status has it), only its stage.
fn bootstrap_notices(prev: Option<&BootstrapStatus>, new: &BootstrapStatus) -> Vec<String> {
    use crate::status::BootstrapPhase;
    // A new run starts from nothing.
    let prev = prev.filter(|p| p.started_at == new.started_at);
    let mut out = Vec::new();
    let before = prev.map_or(&[][..], |p| p.done.as_slice());
    for s in new.done.iter().filter(|s| !before.contains(s)) {
        out.push(format!("bootstrap stage {s} holds"));
    }
    if let Some(stage) = &new.stage
        && new.phase.running()
        && !new.done.contains(stage)
        && prev.and_then(|p| p.stage.as_ref()) != Some(stage)
    {
        out.push(format!("bootstrap stage {stage}: applying"));
    }
    let was = prev.map(|p| p.phase);
    match new.phase {
        BootstrapPhase::Failed if was != Some(BootstrapPhase::Failed) => out.push(format!(
            "bootstrap failed{}: {}; run `ginxctl bootstrap` again to go on",
            new.stage
                .as_ref()
                .map_or(String::new(), |s| format!(" at stage {s}")),
            new.error.as_deref().unwrap_or("(no reason given)")
        )),
        BootstrapPhase::Done if was != Some(BootstrapPhase::Done) => out.push(format!(
            "bootstrap done: every stage holds ({})",
            new.done.join(", ")
        )),
        _ => {}
    }
    out
}

/// The answer of a command whose effect must be persisted: a failure to persist is an error
/// of the daemon (ginxctl exits 1 with the reason).
fn persisted<T>(
    answer: Result<Result<T, String>, (ErrorKind, String)>,
) -> Result<T, (ErrorKind, String)> {
    answer?.map_err(|e| (ErrorKind::Internal, e))
}

/// Binds the control socket at `path`: parent directory created, a stale socket replaced (a
/// live one is an error), mode 0660, group `group` when it exists.
pub fn bind(path: &Path, group: &str) -> anyhow::Result<UnixListener> {
    use anyhow::Context;
    if let Some(dir) = path.parent()
        && !dir.exists()
    {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("creating the socket directory {}", dir.display()))?;
    }
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        use std::os::unix::fs::FileTypeExt;
        if !meta.file_type().is_socket() {
            anyhow::bail!(
                "{} exists and is not a socket; refusing to replace it: check `socket` in the \
                 configuration",
                path.display()
            );
        }
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            anyhow::bail!(
                "another process (another ginx?) is already listening on {}; stop it or set \
                 `socket` to another path",
                path.display()
            );
        }
        std::fs::remove_file(path)
            .with_context(|| format!("removing the stale socket {}", path.display()))?;
    }
    let listener = UnixListener::bind(path)
        .with_context(|| format!("binding the control socket {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))
        .with_context(|| format!("setting the mode of {}", path.display()))?;
    apply_group(path, group);
    Ok(listener)
}

/// Gives the socket to `group`; a missing group leaves only root (and ginx's own user) able to
/// change things, which is said once.
pub fn apply_group(path: &Path, group: &str) {
    match nix::unistd::Group::from_name(group) {
        Ok(Some(g)) => {
            if let Err(e) = nix::unistd::chown(path, None, Some(g.gid)) {
                tracing::warn!(socket = %path.display(), group, error = %e, "cannot give the control socket to its group");
            }
        }
        _ => tracing::warn!(
            group,
            "control.group does not exist on this system; only root can use ginxctl to change things"
        ),
    }
}

/// Serves `listener` until `shutdown` turns true, then removes the socket file.
pub async fn serve(
    listener: UnixListener,
    path: PathBuf,
    backend: Arc<Backend>,
    mut shutdown: watch::Receiver<bool>,
) {
    let slots = Arc::new(Mutex::new(Slots::default()));
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let backend = Arc::clone(&backend);
                    let slots = Arc::clone(&slots);
                    // Peer lookups (the group) may read /etc/group: not on the accept loop.
                    tokio::spawn(async move {
                        let peer = Peer::of(&stream);
                        let group = backend.parts.config.borrow().control.group.clone();
                        let privileged = peer.as_ref().is_some_and(|p| p.may_change(&group));
                        let uid = peer.as_ref().map_or(u32::MAX, |p| p.uid);
                        let taken = Slots::take(&slots, uid, privileged);
                        match taken {
                            Ok(_slot) => handle(stream, peer, backend).await,
                            // Full: say so and move on; never stop accepting or hear shutdown late.
                            Err(why) => refuse(stream, why).await,
                        }
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accept on the control socket failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            _ = shutdown.changed() => break,
        }
    }
    drop(listener);
    let _ = std::fs::remove_file(&path);
}

/// Connections held, in total, by unprivileged peers, and by each uid.
#[derive(Debug, Default)]
struct Slots {
    total: usize,
    unprivileged: usize,
    by_uid: BTreeMap<u32, usize>,
}

/// A connection's place in [`Slots`], given back when dropped.
struct Slot {
    slots: Arc<Mutex<Slots>>,
    uid: u32,
    privileged: bool,
}

impl Slots {
    /// Whether a new connection of `uid` may be served, and if not, why (for the peer).
    fn admit(&self, uid: u32, privileged: bool) -> Result<(), String> {
        let held = self.by_uid.get(&uid).copied().unwrap_or(0);
        if self.total >= MAX_CONNECTIONS {
            return Err(format!(
                "ginx refused this connection: all {MAX_CONNECTIONS} control connections are in \
                 use; try again when some close"
            ));
        }
        if uid != 0 && held >= MAX_CONNECTIONS_PER_UID {
            return Err(format!(
                "ginx refused this connection: uid {uid} already holds \
                 {MAX_CONNECTIONS_PER_UID} control connections, the most one user may; close \
                 idle ones and try again"
            ));
        }
        if !privileged && self.unprivileged >= MAX_CONNECTIONS - RESERVED_CONNECTIONS {
            return Err(format!(
                "ginx refused this connection: the {} control connections open to users outside \
                 control.group are in use ({RESERVED_CONNECTIONS} more are kept for root and \
                 the group); try again when some close",
                MAX_CONNECTIONS - RESERVED_CONNECTIONS
            ));
        }
        Ok(())
    }

    fn take(this: &Arc<Mutex<Self>>, uid: u32, privileged: bool) -> Result<Slot, String> {
        let mut s = this.lock().unwrap_or_else(|p| p.into_inner());
        s.admit(uid, privileged)?;
        s.total += 1;
        if !privileged {
            s.unprivileged += 1;
        }
        *s.by_uid.entry(uid).or_default() += 1;
        Ok(Slot {
            slots: Arc::clone(this),
            uid,
            privileged,
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut s = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        s.total -= 1;
        if !self.privileged {
            s.unprivileged -= 1;
        }
        if let Some(n) = s.by_uid.get_mut(&self.uid) {
            *n -= 1;
            if *n == 0 {
                s.by_uid.remove(&self.uid);
            }
        }
    }
}

/// Who is on the other end.
struct Peer {
    pid: Option<u32>,
    uid: u32,
    gid: u32,
    groups: Vec<u32>,
}

impl Peer {
    fn of(stream: &UnixStream) -> Option<Self> {
        let cred = stream.peer_cred().ok()?;
        Some(Self {
            pid: cred.pid().and_then(|p| u32::try_from(p).ok()),
            uid: cred.uid(),
            gid: cred.gid(),
            groups: peer_groups(stream).unwrap_or_default(),
        })
    }

    fn may_change(&self, group: &str) -> bool {
        if self.uid == 0 || self.uid == nix::unistd::geteuid().as_raw() {
            return true;
        }
        match nix::unistd::Group::from_name(group) {
            Ok(Some(g)) => self.gid == g.gid.as_raw() || self.groups.contains(&g.gid.as_raw()),
            _ => false,
        }
    }
}

/// The peer's supplementary groups as the kernel saw them at connect time (SO_PEERGROUPS).
fn peer_groups(stream: &UnixStream) -> Option<Vec<u32>> {
    let fd = stream.as_raw_fd();
    let mut groups: Vec<libc::gid_t> = vec![0; 64];
    for _ in 0..2 {
        let mut len = libc::socklen_t::try_from(groups.len() * size_of::<libc::gid_t>()).ok()?;
        // SAFETY: the buffer is valid for `len` bytes and the kernel writes at most that many.
        let rc = unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_PEERGROUPS,
                groups.as_mut_ptr().cast(),
                &raw mut len,
            )
        };
        let n = usize::try_from(len).ok()? / size_of::<libc::gid_t>();
        if rc == 0 {
            groups.truncate(n);
            return Some(groups);
        }
        if std::io::Error::last_os_error().raw_os_error() != Some(libc::ERANGE) {
            return None;
        }
        groups = vec![0; n];
    }
    None
}

async fn refuse(mut stream: UnixStream, why: String) {
    let response = Response::error(ErrorKind::Unavailable, why);
    let mut bytes = serde_json::to_vec(&response).unwrap_or_default();
    bytes.push(b'\n');
    let _ = tokio::time::timeout(Duration::from_secs(1), stream.write_all(&bytes)).await;
}

async fn handle(stream: UnixStream, peer: Option<Peer>, backend: Arc<Backend>) {
    let (read, mut write) = stream.into_split();
    let mut reader = BufReader::new(read);
    let mut first = true;
    loop {
        let mut line = Vec::new();
        // A connection that never says anything does not hold its slot for long.
        let idle = if first {
            FIRST_REQUEST_TIMEOUT
        } else {
            IDLE_TIMEOUT
        };
        first = false;
        let read = tokio::time::timeout(
            idle,
            (&mut reader)
                .take(MAX_REQUEST as u64 + 1)
                .read_until(b'\n', &mut line),
        )
        .await;
        let n = match read {
            Ok(Ok(n)) => n,
            Ok(Err(_)) | Err(_) => return,
        };
        if n == 0 {
            return;
        }
        let complete = line.last() == Some(&b'\n');
        if complete {
            line.pop();
        }
        let (response, close) = if line.len() > MAX_REQUEST {
            (
                Response::error(
                    ErrorKind::TooLarge,
                    format!("request exceeds {MAX_REQUEST} bytes"),
                ),
                true,
            )
        } else if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        } else {
            (respond(&line, peer.as_ref(), &backend).await, !complete)
        };
        let mut bytes = serde_json::to_vec(&response).unwrap_or_default();
        bytes.push(b'\n');
        let written = tokio::time::timeout(WRITE_TIMEOUT, write.write_all(&bytes)).await;
        if !matches!(written, Ok(Ok(()))) || close {
            return;
        }
    }
}

async fn respond(line: &[u8], peer: Option<&Peer>, backend: &Backend) -> Response {
    let request = match parse_request(line) {
        Ok(r) => r,
        Err(refusal) => return refusal,
    };
    if request.command.mutates() {
        let group = backend.parts.config.borrow().control.group.clone();
        let allowed = peer.is_some_and(|p| p.may_change(&group));
        if !allowed {
            let who = peer.map_or_else(
                || "an unknown peer".to_owned(),
                |p| format!("uid {}", p.uid),
            );
            tracing::warn!(command = request.command.name(), peer = %who, "refused a change from a peer outside the control group");
            return Response::error(
                ErrorKind::Forbidden,
                format!(
                    "{} is refused for {who}: it needs root or membership in group {group:?} (control.group)",
                    request.command.name()
                ),
            );
        }
    }
    backend.answer(request.command, peer).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bootstrap_run_is_told_stage_by_stage_then_its_end() {
        use crate::status::BootstrapPhase;
        let t = crate::util::now();
        let mut r = BootstrapStatus {
            phase: BootstrapPhase::Applying,
            started_at: Some(t),
            stage: Some("cilium".into()),
            ..BootstrapStatus::pending()
        };
        assert_eq!(
            bootstrap_notices(None, &r),
            ["bootstrap stage cilium: applying"]
        );
        let prev = r.clone();
        r.phase = BootstrapPhase::Waiting;
        r.waiting_for = Some("daemonset/kube-system/cilium: 0 of 3 ready".into());
        assert!(bootstrap_notices(Some(&prev), &r).is_empty());
        let prev = r.clone();
        r.done.push("cilium".into());
        r.phase = BootstrapPhase::Applying;
        r.stage = Some("flux".into());
        assert_eq!(
            bootstrap_notices(Some(&prev), &r),
            [
                "bootstrap stage cilium holds",
                "bootstrap stage flux: applying"
            ]
        );
        let prev = r.clone();
        r.phase = BootstrapPhase::Failed;
        r.error = Some("timed out".into());
        assert_eq!(
            bootstrap_notices(Some(&prev), &r),
            ["bootstrap failed at stage flux: timed out; run `ginxctl bootstrap` again to go on"]
        );
        let prev = r.clone();
        assert!(bootstrap_notices(Some(&prev), &r).is_empty());
    }

    fn fill(slots: &Arc<Mutex<Slots>>, uid: u32, privileged: bool) -> (Vec<Slot>, String) {
        let mut held = Vec::new();
        loop {
            match Slots::take(slots, uid, privileged) {
                Ok(s) => held.push(s),
                Err(why) => return (held, why),
            }
        }
    }

    #[test]
    fn one_users_flood_leaves_slots_for_root_and_the_group() {
        let slots = Arc::new(Mutex::new(Slots::default()));
        let (flood, why) = fill(&slots, 65534, false);
        assert_eq!(flood.len(), MAX_CONNECTIONS_PER_UID);
        assert!(why.contains("uid 65534 already holds"), "{why}");
        // Many unprivileged users together still leave the reserve.
        let mut others = Vec::new();
        for uid in 1000.. {
            let (held, why) = fill(&slots, uid, false);
            let done = held.len() < MAX_CONNECTIONS_PER_UID;
            others.extend(held);
            if done {
                assert!(why.contains("kept for root and the group"), "{why}");
                break;
            }
        }
        assert_eq!(
            flood.len() + others.len(),
            MAX_CONNECTIONS - RESERVED_CONNECTIONS
        );
        let member = Slots::take(&slots, 1, true).expect("a group member gets a reserved slot");
        let (root, why) = fill(&slots, 0, true);
        assert_eq!(root.len(), RESERVED_CONNECTIONS - 1);
        assert!(why.contains("all 64"), "{why}");
        // Slots come back when connections close.
        drop((flood, member));
        assert!(Slots::take(&slots, 65534, false).is_ok());
    }
}
