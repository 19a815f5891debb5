//! A partition directory damaged on disk: bytes flipped, files cut short, garbage appended
//! or put in place of a file. Opening it must never panic; a log that opens must read back
//! consistently, take an append at its end, and open again after a clean close.
//!
//! This is the stable-toolchain companion of the `storage_open` fuzz target (fuzz/), so that
//! plain `cargo test` covers the same ground with random damage to a real log.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};

use bytes::Bytes;
use proptest::prelude::*;
use rill_protocol::records::{CompressionType, RecordBatch, RecordBatchBuilder};
use rill_storage::{AppendOrigin, LogConfig, PreviousShutdown, UnifiedLog};

const NOW_MS: i64 = 1_700_000_000_000;

fn config() -> LogConfig {
    LogConfig {
        segment_bytes: 4096,
        segment_index_bytes: 1024,
        index_interval_bytes: 128,
        ..LogConfig::default()
    }
}

fn batch(codec: CompressionType, i: i64) -> Bytes {
    let mut builder = RecordBatchBuilder::new(codec, 0).producer(7, 0, (i * 3) as i32);
    for r in 0..3 {
        let value = format!("value-{i}-{r}-").repeat(8);
        builder
            .append(NOW_MS + i, Some(b"key"), Some(value.as_bytes()), &[])
            .unwrap();
    }
    builder.build().unwrap()
}

/// A log of several segments with every codec; closed cleanly or left as after a crash.
fn make_log(dir: &Path, clean: bool) {
    let codecs = [
        CompressionType::None,
        CompressionType::Gzip,
        CompressionType::Snappy,
        CompressionType::Lz4,
        CompressionType::Zstd,
    ];
    let mut log = UnifiedLog::open(dir, config(), NOW_MS, PreviousShutdown::Unclean).unwrap();
    for i in 0..40 {
        log.append_as_leader(
            batch(codecs[i % codecs.len()], i as i64),
            0,
            AppendOrigin::Client,
            NOW_MS,
        )
        .unwrap();
    }
    log.update_high_watermark(log.log_end_offset());
    if clean {
        log.close().unwrap();
    } else {
        log.flush().unwrap();
        drop(log);
    }
}

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .collect();
    out.sort();
    out
}

#[derive(Debug, Clone)]
enum Damage {
    Flip { at: prop::sample::Index, xor: u8 },
    Truncate(prop::sample::Index),
    AppendGarbage(Vec<u8>),
    Replace(Vec<u8>),
}

fn damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        4 => (any::<prop::sample::Index>(), 1u8..).prop_map(|(at, xor)| Damage::Flip { at, xor }),
        2 => any::<prop::sample::Index>().prop_map(Damage::Truncate),
        1 => proptest::collection::vec(any::<u8>(), 1..200).prop_map(Damage::AppendGarbage),
        1 => proptest::collection::vec(any::<u8>(), 0..200).prop_map(Damage::Replace),
    ]
}

fn apply(path: &Path, damage: &Damage) {
    let mut bytes = std::fs::read(path).unwrap();
    match damage {
        Damage::Flip { at, xor } => {
            if !bytes.is_empty() {
                let i = at.index(bytes.len());
                bytes[i] ^= xor;
            }
        }
        Damage::Truncate(at) => bytes.truncate(at.index(bytes.len() + 1)),
        Damage::AppendGarbage(g) => bytes.extend_from_slice(g),
        Damage::Replace(g) => bytes = g.clone(),
    }
    std::fs::write(path, bytes).unwrap();
}

/// Reads the whole log and checks what reads may return.
fn read_everything(log: &UnifiedLog) {
    let (start, end) = (log.log_start_offset(), log.log_end_offset());
    assert!(start <= end);
    assert!((start..=end).contains(&log.high_watermark()));
    let mut offset = start;
    for _ in 0..10_000 {
        if offset >= end {
            break;
        }
        let Ok(info) = log.read(offset, 1 << 16, end, true) else {
            break;
        };
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
    for ts in [-1, 0, NOW_MS + 5, i64::MAX] {
        let _ = log.offset_for_timestamp(ts);
    }
}

fn check_open(dir: &Path) {
    let Ok(mut log) = UnifiedLog::open(dir, config(), NOW_MS, PreviousShutdown::Unclean) else {
        return;
    };
    read_everything(&log);
    let end = log.log_end_offset();
    let appended = log.append_as_leader(
        batch(CompressionType::None, 99),
        0,
        AppendOrigin::Client,
        NOW_MS,
    );
    if let Ok(info) = appended {
        assert_eq!(info.first_offset, end, "append not at the log end");
    }
    let end = log.log_end_offset();
    if log.close().is_err() {
        return;
    }
    let again = UnifiedLog::open(dir, config(), NOW_MS, PreviousShutdown::Clean)
        .unwrap_or_else(|e| panic!("a log closed cleanly does not reopen: {e}"));
    assert_eq!(
        again.log_end_offset(),
        end,
        "log end changed across a clean close"
    );
    read_everything(&again);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn damaged_partition_directories_never_panic(
        clean in any::<bool>(),
        damages in proptest::collection::vec(
            (any::<prop::sample::Index>(), damage()), 1..4),
    ) {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("topic-0");
        make_log(&dir, clean);
        let all = files(&dir);
        for (which, d) in &damages {
            apply(&all[which.index(all.len())], d);
        }
        check_open(&dir);
    }
}

#[test]
fn every_file_replaced_by_garbage_never_panics() {
    for clean in [false, true] {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("topic-0");
        make_log(&dir, clean);
        for (i, path) in files(&dir).iter().enumerate() {
            let garbage: Vec<u8> = (0..64u32).map(|b| (b * 31 + i as u32) as u8).collect();
            std::fs::write(path, garbage).unwrap();
        }
        check_open(&dir);
    }
}
