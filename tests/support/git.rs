//! Real Git repositories made with the `git` CLI, isolated from the user's configuration.

use std::path::{Path, PathBuf};
use std::process::Command;

pub struct GitRepo {
    pub path: PathBuf,
}

/// A `git` command that ignores the machine's and the user's configuration, and the
/// repository the tests are run from: under `git bisect run` or a hook, git exports `GIT_DIR`,
/// and every `git init` and commit of the tests went to that repository (it was set bare).
pub fn git_cmd() -> Command {
    let mut c = Command::new("git");
    for var in [
        "GIT_DIR",
        "GIT_WORK_TREE",
        "GIT_COMMON_DIR",
        "GIT_INDEX_FILE",
        "GIT_OBJECT_DIRECTORY",
        "GIT_ALTERNATE_OBJECT_DIRECTORIES",
        "GIT_NAMESPACE",
        "GIT_PREFIX",
    ] {
        c.env_remove(var);
    }
    c.env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_AUTHOR_NAME", "Test")
        .env("GIT_AUTHOR_EMAIL", "test@example.com")
        .env("GIT_COMMITTER_NAME", "Test")
        .env("GIT_COMMITTER_EMAIL", "test@example.com");
    c
}

impl GitRepo {
    /// A new repository on branch `main` with one commit holding a trivial hive.
    pub fn init(path: &Path) -> Self {
        std::fs::create_dir_all(path).unwrap();
        let repo = Self {
            path: path.to_owned(),
        };
        repo.git(&["init", "-q", "-b", "main"]);
        repo.commit(
            "hive.nix",
            "{ meta.nixpkgs = <nixpkgs>; }\n",
            "initial hive",
        );
        repo
    }

    pub fn git(&self, args: &[&str]) -> String {
        let out = super::succeed(git_cmd().arg("-C").arg(&self.path).args(args));
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// Writes `file` and commits it; returns the new head.
    pub fn commit(&self, file: &str, content: &str, message: &str) -> String {
        let p = self.path.join(file);
        if let Some(d) = p.parent() {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(&p, content).unwrap();
        self.git(&["add", "-A"]);
        self.git(&["commit", "-q", "-m", message]);
        self.head()
    }

    pub fn head(&self) -> String {
        self.git(&["rev-parse", "HEAD"])
    }
}
