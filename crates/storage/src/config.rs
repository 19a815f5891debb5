//! Per-log configuration, with Kafka's topic-config names and defaults.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use rill_protocol::records::CompressionType;

/// `cleanup.policy`: what happens to old data. Kafka's value is a comma-separated list
/// of `delete` and `compact`; both together mean "compact, and also delete by retention".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CleanupPolicy {
    /// Whole segments go once they pass `retention.ms` or `retention.bytes`.
    #[default]
    Delete,
    /// The cleaner keeps the latest record per key; nothing is deleted by age or size.
    Compact,
    /// Both: compacted, and whole segments still expire by retention.
    CompactDelete,
}

impl CleanupPolicy {
    pub fn is_delete(self) -> bool {
        matches!(self, Self::Delete | Self::CompactDelete)
    }
    pub fn is_compact(self) -> bool {
        matches!(self, Self::Compact | Self::CompactDelete)
    }
}

impl FromStr for CleanupPolicy {
    type Err = crate::StorageError;

    /// Accepts Kafka's list syntax in any order, ignoring blanks and case.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (mut delete, mut compact) = (false, false);
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match part.to_ascii_lowercase().as_str() {
                "delete" => delete = true,
                "compact" => compact = true,
                _ => {
                    return Err(crate::StorageError::InvalidConfig(format!(
                        "unknown cleanup.policy {part:?}"
                    )))
                }
            }
        }
        match (delete, compact) {
            (true, false) => Ok(Self::Delete),
            (false, true) => Ok(Self::Compact),
            (true, true) => Ok(Self::CompactDelete),
            (false, false) => Err(crate::StorageError::InvalidConfig(
                "cleanup.policy is empty".into(),
            )),
        }
    }
}

impl fmt::Display for CleanupPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Delete => "delete",
            Self::Compact => "compact",
            Self::CompactDelete => "compact,delete",
        })
    }
}

/// `message.timestamp.type`: whether a batch keeps its producer's timestamp or gets the
/// broker's clock when it is appended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MessageTimestampType {
    #[default]
    CreateTime,
    LogAppendTime,
}

/// `compression.type`: the codec the leader stores client batches with. `producer` keeps
/// each batch as its producer compressed it; any other value makes the leader re-encode
/// a batch whose codec differs (Kafka's `BrokerCompressionType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BrokerCompressionType {
    #[default]
    Producer,
    Uncompressed,
    Gzip,
    Snappy,
    Lz4,
    Zstd,
}

impl BrokerCompressionType {
    /// The codec a batch sent with `source` is stored with.
    pub fn target_codec(self, source: CompressionType) -> CompressionType {
        match self {
            Self::Producer => source,
            Self::Uncompressed => CompressionType::None,
            Self::Gzip => CompressionType::Gzip,
            Self::Snappy => CompressionType::Snappy,
            Self::Lz4 => CompressionType::Lz4,
            Self::Zstd => CompressionType::Zstd,
        }
    }
}

impl FromStr for BrokerCompressionType {
    type Err = crate::StorageError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "producer" => Ok(Self::Producer),
            "uncompressed" | "none" => Ok(Self::Uncompressed),
            "gzip" => Ok(Self::Gzip),
            "snappy" => Ok(Self::Snappy),
            "lz4" => Ok(Self::Lz4),
            "zstd" => Ok(Self::Zstd),
            other => Err(crate::StorageError::InvalidConfig(format!(
                "unknown compression.type {other:?}"
            ))),
        }
    }
}

impl fmt::Display for BrokerCompressionType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Producer => "producer",
            Self::Uncompressed => "uncompressed",
            Self::Gzip => "gzip",
            Self::Snappy => "snappy",
            Self::Lz4 => "lz4",
            Self::Zstd => "zstd",
        })
    }
}

/// The settings of one partition log. Field names are Kafka's topic configs with dots
/// turned into underscores (`segment.bytes` is `segment_bytes`).
#[derive(Debug, Clone, PartialEq)]
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
    /// `message.timestamp.before.max.ms`: under CreateTime, how far a record's timestamp
    /// may lie behind the broker's clock (`i64::MAX`: unbounded, Kafka's default).
    pub message_timestamp_before_max_ms: i64,
    /// `message.timestamp.after.max.ms`: how far it may lie ahead of the broker's clock.
    pub message_timestamp_after_max_ms: i64,
    /// `compression.type`.
    pub compression_type: BrokerCompressionType,
    /// `compression.gzip.level` (KIP-390) when the broker compresses with gzip; `None` for
    /// the codec's default.
    pub compression_gzip_level: Option<i32>,
    /// `compression.zstd.level` likewise. (lz4's level has no effect: the frame encoder
    /// Rill uses has one.)
    pub compression_zstd_level: Option<i32>,
    /// `retention.ms` (-1: unlimited), enforced by `UnifiedLog::delete_old_segments`
    /// when the policy includes `delete`.
    pub retention_ms: i64,
    /// `retention.bytes` (-1: unlimited), enforced likewise.
    pub retention_bytes: i64,
    /// `cleanup.policy`.
    pub cleanup_policy: CleanupPolicy,
    /// `delete.retention.ms`: how long a tombstone stays readable after the cleaner first
    /// saw it (so that a consumer that is behind still sees the delete).
    pub delete_retention_ms: i64,
    /// `min.cleanable.dirty.ratio`: the share of the cleanable bytes not yet cleaned
    /// above which a compacted log is worth cleaning.
    pub min_cleanable_dirty_ratio: f64,
    /// `min.compaction.lag.ms`: a record stays uncompacted at least this long.
    pub min_compaction_lag_ms: i64,
    /// `max.compaction.lag.ms`: a dirty record is compacted within about this long,
    /// whatever the dirty ratio.
    pub max_compaction_lag_ms: i64,
    /// `remote.storage.enable` (KIP-405): closed segments are copied to the remote tier
    /// and a local segment is deleted only once it is there (see [`crate::remote`]).
    pub remote_storage_enable: bool,
    /// `local.retention.ms`: how long a segment stays on local disk once it is in the
    /// remote tier (-2: `retention.ms`; -1: forever). See [`Self::local_retention_ms`].
    pub local_retention_ms: i64,
    /// `local.retention.bytes`: how large the local part of a tiered log may grow
    /// (-2: `retention.bytes`; -1: unbounded). See [`Self::local_retention_bytes`].
    pub local_retention_bytes: i64,
    /// `remote.log.copy.disable`: the remote tier is read-only (KIP-950): no more
    /// segments are copied, reads and remote retention go on.
    pub remote_log_copy_disable: bool,
    /// `remote.log.delete.on.disable`: whether turning `remote.storage.enable` off
    /// deletes the remote data (KIP-950; Kafka refuses to turn it off otherwise).
    pub remote_log_delete_on_disable: bool,
}

// `min_cleanable_dirty_ratio` is the only float and `validate` refuses NaN, so equality
// is reflexive for every config a log accepts.
impl Eq for LogConfig {}

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
            message_timestamp_before_max_ms: i64::MAX,
            // Kafka 4.0's default: an hour ahead of the broker's clock at most.
            message_timestamp_after_max_ms: 3_600_000,
            compression_type: BrokerCompressionType::Producer,
            compression_gzip_level: None,
            compression_zstd_level: Some(3),
            retention_ms: Duration::from_secs(7 * 24 * 3600).as_millis() as i64,
            retention_bytes: -1,
            cleanup_policy: CleanupPolicy::Delete,
            delete_retention_ms: Duration::from_secs(24 * 3600).as_millis() as i64,
            min_cleanable_dirty_ratio: 0.5,
            min_compaction_lag_ms: 0,
            max_compaction_lag_ms: i64::MAX,
            remote_storage_enable: false,
            local_retention_ms: -2,
            local_retention_bytes: -2,
            remote_log_copy_disable: false,
            remote_log_delete_on_disable: false,
        }
    }
}

impl LogConfig {
    /// The level the broker compresses `codec` at (KIP-390), `None` for its default.
    pub fn compression_level(&self, codec: rill_protocol::records::CompressionType) -> Option<i32> {
        use rill_protocol::records::CompressionType;
        match codec {
            CompressionType::Gzip => self.compression_gzip_level,
            CompressionType::Zstd => self.compression_zstd_level,
            _ => None,
        }
    }

    /// The local tier's retention time (Kafka's `localRetentionMs`): `local.retention.ms`,
    /// or `retention.ms` when it is -2.
    pub fn local_retention_ms(&self) -> i64 {
        if self.local_retention_ms == -2 {
            self.retention_ms
        } else {
            self.local_retention_ms
        }
    }

    /// The local tier's retention size (Kafka's `localRetentionBytes`):
    /// `local.retention.bytes`, or `retention.bytes` when it is -2.
    pub fn local_retention_bytes(&self) -> i64 {
        if self.local_retention_bytes == -2 {
            self.retention_bytes
        } else {
            self.local_retention_bytes
        }
    }

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
        if !(0.0..=1.0).contains(&self.min_cleanable_dirty_ratio) {
            return err("min.cleanable.dirty.ratio must be between 0 and 1");
        }
        if self.delete_retention_ms < 0 || self.min_compaction_lag_ms < 0 {
            return err("delete.retention.ms and min.compaction.lag.ms must not be negative");
        }
        if self.message_timestamp_before_max_ms < 0 || self.message_timestamp_after_max_ms < 0 {
            return err("message.timestamp.before.max.ms and after.max.ms must not be negative");
        }
        if self.max_compaction_lag_ms < 1 {
            return err("max.compaction.lag.ms must be positive");
        }
        Ok(())
    }

    /// How old the active segment may get before it is rolled: `segment.ms`, or less
    /// for a compacted log whose `max.compaction.lag.ms` is shorter, since the active
    /// segment is never cleaned (Kafka's `maxSegmentMs`).
    pub fn max_segment_ms(&self) -> i64 {
        if self.cleanup_policy.is_compact() {
            self.segment_ms.min(self.max_compaction_lag_ms)
        } else {
            self.segment_ms
        }
    }
}
