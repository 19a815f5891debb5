//! The process's own resource use, read from `/proc/self` at scrape time (Linux only;
//! elsewhere every value is absent): resident memory, CPU seconds, open and allowed file
//! descriptors, threads. The parsers are pure so that they are tested on fixed text.

/// One reading of the process.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProcessStats {
    pub resident_memory_bytes: Option<u64>,
    pub virtual_memory_bytes: Option<u64>,
    pub cpu_seconds: Option<f64>,
    pub open_fds: Option<u64>,
    pub max_fds: Option<u64>,
    pub threads: Option<u64>,
    pub start_time_seconds: Option<f64>,
}

/// Clock ticks per second for `/proc/<pid>/stat`'s times: `sysconf(_SC_CLK_TCK)`, which
/// is 100 on every Linux architecture Rill builds for (the kernel's `USER_HZ`).
const CLOCK_TICKS_PER_SECOND: f64 = 100.0;

/// Reads `/proc/self`; a file that cannot be read leaves its values `None`.
pub fn read() -> ProcessStats {
    let mut stats = ProcessStats::default();
    if let Ok(stat) = std::fs::read_to_string("/proc/self/stat") {
        if let Some(s) = parse_stat(&stat) {
            stats.cpu_seconds = Some((s.utime + s.stime) as f64 / CLOCK_TICKS_PER_SECOND);
            stats.threads = Some(s.threads);
            stats.virtual_memory_bytes = Some(s.vsize);
            if let Some(boot) = std::fs::read_to_string("/proc/stat")
                .ok()
                .and_then(|t| parse_boot_time(&t))
            {
                stats.start_time_seconds =
                    Some(boot as f64 + s.starttime as f64 / CLOCK_TICKS_PER_SECOND);
            }
        }
    }
    if let Ok(status) = std::fs::read_to_string("/proc/self/status") {
        stats.resident_memory_bytes = parse_status_kib(&status, "VmRSS:").map(|k| k * 1024);
    }
    if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
        // The directory handle itself is one of the entries.
        stats.open_fds = Some((dir.count() as u64).saturating_sub(1));
    }
    if let Ok(limits) = std::fs::read_to_string("/proc/self/limits") {
        stats.max_fds = parse_max_open_files(&limits);
    }
    stats
}

/// The fields of `/proc/<pid>/stat` used here.
#[derive(Debug, PartialEq)]
pub struct Stat {
    pub utime: u64,
    pub stime: u64,
    pub threads: u64,
    pub starttime: u64,
    pub vsize: u64,
}

/// Parses `/proc/<pid>/stat`. The command name (field 2) is in parentheses and may hold
/// spaces and parentheses itself, so fields are counted from the last `)`.
pub fn parse_stat(text: &str) -> Option<Stat> {
    let rest = &text[text.rfind(')')? + 1..];
    // After the name: field 3 (state) is index 0 here.
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| -> Option<u64> { fields.get(n - 3)?.parse().ok() };
    Some(Stat {
        utime: field(14)?,
        stime: field(15)?,
        threads: field(20)?,
        starttime: field(22)?,
        vsize: field(23)?,
    })
}

/// A `Key:   123 kB` line of `/proc/<pid>/status`, in KiB.
pub fn parse_status_kib(text: &str, key: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// The soft limit of `Max open files` in `/proc/<pid>/limits` (`None` when unlimited).
pub fn parse_max_open_files(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("Max open files"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

/// `btime` of `/proc/stat`: the boot time in seconds since the epoch.
pub fn parse_boot_time(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_after_the_last_parenthesis() {
        // A command name with a space and a parenthesis, as a thread name may have.
        let text = "4242 (rill (x) y) S 1 4242 4242 0 -1 4194560 1234 0 0 0 \
                    250 75 0 0 20 0 9 0 5000 123456789 2048 18446744073709551615";
        assert_eq!(
            parse_stat(text),
            Some(Stat {
                utime: 250,
                stime: 75,
                threads: 9,
                starttime: 5000,
                vsize: 123456789
            })
        );
        assert_eq!(parse_stat("4242 (rill) S 1"), None);
    }

    #[test]
    fn status_limits_and_boot_time() {
        let status = "Name:\trill\nVmPeak:\t  999 kB\nVmRSS:\t   20480 kB\nThreads:\t9\n";
        assert_eq!(parse_status_kib(status, "VmRSS:"), Some(20480));
        assert_eq!(parse_status_kib(status, "VmSwap:"), None);
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max open files            1048576              1048576              files\n";
        assert_eq!(parse_max_open_files(limits), Some(1048576));
        let unlimited =
            "Max open files            unlimited            unlimited            files\n";
        assert_eq!(parse_max_open_files(unlimited), None);
        assert_eq!(
            parse_boot_time("cpu 1 2 3\nbtime 1764740000\n"),
            Some(1764740000)
        );
    }

    #[test]
    fn this_process_reads_as_alive() {
        let s = read();
        if cfg!(target_os = "linux") {
            assert!(s.resident_memory_bytes.is_some_and(|r| r > 0));
            assert!(s.open_fds.is_some_and(|n| n >= 3));
            assert!(s.cpu_seconds.is_some());
            assert!(s.threads.is_some_and(|t| t >= 1));
        }
    }
}
