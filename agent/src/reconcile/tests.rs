//! The loop's promise to status: every wait, every drain and slot transition, and every
//! attempt given up is published the moment it is made, by whichever branch made it, not at
//! the next turn of the loop (which may be a recheck or a whole put-off away). A reconciler
//! is built on a state directory of its own, with no cluster; its transitions are driven
//! directly, on fixed times, and status is read from the watch it publishes to without the
//! loop running.

use std::sync::Arc;

use tokio::sync::{mpsc, watch};

use super::*;
use crate::metrics::Metrics;
use crate::state::{ApplyDrain, TakenSlot};
use crate::status::HealthMap;
use crate::types::Notices;

fn t(s: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + s).unwrap()
}

fn rev(c: char) -> Revision {
    c.to_string().repeat(40).parse().unwrap()
}

/// A slot held under a FleetLock whose configuration is gone: given back without a request,
/// so that the release path runs here without a server.
fn held(slot: u32) -> TakenSlot {
    TakenSlot {
        backend: crate::state::SlotBackend::Fleetlock,
        group: "workers".into(),
        slot: Some(slot),
        revision: rev('a'),
        since: t(0),
    }
}

/// A reconciler over `dir` with `state` on disk, and the receiving end of what it publishes.
fn reconciler(dir: &std::path::Path, state: &State) -> (Reconciler, watch::Receiver<Published>) {
    let cfg = Config {
        state_dir: dir.to_path_buf(),
        ..Config::default()
    };
    let mut state = state.clone();
    crate::state::Document::set_version(&mut state);
    crate::state::save(&dir.join("state.json"), &state).unwrap();
    let (_config_tx, config) = watch::channel(Arc::new(cfg));
    let (_kube_tx, kube) = watch::channel(None);
    let (_health_tx, health) = watch::channel(HealthMap::new());
    let (fast_probes, _) = watch::channel(None);
    let (published, rx) = watch::channel(Published::default());
    let (_commands_tx, commands) = mpsc::channel(1);
    let (_shutdown_tx, shutdown) = watch::channel(false);
    let (restart, _) = watch::channel(None);
    let (_sources_tx, sources) = watch::channel(Default::default());
    let metrics = Metrics::new();
    let r = Reconciler::new(Wiring {
        metrics: Arc::clone(&metrics),
        notices: Notices::disabled(),
        config: config.clone(),
        sources,
        workspace: crate::source::Workspace::new(dir.to_path_buf()),
        commands,
        published,
        shutdown,
        restart,
        rollout: crate::rollout::Wiring {
            config,
            kube: kube.clone(),
            health,
            fast_probes,
            reach_source: None,
            metrics,
            observed: Arc::default(),
            later: None,
            notices: Notices::disabled(),
            fleet: crate::rollout::view::FleetFeed::idle(),
        },
        kube,
    })
    .unwrap();
    (r, rx)
}

/// What was published since the last look, or a failure naming what should have been.
fn fresh(rx: &mut watch::Receiver<Published>, what: &str) -> Published {
    assert!(rx.has_changed().unwrap(), "{what}: not published at once");
    rx.borrow_and_update().clone()
}

#[test]
fn every_wait_of_the_apply_and_of_the_reboot_is_published_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let (mut r, mut rx) = reconciler(dir.path(), &State::default());
    rx.mark_unchanged();
    for w in WaitingFor::ALL {
        let why = format!("because of {}", w.as_str());
        r.set_wait(Some((w, why.clone())));
        let p = fresh(&mut rx, w.as_str());
        assert_eq!(p.rollout.waiting_for, Some(w));
        assert_eq!(p.rollout.reason.as_deref(), Some(why.as_str()));
        // The metric and the Node's annotation are read from this.
        assert_eq!(p.rollout.waiting(), Some(w));
        r.set_wait(None);
        assert_eq!(fresh(&mut rx, "the wait's end").rollout.waiting_for, None);

        r.set_reboot_waiting(Some((w, why.clone())));
        let p = fresh(&mut rx, &format!("the reboot's {}", w.as_str()));
        assert_eq!(p.rollout.reboot.waiting_for.as_deref(), Some(w.as_str()));
        assert_eq!(p.rollout.reboot.reason.as_deref(), Some(why.as_str()));
        assert_eq!(p.rollout.waiting(), Some(w));
        r.set_reboot_waiting(None);
        assert_eq!(
            fresh(&mut rx, "the reboot's wait's end").rollout.waiting(),
            None
        );
    }
    // The same wait again changes nothing and wakes nobody.
    r.set_wait(Some((WaitingFor::Etcd, "same".into())));
    rx.mark_unchanged();
    r.set_wait(Some((WaitingFor::Etcd, "same".into())));
    assert!(!rx.has_changed().unwrap());
}

#[test]
fn every_drain_and_slot_transition_is_published_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let (mut r, mut rx) = reconciler(dir.path(), &State::default());
    rx.mark_unchanged();
    let a = rev('a');
    r.transition(|c| c.lock_granted(Some(held(1)))).unwrap();
    assert_eq!(fresh(&mut rx, "the slot taken").rollout.slot, Some(1));

    // The drain before a live activation, step by step.
    r.transition(|c| c.begin_apply_drain(&a, vec!["containerd".into()], t(1)))
        .unwrap();
    let d = fresh(&mut rx, "the drain begun").apply.drain.unwrap();
    assert!(!d.cordoned && d.drained_at.is_none());
    r.transition(|c| c.apply_drain_cordoned(true)).unwrap();
    assert!(fresh(&mut rx, "cordoned").apply.drain.unwrap().cordoned);
    r.transition(|c| c.apply_drained(t(5))).unwrap();
    assert_eq!(
        fresh(&mut rx, "drained").apply.drain.unwrap().drained_at,
        Some(t(5))
    );
    r.transition(|c| c.apply_drain_activated()).unwrap();
    assert!(fresh(&mut rx, "activated").apply.drain.unwrap().activated);
    r.transition(|c| c.end_apply_drain()).unwrap();
    assert_eq!(fresh(&mut rx, "the drain ended").apply.drain, None);

    // A reboot's drain.
    r.transition(|c| c.begin_reboot(None, vec!["kernel".into()], t(10)))
        .unwrap();
    let p = fresh(&mut rx, "the reboot begun");
    assert_eq!(p.rollout.reboot.phase.as_deref(), Some("draining"));
    r.transition(|c| c.reboot_cordoned(true, t(11))).unwrap();
    assert!(
        fresh(&mut rx, "the reboot's cordon")
            .rollout
            .reboot
            .cordoned
    );
    r.transition(|c| c.reboot_drained(t(12))).unwrap();
    // Drained is not shown on its own; the state file has it at once all the same.
    let _ = rx.borrow_and_update();
    r.transition(|c| c.drain_given_up(t(100), "given up".into()))
        .unwrap();
    let p = fresh(&mut rx, "the reboot put off");
    assert_eq!(p.rollout.reboot.phase, None);
    assert_eq!(p.rollout.reboot.deferred_until, Some(t(100)));

    r.transition(|c| c.lock_released()).unwrap();
    assert_eq!(fresh(&mut rx, "the slot released").rollout.slot, None);
}

/// The settle that releases a slot nothing needs any more publishes it too.
#[tokio::test]
async fn a_slot_settled_is_published_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let st = State {
        rollout_held: Some(held(2)),
        ..State::default()
    };
    let (mut r, mut rx) = reconciler(dir.path(), &st);
    r.publish();
    assert_eq!(rx.borrow_and_update().rollout.slot, Some(2));
    r.settle_lock(&Decision::Idle).await;
    assert_eq!(fresh(&mut rx, "the slot settled").rollout.slot, None);
}

/// A node holding slot 0 and drained at `at` for a live activation of `a`.
fn drained_under_slot(a: &Revision, at: Timestamp) -> State {
    State {
        rollout_held: Some(held(0)),
        phase: crate::state::Phase {
            disrupting: crate::state::Disrupting::LiveDrain(ApplyDrain {
                revision: a.clone(),
                because: vec!["containerd".into()],
                started_at: at,
                cordoned: false,
                drained_at: Some(at),
                activated: false,
            }),
            ..Default::default()
        },
        ..State::default()
    }
}

/// An activation the last look holds past `reboot.guard_timeout` gives everything back at
/// once, before its put-off: the drain's record (and cordon) and the slot, published.
#[tokio::test]
async fn an_activation_held_too_long_at_the_last_look_gives_the_slot_back_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let a = rev('a');
    // Drained an hour ago: past the default guard_timeout of 10 minutes.
    let st = drained_under_slot(&a, util::now() - jiff::SignedDuration::from_hours(1));
    let (mut r, mut rx) = reconciler(dir.path(), &st);
    rx.mark_unchanged();
    let (what, why) = r
        .held_before_activation(
            &a,
            (WaitingFor::Etcd, "etcd: makise does not answer".into()),
        )
        .await;
    assert_eq!(what, WaitingFor::Etcd);
    assert!(
        why.starts_with(
            "activation put off: the guards did not let the drained node go down within 10m"
        ) && why.contains("etcd: makise does not answer"),
        "{why}"
    );
    let p = fresh(&mut rx, "the attempt given up");
    assert_eq!(
        p.rollout.slot, None,
        "the slot is given back before the put-off"
    );
    assert_eq!(p.apply.drain, None, "and the node");
    assert!(r.core.state().rollout_held.is_none());
    assert_eq!(
        r.live_drain.put_off(&a).map(|(w, _)| w),
        Some(WaitingFor::Etcd)
    );
}

/// The same held for less than `reboot.guard_timeout` keeps its slot and its drain.
#[tokio::test]
async fn an_activation_held_briefly_at_the_last_look_keeps_its_slot_and_drain() {
    let dir = tempfile::tempdir().unwrap();
    let a = rev('a');
    let st = drained_under_slot(&a, util::now());
    let (mut r, _rx) = reconciler(dir.path(), &st);
    let wait = (WaitingFor::Quorum, "makise is not Ready".to_owned());
    assert_eq!(r.held_before_activation(&a, wait.clone()).await, wait);
    assert!(r.core.state().rollout_held.is_some());
    assert!(r.core.state().phase.live_drain().is_some());
    assert!(r.live_drain.put_off(&a).is_none());
}

/// A reboot the last look holds past `reboot.guard_timeout` is put off with its slot given
/// back at once, and status says why.
#[tokio::test]
async fn a_reboot_held_too_long_at_the_last_look_is_put_off_with_its_slot_given_back() {
    let dir = tempfile::tempdir().unwrap();
    let now = util::now();
    let mut st = State {
        rollout_held: Some(held(1)),
        ..State::default()
    };
    let mut core = Core::new(st.clone());
    core.begin_reboot(
        None,
        vec!["kernel".into()],
        now - jiff::SignedDuration::from_hours(2),
    )
    .unwrap();
    core.reboot_drained(now - jiff::SignedDuration::from_hours(1))
        .unwrap();
    st = core.state().clone();
    let (mut r, mut rx) = reconciler(dir.path(), &st);
    rx.mark_unchanged();
    let cfg = Arc::clone(&r.config.borrow());
    let held_back = (WaitingFor::Etcd, "etcd: etcd has no quorum".to_owned());
    let _ = r.held_before_reboot(&cfg, held_back).await;
    let p = rx.borrow_and_update().clone();
    assert_eq!(p.rollout.slot, None);
    assert_eq!(p.rollout.reboot.phase, None);
    assert!(p.rollout.reboot.deferred_until.is_some());
    assert_eq!(p.rollout.reboot.waiting_for.as_deref(), Some("etcd"));
    let reason = p.rollout.reboot.reason.unwrap_or_default();
    assert!(
        reason.contains("reboot.guard_timeout") && reason.contains("no quorum"),
        "{reason}"
    );
}

/// A reboot back from a failed revision is never given up at the last look: the node waits
/// with its slot (and its cordon), however long the guards hold it.
#[tokio::test]
async fn a_rollback_reboot_held_at_the_last_look_keeps_its_slot_however_long() {
    let dir = tempfile::tempdir().unwrap();
    let now = util::now();
    let mut core = Core::new(State {
        rollout_held: Some(held(1)),
        ..State::default()
    });
    core.begin_reboot(
        None,
        vec!["kernel".into()],
        now - jiff::SignedDuration::from_hours(3),
    )
    .unwrap();
    core.reboot_into_rollback().unwrap();
    core.reboot_drained(now - jiff::SignedDuration::from_hours(2))
        .unwrap();
    let (mut r, mut rx) = reconciler(dir.path(), core.state());
    rx.mark_unchanged();
    let cfg = Arc::clone(&r.config.borrow());
    let held_back = (WaitingFor::Etcd, "etcd: makise does not answer".to_owned());
    let _ = r.held_before_reboot(&cfg, held_back).await;
    let p = fresh(&mut rx, "the rollback's wait");
    assert_eq!(p.rollout.slot, Some(1), "the slot is kept");
    assert_eq!(p.rollout.reboot.phase.as_deref(), Some("draining"));
    assert_eq!(p.rollout.reboot.deferred_until, None);
    assert_eq!(p.rollout.reboot.waiting_for.as_deref(), Some("etcd"));
    assert!(r.core.state().phase.rebooting().is_some_and(|r| r.rollback));
}
