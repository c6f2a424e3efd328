//! The admission loop: [`Gatekeeper::decide`] asks `decide/admission.rs` what to do, does the I/O it
//! asks for (the fleet state, the quorum and etcd guards, an owed halt, the `rollout.after` groups),
//! records the answers and asks again, until admission answers or says to take the lock.

use super::*;
use crate::rollout::decide::admission::{Ask, Facts, Next, Owed};

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
                    return self
                        .take(&cfg, revision, held_in_state, purpose, clients)
                        .await;
                }
                step => match self
                    .learn(step, &cfg, clients.as_ref(), revision, &mut learned)
                    .await
                {
                    Ok(()) => continue,
                    Err(v) => v,
                },
            };
            return self.answer(verdict, backend, revision);
        }
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
                self.fleet
                    .watch(cfg, c, self.clients_generation, &self.changes_tx);
                self.fleet.before_take(cfg, c).await?;
                learned.fleet_read = true;
                learned.fleet = self.fleet.state.clone();
            }
            (Next::CheckQuorum, Some(c)) => {
                let answer = crate::rollout::guards::quorum::check(c, cfg)
                    .await
                    .map_err(|e| admission::lock_error(policy, e))?;
                learned.quorum = Some(answer);
            }
            (Next::CheckEtcd, _) => {
                let answer = self.etcd.check(&cfg.etcd, &self.w.notices, revision).await;
                learned.etcd = Some(answer);
            }
            (Next::CheckAlerts, _) => {
                let answer = match &cfg.rollout.gate.prometheus {
                    Some(p) => self.alerts.check(p, revision).await,
                    None => None,
                };
                learned.alerts = Some(answer);
            }
            (Next::WriteOwedHalt, _) => {
                learned.owed_halt = self
                    .pay_owed_halt(revision)
                    .await
                    .map_err(|e| admission::lock_error(policy, e))?;
            }
            (Next::CheckAfter, Some(c)) => {
                let later = self.w.later.clone();
                let wake = (self.clients_generation, &self.changes_tx);
                let behind = self
                    .after
                    .check(cfg, c, revision, later.as_ref(), wake)
                    .await?;
                learned.after = Some(behind);
            }
            (Next::CheckCanaries, Some(c)) => {
                let later = self.w.later.clone();
                let wake = (self.clients_generation, &self.changes_tx);
                let fleet = learned.fleet.as_ref();
                let why = self
                    .canaries
                    .check(cfg, c, fleet, revision, later.as_ref(), wake)
                    .await?;
                learned.canaries = Some(why);
            }
            (Next::CheckOrder, Some(c)) => {
                let later = self.w.later.clone();
                let fleet = learned.fleet.as_ref();
                let why =
                    crate::rollout::guards::order::check(cfg, c, fleet, revision, later.as_ref())
                        .await?;
                learned.order = Some(why);
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

/// What admission learned during one ask.
#[derive(Default)]
struct Learned {
    fleet_read: bool,
    fleet: Option<FleetState>,
    quorum: Option<Option<String>>,
    etcd: Option<Option<String>>,
    alerts: Option<Option<String>>,
    owed_halt: Owed,
    after: Option<Option<String>>,
    canaries: Option<Option<String>>,
    order: Option<Option<String>>,
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
