//! Telling the cluster: heartbeat Lease, node annotations, the node condition, health probes and
//! metrics.
//!
//! Against the real control plane (tests/support/control_plane.rs: etcd, kube-apiserver and
//! kube-controller-manager, with rbac.yaml applied and ginx's own client certificates), with
//! the stand-in kubelet (tests/support/kubelet.rs) keeping nodes Ready. Each test has its own
//! node names, and an [`RbacGuard`] that fails it when a request by its ginx was refused. The
//! stand-in API server (tests/support/apiserver.rs) serves only what a real server cannot be
//! made to do on cue: 500s, dropped connections, an unready `/readyz`, a VIP in a namespace.

use serde_json::Value;

use crate::support::apiserver::ApiServer;
use crate::support::control_plane::{self, AuditEvent, ControlPlane, RbacGuard};
use crate::support::kubelet::Kubelet;
pub(crate) use crate::support::test_fleet::{kube_dropin, use_cluster};
use crate::support::{self, Env, fakes, wait_for};

/// Points ginx at the stand-in `api` with a token kubeconfig, fast renewals, every probe off.
fn use_api(env: &Env, api: &ApiServer, extra: &str) {
    let kc = env.root.join("kubeconfig");
    api.kubeconfig_token(&kc);
    // The stand-in knows one identity: the node's own is the same token.
    std::fs::copy(&kc, env.root.join("kubelet.conf")).unwrap();
    kube_dropin(env, &kc, extra);
}

/// The requests in `events` on the Lease `ginx-<node>` in ginx-system.
fn on_lease<'a>(events: &'a [AuditEvent], node: &str) -> Vec<&'a AuditEvent> {
    let name = format!("ginx-{node}");
    events
        .iter()
        .filter(|e| e.resource == "leases" && e.namespace == "ginx-system" && e.name == name)
        .collect()
}

fn count(events: &[&AuditEvent], verb: &str, code: u16) -> usize {
    events
        .iter()
        .filter(|e| e.verb == verb && e.code == code)
        .count()
}

fn node_writes(events: &[AuditEvent], node: &str) -> usize {
    events
        .iter()
        .filter(|e| e.resource == "nodes" && e.name == node && e.verb == "patch")
        .count()
}

fn condition_of(node: &Value) -> Option<Value> {
    node["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == "GinxHealthy")
        .cloned()
}

#[test]
fn heartbeat_lease_is_created_and_renewed() {
    let Some(cp) = control_plane::shared() else {
        return;
    };
    let node = "hb-renew";
    let mut rbac = RbacGuard::new(cp);
    rbac.watch(node);
    let env = Env::new();
    use_cluster(&env, cp, node, "");
    let d = env.start();
    let lease = wait_for("the lease", || cp.lease("ginx-system", "ginx-hb-renew"));
    assert_eq!(lease["spec"]["holderIdentity"], node);
    assert_eq!(lease["spec"]["leaseDurationSeconds"], 40);
    let first = lease["spec"]["renewTime"].clone();
    wait_for("a renewal", || {
        let l = cp.lease("ginx-system", "ginx-hb-renew")?;
        (l["spec"]["renewTime"] != first).then_some(())
    });
    let s = d.wait_status("connected", |s| s["kubernetes"]["state"] == "connected");
    assert_eq!(s["kubernetes"]["lease"], "ginx-system/ginx-hb-renew");
    assert!(s["kubernetes"]["last_heartbeat"].is_string());
    assert!(
        d.ctl_ok(&["status"])
            .contains("kubernetes connected, heartbeat")
    );
    // From the real audit log: created once, then renewed by PUTs, without a GET each time.
    let events = rbac.requests();
    let lease_calls = on_lease(&events, node);
    let calls: Vec<String> = lease_calls.iter().map(|e| e.short()).collect();
    assert_eq!(count(&lease_calls, "create", 201), 1, "{calls:?}");
    let puts = count(&lease_calls, "update", 200);
    let gets = lease_calls.iter().filter(|e| e.verb == "get").count();
    assert!(puts >= 1 && gets <= 1, "{calls:?}");
    // The Leases as ginx's own identity; writes to the node as the node's (the report).
    for e in &events {
        let own = match (e.resource.as_str(), e.verb.as_str()) {
            ("nodes", "patch") => e.groups.iter().any(|g| g == "system:nodes"),
            ("nodes", _) => true,
            _ => e.groups.iter().any(|g| g == "ginx:nodes"),
        };
        assert!(own, "a request made with the wrong identity: {e:?}");
    }
}

#[test]
fn a_bearer_token_works_too() {
    let Some(cp) = control_plane::shared() else {
        return;
    };
    // A ServiceAccount token in a kubeconfig (`token:`), as README allows, bound to the same
    // Role as ginx's certificates.
    cp.apply(
        "apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: ginx-token-test, namespace: ginx-system}\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\n\
         metadata: {name: ginx-token-test, namespace: ginx-system}\n\
         roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: ginx-heartbeat}\n\
         subjects: [{kind: ServiceAccount, name: ginx-token-test, namespace: ginx-system}]\n",
    );
    let token = cp.kubectl(&["-n", "ginx-system", "create", "token", "ginx-token-test"]);
    support::sweep::secret("ServiceAccount bearer token", token.trim());
    let signature = token.trim().rsplit('.').next().unwrap();
    support::sweep::secret("ServiceAccount bearer token (signature)", signature);
    let env = Env::new();
    let kc = use_cluster(&env, cp, "hb-token", "");
    let text = std::fs::read_to_string(&kc).unwrap();
    let user_start = text.find("    client-certificate-data").unwrap();
    let user_end = text.find("contexts:").unwrap();
    let text = format!(
        "{}    token: {}\n{}",
        &text[..user_start],
        token.trim(),
        &text[user_end..]
    );
    std::fs::write(&kc, text).unwrap();
    let d = env.start();
    let lease = wait_for("the lease", || cp.lease("ginx-system", "ginx-hb-token"));
    assert_eq!(lease["spec"]["holderIdentity"], "hb-token");
    assert!(!d.log().contains(token.trim()), "the token is not logged");
}

#[test]
fn a_conflicting_write_is_read_again_and_renewed() {
    let Some(cp) = control_plane::shared() else {
        return;
    };
    let node = "hb-conflict";
    let mut rbac = RbacGuard::new(cp);
    rbac.watch(node);
    let env = Env::new();
    use_cluster(&env, cp, node, "");
    let _d = env.start();
    let path = "/apis/coordination.k8s.io/v1/namespaces/ginx-system/leases/ginx-hb-conflict";
    wait_for("the lease", || cp.get_path(path));
    let mark = cp.audit_mark();
    // Someone else writes the lease: ginx's resourceVersion is stale now. The admin's own PUT
    // is conditional too, so it is retried when ginx renewed in between.
    wait_for("the intruder's write", || {
        let mut other = cp.get_path(path)?;
        other["spec"]["holderIdentity"] = "intruder".into();
        let (code, _) = cp.request("PUT", path, "application/json", &other);
        (code == 200).then_some(())
    });
    wait_for("the lease back with hb-conflict", || {
        let l = cp.get_path(path)?;
        (l["spec"]["holderIdentity"] == node).then_some(())
    });
    let events: Vec<AuditEvent> = cp
        .audit_since(mark)
        .into_iter()
        .filter(|e| e.user == "ginx:hb-conflict")
        .collect();
    let lease_calls: Vec<(String, u16)> = on_lease(&events, node)
        .iter()
        .map(|e| (e.verb.clone(), e.code))
        .collect();
    let conflict = lease_calls
        .iter()
        .position(|c| *c == ("update".to_owned(), 409))
        .unwrap_or_else(|| panic!("a 409 from the real API: {lease_calls:?}"));
    assert_eq!(
        lease_calls[conflict + 1],
        ("get".to_owned(), 200),
        "{lease_calls:?}"
    );
    assert_eq!(
        lease_calls[conflict + 2],
        ("update".to_owned(), 200),
        "{lease_calls:?}"
    );
}

#[test]
fn annotations_are_written_only_when_they_change() {
    let Some(cp) = control_plane::shared() else {
        return;
    };
    let node = "annotate";
    let mut rbac = RbacGuard::new(cp);
    rbac.watch(node);
    let _kubelet = Kubelet::start(cp, node, "worker");
    cp.kubectl(&["annotate", "node", node, "example.com/owner=admin"]);
    let env = Env::new();
    use_cluster(&env, cp, node, "");
    let head = env.repo.head();
    let d = env.start();
    d.wait_applied(&head);
    wait_for("the annotations", || {
        let n = cp.node(node)?;
        (n["metadata"]["annotations"]["ginx.io/applied-revision"] == head.as_str()).then_some(())
    });
    let n = cp.node(node).unwrap();
    let a = &n["metadata"]["annotations"];
    assert_eq!(
        a["example.com/owner"], "admin",
        "others' annotations untouched"
    );
    assert_eq!(a["ginx.io/revision-hephaestus"], head.as_str());
    assert_eq!(a["ginx.io/apply-state"], "succeeded");
    assert_eq!(a["ginx.io/version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(a["ginx.io/reboot-required"], "false");
    assert!(a["ginx.io/last-apply"].is_string());

    // A steady minute (300 renewals at 200 ms), counted in the real audit log: renewals and
    // not a single node write.
    let mark = cp.audit_mark();
    let mine = |mark| -> Vec<AuditEvent> {
        cp.audit_since(mark)
            .into_iter()
            .filter(|e| e.user == "ginx:annotate")
            .collect()
    };
    wait_for("300 renewals", || {
        (count(&on_lease(&mine(mark), node), "update", 200) >= 300).then_some(())
    });
    let steady = mine(mark);
    assert_eq!(
        node_writes(&steady, node),
        0,
        "{:?}",
        steady.iter().map(|e| e.short()).collect::<Vec<_>>()
    );

    // A change is written.
    let next = env.repo.commit("n.nix", "{ }\n", "next");
    d.ctl_ok(&["sync"]);
    d.wait_applied(&next);
    wait_for("the new revision on the node", || {
        let n = cp.node(node)?;
        (n["metadata"]["annotations"]["ginx.io/applied-revision"] == next.as_str()).then_some(())
    });
    assert_eq!(
        cp.node(node).unwrap()["metadata"]["annotations"]["example.com/owner"],
        "admin"
    );
}

#[test]
fn the_condition_follows_the_probes_and_leaves_others_alone() {
    let Some(cp) = control_plane::shared() else {
        return;
    };
    let node = "condition";
    let mut rbac = RbacGuard::new(cp);
    rbac.watch(node);
    let _kubelet = Kubelet::start(cp, node, "worker");
    // A condition left by an earlier ginx, True since long ago: it stays True, so its
    // lastTransitionTime must stay too (an old time makes the comparison independent of the
    // clock).
    cp.kubectl(&[
        "patch",
        "node",
        node,
        "--subresource=status",
        "--type=strategic",
        "-p",
        r#"{"status":{"conditions":[{"type":"GinxHealthy","status":"True","reason":"AllProbesOk","message":"","lastHeartbeatTime":"2026-01-01T00:00:00Z","lastTransitionTime":"2026-01-01T00:00:00Z"}]}}"#,
    ]);
    let (url, kubelet_endpoint) = fakes::tcp(200, "ok");
    let env = Env::new();
    use_cluster(&env, cp, node, "");
    env.dropin(
        "80-kubelet.toml",
        &format!("[health.kubelet]\nenabled = true\nurl = \"{url}\"\n"),
    );
    let d = env.start();
    let c = wait_for("GinxHealthy True, written by this ginx", || {
        condition_of(&cp.node(node)?)
            .filter(|c| c["status"] == "True" && c["lastHeartbeatTime"] != "2026-01-01T00:00:00Z")
    });
    assert_eq!(c["reason"], "AllProbesOk");
    let first_transition = c["lastTransitionTime"].clone();
    assert_eq!(
        first_transition, "2026-01-01T00:00:00Z",
        "no change of status, no transition"
    );

    kubelet_endpoint.set(500, "[-]syncloop failed");
    let c = wait_for("GinxHealthy False", || {
        condition_of(&cp.node(node)?).filter(|c| c["status"] == "False")
    });
    assert_eq!(c["reason"], "ProbesFailed");
    let msg = c["message"].as_str().unwrap();
    assert!(
        msg.contains("kubelet") && msg.contains("healthz answered 500"),
        "{msg}"
    );
    assert_ne!(c["lastTransitionTime"], first_transition);
    // The kubelet's own condition is untouched: the real API merges conditions by type.
    let n = cp.node(node).unwrap();
    let ready = n["status"]["conditions"]
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
    let status_writes = rbac
        .requests()
        .iter()
        .filter(|e| e.resource == "nodes" && e.subresource == "status" && e.verb == "patch")
        .count();
    assert!(
        status_writes >= 2,
        "the condition written through nodes/status"
    );
}

#[test]
fn the_kube_vip_lease_holder_is_read() {
    let Some(cp) = control_plane::shared() else {
        return;
    };
    let node = "vip-reader";
    let mut rbac = RbacGuard::new(cp);
    rbac.watch(node);
    let lease = |holder: &str| {
        format!(
            "apiVersion: coordination.k8s.io/v1\nkind: Lease\n\
             metadata: {{name: plndr-cp-lock, namespace: kube-system}}\n\
             spec: {{holderIdentity: {holder}, leaseDurationSeconds: 15}}\n"
        )
    };
    cp.apply(&lease("makise"));
    let env = Env::new();
    use_cluster(&env, cp, node, "");
    // An address on no interface here; the probe only looks at local interfaces.
    env.dropin(
        "80-vip.toml",
        "[health.kube_vip]\naddress = \"10.40.0.10\"\n",
    );
    let d = env.start();
    let s = d.wait_status("held elsewhere", |s| {
        s["health"]["kube-vip"]["status"] == "ok"
    });
    assert_eq!(
        s["health"]["kube-vip"]["message"],
        "VIP 10.40.0.10 is held by makise"
    );
    // This node holds kube-vip's lease, but the VIP is not here.
    cp.apply(&lease(node));
    let s = d.wait_status("held here without the VIP", |s| {
        s["health"]["kube-vip"]["status"] == "degraded"
    });
    assert!(
        s["health"]["kube-vip"]["message"]
            .as_str()
            .unwrap()
            .contains("this node holds kube-system/plndr-cp-lock"),
        "{}",
        s["health"]["kube-vip"]
    );
    let reads = rbac
        .requests()
        .iter()
        .filter(|e| e.resource == "leases" && e.name == "plndr-cp-lock" && e.code == 200)
        .count();
    assert!(reads >= 2);
}

#[test]
fn a_wrong_client_certificate_is_refused_with_what_to_do() {
    let Some(cp) = control_plane::shared() else {
        return;
    };
    let env = Env::new();
    let kc = use_cluster(&env, cp, "wrong-cert", "");
    // The right names, signed by a CA the API server does not trust.
    let other = support::tls::TestCa::new(&env.root);
    let (cert, key) = other.issue_client_pem("ginx:wrong-cert", &["ginx:nodes"]);
    let text = std::fs::read_to_string(&kc).unwrap();
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    for l in &mut lines {
        if l.trim_start().starts_with("client-certificate-data:") {
            *l = format!("    client-certificate-data: {}", b64.encode(&cert));
        } else if l.trim_start().starts_with("client-key-data:") {
            *l = format!("    client-key-data: {}", b64.encode(&key));
        }
    }
    std::fs::write(&kc, lines.join("\n") + "\n").unwrap();
    let d = env.start();
    let s = d.wait_status("the 401", |s| s["kubernetes"]["state"] == "refused");
    let e = s["kubernetes"]["error"].as_str().unwrap().to_owned();
    assert!(
        e.contains("rejects ginx's credentials") && e.contains("HTTP 401"),
        "{e}"
    );
    assert!(
        e.contains(&kc.display().to_string()),
        "names the kubeconfig: {e}"
    );
    assert!(d.ctl_ok(&["status"]).contains("kubernetes refused since"));
    let log = d.log();
    assert!(
        !log.contains("PRIVATE KEY") && !log.contains(&b64.encode(&key)[..40]),
        "no key material in the log"
    );
}

#[test]
fn a_missing_role_binding_is_a_403_naming_rbac_yaml() {
    let Some(cp) = control_plane::shared() else {
        return;
    };
    let node = "rbac-missing";
    let mut rbac = RbacGuard::new(cp);
    rbac.watch(node);
    rbac.expect_forbidden(node);
    let env = Env::new();
    use_cluster(&env, cp, node, "");
    // ginx's identity in a group no binding names: what a node sees when the bindings of
    // rbac.yaml were removed (or never applied).
    cp.kubeconfig_for(
        &env.root.join("kubeconfig"),
        &format!("ginx:{node}"),
        &["ginx:unbound"],
    );
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
    assert!(
        e.contains("ginx:rbac-missing"),
        "the real API names the user: {e}"
    );
    let refused = rbac.requests().iter().filter(|r| r.code == 403).count();
    assert!(refused >= 1);
    // Reported once, not once per retry.
    wait_for("more refused attempts", || {
        (rbac.requests().iter().filter(|r| r.code == 403).count() >= refused + 3).then_some(())
    });
    // The rollout, held back by the same refusal, says so once in its own words.
    // So do the node Events (refused too: at most once).
    let log = d.log();
    let heartbeat_lines = log
        .lines()
        .filter(|l| {
            l.contains("HTTP 403")
                && !l.contains("waiting to apply")
                && !l.contains("cannot write node Events")
        })
        .count();
    assert_eq!(heartbeat_lines, 1, "{log}");
    let event_lines = log
        .lines()
        .filter(|l| l.contains("cannot write node Events"))
        .count();
    assert!(event_lines <= 1, "{log}");
}

/// The node report is written with the node's own identity (`kubernetes.node_kubeconfig`):
/// missing, it is named; another node's, the API server refuses it (Node authorizer and
/// NodeRestriction), and the error says which identity needs what. The heartbeat goes on; the
/// refusal is logged once, not once per retry.
#[test]
fn the_node_report_needs_the_nodes_own_identity() {
    let Some(cp) = control_plane::shared() else {
        return;
    };
    let (node, other) = ("own-report", "own-report-other");
    let mut rbac = RbacGuard::new(cp);
    rbac.watch(node);
    let _kubelet = Kubelet::start(cp, node, "worker");
    let _other = Kubelet::start(cp, other, "worker");
    let env = Env::new();
    use_cluster(&env, cp, node, "");
    let own = env.root.join("kubelet.conf");
    std::fs::remove_file(&own).unwrap();
    let d = env.start();
    let s = d.wait_status("the node report waiting for the node's kubeconfig", |s| {
        s["kubernetes"]["report_error"].is_string()
    });
    assert_eq!(s["kubernetes"]["state"], "connected", "{s:#}");
    assert_eq!(s["kubernetes"]["reported"], false);
    let e = s["kubernetes"]["report_error"].as_str().unwrap();
    assert!(
        e.contains(&own.display().to_string())
            && e.contains("kubernetes.node_kubeconfig")
            && e.contains("does not exist"),
        "{e}"
    );
    // Another node's identity: refused by the API server for this node.
    let mark = cp.audit_mark();
    cp.kubeconfig_for(&own, &format!("system:node:{other}"), &["system:nodes"]);
    let s = d.wait_status("the node report refused", |s| {
        s["kubernetes"]["report_error"]
            .as_str()
            .is_some_and(|e| e.contains("403"))
    });
    let e = s["kubernetes"]["report_error"].as_str().unwrap();
    assert!(
        e.contains("kubernetes.node_kubeconfig") && e.contains("NodeRestriction"),
        "{e}"
    );
    assert!(
        d.ctl_ok(&["status"]).contains("node report: cannot"),
        "{}",
        d.ctl_ok(&["status"])
    );
    let by_other = |code: u16| {
        cp.audit_since(mark)
            .into_iter()
            .filter(|r| {
                r.user == format!("system:node:{other}") && r.name == node && r.code == code
            })
            .count()
    };
    let refused = by_other(403);
    assert!(refused >= 1);
    assert_eq!(
        by_other(200),
        0,
        "another node's identity changed this node"
    );
    // Logged once, not once per retry: wait for more refusals, then count.
    let next = env.repo.commit("x.nix", "{ }\n", "a change to report");
    d.ctl_ok(&["sync"]);
    d.wait_applied(&next);
    wait_for("another refused node request", || {
        (by_other(403) > refused).then_some(())
    });
    assert_eq!(
        d.log().matches("cannot report to the node").count(),
        2,
        "once missing, once refused: {}",
        d.log()
    );
    // Its own identity again: reported.
    cp.ginx_kubeconfig(&env.root.join("kubeconfig"), node);
    d.wait_status("reported", |s| s["kubernetes"]["reported"] == true);
}

#[test]
fn a_missing_namespace_is_named() {
    let Some(cp) = control_plane::shared() else {
        return;
    };
    let node = "no-namespace";
    let mut rbac = RbacGuard::new(cp);
    rbac.watch(node);
    // Allowed on leases everywhere (so the real API gets past authorization), pointed at a
    // namespace that does not exist.
    cp.apply(&format!(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\n\
         metadata: {{name: ginx-test-{node}}}\n\
         rules: [{{apiGroups: [coordination.k8s.io], resources: [leases], verbs: [get, create, update]}}]\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\n\
         metadata: {{name: ginx-test-{node}}}\n\
         roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: ginx-test-{node}}}\n\
         subjects: [{{apiGroup: rbac.authorization.k8s.io, kind: User, name: 'ginx:{node}'}}]\n"
    ));
    let env = Env::new();
    use_cluster(&env, cp, node, "namespace = \"ginx-absent\"");
    let d = env.start();
    let s = d.wait_status("the refusal", |s| s["kubernetes"]["state"] == "refused");
    let e = s["kubernetes"]["error"].as_str().unwrap();
    assert!(
        e.contains("namespaces \"ginx-absent\" not found") && e.contains("rbac.yaml"),
        "{e}"
    );
}

#[test]
fn without_a_kubeconfig_ginx_works_and_picks_it_up_later() {
    let Some(cp) = control_plane::shared() else {
        return;
    };
    let node = "late-kubeconfig";
    let mut rbac = RbacGuard::new(cp);
    rbac.watch(node);
    let env = Env::new();
    env.dropin("10-node.toml", &format!("[node]\nname = \"{node}\"\n"));
    let kc = env.root.join("kubeconfig");
    kube_dropin(&env, &kc, "");
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
    cp.ginx_kubeconfig(&kc, node);
    d.wait_status("connected", |s| s["kubernetes"]["state"] == "connected");
    wait_for("the lease", || {
        cp.lease("ginx-system", "ginx-late-kubeconfig")
    });
}

#[test]
fn the_api_going_away_does_not_stop_applies_and_current_values_follow_its_return() {
    let Some(bin) = control_plane::require() else {
        return;
    };
    // A control plane of its own: its API server is killed and started again.
    let cp = ControlPlane::start(&bin);
    let node = "api-restart";
    let mut rbac = RbacGuard::new(&cp);
    rbac.watch(node);
    let _kubelet = Kubelet::start(&cp, node, "worker");
    let env = Env::new();
    use_cluster(&env, &cp, node, "");
    // The apply in progress while the API server is killed.
    let release = env.root.join("release");
    env.stub("wait_for", &release.display().to_string());
    let d = env.start();
    wait_for("the first apply to start", || env.calls().first().cloned());
    d.wait_status("connected", |s| s["kubernetes"]["state"] == "connected");

    cp.kill_apiserver();
    let s = d.wait_status("unreachable", |s| s["kubernetes"]["state"] == "unreachable");
    assert!(s["kubernetes"]["since"].is_string());
    assert!(
        d.ctl_ok(&["status"])
            .contains("kubernetes unreachable since")
    );
    std::fs::write(&release, "").unwrap();
    // The API answered before this activation and does not now: the health gate holds the
    // revision (it could be what broke the network) until the API is back.
    let s = d.wait_status("the gate to hold on the API", |s| {
        s["apply"]["state"] == "verifying" && s["rollout"]["gate"]["failing"]["api"].is_string()
    });
    assert_eq!(s["rollout"]["lock"], "none", "{s:#}");
    let restarted = cp.audit_mark();
    cp.restart_apiserver();
    rbac.forgive(restarted, cp.audit_mark());
    d.wait_applied(&env.repo.head());

    // Gone before the next activation, the API is no regression of it: the apply goes ahead.
    cp.kill_apiserver();
    d.wait_status("unreachable again", |s| {
        s["kubernetes"]["state"] == "unreachable"
    });
    let next = env
        .repo
        .commit("away.nix", "{ }\n", "while the API is away");
    d.ctl_ok(&["sync"]);
    d.wait_applied(&next);

    let restarted = cp.audit_mark();
    cp.restart_apiserver();
    rbac.forgive(restarted, cp.audit_mark());
    d.wait_status("connected again", |s| {
        s["kubernetes"]["state"] == "connected"
    });
    wait_for("the current revision on the node", || {
        let n = cp.node(node)?;
        (n["metadata"]["annotations"]["ginx.io/applied-revision"] == next.as_str()).then_some(())
    });
    // One line each time it went, one each time it came back; not one per retry.
    let log = d.log();
    assert_eq!(log.matches("state=\"unreachable\"").count(), 2, "{log}");
}

#[test]
fn metrics_are_served_and_parse() {
    let Some(cp) = control_plane::shared() else {
        return;
    };
    let node = "metrics";
    let mut rbac = RbacGuard::new(cp);
    rbac.watch(node);
    let env = Env::new();
    use_cluster(&env, cp, node, "");
    env.dropin("90-metrics.toml", "[metrics]\nlisten = \"127.0.0.1:0\"\n");
    let d = env.start();
    d.wait_applied(&env.repo.head());
    wait_for("the lease", || cp.lease("ginx-system", "ginx-metrics"));
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

/// Fails unless the ginx whose status is `status` serves
/// `ginx_rollout_waiting{waiting_for="<waiting_for>"} 1`.
pub(crate) fn assert_waiting_metric(status: &Value, waiting_for: &str) {
    let scraped = scrape(status["metrics_listen"].as_str().expect("metrics_listen"));
    let want = format!("ginx_rollout_waiting{{waiting_for=\"{waiting_for}\"}} 1");
    assert!(scraped.lines().any(|l| l == want), "{want} in\n{scraped}");
}

pub(crate) fn scrape(addr: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    support::sweep::collect_deduplicated(
        "metrics",
        &format!("GET {addr}/metrics"),
        &[out.as_bytes()],
    );
    let (head, body) = out.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    // hyper may use chunked encoding; the body's lines are what matter.
    body.lines()
        .filter(|l| l.starts_with('#') || l.starts_with("ginx_"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The stand-in kubelet itself (support/kubelet.rs) on the real controllers: its node is Ready
/// while it runs, pods bound to it run and are finalized when deleted, readiness follows
/// `set_ready`, and once stopped the node lifecycle controller marks the node Unknown, as for a
/// dead kubelet.
#[test]
fn the_stand_in_kubelet_keeps_its_node_ready_and_a_stopped_one_goes_unknown() {
    let Some(cp) = control_plane::shared() else {
        return;
    };
    let node = "kubelet-check";
    let mut kubelet = Kubelet::start(cp, node, "control-plane");
    let ready = || -> Option<Value> {
        cp.node(node)?["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == "Ready")
            .cloned()
    };
    let n = cp.node(node).unwrap();
    assert!(n["metadata"]["labels"]["node-role.kubernetes.io/control-plane"].is_string());

    let pod = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: on-{node}, namespace: default}}\n\
         spec: {{nodeName: {node}, containers: [{{name: app, image: stand-in}}]}}\n"
    );
    // The namespace's default ServiceAccount comes from the controller manager, soon after start.
    wait_for("the pod created", || {
        cp.kubectl_stdin_output(&["create", "-f", "-"], &pod)
            .status
            .success()
            .then_some(())
    });
    let path = format!("/api/v1/namespaces/default/pods/on-{node}");
    wait_for("the pod Running and Ready", || {
        let p = cp.get_path(&path)?;
        let ready = p["status"]["conditions"]
            .as_array()?
            .iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True");
        (p["status"]["phase"] == "Running" && ready).then_some(())
    });
    cp.kubectl(&[
        "delete",
        "pod",
        &format!("on-{node}"),
        "-n",
        "default",
        "--wait=false",
    ]);
    wait_for("the pod finalized", || {
        cp.get_path(&path).is_none().then_some(())
    });

    kubelet.set_ready(false);
    let c = wait_for("Ready False", || ready().filter(|c| c["status"] == "False"));
    assert_eq!(c["reason"], "KubeletNotReady");
    kubelet.set_ready(true);
    wait_for("Ready True", || ready().filter(|c| c["status"] == "True"));

    kubelet.stop();
    let c = wait_for("Ready Unknown, from the node lifecycle controller", || {
        ready().filter(|c| c["status"] == "Unknown")
    });
    assert_eq!(c["reason"], "NodeStatusUnknown");
}

// What a real server cannot be made to do on cue, against the stand-in API server.

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

/// An unreachable kubelet or Cilium is `unknown` ("no cluster yet") on a machine
/// that is not a Kubernetes node, `failed` once it is (the marker kubeadm writes exists); a
/// kubelet that answers badly is `failed` either way.
#[test]
fn unreachable_components_are_unknown_before_the_cluster_and_failed_on_a_node() {
    let env = Env::new();
    let marker = env.root.join("kubelet.conf");
    // Nothing listens on the kubelet's port: a port that was just free.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    env.dropin(
        "80-probes.toml",
        &format!(
            "[health]\ninterval = \"200ms\"\nnode_marker = \"{}\"\n\
             [health.kubelet]\nenabled = true\nurl = \"http://127.0.0.1:{port}/healthz\"\n\
             [health.cilium]\nenabled = true\nsocket = \"{}\"\nfallback_url = \"http://127.0.0.1:{port}/healthz\"\n",
            marker.display(),
            env.root.join("no-cilium.sock").display()
        ),
    );
    let d = env.start();
    let s = d.wait_status("both probes unknown", |s| {
        s["health"]["kubelet"]["status"] == "unknown"
            && s["health"]["cilium"]["status"] == "unknown"
    });
    for p in ["kubelet", "cilium"] {
        let m = s["health"][p]["message"].as_str().unwrap();
        assert!(m.starts_with("no cluster yet ("), "{p}: {m}");
    }
    assert_ne!(s["health_overall"], "failed");
    // kubeadm made this machine a node: the same probes are failed now.
    std::fs::write(&marker, "apiVersion: v1\nkind: Config\n").unwrap();
    d.wait_status("both probes failed", |s| {
        s["health"]["kubelet"]["status"] == "failed" && s["health"]["cilium"]["status"] == "failed"
    });
    d.stop();
}
