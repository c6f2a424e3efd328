//! libfaketime (Debian's `faketime`): a ginx whose wall clock is shifted, or set to a given
//! moment, read again from a file every second so that a test can step it. The monotonic
//! clock is left alone, as a wall-clock step leaves it.

use std::path::Path;

use super::Env;
use super::daemon::Daemon;

const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// Whether libfaketime is here; under `CI=true` its absence fails the test.
pub fn available() -> bool {
    if Path::new(LIBFAKETIME).exists() {
        return true;
    }
    let msg = format!("{LIBFAKETIME} is missing: apt-get install faketime");
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{msg}");
    }
    eprintln!("SKIPPED: {msg}");
    false
}

/// Starts `env`'s ginx with its wall clock as `spec` says, written to `file` (libfaketime's
/// `FAKETIME_TIMESTAMP_FILE`): an offset like `+5m`, or a moment like `@2026-12-24 12:00:00`,
/// in UTC, from which the clock runs on. Write the file again to step the clock.
pub fn start(env: &Env, file: &Path, spec: &str) -> Daemon {
    set(file, spec);
    env.start_with(|c| {
        c.env("LD_PRELOAD", LIBFAKETIME)
            .env("TZ", "UTC")
            .env("FAKETIME_TIMESTAMP_FILE", file)
            .env("FAKETIME_CACHE_DURATION", "1")
            .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
            .env("DONT_FAKE_MONOTONIC", "1");
    })
}

/// Steps the clock of a ginx started with [`start`] on `file`.
pub fn set(file: &Path, spec: &str) {
    std::fs::write(file, format!("{spec}\n")).unwrap();
}
