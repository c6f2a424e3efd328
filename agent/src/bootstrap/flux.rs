//! The stage `[bootstrap.flux]` generates: the Namespace `flux-system`, the pull secret made
//! from the Argus source's own credentials, and the FluxInstance `flux` (the Flux Operator's
//! API, `fluxcd.controlplane.io/v1`: `spec.distribution`, `components`, `cluster`, `sync`).
//! Pure: the caller reads the credential files. The manifests are JSON documents (valid YAML);
//! they hold the credentials, so they are never printed.

use serde_json::{Value, json};

use crate::config::FluxConfig;

/// The namespace and name of the FluxInstance.
pub const NAMESPACE: &str = "flux-system";
pub const NAME: &str = "flux";

/// The credentials Flux pulls with, as its GitRepository Secret format wants them.
pub enum PullSecret {
    /// HTTPS basic auth: the token as the password.
    Token { username: String, password: String },
    /// SSH: the deploy key and the host keys.
    Ssh {
        identity: String,
        known_hosts: String,
    },
}

/// The manifests of the stage, `---`-separated.
pub fn render(f: &FluxConfig, url: &str, git_ref: &str, secret: Option<&PullSecret>) -> String {
    let mut sync = json!({
        "kind": "GitRepository",
        "url": url,
        "ref": git_ref,
        "path": f.path,
    });
    let mut docs: Vec<Value> = vec![json!({
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE},
    })];
    if let Some(s) = secret {
        let data = match s {
            PullSecret::Token { username, password } => {
                json!({"username": username, "password": password})
            }
            PullSecret::Ssh {
                identity,
                known_hosts,
            } => json!({"identity": identity, "known_hosts": known_hosts}),
        };
        docs.push(json!({
            "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": f.pull_secret, "namespace": NAMESPACE},
            "stringData": data,
        }));
        sync["pullSecret"] = json!(f.pull_secret);
    }
    docs.push(json!({
        "apiVersion": "fluxcd.controlplane.io/v1",
        "kind": "FluxInstance",
        "metadata": {"name": NAME, "namespace": NAMESPACE},
        "spec": {
            "distribution": {"version": f.version, "registry": f.registry},
            "components": f.components,
            "cluster": {
                "type": f.cluster_type,
                "networkPolicy": f.network_policy,
                "domain": f.domain,
            },
            "sync": sync,
        },
    }));
    docs.iter()
        .map(Value::to_string)
        .collect::<Vec<_>>()
        .join("\n---\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flux() -> FluxConfig {
        toml::from_str("path = \"clusters/lab\"\n").unwrap()
    }

    #[test]
    fn the_instance_carries_the_source_and_the_secret_its_credentials() {
        let secret = PullSecret::Token {
            username: "git".into(),
            password: "s3cret-token".into(),
        };
        let text = render(
            &flux(),
            "https://git.example.com/argus.git",
            "refs/heads/main",
            Some(&secret),
        );
        let docs = crate::bootstrap::parse(&text, "flux").unwrap();
        let kinds: Vec<&str> = docs.iter().map(crate::bootstrap::manifest::kind).collect();
        assert_eq!(kinds, ["Namespace", "Secret", "FluxInstance"]);
        let fi = &docs[2].data["spec"];
        assert_eq!(fi["sync"]["url"], "https://git.example.com/argus.git");
        assert_eq!(fi["sync"]["ref"], "refs/heads/main");
        assert_eq!(fi["sync"]["path"], "clusters/lab");
        assert_eq!(fi["sync"]["pullSecret"], "flux-system");
        assert_eq!(fi["distribution"]["version"], "2.x");
        assert_eq!(fi["cluster"]["networkPolicy"], true);
        assert_eq!(docs[1].data["stringData"]["password"], "s3cret-token");
        let ssh = PullSecret::Ssh {
            identity: "KEY".into(),
            known_hosts: "git.example.com ssh-ed25519 AAAA".into(),
        };
        let text = render(
            &flux(),
            "ssh://git@git.example.com/argus.git",
            "refs/heads/main",
            Some(&ssh),
        );
        let docs = crate::bootstrap::parse(&text, "flux").unwrap();
        assert_eq!(docs[1].data["stringData"]["identity"], "KEY");
        let text = render(&flux(), "https://x/y.git", "refs/heads/main", None);
        let docs = crate::bootstrap::parse(&text, "flux").unwrap();
        assert_eq!(docs.len(), 2);
        assert!(docs[1].data["spec"]["sync"].get("pullSecret").is_none());
    }
}
