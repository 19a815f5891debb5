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
        self.base_offset + i64::from(self.last_offset_delta)
    }
    pub fn next_offset(&self) -> i64 {
        self.last_offset() + 1
    }
    pub fn is_control(&self) -> bool {
        self.attributes & 0x20 != 0
    }
}
