//! Least privilege: one node's stolen credentials reach that node, not the fleet.
//!
//! An attacker who owns lucy holds both of her identities: ginx's own (`ginx:lucy`, group
//! `ginx:nodes`, granted by rbac.yaml and narrowed by vap.yaml) and the node's
//! (`system:node:lucy`, the kubelet's, scoped by the Node authorizer and NodeRestriction). With
//! each, against a private real control plane with rbac.yaml and vap.yaml in force, every attack
//! of the issue is tried with the real kubectl: each must be refused by the API server (its
//! message is printed, a table for the docs), and nothing may change on makise, quinn, their
//! Leases, the ConfigMap or makise's pod. The same requests for lucy's own things are made too
//! and must succeed, so that a refusal is the scoping's, not a broken identity's.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::control_plane::{self, ControlPlane};
use crate::support::kubelet::Kubelet;
use crate::support::wait_for;

const NS: &str = "ginx-system";
const APPS: &str = "apps";
const REV: &str = "1111111111111111111111111111111111111111";

/// The Lease or ConfigMap `name` in ginx-system as admin sees it.
fn get(cp: &ControlPlane, kind: &str, name: &str) -> Value {
    let out = cp.kubectl(&[
        "-n",
        NS,
        "get",
        kind,
        name,
        "-o",
        "json",
        "--show-managed-fields",
    ]);
    serde_json::from_str(&out).unwrap()
}

fn micro(t: jiff::Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()
}

fn lease(name: &str, holder: &str, seconds: i64, renewed: jiff::Timestamp) -> Value {
    json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": seconds,
            "acquireTime": micro(renewed), "renewTime": micro(renewed)}})
}

/// What must not change: the parts of makise, quinn, the Leases, the ConfigMap and makise's
/// pod an attack would move.
fn snapshot(cp: &ControlPlane) -> Value {
    let node = |n: &str| {
        let v = cp.node(n).unwrap();
        let conditions: Vec<Value> = v["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| matches!(c["type"].as_str(), Some("Ready" | "GinxHealthy")))
            .map(|c| json!([c["type"], c["status"], c["reason"]]))
            .collect();
        json!({"spec": v["spec"], "labels": v["metadata"]["labels"],
            "annotations": v["metadata"]["annotations"], "conditions": conditions,
            "addresses": v["status"]["addresses"]})
    };
    let pod = cp.get_path(&format!("/api/v1/namespaces/{APPS}/pods/web-makise"));
    json!({
        "makise": node("makise"),
        "quinn": node("quinn"),
        "heartbeat": get(cp, "lease", "ginx-makise")["spec"],
        "slot": get(cp, "lease", "ginx-rollout-workers-0")["spec"],
        "no ghost": cp.lease(NS, "ginx-ghost").is_none(),
        "no forged slots": cp.lease(NS, "ginx-rollout-workers-1").is_none()
            && cp.lease(NS, "ginx-rollout-workers-2").is_none(),
        "configmap": get(cp, "configmap", "ginx-rollout")["data"],
        "no other configmap": cp.get_path(&format!("/api/v1/namespaces/{NS}/configmaps/evil")).is_none(),
        "pod": pod.map(|p| json!([p["metadata"]["uid"], p["metadata"]["deletionTimestamp"]])),
    })
}

struct Attack {
    what: &'static str,
    args: Vec<String>,
    input: String,
}

fn attack(what: &'static str, args: &[&str], input: &str) -> Attack {
    Attack {
        what,
        args: args.iter().map(|s| (*s).to_owned()).collect(),
        input: input.to_owned(),
    }
}

/// A strategic-merge PATCH of node `node` (its `status` subresource when `status`) with the
/// body `input`, sent straight, as ginx and a script would (kubectl reads the object first,
/// which a node may not do for another node, and would hide the PATCH).
fn patch_node(kubeconfig: &Path, node: &str, status: bool, input: &str) -> Result<String, String> {
    use k8s_openapi::api::core::v1::Node;
    use kube::api::{Api, Patch, PatchParams};
    let body: Value = serde_json::from_str(input).unwrap();
    let kubeconfig = kubeconfig.to_owned();
    let node = node.to_owned();
    crate::support::kubelet::runtime().block_on(async move {
        let client = crate::support::kubelet::client(&kubeconfig).await;
        let api: Api<Node> = Api::all(client);
        let pp = PatchParams::default();
        let r = if status {
            api.patch_status(&node, &pp, &Patch::Strategic(&body)).await
        } else {
            api.patch(&node, &pp, &Patch::Strategic(&body)).await
        };
        match r {
            Ok(_) => Ok(String::new()),
            Err(kube::Error::Api(e)) => {
                Err(format!("PATCH {} ({}): {}", e.code, e.reason, e.message))
            }
            Err(e) => Err(format!("not an answer of the API server: {e}")),
        }
    })
}

/// Runs `args` with `kubeconfig` (`["PATCH", node, "status" or ""]` goes to [`patch_node`]);
/// `Ok(stdout)` or `Err(the server's message)`.
fn as_(cp: &ControlPlane, kubeconfig: &Path, args: &[&str], input: &str) -> Result<String, String> {
    if args[0] == "PATCH" {
        return patch_node(kubeconfig, args[1], args[2] == "status", input);
    }
    let out = cp.kubectl_as(kubeconfig, args, input);
    let err = String::from_utf8_lossy(&out.stderr).trim().to_owned();
    // `kubectl cordon` says "error: unable to cordon node" and still exits 0.
    if out.status.success() && !err.contains("error:") {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(err)
    }
}

fn ok(cp: &ControlPlane, kubeconfig: &Path, what: &str, args: &[&str], input: &str) -> String {
    as_(cp, kubeconfig, args, input)
        .unwrap_or_else(|e| panic!("lucy's own {what} was refused: {e}"))
}

#[test]
fn a_stolen_node_credential_reaches_one_node_not_the_fleet() {
    let Some(bin) = control_plane::require() else {
        return;
    };
    let cp = ControlPlane::start(&bin);
    let _kubelets: Vec<Kubelet> = ["lucy", "makise", "quinn"]
        .iter()
        .map(|n| Kubelet::start(&cp, n, "worker"))
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let kc = |name: &str| -> PathBuf { dir.path().join(name) };
    // Lucy's two identities; makise's and quinn's ginx identities write their own things.
    cp.ginx_kubeconfig(&kc("lucy"), "lucy");
    let lucy_node = control_plane::node_kubeconfig(&kc("lucy"));
    for n in ["makise", "quinn"] {
        cp.kubeconfig_for(&kc(n), &format!("ginx:{n}"), &["ginx:nodes"]);
    }
    let now = jiff::Timestamp::now();

    // The fleet as it stands: quinn cordoned by an admin, makise annotated by its ginx, its
    // heartbeat and quinn's live slot written by their own identities, a halt and a pause,
    // a pod with a secret in its environment on makise and one on lucy under a budget.
    cp.kubectl(&["cordon", "quinn"]);
    cp.kubectl(&["annotate", "node", "makise", "ginx.io/health=ok"]);
    for (who, object) in [
        ("makise", lease("ginx-makise", "makise", 40, now)),
        ("quinn", lease("ginx-rollout-workers-0", "quinn", 3600, now)),
    ] {
        as_(
            &cp,
            &kc(who),
            &["create", "-f", "-", "--field-manager=ginx"],
            &object.to_string(),
        )
        .unwrap_or_else(|e| panic!("{who}'s own Lease: {e}"));
    }
    let halt = json!({"revision": REV, "node": "makise", "probes": {"kubelet": "failed"},
        "reason": "health gate failed", "at": "2026-12-01T10:00:00Z", "cause": "gate-failed"});
    cp.apply(
        &json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "ginx-rollout", "namespace": NS},
            "data": {format!("halted.{REV}"): halt.to_string(),
                "paused": json!({"by": "alice@makise", "at": "2026-12-01T10:00:00Z"}).to_string(),
                "plan.op1": json!({"ref": "kernel", "by": "alice", "at": "2026-12-01T10:00:00Z"}).to_string(),
                "held.lucy": json!({"by": "ann", "at": "2026-12-01T10:00:00Z", "reason": "disk failing"}).to_string()}})
        .to_string(),
    );
    crate::support::reboot::namespace(&cp, APPS);
    for n in ["lucy", "makise"] {
        cp.apply(
            &json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": format!("web-{n}"), "namespace": APPS, "labels": {"app": "web"}},
                "spec": {"nodeName": n, "containers": [{"name": "c", "image": "registry.invalid/web:1",
                    "env": [{"name": "API_TOKEN", "value": "s3cr3t-literal"}]}]}})
            .to_string(),
        );
    }
    cp.apply(
        &json!({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": "web", "namespace": APPS},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}}})
        .to_string(),
    );
    wait_for("the budget allowing one disruption", || {
        let b = cp.get_path(&format!(
            "/apis/policy/v1/namespaces/{APPS}/poddisruptionbudgets/web"
        ))?;
        (b["status"]["disruptionsAllowed"] == 1).then_some(())
    });
    // The controller-manager taints the cordoned node: let it, before looking.
    wait_for("quinn's unschedulable taint", || {
        let n = cp.node("quinn")?;
        n["spec"]["taints"]
            .as_array()?
            .iter()
            .any(|t| t["key"] == "node.kubernetes.io/unschedulable")
            .then_some(())
    });
    let before = snapshot(&cp);

    // The objects to forge, as read.
    let heartbeat = get(&cp, "lease", "ginx-makise");
    let slot = get(&cp, "lease", "ginx-rollout-workers-0");
    let cm = get(&cp, "configmap", "ginx-rollout");
    let mut forged_heartbeat = heartbeat.clone();
    forged_heartbeat["spec"]["renewTime"] = json!(micro(jiff::Timestamp::now()));
    forged_heartbeat["spec"]["holderIdentity"] = json!("lucy");
    // Makise's heartbeat as makise wrote it, with a plan forged on it (ginx.io/plan): what
    // another node's operators would read as makise's next disruption.
    let mut forged_plan = heartbeat.clone();
    forged_plan["metadata"]["annotations"]["ginx.io/plan"] =
        json!(json!({"revision": REV, "action": "none"}).to_string());
    let mut stolen = slot.clone();
    stolen["spec"]["holderIdentity"] = json!("lucy");
    stolen["spec"]["renewTime"] = json!(micro(jiff::Timestamp::now()));
    // The same, its stored write times forged back to 2000 (the policy reads them).
    let mut forged_times = stolen.clone();
    for e in forged_times["metadata"]["managedFields"]
        .as_array_mut()
        .unwrap()
    {
        e["time"] = json!("2000-01-01T00:00:00Z");
    }
    let mut released = slot.clone();
    released["spec"]
        .as_object_mut()
        .unwrap()
        .remove("holderIdentity");
    let mut cleared = cm.clone();
    cleared["data"]
        .as_object_mut()
        .unwrap()
        .remove(&format!("halted.{REV}"));
    let mut resumed = cm.clone();
    resumed["data"].as_object_mut().unwrap().remove("paused");
    let mut asked = cm.clone();
    asked["data"]["plan.evil1"] =
        json!(json!({"ref": "evil", "by": "lucy", "at": "2026-12-01T10:00:00Z"}).to_string());
    let mut unasked = cm.clone();
    unasked["data"].as_object_mut().unwrap().remove("plan.op1");
    // Holds: lucy may not hold makise, nor lift or change her own.
    let mut hold_other = cm.clone();
    hold_other["data"]["held.makise"] =
        json!(json!({"by": "lucy", "at": "2026-12-01T10:00:00Z"}).to_string());
    let mut lift_own = cm.clone();
    lift_own["data"]
        .as_object_mut()
        .unwrap()
        .remove("held.lucy");
    let mut stretch_own = cm.clone();
    stretch_own["data"]["held.lucy"] = json!(
        json!({"by": "ann", "at": "2026-12-01T10:00:00Z", "reason": "disk failing",
            "until": "2026-12-01T10:00:01Z"})
        .to_string()
    );
    let far = jiff::Timestamp::from_second(4_102_444_800).unwrap(); // 2100-01-01
    let ahead = now + jiff::SignedDuration::from_mins(5);
    let eviction = |pod: &str| {
        json!({"apiVersion": "policy/v1", "kind": "Eviction",
            "metadata": {"name": pod, "namespace": APPS}})
        .to_string()
    };
    let status = |patch: Value| patch.to_string();
    let condition = |t: &str| {
        status(
            json!({"status": {"conditions": [{"type": t, "status": "False",
            "reason": "Forged", "message": "forged by lucy",
            "lastTransitionTime": "2026-12-01T10:00:00Z"}]}}),
        )
    };
    let replace = ["replace", "-f", "-", "--field-manager=ginx"];
    let create = ["create", "-f", "-", "--field-manager=ginx"];
    let attacks = [
        attack(
            "cordon makise",
            &["PATCH", "makise", ""],
            r#"{"spec":{"unschedulable":true}}"#,
        ),
        attack(
            "uncordon quinn, cordoned by an admin",
            &["PATCH", "quinn", ""],
            r#"{"spec":{"unschedulable":false}}"#,
        ),
        attack(
            "taint makise NoExecute",
            &["PATCH", "makise", ""],
            r#"{"spec":{"taints":[{"key":"evil","value":"1","effect":"NoExecute"}]}}"#,
        ),
        attack(
            "label makise",
            &["PATCH", "makise", ""],
            r#"{"metadata":{"labels":{"evil":"1"}}}"#,
        ),
        attack(
            "rewrite makise's ginx.io/ annotations",
            &["PATCH", "makise", ""],
            r#"{"metadata":{"annotations":{"ginx.io/health":"failed"}}}"#,
        ),
        attack(
            "forge makise's GinxHealthy",
            &["PATCH", "makise", "status"],
            &condition("GinxHealthy"),
        ),
        attack(
            "forge makise's Ready=False",
            &["PATCH", "makise", "status"],
            &condition("Ready"),
        ),
        attack(
            "move makise's status.addresses",
            &["PATCH", "makise", "status"],
            &status(
                json!({"status": {"addresses": [{"type": "InternalIP", "address": "10.9.9.9"}]}}),
            ),
        ),
        attack(
            "forge makise's heartbeat",
            &replace,
            &forged_heartbeat.to_string(),
        ),
        attack(
            "write a plan on makise's heartbeat",
            &replace,
            &forged_plan.to_string(),
        ),
        attack(
            "create a heartbeat for a node that does not exist",
            &create,
            &lease("ginx-ghost", "ghost", 40, now).to_string(),
        ),
        attack("steal quinn's live slot", &replace, &stolen.to_string()),
        attack(
            "steal quinn's live slot, managedFields times forged",
            &replace,
            &forged_times.to_string(),
        ),
        attack(
            "the same with another field manager",
            &["replace", "-f", "-", "--field-manager=evil"],
            &forged_times.to_string(),
        ),
        attack("release quinn's live slot", &replace, &released.to_string()),
        attack(
            "create a slot renewed in 2100",
            &create,
            &lease("ginx-rollout-workers-1", "lucy", 60, far).to_string(),
        ),
        attack(
            "create a slot renewed 5 min ahead",
            &create,
            &lease("ginx-rollout-workers-2", "lucy", 60, ahead).to_string(),
        ),
        attack(
            "clear a halted revision",
            &["replace", "-f", "-"],
            &cleared.to_string(),
        ),
        attack(
            "resume the paused fleet",
            &["replace", "-f", "-"],
            &resumed.to_string(),
        ),
        attack(
            "write a plan request",
            &["replace", "-f", "-"],
            &asked.to_string(),
        ),
        attack(
            "remove an operator's plan request",
            &["replace", "-f", "-"],
            &unasked.to_string(),
        ),
        attack("place a hold on makise", &replace, &hold_other.to_string()),
        attack("lift its own hold", &replace, &lift_own.to_string()),
        attack("shorten its own hold", &replace, &stretch_own.to_string()),
        attack(
            "create another ConfigMap in ginx-system",
            &[
                "-n",
                NS,
                "create",
                "configmap",
                "evil",
                "--field-manager=ginx",
            ],
            "",
        ),
        attack(
            "evict makise's pod",
            &[
                "create",
                "--raw",
                &format!("/api/v1/namespaces/{APPS}/pods/web-makise/eviction"),
                "-f",
                "-",
            ],
            &eviction("web-makise"),
        ),
        attack(
            "read every pod's environment",
            &["get", "pods", "-A", "-o", "json"],
            "",
        ),
        attack(
            "read makise's pod",
            &["-n", APPS, "get", "pod", "web-makise", "-o", "json"],
            "",
        ),
        attack("read Secrets", &["get", "secrets", "-A"], ""),
        attack(
            "delete makise's heartbeat",
            &["-n", NS, "delete", "lease", "ginx-makise"],
            "",
        ),
    ];
    let mut table = Vec::new();
    for a in &attacks {
        for (identity, path) in [
            ("ginx:lucy", kc("lucy")),
            ("system:node:lucy", lucy_node.clone()),
        ] {
            let args: Vec<&str> = a.args.iter().map(String::as_str).collect();
            match as_(&cp, &path, &args, &a.input) {
                Ok(out) => {
                    let again = cp.kubectl_as(&path, &[&["-v=6"][..], &args].concat(), &a.input);
                    panic!(
                        "{identity} could {}: {out}\n{}",
                        a.what,
                        String::from_utf8_lossy(&again.stderr)
                    )
                }
                Err(e) => {
                    assert!(
                        e.contains("Forbidden") || e.contains("forbidden"),
                        "{identity}, {}: refused, but not by authorization or admission: {e}",
                        a.what
                    );
                    let message = e.lines().last().unwrap_or("").to_owned();
                    table.push(format!(
                        "| {} | {identity} | {} |",
                        a.what,
                        message.replace('|', "/")
                    ));
                }
            }
        }
    }
    println!(
        "| attack | identity | the API server's answer |\n|---|---|---|\n{}",
        table.join("\n")
    );
    assert_eq!(snapshot(&cp), before, "an attack changed something");
    for what in [
        "place a hold on makise",
        "lift its own hold",
        "shorten its own hold",
    ] {
        let row = format!("| {what} | ginx:lucy |");
        assert!(
            table
                .iter()
                .any(|l| l.starts_with(&row)
                    && l.contains("holds are placed and lifted by operators")),
            "{what}: refused by the hold rule: {table:#?}"
        );
    }
    for what in ["write a plan request", "remove an operator's plan request"] {
        let row = format!("| {what} | ginx:lucy |");
        assert!(
            table.iter().any(|l| l.starts_with(&row)
                && l.contains("plan requests are written by operators (ginxctl plan)")),
            "{what}: refused by the plan-request rule: {table:#?}"
        );
    }

    // Node Events: ginx's identity writes Events only about its own Node, as itself
    // (the kubelet's identity may write any node's Events: that is the Node authorizer's, not
    // ginx's, so only ginx:lucy is tried).
    let event = |name: &str, regarding: &str, instance: &str, api: &str| {
        let mut e = json!({"apiVersion": api, "kind": "Event",
            "metadata": {"name": name, "namespace": "default"},
            "eventTime": "2026-12-01T10:00:00.000000Z", "action": "Rollout",
            "reason": "RevisionHalted", "note": "forged by lucy", "type": "Warning",
            "regarding": {"apiVersion": "v1", "kind": "Node", "name": regarding, "uid": regarding},
            "reportingController": "ginx.io/ginx", "reportingInstance": instance});
        if api == "v1" {
            let o = e.as_object_mut().unwrap();
            let regarding = o.remove("regarding").unwrap();
            o.insert("involvedObject".into(), regarding);
            o.insert("message".into(), o["note"].clone());
            o.remove("note");
        }
        e.to_string()
    };
    for (what, body) in [
        (
            "write an Event about makise",
            event("makise.forged1", "makise", "lucy", "events.k8s.io/v1"),
        ),
        (
            "write an Event about itself reported as makise",
            event("lucy.forged2", "lucy", "makise", "events.k8s.io/v1"),
        ),
        (
            "write a core/v1 Event about makise",
            event("makise.forged3", "makise", "lucy", "v1"),
        ),
    ] {
        let e = as_(&cp, &kc("lucy"), &create, &body)
            .map(|out| panic!("ginx:lucy could {what}: {out}"))
            .unwrap_err();
        assert!(e.contains("orbidden"), "{what}: {e}");
        println!(
            "| {what} | ginx:lucy | {} |",
            e.lines().last().unwrap_or("").replace('|', "/")
        );
    }
    ok(
        &cp,
        &kc("lucy"),
        "Event",
        &create,
        &event("lucy.own", "lucy", "lucy", "events.k8s.io/v1"),
    );

    // Lucy's own things, with the identity meant for each: allowed.
    for (what, status, body) in [
        (
            "annotation",
            false,
            r#"{"metadata":{"annotations":{"ginx.io/health":"ok"}}}"#.to_owned(),
        ),
        (
            "cordon",
            false,
            r#"{"spec":{"unschedulable":true}}"#.to_owned(),
        ),
        (
            "uncordon",
            false,
            r#"{"spec":{"unschedulable":false}}"#.to_owned(),
        ),
        ("GinxHealthy", true, condition("GinxHealthy")),
    ] {
        patch_node(&lucy_node, "lucy", status, &body)
            .unwrap_or_else(|e| panic!("lucy's own {what} was refused: {e}"));
    }
    let listed = ok(
        &cp,
        &lucy_node,
        "pods",
        &[
            "get",
            "pods",
            "-A",
            "--field-selector=spec.nodeName=lucy",
            "-o",
            "name",
        ],
        "",
    );
    assert_eq!(listed.trim(), "pod/web-lucy");
    ok(
        &cp,
        &lucy_node,
        "eviction under the budget",
        &[
            "create",
            "--raw",
            &format!("/api/v1/namespaces/{APPS}/pods/web-lucy/eviction"),
            "-f",
            "-",
        ],
        &eviction("web-lucy"),
    );
    let mut own = lease("ginx-lucy", "lucy", 40, jiff::Timestamp::now());
    own["metadata"]["annotations"] = json!({"ginx.io/plan":
        json!({"revision": REV, "action": "drain", "because": ["restarts containerd.service"]})
            .to_string()});
    ok(
        &cp,
        &kc("lucy"),
        "heartbeat with its plan",
        &create,
        &own.to_string(),
    );
    ok(
        &cp,
        &kc("lucy"),
        "free slot",
        &create,
        &lease("ginx-rollout-workers-3", "lucy", 60, jiff::Timestamp::now()).to_string(),
    );
    let mut halted = cm.clone();
    halted["data"][format!("halted.{}", "2".repeat(40))] = json!(
        json!({"revision": "2".repeat(40), "node": "lucy", "probes": {}, "reason": "r",
            "at": "2026-12-02T10:00:00Z", "cause": "gate-failed"})
        .to_string()
    );
    ok(
        &cp,
        &kc("lucy"),
        "new halt",
        &["replace", "-f", "-"],
        &halted.to_string(),
    );

    // A dead holder's slot is taken over through the policy once it expired by the server's
    // clock: refused before, allowed after.
    as_(
        &cp,
        &kc("quinn"),
        &create,
        &lease("ginx-rollout-workers-4", "quinn", 5, jiff::Timestamp::now()).to_string(),
    )
    .unwrap();
    let take = || {
        let mut s = get(&cp, "lease", "ginx-rollout-workers-4");
        s["spec"]["holderIdentity"] = json!("lucy");
        s["spec"]["renewTime"] = json!(micro(jiff::Timestamp::now()));
        as_(&cp, &kc("lucy"), &replace, &s.to_string())
    };
    let e = take().unwrap_err();
    assert!(
        e.contains("has not expired by the API server's clock"),
        "{e}"
    );
    // Once the server's stamp is older than the duration (seconds, by its clock; whole-second
    // stamps): tried until it is, never before.
    let taken = wait_for("the expired slot taken over", || {
        std::thread::sleep(Duration::from_millis(500));
        take().ok()
    });
    assert!(!taken.is_empty());
    assert_eq!(
        get(&cp, "lease", "ginx-rollout-workers-4")["spec"]["holderIdentity"],
        "lucy"
    );
}
