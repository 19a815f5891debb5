//! Record batches as Kafka stores and sends them (magic 2 only).
//!
//! The broker never decodes records on the produce or fetch path: it validates a batch
//! through the header view in [`batch`] and moves the bytes as they came. Decoding the
//! records themselves (and decompressing them, always with a cap) is for clients, tests
//! and the log cleaner:
//!
//! - [`record`]: [`Record`] and [`Header`], and [`RecordBatch::records`] /
//!   [`RecordBatch::record_iter`], which decode a batch's records zero-copy.
//! - [`compression`]: gzip, snappy (xerial framing, raw blocks accepted), lz4 (frame
//!   format) and zstd, each decoder capped against decompression bombs.
//! - [`builder`]: [`RecordBatchBuilder`], which writes a complete batch with its CRC.
//! - [`aborted`]: [`AbortedTransactions`], what a read_committed reader skips.

pub mod aborted;
pub mod batch;
pub mod builder;
pub mod compression;
pub mod record;
mod varint;

pub use aborted::AbortedTransactions;
pub use batch::{BatchError, CompressionType, RecordBatch, TimestampType};
pub use builder::RecordBatchBuilder;
pub use record::{end_txn_marker_value, ControlRecordType, Header, Record, RecordIter, RecordRef};
