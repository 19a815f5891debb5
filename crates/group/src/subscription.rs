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

/// The highest `ConsumerProtocolSubscription`/`ConsumerProtocolAssignment` version this
/// crate reads; a newer one is read as this one (new versions only append fields), as
/// Kafka's `ConsumerProtocol` does.
const CONSUMER_PROTOCOL_MAX_VERSION: i16 = 3;

/// A classic member's subscription as a consumer group (KIP-848's online migration)
/// needs it: the topics, the partitions the member says it owns (version 1+, by topic
/// name), its rack (version 3), and the version it speaks.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ClassicSubscription {
    pub version: i16,
    pub topics: Vec<String>,
    pub owned_partitions: Vec<(String, Vec<i32>)>,
    pub rack_id: Option<String>,
}

/// Reads a whole `ConsumerProtocolSubscription` with the generated decoder (which checks
/// every length against what remains).
pub fn decode_classic_subscription(metadata: &[u8]) -> Result<ClassicSubscription, GroupError> {
    use rill_protocol::generated::consumer_protocol_subscription::ConsumerProtocolSubscription;
    use rill_protocol::Decodable;
    let mut buf = bytes::Bytes::copy_from_slice(metadata);
    if buf.len() < 2 {
        return Err(GroupError::SubscriptionUnderflow {
            needed: 2,
            available: buf.len(),
        });
    }
    let version = i16::from_be_bytes([buf[0], buf[1]]);
    let _ = bytes::Buf::get_i16(&mut buf);
    if version < 0 {
        return Err(GroupError::SubscriptionInvalidLength {
            length: i32::from(version),
        });
    }
    let read_as = version.min(CONSUMER_PROTOCOL_MAX_VERSION);
    let s = ConsumerProtocolSubscription::decode(&mut buf, read_as).map_err(|_| {
        GroupError::SubscriptionUnderflow {
            needed: metadata.len() + 1,
            available: metadata.len(),
        }
    })?;
    Ok(ClassicSubscription {
        version: read_as,
        topics: s.topics,
        owned_partitions: s
            .owned_partitions
            .into_iter()
            .map(|tp| (tp.topic, tp.partitions))
            .collect(),
        rack_id: s.rack_id,
    })
}

/// A `ConsumerProtocolAssignment` at `version` (what SyncGroup hands a classic member):
/// the partitions by topic name, no user data.
pub fn encode_classic_assignment(version: i16, partitions: &[(String, Vec<i32>)]) -> bytes::Bytes {
    use rill_protocol::generated::consumer_protocol_assignment::{
        ConsumerProtocolAssignment, TopicPartition,
    };
    use rill_protocol::Encodable;
    let version = version.clamp(0, CONSUMER_PROTOCOL_MAX_VERSION);
    let body = ConsumerProtocolAssignment {
        assigned_partitions: partitions
            .iter()
            .map(|(topic, ps)| TopicPartition {
                topic: topic.clone(),
                partitions: ps.clone(),
            })
            .collect(),
        user_data: None,
    };
    let mut out = bytes::BytesMut::new();
    bytes::BufMut::put_i16(&mut out, version);
    // A body of plain fields always encodes; an error would be a bug of the codec.
    if body.encode(&mut out, version).is_err() {
        return bytes::Bytes::new();
    }
    out.freeze()
}

/// Reads a `ConsumerProtocolAssignment`: the partitions by topic name.
pub fn decode_classic_assignment(assignment: &[u8]) -> Result<Vec<(String, Vec<i32>)>, GroupError> {
    use rill_protocol::generated::consumer_protocol_assignment::ConsumerProtocolAssignment;
    use rill_protocol::Decodable;
    if assignment.is_empty() {
        return Ok(Vec::new());
    }
    let mut buf = bytes::Bytes::copy_from_slice(assignment);
    if buf.len() < 2 {
        return Err(GroupError::SubscriptionUnderflow {
            needed: 2,
            available: buf.len(),
        });
    }
    let version = bytes::Buf::get_i16(&mut buf).clamp(0, CONSUMER_PROTOCOL_MAX_VERSION);
    let a = ConsumerProtocolAssignment::decode(&mut buf, version).map_err(|_| {
        GroupError::SubscriptionUnderflow {
            needed: assignment.len() + 1,
            available: assignment.len(),
        }
    })?;
    Ok(a.assigned_partitions
        .into_iter()
        .map(|tp| (tp.topic, tp.partitions))
        .collect())
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
    fn classic_subscription_and_assignment_round_trip() {
        let s = decode_classic_subscription(&encode_subscription(&["a", "bb"])).unwrap();
        assert_eq!(
            (s.version, s.topics.clone()),
            (0, vec!["a".to_owned(), "bb".to_owned()])
        );
        assert!(s.owned_partitions.is_empty());
        let parts = vec![("a".to_owned(), vec![0, 2]), ("bb".to_owned(), vec![1])];
        for v in 0..=3 {
            let b = encode_classic_assignment(v, &parts);
            assert_eq!(decode_classic_assignment(&b).unwrap(), parts);
        }
        assert!(decode_classic_subscription(&[0, 0, 0x7f, 0xff, 0xff, 0xff]).is_err());
        assert!(decode_classic_assignment(&[0, 1, 0x7f]).is_err());
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
