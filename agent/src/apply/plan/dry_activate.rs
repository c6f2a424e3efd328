//! What `<system>/bin/switch-to-configuration dry-activate` says an activation of a built
//! NixOS system would do to the running one: the units it would stop, restart, reload or
//! start, whether it would restart systemd itself, and the swap devices it would turn off.
//!
//! The format read here is the one NixOS prints, the same in the Perl script and in its Rust
//! successor: every line on stderr; `would stop the following units: a.service, b.socket`, and
//! likewise `would NOT stop the following changed units:`, `would reload the following units:`,
//! `would restart the following units:` and `would start the following units:`, the names joined
//! by ", " and a line left out when its list is empty; `would restart systemd`; `would stop swap
//! device: /dev/…`; `would activate the configuration...`, after which the system's own
//! `dry-activate` script prints whatever it prints. See nixpkgs
//! `pkgs/by-name/sw/switch-to-configuration-ng/src/src/main.rs` (lines 1320–1326 and 1360–1496
//! at 173582451f) and, up to NixOS 25.05,
//! `nixos/modules/system/activation/switch-to-configuration.pl` (its `dry-activate` block).
//! Older versions print the same lines in another order, so order is not relied on.
//!
//! Pure: the text in, the changes out.

use std::collections::BTreeSet;

pub use crate::types::UnitChanges;

/// Picks the set of [`UnitChanges`] a line fills.
type Pick = fn(&mut UnitChanges) -> &mut BTreeSet<String>;

/// The lines that name units, and the set each fills.
const LISTS: &[(&str, Pick)] = &[
    ("would stop the following units: ", |c| &mut c.stop),
    ("would NOT stop the following changed units: ", |c| {
        &mut c.skip
    }),
    ("would reload the following units: ", |c| &mut c.reload),
    ("would restart the following units: ", |c| &mut c.restart),
    ("would start the following units: ", |c| &mut c.start),
];

/// The changes `output` (dry-activate's stderr) announces. Lines of another kind (what the
/// system's own `dry-activate` script prints, warnings) are not changes and are skipped.
pub fn parse(output: &str) -> UnitChanges {
    let mut c = UnitChanges::default();
    for line in output.lines().map(str::trim_end) {
        if line == "would restart systemd" {
            c.restart_systemd = true;
        } else if let Some(device) = line.strip_prefix("would stop swap device: ") {
            c.swap_off.insert(device.to_owned());
        } else if let Some((prefix, set)) = LISTS.iter().find(|(p, _)| line.starts_with(p)) {
            let names = line[prefix.len()..].split(", ").filter(|n| !n.is_empty());
            set(&mut c).extend(names.map(str::to_owned));
        }
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What switch-to-configuration-ng prints when containerd's unit changed, nginx's unit
    /// asks for a reload, a timer changed and a new service appeared; then two lines of the
    /// system's own dry-activate script.
    const CONTAINERD: &str = "would stop the following units: containerd.service, kubelet.service\n\
         would NOT stop the following changed units: systemd-journald.service\n\
         would activate the configuration...\n\
         would create user 'etcd' with uid 996\n\
         setting up /etc...\n\
         would restart systemd\n\
         would reload the following units: nginx.service\n\
         would restart the following units: logrotate.timer\n\
         would start the following units: containerd.service, kubelet.service, node-exporter.service\n";

    #[test]
    fn every_list_lands_in_its_set() {
        let c = parse(CONTAINERD);
        let set = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<BTreeSet<_>>();
        assert_eq!(c.stop, set(&["containerd.service", "kubelet.service"]));
        assert_eq!(c.skip, set(&["systemd-journald.service"]));
        assert_eq!(c.reload, set(&["nginx.service"]));
        assert_eq!(c.restart, set(&["logrotate.timer"]));
        assert_eq!(
            c.start,
            set(&[
                "containerd.service",
                "kubelet.service",
                "node-exporter.service"
            ])
        );
        assert!(c.restart_systemd);
        assert_eq!(
            c.interrupted(),
            ["containerd.service", "kubelet.service", "logrotate.timer"].into()
        );
        assert_eq!(
            c.restarted(),
            ["containerd.service", "kubelet.service", "logrotate.timer"].into()
        );
    }

    #[test]
    fn nothing_to_do_is_one_line_and_no_changes() {
        assert_eq!(
            parse("would activate the configuration...\n"),
            UnitChanges::default()
        );
        assert_eq!(parse(""), UnitChanges::default());
    }

    #[test]
    fn the_old_order_swap_and_socket_activation_read_the_same() {
        // The order of NixOS before 2021 (no "would activate" line, reloads last), a swap
        // device going away, and a socket-activated service: the service stopped, its socket
        // stopped and started.
        let c = parse(
            "would stop swap device: /dev/vda3\n\
             would stop the following units: sshd.service, sshd.socket\n\
             would start the following units: sshd.socket\n\
             would reload the following units: dbus.service\n",
        );
        assert_eq!(c.swap_off, ["/dev/vda3".to_owned()].into());
        assert_eq!(c.interrupted(), ["sshd.service", "sshd.socket"].into());
        assert_eq!(c.restarted(), ["sshd.socket"].into());
        assert_eq!(c.reload, ["dbus.service".to_owned()].into());
    }
}
