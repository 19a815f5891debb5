//! Garbage into every decompressor and into the record decoder: errors, never panics,
//! never an allocation past the cap. Each codec is also fed its own magic followed by
//! garbage, so that the fuzzing reaches past the first byte check.

// Helpers outside `#[test]` functions unwrap too; this is test code.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use bytes::Bytes;
use proptest::prelude::*;
use rill_protocol::records::{compression, BatchError, CompressionType, RecordBatch};

const CODECS: [CompressionType; 4] = [
    CompressionType::Gzip,
    CompressionType::Snappy,
    CompressionType::Lz4,
    CompressionType::Zstd,
];

/// Plausible starts of each format, so random tails exercise the inner decoders.
fn prefixes() -> Vec<Vec<u8>> {
    vec![
        vec![],
        vec![0x1f, 0x8b, 0x08, 0x00], // gzip
        vec![
            0x82, b'S', b'N', b'A', b'P', b'P', b'Y', 0, 0, 0, 0, 1, 0, 0, 0, 1,
        ], // xerial
        vec![0x82, b'S', b'N', b'A', b'P', b'P', b'Y', 0], // xerial, cut
        vec![0x04, 0x22, 0x4d, 0x18, 0x60, 0x40, 0x82], // lz4 frame, 64 KiB blocks
        vec![0x04, 0x22, 0x4d, 0x18, 0x64, 0x70, 0xb9], // lz4, 4 MiB, content checksum
        vec![0x02, 0x21, 0x4c, 0x18], // lz4 legacy
        vec![0x28, 0xb5, 0x2f, 0xfd], // zstd
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2_000))]

    #[test]
    fn decompressors_never_panic(
        prefix in proptest::sample::select(prefixes()),
        tail in proptest::collection::vec(any::<u8>(), 0..512),
        cap in prop_oneof![Just(0usize), Just(16), Just(1 << 16)],
    ) {
        let input = [prefix, tail].concat();
        for codec in CODECS {
            if let Ok(out) = compression::decompress(codec, &input, cap) {
                prop_assert!(out.len() <= cap);
            }
        }
    }

    /// Valid compressed data, then damaged: still no panic.
    #[test]
    fn damaged_valid_streams_never_panic(
        data in proptest::collection::vec(any::<u8>(), 0..2_000),
        cut in any::<prop::sample::Index>(),
        flip in any::<prop::sample::Index>(),
        x in 1u8..,
    ) {
        for codec in CODECS {
            let mut packed = compression::compress(codec, &data).unwrap();
            let at = flip.index(packed.len());
            packed[at] ^= x;
            let _ = compression::decompress(codec, &packed, 1 << 16);
            packed.truncate(cut.index(packed.len() + 1));
            let _ = compression::decompress(codec, &packed, 1 << 16);
        }
    }

    /// Random records sections behind a valid header, uncompressed and "compressed".
    #[test]
    fn record_decoder_never_panics(
        codec in 0u8..5,
        count in prop_oneof![Just(i32::MAX), Just(-5), 0i32..20],
        payload in proptest::collection::vec(any::<u8>(), 0..300),
    ) {
        let raw = batch_bytes(i16::from(codec), count, &payload);
        let batch = RecordBatch::new(Bytes::from(raw)).unwrap();
        let _ = batch.records(1 << 16);
    }

    /// The borrowed walk the leader validates with (`next_ref`) accepts exactly what the
    /// owned decoder accepts, record for record, on garbage and on damaged valid records.
    #[test]
    fn borrowed_and_owned_walks_agree(
        codec in prop_oneof![Just(0u8), 0u8..5],
        count in prop_oneof![Just(-5), 0i32..20],
        payload in proptest::collection::vec(any::<u8>(), 0..300),
        valid in any::<bool>(),
        flip in any::<prop::sample::Index>(),
        x in any::<u8>(),
    ) {
        let mut payload = if valid { valid_records(count.max(0)) } else { payload };
        if !payload.is_empty() {
            let i = flip.index(payload.len());
            payload[i] ^= x;
        }
        let raw = batch_bytes(i16::from(codec), count, &payload);
        let batch = RecordBatch::new(Bytes::from(raw)).unwrap();
        prop_assert_eq!(borrowed_walk(&batch), owned_walk(&batch));
    }
}

/// What a walk saw: (offset, offset delta, timestamp, key, value, header count) per record.
type Walk = Result<Vec<(i64, i32, i64, Option<Vec<u8>>, Option<Vec<u8>>, usize)>, BatchError>;

fn owned_walk(batch: &RecordBatch) -> Walk {
    let mut out = Vec::new();
    for r in batch.record_iter(1 << 16)? {
        let r = r?;
        out.push((
            r.offset,
            r.offset_delta,
            r.timestamp,
            r.key.map(|k| k.to_vec()),
            r.value.map(|v| v.to_vec()),
            r.headers.len(),
        ));
    }
    Ok(out)
}

fn borrowed_walk(batch: &RecordBatch) -> Walk {
    let mut out = Vec::new();
    let mut it = batch.record_iter(1 << 16)?;
    while let Some(r) = it.next_ref() {
        let r = r?;
        out.push((
            r.offset,
            r.offset_delta,
            r.timestamp,
            r.key.map(<[u8]>::to_vec),
            r.value.map(<[u8]>::to_vec),
            r.header_count,
        ));
    }
    Ok(out)
}

/// `count` well-formed uncompressed records with keys, values and a header each.
fn valid_records(count: i32) -> Vec<u8> {
    let mut b = rill_protocol::records::RecordBatchBuilder::new(CompressionType::None, 0);
    for i in 0..count {
        let h = [rill_protocol::records::Header::new(
            "h",
            Some(vec![i as u8]),
        )];
        b.append(i64::from(i), Some(&[i as u8]), Some(&[1, 2, 3]), &h)
            .unwrap();
    }
    b.build().unwrap()[61..].to_vec()
}

fn batch_bytes(attributes: i16, count: i32, payload: &[u8]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&0i64.to_be_bytes());
    b.extend_from_slice(&((49 + payload.len()) as i32).to_be_bytes());
    b.extend_from_slice(&(-1i32).to_be_bytes());
    b.push(2);
    b.extend_from_slice(&0u32.to_be_bytes());
    b.extend_from_slice(&attributes.to_be_bytes());
    b.extend_from_slice(&count.saturating_sub(1).max(0).to_be_bytes());
    b.extend_from_slice(&0i64.to_be_bytes());
    b.extend_from_slice(&0i64.to_be_bytes());
    b.extend_from_slice(&(-1i64).to_be_bytes());
    b.extend_from_slice(&(-1i16).to_be_bytes());
    b.extend_from_slice(&(-1i32).to_be_bytes());
    b.extend_from_slice(&count.to_be_bytes());
    b.extend_from_slice(payload);
    let crc = crc32c::crc32c(&b[21..]);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
    b
}

/// Hand-made malformed records, each refused with an error rather than misread.
#[test]
fn malformed_records_are_refused() {
    let cases: &[(&str, &[u8])] = &[
        ("negative record length", &[0x01]),
        ("length past the end", &[0x20, 0, 0, 0, 1, 1, 0]),
        ("key past the record", &[0x0c, 0, 0, 0, 0x08, b'a', 0x01, 0]),
        (
            "key length -2",
            &[0x0c, 0, 0, 0, 0x03, 0x01, 0, 0, 0, 0, 0, 0, 0],
        ),
        (
            "null header key",
            &[0x10, 0, 0, 0, 0x01, 0x01, 0x02, 0x01, 0x01],
        ),
        (
            "header key not UTF-8",
            &[0x10, 0, 0, 0, 0x01, 0x01, 0x02, 0x02, 0xff, 0x01],
        ),
        (
            "header count past the record",
            &[0x0c, 0, 0, 0, 0x01, 0x01, 0x7e],
        ),
        ("negative header count", &[0x0c, 0, 0, 0, 0x01, 0x01, 0x01]),
        (
            "length longer than fields",
            &[0x0e, 0, 0, 0, 0x01, 0x01, 0x00, 0x00],
        ),
        ("overlong varint", &[0x80, 0x80, 0x80, 0x80, 0x80, 0x80]),
    ];
    for (what, payload) in cases {
        let batch = RecordBatch::new(Bytes::from(batch_bytes(0, 1, payload))).unwrap();
        batch.validate().unwrap();
        assert!(batch.records(1 << 16).is_err(), "{what} was accepted");
        assert!(
            borrowed_walk(&batch).is_err(),
            "{what} was accepted borrowed"
        );
    }
    // The smallest valid record, for contrast: null key, null value, no headers.
    let ok: &[u8] = &[0x0c, 0, 0, 0, 0x01, 0x01, 0x00];
    let batch = RecordBatch::new(Bytes::from(batch_bytes(0, 1, ok))).unwrap();
    let r = &batch.records(1 << 16).unwrap()[0];
    assert_eq!(
        (r.key.clone(), r.value.clone(), r.headers.len()),
        (None, None, 0)
    );
    // Trailing bytes after the declared records are an error, as in Kafka.
    let trailing = [ok, &[0]].concat();
    let batch = RecordBatch::new(Bytes::from(batch_bytes(0, 1, &trailing))).unwrap();
    assert!(matches!(
        batch.records(1 << 16),
        Err(BatchError::InvalidRecord(_))
    ));
    assert!(matches!(
        borrowed_walk(&batch),
        Err(BatchError::InvalidRecord(_))
    ));
    // A count that claims more records than the bytes hold is refused by both walks.
    let batch = RecordBatch::new(Bytes::from(batch_bytes(0, 2, ok))).unwrap();
    assert!(batch.records(1 << 16).is_err());
    assert!(borrowed_walk(&batch).is_err());
    // Codecs 5-7 are unknown.
    let batch = RecordBatch::new(Bytes::from(batch_bytes(5, 1, ok))).unwrap();
    assert_eq!(
        batch.records(1 << 16).unwrap_err(),
        BatchError::UnknownCompression(5)
    );
}
