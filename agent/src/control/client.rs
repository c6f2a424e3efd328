//! The client side of the control socket, used by `ginxctl`. Blocking: one request, one answer.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::de::DeserializeOwned;

use super::protocol::{Command, ErrorBody, PROTOCOL_VERSION, Request, Response};

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot reach ginx at {} — is ginx.service running? ({source})", socket.display())]
    Unreachable {
        socket: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "permission denied opening {}: changing ginx needs root or membership in its control \
         group (control.group); reading status needs access to the socket",
        socket.display()
    )]
    Denied { socket: PathBuf },
    #[error("lost the connection to ginx at {}: {source}", socket.display())]
    Io {
        socket: PathBuf,
        source: std::io::Error,
    },
    #[error("ginx at {} sent an answer this ginxctl does not understand: {message}", socket.display())]
    Protocol { socket: PathBuf, message: String },
    #[error("{}", .0.message)]
    Daemon(ErrorBody),
}

impl ClientError {
    /// 2 when ginx cannot be reached, 1 when it answered with an error.
    pub fn exit_code(&self) -> u8 {
        match self {
            ClientError::Unreachable { .. } | ClientError::Denied { .. } => 2,
            ClientError::Io { .. } | ClientError::Protocol { .. } | ClientError::Daemon(_) => 1,
        }
    }
}

pub struct Client {
    socket: PathBuf,
    timeout: Duration,
}

impl Client {
    pub fn new(socket: &Path, timeout: Duration) -> Self {
        Self {
            socket: socket.to_owned(),
            timeout,
        }
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
        let stream = UnixStream::connect(&self.socket).map_err(|source| {
            if source.kind() == std::io::ErrorKind::PermissionDenied {
                ClientError::Denied {
                    socket: self.socket.clone(),
                }
            } else {
                ClientError::Unreachable {
                    socket: self.socket.clone(),
                    source,
                }
            }
        })?;
        let io = |source| ClientError::Io {
            socket: self.socket.clone(),
            source,
        };
        stream.set_read_timeout(Some(self.timeout)).map_err(io)?;
        stream.set_write_timeout(Some(self.timeout)).map_err(io)?;
        let mut line = serde_json::to_vec(&Request {
            version: PROTOCOL_VERSION,
            command,
        })
        .map_err(|e| ClientError::Protocol {
            socket: self.socket.clone(),
            message: e.to_string(),
        })?;
        line.push(b'\n');
        (&stream).write_all(&line).map_err(io)?;
        let mut reply = String::new();
        BufReader::new(&stream).read_line(&mut reply).map_err(io)?;
        if reply.is_empty() {
            return Err(io(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "ginx closed the connection without answering",
            )));
        }
        let response: Response =
            serde_json::from_str(&reply).map_err(|e| ClientError::Protocol {
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
}
