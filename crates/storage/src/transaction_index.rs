//! `TransactionIndex`: the aborted transactions of one segment, `<base offset>.txnindex`.
//!
//! A read_committed consumer must drop the records of aborted transactions, and it can
//! only do so if the fetch tells it which producers aborted which ranges (Fetch's
//! `aborted_transactions`). Kafka keeps those ranges per segment in an append-only file
//! of fixed 34-byte entries, and so does this module, in the same layout:
//! `version int16 (0), producerId int64, firstOffset int64, lastOffset int64,
//! lastStableOffset int64`, big-endian. `lastOffset` is the offset of the ABORT marker,
//! which decides the segment an entry belongs to.
//!
//! The log keeps every entry in memory too (one small struct per aborted transaction) and
//! answers fetches from there; the files are what a restart loads instead of reading the
//! log again. Entries are appended without fsync; a segment roll fsyncs the file of the
//! segment it closes, and a rewrite (a clean, a rebuild) is fsynced. After an unclean
//! shutdown the log trusts the files of the segments below the producer snapshot it
//! starts from (each was fsynced by the roll that took that snapshot), rebuilds the
//! entries above it from the markers it reads anyway for the producer state, and
//! rewrites those files (see `UnifiedLog::open`).

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::Path;

use crate::StorageError;

pub const TXN_INDEX_FILE_SUFFIX: &str = "txnindex";

/// Present (durably) while the cleaner swaps segments whose `.txnindex` files it then
/// rewrites: until it is gone the files may not match the segments, and an open reads
/// every marker again instead of trusting any of them.
pub const TXN_INDEX_REBUILD_FILE: &str = "txnindex-rebuild";

/// Marks the `.txnindex` files of `dir` as untrusted (see [`TXN_INDEX_REBUILD_FILE`]).
pub(crate) fn mark_for_rebuild(dir: &Path) -> Result<(), StorageError> {
    let path = dir.join(TXN_INDEX_REBUILD_FILE);
    let file = fs::File::create(&path).map_err(|e| StorageError::io(&path, e))?;
    file.sync_all().map_err(|e| StorageError::io(&path, e))?;
    crate::checkpoint::sync_dir(dir)
}

/// Whether [`mark_for_rebuild`] was called and [`rebuilt`] not yet.
pub(crate) fn needs_rebuild(dir: &Path) -> bool {
    dir.join(TXN_INDEX_REBUILD_FILE).exists()
}

/// The `.txnindex` files of `dir` match its segments again (durably rewritten).
pub(crate) fn rebuilt(dir: &Path) -> Result<(), StorageError> {
    remove(&dir.join(TXN_INDEX_REBUILD_FILE))
}

/// Bytes per entry on disk.
pub const ABORTED_TXN_ENTRY_BYTES: usize = 34;
const ENTRY_VERSION: i16 = 0;

/// One aborted transaction (Kafka's `AbortedTxn`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AbortedTxn {
    pub producer_id: i64,
    /// The transaction's first offset in this partition.
    pub first_offset: i64,
    /// The offset of its ABORT marker.
    pub last_offset: i64,
    /// The last stable offset just after the marker: the first offset of the oldest
    /// transaction still open then, or `last_offset + 1`.
    pub last_stable_offset: i64,
}

impl AbortedTxn {
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&ENTRY_VERSION.to_be_bytes());
        out.extend_from_slice(&self.producer_id.to_be_bytes());
        out.extend_from_slice(&self.first_offset.to_be_bytes());
        out.extend_from_slice(&self.last_offset.to_be_bytes());
        out.extend_from_slice(&self.last_stable_offset.to_be_bytes());
    }

    fn decode(b: &[u8]) -> Option<Self> {
        let i64_at = |at: usize| -> Option<i64> {
            let bytes: [u8; 8] = b.get(at..at + 8)?.try_into().ok()?;
            Some(i64::from_be_bytes(bytes))
        };
        let version = i16::from_be_bytes(b.get(0..2)?.try_into().ok()?);
        if version != ENTRY_VERSION {
            return None;
        }
        Some(Self {
            producer_id: i64_at(2)?,
            first_offset: i64_at(10)?,
            last_offset: i64_at(18)?,
            last_stable_offset: i64_at(26)?,
        })
    }
}

/// Appends entries to the index file at `path` (created when absent), without fsync.
pub(crate) fn append(path: &Path, entries: &[AbortedTxn]) -> Result<(), StorageError> {
    if entries.is_empty() {
        return Ok(());
    }
    let mut buf = Vec::with_capacity(entries.len() * ABORTED_TXN_ENTRY_BYTES);
    for e in entries {
        e.encode(&mut buf);
    }
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| StorageError::io(path, e))?;
    file.write_all(&buf).map_err(|e| StorageError::io(path, e))
}

/// Reads the index file at `path`: `None` when it is absent or not a whole number of
/// valid entries (the caller then rebuilds the entries from the log).
pub(crate) fn read(path: &Path) -> Result<Option<Vec<AbortedTxn>>, StorageError> {
    let bytes = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(StorageError::io(path, e)),
    };
    if bytes.len() % ABORTED_TXN_ENTRY_BYTES != 0 {
        return Ok(None);
    }
    let mut out = Vec::with_capacity(bytes.len() / ABORTED_TXN_ENTRY_BYTES);
    for chunk in bytes.chunks_exact(ABORTED_TXN_ENTRY_BYTES) {
        match AbortedTxn::decode(chunk) {
            Some(e) => out.push(e),
            None => return Ok(None),
        }
    }
    Ok(Some(out))
}

/// Replaces the index file at `path` with exactly `entries` (removed when empty),
/// through a fsynced temporary file, so that a crash leaves the old or the new content
/// and a recovery may trust what it finds (rewrites are rare: a clean, a rebuild).
pub(crate) fn write(path: &Path, entries: &[AbortedTxn]) -> Result<(), StorageError> {
    if entries.is_empty() {
        return remove(path);
    }
    let mut buf = Vec::with_capacity(entries.len() * ABORTED_TXN_ENTRY_BYTES);
    for e in entries {
        e.encode(&mut buf);
    }
    let tmp = path.with_extension(format!("{TXN_INDEX_FILE_SUFFIX}.tmp"));
    let mut file = fs::File::create(&tmp).map_err(|e| StorageError::io(&tmp, e))?;
    file.write_all(&buf)
        .map_err(|e| StorageError::io(&tmp, e))?;
    file.sync_all().map_err(|e| StorageError::io(&tmp, e))?;
    fs::rename(&tmp, path).map_err(|e| StorageError::io(path, e))?;
    sync_parent(path)
}

/// Fsyncs the index file at `path` when there is one.
pub(crate) fn sync(path: &Path) -> Result<(), StorageError> {
    match fs::File::open(path) {
        Ok(file) => file.sync_all().map_err(|e| StorageError::io(path, e)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(StorageError::io(path, e)),
    }
}

/// Removes the index file at `path` (durably: a recovery must not find it again and
/// trust it).
pub(crate) fn remove(path: &Path) -> Result<(), StorageError> {
    match fs::remove_file(path) {
        Ok(()) => sync_parent(path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(StorageError::io(path, e)),
    }
}

fn sync_parent(path: &Path) -> Result<(), StorageError> {
    match path.parent() {
        Some(dir) => crate::checkpoint::sync_dir(dir),
        None => Ok(()),
    }
}

/// The entries of `all` (sorted by `last_offset`) that a read from `start_offset` up to
/// `upper_bound_offset` must report: those whose marker is at or after the start and
/// whose transaction began before the bound (Kafka's `collectAbortedTxns`).
pub fn collect_aborted_txns(
    all: &[AbortedTxn],
    start_offset: i64,
    upper_bound_offset: i64,
) -> Vec<AbortedTxn> {
    let from = all.partition_point(|e| e.last_offset < start_offset);
    all[from..]
        .iter()
        .filter(|e| e.first_offset < upper_bound_offset)
        .copied()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn txn(pid: i64, first: i64, last: i64) -> AbortedTxn {
        AbortedTxn {
            producer_id: pid,
            first_offset: first,
            last_offset: last,
            last_stable_offset: last + 1,
        }
    }

    #[test]
    fn entries_round_trip_in_kafkas_layout() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("00000000000000000000.txnindex");
        assert_eq!(read(&path).unwrap(), None);
        append(&path, &[txn(7, 0, 5)]).unwrap();
        append(&path, &[txn(8, 3, 9), txn(7, 10, 12)]).unwrap();
        let bytes = fs::read(&path).unwrap();
        assert_eq!(bytes.len(), 3 * ABORTED_TXN_ENTRY_BYTES);
        // version 0, then producer id 7, first offset 0, last offset 5, LSO 6.
        assert_eq!(&bytes[..2], &[0, 0]);
        assert_eq!(&bytes[2..10], &7i64.to_be_bytes());
        assert_eq!(&bytes[18..26], &5i64.to_be_bytes());
        assert_eq!(&bytes[26..34], &6i64.to_be_bytes());
        assert_eq!(
            read(&path).unwrap().unwrap(),
            vec![txn(7, 0, 5), txn(8, 3, 9), txn(7, 10, 12)]
        );
        write(&path, &[txn(1, 1, 2)]).unwrap();
        assert_eq!(read(&path).unwrap().unwrap(), vec![txn(1, 1, 2)]);
        // A torn entry makes the file unusable rather than half-read.
        OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(&[0, 0, 1])
            .unwrap();
        assert_eq!(read(&path).unwrap(), None);
        write(&path, &[]).unwrap();
        assert!(!path.exists());
    }

    #[test]
    fn collect_reports_transactions_overlapping_the_read() {
        let all = [txn(1, 0, 4), txn(2, 2, 8), txn(3, 10, 12), txn(4, 20, 25)];
        let pids = |v: Vec<AbortedTxn>| v.iter().map(|e| e.producer_id).collect::<Vec<_>>();
        assert_eq!(pids(collect_aborted_txns(&all, 0, 100)), vec![1, 2, 3, 4]);
        assert_eq!(pids(collect_aborted_txns(&all, 5, 100)), vec![2, 3, 4]);
        assert_eq!(pids(collect_aborted_txns(&all, 5, 10)), vec![2]);
        assert_eq!(pids(collect_aborted_txns(&all, 9, 21)), vec![3, 4]);
        assert!(collect_aborted_txns(&all, 26, 100).is_empty());
    }
}
