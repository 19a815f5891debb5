//! DescribeQuorum (KIP-595, KIP-836, KIP-853's `Nodes`): the metadata quorum's state for
//! `kafka-metadata-quorum.sh describe --status|--replication`, answered by any broker as
//! Kafka's brokers do (they forward it to the active controller). AddRaftVoter and
//! RemoveRaftVoter (KIP-853, `kafka-metadata-quorum.sh add-controller|remove-controller`)
//! change the voters through the quorum's leader (`MetadataQuorum::add_voter`): the new
//! voter's quorum address is its listener named as this node's controller listener. The
//! voters of Rill's quorum carry no directory id, so `VoterDirectoryId` is not checked.
//!
//! The only partition is `__cluster_metadata`-0; anything else asked for is
//! UNKNOWN_TOPIC_OR_PARTITION. A quorum with no reachable leader answers
//! NOT_LEADER_OR_FOLLOWER for the partition, which the Admin client retries.

use rill_metadata::VoterChangeError;
use rill_metadata::{QuorumDescription, ReplicaProgress};
use rill_protocol::generated::add_raft_voter_request::AddRaftVoterRequest;
use rill_protocol::generated::add_raft_voter_response::AddRaftVoterResponse;
use rill_protocol::generated::describe_quorum_request::DescribeQuorumRequest;
use rill_protocol::generated::describe_quorum_response::{
    DescribeQuorumResponse, Listener, Node, PartitionData, ReplicaState, TopicData,
};
use rill_protocol::generated::remove_raft_voter_request::RemoveRaftVoterRequest;
use rill_protocol::generated::remove_raft_voter_response::RemoveRaftVoterResponse;
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
                .current_voters()
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

    /// The error of a voter change that names another cluster (Kafka checks it first).
    fn other_cluster(&self, cluster_id: Option<&str>) -> Option<(ErrorCode, String)> {
        cluster_id.filter(|c| *c != self.cluster_id).map(|c| {
            (
                ErrorCode::INCONSISTENT_CLUSTER_ID,
                format!(
                    "the request is for cluster {c}, this is {}",
                    self.cluster_id
                ),
            )
        })
    }

    pub(crate) async fn handle_add_raft_voter(
        &self,
        request: AddRaftVoterRequest,
    ) -> AddRaftVoterResponse {
        let answer = |e: Result<(), (ErrorCode, String)>| match e {
            Ok(()) => AddRaftVoterResponse::default(),
            Err((code, message)) => AddRaftVoterResponse {
                error_code: code.code(),
                error_message: Some(message),
                ..Default::default()
            },
        };
        if let Some(e) = self.other_cluster(request.cluster_id.as_deref()) {
            return answer(Err(e));
        }
        let Ok(voter) = u64::try_from(request.voter_id) else {
            return answer(Err((
                ErrorCode::INVALID_REQUEST,
                "a negative voter id".into(),
            )));
        };
        let controller = self
            .config
            .controller_listener()
            .map(|l| l.name)
            .unwrap_or_else(|_| "CONTROLLER".into());
        let Some(listener) = request
            .listeners
            .iter()
            .find(|l| l.name.eq_ignore_ascii_case(&controller))
        else {
            return answer(Err((
                ErrorCode::INVALID_REQUEST,
                format!("the new voter has no {controller} listener, the quorum's"),
            )));
        };
        let addr = match tokio::net::lookup_host((listener.host.as_str(), listener.port))
            .await
            .ok()
            .and_then(|mut a| a.next())
        {
            Some(a) => a,
            None => {
                return answer(Err((
                    ErrorCode::INVALID_REQUEST,
                    format!("{}:{} does not resolve", listener.host, listener.port),
                )))
            }
        };
        let timeout =
            std::time::Duration::from_millis(u64::try_from(request.timeout_ms).unwrap_or(0)).clamp(
                std::time::Duration::from_secs(1),
                std::time::Duration::from_secs(60),
            );
        answer(
            self.quorum
                .add_voter(voter, addr, timeout)
                .await
                .map_err(voter_change_error),
        )
    }

    pub(crate) async fn handle_remove_raft_voter(
        &self,
        request: RemoveRaftVoterRequest,
    ) -> RemoveRaftVoterResponse {
        let answer = |e: Result<(), (ErrorCode, String)>| match e {
            Ok(()) => RemoveRaftVoterResponse::default(),
            Err((code, message)) => RemoveRaftVoterResponse {
                error_code: code.code(),
                error_message: Some(message),
                ..Default::default()
            },
        };
        if let Some(e) = self.other_cluster(request.cluster_id.as_deref()) {
            return answer(Err(e));
        }
        let Ok(voter) = u64::try_from(request.voter_id) else {
            return answer(Err((
                ErrorCode::VOTER_NOT_FOUND,
                "a negative voter id".into(),
            )));
        };
        answer(
            self.quorum
                .remove_voter(voter, VOTER_CHANGE_TIMEOUT)
                .await
                .map_err(voter_change_error),
        )
    }
}

/// How long RemoveRaftVoter waits for the quorum (it carries no timeout of its own).
const VOTER_CHANGE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

fn voter_change_error(e: VoterChangeError) -> (ErrorCode, String) {
    match e {
        VoterChangeError::NotController { .. } => (
            ErrorCode::REQUEST_TIMED_OUT,
            "no leader of the metadata quorum answered".into(),
        ),
        VoterChangeError::Refused {
            error_code,
            message,
        } => (ErrorCode::from_code(error_code), message),
    }
}
