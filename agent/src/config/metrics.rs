//! `[metrics]`: where the Prometheus exposition listens.

use serde::{Deserialize, Serialize};

/// Prometheus metrics.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// Off unless set, e.g. `"127.0.0.1:9977"`.
    #[serde(
        skip_serializing_if = "Option::is_none",
        deserialize_with = "socket_address"
    )]
    pub listen: Option<std::net::SocketAddr>,
}

/// An `IP:PORT`, with an example when it is not one (a host name is not resolved).
fn socket_address<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<std::net::SocketAddr>, D::Error> {
    let s = String::deserialize(d)?;
    s.parse().map(Some).map_err(|_| {
        serde::de::Error::custom(format!(
            "{s:?} is not an address; write IP:PORT, like \"127.0.0.1:9977\" or \"[::1]:9977\""
        ))
    })
}
