//! The configuration reference (`docs/src/reference.md`), generated from the one place the keys
//! are defined: the schema's structs in `agent/src/config/*.rs`, each key's doc comment, its
//! default (`Config::default()`), and its floor and ceiling ([`super::bounds`]).
//!
//! The structs are read as text: a `pub struct` of this folder whose fields are `pub name:
//! Type,` lines, each with its `///` doc comment above. A field whose type is another such struct
//! (bare, in `Option<…>`, `Vec<…>` or `BTreeMap<String, …>`) is a table of its own
//! (`[a.b]`, `[[a.b]]`, `[a.<name>]`). The test `the_reference_is_current` fails when the
//! checked-in reference differs (`GINX_BLESS=1 cargo test -p ginx --lib reference` writes it)
//! or when a key has no doc comment.
//!
//! Doc comments are written for rustdoc too, so they hold intra-doc links (`[`X`]`); [`links`]
//! turns each into text: what the caller's table spells out for it (a constant's value), else
//! its code span. A link whose target would vanish from the page is an error, listed with the
//! undocumented keys: better the build fails than the reader meets "default" and nothing.

use std::collections::BTreeMap;
use std::fmt::Write;

use super::Config;
use super::bounds::{COUNTS, DURATIONS};

mod links;

/// One field of a schema struct.
#[derive(Clone, Debug)]
struct Field {
    name: String,
    ty: String,
    doc: String,
}

/// One schema struct: its doc comment and fields.
#[derive(Clone, Debug, Default)]
struct Struct {
    doc: String,
    fields: Vec<Field>,
}

/// The `pub struct`s of `files` (file name, text) by name.
fn structs(files: &[(String, String)]) -> BTreeMap<String, Struct> {
    let mut out = BTreeMap::new();
    for (_, text) in files {
        let mut doc: Vec<String> = Vec::new();
        let mut current: Option<(String, Struct)> = None;
        let mut attr_depth = 0i32;
        for line in text.lines() {
            let t = line.trim();
            if attr_depth > 0 || t.starts_with("#[") {
                attr_depth += t.matches('[').count() as i32 - t.matches(']').count() as i32;
                continue;
            }
            if let Some(d) = t.strip_prefix("///") {
                doc.push(d.strip_prefix(' ').unwrap_or(d).to_owned());
                continue;
            }
            match &mut current {
                None => {
                    if let Some(rest) = t.strip_prefix("pub struct ")
                        && rest.ends_with('{')
                    {
                        let name = rest.trim_end_matches('{').trim().to_owned();
                        current = Some((
                            name,
                            Struct {
                                doc: doc.join(" "),
                                fields: Vec::new(),
                            },
                        ));
                    }
                    doc.clear();
                }
                Some((name, s)) => {
                    if t == "}" {
                        out.insert(name.clone(), s.clone());
                        current = None;
                    } else if let Some(rest) = t.strip_prefix("pub ")
                        && let Some((field, ty)) = rest.split_once(": ")
                    {
                        s.fields.push(Field {
                            name: field.trim_start_matches("r#").to_owned(),
                            ty: ty.trim_end_matches(',').to_owned(),
                            doc: doc.join(" "),
                        });
                    }
                    doc.clear();
                }
            }
        }
    }
    out
}

/// How a field's type nests: a struct of the schema as a table, a list of tables, a map of
/// named tables; or a plain value.
enum Shape<'a> {
    Table(&'a str),
    Tables(&'a str),
    Named(&'a str),
    Value,
}

fn shape<'a>(ty: &'a str, known: &BTreeMap<String, Struct>) -> Shape<'a> {
    let inner = |t: &'a str, open: &str| t.strip_prefix(open).and_then(|r| r.strip_suffix('>'));
    let is = |t: &str| known.contains_key(t);
    if is(ty) {
        return Shape::Table(ty);
    }
    if let Some(t) = inner(ty, "Option<")
        && is(t)
    {
        return Shape::Table(t);
    }
    if let Some(t) = inner(ty, "Vec<")
        .or_else(|| inner(ty, "Option<Vec<").map(|t| t.strip_suffix('>').unwrap_or(t)))
        && is(t)
    {
        return Shape::Tables(t);
    }
    if let Some(t) = inner(ty, "BTreeMap<String, ")
        && is(t)
    {
        return Shape::Named(t);
    }
    Shape::Value
}

/// The default of `path` in `defaults`, as TOML writes it (`-` when there is none).
fn default_of(defaults: &toml::Value, path: &[String]) -> String {
    let mut v = defaults;
    for p in path {
        match v.get(p) {
            Some(next) => v = next,
            None => return "-".to_owned(),
        }
    }
    match v {
        toml::Value::Table(_) => "-".to_owned(),
        other => short(other),
    }
}

/// `v` as TOML writes it, cut to about 60 characters for a table cell: a list after its last
/// whole item that fits, anything else mid-way.
fn short(v: &toml::Value) -> String {
    const WIDTH: usize = 60;
    let s = v.to_string();
    if s.len() <= WIDTH {
        return s;
    }
    let toml::Value::Array(items) = v else {
        return format!("{}…", s.chars().take(WIDTH - 3).collect::<String>());
    };
    let mut out = String::from("[");
    for item in items.iter().map(toml::Value::to_string) {
        // Room for this item, its separator and the closing ", …]".
        if out.len() + item.len() + 2 + 5 > WIDTH {
            break;
        }
        if out.len() > 1 {
            out.push_str(", ");
        }
        out.push_str(&item);
    }
    if out.len() > 1 {
        out.push_str(", ");
    }
    out + "…]"
}

/// The bounds of `key` (`a.b[].c`, `sources.<name>.interval`, `health.<probe>.timeout`).
fn bounds_of(key: &str) -> Option<String> {
    // `health.kubelet.timeout` is bounded as `health.<probe>.timeout`.
    let general = match key.split('.').collect::<Vec<_>>().as_slice() {
        ["health", _, leaf] => format!("health.<probe>.{leaf}"),
        _ => key.to_owned(),
    };
    if let Some(b) = DURATIONS.iter().find(|b| b.key == general) {
        return Some(format!("{} … {}", b.floor, b.ceiling));
    }
    COUNTS
        .iter()
        .find(|b| b.key == general)
        .map(|b| format!("{} … {}", b.floor, b.ceiling))
}

/// A table cell: one line, pipes escaped.
fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

/// What the reference says before its first table.
const PREAMBLE: &str = "# Configuration reference\n\n\
     <!-- Generated from agent/src/config/*.rs by config::reference (the test \
     `the_reference_is_current` fails when this file is stale; GINX_BLESS=1 cargo test -p \
     ginx --lib reference writes it). Do not edit by hand. -->\n\n\
     Every key ginx reads, by table, with its default and, for durations and counts, the \
     floor and ceiling ginx accepts (a value outside is an error naming the file, line and \
     column). `/etc/ginx/config.toml` and the drop-ins in `/etc/ginx/config.d/*.toml` are \
     merged in lexical order, later wins; unknown keys are errors. Durations are written \
     like `\"30s\"`, `\"10m\"`, `\"1h\"`.\n";

/// Where a table's defaults are: a value and the path to the table in it.
type Defaults = Option<(toml::Value, Vec<String>)>;

/// A table still to write: its TOML header, its key prefix, where its defaults are, and the
/// name of its struct.
type Item = (String, String, Defaults, String);

/// What the caller tells [`render`] beyond the sources: the defaults of the tables that are
/// entries of a list or a map (`sources.<name>.`, `notify[].`), by key prefix, each an entry
/// made with only its required keys, which are left out; and the intra-doc links it can spell
/// out, by the name of their target (`DEFAULT_EVENTS` → its reasons).
pub struct Known<'a> {
    pub entries: &'a [(&'a str, toml::Value, &'a [&'a str])],
    pub links: &'a [(&'a str, String)],
}

/// Undocumented keys and links that would leave nothing on the page are errors: `Err` lists
/// them, one line each, naming the key (or the table).
pub fn render(
    files: &[(String, String)],
    defaults: &Config,
    given: &Known<'_>,
) -> Result<String, Vec<String>> {
    let known = structs(files);
    let defaults =
        toml::Value::try_from(defaults).unwrap_or(toml::Value::Table(Default::default()));
    let mut out = String::from(PREAMBLE);
    let mut problems = Vec::new();
    let mut queue: Vec<Item> = vec![(
        String::new(),
        String::new(),
        Some((defaults, Vec::new())),
        "Config".to_owned(),
    )];
    while let Some(item) = queue.pop() {
        let Some(s) = known.get(&item.3) else {
            continue;
        };
        let nested = section(&mut out, &mut problems, s, item, &known, given);
        // In the order written (the queue is a stack).
        queue.extend(nested.into_iter().rev());
    }
    if problems.is_empty() {
        Ok(out)
    } else {
        Err(problems)
    }
}

/// The defaults of an entry of a list or a map whose keys start with `prefix`, without its
/// required keys (see [`render`]).
fn entry_defaults(entries: &[(&str, toml::Value, &[&str])], prefix: &str) -> Defaults {
    let (_, v, required) = entries.iter().find(|(p, _, _)| *p == prefix)?;
    let mut v = v.clone();
    if let Some(t) = v.as_table_mut() {
        for r in *required {
            t.remove(*r);
        }
    }
    Some((v, Vec::new()))
}

/// `doc` of `key` (a key or a table's header) for the page: its links resolved through
/// `given`, the ones that would be lost added to `problems`.
fn prose(doc: &str, key: &str, given: &Known<'_>, problems: &mut Vec<String>) -> String {
    let (text, lost) = links::resolve(doc, given.links);
    for target in lost {
        problems.push(format!(
            "{key}: its doc comment links to `{target}`, which the reference cannot spell out \
             (write it in words, or name it in the link's text)"
        ));
    }
    text
}

/// Writes the table `s` (described by `item`) to `out`: its title, its doc, a row per key.
/// Keys without a doc and links that would be lost go to `problems`; the tables nested in it
/// are returned, in the order written.
fn section(
    out: &mut String,
    problems: &mut Vec<String>,
    s: &Struct,
    (header, prefix, path, _): Item,
    known: &BTreeMap<String, Struct>,
    given: &Known<'_>,
) -> Vec<Item> {
    let entries = given.entries;
    let title = if header.is_empty() {
        "Top level".to_owned()
    } else {
        format!("`{header}`")
    };
    let _ = write!(out, "\n## {title}\n\n");
    if !s.doc.is_empty() && !header.is_empty() {
        let _ = write!(out, "{}\n\n", prose(&s.doc, &header, given, problems));
    }
    let mut rows = Vec::new();
    let mut nested = Vec::new();
    for f in &s.fields {
        let key = format!("{prefix}{}", f.name);
        let fpath = path.clone().map(|(root, mut p)| {
            p.push(f.name.clone());
            (root, p)
        });
        let sub = |h: String, k: String, p: Defaults, t: &str| (h, k, p, t.to_owned());
        match shape(&f.ty, known) {
            // An optional table absent from the defaults: its entry's defaults, if given.
            Shape::Table(t) => {
                let prefix = format!("{key}.");
                let d = entry_defaults(entries, &prefix).or(fpath);
                nested.push(sub(format!("[{key}]"), prefix, d, t))
            }
            Shape::Tables(t) => {
                let prefix = format!("{key}[].");
                let d = entry_defaults(entries, &prefix);
                nested.push(sub(format!("[[{}]]", key), prefix, d, t))
            }
            Shape::Named(t) => {
                let label = "<name>";
                let prefix = format!("{key}.{label}.");
                let d = entry_defaults(entries, &prefix);
                nested.push(sub(format!("[{key}.{label}]"), prefix, d, t))
            }
            Shape::Value => {
                if f.doc.is_empty() {
                    problems.push(format!("{key}: no doc comment"));
                }
                let default = fpath
                    .as_ref()
                    .map_or_else(|| "-".to_owned(), |(root, p)| default_of(root, p));
                let bounds = bounds_of(&key).unwrap_or_default();
                rows.push(format!(
                    "| `{}` | `{}` | {} | {} |",
                    f.name,
                    cell(&default),
                    cell(&bounds),
                    cell(&prose(&f.doc, &key, given, problems))
                ));
            }
        }
    }
    if !rows.is_empty() {
        out.push_str("| key | default | bounds | |\n| --- | --- | --- | --- |\n");
        for r in rows {
            out.push_str(&r);
            out.push('\n');
        }
    }
    nested
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema_files() -> Vec<(String, String)> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/config");
        let mut files: Vec<(String, String)> = std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| {
                let p = e.ok()?.path();
                (p.extension()? == "rs").then(|| {
                    (
                        p.file_name().unwrap().to_string_lossy().into_owned(),
                        std::fs::read_to_string(&p).unwrap(),
                    )
                })
            })
            .collect();
        files.sort();
        files
    }

    /// The defaults of list and map entries: each made with its required keys only.
    fn entries() -> Vec<(&'static str, toml::Value, &'static [&'static str])> {
        fn made<T: serde::de::DeserializeOwned + serde::Serialize>(text: &str) -> toml::Value {
            toml::Value::try_from(toml::from_str::<T>(text).unwrap()).unwrap()
        }
        vec![
            (
                "sources.<name>.",
                made::<super::super::SourceConfig>("url = \"/srv/hive\""),
                &["url"][..],
            ),
            (
                "notify[].",
                made::<super::super::NotifyConfig>("url = \"http://127.0.0.1/\""),
                &["url"][..],
            ),
            (
                "rollout.gate.prometheus.",
                made::<super::super::PrometheusConfig>("url = \"http://127.0.0.1/\""),
                &["url"][..],
            ),
        ]
    }

    /// The intra-doc links of the schema's doc comments the reference spells out, each made
    /// from the item it names.
    fn links() -> Vec<(&'static str, String)> {
        let events = super::super::NOTIFY_DEFAULT_EVENTS.map(|r| format!("`{}`", r.as_str()));
        vec![("DEFAULT_EVENTS", events.join(", "))]
    }

    fn rendered() -> Result<String, Vec<String>> {
        let (entries, links) = (entries(), links());
        let given = Known {
            entries: &entries,
            links: &links,
        };
        render(&schema_files(), &Config::default(), &given)
    }

    #[test]
    fn the_reference_is_current() {
        let text = match rendered() {
            Ok(t) => t,
            Err(problems) => panic!(
                "the reference is made from the doc comments in agent/src/config, and these keys' are not fit for it: {problems:#?}"
            ),
        };
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/src/reference.md");
        if std::env::var("GINX_BLESS").is_ok_and(|v| v == "1") {
            std::fs::write(&path, &text).unwrap();
        }
        let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            checked_in == text,
            "docs/src/reference.md is stale: run `GINX_BLESS=1 cargo test -p ginx --lib reference` and commit it"
        );
    }

    #[test]
    fn tables_nest_by_type_and_defaults_and_bounds_are_filled_in() {
        let text = rendered().unwrap_or_else(|m| panic!("{m:?}"));
        for want in [
            "## `[kubernetes]`",
            "## `[sources.<name>]`",
            "## `[[notify]]`",
            "## `[rollout.gate]`",
            "| `renew_interval` | `\"10s\"` | 100ms … 30m |",
            "| `retries` | `3` | 0 … 10 |",
            "| `branch` | `\"main\"` |",
        ] {
            assert!(text.contains(want), "{want} in\n{text}");
        }
    }

    #[test]
    fn the_reference_has_no_rustdoc_link_left_and_spells_out_the_default_events() {
        let text = rendered().unwrap_or_else(|m| panic!("{m:?}"));
        if let Some(link) = links::leftover(&text) {
            panic!("{link} is rustdoc's syntax, not the manual's: add its target to `links()`");
        }
        for want in [
            "default `RevisionHalted`, `RolledBack`, `RollbackUnhealthy`,",
            "`ApplyFailed`, `Held`.",
            "| `events` | `[\"RevisionHalted\", \"RolledBack\", \"RollbackUnhealthy\", …]` |",
        ] {
            assert!(text.contains(want), "{want} in\n{text}");
        }
    }

    #[test]
    fn an_undocumented_key_and_a_link_that_would_be_lost_are_both_errors() {
        let files = vec![(
            "x.rs".to_owned(),
            "pub struct Config {\n    pub quiet: bool,\n    /// Like [its twin](crate::Twin).\n    pub loud: bool,\n}\n".to_owned(),
        )];
        let given = Known {
            entries: &[],
            links: &[],
        };
        let problems = render(&files, &Config::default(), &given).unwrap_err();
        assert_eq!(
            problems,
            [
                "quiet: no doc comment",
                "loud: its doc comment links to `crate::Twin`, which the reference cannot spell out (write it in words, or name it in the link's text)",
            ]
        );
    }

    #[test]
    fn a_long_list_is_cut_after_a_whole_item_and_anything_else_mid_way() {
        let list = toml::Value::try_from([
            "RevisionHalted",
            "RolledBack",
            "RollbackUnhealthy",
            "SlotLost",
        ])
        .unwrap();
        assert_eq!(
            short(&list),
            "[\"RevisionHalted\", \"RolledBack\", \"RollbackUnhealthy\", …]"
        );
        let one = toml::Value::try_from(["x".repeat(70)]).unwrap();
        assert_eq!(short(&one), "[…]");
        let text = toml::Value::String("y".repeat(70));
        assert_eq!(short(&text), format!("\"{}…", "y".repeat(56)));
        let fits = toml::Value::try_from(["a", "b"]).unwrap();
        assert_eq!(short(&fits), "[\"a\", \"b\"]");
    }
}
