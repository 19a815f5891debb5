//! Bounded readers and writers for the protocol's primitive types, and the traits every
//! generated message implements ([`Encodable`], [`Decodable`], [`Request`]).
//!
//! Every reader checks a length or a count against the bytes that remain *before* it
//! allocates or splits, so a hostile peer cannot make us reserve memory it did not send
//! (a four-byte array count of 0x7fffffff with ten bytes behind it is an error at once).
//! Byte fields are split off the input [`Bytes`] without copying.
//!
//! The varint helpers are generic over [`Buf`]/[`BufMut`] because the record codec uses
//! them too (record fields are zigzag varints).

use std::fmt;

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::error::{DecodeError, EncodeError};

/// A message that can be written at a given version.
pub trait Encodable {
    /// Appends the encoding of `self` at `version` to `buf`.
    fn encode(&self, buf: &mut BytesMut, version: i16) -> Result<(), EncodeError>;
    /// The exact number of bytes [`Encodable::encode`] appends at `version`.
    fn encoded_len(&self, version: i16) -> usize;
}

/// A message that can be read at a given version.
pub trait Decodable: Sized {
    /// Reads one value from the front of `buf`, advancing it.
    fn decode(buf: &mut Bytes, version: i16) -> Result<Self, DecodeError>;
}

/// A top-level request type, tied to its api key, version range and response type.
pub trait Request: Encodable + Decodable + Default {
    const API_KEY: i16;
    const MIN_VERSION: i16;
    const MAX_VERSION: i16;
    type Response: Encodable + Decodable + Default;
}

/// A Kafka UUID (topic ids, directory ids, …): 16 bytes, shown as Kafka shows it, in
/// unpadded URL-safe base64.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Uuid(pub [u8; 16]);

impl Uuid {
    /// The all-zero UUID, Kafka's `Uuid.ZERO_UUID` ("no topic id").
    pub const ZERO: Uuid = Uuid([0; 16]);

    pub const fn from_bytes(bytes: [u8; 16]) -> Self {
        Self(bytes)
    }

    pub const fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }

    pub fn is_zero(&self) -> bool {
        self.0 == [0; 16]
    }

    /// From the two big-endian halves, as Kafka's `Uuid(mostSigBits, leastSigBits)`.
    pub const fn from_u64_pair(most: u64, least: u64) -> Self {
        let (m, l) = (most.to_be_bytes(), least.to_be_bytes());
        let mut b = [0u8; 16];
        let mut i = 0;
        while i < 8 {
            b[i] = m[i];
            b[i + 8] = l[i];
            i += 1;
        }
        Self(b)
    }

    /// The two big-endian halves, Kafka's `getMostSignificantBits` and
    /// `getLeastSignificantBits`.
    pub fn as_u64_pair(&self) -> (u64, u64) {
        let mut most = [0u8; 8];
        let mut least = [0u8; 8];
        most.copy_from_slice(&self.0[..8]);
        least.copy_from_slice(&self.0[8..]);
        (u64::from_be_bytes(most), u64::from_be_bytes(least))
    }
}

const BASE64URL: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

impl fmt::Display for Uuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // 16 bytes = five 3-byte groups (20 chars) and one byte left over (2 chars).
        let mut out = String::with_capacity(22);
        for chunk in self.0.chunks(3) {
            let n = chunk.iter().fold(0u32, |acc, b| (acc << 8) | u32::from(*b))
                << (8 * (3 - chunk.len()));
            let chars = chunk.len() + 1;
            for i in 0..chars {
                let index = (n >> (18 - 6 * i)) & 0x3f;
                out.push(char::from(BASE64URL[index as usize]));
            }
        }
        f.write_str(&out)
    }
}

impl fmt::Debug for Uuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Uuid({self})")
    }
}

impl std::str::FromStr for Uuid {
    type Err = DecodeError;

    /// Parses Kafka's 22-character base64url form.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || DecodeError::InvalidLength {
            length: s.len() as i64,
            remaining: 22,
        };
        if s.len() != 22 {
            return Err(bad());
        }
        let mut bits: u32 = 0;
        let mut nbits = 0;
        let mut out = [0u8; 16];
        let mut at = 0;
        for c in s.bytes() {
            let v = BASE64URL.iter().position(|x| *x == c).ok_or_else(bad)? as u32;
            bits = (bits << 6) | v;
            nbits += 6;
            if nbits >= 8 {
                nbits -= 8;
                if at < 16 {
                    out[at] = (bits >> nbits) as u8;
                    at += 1;
                }
                bits &= (1 << nbits) - 1;
            }
        }
        Ok(Self(out))
    }
}

/// A tagged field this code does not know, kept so that it is written back unchanged.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RawTaggedField {
    pub tag: u32,
    pub data: Bytes,
}

// ---------------------------------------------------------------------------------------
// Varints (protobuf-style unsigned, and zigzag signed), shared with the record codec.

/// Zigzag-maps a signed 32-bit value so that small magnitudes get short varints.
pub const fn zigzag_encode32(v: i32) -> u32 {
    ((v << 1) ^ (v >> 31)) as u32
}

pub const fn zigzag_decode32(v: u32) -> i32 {
    ((v >> 1) as i32) ^ -((v & 1) as i32)
}

pub const fn zigzag_encode64(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

pub const fn zigzag_decode64(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

/// Reads an unsigned varint of at most 5 bytes whose value fits 32 bits.
pub fn read_unsigned_varint<B: Buf>(buf: &mut B) -> Result<u32, DecodeError> {
    let mut value: u32 = 0;
    for i in 0..5 {
        if !buf.has_remaining() {
            return Err(DecodeError::Underflow {
                needed: 1,
                available: 0,
            });
        }
        let b = buf.get_u8();
        if i == 4 && b > 0x0f {
            return Err(DecodeError::VarintTooLong { max_bytes: 5 });
        }
        value |= u32::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(DecodeError::VarintTooLong { max_bytes: 5 })
}

/// Reads an unsigned varint of at most 10 bytes whose value fits 64 bits.
pub fn read_unsigned_varlong<B: Buf>(buf: &mut B) -> Result<u64, DecodeError> {
    let mut value: u64 = 0;
    for i in 0..10 {
        if !buf.has_remaining() {
            return Err(DecodeError::Underflow {
                needed: 1,
                available: 0,
            });
        }
        let b = buf.get_u8();
        if i == 9 && b > 0x01 {
            return Err(DecodeError::VarintTooLong { max_bytes: 10 });
        }
        value |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(DecodeError::VarintTooLong { max_bytes: 10 })
}

/// Reads a zigzag varint (`int32`).
pub fn read_varint<B: Buf>(buf: &mut B) -> Result<i32, DecodeError> {
    read_unsigned_varint(buf).map(zigzag_decode32)
}

/// Reads a zigzag varlong (`int64`).
pub fn read_varlong<B: Buf>(buf: &mut B) -> Result<i64, DecodeError> {
    read_unsigned_varlong(buf).map(zigzag_decode64)
}

pub fn put_unsigned_varint<B: BufMut>(buf: &mut B, mut v: u32) {
    while v >= 0x80 {
        buf.put_u8((v as u8) | 0x80);
        v >>= 7;
    }
    buf.put_u8(v as u8);
}

pub fn put_unsigned_varlong<B: BufMut>(buf: &mut B, mut v: u64) {
    while v >= 0x80 {
        buf.put_u8((v as u8) | 0x80);
        v >>= 7;
    }
    buf.put_u8(v as u8);
}

pub fn put_varint<B: BufMut>(buf: &mut B, v: i32) {
    put_unsigned_varint(buf, zigzag_encode32(v));
}

pub fn put_varlong<B: BufMut>(buf: &mut B, v: i64) {
    put_unsigned_varlong(buf, zigzag_encode64(v));
}

pub const fn unsigned_varint_len(v: u32) -> usize {
    match v {
        0..=0x7f => 1,
        0x80..=0x3fff => 2,
        0x4000..=0x1f_ffff => 3,
        0x20_0000..=0xfff_ffff => 4,
        _ => 5,
    }
}

pub const fn unsigned_varlong_len(v: u64) -> usize {
    let bits = 64 - (v | 1).leading_zeros() as usize;
    bits.div_ceil(7)
}

pub const fn varint_len(v: i32) -> usize {
    unsigned_varint_len(zigzag_encode32(v))
}

pub const fn varlong_len(v: i64) -> usize {
    unsigned_varlong_len(zigzag_encode64(v))
}

// ---------------------------------------------------------------------------------------
// Fixed-width readers.

#[inline]
fn ensure(buf: &Bytes, needed: usize) -> Result<(), DecodeError> {
    if buf.len() < needed {
        Err(DecodeError::Underflow {
            needed,
            available: buf.len(),
        })
    } else {
        Ok(())
    }
}

macro_rules! fixed_reader {
    ($name:ident, $ty:ty, $get:ident) => {
        #[inline]
        pub fn $name(buf: &mut Bytes) -> Result<$ty, DecodeError> {
            ensure(buf, std::mem::size_of::<$ty>())?;
            Ok(buf.$get())
        }
    };
}

fixed_reader!(read_i8, i8, get_i8);
fixed_reader!(read_i16, i16, get_i16);
fixed_reader!(read_u16, u16, get_u16);
fixed_reader!(read_i32, i32, get_i32);
fixed_reader!(read_u32, u32, get_u32);
fixed_reader!(read_i64, i64, get_i64);
fixed_reader!(read_f64, f64, get_f64);

/// Any non-zero byte is `true`, as in Kafka.
#[inline]
pub fn read_bool(buf: &mut Bytes) -> Result<bool, DecodeError> {
    ensure(buf, 1)?;
    Ok(buf.get_u8() != 0)
}

pub fn read_uuid(buf: &mut Bytes) -> Result<Uuid, DecodeError> {
    ensure(buf, 16)?;
    let mut b = [0u8; 16];
    buf.copy_to_slice(&mut b);
    Ok(Uuid(b))
}

// ---------------------------------------------------------------------------------------
// Length-prefixed readers. `compact` selects the flexible-version encoding (unsigned varint
// of length + 1, 0 for null) over the classic one (int16 for strings, int32 for bytes and
// arrays, -1 for null).

/// Reads a length prefix; `None` is null. Lengths are not yet checked against the buffer.
fn read_length(
    buf: &mut Bytes,
    compact: bool,
    classic_i16: bool,
) -> Result<Option<usize>, DecodeError> {
    let raw: i64 = if compact {
        i64::from(read_unsigned_varint(buf)?) - 1
    } else if classic_i16 {
        i64::from(read_i16(buf)?)
    } else {
        i64::from(read_i32(buf)?)
    };
    match raw {
        -1 => Ok(None),
        n if n < 0 => Err(DecodeError::InvalidLength {
            length: n,
            remaining: buf.len(),
        }),
        n => Ok(Some(n as usize)),
    }
}

fn split_checked(buf: &mut Bytes, len: usize) -> Result<Bytes, DecodeError> {
    if len > buf.len() {
        return Err(DecodeError::InvalidLength {
            length: len as i64,
            remaining: buf.len(),
        });
    }
    Ok(buf.split_to(len))
}

fn null_check<T>(value: Option<T>, nullable: bool) -> Result<Option<T>, DecodeError> {
    if value.is_none() && !nullable {
        return Err(DecodeError::UnexpectedNull);
    }
    Ok(value)
}

/// The longest string Kafka reads or writes, compact or not: the classic encoding's int16
/// length bounds it, and Kafka keeps the same bound for compact strings.
pub const MAX_STRING_LEN: usize = i16::MAX as usize;

/// Reads a string that may be null when `nullable` (the field's nullable versions include
/// the version being read); null otherwise is an error.
pub fn read_nullable_string(
    buf: &mut Bytes,
    compact: bool,
    nullable: bool,
) -> Result<Option<String>, DecodeError> {
    let value = match read_length(buf, compact, true)? {
        None => None,
        Some(len) if len > MAX_STRING_LEN => {
            return Err(DecodeError::InvalidLength {
                length: len as i64,
                remaining: buf.len(),
            })
        }
        Some(len) => {
            let bytes = split_checked(buf, len)?;
            let s = std::str::from_utf8(&bytes).map_err(|_| DecodeError::InvalidUtf8)?;
            Some(s.to_owned())
        }
    };
    null_check(value, nullable)
}

pub fn read_string(buf: &mut Bytes, compact: bool) -> Result<String, DecodeError> {
    read_nullable_string(buf, compact, false)?.ok_or(DecodeError::UnexpectedNull)
}

/// Reads a byte field (or a `records` field) without copying: the result shares `buf`.
pub fn read_nullable_bytes(
    buf: &mut Bytes,
    compact: bool,
    nullable: bool,
) -> Result<Option<Bytes>, DecodeError> {
    let value = match read_length(buf, compact, false)? {
        None => None,
        Some(len) => Some(split_checked(buf, len)?),
    };
    null_check(value, nullable)
}

pub fn read_bytes(buf: &mut Bytes, compact: bool) -> Result<Bytes, DecodeError> {
    read_nullable_bytes(buf, compact, false)?.ok_or(DecodeError::UnexpectedNull)
}

/// Reads an array count and checks that `count * elem_min` bytes could follow, so that the
/// vector's capacity is bounded by what the peer actually sent.
pub fn read_array_len(
    buf: &mut Bytes,
    compact: bool,
    elem_min: usize,
) -> Result<Option<usize>, DecodeError> {
    match read_length(buf, compact, false)? {
        None => Ok(None),
        Some(count) => {
            let per = elem_min.max(1);
            if count > buf.len() / per {
                return Err(DecodeError::InvalidLength {
                    length: count as i64,
                    remaining: buf.len(),
                });
            }
            Ok(Some(count))
        }
    }
}

/// Reads a nullable array whose elements are at least `elem_min` bytes each, with `elem`.
pub fn read_nullable_array<T>(
    buf: &mut Bytes,
    compact: bool,
    nullable: bool,
    elem_min: usize,
    mut elem: impl FnMut(&mut Bytes) -> Result<T, DecodeError>,
) -> Result<Option<Vec<T>>, DecodeError> {
    let value = match read_array_len(buf, compact, elem_min)? {
        None => None,
        Some(count) => {
            let mut out = Vec::with_capacity(count);
            for _ in 0..count {
                out.push(elem(buf)?);
            }
            Some(out)
        }
    };
    null_check(value, nullable)
}

pub fn read_array<T>(
    buf: &mut Bytes,
    compact: bool,
    elem_min: usize,
    elem: impl FnMut(&mut Bytes) -> Result<T, DecodeError>,
) -> Result<Vec<T>, DecodeError> {
    read_nullable_array(buf, compact, false, elem_min, elem)?.ok_or(DecodeError::UnexpectedNull)
}

/// Reads a struct that may be null. Kafka writes a presence marker only in the versions
/// where the field is nullable: an int8 (negative for null) inline, an unsigned varint (0
/// for null) inside a tagged field. Elsewhere the struct follows directly.
pub fn read_nullable_struct<T>(
    buf: &mut Bytes,
    nullable: bool,
    tagged: bool,
    read: impl FnOnce(&mut Bytes) -> Result<T, DecodeError>,
) -> Result<Option<T>, DecodeError> {
    if !nullable {
        return read(buf).map(Some);
    }
    let present = if tagged {
        read_unsigned_varint(buf)? > 0
    } else {
        read_i8(buf)? >= 0
    };
    if present {
        read(buf).map(Some)
    } else {
        Ok(None)
    }
}

/// Reads the count of a tagged-field section. Each field takes at least two bytes (tag and
/// size), which bounds the count by the bytes left.
pub fn read_tagged_count(buf: &mut Bytes) -> Result<usize, DecodeError> {
    let count = read_unsigned_varint(buf)? as usize;
    if count > buf.len() / 2 {
        return Err(DecodeError::InvalidLength {
            length: count as i64,
            remaining: buf.len(),
        });
    }
    Ok(count)
}

/// Reads one tagged field's tag and its data, split off without copying.
pub fn read_tagged_field(buf: &mut Bytes) -> Result<(u32, Bytes), DecodeError> {
    let tag = read_unsigned_varint(buf)?;
    let size = read_unsigned_varint(buf)? as usize;
    Ok((tag, split_checked(buf, size)?))
}

// ---------------------------------------------------------------------------------------
// Writers. Only lengths can fail: a string longer than i16::MAX has no classic encoding.

fn write_length(
    buf: &mut BytesMut,
    compact: bool,
    classic_i16: bool,
    len: Option<usize>,
) -> Result<(), EncodeError> {
    match len {
        None => {
            if compact {
                buf.put_u8(0);
            } else if classic_i16 {
                buf.put_i16(-1);
            } else {
                buf.put_i32(-1);
            }
        }
        Some(n) => {
            if compact {
                let v = u32::try_from(n)
                    .ok()
                    .and_then(|n| n.checked_add(1))
                    .ok_or(EncodeError::TooLong(n))?;
                put_unsigned_varint(buf, v);
            } else if classic_i16 {
                buf.put_i16(i16::try_from(n).map_err(|_| EncodeError::TooLong(n))?);
            } else {
                buf.put_i32(i32::try_from(n).map_err(|_| EncodeError::TooLong(n))?);
            }
        }
    }
    Ok(())
}

const fn length_len(compact: bool, classic_i16: bool, len: Option<usize>) -> usize {
    if compact {
        match len {
            None => 1,
            Some(n) => unsigned_varint_len((n as u32).wrapping_add(1)),
        }
    } else if classic_i16 {
        2
    } else {
        4
    }
}

fn null_error(field: &'static str) -> EncodeError {
    EncodeError::UnexpectedNull { field }
}

pub fn write_string(buf: &mut BytesMut, compact: bool, s: &str) -> Result<(), EncodeError> {
    if s.len() > MAX_STRING_LEN {
        return Err(EncodeError::TooLong(s.len()));
    }
    write_length(buf, compact, true, Some(s.len()))?;
    buf.put_slice(s.as_bytes());
    Ok(())
}

/// Writes a nullable string; null where the version does not allow it is an error naming
/// `field`.
pub fn write_nullable_string(
    buf: &mut BytesMut,
    compact: bool,
    nullable: bool,
    s: Option<&str>,
    field: &'static str,
) -> Result<(), EncodeError> {
    match s {
        Some(s) => write_string(buf, compact, s),
        None if nullable => write_length(buf, compact, true, None),
        None => Err(null_error(field)),
    }
}

pub const fn string_len(compact: bool, s: &str) -> usize {
    length_len(compact, true, Some(s.len())) + s.len()
}

pub fn nullable_string_len(compact: bool, s: Option<&str>) -> usize {
    match s {
        Some(s) => string_len(compact, s),
        None => length_len(compact, true, None),
    }
}

pub fn write_bytes(buf: &mut BytesMut, compact: bool, b: &[u8]) -> Result<(), EncodeError> {
    write_length(buf, compact, false, Some(b.len()))?;
    buf.put_slice(b);
    Ok(())
}

pub fn write_nullable_bytes(
    buf: &mut BytesMut,
    compact: bool,
    nullable: bool,
    b: Option<&[u8]>,
    field: &'static str,
) -> Result<(), EncodeError> {
    match b {
        Some(b) => write_bytes(buf, compact, b),
        None if nullable => write_length(buf, compact, false, None),
        None => Err(null_error(field)),
    }
}

pub const fn bytes_len(compact: bool, b: &[u8]) -> usize {
    length_len(compact, false, Some(b.len())) + b.len()
}

pub fn nullable_bytes_len(compact: bool, b: Option<&[u8]>) -> usize {
    match b {
        Some(b) => bytes_len(compact, b),
        None => length_len(compact, false, None),
    }
}

/// Writes an array's count (`None` for null; callers check nullability first).
pub fn write_array_len(
    buf: &mut BytesMut,
    compact: bool,
    len: Option<usize>,
) -> Result<(), EncodeError> {
    write_length(buf, compact, false, len)
}

pub const fn array_len_len(compact: bool, len: Option<usize>) -> usize {
    length_len(compact, false, len)
}

/// Null where the version does not allow it.
pub fn encode_null_error(field: &'static str) -> EncodeError {
    null_error(field)
}

pub fn write_unknown_tagged_field(
    buf: &mut BytesMut,
    field: &RawTaggedField,
) -> Result<(), EncodeError> {
    put_unsigned_varint(buf, field.tag);
    let len =
        u32::try_from(field.data.len()).map_err(|_| EncodeError::TooLong(field.data.len()))?;
    put_unsigned_varint(buf, len);
    buf.put_slice(&field.data);
    Ok(())
}

/// Writes the unknown tagged fields whose tag is below `tag` (they come sorted from the
/// decoder) and returns the rest, so that known and unknown fields stay in tag order.
pub fn write_unknown_tagged_fields_before<'a>(
    buf: &mut BytesMut,
    fields: &'a [RawTaggedField],
    tag: u32,
) -> Result<&'a [RawTaggedField], EncodeError> {
    let mut rest = fields;
    while let Some((first, tail)) = rest.split_first() {
        if first.tag >= tag {
            break;
        }
        write_unknown_tagged_field(buf, first)?;
        rest = tail;
    }
    Ok(rest)
}

pub fn unknown_tagged_fields_len(fields: &[RawTaggedField]) -> usize {
    fields
        .iter()
        .map(|f| {
            unsigned_varint_len(f.tag) + unsigned_varint_len(f.data.len() as u32) + f.data.len()
        })
        .sum()
}

/// Writes a tagged-field header: the tag and the size of the value that follows.
pub fn write_tag_header(buf: &mut BytesMut, tag: u32, size: usize) -> Result<(), EncodeError> {
    put_unsigned_varint(buf, tag);
    put_unsigned_varint(
        buf,
        u32::try_from(size).map_err(|_| EncodeError::TooLong(size))?,
    );
    Ok(())
}

pub const fn tag_header_len(tag: u32, size: usize) -> usize {
    unsigned_varint_len(tag) + unsigned_varint_len(size as u32)
}

pub fn write_tagged_count(buf: &mut BytesMut, count: usize) -> Result<(), EncodeError> {
    put_unsigned_varint(
        buf,
        u32::try_from(count).map_err(|_| EncodeError::TooLong(count))?,
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_round_trip() {
        for v in [0i32, 1, -1, 63, -64, 64, 300, i32::MAX, i32::MIN] {
            let mut b = BytesMut::new();
            put_varint(&mut b, v);
            assert_eq!(b.len(), varint_len(v));
            assert_eq!(read_varint(&mut b.freeze()).unwrap(), v);
        }
        for v in [0i64, 1, -1, 1 << 40, i64::MAX, i64::MIN] {
            let mut b = BytesMut::new();
            put_varlong(&mut b, v);
            assert_eq!(b.len(), varlong_len(v));
            assert_eq!(read_varlong(&mut b.freeze()).unwrap(), v);
        }
        for v in [0u32, 127, 128, 16383, 16384, u32::MAX] {
            let mut b = BytesMut::new();
            put_unsigned_varint(&mut b, v);
            assert_eq!(b.len(), unsigned_varint_len(v));
            assert_eq!(read_unsigned_varint(&mut b.freeze()).unwrap(), v);
        }
    }

    #[test]
    fn overlong_varint_is_an_error() {
        let mut b = Bytes::from_static(&[0xff, 0xff, 0xff, 0xff, 0xff, 0x01]);
        assert!(matches!(
            read_unsigned_varint(&mut b),
            Err(DecodeError::VarintTooLong { .. })
        ));
        let mut b = Bytes::from_static(&[0x80]);
        assert!(matches!(
            read_unsigned_varint(&mut b),
            Err(DecodeError::Underflow { .. })
        ));
    }

    #[test]
    fn hostile_lengths_fail_before_allocating() {
        let mut b = Bytes::from_static(&[0x7f, 0xff, 0xff, 0xff, 0, 0]);
        assert!(matches!(
            read_array_len(&mut b, false, 1),
            Err(DecodeError::InvalidLength { .. })
        ));
        let mut b = Bytes::from_static(&[0xff, 0xfe]);
        assert!(matches!(
            read_nullable_string(&mut b, false, true),
            Err(DecodeError::InvalidLength { .. })
        ));
        let mut b = Bytes::from_static(&[0xff, 0xff]);
        assert_eq!(read_nullable_string(&mut b, false, true).unwrap(), None);
        let mut b = Bytes::from_static(&[0xff, 0xff]);
        assert_eq!(
            read_nullable_string(&mut b, false, false),
            Err(DecodeError::UnexpectedNull)
        );
        let mut b = Bytes::from_static(&[0x00, 0x02, 0xc3, 0x28]);
        assert_eq!(read_string(&mut b, false), Err(DecodeError::InvalidUtf8));
    }

    #[test]
    fn uuid_displays_as_kafka_base64url() {
        // Kafka prints Uuid(0, 1) as "AAAAAAAAAAAAAAAAAAAAAQ".
        let u = Uuid::from_u64_pair(0, 1);
        assert_eq!(u.to_string(), "AAAAAAAAAAAAAAAAAAAAAQ");
        assert_eq!("AAAAAAAAAAAAAAAAAAAAAQ".parse::<Uuid>().unwrap(), u);
        let u = Uuid([0xfb; 16]);
        assert_eq!(u.to_string().parse::<Uuid>().unwrap(), u);
    }
}
