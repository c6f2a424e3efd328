//! kubeadm and kube-vip: the documents behind `initKubeadm` / `joinCPKubeadm`, rendered from
//! cluster facts (the `[kubeadm]` section and a cluster file in Argus), the secrets they need,
//! and the files they are written to.
//!
//! The renderer ([`render`]) and the facts ([`facts`]) are pure. Running kubeadm is
//! `ginxctl kubeadm` (cli); the daemon only re-renders files and reports drift ([`watch`]).
//!
//! A worker (layer 5): imports `types`, `config`, `status`, `util`, never another worker. The
//! single-fact checks are config's (`config::kubeadm`); the watcher gets the API clients and a
//! reader of source files from the daemon.

pub mod facts;
pub mod render;
pub mod watch;

use std::path::Path;

use sha2::{Digest, Sha256};

use crate::config::{ClusterFacts, Config};
use crate::types::Invalid;

/// `sha256:<hex>` of the DER SubjectPublicKeyInfo of the (first) certificate in `pem`, as
/// `kubeadm join --discovery-token-ca-cert-hash` wants it.
pub fn ca_cert_hash(pem: &[u8]) -> Result<String, CaCertError> {
    use x509_cert::der::{DecodePem, Encode};
    let text = std::str::from_utf8(pem).map_err(|_| CaCertError::NotText)?;
    let start = text
        .find("-----BEGIN CERTIFICATE-----")
        .ok_or(CaCertError::NoCertificate)?;
    let end = text[start..]
        .find("-----END CERTIFICATE-----")
        .map(|e| start + e + "-----END CERTIFICATE-----".len())
        .ok_or(CaCertError::Unterminated)?;
    let cert = x509_cert::Certificate::from_pem(&text[start..end])
        .map_err(|e| CaCertError::Unreadable(e.to_string()))?;
    let spki = cert
        .tbs_certificate
        .subject_public_key_info
        .to_der()
        .map_err(|e| CaCertError::PublicKey(e.to_string()))?;
    Ok(format!("sha256:{}", hex(&Sha256::digest(&spki))))
}

/// Why the cluster CA's file gives no hash of its public key.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CaCertError {
    #[error("the CA certificate is not PEM text")]
    NotText,
    #[error("no PEM certificate found")]
    NoCertificate,
    #[error("unterminated PEM certificate")]
    Unterminated,
    #[error("cannot read the CA certificate: {0}")]
    Unreadable(String),
    #[error("cannot encode its public key: {0}")]
    PublicKey(String),
}

/// The OS gave no random bytes for a secret.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("no randomness from the OS: {0}")]
pub struct NoRandomness(String);

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn random(n: usize) -> Result<Vec<u8>, NoRandomness> {
    let mut buf = vec![0u8; n];
    getrandom::fill(&mut buf).map_err(|e| NoRandomness(e.to_string()))?;
    Ok(buf)
}

/// A bootstrap token `[a-z0-9]{6}.[a-z0-9]{16}` from the OS's CSPRNG.
pub fn generate_token() -> Result<String, NoRandomness> {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut out = String::with_capacity(23);
    // Rejection sampling keeps the characters uniform.
    while out.len() < 23 {
        for b in random(32)? {
            if out.len() == 23 {
                break;
            }
            if b < 252 {
                if out.len() == 6 {
                    out.push('.');
                }
                out.push(ALPHABET[usize::from(b % 36)] as char);
            }
        }
    }
    Ok(out)
}

/// An upload-certs key: 32 random bytes, hex.
pub fn generate_certificate_key() -> Result<String, NoRandomness> {
    Ok(hex(&random(32)?))
}

pub fn valid_token(t: &str) -> bool {
    let b = t.as_bytes();
    b.len() == 23
        && b[6] == b'.'
        && b.iter()
            .enumerate()
            .all(|(i, c)| i == 6 || c.is_ascii_lowercase() || c.is_ascii_digit())
}

pub fn valid_certificate_key(k: &str) -> bool {
    k.len() == 64 && k.bytes().all(|b| b.is_ascii_hexdigit())
}

pub fn valid_ca_hash(h: &str) -> bool {
    h.strip_prefix("sha256:")
        .is_some_and(|x| x.len() == 64 && x.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Writes `content` atomically; mode 0600 when it holds a secret, 0644 otherwise.
pub fn write_file(path: &Path, content: &str, secret: bool) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    // Through a dot file: in the static Pod directory a half-written manifest is never run as a
    // second kube-vip.
    crate::util::replace_file(path, content.as_bytes(), if secret { 0o600 } else { 0o644 })
}

/// Reads the cluster file from a source's checkout; the error names source, revision, file and
/// line:column.
pub fn parse_cluster_file(origin: &str, text: &str) -> Result<ClusterFacts, Invalid> {
    toml::from_str::<ClusterFacts>(text).map_err(|e| {
        let at = e.span().map(|s| {
            let before = &text[..s.start.min(text.len())];
            let line = before.bytes().filter(|b| *b == b'\n').count() + 1;
            let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
            format!(":{line}:{col}")
        });
        Invalid(format!(
            "{origin}{}: {}",
            at.unwrap_or_default(),
            e.message().trim()
        ))
    })
}

/// The facts of this configuration: `[kubeadm]` over `from_source` (the cluster file).
pub fn merged_facts(cfg: &Config, from_source: Option<ClusterFacts>) -> ClusterFacts {
    cfg.kubeadm.facts().over(from_source.unwrap_or_default())
}

/// This node's facts, and a warning when the advertise address is not on any local interface.
pub fn node_facts(cfg: &Config) -> (facts::NodeFacts, Vec<String>) {
    let mut warnings = Vec::new();
    if let Some(a) = cfg.node.advertise_address
        && matches!(crate::util::interface_with(a), Ok(None))
    {
        warnings.push(format!(
            "node.advertise_address {a} is not on any interface of this host; the API server will not be reachable there"
        ));
    }
    (
        facts::NodeFacts {
            name: cfg.node_name().to_owned(),
            role: cfg.node.role,
            advertise_address: cfg.node.advertise_address,
            node_ip: cfg.node.node_ip,
        },
        warnings,
    )
}

/// The interface kube-vip puts the VIP on, when `kube_vip.interface` is not set: the one that
/// carries the node's advertise address here. When it cannot be found, a warning: kube-vip then
/// picks the interface of the default route itself.
pub fn complete_interface(cluster: &mut facts::Cluster, node: &facts::NodeFacts) -> Option<String> {
    if cluster.kube_vip.interface.is_some() {
        return None;
    }
    let found = node.advertise_address.and_then(interface_of);
    match found {
        Some(name) => {
            cluster.kube_vip.interface = Some(name);
            None
        }
        None => Some(
            "kubeadm.kube_vip.interface is not set and node.advertise_address is not on an interface of this host: kube-vip will put the VIP on the interface of the default route; set interface (e.g. interface = \"eno1\") to choose".to_owned(),
        ),
    }
}

/// The name of the interface that has `ip`.
fn interface_of(ip: std::net::IpAddr) -> Option<String> {
    crate::util::interface_with(ip).ok().flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_and_keys_have_kubeadms_shapes() {
        for _ in 0..50 {
            let t = generate_token().unwrap();
            assert!(valid_token(&t), "{t}");
            assert!(valid_certificate_key(&generate_certificate_key().unwrap()));
        }
        assert_ne!(generate_token().unwrap(), generate_token().unwrap());
        assert!(!valid_token("ABCDEF.0123456789abcdef"));
        assert!(valid_ca_hash(&format!("sha256:{}", "a".repeat(64))));
    }

    #[test]
    fn the_interface_is_the_one_with_the_advertise_address() {
        assert_eq!(
            interface_of("127.0.0.1".parse().unwrap()).as_deref(),
            Some("lo")
        );
        assert_eq!(interface_of("192.0.2.250".parse().unwrap()), None);
    }

    #[test]
    fn cluster_file_errors_name_the_place() {
        let e = parse_cluster_file(
            "argus:clusters/k.toml@abc",
            "pod_subnet = \"x\"\nbogus = 1\n",
        )
        .unwrap_err();
        assert!(
            e.0.starts_with("argus:clusters/k.toml@abc:2:1: unknown field `bogus`"),
            "{e}"
        );
    }
}
