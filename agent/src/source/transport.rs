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
use std::io::{self, Read, Write};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Once};
use std::time::Duration;

use bytes::Bytes;
use git2::transport::{Service, SmartSubtransport, SmartSubtransportStream, Transport};

use super::auth::{Auth, check_host_key};

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

// ---------------------------------------------------------------------------------------------
// HTTP(S)

/// The tokio runtime a blocking fetch thread drives its requests on: the daemon's (fetches run
/// in `spawn_blocking`), else one of its own.
#[derive(Clone)]
enum Rt {
    Handle(tokio::runtime::Handle),
    Own(Arc<tokio::runtime::Runtime>),
}

impl Rt {
    fn new() -> io::Result<Self> {
        match tokio::runtime::Handle::try_current() {
            Ok(h) => Ok(Self::Handle(h)),
            Err(_) => tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map(|r| Self::Own(Arc::new(r))),
        }
    }

    fn block_on<F: Future>(&self, f: F) -> F::Output {
        match self {
            Self::Handle(h) => h.block_on(f),
            Self::Own(r) => r.block_on(f),
        }
    }

    /// `f`, given up after the network timeout.
    fn wait<T>(&self, what: &str, f: impl Future<Output = T>) -> io::Result<T> {
        let t = timeout();
        self.block_on(async { tokio::time::timeout(t, f).await })
            .map_err(|_| {
                io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("{what}: no answer within {} s", t.as_secs_f64()),
                )
            })
    }
}

/// One remote's HTTP(S) connection state, shared by the streams of one fetch.
struct Http {
    inner: Arc<HttpInner>,
}

struct HttpInner {
    rt: Rt,
    client: reqwest::Client,
    auth: Auth,
    state: Mutex<HttpState>,
}

#[derive(Default)]
struct HttpState {
    /// The repository's URL, without credentials: as configured, or where the first request
    /// was redirected to.
    base: Option<url::Url>,
    /// The configured host, the only one credentials are sent to.
    host: Option<(String, Option<u16>)>,
    /// `(user, password)`: from the URL as configured, else `token_file`.
    credentials: Option<(String, String)>,
    /// Whether the server asked for credentials (then every later request carries them).
    authenticate: bool,
}

const USER_AGENT: &str = concat!("git/2.0 (ginx ", env!("CARGO_PKG_VERSION"), ")");

impl Http {
    fn new(auth: Auth) -> Result<Self, git2::Error> {
        let rt = Rt::new().map_err(|e| git2::Error::from_str(&format!("no runtime: {e}")))?;
        // rustls on ring, as for the other clients; installing it twice changes nothing.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .connect_timeout(timeout())
            .user_agent(USER_AGENT)
            // A proxy from the environment is not ginx's (libgit2 used none either).
            .no_proxy()
            // The first request may be redirected (a renamed repository), never to plain HTTP;
            // a POST of the protocol is never redirected (it would become a GET).
            .redirect(reqwest::redirect::Policy::custom(|attempt| {
                let first = attempt.previous().first();
                if attempt.previous().len() > 5 {
                    attempt.error("more than 5 redirects")
                } else if first.is_some_and(|u| u.path().ends_with("/git-upload-pack")) {
                    attempt.stop()
                } else if first.is_some_and(|u| u.scheme() == "https")
                    && attempt.url().scheme() != "https"
                {
                    attempt.error("redirected from https:// to plain http://")
                } else {
                    attempt.follow()
                }
            }))
            .build()
            .map_err(|e| {
                git2::Error::from_str(&format!(
                    "cannot set up the HTTP client: {}",
                    crate::util::http_error(&e)
                ))
            })?;
        Ok(Self {
            inner: Arc::new(HttpInner {
                rt,
                client,
                auth,
                state: Mutex::new(HttpState::default()),
            }),
        })
    }
}

impl SmartSubtransport for Http {
    fn action(
        &self,
        url: &str,
        action: Service,
    ) -> Result<Box<dyn SmartSubtransportStream>, git2::Error> {
        only_fetch(action)?;
        self.inner
            .remember(url)
            .map_err(|e| git2::Error::from_str(&e))?;
        let mut stream = HttpStream {
            inner: Arc::clone(&self.inner),
            post: action == Service::UploadPack,
            body: Vec::new(),
            response: None,
            pending: Bytes::new(),
        };
        if !stream.post {
            stream.response = Some(
                self.inner
                    .request(false, Vec::new())
                    .map_err(|e| git2::Error::from_str(&e.to_string()))?,
            );
        }
        Ok(Box::new(stream))
    }

    fn close(&self) -> Result<(), git2::Error> {
        Ok(())
    }
}

impl HttpInner {
    /// Takes the repository's URL and the credentials from the URL libgit2 was given (the one
    /// configured), the first time.
    fn remember(&self, raw: &str) -> Result<(), String> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if state.base.is_some() {
            return Ok(());
        }
        // The url crate's messages never echo the input, so no credential leaks here.
        let mut url = url::Url::parse(raw).map_err(|e| format!("invalid URL: {e}"))?;
        let from_url = url
            .password()
            .map(|p| (percent_decode(url.username()), percent_decode(p)));
        state.credentials = from_url.or_else(|| self.auth.token().cloned());
        let _ = url.set_username("");
        let _ = url.set_password(None);
        url.set_fragment(None);
        state.host = url.host_str().map(|h| (h.to_owned(), url.port()));
        state.base = Some(url);
        Ok(())
    }

    /// `base` + `/suffix`, its query kept and `extra` added to it.
    fn endpoint(base: &url::Url, suffix: &str, extra: Option<&str>) -> url::Url {
        let mut u = base.clone();
        let path = format!("{}/{suffix}", base.path().trim_end_matches('/'));
        u.set_path(&path);
        let query = [base.query(), extra]
            .into_iter()
            .flatten()
            .filter(|q| !q.is_empty())
            .collect::<Vec<_>>()
            .join("&");
        u.set_query((!query.is_empty()).then_some(query.as_str()));
        u
    }

    /// The advertisement (`post` false) or one round of negotiation (`post`, with `body`).
    /// Credentials are sent only after the configured host asks for them.
    fn request(&self, post: bool, body: Vec<u8>) -> io::Result<reqwest::Response> {
        let (base, host, credentials, mut authenticate) = {
            let s = self.state.lock().unwrap_or_else(|e| e.into_inner());
            (
                s.base.clone().ok_or_else(|| io::Error::other("no URL"))?,
                s.host.clone(),
                s.credentials.clone(),
                s.authenticate,
            )
        };
        let url = if post {
            Self::endpoint(&base, "git-upload-pack", None)
        } else {
            Self::endpoint(&base, "info/refs", Some("service=git-upload-pack"))
        };
        let same_host = url.host_str().map(|h| (h.to_owned(), url.port())) == host;
        loop {
            let mut req = self.build(post, &url, &body);
            if authenticate && let Some((user, password)) = &credentials {
                req = req.basic_auth(user, Some(password));
            }
            let resp = self.send(post, req)?;
            if resp.status() == reqwest::StatusCode::UNAUTHORIZED {
                if credentials.is_some() && !authenticate && same_host {
                    authenticate = true;
                    self.state
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .authenticate = true;
                    continue;
                }
                return Err(unauthorized(&url, same_host, credentials.is_some()));
            }
            check_answer(post, &resp)?;
            if !post && resp.url().path().ends_with("/info/refs") && resp.url() != &url {
                // Redirected: the next requests go where the repository now is.
                let moved = moved_base(resp.url());
                tracing::info!(to = %shown(&moved), "the remote's URL redirects; following it for this fetch");
                self.state.lock().unwrap_or_else(|e| e.into_inner()).base = Some(moved);
            }
            return Ok(resp);
        }
    }

    /// The request for `url`: a GET of the advertisement, or a POST of `body` (`post`).
    fn build(&self, post: bool, url: &url::Url, body: &[u8]) -> reqwest::RequestBuilder {
        if post {
            self.client
                .post(url.clone())
                .header("Content-Type", "application/x-git-upload-pack-request")
                .header("Accept", "application/x-git-upload-pack-result")
                .body(body.to_vec())
        } else {
            self.client
                .get(url.clone())
                .header("Accept", "application/x-git-upload-pack-advertisement")
        }
    }

    /// Sends `req`, waiting at most the network timeout; an error says what the client saw
    /// (never the URL), with a hint when the server's certificate is not trusted.
    fn send(&self, post: bool, req: reqwest::RequestBuilder) -> io::Result<reqwest::Response> {
        let what = if post { "negotiation" } else { "request" };
        self.rt.wait(what, req.send())?.map_err(|e| {
            let said = crate::util::http_error(&e.without_url());
            io::Error::other(if said.contains("certificate") {
                format!(
                    "{said}; the server's certificate is not trusted: add its CA to the \
                     system's roots (or point SSL_CERT_FILE at a bundle that has it)"
                )
            } else {
                said
            })
        })
    }
}

/// Why a 401 ends the request: the credentials were withheld from another host, rejected, or
/// there are none.
fn unauthorized(url: &url::Url, same_host: bool, have_credentials: bool) -> io::Error {
    io::Error::new(
        io::ErrorKind::PermissionDenied,
        if !same_host {
            format!(
                "authentication failed: redirected to {}, which asks for \
                 credentials; ginx sends them only to the host configured",
                url.host_str().unwrap_or("?")
            )
        } else if have_credentials {
            "authentication failed: the server rejected the configured credentials \
             (token_file)"
                .to_owned()
        } else {
            "authentication failed: the server requires authentication; configure \
             token_file"
                .to_owned()
        },
    )
}

/// The answer is a success in Git's smart HTTP protocol, of the kind asked for.
fn check_answer(post: bool, resp: &reqwest::Response) -> io::Result<()> {
    let content_type = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    match answer_problem(post, resp.status(), content_type) {
        Some(why) => Err(io::Error::other(why)),
        None => Ok(()),
    }
}

/// What is wrong with an answer of `status` and `content_type` (not a 401, handled before);
/// `None` when it is the smart HTTP answer a GET (`post` false) or a POST expects.
fn answer_problem(post: bool, status: reqwest::StatusCode, content_type: &str) -> Option<String> {
    if !status.is_success() {
        let hint = match status.as_u16() {
            403 => " (check token_file and the deploy token's access)",
            404 => " (check the repository's URL)",
            _ => "",
        };
        return Some(format!("the server answered {status}{hint}"));
    }
    let wanted = if post {
        "application/x-git-upload-pack-result"
    } else {
        "application/x-git-upload-pack-advertisement"
    };
    (!content_type.starts_with(wanted)).then(|| {
        format!(
            "the server did not answer with Git's smart HTTP protocol (Content-Type \
             {content_type:?}, not {wanted}); is the URL a Git repository?"
        )
    })
}

/// The repository's URL after the advertisement at `answered` (`…/info/refs?service=…`) was
/// redirected there: without `/info/refs`, its other query parameters kept.
fn moved_base(answered: &url::Url) -> url::Url {
    let mut moved = answered.clone();
    let path = moved.path().trim_end_matches("/info/refs").to_owned();
    moved.set_path(&path);
    let query: Vec<String> = moved
        .query_pairs()
        .filter(|(k, _)| k != "service")
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    moved.set_query((!query.is_empty()).then_some(query.join("&").as_str()));
    moved
}

/// A URL fit for a log: scheme, host and port only.
fn shown(u: &url::Url) -> String {
    match u.port() {
        Some(p) => format!("{}://{}:{p}/***", u.scheme(), u.host_str().unwrap_or("")),
        None => format!("{}://{}/***", u.scheme(), u.host_str().unwrap_or("")),
    }
}

fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

/// One request: written (a POST's body) then read.
struct HttpStream {
    inner: Arc<HttpInner>,
    post: bool,
    body: Vec<u8>,
    response: Option<reqwest::Response>,
    pending: Bytes,
}

impl Read for HttpStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.pending.is_empty() {
            if self.response.is_none() {
                let body = std::mem::take(&mut self.body);
                self.response = Some(self.inner.request(self.post, body)?);
            }
            let Some(resp) = self.response.as_mut() else {
                return Ok(0);
            };
            match self.inner.rt.wait("reading the answer", resp.chunk())? {
                Ok(Some(chunk)) => self.pending = chunk,
                Ok(None) => return Ok(0),
                Err(e) => {
                    return Err(io::Error::other(crate::util::http_error(&e.without_url())));
                }
            }
        }
        let n = buf.len().min(self.pending.len());
        buf[..n].copy_from_slice(&self.pending.split_to(n));
        Ok(n)
    }
}

impl Write for HttpStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if !self.post || self.response.is_some() {
            return Err(io::Error::other(
                "libgit2 wrote to an HTTP request already sent",
            ));
        }
        self.body.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// SSH

/// Fetches over SSH by running OpenSSH's client.
struct Ssh(Auth);

impl SmartSubtransport for Ssh {
    fn action(
        &self,
        url: &str,
        action: Service,
    ) -> Result<Box<dyn SmartSubtransportStream>, git2::Error> {
        only_fetch(action)?;
        let target = SshTarget::parse(url).map_err(|e| git2::Error::from_str(&e))?;
        SshStream::start(&self.0, &target)
            .map(|s| Box::new(s) as Box<dyn SmartSubtransportStream>)
            .map_err(|e| git2::Error::from_str(&e))
    }

    fn close(&self) -> Result<(), git2::Error> {
        Ok(())
    }
}

/// Where an SSH remote is: `ssh://[user@]host[:port]/path` (also `git+ssh://`, `ssh+git://`)
/// or `[user@]host:path`.
#[derive(Debug, PartialEq, Eq)]
struct SshTarget {
    user: Option<String>,
    host: String,
    port: Option<u16>,
    path: String,
}

impl SshTarget {
    fn parse(raw: &str) -> Result<Self, String> {
        let target = if raw.contains("://") {
            let u = url::Url::parse(raw).map_err(|e| format!("invalid SSH URL: {e}"))?;
            let host = u.host_str().unwrap_or("");
            let host = host
                .strip_prefix('[')
                .and_then(|h| h.strip_suffix(']'))
                .unwrap_or(host);
            let path = percent_decode(u.path());
            // ssh://host/~user/repo names a path in a home directory, as for git.
            let path = match path.strip_prefix("/~") {
                Some(rest) => format!("~{rest}"),
                None => path,
            };
            Self {
                user: (!u.username().is_empty()).then(|| percent_decode(u.username())),
                host: host.to_owned(),
                port: u.port(),
                path,
            }
        } else {
            let (user, rest) = match raw.split_once('@') {
                Some((u, r)) => (Some(u.to_owned()), r),
                None => (None, raw),
            };
            let (host, path) = if let Some(r) = rest.strip_prefix('[') {
                let (h, p) = r
                    .split_once("]:")
                    .ok_or("an SSH remote [host]:path without `]:`")?;
                (h, p)
            } else {
                rest.split_once(':')
                    .ok_or("an SSH remote user@host:path without `:`")?
            };
            Self {
                user,
                host: host.to_owned(),
                port: None,
                path: path.to_owned(),
            }
        };
        // `ssh -oProxyCommand=…` as a host or user (CVE-2017-1000117): never an option.
        if target.host.is_empty()
            || target.host.starts_with('-')
            || target.user.as_deref().is_some_and(|u| u.starts_with('-'))
        {
            return Err(
                "an SSH remote whose host is empty or whose host or user begins with \
                        `-` is refused"
                    .into(),
            );
        }
        if target.path.is_empty() {
            return Err("an SSH remote without a path".into());
        }
        Ok(target)
    }

    /// How known_hosts names the host: `host`, or `[host]:port` for a port other than 22.
    fn known_hosts_name(&self) -> String {
        match self.port.filter(|p| *p != 22) {
            Some(p) => format!("[{}]:{p}", self.host),
            None => self.host.clone(),
        }
    }

    /// What the server runs: `git-upload-pack '<path>'`, the path quoted for a POSIX shell.
    fn command(&self) -> String {
        format!("git-upload-pack '{}'", self.path.replace('\'', r"'\''"))
    }
}

/// The most of `ssh`'s stderr kept for a message.
const STDERR_LIMIT: usize = 64 * 1024;

/// `git-upload-pack` on the server, through `ssh`.
struct SshStream {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: ChildStdout,
    stderr: Arc<Mutex<Vec<u8>>>,
    stderr_reader: Option<std::thread::JoinHandle<()>>,
    /// A private directory for the host key `ssh` was offered (see [`SshStream::start`]).
    scratch: PathBuf,
    name: String,
    known_hosts: PathBuf,
    has_key: bool,
    ended: bool,
}

impl SshStream {
    fn start(auth: &Auth, target: &SshTarget) -> Result<Self, String> {
        let scratch = private_dir()?;
        let offered = scratch.join("offered");
        let t = timeout().as_secs().max(1);
        let mut cmd = Command::new("ssh");
        // No configuration but this: the machine's ssh_config, ~/.ssh and an agent are not
        // ginx's. `ssh` alone decides whether the host key is known, from known_hosts_file.
        cmd.args(["-F", "/dev/null", "-T", "-x", "-a"]).args(
            [
                "BatchMode=yes".to_owned(),
                "StrictHostKeyChecking=yes".to_owned(),
                format!("UserKnownHostsFile={}", quote_option(auth.known_hosts())?),
                "GlobalKnownHostsFile=/dev/null".to_owned(),
                "UpdateHostKeys=no".to_owned(),
                "CheckHostIP=no".to_owned(),
                // Adds no key: it writes down the key the server offered, for the message when
                // that key is refused (a shell of /bin/sh, a file in a private directory).
                format!(
                    "KnownHostsCommand=/bin/sh -c 'echo \"$1 $2\" > \"$3\"' ginx %t %K {}",
                    quote_option(&offered)?
                ),
                "IdentitiesOnly=yes".to_owned(),
                "IdentityAgent=none".to_owned(),
                "PasswordAuthentication=no".to_owned(),
                "KbdInteractiveAuthentication=no".to_owned(),
                "ControlMaster=no".to_owned(),
                "ControlPath=none".to_owned(),
                "ClearAllForwardings=yes".to_owned(),
                format!("ConnectTimeout={t}"),
                format!("ServerAliveInterval={}", (t / 3).clamp(1, 15)),
                "ServerAliveCountMax=3".to_owned(),
                "LogLevel=ERROR".to_owned(),
            ]
            .into_iter()
            .flat_map(|o| ["-o".to_owned(), o]),
        );
        match auth.ssh_key() {
            Some(key) => {
                cmd.arg("-o")
                    .arg(format!("IdentityFile={}", quote_option(key)?));
            }
            None => {
                cmd.args(["-o", "PubkeyAuthentication=no"]);
            }
        }
        if let Some(p) = target.port {
            cmd.arg("-p").arg(p.to_string());
        }
        if let Some(u) = &target.user {
            cmd.arg("-l").arg(u);
        }
        cmd.arg("--").arg(&target.host).arg(target.command());
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // No password prompt on a terminal ginx might have.
            .env_remove("SSH_ASKPASS")
            .env_remove("SSH_AUTH_SOCK")
            .env_remove("DISPLAY");
        let mut child = cmd.spawn().map_err(|e| {
            let _ = std::fs::remove_dir_all(&scratch);
            if e.kind() == io::ErrorKind::NotFound {
                "cannot run `ssh`: OpenSSH's client, which ginx runs for SSH remotes, is not on \
                 ginx's PATH; install it (openssh)"
                    .to_owned()
            } else {
                format!("cannot run `ssh`: {e}")
            }
        })?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().ok_or("ssh has no stdout")?;
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let stderr_reader = child.stderr.take().map(|mut err| {
            let sink = Arc::clone(&stderr);
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n) = err.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    let mut s = sink.lock().unwrap_or_else(|e| e.into_inner());
                    let room = STDERR_LIMIT.saturating_sub(s.len());
                    s.extend_from_slice(&buf[..n.min(room)]);
                }
            })
        });
        Ok(Self {
            child,
            stdin,
            stdout,
            stderr,
            stderr_reader,
            scratch,
            name: target.known_hosts_name(),
            known_hosts: auth.known_hosts().to_owned(),
            has_key: auth.ssh_key().is_some(),
            ended: false,
        })
    }

    /// Why `ssh` failed, in words an operator can act on.
    fn failure(&mut self, status: std::process::ExitStatus) -> String {
        if let Some(r) = self.stderr_reader.take() {
            let _ = r.join();
        }
        let stderr =
            String::from_utf8_lossy(&self.stderr.lock().unwrap_or_else(|e| e.into_inner()))
                .into_owned();
        if stderr.contains("Host key verification failed") {
            let offered = std::fs::read_to_string(self.scratch.join("offered")).unwrap_or_default();
            return match ssh_key::PublicKey::from_openssh(offered.trim()) {
                Ok(key) => match check_host_key(&self.known_hosts, &self.name, &key) {
                    Err(why) => why,
                    // ssh knows better (a @cert-authority line, say): say what it said.
                    Ok(()) => format!(
                        "ssh refused the host key of {} ({}): {}",
                        self.name,
                        key.fingerprint(ssh_key::HashAlg::Sha256),
                        last_lines(&stderr)
                    ),
                },
                Err(_) => format!(
                    "ssh refused the host key of {}: {}",
                    self.name,
                    last_lines(&stderr)
                ),
            };
        }
        if stderr.contains("Permission denied") {
            return if self.has_key {
                "authentication failed: the server rejected the configured credentials \
                 (ssh_key_file)"
                    .to_owned()
            } else {
                "authentication failed: the SSH server wants a key; configure ssh_key_file"
                    .to_owned()
            };
        }
        let said = last_lines(&stderr);
        if said.is_empty() {
            format!("ssh ended with {status} before the server answered")
        } else {
            said
        }
    }

    /// Reaps `ssh` once its output ended; an error if it failed.
    fn end(&mut self) -> io::Result<()> {
        if self.ended {
            return Ok(());
        }
        self.ended = true;
        drop(self.stdin.take());
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        let status = loop {
            match self.child.try_wait()? {
                Some(s) => break s,
                None if std::time::Instant::now() >= deadline => {
                    let _ = self.child.kill();
                    break self.child.wait()?;
                }
                None => std::thread::sleep(Duration::from_millis(10)),
            }
        };
        if status.success() {
            Ok(())
        } else {
            Err(io::Error::other(self.failure(status)))
        }
    }
}

impl Read for SshStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        let t = timeout();
        let ms = u16::try_from(t.as_millis()).unwrap_or(u16::MAX);
        let deadline = std::time::Instant::now() + t;
        loop {
            let mut fds = [PollFd::new(self.stdout.as_fd(), PollFlags::POLLIN)];
            match poll(&mut fds, PollTimeout::from(ms.min(10_000))) {
                Ok(0) if std::time::Instant::now() < deadline => continue,
                Ok(0) => {
                    let _ = self.child.kill();
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("the SSH server sent nothing for {} s", t.as_secs_f64()),
                    ));
                }
                Ok(_) => break,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => return Err(io::Error::from(e)),
            }
        }
        let n = self.stdout.read(buf)?;
        if n == 0 {
            self.end()?;
        }
        Ok(n)
    }
}

impl Write for SshStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self.stdin.as_mut() {
            Some(s) => match s.write(buf) {
                // `ssh` is gone: say why rather than "broken pipe".
                Err(e) if e.kind() == io::ErrorKind::BrokenPipe => {
                    self.end()?;
                    Err(e)
                }
                r => r,
            },
            None => Err(io::Error::other("ssh's input is closed")),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self.stdin.as_mut() {
            Some(s) => s.flush(),
            None => Ok(()),
        }
    }
}

impl Drop for SshStream {
    fn drop(&mut self) {
        if !self.ended {
            // libgit2 is done (it read the pack to its end): with its input closed, `ssh` and
            // the server's upload-pack end by themselves; one that does not is killed.
            drop(self.stdin.take());
            let deadline = std::time::Instant::now() + Duration::from_secs(2);
            while matches!(self.child.try_wait(), Ok(None)) {
                if std::time::Instant::now() >= deadline {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        let _ = std::fs::remove_dir_all(&self.scratch);
    }
}

/// The last lines `ssh` wrote, one line: what it said went wrong.
fn last_lines(stderr: &str) -> String {
    let lines: Vec<&str> = stderr
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('@'))
        .collect();
    let start = lines.len().saturating_sub(3);
    lines[start..].join("; ")
}

/// A path for an `ssh -o` option, double-quoted; refused if quoting cannot carry it.
fn quote_option(path: &Path) -> Result<String, String> {
    match crate::types::unfit_for_ssh_option(path) {
        Some(why) => Err(format!("{} {why}", path.display())),
        None => Ok(format!("\"{}\"", path.display())),
    }
}

/// A new directory only this user can enter, under the temporary directory.
fn private_dir() -> Result<PathBuf, String> {
    use std::os::unix::fs::DirBuilderExt;
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let base = std::env::temp_dir();
    for _ in 0..8 {
        let nonce = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let dir = base.join(format!(
            "ginx-ssh-{}-{}-{nonce:08x}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        // mkdir neither follows nor replaces what is there: a name taken is tried again.
        match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => {
                return Err(format!(
                    "cannot create a private directory in {}: {e}",
                    base.display()
                ));
            }
        }
    }
    Err(format!(
        "cannot create a private directory in {}",
        base.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ssh_remotes_are_parsed_as_git_parses_them() {
        let t = SshTarget::parse("ssh://git@example.com:2222/srv/h.git").unwrap();
        assert_eq!(
            t,
            SshTarget {
                user: Some("git".into()),
                host: "example.com".into(),
                port: Some(2222),
                path: "/srv/h.git".into()
            }
        );
        assert_eq!(t.known_hosts_name(), "[example.com]:2222");
        assert_eq!(t.command(), "git-upload-pack '/srv/h.git'");
        let t = SshTarget::parse("git@example.com:org/h.git").unwrap();
        assert_eq!(
            (t.host.as_str(), t.path.as_str()),
            ("example.com", "org/h.git")
        );
        assert_eq!(t.known_hosts_name(), "example.com");
        let t = SshTarget::parse("ssh://[::1]:22/~deploy/it's.git").unwrap();
        assert_eq!(t.host, "::1");
        assert_eq!(t.known_hosts_name(), "::1");
        assert_eq!(t.command(), r"git-upload-pack '~deploy/it'\''s.git'");
        let t = SshTarget::parse("[::1]:h.git").unwrap();
        assert_eq!((t.host.as_str(), t.path.as_str()), ("::1", "h.git"));
    }

    #[test]
    fn an_ssh_host_or_user_that_reads_as_an_option_is_refused() {
        for raw in [
            "ssh://-oProxyCommand=touch%20x/h.git",
            "-oProxyCommand=x:h.git",
            "ssh://-l@host/h.git",
            "host:",
        ] {
            assert!(SshTarget::parse(raw).is_err(), "{raw}");
        }
    }

    #[test]
    fn an_http_endpoint_keeps_the_query_and_adds_the_service() {
        let base = url::Url::parse("https://h.example/g/h.git?private=1").unwrap();
        assert_eq!(
            HttpInner::endpoint(&base, "info/refs", Some("service=git-upload-pack")).as_str(),
            "https://h.example/g/h.git/info/refs?private=1&service=git-upload-pack"
        );
        let base = url::Url::parse("https://h.example/g/h.git/").unwrap();
        assert_eq!(
            HttpInner::endpoint(&base, "git-upload-pack", None).as_str(),
            "https://h.example/g/h.git/git-upload-pack"
        );
    }

    #[test]
    fn ssh_options_refuse_paths_they_cannot_quote() {
        assert_eq!(
            quote_option(Path::new("/var/lib/ginx/known_hosts")).unwrap(),
            "\"/var/lib/ginx/known_hosts\""
        );
        assert!(quote_option(Path::new("/tmp/a%b")).is_err());
        assert!(quote_option(Path::new("/tmp/a\"b")).is_err());
    }

    #[test]
    fn a_redirected_advertisement_moves_the_repository_base() {
        let answered = url::Url::parse(
            "https://new.example/g/h.git/info/refs?private=1&service=git-upload-pack",
        )
        .unwrap();
        assert_eq!(
            moved_base(&answered).as_str(),
            "https://new.example/g/h.git?private=1"
        );
        let answered =
            url::Url::parse("https://new.example/h.git/info/refs?service=git-upload-pack").unwrap();
        assert_eq!(moved_base(&answered).as_str(), "https://new.example/h.git");
    }

    #[test]
    fn only_a_smart_http_success_of_the_kind_asked_for_is_an_answer() {
        use reqwest::StatusCode;
        let adv = "application/x-git-upload-pack-advertisement";
        let result = "application/x-git-upload-pack-result";
        assert_eq!(answer_problem(false, StatusCode::OK, adv), None);
        assert_eq!(answer_problem(true, StatusCode::OK, result), None);
        let not_git = answer_problem(false, StatusCode::OK, "text/html").unwrap();
        assert!(
            not_git.contains("is the URL a Git repository?"),
            "{not_git}"
        );
        assert!(answer_problem(true, StatusCode::OK, adv).is_some());
        assert_eq!(
            answer_problem(false, StatusCode::NOT_FOUND, adv).as_deref(),
            Some("the server answered 404 Not Found (check the repository's URL)")
        );
        assert_eq!(
            answer_problem(true, StatusCode::FORBIDDEN, result).as_deref(),
            Some(
                "the server answered 403 Forbidden (check token_file and the deploy token's access)"
            )
        );
    }
}
