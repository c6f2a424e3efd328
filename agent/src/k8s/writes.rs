//! How ginx writes: under its own field manager, which the API server stamps with each write's
//! time (the admission policies and [`ServerClock`](super::ServerClock) read it).

/// The field manager of every write ginx makes: the API server stamps each write's time in
/// `managedFields` under it, which the admission policies read as the server's clock.
pub const FIELD_MANAGER: &str = "ginx";

/// `PostParams` with ginx's field manager.
pub fn post_params() -> kube::api::PostParams {
    kube::api::PostParams {
        dry_run: false,
        field_manager: Some(FIELD_MANAGER.to_owned()),
    }
}

/// `PatchParams` (merge and strategic patches) with ginx's field manager.
pub fn patch_params() -> kube::api::PatchParams {
    kube::api::PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..kube::api::PatchParams::default()
    }
}
