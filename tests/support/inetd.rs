//! A TCP listener on 127.0.0.1 that hands each connection to a fresh process on its stdin and
//! stdout, as inetd does: `git daemon --inetd`, `sshd -i`. The port is the one the listener was
//! bound to, so there is no race for a free port.

use std::net::{TcpListener, TcpStream};
use std::os::fd::OwnedFd;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

pub struct InetdServer {
    pub port: u16,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl InetdServer {
    /// Serves each connection with the command `make` builds.
    pub fn start(make: impl Fn() -> Command + Send + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("binding 127.0.0.1");
        let port = listener.local_addr().unwrap().port();
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            for conn in listener.incoming() {
                if stopping.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(conn) = conn else { continue };
                let fd: OwnedFd = conn.into();
                let Ok(input) = fd.try_clone() else { continue };
                let mut cmd = make();
                cmd.stdin(Stdio::from(input))
                    .stdout(Stdio::from(fd))
                    .stderr(Stdio::null());
                if let Ok(mut child) = cmd.spawn() {
                    std::thread::spawn(move || {
                        let _ = child.wait();
                    });
                }
            }
        });
        Self {
            port,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for InetdServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// `git daemon` serving every repository under `base` at `git://127.0.0.1:PORT/<name>`.
pub fn git_daemon(base: &std::path::Path) -> InetdServer {
    let base = base.to_owned();
    InetdServer::start(move || {
        let mut c = super::git::git_cmd();
        c.arg("daemon")
            .arg("--inetd")
            .arg("--export-all")
            .arg("--informative-errors")
            .arg(format!("--base-path={}", base.display()))
            .arg(&base);
        c
    })
}
