//! Writing record batches (magic 2): the native producer, the log cleaner, the
//! transaction coordinator's markers and the tests all build batches here.
//!
//! Records are encoded as they are appended into one uncompressed buffer; `build`
//! compresses that buffer as a whole, writes the 61-byte header in front and computes the
//! CRC32C over everything from `attributes` on, exactly as Kafka's `MemoryRecordsBuilder`
//! lays it out:
//!
//! 1. `baseTimestamp` is the first record's timestamp (or the delete horizon when one is
//!    set, KIP-534), and every record stores its delta from it, negative if need be.
//! 2. `lastOffsetDelta` is the last record's offset delta, which equals `recordCount - 1`
//!    unless records were appended with explicit offsets that leave gaps (compaction).
//! 3. An empty batch has no payload at all, `lastOffsetDelta` 0 and timestamps -1; the
//!    cleaner keeps such batches to retain a producer's state.

use bytes::Bytes;

use super::batch::{BatchError, CompressionType, HEADER_LEN, LOG_OVERHEAD, MAGIC_V2};
use super::compression;
use super::record::{encode_record, Header};

/// `RecordBatch.NO_TIMESTAMP` in Kafka.
const NO_TIMESTAMP: i64 = -1;
const TRANSACTIONAL_FLAG: i16 = 0x10;
const CONTROL_FLAG: i16 = 0x20;
const DELETE_HORIZON_FLAG: i16 = 0x40;

/// Builds one record batch. Producer fields default to "no producer" (-1), as a
/// non-idempotent producer sends them.
///
/// ```
/// use bytes::Bytes;
/// use rill_protocol::records::{CompressionType, Header, RecordBatch, RecordBatchBuilder};
///
/// let mut builder = RecordBatchBuilder::new(CompressionType::Zstd, 0)
///     .producer(4000, 0, 17)
///     .transactional(true);
/// builder
///     .append(1_700_000_000_000, Some(b"user-1"), Some(b"{}"), &[Header::new("h", Some(&b"1"[..]))])
///     .unwrap();
/// let batch = RecordBatch::new(builder.build().unwrap()).unwrap();
/// batch.validate().unwrap();
/// assert_eq!(batch.base_sequence(), 17);
/// assert!(batch.is_transactional());
/// assert_eq!(batch.records(1 << 20).unwrap()[0].headers[0].key, "h");
/// ```
#[derive(Debug, Clone)]
pub struct RecordBatchBuilder {
    compression: CompressionType,
    compression_level: Option<i32>,
    base_offset: i64,
    partition_leader_epoch: i32,
    producer_id: i64,
    producer_epoch: i16,
    base_sequence: i32,
    is_transactional: bool,
    is_control: bool,
    delete_horizon_ms: Option<i64>,
    base_timestamp: Option<i64>,
    max_timestamp: i64,
    last_offset_delta: Option<i32>,
    record_count: i32,
    records: Vec<u8>,
}

impl RecordBatchBuilder {
    pub fn new(compression: CompressionType, base_offset: i64) -> Self {
        Self {
            compression,
            compression_level: None,
            base_offset,
            partition_leader_epoch: -1,
            producer_id: -1,
            producer_epoch: -1,
            base_sequence: -1,
            is_transactional: false,
            is_control: false,
            delete_horizon_ms: None,
            base_timestamp: None,
            max_timestamp: NO_TIMESTAMP,
            last_offset_delta: None,
            record_count: 0,
            records: Vec::new(),
        }
    }

    /// Producer id, epoch and the sequence number of the first record (idempotence).
    pub fn producer(mut self, producer_id: i64, producer_epoch: i16, base_sequence: i32) -> Self {
        self.producer_id = producer_id;
        self.producer_epoch = producer_epoch;
        self.base_sequence = base_sequence;
        self
    }

    pub fn transactional(mut self, is_transactional: bool) -> Self {
        self.is_transactional = is_transactional;
        self
    }

    /// A control batch holds transaction markers; see [`super::ControlRecordType`].
    pub fn control(mut self, is_control: bool) -> Self {
        self.is_control = is_control;
        self
    }

    pub fn partition_leader_epoch(mut self, epoch: i32) -> Self {
        self.partition_leader_epoch = epoch;
        self
    }

    /// KIP-390 compression level; `None` is the codec's default.
    pub fn compression_level(mut self, level: Option<i32>) -> Self {
        self.compression_level = level;
        self
    }

    /// KIP-534: marks the batch with a delete horizon, which becomes its base timestamp.
    /// Must be set before the first append, since record deltas are taken from it.
    pub fn delete_horizon(mut self, delete_horizon_ms: i64) -> Self {
        assert!(
            self.record_count == 0,
            "delete horizon set after records were appended"
        );
        self.delete_horizon_ms = Some(delete_horizon_ms);
        self
    }

    /// Appends a record at the next offset (`base_offset` for the first) and returns
    /// that offset.
    pub fn append(
        &mut self,
        timestamp: i64,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: &[Header],
    ) -> Result<i64, BatchError> {
        let delta = match self.last_offset_delta {
            None => 0,
            Some(d) => d
                .checked_add(1)
                .ok_or(BatchError::InvalidRecord("offset delta overflows"))?,
        };
        let offset = self
            .base_offset
            .checked_add(i64::from(delta))
            .ok_or(BatchError::InvalidRecord("offset overflows"))?;
        self.push(delta, timestamp, key, value, headers)?;
        Ok(offset)
    }

    /// Appends a record at an explicit offset, which must be above every offset so far
    /// and not below `base_offset`. The log cleaner uses this to keep the original
    /// offsets of the records it retains.
    pub fn append_with_offset(
        &mut self,
        offset: i64,
        timestamp: i64,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: &[Header],
    ) -> Result<(), BatchError> {
        let delta = offset
            .checked_sub(self.base_offset)
            .and_then(|d| i32::try_from(d).ok())
            .filter(|d| *d >= 0)
            .ok_or(BatchError::InvalidRecord(
                "offset outside the batch's range",
            ))?;
        if self.last_offset_delta.is_some_and(|last| delta <= last) {
            return Err(BatchError::InvalidRecord(
                "offsets must increase within a batch",
            ));
        }
        self.push(delta, timestamp, key, value, headers)
    }

    fn push(
        &mut self,
        offset_delta: i32,
        timestamp: i64,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: &[Header],
    ) -> Result<(), BatchError> {
        let count = self
            .record_count
            .checked_add(1)
            .ok_or(BatchError::InvalidRecord("too many records in one batch"))?;
        let base = self
            .delete_horizon_ms
            .or(self.base_timestamp)
            .unwrap_or(timestamp);
        let timestamp_delta = timestamp
            .checked_sub(base)
            .ok_or(BatchError::InvalidRecord("timestamp delta overflows"))?;
        encode_record(
            &mut self.records,
            timestamp_delta,
            offset_delta,
            key,
            value,
            headers,
        )?;
        self.base_timestamp.get_or_insert(timestamp);
        self.max_timestamp = self.max_timestamp.max(timestamp);
        self.last_offset_delta = Some(offset_delta);
        self.record_count = count;
        Ok(())
    }

    /// Number of records appended so far.
    pub fn len(&self) -> usize {
        self.record_count as usize
    }

    pub fn is_empty(&self) -> bool {
        self.record_count == 0
    }

    /// Size of the batch if it were built uncompressed now; the producer compares this
    /// with `batch.size` (compression only makes the batch smaller, or barely larger).
    pub fn size_in_bytes(&self) -> usize {
        HEADER_LEN + self.records.len()
    }

    pub fn base_offset(&self) -> i64 {
        self.base_offset
    }

    pub fn compression(&self) -> CompressionType {
        self.compression
    }

    /// Compresses the records and writes the batch: header, payload and CRC32C.
    pub fn build(&self) -> Result<Bytes, BatchError> {
        let payload: std::borrow::Cow<'_, [u8]> =
            if self.compression == CompressionType::None || self.record_count == 0 {
                std::borrow::Cow::Borrowed(&self.records)
            } else {
                std::borrow::Cow::Owned(compression::compress_with_level(
                    self.compression,
                    &self.records,
                    self.compression_level,
                )?)
            };
        let batch_length = i32::try_from(HEADER_LEN - LOG_OVERHEAD + payload.len())
            .map_err(|_| BatchError::InvalidRecord("batch larger than 2 GiB"))?;
        let mut attributes = self.compression.id();
        if self.is_transactional {
            attributes |= TRANSACTIONAL_FLAG;
        }
        if self.is_control {
            attributes |= CONTROL_FLAG;
        }
        if self.delete_horizon_ms.is_some() {
            attributes |= DELETE_HORIZON_FLAG;
        }
        let base_timestamp = self
            .delete_horizon_ms
            .or(self.base_timestamp)
            .unwrap_or(NO_TIMESTAMP);

        let mut b = Vec::with_capacity(HEADER_LEN + payload.len());
        b.extend_from_slice(&self.base_offset.to_be_bytes());
        b.extend_from_slice(&batch_length.to_be_bytes());
        b.extend_from_slice(&self.partition_leader_epoch.to_be_bytes());
        b.push(MAGIC_V2 as u8);
        let crc_at = b.len();
        b.extend_from_slice(&0u32.to_be_bytes());
        let attributes_at = b.len();
        b.extend_from_slice(&attributes.to_be_bytes());
        b.extend_from_slice(&self.last_offset_delta.unwrap_or(0).to_be_bytes());
        b.extend_from_slice(&base_timestamp.to_be_bytes());
        b.extend_from_slice(&self.max_timestamp.to_be_bytes());
        b.extend_from_slice(&self.producer_id.to_be_bytes());
        b.extend_from_slice(&self.producer_epoch.to_be_bytes());
        b.extend_from_slice(&self.base_sequence.to_be_bytes());
        b.extend_from_slice(&self.record_count.to_be_bytes());
        debug_assert_eq!(b.len(), HEADER_LEN);
        b.extend_from_slice(&payload);
        let crc = crc32c::crc32c(&b[attributes_at..]);
        b[crc_at..crc_at + 4].copy_from_slice(&crc.to_be_bytes());
        Ok(Bytes::from(b))
    }
}
