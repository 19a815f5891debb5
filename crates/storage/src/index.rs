//! `OffsetIndex` (`.index`) and `TimeIndex` (`.timeindex`): the sparse indexes of a
//! segment.
//!
//! Both are Kafka's on-disk shape: fixed-size big-endian entries whose offsets are
//! relative to the segment's base offset, so that a 4-byte field suffices.
//!
//! - `.index`: 8-byte entries `relativeOffset u32, position u32`. An entry maps the LAST
//!   offset of a batch to the file position where that batch starts; one is added every
//!   `index.interval.bytes` of log. Looking up offset `o` gives the greatest entry
//!   `<= o`, a position at or before the batch that contains `o`; the caller scans
//!   forward from there.
//! - `.timeindex`: 12-byte entries `timestamp i64, relativeOffset u32`: "up to this
//!   offset, the greatest timestamp in the segment is this one". Timestamps strictly
//!   increase, so a lookup by timestamp is a binary search.
//!
//! The files are plain files read fully into memory when a segment is opened. New
//! entries live in memory until the segment is flushed (a roll, a clean shutdown, an
//! explicit `UnifiedLog::flush`), which writes them at the end of the file and fsyncs it
//! (a clean shutdown does not fsync: one `syncfs` of the data directory follows it; the
//! fsyncs that `flush.messages` and `flush.ms` ask for cover the `.log` alone, see
//! [`crate::flush`]); no file handle is kept between flushes (no mmap, no
//! preallocation).
//!
//! Why not keep the files open and write each entry as it comes: a broker with 10,000
//! partitions would hold three descriptors per segment, 30,000 for the active segments
//! alone, past common fd limits before a single client connects; with this layout a
//! segment holds one, its `.log`. Deferring the writes loses nothing that matters: the
//! indexes are derived from the log, every segment but the last is flushed when it is
//! rolled, and the last one is flushed at a clean shutdown or rebuilt by recovery after
//! any other (see [`crate::segment`]), so entries that never reached the file are never
//! needed from it.

use std::cell::Cell;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::checkpoint::Durability;
use crate::StorageError;

const OFFSET_ENTRY: usize = 8;
const TIME_ENTRY: usize = 12;

/// The file's bytes; `None` when it does not exist yet (it is created at the first flush).
fn read_existing(path: &Path) -> Result<Option<Vec<u8>>, StorageError> {
    match std::fs::read(path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(StorageError::io(path, e)),
    }
}

fn open_for_write(path: &Path) -> Result<File, StorageError> {
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| StorageError::io(path, e))
}

/// What of an index is on disk: how many entries the file holds, and whether it changed
/// (entries added or removed) since its last fsync or does not exist yet. `Cell`s, so
/// that a flush through `&self` can record its progress; the index is only ever used
/// under the log's lock.
#[derive(Debug)]
struct FileState {
    persisted: Cell<usize>,
    /// Changed since the last fsync, or absent: the next flush must write the file even
    /// with no new entries, since a segment whose index files are missing is rebuilt at
    /// its next open.
    dirty: Cell<bool>,
}

impl FileState {
    fn loaded(entries: usize, exists: bool) -> Self {
        Self {
            persisted: Cell::new(entries),
            dirty: Cell::new(!exists),
        }
    }

    /// The file now keeps at most `keep` entries (`set_len`), and must be fsynced again.
    fn truncate(&self, path: &Path, keep: usize, entry_len: usize) -> Result<(), StorageError> {
        let keep = keep.min(self.persisted.get());
        open_for_write(path)?
            .set_len((keep * entry_len) as u64)
            .map_err(|e| StorageError::io(path, e))?;
        self.persisted.set(keep);
        self.dirty.set(true);
        Ok(())
    }

    /// Writes `pending` (the entries after the persisted ones, already encoded) after the
    /// persisted entries and, when `durability` asks, fsyncs the file; nothing when
    /// nothing changed since the last fsync.
    fn flush(
        &self,
        path: &Path,
        pending: &[u8],
        entry_len: usize,
        total: usize,
        durability: Durability,
    ) -> Result<(), StorageError> {
        if !self.dirty.get() && pending.is_empty() {
            return Ok(());
        }
        let file = open_for_write(path)?;
        let at = (self.persisted.get() * entry_len) as u64;
        file.write_all_at(pending, at)
            .map_err(|e| StorageError::io(path, e))?;
        self.persisted.set(total);
        if durability == Durability::Durable {
            file.sync_data().map_err(|e| StorageError::io(path, e))?;
            self.dirty.set(false);
        } else {
            // Written but not fsynced: a later durable flush must still fsync.
            self.dirty.set(true);
        }
        Ok(())
    }
}

/// The sparse offset → position index of one segment.
#[derive(Debug)]
pub struct OffsetIndex {
    path: PathBuf,
    file: FileState,
    base_offset: i64,
    /// (relative offset, position), both strictly increasing when the index is sane.
    entries: Vec<(u32, u32)>,
    max_entries: usize,
    /// False when the file did not parse (odd length); the segment rebuilds it.
    loaded_cleanly: bool,
}

impl OffsetIndex {
    pub(crate) fn open(
        path: &Path,
        base_offset: i64,
        max_index_bytes: u64,
    ) -> Result<Self, StorageError> {
        let existing = read_existing(path)?;
        let exists = existing.is_some();
        let bytes = existing.unwrap_or_default();
        let loaded_cleanly = bytes.len() % OFFSET_ENTRY == 0;
        let entries: Vec<(u32, u32)> = bytes
            .chunks_exact(OFFSET_ENTRY)
            .map(|c| {
                (
                    u32::from_be_bytes([c[0], c[1], c[2], c[3]]),
                    u32::from_be_bytes([c[4], c[5], c[6], c[7]]),
                )
            })
            .collect();
        Ok(Self {
            path: path.to_owned(),
            file: FileState::loaded(entries.len(), exists),
            base_offset,
            entries,
            max_entries: (max_index_bytes / OFFSET_ENTRY as u64).max(1) as usize,
            loaded_cleanly,
        })
    }

    /// Checks the invariants a torn or stale file breaks: whole entries, strictly
    /// increasing offsets and positions, positions inside a log of `log_size` bytes.
    pub(crate) fn sanity_check(&self, log_size: u64) -> Result<(), String> {
        if !self.loaded_cleanly {
            return Err("length is not a multiple of the entry size".into());
        }
        for w in self.entries.windows(2) {
            if w[1].0 <= w[0].0 || w[1].1 <= w[0].1 {
                return Err("entries are not strictly increasing".into());
            }
        }
        if let Some(&(_, pos)) = self.entries.last() {
            if u64::from(pos) >= log_size {
                return Err(format!("entry position {pos} beyond log size {log_size}"));
            }
        }
        Ok(())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
    pub fn entries(&self) -> usize {
        self.entries.len()
    }
    pub fn is_full(&self) -> bool {
        self.entries.len() >= self.max_entries
    }

    /// The last entry as (absolute offset, position).
    pub fn last_entry(&self) -> Option<(i64, u32)> {
        self.entries
            .last()
            .map(|&(r, p)| (self.base_offset + i64::from(r), p))
    }

    /// The greatest entry whose offset is `<= target`, or (base offset, 0).
    pub fn lookup(&self, target: i64) -> (i64, u32) {
        let rel = target - self.base_offset;
        if rel < 0 {
            return (self.base_offset, 0);
        }
        let rel = u32::try_from(rel).unwrap_or(u32::MAX);
        let i = self.entries.partition_point(|&(r, _)| r <= rel);
        match i.checked_sub(1).and_then(|i| self.entries.get(i)) {
            Some(&(r, p)) => (self.base_offset + i64::from(r), p),
            None => (self.base_offset, 0),
        }
    }

    /// The last entry, as (absolute offset, position), whose position is in
    /// `[min_position, max_position]` and whose offset is `<= max_offset`: a batch start
    /// that a read from `min_position` may skip to without reading the headers before it.
    pub fn last_entry_within(
        &self,
        min_position: u64,
        max_position: u64,
        max_offset: i64,
    ) -> Option<(i64, u32)> {
        // Offsets and positions both increase along the entries, so the predicate is true
        // on a prefix and a binary search finds its end.
        let i = self.entries.partition_point(|&(r, p)| {
            u64::from(p) <= max_position && self.base_offset + i64::from(r) <= max_offset
        });
        let &(r, p) = self.entries.get(i.checked_sub(1)?)?;
        (u64::from(p) >= min_position).then_some((self.base_offset + i64::from(r), p))
    }

    /// Adds an entry; ignored unless it is beyond the last one (as Kafka refuses
    /// non-increasing entries) and the relative offset fits.
    pub(crate) fn append(&mut self, offset: i64, position: u32) -> Result<(), StorageError> {
        let Ok(rel) = u32::try_from(offset - self.base_offset) else {
            return Ok(());
        };
        if let Some(&(r, p)) = self.entries.last() {
            if rel <= r || position <= p {
                return Ok(());
            }
        }
        self.entries.push((rel, position));
        Ok(())
    }

    /// Removes every entry whose offset is `>= offset`.
    pub(crate) fn truncate_to(&mut self, offset: i64) -> Result<(), StorageError> {
        let rel = offset - self.base_offset;
        let keep = if rel <= 0 {
            0
        } else {
            let rel = u32::try_from(rel).unwrap_or(u32::MAX);
            self.entries.partition_point(|&(r, _)| r < rel)
        };
        self.truncate_entries(keep)
    }

    pub(crate) fn reset(&mut self) -> Result<(), StorageError> {
        self.truncate_entries(0)
    }

    fn truncate_entries(&mut self, keep: usize) -> Result<(), StorageError> {
        self.entries.truncate(keep);
        self.loaded_cleanly = true;
        self.file.truncate(&self.path, keep, OFFSET_ENTRY)
    }

    /// Writes the entries added since the last flush and, when `durability` asks, fsyncs
    /// the file.
    pub(crate) fn flush(&self, durability: Durability) -> Result<(), StorageError> {
        let from = self.file.persisted.get().min(self.entries.len());
        let mut pending = Vec::with_capacity((self.entries.len() - from) * OFFSET_ENTRY);
        for &(rel, position) in &self.entries[from..] {
            pending.extend_from_slice(&rel.to_be_bytes());
            pending.extend_from_slice(&position.to_be_bytes());
        }
        self.file.flush(
            &self.path,
            &pending,
            OFFSET_ENTRY,
            self.entries.len(),
            durability,
        )
    }
}

/// The sparse timestamp → offset index of one segment.
#[derive(Debug)]
pub struct TimeIndex {
    path: PathBuf,
    file: FileState,
    base_offset: i64,
    /// (timestamp, relative offset): timestamps strictly increasing, offsets
    /// non-decreasing.
    entries: Vec<(i64, u32)>,
    max_entries: usize,
    loaded_cleanly: bool,
}

impl TimeIndex {
    pub(crate) fn open(
        path: &Path,
        base_offset: i64,
        max_index_bytes: u64,
    ) -> Result<Self, StorageError> {
        let existing = read_existing(path)?;
        let exists = existing.is_some();
        let bytes = existing.unwrap_or_default();
        let loaded_cleanly = bytes.len() % TIME_ENTRY == 0;
        let entries: Vec<(i64, u32)> = bytes
            .chunks_exact(TIME_ENTRY)
            .map(|c| {
                let mut ts = [0u8; 8];
                ts.copy_from_slice(&c[..8]);
                (
                    i64::from_be_bytes(ts),
                    u32::from_be_bytes([c[8], c[9], c[10], c[11]]),
                )
            })
            .collect();
        Ok(Self {
            path: path.to_owned(),
            file: FileState::loaded(entries.len(), exists),
            base_offset,
            entries,
            max_entries: (max_index_bytes / TIME_ENTRY as u64).max(1) as usize,
            loaded_cleanly,
        })
    }

    /// Whole entries, strictly increasing timestamps, non-decreasing offsets, and the
    /// last offset below `next_offset` (the segment's end).
    pub(crate) fn sanity_check(&self, next_offset: i64) -> Result<(), String> {
        if !self.loaded_cleanly {
            return Err("length is not a multiple of the entry size".into());
        }
        for w in self.entries.windows(2) {
            if w[1].0 <= w[0].0 || w[1].1 < w[0].1 {
                return Err("entries are not increasing".into());
            }
        }
        if let Some((_, off)) = self.last_entry() {
            if off >= next_offset {
                return Err(format!(
                    "entry offset {off} beyond segment end {next_offset}"
                ));
            }
        }
        Ok(())
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
    pub fn entries(&self) -> usize {
        self.entries.len()
    }
    pub fn is_full(&self) -> bool {
        self.entries.len() >= self.max_entries
    }

    /// The last entry as (timestamp, absolute offset).
    pub fn last_entry(&self) -> Option<(i64, i64)> {
        self.entries
            .last()
            .map(|&(t, r)| (t, self.base_offset + i64::from(r)))
    }

    /// The greatest entry whose timestamp is `<= target`, as (timestamp, absolute
    /// offset); `None` when every entry is later.
    pub fn lookup(&self, target: i64) -> Option<(i64, i64)> {
        let i = self.entries.partition_point(|&(t, _)| t <= target);
        i.checked_sub(1)
            .and_then(|i| self.entries.get(i))
            .map(|&(t, r)| (t, self.base_offset + i64::from(r)))
    }

    /// Adds `(timestamp, offset)` when the timestamp is greater than the last one; a
    /// full index only takes the final entry written when the segment is rolled.
    pub(crate) fn maybe_append(
        &mut self,
        timestamp: i64,
        offset: i64,
        skip_full_check: bool,
    ) -> Result<(), StorageError> {
        if !skip_full_check && self.is_full() {
            return Ok(());
        }
        let Ok(rel) = u32::try_from(offset - self.base_offset) else {
            return Ok(());
        };
        if let Some(&(t, r)) = self.entries.last() {
            if timestamp <= t || rel < r {
                return Ok(());
            }
        }
        self.entries.push((timestamp, rel));
        Ok(())
    }

    /// Removes every entry whose offset is `>= offset`.
    pub(crate) fn truncate_to(&mut self, offset: i64) -> Result<(), StorageError> {
        let rel = offset - self.base_offset;
        let keep = if rel <= 0 {
            0
        } else {
            let rel = u32::try_from(rel).unwrap_or(u32::MAX);
            self.entries.partition_point(|&(_, r)| r < rel)
        };
        self.truncate_entries(keep)
    }

    pub(crate) fn reset(&mut self) -> Result<(), StorageError> {
        self.truncate_entries(0)
    }

    fn truncate_entries(&mut self, keep: usize) -> Result<(), StorageError> {
        self.entries.truncate(keep);
        self.loaded_cleanly = true;
        self.file.truncate(&self.path, keep, TIME_ENTRY)
    }

    /// Writes the entries added since the last flush and, when `durability` asks, fsyncs
    /// the file.
    pub(crate) fn flush(&self, durability: Durability) -> Result<(), StorageError> {
        let from = self.file.persisted.get().min(self.entries.len());
        let mut pending = Vec::with_capacity((self.entries.len() - from) * TIME_ENTRY);
        for &(timestamp, rel) in &self.entries[from..] {
            pending.extend_from_slice(&timestamp.to_be_bytes());
            pending.extend_from_slice(&rel.to_be_bytes());
        }
        self.file.flush(
            &self.path,
            &pending,
            TIME_ENTRY,
            self.entries.len(),
            durability,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offset_index_lookup_truncate_and_reload() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("00000000000000000100.index");
        let mut idx = OffsetIndex::open(&p, 100, 1024).unwrap();
        assert_eq!(idx.lookup(150), (100, 0));
        idx.append(109, 0).unwrap();
        idx.append(119, 4100).unwrap();
        idx.append(129, 8200).unwrap();
        idx.append(125, 9000).unwrap(); // not increasing: ignored
        assert_eq!(idx.entries(), 3);
        assert_eq!(idx.lookup(99), (100, 0));
        assert_eq!(idx.lookup(108), (100, 0));
        assert_eq!(idx.lookup(119), (119, 4100));
        assert_eq!(idx.lookup(128), (119, 4100));
        assert_eq!(idx.lookup(1000), (129, 8200));
        // Entries reach the file when the segment is flushed, not before.
        assert!(!p.exists());
        idx.flush(Durability::Durable).unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 24);
        drop(idx);
        let mut idx = OffsetIndex::open(&p, 100, 1024).unwrap();
        idx.sanity_check(10_000).unwrap();
        assert!(idx.sanity_check(8200).is_err());
        idx.truncate_to(119).unwrap();
        assert_eq!(idx.last_entry(), Some((109, 0)));
        std::fs::OpenOptions::new()
            .append(true)
            .open(&p)
            .unwrap()
            .write_all_at(&[1], 8)
            .unwrap();
        let idx = OffsetIndex::open(&p, 100, 1024).unwrap();
        assert!(idx.sanity_check(10_000).is_err());
    }

    #[test]
    fn flush_writes_only_what_is_new_after_a_truncation() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("00000000000000000000.index");
        let mut idx = OffsetIndex::open(&p, 0, 1024).unwrap();
        idx.append(9, 0).unwrap();
        idx.append(19, 4100).unwrap();
        idx.flush(Durability::Durable).unwrap();
        idx.append(29, 8200).unwrap();
        // Truncating below an entry that was never written, then below a written one.
        idx.truncate_to(29).unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 16);
        idx.truncate_to(19).unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 8);
        idx.append(25, 5000).unwrap();
        idx.append(35, 9000).unwrap();
        idx.flush(Durability::Durable).unwrap();
        let reopened = OffsetIndex::open(&p, 0, 1024).unwrap();
        assert_eq!(reopened.entries, vec![(9, 0), (25, 5000), (35, 9000)]);
        reopened.sanity_check(10_000).unwrap();
    }

    #[test]
    fn flush_creates_an_index_file_without_entries() {
        // A segment with under index.interval.bytes of data has no entries; its files
        // must still exist after a clean close, or the next open rebuilds the segment.
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("00000000000000000000.index");
        let t = dir.path().join("00000000000000000000.timeindex");
        OffsetIndex::open(&p, 0, 1024)
            .unwrap()
            .flush(Durability::Durable)
            .unwrap();
        TimeIndex::open(&t, 0, 1024)
            .unwrap()
            .flush(Durability::Durable)
            .unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().len(), 0);
        assert_eq!(std::fs::metadata(&t).unwrap().len(), 0);
    }

    #[test]
    fn time_index_lookup_and_monotonicity() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("00000000000000000000.timeindex");
        let mut idx = TimeIndex::open(&p, 0, 1024).unwrap();
        idx.maybe_append(1000, 5, false).unwrap();
        idx.maybe_append(1000, 9, false).unwrap(); // same timestamp: ignored
        idx.maybe_append(2000, 12, false).unwrap();
        assert_eq!(idx.entries(), 2);
        assert_eq!(idx.lookup(999), None);
        assert_eq!(idx.lookup(1500), Some((1000, 5)));
        assert_eq!(idx.lookup(5000), Some((2000, 12)));
        idx.flush(Durability::Durable).unwrap();
        drop(idx);
        let mut idx = TimeIndex::open(&p, 0, 1024).unwrap();
        idx.sanity_check(13).unwrap();
        assert!(idx.sanity_check(12).is_err());
        idx.truncate_to(12).unwrap();
        assert_eq!(idx.last_entry(), Some((1000, 5)));
    }
}
