//! Keeps the dependency direction of the manual (docs/src/development.md, "Layers") true: every
//! `crate::` path in `agent/src` must point down the layer table below, never up, and never
//! sideways between workers. Test-only; it reads the sources, it does not build anything.
//!
//! Owns: the layer table as the compiler-independent statement of who may import whom. Adding a
//! top-level module means adding it here, at the layer the manual gives it.

use std::path::{Path, PathBuf};

/// Top-level modules and their layer, lowest first (the manual's list).
const LAYERS: &[(&str, u8)] = &[
    ("types", 1),
    ("util", 1),
    ("logging", 1),
    ("config", 2),
    ("status", 3),
    ("metrics", 3),
    ("state", 4),
    // The Kubernetes API's plumbing below the workers: typed errors, the one retry loop, the
    // heartbeat Lease's owner.
    ("k8s", 4),
    // etcd's API as the control-plane guard and the health probe ask it: beside `k8s`.
    ("etcd", 4),
    ("source", 5),
    ("apply", 5),
    ("health", 5),
    ("kube", 5),
    ("rollout", 5),
    ("kubeadm", 5),
    ("bootstrap", 5),
    ("notify", 5),
    ("reconcile", 6),
    // A plan asked for before a merge: beside the reconciler, using the same workers.
    ("preview", 6),
    ("control", 7),
    ("daemon", 8),
    ("cli", 8),
    ("bin", 8),
    // The fuzz targets: above the front ends, whose renderers they drive; nothing imports them.
    ("fuzz", 9),
    // This test itself: it names every module in strings only, which the scanner skips.
    ("layers", 8),
    // The file-size test: test-only too, above `layers`, whose scanner it uses.
    ("limits", 9),
];

/// Items of `lib.rs` itself (not modules) that any layer may use.
const ROOT_ITEMS: &[&str] = &["VERSION", "version"];

/// Imports within one layer that are allowed, as (importer, imported). Workers (layer 5) never
/// import each other; there is no entry for them.
const SAME_LAYER: &[(&str, &str)] = &[
    // The CLI's `ginx` subcommand runs the daemon; both are entry points.
    ("cli", "daemon"),
];

fn layer(module: &str) -> Option<u8> {
    LAYERS.iter().find(|(m, _)| *m == module).map(|(_, l)| *l)
}

/// A `crate::` path found in a file: the line it starts on and the top-level module it names.
#[derive(Debug, PartialEq)]
struct Import {
    line: usize,
    target: String,
}

/// The file's text with comments, string and char literals blanked out (newlines kept, so
/// offsets still give the right line).
pub(crate) fn code_only(text: &str) -> String {
    let b: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < b.len() && b[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == '/' && b.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if b[i] == '*' && b.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(b[i]));
                    i += 1;
                }
            }
        } else if c == 'r'
            && matches!(next, Some('"' | '#'))
            && !ident_char(b.get(i.wrapping_sub(1)))
        {
            // A raw string: r"…", r#"…"#.
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                match b.get(j) {
                    None => break,
                    Some('"') if (1..=hashes).all(|k| b.get(j + k) == Some(&'#')) => {
                        j += 1 + hashes;
                        break;
                    }
                    Some(_) => j += 1,
                }
            }
            out.extend(b[i..j.min(b.len())].iter().map(|&c| blank(c)));
            i = j;
        } else if c == '"' {
            out.push(' ');
            i += 1;
            while i < b.len() && b[i] != '"' {
                if b[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                if i < b.len() {
                    out.push(blank(b[i]));
                    i += 1;
                }
            }
            out.push(' ');
            i += 1;
        } else if c == '\'' {
            // A char literal ('x', '\n', '\u{..}'); a lifetime has no closing quote nearby.
            let close = (i + 2..(i + 12).min(b.len()))
                .find(|&j| b[j] == '\'' && (j == i + 2 || b[i + 1] == '\\'));
            match close {
                Some(j) => {
                    out.extend(std::iter::repeat_n(' ', j + 1 - i));
                    i = j + 1;
                }
                None => {
                    out.push(c);
                    i += 1;
                }
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn ident_char(c: Option<&char>) -> bool {
    c.is_some_and(|c| c.is_alphanumeric() || *c == '_')
}

/// Every top-level module named through `crate::` in `code`: plain paths (`crate::a::b`), and
/// each item of a group (`crate::{a, b::{c, d}}`).
fn imports(code: &str) -> Vec<Import> {
    let line_of = |at: usize| code[..at].matches('\n').count() + 1;
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(pos) = code[from..].find("crate::") {
        let at = from + pos;
        from = at + "crate::".len();
        if ident_char(code[..at].chars().last().as_ref()) {
            continue; // part of a longer name, like `other_crate::`
        }
        let rest = code[from..].trim_start();
        let start = code.len() - rest.len();
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 1;
            let mut item_start = Some(start + 1);
            for (k, ch) in group.char_indices() {
                let abs = start + 1 + k;
                match ch {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 1 => {}
                    _ => continue,
                }
                if depth == 0 || (ch == ',' && depth == 1) {
                    if let Some(s) = item_start.take() {
                        push_first_ident(&mut found, code, s, &line_of);
                    }
                    if depth == 0 {
                        break;
                    }
                    item_start = Some(abs + 1);
                }
            }
        } else {
            push_first_ident(&mut found, code, start, &line_of);
        }
    }
    found
}

fn push_first_ident(
    found: &mut Vec<Import>,
    code: &str,
    at: usize,
    line_of: &dyn Fn(usize) -> usize,
) {
    let rest = &code[at..];
    let skipped = rest.len() - rest.trim_start().len();
    let name: String = rest
        .trim_start()
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    if !name.is_empty() && name != "self" {
        found.push(Import {
            line: line_of(at + skipped),
            target: name,
        });
    }
}

pub(crate) fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The top-level module a file belongs to (`None` for `lib.rs`).
fn module_of(rel: &Path) -> Option<String> {
    let first = rel.components().next()?.as_os_str().to_str()?;
    match first.strip_suffix(".rs") {
        Some("lib") => None,
        Some(m) => Some(m.to_owned()),
        None => Some(first.to_owned()),
    }
}

/// Why `importer` may not name `target`, or `None` when it may.
fn offence(importer: &str, target: &str) -> Option<String> {
    if importer == target || ROOT_ITEMS.contains(&target) {
        return None;
    }
    let Some(to) = layer(target) else {
        return Some(format!("`{target}` is not in the layer table"));
    };
    let from = layer(importer).expect("importer checked first");
    if to < from || SAME_LAYER.contains(&(importer, target)) {
        return None;
    }
    let how = if to == from { "sideways" } else { "up" };
    Some(format!(
        "`{importer}` (layer {from}) imports `{target}` (layer {to}): {how}"
    ))
}

#[test]
fn no_module_imports_up_or_sideways() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut violations = Vec::new();
    for path in &files {
        let rel = path.strip_prefix(&src).expect("under src");
        let Some(module) = module_of(rel) else {
            continue;
        };
        if layer(&module).is_none() {
            violations.push(format!(
                "src/{}: module `{module}` is not in the layer table (agent/src/layers.rs)",
                rel.display()
            ));
            continue;
        }
        let text = std::fs::read_to_string(path).expect("readable source");
        for import in imports(&code_only(&text)) {
            if let Some(why) = offence(&module, &import.target) {
                violations.push(format!(
                    "src/{}:{}: crate::{} — {why}",
                    rel.display(),
                    import.line,
                    import.target
                ));
            }
        }
    }
    assert!(
        violations.is_empty(),
        "{} import(s) break the layers (docs/src/development.md):\n{}",
        violations.len(),
        violations.join("\n")
    );
}

#[test]
fn the_scanner_finds_plain_grouped_and_qualified_paths_but_not_comments_or_strings() {
    let code = code_only(
        "use crate::config::Config;\n\
         use crate::{status::{Status, HealthMap}, types::Revision};\n\
         // use crate::daemon;\n\
         let s = \"crate::cli\";\n\
         let c = '\"'; let x = crate::kube::describe(&e);\n",
    );
    let found: Vec<(usize, String)> = imports(&code)
        .into_iter()
        .map(|i| (i.line, i.target))
        .collect();
    let want = [(1, "config"), (2, "status"), (2, "types"), (5, "kube")];
    assert_eq!(
        found,
        want.map(|(l, t)| (l, t.to_owned())).to_vec(),
        "from {code:?}"
    );
}

#[test]
fn workers_may_not_import_each_other() {
    assert!(offence("health", "kube").is_some());
    assert!(offence("config", "source").is_some());
    assert!(offence("reconcile", "apply").is_none());
    assert!(offence("status", "types").is_none());
}
