//! What a finished attempt means, decided without I/O: how its exit is classified (outcome,
//! exit code, the error in words, whether retrying can help), what closure mode's report says,
//! whether ginx must put the system profile back, what follows the attempt, and the notice
//! that tells of it. `finish` does the I/O around these: reading the report and the profile,
//! recording, telling.

use crate::apply::Exit;
use crate::state::{AttemptKind, Outcome};
use crate::types::{ClosureInfo, Goal, Reason, Revision};

/// colmena's exit code for "node missing from the hive / local deployment not allowed".
pub(super) const COLMENA_CONFIG_ERROR: i32 = 2;

/// An attempt's exit as the record and the core take it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Classified {
    pub outcome: Outcome,
    pub exit_code: Option<i32>,
    pub error: Option<String>,
    /// Retrying the same revision cannot help (a configuration error).
    pub give_up: bool,
}

/// What the classification needs to know besides the exit.
pub(super) struct Context<'a> {
    pub kind: AttemptKind,
    /// `apply.mode = "closure"`: the exit codes are ginx's own, not colmena's.
    pub closure_mode: bool,
    pub node: &'a str,
    /// `apply.timeout`, as configured (for the message).
    pub timeout: &'a str,
}

/// Classifies an attempt's exit. colmena's configuration error is given up at once: the hive
/// has to change before the same revision can succeed.
pub(super) fn classify(exit: &Exit, cx: &Context<'_>) -> Classified {
    let failed = |code, error: String| Classified {
        outcome: Outcome::Failed,
        exit_code: code,
        error: Some(error),
        give_up: false,
    };
    match exit {
        Exit::Code(0) => Classified {
            outcome: Outcome::Succeeded,
            exit_code: Some(0),
            error: None,
            give_up: false,
        },
        Exit::Code(COLMENA_CONFIG_ERROR)
            if cx.kind != AttemptKind::Rollback && !cx.closure_mode =>
        {
            Classified {
                give_up: true,
                ..failed(
                    Some(COLMENA_CONFIG_ERROR),
                    format!(
                        "apply command exited with code 2: colmena says node {:?} is not in the \
                         hive, or the hive does not allow local deployment \
                         (deployment.allowLocalDeployment = true); fix the hive — not retried \
                         until a new revision or `ginxctl retry`",
                        cx.node
                    ),
                )
            }
        }
        Exit::Code(c) => failed(Some(*c), format!("command exited with code {c}")),
        Exit::Signal(s) => failed(None, format!("command killed by signal {s}")),
        Exit::TimedOut => Classified {
            outcome: Outcome::TimedOut,
            ..failed(
                None,
                format!("command timed out after {} (apply.timeout)", cx.timeout),
            )
        },
        Exit::Stopped => Classified {
            outcome: Outcome::Interrupted,
            ..failed(
                None,
                "stopped: ginx or the machine went down during the attempt".into(),
            )
        },
        Exit::SpawnFailed(m) => failed(None, m.clone()),
    }
}

/// Closure mode says why an attempt that exited with an error failed in its own words (the
/// signature, the missing path, not a NixOS system, the switch and where the profile points
/// now), and whether that failure is for good.
pub(super) fn with_closure_error(
    c: Classified,
    exit: &Exit,
    closure: Option<&ClosureInfo>,
) -> Classified {
    match closure {
        Some(info) if matches!(exit, Exit::Code(code) if *code != 0) && info.error.is_some() => {
            Classified {
                error: info.error.clone(),
                give_up: c.give_up || info.permanent,
                ..c
            }
        }
        _ => c,
    }
}

/// Closure mode's report, as `ginx apply-closure` wrote it: taken only if it parses and names a
/// store path that passes the same check as the one started (it is read back from a file).
pub(super) fn parse_report(bytes: &[u8]) -> Option<ClosureInfo> {
    serde_json::from_slice::<ClosureInfo>(bytes)
        .ok()
        .filter(|c| crate::types::check_store_path(&c.path).is_ok())
}

/// The generation the system profile must be put back to, if any: a closure apply that
/// switches or boots and did not end by itself (timed out, stopped, killed) could not put the
/// profile back itself. `before` is the generation before the attempt; `now` reads the
/// profile's, and is called only when the rest says it may have moved.
pub(super) fn profile_to_restore(
    closure: bool,
    kind: AttemptKind,
    goal: Goal,
    exit: &Exit,
    before: Option<u64>,
    now: impl FnOnce() -> Option<u64>,
) -> Option<u64> {
    let candidate = closure
        && kind == AttemptKind::Apply
        && matches!(goal, Goal::Switch | Goal::Boot)
        && !matches!(exit, Exit::Code(_));
    before.filter(|b| candidate && now() != Some(*b))
}

/// What follows a finished attempt.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Aftermath {
    /// Something was activated: the system it left and whether a reboot is needed are looked
    /// at again, and a health gate may open.
    pub activated: bool,
    /// A build failed: no slot was held; it may halt the revision fleet-wide.
    pub build_failed: bool,
    /// After a failed gate after a reboot: the rollback's end moves the reboot on.
    pub reboot: Option<RebootNext>,
    /// A deployment of the tracked branch: the anchor new heads must descend from.
    pub record_deployed: bool,
    /// An apply succeeded: it may have activated a new ginx.
    pub look_at_self: bool,
}

/// How the rollback after a failed gate after a reboot moves the reboot on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum RebootNext {
    /// It made the previous generation the boot default: reboot into it.
    IntoRollback,
    /// It failed: the gate after the reboot stays failed.
    GateFailed,
}

/// What follows an attempt of `kind` that ended with `outcome`; `testing` for a revision of a
/// testing branch, `after_reboot` when a failed gate after a reboot asked for this attempt.
pub(super) fn aftermath(
    kind: AttemptKind,
    outcome: Outcome,
    testing: bool,
    after_reboot: bool,
) -> Aftermath {
    let ok = outcome == Outcome::Succeeded;
    Aftermath {
        activated: ok && kind != AttemptKind::Build,
        build_failed: !ok && kind == AttemptKind::Build,
        reboot: (kind == AttemptKind::Rollback && after_reboot).then_some(if ok {
            RebootNext::IntoRollback
        } else {
            RebootNext::GateFailed
        }),
        record_deployed: ok && kind == AttemptKind::Apply && !testing,
        look_at_self: ok && kind == AttemptKind::Apply,
    }
}

/// The notice of an attempt's end; none for a build that succeeded (nothing changed on the
/// node yet).
pub(super) fn notice(
    kind: AttemptKind,
    revision: &Revision,
    outcome: Outcome,
    error: Option<&str>,
    generation: Option<u64>,
) -> Option<(Reason, String)> {
    let short = revision.short();
    let gen_ = generation.map_or(String::new(), |g| format!(" (generation {g})"));
    let error = error.unwrap_or(outcome.as_str());
    Some(match (kind, outcome == Outcome::Succeeded) {
        (AttemptKind::Build, true) => return None,
        (AttemptKind::Apply, true) => (Reason::Applied, format!("applied revision {short}{gen_}")),
        (AttemptKind::Rollback, true) => (
            Reason::RolledBack,
            format!("rolled back from revision {short} to the previous system{gen_}"),
        ),
        (AttemptKind::Build, false) => (
            Reason::ApplyFailed,
            format!("build of revision {short} failed (no slot taken): {error}"),
        ),
        (AttemptKind::Apply, false) => (
            Reason::ApplyFailed,
            format!("apply of revision {short} failed: {error}"),
        ),
        (AttemptKind::Rollback, false) => (
            Reason::RollbackUnhealthy,
            format!("the rollback from revision {short} failed: {error}; the node needs a person"),
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cx(kind: AttemptKind, closure_mode: bool) -> Context<'static> {
        Context {
            kind,
            closure_mode,
            node: "makise",
            timeout: "30m",
        }
    }

    fn closure(error: Option<&str>, permanent: bool) -> ClosureInfo {
        serde_json::from_value(serde_json::json!({
            "path": "/nix/store/0123456789abcdfghijklmnpqrsvwxyz-nixos-system",
            "origin": {"kind": "url", "url": "https://pins"},
            "error": error,
            "permanent": permanent,
        }))
        .expect("a closure")
    }

    #[test]
    fn exit_zero_succeeds() {
        let c = classify(&Exit::Code(0), &cx(AttemptKind::Apply, false));
        assert_eq!(
            (c.outcome, c.exit_code, c.error, c.give_up),
            (Outcome::Succeeded, Some(0), None, false)
        );
    }

    #[test]
    fn colmena_s_configuration_error_is_given_up_at_once() {
        let c = classify(&Exit::Code(2), &cx(AttemptKind::Apply, false));
        assert_eq!(
            (c.outcome, c.exit_code, c.give_up),
            (Outcome::Failed, Some(2), true)
        );
        assert!(c.error.unwrap().contains("\"makise\" is not in the hive"));
    }

    #[test]
    fn code_two_is_an_ordinary_failure_for_a_rollback_or_in_closure_mode() {
        for c in [
            classify(&Exit::Code(2), &cx(AttemptKind::Rollback, false)),
            classify(&Exit::Code(2), &cx(AttemptKind::Apply, true)),
        ] {
            assert!(!c.give_up);
            assert_eq!(c.error.as_deref(), Some("command exited with code 2"));
        }
    }

    #[test]
    fn signals_timeouts_stops_and_spawn_failures_are_told_apart() {
        let a = cx(AttemptKind::Apply, false);
        let c = classify(&Exit::Signal(9), &a);
        assert_eq!((c.outcome, c.exit_code), (Outcome::Failed, None));
        assert_eq!(c.error.as_deref(), Some("command killed by signal 9"));
        let c = classify(&Exit::TimedOut, &a);
        assert_eq!(c.outcome, Outcome::TimedOut);
        assert!(c.error.unwrap().contains("after 30m (apply.timeout)"));
        assert_eq!(classify(&Exit::Stopped, &a).outcome, Outcome::Interrupted);
        let c = classify(&Exit::SpawnFailed("no such file".into()), &a);
        assert_eq!(
            (c.outcome, c.error.as_deref()),
            (Outcome::Failed, Some("no such file"))
        );
    }

    #[test]
    fn closure_mode_explains_a_failure_in_its_own_words() {
        let base = classify(&Exit::Code(1), &cx(AttemptKind::Apply, true));
        let info = closure(Some("bad signature"), true);
        let c = with_closure_error(base.clone(), &Exit::Code(1), Some(&info));
        assert_eq!(
            (c.error.as_deref(), c.give_up),
            (Some("bad signature"), true)
        );
        // Not for an exit without a code, nor without words from the report.
        assert_eq!(
            with_closure_error(base.clone(), &Exit::TimedOut, Some(&info)),
            base
        );
        let quiet = closure(None, true);
        assert_eq!(
            with_closure_error(base.clone(), &Exit::Code(1), Some(&quiet)),
            base
        );
        assert_eq!(with_closure_error(base.clone(), &Exit::Code(1), None), base);
    }

    #[test]
    fn a_report_is_taken_only_with_a_checked_store_path() {
        let good = serde_json::to_vec(&closure(None, false)).unwrap();
        assert_eq!(parse_report(&good), Some(closure(None, false)));
        let mut bad = closure(None, false);
        bad.path = "/tmp/evil".into();
        assert_eq!(parse_report(&serde_json::to_vec(&bad).unwrap()), None);
        assert_eq!(parse_report(b"not json"), None);
    }

    #[test]
    fn the_profile_is_put_back_after_a_closure_switch_that_did_not_end_by_itself() {
        let restore = |closure, kind, goal, exit: &Exit, now: Option<u64>| {
            profile_to_restore(closure, kind, goal, exit, Some(7), || now)
        };
        let (apply, switch) = (AttemptKind::Apply, Goal::Switch);
        assert_eq!(
            restore(true, apply, switch, &Exit::TimedOut, Some(8)),
            Some(7)
        );
        assert_eq!(
            restore(true, apply, Goal::Boot, &Exit::Stopped, None),
            Some(7)
        );
        assert_eq!(
            restore(true, apply, switch, &Exit::TimedOut, Some(7)),
            None,
            "the profile is where it was"
        );
        assert_eq!(
            restore(true, apply, switch, &Exit::Code(1), Some(8)),
            None,
            "ended by itself"
        );
        assert_eq!(
            restore(false, apply, switch, &Exit::TimedOut, Some(8)),
            None
        );
        assert_eq!(
            restore(true, apply, Goal::Test, &Exit::TimedOut, Some(8)),
            None
        );
        assert_eq!(
            restore(
                true,
                AttemptKind::Rollback,
                switch,
                &Exit::TimedOut,
                Some(8)
            ),
            None
        );
        assert_eq!(
            profile_to_restore(true, apply, switch, &Exit::TimedOut, None, || Some(8)),
            None
        );
        let read = std::cell::Cell::new(false);
        let looked = || {
            read.set(true);
            Some(8)
        };
        assert_eq!(
            profile_to_restore(true, apply, switch, &Exit::Code(1), Some(7), looked),
            None
        );
        assert!(
            !read.get(),
            "the profile is not read when nothing can have moved it"
        );
    }

    #[test]
    fn what_follows_an_attempt() {
        use AttemptKind::{Apply, Build, Rollback};
        let ok = Outcome::Succeeded;
        let a = aftermath(Apply, ok, false, false);
        assert!(a.activated && a.record_deployed && a.look_at_self && !a.build_failed);
        assert!(
            !aftermath(Apply, ok, true, false).record_deployed,
            "a testing branch"
        );
        assert_eq!(
            aftermath(Apply, Outcome::Failed, false, false),
            Aftermath::default()
        );
        let b = aftermath(Build, Outcome::Failed, false, false);
        assert!(b.build_failed && !b.activated);
        assert_eq!(aftermath(Build, ok, false, false), Aftermath::default());
        let r = aftermath(Rollback, ok, false, true);
        assert!(r.activated && !r.record_deployed && !r.look_at_self);
        assert_eq!(r.reboot, Some(RebootNext::IntoRollback));
        assert_eq!(
            aftermath(Rollback, Outcome::Failed, false, true).reboot,
            Some(RebootNext::GateFailed)
        );
        assert_eq!(aftermath(Rollback, ok, false, false).reboot, None);
    }

    #[test]
    fn the_notice_tells_what_ended_and_how() {
        let rev: Revision = "a".repeat(40).parse().unwrap();
        let n = |kind, outcome, error| notice(kind, &rev, outcome, error, Some(4));
        assert_eq!(n(AttemptKind::Build, Outcome::Succeeded, None), None);
        let (reason, text) = n(AttemptKind::Apply, Outcome::Succeeded, None).unwrap();
        assert_eq!(reason, Reason::Applied);
        assert!(text.ends_with("(generation 4)"));
        let (reason, text) = n(AttemptKind::Rollback, Outcome::Failed, Some("boom")).unwrap();
        assert_eq!(reason, Reason::RollbackUnhealthy);
        assert!(text.contains("failed: boom; the node needs a person"));
        let (_, text) = n(AttemptKind::Apply, Outcome::TimedOut, None).unwrap();
        assert!(text.ends_with(&format!("failed: {}", Outcome::TimedOut.as_str())));
    }
}
