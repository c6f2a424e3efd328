//! A duration as written in the configuration: `"30s"`, `"10m"`, `"1h 30m"`.
//!
//! Parsing accepts jiff's "friendly" format (and ISO 8601); printing always uses the friendly
//! form, so `ginx check-config` shows durations the way an operator writes them.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A non-negative span of time from the configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Duration(std::time::Duration);

impl Duration {
    pub const fn from_secs(secs: u64) -> Self {
        Self(std::time::Duration::from_secs(secs))
    }

    pub const fn from_millis(millis: u64) -> Self {
        Self(std::time::Duration::from_millis(millis))
    }

    pub const fn get(self) -> std::time::Duration {
        self.0
    }

    pub const fn is_zero(self) -> bool {
        self.0.is_zero()
    }
}

impl From<std::time::Duration> for Duration {
    fn from(d: std::time::Duration) -> Self {
        Self(d)
    }
}

impl From<Duration> for std::time::Duration {
    fn from(d: Duration) -> Self {
        d.0
    }
}

impl FromStr for Duration {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let trimmed = s.trim();
        if trimmed.is_empty() {
            return Err("empty duration; write one like \"30s\", \"10m\" or \"1h 30m\"".into());
        }
        let parsed: jiff::SignedDuration = trimmed.parse().map_err(|_| {
            format!(
                "invalid duration {s:?}; write one like \"30s\", \"10m\" or \"1h 30m\" \
                 (units: ms, s, m, h)"
            )
        })?;
        let std = std::time::Duration::try_from(parsed)
            .map_err(|_| format!("invalid duration {s:?}: must not be negative"))?;
        Ok(Self(std))
    }
}

impl fmt::Display for Duration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match jiff::SignedDuration::try_from(self.0) {
            Ok(d) => write!(f, "{d:#}"),
            Err(_) => write!(f, "{}s", self.0.as_secs()),
        }
    }
}

impl Serialize for Duration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Duration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Duration;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration string like \"30s\" or \"10m\"")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Duration, E> {
                v.parse().map_err(E::custom)
            }
        }
        d.deserialize_str(Visitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_forms_operators_write() {
        assert_eq!("30s".parse::<Duration>().unwrap(), Duration::from_secs(30));
        assert_eq!("10m".parse::<Duration>().unwrap(), Duration::from_secs(600));
        assert_eq!(
            "1h30m".parse::<Duration>().unwrap(),
            Duration::from_secs(5400)
        );
        assert_eq!(
            "1h 30m".parse::<Duration>().unwrap(),
            Duration::from_secs(5400)
        );
        assert_eq!(
            "250ms".parse::<Duration>().unwrap(),
            Duration::from_millis(250)
        );
    }

    #[test]
    fn rejects_bare_numbers_negative_and_empty() {
        assert!("90".parse::<Duration>().unwrap_err().contains("\"30s\""));
        assert!("-5s".parse::<Duration>().unwrap_err().contains("negative"));
        assert!("".parse::<Duration>().is_err());
        assert!("5 parsecs".parse::<Duration>().is_err());
    }

    #[test]
    fn prints_back_in_the_friendly_form() {
        assert_eq!(Duration::from_secs(90).to_string(), "1m 30s");
        assert_eq!(Duration::from_secs(60).to_string(), "1m");
        assert_eq!(Duration::from_millis(1500).to_string(), "1s 500ms");
        let round: Duration = Duration::from_secs(5400).to_string().parse().unwrap();
        assert_eq!(round, Duration::from_secs(5400));
    }
}
