//! The share-partition state machine with an injected clock: acquisition, acknowledgement,
//! lock expiry, the delivery limit, the in-flight cap and rebuilds from persisted state.

use rill_protocol::{ErrorCode, Uuid};

use crate::*;
use AcknowledgeType::*;
use RecordState::*;

const LOCK_MS: i64 = 30_000;

fn config() -> SharePartitionConfig {
    SharePartitionConfig {
        record_lock_duration_ms: LOCK_MS,
        delivery_count_limit: 3,
        partition_max_record_locks: 100,
    }
}

fn topic() -> Uuid {
    Uuid::from_u64_pair(7, 7)
}

fn fresh(config: SharePartitionConfig) -> SharePartition {
    let none = PersistedState {
        state_epoch: 0,
        start_offset: -1,
        state_batches: vec![],
    };
    SharePartition::from_persisted("g", topic(), 0, config, 1, &none, 0).unwrap()
}

/// A log of batches of `size` records from offset 0 to `end` (exclusive).
fn log(end: i64, size: i64) -> Vec<FetchedBatch> {
    (0..end)
        .step_by(size as usize)
        .map(|b| FetchedBatch {
            base_offset: b,
            last_offset: (b + size - 1).min(end - 1),
        })
        .collect()
}

/// Reads `log` from the share-partition's next fetch offset, as the broker does, and
/// acquires for `member`.
fn fetch(
    sp: &mut SharePartition,
    log: &[FetchedBatch],
    member: &str,
    max: i32,
    now: i64,
) -> crate::Acquired {
    fetch_with(
        sp,
        log,
        member,
        max,
        ShareAcquireMode::BatchOptimized,
        &[],
        now,
    )
}

fn fetch_with(
    sp: &mut SharePartition,
    log: &[FetchedBatch],
    member: &str,
    max: i32,
    mode: ShareAcquireMode,
    skip: &[OffsetRange],
    now: i64,
) -> crate::Acquired {
    let from = sp.next_fetch_offset();
    let read: Vec<FetchedBatch> = log
        .iter()
        .copied()
        .filter(|b| b.last_offset >= from)
        .collect();
    sp.acquire(
        member,
        &ShareFetch {
            fetch_offset: from,
            batches: &read,
            max_records: max,
            acquire_mode: mode,
            skip,
        },
        now,
    )
}

fn acq(first: i64, last: i64, count: i16) -> AcquiredRecords {
    AcquiredRecords {
        first_offset: first,
        last_offset: last,
        delivery_count: count,
    }
}

fn ack(first: i64, last: i64, ty: AcknowledgeType) -> AcknowledgementBatch {
    AcknowledgementBatch::new(first, last, ty)
}

fn sb(first: i64, last: i64, s: RecordState, c: i16) -> StateBatch {
    StateBatch::new(first, last, s, c)
}

#[test]
fn acquire_takes_whole_batches_with_a_lock_and_a_first_delivery() {
    let mut sp = fresh(config());
    let log = log(30, 10);
    let a = fetch(&mut sp, &log, "m1", 15, 1_000);
    // Soft limit: the second batch is taken whole.
    assert_eq!(a.records, vec![acq(0, 19, 1)]);
    assert_eq!(a.write, None, "acquisition is never persisted");
    assert_eq!(
        (sp.start_offset(), sp.end_offset(), sp.next_fetch_offset()),
        (0, 20, 20)
    );
    assert_eq!(sp.next_deadline(), Some(1_000 + LOCK_MS));
    // Another member gets the rest, not what m1 holds.
    let b = fetch(&mut sp, &log, "m2", 100, 2_000);
    assert_eq!(b.records, vec![acq(20, 29, 1)]);
    assert!(fetch(&mut sp, &log, "m3", 100, 3_000).records.is_empty());
}

#[test]
fn record_limit_mode_acquires_exactly_max_records() {
    let mut sp = fresh(config());
    let log = log(30, 10);
    let a = fetch_with(
        &mut sp,
        &log,
        "m1",
        15,
        ShareAcquireMode::RecordLimit,
        &[],
        0,
    );
    assert_eq!(a.records, vec![acq(0, 14, 1)]);
    assert_eq!(sp.next_fetch_offset(), 15);
    let b = fetch_with(
        &mut sp,
        &log,
        "m2",
        3,
        ShareAcquireMode::RecordLimit,
        &[],
        0,
    );
    assert_eq!(b.records, vec![acq(15, 17, 1)]);
}

#[test]
fn lock_timeout_redelivers_with_the_next_delivery_count() {
    let mut sp = fresh(config());
    let log = log(10, 10);
    fetch(&mut sp, &log, "m1", 100, 0);
    assert_eq!(sp.expire(LOCK_MS - 1), Expired::default(), "not yet");
    let e = sp.expire(LOCK_MS);
    assert_eq!(e.available, vec![OffsetRange::new(0, 9)]);
    let w = e.write.unwrap();
    assert_eq!(w.state_batches, vec![sb(0, 9, Available, 1)]);
    assert_eq!((w.start_offset, w.leader_epoch), (0, 1));
    assert_eq!(sp.next_deadline(), None);
    // Delivered again, to anyone, counted.
    let a = fetch(&mut sp, &log, "m2", 100, LOCK_MS + 1);
    assert_eq!(a.records, vec![acq(0, 9, 2)]);
    // The first holder's lock is gone: its late acknowledgement is refused.
    let err = sp
        .acknowledge("m1", &[ack(0, 9, Accept)], LOCK_MS + 2)
        .unwrap_err();
    assert_eq!(err.error_code(), ErrorCode::INVALID_RECORD_STATE);
}

#[test]
fn delivery_limit_then_archive() {
    let mut sp = fresh(config());
    let log = log(1, 1);
    let mut now = 0;
    for delivery in 1..=3 {
        let a = fetch(&mut sp, &log, "m", 100, now);
        assert_eq!(a.records, vec![acq(0, 0, delivery)]);
        now += LOCK_MS;
        let e = sp.expire(now);
        if delivery < 3 {
            assert_eq!(e.available, vec![OffsetRange::new(0, 0)]);
        } else {
            // The third lock timeout archives it: the start offset moves past.
            assert!(e.available.is_empty());
            let w = e.write.unwrap();
            assert_eq!(w.start_offset, 1);
            assert_eq!(w.state_batches, vec![]);
        }
    }
    assert_eq!(sp.start_offset(), 1);
    assert!(fetch(&mut sp, &log, "m", 100, now).records.is_empty());
}

#[test]
fn records_near_the_delivery_limit_go_out_in_smaller_groups_then_alone() {
    // Limit 5: throttled from the third delivery on (max(2, ceil(5 / 2))).
    let mut sp = fresh(SharePartitionConfig {
        delivery_count_limit: 5,
        ..config()
    });
    let log = log(10, 10);
    let mut now = 0;
    for delivery in 1..=3 {
        assert_eq!(
            fetch(&mut sp, &log, "m", 100, now).records,
            vec![acq(0, 9, delivery)]
        );
        now += LOCK_MS;
        sp.expire(now);
    }
    // Fourth delivery: half the run at a time; what follows waits for another fetch.
    assert_eq!(
        fetch(&mut sp, &log, "m1", 100, now).records,
        vec![acq(0, 4, 4)]
    );
    assert_eq!(
        fetch(&mut sp, &log, "m2", 100, now).records,
        vec![acq(5, 6, 4)]
    );
    now += LOCK_MS;
    sp.expire(now);
    // 7..9 were delivered three times, 0..6 four: the next fetch takes 0 alone, on its last
    // delivery, and so one at a time until 0..6 are done.
    for offset in 0..7 {
        assert_eq!(
            fetch(&mut sp, &log, "m", 100, now).records,
            vec![acq(offset, offset, 5)]
        );
    }
    // Then 7..9, a run of three on its fourth delivery: 3 >> 1 records at a time.
    assert_eq!(
        fetch(&mut sp, &log, "m", 100, now).records,
        vec![acq(7, 7, 4)]
    );
}

#[test]
fn release_redelivers_and_at_the_limit_archives() {
    let mut sp = fresh(config());
    let log = log(1, 1);
    fetch(&mut sp, &log, "m1", 100, 0);
    let w = sp
        .acknowledge("m1", &[ack(0, 0, Release)], 10)
        .unwrap()
        .unwrap();
    assert_eq!(w.state_batches, vec![sb(0, 0, Available, 1)]);
    assert_eq!(
        fetch(&mut sp, &log, "m2", 100, 20).records,
        vec![acq(0, 0, 2)]
    );
    sp.acknowledge("m2", &[ack(0, 0, Release)], 30).unwrap();
    assert_eq!(
        fetch(&mut sp, &log, "m1", 100, 40).records,
        vec![acq(0, 0, 3)]
    );
    // The third delivery was the last: a release now archives.
    let w = sp
        .acknowledge("m1", &[ack(0, 0, Release)], 50)
        .unwrap()
        .unwrap();
    assert_eq!(w.start_offset, 1);
    assert_eq!(sp.start_offset(), 1);
    assert!(fetch(&mut sp, &log, "m2", 100, 60).records.is_empty());
}

#[test]
fn rejected_and_accepted_records_are_never_redelivered() {
    // Limit 2: no delivery is throttled, so every redelivery takes all that is left.
    let mut sp = fresh(SharePartitionConfig {
        delivery_count_limit: 2,
        ..config()
    });
    let log = log(10, 10);
    fetch(&mut sp, &log, "m1", 100, 0);
    let w = sp
        .acknowledge("m1", &[ack(2, 3, Reject), ack(5, 6, Accept)], 10)
        .unwrap()
        .unwrap();
    assert_eq!(
        w.state_batches,
        vec![sb(2, 3, Archived, 1), sb(5, 6, Acknowledged, 1)]
    );
    // Everything else times out and comes back, again and again; 2, 3, 5 and 6 never do.
    let mut now = LOCK_MS;
    for delivery in 2..=2 {
        sp.expire(now);
        let a = fetch(&mut sp, &log, "m2", 100, now);
        assert_eq!(
            a.records,
            vec![
                acq(0, 1, delivery),
                acq(4, 4, delivery),
                acq(7, 9, delivery)
            ]
        );
        now += LOCK_MS;
    }
    sp.expire(now);
    assert!(fetch(&mut sp, &log, "m2", 100, now).records.is_empty());
    assert_eq!(sp.start_offset(), 10);
}

#[test]
fn partial_acknowledgement_splits_a_batch_per_record() {
    let mut sp = fresh(config());
    let log = log(10, 10);
    fetch(&mut sp, &log, "m1", 100, 0);
    // One type per offset.
    let batch = AcknowledgementBatch {
        first_offset: 0,
        last_offset: 3,
        acknowledge_types: vec![Accept, Release, Reject, Accept],
    };
    let w = sp.acknowledge("m1", &[batch], 5).unwrap().unwrap();
    assert_eq!(
        w.state_batches,
        vec![
            sb(1, 1, Available, 1),
            sb(2, 2, Archived, 1),
            sb(3, 3, Acknowledged, 1)
        ]
    );
    assert_eq!(sp.start_offset(), 1, "0 is accepted, 1 is available again");
    assert_eq!(
        w.delivery_complete_count, 2,
        "2 and 3 are done, 0 is below the start"
    );
    let runs = sp.in_flight();
    assert_eq!(
        runs.iter()
            .map(|r| (r.first_offset, r.last_offset, r.state))
            .collect::<Vec<_>>(),
        vec![
            (1, 1, Available),
            (2, 2, Archived),
            (3, 3, Acknowledged),
            (4, 9, Acquired)
        ]
    );
    // The rest of the batch is still m1's.
    sp.acknowledge("m1", &[ack(4, 9, Accept)], 6).unwrap();
    assert_eq!(sp.start_offset(), 1);
    assert_eq!(
        fetch(&mut sp, &log, "m2", 100, 7).records,
        vec![acq(1, 1, 2)]
    );
    sp.acknowledge("m2", &[ack(1, 1, Accept)], 8).unwrap();
    assert_eq!((sp.start_offset(), sp.end_offset()), (10, 10));
    assert!(sp.in_flight().is_empty());
}

#[test]
fn acknowledgements_of_records_not_held_change_nothing() {
    let mut sp = fresh(config());
    let log = log(10, 5);
    fetch(&mut sp, &log, "m1", 5, 0);
    fetch(&mut sp, &log, "m2", 5, 0);
    let before = sp.in_flight();
    let wrong_member = sp.acknowledge("m1", &[ack(0, 4, Accept), ack(5, 5, Accept)], 1);
    assert_eq!(
        wrong_member.unwrap_err().error_code(),
        ErrorCode::INVALID_RECORD_STATE
    );
    assert_eq!(
        sp.in_flight(),
        before,
        "the valid first batch was not applied either"
    );
    let past_end = sp.acknowledge("m1", &[ack(8, 12, Accept)], 1);
    assert_eq!(
        past_end.unwrap_err().error_code(),
        ErrorCode::INVALID_REQUEST
    );
    let overlapping = sp.acknowledge("m1", &[ack(0, 2, Accept), ack(2, 4, Accept)], 1);
    assert_eq!(
        overlapping.unwrap_err().error_code(),
        ErrorCode::INVALID_REQUEST
    );
    let miscounted = AcknowledgementBatch {
        first_offset: 0,
        last_offset: 4,
        acknowledge_types: vec![Accept, Accept],
    };
    assert_eq!(
        sp.acknowledge("m1", &[miscounted], 1)
            .unwrap_err()
            .error_code(),
        ErrorCode::INVALID_REQUEST
    );
    assert_eq!(
        AcknowledgeType::try_from(9).unwrap_err().error_code(),
        ErrorCode::INVALID_REQUEST
    );
    assert_eq!(sp.in_flight(), before);
    // Accepting twice: the second is refused, the record stays accepted.
    sp.acknowledge("m1", &[ack(0, 1, Accept)], 2).unwrap();
    sp.acknowledge("m1", &[ack(3, 3, Accept)], 2).unwrap();
    let again = sp.acknowledge("m1", &[ack(3, 3, Reject)], 3);
    assert_eq!(
        again.unwrap_err().error_code(),
        ErrorCode::INVALID_RECORD_STATE
    );
    assert_eq!(sp.record_state(3), Some((Acknowledged, 1)));
    // Below the start offset: already done, nothing to say.
    assert_eq!(sp.acknowledge("m1", &[ack(0, 1, Reject)], 4), Ok(None));
}

#[test]
fn in_flight_records_are_capped() {
    let mut sp = fresh(SharePartitionConfig {
        partition_max_record_locks: 25,
        ..config()
    });
    let log = log(100, 10);
    let a = fetch(&mut sp, &log, "m1", 1_000, 0);
    // The cap cuts inside the third batch.
    assert_eq!(a.records, vec![acq(0, 24, 1)]);
    assert!(!sp.can_acquire());
    assert!(fetch(&mut sp, &log, "m2", 1_000, 0).records.is_empty());
    // Accepting the first ten moves the window.
    sp.acknowledge("m1", &[ack(0, 9, Accept)], 1).unwrap();
    assert!(sp.can_acquire());
    assert_eq!(
        fetch(&mut sp, &log, "m2", 1_000, 2).records,
        vec![acq(25, 34, 1)]
    );
    // Accepting from the middle does not: the start offset has not moved.
    sp.acknowledge("m2", &[ack(25, 34, Accept)], 3).unwrap();
    assert_eq!(sp.start_offset(), 10);
    assert!(fetch(&mut sp, &log, "m2", 1_000, 4).records.is_empty());
}

#[test]
fn start_offset_advances_past_a_contiguous_acknowledged_prefix_only() {
    let mut sp = fresh(config());
    let log = log(30, 10);
    fetch(&mut sp, &log, "m1", 10, 0);
    fetch(&mut sp, &log, "m2", 10, 0);
    fetch(&mut sp, &log, "m3", 10, 0);
    sp.acknowledge("m2", &[ack(10, 19, Accept)], 1).unwrap();
    sp.acknowledge("m3", &[ack(20, 29, Reject)], 1).unwrap();
    assert_eq!(sp.start_offset(), 0);
    let w = sp
        .acknowledge("m1", &[ack(0, 9, Accept)], 2)
        .unwrap()
        .unwrap();
    assert_eq!((sp.start_offset(), w.start_offset), (30, 30));
    assert_eq!(
        w.state_batches,
        vec![],
        "what is below the start offset is not written"
    );
}

#[test]
fn renew_extends_the_lock_of_the_holder_only() {
    let mut sp = fresh(config());
    let log = log(10, 10);
    fetch(&mut sp, &log, "m1", 100, 0);
    assert_eq!(
        sp.acknowledge("m1", &[ack(0, 4, Renew)], 20_000),
        Ok(None),
        "a renew is not persisted"
    );
    assert_eq!(
        sp.acknowledge("m2", &[ack(0, 4, Renew)], 20_000)
            .unwrap_err()
            .error_code(),
        ErrorCode::INVALID_RECORD_STATE
    );
    // 5..9 expire at 30 s, 0..4 at 50 s.
    let e = sp.expire(LOCK_MS);
    assert_eq!(e.available, vec![OffsetRange::new(5, 9)]);
    assert_eq!(sp.record_state(0), Some((Acquired, 1)));
    assert_eq!(sp.next_deadline(), Some(20_000 + LOCK_MS));
    sp.acknowledge("m1", &[ack(0, 4, Accept)], 45_000).unwrap();
    assert_eq!(sp.start_offset(), 5);
    // Renewing what is not acquired at all is refused too.
    assert_eq!(
        sp.acknowledge("m1", &[ack(5, 5, Renew)], 46_000)
            .unwrap_err()
            .error_code(),
        ErrorCode::INVALID_RECORD_STATE
    );
}

#[test]
fn a_member_that_leaves_gives_its_records_back_uncounted() {
    let mut sp = fresh(config());
    let log = log(20, 10);
    fetch(&mut sp, &log, "m1", 10, 0);
    fetch(&mut sp, &log, "m2", 10, 0);
    let w = sp.release_member("m1").unwrap();
    assert_eq!(w.state_batches, vec![sb(0, 9, Available, 0)]);
    assert_eq!(sp.release_member("m1"), None);
    assert_eq!(
        sp.record_state(12),
        Some((Acquired, 1)),
        "m2 keeps its records"
    );
    assert_eq!(
        fetch(&mut sp, &log, "m3", 100, 1).records,
        vec![acq(0, 9, 1)]
    );
}

#[test]
fn skipped_and_missing_offsets_are_archived_not_delivered() {
    let mut sp = fresh(config());
    // Offsets 10..19 were compacted away; 3..4 are an aborted transaction, 9 its marker.
    let log = vec![
        FetchedBatch {
            base_offset: 0,
            last_offset: 9,
        },
        FetchedBatch {
            base_offset: 20,
            last_offset: 29,
        },
    ];
    let skip = [OffsetRange::new(3, 4), OffsetRange::new(9, 9)];
    let a = fetch_with(
        &mut sp,
        &log,
        "m1",
        100,
        ShareAcquireMode::BatchOptimized,
        &skip,
        0,
    );
    assert_eq!(a.records, vec![acq(0, 2, 1), acq(5, 8, 1), acq(20, 29, 1)]);
    let w = a.write.unwrap();
    assert_eq!(
        w.state_batches,
        vec![sb(3, 4, Archived, 0), sb(9, 19, Archived, 0)]
    );
    sp.acknowledge("m1", &[ack(0, 2, Accept), ack(5, 8, Accept)], 1)
        .unwrap();
    assert_eq!(sp.start_offset(), 20);
}

#[test]
fn rebuild_keeps_acknowledgements_and_releases_what_was_acquired() {
    let mut sp = fresh(config());
    let log = log(40, 10);
    fetch(&mut sp, &log, "m1", 10, 0);
    fetch(&mut sp, &log, "m2", 10, 0);
    fetch(&mut sp, &log, "m3", 10, 0);
    // The persister sees every write, as a coordinator would combine them.
    let mut persisted: Vec<StateBatch> = Vec::new();
    let mut start = 0;
    let mut persist = |w: Option<StateWrite>| {
        if let Some(w) = w {
            persisted = combine(&persisted, &w.state_batches, w.start_offset);
            start = w.start_offset;
        }
    };
    persist(
        sp.acknowledge("m2", &[ack(10, 14, Accept), ack(15, 19, Release)], 1)
            .unwrap(),
    );
    persist(sp.expire(LOCK_MS).write);
    // m3's 20..29 timed out and were acquired again: that second acquisition is not persisted.
    fetch(&mut sp, &log, "m4", 1_000, LOCK_MS);
    assert_eq!(sp.record_state(20), Some((Acquired, 2)));
    // The leader dies; a new one (leader epoch 2) reads what was persisted.
    let state = PersistedState {
        state_epoch: 0,
        start_offset: start,
        state_batches: persisted.clone(),
    };
    let mut sp2 =
        SharePartition::from_persisted("g", topic(), 0, config(), 2, &state, 999).unwrap();
    assert_eq!(sp2.start_offset(), 0);
    assert_eq!(sp2.end_offset(), 30);
    assert_eq!(
        sp2.record_state(12),
        Some((Acknowledged, 1)),
        "accepted stays accepted"
    );
    assert_eq!(
        sp2.record_state(16),
        Some((Available, 1)),
        "released stays available"
    );
    assert_eq!(
        sp2.record_state(25),
        Some((Available, 1)),
        "acquired comes back available"
    );
    assert_eq!(sp2.record_state(5), Some((Available, 1)));
    // Everything but the accepted records is delivered again, counted from what was persisted.
    let a = fetch(&mut sp2, &log, "m5", 1_000, LOCK_MS + 1);
    assert_eq!(
        a.records,
        vec![acq(0, 9, 2), acq(15, 29, 2), acq(30, 39, 1)]
    );
}

#[test]
fn rebuild_fills_gaps_between_persisted_batches_with_undelivered_records() {
    let state = PersistedState {
        state_epoch: 3,
        start_offset: 100,
        state_batches: vec![sb(100, 101, Acknowledged, 1), sb(105, 106, Archived, 2)],
    };
    let mut sp = SharePartition::from_persisted("g", topic(), 0, config(), 4, &state, 0).unwrap();
    assert_eq!(
        (sp.start_offset(), sp.end_offset(), sp.state_epoch()),
        (102, 107, 3)
    );
    assert_eq!(sp.next_fetch_offset(), 102);
    let log = log(200, 50);
    let a = fetch(&mut sp, &log, "m", 40, 0);
    assert_eq!(a.records, vec![acq(102, 104, 1), acq(107, 149, 1)]);
    // Persisted batches below the start offset, or overlapping, describe no share-partition.
    let bad = PersistedState {
        state_epoch: 0,
        start_offset: 10,
        state_batches: vec![sb(5, 12, Archived, 1)],
    };
    let err = SharePartition::from_persisted("g", topic(), 0, config(), 1, &bad, 0).unwrap_err();
    assert_eq!(err.error_code(), ErrorCode::UNKNOWN_SERVER_ERROR);
    let to_the_end = PersistedState {
        state_epoch: 0,
        start_offset: 10,
        state_batches: vec![sb(10, i64::MAX, Available, 1)],
    };
    assert!(SharePartition::from_persisted("g", topic(), 0, config(), 1, &to_the_end, 0).is_err());
}

#[test]
fn nothing_persisted_starts_at_the_reset_offset() {
    let none = PersistedState {
        state_epoch: 0,
        start_offset: -1,
        state_batches: vec![],
    };
    let mut sp = SharePartition::from_persisted("g", topic(), 0, config(), 1, &none, 42).unwrap();
    assert_eq!((sp.start_offset(), sp.next_fetch_offset()), (42, 42));
    // The broker reads from the batch holding 42.
    let a = fetch(&mut sp, &log(60, 10), "m", 5, 0);
    assert_eq!(a.records, vec![acq(42, 49, 1)]);
}

#[test]
fn log_start_offset_moving_forgets_what_it_passes() {
    let mut sp = fresh(config());
    let log = log(20, 10);
    fetch(&mut sp, &log, "m1", 100, 0);
    let w = sp.log_start_offset_moved(15).unwrap();
    assert_eq!(w.start_offset, 15);
    assert_eq!(sp.start_offset(), 15);
    // Acknowledging what is gone is a no-op, what is left is still m1's.
    assert_eq!(sp.acknowledge("m1", &[ack(0, 9, Accept)], 1), Ok(None));
    sp.acknowledge("m1", &[ack(10, 19, Accept)], 1).unwrap();
    assert_eq!(sp.start_offset(), 20);
}

proptest::proptest! {
    /// Whatever a client sends, acknowledging never panics, and a refusal changes nothing.
    #[test]
    fn hostile_acknowledgements_never_panic_and_refusals_change_nothing(
        batches in proptest::collection::vec(
            (proptest::num::i64::ANY, 0i64..40, proptest::collection::vec(0i8..6, 1..4)),
            0..5,
        ),
        near in proptest::bool::ANY,
    ) {
        let mut sp = fresh(config());
        fetch(&mut sp, &log(30, 10), "m", 20, 0);
        let batches: Vec<AcknowledgementBatch> = batches
            .into_iter()
            .map(|(first, len, types)| {
                // Offsets near the in-flight records, or anywhere at all.
                let first = if near { first.rem_euclid(40) } else { first };
                AcknowledgementBatch {
                    first_offset: first,
                    last_offset: first.saturating_add(len),
                    acknowledge_types: types
                        .into_iter()
                        .map(|t| AcknowledgeType::try_from(t).unwrap_or(Accept))
                        .collect(),
                }
            })
            .collect();
        let before = sp.in_flight();
        if sp.acknowledge("m", &batches, 1).is_err() {
            proptest::prop_assert_eq!(sp.in_flight(), before);
        }
    }
}
