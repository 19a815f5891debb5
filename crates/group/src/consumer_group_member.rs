//! A member of a consumer group (Kafka's `ConsumerGroupMember`): its subscription, its
//! epoch, and where its reconciliation towards the target assignment stands. Built only
//! by replaying its records (`ConsumerGroupMemberMetadata` for the subscription,
//! `ConsumerGroupCurrentMemberAssignment` for the epochs and partitions).

use crate::consumer_group_record::{
    from_topic_partitions, to_topic_partitions, Assignment, ClassicMemberMetadata,
    ConsumerGroupCurrentMemberAssignmentValue, ConsumerGroupMemberMetadataValue,
};

/// The epoch of a heartbeat that leaves the group.
pub const LEAVE_GROUP_MEMBER_EPOCH: i32 = -1;
/// The epoch of a static member's heartbeat that leaves for now, to come back with the
/// same `group.instance.id` within its session.
pub const LEAVE_GROUP_STATIC_MEMBER_EPOCH: i32 = -2;

/// Kafka's `MemberState`: how far a member is in reconciling towards its target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MemberState {
    /// The member owns its target assignment for its epoch (or waits for no one).
    #[default]
    Stable,
    /// The member must revoke partitions before it may move to the next epoch.
    UnrevokedPartitions,
    /// The member is at the target epoch but some of its target partitions are still
    /// owned by others, who have not revoked them yet.
    UnreleasedPartitions,
    /// A state this version does not know (from a newer coordinator's records).
    Unknown,
}

impl MemberState {
    pub fn as_byte(self) -> i8 {
        match self {
            MemberState::Stable => 0,
            MemberState::UnrevokedPartitions => 1,
            MemberState::UnreleasedPartitions => 2,
            MemberState::Unknown => 127,
        }
    }

    pub fn from_byte(b: i8) -> Self {
        match b {
            0 => MemberState::Stable,
            1 => MemberState::UnrevokedPartitions,
            2 => MemberState::UnreleasedPartitions,
            _ => MemberState::Unknown,
        }
    }
}

impl std::fmt::Display for MemberState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            MemberState::Stable => "STABLE",
            MemberState::UnrevokedPartitions => "UNREVOKED_PARTITIONS",
            MemberState::UnreleasedPartitions => "UNRELEASED_PARTITIONS",
            MemberState::Unknown => "UNKNOWN",
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ConsumerGroupMember {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub rack_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    /// Sorted, without duplicates.
    pub subscribed_topic_names: Vec<String>,
    pub subscribed_topic_regex: Option<String>,
    /// -1 until the member sends one.
    pub rebalance_timeout_ms: i32,
    pub server_assignor: Option<String>,
    /// Set while the member uses the classic protocol (JoinGroup, SyncGroup, Heartbeat)
    /// in a consumer group: KIP-848's online migration.
    pub classic: Option<ClassicMemberMetadata>,
    pub member_epoch: i32,
    pub previous_member_epoch: i32,
    pub state: MemberState,
    pub assigned_partitions: Assignment,
    pub partitions_pending_revocation: Assignment,
}

impl ConsumerGroupMember {
    /// A member not yet in any record: epoch 0, nothing assigned.
    pub fn new(member_id: &str) -> Self {
        ConsumerGroupMember {
            member_id: member_id.to_owned(),
            rebalance_timeout_ms: -1,
            ..Default::default()
        }
    }

    /// Whether the member owns exactly its target for `target_epoch`.
    pub fn is_reconciled_to(&self, target_epoch: i32) -> bool {
        self.state == MemberState::Stable && self.member_epoch == target_epoch
    }

    pub fn metadata_value(&self) -> ConsumerGroupMemberMetadataValue {
        ConsumerGroupMemberMetadataValue {
            instance_id: self.instance_id.clone(),
            rack_id: self.rack_id.clone(),
            client_id: self.client_id.clone(),
            client_host: self.client_host.clone(),
            subscribed_topic_names: self.subscribed_topic_names.clone(),
            subscribed_topic_regex: self.subscribed_topic_regex.clone(),
            rebalance_timeout_ms: self.rebalance_timeout_ms,
            server_assignor: self.server_assignor.clone(),
            classic_member_metadata: self.classic.clone(),
        }
    }

    pub fn current_assignment_value(&self) -> ConsumerGroupCurrentMemberAssignmentValue {
        ConsumerGroupCurrentMemberAssignmentValue {
            member_epoch: self.member_epoch,
            previous_member_epoch: self.previous_member_epoch,
            state: self.state.as_byte(),
            assigned_partitions: to_topic_partitions(&self.assigned_partitions),
            partitions_pending_revocation: to_topic_partitions(&self.partitions_pending_revocation),
        }
    }

    pub(crate) fn apply_metadata(&mut self, v: &ConsumerGroupMemberMetadataValue) {
        self.instance_id = v.instance_id.clone();
        self.rack_id = v.rack_id.clone();
        self.client_id = v.client_id.clone();
        self.client_host = v.client_host.clone();
        self.subscribed_topic_names = v.subscribed_topic_names.clone();
        self.subscribed_topic_regex = v.subscribed_topic_regex.clone();
        self.rebalance_timeout_ms = v.rebalance_timeout_ms;
        self.server_assignor = v.server_assignor.clone();
        self.classic = v.classic_member_metadata.clone();
    }

    pub(crate) fn apply_current_assignment(
        &mut self,
        v: &ConsumerGroupCurrentMemberAssignmentValue,
    ) {
        self.member_epoch = v.member_epoch;
        self.previous_member_epoch = v.previous_member_epoch;
        self.state = MemberState::from_byte(v.state);
        self.assigned_partitions = from_topic_partitions(&v.assigned_partitions);
        self.partitions_pending_revocation =
            from_topic_partitions(&v.partitions_pending_revocation);
    }

    /// The member's subscription differs (names or regular expression).
    pub(crate) fn subscription_differs(&self, other: &ConsumerGroupMember) -> bool {
        self.subscribed_topic_names != other.subscribed_topic_names
            || self.subscribed_topic_regex != other.subscribed_topic_regex
    }

    /// Kafka's `Builder.updateMemberEpoch`: the previous epoch is kept for a heartbeat
    /// whose response (with the new epoch) got lost.
    pub(crate) fn update_member_epoch(&mut self, epoch: i32) {
        self.previous_member_epoch = self.member_epoch;
        self.member_epoch = epoch;
    }

    /// Whether the member uses the classic protocol.
    pub fn uses_classic_protocol(&self) -> bool {
        self.classic.is_some()
    }

    /// Number of partitions the member owns now.
    pub fn assigned_count(&self) -> usize {
        self.assigned_partitions.values().map(|p| p.len()).sum()
    }
}
