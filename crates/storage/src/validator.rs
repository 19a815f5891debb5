//! The leader's record-by-record checks of a client's batch, and its re-encoding with
//! the topic's `compression.type` — Kafka's `LogValidator`.
//!
//! The batch-level checks (framing, CRC, magic, counts) are in `UnifiedLog`; here every
//! record of a client batch is decoded, under [`MAX_DECOMPRESSED_BATCH_BYTES`], and:
//!
//! 1. must parse, with offset deltas running 0, 1, 2, …;
//! 2. needs a key when the topic is compacted;
//! 3. under CreateTime, must carry a timestamp within
//!    `[now - message.timestamp.before.max.ms, now + message.timestamp.after.max.ms]`
//!    (a record without a timestamp, -1, is let through, as Kafka does). Kafka checks
//!    every record, not the batch's max timestamp.
//!
//! A record failing 2 or 3 does not stop the walk: as in Kafka's `LogValidator`, every
//! such record is collected (one error per record, the key's first) and the batch is
//! refused whole with the list ([`AppendError::RecordErrors`], KIP-467), which the
//! Produce response returns as `record_errors` so that a producer fails only those
//! records. A record that does not parse, or whose offset delta is off, fails the batch
//! at once: nothing after it can be trusted.
//!
//! When the topic's `compression.type` names a codec other than the batch's, the decoded
//! records are written into a new batch with that codec: same keys, values, headers,
//! timestamps and offset deltas, same producer id, epoch, base sequence and
//! transactional flag, so that idempotence and transactions see the batch they sent.
//! The new batch is not larger than what decompression was allowed to produce plus a
//! header, and the log checks its size against `max.message.bytes` again, as Kafka does
//! after a conversion.

use rill_protocol::records::{
    BatchError, CompressionType, Record, RecordBatch, RecordBatchBuilder, TimestampType,
};

use crate::error::{AppendError, RecordError, RecordErrorKind, RecordErrors};

/// Largest decompressed record payload a produced batch may expand to. Kafka bounds only
/// the compressed size; a bound here keeps a decompression bomb from costing more memory
/// than this per request being validated.
pub const MAX_DECOMPRESSED_BATCH_BYTES: usize = 64 * 1024 * 1024;

/// Kafka's `RecordBatch.NO_TIMESTAMP`: a record that carries no create time.
const NO_TIMESTAMP: i64 = -1;

/// The topic settings and the clock the record checks need.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RecordChecks {
    pub require_keys: bool,
    /// `None` under LogAppendTime, where the producer's timestamps are replaced anyway.
    pub timestamp_window: Option<TimestampWindow>,
}

/// `message.timestamp.before.max.ms` / `after.max.ms` around the broker's clock.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TimestampWindow {
    pub now_ms: i64,
    pub before_max_ms: i64,
    pub after_max_ms: i64,
}

impl TimestampWindow {
    /// Kafka's `recordHasInvalidTimestamp`, with saturating arithmetic so that a hostile
    /// timestamp near `i64::MIN` cannot overflow.
    fn check(&self, timestamp: i64, offset: i64) -> Option<RecordErrorKind> {
        if timestamp == NO_TIMESTAMP {
            return None;
        }
        let behind = self.now_ms.saturating_sub(timestamp);
        let ahead = timestamp.saturating_sub(self.now_ms);
        (behind > self.before_max_ms || ahead > self.after_max_ms).then(|| {
            RecordErrorKind::Timestamp {
                timestamp,
                offset,
                earliest: self.now_ms.saturating_sub(self.before_max_ms),
                latest: self.now_ms.saturating_add(self.after_max_ms),
            }
        })
    }
}

pub(crate) fn corrupt_to_append_error(e: BatchError) -> AppendError {
    match e {
        BatchError::UnsupportedMagic(m) => {
            AppendError::InvalidRecord(format!("unsupported record batch magic {m}"))
        }
        BatchError::CountMismatch { .. } | BatchError::InvalidRecord(_) => {
            AppendError::InvalidRecord(e.to_string())
        }
        other => AppendError::CorruptMessage(other),
    }
}

/// What [`validate_records`] found: the records when asked to keep them (else empty), and
/// the largest record timestamp (`None` for a batch of none).
#[derive(Debug)]
pub(crate) struct CheckedRecords {
    pub(crate) records: Vec<Record>,
    pub(crate) max_timestamp: Option<i64>,
}

/// Decodes and checks every record of a client's batch (see the module note), and finds
/// its largest record timestamp (Kafka's leader stamps that as the batch's `maxTimestamp`
/// rather than trust the client's). Keeps the records when `keep` is set (the caller
/// re-encodes them).
///
/// Without `keep` the records are only borrowed ([`next_ref`]): the same
/// decoding and the same checks, but no reference count, header allocation or copy per
/// record, which made this walk a tenth of the broker's produce CPU. The walk itself
/// stays even when the topic asks for no per-record check: it is what proves that the
/// batch holds exactly `recordCount` well-formed records with offset deltas 0, 1, 2, …
/// (Kafka's leader iterates every record of a batch too), which the CRC cannot, since a
/// client computes the CRC over whatever it sends.
///
/// [`next_ref`]: rill_protocol::records::RecordIter::next_ref
pub(crate) fn validate_records(
    batch: &RecordBatch,
    checks: &RecordChecks,
    keep: bool,
) -> Result<CheckedRecords, AppendError> {
    let mut records = batch
        .record_iter(MAX_DECOMPRESSED_BATCH_BYTES)
        .map_err(corrupt_to_append_error)?;
    // A LogAppendTime batch reports its max timestamp for every record; Kafka checks
    // create times only, so such a batch from a client is judged by that one value.
    let create_time = batch.timestamp_type() == TimestampType::CreateTime;
    let mut refused = RecordErrors::default();
    let mut check = |i: usize, offset_delta: i32, has_key: bool, timestamp: i64| {
        if i64::from(offset_delta) != i as i64 {
            return Err(AppendError::InvalidRecord(format!(
                "record {i} of the batch has offset delta {offset_delta}"
            )));
        }
        let kind = if checks.require_keys && !has_key {
            Some(RecordErrorKind::MissingKey)
        } else {
            checks
                .timestamp_window
                .as_ref()
                .filter(|_| create_time || i == 0)
                .and_then(|window| {
                    window.check(
                        timestamp,
                        batch.base_offset().saturating_add(i64::from(offset_delta)),
                    )
                })
        };
        if let Some(kind) = kind {
            refused.push(RecordError {
                batch_index: i,
                kind,
            });
        }
        Ok(())
    };
    let mut kept = Vec::new();
    let mut max_timestamp: Option<i64> = None;
    if keep {
        for (i, record) in records.by_ref().enumerate() {
            let record = record.map_err(corrupt_to_append_error)?;
            check(
                i,
                record.offset_delta,
                record.key.is_some(),
                record.timestamp,
            )?;
            max_timestamp = max_timestamp.max(Some(record.timestamp));
            kept.push(record);
        }
    } else {
        let mut i = 0usize;
        while let Some(record) = records.next_ref() {
            let record = record.map_err(corrupt_to_append_error)?;
            check(
                i,
                record.offset_delta,
                record.key.is_some(),
                record.timestamp,
            )?;
            max_timestamp = max_timestamp.max(Some(record.timestamp));
            i += 1;
        }
    }
    if refused.total > 0 {
        return Err(AppendError::RecordErrors(refused));
    }
    Ok(CheckedRecords {
        records: kept,
        max_timestamp,
    })
}

/// Writes `records` (decoded from `batch`) into a new batch compressed with `codec`,
/// keeping everything a reader or the producer state can see except the codec.
pub(crate) fn recompress(
    batch: &RecordBatch,
    records: &[Record],
    codec: CompressionType,
    level: Option<i32>,
) -> Result<RecordBatch, AppendError> {
    let mut builder = RecordBatchBuilder::new(codec, batch.base_offset())
        .compression_level(level)
        .producer(
            batch.producer_id(),
            batch.producer_epoch(),
            batch.base_sequence(),
        )
        .transactional(batch.is_transactional())
        .partition_leader_epoch(batch.partition_leader_epoch());
    for r in records {
        builder
            .append_with_offset(
                batch.base_offset() + i64::from(r.offset_delta),
                r.timestamp,
                r.key.as_deref(),
                r.value.as_deref(),
                &r.headers,
            )
            .map_err(corrupt_to_append_error)?;
    }
    let bytes = builder.build().map_err(corrupt_to_append_error)?;
    RecordBatch::new(bytes).map_err(corrupt_to_append_error)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rill_protocol::records::Header;

    const NOW: i64 = 1_700_000_000_000;
    const CODECS: [CompressionType; 5] = [
        CompressionType::None,
        CompressionType::Gzip,
        CompressionType::Snappy,
        CompressionType::Lz4,
        CompressionType::Zstd,
    ];

    fn sample(codec: CompressionType) -> RecordBatch {
        let mut b = RecordBatchBuilder::new(codec, 0)
            .producer(42, 3, 1_000)
            .transactional(true);
        for i in 0..50u8 {
            let key = [b'k', i];
            let value = vec![i; 100 + usize::from(i)];
            let headers = [
                Header::new("h", Some(vec![i])),
                Header::new("n", None::<Vec<u8>>),
            ];
            let key = (i % 7 != 0).then_some(&key[..]);
            let value = (i % 11 != 0).then_some(&value[..]);
            // Timestamps out of order on purpose: deltas may be negative.
            b.append(NOW - 1_000 + i64::from(i % 5) * 100, key, value, &headers)
                .unwrap();
        }
        RecordBatch::new(b.build().unwrap()).unwrap()
    }

    fn no_checks() -> RecordChecks {
        RecordChecks {
            require_keys: false,
            timestamp_window: None,
        }
    }

    #[test]
    fn recompression_keeps_records_and_producer_fields_for_every_codec_pair() {
        for from in CODECS {
            let batch = sample(from);
            let records = validate_records(&batch, &no_checks(), true)
                .unwrap()
                .records;
            for to in CODECS {
                let out = recompress(&batch, &records, to, None).unwrap();
                out.validate().unwrap();
                assert_eq!(out.compression().unwrap(), to, "{from:?} -> {to:?}");
                assert_eq!(out.producer_id(), 42);
                assert_eq!(out.producer_epoch(), 3);
                assert_eq!(out.base_sequence(), 1_000);
                assert!(out.is_transactional());
                assert_eq!(out.last_offset_delta(), batch.last_offset_delta());
                assert_eq!(out.record_count(), batch.record_count());
                assert_eq!(out.max_timestamp(), batch.max_timestamp());
                assert_eq!(
                    out.records(MAX_DECOMPRESSED_BATCH_BYTES).unwrap(),
                    batch.records(MAX_DECOMPRESSED_BATCH_BYTES).unwrap(),
                    "{from:?} -> {to:?}"
                );
            }
        }
    }

    fn window(before: i64, after: i64) -> RecordChecks {
        RecordChecks {
            require_keys: false,
            timestamp_window: Some(TimestampWindow {
                now_ms: NOW,
                before_max_ms: before,
                after_max_ms: after,
            }),
        }
    }

    fn batch_with_timestamps(ts: &[i64]) -> RecordBatch {
        let mut b = RecordBatchBuilder::new(CompressionType::Lz4, 0);
        for &t in ts {
            b.append(t, None, Some(b"v"), &[]).unwrap();
        }
        RecordBatch::new(b.build().unwrap()).unwrap()
    }

    #[test]
    fn timestamps_are_checked_per_record_against_both_bounds() {
        let checks = window(3_600_000, 60_000);
        let ok = batch_with_timestamps(&[NOW - 3_600_000, NOW, NOW + 60_000]);
        validate_records(&ok, &checks, false).unwrap();

        // The batch's max timestamp is fine; the second record is too old.
        let old = batch_with_timestamps(&[NOW, NOW - 3_600_001, NOW]);
        match validate_records(&old, &checks, false).unwrap_err() {
            AppendError::RecordErrors(refused) => {
                assert_eq!(refused.total, 1);
                assert!(refused.any_timestamp);
                assert_eq!(
                    refused.errors,
                    vec![RecordError {
                        batch_index: 1,
                        kind: RecordErrorKind::Timestamp {
                            timestamp: NOW - 3_600_001,
                            offset: 1,
                            earliest: NOW - 3_600_000,
                            latest: NOW + 60_000,
                        },
                    }]
                );
            }
            other => panic!("{other}"),
        }
        let future = batch_with_timestamps(&[NOW + 60_001]);
        assert!(matches!(
            validate_records(&future, &checks, false),
            Err(AppendError::RecordErrors(RecordErrors { total: 1, .. }))
        ));
        // Unbounded defaults never overflow, whatever the timestamp.
        for ts in [i64::MIN + 1, 0, i64::MAX] {
            let extreme = batch_with_timestamps(&[ts]);
            validate_records(&extreme, &window(i64::MAX, i64::MAX), false).unwrap();
        }
        let far_past = batch_with_timestamps(&[i64::MIN + 1]);
        assert!(validate_records(&far_past, &window(1, 1), false).is_err());
        // No timestamp at all is let through, as in Kafka.
        let none = batch_with_timestamps(&[-1]);
        validate_records(&none, &window(0, 0), false).unwrap();
        // LogAppendTime topics do not check (the caller passes no window).
        validate_records(&old, &no_checks(), false).unwrap();
    }

    #[test]
    fn every_refused_record_is_listed_and_the_key_is_checked_first() {
        let checks = RecordChecks {
            require_keys: true,
            ..window(1_000, 1_000)
        };
        let mut b = RecordBatchBuilder::new(CompressionType::None, 0);
        for i in 0..10i64 {
            let key = (i % 3 != 0).then_some(&b"k"[..]);
            // Record 6 lacks a key and is too old: one error, the key's (Kafka's order).
            let ts = if i == 6 || i == 7 { NOW - 5_000 } else { NOW };
            b.append(ts, key, Some(b"v"), &[]).unwrap();
        }
        let batch = RecordBatch::new(b.build().unwrap()).unwrap();
        let AppendError::RecordErrors(refused) =
            validate_records(&batch, &checks, false).unwrap_err()
        else {
            panic!("expected record errors");
        };
        let listed: Vec<_> = refused
            .errors
            .iter()
            .map(|e| (e.batch_index, matches!(e.kind, RecordErrorKind::MissingKey)))
            .collect();
        assert_eq!(
            listed,
            vec![(0, true), (3, true), (6, true), (7, false), (9, true)]
        );
        assert_eq!(refused.total, 5);
        assert!(refused.any_timestamp);
    }

    #[test]
    fn the_list_of_refused_records_is_bounded() {
        let checks = RecordChecks {
            require_keys: true,
            timestamp_window: None,
        };
        let mut b = RecordBatchBuilder::new(CompressionType::Lz4, 0);
        let n = RecordErrors::MAX_LISTED + 5;
        for _ in 0..n {
            b.append(NOW, None, None, &[]).unwrap();
        }
        let batch = RecordBatch::new(b.build().unwrap()).unwrap();
        let AppendError::RecordErrors(refused) =
            validate_records(&batch, &checks, false).unwrap_err()
        else {
            panic!("expected record errors");
        };
        assert_eq!(refused.total, n);
        assert_eq!(refused.errors.len(), RecordErrors::MAX_LISTED);
        assert!(!refused.any_timestamp);
    }
}
