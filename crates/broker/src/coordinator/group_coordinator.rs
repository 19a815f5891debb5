//! The group coordinator's runtime: the pure `rill-group` state machine driven by one task,
//! with its records kept in the internal topic `__consumer_offsets`.
//!
//! # Design note
//!
//! 1. One task owns the [`GroupCoordinator`]. Connections send it calls over a bounded
//!    channel with a oneshot for the answer, so the state machine sees one event at a time
//!    and needs no lock (the seeds' single-threaded event loop).
//! 2. A call that parks (JoinGroup, SyncGroup) gets a responder id; its oneshot waits in
//!    `pending` until an output names that id, possibly many calls or ticks later.
//! 3. `Output::Persist` records are appended to their `__consumer_offsets` partitions in
//!    the order the outputs came, and the state machine is told where each batch ended.
//!    The responses that depend on them wait until the high watermark has passed them
//!    (Kafka appends these with acks=all), so no client hears of a commit or an
//!    assignment that a crash of this broker could lose. The wait runs beside the
//!    coordinator task, which goes on serving; when it ends, the task reports the high
//!    watermark to the state machine ([`GroupCoordinator::commit_up_to`], which makes the
//!    offsets visible to OffsetFetch) before it sends the responses, so a client reads
//!    its own commit. A failed write answers those requests with the mapped error and
//!    reloads the partition from the log, which rebuilds exactly what was written; a
//!    failed wait (leadership moved, timeout) only answers with the mapped error: the
//!    records stay in the log, invisible to reads, and the state machine agrees with the
//!    log whether they later commit here or are truncated after a move.
//! 4. While offset records are above the high watermark (a timed-out wait, or a loaded
//!    tail), the task polls the partition's high watermark every [`HW_POLL`] and
//!    reports it, so they become visible once replicated without a later write.
//! 5. Between events the task sleeps until [`GroupCoordinator::next_deadline`] and then
//!    calls `tick` (session timeouts, rebalance timeouts, the initial delay, offset expiry).
//! 6. The coordinator serves the groups of the `__consumer_offsets` partitions this broker
//!    leads: when the metadata publisher makes it a partition's leader, the partition is
//!    replayed from the log ([`GroupCoordinatorHandle::elect`]; what is above the high
//!    watermark is replayed as uncommitted) before its groups are served; when leadership moves away its groups are dropped
//!    ([`GroupCoordinatorHandle::resign`]) and their clients told NOT_COORDINATOR, so that
//!    they find the new coordinator, which replays the same records.
//!
//! Records use Kafka's formats (`group-coordinator/*.json`): the key is a version-prefixed
//! `OffsetCommitKey` (versions 0-1) or `GroupMetadataKey` (version 2), the value a
//! version-prefixed value or null for a tombstone, so the topic could be read by Kafka's
//! own tools.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use rill_group::{
    GroupConfig, GroupCoordinator, GroupMetadataKey, GroupMetadataRecord, GroupMetadataValue,
    MemberMetadata, OffsetCommitKey, OffsetCommitRecord, OffsetCommitValue, Output, Record,
    Respond, Response,
};
use rill_protocol::generated::group_coordinator::{
    group_metadata_key as gmk, group_metadata_value as gmv, offset_commit_key as ock,
    offset_commit_value as ocv,
};
use rill_protocol::records::{CompressionType, RecordBatch, RecordBatchBuilder};
use rill_protocol::{Decodable, Encodable, ErrorCode};
use rill_storage::{AppendOrigin, TopicPartition};
use tokio::sync::{mpsc, oneshot};

use crate::replication::replica_manager::ReplicaManager;

pub const OFFSETS_TOPIC: &str = "__consumer_offsets";

/// Calls waiting for the coordinator task; senders wait (back-pressure) beyond this.
const CALL_QUEUE_DEPTH: usize = 1024;
/// Largest batch of `__consumer_offsets` decoded while loading.
const LOAD_MAX_DECOMPRESSED_BYTES: usize = 64 * 1024 * 1024;
const LOAD_READ_BYTES: usize = 1024 * 1024;
/// Ended replication waits queued for the coordinator task; waiters wait beyond this.
const REPLICATED_QUEUE_DEPTH: usize = 1024;
/// How often the high watermark of a partition with invisible offset records is read.
const HW_POLL: std::time::Duration = std::time::Duration::from_millis(200);

/// A request for the coordinator.
pub enum GroupCall {
    Join(rill_group::JoinGroupRequest),
    Sync(rill_group::SyncGroupRequest),
    Leave(rill_group::LeaveGroupRequest),
    OffsetCommit(rill_group::OffsetCommitRequest),
    OffsetDelete(rill_group::OffsetDeleteRequest),
    DeleteGroups(rill_group::DeleteGroupsRequest),
    Heartbeat(rill_group::HeartbeatRequest),
    OffsetFetch(Vec<rill_group::OffsetFetchRequest>),
    DescribeGroups(rill_group::DescribeGroupsRequest),
    ListGroups(rill_group::ListGroupsRequest),
    /// This broker became the leader of the partition: load its groups.
    Elect(i32),
    /// This broker no longer leads the partition: drop its groups.
    Resign(i32),
    /// This broker lost its controller lease: drop every partition's groups.
    ResignAll,
    /// This broker holds its lease again: load every partition it leads that is not.
    ElectLed,
}

/// The coordinator's answer to a [`GroupCall`].
pub enum GroupReply {
    Response(Response),
    Heartbeat(rill_group::HeartbeatResponse),
    OffsetFetch(Vec<rill_group::OffsetFetchResponse>),
    DescribeGroups(rill_group::DescribeGroupsResponse),
    ListGroups(rill_group::ListGroupsResponse),
    Done,
}

type Envelope = (GroupCall, oneshot::Sender<GroupReply>);

/// Where connections send group calls.
#[derive(Clone)]
pub struct GroupCoordinatorHandle {
    tx: mpsc::Sender<Envelope>,
}

impl GroupCoordinatorHandle {
    /// A handle with no coordinator behind it (every call answers
    /// COORDINATOR_NOT_AVAILABLE), used until the real one has loaded.
    pub fn detached() -> Self {
        let (tx, _) = mpsc::channel(1);
        Self { tx }
    }

    /// Sends a call and waits for its answer. `Err` means the coordinator is gone
    /// (shutting down): clients get COORDINATOR_NOT_AVAILABLE and retry elsewhere.
    pub async fn call(&self, call: GroupCall) -> Result<GroupReply, ErrorCode> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send((call, reply))
            .await
            .map_err(|_| ErrorCode::COORDINATOR_NOT_AVAILABLE)?;
        // A JoinGroup may wait here for the whole rebalance: the request that made the
        // call gives its slot back (see `request_slot`).
        crate::network::request_slot::park();
        rx.await.map_err(|_| ErrorCode::COORDINATOR_NOT_AVAILABLE)
    }

    /// Loads a partition's groups (this broker now leads it); returns once loaded.
    pub async fn elect(&self, partition: i32) {
        let _ = self.call(GroupCall::Elect(partition)).await;
    }

    /// Drops a partition's groups (this broker no longer leads it).
    pub async fn resign(&self, partition: i32) {
        let _ = self.call(GroupCall::Resign(partition)).await;
    }

    /// Drops every partition's groups: the broker lost its controller lease, so another
    /// broker may coordinate them already.
    pub async fn resign_all(&self) {
        let _ = self.call(GroupCall::ResignAll).await;
    }

    /// Loads every `__consumer_offsets` partition this broker leads and does not serve
    /// (the lease is back; leaderships it kept were not announced again).
    pub async fn elect_led(&self) {
        let _ = self.call(GroupCall::ElectLed).await;
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

struct Runtime {
    coordinator: GroupCoordinator,
    replicas: Arc<ReplicaManager>,
    num_partitions: i32,
    commit_timeout: std::time::Duration,
    pending: HashMap<u64, oneshot::Sender<GroupReply>>,
    next_responder: u64,
    replicated: mpsc::Sender<Replicated>,
}

/// A wait for the high watermark that succeeded: each (partition, offset) was passed;
/// the responses go out once the state machine has heard of it.
struct Replicated {
    reached: Vec<(i32, i64)>,
    responses: Vec<(oneshot::Sender<GroupReply>, Response)>,
}

/// Starts the coordinator task; it serves no partition until [`GroupCoordinatorHandle::elect`].
pub fn start(config: GroupConfig, replicas: Arc<ReplicaManager>) -> GroupCoordinatorHandle {
    let num_partitions = config.offsets_topic_num_partitions;
    let commit_timeout = std::time::Duration::from_millis(
        u64::try_from(config.offsets_commit_timeout_ms).unwrap_or(0),
    );
    let seed = u64::from_le_bytes(
        uuid::Uuid::new_v4().as_bytes()[..8]
            .try_into()
            .unwrap_or([7; 8]),
    );
    let (replicated, replicated_rx) = mpsc::channel(REPLICATED_QUEUE_DEPTH);
    let runtime = Runtime {
        coordinator: GroupCoordinator::new(config, seed),
        replicas,
        num_partitions,
        commit_timeout,
        pending: HashMap::new(),
        next_responder: 1,
        replicated,
    };
    let (tx, rx) = mpsc::channel(CALL_QUEUE_DEPTH);
    tokio::spawn(runtime.run(rx, replicated_rx));
    GroupCoordinatorHandle { tx }
}

impl Runtime {
    async fn run(
        mut self,
        mut rx: mpsc::Receiver<Envelope>,
        mut replicated_rx: mpsc::Receiver<Replicated>,
    ) {
        let mut hw_poll = tokio::time::interval(HW_POLL);
        hw_poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let polling = !self.coordinator.uncommitted_partitions().is_empty();
            let deadline = self.coordinator.next_deadline();
            let sleep = async {
                match deadline {
                    Some(at) => {
                        let wait = (at - now_ms()).max(0) as u64;
                        tokio::time::sleep(std::time::Duration::from_millis(wait)).await
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                call = rx.recv() => match call {
                    Some((call, reply)) => self.dispatch(call, reply),
                    None => return,
                },
                Some(done) = replicated_rx.recv() => self.on_replicated(done),
                _ = hw_poll.tick(), if polling => self.report_high_watermarks(),
                _ = sleep => {
                    let outputs = self.coordinator.tick(now_ms());
                    self.act(outputs);
                }
            }
        }
    }

    fn on_replicated(&mut self, done: Replicated) {
        for (partition, offset) in done.reached {
            self.coordinator.commit_up_to(partition, offset);
        }
        for (tx, response) in done.responses {
            let _ = tx.send(GroupReply::Response(response));
        }
    }

    /// Tells the state machine the high watermark of every partition with offset
    /// records it does not serve yet.
    fn report_high_watermarks(&mut self) {
        for partition in self.coordinator.uncommitted_partitions() {
            let tp = TopicPartition {
                topic: OFFSETS_TOPIC.to_string(),
                partition,
            };
            if let Ok(o) = self.replicas.offsets(&tp) {
                self.coordinator.commit_up_to(partition, o.high_watermark);
            }
        }
    }

    fn responder(&mut self, reply: oneshot::Sender<GroupReply>) -> u64 {
        let id = self.next_responder;
        self.next_responder += 1;
        self.pending.insert(id, reply);
        id
    }

    fn dispatch(&mut self, call: GroupCall, reply: oneshot::Sender<GroupReply>) {
        let now = now_ms();
        let c = &mut self.coordinator;
        // Immediate answers first; a dropped receiver (client gone) is not an error.
        let immediate = match call {
            GroupCall::Heartbeat(r) => Ok(GroupReply::Heartbeat(c.handle_heartbeat(r, now))),
            GroupCall::OffsetFetch(groups) => Ok(GroupReply::OffsetFetch(
                groups.iter().map(|g| c.handle_offset_fetch(g)).collect(),
            )),
            GroupCall::DescribeGroups(r) => {
                Ok(GroupReply::DescribeGroups(c.handle_describe_groups(&r)))
            }
            GroupCall::ListGroups(r) => Ok(GroupReply::ListGroups(c.handle_list_groups(&r))),
            GroupCall::Elect(p) => {
                self.load(p);
                Ok(GroupReply::Done)
            }
            GroupCall::Resign(p) => {
                let outputs = self.coordinator.unload_partition(p);
                self.act(outputs);
                Ok(GroupReply::Done)
            }
            GroupCall::ResignAll => {
                for p in self.coordinator.loaded_partitions() {
                    let outputs = self.coordinator.unload_partition(p);
                    self.act(outputs);
                }
                Ok(GroupReply::Done)
            }
            GroupCall::ElectLed => {
                let loaded = self.coordinator.loaded_partitions();
                for p in 0..self.num_partitions {
                    let tp = TopicPartition {
                        topic: OFFSETS_TOPIC.to_string(),
                        partition: p,
                    };
                    if !loaded.contains(&p) && self.replicas.leader_partition(&tp).is_ok() {
                        self.load(p);
                    }
                }
                Ok(GroupReply::Done)
            }
            other => Err(other),
        };
        let call = match immediate {
            Ok(answer) => {
                let _ = reply.send(answer);
                return;
            }
            Err(call) => call,
        };
        let id = self.responder(reply);
        let c = &mut self.coordinator;
        let outputs = match call {
            GroupCall::Join(r) => c.handle_join(r, now, id),
            GroupCall::Sync(r) => c.handle_sync(r, now, id),
            GroupCall::Leave(r) => c.handle_leave(r, now, id),
            GroupCall::OffsetCommit(r) => c.handle_offset_commit(r, now, id),
            GroupCall::OffsetDelete(r) => c.handle_offset_delete(r, now, id),
            GroupCall::DeleteGroups(r) => c.handle_delete_groups(r, now, id),
            _ => Vec::new(),
        };
        self.act(outputs);
    }

    fn send(&mut self, respond: Respond) {
        if let Some(reply) = self.pending.remove(&respond.responder) {
            let _ = reply.send(GroupReply::Response(respond.response));
        }
    }

    fn act(&mut self, outputs: Vec<Output>) {
        for output in outputs {
            match output {
                Output::Respond(r) => self.send(r),
                Output::Persist {
                    write,
                    records,
                    responses,
                } => {
                    let (appended, failed) = self.persist(&records);
                    for a in &appended {
                        self.coordinator
                            .appended(write, a.tp.partition, a.end_offset);
                    }
                    if failed.is_empty() {
                        self.answer_when_replicated(appended, responses);
                        continue;
                    }
                    for r in responses {
                        let response = r
                            .response
                            .failed(ErrorCode::COORDINATOR_NOT_AVAILABLE.code());
                        self.send(Respond {
                            responder: r.responder,
                            response,
                        });
                    }
                    for p in failed {
                        let outputs = self.coordinator.unload_partition(p);
                        self.act(outputs);
                        self.load(p);
                    }
                }
            }
        }
    }

    /// Sends `responses` once every appended batch is below its partition's high
    /// watermark (Kafka's DelayedProduce with acks=all, bounded by
    /// `offsets.commit.timeout.ms`), through the coordinator task so that the state
    /// machine hears of it first; or at once with the mapped error when the wait fails.
    fn answer_when_replicated(&mut self, appended: Vec<Appended>, responses: Vec<Respond>) {
        let waiting: Vec<(oneshot::Sender<GroupReply>, Response)> = responses
            .into_iter()
            .filter_map(|r| self.pending.remove(&r.responder).map(|tx| (tx, r.response)))
            .collect();
        if waiting.is_empty() {
            // Nothing to answer; the high-watermark poll makes the records visible.
            return;
        }
        let replicas = self.replicas.clone();
        let replicated = self.replicated.clone();
        let deadline = tokio::time::Instant::now() + self.commit_timeout;
        tokio::spawn(async move {
            let mut error = ErrorCode::NONE;
            for a in &appended {
                // One in-sync replica is enough once the high watermark has passed the
                // batch: every ISR member has it. min.insync.replicas was Kafka's check
                // before the append; an offsets topic below it still commits here.
                error = replicas
                    .wait_for_commit(&a.tp, a.leader_epoch, a.end_offset, 1, deadline)
                    .await;
                if error != ErrorCode::NONE {
                    tracing::debug!(tp = %a.tp, error = error.name(), "group records not replicated");
                    break;
                }
            }
            if error == ErrorCode::NONE {
                let reached = appended
                    .iter()
                    .map(|a| (a.tp.partition, a.end_offset))
                    .collect();
                let done = Replicated {
                    reached,
                    responses: waiting,
                };
                // Fails only when the coordinator is gone; the dropped senders then
                // answer COORDINATOR_NOT_AVAILABLE.
                let _ = replicated.send(done).await;
                return;
            }
            for (tx, response) in waiting {
                let code = replication_error(error, &response);
                let _ = tx.send(GroupReply::Response(response.failed(code.code())));
            }
        });
    }

    /// Appends records to their partitions, one batch per partition; says where each
    /// batch ended, for [`Runtime::answer_when_replicated`], and which partitions failed.
    fn persist(&self, records: &[(i32, Record)]) -> (Vec<Appended>, Vec<i32>) {
        let mut by_partition: HashMap<i32, Vec<&Record>> = HashMap::new();
        for (p, r) in records {
            by_partition.entry(*p).or_default().push(r);
        }
        let now = now_ms();
        let mut failed = Vec::new();
        let mut appended = Vec::new();
        for (p, records) in by_partition {
            let tp = TopicPartition {
                topic: OFFSETS_TOPIC.to_string(),
                partition: p,
            };
            let written = build_batch(&records, now).and_then(|batch| {
                let (_, leader_epoch) = self
                    .replicas
                    .isr_size(&tp)
                    .map_err(|code| format!("append: {}", code.name()))?;
                self.replicas
                    .append_with_origin(&tp, &batch, AppendOrigin::Coordinator)
                    .map(|(info, _)| (leader_epoch, info.last_offset + 1))
                    .map_err(|code| format!("append: {}", code.name()))
            });
            match written {
                Ok((leader_epoch, end_offset)) => appended.push(Appended {
                    tp,
                    leader_epoch,
                    end_offset,
                }),
                Err(e) => {
                    tracing::error!(%tp, error = %e, "writing group records failed");
                    failed.push(p);
                }
            }
        }
        (appended, failed)
    }

    /// Replays one partition of `__consumer_offsets` into the state machine.
    fn load(&mut self, p: i32) {
        if p >= self.num_partitions {
            return;
        }
        let outputs = self.coordinator.load_partition_start(p);
        self.act(outputs);
        let tp = TopicPartition {
            topic: OFFSETS_TOPIC.to_string(),
            partition: p,
        };
        // Records at or above the high watermark may not be on every in-sync replica
        // yet: they are replayed as uncommitted, served once the mark passes them.
        let (mut offset, high_watermark) = match self.replicas.offsets(&tp) {
            Ok(o) => (o.log_start_offset, o.high_watermark),
            Err(code) => {
                // Not the leader (any more, or without a lease): serving the groups from
                // an empty state would answer -1 for every committed offset.
                tracing::debug!(%tp, error = code.name(), "not loading group coordinator partition");
                let outputs = self.coordinator.unload_partition(p);
                self.act(outputs);
                return;
            }
        };
        let mut replayed = 0usize;
        loop {
            let Ok(chunk) = self.replicas.read_to_log_end(&tp, offset, LOAD_READ_BYTES) else {
                break;
            };
            if chunk.records.is_empty() {
                break;
            }
            let before = offset;
            for batch in RecordBatch::iter(chunk.records) {
                let Ok(batch) = batch else { break };
                offset = batch.next_offset();
                if batch.is_control() {
                    continue;
                }
                let Ok(records) = batch.records(LOAD_MAX_DECOMPRESSED_BYTES) else {
                    tracing::warn!(%tp, base_offset = batch.base_offset(), "undecodable batch skipped");
                    continue;
                };
                for r in records {
                    let Some(record) = decode_record(r.key.as_deref(), r.value.as_deref()) else {
                        continue;
                    };
                    let replayed_one = if r.offset < high_watermark {
                        self.coordinator.replay(p, &record)
                    } else {
                        self.coordinator.replay_uncommitted(p, r.offset, &record)
                    };
                    if let Err(e) = replayed_one {
                        tracing::warn!(%tp, offset = r.offset, error = %e, "record not replayed");
                    }
                    replayed += 1;
                }
            }
            if offset <= before {
                break;
            }
        }
        self.coordinator.load_partition_done(p, now_ms());
        if let Ok(o) = self.replicas.offsets(&tp) {
            self.coordinator.commit_up_to(p, o.high_watermark);
        }
        if replayed > 0 {
            tracing::info!(%tp, records = replayed, "loaded group coordinator partition");
        }
    }
}

/// Where a batch of group records ended in its partition.
struct Appended {
    tp: TopicPartition,
    leader_epoch: i32,
    end_offset: i64,
}

/// Kafka's mapping of a failed acks=all append of group records to what the group's
/// client understands: it looks for the coordinator again, retries, or rejoins.
fn replication_error(code: ErrorCode, response: &Response) -> ErrorCode {
    match code {
        ErrorCode::NOT_LEADER_OR_FOLLOWER | ErrorCode::KAFKA_STORAGE_ERROR => {
            ErrorCode::NOT_COORDINATOR
        }
        ErrorCode::REQUEST_TIMED_OUT => match response {
            // The assignment may not survive: the members must join again.
            Response::SyncGroup(_) | Response::JoinGroup(_) => ErrorCode::REBALANCE_IN_PROGRESS,
            Response::OffsetCommit(_) => ErrorCode::REQUEST_TIMED_OUT,
            _ => ErrorCode::COORDINATOR_NOT_AVAILABLE,
        },
        _ => ErrorCode::COORDINATOR_NOT_AVAILABLE,
    }
}

fn build_batch(records: &[&Record], now: i64) -> Result<Bytes, String> {
    let mut builder = RecordBatchBuilder::new(CompressionType::None, 0);
    for r in records {
        let (key, value) = encode_record(r).map_err(|e| format!("encode: {e}"))?;
        builder
            .append(now, Some(&key), value.as_deref(), &[])
            .map_err(|e| format!("batch: {e}"))?;
    }
    builder.build().map_err(|e| format!("batch: {e}"))
}

/// Value versions written: the newest non-flexible ones, which every Kafka tool reads.
const OFFSET_COMMIT_KEY_VERSION: i16 = 1;
const GROUP_METADATA_KEY_VERSION: i16 = 2;
const OFFSET_COMMIT_VALUE_VERSION: i16 = 3;
/// OffsetCommitValue v1 is the only version with an explicit expire timestamp.
const OFFSET_COMMIT_VALUE_VERSION_WITH_EXPIRY: i16 = 1;
const GROUP_METADATA_VALUE_VERSION: i16 = 3;

fn encode_versioned<T: Encodable>(version: i16, body: &T) -> Result<Vec<u8>, String> {
    let mut buf = BytesMut::with_capacity(2 + body.encoded_len(version));
    buf.put_i16(version);
    body.encode(&mut buf, version).map_err(|e| e.to_string())?;
    Ok(buf.to_vec())
}

/// A record's key and value (None for a tombstone) in Kafka's `__consumer_offsets` format.
pub fn encode_record(record: &Record) -> Result<(Vec<u8>, Option<Vec<u8>>), String> {
    match record {
        Record::OffsetCommit(r) => {
            let key = ock::OffsetCommitKey {
                group: r.key.group.clone(),
                topic: r.key.topic.clone(),
                partition: r.key.partition,
            };
            let key = encode_versioned(OFFSET_COMMIT_KEY_VERSION, &key)?;
            let value = match &r.value {
                None => None,
                Some(v) => {
                    let version = if v.expire_timestamp >= 0 {
                        OFFSET_COMMIT_VALUE_VERSION_WITH_EXPIRY
                    } else {
                        OFFSET_COMMIT_VALUE_VERSION
                    };
                    let value = ocv::OffsetCommitValue {
                        offset: v.offset,
                        leader_epoch: v.leader_epoch,
                        metadata: v.metadata.clone(),
                        commit_timestamp: v.commit_timestamp,
                        expire_timestamp: v.expire_timestamp,
                        ..Default::default()
                    };
                    Some(encode_versioned(version, &value)?)
                }
            };
            Ok((key, value))
        }
        Record::GroupMetadata(r) => {
            let key = gmk::GroupMetadataKey {
                group: r.key.group.clone(),
            };
            let key = encode_versioned(GROUP_METADATA_KEY_VERSION, &key)?;
            let value = match &r.value {
                None => None,
                Some(v) => {
                    let value = gmv::GroupMetadataValue {
                        protocol_type: v.protocol_type.clone(),
                        generation: v.generation,
                        protocol: v.protocol.clone(),
                        leader: v.leader.clone(),
                        current_state_timestamp: v.current_state_timestamp,
                        members: v
                            .members
                            .iter()
                            .map(|m| gmv::MemberMetadata {
                                member_id: m.member_id.clone(),
                                group_instance_id: m.group_instance_id.clone(),
                                client_id: m.client_id.clone(),
                                client_host: m.client_host.clone(),
                                rebalance_timeout: m.rebalance_timeout,
                                session_timeout: m.session_timeout,
                                subscription: m.subscription.clone(),
                                assignment: m.assignment.clone(),
                                ..Default::default()
                            })
                            .collect(),
                        ..Default::default()
                    };
                    Some(encode_versioned(GROUP_METADATA_VALUE_VERSION, &value)?)
                }
            };
            Ok((key, value))
        }
    }
}

fn split_version(bytes: &[u8]) -> Option<(i16, Bytes)> {
    let mut b = Bytes::copy_from_slice(bytes);
    if b.len() < 2 {
        return None;
    }
    let version = b.get_i16();
    Some((version, b))
}

/// Decodes a `__consumer_offsets` record; `None` for records this coordinator does not
/// own (the new consumer protocol's, share groups') or cannot read.
pub fn decode_record(key: Option<&[u8]>, value: Option<&[u8]>) -> Option<Record> {
    let (key_version, mut key) = split_version(key?)?;
    let value = match value {
        Some(v) => Some(split_version(v)?),
        None => None,
    };
    match key_version {
        0 | 1 => {
            let k = ock::OffsetCommitKey::decode(&mut key, key_version).ok()?;
            let value = match value {
                None => None,
                Some((version, mut v)) => {
                    let v = ocv::OffsetCommitValue::decode(&mut v, version).ok()?;
                    Some(OffsetCommitValue {
                        offset: v.offset,
                        leader_epoch: v.leader_epoch,
                        metadata: v.metadata,
                        commit_timestamp: v.commit_timestamp,
                        expire_timestamp: v.expire_timestamp,
                    })
                }
            };
            Some(Record::OffsetCommit(OffsetCommitRecord {
                key: OffsetCommitKey {
                    group: k.group,
                    topic: k.topic,
                    partition: k.partition,
                },
                value,
            }))
        }
        2 => {
            let k = gmk::GroupMetadataKey::decode(&mut key, key_version).ok()?;
            let value = match value {
                None => None,
                Some((version, mut v)) => {
                    let v = gmv::GroupMetadataValue::decode(&mut v, version).ok()?;
                    Some(GroupMetadataValue {
                        protocol_type: v.protocol_type,
                        generation: v.generation,
                        protocol: v.protocol,
                        leader: v.leader,
                        current_state_timestamp: v.current_state_timestamp,
                        members: v
                            .members
                            .into_iter()
                            .map(|m| MemberMetadata {
                                member_id: m.member_id,
                                group_instance_id: m.group_instance_id,
                                client_id: m.client_id,
                                client_host: m.client_host,
                                rebalance_timeout: m.rebalance_timeout,
                                session_timeout: m.session_timeout,
                                subscription: m.subscription,
                                assignment: m.assignment,
                            })
                            .collect(),
                    })
                }
            };
            Some(Record::GroupMetadata(GroupMetadataRecord {
                key: GroupMetadataKey { group: k.group },
                value,
            }))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_through_kafka_formats() {
        let records = vec![
            Record::OffsetCommit(OffsetCommitRecord {
                key: OffsetCommitKey {
                    group: "g".into(),
                    topic: "t".into(),
                    partition: 3,
                },
                value: Some(OffsetCommitValue {
                    offset: 42,
                    leader_epoch: 1,
                    metadata: "m".into(),
                    commit_timestamp: 1000,
                    expire_timestamp: -1,
                }),
            }),
            Record::OffsetCommit(OffsetCommitRecord {
                key: OffsetCommitKey {
                    group: "g".into(),
                    topic: "t".into(),
                    partition: 3,
                },
                value: Some(OffsetCommitValue {
                    offset: 7,
                    leader_epoch: -1,
                    metadata: String::new(),
                    commit_timestamp: 1000,
                    expire_timestamp: 2000,
                }),
            }),
            Record::OffsetCommit(OffsetCommitRecord {
                key: OffsetCommitKey {
                    group: "g".into(),
                    topic: "t".into(),
                    partition: 3,
                },
                value: None,
            }),
            Record::GroupMetadata(GroupMetadataRecord {
                key: GroupMetadataKey { group: "g".into() },
                value: Some(GroupMetadataValue {
                    protocol_type: "consumer".into(),
                    generation: 5,
                    protocol: Some("range".into()),
                    leader: Some("m-1".into()),
                    current_state_timestamp: 99,
                    members: vec![MemberMetadata {
                        member_id: "m-1".into(),
                        group_instance_id: Some("i".into()),
                        client_id: "c".into(),
                        client_host: "/127.0.0.1".into(),
                        rebalance_timeout: 60_000,
                        session_timeout: 10_000,
                        subscription: Bytes::from_static(b"sub"),
                        assignment: Bytes::from_static(b"asg"),
                    }],
                }),
            }),
            Record::GroupMetadata(GroupMetadataRecord {
                key: GroupMetadataKey { group: "g".into() },
                value: None,
            }),
        ];
        for r in records {
            let (k, v) = encode_record(&r).unwrap();
            assert_eq!(decode_record(Some(&k), v.as_deref()), Some(r));
        }
    }

    #[test]
    fn garbage_records_are_skipped_not_fatal() {
        assert_eq!(decode_record(None, None), None);
        assert_eq!(decode_record(Some(&[0]), None), None);
        assert_eq!(decode_record(Some(&[0, 9, 1, 2]), None), None);
        assert_eq!(
            decode_record(Some(&[0, 1, 0xff, 0xff, 0xff]), Some(&[0, 3])),
            None
        );
    }
}
