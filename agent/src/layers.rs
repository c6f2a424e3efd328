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
    // The manual's promises about the code (the code map, the README's chapters): test-only.
    ("manual", 9),
];

/// Modules cut into sub-modules with an order of their own, lowest first: within such a module, a
/// file imports only from its own sub-module or one below it. The module's `mod.rs` is its face:
/// it names them all and none imports it.
const SUB_LAYERS: &[(&str, &[(&str, u8)])] = &[(
    "rollout",
    &[
        ("lock", 1),
        ("fleet", 2),
        ("decide", 3),
        ("cluster", 3),
        ("view", 3),
        ("guards", 4),
        ("keeper", 5),
    ],
)];

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

/// The module path of a file under `src` (`rollout/keeper/ask.rs` → rollout, keeper, ask; a
/// `mod.rs` is its folder).
fn module_path(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .iter()
        .map(|c| c.to_string_lossy().into_owned())
        .collect();
    if let Some(last) = parts.pop() {
        let stem = last.strip_suffix(".rs").unwrap_or(&last).to_owned();
        if stem != "mod" && stem != "lib" {
            parts.push(stem);
        }
    }
    parts
}

/// Every path in `code` that starts with `crate::`, `super::` or `self::`, resolved against
/// the file's module path `here` into the modules it names (the first three segments suffice);
/// a group (`{a, b::c}`) gives one path per item.
fn resolved_paths(code: &str, here: &[String]) -> Vec<(usize, Vec<String>)> {
    let line_of = |at: usize| code[..at].matches('\n').count() + 1;
    let inline = inline_modules(code);
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(pos) = code[from..].find(['c', 's']) {
        let at = from + pos;
        from = at + 1;
        let rest = &code[at..];
        let start = ["crate::", "super::", "self::"]
            .into_iter()
            .find(|p| rest.starts_with(p));
        if start.is_none()
            || ident_char(code[..at].chars().last().as_ref())
            || code[..at].ends_with("::")
        {
            continue;
        }
        let mut here = here.to_vec();
        here.extend(
            inline
                .iter()
                .filter(|(s, e, _)| (*s..*e).contains(&at))
                .map(|(_, _, n)| n.clone()),
        );
        for segments in expand(rest, 0) {
            let mut base: Vec<String> = Vec::new();
            let mut segs = segments.into_iter().peekable();
            match segs.peek().map(String::as_str) {
                Some("crate") => {
                    segs.next();
                }
                Some("self") => {
                    segs.next();
                    base = here.to_vec();
                }
                _ => {
                    base = here.to_vec();
                    while segs.peek().map(String::as_str) == Some("super") {
                        segs.next();
                        base.pop();
                    }
                }
            }
            base.extend(segs.filter(|s| s != "self"));
            out.push((line_of(at), base));
        }
        from = at + start.map_or(1, str::len);
    }
    out
}

/// The modules written inline in `code` (`mod tests { … }`): where each begins and ends, and its
/// name, outermost first.
fn inline_modules(code: &str) -> Vec<(usize, usize, String)> {
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(pos) = code[from..].find("mod ") {
        let at = from + pos;
        from = at + 4;
        if ident_char(code[..at].chars().last().as_ref()) {
            continue;
        }
        let rest = &code[from..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let Some(open) = rest[name.len()..].trim_start().strip_prefix('{') else {
            continue;
        };
        let body = code.len() - open.len();
        let mut depth = 1;
        let end = open
            .char_indices()
            .find(|&(_, c)| {
                depth += match c {
                    '{' => 1,
                    '}' => -1,
                    _ => 0,
                };
                depth == 0
            })
            .map_or(code.len(), |(k, _)| body + k);
        found.push((body, end, name));
    }
    found
}

/// The paths of the use tree at the start of `s`, each as its segments, at most `depth + 4`
/// deep (enough to tell a sub-module).
fn expand(s: &str, depth: usize) -> Vec<Vec<String>> {
    let s = s.trim_start();
    if let Some(group) = s.strip_prefix('{') {
        let mut items = Vec::new();
        let mut level = 0;
        let mut item_start = 0;
        for (k, ch) in group.char_indices() {
            match ch {
                '{' => level += 1,
                '}' if level == 0 => {
                    items.push(&group[item_start..k]);
                    break;
                }
                '}' => level -= 1,
                ',' if level == 0 => {
                    items.push(&group[item_start..k]);
                    item_start = k + 1;
                }
                _ => {}
            }
        }
        return items
            .into_iter()
            .filter(|i| !i.trim().is_empty())
            .flat_map(|i| expand(i, depth + 1))
            .collect();
    }
    let name: String = s
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    if name.is_empty() {
        return vec![Vec::new()];
    }
    let after = &s[name.len()..];
    let mut paths = match after.trim_start().strip_prefix("::") {
        Some(rest) if depth < 4 => expand(rest, depth + 1),
        _ => vec![Vec::new()],
    };
    for p in &mut paths {
        p.insert(0, name.clone());
    }
    paths
}

/// Why a file at module path `here` may not name `target` (both resolved), by the sub-layer
/// table, or `None` when it may.
fn sub_offence(here: &[String], target: &[String]) -> Option<String> {
    let (top, subs) = SUB_LAYERS
        .iter()
        .find(|(m, _)| here.first() == Some(&m.to_string()))?;
    let from = here.get(1)?;
    if target.first().map(String::as_str) != Some(*top) {
        return None;
    }
    let Some(to) = target.get(1) else {
        return Some(format!(
            "`{top}::{from}` names `{top}`'s face; name the sub-module"
        ));
    };
    if to == from {
        return None;
    }
    let layer_of = |m: &str| subs.iter().find(|(s, _)| *s == m).map(|(_, l)| *l);
    let Some(from_layer) = layer_of(from) else {
        return Some(format!("`{top}::{from}` is not in the sub-layer table"));
    };
    let Some(to_layer) = layer_of(to) else {
        return Some(format!(
            "`{top}::{to}` is not a sub-module in the sub-layer table (items of `{top}`'s face \
             are not imported from inside it)"
        ));
    };
    (to_layer >= from_layer).then(|| {
        format!(
            "`{top}::{from}` (sub-layer {from_layer}) imports `{top}::{to}` (sub-layer {to_layer})"
        )
    })
}

/// Where the item whose attribute starts at `start` ends: its `;` (a `mod x;` or a `use`) or
/// its matching closing brace.
pub(crate) fn item_end(code: &str, start: usize) -> usize {
    let mut depth = 0usize;
    for (i, c) in code[start..].char_indices() {
        match c {
            ';' if depth == 0 => return start + i,
            '{' => depth += 1,
            '}' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return start + i;
                }
            }
            _ => {}
        }
    }
    code.len()
}

/// Files and folders under `src` whose non-test code decides and does no I/O: they take what
/// was read and the clock as arguments. The test below keeps them so.
const PURE: &[&str] = &[
    "rollout/decide/",
    "rollout/lock/slots.rs",
    "rollout/view/projections.rs",
    "rollout/guards/after.rs",
    "rollout/guards/canary.rs",
    "rollout/guards/order.rs",
    "etcd/view.rs",
    "reconcile/core/",
    "reconcile/outcome.rs",
    "reconcile/reboot/decide.rs",
    "apply/plan/policy.rs",
    "apply/plan/dry_activate.rs",
    "apply/plan/closure_diff.rs",
    "preview/estimate.rs",
    "status/gate.rs",
];

/// What a pure file may not name: the API client, the runtime, HTTP, files, processes, the
/// network, logging, and any clock read (`elapsed()` reads one too).
const IMPURE: &[&str] = &[
    "kube::",
    "tokio::",
    "reqwest::",
    "std::fs",
    "fs::",
    "std::process",
    "std::net",
    "tracing::",
    "::now(",
    ".elapsed()",
    "SystemTime",
];

/// `code` with every `#[cfg(test)]` item blanked (newlines kept).
fn without_test_items(code: &str) -> String {
    let mut out = code.to_owned();
    let mut from = 0;
    while let Some(at) = out[from..].find("#[cfg(test)]") {
        let start = from + at;
        let end = item_end(&out, start).min(out.len().saturating_sub(1));
        let blank: String = out[start..=end]
            .chars()
            .map(|c| if c == '\n' { '\n' } else { ' ' })
            .collect();
        out.replace_range(start..=end, &blank);
        from = end + 1;
    }
    out
}

/// The I/O and clock reads named in the non-test code of `text`: (line, what).
fn impure_uses(text: &str) -> Vec<(usize, &'static str)> {
    let code = without_test_items(&code_only(text));
    let mut found = Vec::new();
    for (i, line) in code.lines().enumerate() {
        for what in IMPURE {
            let hit = line.match_indices(what).any(|(at, _)| {
                // `fs::` alone: not the tail of a longer name (`self.fs::`, `xfs::`).
                *what != "fs::" || !ident_char(line[..at].chars().last().as_ref())
            });
            if hit {
                found.push((i + 1, *what));
            }
        }
    }
    found
}

#[test]
fn the_pure_cores_do_no_io_and_read_no_clock() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut found = Vec::new();
    let mut checked = 0;
    for path in &files {
        let rel = path
            .strip_prefix(&src)
            .expect("under src")
            .to_string_lossy()
            .into_owned();
        if !PURE
            .iter()
            .any(|p| rel == *p || (p.ends_with('/') && rel.starts_with(p)))
        {
            continue;
        }
        checked += 1;
        let text = std::fs::read_to_string(path).expect("readable source");
        for (line, what) in impure_uses(&text) {
            found.push(format!("src/{rel}:{line}: {what}"));
        }
    }
    assert!(
        checked >= PURE.len(),
        "only {checked} pure files found: is PURE stale?"
    );
    assert!(
        found.is_empty(),
        "pure code does I/O or reads a clock (take it as an argument instead):\n{}",
        found.join("\n")
    );
}

#[test]
fn impure_uses_are_found_outside_tests_only() {
    let text = "use std::fs;\nfn a(now: Timestamp) {}\nfn b() { let t = Instant::now(); }\n\
                #[cfg(test)]\nmod tests {\n    fn c() { tokio::spawn(x); }\n}\n";
    assert_eq!(impure_uses(text), vec![(1, "std::fs"), (3, "::now(")]);
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
        let code = code_only(&text);
        let here = module_path(rel);
        for (line, target) in resolved_paths(&code, &here) {
            if let Some(why) = sub_offence(&here, &target) {
                violations.push(format!(
                    "src/{}:{line}: {} — {why}",
                    rel.display(),
                    target.join("::")
                ));
            }
        }
        for import in imports(&code) {
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
fn within_rollout_a_sub_module_imports_only_those_below_it() {
    let at = |p: &str| module_path(Path::new(p));
    let found = |p: &str, code: &str| -> Vec<Vec<String>> {
        resolved_paths(&code_only(code), &at(p))
            .into_iter()
            .map(|(_, t)| t)
            .collect()
    };
    let ask = "rollout/keeper/ask.rs";
    assert_eq!(
        found(
            ask,
            "use super::*;\nuse crate::rollout::{decide::admission, lock::{lease, slots}};"
        ),
        vec![
            vec!["rollout", "keeper"],
            vec!["rollout", "decide", "admission"],
            vec!["rollout", "lock", "lease"],
            vec!["rollout", "lock", "slots"],
        ]
    );
    assert_eq!(
        found(
            "rollout/decide/gate.rs",
            "let x = super::super::guards::alerts::MAX;"
        ),
        vec![vec!["rollout", "guards", "alerts", "MAX"]]
    );
    let offence = |p: &str, code: &str| {
        found(p, code)
            .iter()
            .filter_map(|t| sub_offence(&at(p), t))
            .collect::<Vec<_>>()
    };
    assert!(offence(ask, "use crate::rollout::lock::lease::LockError;").is_empty());
    assert!(offence(ask, "use super::locker::Locker;").is_empty());
    let tests = "mod tests {\n    use super::*;\n    use crate::rollout::lock::slots::Slot;\n}";
    assert!(offence("rollout/cluster.rs", tests).is_empty());
    assert_eq!(
        offence(
            "rollout/lock/lease.rs",
            &tests.replace("lock::slots", "fleet")
        )
        .len(),
        1
    );
    assert_eq!(
        offence("rollout/lock/lease.rs", "use crate::rollout::fleet::Halt;").len(),
        1
    );
    assert_eq!(
        offence(
            "rollout/decide/gate.rs",
            "use super::super::guards::alerts::X;"
        )
        .len(),
        1
    );
    assert_eq!(
        offence("rollout/guards/canary.rs", "use crate::rollout::Halt;").len(),
        1
    );
    assert!(offence("reconcile/mod.rs", "use crate::rollout::keeper::X;").is_empty());
}

#[test]
fn workers_may_not_import_each_other() {
    assert!(offence("health", "kube").is_some());
    assert!(offence("config", "source").is_some());
    assert!(offence("reconcile", "apply").is_none());
    assert!(offence("status", "types").is_none());
}
