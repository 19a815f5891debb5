//! The records of a consumer group (KIP-848's `group.protocol=consumer`) in
//! `__consumer_offsets`, with the field sets of Kafka's `ConsumerGroup*Key`/`*Value` specs
//! (group-coordinator/*.json), so that the broker converts them one to one into the
//! generated types. A `None` value is a tombstone.
//!
//! A group is its epoch (`ConsumerGroupMetadata`), the topics its members subscribe to as
//! the coordinator last saw them (`ConsumerGroupPartitionMetadata`), each member's
//! subscription (`ConsumerGroupMemberMetadata`), the target assignment with its epoch
//! (`ConsumerGroupTargetAssignmentMetadata`, one `ConsumerGroupTargetAssignmentMember` per
//! member) and each member's current assignment and epoch
//! (`ConsumerGroupCurrentMemberAssignment`). Replaying them in log order rebuilds the group.

use std::collections::{BTreeMap, BTreeSet};

use rill_protocol::Uuid;

/// Partitions by topic id: a member's assignment, or a group's target for one member.
pub type Assignment = BTreeMap<Uuid, BTreeSet<i32>>;

/// One topic's partitions, as the records and the wire carry an [`Assignment`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicPartitions {
    pub topic_id: Uuid,
    pub partitions: Vec<i32>,
}

/// An assignment in the records' and the wire's shape, topics and partitions ascending.
pub fn to_topic_partitions(assignment: &Assignment) -> Vec<TopicPartitions> {
    assignment
        .iter()
        .filter(|(_, p)| !p.is_empty())
        .map(|(id, p)| TopicPartitions {
            topic_id: *id,
            partitions: p.iter().copied().collect(),
        })
        .collect()
}

/// The inverse of [`to_topic_partitions`]; empty topics are dropped.
pub fn from_topic_partitions(list: &[TopicPartitions]) -> Assignment {
    let mut out = Assignment::new();
    for tp in list {
        if !tp.partitions.is_empty() {
            out.entry(tp.topic_id)
                .or_default()
                .extend(tp.partitions.iter().copied());
        }
    }
    out
}

/// `ConsumerGroupMetadataValue`: the group epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerGroupMetadataValue {
    pub epoch: i32,
}

/// One topic of `ConsumerGroupPartitionMetadataValue`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ConsumerGroupTopicMetadata {
    pub topic_id: Uuid,
    pub topic_name: String,
    pub num_partitions: i32,
}

/// `ConsumerGroupPartitionMetadataValue`: the subscribed topics that exist, with their
/// partition counts, as of the last computation (a change bumps the group epoch).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerGroupPartitionMetadataValue {
    pub topics: Vec<ConsumerGroupTopicMetadata>,
}

/// `ConsumerGroupMemberMetadataValue.ClassicMemberMetadata`: what a member that joined
/// with the classic protocol (JoinGroup) sent, kept while it is in a consumer group
/// (KIP-848's online migration).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClassicMemberMetadata {
    pub session_timeout_ms: i32,
    /// (protocol name, metadata) in the member's order of preference.
    pub supported_protocols: Vec<(String, bytes::Bytes)>,
}

/// `ConsumerGroupMemberMetadataValue`: a member's subscription and identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerGroupMemberMetadataValue {
    pub instance_id: Option<String>,
    pub rack_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub subscribed_topic_names: Vec<String>,
    pub subscribed_topic_regex: Option<String>,
    pub rebalance_timeout_ms: i32,
    pub server_assignor: Option<String>,
    /// Set for a member that uses the classic protocol (a tagged field).
    pub classic_member_metadata: Option<ClassicMemberMetadata>,
}

/// `ConsumerGroupTargetAssignmentMetadataValue`: the epoch of the target assignment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerGroupTargetAssignmentMetadataValue {
    pub assignment_epoch: i32,
}

/// `ConsumerGroupTargetAssignmentMemberValue`: one member's target partitions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerGroupTargetAssignmentMemberValue {
    pub topic_partitions: Vec<TopicPartitions>,
}

/// `ConsumerGroupCurrentMemberAssignmentValue`: where a member's reconciliation stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerGroupCurrentMemberAssignmentValue {
    pub member_epoch: i32,
    pub previous_member_epoch: i32,
    /// Kafka's `MemberState` byte: 0 stable, 1 unrevoked partitions, 2 unreleased
    /// partitions.
    pub state: i8,
    pub assigned_partitions: Vec<TopicPartitions>,
    pub partitions_pending_revocation: Vec<TopicPartitions>,
}

/// A consumer group record: key fields and value (`None`: tombstone).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConsumerGroupRecord {
    /// Key version 3.
    Metadata {
        group_id: String,
        value: Option<ConsumerGroupMetadataValue>,
    },
    /// Key version 4.
    PartitionMetadata {
        group_id: String,
        value: Option<ConsumerGroupPartitionMetadataValue>,
    },
    /// Key version 5.
    MemberMetadata {
        group_id: String,
        member_id: String,
        value: Option<ConsumerGroupMemberMetadataValue>,
    },
    /// Key version 6.
    TargetAssignmentMetadata {
        group_id: String,
        value: Option<ConsumerGroupTargetAssignmentMetadataValue>,
    },
    /// Key version 7.
    TargetAssignmentMember {
        group_id: String,
        member_id: String,
        value: Option<ConsumerGroupTargetAssignmentMemberValue>,
    },
    /// Key version 8.
    CurrentMemberAssignment {
        group_id: String,
        member_id: String,
        value: Option<ConsumerGroupCurrentMemberAssignmentValue>,
    },
}

impl ConsumerGroupRecord {
    pub fn group_id(&self) -> &str {
        match self {
            ConsumerGroupRecord::Metadata { group_id, .. }
            | ConsumerGroupRecord::PartitionMetadata { group_id, .. }
            | ConsumerGroupRecord::MemberMetadata { group_id, .. }
            | ConsumerGroupRecord::TargetAssignmentMetadata { group_id, .. }
            | ConsumerGroupRecord::TargetAssignmentMember { group_id, .. }
            | ConsumerGroupRecord::CurrentMemberAssignment { group_id, .. } => group_id,
        }
    }

    pub fn is_tombstone(&self) -> bool {
        match self {
            ConsumerGroupRecord::Metadata { value, .. } => value.is_none(),
            ConsumerGroupRecord::PartitionMetadata { value, .. } => value.is_none(),
            ConsumerGroupRecord::MemberMetadata { value, .. } => value.is_none(),
            ConsumerGroupRecord::TargetAssignmentMetadata { value, .. } => value.is_none(),
            ConsumerGroupRecord::TargetAssignmentMember { value, .. } => value.is_none(),
            ConsumerGroupRecord::CurrentMemberAssignment { value, .. } => value.is_none(),
        }
    }
}
