//! ginx's own fetch transports for `https://`, `http://` and `ssh://` (and `user@host:path`)
//! remotes, registered with libgit2 in place of its OpenSSL and libssh2 ones:
//! - HTTP(S) through reqwest on rustls, the TLS stack the Kubernetes, FleetLock, closure and
//!   webhook clients already use; server certificates are checked against the system's roots
//!   (`SSL_CERT_FILE` and `SSL_CERT_DIR` are honoured, as OpenSSL did);
//! - SSH through OpenSSH's client `ssh`, as `git` itself does: the host key checked by `ssh`
//!   against `known_hosts_file` alone (no other configuration is read), the deploy key the only
//!   identity offered.
//!
//! libgit2 is built without HTTPS and SSH of its own, so OpenSSL is neither linked nor
//! initialised at start; an idle ginx is 4.3 MiB smaller for it (docs/src/figures.md, "Idle
//! memory"), and no C code of ours parses TLS or SSH from the network.
//!
//! libgit2 still speaks Git's protocol (gitprotocol-http(5), gitprotocol-pack(5)); a transport
//! here only carries its bytes: over HTTP a GET of `info/refs?service=git-upload-pack`, then one
//! POST to `git-upload-pack` per negotiation round (stateless); over SSH `git-upload-pack
//! '<path>'` run on the server by `ssh`, its stdin and stdout the stream (stateful). ginx only
//! fetches: the push services are refused.
//!
//! What a fetch authenticates with comes from the fetch running on the calling thread
//! ([`scope`]): libgit2 creates a transport from inside `Remote::download`, on that thread. Every
//! connect and every read waits at most the network timeout ([`set_timeout`]). Errors are
//! sentences for operators: they never carry the URL as configured (it may hold credentials),
//! a token, or a key.

use std::cell::RefCell;
use std::sync::Once;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use git2::transport::{Service, Transport};

use super::auth::Auth;

mod http;
mod ssh;

use http::Http;
use ssh::Ssh;

/// How long a connect or a read may wait; set from the sources' `fetch_timeout`.
static TIMEOUT_MS: AtomicU64 = AtomicU64::new(60_000);

/// Sets the network timeout of every fetch transport (connect, and each read).
pub fn set_timeout(timeout: Duration) {
    let ms = u64::try_from(timeout.as_millis())
        .unwrap_or(u64::MAX)
        .max(1);
    TIMEOUT_MS.store(ms, Ordering::Relaxed);
}

fn timeout() -> Duration {
    Duration::from_millis(TIMEOUT_MS.load(Ordering::Relaxed))
}

thread_local! {
    static CONTEXT: RefCell<Option<Auth>> = const { RefCell::new(None) };
}

/// While alive, transports created on this thread authenticate with `auth`.
pub struct Scope(());

impl Drop for Scope {
    fn drop(&mut self) {
        CONTEXT.with(|c| c.borrow_mut().take());
    }
}

/// Makes `auth` what the transports created on this thread use, until the guard is dropped.
pub fn scope(auth: &Auth) -> Scope {
    register();
    CONTEXT.with(|c| *c.borrow_mut() = Some(auth.clone()));
    Scope(())
}

fn current_auth() -> Auth {
    CONTEXT.with(|c| c.borrow().clone()).unwrap_or_default()
}

/// Registers the transports with libgit2, once per process.
pub fn register() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let http =
            |remote: &git2::Remote<'_>| Transport::smart(remote, true, Http::new(current_auth())?);
        let ssh = |remote: &git2::Remote<'_>| Transport::smart(remote, false, Ssh(current_auth()));
        // libgit2 takes the scheme and looks up `scheme://`; an SCP-like `user@host:path` is
        // looked up as `ssh://`.
        for scheme in ["https", "http"] {
            // SAFETY: inside `call_once`, so never concurrently with another registration, and
            // before this process's first fetch through these schemes.
            if let Err(e) = unsafe { git2::transport::register(scheme, http) } {
                tracing::error!(scheme, error = %e.message(), "cannot register a fetch transport");
            }
        }
        for scheme in ["ssh", "ssh+git", "git+ssh"] {
            // SAFETY: as above.
            if let Err(e) = unsafe { git2::transport::register(scheme, ssh) } {
                tracing::error!(scheme, error = %e.message(), "cannot register a fetch transport");
            }
        }
    });
}

fn only_fetch(action: Service) -> Result<(), git2::Error> {
    match action {
        Service::UploadPackLs | Service::UploadPack => Ok(()),
        _ => Err(git2::Error::from_str(
            "ginx only fetches; pushing is not supported",
        )),
    }
}

fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}
