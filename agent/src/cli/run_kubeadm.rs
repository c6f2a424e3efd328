//! `ginxctl kubeadm`: render the documents, and run `kubeadm init` / `kubeadm join` with them
//! (what the NixOS module exposes as `initKubeadm` and `joinCPKubeadm`). Runs on the node, as
//! root; reads the configuration itself and the cluster file in Argus through the daemon.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Args, Subcommand};

use crate::config::{self, Config};
use crate::control::client::Client;
use crate::control::protocol::{Command, SourceFileReport};
use crate::k8s;
use crate::kubeadm::{self, facts, render};
use crate::types::Role;

#[derive(Debug, Subcommand)]
pub enum KubeadmCommand {
    /// Print the documents (secrets masked unless --show-secrets).
    Render(RenderArgs),
    /// Write the init configuration and the kube-vip manifest, run `kubeadm init --upload-certs`,
    /// print the join command for the other control-plane nodes.
    Init {
        /// Passed through to kubeadm; nothing is written to /etc/kubernetes.
        #[arg(long)]
        dry_run: bool,
        /// Run `ginxctl bootstrap` once the control plane answers (`[bootstrap] after_init`).
        #[arg(long)]
        bootstrap: bool,
        /// Do not run the bootstrap, whatever `[bootstrap] after_init` or --bootstrap say.
        #[arg(long)]
        no_bootstrap: bool,
    },
    /// Write the join configuration and run `kubeadm join` (as a control-plane node unless
    /// --worker).
    Join {
        /// The bootstrap token printed by `ginxctl kubeadm init`.
        token: String,
        /// The certificate key printed by `ginxctl kubeadm init` (control-plane joins).
        certificate_key: Option<String>,
        /// `sha256:…`; default: computed from kubeadm.ca_cert when it exists.
        #[arg(long = "ca-cert-hash")]
        ca_cert_hashes: Vec<String>,
        /// Join as a worker (no certificate key, no kube-vip).
        #[arg(long)]
        worker: bool,
        /// Passed through to kubeadm; nothing is written to /etc/kubernetes.
        #[arg(long)]
        dry_run: bool,
    },
    /// Point kube-vip back at admin.conf once the kubeadm:cluster-admins binding exists.
    SwitchKubeVip {
        /// Give up after this long.
        #[arg(long, default_value = "5m")]
        wait: config::Duration,
    },
}

#[derive(Debug, Args)]
pub struct RenderArgs {
    /// InitConfiguration + ClusterConfiguration for the first node (the default).
    #[arg(long, group = "kind")]
    init: bool,
    /// JoinConfiguration for another control-plane node.
    #[arg(long, group = "kind")]
    join_control_plane: bool,
    /// JoinConfiguration for a worker.
    #[arg(long, group = "kind")]
    join_worker: bool,
    /// The kube-vip static Pod (with --super-admin: as on the node running kubeadm init).
    #[arg(long, group = "kind")]
    kube_vip: bool,
    /// With --kube-vip: mount super-admin.conf, as during `kubeadm init`.
    #[arg(long)]
    super_admin: bool,
    /// Print the token and certificate key instead of a placeholder.
    #[arg(long)]
    show_secrets: bool,
    /// The bootstrap token to render (default: a placeholder).
    #[arg(long)]
    token: Option<String>,
    /// The certificate key to render (default: a placeholder).
    #[arg(long)]
    certificate_key: Option<String>,
    /// `sha256:…`; default: computed from kubeadm.ca_cert when it exists.
    #[arg(long = "ca-cert-hash")]
    ca_cert_hashes: Vec<String>,
}

/// A failure that ends the command: its message and exit code.
struct Fail(String, u8);

impl<E: std::fmt::Display> From<E> for Fail {
    fn from(e: E) -> Self {
        Fail(e.to_string(), 1)
    }
}

pub fn main(config_path: &Path, client: &Client, cmd: KubeadmCommand) -> ExitCode {
    match run(config_path, client, cmd) {
        Ok(code) => code,
        Err(Fail(message, code)) => {
            eprintln!(
                "ginxctl kubeadm: {}",
                super::render::terminal_safe(&message)
            );
            ExitCode::from(code)
        }
    }
}

/// The configuration, the resolved cluster facts and this node.
fn prepare(
    config_path: &Path,
    client: &Client,
) -> Result<(Config, facts::Cluster, facts::NodeFacts), Fail> {
    let cfg = config::load(config_path)?.config;
    let from_source = match (&cfg.kubeadm.source, &cfg.kubeadm.cluster_file) {
        (Some(source), Some(file)) => {
            let r: SourceFileReport = client
                .call(Command::SourceFile {
                    source: source.clone(),
                    path: file.display().to_string(),
                })
                .map_err(|e| {
                    Fail(
                        format!("reading the cluster facts from {source} through ginx: {e}"),
                        1,
                    )
                })?;
            let origin = format!("{source}:{}@{}", r.path, r.revision.short());
            Some(kubeadm::parse_cluster_file(&origin, &r.content).map_err(|e| Fail(e.0, 1))?)
        }
        _ => None,
    };
    let merged = kubeadm::merged_facts(&cfg, from_source);
    let mut cluster =
        facts::resolve(&merged).map_err(|e| Fail(format!("cluster facts: {e}"), 1))?;
    let (node, mut warnings) = kubeadm::node_facts(&cfg);
    facts::check_node(&cluster, &node).map_err(|e| Fail(e, 1))?;
    warnings.extend(kubeadm::complete_interface(&mut cluster, &node));
    for w in warnings {
        eprintln!("warning: {w}");
    }
    Ok((cfg, cluster, node))
}

fn check_secrets(token: Option<&str>, key: Option<&str>, hashes: &[String]) -> Result<(), Fail> {
    if let Some(t) = token
        && !kubeadm::valid_token(t)
    {
        return Err(Fail(
            "the token must look like abcdef.0123456789abcdef ([a-z0-9]{6}.[a-z0-9]{16})".into(),
            2,
        ));
    }
    if let Some(k) = key
        && !kubeadm::valid_certificate_key(k)
    {
        return Err(Fail("the certificate key must be 64 hex digits".into(), 2));
    }
    if let Some(h) = hashes.iter().find(|h| !kubeadm::valid_ca_hash(h)) {
        return Err(Fail(
            format!("{h:?} is not a CA hash like sha256:<64 hex digits>"),
            2,
        ));
    }
    Ok(())
}

/// The CA hashes given, else the one of `kubeadm.ca_cert` if it exists.
fn ca_hashes(cfg: &Config, given: &[String]) -> Result<Vec<String>, Fail> {
    if !given.is_empty() {
        return Ok(given.to_vec());
    }
    match std::fs::read(&cfg.kubeadm.ca_cert) {
        Ok(pem) => Ok(vec![kubeadm::ca_cert_hash(&pem).map_err(|e| {
            Fail(format!("{}: {e}", cfg.kubeadm.ca_cert.display()), 1)
        })?]),
        Err(_) => Ok(Vec::new()),
    }
}

fn run(config_path: &Path, client: &Client, cmd: KubeadmCommand) -> Result<ExitCode, Fail> {
    match cmd {
        KubeadmCommand::Render(a) => render_cmd(config_path, client, a),
        KubeadmCommand::Init {
            dry_run,
            bootstrap,
            no_bootstrap,
        } => init(config_path, client, dry_run, bootstrap, no_bootstrap),
        KubeadmCommand::Join {
            token,
            certificate_key,
            ca_cert_hashes,
            worker,
            dry_run,
        } => join(
            config_path,
            client,
            &token,
            certificate_key,
            &ca_cert_hashes,
            worker,
            dry_run,
        ),
        KubeadmCommand::SwitchKubeVip { wait } => {
            let (cfg, cluster, _) = prepare(config_path, client)?;
            switch_kube_vip(&cfg, &cluster, wait.get())?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn render_cmd(config_path: &Path, client: &Client, a: RenderArgs) -> Result<ExitCode, Fail> {
    check_secrets(
        a.token.as_deref(),
        a.certificate_key.as_deref(),
        &a.ca_cert_hashes,
    )?;
    let (cfg, cluster, node) = prepare(config_path, client)?;
    let joining = a.join_control_plane || a.join_worker;
    let mut secrets = render::Secrets {
        token: Some(
            a.token
                .unwrap_or_else(|| "<generated by ginxctl kubeadm init>".into()),
        ),
        certificate_key: Some(
            a.certificate_key
                .unwrap_or_else(|| "<generated by ginxctl kubeadm init>".into()),
        ),
        // Only join documents pin the CA.
        ca_cert_hashes: if joining {
            ca_hashes(&cfg, &a.ca_cert_hashes)?
        } else {
            Vec::new()
        },
    };
    if joining && secrets.ca_cert_hashes.is_empty() {
        eprintln!(
            "warning: no CA hash: {} does not exist here; `ginxctl kubeadm join` needs --ca-cert-hash",
            cfg.kubeadm.ca_cert.display()
        );
        secrets
            .ca_cert_hashes
            .push("sha256:<the cluster CA's hash: --ca-cert-hash>".into());
    }
    let mut docs = if joining {
        vec![render::join(
            &cluster,
            &node,
            &secrets,
            a.join_control_plane,
        )]
    } else if a.kube_vip {
        let host = if a.super_admin {
            render::SUPER_ADMIN_CONF
        } else {
            render::ADMIN_CONF
        };
        vec![render::kube_vip(&cluster, host)]
    } else {
        render::init(&cluster, &node, &secrets)
    };
    if !a.show_secrets {
        render::mask(&mut docs);
    }
    print!("{}", render::to_yaml(&docs)?);
    Ok(ExitCode::SUCCESS)
}

fn run_kubeadm(cfg: &Config, args: &[&str], file: &Path) -> Result<(), Fail> {
    let program = &cfg.kubeadm.kubeadm_path;
    eprintln!("+ {} {}", program.display(), args.join(" "));
    let status = std::process::Command::new(program)
        .args(args)
        .status()
        .map_err(|e| {
            Fail(
                format!(
                    "cannot run {} (kubeadm.kubeadm_path): {e}",
                    program.display()
                ),
                1,
            )
        })?;
    match status.code() {
        Some(0) => Ok(()),
        code => Err(Fail(
            format!(
                "kubeadm failed ({status}); its configuration is in {}",
                file.display()
            ),
            code.and_then(|c| u8::try_from(c).ok())
                .filter(|c| *c != 0)
                .unwrap_or(1),
        )),
    }
}

fn write_kube_vip(cluster: &facts::Cluster, host_kubeconfig: &str) -> Result<PathBuf, Fail> {
    let path = cluster.kube_vip.manifest_path.clone();
    let yaml = render::to_yaml(&[render::kube_vip(cluster, host_kubeconfig)])?;
    kubeadm::write_file(&path, &yaml, true)
        .map_err(|e| Fail(format!("writing {}: {e}", path.display()), 1))?;
    Ok(path)
}

/// How long `kubeadm init --bootstrap` waits for the API server to answer.
const API_WAIT: Duration = Duration::from_secs(300);

fn init(
    config_path: &Path,
    client: &Client,
    dry_run: bool,
    bootstrap: bool,
    no_bootstrap: bool,
) -> Result<ExitCode, Fail> {
    let (cfg, cluster, node) = prepare(config_path, client)?;
    let bootstrap = (bootstrap || cfg.bootstrap.after_init) && !no_bootstrap;
    check_init_allowed(&cfg, &node, bootstrap)?;
    let secrets = render::Secrets {
        token: Some(kubeadm::generate_token()?),
        certificate_key: Some(kubeadm::generate_certificate_key()?),
        ca_cert_hashes: Vec::new(),
    };
    let file = cfg.kubeadm.output_dir.join("init.yaml");
    let yaml = render::to_yaml(&render::init(&cluster, &node, &secrets))?;
    kubeadm::write_file(&file, &yaml, true)
        .map_err(|e| Fail(format!("writing {}: {e}", file.display()), 1))?;
    eprintln!(
        "wrote {} (mode 0600: it holds the token and the certificate key)",
        file.display()
    );
    if dry_run {
        eprintln!(
            "dry run: the kube-vip manifest would go to {}",
            cluster.kube_vip.manifest_path.display()
        );
    } else {
        let p = write_kube_vip(&cluster, render::SUPER_ADMIN_CONF)?;
        eprintln!(
            "wrote {} (kube-vip uses super-admin.conf until kubeadm has set up admin.conf's rights)",
            p.display()
        );
    }
    let file_arg = file.display().to_string();
    let mut args = vec!["init", "--config", file_arg.as_str(), "--upload-certs"];
    if dry_run {
        args.push("--dry-run");
    }
    run_kubeadm(&cfg, &args, &file)?;
    if dry_run {
        println!("dry run: nothing was initialised; no token or certificate key exists yet");
        return Ok(ExitCode::SUCCESS);
    }
    let (token, key) = (
        secrets.token.unwrap_or_default(),
        secrets.certificate_key.unwrap_or_default(),
    );
    let hashes = ca_hashes(&cfg, &[])?;
    print!(
        "{}",
        join_instructions(&token, &key, &hashes, &cfg.kubeadm.ca_cert)
    );
    if let Err(Fail(e, _)) = switch_kube_vip(&cfg, &cluster, Duration::from_secs(300)) {
        eprintln!("warning: {e}; run `ginxctl kubeadm switch-kube-vip` once the API answers");
    }
    if bootstrap {
        println!();
        println!("Bootstrapping the cluster ([bootstrap]; `ginxctl bootstrap` runs it again):");
        let opts = super::run_bootstrap::Options {
            dry_run: false,
            only: None,
            wait_for_api: Some(API_WAIT),
        };
        if let Err((m, code)) = super::run_bootstrap::run(config_path, client, opts) {
            return Err(Fail(
                format!(
                    "the control plane is initialised (join it as printed above), but the \
                     bootstrap did not finish: {m}"
                ),
                code,
            ));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Whether `kubeadm init` may run here: on a control-plane node, and with a bootstrap to run
/// when one is asked for.
fn check_init_allowed(cfg: &Config, node: &facts::NodeFacts, bootstrap: bool) -> Result<(), Fail> {
    if bootstrap && !cfg.bootstrap.configured() {
        return Err(Fail(
            "the bootstrap is asked for (--bootstrap or [bootstrap] after_init), but [bootstrap] \
             has no stage and no [bootstrap.flux]"
                .into(),
            2,
        ));
    }
    if node.role != Role::ControlPlane {
        return Err(Fail(
            format!(
                "node.role is {}; kubeadm init is for the first control-plane node",
                node.role
            ),
            2,
        ));
    }
    Ok(())
}

/// What `init` prints once the control plane is up: how the other nodes join it (the CA
/// hashes, when there are none, are to be taken from kubeadm's output).
fn join_instructions(token: &str, key: &str, hashes: &[String], ca_cert: &Path) -> String {
    let hash_args: String = hashes
        .iter()
        .map(|h| format!(" --ca-cert-hash {h}"))
        .collect();
    let mut o = format!(
        "\nThe control plane is initialised. On each other control-plane node run:\n\n  \
         joinCPKubeadm {token} {key}{hash_args}\n\n\
         (that is: ginxctl kubeadm join {token} {key}{hash_args})\n\
         and on workers: ginxctl kubeadm join {token} --worker{hash_args}\n\
         The certificate key works for two hours (uploaded certificates), the token for 24.\n"
    );
    if hashes.is_empty() {
        o.push_str(&format!(
            "No CA at {}: add --ca-cert-hash sha256:… from kubeadm's output.\n",
            ca_cert.display()
        ));
    }
    o
}

#[allow(clippy::too_many_arguments)]
fn join(
    config_path: &Path,
    client: &Client,
    token: &str,
    certificate_key: Option<String>,
    given: &[String],
    worker: bool,
    dry_run: bool,
) -> Result<ExitCode, Fail> {
    check_secrets(Some(token), certificate_key.as_deref(), given)?;
    if !worker && certificate_key.is_none() {
        return Err(Fail(
            "a control-plane join needs the certificate key printed by initKubeadm (or --worker)"
                .into(),
            2,
        ));
    }
    let (cfg, cluster, node) = prepare(config_path, client)?;
    let hashes = ca_hashes(&cfg, given)?;
    if hashes.is_empty() {
        return Err(Fail(
            format!(
                "no CA hash to pin discovery to: pass --ca-cert-hash sha256:… (printed by initKubeadm), or put the cluster CA at {} (kubeadm.ca_cert)",
                cfg.kubeadm.ca_cert.display()
            ),
            2,
        ));
    }
    let secrets = render::Secrets {
        token: Some(token.to_owned()),
        certificate_key,
        ca_cert_hashes: hashes,
    };
    let file = cfg.kubeadm.output_dir.join("join.yaml");
    let yaml = render::to_yaml(&[render::join(&cluster, &node, &secrets, !worker)])?;
    kubeadm::write_file(&file, &yaml, true)
        .map_err(|e| Fail(format!("writing {}: {e}", file.display()), 1))?;
    eprintln!("wrote {} (mode 0600: it holds the token)", file.display());
    let file_arg = file.display().to_string();
    let mut args = vec!["join", "--config", file_arg.as_str()];
    if dry_run {
        args.push("--dry-run");
    }
    run_kubeadm(&cfg, &args, &file)?;
    if !worker && !dry_run {
        // kubeadm join wants /etc/kubernetes/manifests empty: kube-vip comes after.
        let p = write_kube_vip(&cluster, render::ADMIN_CONF)?;
        eprintln!("wrote {}", p.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// Waits until admin.conf can see the `kubeadm:cluster-admins` binding, then rewrites the
/// kube-vip manifest to mount admin.conf.
fn switch_kube_vip(cfg: &Config, cluster: &facts::Cluster, wait: Duration) -> Result<(), Fail> {
    let manifest = &cluster.kube_vip.manifest_path;
    let current = std::fs::read_to_string(manifest).unwrap_or_default();
    if !current.contains(render::SUPER_ADMIN_CONF) {
        eprintln!(
            "{} does not use super-admin.conf; nothing to switch",
            manifest.display()
        );
        return Ok(());
    }
    let admin = cfg.kubeadm.admin_kubeconfig.clone();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let deadline = Instant::now() + wait;
    let found = runtime.block_on(async {
        let mut last = String::new();
        while Instant::now() < deadline {
            match crate::kube::client_config(&admin, None, Duration::from_secs(5)).await {
                Ok(c) => match kube::Client::try_from(c) {
                    Ok(client) => {
                        let crbs: kube::Api<k8s_openapi::api::rbac::v1::ClusterRoleBinding> =
                            kube::Api::all(client);
                        match crbs.get_opt("kubeadm:cluster-admins").await {
                            Ok(Some(_)) => return Ok(()),
                            Ok(None) => last = "kubeadm:cluster-admins does not exist yet".into(),
                            Err(e) => last = k8s::describe(&e),
                        }
                    }
                    Err(e) => last = k8s::describe(&e),
                },
                Err(e) => last = e,
            }
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        Err(last)
    });
    match found {
        Ok(()) => {
            let p = write_kube_vip(cluster, render::ADMIN_CONF)?;
            eprintln!("kube-vip now uses admin.conf ({})", p.display());
            Ok(())
        }
        Err(why) => Err(Fail(
            format!(
                "kube-vip still uses super-admin.conf: {} ({why})",
                admin.display()
            ),
            1,
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `init` prints for the other nodes, line for line, with and without the CA hashes.
    #[test]
    fn join_instructions_name_the_token_key_and_hashes() {
        let with = join_instructions(
            "abcdef.0123456789abcdef",
            "KEY",
            &["sha256:aa".to_owned(), "sha256:bb".to_owned()],
            Path::new("/etc/kubernetes/pki/ca.crt"),
        );
        let hashes = " --ca-cert-hash sha256:aa --ca-cert-hash sha256:bb";
        assert_eq!(
            with,
            format!(
                "\nThe control plane is initialised. On each other control-plane node run:\n\
                 \n  joinCPKubeadm abcdef.0123456789abcdef KEY{hashes}\n\
                 \n(that is: ginxctl kubeadm join abcdef.0123456789abcdef KEY{hashes})\n\
                 and on workers: ginxctl kubeadm join abcdef.0123456789abcdef --worker{hashes}\n\
                 The certificate key works for two hours (uploaded certificates), the token for 24.\n"
            )
        );
        let without = join_instructions("t", "k", &[], Path::new("/ca.crt"));
        assert!(without.contains("  joinCPKubeadm t k\n"), "{without}");
        assert!(
            without.ends_with(
                "No CA at /ca.crt: add --ca-cert-hash sha256:… from kubeadm's output.\n"
            ),
            "{without}"
        );
    }
}
