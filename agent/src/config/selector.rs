//! Kubernetes label selectors, checked as the API server parses them (apimachinery's
//! `labels.Parse`): requirements separated by commas, each `key`, `!key`, `key=value`,
//! `key==value`, `key!=value`, `key in (a,b)`, `key notin (a,b)`, or `key>1` / `key<1`; keys
//! are qualified names (`prefix/name`), values label values. A selector the API would refuse
//! makes every request with it fail, so it is refused at load instead.

use crate::types::Invalid;

/// `Err` says what is wrong and where in the selector.
pub(super) fn check(s: &str) -> Result<(), Invalid> {
    Selector::parse(s).map(drop)
}

/// A parsed label selector, matched against an object's labels as the API server matches
/// them: every requirement must hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Selector(Vec<Requirement>);

#[derive(Clone, Debug, PartialEq, Eq)]
struct Requirement {
    key: String,
    op: Op,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Op {
    Exists,
    Absent,
    Equal(String),
    /// `!=`: absent, or another value.
    NotEqual(String),
    In(Vec<String>),
    /// `notin`: absent, or none of the values.
    NotIn(Vec<String>),
    Greater(i64),
    Less(i64),
}

impl Selector {
    /// `Err` says what is wrong and where in the selector.
    pub fn parse(s: &str) -> Result<Self, Invalid> {
        if s.trim().is_empty() {
            return Err("is empty; remove it, or give a label selector like \"app=backup\"".into());
        }
        parse(s).map(Selector).map_err(|e| {
            Invalid(format!(
                "{s:?} is not a label selector: {e}; write one like \"app=backup\", \
                 \"tier in (db,cache)\" or \"!job\""
            ))
        })
    }

    /// Whether `labels` satisfy every requirement.
    pub fn matches(&self, labels: &std::collections::BTreeMap<String, String>) -> bool {
        self.0.iter().all(|r| {
            let v = labels.get(&r.key);
            let number = || v.and_then(|v| v.parse::<i64>().ok());
            match &r.op {
                Op::Exists => v.is_some(),
                Op::Absent => v.is_none(),
                Op::Equal(x) => v == Some(x),
                Op::NotEqual(x) => v != Some(x),
                Op::In(xs) => v.is_some_and(|v| xs.contains(v)),
                Op::NotIn(xs) => v.is_none_or(|v| !xs.contains(v)),
                Op::Greater(n) => number().is_some_and(|v| v > *n),
                Op::Less(n) => number().is_some_and(|v| v < *n),
            }
        })
    }
}

fn parse(s: &str) -> Result<Vec<Requirement>, Invalid> {
    let tokens = lex(s);
    let mut p = Parser {
        tokens: &tokens,
        at: 0,
    };
    let mut out = Vec::new();
    loop {
        out.push(p.requirement()?);
        match p.next() {
            None => return Ok(out),
            Some(Tok::Sym(",")) => {}
            Some(t) => {
                return Err(Invalid(format!(
                    "expected ',' or the end after a requirement, found {t}"
                )));
            }
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Tok<'a> {
    Ident(&'a str),
    Sym(&'static str),
}

impl std::fmt::Display for Tok<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Tok::Ident(s) => write!(f, "{s:?}"),
            Tok::Sym(s) => write!(f, "'{s}'"),
        }
    }
}

const SYMBOLS: [&str; 9] = ["!=", "==", "!", "=", "(", ")", ",", ">", "<"];

fn is_special(c: char) -> bool {
    matches!(c, '!' | '=' | '(' | ')' | ',' | '>' | '<')
}

fn lex(s: &str) -> Vec<Tok<'_>> {
    let mut out = Vec::new();
    let mut rest = s;
    loop {
        rest = rest.trim_start();
        if rest.is_empty() {
            return out;
        }
        if let Some(sym) = SYMBOLS.iter().find(|sym| rest.starts_with(**sym)) {
            out.push(Tok::Sym(sym));
            rest = &rest[sym.len()..];
            continue;
        }
        let end = rest
            .find(|c: char| c.is_whitespace() || is_special(c))
            .unwrap_or(rest.len());
        out.push(Tok::Ident(&rest[..end]));
        rest = &rest[end..];
    }
}

struct Parser<'t, 'a> {
    tokens: &'t [Tok<'a>],
    at: usize,
}

impl<'a> Parser<'_, 'a> {
    fn peek(&self) -> Option<Tok<'a>> {
        self.tokens.get(self.at).copied()
    }

    fn next(&mut self) -> Option<Tok<'a>> {
        let t = self.peek();
        self.at += 1;
        t
    }

    fn requirement(&mut self) -> Result<Requirement, Invalid> {
        let negated = self.peek() == Some(Tok::Sym("!"));
        if negated {
            self.at += 1;
        }
        let key = match self.next() {
            Some(Tok::Ident(k)) => k,
            Some(t) => return Err(Invalid(format!("expected a label key, found {t}"))),
            None => return Err("expected a label key, found the end".into()),
        };
        qualified_name(key).map_err(|e| format!("label key {key:?} {e}"))?;
        let with = |op| Requirement {
            key: key.to_owned(),
            op,
        };
        if negated {
            return Ok(with(Op::Absent));
        }
        if matches!(self.peek(), None | Some(Tok::Sym(","))) {
            return Ok(with(Op::Exists));
        }
        let op = match self.next() {
            Some(Tok::Sym("=" | "==")) => Op::Equal(self.label()?),
            Some(Tok::Sym("!=")) => Op::NotEqual(self.label()?),
            Some(Tok::Sym(">")) => Op::Greater(integer(&self.exact_value()?)?),
            Some(Tok::Sym("<")) => Op::Less(integer(&self.exact_value()?)?),
            Some(Tok::Ident("in")) => Op::In(self.values()?),
            Some(Tok::Ident("notin")) => Op::NotIn(self.values()?),
            Some(t) => {
                return Err(Invalid(format!(
                    "expected an operator (=, ==, !=, in, notin, >, <) after {key:?}, found {t}"
                )));
            }
            None => return Err(Invalid(format!("expected an operator after {key:?}"))),
        };
        Ok(with(op))
    }

    fn exact_value(&mut self) -> Result<String, Invalid> {
        let value = match self.peek() {
            None | Some(Tok::Sym(",")) => "",
            Some(Tok::Ident(v)) => {
                self.at += 1;
                v
            }
            Some(t) => return Err(Invalid(format!("expected a value, found {t}"))),
        };
        Ok(value.to_owned())
    }

    /// The value of `=`, `==` or `!=`: a label value.
    fn label(&mut self) -> Result<String, Invalid> {
        let v = self.exact_value()?;
        label_value(&v)?;
        Ok(v)
    }

    fn values(&mut self) -> Result<Vec<String>, Invalid> {
        match self.next() {
            Some(Tok::Sym("(")) => {}
            Some(t) => return Err(Invalid(format!("expected '(' after in/notin, found {t}"))),
            None => return Err("expected '(' after in/notin, found the end".into()),
        }
        let mut out = Vec::new();
        loop {
            match self.peek() {
                Some(Tok::Ident(v)) => {
                    self.at += 1;
                    label_value(v)?;
                    out.push(v.to_owned());
                }
                Some(Tok::Sym("," | ")")) => out.push(String::new()),
                Some(t) => return Err(Invalid(format!("expected a value, found {t}"))),
                None => return Err("unbalanced parentheses: ')' missing".into()),
            }
            match self.next() {
                Some(Tok::Sym(")")) => return Ok(out),
                Some(Tok::Sym(",")) => {}
                Some(t) => {
                    return Err(Invalid(format!(
                        "expected ',' or ')' in a value list, found {t}"
                    )));
                }
                None => return Err("unbalanced parentheses: ')' missing".into()),
            }
        }
    }
}

/// The value of `>` or `<`.
fn integer(value: &str) -> Result<i64, Invalid> {
    value
        .parse::<i64>()
        .map_err(|_| Invalid(format!("{value:?} is not an integer, as > and < need")))
}

/// `[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`, at most 63: a label name or value.
fn is_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

fn label_value(v: &str) -> Result<(), Invalid> {
    if v.is_empty() || is_name(v) {
        Ok(())
    } else {
        Err(Invalid(format!(
            "label value {v:?} must be at most 63 letters, digits, '-', '_' or '.', starting \
             and ending with a letter or digit"
        )))
    }
}

/// A label key: `name` or `prefix/name`, the prefix a DNS subdomain.
fn qualified_name(k: &str) -> Result<(), Invalid> {
    let (prefix, name) = match k.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, k),
    };
    if let Some(p) = prefix
        && !super::is_dns_subdomain(p)
    {
        return Err("has a prefix that is not a DNS subdomain (like example.com/name)".into());
    }
    if !is_name(name) {
        return Err(
            "must be at most 63 letters, digits, '-', '_' or '.' (after an optional prefix/), \
             starting and ending with a letter or digit"
                .into(),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{Selector, check};

    #[test]
    fn a_selector_matches_labels_as_the_api_server_does() {
        let labels: std::collections::BTreeMap<String, String> =
            [("ginx.io/canary", "true"), ("tier", "db"), ("rank", "7")]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect();
        let m = |s: &str| Selector::parse(s).unwrap().matches(&labels);
        for yes in [
            "ginx.io/canary=true",
            "ginx.io/canary==true,tier",
            "tier in (cache,db)",
            "tier notin (cache)",
            "zone notin (a)",
            "!zone",
            "zone!=a",
            "tier!=cache",
            "rank>6",
            "rank<8",
        ] {
            assert!(m(yes), "{yes}");
        }
        for no in [
            "ginx.io/canary=false",
            "zone",
            "!tier",
            "tier in (cache)",
            "tier notin (db)",
            "tier!=db",
            "rank>7",
            "tier>1",
            "ginx.io/canary=true,zone=a",
        ] {
            assert!(!m(no), "{no}");
        }
    }

    #[test]
    fn selectors_the_api_takes_are_accepted() {
        for s in [
            "app=backup",
            "app==backup",
            "app!=backup",
            "app",
            "!job",
            "app in (a,b)",
            "tier notin (db, cache)",
            "app in ()",
            "app in (a,)",
            "app=",
            "app = backup , !job,env in(prod)",
            "example.com/role=db",
            "app.kubernetes.io/name=web-1",
            "replicas>1",
            "replicas < 10",
            "v=in",
        ] {
            assert_eq!(check(s), Ok(()), "{s}");
        }
    }

    #[test]
    fn selectors_the_api_refuses_are_refused_with_the_reason() {
        for (s, why) in [
            ("app==x y", "expected ',' or the end"),
            ("app in (a,b", "')' missing"),
            ("app in a", "expected '('"),
            ("=x", "expected a label key"),
            ("app=x,", "found the end"),
            ("a b", "expected an operator"),
            ("-app=x", "label key \"-app\""),
            ("x/y/z=1", "label key \"x/y/z\""),
            ("UPPER.example/x=y", "not a DNS subdomain"),
            ("app=-x", "label value \"-x\""),
            ("app=x/y", "label value \"x/y\""),
            ("replicas>x", "not an integer"),
            ("!app=x", "expected ',' or the end"),
            ("app in (a b)", "expected ',' or ')'"),
        ] {
            let e = check(s).unwrap_err();
            assert!(e.0.contains(why), "{s}: {e}");
            assert!(e.0.contains("is not a label selector"), "{s}: {e}");
        }
        assert!(check(" ").unwrap_err().0.contains("is empty"));
    }
}
