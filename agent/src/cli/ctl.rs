//! `ginxctl`: each command is one request over the control socket.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use super::render;
use crate::config::{self, DEFAULT_CONFIG_PATH, Duration};
use crate::control::client::{Client, ClientError};
use crate::control::protocol::{
    AcceptReport, Command, FleetReport, HistoryReport, RollbackReport, SuspendReport, SyncReport,
};
use crate::status::Status;
use crate::types::Invalid;

/// Talk to the ginx daemon on this node.
#[derive(Debug, Parser)]
#[command(name = "ginxctl", version = crate::version(), long_about = None)]
pub struct CtlArgs {
    /// The control socket [default: `socket` from the configuration, else /run/ginx/ginx.sock].
    #[arg(long, global = true, env = "GINX_SOCKET")]
    pub socket: Option<PathBuf>,
    /// The configuration file: where the socket is (and, for `kubeadm`, the cluster facts).
    #[arg(long, global = true, default_value = DEFAULT_CONFIG_PATH, env = "GINX_CONFIG")]
    pub config: PathBuf,
    /// How long to wait for an answer (a sync waits for the fetch).
    #[arg(long, global = true, default_value = "10m")]
    pub timeout: Duration,
    #[command(subcommand)]
    pub command: CtlCommand,
}

#[derive(Debug, Subcommand)]
pub enum CtlCommand {
    /// Show sources, the apply state and health.
    Status {
        /// Print the status as JSON (a stable contract).
        #[arg(long)]
        json: bool,
    },
    /// Show every health probe with its message, since when and when it last ran.
    Health {
        /// Print `{overall, probes}` as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Fetch now (one source, or all), then apply a new revision; retries a failed one at once.
    Sync {
        /// The source to fetch; all when omitted.
        source: Option<String>,
    },
    /// Stop applying new revisions (sources keep fetching); survives restarts.
    Suspend,
    /// Apply again after `suspend`.
    Resume,
    /// After a deliberate history rewrite (force push), make REVISION the commit new heads of
    /// SOURCE must descend from.
    Accept {
        source: String,
        /// A commit id (full, or an unambiguous prefix) present in the clone.
        revision: String,
    },
    /// Try the wanted revision again now: forgets failures, a give-up and a rollback.
    Retry,
    /// Switch to the previous system generation (recorded as an attempt); the current revision
    /// is not applied again until a new one arrives or `ginxctl retry`.
    Rollback,
    /// The rollout through the whole fleet: pause it, resume it, clear a halted revision.
    #[command(subcommand)]
    Rollout(RolloutCommand),
    /// Keep nodes out of rollouts (a failing disk, a customer's demo): a held node starts no
    /// apply and no reboot (a slot it holds finishes what it started) until `ginxctl release`
    /// or --until. Written in the fleet's ConfigMap with your credentials (an operator's act;
    /// a node's own identity is refused), so it works from a workstation.
    Hold {
        /// The nodes to hold (Kubernetes node names).
        #[arg(required = true)]
        nodes: Vec<String>,
        /// Why, shown in status, the cluster view, the Event and the notification.
        #[arg(long, default_value = "")]
        reason: String,
        /// Lift it by itself then: RFC 3339 (2026-12-01T18:00:00Z), a local time
        /// ("2026-12-01 18:00") or a duration from now ("8h") [default: until `ginxctl release`].
        #[arg(long)]
        until: Option<String>,
        /// Hold a name no Node has (yet).
        #[arg(long)]
        force: bool,
        /// Your kubeconfig [default: KUBECONFIG, else /etc/kubernetes/admin.conf].
        #[arg(long)]
        kubeconfig: Option<PathBuf>,
    },
    /// Lift the holds of nodes (`ginxctl hold`): an operator's act, with your credentials.
    Release {
        /// The nodes to let go.
        #[arg(required = true)]
        nodes: Vec<String>,
        /// Your kubeconfig [default: KUBECONFIG, else /etc/kubernetes/admin.conf].
        #[arg(long)]
        kubeconfig: Option<PathBuf>,
    },
    /// Plan a branch, a tag or a commit that is not deployed on every node, activating
    /// nothing: written as a plan request in the fleet's ConfigMap with your credentials
    /// (an operator's act), answered by each node on its heartbeat; waits up to --timeout and
    /// prints per node the action, what calls for it, the closure's change and an estimate.
    Plan {
        /// A branch, a tag or a commit id of the apply source.
        reference: String,
        /// Print the answers as JSON.
        #[arg(long)]
        json: bool,
        /// Ask only the nodes of this rollout group (repeat for more) [default: every node].
        #[arg(long = "group")]
        groups: Vec<String>,
        /// Your kubeconfig [default: KUBECONFIG, else /etc/kubernetes/admin.conf].
        #[arg(long)]
        kubeconfig: Option<PathBuf>,
    },
    /// Show the fleet from the API: each node's role, readiness, health, revisions, apply state
    /// and rollout phase, heartbeat and slot; each revision's progress, halted revisions, the
    /// pause, who waits. Asks this node's daemon, or with --kubeconfig reads the API itself
    /// (no daemon, no root: from a workstation).
    Cluster {
        /// Print the view as JSON.
        #[arg(long)]
        json: bool,
        /// Read the API with these credentials instead of asking the daemon (as `kubectl-ginx`:
        /// KUBECONFIG, else ~/.kube/config). Needs list on nodes, list on Leases and get on the
        /// ConfigMap ginx-rollout in ginx-system (ClusterRole ginx-fleet-viewer).
        #[arg(long)]
        kubeconfig: Option<PathBuf>,
        /// The kubeconfig's context [default: its current one].
        #[arg(long, requires = "kubeconfig")]
        context: Option<String>,
        /// Redraw as the rollout moves, until Ctrl-C (not on a terminal: each changed view).
        #[arg(long, short = 'w')]
        watch: bool,
        /// How often --watch looks.
        #[arg(long, default_value = "2s", requires = "watch")]
        interval: Duration,
    },
    /// Apply the `[bootstrap]` stages to the cluster in order (CNI, Flux, …), each waited for.
    Bootstrap {
        /// The API's server-side dry run: nothing is written or waited for.
        #[arg(long)]
        dry_run: bool,
        /// Only this stage.
        #[arg(long)]
        stage: Option<String>,
    },
    /// kubeadm and kube-vip: render the documents, initialise or join the cluster.
    #[command(subcommand)]
    Kubeadm(super::run_kubeadm::KubeadmCommand),
    /// Show past apply attempts, newest first.
    History {
        /// Print the attempts as JSON (with their output tails).
        #[arg(long)]
        json: bool,
        /// Show at most this many attempts (1 or more).
        #[arg(long, short = 'n', value_parser = parse_limit)]
        limit: Option<usize>,
        /// Also print each attempt's last output lines.
        #[arg(long)]
        output: bool,
    },
}

/// `ginxctl rollout …`: fleet-wide, through the `ginx-rollout` ConfigMap (needs this node's
/// ginx connected to the cluster).
#[derive(Debug, Subcommand)]
pub enum RolloutCommand {
    /// No node starts applying a new revision until `ginxctl rollout resume` (applies under way
    /// finish).
    Pause,
    /// Lift the fleet-wide pause: an operator's act, with your own credentials (not the
    /// node's), so the daemon is not asked.
    Resume {
        /// Your kubeconfig [default: KUBECONFIG, else /etc/kubernetes/admin.conf].
        #[arg(long)]
        kubeconfig: Option<PathBuf>,
    },
    /// Let nodes apply REVISION again after it was halted: an operator's act, with your own
    /// credentials (not the node's).
    Clear {
        /// The halted revision: the full commit id, or a unique prefix of at least 7 hex
        /// digits.
        revision: String,
        /// Your kubeconfig [default: KUBECONFIG, else /etc/kubernetes/admin.conf].
        #[arg(long)]
        kubeconfig: Option<PathBuf>,
    },
}

/// `ginxctl hold|release`: what to do, with which kubeconfig.
fn hold_or_release(
    command: &CtlCommand,
) -> Option<(super::operator::Act, Option<&std::path::Path>)> {
    use super::operator::Act;
    match command {
        CtlCommand::Hold {
            nodes,
            reason,
            until,
            force,
            kubeconfig,
        } => Some((
            Act::Hold {
                nodes: nodes.clone(),
                reason: reason.clone(),
                until: until.clone(),
                force: *force,
            },
            kubeconfig.as_deref(),
        )),
        CtlCommand::Release { nodes, kubeconfig } => {
            Some((Act::Release(nodes.clone()), kubeconfig.as_deref()))
        }
        _ => None,
    }
}

pub fn main(args: CtlArgs) -> ExitCode {
    let socket = match args.socket.clone() {
        Some(s) => s,
        None => config_socket(&args.config),
    };
    if args.timeout.is_zero() {
        eprintln!("ginxctl: --timeout must be longer than 0s");
        return ExitCode::from(2);
    }
    if let CtlCommand::Rollout(
        RolloutCommand::Resume { kubeconfig } | RolloutCommand::Clear { kubeconfig, .. },
    ) = &args.command
    {
        let lift = match &args.command {
            CtlCommand::Rollout(RolloutCommand::Clear { revision, .. }) => {
                super::operator::Act::Clear(revision.clone())
            }
            _ => super::operator::Act::Resume,
        };
        return super::operator::main(
            &args.config,
            kubeconfig.as_deref(),
            args.timeout.get(),
            lift,
        );
    }
    if let Some((lift, kubeconfig)) = hold_or_release(&args.command) {
        return super::operator::main(&args.config, kubeconfig, args.timeout.get(), lift);
    }
    if let CtlCommand::Plan {
        reference,
        json,
        groups,
        kubeconfig,
    } = &args.command
    {
        let asked = super::plan::Asked {
            reference,
            groups: groups.clone(),
            json: *json,
        };
        return super::plan::fleet(
            &args.config,
            kubeconfig.as_deref(),
            asked,
            args.timeout.get(),
        );
    }
    let client = Client::new(&socket, args.timeout.get());
    if let CtlCommand::Kubeadm(cmd) = args.command {
        return super::run_kubeadm::main(&args.config, &client, cmd);
    }
    if let CtlCommand::Cluster {
        json,
        kubeconfig,
        context,
        watch,
        interval,
    } = args.command
    {
        if interval.get() < std::time::Duration::from_millis(200)
            || interval.get() > std::time::Duration::from_secs(3600)
        {
            eprintln!("ginxctl: --interval must be between 200ms and 1h, not {interval}");
            return ExitCode::from(2);
        }
        return super::fleet::main(
            &args.config,
            &client,
            args.timeout.get(),
            super::fleet::Options {
                json,
                kubeconfig,
                context,
                watch: watch.then(|| interval.get()),
            },
        );
    }
    if let CtlCommand::Bootstrap { dry_run, stage } = args.command {
        return super::run_bootstrap::main(&args.config, &client, dry_run, stage);
    }
    match run(&client, args.command) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("ginxctl: {}", render::terminal_safe(&e.to_string()));
            ExitCode::from(e.exit_code())
        }
    }
}

/// The socket the configuration names, else the default; a configuration that cannot be read
/// is said, with the socket used instead (it may not be the daemon's).
fn config_socket(config: &std::path::Path) -> PathBuf {
    let default = config::Config::default().socket;
    match config::peek_socket(config) {
        Ok(s) => s.unwrap_or(default),
        Err(e) => {
            eprintln!(
                "ginxctl: warning: {}; using the socket {} instead (pass --socket to choose)",
                render::terminal_safe(&e.to_string()),
                default.display()
            );
            default
        }
    }
}

fn run(client: &Client, command: CtlCommand) -> Result<ExitCode, ClientError> {
    let mut out = std::io::stdout().lock();
    let mut print = |s: String| {
        // A closed pipe (`ginxctl status | head`) is not an error.
        let _ = out.write_all(render::terminal_safe(&s).as_bytes());
    };
    match command {
        CtlCommand::Status { json } => {
            if json {
                let v = client.call_raw(Command::Status)?;
                print(render::pretty(&v));
            } else {
                let s: Status = client.call(Command::Status)?;
                print(render::status(&s));
            }
        }
        CtlCommand::Health { json } => {
            let s: Status = client.call(Command::Status)?;
            if json {
                let v = serde_json::json!({"overall": s.health_overall, "probes": s.health});
                print(render::pretty(&v));
            } else {
                print(render::health(&s));
            }
        }
        CtlCommand::Sync { source } => {
            let r: SyncReport = client.call(Command::Sync { source })?;
            print(render::sync(&r));
            if r.sources.iter().any(|s| s.error.is_some()) {
                return Ok(ExitCode::from(1));
            }
        }
        CtlCommand::Suspend => {
            let r: SuspendReport = client.call(Command::Suspend)?;
            print(if r.changed {
                "suspended: sources keep fetching, nothing is applied until `ginxctl resume`\n"
                    .into()
            } else {
                "already suspended\n".into()
            });
        }
        CtlCommand::Resume => {
            let r: SuspendReport = client.call(Command::Resume)?;
            print(if r.changed {
                "resumed\n".into()
            } else {
                "was not suspended\n".into()
            });
        }
        CtlCommand::Kubeadm(_) | CtlCommand::Bootstrap { .. } => unreachable!("handled before"),
        CtlCommand::Rollout(RolloutCommand::Pause) => {
            let r: FleetReport = client.call(Command::RolloutPause)?;
            print(render::paused(&r));
        }
        CtlCommand::Rollout(RolloutCommand::Resume { .. } | RolloutCommand::Clear { .. }) => {
            unreachable!("handled before")
        }
        CtlCommand::Cluster { .. }
        | CtlCommand::Plan { .. }
        | CtlCommand::Hold { .. }
        | CtlCommand::Release { .. } => unreachable!("handled before"),
        CtlCommand::Retry => {
            client.call_raw(Command::Retry)?;
            print("retrying the wanted revision now\n".into());
        }
        CtlCommand::Rollback => {
            let r: RollbackReport = client.call(Command::Rollback)?;
            print(format!(
                "rolling back to the previous generation (attempt {}); follow it with `ginxctl history`\n",
                r.attempt
            ));
        }
        CtlCommand::Accept { source, revision } => {
            let r: AcceptReport = client.call(Command::Accept { source, revision })?;
            print(render::accept(&r));
            if r.outcome.error.is_some() {
                return Ok(ExitCode::from(1));
            }
        }
        CtlCommand::History {
            json,
            limit,
            output,
        } => {
            if json {
                let v = client.call_raw(Command::History { limit })?;
                print(render::pretty(&v));
            } else {
                let h: HistoryReport = client.call(Command::History { limit })?;
                print(render::history(&h, output));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `-n 0` would ask for nothing and then say there is no history; refuse it instead.
fn parse_limit(s: &str) -> Result<usize, Invalid> {
    match s.parse::<usize>() {
        Ok(0) => Err("0 asks for no attempts; give 1 or more, or leave -n out for all".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(Invalid(format!(
            "{e}; give a number of attempts, 1 or more"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[test]
    fn history_n_0_is_refused_rather_than_answered_with_no_attempts_yet() {
        let e = CtlArgs::try_parse_from(["ginxctl", "history", "-n", "0"]).unwrap_err();
        assert!(e.to_string().contains("0 asks for no attempts"), "{e}");
        let ok = CtlArgs::try_parse_from(["ginxctl", "history", "-n", "3"]).unwrap();
        assert!(matches!(
            ok.command,
            CtlCommand::History { limit: Some(3), .. }
        ));
    }

    #[test]
    fn hold_and_release_parse_and_need_a_node() {
        let a = CtlArgs::try_parse_from([
            "ginxctl", "hold", "w2", "w3", "--reason", "disk", "--until", "8h",
        ])
        .unwrap();
        let Some((
            super::super::operator::Act::Hold {
                nodes,
                reason,
                until,
                force,
            },
            None,
        )) = hold_or_release(&a.command)
        else {
            panic!("{:?}", a.command);
        };
        assert_eq!(
            (nodes, reason, until, force),
            (
                vec!["w2".to_owned(), "w3".to_owned()],
                "disk".to_owned(),
                Some("8h".to_owned()),
                false
            )
        );
        let a =
            CtlArgs::try_parse_from(["ginxctl", "release", "w2", "--kubeconfig", "/k"]).unwrap();
        assert!(matches!(
            hold_or_release(&a.command),
            Some((super::super::operator::Act::Release(n), Some(k))) if n == ["w2"] && k == std::path::Path::new("/k")
        ));
        assert!(CtlArgs::try_parse_from(["ginxctl", "hold"]).is_err());
        assert!(CtlArgs::try_parse_from(["ginxctl", "release"]).is_err());
    }

    #[test]
    fn rollout_and_cluster_parse() {
        let a = CtlArgs::try_parse_from(["ginxctl", "rollout", "clear", "0123456"]).unwrap();
        assert!(matches!(
            a.command,
            CtlCommand::Rollout(RolloutCommand::Clear { revision, .. }) if revision == "0123456"
        ));
        assert!(CtlArgs::try_parse_from(["ginxctl", "rollout", "clear"]).is_err());
        let a = CtlArgs::try_parse_from(["ginxctl", "cluster", "--json"]).unwrap();
        assert!(matches!(
            a.command,
            CtlCommand::Cluster {
                json: true,
                watch: false,
                ..
            }
        ));
        let a = CtlArgs::try_parse_from([
            "ginxctl",
            "cluster",
            "--kubeconfig",
            "/home/ann/.kube/config",
            "--watch",
            "--interval",
            "5s",
        ])
        .unwrap();
        assert!(matches!(
            a.command,
            CtlCommand::Cluster {
                watch: true,
                kubeconfig: Some(_),
                ..
            }
        ));
        assert!(CtlArgs::try_parse_from(["ginxctl", "cluster", "--interval", "5s"]).is_err());
    }
}
