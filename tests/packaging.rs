//! The packaging, checked with the tools a Debian machine has: every .nix file parses (and has
//! no undefined variable) with `nix-instantiate --parse`; the cloud-init user-data passes
//! `cloud-init schema`, and its drop-in merged with an image's base configuration passes
//! `ginx check-config`; the systemd unit passes `systemd-analyze verify` and carries the
//! module's directives; tmpfiles creates what it says; completions and man pages are generated.
//! The VM tests themselves (vm-tests/) need Nix with KVM: `nix flake check`.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::support::{self, succeed};

pub(crate) fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .unwrap()
}

pub(crate) fn read(rel: &str) -> String {
    std::fs::read_to_string(repo().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// Every .nix file of the repository, outside target/ and dot directories.
fn nix_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with('.') || name == "target" {
            continue;
        }
        if path.is_dir() {
            nix_files(&path, out);
        } else if name.ends_with(".nix") {
            out.push(path);
        }
    }
}

#[test]
fn every_nix_file_parses_without_undefined_variables() {
    if !support::require("nix-instantiate") {
        return;
    }
    let mut files = Vec::new();
    nix_files(&repo(), &mut files);
    let names: Vec<String> = files
        .iter()
        .map(|f| f.strip_prefix(repo()).unwrap().display().to_string())
        .collect();
    for want in [
        "flake.nix",
        "nixos-module/default.nix",
        "nixos-module/bootstrap.nix",
        "packaging/nix/package.nix",
        "vm-tests/single-node.nix",
        "vm-tests/self-update.nix",
        "vm-tests/cluster.nix",
        "vm-tests/reboot.nix",
    ] {
        assert!(names.iter().any(|n| n == want), "{want} missing: {names:?}");
    }
    for f in &files {
        succeed(Command::new("nix-instantiate").arg("--parse").arg(f));
    }
    // The check is worth something: an undefined variable fails to parse (no `with` hides it).
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.nix");
    std::fs::write(&bad, "{ lib, ... }: { x = lib.mkIf true colmena; }\n").unwrap();
    let out = Command::new("nix-instantiate")
        .arg("--parse")
        .arg(&bad)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("undefined variable 'colmena'"));
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        assert!(
            !has_with_scope(&text),
            "{}: `with` would hide undefined variables from the parse check",
            f.display()
        );
    }
}

/// Whether `text` opens a Nix `with NAME;` scope (Python's `with subtest(...):` in a test
/// script is not one).
fn has_with_scope(text: &str) -> bool {
    text.match_indices("with ").any(|(i, _)| {
        let rest = &text[i + 5..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '.' || *c == '_')
            .collect();
        !name.is_empty() && rest[name.len()..].trim_start().starts_with(';')
    })
}

/// The cloud-config keys the user-data may use; `cloud-init schema` accepts unknown top-level
/// keys silently, so a misspelt one (`write_file`) would be ignored at boot.
const CLOUD_CONFIG_KEYS: &[&str] = &["write_files", "runcmd"];

fn user_data() -> Value {
    parse_user_data(&read("packaging/cloud-init/user-data.yaml"))
}

fn parse_user_data(text: &str) -> Value {
    assert!(
        text.starts_with("#cloud-config\n"),
        "cloud-init needs the #cloud-config header"
    );
    serde_saphyr::from_str(text).unwrap()
}

#[test]
fn cloud_init_user_data_passes_the_schema() {
    let doc = user_data();
    for key in doc.as_object().unwrap().keys() {
        assert!(
            CLOUD_CONFIG_KEYS.contains(&key.as_str()),
            "unexpected top-level key {key}"
        );
    }
    let files = doc["write_files"].as_array().unwrap();
    let file = |path: &str| {
        files
            .iter()
            .find(|f| f["path"] == path)
            .unwrap_or_else(|| panic!("{path}"))
    };
    assert_eq!(
        file("/etc/ginx/deploy_key")["permissions"],
        "0600",
        "ginx refuses a readable key"
    );
    assert_eq!(
        file("/etc/ginx/config.d/10-node.toml")["owner"],
        "root:root"
    );
    let restart = &doc["runcmd"][0];
    assert_eq!(
        *restart,
        serde_json::json!(["systemctl", "--no-block", "restart", "ginx.service"])
    );

    if !support::require("cloud-init") {
        return;
    }
    succeed(
        Command::new("cloud-init")
            .args(["schema", "--config-file"])
            .arg(repo().join("packaging/cloud-init/user-data.yaml")),
    );
    // And the schema check can fail.
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "#cloud-config\nwrite_files:\n  - content: x\nruncmd: 3\n",
    )
    .unwrap();
    let out = Command::new("cloud-init")
        .args(["schema", "--config-file"])
        .arg(&bad)
        .output()
        .unwrap();
    assert!(!out.status.success());
}

/// `ginx check-config` on the image's base configuration with the user-data's drop-ins
/// beside it (as on the VM); the effective configuration.
fn merged_check_config(doc: &Value, dir: &Path) -> std::process::Output {
    let config = dir.join("config.toml");
    std::fs::copy(
        repo().join("packaging/cloud-init/image-config.toml"),
        &config,
    )
    .unwrap();
    std::fs::create_dir(dir.join("config.d")).unwrap();
    let mut dropins = 0;
    for f in doc["write_files"].as_array().unwrap() {
        let path = f["path"].as_str().unwrap();
        if let Some(name) = path.strip_prefix("/etc/ginx/config.d/") {
            std::fs::write(
                dir.join("config.d").join(name),
                f["content"].as_str().unwrap(),
            )
            .unwrap();
            dropins += 1;
        }
    }
    assert_eq!(dropins, 1);
    support::check_config(&config)
}

#[test]
fn the_user_data_drop_in_with_the_image_config_passes_check_config() {
    let dir = tempfile::tempdir().unwrap();
    let out = merged_check_config(&user_data(), dir.path());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The drop-in's node and sources over the image's apply command.
    assert!(stdout.contains("name = \"kaas-worker-1\""), "{stdout}");
    assert!(stdout.contains("role = \"worker\""));
    assert!(stdout.contains("[sources.hephaestus]") && stdout.contains("[sources.argus]"));
    assert!(stdout.contains("colmena/bin/colmena"));
    assert!(stdout.contains("known_hosts_file = \"/etc/ginx/known_hosts\""));

    // The image alone has no source: ginx says what is missing.
    std::fs::remove_dir_all(dir.path().join("config.d")).unwrap();
    let out = support::check_config(&dir.path().join("config.toml"));
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no sources configured"));
}

#[test]
fn fill_user_data_makes_a_valid_user_data_for_one_vm() {
    if !support::require("ssh-keygen") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("deploy_key");
    let ok = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", "deploy", "-f"])
        .arg(&key)
        .status()
        .unwrap();
    assert!(ok.success());
    let host_key = "git.internal ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIClHfPWnfr/kZl++Ug0KJw1ocehMM+xklULDR8/FCDmV";
    let fill = repo().join("packaging/cloud-init/fill-user-data.sh");
    let out = succeed(
        Command::new(&fill)
            .args(["kaas-cp-2", "control-plane"])
            .arg(&key)
            .arg(host_key),
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let doc = parse_user_data(&text);
    let files = doc["write_files"].as_array().unwrap();
    let content = |path: &str| {
        files.iter().find(|f| f["path"] == path).unwrap()["content"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    assert_eq!(
        content("/etc/ginx/deploy_key"),
        std::fs::read_to_string(&key).unwrap(),
        "the key, byte for byte"
    );
    assert_eq!(content("/etc/ginx/known_hosts"), format!("{host_key}\n"));
    let merged = tempfile::tempdir().unwrap();
    let out = merged_check_config(&doc, merged.path());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("name = \"kaas-cp-2\"") && stdout.contains("role = \"control-plane\""),
        "{stdout}"
    );
    if support::require("cloud-init") {
        let path = dir.path().join("user-data.yaml");
        std::fs::write(&path, &text).unwrap();
        succeed(
            Command::new("cloud-init")
                .args(["schema", "--config-file"])
                .arg(&path),
        );
    }
    // Bad arguments: refused with what is wrong, exit 2.
    for (args, why) in [
        (vec!["kaas 1", "worker"], "NAME must be a host name"),
        (
            vec!["kaas-1", "master"],
            "ROLE must be worker or control-plane",
        ),
    ] {
        let out = Command::new(&fill)
            .args(&args)
            .arg(&key)
            .arg(host_key)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2));
        assert!(String::from_utf8_lossy(&out.stderr).contains(why));
    }
    let out = Command::new(&fill)
        .args(["kaas-1", "worker"])
        .arg(format!("{}.pub", key.display()))
        .arg(host_key)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not an OpenSSH private key"));
}

/// `Key=Value` lines of the [Service] section.
fn service_directives(unit: &str) -> Vec<(String, String)> {
    let mut in_service = false;
    let mut out = Vec::new();
    for line in unit.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_service = line == "[Service]";
        } else if in_service
            && !line.starts_with('#')
            && let Some((k, v)) = line.split_once('=')
        {
            out.push((k.to_owned(), v.to_owned()));
        }
    }
    out
}

#[test]
fn the_systemd_unit_verifies_and_matches_the_module() {
    let unit = read("packaging/systemd/ginx.service");
    let module = read("nixos-module/default.nix");
    let directives = service_directives(&unit);
    // Everything but the commands (store paths in the module) is the same, value for value.
    for (key, value) in &directives {
        if key.starts_with("Exec") || key == "TimeoutStopSec" {
            continue;
        }
        assert!(
            module.contains(&format!("{key} = \"{value}\";")),
            "nixos-module/default.nix lacks {key} = \"{value}\" (packaging/systemd/ginx.service has it)"
        );
    }
    for key in [
        "Type",
        "WatchdogSec",
        "Restart",
        "StateDirectory",
        "RuntimeDirectory",
        "RuntimeDirectoryPreserve",
        "KillMode",
    ] {
        assert!(
            directives.iter().any(|(k, _)| k == key),
            "{key} missing from the unit"
        );
    }
    assert!(unit.contains("ExecStart=/usr/local/bin/ginx --config /etc/ginx/config.toml run"));
    assert!(module.contains("--config /etc/ginx/config.toml run"));
    assert!(module.contains("restartIfChanged = false;"));

    if !support::require("systemd-analyze") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let verify = |text: &str| {
        // verify wants the executable to exist: point ExecStart at the one built here.
        let path = dir.path().join("ginx.service");
        std::fs::write(
            &path,
            text.replace(
                "/usr/local/bin/ginx",
                &support::ginx_bin().display().to_string(),
            ),
        )
        .unwrap();
        Command::new("systemd-analyze")
            .args(["verify", "--man=no"])
            .arg(&path)
            .output()
            .unwrap()
    };
    let out = verify(&unit);
    let stderr = String::from_utf8_lossy(&out.stderr);
    // systemd-analyze exits 0 on a directive it ignores; any complaint fails this test.
    assert!(out.status.success() && stderr.trim().is_empty(), "{stderr}");
    let out = verify(&unit.replace("Type=notify", "Type=notfiy"));
    assert!(String::from_utf8_lossy(&out.stderr).contains("Failed to parse service type"));
}

#[test]
fn tmpfiles_creates_the_configuration_directories() {
    if !support::require("systemd-tmpfiles") {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    succeed(
        Command::new("systemd-tmpfiles")
            .arg("--create")
            .arg(format!("--root={}", root.path().display()))
            .arg(repo().join("packaging/systemd/ginx.tmpfiles.conf")),
    );
    for (dir, mode) in [
        ("etc/ginx", 0o755),
        ("etc/ginx/config.d", 0o755),
        ("etc/ginx/kubeadm", 0o700),
    ] {
        let m = std::fs::metadata(root.path().join(dir))
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(m, mode, "{dir}");
    }
    // The module creates the same two.
    let module = read("nixos-module/default.nix");
    assert!(module.contains("\"d /etc/ginx/config.d 0755 root root -\""));
    assert!(module.contains("\"d /etc/ginx/kubeadm 0700 root root -\""));
}

#[test]
fn completions_and_man_pages_are_generated() {
    let dir = tempfile::tempdir().unwrap();
    succeed(
        Command::new(support::ginx_bin())
            .args(["generate-assets", "--out"])
            .arg(dir.path()),
    );
    let c = dir.path().join("completions");
    for f in [
        "ginx.bash",
        "_ginx",
        "ginx.fish",
        "ginxctl.bash",
        "_ginxctl",
        "ginxctl.fish",
    ] {
        assert!(c.join(f).is_file(), "{f}");
    }
    let bash = std::fs::read_to_string(c.join("ginxctl.bash")).unwrap();
    assert!(bash.contains("complete -F _ginxctl") && bash.contains("switch-kube-vip"));
    assert!(bash.contains("rollout") && bash.contains("cluster"));
    if support::which("bash").is_some() {
        succeed(Command::new("bash").arg("-n").arg(c.join("ginxctl.bash")));
    }
    let man = dir.path().join("man");
    for page in [
        "ginx.1",
        "ginxctl.1",
        "ginxctl-status.1",
        "ginxctl-kubeadm-join.1",
        "ginxctl-rollout-clear.1",
        "ginxctl-cluster.1",
    ] {
        let text =
            std::fs::read_to_string(man.join(page)).unwrap_or_else(|e| panic!("{page}: {e}"));
        let title = format!(".TH {} 1", page.trim_end_matches(".1"));
        assert!(text.contains(&title), "{page}: no {title}");
    }
    // No pages for the hidden internals or for `help`.
    let pages: Vec<String> = std::fs::read_dir(&man)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        !pages.iter().any(|p| p.contains("help")
            || p.contains("run-attempt")
            || p.contains("generate-assets")),
        "{pages:?}"
    );
    let join = std::fs::read_to_string(man.join("ginxctl-kubeadm-join.1")).unwrap();
    assert!(join.contains("ca\\-cert\\-hash"), "{join}");
}

/// `ginx --print-default-config`'s `[apply]` durations.
fn default_stop_graces() -> (String, String) {
    let out = succeed(Command::new(support::ginx_bin()).arg("--print-default-config"));
    let doc: toml::Table = toml::from_str(&String::from_utf8_lossy(&out.stdout)).unwrap();
    let apply = doc["apply"].as_table().unwrap();
    (
        apply["shutdown_grace"].as_str().unwrap().to_owned(),
        apply["kill_grace"].as_str().unwrap().to_owned(),
    )
}

/// `TimeoutStopSec` is derived from `shutdown_grace` and `kill_grace` (a SIGTERM
/// with an apply running takes at most their sum plus a margin), not a fixed 120 s that a
/// longer grace outgrows: the unit carries the value for ginx's defaults, and the module
/// computes it from the settings with ginx's defaults.
#[test]
fn timeout_stop_sec_is_derived_from_the_graces() {
    let unit = read("packaging/systemd/ginx.service");
    let module = read("nixos-module/default.nix");
    let directives = service_directives(&unit);
    let value = &directives
        .iter()
        .find(|(k, _)| k == "TimeoutStopSec")
        .expect("TimeoutStopSec in the unit")
        .1;
    assert!(module.contains("TimeoutStopSec = timeoutStopSec;"));
    assert!(module.contains("import ./stop-timeout.nix"));
    let nix = read("nixos-module/stop-timeout.nix");
    let (shutdown, kill) = default_stop_graces();
    assert!(
        nix.contains(&format!("shutdown_grace ? \"{shutdown}\""))
            && nix.contains(&format!("kill_grace ? \"{kill}\"")),
        "stop-timeout.nix's defaults differ from ginx --print-default-config ({shutdown}, {kill})"
    );
    // ginx's own computation for the defaults: 1m + 10s + 30s.
    assert_eq!(value, "100s");
    if !support::require("nix-instantiate") {
        return;
    }
    let eval = |args: &str| {
        let out = Command::new("nix-instantiate")
            .args(["--eval", "-E"])
            .arg(format!(
                "(import {}/nixos-module/stop-timeout.nix) {args}",
                repo().display()
            ))
            .output()
            .unwrap();
        (
            String::from_utf8_lossy(&out.stdout)
                .trim()
                .trim_matches('"')
                .to_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    assert_eq!(eval("{ }").0, *value);
    assert_eq!(
        eval("{ shutdown_grace = \"5m\"; kill_grace = \"1m 30s\"; }").0,
        "420s"
    );
    assert_eq!(eval("{ kill_grace = \"1500ms\"; }").0, "92s");
    let (out, err) = eval("{ shutdown_grace = \"5 minutes\"; }");
    assert!(
        out.is_empty() && err.contains("cannot compute TimeoutStopSec"),
        "{err}"
    );
}

/// `nixos-module/bootstrap.nix` evaluated as the module does it, from options like those of
/// `services.ginx.bootstrap`.
fn bootstrap_table(args: &str) -> Result<Value, String> {
    let out = Command::new("nix-instantiate")
        .args(["--eval", "--json", "--strict", "-E"])
        .arg(format!(
            "(import {}/nixos-module/bootstrap.nix) {args}",
            repo().display()
        ))
        .output()
        .unwrap();
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(serde_json::from_slice(&out.stdout).unwrap())
}

#[test]
fn the_modules_bootstrap_options_make_a_bootstrap_table_ginx_accepts() {
    if !support::require("nix-instantiate") {
        return;
    }
    // Every option the module declares for a stage and for Flux is mapped by bootstrap.nix.
    let module = read("nixos-module/default.nix");
    let mapping = read("nixos-module/bootstrap.nix");
    for opt in [
        "clusterType",
        "networkPolicy",
        "pullSecret",
        "components",
        "registry",
        "version",
        "domain",
    ] {
        assert!(
            module.contains(&format!("      {opt} = ")),
            "the module lacks {opt}"
        );
        assert!(
            mapping.contains(&format!("f.{opt} or null")),
            "bootstrap.nix does not map {opt}"
        );
    }
    assert!(module.contains("import ./bootstrap.nix"));
    assert!(module.contains(r#"optionalString cfg.bootstrap.afterInit "--bootstrap ""#));

    // Nothing set: no [bootstrap] table at all.
    assert_eq!(bootstrap_table("{ }").unwrap(), serde_json::json!({}));

    // As the module passes them: submodule values carry every option, unset ones as null.
    let table = bootstrap_table(
        r#"{
          afterInit = true;
          kubeconfig = null;
          stages = [
            { name = "cni"; source = "argus"; path = "bootstrap/cilium.yaml";
              wait = [ "daemonset/kube-system/cilium" "nodes" ]; timeout = "15m"; }
            { name = "operator"; source = null; path = "/etc/ginx/flux-operator.yaml";
              wait = [ "deployment/flux-system/flux-operator" ]; timeout = null; }
          ];
          flux = { source = null; version = "2.6.x"; registry = null; components = null;
            clusterType = null; networkPolicy = false; domain = null; url = null; ref = null;
            path = "clusters/lab"; pullSecret = null; timeout = null; };
        }"#,
    )
    .unwrap();
    assert_eq!(
        table,
        serde_json::json!({
            "after_init": true,
            "stages": [
                {"name": "cni", "source": "argus", "path": "bootstrap/cilium.yaml",
                 "wait": ["daemonset/kube-system/cilium", "nodes"], "timeout": "15m"},
                {"name": "operator", "path": "/etc/ginx/flux-operator.yaml",
                 "wait": ["deployment/flux-system/flux-operator"]}
            ],
            "flux": {"version": "2.6.x", "network_policy": false, "path": "clusters/lab"}
        })
    );
    // ginx reads it: written as the module writes settings (TOML), beside two sources.
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    let write = |bootstrap: &Value| {
        let doc = serde_json::json!({
            "state_dir": dir.path().join("state"),
            "sources": {
                "hephaestus": {"url": "https://git.example.com/hephaestus.git"},
                "argus": {"url": "https://git.example.com/argus.git"}
            },
            "bootstrap": bootstrap,
        });
        std::fs::write(&config, toml::to_string(&doc).unwrap()).unwrap();
    };
    write(&table);
    let out = support::check_config(&config);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("after_init = true"), "{stdout}");
    assert!(stdout.contains("[bootstrap.flux]"), "{stdout}");
    // A wrong wait from the module is named by ginx at its key.
    let mut bad = table.clone();
    bad["stages"][1]["wait"] = serde_json::json!(["pods/x"]);
    write(&bad);
    let out = support::check_config(&config);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("bootstrap.stages[1].wait[0]"), "{stderr}");
}
