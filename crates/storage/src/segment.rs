//! `LogSegment`: one `.log` file of whole record batches with its `.index` and
//! `.timeindex`, and the recovery of a segment after a crash.
//!
//! # Design note: appending, rolling and recovering a segment
//!
//! A segment is named by its base offset, zero-padded to 20 digits
//! (`00000000000000000000.log`). Its `.log` holds batches exactly as they were
//! produced, with `baseOffset` and `partitionLeaderEpoch` rewritten by the log.
//!
//! Append:
//! 1. The log has validated every batch and assigned its offsets; the segment writes the
//!    whole record set with one positional vectored write at its end (`pwritev`: on the
//!    leader each batch is its rewritten 61-byte header and the rest as the client sent
//!    it; a short write is continued, and a torn one is what recovery below handles).
//! 2. For each batch, in order: if the batch's max timestamp is the greatest so far, it
//!    becomes `max_timestamp_so_far` (with the batch's last offset); if more than
//!    `index.interval.bytes` were written since the last index entry, the offset index
//!    gets `(last offset of this batch, its position)` and the time index gets
//!    `(max_timestamp_so_far, its offset)`.
//! 3. Nothing is fsynced here; the log decides (`flush.messages`, `flush.ms`, roll).
//!
//! Roll: the log rolls before an append that would make the segment exceed
//! `segment.bytes`, when the first batch is older than `segment.ms`, when an index is
//! full, or when an offset would not fit the 32-bit relative offset. The old segment
//! gets a final time-index entry and is fsynced (log and both indexes) before the new
//! one takes appends, so every segment but the last is durable and complete.
//!
//! Recovery of a segment (the last one after an unclean shutdown, or any segment whose
//! index files are missing or fail their sanity check):
//! 1. Both indexes are emptied.
//! 2. Batches are read one by one from position 0. A batch is accepted when its length
//!    is at least a header and fits in the file, its magic is 2, its CRC32C matches,
//!    its record count is at most its offset delta + 1 (fewer when the cleaner removed
//!    records from it, see [`crate::cleaner`]), and its base offset is not below
//!    the end of the previous batch (nor below the segment's base offset).
//! 3. Each accepted batch is indexed exactly as append does (step 2 above).
//! 4. At the first batch that is not accepted, the file is truncated there.
//!
//! Why this is correct: the log is append-only and a write that was acknowledged
//! without fsync may be lost, or half-written, only at the tail: everything before the
//! tail was written earlier. A torn or zero-filled tail fails the length, magic or CRC
//! check (the CRC covers every byte but the offset and epoch, which are checked by
//! monotonicity), so the accepted prefix is exactly the batches that fully reached the
//! disk, in order, and the truncation removes only bytes no reader could have used.
//! Indexes are derived data: rebuilding them from the accepted prefix with the append
//! code gives the same entries append would have written, so lookups after recovery
//! land where they did before. When recovery of a segment that is not the last one
//! truncates anything, the log deletes all later segments, since offsets must stay
//! dense and a hole cannot be filled.
//!
//! A segment opened after a clean shutdown is not rescanned: its indexes are checked
//! (whole entries, increasing, positions inside the file, the last entry naming the
//! batch at its position) and only the tail after the last index entry is read, header
//! by header, to find the end offset and the max timestamp.

use std::collections::VecDeque;
use std::fs::{self, File, OpenOptions};
use std::io::IoSlice;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use rill_protocol::records::batch::{HEADER_LEN, LOG_OVERHEAD};
use rill_protocol::records::RecordBatch;

use crate::checkpoint::Durability;
use crate::header::BatchHeader;
use crate::index::{OffsetIndex, TimeIndex};
use crate::records::validate_stored;
use crate::StorageError;

pub const LOG_FILE_SUFFIX: &str = "log";
pub const INDEX_FILE_SUFFIX: &str = "index";
pub const TIME_INDEX_FILE_SUFFIX: &str = "timeindex";

/// `<dir>/<base offset, 20 digits>.<suffix>`.
pub fn segment_file(dir: &Path, base_offset: i64, suffix: &str) -> PathBuf {
    dir.join(format!("{base_offset:020}.{suffix}"))
}

/// A byte range of a segment file: what a sendfile path would transmit.
#[derive(Debug, Clone)]
pub struct FileRange {
    pub file: Arc<File>,
    pub path: PathBuf,
    pub position: u64,
    pub len: u64,
}

/// Where a fetch started (Kafka's `LogOffsetMetadata`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogOffsetMetadata {
    pub message_offset: i64,
    pub segment_base_offset: i64,
    pub relative_position_in_segment: u64,
}

/// The result of a read: whole batches, as bytes and as the file range they came from.
#[derive(Debug, Clone)]
pub struct FetchDataInfo {
    pub fetch_offset_metadata: LogOffsetMetadata,
    /// Whole batches; empty when nothing could be returned, and for a zero-copy read
    /// (`UnifiedLog::read_file_range`) unless the leader's tail copy held them.
    pub records: Bytes,
    /// The same bytes as a range of the segment file (`None` when empty).
    pub file_range: Option<FileRange>,
}

impl FetchDataInfo {
    pub(crate) fn empty(message_offset: i64, segment_base_offset: i64, position: u64) -> Self {
        Self {
            fetch_offset_metadata: LogOffsetMetadata {
                message_offset,
                segment_base_offset,
                relative_position_in_segment: position,
            },
            records: Bytes::new(),
            file_range: None,
        }
    }
}

/// Per-batch facts the segment needs to index an append.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BatchSummary {
    pub last_offset: i64,
    pub max_timestamp: i64,
    pub size: u64,
}

/// What a recovery found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RecoveryOutcome {
    pub truncated_bytes: u64,
    pub valid_batches: u64,
}

#[derive(Debug)]
pub struct LogSegment {
    base_offset: i64,
    log_path: PathBuf,
    log: Arc<File>,
    size: u64,
    offset_index: OffsetIndex,
    time_index: TimeIndex,
    index_interval_bytes: u64,
    bytes_since_last_index_entry: u64,
    next_offset: i64,
    max_timestamp_so_far: i64,
    offset_of_max_timestamp_so_far: i64,
    /// Max timestamp of the first batch: what `segment.ms` is measured from, as Kafka's
    /// `rollingBasedTimestamp`.
    rolling_based_timestamp: Option<i64>,
    created_ms: i64,
    /// Whether both index files existed when the segment was opened.
    indexes_existed: bool,
    /// (last offset, position) of the batches appended since the segment was opened,
    /// loaded or recovered, the newest [`RECENT_BATCHES`] of them: the batches a
    /// follower or a tailing consumer reads next, found without reading headers (see
    /// [`Self::translate_offset`]).
    recent_batches: VecDeque<(i64, u64)>,
    /// A copy of the file's newest bytes, from `tail_start` to its end, kept while the
    /// log's followers have yet to read them (see [`Self::set_tail_copy_limit`]).
    tail: TailCopy,
    /// Where the bytes whose writeback the appends have not started yet begin (see
    /// [`start_writeback`]).
    writeback_from: u64,
}

/// Bytes appended to a segment between two starts of their writeback.
const WRITEBACK_CHUNK: u64 = 1 << 20;

/// The newest bytes of the active segment, held in memory between the leader's append and
/// its followers' next fetches: a follower that keeps up is answered from here with one
/// send, instead of reading headers and sending the file range (`pread`, `sendmsg` with
/// `MSG_MORE`, `sendfile`). Invariant: when `bytes` is not empty it is the file's bytes
/// `[start, size)` and `start` is where a batch begins.
#[derive(Debug, Default)]
struct TailCopy {
    start: u64,
    bytes: BytesMut,
    /// Most bytes held; 0 keeps none (a follower's log, or a leader without followers).
    limit: usize,
}

impl TailCopy {
    fn clear(&mut self, end: u64) {
        // The allocation goes too: a partition whose followers keep up holds nothing
        // between fetches, so thousands of partitions cost no memory at rest.
        self.bytes = BytesMut::new();
        self.start = end;
    }

    /// Whether the copy holds the byte at `pos` (and so every byte after it up to the
    /// file's end).
    fn holds(&self, pos: u64) -> bool {
        pos >= self.start && pos - self.start < self.bytes.len() as u64
    }

    /// The copy of `[pos, pos + len)` when the tail holds all of it.
    fn get(&self, pos: u64, len: u64) -> Option<Bytes> {
        let from = usize::try_from(pos.checked_sub(self.start)?).ok()?;
        let to = from.checked_add(usize::try_from(len).ok()?)?;
        self.bytes.get(from..to).map(Bytes::copy_from_slice)
    }
}

/// Batches [`LogSegment::recent_batches`] remembers: more than the batches appended
/// between two fetches of a follower that keeps up.
const RECENT_BATCHES: usize = 64;

impl LogSegment {
    /// Opens (creating if absent) the segment at `base_offset`. The caller must then call
    /// [`Self::load`] or [`Self::recover`] before using it.
    pub(crate) fn open(
        dir: &Path,
        base_offset: i64,
        index_interval_bytes: u64,
        max_index_bytes: u64,
        now_ms: i64,
    ) -> Result<Self, StorageError> {
        Self::open_with_tail(
            dir,
            base_offset,
            "",
            index_interval_bytes,
            max_index_bytes,
            now_ms,
        )
    }

    /// Creates an empty segment whose three files carry `tail` after their usual names
    /// (`.cleaned` for the cleaner's output), replacing any files left there.
    pub(crate) fn create_with_tail(
        dir: &Path,
        base_offset: i64,
        tail: &str,
        index_interval_bytes: u64,
        max_index_bytes: u64,
        now_ms: i64,
    ) -> Result<Self, StorageError> {
        for suffix in [LOG_FILE_SUFFIX, INDEX_FILE_SUFFIX, TIME_INDEX_FILE_SUFFIX] {
            let p = segment_file(dir, base_offset, &format!("{suffix}{tail}"));
            match fs::remove_file(&p) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(StorageError::io(&p, e)),
            }
        }
        Self::open_with_tail(
            dir,
            base_offset,
            tail,
            index_interval_bytes,
            max_index_bytes,
            now_ms,
        )
    }

    fn open_with_tail(
        dir: &Path,
        base_offset: i64,
        tail: &str,
        index_interval_bytes: u64,
        max_index_bytes: u64,
        now_ms: i64,
    ) -> Result<Self, StorageError> {
        let log_path = segment_file(dir, base_offset, &format!("{LOG_FILE_SUFFIX}{tail}"));
        let index_path = segment_file(dir, base_offset, &format!("{INDEX_FILE_SUFFIX}{tail}"));
        let time_path = segment_file(dir, base_offset, &format!("{TIME_INDEX_FILE_SUFFIX}{tail}"));
        let indexes_existed = index_path.exists() && time_path.exists();
        let log = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&log_path)
            .map_err(|e| StorageError::io(&log_path, e))?;
        let size = log
            .metadata()
            .map_err(|e| StorageError::io(&log_path, e))?
            .len();
        Ok(Self {
            base_offset,
            log: Arc::new(log),
            size,
            offset_index: OffsetIndex::open(&index_path, base_offset, max_index_bytes)?,
            time_index: TimeIndex::open(&time_path, base_offset, max_index_bytes)?,
            log_path,
            index_interval_bytes,
            bytes_since_last_index_entry: 0,
            next_offset: base_offset,
            max_timestamp_so_far: -1,
            offset_of_max_timestamp_so_far: -1,
            rolling_based_timestamp: None,
            created_ms: now_ms,
            indexes_existed,
            recent_batches: VecDeque::with_capacity(RECENT_BATCHES),
            tail: TailCopy {
                start: size,
                ..TailCopy::default()
            },
            writeback_from: size,
        })
    }

    /// Creates an empty segment at `base_offset`, replacing any files left there.
    pub(crate) fn create(
        dir: &Path,
        base_offset: i64,
        index_interval_bytes: u64,
        max_index_bytes: u64,
        now_ms: i64,
    ) -> Result<Self, StorageError> {
        for suffix in [LOG_FILE_SUFFIX, INDEX_FILE_SUFFIX, TIME_INDEX_FILE_SUFFIX] {
            let p = segment_file(dir, base_offset, suffix);
            match fs::remove_file(&p) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(StorageError::io(&p, e)),
            }
        }
        Self::open(
            dir,
            base_offset,
            index_interval_bytes,
            max_index_bytes,
            now_ms,
        )
    }

    pub fn base_offset(&self) -> i64 {
        self.base_offset
    }
    /// The offset after the last batch; the base offset when the segment is empty.
    pub fn next_offset(&self) -> i64 {
        self.next_offset
    }
    pub fn size(&self) -> u64 {
        self.size
    }
    pub fn log_path(&self) -> &Path {
        &self.log_path
    }
    pub fn max_timestamp_so_far(&self) -> i64 {
        self.max_timestamp_so_far
    }
    /// Last offset of the first batch that reached `max_timestamp_so_far`.
    pub fn offset_of_max_timestamp_so_far(&self) -> i64 {
        self.offset_of_max_timestamp_so_far
    }
    /// Max timestamp of the first batch (`None` when empty): the segment's age for
    /// `segment.ms` and `max.compaction.lag.ms`.
    pub fn first_batch_timestamp(&self) -> Option<i64> {
        self.rolling_based_timestamp
    }
    /// The open `.log` file, which stays readable after the segment is deleted or
    /// replaced; the cleaner reads a non-active segment through it without the log lock.
    pub(crate) fn log_file(&self) -> Arc<File> {
        Arc::clone(&self.log)
    }
    /// When the segment was created or opened (the fallback age of a segment without
    /// timestamps).
    pub(crate) fn created_ms(&self) -> i64 {
        self.created_ms
    }
    pub fn offset_index(&self) -> &OffsetIndex {
        &self.offset_index
    }
    pub fn time_index(&self) -> &TimeIndex {
        &self.time_index
    }

    /// Opens a clean segment: checks the indexes and reads the tail after the last index
    /// entry. Falls back to [`Self::recover`] when anything does not match.
    pub(crate) fn load(&mut self) -> Result<Option<RecoveryOutcome>, StorageError> {
        let sane = (self.indexes_existed || self.size == 0)
            && self.offset_index.sanity_check(self.size.max(1)).is_ok()
            && self.load_tail()?.is_ok()
            && self.time_index.sanity_check(self.next_offset).is_ok();
        if sane {
            Ok(None)
        } else {
            tracing::warn!(segment = %self.log_path.display(), "index missing or inconsistent, rebuilding");
            let outcome = self.recover()?;
            // Index entries reach their files only on a flush (see `index`), and a segment
            // that is not the active one is never flushed again: write the rebuilt ones now.
            self.offset_index.flush(Durability::Durable)?;
            self.time_index.flush(Durability::Durable)?;
            Ok(Some(outcome))
        }
    }

    /// Sets the in-memory tail state (end offset, max timestamp, bytes since the last
    /// index entry) by reading headers from the last offset-index entry to the end.
    /// `Ok(Err(reason))` when the file and the indexes disagree.
    fn load_tail(&mut self) -> Result<Result<(), String>, StorageError> {
        self.recent_batches.clear();
        self.tail.clear(self.size);
        self.next_offset = self.base_offset;
        self.rolling_based_timestamp = None;
        (
            self.max_timestamp_so_far,
            self.offset_of_max_timestamp_so_far,
        ) = self.time_index.last_entry().unwrap_or((-1, -1));
        if self.size > 0 {
            match self.read_header(0)? {
                Some(h) => self.rolling_based_timestamp = Some(h.max_timestamp),
                None => return Ok(Err("first batch header is torn".into())),
            }
        }
        let (entry_offset, start) = match self.offset_index.last_entry() {
            Some((o, p)) => (Some(o), u64::from(p)),
            None => (None, 0),
        };
        let mut pos = start;
        let mut prev_next = self.base_offset;
        while pos < self.size {
            let Some(h) = self.read_header(pos)? else {
                return Ok(Err(format!("torn header at {pos}")));
            };
            if h.batch_length < (HEADER_LEN - LOG_OVERHEAD) as i32
                || pos + h.size() > self.size
                || h.last_offset_delta < 0
                || h.base_offset < prev_next
            {
                return Ok(Err(format!("bad batch at {pos}")));
            }
            if pos == start && entry_offset.is_some_and(|o| o != h.last_offset()) {
                return Ok(Err("last index entry does not name its batch".into()));
            }
            if h.max_timestamp > self.max_timestamp_so_far {
                self.max_timestamp_so_far = h.max_timestamp;
                self.offset_of_max_timestamp_so_far = h.last_offset();
            }
            prev_next = h.next_offset();
            pos += h.size();
        }
        self.next_offset = prev_next;
        if entry_offset.is_some() && self.next_offset == self.base_offset {
            return Ok(Err("index entries in an empty segment".into()));
        }
        self.bytes_since_last_index_entry = self.size - start;
        Ok(Ok(()))
    }

    /// Rebuilds the indexes from the log, validating every batch and truncating the file
    /// at the first torn or corrupt one. See the design note.
    pub(crate) fn recover(&mut self) -> Result<RecoveryOutcome, StorageError> {
        self.offset_index.reset()?;
        self.time_index.reset()?;
        self.recent_batches.clear();
        self.tail.clear(self.size);
        self.next_offset = self.base_offset;
        self.max_timestamp_so_far = -1;
        self.offset_of_max_timestamp_so_far = -1;
        self.rolling_based_timestamp = None;
        self.bytes_since_last_index_entry = 0;
        let mut pos = 0u64;
        let mut valid_batches = 0u64;
        while pos < self.size {
            let Some(h) = self.read_header(pos)? else {
                break;
            };
            if h.batch_length < (HEADER_LEN - LOG_OVERHEAD) as i32
                || pos + h.size() > self.size
                || h.base_offset < self.next_offset
                || h.last_offset() - self.base_offset > i64::from(u32::MAX)
            {
                break;
            }
            // The length was checked against the file size, so this allocation is
            // bounded by what is on disk.
            let mut buf = vec![0u8; h.size() as usize];
            self.log
                .read_exact_at(&mut buf, pos)
                .map_err(|e| StorageError::io(&self.log_path, e))?;
            // Stored batches may be compacted (fewer records than their offset span).
            let valid = RecordBatch::new(Bytes::from(buf))
                .and_then(|b| validate_stored(&b))
                .is_ok();
            if !valid {
                break;
            }
            self.index_batch(
                BatchSummary {
                    last_offset: h.last_offset(),
                    max_timestamp: h.max_timestamp,
                    size: h.size(),
                },
                pos,
            )?;
            valid_batches += 1;
            pos += h.size();
        }
        let truncated_bytes = self.size - pos;
        if truncated_bytes > 0 {
            tracing::warn!(
                segment = %self.log_path.display(),
                position = pos,
                truncated_bytes,
                "truncating torn or corrupt tail"
            );
            self.log
                .set_len(pos)
                .map_err(|e| StorageError::io(&self.log_path, e))?;
            self.size = pos;
        }
        Ok(RecoveryOutcome {
            truncated_bytes,
            valid_batches,
        })
    }

    /// Reads the header of the batch at `pos`; `None` when fewer than a header's bytes
    /// remain in the file.
    pub(crate) fn read_header(&self, pos: u64) -> Result<Option<BatchHeader>, StorageError> {
        if pos + HEADER_LEN as u64 > self.size {
            return Ok(None);
        }
        let mut b = [0u8; HEADER_LEN];
        self.log
            .read_exact_at(&mut b, pos)
            .map_err(|e| StorageError::io(&self.log_path, e))?;
        Ok(Some(BatchHeader::parse(&b)))
    }

    /// Reads the whole batch at `pos` (whose header has been read).
    pub(crate) fn read_batch(
        &self,
        pos: u64,
        h: &BatchHeader,
    ) -> Result<Option<RecordBatch>, StorageError> {
        if pos + h.size() > self.size {
            return Ok(None);
        }
        let mut buf = vec![0u8; h.size() as usize];
        self.log
            .read_exact_at(&mut buf, pos)
            .map_err(|e| StorageError::io(&self.log_path, e))?;
        Ok(RecordBatch::new(Bytes::from(buf)).ok())
    }

    /// Calls `f(position, header)` for each batch from `pos` to the end of the segment.
    pub(crate) fn for_each_header(
        &self,
        mut pos: u64,
        mut f: impl FnMut(u64, &BatchHeader) -> bool,
    ) -> Result<(), StorageError> {
        while let Some(h) = self.read_header(pos)? {
            if h.size() < HEADER_LEN as u64 || !f(pos, &h) {
                break;
            }
            pos += h.size();
        }
        Ok(())
    }

    fn index_batch(&mut self, b: BatchSummary, position: u64) -> Result<(), StorageError> {
        if b.max_timestamp > self.max_timestamp_so_far {
            self.max_timestamp_so_far = b.max_timestamp;
            self.offset_of_max_timestamp_so_far = b.last_offset;
        }
        if self.bytes_since_last_index_entry > self.index_interval_bytes {
            // Positions fit in u32: segment.bytes is capped at i32::MAX by LogConfig.
            let position = u32::try_from(position).unwrap_or(u32::MAX);
            self.offset_index.append(b.last_offset, position)?;
            self.time_index.maybe_append(
                self.max_timestamp_so_far,
                self.offset_of_max_timestamp_so_far,
                false,
            )?;
            self.bytes_since_last_index_entry = 0;
        }
        self.bytes_since_last_index_entry += b.size;
        if self.recent_batches.len() == RECENT_BATCHES {
            self.recent_batches.pop_front();
        }
        self.recent_batches.push_back((b.last_offset, position));
        if self.rolling_based_timestamp.is_none() {
            self.rolling_based_timestamp = Some(b.max_timestamp);
        }
        self.next_offset = b.last_offset + 1;
        Ok(())
    }

    /// Appends a validated record set whose batches are summarised by `batches`.
    pub(crate) fn append(
        &mut self,
        records: &[u8],
        batches: &[BatchSummary],
    ) -> Result<(), StorageError> {
        self.append_vectored(&[records], batches)
    }

    /// Appends the batches laid out back to back in `parts` (their concatenation, as
    /// one positional vectored write): the leader passes each batch as its rewritten
    /// header and the untouched rest of the client's bytes, so that nothing is copied in
    /// user space before the kernel copies it into the page cache.
    pub(crate) fn append_vectored(
        &mut self,
        parts: &[&[u8]],
        batches: &[BatchSummary],
    ) -> Result<(), StorageError> {
        let len: u64 = parts.iter().map(|p| p.len() as u64).sum();
        debug_assert_eq!(len, batches.iter().map(|b| b.size).sum::<u64>());
        write_all_vectored_at(&self.log, parts, self.size)
            .map_err(|e| StorageError::io(&self.log_path, e))?;
        let mut pos = self.size;
        self.size += len;
        self.copy_to_tail(parts, len, pos);
        // A truncation may have cut below it.
        self.writeback_from = self.writeback_from.min(pos);
        if self.size - self.writeback_from >= WRITEBACK_CHUNK {
            start_writeback(
                &self.log,
                self.writeback_from,
                self.size - self.writeback_from,
            );
            self.writeback_from = self.size;
        }
        for b in batches {
            self.index_batch(*b, pos)?;
            pos += b.size;
        }
        Ok(())
    }

    /// Keeps a copy of the batches just written at `pos` (`len` bytes in `parts`) when
    /// the tail copy is on and they fit in it; otherwise drops the copy, so that it stays
    /// the file's bytes up to its end.
    fn copy_to_tail(&mut self, parts: &[&[u8]], len: u64, pos: u64) {
        let limit = self.tail.limit as u64;
        if limit == 0 || len > limit {
            // An empty copy's start is never read (`holds` needs bytes).
            if !self.tail.bytes.is_empty() {
                self.tail.clear(self.size);
            }
            return;
        }
        if self.tail.bytes.len() as u64 + len > limit {
            // Followers this far behind read the file; the copy starts again here.
            self.tail.clear(pos);
        }
        if self.tail.bytes.is_empty() {
            self.tail.start = pos;
        }
        for part in parts {
            self.tail.bytes.extend_from_slice(part);
        }
    }

    /// How many of the newest bytes to keep a copy of for the followers (0: none). The
    /// copy starts with the next append.
    pub(crate) fn set_tail_copy_limit(&mut self, limit: usize) {
        self.tail.limit = limit;
        if limit == 0 || self.tail.bytes.len() > limit {
            self.tail.clear(self.size);
        }
    }

    /// Drops the copied batches that lie wholly below `offset` (the high watermark: every
    /// follower in the ISR has them).
    pub(crate) fn release_tail_below(&mut self, offset: i64) {
        if self.tail.bytes.is_empty() {
            return;
        }
        let i = self
            .recent_batches
            .partition_point(|(last, _)| *last < offset);
        if i == 0 {
            // Every remembered batch reaches `offset`; of the copied ones before them
            // (more than the segment remembers) it is not known which do: keep them.
            return;
        }
        let Some(&(_, pos)) = self.recent_batches.get(i) else {
            self.tail.clear(self.size);
            return;
        };
        if pos > self.tail.start {
            let drop = usize::try_from(pos - self.tail.start).unwrap_or(usize::MAX);
            if drop >= self.tail.bytes.len() {
                self.tail.clear(self.size);
            } else {
                let _ = self.tail.bytes.split_to(drop);
                self.tail.start = pos;
            }
        }
    }

    /// Bytes of the tail copy held now (for tests and metrics).
    pub(crate) fn tail_copy_len(&self) -> usize {
        self.tail.bytes.len()
    }

    /// Whether `segment.ms` has passed for this segment, Kafka's way: measured from the
    /// first batch's timestamp to the incoming batch's when both are known, otherwise
    /// from the segment's creation to now.
    pub(crate) fn time_waited_for_roll(&self, now_ms: i64, incoming_max_timestamp: i64) -> i64 {
        match self.rolling_based_timestamp {
            Some(t) if t >= 0 && incoming_max_timestamp >= 0 => incoming_max_timestamp - t,
            _ => now_ms - self.created_ms,
        }
    }

    pub(crate) fn indexes_full(&self) -> bool {
        self.offset_index.is_full() || self.time_index.is_full()
    }

    /// Position of the first batch whose last offset is `>= offset`, with its header.
    ///
    /// The recent batches answer without a scan when `offset` lies past the first of
    /// them: they are every batch from there to the end of the file, in order, so the
    /// answer is the first whose last offset reaches `offset` (one header read), or none
    /// when `offset` is past the last (no read: a follower's fetch at the log end).
    /// Otherwise the headers are read from the offset index's entry at or below
    /// `offset`, up to one index interval of them.
    pub(crate) fn translate_offset(
        &self,
        offset: i64,
    ) -> Result<Option<(u64, BatchHeader)>, StorageError> {
        let known = self
            .recent_batches
            .partition_point(|(last, _)| *last < offset);
        if known == self.recent_batches.len() && known > 0 {
            return Ok(None);
        }
        if known > 0 {
            if let Some(&(_, pos)) = self.recent_batches.get(known) {
                return Ok(self.read_header(pos)?.map(|h| (pos, h)));
            }
        }
        let (_, start) = self.offset_index.lookup(offset);
        let mut found = None;
        self.for_each_header(u64::from(start), |pos, h| {
            if h.last_offset() >= offset {
                found = Some((pos, *h));
                false
            } else {
                true
            }
        })?;
        Ok(found)
    }

    /// Whole batches from the one containing `start_offset`: see `UnifiedLog::read`.
    /// `None` when this segment has no batch at or after `start_offset`.
    pub(crate) fn read(
        &self,
        start_offset: i64,
        max_bytes: usize,
        max_offset: i64,
        min_one_message: bool,
    ) -> Result<Option<FetchDataInfo>, StorageError> {
        self.read_inner(start_offset, max_bytes, max_offset, min_one_message, true)
    }

    /// As [`Segment::read`] but leaves `records` empty: only `file_range` is filled, found by
    /// reading batch headers alone, for callers that send the range straight from the file.
    pub(crate) fn read_range(
        &self,
        start_offset: i64,
        max_bytes: usize,
        max_offset: i64,
        min_one_message: bool,
    ) -> Result<Option<FetchDataInfo>, StorageError> {
        self.read_inner(start_offset, max_bytes, max_offset, min_one_message, false)
    }

    /// [`Self::read_inner`] from the tail copy alone, without reading the file: the
    /// recent batches' positions give each batch's size (they lie back to back up to
    /// the file's end), and the copy gives their bytes. `None` when the copy does not
    /// hold the batch with `start_offset`: the caller reads the file. Only the copy may
    /// answer without a read. A file range named from memory alone would go unchecked,
    /// and a segment cut short behind the broker's back would then cost a closed
    /// connection at every fetch instead of a failed read, which takes the directory
    /// offline as Kafka does.
    fn read_recent(
        &self,
        start_offset: i64,
        max_bytes: usize,
        max_offset: i64,
        min_one_message: bool,
    ) -> Option<FetchDataInfo> {
        let recent = &self.recent_batches;
        let first = recent.partition_point(|(last, _)| *last < start_offset);
        // Before the first remembered batch the batch holding `start_offset` is unknown,
        // unless that batch is the segment's first; past the last there is nothing
        // (`translate_offset` answers that without reads).
        let from_segment_start = recent.front().is_some_and(|&(_, pos)| pos == 0);
        if (first == 0 && !from_segment_start) || first == recent.len() {
            return None;
        }
        let end_of = |i: usize| recent.get(i + 1).map_or(self.size, |&(_, p)| p);
        let &(first_last, start_pos) = recent.get(first)?;
        let first_size = end_of(first).checked_sub(start_pos)?;
        if !self.tail.holds(start_pos) {
            return None;
        }
        let mut info = FetchDataInfo::empty(start_offset, self.base_offset, start_pos);
        if first_last >= max_offset {
            return Some(info);
        }
        let mut want = max_bytes as u64;
        if min_one_message {
            want = want.max(first_size);
        }
        let want = want.min(self.size - start_pos);
        if want < first_size {
            return Some(info);
        }
        let mut len = first_size;
        for i in first + 1..recent.len() {
            let &(last, pos) = recent.get(i)?;
            let size = end_of(i).checked_sub(pos)?;
            if len + size > want || last >= max_offset {
                break;
            }
            len += size;
        }
        info.records = self.tail.get(start_pos, len)?;
        info.file_range = Some(FileRange {
            file: Arc::clone(&self.log),
            path: self.log_path.clone(),
            position: start_pos,
            len,
        });
        Some(info)
    }

    fn read_inner(
        &self,
        start_offset: i64,
        max_bytes: usize,
        max_offset: i64,
        min_one_message: bool,
        load: bool,
    ) -> Result<Option<FetchDataInfo>, StorageError> {
        if let Some(info) = self.read_recent(start_offset, max_bytes, max_offset, min_one_message) {
            return Ok(Some(info));
        }
        let Some((start_pos, first)) = self.translate_offset(start_offset)? else {
            return Ok(None);
        };
        let mut info = FetchDataInfo::empty(start_offset, self.base_offset, start_pos);
        if first.last_offset() >= max_offset {
            return Ok(Some(info));
        }
        let mut want = max_bytes as u64;
        if min_one_message {
            want = want.max(first.size());
        }
        let want = want.min(self.size - start_pos);
        if want < first.size() {
            return Ok(Some(info));
        }
        if !load {
            // Small reads of batch headers only; the batch bodies are never read here.
            // The offset index names batch starts further on: every batch before such a
            // start is whole, and when the entry's offset is at most `max_offset` so is
            // every offset before it, so the headers up to it need not be read one by
            // one (with 64 KiB batches that is about 15 reads fewer per 1 MiB fetched).
            // The first batch's header is at hand (checked above: whole, below
            // `max_offset`, within `want`).
            if first.size() < HEADER_LEN as u64 {
                return Ok(Some(info));
            }
            let mut end = first.size();
            if let Some((_, position)) =
                self.offset_index
                    .last_entry_within(start_pos, start_pos + want, max_offset)
            {
                end = end.max(u64::from(position) - start_pos);
            }
            while end + HEADER_LEN as u64 <= want {
                let Some(h) = self.read_header(start_pos + end)? else {
                    break;
                };
                let size = h.size();
                if size < HEADER_LEN as u64 || end + size > want || h.last_offset() >= max_offset {
                    break;
                }
                end += size;
            }
            if end > 0 {
                info.file_range = Some(FileRange {
                    file: Arc::clone(&self.log),
                    path: self.log_path.clone(),
                    position: start_pos,
                    len: end,
                });
            }
            return Ok(Some(info));
        }
        // One read of up to `want` bytes, then trimmed to whole batches below max_offset.
        // Offsets must rise from batch to batch: the CRC does not cover a batch's base
        // offset, so a flipped bit there in a segment that is not recovered at open (only
        // the active one is) would otherwise hand a reader offsets that go backwards. The
        // read stops before such a batch; the next read, from the end of this one, skips
        // it (its offsets are below that end).
        let mut buf = BytesMut::zeroed(want as usize);
        self.log
            .read_exact_at(&mut buf, start_pos)
            .map_err(|e| StorageError::io(&self.log_path, e))?;
        let mut end = 0usize;
        let mut prev_next = i64::MIN;
        while end + HEADER_LEN <= buf.len() {
            let mut hb = [0u8; HEADER_LEN];
            hb.copy_from_slice(&buf[end..end + HEADER_LEN]);
            let h = BatchHeader::parse(&hb);
            let size = h.size() as usize;
            if size < HEADER_LEN
                || end + size > buf.len()
                || h.last_offset() >= max_offset
                || h.last_offset_delta < 0
                || h.base_offset < prev_next
            {
                break;
            }
            prev_next = h.next_offset();
            end += size;
        }
        buf.truncate(end);
        info.records = buf.freeze();
        if end > 0 {
            info.file_range = Some(FileRange {
                file: Arc::clone(&self.log),
                path: self.log_path.clone(),
                position: start_pos,
                len: end as u64,
            });
        }
        Ok(Some(info))
    }

    /// Removes every batch from the one containing `offset` on; returns the bytes removed.
    pub(crate) fn truncate_to(&mut self, offset: i64, now_ms: i64) -> Result<u64, StorageError> {
        let Some((pos, _)) = self.translate_offset(offset)? else {
            return Ok(0);
        };
        self.offset_index.truncate_to(offset)?;
        self.time_index.truncate_to(offset)?;
        self.log
            .set_len(pos)
            .map_err(|e| StorageError::io(&self.log_path, e))?;
        let removed = self.size - pos;
        self.size = pos;
        if self.size == 0 {
            self.created_ms = now_ms;
        }
        if let Err(reason) = self.load_tail()? {
            // The indexes were just truncated consistently; a mismatch means the file
            // changed under us, so rebuild rather than trust either.
            tracing::warn!(segment = %self.log_path.display(), %reason, "rebuilding after truncation");
            self.recover()?;
        }
        Ok(removed)
    }

    /// Called when the segment stops being the active one: the final time-index entry
    /// (so that the index knows the segment's max timestamp), then fsync.
    pub(crate) fn on_become_inactive(&mut self) -> Result<(), StorageError> {
        self.time_index.maybe_append(
            self.max_timestamp_so_far,
            self.offset_of_max_timestamp_so_far,
            true,
        )?;
        self.flush()
    }

    /// Fsyncs the log and writes and fsyncs the index entries not yet in their files.
    pub(crate) fn flush(&self) -> Result<(), StorageError> {
        self.log
            .sync_data()
            .map_err(|e| StorageError::io(&self.log_path, e))?;
        self.offset_index.flush(Durability::Durable)?;
        self.time_index.flush(Durability::Durable)
    }

    /// Writes the index entries not yet in their files, without any fsync (a clean
    /// close, which one `syncfs` of the file system makes durable afterwards).
    pub(crate) fn write_indexes(&self) -> Result<(), StorageError> {
        self.offset_index.flush(Durability::Deferred)?;
        self.time_index.flush(Durability::Deferred)
    }

    /// Deletes the segment's files (its `.txnindex` too, when it has one).
    pub(crate) fn delete(self) -> Result<(), StorageError> {
        let txn_index = self
            .log_path
            .with_extension(crate::transaction_index::TXN_INDEX_FILE_SUFFIX);
        for p in [
            &self.log_path,
            self.offset_index.path(),
            self.time_index.path(),
            &txn_index,
        ] {
            match fs::remove_file(p) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(StorageError::io(p, e)),
            }
        }
        Ok(())
    }
}

/// Starts the writeback of `[pos, pos + len)` of `file` from the page cache to the disk
/// without waiting for it (`sync_file_range` with `SYNC_FILE_RANGE_WRITE`) and without
/// any promise of durability: that stays with the flush policy's fsyncs.
///
/// Why: left to itself the kernel writes dirty pages back only once they are 30 s old or
/// fill a tenth of memory, and then in bursts that compete with the brokers for the CPU
/// and, past the dirty limit, stall every writer in `balance_dirty_pages`. Produce
/// throughput then fell by half over a sustained run (issue #25). Started a megabyte at
/// a time as the log grows, the writeback runs as steadily as the appends. An error is
/// ignored: nothing depends on it.
#[allow(
    unsafe_code,
    reason = "sync_file_range has no safe wrapper in std or rustix"
)]
fn start_writeback(file: &File, pos: u64, len: u64) {
    use std::os::fd::AsRawFd;
    let (Ok(offset), Ok(nbytes)) = (libc::off64_t::try_from(pos), libc::off64_t::try_from(len))
    else {
        return;
    };
    // SAFETY: the call reads only its integer arguments; the descriptor is open for as
    // long as `file` is borrowed.
    let r = unsafe {
        libc::sync_file_range(
            file.as_raw_fd(),
            offset,
            nbytes,
            libc::SYNC_FILE_RANGE_WRITE,
        )
    };
    if r != 0 {
        tracing::debug!(error = %std::io::Error::last_os_error(), "sync_file_range");
    }
}

/// Writes the concatenation of `parts` at `pos` with `pwritev`, as many calls as short
/// writes and the kernel's limit on the number of slices per call make necessary.
fn write_all_vectored_at(file: &File, parts: &[&[u8]], mut pos: u64) -> std::io::Result<()> {
    // Linux's IOV_MAX: a call with more slices fails with EINVAL.
    const MAX_SLICES_PER_CALL: usize = 1024;
    let mut slices: Vec<IoSlice<'_>> = parts
        .iter()
        .filter(|p| !p.is_empty())
        .map(|p| IoSlice::new(p))
        .collect();
    let mut rest = &mut slices[..];
    while !rest.is_empty() {
        let window = rest.len().min(MAX_SLICES_PER_CALL);
        match rustix::io::pwritev(file, &rest[..window], pos) {
            Ok(0) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::WriteZero,
                    "pwritev wrote nothing",
                ))
            }
            Ok(n) => {
                pos += n as u64;
                IoSlice::advance_slices(&mut rest, n);
            }
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}
