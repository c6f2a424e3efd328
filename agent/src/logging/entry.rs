//! One journal entry, as ginx writes it: what its MESSAGE says and how it is put on the wire.
//!
//! journald's convention (systemd's own units, sshd, the kubelet) is that MESSAGE is the whole
//! sentence a person reads in `journalctl -u ginx` and `systemctl status ginx`; structured
//! fields are for filtering, and repeat what MESSAGE says rather than replace it. So MESSAGE is
//! the event's text followed by its fields as `key=value`, as the stderr format prints them
//! (a string quoted, a displayed value as it displays); the same fields are written once more
//! as journal fields (`REVISION=…`, `SOURCE=…`) for `journalctl -u ginx REVISION=…`.
//!
//! A field whose journal name is one journald or its readers give a meaning (MESSAGE,
//! PRIORITY, UNIT, CODE_FILE … see systemd.journal-fields(7)) is written as `GINX_<NAME>`
//! instead, so that it can never become a second MESSAGE or make an entry look like it is
//! about another unit. The call sites are checked so that none needs this (`sites.rs`).
//!
//! Pure: no I/O. The wire format is journald's native protocol
//! (<https://systemd.io/JOURNAL_NATIVE_PROTOCOL/>), every field length-encoded.

/// Journal fields with a meaning of their own (systemd.journal-fields(7), and what ginx writes
/// itself): a field of an event never takes one of these names.
pub const RESERVED: &[&str] = &[
    "MESSAGE",
    "MESSAGE_ID",
    "PRIORITY",
    "CODE_FILE",
    "CODE_LINE",
    "CODE_FUNC",
    "ERRNO",
    "INVOCATION_ID",
    "USER_INVOCATION_ID",
    "SYSLOG_FACILITY",
    "SYSLOG_IDENTIFIER",
    "SYSLOG_PID",
    "SYSLOG_TIMESTAMP",
    "SYSLOG_RAW",
    "DOCUMENTATION",
    "TID",
    "UNIT",
    "USER_UNIT",
    // Written by ginx: the module the event comes from.
    "TARGET",
];

/// Prefixes of journal fields that describe another process or unit than the sender.
pub const RESERVED_PREFIXES: &[&str] = &["OBJECT_", "COREDUMP_"];

/// The longest a field's value is shown in MESSAGE; the journal field keeps all of it.
pub const SHOWN_MAX: usize = 4096;

/// One field of an event or of the span it runs in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Field {
    /// The name in the code (`revision`, `a.reason`).
    pub name: String,
    /// The value as the journal field holds it: a string as it is, anything else formatted.
    pub value: String,
    /// The value as MESSAGE shows it, after `name=`: as the stderr format prints it.
    pub shown: String,
}

/// What one event becomes in the journal.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Entry {
    /// syslog priority: 3 error, 4 warning, 5 notice (info), 6 informational (debug), 7 debug.
    pub priority: u8,
    /// The event's text (its format string, formatted).
    pub text: String,
    /// The event's own fields, in the order written.
    pub fields: Vec<Field>,
    /// The fields of the spans it runs in, outermost first (`revision`, `attempt` of an apply).
    pub context: Vec<Field>,
    /// The module path.
    pub target: String,
    pub file: Option<String>,
    pub line: Option<u32>,
}

impl Entry {
    /// The text, then every field and every span field as ` key=value`.
    pub fn message(&self) -> String {
        let mut m = self.text.clone();
        for f in self.fields.iter().chain(&self.context) {
            if !m.is_empty() {
                m.push(' ');
            }
            m.push_str(&f.name);
            m.push('=');
            m.push_str(&cut(&f.shown, SHOWN_MAX));
        }
        m
    }

    /// The datagram for journald: MESSAGE, PRIORITY, SYSLOG_IDENTIFIER, where in the code,
    /// then the fields under their journal names (span fields first, so that an event's own
    /// field of the same name is the one `journalctl -o json` shows last).
    pub fn encode(&self, identifier: &str) -> Vec<u8> {
        let mut buf = Vec::with_capacity(256);
        put(&mut buf, "MESSAGE", &self.message());
        put(&mut buf, "PRIORITY", &self.priority.to_string());
        put(&mut buf, "SYSLOG_IDENTIFIER", identifier);
        put(&mut buf, "TARGET", &self.target);
        if let Some(file) = &self.file {
            put(&mut buf, "CODE_FILE", file);
        }
        if let Some(line) = self.line {
            put(&mut buf, "CODE_LINE", &line.to_string());
        }
        for f in self.context.iter().chain(&self.fields) {
            if let Some(name) = journal_name(&f.name) {
                put(&mut buf, &name, &f.value);
            }
        }
        buf
    }
}

/// The journal field for a field of the code: upper-cased, dots as underscores, anything else
/// but letters, digits and underscores dropped, no leading underscore (journald keeps those
/// for what it adds itself). A reserved name gets the prefix `GINX_`. `None` when nothing is
/// left of it.
pub fn journal_name(name: &str) -> Option<String> {
    let sanitized: String = name
        .chars()
        .map(|c| if c == '.' { '_' } else { c })
        .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
        .map(|c| c.to_ascii_uppercase())
        .skip_while(|c| *c == '_')
        .collect();
    if sanitized.is_empty() {
        return None;
    }
    let taken = reserved(&sanitized) || sanitized.starts_with(|c: char| c.is_ascii_digit());
    let name = if taken {
        format!("GINX_{sanitized}")
    } else {
        sanitized
    };
    // journald refuses names longer than 64 bytes.
    Some(name.chars().take(64).collect())
}

/// Whether journald or its readers give `name` (already sanitized) a meaning of their own.
pub fn reserved(name: &str) -> bool {
    RESERVED.contains(&name) || RESERVED_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// `s` cut to `max` characters, with an ellipsis when something was cut.
fn cut(s: &str, max: usize) -> std::borrow::Cow<'_, str> {
    match s.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &s[..at]).into(),
        None => s.into(),
    }
}

/// One field, length-encoded: `NAME\n`, the value's length as 64-bit little endian, the value,
/// `\n`. Valid for any value, newlines included.
fn put(buf: &mut Vec<u8>, name: &str, value: &str) {
    buf.extend_from_slice(name.as_bytes());
    buf.push(b'\n');
    buf.extend_from_slice(&(value.len() as u64).to_le_bytes());
    buf.extend_from_slice(value.as_bytes());
    buf.push(b'\n');
}

/// The fields of a datagram made by [`Entry::encode`], in order (for tests of the layer).
#[cfg(test)]
pub fn decode(mut buf: &[u8]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    while let Some(nl) = buf.iter().position(|b| *b == b'\n') {
        let name = String::from_utf8_lossy(&buf[..nl]).into_owned();
        let len = u64::from_le_bytes(buf[nl + 1..nl + 9].try_into().unwrap()) as usize;
        let value = String::from_utf8_lossy(&buf[nl + 9..nl + 9 + len]).into_owned();
        out.push((name, value));
        buf = &buf[nl + 10 + len..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(name: &str, value: &str, shown: &str) -> Field {
        Field {
            name: name.into(),
            value: value.into(),
            shown: shown.into(),
        }
    }

    fn reload_failed() -> Entry {
        Entry {
            priority: 3,
            text: "configuration reload failed; the running configuration stays in force".into(),
            fields: vec![field(
                "error",
                "/etc/ginx/config.toml:1:20: unclosed table",
                "/etc/ginx/config.toml:1:20: unclosed table",
            )],
            context: vec![field("attempt", "3", "3")],
            target: "ginx::daemon::reload".into(),
            file: Some("agent/src/daemon/reload.rs".into()),
            line: Some(34),
        }
    }

    #[test]
    fn the_message_carries_the_fields_after_the_text() {
        assert_eq!(
            reload_failed().message(),
            "configuration reload failed; the running configuration stays in force \
             error=/etc/ginx/config.toml:1:20: unclosed table attempt=3"
        );
        let fields_only = Entry {
            fields: vec![field("probe", "kubelet", "\"kubelet\"")],
            ..Entry::default()
        };
        assert_eq!(fields_only.message(), "probe=\"kubelet\"");
        let long = Entry {
            text: "x".into(),
            fields: vec![field("out", &"y".repeat(5000), &"y".repeat(5000))],
            ..Entry::default()
        };
        let m = long.message();
        assert!(
            m.ends_with('…') && m.chars().count() == 2 + 4 + SHOWN_MAX + 1,
            "{m}"
        );
    }

    #[test]
    fn the_datagram_has_one_message_and_the_fields_under_journal_names() {
        let e = Entry {
            fields: vec![
                field("message", "running", "running"),
                field("a.reason", "why", "why"),
                field("unit", "kubelet.service", "kubelet.service"),
            ],
            ..reload_failed()
        };
        let fields = decode(&e.encode("ginx"));
        let names: Vec<&str> = fields.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "MESSAGE",
                "PRIORITY",
                "SYSLOG_IDENTIFIER",
                "TARGET",
                "CODE_FILE",
                "CODE_LINE",
                "ATTEMPT",
                "GINX_MESSAGE",
                "A_REASON",
                "GINX_UNIT"
            ]
        );
        assert_eq!(fields[1].1, "3");
        assert!(fields[0].1.contains("message=running a.reason=why"));
    }

    #[test]
    fn names_are_sanitized_and_reserved_ones_prefixed() {
        for (code, journal) in [
            ("revision", Some("REVISION")),
            ("held.slot", Some("HELD_SLOT")),
            ("_private", Some("PRIVATE")),
            ("priority", Some("GINX_PRIORITY")),
            ("code_file", Some("GINX_CODE_FILE")),
            ("object_pid", Some("GINX_OBJECT_PID")),
            ("9lives", Some("GINX_9LIVES")),
            ("--", None),
        ] {
            assert_eq!(journal_name(code).as_deref(), journal, "{code}");
        }
        assert_eq!(journal_name(&"a".repeat(100)).unwrap().len(), 64);
    }

    #[test]
    fn a_value_with_newlines_survives_the_wire() {
        let e = Entry {
            text: "two\nlines".into(),
            ..Entry::default()
        };
        assert_eq!(decode(&e.encode("ginx"))[0].1, "two\nlines");
    }
}
