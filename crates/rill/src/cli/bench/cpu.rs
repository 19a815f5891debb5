//! The benchmark's own CPU time, so that a report shows when the client, not the
//! broker, is what bounds a run (on a small machine the two share the cores).

use std::time::Duration;

/// CPU time (user and system, every thread) this process has used so far; zero when
/// the kernel will not say.
#[allow(unsafe_code, reason = "getrusage has no safe std API")]
pub(super) fn process_cpu() -> Duration {
    // SAFETY: `rusage` is plain integers, for which all zero bytes are a valid value.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes one `rusage` through the pointer, which points to one.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return Duration::ZERO;
    }
    let time = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec.max(0) as u64) + Duration::from_micros(t.tv_usec.max(0) as u64)
    };
    time(usage.ru_utime) + time(usage.ru_stime)
}

/// CPU time used since `start` (a [`process_cpu`] reading), with its share per GB of
/// `bytes`, for the report.
pub(super) fn report(start: Duration, bytes: u64) -> (f64, f64) {
    let used = process_cpu().saturating_sub(start).as_secs_f64();
    let per_gb = if bytes == 0 {
        0.0
    } else {
        used / (bytes as f64 / 1e9)
    };
    (used, per_gb)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spinning_shows_up() {
        let start = process_cpu();
        let spin = std::time::Instant::now();
        let mut x = 0u64;
        while spin.elapsed() < Duration::from_millis(50) {
            x = x.wrapping_mul(31).wrapping_add(1);
        }
        std::hint::black_box(x);
        let (used, per_gb) = report(start, 1_000_000_000);
        assert!(used >= 0.02, "{used}");
        assert!((per_gb - used).abs() < 1e-9);
        assert_eq!(report(start, 0).1, 0.0);
    }
}
