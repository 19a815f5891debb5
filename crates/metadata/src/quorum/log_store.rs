//! The Raft log and vote on disk: [`LogStore`], openraft's `RaftLogStorage`.
//!
//! # Files (in the quorum directory)
//! - `raft.log`: append-only frames `[u32 length][u32 crc32c][postcard(Entry)]`, all
//!   big-endian; every append is `fsync`'d before openraft is told it is durable.
//! - `raft.meta`: one such frame holding the vote, the last purged log id and the last
//!   committed log id; replaced atomically (write `raft.meta.tmp`, fsync, rename, fsync
//!   the directory), because a vote that goes back could elect two leaders in one term.
//!
//! On open, frames are read until the first one that is short or fails its checksum: a
//! torn tail left by a crash during an append that was never acknowledged. The file is
//! cut there. Entries at or below the last purged id are skipped (they may survive a
//! crash between writing `raft.meta` and rewriting `raft.log`).
//!
//! Truncation cuts the file at the first removed entry. Purging (after a snapshot)
//! rewrites the file with the entries that remain, through a temporary file and a rename.
//!
//! All file I/O is synchronous under a `std::sync::Mutex` that is never held across an
//! `.await`: metadata writes are small and rare, and an fsync must finish before the
//! answer anyway.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::ops::RangeBounds;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use openraft::storage::{LogFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::{Entry, LogId, OptionalSend, StorageError, StorageIOError, Vote};
use serde::{Deserialize, Serialize};

use super::TypeConfig;

/// Frames larger than this are treated as corruption (a metadata batch is far smaller).
const MAX_FRAME_BYTES: usize = 64 << 20;

type NodeId = u64;

#[derive(Debug, Default, Serialize, Deserialize)]
struct Meta {
    vote: Option<Vote<NodeId>>,
    last_purged: Option<LogId<NodeId>>,
    committed: Option<LogId<NodeId>>,
}

struct Inner {
    dir: PathBuf,
    file: File,
    /// Entries by index, with the file position of their frame.
    entries: BTreeMap<u64, (Entry<TypeConfig>, u64)>,
    end: u64,
    meta: Meta,
}

/// The Raft log and vote of one quorum node. Clones share the same files (openraft
/// reads through a clone while it appends through the original).
#[derive(Clone)]
pub struct LogStore {
    inner: Arc<Mutex<Inner>>,
}

fn io_err(e: impl std::error::Error + 'static) -> io::Error {
    io::Error::other(e.to_string())
}

/// Writes `[len][crc][payload]` to `w`.
pub(crate) fn write_frame(w: &mut impl Write, payload: &[u8]) -> io::Result<u64> {
    let len = u32::try_from(payload.len()).map_err(|_| io::Error::other("frame too large"))?;
    w.write_all(&len.to_be_bytes())?;
    w.write_all(&crc32c::crc32c(payload).to_be_bytes())?;
    w.write_all(payload)?;
    Ok(8 + u64::from(len))
}

/// Reads one frame from `buf` at `pos`; `None` when what is there is not a whole,
/// intact frame.
pub(crate) fn read_frame(buf: &[u8], pos: usize) -> Option<&[u8]> {
    let header = buf.get(pos..pos + 8)?;
    let len = u32::from_be_bytes([header[0], header[1], header[2], header[3]]) as usize;
    let crc = u32::from_be_bytes([header[4], header[5], header[6], header[7]]);
    if len > MAX_FRAME_BYTES {
        return None;
    }
    let payload = buf.get(pos + 8..pos + 8 + len)?;
    (crc32c::crc32c(payload) == crc).then_some(payload)
}

/// Replaces `path` with `payload` (framed) atomically and durably.
pub(crate) fn write_atomic(dir: &Path, name: &str, payload: &[u8]) -> io::Result<()> {
    let tmp = dir.join(format!("{name}.tmp"));
    let mut f = File::create(&tmp)?;
    write_frame(&mut f, payload)?;
    f.sync_all()?;
    fs::rename(&tmp, dir.join(name))?;
    File::open(dir)?.sync_all()
}

/// Reads a file written by [`write_atomic`]; `None` if it does not exist.
pub(crate) fn read_atomic(path: &Path) -> io::Result<Option<Vec<u8>>> {
    let buf = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    match read_frame(&buf, 0) {
        Some(p) => Ok(Some(p.to_vec())),
        None => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} is corrupt", path.display()),
        )),
    }
}

impl LogStore {
    /// Opens (or creates) the log in `dir`, recovering from a torn tail.
    pub fn open(dir: &Path) -> io::Result<LogStore> {
        fs::create_dir_all(dir)?;
        let meta: Meta = match read_atomic(&dir.join("raft.meta"))? {
            Some(bytes) => postcard::from_bytes(&bytes).map_err(io_err)?,
            None => Meta::default(),
        };
        let path = dir.join("raft.log");
        let mut file = OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .open(&path)?;
        let mut buf = Vec::new();
        file.seek(SeekFrom::Start(0))?;
        file.read_to_end(&mut buf)?;
        let mut entries = BTreeMap::new();
        let mut pos = 0usize;
        while let Some(payload) = read_frame(&buf, pos) {
            let Ok(entry) = postcard::from_bytes::<Entry<TypeConfig>>(payload) else {
                break;
            };
            let purged = meta
                .last_purged
                .is_some_and(|p| entry.log_id.index <= p.index);
            if !purged {
                entries.insert(entry.log_id.index, (entry, pos as u64));
            }
            pos += 8 + payload.len();
        }
        if pos < buf.len() {
            tracing::warn!(
                path = %path.display(),
                kept = pos,
                dropped = buf.len() - pos,
                "cutting a torn tail off the raft log"
            );
            file.set_len(pos as u64)?;
            file.sync_all()?;
        }
        Ok(LogStore {
            inner: Arc::new(Mutex::new(Inner {
                dir: dir.to_path_buf(),
                file,
                entries,
                end: pos as u64,
                meta,
            })),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A poisoned lock means a panic while writing; the files are still the truth,
        // and every write is all-or-nothing at the frame level.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Inner {
    fn save_meta(&self) -> io::Result<()> {
        let bytes = postcard::to_allocvec(&self.meta).map_err(io_err)?;
        write_atomic(&self.dir, "raft.meta", &bytes)
    }

    fn rewrite(&mut self) -> io::Result<()> {
        let tmp = self.dir.join("raft.log.tmp");
        let mut f = File::create(&tmp)?;
        let mut pos = 0u64;
        for (entry, at) in self.entries.values_mut() {
            let payload = postcard::to_allocvec(entry).map_err(io_err)?;
            *at = pos;
            pos += write_frame(&mut f, &payload)?;
        }
        f.sync_all()?;
        drop(f);
        fs::rename(&tmp, self.dir.join("raft.log"))?;
        File::open(&self.dir)?.sync_all()?;
        self.file = OpenOptions::new()
            .read(true)
            .append(true)
            .open(self.dir.join("raft.log"))?;
        self.end = pos;
        Ok(())
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError<NodeId>> {
        let inner = self.lock();
        Ok(inner
            .entries
            .range(range)
            .map(|(_, (e, _))| e.clone())
            .collect())
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError<NodeId>> {
        let inner = self.lock();
        let last_purged_log_id = inner.meta.last_purged;
        let last_log_id = inner
            .entries
            .values()
            .next_back()
            .map(|(e, _)| e.log_id)
            .or(last_purged_log_id);
        Ok(LogState {
            last_purged_log_id,
            last_log_id,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError<NodeId>> {
        let mut inner = self.lock();
        inner.meta.vote = Some(*vote);
        inner
            .save_meta()
            .map_err(|e| StorageIOError::write_vote(&e).into())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError<NodeId>> {
        Ok(self.lock().meta.vote)
    }

    async fn save_committed(
        &mut self,
        committed: Option<LogId<NodeId>>,
    ) -> Result<(), StorageError<NodeId>> {
        let mut inner = self.lock();
        inner.meta.committed = committed;
        inner
            .save_meta()
            .map_err(|e| StorageIOError::write(&e).into())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId<NodeId>>, StorageError<NodeId>> {
        Ok(self.lock().meta.committed)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError<NodeId>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut inner = self.lock();
        let result = (|| -> io::Result<()> {
            let mut buf = Vec::new();
            let mut pos = inner.end;
            let mut added = Vec::new();
            for entry in entries {
                let payload = postcard::to_allocvec(&entry).map_err(io_err)?;
                let at = pos;
                pos += write_frame(&mut buf, &payload)?;
                added.push((entry, at));
            }
            inner.file.write_all(&buf)?;
            inner.file.sync_data()?;
            inner.end = pos;
            for (entry, at) in added {
                inner.entries.insert(entry.log_id.index, (entry, at));
            }
            Ok(())
        })();
        drop(inner);
        match result {
            Ok(()) => {
                callback.log_io_completed(Ok(()));
                Ok(())
            }
            Err(e) => {
                // Never retry an fsync (STYLE.md): report it; openraft stops this node.
                tracing::error!(error = %e, "raft log append failed");
                let err = StorageIOError::write_logs(&e);
                callback.log_io_completed(Err(e));
                Err(err.into())
            }
        }
    }

    async fn truncate(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
        let mut inner = self.lock();
        let cut = inner
            .entries
            .range(log_id.index..)
            .next()
            .map(|(_, (_, at))| *at);
        if let Some(at) = cut {
            let result = inner.file.set_len(at).and_then(|()| inner.file.sync_all());
            result.map_err(|e| StorageIOError::write_logs(&e))?;
            inner.end = at;
            let _ = inner.entries.split_off(&log_id.index);
        }
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId<NodeId>) -> Result<(), StorageError<NodeId>> {
        let mut inner = self.lock();
        inner.meta.last_purged = Some(log_id);
        inner
            .save_meta()
            .map_err(|e| StorageIOError::write_logs(&e))?;
        let keep = inner.entries.split_off(&(log_id.index + 1));
        inner.entries = keep;
        inner
            .rewrite()
            .map_err(|e| StorageIOError::write_logs(&e))?;
        Ok(())
    }
}
