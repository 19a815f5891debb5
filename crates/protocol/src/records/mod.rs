//! Record batches as Kafka stores and sends them (magic 2 only).
//!
//! The broker never decodes records on the produce or fetch path: it validates a batch
//! through the header view in [`batch`] and moves the bytes as they came. Decoding the
//! records themselves (and decompressing them, always with a cap) is for clients, tests
//! and the log cleaner.

pub mod batch;

pub use batch::{BatchError, CompressionType, RecordBatch, TimestampType};
