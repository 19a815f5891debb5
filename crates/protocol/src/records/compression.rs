//! The compression codecs of record batches, each in the framing Kafka's clients use, and
//! each decoder with a hard cap on the decompressed size.
//!
//! - gzip: RFC 1952, several members accepted back to back (Java's `GZIPInputStream`
//!   reads them all).
//! - snappy: the xerial framing of Kafka's Java client (`snappy-java`'s
//!   `SnappyOutputStream`): a 16-byte header (`\x82SNAPPY\0`, version 1, compatible
//!   version 1), then blocks of `[int32 compressed length][raw snappy block]`. librdkafka
//!   and several other clients send one raw snappy block with no framing instead, which
//!   `snappy-java` decodes too (it falls back when the magic is absent), so we do the same.
//! - lz4: the LZ4 frame format with independent blocks of at most 64 KiB and no content
//!   checksum, which is what Kafka's `KafkaLZ4BlockOutputStream` and librdkafka write; the
//!   Java reader refuses linked blocks, so we never write them.
//! - zstd: standard frames, decoded as a stream.
//!
//! Decompression bombs: every decoder stops after `cap + 1` output bytes (through
//! `Read::take` or a length check before allocating) and reports
//! [`BatchError::DecompressedTooLarge`], so memory never grows past the cap however
//! small the input is.

use std::io::{Read, Write};

use super::batch::{BatchError, CompressionType};

/// Size of the uncompressed blocks written in the xerial snappy framing; `snappy-java`'s
/// default, so that a Java reader sees what it would see from a Java writer.
const XERIAL_BLOCK_LEN: usize = 32 * 1024;
/// `\x82SNAPPY\0`: the magic of the xerial snappy framing.
const XERIAL_MAGIC: [u8; 8] = [0x82, b'S', b'N', b'A', b'P', b'P', b'Y', 0];
/// Magic, then the version and the minimum compatible version as big-endian int32s.
const XERIAL_HEADER_LEN: usize = 16;
const XERIAL_VERSION: i32 = 1;
const XERIAL_COMPATIBLE_VERSION: i32 = 1;

/// zstd windows we accept at least, whatever the cap: level 19 writes 8 MiB windows and a
/// producer's window does not depend on how much it actually compressed.
const ZSTD_MIN_WINDOW_LOG: u32 = 23;
/// zstd's own default limit (128 MiB), which no producer exceeds without `--long`.
const ZSTD_MAX_WINDOW_LOG: u32 = 27;

fn codec_error(codec: &str, err: impl std::fmt::Display) -> BatchError {
    BatchError::Codec(format!("{codec}: {err}"))
}

/// Compresses `input` with `codec` at the codec's default level.
///
/// ```
/// use rill_protocol::records::{compression, CompressionType};
///
/// let data = b"hello hello hello hello".repeat(10);
/// let packed = compression::compress(CompressionType::Zstd, &data).unwrap();
/// let unpacked = compression::decompress(CompressionType::Zstd, &packed, 1 << 20).unwrap();
/// assert_eq!(unpacked, data);
/// ```
pub fn compress(codec: CompressionType, input: &[u8]) -> Result<Vec<u8>, BatchError> {
    compress_with_level(codec, input, None)
}

/// Compresses `input` with `codec`; `level` (KIP-390's `compression.<codec>.level`) is
/// used by gzip (0-9) and zstd (1-22, negative for fast modes) and ignored by the others.
pub fn compress_with_level(
    codec: CompressionType,
    input: &[u8],
    level: Option<i32>,
) -> Result<Vec<u8>, BatchError> {
    match codec {
        CompressionType::None => Ok(input.to_vec()),
        CompressionType::Gzip => {
            let level = match level {
                Some(l) => flate2::Compression::new(l.clamp(0, 9) as u32),
                None => flate2::Compression::default(),
            };
            let mut enc =
                flate2::write::GzEncoder::new(Vec::with_capacity(input.len() / 2 + 64), level);
            enc.write_all(input).map_err(|e| codec_error("gzip", e))?;
            enc.finish().map_err(|e| codec_error("gzip", e))
        }
        CompressionType::Snappy => xerial_snappy_compress(input),
        CompressionType::Lz4 => {
            let info = lz4_flex::frame::FrameInfo::new()
                .block_size(lz4_flex::frame::BlockSize::Max64KB)
                .block_mode(lz4_flex::frame::BlockMode::Independent);
            let mut enc = lz4_flex::frame::FrameEncoder::with_frame_info(
                info,
                Vec::with_capacity(input.len() / 2 + 64),
            );
            enc.write_all(input).map_err(|e| codec_error("lz4", e))?;
            enc.finish().map_err(|e| codec_error("lz4", e))
        }
        CompressionType::Zstd => {
            // 3 is both zstd's and Kafka's default level.
            zstd::bulk::compress(input, level.unwrap_or(3)).map_err(|e| codec_error("zstd", e))
        }
    }
}

/// Decompresses `input`, refusing with [`BatchError::DecompressedTooLarge`] as soon as
/// the output would exceed `cap` bytes. Never panics on malformed input.
pub fn decompress(codec: CompressionType, input: &[u8], cap: usize) -> Result<Vec<u8>, BatchError> {
    match codec {
        CompressionType::None => {
            if input.len() > cap {
                return Err(BatchError::DecompressedTooLarge(cap));
            }
            Ok(input.to_vec())
        }
        CompressionType::Gzip => read_capped(
            "gzip",
            flate2::read::MultiGzDecoder::new(input),
            input.len(),
            cap,
        ),
        CompressionType::Snappy => snappy_decompress(input, cap),
        CompressionType::Lz4 => read_capped(
            "lz4",
            lz4_flex::frame::FrameDecoder::new(input),
            input.len(),
            cap,
        ),
        CompressionType::Zstd => {
            let mut dec = zstd::stream::read::Decoder::with_buffer(input)
                .map_err(|e| codec_error("zstd", e))?;
            // The decoder allocates its window up front from the frame header; bound it
            // so a forged header cannot make it reserve more than any real producer needs.
            dec.window_log_max(zstd_window_log_max(cap))
                .map_err(|e| codec_error("zstd", e))?;
            read_capped("zstd", dec, input.len(), cap)
        }
    }
}

fn zstd_window_log_max(cap: usize) -> u32 {
    let cap_log = usize::BITS - cap.saturating_sub(1).leading_zeros();
    cap_log.clamp(ZSTD_MIN_WINDOW_LOG, ZSTD_MAX_WINDOW_LOG)
}

/// Reads `reader` to the end, but never more than `cap + 1` bytes: one byte past the cap
/// is how we tell "exactly at the cap" from "too large" without reading further.
fn read_capped(
    codec: &str,
    reader: impl Read,
    input_len: usize,
    cap: usize,
) -> Result<Vec<u8>, BatchError> {
    let limit = (cap as u64).saturating_add(1);
    // A guess at the ratio saves a few reallocations; the cap bounds it either way.
    let mut out = Vec::with_capacity(input_len.saturating_mul(4).min(cap.saturating_add(1)));
    reader
        .take(limit)
        .read_to_end(&mut out)
        .map_err(|e| codec_error(codec, e))?;
    if out.len() > cap {
        return Err(BatchError::DecompressedTooLarge(cap));
    }
    Ok(out)
}

/// Writes the xerial framing: header, then each 32 KiB slice of the input as its own raw
/// snappy block behind a big-endian length.
fn xerial_snappy_compress(input: &[u8]) -> Result<Vec<u8>, BatchError> {
    let mut out = Vec::with_capacity(XERIAL_HEADER_LEN + snap::raw::max_compress_len(input.len()));
    out.extend_from_slice(&XERIAL_MAGIC);
    out.extend_from_slice(&XERIAL_VERSION.to_be_bytes());
    out.extend_from_slice(&XERIAL_COMPATIBLE_VERSION.to_be_bytes());
    let mut encoder = snap::raw::Encoder::new();
    let mut block = Vec::new();
    for chunk in input.chunks(XERIAL_BLOCK_LEN) {
        block.resize(snap::raw::max_compress_len(chunk.len()), 0);
        let n = encoder
            .compress(chunk, &mut block)
            .map_err(|e| codec_error("snappy", e))?;
        let len =
            i32::try_from(n).map_err(|_| BatchError::Codec("snappy: block too long".into()))?;
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(&block[..n]);
    }
    Ok(out)
}

/// Decodes the xerial framing, or a single raw snappy block when the magic is absent.
fn snappy_decompress(input: &[u8], cap: usize) -> Result<Vec<u8>, BatchError> {
    if input.len() < XERIAL_MAGIC.len() || input[..XERIAL_MAGIC.len()] != XERIAL_MAGIC {
        let mut out = Vec::new();
        raw_snappy_append(input, &mut out, cap)?;
        return Ok(out);
    }
    let mut out = Vec::new();
    let mut rest = input;
    // Several xerial streams may follow one another (snappy-java reads through them), so
    // a header can appear wherever a block length is expected.
    while !rest.is_empty() {
        if rest.starts_with(&XERIAL_MAGIC) {
            if rest.len() < XERIAL_HEADER_LEN {
                return Err(codec_error("snappy", "truncated xerial header"));
            }
            let compatible = i32::from_be_bytes([rest[12], rest[13], rest[14], rest[15]]);
            if compatible > XERIAL_VERSION {
                return Err(codec_error(
                    "snappy",
                    format_args!("unsupported xerial compatible version {compatible}"),
                ));
            }
            rest = &rest[XERIAL_HEADER_LEN..];
            continue;
        }
        if rest.len() < 4 {
            return Err(codec_error("snappy", "truncated xerial block length"));
        }
        let len = i32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]);
        rest = &rest[4..];
        let len = usize::try_from(len)
            .map_err(|_| codec_error("snappy", format_args!("negative block length {len}")))?;
        if len > rest.len() {
            return Err(codec_error(
                "snappy",
                format_args!("block of {len} bytes but only {} remain", rest.len()),
            ));
        }
        let (block, tail) = rest.split_at(len);
        rest = tail;
        if !block.is_empty() {
            raw_snappy_append(block, &mut out, cap)?;
        }
    }
    Ok(out)
}

/// Decompresses one raw snappy block onto the end of `out`. The block states its
/// decompressed length up front, so the cap is checked before anything is allocated.
fn raw_snappy_append(block: &[u8], out: &mut Vec<u8>, cap: usize) -> Result<(), BatchError> {
    let len = snap::raw::decompress_len(block).map_err(|e| codec_error("snappy", e))?;
    if len > cap.saturating_sub(out.len()) {
        return Err(BatchError::DecompressedTooLarge(cap));
    }
    let start = out.len();
    out.resize(start + len, 0);
    let n = snap::raw::Decoder::new()
        .decompress(block, &mut out[start..])
        .map_err(|e| codec_error("snappy", e))?;
    out.truncate(start + n);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [CompressionType; 5] = [
        CompressionType::None,
        CompressionType::Gzip,
        CompressionType::Snappy,
        CompressionType::Lz4,
        CompressionType::Zstd,
    ];

    #[test]
    fn round_trip_every_codec() {
        let data: Vec<u8> = (0..200_000u32)
            .flat_map(|i| (i % 251).to_le_bytes())
            .collect();
        for codec in ALL {
            let packed = compress(codec, &data).unwrap();
            let unpacked = decompress(codec, &packed, data.len()).unwrap();
            assert_eq!(unpacked, data, "{codec:?}");
            assert_eq!(
                decompress(codec, &packed, data.len() - 1),
                Err(BatchError::DecompressedTooLarge(data.len() - 1)),
                "{codec:?}"
            );
        }
    }

    #[test]
    fn empty_input_round_trips() {
        for codec in ALL {
            let packed = compress(codec, &[]).unwrap();
            assert_eq!(
                decompress(codec, &packed, 0).unwrap(),
                Vec::<u8>::new(),
                "{codec:?}"
            );
        }
    }

    #[test]
    fn xerial_framing_layout() {
        let data = vec![7u8; XERIAL_BLOCK_LEN + 10];
        let packed = compress(CompressionType::Snappy, &data).unwrap();
        assert_eq!(&packed[..8], &XERIAL_MAGIC);
        assert_eq!(&packed[8..16], &[0, 0, 0, 1, 0, 0, 0, 1]);
        // Two blocks: the first covers exactly 32 KiB.
        let first = i32::from_be_bytes(packed[16..20].try_into().unwrap()) as usize;
        let block = &packed[20..20 + first];
        assert_eq!(snap::raw::decompress_len(block).unwrap(), XERIAL_BLOCK_LEN);
    }

    #[test]
    fn raw_snappy_block_is_accepted() {
        let data = b"a raw snappy block, as librdkafka sends it".repeat(20);
        let raw = snap::raw::Encoder::new().compress_vec(&data).unwrap();
        assert_eq!(
            decompress(CompressionType::Snappy, &raw, 1 << 20).unwrap(),
            data
        );
        assert_eq!(
            decompress(CompressionType::Snappy, &raw, 10),
            Err(BatchError::DecompressedTooLarge(10))
        );
    }

    #[test]
    fn concatenated_xerial_streams_and_gzip_members() {
        let a = b"first part ".repeat(100);
        let b = b"second part".repeat(100);
        for codec in [
            CompressionType::Snappy,
            CompressionType::Gzip,
            CompressionType::Zstd,
        ] {
            let mut packed = compress(codec, &a).unwrap();
            packed.extend(compress(codec, &b).unwrap());
            let out = decompress(codec, &packed, 1 << 20).unwrap();
            assert_eq!(out, [a.clone(), b.clone()].concat(), "{codec:?}");
        }
    }

    #[test]
    fn truncated_snappy_headers_are_errors() {
        let packed = compress(CompressionType::Snappy, &b"x".repeat(1000)).unwrap();
        for cut in 0..packed.len() {
            // Whatever the cut, no panic; a cut inside a block is an error.
            let _ = decompress(CompressionType::Snappy, &packed[..cut], 1 << 20);
        }
        assert!(decompress(CompressionType::Snappy, &packed[..12], 1 << 20).is_err());
        assert!(decompress(CompressionType::Snappy, &packed[..18], 1 << 20).is_err());
        assert!(decompress(
            CompressionType::Snappy,
            &packed[..packed.len() - 1],
            1 << 20
        )
        .is_err());
    }

    #[test]
    fn zstd_window_limit_follows_the_cap() {
        assert_eq!(zstd_window_log_max(1 << 20), ZSTD_MIN_WINDOW_LOG);
        assert_eq!(zstd_window_log_max(1 << 25), 25);
        assert_eq!(zstd_window_log_max((1 << 25) + 1), 26);
        assert_eq!(zstd_window_log_max(usize::MAX), ZSTD_MAX_WINDOW_LOG);
        assert_eq!(zstd_window_log_max(0), ZSTD_MIN_WINDOW_LOG);
    }
}
