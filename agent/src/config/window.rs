//! `[[rollout.windows]]`: maintenance windows. Each is a weekly time of day in a time zone and a
//! length; a window gates the *start* of an apply, never cuts one off. The arithmetic (when a
//! window is open, when the next opens) is `rollout::window`, a pure function.
//!
//! Time zones come from the system's tz database (`TZDIR`, `/usr/share/zoneinfo`,
//! `/etc/zoneinfo` — the last is where NixOS has it) and, failing that, from the copy bundled
//! into ginx, so that a name always resolves the same way on every node.

use serde::{Deserialize, Serialize};

use super::{ConfigError, Ctx, Duration, bounds::DurationBound};

/// A day of the week, as written in `days`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Day {
    Mon,
    Tue,
    Wed,
    Thu,
    Fri,
    Sat,
    Sun,
}

impl Day {
    pub fn weekday(self) -> jiff::civil::Weekday {
        use jiff::civil::Weekday as W;
        match self {
            Day::Mon => W::Monday,
            Day::Tue => W::Tuesday,
            Day::Wed => W::Wednesday,
            Day::Thu => W::Thursday,
            Day::Fri => W::Friday,
            Day::Sat => W::Saturday,
            Day::Sun => W::Sunday,
        }
    }
}

/// A time of day, `"02:00"` or `"02:00:30"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ClockTime(pub jiff::civil::Time);

impl TryFrom<String> for ClockTime {
    type Error = String;

    fn try_from(s: String) -> Result<Self, String> {
        let parts: Vec<&str> = s.split(':').collect();
        let field = |p: &str, max: i8| -> Option<i8> {
            (p.len() == 2 && p.bytes().all(|b| b.is_ascii_digit()))
                .then(|| p.parse::<i8>().ok())
                .flatten()
                .filter(|v| *v <= max)
        };
        let bad = || {
            format!(
                "{s:?} is not a time of day: write \"HH:MM\" or \"HH:MM:SS\", 00:00 to 23:59:59"
            )
        };
        let (h, m, sec) = match parts.as_slice() {
            [h, m] => (field(h, 23), field(m, 59), Some(0)),
            [h, m, sec] => (field(h, 23), field(m, 59), field(sec, 59)),
            _ => return Err(bad()),
        };
        match (h, m, sec) {
            (Some(h), Some(m), Some(sec)) => jiff::civil::Time::new(h, m, sec, 0)
                .map(ClockTime)
                .map_err(|_| bad()),
            _ => Err(bad()),
        }
    }
}

impl From<ClockTime> for String {
    fn from(t: ClockTime) -> String {
        if t.0.second() == 0 {
            format!("{:02}:{:02}", t.0.hour(), t.0.minute())
        } else {
            format!("{:02}:{:02}:{:02}", t.0.hour(), t.0.minute(), t.0.second())
        }
    }
}

/// One weekly window.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Window {
    /// The days it starts on, in its time zone.
    pub days: Vec<Day>,
    /// When it starts, local time. A start that does not exist that day (a DST gap) moves
    /// forward by the gap; one that happens twice (a DST fold) is the first.
    pub start: ClockTime,
    /// How long it stays open: elapsed time, whatever the clocks do meanwhile.
    pub length: Duration,
    /// IANA name, like "Europe/Berlin".
    #[serde(default = "utc")]
    pub time_zone: String,
}

fn utc() -> String {
    "UTC".to_owned()
}

/// Checks `windows` (at `key`, like `rollout.windows`), their lengths against `length`.
pub(super) fn validate(
    windows: &[Window],
    key: &str,
    length: &DurationBound,
    ctx: &Ctx<'_>,
) -> Result<(), ConfigError> {
    for (i, w) in windows.iter().enumerate() {
        let at = |field: &str| format!("{key}[{i}].{field}");
        if w.days.is_empty() {
            return Err(ctx.error(
                &at("days"),
                "must name at least one day, like [\"sat\", \"sun\"]",
            ));
        }
        length.check_at(ctx, &at("length"), w.length)?;
        if let Err(e) = jiff::tz::TimeZone::get(&w.time_zone) {
            return Err(ctx.error(
                &at("time_zone"),
                format!(
                    "unknown time zone {:?} ({e}); use an IANA name like \"Europe/Berlin\" or \
                     \"UTC\" (looked up in TZDIR, /usr/share/zoneinfo, /etc/zoneinfo, then \
                     ginx's bundled copy)",
                    w.time_zone
                ),
            ));
        }
    }
    Ok(())
}
