//! Maintenance-window arithmetic, as a pure function: the windows and `now` in, open (until
//! when) or closed (until when) out. No clock, no I/O beyond the tz database lookup.
//!
//! A window starts on each of its days (in the weeks of the month it names, if any) or dates
//! at its local start time and lasts its length of elapsed time. A start inside a DST gap moves forward by the gap (02:30 on the day Berlin
//! springs forward is 03:30 CEST); a start inside a fold is its first occurrence (02:30 on the
//! day Berlin falls back is 02:30 CEST, once). Windows that overlap or touch count as one.

use jiff::civil::Date;
use jiff::tz::TimeZone;
use jiff::{SignedDuration, Timestamp, ToSpan};

use crate::config::Window;

/// Where `now` stands against the windows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WindowState {
    /// No windows configured: always open.
    Always,
    Open {
        closes_at: Timestamp,
    },
    /// `opens_at` is `None` when no window opens again: every date they name is past.
    Closed {
        opens_at: Option<Timestamp>,
    },
}

impl WindowState {
    pub fn is_open(self) -> bool {
        !matches!(self, WindowState::Closed { .. })
    }
}

/// Every occurrence of `w` starting near `now`, as (start, end): within eight days before and
/// after (forty after for the weeks of a month, so the next first Tuesday is among them), or on
/// each of its dates.
fn occurrences(w: &Window, now: Timestamp) -> Vec<(Timestamp, Timestamp)> {
    let tz = TimeZone::get(&w.time_zone).unwrap_or(TimeZone::UTC);
    let length = SignedDuration::try_from(w.length.get()).unwrap_or(SignedDuration::ZERO);
    let days: Vec<Date> = if w.dates.is_empty() {
        let today: Date = now.to_zoned(tz.clone()).date();
        let ahead = if w.weeks.is_empty() { 8 } else { 40 };
        (-8i64..=ahead)
            .filter_map(|offset| today.checked_add(offset.days()).ok())
            .filter(|day| w.days.iter().any(|d| d.weekday() == day.weekday()))
            .filter(|day| w.weeks.is_empty() || w.weeks.iter().any(|wk| wk.holds(*day)))
            .collect()
    } else {
        w.dates.iter().map(|d| d.0).collect()
    };
    days.into_iter()
        .filter_map(|day| {
            let local = day.to_datetime(w.start.0);
            // `compatible`: a gap moves forward by its length, a fold takes the earlier time.
            let start = tz.to_ambiguous_zoned(local).compatible().ok()?.timestamp();
            Some((start, start.checked_add(length).ok()?))
        })
        .collect()
}

/// Whether `now` is inside one of `windows`, and until when; or when the next one opens.
pub fn state(windows: &[Window], now: Timestamp) -> WindowState {
    if windows.is_empty() {
        return WindowState::Always;
    }
    let mut all: Vec<(Timestamp, Timestamp)> =
        windows.iter().flat_map(|w| occurrences(w, now)).collect();
    all.sort();
    let mut open_until: Option<Timestamp> = None;
    for &(start, end) in &all {
        match open_until {
            None if start <= now && now < end => open_until = Some(end),
            // Overlapping or touching the open one: one window.
            Some(until) if start <= until && end > until => open_until = Some(end),
            _ => {}
        }
    }
    match open_until {
        Some(closes_at) => WindowState::Open { closes_at },
        None => WindowState::Closed {
            opens_at: all.iter().map(|(s, _)| *s).find(|s| *s > now),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ClockTime, Day, Duration};

    fn window(days: &[Day], start: &str, length_secs: u64, tz: &str) -> Window {
        Window {
            days: days.to_vec(),
            weeks: Vec::new(),
            dates: Vec::new(),
            start: ClockTime::try_from(start.to_owned()).unwrap(),
            length: Duration::from_secs(length_secs),
            time_zone: tz.to_owned(),
        }
    }

    fn t(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    const H: u64 = 3600;

    #[test]
    fn no_windows_is_always_open() {
        assert_eq!(state(&[], t("2026-12-01T12:00:00Z")), WindowState::Always);
    }

    #[test]
    fn utc_opens_at_its_start_and_closes_after_its_length() {
        // 2026-11-30 is a Monday.
        let w = [window(&[Day::Mon], "02:00", 3 * H, "UTC")];
        assert_eq!(
            state(&w, t("2026-11-30T01:59:59Z")),
            WindowState::Closed {
                opens_at: Some(t("2026-11-30T02:00:00Z"))
            }
        );
        assert_eq!(
            state(&w, t("2026-11-30T02:00:00Z")),
            WindowState::Open {
                closes_at: t("2026-11-30T05:00:00Z")
            }
        );
        assert_eq!(
            state(&w, t("2026-11-30T05:00:00Z")),
            WindowState::Closed {
                opens_at: Some(t("2026-12-07T02:00:00Z"))
            }
        );
    }

    #[test]
    fn a_window_over_midnight_is_open_the_next_morning() {
        // Friday 2026-12-04 23:00 for 3 h: open on Saturday at 01:00, until 02:00.
        let w = [window(&[Day::Fri], "23:00", 3 * H, "UTC")];
        assert_eq!(
            state(&w, t("2026-12-05T01:00:00Z")),
            WindowState::Open {
                closes_at: t("2026-12-05T02:00:00Z")
            }
        );
        assert_eq!(
            state(&w, t("2026-12-05T02:00:00Z")),
            WindowState::Closed {
                opens_at: Some(t("2026-12-11T23:00:00Z"))
            }
        );
    }

    #[test]
    fn a_start_in_the_spring_gap_moves_forward_by_the_gap() {
        // Berlin, Sunday 2026-03-29: 02:00 CET jumps to 03:00 CEST, 02:30 does not exist.
        let w = [window(&[Day::Sun], "02:30", H, "Europe/Berlin")];
        assert_eq!(
            state(&w, t("2026-03-29T00:00:00Z")),
            WindowState::Closed {
                // 03:30 CEST
                opens_at: Some(t("2026-03-29T01:30:00Z"))
            }
        );
        assert_eq!(
            state(&w, t("2026-03-29T01:30:00Z")),
            WindowState::Open {
                closes_at: t("2026-03-29T02:30:00Z")
            }
        );
        // The week before, 02:30 CET is 01:30Z.
        assert_eq!(
            state(&w, t("2026-03-22T01:30:00Z")),
            WindowState::Open {
                closes_at: t("2026-03-22T02:30:00Z")
            }
        );
    }

    #[test]
    fn a_length_is_elapsed_time_across_the_spring_change() {
        // 01:00 CET for 3 h ends at 05:00 CEST (04:00 by the old clock), three real hours.
        let w = [window(&[Day::Sun], "01:00", 3 * H, "Europe/Berlin")];
        assert_eq!(
            state(&w, t("2026-03-29T00:00:00Z")),
            WindowState::Open {
                closes_at: t("2026-03-29T03:00:00Z")
            }
        );
    }

    #[test]
    fn a_start_in_the_autumn_fold_happens_once_at_its_first_occurrence() {
        // Berlin, Sunday 2026-10-25: 03:00 CEST goes back to 02:00 CET; 02:30 happens twice.
        let w = [window(&[Day::Sun], "02:30", H, "Europe/Berlin")];
        // The first 02:30 (CEST) is 00:30Z.
        assert_eq!(
            state(&w, t("2026-10-25T00:30:00Z")),
            WindowState::Open {
                closes_at: t("2026-10-25T01:30:00Z")
            }
        );
        // The second 02:30 (CET, 01:30Z) does not open it again: next Sunday, 02:30 CET.
        assert_eq!(
            state(&w, t("2026-10-25T01:45:00Z")),
            WindowState::Closed {
                opens_at: Some(t("2026-11-01T01:30:00Z"))
            }
        );
    }

    #[test]
    fn overlapping_windows_are_one_and_the_soonest_opens_first() {
        let w = [
            window(&[Day::Sat], "01:00", 2 * H, "UTC"),
            window(&[Day::Sat], "02:30", 2 * H, "UTC"),
            window(&[Day::Sat, Day::Sun], "12:00", H, "Europe/Berlin"),
        ];
        // Saturday 2026-12-05.
        assert_eq!(
            state(&w, t("2026-12-05T01:30:00Z")),
            WindowState::Open {
                closes_at: t("2026-12-05T04:30:00Z")
            }
        );
        // After both: Berlin noon (CET) is 11:00Z the same day.
        assert_eq!(
            state(&w, t("2026-12-05T05:00:00Z")),
            WindowState::Closed {
                opens_at: Some(t("2026-12-05T11:00:00Z"))
            }
        );
    }

    #[test]
    fn a_week_long_window_on_every_day_is_always_open() {
        let all = [
            Day::Mon,
            Day::Tue,
            Day::Wed,
            Day::Thu,
            Day::Fri,
            Day::Sat,
            Day::Sun,
        ];
        let w = [window(&all, "00:00", 24 * H, "UTC")];
        assert!(state(&w, t("2026-12-01T12:34:56Z")).is_open());
    }

    #[test]
    fn clock_times_are_checked() {
        for bad in [
            "2:00",
            "24:00",
            "02:60",
            "02:00:60",
            "ab:cd",
            "02",
            "02:00:00:00",
            "",
        ] {
            assert!(ClockTime::try_from(bad.to_owned()).is_err(), "{bad}");
        }
        let t = ClockTime::try_from("02:00:30".to_owned()).unwrap();
        assert_eq!(String::from(t), "02:00:30");
        assert_eq!(
            String::from(ClockTime::try_from("23:59".to_owned()).unwrap()),
            "23:59"
        );
    }

    fn on(w: Window, days: &[Day], weeks: &[crate::config::Week]) -> Window {
        Window {
            days: days.to_vec(),
            weeks: weeks.to_vec(),
            ..w
        }
    }

    fn dated(start: &str, length_secs: u64, tz: &str, dates: &[&str]) -> Window {
        Window {
            days: Vec::new(),
            dates: dates
                .iter()
                .map(|d| crate::config::CivilDate::try_from(d.to_string()).unwrap())
                .collect(),
            ..window(&[], start, length_secs, tz)
        }
    }

    #[test]
    fn the_first_tuesday_of_the_month_is_found_five_weeks_ahead() {
        use crate::config::Week;
        // 2026-12-01 is the first Tuesday of December; the next is 2027-01-05.
        let w = [on(
            window(&[], "02:00", H, "UTC"),
            &[Day::Tue],
            &[Week::First],
        )];
        assert_eq!(
            state(&w, t("2026-12-01T02:30:00Z")),
            WindowState::Open {
                closes_at: t("2026-12-01T03:00:00Z")
            }
        );
        assert_eq!(
            state(&w, t("2026-12-01T03:00:00Z")),
            WindowState::Closed {
                opens_at: Some(t("2027-01-05T02:00:00Z"))
            }
        );
        // The second and the last Tuesday of December 2026: the 8th and the 29th.
        let w = [on(
            window(&[], "02:00", H, "UTC"),
            &[Day::Tue],
            &[Week::Second, Week::Last],
        )];
        assert_eq!(
            state(&w, t("2026-12-02T00:00:00Z")),
            WindowState::Closed {
                opens_at: Some(t("2026-12-08T02:00:00Z"))
            }
        );
        assert_eq!(
            state(&w, t("2026-12-09T00:00:00Z")),
            WindowState::Closed {
                opens_at: Some(t("2026-12-29T02:00:00Z"))
            }
        );
    }

    #[test]
    fn the_last_sunday_of_march_and_october_keep_to_the_dst_rules() {
        use crate::config::Week;
        // Berlin's changes fall on the last Sundays: 2026-03-29 (02:30 does not exist, moved
        // to 03:30 CEST) and 2026-10-25 (02:30 happens twice, the first is taken).
        let w = [on(
            window(&[], "02:30", H, "Europe/Berlin"),
            &[Day::Sun],
            &[Week::Last],
        )];
        assert_eq!(
            state(&w, t("2026-03-20T00:00:00Z")),
            WindowState::Closed {
                opens_at: Some(t("2026-03-29T01:30:00Z"))
            }
        );
        assert_eq!(
            state(&w, t("2026-10-20T00:00:00Z")),
            WindowState::Closed {
                opens_at: Some(t("2026-10-25T00:30:00Z"))
            }
        );
        assert_eq!(
            state(&w, t("2026-10-25T01:30:00Z")),
            WindowState::Closed {
                opens_at: Some(t("2026-11-29T01:30:00Z"))
            }
        );
    }

    #[test]
    fn dates_open_on_their_days_only_and_past_ones_never_again() {
        let w = [dated("23:00", 3 * H, "UTC", &["2026-12-24", "2026-12-31"])];
        assert_eq!(
            state(&w, t("2026-12-20T00:00:00Z")),
            WindowState::Closed {
                opens_at: Some(t("2026-12-24T23:00:00Z"))
            }
        );
        // Over midnight into the 25th.
        assert_eq!(
            state(&w, t("2026-12-25T01:00:00Z")),
            WindowState::Open {
                closes_at: t("2026-12-25T02:00:00Z")
            }
        );
        assert_eq!(
            state(&w, t("2026-12-25T02:00:00Z")),
            WindowState::Closed {
                opens_at: Some(t("2026-12-31T23:00:00Z"))
            }
        );
        assert_eq!(
            state(&w, t("2027-01-01T02:00:00Z")),
            WindowState::Closed { opens_at: None }
        );
        // A date and a weekly window together: whichever comes first.
        let both = [w[0].clone(), window(&[Day::Sat], "02:00", H, "UTC")];
        assert_eq!(
            state(&both, t("2027-01-01T02:00:00Z")),
            WindowState::Closed {
                opens_at: Some(t("2027-01-02T02:00:00Z"))
            }
        );
    }
}
