//! [`ServerClock`]: the API server's wall clock as ginx's own writes found it.

use super::writes::FIELD_MANAGER;

/// The API server's wall clock as seen from this node: the time the server stamps in
/// `managedFields` on each of ginx's Lease writes, carried forward on this node's monotonic
/// clock. Leases are written in it (`renewTime`, `acquireTime`), so a node whose wall clock is
/// off, or steps, still writes times the server (and `vap.yaml`, which allows 30 s) takes for
/// now. Nothing ginx decides rests on it: slots expire by observation on the monotonic clock.
#[derive(Clone, Debug, Default)]
pub struct ServerClock(
    std::sync::Arc<std::sync::Mutex<Option<(jiff::Timestamp, std::time::Instant)>>>,
);

/// A difference this small is within what a whole-second stamp can tell: taken as none.
const CLOCK_PRECISION: jiff::SignedDuration = jiff::SignedDuration::from_millis(1500);

impl ServerClock {
    /// The server's time now: this node's wall clock when it agrees with the last stamp
    /// carried forward (within a second and a half), else that estimate.
    pub fn now(&self) -> jiff::Timestamp {
        let local = jiff::Timestamp::now();
        match self.estimate() {
            Some(server) if server.duration_since(local).abs() > CLOCK_PRECISION => server,
            _ => local,
        }
    }

    /// How far the server's clock is ahead of this node's (negative: behind), once learned.
    pub fn offset(&self) -> Option<jiff::SignedDuration> {
        self.estimate()
            .map(|server| server.duration_since(jiff::Timestamp::now()))
    }

    fn estimate(&self) -> Option<jiff::Timestamp> {
        let (at, seen) = (*self.0.lock().unwrap_or_else(|e| e.into_inner()))?;
        let ran = jiff::SignedDuration::try_from(seen.elapsed()).ok()?;
        at.checked_add(ran).ok()
    }

    /// Learns from the answer `meta` to a write of ginx's sent at `sent` and answered at
    /// `received` (monotonic) that changed a field, so that the server stamped it. Logs when
    /// the offset first is, or stops being, more than a few seconds.
    pub fn learn(
        &self,
        meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
        sent: std::time::Instant,
        received: std::time::Instant,
    ) {
        let stamp = meta
            .managed_fields
            .iter()
            .flatten()
            .filter(|m| {
                m.manager.as_deref() == Some(FIELD_MANAGER)
                    && m.operation.as_deref() == Some("Update")
            })
            .filter_map(|m| m.time.as_ref().map(|t| t.0))
            .max();
        let Some(stamp) = stamp else { return };
        let before = self.offset();
        // The stamp is cut to the second: the server's time was within the second after it,
        // at about the middle of the request.
        let server = stamp + jiff::SignedDuration::from_millis(500);
        let middle = sent + received.saturating_duration_since(sent) / 2;
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some((server, middle));
        let (Some(offset), before) = (self.offset(), before.unwrap_or_default()) else {
            return;
        };
        let far = |o: jiff::SignedDuration| o.abs() > jiff::SignedDuration::from_secs(5);
        if far(offset) && (offset - before).abs() > jiff::SignedDuration::from_secs(5) {
            tracing::warn!(offset = %format!("{offset:#}"),
                "the API server's clock is this far from this node's: ginx writes its Leases in the server's time; fix this node's clock (NTP)");
        } else if far(before) && !far(offset) {
            tracing::info!("this node's clock agrees with the API server's again");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, ObjectMeta, Time};

    fn stamped(t: jiff::Timestamp) -> ObjectMeta {
        ObjectMeta {
            managed_fields: Some(vec![ManagedFieldsEntry {
                manager: Some(FIELD_MANAGER.to_owned()),
                operation: Some("Update".to_owned()),
                time: Some(Time(t.round(jiff::Unit::Second).unwrap())),
                ..ManagedFieldsEntry::default()
            }]),
            ..ObjectMeta::default()
        }
    }

    #[test]
    fn the_servers_time_is_carried_on_the_monotonic_clock() {
        let c = ServerClock::default();
        let local = jiff::Timestamp::now();
        assert!(c.offset().is_none());
        assert!(c.now().duration_since(local).abs() < jiff::SignedDuration::from_secs(1));
        // A server 10 minutes ahead.
        let i = std::time::Instant::now();
        c.learn(&stamped(local + jiff::SignedDuration::from_mins(10)), i, i);
        let ahead = c.now().duration_since(jiff::Timestamp::now());
        assert!(
            (ahead - jiff::SignedDuration::from_mins(10)).abs()
                < jiff::SignedDuration::from_secs(2),
            "{ahead:?}"
        );
        // A server that agrees: this node's own clock, exactly.
        let i = std::time::Instant::now();
        c.learn(&stamped(jiff::Timestamp::now()), i, i);
        let before = jiff::Timestamp::now();
        let now = c.now();
        assert!(
            now >= before && now.duration_since(before) < jiff::SignedDuration::from_millis(100)
        );
        // Writes of others (no entry of ginx's) teach nothing.
        c.learn(&ObjectMeta::default(), i, i);
        assert!(c.offset().unwrap().abs() < jiff::SignedDuration::from_secs(2));
    }
}
