//! `ProducerStateManager`: per idempotent producer, its epoch and its last five batches,
//! which is what lets the leader drop a producer's retried batch instead of writing it
//! twice (KIP-98, invariant 7 of DESIGN.md §4).
//!
//! The rules are Kafka's (`ProducerStateManager`, `ProducerAppendInfo`):
//! 1. A batch whose producer epoch is below the known one is from a fenced zombie:
//!    `InvalidProducerEpoch` (a replicated batch is accepted: the leader decided).
//! 2. A client batch with the known epoch and the same first and last sequence as one
//!    of the producer's last five batches is a duplicate: the log answers with that
//!    batch's original offsets and writes nothing.
//! 3. Otherwise a client batch's first sequence must follow the last one (`last + 1`,
//!    wrapping from `i32::MAX` to 0). A new epoch must start at sequence 0, unless the
//!    log knows no epoch for the producer: a producer whose state was never seen, or was
//!    removed with the segments that held it, is accepted at any sequence.
//! 4. Coordinator and replication appends do not check sequences.
//!
//! State is changed only after the whole record set passed validation (the log works on
//! copies of the entries it touches). A clean close writes a snapshot,
//! `<log end offset, 20 digits>.snapshot` (the checkpoint text format: one line per
//! producer, `producerId epoch lastTimestamp n` then `lastSeq lastOffset offsetDelta
//! timestamp` for each remembered batch); the next open loads it when its offset is the
//! log end and deletes it, so a snapshot on disk is always the state of the last clean
//! close. Otherwise the state is rebuilt by reading the batch headers of the log in
//! order, applying each as a replicated batch; both give the same state, since live
//! appends and replay go through the same `validate_and_stage`.
//! Transactions (ongoing transaction first offsets, the last stable offset) and
//! producer-id expiration are not tracked yet.

use std::collections::{HashMap, VecDeque};

use std::fs;
use std::path::Path;

use crate::checkpoint::{self, Durability};
use crate::error::AppendError;
use crate::header::BatchHeader;
use crate::segment::segment_file;
use crate::StorageError;

pub const PRODUCER_SNAPSHOT_SUFFIX: &str = "snapshot";

/// How many batches per producer are remembered for duplicate detection (Kafka's
/// `NUM_BATCHES_TO_RETAIN`, and the client's max in-flight requests).
pub const NUM_BATCHES_TO_RETAIN: usize = 5;
pub const NO_PRODUCER_EPOCH: i16 = -1;
pub const NO_SEQUENCE: i32 = -1;

/// Who is appending: decides which checks apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AppendOrigin {
    /// A producer, through Produce: full validation, no control batches.
    Client,
    /// The group or transaction coordinator: may write control batches.
    Coordinator,
    /// A follower copying the leader: offsets kept, sequences not checked.
    Replication,
}

/// One remembered batch of a producer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchMetadata {
    pub last_seq: i32,
    pub last_offset: i64,
    pub offset_delta: i32,
    pub timestamp: i64,
}

impl BatchMetadata {
    pub fn first_seq(&self) -> i32 {
        decrement_sequence(self.last_seq, self.offset_delta)
    }
    pub fn first_offset(&self) -> i64 {
        self.last_offset - i64::from(self.offset_delta)
    }
}

/// `seq - delta`, wrapping below 0 to `i32::MAX` as sequences do.
fn decrement_sequence(seq: i32, delta: i32) -> i32 {
    if seq < delta {
        (i64::from(i32::MAX) - i64::from(delta) + i64::from(seq) + 1) as i32
    } else {
        seq - delta
    }
}

/// Sequence of a batch's last record, wrapping at `i32::MAX`.
pub(crate) fn last_sequence(base_sequence: i32, last_offset_delta: i32) -> i32 {
    if base_sequence < 0 {
        return base_sequence;
    }
    ((i64::from(base_sequence) + i64::from(last_offset_delta)) % (i64::from(i32::MAX) + 1)) as i32
}

fn in_sequence(last_seq: i32, next_seq: i32) -> bool {
    i64::from(next_seq) == i64::from(last_seq) + 1 || (next_seq == 0 && last_seq == i32::MAX)
}

/// What the log knows of one producer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProducerStateEntry {
    pub producer_id: i64,
    pub producer_epoch: i16,
    /// Oldest first, at most [`NUM_BATCHES_TO_RETAIN`].
    pub batches: VecDeque<BatchMetadata>,
    pub last_timestamp: i64,
}

impl ProducerStateEntry {
    fn empty(producer_id: i64) -> Self {
        Self {
            producer_id,
            producer_epoch: NO_PRODUCER_EPOCH,
            batches: VecDeque::new(),
            last_timestamp: -1,
        }
    }

    pub fn last_seq(&self) -> i32 {
        self.batches.back().map_or(NO_SEQUENCE, |b| b.last_seq)
    }

    pub fn last_data_offset(&self) -> i64 {
        self.batches.back().map_or(-1, |b| b.last_offset)
    }

    /// The remembered batch with exactly this epoch and sequence range.
    pub fn find_duplicate_batch(
        &self,
        producer_epoch: i16,
        first_seq: i32,
        last_seq: i32,
    ) -> Option<BatchMetadata> {
        if producer_epoch != self.producer_epoch {
            return None;
        }
        self.batches
            .iter()
            .find(|b| b.first_seq() == first_seq && b.last_seq == last_seq)
            .copied()
    }

    /// A new epoch forgets the old epoch's batches.
    fn maybe_update_producer_epoch(&mut self, producer_epoch: i16) {
        if self.producer_epoch != producer_epoch {
            self.batches.clear();
            self.producer_epoch = producer_epoch;
        }
    }

    fn add_batch(&mut self, producer_epoch: i16, meta: BatchMetadata) {
        self.maybe_update_producer_epoch(producer_epoch);
        if self.batches.len() == NUM_BATCHES_TO_RETAIN {
            self.batches.pop_front();
        }
        self.batches.push_back(meta);
        self.last_timestamp = meta.timestamp;
    }
}

/// The producers of one partition.
#[derive(Debug, Default, Clone)]
pub struct ProducerStateManager {
    producers: HashMap<i64, ProducerStateEntry>,
}

/// The producer fields of one batch, as the log hands them over.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ProducerBatch {
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    pub last_offset_delta: i32,
    pub max_timestamp: i64,
    pub is_control: bool,
}

impl ProducerBatch {
    pub fn from_header(h: &BatchHeader) -> Self {
        Self {
            producer_id: h.producer_id,
            producer_epoch: h.producer_epoch,
            base_sequence: h.base_sequence,
            last_offset_delta: h.last_offset_delta,
            max_timestamp: h.max_timestamp,
            is_control: h.is_control(),
        }
    }
    pub fn last_sequence(&self) -> i32 {
        last_sequence(self.base_sequence, self.last_offset_delta)
    }
}

/// Validated but not yet applied changes for the producers of one record set.
#[derive(Debug, Default)]
pub(crate) struct ProducerAppendInfo {
    updated: HashMap<i64, ProducerStateEntry>,
}

impl ProducerStateManager {
    pub fn get(&self, producer_id: i64) -> Option<&ProducerStateEntry> {
        self.producers.get(&producer_id)
    }

    pub fn len(&self) -> usize {
        self.producers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.producers.is_empty()
    }

    /// The last offset of each producer's latest batch: the batches the cleaner must
    /// keep (emptied if need be) so that a rebuild from the log finds every producer's
    /// last sequence again.
    pub(crate) fn last_batch_offsets(&self) -> std::collections::HashSet<i64> {
        self.producers
            .values()
            .map(ProducerStateEntry::last_data_offset)
            .filter(|o| *o >= 0)
            .collect()
    }

    pub(crate) fn clear(&mut self) {
        self.producers.clear();
    }

    /// Rule 2: a client batch that repeats one of the producer's last five.
    pub(crate) fn find_duplicate(&self, b: &ProducerBatch) -> Option<BatchMetadata> {
        self.producers.get(&b.producer_id).and_then(|e| {
            e.find_duplicate_batch(b.producer_epoch, b.base_sequence, b.last_sequence())
        })
    }

    /// Rules 1, 3 and 4 for one batch whose last offset will be `last_offset`, recorded
    /// in `info` (checked against earlier batches of the same record set).
    pub(crate) fn validate_and_stage(
        &self,
        info: &mut ProducerAppendInfo,
        b: &ProducerBatch,
        last_offset: i64,
        origin: AppendOrigin,
    ) -> Result<(), AppendError> {
        let current_epoch = self
            .producers
            .get(&b.producer_id)
            .map_or(NO_PRODUCER_EPOCH, |e| e.producer_epoch);
        let entry = info.updated.entry(b.producer_id).or_insert_with(|| {
            self.producers
                .get(&b.producer_id)
                .cloned()
                .unwrap_or_else(|| ProducerStateEntry::empty(b.producer_id))
        });
        if b.producer_epoch < entry.producer_epoch {
            if origin == AppendOrigin::Replication {
                tracing::warn!(
                    producer_id = b.producer_id,
                    epoch = b.producer_epoch,
                    current = entry.producer_epoch,
                    "replicated batch with an older producer epoch"
                );
            } else {
                return Err(AppendError::InvalidProducerEpoch {
                    producer_id: b.producer_id,
                    current: entry.producer_epoch,
                    found: b.producer_epoch,
                });
            }
        }
        if b.is_control {
            entry.maybe_update_producer_epoch(b.producer_epoch);
            entry.last_timestamp = b.max_timestamp;
            return Ok(());
        }
        if origin == AppendOrigin::Client {
            let first = b.base_sequence;
            if b.producer_epoch != entry.producer_epoch {
                if first != 0 && entry.producer_epoch != NO_PRODUCER_EPOCH {
                    return Err(AppendError::OutOfOrderSequence {
                        producer_id: b.producer_id,
                        producer_epoch: b.producer_epoch,
                        expected: 0,
                        found: first,
                    });
                }
            } else {
                let last = entry.last_seq();
                if !(current_epoch == NO_PRODUCER_EPOCH || in_sequence(last, first)) {
                    return Err(AppendError::OutOfOrderSequence {
                        producer_id: b.producer_id,
                        producer_epoch: b.producer_epoch,
                        expected: if last == i32::MAX {
                            0
                        } else {
                            last.wrapping_add(1)
                        },
                        found: first,
                    });
                }
            }
        }
        entry.add_batch(
            b.producer_epoch,
            BatchMetadata {
                last_seq: b.last_sequence(),
                last_offset,
                offset_delta: b.last_offset_delta,
                timestamp: b.max_timestamp,
            },
        );
        Ok(())
    }

    /// Applies what [`Self::validate_and_stage`] staged, once the append succeeded.
    pub(crate) fn apply(&mut self, info: ProducerAppendInfo) {
        self.producers.extend(info.updated);
    }

    /// Writes the snapshot of the state at `offset` (the log end) and removes older ones.
    pub(crate) fn write_snapshot(
        &self,
        dir: &Path,
        offset: i64,
        durability: Durability,
    ) -> Result<(), StorageError> {
        let mut ids: Vec<_> = self.producers.keys().copied().collect();
        ids.sort_unstable();
        let mut lines = Vec::with_capacity(ids.len());
        for id in ids {
            let Some(e) = self.producers.get(&id) else {
                continue;
            };
            let mut line = format!(
                "{} {} {} {}",
                e.producer_id,
                e.producer_epoch,
                e.last_timestamp,
                e.batches.len()
            );
            for b in &e.batches {
                line.push_str(&format!(
                    " {} {} {} {}",
                    b.last_seq, b.last_offset, b.offset_delta, b.timestamp
                ));
            }
            lines.push(line);
        }
        let path = segment_file(dir, offset, PRODUCER_SNAPSHOT_SUFFIX);
        checkpoint::write(&path, &lines, durability)?;
        Self::delete_snapshots(dir, Some(&path))
    }

    /// Loads the snapshot taken at `offset`; `None` when there is none or it is corrupt.
    pub(crate) fn read_snapshot(dir: &Path, offset: i64) -> Result<Option<Self>, StorageError> {
        let path = segment_file(dir, offset, PRODUCER_SNAPSHOT_SUFFIX);
        let lines = match checkpoint::read(&path) {
            Ok(Some(lines)) => lines,
            Ok(None) | Err(StorageError::Corrupt { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        let mut producers = HashMap::with_capacity(lines.len());
        for f in lines {
            let header = f.get(..4).and_then(|h| {
                Some((
                    h[0],
                    i16::try_from(h[1]).ok()?,
                    h[2],
                    usize::try_from(h[3]).ok()?,
                ))
            });
            let Some((producer_id, producer_epoch, last_timestamp, n)) = header else {
                return Ok(None);
            };
            if n > NUM_BATCHES_TO_RETAIN || f.len() != 4 + 4 * n {
                return Ok(None);
            }
            let mut batches = VecDeque::with_capacity(n);
            for b in f[4..].chunks_exact(4) {
                let (Ok(last_seq), Ok(offset_delta)) = (i32::try_from(b[0]), i32::try_from(b[2]))
                else {
                    return Ok(None);
                };
                batches.push_back(BatchMetadata {
                    last_seq,
                    last_offset: b[1],
                    offset_delta,
                    timestamp: b[3],
                });
            }
            producers.insert(
                producer_id,
                ProducerStateEntry {
                    producer_id,
                    producer_epoch,
                    batches,
                    last_timestamp,
                },
            );
        }
        Ok(Some(Self { producers }))
    }

    /// Removes every snapshot in `dir` but `keep`.
    pub(crate) fn delete_snapshots(dir: &Path, keep: Option<&Path>) -> Result<(), StorageError> {
        for entry in fs::read_dir(dir).map_err(|e| StorageError::io(dir, e))? {
            let path = entry.map_err(|e| StorageError::io(dir, e))?.path();
            let is_snapshot = path
                .extension()
                .is_some_and(|e| e == PRODUCER_SNAPSHOT_SUFFIX);
            if is_snapshot && Some(path.as_path()) != keep {
                fs::remove_file(&path).map_err(|e| StorageError::io(&path, e))?;
            }
        }
        Ok(())
    }

    /// Applies a batch read back from the log (recovery, truncation): as replication.
    pub(crate) fn replay(&mut self, h: &BatchHeader) {
        if h.producer_id < 0 {
            return;
        }
        let b = ProducerBatch::from_header(h);
        let mut info = ProducerAppendInfo::default();
        // Replication never fails validation; a result is ignored for that reason.
        if self
            .validate_and_stage(&mut info, &b, h.last_offset(), AppendOrigin::Replication)
            .is_ok()
        {
            self.apply(info);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(pid: i64, epoch: i16, seq: i32, n: i32) -> ProducerBatch {
        ProducerBatch {
            producer_id: pid,
            producer_epoch: epoch,
            base_sequence: seq,
            last_offset_delta: n - 1,
            max_timestamp: 0,
            is_control: false,
        }
    }

    fn append(
        m: &mut ProducerStateManager,
        b: ProducerBatch,
        last: i64,
    ) -> Result<(), AppendError> {
        let mut info = ProducerAppendInfo::default();
        m.validate_and_stage(&mut info, &b, last, AppendOrigin::Client)?;
        m.apply(info);
        Ok(())
    }

    #[test]
    fn sequence_rules() {
        let mut m = ProducerStateManager::default();
        // Unknown producer: any first sequence is accepted.
        append(&mut m, batch(1, 0, 7, 3), 2).unwrap();
        assert_eq!(m.get(1).unwrap().last_seq(), 9);
        assert!(matches!(
            append(&mut m, batch(1, 0, 11, 1), 3),
            Err(AppendError::OutOfOrderSequence {
                expected: 10,
                found: 11,
                ..
            })
        ));
        append(&mut m, batch(1, 0, 10, 1), 3).unwrap();
        assert_eq!(m.find_duplicate(&batch(1, 0, 7, 3)).unwrap().last_offset, 2);
        // A new epoch must restart at 0.
        assert!(matches!(
            append(&mut m, batch(1, 1, 11, 1), 4),
            Err(AppendError::OutOfOrderSequence { expected: 0, .. })
        ));
        append(&mut m, batch(1, 1, 0, 1), 4).unwrap();
        assert!(m.find_duplicate(&batch(1, 0, 7, 3)).is_none());
        assert!(matches!(
            append(&mut m, batch(1, 0, 11, 1), 5),
            Err(AppendError::InvalidProducerEpoch {
                current: 1,
                found: 0,
                ..
            })
        ));
    }

    #[test]
    fn sequences_wrap() {
        assert_eq!(last_sequence(i32::MAX - 1, 3), 1);
        assert_eq!(decrement_sequence(1, 3), i32::MAX - 1);
        assert!(in_sequence(i32::MAX, 0));
        let mut m = ProducerStateManager::default();
        append(&mut m, batch(9, 0, i32::MAX - 1, 2), 1).unwrap();
        append(&mut m, batch(9, 0, 0, 2), 3).unwrap();
        assert_eq!(
            m.find_duplicate(&batch(9, 0, i32::MAX - 1, 2))
                .unwrap()
                .last_offset,
            1
        );
    }

    #[test]
    fn only_five_batches_are_remembered() {
        let mut m = ProducerStateManager::default();
        for i in 0..7 {
            append(&mut m, batch(2, 0, i, 1), i64::from(i)).unwrap();
        }
        assert!(m.find_duplicate(&batch(2, 0, 1, 1)).is_none());
        assert_eq!(m.find_duplicate(&batch(2, 0, 2, 1)).unwrap().last_offset, 2);
    }
}
