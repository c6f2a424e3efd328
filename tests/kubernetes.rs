//! Telling the cluster: heartbeat Lease, node annotations, the node condition, health probes and
//! metrics, against the stand-in API server (tests/support/apiserver.rs) and stand-in local
//! endpoints.

use std::time::Duration;

use serde_json::Value;

use crate::support::apiserver::ApiServer;
use crate::support::{self, Env, fakes, wait_for};

const PROBES_OFF: &str = "[health]\ninterval = \"200ms\"\n\
[health.kubelet]\nenabled = false\n[health.apiserver]\nenabled = false\n\
[health.cilium]\nenabled = false\n[health.systemd]\nenabled = false\n\
[health.node_ready]\nenabled = false\n";

/// Points ginx at `api` with a token kubeconfig, fast renewals, and every probe off.
fn use_api(env: &Env, api: &ApiServer, extra: &str) {
    let kc = env.root.join("kubeconfig");
    api.kubeconfig_token(&kc);
    env.dropin(
        "70-kube.toml",
        &format!(
            "[kubernetes]\nkubeconfig = \"{}\"\nrenew_interval = \"200ms\"\nresync_interval = \"1h\"\n{extra}\n{PROBES_OFF}",
            kc.display()
        ),
    );
}

fn count(api: &ApiServer, method: &str, path: &str) -> usize {
    api.log()
        .iter()
        .filter(|r| r.method == method && r.path == path)
        .count()
}

const LEASE: &str = "/apis/coordination.k8s.io/v1/namespaces/ginx-system/leases/ginx-lucy";
const NODE: &str = "/api/v1/nodes/lucy";
const NODE_STATUS: &str = "/api/v1/nodes/lucy/status";

fn condition(api: &ApiServer) -> Option<Value> {
    api.node("lucy")?["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "GinxHealthy")
        .cloned()
}

#[test]
fn heartbeat_lease_is_created_and_renewed() {
    let env = Env::new();
    let api = ApiServer::start(&env.root);
    use_api(&env, &api, "");
    let d = env.start();
    let lease = wait_for("the lease", || api.lease("ginx-system", "ginx-lucy"));
    assert_eq!(lease["spec"]["holderIdentity"], "lucy");
    assert_eq!(lease["spec"]["leaseDurationSeconds"], 40);
    let first = lease["spec"]["renewTime"].clone();
    wait_for("a renewal", || {
        let l = api.lease("ginx-system", "ginx-lucy")?;
        (l["spec"]["renewTime"] != first).then_some(())
    });
    let s = d.wait_status("connected", |s| s["kubernetes"]["state"] == "connected");
    assert_eq!(s["kubernetes"]["lease"], "ginx-system/ginx-lucy");
    assert!(s["kubernetes"]["last_heartbeat"].is_string());
    assert!(
        d.ctl_ok(&["status"])
            .contains("kubernetes connected, heartbeat")
    );
    // Renewals are single conditional PUTs, no GET each time.
    let puts = count(&api, "PUT", LEASE);
    let gets = count(&api, "GET", LEASE);
    assert!(puts >= 1 && gets <= 1, "puts {puts}, gets {gets}");
}

#[test]
fn a_client_certificate_works_too() {
    let env = Env::new();
    let api = ApiServer::start(&env.root);
    use_api(&env, &api, "");
    api.kubeconfig_cert(&env.root.join("kubeconfig"));
    let _d = env.start();
    wait_for("the lease", || api.lease("ginx-system", "ginx-lucy"));
}

#[test]
fn a_conflicting_write_is_read_again_and_renewed() {
    let env = Env::new();
    let api = ApiServer::start(&env.root);
    use_api(&env, &api, "");
    let _d = env.start();
    let lease = wait_for("the lease", || api.lease("ginx-system", "ginx-lucy"));
    // Someone else writes the lease: ginx's cached resourceVersion is stale now.
    let mut other = lease.clone();
    other["spec"]["holderIdentity"] = "intruder".into();
    api.put_object("leases/ginx-system/ginx-lucy", other);
    api.clear_log();
    wait_for("the lease back with lucy", || {
        let l = api.lease("ginx-system", "ginx-lucy")?;
        (l["spec"]["holderIdentity"] == "lucy").then_some(())
    });
    let log = api.log();
    let lease_calls: Vec<(String, u16)> = log
        .iter()
        .filter(|r| r.path == LEASE)
        .map(|r| (r.method.clone(), r.status))
        .collect();
    let conflict = lease_calls
        .iter()
        .position(|c| *c == ("PUT".to_owned(), 409))
        .expect("a 409");
    assert_eq!(
        lease_calls[conflict + 1],
        ("GET".to_owned(), 200),
        "{lease_calls:?}"
    );
    assert_eq!(
        lease_calls[conflict + 2],
        ("PUT".to_owned(), 200),
        "{lease_calls:?}"
    );
}

#[test]
fn annotations_are_written_only_when_they_change() {
    let env = Env::new();
    let api = ApiServer::start(&env.root);
    api.add_node("lucy");
    use_api(&env, &api, "");
    let head = env.repo.head();
    let d = env.start();
    d.wait_applied(&head);
    wait_for("the annotations", || {
        let n = api.node("lucy")?;
        (n["metadata"]["annotations"]["ginx.io/applied-revision"] == head.as_str()).then_some(())
    });
    let node = api.node("lucy").unwrap();
    let a = &node["metadata"]["annotations"];
    assert_eq!(
        a["node.alpha.kubernetes.io/ttl"], "0",
        "others' annotations untouched"
    );
    assert_eq!(a["ginx.io/revision-hephaestus"], head.as_str());
    assert_eq!(a["ginx.io/apply-state"], "succeeded");
    assert_eq!(a["ginx.io/version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(a["ginx.io/reboot-required"], "false");
    assert!(a["ginx.io/last-apply"].is_string());

    // Steady state: many renewals, not a single node write.
    let patches = count(&api, "PATCH", NODE) + count(&api, "PATCH", NODE_STATUS);
    let renewals = count(&api, "PUT", LEASE);
    wait_for("20 more renewals", || {
        (count(&api, "PUT", LEASE) >= renewals + 20).then_some(())
    });
    assert_eq!(
        count(&api, "PATCH", NODE) + count(&api, "PATCH", NODE_STATUS),
        patches
    );
    // Every annotation patch was a merge patch of ginx's keys only.
    for r in api
        .log()
        .iter()
        .filter(|r| r.method == "PATCH" && r.path == NODE)
    {
        assert_eq!(r.content_type, "application/merge-patch+json");
    }

    // A change is written.
    let next = env.repo.commit("n.nix", "{ }\n", "next");
    d.ctl_ok(&["sync"]);
    d.wait_applied(&next);
    wait_for("the new revision on the node", || {
        let n = api.node("lucy")?;
        (n["metadata"]["annotations"]["ginx.io/applied-revision"] == next.as_str()).then_some(())
    });
}

#[test]
fn the_condition_follows_the_probes_and_leaves_others_alone() {
    let env = Env::new();
    let api = ApiServer::start(&env.root);
    api.add_node("lucy");
    // A condition left by an earlier ginx, True since long ago: it stays True, so its
    // lastTransitionTime must stay too (times have whole seconds; an old one makes the
    // comparison independent of the clock).
    let mut node = api.node("lucy").unwrap();
    node["status"]["conditions"].as_array_mut().unwrap().push(
        serde_json::json!({"type": "GinxHealthy", "status": "True", "reason": "AllProbesOk",
            "message": "", "lastHeartbeatTime": "2026-01-01T00:00:00Z",
            "lastTransitionTime": "2026-01-01T00:00:00Z"}),
    );
    api.put_object("nodes/lucy", node);
    let (url, kubelet) = fakes::tcp(200, "ok");
    use_api(&env, &api, "");
    env.dropin(
        "80-kubelet.toml",
        &format!("[health.kubelet]\nenabled = true\nurl = \"{url}\"\n"),
    );
    let d = env.start();
    let c = wait_for("GinxHealthy True, written by this ginx", || {
        condition(&api)
            .filter(|c| c["status"] == "True" && c["lastHeartbeatTime"] != "2026-01-01T00:00:00Z")
    });
    assert_eq!(c["reason"], "AllProbesOk");
    let first_transition = c["lastTransitionTime"].clone();
    assert_eq!(
        first_transition, "2026-01-01T00:00:00Z",
        "no change of status, no transition"
    );

    kubelet.set(500, "[-]syncloop failed");
    let c = wait_for("GinxHealthy False", || {
        condition(&api).filter(|c| c["status"] == "False")
    });
    assert_eq!(c["reason"], "ProbesFailed");
    let msg = c["message"].as_str().unwrap();
    assert!(
        msg.contains("kubelet") && msg.contains("healthz answered 500"),
        "{msg}"
    );
    assert_ne!(c["lastTransitionTime"], first_transition);
    // The kubelet's own condition is untouched (strategic merge by type).
    let node = api.node("lucy").unwrap();
    let ready = node["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Ready")
        .unwrap()
        .clone();
    assert_eq!(ready["status"], "True");
    assert_eq!(ready["reason"], "KubeletReady");
    let s = d.status();
    assert_eq!(s["health"]["kubelet"]["status"], "failed");
    assert_eq!(s["health_overall"], "failed");
    assert_eq!(s["kubernetes"]["reported"], true);
    for r in api
        .log()
        .iter()
        .filter(|r| r.path == NODE_STATUS && r.method == "PATCH")
    {
        assert_eq!(r.content_type, "application/strategic-merge-patch+json");
    }
}

#[test]
fn a_vip_that_never_answers_leaves_the_local_check_its_time() {
    let env = Env::new();
    let api = ApiServer::start(&env.root);
    api.add_node("lucy");
    // Accepts connections (the kernel completes them) and never answers: a VIP nobody holds
    // behind a load balancer, or a half-dead holder.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    use_api(&env, &api, "");
    env.dropin(
        "80-probes.toml",
        &format!(
            "[health.apiserver]\nenabled = true\ntimeout = \"1s\"\nlocal_url = \"{}\"\n\
             vip_url = \"https://127.0.0.1:{}\"\n",
            api.url,
            silent.local_addr().unwrap().port()
        ),
    );
    let d = env.start();
    let s = d.wait_status("the apiserver probe", |s| {
        s["health"]["apiserver"]["status"]
            .as_str()
            .is_some_and(|st| st != "unknown")
    });
    let probe = &s["health"]["apiserver"];
    assert_eq!(probe["status"], "degraded", "{probe}");
    assert!(
        probe["message"]
            .as_str()
            .unwrap()
            .starts_with("local ready; VIP: "),
        "{probe}"
    );
}

#[test]
fn probes_against_stand_in_endpoints() {
    let env = Env::new();
    let api = ApiServer::start(&env.root);
    api.add_node("lucy");
    let (kubelet_url, _kubelet) = fakes::tcp(200, "ok");
    let sock = env.root.join("cilium.sock");
    let cilium = fakes::unix(
        &sock,
        200,
        r#"{"cilium":{"state":"Ok","msg":""},"kube-proxy-replacement":{"mode":"True"}}"#,
    );
    let systemctl = env.root.join("bin/fake-systemctl");
    std::fs::write(
        &systemctl,
        "#!/bin/sh\ncase \"$1\" in\n  is-system-running) echo degraded; exit 1 ;;\n  list-units) echo 'nginx.service loaded failed failed nginx'; echo 'foo.mount loaded failed failed foo' ;;\nesac\n",
    )
    .unwrap();
    std::fs::set_permissions(
        &systemctl,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    use_api(&env, &api, "");
    env.dropin(
        "80-probes.toml",
        &format!(
            "[health.kubelet]\nenabled = true\nurl = \"{kubelet_url}\"\n\
             [health.cilium]\nenabled = true\nsocket = \"{}\"\n\
             [health.systemd]\nenabled = true\nsystemctl = \"{}\"\n\
             [health.node_ready]\nenabled = true\n\
             [health.apiserver]\nenabled = true\nlocal_url = \"{}\"\n",
            sock.display(),
            systemctl.display(),
            api.url
        ),
    );
    let d = env.start();
    let s = d.wait_status("all probes", |s| {
        ["kubelet", "cilium", "systemd", "node-ready", "apiserver"]
            .iter()
            .all(|p| s["health"][p]["status"].is_string() && s["health"][p]["status"] != "unknown")
    });
    let h = &s["health"];
    assert_eq!(h["kubelet"]["status"], "ok");
    assert_eq!(h["cilium"]["status"], "ok");
    assert!(
        h["cilium"]["message"]
            .as_str()
            .unwrap()
            .contains("kube-proxy replacement True")
    );
    assert_eq!(h["systemd"]["status"], "degraded");
    assert_eq!(
        h["systemd"]["message"],
        "degraded; failed units: nginx.service, foo.mount"
    );
    assert_eq!(h["node-ready"]["status"], "ok");
    assert_eq!(h["apiserver"]["status"], "ok", "{}", h["apiserver"]);
    assert_eq!(h["apiserver"]["message"], "local and VIP ready");
    assert_eq!(s["health_overall"], "degraded");

    // Cilium warns; the API server's readyz fails.
    cilium.set(
        200,
        r#"{"cilium":{"state":"Warning","msg":"1 of 2 controllers failing"}}"#,
    );
    api.set_unready(true);
    let s = d.wait_status("the changes", |s| {
        s["health"]["cilium"]["status"] == "degraded"
            && s["health"]["apiserver"]["status"] == "failed"
    });
    assert!(
        s["health"]["apiserver"]["message"]
            .as_str()
            .unwrap()
            .contains("[-]etcd failed")
    );
    let human = d.ctl_ok(&["health"]);
    assert!(
        human.contains("overall    failed") && human.contains("cilium"),
        "{human}"
    );
    let json: Value = serde_json::from_str(&d.ctl_ok(&["health", "--json"])).unwrap();
    assert_eq!(json["overall"], "failed");
    // The Cilium socket gone: the health port answers instead.
    std::fs::remove_file(&sock).unwrap();
    let (fallback, _f) = fakes::tcp(200, "ok");
    env.dropin(
        "81-cilium.toml",
        &format!("[health.cilium]\nfallback_url = \"{fallback}\"\n"),
    );
    d.signal(nix::sys::signal::Signal::SIGHUP);
    d.wait_status("the fallback", |s| {
        s["health"]["cilium"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("health port"))
    });
}

#[test]
fn a_401_and_a_403_are_reported_with_what_to_do() {
    let env = Env::new();
    let api = ApiServer::start(&env.root);
    use_api(&env, &api, "");
    // A token the server does not know.
    let kc = env.root.join("kubeconfig");
    let text = std::fs::read_to_string(&kc)
        .unwrap()
        .replace(&api.token, "wrong-token");
    std::fs::write(&kc, text).unwrap();
    let d = env.start();
    let s = d.wait_status("the 401", |s| s["kubernetes"]["state"] == "refused");
    let e = s["kubernetes"]["error"].as_str().unwrap().to_owned();
    assert!(
        e.contains("rejects ginx's credentials") && e.contains("HTTP 401"),
        "{e}"
    );
    assert!(!d.log().contains("wrong-token"), "the token is not logged");
    assert!(d.ctl_ok(&["status"]).contains("kubernetes refused since"));
    drop(d);

    // Right token, missing RBAC.
    api.kubeconfig_token(&kc);
    api.forbid("get", "leases");
    api.forbid("create", "leases");
    api.forbid("update", "leases");
    let d = env.start();
    let s = d.wait_status("the 403", |s| {
        s["kubernetes"]["error"]
            .as_str()
            .is_some_and(|e| e.contains("403"))
    });
    let e = s["kubernetes"]["error"].as_str().unwrap();
    assert!(
        e.contains("packaging/kubernetes/rbac.yaml") && e.contains("ginx-system"),
        "{e}"
    );
    // Reported once, not once per retry.
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(d.log().matches("HTTP 403").count(), 1, "{}", d.log());
}

#[test]
fn a_missing_namespace_is_named() {
    let env = Env::new();
    let api = ApiServer::start(&env.root);
    api.remove_namespace("ginx-system");
    use_api(&env, &api, "");
    let d = env.start();
    let s = d.wait_status("the refusal", |s| s["kubernetes"]["state"] == "refused");
    let e = s["kubernetes"]["error"].as_str().unwrap();
    assert!(
        e.contains("namespaces \"ginx-system\" not found") && e.contains("rbac.yaml"),
        "{e}"
    );
}

#[test]
fn without_a_kubeconfig_ginx_works_and_picks_it_up_later() {
    let env = Env::new();
    let api = ApiServer::start(&env.root);
    let kc = env.root.join("kubeconfig");
    env.dropin(
        "70-kube.toml",
        &format!(
            "[kubernetes]\nkubeconfig = \"{}\"\nrenew_interval = \"200ms\"\n{PROBES_OFF}",
            kc.display()
        ),
    );
    let d = env.start();
    d.wait_applied(&env.repo.head());
    let s = d.status();
    assert_eq!(s["kubernetes"]["state"], "not-configured");
    assert!(
        s["kubernetes"]["error"]
            .as_str()
            .unwrap()
            .contains("waiting for the kubeconfig")
    );
    // The cluster comes into being later (e.g. after kubeadm init).
    api.kubeconfig_token(&kc);
    d.wait_status("connected", |s| s["kubernetes"]["state"] == "connected");
    wait_for("the lease", || api.lease("ginx-system", "ginx-lucy"));
}

#[test]
fn the_api_going_away_does_not_stop_applies_and_current_values_follow_its_return() {
    let env = Env::new();
    let api = ApiServer::start(&env.root);
    api.add_node("lucy");
    use_api(&env, &api, "");
    let d = env.start();
    d.wait_applied(&env.repo.head());
    d.wait_status("connected", |s| s["kubernetes"]["state"] == "connected");

    api.set_down(true);
    let s = d.wait_status("unreachable", |s| s["kubernetes"]["state"] == "unreachable");
    assert!(s["kubernetes"]["since"].is_string());
    assert!(
        d.ctl_ok(&["status"])
            .contains("kubernetes unreachable since")
    );
    let next = env
        .repo
        .commit("away.nix", "{ }\n", "while the API is away");
    d.ctl_ok(&["sync"]);
    d.wait_applied(&next);

    api.set_down(false);
    d.wait_status("connected again", |s| {
        s["kubernetes"]["state"] == "connected"
    });
    wait_for("the current revision on the node", || {
        let n = api.node("lucy")?;
        (n["metadata"]["annotations"]["ginx.io/applied-revision"] == next.as_str()).then_some(())
    });
    // One line when it went, one when it came back; not one per retry.
    let log = d.log();
    assert_eq!(log.matches("state=\"unreachable\"").count(), 1, "{log}");
}

#[test]
fn injected_server_errors_and_dropped_connections_are_survived() {
    let env = Env::new();
    let api = ApiServer::start(&env.root);
    use_api(&env, &api, "");
    let _d = env.start();
    wait_for("the lease", || api.lease("ginx-system", "ginx-lucy"));
    api.fail_next(&[500, 500, 500]);
    api.drop_next(2);
    let before = api.lease("ginx-system", "ginx-lucy").unwrap()["spec"]["renewTime"].clone();
    wait_for("renewals after the faults", || {
        let l = api.lease("ginx-system", "ginx-lucy")?;
        (l["spec"]["renewTime"] != before).then_some(())
    });
    assert!(api.log().iter().any(|r| r.status == 500));
}

#[test]
fn metrics_are_served_and_parse() {
    let env = Env::new();
    let api = ApiServer::start(&env.root);
    use_api(&env, &api, "");
    env.dropin("90-metrics.toml", "[metrics]\nlisten = \"127.0.0.1:0\"\n");
    let d = env.start();
    d.wait_applied(&env.repo.head());
    wait_for("the lease", || api.lease("ginx-system", "ginx-lucy"));
    let addr = d.status()["metrics_listen"].as_str().unwrap().to_owned();
    let body = wait_for("a scrape with a heartbeat", || {
        let b = scrape(&addr);
        b.contains("verb=\"replace\",code=\"200\"").then_some(b)
    });
    let mut samples = std::collections::HashMap::new();
    for line in body
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (name, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("bad line {line:?}"));
        let v: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("bad value in {line:?}"));
        samples.insert(name.to_owned(), v);
    }
    assert_eq!(
        samples[&format!(
            "ginx_build_info{{version=\"{}\"}}",
            env!("CARGO_PKG_VERSION")
        )],
        1.0
    );
    assert_eq!(samples["ginx_applies_total{result=\"succeeded\"}"], 1.0);
    assert_eq!(samples["ginx_apply_duration_seconds_count"], 1.0);
    assert_eq!(samples["ginx_apply_state{state=\"succeeded\"}"], 1.0);
    assert_eq!(samples["ginx_apply_state{state=\"failed\"}"], 0.0);
    assert_eq!(samples["ginx_suspended"], 0.0);
    assert_eq!(samples["ginx_reboot_required"], 0.0);
    assert!(samples["ginx_fetches_total{source=\"hephaestus\",result=\"ok\"}"] >= 1.0);
    assert!(
        samples.contains_key("ginx_fetch_last_success_timestamp_seconds{source=\"hephaestus\"}")
    );
    let head = env.repo.head();
    assert_eq!(
        samples[&format!(
            "ginx_source_revision{{source=\"hephaestus\",revision=\"{head}\",branch=\"main\"}}"
        )],
        1.0
    );
    let replaced = samples
        .get("ginx_kubernetes_requests_total{verb=\"replace\",code=\"200\"}")
        .unwrap_or_else(|| panic!("no replace requests counted:\n{body}"));
    assert!(*replaced >= 1.0);
    assert!(samples["ginx_heartbeat_last_success_timestamp_seconds"] > 1.7e9);
    assert!(body.trim_end().ends_with("# EOF"));
}

fn scrape(addr: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    // hyper may use chunked encoding; the body's lines are what matter.
    body.lines()
        .filter(|l| l.starts_with('#') || l.starts_with("ginx_"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn kube_vip_split_brain_is_seen_in_a_network_namespace() {
    if !support::require("ip") {
        return;
    }
    if !nix::unistd::geteuid().is_root() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI runs as root"
        );
        eprintln!("SKIPPED: network namespaces need root");
        return;
    }
    let netns = support::netns::NetNs::new("ginx-vip");
    netns.ip(&["link", "set", "lo", "up"]);
    netns.ip(&["addr", "add", "10.40.0.10/32", "dev", "lo"]);
    let env = Env::new();
    // The API server listens inside the namespace, where ginx's 127.0.0.1 is.
    let api = netns.run(|| ApiServer::start(&env.root));
    api.add_node("lucy");
    let lease = |holder: &str| {
        serde_json::json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "plndr-cp-lock", "namespace": "kube-system"},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": 15}
        })
    };
    api.put_object("leases/kube-system/plndr-cp-lock", lease("lucy"));
    use_api(&env, &api, "");
    env.dropin(
        "80-vip.toml",
        "[health.kube_vip]\naddress = \"10.40.0.10\"\n",
    );
    let d = env.start_with(|c| netns.wrap(c));
    let s = d.wait_status("VIP here, held here", |s| {
        s["health"]["kube-vip"]["status"] == "ok"
    });
    assert!(
        s["health"]["kube-vip"]["message"]
            .as_str()
            .unwrap()
            .contains("held here")
    );

    api.put_object("leases/kube-system/plndr-cp-lock", lease("makise"));
    let s = d.wait_status("split brain", |s| {
        s["health"]["kube-vip"]["status"] == "failed"
    });
    assert!(
        s["health"]["kube-vip"]["message"]
            .as_str()
            .unwrap()
            .contains("split brain")
    );

    netns.ip(&["addr", "del", "10.40.0.10/32", "dev", "lo"]);
    let s = d.wait_status("held elsewhere", |s| {
        s["health"]["kube-vip"]["status"] == "ok"
    });
    assert!(
        s["health"]["kube-vip"]["message"]
            .as_str()
            .unwrap()
            .contains("held by makise")
    );

    api.put_object("leases/kube-system/plndr-cp-lock", lease("lucy"));
    d.wait_status("lease without the VIP", |s| {
        s["health"]["kube-vip"]["status"] == "degraded"
    });
}

/// The stand-in's own patch semantics, which the tests above rely on.
#[test]
fn stand_in_strategic_merge_upserts_conditions_by_type() {
    use crate::support::apiserver::{merge, strategic_merge};
    use serde_json::json;
    let mut node = json!({"status": {"conditions": [
        {"type": "Ready", "status": "True"}, {"type": "GinxHealthy", "status": "Unknown"}]}});
    strategic_merge(
        &mut node,
        &json!({"status": {"conditions": [{"type": "GinxHealthy", "status": "True"}]}}),
    );
    assert_eq!(node["status"]["conditions"].as_array().unwrap().len(), 2);
    assert_eq!(node["status"]["conditions"][1]["status"], "True");
    let mut plain = node.clone();
    merge(
        &mut plain,
        &json!({"status": {"conditions": [{"type": "X"}]}}),
    );
    assert_eq!(
        plain["status"]["conditions"].as_array().unwrap().len(),
        1,
        "merge replaces lists"
    );
}
