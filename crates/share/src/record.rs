//! The records of `__share_group_state` as domain types: Kafka's `ShareSnapshot` (a whole
//! share-partition's state) and `ShareUpdate` (what one write changed), keyed by
//! [`SharePartitionKey`]; a `None` value is a tombstone. Their byte format (the
//! `ShareSnapshotKey`/`Value` and `ShareUpdateKey`/`Value` specs) is a thin layer the broker's
//! coordinator adds over these fields.

use std::fmt;

use rill_protocol::{partition_for, Uuid};

use crate::state_batch::StateBatch;

/// The internal topic the share coordinator keeps its records in.
pub const SHARE_GROUP_STATE_TOPIC: &str = "__share_group_state";

/// A share-partition: a share group's view of one topic partition (Kafka's
/// `SharePartitionKey`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SharePartitionKey {
    pub group_id: String,
    pub topic_id: Uuid,
    pub partition: i32,
}

impl SharePartitionKey {
    pub fn new(group_id: impl Into<String>, topic_id: Uuid, partition: i32) -> Self {
        SharePartitionKey {
            group_id: group_id.into(),
            topic_id,
            partition,
        }
    }

    /// FindCoordinator's key for a share coordinator (key type 2): `group:topicId:partition`.
    pub fn coordinator_key(&self) -> String {
        self.to_string()
    }

    /// The `__share_group_state` partition that holds this share-partition's state, among
    /// `share.coordinator.state.topic.num.partitions`.
    pub fn partition_for(&self, num_partitions: i32) -> i32 {
        partition_for(&self.coordinator_key(), num_partitions)
    }
}

impl fmt::Display for SharePartitionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.group_id, self.topic_id, self.partition)
    }
}

/// `ShareSnapshotValue`: the whole state of a share-partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareSnapshotValue {
    /// Incremented at each snapshot; the updates after it carry the same.
    pub snapshot_epoch: i32,
    pub state_epoch: i32,
    pub leader_epoch: i32,
    pub start_offset: i64,
    /// Records from the start offset on whose delivery is over (KIP-1226, for lag); `-1`
    /// when not known.
    pub delivery_complete_count: i32,
    pub create_timestamp_ms: i64,
    pub write_timestamp_ms: i64,
    pub state_batches: Vec<StateBatch>,
}

/// `ShareUpdateValue`: what one write changed. A `start_offset` or `leader_epoch` of `-1`
/// leaves the current one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareUpdateValue {
    pub snapshot_epoch: i32,
    pub leader_epoch: i32,
    pub start_offset: i64,
    pub delivery_complete_count: i32,
    pub state_batches: Vec<StateBatch>,
}

/// One record of `__share_group_state`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShareCoordinatorRecord {
    ShareSnapshot {
        key: SharePartitionKey,
        value: Option<ShareSnapshotValue>,
    },
    ShareUpdate {
        key: SharePartitionKey,
        value: Option<ShareUpdateValue>,
    },
}

impl ShareCoordinatorRecord {
    pub fn key(&self) -> &SharePartitionKey {
        match self {
            ShareCoordinatorRecord::ShareSnapshot { key, .. }
            | ShareCoordinatorRecord::ShareUpdate { key, .. } => key,
        }
    }
}
