//! The persisted state (`<state_dir>/state.json`) and apply history (`history.json`).
//!
//! Both are JSON with a format version, written atomically: a temporary file in the same
//! directory, fsync, rename over the old file, fsync the directory. A file that does not parse,
//! or carries a version this ginx does not know, is moved aside as `<name>.corrupt-<timestamp>`
//! with a warning and ginx starts from an empty value: it never crashes on it and never deletes
//! it.
//!
//! Layer 4: imports `types` and `util` only; never a worker (the values it stores, such as
//! `Revision` and `Generation`, live in `types`). Not here: what the fields mean for the apply
//! loop (see `reconcile`).

use std::collections::BTreeMap;
use std::collections::VecDeque;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use jiff::Timestamp;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

mod durations;
pub mod phase;

pub use durations::{Durations, Measured};
pub use phase::{Activity, Disrupting, Phase};

use crate::status::HealthStatus;
use crate::types::{ClosureInfo, Generation, Goal, Plan, Revision};

/// Bumped when a change is not backwards compatible; readers refuse newer versions.
pub const STATE_VERSION: u32 = 1;
pub const HISTORY_VERSION: u32 = 1;
/// Attempts kept in `history.json`.
pub const HISTORY_LIMIT: usize = 50;
/// Lines of output kept per attempt...
pub const OUTPUT_TAIL: usize = 200;
/// ...and bytes.
pub const OUTPUT_TAIL_BYTES: usize = 64 * 1024;
/// A longer output line is cut, so a runaway command cannot exhaust memory.
pub const MAX_LINE: usize = 4 * 1024;

/// Adds `line` to the kept tail: the last [`OUTPUT_TAIL`] lines, at most [`OUTPUT_TAIL_BYTES`]
/// in all (so the history of 50 attempts stays small).
pub fn keep(tail: &mut VecDeque<OutputLine>, mut line: OutputLine) {
    if line.line.len() > MAX_LINE {
        let mut end = MAX_LINE;
        while !line.line.is_char_boundary(end) {
            end -= 1;
        }
        line.line.truncate(end);
    }
    tail.push_back(line);
    let mut bytes: usize = tail.iter().map(|l| l.line.len()).sum();
    while tail.len() > OUTPUT_TAIL || (bytes > OUTPUT_TAIL_BYTES && tail.len() > 1) {
        if let Some(dropped) = tail.pop_front() {
            bytes -= dropped.line.len();
        }
    }
}

/// What must survive a restart. Fields added later carry `#[serde(default)]`, so older files
/// still load.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct State {
    pub version: u32,
    /// Set by `ginxctl suspend`, cleared by `ginxctl resume`.
    pub suspended: bool,
    /// What the node is doing now: an attempt or a gate, under a drain or a reboot.
    #[serde(flatten)]
    pub phase: Phase,
    /// The last revision applied successfully; never applied again.
    pub applied: Option<Applied>,
    /// Failures of the revision currently wanted, for backoff across restarts.
    pub failure: Option<Failure>,
    /// Interruptions of a revision (ginx or the machine stopped mid-attempt): retried once.
    pub interrupted: Option<Interrupted>,
    /// Closure mode: the store path of the last attempt, what fetching it found.
    #[serde(default)]
    pub closure: Option<ClosureInfo>,
    /// Id of the next attempt; ids are never reused.
    pub next_attempt_id: u64,
    /// `/run/current-system` as ginx's last successful attempt left it; another value means
    /// someone changed the system by hand (drift).
    pub expected_system: Option<PathBuf>,
    /// Why the booted system is not the one ginx activated.
    pub reboot: Option<RebootRequired>,
    /// The revision `ginxctl rollback` rolled back from; not applied again until a new
    /// revision or `ginxctl retry`.
    pub rolled_back: Option<Revision>,
    /// The last health gate that failed, and what became of it.
    pub gate_failure: Option<GateFailure>,
    /// The rollout slot this node holds (or the FleetLock it took): kept across restarts, so
    /// that a restarted holder resumes with its slot instead of taking a second one.
    pub rollout_held: Option<TakenSlot>,
    /// A reboot whose drain was given up is not tried again before then.
    pub reboot_deferred: Option<RebootDeferred>,
    /// When the last reboot ginx carried out was done: a sentinel file older than that is the
    /// one it rebooted for, not a new request.
    pub rebooted_at: Option<Timestamp>,
    /// The revision last built without activating it (`apply.prebuild`): its activation runs
    /// no build.
    pub built: Option<Built>,
    /// The last revision whose health gate passed on this node (or that was applied without
    /// one): what `rollout.after` of other groups waits for.
    pub passed: Option<Revision>,
    /// How long the recent drains, gates and reboots took here: a preview's estimate.
    #[serde(skip_serializing_if = "Durations::is_empty")]
    pub took: Durations,
}

/// A drain before the activation of `revision`: cordoned, drained, activated, then (once the
/// gate is over) uncordoned.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApplyDrain {
    pub revision: Revision,
    /// What in the plan called for it (`restarts containerd.service`).
    #[serde(default)]
    pub because: Vec<String>,
    pub started_at: Timestamp,
    /// ginx made the node unschedulable (and annotated it so): it uncordons it at the end.
    #[serde(default)]
    pub cordoned: bool,
    /// The node was drained then; the activation may start.
    #[serde(default)]
    pub drained_at: Option<Timestamp>,
    /// The activation began after the drain.
    #[serde(default)]
    pub activated: bool,
}

/// A revision built ahead of its activation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Built {
    pub revision: Revision,
    pub at: Timestamp,
    /// What activating it would do, computed after the build; absent when it was not (built
    /// by an older ginx, or the runner wrote none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<Plan>,
}

/// Where a reboot carried out by ginx stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RebootPhase {
    /// Cordoned (or about to be), pods being evicted.
    Draining,
    /// `reboot.reboot_command` ran; waiting to come up in a new boot.
    Rebooting,
    /// Up in a new boot: the health gate runs.
    Verifying,
    /// The gate failed and the rolled-back system is unhealthy too: cordoned, the slot kept
    /// until an operator acts (`ginxctl retry`) or a fixed revision passes its gate. Stored and
    /// shown as `held`, as earlier versions wrote it.
    #[serde(rename = "held")]
    Kept,
    /// Done: uncordon what ginx cordoned, release the slot.
    Finishing,
}

impl RebootPhase {
    pub fn as_str(self) -> &'static str {
        match self {
            RebootPhase::Draining => "draining",
            RebootPhase::Rebooting => "rebooting",
            RebootPhase::Verifying => "verifying",
            RebootPhase::Kept => "held",
            RebootPhase::Finishing => "finishing",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Rebooting {
    pub phase: RebootPhase,
    pub started_at: Timestamp,
    /// Why (the reasons the reboot was required for).
    #[serde(default)]
    pub reasons: Vec<String>,
    /// ginx made the node unschedulable (and annotated it so): it uncordons it at the end.
    #[serde(default)]
    pub cordoned: bool,
    /// When the drain began; it is given up `reboot.drain_timeout` later.
    #[serde(default)]
    pub drain_started_at: Option<Timestamp>,
    /// When the node was drained: what is left is the last look and the reboot command, and
    /// the node is not drained again while the last look holds it (given up
    /// `reboot.guard_timeout` later).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drained_at: Option<Timestamp>,
    /// The boot being left, recorded before the reboot command runs.
    #[serde(default)]
    pub boot_id: Option<String>,
    #[serde(default)]
    pub reboot_at: Option<Timestamp>,
    /// This reboot boots the rolled-back generation after a failed gate.
    #[serde(default)]
    pub rollback: bool,
    /// The gate's baseline, taken once the node was drained, before the reboot.
    #[serde(default)]
    pub baseline: BTreeMap<String, HealthStatus>,
}

/// A reboot put off after a drain that could not finish.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RebootDeferred {
    pub until: Timestamp,
    pub reason: String,
}

/// The health gate in progress.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Verifying {
    pub revision: Revision,
    /// Verifying the rolled-back system after a failed gate.
    #[serde(default)]
    pub rollback: bool,
    pub started_at: Timestamp,
    pub deadline: Timestamp,
    /// Healthy without a break since then.
    #[serde(default)]
    pub healthy_since: Option<Timestamp>,
    /// Each check's status before the activation: a check that was failed already does not
    /// hold the gate (no regression).
    #[serde(default)]
    pub baseline: BTreeMap<String, HealthStatus>,
    /// The gate after a reboot carried out by ginx.
    #[serde(default)]
    pub after_reboot: bool,
}

/// Where a node stands after a failed gate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AfterGate {
    /// The previous generation is to be activated (`rollback = "auto"`).
    RollBack,
    /// The rolled-back system passed its gate; the revision is rolled back and halted.
    RolledBack,
    /// The rolled-back system failed its gate too: the slot is kept.
    RollbackUnhealthy,
    /// `rollback = "manual"`: held with the slot until an operator acts.
    Manual,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GateFailure {
    pub revision: Revision,
    /// The checks that failed, with their messages.
    pub failing: BTreeMap<String, String>,
    pub at: Timestamp,
    pub next: AfterGate,
    /// The failure is written to the cluster's rollout state (retried until it is): the
    /// revision halted, or (`quarantined`) counted below the failure budget.
    #[serde(default)]
    pub halted: bool,
    /// Written below `rollout.halt_after`: the revision is not halted, this node is
    /// quarantined on its rolled-back system and the rollout goes on.
    #[serde(default)]
    pub quarantined: bool,
    /// The failed gate's baseline: the rolled-back system is held to the same.
    #[serde(default)]
    pub baseline: BTreeMap<String, HealthStatus>,
    /// The gate failed after a reboot: the rollback makes the previous generation the boot
    /// default and reboots into it.
    #[serde(default)]
    pub after_reboot: bool,
}

/// Which lock a slot was taken from, stored as `kubernetes` or `fleetlock`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SlotBackend {
    /// A slot Lease in the cluster.
    Kubernetes,
    /// A FleetLock server's semaphore.
    Fleetlock,
}

impl SlotBackend {
    pub fn as_str(self) -> &'static str {
        match self {
            SlotBackend::Kubernetes => "kubernetes",
            SlotBackend::Fleetlock => "fleetlock",
        }
    }
}

impl std::fmt::Display for SlotBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A held rollout lock.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TakenSlot {
    pub backend: SlotBackend,
    pub group: String,
    /// The slot (Lease backend).
    #[serde(default)]
    pub slot: Option<u32>,
    pub revision: Revision,
    pub since: Timestamp,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Applied {
    pub source: String,
    pub revision: Revision,
    pub goal: Goal,
    pub at: Timestamp,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Failure {
    pub revision: Revision,
    /// Failed attempts of this revision so far.
    pub attempts: u32,
    pub error: String,
    pub next_retry_at: Timestamp,
    /// Given up (max_attempts reached, or a configuration error): no retry until a new
    /// revision or `ginxctl retry`.
    #[serde(default)]
    pub exhausted: bool,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Interrupted {
    pub revision: Revision,
    pub count: u32,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RebootRequired {
    pub reasons: Vec<String>,
    pub since: Timestamp,
    /// The boot this was found in; after a reboot it is computed afresh.
    pub boot_id: Option<String>,
}

/// What an attempt does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AttemptKind {
    /// Apply a revision with `apply.command`.
    #[default]
    Apply,
    /// Switch to the previous system generation (`ginxctl rollback`).
    Rollback,
    /// Build a revision without activating it (`apply.prebuild`), before a slot is asked for.
    Build,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InFlight {
    pub id: u64,
    #[serde(default)]
    pub kind: AttemptKind,
    pub source: String,
    pub revision: Revision,
    pub goal: Goal,
    pub started_at: Timestamp,
    /// Comes from the testing branch (not a deployment new heads must descend from).
    #[serde(default)]
    pub testing: bool,
    /// `process` or `systemd-run`.
    #[serde(default)]
    pub isolation: String,
    /// The transient unit, for `systemd-run`.
    #[serde(default)]
    pub unit: Option<String>,
    /// Where the runner writes output and result.
    #[serde(default)]
    pub dir: Option<PathBuf>,
    /// Given to the runner, which writes it into its result: a result without it is not this
    /// attempt's.
    #[serde(default)]
    pub token: Option<String>,
    #[serde(default)]
    pub generation_before: Option<Generation>,
    /// Process group of the runner, to stop what an unclean exit left running.
    pub pgid: Option<i32>,
    /// The boot the process group belongs to; after a reboot the number means nothing.
    #[serde(default)]
    pub boot_id: Option<String>,
    /// The group leader's start time (clock ticks since boot), so a reused pid is not taken
    /// for it.
    #[serde(default)]
    pub start_time: Option<u64>,
    /// Closure mode: the store path this attempt applies, and where it came from.
    #[serde(default)]
    pub closure: Option<ClosureInfo>,
}

/// How an attempt ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    Succeeded,
    Failed,
    TimedOut,
    /// ginx stopped (or died) while the attempt ran; it does not count as a failure.
    Interrupted,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Succeeded => "succeeded",
            Outcome::Failed => "failed",
            Outcome::TimedOut => "timed-out",
            Outcome::Interrupted => "interrupted",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stream {
    Stdout,
    Stderr,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputLine {
    pub stream: Stream,
    pub line: String,
}

/// One run of the apply command, as `ginxctl history` shows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Attempt {
    pub id: u64,
    #[serde(default)]
    pub kind: AttemptKind,
    pub source: String,
    pub revision: Revision,
    pub goal: Goal,
    pub started_at: Timestamp,
    pub finished_at: Timestamp,
    pub outcome: Outcome,
    pub exit_code: Option<i32>,
    pub error: Option<String>,
    /// The last lines the command printed, stdout and stderr interleaved as they arrived.
    /// Read back within the bounds of [`keep`], whatever the file holds.
    #[serde(deserialize_with = "bounded_output")]
    pub output: Vec<OutputLine>,
    /// The system generation before and after the attempt.
    #[serde(default)]
    pub generation_before: Option<Generation>,
    #[serde(default)]
    pub generation_after: Option<Generation>,
    #[serde(default)]
    pub isolation: String,
    /// Closure mode: the store path, its size, the time to fetch it, where it came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub closure: Option<ClosureInfo>,
    /// The memory high-water mark of the attempt's largest process, in KiB (from the runner).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_rss_kib: Option<u64>,
    /// A build: the plan of the revision it built.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<Plan>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(from = "StoredHistory")]
pub struct History {
    pub version: u32,
    /// Oldest first. Read back as the newest [`HISTORY_LIMIT`], however many the file holds,
    /// one attempt in memory at a time beyond them.
    pub attempts: Vec<Attempt>,
    /// Older attempts beyond [`HISTORY_LIMIT`] left out when the file was read, to be reported.
    #[serde(skip)]
    pub dropped_on_load: usize,
}

/// `history.json` as read.
#[derive(Default, Deserialize)]
#[serde(default)]
struct StoredHistory {
    version: u32,
    attempts: NewestAttempts,
}

impl From<StoredHistory> for History {
    fn from(s: StoredHistory) -> Self {
        Self {
            version: s.version,
            attempts: s.attempts.kept.into(),
            dropped_on_load: s.attempts.dropped,
        }
    }
}

/// The newest [`HISTORY_LIMIT`] attempts of a sequence, streamed, and how many were older.
#[derive(Default)]
struct NewestAttempts {
    kept: VecDeque<Attempt>,
    dropped: usize,
}

impl<'de> Deserialize<'de> for NewestAttempts {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Newest;
        impl<'de> serde::de::Visitor<'de> for Newest {
            type Value = NewestAttempts;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a list of attempts")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Self::Value, A::Error> {
                let mut out = NewestAttempts::default();
                while let Some(a) = seq.next_element::<Attempt>()? {
                    out.kept.push_back(a);
                    if out.kept.len() > HISTORY_LIMIT {
                        out.kept.pop_front();
                        out.dropped += 1;
                    }
                }
                Ok(out)
            }
        }
        d.deserialize_seq(Newest)
    }
}

/// An attempt's output within the bounds of [`keep`], streamed.
fn bounded_output<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<OutputLine>, D::Error> {
    struct Bounded;
    impl<'de> serde::de::Visitor<'de> for Bounded {
        type Value = Vec<OutputLine>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a list of output lines")
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(
            self,
            mut seq: A,
        ) -> Result<Self::Value, A::Error> {
            let mut tail = VecDeque::with_capacity(OUTPUT_TAIL + 1);
            while let Some(line) = seq.next_element::<OutputLine>()? {
                keep(&mut tail, line);
            }
            let mut output = tail.into();
            fit(&mut output);
            Ok(output)
        }
    }
    d.deserialize_seq(Bounded)
}

/// An attempt's output as the history keeps it: without spare room. A tail is gathered in a
/// buffer of [`OUTPUT_TAIL`] lines (6.4 KB), which a few lines of output would otherwise keep
/// for as long as the attempt stays in the history. The soak (bench/soak.sh) found the heap
/// growing by that much at each of a process's first 50 applies.
fn fit(output: &mut Vec<OutputLine>) {
    output.shrink_to_fit();
    for l in output {
        l.line.shrink_to_fit();
    }
}

impl History {
    /// Adds `attempt`, or replaces the one of the same id: an attempt whose end is recorded
    /// again (ginx was stopped after the history was written, before the state was) is one
    /// attempt, not two.
    pub fn push(&mut self, mut attempt: Attempt) {
        fit(&mut attempt.output);
        if let Some(same) = self.attempts.iter_mut().rev().find(|a| a.id == attempt.id) {
            *same = attempt;
            return;
        }
        self.attempts.push(attempt);
        let excess = self.attempts.len().saturating_sub(HISTORY_LIMIT);
        self.attempts.drain(..excess);
    }
}

/// The last deployed (or accepted) commit of each source's tracked branch, a copy of the
/// anchor ref kept in each clone: either survives the loss of the other.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Anchors {
    pub version: u32,
    pub anchors: std::collections::BTreeMap<String, Revision>,
}

impl Document for Anchors {
    const VERSION: u32 = 1;
    fn version(&self) -> u32 {
        self.version
    }
    fn set_version(&mut self) {
        self.version = 1;
    }
}

/// A versioned JSON document on disk.
pub trait Document: Default + Serialize + DeserializeOwned {
    const VERSION: u32;
    fn version(&self) -> u32;
    fn set_version(&mut self);
}

impl Document for State {
    const VERSION: u32 = STATE_VERSION;
    fn version(&self) -> u32 {
        self.version
    }
    fn set_version(&mut self) {
        self.version = STATE_VERSION;
    }
}

impl Document for History {
    const VERSION: u32 = HISTORY_VERSION;
    fn version(&self) -> u32 {
        self.version
    }
    fn set_version(&mut self) {
        self.version = HISTORY_VERSION;
    }
}

/// What loading found besides the value: a file moved aside, to be reported.
#[derive(Debug)]
pub struct MovedAside {
    pub to: PathBuf,
    pub reason: String,
    /// The file came from a newer ginx (a downgrade, e.g. after a rollback).
    pub newer: bool,
}

/// Reads `path`; a missing file is an empty document, a bad one is moved aside. The file is
/// streamed, not read whole: a document keeps to its bounds however large the file grew.
pub fn load<T: Document>(path: &Path) -> io::Result<(T, Option<MovedAside>)> {
    let file = match fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let mut fresh = T::default();
            fresh.set_version();
            return Ok((fresh, None));
        }
        Err(e) => return Err(e),
    };
    let (reason, newer) = match serde_json::from_reader::<_, T>(io::BufReader::new(file)) {
        Ok(doc) if doc.version() == T::VERSION => return Ok((doc, None)),
        Ok(doc) => (
            format!(
                "format version {} is not the {} this ginx understands",
                doc.version(),
                T::VERSION
            ),
            doc.version() > T::VERSION,
        ),
        Err(e) => (format!("does not parse: {e}"), false),
    };
    let stamp = Timestamp::now().strftime("%Y%m%dT%H%M%SZ").to_string();
    let mut to = path.as_os_str().to_owned();
    to.push(format!(".corrupt-{stamp}"));
    let to = PathBuf::from(to);
    fs::rename(path, &to)?;
    let mut fresh = T::default();
    fresh.set_version();
    Ok((fresh, Some(MovedAside { to, reason, newer })))
}

/// Reads `path` without touching it, for a reader that does not own the file (a preview reads
/// what the daemon wrote): the document when it parses and is of this ginx's version, else
/// `None`. Streamed, as [`load`] reads.
pub fn peek<T: Document>(path: &Path) -> Option<T> {
    let file = fs::File::open(path).ok()?;
    serde_json::from_reader::<_, T>(io::BufReader::new(file))
        .ok()
        .filter(|doc| doc.version() == T::VERSION)
}

/// Writes `doc` to `path` atomically and durably.
pub fn save<T: Document>(path: &Path, doc: &T) -> io::Result<()> {
    let bytes = serde_json::to_vec_pretty(doc).map_err(io::Error::other)?;
    write_atomic(path, &bytes)
}

/// Replaces `path` with `bytes` so that readers see the old or the new content, never a mix,
/// even across a crash.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut line = Vec::with_capacity(bytes.len() + 1);
    line.extend_from_slice(bytes);
    line.push(b'\n');
    crate::util::replace_file(path, &line, 0o666)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rev(c: char) -> Revision {
        c.to_string().repeat(40).parse().unwrap()
    }

    /// The lock a slot was taken from is stored as the strings earlier versions wrote, and
    /// those load back as the enum.
    #[test]
    fn a_held_slot_stored_by_earlier_versions_loads_with_its_backend() {
        for (stored, backend) in [
            ("kubernetes", SlotBackend::Kubernetes),
            ("fleetlock", SlotBackend::Fleetlock),
        ] {
            let json = format!(
                r#"{{"backend":"{stored}","group":"workers","slot":1,"revision":"{}","since":"2026-12-01T12:00:00Z"}}"#,
                "a".repeat(40)
            );
            let held: TakenSlot = serde_json::from_str(&json).unwrap();
            assert_eq!(held.backend, backend);
            assert_eq!(serde_json::to_string(&held).unwrap(), json);
        }
        let odd = r#"{"backend":"etcd","group":"g","revision":"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa","since":"2026-12-01T12:00:00Z"}"#;
        assert!(serde_json::from_str::<TakenSlot>(odd).is_err());
    }

    #[test]
    fn a_reboot_kept_for_an_operator_is_stored_as_earlier_versions_wrote_it() {
        assert_eq!(
            serde_json::to_string(&RebootPhase::Kept).unwrap(),
            "\"held\""
        );
        let back: RebootPhase = serde_json::from_str("\"held\"").unwrap();
        assert_eq!(back, RebootPhase::Kept);
        assert_eq!(RebootPhase::Kept.as_str(), "held");
    }

    #[test]
    fn a_peek_reads_a_document_of_this_version_and_leaves_any_file_as_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("state.json");
        assert!(peek::<State>(&p).is_none(), "no file");
        let s = State {
            suspended: true,
            version: STATE_VERSION,
            ..State::default()
        };
        save(&p, &s).unwrap();
        assert_eq!(peek::<State>(&p), Some(s));
        std::fs::write(&p, "{\"version\": 999}").unwrap();
        assert!(peek::<State>(&p).is_none(), "another version");
        std::fs::write(&p, "garbage").unwrap();
        assert!(peek::<State>(&p).is_none());
        assert_eq!(
            std::fs::read_to_string(&p).unwrap(),
            "garbage",
            "left as it is"
        );
    }

    #[test]
    fn missing_file_is_a_fresh_state() {
        let dir = tempfile::tempdir().unwrap();
        let (s, aside) = load::<State>(&dir.path().join("state.json")).unwrap();
        assert_eq!(s.version, STATE_VERSION);
        assert!(aside.is_none());
    }

    #[test]
    fn round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("state.json");
        let mut s = State {
            suspended: true,
            applied: Some(Applied {
                source: "hephaestus".into(),
                revision: rev('a'),
                goal: Goal::Switch,
                at: Timestamp::UNIX_EPOCH,
            }),
            ..State::default()
        };
        s.set_version();
        save(&p, &s).unwrap();
        let (back, aside) = load::<State>(&p).unwrap();
        assert_eq!(back, s);
        assert!(aside.is_none());
        assert_eq!(
            fs::read_dir(dir.path()).unwrap().count(),
            1,
            "no temp file left"
        );
    }

    #[test]
    fn corrupt_file_is_moved_aside_not_lost() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("state.json");
        fs::write(&p, b"{\"version\": 1, \"suspended\": tru").unwrap();
        let (s, aside) = load::<State>(&p).unwrap();
        assert_eq!(
            s,
            State {
                version: STATE_VERSION,
                ..State::default()
            }
        );
        let aside = aside.unwrap();
        assert!(aside.to.to_string_lossy().contains("state.json.corrupt-"));
        assert_eq!(
            fs::read(&aside.to).unwrap(),
            b"{\"version\": 1, \"suspended\": tru"
        );
        assert!(!p.exists());
    }

    #[test]
    fn newer_version_is_moved_aside() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("state.json");
        fs::write(&p, b"{\"version\": 99}").unwrap();
        let (_, aside) = load::<State>(&p).unwrap();
        assert!(aside.unwrap().reason.contains("version 99"));
    }

    fn big_attempt(id: u64, lines: usize, line_len: usize) -> Attempt {
        Attempt {
            id,
            source: "h".into(),
            revision: rev('b'),
            goal: Goal::Switch,
            started_at: Timestamp::UNIX_EPOCH,
            finished_at: Timestamp::UNIX_EPOCH,
            outcome: Outcome::Succeeded,
            exit_code: Some(0),
            error: None,
            output: (0..lines)
                .map(|n| OutputLine {
                    stream: Stream::Stdout,
                    line: format!("{id}:{n}:{}", "x".repeat(line_len)),
                })
                .collect(),
            kind: AttemptKind::Apply,
            generation_before: None,
            generation_after: None,
            isolation: "process".into(),
            closure: None,
            max_rss_kib: None,
            plan: None,
        }
    }

    /// A `history.json` far beyond the bounds (grown by hand, or by an older
    /// ginx) is trimmed to them when it is loaded, keeping the newest attempts and lines.
    #[test]
    fn a_huge_history_file_is_trimmed_to_its_bounds_when_loaded() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("history.json");
        let huge = History {
            version: HISTORY_VERSION,
            attempts: (0..300).map(|id| big_attempt(id, 400, 300)).collect(),
            dropped_on_load: 0,
        };
        std::fs::write(&p, serde_json::to_vec(&huge).unwrap()).unwrap();
        assert!(std::fs::metadata(&p).unwrap().len() > 30 << 20);
        let (h, aside) = load::<History>(&p).unwrap();
        assert!(aside.is_none());
        assert_eq!(h.attempts.len(), HISTORY_LIMIT);
        assert_eq!(h.dropped_on_load, 300 - HISTORY_LIMIT);
        assert_eq!(h.attempts.first().unwrap().id, 300 - HISTORY_LIMIT as u64);
        assert_eq!(h.attempts.last().unwrap().id, 299);
        for a in &h.attempts {
            assert!(a.output.len() <= OUTPUT_TAIL);
            let bytes: usize = a.output.iter().map(|l| l.line.len()).sum();
            assert!(bytes <= OUTPUT_TAIL_BYTES, "{bytes}");
        }
        let last = h.attempts.last().unwrap();
        assert!(last.output.last().unwrap().line.starts_with("299:399:"));
        let saved = serde_json::to_vec(&h).unwrap().len();
        assert!(saved < (HISTORY_LIMIT + 1) * (OUTPUT_TAIL_BYTES + OUTPUT_TAIL * 64));
    }

    /// An attempt kept in the history holds no spare room, whether it was just
    /// made (its output gathered in a buffer of OUTPUT_TAIL lines, each line read into a
    /// larger string) or read back from the file. Spare room stayed for as long as the attempt
    /// did: 6.4 KB each, 320 KB once the history was full.
    #[test]
    fn attempts_in_the_history_hold_no_spare_room() {
        let mut attempt = big_attempt(7, 3, 20);
        let mut tail = VecDeque::with_capacity(OUTPUT_TAIL);
        for mut l in std::mem::take(&mut attempt.output) {
            l.line.reserve(1000);
            keep(&mut tail, l);
        }
        attempt.output = tail.into();
        assert!(
            attempt.output.capacity() >= OUTPUT_TAIL,
            "the test's premise"
        );
        let mut h = History {
            version: HISTORY_VERSION,
            ..History::default()
        };
        h.push(attempt);
        let spare = |h: &History| {
            let o = &h.attempts[0].output;
            assert_eq!(o.len(), 3);
            o.capacity() - o.len()
                + o.iter()
                    .map(|l| l.line.capacity() - l.line.len())
                    .sum::<usize>()
        };
        assert_eq!(spare(&h), 0);

        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("history.json");
        std::fs::write(&p, serde_json::to_vec(&h).unwrap()).unwrap();
        let (loaded, _) = load::<History>(&p).unwrap();
        assert_eq!(loaded, h);
        assert_eq!(spare(&loaded), 0);
    }

    #[test]
    fn history_keeps_the_newest() {
        let mut h = History::default();
        for id in 0..(HISTORY_LIMIT as u64 + 5) {
            h.push(Attempt {
                id,
                source: "h".into(),
                revision: rev('b'),
                goal: Goal::Switch,
                started_at: Timestamp::UNIX_EPOCH,
                finished_at: Timestamp::UNIX_EPOCH,
                outcome: Outcome::Succeeded,
                exit_code: Some(0),
                error: None,
                output: vec![],
                kind: AttemptKind::Apply,
                generation_before: None,
                generation_after: None,
                isolation: "process".into(),
                closure: None,
                max_rss_kib: None,
                plan: None,
            });
        }
        assert_eq!(h.attempts.len(), HISTORY_LIMIT);
        assert_eq!(h.attempts[0].id, 5);
    }

    /// An attempt recorded again (ginx stopped between writing the history and the state)
    /// replaces its first record, wherever it is, and keeps its place.
    #[test]
    fn an_attempt_recorded_twice_is_one_attempt() {
        let mut h = History::default();
        for id in [3, 4, 5] {
            h.push(big_attempt(id, 1, 1));
        }
        let mut again = big_attempt(4, 1, 1);
        again.outcome = Outcome::Interrupted;
        h.push(again);
        let ids: Vec<u64> = h.attempts.iter().map(|a| a.id).collect();
        assert_eq!(ids, [3, 4, 5]);
        assert_eq!(h.attempts[1].outcome, Outcome::Interrupted);
    }
}
