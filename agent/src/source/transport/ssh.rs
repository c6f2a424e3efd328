//! The SSH transport: `git-upload-pack` run on the server by OpenSSH's `ssh`, the host key
//! checked against `known_hosts_file` alone and the deploy key the only identity offered.

use std::io::{self, Read, Write};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use git2::transport::{Service, SmartSubtransport, SmartSubtransportStream};

use super::{only_fetch, percent_decode, timeout};
use crate::source::auth::{Auth, check_host_key};

/// Fetches over SSH by running OpenSSH's client.
pub(super) struct Ssh(pub(super) Auth);

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
    fn ssh_options_refuse_paths_they_cannot_quote() {
        assert_eq!(
            quote_option(Path::new("/var/lib/ginx/known_hosts")).unwrap(),
            "\"/var/lib/ginx/known_hosts\""
        );
        assert!(quote_option(Path::new("/tmp/a%b")).is_err());
        assert!(quote_option(Path::new("/tmp/a\"b")).is_err());
    }
}
