//! Small value types shared by the producer, consumer and admin APIs.

use std::fmt;

/// A partition of a topic.
///
/// ```
/// use rill_client::TopicPartition;
/// let tp = TopicPartition::new("orders", 3);
/// assert_eq!(tp.to_string(), "orders-3");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TopicPartition {
    pub topic: String,
    pub partition: i32,
}

impl TopicPartition {
    pub fn new(topic: impl Into<String>, partition: i32) -> Self {
        Self {
            topic: topic.into(),
            partition,
        }
    }
}

impl fmt::Display for TopicPartition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.topic, self.partition)
    }
}

/// Kafka's `ListOffsets` timestamps with special meaning, and plain timestamps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffsetSpec {
    /// The log start offset (`-2`).
    Earliest,
    /// The log end offset / high watermark (`-1`).
    Latest,
    /// The first offset whose timestamp is at least this many ms since the epoch.
    Timestamp(i64),
}

impl OffsetSpec {
    pub(crate) fn as_timestamp(self) -> i64 {
        match self {
            OffsetSpec::Earliest => -2,
            OffsetSpec::Latest => -1,
            OffsetSpec::Timestamp(t) => t,
        }
    }
}
