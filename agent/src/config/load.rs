//! Reading the configuration from disk: the main file, drop-ins in `config.d/` beside it,
//! merged in lexical order (later wins, table by table), and a map from every key to where it
//! was last set, so that any later error can name `file:line:column`.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use toml::de::{DeTable, DeValue};

use super::ConfigError;

/// A position in a configuration file, 1-based, columns in characters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Location {
    pub file: PathBuf,
    pub line: usize,
    pub column: usize,
}

impl Location {
    pub(super) fn at(file: &Path, text: &str, offset: usize) -> Self {
        let offset = offset.min(text.len());
        let before = &text[..offset];
        let line = before.bytes().filter(|&b| b == b'\n').count() + 1;
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        let column = text[line_start..offset].chars().count() + 1;
        Self {
            file: file.to_owned(),
            line,
            column,
        }
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.file.display(), self.line, self.column)
    }
}

/// Where a key and its value were (last) set.
#[derive(Clone, Debug)]
pub(super) struct Origin {
    pub key: Location,
    pub value: Location,
}

/// Key paths (`sources.hephaestus.url`, `apply.command[1]`) to where they were last set.
#[derive(Clone, Debug, Default)]
pub(super) struct Origins(BTreeMap<String, Origin>);

impl Origins {
    /// The origin of `path`, or of its nearest ancestor that was written down.
    pub fn find(&self, path: &str) -> Option<&Origin> {
        let mut p = path;
        loop {
            if let Some(o) = self.0.get(p) {
                return Some(o);
            }
            p = parent(p)?;
        }
    }

    fn set(&mut self, path: String, origin: Origin, replaces_subtree: bool) {
        if replaces_subtree {
            let stale: Vec<String> = self
                .0
                .range(path.clone()..)
                .map(|(k, _)| k)
                .take_while(|k| k.starts_with(&path))
                .filter(|k| k.len() > path.len() && matches!(k.as_bytes()[path.len()], b'.' | b'['))
                .cloned()
                .collect();
            for k in stale {
                self.0.remove(&k);
            }
        }
        self.0.insert(path, origin);
    }
}

fn parent(path: &str) -> Option<&str> {
    let cut = path.rfind(['.', '['])?;
    Some(&path[..cut])
}

/// Appends a table key to a key path, quoting it when it is not a bare TOML key.
pub(super) fn join_key(base: &str, key: &str) -> String {
    let bare = !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    let seg = if bare {
        key.to_owned()
    } else {
        format!("{key:?}")
    };
    if base.is_empty() {
        seg
    } else {
        format!("{base}.{seg}")
    }
}

pub(super) fn join_index(base: &str, index: usize) -> String {
    format!("{base}[{index}]")
}

/// The files that make up the configuration at `main`: `main` itself, then
/// `<dir of main>/config.d/*.toml` in lexical order.
pub fn config_files(main: &Path) -> Result<Vec<PathBuf>, ConfigError> {
    let mut files = vec![main.to_owned()];
    let dir = main
        .parent()
        .unwrap_or_else(|| Path::new("."))
        .join("config.d");
    match std::fs::read_dir(&dir) {
        Ok(entries) => {
            let mut dropins = Vec::new();
            for entry in entries {
                let entry = entry.map_err(|source| ConfigError::ReadDir {
                    path: dir.clone(),
                    source,
                })?;
                let path = entry.path();
                let is_toml = path.extension().is_some_and(|e| e == "toml");
                let hidden = entry.file_name().to_string_lossy().starts_with('.');
                if is_toml && !hidden && !path.is_dir() {
                    dropins.push(path);
                }
            }
            dropins.sort();
            files.extend(dropins);
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => return Err(ConfigError::ReadDir { path: dir, source }),
    }
    Ok(files)
}

/// The merged document of all `files`, and where each key came from.
pub(super) fn read_merged(files: &[PathBuf]) -> Result<(toml::Table, Origins), ConfigError> {
    let mut merged = toml::Table::new();
    let mut origins = Origins::default();
    for file in files {
        let text = std::fs::read_to_string(file).map_err(|source| ConfigError::Read {
            path: file.clone(),
            source,
        })?;
        let parse_error = |e: toml::de::Error| ConfigError::Parse {
            location: Location::at(file, &text, e.span().map_or(0, |s| s.start)),
            message: e.message().trim().to_owned(),
        };
        let spanned = DeTable::parse(&text).map_err(parse_error)?;
        let table: toml::Table = toml::from_str(&text).map_err(parse_error)?;
        record_table(&mut origins, file, &text, "", spanned.get_ref());
        merge_into(&mut merged, table);
    }
    Ok((merged, origins))
}

fn record_table(origins: &mut Origins, file: &Path, text: &str, base: &str, table: &DeTable<'_>) {
    for (key, value) in table {
        let path = join_key(base, key.get_ref());
        record_value(
            origins,
            file,
            text,
            path,
            Location::at(file, text, key.span().start),
            value,
        );
    }
}

fn record_value(
    origins: &mut Origins,
    file: &Path,
    text: &str,
    path: String,
    key: Location,
    value: &toml::Spanned<DeValue<'_>>,
) {
    let origin = Origin {
        key: key.clone(),
        value: Location::at(file, text, value.span().start),
    };
    match value.get_ref() {
        DeValue::Table(t) => {
            origins.set(path.clone(), origin, false);
            record_table(origins, file, text, &path, t);
        }
        DeValue::Array(items) => {
            origins.set(path.clone(), origin, true);
            for (i, item) in items.iter().enumerate() {
                let at = Location::at(file, text, item.span().start);
                record_value(origins, file, text, join_index(&path, i), at, item);
            }
        }
        _ => origins.set(path, origin, true),
    }
}

/// Later wins: tables merge key by key, anything else is replaced whole.
fn merge_into(base: &mut toml::Table, over: toml::Table) {
    for (k, v) in over {
        match (base.get_mut(&k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge_into(b, o),
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_count_lines_and_characters() {
        let text = "a = 1\n[b]\nkey = \"é\"x\n";
        let l = Location::at(Path::new("f.toml"), text, text.find('x').unwrap());
        assert_eq!((l.line, l.column), (3, 10));
        assert_eq!(l.to_string(), "f.toml:3:10");
    }

    #[test]
    fn key_paths_quote_what_is_not_bare() {
        assert_eq!(join_key("", "sources"), "sources");
        assert_eq!(join_key("sources", "my.repo"), "sources.\"my.repo\"");
        assert_eq!(join_index("apply.command", 2), "apply.command[2]");
        assert_eq!(parent("apply.command[2]"), Some("apply.command"));
        assert_eq!(parent("apply"), None);
    }

    #[test]
    fn later_files_win_table_by_table() {
        let mut a: toml::Table = toml::from_str("[s.h]\nurl='a'\nbranch='main'\n").unwrap();
        let b: toml::Table = toml::from_str("[s.h]\nbranch='dev'\n[s.g]\nurl='g'\n").unwrap();
        merge_into(&mut a, b);
        assert_eq!(a["s"]["h"]["url"].as_str(), Some("a"));
        assert_eq!(a["s"]["h"]["branch"].as_str(), Some("dev"));
        assert_eq!(a["s"]["g"]["url"].as_str(), Some("g"));
    }
}
