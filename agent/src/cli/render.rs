//! Human views of status, sync and history for `ginxctl`: one screen, ages like "3m ago".

use std::fmt::Write;

use jiff::Timestamp;

use crate::control::protocol::{AcceptReport, ClearReport, FleetReport, HistoryReport, SyncReport};
use crate::state::{Attempt, AttemptKind, Stream};
use crate::status::{
    ApplyState, ClusterNode, ClusterView, HoldStatus, KubeState, PauseStatus, Status,
};
use crate::types::Generation;
use crate::util::age;

/// `ginxctl status`: one screen, from the apply down to the health probes.
pub fn status(s: &Status) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "ginx {} on {} ({}), up {}",
        s.version,
        s.node,
        s.role,
        age(s.started_at, s.now).trim_end_matches(" ago")
    );
    apply_lines(&mut o, s);
    rollout_lines(&mut o, s);
    system_lines(&mut o, s);
    reboot_lines(&mut o, s);
    source_lines(&mut o, s);
    kubernetes_lines(&mut o, s);
    if let Some(b) = &s.bootstrap {
        let when = b
            .finished_at
            .filter(|_| !b.phase.running())
            .map(|t| format!(" ({})", age(t, s.now)))
            .unwrap_or_default();
        let _ = writeln!(o, "bootstrap  {}{when}", printable(&b.line()));
    }
    if !s.health.is_empty() {
        let _ = writeln!(o, "health     {}", s.health_overall.as_str());
        for (probe, p) in &s.health {
            let _ = writeln!(
                o,
                "  {probe:<12} {:<9} {}",
                p.status.as_str(),
                printable(&p.message)
            );
        }
    }
    o
}

/// The `apply` line of `status`, with what was applied, the error and the next try under it.
fn apply_lines(o: &mut String, s: &Status) {
    let now = s.now;
    let a = &s.apply;
    let rev = a.revision.as_ref().map_or("-", |r| r.short());
    let mut line = format!(
        "apply      {:<10} {} {rev} ({})",
        a.state.as_str(),
        a.source,
        a.goal
    );
    match (a.started_at, a.finished_at) {
        (Some(st), None) => {
            let _ = write!(line, ", started {}", age(st, now));
        }
        (_, Some(f)) => {
            let _ = write!(line, ", last attempt finished {}", age(f, now));
        }
        _ => {}
    }
    let _ = writeln!(o, "{line}");
    if let Some(applied) = &a.applied_revision
        && a.revision.as_ref() != Some(applied)
    {
        let when = a
            .applied_at
            .map(|t| format!(" ({})", age(t, now)))
            .unwrap_or_default();
        let _ = writeln!(o, "           applied: {}{when}", applied.short());
    }
    if let Some(p) = &a.plan {
        let _ = writeln!(
            o,
            "           next: {} — {}",
            p.revision.short(),
            printable(&p.summary)
        );
    }
    if let Some(d) = &a.drain {
        let _ = writeln!(o, "           drain: {}", drain_line(d, now));
    }
    if let Some(err) = &a.error {
        let _ = writeln!(o, "           error ({} attempt(s)): {err}", a.attempts);
    }
    if let Some(t) = a.next_retry_at {
        let _ = writeln!(o, "           next try {} (or `ginxctl sync`)", age(t, now));
    } else if let (ApplyState::Verifying, Some(gate)) = (a.state, &s.rollout.gate) {
        let _ = writeln!(o, "           {}", printable(&gate.describe(Some(now))));
    } else if let Some(reason) = &a.reason {
        let _ = writeln!(o, "           {reason}");
    }
}

/// What holds this node's applies back in `status`: suspended, quarantined, the window.
fn rollout_lines(o: &mut String, s: &Status) {
    let _ = writeln!(
        o,
        "suspended  {}",
        if s.suspended {
            "yes (`ginxctl resume` to apply again)"
        } else {
            "no"
        }
    );
    if let Some(h) = &s.rollout.hold {
        let _ = writeln!(
            o,
            "hold       {}: nothing new starts here (`ginxctl release {}` lifts it)",
            hold_line(h),
            printable(&s.node)
        );
    }
    if let Some(q) = &s.rollout.quarantined {
        let _ = writeln!(
            o,
            "quarantine {}: its gate failed here ({}) below rollout.halt_after; rolled back, the \
             rollout went on (`ginxctl retry` or a new revision ends it)",
            q.revision.short(),
            printable(&q.failing.keys().cloned().collect::<Vec<_>>().join(", "))
        );
    }
    if let Some(w) = &s.rollout.window {
        let line = match (w.open, w.closes_at, w.opens_at) {
            (true, Some(c), _) => format!("open, closes at {c}"),
            (false, _, Some(t)) => format!("closed, the next opens at {t}"),
            (true, ..) => "open".to_owned(),
            (false, ..) => "closed".to_owned(),
        };
        let _ = writeln!(o, "window     {line}");
    }
    if let Some(f) = &s.rollout.freeze {
        let when = if f.active {
            format!("until {}", time(f.ends_at))
        } else {
            format!("next from {} until {}", time(f.starts_at), time(f.ends_at))
        };
        let _ = writeln!(o, "freeze     {when}: {}", printable(&f.reason));
    }
}

/// The running system in `status`: its generation and the closure applied.
fn system_lines(o: &mut String, s: &Status) {
    let a = &s.apply;
    if let Some(g) = &s.system.generation {
        let n = g.number.map_or_else(|| "?".to_owned(), |n| n.to_string());
        let _ = writeln!(
            o,
            "system     generation {n} ({}), isolation {}",
            g.path.display(),
            a.isolation
        );
    }
    if let Some(c) = &a.closure {
        let _ = writeln!(o, "closure    {}", printable(&closure_line(c)));
    }
}

/// Whether a reboot is due and where it stands in `status`, then a drifted system.
fn reboot_lines(o: &mut String, s: &Status) {
    let sys = &s.system;
    let rb = &s.rollout.reboot;
    if sys.reboot_required {
        let _ = writeln!(o, "reboot     required: {}", sys.reboot_reasons.join("; "));
    } else if rb.required && rb.phase.is_none() {
        let _ = writeln!(o, "reboot     required (reboot.sentinel)");
    }
    if let Some(phase) = &rb.phase {
        let cordoned = if rb.cordoned {
            ", cordoned by ginx"
        } else {
            ""
        };
        let _ = writeln!(o, "           {phase}{cordoned}");
    } else if rb.required && rb.mode == "never" {
        let _ = writeln!(o, "           reboot.mode = \"never\": reboot by hand");
    }
    if let (Some(w), Some(why)) = (&rb.waiting_for, &rb.reason) {
        let _ = writeln!(o, "           waiting for {w}: {why}");
    }
    if let Some(d) = &sys.drift {
        let _ = writeln!(
            o,
            "drift      the running system {} is not the one ginx produced ({}), since {}",
            d.current.display(),
            d.expected.display(),
            age(d.since, s.now)
        );
    }
}

/// The `sources` block of `status`: one line a source, then its testing branch, refusal,
/// signature and remotes under it.
fn source_lines(o: &mut String, s: &Status) {
    let now = s.now;
    let _ = writeln!(o, "sources");
    let width = s.sources.keys().map(String::len).max().unwrap_or(0);
    for (name, src) in &s.sources {
        let rev = src.revision.as_ref().map_or("-", |r| r.short());
        let branch = src.revision_branch.as_deref().unwrap_or(&src.branch);
        let since = src
            .failing_since
            .map_or_else(|| "?".to_owned(), |t| age(t, now));
        let state = match (&src.error, &src.refused, src.fetched_at) {
            (Some(_), Some(_), _) => format!("refusing a new head since {since}"),
            (Some(e), None, _) => format!("failing since {since}: {e}"),
            (None, _, Some(t)) => format!("fetched {}", age(t, now)),
            (None, _, None) => "not fetched yet".to_owned(),
        };
        let _ = writeln!(
            o,
            "  {name:<width$}  {branch:<12} {rev:<12}  {state}  {}",
            src.url
        );
        let pad = "";
        if src.testing {
            let _ = writeln!(
                o,
                "  {pad:width$}  testing branch {branch} (main: {})",
                src.branch
            );
        }
        if let Some(r) = &src.refused {
            let _ = writeln!(
                o,
                "  {pad:width$}  refused {}: {}",
                r.revision.short(),
                r.reason
            );
        }
        if let Some(sig) = &src.signature {
            let _ = writeln!(
                o,
                "  {pad:width$}  signed ({}) by {} {}",
                sig.format, sig.signer, sig.key
            );
        }
        if src.remotes.len() > 1 {
            for r in &src.remotes {
                let mark = match r.ok {
                    Some(true) => "served".to_owned(),
                    Some(false) => format!("failed: {}", r.error.as_deref().unwrap_or("?")),
                    None => "not tried".to_owned(),
                };
                let _ = writeln!(o, "  {pad:width$}  remote {}: {mark}", r.url);
            }
        }
    }
}

/// The `kubernetes` line of `status`: connected or why not, and a failing node report.
fn kubernetes_lines(o: &mut String, s: &Status) {
    let now = s.now;
    let k = &s.kubernetes;
    let kline = match (k.state, &k.error) {
        (KubeState::NotConfigured, None) => "not configured".to_owned(),
        (KubeState::Connected, _) => format!(
            "connected, heartbeat {}{}",
            k.last_heartbeat
                .map_or_else(|| "never".to_owned(), |t| age(t, now)),
            k.lease
                .as_ref()
                .map(|l| format!(" ({l})"))
                .unwrap_or_default()
        ),
        (state, Some(e)) => format!(
            "{} since {}: {}",
            state.as_str(),
            k.since.map_or_else(
                || "?".to_owned(),
                |t| age(t, now).trim_end_matches(" ago").to_owned()
            ),
            printable(e)
        ),
        (state, None) => state.as_str().to_owned(),
    };
    let _ = writeln!(o, "kubernetes {kline}");
    if let Some(e) = &k.report_error {
        let _ = writeln!(o, "  node report: {}", printable(e));
    }
}

/// `ginxctl health`: every probe with its details.
pub fn health(s: &Status) -> String {
    let now = s.now;
    let mut o = format!("overall    {}\n", s.health_overall.as_str());
    if s.health.is_empty() {
        o.push_str("no probe has run yet\n");
    }
    for (probe, p) in &s.health {
        let since = p.since.map_or_else(|| "?".to_owned(), |t| age(t, now));
        let checked = p
            .checked_at
            .map_or_else(|| "never".to_owned(), |t| age(t, now));
        let _ = writeln!(
            o,
            "{probe:<12} {:<9} since {since}, checked {checked}\n             {}",
            p.status.as_str(),
            printable(&p.message)
        );
    }
    o
}

pub fn sync(r: &SyncReport) -> String {
    let mut o = String::new();
    for s in &r.sources {
        let rev = s.revision.as_ref().map_or("-", |r| r.short());
        match &s.error {
            Some(e) if s.refused => {
                let _ = writeln!(o, "{}: revision refused: {e} (keeping {rev})", s.source);
            }
            Some(e) => {
                let _ = writeln!(o, "{}: fetch failed: {e} (keeping {rev})", s.source);
            }
            None => {
                let what = if s.changed { "new" } else { "unchanged" };
                let _ = writeln!(o, "{}: {rev} ({what})", s.source);
            }
        }
    }
    o
}

pub fn accept(r: &AcceptReport) -> String {
    let mut o = format!(
        "{}: accepted {} as the new base; new heads must descend from it\n",
        r.source, r.revision
    );
    o.push_str(&sync(&SyncReport {
        sources: vec![r.outcome.clone()],
    }));
    o
}

pub fn history(h: &HistoryReport, output: bool) -> String {
    if h.attempts.is_empty() {
        return "no apply attempts yet\n".to_owned();
    }
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{:<5} {:<20} {:<12} {:<13} {:<9} {:<12} {:<5} {:<9} {:<11} ERROR",
        "ID",
        "STARTED (UTC)",
        "SOURCE",
        "REVISION",
        "GOAL",
        "OUTCOME",
        "EXIT",
        "DURATION",
        "GENERATION"
    );
    for a in &h.attempts {
        let _ = writeln!(o, "{}", attempt_row(a));
        if let Some(c) = &a.closure {
            let _ = writeln!(o, "      closure {}", printable(&closure_line(c)));
        }
        if let Some(p) = &a.plan {
            let _ = writeln!(o, "      plan    {}", printable(&p.summary()));
        }
        if output {
            for l in &a.output {
                let mark = match l.stream {
                    Stream::Stdout => '|',
                    Stream::Stderr => '!',
                };
                let _ = writeln!(o, "      {mark} {}", printable(&l.line));
            }
        }
    }
    o
}

/// One attempt's row of `ginxctl history`, under the header `history` writes.
fn attempt_row(a: &Attempt) -> String {
    let exit = a
        .exit_code
        .map_or_else(|| "-".to_owned(), |c| c.to_string());
    let took = duration(a.started_at, a.finished_at);
    let goal = match a.kind {
        AttemptKind::Apply => a.goal.as_str(),
        AttemptKind::Rollback => "rollback",
        AttemptKind::Build => "prebuild",
    };
    let generation = |g: &Option<Generation>| {
        g.as_ref()
            .and_then(|g| g.number)
            .map_or_else(|| "?".to_owned(), |n| n.to_string())
    };
    let generations = match (&a.generation_before, &a.generation_after) {
        (None, None) => "-".to_owned(),
        (b, f) if b == f => generation(b),
        (b, f) => format!("{}→{}", generation(b), generation(f)),
    };
    format!(
        "{:<5} {:<20} {:<12} {:<13} {:<9} {:<12} {:<5} {:<9} {:<11} {}",
        a.id,
        a.started_at.strftime("%Y-%m-%d %H:%M:%S").to_string(),
        a.source,
        a.revision.short(),
        goal,
        a.outcome.as_str(),
        exit,
        took,
        generations,
        printable(a.error.as_deref().unwrap_or(""))
    )
}

/// `ginxctl rollout pause`.
pub fn paused(r: &FleetReport) -> String {
    match (&r.fleet.paused, r.changed) {
        (Some(_), true) => "paused the rollout fleet-wide: no node starts applying a new revision \
                            until `ginxctl rollout resume`\n"
            .to_owned(),
        (Some(p), false) => format!("already {}\n", pause_line(p)),
        // Lifted by someone else between the write and the answer: say what is.
        (None, _) => "not paused\n".to_owned(),
    }
}

/// `ginxctl rollout resume`.
pub fn resumed(r: &FleetReport) -> String {
    if r.changed {
        "resumed the rollout fleet-wide\n".to_owned()
    } else {
        "the rollout was not paused\n".to_owned()
    }
}

/// `ginxctl rollout clear`.
pub fn cleared(r: &ClearReport) -> String {
    let h = &r.cleared;
    format!(
        "cleared the halt of {} (halted on {} at {}: {}); nodes may apply it again\n",
        h.revision,
        printable(&h.node),
        time(h.at),
        printable(&h.reason)
    )
}

fn pause_line(p: &PauseStatus) -> String {
    format!("paused by {} since {}", printable(&p.by), time(p.at))
}

/// An RFC 3339 time to the second.
fn time(t: Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// JSON as `--json` prints it: indented, one trailing newline.
pub fn pretty(v: &serde_json::Value) -> String {
    let mut s = serde_json::to_string_pretty(v).unwrap_or_default();
    s.push('\n');
    s
}

/// The columns of `ginxctl cluster`'s node table.
const CLUSTER_HEADER: [&str; 9] = [
    "NODE",
    "ROLE",
    "READY",
    "HEALTHY",
    "APPLIED",
    "TARGET",
    "STATE/PHASE",
    "HEARTBEAT",
    "SLOT",
];

/// `ginxctl cluster`: a table of the nodes, then the halts, the pause and who waits.
pub fn cluster(v: &ClusterView) -> String {
    let now = v.at.unwrap_or_else(crate::util::now);
    let mut o = String::new();
    let rows: Vec<[String; 9]> = v.nodes.iter().map(|n| cluster_row(n, now)).collect();
    if rows.is_empty() {
        o.push_str(
            "no nodes: none has a ginx heartbeat Lease or ginx annotations, and there is no \
             control-plane node\n",
        );
    } else {
        o.push_str(&table(&CLUSTER_HEADER, &rows));
    }
    fleet_lines(&mut o, v, now);
    revision_lines(&mut o, v);
    for n in v.nodes.iter().filter(|n| n.quarantined.is_some()) {
        let _ = writeln!(
            o,
            "quarantined: {} on {} (rolled back; `ginxctl retry` there, or a new revision, ends it)",
            printable(&n.name),
            short_revision(&n.quarantined)
        );
    }
    for n in &v.nodes {
        if let Some(gate) = &n.gate {
            let _ = writeln!(
                o,
                "{}: {}",
                printable(&n.name),
                printable(&gate.describe(Some(now)))
            );
        }
    }
    let waiting: Vec<String> = v
        .nodes
        .iter()
        .filter(|n| n.rollout_phase.as_deref() == Some("waiting"))
        .map(|n| match &n.waiting_for {
            Some(w) => format!("{} ({})", printable(&n.name), printable(w)),
            None => printable(&n.name),
        })
        .collect();
    if waiting.is_empty() {
        o.push_str("nobody waits\n");
    } else {
        let _ = writeln!(o, "waiting: {}", waiting.join(", "));
    }
    o
}

fn dash() -> String {
    "-".to_owned()
}

/// A cell of `ginxctl cluster`: the text made printable, or "-" when there is none.
fn cell(s: &Option<String>) -> String {
    s.as_deref().map_or_else(dash, printable)
}

/// A revision in a cell of `ginxctl cluster`: its first 12 characters, or "-".
fn short_revision(s: &Option<String>) -> String {
    s.as_deref()
        .map_or_else(dash, |r| printable(&r.chars().take(12).collect::<String>()))
}

/// One node's row of `ginxctl cluster`, in the order of [`CLUSTER_HEADER`].
fn cluster_row(n: &ClusterNode, now: Timestamp) -> [String; 9] {
    let healthy = match (n.healthy.as_deref(), n.health_reason.as_deref()) {
        (Some("True"), _) => "yes".to_owned(),
        (Some(s), r) => {
            let s = if s == "False" { "no" } else { "unknown" };
            match r.filter(|r| !r.is_empty()) {
                Some(r) => format!("{s}: {}", printable(r)),
                None => s.to_owned(),
            }
        }
        (None, _) => dash(),
    };
    let phase = match (&n.apply_state, &n.rollout_phase) {
        (None, None) => dash(),
        (s, p) => format!("{}/{}", cell(s), cell(p)),
    };
    [
        printable(&n.name),
        n.role.map_or_else(dash, |r| r.to_string()),
        match n.ready {
            Some(true) => "yes".to_owned(),
            Some(false) => "no".to_owned(),
            None => dash(),
        },
        healthy,
        short_revision(&n.applied_revision),
        short_revision(&n.target_revision),
        phase,
        n.heartbeat_age_secs
            .map_or_else(dash, |s| age(now - jiff::SignedDuration::from_secs(s), now)),
        cell(&n.slot),
    ]
}

/// `rows` under `header`, every column as wide as its widest cell, two spaces between them;
/// the last column is not padded and no line ends in spaces.
fn table<const N: usize>(header: &[&str; N], rows: &[[String; N]]) -> String {
    let mut widths = header.map(str::len);
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: &[&str]| {
        let mut l = String::new();
        for (i, (c, w)) in cells.iter().zip(widths).enumerate() {
            if i + 1 == cells.len() {
                l.push_str(c);
            } else {
                let _ = write!(l, "{c:<w$}  ");
            }
        }
        l.truncate(l.trim_end().len());
        l.push('\n');
        l
    };
    let mut o = line(header);
    for r in rows {
        o.push_str(&line(&r.each_ref().map(String::as_str)));
    }
    o
}

/// The fleet-wide halts (with their failing probes) and the pause, under the node table.
fn fleet_lines(o: &mut String, v: &ClusterView, now: Timestamp) {
    for h in v.fleet.halted.values() {
        let _ = writeln!(
            o,
            "halted: {} on {} at {}: {}",
            h.revision.short(),
            printable(&h.node),
            time(h.at),
            printable(&h.reason)
        );
        for (probe, message) in &h.probes {
            let _ = writeln!(o, "  {}: {}", printable(probe), printable(message));
        }
    }
    match &v.fleet.paused {
        Some(p) => {
            let _ = writeln!(o, "{} ({})", pause_line(p), age(p.at, now));
        }
        None => o.push_str("not paused\n"),
    }
    for (node, h) in &v.fleet.holds {
        let lapsed = h.until.filter(|u| *u <= now);
        let _ = match lapsed {
            Some(u) => writeln!(
                o,
                "hold of {} lapsed at {} (the next `ginxctl hold` or `release` removes it)",
                printable(node),
                time(u)
            ),
            None => writeln!(o, "held: {} {}", printable(node), hold_line(h)),
        };
    }
}

/// `by ann since T until U: disk failing`.
fn hold_line(h: &HoldStatus) -> String {
    let until = h.until.map_or_else(|| "`ginxctl release`".to_owned(), time);
    let why = if h.reason.is_empty() {
        String::new()
    } else {
        format!(": {}", printable(&h.reason))
    };
    format!(
        "by {} since {} until {until}{why}",
        printable(&h.by),
        time(h.at)
    )
}

/// How far each revision being rolled out has come, and whose failures count against it.
fn revision_lines(o: &mut String, v: &ClusterView) {
    for (revision, c) in &v.revisions {
        let total =
            c.building + c.waiting + c.activating + c.verifying + c.done + c.failed + c.quarantined;
        let _ = writeln!(
            o,
            "revision {}: {}/{total} done; {} building, {} waiting, {} activating, {} verifying, {} done, {} failed, {} quarantined",
            printable(&revision.chars().take(12).collect::<String>()),
            c.done,
            c.building,
            c.waiting,
            c.activating,
            c.verifying,
            c.done,
            c.failed,
            c.quarantined
        );
        if let Some(f) = v.fleet.failures.get(revision) {
            let _ = writeln!(
                o,
                "  failures counted against its budget: {}",
                f.keys()
                    .map(|n| printable(n))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    for (revision, p) in &v.plans {
        let _ = writeln!(o, "{}", plan_line(revision, p));
    }
}

/// What a revision will disrupt across the fleet, from the nodes' plans, as in `plan for
/// 0123456789ab: 1 live, 2 drain, 0 reboot; restarts containerd.service (2)`.
fn plan_line(revision: &str, p: &crate::types::PlanCounts) -> String {
    let mut l = format!(
        "plan for {}: {} live, {} drain, {} reboot",
        printable(&revision.chars().take(12).collect::<String>()),
        p.live,
        p.drain,
        p.reboot
    );
    if p.unknown > 0 {
        let _ = write!(l, " ({} unknown, the fallback taken)", p.unknown);
    }
    if !p.because.is_empty() {
        let mut because: Vec<(&String, &u32)> = p.because.iter().collect();
        because.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        let said: Vec<String> = because
            .iter()
            .map(|(b, n)| format!("{} ({n})", printable(b)))
            .collect();
        let _ = write!(l, "; {}", said.join(", "));
    }
    l
}

/// A closure in short: path, size, time to fetch, where the pointer came from.
fn closure_line(c: &crate::types::ClosureInfo) -> String {
    let mut l = c.short_path();
    let mut facts = Vec::new();
    if let Some(b) = c.closure_size {
        facts.push(if b >= 1024 * 1024 {
            format!("{:.1} MiB", b as f64 / (1024.0 * 1024.0))
        } else {
            format!("{b} bytes")
        });
    }
    if let Some(t) = c.realise_seconds {
        facts.push(format!("fetched in {t:.1}s"));
    }
    if !facts.is_empty() {
        let _ = write!(l, " ({})", facts.join(", "));
    }
    let _ = write!(l, " from {}", c.origin);
    l
}

/// `s` for one terminal row: every control character, line breaks too, made harmless.
pub fn one_line(s: &str) -> String {
    printable(s)
}

/// `s` for one terminal row: control characters (escape sequences in a hostile remote's error
/// text, line breaks that would break the layout) become U+FFFD.
fn printable(s: &str) -> String {
    without_controls(s, false)
}

/// Everything `ginxctl` writes to a terminal goes through this: control characters other than
/// line breaks and tabs become U+FFFD, whatever field they came in.
pub fn terminal_safe(s: &str) -> String {
    without_controls(s, true)
}

fn without_controls(s: &str, keep_newlines: bool) -> String {
    s.chars()
        .map(|c| {
            if c.is_control() && c != '\t' && !(keep_newlines && c == '\n') {
                char::REPLACEMENT_CHARACTER
            } else {
                c
            }
        })
        .collect()
}

fn duration(from: Timestamp, to: Timestamp) -> String {
    let secs = to.duration_since(from).as_secs().max(0);
    match secs {
        0..=59 => format!("{secs}s"),
        60..=3599 => format!("{}m{:02}s", secs / 60, secs % 60),
        _ => format!("{}h{:02}m", secs / 3600, (secs % 3600) / 60),
    }
}

/// The drain before an activation, in a line: where it is and what called for it.
fn drain_line(d: &crate::status::ApplyDrainStatus, now: Timestamp) -> String {
    let step = match (d.drained_at, d.activated) {
        (None, _) => format!("draining since {}", age(d.started_at, now)),
        (Some(_), false) => "drained; the activation starts".to_owned(),
        (Some(_), true) => "activated; uncordoned once the gate is over".to_owned(),
    };
    format!(
        "{} for {} ({})",
        step,
        d.revision.short(),
        printable(&d.because.join(", "))
    )
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::status::{FleetStatus, HaltStatus};
    use crate::types::HaltCause;
    use crate::types::Role;

    #[test]
    fn cluster_is_one_table_then_halts_pause_and_who_waits() {
        let rev = "0123456789abcdef0123456789abcdef01234567";
        let at: Timestamp = "2026-12-01T12:00:00Z".parse().unwrap();
        let node = |name: &str| ClusterNode {
            name: name.to_owned(),
            ..ClusterNode::default()
        };
        let mut fleet = FleetStatus {
            paused: Some(PauseStatus {
                by: "alice@lucy".into(),
                at: "2026-12-01T11:57:00.123Z".parse().unwrap(),
            }),
            ..FleetStatus::default()
        };
        let hold = |until: &str| HoldStatus {
            by: "ann".into(),
            at: "2026-12-01T10:00:00Z".parse().unwrap(),
            reason: "disk failing".into(),
            until: Some(until.parse().unwrap()),
        };
        fleet
            .holds
            .insert("rei".into(), hold("2026-12-01T18:00:00Z"));
        fleet
            .holds
            .insert("old".into(), hold("2026-12-01T11:00:00Z"));
        fleet.halted.insert(
            rev.into(),
            HaltStatus {
                revision: rev.parse().unwrap(),
                node: "makise".into(),
                probes: BTreeMap::from([("kubelet".into(), "healthz answered 500".into())]),
                reason: "health gate failed".into(),
                at: "2026-12-01T10:00:00Z".parse().unwrap(),
                cause: HaltCause::GateFailed,
                group: None,
            },
        );
        let v = ClusterView {
            nodes: vec![
                ClusterNode {
                    role: Some(Role::ControlPlane),
                    ready: Some(true),
                    healthy: Some("True".into()),
                    health_reason: Some("AllProbesOk".into()),
                    applied_revision: Some(rev.into()),
                    target_revision: Some(rev.into()),
                    apply_state: Some("succeeded".into()),
                    rollout_phase: Some("applying".into()),
                    heartbeat_age_secs: Some(3),
                    slot: Some("control-plane/0".into()),
                    gate: Some(crate::status::GateProgress {
                        healthy_since: Some("2026-12-01T11:59:48Z".parse().unwrap()),
                        passes_at: Some("2026-12-01T12:00:48Z".parse().unwrap()),
                        deadline: Some("2026-12-01T12:05:00Z".parse().unwrap()),
                        ..Default::default()
                    }),
                    ..node("lucy")
                },
                ClusterNode {
                    role: Some(Role::Worker),
                    ready: Some(false),
                    healthy: Some("False".into()),
                    health_reason: Some("ProbesFailed".into()),
                    rollout_phase: Some("waiting".into()),
                    waiting_for: Some("after control-plane".into()),
                    heartbeat_age_secs: Some(125),
                    ..node("quinn\x1b[2J")
                },
                ClusterNode {
                    quarantined: Some(rev.into()),
                    ..node("rei")
                },
                node("newcomer"),
            ],
            slots: BTreeMap::new(),
            fleet,
            at: Some(at),
            revisions: [(
                rev.to_owned(),
                crate::status::RevisionCounts {
                    activating: 1,
                    quarantined: 1,
                    ..Default::default()
                },
            )]
            .into(),
            plans: [(
                rev.to_owned(),
                crate::types::PlanCounts {
                    live: 1,
                    drain: 2,
                    unknown: 1,
                    because: [
                        ("restarts kubelet.service".to_owned(), 1),
                        ("restarts containerd.service".to_owned(), 2),
                    ]
                    .into(),
                    ..Default::default()
                },
            )]
            .into(),
        };
        let text = cluster(&v);
        let want = "\
NODE       ROLE           READY  HEALTHY           APPLIED       TARGET        STATE/PHASE         HEARTBEAT  SLOT
lucy       control-plane  yes    yes               0123456789ab  0123456789ab  succeeded/applying  3s ago     control-plane/0
quinn\u{fffd}[2J  worker         no     no: ProbesFailed  -             -             -/waiting           2m ago     -
rei        -              -      -                 -             -             -                   -          -
newcomer   -              -      -                 -             -             -                   -          -
halted: 0123456789ab on makise at 2026-12-01T10:00:00Z: health gate failed
  kubelet: healthz answered 500
paused by alice@lucy since 2026-12-01T11:57:00Z (2m ago)
hold of old lapsed at 2026-12-01T11:00:00Z (the next `ginxctl hold` or `release` removes it)
held: rei by ann since 2026-12-01T10:00:00Z until 2026-12-01T18:00:00Z: disk failing
revision 0123456789ab: 0/2 done; 0 building, 0 waiting, 1 activating, 0 verifying, 0 done, 0 failed, 1 quarantined
plan for 0123456789ab: 1 live, 2 drain, 0 reboot (1 unknown, the fallback taken); restarts containerd.service (2), restarts kubelet.service (1)
quarantined: rei on 0123456789ab (rolled back; `ginxctl retry` there, or a new revision, ends it)
lucy: health gate after the activation: healthy for 12 s of the 60 s settle; passes at 2026-12-01T12:00:48Z if nothing regresses; gives up at 2026-12-01T12:05:00Z
waiting: quinn\u{fffd}[2J (after control-plane)
";
        assert_eq!(text, want, "\n{text}");
        let empty = cluster(&ClusterView {
            at: Some(at),
            ..ClusterView::default()
        });
        assert!(empty.starts_with("no nodes:"), "{empty}");
        assert!(empty.ends_with("not paused\nnobody waits\n"), "{empty}");
    }

    /// Columns as wide as their widest cell, two spaces apart; the last column unpadded and no
    /// trailing spaces, even when the last cells are empty.
    #[test]
    fn a_table_pads_every_column_but_the_last() {
        let rows = [
            [
                "lucy".to_owned(),
                "yes".to_owned(),
                "control-plane/0".to_owned(),
            ],
            ["quinn\u{fffd}".to_owned(), String::new(), String::new()],
        ];
        assert_eq!(
            table(&["NODE", "READY", "SLOT"], &rows),
            "NODE    READY  SLOT\nlucy    yes    control-plane/0\nquinn\u{fffd}\n"
        );
    }

    #[test]
    fn escape_sequences_never_reach_the_terminal() {
        let hostile = "remote: \x1b]0;pwned\x07\x1b[2Jdone\r\n\tnext";
        assert_eq!(
            terminal_safe(hostile),
            "remote: \u{fffd}]0;pwned\u{fffd}\u{fffd}[2Jdone\u{fffd}\n\tnext"
        );
        assert!(!printable(hostile).contains('\n'));
    }
}
