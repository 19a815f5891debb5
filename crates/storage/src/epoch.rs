//! `LeaderEpochFileCache`: which leader epoch started at which offset
//! (`leader-epoch-checkpoint`).
//!
//! Every batch carries the epoch of the leader that appended it. The cache keeps, for
//! each epoch, the first offset written in it; a follower that becomes one (or a leader
//! that loses leadership) asks the new leader for the end offset of its latest epoch
//! (OffsetForLeaderEpoch, KIP-101/KIP-279) and truncates there, which is what keeps
//! divergent logs from surviving a leader change. The cache is rewritten atomically each
//! time it changes, and rebuilt from the batches' `partitionLeaderEpoch` when the file
//! is missing or malformed.
//!
//! Most rewrites are durable (fsynced). Two are not (Kafka's KAFKA-15046: at a restart
//! every partition is opened and gets a new epoch, and two fsyncs each bounded the
//! start-up): the rewrite at open, whose trims and rebuilt entries the next open derives
//! again from the log, and the one a replica makes when it becomes leader, whose entry
//! may be lost in a crash. That is safe because (1) an epoch with no batch needs no entry — its end offset is the
//! log end either way — and (2) an epoch with batches is found again from their headers
//! by the open that follows the crash (`UnifiedLog::open` assigns every epoch newer
//! than the checkpoint's latest from the batches it scans, as Kafka's recovery does),
//! and (3) the log rewrites a deferred cache durably before a segment rolls, so an
//! entry can only be lost while its first batch is still in the active segment, which
//! the cleaner never rewrites: the batch found again is the epoch's first.

use std::path::{Path, PathBuf};

use crate::checkpoint::{self, Durability};
use crate::StorageError;

pub const LEADER_EPOCH_CHECKPOINT_FILE: &str = "leader-epoch-checkpoint";
/// Kafka's `UNDEFINED_EPOCH` and `UNDEFINED_EPOCH_OFFSET`.
pub const UNDEFINED_EPOCH: i32 = -1;
pub const UNDEFINED_EPOCH_OFFSET: i64 = -1;

/// One epoch and the offset of its first batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EpochEntry {
    pub epoch: i32,
    pub start_offset: i64,
}

#[derive(Debug)]
pub struct LeaderEpochFileCache {
    path: PathBuf,
    /// Strictly increasing in both epoch and start offset.
    entries: Vec<EpochEntry>,
    /// The file was last written without fsync: it may not survive a crash.
    deferred: bool,
    /// The file holds `entries` (read from it or written since, durably or not).
    in_file: bool,
}

impl LeaderEpochFileCache {
    /// Loads the checkpoint in `dir`; `Ok(None)` when it is missing or unreadable (the
    /// caller rebuilds it from the log).
    pub(crate) fn load(dir: &Path) -> Result<Option<Self>, StorageError> {
        let path = dir.join(LEADER_EPOCH_CHECKPOINT_FILE);
        let entries = match checkpoint::read(&path) {
            Ok(Some(e)) => e,
            Ok(None) => return Ok(None),
            Err(StorageError::Corrupt { reason, .. }) => {
                tracing::warn!(path = %path.display(), %reason, "rebuilding leader epoch cache");
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        let mut cache = Self {
            path,
            entries: Vec::new(),
            deferred: false,
            in_file: true,
        };
        for e in entries {
            let [epoch, start_offset] = e.as_slice() else {
                return Ok(None);
            };
            let Ok(epoch) = i32::try_from(*epoch) else {
                return Ok(None);
            };
            let entry = EpochEntry {
                epoch,
                start_offset: *start_offset,
            };
            if cache
                .entries
                .last()
                .is_some_and(|l| l.epoch >= epoch || l.start_offset >= entry.start_offset)
            {
                return Ok(None);
            }
            cache.entries.push(entry);
        }
        Ok(Some(cache))
    }

    pub(crate) fn empty(dir: &Path) -> Self {
        Self {
            path: dir.join(LEADER_EPOCH_CHECKPOINT_FILE),
            entries: Vec::new(),
            deferred: false,
            in_file: false,
        }
    }

    pub fn entries(&self) -> &[EpochEntry] {
        &self.entries
    }

    pub fn latest_epoch(&self) -> Option<i32> {
        self.entries.last().map(|e| e.epoch)
    }

    /// Records that `epoch` starts at `start_offset`, unless it is already known. Entries
    /// that contradict it (an epoch at least as high, or a start offset at least as
    /// high) are removed first, as Kafka does. Returns whether the cache changed (the
    /// caller then checkpoints it).
    pub(crate) fn assign(&mut self, epoch: i32, start_offset: i64) -> bool {
        if epoch < 0 {
            return false;
        }
        let needed = match self.entries.last() {
            Some(l) => l.epoch != epoch || start_offset < l.start_offset,
            None => true,
        };
        if !needed {
            return false;
        }
        self.entries
            .retain(|e| e.epoch < epoch && e.start_offset < start_offset);
        self.entries.push(EpochEntry {
            epoch,
            start_offset,
        });
        self.in_file = false;
        true
    }

    /// The epoch of the batch holding `offset`, from the entry that starts at or before it.
    pub fn epoch_for_offset(&self, offset: i64) -> Option<i32> {
        let i = self.entries.partition_point(|e| e.start_offset <= offset);
        i.checked_sub(1)
            .and_then(|i| self.entries.get(i))
            .map(|e| e.epoch)
    }

    /// OffsetForLeaderEpoch: `(epoch, end offset)` for `requested`, Kafka's rules:
    /// - the latest epoch ends at the log end offset;
    /// - an older epoch ends where the next higher epoch starts, answered with the
    ///   greatest known epoch `<= requested` (or `requested` when it predates all);
    /// - an epoch above the latest, or an undefined one, is `(UNDEFINED_EPOCH,
    ///   UNDEFINED_EPOCH_OFFSET)`.
    pub fn end_offset_for(&self, requested: i32, log_end_offset: i64) -> (i32, i64) {
        if requested == UNDEFINED_EPOCH {
            return (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET);
        }
        if self.latest_epoch() == Some(requested) {
            return (requested, log_end_offset);
        }
        let higher = self.entries.partition_point(|e| e.epoch <= requested);
        let Some(higher_entry) = self.entries.get(higher) else {
            return (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET);
        };
        match higher.checked_sub(1).and_then(|i| self.entries.get(i)) {
            Some(floor) => (floor.epoch, higher_entry.start_offset),
            None => (requested, higher_entry.start_offset),
        }
    }

    /// Removes the entries that start at or after `end_offset` (the log was truncated
    /// there). Returns whether the cache changed.
    pub(crate) fn truncate_from_end(&mut self, end_offset: i64) -> bool {
        let before = self.entries.len();
        self.entries.retain(|e| e.start_offset < end_offset);
        let changed = before != self.entries.len();
        self.in_file &= !changed;
        changed
    }

    /// Drops the entries wholly before `start_offset` (the log start moved up), keeping
    /// the epoch that covers `start_offset` with its start moved there.
    pub(crate) fn truncate_from_start(&mut self, start_offset: i64) -> bool {
        let covering = self
            .entries
            .partition_point(|e| e.start_offset <= start_offset);
        let Some(i) = covering.checked_sub(1) else {
            return false;
        };
        let changed = i > 0 || self.entries[i].start_offset != start_offset;
        self.entries.drain(..i);
        if let Some(first) = self.entries.first_mut() {
            first.start_offset = start_offset;
        }
        self.in_file &= !changed;
        changed
    }

    pub(crate) fn clear(&mut self) {
        self.entries.clear();
        self.in_file = false;
    }

    /// Writes the checkpoint file atomically, fsynced or not.
    pub(crate) fn flush(&mut self, durability: Durability) -> Result<(), StorageError> {
        let lines: Vec<String> = self
            .entries
            .iter()
            .map(|e| format!("{} {}", e.epoch, e.start_offset))
            .collect();
        // Unknown until the write is done: a failed write may have left either version.
        self.in_file = false;
        checkpoint::write(&self.path, &lines, durability)?;
        self.deferred = durability == Durability::Deferred;
        self.in_file = true;
        Ok(())
    }

    /// Whether the file holds the entries as they are in memory.
    pub(crate) fn is_in_file(&self) -> bool {
        self.in_file
    }

    /// Whether the file was last written without fsync.
    pub(crate) fn is_deferred(&self) -> bool {
        self.deferred
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn end_offset_for_follows_kafka() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = LeaderEpochFileCache::empty(dir.path());
        assert_eq!(
            c.end_offset_for(0, 0),
            (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)
        );
        assert!(c.assign(1, 0));
        assert!(!c.assign(1, 5));
        assert!(c.assign(3, 10));
        assert!(c.assign(5, 20));
        assert_eq!(c.end_offset_for(5, 30), (5, 30));
        assert_eq!(c.end_offset_for(3, 30), (3, 20));
        assert_eq!(c.end_offset_for(4, 30), (3, 20));
        assert_eq!(c.end_offset_for(2, 30), (1, 10));
        assert_eq!(c.end_offset_for(0, 30), (0, 0));
        assert_eq!(
            c.end_offset_for(6, 30),
            (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)
        );
        assert_eq!(
            c.end_offset_for(UNDEFINED_EPOCH, 30),
            (UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET)
        );
        assert_eq!(c.epoch_for_offset(15), Some(3));
        c.flush(Durability::Durable).unwrap();
        let loaded = LeaderEpochFileCache::load(dir.path()).unwrap().unwrap();
        assert_eq!(loaded.entries(), c.entries());
        assert!(c.truncate_from_end(20));
        assert_eq!(c.latest_epoch(), Some(3));
        assert!(c.truncate_from_start(12));
        assert_eq!(
            c.entries(),
            &[EpochEntry {
                epoch: 3,
                start_offset: 12
            }]
        );
        // A lower epoch at a higher offset removes the contradicting entries.
        assert!(c.assign(2, 30));
        assert_eq!(
            c.entries(),
            &[EpochEntry {
                epoch: 2,
                start_offset: 30
            }]
        );
    }
}
