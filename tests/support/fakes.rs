//! Stand-ins for the local endpoints the health probes read: a kubelet `/healthz` on TCP and a
//! Cilium agent API on a unix socket. Each answers every request with the status and body it is
//! set to (HTTP/1.1, `Connection: close`), as the real ones answer GETs.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::sync::{Arc, Mutex};

#[derive(Clone)]
pub struct Answer(Arc<Mutex<(u16, String)>>);

impl Answer {
    pub fn set(&self, code: u16, body: &str) {
        *self.0.lock().unwrap() = (code, body.to_owned());
    }
}

fn answer(stream: &mut (impl Read + Write), a: &Answer) {
    let mut buf = [0u8; 4096];
    let _ = stream.read(&mut buf);
    let (code, body) = a.0.lock().unwrap().clone();
    let _ = write!(
        stream,
        "HTTP/1.1 {code} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}

/// An HTTP endpoint on 127.0.0.1; the URL is `http://127.0.0.1:PORT/healthz`.
pub fn tcp(code: u16, body: &str) -> (String, Answer) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/healthz", listener.local_addr().unwrap());
    let a = Answer(Arc::new(Mutex::new((code, body.to_owned()))));
    let served = a.clone();
    std::thread::spawn(move || {
        for mut s in listener.incoming().flatten() {
            answer(&mut s, &served);
        }
    });
    (url, a)
}

/// An HTTP endpoint on a unix socket at `path`.
pub fn unix(path: &Path, code: u16, body: &str) -> Answer {
    let listener = UnixListener::bind(path).unwrap();
    let a = Answer(Arc::new(Mutex::new((code, body.to_owned()))));
    let served = a.clone();
    std::thread::spawn(move || {
        for mut s in listener.incoming().flatten() {
            answer(&mut s, &served);
        }
    });
    a
}
