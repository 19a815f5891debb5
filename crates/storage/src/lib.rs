//! The partition log: segments, indexes, recovery — Kafka's log layer.
//!
//! - [`UnifiedLog`]: one partition's log; append as leader or follower, read by
//!   offset, look up by timestamp, truncate, recover.
//! - [`segment`]: `LogSegment`, a `.log` with its `.index` and `.timeindex`, and the
//!   recovery design note.
//! - [`index`]: `OffsetIndex` and `TimeIndex`.
//! - [`epoch`]: `LeaderEpochFileCache` (`leader-epoch-checkpoint`).
//! - [`producer_state`]: `ProducerStateManager`, idempotent-producer deduplication and
//!   each producer's open transaction (the last stable offset).
//! - [`transaction_index`]: `TransactionIndex`, the aborted transactions (`.txnindex`).
//! - [`retention`]: `cleanup.policy=delete`, DeleteRecords, rolling a quiet partition.
//! - [`remote`]: the log's side of tiered storage (KIP-405): copy candidates, the
//!   leader epoch lineage check, remote retention, reads of a remote segment's copy.
//! - [`cleaner`]: `cleanup.policy=compact`, the log cleaner and its segment swap.
//! - [`clean_shutdown`]: the data directory's clean-shutdown marker and the one
//!   `syncfs` that makes a clean close durable.
//! - `validator`: Kafka's `LogValidator`, the leader's record checks (keys, timestamp
//!   bounds) and the re-encoding of a batch with the topic's `compression.type`.
//!
//! Architecture Invariant: this crate does no networking and reads no clock; every
//! time-dependent call takes `now_ms`. It depends on `rill-protocol` only for the record
//! batch header view (and on `rustix` for `syncfs`).

mod checkpoint;
pub mod clean_shutdown;
pub mod cleaner;
pub mod config;
pub mod epoch;
pub mod error;
pub mod flush;
mod header;
pub mod index;
pub mod log;
pub mod producer_state;
mod records;
pub mod remote;
pub mod retention;
pub mod segment;
mod swap;
pub mod topic_partition;
pub mod transaction_index;
mod validator;

#[cfg(test)]
mod test_util;

pub use clean_shutdown::{DataDirSync, PreviousShutdown};
pub use cleaner::{CleanStats, CleanTask, CleanedSegments, CleanerConfig};
pub use config::{BrokerCompressionType, CleanupPolicy, LogConfig, MessageTimestampType};
pub use epoch::{EpochEntry, LeaderEpochFileCache, UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET};
pub use error::{
    AppendError, DeleteRecordsError, ReadError, RecordError, RecordErrorKind, RecordErrors,
    StorageError,
};
pub use flush::{FlushDone, LogFlusher, PendingFlush};
pub use header::transactional_producer;
pub use log::{
    end_txn_marker_batch, LogAppendInfo, TimestampAndOffset, UnifiedLog, ValidatedRecords,
};
pub use producer_state::{AppendOrigin, BatchMetadata, EndTxnMarker, ProducerStateEntry};
pub use remote::{RemoteCopyCandidate, RemoteSegmentReader, RemoteSegmentSummary};
pub use retention::RetentionResult;
pub use segment::{FetchDataInfo, FileRange, LogOffsetMetadata};
pub use topic_partition::{parse_partition_dir_name, partition_dir_name, TopicPartition};
pub use transaction_index::AbortedTxn;
