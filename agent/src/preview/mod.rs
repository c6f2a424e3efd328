//! A plan asked for before a merge: fetch a ref that is not deployed, build it as a prebuild
//! builds, compute its plan, and activate nothing. `ginx plan --revision REF` does it on one
//! node; the daemon does it for each request an operator writes with `ginxctl plan REF`
//! ([`answering`]).
//!
//! Owns: the preview's clone, tree and attempt folder under `<state_dir>/previews/`, and the
//! answer. Runs the build through the attempt runner (`ginx run-attempt`, as a child process
//! with `apply.timeout` and the plan's own `disruption.timeout`), never through the
//! reconciler: no slot is asked for, no state or history is written, and the system profile
//! is never touched. Must not: activate, or move the source's own clone.
//!
//! Layer 6, beside the reconciler: it uses the source's Git code, the apply step and the
//! Kubernetes layer, and nothing uses it but the daemon and the CLI.

pub mod answering;
pub mod estimate;
pub mod store;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::apply::isolation::{self, Isolation, Launch};
use crate::apply::plan::{Policy as DisruptionPolicy, compute, judged};
use crate::apply::process::Exit;
use crate::config::Config;
use crate::source::preview::{RefError, RefFetch, fetch_ref};
use crate::source::{Trees, auth, git, verify};
use crate::state::{Durations, History, State};
use crate::types::{Goal, Plan, PreviewAnswer, PreviewOutcome, Revision};
use crate::util;

/// Why a preview ended without a plan.
struct Stopped {
    outcome: PreviewOutcome,
    why: String,
    revision: Option<Revision>,
    built_in: Option<Duration>,
}

impl Stopped {
    fn failed(why: impl Into<String>) -> Self {
        Stopped {
            outcome: PreviewOutcome::Failed,
            why: why.into(),
            revision: None,
            built_in: None,
        }
    }
}

/// The preview's folder: `<state_dir>/previews`.
pub fn root(cfg: &Config) -> PathBuf {
    cfg.state_dir.join("previews")
}

/// Plans `reference` of the apply source on this node, for the request `id`; never fails:
/// what stopped it is the answer's outcome and error.
pub async fn plan_ref(cfg: &Arc<Config>, id: &str, reference: &str) -> PreviewAnswer {
    let started = Instant::now();
    let base = PreviewAnswer::new(id, reference, util::now());
    let mut answer = match run(cfg, id, reference).await {
        Ok((revision, plan, built_in)) => {
            let mut a = PreviewAnswer::planned(base, &revision, &plan);
            let (attempts, took) = recorded(cfg);
            let e = estimate::estimate(
                &attempts,
                &took,
                plan.action,
                cfg.rollout.gate.settle.get(),
                Some(built_in),
            );
            a.estimate_secs = e.secs;
            a.estimate_of = e.of;
            a.estimate_lower = e.lower;
            a
        }
        Err(s) => {
            let mut a = PreviewAnswer::failed(base, s.outcome, &s.why);
            a.revision = s.revision;
            a.estimate_of = s
                .built_in
                .map(|d| format!("the build failed after {} s", d.as_secs()))
                .unwrap_or_default();
            a
        }
    };
    answer.took_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    answer.at = util::now();
    answer
}

/// The attempts this node's history recorded and the durations its state kept, each read
/// without touching the file (the daemon owns them); none when it cannot be read.
fn recorded(cfg: &Config) -> (Vec<crate::state::Attempt>, Durations) {
    let history: Option<History> = crate::state::peek(&cfg.state_dir.join("history.json"));
    let state: Option<State> = crate::state::peek(&cfg.state_dir.join("state.json"));
    (
        history.map(|h| h.attempts).unwrap_or_default(),
        state.map(|s| s.took).unwrap_or_default(),
    )
}

/// Fetch, check out, build and plan, one preview of the source at a time on this node.
async fn run(
    cfg: &Arc<Config>,
    id: &str,
    reference: &str,
) -> Result<(Revision, Plan, Duration), Stopped> {
    crate::types::preview::check_reference(reference).map_err(Stopped::failed)?;
    let source = cfg.apply.source.clone();
    let root = root(cfg);
    std::fs::create_dir_all(&root)
        .map_err(|e| Stopped::failed(format!("cannot create {}: {e}", root.display())))?;
    let _lock = lock(&root.join(format!("{source}.lock"))).await?;
    let revision = fetch(cfg, &root, reference).await?;
    let tree = {
        let trees = Trees::new(root.join("trees").join(&source));
        let clone = git::Clone::new(root.join("sources").join(&source));
        let rev = revision.clone();
        tokio::task::spawn_blocking(move || trees.checkout(&clone, &rev))
            .await
            .map_err(|e| Stopped::failed(e.to_string()))?
            .map_err(|e| Stopped::failed(format!("cannot check out {}: {e}", revision.short())))?
    };
    let dir = root
        .join("attempts")
        .join(format!("{id}-{}", revision.short()));
    let _ = std::fs::remove_dir_all(&dir);
    let built = build(cfg, tree.path(), &revision, &dir).await;
    let _ = std::fs::remove_dir_all(&dir);
    let (plan, built_in) = built.map_err(|mut s| {
        s.revision = Some(revision.clone());
        s
    })?;
    Ok((revision, plan, built_in))
}

/// Holds the preview lock of the source (one preview at a time, whichever process runs it).
async fn lock(path: &Path) -> Result<std::fs::File, Stopped> {
    let path = path.to_owned();
    tokio::task::spawn_blocking(move || {
        let f = std::fs::File::create(&path)
            .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
        f.lock()
            .map_err(|e| format!("cannot lock {}: {e}", path.display()))?;
        Ok::<_, String>(f)
    })
    .await
    .map_err(|e| Stopped::failed(e.to_string()))?
    .map_err(Stopped::failed)
}

/// Fetches the source's branches and tags into the preview clone and finds `reference`,
/// within the source's `fetch_timeout`.
async fn fetch(cfg: &Config, root: &Path, reference: &str) -> Result<Revision, Stopped> {
    let name = cfg.apply.source.clone();
    let scfg = cfg.sources.get(&name).cloned().ok_or_else(|| {
        Stopped::failed(format!(
            "apply.source names {name:?}, which is not a source"
        ))
    })?;
    let auth = auth::Auth::load(&scfg).map_err(|e| Stopped::failed(e.to_string()))?;
    let policy = verify::Policy {
        allowed_signers: scfg.allowed_signers_file.clone(),
        openpgp_keyring: scfg.openpgp_keyring_file.clone(),
    };
    let cancel = Arc::new(AtomicBool::new(false));
    let dir = root.join("sources").join(&name);
    let (reference, flag) = (reference.to_owned(), Arc::clone(&cancel));
    let task = tokio::task::spawn_blocking(move || {
        let remotes = scfg.remotes();
        let spec = RefFetch {
            source: &name,
            remotes: &remotes,
            auth: &auth,
            cancel: &flag,
            reference: &reference,
        };
        fetch_ref(&dir, &spec, &policy)
    });
    let timeout = cfg
        .sources
        .get(&cfg.apply.source)
        .map_or(Duration::from_secs(60), |s| s.fetch_timeout.get());
    let fetched = match tokio::time::timeout(timeout, task).await {
        Ok(joined) => joined.map_err(|e| Stopped::failed(e.to_string()))?,
        Err(_) => {
            cancel.store(true, Ordering::Relaxed);
            return Err(Stopped::failed(format!(
                "the fetch did not finish within {} s (fetch_timeout)",
                timeout.as_secs()
            )));
        }
    };
    fetched.map_err(|e| match e {
        RefError::Refused(why) => Stopped {
            outcome: PreviewOutcome::Refused,
            ..Stopped::failed(why)
        },
        RefError::NotFound(why) => Stopped {
            outcome: PreviewOutcome::Refused,
            ..Stopped::failed(why)
        },
        RefError::Git(e) => Stopped::failed(e.to_string()),
    })
}

/// Builds `revision` (checked out at `tree`) as `apply.prebuild` does, in the attempt folder
/// `dir`, and returns its plan judged by `[disruption]` and how long the build took.
async fn build(
    cfg: &Arc<Config>,
    tree: &Path,
    revision: &Revision,
    dir: &Path,
) -> Result<(Plan, Duration), Stopped> {
    let step = crate::apply::step::prepare(cfg, tree, revision, Goal::Build, dir)
        .await
        .map_err(Stopped::failed)?;
    let launch = Launch {
        plan: Some(step.plan_spec(cfg)),
        dir: dir.to_owned(),
        unit: format!("ginx-preview-{}", revision.short()),
        cwd: step.cwd,
        argv: step.argv,
        env: vec![
            ("GINX_NODE".into(), cfg.node_name().to_owned()),
            ("GINX_SOURCE".into(), cfg.apply.source.clone()),
            ("GINX_REVISION".into(), revision.to_string()),
            ("GINX_GOAL".into(), Goal::Build.as_str().into()),
            ("GINX_PREVIEW".into(), "1".into()),
        ],
        timeout: cfg.apply.timeout.get(),
        kill_grace: cfg.apply.kill_grace.get(),
        description: format!("ginx: preview {} {revision}", cfg.apply.source),
        token: crate::apply::runner::new_token(),
    };
    let started = Instant::now();
    let handle = isolation::launch(&Isolation::Process, &launch)
        .await
        .map_err(Stopped::failed)?;
    let finished = handle.wait(std::future::pending(), |_| {}).await;
    let built_in = started.elapsed();
    if !finished.success() {
        let last = finished
            .output
            .iter()
            .rev()
            .find(|l| !l.line.trim().is_empty())
            .map(|l| format!(": {}", l.line.chars().take(300).collect::<String>()))
            .unwrap_or_default();
        let how = match &finished.exit {
            Exit::Code(c) => format!("the build exited with {c}{last}"),
            Exit::TimedOut => format!(
                "the build did not finish within {} s (apply.timeout){last}",
                cfg.apply.timeout.get().as_secs()
            ),
            other => format!("the build ended: {other:?}{last}"),
        };
        return Err(Stopped {
            outcome: PreviewOutcome::BuildFailed,
            why: how,
            revision: None,
            built_in: Some(built_in),
        });
    }
    let plan = compute::read(dir).unwrap_or_else(|| Plan {
        unknown: Some("the runner wrote no plan".into()),
        ..Plan::default()
    });
    let built_in = built_in.saturating_sub(Duration::from_millis(plan.took_ms));
    Ok((
        judged(plan, &DisruptionPolicy::new(&cfg.disruption)),
        built_in,
    ))
}
