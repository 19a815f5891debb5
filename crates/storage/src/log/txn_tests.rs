//! Transactions in the log: open transactions, markers, the last stable offset, the
//! aborted-transaction index, and all of it after a clean close, a kill -9 (a log
//! dropped without close), a truncation, a follower's copy and retention.

use bytes::Bytes;

use super::*;
use crate::test_util::TestBatch;

const T0: i64 = 1_700_000_000_000;

fn config() -> LogConfig {
    LogConfig {
        segment_bytes: 400,
        index_interval_bytes: 256,
        ..LogConfig::default()
    }
}

/// A transactional batch of `n` records from producer `pid`.
fn txn_batch(pid: i64, epoch: i16, seq: i32, n: usize) -> Bytes {
    let mut b = TestBatch::new(n, T0).producer(pid, epoch, seq);
    b.attributes |= 0x10;
    b.bytes()
}

fn marker(pid: i64, epoch: i16, coordinator_epoch: i32, commit: bool) -> Bytes {
    end_txn_marker_batch(pid, epoch, coordinator_epoch, commit, T0).unwrap()
}

fn append(log: &mut UnifiedLog, records: Bytes, origin: AppendOrigin) -> LogAppendInfo {
    log.append_as_leader(records, 0, origin, T0).unwrap()
}

/// Everything the transaction state of a log consists of: open transactions, LSO,
/// aborted index, and per producer its open transaction and coordinator epoch.
type TxnState = (
    Vec<(i64, i64)>,
    i64,
    Vec<AbortedTxn>,
    Vec<(i64, Option<i64>, i32)>,
);

fn txn_state(log: &UnifiedLog) -> TxnState {
    let producers = log
        .active_producers()
        .iter()
        .map(|p| {
            (
                p.producer_id,
                p.current_txn_first_offset,
                p.coordinator_epoch,
            )
        })
        .collect();
    (
        log.ongoing_txns(),
        log.last_stable_offset(),
        log.aborted_txns().to_vec(),
        producers,
    )
}

/// Producer 1 commits [0, 3), producer 2 aborts [3, 5) and [8, 9), producer 3 leaves
/// [7, 9) open; returns the log (high watermark at the log end).
fn scenario(dir: &std::path::Path) -> UnifiedLog {
    let mut log = UnifiedLog::open(dir, config(), T0, PreviousShutdown::Unclean).unwrap();
    assert_eq!(
        append(&mut log, txn_batch(1, 0, 0, 3), AppendOrigin::Client).first_offset,
        0
    );
    assert_eq!(
        append(&mut log, txn_batch(2, 0, 0, 2), AppendOrigin::Client).first_offset,
        3
    );
    log.update_high_watermark(log.log_end_offset());
    // Both open: the LSO is the first one's first offset.
    assert_eq!(log.ongoing_txns(), vec![(0, 1), (3, 2)]);
    assert_eq!(log.last_stable_offset(), 0);

    let info = append(&mut log, marker(1, 0, 5, true), AppendOrigin::Coordinator);
    assert_eq!(info.first_offset, 5);
    // Producer 1's transaction is decided but its marker is not replicated yet.
    assert_eq!(log.ongoing_txns(), vec![(3, 2)]);
    assert_eq!(log.last_stable_offset(), 0);
    log.update_high_watermark(6);
    assert_eq!(log.last_stable_offset(), 3);

    let info = append(&mut log, marker(2, 0, 5, false), AppendOrigin::Coordinator);
    assert_eq!(info.first_offset, 6);
    assert_eq!(
        log.aborted_txns(),
        &[AbortedTxn {
            producer_id: 2,
            first_offset: 3,
            last_offset: 6,
            last_stable_offset: 7,
        }]
    );
    assert_eq!(
        log.last_stable_offset(),
        3,
        "marker above the high watermark"
    );
    log.update_high_watermark(7);
    assert_eq!(log.last_stable_offset(), 7);
    assert!(log.ongoing_txns().is_empty());

    append(&mut log, txn_batch(3, 0, 0, 1), AppendOrigin::Client);
    append(&mut log, txn_batch(2, 0, 2, 1), AppendOrigin::Client);
    append(&mut log, txn_batch(3, 0, 1, 1), AppendOrigin::Client);
    assert_eq!(log.ongoing_txns(), vec![(7, 3), (8, 2)]);
    append(&mut log, marker(2, 0, 5, false), AppendOrigin::Coordinator);
    log.update_high_watermark(log.log_end_offset());
    assert_eq!(log.last_stable_offset(), 7, "producer 3 still open");
    assert_eq!(
        log.aborted_txns()[1],
        AbortedTxn {
            producer_id: 2,
            first_offset: 8,
            last_offset: 10,
            last_stable_offset: 7,
        }
    );
    log
}

#[test]
fn markers_close_transactions_and_move_the_last_stable_offset() {
    let dir = tempfile::tempdir().unwrap();
    let log = scenario(dir.path());
    // A read_committed fetch from 0 up to the LSO learns of producer 2's first abort
    // only; from 4 on, of both.
    let lso = log.last_stable_offset();
    let pids: Vec<_> = log
        .collect_aborted_txns(0, lso)
        .iter()
        .map(|t| t.first_offset)
        .collect();
    assert_eq!(pids, vec![3]);
    let all: Vec<_> = log
        .collect_aborted_txns(4, 11)
        .iter()
        .map(|t| t.first_offset)
        .collect();
    assert_eq!(all, vec![3, 8]);
    assert!(log.collect_aborted_txns(11, 11).is_empty());
    // The marker batch is Kafka's: control + transactional, one record, key ABORT/COMMIT.
    let read = log.read(5, 1 << 20, 7, true).unwrap();
    let batch = RecordBatch::split_from(&mut read.records.clone()).unwrap();
    assert!(batch.is_control() && batch.is_transactional());
    assert_eq!((batch.producer_id(), batch.base_sequence()), (1, -1));
    let records = batch.records(1 << 20).unwrap();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].key.as_deref(), Some(&[0u8, 0, 0, 1][..]));
    assert_eq!(records[0].value.as_deref(), Some(&[0u8, 0, 0, 0, 0, 5][..]));
    let producers = txn_state(&log).3;
    assert_eq!(
        producers,
        vec![(1, None, 5), (2, None, 5), (3, Some(7), -1)]
    );
}

#[test]
fn transaction_rules_refuse_what_kafka_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = UnifiedLog::open(dir.path(), config(), T0, PreviousShutdown::Unclean).unwrap();
    append(&mut log, txn_batch(1, 3, 0, 2), AppendOrigin::Client);
    // An idempotent (non-transactional) batch while the transaction is open.
    let plain = TestBatch::new(1, T0).producer(1, 3, 2).bytes();
    assert!(matches!(
        log.append_as_leader(plain, 0, AppendOrigin::Client, T0),
        Err(AppendError::InvalidTxnState { producer_id: 1, .. })
    ));
    append(&mut log, marker(1, 3, 7, false), AppendOrigin::Coordinator);
    // A marker from an older coordinator epoch, or for an older producer epoch.
    assert!(matches!(
        log.append_as_leader(marker(1, 3, 6, true), 0, AppendOrigin::Coordinator, T0),
        Err(AppendError::TransactionCoordinatorFenced {
            current: 7,
            found: 6,
            ..
        })
    ));
    assert!(matches!(
        log.append_as_leader(marker(1, 2, 7, true), 0, AppendOrigin::Coordinator, T0),
        Err(AppendError::InvalidProducerEpoch { .. })
    ));
    // Clients may not write markers.
    assert!(matches!(
        log.append_as_leader(marker(1, 3, 7, true), 0, AppendOrigin::Client, T0),
        Err(AppendError::InvalidRecord(_))
    ));
    // A marker for a producer with no open transaction closes an empty one at itself.
    let info = append(&mut log, marker(1, 3, 7, false), AppendOrigin::Coordinator);
    assert_eq!(
        log.aborted_txns().last().unwrap().first_offset,
        info.first_offset
    );
    // After the abort the producer may write non-transactionally again.
    let plain = TestBatch::new(1, T0).producer(1, 3, 2).bytes();
    append(&mut log, plain, AppendOrigin::Client);
}

#[test]
fn kill_9_rebuilds_transactions_lso_and_index_from_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let log = scenario(dir.path());
    let before = txn_state(&log);
    let files = txn_index_files(dir.path());
    assert!(!files.is_empty());
    // kill -9: no close; also lose the index files a crash can lose: entries are
    // appended without fsync, and only a roll fsyncs the file of the segment it closes
    // (with a producer snapshot at the new segment, which a recovery starts from).
    let snapshots = ProducerStateManager::snapshot_offsets(dir.path()).unwrap();
    let durable_below = snapshots.last().copied().unwrap_or(i64::MIN);
    drop(log);
    let mut lost = 0;
    for f in &files {
        let base: i64 = f.file_stem().unwrap().to_str().unwrap().parse().unwrap();
        if base >= durable_below {
            fs::remove_file(f).unwrap();
            lost += 1;
        }
    }
    assert!(lost > 0, "the scenario has an ABORT in the last segments");
    let log = UnifiedLog::open(dir.path(), config(), T0, PreviousShutdown::Unclean).unwrap();
    assert_eq!(log.high_watermark(), 0, "no checkpoint was written");
    let mut log = log;
    log.update_high_watermark(log.log_end_offset());
    assert_eq!(txn_state(&log), before);
    assert_eq!(txn_index_files(dir.path()), files, "index files rewritten");
    // A clean close and open: from the snapshot and the index files, no replay.
    log.close().unwrap();
    let log = UnifiedLog::open(dir.path(), config(), T0, PreviousShutdown::Clean).unwrap();
    assert_eq!(txn_state(&log), before);
}

#[test]
fn a_clean_close_with_an_unreplicated_marker_keeps_the_lso_back() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = UnifiedLog::open(dir.path(), config(), T0, PreviousShutdown::Unclean).unwrap();
    append(&mut log, txn_batch(1, 0, 0, 2), AppendOrigin::Client);
    append(&mut log, marker(1, 0, 0, true), AppendOrigin::Coordinator);
    log.update_high_watermark(2);
    assert_eq!(log.last_stable_offset(), 0);
    log.close().unwrap();
    let mut log = UnifiedLog::open(dir.path(), config(), T0, PreviousShutdown::Clean).unwrap();
    assert_eq!(log.high_watermark(), 2);
    assert_eq!(log.last_stable_offset(), 0);
    log.update_high_watermark(3);
    assert_eq!(log.last_stable_offset(), 3);
}

#[test]
fn truncation_below_a_marker_reopens_its_transaction() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = scenario(dir.path());
    log.truncate_to(10, T0).unwrap();
    assert_eq!(log.ongoing_txns(), vec![(7, 3), (8, 2)]);
    assert_eq!(log.aborted_txns().len(), 1);
    log.truncate_to(6, T0).unwrap();
    assert_eq!(log.ongoing_txns(), vec![(3, 2)]);
    assert!(log.aborted_txns().is_empty());
    assert!(txn_index_files(dir.path()).is_empty());
    assert_eq!(log.last_stable_offset(), 3.min(log.high_watermark()));
}

#[test]
fn a_follower_copy_has_the_same_transaction_state() {
    let dir = tempfile::tempdir().unwrap();
    let leader = scenario(&dir.path().join("leader"));
    let mut follower = UnifiedLog::open(
        &dir.path().join("follower"),
        config(),
        T0,
        PreviousShutdown::Unclean,
    )
    .unwrap();
    let mut next = 0;
    while next < leader.log_end_offset() {
        let data = leader.read(next, 300, i64::MAX, true).unwrap();
        let info = follower.append_as_follower(data.records, T0).unwrap();
        next = info.last_offset + 1;
    }
    follower.update_high_watermark(follower.log_end_offset());
    assert_eq!(txn_state(&follower), txn_state(&leader));
    assert_eq!(
        txn_index_files(&dir.path().join("follower")).len(),
        txn_index_files(&dir.path().join("leader")).len()
    );
}

#[test]
fn retention_drops_the_index_of_deleted_segments() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = scenario(dir.path());
    assert!(log.segment_count() > 1, "the scenario spans segments");
    let second = log.segment_base_offsets()[1];
    log.update_high_watermark(log.log_end_offset());
    log.maybe_increment_log_start_offset(second).unwrap();
    let kept: Vec<_> = log.aborted_txns().iter().map(|t| t.last_offset).collect();
    assert!(kept.iter().all(|&o| o >= second), "{kept:?}");
}

fn txn_index_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == TXN_INDEX_FILE_SUFFIX))
        .collect();
    v.sort();
    v
}

#[test]
fn idle_producers_without_an_open_transaction_are_forgotten() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = UnifiedLog::open(dir.path(), config(), T0, PreviousShutdown::Unclean).unwrap();
    // Producer 1 is idempotent, producer 2 leaves a transaction open; both wrote at T0.
    append(
        &mut log,
        TestBatch::new(1, T0).producer(1, 0, 0).bytes(),
        AppendOrigin::Client,
    );
    append(&mut log, txn_batch(2, 0, 0, 1), AppendOrigin::Client);
    assert_eq!(log.remove_expired_producers(T0 + 999, 1000), 0);
    assert_eq!(log.remove_expired_producers(T0 + 1000, 1000), 1);
    assert!(log.producer_state(1).is_none());
    assert!(log.producer_state(2).is_some(), "its transaction is open");
    assert_eq!(log.ongoing_txns(), vec![(1, 2)]);

    // Once the transaction has ended, the producer is forgotten like any other.
    append(&mut log, marker(2, 0, 1, false), AppendOrigin::Coordinator);
    assert_eq!(log.remove_expired_producers(T0 + 1000, 1000), 1);
    assert!(log.active_producers().is_empty());
    assert!(log.ongoing_txns().is_empty());
}

mod replay_equals_live {
    //! Whatever the order of transactional batches, plain batches, markers and high
    //! watermark moves, the state a log builds while appending is the state a kill -9
    //! rebuild and a follower's copy build from the same bytes.

    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Op {
        Txn { producer: i64, records: usize },
        Plain { records: usize },
        Marker { producer: i64, commit: bool },
        HighWatermark,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (1..4i64, 1..4usize).prop_map(|(producer, records)| Op::Txn { producer, records }),
            1 => (1..3usize).prop_map(|records| Op::Plain { records }),
            2 => (1..4i64, any::<bool>()).prop_map(|(producer, commit)| Op::Marker { producer, commit }),
            1 => Just(Op::HighWatermark),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        #[test]
        fn rebuilt_state_matches(ops in proptest::collection::vec(op(), 1..40)) {
            let dir = tempfile::tempdir().unwrap();
            let mut log =
                UnifiedLog::open(&dir.path().join("l"), config(), T0, PreviousShutdown::Unclean).unwrap();
            let mut sequences = std::collections::HashMap::new();
            for op in &ops {
                match *op {
                    Op::Txn { producer, records } => {
                        let seq = sequences.entry(producer).or_insert(0i32);
                        let values = TestBatch::new(records, T0).producer(producer, 0, *seq);
                        let mut b = values;
                        b.attributes |= 0x10;
                        append(&mut log, b.bytes(), AppendOrigin::Client);
                        *seq += records as i32;
                    }
                    Op::Plain { records } => {
                        append(&mut log, TestBatch::new(records, T0).bytes(), AppendOrigin::Client);
                    }
                    Op::Marker { producer, commit } => {
                        append(&mut log, marker(producer, 0, 1, commit), AppendOrigin::Coordinator);
                    }
                    Op::HighWatermark => {
                        log.update_high_watermark(log.log_end_offset());
                    }
                }
                prop_assert!(log.last_stable_offset() <= log.high_watermark());
            }
            let hw = log.high_watermark();
            let live = txn_state(&log);
            for t in log.aborted_txns() {
                prop_assert!(t.first_offset <= t.last_offset && t.last_offset < t.last_stable_offset.max(t.last_offset + 1));
            }

            let mut follower = UnifiedLog::open(&dir.path().join("f"), config(), T0, PreviousShutdown::Unclean).unwrap();
            let mut next = 0;
            while next < log.log_end_offset() {
                let data = log.read(next, 500, i64::MAX, true).unwrap();
                next = follower.append_as_follower(data.records, T0).unwrap().last_offset + 1;
            }
            follower.update_high_watermark(hw);
            prop_assert_eq!(txn_state(&follower), live.clone());

            drop(log); // kill -9
            let mut rebuilt =
                UnifiedLog::open(&dir.path().join("l"), config(), T0, PreviousShutdown::Unclean).unwrap();
            rebuilt.update_high_watermark(hw);
            prop_assert_eq!(txn_state(&rebuilt), live.clone());
            rebuilt.close().unwrap();
            let reopened =
                UnifiedLog::open(&dir.path().join("l"), config(), T0, PreviousShutdown::Clean).unwrap();
            prop_assert_eq!(txn_state(&reopened), live);
        }
    }
}

/// A client append that must pass KIP-890's verification, with `guard`.
fn append_verified(
    log: &mut UnifiedLog,
    records: Bytes,
    guard: Option<u64>,
) -> Result<LogAppendInfo, AppendError> {
    let config = log.config_for_append().unwrap();
    let mut validated =
        UnifiedLog::validate_records(&config, &records, AppendOrigin::Client, T0).unwrap();
    validated.require_txn_verification(guard);
    log.append_validated_as_leader(validated, 0, T0)
        .map(|(info, _)| info)
}

#[test]
fn a_verified_append_needs_the_producers_current_guard_to_open_a_transaction() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = UnifiedLog::open(dir.path(), config(), T0, PreviousShutdown::Unclean).unwrap();
    // No guard: the batch would open a transaction nobody verified.
    assert!(matches!(
        append_verified(&mut log, txn_batch(1, 0, 0, 2), None),
        Err(AppendError::InvalidTxnState { producer_id: 1, .. })
    ));
    // A guard of another producer does not do either.
    let other = log
        .start_txn_verification(2, 0, false, T0)
        .unwrap()
        .unwrap();
    assert!(append_verified(&mut log, txn_batch(1, 0, 0, 2), Some(other)).is_err());
    let guard = log
        .start_txn_verification(1, 0, false, T0)
        .unwrap()
        .unwrap();
    // A second verification while the first is under way shares its guard.
    assert_eq!(
        log.start_txn_verification(1, 0, false, T0).ok(),
        Some(Some(guard))
    );
    assert_eq!(
        append_verified(&mut log, txn_batch(1, 0, 0, 2), Some(guard))
            .unwrap()
            .first_offset,
        0
    );
    // The transaction is open: nothing more to verify, any batch of it goes in.
    assert_eq!(log.start_txn_verification(1, 0, false, T0).ok(), Some(None));
    assert_eq!(
        append_verified(&mut log, txn_batch(1, 0, 2, 1), None)
            .unwrap()
            .first_offset,
        2
    );
    // The guard was used up by the transaction it let open.
    append(&mut log, marker(1, 0, 0, true), AppendOrigin::Coordinator);
    assert!(append_verified(&mut log, txn_batch(1, 0, 3, 1), Some(guard)).is_err());
    // Unverified appends (verification off, coordinator appends) are as before.
    append(&mut log, txn_batch(3, 0, 0, 1), AppendOrigin::Client);
    assert_eq!(log.ongoing_txns(), vec![(4, 3)]);
}

#[test]
fn a_marker_between_verification_and_append_voids_the_guard() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = UnifiedLog::open(dir.path(), config(), T0, PreviousShutdown::Unclean).unwrap();
    let guard = log
        .start_txn_verification(1, 0, false, T0)
        .unwrap()
        .unwrap();
    // The coordinator aborted the transaction meanwhile: its marker reaches the partition
    // before the verified batch does, which must not open a transaction after it.
    append(&mut log, marker(1, 0, 0, false), AppendOrigin::Coordinator);
    assert!(matches!(
        append_verified(&mut log, txn_batch(1, 0, 0, 1), Some(guard)),
        Err(AppendError::InvalidTxnState { producer_id: 1, .. })
    ));
    assert_eq!(log.ongoing_txns(), vec![]);
    // A verification that never led to an append expires with the producers.
    let stale = log
        .start_txn_verification(2, 0, false, T0)
        .unwrap()
        .unwrap();
    log.remove_expired_producers(T0 + 10, 10);
    assert!(append_verified(&mut log, txn_batch(2, 0, 0, 1), Some(stale)).is_err());
}

#[test]
fn tv2_the_marker_at_the_next_transactions_epoch_leaves_its_verification_standing() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = UnifiedLog::open(dir.path(), config(), T0, PreviousShutdown::Unclean).unwrap();
    let guard = log.start_txn_verification(1, 0, true, T0).unwrap().unwrap();
    append_verified(&mut log, txn_batch(1, 0, 0, 2), Some(guard)).unwrap();
    // The producer was told epoch 1 at its commit and verifies its next batch at epoch 1
    // before the commit's marker (at epoch 1) reaches the partition.
    let next = log.start_txn_verification(1, 1, true, T0).unwrap().unwrap();
    append(&mut log, marker(1, 1, 0, true), AppendOrigin::Coordinator);
    assert_eq!(log.ongoing_txns(), vec![]);
    // The marker was the last transaction's: the next one's verification still holds, and
    // its first batch starts at sequence 0.
    assert_eq!(
        append_verified(&mut log, txn_batch(1, 1, 0, 1), Some(next))
            .unwrap()
            .first_offset,
        3
    );
    // A zombie of the ended transaction, at its old epoch, is fenced before the
    // coordinator is asked, and refused by the append too.
    assert!(matches!(
        log.start_txn_verification(1, 0, true, T0),
        Err(AppendError::InvalidProducerEpoch {
            producer_id: 1,
            current: 1,
            found: 0
        })
    ));
    let zombie = log.append_as_leader(txn_batch(1, 0, 2, 1), 0, AppendOrigin::Client, T0);
    assert!(
        matches!(
            zombie,
            Err(AppendError::InvalidProducerEpoch { producer_id: 1, .. })
        ),
        "{zombie:?}"
    );
    // Transaction version 1 keeps voiding on any marker (as before).
    let v1 = log
        .start_txn_verification(5, 0, false, T0)
        .unwrap()
        .unwrap();
    append(&mut log, marker(5, 0, 0, false), AppendOrigin::Coordinator);
    assert!(append_verified(&mut log, txn_batch(5, 0, 0, 1), Some(v1)).is_err());
}

#[test]
fn tv2_a_producer_without_state_here_must_start_at_sequence_0() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = UnifiedLog::open(dir.path(), config(), T0, PreviousShutdown::Unclean).unwrap();
    let guard = log.start_txn_verification(1, 3, true, T0).unwrap().unwrap();
    assert!(matches!(
        append_verified(&mut log, txn_batch(1, 3, 5, 1), Some(guard)),
        Err(AppendError::OutOfOrderSequence {
            expected: 0,
            found: 5,
            ..
        })
    ));
    assert_eq!(
        append_verified(&mut log, txn_batch(1, 3, 0, 1), Some(guard))
            .unwrap()
            .first_offset,
        0
    );
}
