//! `ginxctl bootstrap` against the real control plane: stages applied in order with
//! server-side apply, each waited for; reruns that write nothing; Flux-owned objects left
//! alone; a wait that never holds; two bootstraps at once; the API away.
//!
//! The manifests are made here: a CRD and a DaemonSet standing in for Cilium, a Deployment
//! standing in for the Flux Operator, and a CRD of the FluxInstance shape written from its
//! documented fields (group `fluxcd.controlplane.io`, kind `FluxInstance`, a status with
//! conditions). No scheduler runs: [`Scheduler`] binds the stages' pods to the test's node, as
//! kube-scheduler would; the stand-in kubelet marks them Ready; the test sets the custom
//! resource's Ready condition as the operator would.

use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::json;

use crate::support::control_plane::{self, ControlPlane};
use crate::support::kubelet::Kubelet;
use crate::support::{Env, ginxctl_bin};

/// Binds every unbound pod of `namespaces` to `node` until dropped.
struct Scheduler {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Scheduler {
    fn start(cp: &'static ControlPlane, namespaces: &[&str], node: &str) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let s = Arc::clone(&stop);
        let namespaces: Vec<String> = namespaces.iter().map(|n| (*n).to_owned()).collect();
        let node = node.to_owned();
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                for ns in &namespaces {
                    let Some(list) = cp.get_path(&format!(
                        "/api/v1/namespaces/{ns}/pods?fieldSelector=spec.nodeName%3D"
                    )) else {
                        continue;
                    };
                    for p in list["items"].as_array().into_iter().flatten() {
                        let name = p["metadata"]["name"].as_str().unwrap_or("");
                        if !name.starts_with("bs-") {
                            continue;
                        }
                        let _ = cp.request(
                            "POST",
                            &format!("/api/v1/namespaces/{ns}/pods/{name}/binding"),
                            "application/json",
                            &json!({"apiVersion": "v1", "kind": "Binding",
                                "metadata": {"name": name, "namespace": ns},
                                "target": {"apiVersion": "v1", "kind": "Node", "name": node}}),
                        );
                    }
                }
                std::thread::sleep(std::time::Duration::from_millis(200));
            }
        });
        Self {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

const CNI: &str = "\
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: bsnodes.cni.test.ginx.io}
spec:
  group: cni.test.ginx.io
  names: {kind: BsNode, plural: bsnodes, singular: bsnode}
  scope: Cluster
  versions:
    - name: v1
      served: true
      storage: true
      schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: bs-cni, namespace: bs-system}
spec:
  selector: {matchLabels: {app: bs-cni}}
  template:
    metadata: {labels: {app: bs-cni}}
    spec:
      nodeSelector: {bs-node: \"yes\"}
      containers: [{name: agent, image: registry.invalid/cni:1}]
---
apiVersion: v1
kind: Namespace
metadata: {name: bs-system}
";

const OPERATOR: &str = "\
apiVersion: v1
kind: Namespace
metadata: {name: bs-flux}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: bs-operator, namespace: bs-flux}
spec:
  replicas: 1
  selector: {matchLabels: {app: bs-operator}}
  template:
    metadata: {labels: {app: bs-operator}}
    spec:
      containers: [{name: manager, image: registry.invalid/operator:1}]
";

/// A CRD of the FluxInstance shape, from its documented fields (the operator's own stage);
/// the instance is `[bootstrap.flux]`'s.
/// A namespaced CRD with a status subresource and any fields: `plural`.`group`, kind `kind`.
fn crd(plural: &str, group: &str, kind: &str) -> String {
    let singular = kind.to_lowercase();
    format!(
        "apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {{name: {plural}.{group}}}
spec:
  group: {group}
  names: {{kind: {kind}, plural: {plural}, singular: {singular}}}
  scope: Namespaced
  versions:
    - name: v1
      served: true
      storage: true
      subresources: {{status: {{}}}}
      schema: {{openAPIV3Schema: {{type: object, x-kubernetes-preserve-unknown-fields: true}}}}
"
    )
}

/// Argus, as the daemon and Flux are given it: a closed port on loopback (the daemon's fetches
/// fail, which the bootstrap does not need).
const ARGUS: &str = "http://127.0.0.1:9/argus.git";

/// The Argus token: it must reach the pull secret and nothing else.
const TOKEN: &str = "bs-token-Zq81xv";

struct Setup {
    env: Env,
    kubeconfig: PathBuf,
    dir: PathBuf,
}

/// A configuration with three stages from files in `dir`, bootstrapping with an admin identity
/// of its own (`user`, in system:masters) so that the audit log shows its writes alone. No
/// stage waits for `nodes`: the control plane is shared, and other tests make their nodes
/// NotReady on purpose.
fn setup(cp: &ControlPlane, user: &str, node: &str, timeout: &str) -> Setup {
    let env = Env::new();
    let dir = env.root.join("bootstrap");
    std::fs::create_dir_all(&dir).unwrap();
    for (f, t) in [
        ("cni.yaml", CNI),
        ("operator.yaml", OPERATOR),
        (
            "flux.yaml",
            &crd("fluxinstances", "fluxcd.controlplane.io", "FluxInstance"),
        ),
    ] {
        std::fs::write(dir.join(f), t).unwrap();
    }
    let kubeconfig = env.root.join("admin.conf");
    cp.kubeconfig_for(&kubeconfig, user, &["system:masters"]);
    let token = env.root.join("argus.token");
    crate::support::sweep::secret("bootstrap Flux token (Argus)", TOKEN);
    std::fs::write(&token, format!("{TOKEN}\n")).unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    env.dropin("10-node.toml", &format!("[node]\nname = \"{node}\"\n"));
    env.dropin(
        "60-bootstrap.toml",
        &format!(
            "[bootstrap]\nkubeconfig = \"{kc}\"\n\n\
             [[bootstrap.stages]]\nname = \"cni\"\npath = \"{d}/cni.yaml\"\n\
             wait = [\"crd/bsnodes.cni.test.ginx.io\", \"daemonset/bs-system/bs-cni\"]\ntimeout = \"{timeout}\"\n\n\
             [[bootstrap.stages]]\nname = \"operator\"\npath = \"{d}/operator.yaml\"\n\
             wait = [\"deployment/bs-flux/bs-operator\"]\ntimeout = \"{timeout}\"\n\n\
             [[bootstrap.stages]]\nname = \"flux-crd\"\npath = \"{d}/flux.yaml\"\n\
             wait = [\"crd/fluxinstances.fluxcd.controlplane.io\"]\ntimeout = \"{timeout}\"\n\n\
             [bootstrap.flux]\nsource = \"argus\"\npath = \"clusters/lab\"\ntimeout = \"{timeout}\"\n\n\
             [sources.argus]\nurl = \"{ARGUS}\"\ntoken_file = \"{token}\"\ninterval = \"1h\"\n",
            kc = kubeconfig.display(),
            d = dir.display(),
            token = token.display(),
        ),
    );
    Setup {
        env,
        kubeconfig,
        dir,
    }
}

/// `ginxctl` with the node's configuration and socket.
fn ginxctl(s: &Setup, args: &[&str]) -> Command {
    let mut c = Command::new(ginxctl_bin());
    c.arg("--config")
        .arg(&s.env.config)
        .arg("--socket")
        .arg(&s.env.socket)
        .args(args)
        .env_remove("GINX_SOCKET");
    c
}

fn bootstrap(s: &Setup, args: &[&str]) -> Output {
    let args = [&["bootstrap"], args].concat();
    let out = ginxctl(s, &args).output().expect("running ginxctl");
    crate::support::sweep::collect_ctl(&args, &out);
    out
}

/// What a background `ginxctl bootstrap` wrote to `log` (see [`spawn_bootstrap`]).
fn read_output(log: &std::path::Path) -> String {
    crate::support::sweep::collect_file("ginxctl-bootstrap", log);
    std::fs::read_to_string(log).unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Sets the FluxInstance's Ready condition, as the operator would, once it exists (or gives
/// up when `done` is set: the bootstrap ended without creating it, and says why).
fn ready_flux_instance(cp: &ControlPlane, done: &AtomicBool) {
    let path = "/apis/fluxcd.controlplane.io/v1/namespaces/flux-system/fluxinstances/flux";
    let obj = loop {
        if let Some(o) = cp.get_path(path) {
            break o;
        }
        if done.load(Ordering::Relaxed) {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    patch_ready(
        cp,
        path,
        &obj,
        "True",
        "ReconciliationSucceeded",
        "Reconciliation finished",
    );
}

/// Sets the Ready condition of the object at `path` (as read: `obj`) at its generation, as its
/// controller would.
fn patch_ready(
    cp: &ControlPlane,
    path: &str,
    obj: &serde_json::Value,
    status: &str,
    reason: &str,
    message: &str,
) {
    let generation = obj["metadata"]["generation"].as_i64().unwrap_or(1);
    let (code, body) = cp.request(
        "PATCH",
        &format!("{path}/status"),
        "application/merge-patch+json",
        &json!({"status": {"conditions": [{"type": "Ready", "status": status,
            "reason": reason, "message": message,
            "observedGeneration": generation, "lastTransitionTime": "2026-12-01T00:00:00Z"}]}}),
    );
    assert!(code < 300, "{code} {body}");
}

fn writes_by(cp: &ControlPlane, mark: u64, user: &str) -> Vec<String> {
    cp.audit_since(mark)
        .into_iter()
        .filter(|e| {
            e.user == user && matches!(e.verb.as_str(), "create" | "update" | "patch" | "delete")
        })
        .map(|e| e.short())
        .collect()
}

fn cleanup(cp: &ControlPlane) {
    delete(
        cp,
        &[
            "namespace bs-system bs-flux flux-system --wait=false",
            "crd bsnodes.cni.test.ginx.io fluxinstances.fluxcd.controlplane.io",
            "configmap -n kube-system ginx-bootstrap",
            "lease -n ginx-system ginx-bootstrap",
        ],
    );
}

/// One test for the whole flow: its parts share cluster-wide names (the ConfigMap, the Lease,
/// the CRDs), so they run in order here rather than in parallel tests.
#[test]
fn three_stages_in_order_reruns_write_nothing_flux_owned_objects_stay_failures_are_named() {
    let Some(cp) = control_plane::shared() else {
        return;
    };
    cleanup(cp);
    let _kubelet = Kubelet::start(cp, "bs-node", "worker");
    cp.kubectl(&["label", "node", "bs-node", "bs-node=yes", "--overwrite"]);
    let _scheduler = Scheduler::start(cp, &["bs-system", "bs-flux"], "bs-node");
    let s = setup(cp, "bs-admin", "bs-lucy", "1m");
    // The daemon runs beside it (progress reports): the token must not reach it either.
    let daemon = s.env.start();

    // The dry run writes nothing (and cannot wait for what it did not create).
    let mark = cp.audit_mark();
    let out = bootstrap(&s, &["--dry-run", "--stage", "cni"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("(dry run)"), "{}", text(&out));
    assert!(
        cp.get_path("/apis/apps/v1/namespaces/bs-system/daemonsets/bs-cni")
            .is_none()
    );

    // The real run: in order, each stage waited for.
    let done = Arc::new(AtomicBool::new(false));
    let d = Arc::clone(&done);
    let flux = std::thread::spawn(move || ready_flux_instance(cp, &d));
    let out = bootstrap(&s, &[]);
    done.store(true, Ordering::Relaxed);
    flux.join().unwrap();
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    let pos = |needle: &str| {
        t.find(needle)
            .unwrap_or_else(|| panic!("{needle:?} in {t}"))
    };
    assert!(pos("stage cni: applying") < pos("daemonset/bs-system/bs-cni holds"));
    assert!(pos("daemonset/bs-system/bs-cni holds") < pos("stage operator: applying"));
    assert!(pos("deployment/bs-flux/bs-operator holds") < pos("stage flux-crd: applying"));
    assert!(pos("crd/fluxinstances.fluxcd.controlplane.io holds") < pos("stage flux: applying"));
    assert!(
        t.contains("fluxcd.controlplane.io/FluxInstance/flux-system/flux holds"),
        "{t}"
    );
    // The generated FluxInstance syncs from Argus; its pull secret holds the token, which
    // appears nowhere else.
    let fi = cp
        .get_path("/apis/fluxcd.controlplane.io/v1/namespaces/flux-system/fluxinstances/flux")
        .unwrap();
    assert_eq!(fi["spec"]["sync"]["url"], ARGUS, "{fi:#}");
    assert_eq!(fi["spec"]["sync"]["ref"], "refs/heads/main");
    assert_eq!(fi["spec"]["sync"]["path"], "clusters/lab");
    assert_eq!(fi["spec"]["sync"]["pullSecret"], "flux-system");
    let secret = cp
        .get_path("/api/v1/namespaces/flux-system/secrets/flux-system")
        .unwrap();
    use base64::Engine as _;
    let password = base64::engine::general_purpose::STANDARD
        .decode(secret["data"]["password"].as_str().unwrap())
        .unwrap();
    assert_eq!(password, TOKEN.as_bytes());
    assert!(!t.contains(TOKEN), "the token in the output: {t}");
    // Namespaces and CRDs first: the Namespace at the end of cni.yaml was applied first.
    assert!(
        pos("applied Namespace bs-system") < pos("applied DaemonSet bs-system/bs-cni"),
        "{t}"
    );
    let ds = cp
        .get_path("/apis/apps/v1/namespaces/bs-system/daemonsets/bs-cni")
        .unwrap();
    let managers: Vec<&str> = ds["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["operation"] == "Apply")
        .filter_map(|m| m["manager"].as_str())
        .collect();
    assert_eq!(managers, ["ginx"], "server-side apply as ginx");
    let cm = cp
        .get_path("/api/v1/namespaces/kube-system/configmaps/ginx-bootstrap")
        .unwrap();
    assert!(!cm.to_string().contains(TOKEN));
    for stage in ["cni", "operator", "flux-crd", "flux"] {
        assert_eq!(cm["data"][stage].as_str().map(str::len), Some(64), "{cm:#}");
    }

    // A rerun with nothing changed writes nothing at all (not even the lock).
    let mark_rerun = cp.audit_mark();
    let out = bootstrap(&s, &[]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(
        text(&out).matches("unchanged since it was applied").count(),
        4,
        "{}",
        text(&out)
    );
    let writes = writes_by(cp, mark_rerun, "bs-admin");
    assert!(writes.is_empty(), "an unchanged rerun wrote: {writes:?}");
    assert!(
        cp.audit_since(mark_rerun)
            .iter()
            .any(|e| e.user == "bs-admin" && e.verb == "get"),
        "it did read"
    );

    // One stage changed: only it is applied.
    std::fs::write(
        s.dir.join("operator.yaml"),
        OPERATOR.replace("replicas: 1", "replicas: 2"),
    )
    .unwrap();
    let mark_change = cp.audit_mark();
    let out = bootstrap(&s, &[]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(
        t.contains("stage cni: unchanged") && t.contains("stage flux: unchanged"),
        "{t}"
    );
    assert!(t.contains("stage operator: applying"), "{t}");
    let writes = writes_by(cp, mark_change, "bs-admin");
    assert!(
        writes
            .iter()
            .any(|w| w.contains("deployments bs-flux/bs-operator")),
        "{writes:?}"
    );
    assert!(
        !writes
            .iter()
            .any(|w| w.contains("daemonsets") || w.contains("fluxinstances")),
        "{writes:?}"
    );

    // An object Flux took over is left alone.
    cp.kubectl(&[
        "label",
        "deployment",
        "-n",
        "bs-flux",
        "bs-operator",
        "kustomize.toolkit.fluxcd.io/name=flux-system",
    ]);
    std::fs::write(
        s.dir.join("operator.yaml"),
        OPERATOR.replace("replicas: 1", "replicas: 3"),
    )
    .unwrap();
    let mark_flux = cp.audit_mark();
    let out = bootstrap(&s, &["--stage", "operator"]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(t.contains("skipped Deployment bs-flux/bs-operator: owned by Flux (kustomize.toolkit.fluxcd.io/name=flux-system)"), "{t}");
    let writes = writes_by(cp, mark_flux, "bs-admin");
    assert!(
        !writes.iter().any(|w| w.contains("deployments")),
        "{writes:?}"
    );
    // The token is in the pull secret only: not in the daemon's log, status or report file.
    let status = daemon.ctl_ok(&["status", "--json"]);
    assert!(
        status.contains("\"phase\": \"done\"") || status.contains("\"phase\":\"done\""),
        "{status}"
    );
    let report = std::fs::read_to_string(s.env.state_dir.join("bootstrap.json")).unwrap();
    let log = daemon.log();
    daemon.stop();
    for (what, text) in [
        ("status", &status),
        ("bootstrap.json", &report),
        ("the daemon's log", &log),
    ] {
        assert!(!text.contains(TOKEN), "the token in {what}: {text}");
    }
    let _ = mark;
    cleanup(cp);
    failures(cp);
    two_at_once_interrupted_and_killed(cp);
    after_init(cp);
}

/// A node of its own with the daemon's configuration (no source outside 127.0.0.1) and the
/// `[bootstrap]` drop-in `stages` (TOML) using the admin identity `user`.
fn node_with(cp: &ControlPlane, node: &str, user: &str, stages: &str) -> Setup {
    let env = Env::new();
    let dir = env.root.join("b");
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = env.root.join("admin.conf");
    cp.kubeconfig_for(&kubeconfig, user, &["system:masters"]);
    env.dropin("10-node.toml", &format!("[node]\nname = \"{node}\"\n"));
    env.dropin(
        "60-bootstrap.toml",
        &format!(
            "[bootstrap]\nkubeconfig = \"{}\"\n\n{}",
            kubeconfig.display(),
            stages.replace("{dir}", &dir.display().to_string())
        ),
    );
    Setup {
        env,
        kubeconfig,
        dir,
    }
}

fn delete_lease(cp: &ControlPlane) {
    delete(cp, &["lease -n ginx-system ginx-bootstrap"]);
}

/// `kubectl delete --ignore-not-found` of each `what` (its arguments, space-separated).
fn delete(cp: &ControlPlane, what: &[&str]) {
    for w in what {
        let mut args = vec!["delete"];
        args.extend(w.split_whitespace());
        args.push("--ignore-not-found");
        let _ = cp.kubectl_output(&args);
    }
}

/// Sets the Ready condition of BsWait default/w once it exists.
fn set_ready(cp: &ControlPlane, status: &str, reason: &str, message: &str) {
    let path = "/apis/test.ginx.io/v1/namespaces/default/bswaits/w";
    let obj = crate::support::wait_for("BsWait default/w", || cp.get_path(path));
    patch_ready(cp, path, &obj, status, reason, message);
}

/// A wait that never holds: the stage fails after its timeout naming the object and its last
/// condition, the daemon's status says so, and the next run resumes at that stage. Then the
/// API away: exit 2.
fn failures(cp: &'static ControlPlane) {
    let s = node_with(
        cp,
        "bs-makise",
        "bs-waiter",
        "[[bootstrap.stages]]\nname = \"first\"\npath = \"{dir}/first.yaml\"\n\
         wait = [\"crd/bswaits.test.ginx.io\"]\n\n\
         [[bootstrap.stages]]\nname = \"never\"\npath = \"{dir}/never.yaml\"\n\
         wait = [\"test.ginx.io/BsWait/default/w\"]\ntimeout = \"4s\"\n",
    );
    std::fs::write(
        s.dir.join("first.yaml"),
        format!(
            "{}---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: bs-first, namespace: default}}\ndata: {{a: b}}\n",
            crd("bswaits", "test.ginx.io", "BsWait")
        ),
    )
    .unwrap();
    std::fs::write(
        s.dir.join("never.yaml"),
        "apiVersion: test.ginx.io/v1\nkind: BsWait\nmetadata: {name: w, namespace: default}\nspec: {a: b}\n",
    )
    .unwrap();
    delete_lease(cp);
    let daemon = s.env.start();
    assert_eq!(daemon.status()["bootstrap"]["phase"], "pending");
    // The object's controller says it is not ready, and stays so.
    let setter = std::thread::spawn(move || {
        set_ready(cp, "False", "Progressing", "still reconciling");
    });
    let out = bootstrap(&s, &[]);
    setter.join().unwrap();
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    let why = "test.ginx.io/BsWait/default/w did not hold within the stage's timeout: \
               Ready=False (Progressing: still reconciling)";
    assert!(t.contains(why), "{t}");
    let b = daemon.status()["bootstrap"].clone();
    assert_eq!(b["phase"], "failed", "{b:#}");
    assert_eq!(b["stage"], "never", "{b:#}");
    assert_eq!(b["done"], json!(["first"]), "{b:#}");
    assert!(b["error"].as_str().unwrap().contains(why), "{b:#}");
    let line = daemon.ctl_ok(&["status"]);
    assert!(
        line.contains("bootstrap  failed, stage never: test.ginx.io/BsWait/default/w did not hold"),
        "{line}"
    );
    // The stage is not recorded (the one before it is): the next run tries it again.
    let cm = cp
        .get_path("/api/v1/namespaces/kube-system/configmaps/ginx-bootstrap")
        .unwrap();
    assert!(
        cm["data"]["never"].is_null() && cm["data"]["first"].is_string(),
        "{cm:#}"
    );

    // Once the object is ready, the next run resumes at the failed stage.
    set_ready(cp, "True", "Succeeded", "reconciled");
    let out = bootstrap(&s, &[]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(t.contains("stage first: unchanged"), "{t}");
    assert!(t.contains("stage never: applying 1 object(s)"), "{t}");
    let b = daemon.status()["bootstrap"].clone();
    assert_eq!(b["phase"], "done", "{b:#}");
    assert_eq!(b["done"], json!(["first", "never"]), "{b:#}");
    assert!(b["error"].is_null(), "{b:#}");

    // The API away: exit 2, naming it.
    let away = s.env.root.join("away.conf");
    let text_kc = std::fs::read_to_string(&s.kubeconfig).unwrap();
    let server = text_kc
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: "))
        .unwrap()
        .to_owned();
    std::fs::write(&away, text_kc.replace(&server, "https://127.0.0.1:9")).unwrap();
    s.env.dropin(
        "61-away.toml",
        &format!("[bootstrap]\nkubeconfig = \"{}\"\n", away.display()),
    );
    let out = bootstrap(&s, &[]);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(2), "{t}");
    assert!(
        t.contains("is the API server at https://127.0.0.1:9/ up?"),
        "{t}"
    );
    assert_eq!(daemon.status()["bootstrap"]["phase"], "failed");
    daemon.stop();
    delete(
        cp,
        &[
            "configmap -n default bs-first",
            "crd bswaits.test.ginx.io",
            "configmap -n kube-system ginx-bootstrap",
        ],
    );
}

/// `ginxctl bootstrap` started in the background, its output in `log`.
fn spawn_bootstrap(s: &Setup, log: &std::path::Path) -> std::process::Child {
    let f = std::fs::File::create(log).unwrap();
    ginxctl(s, &["bootstrap"])
        .stdout(f.try_clone().unwrap())
        .stderr(f)
        .spawn()
        .unwrap()
}

/// Two nodes bootstrap at once: one runs, the other says who holds `ginx-bootstrap`. Then a
/// run stopped by Ctrl-C (the lock given back) and one killed (status does not claim it runs).
fn two_at_once_interrupted_and_killed(cp: &ControlPlane) {
    let stages = "[[bootstrap.stages]]\nname = \"slow\"\npath = \"{dir}/slow.yaml\"\n\
                  wait = [\"crd/bsslows.test.ginx.io\"]\ntimeout = \"2m\"\n";
    let slow = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: bs-slow, namespace: default}\ndata: {a: b}\n";
    let a = node_with(cp, "bs-a", "bs-admin-a", stages);
    let b = node_with(cp, "bs-b", "bs-admin-b", stages);
    std::fs::write(a.dir.join("slow.yaml"), slow).unwrap();
    std::fs::write(b.dir.join("slow.yaml"), slow).unwrap();
    delete_lease(cp);
    let da = a.env.start();
    let db = b.env.start();
    let log = a.env.root.join("bootstrap-a.log");
    // On a terminal (script(1) gives it one): the wait is a live line, redrawn in place.
    let mut run_a = if crate::support::require("script") {
        let cmd = format!(
            "{} --config {} --socket {} bootstrap",
            ginxctl_bin().display(),
            a.env.config.display(),
            a.env.socket.display()
        );
        let f = std::fs::File::create(&log).unwrap();
        Command::new("script")
            .args(["-qefc", &cmd, "/dev/null"])
            .env_remove("GINX_SOCKET")
            .stdout(f.try_clone().unwrap())
            .stderr(f)
            .spawn()
            .unwrap()
    } else {
        spawn_bootstrap(&a, &log)
    };
    let st = da.wait_status("a's bootstrap waiting", |s| {
        s["bootstrap"]["phase"] == "waiting"
    });
    let bs = &st["bootstrap"];
    assert_eq!(bs["stage"], "slow", "{bs:#}");
    assert!(
        bs["waiting_for"]
            .as_str()
            .unwrap()
            .starts_with("crd/bsslows.test.ginx.io: it does not exist"),
        "{bs:#}"
    );
    // The pid of ginxctl itself, from the socket peer.
    let pid = bs["pid"].as_u64().unwrap();
    assert!(
        std::fs::read_to_string(format!("/proc/{pid}/cmdline"))
            .unwrap()
            .contains("bootstrap"),
        "{bs:#}"
    );
    let status = da.ctl_ok(&["status"]);
    assert!(
        status.contains(
            "bootstrap  waiting, stage slow: crd/bsslows.test.ginx.io: it does not exist"
        ),
        "{status}"
    );

    // A second run on the same node is refused too (the Lease names the run, not only the
    // node), and its report does not overwrite the first one's progress.
    let out = bootstrap(&a, &[]);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    assert!(t.contains(&format!("is held by bs-a/ginxctl-{pid}")), "{t}");
    assert!(
        t.contains(&format!(
            "a bootstrap by pid {pid} is under way on this node"
        )),
        "{t}"
    );
    let st = da.status()["bootstrap"].clone();
    assert_eq!(st["phase"], "waiting", "{st:#}");
    assert_eq!(st["pid"], pid, "{st:#}");

    // The other node is refused, naming the holder; its own status says so.
    let out = bootstrap(&b, &[]);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    assert!(
        t.contains("another bootstrap runs: Lease ginx-system/ginx-bootstrap is held by bs-a"),
        "{t}"
    );
    let bb = db.status()["bootstrap"].clone();
    assert_eq!(bb["phase"], "failed", "{bb:#}");
    assert!(
        bb["error"].as_str().unwrap().contains("held by bs-a"),
        "{bb:#}"
    );
    assert_eq!(da.status()["bootstrap"]["phase"], "waiting");

    // What a waits for appears: it finishes, and gives the lock back.
    cp.apply(&crd("bsslows", "test.ginx.io", "BsSlow"));
    let code = run_a.wait().unwrap();
    let t = read_output(&log);
    assert!(code.success(), "{t}");
    assert!(t.contains("crd/bsslows.test.ginx.io holds"), "{t}");
    if crate::support::which("script").is_some() {
        assert!(
            t.contains("\r\x1b[2K  waiting for crd/bsslows.test.ginx.io: it does not exist ("),
            "no live line: {t:?}"
        );
    }
    let st = da.status()["bootstrap"].clone();
    assert_eq!(st["phase"], "done", "{st:#}");
    assert_eq!(st["done"], json!(["slow"]), "{st:#}");
    let lease = cp.lease("ginx-system", "ginx-bootstrap").unwrap();
    assert!(lease["spec"]["holderIdentity"].is_null(), "{lease:#}");

    // Ctrl-C: exit 130, the lock given back, the status failed with why.
    let never = "[[bootstrap.stages]]\nname = \"stuck\"\npath = \"{dir}/stuck.yaml\"\n\
                 wait = [\"crd/bsnevers.test.ginx.io\"]\ntimeout = \"5m\"\n";
    a.env.dropin(
        "60-bootstrap.toml",
        &format!(
            "[bootstrap]\nkubeconfig = \"{}\"\n\n{}",
            a.kubeconfig.display(),
            never.replace("{dir}", &a.dir.display().to_string())
        ),
    );
    std::fs::write(
        a.dir.join("stuck.yaml"),
        slow.replace("bs-slow", "bs-stuck"),
    )
    .unwrap();
    let mut run = spawn_bootstrap(&a, &log);
    da.wait_status("the stuck stage waiting", |s| {
        s["bootstrap"]["phase"] == "waiting" && s["bootstrap"]["stage"] == "stuck"
    });
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(run.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let code = run.wait().unwrap();
    let t = read_output(&log);
    assert_eq!(code.code(), Some(130), "{t}");
    assert!(t.contains("interrupted"), "{t}");
    let lease = cp.lease("ginx-system", "ginx-bootstrap").unwrap();
    assert!(lease["spec"]["holderIdentity"].is_null(), "{lease:#}");
    let st = da.status()["bootstrap"].clone();
    assert_eq!(st["phase"], "failed", "{st:#}");
    assert!(
        st["error"].as_str().unwrap().contains("interrupted"),
        "{st:#}"
    );

    // Killed: nobody reports the end, and status does not claim a run under way.
    let mut run = spawn_bootstrap(&a, &log);
    da.wait_status("the stuck stage waiting again", |s| {
        s["bootstrap"]["phase"] == "waiting"
    });
    run.kill().unwrap();
    run.wait().unwrap();
    let st = da.status()["bootstrap"].clone();
    assert_eq!(st["phase"], "failed", "{st:#}");
    assert!(
        st["error"]
            .as_str()
            .unwrap()
            .contains("ended before it finished, in stage stuck"),
        "{st:#}"
    );
    da.stop();
    db.stop();
    delete_lease(cp);
    delete(
        cp,
        &[
            "configmap -n default bs-slow bs-stuck",
            "crd bsslows.test.ginx.io",
            "configmap -n kube-system ginx-bootstrap",
        ],
    );
}

/// `[bootstrap] after_init`: `ginxctl kubeadm init` (the stand-in kubeadm; admin.conf for the
/// real control plane) prints the join command, then runs the bootstrap once the API answers.
fn after_init(cp: &ControlPlane) {
    use std::os::unix::fs::PermissionsExt;
    let s = node_with(
        cp,
        "bs-init",
        "bs-initer",
        "after_init = true\n\n[[bootstrap.stages]]\nname = \"init-cm\"\npath = \"{dir}/cm.yaml\"\n",
    );
    std::fs::write(
        s.dir.join("cm.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: bs-after-init, namespace: default}\ndata: {a: b}\n",
    )
    .unwrap();
    let root = s.env.root.clone();
    let stub = root.join("bin/kubeadm");
    std::fs::copy(crate::support::support_dir().join("kubeadm-stub"), &stub).unwrap();
    std::fs::set_permissions(&stub, std::fs::Permissions::from_mode(0o755)).unwrap();
    s.env.dropin(
        "50-kubeadm.toml",
        &format!(
            "[node]\nrole = \"control-plane\"\nadvertise_address = \"10.0.0.11\"\nnode_ip = \"10.0.0.11\"\n\n\
             [kubeadm]\nkubeadm_path = \"{stub}\"\noutput_dir = \"{root}/kubeadm\"\nca_cert = \"{root}/pki/ca.crt\"\n\
             admin_kubeconfig = \"{kc}\"\ncluster_name = \"kaas\"\nkubernetes_version = \"v1.33.4\"\n\
             control_plane_endpoint = \"10.0.0.100:6443\"\npod_subnet = \"10.244.0.0/16\"\n\
             service_subnet = \"10.96.0.0/12\"\n\n[kubeadm.kube_vip]\ninterface = \"eno1\"\n\
             manifest_path = \"{root}/manifests/kube-vip.yaml\"\n",
            stub = stub.display(),
            root = root.display(),
            kc = s.kubeconfig.display(),
        ),
    );
    // kubeadm would have made the binding by now; kube-vip's switch to admin.conf waits for it.
    cp.apply(
        &json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "kubeadm:cluster-admins"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "kubeadm:cluster-admins"}]})
        .to_string(),
    );
    delete_lease(cp);
    let init = |extra: &[&str]| {
        let args = [&["kubeadm", "init"], extra].concat();
        let out = ginxctl(&s, &args)
            .env("STUB_KUBEADM_DIR", root.join("kubeadm-stub"))
            .env(
                "STUB_KUBEADM_MANIFEST",
                root.join("manifests/kube-vip.yaml"),
            )
            .output()
            .unwrap();
        crate::support::sweep::collect_ctl(&args, &out);
        out
    };
    // --no-bootstrap: kubeadm init alone.
    let out = init(&["--bootstrap", "--no-bootstrap"]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(!t.contains("stage init-cm"), "{t}");
    assert!(
        cp.get_path("/api/v1/namespaces/default/configmaps/bs-after-init")
            .is_none()
    );
    let out = init(&[]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let join = stdout.find("joinCPKubeadm ").expect("the join command");
    let applied = stdout
        .find("stage init-cm: applying 1 object(s)")
        .unwrap_or_else(|| panic!("{t}"));
    assert!(join < applied, "{stdout}");
    assert!(stdout.contains("bootstrap: every stage holds"), "{stdout}");
    assert!(
        cp.get_path("/api/v1/namespaces/default/configmaps/bs-after-init")
            .is_some()
    );
    delete(
        cp,
        &[
            "configmap -n default bs-after-init",
            "clusterrolebinding kubeadm:cluster-admins",
            "configmap -n kube-system ginx-bootstrap",
        ],
    );
}
