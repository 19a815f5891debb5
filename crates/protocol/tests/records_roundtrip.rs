//! Round trips through `RecordBatchBuilder` -> `RecordBatch::new` -> `validate` ->
//! `records`, for every codec, by example and by proptest.

// Helpers outside `#[test]` functions unwrap too; this is test code.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use bytes::Bytes;
use proptest::prelude::*;
use rill_protocol::records::{
    end_txn_marker_value, BatchError, CompressionType, ControlRecordType, Header, RecordBatch,
    RecordBatchBuilder, TimestampType,
};

const ALL: [CompressionType; 5] = [
    CompressionType::None,
    CompressionType::Gzip,
    CompressionType::Snappy,
    CompressionType::Lz4,
    CompressionType::Zstd,
];

const CAP: usize = 64 << 20;

type Input = (i64, Option<Vec<u8>>, Option<Vec<u8>>, Vec<Header>);

fn build(codec: CompressionType, base_offset: i64, inputs: &[Input]) -> RecordBatch {
    let mut b = RecordBatchBuilder::new(codec, base_offset);
    for (ts, k, v, h) in inputs {
        b.append(*ts, k.as_deref(), v.as_deref(), h).unwrap();
    }
    let batch = RecordBatch::new(b.build().unwrap()).unwrap();
    batch.validate().unwrap();
    batch
}

fn check(batch: &RecordBatch, base_offset: i64, inputs: &[Input]) {
    let records = batch.records(CAP).unwrap();
    assert_eq!(records.len(), inputs.len());
    for (i, (r, (ts, k, v, h))) in records.iter().zip(inputs).enumerate() {
        assert_eq!(r.offset, base_offset + i as i64);
        assert_eq!(r.offset_delta, i as i32);
        assert_eq!(r.timestamp, *ts);
        assert_eq!(r.key.as_deref(), k.as_deref());
        assert_eq!(r.value.as_deref(), v.as_deref());
        assert_eq!(&r.headers, h);
    }
}

fn sample(n: usize) -> Vec<Input> {
    (0..n)
        .map(|i| {
            let key = (i % 3 != 0).then(|| format!("key-{i}").into_bytes());
            let value = (i % 5 != 0).then(|| format!("value {i} ").repeat(i % 40).into_bytes());
            let headers = (0..i % 4)
                .map(|j| {
                    Header::new(
                        format!("h{j}"),
                        (j % 2 == 0).then(|| Bytes::from(vec![j as u8; j])),
                    )
                })
                .collect();
            // Timestamps go backwards sometimes: deltas may be negative.
            (
                1_700_000_000_000 + (i as i64 % 7) * 1000 - 3000,
                key,
                value,
                headers,
            )
        })
        .collect()
}

#[test]
fn every_codec_round_trips_many_records() {
    let inputs = sample(2_000);
    for codec in ALL {
        let batch = build(codec, 1_000, &inputs);
        assert_eq!(batch.compression().unwrap(), codec);
        assert_eq!(batch.record_count(), 2_000);
        assert_eq!(batch.last_offset_delta(), 1_999);
        assert_eq!(batch.last_offset(), 2_999);
        assert_eq!(batch.base_timestamp(), inputs[0].0);
        assert_eq!(
            batch.max_timestamp(),
            inputs.iter().map(|i| i.0).max().unwrap()
        );
        assert_eq!(batch.producer_id(), -1);
        assert_eq!(batch.producer_epoch(), -1);
        assert_eq!(batch.base_sequence(), -1);
        assert_eq!(batch.partition_leader_epoch(), -1);
        check(&batch, 1_000, &inputs);
    }
}

#[test]
fn compression_makes_repetitive_batches_smaller() {
    let inputs = sample(500);
    let plain = build(CompressionType::None, 0, &inputs).size();
    for codec in &ALL[1..] {
        let packed = build(*codec, 0, &inputs).size();
        assert!(packed < plain / 2, "{codec:?}: {packed} vs {plain}");
    }
}

#[test]
fn keys_values_are_zero_copy_slices() {
    let batch = build(CompressionType::None, 0, &sample(10));
    let range =
        batch.as_bytes().as_ptr() as usize..batch.as_bytes().as_ptr() as usize + batch.size();
    for r in batch.records(CAP).unwrap() {
        if let Some(v) = r.value.filter(|v| !v.is_empty()) {
            assert!(range.contains(&(v.as_ptr() as usize)));
        }
    }
}

#[test]
fn producer_and_flag_fields() {
    let mut b = RecordBatchBuilder::new(CompressionType::Snappy, 7)
        .producer(12345, 3, 99)
        .transactional(true)
        .partition_leader_epoch(5);
    b.append(10, Some(b"k"), Some(b"v"), &[]).unwrap();
    b.append(20, Some(b"k"), Some(b"v"), &[]).unwrap();
    let batch = RecordBatch::new(b.build().unwrap()).unwrap();
    batch.validate().unwrap();
    assert_eq!(batch.producer_id(), 12345);
    assert_eq!(batch.producer_epoch(), 3);
    assert_eq!(batch.base_sequence(), 99);
    assert_eq!(batch.last_sequence(), 100);
    assert_eq!(batch.partition_leader_epoch(), 5);
    assert!(batch.is_transactional());
    assert!(!batch.is_control());
    assert_eq!(batch.attributes(), 0x10 | 2);
}

#[test]
fn control_batch_with_commit_marker() {
    let mut b = RecordBatchBuilder::new(CompressionType::None, 50)
        .producer(1, 0, -1)
        .transactional(true)
        .control(true);
    b.append(
        1_000,
        Some(&ControlRecordType::Commit.key()),
        Some(&end_txn_marker_value(7)),
        &[],
    )
    .unwrap();
    let batch = RecordBatch::new(b.build().unwrap()).unwrap();
    batch.validate().unwrap();
    assert!(batch.is_control() && batch.is_transactional());
    let r = &batch.records(CAP).unwrap()[0];
    assert_eq!(
        ControlRecordType::from_key(r.key.as_deref().unwrap()).unwrap(),
        ControlRecordType::Commit
    );
    assert_eq!(r.value.as_deref(), Some(&[0, 0, 0, 0, 0, 7][..]));
}

#[test]
fn explicit_offsets_leave_gaps_like_a_compacted_batch() {
    let mut b = RecordBatchBuilder::new(CompressionType::Gzip, 100);
    b.append_with_offset(100, 1, Some(b"a"), Some(b"1"), &[])
        .unwrap();
    b.append_with_offset(104, 2, Some(b"b"), None, &[]).unwrap();
    assert!(b.append_with_offset(104, 3, Some(b"c"), None, &[]).is_err());
    assert!(b.append_with_offset(99, 3, Some(b"c"), None, &[]).is_err());
    // A plain append continues after the last explicit offset.
    assert_eq!(b.append(3, Some(b"c"), None, &[]).unwrap(), 105);
    let batch = RecordBatch::new(b.build().unwrap()).unwrap();
    assert_eq!(batch.record_count(), 3);
    assert_eq!(batch.last_offset_delta(), 5);
    let offsets: Vec<i64> = batch
        .records(CAP)
        .unwrap()
        .iter()
        .map(|r| r.offset)
        .collect();
    assert_eq!(offsets, [100, 104, 105]);
}

#[test]
fn empty_batch_has_no_payload() {
    for codec in ALL {
        let bytes = RecordBatchBuilder::new(codec, 10)
            .producer(1, 2, 3)
            .build()
            .unwrap();
        assert_eq!(bytes.len(), 61);
        let batch = RecordBatch::new(bytes).unwrap();
        batch.validate().unwrap();
        assert_eq!(batch.record_count(), 0);
        assert_eq!(batch.base_timestamp(), -1);
        assert_eq!(batch.max_timestamp(), -1);
        assert!(batch.records(CAP).unwrap().is_empty());
    }
}

#[test]
fn delete_horizon_becomes_the_base_timestamp() {
    let mut b = RecordBatchBuilder::new(CompressionType::Lz4, 0).delete_horizon(5_000);
    b.append(1_000, Some(b"k"), None, &[]).unwrap();
    b.append(9_000, Some(b"k"), None, &[]).unwrap();
    let batch = RecordBatch::new(b.build().unwrap()).unwrap();
    batch.validate().unwrap();
    assert!(batch.has_delete_horizon());
    assert_eq!(batch.base_timestamp(), 5_000);
    let ts: Vec<i64> = batch
        .records(CAP)
        .unwrap()
        .iter()
        .map(|r| r.timestamp)
        .collect();
    assert_eq!(ts, [1_000, 9_000]);
}

#[test]
fn log_append_time_reports_the_batch_timestamp() {
    let inputs = sample(3);
    let mut raw = build(CompressionType::Zstd, 0, &inputs)
        .into_bytes()
        .to_vec();
    rill_protocol::records::batch::set_log_append_time(&mut raw, 42);
    let batch = RecordBatch::new(Bytes::from(raw)).unwrap();
    batch.validate().unwrap();
    assert_eq!(batch.timestamp_type(), TimestampType::LogAppendTime);
    assert!(batch
        .records(CAP)
        .unwrap()
        .iter()
        .all(|r| r.timestamp == 42));
}

#[test]
fn cap_applies_to_uncompressed_and_compressed_payloads() {
    let inputs = sample(200);
    for codec in ALL {
        let batch = build(codec, 0, &inputs);
        let real = batch.records(CAP).unwrap().len();
        assert_eq!(real, 200);
        assert_eq!(
            batch.records(100).unwrap_err(),
            BatchError::DecompressedTooLarge(100),
            "{codec:?}"
        );
    }
}

#[test]
fn size_in_bytes_is_the_uncompressed_batch_size() {
    let mut b = RecordBatchBuilder::new(CompressionType::None, 0);
    assert_eq!(b.size_in_bytes(), 61);
    b.append(0, Some(b"k"), Some(b"v"), &[]).unwrap();
    assert_eq!(b.len(), 1);
    assert_eq!(b.size_in_bytes(), b.build().unwrap().len());
}

fn header() -> impl Strategy<Value = Header> {
    (
        "[a-z\u{e9}\u{4e2d}]{0,8}",
        proptest::option::of(proptest::collection::vec(any::<u8>(), 0..16)),
    )
        .prop_map(|(k, v)| Header::new(k, v))
}

fn input() -> impl Strategy<Value = Input> {
    (
        any::<i64>().prop_map(|t| t >> 2),
        proptest::option::of(proptest::collection::vec(any::<u8>(), 0..64)),
        proptest::option::of(proptest::collection::vec(any::<u8>(), 0..300)),
        proptest::collection::vec(header(), 0..4),
    )
}

fn codec() -> impl Strategy<Value = CompressionType> {
    proptest::sample::select(ALL.to_vec())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn proptest_round_trip(
        codec in codec(),
        base_offset in 0i64..1 << 40,
        inputs in proptest::collection::vec(input(), 1..40),
    ) {
        let batch = build(codec, base_offset, &inputs);
        check(&batch, base_offset, &inputs);
    }

    /// Flipping any byte of the payload of a valid batch (and fixing the CRC so that the
    /// decoder, not the checksum, must cope) never panics.
    #[test]
    fn corrupted_payload_never_panics(
        codec in codec(),
        inputs in proptest::collection::vec(input(), 1..10),
        flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
    ) {
        let batch = build(codec, 0, &inputs);
        let mut raw = batch.into_bytes().to_vec();
        let payload_len = raw.len() - 61;
        for (at, x) in flips {
            raw[61 + at.index(payload_len)] ^= x | 1;
        }
        let crc = crc32c::crc32c(&raw[21..]);
        raw[17..21].copy_from_slice(&crc.to_be_bytes());
        let batch = RecordBatch::new(Bytes::from(raw)).unwrap();
        let _ = batch.records(1 << 20);
    }

    /// A lying record count never makes the decoder allocate or loop for it.
    #[test]
    fn lying_record_count_is_an_error(count in prop_oneof![Just(i32::MAX), Just(-1), 0i32..10]) {
        let inputs: Vec<Input> = (0..3).map(|i| (i, Some(vec![1]), None, vec![])).collect();
        let mut raw = build(CompressionType::None, 0, &inputs).into_bytes().to_vec();
        raw[57..61].copy_from_slice(&count.to_be_bytes());
        let batch = RecordBatch::new(Bytes::from(raw)).unwrap();
        let r = batch.records(1 << 20);
        if count == 3 { prop_assert!(r.is_ok()); } else { prop_assert!(r.is_err()); }
    }
}
