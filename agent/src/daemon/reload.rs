//! Reloading: the configuration read again on SIGHUP or when its files change, handed to
//! every part when it loads and differs, the running one kept when it does not.

use super::*;

/// Reads the configuration on a blocking thread: a slow disk or a large file never stalls the
/// socket, the pollers or the apply loop, which share the runtime thread.
pub(super) async fn load_config(path: &Path) -> Result<config::Loaded, config::ConfigError> {
    let path = path.to_owned();
    let for_error = path.clone();
    tokio::task::spawn_blocking(move || config::load(&path))
        .await
        .unwrap_or_else(|e| {
            Err(config::ConfigError::Read {
                path: for_error,
                error: std::io::Error::other(e.to_string()),
            })
        })
}

/// Reloads the configuration from `path` and hands it to every part through `config`.
pub(super) struct Reloader {
    pub(super) path: PathBuf,
    pub(super) config: watch::Sender<Arc<Config>>,
}

impl Reloader {
    /// Loads the files again; a configuration that does not load, or does not change, leaves
    /// the running one in force. What only a restart changes keeps its running value.
    pub(super) async fn reload(&mut self, sources: &mut Sources) {
        let mut new = match load_config(&self.path).await {
            Ok(l) => l.config,
            Err(e) => {
                tracing::error!(error = %e, "configuration reload failed; the running configuration stays in force");
                return;
            }
        };
        let old = Arc::clone(&self.config.borrow());
        // What the running process is built around changes only with a restart.
        for (key, differs) in [
            ("state_dir", old.state_dir != new.state_dir),
            ("socket", old.socket != new.socket),
            ("node.name", old.node.name != new.node.name),
        ] {
            if differs {
                tracing::warn!(
                    key,
                    "this setting changes only when ginx restarts; keeping the running value"
                );
            }
        }
        new.state_dir.clone_from(&old.state_dir);
        new.socket.clone_from(&old.socket);
        new.node.name.clone_from(&old.node.name);
        if new == *old {
            tracing::debug!("configuration unchanged");
            return;
        }
        if new.control.group != old.control.group {
            server::apply_group(&new.socket, &new.control.group);
        }
        sources.reconcile(&new);
        let _ = self.config.send(Arc::new(new));
        tracing::info!("configuration reloaded");
    }
}

/// Watches the configuration file and its drop-in directory.
pub(super) struct ConfigWatcher {
    watcher: notify::RecommendedWatcher,
    dropins: PathBuf,
    watching_dropins: bool,
}

impl ConfigWatcher {
    pub(super) fn new(config: &Path, changes: mpsc::Sender<()>) -> Option<Self> {
        use notify::Watcher;
        let dir = config.parent().unwrap_or_else(|| Path::new("/")).to_owned();
        let dropins = dir.join("config.d");
        let file = config.to_owned();
        let dropins_for_events = dropins.clone();
        let handler = move |event: notify::Result<notify::Event>| {
            let Ok(event) = event else { return };
            if event.kind.is_access() {
                return;
            }
            let relevant = event
                .paths
                .iter()
                .any(|p| p == &file || p.starts_with(&dropins_for_events));
            if relevant {
                let _ = changes.try_send(());
            }
        };
        let mut watcher = match notify::recommended_watcher(handler) {
            Ok(w) => w,
            Err(e) => {
                tracing::warn!(error = %e, "cannot watch the configuration; reload with SIGHUP");
                return None;
            }
        };
        if let Err(e) = watcher.watch(&dir, notify::RecursiveMode::NonRecursive) {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot watch the configuration directory; reload with SIGHUP");
            return None;
        }
        let mut me = Self {
            watcher,
            dropins,
            watching_dropins: false,
        };
        me.refresh();
        Some(me)
    }

    /// Starts watching `config.d` once it exists.
    pub(super) fn refresh(&mut self) {
        use notify::Watcher;
        let exists = self.dropins.is_dir();
        if exists && !self.watching_dropins {
            self.watching_dropins = self
                .watcher
                .watch(&self.dropins, notify::RecursiveMode::NonRecursive)
                .is_ok();
        } else if !exists {
            self.watching_dropins = false;
        }
    }
}
