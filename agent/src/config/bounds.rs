//! The floor and ceiling of every duration and count in the configuration, in one table: a
//! value past what ginx can compute with must be refused at load, where it is written. Each section checks its values against its entries here; the manual's table of bounds (docs/src/configuration.md) is
//! compared with it by a test; and every value the loader accepts survives the arithmetic ginx
//! does with it ([`arithmetic`]), which the property test and the fuzz target check.
//!
//! Why ceilings at all: a duration goes into `Instant + d`, a jiff `Timestamp + d`, `d * 4`,
//! Kubernetes' `i32` seconds and systemd properties; a value past any of these panics a task or
//! fails every attempt. The ceilings are far below all of them (a week at most) and at what an
//! operator could mean.
//!
//! Not here: checks between two keys (`settle` < `timeout`, `renew_interval` <
//! `lease_duration`, …); each section makes those, blaming the key written in the files.

use super::{ConfigError, Ctx, Duration};
use crate::types::Invalid;

const fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}
const fn millis(ms: u64) -> Duration {
    Duration::from_millis(ms)
}
const MINUTE: u64 = 60;
const HOUR: u64 = 3600;
const DAY: u64 = 24 * HOUR;

/// The bounds of one duration key.
#[derive(Debug)]
pub struct DurationBound {
    /// The key as the manual names it: `<name>` any source, `<probe>` any probe, `[]` any entry.
    pub key: &'static str,
    pub floor: Duration,
    pub ceiling: Duration,
    /// Sent to Kubernetes in whole seconds: a fraction would be cut off silently.
    pub whole_seconds: bool,
    /// Why, for the error message.
    pub why: &'static str,
}

impl DurationBound {
    /// `Err(message)` when `d` is out of bounds; the message names the bound.
    pub fn check_value(&self, d: Duration) -> Result<(), Invalid> {
        if d < self.floor {
            return Err(Invalid(format!(
                "{d} is below the floor of {}: {}; write at least {0}",
                self.floor, self.why
            )));
        }
        if d > self.ceiling {
            return Err(Invalid(format!(
                "{d} is above the ceiling of {}: {}; write at most {0}",
                self.ceiling, self.why
            )));
        }
        if self.whole_seconds && d.get().subsec_nanos() != 0 {
            return Err(Invalid(format!(
                "{d} is not a whole number of seconds: Kubernetes takes it in seconds and the \
                 fraction would be cut off; write it in whole seconds, like \"{}s\"",
                d.get().as_secs().max(self.floor.get().as_secs())
            )));
        }
        Ok(())
    }

    /// Checks `d`, set at `key` (the entry's own key, like `sources.argus.interval`).
    pub(super) fn check_at(
        &self,
        ctx: &Ctx<'_>,
        key: &str,
        d: Duration,
    ) -> Result<(), ConfigError> {
        self.check_value(d).map_err(|m| ctx.error(key, m))
    }

    /// Checks `d`, set at this bound's key.
    pub(super) fn check(&self, ctx: &Ctx<'_>, d: Duration) -> Result<(), ConfigError> {
        self.check_at(ctx, self.key, d)
    }
}

/// The bounds of one count.
#[derive(Debug)]
pub struct CountBound {
    pub key: &'static str,
    pub floor: u32,
    pub ceiling: u32,
    pub why: &'static str,
}

impl CountBound {
    pub fn check_value(&self, n: u32) -> Result<(), Invalid> {
        if n < self.floor || n > self.ceiling {
            return Err(Invalid(format!(
                "{n} is out of bounds: must be between {} and {}: {}",
                self.floor, self.ceiling, self.why
            )));
        }
        Ok(())
    }

    pub(super) fn check_at(&self, ctx: &Ctx<'_>, key: &str, n: u32) -> Result<(), ConfigError> {
        self.check_value(n).map_err(|m| ctx.error(key, m))
    }

    pub(super) fn check(&self, ctx: &Ctx<'_>, n: u32) -> Result<(), ConfigError> {
        self.check_value(n).map_err(|m| ctx.error(self.key, m))
    }
}

const fn bound(
    key: &'static str,
    floor: Duration,
    ceiling: Duration,
    why: &'static str,
) -> DurationBound {
    DurationBound {
        key,
        floor,
        ceiling,
        whole_seconds: false,
        why,
    }
}

const fn in_seconds(
    key: &'static str,
    floor: Duration,
    ceiling: Duration,
    why: &'static str,
) -> DurationBound {
    DurationBound {
        key,
        floor,
        ceiling,
        whole_seconds: true,
        why,
    }
}

const LOOP: &str = "a shorter wait only burns CPU and hammers what is polled; a longer one \
                    means the loop hardly runs (use `ginxctl sync` or a reload instead)";
const TIMEOUT: &str = "a shorter one fails what would have succeeded; a longer one leaves a hung \
                       step unnoticed for that long";

pub const SOURCE_INTERVAL: DurationBound =
    bound("sources.<name>.interval", secs(1), secs(DAY), LOOP);
pub const SOURCE_FETCH_TIMEOUT: DurationBound =
    bound("sources.<name>.fetch_timeout", secs(1), secs(HOUR), TIMEOUT);

pub const APPLY_TIMEOUT: DurationBound = bound(
    "apply.timeout",
    secs(1),
    secs(DAY),
    "a whole build and activation; past a day it is hung",
);
pub const APPLY_RETRY_BASE: DurationBound = bound(
    "apply.retry_base",
    secs(1),
    secs(DAY),
    "the first wait after a failed attempt",
);
pub const APPLY_RETRY_MAX: DurationBound = bound(
    "apply.retry_max",
    secs(1),
    secs(DAY),
    "the longest wait between attempts",
);
pub const APPLY_KILL_GRACE: DurationBound = bound(
    "apply.kill_grace",
    secs(1),
    secs(10 * MINUTE),
    "between SIGTERM and SIGKILL: the apply needs a moment to clean up, and a stop must not \
     hang (systemd's TimeoutStopSec grows with it)",
);
pub const APPLY_SHUTDOWN_GRACE: DurationBound = bound(
    "apply.shutdown_grace",
    secs(0),
    secs(HOUR),
    "how long stopping ginx waits for a running apply (0s: stop it at once); \
     systemd's TimeoutStopSec grows with it",
);
pub const APPLY_HOOK_TIMEOUT: DurationBound =
    bound("apply.hook_timeout", secs(1), secs(HOUR), TIMEOUT);
pub const CLOSURE_REALISE_TIMEOUT: DurationBound = bound(
    "apply.closure.realise_timeout",
    secs(1),
    secs(DAY),
    "fetching the closure, within apply.timeout",
);
pub const CLOSURE_PIN_TIMEOUT: DurationBound = bound(
    "apply.closure.pin_timeout",
    secs(1),
    secs(20),
    "the apply loop waits for the pin endpoint, and must keep answering",
);

pub const DRIFT_CHECK_INTERVAL: DurationBound =
    bound("system.drift_check_interval", secs(1), secs(DAY), LOOP);

pub const HEARTBEAT_LEASE_DURATION: DurationBound = in_seconds(
    "kubernetes.lease_duration",
    secs(5),
    secs(HOUR),
    "other nodes count a heartbeat this old as gone; renewed every renew_interval",
);
pub const RENEW_INTERVAL: DurationBound = bound(
    "kubernetes.renew_interval",
    millis(100),
    secs(30 * MINUTE),
    "each renewal is a write to the API server, and a failed one is retried within it: \
     below 100ms the loop is a busy one; within kubernetes.lease_duration",
);
pub const RESYNC_INTERVAL: DurationBound = bound(
    "kubernetes.resync_interval",
    secs(1),
    secs(DAY),
    "a full comparison with the Node; changes are written at once anyway",
);
pub const REQUEST_TIMEOUT: DurationBound = bound(
    "kubernetes.request_timeout",
    secs(1),
    secs(5 * MINUTE),
    "one API request; shorter fails requests a loaded API server answers, longer stalls \
     every loop that waits for one",
);

pub const HEALTH_INTERVAL: DurationBound = bound(
    "health.interval",
    millis(100),
    secs(HOUR),
    "the probes' rounds; the floor is the health gate's own (rollout.gate.interval)",
);
pub const HEALTH_TIMEOUT: DurationBound = bound(
    "health.timeout",
    millis(100),
    secs(5 * MINUTE),
    "one probe; a longer one holds its results back",
);
pub const PROBE_INTERVAL: DurationBound = bound(
    "health.<probe>.interval",
    millis(100),
    secs(HOUR),
    HEALTH_INTERVAL.why,
);
pub const PROBE_TIMEOUT: DurationBound = bound(
    "health.<probe>.timeout",
    millis(100),
    secs(5 * MINUTE),
    HEALTH_TIMEOUT.why,
);

pub const ROLLOUT_LEASE_DURATION: DurationBound = in_seconds(
    "rollout.lease_duration",
    secs(5),
    secs(HOUR),
    "a slot not renewed this long is free (renewed at a third of it): shorter loses slots to \
     a slow API server, longer keeps a dead node's slot",
);
pub const ROLLOUT_SOAK: DurationBound = bound(
    "rollout.soak",
    secs(0),
    secs(24 * HOUR),
    "the least time from one node's passed gate to the next node of the group starting the \
     same revision",
);
pub const GATE_SETTLE: DurationBound = bound(
    "rollout.gate.settle",
    secs(0),
    secs(12 * HOUR),
    "healthy without a break this long; within rollout.gate.timeout",
);
pub const GATE_TIMEOUT: DurationBound = bound(
    "rollout.gate.timeout",
    secs(1),
    secs(DAY),
    "a gate not settled by then fails; the slot is held meanwhile",
);
pub const GATE_INTERVAL: DurationBound = bound(
    "rollout.gate.interval",
    millis(100),
    secs(5 * MINUTE),
    "every round runs the probes and the gate command and asks the API",
);
pub const GATE_COMMAND_TIMEOUT: DurationBound = bound(
    "rollout.gate.command_timeout",
    secs(1),
    secs(HOUR),
    "one run of rollout.gate.command; shorter times out every run",
);
pub const ROLLOUT_WINDOW_LENGTH: DurationBound = bound(
    "rollout.windows[].length",
    secs(MINUTE),
    secs(7 * DAY),
    "a shorter window may never be seen open; a longer one overlaps itself",
);

pub const LOCK_TTL: DurationBound = in_seconds(
    "reboot.lock_ttl",
    secs(5),
    secs(DAY),
    "the slot's duration while rebooting (at least rollout.lease_duration): a node that dies \
     mid-reboot holds its slot that long",
);
pub const DRAIN_TIMEOUT: DurationBound = bound("reboot.drain_timeout", secs(1), secs(DAY), TIMEOUT);
pub const GUARD_TIMEOUT: DurationBound = bound(
    "reboot.guard_timeout",
    secs(5),
    secs(DAY),
    "a drained node looks at the guards again every 5 s, so a shorter wait gives up before \
     the second look; a longer one keeps a cordoned node and its slot out of use for longer",
);
pub const GRACE_PERIOD: DurationBound = in_seconds(
    "reboot.grace_period",
    secs(1),
    secs(HOUR),
    "the grace period of evicted pods: 0 would kill them at once (leave it out for each \
     pod's own)",
);
pub const REBOOT_WINDOW_LENGTH: DurationBound = bound(
    "reboot.windows[].length",
    secs(MINUTE),
    secs(7 * DAY),
    ROLLOUT_WINDOW_LENGTH.why,
);

pub const NOTIFY_TIMEOUT: DurationBound = bound(
    "notify[].timeout",
    secs(1),
    secs(MINUTE),
    "one webhook request; sends run beside the apply loop, one notice at a time per webhook",
);
pub const NOTIFY_RETRIES: CountBound = CountBound {
    key: "notify[].retries",
    floor: 0,
    ceiling: 10,
    why: "sends after a failed one, 1 s apart doubling up to 30 s",
};
pub const DISRUPTION_TIMEOUT: DurationBound = bound(
    "disruption.timeout",
    secs(1),
    secs(HOUR),
    "each step of computing a revision's plan (dry-activate, the closure difference); past it \
     the plan is unknown and disruption.unknown applies",
);
pub const PROMETHEUS_TIMEOUT: DurationBound = bound(
    "rollout.gate.prometheus.timeout",
    millis(100),
    secs(MINUTE),
    "one query to Prometheus; every look before a slot and every round of an open gate waits \
     for it",
);
pub const ETCD_TIMEOUT: DurationBound = bound(
    "etcd.timeout",
    millis(100),
    secs(MINUTE),
    "each request to an etcd member; a member that takes longer is not answering",
);
pub const STAGE_TIMEOUT: DurationBound =
    bound("bootstrap.stages[].timeout", secs(1), secs(DAY), TIMEOUT);
pub const FLUX_TIMEOUT: DurationBound =
    bound("bootstrap.flux.timeout", secs(1), secs(DAY), TIMEOUT);

/// Every duration bound, in the manual's order.
pub const DURATIONS: &[&DurationBound] = &[
    &SOURCE_INTERVAL,
    &SOURCE_FETCH_TIMEOUT,
    &APPLY_TIMEOUT,
    &APPLY_RETRY_BASE,
    &APPLY_RETRY_MAX,
    &APPLY_KILL_GRACE,
    &APPLY_SHUTDOWN_GRACE,
    &APPLY_HOOK_TIMEOUT,
    &CLOSURE_REALISE_TIMEOUT,
    &CLOSURE_PIN_TIMEOUT,
    &DRIFT_CHECK_INTERVAL,
    &HEARTBEAT_LEASE_DURATION,
    &RENEW_INTERVAL,
    &RESYNC_INTERVAL,
    &REQUEST_TIMEOUT,
    &HEALTH_INTERVAL,
    &HEALTH_TIMEOUT,
    &PROBE_INTERVAL,
    &PROBE_TIMEOUT,
    &ROLLOUT_LEASE_DURATION,
    &ROLLOUT_SOAK,
    &GATE_SETTLE,
    &GATE_TIMEOUT,
    &GATE_INTERVAL,
    &GATE_COMMAND_TIMEOUT,
    &ROLLOUT_WINDOW_LENGTH,
    &LOCK_TTL,
    &DRAIN_TIMEOUT,
    &GUARD_TIMEOUT,
    &GRACE_PERIOD,
    &REBOOT_WINDOW_LENGTH,
    &DISRUPTION_TIMEOUT,
    &ETCD_TIMEOUT,
    &PROMETHEUS_TIMEOUT,
    &NOTIFY_TIMEOUT,
    &STAGE_TIMEOUT,
    &FLUX_TIMEOUT,
];

pub const MAX_CONCURRENT: CountBound = CountBound {
    key: "rollout.max_concurrent",
    floor: 1,
    ceiling: 1000,
    why: "nodes of the group applying at once; each is a slot Lease",
};
pub const HALT_AFTER: CountBound = CountBound {
    key: "rollout.halt_after",
    floor: 1,
    ceiling: 1000,
    why: "failed gates and vanished holders of one revision before it is halted fleet-wide",
};
pub const MAX_ATTEMPTS: CountBound = CountBound {
    key: "apply.max_attempts",
    floor: 1,
    ceiling: 100,
    why: "failed attempts of one revision before it is given up",
};
const KUBE_VIP_WHY: &str = "seconds, as kube-vip takes them";
pub const KUBE_VIP_LEASE_DURATION: CountBound = CountBound {
    key: "kubeadm.kube_vip.lease_duration",
    floor: 1,
    ceiling: 3600,
    why: KUBE_VIP_WHY,
};
pub const KUBE_VIP_RENEW_DEADLINE: CountBound = CountBound {
    key: "kubeadm.kube_vip.renew_deadline",
    floor: 1,
    ceiling: 3600,
    why: KUBE_VIP_WHY,
};
pub const KUBE_VIP_RETRY_PERIOD: CountBound = CountBound {
    key: "kubeadm.kube_vip.retry_period",
    floor: 1,
    ceiling: 3600,
    why: KUBE_VIP_WHY,
};

pub const ETCD_MAX_LAG: CountBound = CountBound {
    key: "etcd.max_lag",
    floor: 1,
    ceiling: 1_000_000,
    why: "raft entries a member may trail the leader's applied index by and count as caught up",
};
pub const ETCD_HAND_OVER_ATTEMPTS: CountBound = CountBound {
    key: "etcd.hand_over_attempts",
    floor: 1,
    ceiling: 10,
    why: "moves of the leadership tried before the node waits instead",
};

/// Every count bound, in the manual's order.
pub const COUNTS: &[&CountBound] = &[
    &MAX_ATTEMPTS,
    &NOTIFY_RETRIES,
    &MAX_CONCURRENT,
    &HALT_AFTER,
    &KUBE_VIP_LEASE_DURATION,
    &KUBE_VIP_RENEW_DEADLINE,
    &KUBE_VIP_RETRY_PERIOD,
    &ETCD_MAX_LAG,
    &ETCD_HAND_OVER_ATTEMPTS,
];

/// Runs `d` through the arithmetic ginx does with a configured duration, from `now` and
/// `wall`: deadlines on the monotonic clock (`Instant + d`, as `tokio::time` makes them),
/// wall-clock times (`util::after`), Kubernetes' `i32` seconds, thirds (lease renewal),
/// multiples (systemd's RuntimeMaxSec takes `timeout + 4 × kill_grace`), and jitter (`× 1.1`).
/// `Err` names the step that would overflow or saturate.
pub fn arithmetic(
    d: std::time::Duration,
    now: std::time::Instant,
    wall: jiff::Timestamp,
) -> Result<(), Invalid> {
    let step = |ok: bool, what: &str| {
        if ok {
            Ok(())
        } else {
            Err(format!("{what} with {d:?}"))
        }
    };
    step(now.checked_add(d).is_some(), "Instant + d")?;
    let four = d.checked_mul(4);
    step(four.is_some(), "d * 4")?;
    step(
        four.and_then(|f| d.checked_add(f))
            .and_then(|f| now.checked_add(f))
            .is_some(),
        "Instant + d + 4d",
    )?;
    step(d.checked_mul(2).is_some(), "d * 2")?;
    step(now.checked_add(d / 3).is_some(), "Instant + d / 3")?;
    step(i32::try_from(d.as_secs()).is_ok(), "i32 seconds")?;
    step(
        jiff::SignedDuration::try_from(d)
            .ok()
            .and_then(|s| wall.checked_add(s).ok())
            .is_some(),
        "Timestamp + d",
    )?;
    step(
        crate::util::after(wall, d) < jiff::Timestamp::MAX,
        "util::after saturating",
    )?;
    step(
        std::time::Duration::try_from_secs_f64(d.as_secs_f64() * 1.1).is_ok(),
        "jitter (d * 1.1)",
    )?;
    Ok(())
}

/// Every duration of `c` with its key, as [`arithmetic`] wants them.
pub fn durations(c: &super::Config) -> Vec<(String, std::time::Duration)> {
    use super::load::join_key;
    let mut v: Vec<(String, Duration)> = Vec::new();
    for (name, s) in &c.sources {
        let key = join_key("sources", name);
        v.push((join_key(&key, "interval"), s.interval));
        v.push((join_key(&key, "fetch_timeout"), s.fetch_timeout));
    }
    let a = &c.apply;
    v.extend([
        ("apply.timeout".into(), a.timeout),
        ("apply.retry_base".into(), a.retry_base),
        ("apply.retry_max".into(), a.retry_max),
        ("apply.kill_grace".into(), a.kill_grace),
        ("apply.shutdown_grace".into(), a.shutdown_grace),
        ("apply.hook_timeout".into(), a.hook_timeout),
    ]);
    if let Some(cl) = &a.closure {
        v.push(("apply.closure.realise_timeout".into(), cl.realise_timeout));
        v.push(("apply.closure.pin_timeout".into(), cl.pin_timeout));
    }
    v.push((
        "system.drift_check_interval".into(),
        c.system.drift_check_interval,
    ));
    let k = &c.kubernetes;
    v.extend([
        ("kubernetes.lease_duration".into(), k.lease_duration),
        ("kubernetes.renew_interval".into(), k.renew_interval),
        ("kubernetes.resync_interval".into(), k.resync_interval),
        ("kubernetes.request_timeout".into(), k.request_timeout),
    ]);
    let h = &c.health;
    v.push(("health.interval".into(), h.interval));
    v.push(("health.timeout".into(), h.timeout));
    for (probe, interval, timeout) in h.timings() {
        v.extend(interval.map(|d| (format!("health.{probe}.interval"), d)));
        v.extend(timeout.map(|d| (format!("health.{probe}.timeout"), d)));
    }
    let r = &c.rollout;
    v.extend([
        ("rollout.lease_duration".into(), r.lease_duration),
        ("rollout.gate.settle".into(), r.gate.settle),
        ("rollout.gate.timeout".into(), r.gate.timeout),
        ("rollout.gate.interval".into(), r.gate.interval),
        (
            "rollout.gate.command_timeout".into(),
            r.gate.command_timeout,
        ),
    ]);
    for (i, w) in r.windows.iter().enumerate() {
        v.push((format!("rollout.windows[{i}].length"), w.length));
    }
    let b = &c.reboot;
    v.push(("reboot.lock_ttl".into(), b.lock_ttl));
    v.push(("reboot.drain_timeout".into(), b.drain_timeout));
    v.push(("reboot.guard_timeout".into(), b.guard_timeout));
    v.extend(b.grace_period.map(|d| ("reboot.grace_period".into(), d)));
    for (i, w) in b.windows.iter().flatten().enumerate() {
        v.push((format!("reboot.windows[{i}].length"), w.length));
    }
    for (i, s) in c.bootstrap.stages.iter().enumerate() {
        v.push((format!("bootstrap.stages[{i}].timeout"), s.timeout));
    }
    if let Some(p) = &r.gate.prometheus {
        v.push(("rollout.gate.prometheus.timeout".into(), p.timeout));
    }
    if let Some(f) = &c.bootstrap.flux {
        v.push(("bootstrap.flux.timeout".into(), f.timeout));
    }
    for (i, n) in c.notify.iter().enumerate() {
        v.push((format!("notify[{i}].timeout"), n.timeout));
    }
    v.into_iter().map(|(k, d)| (k, d.get())).collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::path::PathBuf;

    use super::*;
    use crate::config::{Config, ConfigError, load_texts};

    const PROBES: [&str; 6] = [
        "kubelet",
        "apiserver",
        "kube_vip",
        "cilium",
        "systemd",
        "node_ready",
    ];

    /// A configuration file that sets `key` (a bound's key, `<name>`, `<probe>` and `[]`
    /// filled in) to `value`, written raw (quoted for durations), as its last line, with
    /// `companions` (`(table, line)`) that keep the other keys' checks out of the way.
    /// Returns the text, the key as errors name it, and the value's `line:column`.
    fn config_setting(
        key: &str,
        value: &str,
        companions: &[(&str, &str)],
    ) -> (String, String, String) {
        let mut tables: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut add = |table: &str, line: String| {
            tables.entry(table.to_owned()).or_default().push(line);
        };
        add("node", "name = \"lucy\"".into());
        add("sources.hephaestus", "url = \"/srv/hephaestus\"".into());
        let (table, leaf) = key.rsplit_once('.').unwrap();
        let (table, error_table) = match table {
            "sources.<name>" => ("sources.hephaestus".to_owned(), None),
            "rollout.windows[]" | "reboot.windows[]" => {
                let t = table.trim_end_matches("[]");
                (format!("[{t}]"), Some(format!("{t}[0]")))
            }
            "bootstrap.stages[]" => (
                "[bootstrap.stages]".to_owned(),
                Some("bootstrap.stages[0]".into()),
            ),
            "notify[]" => ("[notify]".to_owned(), Some("notify[0]".into())),
            t => (t.replace("<probe>", "kubelet"), None),
        };
        let error_key = format!("{}.{leaf}", error_table.as_deref().unwrap_or(&table));
        match table.as_str() {
            "[rollout.windows]" | "[reboot.windows]" => {
                add(&table, "days = [\"sat\"]".into());
                add(&table, "start = \"02:00\"".into());
            }
            "[notify]" => add(&table, "url = \"http://127.0.0.1:9/hook\"".into()),
            "rollout.gate.prometheus" => add(&table, "url = \"http://127.0.0.1:9090\"".into()),
            "[bootstrap.stages]" => {
                add(&table, "name = \"a\"".into());
                add(&table, "path = \"/a.yaml\"".into());
            }
            "bootstrap.flux" => {
                add(&table, "source = \"hephaestus\"".into());
                add(&table, "path = \"clusters/lab\"".into());
            }
            "apply.closure" => {
                add("apply", "mode = \"closure\"".into());
                add(
                    &table,
                    "substituters = [\"https://cache.example.com\"]".into(),
                );
                add(&table, "trusted_public_keys = [\"cache:abc=\"]".into());
            }
            _ => {}
        }
        for (t, line) in companions {
            add(t, (*line).to_owned());
        }
        let target = tables.remove(&table).unwrap_or_default();
        let mut text = String::new();
        for (t, lines) in tables
            .iter()
            .map(|(t, l)| (t.as_str(), l))
            .chain([(table.as_str(), &target)])
        {
            // `t` is `[a.b]` for an array of tables, giving `[[a.b]]`.
            text.push_str(&format!("[{t}]\n"));
            for l in lines {
                text.push_str(l);
                text.push('\n');
            }
        }
        text.push_str(&format!("{leaf} = {value}\n"));
        let at = format!("{}:{}", text.lines().count(), leaf.chars().count() + 4);
        (text, error_key, at)
    }

    /// What keeps the checks between keys out of the way of one key's values.
    fn companions(key: &str) -> &'static [(&'static str, &'static str)] {
        match key {
            "apply.retry_base" => &[("apply", "retry_max = \"24h\"")],
            "apply.retry_max" => &[("apply", "retry_base = \"1s\"")],
            "apply.closure.realise_timeout" => &[("apply", "timeout = \"24h\"")],
            "kubernetes.lease_duration" => &[("kubernetes", "renew_interval = \"1s\"")],
            "kubernetes.renew_interval" => &[("kubernetes", "lease_duration = \"1h\"")],
            "rollout.lease_duration" => &[("reboot", "lock_ttl = \"24h\"")],
            "reboot.lock_ttl" => &[("rollout", "lease_duration = \"5s\"")],
            "rollout.gate.settle" => &[("rollout.gate", "timeout = \"24h\"")],
            "rollout.gate.timeout" => &[("rollout.gate", "settle = \"0s\"")],
            _ => &[],
        }
    }

    fn load(text: &str) -> Result<Config, ConfigError> {
        load_texts(&[(PathBuf::from("/etc/ginx/config.toml"), text.to_owned())])
    }

    fn quoted(d: Duration) -> String {
        format!("\"{d}\"")
    }

    /// Every duration is accepted at its floor and its ceiling and refused just
    /// past them, naming the key, where it is written, and the bound.
    #[test]
    fn every_duration_is_accepted_at_its_bounds_and_refused_past_them() {
        for b in DURATIONS {
            let with = |d: Duration| {
                let (text, key, at) = config_setting(b.key, &quoted(d), companions(b.key));
                (load(&text), text, key, at)
            };
            for edge in [b.floor, b.ceiling] {
                let (r, text, ..) = with(edge);
                assert!(
                    r.is_ok(),
                    "{}: {edge} refused: {:?}\n{text}",
                    b.key,
                    r.err()
                );
            }
            let mut past = vec![(
                b.ceiling.get() + std::time::Duration::from_secs(1),
                "ceiling",
            )];
            if !b.floor.is_zero() {
                let step = if b.whole_seconds { 1000 } else { 1 };
                past.push((
                    b.floor.get() - std::time::Duration::from_millis(step),
                    "floor",
                ));
            }
            for (d, which) in past {
                let (r, text, key, at) = with(d.into());
                let e = r
                    .expect_err(&format!("{}: {d:?} accepted\n{text}", b.key))
                    .to_string();
                let bound = if which == "floor" { b.floor } else { b.ceiling };
                assert!(
                    e.contains(&format!("config.toml:{at}: {key}: "))
                        && e.contains(&format!("the {which} of {bound}")),
                    "{}: {e}\n{text}",
                    b.key
                );
            }
            if b.whole_seconds {
                let d = b.floor.get() + std::time::Duration::from_millis(500);
                let (r, _, key, at) = with(d.into());
                let e = r.unwrap_err().to_string();
                assert!(
                    e.contains(&format!("config.toml:{at}: {key}: "))
                        && e.contains("not a whole number of seconds"),
                    "{e}"
                );
            }
        }
    }

    #[test]
    fn every_count_is_accepted_at_its_bounds_and_refused_past_them() {
        for b in COUNTS {
            for n in [b.floor, b.ceiling] {
                let (text, ..) = config_setting(b.key, &n.to_string(), &[]);
                assert!(
                    load(&text).is_ok(),
                    "{}: {n}: {:?}",
                    b.key,
                    load(&text).err()
                );
            }
            for n in [b.floor.checked_sub(1), Some(b.ceiling + 1)]
                .into_iter()
                .flatten()
            {
                let (text, key, at) = config_setting(b.key, &n.to_string(), &[]);
                let e = load(&text).unwrap_err().to_string();
                assert!(
                    e.contains(&format!("config.toml:{at}: {key}: {n} is out of bounds"))
                        && e.contains(&format!("between {} and {}", b.floor, b.ceiling)),
                    "{e}"
                );
            }
        }
    }

    #[test]
    fn every_default_is_within_its_bounds() {
        let (text, ..) = config_setting("node.role", "\"worker\"", &[]);
        let c = load(&text).unwrap();
        assert_eq!(c.rollout.max_concurrent, 1);
        let found = durations(&c);
        // Each key the defaults hold has a bound, and is inside it (the loader accepted them).
        for (key, d) in &found {
            assert!(bound_of(key).is_some(), "{key} has no bound");
            assert!(
                bound_of(key).unwrap().check_value((*d).into()).is_ok(),
                "{key}"
            );
        }
    }

    /// The bound a concrete key (`sources.argus.interval`, `rollout.windows[2].length`) has.
    fn bound_of(key: &str) -> Option<&'static DurationBound> {
        let general = |k: &str| {
            let mut parts: Vec<String> = Vec::new();
            for (i, p) in k.split('.').enumerate() {
                let p = match p.find('[') {
                    Some(at) => format!("{}[]", &p[..at]),
                    None => p.to_owned(),
                };
                parts.push(match (i, parts.first().map(String::as_str)) {
                    (1, Some("sources")) => "<name>".into(),
                    (1, Some("health")) if PROBES.contains(&p.as_str()) => "<probe>".into(),
                    _ => p,
                });
            }
            parts.join(".")
        };
        let g = general(key);
        DURATIONS.iter().copied().find(|b| b.key == g)
    }

    /// Values at, around and far past the bounds, and the extremes seen in the field.
    fn candidates(b: &DurationBound) -> Vec<String> {
        let mut v: Vec<String> = [
            "0s",
            "1ns",
            "1ms",
            "99ms",
            "100ms",
            "999ms",
            "1s",
            "1s 500ms",
            "4s",
            "5s",
            "1m",
            "1h",
            "1h 1s",
            "24h",
            "24h 1s",
            "168h",
            "169h",
            "100000h",
            "9223372036854775807s 999ms",
        ]
        .map(String::from)
        .to_vec();
        let ns = std::time::Duration::from_nanos(1);
        for d in [b.floor.get(), b.ceiling.get()] {
            v.push(Duration::from(d).to_string());
            v.push(Duration::from(d + ns).to_string());
            v.extend(d.checked_sub(ns).map(|d| Duration::from(d).to_string()));
        }
        v
    }

    /// What the loader accepts survives the arithmetic ginx does with it. For every
    /// duration key, values at, around and far past its bounds go through the loader (with and
    /// without the settings that keep cross-key checks quiet); every configuration accepted has
    /// each of its durations run through [`arithmetic`] and a tokio deadline, and agrees with
    /// the bounds table.
    #[test]
    fn whatever_the_loader_accepts_survives_the_arithmetic_that_uses_it() {
        let now = std::time::Instant::now();
        let wall = jiff::Timestamp::now();
        let mut accepted = 0;
        let mut keys: Vec<String> = DURATIONS.iter().map(|b| b.key.to_owned()).collect();
        keys.extend(PROBES.map(|p| format!("health.{p}.timeout")));
        keys.extend(PROBES.map(|p| format!("health.{p}.interval")));
        for key in &keys {
            let b = bound_of(key).unwrap();
            for value in candidates(b) {
                for extra in [companions(b.key), &[]] {
                    let (text, ..) = config_setting(key, &format!("\"{value}\""), extra);
                    let Ok(c) = load(&text) else { continue };
                    accepted += 1;
                    for (k, d) in durations(&c) {
                        if let Err(e) = arithmetic(d, now, wall) {
                            panic!("{k} = {value:?} was accepted, then: {e}\n{text}");
                        }
                        assert!(
                            tokio::time::Instant::now().checked_add(d).is_some(),
                            "{k} = {value:?}: tokio deadline"
                        );
                        let bound = bound_of(&k).unwrap();
                        assert_eq!(bound.check_value(d.into()), Ok(()), "{k} = {value:?}");
                    }
                }
            }
        }
        assert!(
            accepted > 100,
            "only {accepted} configurations were accepted"
        );
    }

    #[test]
    fn the_arithmetic_check_catches_what_the_issue_found() {
        let now = std::time::Instant::now();
        let wall = jiff::Timestamp::now();
        let huge: Duration = "9223372036854775807s 999ms".parse().unwrap();
        assert!(arithmetic(huge.get(), now, wall).is_err());
        assert!(arithmetic(std::time::Duration::from_secs(7 * DAY), now, wall).is_ok());
    }

    /// The manual's table of bounds (docs/src/configuration.md) is this table.
    #[test]
    fn the_manual_lists_every_bound() {
        let readme = include_str!("../../../docs/src/configuration.md");
        for b in DURATIONS {
            let note = if b.whole_seconds { "whole seconds" } else { "" };
            let row = format!("| `{}` | {} | {} | {note} |", b.key, b.floor, b.ceiling);
            assert!(
                readme.contains(&row),
                "docs/src/configuration.md lacks the row\n{row}"
            );
        }
        for b in COUNTS {
            let row = format!("| `{}` | {} | {} | |", b.key, b.floor, b.ceiling);
            assert!(
                readme.contains(&row),
                "docs/src/configuration.md lacks the row\n{row}"
            );
        }
    }
}
