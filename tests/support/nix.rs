//! Real Nix (Debian's nix-bin) for closure mode's tests and benchmark: test systems built with
//! a plain `derivation` (a fake "NixOS system": `nixos-version` and a
//! `bin/switch-to-configuration` that records its argv and start), signed with a key from
//! `nix-store --generate-binary-cache-key`, copied with `nix copy --to file://…` into a binary
//! cache, then deleted from the store, so that ginx must fetch them. Each test's systems embed
//! its own directory, so their store paths are its own.

use std::path::{Path, PathBuf};
use std::process::Command;

use super as support;

/// Nix as root without build users or a sandbox (a test machine has neither).
pub const NIX_CONFIG: &str =
    "build-users-group =\nsandbox = false\nexperimental-features = nix-command";

pub fn nix(program: &str) -> Command {
    let mut c = Command::new(program);
    c.env("NIX_CONFIG", NIX_CONFIG);
    c
}

pub fn ok(c: &mut Command) -> String {
    String::from_utf8(support::succeed(c).stdout)
        .unwrap()
        .trim()
        .to_owned()
}

/// A binary cache with its signing key, and the systems built for it.
pub struct Cache {
    pub dir: PathBuf,
    secret: PathBuf,
    /// `name:base64`
    pub public: String,
}

impl Cache {
    pub fn new(root: &Path, name: &str) -> Self {
        let dir = root.join(format!("cache-{name}"));
        std::fs::create_dir_all(&dir).unwrap();
        let secret = root.join(format!("{name}.sk"));
        let public = root.join(format!("{name}.pk"));
        ok(nix("nix-store")
            .args(["--generate-binary-cache-key", name])
            .arg(&secret)
            .arg(&public));
        let key = std::fs::read_to_string(&secret).unwrap();
        let (_, key) = key.trim().split_once(':').expect("name:base64");
        support::sweep::secret("binary-cache signing key", key);
        Self {
            dir,
            secret,
            public: std::fs::read_to_string(public).unwrap().trim().to_owned(),
        }
    }

    pub fn url(&self) -> String {
        format!("file://{}", self.dir.display())
    }

    /// Signs `path` and copies it into the cache.
    pub fn push(&self, path: &str) {
        ok(nix("nix")
            .arg("copy")
            .arg("--to")
            .arg(format!(
                "{}?secret-key={}",
                self.url(),
                self.secret.display()
            ))
            .arg(path));
    }
}

/// What the fake system's `switch-to-configuration` records, and the marker that makes it fail.
pub struct Systems {
    pub dir: PathBuf,
}

impl Systems {
    pub fn new(root: &Path) -> Self {
        let dir = root.join("systems");
        std::fs::create_dir_all(&dir).unwrap();
        Self { dir }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("switch.log")).unwrap_or_default()
    }

    /// Makes the switch of system `name` fail, or hang.
    pub fn mark(&self, name: &str, what: &str) {
        std::fs::write(self.dir.join(format!("{what}-{name}")), "").unwrap();
    }

    /// Builds `nixos-system-lucy-<name>` (or `name` itself when it starts with
    /// `nixos-system-`); without `nixos`, a path that is no NixOS system. Its switch appends
    /// `<path> <goal>` to the log, and fails or hangs when marked so; `dry-activate` (ginx's plan)
    /// answers that nothing changes, and is not logged.
    pub fn build(&self, name: &str, nixos: bool) -> String {
        let full = if name.starts_with("nixos-system-") {
            name.to_owned()
        } else {
            format!("nixos-system-lucy-{name}")
        };
        let script = self.dir.join(format!("{name}.stc"));
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\n[ \"$1\" = dry-activate ] && exit 0\ndate +%s%N > {d}/started-{name}\nself=\"$(cd \"$(dirname \"$0\")/..\" && pwd)\"\necho \"$self $*\" >> {d}/switch.log\n\
                 if [ -e {d}/fail-{name} ]; then echo 'activation script failed' >&2; exit 1; fi\n\
                 if [ -e {d}/hang-{name} ]; then exec sleep 600; fi\n",
                d = self.dir.display()
            ),
        )
        .unwrap();
        let version = if nixos {
            "echo 26.05.test > $out/nixos-version; "
        } else {
            ""
        };
        let expr = format!(
            "derivation {{ name = \"{full}\"; system = builtins.currentSystem; \
             builder = \"/bin/sh\"; args = [ \"-c\" \"/bin/mkdir -p $out/bin; {version}\
             /bin/cp {s} $out/bin/switch-to-configuration; /bin/chmod 755 $out/bin/switch-to-configuration\" ]; }}",
            s = script.display()
        );
        let file = self.dir.join(format!("{name}.nix"));
        std::fs::write(&file, expr).unwrap();
        ok(nix("nix-build").arg("--no-out-link").arg(&file))
    }
}

/// Removes `path` from the store: the node must fetch it.
pub fn forget(path: &str) {
    ok(nix("nix-store").arg("--delete").arg(path));
    assert!(!Path::new(path).exists());
}

pub fn require_nix() -> bool {
    ["nix-store", "nix-build", "nix", "nix-env"]
        .iter()
        .all(|t| support::require(t))
}

/// A node in closure mode with the fake profile of `fake_nix`, fetching from `cache` and
/// trusting `key`.
pub fn closure_env(cache: &Cache, key: &str, extra: &str) -> support::Env {
    let mut env = support::Env::new();
    env.fake_nix();
    env.daemon_env
        .push(("NIX_CONFIG".into(), NIX_CONFIG.into()));
    env.dropin(
        "50-closure.toml",
        &format!(
            "[apply]\nmode = \"closure\"\n\n[apply.closure]\nsubstituters = [\"{}\"]\n\
             trusted_public_keys = [\"{key}\"]\n{extra}",
            cache.url()
        ),
    );
    env
}
