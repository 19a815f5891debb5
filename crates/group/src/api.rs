//! The coordinator's inputs and outputs: plain structs mirroring the fields of Kafka's
//! group and offset requests and responses (the broker converts the generated wire types
//! to and from these), and the [`Output`]s a call returns.

use bytes::Bytes;

use crate::committed_offsets::WriteId;
use crate::consumer_group_record::TopicPartitions;
use crate::error::error_code;
use crate::record::Record;

/// The broker's token for a request whose response may be sent later (a parked JoinGroup
/// or SyncGroup). The coordinator hands it back in [`Respond`].
pub type ResponderId = u64;

/// JoinGroup (all versions). For v0 the broker sets `rebalance_timeout_ms` to
/// `session_timeout_ms`, as Kafka does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinGroupRequest {
    pub group_id: String,
    pub session_timeout_ms: i32,
    pub rebalance_timeout_ms: i32,
    /// Empty on a member's first join.
    pub member_id: String,
    pub group_instance_id: Option<String>,
    pub protocol_type: String,
    /// (protocol name, metadata) in the member's order of preference.
    pub protocols: Vec<(String, Bytes)>,
    pub reason: Option<String>,
    /// From the request header.
    pub client_id: String,
    /// The client's address as the broker saw it, e.g. `/127.0.0.1`.
    pub client_host: String,
    pub api_version: i16,
}

/// A member in the leader's JoinGroup response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinGroupResponseMember {
    pub member_id: String,
    pub group_instance_id: Option<String>,
    pub metadata: Bytes,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinGroupResponse {
    pub error_code: i16,
    pub generation_id: i32,
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    pub leader: String,
    /// KIP-814: a static leader rejoining a Stable group must not run the assignor again.
    pub skip_assignment: bool,
    pub member_id: String,
    /// Every member's metadata for the leader; empty for followers.
    pub members: Vec<JoinGroupResponseMember>,
}

impl JoinGroupResponse {
    /// An answer carrying only an error (and the member id the request named).
    pub fn error(member_id: &str, error_code: i16) -> Self {
        JoinGroupResponse {
            error_code,
            generation_id: -1,
            protocol_type: None,
            protocol_name: None,
            leader: String::new(),
            skip_assignment: false,
            member_id: member_id.to_owned(),
            members: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncGroupRequest {
    pub group_id: String,
    pub generation_id: i32,
    pub member_id: String,
    pub group_instance_id: Option<String>,
    /// v5+; `None` skips the consistency check.
    pub protocol_type: Option<String>,
    /// v5+; `None` skips the consistency check.
    pub protocol_name: Option<String>,
    /// (member id, assignment); only the leader sends any.
    pub assignments: Vec<(String, Bytes)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncGroupResponse {
    pub error_code: i16,
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    pub assignment: Bytes,
}

impl SyncGroupResponse {
    pub fn error(error_code: i16) -> Self {
        SyncGroupResponse {
            error_code,
            protocol_type: None,
            protocol_name: None,
            assignment: Bytes::new(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeartbeatRequest {
    pub group_id: String,
    pub generation_id: i32,
    pub member_id: String,
    pub group_instance_id: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeartbeatResponse {
    pub error_code: i16,
}

/// One member leaving; v0-v2 requests become a single identity with the member id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberIdentity {
    pub member_id: String,
    pub group_instance_id: Option<String>,
    pub reason: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaveGroupRequest {
    pub group_id: String,
    pub members: Vec<MemberIdentity>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaveGroupMemberResponse {
    pub member_id: String,
    pub group_instance_id: Option<String>,
    pub error_code: i16,
}

/// For v0-v2 the broker answers with the top-level error, or else the single member's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaveGroupResponse {
    pub error_code: i16,
    pub members: Vec<LeaveGroupMemberResponse>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetCommitRequestPartition {
    pub partition_index: i32,
    pub committed_offset: i64,
    pub committed_leader_epoch: i32,
    pub committed_metadata: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetCommitRequestTopic {
    pub name: String,
    pub partitions: Vec<OffsetCommitRequestPartition>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetCommitRequest {
    pub group_id: String,
    /// -1 (with an empty member id) for a commit from outside group management.
    pub generation_id_or_member_epoch: i32,
    pub member_id: String,
    pub group_instance_id: Option<String>,
    /// v2-v4 only; -1 means the broker's retention.
    pub retention_time_ms: i64,
    pub topics: Vec<OffsetCommitRequestTopic>,
    pub api_version: i16,
}

/// TxnOffsetCommit: offsets written in a producer's transaction, visible only once its
/// COMMIT marker lands ([`crate::GroupCoordinator::complete_transaction`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnOffsetCommitRequest {
    pub producer_id: i64,
    pub producer_epoch: i16,
    /// The group, member, generation and offsets, as an OffsetCommit carries them
    /// (`retention_time_ms` is -1).
    pub commit: OffsetCommitRequest,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetCommitResponsePartition {
    pub partition_index: i32,
    pub error_code: i16,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetCommitResponseTopic {
    pub name: String,
    pub partitions: Vec<OffsetCommitResponsePartition>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetCommitResponse {
    pub topics: Vec<OffsetCommitResponseTopic>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetFetchRequestTopic {
    pub name: String,
    pub partition_indexes: Vec<i32>,
}

/// One group of an OffsetFetch (v8+ batches groups; the broker splits them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetFetchRequest {
    pub group_id: String,
    /// `None` fetches every committed offset of the group.
    pub topics: Option<Vec<OffsetFetchRequestTopic>>,
    /// Partitions with a pending transactional commit answer UNSTABLE_OFFSET_COMMIT
    /// (KIP-447), so that a read_committed consumer waits for the transaction's end.
    pub require_stable: bool,
    /// v9+: the member of a consumer group asking, checked against its epoch
    /// (`None` with a negative epoch: a fetch from outside the group).
    pub member_id: Option<String>,
    pub member_epoch: i32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetFetchResponsePartition {
    pub partition_index: i32,
    /// -1 when nothing is committed.
    pub committed_offset: i64,
    pub committed_leader_epoch: i32,
    pub metadata: Option<String>,
    pub error_code: i16,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetFetchResponseTopic {
    pub name: String,
    pub partitions: Vec<OffsetFetchResponsePartition>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetFetchResponse {
    pub error_code: i16,
    pub topics: Vec<OffsetFetchResponseTopic>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetDeleteRequestTopic {
    pub name: String,
    pub partitions: Vec<i32>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetDeleteRequest {
    pub group_id: String,
    pub topics: Vec<OffsetDeleteRequestTopic>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetDeleteResponsePartition {
    pub partition_index: i32,
    pub error_code: i16,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetDeleteResponseTopic {
    pub name: String,
    pub partitions: Vec<OffsetDeleteResponsePartition>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetDeleteResponse {
    pub error_code: i16,
    pub topics: Vec<OffsetDeleteResponseTopic>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescribeGroupsRequest {
    pub groups: Vec<String>,
    /// v6+ answers GROUP_ID_NOT_FOUND for an unknown group instead of a Dead group.
    pub api_version: i16,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescribedGroupMember {
    pub member_id: String,
    pub group_instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    /// Empty unless the group is Stable.
    pub member_metadata: Bytes,
    /// Empty unless the group is Stable.
    pub member_assignment: Bytes,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescribedGroup {
    pub error_code: i16,
    pub group_id: String,
    pub group_state: String,
    pub protocol_type: String,
    /// The selected protocol when Stable, else empty.
    pub protocol_data: String,
    pub members: Vec<DescribedGroupMember>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescribeGroupsResponse {
    pub groups: Vec<DescribedGroup>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ListGroupsRequest {
    /// Case-insensitive state names; empty means all.
    pub states_filter: Vec<String>,
    /// Case-insensitive group types (`classic`, `consumer`, `share`); empty means all.
    pub types_filter: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedGroup {
    pub group_id: String,
    pub protocol_type: String,
    pub group_state: String,
    pub group_type: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListGroupsResponse {
    pub error_code: i16,
    pub groups: Vec<ListedGroup>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeleteGroupsRequest {
    pub groups_names: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeletableGroupResult {
    pub group_id: String,
    pub error_code: i16,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeleteGroupsResponse {
    pub results: Vec<DeletableGroupResult>,
}

/// ConsumerGroupHeartbeat (KIP-848), with the session timeout and heartbeat interval the
/// broker resolved for the group (its GROUP config overrides, else the broker's
/// `group.consumer.*` settings).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerGroupHeartbeatRequest {
    pub group_id: String,
    /// Empty on a first join: the coordinator then makes one up (clients of KIP-1082
    /// make their own).
    pub member_id: String,
    /// 0 to join, -1 to leave, -2 for a static member leaving for now.
    pub member_epoch: i32,
    /// `None`: unchanged since the last heartbeat (or not a static member).
    pub instance_id: Option<String>,
    pub rack_id: Option<String>,
    /// -1: unchanged.
    pub rebalance_timeout_ms: i32,
    /// `None`: unchanged.
    pub subscribed_topic_names: Option<Vec<String>>,
    /// v1+; `None`: unchanged.
    pub subscribed_topic_regex: Option<String>,
    /// `group.remote.assignor`; `None`: unchanged or not chosen.
    pub server_assignor: Option<String>,
    /// The partitions the member owns; `None`: unchanged.
    pub topic_partitions: Option<Vec<TopicPartitions>>,
    pub client_id: String,
    pub client_host: String,
    /// `group.consumer.session.timeout.ms` (or the group's override).
    pub session_timeout_ms: i32,
    /// `group.consumer.heartbeat.interval.ms` (or the group's override).
    pub heartbeat_interval_ms: i32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerGroupHeartbeatResponse {
    pub error_code: i16,
    pub error_message: Option<String>,
    pub member_id: Option<String>,
    pub member_epoch: i32,
    pub heartbeat_interval_ms: i32,
    /// `None`: unchanged since the last response.
    pub assignment: Option<Vec<TopicPartitions>>,
}

impl ConsumerGroupHeartbeatResponse {
    pub fn error(error_code: i16, message: impl Into<String>) -> Self {
        ConsumerGroupHeartbeatResponse {
            error_code,
            error_message: Some(message.into()),
            member_id: None,
            member_epoch: 0,
            heartbeat_interval_ms: 0,
            assignment: None,
        }
    }
}

/// ConsumerGroupDescribe; answered from replicated state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerGroupDescribeRequest {
    pub group_ids: Vec<String>,
}

/// A topic's partitions, with the topic's name, in a described assignment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescribedTopicPartitions {
    pub topic_id: rill_protocol::Uuid,
    pub topic_name: String,
    pub partitions: Vec<i32>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescribedConsumerGroupMember {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub rack_id: Option<String>,
    pub member_epoch: i32,
    pub client_id: String,
    pub client_host: String,
    pub subscribed_topic_names: Vec<String>,
    pub subscribed_topic_regex: Option<String>,
    pub assignment: Vec<DescribedTopicPartitions>,
    pub target_assignment: Vec<DescribedTopicPartitions>,
    /// A classic-protocol member of a consumer group (KIP-848's online upgrade): what
    /// ConsumerGroupDescribe v1 reports as its member type (KIP-1099).
    pub uses_classic_protocol: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescribedConsumerGroup {
    pub error_code: i16,
    pub error_message: Option<String>,
    pub group_id: String,
    pub group_state: String,
    pub group_epoch: i32,
    pub assignment_epoch: i32,
    pub assignor_name: String,
    pub members: Vec<DescribedConsumerGroupMember>,
}

impl DescribedConsumerGroup {
    pub fn error(group_id: &str, error_code: i16, message: Option<String>) -> Self {
        DescribedConsumerGroup {
            error_code,
            error_message: message,
            group_id: group_id.to_owned(),
            group_state: String::new(),
            group_epoch: 0,
            assignment_epoch: 0,
            assignor_name: String::new(),
            members: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerGroupDescribeResponse {
    pub groups: Vec<DescribedConsumerGroup>,
}

/// ShareGroupHeartbeat v1 (KIP-932), with the session timeout and heartbeat interval the
/// broker resolved for the group (its `share.*` GROUP config overrides, else the broker's
/// `group.share.*` settings).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareGroupHeartbeatRequest {
    pub group_id: String,
    /// Made by the client (a UUID) from v1; never empty.
    pub member_id: String,
    /// 0 to join, -1 to leave.
    pub member_epoch: i32,
    pub rack_id: Option<String>,
    /// `None`: unchanged since the last heartbeat.
    pub subscribed_topic_names: Option<Vec<String>>,
    pub client_id: String,
    pub client_host: String,
    /// `group.share.session.timeout.ms` (or the group's `share.session.timeout.ms`).
    pub session_timeout_ms: i32,
    /// `group.share.heartbeat.interval.ms` (or the group's `share.heartbeat.interval.ms`).
    pub heartbeat_interval_ms: i32,
}

/// ShareGroupHeartbeat's answer has the fields of ConsumerGroupHeartbeat's.
pub type ShareGroupHeartbeatResponse = ConsumerGroupHeartbeatResponse;

/// ShareGroupDescribe; answered from replicated state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareGroupDescribeRequest {
    pub group_ids: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescribedShareGroupMember {
    pub member_id: String,
    pub rack_id: Option<String>,
    pub member_epoch: i32,
    pub client_id: String,
    pub client_host: String,
    pub subscribed_topic_names: Vec<String>,
    pub assignment: Vec<DescribedTopicPartitions>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescribedShareGroup {
    pub error_code: i16,
    pub error_message: Option<String>,
    pub group_id: String,
    pub group_state: String,
    pub group_epoch: i32,
    pub assignment_epoch: i32,
    pub assignor_name: String,
    pub members: Vec<DescribedShareGroupMember>,
}

impl DescribedShareGroup {
    pub fn error(group_id: &str, error_code: i16, message: Option<String>) -> Self {
        DescribedShareGroup {
            error_code,
            error_message: message,
            group_id: group_id.to_owned(),
            group_state: String::new(),
            group_epoch: 0,
            assignment_epoch: 0,
            assignor_name: String::new(),
            members: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareGroupDescribeResponse {
    pub groups: Vec<DescribedShareGroup>,
}

/// Partitions of one topic whose share-partition state a share group needs initialised
/// (Kafka's `InitializeShareGroupState` request to the share coordinator).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareTopicPartitions {
    pub topic_id: rill_protocol::Uuid,
    pub topic_name: String,
    pub partitions: Vec<i32>,
}

/// AlterShareGroupOffsets (KIP-932) as the coordinator takes it: new start offsets of
/// share-partitions, by topic name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlterShareGroupOffsetsRequest {
    pub group_id: String,
    /// (topic name, [(partition, start offset)]).
    pub topics: Vec<(String, Vec<(i32, i64)>)>,
}

/// One topic of an AlterShareGroupOffsets answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlteredShareTopic {
    pub topic_name: String,
    /// `None` when the topic does not exist.
    pub topic_id: Option<rill_protocol::Uuid>,
    /// (partition, error code).
    pub partitions: Vec<(i32, i16)>,
}

/// Share-partitions of one topic with the start offset each is to be initialised at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareTopicStartOffsets {
    pub topic_id: rill_protocol::Uuid,
    pub topic_name: String,
    /// (partition, start offset).
    pub partitions: Vec<(i32, i64)>,
}

/// What AlterShareGroupOffsets decided, once its initializing mark is written: the answer
/// per partition, and the share-partitions the broker initialises (state epoch
/// `group_epoch`) before it reports them with
/// [`crate::GroupCoordinator::share_group_state_initialized`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlterShareGroupOffsetsPlan {
    pub error_code: i16,
    pub error_message: Option<String>,
    pub group_epoch: i32,
    pub topics: Vec<AlteredShareTopic>,
    pub initialize: Vec<ShareTopicStartOffsets>,
}

/// DeleteShareGroupOffsets (KIP-932) as the coordinator takes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeleteShareGroupOffsetsRequest {
    pub group_id: String,
    pub topic_names: Vec<String>,
}

/// One topic of a DeleteShareGroupOffsets answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeletedShareTopic {
    pub topic_name: String,
    pub topic_id: rill_protocol::Uuid,
    pub error_code: i16,
    pub error_message: Option<String>,
}

/// What DeleteShareGroupOffsets decided, once the topics are marked deleting: the topics
/// refused, and the share-partitions whose state the broker deletes before it reports
/// the topics with [`crate::GroupCoordinator::complete_delete_share_group_offsets`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeleteShareGroupOffsetsPlan {
    pub error_code: i16,
    pub error_message: Option<String>,
    pub errors: Vec<DeletedShareTopic>,
    pub delete: Vec<ShareTopicPartitions>,
}

/// DeleteGroups of a share group, its first step: the share-partitions whose state the
/// broker deletes before the group itself (`error_code` NONE), or why the group may not
/// be deleted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareGroupStateDeletion {
    pub group_id: String,
    pub error_code: i16,
    pub topics: Vec<ShareTopicPartitions>,
}

/// A response for the broker to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Response {
    ConsumerGroupHeartbeat(ConsumerGroupHeartbeatResponse),
    ShareGroupHeartbeat(ShareGroupHeartbeatResponse),
    JoinGroup(JoinGroupResponse),
    SyncGroup(SyncGroupResponse),
    LeaveGroup(LeaveGroupResponse),
    OffsetCommit(OffsetCommitResponse),
    OffsetDelete(OffsetDeleteResponse),
    DeleteGroups(DeleteGroupsResponse),
    AlterShareGroupOffsets(AlterShareGroupOffsetsPlan),
    DeleteShareGroupOffsets(DeleteShareGroupOffsetsPlan),
    ShareGroupStateDeletions(Vec<ShareGroupStateDeletion>),
}

impl Response {
    /// The response to send instead when the records it depended on could not be
    /// written: every error field set to `error_code` (the broker maps the write error
    /// as Kafka does, e.g. NOT_LEADER_OR_FOLLOWER to NOT_COORDINATOR, a timeout to
    /// COORDINATOR_NOT_AVAILABLE).
    pub fn failed(self, error_code: i16) -> Response {
        match self {
            Response::ConsumerGroupHeartbeat(_) => {
                Response::ConsumerGroupHeartbeat(ConsumerGroupHeartbeatResponse::error(
                    error_code,
                    "the group's records could not be written",
                ))
            }
            Response::ShareGroupHeartbeat(_) => {
                Response::ShareGroupHeartbeat(ShareGroupHeartbeatResponse::error(
                    error_code,
                    "the group's records could not be written",
                ))
            }
            Response::JoinGroup(r) => {
                Response::JoinGroup(JoinGroupResponse::error(&r.member_id, error_code))
            }
            Response::SyncGroup(_) => Response::SyncGroup(SyncGroupResponse::error(error_code)),
            Response::LeaveGroup(mut r) => {
                r.error_code = error_code;
                Response::LeaveGroup(r)
            }
            Response::OffsetCommit(mut r) => {
                for p in r.topics.iter_mut().flat_map(|t| t.partitions.iter_mut()) {
                    p.error_code = error_code;
                }
                Response::OffsetCommit(r)
            }
            Response::OffsetDelete(mut r) => {
                r.error_code = error_code;
                Response::OffsetDelete(r)
            }
            Response::DeleteGroups(mut r) => {
                for g in r.results.iter_mut() {
                    if g.error_code == error_code::NONE {
                        g.error_code = error_code;
                    }
                }
                Response::DeleteGroups(r)
            }
            Response::AlterShareGroupOffsets(mut r) => {
                r.error_code = error_code;
                r.initialize.clear();
                Response::AlterShareGroupOffsets(r)
            }
            Response::DeleteShareGroupOffsets(mut r) => {
                r.error_code = error_code;
                r.delete.clear();
                Response::DeleteShareGroupOffsets(r)
            }
            Response::ShareGroupStateDeletions(mut r) => {
                for g in r.iter_mut() {
                    if g.error_code == error_code::NONE {
                        g.error_code = error_code;
                    }
                    g.topics.clear();
                }
                Response::ShareGroupStateDeletions(r)
            }
        }
    }
}

/// A response and the request it answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Respond {
    pub responder: ResponderId,
    pub response: Response,
}

/// What a call asks the broker to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// Send this response now.
    Respond(Respond),
    /// Append `records` (each with its `__consumer_offsets` partition), report where each
    /// partition's batch ended ([`crate::GroupCoordinator::appended`] with `write`), and
    /// once the high watermark has passed them report it
    /// ([`crate::GroupCoordinator::commit_up_to`]) and then send `responses`; if a write
    /// fails, send `Response::failed` versions and reload the partition
    /// (`unload_partition` then load), which rebuilds exactly the state that was written.
    Persist {
        write: WriteId,
        records: Vec<(i32, Record)>,
        responses: Vec<Respond>,
    },
    /// As `Persist`, in a transactional batch of this producer (TxnOffsetCommit): the
    /// records stay pending until the transaction's marker, and `commit_up_to` does not
    /// make them visible.
    PersistTransactional {
        write: WriteId,
        producer_id: i64,
        producer_epoch: i16,
        records: Vec<(i32, Record)>,
        responses: Vec<Respond>,
    },
    /// A share group needs these partitions' share-partition state initialised before it
    /// assigns them (KIP-932: the group coordinator sends InitializeShareGroupState to the
    /// share coordinator once the records marking them initializing are written); report
    /// success with [`crate::GroupCoordinator::share_group_state_initialized`]. Follows the
    /// `Persist` that wrote the initializing mark, or comes alone when a heartbeat asks
    /// again for partitions a previous coordinator marked but never saw initialised.
    InitializeShareGroupState {
        group_id: String,
        group_epoch: i32,
        topics: Vec<ShareTopicPartitions>,
    },
}
