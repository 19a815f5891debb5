//! The errors of the partition log.
//!
//! [`StorageError`] is what opening, flushing, truncating and closing a log can fail
//! with: the disk, or a directory that is not a log. [`AppendError`] and [`ReadError`]
//! are the typed outcomes of the produce and fetch paths; the broker maps each variant
//! to one Kafka error code (`CORRUPT_MESSAGE`, `INVALID_RECORD`, `MESSAGE_TOO_LARGE`,
//! `OUT_OF_ORDER_SEQUENCE_NUMBER`, `INVALID_PRODUCER_EPOCH`, `INVALID_TIMESTAMP`,
//! `OFFSET_OUT_OF_RANGE`, `KAFKA_STORAGE_ERROR`) and never invents one.

use std::path::PathBuf;

use rill_protocol::records::BatchError;

/// A failure of the log's files.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("i/o error on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is corrupt: {reason}")]
    Corrupt { path: PathBuf, reason: String },
    #[error("{0:?} is not a partition directory name (expected <topic>-<partition>)")]
    InvalidPartitionDir(String),
    #[error("invalid log configuration: {0}")]
    InvalidConfig(String),
    /// An earlier write or fsync of this log failed; the log takes no more writes
    /// (fail-stop: after a failed fsync the page cache may not match the disk, so
    /// retrying could acknowledge data that is not there).
    #[error("log {path} is offline after an earlier i/o error: {cause}")]
    Offline { path: PathBuf, cause: String },
}

impl StorageError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            path: path.into(),
            source,
        }
    }

    /// The operating-system error behind this one, when the disk failed (as opposed to
    /// a file that did not parse or a log already offline).
    pub fn io_error(&self) -> Option<&std::io::Error> {
        match self {
            Self::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// Why an append was refused. Nothing was written when this is returned, except for
/// [`AppendError::Io`], after which the log should be considered failed (fail-stop).
#[derive(Debug, thiserror::Error)]
pub enum AppendError {
    /// Framing or CRC damage: `CORRUPT_MESSAGE`.
    #[error("corrupt record batch: {0}")]
    CorruptMessage(#[source] BatchError),
    /// A well-formed batch that breaks a rule (control batch from a client, negative
    /// sequence, bad record count, unsupported magic): `INVALID_RECORD`.
    #[error("invalid record: {0}")]
    InvalidRecord(String),
    /// A batch larger than `max.message.bytes`, or a record set larger than a segment:
    /// `MESSAGE_TOO_LARGE`.
    #[error("record batch of {size} bytes exceeds the limit of {max} bytes")]
    MessageTooLarge { size: usize, max: usize },
    /// The batch's first sequence does not follow the producer's last one:
    /// `OUT_OF_ORDER_SEQUENCE_NUMBER`.
    #[error(
        "out of order sequence for producer {producer_id}: epoch {producer_epoch}, \
         expected {expected}, got {found}"
    )]
    OutOfOrderSequence {
        producer_id: i64,
        producer_epoch: i16,
        expected: i32,
        found: i32,
    },
    /// The batch's producer epoch is older than the one the log knows: a fenced zombie,
    /// `INVALID_PRODUCER_EPOCH`.
    #[error("producer {producer_id} epoch {found} is older than the current epoch {current}")]
    InvalidProducerEpoch {
        producer_id: i64,
        current: i16,
        found: i16,
    },
    /// A transactional producer's batch that does not fit its transaction's state (a
    /// non-transactional batch while its transaction is open): `INVALID_TXN_STATE`.
    #[error("invalid transaction state for producer {producer_id}: {reason}")]
    InvalidTxnState {
        producer_id: i64,
        reason: &'static str,
    },
    /// A transaction marker from a coordinator epoch older than the one of the
    /// producer's last marker: `TRANSACTION_COORDINATOR_FENCED`.
    #[error(
        "marker for producer {producer_id} from coordinator epoch {found}, older than {current}"
    )]
    TransactionCoordinatorFenced {
        producer_id: i64,
        current: i32,
        found: i32,
    },
    /// Records of a client's batch failed the record-by-record checks (Kafka's
    /// `RecordValidationException`, KIP-467): a compacted topic's record without a key,
    /// or under CreateTime a timestamp further from the broker's clock than
    /// `message.timestamp.before.max.ms` / `after.max.ms` allow. The batch is refused
    /// whole; every failed record is named, so that the producer can fail just those and
    /// retry the rest. `INVALID_TIMESTAMP` when any is a timestamp, else `INVALID_RECORD`.
    #[error("{}", .0)]
    RecordErrors(RecordErrors),
    /// A follower append whose offsets go backwards or overlap the log.
    #[error("follower append offsets out of order: expected at least {expected}, got {found}")]
    OffsetsOutOfOrder { expected: i64, found: i64 },
    /// The disk failed while writing (or the log is already offline after such a
    /// failure): `KAFKA_STORAGE_ERROR`, and the broker marks the log directory offline.
    /// The log itself refuses every later write, see [`crate::UnifiedLog::offline_cause`].
    #[error(transparent)]
    Io(#[from] StorageError),
}

/// Why a read was refused.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// `OFFSET_OUT_OF_RANGE`; the consumer resets its position from these bounds.
    #[error("offset {offset} is out of range [{log_start}, {log_end}]")]
    OffsetOutOfRange {
        offset: i64,
        log_start: i64,
        log_end: i64,
    },
    #[error(transparent)]
    Io(#[from] StorageError),
}

/// Why a DeleteRecords was refused.
#[derive(Debug, thiserror::Error)]
pub enum DeleteRecordsError {
    /// The offset is above the high watermark (or negative other than -1):
    /// `OFFSET_OUT_OF_RANGE`.
    #[error("offset {offset} is out of range [{log_start}, {high_watermark}]")]
    OffsetOutOfRange {
        offset: i64,
        log_start: i64,
        high_watermark: i64,
    },
    /// The topic is `cleanup.policy=compact` only, where Kafka refuses DeleteRecords:
    /// `POLICY_VIOLATION`.
    #[error("records of a compacted topic cannot be deleted")]
    PolicyViolation,
    #[error(transparent)]
    Io(#[from] StorageError),
}

/// The records of one batch that failed their checks, in batch order: at most
/// [`RecordErrors::MAX_LISTED`] of them are kept, `total` counts them all.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RecordErrors {
    pub errors: Vec<RecordError>,
    pub total: usize,
    /// Some failed record (listed or not) has a timestamp out of range.
    pub any_timestamp: bool,
}

impl RecordErrors {
    /// Kafka lists every failed record; a decompressed batch may hold millions of
    /// records, so a hostile one could make the response as large. No producer sends
    /// batches of more records than this (librdkafka's `batch.num.messages` defaults to
    /// 10,000); past it, the records are still refused, only not named.
    pub const MAX_LISTED: usize = 10_000;

    pub(crate) fn push(&mut self, error: RecordError) {
        self.total += 1;
        self.any_timestamp |= matches!(error.kind, RecordErrorKind::Timestamp { .. });
        if self.errors.len() < Self::MAX_LISTED {
            self.errors.push(error);
        }
    }
}

impl std::fmt::Display for RecordErrors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} record(s) of the batch refused", self.total)?;
        if let Some(first) = self.errors.first() {
            write!(f, ", the first: {first}")?;
        }
        Ok(())
    }
}

/// One refused record: its position in the batch (Kafka's `batchIndex`) and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordError {
    pub batch_index: usize,
    pub kind: RecordErrorKind,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordErrorKind {
    /// A record without a key in a compacted topic.
    MissingKey,
    /// A create time outside `[earliest, latest]`; `offset` is the record's offset as
    /// the client numbered it (base offset plus delta), which Kafka's message quotes.
    Timestamp {
        timestamp: i64,
        offset: i64,
        earliest: i64,
        latest: i64,
    },
}

impl std::fmt::Display for RecordError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            RecordErrorKind::MissingKey => write!(
                f,
                "record {} has no key, which a compacted topic needs",
                self.batch_index
            ),
            RecordErrorKind::Timestamp {
                timestamp,
                earliest,
                latest,
                ..
            } => write!(
                f,
                "timestamp {timestamp} of record {} is out of range: it should be within \
                 [{earliest}, {latest}]",
                self.batch_index
            ),
        }
    }
}
