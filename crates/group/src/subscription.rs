//! A minimal reader of the consumer protocol's subscription (`ConsumerProtocolSubscription`,
//! versions 0-3, not flexible): only the topic list, which OffsetDelete needs to refuse
//! deleting the offsets of a topic the group consumes. Every length is checked against
//! the bytes that remain before anything is allocated.

use std::collections::BTreeSet;

use crate::error::GroupError;

/// The protocol type whose member metadata is a `ConsumerProtocolSubscription`.
pub const CONSUMER_PROTOCOL_TYPE: &str = "consumer";

struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], GroupError> {
        if self.buf.len() < n {
            return Err(GroupError::SubscriptionUnderflow {
                needed: n,
                available: self.buf.len(),
            });
        }
        let (head, tail) = self.buf.split_at(n);
        self.buf = tail;
        Ok(head)
    }

    fn i16(&mut self) -> Result<i16, GroupError> {
        let b = self.take(2)?;
        Ok(i16::from_be_bytes([b[0], b[1]]))
    }

    fn i32(&mut self) -> Result<i32, GroupError> {
        let b = self.take(4)?;
        Ok(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
}

/// Reads the subscribed topics of a consumer's JoinGroup metadata: an `i16` version, then
/// the topics as an `i32` count of `i16`-length strings. The fields after the topics
/// (user data, owned partitions, generation, rack) are not needed and not read, so any
/// version, including future ones that only append fields, is accepted.
pub fn decode_subscribed_topics(metadata: &[u8]) -> Result<BTreeSet<String>, GroupError> {
    let mut r = Reader { buf: metadata };
    let _version = r.i16()?;
    let count = r.i32()?;
    if count < 0 {
        return Err(GroupError::SubscriptionInvalidLength { length: count });
    }
    let mut topics = BTreeSet::new();
    for _ in 0..count {
        // No pre-allocation from `count`: each topic consumes at least two bytes, so the
        // loop ends with an underflow error long before memory matters.
        let len = r.i16()?;
        if len < 0 {
            return Err(GroupError::SubscriptionInvalidLength {
                length: i32::from(len),
            });
        }
        let raw = r.take(len as usize)?;
        let name = std::str::from_utf8(raw).map_err(|_| GroupError::SubscriptionNotUtf8)?;
        topics.insert(name.to_owned());
    }
    Ok(topics)
}

/// Encodes a version-0 subscription with no user data; for tests and tools.
pub fn encode_subscription(topics: &[&str]) -> bytes::Bytes {
    let mut out = Vec::new();
    out.extend_from_slice(&0i16.to_be_bytes());
    out.extend_from_slice(&(topics.len() as i32).to_be_bytes());
    for t in topics {
        out.extend_from_slice(&(t.len() as i16).to_be_bytes());
        out.extend_from_slice(t.as_bytes());
    }
    // user_data: null
    out.extend_from_slice(&(-1i32).to_be_bytes());
    bytes::Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_topics() {
        let b = encode_subscription(&["a", "bb"]);
        let t = decode_subscribed_topics(&b).unwrap();
        assert_eq!(t.into_iter().collect::<Vec<_>>(), vec!["a", "bb"]);
    }

    #[test]
    fn hostile_lengths_are_errors() {
        // version 0, count 0x7fffffff and nothing else
        let b = [0u8, 0, 0x7f, 0xff, 0xff, 0xff];
        assert!(matches!(
            decode_subscribed_topics(&b),
            Err(GroupError::SubscriptionUnderflow { .. })
        ));
        let b = [0u8, 0, 0xff, 0xff, 0xff, 0xff];
        assert!(decode_subscribed_topics(&b).is_err());
        assert!(decode_subscribed_topics(&[0]).is_err());
        let b = [0u8, 0, 0, 0, 0, 1, 0xff, 0xff];
        assert!(decode_subscribed_topics(&b).is_err());
    }
}
