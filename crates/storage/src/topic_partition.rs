//! `TopicPartition` and the partition directory name `<topic>-<partition>`.

use std::fmt;
use std::str::FromStr;

use crate::StorageError;

/// A partition of a topic. Displays as Kafka names its log directory: `topic-partition`.
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

/// Parses a partition directory name. Topics may contain '-', so the partition is what
/// follows the LAST '-'; a topic cannot be empty.
impl FromStr for TopicPartition {
    type Err = StorageError;
    fn from_str(name: &str) -> Result<Self, Self::Err> {
        let bad = || StorageError::InvalidPartitionDir(name.to_owned());
        let (topic, partition) = name.rsplit_once('-').ok_or_else(bad)?;
        if topic.is_empty()
            || partition.is_empty()
            || !partition.bytes().all(|b| b.is_ascii_digit())
        {
            return Err(bad());
        }
        let partition = partition.parse::<i32>().map_err(|_| bad())?;
        Ok(Self {
            topic: topic.to_owned(),
            partition,
        })
    }
}

/// The directory that holds a partition's log: `<topic>-<partition>`.
pub fn partition_dir_name(topic: &str, partition: i32) -> String {
    format!("{topic}-{partition}")
}

/// The reverse of [`partition_dir_name`].
pub fn parse_partition_dir_name(name: &str) -> Result<TopicPartition, StorageError> {
    name.parse()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dir_names_round_trip_with_dashes_in_topics() {
        for (topic, p) in [
            ("orders", 0),
            ("my-topic-with-dashes", 17),
            ("-", 3),
            ("a--b", 0),
        ] {
            let name = partition_dir_name(topic, p);
            assert_eq!(
                parse_partition_dir_name(&name).unwrap(),
                TopicPartition::new(topic, p)
            );
            assert_eq!(TopicPartition::new(topic, p).to_string(), name);
        }
    }

    #[test]
    fn bad_dir_names_are_refused() {
        for name in ["orders", "-0", "orders-", "orders-x", "orders-99999999999"] {
            assert!(parse_partition_dir_name(name).is_err(), "{name}");
        }
    }
}
