//! The soak of tests/support/soak.rs, five minutes of it, in every run of the suite (and so in
//! CI): commits every 10 s, a SIGHUP a minute, the API server restarted at 3 min, ginx
//! SIGKILLed once at a random moment. `bench/soak.sh` runs the same for an hour.

use crate::support::control_plane::{self, ControlPlane};
use crate::support::soak::{self, Plan};

#[test]
fn five_minutes_of_commits_reloads_api_restarts_and_kills_leave_ginx_consistent() {
    let Some(bin) = control_plane::require() else {
        return;
    };
    // A control plane of its own: its API server is restarted.
    let cp = ControlPlane::start(&bin);
    let minutes = std::env::var("SOAK_TEST_MINUTES")
        .ok()
        .and_then(|m| m.parse().ok())
        .unwrap_or(5.0);
    let plan = Plan::minutes(minutes);
    let report = soak::run(&cp, &plan);
    report.print();
    assert!(report.problems.is_empty(), "{:#?}", report.problems);
    // The faults happened, and ginx kept applying through them.
    assert!(
        report.kills >= 1 || minutes < 5.0,
        "no SIGKILL in {minutes} min"
    );
    assert!(report.api_restarts >= 1 || minutes < 3.0);
    assert_eq!(report.heartbeat_back.len(), report.api_restarts);
    assert!(report.applies >= 2, "only {} applies", report.applies);
    assert!(report.state_files_checked > report.kills);
}
