//! The replica manager: the partitions this broker hosts, and produce and fetch on them.
//!
//! On a single node every partition is led here and its ISR is this node alone, so the
//! high watermark moves to the log end offset as soon as an append returns; `acks=all` is
//! then the local append. Each partition's log sits behind its own lock, held only for
//! the append or the read itself, never across an `.await`. Fetches that found too few
//! bytes park on [`ReplicaManager::wait_for_append`] until new data or their max wait.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use bytes::Bytes;
use rill_protocol::primitives::Uuid;
use rill_protocol::ErrorCode;
use rill_storage::{
    partition_dir_name, AppendError, AppendOrigin, FetchDataInfo, FileRange, LogAppendInfo,
    LogConfig, ReadError, TopicPartition, UnifiedLog,
};
use tokio::sync::Notify;

use crate::error::BrokerError;

/// The leader epoch of every partition while this broker is the only one.
pub const SINGLE_NODE_LEADER_EPOCH: i32 = 0;

pub struct Partition {
    pub topic_id: Uuid,
    log: Mutex<UnifiedLog>,
}

impl Partition {
    /// Runs `f` with the log locked. A poisoned lock means an earlier holder panicked in
    /// the middle of a log operation: the log may be inconsistent, so it is not used again.
    pub(crate) fn with_log<T>(&self, f: impl FnOnce(&mut UnifiedLog) -> T) -> Result<T, ErrorCode> {
        match self.log.lock() {
            Ok(mut log) => Ok(f(&mut log)),
            Err(_) => Err(ErrorCode::KAFKA_STORAGE_ERROR),
        }
    }
}

/// The offsets a ListOffsets or Fetch reports next to the data.
#[derive(Debug, Clone, Copy)]
pub struct PartitionOffsets {
    pub log_start_offset: i64,
    pub high_watermark: i64,
    pub log_end_offset: i64,
}

pub struct FetchResult {
    pub offsets: PartitionOffsets,
    /// The records; empty when read with `zero_copy`, where `file_range` holds them.
    pub records: Bytes,
    /// Where the records lie in their segment file (`None` when there are none).
    pub file_range: Option<FileRange>,
}

impl FetchResult {
    /// The record bytes this result answers with, however they are held.
    pub fn byte_len(&self) -> usize {
        match &self.file_range {
            Some(r) if self.records.is_empty() => r.len as usize,
            _ => self.records.len(),
        }
    }
}

pub struct ReplicaManager {
    data_dir: PathBuf,
    partitions: RwLock<HashMap<TopicPartition, Arc<Partition>>>,
    appended: Notify,
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

impl ReplicaManager {
    pub fn new(data_dir: &Path) -> Self {
        Self {
            data_dir: data_dir.to_path_buf(),
            partitions: RwLock::new(HashMap::new()),
            appended: Notify::new(),
        }
    }

    fn read_map(&self) -> std::sync::RwLockReadGuard<'_, HashMap<TopicPartition, Arc<Partition>>> {
        // A panic while holding the map lock cannot leave the map half-updated (inserts
        // and removes are single calls), so a poisoned lock is still safe to read.
        self.partitions.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write_map(
        &self,
    ) -> std::sync::RwLockWriteGuard<'_, HashMap<TopicPartition, Arc<Partition>>> {
        self.partitions.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Opens (recovering if needed) or creates the log of a partition and starts hosting it.
    pub fn open_partition(
        &self,
        tp: TopicPartition,
        topic_id: Uuid,
        config: LogConfig,
    ) -> Result<(), BrokerError> {
        let dir = self
            .data_dir
            .join(partition_dir_name(&tp.topic, tp.partition));
        let mut log = UnifiedLog::open(&dir, config, now_ms())?;
        // Alone, this node is the whole ISR: everything its log recovered was committed, so
        // the high watermark is the log end (its checkpoint may lag after a crash).
        let leo = log.log_end_offset();
        log.update_high_watermark(leo);
        let partition = Arc::new(Partition {
            topic_id,
            log: Mutex::new(log),
        });
        self.write_map().insert(tp, partition);
        Ok(())
    }

    /// Every hosted partition, for background maintenance.
    pub fn partitions(&self) -> Vec<(TopicPartition, Arc<Partition>)> {
        self.read_map()
            .iter()
            .map(|(tp, p)| (tp.clone(), p.clone()))
            .collect()
    }

    /// DeleteRecords: moves the log start offset up to `offset` (-1: the high watermark)
    /// and returns the new low watermark.
    pub fn delete_records(&self, tp: &TopicPartition, offset: i64) -> Result<i64, ErrorCode> {
        let partition = self.get(tp).ok_or(ErrorCode::UNKNOWN_TOPIC_OR_PARTITION)?;
        match partition.with_log(|log| log.delete_records_before(offset))? {
            Ok(result) => Ok(result.log_start_offset),
            Err(rill_storage::DeleteRecordsError::OffsetOutOfRange { .. }) => {
                Err(ErrorCode::OFFSET_OUT_OF_RANGE)
            }
            Err(rill_storage::DeleteRecordsError::PolicyViolation) => {
                Err(ErrorCode::POLICY_VIOLATION)
            }
            Err(e) => {
                tracing::error!(%tp, error = %e, "delete records failed");
                Err(ErrorCode::KAFKA_STORAGE_ERROR)
            }
        }
    }

    pub fn get(&self, tp: &TopicPartition) -> Option<Arc<Partition>> {
        self.read_map().get(tp).cloned()
    }

    /// Stops hosting a partition and deletes its log from disk.
    pub fn delete_partition(&self, tp: &TopicPartition) -> Result<(), BrokerError> {
        let removed = self.write_map().remove(tp);
        if let Some(partition) = removed {
            // Wait for in-flight users: they hold their own Arc, the log is dropped last.
            let dir = self
                .data_dir
                .join(partition_dir_name(&tp.topic, tp.partition));
            drop(partition);
            match std::fs::remove_dir_all(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(BrokerError::io(dir.display(), e)),
            }
        }
        Ok(())
    }

    /// Applies new topic configs to the live logs of a topic.
    pub fn reconfigure(&self, topic: &str, config: &LogConfig) {
        for (tp, p) in self.read_map().iter() {
            if tp.topic == topic {
                match p.with_log(|log| log.update_config(config.clone())) {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => tracing::error!(%tp, error = %e, "reconfiguring log failed"),
                    Err(_) => tracing::error!(%tp, "log lock poisoned"),
                }
            }
        }
    }

    /// Appends a client's record set as leader. On one node the append is the commit, so
    /// the high watermark follows the log end offset at once.
    pub fn append(
        &self,
        tp: &TopicPartition,
        records: &Bytes,
    ) -> Result<(LogAppendInfo, i64), ErrorCode> {
        self.append_with_origin(tp, records, AppendOrigin::Client)
    }

    /// Appends as [`Self::append`] does, for a writer other than a client (the group
    /// coordinator writes `__consumer_offsets` as `Coordinator`).
    pub fn append_with_origin(
        &self,
        tp: &TopicPartition,
        records: &Bytes,
        origin: AppendOrigin,
    ) -> Result<(LogAppendInfo, i64), ErrorCode> {
        let partition = self.get(tp).ok_or(ErrorCode::UNKNOWN_TOPIC_OR_PARTITION)?;
        let result = partition.with_log(|log| {
            let info =
                log.append_as_leader(records.clone(), SINGLE_NODE_LEADER_EPOCH, origin, now_ms())?;
            let leo = log.log_end_offset();
            log.update_high_watermark(leo);
            Ok::<_, AppendError>((info, log.log_start_offset()))
        })?;
        match result {
            Ok(ok) => {
                self.appended.notify_waiters();
                Ok(ok)
            }
            Err(e) => Err(append_error_code(&e)),
        }
    }

    pub fn offsets(&self, tp: &TopicPartition) -> Result<PartitionOffsets, ErrorCode> {
        let partition = self.get(tp).ok_or(ErrorCode::UNKNOWN_TOPIC_OR_PARTITION)?;
        partition.with_log(|log| PartitionOffsets {
            log_start_offset: log.log_start_offset(),
            high_watermark: log.high_watermark(),
            log_end_offset: log.log_end_offset(),
        })
    }

    /// Reads committed data (below the high watermark) from `offset`.
    pub fn read(
        &self,
        tp: &TopicPartition,
        offset: i64,
        max_bytes: usize,
        min_one_message: bool,
    ) -> Result<FetchResult, (ErrorCode, Option<PartitionOffsets>)> {
        self.read_maybe_zero_copy(tp, offset, max_bytes, min_one_message, false)
    }

    /// As [`ReplicaManager::read`], but with `zero_copy` the records are not read: only
    /// their file range is returned, for the connection to send with `sendfile`.
    pub fn read_maybe_zero_copy(
        &self,
        tp: &TopicPartition,
        offset: i64,
        max_bytes: usize,
        min_one_message: bool,
        zero_copy: bool,
    ) -> Result<FetchResult, (ErrorCode, Option<PartitionOffsets>)> {
        let partition = self
            .get(tp)
            .ok_or((ErrorCode::UNKNOWN_TOPIC_OR_PARTITION, None))?;
        let result = partition
            .with_log(|log| {
                let offsets = PartitionOffsets {
                    log_start_offset: log.log_start_offset(),
                    high_watermark: log.high_watermark(),
                    log_end_offset: log.log_end_offset(),
                };
                let hw = offsets.high_watermark;
                let data: Result<FetchDataInfo, ReadError> = if zero_copy {
                    log.read_file_range(offset, max_bytes, hw, min_one_message)
                } else {
                    log.read(offset, max_bytes, hw, min_one_message)
                };
                (offsets, data)
            })
            .map_err(|code| (code, None))?;
        match result {
            (offsets, Ok(data)) => Ok(FetchResult {
                offsets,
                records: data.records,
                file_range: data.file_range,
            }),
            (offsets, Err(ReadError::OffsetOutOfRange { .. })) => {
                Err((ErrorCode::OFFSET_OUT_OF_RANGE, Some(offsets)))
            }
            (offsets, Err(e)) => {
                tracing::error!(%tp, error = %e, "read failed");
                Err((ErrorCode::KAFKA_STORAGE_ERROR, Some(offsets)))
            }
        }
    }

    /// ListOffsets by timestamp: `(offset, timestamp, leader_epoch)` of the first record at
    /// or after `timestamp`, or `None` when there is none.
    pub fn offset_for_timestamp(
        &self,
        tp: &TopicPartition,
        timestamp: i64,
    ) -> Result<Option<(i64, i64, i32)>, ErrorCode> {
        let partition = self.get(tp).ok_or(ErrorCode::UNKNOWN_TOPIC_OR_PARTITION)?;
        let found = partition.with_log(|log| log.offset_for_timestamp(timestamp))?;
        Ok(storage_result(tp, found)?.map(|t| {
            (
                t.offset,
                t.timestamp,
                t.leader_epoch.unwrap_or(SINGLE_NODE_LEADER_EPOCH),
            )
        }))
    }

    /// ListOffsets MAX_TIMESTAMP (KIP-734): the offset and timestamp of the record with the
    /// largest timestamp, if any.
    pub fn max_timestamp(&self, tp: &TopicPartition) -> Result<Option<(i64, i64)>, ErrorCode> {
        let partition = self.get(tp).ok_or(ErrorCode::UNKNOWN_TOPIC_OR_PARTITION)?;
        let found = partition.with_log(|log| log.max_timestamp_and_offset())?;
        Ok(storage_result(tp, found)?.map(|t| (t.offset, t.timestamp)))
    }

    /// A future that resolves at the next append to any partition. Fetches create it
    /// before they read and await it after, racing their deadline, so no append between
    /// the read and the wait is missed; a spurious wake-up only costs one more read.
    pub fn appended(&self) -> tokio::sync::futures::Notified<'_> {
        self.appended.notified()
    }

    /// Closes every log (flush, producer snapshot, clean-shutdown marker). A partition
    /// still referenced by an in-flight request is only flushed; its next open recovers.
    pub fn shutdown(&self) {
        let partitions: Vec<_> = self.write_map().drain().collect();
        for (tp, p) in partitions {
            let result = match Arc::try_unwrap(p) {
                Ok(p) => match p.log.into_inner() {
                    Ok(log) => log.close(),
                    Err(_) => continue,
                },
                Err(p) => match p.with_log(|log| log.flush()) {
                    Ok(r) => r,
                    Err(_) => continue,
                },
            };
            if let Err(e) = result {
                tracing::error!(%tp, error = %e, "closing log failed");
            }
        }
    }
}

fn storage_result<T>(
    tp: &TopicPartition,
    r: Result<T, rill_storage::StorageError>,
) -> Result<T, ErrorCode> {
    r.map_err(|e| {
        tracing::error!(%tp, error = %e, "storage error");
        ErrorCode::KAFKA_STORAGE_ERROR
    })
}

/// Maps the log's refusal of an append to the code Kafka gives for it.
pub fn append_error_code(e: &AppendError) -> ErrorCode {
    match e {
        AppendError::CorruptMessage(_) => ErrorCode::CORRUPT_MESSAGE,
        AppendError::InvalidRecord(_) => ErrorCode::INVALID_RECORD,
        AppendError::MessageTooLarge { .. } => ErrorCode::MESSAGE_TOO_LARGE,
        AppendError::OutOfOrderSequence { .. } => ErrorCode::OUT_OF_ORDER_SEQUENCE_NUMBER,
        AppendError::InvalidProducerEpoch { .. } => ErrorCode::INVALID_PRODUCER_EPOCH,
        AppendError::Io(_) => ErrorCode::KAFKA_STORAGE_ERROR,
        #[allow(unreachable_patterns, reason = "the storage enum may grow")]
        _ => ErrorCode::UNKNOWN_SERVER_ERROR,
    }
}
