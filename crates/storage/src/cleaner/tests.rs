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
    // A committed transaction's batch and its marker: the batch's record is superseded
    // by a later write of key-1, but the batch is producer 8's latest, so it is kept
    // empty (transactional still), and its marker with it.
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
    assert_eq!(
        (batches[1].record_count(), batches[1].producer_id()),
        (0, 8)
    );
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

/// A transactional batch of `(key, value)` records from producer `pid`.
fn txn_data(log: &mut UnifiedLog, pid: i64, seq: i32, records: &[(usize, &str)]) -> i64 {
    let mut b = RecordBatchBuilder::new(CompressionType::None, 0)
        .producer(pid, 0, seq)
        .transactional(true);
    for (k, v) in records {
        b.append(T0, Some(&key(*k)), Some(v.as_bytes()), &[])
            .unwrap();
    }
    log.append_as_leader(b.build().unwrap(), 0, AppendOrigin::Client, T0)
        .unwrap()
        .first_offset
}

/// Producer `pid`'s COMMIT or ABORT marker; returns its offset.
fn txn_marker(log: &mut UnifiedLog, pid: i64, commit: bool) -> i64 {
    let marker = crate::end_txn_marker_batch(pid, 0, 1, commit, T0).unwrap();
    let offset = log
        .append_as_leader(marker, 0, AppendOrigin::Coordinator, T0)
        .unwrap()
        .first_offset;
    let end = log.log_end_offset();
    log.update_high_watermark(end);
    offset
}

fn plain(log: &mut UnifiedLog, records: &[(usize, &str)]) {
    let records: Vec<_> = records
        .iter()
        .map(|(k, v)| (key(*k), Some(v.as_bytes().to_vec())))
        .collect();
    log.append_as_leader(
        batch(CompressionType::None, &records, T0),
        0,
        AppendOrigin::Client,
        T0,
    )
    .unwrap();
    let end = log.log_end_offset();
    log.update_high_watermark(end);
}

fn control_offsets(log: &UnifiedLog) -> Vec<i64> {
    read_batches(log)
        .iter()
        .filter(|b| b.is_control())
        .map(RecordBatch::base_offset)
        .collect()
}

#[test]
fn aborted_records_go_and_markers_follow_their_transactions_after_the_delete_horizon() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = UnifiedLog::open(dir.path(), config(), T0, PreviousShutdown::Unclean).unwrap();
    // Producer 1 aborts a write of key-0 then commits key-5; producer 2 commits key-1
    // (later overwritten) then key-6.
    let aborted = txn_data(&mut log, 1, 0, &[(0, "aborted")]);
    let abort_marker = txn_marker(&mut log, 1, false);
    let first_commit = {
        txn_data(&mut log, 2, 0, &[(1, "committed, then overwritten")]);
        txn_marker(&mut log, 2, true)
    };
    plain(&mut log, &[(1, "later"), (2, "plain")]);
    let kept_1 = txn_data(&mut log, 1, 1, &[(5, "kept")]);
    let commit_1 = txn_marker(&mut log, 1, true);
    let kept_2 = txn_data(&mut log, 2, 1, &[(6, "kept")]);
    let commit_2 = txn_marker(&mut log, 2, true);
    assert_eq!(log.aborted_txns().len(), 1);
    let retention = log.config().delete_retention_ms;

    // First clean: the aborted record and the overwritten committed one go; both
    // markers stay, since this clean read a batch of each of their transactions.
    // Segments roll by age (segment.ms, 7 days, from T0).
    let mut now = T0 + 8 * DAY;
    roll(&mut log, now);
    let stats = log.clean(now, &CleanerConfig::default()).unwrap().unwrap();
    assert_eq!(stats.aborted_removed, 1);
    assert_eq!(stats.markers_removed, 0);
    let values: Vec<_> = read_records(&log)
        .into_iter()
        .filter_map(|(o, _, v)| v.map(|v| (o, String::from_utf8(v).unwrap())))
        .collect();
    assert!(values.iter().all(|(o, _)| *o != aborted), "{values:?}");
    assert!(values.iter().any(|(o, _)| *o == kept_1) && values.iter().any(|(o, _)| *o == kept_2));
    assert!(!values
        .iter()
        .any(|(_, v)| v == "committed, then overwritten"));
    assert_eq!(
        control_offsets(&log),
        vec![abort_marker, first_commit, commit_1, commit_2]
    );
    assert_eq!(log.aborted_txns().len(), 1, "its marker is still there");

    // Second clean: nothing of the two first transactions is left, so their markers get
    // a delete horizon and stay readable until then.
    plain(&mut log, &[(9, "dirty again")]);
    now += 3_600_000;
    roll(&mut log, now);
    let stats = log.clean(now, &CleanerConfig::default()).unwrap().unwrap();
    assert_eq!(stats.markers_removed, 0);
    assert_eq!(control_offsets(&log).len(), 4);
    let horizons: Vec<_> = read_batches(&log)
        .iter()
        .filter(|b| b.is_control() && b.has_delete_horizon())
        .map(|b| (b.base_offset(), b.base_timestamp()))
        .collect();
    assert_eq!(
        horizons,
        vec![
            (abort_marker, now + retention),
            (first_commit, now + retention)
        ]
    );
    assert!(!log.needs_cleaning(now + retention - 1));
    assert!(
        log.needs_cleaning(now + retention),
        "the horizon calls for a clean"
    );

    // After the horizon they go, the ABORT marker with its index entry; the markers of
    // the transactions whose records are still there stay.
    now += retention;
    let stats = log.clean(now, &CleanerConfig::default()).unwrap().unwrap();
    assert_eq!(stats.markers_removed, 2);
    assert_eq!(control_offsets(&log), vec![commit_1, commit_2]);
    assert!(log.aborted_txns().is_empty());
    assert!(log.collect_aborted_txns(0, log.log_end_offset()).is_empty());
    assert!(
        !log.needs_cleaning(now + 10 * retention),
        "nothing left to clean"
    );

    // A rebuild from the log finds the same transaction state.
    let state = |log: &UnifiedLog| {
        (
            log.last_stable_offset(),
            log.aborted_txns().to_vec(),
            log.producer_state(1).map(|p| p.last_seq()),
            log.producer_state(2).map(|p| p.last_seq()),
        )
    };
    let before = state(&log);
    drop(log);
    let mut log = UnifiedLog::open(dir.path(), config(), now, PreviousShutdown::Unclean).unwrap();
    // The high watermark was never checkpointed here; the LSO is bounded by it.
    let end = log.log_end_offset();
    log.update_high_watermark(end);
    assert_eq!(state(&log), before);
    assert_eq!(before.2, Some(1));
}

#[test]
fn an_open_transaction_holds_the_clean_below_its_first_offset() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = UnifiedLog::open(dir.path(), config(), T0, PreviousShutdown::Unclean).unwrap();
    let now = T0 + 8 * DAY;
    plain(&mut log, &[(0, "v1")]);
    roll(&mut log, now);
    let open = txn_data(&mut log, 3, 0, &[(0, "in the open transaction")]);
    roll(&mut log, now);
    plain(&mut log, &[(0, "v2")]);
    roll(&mut log, now);
    assert_eq!(log.last_stable_offset(), open);

    // Only the segment below the LSO is cleanable: v1 stays, v2 is out of reach.
    log.clean(now, &CleanerConfig::default()).unwrap().unwrap();
    let values = |log: &UnifiedLog| -> Vec<String> {
        read_batches(log)
            .iter()
            .filter(|b| !b.is_control())
            .flat_map(|b| b.records(1 << 20).unwrap())
            .filter_map(|r| r.value.map(|v| String::from_utf8(v.to_vec()).unwrap()))
            .collect()
    };
    assert_eq!(values(&log), ["v1", "in the open transaction", "v2"]);

    // Committed: everything is cleanable, key-0's latest value is v2; the transaction's
    // batch is its producer's latest, so it stays, empty, and so does its marker.
    let marker = txn_marker(&mut log, 3, true);
    roll(&mut log, now);
    log.clean(now, &CleanerConfig::default()).unwrap().unwrap();
    assert_eq!(values(&log), ["v2"]);
    let batches = read_batches(&log);
    let txn = batches.iter().find(|b| b.base_offset() == open).unwrap();
    assert!(txn.is_transactional() && txn.record_count() == 0);
    assert_eq!(control_offsets(&log), vec![marker]);
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

/// A step hook for `apply_clean_with` that fails (an injected crash) after `n` steps.
fn crash_after_steps(n: usize, dir: &Path) -> impl FnMut() -> Result<(), StorageError> {
    let dir = dir.to_owned();
    let mut steps = 0;
    move || {
        steps += 1;
        if steps > n {
            Err(StorageError::Corrupt {
                path: dir.clone(),
                reason: "injected crash".into(),
            })
        } else {
            Ok(())
        }
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
        let result = log.apply_clean_with(cleaned, &mut crash_after_steps(crash_after, dir.path()));
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

/// The aborted transactions a log reads from its markers alone: a copy of `dir` without
/// producer snapshots or `.txnindex` files, opened after a crash.
fn aborted_from_the_markers(dir: &Path) -> Vec<(i64, i64, i64)> {
    let copy = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let ext = path.extension().map(|e| e.to_string_lossy().into_owned());
        if path.is_file() && !matches!(ext.as_deref(), Some("snapshot" | "txnindex")) {
            std::fs::copy(&path, copy.path().join(path.file_name().unwrap())).unwrap();
        }
    }
    let log = UnifiedLog::open(copy.path(), config(), T0, PreviousShutdown::Unclean).unwrap();
    log.aborted_txns()
        .iter()
        .map(|t| (t.producer_id, t.first_offset, t.last_offset))
        .collect()
}

/// A recovery that starts from a roll's producer snapshot trusts the `.txnindex` files
/// below it; a crash after the cleaner swapped segments and before it rewrote their
/// indexes must not leave it trusting files that no longer match the segments.
#[test]
fn a_crash_between_the_swap_and_the_index_rewrite_reads_the_markers_again() {
    let origin = tempfile::tempdir().unwrap();
    let now = T0 + 8 * DAY;
    {
        let mut log =
            UnifiedLog::open(origin.path(), config(), T0, PreviousShutdown::Unclean).unwrap();
        // Aborted transactions spread over segments that the clean merges, each after
        // records that later ones supersede.
        for (round, pid) in (0..6).zip(10..) {
            fill(&mut log, CompressionType::None, 12, 6);
            txn_data(&mut log, pid, 0, &[(round, "aborted")]);
            fill(&mut log, CompressionType::None, 6, 6);
            txn_marker(&mut log, pid, false);
        }
        let end = log.log_end_offset();
        log.update_high_watermark(end);
        roll(&mut log, now);
        log.checkpoint_high_watermark().unwrap();
        // Killed, so that the roll's snapshot, above everything the clean reads, is
        // what each copy's recovery starts from.
        assert_eq!(
            ProducerStateManager::snapshot_offsets(origin.path())
                .unwrap()
                .last(),
            Some(&log.log_end_offset())
        );
    }
    let mut finished = false;
    for crash_after in 0.. {
        let dir = tempfile::tempdir().unwrap();
        copy_dir(origin.path(), dir.path());
        let mut log =
            UnifiedLog::open(dir.path(), config(), T0, PreviousShutdown::Unclean).unwrap();
        assert_eq!(log.aborted_txns().len(), 6);
        let task = log.prepare_clean(now, &CleanerConfig::default()).unwrap();
        let cleaned = task.run().unwrap();
        assert!(cleaned.old_bases.len() > cleaned.new_bases.len());
        let result = log.apply_clean_with(cleaned, &mut crash_after_steps(crash_after, dir.path()));
        finished = result.is_ok();
        drop(log); // kill -9
        let log = UnifiedLog::open(dir.path(), config(), T0, PreviousShutdown::Unclean).unwrap();
        let got: Vec<_> = log
            .aborted_txns()
            .iter()
            .map(|t| (t.producer_id, t.first_offset, t.last_offset))
            .collect();
        assert_eq!(
            got,
            aborted_from_the_markers(dir.path()),
            "crash after {crash_after}"
        );
        let controls = control_offsets(&log);
        assert!(
            got.iter().all(|t| controls.contains(&t.2)),
            "crash after {crash_after}"
        );
        assert!(!dir
            .path()
            .join(crate::transaction_index::TXN_INDEX_REBUILD_FILE)
            .exists());
        if finished {
            break;
        }
    }
    assert!(finished);
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

mod transactions_through_cleaning {
    //! Whatever the order of transactional and plain writes, markers, high watermark
    //! moves, rolls and cleans: a read_committed reader of the whole log sees, for every
    //! key, the value it saw before any clean, never a record of an aborted
    //! transaction, and a kill -9 rebuild finds the state the cleaned log holds.

    use std::collections::HashMap;

    use proptest::prelude::*;
    use rill_protocol::generated::fetch_response::AbortedTransaction;
    use rill_protocol::records::AbortedTransactions;

    use super::*;

    #[derive(Debug, Clone)]
    enum Op {
        Txn { producer: i64, key: usize },
        Plain { key: usize },
        Marker { producer: i64, commit: bool },
        HighWatermark,
        Roll,
        Clean { hours: i64 },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (1..4i64, 0..4usize).prop_map(|(producer, key)| Op::Txn { producer, key }),
            2 => (0..4usize).prop_map(|key| Op::Plain { key }),
            3 => (1..4i64, any::<bool>()).prop_map(|(producer, commit)| Op::Marker { producer, commit }),
            1 => Just(Op::HighWatermark),
            2 => Just(Op::Roll),
            1 => (1..48i64).prop_map(|hours| Op::Clean { hours }),
        ]
    }

    /// What a read_committed reader of the whole log sees: every value, and each key's
    /// latest.
    fn committed_view(log: &UnifiedLog) -> (Vec<String>, BTreeMap<Vec<u8>, String>) {
        let lso = log.last_stable_offset();
        let listed: Vec<AbortedTransaction> = log
            .collect_aborted_txns(log.log_start_offset(), lso)
            .iter()
            .map(|t| AbortedTransaction {
                producer_id: t.producer_id,
                first_offset: t.first_offset,
                ..Default::default()
            })
            .collect();
        let mut aborted = AbortedTransactions::new(Some(&listed));
        let mut seen = Vec::new();
        let mut latest = BTreeMap::new();
        for b in read_batches(log).iter().filter(|b| b.base_offset() < lso) {
            if !aborted.deliver(b) {
                continue;
            }
            for r in b.records(1 << 20).unwrap() {
                let value = String::from_utf8(r.value.unwrap().to_vec()).unwrap();
                seen.push(value.clone());
                latest.insert(r.key.unwrap().to_vec(), value);
            }
        }
        (seen, latest)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        #[test]
        fn read_committed_sees_the_same_latest_values(ops in proptest::collection::vec(op(), 1..60)) {
            let dir = tempfile::tempdir().unwrap();
            let config = LogConfig { segment_bytes: 300, ..config() };
            let mut log = UnifiedLog::open(dir.path(), config.clone(), T0, PreviousShutdown::Unclean).unwrap();
            let mut now = T0 + 8 * DAY;
            let mut sequences: HashMap<i64, i32> = HashMap::new();
            let mut open: HashMap<i64, Vec<String>> = HashMap::new();
            let mut aborted_values = Vec::new();
            let mut n = 0;
            let mut before: Option<BTreeMap<Vec<u8>, String>> = None;
            for op in &ops {
                match *op {
                    Op::Txn { producer, key: k } => {
                        n += 1;
                        let value = format!("t{producer}-{n}");
                        let seq = sequences.entry(producer).or_insert(0);
                        let mut b = RecordBatchBuilder::new(CompressionType::None, 0)
                            .producer(producer, 0, *seq)
                            .transactional(true);
                        b.append(T0, Some(&key(k)), Some(value.as_bytes()), &[]).unwrap();
                        log.append_as_leader(b.build().unwrap(), 0, AppendOrigin::Client, T0).unwrap();
                        *seq += 1;
                        open.entry(producer).or_default().push(value);
                    }
                    Op::Plain { key: k } => {
                        n += 1;
                        plain(&mut log, &[(k, &format!("p{n}"))]);
                    }
                    Op::Marker { producer, commit } => {
                        let marker = crate::end_txn_marker_batch(producer, 0, 1, commit, T0).unwrap();
                        log.append_as_leader(marker, 0, AppendOrigin::Coordinator, T0).unwrap();
                        let values = open.remove(&producer).unwrap_or_default();
                        if !commit {
                            aborted_values.extend(values);
                        }
                    }
                    Op::HighWatermark => {
                        let end = log.log_end_offset();
                        log.update_high_watermark(end);
                    }
                    Op::Roll => {
                        log.maybe_roll(now).unwrap();
                    }
                    Op::Clean { hours } => {
                        // A clean changes nothing a read_committed reader sees.
                        let (_, latest) = committed_view(&log);
                        now += hours * 3_600_000;
                        log.clean(now, &CleanerConfig::default()).unwrap();
                        let (seen, after) = committed_view(&log);
                        prop_assert_eq!(&after, &latest);
                        prop_assert!(seen.iter().all(|v| !aborted_values.contains(v)), "{:?}", seen);
                        before.get_or_insert(latest);
                    }
                }
            }
            // Everything decided and replicated, then cleaned past every horizon.
            for producer in 1..4 {
                if open.remove(&producer).is_some_and(|v| !v.is_empty()) {
                    let marker = crate::end_txn_marker_batch(producer, 0, 1, true, T0).unwrap();
                    log.append_as_leader(marker, 0, AppendOrigin::Coordinator, T0).unwrap();
                }
            }
            let end = log.log_end_offset();
            log.update_high_watermark(end);
            let _ = log.maybe_roll(now);
            let (_, latest) = committed_view(&log);
            for _ in 0..3 {
                now += log.config().delete_retention_ms + 1;
                log.clean(now, &CleanerConfig::default()).unwrap();
                let (seen, after) = committed_view(&log);
                prop_assert_eq!(&after, &latest);
                prop_assert!(seen.iter().all(|v| !aborted_values.contains(v)), "{:?}", seen);
            }
            // Every index entry's marker is still in the log.
            let controls = control_offsets(&log);
            for t in log.aborted_txns() {
                prop_assert!(controls.contains(&t.last_offset), "{:?} without its marker", t);
            }
            // The index entries as a reader uses them: an entry's last stable offset is
            // only written to the `.txnindex` (as Kafka's is), and a rebuild computes it
            // from the records left.
            let state = |log: &UnifiedLog| {
                let entries: Vec<_> = log
                    .aborted_txns()
                    .iter()
                    .map(|t| (t.producer_id, t.first_offset, t.last_offset))
                    .collect();
                (log.ongoing_txns(), log.last_stable_offset(), entries)
            };
            let live = state(&log);
            drop(log); // kill -9
            let mut rebuilt = UnifiedLog::open(dir.path(), config, now, PreviousShutdown::Unclean).unwrap();
            rebuilt.update_high_watermark(end);
            prop_assert_eq!(state(&rebuilt), live);
            prop_assert_eq!(committed_view(&rebuilt).1, latest);
        }
    }
}
