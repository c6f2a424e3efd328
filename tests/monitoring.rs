//! The monitoring packaging: the alert rules pass `promtool check rules`
//! and their unit tests (`promtool test rules`, Debian's prometheus package); the
//! PrometheusRule is the same groups; every query of the Grafana dashboard parses (promtool
//! parses it as a recording rule's expression); and the rules and the dashboard name only
//! metrics a live ginx serves (its real `/metrics`).

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use serde_json::Value;

use crate::packaging::{read, repo};
use crate::support::{self, Env};

fn promtool(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?}:\n{text}");
    text
}

/// The dashboard's queries, Grafana's variables given values promtool takes.
fn dashboard_queries() -> Vec<(String, String)> {
    let dash: Value = serde_json::from_str(&read("packaging/grafana/ginx.json")).unwrap();
    let mut out = Vec::new();
    for p in dash["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().into_iter().flatten() {
            let expr = t["expr"]
                .as_str()
                .unwrap()
                .replace("$__rate_interval", "5m")
                .replace("$group", ".*");
            out.push((p["title"].as_str().unwrap().to_owned(), expr));
        }
    }
    for v in dash["templating"]["list"].as_array().unwrap() {
        if let Some(q) = v["definition"].as_str()
            && let Some(inner) = q
                .strip_prefix("label_values(")
                .and_then(|q| q.strip_suffix(')'))
        {
            // label_values(METRIC, LABEL): the metric as a selector.
            out.push((
                format!("variable {}", v["name"]),
                inner.split(',').next().unwrap().trim().to_owned(),
            ));
        }
    }
    out
}

/// `ginx_…` metric names in `text` (a histogram's series named by their family).
fn metric_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    while let Some(at) = text[i..].find("ginx_") {
        let start = i + at;
        let before = start.checked_sub(1).map(|b| bytes[b]);
        let mut end = start;
        while end < bytes.len() && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_') {
            end += 1;
        }
        if !before.is_some_and(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.') {
            names.insert(text[start..end].to_owned());
        }
        i = end;
    }
    names
}

#[test]
fn the_alert_rules_check_and_pass_their_unit_tests_and_the_prometheusrule_is_the_same() {
    let rules = read("packaging/prometheus/ginx.rules.yaml");
    let operator = read("packaging/prometheus/ginx.prometheusrule.yaml");
    let groups = &rules[rules.find("groups:").unwrap()..];
    let spec = &operator[operator.find("\nspec:\n").unwrap() + "\nspec:\n".len()..];
    let unindented: String = spec
        .lines()
        .map(|l| l.strip_prefix("  ").unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n");
    assert_eq!(
        unindented.trim_end(),
        groups.trim_end(),
        "ginx.prometheusrule.yaml's spec is not ginx.rules.yaml's groups"
    );
    for alert in [
        "GinxApplyFailing",
        "GinxRevisionHalted",
        "GinxRolloutSlotHeldTooLong",
        "GinxRolloutWaitingTooLong",
        "GinxEtcdGuardWaiting",
        "GinxRollbackUnhealthy",
        "GinxSourceUnreachable",
        "GinxDrift",
        "GinxRebootRequiredTooLong",
        "GinxHeartbeatMissing",
        "GinxDown",
    ] {
        assert!(rules.contains(&format!("alert: {alert}\n")), "{alert}");
    }
    if !support::require("promtool") {
        return;
    }
    let dir = repo().join("packaging/prometheus");
    let checked = promtool(&dir, &["check", "rules", "ginx.rules.yaml"]);
    assert!(checked.contains("SUCCESS: 11 rules found"), "{checked}");
    let tested = promtool(&dir, &["test", "rules", "ginx.rules.test.yaml"]);
    assert!(tested.contains("SUCCESS"), "{tested}");
}

#[test]
fn every_dashboard_query_parses_and_every_metric_named_is_served_by_a_live_ginx() {
    let queries = dashboard_queries();
    assert!(queries.len() >= 20, "{} queries", queries.len());
    let dash = read("packaging/grafana/ginx.json");
    let rules = read("packaging/prometheus/ginx.rules.yaml");

    // A live ginx's exposition (a family shows once it has a series).
    let env = Env::new();
    env.dropin("60-metrics.toml", "[metrics]\nlisten = \"127.0.0.1:0\"\n");
    let d = env.start();
    // An apply and its gate: the families of outcomes have a series once something happened.
    let head = env.repo.head();
    d.ctl_ok(&["sync"]);
    d.wait_applied(&head);
    let s = d.wait_status("the gate passed", |s| {
        s["rollout"]["passed_revision"] == head.as_str()
    });
    let exposition = crate::kubernetes::scrape(s["metrics_listen"].as_str().unwrap());
    let served: BTreeSet<String> = exposition
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let (name, kind) = (w.next()?, w.next()?);
            Some(match kind {
                "counter" => vec![format!("{name}_total")],
                "histogram" => ["_bucket", "_sum", "_count"]
                    .iter()
                    .map(|s| format!("{name}{s}"))
                    .collect(),
                "info" => vec![format!("{name}_info")],
                _ => vec![name.to_owned()],
            })
        })
        .flatten()
        .collect();
    for (what, text) in [("the dashboard", &dash), ("the alert rules", &rules)] {
        let named = metric_names(text);
        assert!(named.len() > 5, "{what}: {named:?}");
        let unknown: Vec<_> = named.difference(&served).collect();
        assert!(
            unknown.is_empty(),
            "{what} names metrics ginx does not serve: {unknown:?}\nserved: {served:?}"
        );
    }

    if !support::require("promtool") {
        return;
    }
    // Each query as a recording rule's expression: promtool parses every one.
    let dir = tempfile::tempdir().unwrap();
    let mut file = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, (_, q)) in queries.iter().enumerate() {
        file.push_str(&format!(
            "      - record: ginx_dashboard:query{i}\n        expr: {}\n",
            serde_json::to_string(q).unwrap()
        ));
    }
    std::fs::write(dir.path().join("dashboard.rules.yaml"), &file).unwrap();
    let checked = promtool(dir.path(), &["check", "rules", "dashboard.rules.yaml"]);
    assert!(
        checked.contains(&format!("SUCCESS: {} rules found", queries.len())),
        "{checked}"
    );
}
