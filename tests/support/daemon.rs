//! A test environment (a Hephaestus repo, the stand-in colmena, a configuration) and the real
//! `ginx` daemon running in it, with a `NOTIFY_SOCKET` the test binds.

use std::cell::Cell;
use std::collections::HashMap;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;

use super::{GitRepo, PATIENCE, ginx_bin, ginxctl_bin, process_running, support_dir, wait_for};

/// One recorded call of the stand-in colmena.
#[derive(Debug, Clone)]
pub struct Call {
    pub dir: PathBuf,
    pub argv: Vec<String>,
    pub cwd: PathBuf,
    pub env: HashMap<String, String>,
    pub finished: bool,
}

impl Call {
    pub fn grandchildren(&self) -> Vec<i32> {
        std::fs::read_to_string(self.dir.join("grandchildren"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    pub fn pid(&self) -> i32 {
        std::fs::read_to_string(self.dir.join("pid"))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }

    /// Waits until the stand-in and every grandchild it started have exited.
    pub fn wait_gone(&self) {
        for pid in self.grandchildren().into_iter().chain([self.pid()]) {
            wait_for(&format!("process {pid} to be gone"), || {
                (!process_running(pid)).then_some(())
            });
        }
    }
}

pub struct Env {
    _tmp: tempfile::TempDir,
    pub root: PathBuf,
    pub repo: GitRepo,
    pub stub_dir: PathBuf,
    pub colmena: PathBuf,
    pub config: PathBuf,
    pub socket: PathBuf,
    pub state_dir: PathBuf,
    /// Extra environment for the daemon.
    pub daemon_env: Vec<(String, String)>,
    starts: Cell<u32>,
}

impl Env {
    /// A repo with a trivial hive and a configuration that applies it with the stand-in colmena.
    /// Fetching is left to `ginxctl sync` (the interval is an hour) and failed revisions wait an
    /// hour, so nothing happens behind a test's back.
    pub fn new() -> Self {
        let tmp = tempfile::Builder::new()
            .prefix("ginx-test-")
            .tempdir()
            .unwrap();
        let root = tmp.path().to_owned();
        let repo = GitRepo::init(&root.join("hephaestus"));
        let stub_dir = root.join("stub");
        std::fs::create_dir_all(&stub_dir).unwrap();
        let bin = root.join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        let colmena = bin.join("colmena");
        std::fs::copy(support_dir().join("colmena-stub"), &colmena).unwrap();
        std::fs::set_permissions(&colmena, std::fs::Permissions::from_mode(0o755)).unwrap();
        let env = Self {
            config: root.join("etc/config.toml"),
            socket: root.join("run/ginx.sock"),
            state_dir: root.join("state"),
            _tmp: tmp,
            root,
            repo,
            stub_dir,
            colmena,
            daemon_env: Vec::new(),
            starts: Cell::new(0),
        };
        env.write_config(&env.base_config());
        env
    }

    pub fn base_config(&self) -> String {
        format!(
            r#"state_dir = "{state}"
socket = "{socket}"

[node]
name = "lucy"

[sources.hephaestus]
url = "{repo}"
interval = "1h"

[apply]
command = ["{colmena}", "apply-local", "--node", "{{node}}"]
# The suite's stand-in counts one call per activation; tests of apply.prebuild (the default)
# turn it on.
prebuild = false
retry_base = "1h"
retry_max = "8h"
kill_grace = "1s"

[disruption]
# The stand-in answers the one expression ginx asks colmena for after a build.
system_command = ["{colmena}", "eval", "-E", '{{ nodes, ... }}: nodes."{{node}}".config.system.build.toplevel.outPath']

[control]
group = "root"

[rollout.gate]
settle = "0s"
interval = "200ms"

[kubernetes]
node_kubeconfig = "{node_kubeconfig}"
"#,
            node_kubeconfig = self.root.join("kubelet.conf").display(),
            state = self.state_dir.display(),
            socket = self.socket.display(),
            repo = self.repo.path.display(),
            colmena = self.colmena.display(),
        )
    }

    pub fn write_config(&self, text: &str) {
        std::fs::create_dir_all(self.config.parent().unwrap()).unwrap();
        std::fs::write(&self.config, text).unwrap();
    }

    /// Writes `config.d/<name>`; drop-ins override the base configuration key by key.
    pub fn dropin(&self, name: &str, text: &str) {
        let dir = self.config.parent().unwrap().join("config.d");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(name), text).unwrap();
    }

    /// A bare copy of the Hephaestus repo under `served/`, as a server would hold it; push to
    /// it with [`Env::push`].
    pub fn bare(&self) -> PathBuf {
        let served = self.root.join("served");
        let bare = served.join("hephaestus.git");
        if !bare.exists() {
            std::fs::create_dir_all(&served).unwrap();
            let out = super::git::git_cmd()
                .args(["clone", "-q", "--bare"])
                .arg(&self.repo.path)
                .arg(&bare)
                .output()
                .unwrap();
            assert!(out.status.success());
        }
        bare
    }

    /// Pushes the work repo's `refspec` to the bare copy (with `--force` if asked).
    pub fn push(&self, refspec: &str, force: bool) {
        let bare = self.bare();
        let mut args = vec!["push", "-q"];
        if force {
            args.push("--force");
        }
        let bare = bare.to_string_lossy().into_owned();
        args.push(&bare);
        args.push(refspec);
        self.repo.git(&args);
    }

    /// Runs applies through the stand-in `systemd-run`/`systemctl` (tests/support/*-stub).
    pub fn use_systemd_run(&mut self) -> PathBuf {
        let dir = self.root.join("systemd");
        std::fs::create_dir_all(&dir).unwrap();
        let mut paths = Vec::new();
        for name in ["systemd-run", "systemctl"] {
            let to = self.root.join("bin").join(name);
            std::fs::copy(support_dir().join(format!("{name}-stub")), &to).unwrap();
            std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o755)).unwrap();
            paths.push(to);
        }
        self.dropin(
            "40-isolation.toml",
            &format!(
                "[apply]\nisolation = \"systemd-run\"\nsystemd_run = \"{}\"\nsystemctl = \"{}\"\n",
                paths[0].display(),
                paths[1].display()
            ),
        );
        self.daemon_env
            .push(("STUB_SYSTEMD_DIR".into(), dir.display().to_string()));
        dir
    }

    /// A fake NixOS system under `stub/nix` (profile with generation 1, current and booted
    /// system), which the stand-in colmena changes like an activation when `activate` is set.
    pub fn fake_nix(&self) -> PathBuf {
        let nix = self.stub_dir.join("nix");
        let store = nix.join("store");
        let sys = store.join("system-1");
        std::fs::create_dir_all(&sys).unwrap();
        std::fs::create_dir_all(nix.join("profiles")).unwrap();
        std::fs::create_dir_all(nix.join("run")).unwrap();
        for (part, file) in [
            ("kernel", "kernel-1"),
            ("initrd", "initrd-1"),
            ("kernel-modules", "modules-1"),
        ] {
            std::fs::write(store.join(file), "").unwrap();
            std::os::unix::fs::symlink(store.join(file), sys.join(part)).unwrap();
        }
        std::os::unix::fs::symlink(&sys, nix.join("profiles/system-1-link")).unwrap();
        std::os::unix::fs::symlink("system-1-link", nix.join("profiles/system")).unwrap();
        std::os::unix::fs::symlink(&sys, nix.join("run/current-system")).unwrap();
        std::os::unix::fs::symlink(&sys, nix.join("run/booted-system")).unwrap();
        self.stub("activate", "");
        self.dropin(
            "45-system.toml",
            &format!(
                "[system]\nprofile = \"{n}/profiles/system\"\ncurrent_system = \"{n}/run/current-system\"\nbooted_system = \"{n}/run/booted-system\"\nginx_binary = \"{n}/run/current-system/sw/bin/ginx\"\nginx_unit = \"{n}/etc/ginx.service\"\ndrift_check_interval = \"1h\"\n",
                n = nix.display()
            ),
        );
        nix
    }

    /// Sets a behaviour file of the stand-in colmena (see tests/support/colmena-stub).
    pub fn stub(&self, file: &str, content: &str) {
        std::fs::write(self.stub_dir.join(file), content).unwrap();
    }

    pub fn unstub(&self, file: &str) {
        let _ = std::fs::remove_file(self.stub_dir.join(file));
    }

    /// Every call of the stand-in colmena so far, oldest first.
    pub fn calls(&self) -> Vec<Call> {
        let Ok(entries) = std::fs::read_dir(self.stub_dir.join("calls")) else {
            return Vec::new();
        };
        let mut dirs: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
        dirs.sort();
        dirs.into_iter()
            .filter_map(|dir| {
                // A call directory is complete once the stub wrote its pid (the last record).
                let pid = std::fs::read_to_string(dir.join("pid")).ok()?;
                if pid.trim().is_empty() {
                    return None;
                }
                let argv = std::fs::read_to_string(dir.join("argv")).ok()?;
                let cwd = std::fs::read_to_string(dir.join("cwd")).ok()?;
                let env = std::fs::read_to_string(dir.join("env"))
                    .ok()?
                    .lines()
                    .filter_map(|l| l.split_once('='))
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
                    .collect();
                Some(Call {
                    argv: argv.lines().map(str::to_owned).collect(),
                    cwd: PathBuf::from(cwd.trim()),
                    env,
                    finished: dir.join("finished").exists(),
                    dir,
                })
            })
            .collect()
    }

    /// Waits until call `n` (0-based) of the stand-in colmena, running with the `hang` stub, has
    /// started all three of its grandchildren, and returns it.
    pub fn wait_hanging_call(&self, n: usize) -> Call {
        wait_for(
            &format!("call {n} of the stand-in to start its grandchildren"),
            || {
                self.calls()
                    .into_iter()
                    .nth(n)
                    .filter(|c| c.grandchildren().len() == 3)
            },
        )
    }

    pub fn start(&self) -> Daemon {
        self.start_with(|_| {})
    }

    /// Starts `ginx`, letting `tweak` adjust the command, and waits for `READY=1`.
    pub fn start_with(&self, tweak: impl FnOnce(&mut Command)) -> Daemon {
        let n = self.starts.get();
        self.starts.set(n + 1);
        let notify_path = self.root.join(format!("notify-{n}.sock"));
        let notify = UnixDatagram::bind(&notify_path).unwrap();
        notify.set_nonblocking(true).unwrap();
        let log = self.root.join(format!("ginx-{n}.log"));
        let log_file = std::fs::File::create(&log).unwrap();
        let mut cmd = Command::new(ginx_bin());
        cmd.arg("--config")
            .arg(&self.config)
            .env("NOTIFY_SOCKET", &notify_path)
            // GINX_TEST_RUST_LOG: the daemons' filter when a test is being looked into.
            .env(
                "RUST_LOG",
                std::env::var("GINX_TEST_RUST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .env("GINX_STUB_DIR", &self.stub_dir)
            .env_remove("WATCHDOG_USEC")
            .env_remove("WATCHDOG_PID")
            .env_remove("INVOCATION_ID")
            .envs(self.daemon_env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().unwrap())
            .stderr(log_file);
        tweak(&mut cmd);
        let child = cmd.spawn().expect("starting ginx");
        let mut d = Daemon {
            pid: child.id() as i32,
            child: Some(child),
            notify,
            notes: Vec::new(),
            socket: self.socket.clone(),
            log,
        };
        d.wait_note("READY=1", |n| n == "READY=1");
        d
    }
}

pub struct Daemon {
    pub pid: i32,
    child: Option<Child>,
    notify: UnixDatagram,
    /// Every sd_notify datagram received so far, split into lines.
    pub notes: Vec<String>,
    pub socket: PathBuf,
    pub log: PathBuf,
}

impl Daemon {
    /// Reads pending sd_notify datagrams.
    pub fn poll_notes(&mut self) {
        let mut buf = vec![0u8; 4096];
        while let Ok(n) = self.notify.recv(&mut buf) {
            let text = String::from_utf8_lossy(&buf[..n]).into_owned();
            self.notes.extend(text.lines().map(str::to_owned));
        }
    }

    /// Waits for a notification matching `pred`.
    pub fn wait_note(&mut self, what: &str, pred: impl Fn(&str) -> bool) -> String {
        let start = Instant::now();
        loop {
            if let Some(n) = self.notes.iter().find(|n| pred(n)) {
                return n.clone();
            }
            self.poll_notes();
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!("ginx exited ({status}) before {what}; log:\n{}", self.log());
            }
            if start.elapsed() > PATIENCE {
                panic!("no {what} from ginx; log:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn ctl(&self, args: &[&str]) -> Output {
        ctl_at(&self.socket, args)
    }

    /// Runs `ginxctl`, failing the test unless it exits 0; returns stdout.
    pub fn ctl_ok(&self, args: &[&str]) -> String {
        let out = self.ctl(args);
        assert!(
            out.status.success(),
            "ginxctl {args:?} failed ({}): {}\nlog:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr),
            self.log()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn status(&self) -> Value {
        serde_json::from_str(&self.ctl_ok(&["status", "--json"])).unwrap()
    }

    /// Waits until the status satisfies `pred`, and returns that status.
    pub fn wait_status(&self, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let start = Instant::now();
        loop {
            let s = self.status();
            if pred(&s) {
                return s;
            }
            if start.elapsed() > PATIENCE {
                panic!(
                    "timed out waiting for {what}; last status:\n{s:#}\nlog:\n{}",
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// Waits until `revision` is applied.
    pub fn wait_applied(&self, revision: &str) -> Value {
        self.wait_status(&format!("{revision} applied"), |s| {
            s["apply"]["state"] == "succeeded" && s["apply"]["applied_revision"] == revision
        })
    }

    pub fn signal(&self, sig: Signal) {
        kill(Pid::from_raw(self.pid), sig).unwrap();
    }

    /// SIGTERM, then waits for the exit.
    pub fn stop(mut self) -> ExitStatus {
        self.signal(Signal::SIGTERM);
        self.wait_exit()
    }

    /// The exit status, if ginx has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    pub fn wait_exit(&mut self) -> ExitStatus {
        let child = self.child.as_mut().expect("ginx already reaped");
        let status = wait_for("ginx to exit", || child.try_wait().unwrap());
        self.child = None;
        self.poll_notes();
        status
    }

    /// SIGKILL: ginx gets no chance to clean up.
    pub fn crash(mut self) {
        self.signal(Signal::SIGKILL);
        self.wait_exit();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        // For the secrets sweep: everything this ginx said on stderr and to systemd.
        self.poll_notes();
        super::sweep::collect_file("ginx-log", &self.log);
        super::sweep::collect(
            "ginx-sd-notify",
            &format!("sd_notify of ginx {}", self.pid),
            self.notes.join("\n").as_bytes(),
        );
    }
}

impl Drop for Env {
    /// For the secrets sweep: what the daemons left in the state directory (state file,
    /// history, attempt output, bootstrap report, the clones' Git configuration).
    fn drop(&mut self) {
        super::sweep::collect_dir("state-dir", &self.state_dir);
    }
}

impl Env {
    /// Runs `ginxctl` as an operator with `kubeconfig` (`rollout resume`, `rollout clear`,
    /// which do not ask the daemon) and this node's configuration (its namespace and
    /// ConfigMap). `KUBECONFIG` from the test's environment is not passed on.
    pub fn operator_ctl(&self, kubeconfig: &Path, args: &[&str]) -> Output {
        let out = Command::new(ginxctl_bin())
            .arg("--config")
            .arg(&self.config)
            .args(["--timeout", "90s"])
            .args(args)
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .env_remove("GINX_SOCKET")
            .env_remove("KUBECONFIG")
            .output()
            .expect("running ginxctl");
        super::sweep::collect_ctl(args, &out);
        out
    }

    /// [`Self::operator_ctl`], failing the test unless it exits 0; returns stdout.
    pub fn operator_ok(&self, kubeconfig: &Path, args: &[&str]) -> String {
        let out = self.operator_ctl(kubeconfig, args);
        assert!(
            out.status.success(),
            "ginxctl {args:?} as an operator failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

/// Runs the real `ginxctl` against `socket`.
pub fn ctl_at(socket: &Path, args: &[&str]) -> Output {
    let out = Command::new(ginxctl_bin())
        .arg("--socket")
        .arg(socket)
        .args(["--timeout", "90s"])
        .args(args)
        .env_remove("GINX_SOCKET")
        .output()
        .expect("running ginxctl");
    super::sweep::collect_ctl(args, &out);
    out
}
