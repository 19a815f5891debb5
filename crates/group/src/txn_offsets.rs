//! Pending transactional offsets (Kafka's `pendingTransactionalOffsetCommits`): offsets a
//! transactional producer committed with TxnOffsetCommit, kept apart per producer until
//! the COMMIT or ABORT marker of its transaction lands on the group's
//! `__consumer_offsets` partition. They are never served before that: a commit makes
//! them the group's committed offsets, an abort drops them.

use std::collections::BTreeMap;

use crate::record::OffsetCommitRecord;

/// Per producer id, per `__consumer_offsets` partition, the offset records of its open
/// transaction, in the order they were written.
#[derive(Debug, Default)]
pub(crate) struct PendingTxnOffsets {
    by_producer: BTreeMap<i64, BTreeMap<i32, Vec<OffsetCommitRecord>>>,
}

impl PendingTxnOffsets {
    pub(crate) fn add(&mut self, producer_id: i64, partition: i32, record: OffsetCommitRecord) {
        self.by_producer
            .entry(producer_id)
            .or_default()
            .entry(partition)
            .or_default()
            .push(record);
    }

    /// The records of `producer_id`'s transaction on `partition`, removed.
    pub(crate) fn take(&mut self, partition: i32, producer_id: i64) -> Vec<OffsetCommitRecord> {
        let Some(partitions) = self.by_producer.get_mut(&producer_id) else {
            return Vec::new();
        };
        let taken = partitions.remove(&partition).unwrap_or_default();
        if partitions.is_empty() {
            self.by_producer.remove(&producer_id);
        }
        taken
    }

    /// Whether a transaction holds an offset of this group's partition (OffsetFetch's
    /// `require_stable` answers UNSTABLE_OFFSET_COMMIT then).
    pub(crate) fn is_pending(&self, group: &str, topic: &str, partition: i32) -> bool {
        self.by_producer
            .values()
            .flat_map(|p| p.values())
            .flatten()
            .any(|r| r.key.group == group && r.key.topic == topic && r.key.partition == partition)
    }

    /// Records pending on `partition`, for tests and metrics.
    pub(crate) fn pending_records(&self, partition: i32) -> usize {
        self.by_producer
            .values()
            .filter_map(|p| p.get(&partition))
            .map(Vec::len)
            .sum()
    }

    /// Forgets a partition that is no longer led here.
    pub(crate) fn unload(&mut self, partition: i32) {
        for partitions in self.by_producer.values_mut() {
            partitions.remove(&partition);
        }
        self.by_producer.retain(|_, p| !p.is_empty());
    }
}
