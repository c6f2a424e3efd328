//! Command-line front ends of the two binaries: argument definitions (also used to generate
//! completions and man pages) and what each command does.
//!
//! Layer 8: may import anything; nothing but the binaries imports it.

mod ctl;
mod fleet;
mod hold;
mod operator;
mod plan;
pub mod render;
mod run_bootstrap;
mod run_kubeadm;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::config::{self, DEFAULT_CONFIG_PATH};
use crate::types::RemoteUrl;

pub use ctl::{CtlArgs, CtlCommand};

/// ginx keeps this NixOS Kubernetes node in step with Git, safely.
#[derive(Debug, Parser)]
#[command(name = "ginx", version = crate::version(), long_about = None)]
pub struct GinxArgs {
    /// The configuration file; drop-ins are read from `config.d/*.toml` beside it.
    #[arg(long, short, global = true, default_value = DEFAULT_CONFIG_PATH, env = "GINX_CONFIG")]
    pub config: PathBuf,
    /// Print the built-in defaults as TOML and exit.
    #[arg(long)]
    pub print_default_config: bool,
    #[command(subcommand)]
    pub command: Option<GinxCommand>,
}

#[derive(Debug, Subcommand)]
pub enum GinxCommand {
    /// Run the daemon (the default).
    Run,
    /// Validate the configuration and print the effective result, secrets redacted.
    CheckConfig,
    /// Plan a branch, a tag or a commit of the apply source on this node without applying it:
    /// fetch, build, and print what its activation would stop, restart and reboot, the
    /// packages that change and an estimate. Needs no Kubernetes; nothing is activated.
    Plan {
        /// A branch, a tag or a commit id of the apply source.
        #[arg(long)]
        revision: String,
        /// Print the answer as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Internal: the wrapper an apply attempt runs in (started by ginx itself).
    #[command(hide = true)]
    RunAttempt {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long)]
        cwd: PathBuf,
        #[arg(long)]
        timeout: config::Duration,
        #[arg(long)]
        kill_grace: config::Duration,
        /// Written into result.json, so ginx takes only this runner's result.
        #[arg(long)]
        token: Option<String>,
        #[arg(last = true, required = true)]
        argv: Vec<String>,
    },
    /// Internal: closure mode's apply step (run by the runner): realise the store path from
    /// the substituters with signatures required, check it is a NixOS system, set the profile,
    /// switch; on a failed switch point the profile back.
    #[command(hide = true)]
    ApplyClosure(ApplyClosureArgs),
    /// Internal (packaging): write shell completions (bash, zsh, fish) and man pages of both
    /// binaries under DIR/completions and DIR/man.
    #[command(hide = true)]
    GenerateAssets {
        #[arg(long)]
        out: PathBuf,
    },
}

/// `ginx apply-closure`'s arguments (see `apply::closure`).
#[derive(Debug, clap::Args)]
pub struct ApplyClosureArgs {
    #[arg(long)]
    path: String,
    #[arg(long)]
    goal: crate::types::Goal,
    #[arg(long)]
    profile: PathBuf,
    #[arg(long)]
    gcroot: PathBuf,
    #[arg(long)]
    report: PathBuf,
    /// Where the path came from (JSON).
    #[arg(long)]
    origin: String,
    #[arg(long = "substituter", required = true)]
    substituters: Vec<String>,
    #[arg(long = "trusted-public-key", required = true)]
    trusted_public_keys: Vec<String>,
    #[arg(long)]
    realise_timeout: config::Duration,
    #[arg(long, default_value = "nix-store")]
    nix_store: PathBuf,
    #[arg(long, default_value = "nix-env")]
    nix_env: PathBuf,
    #[arg(long, default_value = "nix")]
    nix: PathBuf,
}

pub fn ginx_main() -> ExitCode {
    let args = GinxArgs::parse();
    if args.print_default_config {
        print!("{}", config::Config::default().to_toml());
        return ExitCode::SUCCESS;
    }
    match args.command.unwrap_or(GinxCommand::Run) {
        GinxCommand::CheckConfig => check_config(&args.config),
        GinxCommand::Plan { revision, json } => plan::local(&args.config, &revision, json),
        GinxCommand::RunAttempt {
            dir,
            cwd,
            timeout,
            kill_grace,
            token,
            argv,
        } => crate::apply::runner::run(crate::apply::runner::RunArgs {
            dir,
            cwd,
            timeout: timeout.get(),
            kill_grace: kill_grace.get(),
            token,
            argv,
        }),
        GinxCommand::ApplyClosure(a) => match serde_json::from_str(&a.origin) {
            Ok(origin) => crate::apply::closure::run(crate::apply::closure::Args {
                path: a.path,
                goal: a.goal,
                profile: a.profile,
                gcroot: a.gcroot,
                report: a.report,
                origin,
                substituters: a.substituters,
                trusted_public_keys: a.trusted_public_keys,
                realise_timeout: a.realise_timeout.get(),
                nix_store: a.nix_store,
                nix_env: a.nix_env,
                nix: a.nix,
            }),
            Err(e) => {
                eprintln!("ginx apply-closure: --origin is not an origin: {e}");
                ExitCode::from(1)
            }
        },
        GinxCommand::Run => run_daemon(args.config),
        GinxCommand::GenerateAssets { out } => match generate_assets(&out) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("ginx generate-assets: {}: {e}", out.display());
                ExitCode::FAILURE
            }
        },
    }
}

/// Completions and man pages from the argument definitions, so they never disagree with
/// `--help` (the Nix package installs them).
fn generate_assets(out: &std::path::Path) -> std::io::Result<()> {
    use clap::CommandFactory;
    use clap_complete::Shell;
    let completions = out.join("completions");
    let man = out.join("man");
    std::fs::create_dir_all(&completions)?;
    std::fs::create_dir_all(&man)?;
    for mut cmd in [GinxArgs::command(), CtlArgs::command()] {
        let name = cmd.get_name().to_owned();
        for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
            clap_complete::generate_to(shell, &mut cmd, &name, &completions)?;
        }
        cmd.build();
        man_pages(&cmd, &man)?;
    }
    Ok(())
}

/// A page for `cmd` and each visible subcommand (`ginxctl-kubeadm-join.1`), none for `help`.
fn man_pages(cmd: &clap::Command, dir: &std::path::Path) -> std::io::Result<()> {
    for sub in cmd.get_subcommands() {
        if !sub.is_hide_set() && sub.get_name() != "help" {
            man_pages(sub, dir)?;
        }
    }
    clap_mangen::Man::new(cmd.clone()).generate_to(dir)?;
    Ok(())
}

fn check_config(path: &std::path::Path) -> ExitCode {
    match config::load(path) {
        Ok(loaded) => {
            println!("# effective configuration, secrets redacted; read from:");
            for f in &loaded.files {
                println!("#   {}", f.display());
            }
            for (name, s) in &loaded.config.sources {
                if s.remotes().iter().any(RemoteUrl::has_inline_credentials) {
                    eprintln!(
                        "warning: sources.{name}.url carries credentials; anyone who can read the \
                         configuration can read them"
                    );
                }
            }
            print!("{}", loaded.config.to_toml());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(1)
        }
    }
}

fn run_daemon(config: PathBuf) -> ExitCode {
    crate::util::memory::tune();
    crate::logging::init();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .thread_name("ginx")
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("ginx: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let result = runtime.block_on(crate::daemon::run(config.clone()));
    // A fetch stuck on a blocking thread must not hold up the exit.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    match result {
        Ok(crate::daemon::Ending::Stopped) => ExitCode::SUCCESS,
        Ok(crate::daemon::Ending::Restart(r)) => restart(r.binary),
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("ginx: {e:#}");
            ExitCode::from(1)
        }
    }
}

/// Hands over to the new version of ginx: under systemd by exiting (the unit restarts with
/// its new definition), elsewhere by executing the new binary in this process.
fn restart(binary: Option<std::path::PathBuf>) -> ExitCode {
    if std::env::var_os("INVOCATION_ID").is_some() {
        return ExitCode::SUCCESS;
    }
    let binary = binary.or_else(|| std::env::current_exe().ok());
    let Some(binary) = binary else {
        eprintln!("ginx: cannot find the new binary to restart into");
        return ExitCode::from(1);
    };
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let err =
        std::os::unix::process::CommandExt::exec(std::process::Command::new(&binary).args(args));
    eprintln!("ginx: cannot execute {}: {err}", binary.display());
    ExitCode::from(1)
}

/// A runtime on this thread for a ginxctl command that talks to the API itself; or the exit
/// code, said.
fn runtime() -> Result<tokio::runtime::Runtime, ExitCode> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| {
            eprintln!("ginxctl: cannot start: {e}");
            ExitCode::from(1)
        })
}

pub fn ginxctl_main() -> ExitCode {
    // Installed (or linked) as `kubectl-ginx`, it is a kubectl plugin: `kubectl ginx cluster`
    // reads the API, and `kubectl ginx hold|release` writes holds, with kubectl's credentials.
    let plugin = std::env::args_os()
        .next()
        .and_then(|a| {
            std::path::Path::new(&a)
                .file_name()
                .map(|n| n == "kubectl-ginx")
        })
        .unwrap_or(false);
    if !plugin {
        return ctl::main(CtlArgs::parse());
    }
    use clap::{CommandFactory, FromArgMatches};
    let matches = CtlArgs::command()
        .name("kubectl-ginx")
        .bin_name("kubectl ginx")
        .get_matches();
    let mut args = match CtlArgs::from_arg_matches(&matches) {
        Ok(a) => a,
        Err(e) => e.exit(),
    };
    if let ctl::CtlCommand::Cluster { kubeconfig, .. }
    | ctl::CtlCommand::Hold { kubeconfig, .. }
    | ctl::CtlCommand::Release { kubeconfig, .. } = &mut args.command
        && kubeconfig.is_none()
    {
        *kubeconfig = fleet::kubectl_kubeconfig(
            std::env::var("KUBECONFIG").ok().as_deref(),
            std::env::var_os("HOME")
                .map(std::path::PathBuf::from)
                .as_deref(),
        );
    }
    ctl::main(args)
}
