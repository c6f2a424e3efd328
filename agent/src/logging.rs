//! Logging: to journald (with structured fields) when its socket exists, else to stderr.
//! `RUST_LOG` filters; the default is `info`.
//!
//! Layer 1: imports nothing of the crate.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

const JOURNAL_SOCKET: &str = "/run/systemd/journal/socket";

pub fn init() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let registry = tracing_subscriber::registry().with(filter);
    if std::path::Path::new(JOURNAL_SOCKET).exists()
        && let Ok(journald) = tracing_journald::layer()
    {
        registry
            .with(
                journald
                    .with_syslog_identifier("ginx".into())
                    // Fields as they are named in the code, upper-cased (`REVISION`, `SOURCE`,
                    // `ATTEMPT`, `PHASE`), for `journalctl -u ginx REVISION=…`; journald itself
                    // refuses a field that would pass for one of its trusted `_` fields.
                    .with_field_prefix(None),
            )
            .init();
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
