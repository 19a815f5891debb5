//! Tests of the log's side of tiered storage: copy candidates, local retention held to
//! what the remote tier has, the epoch lineage check, remote retention, reads of a copy.

use std::collections::BTreeMap;

use super::*;
use crate::test_util::TestBatch;
use crate::{AppendOrigin, LogConfig, PreviousShutdown};

const T0: i64 = 1_700_000_000_000;
const HOUR: i64 = 3_600_000;

fn tiered() -> LogConfig {
    LogConfig {
        segment_bytes: 1024,
        index_interval_bytes: 256,
        remote_storage_enable: true,
        local_retention_bytes: 2048,
        ..LogConfig::default()
    }
}

/// `n` batches of 2 records at leader epoch `epoch`, batch `i` stamped `T0 + i hours`.
fn fill(log: &mut UnifiedLog, n: usize, epoch: i32) {
    for i in 0..n {
        let ts = T0 + i as i64 * HOUR;
        let b = TestBatch::new(2, ts).value_len(100);
        log.append_as_leader(b.bytes(), epoch, AppendOrigin::Client, ts)
            .unwrap();
    }
    let end = log.log_end_offset();
    log.update_high_watermark(end);
}

#[test]
fn copy_candidates_are_the_closed_segments_below_the_lso_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = UnifiedLog::open(dir.path(), tiered(), T0, PreviousShutdown::Unclean).unwrap();
    fill(&mut log, 30, 3);
    let bases = log.segment_base_offsets();
    assert!(bases.len() >= 5, "{bases:?}");
    let all = log.remote_copy_candidates(-1);
    // Every closed segment, none of them the active one, each ending where the next starts.
    assert_eq!(all.len(), bases.len() - 1);
    for (c, next) in all.iter().zip(bases.iter().skip(1)) {
        assert_eq!(c.end_offset, next - 1);
        assert!(c.log_file.exists() && c.offset_index_file.exists());
        assert_eq!(
            c.segment_leader_epochs,
            BTreeMap::from([(3, c.base_offset)])
        );
        assert_eq!(
            c.leader_epochs_to_end,
            vec![EpochEntry {
                epoch: 3,
                start_offset: 0
            }]
        );
        // The roll's producer snapshot is kept until the copy is made.
        assert!(c.producer_snapshot_file.is_some(), "{c:?}");
    }
    // From a copied offset on: the segments after it only.
    let rest = log.remote_copy_candidates(all[1].end_offset);
    assert_eq!(
        rest.first().map(|c| c.base_offset),
        Some(all[2].base_offset)
    );
    // Nothing above the high watermark (here: the LSO) is a candidate.
    log.update_high_watermark(bases[2]);
    let below_hw = log.remote_copy_candidates(-1);
    assert_eq!(below_hw.len(), 2, "{below_hw:?}");
}

#[test]
fn local_retention_deletes_only_what_the_remote_tier_holds() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = UnifiedLog::open(dir.path(), tiered(), T0, PreviousShutdown::Unclean).unwrap();
    fill(&mut log, 30, 0);
    let before = log.segment_base_offsets();
    // Far above local.retention.bytes, but nothing is remote yet: nothing goes.
    assert!(log.size_bytes() > 2048);
    assert_eq!(log.delete_old_segments(T0).unwrap().deleted_segments, 0);
    // Two segments copied: exactly those two may go.
    let copied = log.remote_copy_candidates(-1);
    log.set_highest_offset_in_remote_storage(copied[1].end_offset);
    let r = log.delete_old_segments(T0).unwrap();
    assert_eq!(r.deleted_segments, 2);
    assert_eq!(log.log_start_offset(), before[2]);
    // Everything copied: the local part shrinks to local.retention.bytes.
    let last = log.remote_copy_candidates(-1).last().unwrap().end_offset;
    log.set_highest_offset_in_remote_storage(last);
    log.delete_old_segments(T0).unwrap();
    assert!(log.size_bytes() <= 2048 + 1024, "{}", log.size_bytes());
    // A follower's log start follows the leader's: the epochs stay too.
    log.maybe_increment_log_start_offset(log.log_start_offset() + 1)
        .unwrap();
    // The leader epochs of the remote part are kept (rule 3), until told otherwise.
    assert_eq!(log.leader_epoch_cache().entries()[0].start_offset, 0);
    log.truncate_leader_epochs_below(10).unwrap();
    assert_eq!(log.leader_epoch_cache().entries()[0].start_offset, 10);
    // The highest offset never moves back.
    log.set_highest_offset_in_remote_storage(0);
    assert_eq!(log.highest_offset_in_remote_storage(), last);
}

#[test]
fn local_retention_ms_defaults_to_retention_ms() {
    let c = LogConfig {
        retention_ms: 5,
        retention_bytes: 7,
        ..tiered()
    };
    assert_eq!(c.local_retention_bytes(), 2048);
    assert_eq!(c.local_retention_ms(), 5);
    let c = LogConfig {
        local_retention_bytes: -2,
        ..c
    };
    assert_eq!(c.local_retention_bytes(), 7);
}

fn epochs(pairs: &[(i32, i64)]) -> BTreeMap<i32, i64> {
    pairs.iter().copied().collect()
}

#[test]
fn epoch_lineage_check_follows_kafka() {
    let log = epochs(&[(0, 0), (1, 10), (2, 20), (3, 30), (4, 40), (5, 50), (7, 70)]);
    // Within one epoch, and across contiguous epochs.
    assert!(is_segment_within_leader_epochs(
        &epochs(&[(0, 0)]),
        9,
        &log,
        100
    ));
    assert!(is_segment_within_leader_epochs(
        &epochs(&[(1, 15), (2, 20)]),
        25,
        &log,
        100
    ));
    // Ends past where its last epoch ends in the log: the log diverged there.
    assert!(!is_segment_within_leader_epochs(
        &epochs(&[(1, 15)]),
        25,
        &log,
        100
    ));
    // An epoch the log never had.
    assert!(!is_segment_within_leader_epochs(
        &epochs(&[(5, 50), (6, 60)]),
        65,
        &log,
        100
    ));
    // An epoch starting elsewhere than in the log.
    assert!(!is_segment_within_leader_epochs(
        &epochs(&[(3, 30), (4, 45)]),
        48,
        &log,
        100
    ));
    // Beyond the log end, or older than the whole lineage.
    assert!(!is_segment_within_leader_epochs(
        &epochs(&[(7, 70)]),
        120,
        &log,
        100
    ));
    let later = epochs(&[(3, 30), (4, 40)]);
    assert!(!is_segment_within_leader_epochs(
        &epochs(&[(1, 10)]),
        15,
        &later,
        100
    ));
    // A segment that starts in an epoch the log has trimmed, overlapping (Kafka's example).
    let trimmed = epochs(&[(7, 51), (9, 100)]);
    let seg = epochs(&[(5, 14), (7, 15), (9, 100)]);
    assert!(is_segment_within_leader_epochs(&seg, 150, &trimmed, 200));
    // Epochs without records in the segment are ignored.
    assert!(is_segment_within_leader_epochs(
        &epochs(&[(4, 45), (5, 50)]),
        55,
        &log,
        100
    ));
}

#[test]
fn remote_retention_deletes_a_prefix_by_start_time_and_size() {
    let seg = |start: i64, ts: i64| RemoteSegmentSummary {
        start_offset: start,
        end_offset: start + 9,
        size_bytes: 100,
        max_timestamp: ts,
    };
    let segs = [seg(0, 10), seg(10, 20), seg(20, 5), seg(30, 40)];
    // Nothing breached.
    assert_eq!(remote_segments_to_delete(&segs, 0, -1, -1, 0, 100), 0);
    // Below the log start (DeleteRecords).
    assert_eq!(remote_segments_to_delete(&segs, 15, -1, -1, 0, 100), 1);
    // By time: a prefix only, even when a later segment is older.
    assert_eq!(remote_segments_to_delete(&segs, 0, 85, -1, 0, 100), 1);
    assert_eq!(remote_segments_to_delete(&segs, 0, 70, -1, 0, 100), 3);
    // By size, counting the local-only part: 400 + 150 = 550 against 300.
    assert_eq!(remote_segments_to_delete(&segs, 0, -1, 300, 150, 100), 2);
    assert_eq!(remote_segments_to_delete(&segs, 0, -1, 1000, 150, 100), 0);
}

#[test]
fn epoch_checkpoints_round_trip_and_reject_garbage() {
    let e = vec![
        EpochEntry {
            epoch: 0,
            start_offset: 0,
        },
        EpochEntry {
            epoch: 4,
            start_offset: 120,
        },
    ];
    let bytes = epoch_checkpoint_bytes(&e);
    assert_eq!(bytes, b"0\n2\n0 0\n4 120\n");
    assert_eq!(parse_epoch_checkpoint(&bytes), Some(e));
    assert_eq!(parse_epoch_checkpoint(b"0\n3\n0 0\n"), None);
    assert_eq!(parse_epoch_checkpoint(b"1\n0\n"), None);
    assert_eq!(parse_epoch_checkpoint(b"\xff"), None);
}

#[test]
fn a_copy_of_a_segment_reads_like_the_segment() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = UnifiedLog::open(dir.path(), tiered(), T0, PreviousShutdown::Unclean).unwrap();
    fill(&mut log, 30, 2);
    let c = log.remote_copy_candidates(-1)[1].clone();
    let cache = tempfile::tempdir().unwrap();
    for (from, suffix) in [(&c.log_file, "log"), (&c.offset_index_file, "index")] {
        std::fs::copy(from, segment_file(cache.path(), c.base_offset, suffix)).unwrap();
    }
    let reader = RemoteSegmentReader::open(cache.path(), c.base_offset).unwrap();
    assert_eq!(reader.next_offset(), c.end_offset + 1);
    for offset in c.base_offset..=c.end_offset {
        let remote = reader.read(offset, 300, i64::MAX, true).unwrap().unwrap();
        let local = log.read(offset, 300, i64::MAX, true).unwrap();
        assert_eq!(remote.records, local.records, "at {offset}");
    }
    // Past its end: nothing (the caller moves on to the next segment).
    assert!(reader
        .read(c.end_offset + 1, 300, i64::MAX, true)
        .unwrap()
        .is_none());
    // By timestamp: the batch stamped at or after it (the time index was rebuilt here).
    let (ts_offset, ts, epoch) = reader
        .offset_for_timestamp(T0 + 1)
        .unwrap()
        .unwrap_or((-1, -1, -1));
    assert!(
        ts_offset >= c.base_offset && ts > T0 && epoch == 2,
        "{ts_offset} {ts}"
    );
    assert!(reader.aborted_txns(0, i64::MAX).unwrap().is_empty());
    // A missing copy is an error, not a panic.
    assert!(RemoteSegmentReader::open(cache.path(), 999).is_err());
}

#[test]
fn a_replica_can_start_at_the_remote_tail_with_the_leaders_epochs() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = UnifiedLog::open(dir.path(), tiered(), T0, PreviousShutdown::Unclean).unwrap();
    let epochs = [
        EpochEntry {
            epoch: 1,
            start_offset: 0,
        },
        EpochEntry {
            epoch: 4,
            start_offset: 500,
        },
        EpochEntry {
            epoch: 6,
            start_offset: 900,
        },
    ];
    log.start_from_remote_tier(800, &epochs, None, T0).unwrap();
    assert_eq!(log.log_start_offset(), 800);
    assert_eq!(log.log_end_offset(), 800);
    // Epochs that start at or after the new start are the leader's to send again.
    assert_eq!(log.leader_epoch_cache().entries(), &epochs[..2]);
    assert_eq!(log.end_offset_for_epoch(1), (1, 500));
    // And they survive a reopen.
    log.close().unwrap();
    let log = UnifiedLog::open(dir.path(), tiered(), T0, PreviousShutdown::Clean).unwrap();
    assert_eq!(log.leader_epoch_cache().entries(), &epochs[..2]);
}
