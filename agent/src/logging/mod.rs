//! Logging: to journald when its socket exists, else to stderr. `RUST_LOG` filters; the
//! default is `info`.
//!
//! In the journal every entry is one self-contained line: MESSAGE is the event's text followed
//! by its fields as `key=value` (what stderr shows too), and the fields are also written as
//! journal fields, upper-cased (`REVISION`, `SOURCE`, `ATTEMPT`, `PHASE`), for
//! `journalctl -u ginx REVISION=…`. Secrets never reach a field: the types that hold them
//! print redacted (`<redacted>`, a URL without its credentials), here as everywhere.
//!
//! Layer 1: imports nothing of the crate.

mod entry;
mod journal;
mod native;
#[cfg(test)]
mod sites;

use std::io::IsTerminal;
use std::path::Path;

use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

use journal::Journal;
use native::{JOURNAL_SOCKET, Sender};

pub fn init() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let registry = tracing_subscriber::registry().with(filter);
    let socket = Path::new(JOURNAL_SOCKET);
    if socket.exists()
        && let Ok(sender) = Sender::new(socket)
    {
        registry.with(Journal::new(sender, "ginx")).init();
        return;
    }
    registry
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(std::io::stderr().is_terminal())
                .with_target(false),
        )
        .init();
}
