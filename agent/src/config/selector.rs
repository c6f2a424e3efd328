//! Kubernetes label selectors, checked as the API server parses them (apimachinery's
//! `labels.Parse`): requirements separated by commas, each `key`, `!key`, `key=value`,
//! `key==value`, `key!=value`, `key in (a,b)`, `key notin (a,b)`, or `key>1` / `key<1`; keys
//! are qualified names (`prefix/name`), values label values. A selector the API would refuse
//! makes every request with it fail, so it is refused at load instead.

use crate::types::Invalid;

/// `Err` says what is wrong and where in the selector.
pub(super) fn check(s: &str) -> Result<(), Invalid> {
    if s.trim().is_empty() {
        return Err("is empty; remove it, or give a label selector like \"app=backup\"".into());
    }
    parse(s).map_err(|e| {
        Invalid(format!(
            "{s:?} is not a label selector: {e}; write one like \"app=backup\", \
             \"tier in (db,cache)\" or \"!job\""
        ))
    })
}

fn parse(s: &str) -> Result<(), Invalid> {
    let tokens = lex(s);
    let mut p = Parser {
        tokens: &tokens,
        at: 0,
    };
    loop {
        p.requirement()?;
        match p.next() {
            None => return Ok(()),
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

    fn requirement(&mut self) -> Result<(), Invalid> {
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
        if negated || matches!(self.peek(), None | Some(Tok::Sym(","))) {
            return Ok(());
        }
        match self.next() {
            Some(Tok::Sym("=" | "==" | "!=")) => self.exact_value(false),
            Some(Tok::Sym(">" | "<")) => self.exact_value(true),
            Some(Tok::Ident("in" | "notin")) => self.values(),
            Some(t) => Err(Invalid(format!(
                "expected an operator (=, ==, !=, in, notin, >, <) after {key:?}, found {t}"
            ))),
            None => Err(Invalid(format!("expected an operator after {key:?}"))),
        }
    }

    fn exact_value(&mut self, integer: bool) -> Result<(), Invalid> {
        let value = match self.peek() {
            None | Some(Tok::Sym(",")) => "",
            Some(Tok::Ident(v)) => {
                self.at += 1;
                v
            }
            Some(t) => return Err(Invalid(format!("expected a value, found {t}"))),
        };
        if integer {
            return value
                .parse::<i64>()
                .map(drop)
                .map_err(|_| format!("{value:?} is not an integer, as > and < need"))
                .map_err(Invalid);
        }
        label_value(value)
    }

    fn values(&mut self) -> Result<(), Invalid> {
        match self.next() {
            Some(Tok::Sym("(")) => {}
            Some(t) => return Err(Invalid(format!("expected '(' after in/notin, found {t}"))),
            None => return Err("expected '(' after in/notin, found the end".into()),
        }
        loop {
            match self.peek() {
                Some(Tok::Ident(v)) => {
                    self.at += 1;
                    label_value(v)?;
                }
                Some(Tok::Sym("," | ")")) => {}
                Some(t) => return Err(Invalid(format!("expected a value, found {t}"))),
                None => return Err("unbalanced parentheses: ')' missing".into()),
            }
            match self.next() {
                Some(Tok::Sym(")")) => return Ok(()),
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
    use super::check;

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
