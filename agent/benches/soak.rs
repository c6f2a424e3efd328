//! The soak (run: `bench/soak.sh`, or `SOAK_MINUTES=N cargo bench --bench soak`; an hour by
//! default): the real release `ginx` against the real control plane of
//! tests/support/control_plane.rs, with a commit every 10 s, a SIGHUP every minute, the API
//! server restarted every 3 min and ginx SIGKILLed at a random moment of every 5 min. What it
//! checks at the end is in tests/support/soak.rs; it exits 1 when any check fails.

#[path = "../../tests/support/mod.rs"]
mod support;

use support::control_plane::{self, ControlPlane};
use support::soak::{self, Plan};

fn main() {
    let Some(bin) = control_plane::require() else {
        return;
    };
    let plan = Plan::from_env(60.0);
    eprintln!(
        "soak: {:.1} min; set SOAK_MINUTES for another length",
        plan.length.as_secs_f64() / 60.0
    );
    let cp = ControlPlane::start(&bin);
    let report = soak::run(&cp, &plan);
    report.print();
    if !report.problems.is_empty() {
        std::process::exit(1);
    }
}
