//! The control socket: protocol types shared by the daemon and `ginxctl`, the server, and the
//! client.

pub mod client;
pub mod protocol;
pub mod server;

pub use protocol::Status;
