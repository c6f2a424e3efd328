//! Shutting down with an attempt running: a `systemd-run` attempt runs on for the next ginx to
//! follow; a `process` attempt gets `apply.shutdown_grace`, then is stopped.

use super::{Attempting, Reconciler};
use crate::apply::isolation::Isolation;
use crate::apply::{Exit, Finished};

impl Reconciler {
    /// Shutting down with an attempt running. A `systemd-run` attempt runs on: the next ginx
    /// follows it. A `process` attempt gets `shutdown_grace` to finish, then is stopped.
    pub(super) async fn stop(&mut self, mut a: Attempting) {
        if matches!(self.isolation, Isolation::SystemdRun { .. }) {
            tracing::info!(
                attempt = a.id,
                "leaving the running attempt to its unit; the next ginx follows it"
            );
            a.task.abort();
            return;
        }
        let grace = self.config.borrow().apply.shutdown_grace.get();
        tracing::info!(?grace, "waiting for the running apply before stopping");
        let finished = match tokio::time::timeout(grace, &mut a.task).await {
            Ok(r) => r,
            Err(_) => {
                if let Some(stop) = a.stop.take() {
                    let _ = stop.send(());
                }
                (&mut a.task).await
            }
        };
        let finished = finished.unwrap_or_else(|e| Finished {
            exit: Exit::SpawnFailed(format!("attempt task failed: {e}")),
            output: Vec::new(),
        });
        self.finish(a.id, finished).await;
    }
}
