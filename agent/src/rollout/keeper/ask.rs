//! The admission loop: [`Gatekeeper::decide`] asks `decide/admission.rs` what to do, does the I/O it
//! asks for (the quorum and etcd guards, Prometheus, an owed halt) or looks at the read model
//! (the fleet state, the `rollout.after` groups, canaries, order), records the answers and asks
//! again, until admission answers or says to take the lock.

use super::*;
use crate::rollout::decide::admission::{Answer, Ask, Facts, Next, Owed};
use crate::rollout::guards::{self, canary, order};
use crate::rollout::view::Snapshot;

impl Gatekeeper {
    /// Admission's loop: ask, do what it asks, record what came of it, ask again; then take
    /// the lock when it says so.
    pub(crate) async fn decide(
        &mut self,
        revision: &Revision,
        held_in_state: bool,
        purpose: Purpose,
    ) -> Permit {
        let cfg = self.cfg();
        self.wait_until = None;
        let backend = effective(&cfg);
        let clients = match backend {
            Effective::None | Effective::Bootstrap => None,
            Effective::Kubernetes | Effective::Fleetlock => self.clients(),
        };
        let group = cfg.rollout.group_for(cfg.node.role);
        let mut learned = Learned {
            // Admission judges the fleet state as read before the take; what this ask writes
            // itself (an owed halt) is seen by the read after the take.
            fleet: self.fleet.state.clone(),
            ..Learned::default()
        };
        loop {
            let after_pending = self
                .after
                .pending(&cfg.rollout.after_for(cfg.node.role), revision);
            let canary_pending = self.canaries.pending(&cfg, revision);
            if let Some(c) = &clients {
                self.watch_for_guards(&cfg, c, after_pending, canary_pending);
            }
            let (windows, windows_key) = windows_for(&cfg, purpose);
            let ask = Ask {
                revision,
                purpose,
                backend,
                cluster: has_cluster(&cfg),
                connected: clients.is_some(),
                held_in_state,
                own_slot: self.locker.seen(),
                node: cfg.node_name(),
                group: &group,
                quorum_guard: cfg.node.role == Role::ControlPlane && cfg.rollout.quorum_guard,
                etcd_guard: cfg.etcd.applies(cfg.node.role),
                alerts: cfg.rollout.gate.prometheus.is_some() && backend != Effective::Bootstrap,
                after_pending,
                canary_pending,
                ordered: cfg.rollout.order.is_some(),
                freezes: &cfg.rollout.freezes,
                windows,
                windows_key,
                on_api_unavailable: cfg.rollout.on_api_unavailable,
            };
            let verdict = match admission::next(&ask, &learned.as_facts(), util::now()) {
                Next::Answer(v) => v,
                Next::Take => {
                    let permit = self
                        .take(&cfg, revision, held_in_state, purpose, clients)
                        .await;
                    if matches!(permit, Permit::Granted(_)) {
                        self.view.stop_guards();
                    }
                    return permit;
                }
                step => match self
                    .learn(step, &cfg, clients.as_ref(), revision, &mut learned)
                    .await
                {
                    Ok(()) => continue,
                    Err(v) => v,
                },
            };
            if !matches!(verdict, Verdict::Wait(_)) {
                self.view.stop_guards();
            }
            return self.answer(verdict, backend, revision);
        }
    }

    /// Keeps the read model's watches the pending guards read: the heartbeats for the `after`
    /// groups and canaries, the Nodes for the quorum guard, the order and a canary selector.
    fn watch_for_guards(&mut self, cfg: &Config, c: &KubeClients, after: bool, canaries: bool) {
        let quorum = cfg.node.role == Role::ControlPlane && cfg.rollout.quorum_guard;
        let nodes = quorum
            || cfg.rollout.order.is_some()
            || (canaries && cfg.rollout.first_selector.is_some());
        let generation = self.clients_generation;
        self.view
            .watch_guards((after || canaries, nodes), cfg, c, generation);
    }

    /// Does what admission asked for and records what came of it; `Err` with the verdict
    /// when the read or write failed.
    async fn learn(
        &mut self,
        step: Next,
        cfg: &Config,
        clients: Option<&KubeClients>,
        revision: &Revision,
        learned: &mut Learned,
    ) -> Result<(), Verdict> {
        let policy = cfg.rollout.on_api_unavailable;
        match (step, clients) {
            (Next::ReadFleet, Some(c)) => {
                let watched = self.view.snapshot().fleet_state(&cfg.rollout.configmap);
                self.fleet.before_take(cfg, c, watched).await?;
                learned.fleet_read = true;
                learned.fleet = self.fleet.state.clone();
            }
            (Next::CheckQuorum, Some(c)) => {
                let snapshot = self.view.listed().await;
                let answer = match snapshot.nodes.current() {
                    Ok(nodes) => crate::rollout::guards::quorum::check(c, cfg, Some(nodes))
                        .await
                        .map_or_else(Answer::from, Answer::from),
                    Err(e) => guards::unread("the Nodes (quorum guard)", e),
                };
                learned.quorum = Some(answer);
            }
            (Next::CheckEtcd, _) => {
                let answer = self.etcd.check(&cfg.etcd, &self.w.notices, revision).await;
                learned.etcd = Some(answer.into());
            }
            (Next::CheckAlerts, _) => {
                let answer = match &cfg.rollout.gate.prometheus {
                    Some(p) => self.alerts.check(p, revision).await,
                    None => None,
                };
                learned.alerts = Some(answer.into());
            }
            (Next::WriteOwedHalt, _) => {
                learned.owed_halt = self
                    .pay_owed_halt(revision)
                    .await
                    .map_err(|e| admission::lock_error(policy, e))?;
            }
            (step @ (Next::CheckAfter | Next::CheckCanaries | Next::CheckOrder), Some(_)) => {
                let snapshot = self.view.listed().await;
                let later = self.later_of(&snapshot, cfg, revision).await;
                self.judge(step, cfg, &snapshot, &later, revision, learned);
            }
            // Admission asks for a read only when connected, and answers or takes itself.
            (
                Next::ReadFleet
                | Next::CheckQuorum
                | Next::CheckAfter
                | Next::CheckCanaries
                | Next::CheckOrder,
                None,
            )
            | (Next::Answer(_) | Next::Take, _) => {
                let why = "no connection to the Kubernetes API".to_owned();
                return Err(admission::unavailable(policy, why));
            }
        }
        Ok(())
    }

    /// Answers a guard of the read model (`rollout.after`, canaries, order) from `snapshot`,
    /// purely, and records the answer: the guard's, or why the part it reads cannot be read.
    fn judge(
        &mut self,
        step: Next,
        cfg: &Config,
        snapshot: &Snapshot,
        later: &BTreeSet<Revision>,
        revision: &Revision,
        learned: &mut Learned,
    ) {
        let fleet = learned.fleet.as_ref();
        let nodes_needed = step == Next::CheckOrder
            || (step == Next::CheckCanaries && cfg.rollout.first_selector.is_some());
        let empty = BTreeMap::new();
        let groups = cfg.rollout.after_for(cfg.node.role);
        let nodes = match snapshot.nodes.current() {
            Ok(n) => Ok(n),
            Err(_) if !nodes_needed => Ok(&empty),
            Err(e) => Err(guards::unread("the Nodes", e)),
        };
        let heartbeats = snapshot.heartbeats.current().map_err(|e| {
            let what = match step {
                Next::CheckAfter => format!(
                    "the heartbeats of group(s) {} (rollout.after)",
                    groups.join(", ")
                ),
                _ => "the canaries' heartbeats".to_owned(),
            };
            guards::unread(&what, e)
        });
        let slot = match step {
            Next::CheckAfter => &mut learned.after,
            Next::CheckCanaries => &mut learned.canaries,
            _ => &mut learned.order,
        };
        let answer = match (step, nodes, heartbeats) {
            (Next::CheckOrder, Ok(nodes), _) => {
                order::check(cfg, nodes, fleet, revision, later, util::now()).into()
            }
            (Next::CheckAfter, _, Ok(heartbeats)) => self
                .after
                .check(heartbeats, &groups, revision, later)
                .into(),
            (_, Ok(nodes), Ok(heartbeats)) => {
                let seen = canary::Seen {
                    heartbeats,
                    nodes,
                    fleet,
                    later,
                    now: std::time::Instant::now(),
                    wall: util::now(),
                };
                self.canaries.check(cfg, &seen, revision).into()
            }
            (Next::CheckOrder, Err(unread), _) | (_, Err(unread), _) | (_, _, Err(unread)) => {
                unread
            }
        };
        *slot = Some(answer);
    }

    /// The revisions the snapshot's heartbeats and Nodes passed that are later than
    /// `revision`, as the apply source's clone answers.
    async fn later_of(
        &mut self,
        snapshot: &Snapshot,
        cfg: &Config,
        revision: &Revision,
    ) -> BTreeSet<Revision> {
        let prefix = &cfg.kubernetes.annotation_prefix;
        let passed: BTreeSet<Revision> = snapshot
            .heartbeats
            .objects
            .values()
            .filter_map(|h| h.passed.clone())
            .chain(
                snapshot
                    .nodes
                    .objects
                    .values()
                    .filter_map(|n| n.annotation(prefix, "passed-revision")?.parse().ok()),
            )
            .filter(|p| p != revision)
            .collect();
        let mut out = BTreeSet::new();
        for p in passed {
            let pair = (p.clone(), revision.clone());
            let known = self.later_known.contains(&pair);
            let later = match (&self.w.later, known) {
                (_, true) => true,
                (Some(later), false) => later(p.clone(), revision.clone()).await,
                (None, false) => false,
            };
            if later {
                if self.later_known.len() >= LATER_KNOWN {
                    self.later_known.clear();
                }
                self.later_known.insert(pair);
                out.insert(p);
            }
        }
        out
    }

    /// A verdict as the reconciler takes it, with what it means for the wake-ups and the
    /// journal.
    pub(crate) fn answer(
        &mut self,
        verdict: Verdict,
        backend: Effective,
        revision: &Revision,
    ) -> Permit {
        self.tell_held(&verdict, revision);
        match verdict {
            Verdict::Go(held) => {
                if backend == Effective::Bootstrap && !self.bootstrap_logged {
                    self.bootstrap_logged = true;
                    tracing::info!(
                        "no cluster yet (no kubeconfig): applying without the rollout lock (bootstrap)"
                    );
                }
                Permit::Granted(held)
            }
            Verdict::GoWithoutApi(why) => {
                tracing::warn!(reason = %why, "the Kubernetes API is unavailable; applying without the rollout lock (rollout.on_api_unavailable = \"proceed\")");
                Permit::Granted(None)
            }
            Verdict::Wait(w) => {
                self.wait_until = w.until;
                Permit::Wait(w.waiting_for, w.reason)
            }
        }
    }
}

impl Gatekeeper {
    /// An operator's hold that starts keeping this node back is told once (the journal, the
    /// `Held` Event and notice), not at every look while it lasts.
    fn tell_held(&mut self, verdict: &Verdict, revision: &Revision) {
        let held = match verdict {
            Verdict::Wait(w) if w.waiting_for == WaitingFor::Held => Some(&w.reason),
            _ => None,
        };
        if let Some(why) = held.filter(|_| self.held_told.starts(true)) {
            tracing::info!(revision = %revision.short(), reason = %why,
                "an operator's hold keeps this node out of the rollout");
            self.w
                .notices
                .emit(Reason::Held, Some(revision.as_str()), why.clone());
        }
        self.held_told.starts(held.is_some());
    }
}

/// At most this many "later" answers are remembered (then forgotten at once and asked again).
const LATER_KNOWN: usize = 4096;

/// What admission learned during one ask.
#[derive(Default)]
struct Learned {
    fleet_read: bool,
    fleet: Option<FleetState>,
    quorum: Option<Answer>,
    etcd: Option<Answer>,
    alerts: Option<Answer>,
    owed_halt: Owed,
    after: Option<Answer>,
    canaries: Option<Answer>,
    order: Option<Answer>,
}

impl Learned {
    fn as_facts(&self) -> Facts<'_> {
        Facts {
            fleet_read: self.fleet_read,
            fleet: self.fleet.as_ref(),
            quorum: self.quorum.clone(),
            etcd: self.etcd.clone(),
            alerts: self.alerts.clone(),
            owed_halt: self.owed_halt,
            after: self.after.clone(),
            canaries: self.canaries.clone(),
            order: self.order.clone(),
        }
    }
}

/// The windows that gate `purpose`, and the key they come from.
fn windows_for(cfg: &Config, purpose: Purpose) -> (&[crate::config::Window], &'static str) {
    match purpose {
        Purpose::Apply => (&cfg.rollout.windows[..], "rollout.windows"),
        Purpose::Reboot if cfg.reboot.windows.is_some() => {
            (cfg.reboot.windows(&cfg.rollout), "reboot.windows")
        }
        Purpose::Reboot => (cfg.reboot.windows(&cfg.rollout), "rollout.windows"),
    }
}
