//! The guards that must ask the cluster or a peer before they answer: the groups a group comes
//! after, canaries, the order through a group, the control-plane quorum, the etcd guard, the
//! alert gate's Prometheus query, and the health gate's evidence. Each reads, then answers
//! through the pure decisions of [`decide`](super::decide).

pub mod after;
pub mod alerts;
pub mod canary;
pub mod etcd;
pub mod evidence;
pub mod order;
pub mod quorum;
