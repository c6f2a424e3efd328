//! One qemu VM end to end (the real-systemd tier's last point): a real kernel boots the tier's
//! Debian tree (its `vm` variant, tests/support/qemu.rs) with ginx installed from the shipped unit, and ginx, against
//! the real control plane on the host, coordinates one real reboot of the whole machine for a
//! revision with a new kernel: slot, cordon, the lock's raised duration, `systemctl reboot`
//! (qemu resets the guest, the kernel boots again: a new boot id), and back: verified,
//! uncordoned, slot released. The VM is a kaas VM: its image has ginx enabled with
//! `packaging/cloud-init/image-config.toml`, and its first boot is configured by real
//! cloud-init from a NoCloud seed, README's user-data filled by `fill-user-data.sh` (the Git
//! server: sshd on 10.0.0.1, one `sshd -i` per connection).
//!
//! Simulated, as in tests/systemd.rs: the kernel *change* (a new `kernel` store path in the
//! system the real Nix makes; the guest boots the same bzImage, and `/run/booted-system` is
//! set at boot by the image's stage-2 stand-in) and the kubelet (a stand-in on the host keeps
//! the Node). Evidence comes from the API server and the guest's serial console.

use std::time::Duration;

use crate::support::control_plane::{self, RbacGuard};
use crate::support::kubelet::Kubelet;
use crate::support::qemu::{self, Vm};
use crate::support::reboot::Unschedulable;
use crate::support::{Env, ssh, support_dir, wait_for_up_to};

#[test]
fn a_real_kernel_reboot_of_a_vm_coordinated_by_ginx() {
    let Some(tree) = qemu::vm_tree() else { return };
    let Some(cp) = control_plane::shared() else {
        return;
    };
    let name = "vmq-lucy";
    let mut rbac = RbacGuard::new(cp);
    rbac.watch(name);
    let _kubelet = Kubelet::start(cp, name, "worker");
    let watch = Unschedulable::watch(cp, &[name.to_owned()]);
    let origin = Env::new();
    origin.repo.commit("kernel", "kernel-1\n", "kernel 1");
    let bare = origin.bare();
    let kc = origin.root.join("kube/kubeconfig");
    std::fs::create_dir_all(kc.parent().unwrap()).unwrap();
    cp.ginx_kubeconfig_via(&kc, name, "https://10.0.0.1:6443");
    // The seed: README's user-data, the Git server (sshd, one per connection) on 10.0.0.1.
    let sshd = ssh::SshServer::start(&origin.root.join("ssh"));
    let user_data = crate::systemd::kaas_user_data(
        &origin.root.join("cloud-init"),
        name,
        &format!("ssh://root@10.0.0.1{}", bare.display()),
        &sshd.client_key,
        &format!("10.0.0.1 {}", sshd.host_key_line),
        &kc,
    );
    // The image's own config (packaging/cloud-init/image-config.toml, its colmena the real-Nix
    // stand-in) and the settings this image was built with.
    let packaging =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/cloud-init");
    let image_config = std::fs::read_to_string(packaging.join("image-config.toml")).unwrap();
    let command = image_config
        .lines()
        .find(|l| l.starts_with("command = "))
        .unwrap();
    let image_config = image_config.replace(
        command,
        "command = [\"env\", \"GINX_STUB_DIR=/var/lib/ginx-test-stub\", \
         \"/usr/local/bin/nix-activate\", \"apply-local\", \"--node\", \"{node}\"]\n\
         retry_base = \"1h\"\nretry_max = \"8h\"",
    );
    let settings = "[sources.hephaestus]\ninterval = \"2s\"\n\n\
         [health]\ninterval = \"1s\"\n[health.kubelet]\nenabled = false\n\
         [health.apiserver]\nenabled = false\n[health.cilium]\nenabled = false\n\
         [health.node_ready]\nenabled = true\n\n\
         [rollout]\nlock = \"auto\"\ngroup = \"vmq\"\nlease_duration = \"15s\"\n\n\
         [rollout.gate]\nsettle = \"2s\"\n\n\
         [reboot]\nmode = \"when-required\"\nlock_ttl = \"15m\"\n";
    let mut vm = Vm::new(tree, name, |root| {
        crate::support::nspawn::install_ginx_into(root);
        let write = |path: &str, text: &str| {
            let p = root.join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        };
        std::fs::copy(
            support_dir().join("nix-activate-stub"),
            root.join("usr/local/bin/nix-activate"),
        )
        .unwrap();
        write("etc/ginx/config.toml", &image_config);
        write("etc/ginx/config.d/90-image.toml", settings);
        write("var/lib/cloud/seed/nocloud/user-data", &user_data);
        write(
            "var/lib/cloud/seed/nocloud/meta-data",
            &format!("instance-id: {name}-iid\nlocal-hostname: {name}\n"),
        );
        std::fs::create_dir_all(root.join("var/lib/ginx-test-stub")).unwrap();
        write(
            "etc/systemd/system/ginx-test-boot-id.service",
            "[Unit]\nDescription=test: this boot's id on the console\n\
             [Service]\nType=oneshot\n\
             ExecStart=/bin/sh -c 'echo \"ginx-test-boot-id=$(cat /proc/sys/kernel/random/boot_id)\" > /dev/kmsg'\n\
             [Install]\nWantedBy=multi-user.target\n",
        );
        let wants = root.join("etc/systemd/system/multi-user.target.wants");
        std::fs::create_dir_all(&wants).unwrap();
        for unit in ["ginx.service", "ginx-test-boot-id.service"] {
            std::os::unix::fs::symlink(format!("/etc/systemd/system/{unit}"), wants.join(unit))
                .unwrap();
        }
        // The installed system: generation 1 of the profile, made by the tree's own Nix.
        let made = std::process::Command::new("chroot")
            .arg(root)
            .args([
                "sh",
                "-c",
                "cd / && GINX_STUB_DIR=/var/lib/ginx-test-stub HOME=/root \
                 /usr/local/bin/nix-activate apply-local --node install boot",
            ])
            .output()
            .unwrap();
        assert!(
            made.status.success(),
            "generation 1: {}",
            String::from_utf8_lossy(&made.stderr)
        );
    });
    let api = cp.addr();
    vm.boot(&[
        (6443, format!("socat - TCP:127.0.0.1:{}", api.port())),
        (
            22,
            format!(
                "{} -i -f {} -E {}",
                ssh::SSHD,
                sshd.dir.join("sshd_config").display(),
                sshd.dir.join("sshd.log").display()
            ),
        ),
    ]);
    let annotation = |key: &str| -> Option<String> {
        cp.node(name)?["metadata"]["annotations"][key]
            .as_str()
            .map(str::to_owned)
    };
    let first = origin.repo.head();
    let patience = Duration::from_secs(600);
    let started = std::time::Instant::now();
    let seen = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_for_up_to(
            "the VM's ginx applying the first revision",
            patience,
            || (annotation("ginx.io/applied-revision")? == first).then_some(()),
        );
        let booted = started.elapsed();
        origin.repo.commit("kernel", "kernel-2\n", "kernel 2");
        origin.push("main", false);
        let second = origin.repo.head();
        wait_for_up_to("the VM rebooted into kernel 2 and done", patience, || {
            let node = cp.node(name)?;
            let done = annotation("ginx.io/applied-revision")? == second
                && annotation("ginx.io/reboot-required")? == "false"
                && !node["spec"]["unschedulable"].as_bool().unwrap_or(false)
                && cp
                    .lease("ginx-system", "ginx-rollout-vmq-0")
                    .is_some_and(|l| {
                        l["spec"]["holderIdentity"]
                            .as_str()
                            .unwrap_or("")
                            .is_empty()
                    });
            done.then_some(())
        });
        // Figures for README (printed, never asserted).
        eprintln!(
            "qemu: first revision applied {:.0} s after qemu started; the reboot for the second \
             done {:.0} s after its commit",
            booted.as_secs_f64(),
            started.elapsed().as_secs_f64() - booted.as_secs_f64()
        );
    }));
    if seen.is_err() {
        let console = vm.console_text();
        let tail: Vec<&str> = console.lines().rev().take(60).collect();
        panic!(
            "the VM did not get there; its console's end:\n{}",
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
    let ids = vm.boot_ids();
    assert_eq!(ids.len(), 2, "one real reboot: boot ids {ids:?}");
    assert_ne!(ids[0], ids[1]);
    assert_eq!(
        watch.most.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "cordoned for the reboot"
    );
    let console = vm.console_text();
    assert!(
        console.contains("reboot: Restarting system"),
        "a kernel reboot"
    );
    // Configured by cloud-init from the seed, fetched over SSH.
    assert!(
        console.contains("DataSourceNoCloud"),
        "cloud-init's NoCloud seed"
    );
    assert!(sshd.log().contains("Accepted publickey"), "{}", sshd.log());
}
