//! A partition directory whose files are fuzzer-provided bytes: open it (recovery included),
//! read everything, look up timestamps, append, truncate, close, and open it again.
//!
//! Input: a sequence of `[file kind: u8][length: u16][bytes…]` chunks; each kind names one
//! file of a partition directory (two segments' `.log`/`.index`/`.timeindex`, the
//! checkpoints, the clean-shutdown marker, a producer snapshot). A later chunk of the same
//! kind replaces an earlier one. Checks: no panic; a log that opened reads back batches
//! inside its offsets; a log that opened and closed cleanly opens again.
#![no_main]

use std::path::Path;

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use rill_protocol::records::{CompressionType, RecordBatch, RecordBatchBuilder};
use rill_storage::{AppendOrigin, LogConfig, PreviousShutdown, UnifiedLog};

const FILES: &[&str] = &[
    "00000000000000000000.log",
    "00000000000000000000.index",
    "00000000000000000000.timeindex",
    "00000000000000000100.log",
    "00000000000000000100.index",
    "00000000000000000100.timeindex",
    "leader-epoch-checkpoint",
    "high-watermark",
    "log-start-offset",
    ".clean_shutdown",
    "00000000000000000100.snapshot",
    "cleaner-offset-checkpoint",
    "00000000000000000000.snapshot",
];

const NOW_MS: i64 = 1_700_000_000_000;

fn config() -> LogConfig {
    LogConfig {
        segment_bytes: 1 << 20,
        // Small indexes: each open may size them to this.
        segment_index_bytes: 4096,
        index_interval_bytes: 64,
        ..LogConfig::default()
    }
}

fn read_everything(log: &UnifiedLog) {
    let (start, end) = (log.log_start_offset(), log.log_end_offset());
    assert!(start <= end, "log start {start} after log end {end}");
    assert!(log.high_watermark() >= start && log.high_watermark() <= end);
    let mut offset = start;
    // Every read makes progress or stops, so this terminates; the bound is for safety.
    for _ in 0..10_000 {
        if offset >= end {
            break;
        }
        let Ok(info) = log.read(offset, 64 * 1024, end, true) else {
            break;
        };
        if info.records.is_empty() {
            break;
        }
        let mut next = offset;
        for batch in RecordBatch::iter(info.records) {
            let Ok(batch) = batch else { break };
            assert!(
                batch.last_offset() >= offset,
                "read returned a batch before {offset}"
            );
            let _ = batch.records(1 << 20);
            next = next.max(batch.next_offset());
        }
        if next <= offset {
            break;
        }
        offset = next;
    }
    for ts in [-1, 0, NOW_MS, i64::MAX] {
        let _ = log.offset_for_timestamp(ts);
    }
    let _ = log.max_timestamp_and_offset();
    let _ = log.latest_epoch();
    let _ = log.end_offset_for_epoch(0);
}

fn write_files(dir: &Path, data: &[u8]) {
    let mut rest = data;
    while rest.len() >= 3 {
        let kind = usize::from(rest[0]) % FILES.len();
        let len = usize::from(u16::from_be_bytes([rest[1], rest[2]])).min(rest.len() - 3);
        let _ = std::fs::write(dir.join(FILES[kind]), &rest[3..3 + len]);
        rest = &rest[3 + len..];
    }
}

fuzz_target!(|data: &[u8]| {
    // On tmpfs when there is one: every open and close fsyncs, which a disk makes slow.
    let shm = Path::new("/dev/shm");
    let tmp = if shm.is_dir() {
        tempfile::tempdir_in(shm)
    } else {
        tempfile::tempdir()
    };
    let Ok(tmp) = tmp else { return };
    let dir = tmp.path().join("topic-0");
    if std::fs::create_dir(&dir).is_err() {
        return;
    }
    write_files(&dir, data);

    let Ok(mut log) = UnifiedLog::open(&dir, config(), NOW_MS, PreviousShutdown::Unclean) else {
        return;
    };
    read_everything(&log);

    // The log must still take writes and truncations after whatever recovery did.
    let mut builder = RecordBatchBuilder::new(CompressionType::None, 0);
    let _ = builder.append(NOW_MS, Some(b"k"), Some(b"v"), &[]);
    if let Ok(batch) = builder.build() {
        let before = log.log_end_offset();
        if let Ok(info) = log.append_as_leader(Bytes::from(batch), 0, AppendOrigin::Client, NOW_MS)
        {
            assert_eq!(info.first_offset, before, "append not at the log end");
        }
    }
    let end = log.log_end_offset();
    let _ = log.truncate_to(
        log.log_start_offset() + (end - log.log_start_offset()) / 2,
        NOW_MS,
    );
    read_everything(&log);
    let end = log.log_end_offset();
    if log.close().is_err() {
        return;
    }
    let again = UnifiedLog::open(&dir, config(), NOW_MS, PreviousShutdown::Clean)
        .unwrap_or_else(|e| panic!("a log closed cleanly does not reopen: {e}"));
    assert_eq!(
        again.log_end_offset(),
        end,
        "log end changed across a clean close"
    );
    read_everything(&again);
});
