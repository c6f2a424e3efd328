//! Closure mode: the prebuilt system a revision points at, fetched from a binary cache and
//! switched to, with no hive evaluated on the node.
//!
//! Two halves. [`resolve`] runs in the daemon before an attempt starts: it reads the pointer
//! (a file of the pinned checkout, or a pin endpoint) and checks the store path's syntax, so a
//! malformed pointer is refused before anything runs. [`run`] is `ginx apply-closure`, the
//! command the runner runs for the attempt (so isolation, timeout, output capture, history and
//! hooks are those of any attempt):
//!
//! 1. `nix-store --realise PATH --add-root <gcroots>/next --indirect` with `--option
//!    substituters …`, `--option trusted-public-keys …`, `--option require-sigs true`
//!    (within `realise_timeout`);
//! 2. the path must be a NixOS system: `nixos-version` and `bin/switch-to-configuration`;
//! 3. `nix path-info -S --json PATH` for the closure's size;
//! 4. `nix-env --profile PROFILE --set PATH`;
//! 5. `PATH/bin/switch-to-configuration GOAL`; when it fails, the profile is pointed back at
//!    the generation it had before (`nix-env --switch-generation N`) before the attempt ends.
//!
//! What it found goes to `<attempt dir>/closure.json` ([`ClosureInfo`]), read by the
//! reconciler when the attempt ends.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use crate::apply::process::wait_bounded;
use crate::config::ClosureConfig;
use crate::types::{ClosureInfo, ClosureOrigin, EndpointUrl, Goal, Revision, check_store_path};

/// The report's file name in the attempt's directory.
pub const REPORT_FILE: &str = "closure.json";

/// A pin endpoint's answer longer than this is not a store path.
const MAX_PIN: usize = 4096;

/// The store path `cfg` points this node at, and where that came from: the file in `checkout`
/// (the apply source's tree at `revision`), or the pin endpoint.
pub async fn resolve(
    cfg: &ClosureConfig,
    node: &str,
    source: &str,
    checkout: &Path,
    revision: &Revision,
) -> Result<(String, ClosureOrigin), String> {
    if let Some(file) = cfg.file_for(node) {
        let origin = ClosureOrigin::File {
            source: source.to_owned(),
            revision: revision.to_string(),
            file: file.clone(),
        };
        let path = checkout.join(&file);
        // The pointer is part of the verified tree: a symlink out of it is not.
        let real = path
            .canonicalize()
            .map_err(|e| format!("{origin}: cannot read the closure pointer: {e}"))?;
        let root = checkout.canonicalize().map_err(|e| e.to_string())?;
        if !real.starts_with(&root) {
            return Err(format!(
                "{origin}: the closure pointer leads out of the checkout (a symlink); refused"
            ));
        }
        let text = std::fs::read_to_string(&real)
            .map_err(|e| format!("{origin}: cannot read the closure pointer: {e}"))?;
        let store_path = text.trim().to_owned();
        check_store_path(&store_path).map_err(|e| format!("{origin}: {e}"))?;
        check_node_name(cfg, node, &store_path).map_err(|e| format!("{origin}: {e}"))?;
        return Ok((store_path, origin));
    }
    let raw = cfg.url.clone().unwrap_or_default().replace("{node}", node);
    let url: EndpointUrl = raw.parse()?;
    let origin = ClosureOrigin::Url {
        url: url.to_string(),
    };
    let token = match &cfg.token_file {
        Some(p) => Some(read_secret(p)?),
        None => None,
    };
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::builder()
        .timeout(cfg.pin_timeout.get())
        .connect_timeout(cfg.pin_timeout.get())
        .user_agent(concat!("ginx/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| format!("{origin}: cannot set up the HTTP client: {e}"))?;
    let mut req = http.get(url.url().clone());
    if let Some(t) = &token {
        req = req.basic_auth(&cfg.username, Some(t));
    }
    // reqwest's errors name the URL as requested; only the shown form may be printed.
    let masked = |e: reqwest::Error| {
        let e = e.without_url();
        format!("{origin}: {e}")
    };
    let resp = req.send().await.map_err(masked)?;
    let status = resp.status();
    if !status.is_success() {
        return Err(format!(
            "{origin}: the pin endpoint answered {status}{}",
            if status.as_u16() == 401 || status.as_u16() == 403 {
                " (check apply.closure.token_file)"
            } else {
                ""
            }
        ));
    }
    if resp.content_length().is_some_and(|n| n > MAX_PIN as u64) {
        return Err(format!(
            "{origin}: the answer is over {MAX_PIN} bytes, not a store path"
        ));
    }
    let mut resp = resp;
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(masked)? {
        body.extend_from_slice(&chunk);
        if body.len() > MAX_PIN {
            return Err(format!(
                "{origin}: the answer is over {MAX_PIN} bytes, not a store path"
            ));
        }
    }
    let store_path = String::from_utf8_lossy(&body).trim().to_owned();
    check_store_path(&store_path).map_err(|e| format!("{origin}: {e}"))?;
    check_node_name(cfg, node, &store_path).map_err(|e| format!("{origin}: {e}"))?;
    Ok((store_path, origin))
}

/// With `require_node_name`, the path must be this node's system: NixOS names a system's
/// toplevel `nixos-system-<hostname>-<version>`. A pointer to another host's system (or to
/// anything else the cache signed) is refused before anything runs.
fn check_node_name(cfg: &ClosureConfig, node: &str, store_path: &str) -> Result<(), String> {
    if !cfg.require_node_name {
        return Ok(());
    }
    let name = store_path
        .strip_prefix(crate::types::STORE_DIR)
        .and_then(|r| r.get(33..))
        .unwrap_or("");
    let want = format!("nixos-system-{node}-");
    if name.starts_with(&want) {
        Ok(())
    } else {
        Err(format!(
            "{store_path} is not a system of this node: its name does not start with {want:?} \
             (apply.closure.require_node_name)"
        ))
    }
}

/// A token file's content, refused when others may read it.
fn read_secret(path: &Path) -> Result<String, String> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path)
        .map_err(|e| format!("apply.closure.token_file {}: {e}", path.display()))?;
    if !meta.is_file() {
        return Err(format!(
            "apply.closure.token_file {} is not a regular file",
            path.display()
        ));
    }
    let me = nix::unistd::geteuid().as_raw();
    if meta.uid() != me {
        return Err(format!(
            "apply.closure.token_file {} is owned by uid {}, not by ginx's user (uid {me}); \
             refusing to use it",
            path.display(),
            meta.uid()
        ));
    }
    if meta.mode() & 0o077 != 0 {
        return Err(format!(
            "apply.closure.token_file {} is accessible by group or others (mode {:04o}); run \
             `chmod 600 {}`",
            path.display(),
            meta.mode() & 0o7777,
            path.display()
        ));
    }
    std::fs::read_to_string(path)
        .map(|t| t.trim().to_owned())
        .map_err(|e| format!("apply.closure.token_file {}: {e}", path.display()))
}

/// The files one attempt works on: the system profile, the GC root that keeps the fetched
/// closure, the report.
pub struct Files<'a> {
    pub profile: &'a Path,
    pub gcroot: &'a Path,
    pub report: &'a Path,
}

/// The argv of `ginx apply-closure` for one attempt (`ginx` being `exe`).
pub fn argv(
    exe: &Path,
    cfg: &ClosureConfig,
    store_path: &str,
    origin: &ClosureOrigin,
    goal: Goal,
    files: &Files<'_>,
) -> Vec<String> {
    let Files {
        profile,
        gcroot,
        report,
    } = files;
    let mut a: Vec<String> = vec![
        exe.display().to_string(),
        "apply-closure".into(),
        "--path".into(),
        store_path.into(),
        "--goal".into(),
        goal.as_str().into(),
        "--profile".into(),
        profile.display().to_string(),
        "--gcroot".into(),
        gcroot.display().to_string(),
        "--report".into(),
        report.display().to_string(),
        "--origin".into(),
        serde_json::to_string(origin).unwrap_or_default(),
        "--realise-timeout".into(),
        cfg.realise_timeout.to_string(),
        "--nix-store".into(),
        cfg.nix_store.display().to_string(),
        "--nix-env".into(),
        cfg.nix_env.display().to_string(),
        "--nix".into(),
        cfg.nix.display().to_string(),
    ];
    for s in &cfg.substituters {
        a.extend(["--substituter".into(), s.clone()]);
    }
    for k in &cfg.trusted_public_keys {
        a.extend(["--trusted-public-key".into(), k.clone()]);
    }
    a
}

/// What `ginx apply-closure` is given.
#[derive(Clone, Debug)]
pub struct Args {
    pub path: String,
    pub goal: Goal,
    pub profile: PathBuf,
    pub gcroot: PathBuf,
    pub report: PathBuf,
    pub origin: ClosureOrigin,
    pub substituters: Vec<String>,
    pub trusted_public_keys: Vec<String>,
    pub realise_timeout: Duration,
    pub nix_store: PathBuf,
    pub nix_env: PathBuf,
    pub nix: PathBuf,
}

/// A step that failed: its message, and whether retrying the revision can help.
struct Refused {
    message: String,
    permanent: bool,
}

fn refused(message: impl Into<String>, permanent: bool) -> Refused {
    Refused {
        message: message.into(),
        permanent,
    }
}

/// Runs `cmd`, its stdout and stderr passed on line by line (the runner records them); ends
/// it after `timeout`. The exit code (`None`: killed) and the last stderr lines.
fn run_step(
    mut cmd: Command,
    timeout: Option<Duration>,
) -> Result<(Option<i32>, Vec<String>), String> {
    let program = cmd.get_program().to_string_lossy().into_owned();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::inherit())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    let stderr = child.stderr.take();
    let tail = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let lines = std::sync::Arc::clone(&tail);
    std::thread::spawn(move || {
        if let Some(s) = stderr {
            for line in BufReader::new(s).lines().map_while(Result::ok) {
                eprintln!("{line}");
                if let Ok(mut t) = lines.lock() {
                    t.push(line);
                    if t.len() > 40 {
                        t.remove(0);
                    }
                }
            }
        }
        let _ = done_tx.send(());
    });
    let code = wait_bounded(&mut child, timeout, Duration::from_millis(50), None)
        .map_err(|e| format!("waiting for {program}: {e}"))?
        .code;
    // A process the step left behind (an activation may start some) can hold the pipe open
    // for ever: its last lines are waited for a moment, not until it ends.
    let _ = done_rx.recv_timeout(Duration::from_secs(2));
    let tail = tail.lock().map(|t| t.clone()).unwrap_or_default();
    Ok((code, tail))
}

/// Nix's own words for why a realise failed, from its stderr.
fn realise_problem(tail: &[String]) -> Option<String> {
    let find = |needle: &str| {
        tail.iter()
            .find(|l| l.contains(needle))
            .map(|l| l.trim_start_matches("warning: ").trim().to_owned())
    };
    // Nix 2.8: "the substitute for '…' from '…' is not signed by any of the keys in …";
    // newer: "ignoring substitute for '…' from '…', as it's not signed by any of the keys in
    // …", and "… lacks a valid signature".
    if let Some(l) = find("not signed by any of the keys")
        .or_else(|| find("lacks a valid signature"))
        .or_else(|| find("lacks a signature"))
        .or_else(|| find("no signature"))
    {
        return Some(format!(
            "the signature check refused it: {l} (apply.closure.trusted_public_keys)"
        ));
    }
    if find("don't know how to build").is_some() || find("no substituter that can build").is_some()
    {
        return Some(
            "no substituter has it (apply.closure.substituters): was the closure pushed to the \
             cache?"
                .into(),
        );
    }
    tail.iter()
        .rev()
        .find(|l| l.starts_with("error:"))
        .map(|l| l.trim().to_owned())
}

/// The generation the profile points at (`system-5-link` → 5).
fn profile_generation(profile: &Path) -> Option<u64> {
    let target = std::fs::read_link(profile).ok()?;
    let name = target.file_name()?.to_str()?.to_owned();
    let base = profile.file_name()?.to_str()?;
    name.strip_prefix(&format!("{base}-"))?
        .strip_suffix("-link")?
        .parse()
        .ok()
}

/// `closureSize` from `nix path-info -S --json` (an array of objects in older Nix, an object
/// keyed by path in newer).
fn closure_size(json: &serde_json::Value, path: &str) -> Option<u64> {
    let entry = match json {
        serde_json::Value::Array(a) => a.iter().find(|e| e["path"] == path).or(a.first()),
        serde_json::Value::Object(o) => o.get(path),
        _ => None,
    }?;
    entry["closureSize"].as_u64()
}

/// Fetches, checks and activates the closure, step by step, filling in what `info` learns on
/// the way.
fn steps(a: &Args, info: &mut ClosureInfo) -> Result<(), Refused> {
    check_store_path(&a.path).map_err(|e| refused(e, true))?;
    realise(a, info)?;
    check_nixos_system(&a.path)?;
    info.closure_size = measure_closure(a);
    // `build` stops here (fetched, nothing activated); `test` and `dry-activate` activate
    // without making it the boot default, so the profile is left alone, as NixOS does.
    if a.goal == Goal::Build {
        return Ok(());
    }
    let sets_profile = matches!(a.goal, Goal::Switch | Goal::Boot);
    let before = profile_generation(&a.profile);
    if sets_profile {
        set_profile(a)?;
    }
    switch(a, sets_profile, before)
}

/// Step 1: realises the closure from the substituters, signatures required, rooted at the
/// gcroot. A signature refusal is permanent; anything else may pass on a retry.
fn realise(a: &Args, info: &mut ClosureInfo) -> Result<(), Refused> {
    if let Some(dir) = a.gcroot.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| refused(format!("cannot create {}: {e}", dir.display()), false))?;
    }
    println!(
        "ginx: realising {} from {}",
        a.path,
        a.substituters.join(" ")
    );
    let mut cmd = Command::new(&a.nix_store);
    cmd.arg("--realise")
        .arg(&a.path)
        .arg("--add-root")
        .arg(&a.gcroot)
        .arg("--indirect")
        .args(["--option", "substituters", &a.substituters.join(" ")])
        .args([
            "--option",
            "trusted-public-keys",
            &a.trusted_public_keys.join(" "),
        ])
        .args(["--option", "require-sigs", "true"]);
    let start = Instant::now();
    let (code, tail) = run_step(cmd, Some(a.realise_timeout)).map_err(|e| refused(e, false))?;
    info.realise_seconds = Some(start.elapsed().as_secs_f64());
    match code {
        Some(0) => Ok(()),
        None => Err(refused(
            format!(
                "nix-store --realise {} did not finish within apply.closure.realise_timeout",
                a.path
            ),
            false,
        )),
        Some(c) => {
            let why = realise_problem(&tail);
            let permanent = why.as_deref().is_some_and(|w| w.contains("signature"));
            Err(refused(
                format!(
                    "nix-store --realise {} failed (exit {c}): {}",
                    a.path,
                    why.unwrap_or_else(|| "see the output".into())
                ),
                permanent,
            ))
        }
    }
}

/// Step 2: the realised path is a NixOS system, one that can be switched to.
fn check_nixos_system(path: &str) -> Result<(), Refused> {
    let root = Path::new(path);
    for need in ["nixos-version", "bin/switch-to-configuration"] {
        if !root.join(need).exists() {
            return Err(refused(
                format!("{path} is not a NixOS system: it has no {need}"),
                true,
            ));
        }
    }
    Ok(())
}

/// Step 3: the closure's size, a figure for status; never a reason to fail.
fn measure_closure(a: &Args) -> Option<u64> {
    let mut cmd = Command::new(&a.nix);
    cmd.args([
        "--extra-experimental-features",
        "nix-command",
        "path-info",
        "-S",
        "--json",
    ])
    .arg(&a.path);
    let out = cmd.stdin(Stdio::null()).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let v = serde_json::from_slice::<serde_json::Value>(&out.stdout).ok()?;
    closure_size(&v, &a.path)
}

/// Step 4 (`switch` and `boot`): points the system profile at the closure.
fn set_profile(a: &Args) -> Result<(), Refused> {
    let mut cmd = Command::new(&a.nix_env);
    cmd.arg("--profile")
        .arg(&a.profile)
        .arg("--set")
        .arg(&a.path);
    match run_step(cmd, None).map_err(|e| refused(e, false))?.0 {
        Some(0) => Ok(()),
        c => Err(refused(
            format!(
                "nix-env --profile {} --set {} failed ({})",
                a.profile.display(),
                a.path,
                c.map_or_else(|| "killed".to_owned(), |c| format!("exit {c}"))
            ),
            false,
        )),
    }
}

/// Step 5: activates the closure for the goal. On failure the profile goes back to generation
/// `before` (when this attempt moved it) before the attempt ends.
fn switch(a: &Args, sets_profile: bool, before: Option<u64>) -> Result<(), Refused> {
    let stc = Path::new(&a.path).join("bin/switch-to-configuration");
    let mut cmd = Command::new(&stc);
    cmd.arg(a.goal.as_str());
    let failed = match run_step(cmd, None) {
        Ok((Some(0), _)) => return Ok(()),
        Ok((code, _)) => format!(
            "{} {} failed ({})",
            stc.display(),
            a.goal.as_str(),
            code.map_or_else(|| "killed".to_owned(), |c| format!("exit {c}"))
        ),
        Err(e) => e,
    };
    let back = match before {
        _ if !sets_profile => "the profile was not changed".to_owned(),
        Some(n) => restore_profile(&a.nix_env, &a.profile, n),
        None => "the profile had no generation before".to_owned(),
    };
    Err(refused(format!("{failed}; {back}"), false))
}

/// Puts the profile back at generation `before` after a failed switch, the way `nixos-rebuild
/// --rollback` would: the profile pointed at it, the failed generation deleted (so neither
/// the boot menu nor a later `--rollback` lands on it), and the old system's boot loader entry
/// made the default again (`bin/switch-to-configuration boot`). Says what it did.
pub fn restore_profile(nix_env: &Path, profile: &Path, before: u64) -> String {
    let Some(now) = profile_generation(profile) else {
        return format!(
            "the profile {} has no generation to go back from",
            profile.display()
        );
    };
    if now == before {
        return format!("the profile is at generation {before}, as before");
    }
    let nix_env_ok = |args: &[&str]| {
        let mut cmd = Command::new(nix_env);
        cmd.arg("--profile").arg(profile).args(args);
        matches!(run_step(cmd, None), Ok((Some(0), _)))
    };
    if !nix_env_ok(&["--switch-generation", &before.to_string()]) {
        return format!(
            "the profile could NOT be pointed back at generation {before}: run `nix-env --profile \
             {} --switch-generation {before}`",
            profile.display()
        );
    }
    let mut said = format!("the profile points back at generation {before}");
    if now > before && nix_env_ok(&["--delete-generations", &now.to_string()]) {
        said.push_str(&format!(" (generation {now} deleted)"));
    }
    // The system the profile points at again (its store path, for the log).
    let system = std::fs::canonicalize(profile).unwrap_or_else(|_| profile.to_owned());
    let stc = system.join("bin/switch-to-configuration");
    if stc.exists() {
        let mut cmd = Command::new(&stc);
        cmd.arg("boot");
        match run_step(cmd, None) {
            Ok((Some(0), _)) => said.push_str(", and it boots by default again"),
            _ => said.push_str(&format!(
                ", but its boot loader entry could not be restored: run `{} boot`",
                stc.display()
            )),
        }
    }
    said
}

/// `ginx apply-closure`: the steps, the report, exit 0 or 1.
pub fn run(a: Args) -> ExitCode {
    let mut info = ClosureInfo {
        path: a.path.clone(),
        origin: a.origin.clone(),
        closure_size: None,
        realise_seconds: None,
        error: None,
        permanent: false,
    };
    let result = steps(&a, &mut info);
    if let Err(r) = &result {
        eprintln!("ginx: {}", r.message);
        info.error = Some(r.message.clone());
        info.permanent = r.permanent;
    }
    if let Ok(bytes) = serde_json::to_vec(&info)
        && let Err(e) = crate::state::write_atomic(&a.report, &bytes)
    {
        eprintln!("ginx: cannot write {}: {e}", a.report.display());
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(_) => ExitCode::from(1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nix_says_why_a_realise_failed() {
        let tail = [
            "this path will be fetched (0.00 MiB download, 0.00 MiB unpacked):".to_owned(),
            "warning: the substitute for '/nix/store/x-y' from 'file:///c' is not signed by any of the keys in 'trusted-public-keys'".to_owned(),
            "error: build of '/nix/store/x-y' failed".to_owned(),
        ];
        let why = realise_problem(&tail).unwrap();
        assert!(
            why.starts_with("the signature check refused it: the substitute for"),
            "{why}"
        );
        // Newer Nix's wordings.
        for line in [
            "warning: ignoring substitute for '/nix/store/x-y' from 'https://c', as it's not signed by any of the keys in 'trusted-public-keys'",
            "error: cannot add path '/nix/store/x-y' because it lacks a valid signature",
        ] {
            let why = realise_problem(&[line.to_owned()]).unwrap();
            assert!(why.starts_with("the signature check refused it"), "{why}");
        }
        let tail = [
            "don't know how to build these paths:".to_owned(),
            "error: build of '/nix/store/x-y' failed".to_owned(),
        ];
        assert!(
            realise_problem(&tail)
                .unwrap()
                .contains("no substituter has it")
        );
        assert_eq!(
            realise_problem(&["error: something else".to_owned()]).as_deref(),
            Some("error: something else")
        );
    }

    #[test]
    fn the_closure_size_is_read_from_either_json_shape() {
        let old = serde_json::json!([{"path": "/nix/store/a-b", "closureSize": 752}]);
        let new = serde_json::json!({"/nix/store/a-b": {"closureSize": 900}});
        assert_eq!(closure_size(&old, "/nix/store/a-b"), Some(752));
        assert_eq!(closure_size(&new, "/nix/store/a-b"), Some(900));
        assert_eq!(closure_size(&serde_json::json!(null), "x"), None);
    }

    #[test]
    fn the_profile_generation_is_read_from_its_link() {
        let dir = tempfile::tempdir().unwrap();
        let profile = dir.path().join("system");
        assert_eq!(profile_generation(&profile), None);
        std::os::unix::fs::symlink("system-7-link", &profile).unwrap();
        assert_eq!(profile_generation(&profile), Some(7));
    }
}
