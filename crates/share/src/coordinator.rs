//! [`ShareCoordinator`]: the share coordinator's shard (Kafka's `ShareCoordinatorShard`) for
//! the `__share_group_state` partitions this node leads. It persists every share-partition's
//! state for the partition leaders and answers InitializeShareGroupState,
//! ReadShareGroupState, WriteShareGroupState, DeleteShareGroupState and
//! ReadShareGroupStateSummary, one share-partition per call (the broker splits the RPCs'
//! lists, as Kafka's `ShareCoordinatorService` does).
//!
//! # Protocol
//! 1. A call that changes state decides against the newest state (including records not yet
//!    replicated) and returns its records with [`Output::Persist`]; handlers only decide, and
//!    the records change state through the one path replay also takes ([`Image::apply`],
//!    STYLE.md example 3).
//! 2. A write of a share-partition never seen becomes a `ShareSnapshot`; so does every write
//!    after `share.coordinator.snapshot.update.records.per.snapshot` `ShareUpdate`s of it
//!    (the snapshot folds them in), so a load replays at most that many updates per
//!    share-partition after its last snapshot. Other writes are a `ShareUpdate` of the
//!    changed batches, which replay lays over the state ([`crate::combine`]).
//! 3. Fencing (Kafka's rules): a write whose leader epoch is below the share-partition's is
//!    FENCED_LEADER_EPOCH, one whose state epoch is below it FENCED_STATE_EPOCH; a read whose
//!    leader epoch is below it is FENCED_LEADER_EPOCH, and a read with a higher one records
//!    the new leader epoch (a `ShareUpdate` without batches) before it is answered, so the
//!    old leader's later writes are fenced even after a coordinator failover. Initialize
//!    with an older state epoch is FENCED_STATE_EPOCH. A negative partition, a zero topic id,
//!    an empty group id or a state batch that cannot describe records is INVALID_REQUEST.
//! 4. Delete writes tombstones of both record keys.
//! 5. The broker appends the records with acks=all, says where each write ended
//!    ([`ShareCoordinator::appended`]) and, as the partition's high watermark moves,
//!    [`ShareCoordinator::commit_up_to`]; a write's reply is sent once it is committed.
//!
//! # Why reads see only replicated state
//! Read and ReadSummary are answered from the committed image, which takes a write's records
//! only once the high watermark has passed them (or from a load, only those below the high
//! watermark read at its start). A read that must record a new leader epoch is answered
//! after its record commits, with the state as of that record, which is committed then too.
//! So a share-partition leader never starts from a state a coordinator failover could take
//! back (DESIGN.md, invariant 9), and an acknowledgement whose write it was told succeeded is
//! in every state a later leader reads (invariant 12).

use std::collections::{BTreeMap, VecDeque};

use rill_protocol::ErrorCode;

use crate::record::{
    ShareCoordinatorRecord, SharePartitionKey, ShareSnapshotValue, ShareUpdateValue,
};
use crate::state_batch::{combine, StateBatch};

/// The coordinator's settings, under Kafka's broker config names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareCoordinatorConfig {
    /// `share.coordinator.state.topic.num.partitions`.
    pub state_topic_num_partitions: i32,
    /// `share.coordinator.snapshot.update.records.per.snapshot`.
    pub snapshot_update_records_per_snapshot: u32,
    /// `share.coordinator.cold.partition.snapshot.interval.ms`: how often share-partitions
    /// that were not snapshotted since the last time get a snapshot of their state, so that
    /// an idle one does not hold [`ShareCoordinator::last_redundant_offset`] back forever.
    pub cold_partition_snapshot_interval_ms: i64,
}

impl Default for ShareCoordinatorConfig {
    fn default() -> Self {
        ShareCoordinatorConfig {
            state_topic_num_partitions: 50,
            snapshot_update_records_per_snapshot: 500,
            cold_partition_snapshot_interval_ms: 300_000,
        }
    }
}

/// Names one [`Output::Persist`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WriteId(pub u64);

/// A call for one share-partition (the fields of the share-group state RPCs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    Initialize {
        key: SharePartitionKey,
        state_epoch: i32,
        start_offset: i64,
    },
    Read {
        key: SharePartitionKey,
        leader_epoch: i32,
    },
    Write {
        key: SharePartitionKey,
        state_epoch: i32,
        leader_epoch: i32,
        start_offset: i64,
        delivery_complete_count: i32,
        state_batches: Vec<StateBatch>,
    },
    Delete {
        key: SharePartitionKey,
    },
    ReadSummary {
        key: SharePartitionKey,
        leader_epoch: i32,
    },
}

impl Request {
    pub fn key(&self) -> &SharePartitionKey {
        match self {
            Request::Initialize { key, .. }
            | Request::Read { key, .. }
            | Request::Write { key, .. }
            | Request::Delete { key }
            | Request::ReadSummary { key, .. } => key,
        }
    }
}

/// The answer for one share-partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Response {
    Initialize {
        error: ErrorCode,
    },
    Read {
        error: ErrorCode,
        state_epoch: i32,
        /// `-1`: nothing persisted.
        start_offset: i64,
        state_batches: Vec<StateBatch>,
    },
    Write {
        error: ErrorCode,
    },
    Delete {
        error: ErrorCode,
    },
    ReadSummary {
        error: ErrorCode,
        state_epoch: i32,
        leader_epoch: i32,
        start_offset: i64,
        /// `-1`: not known.
        delivery_complete_count: i32,
    },
}

impl Response {
    /// The answer to `request` when it fails with `error`.
    pub fn error(request: &Request, error: ErrorCode) -> Response {
        match request {
            Request::Initialize { .. } => Response::Initialize { error },
            Request::Read { .. } => Response::Read {
                error,
                state_epoch: 0,
                start_offset: -1,
                state_batches: Vec::new(),
            },
            Request::Write { .. } => Response::Write { error },
            Request::Delete { .. } => Response::Delete { error },
            Request::ReadSummary { .. } => Response::ReadSummary {
                error,
                state_epoch: 0,
                leader_epoch: -1,
                start_offset: -1,
                delivery_complete_count: -1,
            },
        }
    }

    pub fn error_code(&self) -> ErrorCode {
        match self {
            Response::Initialize { error }
            | Response::Read { error, .. }
            | Response::Write { error }
            | Response::Delete { error }
            | Response::ReadSummary { error, .. } => *error,
        }
    }
}

/// What the broker must do with a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// Answer now.
    Reply(Response),
    /// Append `records` to `__share_group_state` partition `partition` with acks=all, report
    /// where they ended with `appended`, and send `reply` once `commit_up_to` has made the
    /// write visible (or the error the failure maps to).
    Persist {
        write: WriteId,
        partition: i32,
        records: Vec<ShareCoordinatorRecord>,
        reply: Response,
    },
}

/// Snapshots of cold share-partitions ([`ShareCoordinator::tick`]): append them to
/// `partition` with acks=all and report them like any write; nobody waits for them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColdSnapshot {
    pub write: WriteId,
    pub partition: i32,
    pub records: Vec<ShareCoordinatorRecord>,
}

/// One share-partition's state as its records say (Kafka's `ShareGroupOffset`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareGroupOffset {
    pub snapshot_epoch: i32,
    pub state_epoch: i32,
    pub leader_epoch: i32,
    pub start_offset: i64,
    pub delivery_complete_count: i32,
    pub create_timestamp_ms: i64,
    pub write_timestamp_ms: i64,
    pub state_batches: Vec<StateBatch>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct KeyState {
    offset: ShareGroupOffset,
    /// `ShareUpdate`s replayed since the last `ShareSnapshot`.
    updates_since_snapshot: u32,
    /// The log offset of the record a replay of this key must start at (its last
    /// `ShareSnapshot`, or the update it began with); `None` where offsets are not known yet
    /// (the live image of records not yet appended).
    replay_from: Option<i64>,
}

/// The share-partitions of one `__share_group_state` partition, as a prefix of its log says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Image {
    keys: BTreeMap<SharePartitionKey, KeyState>,
    /// The offset after the last record applied, where known.
    end_offset: Option<i64>,
}

impl Image {
    /// The one way records change state, live or replayed; `offset` is the record's place
    /// in the log, where known.
    fn apply(&mut self, record: &ShareCoordinatorRecord, offset: Option<i64>) {
        if let Some(o) = offset {
            self.end_offset = Some(self.end_offset.map_or(o + 1, |e| e.max(o + 1)));
        }
        match record {
            ShareCoordinatorRecord::ShareSnapshot {
                key,
                value: Some(v),
            } => {
                self.keys.insert(
                    key.clone(),
                    KeyState {
                        offset: ShareGroupOffset {
                            snapshot_epoch: v.snapshot_epoch,
                            state_epoch: v.state_epoch,
                            leader_epoch: v.leader_epoch,
                            start_offset: v.start_offset,
                            delivery_complete_count: v.delivery_complete_count,
                            create_timestamp_ms: v.create_timestamp_ms,
                            write_timestamp_ms: v.write_timestamp_ms,
                            state_batches: combine(&[], &v.state_batches, v.start_offset),
                        },
                        updates_since_snapshot: 0,
                        replay_from: offset,
                    },
                );
            }
            ShareCoordinatorRecord::ShareUpdate {
                key,
                value: Some(v),
            } => {
                match self.keys.get_mut(key) {
                    Some(k) => {
                        let o = &mut k.offset;
                        if v.start_offset >= 0 {
                            o.start_offset = v.start_offset;
                        }
                        if v.leader_epoch >= 0 {
                            o.leader_epoch = o.leader_epoch.max(v.leader_epoch);
                        }
                        if v.delivery_complete_count >= 0 {
                            o.delivery_complete_count = v.delivery_complete_count;
                        }
                        o.state_batches =
                            combine(&o.state_batches, &v.state_batches, o.start_offset);
                        k.updates_since_snapshot = k.updates_since_snapshot.saturating_add(1);
                    }
                    None => {
                        // An update without its snapshot (compacted away, or written by a
                        // version that did so): it is all that is known.
                        self.keys.insert(
                            key.clone(),
                            KeyState {
                                offset: ShareGroupOffset {
                                    snapshot_epoch: v.snapshot_epoch,
                                    state_epoch: 0,
                                    leader_epoch: v.leader_epoch,
                                    start_offset: v.start_offset,
                                    delivery_complete_count: v.delivery_complete_count,
                                    create_timestamp_ms: -1,
                                    write_timestamp_ms: -1,
                                    state_batches: combine(&[], &v.state_batches, v.start_offset),
                                },
                                updates_since_snapshot: 0,
                                replay_from: offset,
                            },
                        );
                    }
                }
            }
            ShareCoordinatorRecord::ShareSnapshot { key, value: None }
            | ShareCoordinatorRecord::ShareUpdate { key, value: None } => {
                self.keys.remove(key);
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PartitionStatus {
    Loading,
    Active,
}

/// Records written above the high watermark, not yet in the committed image.
#[derive(Debug)]
struct PendingWrite {
    /// `None` for records found above the high watermark by a load.
    write: Option<WriteId>,
    /// The offset after the write's records; `None` until the broker says.
    end_offset: Option<i64>,
    records: Vec<ShareCoordinatorRecord>,
}

/// The share coordinator's state machine. See the module's design note.
#[derive(Debug)]
pub struct ShareCoordinator {
    config: ShareCoordinatorConfig,
    partitions: BTreeMap<i32, PartitionStatus>,
    /// Newest state, what decisions read.
    live: BTreeMap<i32, Image>,
    /// Replicated state, what reads are answered from.
    committed: BTreeMap<i32, Image>,
    pending: BTreeMap<i32, VecDeque<PendingWrite>>,
    next_write: u64,
    /// When [`ShareCoordinator::tick`] next snapshots cold share-partitions.
    cold_deadline_ms: Option<i64>,
    /// Per partition, the committed end offset at the last cold snapshot tick: a
    /// share-partition whose replay still starts below it was not snapshotted since.
    cold_mark: BTreeMap<i32, i64>,
}

impl ShareCoordinator {
    pub fn new(config: ShareCoordinatorConfig) -> Self {
        ShareCoordinator {
            config,
            partitions: BTreeMap::new(),
            live: BTreeMap::new(),
            committed: BTreeMap::new(),
            pending: BTreeMap::new(),
            next_write: 0,
            cold_deadline_ms: None,
            cold_mark: BTreeMap::new(),
        }
    }

    pub fn config(&self) -> &ShareCoordinatorConfig {
        &self.config
    }

    /// The `__share_group_state` partition of `key`.
    pub fn partition_for(&self, key: &SharePartitionKey) -> i32 {
        key.partition_for(self.config.state_topic_num_partitions)
    }

    /// The partitions loaded or loading.
    pub fn loaded_partitions(&self) -> Vec<i32> {
        self.partitions.keys().copied().collect()
    }

    /// The partitions with records not yet committed.
    pub fn uncommitted_partitions(&self) -> Vec<i32> {
        self.pending.keys().copied().collect()
    }

    /// The committed state of `key`, as Read would see it.
    pub fn committed_state(&self, key: &SharePartitionKey) -> Option<&ShareGroupOffset> {
        self.committed
            .get(&self.partition_for(key))
            .and_then(|i| i.keys.get(key))
            .map(|k| &k.offset)
    }

    /// The newest state of `key`, records not yet committed included.
    pub fn live_state(&self, key: &SharePartitionKey) -> Option<&ShareGroupOffset> {
        self.live
            .get(&self.partition_for(key))
            .and_then(|i| i.keys.get(key))
            .map(|k| &k.offset)
    }

    /// Every committed share-partition of `partition`, for tests and descriptions.
    pub fn committed_keys(&self, partition: i32) -> Vec<(SharePartitionKey, ShareGroupOffset)> {
        self.committed
            .get(&partition)
            .map(|i| {
                i.keys
                    .iter()
                    .map(|(k, v)| (k.clone(), v.offset.clone()))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Every share-partition of `partition` in its newest state.
    pub fn live_keys(&self, partition: i32) -> Vec<(SharePartitionKey, ShareGroupOffset)> {
        self.live
            .get(&partition)
            .map(|i| {
                i.keys
                    .iter()
                    .map(|(k, v)| (k.clone(), v.offset.clone()))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The offset of `partition` below which every record is redundant: no replay needs it,
    /// because every share-partition's last snapshot is at or after it (Kafka's
    /// `lastRedundantOffset`). Computed on committed records only, so it is at most the high
    /// watermark; the broker may delete the records below it (DeleteRecords, as Kafka's
    /// `share.coordinator.state.topic.prune.interval.ms` job does), and a load of what is
    /// left rebuilds the same state. `None` while nothing is known of the partition.
    pub fn last_redundant_offset(&self, partition: i32) -> Option<i64> {
        let image = self.committed.get(&partition)?;
        let mut min = image.end_offset;
        for k in image.keys.values() {
            min = match (min, k.replay_from) {
                (Some(m), Some(r)) => Some(m.min(r)),
                (m, None) | (None, m) => m,
            };
        }
        min
    }

    /// A load of `partition` begins: its share-partitions answer COORDINATOR_LOAD_IN_PROGRESS
    /// until [`ShareCoordinator::load_done`].
    pub fn load_start(&mut self, partition: i32) {
        self.drop_partition(partition);
        self.partitions.insert(partition, PartitionStatus::Loading);
    }

    /// One record of the partition's log at `offset`, in order; `committed` when it is below
    /// the high watermark read at the start of the load.
    pub fn replay(
        &mut self,
        partition: i32,
        offset: i64,
        record: ShareCoordinatorRecord,
        committed: bool,
    ) {
        if self.partition_for(record.key()) != partition {
            return;
        }
        self.live
            .entry(partition)
            .or_default()
            .apply(&record, Some(offset));
        if committed {
            self.committed
                .entry(partition)
                .or_default()
                .apply(&record, Some(offset));
        } else {
            self.pending
                .entry(partition)
                .or_default()
                .push_back(PendingWrite {
                    write: None,
                    end_offset: Some(offset + 1),
                    records: vec![record],
                });
        }
    }

    /// The log of `partition` is replayed: its share-partitions are served.
    pub fn load_done(&mut self, partition: i32, now_ms: i64) {
        self.partitions.insert(partition, PartitionStatus::Active);
        if self.cold_deadline_ms.is_none() {
            self.cold_deadline_ms =
                Some(now_ms.saturating_add(self.config.cold_partition_snapshot_interval_ms));
        }
    }

    /// When [`ShareCoordinator::tick`] should next run.
    pub fn next_deadline(&self) -> Option<i64> {
        self.cold_deadline_ms
    }

    /// Snapshots the cold share-partitions (Kafka's `snapshotColdPartitions`): those whose
    /// replay still starts below where the partition's committed log ended at the last tick,
    /// so that every share-partition's replay starts within about two intervals of the end
    /// and [`ShareCoordinator::last_redundant_offset`] keeps moving.
    pub fn tick(&mut self, now_ms: i64) -> Vec<ColdSnapshot> {
        let Some(deadline) = self.cold_deadline_ms else {
            return Vec::new();
        };
        if now_ms < deadline {
            return Vec::new();
        }
        self.cold_deadline_ms =
            Some(now_ms.saturating_add(self.config.cold_partition_snapshot_interval_ms));
        let active: Vec<i32> = self
            .partitions
            .iter()
            .filter(|(_, s)| **s == PartitionStatus::Active)
            .map(|(p, _)| *p)
            .collect();
        let mut out = Vec::new();
        for partition in active {
            let Some(committed) = self.committed.get(&partition) else {
                continue;
            };
            let end = committed.end_offset.unwrap_or(0);
            let mark = self.cold_mark.insert(partition, end);
            let Some(mark) = mark else {
                continue;
            };
            let cold: Vec<SharePartitionKey> = committed
                .keys
                .iter()
                .filter(|(_, k)| k.replay_from.is_some_and(|r| r < mark))
                .map(|(key, _)| key.clone())
                .collect();
            let live = self.live.entry(partition).or_default();
            let records: Vec<ShareCoordinatorRecord> = cold
                .into_iter()
                .filter_map(|key| {
                    // The newest state: a snapshot goes after every record before it.
                    let o = &live.keys.get(&key)?.offset;
                    Some(ShareCoordinatorRecord::ShareSnapshot {
                        value: Some(ShareSnapshotValue {
                            snapshot_epoch: o.snapshot_epoch + 1,
                            state_epoch: o.state_epoch,
                            leader_epoch: o.leader_epoch,
                            start_offset: o.start_offset,
                            delivery_complete_count: o.delivery_complete_count,
                            create_timestamp_ms: o.create_timestamp_ms,
                            write_timestamp_ms: now_ms,
                            state_batches: o.state_batches.clone(),
                        }),
                        key,
                    })
                })
                .collect();
            if records.is_empty() {
                continue;
            }
            for r in &records {
                live.apply(r, None);
            }
            let write = WriteId(self.next_write);
            self.next_write += 1;
            self.pending
                .entry(partition)
                .or_default()
                .push_back(PendingWrite {
                    write: Some(write),
                    end_offset: None,
                    records: records.clone(),
                });
            out.push(ColdSnapshot {
                write,
                partition,
                records,
            });
        }
        out
    }

    /// This node no longer leads `partition` (or a write to it failed and it is reloaded):
    /// its state goes. The broker answers the replies it holds for it NOT_COORDINATOR.
    pub fn unload(&mut self, partition: i32) {
        self.drop_partition(partition);
    }

    fn drop_partition(&mut self, partition: i32) {
        self.partitions.remove(&partition);
        self.cold_mark.remove(&partition);
        self.live.remove(&partition);
        self.committed.remove(&partition);
        self.pending.remove(&partition);
    }

    /// Write `write`'s records of `partition` ended at `end_offset` (exclusive).
    pub fn appended(&mut self, write: WriteId, partition: i32, end_offset: i64) {
        if let Some(w) = self
            .pending
            .get_mut(&partition)
            .and_then(|q| q.iter_mut().find(|w| w.write == Some(write)))
        {
            w.end_offset = Some(end_offset);
        }
    }

    /// The high watermark of `partition` reached `offset`: the writes that ended at or below
    /// it become visible, oldest first. Returns those writes, whose replies may now be sent.
    pub fn commit_up_to(&mut self, partition: i32, offset: i64) -> Vec<WriteId> {
        let Some(queue) = self.pending.get_mut(&partition) else {
            return Vec::new();
        };
        let mut done = Vec::new();
        while queue
            .front()
            .is_some_and(|w| w.end_offset.is_some_and(|end| end <= offset))
        {
            if let Some(w) = queue.pop_front() {
                done.push(w);
            }
        }
        if queue.is_empty() {
            self.pending.remove(&partition);
        }
        let image = self.committed.entry(partition).or_default();
        let mut writes = Vec::new();
        for w in done {
            // Checked by the loop above: every write taken has its end offset.
            let end = w.end_offset.unwrap_or(offset);
            let first = end - w.records.len() as i64;
            for (i, r) in w.records.iter().enumerate() {
                image.apply(r, Some(first + i as i64));
            }
            writes.extend(w.write);
        }
        writes
    }

    /// Handles one call at `now_ms` (protocol steps 1 to 4).
    pub fn handle(&mut self, request: Request, now_ms: i64) -> Output {
        let key = request.key().clone();
        let partition = self.partition_for(&key);
        match self.partitions.get(&partition) {
            Some(PartitionStatus::Active) => {}
            Some(PartitionStatus::Loading) => {
                return Output::Reply(Response::error(
                    &request,
                    ErrorCode::COORDINATOR_LOAD_IN_PROGRESS,
                ))
            }
            None => return Output::Reply(Response::error(&request, ErrorCode::NOT_COORDINATOR)),
        }
        if key.partition < 0 || key.topic_id.is_zero() || key.group_id.is_empty() {
            return Output::Reply(Response::error(&request, ErrorCode::INVALID_REQUEST));
        }
        if let Request::Write { state_batches, .. } = &request {
            let bad = state_batches.iter().any(|b| {
                b.is_empty()
                    || b.first_offset < 0
                    || b.last_offset == i64::MAX
                    || b.delivery_count < 0
            });
            if bad {
                return Output::Reply(Response::error(&request, ErrorCode::INVALID_REQUEST));
            }
        }
        let live = self
            .live
            .get(&partition)
            .and_then(|i| i.keys.get(&key))
            .cloned();
        let records = match &request {
            Request::Write {
                state_epoch,
                leader_epoch,
                start_offset,
                delivery_complete_count,
                state_batches,
                ..
            } => {
                if let Some(k) = &live {
                    if k.offset.leader_epoch > *leader_epoch {
                        return Output::Reply(Response::error(
                            &request,
                            ErrorCode::FENCED_LEADER_EPOCH,
                        ));
                    }
                    if k.offset.state_epoch > *state_epoch {
                        return Output::Reply(Response::error(
                            &request,
                            ErrorCode::FENCED_STATE_EPOCH,
                        ));
                    }
                }
                vec![self.write_record(
                    &key,
                    live.as_ref(),
                    *state_epoch,
                    *leader_epoch,
                    *start_offset,
                    *delivery_complete_count,
                    state_batches,
                    now_ms,
                )]
            }
            Request::Read { leader_epoch, .. } => match &live {
                Some(k) if k.offset.leader_epoch > *leader_epoch => {
                    return Output::Reply(Response::error(
                        &request,
                        ErrorCode::FENCED_LEADER_EPOCH,
                    ));
                }
                Some(k) if k.offset.leader_epoch < *leader_epoch => {
                    vec![ShareCoordinatorRecord::ShareUpdate {
                        key: key.clone(),
                        value: Some(ShareUpdateValue {
                            snapshot_epoch: k.offset.snapshot_epoch,
                            leader_epoch: *leader_epoch,
                            start_offset: -1,
                            delivery_complete_count: -1,
                            state_batches: Vec::new(),
                        }),
                    }]
                }
                _ => return Output::Reply(self.read(&key)),
            },
            Request::ReadSummary { leader_epoch, .. } => {
                if let Some(k) = &live {
                    if *leader_epoch >= 0 && k.offset.leader_epoch > *leader_epoch {
                        return Output::Reply(Response::error(
                            &request,
                            ErrorCode::FENCED_LEADER_EPOCH,
                        ));
                    }
                }
                return Output::Reply(self.read_summary(&key));
            }
            Request::Initialize {
                state_epoch,
                start_offset,
                ..
            } => {
                if live
                    .as_ref()
                    .is_some_and(|k| k.offset.state_epoch > *state_epoch)
                {
                    return Output::Reply(Response::error(&request, ErrorCode::FENCED_STATE_EPOCH));
                }
                vec![ShareCoordinatorRecord::ShareSnapshot {
                    key: key.clone(),
                    value: Some(ShareSnapshotValue {
                        snapshot_epoch: live.as_ref().map_or(0, |k| k.offset.snapshot_epoch + 1),
                        state_epoch: *state_epoch,
                        // Kafka starts the leader epochs over: the new state epoch fences
                        // the leaders of the old one.
                        leader_epoch: 0,
                        start_offset: *start_offset,
                        delivery_complete_count: if *start_offset < 0 { -1 } else { 0 },
                        create_timestamp_ms: now_ms,
                        write_timestamp_ms: now_ms,
                        state_batches: Vec::new(),
                    }),
                }]
            }
            Request::Delete { .. } => {
                if live.is_none() {
                    return Output::Reply(Response::Delete {
                        error: ErrorCode::NONE,
                    });
                }
                vec![
                    ShareCoordinatorRecord::ShareSnapshot {
                        key: key.clone(),
                        value: None,
                    },
                    ShareCoordinatorRecord::ShareUpdate {
                        key: key.clone(),
                        value: None,
                    },
                ]
            }
        };
        let image = self.live.entry(partition).or_default();
        for r in &records {
            image.apply(r, None);
        }
        // The answer as of these records: it is sent once they are committed.
        let reply = match &request {
            Request::Read { .. } => Self::read_from(image.keys.get(&key).map(|k| &k.offset)),
            Request::Write { .. } => Response::Write {
                error: ErrorCode::NONE,
            },
            Request::Initialize { .. } => Response::Initialize {
                error: ErrorCode::NONE,
            },
            Request::Delete { .. } => Response::Delete {
                error: ErrorCode::NONE,
            },
            Request::ReadSummary { .. } => {
                Self::summary_from(image.keys.get(&key).map(|k| &k.offset))
            }
        };
        let write = WriteId(self.next_write);
        self.next_write += 1;
        self.pending
            .entry(partition)
            .or_default()
            .push_back(PendingWrite {
                write: Some(write),
                end_offset: None,
                records: records.clone(),
            });
        Output::Persist {
            write,
            partition,
            records,
            reply,
        }
    }

    /// The record of a write (protocol step 2).
    #[allow(clippy::too_many_arguments)]
    fn write_record(
        &self,
        key: &SharePartitionKey,
        live: Option<&KeyState>,
        state_epoch: i32,
        leader_epoch: i32,
        start_offset: i64,
        delivery_complete_count: i32,
        state_batches: &[StateBatch],
        now_ms: i64,
    ) -> ShareCoordinatorRecord {
        match live {
            None => ShareCoordinatorRecord::ShareSnapshot {
                key: key.clone(),
                value: Some(ShareSnapshotValue {
                    snapshot_epoch: 0,
                    state_epoch,
                    leader_epoch,
                    start_offset,
                    delivery_complete_count,
                    create_timestamp_ms: now_ms,
                    write_timestamp_ms: now_ms,
                    state_batches: combine(&[], state_batches, start_offset),
                }),
            },
            Some(k)
                if k.updates_since_snapshot >= self.config.snapshot_update_records_per_snapshot =>
            {
                let o = &k.offset;
                let start = if start_offset < 0 {
                    o.start_offset
                } else {
                    start_offset
                };
                ShareCoordinatorRecord::ShareSnapshot {
                    key: key.clone(),
                    value: Some(ShareSnapshotValue {
                        snapshot_epoch: o.snapshot_epoch + 1,
                        state_epoch: if state_epoch < 0 {
                            o.state_epoch
                        } else {
                            state_epoch
                        },
                        leader_epoch: if leader_epoch < 0 {
                            o.leader_epoch
                        } else {
                            leader_epoch
                        },
                        start_offset: start,
                        delivery_complete_count: if delivery_complete_count < 0 {
                            o.delivery_complete_count
                        } else {
                            delivery_complete_count
                        },
                        create_timestamp_ms: o.create_timestamp_ms,
                        write_timestamp_ms: now_ms,
                        state_batches: combine(&o.state_batches, state_batches, start),
                    }),
                }
            }
            Some(k) => ShareCoordinatorRecord::ShareUpdate {
                key: key.clone(),
                value: Some(ShareUpdateValue {
                    snapshot_epoch: k.offset.snapshot_epoch,
                    leader_epoch,
                    start_offset,
                    delivery_complete_count,
                    state_batches: combine(&[], state_batches, start_offset),
                }),
            },
        }
    }

    fn read(&self, key: &SharePartitionKey) -> Response {
        Self::read_from(self.committed_state(key))
    }

    fn read_summary(&self, key: &SharePartitionKey) -> Response {
        Self::summary_from(self.committed_state(key))
    }

    fn read_from(state: Option<&ShareGroupOffset>) -> Response {
        match state {
            Some(o) => Response::Read {
                error: ErrorCode::NONE,
                state_epoch: o.state_epoch,
                start_offset: o.start_offset,
                state_batches: o.state_batches.clone(),
            },
            None => Response::Read {
                error: ErrorCode::NONE,
                state_epoch: 0,
                start_offset: -1,
                state_batches: Vec::new(),
            },
        }
    }

    fn summary_from(state: Option<&ShareGroupOffset>) -> Response {
        match state {
            Some(o) => Response::ReadSummary {
                error: ErrorCode::NONE,
                state_epoch: o.state_epoch,
                leader_epoch: o.leader_epoch,
                start_offset: o.start_offset,
                delivery_complete_count: o.delivery_complete_count,
            },
            None => Response::ReadSummary {
                error: ErrorCode::NONE,
                state_epoch: 0,
                leader_epoch: -1,
                start_offset: -1,
                delivery_complete_count: -1,
            },
        }
    }
}
