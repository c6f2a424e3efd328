//! The fleet commands — `ginxctl rollout pause|resume|clear` and `ginxctl cluster` — against the
//! real control plane (tests/support/control_plane.rs) with ginx's own identities.
//!
//! The `ginx-rollout` ConfigMap is one object per namespace, and the control plane is shared by
//! every test of the binary: a test that paused the fleet in `ginx-system` would hold back
//! everybody else's applies. So each test here runs its ginx in a namespace of its own, with
//! the namespaced Roles and RoleBindings of packaging/kubernetes/rbac.yaml copied into it
//! unchanged but for the namespace — the permissions are still exactly rbac.yaml's, and an
//! [`RbacGuard`] fails the test on any 403 to ginx.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

use crate::support::control_plane::{self, ControlPlane, RbacGuard};
use crate::support::daemon::Daemon;
use crate::support::kubelet::Kubelet;
use crate::support::test_fleet::{NodeToml, use_cluster};
use crate::support::{self, Env, wait_for};

const REV_A: &str = "aaaaaaaa11111111111111111111111111111111";
const REV_B: &str = "aaaaaaaa22222222222222222222222222222222";

/// Creates `namespace` with the Roles and RoleBindings that rbac.yaml puts in ginx-system
/// (but the RoleBindings named in `without`), and waits until the API server authorizes by
/// them.
fn namespace_like_ginx_system(cp: &ControlPlane, namespace: &str, without: &[&str]) {
    let rbac = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/kubernetes/rbac.yaml"),
    )
    .unwrap();
    let mut docs = vec![format!(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {namespace}\n"
    )];
    for doc in rbac.split("\n---\n") {
        let left_out = without.iter().any(|b| {
            doc.contains("kind: RoleBinding\n") && doc.contains(&format!("\n  name: {b}\n"))
        });
        if doc.contains("\n  namespace: ginx-system\n") && !left_out {
            docs.push(doc.replace(
                "\n  namespace: ginx-system\n",
                &format!("\n  namespace: {namespace}\n"),
            ));
        }
    }
    assert!(
        docs.len() >= 5 - without.len(),
        "rbac.yaml's ginx-system Roles and bindings: {docs:?}"
    );
    cp.apply(&docs.join("\n---\n"));
    // Authorization follows new bindings through a cache: wait until it has them.
    let allowed = |verb: &str, what: &str| {
        let out = cp.kubectl_output(&[
            "auth",
            "can-i",
            verb,
            what,
            "-n",
            namespace,
            "--as=ginx:probe",
            "--as-group=ginx:nodes",
        ]);
        String::from_utf8_lossy(&out.stdout).trim() == "yes"
    };
    wait_for("the copied bindings in effect", || {
        let rollout = !without.contains(&"ginx-rollout");
        (allowed("update", "leases") && (!rollout || allowed("update", "configmaps/ginx-rollout")))
            .then_some(())
    });
}

/// A ginx for `node` in `namespace`, connected, whose control group is `users` (so that a
/// member who is not root can be tried).
fn start_node(cp: &ControlPlane, node: &str, role: &str, namespace: &str) -> (Env, Daemon) {
    let env = Env::new();
    use_cluster(&env, cp, node, &format!("namespace = \"{namespace}\""));
    NodeToml::new()
        .set("node.name", node)
        .set("node.role", role)
        .write(&env, "10-node.toml");
    NodeToml::new()
        .set("control.group", "users")
        .write(&env, "20-control.toml");
    let d = env.start();
    d.wait_status("connected", |s| s["kubernetes"]["state"] == "connected");
    (env, d)
}

/// Lets any user reach `env`'s socket, as an operator who widened its mode would.
fn open_socket_to_everyone(env: &Env) {
    for dir in env
        .socket
        .ancestors()
        .skip(1)
        .take_while(|p| p.starts_with(&env.root))
    {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    std::fs::set_permissions(&env.socket, std::fs::Permissions::from_mode(0o666)).unwrap();
}

/// Whether ginxctl can be run as `nobody`, in the group `users` or not (root, setpriv, the
/// groups nogroup and users); in CI it must.
fn can_run_as_nobody() -> bool {
    if !support::require("setpriv") {
        return false;
    }
    let group = |g: &str| nix::unistd::Group::from_name(g).ok().flatten().is_some();
    if !(nix::unistd::geteuid().is_root() && group("nogroup") && group("users")) {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI runs as root on Debian, which has the groups nogroup and users"
        );
        eprintln!("SKIPPED: needs root and the groups nogroup and users to run ginxctl as nobody");
        return false;
    }
    true
}

/// `ginxctl --socket <env's> ARGS` as nobody, with `users` as a supplementary group or not.
fn as_nobody(env: &Env, member: bool, args: &[&str]) -> Output {
    let mut c = Command::new("setpriv");
    c.args(["--reuid=nobody", "--regid=nogroup"]);
    if member {
        c.arg("--groups=users");
    } else {
        c.arg("--clear-groups");
    }
    let out = c
        .arg(support::ginxctl_bin())
        .arg("--socket")
        .arg(&env.socket)
        .args(["--timeout", "90s"])
        .args(args)
        .env_remove("GINX_SOCKET")
        .output()
        .unwrap();
    support::sweep::collect_ctl(args, &out);
    out
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn configmap(cp: &ControlPlane, namespace: &str) -> Option<Value> {
    cp.get_path(&format!(
        "/api/v1/namespaces/{namespace}/configmaps/ginx-rollout"
    ))
}

/// The JSON value of `key` in the ConfigMap's data.
fn data_json(cm: &Value, key: &str) -> Option<Value> {
    serde_json::from_str(cm["data"][key].as_str()?).ok()
}

fn cluster_json(d: &Daemon) -> Value {
    serde_json::from_str(&d.ctl_ok(&["cluster", "--json"])).unwrap()
}

fn node_in<'a>(view: &'a Value, name: &str) -> Option<&'a Value> {
    view["nodes"].as_array()?.iter().find(|n| n["name"] == name)
}

#[test]
fn a_fleet_pause_by_a_group_member_is_seen_on_every_node_and_refused_to_others() {
    let Some(cp) = control_plane::shared() else {
        return;
    };
    if !can_run_as_nobody() {
        return;
    }
    let (ns, cp_node, worker) = ("fleet-pause", "fleet-pause-cp", "fleet-pause-w");
    namespace_like_ginx_system(cp, ns, &[]);
    let mut rbac = RbacGuard::new(cp);
    rbac.watch(cp_node);
    rbac.watch(worker);
    let _k1 = Kubelet::start(cp, cp_node, "control-plane");
    let _k2 = Kubelet::start(cp, worker, "worker");
    let (env_a, a) = start_node(cp, cp_node, "control-plane", ns);
    let (env_b, b) = start_node(cp, worker, "worker", ns);
    open_socket_to_everyone(&env_a);

    // A member of control.group who is not root pauses; the ConfigMap says who and when.
    let out = as_nobody(&env_a, true, &["rollout", "pause"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("paused the rollout fleet-wide"),
        "{}",
        text(&out.stdout)
    );
    let cm = configmap(cp, ns).expect("the ConfigMap, created by the pause");
    let paused = data_json(&cm, "paused").expect("a paused key of JSON");
    assert_eq!(paused["by"], "nobody@fleet-pause-cp");
    let at: jiff::Timestamp = paused["at"].as_str().unwrap().parse().unwrap();
    let events = data_json(&cm, "events").unwrap();
    assert_eq!(events[0]["by"], "nobody@fleet-pause-cp");
    assert_eq!(events[0]["action"], "pause");
    assert_eq!(events[0]["at"], paused["at"]);
    let log = a.log();
    assert!(
        log.contains("rollout paused fleet-wide") && log.contains("nobody@fleet-pause-cp"),
        "logged with who:\n{log}"
    );

    // The other node sees the pause and both nodes.
    let view = wait_for("both nodes in the view from the worker", || {
        let v = cluster_json(&b);
        (node_in(&v, cp_node).is_some() && node_in(&v, worker).is_some()).then_some(v)
    });
    assert_eq!(view["fleet"]["paused"]["by"], "nobody@fleet-pause-cp");
    assert_eq!(
        view["fleet"]["paused"]["at"]
            .as_str()
            .unwrap()
            .parse::<jiff::Timestamp>()
            .unwrap(),
        at
    );
    assert_eq!(node_in(&view, cp_node).unwrap()["role"], "control-plane");
    assert_eq!(node_in(&view, cp_node).unwrap()["ready"], true);
    // Pausing again changes nothing and says who paused first.
    let again = b.ctl_ok(&["rollout", "pause"]);
    assert!(
        again.starts_with("already paused by nobody@fleet-pause-cp since "),
        "{again}"
    );

    // Outside the group: the view is there to read, every change is refused and nothing is
    // written.
    let version = configmap(cp, ns).unwrap()["metadata"]["resourceVersion"].clone();
    let out = as_nobody(&env_a, false, &["cluster"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let out = as_nobody(&env_a, false, &["rollout", "pause"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(
        err.contains("is refused for uid 65534")
            && err.contains("needs root or membership in group \"users\""),
        "{err}"
    );
    // Lifting is an operator's act with their own credentials: without any, nothing is asked.
    for cmd in [&["rollout", "resume"][..], &["rollout", "clear", REV_A]] {
        let out = as_nobody(&env_a, true, cmd);
        assert_eq!(out.status.code(), Some(2), "{cmd:?}: {}", text(&out.stderr));
        let err = text(&out.stderr);
        assert!(
            err.contains("an operator's act") && err.contains("--kubeconfig"),
            "{err}"
        );
    }
    // Nor with the node's own identities.
    for own in ["kubeconfig", "kubelet.conf"] {
        let out = env_b.operator_ctl(&env_b.root.join(own), &["rollout", "resume"]);
        assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
        assert!(
            text(&out.stderr).contains("this node's own identity"),
            "{}",
            text(&out.stderr)
        );
    }
    // An older ginxctl asking the daemon is refused by it.
    let raw = ginx::control::client::Client::new(&env_b.socket, std::time::Duration::from_secs(30))
        .call_raw(ginx::control::protocol::Command::RolloutResume)
        .unwrap_err()
        .to_string();
    assert!(raw.contains("operator's credentials"), "{raw}");
    let cm = configmap(cp, ns).unwrap();
    assert_eq!(cm["metadata"]["resourceVersion"], version, "unchanged");
    assert_eq!(
        data_json(&cm, "paused").unwrap()["by"],
        "nobody@fleet-pause-cp"
    );

    // An operator resumes, with their own credentials; the fleet records who the API server
    // says they are, and so does its audit log.
    let mark = cp.audit_mark();
    assert_eq!(
        env_b.operator_ok(&cp.admin_kubeconfig, &["rollout", "resume"]),
        "resumed the rollout fleet-wide\n"
    );
    let cm = configmap(cp, ns).unwrap();
    assert!(cm["data"].get("paused").is_none(), "{cm}");
    let events = data_json(&cm, "events").unwrap();
    let last = events.as_array().unwrap().last().unwrap();
    assert_eq!(last["by"], "admin");
    assert_eq!(last["action"], "resume");
    let writes: Vec<String> = cp
        .audit_since(mark)
        .into_iter()
        .filter(|e| e.resource == "configmaps" && e.verb == "update" && e.namespace == ns)
        .map(|e| e.user)
        .collect();
    assert_eq!(
        writes,
        ["admin"],
        "the lift is the operator's in the audit log"
    );
    assert!(cluster_json(&a)["fleet"]["paused"].is_null());
    assert_eq!(
        env_b.operator_ok(&cp.admin_kubeconfig, &["rollout", "resume"]),
        "the rollout was not paused\n"
    );
}

#[test]
fn rollout_clear_lifts_a_halt_by_prefix_and_names_an_unknown_revision() {
    let Some(cp) = control_plane::shared() else {
        return;
    };
    let (ns, node) = ("fleet-clear", "fleet-clear-cp");
    namespace_like_ginx_system(cp, ns, &[]);
    let mut rbac = RbacGuard::new(cp);
    rbac.watch(node);
    let (env, d) = start_node(cp, node, "control-plane", ns);
    let op = |args: &[&str]| env.operator_ctl(&cp.admin_kubeconfig, args);
    // Two halts written by hand, as kubectl would (and a key that is nobody's business).
    let halt = |rev: &str, on: &str| {
        serde_json::json!({
            "revision": rev,
            "node": on,
            "probes": {"kubelet": "healthz answered 500"},
            "reason": "health gate failed",
            "at": "2026-12-01T10:00:00Z",
        })
        .to_string()
    };
    let manifest = serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "ginx-rollout", "namespace": ns},
        "data": {
            format!("halted.{REV_A}"): halt(REV_A, "makise"),
            format!("halted.{REV_B}"): halt(REV_B, "quinn"),
            "note": "ask bob first",
        },
    });
    cp.apply(&manifest.to_string());

    let view = d.ctl_ok(&["cluster"]);
    assert!(
        view.contains("halted: aaaaaaaa1111 on makise at 2026-12-01T10:00:00Z: health gate failed"),
        "{view}"
    );

    // A prefix both halts share is not enough; an unknown revision is named.
    let out = op(&["rollout", "clear", "aaaaaaaa"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("aaaaaaaa names more than one halted revision"),
        "{}",
        text(&out.stderr)
    );
    let out = op(&["rollout", "clear", "fedcba98765"]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("fedcba98765 is not halted") && err.contains(REV_A),
        "{err}"
    );
    let out = op(&["rollout", "clear", "aaaa"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("at least 7"),
        "{}",
        text(&out.stderr)
    );

    let out = env.operator_ok(&cp.admin_kubeconfig, &["rollout", "clear", "aaaaaaaa11"]);
    assert!(
        out.starts_with(&format!("cleared the halt of {REV_A} (halted on makise")),
        "{out}"
    );
    let cm = configmap(cp, ns).unwrap();
    let data = cm["data"].as_object().unwrap();
    assert!(!data.contains_key(&format!("halted.{REV_A}")), "{cm}");
    assert!(data.contains_key(&format!("halted.{REV_B}")), "{cm}");
    assert_eq!(data["note"], "ask bob first", "others' keys are kept");
    let events = data_json(&cm, "events").unwrap();
    assert_eq!(
        events,
        serde_json::json!([{
            "by": "admin",
            "at": events[0]["at"],
            "action": format!("clear {REV_A}"),
        }])
    );
    // Cleared once; a second time it is not halted any more.
    let out = op(&["rollout", "clear", REV_A]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains(&format!("{REV_A} is not halted")));
}

#[test]
fn ginxctl_cluster_shows_each_node_with_its_role_and_heartbeat() {
    let Some(cp) = control_plane::shared() else {
        return;
    };
    let (ns, cp_node, worker) = ("fleet-view", "fleet-view-cp", "fleet-view-w");
    namespace_like_ginx_system(cp, ns, &[]);
    let mut rbac = RbacGuard::new(cp);
    rbac.watch(cp_node);
    rbac.watch(worker);
    let _k1 = Kubelet::start(cp, cp_node, "control-plane");
    let _k2 = Kubelet::start(cp, worker, "worker");
    let (_e1, a) = start_node(cp, cp_node, "control-plane", ns);
    let (_e2, _b) = start_node(cp, worker, "worker", ns);
    // A slot of a group neither ginx takes part in, held by the worker for an hour.
    let renewed = jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%S%.6fZ");
    cp.apply(&format!(
        "apiVersion: coordination.k8s.io/v1\nkind: Lease\nmetadata:\n  name: ginx-rollout-batch-0\n  \
         namespace: {ns}\n  labels: {{ginx.io/rollout-group: batch}}\nspec:\n  holderIdentity: {worker}\n  \
         leaseDurationSeconds: 3600\n  renewTime: \"{renewed}\"\n"
    ));
    // The worker has no kubeadm label: its role comes from the annotation its ginx writes.
    wait_for("the worker's role annotation", || {
        let n = cp.node(worker)?;
        (n["metadata"]["annotations"]["ginx.io/role"] == "worker").then_some(())
    });
    let row = |text: &str, node: &str| -> Option<String> {
        text.lines()
            .find(|l| l.split_whitespace().next() == Some(node))
            .map(str::to_owned)
    };
    let text = wait_for("both nodes with a heartbeat", || {
        let t = a.ctl_ok(&["cluster"]);
        let both = [cp_node, worker]
            .iter()
            .all(|n| row(&t, n).is_some_and(|r| r.contains(" ago")));
        both.then_some(t)
    });
    assert!(text.starts_with("NODE "), "{text}");
    let header: Vec<&str> = text.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NODE",
            "ROLE",
            "READY",
            "HEALTHY",
            "APPLIED",
            "TARGET",
            "STATE/PHASE",
            "HEARTBEAT",
            "SLOT"
        ]
    );
    let cells = |node: &str| -> Vec<String> {
        row(&text, node)
            .unwrap()
            .split_whitespace()
            .map(str::to_owned)
            .collect()
    };
    let c = cells(cp_node);
    assert_eq!(
        (c[1].as_str(), c[2].as_str()),
        ("control-plane", "yes"),
        "{text}"
    );
    let w = cells(worker);
    assert_eq!((w[1].as_str(), w[2].as_str()), ("worker", "yes"), "{text}");
    assert!(w.iter().any(|c| c == "ago"), "a heartbeat age: {text}");
    // Beside any slot its own applies take.
    assert!(
        w.last().unwrap().split(',').any(|s| s == "batch/0"),
        "{text}"
    );
    let view = cluster_json(&a);
    assert_eq!(view["slots"]["batch/0"], worker);
    assert!(text.contains("\nnot paused\n"), "{text}");
}

/// An open, healthy gate reads as progress, in `ginxctl status` and in `ginxctl cluster` (from
/// the Node's `ginx.io/gate`): how long the node has been healthy of the settle, when the gate
/// passes if nothing regresses, and when it gives up. `--json` keeps its fields.
#[test]
fn an_open_gate_says_how_long_when_it_passes_and_when_it_gives_up() {
    let Some(cp) = control_plane::shared() else {
        return;
    };
    let (ns, node) = ("fleet-gate", "fleet-gate-w");
    namespace_like_ginx_system(cp, ns, &[]);
    let mut rbac = RbacGuard::new(cp);
    rbac.watch(node);
    let _kubelet = Kubelet::start(cp, node, "worker");
    let env = Env::new();
    use_cluster(&env, cp, node, &format!("namespace = \"{ns}\""));
    NodeToml::new()
        .set("node.name", node)
        .set("node.role", "worker")
        .set("rollout.gate.settle", "5m")
        .set("rollout.gate.timeout", "10m")
        .write(&env, "10-node.toml");
    let d = env.start();
    let s = d.wait_status("the gate open and healthy", |s| {
        s["apply"]["state"] == "verifying" && s["rollout"]["gate"]["passes_at"].is_string()
    });
    for key in [
        "started_at",
        "healthy_since",
        "deadline",
        "failing",
        "rollback",
    ] {
        assert!(!s["rollout"]["gate"][key].is_null(), "{key}: {s:#}");
    }
    let text = d.ctl_ok(&["status"]);
    let line = text
        .lines()
        .find(|l| l.contains("health gate after the activation"))
        .unwrap_or_else(|| panic!("no gate line in:\n{text}"));
    for part in [
        "health gate after the activation: healthy for ",
        " s of the 300 s settle; passes at ",
        " if nothing regresses; gives up at ",
    ] {
        assert!(line.contains(part), "{part:?} not in {line:?}");
    }
    assert!(!text.contains("healthy since -"), "{text}");
    let gate = wait_for("the gate on the Node", || {
        let n = cp.node(node)?;
        let g = n["metadata"]["annotations"]["ginx.io/gate"]
            .as_str()?
            .to_owned();
        Some(serde_json::from_str::<Value>(&g).unwrap())
    });
    assert!(gate["passes_at"].is_string(), "{gate:#}");
    let view = d.ctl_ok(&["cluster"]);
    let want = format!("{node}: health gate after the activation: healthy for ");
    assert!(
        view.lines()
            .any(|l| l.starts_with(&want) && l.contains("if nothing regresses; gives up at ")),
        "{view}"
    );
}

#[test]
fn fleet_commands_without_a_kubeconfig_say_what_they_need() {
    let env = Env::new();
    let d = env.start();
    for (args, name) in [
        (&["cluster"][..], "cluster"),
        (&["rollout", "pause"], "rollout-pause"),
    ] {
        let out = d.ctl(args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = text(&out.stderr);
        assert!(
            err.contains(&format!(
                "{name} needs the Kubernetes API: kubernetes.kubeconfig is not set"
            )),
            "{err}"
        );
    }
}

#[test]
fn a_fleet_command_refused_by_rbac_names_rbac_yaml() {
    let Some(cp) = control_plane::shared() else {
        return;
    };
    let (ns, node) = ("fleet-norbac", "fleet-norbac-cp");
    // As if the binding of the Role ginx-rollout had been left out of rbac.yaml.
    namespace_like_ginx_system(cp, ns, &["ginx-rollout"]);
    let mut rbac = RbacGuard::new(cp);
    rbac.watch(node);
    rbac.expect_forbidden(node);
    let (_env, d) = start_node(cp, node, "control-plane", ns);
    let out = d.ctl(&["rollout", "pause"]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!("cannot get ConfigMap {ns}/ginx-rollout: HTTP 403"))
            && err.contains("Role ginx-rollout")
            && err.contains("apply packaging/kubernetes/rbac.yaml"),
        "{err}"
    );
    let out = d.ctl(&["cluster"]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains(&format!("cannot list leases in {ns}: HTTP 403"))
            && err.contains("packaging/kubernetes/rbac.yaml"),
        "{err}"
    );
    assert!(configmap(cp, ns).is_none(), "nothing was written");
}

/// `ginxctl cluster` for an operator at a workstation: with `--kubeconfig` it reads
/// the API itself, as nobody, with no daemon and no socket, and prints the view a node's ginx
/// gives (heartbeat ages aside: a fresh ginxctl has not watched the Leases yet); `kubectl ginx`
/// (the real kubectl, its plugin `kubectl-ginx` a link to ginxctl) gives it too, with kubectl's
/// credentials; `--watch` redraws it as a revision rolls out.
#[test]
fn the_fleet_from_a_workstation_is_the_nodes_view_without_daemon_or_root() {
    let Some(cp) = control_plane::shared() else {
        return;
    };
    let (ns, a_name, b_name) = ("fleet-ws", "fleet-ws-a", "fleet-ws-b");
    namespace_like_ginx_system(cp, ns, &[]);
    let mut rbac = RbacGuard::new(cp);
    rbac.watch(a_name);
    rbac.watch(b_name);
    let _k1 = Kubelet::start(cp, a_name, "worker");
    let _k2 = Kubelet::start(cp, b_name, "worker");
    let (env_a, a) = start_node(cp, a_name, "worker", ns);
    let (_env_b, b) = start_node(cp, b_name, "worker", ns);
    for (env, d) in [(&env_a, &a), (&_env_b, &b)] {
        let head = env.repo.head();
        d.ctl_ok(&["sync"]);
        d.wait_applied(&head);
    }

    // The operator: user ann with the read-only ClusterRole of rbac.yaml, her kubeconfig and a
    // configuration naming the namespace, in a directory anyone may read (ginxctl runs as
    // nobody).
    let ws = tempfile::tempdir().unwrap();
    std::fs::set_permissions(ws.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let kc = ws.path().join("ann.kubeconfig");
    cp.kubeconfig_for(&kc, "ann-fleet-ws", &[]);
    let _ = cp.kubectl_output(&[
        "create",
        "clusterrolebinding",
        "ann-fleet-ws",
        "--clusterrole=ginx-fleet-viewer",
        "--user=ann-fleet-ws",
    ]);
    // A halt in this test's namespace (of a revision nobody applies): the workstation must read
    // the fleet state there, not in the default ginx-system.
    let halt = serde_json::json!({"revision": REV_A, "node": a_name, "probes": {},
        "reason": "health gate failed", "at": "2026-12-01T10:00:00Z"});
    cp.apply(
        &serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "ginx-rollout", "namespace": ns},
            "data": {format!("halted.{REV_A}"): halt.to_string()}})
        .to_string(),
    );
    let config = ws.path().join("config.toml");
    std::fs::write(&config, format!("[kubernetes]\nnamespace = \"{ns}\"\n")).unwrap();
    for f in [&kc, &config] {
        std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let ws_ctl = |args: &[&str]| -> Output {
        let mut c = if can_run_as_nobody() {
            let mut c = Command::new("setpriv");
            c.args(["--reuid=nobody", "--regid=nogroup", "--clear-groups"])
                .arg(support::ginxctl_bin());
            c
        } else {
            Command::new(support::ginxctl_bin())
        };
        c.args(["--socket", "/nonexistent/ginx.sock", "--config"])
            .arg(&config)
            .args(args)
            .env_remove("GINX_SOCKET")
            .env_remove("KUBECONFIG")
            .output()
            .unwrap()
    };
    let kc_arg = kc.display().to_string();
    // This test's part of the view (the control plane is shared: other tests' nodes change
    // under it, and count in the revisions): its nodes, its namespace's fleet state and slots.
    // Heartbeat ages aside: known to the node's ginx, not yet to a fresh ginxctl.
    let comparable = |v: Value| {
        let mut nodes: Vec<Value> = v["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|n| n["name"] == a_name || n["name"] == b_name)
            .cloned()
            .collect();
        for n in &mut nodes {
            n.as_object_mut().unwrap().remove("heartbeat_age_secs");
        }
        let slots: serde_json::Map<String, Value> = v["slots"]
            .as_object()
            .unwrap()
            .iter()
            .filter(|(_, h)| **h == a_name || **h == b_name)
            .map(|(k, h)| (k.clone(), h.clone()))
            .collect();
        serde_json::json!({"nodes": nodes, "fleet": v["fleet"], "slots": slots})
    };
    let last = std::cell::RefCell::new(String::new());
    let (on_node, from_ws) = wait_for("the same view from the node and the workstation", || {
        if !last.borrow().is_empty() {
            eprintln!("views differ:\n{}", last.borrow());
        }
        let node = comparable(cluster_json(&a));
        let out = ws_ctl(&["cluster", "--json", "--kubeconfig", &kc_arg]);
        assert!(
            out.status.success(),
            "ginxctl cluster --kubeconfig: {}",
            text(&out.stderr)
        );
        let ws: Value = serde_json::from_slice(&out.stdout).unwrap();
        let ws = comparable(ws);
        *last.borrow_mut() = format!("node: {node}\nworkstation: {ws}");
        (node == ws).then_some((node, ws))
    });
    assert!(node_in(&from_ws, a_name).is_some() && node_in(&from_ws, b_name).is_some());
    assert!(
        from_ws["fleet"]["halted"][REV_A].is_object(),
        "the workstation read the fleet state of {ns}: {from_ws:#}"
    );
    assert_eq!(on_node, from_ws);
    let out = ws_ctl(&["cluster", "--kubeconfig", &kc_arg]);
    let table = text(&out.stdout);
    assert!(table.starts_with("NODE "), "{table}{}", text(&out.stderr));
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("revision ") && l.contains(" done; ")),
        "progress per revision: {table}"
    );

    // kubectl ginx: the real kubectl runs its plugin kubectl-ginx from PATH, with KUBECONFIG.
    let plugins = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(support::ginxctl_bin(), plugins.path().join("kubectl-ginx"))
        .unwrap();
    let path = format!(
        "{}:{}",
        plugins.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    // The nodes go on reporting between two reads (a heartbeat's marks, a plan): compare
    // kubectl's view with a workstation read taken right after it, until the two agree.
    wait_for(
        "the same view through kubectl and from the workstation",
        || {
            let out = Command::new(cp.binary())
                .args(["kubectl", "ginx", "cluster", "--json"])
                .env("PATH", &path)
                .env("KUBECONFIG", &kc)
                .env("GINX_CONFIG", &config)
                .env("GINX_SOCKET", "/nonexistent/ginx.sock")
                .output()
                .unwrap();
            assert!(out.status.success(), "kubectl ginx: {}", text(&out.stderr));
            let via_kubectl = comparable(serde_json::from_slice(&out.stdout).unwrap());
            let out = ws_ctl(&["cluster", "--json", "--kubeconfig", &kc_arg]);
            let ws = comparable(serde_json::from_slice(&out.stdout).unwrap());
            if via_kubectl != ws {
                eprintln!("views differ:\nkubectl: {via_kubectl}\nworkstation: {ws}");
            }
            (via_kubectl == ws).then_some(())
        },
    );

    // --watch, not on a terminal: each changed view, until SIGINT; a rollout on a shows up.
    let mut watch = Command::new(support::ginxctl_bin())
        .args(["--socket", "/nonexistent/ginx.sock", "--config"])
        .arg(&config)
        .args([
            "cluster",
            "--kubeconfig",
            &kc_arg,
            "--watch",
            "--interval",
            "500ms",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    env_a.stub("sleep", "3");
    let x = env_a
        .repo
        .commit("hive.nix", "{ fleet-ws-watch = 1; }", "fleet-ws: x");
    a.ctl_ok(&["sync"]);
    a.wait_applied(&x);
    let short = &x[..12];
    wait_for("a's done revision in the view", || {
        let v = cluster_json(&a);
        (node_in(&v, a_name)?["applied_revision"] == x.as_str()).then_some(())
    });
    // Until the watch itself printed x done: its output is read as it comes.
    let printed = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let reader = {
        let printed = std::sync::Arc::clone(&printed);
        let stdout = watch.stdout.take().unwrap();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                let mut p = printed.lock().unwrap();
                p.push_str(&line);
                p.push('\n');
            }
        })
    };
    wait_for("the watch printing x done", || {
        let p = printed.lock().unwrap();
        p.lines()
            .any(|l| l.starts_with(&format!("revision {short}: 1/1 done;")))
            .then_some(())
    });
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(watch.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let status = watch.wait().unwrap();
    reader.join().unwrap();
    let out = printed.lock().unwrap().clone();
    assert!(
        status.success(),
        "--watch ends on SIGINT with 0: {status}\n{out}"
    );
    let views: Vec<&str> = out.split("--- ").filter(|v| !v.is_empty()).collect();
    assert!(views.len() >= 2, "{out}");
    // x was seen on its way, then done.
    let moving = views.iter().position(|v| {
        v.lines()
            .any(|l| l.starts_with(&format!("revision {short}: 0/1 done;")))
    });
    let done = views.iter().rposition(|v| {
        v.lines()
            .any(|l| l.starts_with(&format!("revision {short}: 1/1 done;")))
    });
    assert!(
        matches!((moving, done), (Some(m), Some(d)) if m < d),
        "x under way, then done, in the watch:\n{out}"
    );
}
