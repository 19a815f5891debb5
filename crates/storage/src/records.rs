//! Finding a record by timestamp inside a batch.
//!
//! ListOffsets by timestamp (and KIP-734's MAX_TIMESTAMP) answer with a record's offset,
//! not a batch's, as Kafka does: the batch is decoded (decompressed under a cap when it
//! is compressed) with `rill-protocol`'s record codec. This is off the produce and fetch
//! paths, so the decode cost is paid only by the rare ListOffsets that needs it.

use rill_protocol::records::{BatchError, CompressionType, RecordBatch, TimestampType};

/// Largest decompressed batch this path will decode; a batch over it (only possible if the
/// topic's `max.message.bytes` was raised far past Kafka's default) is answered at batch
/// granularity instead.
const MAX_DECOMPRESSED_BYTES: usize = 64 * 1024 * 1024;

/// The first record of `batch` whose timestamp is `>= target`, as (offset, timestamp).
/// `None` when the batch's max timestamp is below `target`.
pub(crate) fn first_record_at_or_after(batch: &RecordBatch, target: i64) -> Option<(i64, i64)> {
    let max = batch.max_timestamp();
    if max < target {
        return None;
    }
    let fallback = Some((batch.base_offset(), max));
    if batch.timestamp_type() == TimestampType::LogAppendTime {
        // Every record of a LogAppendTime batch carries the batch's timestamp.
        return fallback;
    }
    let Ok(records) = batch.record_iter(MAX_DECOMPRESSED_BYTES) else {
        return fallback;
    };
    for record in records {
        match record {
            Ok(r) if r.timestamp >= target => return Some((r.offset, r.timestamp)),
            Ok(_) => {}
            Err(_) => return fallback,
        }
    }
    fallback
}

/// The checks for a batch read back from the log or copied from a leader: what
/// `RecordBatch::validate` checks, except that the record count may be below
/// `lastOffsetDelta + 1`. The cleaner keeps a batch's original base offset and last
/// offset delta (so that producer sequences and offsets stay what they were) while
/// removing records from it, and keeps empty batches that hold a producer's last
/// sequence; both are valid stored batches that a client may never send.
pub(crate) fn validate_stored(batch: &RecordBatch) -> Result<(), BatchError> {
    let magic = batch.magic();
    if magic != rill_protocol::records::batch::MAGIC_V2 {
        return Err(BatchError::UnsupportedMagic(magic));
    }
    let stored = batch.crc();
    let computed = crc32c::crc32c(&batch.as_bytes()[crate::header::ATTRIBUTES_AT..]);
    if stored != computed {
        return Err(BatchError::CrcMismatch { stored, computed });
    }
    CompressionType::from_attributes(batch.attributes())?;
    let count = batch.record_count();
    let delta = batch.last_offset_delta();
    if count < 0 || delta < 0 || i64::from(count) > i64::from(delta) + 1 {
        return Err(BatchError::CountMismatch {
            count,
            last_offset_delta: delta,
        });
    }
    Ok(())
}
