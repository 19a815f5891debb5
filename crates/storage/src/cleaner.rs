//! The log cleaner (`cleanup.policy=compact`): keeps the latest record of every key in
//! the non-active segments, keeping offsets, and swaps the cleaned segments in without
//! ever leaving a mixture of old and new ones on disk.
//!
//! # Design note: cleaning a log
//!
//! The work is split so that the broker's lock on the log is held only for the quick
//! parts: [`UnifiedLog::prepare_clean`] (under the lock) captures the segments to clean
//! as open files; [`CleanTask::run`] (no lock: non-active segments are immutable, and a
//! deleted one stays readable through its open file) reads them and writes the cleaned
//! segments beside them as `.cleaned` files; [`UnifiedLog::apply_clean`] (under the lock)
//! swaps them in if the log's non-active segments are still the ones the task read.
//!
//! 1. Range. The cleanable segments are the non-active ones from the oldest, up to the
//!    first that reaches above the last stable offset (so every transaction in the range
//!    is decided, and its marker is below the high watermark) or whose largest timestamp
//!    is newer than `min.compaction.lag.ms`. Those wholly below the `cleaner-offset-checkpoint`
//!    (the first dirty offset) are clean, the others dirty. The dirty ratio is
//!    `dirty bytes / (clean + dirty bytes)`.
//! 2. Offset map. The dirty segments are read in order and every keyed record of a
//!    data batch that is not part of an aborted transaction sets `map[key] = offset`. When the map outgrows the
//!    dedupe buffer, it stops at the end of the segment being read (so the cap is soft
//!    by one segment) and that segment's end is the end of this clean.
//! 3. Rewrite. Every segment below the end, clean and dirty, is copied into new
//!    segments, starting a new one at a source segment's base offset whenever the next
//!    source would not fit `segment.bytes`. Per batch:
//!    - batches of aborted transactions are dropped (emptied if they are their
//!      producer's latest batch); which transactions were aborted comes from the
//!      aborted-transaction index, as in Kafka's `CleanedTransactionMetadata`;
//!    - transaction markers: see 5;
//!    - other batches, committed transactions' included, are decoded (decompressed under a cap; a batch over the cap is
//!      copied untouched) and a record is dropped when it has no key, when the map holds
//!      a later offset for its key, or when it is a tombstone (null value) in a batch
//!      whose delete horizon has passed;
//!    - a batch that keeps every record and needs no new delete horizon is copied as it
//!      is; one that keeps some is rebuilt with the same codec, base offset,
//!      `lastOffsetDelta`, producer id, epoch and base sequence, leader epoch and
//!      timestamp type, each kept record at its own offset (gaps are allowed); one that
//!      keeps none is dropped, unless it is its producer's latest batch, which is kept
//!      as an empty batch so that the producer's last sequence survives a rebuild of
//!      producer state from the log.
//! 4. Tombstones (Kafka 3.x's way, KIP-534). A rebuilt batch that still holds a
//!    tombstone and has no delete horizon gets one, `now + delete.retention.ms`, in its
//!    attributes (bit 6) and base timestamp. A later clean removes the batch's
//!    tombstones once `now` has reached the horizon. So a tombstone stays readable at
//!    least `delete.retention.ms` after the clean that first saw it, and it is first
//!    seen in the dirty section, where the offset map made the clean remove every older
//!    record of its key, so removing it later cannot resurrect a value.
//! 5. Markers (Kafka's rules). A marker stays while any batch of its transaction is
//!    still in the log before it (this clean saw one). Once none is left, it gets a
//!    delete horizon, `now + delete.retention.ms`, as a tombstone does, and a clean
//!    after the horizon removes it, with its entry in the aborted-transaction index; a
//!    reader that fetched the transaction's records before they were cleaned has had
//!    `delete.retention.ms` to read the marker. A producer's marker after its latest
//!    data batch, in its current epoch, is kept: it holds the epoch that fences the
//!    producer's zombies across a rebuild of producer state from the log.
//! 6. Swap (the commit protocol, each step durable before the next):
//!    1. the new segments are written as `<base>.log.cleaned`, `.index.cleaned`,
//!       `.timeindex.cleaned` and fsynced ([`CleanTask::run`]);
//!    2. the manifest `cleaner-swap` (old base offsets, new base offsets, end offset) is
//!       written atomically: this is the commit point;
//!    3. every `.cleaned` file is renamed to `.swap`, the directory is fsynced;
//!    4. the old segments whose base offset is not also a new one are deleted;
//!    5. for each new segment, its `.index.swap` and `.timeindex.swap` then its
//!       `.log.swap` are renamed over the final names (replacing the old segment with
//!       the same base), the directory is fsynced;
//!    6. the `cleaner-offset-checkpoint` becomes the end offset and the manifest is
//!       removed.
//!
//!    Recovery at open (`recover_swap`, called by `UnifiedLog::open`): without a manifest, any `.cleaned` and
//!    `.swap` files are deleted and the old segments, untouched, stand. With one, steps
//!    3–6 are redone for what remains (each is idempotent: a rename whose source is
//!    gone already happened, a delete of a missing file already happened). Since a
//!    segment's log file is renamed after its indexes, a `.log.swap` still present
//!    means the final-named log is the old one; once it is gone, all three files are
//!    new. Either the manifest exists and every old segment ends up replaced, or it
//!    does not and none was touched: never a mixture.
//!
//! Why cleaning keeps the latest value of every key: a record is removed only when a
//! later record of its key exists at an offset below the end, and that later record is
//! itself kept (it is the map's offset) unless it is a tombstone past its horizon, whose
//! older records were removed in the clean that set the horizon.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet, VecDeque};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use rill_protocol::records::batch::LOG_OVERHEAD;
use rill_protocol::records::{
    BatchError, ControlRecordType, Record, RecordBatch, RecordBatchBuilder, TimestampType,
};

use crate::checkpoint;
use crate::header::rewrite_header;
use crate::log::UnifiedLog;
use crate::producer_state::ProducerStateManager;
use crate::records::validate_stored;
use crate::segment::{segment_file, BatchSummary, LogSegment};
pub use crate::swap::CLEANER_SWAP_FILE;
use crate::swap::{
    finish_swap, remove_if_exists, tailed, write_manifest, CLEANED_TAIL, SWAP_ORDER,
};
use crate::transaction_index::{self, AbortedTxn};
use crate::StorageError;
use throttle::Throttler;

mod throttle;

/// Reads of the source segments and writes of the cleaned ones go in chunks of this size.
const IO_CHUNK: usize = 1 << 20;
/// What one offset-map entry costs besides its key (hash table slot, box, offset).
const MAP_ENTRY_OVERHEAD: usize = 48;

/// Broker-wide cleaner settings (Kafka's `log.cleaner.*`).
#[derive(Debug, Clone, PartialEq)]
pub struct CleanerConfig {
    /// `log.cleaner.dedupe.buffer.size`: memory for the offset map of one clean.
    pub dedupe_buffer_size: usize,
    /// The largest decompressed batch the cleaner decodes; a larger one is kept as is.
    pub max_batch_decompressed_bytes: usize,
    /// `log.cleaner.io.max.bytes.per.second`: the bound on the bytes one clean reads and
    /// writes per second (see [`throttle`]); `f64::MAX`, Kafka's default, is no bound.
    pub io_max_bytes_per_second: f64,
}

impl Default for CleanerConfig {
    fn default() -> Self {
        Self {
            dedupe_buffer_size: 128 * 1024 * 1024,
            max_batch_decompressed_bytes: 64 * 1024 * 1024,
            io_max_bytes_per_second: f64::MAX,
        }
    }
}

/// What one clean did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CleanStats {
    /// Source segments rewritten, and the segments that replaced them.
    pub segments_read: usize,
    pub segments_written: usize,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub records_read: u64,
    pub records_retained: u64,
    pub tombstones_removed: u64,
    /// Records without a key, which a compacted log cannot keep.
    pub keyless_removed: u64,
    /// Records of aborted transactions removed.
    pub aborted_removed: u64,
    /// Transaction markers removed (their transaction gone, their delete horizon past).
    pub markers_removed: u64,
    /// Distinct keys in the offset map.
    pub map_keys: usize,
    /// Time the clean spent asleep to stay under `log.cleaner.io.max.bytes.per.second`.
    pub throttled: std::time::Duration,
    /// The cleaned range was `[log's first base, end_offset)`; the first dirty offset is
    /// now `end_offset`.
    pub end_offset: i64,
}

/// A non-active segment captured for cleaning.
#[derive(Debug, Clone)]
struct SourceSegment {
    base_offset: i64,
    next_offset: i64,
    size: u64,
    file: Arc<File>,
    path: PathBuf,
}

/// The work of one clean, detached from the log: run it without the log's lock.
#[derive(Debug)]
pub struct CleanTask {
    dir: PathBuf,
    now_ms: i64,
    delete_retention_ms: i64,
    segment_bytes: u64,
    index_interval_bytes: u64,
    segment_index_bytes: u64,
    cleaner: CleanerConfig,
    /// Every cleanable segment, clean ones first.
    sources: Vec<SourceSegment>,
    first_dirty_offset: i64,
    producer_last_offsets: HashSet<i64>,
    /// Each producer's epoch and last data offset (see `ProducerStateManager::last_epochs`).
    producer_epochs: HashMap<i64, (i16, i64)>,
    /// The aborted transactions with records in the sources.
    aborted_txns: Vec<AbortedTxn>,
    layout_version: u64,
}

/// Which transaction the batches read belong to, as the cleaner walks the log (Kafka's
/// `CleanedTransactionMetadata`): a producer's transactional batches belong to an
/// aborted transaction from the first offset the aborted-transaction index gives it up
/// to its ABORT marker, to a committed one otherwise (every transaction in the range is
/// decided, step 1).
struct TxnTracker {
    /// Aborted transactions not reached yet, oldest first offset first.
    pending: VecDeque<AbortedTxn>,
    /// Producers inside an aborted transaction: whether a batch of it was read, and the
    /// first offset of the first one kept.
    aborted: HashMap<i64, (bool, Option<i64>)>,
    /// Producers inside a committed transaction of which a batch was read.
    committed: HashSet<i64>,
}

impl TxnTracker {
    fn new(aborted: &[AbortedTxn]) -> Self {
        let mut pending: Vec<AbortedTxn> = aborted.to_vec();
        pending.sort_by_key(|t| t.first_offset);
        Self {
            pending: pending.into(),
            aborted: HashMap::new(),
            committed: HashSet::new(),
        }
    }

    fn reach(&mut self, offset: i64) {
        while let Some(t) = self.pending.front().copied() {
            if t.first_offset > offset {
                break;
            }
            self.pending.pop_front();
            self.aborted.entry(t.producer_id).or_insert((false, None));
        }
    }

    /// A data batch: whether it belongs to an aborted transaction.
    fn data(&mut self, batch: &RecordBatch) -> bool {
        self.reach(batch.last_offset());
        if !batch.is_transactional() {
            return false;
        }
        match self.aborted.get_mut(&batch.producer_id()) {
            Some((read, _)) => {
                *read = true;
                true
            }
            None => {
                self.committed.insert(batch.producer_id());
                false
            }
        }
    }

    /// A batch of an aborted transaction that stays (emptied: its producer's latest).
    fn kept(&mut self, batch: &RecordBatch) {
        if let Some((_, first)) = self.aborted.get_mut(&batch.producer_id()) {
            first.get_or_insert(batch.base_offset());
        }
    }

    /// A control batch: whether no batch of its transaction was read before it, so that
    /// nothing needs the marker any more (it goes once its delete horizon has passed),
    /// and for an ABORT marker the first offset of its transaction's first batch kept.
    /// An empty control batch was emptied by a clean and is not needed either; one that
    /// cannot be read, or of a type this version does not know, stays.
    fn marker(
        &mut self,
        batch: &RecordBatch,
        kind: &Result<Option<ControlRecordType>, BatchError>,
    ) -> (bool, Option<i64>) {
        self.reach(batch.last_offset());
        let producer = batch.producer_id();
        match kind {
            Ok(None) => (true, None),
            Ok(Some(ControlRecordType::Abort)) => match self.aborted.remove(&producer) {
                Some((read, first_kept)) => (!read, first_kept),
                None => (true, None),
            },
            Ok(Some(ControlRecordType::Commit)) => (!self.committed.remove(&producer), None),
            Ok(Some(ControlRecordType::Unknown(_))) | Err(_) => (false, None),
        }
    }
}

/// The type of a control batch's record; `None` for a batch with no record.
fn control_kind(batch: &RecordBatch) -> Result<Option<ControlRecordType>, BatchError> {
    // A marker batch holds one small record; 4 KiB is far more than it decompresses to.
    let records = batch.records(4096)?;
    match records.first().and_then(|r| r.key.as_deref()) {
        Some(key) => ControlRecordType::from_key(key).map(Some),
        None if records.is_empty() => Ok(None),
        None => Err(BatchError::InvalidRecord("control record without a key")),
    }
}

/// The cleaned segments, written and fsynced as `.cleaned` files, waiting for
/// [`UnifiedLog::apply_clean`].
#[derive(Debug)]
pub struct CleanedSegments {
    dir: PathBuf,
    layout_version: u64,
    old_bases: Vec<i64>,
    new_bases: Vec<i64>,
    earliest_delete_horizon_ms: Option<i64>,
    /// The offsets of the ABORT markers removed: their index entries go too.
    removed_abort_markers: HashSet<i64>,
    /// For each ABORT marker kept, its transaction's first offset now (its first batch
    /// kept, else the marker's own), as a rebuild of the index from the log finds it.
    abort_first_offsets: HashMap<i64, i64>,
    stats: CleanStats,
}

impl CleanedSegments {
    pub fn stats(&self) -> &CleanStats {
        &self.stats
    }

    /// Deletes the `.cleaned` files (a clean that will not be applied).
    fn discard(&self) -> Result<(), StorageError> {
        for &base in &self.new_bases {
            for suffix in SWAP_ORDER {
                remove_if_exists(&segment_file(
                    &self.dir,
                    base,
                    &format!("{suffix}{CLEANED_TAIL}"),
                ))?;
            }
        }
        Ok(())
    }
}

/// Reads the batches of a source segment in order, in chunks.
struct BatchReader<'a> {
    src: &'a SourceSegment,
    throttle: &'a RefCell<Throttler>,
    pos: u64,
    chunk: Bytes,
    chunk_start: u64,
}

impl<'a> BatchReader<'a> {
    fn new(src: &'a SourceSegment, throttle: &'a RefCell<Throttler>) -> Self {
        Self {
            src,
            throttle,
            pos: 0,
            chunk: Bytes::new(),
            chunk_start: 0,
        }
    }

    fn corrupt(&self, reason: String) -> StorageError {
        StorageError::Corrupt {
            path: self.src.path.clone(),
            reason,
        }
    }

    /// The bytes `[pos, pos + len)` of the segment, from the chunk or a new read.
    fn bytes(&mut self, pos: u64, len: u64) -> Result<Bytes, StorageError> {
        let end = pos + len;
        if end > self.src.size {
            return Err(self.corrupt(format!("batch at {pos} runs past the segment end")));
        }
        let chunk_end = self.chunk_start + self.chunk.len() as u64;
        if pos < self.chunk_start || end > chunk_end {
            let want = len.max(IO_CHUNK as u64).min(self.src.size - pos);
            let mut buf = vec![0u8; want as usize];
            self.src
                .file
                .read_exact_at(&mut buf, pos)
                .map_err(|e| StorageError::io(&self.src.path, e))?;
            self.throttle.borrow_mut().maybe_throttle(want);
            self.chunk = Bytes::from(buf);
            self.chunk_start = pos;
        }
        let from = (pos - self.chunk_start) as usize;
        Ok(self.chunk.slice(from..from + len as usize))
    }

    /// The next batch, checked as a stored batch (CRC included: the cleaner must not
    /// give corrupt records a fresh, valid CRC).
    fn next_batch(&mut self) -> Result<Option<RecordBatch>, StorageError> {
        if self.pos >= self.src.size {
            return Ok(None);
        }
        let head = self.bytes(self.pos, LOG_OVERHEAD as u64)?;
        let length = i32::from_be_bytes([head[8], head[9], head[10], head[11]]);
        let size = LOG_OVERHEAD as u64 + u64::from(length.max(0) as u32);
        let bytes = self.bytes(self.pos, size)?;
        let batch = RecordBatch::new(bytes)
            .map_err(|e| self.corrupt(format!("batch at {}: {e}", self.pos)))?;
        validate_stored(&batch).map_err(|e| self.corrupt(format!("batch at {}: {e}", self.pos)))?;
        self.pos += size;
        Ok(Some(batch))
    }
}

/// Decodes a data batch's records; `Ok(None)` when it is over the decompression cap (the
/// cleaner then keeps it untouched). Any other decoding failure is corruption.
fn decode(
    batch: &RecordBatch,
    cap: usize,
    path: &Path,
) -> Result<Option<Vec<Record>>, StorageError> {
    match batch.records(cap) {
        Ok(r) => Ok(Some(r)),
        Err(BatchError::DecompressedTooLarge(_)) => Ok(None),
        Err(e) => Err(StorageError::Corrupt {
            path: path.to_owned(),
            reason: format!("batch at offset {}: {e}", batch.base_offset()),
        }),
    }
}

/// A cleaned segment being written.
struct Output {
    seg: LogSegment,
    pending: Vec<u8>,
    summaries: Vec<BatchSummary>,
    sources: usize,
}

impl Output {
    fn size(&self) -> u64 {
        self.seg.size() + self.pending.len() as u64
    }

    fn push(&mut self, bytes: &[u8], summary: BatchSummary) -> Result<(), StorageError> {
        self.pending.extend_from_slice(bytes);
        self.summaries.push(summary);
        if self.pending.len() >= IO_CHUNK {
            self.write_pending()?;
        }
        Ok(())
    }

    fn write_pending(&mut self) -> Result<(), StorageError> {
        if !self.pending.is_empty() {
            self.seg.append(&self.pending, &self.summaries)?;
            self.pending.clear();
            self.summaries.clear();
        }
        Ok(())
    }

    /// Writes what is pending, the final time-index entry, and fsyncs the three files.
    fn finish(mut self) -> Result<u64, StorageError> {
        self.write_pending()?;
        self.seg.on_become_inactive()?;
        Ok(self.seg.size())
    }
}

fn summary_of(batch: &RecordBatch) -> BatchSummary {
    BatchSummary {
        last_offset: batch.last_offset(),
        max_timestamp: batch.max_timestamp(),
        size: batch.size() as u64,
    }
}

impl CleanTask {
    /// Builds the offset map, writes the cleaned segments as `.cleaned` files and
    /// fsyncs them. Takes no lock and touches no file the log uses. On error the files
    /// it wrote are removed; call [`UnifiedLog::abort_clean`] then.
    pub fn run(self) -> Result<CleanedSegments, StorageError> {
        let mut new_bases = Vec::new();
        let result = self.run_inner(&mut new_bases);
        if result.is_err() {
            for base in new_bases {
                for suffix in SWAP_ORDER {
                    // Best effort: the error being returned matters more.
                    let _ = remove_if_exists(&tailed(&self.dir, base, suffix, CLEANED_TAIL));
                }
            }
        }
        result
    }

    fn run_inner(&self, new_bases: &mut Vec<i64>) -> Result<CleanedSegments, StorageError> {
        let mut stats = CleanStats::default();
        let cap = self.cleaner.max_batch_decompressed_bytes;
        let throttle = RefCell::new(Throttler::new(self.cleaner.io_max_bytes_per_second));

        // Step 2: the offset map over the dirty segments.
        let mut map: HashMap<Box<[u8]>, i64> = HashMap::new();
        let mut map_bytes = 0usize;
        let mut end_offset = self
            .sources
            .last()
            .map_or(self.first_dirty_offset, |s| s.next_offset);
        let mut txns = TxnTracker::new(&self.aborted_txns);
        for src in self
            .sources
            .iter()
            .filter(|s| s.next_offset > self.first_dirty_offset)
        {
            if map_bytes > self.cleaner.dedupe_buffer_size {
                end_offset = src.base_offset;
                break;
            }
            let mut reader = BatchReader::new(src, &throttle);
            while let Some(batch) = reader.next_batch()? {
                if batch.is_control() {
                    txns.marker(&batch, &control_kind(&batch));
                    continue;
                }
                if txns.data(&batch) {
                    continue;
                }
                let Some(records) = decode(&batch, cap, &src.path)? else {
                    continue;
                };
                for r in records {
                    if let Some(key) = r.key {
                        match map.get_mut(&key[..]) {
                            Some(o) => *o = (*o).max(r.offset),
                            None => {
                                map_bytes += key.len() + MAP_ENTRY_OVERHEAD;
                                map.insert(Box::from(&key[..]), r.offset);
                            }
                        }
                    }
                }
            }
        }
        stats.map_keys = map.len();
        stats.end_offset = end_offset;

        // Step 3: rewrite every source below the end.
        let mut horizon: Option<i64> = None;
        // Only the transactions whose marker is rewritten too: one whose records fall
        // below the end and whose marker does not (the offset map filled up) keeps its
        // records, as they are invisible to read_committed readers anyway.
        let rewritten: Vec<AbortedTxn> = self
            .aborted_txns
            .iter()
            .filter(|t| t.last_offset < end_offset)
            .copied()
            .collect();
        let mut txns = TxnTracker::new(&rewritten);
        let mut removed_abort_markers = HashSet::new();
        let mut abort_first_offsets = HashMap::new();
        let mut old_bases = Vec::new();
        let mut out: Option<Output> = None;
        for src in self.sources.iter().filter(|s| s.base_offset < end_offset) {
            old_bases.push(src.base_offset);
            stats.segments_read += 1;
            stats.bytes_read += src.size;
            let start_new = match &out {
                None => true,
                Some(o) => {
                    o.size() + src.size > self.segment_bytes
                        || src.next_offset - o.seg.base_offset() > i64::from(i32::MAX)
                }
            };
            if start_new {
                if let Some(o) = out.take() {
                    stats.bytes_written += o.finish()?;
                }
                new_bases.push(src.base_offset);
                out = Some(Output {
                    seg: LogSegment::create_with_tail(
                        &self.dir,
                        src.base_offset,
                        CLEANED_TAIL,
                        self.index_interval_bytes,
                        self.segment_index_bytes,
                        self.now_ms,
                    )?,
                    pending: Vec::new(),
                    summaries: Vec::new(),
                    sources: 0,
                });
            }
            let Some(o) = out.as_mut() else {
                continue;
            };
            o.sources += 1;
            let mut reader = BatchReader::new(src, &throttle);
            while let Some(batch) = reader.next_batch()? {
                let written = o.size();
                let mut cleaning = Cleaning {
                    map: &map,
                    txns: &mut txns,
                    path: &src.path,
                    stats: &mut stats,
                    horizon: &mut horizon,
                    removed_abort_markers: &mut removed_abort_markers,
                    abort_first_offsets: &mut abort_first_offsets,
                };
                self.clean_batch(&batch, o, &mut cleaning)?;
                throttle
                    .borrow_mut()
                    .maybe_throttle(o.size().saturating_sub(written));
            }
        }
        if let Some(o) = out.take() {
            stats.bytes_written += o.finish()?;
        }
        stats.segments_written = new_bases.len();
        stats.throttled = throttle.into_inner().slept;
        checkpoint::sync_dir(&self.dir)?;
        Ok(CleanedSegments {
            dir: self.dir.clone(),
            layout_version: self.layout_version,
            old_bases,
            new_bases: new_bases.clone(),
            earliest_delete_horizon_ms: horizon,
            removed_abort_markers,
            abort_first_offsets,
            stats,
        })
    }

    /// Steps 3 to 5 of the design note for one batch.
    fn clean_batch(
        &self,
        batch: &RecordBatch,
        out: &mut Output,
        c: &mut Cleaning<'_>,
    ) -> Result<(), StorageError> {
        let (map, path) = (c.map, c.path);
        let keep_untouched = |out: &mut Output, stats: &mut CleanStats| {
            stats.records_read += batch.record_count().max(0) as u64;
            stats.records_retained += batch.record_count().max(0) as u64;
            out.push(batch.as_bytes(), summary_of(batch))
        };
        if batch.is_control() {
            return self.clean_marker(batch, out, c);
        }
        let keeps_producer_state =
            batch.producer_id() >= 0 && self.producer_last_offsets.contains(&batch.last_offset());
        if c.txns.data(batch) {
            let n = batch.record_count().max(0) as u64;
            c.stats.records_read += n;
            c.stats.aborted_removed += n;
            if !keeps_producer_state {
                return Ok(());
            }
            c.txns.kept(batch);
            if n == 0 {
                return out.push(batch.as_bytes(), summary_of(batch));
            }
            return push_rebuilt(batch, &[], None, path, out);
        }
        let stats = &mut *c.stats;
        let horizon = &mut *c.horizon;
        let Some(records) = decode(batch, self.cleaner.max_batch_decompressed_bytes, path)? else {
            return keep_untouched(out, stats);
        };
        let had_horizon = batch.has_delete_horizon();
        // With a horizon set, the base timestamp is the horizon (KIP-534).
        let horizon_passed = had_horizon && self.now_ms >= batch.base_timestamp();
        stats.records_read += records.len() as u64;
        let total = records.len();
        let mut kept = Vec::with_capacity(records.len());
        let mut has_tombstone = false;
        for r in records {
            let Some(key) = r.key.as_ref() else {
                stats.keyless_removed += 1;
                continue;
            };
            if map.get(&key[..]).is_some_and(|latest| *latest > r.offset) {
                continue;
            }
            if r.value.is_none() {
                if horizon_passed {
                    stats.tombstones_removed += 1;
                    continue;
                }
                has_tombstone = true;
            }
            kept.push(r);
        }
        stats.records_retained += kept.len() as u64;
        let batch_horizon = if has_tombstone {
            Some(if had_horizon {
                batch.base_timestamp()
            } else {
                self.now_ms.saturating_add(self.delete_retention_ms)
            })
        } else {
            None
        };
        if let Some(h) = batch_horizon {
            *horizon = Some(horizon.map_or(h, |e| e.min(h)));
        }
        if kept.len() == total && (!has_tombstone || had_horizon) {
            return out.push(batch.as_bytes(), summary_of(batch));
        }
        if kept.is_empty() && !keeps_producer_state {
            return Ok(());
        }
        push_rebuilt(batch, &kept, batch_horizon, path, out)
    }

    /// Step 5 of the design note for one control batch.
    fn clean_marker(
        &self,
        batch: &RecordBatch,
        out: &mut Output,
        c: &mut Cleaning<'_>,
    ) -> Result<(), StorageError> {
        let kind = control_kind(batch);
        let (unneeded, first_kept) = c.txns.marker(batch, &kind);
        let is_abort = matches!(kind, Ok(Some(ControlRecordType::Abort)));
        let n = batch.record_count().max(0) as u64;
        c.stats.records_read += n;
        let fences =
            self.producer_epochs
                .get(&batch.producer_id())
                .is_some_and(|&(epoch, last_data)| {
                    epoch == batch.producer_epoch() && last_data < batch.base_offset()
                });
        let removed = unneeded
            && !fences
            && (n == 0 || (batch.has_delete_horizon() && self.now_ms >= batch.base_timestamp()));
        if removed {
            c.stats.markers_removed += u64::from(n > 0);
            if is_abort {
                c.removed_abort_markers.insert(batch.last_offset());
            }
            return Ok(());
        }
        if is_abort {
            c.abort_first_offsets.insert(
                batch.last_offset(),
                first_kept.unwrap_or(batch.last_offset()),
            );
        }
        c.stats.records_retained += n;
        if !unneeded || fences {
            return out.push(batch.as_bytes(), summary_of(batch));
        }
        if batch.has_delete_horizon() {
            let h = batch.base_timestamp();
            *c.horizon = Some(c.horizon.map_or(h, |e| e.min(h)));
            return out.push(batch.as_bytes(), summary_of(batch));
        }
        let h = self.now_ms.saturating_add(self.delete_retention_ms);
        *c.horizon = Some(c.horizon.map_or(h, |e| e.min(h)));
        let Some(records) = decode(batch, self.cleaner.max_batch_decompressed_bytes, c.path)?
        else {
            return out.push(batch.as_bytes(), summary_of(batch));
        };
        push_rebuilt(batch, &records, Some(h), c.path, out)
    }
}

/// What [`CleanTask::clean_batch`] reads and updates along one clean.
struct Cleaning<'a> {
    map: &'a HashMap<Box<[u8]>, i64>,
    txns: &'a mut TxnTracker,
    path: &'a Path,
    stats: &'a mut CleanStats,
    horizon: &'a mut Option<i64>,
    removed_abort_markers: &'a mut HashSet<i64>,
    abort_first_offsets: &'a mut HashMap<i64, i64>,
}

/// Writes `original` rebuilt with `kept` and the delete horizon.
fn push_rebuilt(
    original: &RecordBatch,
    kept: &[Record],
    delete_horizon_ms: Option<i64>,
    path: &Path,
    out: &mut Output,
) -> Result<(), StorageError> {
    let rebuilt =
        rebuild(original, kept, delete_horizon_ms).map_err(|e| StorageError::Corrupt {
            path: path.to_owned(),
            reason: format!("rebuilding batch at offset {}: {e}", original.base_offset()),
        })?;
    let summary = BatchSummary {
        last_offset: original.last_offset(),
        max_timestamp: rebuilt.max_timestamp(),
        size: rebuilt.size() as u64,
    };
    out.push(rebuilt.as_bytes(), summary)
}

/// A batch holding `kept` (records of `original`, in order) with the original's base
/// offset, `lastOffsetDelta`, codec, producer fields, transactional and control flags,
/// leader epoch and timestamp type.
fn rebuild(
    original: &RecordBatch,
    kept: &[Record],
    delete_horizon_ms: Option<i64>,
) -> Result<RecordBatch, BatchError> {
    let mut builder = RecordBatchBuilder::new(original.compression()?, original.base_offset())
        .producer(
            original.producer_id(),
            original.producer_epoch(),
            original.base_sequence(),
        )
        .transactional(original.is_transactional())
        .control(original.is_control())
        .partition_leader_epoch(original.partition_leader_epoch());
    if let Some(h) = delete_horizon_ms {
        builder = builder.delete_horizon(h);
    }
    for r in kept {
        builder.append_with_offset(
            r.offset,
            r.timestamp,
            r.key.as_deref(),
            r.value.as_deref(),
            &r.headers,
        )?;
    }
    let mut bytes = builder.build()?.to_vec();
    let log_append_time = (original.timestamp_type() == TimestampType::LogAppendTime
        && !kept.is_empty())
    .then(|| original.max_timestamp());
    rewrite_header(&mut bytes, original.last_offset_delta(), log_append_time);
    RecordBatch::new(Bytes::from(bytes))
}

/// The cleanable part of a log (step 1 of the design note).
#[derive(Debug, Clone, Copy)]
struct Cleanable {
    clean_bytes: u64,
    dirty_bytes: u64,
    /// First timestamp of the oldest dirty cleanable segment (for max.compaction.lag.ms).
    first_dirty_timestamp: Option<i64>,
    /// Base offset of the first segment that may not be cleaned yet.
    uncleanable_offset: i64,
}

impl UnifiedLog {
    fn cleanable(&self, now_ms: i64) -> Cleanable {
        let active_base = self
            .active_segment()
            .map_or(i64::MAX, LogSegment::base_offset);
        let lag = self.config.min_compaction_lag_ms;
        let stable = self.last_stable_offset();
        let mut c = Cleanable {
            clean_bytes: 0,
            dirty_bytes: 0,
            first_dirty_timestamp: None,
            uncleanable_offset: active_base,
        };
        for seg in self.segments.values() {
            let too_recent = lag > 0 && seg.max_timestamp_so_far() > now_ms.saturating_sub(lag);
            if seg.base_offset() >= active_base || seg.next_offset() > stable || too_recent {
                c.uncleanable_offset = seg.base_offset();
                break;
            }
            if seg.next_offset() <= self.first_dirty_offset {
                c.clean_bytes += seg.size();
            } else {
                c.dirty_bytes += seg.size();
                if c.first_dirty_timestamp.is_none() {
                    c.first_dirty_timestamp =
                        Some(seg.first_batch_timestamp().unwrap_or(seg.created_ms()));
                }
            }
        }
        c
    }

    /// The share of the cleanable bytes (non-active segments below the high watermark
    /// and older than `min.compaction.lag.ms`) that has not been cleaned yet; 0 when
    /// nothing is cleanable. The broker cleans the log with the highest ratio first.
    pub fn dirty_ratio(&self, now_ms: i64) -> f64 {
        let c = self.cleanable(now_ms);
        let total = c.clean_bytes + c.dirty_bytes;
        if total == 0 {
            0.0
        } else {
            c.dirty_bytes as f64 / total as f64
        }
    }

    /// Whether a compacted log should be cleaned now: its dirty ratio reached
    /// `min.cleanable.dirty.ratio`, or a dirty record is older than
    /// `max.compaction.lag.ms`, or tombstones kept by an earlier clean have reached
    /// their delete horizon. False while a clean of this log is in progress.
    pub fn needs_cleaning(&self, now_ms: i64) -> bool {
        if !self.config.cleanup_policy.is_compact() || self.clean_in_progress {
            return false;
        }
        let c = self.cleanable(now_ms);
        let total = c.clean_bytes + c.dirty_bytes;
        let ratio = c.dirty_bytes > 0
            && c.dirty_bytes as f64 >= self.config.min_cleanable_dirty_ratio * total as f64;
        let overdue = c
            .first_dirty_timestamp
            .is_some_and(|t| now_ms.saturating_sub(t) > self.config.max_compaction_lag_ms);
        let horizon = total > 0 && self.earliest_delete_horizon_ms.is_some_and(|h| now_ms >= h);
        ratio || overdue || horizon
    }

    /// Captures what a clean needs (under the log's lock; quick: no data is read). `None`
    /// when the log is not compacted, nothing is cleanable, or a clean is already out.
    /// The task must be followed by [`Self::apply_clean`] or [`Self::abort_clean`].
    pub fn prepare_clean(&mut self, now_ms: i64, cleaner: &CleanerConfig) -> Option<CleanTask> {
        if !self.config.cleanup_policy.is_compact()
            || self.clean_in_progress
            || self.offline_cause().is_some()
        {
            return None;
        }
        let c = self.cleanable(now_ms);
        let horizon_due = self.earliest_delete_horizon_ms.is_some_and(|h| now_ms >= h);
        if c.dirty_bytes == 0 && !horizon_due {
            return None;
        }
        let sources: Vec<SourceSegment> = self
            .segments
            .range(..c.uncleanable_offset)
            .map(|(_, s)| SourceSegment {
                base_offset: s.base_offset(),
                next_offset: s.next_offset(),
                size: s.size(),
                file: s.log_file(),
                path: s.log_path().to_owned(),
            })
            .collect();
        if sources.is_empty() {
            return None;
        }
        let aborted_txns = self.collect_aborted_txns(
            sources.first().map_or(0, |s| s.base_offset),
            c.uncleanable_offset,
        );
        self.clean_in_progress = true;
        Some(CleanTask {
            dir: self.dir.clone(),
            now_ms,
            delete_retention_ms: self.config.delete_retention_ms,
            segment_bytes: self.config.segment_bytes,
            index_interval_bytes: self.config.index_interval_bytes,
            segment_index_bytes: self.config.segment_index_bytes,
            cleaner: cleaner.clone(),
            sources,
            first_dirty_offset: self.first_dirty_offset,
            producer_last_offsets: self.producer_state.last_batch_offsets(),
            producer_epochs: self.producer_state.last_epochs(),
            aborted_txns,
            layout_version: self.layout_version,
        })
    }

    /// Releases the clean taken by [`Self::prepare_clean`] when its task failed or was
    /// dropped (the task removes its own files on failure).
    pub fn abort_clean(&mut self) {
        self.clean_in_progress = false;
    }

    /// Swaps the cleaned segments in (under the log's lock; quick: renames, unlinks and
    /// fsyncs, no data copied). `Ok(None)` when the log's non-active segments changed
    /// since [`Self::prepare_clean`] (retention, truncation): the cleaned files are
    /// discarded and the next clean starts over. An `Err` means the disk failed in the
    /// middle of the swap: the log must be taken offline (fail-stop) and reopened, which
    /// finishes the swap.
    pub fn apply_clean(
        &mut self,
        cleaned: CleanedSegments,
    ) -> Result<Option<CleanStats>, StorageError> {
        self.check_online()?;
        self.apply_clean_with(cleaned, &mut || Ok(()))
            .map_err(|e| self.go_offline(e))
    }

    pub(crate) fn apply_clean_with(
        &mut self,
        cleaned: CleanedSegments,
        step: &mut dyn FnMut() -> Result<(), StorageError>,
    ) -> Result<Option<CleanStats>, StorageError> {
        self.clean_in_progress = false;
        let current = cleaned.dir == self.dir
            && cleaned.layout_version == self.layout_version
            && cleaned
                .old_bases
                .iter()
                .all(|b| self.segments.contains_key(b));
        if !current {
            cleaned.discard()?;
            return Ok(None);
        }
        let end = cleaned.stats.end_offset;
        // The swap and the rewrite of the `.txnindex` files below `end` are not one
        // atomic step: until both are done, a recovery must read the markers again.
        let indexes_touched = self.aborted_txns.iter().any(|t| t.last_offset < end)
            || cleaned.stats.markers_removed > 0;
        if indexes_touched {
            transaction_index::mark_for_rebuild(&self.dir)?;
        }
        step()?;
        write_manifest(&self.dir, &cleaned.old_bases, &cleaned.new_bases, end)?;
        finish_swap(&self.dir, &cleaned.old_bases, &cleaned.new_bases, end, step)?;
        // A crash here has swapped the segments but not rewritten their indexes.
        step()?;
        for base in &cleaned.old_bases {
            // The files are gone or replaced; dropping closes the old handles.
            self.segments.remove(base);
        }
        for &base in &cleaned.new_bases {
            let mut seg = LogSegment::open(
                &self.dir,
                base,
                self.config.index_interval_bytes,
                self.config.segment_index_bytes,
                0,
            )?;
            seg.load()?;
            self.segments.insert(base, seg);
        }
        self.layout_version += 1;
        self.first_dirty_offset = end;
        self.earliest_delete_horizon_ms = cleaned.earliest_delete_horizon_ms;
        // An ABORT marker removed takes its index entry with it: a read_committed
        // reader told of an aborted transaction skips its producer's batches until the
        // marker. The swap replaced segments by base offset: each marker's entry goes to
        // the `.txnindex` of the segment that holds it now.
        if !cleaned.removed_abort_markers.is_empty() {
            self.aborted_txns
                .retain(|t| !cleaned.removed_abort_markers.contains(&t.last_offset));
        }
        // A kept marker's transaction may have lost its first records: its entry starts
        // where what is left of it starts, as a rebuild from the log finds it (the
        // entry's last stable offset, which nothing reads, is left as it was).
        let mut txns_changed = cleaned.stats.markers_removed > 0;
        for t in &mut self.aborted_txns {
            if let Some(&first) = cleaned.abort_first_offsets.get(&t.last_offset) {
                txns_changed |= first != t.first_offset;
                t.first_offset = first;
            }
        }
        self.rewrite_txn_indexes()?;
        // A producer snapshot taken while such a transaction was open lies between its
        // first offset and its marker, so below `end`: a replay from it would keep the
        // transaction open (its marker gone) or start it where nothing is left. Those
        // go; a recovery starts from a newer one or from the log's start.
        if txns_changed {
            ProducerStateManager::delete_snapshots_below(&self.dir, end)?;
            checkpoint::sync_dir(&self.dir)?;
        }
        if indexes_touched {
            transaction_index::rebuilt(&self.dir)?;
        }
        tracing::info!(
            dir = %self.dir.display(),
            segments = cleaned.stats.segments_read,
            bytes_read = cleaned.stats.bytes_read,
            bytes_written = cleaned.stats.bytes_written,
            "cleaned log"
        );
        Ok(Some(cleaned.stats))
    }

    /// Prepares, runs and applies a clean in one call, all under `&mut self`: for tests
    /// and small logs. The broker should use the three steps to keep its lock short.
    pub fn clean(
        &mut self,
        now_ms: i64,
        cleaner: &CleanerConfig,
    ) -> Result<Option<CleanStats>, StorageError> {
        let Some(task) = self.prepare_clean(now_ms, cleaner) else {
            return Ok(None);
        };
        match task.run() {
            Ok(cleaned) => self.apply_clean(cleaned),
            Err(e) => {
                self.abort_clean();
                Err(e)
            }
        }
    }
}

#[cfg(test)]
mod tests;
