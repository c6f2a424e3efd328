//! etcd as the guard of a control-plane rollout sees it: the members, each one's raft status,
//! the alarms, and moving the leadership. The decisions are pure functions of a [`View`]
//! (`view.rs`); `client.rs` and `observe.rs` do the requests.
//!
//! Spoken over etcd's v3 JSON gateway (`POST /v3/...` on the client port), not gRPC: it is the
//! same API, served by every member on the port kubeadm's health-check certificate already
//! reaches, and ginx talks HTTPS with reqwest and rustls already. gRPC would add tonic, prost
//! and generated code for five calls.
//!
//! A layer below the workers, as `k8s` is: the rollout's guard and the health probe both ask it.

mod client;
mod observe;
mod view;
mod wire;

pub use client::{Client, EtcdError, RequestError};
pub use observe::{HandOver, Leadership, Unfit, hand_over, observe};
pub use view::{Member, Status, View, hex};
