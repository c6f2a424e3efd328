//! The fleet's change log, the `events` key of the `ginx-rollout` ConfigMap: who paused,
//! resumed, cleared, halted, held or released, and when, newest last, at most [`MAX_EVENTS`]
//! of them. Nodes append through the fleet state, operators through the ConfigMap's data; both
//! through [`append`], so the log is cut the same way whoever writes it.

use std::collections::BTreeMap;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::status::FleetEventStatus;

/// The key of the change log.
pub const EVENTS_KEY: &str = "events";
/// Events kept in the ConfigMap; older ones are dropped.
pub const MAX_EVENTS: usize = 50;

/// A change of the fleet state made by a person: who, when, what.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FleetEvent {
    pub by: String,
    pub at: Timestamp,
    /// `pause`, `resume`, `clear <revision>`, `halt <revision>`, `hold <node>`, …
    pub action: String,
}

impl From<&FleetEvent> for FleetEventStatus {
    fn from(e: &FleetEvent) -> Self {
        FleetEventStatus {
            by: e.by.clone(),
            at: e.at,
            action: e.action.clone(),
        }
    }
}

/// Appends one event per action to `log`, by `by` at `at`, and drops the oldest beyond
/// [`MAX_EVENTS`].
pub fn append(log: &mut Vec<FleetEvent>, by: &str, at: Timestamp, actions: Vec<String>) {
    log.extend(actions.into_iter().map(|action| FleetEvent {
        by: by.to_owned(),
        at,
        action,
    }));
    let extra = log.len().saturating_sub(MAX_EVENTS);
    log.drain(..extra);
}

/// Appends `actions` to the log stored in the ConfigMap's `data`. A log that cannot be read is
/// left as it is: the fleet state's reader names it, and a write must not erase what a person
/// may still want to read.
pub fn append_to_data(
    data: &mut BTreeMap<String, String>,
    by: &str,
    at: Timestamp,
    actions: Vec<String>,
) {
    if actions.is_empty() {
        return;
    }
    let mut log: Vec<FleetEvent> = match data.get(EVENTS_KEY) {
        None => Vec::new(),
        Some(v) => match serde_json::from_str(v) {
            Ok(e) => e,
            Err(_) => return,
        },
    };
    append(&mut log, by, at, actions);
    data.insert(
        EVENTS_KEY.to_owned(),
        serde_json::to_string(&log).unwrap_or_default(),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    #[test]
    fn the_log_keeps_the_newest_events_whoever_appends() {
        let mut log = Vec::new();
        for i in 0..MAX_EVENTS + 3 {
            append(&mut log, "ops@ws", at(i as i64), vec![format!("pause {i}")]);
        }
        assert_eq!(log.len(), MAX_EVENTS);
        assert_eq!(log[0].action, "pause 3");
        let mut data = BTreeMap::new();
        data.insert(EVENTS_KEY.to_owned(), serde_json::to_string(&log).unwrap());
        append_to_data(&mut data, "ops@ws", at(99), vec!["hold n1".into()]);
        let back: Vec<FleetEvent> = serde_json::from_str(&data[EVENTS_KEY]).unwrap();
        assert_eq!(back.len(), MAX_EVENTS);
        assert_eq!(back[0].action, "pause 4");
        assert_eq!(back.last().unwrap().action, "hold n1");
    }

    #[test]
    fn an_unreadable_log_is_left_as_it_is() {
        let mut data = BTreeMap::from([(EVENTS_KEY.to_owned(), "garbage".to_owned())]);
        append_to_data(&mut data, "ops@ws", at(1), vec!["hold n1".into()]);
        assert_eq!(data[EVENTS_KEY], "garbage");
    }
}
