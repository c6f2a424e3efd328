//! `[[rollout.freezes]]`: change freezes. Each is a dated range in a time zone, with a reason;
//! nothing new starts inside one (no apply, no reboot). Where one ends and the next begins, and
//! whether `now` is inside one, is `rollout::decide::window`'s arithmetic; this file owns the format and
//! what is refused at load.

use jiff::civil::{Date, DateTime};
use jiff::tz::TimeZone;
use jiff::{SignedDuration, Timestamp, ToSpan};
use serde::{Deserialize, Serialize};

use super::{ConfigError, Ctx};
use crate::types::Invalid;

/// Freezes one configuration may list.
pub const MAX_FREEZES: usize = 64;
/// The longest freeze, in days: a longer stop is `ginxctl rollout pause`, which a person lifts.
pub const MAX_FREEZE_DAYS: i64 = 92;
/// The longest reason (it is shown in status lines and the cluster view).
pub const MAX_FREEZE_REASON: usize = 200;

/// A local point in time as written: a date (`"2026-12-20"`) or a date and time of day
/// (`"2026-12-20T18:00"`, `"2026-12-20 18:00:30"`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum CivilPoint {
    Date(Date),
    At(DateTime),
}

impl TryFrom<String> for CivilPoint {
    type Error = Invalid;

    fn try_from(s: String) -> Result<Self, Invalid> {
        let bad = || {
            format!(
                "{s:?} is neither a date nor a local time: write \"YYYY-MM-DD\" or \
                 \"YYYY-MM-DDTHH:MM\", like \"2026-12-20\" or \"2026-12-20T18:00\""
            )
        };
        if s.len() == 10 {
            return super::CivilDate::try_from(s.clone())
                .map(|d| CivilPoint::Date(d.0))
                .map_err(|_| bad())
                .map_err(Invalid);
        }
        // A date and a time of day, nothing more: no offset, no zone (time_zone says it).
        let plain = s.len() >= 16
            && s.len() <= 19
            && matches!(s.as_bytes()[10], b'T' | b' ')
            && s.bytes()
                .all(|b| b.is_ascii_digit() || b"-: T".contains(&b));
        plain
            .then(|| s.parse::<DateTime>().ok())
            .flatten()
            .map(CivilPoint::At)
            .ok_or_else(bad)
            .map_err(Invalid)
    }
}

impl From<CivilPoint> for String {
    fn from(p: CivilPoint) -> String {
        match p {
            CivilPoint::Date(d) => d.to_string(),
            CivilPoint::At(dt) if dt.second() == 0 => dt.strftime("%Y-%m-%dT%H:%M").to_string(),
            CivilPoint::At(dt) => dt.strftime("%Y-%m-%dT%H:%M:%S").to_string(),
        }
    }
}

impl std::fmt::Display for CivilPoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&String::from(*self))
    }
}

/// One change freeze: nothing new starts inside it. At most 64 are listed, each at most 92
/// days long, none overlapping another (one may begin where another ends).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Freeze {
    /// When it begins: a date (from 00:00) or a local time, in `time_zone`.
    pub start: CivilPoint,
    /// When it ends: a date (to the end of that day) or a local time, in `time_zone`. A local
    /// time the clocks skip (a DST gap) moves forward by the gap; one they repeat is the first.
    pub end: CivilPoint,
    /// IANA name, like "Europe/Berlin".
    #[serde(default = "utc")]
    pub time_zone: String,
    /// Why, shown in status, the cluster view and the journal (at most 200 characters).
    pub reason: String,
}

fn utc() -> String {
    "UTC".to_owned()
}

impl Freeze {
    /// The instants it begins and ends. A date as `end` means the end of that day.
    pub fn span(&self) -> Result<(Timestamp, Timestamp), Invalid> {
        let tz = TimeZone::get(&self.time_zone).map_err(|e| e.to_string())?;
        let instant = |p: CivilPoint, end: bool| -> Result<Timestamp, String> {
            let local = match p {
                CivilPoint::Date(d) if end => d
                    .checked_add(1.day())
                    .map_err(|e| e.to_string())?
                    .to_datetime(jiff::civil::Time::midnight()),
                CivilPoint::Date(d) => d.to_datetime(jiff::civil::Time::midnight()),
                CivilPoint::At(dt) => dt,
            };
            tz.to_ambiguous_zoned(local)
                .compatible()
                .map(|z| z.timestamp())
                .map_err(|e| e.to_string())
        };
        Ok((instant(self.start, false)?, instant(self.end, true)?))
    }

    /// `2026-12-20 … 2027-01-03, Europe/Berlin`, for messages.
    pub fn describe(&self) -> String {
        format!("{} … {}, {}", self.start, self.end, self.time_zone)
    }
}

/// Checks the freezes at `rollout.freezes`: each a real range in a known zone with a reason,
/// at most [`MAX_FREEZE_DAYS`] long, none overlapping another (touching is fine).
pub(super) fn validate(freezes: &[Freeze], ctx: &Ctx<'_>) -> Result<(), ConfigError> {
    if freezes.len() > MAX_FREEZES {
        return Err(ctx.error(
            "rollout.freezes",
            format!(
                "lists {} freezes; at most {MAX_FREEZES} (remove the past ones)",
                freezes.len()
            ),
        ));
    }
    let mut spans = Vec::new();
    for (i, f) in freezes.iter().enumerate() {
        let at = |field: &str| format!("rollout.freezes[{i}].{field}");
        super::window::check_zone(&f.time_zone).map_err(|why| ctx.error(&at("time_zone"), why))?;
        check_reason(&f.reason).map_err(|why| ctx.error(&at("reason"), why))?;
        let (start, end) = f.span().map_err(|why| ctx.error(&at("end"), why))?;
        if end <= start {
            return Err(ctx.error(
                &at("end"),
                format!(
                    "{} is not after start ({}): a freeze must end after it starts",
                    f.end, f.start
                ),
            ));
        }
        let days = end.duration_since(start).as_secs_f64() / 86_400.0;
        if end.duration_since(start) > SignedDuration::from_hours(24 * MAX_FREEZE_DAYS) {
            return Err(ctx.error(
                &at("end"),
                format!(
                    "the freeze lasts {days:.1} days; at most {MAX_FREEZE_DAYS}: a longer stop \
                     is `ginxctl rollout pause`"
                ),
            ));
        }
        if let Some((j, _)) = spans
            .iter()
            .enumerate()
            .find(|(_, (s, e))| start < *e && *s < end)
        {
            return Err(ctx.error(
                &format!("rollout.freezes[{i}]"),
                format!(
                    "({}) overlaps rollout.freezes[{j}] ({}): merge them into one",
                    f.describe(),
                    freezes[j].describe()
                ),
            ));
        }
        spans.push((start, end));
    }
    Ok(())
}

fn check_reason(reason: &str) -> Result<(), Invalid> {
    let n = reason.trim().chars().count();
    if n == 0 {
        return Err(
            "must say why, like \"year-end change freeze\": it is shown to whoever \
                    waits"
                .into(),
        );
    }
    if n > MAX_FREEZE_REASON {
        return Err(Invalid(format!(
            "has {n} characters; at most {MAX_FREEZE_REASON}"
        )));
    }
    if reason.chars().any(char::is_control) {
        return Err("holds a control character (a newline?); give one line".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn freeze(start: &str, end: &str, tz: &str) -> Freeze {
        Freeze {
            start: CivilPoint::try_from(start.to_owned()).unwrap(),
            end: CivilPoint::try_from(end.to_owned()).unwrap(),
            time_zone: tz.into(),
            reason: "year-end change freeze".into(),
        }
    }

    #[test]
    fn points_are_dates_or_local_times_and_nothing_else() {
        for ok in ["2026-12-20", "2026-12-20T18:00", "2026-12-20 18:00:30"] {
            let p = CivilPoint::try_from(ok.to_owned()).unwrap();
            assert_eq!(String::from(p).replace(' ', "T"), ok.replace(' ', "T"));
        }
        for bad in [
            "2026-12-32",
            "20.12.2026",
            "2026-12-20T18:00Z",
            "2026-12-20T18:00+01:00",
            "2026-12-20T25:00",
            "tomorrow",
        ] {
            let e = CivilPoint::try_from(bad.to_owned()).unwrap_err();
            assert!(
                e.0.contains("neither a date nor a local time"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn a_date_ends_at_the_end_of_its_day_in_its_zone_across_dst() {
        let f = freeze("2026-12-20", "2027-01-03", "Europe/Berlin");
        assert_eq!(
            f.span().unwrap(),
            (t("2026-12-19T23:00:00Z"), t("2027-01-03T23:00:00Z"))
        );
        // Berlin springs forward in the night to the 29th: the day ends at 22:00Z, not 23:00Z.
        let f = freeze("2026-03-28", "2026-03-29", "Europe/Berlin");
        assert_eq!(
            f.span().unwrap(),
            (t("2026-03-27T23:00:00Z"), t("2026-03-29T22:00:00Z"))
        );
        // 02:30 does not exist that night: taken forward to 03:30 CEST.
        let f = freeze("2026-03-28", "2026-03-29T02:30", "Europe/Berlin");
        assert_eq!(f.span().unwrap().1, t("2026-03-29T01:30:00Z"));
        // 02:30 happens twice on 2026-10-25: the first, in CEST.
        let f = freeze("2026-10-24", "2026-10-25T02:30", "Europe/Berlin");
        assert_eq!(f.span().unwrap().1, t("2026-10-25T00:30:00Z"));
    }
}
