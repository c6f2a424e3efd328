//! The second tier: the real `ginx` under a real systemd (PID 1 of a systemd-nspawn container
//! booted from a Debian tree; tests/support/nspawn.rs), installed from
//! `packaging/systemd/ginx.service` and its tmpfiles file as shipped.
//!
//! Each test's Git repository and stand-in colmena live in an [`Env`] on the host, bound into
//! the machine at the same path; the machine's ginx has the default state directory, socket
//! and isolation (`auto`: `systemd-run` under systemd). What the tests read is the recorded
//! history: systemd's own view (`systemctl show`), the journal, ginx's status and history.

use std::path::Path;

use serde_json::Value;

use crate::support::control_plane::{self, RbacGuard};
use crate::support::kubelet::Kubelet;
use crate::support::nspawn::{self, Machine};
use crate::support::reboot::Unschedulable;
use crate::support::test_fleet::TestFleet;
use crate::support::{Env, http, ssh, wait_for, wait_for_up_to};

/// The watchdog's minute (WatchdogSec=60s as shipped) and RestartSec, with room.
const WATCHDOG_PATIENCE: std::time::Duration = std::time::Duration::from_secs(180);

/// A machine `name` with ginx installed and configured to apply `env`'s repository with the
/// stand-in colmena; ginx not started. `extra` is appended to the config.
fn machine(image: &Path, name: &str, env: &Env, extra: &str) -> Machine {
    let colmena = format!(
        "\"env\", \"GINX_STUB_DIR={}\", \"{}\", \"apply-local\", \"--node\", \"{{node}}\"",
        env.stub_dir.display(),
        env.colmena.display()
    );
    machine_applying(image, name, env, &colmena, extra)
}

/// [`machine`] whose `apply.command` is `command` (TOML array items).
fn machine_applying(image: &Path, name: &str, env: &Env, command: &str, extra: &str) -> Machine {
    machine_binding(image, name, env, &[], command, extra)
}

/// [`machine_applying`] that also sees `binds` (host paths, at the same path).
fn machine_binding(
    image: &Path,
    name: &str,
    env: &Env,
    binds: &[&Path],
    command: &str,
    extra: &str,
) -> Machine {
    let mut all = vec![env.root.as_path()];
    all.extend_from_slice(binds);
    let m = Machine::new(image, name, &all);
    m.install_ginx();
    m.write("/etc/ginx/config.toml", &config(name, env, command, extra));
    m
}

fn config(name: &str, env: &Env, command: &str, extra: &str) -> String {
    format!(
        r#"[node]
name = "{name}"

[sources.hephaestus]
url = "{repo}"
interval = "1h"

[apply]
command = [{command}]
retry_base = "1h"
retry_max = "8h"

[control]
group = "ginx-ops"

[rollout.gate]
settle = "1s"
{extra}
"#,
        repo = env.repo.path.display(),
    )
}

/// `ginxctl status --json` inside the machine, as root.
fn status(m: &Machine) -> Option<Value> {
    let o = m.exec(&["ginxctl", "status", "--json"]);
    o.status
        .success()
        .then(|| serde_json::from_slice(&o.stdout).ok())
        .flatten()
}

fn wait_status(m: &Machine, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    let last = std::cell::RefCell::new(None);
    let found = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_for(what, || {
            let s = status(m)?;
            if pred(&s) {
                return Some(s);
            }
            *last.borrow_mut() = Some(s);
            None
        })
    }));
    found.unwrap_or_else(|_| {
        let said = m.messages("ginx");
        let tail = &said[said.len().saturating_sub(30)..];
        panic!(
            "timed out waiting for {what} on {}; last status: {:#}\nginx's journal (end): {tail:#?}",
            m.name,
            last.borrow().clone().unwrap_or_default()
        )
    })
}

/// ginx's journal from the last `Stopping ginx.service` on, once it holds ginx's own last
/// line (`stopped`): journald takes ginx's lines and systemd's from different sockets, so
/// systemd's "Stopped" may be read before ginx's last lines are.
fn stop_messages(m: &Machine) -> Vec<String> {
    wait_for("ginx's last lines in the journal", || {
        let said = m.messages("ginx");
        let stopping = said
            .iter()
            .rposition(|l| l.starts_with("Stopping ginx.service"))?;
        // ginx may log its own first words on SIGTERM before systemd's "Stopping" line is
        // stamped (two senders, one journal): they belong to this stop if they follow the
        // last start.
        let started = said
            .iter()
            .rposition(|l| l.starts_with("Started ginx.service"))
            .unwrap_or(0);
        let own = said
            .iter()
            .rposition(|l| l.starts_with("stopping: "))
            .filter(|&i| i > started && i < stopping);
        let after = said[own.unwrap_or(stopping)..].to_vec();
        after.iter().any(|l| l == "stopped").then_some(after)
    })
}

/// `systemctl enable --now ginx`, then waits for systemd to see it READY.
fn enable(m: &Machine) {
    m.ok(&["groupadd", "--system", "ginx-ops"]);
    m.ok(&[
        "useradd",
        "--system",
        "--groups",
        "ginx-ops",
        "operator-olga",
    ]);
    m.ok(&["useradd", "--system", "outsider-otto"]);
    m.ok(&["systemctl", "daemon-reload"]);
    let o = m.exec(&["systemctl", "enable", "--now", "ginx"]);
    assert!(
        o.status.success(),
        "systemctl enable --now ginx on {}: {}\nginx's journal: {:#?}",
        m.name,
        String::from_utf8_lossy(&o.stderr),
        m.messages("ginx")
    );
    wait_for("ginx active", || {
        (m.show("ginx", "ActiveState") == "active").then_some(())
    });
}

/// 1. The shipped unit: READY (Type=notify) and STATUS seen by systemd, the socket for a member
///    of the control group only, a SIGSTOPped ginx killed and restarted by the watchdog, and
///    `systemctl stop` ending without a timeout, also while an apply runs.
#[test]
fn the_shipped_unit_under_systemd() {
    let Some(image) = nspawn::image() else { return };
    let env = Env::new();
    env.stub("sleep", "0.2");
    let mut m = machine(image, "sd-unit", &env, "");
    m.boot();
    enable(&m);
    let r = env.repo.head();
    wait_status(&m, "the first revision applied", |s| {
        s["apply"]["applied_revision"] == r.as_str()
    });
    // systemd's StatusText follows ginx's STATUS.
    let text = wait_for("StatusText saying up to date", || {
        let t = m.show("ginx", "StatusText");
        t.contains(&format!("up to date: hephaestus {} applied", &r[..12]))
            .then_some(t)
    });
    let shown = String::from_utf8(
        m.exec(&["systemctl", "status", "ginx", "--no-pager"])
            .stdout,
    )
    .unwrap();
    assert!(shown.contains(&format!("Status: \"{text}\"")), "{shown}");
    assert_eq!(m.show("ginx", "Type"), "notify");
    assert_eq!(m.show("ginx", "SubState"), "running");
    // The state directory is private; the socket answers the control group, not others.
    let mode = m.ok(&["stat", "-c", "%a", "/var/lib/ginx"]);
    assert_eq!(mode.trim(), "700");
    let olga = m.exec(&[
        "setpriv",
        "--reuid=operator-olga",
        "--regid=operator-olga",
        "--init-groups",
        "ginxctl",
        "status",
    ]);
    assert!(
        olga.status.success(),
        "{}",
        String::from_utf8_lossy(&olga.stderr)
    );
    let otto = m.exec(&[
        "setpriv",
        "--reuid=outsider-otto",
        "--regid=outsider-otto",
        "--init-groups",
        "ginxctl",
        "status",
    ]);
    assert!(
        !otto.status.success(),
        "a user outside ginx-ops read the status"
    );
    // The watchdog: a stopped ginx is killed and started again by systemd.
    let pid = m.show("ginx", "MainPID");
    let restarts: u32 = m.show("ginx", "NRestarts").parse().unwrap();
    m.ok(&["kill", "-STOP", &pid]);
    wait_for_up_to("the watchdog restarting ginx", WATCHDOG_PATIENCE, || {
        let now = m.show("ginx", "MainPID");
        (now != pid && now != "0" && m.show("ginx", "ActiveState") == "active").then_some(())
    });
    assert_eq!(
        m.show("ginx", "NRestarts").parse::<u32>().unwrap(),
        restarts + 1
    );
    let said = m.messages("ginx");
    assert!(
        said.iter().any(|l| l.contains("Watchdog timeout")),
        "{said:#?}"
    );
    // `systemctl stop` during an apply: ginx ends in time (no stop timeout); the apply, in a
    // transient unit of its own, is not ginx's to kill.
    let go = env.root.join("go");
    env.stub("wait_for", &go.display().to_string());
    let s = env.repo.commit("hive.nix", "{ second = true; }", "second");
    m.ok(&["ginxctl", "sync"]);
    wait_status(&m, "the second revision applying", |st| {
        st["apply"]["state"] == "applying" && st["apply"]["revision"] == s.as_str()
    });
    m.ok(&["systemctl", "stop", "ginx"]);
    assert_eq!(m.show("ginx", "ActiveState"), "inactive");
    assert_eq!(m.show("ginx", "Result"), "success");
    let after = stop_messages(&m);
    assert!(
        !after
            .iter()
            .any(|l| l.contains("timed out") || l.contains("Killing")),
        "{after:#?}"
    );
    assert!(
        after
            .iter()
            .any(|l| l.contains("leaving the running attempt to its unit")),
        "{after:#?}"
    );
    // The apply goes on in its transient unit while ginx is stopped.
    let units = m.ok(&[
        "systemctl",
        "list-units",
        "--no-legend",
        "--plain",
        "ginx-apply-*",
    ]);
    assert!(units.contains("ginx-apply-"), "{units}");
    std::fs::write(&go, "").unwrap();
    m.ok(&["systemctl", "start", "ginx"]);
    wait_status(&m, "the second revision's outcome recorded", |st| {
        st["apply"]["applied_revision"] == s.as_str()
    });
    m.stop();
    assert_eq!(m.exits(), vec![0], "nspawn's exits: {:?}", m.exits());
}

/// Writes an executable stand-in activation at `env.root/name`: it appends `start` to
/// `env.root/activations`, runs `during` (as NixOS's switch-to-configuration restarts the
/// units it changed, ginx's among them), waits until `env.root/go` exists, appends `end`.
/// It follows colmena's exit contract (0: activated).
fn activation(env: &Env, name: &str, during: &str) -> String {
    let root = env.root.display();
    let path = env.root.join(name);
    std::fs::write(
        &path,
        format!(
            // `build` (apply.prebuild, before the slot) activates nothing, as colmena's does.
            "#!/bin/sh\n[ \"${{1:-}}\" != build ] || exit 0\necho start >> {root}/activations\n\
             systemctl show -p MainPID --value ginx > {root}/ginx-before\n{during}\n\
             while [ ! -e {root}/go ]; do sleep 0.1; done\necho end >> {root}/activations\n"
        ),
    )
    .unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    path.display().to_string()
}

/// The attempts in ginx's history for `revision`.
fn attempts(m: &Machine, revision: &str) -> Vec<Value> {
    let h: Value = serde_json::from_str(&m.ok(&["ginxctl", "history", "--json"])).unwrap();
    h["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["revision"] == revision)
        .cloned()
        .collect()
}

/// `revision`'s activation ran once and its success is recorded once.
fn applied_once(m: &Machine, env: &Env, revision: &str, case: &str) {
    let all = attempts(m, revision);
    // The build before the slot (apply.prebuild) is an attempt of its own, once.
    let builds: Vec<&Value> = all.iter().filter(|a| a["kind"] == "build").collect();
    assert!(builds.len() <= 1, "{case}: built once: {all:#?}");
    let a: Vec<Value> = all
        .iter()
        .filter(|a| a["kind"] != "build")
        .cloned()
        .collect();
    assert_eq!(a.len(), 1, "{case}: recorded once: {a:#?}");
    assert_eq!(a[0]["outcome"], "succeeded", "{case}: {a:#?}");
    let ran = std::fs::read_to_string(env.root.join("activations")).unwrap();
    assert_eq!(ran, "start\nend\n", "{case}: the activation ran once");
}

/// 2. Applies that restart ginx: with `apply.isolation` at its default, the activation runs in
///    a transient `ginx-apply-*` unit; an activation that restarts ginx (`systemctl restart`),
///    or a ginx SIGKILLed mid-apply, leaves it running, and the next ginx follows it and
///    records its outcome exactly once.
#[test]
fn an_activation_that_restarts_or_kills_ginx_is_followed_by_the_next_ginx() {
    let Some(image) = nspawn::image() else { return };
    for (case, during) in [
        ("restart", "systemctl restart ginx"),
        (
            "sigkill",
            "kill -KILL \"$(systemctl show -p MainPID --value ginx)\"",
        ),
    ] {
        let env = Env::new();
        let script = activation(&env, "activate", during);
        let mut m = machine_applying(
            image,
            &format!("sd-{case}"),
            &env,
            &format!("\"{script}\""),
            "",
        );
        m.boot();
        enable(&m);
        let r = env.repo.head();
        let first = wait_for("the activation started", || {
            std::fs::read_to_string(env.root.join("ginx-before"))
                .ok()
                .filter(|p| p.ends_with('\n'))
        });
        let st = wait_for("a new ginx following the attempt", || {
            let pid = m.show("ginx", "MainPID");
            (pid != first.trim() && pid != "0")
                .then(|| status(&m))
                .flatten()
                .filter(|s| s["apply"]["state"] == "applying")
        });
        assert_eq!(st["apply"]["isolation"], "systemd-run", "{case}: {st:#}");
        let units = m.ok(&[
            "systemctl",
            "list-units",
            "--no-legend",
            "--plain",
            "ginx-apply-*",
        ]);
        assert!(units.contains("ginx-apply-"), "{case}: {units}");
        std::fs::write(env.root.join("go"), "").unwrap();
        wait_status(&m, "the outcome recorded", |s| {
            s["apply"]["applied_revision"] == r.as_str()
        });
        applied_once(&m, &env, &r, case);
        let said = m.messages("ginx");
        assert!(
            said.iter().any(|l| l.contains("follow")),
            "{case}: {said:#?}"
        );
        m.stop();
    }
}

/// 1 and 4. Fetches under the shipped unit over HTTPS (a token file, the system's trust store)
/// and, after `systemctl reload`, over SSH (a deploy key, known hosts); ginx's structured
/// fields in `journalctl -o json`; and the journal, like everything else ginx writes, in the
/// secrets sweep (collected when the machine stops).
#[test]
fn fetches_over_https_and_ssh_and_the_journal_has_the_fields() {
    let Some(image) = nspawn::image() else { return };
    let env = Env::new();
    let bare = env.bare();
    let token = "jrn-t0ken-under-systemd";
    crate::support::sweep::secret_in_url("HTTPS token", token);
    let server = http::GitHttpServer::start(
        bare.parent().unwrap(),
        http::Options {
            tls: true,
            basic_auth: Some(("deploy".into(), token.into())),
            ..Default::default()
        },
    );
    let sshd = ssh::SshServer::start(&env.root.join("ssh"));
    let url = format!("{}/hephaestus.git", server.base_url);
    let mut m = machine(image, "sd-fetch", &env, "");
    m.write(
        "/usr/local/share/ca-certificates/ginx-test.crt",
        &server.ca.as_ref().unwrap().pem(),
    );
    m.write("/etc/ginx/hephaestus.token", &format!("{token}\n"));
    std::fs::set_permissions(
        m.path("/etc/ginx/hephaestus.token"),
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    m.write(
        "/etc/ginx/config.d/10-https.toml",
        &format!(
            "[sources.hephaestus]\nurl = \"{url}\"\nusername = \"deploy\"\n\
             token_file = \"/etc/ginx/hephaestus.token\"\n"
        ),
    );
    m.boot();
    m.ok(&["update-ca-certificates"]);
    enable(&m);
    let r = env.repo.head();
    wait_status(&m, "applied over HTTPS", |s| {
        s["apply"]["applied_revision"] == r.as_str()
    });
    assert!(server.requests().iter().any(|q| q.authorization.is_some()));
    // SSH, after a reload (ExecReload: SIGHUP).
    let s = env
        .repo
        .commit("hive.nix", "{ over_ssh = true; }", "over ssh");
    env.push("main", false);
    m.write(
        "/etc/ginx/config.d/10-https.toml",
        &format!(
            "[sources.hephaestus]\nurl = \"{}\"\n{}",
            sshd.url(&bare),
            sshd.source_keys(&sshd.known_hosts)
        ),
    );
    m.ok(&["systemctl", "reload", "ginx"]);
    wait_for("the reload", || {
        m.messages("ginx")
            .iter()
            .any(|l| l.contains("configuration reloaded"))
            .then_some(())
    });
    m.ok(&["ginxctl", "sync"]);
    wait_status(&m, "applied over SSH", |st| {
        st["apply"]["applied_revision"] == s.as_str()
    });
    assert!(sshd.log().contains("Accepted publickey"), "{}", sshd.log());
    // Structured fields: the revision, source and attempt of an apply, and phases.
    let entries = m.journal("ginx");
    let ginx: Vec<&Value> = entries
        .iter()
        .filter(|e| e["SYSLOG_IDENTIFIER"] == "ginx")
        .collect();
    let has = |field: &str, value: &str| {
        ginx.iter()
            .any(|e| e[field].as_str().is_some_and(|v| v.contains(value)))
    };
    let fields: std::collections::BTreeSet<&str> = ginx
        .iter()
        .flat_map(|e| e.as_object().unwrap().keys().map(String::as_str))
        .collect();
    for (field, value) in [
        ("REVISION", &s[..12]),
        ("SOURCE", "hephaestus"),
        ("ATTEMPT", "0"),
        ("PHASE", "verifying"),
    ] {
        assert!(
            has(field, value),
            "no journal entry of ginx with {field} = {value}; fields: {fields:?}"
        );
    }
    a_broken_reload_shows_its_reason(&m);
    every_entry_is_one_self_contained_message(&m.journal("ginx"));
    m.stop();
}

/// A reload with a broken drop-in: what `journalctl -u ginx` (its default output) and
/// `systemctl status ginx` show names the file, line and column and the parse error, not only
/// that the reload failed.
fn a_broken_reload_shows_its_reason(m: &Machine) {
    m.write("/etc/ginx/config.d/20-broken.toml", "[sources.broken\n");
    m.ok(&["systemctl", "reload", "ginx"]);
    let want = "/etc/ginx/config.d/20-broken.toml:1:";
    wait_for("the failed reload in the journal", || {
        m.ok(&["journalctl", "-u", "ginx", "--no-pager"])
            .lines()
            .any(|l| l.contains("configuration reload failed") && l.contains(want))
            .then_some(())
    });
    let line = m
        .ok(&["journalctl", "-u", "ginx", "--no-pager"])
        .lines()
        .rfind(|l| l.contains("configuration reload failed"))
        .unwrap()
        .to_owned();
    assert!(line.contains("expected"), "no parse error in: {line}");
    let status = String::from_utf8_lossy(
        &m.exec(&["systemctl", "status", "ginx", "--no-pager"])
            .stdout,
    )
    .into_owned();
    assert!(
        status
            .lines()
            .any(|l| l.contains("configuration reload failed") && l.contains(want)),
        "systemctl status ginx does not show why the reload failed:\n{status}"
    );
    m.ok(&["rm", "/etc/ginx/config.d/20-broken.toml"]);
}

/// Fields journald or the sender give every entry: not the event's own.
fn standard_field(name: &str) -> bool {
    name.starts_with('_')
        || name.starts_with("SYSLOG_")
        || ["MESSAGE", "PRIORITY", "TARGET", "CODE_FILE", "CODE_LINE"].contains(&name)
}

/// No entry of ginx has two MESSAGE values, and every warning or error has the fields that say
/// why in its MESSAGE (as `name=value`, the journal field being the name upper-cased).
fn every_entry_is_one_self_contained_message(entries: &[Value]) {
    let ginx: Vec<&Value> = entries
        .iter()
        .filter(|e| e["SYSLOG_IDENTIFIER"] == "ginx")
        .collect();
    assert!(ginx.len() > 10, "{} entries", ginx.len());
    let mut warnings = 0;
    for e in &ginx {
        let message = e["MESSAGE"]
            .as_str()
            .unwrap_or_else(|| panic!("MESSAGE is not one string: {e}"));
        let priority: u8 = e["PRIORITY"].as_str().unwrap().parse().unwrap();
        let own: Vec<&String> = e
            .as_object()
            .unwrap()
            .keys()
            .filter(|k| !standard_field(k))
            .collect();
        if priority > 4 {
            continue;
        }
        warnings += 1;
        assert!(!own.is_empty(), "a warning without a reason: {message}");
        let shown = message.to_uppercase().replace('.', "_");
        for field in own {
            assert!(
                shown.contains(&format!("{field}=")),
                "{field} is not in MESSAGE: {message}"
            );
        }
    }
    // The failed reload at least.
    assert!(warnings >= 1);
}

/// 3. Self-update: the activation installs a new ginx binary (a copy whose version stamp
///    differs). ginx records the outcome, exits, systemd starts the new one, and status shows
///    its version.
#[test]
fn an_activation_that_installs_a_new_ginx_is_restarted_into_by_systemd() {
    let Some(image) = nspawn::image() else { return };
    let env = Env::new();
    let new_version = format!("{}+selfupdate", ginx::VERSION);
    let v2 = env.root.join("ginx-v2");
    crate::support::stamped_ginx(&v2, &new_version);
    std::fs::write(env.root.join("go"), "").unwrap();
    let script = activation(
        &env,
        "activate",
        &format!("install -m 0755 {} /usr/local/bin/ginx", v2.display()),
    );
    let mut m = machine_applying(
        image,
        "sd-selfupdate",
        &env,
        &format!("\"{script}\""),
        "\n[system]\nginx_binary = \"/usr/local/bin/ginx\"\n",
    );
    m.boot();
    enable(&m);
    let r = env.repo.head();
    let st = wait_status(&m, "the new version running", |s| {
        s["version"] == new_version.as_str()
    });
    // From its first answer on, the new ginx's status says what the state file says.
    assert_eq!(st["apply"]["applied_revision"], r.as_str(), "{st:#}");
    applied_once(&m, &env, &r, "self-update");
    let said = m.messages("ginx");
    let restarting = said
        .iter()
        .position(|l| l.contains("a new version of ginx was activated; restarting into it"))
        .unwrap_or_else(|| panic!("{said:#?}"));
    // ginx exited by itself (not killed) and systemd started it again.
    assert!(
        said[restarting..]
            .iter()
            .any(|l| l.contains("Scheduled restart job")),
        "{said:#?}"
    );
    assert!(m.show("ginx", "NRestarts").parse::<u32>().unwrap() >= 1);
    let v = m.ok(&["/usr/local/bin/ginx", "--version"]);
    assert!(v.contains(&new_version), "{v}");
    m.stop();
}

/// `text` as the body of a YAML block scalar indented by six spaces (a `write_files` entry's
/// `content: |`).
fn block(text: &str) -> String {
    text.lines().map(|l| format!("      {l}\n")).collect()
}

/// A kaas VM's user-data as README says to make it: the operator's copy of
/// `packaging/cloud-init/user-data.yaml` (in `dir`) with the sources' URLs put in once (both
/// `url`), filled by `fill-user-data.sh NAME worker KEY 'HOST_KEY_LINE'`. Plus, simulated, what
/// kubeadm join and Cluster API's `files` would write: ginx's kubeconfig `kc`, the node's
/// `kubelet.conf` beside it, and the drop-in naming the first, as three more `write_files`.
pub(crate) fn kaas_user_data(
    dir: &Path,
    name: &str,
    url: &str,
    key: &Path,
    host_key_line: &str,
    kc: &Path,
) -> String {
    std::fs::create_dir_all(dir).unwrap();
    let packaging = Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/cloud-init");
    let template = std::fs::read_to_string(packaging.join("user-data.yaml"))
        .unwrap()
        .replace("ssh://git@git.example.com/infra/hephaestus.git", url)
        .replace("ssh://git@git.example.com/infra/argus.git", url);
    std::fs::write(dir.join("user-data.yaml"), template).unwrap();
    std::fs::copy(
        packaging.join("fill-user-data.sh"),
        dir.join("fill-user-data.sh"),
    )
    .unwrap();
    let filled = std::process::Command::new("bash")
        .arg(dir.join("fill-user-data.sh"))
        .args([name, "worker"])
        .arg(key)
        .arg(host_key_line)
        .output()
        .unwrap();
    assert!(
        filled.status.success(),
        "{}",
        String::from_utf8_lossy(&filled.stderr)
    );
    let user_data = String::from_utf8(filled.stdout).unwrap();
    let simulated = format!(
        "write_files:\n\
         \x20 - path: /etc/ginx/kubeconfig\n    permissions: \"0600\"\n    content: |\n{}\
         \x20 - path: /etc/kubernetes/kubelet.conf\n    permissions: \"0600\"\n    content: |\n{}\
         \x20 - path: /etc/ginx/config.d/20-kubernetes.toml\n    content: |\n{}",
        block(&std::fs::read_to_string(kc).unwrap()),
        block(&std::fs::read_to_string(control_plane::node_kubeconfig(kc)).unwrap()),
        block("[kubernetes]\nkubeconfig = \"/etc/ginx/kubeconfig\"\n"),
    );
    assert_eq!(user_data.matches("\nwrite_files:\n").count(), 1);
    user_data.replacen("\nwrite_files:\n", &format!("\n{simulated}"), 1)
}

/// 7. A kaas VM's first boot: `packaging/cloud-init/user-data.yaml` with the sources' URLs put
///    in once and filled by `fill-user-data.sh`, as README says, is the NoCloud seed of a fresh
///    machine whose image has ginx enabled (the image's config as
///    `packaging/cloud-init/image-config.toml`, its colmena replaced by the stand-in). Real
///    cloud-init writes the files and restarts ginx; ginx fetches over SSH and reports to the
///    control plane on the host. A second boot does not run the per-instance steps again.
///
///    Simulated: kubeadm join, which on a kaas VM writes `/etc/kubernetes/kubelet.conf`, and
///    Cluster API's `files` entry with ginx's kubeconfig; here two more `write_files` entries in
///    the same user-data write them. The stand-in kubelet on the host keeps the Node.
#[test]
fn a_kaas_vm_s_first_boot_with_cloud_init() {
    let Some(image) = nspawn::image() else { return };
    let Some(cp) = control_plane::shared() else {
        return;
    };
    let name = "sd-kaas-1";
    let mut rbac = RbacGuard::new(cp);
    rbac.watch(name);
    let _kubelet = Kubelet::start(cp, name, "worker");
    let env = Env::new();
    let bare = env.bare();
    let sshd = ssh::SshServer::start(&env.root.join("ssh"));
    let kc = env.root.join("kube/kubeconfig");
    std::fs::create_dir_all(kc.parent().unwrap()).unwrap();
    cp.ginx_kubeconfig(&kc, name);
    let host_key = std::fs::read_to_string(&sshd.known_hosts).unwrap();
    let user_data = kaas_user_data(
        &env.root.join("cloud-init"),
        name,
        &sshd.url(&bare),
        &sshd.client_key,
        host_key.trim(),
        &kc,
    );
    let packaging = Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/cloud-init");
    // The image: ginx installed and enabled, its config the image's.
    let colmena = format!(
        "\"env\", \"GINX_STUB_DIR={}\", \"{}\", \"apply-local\", \"--node\", \"{{node}}\"",
        env.stub_dir.display(),
        env.colmena.display()
    );
    let image_config = std::fs::read_to_string(packaging.join("image-config.toml")).unwrap();
    let command = image_config
        .lines()
        .find(|l| l.starts_with("command = "))
        .unwrap();
    let mut m = Machine::new(image, name, &[&env.root]);
    m.install_ginx();
    m.write(
        "/etc/ginx/config.toml",
        &image_config.replace(command, &format!("command = [{colmena}]")),
    );
    std::fs::create_dir_all(m.path("/etc/systemd/system/multi-user.target.wants")).unwrap();
    std::os::unix::fs::symlink(
        "/etc/systemd/system/ginx.service",
        m.path("/etc/systemd/system/multi-user.target.wants/ginx.service"),
    )
    .unwrap();
    m.write("/var/lib/cloud/seed/nocloud/user-data", &user_data);
    m.write(
        "/var/lib/cloud/seed/nocloud/meta-data",
        &format!("instance-id: {name}-iid\nlocal-hostname: {name}\n"),
    );
    m.boot();
    let done = m.exec(&["cloud-init", "status", "--wait"]);
    let said = String::from_utf8_lossy(&done.stdout);
    assert!(said.contains("done"), "cloud-init: {said}");
    // ginx reports to the control plane with the node's name from the user-data.
    let r = env.repo.head();
    wait_for("the heartbeat Lease", || {
        cp.lease("ginx-system", &format!("ginx-{name}"))
    });
    let node = wait_for("the node's annotations", || {
        cp.node(name)
            .filter(|n| n["metadata"]["annotations"]["ginx.io/applied-revision"] == r.as_str())
    });
    let cond = node["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "GinxHealthy")
        .cloned();
    assert!(cond.is_some(), "{node:#}");
    assert!(sshd.log().contains("Accepted publickey"));
    let first_boot = m.boot_id();
    // A second boot: cloud-init's per-instance steps do not run again (write_files would put
    // the drop-in back as it was; runcmd would restart ginx). Their semaphores stay as the
    // first boot left them.
    let sems = ["config_write_files", "config_runcmd"]
        .map(|s| m.path(&format!("/var/lib/cloud/instances/{name}-iid/sem/{s}")));
    let stamps = sems.clone().map(|p| {
        std::fs::metadata(&p)
            .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
            .modified()
            .unwrap()
    });
    let dropin = m.path("/etc/ginx/config.d/10-node.toml");
    let mut edited = std::fs::read_to_string(&dropin).unwrap();
    edited.push_str("# edited after the first boot\n");
    std::fs::write(&dropin, &edited).unwrap();
    let _ = m.exec(&["systemctl", "reboot"]);
    wait_for("the reboot", || (m.exits() == [133]).then_some(()));
    m.wait_up();
    assert_ne!(m.boot_id(), first_boot);
    let done = m.exec(&["cloud-init", "status", "--wait"]);
    assert!(String::from_utf8_lossy(&done.stdout).contains("done"));
    assert_eq!(std::fs::read_to_string(&dropin).unwrap(), edited);
    for (p, t) in sems.iter().zip(stamps) {
        assert_eq!(
            std::fs::metadata(p).unwrap().modified().unwrap(),
            t,
            "{} ran again",
            p.display()
        );
    }
    wait_status(&m, "ginx up again after the reboot", |s| {
        s["apply"]["applied_revision"] == r.as_str() && s["kubernetes"]["state"] == "connected"
    });
    // In this boot ginx was started once and never restarted by a runcmd.
    let this_boot = m.ok(&[
        "journalctl",
        "-b",
        "0",
        "-u",
        "ginx",
        "-o",
        "cat",
        "--no-pager",
    ]);
    assert_eq!(
        this_boot.matches("Started ginx.service").count(),
        1,
        "{this_boot}"
    );
    assert!(!this_boot.contains("Stopping ginx.service"), "{this_boot}");
    m.stop();
}

/// A machine whose apply command is the real-Nix stand-in (tests/support/nix-activate-stub),
/// its system profile at generation 1 (built and booted: the machine reboots into it), ginx
/// not started.
fn nix_machine(image: &Path, name: &str, env: &Env, extra: &str) -> Machine {
    nix_machine_with(image, name, env, &[], extra, |_| {})
}

/// [`nix_machine`] that also sees `binds`, with `setup` run on it before its first boot.
fn nix_machine_with(
    image: &Path,
    name: &str,
    env: &Env,
    binds: &[&Path],
    extra: &str,
    setup: impl FnOnce(&Machine),
) -> Machine {
    let stub = env.root.join("bin/nix-activate");
    std::fs::copy(
        crate::support::support_dir().join("nix-activate-stub"),
        &stub,
    )
    .unwrap();
    let command = format!(
        "\"env\", \"GINX_STUB_DIR={}\", \"{}\", \"apply-local\", \"--node\", \"{{node}}\"",
        env.stub_dir.display(),
        stub.display()
    );
    let mut m = machine_binding(image, name, env, binds, &command, extra);
    setup(&m);
    m.boot();
    // The installed system: generation 1, then a boot into it.
    m.ok(&[
        "sh",
        "-c",
        &format!(
            "cd / && GINX_STUB_DIR={} {} apply-local boot",
            env.stub_dir.display(),
            stub.display()
        ),
    ]);
    let _ = m.exec(&["systemctl", "reboot"]);
    wait_for("the reboot into generation 1", || {
        (m.exits().len() == 1).then_some(())
    });
    m.wait_up();
    let booted = m.ok(&["readlink", "/run/booted-system"]);
    assert!(booted.contains("-system"), "{booted}");
    m
}

/// Generation numbers of the system profile, as Nix lists them, and the current one.
fn generations(m: &Machine) -> (Vec<u64>, u64) {
    let list = m.ok(&[
        "nix-env",
        "--profile",
        "/nix/var/nix/profiles/system",
        "--list-generations",
    ]);
    let mut all = Vec::new();
    let mut current = 0;
    for l in list.lines() {
        let n: u64 = l.split_whitespace().next().unwrap().parse().unwrap();
        all.push(n);
        if l.contains("(current)") {
            current = n;
        }
    }
    (all, current)
}

/// 6. Real Nix generations: applies make generations of the system profile with the machine's
///    real Nix; the gate's automatic rollback and `ginxctl rollback` run the default
///    `system.rollback_command` (`nix-env --rollback`) and `system.switch_command`; the
///    generation numbers in status and history are Nix's own.
#[test]
fn real_nix_generations_rolled_back_by_the_gate_and_by_ginxctl() {
    let Some(image) = nspawn::image() else { return };
    let env = Env::new();
    let m = nix_machine(
        image,
        "sd-nix",
        &env,
        "timeout = \"10s\"\ncommand = [\"sh\", \"-c\", \"test ! -e /run/current-system/broken\"]\n",
    );
    enable(&m);
    let r = env.repo.head();
    let st = wait_status(&m, "r applied as generation 2", |s| {
        s["apply"]["applied_revision"] == r.as_str()
    });
    assert_eq!(st["system"]["generation"]["number"], 2, "{st:#}");
    assert_eq!(generations(&m), (vec![1, 2], 2));
    // A broken system: the gate fails, ginx rolls back with nix-env.
    env.stub("broken", "");
    let s = env.repo.commit("hive.nix", "{ broken = true; }", "broken");
    m.ok(&["ginxctl", "sync"]);
    let st = wait_status(&m, "s rolled back", |st| {
        st["apply"]["revision"] == s.as_str() && st["apply"]["state"] == "rolled-back"
    });
    assert_eq!(generations(&m), (vec![1, 2, 3], 2));
    assert_eq!(st["system"]["generation"]["number"], 2, "{st:#}");
    let current = m.ok(&["readlink", "/run/current-system"]);
    let gen2 = m.ok(&["readlink", "-f", "/nix/var/nix/profiles/system-2-link"]);
    assert_eq!(current.trim(), gen2.trim(), "switched back to generation 2");
    // An operator rolls back once more.
    let out = m.ok(&["ginxctl", "rollback"]);
    assert!(!out.is_empty());
    let st = wait_status(&m, "the manual rollback", |st| {
        st["system"]["generation"]["number"] == 1
    });
    assert_eq!(generations(&m), (vec![1, 2, 3], 1), "{st:#}");
    let h: Value = serde_json::from_str(&m.ok(&["ginxctl", "history", "--json"])).unwrap();
    let mut attempts = h["attempts"].as_array().unwrap().clone();
    attempts.sort_by_key(|a| a["id"].as_u64());
    let seen: Vec<(String, String, Value, Value)> = attempts
        .iter()
        .map(|a| {
            (
                a["kind"].as_str().unwrap_or("").to_owned(),
                a["outcome"].as_str().unwrap_or("").to_owned(),
                a["generation_before"]["number"].clone(),
                a["generation_after"]["number"].clone(),
            )
        })
        .collect();
    let n = |v: u64| Value::from(v);
    // Each revision was built first (apply.prebuild, with the real Nix), changing no generation.
    assert_eq!(
        seen.iter().filter(|a| a.0 == "build").collect::<Vec<_>>(),
        vec![
            &("build".to_owned(), "succeeded".to_owned(), n(1), n(1)),
            &("build".to_owned(), "succeeded".to_owned(), n(2), n(2)),
        ],
        "{h:#}"
    );
    let seen: Vec<_> = seen.into_iter().filter(|a| a.0 != "build").collect();
    assert_eq!(
        seen,
        vec![
            ("apply".into(), "succeeded".into(), n(1), n(2)),
            ("apply".into(), "succeeded".into(), n(2), n(3)),
            ("rollback".into(), "succeeded".into(), n(3), n(2)),
            ("rollback".into(), "succeeded".into(), n(2), n(1)),
        ],
        "{h:#}"
    );
}

/// The kernel content `/run/booted-system` boots.
fn booted_kernel(m: &Machine) -> String {
    m.ok(&["cat", "/run/booted-system/kernel"])
        .trim()
        .to_owned()
}

/// 5. Real reboots, coordinated: lucy, makise and quinn, three machines against the real
///    control plane on the host, `[reboot] mode = "when-required"` and the default
///    `reboot_command` (`systemctl reboot`). A revision with a new kernel makes each machine
///    really reboot (nspawn exits 133 and boots it again: a new boot id), one at a time; each
///    comes back, verifies, uncordons and releases its slot. A revision whose gate fails after
///    the reboot is rolled back on the first node that takes it, which reboots again into the
///    previous generation; it is halted and no other node starts it.
///
///    Simulated: the kernel. The machines share the host's kernel; what changes is the system's
///    `kernel` store path, and `/run/booted-system` is set at boot by the image's stage-2
///    stand-in (ginx-test-stage2.service) from the profile, as NixOS's stage 2 does. The
///    stand-in kubelet on the host keeps the Node objects.
#[test]
fn real_reboots_one_machine_at_a_time() {
    let Some(image) = nspawn::image() else { return };
    let Some((cp, mut rbac, origin, journal)) = TestFleet::open() else {
        return;
    };
    std::fs::write(&journal, "").unwrap();
    let names: Vec<String> = ["sdr-lucy", "sdr-makise", "sdr-quinn"]
        .map(String::from)
        .to_vec();
    let _kubelets: Vec<Kubelet> = names
        .iter()
        .map(|n| Kubelet::start(cp, n, "worker"))
        .collect();
    let watch = Unschedulable::watch(cp, &names);
    let envs: Vec<Env> = names.iter().map(|_| Env::new()).collect();
    let machines: Vec<Machine> = names
        .iter()
        .zip(&envs)
        .map(|(name, env)| {
            rbac.watch(name);
            env.stub("journal", &journal.display().to_string());
            let kc = env.root.join("kube/kubeconfig");
            std::fs::create_dir_all(kc.parent().unwrap()).unwrap();
            cp.ginx_kubeconfig(&kc, name);
            let extra = format!(
                "interval = \"200ms\"\ntimeout = \"15s\"\n\
                 command = [\"sh\", \"-c\", \"{gate}; test ! -e /run/booted-system/broken\"]\n\n\
                 [kubernetes]\nkubeconfig = \"/etc/ginx/kubeconfig\"\nrenew_interval = \"1s\"\n\n\
                 [health]\ninterval = \"200ms\"\n[health.kubelet]\nenabled = false\n\
                 [health.apiserver]\nenabled = false\n[health.cilium]\nenabled = false\n\
                 [health.node_ready]\nenabled = true\n\n\
                 [rollout]\nlock = \"auto\"\ngroup = \"sdr\"\nlease_duration = \"5s\"\n\n\
                 [reboot]\nmode = \"when-required\"\nlock_ttl = \"60s\"\n",
                gate = crate::support::gate_writes(name, &journal)
            );
            nix_machine_with(image, name, env, &[&origin.root], &extra, |m| {
                m.write(
                    "/etc/ginx/config.d/20-fleet.toml",
                    &format!(
                        "[node]\nrole = \"worker\"\n\n[sources.hephaestus]\nurl = \"{}\"\n",
                        origin.repo.path.display()
                    ),
                );
                m.write(
                    "/etc/ginx/kubeconfig",
                    &std::fs::read_to_string(&kc).unwrap(),
                );
                m.write(
                    "/etc/kubernetes/kubelet.conf",
                    &std::fs::read_to_string(control_plane::node_kubeconfig(&kc)).unwrap(),
                );
                // Each boot says so in the shared journal.
                m.write(
                    "/etc/systemd/system/ginx-test-boot-journal.service",
                    &format!(
                        "[Unit]\nDescription=test: this boot in the shared journal\n\
                         [Service]\nType=oneshot\nExecStart=/bin/sh -c 'echo boot %H >> {}'\n\
                         [Install]\nWantedBy=multi-user.target\n",
                        journal.display()
                    ),
                );
                let wants = m.path("/etc/systemd/system/multi-user.target.wants");
                std::fs::create_dir_all(&wants).unwrap();
                std::os::unix::fs::symlink(
                    "/etc/systemd/system/ginx-test-boot-journal.service",
                    wants.join("ginx-test-boot-journal.service"),
                )
                .unwrap();
            })
        })
        .collect();
    for m in &machines {
        enable(m);
    }
    let first = origin.repo.head();
    for m in &machines {
        wait_status(m, "the first revision applied", |s| {
            s["apply"]["applied_revision"] == first.as_str()
        });
        assert_eq!(booted_kernel(m), "kernel-1");
    }
    // A new kernel: each machine reboots into it, one at a time.
    for env in &envs {
        env.stub("kernel", "kernel-2");
    }
    let second = origin
        .repo
        .commit("hive.nix", "{ kernel = 2; }", "kernel 2");
    for m in &machines {
        m.ok(&["ginxctl", "sync"]);
    }
    for m in &machines {
        wait_for_up_to(
            &format!("{} rebooted into kernel-2 and done", m.name),
            std::time::Duration::from_secs(300),
            || {
                let s = status(m)?;
                (s["apply"]["applied_revision"] == second.as_str()
                    && s["rollout"]["reboot"]["phase"].is_null()
                    && s["rollout"]["slot"].is_null()
                    && s["system"]["reboot_required"] == false)
                    .then_some(())
            },
        );
        // The installation's reboot into generation 1, and this one.
        assert_eq!(m.exits(), [133, 133], "{}", m.name);
        assert_eq!(booted_kernel(m), "kernel-2", "{}", m.name);
        assert!(
            !cp.node(&m.name).unwrap()["spec"]["unschedulable"]
                .as_bool()
                .unwrap_or(false),
            "{} uncordoned",
            m.name
        );
    }
    assert_eq!(
        watch.most.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "at most one node unschedulable at once"
    );
    let lines = crate::rollout::journal(&journal);
    assert_eq!(
        crate::rollout::most_at_once(&lines),
        1,
        "one node at a time between its activation and its gate after the reboot: {lines:?}"
    );
    // A kernel whose system fails its gate after the reboot.
    for env in &envs {
        env.stub("kernel", "kernel-3");
        env.stub("broken", "");
    }
    let bad = origin
        .repo
        .commit("hive.nix", "{ kernel = 3; }", "kernel 3, broken");
    let mark = lines.len();
    for m in &machines {
        m.ok(&["ginxctl", "sync"]);
    }
    let halt = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_for_up_to(
            "the bad revision halted",
            std::time::Duration::from_secs(300),
            || crate::faults::halts(cp).remove(&bad),
        )
    }))
    .unwrap_or_else(|_| {
        let seen: Vec<String> = machines
            .iter()
            .map(|m| {
                let said = m.messages("ginx");
                format!(
                    "{}: exits {:?}\n{}\n{:#?}",
                    m.name,
                    m.exits(),
                    String::from_utf8_lossy(&m.exec(&["ginxctl", "status"]).stdout),
                    &said[said.len().saturating_sub(25)..]
                )
            })
            .collect();
        panic!("the bad revision was not halted:\n{}", seen.join("\n"))
    });
    assert!(
        halt["reason"]
            .as_str()
            .is_some_and(|r| r.starts_with("health gate failed")),
        "{halt:#}"
    );
    let failed = machines
        .iter()
        .find(|m| halt["node"] == m.name.as_str())
        .unwrap();
    wait_status(
        failed,
        "the failed node back on kernel-2, rolled back",
        |s| s["apply"]["state"] == "rolled-back" && s["rollout"]["slot"].is_null(),
    );
    // Rebooted into the bad system, then into the previous one.
    assert_eq!(failed.exits(), [133, 133, 133, 133], "{}", failed.name);
    assert_eq!(booted_kernel(failed), "kernel-2");
    for m in &machines {
        if m.name != failed.name {
            wait_status(m, "held back by the halt", |s| {
                s["rollout"]["waiting_for"] == "halted"
            });
            assert_eq!(m.exits(), [133, 133], "{}", m.name);
        }
    }
    let after = &crate::rollout::journal(&journal)[mark..];
    assert!(
        after.iter().all(|(w, n)| w != "start" || *n == failed.name),
        "another node started the halted revision: {after:?}"
    );
}

/// 1. `systemctl stop` during an apply run as ginx's own child (`isolation = "process"`, the
///    default graces): ginx gives the apply `shutdown_grace`, stops its whole tree within
///    `kill_grace`, and exits inside the unit's `TimeoutStopSec` (100 s, derived from those
///    defaults): systemd records a clean stop, not a timeout.
#[test]
fn systemctl_stop_during_a_process_apply_ends_within_the_unit_s_timeout() {
    let Some(image) = nspawn::image() else { return };
    let env = Env::new();
    env.stub("hang", "");
    let mut m = machine(image, "sd-stop", &env, "");
    m.write(
        "/etc/ginx/config.d/50-process.toml",
        "[apply]\nisolation = \"process\"\n",
    );
    m.boot();
    enable(&m);
    wait_status(&m, "the apply running", |s| {
        s["apply"]["state"] == "applying"
    });
    assert_eq!(m.show("ginx", "TimeoutStopUSec"), "1min 40s");
    m.ok(&["systemctl", "stop", "ginx"]);
    assert_eq!(m.show("ginx", "ActiveState"), "inactive");
    assert_eq!(m.show("ginx", "Result"), "success");
    let after = stop_messages(&m);
    assert!(!after.iter().any(|l| l.contains("timed out")), "{after:#?}");
    assert!(after.iter().any(|l| l == "stopped"), "{after:#?}");
    m.stop();
}
