//! The control socket and the metrics exposition: protocol types shared by the daemon and
//! `ginxctl`, the socket server, the client, and `GET /metrics`. Both servers only read
//! `Status` (and the metric families); the socket sends commands down channels.
//!
//! Above every worker and `reconcile`; only `daemon` and `cli` import it.

pub mod client;
pub mod metrics;
pub mod protocol;
pub mod server;
