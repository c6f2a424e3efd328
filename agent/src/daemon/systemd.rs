//! Talking to systemd: `READY=1`, the one-line `STATUS=` that `systemctl status` shows, the
//! watchdog's `WATCHDOG=1` while the apply loop answers, `STOPPING=1`; sent from a thread of
//! its own so that a stalled notify socket never stalls the daemon.

use super::*;

/// Talks to systemd from a thread of its own: a notify socket that nobody reads (a full
/// queue blocks `sendmsg`) must never stall the daemon, nor make it hold more memory. What is
/// waiting to go out is kept as one note of each kind, the newest status line only, however
/// long the socket stays blocked: a queue of every note would grow without end (about 1 KiB
/// every 31 notes, a soak test found) for as long as the socket stays stalled.
#[derive(Clone)]
pub(super) struct Notifier {
    handle: Arc<NotifierHandle>,
}

/// What the daemon holds; when the last one goes, the thread ends once it has sent the rest.
pub(super) struct NotifierHandle {
    shared: Arc<NotifyShared>,
}

#[derive(Default)]
pub(super) struct NotifyShared {
    pending: Mutex<Pending>,
    wake: std::sync::Condvar,
}

/// The notes not yet sent, coalesced: sent in this order when the socket takes them.
#[derive(Default)]
pub(super) struct Pending {
    ready: bool,
    status: Option<String>,
    watchdog: bool,
    stopping: bool,
    /// Waiting for everything noted before them to have gone out.
    flushed: Vec<std::sync::mpsc::Sender<()>>,
    closed: bool,
}

impl Pending {
    pub(super) fn is_empty(&self) -> bool {
        !self.ready
            && self.status.is_none()
            && !self.watchdog
            && !self.stopping
            && self.flushed.is_empty()
    }
}

/// What the daemon tells systemd.
pub(super) enum Note {
    Ready,
    Status(String),
    Watchdog,
    Stopping,
}

impl Notifier {
    pub(super) fn start() -> Self {
        Self::start_with(sd_notify::notify)
    }

    /// `send` delivers the states of one datagram (sd_notify, but for the tests).
    pub(super) fn start_with(
        mut send: impl FnMut(&[NotifyState]) -> std::io::Result<()> + Send + 'static,
    ) -> Self {
        let shared = Arc::new(NotifyShared::default());
        let theirs = Arc::clone(&shared);
        let spawned = std::thread::Builder::new()
            .name("sd-notify".into())
            .spawn(move || {
                loop {
                    let batch = {
                        let mut p = theirs.pending.lock().unwrap_or_else(|e| e.into_inner());
                        while p.is_empty() && !p.closed {
                            p = theirs.wake.wait(p).unwrap_or_else(|e| e.into_inner());
                        }
                        if p.is_empty() {
                            return;
                        }
                        let closed = p.closed;
                        std::mem::replace(
                            &mut *p,
                            Pending {
                                closed,
                                ..Pending::default()
                            },
                        )
                    };
                    let mut states = Vec::new();
                    if batch.ready {
                        states.push(NotifyState::Ready);
                    }
                    if let Some(s) = &batch.status {
                        states.push(NotifyState::Status(s));
                    }
                    if batch.watchdog {
                        states.push(NotifyState::Watchdog);
                    }
                    if batch.stopping {
                        states.push(NotifyState::Stopping);
                    }
                    if !states.is_empty()
                        && let Err(e) = send(&states)
                    {
                        tracing::debug!(error = %e, "sd_notify failed");
                    }
                    for done in batch.flushed {
                        let _ = done.send(());
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "cannot start the sd_notify thread; systemd will not hear from ginx");
        }
        Self {
            handle: Arc::new(NotifierHandle { shared }),
        }
    }

    pub(super) fn update(&self, f: impl FnOnce(&mut Pending)) {
        let shared = &self.handle.shared;
        f(&mut shared.pending.lock().unwrap_or_else(|e| e.into_inner()));
        shared.wake.notify_one();
    }

    pub(super) fn send(&self, note: Note) {
        self.update(|p| match note {
            Note::Ready => p.ready = true,
            Note::Status(s) => p.status = Some(s),
            Note::Watchdog => p.watchdog = true,
            Note::Stopping => p.stopping = true,
        });
    }

    /// Waits (briefly) until everything sent so far has gone out.
    pub(super) fn flush(&self) {
        let (tx, rx) = std::sync::mpsc::channel();
        self.update(|p| p.flushed.push(tx));
        let _ = rx.recv_timeout(Duration::from_secs(2));
    }
}

impl Drop for NotifierHandle {
    fn drop(&mut self) {
        self.shared
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .closed = true;
        self.shared.wake.notify_one();
    }
}

/// Sends `STATUS=` whenever the one-line summary changes.
pub(super) async fn report_status(
    backend: Arc<Backend>,
    notifier: Notifier,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut published = backend.parts.published.clone();
    let mut sources = backend.parts.sources.clone();
    let mut last = String::new();
    loop {
        let line = summary(&backend.status());
        if line != last {
            notifier.send(Note::Status(line.clone()));
            last = line;
        }
        tokio::select! {
            r = published.changed() => if r.is_err() { return },
            r = sources.changed() => if r.is_err() { return },
            _ = shutdown.changed() => return,
        }
    }
}

/// One sentence for `systemctl status`: what ginx is doing or waiting for.
pub fn summary(status: &status::Status) -> String {
    let failing: Vec<&str> = status
        .sources
        .iter()
        .filter(|(_, s)| s.error.is_some())
        .map(|(n, _)| n.as_str())
        .collect();
    sentence(
        &status.apply,
        status.rollout.gate.as_ref(),
        status.suspended,
        &failing,
    )
}

/// [`summary`] of its parts: the apply, the open gate, the suspension and the sources whose
/// fetch fails. The STATUS= line is read later than written, so a gate says times, never "for
/// N s".
fn sentence(
    a: &status::ApplyStatus,
    gate: Option<&status::GateProgress>,
    suspended: bool,
    failing: &[&str],
) -> String {
    let rev = a.revision.as_ref().map_or("-", |r| r.short());
    let mut line = match a.state {
        ApplyState::Idle => format!("waiting for the first fetch of {}", a.source),
        ApplyState::Pending => format!("{} {rev} pending", a.source),
        ApplyState::Waiting => format!("suspended; {} {rev} waits to be applied", a.source),
        ApplyState::Building => format!("building {} {rev} before its activation", a.source),
        ApplyState::Applying => format!("applying {} {rev} ({})", a.source, a.goal),
        ApplyState::Verifying => match gate {
            Some(gate) => format!("verifying {} {rev}; {}", a.source, gate.describe(None)),
            None => format!("verifying {} {rev}", a.source),
        },
        ApplyState::Succeeded => format!("up to date: {} {rev} applied", a.source),
        ApplyState::Failed => format!(
            "{} {rev} failed {} time(s); next try {}",
            a.source,
            a.attempts,
            a.next_retry_at
                .map_or_else(|| "on sync".to_owned(), |t| t.to_string())
        ),
        ApplyState::RolledBack => format!("{} {rev} rolled back", a.source),
    };
    if suspended && a.state != ApplyState::Waiting {
        line.push_str("; suspended");
    }
    if !failing.is_empty() {
        line.push_str(&format!("; fetch failing: {}", failing.join(", ")));
    }
    line
}

/// `WATCHDOG=1` only while the apply loop answers: a wedged loop gets ginx restarted.
pub(super) async fn watchdog(
    period: Duration,
    commands: mpsc::Sender<reconcile::Command>,
    notifier: Notifier,
    mut shutdown: watch::Receiver<bool>,
) {
    let every = period / 2;
    let mut tick = tokio::time::interval(every);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.changed() => return,
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        if commands.send(reconcile::Command::Ping(tx)).await.is_err() {
            return;
        }
        if tokio::time::timeout(every, rx)
            .await
            .is_ok_and(|r| r.is_ok())
        {
            notifier.send(Note::Watchdog);
        } else {
            tracing::warn!(
                waited = ?every,
                "the apply loop did not answer the watchdog ping in time; systemd restarts ginx if it stays so"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A notify socket that nobody reads for a while: the notes made meanwhile wait as one of
    /// each kind, and the newest status is what goes out once it is read again.
    #[test]
    fn a_healthy_gate_reads_as_times_on_the_status_line() {
        let at = |t: &str| -> jiff::Timestamp { t.parse().unwrap() };
        let apply = status::ApplyStatus {
            state: ApplyState::Verifying,
            source: "hephaestus".into(),
            revision: Some("0123456789abcdef0123456789abcdef01234567".parse().unwrap()),
            ..status::ApplyStatus::default()
        };
        let gate = status::GateProgress {
            healthy_since: Some(at("2026-12-04T14:33:35Z")),
            passes_at: Some(at("2026-12-04T14:34:35Z")),
            deadline: Some(at("2026-12-04T14:37:00Z")),
            ..status::GateProgress::default()
        };
        assert_eq!(
            sentence(&apply, Some(&gate), false, &[]),
            "verifying hephaestus 0123456789ab; health gate after the activation: healthy since \
             2026-12-04T14:33:35Z (60 s settle); passes at 2026-12-04T14:34:35Z if nothing \
             regresses; gives up at 2026-12-04T14:37:00Z"
        );
        let failing = status::GateProgress {
            failing: [("kubelet".to_owned(), "healthz 500".to_owned())].into(),
            deadline: Some(at("2026-12-04T14:37:00Z")),
            ..status::GateProgress::default()
        };
        let line = sentence(&apply, Some(&failing), true, &["argus"]);
        assert!(
            line.contains("failing kubelet") && line.contains("gives up at 2026-12-04T14:37:00Z"),
            "{line}"
        );
        assert!(
            line.ends_with("; suspended; fetch failing: argus"),
            "{line}"
        );
        assert!(
            !line.contains("healthy since -") && !line.contains("fails at"),
            "{line}"
        );
    }

    #[test]
    fn a_stalled_notify_socket_holds_one_status_and_gets_the_newest() {
        let (sent_tx, sent_rx) = std::sync::mpsc::channel::<String>();
        let (unblock_tx, unblock_rx) = std::sync::mpsc::channel::<()>();
        let n = Notifier::start_with(move |states| {
            let line = states
                .iter()
                .map(|s| s.to_string())
                .collect::<Vec<_>>()
                .join(" ");
            // Every datagram waits for the test's go-ahead: a socket whose queue is full.
            let _ = unblock_rx.recv();
            let _ = sent_tx.send(line);
            Ok(())
        });
        n.send(Note::Ready);
        // The thread now sits in the send of READY=1, blocked.
        while n.handle.shared.pending.lock().unwrap().ready {
            std::thread::yield_now();
        }
        for i in 0..10_000 {
            n.send(Note::Status(format!("status {i}")));
            n.send(Note::Watchdog);
        }
        {
            let p = n.handle.shared.pending.lock().unwrap();
            assert_eq!(p.status.as_deref(), Some("status 9999"));
            assert!(p.watchdog && !p.ready && !p.stopping && p.flushed.is_empty());
        }
        unblock_tx.send(()).unwrap();
        unblock_tx.send(()).unwrap();
        assert_eq!(sent_rx.recv().unwrap(), "READY=1");
        assert_eq!(sent_rx.recv().unwrap(), "STATUS=status 9999 WATCHDOG=1");

        // A flush returns once what came before it has gone out.
        n.send(Note::Stopping);
        unblock_tx.send(()).unwrap();
        n.flush();
        assert_eq!(sent_rx.try_recv().unwrap(), "STOPPING=1");
        assert!(sent_rx.try_recv().is_err());
    }
}
