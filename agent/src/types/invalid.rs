//! [`Invalid`]: a value a person wrote — a setting, a command-line argument, a name, a URL —
//! that ginx cannot use. Its text says which value, what is wrong with it and what to write
//! instead. It is shown to that person and never inspected: a caller that must tell one case
//! from another gets an error type with variants, not this.

/// A value a person wrote that cannot be used, and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Invalid(pub String);

impl From<String> for Invalid {
    fn from(why: String) -> Self {
        Invalid(why)
    }
}

impl From<&str> for Invalid {
    fn from(why: &str) -> Self {
        Invalid(why.to_owned())
    }
}

impl From<Invalid> for String {
    fn from(e: Invalid) -> Self {
        e.0
    }
}
