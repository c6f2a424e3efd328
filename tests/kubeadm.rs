//! initKubeadm / joinCPKubeadm: documents checked against golden files and a strict v1beta4
//! schema, the stand-in kubeadm (tests/support/kubeadm-stub), CA hashes against openssl, facts
//! from Argus, re-rendering and drift in the daemon.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

use crate::support::apiserver::ApiServer;
use crate::support::kubeadm_schema::{self as schema, Doc};
use crate::support::{self, Env, GitRepo, wait_for};

/// Not kubeadm's documented example token, which ginx names in a hint: the secrets sweep must
/// tell the two apart.
const TOKEN: &str = "q7x2ka.9v3m1c8z0b6n4p2r";
const KEY: &str = "0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0";
const HASH: &str = "sha256:2b0d9ab0d27c43c9c95b3e7c9a5d8d1c0ac1e2a8e3f4a5b6c7d8e9f0a1b2c3d4";

struct Node {
    env: Env,
    stub_dir: PathBuf,
}

/// A node of the three-node cluster behind the VIP 10.0.0.100:6443, with kubeadm facts in its
/// configuration, the stand-in kubeadm, and every path under the test's directory.
fn node(name: &str, role: &str, ip: &str) -> Node {
    support::sweep::secret("kubeadm bootstrap token", TOKEN);
    support::sweep::secret("kubeadm certificate key", KEY);
    let env = Env::new();
    let root = env.root.clone();
    let stub = root.join("bin/kubeadm");
    std::fs::copy(support::support_dir().join("kubeadm-stub"), &stub).unwrap();
    std::fs::set_permissions(&stub, std::fs::Permissions::from_mode(0o755)).unwrap();
    env.dropin(
        "60-kubeadm.toml",
        &format!(
            r#"[node]
name = "{name}"
role = "{role}"
advertise_address = "{ip}"
node_ip = "{ip}"

[kubeadm]
kubeadm_path = "{stub}"
output_dir = "{root}/kubeadm"
ca_cert = "{root}/pki/ca.crt"
admin_kubeconfig = "{root}/admin.conf"
cluster_name = "kaas"
kubernetes_version = "v1.33.4"
control_plane_endpoint = "10.0.0.100:6443"
pod_subnet = "10.244.0.0/16"
service_subnet = "10.96.0.0/12"
cert_sans = ["k8s.example.com"]
kube_proxy_replacement = true

[kubeadm.kube_vip]
interface = "eno1"
manifest_path = "{root}/manifests/kube-vip.yaml"
"#,
            stub = stub.display(),
            root = root.display()
        ),
    );
    Node {
        stub_dir: root.join("kubeadm-stub"),
        env,
    }
}

impl Node {
    fn ctl(&self, args: &[&str]) -> Output {
        let out = Command::new(support::ginxctl_bin())
            .arg("--config")
            .arg(&self.env.config)
            .arg("--socket")
            .arg(&self.env.socket)
            .args(args)
            .env("STUB_KUBEADM_DIR", &self.stub_dir)
            .env(
                "STUB_KUBEADM_MANIFEST",
                self.env.root.join("manifests/kube-vip.yaml"),
            )
            .output()
            .unwrap();
        support::sweep::collect_ctl(args, &out);
        out
    }

    fn ctl_ok(&self, args: &[&str]) -> String {
        let out = self.ctl(args);
        assert!(
            out.status.success(),
            "ginxctl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    fn call(&self, n: usize) -> PathBuf {
        self.stub_dir.join("calls").join(n.to_string())
    }
}

fn secrets() -> Vec<&'static str> {
    vec![
        "--show-secrets",
        "--token",
        TOKEN,
        "--certificate-key",
        KEY,
        "--ca-cert-hash",
        HASH,
    ]
}

/// Compares with tests/golden/kubeadm/<name>; `GINX_UPDATE_GOLDEN=1` rewrites the file.
fn golden(name: &str, text: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/golden/kubeadm")
        .join(name);
    if std::env::var("GINX_UPDATE_GOLDEN").is_ok_and(|v| v == "1") {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, text).unwrap();
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (GINX_UPDATE_GOLDEN=1 to create it)",
            path.display()
        )
    });
    assert_eq!(text, want, "{name} differs from the golden file");
}

fn env_of(pod: &schema::Pod) -> Vec<(String, String)> {
    pod.spec.containers[0]
        .env
        .iter()
        .map(|e| {
            (
                e.name.clone(),
                e.value.clone().unwrap_or_else(|| "<from field>".into()),
            )
        })
        .collect()
}

#[test]
fn golden_documents_for_a_three_node_cluster() {
    let lucy = node("lucy", "control-plane", "10.0.0.11");
    let init = lucy.ctl_ok(&[&["kubeadm", "render", "--init"][..], &secrets()].concat());
    golden("init.yaml", &init);
    let docs = schema::parse(&init);
    let [Doc::Init(i), Doc::Cluster(c)] = &docs[..] else {
        panic!("{docs:?}")
    };
    assert_eq!(
        i.skip_phases.as_deref(),
        Some(&["addon/kube-proxy".to_owned()][..])
    );
    assert_eq!(i.certificate_key.as_deref(), Some(KEY));
    assert_eq!(i.bootstrap_tokens.as_ref().unwrap()[0].token, TOKEN);
    let nr = i.node_registration.as_ref().unwrap();
    let arg = &nr.kubelet_extra_args.as_ref().unwrap()[0];
    assert_eq!(
        (arg.name.as_str(), arg.value.as_str()),
        ("node-ip", "10.0.0.11")
    );
    assert_eq!(
        i.local_api_endpoint
            .as_ref()
            .unwrap()
            .advertise_address
            .as_deref(),
        Some("10.0.0.11")
    );
    assert_eq!(c.proxy.as_ref().unwrap().disabled, Some(true));
    assert_eq!(c.control_plane_endpoint.as_deref(), Some("10.0.0.100:6443"));
    assert_eq!(
        c.api_server.as_ref().unwrap().cert_sans.as_deref(),
        Some(&["10.0.0.100".to_owned(), "k8s.example.com".to_owned()][..])
    );

    let makise = node("makise", "control-plane", "10.0.0.12");
    let join_cp = makise.ctl_ok(
        &[
            &["kubeadm", "render", "--join-control-plane"][..],
            &secrets(),
        ]
        .concat(),
    );
    golden("join-control-plane.yaml", &join_cp);
    let [Doc::Join(j)] = &schema::parse(&join_cp)[..] else {
        panic!()
    };
    let cp = j
        .control_plane
        .as_ref()
        .expect("controlPlane in the document, not a flag");
    assert_eq!(cp.certificate_key.as_deref(), Some(KEY));
    let bt = j.discovery.bootstrap_token.as_ref().unwrap();
    assert_eq!(bt.ca_cert_hashes.as_deref(), Some(&[HASH.to_owned()][..]));
    assert_eq!(bt.api_server_endpoint.as_deref(), Some("10.0.0.100:6443"));

    let quinn = node("quinn", "worker", "10.0.0.13");
    let join_w = quinn.ctl_ok(&[&["kubeadm", "render", "--join-worker"][..], &secrets()].concat());
    golden("join-worker.yaml", &join_w);
    let [Doc::Join(w)] = &schema::parse(&join_w)[..] else {
        panic!()
    };
    assert!(w.control_plane.is_none());

    let before = lucy.ctl_ok(&["kubeadm", "render", "--kube-vip", "--super-admin"]);
    golden("kube-vip-init-node.yaml", &before);
    let after = lucy.ctl_ok(&["kubeadm", "render", "--kube-vip"]);
    golden("kube-vip.yaml", &after);
    for (text, host) in [
        (&before, "/etc/kubernetes/super-admin.conf"),
        (&after, "/etc/kubernetes/admin.conf"),
    ] {
        let [Doc::Pod(p)] = &schema::parse(text)[..] else {
            panic!()
        };
        assert_eq!(p.spec.volumes[0].host_path.path, host);
        assert_eq!(
            p.spec.containers[0].volume_mounts[0].mount_path,
            "/etc/kubernetes/admin.conf"
        );
        assert!(p.spec.host_network);
        assert_eq!(p.spec.host_aliases[0].ip, "127.0.0.1");
        assert_eq!(p.spec.host_aliases[0].hostnames, ["kubernetes"]);
        assert_eq!(
            p.spec.containers[0].security_context.capabilities.add,
            ["NET_ADMIN", "NET_RAW"]
        );
        let env = env_of(p);
        for name in [
            "vip_arp",
            "port",
            "vip_interface",
            "vip_subnet",
            "cp_enable",
            "cp_namespace",
            "vip_leaderelection",
            "vip_leasename",
            "vip_leaseduration",
            "vip_renewdeadline",
            "vip_retryperiod",
            "address",
            "svc_enable",
            "prometheus_server",
        ] {
            assert!(env.iter().any(|(n, _)| n == name), "{name} missing");
        }
        let get = |n: &str| env.iter().find(|(k, _)| k == n).unwrap().1.clone();
        assert_eq!(get("address"), "10.0.0.100");
        assert_eq!(get("port"), "6443");
        assert_eq!(get("vip_interface"), "eno1");
        assert_eq!(get("vip_leasename"), "plndr-cp-lock");
        assert_eq!(get("vip_leaseduration"), "15");
    }
}

#[test]
fn rendering_is_deterministic_and_masks_secrets() {
    let lucy = node("lucy", "control-plane", "10.0.0.11");
    let args = [&["kubeadm", "render", "--init"][..], &secrets()].concat();
    assert_eq!(lucy.ctl_ok(&args), lucy.ctl_ok(&args), "byte-identical");
    let masked = lucy.ctl_ok(&[
        "kubeadm",
        "render",
        "--init",
        "--token",
        TOKEN,
        "--certificate-key",
        KEY,
    ]);
    assert!(!masked.contains(TOKEN) && !masked.contains(KEY), "{masked}");
    assert!(masked.contains("<hidden: use --show-secrets>"));
    schema::parse(&masked);
}

#[test]
fn bad_facts_are_refused_with_what_is_wrong() {
    let lucy = node("lucy", "control-plane", "10.0.0.11");
    lucy.env
        .dropin("61-bad.toml", "[kubeadm]\npod_subnet = \"10.96.0.0/16\"\n");
    let out = lucy.ctl(&["kubeadm", "render", "--init"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("pod_subnet 10.96.0.0/16 and service_subnet 10.96.0.0/12 overlap"),
        "{err}"
    );

    lucy.env.dropin(
        "61-bad.toml",
        "[kubeadm]\ncontrol_plane_endpoint = \"10.244.3.3:6443\"\n",
    );
    let err =
        String::from_utf8_lossy(&lucy.ctl(&["kubeadm", "render", "--init"]).stderr).into_owned();
    assert!(
        err.contains("10.244.3.3 lies inside 10.244.0.0/16"),
        "{err}"
    );

    lucy.env.dropin(
        "61-bad.toml",
        "[node]\nadvertise_address = \"10.0.0.100\"\n",
    );
    let err =
        String::from_utf8_lossy(&lucy.ctl(&["kubeadm", "render", "--init"]).stderr).into_owned();
    assert!(
        err.contains("node.advertise_address is 10.0.0.100, the control-plane VIP"),
        "{err}"
    );

    lucy.env
        .dropin("61-bad.toml", "[kubeadm]\nkubernetes_version = \"1.33\"\n");
    let out = support::check_config(&lucy.env.config);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "61-bad.toml:2:22: kubeadm.kubernetes_version: \"1.33\" is not a version like"
        ),
        "{err}"
    );

    lucy.env.dropin(
        "61-bad.toml",
        "[kubeadm]\ncontrol_plane_endpoint = \"10.0.0.100:99999\"\n",
    );
    let out = support::check_config(&lucy.env.config);
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a valid port"));
}

/// The hash openssl gives for `cert`, the way the kubeadm documentation computes it.
fn openssl_hash(cert: &Path) -> String {
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "openssl x509 -pubkey -noout -in {} | openssl pkey -pubin -outform der | sha256sum",
            cert.display()
        ))
        .output()
        .unwrap();
    assert!(out.status.success());
    format!(
        "sha256:{}",
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .next()
            .unwrap()
    )
}

#[test]
fn ca_cert_hashes_match_openssl() {
    if !support::require("openssl") {
        return;
    }
    let quinn = node("quinn", "worker", "10.0.0.13");
    let pki = quinn.env.root.join("pki");
    std::fs::create_dir_all(&pki).unwrap();
    for key in [
        &["-newkey", "rsa:2048"][..],
        &["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"],
    ] {
        support::succeed(
            Command::new("openssl")
                .args([
                    "req",
                    "-x509",
                    "-nodes",
                    "-days",
                    "1",
                    "-subj",
                    "/CN=kubernetes",
                ])
                .args(key)
                .arg("-keyout")
                .arg(pki.join("ca.key"))
                .arg("-out")
                .arg(pki.join("ca.crt")),
        );
        let want = openssl_hash(&pki.join("ca.crt"));
        let out = quinn.ctl_ok(&[
            "kubeadm",
            "render",
            "--join-worker",
            "--token",
            TOKEN,
            "--show-secrets",
        ]);
        let [Doc::Join(j)] = &schema::parse(&out)[..] else {
            panic!()
        };
        let got = j
            .discovery
            .bootstrap_token
            .as_ref()
            .unwrap()
            .ca_cert_hashes
            .clone()
            .unwrap();
        assert_eq!(got, [want]);
    }
}

#[test]
fn init_writes_the_files_runs_kubeadm_and_moves_kube_vip_to_admin_conf() {
    if !support::require("openssl") {
        return;
    }
    let lucy = node("lucy", "control-plane", "10.0.0.11");
    let root = lucy.env.root.clone();
    // kubeadm's admin.conf, for the stand-in API server, where the binding exists.
    let api = ApiServer::start(&root);
    api.kubeconfig_token(&root.join("admin.conf"));
    api.put_object(
        "clusterrolebindings/kubeadm:cluster-admins",
        serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "kubeadm:cluster-admins"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "kubeadm:cluster-admins"}]}),
    );
    std::fs::create_dir_all(root.join("pki")).unwrap();
    std::fs::write(root.join("pki/ca.crt"), api.ca.pem()).unwrap();

    let out = lucy.ctl(&["kubeadm", "init"]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    let argv = std::fs::read_to_string(lucy.call(0).join("argv")).unwrap();
    let file = root.join("kubeadm/init.yaml");
    assert_eq!(
        argv,
        format!("init\n--config\n{}\n--upload-certs\n", file.display())
    );
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o600
    );
    // kubeadm got exactly the file ginx wrote.
    let config = std::fs::read_to_string(lucy.call(0).join("config")).unwrap();
    assert_eq!(config, std::fs::read_to_string(&file).unwrap());
    let [Doc::Init(i), Doc::Cluster(_)] = &schema::parse(&config)[..] else {
        panic!()
    };
    let token = i.bootstrap_tokens.as_ref().unwrap()[0].token.clone();
    let key = i.certificate_key.clone().unwrap();
    // The exact command for the other control-plane nodes.
    let hash = openssl_hash(&root.join("pki/ca.crt"));
    assert!(
        stdout.contains(&format!(
            "joinCPKubeadm {token} {key} --ca-cert-hash {hash}"
        )),
        "{stdout}"
    );
    // While kubeadm ran, kube-vip used super-admin.conf; now admin.conf.
    let during = std::fs::read_to_string(lucy.call(0).join("kube-vip.yaml")).unwrap();
    assert!(during.contains("/etc/kubernetes/super-admin.conf"));
    let manifest = root.join("manifests/kube-vip.yaml");
    let now = std::fs::read_to_string(&manifest).unwrap();
    assert!(
        !now.contains("super-admin.conf") && now.contains("path: /etc/kubernetes/admin.conf"),
        "{now}"
    );
    assert!(stderr.contains("kube-vip now uses admin.conf"), "{stderr}");
    assert!(api.log().iter().any(|r| {
        r.path
            .ends_with("/clusterrolebindings/kubeadm:cluster-admins")
    }));
}

#[test]
fn dry_run_is_passed_through_and_touches_no_manifest() {
    let lucy = node("lucy", "control-plane", "10.0.0.11");
    let out = lucy.ctl_ok(&["kubeadm", "init", "--dry-run"]);
    assert!(out.contains("dry run: nothing was initialised"), "{out}");
    assert!(
        !out.contains("joinCPKubeadm"),
        "no join command for a token that does not exist: {out}"
    );
    let argv = std::fs::read_to_string(lucy.call(0).join("argv")).unwrap();
    assert!(argv.ends_with("--upload-certs\n--dry-run\n"), "{argv}");
    assert!(!lucy.env.root.join("manifests/kube-vip.yaml").exists());
}

#[test]
fn join_as_control_plane_then_kube_vip_and_as_worker() {
    let makise = node("makise", "control-plane", "10.0.0.12");
    makise.ctl_ok(&["kubeadm", "join", TOKEN, KEY, "--ca-cert-hash", HASH]);
    let file = makise.env.root.join("kubeadm/join.yaml");
    let argv = std::fs::read_to_string(makise.call(0).join("argv")).unwrap();
    assert_eq!(argv, format!("join\n--config\n{}\n", file.display()));
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let [Doc::Join(j)] =
        &schema::parse(&std::fs::read_to_string(makise.call(0).join("config")).unwrap())[..]
    else {
        panic!()
    };
    assert_eq!(
        j.control_plane.as_ref().unwrap().certificate_key.as_deref(),
        Some(KEY)
    );
    // kubeadm join wants an empty manifests directory: kube-vip comes after it.
    assert!(!makise.call(0).join("kube-vip.yaml").exists());
    let manifest =
        std::fs::read_to_string(makise.env.root.join("manifests/kube-vip.yaml")).unwrap();
    assert!(manifest.contains("path: /etc/kubernetes/admin.conf"));

    let quinn = node("quinn", "worker", "10.0.0.13");
    quinn.ctl_ok(&[
        "kubeadm",
        "join",
        TOKEN,
        "--worker",
        "--ca-cert-hash",
        HASH,
        "--dry-run",
    ]);
    let argv = std::fs::read_to_string(quinn.call(0).join("argv")).unwrap();
    assert!(argv.ends_with("--dry-run\n"));
    let [Doc::Join(w)] =
        &schema::parse(&std::fs::read_to_string(quinn.call(0).join("config")).unwrap())[..]
    else {
        panic!()
    };
    assert!(w.control_plane.is_none());
    assert!(!quinn.env.root.join("manifests/kube-vip.yaml").exists());
}

#[test]
fn a_kubeadm_failure_returns_its_exit_code_and_bad_input_is_refused() {
    let makise = node("makise", "control-plane", "10.0.0.12");
    std::fs::create_dir_all(&makise.stub_dir).unwrap();
    std::fs::write(makise.stub_dir.join("exit_code"), "3").unwrap();
    let out = makise.ctl(&["kubeadm", "join", TOKEN, KEY, "--ca-cert-hash", HASH]);
    assert_eq!(out.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&out.stderr).contains("kubeadm failed"));
    assert!(!makise.env.root.join("manifests/kube-vip.yaml").exists());

    let out = makise.ctl(&[
        "kubeadm",
        "join",
        "NOT-A-TOKEN",
        KEY,
        "--ca-cert-hash",
        HASH,
    ]);
    assert_eq!(out.status.code(), Some(2));
    let out = makise.ctl(&["kubeadm", "join", TOKEN]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("certificate key"));
    // No CA to pin to: refused rather than unsafe discovery.
    let out = makise.ctl(&["kubeadm", "join", TOKEN, KEY]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--ca-cert-hash"));
}

#[test]
fn facts_come_from_argus_with_the_local_config_winning() {
    let lucy = node("lucy", "control-plane", "10.0.0.11");
    let argus = GitRepo::init(&lucy.env.root.join("argus"));
    argus.commit(
        "clusters/openstack/kubeadm.toml",
        "cluster_name = \"openstack\"\nkubernetes_version = \"v1.34.1\"\ncontrol_plane_endpoint = \"10.1.0.100:6443\"\npod_subnet = \"10.50.0.0/16\"\n[kube_vip]\nlease_duration = 20\n",
        "cluster facts",
    );
    // Locally: only the pod subnet (and the tool paths); everything else from Argus.
    let root = lucy.env.root.display().to_string();
    lucy.env.dropin(
        "60-kubeadm.toml",
        &format!(
            "[kubeadm]\nsource = \"argus\"\ncluster_file = \"clusters/openstack/kubeadm.toml\"\npod_subnet = \"10.60.0.0/16\"\noutput_dir = \"{root}/kubeadm\"\n[sources.argus]\nurl = \"{}\"\n",
            argus.path.display()
        ),
    );
    let d = lucy.env.start();
    d.wait_status("argus fetched", |s| {
        s["sources"]["argus"]["revision"].is_string()
    });
    let out = lucy.ctl_ok(&["kubeadm", "render", "--init"]);
    let [_, Doc::Cluster(c)] = &schema::parse(&out)[..] else {
        panic!()
    };
    assert_eq!(c.cluster_name.as_deref(), Some("openstack"));
    assert_eq!(c.kubernetes_version.as_deref(), Some("v1.34.1"));
    assert_eq!(c.control_plane_endpoint.as_deref(), Some("10.1.0.100:6443"));
    assert_eq!(
        c.networking.as_ref().unwrap().pod_subnet.as_deref(),
        Some("10.60.0.0/16"),
        "local wins"
    );
    let vip = lucy.ctl_ok(&["kubeadm", "render", "--kube-vip"]);
    assert!(
        vip.contains("vip_leaseduration") && vip.contains("'20'") || vip.contains("\"20\""),
        "{vip}"
    );

    // A bad cluster file is named with its place.
    argus.commit(
        "clusters/openstack/kubeadm.toml",
        "pod_subnet = \"x\"\nbogus = 1\n",
        "broken",
    );
    d.ctl_ok(&["sync", "argus"]);
    let out = lucy.ctl(&["kubeadm", "render", "--init"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("argus:clusters/openstack/kubeadm.toml@")
            && err.contains(":2:1: unknown field `bogus`"),
        "{err}"
    );
}

#[test]
fn the_daemon_rerenders_and_reports_drift_from_the_clusters_kubeadm_config() {
    // The real control plane: kubeadm's ConfigMap read with ginx's own identity and rbac.yaml.
    let Some(cp) = support::control_plane::shared() else {
        return;
    };
    let mut rbac = support::control_plane::RbacGuard::new(cp);
    rbac.watch("lucy");
    let lucy = node("lucy", "control-plane", "10.0.0.11");
    let kc = lucy.env.root.join("kubeconfig");
    cp.ginx_kubeconfig(&kc, "lucy");
    let cluster_configuration = "apiServer:\n  certSANs:\n  - k8s.example.com\n  - 10.0.0.100\napiVersion: kubeadm.k8s.io/v1beta4\nclusterName: kaas\ncontrolPlaneEndpoint: 10.0.0.100:6443\ndns: {}\netcd:\n  local:\n    dataDir: /var/lib/etcd\nkind: ClusterConfiguration\nkubernetesVersion: v1.33.4\nnetworking:\n  dnsDomain: cluster.local\n  podSubnet: 10.245.0.0/16\n  serviceSubnet: 10.96.0.0/12\nproxy:\n  disabled: true\n";
    cp.apply(
        &serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "kubeadm-config", "namespace": "kube-system"},
            "data": {"ClusterConfiguration": cluster_configuration}})
        .to_string(),
    );
    lucy.env.dropin(
        "70-kube.toml",
        &format!(
            "[kubernetes]\nkubeconfig = \"{}\"\nrenew_interval = \"200ms\"\n[health.kubelet]\nenabled = false\n[health.apiserver]\nenabled = false\n[health.cilium]\nenabled = false\n[health.systemd]\nenabled = false\n[health.node_ready]\nenabled = false\n",
            kc.display()
        ),
    );
    let d = lucy.env.start();
    let s = d.wait_status("the drift", |s| {
        s["kubeadm"]["drift"]
            .as_array()
            .is_some_and(|d| !d.is_empty())
    });
    let k = &s["kubeadm"];
    assert_eq!(
        k["drift"],
        serde_json::json!([
            "networking.podSubnet: rendered 10.244.0.0/16, cluster has 10.245.0.0/16"
        ])
    );
    let cluster_yaml = lucy.env.root.join("kubeadm/cluster.yaml");
    assert!(
        k["rendered"]
            .as_array()
            .unwrap()
            .contains(&Value::from(cluster_yaml.display().to_string()))
    );
    assert_eq!(
        std::fs::metadata(&cluster_yaml)
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o644,
        "no secrets, no 0600"
    );
    schema::parse(&std::fs::read_to_string(&cluster_yaml).unwrap());
    // Only ginx's files: the static Pod manifest is left alone.
    let manifest = lucy.env.root.join("manifests/kube-vip.yaml");
    assert!(!manifest.exists());
    // 10.0.0.11 is not an address of this machine: said so, once.
    assert_eq!(
        k["warnings"],
        serde_json::json!([
            "node.advertise_address 10.0.0.11 is not on any interface of this host; the API server will not be reachable there"
        ])
    );

    // The facts change; the files follow, and the drift is gone.
    lucy.env.dropin(
        "62-pods.toml",
        "[kubeadm]\npod_subnet = \"10.245.0.0/16\"\n",
    );
    d.signal(nix::sys::signal::Signal::SIGHUP);
    wait_for("the re-render", || {
        std::fs::read_to_string(&cluster_yaml)
            .ok()
            .filter(|t| t.contains("10.245.0.0/16"))
    });
    d.wait_status("no drift", |s| {
        s["kubeadm"]["drift"] == serde_json::json!([])
    });

    // An init that stopped before the switch to admin.conf is pointed out, not left silent.
    std::fs::create_dir_all(manifest.parent().unwrap()).unwrap();
    std::fs::write(
        &manifest,
        "volumes:\n- hostPath:\n    path: /etc/kubernetes/super-admin.conf\n",
    )
    .unwrap();
    // Seen at the next re-render (any change of the facts, or the periodic one).
    lucy.env
        .dropin("63-vip.toml", "[kubeadm.kube_vip]\nlease_duration = 20\n");
    d.wait_status("the super-admin warning", |s| {
        s["kubeadm"]["warnings"].as_array().is_some_and(|w| {
            w.iter()
                .any(|w| w.as_str().unwrap_or("").contains("switch-kube-vip"))
        })
    });
    assert!(
        std::fs::read_to_string(&manifest)
            .unwrap()
            .contains("super-admin.conf"),
        "left alone"
    );
}

#[test]
fn the_schema_refuses_what_kubeadm_v1beta4_would_drop() {
    // The checks above mean something only if the schema is strict: v1beta3 habits fail it.
    let base = "apiVersion: kubeadm.k8s.io/v1beta4\nkind: ClusterConfiguration\n";
    schema::parse(&format!(
        "{base}apiServer:\n  extraArgs:\n  - name: audit-log-maxage\n    value: \"30\"\n"
    ));
    for bad in [
        "apiServer:\n  timeoutForControlPlane: 4m0s\n",
        "apiServer:\n  extraArgs:\n    audit-log-maxage: \"30\"\n",
        "networking:\n  podSubnets: 10.244.0.0/16\n",
    ] {
        let doc = format!("{base}{bad}");
        let refused = std::panic::catch_unwind(|| schema::parse(&doc)).is_err();
        assert!(refused, "the schema accepted:\n{doc}");
    }
    let v1beta3 = "apiVersion: kubeadm.k8s.io/v1beta3\nkind: ClusterConfiguration\n";
    assert!(std::panic::catch_unwind(|| schema::parse(v1beta3)).is_err());
}

#[test]
fn the_vip_interface_comes_from_the_config_the_advertise_address_or_kube_vip() {
    let makise = node("makise", "control-plane", "10.0.0.12");
    let dropin = makise
        .env
        .config
        .parent()
        .unwrap()
        .join("config.d/60-kubeadm.toml");
    let text = std::fs::read_to_string(&dropin)
        .unwrap()
        .replace("interface = \"eno1\"\n", "");
    std::fs::write(&dropin, text).unwrap();
    // 10.0.0.12 is on no interface here: kube-vip is left to pick the default route's, and
    // the operator is told.
    let out = makise.ctl(&["kubeadm", "join", TOKEN, KEY, "--ca-cert-hash", HASH]);
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("kube-vip will put the VIP on the interface of the default route"),
        "{err}"
    );
    let manifest =
        std::fs::read_to_string(makise.env.root.join("manifests/kube-vip.yaml")).unwrap();
    let [Doc::Pod(p)] = &schema::parse(&manifest)[..] else {
        panic!()
    };
    assert!(
        !env_of(p).iter().any(|(n, _)| n == "vip_interface"),
        "{manifest}"
    );
    // Only the manifest in the static Pod directory: no temporary file the kubelet could run.
    let names: Vec<_> = std::fs::read_dir(makise.env.root.join("manifests"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["kube-vip.yaml"]);

    // With the advertise address on an interface here (lo), that interface is used.
    let text = std::fs::read_to_string(&dropin)
        .unwrap()
        .replace("10.0.0.12", "127.0.0.1");
    std::fs::write(&dropin, text).unwrap();
    let vip = makise.ctl_ok(&["kubeadm", "render", "--kube-vip"]);
    let [Doc::Pod(p)] = &schema::parse(&vip)[..] else {
        panic!()
    };
    assert!(
        env_of(p).contains(&("vip_interface".to_owned(), "lo".to_owned())),
        "{vip}"
    );
}
