//! What `nix store diff-closures <running system> <built system>` says changes between two
//! closures: per package, the versions that go and come, and how much its size moves.
//!
//! The format read here is Nix's (`src/nix/diff-closures.cc` in NixOS/nix, lines 53–61 and
//! 89–110): one line per package, in name order, `name: <gone> → <come>, <size>`, either part
//! left out when it did not change; versions joined by ", ", `∅` for none and `ε` for an empty
//! version; the size wrapped in ANSI colour codes even when not printed to a terminal. Up to
//! Nix 2.32 the size is `%+.1f KiB` (`+13.9 KiB`); from 2.33 it is scaled to KiB, MiB, GiB …
//! with a sign only when negative (`13.9 KiB`, `-6.4 MiB`). Both are read.
//!
//! Pure: the text in, the changes out.

pub use crate::types::PackageChange;

/// The packages of `output` that change, and the sum of their size changes in bytes.
pub fn parse(output: &str) -> (Vec<PackageChange>, i64) {
    let mut changes = Vec::new();
    for line in output.lines() {
        if let Some(c) = line_of(&strip_ansi(line)) {
            changes.push(c);
        }
    }
    let total = changes.iter().filter_map(|c| c.bytes).sum();
    (changes, total)
}

/// One line: `name: versions, size`, `name: versions` or `name: size`.
fn line_of(line: &str) -> Option<PackageChange> {
    let (name, rest) = line.split_once(": ")?;
    if name.is_empty() || name.contains(' ') {
        return None;
    }
    let mut change = PackageChange {
        name: name.to_owned(),
        from: Vec::new(),
        to: Vec::new(),
        bytes: None,
    };
    let (versions, size) = match rest.split_once(" → ") {
        Some((from, after)) => {
            // The size, if any, follows the last ", " that is followed by a size.
            let (to, size) = match after.rsplit_once(", ") {
                Some((to, s)) if bytes(s).is_some() => (to, Some(s)),
                _ => (after, None),
            };
            (Some((from, to)), size)
        }
        None => (None, Some(rest)),
    };
    if let Some((from, to)) = versions {
        change.from = versions_of(from);
        change.to = versions_of(to);
    }
    if let Some(s) = size {
        change.bytes = Some(bytes(s)?);
    }
    Some(change)
}

/// `1.2, 1.3` → both; `∅` → none; `ε` → the empty version.
fn versions_of(s: &str) -> Vec<String> {
    if s == "∅" {
        return Vec::new();
    }
    s.split(", ")
        .map(|v| {
            if v == "ε" {
                String::new()
            } else {
                v.to_owned()
            }
        })
        .collect()
}

/// `+13.9 KiB`, `13.9 KiB`, `-6.4 MiB`, `1.1 GiB` in bytes (rounded).
fn bytes(s: &str) -> Option<i64> {
    let (number, unit) = s.trim().split_once(' ')?;
    let scale: f64 = match unit {
        "KiB" => 1024.0,
        "MiB" => 1024.0 * 1024.0,
        "GiB" => 1024.0 * 1024.0 * 1024.0,
        "TiB" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    let n: f64 = number.trim_start_matches('+').parse().ok()?;
    Some((n * scale).round() as i64)
}

/// `line` without ANSI escape sequences (`ESC [ … m`).
fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(name: &str, from: &[&str], to: &[&str], bytes: Option<i64>) -> PackageChange {
        PackageChange {
            name: name.into(),
            from: from.iter().map(|s| s.to_string()).collect(),
            to: to.iter().map(|s| s.to_string()).collect(),
            bytes,
        }
    }

    #[test]
    fn the_manual_s_example_as_nix_2_32_prints_it() {
        // Nix's own manual (src/nix/diff-closures.md), with the colour codes Nix writes even
        // into a pipe.
        let out = "acpi-call: 2020-04-07-5.8.16 → 2020-04-07-5.8.18\n\
                   baloo-widgets: 20.08.1 → 20.08.2\n\
                   bluez-qt: \x1b[31;1m+12.6 KiB\x1b[0m\n\
                   dolphin: 20.08.1 → 20.08.2, \x1b[31;1m+13.9 KiB\x1b[0m\n\
                   kdeconnect: 20.08.2 → ∅, \x1b[32;1m-6597.8 KiB\x1b[0m\n\
                   kdeconnect-kde: ∅ → 20.08.2, \x1b[31;1m+6599.7 KiB\x1b[0m\n\
                   libfoo: 1.2, 1.3 → 1.4\n\
                   zstd: ε → 1.5.6\n";
        let (changes, total) = parse(out);
        assert_eq!(
            changes,
            [
                change(
                    "acpi-call",
                    &["2020-04-07-5.8.16"],
                    &["2020-04-07-5.8.18"],
                    None
                ),
                change("baloo-widgets", &["20.08.1"], &["20.08.2"], None),
                change("bluez-qt", &[], &[], Some(12902)),
                change("dolphin", &["20.08.1"], &["20.08.2"], Some(14234)),
                change("kdeconnect", &["20.08.2"], &[], Some(-6756147)),
                change("kdeconnect-kde", &[], &["20.08.2"], Some(6758093)),
                change("libfoo", &["1.2", "1.3"], &["1.4"], None),
                change("zstd", &[""], &["1.5.6"], None),
            ]
        );
        assert_eq!(total, 12902 + 14234 - 6756147 + 6758093);
    }

    #[test]
    fn sizes_as_nix_2_33_prints_them() {
        let (changes, total) = parse(
            "linux: 6.6.60 → 6.6.63, \x1b[31;1m1.1 MiB\x1b[0m\n\
             nginx: \x1b[32;1m-64.0 KiB\x1b[0m\n",
        );
        assert_eq!(changes[0].bytes, Some(1153434));
        assert_eq!(changes[1].bytes, Some(-65536));
        assert_eq!(total, 1153434 - 65536);
    }

    #[test]
    fn what_is_not_a_change_line_is_skipped() {
        let (changes, total) = parse("\nwarning: unknown setting 'foo'\nVersion 1 -> 2:\n");
        assert!(changes.is_empty());
        assert_eq!(total, 0);
    }
}
