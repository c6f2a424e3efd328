//! Network namespaces the test creates itself (`ip netns add`), to give ginx a VIP on an
//! interface without touching the host's network. Deleted on drop.

use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::process::CommandExt;
use std::process::Command;

use nix::sched::{CloneFlags, setns};

pub struct NetNs {
    pub name: String,
}

impl NetNs {
    pub fn new(prefix: &str) -> Self {
        let name = format!("{prefix}-{}", fastrand::u32(..));
        let ok = Command::new("ip")
            .args(["netns", "add", &name])
            .status()
            .unwrap();
        assert!(ok.success(), "ip netns add {name}");
        Self { name }
    }

    /// `ip -n <ns> <args>`.
    pub fn ip(&self, args: &[&str]) {
        super::succeed(Command::new("ip").arg("-n").arg(&self.name).args(args));
    }

    fn file(&self) -> File {
        File::open(format!("/run/netns/{}", self.name)).unwrap()
    }

    /// Runs `f` on a thread inside the namespace: sockets it creates belong there.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        let ns = self.file();
        std::thread::scope(|s| {
            s.spawn(|| {
                setns(ns.as_fd(), CloneFlags::CLONE_NEWNET).unwrap();
                f()
            })
            .join()
            .unwrap()
        })
    }

    /// Makes `cmd` start inside the namespace (same pid, no wrapper process).
    pub fn wrap(&self, cmd: &mut Command) {
        let ns = self.file();
        // SAFETY: setns is async-signal-safe; the file stays open in the closure until exec.
        unsafe {
            cmd.pre_exec(move || {
                setns(ns.as_fd(), CloneFlags::CLONE_NEWNET).map_err(std::io::Error::from)
            });
        }
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}
