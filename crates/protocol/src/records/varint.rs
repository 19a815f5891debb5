//! Zig-zag varints as records use them (protobuf's encoding; Kafka's `ByteUtils`).
//!
//! Private to `records` until the shared primitives in `crate::primitives` carry the same
//! helpers; then these can be replaced by those without changing any caller outside.
//!
//! Reading mirrors the Java client: at most 5 bytes for an int and 10 for a long, and
//! bits that do not fit the type are dropped rather than refused, so that anything Kafka
//! accepts we accept too.

/// Longest encoding of a 32-bit varint.
const MAX_VARINT_LEN: usize = 5;
/// Longest encoding of a 64-bit varint.
const MAX_VARLONG_LEN: usize = 10;

/// Why a varint could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum VarintError {
    /// The buffer ended in the middle of the varint.
    Truncated,
    /// More continuation bytes than the type allows.
    TooLong,
}

/// Reads an unsigned varint of at most `max_len` bytes from the front of `buf`, returning
/// the value and the number of bytes it took.
#[inline]
fn read_unsigned(buf: &[u8], max_len: usize) -> Result<(u64, usize), VarintError> {
    // Most of a record's varints fit one byte (small deltas, short key lengths, header
    // counts), and the leader reads every one of them for every produced record, so that
    // case skips the loop.
    if let Some(&byte) = buf.first() {
        if byte & 0x80 == 0 {
            return Ok((u64::from(byte), 1));
        }
    }
    let mut value: u64 = 0;
    for (i, &byte) in buf.iter().enumerate() {
        if i >= max_len {
            return Err(VarintError::TooLong);
        }
        // `i * 7` is at most 63, so the shift never overflows; high bits fall off as
        // they do in Java.
        value |= u64::from(byte & 0x7f) << (i * 7);
        if byte & 0x80 == 0 {
            return Ok((value, i + 1));
        }
    }
    if buf.len() >= max_len {
        Err(VarintError::TooLong)
    } else {
        Err(VarintError::Truncated)
    }
}

/// Reads a zig-zag encoded `int32`.
#[inline]
pub(crate) fn read_varint(buf: &[u8]) -> Result<(i32, usize), VarintError> {
    let (raw, len) = read_unsigned(buf, MAX_VARINT_LEN)?;
    let raw = raw as u32;
    Ok((((raw >> 1) as i32) ^ -((raw & 1) as i32), len))
}

/// Reads a zig-zag encoded `int64`.
#[inline]
pub(crate) fn read_varlong(buf: &[u8]) -> Result<(i64, usize), VarintError> {
    let (raw, len) = read_unsigned(buf, MAX_VARLONG_LEN)?;
    Ok((((raw >> 1) as i64) ^ -((raw & 1) as i64), len))
}

fn write_unsigned(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// Appends a zig-zag encoded `int32`.
pub(crate) fn write_varint(out: &mut Vec<u8>, value: i32) {
    write_unsigned(out, u64::from(((value << 1) ^ (value >> 31)) as u32));
}

/// Appends a zig-zag encoded `int64`.
pub(crate) fn write_varlong(out: &mut Vec<u8>, value: i64) {
    write_unsigned(out, ((value << 1) ^ (value >> 63)) as u64);
}

/// Encoded size of a zig-zag `int32`.
pub(crate) fn varint_len(value: i32) -> usize {
    unsigned_len(u64::from(((value << 1) ^ (value >> 31)) as u32))
}

/// Encoded size of a zig-zag `int64`.
pub(crate) fn varlong_len(value: i64) -> usize {
    unsigned_len(((value << 1) ^ (value >> 63)) as u64)
}

fn unsigned_len(value: u64) -> usize {
    let bits = 64 - (value | 1).leading_zeros() as usize;
    bits.div_ceil(7)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn known_encodings() {
        let cases: &[(i32, &[u8])] = &[
            (0, &[0x00]),
            (-1, &[0x01]),
            (1, &[0x02]),
            (63, &[0x7e]),
            (-64, &[0x7f]),
            (64, &[0x80, 0x01]),
            (i32::MAX, &[0xfe, 0xff, 0xff, 0xff, 0x0f]),
            (i32::MIN, &[0xff, 0xff, 0xff, 0xff, 0x0f]),
        ];
        for &(value, bytes) in cases {
            let mut out = Vec::new();
            write_varint(&mut out, value);
            assert_eq!(out, bytes, "encoding {value}");
            assert_eq!(read_varint(bytes), Ok((value, bytes.len())));
            assert_eq!(varint_len(value), bytes.len());
        }
    }

    #[test]
    fn truncated_and_overlong() {
        assert_eq!(read_varint(&[]), Err(VarintError::Truncated));
        assert_eq!(read_varint(&[0x80, 0x80]), Err(VarintError::Truncated));
        assert_eq!(read_varint(&[0x80; 6]), Err(VarintError::TooLong));
        assert_eq!(read_varint(&[0x80; 5]), Err(VarintError::TooLong));
        assert_eq!(read_varlong(&[0x80; 11]), Err(VarintError::TooLong));
    }

    proptest! {
        #[test]
        fn varint_round_trip(v in any::<i32>()) {
            let mut out = Vec::new();
            write_varint(&mut out, v);
            prop_assert_eq!(out.len(), varint_len(v));
            prop_assert_eq!(read_varint(&out), Ok((v, out.len())));
        }

        #[test]
        fn varlong_round_trip(v in any::<i64>()) {
            let mut out = Vec::new();
            write_varlong(&mut out, v);
            prop_assert_eq!(out.len(), varlong_len(v));
            prop_assert_eq!(read_varlong(&out), Ok((v, out.len())));
        }

        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..12)) {
            let _ = read_varint(&bytes);
            let _ = read_varlong(&bytes);
        }
    }
}
