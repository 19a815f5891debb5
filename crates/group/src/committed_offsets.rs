//! The offsets that OffsetFetch serves: each `__consumer_offsets` partition's offset
//! records as of its high watermark, and the records written above it, held back until
//! the broker says they are replicated.
//!
//! # Design note
//!
//! Kafka's coordinator answers reads at the last committed offset of the partition
//! (`OffsetMetadataManager.fetchOffsets` reads its timeline at the high watermark; the
//! older `GroupMetadata` kept `pendingOffsetCommits` apart from `offsets`). A commit that
//! is written but not replicated can still be lost: a leader cut off from its followers
//! appends it, cannot commit it, and truncates it when it rejoins under a new leader. If a
//! read had served it, the committed offset would go backwards at that truncation.
//!
//! 1. A call that writes offset records returns one [`crate::Output::Persist`] with a
//!    fresh [`WriteId`]; the coordinator queues the write's offset records per partition
//!    ([`CommittedOffsets::written`]). Handlers that decide (commit, delete, expire) see
//!    the newest state in the groups themselves; only reads come here.
//! 2. The broker appends the records and says where each partition's batch ended
//!    ([`CommittedOffsets::appended`]).
//! 3. When the partition's high watermark reaches an offset, the broker calls
//!    [`CommittedOffsets::commit_up_to`]: every queued write that ended at or below it is
//!    applied here, in log order, and becomes visible. The broker sends the commit's
//!    response only after that, so a client reads its own commit.
//! 4. A write that failed, or a partition that is no longer led here, is unloaded: its
//!    queue and its committed view go, and a later load replays the log, putting what is
//!    above the high watermark back in the queue.
//!
//! Why it is correct: a record is applied here only once the high watermark has passed
//! it, and data below the high watermark is never truncated (every ISR member has it and
//! only an ISR member becomes leader), so nothing served can be taken back. Writes of one
//! partition are appended in the order they are queued and the log is ordered, so
//! applying the queue's prefix in order is applying the log's prefix.
//!
//! The queue holds what the log holds above its high watermark, which the leader's lease
//! bounds: a leader that cannot replicate loses the partition, and the unload empties it.

use std::collections::{BTreeMap, VecDeque};

use crate::record::{OffsetCommitKey, OffsetCommitRecord, OffsetCommitValue};

/// Names one [`crate::Output::Persist`], so that the broker can say where its records
/// landed ([`crate::GroupCoordinator::appended`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WriteId(pub u64);

/// A group's offsets: (topic, partition) to the committed value.
pub(crate) type GroupOffsets = BTreeMap<(String, i32), OffsetCommitValue>;

#[derive(Debug)]
struct PendingWrite {
    write: WriteId,
    /// The offset after the write's batch in its partition; `None` until the broker has
    /// said (it says right after the append).
    end_offset: Option<i64>,
    records: Vec<OffsetCommitRecord>,
}

/// The committed view of every loaded partition's offsets, and the writes not yet in it.
#[derive(Debug, Default)]
pub(crate) struct CommittedOffsets {
    offsets: BTreeMap<String, GroupOffsets>,
    pending: BTreeMap<i32, VecDeque<PendingWrite>>,
}

impl CommittedOffsets {
    /// A group's committed offsets.
    pub(crate) fn group(&self, group_id: &str) -> Option<&GroupOffsets> {
        self.offsets.get(group_id)
    }

    /// Every committed offset.
    pub(crate) fn all(&self) -> BTreeMap<OffsetCommitKey, OffsetCommitValue> {
        self.offsets
            .iter()
            .flat_map(|(group, offsets)| {
                offsets.iter().map(|((topic, partition), v)| {
                    (
                        OffsetCommitKey {
                            group: group.clone(),
                            topic: topic.clone(),
                            partition: *partition,
                        },
                        v.clone(),
                    )
                })
            })
            .collect()
    }

    /// Applies a record that is below its partition's high watermark.
    pub(crate) fn apply(&mut self, record: &OffsetCommitRecord) {
        let key = (record.key.topic.clone(), record.key.partition);
        match &record.value {
            Some(value) => {
                self.offsets
                    .entry(record.key.group.clone())
                    .or_default()
                    .insert(key, value.clone());
            }
            None => {
                if let Some(offsets) = self.offsets.get_mut(&record.key.group) {
                    offsets.remove(&key);
                    if offsets.is_empty() {
                        self.offsets.remove(&record.key.group);
                    }
                }
            }
        }
    }

    /// Queues a write's offset records of one partition until they are replicated.
    pub(crate) fn written(
        &mut self,
        partition: i32,
        write: WriteId,
        end_offset: Option<i64>,
        records: Vec<OffsetCommitRecord>,
    ) {
        if records.is_empty() {
            return;
        }
        self.pending
            .entry(partition)
            .or_default()
            .push_back(PendingWrite {
                write,
                end_offset,
                records,
            });
    }

    /// Where the write's batch ended in `partition`. A write that is not queued (it had
    /// no offset records, or the partition was unloaded since) is ignored.
    pub(crate) fn appended(&mut self, partition: i32, write: WriteId, end_offset: i64) {
        if let Some(w) = self
            .pending
            .get_mut(&partition)
            .and_then(|q| q.iter_mut().find(|w| w.write == write))
        {
            w.end_offset = Some(end_offset);
        }
    }

    /// The partition's high watermark reached `offset`: writes that ended at or below it
    /// become visible, oldest first. Returns how many records were applied.
    pub(crate) fn commit_up_to(&mut self, partition: i32, offset: i64) -> usize {
        let Some(queue) = self.pending.get_mut(&partition) else {
            return 0;
        };
        let mut done = Vec::new();
        while let Some(w) = queue.front() {
            match w.end_offset {
                Some(end) if end <= offset => {}
                // A write without its offset yet, or above the mark, holds back the rest:
                // they are later in the log.
                _ => break,
            }
            if let Some(w) = queue.pop_front() {
                done.push(w);
            }
        }
        if queue.is_empty() {
            self.pending.remove(&partition);
        }
        let mut applied = 0;
        for w in done {
            for r in &w.records {
                self.apply(r);
                applied += 1;
            }
        }
        applied
    }

    /// Offset records written to `partition` and not yet visible.
    pub(crate) fn pending_records(&self, partition: i32) -> usize {
        self.pending
            .get(&partition)
            .map_or(0, |q| q.iter().map(|w| w.records.len()).sum())
    }

    /// The partitions with offset records not yet visible.
    pub(crate) fn pending_partitions(&self) -> impl Iterator<Item = i32> + '_ {
        self.pending.keys().copied()
    }

    /// Forgets a partition: its queue, and the committed offsets of the groups on it.
    pub(crate) fn unload(&mut self, partition: i32, partition_of: impl Fn(&str) -> i32) {
        self.pending.remove(&partition);
        self.offsets
            .retain(|group, _| partition_of(group) != partition);
    }
}
