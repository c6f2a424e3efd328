//! The Kubernetes API as ginx uses it, below every worker: the clients the daemon hands out
//! ([`KubeClients`]) and the server's clock they write in ([`ServerClock`]), how an API error is
//! told apart
//! ([`ApiError`]: unavailable, refused, refused by a policy, a conflict that did not settle),
//! the one read-modify-replace loop every object ginx updates goes through
//! ([`replace_with_retry`]), the reflector that keeps a watched set of objects for readers and
//! wakes whoever waits on them ([`reflect`]), and the heartbeat Lease's one owner
//! ([`heartbeat`]).
//!
//! Must not import a worker: workers import it. Holds no client of its own; callers pass the
//! `Api` they were handed.

mod clients;
mod clock;
mod error;
pub mod heartbeat;
pub mod reflect;
mod retry;
mod writes;

pub use clients::{CORDONED_BY, ClientError, KubeClients, NotReady, readyz};
pub use clock::ServerClock;
pub use error::{ApiError, by_policy, code, describe, refusal, unavailable};
pub use heartbeat::{HEARTBEAT_GROUP_LABEL, HEARTBEAT_PASSED_ANNOTATION};
pub use reflect::{WATCH_SECONDS, watch_objects};
pub use retry::{Edit, EditError, MAX_CONFLICT_RETRIES, Written, replace_with_retry};
pub use writes::{FIELD_MANAGER, patch_params, post_params};
