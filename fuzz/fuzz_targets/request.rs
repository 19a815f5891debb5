//! Request headers and every request and response body, at any api key and version.
//!
//! Input: `[api index: u8][version: i16][flags: u8][bytes…]`. The api index picks from
//! `ApiKey::ALL` (so every body is reached, not only the keys a random i16 hits); the
//! version is taken as is, so unknown versions are exercised too. The bytes go through
//! `RequestBody::decode`, `ResponseBody::decode`, and, as a whole frame body, through
//! `decode_request_header` + `decode_request`.
//!
//! Besides "no panic", a body that decodes must re-encode, and encoding what that decodes
//! to must give the same bytes: the codec is symmetric on everything it accepts.
#![no_main]

use bytes::{Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use rill_protocol::{decode_request, decode_request_header, ApiKey, RequestBody, ResponseBody};

fuzz_target!(|data: &[u8]| {
    if data.len() < 4 {
        return;
    }
    let api = ApiKey::ALL[usize::from(data[0]) % ApiKey::ALL.len()];
    let version = i16::from_be_bytes([data[1], data[2]]);
    let flags = data[3];
    let input = Bytes::copy_from_slice(&data[4..]);

    let mut buf = input.clone();
    if let Ok(request) = RequestBody::decode(api, version, &mut buf) {
        let mut once = BytesMut::new();
        if request.encode(&mut once, version).is_ok() {
            assert_eq!(
                once.len(),
                request.encoded_len(version),
                "{api:?} v{version} length"
            );
            let again = RequestBody::decode(api, version, &mut once.clone().freeze())
                .unwrap_or_else(|e| panic!("{api:?} v{version}: own encoding refused: {e}"));
            let mut twice = BytesMut::new();
            again.encode(&mut twice, version).expect("re-encode");
            assert_eq!(once, twice, "{api:?} v{version} not symmetric");
        }
    }

    if flags & 1 == 1 {
        let _ = ResponseBody::decode(api, version, &mut input.clone());
    }

    // The same bytes as a whole frame body: header first (api key and version from it).
    let mut frame = input.clone();
    let _ = decode_request_header(&mut frame);
    let _ = decode_request(&mut input.clone());
});
