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

#[cfg(test)]
mod tests {
    use super::*;

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
/// Its heap in use stays flat (the soak of issue 19, under heaptrack: 1.6 MB after the first
/// minute), but each thread that allocates gets an arena of its own (up to 8 per core), and
/// memory freed after a burst stays in them, so RSS crept up by a few KiB an apply. Nothing
/// happens on other C libraries.
pub mod memory {
    /// One malloc arena for every thread, unless `MALLOC_ARENA_MAX` or `GLIBC_TUNABLES` set
    /// it: ginx's threads (the runtime and a few blocking Git tasks) seldom allocate at once.
    /// Call it first thing, before threads start.
    pub fn limit_arenas() {
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        {
            let tuned = std::env::var_os("MALLOC_ARENA_MAX").is_some()
                || std::env::var("GLIBC_TUNABLES").is_ok_and(|t| t.contains("arena_max"));
            if !tuned {
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
}
