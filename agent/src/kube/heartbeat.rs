//! The heartbeat Lease `ginx-<node>`: created when missing, renewed with optimistic concurrency
//! on `resourceVersion` (the cached object is PUT back; a 409 means someone else wrote it, so
//! it is read again and the renewal retried, a bounded number of times, as the kubelet's node
//! lease controller does).

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Api;

use crate::types::api::{ServerClock, code};

use crate::types::api::{
    HEARTBEAT_GROUP_LABEL as GROUP_LABEL, HEARTBEAT_PASSED_ANNOTATION as PASSED_ANNOTATION,
};

/// Renewal attempts per tick when the Lease keeps changing under us.
pub const MAX_CONFLICT_RETRIES: usize = 5;

pub struct Heartbeat {
    api: Api<Lease>,
    name: String,
    holder: String,
    duration_seconds: i32,
    /// The Lease as last written; its resourceVersion makes the next PUT conditional.
    cached: Option<Lease>,
    /// The API server's clock, learned from each write and written in.
    clock: ServerClock,
    /// The node's rollout group and the last revision whose gate passed on it, written on the
    /// Lease ([`GROUP_LABEL`], [`PASSED_ANNOTATION`]).
    marks: (String, Option<String>),
}

/// Why a renewal failed.
#[derive(Debug)]
pub enum RenewError {
    Api(kube::Error),
    /// The Lease changed under us on every try.
    Conflicts,
}

impl Heartbeat {
    pub fn new(
        api: Api<Lease>,
        name: String,
        holder: String,
        duration_seconds: i32,
        clock: ServerClock,
    ) -> Self {
        Self {
            api,
            name,
            holder,
            duration_seconds,
            cached: None,
            clock,
            marks: (String::new(), None),
        }
    }

    /// Sets what the Lease says of the node's rollout (written with the next renewal); returns
    /// whether it changed.
    pub fn set_marks(&mut self, group: &str, passed: Option<&str>) -> bool {
        let next = (group.to_owned(), passed.map(str::to_owned));
        let changed = next != self.marks;
        self.marks = next;
        changed
    }

    fn mark(&self, meta: &mut ObjectMeta) {
        let (group, passed) = &self.marks;
        if !group.is_empty() {
            meta.labels
                .get_or_insert_with(Default::default)
                .insert(GROUP_LABEL.to_owned(), group.clone());
        }
        let a = meta.annotations.get_or_insert_with(Default::default);
        match passed {
            Some(p) => {
                a.insert(PASSED_ANNOTATION.to_owned(), p.clone());
            }
            None => {
                a.remove(PASSED_ANNOTATION);
            }
        }
    }

    /// Writes `renewTime = now`; one PUT per call in the steady state.
    pub async fn renew(&mut self) -> Result<(), RenewError> {
        for _ in 0..MAX_CONFLICT_RETRIES {
            let now = MicroTime(self.clock.now());
            let mut lease = match self.cached.take() {
                Some(l) => l,
                None => match self
                    .api
                    .get_opt(&self.name)
                    .await
                    .map_err(RenewError::Api)?
                {
                    Some(l) => l,
                    None => {
                        let mut fresh = Lease {
                            metadata: ObjectMeta {
                                name: Some(self.name.clone()),
                                ..ObjectMeta::default()
                            },
                            spec: Some(LeaseSpec {
                                holder_identity: Some(self.holder.clone()),
                                lease_duration_seconds: Some(self.duration_seconds),
                                acquire_time: Some(now.clone()),
                                renew_time: Some(now),
                                ..LeaseSpec::default()
                            }),
                        };
                        self.mark(&mut fresh.metadata);
                        let sent = std::time::Instant::now();
                        match self
                            .api
                            .create(&crate::types::api::post_params(), &fresh)
                            .await
                        {
                            Ok(l) => {
                                self.clock
                                    .learn(&l.metadata, sent, std::time::Instant::now());
                                self.cached = Some(l);
                                return Ok(());
                            }
                            // Created by someone else meanwhile: read it and renew that.
                            Err(e) if code(&e) == Some(409) => continue,
                            Err(e) => return Err(RenewError::Api(e)),
                        }
                    }
                },
            };
            let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
            if spec.holder_identity.as_deref() != Some(self.holder.as_str()) {
                spec.acquire_time = Some(now.clone());
            }
            spec.holder_identity = Some(self.holder.clone());
            spec.lease_duration_seconds = Some(self.duration_seconds);
            spec.renew_time = Some(now);
            self.mark(&mut lease.metadata);
            let sent = std::time::Instant::now();
            match self
                .api
                .replace(&self.name, &crate::types::api::post_params(), &lease)
                .await
            {
                Ok(l) => {
                    self.clock
                        .learn(&l.metadata, sent, std::time::Instant::now());
                    self.cached = Some(l);
                    return Ok(());
                }
                // Stale resourceVersion, or deleted meanwhile: read again and retry.
                Err(e) if matches!(code(&e), Some(409 | 404)) => {}
                Err(e) => return Err(RenewError::Api(e)),
            }
        }
        Err(RenewError::Conflicts)
    }

    /// Forget the cached object (after the API went away, it may be stale).
    pub fn forget(&mut self) {
        self.cached = None;
    }
}
