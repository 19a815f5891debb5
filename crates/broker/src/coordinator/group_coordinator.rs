//! The group coordinator's shard: the pure `rill-group` state machine as the coordinator
//! runtime ([`super::runtime`]) hosts it, with its records kept in the internal topic
//! `__consumer_offsets`.
//!
//! # Design note
//!
//! 1. Calls that read (Heartbeat, OffsetFetch, DescribeGroups, ListGroups) are answered
//!    at once; the others get a responder id, and a call that parks (JoinGroup,
//!    SyncGroup) is answered when an output names it, possibly many calls or ticks later.
//! 2. `Output::Persist` becomes the runtime's acks=all append: its responses are held
//!    until the high watermark has passed the records, and the state machine hears of
//!    the high watermark ([`GroupCoordinator::commit_up_to`], which makes the offsets
//!    visible to OffsetFetch) before they are sent, so a client reads its own commit.
//!    A failed write answers them with Kafka's mapped error; an append that failed
//!    reloads the partition from the log, while a failed wait leaves the records in the
//!    log, invisible to reads, and the state machine agrees with the log whether they
//!    later commit here or are truncated after a move.
//! 3. A load replays what is below the high watermark as committed and the rest as
//!    uncommitted ([`GroupCoordinator::replay_uncommitted`]); the runtime polls the high
//!    watermark while such records remain.
//! 4. Between events the runtime calls `tick` at [`GroupCoordinator::next_deadline`]
//!    (session timeouts, rebalance timeouts, the initial delay, offset expiry).
//! 5. `Output::InitializeShareGroupState` (a share group needs share-partition state
//!    before it assigns partitions) is queued as a [`ShareStateInitialization`] for the
//!    server, which asks the share coordinator off this task (Kafka's
//!    `GroupCoordinatorService.persisterInitialize`) and reports back with
//!    [`GroupCall::ShareGroupStateInitialized`] or
//!    [`GroupCall::ShareGroupStateInitializeFailed`]. A full queue counts as a failure:
//!    the group's next heartbeat asks again.
//!
//! Records use Kafka's formats (`group-coordinator/*.json`): the key is a version-prefixed
//! `OffsetCommitKey` (versions 0-1) or `GroupMetadataKey` (version 2), the value a
//! version-prefixed value or null for a tombstone, so the topic could be read by Kafka's
//! own tools.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use rill_group::{
    GroupConfig, GroupCoordinator, GroupMetadataKey, GroupMetadataRecord, GroupMetadataValue,
    MemberMetadata, OffsetCommitKey, OffsetCommitRecord, OffsetCommitValue, Output, Record,
    Response, WriteId,
};
use rill_protocol::generated::group_coordinator::{
    group_metadata_key as gmk, group_metadata_value as gmv, offset_commit_key as ock,
    offset_commit_value as ocv,
};
use rill_protocol::{Decodable, Encodable, ErrorCode};

use tokio::sync::mpsc;

use super::runtime::{
    self, CoordinatorHandle, CoordinatorOutput, CoordinatorShard, Handled, Outputs, ResponderId,
    WriteFailure,
};
use crate::replication::replica_manager::ReplicaManager;

pub const OFFSETS_TOPIC: &str = "__consumer_offsets";

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
    TxnOffsetCommit(rill_group::TxnOffsetCommitRequest),
    ConsumerGroupHeartbeat(rill_group::ConsumerGroupHeartbeatRequest),
    ConsumerGroupDescribe(rill_group::ConsumerGroupDescribeRequest),
    ShareGroupHeartbeat(rill_group::ShareGroupHeartbeatRequest),
    ShareGroupDescribe(rill_group::ShareGroupDescribeRequest),
    /// The share coordinator holds state for these share-partitions of the group (every
    /// one of a [`ShareStateInitialization`], or of an AlterShareGroupOffsets).
    ShareGroupStateInitialized {
        group_id: String,
        topics: Vec<rill_group::ShareTopicPartitions>,
    },
    /// Initialising these share-partitions failed; a heartbeat asks again.
    ShareGroupStateInitializeFailed {
        group_id: String,
        topics: Vec<rill_group::ShareTopicPartitions>,
    },
    AlterShareGroupOffsets(rill_group::AlterShareGroupOffsetsRequest),
    DeleteShareGroupOffsets(rill_group::DeleteShareGroupOffsetsRequest),
    /// The share coordinator deleted these topics' state for the group.
    CompleteDeleteShareGroupOffsets {
        group_id: String,
        topic_ids: Vec<rill_protocol::Uuid>,
    },
    /// DeleteGroups' first step for the share groups among these ids.
    ShareGroupsDeleteStart(Vec<String>),
    /// The group's initialised share-partitions, as of the high watermark.
    InitializedSharePartitions(String),
    /// The cluster's topics changed (the metadata publisher): consumer groups resolve
    /// their subscriptions against them.
    UpdateTopics(rill_group::TopicsImage),
    /// What `/metrics` shows of the groups: states and committed offsets.
    Snapshot,
    /// The marker of `producer_id`'s transaction is on `partition` and replicated.
    CompleteTransaction {
        partition: i32,
        producer_id: i64,
        commit: bool,
    },
}

/// The coordinator's answer to a [`GroupCall`].
pub enum GroupReply {
    Response(Response),
    Heartbeat(rill_group::HeartbeatResponse),
    OffsetFetch(Vec<rill_group::OffsetFetchResponse>),
    DescribeGroups(rill_group::DescribeGroupsResponse),
    ListGroups(rill_group::ListGroupsResponse),
    ConsumerGroupDescribe(rill_group::ConsumerGroupDescribeResponse),
    ShareGroupDescribe(rill_group::ShareGroupDescribeResponse),
    /// The topics were taken.
    TopicsUpdated,
    /// A report was taken (its records, if any, are written on their own).
    Noted,
    SharePartitions(Result<Vec<rill_group::ShareTopicPartitions>, i16>),
    /// How many pending transactional offsets a marker made visible.
    Completed(usize),
    Snapshot(GroupSnapshot),
}

/// The groups this coordinator holds, for `/metrics`.
#[derive(Debug, Default, Clone)]
pub struct GroupSnapshot {
    /// Classic groups: (group id, state as Kafka names it).
    pub groups: Vec<(String, String)>,
    /// Consumer groups of KIP-848's protocol: (group id, state as Kafka names it).
    pub consumer_groups: Vec<(String, String)>,
    /// Share groups of KIP-932: (group id, state as Kafka names it).
    pub share_groups: Vec<(String, String)>,
    /// (group, topic, partition, committed offset): what OffsetFetch would serve.
    pub offsets: Vec<(String, String, i32, i64)>,
    /// (group id, members).
    pub members: Vec<(String, u64)>,
}

/// Where connections send group calls, and the metadata publisher elections of
/// `__consumer_offsets` partitions.
pub type GroupCoordinatorHandle = CoordinatorHandle<GroupShard>;

impl CoordinatorHandle<GroupShard> {
    /// The COMMIT (`commit`) or ABORT marker of `producer_id`'s transaction is written to
    /// `__consumer_offsets` partition `partition` and replicated: the transaction's
    /// pending offsets (TxnOffsetCommit) become visible, or are dropped. The
    /// WriteTxnMarkers handler calls it for every `__consumer_offsets` partition of a
    /// marker once its append has passed the high watermark. Returns how many offsets
    /// were committed.
    pub async fn complete_transaction(
        &self,
        partition: i32,
        producer_id: i64,
        commit: bool,
    ) -> Result<usize, ErrorCode> {
        match self
            .call(GroupCall::CompleteTransaction {
                partition,
                producer_id,
                commit,
            })
            .await?
        {
            GroupReply::Completed(n) => Ok(n),
            _ => Err(ErrorCode::UNKNOWN_SERVER_ERROR),
        }
    }
}

/// Share-partitions whose state a share group needs initialised before it assigns them
/// (the state machine's `Output::InitializeShareGroupState`): the server initialises
/// each under state epoch `group_epoch` with no start offset (-1, as Kafka sends), so
/// that the share-partition leader applies `share.auto.offset.reset` when it loads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareStateInitialization {
    pub group_id: String,
    pub group_epoch: i32,
    pub topics: Vec<rill_group::ShareTopicPartitions>,
}

/// Initialisations queued for the server; beyond this the ask fails and is made again.
pub const SHARE_STATE_INITIALIZATION_QUEUE_DEPTH: usize = 1024;

/// The `rill-group` state machine under the runtime.
pub struct GroupShard {
    coordinator: GroupCoordinator,
    share_initializations: mpsc::Sender<ShareStateInitialization>,
    /// Each group's generation whose rebalance was counted last (see the Sync call).
    seen_generations: std::collections::HashMap<String, i32>,
    num_partitions: i32,
    commit_timeout: Duration,
}

/// Starts the coordinator task; it serves no partition until [`CoordinatorHandle::elect`].
/// The receiver yields the share-partition state initialisations it asks the server for.
pub fn start(
    config: GroupConfig,
    replicas: Arc<ReplicaManager>,
) -> (
    GroupCoordinatorHandle,
    mpsc::Receiver<ShareStateInitialization>,
) {
    let (share_initializations, asks) = mpsc::channel(SHARE_STATE_INITIALIZATION_QUEUE_DEPTH);
    let num_partitions = config.offsets_topic_num_partitions;
    let commit_timeout =
        Duration::from_millis(u64::try_from(config.offsets_commit_timeout_ms).unwrap_or(0));
    let seed = u64::from_le_bytes(
        uuid::Uuid::new_v4().as_bytes()[..8]
            .try_into()
            .unwrap_or([7; 8]),
    );
    let shard = GroupShard {
        coordinator: GroupCoordinator::new(config, seed),
        share_initializations,
        seen_generations: std::collections::HashMap::new(),
        num_partitions,
        commit_timeout,
    };
    (runtime::start(shard, replicas), asks)
}

/// The runtime's outputs for the state machine's; an [`Output::InitializeShareGroupState`]
/// goes to the server's queue (design note, step 5).
fn outputs(
    c: &mut GroupCoordinator,
    share_initializations: &mpsc::Sender<ShareStateInitialization>,
    outputs: Vec<Output>,
) -> Outputs<GroupShard> {
    let mut out = Vec::new();
    for o in outputs {
        match o {
            Output::Respond(r) => out.push(CoordinatorOutput::Respond {
                responder: r.responder,
                reply: GroupReply::Response(r.response),
            }),
            Output::Persist {
                write,
                records,
                responses,
            } => out.push(CoordinatorOutput::Append {
                write: write.0,
                records,
                replies: responses
                    .into_iter()
                    .map(|r| (r.responder, GroupReply::Response(r.response)))
                    .collect(),
                transactional: None,
            }),
            Output::PersistTransactional {
                write,
                producer_id,
                producer_epoch,
                records,
                responses,
            } => out.push(CoordinatorOutput::Append {
                write: write.0,
                records,
                replies: responses
                    .into_iter()
                    .map(|r| (r.responder, GroupReply::Response(r.response)))
                    .collect(),
                transactional: Some((producer_id, producer_epoch)),
            }),
            Output::InitializeShareGroupState {
                group_id,
                group_epoch,
                topics,
            } => {
                let ask = ShareStateInitialization {
                    group_id,
                    group_epoch,
                    topics,
                };
                if let Err(e) = share_initializations.try_send(ask) {
                    let ask = e.into_inner();
                    tracing::warn!(group = %ask.group_id, "share state initialisation not queued");
                    c.share_group_state_initialize_failed(&ask.group_id, &ask.topics);
                }
            }
        }
    }
    out
}

impl CoordinatorShard for GroupShard {
    type Record = Record;
    type Call = GroupCall;
    type Reply = GroupReply;

    // Records above the high watermark stay in the state machine, invisible to
    // OffsetFetch until `commit_up_to` passes them.
    const RELOAD_AFTER_FAILED_WAIT: bool = false;

    fn topic(&self) -> &'static str {
        OFFSETS_TOPIC
    }

    fn num_partitions(&self) -> i32 {
        self.num_partitions
    }

    fn write_timeout(&self) -> Duration {
        self.commit_timeout
    }

    fn encode(&self, record: &Record) -> Result<(Vec<u8>, Option<Vec<u8>>), String> {
        encode_record(record)
    }

    fn decode(&self, key: Option<&[u8]>, value: Option<&[u8]>) -> Option<Record> {
        decode_record(key, value)
    }

    fn handle(
        &mut self,
        call: GroupCall,
        id: ResponderId,
        now: i64,
    ) -> Handled<Record, GroupReply> {
        let c = &mut self.coordinator;
        let out = match call {
            GroupCall::Heartbeat(r) => {
                return Handled::Reply(GroupReply::Heartbeat(c.handle_heartbeat(r, now)))
            }
            GroupCall::OffsetFetch(groups) => {
                return Handled::Reply(GroupReply::OffsetFetch(
                    groups.iter().map(|g| c.handle_offset_fetch(g)).collect(),
                ))
            }
            GroupCall::DescribeGroups(r) => {
                return Handled::Reply(GroupReply::DescribeGroups(c.handle_describe_groups(&r)))
            }
            GroupCall::ListGroups(r) => {
                return Handled::Reply(GroupReply::ListGroups(c.handle_list_groups(&r)))
            }
            GroupCall::ConsumerGroupDescribe(r) => {
                return Handled::Reply(GroupReply::ConsumerGroupDescribe(
                    c.handle_consumer_group_describe(&r),
                ))
            }
            GroupCall::UpdateTopics(topics) => {
                c.update_topics(topics);
                return Handled::Reply(GroupReply::TopicsUpdated);
            }
            GroupCall::ConsumerGroupHeartbeat(r) => c.handle_consumer_group_heartbeat(r, now, id),
            GroupCall::ShareGroupDescribe(r) => {
                return Handled::Reply(GroupReply::ShareGroupDescribe(
                    c.handle_share_group_describe(&r),
                ))
            }
            GroupCall::ShareGroupHeartbeat(r) => c.handle_share_group_heartbeat(r, now, id),
            GroupCall::ShareGroupStateInitialized { group_id, topics } => {
                let out = c.share_group_state_initialized(&group_id, &topics, now);
                let mut out = outputs(c, &self.share_initializations, out);
                out.push(CoordinatorOutput::Respond {
                    responder: id,
                    reply: GroupReply::Noted,
                });
                return Handled::Outputs(out);
            }
            GroupCall::ShareGroupStateInitializeFailed { group_id, topics } => {
                c.share_group_state_initialize_failed(&group_id, &topics);
                return Handled::Reply(GroupReply::Noted);
            }
            GroupCall::CompleteDeleteShareGroupOffsets {
                group_id,
                topic_ids,
            } => {
                let out = c.complete_delete_share_group_offsets(&group_id, &topic_ids);
                let mut out = outputs(c, &self.share_initializations, out);
                out.push(CoordinatorOutput::Respond {
                    responder: id,
                    reply: GroupReply::Noted,
                });
                return Handled::Outputs(out);
            }
            GroupCall::InitializedSharePartitions(group_id) => {
                return Handled::Reply(GroupReply::SharePartitions(
                    c.initialized_share_partitions(&group_id),
                ));
            }
            GroupCall::AlterShareGroupOffsets(r) => c.handle_alter_share_group_offsets(r, id),
            GroupCall::DeleteShareGroupOffsets(r) => c.handle_delete_share_group_offsets(r, id),
            GroupCall::ShareGroupsDeleteStart(ids) => c.handle_share_groups_delete_start(ids, id),
            GroupCall::Snapshot => {
                let overview = c.group_overview();
                // Groups gone from here (deleted, or their partition moved away) leave
                // the rebalance bookkeeping too, so that it is bounded by the groups held.
                let held: std::collections::HashSet<&str> =
                    overview.iter().map(|(id, _, _)| id.as_str()).collect();
                self.seen_generations
                    .retain(|g, _| held.contains(g.as_str()));
                let offsets = c
                    .committed_offsets()
                    .into_iter()
                    .map(|(k, v)| (k.group, k.topic, k.partition, v.offset))
                    .collect();
                let consumer = c.consumer_group_overview();
                let share = c.share_group_overview();
                return Handled::Reply(GroupReply::Snapshot(GroupSnapshot {
                    groups: overview
                        .into_iter()
                        .map(|(id, state, _)| (id, state.to_string()))
                        .collect(),
                    consumer_groups: consumer
                        .iter()
                        .map(|(id, s, _, _)| (id.clone(), s.to_string()))
                        .collect(),
                    share_groups: share
                        .iter()
                        .map(|(id, s, _, _)| (id.clone(), s.to_string()))
                        .collect(),
                    offsets,
                    members: c
                        .group_sizes()
                        .into_iter()
                        .map(|(id, n)| (id, n as u64))
                        .chain(consumer.iter().map(|(id, _, _, n)| (id.clone(), *n as u64)))
                        .chain(share.iter().map(|(id, _, _, n)| (id.clone(), *n as u64)))
                        .collect(),
                }));
            }
            GroupCall::Join(r) => c.handle_join(r, now, id),
            GroupCall::Sync(r) => {
                let group = r.group_id.clone();
                let out = c.handle_sync(r, now, id);
                // A rebalance completes when a SyncGroup brings its group to Stable in a
                // generation not counted yet (Kafka counts it at the same step).
                let stable = c.group_state(&group) == Some(rill_group::ClassicGroupState::Stable);
                if let (true, Some(generation)) = (stable, c.group_generation(&group)) {
                    if self.seen_generations.get(&group) != Some(&generation) {
                        self.seen_generations.insert(group, generation);
                        crate::metrics::inc(&crate::metrics::global().groups.completed_rebalances);
                    }
                }
                out
            }
            GroupCall::Leave(r) => c.handle_leave(r, now, id),
            GroupCall::OffsetCommit(r) => c.handle_offset_commit(r, now, id),
            GroupCall::OffsetDelete(r) => c.handle_offset_delete(r, now, id),
            GroupCall::DeleteGroups(r) => c.handle_delete_groups(r, now, id),
            GroupCall::TxnOffsetCommit(r) => c.handle_txn_offset_commit(r, now, id),
            GroupCall::CompleteTransaction {
                partition,
                producer_id,
                commit,
            } => {
                return Handled::Reply(GroupReply::Completed(c.complete_transaction(
                    partition,
                    producer_id,
                    commit,
                )))
            }
        };
        Handled::Outputs(outputs(c, &self.share_initializations, out))
    }

    fn tick(&mut self, now_ms: i64) -> Outputs<Self> {
        let out = self.coordinator.tick(now_ms);
        outputs(&mut self.coordinator, &self.share_initializations, out)
    }

    fn next_deadline(&self) -> Option<i64> {
        self.coordinator.next_deadline()
    }

    fn load_start(&mut self, partition: i32) -> Outputs<Self> {
        let out = self.coordinator.load_partition_start(partition);
        outputs(&mut self.coordinator, &self.share_initializations, out)
    }

    fn replay(
        &mut self,
        partition: i32,
        offset: i64,
        record: Record,
        committed: bool,
        producer_id: Option<i64>,
    ) -> Result<(), String> {
        let replayed = if let Some(producer_id) = producer_id {
            self.coordinator
                .replay_transactional(partition, producer_id, &record)
        } else if committed {
            self.coordinator.replay(partition, &record)
        } else {
            self.coordinator
                .replay_uncommitted(partition, offset, &record)
        };
        replayed.map_err(|e| e.to_string())
    }

    fn replay_control(&mut self, partition: i32, producer_id: i64, commit: bool) {
        self.coordinator
            .replay_control(partition, producer_id, commit);
    }

    fn load_done(&mut self, partition: i32, _leader_epoch: i32, now_ms: i64) -> Outputs<Self> {
        self.coordinator.load_partition_done(partition, now_ms);
        Vec::new()
    }

    fn unload(&mut self, partition: i32) -> Outputs<Self> {
        let out = self.coordinator.unload_partition(partition);
        outputs(&mut self.coordinator, &self.share_initializations, out)
    }

    fn loaded_partitions(&self) -> Vec<i32> {
        self.coordinator.loaded_partitions()
    }

    fn appended(&mut self, write: u64, partition: i32, end_offset: i64) {
        self.coordinator
            .appended(WriteId(write), partition, end_offset);
    }

    fn replicated(&mut self, _write: u64, reached: &[(i32, i64)]) -> Outputs<Self> {
        for (partition, offset) in reached {
            self.coordinator.commit_up_to(*partition, *offset);
        }
        // Answers that waited for this write (a consumer group heartbeat that wrote
        // nothing) go out with it.
        let out = self.coordinator.take_released();
        outputs(&mut self.coordinator, &self.share_initializations, out)
    }

    fn write_failed(&mut self, _write: u64, _failure: WriteFailure) -> Outputs<Self> {
        Vec::new()
    }

    fn failed_reply(&self, reply: GroupReply, failure: WriteFailure) -> GroupReply {
        match reply {
            GroupReply::Response(response) => {
                let code = match failure {
                    WriteFailure::Append => ErrorCode::COORDINATOR_NOT_AVAILABLE,
                    WriteFailure::Replication(code) => replication_error(code, &response),
                };
                GroupReply::Response(response.failed(code.code()))
            }
            other => other,
        }
    }

    fn uncommitted_partitions(&self) -> Vec<i32> {
        self.coordinator.uncommitted_partitions()
    }

    fn commit_up_to(&mut self, partition: i32, offset: i64) -> Outputs<Self> {
        self.coordinator.commit_up_to(partition, offset);
        let out = self.coordinator.take_released();
        outputs(&mut self.coordinator, &self.share_initializations, out)
    }
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

/// Value versions written: the newest non-flexible ones, which every Kafka tool reads.
const OFFSET_COMMIT_KEY_VERSION: i16 = 1;
const GROUP_METADATA_KEY_VERSION: i16 = 2;
const OFFSET_COMMIT_VALUE_VERSION: i16 = 3;
/// OffsetCommitValue v1 is the only version with an explicit expire timestamp.
const OFFSET_COMMIT_VALUE_VERSION_WITH_EXPIRY: i16 = 1;
const GROUP_METADATA_VALUE_VERSION: i16 = 3;

pub(crate) fn encode_versioned<T: Encodable>(version: i16, body: &T) -> Result<Vec<u8>, String> {
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
        Record::ConsumerGroup(r) => super::consumer_group_codec::encode(r),
        Record::ShareGroup(r) => super::share_group_codec::encode(r),
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

/// Decodes a `__consumer_offsets` record; `None` for records this coordinator cannot
/// read.
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
        v if super::consumer_group_codec::is_consumer_group_key(v) => Some(Record::ConsumerGroup(
            super::consumer_group_codec::decode(v, key, value)?,
        )),
        v if super::share_group_codec::is_share_group_key(v) => Some(Record::ShareGroup(
            super::share_group_codec::decode(v, key, value)?,
        )),
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
    fn consumer_group_records_round_trip_through_kafka_formats() {
        use rill_group::*;
        use rill_protocol::Uuid;
        let g = || "g".to_owned();
        let m = || "member-1".to_owned();
        let tps = vec![TopicPartitions {
            topic_id: Uuid([7; 16]),
            partitions: vec![0, 2, 5],
        }];
        let records = vec![
            ConsumerGroupRecord::Metadata {
                group_id: g(),
                value: Some(ConsumerGroupMetadataValue { epoch: 12 }),
            },
            ConsumerGroupRecord::PartitionMetadata {
                group_id: g(),
                value: Some(ConsumerGroupPartitionMetadataValue {
                    topics: vec![ConsumerGroupTopicMetadata {
                        topic_id: Uuid([7; 16]),
                        topic_name: "orders".into(),
                        num_partitions: 6,
                    }],
                }),
            },
            ConsumerGroupRecord::MemberMetadata {
                group_id: g(),
                member_id: m(),
                value: Some(ConsumerGroupMemberMetadataValue {
                    instance_id: Some("i-1".into()),
                    rack_id: None,
                    client_id: "rdkafka".into(),
                    client_host: "/127.0.0.1".into(),
                    subscribed_topic_names: vec!["orders".into()],
                    subscribed_topic_regex: Some("orders-.*".into()),
                    rebalance_timeout_ms: 300_000,
                    server_assignor: Some("range".into()),
                    classic_member_metadata: Some(ClassicMemberMetadata {
                        session_timeout_ms: 10_000,
                        supported_protocols: vec![("range".into(), Bytes::from_static(b"sub"))],
                    }),
                }),
            },
            ConsumerGroupRecord::TargetAssignmentMetadata {
                group_id: g(),
                value: Some(ConsumerGroupTargetAssignmentMetadataValue {
                    assignment_epoch: 12,
                }),
            },
            ConsumerGroupRecord::TargetAssignmentMember {
                group_id: g(),
                member_id: m(),
                value: Some(ConsumerGroupTargetAssignmentMemberValue {
                    topic_partitions: tps.clone(),
                }),
            },
            ConsumerGroupRecord::CurrentMemberAssignment {
                group_id: g(),
                member_id: m(),
                value: Some(ConsumerGroupCurrentMemberAssignmentValue {
                    member_epoch: 12,
                    previous_member_epoch: 11,
                    state: 1,
                    assigned_partitions: tps.clone(),
                    partitions_pending_revocation: tps,
                }),
            },
        ];
        let tombstones: Vec<ConsumerGroupRecord> = records
            .iter()
            .map(|r| match r.clone() {
                ConsumerGroupRecord::Metadata { group_id, .. } => ConsumerGroupRecord::Metadata {
                    group_id,
                    value: None,
                },
                ConsumerGroupRecord::PartitionMetadata { group_id, .. } => {
                    ConsumerGroupRecord::PartitionMetadata {
                        group_id,
                        value: None,
                    }
                }
                ConsumerGroupRecord::MemberMetadata {
                    group_id,
                    member_id,
                    ..
                } => ConsumerGroupRecord::MemberMetadata {
                    group_id,
                    member_id,
                    value: None,
                },
                ConsumerGroupRecord::TargetAssignmentMetadata { group_id, .. } => {
                    ConsumerGroupRecord::TargetAssignmentMetadata {
                        group_id,
                        value: None,
                    }
                }
                ConsumerGroupRecord::TargetAssignmentMember {
                    group_id,
                    member_id,
                    ..
                } => ConsumerGroupRecord::TargetAssignmentMember {
                    group_id,
                    member_id,
                    value: None,
                },
                ConsumerGroupRecord::CurrentMemberAssignment {
                    group_id,
                    member_id,
                    ..
                } => ConsumerGroupRecord::CurrentMemberAssignment {
                    group_id,
                    member_id,
                    value: None,
                },
            })
            .collect();
        for (i, r) in records.into_iter().chain(tombstones).enumerate() {
            let r = Record::ConsumerGroup(r);
            let (k, v) = encode_record(&r).unwrap();
            // The key's version is the record type, as Kafka numbers them (3..=8).
            assert_eq!(i16::from_be_bytes([k[0], k[1]]), 3 + (i % 6) as i16);
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
