//! `UnifiedLog`: one partition's log — segments, offsets, high watermark, log start
//! offset, leader epochs and producer state — behind one `&mut self` API.
//!
//! The broker keeps one `UnifiedLog` per partition behind a lock; nothing here is
//! asynchronous. Time is passed in (`now_ms`) so that rolling and flushing are
//! deterministic in tests. Two parts of an append need no lock and may be split off
//! by the caller: validating the records ([`UnifiedLog::validate_records`], against a
//! snapshot of the config) and the fsync the flush policy asks for (a
//! [`PendingFlush`], shared with the log through [`crate::flush`]'s group commit).
//!
//! Files in the partition directory:
//! - `<base offset, 20 digits>.log|.index|.timeindex`: the segments (see [`segment`]).
//! - `leader-epoch-checkpoint`: the leader epoch cache (see [`epoch`]).
//! - `log-start-offset`, `high-watermark`: single-offset checkpoints.
//! - `cleaner-offset-checkpoint`: the first offset the cleaner has not cleaned yet.
//! - `<base offset>.txnindex`: the aborted transactions whose ABORT marker is in that
//!   segment (see [`crate::transaction_index`]).
//! - `<log end offset>.snapshot`: the producer state at a clean close (see
//!   [`crate::producer_state`]).
//! - `*.cleaned`, `*.swap`, `cleaner-swap`: a clean in progress, finished or rolled back
//!   at open (see [`cleaner`]).
//! - `.clean_shutdown`: written by earlier versions at a clean close, one per log; open
//!   still takes it for a clean shutdown and removes it. The marker is now one per data
//!   directory (see [`crate::clean_shutdown`]): whoever owns the directory tells
//!   [`UnifiedLog::open`] how the previous run ended ([`PreviousShutdown`]); after an
//!   unclean one the active segment is recovered and the producer state and any leader
//!   epochs missing from the checkpoint are rebuilt from the batches.
//!
//! # Transactions
//!
//! The producer state tracks each producer's open transaction; the *last stable offset*
//! (LSO, [`UnifiedLog::last_stable_offset`]) is the first offset of the oldest
//! transaction not yet decided and replicated, or the high watermark, whichever is
//! smaller: a read_committed reader reads below it only. A transaction marker is a
//! control batch appended by the partition leader for the transaction coordinator
//! ([`end_txn_marker_batch`], origin `Coordinator`); an ABORT marker adds an entry to the
//! aborted-transaction index, which [`UnifiedLog::collect_aborted_txns`] answers fetches
//! from. After an unclean shutdown the markers are read again with the batch headers,
//! which rebuilds the open transactions, the LSO and the index together.
//!
//! [`UnifiedLog::close`] writes the index entries and checkpoints without fsync: the
//! caller makes a whole directory of closed logs durable with one `syncfs` before it
//! records the clean shutdown.
//!
//! A failed write or fsync takes the log offline (Kafka's `maybeHandleIOException`): a
//! write may have left a torn tail and a failed fsync may have dropped dirty pages, so
//! nothing that follows can be trusted to land where the in-memory state says. From then
//! on every append, flush and roll returns [`StorageError::Offline`] (so does every
//! pending flush: an fsync is never retried), and
//! [`UnifiedLog::close`] refuses to write the clean-shutdown marker, so that the next
//! open recovers the active segment from what is really on disk.
//!
//! [`segment`]: crate::segment
//! [`cleaner`]: crate::cleaner
//! [`epoch`]: crate::epoch

use std::cell::Cell;
use std::collections::BTreeMap;
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use rill_protocol::records::batch::{
    set_base_offset, set_log_append_time_split, set_max_timestamp_split,
    set_partition_leader_epoch, HEADER_LEN,
};
use rill_protocol::records::{RecordBatch, TimestampType};

use crate::checkpoint::{self, Durability};
use crate::clean_shutdown::{PreviousShutdown, CLEAN_SHUTDOWN_FILE};
use crate::config::{LogConfig, MessageTimestampType};
use crate::epoch::LeaderEpochFileCache;
use crate::error::{AppendError, ReadError, StorageError};
use crate::flush::{FlushDone, LogFlusher, PendingFlush};
use crate::producer_state::{
    AppendOrigin, EndTxnMarker, ProducerAppendInfo, ProducerBatch, ProducerStateEntry,
    ProducerStateManager,
};
use crate::records::{end_txn_marker, first_record_at_or_after, validate_stored};
use crate::segment::{
    BatchSummary, FetchDataInfo, LogSegment, INDEX_FILE_SUFFIX, LOG_FILE_SUFFIX,
    TIME_INDEX_FILE_SUFFIX,
};
use crate::swap::{recover_swap, CLEANER_OFFSET_CHECKPOINT_FILE};
use crate::transaction_index::{self, AbortedTxn, TXN_INDEX_FILE_SUFFIX};
use crate::validator::{
    corrupt_to_append_error, recompress, validate_records, RecordChecks, TimestampWindow,
};

pub const HIGH_WATERMARK_FILE: &str = "high-watermark";
pub const LOG_START_OFFSET_FILE: &str = "log-start-offset";

/// What an append did (Kafka's `LogAppendInfo`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogAppendInfo {
    /// Offset of the first record appended (or of the original batch when
    /// `duplicate`); -1 for an empty record set.
    pub first_offset: i64,
    pub last_offset: i64,
    /// Greatest batch max timestamp of the append (the append time for LogAppendTime).
    pub max_timestamp: i64,
    /// Last offset of the batch holding `max_timestamp`.
    pub offset_of_max_timestamp: i64,
    /// The broker time written into the batches, or -1 under CreateTime.
    pub log_append_time_ms: i64,
    pub log_start_offset: i64,
    pub record_count: i64,
    pub valid_bytes: usize,
    /// The batch repeated one of its producer's last five: nothing was written and the
    /// offsets are the original ones.
    pub duplicate: bool,
}

/// A ListOffsets answer: a record's offset and timestamp, and the epoch of its batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimestampAndOffset {
    pub timestamp: i64,
    pub offset: i64,
    pub leader_epoch: Option<i32>,
}

/// One validated batch of a record set: the batch as received, or its re-encoding
/// with the topic's `compression.type`.
#[derive(Debug)]
struct ValidBatch {
    batch: RecordBatch,
    /// The largest record timestamp of a CreateTime batch whose header claims another:
    /// the leader writes this instead (as Kafka's does), so that the time index, time
    /// lookups and time-based retention see what the records hold.
    max_timestamp_fix: Option<i64>,
}

/// A record set checked by [`UnifiedLog::validate_records`] against a snapshot of the
/// log's config, ready for [`UnifiedLog::append_validated_as_leader`] or
/// [`UnifiedLog::append_validated_as_follower`]. Validation (CRC, the record walk, a
/// re-compression) needs no log state, so the broker does it without the partition's
/// lock.
#[derive(Debug)]
pub struct ValidatedRecords {
    batches: Vec<ValidBatch>,
    origin: AppendOrigin,
    /// The size of the record set as received.
    received_bytes: usize,
    /// `Some` when the leader checks KIP-890's verification (a client append with
    /// `transaction.partition.verification.enable`): the guard of
    /// [`UnifiedLog::start_txn_verification`], `None` inside when none was started.
    txn_verification: Option<Option<u64>>,
}

impl ValidatedRecords {
    /// Makes the append refuse (INVALID_TXN_STATE) a transactional batch that would
    /// open a transaction unless `guard` is its producer's current verification guard.
    pub fn require_txn_verification(&mut self, guard: Option<u64>) {
        self.txn_verification = Some(guard);
    }
}

/// The partition log.
#[derive(Debug)]
pub struct UnifiedLog {
    pub(crate) dir: PathBuf,
    /// Shared with validations in flight (see [`UnifiedLog::config_for_append`]).
    pub(crate) config: Arc<LogConfig>,
    /// By base offset; never empty (the last one is the active segment).
    pub(crate) segments: BTreeMap<i64, LogSegment>,
    pub(crate) log_start_offset: i64,
    pub(crate) high_watermark: i64,
    /// Everything below is known to be fsynced.
    pub(crate) recovery_point: i64,
    pub(crate) leader_epoch_cache: LeaderEpochFileCache,
    pub(crate) producer_state: ProducerStateManager,
    /// Every aborted transaction of the log, by marker offset (the `.txnindex` files
    /// hold the same, one file per segment).
    pub(crate) aborted_txns: Vec<AbortedTxn>,
    unflushed_messages: u64,
    last_flush_ms: i64,
    /// Group commit of the fsyncs that `flush.messages` and `flush.ms` ask for (see
    /// [`crate::flush`]).
    flusher: Arc<LogFlusher>,
    /// The cleaner's progress: every segment below this offset has been cleaned
    /// (Kafka's `cleaner-offset-checkpoint`, kept per partition here).
    pub(crate) first_dirty_offset: i64,
    /// Bumped whenever a non-active segment is removed or replaced, so that a clean
    /// prepared before such a change is not applied after it.
    pub(crate) layout_version: u64,
    /// A `CleanTask` is out; at most one per log.
    pub(crate) clean_in_progress: bool,
    /// The earliest delete horizon the last clean left on a batch that still holds
    /// tombstones: when it has passed, cleaning again removes them. In memory only; after
    /// a restart the next clean (which the dirty ratio triggers) finds them anyway.
    pub(crate) earliest_delete_horizon_ms: Option<i64>,
    /// Why the log went offline: the first write or fsync that failed. Set once, never
    /// cleared; only a reopen (after a restart) brings the log back.
    offline_cause: Option<String>,
    /// What the `high-watermark` and `log-start-offset` files hold, as read at open or
    /// last written (`None`: unknown), so that a close skips a rewrite of the same value.
    high_watermark_in_file: Cell<Option<i64>>,
    log_start_in_file: Cell<Option<i64>>,
    /// Newest bytes of the active segment kept in memory until the high watermark passes
    /// them (0: none); see [`UnifiedLog::set_tail_copy_limit`].
    tail_copy_limit: usize,
    /// The last offset known to be in the remote tier (-1: none), set by the broker; see
    /// [`crate::remote`].
    pub(crate) highest_offset_in_remote_storage: i64,
}

fn parse_base_offset(file_name: &str, suffix: &str) -> Option<i64> {
    let stem = file_name.strip_suffix(suffix)?.strip_suffix('.')?;
    if stem.len() != 20 || !stem.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    stem.parse().ok()
}

pub use crate::validator::MAX_DECOMPRESSED_BATCH_BYTES;

impl UnifiedLog {
    /// Opens the log in `dir`, creating it when absent and recovering it when the last
    /// run did not close it cleanly: `previous` says how that run ended for the whole
    /// data directory (see [`crate::clean_shutdown`]); a standalone log that was not
    /// [`close`](Self::close)d, or whose close was not made durable, is `Unclean`.
    pub fn open(
        dir: &Path,
        config: LogConfig,
        now_ms: i64,
        previous: PreviousShutdown,
    ) -> Result<Self, StorageError> {
        config.validate()?;
        fs::create_dir_all(dir).map_err(|e| StorageError::io(dir, e))?;
        // The per-log marker of earlier versions: only a clean close by such a version
        // leaves one (this one never writes it), so it still means what it meant.
        let legacy_marker = dir.join(CLEAN_SHUTDOWN_FILE);
        let legacy_clean = legacy_marker
            .try_exists()
            .map_err(|e| StorageError::io(&legacy_marker, e))?;
        let clean = previous == PreviousShutdown::Clean || legacy_clean;

        // 0. Finish or roll back a segment swap the cleaner was doing (see `cleaner`).
        recover_swap(dir)?;

        // 1. Find the segments; drop leftovers of interrupted operations.
        let mut bases = Vec::new();
        let mut index_files = Vec::new();
        for entry in fs::read_dir(dir).map_err(|e| StorageError::io(dir, e))? {
            let entry = entry.map_err(|e| StorageError::io(dir, e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.ends_with(".tmp") || name.ends_with(".deleted") {
                let p = entry.path();
                fs::remove_file(&p).map_err(|e| StorageError::io(&p, e))?;
            } else if let Some(base) = parse_base_offset(&name, LOG_FILE_SUFFIX) {
                bases.push(base);
            } else if let Some(base) = parse_base_offset(&name, INDEX_FILE_SUFFIX)
                .or_else(|| parse_base_offset(&name, TIME_INDEX_FILE_SUFFIX))
                .or_else(|| parse_base_offset(&name, TXN_INDEX_FILE_SUFFIX))
            {
                index_files.push((base, entry.path()));
            }
        }
        bases.sort_unstable();
        for (base, path) in index_files {
            if bases.binary_search(&base).is_err() {
                fs::remove_file(&path).map_err(|e| StorageError::io(&path, e))?;
            }
        }

        // 2. Open and, where needed, recover each segment.
        let mut segments = BTreeMap::new();
        let count = bases.len();
        for (i, &base) in bases.iter().enumerate() {
            let is_last = i + 1 == count;
            let mut seg = LogSegment::open(
                dir,
                base,
                config.index_interval_bytes,
                config.segment_index_bytes,
                now_ms,
            )?;
            let outcome = if !clean && is_last {
                let o = seg.recover()?;
                // What recovery kept is what readers will see: make it durable.
                seg.flush()?;
                Some(o)
            } else {
                seg.load()?
            };
            if let Some((_, prev)) = segments.last_key_value() {
                let prev: &LogSegment = prev;
                if seg.base_offset() < prev.next_offset() {
                    return Err(StorageError::Corrupt {
                        path: seg.log_path().to_owned(),
                        reason: format!(
                            "segment overlaps the previous one ending at {}",
                            prev.next_offset()
                        ),
                    });
                }
            }
            let truncated = outcome.is_some_and(|o| o.truncated_bytes > 0);
            segments.insert(base, seg);
            if truncated && !is_last {
                // A hole in the middle cannot be filled: drop everything after it.
                tracing::warn!(
                    dir = %dir.display(),
                    base,
                    "corruption in a non-active segment, deleting the segments after it"
                );
                for &later in &bases[i + 1..] {
                    let seg = LogSegment::open(
                        dir,
                        later,
                        config.index_interval_bytes,
                        config.segment_index_bytes,
                        now_ms,
                    )?;
                    seg.delete()?;
                }
                break;
            }
        }

        let log_start_checkpoint = match checkpoint::read_offset(&dir.join(LOG_START_OFFSET_FILE)) {
            Ok(v) => v,
            Err(StorageError::Corrupt { .. }) => None,
            Err(e) => return Err(e),
        };
        if segments.is_empty() {
            let base = log_start_checkpoint.unwrap_or(0).max(0);
            let mut seg = LogSegment::open(
                dir,
                base,
                config.index_interval_bytes,
                config.segment_index_bytes,
                now_ms,
            )?;
            seg.recover()?;
            segments.insert(base, seg);
        }
        let first_base = segments.first_key_value().map_or(0, |(b, _)| *b);
        let log_end = segments
            .last_key_value()
            .map_or(0, |(_, s)| s.next_offset());

        // 3. Offsets: log start from its checkpoint, high watermark clamped to the log.
        let log_start_offset = log_start_checkpoint
            .unwrap_or(first_base)
            .max(first_base)
            .min(log_end);
        let hw = match checkpoint::read_offset(&dir.join(HIGH_WATERMARK_FILE)) {
            Ok(v) => v,
            Err(StorageError::Corrupt { .. }) => None,
            Err(e) => return Err(e),
        };
        let high_watermark = hw
            .unwrap_or(log_start_offset)
            .clamp(log_start_offset, log_end);

        // 4. Leader epochs from their checkpoint, or from the batches; producer state
        //    from the batches. After an unclean shutdown the checkpoint may lack the
        //    newest epochs (a new leader records its epoch without fsync, see `epoch`):
        //    every batch of an epoch newer than the latest known one assigns it, in
        //    offset order, so each such epoch starts at its first batch (Kafka's
        //    recovery does the same). A missing or malformed checkpoint is rebuilt
        //    from all batches.
        let loaded_cache = LeaderEpochFileCache::load(dir)?;
        let rebuild_epochs = loaded_cache.is_none();
        let rederive_epochs = !clean && !rebuild_epochs;
        let mut rederived = false;
        let mut leader_epoch_cache =
            loaded_cache.unwrap_or_else(|| LeaderEpochFileCache::empty(dir));
        // Producer state: from a clean close's snapshot at the log end, with nothing to
        // replay; otherwise from the newest snapshot a roll took at a segment's base
        // offset (everything below it, `.txnindex` files included, was fsynced by that
        // roll), replaying the batches from there; or, without one, from every batch.
        // Snapshots above the log end describe batches a recovery cut off.
        ProducerStateManager::delete_snapshots_above(dir, log_end)?;
        // A clean interrupted between its segment swap and its index rewrite: no index
        // file can be trusted, nor a snapshot that may hold a transaction it closed.
        let indexes_untrusted = transaction_index::needs_rebuild(dir);
        if indexes_untrusted {
            ProducerStateManager::delete_snapshots(dir, None)?;
        }
        let close_snapshot = if clean && !indexes_untrusted {
            ProducerStateManager::read_snapshot(dir, log_end)?
        } else {
            None
        };
        let (replay_from, mut producer_state, mut aborted_below) = match close_snapshot {
            // Consumed here: a crash later in this run replays from a roll's snapshot.
            Some(state) => {
                ProducerStateManager::delete_snapshot(dir, log_end)?;
                (None, state, Vec::new())
            }
            None => {
                match ProducerStateManager::latest_snapshot(dir, |o| segments.contains_key(&o))? {
                    Some((offset, state)) => match txn_indexes_below(dir, &segments, offset)? {
                        Some(entries) => (Some(offset), state, entries),
                        None => (Some(i64::MIN), ProducerStateManager::default(), Vec::new()),
                    },
                    None => (Some(i64::MIN), ProducerStateManager::default(), Vec::new()),
                }
            }
        };
        producer_state.set_partition(&dir.file_name().unwrap_or_default().to_string_lossy());
        // Leader epochs below a roll's snapshot were made durable by that roll, so a
        // rederivation reads from there too; a missing checkpoint reads everything.
        let epochs_from = if rebuild_epochs {
            Some(i64::MIN)
        } else if rederive_epochs {
            Some(replay_from.unwrap_or(i64::MIN))
        } else {
            None
        };
        let scan_from = match (replay_from, epochs_from) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let mut replayed_aborted = Vec::new();
        let mut marker_error = None;
        let mut headers_read = 0u64;
        for seg in segments.values() {
            let Some(scan_from) = scan_from else {
                break;
            };
            if seg.next_offset() <= scan_from {
                continue;
            }
            seg.for_each_header(0, |pos, h| {
                headers_read += 1;
                if h.last_offset() >= log_start_offset {
                    if replay_from.is_some_and(|from| h.base_offset >= from) {
                        match read_marker(seg, pos, h) {
                            Ok(marker) => {
                                replayed_aborted.extend(producer_state.replay(h, marker));
                            }
                            Err(e) => {
                                marker_error = Some(e);
                                return false;
                            }
                        }
                    }
                    if epochs_from.is_some_and(|from| h.base_offset >= from) {
                        let newer = leader_epoch_cache
                            .latest_epoch()
                            .is_none_or(|latest| h.partition_leader_epoch > latest);
                        if rebuild_epochs || newer {
                            rederived |= leader_epoch_cache.assign(
                                h.partition_leader_epoch,
                                h.base_offset.max(log_start_offset),
                            );
                        }
                    }
                }
                true
            })?;
            if let Some(e) = marker_error.take() {
                return Err(e);
            }
        }
        // The aborted-transaction index: the files below the replay's start and what the
        // replay found (the files rewritten to match, as they may miss entries written
        // just before a crash), or, with the producer state from a clean close's
        // snapshot, the files that close left.
        let aborted_txns = if replay_from.is_some() {
            aborted_below.extend(replayed_aborted);
            rewrite_txn_indexes(dir, &segments, &aborted_below)?;
            if indexes_untrusted {
                transaction_index::rebuilt(dir)?;
            }
            aborted_below
        } else {
            load_txn_indexes(dir, &segments)?
        };
        producer_state.on_high_watermark_updated(high_watermark);
        // A tiered log keeps the epochs of its remote part (see `crate::remote`).
        let trimmed = leader_epoch_cache.truncate_from_end(log_end)
            | (!config.remote_storage_enable
                && leader_epoch_cache.truncate_from_start(log_start_offset));
        // An empty rebuilt cache (a new log) has nothing to persist: a missing file
        // rebuilds to the same nothing. What is persisted is written without fsync
        // (Kafka's loader flushes these asynchronously since KAFKA-15046): it is derived
        // from the batches on disk and the log end, so an open after a crash that lost
        // it derives and trims the same again. A clean restart always trims the entry a
        // leader recorded at the end of an empty log, which cost every partition two
        // fsyncs at each start. As with a new leader's entry, a roll makes it durable.
        if rederived || trimmed {
            leader_epoch_cache.flush(Durability::Deferred)?;
        }

        let first_dirty_offset =
            match checkpoint::read_offset(&dir.join(CLEANER_OFFSET_CHECKPOINT_FILE)) {
                Ok(v) => v,
                Err(StorageError::Corrupt { .. }) => None,
                Err(e) => return Err(e),
            }
            .unwrap_or(log_start_offset)
            .clamp(log_start_offset, log_end);

        // 5. A crash from now on is an unclean shutdown: the data directory's marker is
        //    the caller's to remove, an earlier version's marker of this log goes here.
        if legacy_clean {
            fs::remove_file(&legacy_marker).map_err(|e| StorageError::io(&legacy_marker, e))?;
            checkpoint::sync_dir(dir)?;
        }
        tracing::debug!(
            dir = %dir.display(),
            clean,
            segments = segments.len(),
            log_start_offset,
            log_end,
            replay_from = ?replay_from,
            headers_read,
            "log opened"
        );
        let flusher = LogFlusher::new(
            segments
                .last_key_value()
                .map(|(_, s)| (s.log_file(), s.log_path().to_owned())),
            log_end,
        );
        Ok(Self {
            dir: dir.to_owned(),
            config: Arc::new(config),
            segments,
            log_start_offset,
            high_watermark,
            recovery_point: log_end,
            leader_epoch_cache,
            producer_state,
            aborted_txns,
            unflushed_messages: 0,
            last_flush_ms: now_ms,
            flusher,
            first_dirty_offset,
            layout_version: 0,
            clean_in_progress: false,
            earliest_delete_horizon_ms: None,
            offline_cause: None,
            high_watermark_in_file: Cell::new(hw),
            log_start_in_file: Cell::new(log_start_checkpoint),
            highest_offset_in_remote_storage: -1,
            tail_copy_limit: 0,
        })
    }

    /// Applies changed topic configs (IncrementalAlterConfigs); they take effect from the
    /// next append.
    pub fn update_config(&mut self, config: LogConfig) -> Result<(), StorageError> {
        config.validate()?;
        self.config = Arc::new(config);
        Ok(())
    }

    /// The config to validate an append with, without the log: refuses (as the append
    /// itself would, and before any check of the records) when the log is offline.
    pub fn config_for_append(&self) -> Result<Arc<LogConfig>, AppendError> {
        self.check_online()?;
        Ok(Arc::clone(&self.config))
    }

    /// The log's group-commit state (its fsync count, for tests and metrics).
    pub fn flusher(&self) -> &Arc<LogFlusher> {
        &self.flusher
    }

    /// The active segment's `.log`, for the flusher.
    fn active_file(&self) -> Option<(Arc<File>, PathBuf)> {
        self.active_segment()
            .map(|s| (s.log_file(), s.log_path().to_owned()))
    }

    /// The first write or fsync failure of this log, when it is offline.
    pub fn offline_cause(&self) -> Option<&str> {
        self.offline_cause.as_deref()
    }

    /// Refuses a write when the log is offline.
    pub(crate) fn check_online(&self) -> Result<(), StorageError> {
        match &self.offline_cause {
            Some(cause) => Err(StorageError::Offline {
                path: self.dir.clone(),
                cause: cause.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Takes the log offline after a write or fsync failed, and passes the error on.
    pub(crate) fn go_offline(&mut self, e: StorageError) -> StorageError {
        if self.offline_cause.is_none() && !matches!(e, StorageError::Offline { .. }) {
            tracing::error!(dir = %self.dir.display(), error = %e, "log write failed; log is offline");
            let cause = e.to_string();
            self.flusher.fail(&cause);
            self.offline_cause = Some(cause);
        }
        e
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
    pub fn config(&self) -> &LogConfig {
        &self.config
    }
    pub fn log_start_offset(&self) -> i64 {
        self.log_start_offset
    }
    pub fn log_end_offset(&self) -> i64 {
        self.active_segment()
            .map_or(self.log_start_offset, LogSegment::next_offset)
    }
    pub fn high_watermark(&self) -> i64 {
        self.high_watermark
    }
    pub fn recovery_point(&self) -> i64 {
        self.recovery_point
    }
    /// Total bytes of the segment files.
    pub fn size_bytes(&self) -> u64 {
        self.segments.values().map(LogSegment::size).sum()
    }
    pub fn segment_count(&self) -> usize {
        self.segments.len()
    }
    pub fn segment_base_offsets(&self) -> Vec<i64> {
        self.segments.keys().copied().collect()
    }
    /// KIP-890 part 1, before a client's transactional batch of `producer_id` is
    /// appended: `None` when it needs no verification (the producer's transaction is
    /// open here), else the guard to hand to
    /// [`ValidatedRecords::require_txn_verification`] once the transaction coordinator
    /// said this partition is in the producer's transaction; an epoch older than the
    /// producer's here is refused at once (INVALID_PRODUCER_EPOCH).
    /// `supports_epoch_bump`: the producer speaks transaction version 2 (Produce v12+).
    pub fn start_txn_verification(
        &mut self,
        producer_id: i64,
        producer_epoch: i16,
        supports_epoch_bump: bool,
        now_ms: i64,
    ) -> Result<Option<u64>, AppendError> {
        self.producer_state.start_verification(
            producer_id,
            producer_epoch,
            supports_epoch_bump,
            now_ms,
        )
    }

    pub fn producer_state(&self, producer_id: i64) -> Option<&ProducerStateEntry> {
        self.producer_state.get(producer_id)
    }
    /// Every producer the log knows (DescribeProducers).
    /// Forgets the producers idle for `expiration_ms` with no open transaction (see
    /// `ProducerStateManager::remove_expired`); returns how many.
    pub fn remove_expired_producers(&mut self, now_ms: i64, expiration_ms: i64) -> usize {
        self.producer_state.remove_expired(now_ms, expiration_ms)
    }

    pub fn active_producers(&self) -> Vec<ProducerStateEntry> {
        let mut all: Vec<_> = self.producer_state.producers().cloned().collect();
        all.sort_unstable_by_key(|e| e.producer_id);
        all
    }
    /// The open transactions, `(first offset, producer id)`, oldest first.
    pub fn ongoing_txns(&self) -> Vec<(i64, i64)> {
        self.producer_state.ongoing_txns().collect()
    }
    /// The first offset of the oldest transaction that is open or whose marker is not
    /// below the high watermark yet (not clamped to the log start).
    pub fn first_unstable_offset(&self) -> Option<i64> {
        self.producer_state.first_unstable_offset()
    }
    /// The last stable offset: read_committed readers see the records below it only.
    /// Never above the high watermark nor below the log start offset.
    pub fn last_stable_offset(&self) -> i64 {
        match self.producer_state.first_unstable_offset() {
            Some(first) if first < self.high_watermark => first.max(self.log_start_offset),
            _ => self.high_watermark,
        }
    }
    /// The aborted transactions a read from `start_offset` up to `upper_bound_offset`
    /// must report to a read_committed reader (Fetch's `aborted_transactions`).
    pub fn collect_aborted_txns(
        &self,
        start_offset: i64,
        upper_bound_offset: i64,
    ) -> Vec<AbortedTxn> {
        transaction_index::collect_aborted_txns(
            &self.aborted_txns,
            start_offset,
            upper_bound_offset,
        )
    }
    /// Every entry of the aborted-transaction index, oldest marker first.
    pub fn aborted_txns(&self) -> &[AbortedTxn] {
        &self.aborted_txns
    }
    pub fn leader_epoch_cache(&self) -> &LeaderEpochFileCache {
        &self.leader_epoch_cache
    }

    pub(crate) fn active_segment(&self) -> Option<&LogSegment> {
        self.segments.last_key_value().map(|(_, s)| s)
    }

    /// Sets the high watermark, clamped to `[log start, log end]`; returns the value set.
    pub fn update_high_watermark(&mut self, offset: i64) -> i64 {
        self.high_watermark = offset.clamp(self.log_start_offset, self.log_end_offset());
        self.producer_state
            .on_high_watermark_updated(self.high_watermark);
        let hw = self.high_watermark;
        if let Some(active) = self.segments.values_mut().next_back() {
            active.release_tail_below(hw);
        }
        self.high_watermark
    }

    /// How many of the newest bytes a leader keeps in memory for its followers (0: none,
    /// for a follower's log or a leader without followers). The followers' next fetches
    /// are answered from this copy with one send instead of a header read and a
    /// `sendfile`; it is dropped below the high watermark as it moves, and starts again
    /// when an append would take it past `limit`, so it holds at most the records the ISR
    /// has yet to replicate.
    pub fn set_tail_copy_limit(&mut self, limit: usize) {
        self.tail_copy_limit = limit;
        if let Some(active) = self.segments.values_mut().next_back() {
            active.set_tail_copy_limit(limit);
        }
    }

    /// Bytes the active segment's tail copy holds now.
    pub fn tail_copy_len(&self) -> usize {
        self.active_segment().map_or(0, LogSegment::tail_copy_len)
    }

    /// Writes the `high-watermark` checkpoint, unless the file holds the value already:
    /// the retention pass checkpoints every log, and with thousands of idle ones an fsync
    /// each made the pass (and a stop that waited for it) take seconds.
    pub fn checkpoint_high_watermark(&self) -> Result<(), StorageError> {
        if self.high_watermark_in_file.get() == Some(self.high_watermark) {
            return Ok(());
        }
        self.write_high_watermark_checkpoint(Durability::Durable)
    }

    fn write_high_watermark_checkpoint(&self, durability: Durability) -> Result<(), StorageError> {
        let path = self.dir.join(HIGH_WATERMARK_FILE);
        // Unknown until the write is done: a failed write may have left either version.
        self.high_watermark_in_file.set(None);
        checkpoint::write_offset(&path, self.high_watermark, durability)?;
        self.high_watermark_in_file.set(Some(self.high_watermark));
        Ok(())
    }

    pub(crate) fn write_log_start_checkpoint(
        &self,
        offset: i64,
        durability: Durability,
    ) -> Result<(), StorageError> {
        let path = self.dir.join(LOG_START_OFFSET_FILE);
        self.log_start_in_file.set(None);
        checkpoint::write_offset(&path, offset, durability)?;
        self.log_start_in_file.set(Some(offset));
        Ok(())
    }

    /// Validates a record set: framing, size, magic, CRC, count, and the origin's rules;
    /// a client's batches are also checked record by record and re-encoded when the
    /// topic's `compression.type` asks for another codec (see [`crate::validator`]).
    /// `now_ms` is the broker's clock for `message.timestamp.*.max.ms`.
    fn analyze_and_validate(
        config: &LogConfig,
        records: &Bytes,
        origin: AppendOrigin,
        now_ms: i64,
    ) -> Result<Vec<ValidBatch>, AppendError> {
        let mut out = Vec::new();
        let mut rest = records.clone();
        while !rest.is_empty() {
            let batch = RecordBatch::split_from(&mut rest).map_err(AppendError::CorruptMessage)?;
            if origin != AppendOrigin::Replication && batch.size() > config.max_message_bytes {
                return Err(AppendError::MessageTooLarge {
                    size: batch.size(),
                    max: config.max_message_bytes,
                });
            }
            if batch.size() as u64 > config.segment_bytes {
                return Err(AppendError::MessageTooLarge {
                    size: batch.size(),
                    max: config.segment_bytes as usize,
                });
            }
            if origin == AppendOrigin::Replication {
                // A leader's cleaner may have compacted the batch: see `validate_stored`.
                validate_stored(&batch).map_err(corrupt_to_append_error)?;
            } else {
                batch.validate().map_err(corrupt_to_append_error)?;
            }
            if origin == AppendOrigin::Client {
                if batch.is_control() {
                    return Err(AppendError::InvalidRecord(
                        "clients may not write control batches".into(),
                    ));
                }
                if batch.record_count() <= 0 {
                    return Err(AppendError::InvalidRecord("batch holds no records".into()));
                }
                if batch.producer_id() >= 0 && batch.base_sequence() < 0 {
                    return Err(AppendError::InvalidRecord(format!(
                        "invalid sequence number {} for producer {}",
                        batch.base_sequence(),
                        batch.producer_id()
                    )));
                }
                let checks = RecordChecks {
                    require_keys: config.cleanup_policy.is_compact(),
                    timestamp_window: (config.message_timestamp_type
                        == MessageTimestampType::CreateTime)
                        .then_some(TimestampWindow {
                            now_ms,
                            before_max_ms: config.message_timestamp_before_max_ms,
                            after_max_ms: config.message_timestamp_after_max_ms,
                        }),
                };
                let source = batch.compression().map_err(AppendError::CorruptMessage)?;
                let target = config.compression_type.target_codec(source);
                let checked = validate_records(&batch, &checks, target != source)?;
                if target != source {
                    let level = config.compression_level(target);
                    let converted = recompress(&batch, &checked.records, target, level)?;
                    // Kafka checks the size again after a conversion: a batch that grew
                    // (an incompressible payload given a codec's framing) may no longer fit.
                    let max = config.max_message_bytes.min(config.segment_bytes as usize);
                    if converted.size() > max {
                        return Err(AppendError::MessageTooLarge {
                            size: converted.size(),
                            max,
                        });
                    }
                    out.push(ValidBatch {
                        batch: converted,
                        max_timestamp_fix: None,
                    });
                    continue;
                }
                let max_timestamp_fix = checked.max_timestamp.filter(|&ts| {
                    batch.timestamp_type() == TimestampType::CreateTime
                        && ts != batch.max_timestamp()
                });
                out.push(ValidBatch {
                    batch,
                    max_timestamp_fix,
                });
                continue;
            }
            out.push(ValidBatch {
                batch,
                max_timestamp_fix: None,
            });
        }
        Ok(out)
    }

    /// Appends a record set from a producer (or, with `origin`, from a coordinator) as
    /// the partition leader in `leader_epoch`: validates it, drops it as a duplicate when
    /// its producer already wrote it, assigns offsets from the log end by rewriting each
    /// batch's `baseOffset` and `partitionLeaderEpoch` (and `maxTimestamp` and the CRC
    /// under LogAppendTime, or when a CreateTime batch's `maxTimestamp` is not its
    /// largest record timestamp) in a copy of its 61-byte header, then writes each batch as
    /// that header and the rest of the bytes received, with one vectored write.
    ///
    /// `origin` is `Client` or `Coordinator`; `Replication` belongs to
    /// [`Self::append_as_follower`] and is treated as `Coordinator` here.
    ///
    /// A record set from a client is normally one batch (Kafka refuses more for magic 2);
    /// several are accepted, but a duplicate is only recognised as the whole set.
    ///
    /// When the flush policy (`flush.messages`, `flush.ms`) asks for a flush, it is done
    /// before this returns. The broker splits this call so that neither the validation
    /// nor the fsync holds the partition's lock: [`Self::config_for_append`] and
    /// [`Self::validate_records`] without it, [`Self::append_validated_as_leader`] with
    /// it, then the returned [`PendingFlush`] synced without it.
    pub fn append_as_leader(
        &mut self,
        records: Bytes,
        leader_epoch: i32,
        origin: AppendOrigin,
        now_ms: i64,
    ) -> Result<LogAppendInfo, AppendError> {
        let origin = if origin == AppendOrigin::Replication {
            AppendOrigin::Coordinator
        } else {
            origin
        };
        let config = self.config_for_append()?;
        let validated = Self::validate_records(&config, &records, origin, now_ms)?;
        let (info, pending) = self.append_validated_as_leader(validated, leader_epoch, now_ms)?;
        if let Some(pending) = pending {
            self.flush_now(&pending)?;
        }
        Ok(info)
    }

    /// Validates a record set for an append (see [`Self::append_as_leader`]) against
    /// `config`, a snapshot from [`Self::config_for_append`]; needs no log. `origin`
    /// `Replication` validates for [`Self::append_validated_as_follower`].
    pub fn validate_records(
        config: &LogConfig,
        records: &Bytes,
        origin: AppendOrigin,
        now_ms: i64,
    ) -> Result<ValidatedRecords, AppendError> {
        Ok(ValidatedRecords {
            batches: Self::analyze_and_validate(config, records, origin, now_ms)?,
            origin,
            received_bytes: records.len(),
            txn_verification: None,
        })
    }

    /// Syncs a pending flush while holding the log (the callers that do not release it)
    /// and moves the recovery point.
    fn flush_now(&mut self, pending: &PendingFlush) -> Result<(), StorageError> {
        match pending.sync() {
            Ok(done) => {
                self.complete_flush(done);
                Ok(())
            }
            Err(e) => Err(self.go_offline(e)),
        }
    }

    /// Step 3 of group commit (see [`crate::flush`]): what a [`PendingFlush::sync`]
    /// made durable moves the recovery point, never past the log end and not at all
    /// when the log was truncated since the sync started.
    pub fn complete_flush(&mut self, done: FlushDone) {
        if done.generation == self.flusher.generation() {
            self.recovery_point = self
                .recovery_point
                .max(done.synced.min(self.log_end_offset()));
        }
    }

    /// A [`PendingFlush::sync`] failed: the log goes offline (as when a write fails)
    /// and the error is passed on.
    pub fn flush_failed(&mut self, e: StorageError) -> StorageError {
        self.go_offline(e)
    }

    /// The part of [`Self::append_as_leader`] that needs the log: producer state,
    /// offsets, the write. Returns the flush the policy asks for, to be synced before
    /// the append is acknowledged (`None`: nothing to wait for).
    pub fn append_validated_as_leader(
        &mut self,
        validated: ValidatedRecords,
        leader_epoch: i32,
        now_ms: i64,
    ) -> Result<(LogAppendInfo, Option<PendingFlush>), AppendError> {
        // Records validated with the follower's (looser) rules never reach a leader
        // append: `append_as_leader` turns `Replication` into `Coordinator` first.
        let origin = validated.origin;
        if origin == AppendOrigin::Replication {
            return Err(AppendError::InvalidRecord(
                "records validated for a follower append".into(),
            ));
        }
        let txn_verification = validated
            .txn_verification
            .filter(|_| origin == AppendOrigin::Client);
        let batches = validated.batches;
        self.check_online()?;
        let log_append_time =
            self.config.message_timestamp_type == MessageTimestampType::LogAppendTime;
        if batches.is_empty() {
            return Ok((self.empty_append_info(), None));
        }

        // Producer state: duplicates, epochs, sequences, staged until the write is done.
        let mut staged = ProducerAppendInfo::default();
        let mut next = self.log_end_offset();
        for vb in &batches {
            let b = &vb.batch;
            let last = next + i64::from(b.last_offset_delta());
            if b.producer_id() >= 0 {
                let pb = ProducerBatch {
                    producer_id: b.producer_id(),
                    producer_epoch: b.producer_epoch(),
                    base_sequence: b.base_sequence(),
                    last_offset_delta: b.last_offset_delta(),
                    max_timestamp: vb.max_timestamp_fix.unwrap_or_else(|| b.max_timestamp()),
                    is_control: b.is_control(),
                    is_transactional: b.is_transactional(),
                    marker: end_txn_marker(b).map_err(corrupt_to_append_error)?,
                };
                if origin == AppendOrigin::Client {
                    if let Some(dup) = self.producer_state.find_duplicate(&pb) {
                        if batches.len() > 1 {
                            return Err(AppendError::InvalidRecord(
                                "duplicate batch inside a multi-batch record set".into(),
                            ));
                        }
                        // The original append made (or is making) its own flush; a
                        // retry of it is answered only when that one is done too.
                        let pending = self.flush_pending_for(dup.last_offset + 1);
                        let info = LogAppendInfo {
                            first_offset: dup.first_offset(),
                            last_offset: dup.last_offset,
                            max_timestamp: dup.timestamp,
                            offset_of_max_timestamp: dup.last_offset,
                            log_append_time_ms: if log_append_time { dup.timestamp } else { -1 },
                            log_start_offset: self.log_start_offset,
                            record_count: i64::from(dup.offset_delta) + 1,
                            valid_bytes: 0,
                            duplicate: true,
                        };
                        return Ok((info, pending));
                    }
                }
                if let Some(guard) = txn_verification {
                    if !self.producer_state.verified(&staged, &pb, guard) {
                        return Err(AppendError::InvalidTxnState {
                            producer_id: pb.producer_id,
                            reason:
                                "the partition was not verified to be in the producer's transaction",
                        });
                    }
                }
                self.producer_state
                    .validate_and_stage(&mut staged, &pb, last, origin)?;
            }
            next = last + 1;
        }

        // No copy of the batches: each is written as its header, rewritten here, and
        // the rest of its bytes as they came (the frame's `Bytes` stays alive through
        // `batches` until the write is done).
        let mut headers = Vec::with_capacity(batches.len());
        let first_offset = self.log_end_offset();
        let mut offset = first_offset;
        let mut summaries = Vec::with_capacity(batches.len());
        let mut max_timestamp = -1i64;
        let mut offset_of_max_timestamp = -1i64;
        let mut record_count = 0i64;
        let mut valid_bytes = 0usize;
        for vb in &batches {
            let size = vb.batch.size();
            let (head, body) = vb.batch.as_bytes().split_at(HEADER_LEN);
            let mut header = [0u8; HEADER_LEN];
            header.copy_from_slice(head);
            set_base_offset(&mut header, offset);
            set_partition_leader_epoch(&mut header, leader_epoch);
            let batch_max_ts = if log_append_time {
                set_log_append_time_split(&mut header, body, now_ms);
                now_ms
            } else if let Some(ts) = vb.max_timestamp_fix {
                set_max_timestamp_split(&mut header, body, ts);
                ts
            } else {
                vb.batch.max_timestamp()
            };
            headers.push(header);
            let last = offset + i64::from(vb.batch.last_offset_delta());
            if batch_max_ts > max_timestamp {
                max_timestamp = batch_max_ts;
                offset_of_max_timestamp = last;
            }
            record_count += i64::from(vb.batch.last_offset_delta()) + 1;
            valid_bytes += size;
            summaries.push((
                offset,
                leader_epoch,
                BatchSummary {
                    last_offset: last,
                    max_timestamp: batch_max_ts,
                    size: size as u64,
                },
            ));
            offset = last + 1;
        }
        let parts: Vec<[&[u8]; 2]> = batches
            .iter()
            .zip(&headers)
            .map(|(vb, header)| [&header[..], &vb.batch.as_bytes()[HEADER_LEN..]])
            .collect();
        self.append_batches(&parts, &summaries, now_ms)
            .map_err(|e| self.go_offline(e))?;
        let aborted = self.producer_state.apply(staged);
        self.record_aborted_txns(aborted)
            .map_err(|e| self.go_offline(e))?;
        let pending = self.after_append(record_count, now_ms);
        let info = LogAppendInfo {
            first_offset,
            last_offset: offset - 1,
            max_timestamp,
            offset_of_max_timestamp,
            log_append_time_ms: if log_append_time { now_ms } else { -1 },
            log_start_offset: self.log_start_offset,
            record_count,
            valid_bytes,
            duplicate: false,
        };
        Ok((info, pending))
    }

    /// Appends batches copied from the leader, keeping their offsets and epochs. Each
    /// batch must start at or after the end of the previous one (and the first at or
    /// after the log end); gaps, which compaction on the leader creates, are kept.
    ///
    /// As [`Self::append_as_leader`], a flush the policy asks for is done before this
    /// returns; the broker splits the call the same way.
    pub fn append_as_follower(
        &mut self,
        records: Bytes,
        now_ms: i64,
    ) -> Result<LogAppendInfo, AppendError> {
        let config = self.config_for_append()?;
        let validated =
            Self::validate_records(&config, &records, AppendOrigin::Replication, now_ms)?;
        let (info, pending) = self.append_validated_as_follower(validated, now_ms)?;
        if let Some(pending) = pending {
            self.flush_now(&pending)?;
        }
        Ok(info)
    }

    /// The part of [`Self::append_as_follower`] that needs the log, for records
    /// validated with origin `Replication`; returns the flush to sync, as
    /// [`Self::append_validated_as_leader`] does.
    pub fn append_validated_as_follower(
        &mut self,
        validated: ValidatedRecords,
        now_ms: i64,
    ) -> Result<(LogAppendInfo, Option<PendingFlush>), AppendError> {
        if validated.origin != AppendOrigin::Replication {
            return Err(AppendError::InvalidRecord(
                "records validated for a leader append".into(),
            ));
        }
        let received_bytes = validated.received_bytes;
        let batches = validated.batches;
        self.check_online()?;
        if batches.is_empty() {
            return Ok((self.empty_append_info(), None));
        }
        let mut expected = self.log_end_offset();
        let mut summaries = Vec::with_capacity(batches.len());
        let mut max_timestamp = -1i64;
        let mut offset_of_max_timestamp = -1i64;
        let mut record_count = 0i64;
        for vb in &batches {
            let b = &vb.batch;
            if b.base_offset() < expected {
                return Err(AppendError::OffsetsOutOfOrder {
                    expected,
                    found: b.base_offset(),
                });
            }
            if b.max_timestamp() > max_timestamp {
                max_timestamp = b.max_timestamp();
                offset_of_max_timestamp = b.last_offset();
            }
            record_count += i64::from(b.last_offset_delta()) + 1;
            summaries.push((
                b.base_offset(),
                b.partition_leader_epoch(),
                BatchSummary {
                    last_offset: b.last_offset(),
                    max_timestamp: b.max_timestamp(),
                    size: b.size() as u64,
                },
            ));
            expected = b.next_offset();
        }
        let parts: Vec<[&[u8]; 2]> = batches
            .iter()
            .map(|vb| [&vb.batch.as_bytes()[..], &[][..]])
            .collect();
        self.append_batches(&parts, &summaries, now_ms)
            .map_err(|e| self.go_offline(e))?;
        let mut aborted = Vec::new();
        for vb in &batches {
            let mut hb = [0u8; HEADER_LEN];
            hb.copy_from_slice(&vb.batch.as_bytes()[..HEADER_LEN]);
            // A marker the leader wrote is read as the leader read it; one that cannot
            // be read (which the leader would have refused) changes no transaction.
            let marker = end_txn_marker(&vb.batch).unwrap_or_else(|e| {
                tracing::warn!(dir = %self.dir.display(), error = %e, "unreadable replicated marker");
                None
            });
            aborted.extend(
                self.producer_state
                    .replay(&crate::header::BatchHeader::parse(&hb), marker),
            );
        }
        self.record_aborted_txns(aborted)
            .map_err(|e| self.go_offline(e))?;
        let pending = self.after_append(record_count, now_ms);
        let first = summaries.first().map_or(-1, |s| s.0);
        let last = summaries.last().map_or(-1, |s| s.2.last_offset);
        let info = LogAppendInfo {
            first_offset: first,
            last_offset: last,
            max_timestamp,
            offset_of_max_timestamp,
            log_append_time_ms: -1,
            log_start_offset: self.log_start_offset,
            record_count,
            valid_bytes: received_bytes,
            duplicate: false,
        };
        Ok((info, pending))
    }

    fn empty_append_info(&self) -> LogAppendInfo {
        LogAppendInfo {
            first_offset: -1,
            last_offset: -1,
            max_timestamp: -1,
            offset_of_max_timestamp: -1,
            log_append_time_ms: -1,
            log_start_offset: self.log_start_offset,
            record_count: 0,
            valid_bytes: 0,
            duplicate: false,
        }
    }

    /// Writes validated batches (`(base offset, leader epoch, summary)` each, its bytes
    /// the concatenation of its `parts`), rolling segments as needed between batches, and
    /// records each batch's epoch in the leader epoch cache first.
    fn append_batches(
        &mut self,
        parts: &[[&[u8]; 2]],
        batches: &[(i64, i32, BatchSummary)],
        now_ms: i64,
    ) -> Result<(), StorageError> {
        debug_assert_eq!(parts.len(), batches.len());
        let mut epochs_changed = false;
        for &(base, epoch, _) in batches {
            epochs_changed |= self.leader_epoch_cache.assign(epoch, base);
        }
        if epochs_changed {
            // Before the data: a crash in between leaves an entry past the log end,
            // which open trims; the reverse order could lose an epoch boundary.
            self.leader_epoch_cache.flush(Durability::Durable)?;
        }
        let mut pending_start = 0usize; // index in `batches` of the first pending batch
        let mut pending_len = 0u64;
        let mut pending: Vec<BatchSummary> = Vec::new();
        for (i, &(base, _, summary)) in batches.iter().enumerate() {
            if self.should_roll(pending_len, &summary, base, now_ms) {
                if !pending.is_empty() {
                    let flat: Vec<&[u8]> =
                        parts[pending_start..i].iter().flatten().copied().collect();
                    self.active_mut()?.append_vectored(&flat, &pending)?;
                    pending_start = i;
                    pending_len = 0;
                    pending.clear();
                }
                self.roll(base, now_ms)?;
            }
            pending_len += summary.size;
            pending.push(summary);
        }
        if !pending.is_empty() {
            let flat: Vec<&[u8]> = parts[pending_start..].iter().flatten().copied().collect();
            self.active_mut()?.append_vectored(&flat, &pending)?;
        }
        Ok(())
    }

    fn active_mut(&mut self) -> Result<&mut LogSegment, StorageError> {
        let dir = self.dir.clone();
        self.segments
            .last_entry()
            .map(|e| e.into_mut())
            .ok_or(StorageError::Corrupt {
                path: dir,
                reason: "log has no segment".into(),
            })
    }

    /// Kafka's `shouldRoll`, for a batch about to be added after `pending_len` bytes not
    /// yet written to the active segment.
    fn should_roll(
        &self,
        pending_len: u64,
        b: &BatchSummary,
        base_offset: i64,
        now_ms: i64,
    ) -> bool {
        let Some(active) = self.active_segment() else {
            return true;
        };
        let used = active.size() + pending_len;
        let offsets_fit = b.last_offset - active.base_offset() <= i64::from(i32::MAX)
            && base_offset >= active.base_offset();
        if used == 0 {
            // An empty segment is only replaced when the offsets cannot be stored in it.
            return !offsets_fit;
        }
        used + b.size > self.config.segment_bytes
            || active.time_waited_for_roll(now_ms, b.max_timestamp) >= self.config.max_segment_ms()
            || active.indexes_full()
            || !offsets_fit
    }

    /// The producer snapshots to keep whatever their number: on a tiered log, those of
    /// segments not yet in the remote tier, whose copies carry them.
    fn snapshot_keep_above(&self) -> i64 {
        if self.config.remote_storage_enable {
            self.highest_offset_in_remote_storage + 1
        } else {
            i64::MAX
        }
    }

    /// Makes a new active segment at `base_offset`, after making the old one durable.
    pub(crate) fn roll(&mut self, base_offset: i64, now_ms: i64) -> Result<(), StorageError> {
        self.check_online()?;
        let started = std::time::Instant::now();
        if let Some(mut entry) = self.segments.last_entry() {
            if entry.get().size() == 0 {
                // Nothing to keep: replace the empty segment.
                entry.remove().delete()?;
            } else {
                entry.get_mut().on_become_inactive()?;
                // Its ABORT markers' entries were appended without fsync; the snapshot
                // below makes a recovery trust this file instead of the markers.
                transaction_index::sync(&crate::segment::segment_file(
                    &self.dir,
                    *entry.key(),
                    TXN_INDEX_FILE_SUFFIX,
                ))?;
                self.recovery_point = self.recovery_point.max(entry.get().next_offset());
                self.flusher.record_synced(entry.get().next_offset());
            }
        }
        // An epoch recorded without fsync (by a new leader) may start in the segment
        // that stops being the active one. Recovery would find it again from the
        // batches, but once the segment is inactive the cleaner may remove the epoch's
        // first batch, and the epoch would be found starting later: make the entry
        // durable while the segment is still whole.
        if self.leader_epoch_cache.is_deferred() {
            self.leader_epoch_cache.flush(Durability::Durable)?;
        }
        // The producer state at the new segment's base, so that a recovery reads the
        // batch headers from here on only (Kafka takes its snapshot at each roll too).
        // Not while a decided transaction's marker is above the high watermark: a
        // snapshot cannot say that it still holds the LSO back (see `producer_state`).
        if !self.producer_state.has_unreplicated_txns() {
            self.producer_state.write_snapshot(
                &self.dir,
                base_offset,
                self.snapshot_keep_above(),
                Durability::Durable,
            )?;
        }
        let mut seg = LogSegment::create(
            &self.dir,
            base_offset,
            self.config.index_interval_bytes,
            self.config.segment_index_bytes,
            now_ms,
        )?;
        checkpoint::sync_dir(&self.dir)?;
        crate::flush::flushed(started);
        tracing::debug!(dir = %self.dir.display(), base_offset, "rolled new log segment");
        if let Some(previous) = self.segments.values_mut().next_back() {
            previous.set_tail_copy_limit(0);
        }
        seg.set_tail_copy_limit(self.tail_copy_limit);
        self.segments.insert(base_offset, seg);
        // Only now, with the old segment fsynced: a sync of the new file must cover
        // everything below the log end (see `crate::flush`).
        self.flusher
            .record_written(self.active_file(), self.log_end_offset());
        Ok(())
    }

    /// After a write: tells the flusher what a sync would now cover, and returns the
    /// flush the policy asks for. The policy's counters restart here rather than when
    /// the fsync is done: the caller syncs before it acknowledges anything and a failed
    /// sync takes the log offline, so the flush is as good as done for the policy, and
    /// each of several concurrent appends under `flush.messages=1` gets its own promise
    /// (which one shared fsync may then fulfil).
    fn after_append(&mut self, record_count: i64, now_ms: i64) -> Option<PendingFlush> {
        self.flusher
            .record_written(self.active_file(), self.log_end_offset());
        self.unflushed_messages += record_count.max(0) as u64;
        let by_count = self
            .config
            .flush_messages
            .is_some_and(|n| self.unflushed_messages >= n);
        let by_time = self
            .config
            .flush_ms
            .is_some_and(|ms| now_ms - self.last_flush_ms >= ms);
        if by_count || by_time {
            self.unflushed_messages = 0;
            self.last_flush_ms = now_ms;
            Some(self.flusher.pending())
        } else {
            None
        }
    }

    /// A flush for a retried (duplicate) append whose records end before `end`: `None`
    /// when they are known to be durable, or no flush policy is set.
    fn flush_pending_for(&self, end: i64) -> Option<PendingFlush> {
        let policy = self.config.flush_messages.is_some() || self.config.flush_ms.is_some();
        (policy && self.recovery_point < end).then(|| self.flusher.pending())
    }

    /// Whole batches from the one containing `start_offset`, at most `max_bytes` of them
    /// (but the first one whatever its size when `min_one_message`, KIP-74), none holding
    /// an offset at or beyond `max_offset` (pass the high watermark for consumers and the
    /// log end offset for followers). Reads from one segment, as Kafka does: a read that
    /// reaches a segment's end returns what it has.
    pub fn read(
        &self,
        start_offset: i64,
        max_bytes: usize,
        max_offset: i64,
        min_one_message: bool,
    ) -> Result<FetchDataInfo, ReadError> {
        self.read_inner(start_offset, max_bytes, max_offset, min_one_message, true)
    }

    /// As [`UnifiedLog::read`] but without reading the records: `records` is empty and
    /// `file_range` alone says which bytes of which segment file to send (zero-copy fetch).
    pub fn read_file_range(
        &self,
        start_offset: i64,
        max_bytes: usize,
        max_offset: i64,
        min_one_message: bool,
    ) -> Result<FetchDataInfo, ReadError> {
        self.read_inner(start_offset, max_bytes, max_offset, min_one_message, false)
    }

    fn read_inner(
        &self,
        start_offset: i64,
        max_bytes: usize,
        max_offset: i64,
        min_one_message: bool,
        load: bool,
    ) -> Result<FetchDataInfo, ReadError> {
        let log_end = self.log_end_offset();
        if start_offset < self.log_start_offset || start_offset > log_end {
            return Err(ReadError::OffsetOutOfRange {
                offset: start_offset,
                log_start: self.log_start_offset,
                log_end,
            });
        }
        let floor = self
            .segments
            .range(..=start_offset)
            .next_back()
            .map(|(b, _)| *b);
        if start_offset < log_end && start_offset < max_offset {
            if let Some(floor) = floor {
                for seg in self.segments.range(floor..).map(|(_, s)| s) {
                    let info = if load {
                        seg.read(start_offset, max_bytes, max_offset, min_one_message)?
                    } else {
                        seg.read_range(start_offset, max_bytes, max_offset, min_one_message)?
                    };
                    if let Some(info) = info {
                        return Ok(info);
                    }
                }
            }
        }
        let (base, pos) = self
            .active_segment()
            .map_or((log_end, 0), |s| (s.base_offset(), s.size()));
        Ok(FetchDataInfo::empty(start_offset, base, pos))
    }

    /// ListOffsets by timestamp: the first record whose timestamp is `>= timestamp`, at or
    /// after the log start offset. The time index narrows the search to a few batches;
    /// the first batch whose max timestamp reaches `timestamp` is then read. For an
    /// uncompressed CreateTime batch the answer is the exact record (offset and its own
    /// timestamp); for a LogAppendTime batch it is the batch's first record (all share
    /// the batch timestamp); for a compressed batch it is the batch's base offset with
    /// the batch's max timestamp. The epoch is the batch's `partitionLeaderEpoch`.
    pub fn offset_for_timestamp(
        &self,
        timestamp: i64,
    ) -> Result<Option<TimestampAndOffset>, StorageError> {
        for seg in self.segments.values() {
            if seg.max_timestamp_so_far() < timestamp || seg.next_offset() <= self.log_start_offset
            {
                continue;
            }
            let from_offset = seg
                .time_index()
                .lookup(timestamp)
                .map_or(seg.base_offset(), |(_, o)| o)
                .max(self.log_start_offset);
            let (_, pos) = seg.offset_index().lookup(from_offset);
            let mut found = None;
            seg.for_each_header(u64::from(pos), |p, h| {
                if h.max_timestamp >= timestamp && h.last_offset() >= self.log_start_offset {
                    found = Some((p, *h));
                    false
                } else {
                    true
                }
            })?;
            if let Some((p, h)) = found {
                let Some(batch) = seg.read_batch(p, &h)? else {
                    continue;
                };
                let (offset, ts) = first_record_at_or_after(&batch, timestamp)
                    .unwrap_or((h.base_offset, h.max_timestamp));
                return Ok(Some(TimestampAndOffset {
                    timestamp: ts,
                    offset: offset.max(self.log_start_offset),
                    leader_epoch: (h.partition_leader_epoch >= 0)
                        .then_some(h.partition_leader_epoch),
                }));
            }
        }
        Ok(None)
    }

    /// ListOffsets MAX_TIMESTAMP (KIP-734): the record with the greatest timestamp (the
    /// first such), resolved to the record as [`Self::offset_for_timestamp`] does.
    /// `None` when no batch carries a timestamp.
    pub fn max_timestamp_and_offset(&self) -> Result<Option<TimestampAndOffset>, StorageError> {
        let mut best: Option<&LogSegment> = None;
        for seg in self.segments.values() {
            if seg.max_timestamp_so_far() >= 0
                && best.is_none_or(|b| seg.max_timestamp_so_far() > b.max_timestamp_so_far())
            {
                best = Some(seg);
            }
        }
        let Some(seg) = best else { return Ok(None) };
        let max = seg.max_timestamp_so_far();
        let Some((pos, h)) = seg.translate_offset(seg.offset_of_max_timestamp_so_far())? else {
            return Ok(None);
        };
        let Some(batch) = seg.read_batch(pos, &h)? else {
            return Ok(None);
        };
        let (offset, ts) = first_record_at_or_after(&batch, max).unwrap_or((h.last_offset(), max));
        Ok(Some(TimestampAndOffset {
            timestamp: ts,
            offset,
            leader_epoch: (h.partition_leader_epoch >= 0).then_some(h.partition_leader_epoch),
        }))
    }

    /// Removes everything from `target_offset` on (a follower truncating to the leader's
    /// epoch end offset). Whole batches go: a batch containing `target_offset` is
    /// removed entirely, so the log end may end up below it. Returns whether anything
    /// was removed.
    pub fn truncate_to(&mut self, target_offset: i64, now_ms: i64) -> Result<bool, StorageError> {
        if target_offset >= self.log_end_offset() {
            return Ok(false);
        }
        // First, so that a sync in flight does not move the recovery point even when
        // the truncation fails half-way (see `crate::flush`).
        self.flusher.record_truncated(None, target_offset);
        let first_base = self.segments.first_key_value().map_or(0, |(b, _)| *b);
        if target_offset <= first_base {
            self.truncate_fully_and_start_at(target_offset.max(0), now_ms)?;
            return Ok(true);
        }
        let doomed: Vec<i64> = self
            .segments
            .range(target_offset..)
            .map(|(b, _)| *b)
            .collect();
        for base in doomed {
            if let Some(seg) = self.segments.remove(&base) {
                seg.delete()?;
            }
        }
        let active = self.active_mut()?;
        active.truncate_to(target_offset, now_ms)?;
        active.flush()?;
        checkpoint::sync_dir(&self.dir)?;
        let log_end = self.log_end_offset();
        if self.leader_epoch_cache.truncate_from_end(log_end) {
            self.leader_epoch_cache.flush(Durability::Durable)?;
        }
        // As Kafka: a truncation below the log start moves the log start down with it.
        self.log_start_offset = self.log_start_offset.min(log_end);
        self.high_watermark = self.high_watermark.min(log_end);
        ProducerStateManager::delete_snapshots_above(&self.dir, log_end)?;
        self.rebuild_producer_state()?;
        self.layout_version += 1;
        self.first_dirty_offset = self.first_dirty_offset.min(log_end);
        self.checkpoint_first_dirty_offset()?;
        self.recovery_point = self.recovery_point.min(log_end);
        self.flusher.record_truncated(self.active_file(), log_end);
        Ok(true)
    }

    /// Deletes every segment and starts an empty log at `offset` (a follower far behind
    /// a leader whose log starts later).
    pub fn truncate_fully_and_start_at(
        &mut self,
        offset: i64,
        now_ms: i64,
    ) -> Result<(), StorageError> {
        self.flusher.record_truncated(None, offset);
        for (_, seg) in std::mem::take(&mut self.segments) {
            seg.delete()?;
        }
        let seg = LogSegment::create(
            &self.dir,
            offset,
            self.config.index_interval_bytes,
            self.config.segment_index_bytes,
            now_ms,
        )?;
        self.segments.insert(offset, seg);
        checkpoint::sync_dir(&self.dir)?;
        self.log_start_offset = offset;
        self.high_watermark = offset;
        self.recovery_point = offset;
        self.flusher.record_truncated(self.active_file(), offset);
        self.layout_version += 1;
        self.first_dirty_offset = offset;
        self.checkpoint_first_dirty_offset()?;
        self.leader_epoch_cache.clear();
        self.leader_epoch_cache.flush(Durability::Durable)?;
        self.producer_state.clear();
        ProducerStateManager::delete_snapshots(&self.dir, None)?;
        self.aborted_txns.clear();
        self.write_log_start_checkpoint(offset, Durability::Durable)?;
        self.checkpoint_high_watermark()
    }

    /// Moves the log start offset up (DeleteRecords, retention), not beyond the high
    /// watermark. Segments are not deleted here; reads below it are refused.
    pub fn maybe_increment_log_start_offset(&mut self, offset: i64) -> Result<bool, StorageError> {
        let offset = offset.min(self.high_watermark);
        if offset <= self.log_start_offset {
            return Ok(false);
        }
        self.log_start_offset = offset;
        self.trim_aborted_txns();
        // A tiered log keeps the epochs of its remote part (see `crate::remote`): a
        // follower moves its local log start up to the leader's at every fetch, and
        // would otherwise forget the epochs that place the remote copies in its lineage.
        if !self.config.remote_storage_enable && self.leader_epoch_cache.truncate_from_start(offset)
        {
            self.leader_epoch_cache.flush(Durability::Durable)?;
        }
        self.write_log_start_checkpoint(offset, Durability::Durable)?;
        Ok(true)
    }

    /// Rebuilds the producer state and the aborted-transaction index from the log (after
    /// a truncation), and rewrites the `.txnindex` files to match.
    fn rebuild_producer_state(&mut self) -> Result<(), StorageError> {
        let mut state = ProducerStateManager::default();
        state.set_partition(&self.dir.file_name().unwrap_or_default().to_string_lossy());
        let mut aborted = Vec::new();
        let log_start = self.log_start_offset;
        for seg in self.segments.values() {
            let mut failed = None;
            seg.for_each_header(0, |pos, h| {
                if h.last_offset() >= log_start {
                    match read_marker(seg, pos, h) {
                        Ok(marker) => aborted.extend(state.replay(h, marker)),
                        Err(e) => {
                            failed = Some(e);
                            return false;
                        }
                    }
                }
                true
            })?;
            if let Some(e) = failed {
                return Err(e);
            }
        }
        state.on_high_watermark_updated(self.high_watermark);
        self.producer_state = state;
        rewrite_txn_indexes(&self.dir, &self.segments, &aborted)?;
        self.aborted_txns = aborted;
        Ok(())
    }

    /// Adds the entries of ABORT markers just appended, in memory and in the `.txnindex`
    /// of the segment holding each marker (no fsync: see [`crate::transaction_index`]).
    fn record_aborted_txns(&mut self, aborted: Vec<AbortedTxn>) -> Result<(), StorageError> {
        for txn in aborted {
            let base = self
                .segments
                .range(..=txn.last_offset)
                .next_back()
                .map_or(txn.last_offset, |(b, _)| *b);
            transaction_index::append(
                &crate::segment::segment_file(&self.dir, base, TXN_INDEX_FILE_SUFFIX),
                &[txn],
            )?;
            self.aborted_txns.push(txn);
        }
        Ok(())
    }

    /// Forgets the aborted transactions whose marker is below the log start: no read
    /// can start before it (their files went with their segments).
    pub(crate) fn trim_aborted_txns(&mut self) {
        let start = self.log_start_offset;
        let keep_from = self.aborted_txns.partition_point(|t| t.last_offset < start);
        self.aborted_txns.drain(..keep_from);
    }

    /// Writes every segment's `.txnindex` from memory (after the cleaner replaced
    /// segments, whose files named the old bases).
    pub(crate) fn rewrite_txn_indexes(&self) -> Result<(), StorageError> {
        rewrite_txn_indexes(&self.dir, &self.segments, &self.aborted_txns)
    }

    pub fn latest_epoch(&self) -> Option<i32> {
        self.leader_epoch_cache.latest_epoch()
    }

    /// The epoch of the batch holding `offset` (for ListOffsets and fetch validation).
    pub fn leader_epoch_for_offset(&self, offset: i64) -> Option<i32> {
        self.leader_epoch_cache.epoch_for_offset(offset)
    }

    /// OffsetForLeaderEpoch: `(epoch, end offset)`, see
    /// [`LeaderEpochFileCache::end_offset_for`].
    pub fn end_offset_for_epoch(&self, epoch: i32) -> (i32, i64) {
        self.leader_epoch_cache
            .end_offset_for(epoch, self.log_end_offset())
    }

    /// Records that `epoch` starts at `start_offset` (a replica becoming leader records its
    /// log end offset before the first append in the new epoch). The checkpoint is
    /// written without fsync (KAFKA-15046): why a crash cannot lose anything that
    /// matters is in [`crate::epoch`].
    pub fn assign_epoch_start_offset(
        &mut self,
        epoch: i32,
        start_offset: i64,
    ) -> Result<(), StorageError> {
        if self.leader_epoch_cache.assign(epoch, start_offset) {
            self.leader_epoch_cache.flush(Durability::Deferred)?;
        }
        Ok(())
    }

    /// Fsyncs the active segment (older ones were fsynced when rolled).
    pub fn flush(&mut self) -> Result<(), StorageError> {
        self.check_online()?;
        if let Some(active) = self.active_segment() {
            // Never retried: after a failed fsync the kernel may have dropped the dirty
            // pages, and a second fsync that succeeds would prove nothing.
            if let Err(e) = active.flush() {
                return Err(self.go_offline(e));
            }
        }
        self.recovery_point = self.log_end_offset();
        self.flusher.record_synced(self.recovery_point);
        self.unflushed_messages = 0;
        Ok(())
    }

    /// Writes the active segment's index entries and the checkpoints (high watermark,
    /// log start and leader epochs where the file does not hold them already, the
    /// producer state always) so that the next open can skip recovery — without any
    /// fsync: nothing is durable when this returns. The owner
    /// of the data directory makes every closed log durable at once (one `syncfs`) and
    /// only then records the clean shutdown (see [`crate::clean_shutdown`]); until it
    /// does, the next open must be [`PreviousShutdown::Unclean`]. An offline log
    /// writes nothing and returns its error.
    pub fn close(mut self) -> Result<(), StorageError> {
        self.check_online()?;
        let written = self.write_close_checkpoints();
        written.map_err(|e| self.go_offline(e))
    }

    fn write_close_checkpoints(&mut self) -> Result<(), StorageError> {
        if let Some(active) = self.active_segment() {
            active.write_indexes()?;
        }
        // A file that already holds the value is not written again: every rewrite
        // allocates an inode for its temporary file, and with 10,000 mostly idle logs
        // those allocations were most of a clean stop. What is in the file (durable or
        // not) becomes durable with the caller's syncfs like everything else.
        if self.high_watermark_in_file.get() != Some(self.high_watermark) {
            self.write_high_watermark_checkpoint(Durability::Deferred)?;
        }
        if self.log_start_in_file.get() != Some(self.log_start_offset) {
            self.write_log_start_checkpoint(self.log_start_offset, Durability::Deferred)?;
        }
        if !self.leader_epoch_cache.is_in_file() {
            self.leader_epoch_cache.flush(Durability::Deferred)?;
        }
        if self.producer_state.has_unreplicated_txns() {
            // The snapshot cannot say that a closed transaction still holds the LSO
            // back; without one the next open replays the log and finds it.
            return Ok(());
        }
        self.producer_state.write_snapshot(
            &self.dir,
            self.log_end_offset(),
            self.snapshot_keep_above(),
            Durability::Deferred,
        )
    }

    /// Removes the partition directory and everything in it.
    pub fn delete(self) -> Result<(), StorageError> {
        let dir = self.dir.clone();
        drop(self);
        fs::remove_dir_all(&dir).map_err(|e| StorageError::io(&dir, e))
    }
}

/// The transaction marker of the batch at `pos`, read only for a control batch.
fn read_marker(
    seg: &LogSegment,
    pos: u64,
    h: &crate::header::BatchHeader,
) -> Result<Option<EndTxnMarker>, StorageError> {
    if !h.is_control() || h.producer_id < 0 {
        return Ok(None);
    }
    let Some(batch) = seg.read_batch(pos, h)? else {
        return Ok(None);
    };
    Ok(end_txn_marker(&batch).unwrap_or_else(|e| {
        tracing::warn!(path = %seg.log_path().display(), pos, error = %e, "unreadable transaction marker");
        None
    }))
}

/// Writes each segment's `.txnindex` with the entries of `aborted` whose marker it
/// holds, removes the others (and those of segments that are gone).
fn rewrite_txn_indexes(
    dir: &Path,
    segments: &BTreeMap<i64, LogSegment>,
    aborted: &[AbortedTxn],
) -> Result<(), StorageError> {
    for entry in fs::read_dir(dir).map_err(|e| StorageError::io(dir, e))? {
        let entry = entry.map_err(|e| StorageError::io(dir, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(base) = parse_base_offset(&name, TXN_INDEX_FILE_SUFFIX) {
            let mine = segment_entries(segments, base, aborted);
            if !segments.contains_key(&base) || mine.is_empty() {
                transaction_index::remove(&entry.path())?;
            }
        }
    }
    for &base in segments.keys() {
        let mine = segment_entries(segments, base, aborted);
        if !mine.is_empty() {
            let path = crate::segment::segment_file(dir, base, TXN_INDEX_FILE_SUFFIX);
            if transaction_index::read(&path)?.as_deref() != Some(mine) {
                transaction_index::write(&path, mine)?;
            }
        }
    }
    Ok(())
}

/// The entries of `aborted` (sorted by marker offset) whose marker lies in the segment
/// based at `base`.
fn segment_entries<'a>(
    segments: &BTreeMap<i64, LogSegment>,
    base: i64,
    aborted: &'a [AbortedTxn],
) -> &'a [AbortedTxn] {
    let next_base = segments
        .range(base + 1..)
        .next()
        .map_or(i64::MAX, |(b, _)| *b);
    let from = aborted.partition_point(|t| t.last_offset < base);
    let to = aborted.partition_point(|t| t.last_offset < next_base);
    &aborted[from..to.max(from)]
}

/// The entries of every segment's `.txnindex`, by marker offset. A file that cannot be
/// read counts as empty, with a warning: the index then misses aborted transactions,
/// which only a rebuild (an unclean open) would restore.
fn load_txn_indexes(
    dir: &Path,
    segments: &BTreeMap<i64, LogSegment>,
) -> Result<Vec<AbortedTxn>, StorageError> {
    let mut all = Vec::new();
    for &base in segments.keys() {
        let path = crate::segment::segment_file(dir, base, TXN_INDEX_FILE_SUFFIX);
        match transaction_index::read(&path)? {
            Some(entries) => all.extend(entries),
            None if path.exists() => {
                tracing::warn!(path = %path.display(), "unreadable transaction index ignored");
            }
            None => {}
        }
    }
    all.sort_by_key(|t| t.last_offset);
    Ok(all)
}

/// The entries of the `.txnindex` files of the segments below `offset` (a segment
/// base), sorted by marker offset; `None` when one of them cannot be read, so that the
/// caller replays the whole log instead.
fn txn_indexes_below(
    dir: &Path,
    segments: &BTreeMap<i64, LogSegment>,
    offset: i64,
) -> Result<Option<Vec<AbortedTxn>>, StorageError> {
    let mut all = Vec::new();
    for &base in segments.range(..offset).map(|(b, _)| b) {
        let path = crate::segment::segment_file(dir, base, TXN_INDEX_FILE_SUFFIX);
        match transaction_index::read(&path)? {
            Some(entries) => all.extend(entries),
            None if path.exists() => {
                tracing::warn!(path = %path.display(), "unreadable transaction index: reading the whole log");
                return Ok(None);
            }
            None => {}
        }
    }
    all.sort_by_key(|t| t.last_offset);
    Ok(Some(all))
}

/// A control batch holding one transaction marker (Kafka's
/// `MemoryRecords.withEndTransactionMarker`), for a leader to append with origin
/// `Coordinator`: producer id and epoch of the transaction, no sequence, transactional
/// and control attributes, one record whose key is the marker type and whose value is
/// `EndTxnMarker` version 0 with the coordinator epoch.
pub fn end_txn_marker_batch(
    producer_id: i64,
    producer_epoch: i16,
    coordinator_epoch: i32,
    commit: bool,
    timestamp_ms: i64,
) -> Result<Bytes, AppendError> {
    use rill_protocol::records::{
        end_txn_marker_value, CompressionType, ControlRecordType, RecordBatchBuilder,
    };
    let kind = if commit {
        ControlRecordType::Commit
    } else {
        ControlRecordType::Abort
    };
    let mut builder = RecordBatchBuilder::new(CompressionType::None, 0)
        .producer(producer_id, producer_epoch, -1)
        .transactional(true)
        .control(true);
    builder
        .append(
            timestamp_ms,
            Some(&kind.key()),
            Some(&end_txn_marker_value(coordinator_epoch)),
            &[],
        )
        .map_err(corrupt_to_append_error)?;
    builder.build().map_err(corrupt_to_append_error)
}

impl UnifiedLog {
    /// Writes the cleaner's progress (see [`CLEANER_OFFSET_CHECKPOINT_FILE`]).
    pub(crate) fn checkpoint_first_dirty_offset(&self) -> Result<(), StorageError> {
        checkpoint::write_offset(
            &self.dir.join(CLEANER_OFFSET_CHECKPOINT_FILE),
            self.first_dirty_offset,
            Durability::Durable,
        )
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod file_range_tests {
    //! `read_file_range` must name exactly the bytes `read` returns.

    use super::*;
    use crate::test_util::TestBatch;

    const T0: i64 = 1_700_000_000_000;

    #[test]
    fn file_range_reads_name_the_same_bytes_as_reads() {
        let dir = tempfile::tempdir().unwrap();
        let config = LogConfig {
            segment_bytes: 2_000,
            index_interval_bytes: 256,
            ..LogConfig::default()
        };
        let mut log =
            UnifiedLog::open(dir.path(), config.clone(), T0, PreviousShutdown::Unclean).unwrap();
        for i in 0..40usize {
            let b = TestBatch::new(1 + i % 3, T0).value_len(20 + i * 3);
            log.append_as_leader(b.bytes(), 0, AppendOrigin::Client, T0)
                .unwrap();
        }
        let end = log.log_end_offset();
        check_file_ranges_against_reads(&log, end);
        // Again with the indexes read back from their files, as after a restart: a range
        // read skips ahead by the offset index, so it must agree with the index on disk too.
        log.close().unwrap();
        let log = UnifiedLog::open(dir.path(), config, T0, PreviousShutdown::Clean).unwrap();
        check_file_ranges_against_reads(&log, end);
        assert!(log.read_file_range(end + 1, 100, i64::MAX, true).is_err());
    }

    fn check_file_ranges_against_reads(log: &UnifiedLog, end: i64) {
        for offset in 0..=end {
            for max_bytes in [0, 1, 150, 700, 1_999, 5_000] {
                for max_offset in [end / 3, end / 2, end / 2 + 1, end - 1, end, i64::MAX] {
                    for min_one in [false, true] {
                        let read = log.read(offset, max_bytes, max_offset, min_one).unwrap();
                        let range = log
                            .read_file_range(offset, max_bytes, max_offset, min_one)
                            .unwrap();
                        assert!(range.records.is_empty());
                        assert_eq!(read.fetch_offset_metadata, range.fetch_offset_metadata);
                        let bytes = range.file_range.map(|r| {
                            let mut buf = vec![0u8; r.len as usize];
                            std::os::unix::fs::FileExt::read_exact_at(
                                &*r.file, &mut buf, r.position,
                            )
                            .unwrap();
                            buf
                        });
                        let want = (!read.records.is_empty()).then(|| read.records.to_vec());
                        assert_eq!(bytes, want, "{offset} {max_bytes} {max_offset} {min_one}");
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod group_commit_tests;

#[cfg(test)]
mod txn_tests;
