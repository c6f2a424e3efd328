//! A real kernel: the `vm` variant of the Debian tree (tests/systemd/image.sh: the same tree
//! with Debian's kernel and initrd and DHCP on eth0) booted by qemu under software emulation
//! (`accel=tcg`: KVM is not usable here). The real-systemd tier's one VM test (tests/qemu.rs).
//!
//! The disk is made per VM from an overlay of the cached tree with the test's files in it
//! (`mkfs.ext4 -d`), so the tree stays untouched. Network: qemu's user networking with
//! `restrict=on` in 10.0.0.0/24; the guest reaches nothing but the `guestfwd`s a test asks for
//! on 10.0.0.1 (an address in the test API server's certificate), each connection handed to a
//! command on the host (`socat` to a server on 127.0.0.1, or `git daemon --inetd`). The serial
//! console goes to a file the test reads. qemu is stopped by its pid.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use super::nspawn::run;
use std::sync::OnceLock;

/// The cached `vm` tree; `None` when a tool is missing on a developer machine (a failure in CI).
pub fn vm_tree() -> Option<&'static Path> {
    static TREE: OnceLock<Option<PathBuf>> = OnceLock::new();
    TREE.get_or_init(|| {
        super::nspawn::tree(
            "vm",
            &["mmdebstrap", "qemu-system-x86_64", "mkfs.ext4", "socat"],
        )
    })
    .as_deref()
}

pub struct Vm {
    pub name: String,
    dir: PathBuf,
    tree: PathBuf,
    qemu: Option<Child>,
    _tmp: tempfile::TempDir,
}

impl Vm {
    /// A VM `name` whose disk is the tree with what `files` writes into the root it is given.
    pub fn new(tree: &Path, name: &str, files: impl FnOnce(&Path)) -> Self {
        let tmp = super::nspawn::overlay(tree, &format!("ginx-qemu-{name}-"));
        let dir = tmp.path().to_owned();
        let root = dir.join("root");
        std::fs::write(root.join("etc/hostname"), format!("{name}\n")).unwrap();
        files(&root);
        let disk = dir.join("disk.raw");
        run(Command::new("truncate").args(["-s", "4G"]).arg(&disk));
        let made = Command::new("mkfs.ext4")
            .args(["-q", "-F", "-d"])
            .arg(&root)
            .arg(&disk)
            .output()
            .unwrap();
        let _ = Command::new("umount").arg(&root).status();
        assert!(
            made.status.success(),
            "mkfs.ext4: {}",
            String::from_utf8_lossy(&made.stderr)
        );
        Self {
            name: name.to_owned(),
            dir,
            tree: tree.to_owned(),
            qemu: None,
            _tmp: tmp,
        }
    }

    /// Starts qemu. `forwards`: (port on 10.0.0.1, the host command each connection goes to).
    pub fn boot(&mut self, forwards: &[(u16, String)]) {
        let boot = |prefix: &str| {
            std::fs::read_dir(self.tree.join("boot"))
                .unwrap()
                .flatten()
                .map(|e| e.path())
                .find(|p| {
                    p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with(prefix))
                })
                .unwrap_or_else(|| panic!("no {prefix}* in the vm tree's /boot"))
        };
        let mut netdev = "user,id=n0,restrict=on,net=10.0.0.0/24,host=10.0.0.2,dns=10.0.0.3,\
                          dhcpstart=10.0.0.15"
            .to_owned();
        for (port, cmd) in forwards {
            assert!(
                !cmd.contains(','),
                "a guestfwd command cannot hold a comma: {cmd}"
            );
            netdev.push_str(&format!(",guestfwd=tcp:10.0.0.1:{port}-cmd:{cmd}"));
        }
        let child = Command::new("qemu-system-x86_64")
            .args(["-machine", "pc,accel=tcg", "-m", "1024", "-smp", "1"])
            .args(["-display", "none", "-monitor", "none"])
            .arg("-kernel")
            .arg(boot("vmlinuz-"))
            .arg("-initrd")
            .arg(boot("initrd.img-"))
            .args([
                "-append",
                "root=/dev/vda rw console=ttyS0 net.ifnames=0 panic=-1",
            ])
            .arg("-drive")
            .arg(format!(
                "file={},if=virtio,format=raw",
                self.dir.join("disk.raw").display()
            ))
            .args(["-netdev", &netdev, "-device", "virtio-net-pci,netdev=n0"])
            .arg("-serial")
            .arg(format!("file:{}", self.console().display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(self.dir.join("qemu.err")).unwrap())
            .spawn()
            .unwrap();
        self.qemu = Some(child);
    }

    pub fn console(&self) -> PathBuf {
        self.dir.join("console.log")
    }

    pub fn console_text(&self) -> String {
        String::from_utf8_lossy(&std::fs::read(self.console()).unwrap_or_default()).into_owned()
    }

    /// The boot ids the guest printed to its console (`ginx-test-boot-id=…`), in order.
    pub fn boot_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = Vec::new();
        for l in self.console_text().lines() {
            if let Some(at) = l.find("ginx-test-boot-id=") {
                let id = l[at + "ginx-test-boot-id=".len()..].trim().to_owned();
                if ids.last() != Some(&id) {
                    ids.push(id);
                }
            }
        }
        ids
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        if let Some(mut q) = self.qemu.take() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(q.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            for _ in 0..50 {
                if q.try_wait().ok().flatten().is_some() {
                    return;
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            let _ = q.kill();
            let _ = q.wait();
        }
    }
}
