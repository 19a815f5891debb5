//! Finding a record by timestamp inside a batch, and reading a control batch's
//! transaction marker.
//!
//! ListOffsets by timestamp (and KIP-734's MAX_TIMESTAMP) answer with a record's offset,
//! not a batch's, as Kafka does: the batch is decoded (decompressed under a cap when it
//! is compressed) with `rill-protocol`'s record codec. This is off the produce and fetch
//! paths, so the decode cost is paid only by the rare ListOffsets that needs it.

use rill_protocol::records::{
    BatchError, CompressionType, ControlRecordType, RecordBatch, TimestampType,
};

/// What a transaction marker (a control record of type COMMIT or ABORT) says: Kafka's
/// `EndTxnMarker`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EndTxnMarker {
    pub commit: bool,
    pub coordinator_epoch: i32,
}

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

/// The `EndTxnMarker` of a control batch: its first record's key says COMMIT or ABORT
/// (`version int16, type int16`), its value the coordinator epoch (`version int16,
/// coordinatorEpoch int32`). `Ok(None)` for a control record of another type, one
/// without a key, or a control batch with no record (which the cleaner may leave): none
/// of those is a marker, and none has an effect on transactions (as Kafka's consumers
/// skip control records they do not know). An error for a key too short to hold a type,
/// or a marker whose value cannot be read.
pub(crate) fn end_txn_marker(batch: &RecordBatch) -> Result<Option<EndTxnMarker>, BatchError> {
    if !batch.is_control() {
        return Ok(None);
    }
    let mut records = batch.record_iter(MAX_DECOMPRESSED_BYTES)?;
    let Some(record) = records.next() else {
        return Ok(None);
    };
    let record = record?;
    let Some(key) = record.key.as_deref() else {
        return Ok(None);
    };
    let commit = match ControlRecordType::from_key(key)? {
        ControlRecordType::Commit => true,
        ControlRecordType::Abort => false,
        ControlRecordType::Unknown(_) => return Ok(None),
    };
    let value = record.value.as_deref().unwrap_or(&[]);
    if value.len() < 6 {
        return Err(BatchError::InvalidRecord(
            "transaction marker value shorter than 6 bytes",
        ));
    }
    if i16::from_be_bytes([value[0], value[1]]) < 0 {
        return Err(BatchError::InvalidRecord(
            "negative transaction marker value version",
        ));
    }
    let coordinator_epoch = i32::from_be_bytes([value[2], value[3], value[4], value[5]]);
    Ok(Some(EndTxnMarker {
        commit,
        coordinator_epoch,
    }))
}
