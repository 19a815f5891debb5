//! Group commit of the flush policy's fsyncs (see `crate::flush`): appends written
//! under the log's lock, synced without it, one fsync for every append written before
//! it started; the recovery point never passes what was synced nor the log end.

use std::sync::{Arc, Barrier, Mutex};
use std::thread;

use super::*;
use crate::test_util::TestBatch;

const T0: i64 = 1_700_000_000_000;

fn flush_every_message(segment_bytes: u64) -> LogConfig {
    LogConfig {
        segment_bytes,
        flush_messages: Some(1),
        ..LogConfig::default()
    }
}

/// The broker's split of an append: validation without the lock, the write with it.
fn append_deferred(
    log: &Mutex<UnifiedLog>,
    batch: &TestBatch,
) -> (LogAppendInfo, Option<PendingFlush>) {
    let config = log.lock().unwrap().config_for_append().unwrap();
    let records = batch.bytes();
    let validated =
        UnifiedLog::validate_records(&config, &records, AppendOrigin::Client, T0).unwrap();
    log.lock()
        .unwrap()
        .append_validated_as_leader(validated, 0, T0)
        .unwrap()
}

#[test]
fn appends_written_before_a_sync_share_its_fsync() {
    const THREADS: usize = 8;
    let dir = tempfile::tempdir().unwrap();
    let log = UnifiedLog::open(
        dir.path(),
        flush_every_message(1 << 20),
        T0,
        PreviousShutdown::Unclean,
    )
    .unwrap();
    let flusher = Arc::clone(log.flusher());
    let log = Arc::new(Mutex::new(log));
    // Every thread writes, then all sync: the first sync covers every append, so the
    // others return without one of their own.
    let written = Arc::new(Barrier::new(THREADS));
    let handles: Vec<_> = (0..THREADS)
        .map(|_| {
            let log = Arc::clone(&log);
            let written = Arc::clone(&written);
            thread::spawn(move || {
                let (info, pending) = append_deferred(&log, &TestBatch::new(2, T0));
                let pending = pending.expect("flush.messages=1 asks for a flush");
                assert_eq!(pending.target(), info.last_offset + 1);
                written.wait();
                let done = pending.sync().unwrap();
                assert!(done.synced() > info.last_offset);
                let mut log = log.lock().unwrap();
                log.complete_flush(done);
                assert!(log.recovery_point() > info.last_offset);
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(flusher.fsync_count(), 1);
    let log = log.lock().unwrap();
    assert_eq!(log.log_end_offset(), 2 * THREADS as i64);
    assert_eq!(log.recovery_point(), log.log_end_offset());
}

#[test]
fn concurrent_appends_return_only_once_synced_with_fewer_fsyncs() {
    const THREADS: usize = 4;
    const PER_THREAD: usize = 200;
    let dir = tempfile::tempdir().unwrap();
    // Small segments: rolls happen between the writes and the syncs.
    let log = UnifiedLog::open(
        dir.path(),
        flush_every_message(16 * 1024),
        T0,
        PreviousShutdown::Unclean,
    )
    .unwrap();
    let flusher = Arc::clone(log.flusher());
    let log = Arc::new(Mutex::new(log));
    let start = Arc::new(Barrier::new(THREADS));
    let handles: Vec<_> = (0..THREADS)
        .map(|_| {
            let log = Arc::clone(&log);
            let start = Arc::clone(&start);
            thread::spawn(move || {
                start.wait();
                for _ in 0..PER_THREAD {
                    let (info, pending) =
                        append_deferred(&log, &TestBatch::new(1, T0).value_len(200));
                    let done = pending.unwrap().sync().unwrap();
                    assert!(done.synced() > info.last_offset);
                    let mut log = log.lock().unwrap();
                    log.complete_flush(done);
                    assert!(log.recovery_point() > info.last_offset);
                    assert!(log.recovery_point() <= log.log_end_offset());
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let log = log.lock().unwrap();
    let appends = (THREADS * PER_THREAD) as u64;
    assert_eq!(log.log_end_offset(), appends as i64);
    assert!(log.segment_count() > 1, "the test should roll");
    assert_eq!(log.recovery_point(), log.log_end_offset());
    // At most one fsync per append (fewer whenever appends overlapped; how many
    // overlap depends on the scheduler, so that is not asserted here).
    assert!(flusher.fsync_count() <= appends);
}

#[test]
fn a_roll_between_write_and_sync_is_covered() {
    let dir = tempfile::tempdir().unwrap();
    // Each 1-record batch of 400 bytes value takes most of a segment: every append rolls.
    let log = UnifiedLog::open(
        dir.path(),
        flush_every_message(600),
        T0,
        PreviousShutdown::Unclean,
    )
    .unwrap();
    let log = Mutex::new(log);
    let batch = TestBatch::new(1, T0).value_len(400);
    let (a, pending_a) = append_deferred(&log, &batch);
    let (b, pending_b) = append_deferred(&log, &batch);
    assert_eq!(log.lock().unwrap().segment_count(), 2);
    // The roll fsynced the first segment, which holds all of the first append: its
    // promise is kept without an fsync of its own.
    let done = pending_a.unwrap().sync().unwrap();
    assert!(done.synced() > a.last_offset);
    assert_eq!(log.lock().unwrap().flusher().fsync_count(), 0);
    log.lock().unwrap().complete_flush(done);
    assert!(log.lock().unwrap().recovery_point() > a.last_offset);
    // The second append is in the new segment, which the next sync covers.
    let done = pending_b.unwrap().sync().unwrap();
    assert!(done.synced() > b.last_offset);
    let mut log = log.lock().unwrap();
    log.complete_flush(done);
    assert_eq!(log.flusher().fsync_count(), 1);
    assert_eq!(log.recovery_point(), log.log_end_offset());
}

#[test]
fn truncation_between_write_and_sync_keeps_the_recovery_point_in_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let log = UnifiedLog::open(
        dir.path(),
        flush_every_message(1 << 20),
        T0,
        PreviousShutdown::Unclean,
    )
    .unwrap();
    let log = Mutex::new(log);
    let mut pendings = Vec::new();
    for _ in 0..10 {
        let (_, pending) = append_deferred(&log, &TestBatch::new(1, T0));
        pendings.push(pending.unwrap());
    }
    // A sync that finished before the truncation but is recorded after it.
    let early = pendings[9].sync().unwrap();
    assert_eq!(early.synced(), 10);
    assert!(log.lock().unwrap().truncate_to(4, T0).unwrap());
    {
        let mut log = log.lock().unwrap();
        assert_eq!(log.log_end_offset(), 4);
        log.complete_flush(early);
        assert!(log.recovery_point() <= 4);
    }
    // Promises of the truncated appends: nothing of theirs is left to sync.
    let fsyncs = log.lock().unwrap().flusher().fsync_count();
    for p in &pendings {
        let done = p.sync().unwrap();
        let mut log = log.lock().unwrap();
        log.complete_flush(done);
        assert!(log.recovery_point() <= log.log_end_offset());
    }
    assert_eq!(log.lock().unwrap().flusher().fsync_count(), fsyncs);
    // New appends at the same offsets are not taken for synced by the old watermark.
    let (info, pending) = append_deferred(&log, &TestBatch::new(3, T0));
    assert_eq!(info.last_offset, 6);
    let done = pending.unwrap().sync().unwrap();
    assert_eq!(log.lock().unwrap().flusher().fsync_count(), fsyncs + 1);
    let mut log = log.lock().unwrap();
    log.complete_flush(done);
    assert_eq!(log.recovery_point(), 7);
}

#[test]
fn a_log_that_went_offline_never_syncs_again() {
    let dir = tempfile::tempdir().unwrap();
    let log = UnifiedLog::open(
        dir.path(),
        flush_every_message(1 << 20),
        T0,
        PreviousShutdown::Unclean,
    )
    .unwrap();
    let log = Mutex::new(log);
    let (_, pending) = append_deferred(&log, &TestBatch::new(1, T0));
    let pending = pending.unwrap();
    // Another append's fsync failed (an injected error): the dirty pages may be gone,
    // so a later fsync that succeeds would prove nothing.
    let err = StorageError::io(dir.path(), std::io::Error::other("injected fsync failure"));
    let _ = log.lock().unwrap().flush_failed(err);
    assert!(matches!(pending.sync(), Err(StorageError::Offline { .. })));
    let log = log.lock().unwrap();
    assert_eq!(log.flusher().fsync_count(), 0);
    assert_eq!(log.recovery_point(), 0);
    assert!(log.config_for_append().is_err());
}

#[test]
fn a_retried_batch_waits_for_the_flush_of_the_original() {
    let dir = tempfile::tempdir().unwrap();
    let log = UnifiedLog::open(
        dir.path(),
        flush_every_message(1 << 20),
        T0,
        PreviousShutdown::Unclean,
    )
    .unwrap();
    let log = Mutex::new(log);
    let batch = TestBatch::new(2, T0).producer(7, 0, 0);
    let (first, pending) = append_deferred(&log, &batch);
    assert!(!first.duplicate);
    let pending = pending.unwrap();
    // The retry comes before the original's fsync: it must wait for one too.
    let (retry, retry_pending) = append_deferred(&log, &batch);
    assert!(retry.duplicate);
    assert_eq!(retry.last_offset, first.last_offset);
    let retry_pending = retry_pending.expect("the original is not synced yet");
    let done = pending.sync().unwrap();
    log.lock().unwrap().complete_flush(done);
    let done = retry_pending.sync().unwrap();
    assert!(done.synced() > retry.last_offset);
    // Once synced, a retry has nothing to wait for.
    let (again, none) = append_deferred(&log, &batch);
    assert!(again.duplicate);
    assert!(none.is_none());
}

#[test]
fn no_flush_policy_no_pending_flush() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig::default();
    assert!(config.flush_messages.is_none() && config.flush_ms.is_none());
    let log = UnifiedLog::open(dir.path(), config, T0, PreviousShutdown::Unclean).unwrap();
    let log = Mutex::new(log);
    let (_, pending) = append_deferred(&log, &TestBatch::new(3, T0));
    assert!(pending.is_none());
    assert_eq!(log.lock().unwrap().recovery_point(), 0);
}

#[test]
fn a_follower_append_defers_its_flush_too() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = UnifiedLog::open(
        dir.path(),
        flush_every_message(1 << 20),
        T0,
        PreviousShutdown::Unclean,
    )
    .unwrap();
    let config = log.config_for_append().unwrap();
    let records = TestBatch::new(3, T0).at(0, 1).bytes();
    // Records validated for a leader are refused by the follower append and back.
    let as_client =
        UnifiedLog::validate_records(&config, &records, AppendOrigin::Client, T0).unwrap();
    assert!(log.append_validated_as_follower(as_client, T0).is_err());
    let validated =
        UnifiedLog::validate_records(&config, &records, AppendOrigin::Replication, T0).unwrap();
    let (info, pending) = log.append_validated_as_follower(validated, T0).unwrap();
    assert_eq!(info.last_offset, 2);
    assert_eq!(log.recovery_point(), 0);
    let done = pending.unwrap().sync().unwrap();
    log.complete_flush(done);
    assert_eq!(log.recovery_point(), 3);
}
