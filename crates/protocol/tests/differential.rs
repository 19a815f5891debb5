//! Differential tests against an independent implementation of the same specs (the
//! `kafka-protocol` crate): our encoding of random messages must decode there, consuming
//! every byte, and re-encode there to the very same bytes; and its encoding of its defaults
//! must do the same here. Only versions both sides support are compared; the ZooKeeper-era
//! inter-broker apis (LeaderAndIsr, UpdateMetadata, StopReplica, ControlledShutdown) and
//! ListClientMetricsResources are not in kafka-protocol 0.18.
//!
//! This oracle checks layouts (which field is present, compact or not, nullable how, tagged
//! with which tag), not meanings: two fields of one type swapped would pass here, which the
//! golden tests and the generator's spec-order emission cover.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "helpers of tests"
)]

#[macro_use]
mod support;

use bytes::BytesMut;
use rill_protocol::primitives::{Decodable, Encodable};
use rill_protocol::EncodeError;
use support::{RandomValue, Rng};

const SEEDS: u64 = 12;

/// Ours -> theirs -> bytes, and theirs -> ours -> bytes. Returns how many comparisons ran;
/// mismatches go to `failures`.
fn compare<O, K>(name: &str, failures: &mut Vec<String>) -> usize
where
    O: RandomValue + Encodable + Decodable + std::fmt::Debug,
    K: kafka_protocol::protocol::Decodable
        + kafka_protocol::protocol::Encodable
        + kafka_protocol::protocol::Message
        + Default
        + std::fmt::Debug,
{
    let (lo, hi) = (K::VERSIONS.min, K::VERSIONS.max);
    let mut compared = 0;
    for version in lo..=hi {
        // Theirs -> ours.
        let theirs = K::default();
        let mut buf = BytesMut::new();
        if theirs.encode(&mut buf, version).is_ok() {
            let bytes = buf.freeze();
            match O::decode(&mut bytes.clone(), version) {
                Ok(ours) => {
                    let mut again = BytesMut::new();
                    ours.encode(&mut again, version).unwrap();
                    assert_eq!(
                        again.freeze(),
                        bytes,
                        "{name} v{version}: their default re-encoded by us"
                    );
                    compared += 1;
                }
                Err(rill_protocol::DecodeError::UnsupportedVersion { .. }) => continue,
                Err(e) => {
                    panic!("{name} v{version}: we cannot decode their default {bytes:?}: {e}")
                }
            }
        }
        // Ours -> theirs.
        for seed in 0..SEEDS {
            let ours = O::random(&mut Rng::new(seed * 104_729 + 3));
            let mut buf = BytesMut::new();
            match ours.encode(&mut buf, version) {
                Ok(()) => {}
                Err(
                    EncodeError::UnexpectedNull { .. } | EncodeError::UnsupportedVersion { .. },
                ) => continue,
                Err(e) => panic!("{name} v{version}: {e}"),
            }
            let bytes = buf.freeze();
            let mut rest = bytes.clone();
            let theirs = match K::decode(&mut rest, version) {
                Ok(t) => t,
                Err(e) => {
                    failures.push(format!(
                        "{name} v{version}: they cannot decode {ours:?} ({bytes:?}): {e}"
                    ));
                    break;
                }
            };
            if !rest.is_empty() {
                failures.push(format!(
                    "{name} v{version}: they left {} bytes of {ours:?}",
                    rest.len()
                ));
                break;
            }
            let mut again = BytesMut::new();
            theirs.encode(&mut again, version).unwrap();
            if again.freeze() != bytes {
                failures.push(format!(
                    "{name} v{version}: {ours:?} re-encoded by them as {theirs:?}"
                ));
                break;
            }
            compared += 1;
        }
    }
    compared
}

#[test]
fn every_message_matches_kafka_protocol() {
    let mut compared = 0;
    let mut failures = Vec::new();
    macro_rules! diff {
        ($name:ident) => {
            compared += compare::<rill_protocol::generated::$name, kafka_protocol::messages::$name>(
                stringify!($name),
                &mut failures,
            );
        };
    }
    diff!(AddOffsetsToTxnRequest);
    diff!(AddOffsetsToTxnResponse);
    diff!(AddPartitionsToTxnRequest);
    diff!(AddPartitionsToTxnResponse);
    diff!(AddRaftVoterRequest);
    diff!(AddRaftVoterResponse);
    diff!(AllocateProducerIdsRequest);
    diff!(AllocateProducerIdsResponse);
    diff!(AlterClientQuotasRequest);
    diff!(AlterClientQuotasResponse);
    diff!(AlterConfigsRequest);
    diff!(AlterConfigsResponse);
    diff!(AlterPartitionReassignmentsRequest);
    diff!(AlterPartitionReassignmentsResponse);
    diff!(AlterPartitionRequest);
    diff!(AlterPartitionResponse);
    diff!(AlterReplicaLogDirsRequest);
    diff!(AlterReplicaLogDirsResponse);
    diff!(AlterShareGroupOffsetsRequest);
    diff!(AlterShareGroupOffsetsResponse);
    diff!(AlterUserScramCredentialsRequest);
    diff!(AlterUserScramCredentialsResponse);
    diff!(ApiVersionsRequest);
    diff!(ApiVersionsResponse);
    diff!(AssignReplicasToDirsRequest);
    diff!(AssignReplicasToDirsResponse);
    diff!(BeginQuorumEpochRequest);
    diff!(BeginQuorumEpochResponse);
    diff!(BrokerHeartbeatRequest);
    diff!(BrokerHeartbeatResponse);
    diff!(BrokerRegistrationRequest);
    diff!(BrokerRegistrationResponse);
    diff!(ConsumerGroupDescribeRequest);
    diff!(ConsumerGroupDescribeResponse);
    diff!(ConsumerGroupHeartbeatRequest);
    diff!(ConsumerGroupHeartbeatResponse);
    diff!(ControllerRegistrationRequest);
    diff!(ControllerRegistrationResponse);
    diff!(CreateAclsRequest);
    diff!(CreateAclsResponse);
    diff!(CreateDelegationTokenRequest);
    diff!(CreateDelegationTokenResponse);
    diff!(CreatePartitionsRequest);
    diff!(CreatePartitionsResponse);
    diff!(CreateTopicsRequest);
    diff!(CreateTopicsResponse);
    diff!(DeleteAclsRequest);
    diff!(DeleteAclsResponse);
    diff!(DeleteGroupsRequest);
    diff!(DeleteGroupsResponse);
    diff!(DeleteRecordsRequest);
    diff!(DeleteRecordsResponse);
    diff!(DeleteShareGroupOffsetsRequest);
    diff!(DeleteShareGroupOffsetsResponse);
    diff!(DeleteShareGroupStateRequest);
    diff!(DeleteShareGroupStateResponse);
    diff!(DeleteTopicsRequest);
    diff!(DeleteTopicsResponse);
    diff!(DescribeAclsRequest);
    diff!(DescribeAclsResponse);
    diff!(DescribeClientQuotasRequest);
    diff!(DescribeClientQuotasResponse);
    diff!(DescribeClusterRequest);
    diff!(DescribeClusterResponse);
    diff!(DescribeConfigsRequest);
    diff!(DescribeConfigsResponse);
    diff!(DescribeDelegationTokenRequest);
    diff!(DescribeDelegationTokenResponse);
    diff!(DescribeGroupsRequest);
    diff!(DescribeGroupsResponse);
    diff!(DescribeLogDirsRequest);
    diff!(DescribeLogDirsResponse);
    diff!(DescribeProducersRequest);
    diff!(DescribeProducersResponse);
    diff!(DescribeQuorumRequest);
    diff!(DescribeQuorumResponse);
    diff!(DescribeShareGroupOffsetsRequest);
    diff!(DescribeShareGroupOffsetsResponse);
    diff!(DescribeTopicPartitionsRequest);
    diff!(DescribeTopicPartitionsResponse);
    diff!(DescribeTransactionsRequest);
    diff!(DescribeTransactionsResponse);
    diff!(DescribeUserScramCredentialsRequest);
    diff!(DescribeUserScramCredentialsResponse);
    diff!(ElectLeadersRequest);
    diff!(ElectLeadersResponse);
    diff!(EndQuorumEpochRequest);
    diff!(EndQuorumEpochResponse);
    diff!(EndTxnRequest);
    diff!(EndTxnResponse);
    diff!(EnvelopeRequest);
    diff!(EnvelopeResponse);
    diff!(ExpireDelegationTokenRequest);
    diff!(ExpireDelegationTokenResponse);
    diff!(FetchRequest);
    diff!(FetchResponse);
    diff!(FetchSnapshotRequest);
    diff!(FetchSnapshotResponse);
    diff!(FindCoordinatorRequest);
    diff!(FindCoordinatorResponse);
    diff!(GetTelemetrySubscriptionsRequest);
    diff!(GetTelemetrySubscriptionsResponse);
    diff!(HeartbeatRequest);
    diff!(HeartbeatResponse);
    diff!(IncrementalAlterConfigsRequest);
    diff!(IncrementalAlterConfigsResponse);
    diff!(InitProducerIdRequest);
    diff!(InitProducerIdResponse);
    diff!(InitializeShareGroupStateRequest);
    diff!(InitializeShareGroupStateResponse);
    diff!(JoinGroupRequest);
    diff!(JoinGroupResponse);
    diff!(LeaveGroupRequest);
    diff!(LeaveGroupResponse);
    diff!(ListGroupsRequest);
    diff!(ListGroupsResponse);
    diff!(ListOffsetsRequest);
    diff!(ListOffsetsResponse);
    diff!(ListPartitionReassignmentsRequest);
    diff!(ListPartitionReassignmentsResponse);
    diff!(ListTransactionsRequest);
    diff!(ListTransactionsResponse);
    diff!(MetadataRequest);
    diff!(MetadataResponse);
    diff!(OffsetCommitRequest);
    diff!(OffsetCommitResponse);
    diff!(OffsetDeleteRequest);
    diff!(OffsetDeleteResponse);
    diff!(OffsetFetchRequest);
    diff!(OffsetFetchResponse);
    diff!(OffsetForLeaderEpochRequest);
    diff!(OffsetForLeaderEpochResponse);
    diff!(ProduceRequest);
    diff!(ProduceResponse);
    diff!(PushTelemetryRequest);
    diff!(PushTelemetryResponse);
    diff!(ReadShareGroupStateRequest);
    diff!(ReadShareGroupStateResponse);
    diff!(ReadShareGroupStateSummaryRequest);
    diff!(ReadShareGroupStateSummaryResponse);
    diff!(RemoveRaftVoterRequest);
    diff!(RemoveRaftVoterResponse);
    diff!(RenewDelegationTokenRequest);
    diff!(RenewDelegationTokenResponse);
    diff!(RequestHeader);
    diff!(ResponseHeader);
    diff!(SaslAuthenticateRequest);
    diff!(SaslAuthenticateResponse);
    diff!(SaslHandshakeRequest);
    diff!(SaslHandshakeResponse);
    diff!(ShareAcknowledgeRequest);
    diff!(ShareAcknowledgeResponse);
    diff!(ShareFetchRequest);
    diff!(ShareFetchResponse);
    diff!(ShareGroupDescribeRequest);
    diff!(ShareGroupDescribeResponse);
    diff!(ShareGroupHeartbeatRequest);
    diff!(ShareGroupHeartbeatResponse);
    diff!(SyncGroupRequest);
    diff!(SyncGroupResponse);
    diff!(TxnOffsetCommitRequest);
    diff!(TxnOffsetCommitResponse);
    diff!(UnregisterBrokerRequest);
    diff!(UnregisterBrokerResponse);
    diff!(UpdateFeaturesRequest);
    diff!(UpdateFeaturesResponse);
    diff!(UpdateRaftVoterRequest);
    diff!(UpdateRaftVoterResponse);
    diff!(VoteRequest);
    diff!(VoteResponse);
    diff!(WriteShareGroupStateRequest);
    diff!(WriteShareGroupStateResponse);
    diff!(WriteTxnMarkersRequest);
    diff!(WriteTxnMarkersResponse);
    for f in &failures {
        eprintln!("{f}\n");
    }
    assert!(failures.is_empty(), "{} mismatches", failures.len());
    assert!(compared > 5000, "only {compared} comparisons ran");
}
