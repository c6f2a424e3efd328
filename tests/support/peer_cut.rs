//! A proxy in front of one etcd member's peer port that can cut members off their peers, for
//! a member kept behind: its client port answers, but no raft message reaches it or leaves it.
//!
//! etcd's peers talk HTTP/1.1 (etcd's `rafthttp`): a member dials another's peer URL to
//! receive its messages over a long-lived stream (`GET /raft/stream/...`), and posts messages
//! and snapshots to it (`POST /raft...`); both requests name the dialing member in the
//! `X-Server-From` header, as its hexadecimal id. The proxy reads each connection's first
//! request head, learns who dials, and closes the connection at once when the member behind
//! the proxy or the dialing one is cut; otherwise it forwards both ways. Cutting closes the
//! live connections of the members cut, as a partition's connections are reset.
//!
//! Threads and sockets end when the value is dropped.

use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The members cut off (hexadecimal ids), shared by every member's proxy.
#[derive(Clone, Default)]
pub struct Cuts {
    cut: Arc<Mutex<HashSet<String>>>,
    /// Each proxy's member (by index), as a hexadecimal id: known once the cluster started.
    ids: Arc<Mutex<Vec<String>>>,
    conns: Arc<Mutex<Vec<Conn>>>,
}

/// A live connection: the index of the member behind the proxy, the dialing member, and the
/// two sockets.
type Conn = (usize, String, TcpStream, TcpStream);

impl Cuts {
    /// Names the members behind the proxies, in their order.
    pub fn set_ids(&self, ids: Vec<String>) {
        *self.ids.lock().unwrap() = ids;
    }

    fn id(&self, index: usize) -> String {
        self.ids
            .lock()
            .unwrap()
            .get(index)
            .cloned()
            .unwrap_or_default()
    }

    /// Cuts `member` off: its live peer connections are closed, new ones refused.
    pub fn cut(&self, member: &str) {
        self.cut.lock().unwrap().insert(member.to_owned());
        let ids = self.ids.lock().unwrap().clone();
        self.conns.lock().unwrap().retain(|(to, from, a, b)| {
            let gone = ids.get(*to).is_some_and(|t| t == member) || from == member;
            if gone {
                let _ = a.shutdown(Shutdown::Both);
                let _ = b.shutdown(Shutdown::Both);
            }
            !gone
        });
    }

    pub fn heal(&self) {
        self.cut.lock().unwrap().clear();
    }

    fn is_cut(&self, to: usize, from: &str) -> bool {
        let to = self.id(to);
        let cut = self.cut.lock().unwrap();
        cut.contains(&to) || cut.contains(from)
    }
}

pub struct PeerProxy {
    pub addr: SocketAddr,
    stop: Arc<AtomicBool>,
}

impl PeerProxy {
    /// A proxy on a port of its own to the peer port `upstream` of member `index`.
    pub fn start(index: usize, upstream: SocketAddr, cuts: Cuts) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let s = Arc::clone(&stop);
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((client, _)) => {
                        let cuts = cuts.clone();
                        std::thread::spawn(move || forward(client, upstream, &cuts, index));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Self { addr, stop }
    }
}

impl Drop for PeerProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Reads the first request head, then forwards (or closes, when cut).
fn forward(mut client: TcpStream, upstream: SocketAddr, cuts: &Cuts, owner: usize) {
    client.set_nonblocking(false).unwrap();
    client
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") && head.len() < 16384 {
        match client.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => return,
        }
    }
    client.set_read_timeout(None).unwrap();
    let text = String::from_utf8_lossy(&head).to_lowercase();
    let from = text
        .lines()
        .find_map(|l| l.strip_prefix("x-server-from:"))
        .map(|v| v.trim().to_owned())
        .unwrap_or_default();
    if cuts.is_cut(owner, &from) {
        return;
    }
    let Ok(mut server) = TcpStream::connect(upstream) else {
        return;
    };
    if server.write_all(&head).is_err() {
        return;
    }
    cuts.conns.lock().unwrap().push((
        owner,
        from,
        client.try_clone().unwrap(),
        server.try_clone().unwrap(),
    ));
    for (mut a, mut b) in [
        (client.try_clone().unwrap(), server.try_clone().unwrap()),
        (server, client),
    ] {
        std::thread::spawn(move || {
            let mut buf = [0u8; 16384];
            while let Ok(n) = a.read(&mut buf) {
                if n == 0 || b.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            let _ = a.shutdown(Shutdown::Both);
            let _ = b.shutdown(Shutdown::Both);
        });
    }
}
