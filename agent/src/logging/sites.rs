//! Test-only: every `tracing::` call site of `agent/src`, read as text, so that what the
//! journal shows stays readable as the code grows:
//!
//! - no field takes a name journald gives a meaning to (MESSAGE, PRIORITY, UNIT …, see
//!   `entry.rs`), nor `message`, which would be a second MESSAGE;
//! - a field's name says what it holds (not `e`, `d`): it is printed in every MESSAGE;
//! - a warning or an error carries its reason: at least one field, or a value in its text.

use std::path::{Path, PathBuf};

use super::entry::journal_name;

const LEVELS: &[&str] = &["trace", "debug", "info", "warn", "error"];

/// One `tracing::<level>!(…)` call.
#[derive(Debug, PartialEq)]
struct Site {
    line: usize,
    level: String,
    fields: Vec<String>,
    /// The format string, when there is one.
    text: Option<String>,
}

/// The arguments of the macro call whose `(` is at `open`, up to its `)`, split at the commas
/// outside brackets and strings.
fn arguments(s: &[char], open: usize) -> Vec<String> {
    let (mut depth, mut i, mut in_str) = (0usize, open, false);
    let mut args = vec![String::new()];
    while i < s.len() {
        let c = s[i];
        if in_str {
            if c == '\\' {
                args.last_mut().unwrap().push(c);
                i += 1;
                args.last_mut().unwrap().push(s[i]);
                i += 1;
                continue;
            }
            in_str = c != '"';
        } else {
            match c {
                '"' => in_str = true,
                '(' | '[' | '{' => depth += 1,
                ')' | ']' | '}' => {
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                }
                ',' if depth == 1 => {
                    args.push(String::new());
                    i += 1;
                    continue;
                }
                _ => {}
            }
        }
        if depth >= 1 && !(depth == 1 && c == '(' && i == open) {
            args.last_mut().unwrap().push(c);
        }
        i += 1;
    }
    args.into_iter()
        .map(|a| a.split_whitespace().collect::<Vec<_>>().join(" "))
        .filter(|a| !a.is_empty())
        .collect()
}

/// The field an argument before the format string names: `name = value`, `%name`, `?name`,
/// `name`; `None` for `target:` and the like.
fn field_of(arg: &str) -> Option<String> {
    let head = arg.split('=').next().unwrap_or(arg).trim();
    if head.contains(':') && !head.contains("::") {
        return None;
    }
    let name = head.trim_start_matches(['%', '?']).trim();
    Some(name.trim_matches('"').to_owned())
}

/// Every call site in `text`.
fn sites(text: &str) -> Vec<Site> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut line = 1;
    let mut i = 0;
    while i < chars.len() {
        if chars[i] == '\n' {
            line += 1;
        }
        let rest: String = chars[i..chars.len().min(i + 20)].iter().collect();
        let level = LEVELS
            .iter()
            .find(|l| rest.starts_with(&format!("tracing::{l}!(")));
        let commented = || {
            text.lines()
                .nth(line - 1)
                .is_some_and(|l| l.trim_start().starts_with("//"))
        };
        if let Some(level) = level.filter(|_| !commented()) {
            let open = i + "tracing::".len() + level.len() + 1;
            let args = arguments(&chars, open);
            let format_at = args.iter().position(|a| a.starts_with('"'));
            let before = &args[..format_at.unwrap_or(args.len())];
            out.push(Site {
                line,
                level: (*level).to_owned(),
                fields: before.iter().filter_map(|a| field_of(a)).collect(),
                text: format_at.map(|f| args[f].clone()),
            });
        }
        i += 1;
    }
    out
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let p = entry.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// What is wrong with one site, if anything.
fn problems(site: &Site) -> Vec<String> {
    let mut out = Vec::new();
    for f in &site.fields {
        let journal = journal_name(f).unwrap_or_default();
        if journal.starts_with("GINX_") || f == "message" {
            out.push(format!(
                "field `{f}` collides with the journal field {journal}"
            ));
        }
        let last = f.rsplit('.').next().unwrap_or(f);
        if last.chars().count() < 2 {
            out.push(format!("field `{f}`: name it for what it holds"));
        }
    }
    let interpolates = site.text.as_deref().is_some_and(|t| t.contains('{'));
    if (site.level == "warn" || site.level == "error") && site.fields.is_empty() && !interpolates {
        out.push("a warning or an error without a field that says why".to_owned());
    }
    out
}

#[test]
fn call_sites_are_parsed() {
    let text = "fn f() {\n    tracing::warn!(error = %e, path = %p.display(), \"x {y}\", y = 1);\n\
                // tracing::error!(\"commented\");\n    tracing::info!(target: \"t\", %revision, \
                ?held.slot, \"a, b (c)\");\n    tracing::debug!(\"plain\");\n}\n";
    let got = sites(text);
    assert_eq!(
        got,
        [
            Site {
                line: 2,
                level: "warn".into(),
                fields: vec!["error".into(), "path".into()],
                text: Some("\"x {y}\"".into()),
            },
            Site {
                line: 4,
                level: "info".into(),
                fields: vec!["revision".into(), "held.slot".into()],
                text: Some("\"a, b (c)\"".into()),
            },
            Site {
                line: 5,
                level: "debug".into(),
                fields: vec![],
                text: Some("\"plain\"".into()),
            },
        ]
    );
    let bad = Site {
        line: 1,
        level: "error".into(),
        fields: vec!["unit".into(), "e".into(), "message".into()],
        text: Some("\"failed\"".into()),
    };
    assert_eq!(problems(&bad).len(), 3, "{:?}", problems(&bad));
    let headline = Site {
        fields: vec![],
        ..bad
    };
    assert_eq!(problems(&headline).len(), 1);
}

#[test]
fn every_call_site_names_its_fields_for_the_journal_and_says_why() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let (mut count, mut wrong) = (0, Vec::new());
    // This file's own examples are not call sites.
    for file in files
        .into_iter()
        .filter(|f| !f.ends_with("logging/sites.rs"))
    {
        let text = std::fs::read_to_string(&file).unwrap();
        // A module's tests log what they need to, collisions included.
        let code = text
            .split("#[cfg(test)]\nmod tests")
            .next()
            .unwrap_or(&text);
        for site in sites(code) {
            count += 1;
            for p in problems(&site) {
                let shown = file.strip_prefix(&src).unwrap_or(&file).display();
                wrong.push(format!("src/{shown}:{}: {p}", site.line));
            }
        }
    }
    // The scan must have found the code's call sites, or it proves nothing.
    assert!(count > 150, "only {count} tracing call sites found");
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
