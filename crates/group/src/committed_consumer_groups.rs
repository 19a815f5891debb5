//! The consumer groups and share groups as of each `__consumer_offsets` partition's high
//! watermark, which reads (ConsumerGroupDescribe, ShareGroupDescribe, ListGroups,
//! OffsetFetch's member check) are served from,
//! and the writes above it with the answers that wait for them.
//!
//! # Design note
//!
//! Kafka's coordinator keeps its state in timeline structures and reads them at the last
//! committed offset; here the same records are replayed twice: into the live groups as
//! soon as a handler makes them (so the next decision sees them), and into this view
//! once the high watermark passes them.
//!
//! 1. Every write of a partition is queued here with its consumer and share group records
//!    (possibly none: an offset commit), in the order the writes are made.
//! 2. The broker says where each write's batch ended ([`CommittedConsumerGroups::appended`])
//!    and, later, how far the high watermark is ([`CommittedConsumerGroups::commit_up_to`]):
//!    the writes that ended at or below it are replayed here, oldest first.
//! 3. A heartbeat that writes nothing is still answered from the live state, which may
//!    hold a write not yet replicated; such an answer waits on the partition's last
//!    pending write ([`CommittedConsumerGroups::hold`]) and goes out when it commits (Kafka's
//!    coordinator runtime defers a read after a pending write the same way).
//! 4. An unload drops the queue and the view; the held answers get NOT_COORDINATOR from
//!    the caller.
//!
//! Why it is correct: as for the committed offsets (`committed_offsets.rs`), what is below
//! the high watermark is never truncated, and the queue's prefix is the log's prefix, so
//! nothing read here can be taken back; and every answer about live state leaves only
//! after the writes it could reflect are replicated.

use std::collections::{BTreeMap, VecDeque};

use crate::api::Respond;
use crate::committed_offsets::WriteId;
use crate::consumer_group::ConsumerGroup;
use crate::record::Record;
use crate::share_group::ShareGroup;
use crate::share_group_record::ShareGroupRecord;

#[derive(Debug)]
struct PendingWrite {
    write: WriteId,
    end_offset: Option<i64>,
    /// Only consumer and share group records.
    records: Vec<Record>,
    /// Answers computed after this write, released with it.
    held: Vec<Respond>,
}

#[derive(Debug, Default)]
pub(crate) struct CommittedConsumerGroups {
    groups: BTreeMap<String, ConsumerGroup>,
    share_groups: BTreeMap<String, ShareGroup>,
    pending: BTreeMap<i32, VecDeque<PendingWrite>>,
}

impl CommittedConsumerGroups {
    pub(crate) fn group(&self, group_id: &str) -> Option<&ConsumerGroup> {
        self.groups.get(group_id)
    }

    pub(crate) fn groups(&self) -> impl Iterator<Item = &ConsumerGroup> {
        self.groups.values()
    }

    pub(crate) fn share_group(&self, group_id: &str) -> Option<&ShareGroup> {
        self.share_groups.get(group_id)
    }

    pub(crate) fn share_groups(&self) -> impl Iterator<Item = &ShareGroup> {
        self.share_groups.values()
    }

    /// Replays a record that is below its partition's high watermark.
    pub(crate) fn apply(&mut self, partition: i32, record: &Record) {
        match record {
            Record::ConsumerGroup(r) => self.apply_consumer(partition, r),
            Record::ShareGroup(r) => self.apply_share(partition, r),
            Record::GroupMetadata(_) | Record::OffsetCommit(_) => {}
        }
    }

    fn apply_share(&mut self, partition: i32, record: &ShareGroupRecord) {
        let group_id = record.group_id();
        if !self.share_groups.contains_key(group_id) {
            if record.is_tombstone() {
                return;
            }
            self.share_groups
                .insert(group_id.to_owned(), ShareGroup::new(group_id, partition));
        }
        let keep = self
            .share_groups
            .get_mut(group_id)
            .is_some_and(|g| g.replay(record));
        if !keep {
            self.share_groups.remove(group_id);
        }
    }

    fn apply_consumer(&mut self, partition: i32, record: &crate::ConsumerGroupRecord) {
        let group_id = record.group_id();
        if !self.groups.contains_key(group_id) {
            if record.is_tombstone() {
                return;
            }
            self.groups
                .insert(group_id.to_owned(), ConsumerGroup::new(group_id, partition));
        }
        let keep = self
            .groups
            .get_mut(group_id)
            .is_some_and(|g| g.replay(record));
        if !keep {
            self.groups.remove(group_id);
        }
    }

    /// Queues a write of `partition` (with its consumer group records, maybe none).
    pub(crate) fn written(
        &mut self,
        partition: i32,
        write: WriteId,
        end_offset: Option<i64>,
        records: Vec<Record>,
    ) {
        self.pending
            .entry(partition)
            .or_default()
            .push_back(PendingWrite {
                write,
                end_offset,
                records,
                held: Vec::new(),
            });
    }

    /// Holds `respond` until the partition's last pending write commits; gives it back
    /// when nothing is pending (it may be sent now).
    pub(crate) fn hold(&mut self, partition: i32, respond: Respond) -> Option<Respond> {
        match self.pending.get_mut(&partition).and_then(|q| q.back_mut()) {
            Some(w) => {
                w.held.push(respond);
                None
            }
            None => Some(respond),
        }
    }

    pub(crate) fn appended(&mut self, partition: i32, write: WriteId, end_offset: i64) {
        if let Some(w) = self
            .pending
            .get_mut(&partition)
            .and_then(|q| q.iter_mut().find(|w| w.write == write))
        {
            w.end_offset = Some(end_offset);
        }
    }

    /// The high watermark of `partition` reached `offset`: the writes below it are
    /// replayed here; returns the answers that waited for them.
    pub(crate) fn commit_up_to(&mut self, partition: i32, offset: i64) -> Vec<Respond> {
        let mut done = Vec::new();
        if let Some(queue) = self.pending.get_mut(&partition) {
            while let Some(w) = queue.front() {
                match w.end_offset {
                    Some(end) if end <= offset => {}
                    _ => break,
                }
                if let Some(w) = queue.pop_front() {
                    done.push(w);
                }
            }
            if queue.is_empty() {
                self.pending.remove(&partition);
            }
        }
        let mut released = Vec::new();
        for w in done {
            for r in &w.records {
                self.apply(partition, r);
            }
            released.extend(w.held);
        }
        released
    }

    pub(crate) fn pending_partitions(&self) -> impl Iterator<Item = i32> + '_ {
        self.pending.keys().copied()
    }

    /// Forgets a partition; returns the answers that were waiting on it.
    pub(crate) fn unload(&mut self, partition: i32) -> Vec<Respond> {
        self.groups.retain(|_, g| g.partition != partition);
        self.share_groups.retain(|_, g| g.partition != partition);
        self.pending
            .remove(&partition)
            .map(|q| q.into_iter().flat_map(|w| w.held).collect())
            .unwrap_or_default()
    }
}
