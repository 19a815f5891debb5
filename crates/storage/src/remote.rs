//! The partition log's side of tiered storage (KIP-405): which closed segments may be
//! copied to the remote tier and what each copy is made of, which remote segments the
//! whole-log retention deletes, whether a remote segment belongs to the log's leader
//! epoch lineage, and reads of a remote segment's local copy. Everything here is pure or
//! reads local files; the remote store, its metadata and the tasks that copy and delete
//! are the broker's (`remote_log`).
//!
//! # Design note: the two tiers of one log
//!
//! The log's [`UnifiedLog::log_start_offset`] stays the start of what is on local disk
//! (Kafka's `localLogStartOffset`); the start of the whole log is the broker's to know,
//! from the remote segments' metadata. Three rules tie the tiers together:
//!
//! 1. A closed segment is a copy candidate once every record in it is below the last
//!    stable offset, so the remote tier only ever holds committed data that no
//!    truncation can take back ([`UnifiedLog::remote_copy_candidates`]; Kafka's
//!    `candidateLogSegments`). The broker copies candidates in offset order and tells
//!    the log the last offset copied ([`UnifiedLog::set_highest_offset_in_remote_storage`]).
//! 2. On a log with `remote.storage.enable`, retention deletes a local segment only when
//!    its last offset is at or below that highest copied offset, and measures it against
//!    `local.retention.ms`/`local.retention.bytes` (`crate::retention`); so a segment is
//!    never on neither tier, and a store that is down only makes the local tier grow.
//! 3. On such a log the leader epoch cache is not trimmed to the local log start (Kafka
//!    trims it to the whole log's start) — not by retention, not by the log start a
//!    follower takes from its leader, not at open: the epochs of remote data stay known,
//!    which is what [`is_segment_within_leader_epochs`] checks remote segments against.
//!    The broker trims it when remote retention moves the whole log's start
//!    ([`UnifiedLog::truncate_leader_epochs_below`]).
//!
//! A copy is the segment's `.log`, `.index`, `.timeindex` and `.txnindex` as they are on
//! disk (a closed segment never changes: compaction is refused on tiered topics), the
//! producer snapshot at the next segment's base offset (the log keeps the snapshots a
//! tiered log has not copied yet), and the leader epochs up to the segment's end in the
//! `leader-epoch-checkpoint` format ([`epoch_checkpoint_bytes`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::epoch::EpochEntry;
use crate::log::UnifiedLog;
use crate::producer_state::PRODUCER_SNAPSHOT_SUFFIX;
use crate::segment::{
    segment_file, FetchDataInfo, LogSegment, INDEX_FILE_SUFFIX, LOG_FILE_SUFFIX,
    TIME_INDEX_FILE_SUFFIX,
};
use crate::transaction_index::{AbortedTxn, TXN_INDEX_FILE_SUFFIX};
use crate::StorageError;

/// A closed local segment to copy to the remote tier, with the files that make it up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteCopyCandidate {
    pub base_offset: i64,
    /// The last offset the copy covers: the next segment's base offset minus one.
    pub end_offset: i64,
    pub size_bytes: u64,
    /// The largest record timestamp in the segment (-1: none).
    pub max_timestamp: i64,
    pub log_file: PathBuf,
    pub offset_index_file: PathBuf,
    pub time_index_file: PathBuf,
    /// Absent when no transaction was aborted in the segment.
    pub txn_index_file: Option<PathBuf>,
    /// The producer state at `end_offset + 1`, when the log has it.
    pub producer_snapshot_file: Option<PathBuf>,
    /// The epochs whose batches are in the segment, each with its first offset in it
    /// (Kafka's `segmentLeaderEpochs`).
    pub segment_leader_epochs: BTreeMap<i32, i64>,
    /// Every epoch of the log up to the segment's end: the `leader-epoch-checkpoint`
    /// that goes with the copy.
    pub leader_epochs_to_end: Vec<EpochEntry>,
}

impl UnifiedLog {
    /// The closed segments holding an offset above `copied_offset` whose every record is
    /// below the last stable offset, oldest first (rule 1 of the module's note). The
    /// segment that holds `copied_offset + 1` is included even when it starts below it,
    /// as in Kafka: remote segments may overlap after a leader change.
    pub fn remote_copy_candidates(&self, copied_offset: i64) -> Vec<RemoteCopyCandidate> {
        let from = (copied_offset + 1).max(self.log_start_offset);
        let lso = self.last_stable_offset();
        let floor = self
            .segments
            .range(..=from)
            .next_back()
            .map_or(from, |(b, _)| *b);
        let segs: Vec<&LogSegment> = self.segments.range(floor..).map(|(_, s)| s).collect();
        let mut out = Vec::new();
        for pair in segs.windows(2) {
            let (seg, next) = (pair[0], pair[1]);
            let next_base = next.base_offset();
            if next_base > lso || seg.size() == 0 || next_base - 1 <= copied_offset {
                if next_base > lso {
                    break;
                }
                continue;
            }
            let end_offset = next_base - 1;
            let txn = segment_file(&self.dir, seg.base_offset(), TXN_INDEX_FILE_SUFFIX);
            let snapshot = segment_file(&self.dir, next_base, PRODUCER_SNAPSHOT_SUFFIX);
            let epochs = self.leader_epoch_cache.entries();
            out.push(RemoteCopyCandidate {
                base_offset: seg.base_offset(),
                end_offset,
                size_bytes: seg.size(),
                max_timestamp: seg.max_timestamp_so_far(),
                log_file: seg.log_path().to_owned(),
                offset_index_file: segment_file(&self.dir, seg.base_offset(), INDEX_FILE_SUFFIX),
                time_index_file: segment_file(&self.dir, seg.base_offset(), TIME_INDEX_FILE_SUFFIX),
                txn_index_file: txn.exists().then_some(txn),
                producer_snapshot_file: snapshot.exists().then_some(snapshot),
                segment_leader_epochs: segment_epochs(epochs, seg.base_offset(), end_offset),
                leader_epochs_to_end: epochs
                    .iter()
                    .copied()
                    .filter(|e| e.start_offset <= end_offset)
                    .collect(),
            });
        }
        out
    }

    /// Bytes of the local segments holding an offset above `offset` (the active one
    /// included): the part of a tiered log that is only local.
    pub fn local_bytes_above(&self, offset: i64) -> u64 {
        self.segments
            .values()
            .filter(|s| s.next_offset() - 1 > offset || s.size() == 0)
            .map(LogSegment::size)
            .sum()
    }

    /// The remote tier's lag (Kafka's `RemoteCopyLagBytes` and `RemoteCopyLagSegments`):
    /// the closed local segments not yet copied, in bytes and in number.
    pub fn remote_copy_lag(&self) -> (u64, usize) {
        let active = self.segments.last_key_value().map(|(b, _)| *b);
        self.segments
            .values()
            .filter(|s| Some(s.base_offset()) != active)
            .filter(|s| s.next_offset() - 1 > self.highest_offset_in_remote_storage)
            .fold((0, 0), |(b, n), s| (b + s.size(), n + 1))
    }

    /// The last offset known to be in the remote tier (-1: none); local retention never
    /// deletes a segment above it (rule 2).
    pub fn highest_offset_in_remote_storage(&self) -> i64 {
        self.highest_offset_in_remote_storage
    }

    /// Records that everything up to `offset` is in the remote tier. Never moves back
    /// (Kafka's `updateHighestOffsetInRemoteStorage`).
    pub fn set_highest_offset_in_remote_storage(&mut self, offset: i64) {
        self.highest_offset_in_remote_storage = self.highest_offset_in_remote_storage.max(offset);
    }

    /// Forgets the leader epochs wholly below `offset`, the whole log's new start once
    /// remote retention deleted what was below it (rule 3).
    pub fn truncate_leader_epochs_below(&mut self, offset: i64) -> Result<(), StorageError> {
        let offset = offset.min(self.log_start_offset);
        if self.leader_epoch_cache.truncate_from_start(offset) {
            self.leader_epoch_cache
                .flush(crate::checkpoint::Durability::Durable)?;
        }
        Ok(())
    }

    /// A replica that starts its local log at `offset`, below which the data is only in
    /// the remote tier (KIP-405's follower that builds "auxiliary state" from the
    /// remote tier): the log is emptied and restarted at `offset` with the leader epochs
    /// and the producer state the remote copy of the segment ending at `offset - 1`
    /// carries, so that OffsetForLeaderEpoch, idempotent producers and transactions work
    /// across the two tiers as on the leader.
    pub fn start_from_remote_tier(
        &mut self,
        offset: i64,
        leader_epochs: &[EpochEntry],
        producer_snapshot: Option<&[u8]>,
        now_ms: i64,
    ) -> Result<(), StorageError> {
        self.truncate_fully_and_start_at(offset, now_ms)?;
        for e in leader_epochs.iter().filter(|e| e.start_offset < offset) {
            self.leader_epoch_cache.assign(e.epoch, e.start_offset);
        }
        self.leader_epoch_cache
            .flush(crate::checkpoint::Durability::Durable)?;
        if let Some(bytes) = producer_snapshot {
            let path = segment_file(&self.dir, offset, PRODUCER_SNAPSHOT_SUFFIX);
            std::fs::write(&path, bytes).map_err(|e| StorageError::io(&path, e))?;
            match crate::producer_state::ProducerStateManager::read_snapshot(&self.dir, offset)? {
                Some(mut state) => {
                    state
                        .set_partition(&self.dir.file_name().unwrap_or_default().to_string_lossy());
                    self.producer_state = state;
                }
                None => {
                    tracing::warn!(dir = %self.dir.display(), offset, "remote producer snapshot unreadable, ignored");
                    crate::producer_state::ProducerStateManager::delete_snapshot(
                        &self.dir, offset,
                    )?;
                }
            }
        }
        Ok(())
    }
}

/// The epochs of `entries` that have batches in `[base, end]`, each with its first
/// offset there (the first one clamped to `base`).
fn segment_epochs(entries: &[EpochEntry], base: i64, end: i64) -> BTreeMap<i32, i64> {
    let mut out = BTreeMap::new();
    for (i, e) in entries.iter().enumerate() {
        let next_start = entries.get(i + 1).map_or(i64::MAX, |n| n.start_offset);
        if e.start_offset <= end && next_start > base {
            out.insert(e.epoch, e.start_offset.max(base));
        }
    }
    out
}

/// Kafka's `isRemoteSegmentWithinLeaderEpochs`: whether a remote segment, with its
/// epochs (`segment_epochs`, epoch → first offset) and last offset, belongs to the
/// lineage of a log whose leader epoch cache is `log_epochs` and whose end is
/// `log_end_offset`. A segment that a deposed leader copied past the point where the log
/// diverged (an unclean election) fails, and is then neither read nor counted; remote
/// retention deletes it.
pub fn is_segment_within_leader_epochs(
    segment_epochs: &BTreeMap<i32, i64>,
    segment_end_offset: i64,
    log_epochs: &BTreeMap<i32, i64>,
    log_end_offset: i64,
) -> bool {
    // Epochs with no record in the segment (the next epoch starts at the same offset)
    // say nothing about it.
    let filtered: BTreeMap<i32, i64> = segment_epochs
        .iter()
        .zip(
            segment_epochs
                .iter()
                .skip(1)
                .map(Some)
                .chain(std::iter::once(None)),
        )
        .filter(|((_, start), next)| next.is_none_or(|(_, n)| *n != **start))
        .map(|((e, s), _)| (*e, *s))
        .collect();
    let (Some((&seg_last, _)), Some((&log_first, _)), Some((&log_last, _))) = (
        filtered.last_key_value(),
        log_epochs.first_key_value(),
        log_epochs.last_key_value(),
    ) else {
        return false;
    };
    if seg_last < log_first || seg_last > log_last {
        return false;
    }
    let Some((&seg_first, _)) = filtered.range(log_first..).next() else {
        return false;
    };
    for (&epoch, &offset) in filtered.range(seg_first..) {
        let Some(&log_start) = log_epochs.get(&epoch) else {
            return false;
        };
        if epoch == seg_first
            && log_epochs.range(..epoch).next_back().is_some()
            && offset < log_start
        {
            return false;
        }
        if epoch == seg_last {
            if let Some((_, &next)) = log_epochs.range(epoch + 1..).next() {
                if segment_end_offset > next - 1 {
                    return false;
                }
            }
        }
        if epoch != seg_last
            && log_epochs.range(epoch + 1..).next() != filtered.range(epoch + 1..).next()
        {
            return false;
        }
    }
    segment_end_offset < log_end_offset
}

/// A remote segment as retention sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteSegmentSummary {
    pub start_offset: i64,
    pub end_offset: i64,
    pub size_bytes: u64,
    pub max_timestamp: i64,
}

/// The whole log's retention over the remote tier (Kafka's `RLMExpirationTask`): the
/// indexes into `segments` (oldest first, the lineage's copied segments only) that go,
/// as a prefix: a segment goes while it lies entirely below `log_start_offset`, or its
/// newest record is older than `retention_ms` (-1: never), or the whole log
/// (`local_only_bytes`, the local segments not in the remote tier, plus every remote
/// segment) would still be at least `retention_bytes` (-1: unbounded) without it.
pub fn remote_segments_to_delete(
    segments: &[RemoteSegmentSummary],
    log_start_offset: i64,
    retention_ms: i64,
    retention_bytes: i64,
    local_only_bytes: u64,
    now_ms: i64,
) -> usize {
    let total: u64 = local_only_bytes + segments.iter().map(|s| s.size_bytes).sum::<u64>();
    let mut excess = (retention_bytes >= 0).then(|| total.saturating_sub(retention_bytes as u64));
    let mut n = 0;
    for s in segments {
        let below_start = s.end_offset < log_start_offset;
        let too_old = retention_ms >= 0
            && s.max_timestamp >= 0
            && now_ms.saturating_sub(s.max_timestamp) > retention_ms;
        let too_big = excess.is_some_and(|x| x >= s.size_bytes && x > 0);
        if !(below_start || too_old || too_big) {
            break;
        }
        if let Some(x) = excess.as_mut() {
            *x = x.saturating_sub(s.size_bytes);
        }
        n += 1;
    }
    n
}

/// The `leader-epoch-checkpoint` file's bytes for `entries` (Kafka's format: version 0,
/// the count, then `epoch start_offset` per line).
pub fn epoch_checkpoint_bytes(entries: &[EpochEntry]) -> Vec<u8> {
    let mut s = format!("0\n{}\n", entries.len());
    for e in entries {
        s.push_str(&format!("{} {}\n", e.epoch, e.start_offset));
    }
    s.into_bytes()
}

/// Reads [`epoch_checkpoint_bytes`]' format; `None` when it is malformed.
pub fn parse_epoch_checkpoint(bytes: &[u8]) -> Option<Vec<EpochEntry>> {
    let text = std::str::from_utf8(bytes).ok()?;
    let mut lines = text.lines();
    if lines.next()?.trim() != "0" {
        return None;
    }
    let count: usize = lines.next()?.trim().parse().ok()?;
    let mut out = Vec::with_capacity(count.min(100_000));
    for line in lines.by_ref().take(count) {
        let mut parts = line.split_whitespace();
        let epoch = parts.next()?.parse().ok()?;
        let start_offset = parts.next()?.parse().ok()?;
        out.push(EpochEntry {
            epoch,
            start_offset,
        });
    }
    (out.len() == count).then_some(out)
}

/// A remote segment's copy in a local directory (the broker's cache of remote data),
/// opened read-only as a segment of the log is, so that a fetch from the remote tier
/// finds its batches with the segment's own offset index.
#[derive(Debug)]
pub struct RemoteSegmentReader {
    segment: LogSegment,
    dir: PathBuf,
}

impl RemoteSegmentReader {
    /// Opens the copy whose `.log` and `.index` (and `.timeindex`) are in `dir` under
    /// the usual names for `base_offset`. Missing or inconsistent indexes are rebuilt
    /// there from the `.log`.
    pub fn open(dir: &Path, base_offset: i64) -> Result<Self, StorageError> {
        let log = segment_file(dir, base_offset, LOG_FILE_SUFFIX);
        if !log.exists() {
            return Err(StorageError::Corrupt {
                path: log,
                reason: "remote segment copy missing".into(),
            });
        }
        let mut segment = LogSegment::open(dir, base_offset, 4096, 10 * 1024 * 1024, 0)?;
        segment.load()?;
        Ok(Self {
            segment,
            dir: dir.to_owned(),
        })
    }

    pub fn base_offset(&self) -> i64 {
        self.segment.base_offset()
    }

    pub fn next_offset(&self) -> i64 {
        self.segment.next_offset()
    }

    /// Whole batches from the one holding `offset`, as `UnifiedLog::read` returns them.
    pub fn read(
        &self,
        offset: i64,
        max_bytes: usize,
        max_offset: i64,
        min_one_message: bool,
    ) -> Result<Option<FetchDataInfo>, StorageError> {
        self.segment
            .read(offset, max_bytes, max_offset, min_one_message)
    }

    /// The first batch whose max timestamp reaches `timestamp`: `(offset, timestamp,
    /// leader epoch)` of the first record at or after it.
    pub fn offset_for_timestamp(
        &self,
        timestamp: i64,
    ) -> Result<Option<(i64, i64, i32)>, StorageError> {
        if self.segment.max_timestamp_so_far() < timestamp {
            return Ok(None);
        }
        let from = self
            .segment
            .time_index()
            .lookup(timestamp)
            .map_or(self.segment.base_offset(), |(_, o)| o);
        let (_, pos) = self.segment.offset_index().lookup(from);
        let mut found = None;
        self.segment.for_each_header(u64::from(pos), |p, h| {
            if h.max_timestamp >= timestamp {
                found = Some((p, *h));
                false
            } else {
                true
            }
        })?;
        let Some((p, h)) = found else { return Ok(None) };
        let Some(batch) = self.segment.read_batch(p, &h)? else {
            return Ok(None);
        };
        let (offset, ts) = crate::records::first_record_at_or_after(&batch, timestamp)
            .unwrap_or((h.base_offset, h.max_timestamp));
        Ok(Some((offset, ts, h.partition_leader_epoch)))
    }

    /// The aborted transactions of the copy's `.txnindex` (none when it has none) that
    /// overlap `[from, to)`.
    pub fn aborted_txns(&self, from: i64, to: i64) -> Result<Vec<AbortedTxn>, StorageError> {
        let path = segment_file(&self.dir, self.segment.base_offset(), TXN_INDEX_FILE_SUFFIX);
        if !path.exists() {
            return Ok(Vec::new());
        }
        Ok(crate::transaction_index::read(&path)?
            .unwrap_or_default()
            .into_iter()
            .filter(|t| t.first_offset < to && t.last_offset >= from)
            .collect())
    }
}

#[cfg(test)]
mod tests;
