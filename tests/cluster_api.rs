//! packaging/cluster-api against Cluster API's own CRDs (from the Go module of the pinned
//! release, `go mod download`; nothing fetched is committed) in the real control plane, with
//! strict server-side field validation, so that the real schema refuses any wrong field. Then
//! the files rendered as CABPK renders them (a cloud-config with `write_files`, its
//! `## template: jinja` header, `contentFrom` resolved from the Secret), checked by
//! `cloud-init schema` and, with the Jinja node name substituted and merged with the image's
//! configuration, by `ginx check-config`.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

use crate::support::control_plane::{self, ControlPlane};
use crate::support::{self, succeed};

/// The Cluster API release the clusters here pin (v1.13/v1.14 contract, v1beta2).
const CAPI_VERSION: &str = "v1.14.2";
const NS: &str = "capi-ginx";
/// The Secrets of the rendering test (its own namespace).
const SECRETS_NS: &str = "capi-ginx-secrets";
const HEPHAESTUS: &str = "ssh://git@git.example.com/infra/hephaestus.git";
/// The node name's expression, in nodeRegistration.name and in ginx's drop-in alike.
const NODE_NAME: &str = "{{ ds.meta_data.local_hostname }}";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo().join(rel)).unwrap()
}

fn yaml(text: &str) -> Value {
    serde_saphyr::from_str(text).unwrap()
}

/// The Cluster API module's directory in Go's module cache (downloaded on first use).
fn capi_module() -> Option<PathBuf> {
    let go = support::which("go").or_else(|| {
        let p = PathBuf::from("/usr/local/go/bin/go");
        p.exists().then_some(p)
    });
    let Some(go) = go else {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "go is needed for Cluster API's CRDs (CI=true)"
        );
        eprintln!("skipping: no go for Cluster API's CRDs");
        return None;
    };
    let dir = tempfile::tempdir().unwrap();
    let out = succeed(
        Command::new(go)
            .args(["mod", "download", "-json"])
            .arg(format!("sigs.k8s.io/cluster-api@{CAPI_VERSION}"))
            .env("GOTOOLCHAIN", "auto")
            .current_dir(dir.path()),
    );
    let info: Value = serde_json::from_slice(&out.stdout).unwrap();
    Some(PathBuf::from(info["Dir"].as_str().unwrap()))
}

const CRDS: [&str; 4] = [
    "bootstrap/kubeadm/config/crd/bases/bootstrap.cluster.x-k8s.io_kubeadmconfigtemplates.yaml",
    "controlplane/kubeadm/config/crd/bases/controlplane.cluster.x-k8s.io_kubeadmcontrolplanes.yaml",
    "controlplane/kubeadm/config/crd/bases/controlplane.cluster.x-k8s.io_kubeadmcontrolplanetemplates.yaml",
    "core/config/crd/bases/cluster.x-k8s.io_clusterclasses.yaml",
];

fn install_crds(cp: &ControlPlane, module: &Path) {
    for crd in CRDS {
        let path = module.join(crd);
        cp.kubectl(&[
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            path.to_str().unwrap(),
        ]);
    }
    cp.kubectl(&[
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/kubeadmconfigtemplates.bootstrap.cluster.x-k8s.io",
        "crd/kubeadmcontrolplanes.controlplane.cluster.x-k8s.io",
        "crd/kubeadmcontrolplanetemplates.controlplane.cluster.x-k8s.io",
        "crd/clusterclasses.cluster.x-k8s.io",
    ]);
    let _ = cp.kubectl_output(&["create", "namespace", NS]);
}

/// Server-side dry run with strict field validation: Ok, or the API's refusal.
fn dry_run(cp: &ControlPlane, obj: &Value) -> Result<(), String> {
    let out = cp.kubectl_stdin_output(
        &[
            "apply",
            "--server-side",
            "--dry-run=server",
            "--validate=strict",
            "--field-manager=ginx-test",
            "-n",
            NS,
            "-f",
            "-",
        ],
        &obj.to_string(),
    );
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// Go's text/template for the actions the patch uses: `{{ "literal" }}`, `{{ .variable }}`
/// (dotted names for builtins) and `{{ .variable | toJson }}`; any other action fails the test
/// (it would need the real engine).
fn go_template(t: &str, vars: &[(&str, &str)]) -> String {
    let mut out = String::new();
    let mut rest = t;
    while let Some(i) = rest.find("{{") {
        out.push_str(&rest[..i]);
        let after = &rest[i + 2..];
        // The action ends at the first `}}` outside a string literal.
        let inner = after.trim_start();
        let (value, len) = if let Some(lit) = inner.strip_prefix('"') {
            let end = lit.find('"').expect("an unterminated literal");
            let close = lit[end + 1..].find("}}").expect("an unclosed action");
            assert!(lit[end + 1..end + 1 + close].trim().is_empty(), "{t}");
            let consumed = (after.len() - inner.len()) + 1 + end + 1 + close + 2;
            (lit[..end].to_owned(), consumed)
        } else {
            let close = after.find("}}").expect("an unclosed action");
            let action = after[..close].trim();
            let (name, json) = match action.split_once('|') {
                Some((n, f)) if f.trim() == "toJson" => (n.trim(), true),
                Some(_) => panic!("a pipeline this stand-in cannot run: {action}"),
                None => (action, false),
            };
            let name = name
                .strip_prefix('.')
                .unwrap_or_else(|| panic!("an action this stand-in cannot run: {action}"));
            let v = vars
                .iter()
                .find(|(k, _)| *k == name)
                .unwrap_or_else(|| panic!("no variable {name}"))
                .1;
            let v = if json {
                serde_json::to_string(v).unwrap()
            } else {
                v.to_owned()
            };
            (v, close + 2)
        };
        out.push_str(&value);
        rest = &after[len..];
    }
    out.push_str(rest);
    out
}

/// RFC 6902 `add` for the paths the patch uses (object members, and `-` on an array).
fn json_patch_add(doc: &mut Value, path: &str, value: Value) {
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let (last, parents) = parts.split_last().unwrap();
    let mut at = doc;
    for p in parents {
        at = at.get_mut(*p).unwrap_or_else(|| panic!("{path}: no {p}"));
    }
    match (at, *last) {
        (Value::Array(a), "-") => a.push(value),
        (Value::Object(o), key) => {
            o.insert(key.to_owned(), value);
        }
        _ => panic!("{path}: cannot add there"),
    }
}

/// Applies the ClusterClass patch's definitions for `kind` to `template`.
fn patched(patch: &Value, kind: &str, mut template: Value) -> Value {
    let vars = [
        ("ginxHephaestusUrl", HEPHAESTUS),
        ("builtin.cluster.name", "kaas"),
    ];
    for p in patch["patches"].as_array().unwrap() {
        for d in p["definitions"].as_array().unwrap() {
            if d["selector"]["kind"] != kind {
                continue;
            }
            for jp in d["jsonPatches"].as_array().unwrap() {
                assert_eq!(jp["op"], "add");
                let value = match jp["valueFrom"]["template"].as_str() {
                    Some(t) => yaml(&go_template(t, &vars)),
                    None => jp["value"].clone(),
                };
                json_patch_add(&mut template, jp["path"].as_str().unwrap(), value);
            }
        }
    }
    template
}

fn base_templates() -> (Value, Value) {
    let worker = json!({"apiVersion": "bootstrap.cluster.x-k8s.io/v1beta2",
        "kind": "KubeadmConfigTemplate", "metadata": {"name": "openstack-default-worker"},
        "spec": {"template": {"spec": {"joinConfiguration": {"nodeRegistration": {
            "name": "{{ ds.meta_data.local_hostname }}"}}}}}});
    let cp = json!({"apiVersion": "controlplane.cluster.x-k8s.io/v1beta2",
        "kind": "KubeadmControlPlaneTemplate", "metadata": {"name": "openstack-default-control-plane"},
        "spec": {"template": {"spec": {"kubeadmConfigSpec": {"initConfiguration": {
            "nodeRegistration": {"name": "{{ ds.meta_data.local_hostname }}"}}}}}}});
    (worker, cp)
}

#[test]
fn the_templates_and_the_cluster_class_patch_pass_cluster_apis_own_schema() {
    let Some(cp) = control_plane::shared() else {
        return;
    };
    let Some(module) = capi_module() else {
        return;
    };
    install_crds(cp, &module);
    let kct = yaml(&read("packaging/cluster-api/kubeadmconfigtemplate.yaml"));
    let kcp = yaml(&read("packaging/cluster-api/kubeadmcontrolplane.yaml"));
    dry_run(cp, &kct).unwrap();
    dry_run(cp, &kcp).unwrap();
    // The check bites: a misspelt field is refused by the real schema.
    let mut bad = kct.clone();
    bad["spec"]["template"]["spec"]["files"][1]["permission"] = json!("0600");
    let e = dry_run(cp, &bad).unwrap_err();
    assert!(
        e.contains("files[1].permission: field not declared in schema"),
        "{e}"
    );

    // The ClusterClass with the patch added, and the templates it patches.
    let patch = yaml(&read("packaging/cluster-api/clusterclass-patch.yaml"));
    let template_ref =
        |api: &str, kind: &str, name: &str| json!({"apiVersion": api, "kind": kind, "name": name});
    let class = json!({"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "ClusterClass",
        "metadata": {"name": "openstack-default"},
        "spec": {
            "controlPlane": {
                "templateRef": template_ref("controlplane.cluster.x-k8s.io/v1beta2", "KubeadmControlPlaneTemplate", "openstack-default-control-plane"),
                "machineInfrastructure": {"templateRef": template_ref("infrastructure.cluster.x-k8s.io/v1beta1", "OpenStackMachineTemplate", "openstack-default-control-plane")}},
            "infrastructure": {"templateRef": template_ref("infrastructure.cluster.x-k8s.io/v1beta1", "OpenStackClusterTemplate", "openstack-default")},
            "workers": {"machineDeployments": [{"class": "default-worker",
                "bootstrap": {"templateRef": template_ref("bootstrap.cluster.x-k8s.io/v1beta2", "KubeadmConfigTemplate", "openstack-default-worker")},
                "infrastructure": {"templateRef": template_ref("infrastructure.cluster.x-k8s.io/v1beta1", "OpenStackMachineTemplate", "openstack-default-worker")}}]},
            "variables": patch["variables"],
            "patches": patch["patches"]}});
    dry_run(cp, &class).unwrap();
    // What the topology controller makes of the templates: valid, and the same files as the
    // plain templates (with the variable's URL).
    let (worker, cpt) = base_templates();
    let worker = patched(&patch, "KubeadmConfigTemplate", worker);
    let cpt = patched(&patch, "KubeadmControlPlaneTemplate", cpt);
    dry_run(cp, &worker).unwrap();
    dry_run(cp, &cpt).unwrap();
    assert_eq!(
        worker["spec"]["template"]["spec"]["files"],
        kct["spec"]["template"]["spec"]["files"]
    );
    assert_eq!(
        worker["spec"]["template"]["spec"]["postKubeadmCommands"],
        kct["spec"]["template"]["spec"]["postKubeadmCommands"]
    );
    assert_eq!(
        cpt["spec"]["template"]["spec"]["kubeadmConfigSpec"]["files"],
        kcp["spec"]["kubeadmConfigSpec"]["files"]
    );
    assert_eq!(
        cpt["spec"]["template"]["spec"]["kubeadmConfigSpec"]["postKubeadmCommands"],
        kcp["spec"]["kubeadmConfigSpec"]["postKubeadmCommands"]
    );
    // ginx's node name is the Kubernetes node's: the same expression as nodeRegistration.name.
    let drop_in = |files: &Value| files[0]["content"].as_str().unwrap().to_owned();
    for (files, registration) in [
        (
            &kct["spec"]["template"]["spec"]["files"],
            &kct["spec"]["template"]["spec"]["joinConfiguration"]["nodeRegistration"]["name"],
        ),
        (
            &kcp["spec"]["kubeadmConfigSpec"]["files"],
            &kcp["spec"]["kubeadmConfigSpec"]["initConfiguration"]["nodeRegistration"]["name"],
        ),
        (
            &kcp["spec"]["kubeadmConfigSpec"]["files"],
            &kcp["spec"]["kubeadmConfigSpec"]["joinConfiguration"]["nodeRegistration"]["name"],
        ),
    ] {
        assert_eq!(registration, NODE_NAME);
        assert!(drop_in(files).contains(&format!("name = \"{NODE_NAME}\"")));
    }
}

/// What CABPK's cloud-init template makes of `files` and `postKubeadmCommands` (with
/// `contentFrom` resolved from `secret`), after bootstrap/kubeadm/pkg/cloudinit of v1.14:
/// `## template: jinja`, `#cloud-config`, `write_files` (`-   path:`, `owner:`,
/// `permissions: '…'`, `content: |` indented by six, the Secret's bytes as they are), and
/// `runcmd` with the kubeadm command first, then the post commands.
fn render_cabpk(
    files: &[Value],
    post: &[Value],
    kubeadm: &str,
    secret: &dyn Fn(&str, &str) -> Vec<u8>,
) -> String {
    let mut o = String::from("## template: jinja\n#cloud-config\nwrite_files:\n");
    for f in files {
        let content = match f["contentFrom"]["secret"].as_object() {
            Some(s) => String::from_utf8(secret(
                s["name"].as_str().unwrap(),
                s["key"].as_str().unwrap(),
            ))
            .unwrap(),
            None => f["content"].as_str().unwrap().to_owned(),
        };
        o.push_str(&format!("-   path: {}\n", f["path"].as_str().unwrap()));
        o.push_str(&format!("    owner: {}\n", f["owner"].as_str().unwrap()));
        o.push_str(&format!(
            "    permissions: '{}'\n",
            f["permissions"].as_str().unwrap()
        ));
        o.push_str("    content: |\n");
        for line in content.lines() {
            o.push_str(&format!("      {line}\n"));
        }
    }
    o.push_str("runcmd:\n");
    o.push_str(&format!(
        "  - {}\n",
        serde_json::to_string(kubeadm).unwrap()
    ));
    for c in post {
        o.push_str(&format!("  - {}\n", serde_json::to_string(c).unwrap()));
    }
    o
}

#[test]
fn the_rendered_cloud_config_passes_cloud_init_and_check_config_and_the_key_is_the_secrets() {
    let Some(cp) = control_plane::shared() else {
        return;
    };
    if !support::require("ssh-keygen") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let key = tmp.path().join("deploy_key");
    crate::support::ssh::keygen(&key, "ginx-deploy");
    let _ = cp.kubectl_output(&["create", "namespace", SECRETS_NS]);
    let _ = cp.kubectl_output(&[
        "delete",
        "secret",
        "-n",
        SECRETS_NS,
        "ginx-deploy-key",
        "ginx-kubeconfig",
        "--ignore-not-found",
    ]);
    let known_hosts = "git.example.com ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIClHfPWnfr/kZl++Ug0KJw1ocehMM+xklULDR8/FCDmV\n";
    std::fs::write(tmp.path().join("known_hosts"), known_hosts).unwrap();
    std::fs::write(
        tmp.path().join("kubeconfig"),
        "apiVersion: v1\nkind: Config\n",
    )
    .unwrap();
    cp.kubectl(&[
        "create",
        "secret",
        "generic",
        "-n",
        SECRETS_NS,
        "ginx-deploy-key",
        &format!("--from-file=deploy_key={}", key.display()),
        &format!(
            "--from-file=known_hosts={}",
            tmp.path().join("known_hosts").display()
        ),
    ]);
    cp.kubectl(&[
        "create",
        "secret",
        "generic",
        "-n",
        SECRETS_NS,
        "kaas-ginx-kubeconfig",
        &format!(
            "--from-file=kubeconfig={}",
            tmp.path().join("kubeconfig").display()
        ),
    ]);
    // contentFrom, resolved from the API as CABPK does.
    let secret = |name: &str, k: &str| -> Vec<u8> {
        use base64::Engine;
        let s = cp
            .get_path(&format!("/api/v1/namespaces/{SECRETS_NS}/secrets/{name}"))
            .unwrap();
        base64::engine::general_purpose::STANDARD
            .decode(s["data"][k].as_str().unwrap())
            .unwrap()
    };
    for (rel, role) in [
        ("packaging/cluster-api/kubeadmconfigtemplate.yaml", "worker"),
        (
            "packaging/cluster-api/kubeadmcontrolplane.yaml",
            "control-plane",
        ),
    ] {
        let doc = yaml(&read(rel));
        let spec = if role == "worker" {
            doc["spec"]["template"]["spec"].clone()
        } else {
            doc["spec"]["kubeadmConfigSpec"].clone()
        };
        let kubeadm = if role == "worker" {
            "kubeadm join --config /run/kubeadm/kubeadm-join-config.yaml && echo success > /run/cluster-api/bootstrap-success.complete"
        } else {
            "kubeadm init --config /run/kubeadm/kubeadm.yaml && echo success > /run/cluster-api/bootstrap-success.complete"
        };
        let rendered = render_cabpk(
            spec["files"].as_array().unwrap(),
            spec["postKubeadmCommands"].as_array().unwrap(),
            kubeadm,
            &secret,
        );
        // cloud-init itself renders the Jinja with the instance's metadata.
        if !support::require("cloud-init") {
            return;
        }
        let hostname = format!("kaas-{role}-7f2kq");
        let raw = tmp.path().join(format!("{role}.jinja.yaml"));
        std::fs::write(&raw, &rendered).unwrap();
        let instance = tmp.path().join(format!("{role}.instance-data.json"));
        std::fs::write(
            &instance,
            json!({"v1": {"local_hostname": hostname, "instance_id": "i-7f2kq"},
                "ds": {"meta_data": {"local_hostname": hostname}}})
            .to_string(),
        )
        .unwrap();
        let out = succeed(
            Command::new("cloud-init")
                .args(["devel", "render", "-i"])
                .arg(&instance)
                .arg(&raw),
        );
        let user_data = String::from_utf8(out.stdout).unwrap();
        assert!(!user_data.contains("{{"), "{user_data}");
        let file = tmp.path().join(format!("{role}.yaml"));
        std::fs::write(&file, &user_data).unwrap();
        {
            succeed(
                Command::new("cloud-init")
                    .args(["schema", "--config-file"])
                    .arg(&file),
            );
        }
        let cloud: Value = yaml(&user_data);
        let files = cloud["write_files"].as_array().unwrap();
        let by_path = |p: &str| files.iter().find(|f| f["path"] == p).unwrap().clone();
        // The deploy key: byte for byte the Secret's (and the file's), mode 0600.
        let k = by_path("/etc/ginx/deploy_key");
        assert_eq!(k["permissions"], "0600");
        assert_eq!(
            k["content"].as_str().unwrap().as_bytes(),
            &secret("ginx-deploy-key", "deploy_key")[..]
        );
        assert_eq!(
            k["content"].as_str().unwrap().as_bytes(),
            &std::fs::read(&key).unwrap()[..]
        );
        assert_eq!(by_path("/etc/ginx/kubeconfig")["permissions"], "0600");
        let runcmd = cloud["runcmd"].as_array().unwrap();
        assert_eq!(runcmd[0], kubeadm);
        assert_eq!(
            runcmd.last().unwrap(),
            "systemctl --no-block restart ginx.service"
        );
        // The drop-in on the image's configuration: what ginx reads on the VM.
        let dir = tmp.path().join(format!("etc-{role}"));
        std::fs::create_dir_all(dir.join("config.d")).unwrap();
        std::fs::copy(
            repo().join("packaging/cloud-init/image-config.toml"),
            dir.join("config.toml"),
        )
        .unwrap();
        std::fs::write(
            dir.join("config.d/10-node.toml"),
            by_path("/etc/ginx/config.d/10-node.toml")["content"]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        let out = support::check_config(&dir.join("config.toml"));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            stdout.contains(&format!("name = \"{hostname}\"")),
            "{stdout}"
        );
        assert!(stdout.contains(&format!("role = \"{role}\"")), "{stdout}");
        assert!(
            stdout.contains("kubeconfig = \"/etc/ginx/kubeconfig\""),
            "{stdout}"
        );
    }
    let _ = cp.kubectl_output(&["delete", "namespace", SECRETS_NS, "--wait=false"]);
}
