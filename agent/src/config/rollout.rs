//! `[rollout]`: how a new revision goes through the fleet — the lock that lets at most
//! `max_concurrent` nodes of a group apply at once, the health gate after an activation, and
//! what happens when the gate fails.

use serde::{Deserialize, Serialize};

use super::{ConfigError, Ctx, Duration, Freeze, PrometheusConfig, Window, bounds, is_dns_label};
use crate::types::EndpointUrl;

/// `rollout.lock`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LockBackend {
    /// `kubernetes` once the kubeconfig exists; no lock before (the bootstrap of a new cluster).
    #[default]
    Auto,
    /// Slot Leases in the cluster; without a kubeconfig nothing is applied.
    Kubernetes,
    /// A FleetLock server (`[rollout.fleetlock]`).
    Fleetlock,
    /// No lock: every node applies as soon as it sees a revision.
    None,
}

impl LockBackend {
    pub fn as_str(self) -> &'static str {
        match self {
            LockBackend::Auto => "auto",
            LockBackend::Kubernetes => "kubernetes",
            LockBackend::Fleetlock => "fleetlock",
            LockBackend::None => "none",
        }
    }
}

/// `rollout.on_api_unavailable`: what a node does when the cluster exists but its API cannot
/// be reached.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OnApiUnavailable {
    /// Apply nothing until the API answers (a lock that cannot be taken is not held).
    #[default]
    Wait,
    /// Apply without the lock.
    Proceed,
}

/// `rollout.on_holder_lost`: what a node does when it takes over a slot whose holder vanished
/// (stopped renewing, never released) while applying or verifying a revision.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OnHolderLost {
    /// Halt that revision cluster-wide (reason `holder-vanished`): a revision that kills its
    /// node is the one the gate never sees. Lifted by itself if the holder comes back and its
    /// gate passes.
    #[default]
    Halt,
    /// Take the slot and go on.
    Proceed,
}

/// `rollout.rollback`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RollbackPolicy {
    /// A failed gate rolls back to the previous generation and halts the revision.
    #[default]
    Auto,
    /// A failed gate halts the revision and keeps the slot; an operator decides.
    Manual,
}

/// `rollout.gate.require`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum GateRequire {
    /// No probe that was ok or degraded before the activation is failed now.
    #[default]
    NoRegression,
    /// Every probe ok.
    AllOk,
}

/// `[rollout.gate]`: the health gate after an activation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GateConfig {
    /// How long the node must be healthy without a break.
    pub settle: Duration,
    /// The gate fails when it has not settled by then.
    pub timeout: Duration,
    /// What the gate asks of the probes: `no-regression` (none that was ok or degraded before
    /// the activation is failed now) or `all-ok` (every probe ok).
    pub require: GateRequire,
    /// How often the probes run while the gate is open.
    pub interval: Duration,
    /// An operator's own check (argv); exit 0 means healthy. It is told `GINX_GATE_STEP`
    /// (`baseline` before an activation or a reboot, taken again each time the activation is
    /// put off; `gate` while the gate is open) and `GINX_REVISION` (the revision being
    /// activated; unset for a reboot's baseline).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,
    /// One run of `command` taking longer counts as unhealthy.
    pub command_timeout: Duration,
    /// The alert gate: firing alerts hold a node before its slot, and one that appears after
    /// the activation fails its gate.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prometheus: Option<PrometheusConfig>,
}

impl Default for GateConfig {
    fn default() -> Self {
        Self {
            settle: Duration::from_secs(60),
            timeout: Duration::from_secs(600),
            require: GateRequire::default(),
            interval: Duration::from_secs(2),
            command: None,
            command_timeout: Duration::from_secs(30),
            prometheus: None,
        }
    }
}

/// `[rollout.fleetlock]`: a FleetLock server (airlock, poseidon/fleetlock).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FleetLockConfig {
    /// The server's base URL; `/v1/pre-reboot` and `/v1/steady-state` are appended.
    pub url: EndpointUrl,
    /// The FleetLock group; default `rollout.group`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Where the machine id is read from.
    #[serde(default = "default_machine_id")]
    pub machine_id: std::path::PathBuf,
}

fn default_machine_id() -> std::path::PathBuf {
    "/etc/machine-id".into()
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RolloutConfig {
    /// The rollout lock: `auto` (slot Leases once the cluster answers, none before),
    /// `kubernetes`, `fleetlock` or `none`.
    pub lock: LockBackend,
    /// The lock group; default: the node's role (`control-plane` or `worker`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// How many nodes of the group may apply at once.
    pub max_concurrent: u32,
    /// A slot Lease not renewed for this long is free; renewed at a third of it.
    pub lease_duration: Duration,
    /// When the API cannot be reached for the lock: `wait` (apply nothing) or `proceed` (apply
    /// without it).
    pub on_api_unavailable: OnApiUnavailable,
    /// When a slot's holder vanished mid-rollout: `halt` its revision fleet-wide, or `proceed`.
    pub on_holder_lost: OnHolderLost,
    /// After a failed gate: `auto` (roll back to the previous generation and halt the
    /// revision) or `manual` (halt it and keep the slot; an operator decides).
    pub rollback: RollbackPolicy,
    /// Control-plane nodes wait until every other control-plane node is Ready and healthy.
    pub quorum_guard: bool,
    /// The ConfigMap (in `kubernetes.namespace`) holding halted revisions and the fleet pause.
    pub configmap: String,
    pub gate: GateConfig,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fleetlock: Option<FleetLockConfig>,
    /// `[[rollout.windows]]`: when an apply may start; none means always.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub windows: Vec<Window>,
    /// `[[rollout.freezes]]`: dated ranges in which nothing new starts (no apply, no reboot).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub freezes: Vec<Freeze>,
    /// The least time between one node's gate passing and the next node of the group starting
    /// the same revision, on the waiting node's monotonic clock from when it saw the pass.
    pub soak: Duration,
    /// Groups whose every node must have passed its gate on a revision (or a later one) before
    /// this node's group starts it, e.g. `["control-plane"]`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub after: Vec<String>,
    /// Canaries: these nodes take each revision before any other node of their group. The
    /// others start it only once every canary of the group passed its gate on it and `soak`
    /// has elapsed; a canary that is held, down or behind makes them wait, named.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub first: Vec<String>,
    /// A deterministic walk through the group: `"name"`, or a Node label (like
    /// `"topology.kubernetes.io/zone"`) whose value orders the nodes (then their names; a node
    /// without it last). A node starts a revision only while fewer than `max_concurrent` of
    /// the nodes before it have not passed it (held or not Ready ones are not waited for).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub order: Option<String>,
    /// Canaries by a label selector on Nodes (like `"ginx.io/canary=true"`), besides `first`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_selector: Option<String>,
    /// The failure budget of one revision: failed gates (with their rollbacks) and vanished
    /// holders counted fleet-wide. Below it the failing node is quarantined and the rollout goes
    /// on; at it the revision is halted. 1: the first failure halts.
    pub halt_after: u32,
    /// A revision that fails to build on one node is halted fleet-wide (off: a build can fail
    /// for local reasons, and the failure takes no slot).
    pub halt_on_build_failure: bool,
}

impl Default for RolloutConfig {
    fn default() -> Self {
        Self {
            lock: LockBackend::default(),
            group: None,
            max_concurrent: 1,
            lease_duration: Duration::from_secs(60),
            on_api_unavailable: OnApiUnavailable::default(),
            on_holder_lost: OnHolderLost::default(),
            rollback: RollbackPolicy::default(),
            quorum_guard: true,
            configmap: "ginx-rollout".to_owned(),
            gate: GateConfig::default(),
            fleetlock: None,
            windows: Vec::new(),
            freezes: Vec::new(),
            soak: Duration::from_secs(0),
            after: Vec::new(),
            first: Vec::new(),
            first_selector: None,
            order: None,
            halt_after: 1,
            halt_on_build_failure: false,
        }
    }
}

/// The longest slot Lease name (`ginx-rollout-<group>-<slot>`) is a DNS label's worth.
const MAX_GROUP_LEN: usize = 40;
/// Groups `rollout.after` may name.
const MAX_AFTER: usize = 16;
/// Canaries `rollout.first` may name.
pub const MAX_FIRST: usize = 16;

impl RolloutConfig {
    /// The group, after the role default.
    pub fn group_for(&self, role: crate::types::Role) -> String {
        self.group.clone().unwrap_or_else(|| role.to_string())
    }

    /// The groups this node's group waits for, without its own (a group after itself would
    /// wait for ever: its own nodes are what it rolls through).
    pub fn after_for(&self, role: crate::types::Role) -> Vec<String> {
        let own = self.group_for(role);
        self.after.iter().filter(|g| **g != own).cloned().collect()
    }

    /// The slot Lease's name.
    pub fn slot_lease(group: &str, slot: u32) -> String {
        format!("ginx-rollout-{group}-{slot}")
    }

    pub(super) fn validate(&self, ctx: &Ctx<'_>) -> Result<(), ConfigError> {
        self.check_group(ctx)?;
        bounds::MAX_CONCURRENT.check(ctx, self.max_concurrent)?;
        bounds::ROLLOUT_LEASE_DURATION.check(ctx, self.lease_duration)?;
        bounds::ROLLOUT_SOAK.check(ctx, self.soak)?;
        bounds::HALT_AFTER.check(ctx, self.halt_after)?;
        self.check_after(ctx)?;
        self.check_first(ctx)?;
        if !super::is_dns_subdomain(&self.configmap) {
            return Err(ctx.error(
                "rollout.configmap",
                "must be a valid Kubernetes object name",
            ));
        }
        check_gate(&self.gate, ctx)?;
        self.check_lock(ctx)?;
        super::freeze::validate(&self.freezes, ctx)?;
        super::window::validate(
            &self.windows,
            "rollout.windows",
            &bounds::ROLLOUT_WINDOW_LENGTH,
            ctx,
        )
    }

    /// `rollout.group`: it names the slot Leases, so it must fit in their names.
    fn check_group(&self, ctx: &Ctx<'_>) -> Result<(), ConfigError> {
        if let Some(g) = &self.group
            && (!is_dns_label(g) || g.len() > MAX_GROUP_LEN)
        {
            return Err(ctx.error(
                "rollout.group",
                format!(
                    "{g:?} must be a lowercase DNS label of at most {MAX_GROUP_LEN} characters \
                     (letters, digits, '-'): it names the slot Leases ginx-rollout-<group>-<slot>"
                ),
            ));
        }
        Ok(())
    }

    /// `rollout.after`: a few groups, each a name `rollout.group` could have.
    fn check_after(&self, ctx: &Ctx<'_>) -> Result<(), ConfigError> {
        if self.after.len() > MAX_AFTER {
            return Err(ctx.error(
                "rollout.after",
                format!("names {} groups; at most {MAX_AFTER}", self.after.len()),
            ));
        }
        for (i, g) in self.after.iter().enumerate() {
            if !is_dns_label(g) || g.len() > MAX_GROUP_LEN {
                return Err(ctx.error(
                    &format!("rollout.after[{i}]"),
                    format!(
                        "{g:?} is not a rollout group: a lowercase DNS label of at most \
                         {MAX_GROUP_LEN} characters, like \"control-plane\""
                    ),
                ));
            }
        }
        Ok(())
    }

    /// `rollout.first` and `first_selector`: node names and a selector, with a lock whose
    /// heartbeats say who passed what.
    fn check_first(&self, ctx: &Ctx<'_>) -> Result<(), ConfigError> {
        if self.first.len() > MAX_FIRST {
            return Err(ctx.error(
                "rollout.first",
                format!("names {} nodes; at most {MAX_FIRST}", self.first.len()),
            ));
        }
        for (i, n) in self.first.iter().enumerate() {
            if !super::is_dns_subdomain(n) {
                return Err(ctx.error(
                    &format!("rollout.first[{i}]"),
                    format!(
                        "{n:?} is not a node name (lowercase letters, digits, '-' and '.', each \
                         dot-separated part starting and ending with a letter or digit)"
                    ),
                ));
            }
        }
        if let Some(sel) = &self.first_selector
            && let Err(e) = super::selector::check(sel)
        {
            return Err(ctx.error("rollout.first_selector", e));
        }
        if let Some(o) = &self.order {
            let plain = !o.is_empty()
                && !o.contains([',', '=', '!', ' ', '(', ')'])
                && super::selector::check(o).is_ok();
            if !plain {
                return Err(ctx.error(
                    "rollout.order",
                    format!(
                        "{o:?} is neither \"name\" nor a Node label key like \
                         \"topology.kubernetes.io/zone\""
                    ),
                ));
            }
            if self.lock == LockBackend::None {
                return Err(ctx.error(
                    "rollout.order",
                    "an order needs the cluster's Nodes: set rollout.lock to \"auto\" or \
                     \"kubernetes\", not \"none\"",
                ));
            }
        }
        let canaries = !self.first.is_empty() || self.first_selector.is_some();
        if canaries && self.lock == LockBackend::None {
            let key = if self.first.is_empty() {
                "rollout.first_selector"
            } else {
                "rollout.first"
            };
            return Err(ctx.error(
                key,
                "canaries need the cluster's heartbeats to know what they passed: set \
                 rollout.lock to \"auto\" or \"kubernetes\", not \"none\"",
            ));
        }
        Ok(())
    }

    /// The lock backend: FleetLock needs its table, whose group and machine id must be usable.
    fn check_lock(&self, ctx: &Ctx<'_>) -> Result<(), ConfigError> {
        match (&self.lock, &self.fleetlock) {
            (LockBackend::Fleetlock, None) => {
                return Err(ctx.error(
                    "rollout.lock",
                    "\"fleetlock\" needs [rollout.fleetlock] with the server's url",
                ));
            }
            (_, Some(f)) => {
                if let Some(g) = &f.group
                    && g.trim().is_empty()
                {
                    return Err(ctx.error("rollout.fleetlock.group", "must not be empty"));
                }
                if !f.machine_id.is_absolute() {
                    return Err(
                        ctx.error("rollout.fleetlock.machine_id", "must be an absolute path")
                    );
                }
            }
            _ => {}
        }
        Ok(())
    }
}

/// `rollout.gate`: its durations in bounds, a settle shorter than the timeout, and a command
/// that can run.
fn check_gate(g: &GateConfig, ctx: &Ctx<'_>) -> Result<(), ConfigError> {
    if let Some(p) = &g.prometheus {
        p.validate(ctx)?;
    }
    for (bound, d) in [
        (&bounds::GATE_SETTLE, g.settle),
        (&bounds::GATE_TIMEOUT, g.timeout),
        (&bounds::GATE_INTERVAL, g.interval),
        (&bounds::GATE_COMMAND_TIMEOUT, g.command_timeout),
    ] {
        bound.check(ctx, d)?;
    }
    if g.settle >= g.timeout {
        let (settle, timeout) = ("rollout.gate.settle", "rollout.gate.timeout");
        return Err(if ctx.written(settle) || !ctx.written(timeout) {
            ctx.error(
                settle,
                format!(
                    "must be shorter than {timeout} ({}), or the gate can never pass",
                    ctx.shown(timeout, g.timeout)
                ),
            )
        } else {
            ctx.error(
                timeout,
                format!(
                    "{} is not longer than {settle} ({}), so the gate can never pass; \
                     make it longer, or set {settle} shorter",
                    g.timeout,
                    ctx.shown(settle, g.settle)
                ),
            )
        });
    }
    if let Some(c) = &g.command {
        let Some(program) = c.first().filter(|a| !a.trim().is_empty()) else {
            return Err(ctx.error(
                "rollout.gate.command",
                "must be an argv with a program first, like [\"/etc/ginx/check\"]",
            ));
        };
        if let Err(why) = super::program::find(program) {
            return Err(ctx.error(
                "rollout.gate.command[0]",
                format!(
                    "{why}; a gate command that cannot run fails the baseline too, and the \
                     no-regression gate would then pass without it: give the program's \
                     absolute path, or install it"
                ),
            ));
        }
    }
    Ok(())
}
