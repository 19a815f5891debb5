//! Per-log configuration, with Kafka's topic-config names and defaults.

use std::time::Duration;

/// `message.timestamp.type`: whether a batch keeps its producer's timestamp or gets the
/// broker's clock when it is appended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MessageTimestampType {
    #[default]
    CreateTime,
    LogAppendTime,
}

/// The settings of one partition log. Field names are Kafka's topic configs with dots
/// turned into underscores (`segment.bytes` is `segment_bytes`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogConfig {
    /// `segment.bytes`: roll the active segment before it would exceed this size.
    pub segment_bytes: u64,
    /// `segment.ms`: roll a non-empty segment once it is this old.
    pub segment_ms: i64,
    /// `segment.index.bytes`: the maximum size of an offset index; a full index rolls.
    pub segment_index_bytes: u64,
    /// `index.interval.bytes`: bytes of log between two offset-index entries.
    pub index_interval_bytes: u64,
    /// `flush.messages`: fsync after this many messages; `None` leaves it to the page
    /// cache (and to replication for durability), which is Kafka's default.
    pub flush_messages: Option<u64>,
    /// `flush.ms`: fsync when the last flush is this old (checked on append).
    pub flush_ms: Option<i64>,
    /// `max.message.bytes`: the largest record batch accepted from a producer.
    pub max_message_bytes: usize,
    /// `message.timestamp.type`.
    pub message_timestamp_type: MessageTimestampType,
    /// `retention.ms` (-1: unlimited). Enforced by the retention task, not yet here.
    pub retention_ms: i64,
    /// `retention.bytes` (-1: unlimited). Enforced by the retention task, not yet here.
    pub retention_bytes: i64,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            segment_bytes: 1024 * 1024 * 1024,
            segment_ms: Duration::from_secs(7 * 24 * 3600).as_millis() as i64,
            segment_index_bytes: 10 * 1024 * 1024,
            index_interval_bytes: 4096,
            flush_messages: None,
            flush_ms: None,
            max_message_bytes: 1_048_588,
            message_timestamp_type: MessageTimestampType::CreateTime,
            retention_ms: Duration::from_secs(7 * 24 * 3600).as_millis() as i64,
            retention_bytes: -1,
        }
    }
}

impl LogConfig {
    /// Refuses settings that would make the log misbehave rather than fail loudly later.
    pub fn validate(&self) -> Result<(), crate::StorageError> {
        let err = |m: &str| Err(crate::StorageError::InvalidConfig(m.to_owned()));
        // Kafka's lower bound for segment.bytes is 14 (the minimum batch overhead); we
        // need at least a header so that every segment can hold one batch.
        if self.segment_bytes < rill_protocol::records::batch::HEADER_LEN as u64 {
            return err("segment.bytes is smaller than a record batch header");
        }
        if self.segment_bytes > i32::MAX as u64 {
            // Positions in the offset index are 32-bit, as in Kafka.
            return err("segment.bytes must fit a 32-bit position");
        }
        if self.segment_ms <= 0 {
            return err("segment.ms must be positive");
        }
        if self.segment_index_bytes < 8 {
            return err("segment.index.bytes must hold at least one entry");
        }
        if self.flush_messages == Some(0) {
            return err("flush.messages must be positive");
        }
        Ok(())
    }
}
