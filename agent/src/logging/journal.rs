//! The `tracing` layer that writes ginx's events to journald, each as one self-contained
//! entry (`entry.rs` says what it holds).
//!
//! ginx used `tracing-journald` before, which writes the event's text alone as MESSAGE and
//! every field only beside it, and has no way to change that; so `journalctl -u ginx` and
//! `systemctl status ginx` showed headlines without their reasons. This layer collects the
//! event's and its spans' fields, hands them to [`Entry`] and sends the result ([`Sender`]).
//! The priority mapping is the one it had: error 3, warn 4, info 5, debug 6, trace 7.

use std::fmt;

use tracing::field::{Field as TracingField, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

use super::entry::{Entry, Field};
use super::native::Sender;

/// Writes every event it sees to journald.
#[derive(Debug)]
pub struct Journal {
    sender: Sender,
    identifier: String,
}

impl Journal {
    pub fn new(sender: Sender, identifier: &str) -> Journal {
        Journal {
            sender,
            identifier: identifier.to_owned(),
        }
    }
}

/// The fields of a span, kept in its extensions until its events need them.
struct SpanFields(Vec<Field>);

/// Collects an event's text and fields.
#[derive(Default)]
struct Collect {
    text: Option<String>,
    fields: Vec<Field>,
}

impl Collect {
    fn add(&mut self, field: &TracingField, value: String, shown: String) {
        // The event's text; a second field named `message` would be a second MESSAGE, so it
        // is kept as a field (and named apart by `journal_name`).
        if field.name() == "message" && self.text.is_none() {
            self.text = Some(value);
            return;
        }
        self.fields.push(Field {
            name: field.name().to_owned(),
            value,
            shown,
        });
    }
}

impl Visit for Collect {
    fn record_str(&mut self, field: &TracingField, value: &str) {
        // As the stderr format does: a string quoted after `key=`, the text as it is.
        self.add(field, value.to_owned(), format!("{value:?}"));
    }

    fn record_debug(&mut self, field: &TracingField, value: &dyn fmt::Debug) {
        let v = format!("{value:?}");
        self.add(field, v.clone(), v);
    }
}

fn priority(level: &Level) -> u8 {
    match *level {
        Level::ERROR => 3,
        Level::WARN => 4,
        Level::INFO => 5,
        Level::DEBUG => 6,
        Level::TRACE => 7,
    }
}

impl<S> tracing_subscriber::Layer<S> for Journal
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut c = Collect::default();
        attrs.record(&mut c);
        span.extensions_mut().insert(SpanFields(c.fields));
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut c = Collect::default();
        values.record(&mut c);
        let mut ext = span.extensions_mut();
        if let Some(f) = ext.get_mut::<SpanFields>() {
            f.0.extend(c.fields);
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut c = Collect::default();
        event.record(&mut c);
        let mut context = Vec::new();
        if let Some(scope) = ctx.event_scope(event) {
            for span in scope.from_root() {
                if let Some(f) = span.extensions().get::<SpanFields>() {
                    context.extend(f.0.iter().cloned());
                }
            }
        }
        let meta = event.metadata();
        let entry = Entry {
            priority: priority(meta.level()),
            text: c.text.unwrap_or_default(),
            fields: c.fields,
            context,
            target: meta.target().to_owned(),
            file: meta.file().map(str::to_owned),
            line: meta.line(),
        };
        // Nowhere left to report a failed send to.
        let _ = self.sender.send(&entry.encode(&self.identifier));
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixDatagram;

    use tracing_subscriber::layer::SubscriberExt;

    use super::super::entry::decode;
    use super::*;

    /// The entries the layer sends for what `log` logs, as a journald at a socket of the test
    /// receives them.
    fn logged(log: impl FnOnce()) -> Vec<Vec<(String, String)>> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal.socket");
        let journald = UnixDatagram::bind(&path).unwrap();
        journald.set_nonblocking(true).unwrap();
        let layer = Journal::new(Sender::new(&path).unwrap(), "ginx");
        tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), log);
        let mut out = Vec::new();
        let mut buf = vec![0u8; 1 << 16];
        while let Ok(n) = journald.recv(&mut buf) {
            out.push(decode(&buf[..n]));
        }
        out
    }

    fn get<'a>(entry: &'a [(String, String)], name: &str) -> Vec<&'a str> {
        entry
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
            .collect()
    }

    #[test]
    fn message_is_the_text_and_the_fields_and_the_fields_stay() {
        let entries = logged(|| {
            let span = tracing::info_span!("apply", revision = "0123456789ab", attempt = 3);
            let _in = span.enter();
            tracing::error!(
                error = %"/etc/ginx/config.toml:1:20: unclosed table",
                source = "hephaestus",
                "configuration reload failed"
            );
        });
        assert_eq!(entries.len(), 1);
        let e = &entries[0];
        assert_eq!(
            get(e, "MESSAGE"),
            [
                "configuration reload failed error=/etc/ginx/config.toml:1:20: unclosed table \
                 source=\"hephaestus\" revision=\"0123456789ab\" attempt=3"
            ]
        );
        assert_eq!(get(e, "PRIORITY"), ["3"]);
        assert_eq!(get(e, "SYSLOG_IDENTIFIER"), ["ginx"]);
        assert_eq!(get(e, "SOURCE"), ["hephaestus"]);
        assert_eq!(get(e, "REVISION"), ["0123456789ab"]);
        assert_eq!(get(e, "ATTEMPT"), ["3"]);
        assert_eq!(
            get(e, "ERROR"),
            ["/etc/ginx/config.toml:1:20: unclosed table"]
        );
    }

    #[test]
    fn a_field_named_like_a_journal_field_never_makes_a_second_message() {
        let entries = logged(|| {
            tracing::info!(probe = "kubelet", message = %"running", "health changed");
            tracing::warn!(priority = 1, unit = "kubelet.service", "restarting");
        });
        let (first, second) = (&entries[0], &entries[1]);
        assert_eq!(get(first, "MESSAGE").len(), 1, "{first:?}");
        assert_eq!(get(first, "GINX_MESSAGE"), ["running"]);
        assert_eq!(get(second, "PRIORITY"), ["4"]);
        assert_eq!(get(second, "GINX_PRIORITY"), ["1"]);
        assert_eq!(get(second, "GINX_UNIT"), ["kubelet.service"]);
        assert!(get(second, "UNIT").is_empty());
    }
}
