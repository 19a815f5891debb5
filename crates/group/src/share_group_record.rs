//! The records of a share group (KIP-932) in `__consumer_offsets`, with the field sets of
//! Kafka 4.2's `ShareGroup*Key`/`*Value` specs (kafka-group-coordinator-4.2.2.jar), so
//! that the broker converts them one to one into the generated types. A `None` value is a
//! tombstone.
//!
//! A share group is its epoch and the hash of its subscribed topics' metadata
//! (`ShareGroupMetadata`), each member's subscription (`ShareGroupMemberMetadata`), the
//! target assignment with its epoch (`ShareGroupTargetAssignmentMetadata`, one
//! `ShareGroupTargetAssignmentMember` per member), each member's current assignment and
//! epoch (`ShareGroupCurrentMemberAssignment`), and which topics' share-partition state
//! the share coordinator has initialised, is initialising, or is deleting
//! (`ShareGroupStatePartitionMetadata`). Replaying them in log order rebuilds the group.

use crate::consumer_group_record::TopicPartitions;

/// `ShareGroupMetadataValue`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareGroupMetadataValue {
    pub epoch: i32,
    /// The hash of the subscribed topics' ids, names and partition counts when the epoch
    /// was last bumped: a different hash now means the topics changed (Kafka 4.2 keeps
    /// this instead of 4.0's `ShareGroupPartitionMetadata`).
    pub metadata_hash: i64,
}

/// `ShareGroupMemberMetadataValue`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareGroupMemberMetadataValue {
    pub rack_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub subscribed_topic_names: Vec<String>,
}

/// `ShareGroupTargetAssignmentMetadataValue`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareGroupTargetAssignmentMetadataValue {
    pub assignment_epoch: i32,
}

/// `ShareGroupTargetAssignmentMemberValue`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareGroupTargetAssignmentMemberValue {
    pub topic_partitions: Vec<TopicPartitions>,
}

/// `ShareGroupCurrentMemberAssignmentValue`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareGroupCurrentMemberAssignmentValue {
    pub member_epoch: i32,
    pub previous_member_epoch: i32,
    /// Kafka's `MemberState` byte; a share group member is always 0 (stable): it owns
    /// no offsets, so it never waits for a revocation.
    pub state: i8,
    pub assigned_partitions: Vec<TopicPartitions>,
}

/// `ShareGroupStatePartitionMetadataValue.TopicPartitionsInfo`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ShareTopicPartitionsInfo {
    pub topic_id: rill_protocol::Uuid,
    pub topic_name: String,
    pub partitions: Vec<i32>,
}

/// `ShareGroupStatePartitionMetadataValue.TopicInfo`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ShareTopicInfo {
    pub topic_id: rill_protocol::Uuid,
    pub topic_name: String,
}

/// `ShareGroupStatePartitionMetadataValue`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ShareGroupStatePartitionMetadataValue {
    pub initializing_topics: Vec<ShareTopicPartitionsInfo>,
    pub initialized_topics: Vec<ShareTopicPartitionsInfo>,
    pub deleting_topics: Vec<ShareTopicInfo>,
}

/// A share group record: key fields and value (`None`: tombstone). The record type
/// (Kafka's coordinator record api key) is in each variant's doc.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShareGroupRecord {
    /// Type 10.
    MemberMetadata {
        group_id: String,
        member_id: String,
        value: Option<ShareGroupMemberMetadataValue>,
    },
    /// Type 11.
    Metadata {
        group_id: String,
        value: Option<ShareGroupMetadataValue>,
    },
    /// Type 12.
    TargetAssignmentMetadata {
        group_id: String,
        value: Option<ShareGroupTargetAssignmentMetadataValue>,
    },
    /// Type 13.
    TargetAssignmentMember {
        group_id: String,
        member_id: String,
        value: Option<ShareGroupTargetAssignmentMemberValue>,
    },
    /// Type 14.
    CurrentMemberAssignment {
        group_id: String,
        member_id: String,
        value: Option<ShareGroupCurrentMemberAssignmentValue>,
    },
    /// Type 15.
    StatePartitionMetadata {
        group_id: String,
        value: Option<ShareGroupStatePartitionMetadataValue>,
    },
}

impl ShareGroupRecord {
    pub fn group_id(&self) -> &str {
        match self {
            ShareGroupRecord::MemberMetadata { group_id, .. }
            | ShareGroupRecord::Metadata { group_id, .. }
            | ShareGroupRecord::TargetAssignmentMetadata { group_id, .. }
            | ShareGroupRecord::TargetAssignmentMember { group_id, .. }
            | ShareGroupRecord::CurrentMemberAssignment { group_id, .. }
            | ShareGroupRecord::StatePartitionMetadata { group_id, .. } => group_id,
        }
    }

    pub fn is_tombstone(&self) -> bool {
        match self {
            ShareGroupRecord::MemberMetadata { value, .. } => value.is_none(),
            ShareGroupRecord::Metadata { value, .. } => value.is_none(),
            ShareGroupRecord::TargetAssignmentMetadata { value, .. } => value.is_none(),
            ShareGroupRecord::TargetAssignmentMember { value, .. } => value.is_none(),
            ShareGroupRecord::CurrentMemberAssignment { value, .. } => value.is_none(),
            ShareGroupRecord::StatePartitionMetadata { value, .. } => value.is_none(),
        }
    }
}
