//! The client side of the control socket, used by `ginxctl`. Blocking: one request, one answer.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::de::DeserializeOwned;

use super::protocol::{Command, ErrorBody, PROTOCOL_VERSION, Request, Response};

/// The longest reply `ginxctl` reads; a longer one is not from a ginx it can talk to.
pub const MAX_REPLY: usize = 64 * 1024 * 1024;
pub const MAX_REPLY_TEXT: &str = "64 MiB";

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    // I/O errors are part of the messages, not `source()`s: a chain printer would repeat them.
    #[error("cannot reach ginx at {} — is ginx.service running? ({error})", socket.display())]
    Unreachable {
        socket: PathBuf,
        error: std::io::Error,
    },
    #[error(
        "{} is not a socket (it is {kind}); point --socket, GINX_SOCKET or `socket` in the \
         configuration at ginx's control socket",
        socket.display()
    )]
    NotASocket { socket: PathBuf, kind: &'static str },
    #[error(
        "permission denied opening {}: even reading ginx's status needs access to its socket, \
         which belongs to ginx's control group (control.group, mode 0660): run as root or as a \
         member of that group",
        socket.display()
    )]
    Denied { socket: PathBuf },
    #[error(
        "no answer from ginx at {} within {timeout}; it may be busy or stuck: check \
         `journalctl -u ginx`, or wait longer with --timeout",
        socket.display()
    )]
    NoAnswer { socket: PathBuf, timeout: String },
    #[error("lost the connection to ginx at {}: {error}", socket.display())]
    Io {
        socket: PathBuf,
        error: std::io::Error,
    },
    #[error("ginx at {} sent an answer this ginxctl does not understand: {message}", socket.display())]
    Protocol { socket: PathBuf, message: String },
    #[error("{}", .0.message)]
    Daemon(ErrorBody),
}

impl ClientError {
    /// 2 when ginx cannot be reached or does not answer, 1 when it answered with an error.
    pub fn exit_code(&self) -> u8 {
        match self {
            ClientError::Unreachable { .. }
            | ClientError::NotASocket { .. }
            | ClientError::Denied { .. }
            | ClientError::NoAnswer { .. } => 2,
            ClientError::Io { .. } | ClientError::Protocol { .. } | ClientError::Daemon(_) => 1,
        }
    }
}

pub struct Client {
    socket: PathBuf,
    timeout: Duration,
}

impl Client {
    /// `timeout` bounds the whole call: connecting, sending and reading the reply.
    pub fn new(socket: &Path, timeout: Duration) -> Self {
        Self {
            socket: socket.to_owned(),
            timeout,
        }
    }

    /// The same socket with another timeout.
    pub fn with_timeout(&self, timeout: Duration) -> Self {
        Self::new(&self.socket, timeout)
    }

    /// Sends `command` and decodes the result.
    pub fn call<T: DeserializeOwned>(&self, command: Command) -> Result<T, ClientError> {
        let value = self.call_raw(command)?;
        serde_json::from_value(value).map_err(|e| ClientError::Protocol {
            socket: self.socket.clone(),
            message: e.to_string(),
        })
    }

    pub fn call_raw(&self, command: Command) -> Result<serde_json::Value, ClientError> {
        let deadline = Instant::now() + self.timeout;
        let stream = self.connect()?;
        let mut line = serde_json::to_vec(&Request {
            version: PROTOCOL_VERSION,
            command,
        })
        .map_err(|e| ClientError::Protocol {
            socket: self.socket.clone(),
            message: e.to_string(),
        })?;
        line.push(b'\n');
        let reply = match self.exchange(&stream, &line, deadline) {
            Ok(()) => self.read_reply(&stream, deadline)?,
            // A refusal (too many connections) can be written and the connection closed before
            // ginx read the request: sending then fails with EPIPE, but the refusal is there
            // to read, and it says more than "lost the connection".
            Err(sent @ ClientError::Io { .. }) => match self.read_reply(&stream, deadline) {
                Ok(reply) => reply,
                Err(_) => return Err(sent),
            },
            Err(e) => return Err(e),
        };
        let response: Response =
            serde_json::from_slice(&reply).map_err(|e| ClientError::Protocol {
                socket: self.socket.clone(),
                message: e.to_string(),
            })?;
        match (response.ok, response.result, response.error) {
            (true, Some(v), _) => Ok(v),
            (true, None, _) => Ok(serde_json::Value::Null),
            (false, _, Some(e)) => Err(ClientError::Daemon(e)),
            (false, _, None) => Err(ClientError::Protocol {
                socket: self.socket.clone(),
                message: "error reply without an error".into(),
            }),
        }
    }

    /// Connects within the timeout: a unix socket's connect waits for room in a full backlog
    /// only as long as the send timeout, which is set first.
    fn connect(&self) -> Result<UnixStream, ClientError> {
        use nix::sys::socket::{self, AddressFamily, SockFlag, SockType, UnixAddr, sockopt};
        let unreachable = |error: std::io::Error| {
            if error.kind() == std::io::ErrorKind::PermissionDenied {
                ClientError::Denied {
                    socket: self.socket.clone(),
                }
            } else if let Some(kind) = not_a_socket(&self.socket) {
                ClientError::NotASocket {
                    socket: self.socket.clone(),
                    kind,
                }
            } else {
                ClientError::Unreachable {
                    socket: self.socket.clone(),
                    error,
                }
            }
        };
        let errno = |e: nix::errno::Errno| std::io::Error::from_raw_os_error(e as i32);
        let addr = UnixAddr::new(&self.socket).map_err(|e| unreachable(errno(e)))?;
        let fd = socket::socket(
            AddressFamily::Unix,
            SockType::Stream,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .map_err(|e| unreachable(errno(e)))?;
        let tv = nix::sys::time::TimeVal::new(
            i64::try_from(self.timeout.as_secs()).unwrap_or(i64::MAX),
            i64::from(self.timeout.subsec_micros()),
        );
        socket::setsockopt(&fd, sockopt::SendTimeout, &tv).map_err(|e| unreachable(errno(e)))?;
        match socket::connect(fd.as_raw_fd(), &addr) {
            Ok(()) => Ok(UnixStream::from(fd)),
            Err(nix::errno::Errno::EAGAIN) => Err(self.no_answer()),
            Err(e) => Err(unreachable(errno(e))),
        }
    }

    fn no_answer(&self) -> ClientError {
        ClientError::NoAnswer {
            socket: self.socket.clone(),
            timeout: crate::config::Duration::from(self.timeout).to_string(),
        }
    }

    fn remaining(&self, deadline: Instant) -> Result<Duration, ClientError> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            Err(self.no_answer())
        } else {
            Ok(left)
        }
    }

    fn io(&self, error: std::io::Error) -> ClientError {
        match error.kind() {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => self.no_answer(),
            _ => ClientError::Io {
                socket: self.socket.clone(),
                error,
            },
        }
    }

    fn exchange(
        &self,
        mut stream: &UnixStream,
        line: &[u8],
        deadline: Instant,
    ) -> Result<(), ClientError> {
        let mut rest = line;
        while !rest.is_empty() {
            stream
                .set_write_timeout(Some(self.remaining(deadline)?))
                .map_err(|e| self.io(e))?;
            match stream.write(rest) {
                Ok(0) => return Err(self.io(std::io::ErrorKind::WriteZero.into())),
                Ok(n) => rest = &rest[n..],
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.io(e)),
            }
        }
        Ok(())
    }

    /// The reply line, read until the deadline and at most [`MAX_REPLY`] bytes.
    fn read_reply(
        &self,
        mut stream: &UnixStream,
        deadline: Instant,
    ) -> Result<Vec<u8>, ClientError> {
        let mut reply = Vec::new();
        let mut buf = [0u8; 64 * 1024];
        loop {
            stream
                .set_read_timeout(Some(self.remaining(deadline)?))
                .map_err(|e| self.io(e))?;
            let n = match stream.read(&mut buf) {
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(self.io(e)),
            };
            if n == 0 {
                return Err(self.io(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    if reply.is_empty() {
                        "ginx closed the connection without answering"
                    } else {
                        "ginx closed the connection in the middle of its answer"
                    },
                )));
            }
            if let Some(end) = buf[..n].iter().position(|&b| b == b'\n') {
                reply.extend_from_slice(&buf[..end]);
                return if reply.len() > MAX_REPLY {
                    Err(self.too_long())
                } else {
                    Ok(reply)
                };
            }
            reply.extend_from_slice(&buf[..n]);
            if reply.len() > MAX_REPLY {
                return Err(self.too_long());
            }
        }
    }

    fn too_long(&self) -> ClientError {
        ClientError::Protocol {
            socket: self.socket.clone(),
            message: format!("the reply is longer than {MAX_REPLY_TEXT}; is that ginx's socket?"),
        }
    }
}

/// What the path is when it exists and is not a socket.
fn not_a_socket(path: &Path) -> Option<&'static str> {
    use std::os::unix::fs::FileTypeExt;
    let ft = std::fs::metadata(path).ok()?.file_type();
    if ft.is_socket() {
        None
    } else if ft.is_dir() {
        Some("a directory")
    } else if ft.is_file() {
        Some("a regular file")
    } else {
        Some("not a socket")
    }
}
