//! Change freezes (`[[rollout.freezes]]`) on real ginx daemons whose wall clock libfaketime sets
//! (tests/support/faketime.rs), the monotonic clock untouched: a freeze that covers the clock's
//! now holds every node, with its end in status; once the clock passes the end, they apply by
//! themselves; a freeze that ended holds nothing; a freeze that ends on the night Berlin springs
//! forward ends at 22:00Z, not 23:00Z. Standalone nodes (no cluster, no lock): a freeze is the
//! node's own calendar, asked before any lock.

use crate::support::daemon::Daemon;
use crate::support::{Env, faketime, wait_for};

const FREEZES: &str = r#"
[[rollout.freezes]]
start = "2026-12-01"
end = "2026-12-05"
reason = "an old freeze, over"

[[rollout.freezes]]
start = "2026-12-20"
end = "2027-01-03"
time_zone = "Europe/Berlin"
reason = "year-end change freeze"
"#;

fn frozen(d: &Daemon) -> serde_json::Value {
    d.wait_status("held by the freeze", |s| {
        s["rollout"]["waiting_for"] == "freeze"
    })
}

#[test]
fn a_freeze_holds_every_node_until_its_end_and_one_that_ended_holds_none() {
    if !faketime::available() {
        return;
    }
    let nodes: Vec<(Env, std::path::PathBuf)> = (0..2)
        .map(|_| {
            let env = Env::new();
            env.dropin("80-freezes.toml", FREEZES);
            let clock = env.root.join("faketime");
            (env, clock)
        })
        .collect();
    let daemons: Vec<Daemon> = nodes
        .iter()
        .map(|(env, clock)| faketime::start(env, clock, "@2026-12-24 12:00:00"))
        .collect();
    for ((env, _), d) in nodes.iter().zip(&daemons) {
        let s = frozen(d);
        let f = &s["rollout"]["freeze"];
        assert_eq!(f["active"], true, "{s:#}");
        assert_eq!(f["reason"], "year-end change freeze");
        assert_eq!(f["starts_at"], "2026-12-19T23:00:00Z");
        assert_eq!(
            f["ends_at"], "2027-01-03T23:00:00Z",
            "the end of the 3rd in Berlin"
        );
        let reason = s["rollout"]["reason"].as_str().unwrap();
        assert_eq!(
            reason,
            "inside the change freeze rollout.freezes[1] (\"year-end change freeze\") until \
             2027-01-03T23:00:00Z; nothing new starts, a due reboot neither"
        );
        let text = d.ctl_ok(&["status"]);
        assert!(
            text.contains("freeze     until 2027-01-03T23:00:00Z: year-end change freeze"),
            "{text}"
        );
        assert!(
            env.calls().is_empty(),
            "nothing activated inside the freeze"
        );
    }
    // Three seconds before the end: still frozen; then the clock runs past it and each node
    // applies by itself.
    for (_, clock) in &nodes {
        faketime::set(clock, "@2027-01-03 22:59:57");
    }
    for ((env, _), d) in nodes.iter().zip(&daemons) {
        d.wait_applied(&env.repo.head());
        let s = d.status();
        assert!(s["rollout"]["freeze"].is_null(), "none ahead: {s:#}");
        assert_eq!(env.calls().len(), 1);
        let started: jiff::Timestamp = serde_json::from_str::<serde_json::Value>(
            &d.ctl_ok(&["history", "--json"]),
        )
        .unwrap()["attempts"][0]["started_at"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!(
            started >= "2027-01-03T23:00:00Z".parse().unwrap(),
            "started {started}, inside the freeze"
        );
    }
}

#[test]
fn a_freeze_ending_the_night_clocks_spring_forward_ends_at_the_local_midnight() {
    if !faketime::available() {
        return;
    }
    let env = Env::new();
    env.dropin(
        "80-freezes.toml",
        "[[rollout.freezes]]\nstart = \"2026-03-28\"\nend = \"2026-03-29\"\n\
         time_zone = \"Europe/Berlin\"\nreason = \"DST weekend\"\n",
    );
    let clock = env.root.join("faketime");
    // 21:59:50Z on the 29th is 23:59:50 CEST: ten seconds before the freeze ends (at 23:00Z
    // it would have, had the day been 24 hours long).
    let d = faketime::start(&env, &clock, "@2026-03-29 21:59:50");
    let s = frozen(&d);
    assert_eq!(
        s["rollout"]["freeze"]["ends_at"], "2026-03-29T22:00:00Z",
        "{s:#}"
    );
    d.wait_applied(&env.repo.head());
    let history: serde_json::Value =
        serde_json::from_str(&d.ctl_ok(&["history", "--json"])).unwrap();
    let started: jiff::Timestamp = history["attempts"][0]["started_at"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let end: jiff::Timestamp = "2026-03-29T22:00:00Z".parse().unwrap();
    assert!(started >= end, "started {started}");
    assert!(
        started < end + jiff::SignedDuration::from_mins(30),
        "started {started}: an hour late would be a 24-hour day"
    );
    wait_for("the status without a freeze", || {
        d.status()["rollout"]["freeze"].is_null().then_some(())
    });
}
