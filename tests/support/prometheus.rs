//! Debian's real Prometheus on 127.0.0.1, scraping a small exporter the test controls, with one
//! real alerting rule: `TestBroken` (severity critical) fires while the exporter serves
//! `ginx_test_broken{cause="…"} 1`, one series per flag file in its directory. A test raises
//! an alert by creating a flag file (or lets the stand-in activation create one, colmena-stub's
//! `touch`), and waits on Prometheus' own view of what fires ([`Prometheus::firing`]), never a
//! fixed sleep. [`Prometheus::start_tls`] serves its API over TLS only (its own
//! `--web.config.file`, `tls_server_config`) with a certificate from a test CA.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use serde_json::Value;

use super::tls::TestCa;
use super::wait_for;

/// Serves `/metrics`: `ginx_test_broken{cause="<name>"} 1` for each file in `flags`.
pub struct Exporter {
    pub addr: String,
    pub flags: PathBuf,
    stop: Arc<AtomicBool>,
}

impl Exporter {
    pub fn start(flags: &Path) -> Self {
        std::fs::create_dir_all(flags).unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let stop = Arc::new(AtomicBool::new(false));
        let (dir, done) = (flags.to_owned(), Arc::clone(&stop));
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if done.load(Ordering::SeqCst) {
                    break;
                }
                if let Ok(c) = conn {
                    serve(c, &dir);
                }
            }
        });
        Self {
            addr,
            flags: flags.to_owned(),
            stop,
        }
    }

    /// The flag file for `cause`: while it exists, `TestBroken{cause="<cause>"}` fires.
    pub fn flag(&self, cause: &str) -> PathBuf {
        self.flags.join(cause)
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(&self.addr);
    }
}

fn serve(mut c: TcpStream, flags: &Path) {
    let _ = c.set_read_timeout(Some(Duration::from_secs(5)));
    let mut buf = [0u8; 4096];
    let _ = c.read(&mut buf);
    let mut body = String::from("# TYPE ginx_test_broken gauge\n");
    let mut names: Vec<String> = std::fs::read_dir(flags)
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    for n in names {
        body.push_str(&format!("ginx_test_broken{{cause=\"{n}\"}} 1\n"));
    }
    let _ = write!(
        c,
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    );
}

/// A Prometheus server scraping one target every second and evaluating `TestBroken` every
/// second.
pub struct Prometheus {
    pub url: String,
    dir: PathBuf,
    args: Vec<String>,
    child: Option<Child>,
    /// How the test itself reaches it over TLS (trusting the test CA); `None`: plain HTTP.
    tls: Option<Arc<rustls::ClientConfig>>,
}

const RULES: &str = "groups:
  - name: ginx-test
    rules:
      - alert: TestBroken
        expr: ginx_test_broken > 0
        labels:
          severity: critical
        annotations:
          summary: the test made it fire
";

impl Prometheus {
    /// Starts it in `dir` (its configuration and data), scraping `target` (`host:port`).
    pub fn start(dir: &Path, target: &str) -> Self {
        Self::launch(dir, target, None)
    }

    /// As [`Self::start`], serving HTTPS only, with a certificate for 127.0.0.1 that `ca`
    /// signed; `url` is `https://127.0.0.1:PORT`.
    pub fn start_tls(dir: &Path, target: &str, ca: &TestCa) -> Self {
        Self::launch(dir, target, Some(ca))
    }

    fn launch(dir: &Path, target: &str, ca: Option<&TestCa>) -> Self {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("rules.yml"), RULES).unwrap();
        std::fs::write(
            dir.join("prometheus.yml"),
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
                 rule_files: [{rules}]\n\
                 scrape_configs:\n  - job_name: test\n    static_configs:\n      - targets: [\"{target}\"]\n",
                rules = dir.join("rules.yml").display()
            ),
        )
        .unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut args = vec![
            format!("--config.file={}", dir.join("prometheus.yml").display()),
            format!("--storage.tsdb.path={}", dir.join("data").display()),
            format!("--web.listen-address=127.0.0.1:{port}"),
            "--log.level=warn".into(),
        ];
        if let Some(ca) = ca {
            args.push(format!(
                "--web.config.file={}",
                web_config(dir, ca).display()
            ));
        }
        let scheme = if ca.is_some() { "https" } else { "http" };
        let mut p = Self {
            url: format!("{scheme}://127.0.0.1:{port}"),
            dir: dir.to_owned(),
            args,
            child: None,
            tls: ca.map(client_config),
        };
        p.run();
        p
    }

    /// Starts it again (after [`Self::stop`]), on the same port and data.
    pub fn run(&mut self) {
        if self.child.is_some() {
            return;
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("prometheus.log"))
            .unwrap();
        let mut cmd = Command::new("prometheus");
        cmd.args(&self.args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        super::dies_with_test(&mut cmd);
        self.child = Some(cmd.spawn().expect("running prometheus"));
        let url = self.url.clone();
        let log = self.dir.join("prometheus.log");
        wait_for("Prometheus ready", || {
            let ready =
                get(&url, "/-/ready", self.tls.as_ref()).is_some_and(|(code, _)| code == 200);
            if !ready
                && let Some(c) = self.child.as_mut()
                && let Ok(Some(st)) = c.try_wait()
            {
                panic!(
                    "prometheus exited ({st}): {}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            ready.then_some(())
        });
    }

    /// Stops it (SIGTERM to its pid) and waits for it to exit.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(c.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let _ = c.wait();
        }
    }

    /// The alerts that fire, as Prometheus' own ALERTS series says: each `alertname{cause}`.
    pub fn firing(&self) -> Vec<String> {
        let path = "/api/v1/query?query=ALERTS%7Balertstate%3D%22firing%22%7D";
        let Some((200, body)) = get(&self.url, path, self.tls.as_ref()) else {
            return Vec::new();
        };
        let v: Value = serde_json::from_str(&body).unwrap_or_default();
        let mut out: Vec<String> = v["data"]["result"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|s| {
                format!(
                    "{}{{{}}}",
                    s["metric"]["alertname"].as_str().unwrap_or(""),
                    s["metric"]["cause"].as_str().unwrap_or("")
                )
            })
            .collect();
        out.sort();
        out
    }

    /// Waits until exactly `want` fire (each `alertname{cause}`).
    pub fn wait_firing(&self, want: &[&str]) {
        wait_for(&format!("Prometheus to see {want:?} firing"), || {
            (self.firing() == want).then_some(())
        });
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Prometheus' web configuration: TLS with a certificate for 127.0.0.1 signed by `ca`.
fn web_config(dir: &Path, ca: &TestCa) -> PathBuf {
    let (cert, key) = ca.issue_server_pem(&["127.0.0.1"]);
    std::fs::write(dir.join("web.crt"), cert).unwrap();
    std::fs::write(dir.join("web.key"), key).unwrap();
    let path = dir.join("web.yml");
    std::fs::write(
        &path,
        format!(
            "tls_server_config:\n  cert_file: {}\n  key_file: {}\n",
            dir.join("web.crt").display(),
            dir.join("web.key").display()
        ),
    )
    .unwrap();
    path
}

fn client_config(ca: &TestCa) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.der()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    Arc::new(config)
}

/// `GET url+path`, HTTP/1.0, over TLS with `tls`: the status and the body, or `None` when
/// nothing answers.
fn get(url: &str, path: &str, tls: Option<&Arc<rustls::ClientConfig>>) -> Option<(u16, String)> {
    let host = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))?;
    let sock = TcpStream::connect(host).ok()?;
    sock.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let mut stream: Box<dyn ReadWrite> = match tls {
        None => Box::new(sock),
        Some(config) => {
            let name = rustls::pki_types::ServerName::try_from("127.0.0.1").ok()?;
            let conn = rustls::ClientConnection::new(Arc::clone(config), name).ok()?;
            Box::new(rustls::StreamOwned::new(conn, sock))
        }
    };
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n").ok()?;
    let mut raw = Vec::new();
    // A server that closes without TLS' close_notify ends the read with an error after the
    // whole answer came; what came is what counts.
    let _ = stream.read_to_end(&mut raw);
    let out = String::from_utf8(raw).ok()?;
    let (head, body) = out.split_once("\r\n\r\n")?;
    let code = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, body.to_owned()))
}

trait ReadWrite: Read + Write {}
impl<T: Read + Write> ReadWrite for T {}
