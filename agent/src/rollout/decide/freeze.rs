//! Change-freeze arithmetic, as a pure function: the freezes and `now` in; whether a freeze
//! holds now and until when, or when the next begins, out. Freezes that touch chain: a freeze
//! that ends where the next begins holds until the last of the chain ends.

use jiff::Timestamp;

use crate::config::Freeze;

/// A freeze as it stands at some moment: which (its index in `rollout.freezes`), why, and
/// its span (the end of the chain it begins, when freezes touch).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frozen {
    pub index: usize,
    pub reason: String,
    pub starts_at: Timestamp,
    pub ends_at: Timestamp,
}

/// The freezes' spans, in order of start; one whose span cannot be computed (the config
/// refuses it) is left out.
fn spans(freezes: &[Freeze]) -> Vec<(usize, Timestamp, Timestamp)> {
    let mut v: Vec<_> = freezes
        .iter()
        .enumerate()
        .filter_map(|(i, f)| f.span().ok().map(|(s, e)| (i, s, e)))
        .collect();
    v.sort_by_key(|&(_, s, _)| s);
    v
}

/// Extends `end` over the freezes that begin where (or before) it ends.
fn chain_end(all: &[(usize, Timestamp, Timestamp)], mut end: Timestamp) -> Timestamp {
    for &(_, s, e) in all {
        if s <= end && e > end {
            end = e;
        }
    }
    end
}

/// The freeze holding at `now`, if any.
pub fn frozen(freezes: &[Freeze], now: Timestamp) -> Option<Frozen> {
    let all = spans(freezes);
    let &(index, starts_at, end) = all.iter().find(|&&(_, s, e)| s <= now && now < e)?;
    Some(Frozen {
        index,
        reason: freezes[index].reason.clone(),
        starts_at,
        ends_at: chain_end(&all, end),
    })
}

/// The freeze holding at `now`, else the next to begin.
pub fn current_or_next(freezes: &[Freeze], now: Timestamp) -> Option<Frozen> {
    frozen(freezes, now).or_else(|| {
        let all = spans(freezes);
        let &(index, starts_at, end) = all.iter().find(|&&(_, s, _)| s > now)?;
        Some(Frozen {
            index,
            reason: freezes[index].reason.clone(),
            starts_at,
            ends_at: chain_end(&all, end),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::CivilPoint;

    fn t(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn freeze(start: &str, end: &str, tz: &str, reason: &str) -> Freeze {
        Freeze {
            start: CivilPoint::try_from(start.to_owned()).unwrap(),
            end: CivilPoint::try_from(end.to_owned()).unwrap(),
            time_zone: tz.into(),
            reason: reason.into(),
        }
    }

    #[test]
    fn a_freeze_holds_from_its_start_to_its_end_and_says_what_comes_next() {
        let fs = [freeze(
            "2026-12-20",
            "2027-01-03",
            "Europe/Berlin",
            "year-end",
        )];
        assert_eq!(frozen(&fs, t("2026-12-19T22:59:59Z")), None);
        let next = current_or_next(&fs, t("2026-12-19T22:59:59Z")).unwrap();
        assert_eq!(next.starts_at, t("2026-12-19T23:00:00Z"));
        let f = frozen(&fs, t("2026-12-19T23:00:00Z")).unwrap();
        assert_eq!(
            f,
            Frozen {
                index: 0,
                reason: "year-end".into(),
                starts_at: t("2026-12-19T23:00:00Z"),
                ends_at: t("2027-01-03T23:00:00Z"),
            }
        );
        assert_eq!(frozen(&fs, t("2027-01-03T23:00:00Z")), None);
        assert_eq!(current_or_next(&fs, t("2027-01-03T23:00:00Z")), None);
    }

    #[test]
    fn freezes_that_touch_hold_until_the_last_ends() {
        let fs = [
            freeze("2027-01-04", "2027-01-05", "UTC", "second"),
            freeze("2026-12-20", "2027-01-03", "UTC", "first"),
        ];
        let f = frozen(&fs, t("2026-12-25T00:00:00Z")).unwrap();
        assert_eq!((f.index, f.ends_at), (1, t("2027-01-06T00:00:00Z")));
        let f = frozen(&fs, t("2027-01-05T12:00:00Z")).unwrap();
        assert_eq!((f.index, f.reason.as_str()), (0, "second"));
    }

    #[test]
    fn a_freeze_ending_on_the_night_clocks_spring_forward_ends_an_hour_earlier_in_utc() {
        let fs = [freeze("2026-03-28", "2026-03-29", "Europe/Berlin", "dst")];
        assert!(frozen(&fs, t("2026-03-29T21:59:59Z")).is_some());
        assert_eq!(
            frozen(&fs, t("2026-03-29T21:59:59Z")).unwrap().ends_at,
            t("2026-03-29T22:00:00Z")
        );
        assert_eq!(frozen(&fs, t("2026-03-29T22:00:00Z")), None);
    }
}
