//! A stand-in kubelet for the real control plane (control_plane.rs), which has none.
//!
//! What it does, as a kubelet does, with a kubelet's own identity (`CN=system:node:<name>`,
//! `O=system:nodes`, authorized by the API server's Node authorizer):
//! - registers its Node (`kubernetes.io/hostname`, `kubernetes.io/os` labels) and posts the
//!   node conditions `Ready`, `MemoryPressure`, `DiskPressure`, `PIDPressure` to
//!   `nodes/status` (strategic merge by type), again whenever [`Kubelet::set_ready`] changes;
//! - renews the node's Lease in `kube-node-lease` every 10 s with a 40 s duration, so that
//!   kube-controller-manager's node lifecycle controller keeps the node Ready; stop the
//!   stand-in ([`Kubelet::stop`]) and the controller marks it `Unknown` and taints it after
//!   its grace period, as for a dead kubelet;
//! - watches the pods bound to the node (`spec.nodeName`), marks them Running and Ready, and
//!   deletes (grace period 0) those being deleted, as a kubelet does once their containers
//!   stopped; a pod annotated [`STOP_SECONDS`] takes that long to stop (a container that
//!   uses its grace period), so that a drain takes a known time.
//!
//! What it does not imitate: containers, images, volumes, probes, restarts, resource
//! accounting or eviction, the kubelet's HTTP endpoints, status updates beyond the conditions
//! above. Role labels are set by the admin, as kubeadm does.

use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent};
use serde_json::json;
use tokio::sync::watch;

use super::control_plane::ControlPlane;

/// On a pod: its containers take this many seconds to stop once it is deleted.
pub const STOP_SECONDS: &str = "stand-in.ginx.io/stop-seconds";

/// One runtime for every stand-in kubelet of the test binary, on threads that live as long as
/// the process.
pub fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("stand-in-kubelet")
            .enable_all()
            .build()
            .unwrap()
    })
}

/// A client for the kubeconfig at `path`.
pub async fn client(path: &Path) -> kube::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let kc = kube::config::Kubeconfig::read_from(path).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    kube::Client::try_from(config).unwrap()
}

pub struct Kubelet {
    pub node: String,
    /// Deletes the Node when the stand-in goes: the control plane is shared, and a dead
    /// control-plane node left behind would hold every later test's quorum guard.
    admin: kube::Client,
    ready: watch::Sender<bool>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Kubelet {
    /// Registers `node` (with `role` = "control-plane" adding the control-plane role label, as
    /// kubeadm does), Ready, and keeps it so until stopped. Returns once the node is Ready.
    pub fn start(cp: &ControlPlane, node: &str, role: &str) -> Self {
        let kubeconfig = cp.dir.join(format!("kubelet-{node}.kubeconfig"));
        cp.kubeconfig_for(
            &kubeconfig,
            &format!("system:node:{node}"),
            &["system:nodes"],
        );
        let (ready, ready_rx) = watch::channel(true);
        let name = node.to_owned();
        let (registered_tx, registered) = std::sync::mpsc::channel();
        let task = runtime().spawn(async move {
            let client = client(&kubeconfig).await;
            register(&client, &name).await;
            let _ = registered_tx.send(());
            let c = client.clone();
            let n = name.clone();
            let pods = tokio::spawn(async move { run_pods(c, n).await });
            run_node(client, name, ready_rx).await;
            pods.abort();
        });
        registered
            .recv()
            .expect("the stand-in kubelet registers its node");
        if role == "control-plane" {
            cp.kubectl(&[
                "label",
                "node",
                node,
                "node-role.kubernetes.io/control-plane=",
                "--overwrite",
            ]);
        }
        super::wait_for(&format!("node {node} Ready"), || {
            let n = cp.node(node)?;
            let ready = n["status"]["conditions"]
                .as_array()?
                .iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True");
            ready.then_some(())
        });
        Self {
            node: node.to_owned(),
            admin: cp.admin(),
            ready,
            task: Some(task),
        }
    }

    /// Posts `Ready` True or False (reason `KubeletNotReady`), as a kubelet whose runtime or
    /// network broke.
    pub fn set_ready(&self, ready: bool) {
        self.ready.send_replace(ready);
    }

    /// Stops renewing the node lease and posting status, as a dead kubelet.
    pub fn stop(&mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.stop();
        let nodes: Api<Node> = Api::all(self.admin.clone());
        let name = self.node.clone();
        let _ = runtime().block_on(async move { nodes.delete(&name, &Default::default()).await });
    }
}

async fn register(client: &kube::Client, name: &str) {
    let nodes: Api<Node> = Api::all(client.clone());
    let node: Node = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {
            "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64"}},
        "spec": {}
    }))
    .unwrap();
    match nodes.create(&PostParams::default(), &node).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => panic!("stand-in kubelet: registering node {name}: {e}"),
    }
    post_status(client, name, true).await;
}

async fn post_status(client: &kube::Client, name: &str, ready: bool) {
    let nodes: Api<Node> = Api::all(client.clone());
    let now = jiff::Timestamp::now()
        .round(jiff::Unit::Second)
        .unwrap()
        .to_string();
    let cond = |t: &str, status: &str, reason: &str, message: &str| {
        json!({"type": t, "status": status, "reason": reason, "message": message,
               "lastHeartbeatTime": now, "lastTransitionTime": now})
    };
    let (status, reason, message) = if ready {
        ("True", "KubeletReady", "kubelet is posting ready status")
    } else {
        (
            "False",
            "KubeletNotReady",
            "container runtime network not ready",
        )
    };
    let patch = json!({"status": {
        "conditions": [
            cond("MemoryPressure", "False", "KubeletHasSufficientMemory", ""),
            cond("DiskPressure", "False", "KubeletHasNoDiskPressure", ""),
            cond("PIDPressure", "False", "KubeletHasSufficientPID", ""),
            cond("Ready", status, reason, message),
        ],
        "addresses": [{"type": "InternalIP", "address": "127.0.0.1"},
                      {"type": "Hostname", "address": name}],
        "capacity": {"cpu": "4", "memory": "8Gi", "pods": "110"},
        "allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"},
        "nodeInfo": {"kubeletVersion": super::control_plane::KUBERNETES_VERSION,
                     "architecture": "amd64", "operatingSystem": "linux",
                     "containerRuntimeVersion": "stand-in://0", "kernelVersion": "",
                     "kubeProxyVersion": "", "machineID": "", "systemUUID": "",
                     "bootID": "", "osImage": "NixOS"}
    }});
    // A kubelet's status update can race the controller manager's own writes: try again.
    for _ in 0..5 {
        match nodes
            .patch_status(name, &PatchParams::default(), &Patch::Strategic(&patch))
            .await
        {
            Ok(_) => return,
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// Renews the node lease every 10 s and posts status when readiness changes.
async fn run_node(client: kube::Client, name: String, mut ready: watch::Receiver<bool>) {
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let mut tick = tokio::time::interval(Duration::from_secs(10));
    loop {
        tokio::select! {
            _ = tick.tick() => renew(&leases, &name).await,
            changed = ready.changed() => {
                if changed.is_err() {
                    return;
                }
                let r = *ready.borrow_and_update();
                post_status(&client, &name, r).await;
            }
        }
    }
}

async fn renew(leases: &Api<Lease>, name: &str) {
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(jiff::Timestamp::now());
    match leases.get_opt(name).await {
        Ok(Some(mut lease)) => {
            let spec = lease.spec.get_or_insert_with(Default::default);
            spec.renew_time = Some(now);
            let _ = leases.replace(name, &PostParams::default(), &lease).await;
        }
        Ok(None) => {
            let lease: Lease = serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "kube-node-lease"},
                "spec": {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": now}
            }))
            .unwrap();
            let _ = leases.create(&PostParams::default(), &lease).await;
        }
        Err(_) => {}
    }
}

/// Marks pods bound to the node Running and Ready, and deletes those being deleted.
async fn run_pods(client: kube::Client, name: String) {
    let pods: Api<Pod> = Api::all(client.clone());
    let selector = format!("spec.nodeName={name}");
    loop {
        let Ok(list) = pods.list(&ListParams::default().fields(&selector)).await else {
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        };
        for pod in &list.items {
            tend(&client, pod).await;
        }
        let rv = list.metadata.resource_version.unwrap_or_default();
        let params = kube::api::WatchParams::default()
            .fields(&selector)
            .timeout(60);
        let Ok(stream) = pods.watch(&params, &rv).await else {
            tokio::time::sleep(Duration::from_secs(1)).await;
            continue;
        };
        use futures_util::StreamExt;
        let mut stream = std::pin::pin!(stream);
        while let Some(Ok(event)) = stream.next().await {
            match event {
                WatchEvent::Added(pod) | WatchEvent::Modified(pod) => tend(&client, &pod).await,
                WatchEvent::Error(_) => break,
                _ => {}
            }
        }
    }
}

/// Deletes the pod for good (grace period 0), as a kubelet does once its containers stopped.
async fn finalize(client: &kube::Client, ns: &str, name: &str, uid: Option<String>) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let _ = pods
        .delete(
            name,
            &DeleteParams {
                grace_period_seconds: Some(0),
                preconditions: uid.map(|uid| kube::api::Preconditions {
                    uid: Some(uid),
                    resource_version: None,
                }),
                ..Default::default()
            },
        )
        .await;
}

async fn tend(client: &kube::Client, pod: &Pod) {
    let (Some(ns), Some(name)) = (&pod.metadata.namespace, &pod.metadata.name) else {
        return;
    };
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    if pod.metadata.deletion_timestamp.is_some() {
        let stop = pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(STOP_SECONDS))
            .and_then(|s| s.parse::<u64>().ok());
        if let Some(secs) = stop {
            let client = client.clone();
            let (ns, name, uid) = (ns.clone(), name.clone(), pod.metadata.uid.clone());
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_secs(secs)).await;
                finalize(&client, &ns, &name, uid).await;
            });
            return;
        }
        finalize(client, ns, name, pod.metadata.uid.clone()).await;
        return;
    }
    let status = pod.status.as_ref();
    let running = status.and_then(|s| s.phase.as_deref()) == Some("Running");
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    if running && ready {
        return;
    }
    let now = jiff::Timestamp::now()
        .round(jiff::Unit::Second)
        .unwrap()
        .to_string();
    let cond = |t: &str| json!({"type": t, "status": "True", "lastTransitionTime": now});
    let containers: Vec<serde_json::Value> = pod
        .spec
        .as_ref()
        .map(|s| {
            s.containers
                .iter()
                .map(|c| {
                    json!({"name": c.name, "image": c.image, "imageID": "", "ready": true,
                           "started": true, "restartCount": 0,
                           "state": {"running": {"startedAt": now}}})
                })
                .collect()
        })
        .unwrap_or_default();
    let patch = json!({"status": {
        "phase": "Running", "startTime": now, "hostIP": "127.0.0.1", "podIP": "127.0.0.1",
        "conditions": [cond("PodScheduled"), cond("Initialized"), cond("ContainersReady"),
                       cond("Ready")],
        "containerStatuses": containers,
    }});
    let _ = pods
        .patch_status(name, &PatchParams::default(), &Patch::Strategic(&patch))
        .await;
}
