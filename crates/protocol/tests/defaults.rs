//! Every top-level message encodes its `Default` at every valid version and decodes it back
//! to the same value, and versions outside the valid range are refused both ways.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "helpers of tests"
)]

#[macro_use]
mod support;

use bytes::{Bytes, BytesMut};
use rill_protocol::primitives::{Decodable, Encodable};
use rill_protocol::{DecodeError, EncodeError};

fn check<T>(name: &str, lo: i16, hi: i16)
where
    T: Default + Encodable + Decodable + PartialEq + std::fmt::Debug,
{
    let value = T::default();
    for v in lo..=hi {
        let mut buf = BytesMut::new();
        value
            .encode(&mut buf, v)
            .unwrap_or_else(|e| panic!("{name} v{v}: {e}"));
        assert_eq!(buf.len(), value.encoded_len(v), "{name} v{v}");
        let mut bytes = buf.freeze();
        let decoded = T::decode(&mut bytes, v).unwrap_or_else(|e| panic!("{name} v{v}: {e}"));
        assert!(bytes.is_empty(), "{name} v{v}: bytes left");
        assert_eq!(decoded, value, "{name} v{v}");
    }
    for v in [lo - 1, hi + 1] {
        let mut buf = BytesMut::new();
        assert!(
            matches!(
                value.encode(&mut buf, v),
                Err(EncodeError::UnsupportedVersion { .. })
            ),
            "{name} encoded at v{v}"
        );
        assert!(
            matches!(
                T::decode(&mut Bytes::from(vec![0u8; 64]), v),
                Err(DecodeError::UnsupportedVersion { .. })
            ),
            "{name} decoded at v{v}"
        );
    }
}

#[test]
fn every_message_decodes_its_default_at_every_version() {
    let mut count = 0;
    macro_rules! each {
        ($t:path, $lo:expr, $hi:expr) => {
            check::<$t>(stringify!($t), $lo, $hi);
            count += 1;
        };
    }
    for_each_message!(each);
    assert!(count > 240, "{count}");
}
