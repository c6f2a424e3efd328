//! Holds: an operator keeps one node out of rollouts (a disk is failing, a customer's demo is
//! running) from a workstation. Stored in the fleet's ConfigMap (`ginx-rollout`), one key per
//! held node, written by `ginxctl hold|release` with an operator's credentials:
//!
//! ```text
//! held.<node>:  {"by":"ann","at":"2026-12-01T10:00:00Z","reason":"disk failing","until":"2026-12-01T18:00:00Z"}
//! ```
//!
//! `reason` is left out when none was given, `until` when the hold lasts until `ginxctl
//! release`. Nodes never write these keys (the admission policy refuses a node's write that
//! adds, changes or removes one, its own included), and the fleet state's own writes leave them
//! as they are: a node reads them, never encodes them. A hold past its `until` no longer holds
//! (by the reading node's clock: a hold lapses a little early or late with the clocks' skew,
//! never holds a node for good); the next `ginxctl hold` or `release` removes it.
//!
//! Owns the format and the pure edits `ginxctl` makes (written through [`operator`](super::operator)).
//! Not what a hold means for admission (`decide/admission.rs`).

use std::collections::BTreeMap;

use jiff::tz::TimeZone;
use jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};

use super::events;
use crate::status::HoldStatus;
use crate::types::Invalid;

/// The prefix of a hold's key; the node's name follows.
pub const HOLD_PREFIX: &str = "held.";
/// A ConfigMap key is at most 253 characters, so the longest node name a hold can name.
pub const MAX_NODE_NAME: usize = 253 - HOLD_PREFIX.len();
/// The longest reason kept (it is shown in status lines and Events).
pub const MAX_REASON: usize = 200;
/// The latest `--until`: a hold for longer is one until `ginxctl release`.
pub const MAX_UNTIL_DAYS: i64 = 366;
/// Nodes one `ginxctl hold` may name.
pub const MAX_NODES: usize = 64;

/// One node's hold.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hold {
    /// Who placed it, as the API server named the credentials.
    pub by: String,
    pub at: Timestamp,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// When it lapses by itself; `None`: at `ginxctl release`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<Timestamp>,
}

impl Hold {
    /// Whether it still holds at `now`.
    pub fn active_at(&self, now: Timestamp) -> bool {
        self.until.is_none_or(|u| now < u)
    }

    /// `by ann since T (disk failing) until U`: who, why and until when, for messages.
    pub fn describe(&self) -> String {
        let why = if self.reason.is_empty() {
            String::new()
        } else {
            format!(" ({})", self.reason)
        };
        let until = match self.until {
            Some(u) => format!("until {u}"),
            None => "until `ginxctl release`".to_owned(),
        };
        format!("by {} since {}{why} {until}", self.by, self.at)
    }
}

impl From<&Hold> for HoldStatus {
    fn from(h: &Hold) -> Self {
        HoldStatus {
            by: h.by.clone(),
            at: h.at,
            reason: h.reason.clone(),
            until: h.until,
        }
    }
}

/// The holds in a ConfigMap's data, by node, and what could not be read. A hold whose value
/// cannot be read still holds its node, until `ginxctl release`: errs on the side of holding.
pub fn decode(data: &BTreeMap<String, String>) -> (BTreeMap<String, Hold>, Vec<String>) {
    let mut holds = BTreeMap::new();
    let mut problems = Vec::new();
    for (key, value) in data {
        let Some(node) = key.strip_prefix(HOLD_PREFIX) else {
            continue;
        };
        let hold = serde_json::from_str::<Hold>(value).unwrap_or_else(|e| {
            problems.push(format!(
                "key {key}: not a hold {{\"by\", \"at\", \"reason\", \"until\"}}: {e}"
            ));
            Hold {
                by: "?".to_owned(),
                at: Timestamp::UNIX_EPOCH,
                reason: format!("the {key} key cannot be read; see the ConfigMap"),
                until: None,
            }
        });
        holds.insert(node.to_owned(), hold);
    }
    (holds, problems)
}

/// Whether `name` can be held: a node name (an RFC 1123 subdomain) short enough for its key.
pub fn check_node(name: &str) -> Result<(), Invalid> {
    if name.len() > MAX_NODE_NAME {
        return Err(Invalid(format!(
            "{name:?} is {} characters long; a hold's key ({HOLD_PREFIX}<node>) allows node \
             names of at most {MAX_NODE_NAME}",
            name.len()
        )));
    }
    if !crate::config::is_dns_subdomain(name) {
        return Err(Invalid(format!(
            "{name:?} is not a node name (lowercase letters, digits, '-' and '.', each \
             dot-separated part starting and ending with a letter or digit)"
        )));
    }
    Ok(())
}

/// Whether `reason` can be stored: at most [`MAX_REASON`] characters, no control characters.
pub fn check_reason(reason: &str) -> Result<(), Invalid> {
    if reason.chars().count() > MAX_REASON {
        return Err(Invalid(format!(
            "--reason has {} characters; at most {MAX_REASON}",
            reason.chars().count()
        )));
    }
    if reason.chars().any(char::is_control) {
        return Err("--reason holds a control character (a newline?); give one line".into());
    }
    Ok(())
}

/// `--until`: an RFC 3339 time (`2026-12-01T18:00:00Z`), a local time in `local`
/// (`2026-12-01 18:00`), or a duration from `now` (`8h`). In the future, and at most
/// [`MAX_UNTIL_DAYS`] away.
pub fn parse_until(s: &str, now: Timestamp, local: &TimeZone) -> Result<Timestamp, Invalid> {
    let s = s.trim();
    let at = if let Ok(t) = s.parse::<Timestamp>() {
        t
    } else if let Ok(dt) = s.parse::<jiff::civil::DateTime>() {
        // A local time the clocks skip (a DST gap) is taken forward, one they repeat at its
        // first occurrence: jiff's "compatible" rule, as the maintenance windows do.
        local
            .to_ambiguous_zoned(dt)
            .compatible()
            .map_err(|e| format!("--until {s:?}: {e}"))?
            .timestamp()
    } else if let Ok(d) = s.parse::<crate::config::Duration>() {
        let d = SignedDuration::try_from(d.get()).map_err(|e| format!("--until {s:?}: {e}"))?;
        now.checked_add(d)
            .map_err(|e| format!("--until {s:?}: {e}"))?
    } else {
        return Err(Invalid(format!(
            "--until {s:?} is not a time: give RFC 3339 like 2026-12-01T18:00:00Z, a local \
             time like \"2026-12-01 18:00\", or a duration like \"8h\""
        )));
    };
    if at <= now {
        return Err(Invalid(format!(
            "--until {s:?} ({at}) is not in the future (now {now})"
        )));
    }
    if at.duration_since(now) > SignedDuration::from_hours(24 * MAX_UNTIL_DAYS) {
        return Err(Invalid(format!(
            "--until {s:?} ({at}) is more than {MAX_UNTIL_DAYS} days away; leave --until out to \
             hold until `ginxctl release`"
        )));
    }
    Ok(at)
}

/// What a `hold` or `release` did to one node: the hold it found there (if any, and active).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Changed {
    pub node: String,
    pub before: Option<Hold>,
}

/// Places `hold` on each of `nodes` in `data` (replacing a hold there), removes the holds that
/// lapsed by `now`, and records each change in the change log.
pub fn apply_hold(
    data: &mut BTreeMap<String, String>,
    nodes: &[String],
    hold: &Hold,
    now: Timestamp,
) -> Vec<Changed> {
    let mut log = Vec::new();
    expire(data, now, &hold.by, &mut log);
    let value = serde_json::to_string(hold).unwrap_or_default();
    let changed = nodes
        .iter()
        .map(|node| {
            let key = format!("{HOLD_PREFIX}{node}");
            let before = take_active(data, &key, now);
            data.insert(key, value.clone());
            let why = if hold.reason.is_empty() {
                String::new()
            } else {
                format!(": {}", hold.reason)
            };
            let until = hold
                .until
                .map(|u| format!(" until {u}"))
                .unwrap_or_default();
            log.push(format!("hold {node}{until}{why}"));
            Changed {
                node: node.clone(),
                before,
            }
        })
        .collect();
    events::append_to_data(data, &hold.by, now, log);
    changed
}

/// Lifts the holds on `nodes` in `data`, removes the holds that lapsed by `now`, and records
/// each change; a node that was not held comes back with `before: None`.
pub fn apply_release(
    data: &mut BTreeMap<String, String>,
    nodes: &[String],
    by: &str,
    now: Timestamp,
) -> Vec<Changed> {
    let mut log = Vec::new();
    expire(data, now, by, &mut log);
    let changed = nodes
        .iter()
        .map(|node| {
            let before = take_active(data, &format!("{HOLD_PREFIX}{node}"), now);
            if before.is_some() {
                log.push(format!("release {node}"));
            }
            Changed {
                node: node.clone(),
                before,
            }
        })
        .collect();
    events::append_to_data(data, by, now, log);
    changed
}

/// Removes `key`, and the hold it held if that was still active at `now`.
fn take_active(data: &mut BTreeMap<String, String>, key: &str, now: Timestamp) -> Option<Hold> {
    let value = data.remove(key)?;
    match serde_json::from_str::<Hold>(&value) {
        Ok(h) => h.active_at(now).then_some(h),
        // An unreadable hold held: say it was there.
        Err(_) => decode(&BTreeMap::from([(key.to_owned(), value)]))
            .0
            .into_values()
            .next(),
    }
}

/// Removes the holds whose `until` passed by `now`, noting each in `log`.
fn expire(data: &mut BTreeMap<String, String>, now: Timestamp, by: &str, log: &mut Vec<String>) {
    let (holds, _) = decode(data);
    for (node, h) in holds.iter().filter(|(_, h)| !h.active_at(now)) {
        data.remove(&format!("{HOLD_PREFIX}{node}"));
        log.push(format!(
            "hold {node} lapsed at {} (removed by {by})",
            h.until.unwrap_or(now)
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rollout::fleet::events::{EVENTS_KEY, FleetEvent, MAX_EVENTS};

    fn t(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn hold(until: Option<&str>) -> Hold {
        Hold {
            by: "ann".into(),
            at: t("2026-12-01T10:00:00Z"),
            reason: "disk failing".into(),
            until: until.map(t),
        }
    }

    fn nodes(n: &[&str]) -> Vec<String> {
        n.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_format_is_compact_json_and_round_trips() {
        let h = hold(Some("2026-12-01T18:00:00Z"));
        let json = serde_json::to_string(&h).unwrap();
        assert_eq!(
            json,
            r#"{"by":"ann","at":"2026-12-01T10:00:00Z","reason":"disk failing","until":"2026-12-01T18:00:00Z"}"#
        );
        let bare = Hold {
            reason: String::new(),
            until: None,
            ..h.clone()
        };
        assert_eq!(
            serde_json::to_string(&bare).unwrap(),
            r#"{"by":"ann","at":"2026-12-01T10:00:00Z"}"#
        );
        let data = BTreeMap::from([
            ("held.lucy".to_owned(), json),
            ("paused".to_owned(), "{}".to_owned()),
        ]);
        let (holds, problems) = decode(&data);
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(holds["lucy"], h);
        assert_eq!(holds.len(), 1);
    }

    #[test]
    fn an_unreadable_hold_still_holds_until_released() {
        let data = BTreeMap::from([("held.lucy".to_owned(), "{".to_owned())]);
        let (holds, problems) = decode(&data);
        assert!(
            problems[0].starts_with("key held.lucy: not a hold"),
            "{problems:?}"
        );
        assert!(holds["lucy"].active_at(t("2099-01-01T00:00:00Z")));
        assert!(holds["lucy"].reason.contains("cannot be read"));
    }

    #[test]
    fn a_hold_lapses_at_its_until_and_not_before() {
        let h = hold(Some("2026-12-01T18:00:00Z"));
        assert!(h.active_at(t("2026-12-01T17:59:59Z")));
        assert!(!h.active_at(t("2026-12-01T18:00:00Z")));
        assert!(hold(None).active_at(t("2099-01-01T00:00:00Z")));
        assert_eq!(
            h.describe(),
            "by ann since 2026-12-01T10:00:00Z (disk failing) until 2026-12-01T18:00:00Z"
        );
        assert_eq!(
            hold(None).describe(),
            "by ann since 2026-12-01T10:00:00Z (disk failing) until `ginxctl release`"
        );
    }

    #[test]
    fn until_takes_rfc3339_a_local_time_or_a_duration_within_bounds() {
        let now = t("2026-03-28T12:00:00Z");
        let berlin = TimeZone::get("Europe/Berlin").unwrap();
        assert_eq!(
            parse_until("2026-03-28T18:00:00Z", now, &berlin),
            Ok(t("2026-03-28T18:00:00Z"))
        );
        assert_eq!(
            parse_until("8h", now, &berlin),
            Ok(t("2026-03-28T20:00:00Z"))
        );
        // Before and after the change to summer time.
        assert_eq!(
            parse_until("2026-03-28 18:00", now, &berlin),
            Ok(t("2026-03-28T17:00:00Z"))
        );
        assert_eq!(
            parse_until("2026-03-29 18:00", now, &berlin),
            Ok(t("2026-03-29T16:00:00Z"))
        );
        // 02:30 does not exist that night: taken forward to 03:30 summer time.
        assert_eq!(
            parse_until("2026-03-29 02:30", now, &berlin),
            Ok(t("2026-03-29T01:30:00Z"))
        );
        let e = parse_until("next tuesday", now, &berlin).unwrap_err();
        assert!(e.0.contains("is not a time") && e.0.contains("8h"), "{e}");
        let e = parse_until("2026-03-28T11:00:00Z", now, &berlin).unwrap_err();
        assert!(e.0.contains("not in the future"), "{e}");
        let e = parse_until("0s", now, &berlin).unwrap_err();
        assert!(e.0.contains("not in the future"), "{e}");
        let e = parse_until("2028-01-01T00:00:00Z", now, &berlin).unwrap_err();
        assert!(
            e.0.contains("more than 366 days") && e.0.contains("leave --until out"),
            "{e}"
        );
    }

    #[test]
    fn node_names_and_reasons_are_bounded() {
        assert!(check_node("lucy").is_ok());
        assert!(check_node("w3.example.org").is_ok());
        assert!(
            check_node("W3")
                .unwrap_err()
                .0
                .contains("is not a node name")
        );
        assert!(check_node("").is_err());
        assert!(check_node("a..b").is_err());
        let long = [
            "a".repeat(63),
            "b".repeat(63),
            "c".repeat(63),
            "d".repeat(60),
        ]
        .join(".");
        assert_eq!(long.len(), 252);
        assert!(check_node(&long).unwrap_err().0.contains("at most 248"));
        assert!(check_reason("disk failing").is_ok());
        assert!(
            check_reason(&"x".repeat(201))
                .unwrap_err()
                .0
                .contains("at most 200")
        );
        assert!(
            check_reason("a\nb")
                .unwrap_err()
                .0
                .contains("control character")
        );
    }

    #[test]
    fn hold_replaces_release_lifts_lapsed_ones_go_and_each_is_logged() {
        let now = t("2026-12-01T12:00:00Z");
        let mut data = BTreeMap::from([
            ("other".to_owned(), "kept".to_owned()),
            (
                "held.old".to_owned(),
                serde_json::to_string(&hold(Some("2026-12-01T11:00:00Z"))).unwrap(),
            ),
        ]);
        let first = hold(Some("2026-12-01T18:00:00Z"));
        let c = apply_hold(&mut data, &nodes(&["lucy", "makise"]), &first, now);
        assert_eq!(c.iter().filter(|c| c.before.is_none()).count(), 2);
        assert!(!data.contains_key("held.old"), "a lapsed hold is removed");
        assert_eq!(data["other"], "kept");
        let again = Hold {
            until: None,
            reason: String::new(),
            ..first.clone()
        };
        let c = apply_hold(&mut data, &nodes(&["lucy"]), &again, now);
        assert_eq!(c[0].before.as_ref(), Some(&first), "says what it replaced");
        let c = apply_release(&mut data, &nodes(&["lucy", "nobody"]), "bob", now);
        assert_eq!(c[0].before.as_ref(), Some(&again));
        assert_eq!(c[1].before, None);
        assert!(!data.contains_key("held.lucy"));
        assert!(data.contains_key("held.makise"));
        let events: Vec<FleetEvent> = serde_json::from_str(&data[EVENTS_KEY]).unwrap();
        let actions: Vec<&str> = events.iter().map(|e| e.action.as_str()).collect();
        assert_eq!(
            actions,
            [
                "hold old lapsed at 2026-12-01T11:00:00Z (removed by ann)",
                "hold lucy until 2026-12-01T18:00:00Z: disk failing",
                "hold makise until 2026-12-01T18:00:00Z: disk failing",
                "hold lucy",
                "release lucy",
            ]
        );
        assert_eq!(events.last().unwrap().by, "bob");
    }

    #[test]
    fn the_log_stays_bounded_and_an_unreadable_one_is_left_alone() {
        let now = t("2026-12-01T12:00:00Z");
        let old: Vec<FleetEvent> = (0..MAX_EVENTS)
            .map(|i| FleetEvent {
                by: "x".into(),
                at: now,
                action: format!("pause {i}"),
            })
            .collect();
        let mut data =
            BTreeMap::from([(EVENTS_KEY.to_owned(), serde_json::to_string(&old).unwrap())]);
        apply_hold(&mut data, &nodes(&["lucy"]), &hold(None), now);
        let events: Vec<FleetEvent> = serde_json::from_str(&data[EVENTS_KEY]).unwrap();
        assert_eq!(events.len(), MAX_EVENTS);
        assert_eq!(events[0].action, "pause 1");
        let mut data = BTreeMap::from([(EVENTS_KEY.to_owned(), "garbage".to_owned())]);
        apply_hold(&mut data, &nodes(&["lucy"]), &hold(None), now);
        assert_eq!(data[EVENTS_KEY], "garbage");
        assert!(data.contains_key("held.lucy"));
    }
}
