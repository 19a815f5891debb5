//! The fixed header of a stored record batch, parsed from its first 61 bytes alone.
//!
//! `rill_protocol::records::RecordBatch` views a whole batch, which is what append and
//! recovery need (the CRC covers all of it). Opening a log, locating an offset and
//! rebuilding producer state only need the header, and reading just 61 bytes per batch
//! instead of the whole segment is what keeps those paths cheap, so this module reads
//! the same big-endian layout (documented in `rill_protocol::records::batch`) from a
//! header-sized buffer.

use rill_protocol::records::batch::{HEADER_LEN, LOG_OVERHEAD};

/// The header fields the log uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BatchHeader {
    pub base_offset: i64,
    pub batch_length: i32,
    pub partition_leader_epoch: i32,
    pub magic: i8,
    pub attributes: i16,
    pub last_offset_delta: i32,
    pub max_timestamp: i64,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
}

/// Byte positions of the header fields the cleaner rewrites.
pub(crate) const CRC_AT: usize = 17;
pub(crate) const ATTRIBUTES_AT: usize = 21;
pub(crate) const LAST_OFFSET_DELTA_AT: usize = 23;
pub(crate) const MAX_TIMESTAMP_AT: usize = 35;

/// Rewrites `lastOffsetDelta` and, for a LogAppendTime batch, the timestamp type bit and
/// `maxTimestamp`, then recomputes the CRC32C (which covers all three). `buf` holds one
/// whole batch.
pub(crate) fn rewrite_header(buf: &mut [u8], last_offset_delta: i32, log_append_time: Option<i64>) {
    if buf.len() < HEADER_LEN {
        return;
    }
    buf[LAST_OFFSET_DELTA_AT..LAST_OFFSET_DELTA_AT + 4]
        .copy_from_slice(&last_offset_delta.to_be_bytes());
    if let Some(ts) = log_append_time {
        let attributes = i16::from_be_bytes([buf[ATTRIBUTES_AT], buf[ATTRIBUTES_AT + 1]]) | 0x08;
        buf[ATTRIBUTES_AT..ATTRIBUTES_AT + 2].copy_from_slice(&attributes.to_be_bytes());
        buf[MAX_TIMESTAMP_AT..MAX_TIMESTAMP_AT + 8].copy_from_slice(&ts.to_be_bytes());
    }
    let crc = crc32c::crc32c(&buf[ATTRIBUTES_AT..]);
    buf[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_be_bytes());
}

fn be_i16(b: &[u8; HEADER_LEN], at: usize) -> i16 {
    i16::from_be_bytes([b[at], b[at + 1]])
}
fn be_i32(b: &[u8; HEADER_LEN], at: usize) -> i32 {
    i32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
fn be_i64(b: &[u8; HEADER_LEN], at: usize) -> i64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    i64::from_be_bytes(a)
}

/// The producer id and epoch of a record set's first batch when it is a transactional
/// data batch (what a leader verifies with the transaction coordinator, KIP-890);
/// `None` for anything else, a set too short to hold a header included.
pub fn transactional_producer(records: &[u8]) -> Option<(i64, i16)> {
    let head: &[u8; HEADER_LEN] = records.get(..HEADER_LEN)?.try_into().ok()?;
    let h = BatchHeader::parse(head);
    (h.is_transactional() && !h.is_control() && h.producer_id >= 0)
        .then_some((h.producer_id, h.producer_epoch))
}

impl BatchHeader {
    pub fn parse(b: &[u8; HEADER_LEN]) -> Self {
        Self {
            base_offset: be_i64(b, 0),
            batch_length: be_i32(b, 8),
            partition_leader_epoch: be_i32(b, 12),
            magic: b[16] as i8,
            attributes: be_i16(b, 21),
            last_offset_delta: be_i32(b, 23),
            max_timestamp: be_i64(b, 35),
            producer_id: be_i64(b, 43),
            producer_epoch: be_i16(b, 51),
            base_sequence: be_i32(b, 53),
        }
    }

    /// Total size of the batch on disk, including `baseOffset` and `batchLength`.
    pub fn size(&self) -> u64 {
        LOG_OVERHEAD as u64 + u64::from(self.batch_length.max(0) as u32)
    }
    pub fn last_offset(&self) -> i64 {
        self.base_offset
            .saturating_add(i64::from(self.last_offset_delta))
    }
    pub fn next_offset(&self) -> i64 {
        self.last_offset().saturating_add(1)
    }
    pub fn is_control(&self) -> bool {
        self.attributes & 0x20 != 0
    }
    pub fn is_transactional(&self) -> bool {
        self.attributes & 0x10 != 0
    }
}
