//! A plan before the merge. `ginxctl plan REF` asks every node, with the operator's
//! credentials, through a plan request in the fleet's ConfigMap, waits for their answers on
//! their heartbeat Leases, and prints the fleet's table. `ginx plan --revision REF` does the
//! same on this node alone, without Kubernetes.

use std::io::{IsTerminal, Write};
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use serde::Serialize;

use super::operator::{ADMIN_CONF, credentials, operator_name};
use super::render::terminal_safe;
use crate::config::{self, Config};
use crate::rollout::fleet::plan_requests::{answers_of, ask};
use crate::types::{PlanRequest, PreviewAnswer, PreviewOutcome, signed_size};

/// How often `ginxctl plan` looks at the heartbeats while it waits.
const LOOK_EVERY: Duration = Duration::from_secs(1);

/// `ginx plan --revision REF`: this node's plan of a ref, computed here.
pub fn local(config_path: &Path, reference: &str, json: bool) -> ExitCode {
    let cfg = match config::load(config_path) {
        Ok(l) => l.config,
        Err(e) => {
            eprintln!("ginx: {}", terminal_safe(&e.to_string()));
            return ExitCode::from(2);
        }
    };
    let rt = match super::runtime() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let answer = rt.block_on(crate::preview::plan_ref(&Arc::new(cfg), "local", reference));
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&answer).unwrap_or_default()
        );
    } else {
        print!("{}", terminal_safe(&one(&answer)));
    }
    exit_of(std::iter::once(Some(&answer)))
}

/// One node's answer in words, as `ginx plan` prints it.
pub fn one(a: &PreviewAnswer) -> String {
    let revision = a.revision.as_ref().map_or("-", |r| r.short());
    let mut out = format!("plan of {} ({revision}): {}\n", a.reference, a.summary());
    for p in &a.packages {
        out.push_str(&format!("  {p}\n"));
    }
    if a.more_packages > 0 {
        out.push_str(&format!("  and {} more packages\n", a.more_packages));
    }
    if let Some(s) = a.estimate_secs {
        out.push_str(&format!("estimate: {s} s ({})\n", a.estimate_of));
    } else if !a.estimate_of.is_empty() {
        out.push_str(&format!("{}\n", a.estimate_of));
    }
    out.push_str(&format!(
        "answered in {:.1} s; nothing was activated\n",
        a.took_ms as f64 / 1000.0
    ));
    out
}

/// 0 when every node answered with a plan, 1 when one did not (a failed build, a refused
/// commit) or did not answer.
fn exit_of<'a>(answers: impl IntoIterator<Item = Option<&'a PreviewAnswer>>) -> ExitCode {
    let all = answers
        .into_iter()
        .all(|a| a.is_some_and(|a| a.outcome == PreviewOutcome::Planned));
    if all {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

/// The fleet's answers to one request, as `ginxctl plan --json` prints them.
#[derive(Debug, Serialize)]
pub struct FleetPlan {
    pub request: String,
    #[serde(rename = "ref")]
    pub reference: String,
    /// The request stood already (asked within the hour): its answers served.
    pub reused: bool,
    /// Every live node answered.
    pub complete: bool,
    /// Node → its answer (`null`: none yet).
    pub nodes: std::collections::BTreeMap<String, Option<PreviewAnswer>>,
}

/// What `ginxctl plan` asks for.
pub struct Asked<'a> {
    pub reference: &'a str,
    /// Only these rollout groups' nodes (empty: all).
    pub groups: Vec<String>,
    pub json: bool,
}

/// `ginxctl plan REF`: ask, wait up to `timeout`, print the table (or JSON).
pub fn fleet(
    config_path: &Path,
    kubeconfig: Option<&Path>,
    asked: Asked<'_>,
    timeout: Duration,
) -> ExitCode {
    let Asked {
        reference,
        groups,
        json,
    } = asked;
    let checked = crate::types::preview::check_reference(reference)
        .and_then(|()| crate::types::preview::check_groups(&groups));
    if let Err(e) = checked {
        eprintln!("ginxctl: {}", terminal_safe(&e.0));
        return ExitCode::from(2);
    }
    let cfg = match config::peek_cluster(config_path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("ginxctl: {}", terminal_safe(&e.to_string()));
            return ExitCode::from(2);
        }
    };
    let env = std::env::var("KUBECONFIG").ok();
    let creds = match credentials(kubeconfig, env.as_deref(), Path::new(ADMIN_CONF), &cfg) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("ginxctl: {}", terminal_safe(&e.0));
            return ExitCode::from(2);
        }
    };
    let rt = match super::runtime() {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    match rt.block_on(ask_and_wait(
        &cfg,
        &creds.path,
        (reference, groups),
        timeout,
    )) {
        Ok(plan) => {
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&plan).unwrap_or_default()
                );
            } else {
                print!("{}", terminal_safe(&table(&plan)));
            }
            exit_of(plan.nodes.values().map(Option::as_ref))
        }
        Err((code, e)) => {
            eprintln!("ginxctl: {}", terminal_safe(&e));
            ExitCode::from(code)
        }
    }
}

/// Writes the request (or finds it standing) and waits for every live node's answer.
async fn ask_and_wait(
    cfg: &Config,
    kubeconfig: &Path,
    (reference, groups): (&str, Vec<String>),
    timeout: Duration,
) -> Result<FleetPlan, (u8, String)> {
    let k = &cfg.kubernetes;
    let kc = crate::kube::client_config(kubeconfig, None, k.request_timeout.get())
        .await
        .map_err(|e| (2, e))?;
    let client = kube::Client::try_from(kc).map_err(|e| {
        let what = crate::k8s::describe(&e);
        (2, format!("kubeconfig {}: {what}", kubeconfig.display()))
    })?;
    let by = operator_name(&client).await;
    let cms = kube::Api::<ConfigMap>::namespaced(client.clone(), &k.namespace);
    let request = PlanRequest {
        reference: reference.to_owned(),
        by,
        at: jiff::Timestamp::now(),
        groups,
    };
    let (id, reused) = ask(&cms, &k.namespace, &cfg.rollout.configmap, &request)
        .await
        .map_err(|e| (1, e.to_string()))?;
    let leases = kube::Api::<Lease>::namespaced(client, &k.namespace);
    let stale = i64::from(
        k.lease_duration
            .get()
            .as_secs()
            .try_into()
            .unwrap_or(i32::MAX),
    ) * 3;
    let started = Instant::now();
    let terminal = std::io::stderr().is_terminal();
    loop {
        let list = leases.list(&Default::default()).await.map_err(|e| {
            (
                1,
                format!(
                    "listing the heartbeat Leases in {}: {}",
                    k.namespace,
                    crate::k8s::describe(&e)
                ),
            )
        })?;
        let nodes = answers_of(&list.items, &k.lease_name, (&id, &request), stale);
        let waiting: Vec<&String> = nodes
            .iter()
            .filter(|(_, a)| a.is_none())
            .map(|(n, _)| n)
            .collect();
        if waiting.is_empty() || started.elapsed() >= timeout {
            if terminal {
                eprint!("\r\x1b[K");
            }
            return Ok(FleetPlan {
                request: id,
                reference: reference.to_owned(),
                reused,
                complete: waiting.is_empty(),
                nodes,
            });
        }
        if terminal {
            let names: Vec<&str> = waiting.iter().take(5).map(|s| s.as_str()).collect();
            eprint!(
                "\r\x1b[Kplan of {reference}: {} of {} nodes answered; waiting for {}{} ({} s)",
                nodes.len() - waiting.len(),
                nodes.len(),
                names.join(", "),
                if waiting.len() > 5 { ", …" } else { "" },
                started.elapsed().as_secs()
            );
            let _ = std::io::stderr().flush();
        }
        tokio::time::sleep(LOOK_EVERY).await;
    }
}

/// The fleet's table: per node, the revision, the action, what calls for it, the closure's
/// change and the estimate; a node that did not answer, or whose build failed, says so.
pub fn table(plan: &FleetPlan) -> String {
    let answered = plan.nodes.values().filter(|a| a.is_some()).count();
    let mut out = format!(
        "plan of {} (request {}{}): {answered} of {} nodes answered; nothing is activated\n",
        plan.reference,
        plan.request,
        if plan.reused {
            ", asked before: its answers"
        } else {
            ""
        },
        plan.nodes.len()
    );
    let mut rows = vec![[
        "NODE".to_owned(),
        "REVISION".to_owned(),
        "ACTION".to_owned(),
        "CLOSURE".to_owned(),
        "ESTIMATE".to_owned(),
        "WHY".to_owned(),
    ]];
    for (node, a) in &plan.nodes {
        rows.push(row(node, a.as_ref()));
    }
    let widths: Vec<usize> = (0..5)
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    for r in &rows {
        let mut line = String::new();
        for (i, w) in widths.iter().enumerate() {
            line.push_str(&format!("{:<w$}  ", r[i], w = *w));
        }
        line.push_str(&r[5]);
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn row(node: &str, a: Option<&PreviewAnswer>) -> [String; 6] {
    let Some(a) = a else {
        return [
            node.to_owned(),
            "-".into(),
            "-".into(),
            "-".into(),
            "-".into(),
            "no answer yet".into(),
        ];
    };
    let revision = a.revision.as_ref().map_or("-", |r| r.short()).to_owned();
    let Some(p) = a
        .plan
        .as_ref()
        .filter(|_| a.outcome == PreviewOutcome::Planned)
    else {
        let why = format!(
            "{}: {}",
            a.outcome.label(),
            a.error.as_deref().unwrap_or("-")
        );
        return [
            node.to_owned(),
            revision,
            "-".into(),
            "-".into(),
            "-".into(),
            why,
        ];
    };
    let why = if let Some(u) = &p.unknown {
        format!("the plan is unknown: {u}")
    } else if p.because.is_empty() {
        "nothing interrupted".to_owned()
    } else {
        let more = if p.more > 0 {
            format!(" and {} more", p.more)
        } else {
            String::new()
        };
        format!("{}{more}", p.because.join(", "))
    };
    let estimate = match (a.estimate_secs, a.estimate_lower) {
        (Some(s), true) => format!("≥ {s} s"),
        (Some(s), false) => format!("{s} s"),
        (None, _) => "-".to_owned(),
    };
    [
        node.to_owned(),
        revision,
        p.action.label().to_owned(),
        p.added_bytes.map_or_else(|| "-".to_owned(), signed_size),
        estimate,
        why,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{Disruption, PlanMark, Revision};

    fn answer(outcome: PreviewOutcome) -> PreviewAnswer {
        let revision: Revision = "ab".repeat(20).parse().unwrap();
        PreviewAnswer {
            id: "r1".into(),
            reference: "kernel".into(),
            plan: (outcome == PreviewOutcome::Planned).then(|| {
                PlanMark::new(
                    &revision,
                    Disruption::Drain,
                    &["restarts containerd.service".to_owned()],
                    Some(4 * 1024 * 1024),
                    None,
                )
            }),
            revision: Some(revision),
            outcome,
            packages: vec!["containerd: 1.7 → 2.0".into()],
            more_packages: 0,
            error: (outcome != PreviewOutcome::Planned)
                .then(|| "the build exited with 1: boom".into()),
            estimate_secs: Some(75),
            estimate_of: "build 3 s + … (a lower bound)".into(),
            estimate_lower: true,
            took_ms: 3200,
            at: jiff::Timestamp::UNIX_EPOCH,
        }
    }

    #[test]
    fn the_table_has_a_row_per_node_with_what_it_will_do_or_why_not() {
        let plan = FleetPlan {
            request: "r1".into(),
            reference: "kernel".into(),
            reused: false,
            complete: false,
            nodes: [
                ("a".to_owned(), Some(answer(PreviewOutcome::Planned))),
                ("b".to_owned(), Some(answer(PreviewOutcome::BuildFailed))),
                ("c".to_owned(), None),
            ]
            .into_iter()
            .collect(),
        };
        let t = table(&plan);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(
            lines[0],
            "plan of kernel (request r1): 2 of 3 nodes answered; nothing is activated"
        );
        assert_eq!(
            lines[1].split_whitespace().collect::<Vec<_>>(),
            ["NODE", "REVISION", "ACTION", "CLOSURE", "ESTIMATE", "WHY"]
        );
        assert!(
            lines[2].starts_with(
                "a     abababababab  drain   +4.0 MiB  ≥ 75 s    restarts containerd.service"
            ),
            "{t}"
        );
        assert!(
            lines[3].ends_with("build failed: the build exited with 1: boom"),
            "{t}"
        );
        assert!(lines[4].ends_with("no answer yet"), "{t}");
        let one = one(&answer(PreviewOutcome::Planned));
        assert!(one.starts_with("plan of kernel (abababababab): drain: restarts containerd.service; +4.0 MiB\n  containerd: 1.7 → 2.0\nestimate: 75 s"), "{one}");
    }
}
