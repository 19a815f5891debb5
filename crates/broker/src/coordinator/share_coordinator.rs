//! The share coordinator's shard (Kafka's `ShareCoordinatorService` and its
//! `ShareCoordinatorShard`): the pure `rill-share` state machine as the coordinator runtime
//! ([`super::runtime`]) hosts it on `__share_group_state`, with the records in Kafka's
//! format ([`super::share_coordinator_codec`]).
//!
//! # Design note
//!
//! 1. A call is one share-partition's Initialize, Read, Write, Delete or ReadSummary
//!    (the server splits the RPCs' lists, as Kafka's service does). The state machine
//!    answers at once from committed state, or returns records with the answer they earn;
//!    the runtime appends them with acks=all and holds the answer until the high watermark
//!    has passed them.
//! 2. [`CoordinatorShard::replicated`] is the state machine's `commit_up_to` with the end
//!    of the write, so the change is in the committed image before its answer is sent and
//!    a client reads its own write.
//! 3. A load replays the partition's log into the state machine, what is at or above the
//!    high watermark as pending; the runtime's high watermark polls commit it. Until the
//!    high watermark has reached the end of what the load read, the partition's
//!    share-partitions answer COORDINATOR_LOAD_IN_PROGRESS (and on a partition this broker
//!    does not lead, NOT_COORDINATOR): a new leader's high watermark may lag the writes
//!    its predecessor answered, and a read served from the committed state meanwhile
//!    would give a share-partition leader a state without acknowledgements it was told
//!    were persisted (invariant 12). Kafka's runtime gets the same from running reads as
//!    write operations, which wait for every earlier write to commit.
//! 4. The state machine lays a write's records over its newest state as soon as it decides
//!    them, and has no way to take them back; so a write that fails (append or replication
//!    wait) reloads the partition from the log, which says what was written
//!    ([`CoordinatorShard::RELOAD_AFTER_FAILED_WAIT`]). The held answer fails with Kafka's
//!    mapping: NOT_COORDINATOR when leadership moved, COORDINATOR_NOT_AVAILABLE otherwise.
//! 5. `tick` at the state machine's deadline appends the snapshots of cold
//!    share-partitions (`share.coordinator.cold.partition.snapshot.interval.ms`); nobody
//!    waits for them.
//! 6. Every `share.coordinator.state.topic.prune.interval.ms`, `tick` deletes the records
//!    of each served partition below its last redundant offset (Kafka's prune job): every
//!    share-partition's replay starts at or after it, and it is computed on committed
//!    records only, so it is at most the high watermark and a load of what is left
//!    rebuilds the same state. The cold snapshots keep it moving for idle
//!    share-partitions; the topic's cleanup policy is delete, as KIP-932 has it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use rill_protocol::ErrorCode;
use rill_share::{
    Output, Request, Response, ShareCoordinator, ShareCoordinatorConfig, ShareCoordinatorRecord,
    WriteId, SHARE_GROUP_STATE_TOPIC,
};

use super::runtime::{
    self, CoordinatorHandle, CoordinatorOutput, CoordinatorShard, Handled, Outputs, ResponderId,
    WriteFailure,
};
use super::share_coordinator_codec;
use crate::replication::replica_manager::ReplicaManager;

/// Where connections send share-group state calls, and the metadata publisher elections of
/// `__share_group_state` partitions.
pub type ShareCoordinatorHandle = CoordinatorHandle<ShareShard>;

/// The `rill-share` state machine under the runtime.
pub struct ShareShard {
    coordinator: ShareCoordinator,
    /// Partitions loaded whose high watermark has not reached the end of what the load
    /// read: the offset after the last record replayed (design note, step 3).
    catching_up: BTreeMap<i32, i64>,
    /// `share.coordinator.write.timeout.ms`.
    write_timeout: Duration,
    /// `share.coordinator.state.topic.prune.interval.ms`.
    prune_interval_ms: i64,
    /// When `tick` next prunes; set at the first load.
    next_prune_ms: Option<i64>,
    /// Per partition, the offset the last prune deleted below.
    pruned: BTreeMap<i32, i64>,
}

impl ShareShard {
    pub fn new(
        config: ShareCoordinatorConfig,
        write_timeout: Duration,
        prune_interval: Duration,
    ) -> Self {
        ShareShard {
            coordinator: ShareCoordinator::new(config),
            catching_up: BTreeMap::new(),
            write_timeout,
            prune_interval_ms: i64::try_from(prune_interval.as_millis())
                .unwrap_or(i64::MAX)
                .max(1),
            next_prune_ms: None,
            pruned: BTreeMap::new(),
        }
    }

    /// Design note, step 6.
    fn prune(&mut self) -> Outputs<Self> {
        let mut out = Vec::new();
        for partition in self.coordinator.loaded_partitions() {
            if self.catching_up.contains_key(&partition) {
                continue;
            }
            let Some(offset) = self.coordinator.last_redundant_offset(partition) else {
                continue;
            };
            if offset > self.pruned.get(&partition).copied().unwrap_or(0) {
                self.pruned.insert(partition, offset);
                out.push(CoordinatorOutput::DeleteRecordsBefore { partition, offset });
            }
        }
        out
    }
}

/// Starts the coordinator task; it serves no partition until [`CoordinatorHandle::elect`].
pub fn start(
    config: ShareCoordinatorConfig,
    write_timeout: Duration,
    prune_interval: Duration,
    replicas: Arc<ReplicaManager>,
) -> ShareCoordinatorHandle {
    runtime::start(
        ShareShard::new(config, write_timeout, prune_interval),
        replicas,
    )
}

/// Kafka's mapping of a failed `__share_group_state` write (`handleOperationException`):
/// another coordinator when leadership moved, this one later otherwise.
fn write_error(failure: WriteFailure) -> ErrorCode {
    match failure {
        WriteFailure::Append => ErrorCode::NOT_COORDINATOR,
        WriteFailure::Replication(
            ErrorCode::NOT_LEADER_OR_FOLLOWER | ErrorCode::KAFKA_STORAGE_ERROR,
        ) => ErrorCode::NOT_COORDINATOR,
        WriteFailure::Replication(_) => ErrorCode::COORDINATOR_NOT_AVAILABLE,
    }
}

/// `reply`, failed with `error`.
pub fn with_error(reply: &Response, error: ErrorCode) -> Response {
    match reply {
        Response::Initialize { .. } => Response::Initialize { error },
        Response::Read { .. } => Response::Read {
            error,
            state_epoch: 0,
            start_offset: -1,
            state_batches: Vec::new(),
        },
        Response::Write { .. } => Response::Write { error },
        Response::Delete { .. } => Response::Delete { error },
        Response::ReadSummary { .. } => Response::ReadSummary {
            error,
            state_epoch: 0,
            leader_epoch: -1,
            start_offset: -1,
            delivery_complete_count: -1,
        },
    }
}

impl CoordinatorShard for ShareShard {
    type Record = ShareCoordinatorRecord;
    type Call = Request;
    type Reply = Response;

    const RELOAD_AFTER_FAILED_WAIT: bool = true;

    fn topic(&self) -> &'static str {
        SHARE_GROUP_STATE_TOPIC
    }

    fn num_partitions(&self) -> i32 {
        self.coordinator.config().state_topic_num_partitions
    }

    fn write_timeout(&self) -> Duration {
        self.write_timeout
    }

    fn encode(
        &self,
        record: &ShareCoordinatorRecord,
    ) -> Result<(Vec<u8>, Option<Vec<u8>>), String> {
        share_coordinator_codec::encode(record)
    }

    fn decode(&self, key: Option<&[u8]>, value: Option<&[u8]>) -> Option<ShareCoordinatorRecord> {
        match share_coordinator_codec::decode(key?, value) {
            Ok(r) => Some(r),
            Err(e) => {
                tracing::warn!(error = %e, "unreadable __share_group_state record skipped");
                None
            }
        }
    }

    fn handle(
        &mut self,
        call: Request,
        responder: ResponderId,
        now_ms: i64,
    ) -> Handled<ShareCoordinatorRecord, Response> {
        let partition = self.coordinator.partition_for(call.key());
        if self.catching_up.contains_key(&partition) {
            return Handled::Reply(Response::error(
                &call,
                ErrorCode::COORDINATOR_LOAD_IN_PROGRESS,
            ));
        }
        match self.coordinator.handle(call, now_ms) {
            Output::Reply(reply) => Handled::Reply(reply),
            Output::Persist {
                write,
                partition,
                records,
                reply,
            } => Handled::Outputs(vec![CoordinatorOutput::Append {
                write: write.0,
                records: records.into_iter().map(|r| (partition, r)).collect(),
                replies: vec![(responder, reply)],
                transactional: None,
            }]),
        }
    }

    fn tick(&mut self, now_ms: i64) -> Outputs<Self> {
        let mut out: Outputs<Self> = self
            .coordinator
            .tick(now_ms)
            .into_iter()
            .map(|s| CoordinatorOutput::Append {
                write: s.write.0,
                records: s.records.into_iter().map(|r| (s.partition, r)).collect(),
                replies: Vec::new(),
                transactional: None,
            })
            .collect();
        if self.next_prune_ms.is_some_and(|at| now_ms >= at) {
            self.next_prune_ms = Some(now_ms.saturating_add(self.prune_interval_ms));
            out.extend(self.prune());
        }
        out
    }

    fn next_deadline(&self) -> Option<i64> {
        if self.coordinator.loaded_partitions().is_empty() {
            return None;
        }
        match (self.coordinator.next_deadline(), self.next_prune_ms) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn load_start(&mut self, partition: i32) -> Outputs<Self> {
        self.coordinator.load_start(partition);
        self.catching_up.insert(partition, 0);
        Vec::new()
    }

    fn replay(
        &mut self,
        partition: i32,
        offset: i64,
        record: ShareCoordinatorRecord,
        committed: bool,
        _producer_id: Option<i64>,
    ) -> Result<(), String> {
        if let Some(end) = self.catching_up.get_mut(&partition) {
            *end = (*end).max(offset.saturating_add(1));
        }
        self.coordinator
            .replay(partition, offset, record, committed);
        Ok(())
    }

    fn load_done(&mut self, partition: i32, _leader_epoch: i32, now_ms: i64) -> Outputs<Self> {
        self.coordinator.load_done(partition, now_ms);
        if self.next_prune_ms.is_none() {
            self.next_prune_ms = Some(now_ms.saturating_add(self.prune_interval_ms));
        }
        tracing::info!(partition, "share coordinator partition loaded");
        Vec::new()
    }

    fn unload(&mut self, partition: i32) -> Outputs<Self> {
        self.coordinator.unload(partition);
        self.catching_up.remove(&partition);
        self.pruned.remove(&partition);
        Vec::new()
    }

    fn loaded_partitions(&self) -> Vec<i32> {
        self.coordinator.loaded_partitions()
    }

    fn appended(&mut self, write: u64, partition: i32, end_offset: i64) {
        self.coordinator
            .appended(WriteId(write), partition, end_offset);
    }

    fn replicated(&mut self, _write: u64, reached: &[(i32, i64)]) -> Outputs<Self> {
        for (partition, end_offset) in reached {
            // The writes this commits answer through the runtime, which holds their replies.
            self.coordinator.commit_up_to(*partition, *end_offset);
        }
        Vec::new()
    }

    fn write_failed(&mut self, _write: u64, _failure: WriteFailure) -> Outputs<Self> {
        // The partition is reloaded from its log (design note, step 4).
        Vec::new()
    }

    fn failed_reply(&self, reply: Response, failure: WriteFailure) -> Response {
        with_error(&reply, write_error(failure))
    }

    fn uncommitted_partitions(&self) -> Vec<i32> {
        let mut partitions = self.coordinator.uncommitted_partitions();
        for p in self.catching_up.keys() {
            if !partitions.contains(p) {
                partitions.push(*p);
            }
        }
        partitions
    }

    fn commit_up_to(&mut self, partition: i32, offset: i64) -> Outputs<Self> {
        self.coordinator.commit_up_to(partition, offset);
        if self
            .catching_up
            .get(&partition)
            .is_some_and(|end| offset >= *end)
        {
            self.catching_up.remove(&partition);
        }
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use rill_protocol::Uuid;
    use rill_share::{RecordState, SharePartitionKey, StateBatch};

    use super::*;

    /// A record's key and value in Kafka's format.
    type Encoded = (Vec<u8>, Option<Vec<u8>>);
    /// A write appended and not yet replicated: write, partition, end offset, replies.
    type Held = (u64, i32, i64, Vec<(ResponderId, Response)>);

    /// The shard as the runtime drives it, with a log of what was appended and a high
    /// watermark the test moves (`commit_up_to`), so a write can be held uncommitted.
    struct Harness {
        shard: ShareShard,
        /// Encoded records of each partition, in log order.
        log: std::collections::BTreeMap<i32, Vec<Encoded>>,
        /// Writes appended and not yet replicated: (write, partition, end, replies).
        held: Vec<Held>,
        next_responder: ResponderId,
    }

    const NOW: i64 = 1_000_000;
    const PRUNE: Duration = Duration::from_secs(300);

    impl Harness {
        fn new() -> Self {
            let config = ShareCoordinatorConfig {
                state_topic_num_partitions: 3,
                snapshot_update_records_per_snapshot: 2,
                cold_partition_snapshot_interval_ms: 60_000,
            };
            let mut shard = ShareShard::new(config, Duration::from_secs(5), PRUNE);
            for p in 0..3 {
                shard.load_start(p);
                shard.load_done(p, 0, NOW);
                shard.commit_up_to(p, 0);
            }
            Harness {
                shard,
                log: Default::default(),
                held: Vec::new(),
                next_responder: 1,
            }
        }

        /// Runs a call; an answer that waits for replication is held.
        fn call(&mut self, request: Request) -> Option<Response> {
            let id = self.next_responder;
            self.next_responder += 1;
            match self.shard.handle(request, id, NOW) {
                Handled::Reply(r) => Some(r),
                Handled::Outputs(outputs) => {
                    self.act(outputs);
                    None
                }
            }
        }

        fn act(&mut self, outputs: Outputs<ShareShard>) {
            for o in outputs {
                let CoordinatorOutput::Append {
                    write,
                    records,
                    replies,
                    ..
                } = o
                else {
                    panic!("the share shard answers calls only through appends");
                };
                let partition = records[0].0;
                let log = self.log.entry(partition).or_default();
                for (p, r) in &records {
                    assert_eq!(*p, partition, "a write stays in one partition");
                    log.push(self.shard.encode(r).unwrap());
                }
                let end = log.len() as i64;
                self.shard.appended(write, partition, end);
                self.held.push((write, partition, end, replies));
            }
        }

        /// The high watermark of `partition` reaches `offset`: the writes below it answer.
        fn commit_up_to(&mut self, partition: i32, offset: i64) -> Vec<Response> {
            let (done, held): (Vec<_>, Vec<_>) = self
                .held
                .drain(..)
                .partition(|(_, p, end, _)| *p == partition && *end <= offset);
            self.held = held;
            let mut answers = Vec::new();
            for (write, p, end, replies) in done {
                self.shard.replicated(write, &[(p, end)]);
                answers.extend(replies.into_iter().map(|(_, r)| r));
            }
            answers
        }

        fn log_end(&self, partition: i32) -> i64 {
            self.log.get(&partition).map_or(0, |l| l.len() as i64)
        }

        /// Another broker loads `partition` from the log without its records from `end` on
        /// (truncated by the new leader), all of them committed.
        fn failover_truncated(&self, partition: i32, end: i64) -> ShareShard {
            let mut shard = ShareShard::new(
                self.shard.coordinator.config().clone(),
                Duration::from_secs(5),
                PRUNE,
            );
            shard.load_start(partition);
            for (offset, (k, v)) in self.log.get(&partition).into_iter().flatten().enumerate() {
                let offset = offset as i64;
                if offset >= end {
                    break;
                }
                let record = shard.decode(Some(k), v.as_deref()).unwrap();
                shard.replay(partition, offset, record, true, None).unwrap();
            }
            shard.load_done(partition, 1, NOW);
            shard.commit_up_to(partition, end);
            shard
        }

        /// Another broker loads `partition` from `log_start` on (what a prune left), all
        /// of it committed.
        fn failover_from(&self, partition: i32, log_start: i64) -> ShareShard {
            let mut shard = ShareShard::new(
                self.shard.coordinator.config().clone(),
                Duration::from_secs(5),
                PRUNE,
            );
            shard.load_start(partition);
            for (offset, (k, v)) in self.log.get(&partition).into_iter().flatten().enumerate() {
                let offset = offset as i64;
                if offset < log_start {
                    continue;
                }
                let record = shard.decode(Some(k), v.as_deref()).unwrap();
                shard.replay(partition, offset, record, true, None).unwrap();
            }
            shard.load_done(partition, 1, NOW);
            shard.commit_up_to(partition, self.log_end(partition));
            shard
        }

        /// Another broker loads `partition` from the log: committed up to `high_watermark`.
        fn failover(&self, partition: i32, high_watermark: i64) -> ShareShard {
            let mut shard = ShareShard::new(
                self.shard.coordinator.config().clone(),
                Duration::from_secs(5),
                PRUNE,
            );
            shard.load_start(partition);
            for (offset, (k, v)) in self.log.get(&partition).into_iter().flatten().enumerate() {
                let record = shard.decode(Some(k), v.as_deref()).unwrap();
                let offset = offset as i64;
                shard
                    .replay(partition, offset, record, offset < high_watermark, None)
                    .unwrap();
            }
            shard.load_done(partition, 1, NOW);
            shard.commit_up_to(partition, high_watermark);
            shard
        }
    }

    fn key() -> SharePartitionKey {
        SharePartitionKey::new("g", Uuid::from_u64_pair(7, 9), 0)
    }

    fn write(leader_epoch: i32, start_offset: i64, batches: Vec<StateBatch>) -> Request {
        Request::Write {
            key: key(),
            state_epoch: 0,
            leader_epoch,
            start_offset,
            delivery_complete_count: -1,
            state_batches: batches,
        }
    }

    fn read(shard: &mut ShareShard, leader_epoch: i32) -> Response {
        match shard.handle(
            Request::Read {
                key: key(),
                leader_epoch,
            },
            99,
            NOW,
        ) {
            Handled::Reply(r) => r,
            Handled::Outputs(_) => panic!("a read at the known leader epoch writes nothing"),
        }
    }

    #[test]
    fn a_write_answers_and_is_read_only_once_replicated() {
        let mut h = Harness::new();
        let p = h.shard.coordinator.partition_for(&key());
        let batches = vec![StateBatch::new(10, 19, RecordState::Acknowledged, 1)];
        assert_eq!(h.call(write(0, 10, batches.clone())), None);
        // Appended, not replicated: a read sees nothing yet.
        let before = read(&mut h.shard, 0);
        assert!(
            matches!(
                before,
                Response::Read {
                    start_offset: -1,
                    ..
                }
            ),
            "{before:?}"
        );
        let end = h.log_end(p);
        assert_eq!(h.commit_up_to(p, end - 1), vec![]);
        assert_eq!(
            h.commit_up_to(p, end),
            vec![Response::Write {
                error: ErrorCode::NONE
            }]
        );
        match read(&mut h.shard, 0) {
            Response::Read {
                error,
                start_offset,
                state_batches,
                ..
            } => {
                assert_eq!((error, start_offset), (ErrorCode::NONE, 10));
                assert_eq!(state_batches, batches);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_failover_replays_the_kafka_records_to_the_same_state() {
        let mut h = Harness::new();
        let p = h.shard.coordinator.partition_for(&key());
        // Enough writes for a snapshot after updates (two updates per snapshot here).
        for (i, state) in [
            RecordState::Acknowledged,
            RecordState::Archived,
            RecordState::Available,
            RecordState::Acknowledged,
            RecordState::Acknowledged,
        ]
        .into_iter()
        .enumerate()
        {
            let first = 10 + 10 * i as i64;
            h.call(write(
                1,
                10,
                vec![StateBatch::new(first, first + 9, state, 1)],
            ));
            let end = h.log_end(p);
            h.commit_up_to(p, end);
        }
        // A last write appended but never replicated: the new coordinator must not serve it.
        h.call(write(
            1,
            10,
            vec![StateBatch::new(10, 80, RecordState::Archived, 3)],
        ));
        let committed_end = h.log_end(p) - 1;
        let want = read(&mut h.shard, 1);
        let mut new = h.failover(p, committed_end);
        // The new leader's high watermark lags the last record it holds: it is loading
        // until the mark gets there, and then serves the write it found.
        assert_eq!(
            read(&mut new, 1).error_code(),
            ErrorCode::COORDINATOR_LOAD_IN_PROGRESS
        );
        assert_eq!(new.uncommitted_partitions(), vec![p]);
        new.commit_up_to(p, committed_end + 1);
        assert_ne!(read(&mut new, 1), want);
        assert!(new.uncommitted_partitions().is_empty());
        let mut new = h.failover(p, committed_end + 1);
        let found = read(&mut new, 1);
        assert!(
            matches!(&found, Response::Read { state_batches, .. }
                if state_batches.contains(&StateBatch::new(10, 80, RecordState::Archived, 3))),
            "{found:?}"
        );
        // And a new leader that truncated the unreplicated record serves what was
        // committed.
        let mut truncated = h.failover_truncated(p, committed_end);
        assert_eq!(read(&mut truncated, 1), want);
        // A fenced leader epoch is refused by the new coordinator too.
        let Handled::Reply(fenced) = new.handle(write(0, 10, vec![]), 5, NOW) else {
            panic!("a fenced write is answered at once");
        };
        assert_eq!(
            fenced,
            Response::Write {
                error: ErrorCode::FENCED_LEADER_EPOCH
            }
        );
    }

    #[test]
    fn prunes_only_what_no_replay_needs() {
        let mut h = Harness::new();
        let p = h.shard.coordinator.partition_for(&key());
        let other = SharePartitionKey::new("g2", Uuid::from_u64_pair(3, 4), 1);
        let other_partition = h.shard.coordinator.partition_for(&other);
        // Many writes of one share-partition: snapshots every two updates.
        for i in 0..7 {
            let first = 10 + 10 * i;
            h.call(write(
                1,
                10,
                vec![StateBatch::new(
                    first,
                    first + 9,
                    RecordState::Acknowledged,
                    1,
                )],
            ));
            let end = h.log_end(p);
            h.commit_up_to(p, end);
        }
        // Nothing is pruned before the interval.
        assert!(h.shard.tick(NOW + 1).is_empty());
        let deadline = h.shard.next_deadline().unwrap();
        assert!(deadline <= NOW + 300_000);
        let pruned: Vec<(i32, i64)> = h
            .shard
            .tick(NOW + 300_000)
            .into_iter()
            .filter_map(|o| match o {
                CoordinatorOutput::DeleteRecordsBefore { partition, offset } => {
                    Some((partition, offset))
                }
                _ => None,
            })
            .collect();
        let Some(&(partition, offset)) = pruned.iter().find(|(q, _)| *q == p) else {
            panic!("nothing pruned of {p}: {pruned:?}");
        };
        assert_eq!(partition, p);
        assert!(
            offset > 0 && offset < h.log_end(p),
            "{offset} of {}",
            h.log_end(p)
        );
        // A load of what is left serves the same state.
        let want = read(&mut h.shard, 1);
        let mut new = h.failover_from(p, offset);
        assert_eq!(read(&mut new, 1), want);
        // Once pruned, the same offset is not asked for again; partitions with nothing
        // written have nothing to prune.
        let again = h.shard.tick(NOW + 600_000);
        assert!(!again.iter().any(|o| matches!(o,
            CoordinatorOutput::DeleteRecordsBefore { partition, .. } if *partition == p)));
        if other_partition != p {
            assert!(!pruned.iter().any(|(q, _)| *q == other_partition));
        }
    }

    #[test]
    fn calls_for_partitions_not_led_or_loading_are_refused() {
        let mut shard = ShareShard::new(
            ShareCoordinatorConfig {
                state_topic_num_partitions: 1,
                ..Default::default()
            },
            Duration::from_secs(5),
            PRUNE,
        );
        assert_eq!(read(&mut shard, 0).error_code(), ErrorCode::NOT_COORDINATOR);
        shard.load_start(0);
        assert_eq!(
            read(&mut shard, 0).error_code(),
            ErrorCode::COORDINATOR_LOAD_IN_PROGRESS
        );
        shard.load_done(0, 0, NOW);
        // Loaded, until the high watermark is known to have reached what the load read.
        assert_eq!(
            read(&mut shard, 0).error_code(),
            ErrorCode::COORDINATOR_LOAD_IN_PROGRESS
        );
        shard.commit_up_to(0, 0);
        assert_eq!(read(&mut shard, 0).error_code(), ErrorCode::NONE);
        shard.unload(0);
        assert_eq!(read(&mut shard, 0).error_code(), ErrorCode::NOT_COORDINATOR);
    }

    #[test]
    fn failed_writes_answer_kafkas_errors() {
        let shard = ShareShard::new(
            ShareCoordinatorConfig::default(),
            Duration::from_secs(5),
            PRUNE,
        );
        let ok = Response::Write {
            error: ErrorCode::NONE,
        };
        for (failure, want) in [
            (WriteFailure::Append, ErrorCode::NOT_COORDINATOR),
            (
                WriteFailure::Replication(ErrorCode::NOT_LEADER_OR_FOLLOWER),
                ErrorCode::NOT_COORDINATOR,
            ),
            (
                WriteFailure::Replication(ErrorCode::REQUEST_TIMED_OUT),
                ErrorCode::COORDINATOR_NOT_AVAILABLE,
            ),
        ] {
            assert_eq!(shard.failed_reply(ok.clone(), failure).error_code(), want);
        }
    }
}
