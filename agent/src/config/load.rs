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
    #[cfg(test)]
    pub(super) fn at(file: &Path, text: &str, offset: usize) -> Self {
        LineIndex::new(text).locate(file, text, offset)
    }
}

/// Where lines start in one file, and how many characters precede sampled byte offsets, built
/// once per file so that locating a key costs a binary search and a short count rather than a
/// scan from the start (a drop-in with 40,000 `cert_sans` entries has as many keys).
pub(super) struct LineIndex {
    /// Byte offset of the start of each line.
    line_starts: Vec<usize>,
    /// `(byte offset, characters before it)` at character boundaries about every
    /// [`LineIndex::STRIDE`] bytes, starting with `(0, 0)`.
    samples: Vec<(usize, usize)>,
}

impl LineIndex {
    const STRIDE: usize = 256;

    pub(super) fn new(text: &str) -> Self {
        let mut line_starts = vec![0];
        let mut samples = vec![(0, 0)];
        for (chars, (i, c)) in text.char_indices().enumerate() {
            if i >= samples.last().map_or(0, |s| s.0) + Self::STRIDE {
                samples.push((i, chars));
            }
            if c == '\n' {
                line_starts.push(i + 1);
            }
        }
        Self {
            line_starts,
            samples,
        }
    }

    /// Characters in `text[..offset]`; `offset` is a character boundary.
    fn chars_before(&self, text: &str, offset: usize) -> usize {
        let i = self.samples.partition_point(|s| s.0 <= offset) - 1;
        let (at, chars) = self.samples[i];
        chars + text[at..offset].chars().count()
    }

    pub(super) fn locate(&self, file: &Path, text: &str, offset: usize) -> Location {
        let mut offset = offset.min(text.len());
        while !text.is_char_boundary(offset) {
            offset -= 1;
        }
        let line = self.line_starts.partition_point(|&s| s <= offset);
        let start = self.line_starts[line - 1];
        let column = self.chars_before(text, offset) - self.chars_before(text, start) + 1;
        Location {
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

    /// Whether `path` itself was written (not only an ancestor).
    pub fn has(&self, path: &str) -> bool {
        self.0.contains_key(path)
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
                let entry = entry.map_err(|error| ConfigError::ReadDir {
                    path: dir.clone(),
                    error,
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
        Err(error) => return Err(ConfigError::ReadDir { path: dir, error }),
    }
    Ok(files)
}

/// The largest configuration file read; anything longer is refused before it is parsed.
pub const MAX_FILE_SIZE: u64 = 1024 * 1024;
pub(super) const MAX_FILE_SIZE_TEXT: &str = "1 MiB";

/// The text of one configuration file: only a regular file (after following symlinks) of at
/// most [`MAX_FILE_SIZE`], in UTF-8. Opened without blocking, so a FIFO never stalls the
/// caller; what it is, is decided on the open file, so it cannot be swapped in between.
pub(super) fn read_file(path: &Path) -> Result<String, ConfigError> {
    use std::io::Read;
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let read_error = |error| ConfigError::Read {
        path: path.to_owned(),
        error,
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(read_error)?;
    let meta = file.metadata().map_err(read_error)?;
    let ft = meta.file_type();
    if !ft.is_file() {
        let kind = if ft.is_dir() {
            "a directory"
        } else if ft.is_fifo() {
            "a FIFO (named pipe)"
        } else if ft.is_char_device() {
            "a character device"
        } else if ft.is_block_device() {
            "a block device"
        } else if ft.is_socket() {
            "a socket"
        } else {
            "not a file"
        };
        return Err(ConfigError::NotRegular {
            path: path.to_owned(),
            kind,
        });
    }
    let too_large = |size| ConfigError::TooLarge {
        path: path.to_owned(),
        size,
    };
    if meta.len() > MAX_FILE_SIZE {
        return Err(too_large(meta.len()));
    }
    // The file may grow while it is read: never take more than the bound.
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    file.take(MAX_FILE_SIZE + 1)
        .read_to_end(&mut bytes)
        .map_err(read_error)?;
    if bytes.len() as u64 > MAX_FILE_SIZE {
        return Err(too_large(bytes.len() as u64));
    }
    String::from_utf8(bytes).map_err(|e| {
        let valid = e.utf8_error().valid_up_to();
        // Locate the bad byte in the valid text before it.
        let bytes = e.into_bytes();
        let before = String::from_utf8_lossy(&bytes[..valid]);
        let location = LineIndex::new(&before).locate(path, &before, valid);
        ConfigError::Parse {
            location,
            message: "invalid UTF-8; configuration files must be UTF-8 text".to_owned(),
        }
    })
}

/// The merged document of all `files`, and where each key came from.
pub(super) fn read_merged(files: &[PathBuf]) -> Result<(toml::Table, Origins), ConfigError> {
    let texts = files
        .iter()
        .map(|f| Ok((f.clone(), read_file(f)?)))
        .collect::<Result<Vec<_>, ConfigError>>()?;
    merge_texts(&texts)
}

/// [`read_merged`] over texts already read, named by their files.
pub(super) fn merge_texts(
    files: &[(PathBuf, String)],
) -> Result<(toml::Table, Origins), ConfigError> {
    let mut merged = toml::Table::new();
    let mut origins = Origins::default();
    for (file, text) in files {
        let text = text.as_str();
        let index = LineIndex::new(text);
        let at = Locator {
            file,
            text,
            index: &index,
        };
        let spanned = DeTable::parse(text).map_err(|e| at.parse_error(&e, None))?;
        let table: toml::Table =
            toml::from_str(text).map_err(|e| at.parse_error(&e, Some(spanned.get_ref())))?;
        record_table(&mut origins, &at, "", spanned.get_ref());
        merge_into(&mut merged, table);
    }
    Ok((merged, origins))
}

/// One file's text and its line index.
struct Locator<'a> {
    file: &'a Path,
    text: &'a str,
    index: &'a LineIndex,
}

impl Locator<'_> {
    fn at(&self, offset: usize) -> Location {
        self.index.locate(self.file, self.text, offset)
    }

    /// A TOML error at its place, naming the key it concerns: the key of a duplicate table, or
    /// (with the parsed document) the key whose value holds the error.
    fn parse_error(&self, e: &toml::de::Error, doc: Option<&DeTable<'_>>) -> ConfigError {
        let span = e.span();
        let mut message = e.message().trim().to_owned();
        if message.contains(" as i128") {
            // toml's wording for an integer beyond 64 bits.
            message = format!("integer out of range (at most {})", i64::MAX);
        }
        let key = match (span.clone(), doc) {
            (Some(s), Some(doc)) => {
                key_holding(doc, "", s.start).or_else(|| key_in_text(self.text, s.start))
            }
            // The document did not parse: read the key off the text.
            (Some(s), None) => key_in_text(self.text, s.start),
            _ => None,
        };
        let message = match key {
            Some(k) if message.starts_with("duplicate key") => {
                format!("duplicate key `{k}`: it is already defined in this file; merge the two")
            }
            Some(k) => format!("{k}: {message}"),
            None => message,
        };
        ConfigError::Parse {
            location: self.at(span.map_or(0, |s| s.start)),
            message,
        }
    }
}

/// The key written on the line of `offset`, under the table header above it: `apply` for a
/// `[apply]` line, `apply.goal` for `goal = …` below it. Only for messages, when the document
/// does not parse; what does not look like a key (bare keys, dots, quotes) is not named, since
/// a broken line may hold anything, a URL with its password too (found by the fuzzer:
/// fuzz/regressions/config/key-read-off-a-broken-line-echoes-a-url-password).
fn key_in_text(text: &str, offset: usize) -> Option<String> {
    let looks_like_key = |k: &str| {
        k.chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-. \t\"'".contains(c))
    };
    key_on_line(text, offset).filter(|k| looks_like_key(k))
}

fn key_on_line(text: &str, offset: usize) -> Option<String> {
    let offset = offset.min(text.len());
    let start = text.get(..offset)?.rfind('\n').map_or(0, |i| i + 1);
    let end = text[start..].find('\n').map_or(text.len(), |i| start + i);
    let header = |line: &str| {
        let line = line.trim();
        line.starts_with('[')
            .then(|| line.trim_matches(['[', ']']).trim().to_owned())
            .filter(|h| !h.is_empty())
    };
    let line = &text[start..end];
    if let Some(h) = header(line.split('#').next().unwrap_or("")) {
        return Some(h);
    }
    let key = line.split_once('=')?.0.trim();
    if key.is_empty() {
        return None;
    }
    let table = text[..start]
        .lines()
        .rev()
        .find_map(|l| header(l.split('#').next().unwrap_or("")));
    Some(match table {
        Some(t) => format!("{t}.{key}"),
        None => key.to_owned(),
    })
}

/// The path of the innermost key whose value spans `offset`.
fn key_holding(table: &DeTable<'_>, base: &str, offset: usize) -> Option<String> {
    for (key, value) in table {
        let path = join_key(base, key.get_ref());
        let span = value.span();
        if span.start <= offset && offset < span.end.max(span.start + 1) {
            return Some(value_key(value.get_ref(), path.clone(), offset).unwrap_or(path));
        }
    }
    None
}

fn value_key(value: &DeValue<'_>, path: String, offset: usize) -> Option<String> {
    match value {
        DeValue::Table(t) => key_holding(t, &path, offset),
        DeValue::Array(items) => items.iter().enumerate().find_map(|(i, item)| {
            let span = item.span();
            (span.start <= offset && offset < span.end.max(span.start + 1)).then(|| {
                let p = join_index(&path, i);
                value_key(item.get_ref(), p.clone(), offset).unwrap_or(p)
            })
        }),
        _ => None,
    }
}

fn record_table(origins: &mut Origins, at: &Locator<'_>, base: &str, table: &DeTable<'_>) {
    for (key, value) in table {
        let path = join_key(base, key.get_ref());
        record_value(origins, at, path, at.at(key.span().start), value);
    }
}

fn record_value(
    origins: &mut Origins,
    at: &Locator<'_>,
    path: String,
    key: Location,
    value: &toml::Spanned<DeValue<'_>>,
) {
    let origin = Origin {
        key: key.clone(),
        value: at.at(value.span().start),
    };
    match value.get_ref() {
        DeValue::Table(t) => {
            origins.set(path.clone(), origin, false);
            record_table(origins, at, &path, t);
        }
        DeValue::Array(items) => {
            origins.set(path.clone(), origin, true);
            for (i, item) in items.iter().enumerate() {
                let loc = at.at(item.span().start);
                record_value(origins, at, join_index(&path, i), loc, item);
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
    fn key_read_off_a_broken_line_echoes_a_url_password() {
        // The fuzzer's finding, reduced: a line that does not parse, holding a URL with its
        // password before an `=`; the error named "sources.hep.url i \"https://git:…" as the key.
        let text = "[sources.hep]\nurl i \"https://git:hunter2x@git.example = 2\n";
        let at = text.find("url").unwrap();
        assert_eq!(key_in_text(text, at), None);
        let text = "[https://git:hunter2x@git.example]\nx = 1\n";
        assert_eq!(key_in_text(text, 0), None);
        // A key that is one is still named.
        let text = "[apply]\ngoal = = 1\n";
        let at = text.find("goal").unwrap();
        assert_eq!(key_in_text(text, at).as_deref(), Some("apply.goal"));
    }

    #[test]
    fn locations_count_lines_and_characters() {
        let text = "a = 1\n[b]\nkey = \"é\"x\n";
        let l = Location::at(Path::new("f.toml"), text, text.find('x').unwrap());
        assert_eq!((l.line, l.column), (3, 10));
        assert_eq!(l.to_string(), "f.toml:3:10");
    }

    #[test]
    fn locations_in_long_lines_and_after_multibyte_characters() {
        let mut text = String::from("x = [");
        for i in 0..2000 {
            text.push_str(&format!("\"é{i}\", "));
        }
        text.push_str("]\nlast = 1\n");
        let index = LineIndex::new(&text);
        let f = Path::new("f.toml");
        for needle in ["é0\"", "é777\"", "é1999\"", "last"] {
            let offset = text.find(needle).unwrap();
            assert_eq!(
                index.locate(f, &text, offset),
                naive(f, &text, offset),
                "{needle}"
            );
        }
    }

    /// The obvious (and quadratic when called per key) way, to check the index against.
    fn naive(file: &Path, text: &str, offset: usize) -> Location {
        let before = &text[..offset];
        let line_start = before.rfind('\n').map_or(0, |i| i + 1);
        Location {
            file: file.to_owned(),
            line: before.matches('\n').count() + 1,
            column: text[line_start..offset].chars().count() + 1,
        }
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
