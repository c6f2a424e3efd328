//! Sending a datagram to journald over its native protocol
//! (<https://systemd.io/JOURNAL_NATIVE_PROTOCOL/>): one `sendto` on an unbound datagram socket,
//! and, when the entry is larger than a datagram may be (`EMSGSIZE`), the entry written to a
//! sealed memfd whose descriptor is passed instead (`SCM_RIGHTS`), as that document says.
//!
//! Owns the socket; what an entry holds is `entry.rs`'s business.

use std::io::{self, IoSlice, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{FcntlArg, SealFlag, fcntl};
use nix::sys::memfd::{MFdFlags, memfd_create};
use nix::sys::socket::{ControlMessage, MsgFlags, UnixAddr, sendmsg};

/// Where journald listens for native entries.
pub const JOURNAL_SOCKET: &str = "/run/systemd/journal/socket";

/// An unbound datagram socket and journald's address.
#[derive(Debug)]
pub struct Sender {
    socket: UnixDatagram,
    path: PathBuf,
}

impl Sender {
    pub fn new(path: &Path) -> io::Result<Sender> {
        Ok(Sender {
            socket: UnixDatagram::unbound()?,
            path: path.to_owned(),
        })
    }

    /// Sends one entry. An error is the caller's to drop: there is nowhere left to log it.
    pub fn send(&self, payload: &[u8]) -> io::Result<()> {
        match self.socket.send_to(payload, &self.path) {
            Ok(_) => Ok(()),
            Err(e) if e.raw_os_error() == Some(Errno::EMSGSIZE as i32) => self.send_large(payload),
            Err(e) => Err(e),
        }
    }

    /// The entry in a memfd, sealed so that journald may map it knowing it cannot change.
    fn send_large(&self, payload: &[u8]) -> io::Result<()> {
        let fd: OwnedFd = memfd_create(
            c"ginx-journal",
            MFdFlags::MFD_ALLOW_SEALING | MFdFlags::MFD_CLOEXEC,
        )?;
        let mut file = std::fs::File::from(fd);
        file.write_all(payload)?;
        fcntl(&file, FcntlArg::F_ADD_SEALS(SealFlag::all()))?;
        let addr = UnixAddr::new(&self.path)?;
        let fds = [file.as_raw_fd()];
        sendmsg(
            self.socket.as_raw_fd(),
            &[] as &[IoSlice<'_>],
            &[ControlMessage::ScmRights(&fds)],
            MsgFlags::empty(),
            Some(&addr),
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::io::{IoSliceMut, Read, Seek};
    use std::os::fd::FromRawFd;

    use nix::sys::socket::{ControlMessageOwned, recvmsg};

    use super::*;

    /// What a journald listening at a socket of the test receives: the payload, from the
    /// datagram or from the memfd passed with it.
    fn receive(socket: &UnixDatagram) -> Vec<u8> {
        let mut buf = vec![0u8; 1 << 16];
        let mut cmsg = nix::cmsg_space!([std::os::fd::RawFd; 1]);
        let mut iov = [IoSliceMut::new(&mut buf)];
        let msg = recvmsg::<UnixAddr>(
            socket.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg),
            MsgFlags::empty(),
        )
        .unwrap();
        let passed = msg.cmsgs().unwrap().find_map(|c| match c {
            ControlMessageOwned::ScmRights(fds) => fds.first().copied(),
            _ => None,
        });
        let len = msg.bytes;
        match passed {
            Some(fd) => {
                // SAFETY: the descriptor was just received and is owned by nobody else.
                let mut f = unsafe { std::fs::File::from_raw_fd(fd) };
                f.rewind().unwrap();
                let mut out = Vec::new();
                f.read_to_end(&mut out).unwrap();
                out
            }
            None => buf[..len].to_vec(),
        }
    }

    #[test]
    fn small_entries_go_in_a_datagram_and_large_ones_in_a_sealed_memfd() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal.socket");
        let journald = UnixDatagram::bind(&path).unwrap();
        let sender = Sender::new(&path).unwrap();
        sender.send(b"MESSAGE=small\n").unwrap();
        assert_eq!(receive(&journald), b"MESSAGE=small\n");
        // Larger than the socket's send buffer allows in one datagram.
        let large = vec![b'x'; 4 << 20];
        sender.send(&large).unwrap();
        assert_eq!(receive(&journald), large);
    }

    #[test]
    fn no_journald_is_an_error_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let sender = Sender::new(&dir.path().join("absent")).unwrap();
        assert!(sender.send(b"MESSAGE=x\n").is_err());
    }
}
