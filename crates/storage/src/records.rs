//! Just enough of the record format to find a record by timestamp inside a batch.
//!
//! ListOffsets by timestamp (and KIP-734's MAX_TIMESTAMP) answer with a record's offset,
//! not a batch's. For an uncompressed CreateTime batch the records are read here, only
//! their `timestampDelta` and `offsetDelta`; everything else is skipped by length.
//! A compressed batch is not decompressed on this path: the answer is the batch's base
//! offset with the batch's max timestamp (documented on `UnifiedLog::offset_for_timestamp`).

use rill_protocol::records::{CompressionType, RecordBatch, TimestampType};

/// Reads a zigzag varint of at most `max_bytes` bytes.
fn read_varlong(buf: &[u8], pos: &mut usize, max_bytes: usize) -> Option<i64> {
    let mut value: u64 = 0;
    for i in 0..max_bytes {
        let b = *buf.get(*pos)?;
        *pos += 1;
        value |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Some((value >> 1) as i64 ^ -((value & 1) as i64));
        }
    }
    None
}

/// The first record of `batch` whose timestamp is `>= target`, as (offset, timestamp).
/// `None` when the batch's max timestamp is below `target`.
pub(crate) fn first_record_at_or_after(batch: &RecordBatch, target: i64) -> Option<(i64, i64)> {
    let max = batch.max_timestamp();
    if max < target {
        return None;
    }
    let fallback = Some((batch.base_offset(), max));
    if batch.timestamp_type() == TimestampType::LogAppendTime
        || batch.compression().ok() != Some(CompressionType::None)
    {
        // Every record of a LogAppendTime batch carries the max timestamp; a compressed
        // batch is answered at batch granularity.
        return fallback;
    }
    let payload = batch.records_payload();
    let mut pos = 0usize;
    for _ in 0..batch.record_count().max(0) {
        let Some(len) = read_varlong(&payload, &mut pos, 5) else {
            return fallback;
        };
        let start = pos;
        let Ok(len) = usize::try_from(len) else {
            return fallback;
        };
        // attributes (1 byte), then the two deltas.
        pos += 1;
        let Some(ts_delta) = read_varlong(&payload, &mut pos, 10) else {
            return fallback;
        };
        let Some(off_delta) = read_varlong(&payload, &mut pos, 5) else {
            return fallback;
        };
        let ts = batch.base_timestamp().saturating_add(ts_delta);
        if ts >= target {
            return Some((batch.base_offset() + off_delta, ts));
        }
        pos = start + len;
    }
    fallback
}
