//! Shared helpers of the codec tests: a small deterministic RNG, random values of every
//! generated struct (`random.rs`, generated), and the round-trip checks.
#![allow(dead_code, reason = "each test file uses a different part")]
#![allow(
    clippy::unwrap_used,
    clippy::panic,
    reason = "test support: a failed check is a test failure"
)]

use bytes::{Bytes, BytesMut};
use rill_protocol::primitives::{Decodable, Encodable, RawTaggedField, Uuid};
use rill_protocol::EncodeError;

#[macro_use]
pub mod random;

/// xorshift64*: reproducible from a seed that proptest chooses (and prints on failure).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x9e37_79b9_7f4a_7c15 | 1)
    }

    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// Mostly small numbers and edge values, which is where codec bugs live.
    pub fn edgy(&mut self) -> u64 {
        match self.below(4) {
            0 => self.below(4),
            1 => [0, 1, u64::MAX, 1 << 63, (1 << 31) - 1, 1 << 31, 127, 128].as_slice()
                [self.below(8) as usize],
            _ => self.next(),
        }
    }
}

pub trait RandomValue {
    fn random(rng: &mut Rng) -> Self;
}

macro_rules! random_int {
    ($($t:ty),*) => {$(
        impl RandomValue for $t {
            fn random(rng: &mut Rng) -> Self {
                rng.edgy() as $t
            }
        }
    )*};
}
random_int!(i8, i16, u16, i32, u32, i64);

impl RandomValue for bool {
    fn random(rng: &mut Rng) -> Self {
        rng.below(2) == 1
    }
}

impl RandomValue for f64 {
    fn random(rng: &mut Rng) -> Self {
        // Finite values only: NaN is not equal to itself.
        [0.0, -1.5, 1e300, f64::MIN_POSITIVE].as_slice()[rng.below(4) as usize]
            * (rng.below(1000) as f64)
    }
}

impl RandomValue for String {
    fn random(rng: &mut Rng) -> Self {
        let len = rng.below(6);
        (0..len)
            .map(|_| ['a', 'Z', '0', '-', 'é', '字', '🦀'][rng.below(7) as usize])
            .collect()
    }
}

impl RandomValue for Bytes {
    fn random(rng: &mut Rng) -> Self {
        let len = rng.below(8) as usize;
        Bytes::from((0..len).map(|_| rng.next() as u8).collect::<Vec<u8>>())
    }
}

impl RandomValue for Uuid {
    fn random(rng: &mut Rng) -> Self {
        if rng.below(4) == 0 {
            return Uuid::ZERO;
        }
        Uuid::from_u64_pair(rng.next(), rng.next())
    }
}

impl<T: RandomValue> RandomValue for Vec<T> {
    fn random(rng: &mut Rng) -> Self {
        let len = rng.below(4);
        (0..len).map(|_| T::random(rng)).collect()
    }
}

impl<T: RandomValue> RandomValue for Option<T> {
    fn random(rng: &mut Rng) -> Self {
        // Rarely null: null is an encode error in the versions where a field is not nullable.
        if rng.below(16) == 0 {
            None
        } else {
            Some(T::random(rng))
        }
    }
}

/// Unknown tagged fields with tags above every known tag, ascending, as a decoder yields them.
pub fn random_unknown_tagged_fields(rng: &mut Rng) -> Vec<RawTaggedField> {
    let n = if rng.below(4) == 0 { rng.below(3) } else { 0 };
    (0..n)
        .map(|i| RawTaggedField {
            tag: 1000 + i as u32 * 7,
            data: Bytes::random(rng),
        })
        .collect()
}

/// What one check found.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    RoundTripped,
    /// The random value had a null where this version has no null; nothing to check.
    NullNotAllowed,
}

/// Encodes `value` at `version`, checks `encoded_len`, decodes it back (consuming every byte),
/// re-encodes the result to the same bytes, and checks that every strict prefix fails to
/// decode (a truncated message is an error, never a wrong value or a panic).
pub fn check_round_trip<T>(value: &T, version: i16, prefixes: bool) -> Outcome
where
    T: Encodable + Decodable + PartialEq + std::fmt::Debug,
{
    let mut buf = BytesMut::new();
    match value.encode(&mut buf, version) {
        Ok(()) => {}
        Err(EncodeError::UnexpectedNull { .. }) => return Outcome::NullNotAllowed,
        Err(e) => panic!("encoding {value:?} at v{version}: {e}"),
    }
    assert_eq!(
        buf.len(),
        value.encoded_len(version),
        "encoded_len of {value:?} at v{version}"
    );
    let bytes = buf.freeze();
    let mut rest = bytes.clone();
    let decoded = T::decode(&mut rest, version)
        .unwrap_or_else(|e| panic!("decoding v{version} {bytes:?}: {e}"));
    assert!(
        rest.is_empty(),
        "{} bytes left after decoding v{version}",
        rest.len()
    );
    let mut again = BytesMut::new();
    decoded.encode(&mut again, version).unwrap();
    assert_eq!(
        again.freeze(),
        bytes,
        "re-encoding {decoded:?} at v{version}"
    );
    // Decoding is a projection: doing it twice changes nothing.
    let twice = T::decode(&mut bytes.clone(), version).unwrap();
    assert_eq!(twice, decoded);
    if prefixes {
        for cut in 0..bytes.len() {
            let mut prefix = bytes.slice(..cut);
            assert!(
                T::decode(&mut prefix, version).is_err(),
                "a {cut}-byte prefix of v{version} decoded"
            );
        }
    }
    Outcome::RoundTripped
}
