//! The records inside a record batch (magic 2): decoding, with offsets and timestamps
//! resolved, and the encoding the builder uses.
//!
//! Layout of one record (all lengths and deltas are zig-zag varints):
//!
//! ```text
//! length varint            bytes that follow, up to the end of the headers
//! attributes int8          unused, always 0
//! timestampDelta varlong   from the batch's baseTimestamp
//! offsetDelta varint       from the batch's baseOffset
//! keyLength varint, key    -1 for a null key
//! valueLength varint, value
//! headerCount varint, then per header: keyLength varint, key (UTF-8, never null),
//!                                      valueLength varint, value (-1 for null)
//! ```
//!
//! Decoding trusts nothing: each length is checked against the bytes that remain (of
//! the record, not only of the buffer) before slicing, a record must consume exactly its
//! declared length, the batch must hold exactly `recordCount` records, and nothing is
//! preallocated from a count the bytes could not back. Keys and values are slices of the
//! batch (or of its decompressed payload), never copies.

use std::ops::Range;

use bytes::Bytes;

use super::batch::{BatchError, CompressionType, RecordBatch, TimestampType};
use super::compression;
use super::varint::{self, VarintError};

/// The smallest possible record: a 1-byte length, then attributes, timestamp delta,
/// offset delta, key length, value length and header count of one byte each.
const MIN_RECORD_LEN: usize = 7;
/// The smallest possible header: a zero key length and a null value length.
const MIN_HEADER_LEN: usize = 2;

/// A record header: Kafka's keys are non-null UTF-8 strings, values nullable bytes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Header {
    pub key: String,
    pub value: Option<Bytes>,
}

impl Header {
    /// ```
    /// use rill_protocol::records::Header;
    ///
    /// let h = Header::new("trace-id", Some(&b"abc"[..]));
    /// assert_eq!(h.value.as_deref(), Some(&b"abc"[..]));
    /// ```
    pub fn new(key: impl Into<String>, value: Option<impl Into<Bytes>>) -> Self {
        Self {
            key: key.into(),
            value: value.map(Into::into),
        }
    }
}

/// One decoded record, with its absolute offset and timestamp.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// `baseOffset + offsetDelta`.
    pub offset: i64,
    /// As stored; deltas need not be contiguous in a compacted batch.
    pub offset_delta: i32,
    /// `baseTimestamp + timestampDelta` for CreateTime batches, the batch's
    /// `maxTimestamp` for LogAppendTime batches (as Kafka's clients report it).
    pub timestamp: i64,
    /// The record's own attributes byte (unused by Kafka so far, kept for fidelity).
    pub attributes: i8,
    pub key: Option<Bytes>,
    pub value: Option<Bytes>,
    pub headers: Vec<Header>,
}

/// Which transaction marker a control record is (the `type` in its key).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ControlRecordType {
    Abort,
    Commit,
    /// A type this version does not know; Kafka's consumers skip those.
    Unknown(i16),
}

impl ControlRecordType {
    /// Reads the key of a control record: `version int16, type int16`.
    pub fn from_key(key: &[u8]) -> Result<Self, BatchError> {
        if key.len() < 4 {
            return Err(BatchError::InvalidRecord(
                "control record key shorter than 4 bytes",
            ));
        }
        let version = i16::from_be_bytes([key[0], key[1]]);
        if version < 0 {
            return Err(BatchError::InvalidRecord(
                "negative control record key version",
            ));
        }
        Ok(match i16::from_be_bytes([key[2], key[3]]) {
            0 => Self::Abort,
            1 => Self::Commit,
            other => Self::Unknown(other),
        })
    }

    /// The `type` field.
    pub fn id(self) -> i16 {
        match self {
            Self::Abort => 0,
            Self::Commit => 1,
            Self::Unknown(id) => id,
        }
    }

    /// The key of a control record of this type (key version 0).
    pub fn key(self) -> [u8; 4] {
        let t = self.id().to_be_bytes();
        [0, 0, t[0], t[1]]
    }
}

/// The value of a transaction marker (`EndTxnMarker`): version 0, then the epoch of the
/// transaction coordinator that wrote it.
pub fn end_txn_marker_value(coordinator_epoch: i32) -> [u8; 6] {
    let e = coordinator_epoch.to_be_bytes();
    [0, 0, e[0], e[1], e[2], e[3]]
}

impl RecordBatch {
    /// Decodes every record of the batch, decompressing first (never to more than
    /// `max_decompressed_bytes`). Does not check the CRC: call [`Self::validate`] first
    /// when the bytes come from outside.
    ///
    /// ```
    /// use bytes::Bytes;
    /// use rill_protocol::records::{CompressionType, RecordBatch, RecordBatchBuilder};
    ///
    /// let mut builder = RecordBatchBuilder::new(CompressionType::Lz4, 100);
    /// builder.append(1_700_000_000_000, Some(b"k"), Some(b"v"), &[]).unwrap();
    /// builder.append(1_700_000_000_005, None, None, &[]).unwrap();
    /// let batch = RecordBatch::new(builder.build().unwrap()).unwrap();
    /// batch.validate().unwrap();
    ///
    /// let records = batch.records(1 << 20).unwrap();
    /// assert_eq!(records[1].offset, 101);
    /// assert_eq!(records[1].timestamp, 1_700_000_000_005);
    /// assert_eq!(records[0].key.as_deref(), Some(&b"k"[..]));
    /// assert_eq!(records[1].value, None);
    /// ```
    pub fn records(&self, max_decompressed_bytes: usize) -> Result<Vec<Record>, BatchError> {
        self.record_iter(max_decompressed_bytes)?.collect()
    }

    /// Decompresses the batch (never to more than `max_decompressed_bytes`) and returns
    /// an iterator that decodes one record at a time. The iterator yields exactly
    /// `recordCount` items or stops at the first error; trailing bytes after the last
    /// record are an error, as they are in Kafka.
    pub fn record_iter(&self, max_decompressed_bytes: usize) -> Result<RecordIter, BatchError> {
        let count = self.record_count();
        if count < 0 {
            return Err(BatchError::InvalidRecord("negative record count"));
        }
        let payload = self.records_payload();
        let codec = self.compression()?;
        let buf = match codec {
            // An empty batch (kept by the cleaner for producer state) has no payload even
            // when a codec is set.
            _ if count == 0 && payload.is_empty() => payload,
            CompressionType::None => {
                if payload.len() > max_decompressed_bytes {
                    return Err(BatchError::DecompressedTooLarge(max_decompressed_bytes));
                }
                payload
            }
            _ => Bytes::from(compression::decompress(
                codec,
                &payload,
                max_decompressed_bytes,
            )?),
        };
        let log_append_time = match self.timestamp_type() {
            TimestampType::LogAppendTime => Some(self.max_timestamp()),
            TimestampType::CreateTime => None,
        };
        Ok(RecordIter {
            buf,
            pos: 0,
            remaining: count as usize,
            base_offset: self.base_offset(),
            base_timestamp: self.base_timestamp(),
            log_append_time,
            failed: false,
        })
    }
}

/// Iterator over the decoded records of one batch; see [`RecordBatch::record_iter`].
///
/// Besides [`Iterator::next`], which hands out owned [`Record`]s, [`RecordIter::next_ref`]
/// decodes and checks the same way but borrows keys and values from the iterator's buffer
/// and does not collect the headers: a caller that only inspects records (the leader's
/// validation of a produced batch) then pays no reference count, allocation or copy per
/// record.
pub struct RecordIter {
    buf: Bytes,
    pos: usize,
    remaining: usize,
    base_offset: i64,
    base_timestamp: i64,
    log_append_time: Option<i64>,
    failed: bool,
}

/// One record as [`RecordIter::next_ref`] returns it: every field decoded and checked as
/// for [`Record`] (headers included), keys and values borrowed, headers only counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordRef<'a> {
    /// `baseOffset + offsetDelta`.
    pub offset: i64,
    pub offset_delta: i32,
    /// As [`Record::timestamp`].
    pub timestamp: i64,
    pub attributes: i8,
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
    pub header_count: usize,
}

/// Where one decoded record's parts lie in the iterator's buffer.
struct RecordSpan {
    offset: i64,
    offset_delta: i32,
    timestamp: i64,
    attributes: i8,
    key: Option<Range<usize>>,
    value: Option<Range<usize>>,
    header_count: usize,
    /// The headers, already checked (non-null UTF-8 keys, lengths within the record).
    headers: Range<usize>,
}

impl RecordIter {
    /// The decompressed records section, as the records' slices share it.
    pub fn buffer(&self) -> &Bytes {
        &self.buf
    }

    /// The next record, borrowed (see the type's note); the same records, checks and
    /// errors as [`Iterator::next`], which it advances exactly as that would.
    ///
    /// ```
    /// use rill_protocol::records::{CompressionType, RecordBatch, RecordBatchBuilder};
    ///
    /// let mut builder = RecordBatchBuilder::new(CompressionType::None, 0);
    /// builder.append(1_700_000_000_000, Some(b"k"), Some(b"v"), &[]).unwrap();
    /// let batch = RecordBatch::new(builder.build().unwrap()).unwrap();
    /// let mut records = batch.record_iter(1 << 20).unwrap();
    /// let first = records.next_ref().unwrap().unwrap();
    /// assert_eq!((first.offset_delta, first.key), (0, Some(&b"k"[..])));
    /// assert!(records.next_ref().is_none());
    /// ```
    pub fn next_ref(&mut self) -> Option<Result<RecordRef<'_>, BatchError>> {
        let span = match self.advance()? {
            Ok(span) => span,
            Err(e) => return Some(Err(e)),
        };
        let buf = &self.buf[..];
        Some(Ok(RecordRef {
            offset: span.offset,
            offset_delta: span.offset_delta,
            timestamp: span.timestamp,
            attributes: span.attributes,
            key: span.key.map(|r| &buf[r]),
            value: span.value.map(|r| &buf[r]),
            header_count: span.header_count,
        }))
    }

    /// Counts down `recordCount`, refuses trailing bytes after the last record, and stops
    /// for good at the first error.
    fn advance(&mut self) -> Option<Result<RecordSpan, BatchError>> {
        if self.failed {
            return None;
        }
        if self.remaining == 0 {
            if self.pos != self.buf.len() {
                self.failed = true;
                return Some(Err(BatchError::InvalidRecord(
                    "bytes remain after the batch's last record",
                )));
            }
            return None;
        }
        let r = self.next_span();
        match r {
            Ok(_) => self.remaining -= 1,
            Err(_) => self.failed = true,
        }
        Some(r)
    }

    fn next_span(&mut self) -> Result<RecordSpan, BatchError> {
        let mut cursor = Cursor {
            buf: &self.buf,
            pos: self.pos,
            end: self.buf.len(),
        };
        let len = cursor.varint("record length")?;
        let len = usize::try_from(len)
            .map_err(|_| BatchError::InvalidRecord("negative record length"))?;
        if len > cursor.end - cursor.pos {
            return Err(BatchError::Truncated {
                needed: len,
                available: cursor.end - cursor.pos,
            });
        }
        // Every field below is bounded by the record's own length, not only the buffer's.
        cursor.end = cursor.pos + len;
        let attributes = cursor.byte("record attributes")? as i8;
        let timestamp_delta = cursor.varlong("timestamp delta")?;
        let offset_delta = cursor.varint("offset delta")?;
        let key = cursor.nullable("key")?;
        let value = cursor.nullable("value")?;
        let header_count = cursor.varint("header count")?;
        let header_count = usize::try_from(header_count)
            .map_err(|_| BatchError::InvalidRecord("negative header count"))?;
        if header_count > (cursor.end - cursor.pos) / MIN_HEADER_LEN {
            return Err(BatchError::InvalidRecord(
                "header count exceeds the record's length",
            ));
        }
        let headers_start = cursor.pos;
        for _ in 0..header_count {
            let key = cursor
                .nullable("header key")?
                .ok_or(BatchError::InvalidRecord("null header key"))?;
            std::str::from_utf8(&cursor.buf[key])
                .map_err(|_| BatchError::InvalidRecord("header key is not UTF-8"))?;
            cursor.nullable("header value")?;
        }
        if cursor.pos != cursor.end {
            return Err(BatchError::InvalidRecord(
                "record length disagrees with its fields",
            ));
        }
        self.pos = cursor.end;
        let timestamp = match self.log_append_time {
            Some(t) => t,
            None => self
                .base_timestamp
                .checked_add(timestamp_delta)
                .ok_or(BatchError::InvalidRecord("timestamp delta overflows"))?,
        };
        let offset = self
            .base_offset
            .checked_add(i64::from(offset_delta))
            .ok_or(BatchError::InvalidRecord("offset delta overflows"))?;
        Ok(RecordSpan {
            offset,
            offset_delta,
            timestamp,
            attributes,
            key,
            value,
            header_count,
            headers: headers_start..cursor.end,
        })
    }

    /// The owned record of a span `next_span` has checked.
    fn to_record(&self, span: RecordSpan) -> Result<Record, BatchError> {
        let mut cursor = Cursor {
            buf: &self.buf,
            pos: span.headers.start,
            end: span.headers.end,
        };
        let mut headers = Vec::with_capacity(span.header_count);
        for _ in 0..span.header_count {
            let key = cursor
                .nullable("header key")?
                .ok_or(BatchError::InvalidRecord("null header key"))?;
            let key = String::from_utf8(self.buf[key].to_vec())
                .map_err(|_| BatchError::InvalidRecord("header key is not UTF-8"))?;
            let value = cursor.nullable("header value")?.map(|r| self.buf.slice(r));
            headers.push(Header { key, value });
        }
        Ok(Record {
            offset: span.offset,
            offset_delta: span.offset_delta,
            timestamp: span.timestamp,
            attributes: span.attributes,
            key: span.key.map(|r| self.buf.slice(r)),
            value: span.value.map(|r| self.buf.slice(r)),
            headers,
        })
    }
}

impl Iterator for RecordIter {
    type Item = Result<Record, BatchError>;

    fn next(&mut self) -> Option<Self::Item> {
        let span = match self.advance()? {
            Ok(span) => span,
            Err(e) => return Some(Err(e)),
        };
        let r = self.to_record(span);
        if r.is_err() {
            self.failed = true;
        }
        Some(r)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        if self.failed {
            return (0, Some(0));
        }
        // The header's count is an upper bound only as far as the bytes can back it.
        let backed = (self.buf.len() - self.pos) / MIN_RECORD_LEN;
        (0, Some(self.remaining.min(backed) + 1))
    }
}

/// A bounded reader over `buf[pos..end]`.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
    end: usize,
}

impl Cursor<'_> {
    #[inline]
    fn rest(&self) -> &[u8] {
        &self.buf[self.pos..self.end]
    }

    #[inline]
    fn byte(&mut self, what: &'static str) -> Result<u8, BatchError> {
        let b = *self.rest().first().ok_or(BatchError::InvalidRecord(what))?;
        self.pos += 1;
        Ok(b)
    }

    #[inline]
    fn varint(&mut self, what: &'static str) -> Result<i32, BatchError> {
        let (v, n) = varint::read_varint(self.rest()).map_err(|e| varint_error(e, what))?;
        self.pos += n;
        Ok(v)
    }

    #[inline]
    fn varlong(&mut self, what: &'static str) -> Result<i64, BatchError> {
        let (v, n) = varint::read_varlong(self.rest()).map_err(|e| varint_error(e, what))?;
        self.pos += n;
        Ok(v)
    }

    /// A varint length (-1 for null), then that many bytes: their range in `buf`.
    #[inline]
    fn nullable(&mut self, what: &'static str) -> Result<Option<Range<usize>>, BatchError> {
        let len = self.varint(what)?;
        if len == -1 {
            return Ok(None);
        }
        let len = usize::try_from(len).map_err(|_| BatchError::InvalidRecord(what))?;
        if len > self.end - self.pos {
            return Err(BatchError::InvalidRecord(what));
        }
        let range = self.pos..self.pos + len;
        self.pos += len;
        Ok(Some(range))
    }
}

fn varint_error(e: VarintError, what: &'static str) -> BatchError {
    match e {
        // The field names are static, so the detail goes in the variant choice only.
        VarintError::Truncated | VarintError::TooLong => BatchError::InvalidRecord(what),
    }
}

/// Encodes one record body onto `out`, length prefix included, and returns the number of
/// bytes written.
pub(crate) fn encode_record(
    out: &mut Vec<u8>,
    timestamp_delta: i64,
    offset_delta: i32,
    key: Option<&[u8]>,
    value: Option<&[u8]>,
    headers: &[Header],
) -> Result<usize, BatchError> {
    let body_len = record_body_len(timestamp_delta, offset_delta, key, value, headers)?;
    let body_len_i32 =
        i32::try_from(body_len).map_err(|_| BatchError::InvalidRecord("record too large"))?;
    let start = out.len();
    out.reserve(body_len + 5);
    varint::write_varint(out, body_len_i32);
    out.push(0); // attributes
    varint::write_varlong(out, timestamp_delta);
    varint::write_varint(out, offset_delta);
    write_nullable(out, key)?;
    write_nullable(out, value)?;
    let header_count =
        i32::try_from(headers.len()).map_err(|_| BatchError::InvalidRecord("too many headers"))?;
    varint::write_varint(out, header_count);
    for h in headers {
        write_nullable(out, Some(h.key.as_bytes()))?;
        write_nullable(out, h.value.as_deref())?;
    }
    debug_assert_eq!(
        out.len() - start,
        varint::varint_len(body_len_i32) + body_len
    );
    Ok(out.len() - start)
}

fn record_body_len(
    timestamp_delta: i64,
    offset_delta: i32,
    key: Option<&[u8]>,
    value: Option<&[u8]>,
    headers: &[Header],
) -> Result<usize, BatchError> {
    let mut len = 1 + varint::varlong_len(timestamp_delta) + varint::varint_len(offset_delta);
    len += nullable_len(key)? + nullable_len(value)?;
    let header_count =
        i32::try_from(headers.len()).map_err(|_| BatchError::InvalidRecord("too many headers"))?;
    len += varint::varint_len(header_count);
    for h in headers {
        len += nullable_len(Some(h.key.as_bytes()))? + nullable_len(h.value.as_deref())?;
    }
    Ok(len)
}

fn nullable_len(b: Option<&[u8]>) -> Result<usize, BatchError> {
    match b {
        None => Ok(varint::varint_len(-1)),
        Some(b) => {
            let len =
                i32::try_from(b.len()).map_err(|_| BatchError::InvalidRecord("field too large"))?;
            Ok(varint::varint_len(len) + b.len())
        }
    }
}

fn write_nullable(out: &mut Vec<u8>, b: Option<&[u8]>) -> Result<(), BatchError> {
    match b {
        None => varint::write_varint(out, -1),
        Some(b) => {
            let len =
                i32::try_from(b.len()).map_err(|_| BatchError::InvalidRecord("field too large"))?;
            varint::write_varint(out, len);
            out.extend_from_slice(b);
        }
    }
    Ok(())
}
