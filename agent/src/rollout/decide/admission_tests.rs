//! Admission's table: every wait it answers with and every step it asks for, each from the
//! smallest situation that reaches it.

use super::*;
use crate::config::{ClockTime, Day};
use crate::rollout::fleet::holds::Hold;
use crate::rollout::fleet::state::{Halt, Pause};

fn rev(c: char) -> Revision {
    std::iter::repeat_n(c, 40)
        .collect::<String>()
        .parse()
        .unwrap()
}

fn t(s: &str) -> Timestamp {
    s.parse().unwrap()
}

/// A Monday, 12:00 UTC.
const NOON: &str = "2026-11-30T12:00:00Z";

fn monday_night() -> Vec<Window> {
    vec![Window {
        days: vec![Day::Mon],
        weeks: Vec::new(),
        dates: Vec::new(),
        start: ClockTime::try_from("02:00".to_owned()).unwrap(),
        length: crate::config::Duration::from_secs(3600),
        time_zone: "UTC".into(),
    }]
}

fn held(r: &Revision) -> TakenSlot {
    TakenSlot {
        backend: crate::state::SlotBackend::Kubernetes,
        group: "workers".into(),
        slot: Some(0),
        revision: r.clone(),
        since: t(NOON),
    }
}

fn halt(r: &Revision, cause: HaltCause, group: Option<&str>) -> Halt {
    Halt {
        revision: r.clone(),
        node: "makise".into(),
        probes: BTreeMap::new(),
        reason: "why".into(),
        at: t(NOON),
        cause,
        group: group.map(str::to_owned),
    }
}

/// A worker of a cluster, connected, asking to apply, with nothing held and no windows.
fn ask(r: &Revision) -> Ask<'_> {
    Ask {
        revision: r,
        purpose: Purpose::Apply,
        backend: Effective::Kubernetes,
        cluster: true,
        connected: true,
        held_in_state: false,
        own_slot: OwnSlot::None,
        node: "w3",
        group: "workers",
        quorum_guard: false,
        etcd_guard: false,
        alerts: false,
        after_pending: false,
        canary_pending: false,
        ordered: false,
        freezes: &[],
        windows: &[],
        windows_key: "rollout.windows",
        on_api_unavailable: OnApiUnavailable::Wait,
    }
}

fn read(fleet: &FleetState) -> Facts<'_> {
    Facts {
        fleet_read: true,
        fleet: Some(fleet),
        ..Facts::default()
    }
}

fn waits_for(n: &Next) -> Option<WaitingFor> {
    match n {
        Next::Answer(Verdict::Wait(w)) => Some(w.waiting_for),
        _ => None,
    }
}

/// One of each step admission asks for (the answers are each wait's, below).
fn every_step() -> Vec<Next> {
    vec![
        Next::ReadFleet,
        Next::CheckQuorum,
        Next::CheckEtcd,
        Next::CheckAlerts,
        Next::WriteOwedHalt,
        Next::CheckAfter,
        Next::CheckCanaries,
        Next::CheckOrder,
        Next::Take,
        Next::Answer(Verdict::Go(None)),
    ]
}

/// The case of the table that reaches `step`. No wildcard: a new step does not compile until
/// a case is named for it here and in [`every_step`], and the table test checks that the case
/// reaches it.
fn case_of_step(step: &Next) -> &'static str {
    match step {
        Next::ReadFleet => "no cluster read yet",
        Next::CheckQuorum => "quorum not asked yet",
        Next::CheckEtcd => "etcd not asked yet",
        Next::CheckAlerts => "alerts not asked yet",
        Next::WriteOwedHalt => "a halt owed",
        Next::CheckAfter => "after groups not asked yet",
        Next::CheckCanaries => "canaries not asked yet",
        Next::CheckOrder => "order not asked yet",
        Next::Take => "everything passed",
        Next::Answer(Verdict::Go(Some(_))) => "the slot is held",
        Next::Answer(Verdict::Go(None)) => "no lock configured",
        Next::Answer(Verdict::GoWithoutApi(_)) => "proceeding without the API",
        Next::Answer(Verdict::Wait(w)) => case_of_wait(w.waiting_for).unwrap_or("none"),
    }
}

/// The case of the table that answers with the wait `w`; `None` for the waits that are not
/// admission's (the reconciler's suspend and reboot, the drain's pods) or that the lock
/// answers with (checked after the table). No wildcard: a new wait does not compile until it is
/// named here, and every wait of [`WaitingFor::ALL`] is checked.
fn case_of_wait(w: WaitingFor) -> Option<&'static str> {
    Some(match w {
        WaitingFor::Suspended | WaitingFor::Pods | WaitingFor::Reboot => return None,
        WaitingFor::Lock | WaitingFor::Soak | WaitingFor::Refused => return None,
        WaitingFor::Paused => "paused",
        WaitingFor::Halted => "halted",
        WaitingFor::Quorum => "quorum lacking",
        WaitingFor::Api => "no client yet",
        WaitingFor::Window => "outside the windows",
        WaitingFor::After => "after groups behind",
        WaitingFor::Etcd => "etcd unfit",
        WaitingFor::Held => "held",
        WaitingFor::Freeze => "frozen",
        WaitingFor::Alerts => "alerts fire",
        WaitingFor::Canary => "canaries not passed",
        WaitingFor::Order => "nodes ahead in the order",
    })
}

#[test]
fn every_wait_and_every_step_is_reached() {
    let r = rev('a');
    let empty = FleetState::default();
    let now = t(NOON);
    let windows = monday_night();
    let paused = FleetState {
        paused: Some(Pause {
            by: "ops@desk".into(),
            at: now,
        }),
        ..FleetState::default()
    };
    let mut halted = FleetState::default();
    halted
        .halted
        .insert(r.to_string(), halt(&r, HaltCause::GateFailed, None));
    let mut vanished = FleetState::default();
    let other = rev('b');
    vanished.halted.insert(
        other.to_string(),
        halt(&other, HaltCause::HolderVanished, Some("workers")),
    );
    let h = held(&r);
    let held_w3 = holding_w3(Some("2026-11-30T18:00:00Z"));

    let freezes = [crate::config::Freeze {
        start: crate::config::CivilPoint::try_from("2026-11-30".to_owned()).unwrap(),
        end: crate::config::CivilPoint::try_from("2026-12-01".to_owned()).unwrap(),
        time_zone: "Europe/Berlin".into(),
        reason: "release week".into(),
    }];

    type Case<'a> = (&'a str, Ask<'a>, Facts<'a>, Next);
    let wait = |w: WaitingFor| Next::Answer(Verdict::wait(w, String::new()));
    let cases: Vec<Case<'_>> = vec![
        (
            "no cluster read yet",
            ask(&r),
            Facts::default(),
            Next::ReadFleet,
        ),
        (
            "no client yet",
            Ask {
                connected: false,
                ..ask(&r)
            },
            Facts::default(),
            wait(WaitingFor::Api),
        ),
        ("paused", ask(&r), read(&paused), wait(WaitingFor::Paused)),
        ("halted", ask(&r), read(&halted), wait(WaitingFor::Halted)),
        ("held", ask(&r), read(&held_w3), wait(WaitingFor::Held)),
        (
            "held, for a reboot",
            Ask {
                purpose: Purpose::Reboot,
                ..ask(&r)
            },
            read(&held_w3),
            wait(WaitingFor::Held),
        ),
        (
            "a holder of the group vanished",
            ask(&r),
            read(&vanished),
            wait(WaitingFor::Halted),
        ),
        (
            "outside the windows",
            Ask {
                windows: &windows,
                ..ask(&r)
            },
            read(&empty),
            wait(WaitingFor::Window),
        ),
        (
            "quorum not asked yet",
            Ask {
                quorum_guard: true,
                ..ask(&r)
            },
            read(&empty),
            Next::CheckQuorum,
        ),
        (
            "quorum lacking",
            Ask {
                quorum_guard: true,
                ..ask(&r)
            },
            Facts {
                quorum: Some(Answer::Wait("lucy is not Ready".into())),
                ..read(&empty)
            },
            wait(WaitingFor::Quorum),
        ),
        (
            "etcd not asked yet",
            Ask {
                etcd_guard: true,
                ..ask(&r)
            },
            read(&empty),
            Next::CheckEtcd,
        ),
        (
            "etcd not asked yet, without the API",
            Ask {
                etcd_guard: true,
                backend: Effective::Fleetlock,
                cluster: false,
                connected: false,
                ..ask(&r)
            },
            Facts::default(),
            Next::CheckEtcd,
        ),
        (
            "etcd asked without the API under \"proceed\"",
            Ask {
                etcd_guard: true,
                connected: false,
                on_api_unavailable: OnApiUnavailable::Proceed,
                ..ask(&r)
            },
            Facts::default(),
            Next::CheckEtcd,
        ),
        (
            "etcd holds without the API under \"proceed\"",
            Ask {
                etcd_guard: true,
                connected: false,
                on_api_unavailable: OnApiUnavailable::Proceed,
                ..ask(&r)
            },
            Facts {
                etcd: Some(Answer::Wait(
                    "etcd: etcd at https://127.0.0.1:2379 (refused)".into(),
                )),
                ..Facts::default()
            },
            wait(WaitingFor::Etcd),
        ),
        (
            "etcd asked without a lock",
            Ask {
                etcd_guard: true,
                backend: Effective::None,
                ..ask(&r)
            },
            Facts::default(),
            Next::CheckEtcd,
        ),
        (
            "etcd passed without a lock",
            Ask {
                etcd_guard: true,
                backend: Effective::None,
                ..ask(&r)
            },
            Facts {
                etcd: Some(Answer::Go),
                ..Facts::default()
            },
            Next::Answer(Verdict::Go(None)),
        ),
        (
            "etcd asked after the quorum",
            Ask {
                quorum_guard: true,
                etcd_guard: true,
                ..ask(&r)
            },
            Facts {
                quorum: Some(Answer::Go),
                ..read(&empty)
            },
            Next::CheckEtcd,
        ),
        (
            "etcd unfit",
            Ask {
                etcd_guard: true,
                ..ask(&r)
            },
            Facts {
                etcd: Some(Answer::Wait("etcd: quinn has the alarm NOSPACE".into())),
                ..read(&empty)
            },
            wait(WaitingFor::Etcd),
        ),
        (
            "etcd passed: the lock is taken",
            Ask {
                etcd_guard: true,
                ..ask(&r)
            },
            Facts {
                etcd: Some(Answer::Go),
                ..read(&empty)
            },
            Next::Take,
        ),
        (
            "a halt owed",
            ask(&r),
            Facts {
                owed_halt: Owed::Pending,
                ..read(&empty)
            },
            Next::WriteOwedHalt,
        ),
        (
            "the owed halt was of this revision",
            ask(&r),
            Facts {
                owed_halt: Owed::Written { halts_this: true },
                ..read(&empty)
            },
            wait(WaitingFor::Halted),
        ),
        (
            "the slot is held",
            Ask {
                own_slot: OwnSlot::Live(&h),
                ..ask(&r)
            },
            read(&empty),
            Next::Answer(Verdict::Go(Some(h.clone()))),
        ),
        (
            "after groups not asked yet",
            Ask {
                after_pending: true,
                ..ask(&r)
            },
            read(&empty),
            Next::CheckAfter,
        ),
        (
            "after groups behind",
            Ask {
                after_pending: true,
                ..ask(&r)
            },
            Facts {
                after: Some(Answer::Wait("lucy passed nothing yet".into())),
                ..read(&empty)
            },
            wait(WaitingFor::After),
        ),
        (
            "alerts not asked yet",
            Ask {
                alerts: true,
                ..ask(&r)
            },
            read(&empty),
            Next::CheckAlerts,
        ),
        (
            "alerts fire",
            Ask {
                alerts: true,
                ..ask(&r)
            },
            Facts {
                alerts: Some(Answer::Wait("NodeDown fires".into())),
                ..read(&empty)
            },
            wait(WaitingFor::Alerts),
        ),
        (
            "canaries not asked yet",
            Ask {
                canary_pending: true,
                ..ask(&r)
            },
            read(&empty),
            Next::CheckCanaries,
        ),
        (
            "canaries not passed",
            Ask {
                canary_pending: true,
                ..ask(&r)
            },
            Facts {
                canaries: Some(Answer::Wait("canary w1 has not passed it".into())),
                ..read(&empty)
            },
            wait(WaitingFor::Canary),
        ),
        (
            "order not asked yet",
            Ask {
                ordered: true,
                ..ask(&r)
            },
            read(&empty),
            Next::CheckOrder,
        ),
        (
            "nodes ahead in the order",
            Ask {
                ordered: true,
                ..ask(&r)
            },
            Facts {
                order: Some(Answer::Wait("w1 and w2 come first".into())),
                ..read(&empty)
            },
            wait(WaitingFor::Order),
        ),
        (
            "frozen",
            Ask {
                freezes: &freezes,
                ..ask(&r)
            },
            read(&empty),
            wait(WaitingFor::Freeze),
        ),
        ("everything passed", ask(&r), read(&empty), Next::Take),
        (
            "no lock configured",
            Ask {
                backend: Effective::None,
                ..ask(&r)
            },
            Facts::default(),
            Next::Answer(Verdict::Go(None)),
        ),
        (
            "bootstrap outside the windows",
            Ask {
                backend: Effective::Bootstrap,
                windows: &windows,
                ..ask(&r)
            },
            Facts::default(),
            wait(WaitingFor::Window),
        ),
        (
            "proceeding without the API",
            Ask {
                connected: false,
                on_api_unavailable: OnApiUnavailable::Proceed,
                ..ask(&r)
            },
            Facts::default(),
            Next::Answer(Verdict::GoWithoutApi(String::new())),
        ),
    ];
    let mut answered: BTreeMap<&str, Next> = BTreeMap::new();
    for (name, ask, facts, want) in cases {
        let got = next(&ask, &facts, now);
        answered.insert(name, next(&ask, &facts, now));
        match (&got, &want) {
            (Next::Answer(Verdict::Wait(_)), Next::Answer(Verdict::Wait(_))) => {
                assert_eq!(waits_for(&got), waits_for(&want), "{name}: {got:?}");
            }
            (Next::Answer(Verdict::GoWithoutApi(_)), Next::Answer(Verdict::GoWithoutApi(_))) => {}
            _ => assert_eq!(got, want, "{name}"),
        }
    }
    // Every step and every wait admission can answer with is reached by a case named for it.
    let reached = |case: &str| {
        answered
            .get(case)
            .unwrap_or_else(|| panic!("no case {case:?} in the table"))
    };
    for step in every_step() {
        let got = reached(case_of_step(&step));
        assert_eq!(
            std::mem::discriminant(got),
            std::mem::discriminant(&step),
            "{step:?}"
        );
    }
    for w in WaitingFor::ALL {
        if let Some(case) = case_of_wait(w) {
            assert_eq!(waits_for(reached(case)), Some(w), "{case}");
        }
    }
    // The waits the lock itself answers with.
    let soak = soaking(&r, "makise", "5m", Duration::from_secs(42));
    let full = busy("workers", 1, &BTreeMap::from([(0, "makise".to_owned())]));
    let refused_by_server = refused_lock("423 Locked".into());
    let refused_by_api = refused("the API refused get".into());
    for (v, w) in [
        (soak, WaitingFor::Soak),
        (full, WaitingFor::Lock),
        (refused_by_server, WaitingFor::Lock),
        (refused_by_api, WaitingFor::Refused),
    ] {
        assert_eq!(waits_for(&Next::Answer(v)), Some(w));
    }
}

#[test]
fn a_window_wait_says_when_the_next_opens_and_ends_then() {
    let r = rev('a');
    let windows = monday_night();
    let a = Ask {
        windows: &windows,
        ..ask(&r)
    };
    let Next::Answer(Verdict::Wait(w)) = next(&a, &read(&FleetState::default()), t(NOON)) else {
        panic!("not a wait");
    };
    assert_eq!(w.until, Some(t("2026-12-07T02:00:00Z")));
    assert!(
        w.reason.contains("the next opens at 2026-12-07T02:00:00Z"),
        "{}",
        w.reason
    );
    // Inside the window, nothing waits.
    let inside = next(&a, &read(&FleetState::default()), t("2026-11-30T02:30:00Z"));
    assert_eq!(inside, Next::Take);
}

#[test]
fn an_apply_under_way_passes_windows_and_quorum_but_a_reboot_passes_only_the_quorum() {
    let r = rev('a');
    let windows = monday_night();
    let fleet = FleetState::default();
    let resumed = Ask {
        held_in_state: true,
        windows: &windows,
        quorum_guard: true,
        ..ask(&r)
    };
    assert_eq!(next(&resumed, &read(&fleet), t(NOON)), Next::Take);
    let reboot = Ask {
        purpose: Purpose::Reboot,
        windows_key: "reboot.windows",
        ..resumed.clone()
    };
    let Next::Answer(Verdict::Wait(w)) = next(&reboot, &read(&fleet), t(NOON)) else {
        panic!("a reboot outside its windows must wait");
    };
    assert!(w.reason.contains("reboot.windows"), "{}", w.reason);
    let inside = t("2026-11-30T02:30:00Z");
    assert_eq!(next(&reboot, &read(&fleet), inside), Next::CheckQuorum);
}

/// An operator's hold on w3 (placed at noon, until `until`).
fn holding_w3(until: Option<&str>) -> FleetState {
    FleetState {
        holds: BTreeMap::from([(
            "w3".to_owned(),
            Hold {
                by: "ann".into(),
                at: t(NOON),
                reason: "disk failing".into(),
                until: until.map(t),
            },
        )]),
        ..FleetState::default()
    }
}

#[test]
fn a_hold_keeps_its_node_out_until_it_lapses_and_lets_its_own_slot_finish() {
    let r = rev('a');
    let now = t(NOON);
    let fleet = holding_w3(Some("2026-11-30T18:00:00Z"));
    let Next::Answer(Verdict::Wait(w)) = next(&ask(&r), &read(&fleet), now) else {
        panic!("a held node goes on");
    };
    assert_eq!(w.waiting_for, WaitingFor::Held);
    assert_eq!(
        w.until,
        Some(t("2026-11-30T18:00:00Z")),
        "wakes when it lapses"
    );
    assert_eq!(
        w.reason,
        "held by ann since 2026-11-30T12:00:00Z (disk failing) until 2026-11-30T18:00:00Z: \
         nothing new starts here; `ginxctl release w3` lifts it"
    );
    // Lapsed: nothing holds.
    let later = t("2026-11-30T18:00:00Z");
    assert_eq!(next(&ask(&r), &read(&fleet), later), Next::Take);
    // Another node is not held by w3's hold.
    let other = Ask {
        node: "w1",
        ..ask(&r)
    };
    assert_eq!(next(&other, &read(&fleet), now), Next::Take);
    // A slot it holds finishes what it started, the reboot kept under its apply's slot too.
    let h = held(&r);
    for purpose in [Purpose::Apply, Purpose::Reboot] {
        let resuming = Ask {
            purpose,
            own_slot: OwnSlot::Live(&h),
            ..ask(&r)
        };
        assert_eq!(
            next(&resuming, &read(&fleet), now),
            Next::Answer(Verdict::Go(Some(h.clone()))),
            "{purpose:?}"
        );
    }
    // Without an until it holds for good, and the pause is named first.
    let forever = holding_w3(None);
    let Next::Answer(Verdict::Wait(w)) = next(&ask(&r), &read(&forever), t("2099-01-01T00:00:00Z"))
    else {
        panic!("a hold without until lapsed");
    };
    assert_eq!(w.until, None);
    assert!(w.reason.contains("until `ginxctl release`"), "{}", w.reason);
    let both = FleetState {
        paused: Some(Pause {
            by: "ops@desk".into(),
            at: now,
        }),
        ..forever
    };
    assert_eq!(
        waits_for(&next(&ask(&r), &read(&both), now)),
        Some(WaitingFor::Paused)
    );
}

#[test]
fn a_freeze_holds_applies_and_reboots_until_it_ends_but_not_an_apply_under_way() {
    let r = rev('a');
    let empty = FleetState::default();
    let freezes = [crate::config::Freeze {
        start: crate::config::CivilPoint::try_from("2026-11-30".to_owned()).unwrap(),
        end: crate::config::CivilPoint::try_from("2026-12-01".to_owned()).unwrap(),
        time_zone: "Europe/Berlin".into(),
        reason: "release week".into(),
    }];
    let frozen = Ask {
        freezes: &freezes,
        ..ask(&r)
    };
    let Next::Answer(Verdict::Wait(w)) = next(&frozen, &read(&empty), t(NOON)) else {
        panic!("a frozen node goes on");
    };
    assert_eq!(w.waiting_for, WaitingFor::Freeze);
    assert_eq!(
        w.until,
        Some(t("2026-12-01T23:00:00Z")),
        "wakes when it ends"
    );
    assert_eq!(
        w.reason,
        "inside the change freeze rollout.freezes[0] (\"release week\") until \
         2026-12-01T23:00:00Z; nothing new starts, a due reboot neither"
    );
    assert_eq!(
        next(&frozen, &read(&empty), t("2026-12-01T23:00:00Z")),
        Next::Take
    );
    // Before the cluster and without a lock too.
    for backend in [Effective::Bootstrap, Effective::None] {
        let a = Ask {
            backend,
            ..frozen.clone()
        };
        assert_eq!(
            waits_for(&next(&a, &Facts::default(), t(NOON))),
            Some(WaitingFor::Freeze)
        );
    }
    // An apply under its slot finishes; a reboot, even with the slot kept since its apply,
    // waits.
    let h = held(&r);
    let resuming = Ask {
        own_slot: OwnSlot::Live(&h),
        ..frozen.clone()
    };
    assert_eq!(
        next(&resuming, &read(&empty), t(NOON)),
        Next::Answer(Verdict::Go(Some(h.clone())))
    );
    let reboot = Ask {
        purpose: Purpose::Reboot,
        ..resuming
    };
    assert_eq!(
        waits_for(&next(&reboot, &read(&empty), t(NOON))),
        Some(WaitingFor::Freeze)
    );
}

#[test]
fn the_alert_gate_is_asked_before_a_slot_and_its_answer_holds_or_lets_go() {
    let r = rev('a');
    let empty = FleetState::default();
    let now = t(NOON);
    let gated = Ask {
        alerts: true,
        ..ask(&r)
    };
    assert_eq!(next(&gated, &read(&empty), now), Next::CheckAlerts);
    let firing = Facts {
        alerts: Some(Answer::Wait("1 alert(s) fire".into())),
        ..read(&empty)
    };
    assert_eq!(
        waits_for(&next(&gated, &firing, now)),
        Some(WaitingFor::Alerts)
    );
    let quiet = Facts {
        alerts: Some(Answer::Go),
        ..read(&empty)
    };
    assert_eq!(next(&gated, &quiet, now), Next::Take);
    // After the quorum and etcd guards.
    let guarded = Ask {
        etcd_guard: true,
        ..gated.clone()
    };
    assert_eq!(next(&guarded, &read(&empty), now), Next::CheckEtcd);
    // Without a lock too; an apply under its slot is not asked again, a reboot is.
    let unlocked = Ask {
        backend: Effective::None,
        ..gated.clone()
    };
    assert_eq!(next(&unlocked, &Facts::default(), now), Next::CheckAlerts);
    let h = held(&r);
    let resuming = Ask {
        own_slot: OwnSlot::Live(&h),
        ..gated.clone()
    };
    assert_eq!(
        next(&resuming, &read(&empty), now),
        Next::Answer(Verdict::Go(Some(h.clone())))
    );
    let reboot = Ask {
        purpose: Purpose::Reboot,
        ..resuming
    };
    assert_eq!(next(&reboot, &read(&empty), now), Next::CheckAlerts);
}

#[test]
fn canaries_are_asked_last_for_an_apply_and_their_answer_holds_or_lets_go() {
    let r = rev('a');
    let empty = FleetState::default();
    let now = t(NOON);
    let follower = Ask {
        canary_pending: true,
        ..ask(&r)
    };
    assert_eq!(next(&follower, &read(&empty), now), Next::CheckCanaries);
    // After the groups of rollout.after.
    let after = Ask {
        after_pending: true,
        ..follower.clone()
    };
    assert_eq!(next(&after, &read(&empty), now), Next::CheckAfter);
    let behind = Facts {
        canaries: Some(Answer::Wait("canary w3 has not passed".into())),
        ..read(&empty)
    };
    assert_eq!(
        waits_for(&next(&follower, &behind, now)),
        Some(WaitingFor::Canary)
    );
    let passed = Facts {
        canaries: Some(Answer::Go),
        ..read(&empty)
    };
    assert_eq!(next(&follower, &passed, now), Next::Take);
    // A reboot, and an apply resumed after a restart, are not held by canaries.
    let reboot = Ask {
        purpose: Purpose::Reboot,
        ..follower.clone()
    };
    assert_eq!(next(&reboot, &read(&empty), now), Next::Take);
    let resumed = Ask {
        held_in_state: true,
        ..follower.clone()
    };
    assert_ne!(next(&resumed, &read(&empty), now), Next::CheckCanaries);
    // rollout.order is asked after the canaries.
    let ordered = Ask {
        ordered: true,
        ..follower
    };
    assert_eq!(next(&ordered, &passed, now), Next::CheckOrder);
    let turn = Facts {
        order: Some(Answer::Wait("w1 comes before".into())),
        ..passed.clone()
    };
    assert_eq!(
        waits_for(&next(&ordered, &turn, now)),
        Some(WaitingFor::Order)
    );
    let go = Facts {
        order: Some(Answer::Go),
        ..passed
    };
    assert_eq!(next(&ordered, &go, now), Next::Take);
}

#[test]
fn a_halt_holds_back_applies_only_and_a_vanished_holder_not_its_own_resumed_slot() {
    let r = rev('a');
    let mut fleet = FleetState::default();
    fleet
        .halted
        .insert(r.to_string(), halt(&r, HaltCause::BuildFailed, None));
    let reason = |v: Option<Verdict>| match v {
        Some(Verdict::Wait(w)) => w.reason,
        other => panic!("{other:?}"),
    };
    let whom = |group, resuming_own| Whom {
        node: "w3",
        group,
        resuming_own,
    };
    let now = t(NOON);
    let why = reason(held_back(
        &fleet,
        &r,
        Purpose::Apply,
        &whom("workers", false),
        now,
    ));
    assert!(why.contains("failed to build on makise"), "{why}");
    assert!(held_back(&fleet, &r, Purpose::Reboot, &whom("workers", false), now).is_none());
    let other = rev('b');
    let mut vanished = FleetState::default();
    vanished.halted.insert(
        other.to_string(),
        halt(&other, HaltCause::HolderVanished, Some("workers")),
    );
    assert!(held_back(&vanished, &r, Purpose::Apply, &whom("workers", true), now).is_none());
    assert!(
        held_back(
            &vanished,
            &r,
            Purpose::Apply,
            &whom("control-plane", false),
            now
        )
        .is_none()
    );
    let why = reason(held_back(
        &vanished,
        &r,
        Purpose::Apply,
        &whom("workers", false),
        now,
    ));
    assert!(why.contains("group workers"), "{why}");
}

#[test]
fn the_api_policy_waits_or_goes_on_and_a_refusal_always_waits() {
    let wait = unavailable(OnApiUnavailable::Wait, "timed out".into());
    assert!(
        matches!(&wait, Verdict::Wait(w) if w.waiting_for == WaitingFor::Api && w.reason.starts_with("timed out"))
    );
    assert_eq!(
        unavailable(OnApiUnavailable::Proceed, "timed out".into()),
        Verdict::GoWithoutApi("timed out".into())
    );
    assert!(
        matches!(refused("403".into()), Verdict::Wait(w) if w.waiting_for == WaitingFor::Refused)
    );
}

#[test]
fn a_lost_slot_is_taken_again_not_granted() {
    let r = rev('a');
    let fleet = FleetState::default();
    let lost = Ask {
        own_slot: OwnSlot::Lost,
        ..ask(&r)
    };
    assert_eq!(next(&lost, &read(&fleet), t(NOON)), Next::Take);
}

#[test]
fn busy_says_whether_the_slots_are_full_or_the_races_were_lost() {
    let one = BTreeMap::from([(0, "makise".to_owned())]);
    let text = |v: Verdict| match v {
        Verdict::Wait(w) => w.reason,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        text(busy("workers", 1, &one)),
        "all 1 slot(s) of group workers are held: slot 0 by makise"
    );
    assert!(text(busy("workers", 2, &one)).starts_with("other nodes won every race"));
    assert!(
        text(soaking(
            &rev('a'),
            "lucy",
            "5m",
            Duration::from_millis(1500)
        ))
        .ends_with("2s to go")
    );
}

#[test]
fn an_apply_under_way_is_not_asked_of_etcd_again_but_a_reboot_is() {
    let r = rev('a');
    let fleet = FleetState::default();
    let resumed = Ask {
        held_in_state: true,
        etcd_guard: true,
        ..ask(&r)
    };
    assert_ne!(next(&resumed, &read(&fleet), t(NOON)), Next::CheckEtcd);
    let reboot = Ask {
        purpose: Purpose::Reboot,
        ..resumed
    };
    assert_eq!(next(&reboot, &read(&fleet), t(NOON)), Next::CheckEtcd);
}

/// A refusal of the lock's or the fleet state's writes waits, whatever `on_api_unavailable`
/// says: only an API that does not answer may be gone past.
#[test]
fn a_refused_lock_write_waits_even_where_an_unavailable_api_is_gone_past() {
    for policy in [OnApiUnavailable::Wait, OnApiUnavailable::Proceed] {
        let v = lock_error(policy, LockError::Refused("403 forbidden".into()));
        assert!(
            matches!(&v, Verdict::Wait(w) if w.waiting_for == WaitingFor::Refused),
            "{policy:?}: {v:?}"
        );
    }
    let v = lock_error(
        OnApiUnavailable::Proceed,
        LockError::Unavailable("connection refused".into()),
    );
    assert!(!matches!(v, Verdict::Wait(_)), "{v:?}");
}

/// Every guard's answer that the API refused it waits as refused even under
/// `on_api_unavailable = "proceed"`; one that could not be asked goes on without the API there,
/// waits under `"wait"`, and never goes on before etcd's look on a node with the etcd guard.
#[test]
fn a_guard_refused_waits_and_one_unasked_follows_the_api_policy_after_etcd() {
    let r = rev('a');
    let fleet = FleetState::default();
    let passed = Some(Answer::Go);
    // Each guard on, every guard before it passed, its own answer `a`.
    type Case = (
        &'static str,
        fn(&mut Ask<'_>),
        fn(&mut Facts<'_>, Option<Answer>),
    );
    let cases: [Case; 6] = [
        ("quorum", |a| a.quorum_guard = true, |f, a| f.quorum = a),
        ("etcd", |a| a.etcd_guard = true, |f, a| f.etcd = a),
        ("alerts", |a| a.alerts = true, |f, a| f.alerts = a),
        ("after", |a| a.after_pending = true, |f, a| f.after = a),
        (
            "canaries",
            |a| a.canary_pending = true,
            |f, a| f.canaries = a,
        ),
        ("order", |a| a.ordered = true, |f, a| f.order = a),
    ];
    for (name, on, answer) in cases {
        for policy in [OnApiUnavailable::Proceed, OnApiUnavailable::Wait] {
            let mut a = Ask {
                on_api_unavailable: policy,
                ..ask(&r)
            };
            on(&mut a);
            let mut f = read(&fleet);
            answer(&mut f, Some(Answer::Refused("403 forbidden".into())));
            let n = next(&a, &f, t(NOON));
            assert_eq!(
                waits_for(&n),
                Some(WaitingFor::Refused),
                "{name} {policy:?}: {n:?}"
            );
            answer(&mut f, Some(Answer::Unavailable("timed out".into())));
            let n = next(&a, &f, t(NOON));
            match policy {
                OnApiUnavailable::Proceed => {
                    assert!(
                        matches!(n, Next::Answer(Verdict::GoWithoutApi(_))),
                        "{name}: {n:?}"
                    )
                }
                OnApiUnavailable::Wait => {
                    assert_eq!(waits_for(&n), Some(WaitingFor::Api), "{name}: {n:?}")
                }
            }
        }
    }
    // The quorum guard unasked, on a node whose etcd has not been looked at: etcd first.
    let a = Ask {
        on_api_unavailable: OnApiUnavailable::Proceed,
        quorum_guard: true,
        etcd_guard: true,
        ..ask(&r)
    };
    let f = Facts {
        quorum: Some(Answer::Unavailable("timed out".into())),
        ..read(&fleet)
    };
    assert_eq!(next(&a, &f, t(NOON)), Next::CheckEtcd);
    let f = Facts { etcd: passed, ..f };
    assert!(matches!(
        next(&a, &f, t(NOON)),
        Next::Answer(Verdict::GoWithoutApi(_))
    ));
}
