//! The heartbeat Lease `ginx-<node>`: created when missing, renewed with optimistic concurrency
//! on `resourceVersion` (the cached object is PUT back; a 409 means someone else wrote it, so
//! it is read again and the renewal retried, a bounded number of times, as the kubelet's node
//! lease controller does).

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Api;

use crate::types::api::{ServerClock, code};

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
                        let fresh = Lease {
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
