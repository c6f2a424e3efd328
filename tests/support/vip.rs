//! A stand-in for kube-vip's virtual IP in front of stacked API servers: a TCP proxy on
//! 127.0.0.1 that sends each new connection to the API server it used last, or, when that
//! one refuses, to the next that accepts, as the VIP stays with a node until it fails and then
//! moves. A connection whose API server goes away is closed on the client's side too, as a
//! moved VIP's old connections are reset: the client connects again and lands on a live one.
//!
//! Threads and sockets end when the value is dropped.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

pub struct Vip {
    pub addr: SocketAddr,
    stop: Arc<AtomicBool>,
}

impl Vip {
    pub fn start(upstreams: Vec<SocketAddr>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let current = Arc::new(AtomicUsize::new(0));
        let s = Arc::clone(&stop);
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((client, _)) => {
                        client.set_nonblocking(false).unwrap();
                        if let Some(server) = connect(&upstreams, &current) {
                            splice(client, server);
                        }
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Self { addr, stop }
    }
}

/// The current upstream if it accepts, else the next one that does (which becomes current).
fn connect(upstreams: &[SocketAddr], current: &AtomicUsize) -> Option<TcpStream> {
    let first = current.load(Ordering::Relaxed);
    for k in 0..upstreams.len() {
        let i = (first + k) % upstreams.len();
        if let Ok(s) = TcpStream::connect_timeout(&upstreams[i], Duration::from_millis(200)) {
            current.store(i, Ordering::Relaxed);
            return Some(s);
        }
    }
    None
}

/// Copies both ways until either side ends, then closes both.
fn splice(client: TcpStream, server: TcpStream) {
    let pairs = [
        (client.try_clone().unwrap(), server.try_clone().unwrap()),
        (server, client),
    ];
    for (mut from, mut to) in pairs {
        std::thread::spawn(move || {
            let mut buf = [0u8; 16384];
            loop {
                match from.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if to.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                }
            }
            let _ = to.shutdown(Shutdown::Both);
            let _ = from.shutdown(Shutdown::Both);
        });
    }
}

impl Drop for Vip {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}
