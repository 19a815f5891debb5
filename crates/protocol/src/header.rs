//! Request and response headers, and whole frames built from a header and a body.
//!
//! A header's own version depends on the api key and version of the message it carries
//! (requests: v2 when flexible, v1 otherwise, v0 for `ControlledShutdown` v0; responses: v1
//! when flexible, v0 otherwise, always v0 for `ApiVersions`), so [`decode_request_header`]
//! peeks at the api key and version first. A header with an api key we do not know still
//! yields its correlation id, so that the broker can answer or log before it closes the
//! connection.
//!
//! A request whose api key is known but whose version is not (a newer client's
//! `ApiVersions`, typically) decodes its header with the flexible rule, and then
//! [`RequestBody::decode`] fails with `UnsupportedVersion`: Kafka answers that case for
//! `ApiVersions` with a v0 response carrying `UNSUPPORTED_VERSION` and its own version range.

use bytes::{Bytes, BytesMut};

use crate::error::{DecodeError, EncodeError};
use crate::frame::{begin_frame, end_frame};
use crate::generated::request_header::RequestHeader;
use crate::generated::response_header::ResponseHeader;
use crate::generated::{ApiKey, RequestBody, ResponseBody};
use crate::primitives::{Decodable, Encodable};

/// Decodes the request header at the front of `buf` (a frame body), advancing `buf` to the
/// request body. Returns the api key when it is one we know.
///
/// ```
/// use bytes::Bytes;
/// use rill_protocol::{decode_request_header, ApiKey};
///
/// // ApiVersions v0, correlation id 7, client id "c".
/// let mut buf = Bytes::from_static(&[0, 18, 0, 0, 0, 0, 0, 7, 0, 1, b'c']);
/// let (header, key) = decode_request_header(&mut buf).unwrap();
/// assert_eq!(key, Some(ApiKey::ApiVersions));
/// assert_eq!(header.correlation_id, 7);
/// assert_eq!(header.client_id.as_deref(), Some("c"));
/// assert!(buf.is_empty());
/// ```
pub fn decode_request_header(
    buf: &mut Bytes,
) -> Result<(RequestHeader, Option<ApiKey>), DecodeError> {
    if buf.len() < 8 {
        return Err(DecodeError::Underflow {
            needed: 8,
            available: buf.len(),
        });
    }
    let api_key = i16::from_be_bytes([buf[0], buf[1]]);
    let api_version = i16::from_be_bytes([buf[2], buf[3]]);
    match ApiKey::from_i16(api_key) {
        Some(key) => {
            let header = RequestHeader::decode(buf, key.request_header_version(api_version))?;
            Ok((header, Some(key)))
        }
        None => {
            // Unknown api: the layout after the correlation id is unknown too, so read a
            // v1 header if it parses and otherwise keep the fixed part alone.
            let mut attempt = buf.clone();
            let header = match RequestHeader::decode(&mut attempt, 1) {
                Ok(h) => {
                    *buf = attempt;
                    h
                }
                Err(_) => {
                    let fixed = RequestHeader::decode(&mut buf.clone(), 0)?;
                    RequestHeader {
                        client_id: None,
                        ..fixed
                    }
                }
            };
            Ok((header, None))
        }
    }
}

/// Appends a whole response frame to `buf`: size prefix, the response header of the right
/// version for `api_key` and `version`, then `body` at `version`. On error nothing is left
/// in `buf` from this call, so the caller can write an error response instead.
///
/// ```
/// use bytes::BytesMut;
/// use rill_protocol::generated::ApiVersionsResponse;
/// use rill_protocol::{encode_response_frame, ApiKey};
///
/// let mut buf = BytesMut::new();
/// encode_response_frame(&mut buf, ApiKey::ApiVersions, 3, 7, &ApiVersionsResponse::default()).unwrap();
/// assert_eq!(&buf[4..8], &[0, 0, 0, 7]); // header v0: the correlation id alone
/// ```
pub fn encode_response_frame<B: Encodable + ?Sized>(
    buf: &mut BytesMut,
    api_key: ApiKey,
    version: i16,
    correlation_id: i32,
    body: &B,
) -> Result<(), EncodeError> {
    let header = ResponseHeader {
        correlation_id,
        ..Default::default()
    };
    let header_version = api_key.response_header_version(version);
    write_frame(buf, |buf| {
        header.encode(buf, header_version)?;
        body.encode(buf, version)
    })
}

/// Appends a whole request frame to `buf`: size prefix, `header` (at the header version its
/// api key and version call for), then `body` at the header's api version.
///
/// ```
/// use bytes::BytesMut;
/// use rill_protocol::generated::{MetadataRequest, RequestHeader};
/// use rill_protocol::{decode_frame, decode_request_header, encode_request_frame, ApiKey, RequestBody};
///
/// let header = RequestHeader {
///     request_api_key: ApiKey::Metadata.as_i16(),
///     request_api_version: 12,
///     correlation_id: 1,
///     client_id: Some("me".into()),
///     ..Default::default()
/// };
/// let mut buf = BytesMut::new();
/// encode_request_frame(&mut buf, &header, &MetadataRequest { topics: None, ..Default::default() }).unwrap();
/// let mut frame = decode_frame(&mut buf, 1024).unwrap().unwrap().freeze();
/// let (read, key) = decode_request_header(&mut frame).unwrap();
/// assert_eq!(read, header);
/// assert!(matches!(RequestBody::decode(key.unwrap(), 12, &mut frame), Ok(RequestBody::Metadata(_))));
/// ```
pub fn encode_request_frame<B: Encodable + ?Sized>(
    buf: &mut BytesMut,
    header: &RequestHeader,
    body: &B,
) -> Result<(), EncodeError> {
    let version = header.request_api_version;
    let api_key = ApiKey::from_i16(header.request_api_key)
        .ok_or(EncodeError::UnknownApiKey(header.request_api_key))?;
    let header_version = api_key.request_header_version(version);
    write_frame(buf, |buf| {
        header.encode(buf, header_version)?;
        body.encode(buf, version)
    })
}

/// Decodes a response frame body (the frame prefix already removed) sent for a request of
/// `api_key` at `version`: its header, then its body.
pub fn decode_response(
    buf: &mut Bytes,
    api_key: ApiKey,
    version: i16,
) -> Result<(ResponseHeader, ResponseBody), DecodeError> {
    let header = ResponseHeader::decode(buf, api_key.response_header_version(version))?;
    let body = ResponseBody::decode(api_key, version, buf)?;
    Ok((header, body))
}

/// Decodes a request frame body: its header, then its body, for a known api key.
pub fn decode_request(buf: &mut Bytes) -> Result<(RequestHeader, RequestBody), DecodeError> {
    let (header, key) = decode_request_header(buf)?;
    let key = key.ok_or(DecodeError::UnknownApiKey(header.request_api_key))?;
    let body = RequestBody::decode(key, header.request_api_version, buf)?;
    Ok((header, body))
}

fn write_frame(
    buf: &mut BytesMut,
    write: impl FnOnce(&mut BytesMut) -> Result<(), EncodeError>,
) -> Result<(), EncodeError> {
    let start = begin_frame(buf);
    if let Err(e) = write(buf) {
        buf.truncate(start);
        return Err(e);
    }
    end_frame(buf, start);
    Ok(())
}
