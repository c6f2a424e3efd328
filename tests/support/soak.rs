//! The soak: the real `ginx` daemon against a real control plane for a long time,
//! with faults, and the checks that must hold at the end.
//!
//! Throughout the run:
//! - a commit to Hephaestus every 10 s (the source polls every 2 s; the stand-in colmena takes
//!   a second per apply, so a kill sometimes lands in one);
//! - the API server killed and started again every 3 min;
//! - ginx SIGKILLed at a random moment of every 5 min, and started again;
//! - a SIGHUP (reload) every minute.
//!
//! At the end:
//! - every JSON file ginx keeps in its state dir parses, checked after every kill too;
//! - no revision is applied again after an attempt of it succeeded;
//! - no attempt is lost: the stand-in colmena's calls and the history (read every 30 s and
//!   after every kill, so that its 50-entry bound loses nothing) name the same revisions, the
//!   same number of times, and no attempt id is used twice;
//! - RSS and open file descriptors are sampled every 30 s; their slope within each process's
//!   life once it has settled (the median of the slopes between its samples, from its third
//!   minute on: [`SETTLED_AGE`]) is printed, and judged only when the run is long enough
//!   ([`Plan::judge_slopes`]); the rise before that, and the slope over the whole run, are
//!   printed beside it;
//! - the heartbeat is back within one renewal (its interval plus its 10 % jitter, and 2 s for
//!   the request) of the API server answering again, every time.
//!
//! Used by `bench/soak.sh` (`cargo bench --bench soak`, an hour by default, `SOAK_MINUTES`)
//! and by the integration test `soak::` (5 minutes, in CI).

use std::collections::{BTreeMap, HashMap};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use nix::sys::signal::Signal;
use serde_json::Value;

use super::control_plane::ControlPlane;
use super::kubelet::{Kubelet, runtime};
use super::{Env, daemon::Daemon};

pub struct Plan {
    pub length: Duration,
    pub commit_every: Duration,
    pub hup_every: Duration,
    pub api_restart_every: Duration,
    pub kill_every: Duration,
    pub sample_every: Duration,
    /// ginx's heartbeat interval (its default).
    pub renew_interval: Duration,
}

impl Plan {
    /// The schedule, `minutes` long.
    pub fn minutes(minutes: f64) -> Self {
        Self {
            length: Duration::from_secs_f64(minutes * 60.0),
            commit_every: Duration::from_secs(10),
            hup_every: Duration::from_secs(60),
            api_restart_every: Duration::from_secs(180),
            kill_every: Duration::from_secs(300),
            sample_every: Duration::from_secs(30),
            renew_interval: Duration::from_secs(10),
        }
    }

    /// `SOAK_MINUTES` from the environment, else `default`.
    pub fn from_env(default: f64) -> Self {
        let minutes = match std::env::var("SOAK_MINUTES") {
            Ok(v) => v
                .parse::<f64>()
                .ok()
                .filter(|m| *m > 0.0)
                .unwrap_or_else(|| panic!("SOAK_MINUTES={v:?} is not a positive number")),
            Err(_) => default,
        };
        Self::minutes(minutes)
    }

    /// Slopes are judged against their targets only over half an hour or more: in a shorter
    /// run, the allocator's warm-up and a fetch in flight outweigh a leak.
    pub fn judge_slopes(&self) -> bool {
        self.length >= Duration::from_secs(30 * 60)
    }

    /// The longest the heartbeat may take to come back after the API answers again.
    pub fn heartbeat_bound(&self) -> Duration {
        self.renew_interval.mul_f64(1.1) + Duration::from_secs(2)
    }
}

#[derive(Default)]
pub struct Report {
    pub minutes: f64,
    pub commits: usize,
    pub hups: usize,
    pub kills: usize,
    pub kills_during_apply: usize,
    pub api_restarts: usize,
    /// Attempts in the history, and those that succeeded.
    pub attempts: usize,
    pub applies: usize,
    pub interrupted: usize,
    pub calls: usize,
    /// Seconds from the API answering again to the next renewal, per restart.
    pub heartbeat_back: Vec<f64>,
    pub samples: usize,
    /// The slope of RSS within settled lives (see [`median_slope`]), judged against 1 MiB/h.
    pub rss_slope_mib_per_hour: f64,
    /// The same slope of RSS's two parts: anonymous memory (the heap, stacks) and file pages
    /// (the binary's and libraries' code as it is first run, mapped pack files).
    pub rss_anon_slope_mib_per_hour: f64,
    pub rss_file_slope_mib_per_hour: f64,
    /// The slope of RSS over the whole run, one line through every sample whatever its
    /// life: what a restart carries over (state that grows with the run), not warm-up.
    pub rss_run_slope_mib_per_hour: f64,
    pub fd_slope_per_hour: f64,
    /// Samples of settled lives, those the slopes above are judged on.
    pub settled_samples: usize,
    /// The least-squares slope of RSS within lives from their first minute on: the rise of a
    /// new process included, for comparison.
    pub rss_least_squares_mib_per_hour: f64,
    /// The mean rise of RSS over a life's first minutes, and over how many lives.
    pub warm_up_kib: f64,
    pub warm_up_lives: usize,
    pub rss_max_kib: u64,
    pub fds_max: u64,
    pub state_files_checked: usize,
    pub judged_slopes: bool,
    pub problems: Vec<String>,
}

impl Report {
    pub fn print(&self) {
        let back = &self.heartbeat_back;
        let max_back = back.iter().copied().fold(0.0, f64::max);
        let mean_back = if back.is_empty() {
            0.0
        } else {
            back.iter().sum::<f64>() / back.len() as f64
        };
        println!(
            "soak: {:.1} min against the real control plane",
            self.minutes
        );
        println!("  commits                    {}", self.commits);
        println!(
            "  applies                    {} succeeded of {} attempts ({} interrupted), {} calls of the stand-in colmena",
            self.applies, self.attempts, self.interrupted, self.calls
        );
        println!("  SIGHUPs                    {}", self.hups);
        println!(
            "  SIGKILLs survived          {} ({} during an apply)",
            self.kills, self.kills_during_apply
        );
        println!(
            "  API server restarts        {} (heartbeat back after {mean_back:.1} s on average, {max_back:.1} s at most)",
            self.api_restarts
        );
        println!(
            "  RSS slope                  {:+.3} MiB/h (max {:.1} MiB){}",
            self.rss_slope_mib_per_hour,
            self.rss_max_kib as f64 / 1024.0,
            self.verdict(self.rss_slope_mib_per_hour < 1.0)
        );
        println!(
            "    within settled lives     median of pair slopes, from {:.0} min of age on, {} samples",
            SETTLED_AGE / 60.0,
            self.settled_samples
        );
        println!(
            "    of which anonymous       {:+.3} MiB/h, file pages {:+.3} MiB/h",
            self.rss_anon_slope_mib_per_hour, self.rss_file_slope_mib_per_hour
        );
        println!(
            "  RSS rise of a new process  {:+.0} KiB over its first {:.0} min (mean of {} lives)",
            self.warm_up_kib,
            SETTLED_AGE / 60.0,
            self.warm_up_lives
        );
        println!(
            "  RSS least squares          {:+.3} MiB/h (within lives from 1 min of age, that rise included)",
            self.rss_least_squares_mib_per_hour
        );
        println!(
            "  RSS slope over the run     {:+.3} MiB/h (every sample, across restarts)",
            self.rss_run_slope_mib_per_hour
        );
        println!(
            "  open fds slope             {:+.2} /h (max {}){}",
            self.fd_slope_per_hour,
            self.fds_max,
            self.verdict(self.fd_slope_per_hour < 0.5)
        );
        println!(
            "  samples                    {} (every 30 s); state files checked {}",
            self.samples, self.state_files_checked
        );
        if self.problems.is_empty() {
            println!("  problems                   none");
        } else {
            println!("  problems                   {}", self.problems.len());
            for p in &self.problems {
                println!("    - {p}");
            }
        }
    }

    fn verdict(&self, met: bool) -> &'static str {
        match (self.judged_slopes, met) {
            (false, _) => " (run too short to judge)",
            (true, true) => " (target met)",
            (true, false) => " (TARGET MISSED)",
        }
    }
}

/// One sample of the running ginx.
struct Sample {
    /// Which ginx process (0 for the first, one more after every kill).
    life: usize,
    /// Seconds since that process started.
    age: f64,
    /// Seconds since the run began.
    at: f64,
    rss_kib: u64,
    rss_anon_kib: u64,
    rss_file_kib: u64,
    fds: u64,
}

impl Sample {
    /// One line of the run's log, so that a slope can be traced to the lives behind it.
    fn log(&self) {
        println!(
            "soak: sample life {} age {:.0} s: RSS {} KiB (anonymous {}, file {}), {} fds",
            self.life, self.age, self.rss_kib, self.rss_anon_kib, self.rss_file_kib, self.fds
        );
    }
}

/// Kept from every history read: attempts by id.
#[derive(Clone, Debug, PartialEq)]
struct Seen {
    revision: String,
    kind: String,
    outcome: String,
    started_at: String,
    finished_at: String,
}

const NODE: &str = "soak";

/// Runs the soak against `cp` (a control plane of the caller's own: its API server is
/// restarted) and reports what it saw.
pub fn run(cp: &ControlPlane, plan: &Plan) -> Report {
    let began = Instant::now();
    let mut report = Report {
        minutes: plan.length.as_secs_f64() / 60.0,
        judged_slopes: plan.judge_slopes(),
        ..Report::default()
    };
    let _kubelet = Kubelet::start(cp, NODE, "control-plane");
    let env = Env::new();
    let kubeconfig = env.root.join("kubeconfig");
    cp.ginx_kubeconfig(&kubeconfig, NODE);
    env.dropin(
        "50-soak.toml",
        &format!(
            "[node]\nname = \"{NODE}\"\n\
             [sources.hephaestus]\ninterval = \"2s\"\n\
             [kubernetes]\nkubeconfig = \"{}\"\nrenew_interval = \"{}s\"\n\
             [health]\ninterval = \"1s\"\n\
             [health.kubelet]\nenabled = false\n[health.apiserver]\nenabled = false\n\
             [health.cilium]\nenabled = false\n[health.systemd]\nenabled = false\n",
            kubeconfig.display(),
            plan.renew_interval.as_secs()
        ),
    );
    env.stub("sleep", "1");

    let renewals = Arc::new(Mutex::new(Vec::<jiff::Timestamp>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = watch_lease(cp, renewals.clone(), stop.clone());

    let mut seen: BTreeMap<u64, Seen> = BTreeMap::new();
    let mut samples: Vec<Sample> = Vec::new();
    let mut restarted_at: Vec<jiff::Timestamp> = Vec::new();
    let mut life = 0;
    let mut born = Instant::now();
    let mut d = Some(env.start());

    let mut next_commit = Instant::now();
    let mut next_hup = began + plan.hup_every;
    let mut next_api = began + plan.api_restart_every;
    // The kill moments are random; the seed is printed so that a run can be repeated
    // (`SOAK_SEED`).
    let seed = std::env::var("SOAK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| fastrand::u64(..));
    println!("soak: seed {seed} (SOAK_SEED)");
    let mut rng = fastrand::Rng::with_seed(seed);
    // Somewhere in the middle 80 % of each window, so that the last one falls inside the run.
    let mut kill_at = |window: u32| {
        let window_len = plan.kill_every.min(plan.length);
        began + plan.kill_every * window + window_len.mul_f64(0.1 + 0.8 * rng.f64())
    };
    let mut kill_window = 0u32;
    let mut next_kill = kill_at(0);
    let mut next_sample = Instant::now();
    while began.elapsed() < plan.length {
        let now = Instant::now();
        // A ginx that ends on its own (a panic on a reload, on the API going away) is the
        // worst finding: say so, and go on with a new one.
        if let Some(status) = d.as_mut().unwrap().exited() {
            report.problems.push(format!(
                "ginx exited on its own ({status}); log: {}",
                d.as_ref().unwrap().log.display()
            ));
            d = Some(env.start());
            life += 1;
            born = Instant::now();
        }
        if now >= next_commit {
            report.commits += 1;
            env.repo.commit(
                &format!("soak/{}.nix", report.commits % 20),
                &format!("{{ n = {}; }}\n", report.commits),
                &format!("soak commit {}", report.commits),
            );
            next_commit = now + plan.commit_every;
        }
        if now >= next_hup {
            d.as_ref().unwrap().signal(Signal::SIGHUP);
            report.hups += 1;
            next_hup += plan.hup_every;
        }
        if now >= next_api {
            cp.kill_apiserver();
            cp.restart_apiserver();
            restarted_at.push(jiff::Timestamp::now());
            report.api_restarts += 1;
            next_api += plan.api_restart_every;
        }
        if now >= next_kill {
            let mut daemon = d.take().unwrap();
            if has_children(daemon.pid) {
                report.kills_during_apply += 1;
            }
            daemon.signal(Signal::SIGKILL);
            let status = daemon.wait_exit();
            if status.signal() != Some(Signal::SIGKILL as i32) {
                report
                    .problems
                    .push(format!("ginx had ended before the SIGKILL: {status}"));
            }
            drop(daemon);
            report.kills += 1;
            report.state_files_checked += check_state_files(&env.state_dir, &mut report);
            read_history(&env.state_dir, &mut seen, &mut report);
            d = Some(env.start());
            life += 1;
            born = Instant::now();
            kill_window += 1;
            next_kill = kill_at(kill_window);
        }
        if now >= next_sample {
            if let Some(s) = sample(d.as_ref().unwrap(), life, born, began) {
                s.log();
                samples.push(s);
            }
            read_history(&env.state_dir, &mut seen, &mut report);
            next_sample += plan.sample_every;
        }
        std::thread::sleep(Duration::from_millis(100));
    }

    // The last commit is applied, then ginx stops cleanly.
    let daemon = d.take().unwrap();
    let head = env.repo.head();
    daemon.wait_applied(&head);
    if let Some(s) = sample(&daemon, life, born, began) {
        s.log();
        samples.push(s);
    }
    let status = daemon.stop();
    if !status.success() {
        report
            .problems
            .push(format!("ginx exited with {status} on SIGTERM"));
    }
    stop.store(true, Ordering::Relaxed);
    let _ = watcher.join();
    report.state_files_checked += check_state_files(&env.state_dir, &mut report);
    read_history(&env.state_dir, &mut seen, &mut report);

    check_attempts(&env, &seen, &mut report);
    check_heartbeat(plan, &restarted_at, &renewals.lock().unwrap(), &mut report);
    slopes(&samples, &mut report);
    if report.judged_slopes {
        if report.rss_slope_mib_per_hour >= 1.0 {
            report.problems.push(format!(
                "RSS grows {:.2} MiB an hour (target under 1)",
                report.rss_slope_mib_per_hour
            ));
        }
        if report.fd_slope_per_hour >= 0.5 {
            report.problems.push(format!(
                "open fds grow {:.2} an hour (target 0)",
                report.fd_slope_per_hour
            ));
        }
    }
    report.samples = samples.len();
    report
}

/// Polls the heartbeat Lease four times a second, recording every new `renewTime`.
fn watch_lease(
    cp: &ControlPlane,
    renewals: Arc<Mutex<Vec<jiff::Timestamp>>>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<()> {
    let api: kube::Api<Lease> = kube::Api::namespaced(cp.admin(), "ginx-system");
    let name = format!("ginx-{NODE}");
    std::thread::spawn(move || {
        let mut last = None;
        while !stop.load(Ordering::Relaxed) {
            let got = runtime().block_on(async {
                tokio::time::timeout(Duration::from_secs(2), api.get_opt(&name)).await
            });
            if let Ok(Ok(Some(lease))) = got {
                let renew = lease.spec.and_then(|s| s.renew_time).map(|t| t.0);
                if let Some(t) = renew.filter(|t| Some(*t) != last) {
                    last = Some(t);
                    renewals.lock().unwrap().push(t);
                }
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    })
}

/// Whether `pid` has child processes (an apply in flight: its pipes are open fds of ginx).
fn has_children(pid: i32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().any(|t| {
        std::fs::read_to_string(t.path().join("children")).is_ok_and(|c| !c.trim().is_empty())
    })
}

/// RSS and open fds of ginx, when no apply is in flight (its pipes and the runner would count
/// as noise in the slopes).
fn sample(d: &Daemon, life: usize, born: Instant, began: Instant) -> Option<Sample> {
    if has_children(d.pid) {
        return None;
    }
    let status = std::fs::read_to_string(format!("/proc/{}/status", d.pid)).ok()?;
    let kib = |field: &str| -> Option<u64> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))?
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()
    };
    let fds = std::fs::read_dir(format!("/proc/{}/fd", d.pid))
        .ok()?
        .count() as u64;
    Some(Sample {
        life,
        age: born.elapsed().as_secs_f64(),
        at: began.elapsed().as_secs_f64(),
        rss_kib: kib("VmRSS")?,
        rss_anon_kib: kib("RssAnon")?,
        rss_file_kib: kib("RssFile")?,
        fds,
    })
}

/// Every JSON file in the state dir (and its attempt directories) parses; returns how many
/// were read.
fn check_state_files(dir: &Path, report: &mut Report) -> usize {
    let mut checked = 0;
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            let Ok(kind) = e.file_type() else { continue };
            let name = e.file_name().to_string_lossy().into_owned();
            if kind.is_dir() {
                // Clones and checked-out trees hold the repository's files, not ginx's.
                if !matches!(name.as_str(), "sources" | "trees" | "clones" | "gcroots")
                    && !name.ends_with(".git")
                {
                    stack.push(p);
                }
            } else if name.contains(".corrupt") {
                // What ginx moves aside when it cannot read a file it wrote.
                report
                    .problems
                    .push(format!("{} was set aside as unreadable", p.display()));
            } else if name.ends_with(".json") {
                checked += 1;
                let text = std::fs::read(&p).unwrap_or_default();
                if let Err(e) = serde_json::from_slice::<Value>(&text) {
                    report.problems.push(format!(
                        "{} does not parse: {e} ({} bytes)",
                        p.display(),
                        text.len()
                    ));
                }
            }
        }
    }
    if !dir.join("state.json").is_file() {
        report
            .problems
            .push(format!("{} is missing", dir.join("state.json").display()));
    }
    checked
}

/// Reads the history file and adds its attempts to `seen`; an id seen before with other
/// content is an attempt overwritten, which is a problem.
fn read_history(dir: &Path, seen: &mut BTreeMap<u64, Seen>, report: &mut Report) {
    let path = dir.join("history.json");
    let Ok(text) = std::fs::read(&path) else {
        return;
    };
    let Ok(h) = serde_json::from_slice::<Value>(&text) else {
        // Reported by check_state_files when it stays so.
        return;
    };
    let s = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    for a in h["attempts"].as_array().into_iter().flatten() {
        let Some(id) = a["id"].as_u64() else { continue };
        let entry = Seen {
            revision: s(&a["revision"]),
            kind: a["kind"].as_str().unwrap_or("apply").to_owned(),
            outcome: s(&a["outcome"]),
            started_at: s(&a["started_at"]),
            finished_at: s(&a["finished_at"]),
        };
        match seen.get(&id) {
            Some(old) if *old != entry => report.problems.push(format!(
                "attempt {id} changed in the history: {old:?} became {entry:?}"
            )),
            Some(_) => {}
            None => {
                seen.insert(id, entry);
            }
        }
    }
}

fn check_attempts(env: &Env, seen: &BTreeMap<u64, Seen>, report: &mut Report) {
    let applies: Vec<(&u64, &Seen)> = seen.iter().filter(|(_, a)| a.kind == "apply").collect();
    report.attempts = applies.len();
    report.applies = applies
        .iter()
        .filter(|(_, a)| a.outcome == "succeeded")
        .count();
    report.interrupted = applies
        .iter()
        .filter(|(_, a)| a.outcome == "interrupted")
        .count();
    if seen.is_empty() {
        report.problems.push("the history is empty".into());
    }
    // Ids are consecutive: a gap is an attempt that was recorded and then lost.
    if let (Some(first), Some(last)) = (seen.keys().next(), seen.keys().last()) {
        let expected = (last - first + 1) as usize;
        if expected != seen.len() {
            let missing: Vec<u64> = (*first..=*last).filter(|i| !seen.contains_key(i)).collect();
            report
                .problems
                .push(format!("attempt ids missing from the history: {missing:?}"));
        }
    }
    // A revision is not applied again once an attempt of it succeeded.
    for (id, a) in &applies {
        if a.outcome != "succeeded" {
            continue;
        }
        for (later, b) in &applies {
            // Ids grow with time: a later attempt of the same revision.
            if b.revision == a.revision && later > id {
                report.problems.push(format!(
                    "{} applied again (attempt {later}) after attempt {id} succeeded",
                    a.revision
                ));
            }
        }
    }
    // The stand-in's calls and the history agree, revision by revision.
    let calls = env.calls();
    report.calls = calls.len();
    let mut by_call: HashMap<String, i64> = HashMap::new();
    for c in &calls {
        let rev = c.env.get("GINX_REVISION").cloned().unwrap_or_default();
        *by_call.entry(rev).or_default() += 1;
    }
    let mut by_attempt: HashMap<String, i64> = HashMap::new();
    let mut interrupted: HashMap<String, i64> = HashMap::new();
    for (_, a) in &applies {
        *by_attempt.entry(a.revision.clone()).or_default() += 1;
        if a.outcome == "interrupted" {
            *interrupted.entry(a.revision.clone()).or_default() += 1;
        }
    }
    let mut revisions: Vec<&String> = by_call.keys().chain(by_attempt.keys()).collect();
    revisions.sort();
    revisions.dedup();
    for rev in revisions {
        let (c, a) = (
            by_call.get(rev).copied().unwrap_or(0),
            by_attempt.get(rev).copied().unwrap_or(0),
        );
        // A call without an attempt is an attempt lost. An attempt without a call is one
        // only when it was not interrupted: a kill between recording the attempt and the
        // stand-in writing its call leaves an interrupted attempt and no call.
        let spare = interrupted.get(rev).copied().unwrap_or(0);
        if c > a || a - c > spare {
            report.problems.push(format!(
                "revision {rev}: {c} calls of colmena but {a} attempts in the history \
                 ({spare} interrupted)"
            ));
        }
    }
}

fn check_heartbeat(
    plan: &Plan,
    restarted_at: &[jiff::Timestamp],
    renewals: &[jiff::Timestamp],
    report: &mut Report,
) {
    let bound = plan.heartbeat_bound().as_secs_f64();
    for r in restarted_at {
        match renewals.iter().find(|t| *t > r) {
            Some(t) => {
                let back = t.duration_since(*r).as_secs_f64();
                report.heartbeat_back.push(back);
                if back > bound {
                    report.problems.push(format!(
                        "the heartbeat came back {back:.1} s after the API restart at {r}, \
                         more than one renewal ({bound:.1} s)"
                    ));
                }
            }
            None => report
                .problems
                .push(format!("no renewal after the API restart at {r}")),
        }
    }
}

/// How long a new process takes to settle: over its first minutes its code is faulted in as
/// it first runs and its heap grows to its working set (a few hundred KiB in the lives
/// measured, most of it in the first minute or two, and far slower after). A leak is judged on
/// what comes after, where growth is growth; the rise before is printed on its own.
const SETTLED_AGE: f64 = 180.0;

/// The slopes of RSS (and its parts) and fds within each process's life once it has settled,
/// the rise before that, and (for comparison) the least-squares slope from the first minute.
fn slopes(samples: &[Sample], report: &mut Report) {
    report.rss_max_kib = samples.iter().map(|s| s.rss_kib).max().unwrap_or(0);
    report.fds_max = samples.iter().map(|s| s.fds).max().unwrap_or(0);
    let settled: Vec<&Sample> = samples.iter().filter(|s| s.age >= SETTLED_AGE).collect();
    let per_hour = |f: fn(&Sample) -> u64| median_slope(&settled, f) * 3600.0;
    report.rss_slope_mib_per_hour = per_hour(|s| s.rss_kib) / 1024.0;
    report.rss_anon_slope_mib_per_hour = per_hour(|s| s.rss_anon_kib) / 1024.0;
    report.rss_file_slope_mib_per_hour = per_hour(|s| s.rss_file_kib) / 1024.0;
    report.fd_slope_per_hour = per_hour(|s| s.fds);
    report.settled_samples = settled.len();
    let after_first_minute: Vec<&Sample> = samples.iter().filter(|s| s.age >= 60.0).collect();
    report.rss_least_squares_mib_per_hour =
        least_squares_slope(&after_first_minute, |s| s.rss_kib) * 3600.0 / 1024.0;
    report.rss_run_slope_mib_per_hour = run_slope(samples, |s| s.rss_kib) * 3600.0 / 1024.0;
    (report.warm_up_kib, report.warm_up_lives) = warm_up(samples);
}

/// The mean rise of RSS from a life's first sample (in its first minute) to its first settled
/// one, and over how many lives.
fn warm_up(samples: &[Sample]) -> (f64, usize) {
    let mut rises = Vec::new();
    for group in by_life(samples.iter()).values() {
        let first = group.iter().find(|s| s.age < 60.0);
        let settled = group.iter().find(|s| s.age >= SETTLED_AGE);
        if let (Some(a), Some(b)) = (first, settled) {
            rises.push(b.rss_kib as f64 - a.rss_kib as f64);
        }
    }
    let n = rises.len();
    let mean = if n == 0 {
        0.0
    } else {
        rises.iter().sum::<f64>() / n as f64
    };
    (mean, n)
}

fn by_life<'a>(samples: impl Iterator<Item = &'a Sample>) -> BTreeMap<usize, Vec<&'a Sample>> {
    let mut lives: BTreeMap<usize, Vec<&Sample>> = BTreeMap::new();
    for s in samples {
        lives.entry(s.life).or_default().push(s);
    }
    lives
}

/// The Theil–Sen slope of `f` against age (per second) within lives: the median of the slopes
/// between every two samples of the same life; 0 when there is no such pair. A mean would be
/// led by the few samples taken in a passing moment (a connection closed and not yet opened
/// again takes the fds from 22 to 20; a fetch's buffers are not yet trimmed), which say
/// nothing of a trend; the median of the pairs is moved only by what most of them show.
fn median_slope(samples: &[&Sample], f: fn(&Sample) -> u64) -> f64 {
    let mut pairs = Vec::new();
    for group in by_life(samples.iter().copied()).values() {
        for (i, a) in group.iter().enumerate() {
            for b in &group[i + 1..] {
                let dt = b.age - a.age;
                if dt > 1.0 {
                    pairs.push((f(b) as f64 - f(a) as f64) / dt);
                }
            }
        }
    }
    if pairs.is_empty() {
        return 0.0;
    }
    pairs.sort_by(f64::total_cmp);
    let mid = pairs.len() / 2;
    if pairs.len() % 2 == 1 {
        pairs[mid]
    } else {
        (pairs[mid - 1] + pairs[mid]) / 2.0
    }
}

/// The least-squares slope of `f` against the time since the run began (per second), every
/// sample on one line; 0 when there is nothing to fit.
fn run_slope(samples: &[Sample], f: fn(&Sample) -> u64) -> f64 {
    let n = samples.len() as f64;
    let mt = samples.iter().map(|s| s.at).sum::<f64>() / n;
    let my = samples.iter().map(|s| f(s) as f64).sum::<f64>() / n;
    let (mut sxx, mut sxy) = (0.0, 0.0);
    for s in samples {
        sxx += (s.at - mt) * (s.at - mt);
        sxy += (s.at - mt) * (f(s) as f64 - my);
    }
    if sxx > 0.0 { sxy / sxx } else { 0.0 }
}

/// The least-squares slope of `f` against age (per second), with one intercept per life; 0
/// when there is nothing to fit.
fn least_squares_slope(samples: &[&Sample], f: fn(&Sample) -> u64) -> f64 {
    let (mut sxx, mut sxy) = (0.0, 0.0);
    for group in by_life(samples.iter().copied()).values() {
        let n = group.len() as f64;
        let mt = group.iter().map(|s| s.age).sum::<f64>() / n;
        let my = group.iter().map(|s| f(s) as f64).sum::<f64>() / n;
        for s in group {
            let dt = s.age - mt;
            sxx += dt * dt;
            sxy += dt * (f(s) as f64 - my);
        }
    }
    if sxx > 0.0 { sxy / sxx } else { 0.0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(life: usize, age: f64, rss_kib: u64, fds: u64) -> Sample {
        Sample {
            life,
            age,
            at: age,
            rss_kib,
            rss_anon_kib: rss_kib,
            rss_file_kib: 0,
            fds,
        }
    }

    #[test]
    fn a_passing_dip_in_fds_is_no_slope_and_a_steady_leak_is() {
        // Two lives; in each a sample or two in a moment with a connection closed.
        let mut v = Vec::new();
        for life in 0..2 {
            for i in 0..10 {
                let fds = if i == 9 || (life == 1 && i == 4) {
                    20
                } else {
                    22
                };
                v.push(at(life, 200.0 + 30.0 * i as f64, 3000, fds));
            }
        }
        let refs: Vec<&Sample> = v.iter().collect();
        assert_eq!(median_slope(&refs, |s| s.fds), 0.0);
        assert!(least_squares_slope(&refs, |s| s.fds) < -1.0 / 3600.0);

        // One fd more every 2 minutes, whatever the life.
        let leak: Vec<Sample> = (0..3)
            .flat_map(|life| (0..10).map(move |i| at(life, 30.0 * i as f64, 3000, 22 + i / 4)))
            .collect();
        let refs: Vec<&Sample> = leak.iter().collect();
        let per_hour = median_slope(&refs, |s| s.fds) * 3600.0;
        assert!((20.0..=40.0).contains(&per_hour), "{per_hour}");
    }

    #[test]
    fn the_warm_up_is_measured_apart_from_the_settled_slope() {
        // Each life rises 160 KiB over its first 3 minutes, then grows 1 KiB a minute.
        let v: Vec<Sample> = (0..3)
            .flat_map(|life| {
                (0..12).map(move |i| {
                    let age = 30.0 * i as f64 + 10.0;
                    let rss = if age < SETTLED_AGE {
                        3000 + (age * 160.0 / SETTLED_AGE) as u64
                    } else {
                        3160 + ((age - SETTLED_AGE) / 60.0) as u64
                    };
                    at(life, age, rss, 22)
                })
            })
            .collect();
        let mut report = Report::default();
        slopes(&v, &mut report);
        assert_eq!(report.warm_up_lives, 3);
        assert!(
            (140.0..=170.0).contains(&report.warm_up_kib),
            "{}",
            report.warm_up_kib
        );
        let kib_per_hour = report.rss_slope_mib_per_hour * 1024.0;
        assert!((30.0..=90.0).contains(&kib_per_hour), "{kib_per_hour}");
        assert!(report.rss_least_squares_mib_per_hour > report.rss_slope_mib_per_hour);
    }
}
