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
const FLUX: &str = "\
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: fluxinstances.fluxcd.controlplane.io}
spec:
  group: fluxcd.controlplane.io
  names: {kind: FluxInstance, plural: fluxinstances, singular: fluxinstance}
  scope: Namespaced
  versions:
    - name: v1
      served: true
      storage: true
      subresources: {status: {}}
      schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}
";

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
        ("flux.yaml", FLUX),
    ] {
        std::fs::write(dir.join(f), t).unwrap();
    }
    let kubeconfig = env.root.join("admin.conf");
    cp.kubeconfig_for(&kubeconfig, user, &["system:masters"]);
    let token = env.root.join("argus.token");
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
             [sources.argus]\nurl = \"https://git.example.com/argus.git\"\ntoken_file = \"{token}\"\n",
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

fn bootstrap(s: &Setup, args: &[&str]) -> Output {
    Command::new(ginxctl_bin())
        .arg("--config")
        .arg(&s.env.config)
        .arg("--socket")
        .arg(&s.env.socket)
        .arg("bootstrap")
        .args(args)
        .env_remove("GINX_SOCKET")
        .output()
        .expect("running ginxctl")
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
    let generation = obj["metadata"]["generation"].as_i64().unwrap_or(1);
    let (code, body) = cp.request(
        "PATCH",
        &format!("{path}/status"),
        "application/merge-patch+json",
        &json!({"status": {"conditions": [{"type": "Ready", "status": "True",
            "reason": "ReconciliationSucceeded", "message": "Reconciliation finished",
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
    for args in [
        &[
            "delete",
            "namespace",
            "bs-system",
            "bs-flux",
            "flux-system",
            "--ignore-not-found",
            "--wait=false",
        ][..],
        &[
            "delete",
            "crd",
            "bsnodes.cni.test.ginx.io",
            "fluxinstances.fluxcd.controlplane.io",
            "--ignore-not-found",
        ],
        &[
            "delete",
            "configmap",
            "-n",
            "kube-system",
            "ginx-bootstrap",
            "--ignore-not-found",
        ],
        &[
            "delete",
            "lease",
            "-n",
            "ginx-system",
            "ginx-bootstrap",
            "--ignore-not-found",
        ],
    ] {
        let _ = cp.kubectl_output(args);
    }
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
    assert_eq!(
        fi["spec"]["sync"]["url"], "https://git.example.com/argus.git",
        "{fi:#}"
    );
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
    let _ = mark;
    cleanup(cp);
    failures(cp);
}

/// A wait that never holds, a bootstrap already running elsewhere, the API away.
fn failures(cp: &ControlPlane) {
    // Its own names: a stage that waits for a Deployment that never exists.
    let env = Env::new();
    let dir = env.root.join("b");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("cm.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: bs-wait, namespace: default}\ndata: {a: b}\n",
    )
    .unwrap();
    let kc = env.root.join("admin.conf");
    cp.kubeconfig_for(&kc, "bs-waiter", &["system:masters"]);
    env.dropin("10-node.toml", "[node]\nname = \"bs-makise\"\n");
    env.dropin(
        "60-bootstrap.toml",
        &format!(
            "[bootstrap]\nkubeconfig = \"{}\"\n\n[[bootstrap.stages]]\nname = \"never\"\n\
             path = \"{}/cm.yaml\"\nwait = [\"deployment/default/bs-missing\"]\ntimeout = \"3s\"\n",
            kc.display(),
            dir.display()
        ),
    );
    let s = Setup {
        env,
        kubeconfig: kc,
        dir,
    };
    let _ = cp.kubectl_output(&[
        "delete",
        "lease",
        "-n",
        "ginx-system",
        "ginx-bootstrap",
        "--ignore-not-found",
    ]);
    let out = bootstrap(&s, &[]);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    assert!(t.contains("deployment/default/bs-missing did not hold within the stage's timeout: it does not exist"), "{t}");
    // The stage is not recorded: the next run tries it again.
    let cm = cp.get_path("/api/v1/namespaces/kube-system/configmaps/ginx-bootstrap");
    assert!(
        cm.as_ref().is_none_or(|c| c["data"]["never"].is_null()),
        "{cm:?}"
    );

    // Someone else holds the lock: it says who.
    cp.apply(
        &json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "ginx-bootstrap", "namespace": "ginx-system"},
            "spec": {"holderIdentity": "bs-quinn", "leaseDurationSeconds": 600,
                "renewTime": jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string()}})
        .to_string(),
    );
    let out = bootstrap(&s, &[]);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    assert!(
        t.contains("another bootstrap runs") && t.contains("held by bs-quinn"),
        "{t}"
    );
    let _ = cp.kubectl_output(&["delete", "lease", "-n", "ginx-system", "ginx-bootstrap"]);

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
    assert!(t.contains("is the API server up?"), "{t}");
    let _ = cp.kubectl_output(&[
        "delete",
        "configmap",
        "-n",
        "default",
        "bs-wait",
        "--ignore-not-found",
    ]);
}
