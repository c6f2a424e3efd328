//! A three-member etcd cluster on 127.0.0.1, as kubeadm's stacked etcd is laid out: clients
//! speak HTTPS with a client certificate (the members' serving certificates and kubeadm's
//! health-check client certificate are issued by one test CA), members peer among themselves.
//! Each member also listens on a plain-HTTP client port that only the test uses, to poll
//! etcd's own view ([`EtcdCluster::status`]) without going through ginx's code.
//!
//! The members are the upstream etcd (the control-plane binary's `etcd`, built from etcd's own
//! module), unchanged. [`EtcdCluster::stop`] stops one with SIGTERM as systemd or the kubelet
//! does at a reboot; [`EtcdCluster::start`] starts it again on its data directory, and it
//! rejoins as a follower.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::tls::TestCa;

pub struct Member {
    pub name: String,
    /// `https://127.0.0.1:PORT`, what ginx is pointed at.
    pub client_url: String,
    /// The plain-HTTP client port the test polls.
    pub probe_port: u16,
    args: Vec<String>,
    log: PathBuf,
    child: Mutex<Option<Child>>,
}

pub struct EtcdCluster {
    pub dir: PathBuf,
    bin: PathBuf,
    pub ca: TestCa,
    /// kubeadm's health-check client certificate and key, and the CA, as files.
    pub ca_file: PathBuf,
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    pub members: Vec<Member>,
    /// The proxies in front of the members' peer ports, when made with cuts.
    _peers: Vec<super::peer_cut::PeerProxy>,
    _tmp: tempfile::TempDir,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl EtcdCluster {
    /// Starts members named `names` and waits until they have a leader.
    pub fn new(bin: &Path, names: &[&str]) -> Self {
        Self::with_cuts(bin, names, None)
    }

    /// As [`EtcdCluster::new`]; with `cuts`, the members reach each other's peer ports only
    /// through proxies that `cuts` can cut (tests/support/peer_cut.rs).
    pub fn with_cuts(bin: &Path, names: &[&str], cuts: Option<super::peer_cut::Cuts>) -> Self {
        // Ports are found free and let go before etcd binds them, so a process started beside
        // (another test) may take one in between; the member given it exits at once. Such a
        // cluster is made again, on other ports.
        const ATTEMPTS: usize = 3;
        for attempt in 1..=ATTEMPTS {
            match Self::make(bin, names, cuts.clone()) {
                Ok(c) => return c,
                Err(taken) if attempt < ATTEMPTS => {
                    eprintln!("etcd: {taken}; making the cluster again on other ports");
                }
                Err(taken) => panic!("etcd: {taken}, {ATTEMPTS} times"),
            }
        }
        unreachable!("the last attempt returns or panics")
    }

    /// One try at [`EtcdCluster::with_cuts`]: `Err` when a member could not bind its port.
    fn make(
        bin: &Path,
        names: &[&str],
        cuts: Option<super::peer_cut::Cuts>,
    ) -> Result<Self, String> {
        let tmp = tempfile::Builder::new()
            .prefix("ginx-etcd-")
            .tempdir()
            .unwrap();
        let dir = tmp.path().to_owned();
        let pki = dir.join("pki");
        std::fs::create_dir_all(&pki).unwrap();
        let ca = TestCa::new(&pki);
        let write = |name: &str, text: &str| {
            let p = pki.join(name);
            std::fs::write(&p, text).unwrap();
            p
        };
        let (serving, serving_key) = ca.issue_server_and_client_pem(&["localhost", "127.0.0.1"]);
        let (serving, serving_key) = (
            write("server.crt", &serving),
            write("server.key", &serving_key),
        );
        let (client, client_key) = ca.issue_client_pem("kube-etcd-healthcheck-client", &[]);
        let cert_file = write("healthcheck-client.crt", &client);
        let key_file = write("healthcheck-client.key", &client_key);
        let ports: Vec<(u16, u16, u16)> = names
            .iter()
            .map(|_| (free_port(), free_port(), free_port()))
            .collect();
        let peers: Vec<super::peer_cut::PeerProxy> = match &cuts {
            Some(c) => ports
                .iter()
                .enumerate()
                .map(|(i, (_, _, peer))| {
                    super::peer_cut::PeerProxy::start(
                        i,
                        std::net::SocketAddr::from(([127, 0, 0, 1], *peer)),
                        c.clone(),
                    )
                })
                .collect(),
            None => Vec::new(),
        };
        // What the others dial: the member's peer port, or its proxy.
        let advertised: Vec<u16> = match peers.is_empty() {
            true => ports.iter().map(|p| p.2).collect(),
            false => peers.iter().map(|p| p.addr.port()).collect(),
        };
        let initial: Vec<String> = names
            .iter()
            .zip(&advertised)
            .map(|(n, port)| format!("{n}=http://127.0.0.1:{port}"))
            .collect();
        let members = names
            .iter()
            .zip(ports.iter().zip(&advertised))
            .map(|(name, (&(client, probe, peer), &advertised))| {
                let data = dir.join(format!("{name}.etcd"));
                let client_url = format!("https://127.0.0.1:{client}");
                Member {
                    name: (*name).to_owned(),
                    client_url: client_url.clone(),
                    probe_port: probe,
                    args: vec![
                        format!("--name={name}"),
                        format!("--data-dir={}", data.display()),
                        format!("--listen-client-urls={client_url},http://127.0.0.1:{probe}"),
                        format!("--advertise-client-urls={client_url}"),
                        format!("--listen-peer-urls=http://127.0.0.1:{peer}"),
                        format!("--initial-advertise-peer-urls=http://127.0.0.1:{advertised}"),
                        format!("--initial-cluster={}", initial.join(",")),
                        "--initial-cluster-state=new".into(),
                        "--initial-cluster-token=ginx-test".into(),
                        "--client-cert-auth=true".into(),
                        format!("--trusted-ca-file={}", ca.pem_path.display()),
                        format!("--cert-file={}", serving.display()),
                        format!("--key-file={}", serving_key.display()),
                        "--unsafe-no-fsync=true".into(),
                        "--log-level=warn".into(),
                    ],
                    log: dir.join(format!("{name}.log")),
                    child: Mutex::new(None),
                }
            })
            .collect();
        let c = Self {
            ca_file: ca.pem_path.clone(),
            cert_file,
            key_file,
            ca,
            bin: bin.to_owned(),
            members,
            dir,
            _peers: peers,
            _tmp: tmp,
        };
        for i in 0..c.members.len() {
            c.start(i);
        }
        c.elect()?;
        if let Some(cuts) = cuts {
            cuts.set_ids((0..c.members.len()).map(|i| c.hex_id(i)).collect());
        }
        Ok(c)
    }

    /// Member `i`'s id in hexadecimal, as etcd's peers name each other.
    pub fn hex_id(&self, i: usize) -> String {
        format!("{:x}", self.id(i).parse::<u64>().unwrap())
    }

    /// Writes `key` = `value` through member `i`.
    pub fn put(&self, i: usize, key: &str, value: &str) -> bool {
        use base64::Engine;
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let body = format!(r#"{{"key":"{}","value":"{}"}}"#, b64(key), b64(value));
        post(self.members[i].probe_port, "/v3/kv/put", &body).is_some()
    }

    /// Starts member `i` (again).
    pub fn start(&self, i: usize) {
        let m = &self.members[i];
        let mut child = m.child.lock().unwrap();
        if child.is_some() {
            return;
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&m.log)
            .unwrap();
        let mut cmd = Command::new(&self.bin);
        cmd.arg("etcd")
            .args(&m.args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        super::dies_with_test(&mut cmd);
        *child = Some(cmd.spawn().unwrap());
    }

    /// Stops member `i` with SIGTERM and waits for it to exit. A leader stopped so hands its
    /// leadership over by itself (etcd does on a graceful stop).
    pub fn stop(&self, i: usize) {
        self.signal(i, libc::SIGTERM);
    }

    /// Stops member `i` with SIGKILL: a power cut, a hung shutdown cut short, a kernel panic.
    /// A leader stopped so leaves the others to notice and elect a new one.
    pub fn kill(&self, i: usize) {
        self.signal(i, libc::SIGKILL);
    }

    fn signal(&self, i: usize, signal: i32) {
        let Some(mut child) = self.members[i].child.lock().unwrap().take() else {
            return;
        };
        // SAFETY: the pid is our own child's, not reaped yet.
        unsafe {
            libc::kill(child.id() as i32, signal);
        }
        let _ = child.wait();
    }

    pub fn running(&self, i: usize) -> bool {
        self.members[i].child.lock().unwrap().is_some()
    }

    /// Member `i`'s own status (`/v3/maintenance/status` on its plain port), or `None` when it
    /// does not answer within 300 ms.
    pub fn status(&self, i: usize) -> Option<Value> {
        post(self.members[i].probe_port, "/v3/maintenance/status", "{}")
    }

    /// The member list as member `i` sees it.
    pub fn member_list(&self, i: usize) -> Option<Value> {
        post(self.members[i].probe_port, "/v3/cluster/member/list", "{}")
    }

    /// Member `i`'s id, as etcd writes it (decimal text).
    pub fn id(&self, i: usize) -> String {
        super::wait_for("the member's status", || self.status(i))["header"]["member_id"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// Raises (or clears) alarm `alarm` on member `i`, through member `through`.
    pub fn alarm(&self, through: usize, i: usize, alarm: &str, on: bool) {
        let action = if on { "ACTIVATE" } else { "DEACTIVATE" };
        let body = format!(
            r#"{{"action":"{action}","memberID":"{}","alarm":"{alarm}"}}"#,
            self.id(i)
        );
        let answer = post(
            self.members[through].probe_port,
            "/v3/maintenance/alarm",
            &body,
        );
        assert!(answer.is_some(), "the alarm request was not answered");
    }

    /// Hands the leadership to member `to` (etcd's MoveLeader, asked of the leader), and
    /// waits until every running member follows it.
    pub fn move_leader(&self, to: usize) {
        let body = format!(r#"{{"targetID":"{}"}}"#, self.id(to));
        super::wait_for(&format!("{} to lead", self.members[to].name), || {
            let leader = self.leader()?;
            if leader == to {
                return Some(());
            }
            post(
                self.members[leader].probe_port,
                "/v3/maintenance/transfer-leadership",
                &body,
            );
            None
        });
    }

    /// Waits until every running member follows one leader; returns its index. Fails with
    /// the members' logs after a minute.
    pub fn wait_leader(&self) -> usize {
        self.elect().unwrap_or_else(|taken| panic!("etcd: {taken}"))
    }

    /// As [`Self::wait_leader`], or `Err` naming a member that exited because its port was
    /// taken.
    fn elect(&self) -> Result<usize, String> {
        let start = Instant::now();
        loop {
            if let Some(i) = self.leader() {
                return Ok(i);
            }
            if let Some(taken) = self.port_taken() {
                return Err(taken);
            }
            if start.elapsed() > Duration::from_secs(60) {
                let logs: Vec<String> = (0..self.members.len())
                    .map(|i| format!("--- {}:\n{}", self.members[i].name, self.log(i)))
                    .collect();
                let statuses: Vec<Option<Value>> =
                    (0..self.members.len()).map(|i| self.status(i)).collect();
                panic!(
                    "etcd elected no leader in 60 s: {statuses:?}\n{}",
                    logs.join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A member that exited because a port it was given is in use, named, if any.
    fn port_taken(&self) -> Option<String> {
        (0..self.members.len()).find_map(|i| {
            let exited = self.members[i]
                .child
                .lock()
                .unwrap()
                .as_mut()
                .is_some_and(|c| matches!(c.try_wait(), Ok(Some(_))));
            let log = std::fs::read_to_string(&self.members[i].log).unwrap_or_default();
            (exited && log.contains("address already in use")).then(|| {
                format!(
                    "{} exited at start: a port it was given is in use (bind: address already \
                     in use)",
                    self.members[i].name
                )
            })
        })
    }

    /// The index of the leader every running member follows, if they agree on one.
    fn leader(&self) -> Option<usize> {
        let running: Vec<usize> = (0..self.members.len())
            .filter(|i| self.running(*i))
            .collect();
        let statuses: Vec<Value> = running
            .iter()
            .map(|i| self.status(*i))
            .collect::<Option<_>>()?;
        let first = statuses.first()?["leader"].as_str()?.to_owned();
        if statuses
            .iter()
            .any(|s| s["leader"].as_str() != Some(&first))
        {
            return None;
        }
        running
            .into_iter()
            .zip(&statuses)
            .find(|(_, s)| s["header"]["member_id"].as_str() == Some(&first))
            .map(|(i, _)| i)
    }

    /// The last lines of member `i`'s log.
    pub fn log(&self, i: usize) -> String {
        let text = std::fs::read_to_string(&self.members[i].log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            if let Some(mut c) = self.members[i].child.lock().unwrap().take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

/// A JSON POST over plain HTTP/1.1 to 127.0.0.1:`port`, answered within 300 ms, or `None`.
fn post(port: u16, path: &str, body: &str) -> Option<Value> {
    let t = Duration::from_millis(300);
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut s = TcpStream::connect_timeout(&addr, t).ok()?;
    s.set_read_timeout(Some(t)).ok()?;
    s.set_write_timeout(Some(t)).ok()?;
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).ok()?;
    let start = Instant::now();
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(_) => return None,
        }
        if start.elapsed() > t {
            return None;
        }
    }
    let text = String::from_utf8_lossy(&out);
    let (head, body) = text.split_once("\r\n\r\n")?;
    if !head.starts_with("HTTP/1.1 200") {
        return None;
    }
    // The gateway may answer chunked: the JSON object is between the first '{' and last '}'.
    let (from, to) = (body.find('{')?, body.rfind('}')?);
    serde_json::from_str(&body[from..=to]).ok()
}
