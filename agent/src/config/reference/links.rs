//! Rustdoc's intra-doc links in the schema's doc comments, turned into text a reader of the
//! manual can use: the reference is Markdown for people who configure ginx, not rustdoc, and
//! `[`DEFAULT_EVENTS`]` there is neither a link nor an answer.
//!
//! A link is `[`X`]`, `[`X`](path)` or `[words](path)` whose target (`path`, else `X`) is a
//! Rust path (`a::b::C`, `f()`, `m!`, `struct@S`). Its target's last segment looked up in the
//! table the caller passes is replaced by the table's text (a constant spelled out, built from
//! the constant itself so it cannot drift); otherwise the brackets and the target go and the
//! text stays, `X` as a code span. A target that leaves no trace that way (`[words](path)`,
//! `[`X`](path::to::Y)`) is returned as lost: the caller lists it as an error, like a key
//! without a doc comment, since the reader would otherwise be pointed at nothing. Code spans
//! and Markdown links (`[page](rollouts.md)`, URLs) are left as written.
//!
//! Does not own the table (the caller's) nor where the text goes (`super`).

/// `doc` with its intra-doc links resolved through `known` (target name, text), and the
/// targets that would be lost (neither in `known` nor named by the text that stays).
pub(super) fn resolve(doc: &str, known: &[(&str, String)]) -> (String, Vec<String>) {
    let mut out = String::with_capacity(doc.len());
    let mut lost = Vec::new();
    let mut rest = doc;
    while let Some(at) = rest.find(['`', '[']) {
        out.push_str(&rest[..at]);
        rest = &rest[at..];
        if rest.starts_with('`') {
            let len = code_span_len(rest);
            out.push_str(&rest[..len]);
            rest = &rest[len..];
            continue;
        }
        match link(rest) {
            Some((l, len)) => {
                match known.iter().find(|(name, _)| *name == item_name(l.target)) {
                    Some((_, text)) => out.push_str(text),
                    None => {
                        let shown = l.text.trim_matches('`');
                        if item_name(shown) != item_name(l.target) {
                            lost.push(l.target.to_owned());
                        }
                        out.push_str(l.text);
                    }
                }
                rest = &rest[len..];
            }
            None => {
                out.push('[');
                rest = &rest[1..];
            }
        }
    }
    out.push_str(rest);
    (out, lost)
}

/// Whether `text` still holds rustdoc link syntax: a `[`…`]` not followed by `(`. For the
/// tests, which check the rendered reference with it.
#[cfg(test)]
pub(super) fn leftover(text: &str) -> Option<&str> {
    let mut from = 0;
    while let Some(at) = text[from..].find("[`") {
        let start = from + at;
        let close = text[start..].find("`]")?;
        let end = start + close + 2;
        if !text[end..].starts_with('(') {
            return Some(&text[start..end]);
        }
        from = end;
    }
    None
}

/// One link: the text shown (a code span or words) and what it points to.
struct Link<'a> {
    text: &'a str,
    target: &'a str,
}

/// The link `s` starts with (at its `[`), if it is an intra-doc link, and its length.
fn link(s: &str) -> Option<(Link<'_>, usize)> {
    let close = closing_bracket(s)?;
    let text = &s[1..close];
    let after = &s[close + 1..];
    if let Some(inner) = after.strip_prefix('(') {
        let end = inner.find(')')?;
        let target = &inner[..end];
        return is_path(target).then_some((Link { text, target }, close + 2 + end + 1));
    }
    let target = text.strip_prefix('`')?.strip_suffix('`')?;
    is_path(target).then_some((Link { text, target }, close + 1))
}

/// Where the `]` that closes the `[` starting `s` is; brackets in code spans do not count, and
/// a nested `[` means this is not a link.
fn closing_bracket(s: &str) -> Option<usize> {
    let mut i = 1;
    while i < s.len() {
        match s.as_bytes()[i] {
            b'`' => i += code_span_len(&s[i..]),
            b']' => return Some(i),
            b'[' => return None,
            _ => i += 1,
        }
    }
    None
}

/// The length of the code span `s` starts with (its opening run of backticks up to the same
/// run closing it), or of the run alone when it is never closed.
fn code_span_len(s: &str) -> usize {
    let run = s.len() - s.trim_start_matches('`').len();
    let fence = &s[..run];
    s[run..].find(fence).map_or(run, |end| run + end + run)
}

/// Whether `s` is a Rust path as rustdoc links write them: `crate::a::B`, `f()`, `m!`,
/// `struct@S`.
fn is_path(s: &str) -> bool {
    let s = s.split_once('@').map_or(s, |(_, p)| p);
    let s = s
        .strip_suffix("()")
        .or_else(|| s.strip_suffix('!'))
        .unwrap_or(s);
    !s.is_empty()
        && s.split("::").all(|seg| {
            seg.chars()
                .next()
                .is_some_and(|c| c.is_alphabetic() || c == '_')
                && seg.chars().all(|c| c.is_alphanumeric() || c == '_')
        })
}

/// The name of the item a path names: its last segment, without `()`, `!` or a `kind@`.
fn item_name(path: &str) -> &str {
    let p = path.split_once('@').map_or(path, |(_, p)| p);
    let p = p
        .strip_suffix("()")
        .or_else(|| p.strip_suffix('!'))
        .unwrap_or(p);
    p.rsplit("::").next().unwrap_or(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> Vec<(&'static str, String)> {
        vec![("DEFAULT_EVENTS", "`A`, `B`".to_owned())]
    }

    #[test]
    fn links_are_spelled_out_or_reduced_to_their_code_span() {
        let cases: &[(&str, &str, &[&str])] = &[
            // A known link: the table's text.
            ("default [`DEFAULT_EVENTS`].", "default `A`, `B`.", &[]),
            // A known link with a path, or words and a path: the table's text.
            (
                "d [`DEFAULT_EVENTS`](super::DEFAULT_EVENTS)",
                "d `A`, `B`",
                &[],
            ),
            (
                "d [the list](crate::config::DEFAULT_EVENTS)",
                "d `A`, `B`",
                &[],
            ),
            // An unknown link: its code span, which still names it.
            ("after [`load`] it is", "after `load` it is", &[]),
            ("see [`Config::load()`]", "see `Config::load()`", &[]),
            ("[`Shape`](super::Shape) x", "`Shape` x", &[]),
            ("[`struct@Shape`]", "`struct@Shape`", &[]),
            // An unknown target that the text does not name: lost, and reported.
            ("[`Other`](super::Shape)", "`Other`", &["super::Shape"]),
            ("[its shape](crate::Shape)", "its shape", &["crate::Shape"]),
            // Code spans, Markdown links and brackets that are not links: untouched.
            ("`[apply.closure]`", "`[apply.closure]`", &[]),
            ("``a [`X`] b``", "``a [`X`] b``", &[]),
            ("plain `code` here", "plain `code` here", &[]),
            (
                "[default: `health.interval`]",
                "[default: `health.interval`]",
                &[],
            ),
            (
                "see [rollouts](rollouts.md)",
                "see [rollouts](rollouts.md)",
                &[],
            ),
            (
                "[site](https://ginx.dev/x)",
                "[site](https://ginx.dev/x)",
                &[],
            ),
            (
                "`[A-Za-z0-9]([-A-Za-z0-9_.]*)?`",
                "`[A-Za-z0-9]([-A-Za-z0-9_.]*)?`",
                &[],
            ),
            ("[a [`X`] b]", "[a `X` b]", &[]),
            ("unclosed [`X", "unclosed [`X", &[]),
        ];
        for (doc, want, lost) in cases {
            let (got, got_lost) = resolve(doc, &table());
            assert_eq!(&got, want, "{doc}");
            assert_eq!(&got_lost, lost, "{doc}");
        }
    }

    #[test]
    fn leftover_link_syntax_is_found_and_links_with_a_target_are_not() {
        assert_eq!(
            leftover("default [`DEFAULT_EVENTS`]."),
            Some("[`DEFAULT_EVENTS`]")
        );
        assert_eq!(leftover("see [`x`](a.md) and `y`"), None);
        assert_eq!(leftover("default `A`, `B`."), None);
        assert_eq!(leftover("a [`b`](c) then [`d`] e"), Some("[`d`]"));
    }
}
