//! `ginxctl rollout resume` and `ginxctl rollout clear`: lifting the fleet's pause or a halted
//! revision is an operator's act, so ginxctl does it itself with the operator's own
//! credentials, never with the node's. Any node may stop the fleet (its ginx halts and pauses
//! with its own identity); none may start it again: `packaging/kubernetes/vap.yaml` refuses
//! every node identity the removal of a pause or a halt, and the API server's audit log names
//! the operator who lifted it.
//!
//! The credentials, first found: `--kubeconfig`, `KUBECONFIG` (its first file), and on a
//! control-plane node `/etc/kubernetes/admin.conf` (readable by root only). The node's own
//! kubeconfigs (`kubernetes.kubeconfig`, `kubernetes.node_kubeconfig`) are refused.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use k8s_openapi::api::authentication::v1::SelfSubjectReview;

use super::render;
use crate::config::{self, Config};
use crate::control::protocol::{ClearReport, FleetReport};
use crate::rollout::fleet::{ClearError, Fleet};
use crate::status::{FleetStatus, HaltStatus};
use crate::types::Invalid;

/// Where kubeadm writes the cluster admin's kubeconfig on control-plane nodes.
pub const ADMIN_CONF: &str = "/etc/kubernetes/admin.conf";

/// What an operator does: resume the paused fleet, clear a halted revision, hold or release
/// nodes.
#[derive(Debug)]
pub enum Act {
    Resume,
    Clear(String),
    Hold {
        nodes: Vec<String>,
        reason: String,
        until: Option<String>,
        force: bool,
    },
    Release(Vec<String>),
}

/// The operator's kubeconfig and where it was found (for messages).
#[derive(Debug, PartialEq)]
pub struct Credentials {
    pub path: PathBuf,
    pub from: &'static str,
}

/// The operator's kubeconfig: `flag`, else `env` (`KUBECONFIG`'s first file), else
/// `admin` when it exists. The node's own kubeconfigs are refused.
pub fn credentials(
    flag: Option<&Path>,
    env: Option<&str>,
    admin: &Path,
    cfg: &Config,
) -> Result<Credentials, Invalid> {
    let found = if let Some(p) = flag {
        Credentials {
            path: p.to_owned(),
            from: "--kubeconfig",
        }
    } else if let Some(first) = env
        .and_then(|v| v.split(':').find(|s| !s.is_empty()))
        .map(PathBuf::from)
    {
        Credentials {
            path: first,
            from: "KUBECONFIG",
        }
    } else if admin.exists() {
        Credentials {
            path: admin.to_owned(),
            from: "the control plane's admin.conf",
        }
    } else {
        return Err(Invalid(format!(
            "lifting the fleet's pause or a halt, holding or releasing a node, or asking for a \
             plan, is an operator's act, done with your own credentials: give them with --kubeconfig or KUBECONFIG (on a control-plane node, \
             root may use {})",
            admin.display()
        )));
    };
    let same = |p: &Path| match (found.path.canonicalize(), p.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => found.path == p,
    };
    let k = &cfg.kubernetes;
    let node_own = k.kubeconfig.as_deref().is_some_and(same) || same(&k.node_kubeconfig);
    if node_own {
        return Err(Invalid(format!(
            "{} ({}) is this node's own identity, which may stop the fleet but never start it \
             again, nor hold or release a node, nor ask for a plan: give an operator's kubeconfig",
            found.path.display(),
            found.from
        )));
    }
    Ok(found)
}

/// Runs `act` with the operator's credentials; prints what it did, or why not.
pub fn main(
    config_path: &Path,
    kubeconfig: Option<&Path>,
    timeout: std::time::Duration,
    act: Act,
) -> ExitCode {
    let cfg = match config::load(config_path) {
        Ok(l) => l.config,
        Err(e) if !config_path.exists() => {
            eprintln!(
                "ginxctl: warning: {}; using the default namespace and ConfigMap",
                render::terminal_safe(&e.to_string())
            );
            Config::default()
        }
        Err(e) => {
            eprintln!("ginxctl: {}", render::terminal_safe(&e.to_string()));
            return ExitCode::from(2);
        }
    };
    let act = match checked(act) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("ginxctl: {}", render::terminal_safe(&e.0));
            return ExitCode::from(2);
        }
    };
    let env = std::env::var("KUBECONFIG").ok();
    let creds = match credentials(kubeconfig, env.as_deref(), Path::new(ADMIN_CONF), &cfg) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("ginxctl: {}", render::terminal_safe(&e.0));
            return ExitCode::from(2);
        }
    };
    let rt = match super::runtime() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let result = rt.block_on(async {
        tokio::time::timeout(timeout, act_with(&cfg, &creds, act))
            .await
            .unwrap_or_else(|_| {
                Err((
                    1,
                    format!("no answer from the API within {}", humantime(timeout)),
                ))
            })
    });
    match result {
        Ok(out) => {
            print!("{}", render::terminal_safe(&out));
            ExitCode::SUCCESS
        }
        Err((code, e)) => {
            eprintln!("ginxctl: {}", render::terminal_safe(&e));
            ExitCode::from(code)
        }
    }
}

/// What was asked, checked before any credentials are looked for: a bad name or `--until` is
/// the command line's error (exit 2), not the API's.
enum Checked {
    Resume,
    Clear(String),
    Hold {
        asked: super::hold::Asked,
        force: bool,
    },
    Release(Vec<String>),
}

fn checked(act: Act) -> Result<Checked, Invalid> {
    Ok(match act {
        Act::Resume => Checked::Resume,
        Act::Clear(r) => Checked::Clear(r),
        Act::Hold {
            nodes,
            reason,
            until,
            force,
        } => {
            let local = jiff::tz::TimeZone::system();
            let now = crate::util::now();
            let asked = super::hold::check(&nodes, &reason, until.as_deref(), now, &local)?;
            Checked::Hold { asked, force }
        }
        Act::Release(nodes) => Checked::Release(super::hold::check_nodes(&nodes)?),
    })
}

fn humantime(d: std::time::Duration) -> String {
    format!("{}s", d.as_secs())
}

/// Exit codes as the socket commands': 1 when the API or the ConfigMap says no, 2 when there
/// are no usable credentials.
async fn act_with(cfg: &Config, creds: &Credentials, act: Checked) -> Result<String, (u8, String)> {
    let k = &cfg.kubernetes;
    let kc = crate::kube::client_config(&creds.path, None, k.request_timeout.get())
        .await
        .map_err(|e| (2, format!("{e} (from {})", creds.from)))?;
    let client = kube::Client::try_from(kc).map_err(|e| {
        (
            2,
            format!(
                "kubeconfig {}: {}",
                creds.path.display(),
                crate::k8s::describe(&e)
            ),
        )
    })?;
    let by = operator_name(&client).await;
    let fleet = Fleet::new(client.clone(), &k.namespace, &cfg.rollout.configmap).as_operator();
    match act {
        Checked::Hold { asked, force } => super::hold::hold(&client, cfg, &asked, &by, force).await,
        Checked::Release(nodes) => super::hold::release(&client, cfg, &nodes, &by).await,
        Checked::Resume => {
            let updated = fleet.resume(&by).await.map_err(|e| (1, e.to_string()))?;
            Ok(render::resumed(&FleetReport {
                changed: updated.changed,
                fleet: FleetStatus::from(&updated.state),
            }))
        }
        Checked::Clear(revision) => match fleet.clear(&revision, &by).await {
            Ok(cleared) => Ok(render::cleared(&ClearReport {
                cleared: HaltStatus::from(&cleared),
            })),
            Err(ClearError::Revision(e)) => Err((1, e.to_string())),
            Err(ClearError::Api(e)) => Err((1, e)),
        },
    }
}

/// Who the API server says the credentials are (a SelfSubjectReview), for the fleet's records;
/// the local user's name when it cannot say.
pub(super) async fn operator_name(client: &kube::Client) -> String {
    let api = kube::Api::<SelfSubjectReview>::all(client.clone());
    let review = SelfSubjectReview::default();
    match api.create(&crate::k8s::post_params(), &review).await {
        Ok(r) => r
            .status
            .and_then(|s| s.user_info)
            .and_then(|u| u.username)
            .unwrap_or_else(local_user),
        Err(_) => local_user(),
    }
}

fn local_user() -> String {
    let uid = nix::unistd::Uid::current();
    let name = nix::unistd::User::from_uid(uid)
        .ok()
        .flatten()
        .map_or_else(|| format!("uid {uid}"), |u| u.name);
    format!("{name} (local)")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(dir: &Path) -> Config {
        let mut c = Config::default();
        c.kubernetes.kubeconfig = Some(dir.join("kubeconfig"));
        c.kubernetes.node_kubeconfig = dir.join("kubelet.conf");
        c
    }

    #[test]
    fn the_flag_then_kubeconfig_then_admin_conf() {
        let dir = tempfile::tempdir().unwrap();
        let c = cfg(dir.path());
        let admin = dir.path().join("admin.conf");
        let op = dir.path().join("alice.conf");
        let got = credentials(Some(&op), Some("/x:/y"), &admin, &c).unwrap();
        assert_eq!(got.path, op);
        let got = credentials(None, Some(":/x:/y"), &admin, &c).unwrap();
        assert_eq!((got.path, got.from), (PathBuf::from("/x"), "KUBECONFIG"));
        let e = credentials(None, None, &admin, &c).unwrap_err();
        assert!(
            e.0.contains("operator's act") && e.0.contains("--kubeconfig"),
            "{e}"
        );
        std::fs::write(&admin, "").unwrap();
        assert_eq!(credentials(None, None, &admin, &c).unwrap().path, admin);
    }

    #[test]
    fn the_nodes_own_kubeconfigs_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let c = cfg(dir.path());
        let admin = dir.path().join("admin.conf");
        for own in ["kubeconfig", "kubelet.conf"] {
            let p = dir.path().join(own);
            std::fs::write(&p, "").unwrap();
            let e = credentials(Some(&p), None, &admin, &c).unwrap_err();
            assert!(e.0.contains("this node's own identity"), "{e}");
            // Through another name too.
            let link = dir.path().join(format!("{own}.link"));
            std::os::unix::fs::symlink(&p, &link).unwrap();
            let e = credentials(None, Some(link.to_str().unwrap()), &admin, &c).unwrap_err();
            assert!(e.0.contains("this node's own identity"), "{e}");
        }
    }
}
