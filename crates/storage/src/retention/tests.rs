//! Tests of retention by time and size, DeleteRecords and `maybe_roll`, with a fake clock.

use crate::error::{DeleteRecordsError, ReadError};
use crate::test_util::TestBatch;
use crate::{AppendOrigin, CleanupPolicy, LogConfig, PreviousShutdown, UnifiedLog};

const T0: i64 = 1_700_000_000_000;
const HOUR: i64 = 3_600_000;

fn config() -> LogConfig {
    LogConfig {
        segment_bytes: 1024,
        index_interval_bytes: 256,
        ..LogConfig::default()
    }
}

/// Appends `n` batches of 2 records, batch `i` stamped `T0 + i hours`; moves the high
/// watermark to the log end.
fn fill(log: &mut UnifiedLog, n: usize) {
    for i in 0..n {
        let ts = T0 + i as i64 * HOUR;
        let b = TestBatch::new(2, ts).value_len(100);
        log.append_as_leader(b.bytes(), 0, AppendOrigin::Client, ts)
            .unwrap();
    }
    let end = log.log_end_offset();
    log.update_high_watermark(end);
}

fn out_of_range(log: &UnifiedLog, offset: i64) -> bool {
    matches!(
        log.read(offset, 1 << 20, i64::MAX, true),
        Err(ReadError::OffsetOutOfRange { .. })
    )
}

#[test]
fn retention_by_time_deletes_old_segments_and_moves_the_log_start() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = UnifiedLog::open(
        dir.path(),
        LogConfig {
            retention_ms: 10 * HOUR,
            ..config()
        },
        T0,
        PreviousShutdown::Unclean,
    )
    .unwrap();
    fill(&mut log, 40);
    let bases = log.segment_base_offsets();
    assert!(bases.len() > 5, "{bases:?}");
    let sizes_before = log.size_bytes();

    // Nothing is older than retention.ms yet.
    let r = log.delete_old_segments(T0 + 10 * HOUR).unwrap();
    assert_eq!(r.deleted_segments, 0);

    // At T0 + 25h, batches stamped before T0 + 15h are too old; only whole segments go.
    let now = T0 + 25 * HOUR;
    let r = log.delete_old_segments(now).unwrap();
    assert!(r.deleted_segments > 0);
    assert_eq!(log.size_bytes() + r.deleted_bytes, sizes_before);
    let first = log.segment_base_offsets()[0];
    assert_eq!(log.log_start_offset(), first);
    assert_eq!(r.log_start_offset, first);
    // The first remaining segment holds a record newer than the retention limit, and
    // every deleted one held only older records (2 records per hour).
    assert!(first / 2 <= 15 && first > 0, "first {first}");
    assert!(out_of_range(&log, first - 1));
    assert!(out_of_range(&log, 0));
    let info = log.read(first, 1 << 20, i64::MAX, true).unwrap();
    assert!(!info.records.is_empty());

    // The log start survives a restart, clean or not.
    drop(log);
    let mut log = UnifiedLog::open(dir.path(), config(), T0, PreviousShutdown::Unclean).unwrap();
    assert_eq!(log.log_start_offset(), first);
    // The high watermark was not checkpointed: nothing above it may go.
    assert_eq!(
        log.delete_old_segments(T0 + 1000 * HOUR)
            .unwrap()
            .deleted_segments,
        0
    );
    let end = log.log_end_offset();
    log.update_high_watermark(end);

    // Far in the future everything but the active segment goes.
    let r = log.delete_old_segments(T0 + 1000 * HOUR).unwrap();
    assert_eq!(log.segment_count(), 1);
    assert_eq!(r.log_start_offset, log.segment_base_offsets()[0]);
}

#[test]
fn retention_never_deletes_above_the_high_watermark_or_with_compact_only() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = UnifiedLog::open(
        dir.path(),
        LogConfig {
            retention_ms: HOUR,
            ..config()
        },
        T0,
        PreviousShutdown::Unclean,
    )
    .unwrap();
    fill(&mut log, 40);
    let bases = log.segment_base_offsets();
    log.update_high_watermark(bases[2] + 1);
    let r = log.delete_old_segments(T0 + 1000 * HOUR).unwrap();
    assert_eq!(
        r.deleted_segments, 2,
        "only the segments wholly below the hw"
    );
    assert_eq!(log.log_start_offset(), bases[2]);

    let end = log.log_end_offset();
    log.update_high_watermark(end);
    log.update_config(LogConfig {
        retention_ms: HOUR,
        cleanup_policy: CleanupPolicy::Compact,
        ..config()
    })
    .unwrap();
    assert_eq!(
        log.delete_old_segments(T0 + 1000 * HOUR)
            .unwrap()
            .deleted_segments,
        0
    );
    log.update_config(LogConfig {
        retention_ms: HOUR,
        cleanup_policy: CleanupPolicy::CompactDelete,
        ..config()
    })
    .unwrap();
    assert!(
        log.delete_old_segments(T0 + 1000 * HOUR)
            .unwrap()
            .deleted_segments
            > 0
    );
}

#[test]
fn retention_by_size_keeps_the_newest_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let limit = 3000;
    let mut log = UnifiedLog::open(
        dir.path(),
        LogConfig {
            retention_ms: -1,
            retention_bytes: limit,
            ..config()
        },
        T0,
        PreviousShutdown::Unclean,
    )
    .unwrap();
    fill(&mut log, 60);
    let before = log.size_bytes();
    assert!(before > 2 * limit as u64);
    let r = log.delete_old_segments(T0).unwrap();
    assert!(r.deleted_segments > 0);
    let after = log.size_bytes();
    assert!(after <= limit as u64 + 1024, "{after}");
    // Deleting one more segment would have gone below the limit.
    let first_size = {
        let first = log.segment_base_offsets()[0];
        let next = log.segment_base_offsets()[1];
        let info = log.read(first, 1 << 20, next, true).unwrap();
        info.records.len() as u64
    };
    assert!(after - first_size < limit as u64);
    assert_eq!(log.log_start_offset(), log.segment_base_offsets()[0]);
    // A second pass has nothing left to do.
    assert_eq!(log.delete_old_segments(T0).unwrap().deleted_segments, 0);
    // Unlimited size (-1) deletes nothing.
    log.update_config(LogConfig {
        retention_ms: -1,
        retention_bytes: -1,
        ..config()
    })
    .unwrap();
    fill(&mut log, 20);
    assert_eq!(
        log.delete_old_segments(T0 + 1_000_000 * HOUR)
            .unwrap()
            .deleted_segments,
        0
    );
}

#[test]
fn maybe_roll_rolls_a_quiet_partition_so_retention_can_delete_it() {
    let dir = tempfile::tempdir().unwrap();
    let segment_ms = 2 * HOUR;
    let mut log = UnifiedLog::open(
        dir.path(),
        LogConfig {
            segment_ms,
            retention_ms: HOUR,
            ..LogConfig::default()
        },
        T0,
        PreviousShutdown::Unclean,
    )
    .unwrap();
    // An empty active segment is never rolled.
    assert!(!log.maybe_roll(T0 + 100 * HOUR).unwrap());
    fill(&mut log, 1);
    assert_eq!(log.segment_count(), 1);
    // Age counts from the first batch's max timestamp (T0 + 1).
    assert!(!log.maybe_roll(T0 + segment_ms).unwrap());
    assert_eq!(
        log.delete_old_segments(T0 + 10 * HOUR)
            .unwrap()
            .deleted_segments,
        0
    );
    assert!(log.maybe_roll(T0 + 1 + segment_ms).unwrap());
    assert_eq!(log.segment_count(), 2);
    assert!(
        !log.maybe_roll(T0 + segment_ms + 1).unwrap(),
        "new one is empty"
    );
    let r = log.delete_old_segments(T0 + 10 * HOUR).unwrap();
    assert_eq!(r.deleted_segments, 1);
    assert_eq!(log.log_start_offset(), 2);
    assert_eq!(log.log_end_offset(), 2);
    // Appends continue at the same offsets.
    fill(&mut log, 1);
    assert_eq!(log.log_end_offset(), 4);

    // A compacted log rolls by max.compaction.lag.ms when that is shorter.
    log.update_config(LogConfig {
        segment_ms,
        cleanup_policy: CleanupPolicy::Compact,
        max_compaction_lag_ms: HOUR / 2,
        ..LogConfig::default()
    })
    .unwrap();
    assert!(!log.maybe_roll(T0 + HOUR / 2).unwrap());
    assert!(log.maybe_roll(T0 + 1 + HOUR / 2).unwrap());
}

#[test]
fn delete_records_moves_the_log_start_inside_a_segment() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = UnifiedLog::open(dir.path(), config(), T0, PreviousShutdown::Unclean).unwrap();
    fill(&mut log, 40);
    let bases = log.segment_base_offsets();
    let hw = log.log_end_offset() - 3;
    log.update_high_watermark(hw);

    assert!(matches!(
        log.delete_records_before(hw + 1),
        Err(DeleteRecordsError::OffsetOutOfRange { .. })
    ));
    assert!(matches!(
        log.delete_records_before(-5),
        Err(DeleteRecordsError::OffsetOutOfRange { .. })
    ));

    // Inside the third segment: the first two go, the third stays.
    let target = bases[2] + 1;
    let r = log.delete_records_before(target).unwrap();
    assert_eq!(r.log_start_offset, target);
    assert_eq!(r.deleted_segments, 2);
    assert_eq!(log.segment_base_offsets()[0], bases[2]);
    assert!(out_of_range(&log, target - 1));
    let info = log.read(target, 1 << 20, i64::MAX, true).unwrap();
    assert!(!info.records.is_empty());

    // A lower offset is not an error and changes nothing (Kafka answers the current
    // low watermark).
    assert_eq!(
        log.delete_records_before(1).unwrap().log_start_offset,
        target
    );

    // The log start survives an unclean restart.
    drop(log);
    let mut log = UnifiedLog::open(dir.path(), config(), T0, PreviousShutdown::Unclean).unwrap();
    assert_eq!(log.log_start_offset(), target);
    log.update_high_watermark(hw);
    assert!(out_of_range(&log, target - 1));

    // -1 means the high watermark.
    let r = log.delete_records_before(-1).unwrap();
    assert_eq!(r.log_start_offset, hw);
    assert!(log.segment_base_offsets()[0] <= hw);

    // Not on a compacted-only topic.
    log.update_config(LogConfig {
        cleanup_policy: CleanupPolicy::Compact,
        ..config()
    })
    .unwrap();
    assert!(matches!(
        log.delete_records_before(hw),
        Err(DeleteRecordsError::PolicyViolation)
    ));
}

#[test]
fn cleanup_policy_parses_kafka_lists() {
    assert_eq!(
        "delete".parse::<CleanupPolicy>().unwrap(),
        CleanupPolicy::Delete
    );
    assert_eq!(
        "compact".parse::<CleanupPolicy>().unwrap(),
        CleanupPolicy::Compact
    );
    assert_eq!(
        "delete, compact".parse::<CleanupPolicy>().unwrap(),
        CleanupPolicy::CompactDelete
    );
    assert_eq!(CleanupPolicy::CompactDelete.to_string(), "compact,delete");
    assert!("".parse::<CleanupPolicy>().is_err());
    assert!("shred".parse::<CleanupPolicy>().is_err());
}
