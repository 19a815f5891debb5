//! A zero-copy view of a record batch's header (magic 2), and in-place header rewrites.
//!
//! Layout (big-endian), with the byte offset of each field:
//!
//! ```text
//!  0 baseOffset int64        27 baseTimestamp int64
//!  8 batchLength int32       35 maxTimestamp int64
//! 12 partitionLeaderEpoch    43 producerId int64
//! 16 magic int8              51 producerEpoch int16
//! 17 crc uint32              53 baseSequence int32
//! 21 attributes int16        57 recordCount int32
//! 23 lastOffsetDelta int32   61 records…
//! ```
//!
//! The CRC32C covers everything from `attributes` to the end, so the broker may rewrite
//! `baseOffset` and `partitionLeaderEpoch` in place without recomputing it; that is how
//! offsets are assigned on append.

use bytes::Bytes;

/// Size of the fixed batch header that precedes the records.
pub const HEADER_LEN: usize = 61;
/// Bytes before `batchLength` counts: `baseOffset` and `batchLength` themselves.
pub const LOG_OVERHEAD: usize = 12;
/// The only record format Rill accepts.
pub const MAGIC_V2: i8 = 2;

const BASE_OFFSET: usize = 0;
const BATCH_LENGTH: usize = 8;
const PARTITION_LEADER_EPOCH: usize = 12;
const MAGIC: usize = 16;
pub(crate) const CRC: usize = 17;
const ATTRIBUTES: usize = 21;
const LAST_OFFSET_DELTA: usize = 23;
const BASE_TIMESTAMP: usize = 27;
const MAX_TIMESTAMP: usize = 35;
const PRODUCER_ID: usize = 43;
const PRODUCER_EPOCH: usize = 51;
const BASE_SEQUENCE: usize = 53;
const RECORD_COUNT: usize = 57;

/// Why a batch was refused. The broker maps these to `CORRUPT_MESSAGE` and friends.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BatchError {
    #[error("record batch truncated: need {needed} bytes, have {available}")]
    Truncated { needed: usize, available: usize },
    #[error("record batch length {0} is invalid")]
    InvalidLength(i32),
    #[error("unsupported record batch magic {0}")]
    UnsupportedMagic(i8),
    #[error("record batch crc mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    CrcMismatch { stored: u32, computed: u32 },
    #[error("unknown compression type {0}")]
    UnknownCompression(u8),
    #[error("record count {count} does not match last offset delta {last_offset_delta}")]
    CountMismatch { count: i32, last_offset_delta: i32 },
    #[error("invalid record: {0}")]
    InvalidRecord(&'static str),
    #[error("decompressed size exceeds the cap of {0} bytes")]
    DecompressedTooLarge(usize),
    #[error("compression codec error: {0}")]
    Codec(String),
}

/// Compression codec in bits 0-2 of the attributes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum CompressionType {
    #[default]
    None,
    Gzip,
    Snappy,
    Lz4,
    Zstd,
}

impl CompressionType {
    pub fn from_attributes(attributes: i16) -> Result<Self, BatchError> {
        match attributes & 0x07 {
            0 => Ok(Self::None),
            1 => Ok(Self::Gzip),
            2 => Ok(Self::Snappy),
            3 => Ok(Self::Lz4),
            4 => Ok(Self::Zstd),
            other => Err(BatchError::UnknownCompression(other as u8)),
        }
    }

    pub fn id(self) -> i16 {
        match self {
            Self::None => 0,
            Self::Gzip => 1,
            Self::Snappy => 2,
            Self::Lz4 => 3,
            Self::Zstd => 4,
        }
    }
}

/// Bit 3 of the attributes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimestampType {
    CreateTime,
    LogAppendTime,
}

/// A view of one record batch. Cloning is cheap: the bytes are shared.
#[derive(Clone, PartialEq, Eq)]
pub struct RecordBatch {
    bytes: Bytes,
}

impl std::fmt::Debug for RecordBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordBatch")
            .field("base_offset", &self.base_offset())
            .field("last_offset_delta", &self.last_offset_delta())
            .field("len", &self.bytes.len())
            .finish()
    }
}

fn be_i16(b: &[u8], at: usize) -> i16 {
    i16::from_be_bytes([b[at], b[at + 1]])
}
fn be_i32(b: &[u8], at: usize) -> i32 {
    i32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
fn be_i64(b: &[u8], at: usize) -> i64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    i64::from_be_bytes(a)
}

/// Size in bytes of the batch that starts at `buf[0]`, read from its `batchLength`, or
/// `None` when fewer than [`LOG_OVERHEAD`] bytes are there. Does not check the value.
pub fn peek_batch_size(buf: &[u8]) -> Option<i64> {
    if buf.len() < LOG_OVERHEAD {
        return None;
    }
    Some(LOG_OVERHEAD as i64 + i64::from(be_i32(buf, BATCH_LENGTH)))
}

impl RecordBatch {
    /// Splits the first batch off `buf` after checking that its declared length is sane
    /// and fully present. Checks neither the magic nor the CRC: see [`Self::validate`].
    pub fn split_from(buf: &mut Bytes) -> Result<Self, BatchError> {
        if buf.len() < LOG_OVERHEAD {
            return Err(BatchError::Truncated {
                needed: LOG_OVERHEAD,
                available: buf.len(),
            });
        }
        let length = be_i32(buf, BATCH_LENGTH);
        // A batch that cannot hold its own header is corrupt, not just short.
        if length < (HEADER_LEN - LOG_OVERHEAD) as i32 {
            return Err(BatchError::InvalidLength(length));
        }
        let total = LOG_OVERHEAD + length as usize;
        if buf.len() < total {
            return Err(BatchError::Truncated {
                needed: total,
                available: buf.len(),
            });
        }
        Ok(Self {
            bytes: buf.split_to(total),
        })
    }

    /// Views a buffer that holds exactly one batch.
    pub fn new(bytes: Bytes) -> Result<Self, BatchError> {
        let mut b = bytes;
        let batch = Self::split_from(&mut b)?;
        if !b.is_empty() {
            return Err(BatchError::InvalidLength(be_i32(
                &batch.bytes,
                BATCH_LENGTH,
            )));
        }
        Ok(batch)
    }

    /// Iterates over the batches in a record set, stopping at the first error.
    pub fn iter(records: Bytes) -> RecordBatchIter {
        RecordBatchIter {
            rest: records,
            failed: false,
        }
    }

    /// Checks what the broker must check before it stores a batch: magic 2, the CRC32C,
    /// a known codec, and a record count that agrees with the offset delta.
    pub fn validate(&self) -> Result<(), BatchError> {
        let magic = self.magic();
        if magic != MAGIC_V2 {
            return Err(BatchError::UnsupportedMagic(magic));
        }
        let stored = self.crc();
        let computed = crc32c::crc32c(&self.bytes[ATTRIBUTES..]);
        if stored != computed {
            return Err(BatchError::CrcMismatch { stored, computed });
        }
        CompressionType::from_attributes(self.attributes())?;
        let count = self.record_count();
        let delta = self.last_offset_delta();
        if count < 0 || delta < 0 || (count > 0 && count - 1 != delta) {
            return Err(BatchError::CountMismatch {
                count,
                last_offset_delta: delta,
            });
        }
        Ok(())
    }

    pub fn as_bytes(&self) -> &Bytes {
        &self.bytes
    }
    pub fn into_bytes(self) -> Bytes {
        self.bytes
    }
    /// Total size including `baseOffset` and `batchLength`.
    pub fn size(&self) -> usize {
        self.bytes.len()
    }
    pub fn base_offset(&self) -> i64 {
        be_i64(&self.bytes, BASE_OFFSET)
    }
    pub fn last_offset(&self) -> i64 {
        self.base_offset()
            .saturating_add(i64::from(self.last_offset_delta()))
    }
    pub fn next_offset(&self) -> i64 {
        self.last_offset().saturating_add(1)
    }
    pub fn batch_length(&self) -> i32 {
        be_i32(&self.bytes, BATCH_LENGTH)
    }
    pub fn partition_leader_epoch(&self) -> i32 {
        be_i32(&self.bytes, PARTITION_LEADER_EPOCH)
    }
    pub fn magic(&self) -> i8 {
        self.bytes[MAGIC] as i8
    }
    pub fn crc(&self) -> u32 {
        be_i32(&self.bytes, CRC) as u32
    }
    pub fn attributes(&self) -> i16 {
        be_i16(&self.bytes, ATTRIBUTES)
    }
    pub fn compression(&self) -> Result<CompressionType, BatchError> {
        CompressionType::from_attributes(self.attributes())
    }
    pub fn timestamp_type(&self) -> TimestampType {
        if self.attributes() & 0x08 != 0 {
            TimestampType::LogAppendTime
        } else {
            TimestampType::CreateTime
        }
    }
    pub fn is_transactional(&self) -> bool {
        self.attributes() & 0x10 != 0
    }
    pub fn is_control(&self) -> bool {
        self.attributes() & 0x20 != 0
    }
    pub fn has_delete_horizon(&self) -> bool {
        self.attributes() & 0x40 != 0
    }
    pub fn last_offset_delta(&self) -> i32 {
        be_i32(&self.bytes, LAST_OFFSET_DELTA)
    }
    pub fn base_timestamp(&self) -> i64 {
        be_i64(&self.bytes, BASE_TIMESTAMP)
    }
    pub fn max_timestamp(&self) -> i64 {
        be_i64(&self.bytes, MAX_TIMESTAMP)
    }
    pub fn producer_id(&self) -> i64 {
        be_i64(&self.bytes, PRODUCER_ID)
    }
    pub fn producer_epoch(&self) -> i16 {
        be_i16(&self.bytes, PRODUCER_EPOCH)
    }
    pub fn base_sequence(&self) -> i32 {
        be_i32(&self.bytes, BASE_SEQUENCE)
    }
    /// Sequence of the last record, wrapping at `i32::MAX` as Kafka's does.
    pub fn last_sequence(&self) -> i32 {
        let base = self.base_sequence();
        if base < 0 {
            return base;
        }
        let last = i64::from(base) + i64::from(self.last_offset_delta());
        (last % (i64::from(i32::MAX) + 1)) as i32
    }
    pub fn record_count(&self) -> i32 {
        be_i32(&self.bytes, RECORD_COUNT)
    }
    /// The records after the header: compressed as a whole when a codec is set.
    pub fn records_payload(&self) -> Bytes {
        self.bytes.slice(HEADER_LEN..)
    }
}

/// Iterator over the batches of a record set. A trailing partial batch (as a fetch
/// response may carry) ends the iteration with `Err(Truncated)`.
pub struct RecordBatchIter {
    rest: Bytes,
    failed: bool,
}

impl RecordBatchIter {
    /// Bytes not yet consumed.
    pub fn remaining(&self) -> &Bytes {
        &self.rest
    }
}

impl Iterator for RecordBatchIter {
    type Item = Result<RecordBatch, BatchError>;
    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.rest.is_empty() {
            return None;
        }
        let r = RecordBatch::split_from(&mut self.rest);
        if r.is_err() {
            self.failed = true;
        }
        Some(r)
    }
}

/// Rewrites `baseOffset` of the batch at the start of `buf` (CRC unaffected).
pub fn set_base_offset(buf: &mut [u8], base_offset: i64) {
    buf[BASE_OFFSET..BASE_OFFSET + 8].copy_from_slice(&base_offset.to_be_bytes());
}

/// Rewrites `partitionLeaderEpoch` of the batch at the start of `buf` (CRC unaffected).
pub fn set_partition_leader_epoch(buf: &mut [u8], epoch: i32) {
    buf[PARTITION_LEADER_EPOCH..PARTITION_LEADER_EPOCH + 4].copy_from_slice(&epoch.to_be_bytes());
}

/// Rewrites `maxTimestamp` and sets the LogAppendTime bit, then recomputes the CRC (both
/// fields are covered by it). Used for `message.timestamp.type=LogAppendTime`.
pub fn set_log_append_time(buf: &mut [u8], timestamp: i64) {
    let attributes = be_i16(buf, ATTRIBUTES) | 0x08;
    buf[ATTRIBUTES..ATTRIBUTES + 2].copy_from_slice(&attributes.to_be_bytes());
    buf[MAX_TIMESTAMP..MAX_TIMESTAMP + 8].copy_from_slice(&timestamp.to_be_bytes());
    let crc = crc32c::crc32c(&buf[ATTRIBUTES..]);
    buf[CRC..CRC + 4].copy_from_slice(&crc.to_be_bytes());
}

/// Sets a CreateTime batch's `maxTimestamp` (keeping its attributes) and recomputes the
/// CRC, for a header held apart from the rest of its batch (`body`): Kafka's leader
/// replaces a client's `maxTimestamp` with the largest record timestamp it found.
pub fn set_max_timestamp_split(header: &mut [u8; HEADER_LEN], body: &[u8], timestamp: i64) {
    header[MAX_TIMESTAMP..MAX_TIMESTAMP + 8].copy_from_slice(&timestamp.to_be_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&header[ATTRIBUTES..]), body);
    header[CRC..CRC + 4].copy_from_slice(&crc.to_be_bytes());
}

/// As [`set_log_append_time`], for a batch held in two parts: `header` (its first
/// [`HEADER_LEN`] bytes, rewritten) and `body` (the records that follow, untouched). The
/// CRC is computed over the header's covered part and then the body, so that a caller
/// writing the two parts with one vectored write never copies the body.
pub fn set_log_append_time_split(header: &mut [u8; HEADER_LEN], body: &[u8], timestamp: i64) {
    let attributes = be_i16(header, ATTRIBUTES) | 0x08;
    header[ATTRIBUTES..ATTRIBUTES + 2].copy_from_slice(&attributes.to_be_bytes());
    header[MAX_TIMESTAMP..MAX_TIMESTAMP + 8].copy_from_slice(&timestamp.to_be_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&header[ATTRIBUTES..]), body);
    header[CRC..CRC + 4].copy_from_slice(&crc.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An uncompressed batch of one record (key "k", value "v"), as librdkafka wrote it,
    /// with the CRC fixed up by the test so the header fields are what matters here.
    fn one_record_batch() -> Vec<u8> {
        let record: &[u8] = &[
            0x10, // length 8 (varint zigzag)
            0x00, // attributes
            0x00, // timestamp delta
            0x00, // offset delta
            0x02, b'k', // key length 1, key
            0x02, b'v', // value length 1, value
            0x00, // headers count
        ];
        let mut b = Vec::new();
        b.extend_from_slice(&0i64.to_be_bytes());
        b.extend_from_slice(&((HEADER_LEN - LOG_OVERHEAD + record.len()) as i32).to_be_bytes());
        b.extend_from_slice(&(-1i32).to_be_bytes());
        b.push(2);
        b.extend_from_slice(&0u32.to_be_bytes());
        b.extend_from_slice(&0i16.to_be_bytes());
        b.extend_from_slice(&0i32.to_be_bytes());
        b.extend_from_slice(&1_700_000_000_000i64.to_be_bytes());
        b.extend_from_slice(&1_700_000_000_000i64.to_be_bytes());
        b.extend_from_slice(&(-1i64).to_be_bytes());
        b.extend_from_slice(&(-1i16).to_be_bytes());
        b.extend_from_slice(&(-1i32).to_be_bytes());
        b.extend_from_slice(&1i32.to_be_bytes());
        b.extend_from_slice(record);
        let crc = crc32c::crc32c(&b[ATTRIBUTES..]);
        b[CRC..CRC + 4].copy_from_slice(&crc.to_be_bytes());
        b
    }

    #[test]
    fn header_fields_and_offset_rewrite() {
        let mut raw = one_record_batch();
        set_base_offset(&mut raw, 42);
        set_partition_leader_epoch(&mut raw, 7);
        let batch = RecordBatch::new(Bytes::from(raw)).unwrap();
        batch.validate().unwrap();
        assert_eq!(batch.base_offset(), 42);
        assert_eq!(batch.last_offset(), 42);
        assert_eq!(batch.partition_leader_epoch(), 7);
        assert_eq!(batch.record_count(), 1);
        assert_eq!(batch.compression().unwrap(), CompressionType::None);
        assert_eq!(batch.timestamp_type(), TimestampType::CreateTime);
        assert_eq!(batch.producer_id(), -1);
    }

    /// A client may send any base offset (the broker overwrites it); reading the header
    /// of such a batch must not overflow (found by the record_batch fuzz target).
    #[test]
    fn offsets_near_i64_max_saturate() {
        let mut raw = one_record_batch();
        set_base_offset(&mut raw, i64::MAX);
        raw[LAST_OFFSET_DELTA..LAST_OFFSET_DELTA + 4].copy_from_slice(&i32::MAX.to_be_bytes());
        let batch = RecordBatch::new(Bytes::from(raw)).unwrap();
        assert_eq!(batch.last_offset(), i64::MAX);
        assert_eq!(batch.next_offset(), i64::MAX);
        assert!(batch.validate().is_err());
    }

    #[test]
    fn crc_mismatch_is_detected() {
        let mut raw = one_record_batch();
        let last = raw.len() - 2;
        raw[last] ^= 0xff;
        let batch = RecordBatch::new(Bytes::from(raw)).unwrap();
        assert!(matches!(
            batch.validate(),
            Err(BatchError::CrcMismatch { .. })
        ));
    }

    #[test]
    fn truncated_and_bogus_lengths_are_errors() {
        let raw = one_record_batch();
        let mut short = Bytes::from(raw[..raw.len() - 1].to_vec());
        assert!(matches!(
            RecordBatch::split_from(&mut short),
            Err(BatchError::Truncated { .. })
        ));
        let mut bogus = raw.clone();
        bogus[BATCH_LENGTH..BATCH_LENGTH + 4].copy_from_slice(&(-5i32).to_be_bytes());
        assert!(matches!(
            RecordBatch::split_from(&mut Bytes::from(bogus)),
            Err(BatchError::InvalidLength(-5))
        ));
    }

    #[test]
    fn log_append_time_keeps_crc_valid() {
        let mut raw = one_record_batch();
        set_log_append_time(&mut raw, 5);
        let batch = RecordBatch::new(Bytes::from(raw)).unwrap();
        batch.validate().unwrap();
        assert_eq!(batch.max_timestamp(), 5);
        assert_eq!(batch.timestamp_type(), TimestampType::LogAppendTime);
    }

    #[test]
    fn log_append_time_on_split_parts_gives_the_same_bytes() {
        let mut whole = one_record_batch();
        let (head, body) = whole.split_at(HEADER_LEN);
        let mut header: [u8; HEADER_LEN] = head.try_into().unwrap();
        let body = body.to_vec();
        set_log_append_time_split(&mut header, &body, 5);
        set_log_append_time(&mut whole, 5);
        assert_eq!([&header[..], &body[..]].concat(), whole);
        RecordBatch::new(Bytes::from(whole))
            .unwrap()
            .validate()
            .unwrap();
    }

    #[test]
    fn max_timestamp_on_split_parts_keeps_create_time_and_a_valid_crc() {
        let whole = one_record_batch();
        let (head, body) = whole.split_at(HEADER_LEN);
        let mut header: [u8; HEADER_LEN] = head.try_into().unwrap();
        set_max_timestamp_split(&mut header, body, 1234);
        let batch = RecordBatch::new(Bytes::from([&header[..], body].concat())).unwrap();
        batch.validate().unwrap();
        assert_eq!(batch.max_timestamp(), 1234);
        assert_eq!(batch.timestamp_type(), TimestampType::CreateTime);
    }

    #[test]
    fn iterates_over_a_record_set() {
        let mut set = one_record_batch();
        let mut second = one_record_batch();
        set_base_offset(&mut second, 1);
        set.extend_from_slice(&second);
        set.extend_from_slice(&second[..10]);
        let batches: Vec<_> = RecordBatch::iter(Bytes::from(set)).collect();
        assert_eq!(batches.len(), 3);
        assert_eq!(batches[1].as_ref().unwrap().base_offset(), 1);
        assert!(batches[2].is_err());
    }
}
