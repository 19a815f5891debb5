//! The share coordinator through a harness that plays the coordinator runtime: it appends
//! each write's records to an in-memory log, can hold the high watermark back
//! (`commit_up_to`, STYLE.md example 8), and replays the log into a new coordinator as a
//! failover would.

use std::collections::BTreeMap;

use proptest::prelude::*;
use rill_protocol::{ErrorCode, Uuid};

use crate::*;
use RecordState::*;

struct Harness {
    config: ShareCoordinatorConfig,
    c: ShareCoordinator,
    /// The `__share_group_state` partitions' logs.
    log: BTreeMap<i32, Vec<ShareCoordinatorRecord>>,
    hw: BTreeMap<i32, i64>,
    /// Replies held until their write commits.
    held: Vec<(WriteId, Response)>,
}

impl Harness {
    fn new(config: ShareCoordinatorConfig) -> Self {
        let mut c = ShareCoordinator::new(config.clone());
        for p in 0..config.state_topic_num_partitions {
            c.load_start(p);
            c.load_done(p, 0);
        }
        Harness {
            config,
            c,
            log: BTreeMap::new(),
            hw: BTreeMap::new(),
            held: Vec::new(),
        }
    }

    /// A call: its answer now, or `None` while its write is held.
    fn call(&mut self, request: Request, now: i64) -> Option<Response> {
        match self.c.handle(request, now) {
            Output::Reply(r) => Some(r),
            Output::Persist {
                write,
                partition,
                records,
                reply,
            } => {
                let log = self.log.entry(partition).or_default();
                log.extend(records);
                let end = log.len() as i64;
                self.c.appended(write, partition, end);
                self.held.push((write, reply));
                None
            }
        }
    }

    /// A call whose write commits at once.
    fn call_committed(&mut self, request: Request, now: i64) -> Response {
        let partition = self.c.partition_for(request.key());
        match self.call(request, now) {
            Some(r) => r,
            None => {
                let end = self.log.get(&partition).map_or(0, |l| l.len() as i64);
                let mut replies = self.commit_up_to(partition, end);
                assert_eq!(replies.len(), 1, "one held reply");
                replies.remove(0)
            }
        }
    }

    /// The coordinator's timer at `now`: its cold snapshots are appended and committed.
    fn tick(&mut self, now: i64) -> usize {
        let mut written = 0;
        for snap in self.c.tick(now) {
            let log = self.log.entry(snap.partition).or_default();
            written += snap.records.len();
            log.extend(snap.records);
            let end = log.len() as i64;
            self.c.appended(snap.write, snap.partition, end);
            self.commit_up_to(snap.partition, end);
        }
        written
    }

    fn commit_up_to(&mut self, partition: i32, offset: i64) -> Vec<Response> {
        self.hw.insert(partition, offset);
        let done = self.c.commit_up_to(partition, offset);
        let mut replies = Vec::new();
        self.held.retain(|(w, r)| {
            if done.contains(w) {
                replies.push(r.clone());
                false
            } else {
                true
            }
        });
        replies
    }

    /// A new coordinator that loads every partition from the log, as after a failover.
    fn failover(&self) -> ShareCoordinator {
        self.failover_pruned(&BTreeMap::new())
    }

    /// The same, after the records below `pruned[partition]` were deleted.
    fn failover_pruned(&self, pruned: &BTreeMap<i32, i64>) -> ShareCoordinator {
        let mut c = ShareCoordinator::new(self.config.clone());
        for p in 0..self.config.state_topic_num_partitions {
            c.load_start(p);
            let hw = self.hw.get(&p).copied().unwrap_or(0);
            let from = pruned.get(&p).copied().unwrap_or(0);
            for (offset, r) in self.log.get(&p).into_iter().flatten().enumerate() {
                let offset = offset as i64;
                if offset >= from {
                    c.replay(p, offset, r.clone(), offset < hw);
                }
            }
            c.load_done(p, 0);
        }
        c
    }
}

fn key(group: &str, partition: i32) -> SharePartitionKey {
    SharePartitionKey::new(group, Uuid::from_u64_pair(3, 9), partition)
}

fn sb(first: i64, last: i64, s: RecordState, c: i16) -> StateBatch {
    StateBatch::new(first, last, s, c)
}

fn write(
    k: &SharePartitionKey,
    leader_epoch: i32,
    start: i64,
    batches: Vec<StateBatch>,
) -> Request {
    Request::Write {
        key: k.clone(),
        state_epoch: 0,
        leader_epoch,
        start_offset: start,
        delivery_complete_count: batches
            .iter()
            .filter(|b| b.delivery_state.is_terminal())
            .map(|b| b.len() as i32)
            .sum(),
        state_batches: batches,
    }
}

fn read(k: &SharePartitionKey, leader_epoch: i32) -> Request {
    Request::Read {
        key: k.clone(),
        leader_epoch,
    }
}

fn read_ok(start: i64, batches: Vec<StateBatch>) -> Response {
    Response::Read {
        error: ErrorCode::NONE,
        state_epoch: 0,
        start_offset: start,
        state_batches: batches,
    }
}

const OK_WRITE: Response = Response::Write {
    error: ErrorCode::NONE,
};

#[test]
fn a_write_is_read_only_once_replicated() {
    let mut h = Harness::new(ShareCoordinatorConfig {
        state_topic_num_partitions: 3,
        ..Default::default()
    });
    let k = key("g", 0);
    let p = h.c.partition_for(&k);
    assert_eq!(
        h.call(read(&k, 0), 0),
        Some(read_ok(-1, vec![])),
        "nothing persisted"
    );
    assert_eq!(
        h.call(write(&k, 0, 0, vec![sb(0, 9, Acknowledged, 1)]), 1),
        None
    );
    assert_eq!(
        h.call(write(&k, 0, 0, vec![sb(10, 19, Available, 1)]), 2),
        None
    );
    // Written, not replicated: reads do not see it, decisions do.
    assert_eq!(h.call(read(&k, 0), 3), Some(read_ok(-1, vec![])));
    assert!(h.c.live_state(&k).is_some());
    // The first write commits: its reply goes, and reads see it alone.
    assert_eq!(h.commit_up_to(p, 1), vec![OK_WRITE]);
    assert_eq!(
        h.call(read(&k, 0), 4),
        Some(read_ok(0, vec![sb(0, 9, Acknowledged, 1)]))
    );
    assert_eq!(h.commit_up_to(p, 2), vec![OK_WRITE]);
    assert_eq!(
        h.call(read(&k, 0), 5),
        Some(read_ok(
            0,
            vec![sb(0, 9, Acknowledged, 1), sb(10, 19, Available, 1)]
        ))
    );
    // A failover before the second write replicated rebuilds it as pending.
    h.hw.insert(p, 1);
    let mut c = h.failover();
    assert_eq!(
        c.handle(read(&k, 0), 6),
        Output::Reply(read_ok(0, vec![sb(0, 9, Acknowledged, 1)]))
    );
    assert!(
        c.commit_up_to(p, 2).is_empty(),
        "loaded records have no write to answer"
    );
    assert_eq!(
        c.handle(read(&k, 0), 7),
        Output::Reply(read_ok(
            0,
            vec![sb(0, 9, Acknowledged, 1), sb(10, 19, Available, 1)]
        ))
    );
}

#[test]
fn updates_fold_into_a_snapshot_every_n_writes() {
    let mut h = Harness::new(ShareCoordinatorConfig {
        state_topic_num_partitions: 1,
        snapshot_update_records_per_snapshot: 3,
        ..Default::default()
    });
    let k = key("g", 0);
    for i in 0..9i64 {
        let start = i * 10;
        let r = h.call_committed(
            write(&k, 0, start, vec![sb(start + 10, start + 19, Available, 1)]),
            i,
        );
        assert_eq!(r, OK_WRITE);
    }
    let kinds: Vec<&str> = h.log[&0]
        .iter()
        .map(|r| match r {
            ShareCoordinatorRecord::ShareSnapshot { .. } => "S",
            ShareCoordinatorRecord::ShareUpdate { .. } => "U",
        })
        .collect();
    assert_eq!(kinds, ["S", "U", "U", "U", "S", "U", "U", "U", "S"]);
    // The last snapshot is the whole state: the replay of it alone agrees.
    let Some(ShareCoordinatorRecord::ShareSnapshot { value: Some(v), .. }) = h.log[&0].last()
    else {
        panic!("not a snapshot")
    };
    assert_eq!((v.snapshot_epoch, v.start_offset), (2, 80));
    assert_eq!(v.state_batches, vec![sb(80, 99, Available, 1)]);
    assert_eq!(h.failover().committed_keys(0), h.c.committed_keys(0));
    // Only the last snapshot and what follows it are needed.
    assert_eq!(h.c.last_redundant_offset(0), Some(8));
}

#[test]
fn leader_and_state_epochs_fence_stale_writers() {
    let mut h = Harness::new(ShareCoordinatorConfig {
        state_topic_num_partitions: 2,
        ..Default::default()
    });
    let k = key("g", 1);
    assert_eq!(h.call_committed(write(&k, 5, 0, vec![]), 0), OK_WRITE);
    assert_eq!(
        h.call_committed(write(&k, 4, 0, vec![]), 1).error_code(),
        ErrorCode::FENCED_LEADER_EPOCH
    );
    assert_eq!(
        h.call_committed(read(&k, 4), 1).error_code(),
        ErrorCode::FENCED_LEADER_EPOCH
    );
    // A new leader's read records its epoch before it is answered...
    let p = h.c.partition_for(&k);
    assert_eq!(h.call(read(&k, 6), 2), None);
    assert_eq!(h.commit_up_to(p, 2), vec![read_ok(0, vec![])]);
    // ...so the old leader is fenced, and stays fenced after a coordinator failover.
    assert_eq!(
        h.call_committed(write(&k, 5, 0, vec![]), 3).error_code(),
        ErrorCode::FENCED_LEADER_EPOCH
    );
    let mut c = h.failover();
    assert_eq!(
        c.handle(write(&k, 5, 0, vec![]), 4),
        Output::Reply(Response::Write {
            error: ErrorCode::FENCED_LEADER_EPOCH
        })
    );
    // Initialize moves the state epoch (an offset reset): writers of the old one are fenced.
    let init = Request::Initialize {
        key: k.clone(),
        state_epoch: 1,
        start_offset: 100,
    };
    assert_eq!(h.call_committed(init, 5).error_code(), ErrorCode::NONE);
    assert_eq!(
        h.call_committed(write(&k, 6, 0, vec![]), 6).error_code(),
        ErrorCode::FENCED_STATE_EPOCH
    );
    let old_init = Request::Initialize {
        key: k.clone(),
        state_epoch: 0,
        start_offset: 0,
    };
    assert_eq!(
        h.call_committed(old_init, 7).error_code(),
        ErrorCode::FENCED_STATE_EPOCH
    );
    let summary = h.call_committed(
        Request::ReadSummary {
            key: k.clone(),
            leader_epoch: -1,
        },
        8,
    );
    // Kafka starts leader epochs over at an initialization.
    assert_eq!(
        summary,
        Response::ReadSummary {
            error: ErrorCode::NONE,
            state_epoch: 1,
            leader_epoch: 0,
            start_offset: 100,
            delivery_complete_count: 0,
        }
    );
}

#[test]
fn malformed_keys_and_partitions_not_led_are_refused() {
    let mut h = Harness::new(ShareCoordinatorConfig {
        state_topic_num_partitions: 4,
        ..Default::default()
    });
    for bad in [
        key("g", -1),
        key("", 0),
        SharePartitionKey::new("g", Uuid::ZERO, 0),
    ] {
        assert_eq!(
            h.call_committed(read(&bad, 0), 0).error_code(),
            ErrorCode::INVALID_REQUEST
        );
        assert_eq!(
            h.call_committed(write(&bad, 0, 0, vec![]), 0).error_code(),
            ErrorCode::INVALID_REQUEST
        );
    }
    let k = key("g", 0);
    for bad in [
        sb(5, 4, Archived, 1),
        sb(-3, 4, Archived, 1),
        sb(5, i64::MAX, Archived, 1),
        sb(5, 6, Archived, -1),
    ] {
        assert_eq!(
            h.call_committed(write(&k, 0, 0, vec![bad]), 0).error_code(),
            ErrorCode::INVALID_REQUEST,
            "{bad:?}"
        );
    }
    let p = h.c.partition_for(&k);
    h.c.unload(p);
    assert_eq!(
        h.call_committed(read(&k, 0), 0).error_code(),
        ErrorCode::NOT_COORDINATOR
    );
    h.c.load_start(p);
    assert_eq!(
        h.call_committed(read(&k, 0), 0).error_code(),
        ErrorCode::COORDINATOR_LOAD_IN_PROGRESS
    );
}

#[test]
fn delete_writes_tombstones_and_forgets() {
    let mut h = Harness::new(ShareCoordinatorConfig {
        state_topic_num_partitions: 1,
        ..Default::default()
    });
    let k = key("g", 0);
    h.call_committed(write(&k, 0, 5, vec![sb(5, 9, Archived, 2)]), 0);
    let delete = Request::Delete { key: k.clone() };
    assert_eq!(
        h.call_committed(delete.clone(), 1).error_code(),
        ErrorCode::NONE
    );
    assert!(matches!(
        h.log[&0][1..],
        [
            ShareCoordinatorRecord::ShareSnapshot { value: None, .. },
            ShareCoordinatorRecord::ShareUpdate { value: None, .. }
        ]
    ));
    assert_eq!(h.call_committed(read(&k, 0), 2), read_ok(-1, vec![]));
    assert_eq!(h.failover().committed_keys(0), vec![]);
    // Nothing of a deleted share-partition is needed any more.
    assert_eq!(h.c.last_redundant_offset(0), Some(3));
    // Deleting what is not there writes nothing.
    assert_eq!(
        h.call(delete, 3),
        Some(Response::Delete {
            error: ErrorCode::NONE
        })
    );
    assert_eq!(h.log[&0].len(), 3);
}

/// (which key, start offset, batches as (first, length, state index, delivery count)).
type ArbWrite = (usize, i64, Vec<(i64, i64, usize, i16)>);

fn arb_write() -> impl Strategy<Value = ArbWrite> {
    (
        0usize..3,
        0i64..50,
        proptest::collection::vec((0i64..80, 0i64..10, 0usize..3, 0i16..5), 0..4),
    )
}

proptest! {
    /// Replaying the log (snapshots and updates) rebuilds exactly the state the coordinator
    /// built while writing it, and after a snapshot a key's replay is bounded.
    #[test]
    fn replay_of_snapshots_and_updates_equals_live_state(
        writes in proptest::collection::vec(arb_write(), 1..60),
        per_snapshot in 1u32..6,
    ) {
        let mut h = Harness::new(ShareCoordinatorConfig {
            state_topic_num_partitions: 2,
            snapshot_update_records_per_snapshot: per_snapshot,
            ..Default::default()
        });
        let keys = [key("a", 0), key("a", 1), key("b", 0)];
        // The reference: every write laid over the last, as a persister promises.
        let mut expected: BTreeMap<SharePartitionKey, (i64, Vec<StateBatch>)> = BTreeMap::new();
        for (i, (which, start, batches)) in writes.into_iter().enumerate() {
            let k = &keys[which];
            let batches: Vec<StateBatch> = batches
                .into_iter()
                .map(|(f, len, s, c)| sb(f, f + len, [Available, Acknowledged, Archived][s], c))
                .collect();
            let prev = expected.get(k).map(|(s, _)| *s).unwrap_or(start);
            let start = start.max(prev);
            let r = h.call_committed(write(k, 0, start, batches.clone()), i as i64);
            prop_assert_eq!(r, OK_WRITE);
            let e = expected.entry(k.clone()).or_insert((start, Vec::new()));
            e.0 = start;
            e.1 = combine(&e.1, &batches, start);
        }
        for k in &keys {
            let got = h.c.committed_state(k).map(|o| (o.start_offset, o.state_batches.clone()));
            prop_assert_eq!(got, expected.get(k).cloned());
        }
        let replayed = h.failover();
        // What is below the redundant offset is not needed: a load without it agrees too.
        let pruned: BTreeMap<i32, i64> = (0..2)
            .filter_map(|p| h.c.last_redundant_offset(p).map(|o| (p, o)))
            .collect();
        let replayed_pruned = h.failover_pruned(&pruned);
        for p in 0..2 {
            prop_assert_eq!(replayed.committed_keys(p), h.c.committed_keys(p));
            prop_assert_eq!(replayed.live_keys(p), h.c.live_keys(p));
            prop_assert_eq!(replayed_pruned.committed_keys(p), h.c.committed_keys(p));
            if let Some(o) = pruned.get(&p) {
                prop_assert!(*o <= h.hw.get(&p).copied().unwrap_or(0), "prunes above the high watermark");
            }
        }
        // Bounded replay: no key has more than `per_snapshot` updates after its snapshot.
        for (p, log) in &h.log {
            let mut since: BTreeMap<&SharePartitionKey, u32> = BTreeMap::new();
            for r in log {
                match r {
                    ShareCoordinatorRecord::ShareSnapshot { key, .. } => { since.insert(key, 0); }
                    ShareCoordinatorRecord::ShareUpdate { key, .. } => {
                        let n = since.entry(key).or_insert(0);
                        *n += 1;
                        prop_assert!(*n <= per_snapshot, "partition {}: {} updates after a snapshot", p, n);
                    }
                }
            }
        }
    }
}

#[test]
fn cold_share_partitions_are_snapshotted_so_the_log_can_be_pruned() {
    let mut h = Harness::new(ShareCoordinatorConfig {
        state_topic_num_partitions: 1,
        snapshot_update_records_per_snapshot: 100,
        cold_partition_snapshot_interval_ms: 1_000,
    });
    let (idle, busy) = (key("idle", 0), key("busy", 0));
    h.call_committed(write(&idle, 0, 0, vec![sb(0, 4, Archived, 1)]), 0);
    for i in 0..5 {
        h.call_committed(write(&busy, 0, i, vec![]), 0);
    }
    // The idle share-partition's snapshot at offset 0 holds everything back.
    assert_eq!(h.c.last_redundant_offset(0), Some(0));
    assert_eq!(h.c.next_deadline(), Some(1_000));
    assert_eq!(h.tick(999), 0, "not yet");
    // The first tick only marks where the log ends.
    assert_eq!(h.tick(1_000), 0);
    assert_eq!(h.c.next_deadline(), Some(2_000));
    h.call_committed(write(&busy, 0, 5, vec![]), 1_500);
    // The second snapshots both: neither was snapshotted since the mark.
    assert_eq!(h.tick(2_000), 2);
    assert_eq!(h.c.last_redundant_offset(0), Some(7));
    let pruned = BTreeMap::from([(0, 7)]);
    assert_eq!(
        h.failover_pruned(&pruned).committed_keys(0),
        h.c.committed_keys(0)
    );
    assert_eq!(
        h.c.committed_state(&idle)
            .map(|o| (o.snapshot_epoch, o.state_batches.clone())),
        Some((1, vec![sb(0, 4, Archived, 1)]))
    );
    // Nothing changed since: the next tick writes nothing.
    assert_eq!(h.tick(3_000), 0);
}

#[test]
fn read_summary_reports_the_delivery_complete_count_of_the_last_write() {
    let mut h = Harness::new(ShareCoordinatorConfig {
        state_topic_num_partitions: 1,
        ..Default::default()
    });
    let k = key("g", 0);
    let summary = |h: &mut Harness| {
        h.call_committed(
            Request::ReadSummary {
                key: k.clone(),
                leader_epoch: -1,
            },
            0,
        )
    };
    assert_eq!(
        summary(&mut h),
        Response::ReadSummary {
            error: ErrorCode::NONE,
            state_epoch: 0,
            leader_epoch: -1,
            start_offset: -1,
            delivery_complete_count: -1,
        }
    );
    h.call_committed(write(&k, 1, 0, vec![sb(3, 9, Acknowledged, 1)]), 0);
    // A new leader's read records its epoch without touching the count.
    h.call_committed(read(&k, 2), 0);
    assert_eq!(
        summary(&mut h),
        Response::ReadSummary {
            error: ErrorCode::NONE,
            state_epoch: 0,
            leader_epoch: 2,
            start_offset: 0,
            delivery_complete_count: 7,
        }
    );
}
