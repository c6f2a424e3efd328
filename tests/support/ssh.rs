//! A real OpenSSH server on 127.0.0.1 serving Git over SSH with a deploy key: `sshd -i` (inetd
//! mode) for each connection, so the port is the one our listener holds.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::inetd::InetdServer;

pub const SSHD: &str = "/usr/sbin/sshd";

/// Generates an ed25519 key pair at `path` (and `path.pub`); returns the public key line.
pub fn keygen(path: &Path, comment: &str) -> String {
    let _ = std::fs::remove_file(path);
    let _ = std::fs::remove_file(path.with_extension("pub"));
    super::succeed(
        Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-C", comment, "-f"])
            .arg(path),
    );
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
    super::sweep::secret_key_file("SSH private key", path);
    pub_line(path)
}

/// `<type> <base64>` of the public key beside the private key at `path`.
pub fn pub_line(path: &Path) -> String {
    let mut p = path.as_os_str().to_owned();
    p.push(".pub");
    let text = std::fs::read_to_string(PathBuf::from(p)).unwrap();
    text.split_whitespace()
        .take(2)
        .collect::<Vec<_>>()
        .join(" ")
}

pub struct SshServer {
    pub server: InetdServer,
    pub dir: PathBuf,
    /// The client's deploy key (mode 0600).
    pub client_key: PathBuf,
    /// A known_hosts file with the server's key for `[127.0.0.1]:PORT`.
    pub known_hosts: PathBuf,
    pub host_key_line: String,
}

impl SshServer {
    pub fn start(dir: &Path) -> Self {
        std::fs::create_dir_all(dir).unwrap();
        // sshd's privilege separation directory.
        std::fs::create_dir_all("/run/sshd").unwrap();
        let host_key = dir.join("hostkey");
        let host_key_line = keygen(&host_key, "test host");
        let client_key = dir.join("deploy_key");
        let client_line = keygen(&client_key, "ginx deploy key");
        std::fs::write(dir.join("authorized_keys"), format!("{client_line}\n")).unwrap();
        let config = dir.join("sshd_config");
        std::fs::write(
            &config,
            format!(
                "HostKey {hk}\nAuthorizedKeysFile {ak}\nPermitRootLogin prohibit-password\n\
                 PasswordAuthentication no\nKbdInteractiveAuthentication no\nStrictModes no\n\
                 UsePAM no\nPidFile none\nLogLevel VERBOSE\n",
                hk = host_key.display(),
                ak = dir.join("authorized_keys").display(),
            ),
        )
        .unwrap();
        let log = dir.join("sshd.log");
        let server = InetdServer::start(move || {
            let mut c = Command::new(SSHD);
            c.arg("-i").arg("-f").arg(&config).arg("-E").arg(&log);
            c
        });
        let known_hosts = dir.join("known_hosts");
        std::fs::write(
            &known_hosts,
            format!("[127.0.0.1]:{} {host_key_line}\n", server.port),
        )
        .unwrap();
        Self {
            server,
            dir: dir.to_owned(),
            client_key,
            known_hosts,
            host_key_line,
        }
    }

    /// The URL of the repository at absolute path `repo`.
    pub fn url(&self, repo: &Path) -> String {
        format!(
            "ssh://root@127.0.0.1:{}{}",
            self.server.port,
            repo.display()
        )
    }

    /// The `[sources.*]` keys that make ginx use this server's deploy key, trusting the host keys
    /// in `known_hosts` (usually [`Self::known_hosts`]).
    pub fn source_keys(&self, known_hosts: &Path) -> String {
        format!(
            "ssh_key_file = \"{}\"\nknown_hosts_file = \"{}\"\n",
            self.client_key.display(),
            known_hosts.display()
        )
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("sshd.log")).unwrap_or_default()
    }
}
