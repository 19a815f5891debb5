//! Tests of the log cleaner with a fake clock: latest value per key at its original
//! offset, tombstones and `delete.retention.ms`, every codec, the dirty ratio and lags,
//! producer state, and a crash injected at every step of the segment swap.

use std::collections::BTreeMap;
use std::path::Path;

use bytes::Bytes;
use rill_protocol::records::{CompressionType, RecordBatch, RecordBatchBuilder};

use super::*;
use crate::records::validate_stored;
use crate::{AppendOrigin, CleanupPolicy, LogConfig, PreviousShutdown, UnifiedLog};

const T0: i64 = 1_700_000_000_000;
const DAY: i64 = 24 * 3_600_000;
const CODECS: [CompressionType; 5] = [
    CompressionType::None,
    CompressionType::Gzip,
    CompressionType::Snappy,
    CompressionType::Lz4,
    CompressionType::Zstd,
];

/// (offset, key, value) of a record read back.
type Rec = (i64, Option<Vec<u8>>, Option<Vec<u8>>);

fn config() -> LogConfig {
    LogConfig {
        segment_bytes: 2048,
        index_interval_bytes: 256,
        cleanup_policy: CleanupPolicy::Compact,
        min_cleanable_dirty_ratio: 0.0,
        ..LogConfig::default()
    }
}

fn key(k: usize) -> Vec<u8> {
    format!("key-{k:04}").into_bytes()
}

/// One batch of `(key, value)` records stamped `ts`.
fn batch(codec: CompressionType, records: &[(Vec<u8>, Option<Vec<u8>>)], ts: i64) -> Bytes {
    let mut b = RecordBatchBuilder::new(codec, 0);
    for (k, v) in records {
        b.append(ts, Some(k), v.as_deref(), &[]).unwrap();
    }
    b.build().unwrap()
}

/// Appends `n` batches of 5 records over `keys` keys; every 7th record is a tombstone.
/// Returns every record written, by offset.
fn fill(log: &mut UnifiedLog, codec: CompressionType, n: usize, keys: usize) -> Vec<Rec> {
    let mut written = Vec::new();
    let mut i = 0usize;
    for _ in 0..n {
        let records: Vec<_> = (0..5)
            .map(|_| {
                i += 1;
                let v = (!i.is_multiple_of(7))
                    .then(|| format!("value-{i}-{}", "x".repeat(i % 13)).into_bytes());
                (key((i * 31) % keys), v)
            })
            .collect();
        let info = log
            .append_as_leader(batch(codec, &records, T0), 0, AppendOrigin::Client, T0)
            .unwrap();
        for (j, (k, v)) in records.into_iter().enumerate() {
            written.push((info.first_offset + j as i64, Some(k), v));
        }
    }
    let end = log.log_end_offset();
    log.update_high_watermark(end);
    written
}

/// Every record from the log start on, checking each batch as a stored batch.
fn read_records(log: &UnifiedLog) -> Vec<Rec> {
    read_batches(log)
        .iter()
        .flat_map(|b| b.records(1 << 24).unwrap())
        .map(|r| {
            (
                r.offset,
                r.key.map(|k| k.to_vec()),
                r.value.map(|v| v.to_vec()),
            )
        })
        .collect()
}

fn read_batches(log: &UnifiedLog) -> Vec<RecordBatch> {
    let mut out = Vec::new();
    let mut next = log.log_start_offset();
    while next < log.log_end_offset() {
        let info = log.read(next, 1 << 16, i64::MAX, true).unwrap();
        let mut rest = info.records.clone();
        assert!(!rest.is_empty(), "no progress at {next}");
        while !rest.is_empty() {
            let b = RecordBatch::split_from(&mut rest).unwrap();
            validate_stored(&b).unwrap();
            assert!(b.base_offset() >= next, "offsets increase");
            next = b.next_offset();
            out.push(b);
        }
    }
    out
}

/// What compaction of `written` below `end` must leave: the latest record of each key
/// (tombstones too, unless `drop_tombstones`), then everything from `end` on.
fn expected(written: &[Rec], end: i64, drop_tombstones: bool) -> Vec<Rec> {
    let mut latest: BTreeMap<&Option<Vec<u8>>, i64> = BTreeMap::new();
    for (o, k, _) in written.iter().filter(|r| r.0 < end) {
        latest.insert(k, *o);
    }
    written
        .iter()
        .filter(|(o, k, v)| {
            *o >= end || (latest.get(k) == Some(o) && (v.is_some() || !drop_tombstones))
        })
        .cloned()
        .collect()
}

/// Rolls the active segment by time so that everything is cleanable.
fn roll(log: &mut UnifiedLog, now: i64) {
    assert!(log.maybe_roll(now).unwrap());
}

#[test]
fn compaction_keeps_the_latest_value_per_key_at_its_offset_with_every_codec() {
    for codec in CODECS {
        let dir = tempfile::tempdir().unwrap();
        let mut log =
            UnifiedLog::open(dir.path(), config(), T0, PreviousShutdown::Unclean).unwrap();
        let written = fill(&mut log, codec, 80, 25);
        let now = T0 + 8 * DAY;
        roll(&mut log, now);
        let end = log.log_end_offset();
        assert!(log.segment_count() > 4, "{codec:?}");
        assert!(log.needs_cleaning(now));
        assert!(log.dirty_ratio(now) > 0.99);

        let stats = log.clean(now, &CleanerConfig::default()).unwrap().unwrap();
        assert_eq!(stats.end_offset, end, "{codec:?}");
        assert_eq!(stats.records_read, written.len() as u64);
        assert_eq!(stats.map_keys, 25);
        assert!(stats.bytes_written < stats.bytes_read);
        assert_eq!(log.dirty_ratio(now), 0.0);
        assert!(!log.needs_cleaning(now));
        // First pass: tombstones stay.
        let after = read_records(&log);
        assert_eq!(after, expected(&written, end, false), "{codec:?}");
        assert!(
            after.iter().any(|r| r.2.is_none()),
            "some latest values are tombstones"
        );
        // Rewritten batches keep their codec and carry a delete horizon when they hold a
        // tombstone.
        for b in read_batches(&log) {
            assert_eq!(b.compression().unwrap(), codec);
            let records = b.records(1 << 24).unwrap();
            if records.iter().any(|r| r.value.is_none()) {
                assert!(b.has_delete_horizon());
                assert_eq!(b.base_timestamp(), now + config().delete_retention_ms);
            }
        }

        // Before delete.retention.ms has passed, nothing more to do.
        let early = now + config().delete_retention_ms - 1;
        assert!(!log.needs_cleaning(early));
        assert!(log
            .clean(early, &CleanerConfig::default())
            .unwrap()
            .is_none());
        assert_eq!(read_records(&log), after);

        // Once it has, the next clean removes the tombstones.
        let late = now + config().delete_retention_ms;
        assert!(log.needs_cleaning(late));
        let stats = log.clean(late, &CleanerConfig::default()).unwrap().unwrap();
        assert!(stats.tombstones_removed > 0);
        let done = read_records(&log);
        assert_eq!(done, expected(&written, end, true), "{codec:?}");
        assert!(!log.needs_cleaning(late + DAY));

        // The compacted log survives a restart that rebuilds every index (recovery
        // accepts compacted batches), and replicates to a follower as it is.
        drop(log);
        for entry in std::fs::read_dir(dir.path()).unwrap() {
            let p = entry.unwrap().path();
            if p.extension()
                .is_some_and(|e| e == "index" || e == "timeindex")
            {
                std::fs::remove_file(p).unwrap();
            }
        }
        let mut log =
            UnifiedLog::open(dir.path(), config(), T0, PreviousShutdown::Unclean).unwrap();
        log.update_high_watermark(i64::MAX);
        assert_eq!(read_records(&log), done);
        let fdir = tempfile::tempdir().unwrap();
        let mut follower =
            UnifiedLog::open(fdir.path(), config(), T0, PreviousShutdown::Unclean).unwrap();
        for b in read_batches(&log) {
            follower.append_as_follower(b.into_bytes(), T0).unwrap();
        }
        follower.update_high_watermark(i64::MAX);
        assert_eq!(read_records(&follower), done);
        // Appends continue after the cleaned segments.
        fill(&mut log, codec, 1, 25);
    }
}

#[test]
fn tombstones_in_the_active_or_uncleanable_part_stay() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = UnifiedLog::open(
        dir.path(),
        LogConfig {
            min_compaction_lag_ms: DAY,
            ..config()
        },
        T0,
        PreviousShutdown::Unclean,
    )
    .unwrap();
    let written = fill(&mut log, CompressionType::None, 40, 10);
    let now = T0 + 8 * DAY;
    roll(&mut log, now);
    // Stamped T0, older than the lag at `now`: cleanable.
    let end = log.log_end_offset();
    let newer: Vec<_> = (0..10).map(|k| (key(k), Some(b"new".to_vec()))).collect();
    log.append_as_leader(
        batch(CompressionType::None, &newer, now),
        0,
        AppendOrigin::Client,
        now,
    )
    .unwrap();
    let e = log.log_end_offset();
    log.update_high_watermark(e);
    roll(&mut log, now + 8 * DAY);
    // The newest segment is within min.compaction.lag.ms at `now`: not cleaned, and
    // its records do not supersede older ones yet.
    let stats = log.clean(now, &CleanerConfig::default()).unwrap().unwrap();
    assert_eq!(stats.end_offset, end);
    let mut want = expected(&written, end, false);
    want.extend((0..10).map(|k| (end + k as i64, Some(key(k)), Some(b"new".to_vec()))));
    assert_eq!(read_records(&log), want);
}

#[test]
fn dirty_ratio_and_compaction_lags_decide_when_to_clean() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = UnifiedLog::open(
        dir.path(),
        LogConfig {
            min_cleanable_dirty_ratio: 0.5,
            ..config()
        },
        T0,
        PreviousShutdown::Unclean,
    )
    .unwrap();
    // Not compacted: never.
    let mut cfg = config();
    cfg.cleanup_policy = CleanupPolicy::Delete;
    log.update_config(cfg).unwrap();
    fill(&mut log, CompressionType::None, 40, 200);
    let now = T0 + 8 * DAY;
    roll(&mut log, now);
    assert!(!log.needs_cleaning(now));
    assert!(log.prepare_clean(now, &CleanerConfig::default()).is_none());

    log.update_config(LogConfig {
        min_cleanable_dirty_ratio: 0.5,
        ..config()
    })
    .unwrap();
    assert!(log.needs_cleaning(now));
    // One clean at a time.
    let task = log.prepare_clean(now, &CleanerConfig::default()).unwrap();
    assert!(!log.needs_cleaning(now));
    assert!(log.prepare_clean(now, &CleanerConfig::default()).is_none());
    let cleaned = task.run().unwrap();
    log.apply_clean(cleaned).unwrap().unwrap();
    let clean_bytes = log.size_bytes() - log.active_segment().unwrap().size();

    // A little dirt: below the ratio.
    fill(&mut log, CompressionType::None, 3, 200);
    // Before the tombstones' delete horizon (now + 1 day), which would also trigger.
    let t = now + DAY / 2;
    roll(&mut log, t);
    let ratio = log.dirty_ratio(t);
    assert!(ratio > 0.0 && ratio < 0.5, "{ratio}");
    let dirty = log.size_bytes() - clean_bytes;
    assert!((ratio - dirty as f64 / log.size_bytes() as f64).abs() < 1e-9);
    assert!(!log.needs_cleaning(t));
    // max.compaction.lag.ms forces it once the dirty records are old enough (their
    // timestamps are T0).
    log.update_config(LogConfig {
        min_cleanable_dirty_ratio: 0.5,
        max_compaction_lag_ms: t - T0 + 1,
        ..config()
    })
    .unwrap();
    assert!(!log.needs_cleaning(t));
    log.update_config(LogConfig {
        min_cleanable_dirty_ratio: 0.5,
        max_compaction_lag_ms: t - T0 - 1,
        ..config()
    })
    .unwrap();
    assert!(log.needs_cleaning(t));
    // min.compaction.lag.ms holds back segments with newer timestamps.
    log.update_config(LogConfig {
        min_compaction_lag_ms: t - T0 + 1,
        ..config()
    })
    .unwrap();
    assert_eq!(log.dirty_ratio(t), 0.0);
    assert!(!log.needs_cleaning(t));
}

#[test]
fn producer_state_transactions_and_control_batches_survive_cleaning() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = UnifiedLog::open(dir.path(), config(), T0, PreviousShutdown::Unclean).unwrap();
    // Producer 7 writes key-0 twice; its last batch's record is later superseded by a
    // non-idempotent write, so that batch is emptied but kept.
    for seq in 0..2 {
        let mut b = RecordBatchBuilder::new(CompressionType::Lz4, 0).producer(7, 3, seq);
        b.append(T0, Some(&key(0)), Some(b"p"), &[]).unwrap();
        log.append_as_leader(b.build().unwrap(), 0, AppendOrigin::Client, T0)
            .unwrap();
    }
    // A transactional batch and a commit marker: untouched, even though key-1 is
    // written again later.
    let mut tx = RecordBatchBuilder::new(CompressionType::None, 0)
        .producer(8, 0, 0)
        .transactional(true);
    tx.append(T0, Some(&key(1)), Some(b"tx"), &[]).unwrap();
    let tx_info = log
        .append_as_leader(tx.build().unwrap(), 0, AppendOrigin::Client, T0)
        .unwrap();
    let mut marker = RecordBatchBuilder::new(CompressionType::None, 0)
        .producer(8, 0, -1)
        .transactional(true)
        .control(true);
    marker
        .append(
            T0,
            Some(&rill_protocol::records::ControlRecordType::Commit.key()),
            Some(&rill_protocol::records::end_txn_marker_value(0)),
            &[],
        )
        .unwrap();
    log.append_as_leader(marker.build().unwrap(), 0, AppendOrigin::Coordinator, T0)
        .unwrap();
    let later = vec![
        (key(0), Some(b"later".to_vec())),
        (key(1), Some(b"later".to_vec())),
    ];
    log.append_as_leader(
        batch(CompressionType::None, &later, T0),
        0,
        AppendOrigin::Client,
        T0,
    )
    .unwrap();
    let e = log.log_end_offset();
    log.update_high_watermark(e);
    let now = T0 + 8 * DAY;
    roll(&mut log, now);
    log.clean(now, &CleanerConfig::default()).unwrap().unwrap();

    let batches = read_batches(&log);
    // The first batch of producer 7 is gone, its last one is kept empty with its
    // offsets and sequence.
    let empty = &batches[0];
    assert_eq!((empty.base_offset(), empty.record_count()), (1, 0));
    assert_eq!((empty.producer_id(), empty.base_sequence()), (7, 1));
    assert_eq!(batches[1].base_offset(), tx_info.first_offset);
    assert!(batches[1].is_transactional());
    assert!(batches[2].is_control());
    assert_eq!(batches.len(), 4);

    // After an unclean restart (state rebuilt from the log), a retry of producer 7's
    // last batch is still recognised as a duplicate.
    drop(log);
    let mut log = UnifiedLog::open(dir.path(), config(), T0, PreviousShutdown::Unclean).unwrap();
    assert_eq!(log.producer_state(7).unwrap().last_seq(), 1);
    let mut retry = RecordBatchBuilder::new(CompressionType::Lz4, 0).producer(7, 3, 1);
    retry.append(T0, Some(&key(0)), Some(b"p"), &[]).unwrap();
    let info = log
        .append_as_leader(retry.build().unwrap(), 0, AppendOrigin::Client, now)
        .unwrap();
    assert!(info.duplicate);
    assert_eq!(info.first_offset, 1);
}

#[test]
fn a_clean_overtaken_by_retention_or_truncation_is_discarded() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = UnifiedLog::open(
        dir.path(),
        LogConfig {
            cleanup_policy: CleanupPolicy::CompactDelete,
            retention_ms: DAY,
            ..config()
        },
        T0,
        PreviousShutdown::Unclean,
    )
    .unwrap();
    fill(&mut log, CompressionType::Snappy, 40, 10);
    let now = T0 + 8 * DAY;
    roll(&mut log, now);
    let task = log.prepare_clean(now, &CleanerConfig::default()).unwrap();
    let cleaned = task.run().unwrap();
    assert!(leftovers(dir.path()) > 0, "the task wrote .cleaned files");
    // Retention runs meanwhile (it is quick and takes the lock between the steps).
    let r = log.delete_records_before(5).unwrap();
    assert_eq!(r.log_start_offset, 5);
    let deleted = log.delete_old_segments(T0).unwrap();
    assert_eq!(deleted.deleted_segments, 0);
    // Nothing removed, DeleteRecords only moved the log start: the clean still applies.
    assert!(log.apply_clean(cleaned).unwrap().is_some());
    assert_eq!(log.log_start_offset(), 5);

    fill(&mut log, CompressionType::Snappy, 40, 10);
    roll(&mut log, now + DAY);
    let task = log
        .prepare_clean(now + DAY, &CleanerConfig::default())
        .unwrap();
    let cleaned = task.run().unwrap();
    let r = log.delete_old_segments(now + 10 * DAY).unwrap();
    assert!(r.deleted_segments > 0);
    let snapshot = read_records(&log);
    assert!(log.apply_clean(cleaned).unwrap().is_none());
    assert_eq!(leftovers(dir.path()), 0);
    assert_eq!(read_records(&log), snapshot);
    // And the next clean may go ahead.
    assert!(!log.clean_in_progress);
    fill(&mut log, CompressionType::Snappy, 40, 10);
    roll(&mut log, now + 20 * DAY);
    assert!(log
        .prepare_clean(now + 20 * DAY, &CleanerConfig::default())
        .is_some());
}

/// Files a clean leaves behind when interrupted.
fn leftovers(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .filter(|e| {
            let n = e
                .as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .into_owned();
            n.ends_with(".cleaned") || n.ends_with(".swap") || n == CLEANER_SWAP_FILE
        })
        .count()
}

fn copy_dir(from: &Path, to: &Path) {
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

#[test]
fn a_crash_at_any_step_of_the_swap_leaves_the_old_or_the_new_log() {
    // The original: many small segments, heavily superseded, so that cleaned segments
    // merge several sources (some old segments are deleted, others replaced).
    let origin = tempfile::tempdir().unwrap();
    let now = T0 + 8 * DAY;
    let (old_records, written, end) = {
        let mut log =
            UnifiedLog::open(origin.path(), config(), T0, PreviousShutdown::Unclean).unwrap();
        let written = fill(&mut log, CompressionType::Zstd, 120, 8);
        roll(&mut log, now);
        let end = log.log_end_offset();
        let recs = read_records(&log);
        log.checkpoint_high_watermark().unwrap();
        log.close().unwrap();
        (recs, written, end)
    };
    let new_records = expected(&written, end, false);
    assert_ne!(old_records, new_records);

    let mut saw_old = false;
    let mut saw_new = false;
    for crash_after in 0.. {
        let dir = tempfile::tempdir().unwrap();
        copy_dir(origin.path(), dir.path());
        let mut log = UnifiedLog::open(dir.path(), config(), T0, PreviousShutdown::Clean).unwrap();
        let task = log.prepare_clean(now, &CleanerConfig::default()).unwrap();
        let cleaned = task.run().unwrap();
        assert!(cleaned.old_bases.len() > cleaned.new_bases.len());
        let mut steps = 0;
        let result = log.apply_clean_with(cleaned, &mut || {
            steps += 1;
            if steps > crash_after {
                Err(StorageError::Corrupt {
                    path: dir.path().to_owned(),
                    reason: "injected crash".into(),
                })
            } else {
                Ok(())
            }
        });
        let finished = result.is_ok();
        // The process dies: no close, the next open recovers.
        drop(log);
        let mut log =
            UnifiedLog::open(dir.path(), config(), T0, PreviousShutdown::Unclean).unwrap();
        assert_eq!(leftovers(dir.path()), 0, "crash after {crash_after}");
        let got = read_records(&log);
        if got == old_records {
            saw_old = true;
        } else {
            assert_eq!(
                got, new_records,
                "a mixture after a crash at step {crash_after}"
            );
            saw_new = true;
        }
        // The log takes appends again.
        fill(&mut log, CompressionType::Zstd, 1, 8);
        if finished {
            assert!(crash_after > 10);
            break;
        }
    }
    assert!(saw_old && saw_new);
}

#[test]
fn io_bound_slows_a_clean_down_to_the_configured_rate() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = LogConfig {
        segment_bytes: 64 * 1024,
        index_interval_bytes: 4096,
        ..config()
    };
    let mut log = UnifiedLog::open(dir.path(), cfg, T0, PreviousShutdown::Unclean).unwrap();
    let value = vec![b'v'; 1000];
    // 2,000 records of 1 KB over 100 keys: about 2 MB read, 0.1 MB written.
    for b in 0..400 {
        let records: Vec<_> = (0..5)
            .map(|r| (key((b * 5 + r) % 100), Some(value.clone())))
            .collect();
        log.append_as_leader(
            batch(CompressionType::None, &records, T0),
            0,
            AppendOrigin::Client,
            T0,
        )
        .unwrap();
    }
    let end = log.log_end_offset();
    log.update_high_watermark(end);
    let now = T0 + 8 * DAY;
    roll(&mut log, now);

    let rate = 2e6;
    let bounded = CleanerConfig {
        io_max_bytes_per_second: rate,
        ..CleanerConfig::default()
    };
    let started = std::time::Instant::now();
    let stats = log.clean(now, &bounded).unwrap().unwrap();
    let elapsed = started.elapsed().as_secs_f64();
    assert_eq!(stats.records_retained, 100);
    // Only the last, unfinished interval's allowance may go unthrottled.
    let io = (stats.bytes_read + stats.bytes_written) as f64;
    let allowance = rate * throttle::CHECK_INTERVAL.as_secs_f64();
    let floor = (io - allowance) / rate;
    assert!(
        io > 2.0 * allowance,
        "the clean must be longer than the allowance: {io}"
    );
    assert!(
        elapsed >= floor,
        "{io} bytes at {rate} B/s took {elapsed:.3} s, under {floor:.3} s"
    );
    assert!(stats.throttled.as_secs_f64() > 0.0);
    assert_eq!(read_records(&log).len(), 100);
}

/// The cleaner's throughput on 100k records over 1,000 keys. Run with
/// `cargo test -p rill-storage --release -- --ignored --nocapture cleaner_throughput`.
#[test]
#[ignore = "benchmark: run in release mode"]
fn cleaner_throughput() {
    for codec in [
        CompressionType::None,
        CompressionType::Lz4,
        CompressionType::Zstd,
    ] {
        let dir = tempfile::tempdir().unwrap();
        let cfg = LogConfig {
            segment_bytes: 1 << 20,
            index_interval_bytes: 4096,
            ..config()
        };
        let mut log = UnifiedLog::open(dir.path(), cfg, T0, PreviousShutdown::Unclean).unwrap();
        let value = vec![b'v'; 100];
        for b in 0..1000 {
            let mut builder = RecordBatchBuilder::new(codec, 0);
            for r in 0..100 {
                let k = key((b * 100 + r) % 1000);
                builder.append(T0, Some(&k), Some(&value), &[]).unwrap();
            }
            log.append_as_leader(builder.build().unwrap(), 0, AppendOrigin::Client, T0)
                .unwrap();
        }
        let e = log.log_end_offset();
        log.update_high_watermark(e);
        let now = T0 + 8 * DAY;
        roll(&mut log, now);
        let start = std::time::Instant::now();
        let stats = log.clean(now, &CleanerConfig::default()).unwrap().unwrap();
        let secs = start.elapsed().as_secs_f64();
        assert_eq!(stats.records_retained, 1000);
        println!(
            "{codec:?}: {} records, {:.1} MB in, {:.2} MB out, {:.3} s, {:.1} MB/s",
            stats.records_read,
            stats.bytes_read as f64 / 1e6,
            stats.bytes_written as f64 / 1e6,
            secs,
            stats.bytes_read as f64 / 1e6 / secs
        );
    }
}
