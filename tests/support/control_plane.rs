//! A real Kubernetes control plane on 127.0.0.1 for the tests, in the manner of
//! controller-runtime's envtest: etcd, kube-apiserver and kube-controller-manager, the upstream
//! commands unchanged, from the binary that `tests/control-plane/` builds (`.ci/run` puts it
//! in `target/control-plane/control-plane`; `GINX_CONTROL_PLANE` names another).
//!
//! - Certificates are made here: a cluster CA, a serving certificate with `kubernetes`,
//!   `kubernetes.default.svc…`, `localhost` and the IP SANs `127.0.0.1` and `10.0.0.1`, a
//!   service-account key, an admin (`O=system:masters`) and the controller manager's identity.
//! - The API server authorizes with `Node,RBAC` and writes every request at `Metadata` level
//!   to an audit log, which is the request log tests assert on ([`ControlPlane::audit`]).
//! - Once `/readyz` answers, `packaging/kubernetes/rbac.yaml` is applied as admin with the
//!   real `kubectl`; [`ControlPlane::ginx_kubeconfig`] gives a node ginx's own identity, a
//!   client certificate with `O=ginx:nodes` and `CN=ginx:<node>` as README's CSR steps make.
//! - One control plane serves the whole test binary ([`shared`]); each test uses its own node
//!   names. A test that must stop the API server starts a private one ([`ControlPlane::start`]).
//! - The processes get a parent-death signal. They are started from one thread that lives as
//!   long as the test process (the signal follows the thread that forked, and a test's thread
//!   ends with the test).
//! - Ports: the servers cannot be handed a listener, so a free port is found by binding and
//!   the start is retried on a new one when the component reports the address in use.
//! - There are no kubelets: see `kubelet.rs` for the stand-in that keeps nodes Ready.

use std::collections::HashSet;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock, mpsc};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::kubelet::{client, runtime};
use super::tls::TestCa;
use super::{PATIENCE, wait_for};

/// The Kubernetes release the binary is built from (tests/control-plane/go.mod).
pub const KUBERNETES_VERSION: &str = "v1.36.3";

/// Where the control-plane binary is, if it exists.
pub fn binary() -> Option<PathBuf> {
    let path = std::env::var_os("GINX_CONTROL_PLANE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/control-plane/control-plane")
        });
    path.is_file().then_some(path)
}

/// The binary, or `None` after printing why the test is skipped; under `CI=true` a missing
/// binary fails the test.
pub fn require() -> Option<PathBuf> {
    let found = binary();
    if found.is_none() {
        let msg = "the control-plane binary is missing: build it with \
                   `cd tests/control-plane && go build -o ../../target/control-plane/control-plane .` \
                   (.ci/run does) or set GINX_CONTROL_PLANE";
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("{msg}");
        }
        eprintln!("SKIPPED: {msg}");
    }
    found
}

/// The control plane shared by every test of this binary, started on first use; `None`
/// (skipped) when the binary is missing outside CI.
pub fn shared() -> Option<&'static ControlPlane> {
    static SHARED: OnceLock<Option<ControlPlane>> = OnceLock::new();
    SHARED
        .get_or_init(|| {
            let bin = require()?;
            // The shared one outlives every test; its temp dir is removed with the process
            // only by the OS's tmp cleaning, so keep it small and named.
            let dir = tempfile::Builder::new()
                .prefix("ginx-control-plane-")
                .tempdir()
                .unwrap()
                .keep();
            let cp = ControlPlane::start_in(&bin, dir);
            // Written until this process exits, and kept: swept where it is.
            super::sweep::collect_audit_log_at_end(&cp.audit_log);
            Some(cp)
        })
        .as_ref()
}

/// The node's own kubeconfig [`ControlPlane::ginx_kubeconfig`] writes beside ginx's at `path`.
pub fn node_kubeconfig(path: &Path) -> PathBuf {
    path.with_file_name("kubelet.conf")
}

/// A component process and how to start it again.
struct Component {
    name: &'static str,
    args: Vec<String>,
    log: PathBuf,
    child: Option<Child>,
}

pub struct ControlPlane {
    pub dir: PathBuf,
    /// `https://127.0.0.1:PORT`
    pub url: String,
    pub ca: TestCa,
    /// A kubeconfig with the admin identity (`O=system:masters`).
    pub admin_kubeconfig: PathBuf,
    pub audit_log: PathBuf,
    bin: PathBuf,
    etcd: Mutex<Component>,
    apiserver: Mutex<Component>,
    controller_manager: Mutex<Component>,
    admin: OnceLock<kube::Client>,
    _tmp: Option<tempfile::TempDir>,
    /// How long startup to `/readyz` took, for the benchmark.
    pub started_in: Duration,
}

impl ControlPlane {
    /// A private control plane in a temp dir of its own, stopped on drop.
    pub fn start(bin: &Path) -> Self {
        let tmp = tempfile::Builder::new()
            .prefix("ginx-control-plane-")
            .tempdir()
            .unwrap();
        let mut cp = Self::start_in(bin, tmp.path().to_owned());
        cp._tmp = Some(tmp);
        cp
    }

    fn start_in(bin: &Path, dir: PathBuf) -> Self {
        let began = Instant::now();
        let pki = dir.join("pki");
        std::fs::create_dir_all(&pki).unwrap();
        let ca = TestCa::new(&pki);
        let write = |name: &str, text: &str| {
            let p = pki.join(name);
            std::fs::write(&p, text).unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
            p
        };
        let ca_key = write("ca.key", &ca.key_pem());
        let (serving, serving_key) = ca.issue_server_pem(&[
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
            "localhost",
            "127.0.0.1",
            "10.0.0.1",
        ]);
        let serving = write("apiserver.crt", &serving);
        let serving_key = write("apiserver.key", &serving_key);
        let sa = rcgen::KeyPair::generate().unwrap();
        super::sweep::secret_pem("service-account signing key", &sa.serialize_pem());
        let sa_key = write("sa.key", &sa.serialize_pem());
        let sa_pub = write("sa.pub", &sa.public_key_pem());
        let audit_policy = dir.join("audit-policy.yaml");
        // Every request at Metadata level; writes by the identities the tests give ginx also with
        // their bodies (level Request), for the secrets sweep: not the admin's, not the control
        // plane's own, and never a Secret's (ginx writes the Flux pull secret on purpose). A
        // node's patches of Nodes with their bodies too: ginx cordons as the node.
        std::fs::write(
            &audit_policy,
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\n\
             rules:\n\
             - level: Metadata\n  resources: [{group: \"\", resources: [secrets]}]\n\
             - level: Metadata\n  users: [admin, system:kube-controller-manager, system:apiserver]\n\
             - level: Request\n  userGroups: [system:nodes]\n  verbs: [patch]\n  resources: [{group: \"\", resources: [nodes]}]\n\
             - level: Metadata\n  userGroups: [system:nodes, \"system:serviceaccounts:kube-system\"]\n\
             - level: Request\n  verbs: [create, update, patch]\n\
             - level: Metadata\n",
        )
        .unwrap();
        let audit_log = dir.join("audit.log");
        let etcd_data = dir.join("etcd");
        std::fs::create_dir_all(&etcd_data).unwrap();
        std::fs::set_permissions(&etcd_data, std::fs::Permissions::from_mode(0o700)).unwrap();

        let mut etcd = Component {
            name: "etcd",
            args: Vec::new(),
            log: dir.join("etcd.log"),
            child: None,
        };
        let etcd_port = start_on_free_port(bin, &mut etcd, |client, peer| {
            let client_url = format!("http://127.0.0.1:{client}");
            let peer_url = format!("http://127.0.0.1:{}", peer.unwrap());
            vec![
                "--name=default".into(),
                format!("--data-dir={}", etcd_data.display()),
                format!("--listen-client-urls={client_url}"),
                format!("--advertise-client-urls={client_url}"),
                format!("--listen-peer-urls={peer_url}"),
                format!("--initial-advertise-peer-urls={peer_url}"),
                format!("--initial-cluster=default={peer_url}"),
                "--unsafe-no-fsync=true".into(),
                "--log-level=warn".into(),
            ]
        });
        wait_http_ok(&mut etcd, &format!("http://127.0.0.1:{etcd_port}/health"));

        let mut apiserver = Component {
            name: "kube-apiserver",
            args: Vec::new(),
            log: dir.join("kube-apiserver.log"),
            child: None,
        };
        let p = |p: &Path| p.display().to_string();
        let api_port = start_on_free_port(bin, &mut apiserver, |port, _| {
            vec![
                format!("--etcd-servers=http://127.0.0.1:{etcd_port}"),
                "--bind-address=127.0.0.1".into(),
                "--advertise-address=127.0.0.1".into(),
                format!("--secure-port={port}"),
                format!("--cert-dir={}", p(&pki)),
                format!("--tls-cert-file={}", p(&serving)),
                format!("--tls-private-key-file={}", p(&serving_key)),
                format!("--client-ca-file={}", p(&ca.pem_path)),
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
                format!("--service-account-key-file={}", p(&sa_pub)),
                format!("--service-account-signing-key-file={}", p(&sa_key)),
                "--service-cluster-ip-range=10.0.0.0/24".into(),
                "--authorization-mode=Node,RBAC".into(),
                // As kubeadm: a kubelet's identity may change its own Node and pods only.
                "--enable-admission-plugins=NodeRestriction".into(),
                // A loopback advertise address makes the `kubernetes` Endpoints invalid.
                "--endpoint-reconciler-type=none".into(),
                format!("--audit-policy-file={}", p(&audit_policy)),
                format!("--audit-log-path={}", p(&audit_log)),
                "--audit-log-mode=blocking".into(),
                // Never rotated: readers keep byte offsets into it (`audit_mark`). The default
                // (0) is lumberjack's 100 MB, which a 1,000-node benchmark fills in minutes.
                "--audit-log-maxsize=1000000".into(),
                "--profiling=false".into(),
            ]
        });
        let url = format!("https://127.0.0.1:{api_port}");

        let admin_kubeconfig = dir.join("admin.kubeconfig");
        let (cert, key) = ca.issue_client_pem("admin", &["system:masters"]);
        write_kubeconfig(&admin_kubeconfig, &url, &ca, &cert, &key);
        let kcm_kubeconfig = dir.join("controller-manager.kubeconfig");
        let (cert, key) = ca.issue_client_pem("system:kube-controller-manager", &[]);
        write_kubeconfig(&kcm_kubeconfig, &url, &ca, &cert, &key);

        let mut cp = Self {
            dir: dir.clone(),
            url,
            admin_kubeconfig,
            audit_log,
            bin: bin.to_owned(),
            etcd: Mutex::new(etcd),
            apiserver: Mutex::new(apiserver),
            controller_manager: Mutex::new(Component {
                name: "kube-controller-manager",
                args: vec![
                    format!("--kubeconfig={}", p(&kcm_kubeconfig)),
                    format!("--authentication-kubeconfig={}", p(&kcm_kubeconfig)),
                    format!("--authorization-kubeconfig={}", p(&kcm_kubeconfig)),
                    format!("--service-account-private-key-file={}", p(&sa_key)),
                    format!("--root-ca-file={}", p(&ca.pem_path)),
                    "--use-service-account-credentials=true".into(),
                    "--controllers=*".into(),
                    "--leader-elect=false".into(),
                    "--service-cluster-ip-range=10.0.0.0/24".into(),
                    // The default 10257 would collide between control planes side by side.
                    "--secure-port=0".into(),
                    // Signs CertificateSigningRequests (README's steps for ginx's identity).
                    format!("--cluster-signing-cert-file={}", p(&ca.pem_path)),
                    format!("--cluster-signing-key-file={}", p(&ca_key)),
                ],
                log: dir.join("kube-controller-manager.log"),
                child: None,
            }),
            ca,
            admin: OnceLock::new(),
            _tmp: None,
            started_in: Duration::ZERO,
        };
        cp.wait_ready();
        cp.controller_manager
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .spawn(bin);
        let packaging = Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/kubernetes");
        let (rbac, vap) = (packaging.join("rbac.yaml"), packaging.join("vap.yaml"));
        cp.kubectl(&[
            "apply",
            "-f",
            &rbac.display().to_string(),
            "-f",
            &vap.display().to_string(),
        ]);
        cp.wait_policies();
        cp.started_in = began.elapsed();
        cp
    }

    /// Waits until vap.yaml's policies are in force (a policy takes a moment after it is
    /// created): a node identity's dry-run create of a ConfigMap other than ginx-rollout is
    /// refused by them.
    fn wait_policies(&self) {
        let probe = self.dir.join("vap-probe.kubeconfig");
        self.kubeconfig_for(&probe, "ginx:vap-probe", &["ginx:nodes"]);
        let start = Instant::now();
        loop {
            let out = Command::new(&self.bin)
                .arg("kubectl")
                .arg(format!("--kubeconfig={}", probe.display()))
                .args([
                    "-n",
                    "ginx-system",
                    "create",
                    "configmap",
                    "vap-probe",
                    "--dry-run=server",
                    "--field-manager=ginx",
                ])
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            if err.contains("ginx-rollout-configmap") {
                return;
            }
            assert!(
                start.elapsed() < PATIENCE,
                "vap.yaml's policies not in force within {PATIENCE:?}: {err}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Waits until `/readyz` answers 200 to the admin.
    pub fn wait_ready(&self) {
        let start = Instant::now();
        loop {
            {
                let mut api = self.apiserver.lock().unwrap_or_else(|e| e.into_inner());
                api.check_alive();
            }
            let out = self.kubectl_output(&["get", "--raw", "/readyz"]);
            if out.status.success() {
                return;
            }
            if start.elapsed() > PATIENCE {
                panic!(
                    "kube-apiserver not ready within {PATIENCE:?}: {}\n{}",
                    String::from_utf8_lossy(&out.stderr),
                    tail(&self.apiserver.lock().unwrap_or_else(|e| e.into_inner()).log)
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Runs the real kubectl as admin, failing the test unless it exits 0; returns stdout.
    pub fn kubectl(&self, args: &[&str]) -> String {
        let out = self.kubectl_output(args);
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// The control-plane binary (`BINARY kubectl …` is the real kubectl).
    pub fn binary(&self) -> &Path {
        &self.bin
    }

    pub fn kubectl_output(&self, args: &[&str]) -> std::process::Output {
        Command::new(&self.bin)
            .arg("kubectl")
            .arg(format!("--kubeconfig={}", self.admin_kubeconfig.display()))
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    /// Runs kubectl with the credentials of `kubeconfig` (not the admin's), `input` on stdin.
    pub fn kubectl_as(
        &self,
        kubeconfig: &Path,
        args: &[&str],
        input: &str,
    ) -> std::process::Output {
        use std::io::Write;
        let mut child = Command::new(&self.bin)
            .arg("kubectl")
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    }

    /// Runs kubectl as admin with `input` on stdin (e.g. `apply -f -`), failing the test
    /// unless it exits 0; returns stdout.
    pub fn kubectl_stdin(&self, args: &[&str], input: &str) -> String {
        let out = self.kubectl_stdin_output(args, input);
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    pub fn kubectl_stdin_output(&self, args: &[&str], input: &str) -> std::process::Output {
        self.kubectl_as(&self.admin_kubeconfig, args, input)
    }

    /// The admin's client (built once).
    pub fn admin(&self) -> kube::Client {
        self.admin
            .get_or_init(|| runtime().block_on(client(&self.admin_kubeconfig)))
            .clone()
    }

    /// `method path` as admin with a JSON `body`: the status code and the answer.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        content_type: &str,
        body: &Value,
    ) -> (u16, Value) {
        let client = self.admin();
        let req = http::Request::builder()
            .method(method)
            .uri(path)
            .header("content-type", content_type)
            .body(if body.is_null() {
                Vec::new()
            } else {
                serde_json::to_vec(body).unwrap()
            })
            .unwrap();
        runtime().block_on(async move {
            match client.request_text(req).await {
                Ok(text) => (200, serde_json::from_str(&text).unwrap_or(Value::Null)),
                Err(kube::Error::Api(e)) => (e.code, serde_json::to_value(&*e).unwrap()),
                Err(e) => panic!("{method} {path}: {e}"),
            }
        })
    }

    /// The object at `path` as admin, or `None` on 404.
    pub fn get_path(&self, path: &str) -> Option<Value> {
        match self.request("GET", path, "application/json", &Value::Null) {
            (200, v) => Some(v),
            (404, _) => None,
            (code, v) => panic!("GET {path}: {code} {v}"),
        }
    }

    /// The Events with `reason` about the Node `node` (ginx writes them in default).
    pub fn node_events(&self, node: &str, reason: &str) -> Vec<Value> {
        let out = self.kubectl(&[
            "get",
            "events",
            "-n",
            "default",
            "--field-selector",
            &format!("reason={reason},involvedObject.name={node}"),
            "-o",
            "json",
        ]);
        serde_json::from_str::<Value>(&out)
            .ok()
            .and_then(|v| v["items"].as_array().cloned())
            .unwrap_or_default()
    }

    pub fn node(&self, name: &str) -> Option<Value> {
        self.get_path(&format!("/api/v1/nodes/{name}"))
    }

    pub fn lease(&self, namespace: &str, name: &str) -> Option<Value> {
        self.get_path(&format!(
            "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{name}"
        ))
    }

    /// Creates or replaces objects from YAML or JSON as admin (`kubectl apply`).
    pub fn apply(&self, manifest: &str) {
        self.kubectl_stdin(&["apply", "-f", "-"], manifest);
    }

    /// A kubeconfig at `path` for ginx's own identity on `node`: a client certificate with
    /// `O=ginx:nodes` and `CN=ginx:<node>`, signed by the cluster CA.
    /// Beside it, `kubelet.conf`: the node's own identity (`CN=system:node:<node>`,
    /// `O=system:nodes`, as kubeadm's kubelet.conf), for `kubernetes.node_kubeconfig`.
    pub fn ginx_kubeconfig(&self, path: &Path, node: &str) {
        self.ginx_kubeconfig_via(path, node, &self.url);
    }

    /// Like [`Self::ginx_kubeconfig`], with the API server at `url` (a proxy in front of it)
    /// for both identities.
    pub fn ginx_kubeconfig_via(&self, path: &Path, node: &str, url: &str) {
        let (cert, key) = self
            .ca
            .issue_client_pem(&format!("ginx:{node}"), &["ginx:nodes"]);
        write_kubeconfig(path, url, &self.ca, &cert, &key);
        let (cert, key) = self
            .ca
            .issue_client_pem(&format!("system:node:{node}"), &["system:nodes"]);
        write_kubeconfig(&node_kubeconfig(path), url, &self.ca, &cert, &key);
    }

    /// The API server's address (`host:port` of [`Self::url`]).
    pub fn addr(&self) -> std::net::SocketAddr {
        self.url
            .trim_start_matches("https://")
            .parse()
            .expect("the API server's URL is https://127.0.0.1:<port>")
    }

    /// A kubeconfig at `path` for any user and groups, signed by the cluster CA.
    pub fn kubeconfig_for(&self, path: &Path, user: &str, groups: &[&str]) {
        let (cert, key) = self.ca.issue_client_pem(user, groups);
        write_kubeconfig(path, &self.url, &self.ca, &cert, &key);
    }

    /// The number of bytes in the audit log now: pass it to [`Self::audit_since`] to see only
    /// what comes after.
    pub fn audit_mark(&self) -> u64 {
        std::fs::metadata(&self.audit_log).map_or(0, |m| m.len())
    }

    /// Waits until `node`'s ginx renewed its heartbeat Lease (`ginx-<node>` in ginx-system)
    /// `n` times since `mark`: to let a daemon go round its loop a number of times before a
    /// test checks that something did not happen, measured by the daemon's own work rather
    /// than by this machine's clock.
    pub fn wait_renewals(&self, node: &str, mark: u64, n: usize) {
        let (user, lease) = (format!("ginx:{node}"), format!("ginx-{node}"));
        super::wait_for(&format!("{n} heartbeat renewals by {node}"), || {
            let renewals = self
                .audit_since(mark)
                .into_iter()
                .filter(|e| {
                    e.user == user
                        && e.resource == "leases"
                        && e.name == lease
                        && matches!(e.verb.as_str(), "update" | "patch")
                        && e.code < 300
                })
                .count();
            (renewals >= n).then_some(())
        });
    }

    /// Every completed request since `mark` (see [`Self::audit_mark`]).
    pub fn audit_since(&self, mark: u64) -> Vec<AuditEvent> {
        self.audit_range(mark, u64::MAX)
    }

    /// Every completed request logged between the marks `from` and `to`.
    pub fn audit_range(&self, from: u64, to: u64) -> Vec<AuditEvent> {
        use std::io::{Read, Seek, SeekFrom};
        let Ok(mut f) = std::fs::File::open(&self.audit_log) else {
            return Vec::new();
        };
        f.seek(SeekFrom::Start(from)).unwrap();
        let mut text = String::new();
        f.take(to.saturating_sub(from))
            .read_to_string(&mut text)
            .unwrap();
        // The last line may be half written.
        text.lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter_map(|e| AuditEvent::from_json(&e))
            .collect()
    }

    /// Every completed request so far.
    pub fn audit(&self) -> Vec<AuditEvent> {
        self.audit_since(0)
    }

    /// The running components' names and process ids.
    pub fn pids(&self) -> Vec<(&'static str, u32)> {
        [&self.etcd, &self.apiserver, &self.controller_manager]
            .iter()
            .filter_map(|c| {
                let c = c.lock().unwrap_or_else(|e| e.into_inner());
                Some((c.name, c.child.as_ref()?.id()))
            })
            .collect()
    }

    /// Kills the API server (SIGKILL) and waits until it is gone.
    pub fn kill_apiserver(&self) {
        self.apiserver
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .kill();
    }

    /// Starts the API server again with the same flags and port, and waits for `/readyz`.
    pub fn restart_apiserver(&self) {
        self.apiserver
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .spawn(&self.bin);
        self.wait_ready();
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        for c in [&self.controller_manager, &self.apiserver, &self.etcd] {
            c.lock().unwrap_or_else(|e| e.into_inner()).kill();
        }
        // A private one's directory goes with it.
        if self._tmp.is_some() {
            super::sweep::collect_audit_log("audit-log", &self.audit_log);
        }
    }
}

impl Component {
    fn spawn(&mut self, bin: &Path) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let mut cmd = Command::new(bin);
        cmd.arg(self.name)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        // SAFETY: prctl is async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        self.child = Some(spawn_from_long_lived_thread(cmd));
    }

    /// Panics with the log's tail if the process exited.
    fn check_alive(&mut self) {
        if let Some(child) = &mut self.child
            && let Some(status) = child.try_wait().unwrap()
        {
            panic!("{} exited ({status}):\n{}", self.name, tail(&self.log));
        }
    }

    fn exited(&mut self) -> bool {
        self.child
            .as_mut()
            .is_none_or(|c| c.try_wait().unwrap().is_some())
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Starts `c` with the arguments `args(port, peer_port)` on ports found free by binding; when
/// the component fails because another process took a port meanwhile, tries new ones.
fn start_on_free_port(
    bin: &Path,
    c: &mut Component,
    args: impl Fn(u16, Option<u16>) -> Vec<String>,
) -> u16 {
    for _ in 0..5 {
        let port = free_port();
        let peer = free_port();
        c.args = args(port, Some(peer));
        let log_start = std::fs::metadata(&c.log).map_or(0, |m| m.len());
        c.spawn(bin);
        // Either the port is taken by the component (it listens), or it exits.
        let start = Instant::now();
        loop {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return port;
            }
            if c.exited() {
                let text = std::fs::read_to_string(&c.log).unwrap_or_default();
                let text = &text[(log_start as usize).min(text.len())..];
                if text.contains("address already in use") {
                    c.child = None;
                    break;
                }
                panic!("{} exited:\n{}", c.name, tail(&c.log));
            }
            if start.elapsed() > PATIENCE {
                panic!("{} did not listen on {port}:\n{}", c.name, tail(&c.log));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    panic!("{}: no free port after 5 tries", c.name)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn wait_http_ok(c: &mut Component, url: &str) {
    let addr = url
        .trim_start_matches("http://")
        .split_once('/')
        .unwrap()
        .0
        .to_owned();
    let path = &url[url.find(&addr).unwrap() + addr.len()..];
    wait_for(&format!("{} at {url}", c.name), || {
        c.check_alive();
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(&addr).ok()?;
        write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        out.starts_with("HTTP/1.0 200").then_some(())
    });
}

fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// Spawns `cmd` from a thread that lives as long as the process, so that the parent-death
/// signal fires when the test process ends, not when the calling test's thread does.
fn spawn_from_long_lived_thread(cmd: Command) -> Child {
    type Request = (Command, mpsc::Sender<std::io::Result<Child>>);
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<Request>>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Request>();
        std::thread::Builder::new()
            .name("control-plane-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
                // The sender lives in a static: this thread never ends before the process.
            })
            .unwrap();
        Mutex::new(tx)
    });
    let (reply, answer) = mpsc::channel();
    spawner
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .send((cmd, reply))
        .unwrap();
    answer.recv().unwrap().unwrap()
}

pub fn write_kubeconfig(path: &Path, url: &str, ca: &TestCa, cert: &str, key: &str) {
    use base64::Engine;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {url}\n    \
         certificate-authority-data: {ca}\nusers:\n- name: user\n  user:\n    \
         client-certificate-data: {cert}\n    client-key-data: {key}\ncontexts:\n- name: test\n  \
         context:\n    cluster: test\n    user: user\ncurrent-context: test\n",
        ca = b64(&ca.pem()),
        cert = b64(cert),
        key = b64(key),
    );
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).unwrap();
    }
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// One completed request from the audit log.
#[derive(Debug, Clone)]
pub struct AuditEvent {
    pub verb: String,
    pub user: String,
    pub groups: Vec<String>,
    pub resource: String,
    pub subresource: String,
    pub namespace: String,
    pub name: String,
    pub code: u16,
    pub uri: String,
    /// `stageTimestamp`, RFC 3339 with microseconds.
    pub time: String,
    /// `requestReceivedTimestamp`, RFC 3339 with microseconds: a request that was sent after
    /// another one's answer came back was received after it, which the completion stamps
    /// (taken after the answer is written) do not promise.
    pub received: String,
    /// `ginx/<version>` for ginx's requests (whichever identity made them).
    pub user_agent: String,
    /// `responseStatus.message`: why a request was refused.
    pub message: String,
    /// The request's body (`requestObject`), for Leases and Nodes only (null otherwise); a
    /// node's own patches of its Node are recorded with theirs (the cordons).
    pub request: Value,
}

impl AuditEvent {
    fn from_json(e: &Value) -> Option<Self> {
        if e["stage"] != "ResponseComplete" {
            return None;
        }
        let s = |v: &Value| v.as_str().unwrap_or("").to_owned();
        let o = &e["objectRef"];
        Some(Self {
            verb: s(&e["verb"]),
            user: s(&e["user"]["username"]),
            groups: e["user"]["groups"]
                .as_array()
                .map(|g| g.iter().map(s).collect())
                .unwrap_or_default(),
            resource: s(&o["resource"]),
            subresource: s(&o["subresource"]),
            namespace: s(&o["namespace"]),
            name: s(&o["name"]),
            code: e["responseStatus"]["code"].as_u64().unwrap_or(0) as u16,
            uri: s(&e["requestURI"]),
            time: s(&e["stageTimestamp"]),
            received: s(&e["requestReceivedTimestamp"]),
            user_agent: s(&e["userAgent"]),
            message: s(&e["responseStatus"]["message"]),
            request: if o["resource"] == "leases" || o["resource"] == "nodes" {
                e["requestObject"].clone()
            } else {
                Value::Null
            },
        })
    }

    /// `verb resource[/subresource] namespace/name code`, for assertion messages.
    pub fn short(&self) -> String {
        let sub = if self.subresource.is_empty() {
            String::new()
        } else {
            format!("/{}", self.subresource)
        };
        format!(
            "{} {}{sub} {}/{} {}",
            self.verb, self.resource, self.namespace, self.name, self.code
        )
    }
}

/// Watches over one test's ginx identities: on drop (unless the test is failing anyway) it
/// asserts that no request by them was refused with a 403, except by users the test declared
/// with [`RbacGuard::expect_forbidden`]. Across the suite this proves rbac.yaml is enough.
pub struct RbacGuard<'a> {
    cp: &'a ControlPlane,
    mark: u64,
    users: HashSet<String>,
    forbidden_ok: HashSet<String>,
    /// Audit log ranges in which 403s are forgiven (see [`RbacGuard::forgive`]).
    forgiven: Vec<(u64, u64)>,
}

impl<'a> RbacGuard<'a> {
    pub fn new(cp: &'a ControlPlane) -> Self {
        Self {
            cp,
            mark: cp.audit_mark(),
            users: HashSet::new(),
            forbidden_ok: HashSet::new(),
            forgiven: Vec::new(),
        }
    }

    /// `ginx:<node>` is this test's, and so are ginx's requests as `system:node:<node>` (the
    /// node's own identity, told from the stand-in kubelet's by ginx's user agent): their 403s
    /// count.
    pub fn watch(&mut self, node: &str) {
        self.users.insert(format!("ginx:{node}"));
        self.users.insert(format!("system:node:{node}"));
    }

    /// `ginx:<node>` is meant to be refused in this test.
    pub fn expect_forbidden(&mut self, node: &str) {
        self.forbidden_ok.insert(format!("ginx:{node}"));
    }

    /// Forgives 403s logged between the audit marks `from` and `to`: a restarted API server
    /// answers before its RBAC caches are filled, and refuses what it will allow a moment
    /// later (`/readyz` waits for them; clients do not).
    pub fn forgive(&mut self, from: u64, to: u64) {
        self.forgiven.push((from, to));
    }

    /// Requests by this test's users so far.
    pub fn requests(&self) -> Vec<AuditEvent> {
        self.requests_between(self.mark, u64::MAX)
    }

    fn requests_between(&self, from: u64, to: u64) -> Vec<AuditEvent> {
        self.cp
            .audit_range(from, to)
            .into_iter()
            .filter(|e| {
                self.users.contains(&e.user)
                    && (e.user.starts_with("ginx:") || e.user_agent.starts_with("ginx/"))
            })
            .collect()
    }
}

impl Drop for RbacGuard<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            return;
        }
        let forgiven: HashSet<String> = self
            .forgiven
            .iter()
            .flat_map(|(from, to)| self.requests_between(*from, *to))
            .map(|e| format!("{e:?}"))
            .collect();
        let refused: Vec<String> = self
            .requests()
            .iter()
            .filter(|e| e.code == 403 && !self.forbidden_ok.contains(&e.user))
            .filter(|e| !forgiven.contains(&format!("{e:?}")))
            .map(|e| format!("{}: {}: {}", e.user, e.short(), e.message))
            .collect();
        assert!(
            refused.is_empty(),
            "requests by ginx refused (403): rbac.yaml misses a rule:\n{}",
            refused.join("\n")
        );
    }
}
