//! A TCP proxy on 127.0.0.1 that can black-hole its traffic, for partition tests: one ginx
//! reaches the API server through it, and [`Blackhole::cut`] makes that ginx's requests go
//! unanswered (bytes are swallowed, connections stay open, new ones are accepted and hear
//! nothing), as a partition that drops packets does. [`Blackhole::heal`] closes every
//! connection that lived through the cut (their streams lost bytes, as a real partition's
//! connections are reset sooner or later) and forwards again.
//!
//! Threads and sockets end when the value is dropped.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub struct Blackhole {
    pub addr: SocketAddr,
    cut: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<TcpStream>>>,
}

impl Blackhole {
    /// A proxy to `upstream` (an address on 127.0.0.1), forwarding.
    pub fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let cut = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let conns: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let (c, s, k) = (Arc::clone(&cut), Arc::clone(&stop), Arc::clone(&conns));
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((client, _)) => {
                        client.set_nonblocking(false).unwrap();
                        let Ok(server) = TcpStream::connect(upstream) else {
                            continue;
                        };
                        {
                            let mut all = k.lock().unwrap();
                            all.push(client.try_clone().unwrap());
                            all.push(server.try_clone().unwrap());
                        }
                        pump(client.try_clone().unwrap(), server.try_clone().unwrap(), &c);
                        pump(server, client, &c);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        Self {
            addr,
            cut,
            stop,
            conns,
        }
    }

    /// `https://127.0.0.1:<port>`: the URL to give a kubeconfig.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// From now on nothing gets through, either way.
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
    }

    /// Forwards again; the connections that lived through the cut are closed.
    pub fn heal(&self) {
        self.close_all();
        self.cut.store(false, Ordering::SeqCst);
    }

    fn close_all(&self) {
        for c in self.conns.lock().unwrap().drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
    }
}

impl Drop for Blackhole {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.close_all();
    }
}

/// Copies `from` → `to` on a thread of its own, swallowing what arrives while `cut` is set.
fn pump(mut from: TcpStream, mut to: TcpStream, cut: &Arc<AtomicBool>) {
    let cut = Arc::clone(cut);
    std::thread::spawn(move || {
        let mut buf = [0u8; 16 * 1024];
        loop {
            let n = match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if cut.load(Ordering::SeqCst) {
                continue;
            }
            if to.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    });
}
