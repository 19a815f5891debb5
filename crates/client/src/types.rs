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

/// `partitions` grouped by topic, as requests list them: each topic once, in the order it
/// first comes, with its partitions in the order they come.
pub(crate) fn by_topic(partitions: &[TopicPartition]) -> Vec<(String, Vec<i32>)> {
    let mut out: Vec<(String, Vec<i32>)> = Vec::new();
    for tp in partitions {
        match out.iter_mut().find(|(name, _)| *name == tp.topic) {
            Some((_, ps)) => ps.push(tp.partition),
            None => out.push((tp.topic.clone(), vec![tp.partition])),
        }
    }
    out
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

/// Which leader an election picks (Kafka's `ElectionType`).
///
/// ```
/// use rill_client::ElectionType;
/// let t: ElectionType = "unclean".parse().unwrap();
/// assert_eq!(t, ElectionType::Unclean);
/// assert_eq!(ElectionType::Preferred.to_string(), "preferred");
/// assert!("random".parse::<ElectionType>().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ElectionType {
    /// Move leadership back to the first replica, if it is alive and in the ISR (`0`).
    #[default]
    Preferred,
    /// Give a partition with no leader one chosen among live replicas outside the ISR,
    /// accepting that records only the old ISR had are lost (`1`).
    Unclean,
}

impl ElectionType {
    pub(crate) fn wire(self) -> i8 {
        match self {
            ElectionType::Preferred => 0,
            ElectionType::Unclean => 1,
        }
    }
}

impl fmt::Display for ElectionType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ElectionType::Preferred => "preferred",
            ElectionType::Unclean => "unclean",
        })
    }
}

impl std::str::FromStr for ElectionType {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "preferred" => Ok(ElectionType::Preferred),
            "unclean" => Ok(ElectionType::Unclean),
            other => Err(format!(
                "unknown election type {other:?} (expected preferred or unclean)"
            )),
        }
    }
}

/// A partition reassignment in progress, as ListPartitionReassignments shows it (Kafka's
/// `PartitionReassignment`).
///
/// ```
/// use rill_client::PartitionReassignment;
/// // Moving from [1, 2] to [3, 1]: 3 is being added, 2 removed.
/// let r = PartitionReassignment {
///     replicas: vec![3, 1, 2],
///     adding_replicas: vec![3],
///     removing_replicas: vec![2],
/// };
/// assert_eq!(r.target_replicas(), [3, 1]);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionReassignment {
    /// Every current replica: the target ones first, then those being removed.
    pub replicas: Vec<i32>,
    /// Replicas being added (still catching up to join the ISR).
    pub adding_replicas: Vec<i32>,
    /// Replicas that leave once every added one is in the ISR.
    pub removing_replicas: Vec<i32>,
}

impl PartitionReassignment {
    /// The replicas the partition will have once the reassignment completes.
    pub fn target_replicas(&self) -> Vec<i32> {
        self.replicas
            .iter()
            .copied()
            .filter(|r| !self.removing_replicas.contains(r))
            .collect()
    }
}
