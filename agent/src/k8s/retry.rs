//! [`replace_with_retry`]: read an object, let the caller change it, write it back on the
//! `resourceVersion` read (or create it when it is missing), and on a conflict start again
//! from a fresh read, a bounded number of times. Every object ginx updates in place goes
//! through it, so every write is a compare-and-swap and no caller writes its own loop.

use std::fmt::Debug;
use std::time::Instant;

use kube::Api;
use kube::api::Patch;
use kube::core::Resource;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::ApiError;
use super::{code, patch_params, post_params};

/// Tries of a read-modify-replace before the object is said to keep changing.
pub const MAX_CONFLICT_RETRIES: usize = 5;

/// What the caller's edit decided, given the object as read (`None`: it does not exist).
pub enum Edit<K, T> {
    /// Write nothing; answer `T`.
    Keep(T),
    /// Write this object (a replace of the one read, or a create when there was none), then
    /// answer `T`.
    Write(K, T),
    /// Merge-patch the object read with this, carrying the `resourceVersion` read (so it is a
    /// compare-and-swap too), then answer `T`: for an object whose whole body this identity
    /// must not send back (a Node, written with the node's own identity).
    Patch(serde_json::Value, T),
}

/// Why a read-modify-replace failed.
#[derive(Debug)]
pub enum EditError<E> {
    /// A request failed.
    Api(ApiError),
    /// The edit itself refused the object (the caller's reason).
    Edit(E),
}

/// The answer, and the object as the server wrote it with when the request was sent and
/// answered (to learn the server's clock from), when something was written.
pub struct Written<K, T> {
    pub value: T,
    pub object: Option<(K, Instant, Instant)>,
}

/// Reads `name` (or starts from `cached`, the object as last written, once), lets `edit` decide,
/// writes conditionally, and retries on 409 (someone else wrote it) and on a replace's 404
/// (deleted meanwhile) from a fresh read: so `edit` may run more than once. `resource` names the object
/// in messages ("Lease ginx-lucy in namespace ginx-system").
pub async fn replace_with_retry<K, T, E>(
    api: &Api<K>,
    name: &str,
    resource: &str,
    mut cached: Option<K>,
    mut edit: impl FnMut(Option<K>) -> Result<Edit<K, T>, E>,
) -> Result<Written<K, T>, EditError<E>>
where
    K: Resource + Clone + DeserializeOwned + Serialize + Debug,
{
    for _ in 0..MAX_CONFLICT_RETRIES {
        let (read, existed) = match cached.take() {
            Some(k) => (Some(k), true),
            None => {
                let read = api
                    .get_opt(name)
                    .await
                    .map_err(|e| EditError::Api(ApiError::new("get", resource, &e)))?;
                let existed = read.is_some();
                (read, existed)
            }
        };
        let version = read
            .as_ref()
            .and_then(|k| k.meta().resource_version.clone());
        let sent = Instant::now();
        let (verb, value, result) = match edit(read).map_err(EditError::Edit)? {
            Edit::Keep(value) => {
                return Ok(Written {
                    value,
                    object: None,
                });
            }
            Edit::Write(object, value) if existed => {
                let r = api.replace(name, &post_params(), &object).await;
                ("update", value, r)
            }
            Edit::Write(object, value) => {
                ("create", value, api.create(&post_params(), &object).await)
            }
            Edit::Patch(mut patch, value) => {
                if let Some(meta) = patch
                    .as_object_mut()
                    .map(|p| p.entry("metadata").or_insert_with(|| serde_json::json!({})))
                    .and_then(serde_json::Value::as_object_mut)
                {
                    meta.insert("resourceVersion".into(), serde_json::json!(version));
                }
                let r = api
                    .patch(name, &patch_params(), &Patch::Merge(&patch))
                    .await;
                ("patch", value, r)
            }
        };
        match result {
            Ok(written) => {
                return Ok(Written {
                    value,
                    object: Some((written, sent, Instant::now())),
                });
            }
            // A stale resourceVersion, created by someone else meanwhile (409), or deleted
            // meanwhile (404 on a replace): read again and apply the change to what is there
            // now. A 404 on a create is the namespace missing: no retry mends that.
            Err(e) if code(&e) == Some(409) || (existed && code(&e) == Some(404)) => {}
            Err(e) => return Err(EditError::Api(ApiError::new(verb, resource, &e))),
        }
    }
    Err(EditError::Api(ApiError::Conflict {
        resource: resource.to_owned(),
        tries: MAX_CONFLICT_RETRIES,
    }))
}
