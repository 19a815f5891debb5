//! Reading a request header before the api key is known.
//!
//! The header's own version depends on the api key and version it carries (v2 for flexible
//! requests, v1 otherwise, v0 for `ControlledShutdown` v0), so [`decode_request_header`]
//! peeks at those first. A header with an api key we do not know still yields its
//! correlation id, so that the broker can answer or log before it closes the connection.

use bytes::Bytes;

use crate::error::DecodeError;
use crate::generated::request_header::RequestHeader;
use crate::generated::ApiKey;
use crate::primitives::Decodable;

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
