//! One kube-apiserver per member of an [`EtcdCluster`], each on its own member only, as kubeadm
//! stacks them (`--etcd-servers=https://127.0.0.1:2379`): the upstream kube-apiserver of the
//! control-plane binary, unchanged, with the etcd client certificate of the test cluster.
//! [`Stacked::kill`] and [`Stacked::start`] take one down and up with its member's node.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::etcd::EtcdCluster;

struct Server {
    port: u16,
    args: Vec<String>,
    log: PathBuf,
    child: Mutex<Option<Child>>,
}

pub struct Stacked {
    bin: PathBuf,
    servers: Vec<Server>,
    /// The admin's (`system:masters`) client certificate and key, for
    /// [`Stacked::admin_kubeconfig`].
    cert: (String, String),
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Stacked {
    /// Starts an API server on each member of `etcd` and waits until each answers `/readyz`.
    pub fn start_on(bin: &Path, etcd: &EtcdCluster) -> Self {
        let dir = etcd.dir.join("apiservers");
        std::fs::create_dir_all(&dir).unwrap();
        let write = |name: &str, text: &str| {
            let p = dir.join(name);
            std::fs::write(&p, text).unwrap();
            p.display().to_string()
        };
        let (serving, serving_key) = etcd.ca.issue_server_pem(&["localhost", "127.0.0.1"]);
        let (serving, serving_key) = (
            write("apiserver.crt", &serving),
            write("apiserver.key", &serving_key),
        );
        let sa = rcgen::KeyPair::generate().unwrap();
        super::sweep::secret_pem("service-account signing key", &sa.serialize_pem());
        let (sa_key, sa_pub) = (
            write("sa.key", &sa.serialize_pem()),
            write("sa.pub", &sa.public_key_pem()),
        );
        let servers = etcd
            .members
            .iter()
            .map(|m| {
                let port = free_port();
                Server {
                    port,
                    args: vec![
                        format!("--etcd-servers={}", m.client_url),
                        format!("--etcd-cafile={}", etcd.ca_file.display()),
                        format!("--etcd-certfile={}", etcd.cert_file.display()),
                        format!("--etcd-keyfile={}", etcd.key_file.display()),
                        "--bind-address=127.0.0.1".into(),
                        "--advertise-address=127.0.0.1".into(),
                        format!("--secure-port={port}"),
                        format!("--cert-dir={}", dir.display()),
                        format!("--tls-cert-file={serving}"),
                        format!("--tls-private-key-file={serving_key}"),
                        format!("--client-ca-file={}", etcd.ca_file.display()),
                        "--service-account-issuer=https://kubernetes.default.svc.cluster.local"
                            .into(),
                        format!("--service-account-key-file={sa_pub}"),
                        format!("--service-account-signing-key-file={sa_key}"),
                        "--service-cluster-ip-range=10.0.0.0/24".into(),
                        "--authorization-mode=RBAC".into(),
                        // Three servers on one address: the Endpoints reconciler would fight.
                        "--endpoint-reconciler-type=none".into(),
                        "--profiling=false".into(),
                    ],
                    log: dir.join(format!("{}.apiserver.log", m.name)),
                    child: Mutex::new(None),
                }
            })
            .collect();
        let s = Self {
            bin: bin.to_owned(),
            servers,
            cert: etcd.ca.issue_client_pem("admin", &["system:masters"]),
        };
        for i in 0..s.servers.len() {
            s.start(i);
        }
        s
    }

    pub fn addrs(&self) -> Vec<std::net::SocketAddr> {
        self.servers
            .iter()
            .map(|s| std::net::SocketAddr::from(([127, 0, 0, 1], s.port)))
            .collect()
    }

    /// Writes an admin kubeconfig for `url` at `path`.
    pub fn admin_kubeconfig(&self, etcd: &EtcdCluster, path: &Path, url: &str) {
        super::control_plane::write_kubeconfig(path, url, &etcd.ca, &self.cert.0, &self.cert.1);
    }

    /// Starts server `i` (again) and waits until it listens.
    pub fn start(&self, i: usize) {
        let s = &self.servers[i];
        let mut child = s.child.lock().unwrap();
        if child.is_some() {
            return;
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&s.log)
            .unwrap();
        let mut cmd = Command::new(&self.bin);
        cmd.arg("kube-apiserver")
            .args(&s.args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        super::dies_with_test(&mut cmd);
        let mut c = cmd.spawn().unwrap();
        let start = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", s.port)).is_err() {
            if let Ok(Some(status)) = c.try_wait() {
                let text = std::fs::read_to_string(&s.log).unwrap_or_default();
                panic!("kube-apiserver {i} exited with {status}:\n{text}");
            }
            assert!(
                start.elapsed() < Duration::from_secs(120),
                "kube-apiserver {i} did not listen"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        *child = Some(c);
    }

    /// Stops server `i` with SIGKILL, as a machine that goes down without warning does.
    pub fn kill(&self, i: usize) {
        let Some(mut child) = self.servers[i].child.lock().unwrap().take() else {
            return;
        };
        let _ = child.kill();
        let _ = child.wait();
    }

    pub fn running(&self, i: usize) -> bool {
        self.servers[i].child.lock().unwrap().is_some()
    }
}

impl Drop for Stacked {
    fn drop(&mut self) {
        for s in &self.servers {
            if let Some(mut c) = s.child.lock().unwrap().take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}
