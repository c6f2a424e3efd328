//! A real systemd: a Debian tree (tests/systemd/image.sh, from Debian's packages alone) booted
//! by `systemd-nspawn` with systemd as PID 1. The second test tier (tests/systemd.rs) runs the
//! real `ginx` under it, from the unit file as shipped.
//!
//! Each [`Machine`] has its own overlay over the cached tree (its writes are its own), its own
//! cgroup in both hierarchies systemd uses, and its own hostname; it shares the host's network,
//! so it reaches the test servers on 127.0.0.1. A `systemctl reboot` inside makes nspawn exit
//! with 133, and the boot loop starts it again on the same overlay: a new `boot_id`, a real
//! boot of the same machine (the kernel stays the host's).
//!
//! Processes: the boot loop is a shell this harness starts; it is stopped by its pid, and what
//! is left in the machine's cgroup is killed by pid from `cgroup.procs`. Nothing is killed by
//! name.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use super::wait_for_up_to;

/// nspawn's exit status when the container's systemd rebooted.
const REBOOTED: i32 = 133;

/// The cached Debian tree, built (or found) once per test run; `None` when the tools are
/// missing on a developer machine (in CI that is a failure).
pub fn image() -> Option<&'static Path> {
    static IMAGE: OnceLock<Option<PathBuf>> = OnceLock::new();
    IMAGE
        .get_or_init(|| tree("container", &["systemd-nspawn", "mmdebstrap", "nsenter"]))
        .as_deref()
}

/// The tree of `variant` (tests/systemd/image.sh), if every tool of `tools` is there.
pub fn tree(variant: &str, tools: &[&str]) -> Option<PathBuf> {
    for tool in tools {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !found {
            let why = format!(
                "{tool} is missing (Debian: systemd-container, mmdebstrap, util-linux, \
                 qemu-system-x86, qemu-utils, socat); the real-systemd tier needs it"
            );
            if std::env::var_os("CI").is_some_and(|v| v == "true") {
                panic!("{why}");
            }
            eprintln!("skipping: {why}");
            return None;
        }
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/systemd/image.sh");
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/systemd-image");
    let o = Command::new("bash")
        .arg(&script)
        .arg(&out)
        .arg(variant)
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    assert!(o.status.success(), "{} failed", script.display());
    let tree = PathBuf::from(String::from_utf8(o.stdout).unwrap().trim());
    assert!(
        tree.join("usr/lib/systemd/systemd").exists(),
        "{}",
        tree.display()
    );
    Some(tree)
}

/// A booted (or bootable) container.
pub struct Machine {
    pub name: String,
    /// The machine's root as the host sees it (the merged overlay): files written here are the
    /// machine's.
    pub root: PathBuf,
    dir: PathBuf,
    cgroups: Vec<PathBuf>,
    binds: Vec<PathBuf>,
    looper: Option<Child>,
    _tmp: tempfile::TempDir,
}

impl Machine {
    /// A machine `name` (its hostname) over the image; `binds` are host paths the machine sees
    /// at the same path (read-write). Not booted yet.
    pub fn new(image: &Path, name: &str, binds: &[&Path]) -> Self {
        static N: AtomicU32 = AtomicU32::new(0);
        let tmp = overlay(image, &format!("ginx-nspawn-{name}-"));
        let dir = tmp.path().to_owned();
        let root = dir.join("root");
        let cg = format!(
            "ginx-test-{name}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        let cgroups: Vec<PathBuf> = ["systemd", "unified"]
            .iter()
            .map(|h| Path::new("/sys/fs/cgroup").join(h).join(&cg))
            .collect();
        for c in &cgroups {
            std::fs::create_dir_all(c).unwrap();
        }
        Self {
            name: name.to_owned(),
            root,
            dir,
            cgroups,
            binds: binds.iter().map(|p| p.to_path_buf()).collect(),
            looper: None,
            _tmp: tmp,
        }
    }

    /// Boots the machine (and boots it again each time it reboots) and waits until systemd
    /// says it is up.
    pub fn boot(&mut self) {
        assert!(self.looper.is_none(), "{} is already booted", self.name);
        let mut nspawn = format!(
            "systemd-nspawn --boot --directory={} --register=no --keep-unit --quiet \
             --console=pipe --hostname={}",
            self.root.display(),
            self.name
        );
        for b in &self.binds {
            nspawn.push_str(&format!(" --bind={}", b.display()));
        }
        let script = format!(
            "for c in {cgs}; do echo $$ > \"$c/cgroup.procs\"; done\n\
             while :; do\n  {nspawn} >> {log} 2>&1\n  rc=$?\n  echo \"$rc\" >> {exits}\n  \
             [ \"$rc\" -eq {REBOOTED} ] || exit \"$rc\"\ndone\n",
            cgs = self
                .cgroups
                .iter()
                .map(|c| c.display().to_string())
                .collect::<Vec<_>>()
                .join(" "),
            log = self.console().display(),
            exits = self.dir.join("exits").display(),
        );
        let path = self.dir.join("boot-loop.sh");
        std::fs::write(&path, script).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        self.looper = Some(
            Command::new("sh")
                .arg(&path)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
        self.wait_up();
    }

    /// The console's output (every boot of it).
    pub fn console(&self) -> PathBuf {
        self.dir.join("console.log")
    }

    /// nspawn's exit statuses so far: one per reboot (133) or the last stop.
    pub fn exits(&self) -> Vec<i32> {
        std::fs::read_to_string(self.dir.join("exits"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    /// The running nspawn process, if any.
    fn nspawn_pid(&self) -> Option<i32> {
        let looper = self.looper.as_ref()?.id() as i32;
        children(looper).into_iter().next()
    }

    /// The machine's PID 1 as the host sees it: the child of nspawn whose comm is `systemd`.
    pub fn leader(&self) -> Option<i32> {
        let nspawn = self.nspawn_pid()?;
        children(nspawn).into_iter().find(|p| {
            std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == "systemd")
        })
    }

    /// Runs `argv` inside the machine (every namespace of its PID 1), with a plain PATH.
    pub fn exec(&self, argv: &[&str]) -> Output {
        let Some(leader) = self.leader() else {
            return Command::new("false").output().unwrap();
        };
        let mut child = Command::new("nsenter")
            .args(["-t", &leader.to_string(), "-a", "env", "-i"])
            .arg("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
            .args(argv)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let read = |r: Option<Box<dyn std::io::Read + Send>>| {
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                if let Some(mut r) = r {
                    let _ = r.read_to_end(&mut buf);
                }
                buf
            })
        };
        let out = read(child.stdout.take().map(|s| Box::new(s) as _));
        let err = read(child.stderr.take().map(|s| Box::new(s) as _));
        // A machine that shuts down while this runs: its systemd-shutdown stops every process
        // of the machine (SIGSTOP) before it kills them, and nsenter, outside the machine,
        // stops itself to mirror its child, then waits for a SIGCONT that nobody outside
        // sends. It would never reap the killed child, and the machine's PID namespace (so
        // its reboot) would wait for ever. Stopped, it is continued here.
        let pid = child.id();
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break s;
            }
            let stopped = std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| s.rsplit_once(") ").map(|(_, r)| r.starts_with('T')))
                .unwrap_or(false);
            if stopped {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid as i32),
                    nix::sys::signal::Signal::SIGCONT,
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        Output {
            status,
            stdout: out.join().unwrap(),
            stderr: err.join().unwrap(),
        }
    }

    /// `sh -c script` inside the machine.
    pub fn sh(&self, script: &str) -> Output {
        self.exec(&["sh", "-c", script])
    }

    /// Runs `argv` inside; it must succeed. Its stdout.
    pub fn ok(&self, argv: &[&str]) -> String {
        let o = self.exec(argv);
        assert!(
            o.status.success(),
            "{argv:?} in {} failed ({}): {}{}",
            self.name,
            o.status,
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8(o.stdout).unwrap()
    }

    /// Waits until systemd inside says the system is up (`running`, or `degraded`: some unit
    /// failed, which the tests look at themselves).
    pub fn wait_up(&self) {
        wait_for_up_to(
            &format!("{} booted", self.name),
            Duration::from_secs(120),
            || {
                let o = self.exec(&["systemctl", "is-system-running"]);
                let s = String::from_utf8_lossy(&o.stdout);
                matches!(s.trim(), "running" | "degraded").then_some(())
            },
        );
    }

    /// This boot's id.
    pub fn boot_id(&self) -> String {
        self.ok(&["cat", "/proc/sys/kernel/random/boot_id"])
            .trim()
            .to_owned()
    }

    /// `systemctl show UNIT -p PROP --value`.
    pub fn show(&self, unit: &str, prop: &str) -> String {
        self.ok(&["systemctl", "show", unit, "-p", prop, "--value"])
            .trim()
            .to_owned()
    }

    /// Writes `content` at `path` inside the machine (mode 0644, directories made).
    pub fn write(&self, path: &str, content: &str) {
        let p = self.path(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, content).unwrap();
    }

    /// `path` inside the machine as the host sees it.
    pub fn path(&self, path: &str) -> PathBuf {
        self.root.join(path.trim_start_matches('/'))
    }

    /// Installs ginx into the machine: see [`install_ginx_into`].
    pub fn install_ginx(&self) {
        install_ginx_into(&self.root);
    }

    /// The journal of UNIT inside, one JSON object per entry: what its processes wrote, what
    /// systemd said about it, and what a process calling itself UNIT (its syslog identifier)
    /// logged. The last is needed: journald attributes a message to its unit by the sender's
    /// cgroup, which it cannot read once the sender has exited, so `journalctl -u` misses the
    /// last lines of a process that is stopping.
    pub fn journal(&self, unit: &str) -> Vec<serde_json::Value> {
        let (own, about, ident) = (
            format!("_SYSTEMD_UNIT={unit}.service"),
            format!("UNIT={unit}.service"),
            format!("SYSLOG_IDENTIFIER={unit}"),
        );
        self.ok(&[
            "journalctl",
            "-o",
            "json",
            "--no-pager",
            &own,
            "+",
            &about,
            "+",
            &ident,
        ])
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
    }

    /// The `MESSAGE`s of UNIT's journal, in order.
    pub fn messages(&self, unit: &str) -> Vec<String> {
        self.journal(unit)
            .iter()
            .filter_map(|e| e["MESSAGE"].as_str().map(str::to_owned))
            .collect()
    }

    /// Powers the machine off (SIGTERM to nspawn: a clean shutdown) and waits for the boot
    /// loop to end; what is left after a minute is killed by pid.
    pub fn stop(&mut self) {
        self.collect_for_sweep();
        let nspawn = self.nspawn_pid();
        let Some(mut looper) = self.looper.take() else {
            return;
        };
        if let Some(p) = nspawn {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(p),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if looper.try_wait().ok().flatten().is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        if looper.try_wait().ok().flatten().is_none() {
            let console = std::fs::read_to_string(self.console()).unwrap_or_default();
            let tail: Vec<&str> = console.lines().rev().take(20).collect();
            eprintln!(
                "{} did not power off within a minute; killing it. Its console's last lines:\n{}",
                self.name,
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
            let _ = looper.kill();
            let _ = looper.wait();
        }
        self.kill_leftovers();
    }

    /// Gives the secrets sweep what the machine's ginx wrote: the whole journal (every unit,
    /// every field, every boot) and ginx's state directory.
    fn collect_for_sweep(&self) {
        if self.leader().is_none() {
            return;
        }
        let o = self.exec(&["journalctl", "-o", "export", "--no-pager"]);
        let origin = format!("the journal of machine {}", self.name);
        super::sweep::collect("machine-journal", &origin, &o.stdout);
        super::sweep::collect_dir("machine-state", &self.path("/var/lib/ginx"));
    }

    /// Kills, by pid, whatever is still in the machine's cgroups.
    fn kill_leftovers(&self) {
        for _ in 0..50 {
            let pids = cgroup_pids(&self.cgroups[0]);
            if pids.is_empty() {
                return;
            }
            for p in pids {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(p),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Machine {
    fn drop(&mut self) {
        self.stop();
        let _ = Command::new("umount").arg(&self.root).status();
        if Command::new("mountpoint")
            .arg("-q")
            .arg(&self.root)
            .status()
            .is_ok_and(|s| s.success())
        {
            let _ = Command::new("umount").arg("-l").arg(&self.root).status();
        }
        for c in &self.cgroups {
            remove_cgroup(c);
        }
    }
}

/// Installs the `ginx` and `ginxctl` this test run built at /usr/local/bin of the tree at `root`,
/// and the shipped unit and tmpfiles file, unmodified, where packaging/systemd/ginx.service says.
pub fn install_ginx_into(root: &Path) {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for (from, to, mode) in [
        (super::ginx_bin(), "usr/local/bin/ginx", 0o755),
        (super::ginxctl_bin(), "usr/local/bin/ginxctl", 0o755),
        (
            repo.join("packaging/systemd/ginx.service"),
            "etc/systemd/system/ginx.service",
            0o644,
        ),
        (
            repo.join("packaging/systemd/ginx.tmpfiles.conf"),
            "etc/tmpfiles.d/ginx.conf",
            0o644,
        ),
    ] {
        let to = root.join(to);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(&from, &to).unwrap();
        std::fs::set_permissions(&to, std::fs::Permissions::from_mode(mode)).unwrap();
    }
}

/// A temp dir holding an overlay mounted at `root/` over `tree` (`upper/` and `work/` beside
/// it): one machine's writes over the shared, cached tree. The caller unmounts it.
pub fn overlay(tree: &Path, prefix: &str) -> tempfile::TempDir {
    let tmp = tempfile::Builder::new().prefix(prefix).tempdir().unwrap();
    let dir = tmp.path();
    for d in ["upper", "work", "root"] {
        std::fs::create_dir_all(dir.join(d)).unwrap();
    }
    let opts = format!(
        "lowerdir={},upperdir={},workdir={}",
        tree.display(),
        dir.join("upper").display(),
        dir.join("work").display()
    );
    run(Command::new("mount")
        .args(["-t", "overlay", "overlay", "-o", &opts])
        .arg(dir.join("root")));
    tmp
}

/// The children of `pid`.
fn children(pid: i32) -> Vec<i32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// Every pid in the cgroup `dir` and below.
fn cgroup_pids(dir: &Path) -> Vec<i32> {
    let mut pids = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return pids;
    };
    pids.extend(
        std::fs::read_to_string(dir.join("cgroup.procs"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse::<i32>().ok()),
    );
    for e in entries.flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            pids.extend(cgroup_pids(&e.path()));
        }
    }
    pids
}

/// Removes a cgroup and those below it (deepest first).
fn remove_cgroup(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup(&e.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

pub fn run(cmd: &mut Command) {
    let o = cmd.output().unwrap();
    assert!(
        o.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}
