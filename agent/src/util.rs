//! Small helpers shared by the daemon's parts: backoff, jitter, human ages.
//!
//! Layer 1: imports nothing of the crate.

use std::time::Duration;

use jiff::Timestamp;

/// `base * 2^(n-1)`, capped at `max`; `n` counts failures so far (1 for the first).
pub fn backoff(base: Duration, max: Duration, n: u32) -> Duration {
    let factor = 1u32
        .checked_shl(n.saturating_sub(1).min(31))
        .unwrap_or(u32::MAX);
    base.checked_mul(factor).unwrap_or(max).min(max)
}

/// `d` scaled by a random factor in `[1 - spread, 1 + spread]`.
pub fn jitter(d: Duration, spread: f64) -> Duration {
    let factor = 1.0 + spread * (2.0 * fastrand::f64() - 1.0);
    d.mul_f64(factor.max(0.0))
}

/// A timestamp with the millisecond precision used in state, status and history.
pub fn now() -> Timestamp {
    let t = Timestamp::now();
    t.round(jiff::Unit::Millisecond).unwrap_or(t)
}

/// `t` plus `d`, saturating at the far future.
pub fn after(t: Timestamp, d: Duration) -> Timestamp {
    jiff::SignedDuration::try_from(d)
        .ok()
        .and_then(|d| t.checked_add(d).ok())
        .unwrap_or(Timestamp::MAX)
}

/// `t` minus `d`, saturating at the far past.
pub fn before(t: Timestamp, d: Duration) -> Timestamp {
    jiff::SignedDuration::try_from(d)
        .ok()
        .and_then(|d| t.checked_sub(d).ok())
        .unwrap_or(Timestamp::MIN)
}

/// Tells a step of the wall clock from its running: between two looks, the wall clock should
/// move as the monotonic clock does. NTP's slewing (at most 500 ppm) stays far below the
/// threshold; a step (`date -s`, a VM restored, an NTP step at boot) does not.
#[derive(Debug, Default)]
pub struct WallSteps {
    last: Option<(Timestamp, std::time::Instant)>,
}

impl WallSteps {
    /// Looks at the clocks; returns how far the wall clock stepped since the last look, when
    /// that is more than `threshold` either way.
    pub fn look(
        &mut self,
        wall: Timestamp,
        mono: std::time::Instant,
        threshold: Duration,
    ) -> Option<jiff::SignedDuration> {
        let last = self.last.replace((wall, mono));
        let (w0, m0) = last?;
        let ran = jiff::SignedDuration::try_from(mono.saturating_duration_since(m0)).ok()?;
        let step = wall.duration_since(w0).checked_sub(ran)?;
        let threshold = jiff::SignedDuration::try_from(threshold).ok()?;
        (step.abs() > threshold).then_some(step)
    }
}

/// "12s", "3m", "2h", "5d": how long ago (or until) `t`, for one-line human views.
pub fn age(t: Timestamp, now: Timestamp) -> String {
    let secs = now.duration_since(t).as_secs();
    let (abs, future) = (secs.unsigned_abs(), secs < 0);
    let short = match abs {
        0..=59 => format!("{abs}s"),
        60..=3599 => format!("{}m", abs / 60),
        3600..=86_399 => format!("{}h", abs / 3600),
        _ => format!("{}d", abs / 86_400),
    };
    if future {
        format!("in {short}")
    } else {
        format!("{short} ago")
    }
}

/// A process's start time in clock ticks since boot (field 22 of `/proc/<pid>/stat`).
pub fn process_start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces and parentheses; fields resume after the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Whether process `pid` still runs and is the one that started at `start` (when known): a
/// pid reused by another process is not taken for it.
pub fn process_is(pid: u32, start: Option<u64>) -> bool {
    match (process_start_time(pid), start) {
        (None, _) => false,
        (Some(now), Some(want)) => now == want,
        (Some(_), None) => true,
    }
}

/// Replaces `path` with `bytes` so that readers see the old or the new content, never a mix,
/// even across a crash. The new file is created with `mode` (less the umask) before anything is
/// written to it, so a secret is never readable by others even for a moment. The temporary file
/// is a dot file beside `path` (the kubelet ignores those in its static Pod directory).
pub fn replace_file(path: &std::path::Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let dir = path.parent().unwrap_or_else(|| std::path::Path::new("."));
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other(format!("{}: not a file name", path.display())))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".ginx-tmp-{}", std::process::id()));
    let tmp = path.with_file_name(tmp_name);
    let _ = std::fs::remove_file(&tmp);
    let result = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// The name of the interface of this host (network namespace) that has `ip`, if any.
pub fn interface_with(ip: std::net::IpAddr) -> Result<Option<String>, String> {
    let addrs = nix::ifaddrs::getifaddrs().map_err(|e| format!("getifaddrs: {e}"))?;
    Ok(addrs
        .filter(|a| {
            a.address.is_some_and(|s| {
                s.as_sockaddr_in().map(|s| std::net::IpAddr::V4(s.ip())) == Some(ip)
                    || s.as_sockaddr_in6().map(|s| std::net::IpAddr::V6(s.ip())) == Some(ip)
            })
        })
        .map(|a| a.interface_name)
        .next())
}

/// The builder of ginx's HTTP clients to a server named in the configuration (etcd,
/// FleetLock, Prometheus): rustls on ring, every request bounded by `timeout`, no proxy from
/// the environment (the server is reached directly), no redirect followed (a redirect is an
/// answer, not a new request), ginx's user agent.
pub fn http_client(timeout: std::time::Duration) -> reqwest::ClientBuilder {
    // Without a provider, reqwest (built without one of its own) would panic; installing it
    // twice changes nothing.
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .timeout(timeout)
        .connect_timeout(timeout)
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("ginx/", env!("CARGO_PKG_VERSION")))
}

/// An error and its causes, one line. reqwest's own message names the URL, credentials and
/// all, so it is left out; the causes below it (connect, TLS, I/O) do not.
pub fn http_error(e: &reqwest::Error) -> String {
    let mut out = String::new();
    let mut cause: Option<&dyn std::error::Error> = std::error::Error::source(e);
    if cause.is_none() {
        out.push_str(if e.is_builder() {
            "invalid request"
        } else if e.is_body() || e.is_decode() {
            "the answer could not be read"
        } else {
            "request failed"
        });
    }
    while let Some(c) = cause {
        let text = c.to_string();
        // Nested errors often repeat their source's message in their own.
        if !out.contains(&text) {
            if !out.is_empty() {
                out.push_str(": ");
            }
            out.push_str(&text);
        }
        cause = c.source();
    }
    out
}

/// A condition that lasts a while (a guard holding the node back, a peer ignored) and is told
/// once when it starts, not at every look while it lasts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Spell {
    on: bool,
}

impl Spell {
    /// Records whether the condition holds at this look: `true` when a spell starts now.
    pub fn starts(&mut self, on: bool) -> bool {
        let starts = on && !self.on;
        self.on = on;
        starts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spell_starts_once_until_it_ends() {
        let mut s = Spell::default();
        assert!(!s.starts(false));
        assert!(s.starts(true));
        assert!(!s.starts(true), "the same spell");
        assert!(!s.starts(false));
        assert!(s.starts(true), "a new spell");
    }

    fn resident_file_kib() -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("RssFile:"))
            .unwrap()
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .unwrap()
    }

    #[test]
    fn the_executables_resident_pages_are_given_back() {
        let before = resident_file_kib();
        let advised = memory::release_code_pages().unwrap();
        let after = resident_file_kib();
        assert!(advised > 1 << 20, "advised {advised} bytes");
        assert!(after < before, "file-backed RSS {before} kB → {after} kB");
        assert!(memory::resident_kib().is_some_and(|k| k > 0));
    }

    #[test]
    fn wall_steps_tell_a_step_from_running() {
        let mut w = WallSteps::default();
        let t0 = Timestamp::from_second(1_800_000_000).unwrap();
        let m0 = std::time::Instant::now();
        let th = Duration::from_secs(5);
        assert_eq!(
            w.look(t0, m0, th),
            None,
            "the first look has nothing to compare"
        );
        // An hour of running, with a second of slewing: no step.
        let m1 = m0 + Duration::from_secs(3600);
        let t1 = after(t0, Duration::from_secs(3601));
        assert_eq!(w.look(t1, m1, th), None);
        // +15 min in a second of monotonic time.
        let m2 = m1 + Duration::from_secs(1);
        let t2 = after(t1, Duration::from_secs(901));
        assert_eq!(
            w.look(t2, m2, th),
            Some(jiff::SignedDuration::from_secs(900))
        );
        // Logged once: the next look compares with the stepped clock.
        let m3 = m2 + Duration::from_secs(1);
        assert_eq!(w.look(after(t2, Duration::from_secs(1)), m3, th), None);
        // Back by 15 min.
        let m4 = m3 + Duration::from_secs(1);
        let t4 = before(after(t2, Duration::from_secs(2)), Duration::from_secs(900));
        assert_eq!(
            w.look(t4, m4, th),
            Some(jiff::SignedDuration::from_secs(-900))
        );
    }

    #[test]
    fn backoff_doubles_and_caps() {
        let b = Duration::from_secs(5);
        let m = Duration::from_secs(60);
        assert_eq!(backoff(b, m, 1), Duration::from_secs(5));
        assert_eq!(backoff(b, m, 2), Duration::from_secs(10));
        assert_eq!(backoff(b, m, 4), Duration::from_secs(40));
        assert_eq!(backoff(b, m, 5), m);
        assert_eq!(backoff(b, m, 1000), m);
    }

    #[test]
    fn jitter_stays_within_ten_percent() {
        for _ in 0..1000 {
            let j = jitter(Duration::from_secs(100), 0.1);
            assert!(
                j >= Duration::from_secs(90) && j <= Duration::from_secs(110),
                "{j:?}"
            );
        }
    }

    #[test]
    fn ages_read_like_an_operator_speaks() {
        let now: Timestamp = "2026-11-30T12:00:00Z".parse().unwrap();
        let ago = |s: i64| age(now - jiff::SignedDuration::from_secs(s), now);
        assert_eq!(ago(12), "12s ago");
        assert_eq!(ago(185), "3m ago");
        assert_eq!(ago(7300), "2h ago");
        assert_eq!(ago(3 * 86_400), "3d ago");
        assert_eq!(ago(-30), "in 30s");
    }
}

/// glibc's malloc, tuned for a daemon that idles between bursts of work (a fetch, an apply).
/// Two of its defaults cost a long-running ginx memory it does not need:
/// - each thread that allocates gets an arena of its own (up to 8 per core), and memory freed
///   after a burst stays in them, so RSS crept up by a few KiB an apply;
/// - each thread keeps up to 7 freed chunks of each small size for itself (the tcache, up to
///   about 240 KiB a thread), which fills over a process's first minutes: most of the growth
///   the soak (bench/soak.sh) saw in them once the history's spare room was gone.
///
/// Both are off for the daemon: one arena, no tcache. ginx allocates little and seldom, so
/// neither costs it speed. Nothing happens on other C libraries.
pub mod memory {
    /// glibc's tunables as the daemon sets them.
    pub const TUNABLES: &str = "glibc.malloc.arena_max=1:glibc.malloc.tcache_count=0";
    /// Marks the process that [`tune`] started again, for the moment it takes to read it.
    const STARTED_TUNED: &str = "GINX_MALLOC_TUNED";

    /// Call it first thing in the daemon, before any thread starts. glibc reads its tunables
    /// only when a program starts, so the daemon executes itself again (the same process and
    /// pid, a few milliseconds) with `GLIBC_TUNABLES` set, and then removes the variable, so
    /// that the commands it runs get the environment it was given. When the environment
    /// tunes malloc already (`GLIBC_TUNABLES` or `MALLOC_ARENA_MAX` set), ginx leaves it as
    /// it is, limiting the arenas only if nothing else did; when the new start fails, ginx
    /// goes on with one arena and the tcache on.
    pub fn tune() {
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        {
            use std::os::unix::process::CommandExt;
            if std::env::var_os(STARTED_TUNED).is_some() {
                // SAFETY: called before any thread starts, so nothing reads the environment
                // at the same time.
                unsafe {
                    std::env::remove_var(STARTED_TUNED);
                    std::env::remove_var("GLIBC_TUNABLES");
                }
                return;
            }
            let tunables = std::env::var_os("GLIBC_TUNABLES");
            let arena_set = std::env::var_os("MALLOC_ARENA_MAX").is_some()
                || tunables
                    .as_ref()
                    .is_some_and(|t| t.to_string_lossy().contains("arena_max"));
            if tunables.is_none() && !arena_set {
                let mut args = std::env::args_os();
                let mut cmd = std::process::Command::new("/proc/self/exe");
                if let Some(arg0) = args.next() {
                    cmd.arg0(arg0);
                }
                let err = cmd
                    .args(args)
                    .env("GLIBC_TUNABLES", TUNABLES)
                    .env(STARTED_TUNED, "1")
                    .exec();
                eprintln!(
                    "ginx: cannot start again with malloc tuned ({err}); going on with one \
                     arena and the tcache on"
                );
            }
            if !arena_set {
                // SAFETY: mallopt only sets a malloc parameter; M_ARENA_MAX takes any count.
                unsafe {
                    libc::mallopt(libc::M_ARENA_MAX, 1);
                }
            }
        }
    }

    /// Gives the memory malloc holds free back to the kernel. Call it after a burst of work;
    /// it takes well under a millisecond on ginx's few-MiB heap.
    pub fn trim() {
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        // SAFETY: malloc_trim only releases free memory; it is safe at any time.
        unsafe {
            libc::malloc_trim(0);
        }
    }

    /// Gives back the pages of ginx's own executable (code and read-only data) that are resident:
    /// `madvise(MADV_PAGEOUT)` on each read-only mapping of `/proc/self/exe`. Called once, a while
    /// after start: what start-up touched (configuration, argument parsing, the log filter, the
    /// first fetch and apply) otherwise stays resident for the life of the process, since the kernel
    /// frees clean file pages only under memory pressure, and counts in RSS and in the unit's
    /// cgroup. Pages the daemon touches again fault back in from the page cache or the file; their
    /// contents never change (the mappings are read-only). Shared pages (another process maps the
    /// same file) are left alone by the kernel. Returns the bytes advised.
    pub fn release_code_pages() -> std::io::Result<u64> {
        let path = std::fs::read_link("/proc/self/exe")?;
        let path = path.to_string_lossy();
        let path = path.trim_end_matches(" (deleted)");
        let maps = std::fs::read_to_string("/proc/self/maps")?;
        let mut advised = 0;
        for line in maps.lines() {
            // start-end perms offset major:minor inode path
            let fields: Vec<&str> = line.splitn(6, ' ').collect();
            let [range, perms, _offset, _dev, _inode, rest] = fields[..] else {
                continue;
            };
            let mapped = rest.trim_start().trim_end_matches(" (deleted)");
            if mapped != path || perms.contains('w') {
                continue;
            }
            let Some((start, end)) = range.split_once('-') else {
                continue;
            };
            let (Ok(start), Ok(end)) = (
                usize::from_str_radix(start, 16),
                usize::from_str_radix(end, 16),
            ) else {
                continue;
            };
            let Some(addr) = std::ptr::NonNull::new(start as *mut std::ffi::c_void) else {
                continue;
            };
            let len = end.saturating_sub(start);
            // SAFETY: a read-only, file-backed mapping of our own executable, as listed by the
            // kernel just now; MADV_PAGEOUT drops resident pages but never changes what a read of
            // the mapping returns.
            let r = unsafe {
                nix::sys::mman::madvise(addr, len, nix::sys::mman::MmapAdvise::MADV_PAGEOUT)
            };
            r.map_err(std::io::Error::from)?;
            advised += len as u64;
        }
        Ok(advised)
    }

    /// This process's resident set (VmRSS), in KiB.
    pub fn resident_kib() -> Option<u64> {
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))?
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()
    }
}
