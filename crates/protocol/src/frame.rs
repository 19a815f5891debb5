//! Length-prefixed frames with a size cap.
//!
//! Every Kafka request and response travels as a 4-byte big-endian size followed by that
//! many bytes. [`decode_frame`] takes frames off the front of a connection's read buffer,
//! refusing a negative or oversized prefix as soon as the four bytes are there, so that a
//! peer cannot make us buffer more than the cap. [`begin_frame`]/[`end_frame`] write a
//! frame in place: reserve the prefix, encode the header and body, then patch the size.

use bytes::{Buf, BufMut, BytesMut};

use crate::error::FrameError;

/// Bytes of the size prefix.
pub const FRAME_PREFIX_LEN: usize = 4;

/// Splits the first complete frame off `buf` and returns its body (without the prefix), or
/// `None` when more bytes are needed. The prefix is checked before anything is buffered:
/// a negative size or one above `max_frame_bytes` is an error (close the connection).
///
/// ```
/// use bytes::BytesMut;
/// use rill_protocol::frame::decode_frame;
///
/// let mut buf = BytesMut::from(&[0, 0, 0, 2, 0xab, 0xcd, 0][..]);
/// let frame = decode_frame(&mut buf, 1024).unwrap().unwrap();
/// assert_eq!(&frame[..], &[0xab, 0xcd]);
/// assert_eq!(&buf[..], &[0]); // the start of the next frame stays buffered
/// assert!(decode_frame(&mut BytesMut::from(&[0x7f, 0xff, 0xff, 0xff][..]), 1024).is_err());
/// ```
pub fn decode_frame(
    buf: &mut BytesMut,
    max_frame_bytes: usize,
) -> Result<Option<BytesMut>, FrameError> {
    let Some(prefix) = buf.get(..FRAME_PREFIX_LEN) else {
        return Ok(None);
    };
    let size = i32::from_be_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]);
    if size < 0 {
        return Err(FrameError::NegativeSize(size));
    }
    let size = size as usize;
    if size > max_frame_bytes {
        return Err(FrameError::TooLarge {
            size,
            max: max_frame_bytes,
        });
    }
    let total = FRAME_PREFIX_LEN + size;
    if buf.len() < total {
        // The size is within the cap, so reserving it now saves reallocations on the reads
        // that complete the frame.
        buf.reserve(total - buf.len());
        return Ok(None);
    }
    buf.advance(FRAME_PREFIX_LEN);
    Ok(Some(buf.split_to(size)))
}

/// Reserves a size prefix at the end of `buf` and returns where the frame starts; write the
/// frame's content after it, then call [`end_frame`] with the returned position.
///
/// ```
/// use bytes::{BufMut, BytesMut};
/// use rill_protocol::frame::{begin_frame, end_frame};
///
/// let mut buf = BytesMut::new();
/// let start = begin_frame(&mut buf);
/// buf.put_i32(7); // a correlation id, say
/// end_frame(&mut buf, start);
/// assert_eq!(&buf[..], &[0, 0, 0, 4, 0, 0, 0, 7]);
/// ```
pub fn begin_frame(buf: &mut BytesMut) -> usize {
    let start = buf.len();
    buf.put_i32(0);
    start
}

/// Patches the size prefix reserved by [`begin_frame`] at `start` with the number of bytes
/// written since.
pub fn end_frame(buf: &mut BytesMut, start: usize) {
    let body = buf.len().saturating_sub(start + FRAME_PREFIX_LEN);
    // Frames are bounded far below 2 GiB by the caller's limits; saturate rather than wrap
    // so that a bug shows up as an oversized frame the peer rejects.
    let size = i32::try_from(body).unwrap_or(i32::MAX);
    if let Some(prefix) = buf.get_mut(start..start + FRAME_PREFIX_LEN) {
        prefix.copy_from_slice(&size.to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partial_frames_wait() {
        let mut buf = BytesMut::from(&[0, 0][..]);
        assert_eq!(decode_frame(&mut buf, 10).unwrap(), None);
        buf.extend_from_slice(&[0, 3, 1, 2]);
        assert_eq!(decode_frame(&mut buf, 10).unwrap(), None);
        buf.extend_from_slice(&[3]);
        assert_eq!(
            &decode_frame(&mut buf, 10).unwrap().unwrap()[..],
            &[1, 2, 3]
        );
        assert!(buf.is_empty());
    }

    #[test]
    fn bad_prefixes_fail_before_buffering() {
        let mut buf = BytesMut::from(&[0xff, 0xff, 0xff, 0xfe][..]);
        assert_eq!(
            decode_frame(&mut buf, 10),
            Err(FrameError::NegativeSize(-2))
        );
        let mut buf = BytesMut::from(&[0, 0, 0, 11][..]);
        assert_eq!(
            decode_frame(&mut buf, 10),
            Err(FrameError::TooLarge { size: 11, max: 10 })
        );
    }

    #[test]
    fn empty_frame() {
        let mut buf = BytesMut::from(&[0, 0, 0, 0][..]);
        assert_eq!(decode_frame(&mut buf, 0).unwrap().map(|b| b.len()), Some(0));
    }
}
