//! DescribeQuorum (KIP-595, KIP-836, KIP-853's `Nodes`): the metadata quorum's state for
//! `kafka-metadata-quorum.sh describe --status|--replication`, answered by any broker as
//! Kafka's brokers do (they forward it to the active controller).
//!
//! The only partition is `__cluster_metadata`-0; anything else asked for is
//! UNKNOWN_TOPIC_OR_PARTITION. A quorum with no reachable leader answers
//! NOT_LEADER_OR_FOLLOWER for the partition, which the Admin client retries.

use rill_metadata::{QuorumDescription, ReplicaProgress};
use rill_protocol::generated::describe_quorum_request::DescribeQuorumRequest;
use rill_protocol::generated::describe_quorum_response::{
    DescribeQuorumResponse, Listener, Node, PartitionData, ReplicaState, TopicData,
};
use rill_protocol::ErrorCode;

use crate::server::Broker;

/// The metadata log's topic name, as Kafka names it.
const METADATA_TOPIC: &str = "__cluster_metadata";
/// How long the leader is looked for; the Admin client retries NOT_LEADER_OR_FOLLOWER.
const DESCRIBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

fn replica(p: &ReplicaProgress) -> ReplicaState {
    ReplicaState {
        replica_id: p.replica_id,
        log_end_offset: p.log_end_offset,
        last_fetch_timestamp: p.last_fetch_timestamp,
        last_caught_up_timestamp: p.last_caught_up_timestamp,
        ..Default::default()
    }
}

impl Broker {
    pub(crate) async fn handle_describe_quorum(
        &self,
        request: DescribeQuorumRequest,
    ) -> DescribeQuorumResponse {
        let asks_metadata = matches!(
            request.topics.as_slice(),
            [t] if t.topic_name == METADATA_TOPIC
                && matches!(t.partitions.as_slice(), [p] if p.partition_index == 0)
        );
        let partition = |error: ErrorCode, d: Option<&QuorumDescription>| PartitionData {
            partition_index: 0,
            error_code: error.code(),
            error_message: (error != ErrorCode::NONE).then(|| error.name().to_string()),
            leader_id: d.map_or(-1, |d| d.leader_id),
            leader_epoch: d.map_or(-1, |d| d.leader_epoch),
            high_watermark: d.map_or(-1, |d| d.high_watermark),
            current_voters: d.map_or_else(Vec::new, |d| d.voters.iter().map(replica).collect()),
            observers: d.map_or_else(Vec::new, |d| d.observers.iter().map(replica).collect()),
            ..Default::default()
        };
        let answer = |p: PartitionData| DescribeQuorumResponse {
            topics: vec![TopicData {
                topic_name: METADATA_TOPIC.into(),
                partitions: vec![p],
                ..Default::default()
            }],
            nodes: self
                .quorum
                .voter_addrs()
                .iter()
                .map(|(id, addr)| Node {
                    node_id: i32::try_from(*id).unwrap_or(-1),
                    listeners: vec![Listener {
                        name: "CONTROLLER".into(),
                        host: addr.ip().to_string(),
                        port: addr.port(),
                        ..Default::default()
                    }],
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        if !asks_metadata {
            return answer(partition(ErrorCode::UNKNOWN_TOPIC_OR_PARTITION, None));
        }
        match self.quorum.describe(DESCRIBE_TIMEOUT).await {
            Ok(d) => answer(partition(ErrorCode::NONE, Some(&d))),
            Err(e) => {
                tracing::debug!(error = %e, "DescribeQuorum: no leader answered");
                answer(partition(ErrorCode::NOT_LEADER_OR_FOLLOWER, None))
            }
        }
    }
}
