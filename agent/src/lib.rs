//! ginx: a node agent that keeps NixOS Kubernetes nodes in step with Git, safely.
//!
//! The daemon (`ginx`) pulls Git sources, applies new revisions of one of them with
//! `colmena apply-local`, remembers what it did, and answers `ginxctl` over a unix socket.
//! The manual's architecture chapter (docs/src/development.md) maps the code; the other
//! chapters state the contracts (CLI, configuration, status JSON, stored formats).

// Functions stay short enough to read: clippy's limit is in clippy.toml; tests may be longer.
#![cfg_attr(not(test), deny(clippy::too_many_lines))]

pub mod apply;
pub mod bootstrap;
pub mod cli;
pub mod config;
pub mod control;
pub mod daemon;
pub mod etcd;
#[doc(hidden)]
pub mod fuzz;
pub mod health;
pub mod k8s;
pub mod kube;
pub mod kubeadm;
pub mod logging;
pub mod metrics;
pub mod notify;
pub mod preview;
pub mod reconcile;
pub mod rollout;
pub mod source;
pub mod state;
pub mod status;
pub mod types;
pub mod util;

#[cfg(test)]
mod layers;
#[cfg(test)]
mod limits;
#[cfg(test)]
mod manual;

/// The version this build was made as (Cargo's package version).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The version stamp in the binary: [`STAMP_MARK`], then the version, NUL-padded. A packager
/// may overwrite the version in place in a copy of the binary (a distribution revision, a
/// local build mark) without building it again; [`version`] reads it at run time.
const STAMP_MARK: &[u8] = b"ginx-version-stamp:";
const STAMP_LEN: usize = 64;

#[used]
static STAMP: [u8; STAMP_LEN] = stamp(VERSION);

const fn stamp(version: &str) -> [u8; STAMP_LEN] {
    let mut out = [0u8; STAMP_LEN];
    let v = version.as_bytes();
    assert!(
        STAMP_MARK.len() + v.len() < STAMP_LEN,
        "version too long for the stamp"
    );
    let mut i = 0;
    while i < STAMP_MARK.len() {
        out[i] = STAMP_MARK[i];
        i += 1;
    }
    let mut j = 0;
    while j < v.len() {
        out[i + j] = v[j];
        j += 1;
    }
    out
}

/// The version of this binary, as shown by `--version`, in status, metrics and the user
/// agent: the stamp's (see [`STAMP_MARK`]), which is [`VERSION`] unless a packager changed it.
pub fn version() -> &'static str {
    // Read through a black box: the compiler must not fold the stamp into a constant, since
    // the bytes in the file are what counts.
    let stamp: &'static [u8; STAMP_LEN] = std::hint::black_box(&STAMP);
    let value = stamp.strip_prefix(STAMP_MARK).unwrap_or_default();
    let end = value.iter().position(|b| *b == 0).unwrap_or(value.len());
    match std::str::from_utf8(&value[..end]) {
        Ok(v) if !v.is_empty() => v,
        _ => VERSION,
    }
}

#[cfg(test)]
mod tests {
    /// The version read from the stamp is the build's own, and the stamp is where a packager
    /// finds it: the mark followed by the version and a NUL.
    #[test]
    fn the_version_is_read_from_the_stamp() {
        assert_eq!(super::version(), super::VERSION);
        let stamp = super::stamp("1.2.3+deb1");
        assert!(stamp.starts_with(b"ginx-version-stamp:1.2.3+deb1\0"));
    }
}
