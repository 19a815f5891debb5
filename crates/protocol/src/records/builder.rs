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
//!
//! The buffer starts with room for the header, so that [`RecordBatchBuilder::finish`] can
//! write the header in place and hand the buffer over without copying the records again
//! (the producer's hot path: each value byte is copied once, into this buffer, and from
//! there straight to the socket). [`RecordBatchBuilder::with_buffer`] reuses a buffer
//! that an earlier batch gave back, so that a busy producer does not fault in fresh pages
//! for every batch.

use bytes::Bytes;

use super::batch::{BatchError, CompressionType, CRC, HEADER_LEN, LOG_OVERHEAD, MAGIC_V2};
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
    /// `HEADER_LEN` bytes of room for the header (written by `finish`/`build`), then the
    /// uncompressed records.
    buf: Vec<u8>,
}

impl RecordBatchBuilder {
    pub fn new(compression: CompressionType, base_offset: i64) -> Self {
        Self::with_buffer(compression, base_offset, Vec::new())
    }

    /// A builder whose records go into `buf` (cleared first; its capacity is kept), e.g.
    /// a buffer that [`Self::finish`] returned for an earlier batch.
    pub fn with_buffer(compression: CompressionType, base_offset: i64, mut buf: Vec<u8>) -> Self {
        buf.clear();
        buf.resize(HEADER_LEN, 0);
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
            buf,
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
            &mut self.buf,
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
        self.buf.len()
    }

    /// Bytes the buffer can hold before it has to grow.
    pub fn capacity(&self) -> usize {
        self.buf.capacity()
    }

    /// Makes room for at least `additional` more bytes of records at once, so that the
    /// buffer does not grow (and copy itself) step by step.
    pub fn reserve(&mut self, additional: usize) {
        self.buf.reserve(additional);
    }

    /// The uncompressed records encoded so far.
    fn records(&self) -> &[u8] {
        self.buf.get(HEADER_LEN..).unwrap_or_default()
    }

    pub fn base_offset(&self) -> i64 {
        self.base_offset
    }

    pub fn compression(&self) -> CompressionType {
        self.compression
    }

    /// Compresses the records and writes the batch: header, payload and CRC32C. Leaves
    /// the builder as it was; [`Self::finish`] does the same without copying the records.
    pub fn build(&self) -> Result<Bytes, BatchError> {
        let mut out = Vec::new();
        match self.compressed_payload()? {
            Some(payload) => {
                out.reserve_exact(HEADER_LEN + payload.len());
                out.resize(HEADER_LEN, 0);
                out.extend_from_slice(&payload);
            }
            None => out.extend_from_slice(&self.buf),
        }
        self.write_header(&mut out)?;
        Ok(Bytes::from(out))
    }

    /// Writes the batch like [`Self::build`] and returns it as a plain buffer: without
    /// compression the header goes into the room left at the front and the records are
    /// not copied; with compression the compressed payload goes after a fresh header.
    /// The buffer can go back into [`Self::with_buffer`] once it has been sent.
    pub fn finish(mut self) -> Result<Vec<u8>, BatchError> {
        let mut out = match self.compressed_payload()? {
            Some(payload) => {
                let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
                out.resize(HEADER_LEN, 0);
                out.extend_from_slice(&payload);
                out
            }
            None => std::mem::take(&mut self.buf),
        };
        self.write_header(&mut out)?;
        Ok(out)
    }

    /// The compressed records, or `None` when the batch goes uncompressed (no codec, or
    /// an empty batch, which has no payload even with a codec).
    fn compressed_payload(&self) -> Result<Option<Vec<u8>>, BatchError> {
        if self.compression == CompressionType::None || self.record_count == 0 {
            return Ok(None);
        }
        compression::compress_with_level(self.compression, self.records(), self.compression_level)
            .map(Some)
    }

    /// Fills in the first `HEADER_LEN` bytes of `out` (which holds the payload after
    /// them) and the CRC32C over everything from `attributes` on.
    fn write_header(&self, out: &mut [u8]) -> Result<(), BatchError> {
        let payload_len = out
            .len()
            .checked_sub(HEADER_LEN)
            .ok_or(BatchError::InvalidRecord("batch shorter than its header"))?;
        let batch_length = i32::try_from(HEADER_LEN - LOG_OVERHEAD + payload_len)
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

        let mut h = [0u8; HEADER_LEN];
        let mut at = 0;
        let mut put = |bytes: &[u8]| {
            h[at..at + bytes.len()].copy_from_slice(bytes);
            at += bytes.len();
        };
        put(&self.base_offset.to_be_bytes());
        put(&batch_length.to_be_bytes());
        put(&self.partition_leader_epoch.to_be_bytes());
        put(&[MAGIC_V2 as u8]);
        put(&0u32.to_be_bytes()); // CRC, below
        put(&attributes.to_be_bytes());
        put(&self.last_offset_delta.unwrap_or(0).to_be_bytes());
        put(&base_timestamp.to_be_bytes());
        put(&self.max_timestamp.to_be_bytes());
        put(&self.producer_id.to_be_bytes());
        put(&self.producer_epoch.to_be_bytes());
        put(&self.base_sequence.to_be_bytes());
        put(&self.record_count.to_be_bytes());
        debug_assert_eq!(at, HEADER_LEN);
        out[..HEADER_LEN].copy_from_slice(&h);
        let crc = crc32c::crc32c(&out[CRC + 4..]);
        out[CRC..CRC + 4].copy_from_slice(&crc.to_be_bytes());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::RecordBatch;

    /// The encoder as it was before the header moved into the buffer (a second buffer,
    /// header first, then a copy of the payload), kept to check the new one against it.
    fn reference_build(b: &RecordBatchBuilder) -> Vec<u8> {
        let records = b.records();
        let payload: Vec<u8> = if b.compression == CompressionType::None || b.record_count == 0 {
            records.to_vec()
        } else {
            compression::compress_with_level(b.compression, records, b.compression_level).unwrap()
        };
        let batch_length = (HEADER_LEN - LOG_OVERHEAD + payload.len()) as i32;
        let mut attributes = b.compression.id();
        if b.is_transactional {
            attributes |= TRANSACTIONAL_FLAG;
        }
        if b.is_control {
            attributes |= CONTROL_FLAG;
        }
        if b.delete_horizon_ms.is_some() {
            attributes |= DELETE_HORIZON_FLAG;
        }
        let base_timestamp = b
            .delete_horizon_ms
            .or(b.base_timestamp)
            .unwrap_or(NO_TIMESTAMP);
        let mut out = Vec::new();
        out.extend_from_slice(&b.base_offset.to_be_bytes());
        out.extend_from_slice(&batch_length.to_be_bytes());
        out.extend_from_slice(&b.partition_leader_epoch.to_be_bytes());
        out.push(MAGIC_V2 as u8);
        let crc_at = out.len();
        out.extend_from_slice(&0u32.to_be_bytes());
        let attributes_at = out.len();
        out.extend_from_slice(&attributes.to_be_bytes());
        out.extend_from_slice(&b.last_offset_delta.unwrap_or(0).to_be_bytes());
        out.extend_from_slice(&base_timestamp.to_be_bytes());
        out.extend_from_slice(&b.max_timestamp.to_be_bytes());
        out.extend_from_slice(&b.producer_id.to_be_bytes());
        out.extend_from_slice(&b.producer_epoch.to_be_bytes());
        out.extend_from_slice(&b.base_sequence.to_be_bytes());
        out.extend_from_slice(&b.record_count.to_be_bytes());
        out.extend_from_slice(&payload);
        let crc = crc32c::crc32c(&out[attributes_at..]);
        out[crc_at..crc_at + 4].copy_from_slice(&crc.to_be_bytes());
        out
    }

    fn fill(mut b: RecordBatchBuilder, n: usize) -> RecordBatchBuilder {
        for i in 0..n {
            let value: Vec<u8> = (0..(i * 37) % 300).map(|j| (i * 7 + j) as u8).collect();
            let key = format!("key-{i}");
            let headers = if i % 3 == 0 {
                vec![
                    Header::new("h", Some(&b"v"[..])),
                    Header::new("n", None::<Bytes>),
                ]
            } else {
                Vec::new()
            };
            let key = (i % 4 != 0).then_some(key.as_bytes());
            let value = (i % 5 != 0).then_some(value.as_slice());
            // Timestamps go backwards too: deltas from the first may be negative.
            let ts = 1_700_000_000_000 + (i as i64 * 13 % 7) - 3;
            b.append(ts, key, value, &headers).unwrap();
        }
        b
    }

    #[test]
    fn finish_and_build_match_the_previous_encoder_byte_for_byte() {
        let codecs = [
            CompressionType::None,
            CompressionType::Gzip,
            CompressionType::Snappy,
            CompressionType::Lz4,
            CompressionType::Zstd,
        ];
        for codec in codecs {
            for n in [0, 1, 2, 50, 700] {
                let variants = [
                    RecordBatchBuilder::new(codec, 0),
                    RecordBatchBuilder::new(codec, 1234).producer(77, 3, 41),
                    RecordBatchBuilder::new(codec, 9)
                        .producer(5, 0, i32::MAX - 10)
                        .transactional(true)
                        .partition_leader_epoch(12),
                    RecordBatchBuilder::new(codec, 0).delete_horizon(1_800_000_000_000),
                ];
                for b in variants {
                    let b = fill(b, n);
                    let expected = reference_build(&b);
                    assert_eq!(
                        b.build().unwrap().as_ref(),
                        &expected[..],
                        "{codec:?} n={n}"
                    );
                    assert_eq!(b.clone().finish().unwrap(), expected, "{codec:?} n={n}");
                    let batch = RecordBatch::new(Bytes::from(expected)).unwrap();
                    batch.validate().unwrap();
                    assert_eq!(batch.records(1 << 24).unwrap().len(), n);
                }
            }
        }
    }

    #[test]
    fn a_reused_buffer_gives_the_same_batch() {
        let fresh = fill(RecordBatchBuilder::new(CompressionType::None, 0), 100)
            .finish()
            .unwrap();
        // A dirty buffer larger than the batch: nothing of it may leak into the next one.
        let dirty = vec![0xAB; fresh.len() * 2];
        let capacity = dirty.capacity();
        let reused = fill(
            RecordBatchBuilder::with_buffer(CompressionType::None, 0, dirty),
            100,
        )
        .finish()
        .unwrap();
        assert_eq!(reused, fresh);
        assert_eq!(
            reused.capacity(),
            capacity,
            "the buffer was not grown or replaced"
        );
    }

    #[test]
    fn finish_does_not_copy_an_uncompressed_batch() {
        let mut b = RecordBatchBuilder::new(CompressionType::None, 0);
        b.reserve(1 << 16);
        let b = fill(b, 20);
        let records_at = b.buf.as_ptr();
        let out = b.finish().unwrap();
        assert_eq!(out.as_ptr(), records_at);
    }
}
