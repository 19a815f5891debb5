//! DescribeTopicPartitions (KIP-966): topics and their partitions a page at a time, which
//! Kafka 4's `kafka-topics.sh --describe` and `Admin.describeTopics` prefer to Metadata.
//!
//! Kafka's paging: topics in name order (every topic when none is named), at most
//! `min(ResponsePartitionLimit, max.request.partition.size.limit)` partitions per answer
//! (at least one), starting at the cursor's topic and partition; when a topic is cut
//! short, or the limit is used up with topics left, `NextCursor` names where the next
//! request starts. A cursor naming a topic the request does not list is INVALID_REQUEST;
//! a named topic that does not exist is UNKNOWN_TOPIC_OR_PARTITION with no partitions.
//! Partitions carry what Metadata carries (the same leader rule under a lost lease);
//! Rill has no eligible leader replicas (KIP-966's ELR), so those lists are empty.

use rill_protocol::generated::describe_topic_partitions_request::DescribeTopicPartitionsRequest;
use rill_protocol::generated::describe_topic_partitions_response::{
    Cursor, DescribeTopicPartitionsResponse, DescribeTopicPartitionsResponsePartition,
    DescribeTopicPartitionsResponseTopic,
};
use rill_protocol::ErrorCode;

use crate::server::Broker;

/// Kafka's default `max.request.partition.size.limit`.
const DEFAULT_PARTITION_LIMIT: i32 = 2000;

impl Broker {
    pub(crate) fn handle_describe_topic_partitions(
        &self,
        request: DescribeTopicPartitionsRequest,
    ) -> DescribeTopicPartitionsResponse {
        let image = self.image();
        let mut names: Vec<String> = if request.topics.is_empty() {
            image.topics_by_name.keys().cloned().collect()
        } else {
            request.topics.iter().map(|t| t.name.clone()).collect()
        };
        names.sort();
        names.dedup();
        let broker_limit = self
            .config
            .get("max.request.partition.size.limit")
            .and_then(|v| v.trim().parse::<i32>().ok())
            .unwrap_or(DEFAULT_PARTITION_LIMIT);
        let mut remaining = request.response_partition_limit.min(broker_limit).max(1) as usize;
        let (start_topic, mut start_partition) = match &request.cursor {
            Some(c) => {
                if !request.topics.is_empty() && !names.contains(&c.topic_name) {
                    return DescribeTopicPartitionsResponse {
                        topics: vec![DescribeTopicPartitionsResponseTopic {
                            error_code: ErrorCode::INVALID_REQUEST.code(),
                            name: Some(c.topic_name.clone()),
                            topic_authorized_operations: i32::MIN,
                            ..Default::default()
                        }],
                        ..Default::default()
                    };
                }
                (Some(c.topic_name.clone()), c.partition_index.max(0))
            }
            None => (None, 0),
        };
        let mut names = names
            .into_iter()
            .filter(|n| start_topic.as_ref().is_none_or(|s| n >= s))
            .peekable();
        let mut topics = Vec::new();
        let mut next_cursor = None;
        while remaining > 0 {
            let Some(name) = names.next() else { break };
            // The cursor's partition applies to the cursor's topic only (which may
            // have been deleted since the previous page).
            let from = if start_topic.as_ref() == Some(&name) {
                std::mem::take(&mut start_partition)
            } else {
                0
            };
            let Some(topic) = image.topic(&name) else {
                topics.push(DescribeTopicPartitionsResponseTopic {
                    error_code: ErrorCode::UNKNOWN_TOPIC_OR_PARTITION.code(),
                    name: Some(name),
                    topic_authorized_operations: i32::MIN,
                    ..Default::default()
                });
                continue;
            };
            let described = self.metadata_topic(&image, topic);
            let mut partitions: Vec<_> = described
                .partitions
                .into_iter()
                .filter(|p| p.partition_index >= from)
                .collect();
            if partitions.len() > remaining {
                next_cursor = Some(Cursor {
                    topic_name: name.clone(),
                    partition_index: partitions[remaining].partition_index,
                    ..Default::default()
                });
                partitions.truncate(remaining);
            }
            remaining -= partitions.len();
            topics.push(DescribeTopicPartitionsResponseTopic {
                error_code: ErrorCode::NONE.code(),
                name: Some(name),
                topic_id: described.topic_id,
                is_internal: described.is_internal,
                partitions: partitions
                    .into_iter()
                    .map(|p| DescribeTopicPartitionsResponsePartition {
                        error_code: p.error_code,
                        partition_index: p.partition_index,
                        leader_id: p.leader_id,
                        leader_epoch: p.leader_epoch,
                        replica_nodes: p.replica_nodes,
                        isr_nodes: p.isr_nodes,
                        eligible_leader_replicas: Some(Vec::new()),
                        last_known_elr: Some(Vec::new()),
                        offline_replicas: p.offline_replicas,
                        ..Default::default()
                    })
                    .collect(),
                topic_authorized_operations: i32::MIN,
                ..Default::default()
            });
            if next_cursor.is_some() {
                break;
            }
        }
        if next_cursor.is_none() && remaining == 0 {
            next_cursor = names.next().map(|topic_name| Cursor {
                topic_name,
                partition_index: 0,
                ..Default::default()
            });
        }
        DescribeTopicPartitionsResponse {
            topics,
            next_cursor,
            ..Default::default()
        }
    }
}
