//! The records the group coordinator appends to `__consumer_offsets`, with the field sets
//! of Kafka's `GroupMetadataKey`/`GroupMetadataValue` and `OffsetCommitKey`/
//! `OffsetCommitValue` specs (group-coordinator/*.json), so that the broker can convert
//! them one to one into the generated wire types. A `None` value is a tombstone. The
//! consumer groups' records are in [`crate::consumer_group_record`], the share groups' in
//! [`crate::share_group_record`].

use bytes::Bytes;

use crate::consumer_group_record::ConsumerGroupRecord;
use crate::share_group_record::ShareGroupRecord;

/// Key of a group's metadata record (`GroupMetadataKey`, key version 2).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GroupMetadataKey {
    pub group: String,
}

/// One member in a group's metadata record (`GroupMetadataValue.MemberMetadata`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberMetadata {
    pub member_id: String,
    pub group_instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    /// `rebalanceTimeout` in milliseconds (the spec's name, kept for the conversion).
    pub rebalance_timeout: i32,
    /// `sessionTimeout` in milliseconds.
    pub session_timeout: i32,
    /// The member's metadata for the group's selected protocol.
    pub subscription: Bytes,
    pub assignment: Bytes,
}

/// A group's metadata (`GroupMetadataValue`): written when a generation becomes Stable
/// (with the leader's assignment), when the group becomes Empty, and when a static
/// member is replaced without a rebalance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupMetadataValue {
    /// Empty string for a group that never had a protocol type (a "simple" group).
    pub protocol_type: String,
    pub generation: i32,
    pub protocol: Option<String>,
    pub leader: Option<String>,
    /// When the group entered its current state, or -1.
    pub current_state_timestamp: i64,
    pub members: Vec<MemberMetadata>,
}

/// Key of a committed offset (`OffsetCommitKey`, key version 1).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OffsetCommitKey {
    pub group: String,
    pub topic: String,
    pub partition: i32,
}

/// A committed offset (`OffsetCommitValue`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetCommitValue {
    pub offset: i64,
    /// -1 when the client did not send one.
    pub leader_epoch: i32,
    pub metadata: String,
    pub commit_timestamp: i64,
    /// Only set by OffsetCommit v2-v4 with an explicit retention time; otherwise -1.
    pub expire_timestamp: i64,
}

/// A group metadata record or its tombstone (`value == None`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupMetadataRecord {
    pub key: GroupMetadataKey,
    pub value: Option<GroupMetadataValue>,
}

/// An offset commit record or its tombstone (`value == None`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetCommitRecord {
    pub key: OffsetCommitKey,
    pub value: Option<OffsetCommitValue>,
}

/// Any record of `__consumer_offsets` that the group coordinator writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    GroupMetadata(GroupMetadataRecord),
    OffsetCommit(OffsetCommitRecord),
    /// A consumer group's (KIP-848).
    ConsumerGroup(ConsumerGroupRecord),
    /// A share group's (KIP-932).
    ShareGroup(ShareGroupRecord),
}

impl Record {
    /// The group the record belongs to; it decides the record's partition.
    pub fn group_id(&self) -> &str {
        match self {
            Record::GroupMetadata(r) => &r.key.group,
            Record::OffsetCommit(r) => &r.key.group,
            Record::ConsumerGroup(r) => r.group_id(),
            Record::ShareGroup(r) => r.group_id(),
        }
    }

    /// Whether this is a tombstone (a deletion).
    pub fn is_tombstone(&self) -> bool {
        match self {
            Record::GroupMetadata(r) => r.value.is_none(),
            Record::OffsetCommit(r) => r.value.is_none(),
            Record::ConsumerGroup(r) => r.is_tombstone(),
            Record::ShareGroup(r) => r.is_tombstone(),
        }
    }
}
