//! HTTP(S) endpoints the health probes call (`health.kubelet.url`, `health.apiserver.*_url`,
//! `health.cilium.fallback_url`).
//!
//! An [`EndpointUrl`] is parsed once; the form that is shown (logs, status, errors,
//! `check-config`) is built then, by the same rule as a Git remote's: no user name or password,
//! every query value and the fragment replaced by `***`. The URL as written is only handed to
//! the client that makes the request.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::remote::{check_unambiguous, hides_credentials, redacted};

/// An `http://` or `https://` URL from the configuration. Two are equal when they parse alike.
#[derive(Clone)]
pub struct EndpointUrl {
    url: url::Url,
    /// As written; what the request is made to. Never printed.
    raw: String,
    /// What humans see.
    shown: String,
}

impl EndpointUrl {
    /// The parsed URL, for the request. Do not log it.
    pub fn url(&self) -> &url::Url {
        &self.url
    }

    /// The URL as written, for the request. Do not log it.
    pub fn as_request_str(&self) -> &str {
        &self.raw
    }

    pub fn scheme(&self) -> &str {
        self.url.scheme()
    }
}

impl PartialEq for EndpointUrl {
    fn eq(&self, other: &Self) -> bool {
        self.url == other.url
    }
}

impl Eq for EndpointUrl {}

impl FromStr for EndpointUrl {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let raw = s.trim();
        check_unambiguous(raw)?;
        // The url crate's messages never echo the input.
        let url = url::Url::parse(raw).map_err(|e| format!("invalid URL: {e}"))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err("not an http:// or https:// URL".to_owned());
        }
        Ok(Self {
            // As written when there is nothing to hide, so that defaults print as documented.
            shown: if hides_credentials(&url, false) {
                redacted(&url, false)
            } else {
                raw.to_owned()
            },
            raw: raw.to_owned(),
            url,
        })
    }
}

impl fmt::Display for EndpointUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.shown)
    }
}

impl fmt::Debug for EndpointUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "EndpointUrl({})", self.shown)
    }
}

impl Serialize for EndpointUrl {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.shown)
    }
}

impl<'de> Deserialize<'de> for EndpointUrl {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_url_credentials_are_never_shown() {
        let u: EndpointUrl = "http://u:SECRET@127.0.0.1:10248/healthz?token=SECRET"
            .parse()
            .unwrap();
        assert_eq!(u.to_string(), "http://127.0.0.1:10248/healthz?token=***");
        assert!(!format!("{u:?}").contains("SECRET"));
        assert!(u.as_request_str().contains("SECRET"));
        let plain: EndpointUrl = "https://127.0.0.1:6443".parse().unwrap();
        assert_eq!(plain.to_string(), "https://127.0.0.1:6443");
    }

    #[test]
    fn an_ambiguous_probe_url_is_refused_without_echo() {
        for raw in [
            "http:/u:SECRET@host/x",
            "http://u:SE@CRET@host/x",
            "ftp://u:SECRET@host/",
            "u:SECRET@host",
        ] {
            let e = raw.parse::<EndpointUrl>().unwrap_err();
            assert!(!e.contains("SECRET") && !e.contains("CRET"), "{raw}: {e}");
        }
    }
}
