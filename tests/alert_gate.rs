//! The alert gate (`[rollout.gate.prometheus]`) against Debian's real Prometheus
//! (tests/support/prometheus.rs): it scrapes an exporter the test controls every second, and a
//! real alerting rule, `TestBroken` (severity critical), fires while a flag file exists. The
//! default query, `ALERTS{alertstate="firing",severity="critical"}`, is what ginx asks.
//! Waits are on Prometheus' own view of what fires and on ginx's status, never a fixed sleep.

use std::path::Path;

use serde_json::Value;

use crate::support::control_plane::{self, ControlPlane, RbacGuard};
use crate::support::daemon::Daemon;
use crate::support::prometheus::{Exporter, Prometheus};
use crate::support::test_fleet::{NodeToml, use_cluster};
use crate::support::tls::TestCa;
use crate::support::{self, Env, wait_for};

/// Prometheus scraping its exporter, in `root`.
fn prometheus(root: &Path) -> Option<(Exporter, Prometheus)> {
    if !support::require("prometheus") {
        return None;
    }
    let exporter = Exporter::start(&root.join("flags"));
    let prom = Prometheus::start(&root.join("prometheus"), &exporter.addr);
    Some((exporter, prom))
}

/// The TOML of the alert gate on `url`, after a gate that settles in 8 s (longer than a scrape
/// and an evaluation, so an alert the activation causes is seen within it) and gives up at
/// 25 s; `gate_extra` adds to `[rollout.gate]`.
fn gate(url: &str, gate_extra: &str, prom_extra: &str) -> String {
    format!(
        "[rollout.gate]\nsettle = \"8s\"\ntimeout = \"25s\"\ninterval = \"500ms\"\n{gate_extra}\n\n\
         [rollout.gate.prometheus]\nurl = \"{url}\"\ntimeout = \"2s\"\n{prom_extra}\n"
    )
}

/// A worker of the shared control plane, alone in its group.
fn worker(cp: &ControlPlane, name: &str, gate_toml: &str) -> Env {
    let env = Env::new();
    use_cluster(&env, cp, name, "");
    NodeToml::new()
        .set("node.role", "worker")
        .set("metrics.listen", "127.0.0.1:0")
        .set("rollout.lock", "auto")
        .set("rollout.group", name)
        .set("rollout.lease_duration", "5s")
        .merge("", gate_toml)
        .write(&env, "80-rollout.toml");
    env
}

fn waiting_for(d: &Daemon, what: &str) -> Value {
    d.wait_status(&format!("waiting for {what}"), |s| {
        s["rollout"]["waiting_for"] == what
    })
}

#[test]
fn a_firing_critical_alert_holds_the_first_node_before_its_slot() {
    let Some(cp) = control_plane::shared() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let Some((exporter, prom)) = prometheus(tmp.path()) else {
        return;
    };
    std::fs::write(exporter.flag("before"), "").unwrap();
    prom.wait_firing(&["TestBroken{before}"]);
    let mut rbac = RbacGuard::new(cp);
    rbac.watch("ag-first");
    let env = worker(cp, "ag-first", &gate(&prom.url, "", ""));
    let d = env.start();
    let s = waiting_for(&d, "alerts");
    let reason = s["rollout"]["reason"].as_str().unwrap();
    assert_eq!(
        reason,
        "1 alert(s) fire (rollout.gate.prometheus.query): \
         TestBroken{cause=\"before\",instance=\"127.0.0.1:"
            .to_owned()
            + exporter.addr.rsplit(':').next().unwrap()
            + "\",job=\"test\",severity=\"critical\"}; nothing starts until none does",
        "{s:#}"
    );
    assert!(env.calls().is_empty(), "nothing activated");
    let lease = cp.lease("ginx-system", "ginx-rollout-ag-first-0");
    assert!(
        lease
            .as_ref()
            .is_none_or(|l| l["spec"]["holderIdentity"] != "ag-first"),
        "no slot taken while alerts fire: {lease:?}"
    );
    crate::kubernetes::assert_waiting_metric(&s, "alerts");
    // The alert resolves: the node goes on by itself.
    std::fs::remove_file(exporter.flag("before")).unwrap();
    prom.wait_firing(&[]);
    d.wait_applied(&env.repo.head());
}

#[test]
fn an_alert_fired_by_the_activation_fails_the_gate_rolls_back_and_halts() {
    let Some(cp) = control_plane::shared() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let Some((exporter, prom)) = prometheus(tmp.path()) else {
        return;
    };
    let mut rbac = RbacGuard::new(cp);
    rbac.watch("ag-breaks");
    let env = worker(cp, "ag-breaks", &gate(&prom.url, "", ""));
    // A fake system with generations, so that there is one to roll back to.
    env.fake_nix();
    env.dropin(
        "85-system.toml",
        "[system]\nrollback_command = [\"true\"]\nswitch_command = [\"true\"]\n",
    );
    let d = env.start();
    let first = env.repo.head();
    d.wait_applied(&first);
    // The next activation makes TestBroken{cause="activation"} fire.
    env.stub("touch", &exporter.flag("activation").display().to_string());
    let second = env.repo.commit("hive.nix", "{ broken = true; }", "breaks");
    d.ctl_ok(&["sync"]);
    prom.wait_firing(&["TestBroken{activation}"]);
    // The gate fails at its deadline; once it rolls back, the alert is resolved (the world
    // the bad revision broke is mended), so that the rollback's own gate can pass.
    d.wait_status("rolling back", |s| {
        matches!(
            s["rollout"]["phase"].as_str(),
            Some("rolling-back" | "verifying-rollback" | "rolled-back")
        )
    });
    std::fs::remove_file(exporter.flag("activation")).unwrap();
    let s = d.wait_status("rolled back", |s| s["rollout"]["phase"] == "rolled-back");
    assert_eq!(s["apply"]["state"], "rolled-back", "{s:#}");
    let halt = wait_for("the halt", || {
        crate::faults::halts(cp).remove(second.as_str())
    });
    assert_eq!(halt["node"], "ag-breaks", "{halt:#}");
    let probes: Vec<&String> = halt["probes"].as_object().unwrap().keys().collect();
    assert!(
        probes
            .iter()
            .any(|p| p.starts_with("alert:TestBroken{cause=\"activation\"")),
        "the alert is the failing check: {halt:#}"
    );
    assert!(
        !probes.iter().any(|p| *p == "prometheus"),
        "Prometheus answered throughout: {halt:#}"
    );
}

#[test]
fn an_alert_firing_before_the_activation_does_not_fail_a_no_regression_gate() {
    let Some(cp) = control_plane::shared() else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let Some((exporter, prom)) = prometheus(tmp.path()) else {
        return;
    };
    let flag = exporter.flag("before");
    let seen = tmp.path().join("seen");
    // The baseline (taken after admission let the node through) raises the alert and waits
    // until Prometheus sees it fire: the baseline then holds it, and the gate does not count
    // it as the activation's.
    let command = format!(
        "command = [\"sh\", \"-c\", \"if [ $GINX_GATE_STEP = baseline ] && [ -n \\\"$GINX_REVISION\\\" ] \
         && [ ! -e {flag} ]; then : > {flag}; i=0; while [ ! -e {seen} ] && [ $i -lt 250 ]; do \
         sleep 0.1; i=$((i+1)); done; fi\"]",
        flag = flag.display(),
        seen = seen.display()
    );
    let mut rbac = RbacGuard::new(cp);
    rbac.watch("ag-before");
    let env = worker(cp, "ag-before", &gate(&prom.url, &command, ""));
    let d = env.start();
    prom.wait_firing(&["TestBroken{before}"]);
    std::fs::write(&seen, "").unwrap();
    let s = d.wait_applied(&env.repo.head());
    assert_eq!(s["rollout"]["phase"], "succeeded", "{s:#}");
    assert_eq!(prom.firing(), ["TestBroken{before}"], "it fired throughout");
    let history: Value = serde_json::from_str(&d.ctl_ok(&["history", "--json"])).unwrap();
    assert_eq!(
        history["attempts"][0]["outcome"], "succeeded",
        "{history:#}"
    );
    assert!(
        crate::faults::halts(cp)
            .values()
            .all(|h| h["node"] != "ag-before")
    );
}

#[test]
fn with_prometheus_stopped_wait_holds_and_ignore_proceeds_and_each_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let Some((_exporter, mut prom)) = prometheus(tmp.path()) else {
        return;
    };
    let url = prom.url.clone();
    prom.stop();
    let on = |setting: &str| standalone(&url, &format!("on_unavailable = \"{setting}\""));
    let (waits, ignores) = (on("wait"), on("ignore"));
    let (dw, di) = (waits.start(), ignores.start());
    let s = waiting_for(&dw, "alerts");
    let reason = s["rollout"]["reason"].as_str().unwrap();
    assert!(
        reason.starts_with(&format!("Prometheus at {url} does not answer: "))
            && reason.ends_with(
                "nothing starts until it does (rollout.gate.prometheus.on_unavailable = \"wait\")"
            ),
        "{reason}"
    );
    di.wait_applied(&ignores.repo.head());
    let log = di.log();
    assert!(
        log.contains("going on without the alert gate (rollout.gate.prometheus.on_unavailable = \\\"ignore\\\")")
            || log.contains("going on without the alert gate (rollout.gate.prometheus.on_unavailable = \"ignore\")"),
        "{log}"
    );
    assert!(
        waits.calls().is_empty(),
        "the waiting node activated nothing"
    );
    // Prometheus back: the waiting node goes on.
    prom.run();
    dw.wait_applied(&waits.repo.head());
}

/// A node without a lock (`lock = "none"`) whose alert gate asks `url` with `prom_extra`.
fn standalone(url: &str, prom_extra: &str) -> Env {
    let env = Env::new();
    env.dropin(
        "80-rollout.toml",
        &format!(
            "[rollout]\nlock = \"none\"\n\n{}",
            gate(url, "", prom_extra)
        ),
    );
    env
}

#[test]
fn over_tls_it_trusts_the_ca_of_ca_file_and_sends_its_token() {
    let tmp = tempfile::tempdir().unwrap();
    if !support::require("prometheus") {
        return;
    }
    let exporter = Exporter::start(&tmp.path().join("flags"));
    let ca = TestCa::new(tmp.path());
    let prom = Prometheus::start_tls(&tmp.path().join("prometheus"), &exporter.addr, &ca);
    assert!(prom.url.starts_with("https://127.0.0.1:"), "{}", prom.url);
    std::fs::write(exporter.flag("tls"), "").unwrap();
    prom.wait_firing(&["TestBroken{tls}"]);
    // Prometheus without auth ignores a bearer token; sending one must not break the query,
    // and the token must never show in what ginx writes (the secrets sweep reads it all).
    let token = tmp.path().join("token");
    std::fs::write(&token, "prom-token-Zq81xW\n").unwrap();
    support::sweep::secret("Prometheus bearer token", "prom-token-Zq81xW");
    let trusting = standalone(
        &prom.url,
        &format!(
            "ca_file = \"{}\"\nbearer_token_file = \"{}\"",
            ca.pem_path.display(),
            token.display()
        ),
    );
    // Without ca_file the test CA is nobody's: the TLS handshake fails, and "wait" holds.
    let untrusting = standalone(&prom.url, "");
    let (dt, du) = (trusting.start(), untrusting.start());
    let s = waiting_for(&dt, "alerts");
    let reason = s["rollout"]["reason"].as_str().unwrap();
    assert!(
        reason.starts_with(
            "1 alert(s) fire (rollout.gate.prometheus.query): TestBroken{cause=\"tls\""
        ),
        "{reason}"
    );
    let s = waiting_for(&du, "alerts");
    let reason = s["rollout"]["reason"].as_str().unwrap();
    assert!(
        reason.starts_with(&format!("Prometheus at {} does not answer: ", prom.url))
            && reason.to_lowercase().contains("certificate"),
        "the handshake's failure is named: {reason}"
    );
    assert!(trusting.calls().is_empty() && untrusting.calls().is_empty());
    // The alert resolves: the node that trusts the CA goes on; the other still cannot ask.
    std::fs::remove_file(exporter.flag("tls")).unwrap();
    prom.wait_firing(&[]);
    dt.wait_applied(&trusting.repo.head());
    assert_eq!(du.status()["rollout"]["waiting_for"], "alerts");
    assert!(untrusting.calls().is_empty(), "{:?}", untrusting.calls());
}
