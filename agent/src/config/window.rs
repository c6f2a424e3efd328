//! `[[rollout.windows]]`: maintenance windows. Each is a time of day in a time zone and a
//! length, on days of the week (every week, or the first … fourth or last of the month), or on
//! dates; a window gates the *start* of an apply, never cuts one off. The arithmetic (when a
//! window is open, when the next opens) is `rollout::decide::window`, a pure function.
//!
//! Time zones come from the system's tz database (`TZDIR`, `/usr/share/zoneinfo`,
//! `/etc/zoneinfo` — the last is where NixOS has it) and, failing that, from the copy bundled
//! into ginx, so that a name always resolves the same way on every node.

use serde::{Deserialize, Serialize};

use super::{ConfigError, Ctx, Duration, bounds::DurationBound};
use crate::types::Invalid;

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

/// Which week of the month a day of `days` falls in, as written in `weeks`: `first` is days
/// 1–7 of the month, `second` 8–14, `third` 15–21, `fourth` 22–28, `last` the last seven.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Week {
    First,
    Second,
    Third,
    Fourth,
    Last,
}

impl Week {
    /// Whether `date` is in this week of its month.
    pub fn holds(self, date: jiff::civil::Date) -> bool {
        let nth = (date.day() - 1) / 7;
        match self {
            Week::First => nth == 0,
            Week::Second => nth == 1,
            Week::Third => nth == 2,
            Week::Fourth => nth == 3,
            Week::Last => date.day() + 7 > date.days_in_month(),
        }
    }
}

/// A calendar date, `"2026-12-24"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct CivilDate(pub jiff::civil::Date);

impl TryFrom<String> for CivilDate {
    type Error = Invalid;

    fn try_from(s: String) -> Result<Self, Invalid> {
        let well_formed = s.len() == 10
            && s.bytes().enumerate().all(|(i, b)| {
                if i == 4 || i == 7 {
                    b == b'-'
                } else {
                    b.is_ascii_digit()
                }
            });
        well_formed
            .then(|| s.parse::<jiff::civil::Date>().ok())
            .flatten()
            .map(CivilDate)
            .ok_or_else(|| {
                format!("{s:?} is not a date: write \"YYYY-MM-DD\", like \"2026-12-24\"")
            })
            .map_err(Invalid)
    }
}

impl From<CivilDate> for String {
    fn from(d: CivilDate) -> String {
        d.0.to_string()
    }
}

/// A time of day, `"02:00"` or `"02:00:30"`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ClockTime(pub jiff::civil::Time);

impl TryFrom<String> for ClockTime {
    type Error = Invalid;

    fn try_from(s: String) -> Result<Self, Invalid> {
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
            _ => return Err(Invalid(bad())),
        };
        match (h, m, sec) {
            (Some(h), Some(m), Some(sec)) => jiff::civil::Time::new(h, m, sec, 0)
                .map(ClockTime)
                .map_err(|_| bad())
                .map_err(Invalid),
            _ => Err(Invalid(bad())),
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

/// One window: on days of the week, or on dates.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Window {
    /// The days of the week it starts on, in its time zone; or give `dates`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub days: Vec<Day>,
    /// Only in these weeks of the month (`"first"` … `"fourth"`, `"last"`): `days = ["tue"]`
    /// with `weeks = ["first"]` is the first Tuesday of each month. Empty: every week.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub weeks: Vec<Week>,
    /// Instead of `days`: the dates it starts on, `"YYYY-MM-DD"` (at most 366).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dates: Vec<CivilDate>,
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

/// The most dates one window may name.
pub const MAX_DATES: usize = 366;

/// Checks `windows` (at `key`, like `rollout.windows`), their lengths against `length`.
pub(super) fn validate(
    windows: &[Window],
    key: &str,
    length: &DurationBound,
    ctx: &Ctx<'_>,
) -> Result<(), ConfigError> {
    for (i, w) in windows.iter().enumerate() {
        let at = |field: &str| format!("{key}[{i}].{field}");
        check_calendar(w).map_err(|(field, why)| ctx.error(&at(field), why))?;
        length.check_at(ctx, &at("length"), w.length)?;
        check_zone(&w.time_zone).map_err(|why| ctx.error(&at("time_zone"), why))?;
    }
    Ok(())
}

/// Days or dates, not both; weeks only with days; dates bounded and each once. `Err((field,
/// why))`.
fn check_calendar(w: &Window) -> Result<(), (&'static str, String)> {
    match (w.days.is_empty(), w.dates.is_empty()) {
        (true, true) => {
            return Err((
                "days",
                "must name at least one day, like [\"sat\", \"sun\"], or give dates, like \
                 [\"2026-12-24\"]"
                    .into(),
            ));
        }
        (false, false) => {
            return Err((
                "dates",
                "give days, like [\"sat\", \"sun\"], or dates, like [\"2026-12-24\"], not both"
                    .into(),
            ));
        }
        _ => {}
    }
    if !w.weeks.is_empty() && w.days.is_empty() {
        return Err((
            "weeks",
            "needs days: days = [\"tue\"] with weeks = [\"first\"] is the first Tuesday of the \
             month"
                .into(),
        ));
    }
    if w.dates.len() > MAX_DATES {
        return Err((
            "dates",
            format!("names {} dates; at most {MAX_DATES}", w.dates.len()),
        ));
    }
    let mut seen = std::collections::BTreeSet::new();
    if let Some(twice) = w.dates.iter().find(|d| !seen.insert(**d)) {
        return Err(("dates", format!("names {} twice", twice.0)));
    }
    Ok(())
}

/// `Err(why)` unless `zone` is a time zone the tz database (or ginx's copy) knows.
pub(super) fn check_zone(zone: &str) -> Result<(), Invalid> {
    jiff::tz::TimeZone::get(zone)
        .map(|_| ())
        .map_err(|e| {
            format!(
                "unknown time zone {zone:?} ({e}); use an IANA name like \"Europe/Berlin\" or \
             \"UTC\" (looked up in TZDIR, /usr/share/zoneinfo, /etc/zoneinfo, then ginx's \
             bundled copy)"
            )
        })
        .map_err(Invalid)
}
