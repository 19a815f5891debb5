//! Retention (`cleanup.policy=delete`), DeleteRecords and rolling a quiet partition by
//! time: the calls that move the log start offset up and delete whole segments.
//!
//! # Design note: deleting old segments
//!
//! The broker calls [`UnifiedLog::maybe_roll`] and then
//! [`UnifiedLog::delete_old_segments`] from a periodic task (Kafka's
//! `log.retention.check.interval.ms`), each under the log's lock; both are quick (a few
//! unlinks and fsyncs, no data copied).
//!
//! 1. Candidates are the non-active segments from the oldest one, in order, each of
//!    which lies entirely below the high watermark (a record that consumers may not yet
//!    see, or that followers may not have, is never deleted).
//! 2. A candidate is deleted while one of these holds for it, and the first one for
//!    which none holds stops the scan (so only a prefix of the log is ever deleted and
//!    offsets stay dense from the new log start):
//!    - it lies entirely below the log start offset (DeleteRecords moved it), whatever
//!      the policy;
//!    - the policy includes `delete` and its largest timestamp is more than
//!      `retention.ms` old (`-1`: never);
//!    - the policy includes `delete` and the log would still be at least
//!      `retention.bytes` large without it (`-1`: unlimited).
//! 3. The log start offset moves up to the first remaining segment's base offset (never
//!    down: DeleteRecords may already have put it inside that segment), its checkpoint
//!    is written, and the leader epoch cache forgets epochs below it.
//! 4. The files are unlinked. A reader holding one of them (a fetch in flight) keeps
//!    reading it; a crash before the unlink leaves segments below the checkpointed log
//!    start, which the next call deletes again.
//!
//! On a tiered log (`remote.storage.enable`) the rules of step 2 read `local.retention.ms`
//! and `local.retention.bytes`, and a segment not yet in the remote tier stops the scan
//! unless DeleteRecords moved the log start past it (see [`crate::remote`]).
//!
//! The active segment is never deleted here: a partition that stopped receiving data
//! gets its active segment rolled by [`UnifiedLog::maybe_roll`] once it is older than
//! `segment.ms` (Kafka rolls on the next append only, so a quiet partition would keep
//! its last segment forever), and the next retention pass can then delete it.

use crate::checkpoint::{self, Durability};
use crate::error::DeleteRecordsError;
use crate::log::UnifiedLog;
use crate::segment::LogSegment;
use crate::StorageError;

/// What [`UnifiedLog::delete_old_segments`] or [`UnifiedLog::delete_records_before`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RetentionResult {
    pub deleted_segments: usize,
    pub deleted_bytes: u64,
    /// The log start offset afterwards.
    pub log_start_offset: i64,
}

/// Why a segment may go (step 2 of the design note).
#[derive(Debug, Clone, Copy)]
struct RetentionRules {
    log_start_offset: i64,
    retention_ms: Option<i64>,
    /// Bytes above `retention.bytes`, still to be deleted.
    excess_bytes: Option<u64>,
    now_ms: i64,
}

/// The age of a segment for `retention.ms`: its largest timestamp, or its file's
/// modification time when no batch carries one (Kafka's `largestTimestamp`).
fn largest_timestamp(seg: &LogSegment) -> i64 {
    if seg.max_timestamp_so_far() >= 0 {
        return seg.max_timestamp_so_far();
    }
    std::fs::metadata(seg.log_path())
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(seg.created_ms(), |d| d.as_millis() as i64)
}

impl UnifiedLog {
    /// Deletes old segments as the retention settings say (see the module's design
    /// note). Call it periodically, after [`Self::maybe_roll`].
    pub fn delete_old_segments(&mut self, now_ms: i64) -> Result<RetentionResult, StorageError> {
        let delete = self.config.cleanup_policy.is_delete();
        // A tiered log's local part is held to the local retention (see `crate::remote`).
        let (retention_ms, retention_bytes) = if self.config.remote_storage_enable {
            (
                self.config.local_retention_ms(),
                self.config.local_retention_bytes(),
            )
        } else {
            (self.config.retention_ms, self.config.retention_bytes)
        };
        let retention_ms = (delete && retention_ms >= 0).then_some(retention_ms);
        let excess_bytes = (delete && retention_bytes >= 0)
            .then(|| self.size_bytes().saturating_sub(retention_bytes as u64));
        self.delete_segments_while(RetentionRules {
            log_start_offset: self.log_start_offset,
            retention_ms,
            excess_bytes,
            now_ms,
        })
    }

    /// Rolls the active segment when it holds data and is older than `segment.ms` (or a
    /// compacted log's shorter `max.compaction.lag.ms`), so that retention and the
    /// cleaner, which never touch the active segment, can reach a quiet partition's
    /// last records. Returns whether it rolled.
    pub fn maybe_roll(&mut self, now_ms: i64) -> Result<bool, StorageError> {
        let Some(active) = self.active_segment() else {
            return Ok(false);
        };
        if active.size() == 0
            || active.time_waited_for_roll(now_ms, now_ms) < self.config.max_segment_ms()
        {
            return Ok(false);
        }
        let next = active.next_offset();
        self.roll(next, now_ms)?;
        Ok(true)
    }

    /// DeleteRecords: moves the log start offset up to `offset` (`-1`: the high
    /// watermark), which may fall inside a segment, and deletes the segments entirely
    /// below it. Returns the new log start offset (the partition's low watermark).
    pub fn delete_records_before(
        &mut self,
        offset: i64,
    ) -> Result<RetentionResult, DeleteRecordsError> {
        if !self.config.cleanup_policy.is_delete() {
            return Err(DeleteRecordsError::PolicyViolation);
        }
        let offset = if offset == -1 {
            self.high_watermark
        } else {
            offset
        };
        if offset < 0 || offset > self.high_watermark {
            return Err(DeleteRecordsError::OffsetOutOfRange {
                offset,
                log_start: self.log_start_offset,
                high_watermark: self.high_watermark,
            });
        }
        self.maybe_increment_log_start_offset(offset)?;
        Ok(self.delete_segments_while(RetentionRules {
            log_start_offset: self.log_start_offset,
            retention_ms: None,
            excess_bytes: None,
            now_ms: 0,
        })?)
    }

    fn delete_segments_while(
        &mut self,
        mut rules: RetentionRules,
    ) -> Result<RetentionResult, StorageError> {
        let active_base = self
            .active_segment()
            .map_or(i64::MAX, LogSegment::base_offset);
        let mut doomed = Vec::new();
        for seg in self.segments.values() {
            if seg.base_offset() >= active_base || seg.next_offset() > self.high_watermark {
                break;
            }
            let below_start = seg.next_offset() <= rules.log_start_offset;
            // Rule 2 of `crate::remote`: on a tiered log only what the remote tier holds
            // leaves the local disk (or what DeleteRecords deleted).
            if self.config.remote_storage_enable
                && !below_start
                && seg.next_offset() - 1 > self.highest_offset_in_remote_storage
            {
                break;
            }
            let too_old = rules
                .retention_ms
                .is_some_and(|ms| rules.now_ms.saturating_sub(largest_timestamp(seg)) > ms);
            let too_big = rules
                .excess_bytes
                .is_some_and(|excess| excess >= seg.size());
            if !(below_start || too_old || too_big) {
                break;
            }
            if let Some(excess) = rules.excess_bytes.as_mut() {
                *excess = excess.saturating_sub(seg.size());
            }
            doomed.push(seg.base_offset());
        }
        let mut result = RetentionResult {
            log_start_offset: self.log_start_offset,
            ..RetentionResult::default()
        };
        if doomed.is_empty() {
            return Ok(result);
        }
        let mut removed = Vec::with_capacity(doomed.len());
        for base in &doomed {
            if let Some(seg) = self.segments.remove(base) {
                removed.push(seg);
            }
        }
        self.layout_version += 1;
        let first_base = self
            .segments
            .first_key_value()
            .map_or(self.log_start_offset, |(b, _)| *b);
        if first_base > self.log_start_offset {
            self.log_start_offset = first_base;
            self.trim_aborted_txns();
            self.write_log_start_checkpoint(first_base, Durability::Durable)?;
            if !self.config.remote_storage_enable
                && self.leader_epoch_cache.truncate_from_start(first_base)
            {
                self.leader_epoch_cache.flush(Durability::Durable)?;
            }
        }
        self.first_dirty_offset = self.first_dirty_offset.max(self.log_start_offset);
        for seg in removed {
            result.deleted_segments += 1;
            result.deleted_bytes += seg.size();
            tracing::info!(
                dir = %self.dir.display(),
                base_offset = seg.base_offset(),
                size = seg.size(),
                "deleting log segment"
            );
            seg.delete()?;
        }
        checkpoint::sync_dir(&self.dir)?;
        result.log_start_offset = self.log_start_offset;
        Ok(result)
    }
}

#[cfg(test)]
mod tests;
