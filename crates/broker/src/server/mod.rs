//! The server (Kafka's `KafkaApis` and `RequestChannel`): the state every connection
//! shares ([`Broker`]), request dispatch, the table of supported API versions, the
//! handlers (one module per group of APIs) and the mapping of errors to Kafka's codes.
//! The network layer hands it requests through [`RequestHandler`]; the handlers call into
//! replication and the coordinators below through their handles, and the metadata
//! publisher above acts on it, never the other way round.
//!
//! [`Broker::handle`] turns one decoded request header and body into the bytes of one
//! response frame (or none, for `acks=0` produce), or a reason to close the connection.
//! Versions outside [`SUPPORTED_APIS`] close the connection, as Kafka does, except
//! ApiVersions, which answers UNSUPPORTED_VERSION in v0 so that any client can learn what
//! this broker speaks (KIP-511).

mod acls;
pub(crate) mod auth_helper;
mod broker;
mod client_metrics;
mod client_quotas;
mod config_resources;
mod configs;
pub(crate) mod consumer_groups;
mod data;
pub(crate) mod delegation_tokens;
mod describe_topic_partitions;
mod features;
pub(crate) mod fetch_session;
mod group_configs;
mod groups;
mod log_dirs;
pub(crate) mod metadata;
mod partitions;
mod produce_topic_ids;
mod quorum;
pub(crate) mod quotas;
mod request_authorization;
pub(crate) mod sasl;
mod share_groups;
pub(crate) use sasl::scram_credential;
pub mod share_fetch;
mod share_group_offsets;
pub mod share_partitions;
pub mod share_persister;
mod share_state;
pub mod share_state_initializer;
mod topics;
mod transactions;
mod txn_partition;
pub(crate) mod txn_verification;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use rill_protocol::frame::{begin_frame, end_frame};
use rill_protocol::generated::api_versions_response::{ApiVersion, ApiVersionsResponse};
use rill_protocol::generated::request_header::RequestHeader;
use rill_protocol::generated::response_header::ResponseHeader;
use rill_protocol::generated::{ApiKey, RequestBody, ResponseBody};
use rill_protocol::primitives::Encodable;
use rill_protocol::ErrorCode;

use crate::network::scram::{ScramIdentity, ScramName};
use crate::network::{Reply, RequestHandler, ResponseChunk, Session};
use crate::replication::alter_partition::ControllerChannel;
use crate::replication::append_signal::AppendSignals;
pub(crate) use broker::ProducerIdBlock;
pub use broker::{Broker, CONTROLLER_REQUEST_TIMEOUT};
use quotas::{ClientIdentity, ClientQuotaManager, QuotaKind};
use request_authorization::Gate;
pub use transactions::BrokerLeaders;

/// The APIs this broker answers, with the version range it answers them in. Narrower than
/// the specs where old versions need a record format Rill does not store (magic 0/1) or
/// where a newer version's semantics are not implemented yet.
pub const SUPPORTED_APIS: &[(ApiKey, i16, i16)] = &[
    (ApiKey::Produce, 3, 13),
    (ApiKey::Fetch, 4, 18),
    (ApiKey::ListOffsets, 1, 10),
    (ApiKey::Metadata, 0, 13),
    (ApiKey::OffsetCommit, 0, 9),
    (ApiKey::OffsetFetch, 0, 9),
    (ApiKey::FindCoordinator, 0, 6),
    (ApiKey::JoinGroup, 0, 9),
    (ApiKey::Heartbeat, 0, 4),
    (ApiKey::LeaveGroup, 0, 5),
    (ApiKey::SyncGroup, 0, 5),
    (ApiKey::DescribeGroups, 0, 6),
    (ApiKey::ListGroups, 0, 5),
    // KIP-848's consumer groups (`group.protocol=consumer`); v1 adds the regular
    // expression subscription.
    (ApiKey::ConsumerGroupHeartbeat, 0, 1),
    (ApiKey::ConsumerGroupDescribe, 0, 1),
    // KIP-932's share groups, at Kafka 4.2's versions: v1 of the membership apis (4.1),
    // v2 of ShareFetch and ShareAcknowledge (KIP-1206's acquire mode, KIP-1222's renew).
    (ApiKey::ShareGroupHeartbeat, 1, 1),
    (ApiKey::ShareGroupDescribe, 1, 1),
    (ApiKey::ShareFetch, 1, 2),
    (ApiKey::ShareAcknowledge, 1, 2),
    // Kafka 4.2's: Describe v1 adds KIP-1226's lag.
    (ApiKey::DescribeShareGroupOffsets, 0, 1),
    (ApiKey::AlterShareGroupOffsets, 0, 0),
    (ApiKey::DeleteShareGroupOffsets, 0, 0),
    (ApiKey::ApiVersions, 0, 4),
    (ApiKey::CreateTopics, 0, 7),
    (ApiKey::DeleteTopics, 0, 6),
    (ApiKey::DeleteRecords, 0, 2),
    (ApiKey::InitProducerId, 0, 5),
    (ApiKey::DescribeConfigs, 0, 4),
    (ApiKey::AlterConfigs, 0, 2),
    (ApiKey::CreatePartitions, 0, 3),
    (ApiKey::IncrementalAlterConfigs, 0, 1),
    (ApiKey::DeleteGroups, 0, 2),
    (ApiKey::OffsetDelete, 0, 0),
    (ApiKey::DescribeCluster, 0, 2),
    (ApiKey::OffsetForLeaderEpoch, 0, 4),
    (ApiKey::ElectLeaders, 0, 2),
    (ApiKey::AlterPartitionReassignments, 0, 1),
    (ApiKey::ListPartitionReassignments, 0, 0),
    (ApiKey::UnregisterBroker, 0, 0),
    (ApiKey::AlterReplicaLogDirs, 1, 2),
    (ApiKey::DescribeLogDirs, 1, 4),
    (ApiKey::DescribeQuorum, 0, 2),
    (ApiKey::AddRaftVoter, 0, 0),
    (ApiKey::RemoveRaftVoter, 0, 0),
    (ApiKey::UpdateFeatures, 0, 2),
    (ApiKey::DescribeTopicPartitions, 0, 0),
    // Kafka 4.1's v1 (ListConfigResources, of every resource type) needs its 4.1 spec.
    (ApiKey::ListConfigResources, 0, 1),
    // Transaction version 1 only: EndTxn v5 and TxnOffsetCommit v5 mean version 2
    // (KIP-890 part 2), which is not built.
    (ApiKey::AddPartitionsToTxn, 0, 5),
    (ApiKey::AddOffsetsToTxn, 0, 4),
    (ApiKey::EndTxn, 0, 5),
    (ApiKey::TxnOffsetCommit, 0, 5),
    (ApiKey::DescribeTransactions, 0, 0),
    (ApiKey::ListTransactions, 0, 2),
    // Kafka 4.1's range: KIP-896 removed version 0 (brokers send 1).
    (ApiKey::WriteTxnMarkers, 1, 1),
    (ApiKey::DescribeProducers, 0, 0),
    // Answered by the network layer on SASL listeners (`network::sasl`).
    (ApiKey::SaslHandshake, 0, 1),
    (ApiKey::SaslAuthenticate, 0, 2),
    (ApiKey::DescribeUserScramCredentials, 0, 0),
    // Kafka 4.1's ranges: KIP-896 removed version 0.
    (ApiKey::CreateDelegationToken, 1, 3),
    (ApiKey::RenewDelegationToken, 1, 2),
    (ApiKey::ExpireDelegationToken, 1, 2),
    (ApiKey::DescribeDelegationToken, 1, 3),
    (ApiKey::AlterUserScramCredentials, 0, 0),
    // Kafka 4.1's ranges: KIP-896 removed version 0.
    (ApiKey::DescribeAcls, 1, 3),
    (ApiKey::CreateAcls, 1, 3),
    (ApiKey::DeleteAcls, 1, 3),
    (ApiKey::DescribeClientQuotas, 0, 1),
    (ApiKey::AlterClientQuotas, 0, 1),
    // KIP-932's share-group state, which share-partition leaders send the share
    // coordinator (CLUSTER_ACTION); Write and ReadSummary v1 are Kafka 4.2's (KIP-1226's
    // delivery complete count).
    (ApiKey::InitializeShareGroupState, 0, 0),
    (ApiKey::ReadShareGroupState, 0, 0),
    (ApiKey::WriteShareGroupState, 0, 1),
    (ApiKey::DeleteShareGroupState, 0, 0),
    (ApiKey::ReadShareGroupStateSummary, 0, 1),
];

pub fn supported_range(api: ApiKey) -> Option<(i16, i16)> {
    SUPPORTED_APIS
        .iter()
        .find(|(k, _, _)| *k == api)
        .map(|(_, lo, hi)| (*lo, *hi))
}

/// The first Produce version that names topics by id (KIP-516).
const PRODUCE_TOPIC_ID_VERSION: i16 = 13;

/// Counts the error codes of a response for `ErrorsPerSec`. Produce and Fetch count their
/// partitions' errors in their handlers, beside the topic counters (an acks=0 produce has
/// no response to count from), so only a refusal of the whole request is counted here.
fn count_errors(api: ApiKey, body: &ResponseBody, refused_whole: bool) {
    if !refused_whole && matches!(api, ApiKey::Produce | ApiKey::Fetch) {
        return;
    }
    let requests = &crate::metrics::global().requests;
    body.visit_error_codes(&mut |code| requests.error(api as i16, code));
}

/// Encodes a response frame: size prefix, response header of the right version, body.
pub fn encode_response<T: Encodable>(
    correlation_id: i32,
    api: ApiKey,
    version: i16,
    body: &T,
) -> Result<BytesMut, String> {
    let mut buf = BytesMut::with_capacity(64 + body.encoded_len(version));
    let start = begin_frame(&mut buf);
    let header = ResponseHeader {
        correlation_id,
        ..Default::default()
    };
    header
        .encode(&mut buf, api.response_header_version(version))
        .map_err(|e| format!("encoding response header: {e}"))?;
    body.encode(&mut buf, version)
        .map_err(|e| format!("encoding {}: {e}", api.name()))?;
    end_frame(&mut buf, start);
    Ok(buf)
}

/// A response of any API, for [`encode_response`].
struct AnyResponse<'a>(&'a ResponseBody);

impl Encodable for AnyResponse<'_> {
    fn encode(&self, buf: &mut BytesMut, version: i16) -> Result<(), rill_protocol::EncodeError> {
        self.0.encode(buf, version)
    }

    fn encoded_len(&self, version: i16) -> usize {
        self.0.encoded_len(version)
    }
}

fn api_versions_body(error_code: ErrorCode) -> ApiVersionsResponse {
    ApiVersionsResponse {
        error_code: error_code.code(),
        api_keys: SUPPORTED_APIS
            .iter()
            .map(|(k, lo, hi)| ApiVersion {
                api_key: k.as_i16(),
                min_version: *lo,
                max_version: *hi,
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

impl Broker {
    /// Answers one request. `Ok(None)` sends nothing (acks=0); `Err` closes the connection.
    /// With quotas, `throttling` holds the throttle they put on the request so far, which
    /// the response carries; the controller-mutation quota, applied here once the request
    /// is decoded, may raise it.
    pub(crate) async fn handle(
        &self,
        header: &RequestHeader,
        api: Option<ApiKey>,
        mut body: Bytes,
        session: &Session,
        mut throttling: Option<&mut Throttling<'_, '_>>,
    ) -> Result<Option<BytesMut>, String> {
        let peer = session.peer;
        let listener: &str = &session.listener;
        let version = header.request_api_version;
        let correlation_id = header.correlation_id;
        let Some(api) = api else {
            return Err(format!("unknown api key {}", header.request_api_key));
        };
        let supported = supported_range(api).is_some_and(|(lo, hi)| (lo..=hi).contains(&version));
        if !supported {
            if api == ApiKey::ApiVersions {
                let body = api_versions_body(ErrorCode::UNSUPPORTED_VERSION);
                return encode_response(correlation_id, api, 0, &body).map(Some);
            }
            return Err(format!("unsupported version {version} of {}", api.name()));
        }
        let mut request = RequestBody::decode(api, version, &mut body)
            .map_err(|e| format!("{} v{version} from {peer}: {e}", api.name()))?;
        tracing::trace!(api = api.name(), version, correlation_id, %peer, "request");
        acls::validate(&request)
            .map_err(|e| format!("{} v{version} from {peer}: {e}", api.name()))?;
        // Produce v13 names topics by id: back to names before anything else looks.
        let topic_ids_patch = match &mut request {
            RequestBody::Produce(r) if version >= PRODUCE_TOPIC_ID_VERSION => {
                Some(produce_topic_ids::resolve(&self.image(), r))
            }
            _ => None,
        };
        let authz = self.authz(session);
        let throttle_ms = |t: &Option<&mut Throttling<'_, '_>>| {
            t.as_ref()
                .map_or(0, |t| t.throttle.as_millis().min(i32::MAX as u128) as i32)
        };
        let patch = match self.authorize_request(&authz, version, listener, &mut request) {
            Gate::Proceed(patch) => match (patch, topic_ids_patch) {
                (patch, None) => patch,
                (None, Some(ids)) => Some(ids),
                (Some(patch), Some(ids)) => Some(Box::new(move |body: &mut ResponseBody| {
                    patch(body);
                    ids(body);
                })
                    as request_authorization::Patch),
            },
            Gate::Respond(mut body) => {
                if let Some(ids) = topic_ids_patch {
                    ids(&mut body);
                }
                let throttle_ms = throttle_ms(&throttling);
                body.raise_throttle_time_ms(throttle_ms);
                count_errors(api, &body, true);
                return encode_response(correlation_id, api, version, &AnyResponse(&body))
                    .map(Some);
            }
            Gate::Close(reason) => return Err(reason),
        };
        let mut mutation_patch = None;
        if let Some(t) = throttling.as_deref_mut() {
            if let Some(g) = t.scope.governed(QuotaKind::Mutation) {
                let default_partitions = self.config.num_partitions().unwrap_or(1);
                let (p, throttle) = quotas::mutation_gate(
                    &self.quotas,
                    &g,
                    &t.scope.image,
                    default_partitions,
                    version,
                    &mut request,
                    Instant::now(),
                );
                mutation_patch = p;
                t.throttle = t.throttle.max(throttle);
            }
        }
        let throttle_ms = throttle_ms(&throttling);
        macro_rules! respond {
            ($resp:expr) => {{
                let mut body = ResponseBody::from($resp);
                if let Some(patch) = patch {
                    patch(&mut body);
                }
                if let Some(patch) = mutation_patch {
                    patch(&mut body);
                }
                body.raise_throttle_time_ms(throttle_ms);
                count_errors(api, &body, false);
                encode_response(correlation_id, api, version, &AnyResponse(&body)).map(Some)
            }};
        }
        // A future is as large as the largest it may await, and each request's future is
        // moved and boxed whole: awaited inline, the admin and group handlers made every
        // request's future about 30 KB (copied and allocated per Produce). Boxed, each
        // request pays for its own handler only; Produce, the hot path, stays inline.
        match request {
            RequestBody::ApiVersions(_) => {
                respond!(self.with_features(api_versions_body(ErrorCode::NONE)))
            }
            RequestBody::Metadata(r) => {
                respond!(Box::pin(self.handle_metadata(r, version, listener)).await)
            }
            RequestBody::Produce(r) => {
                if session.affinity.matters() {
                    session.affinity.vote(r.topic_data.iter().flat_map(|t| {
                        t.partition_data
                            .iter()
                            .map(|p| AppendSignals::shard(&t.name, p.index))
                    }));
                }
                let produced = self.handle_produce(r, version).await;
                match produced {
                    Some(resp) => respond!(resp),
                    // An acks=0 produce that the gate refused in part: the client hears of
                    // no error, so the connection is closed, as Kafka does.
                    None if patch.is_some() => {
                        Err("acks=0 produce to a topic the principal may not write".into())
                    }
                    None => Ok(None),
                }
            }
            RequestBody::Fetch(r) => respond!(Box::pin(self.handle_fetch(r, version)).await),
            RequestBody::ListOffsets(r) => {
                respond!(Box::pin(self.handle_list_offsets(r, version)).await)
            }
            RequestBody::FindCoordinator(r) => {
                respond!(Box::pin(self.handle_find_coordinator(r, version, listener)).await)
            }
            RequestBody::CreateTopics(r) => {
                respond!(Box::pin(self.handle_create_topics(r, version)).await)
            }
            RequestBody::DeleteTopics(r) => {
                respond!(Box::pin(self.handle_delete_topics(r, version)).await)
            }
            RequestBody::DeleteRecords(r) => {
                respond!(Box::pin(self.handle_delete_records(r)).await)
            }
            RequestBody::CreatePartitions(r) => {
                respond!(Box::pin(self.handle_create_partitions(r)).await)
            }
            RequestBody::InitProducerId(r) => {
                respond!(Box::pin(self.handle_init_producer_id(r, version)).await)
            }
            RequestBody::DescribeConfigs(r) => respond!(self.handle_describe_configs(r, version)),
            RequestBody::AlterConfigs(r) => respond!(Box::pin(self.handle_alter_configs(r)).await),
            RequestBody::IncrementalAlterConfigs(r) => {
                respond!(Box::pin(self.handle_incremental_alter_configs(r)).await)
            }
            RequestBody::DescribeCluster(r) => respond!(self.handle_describe_cluster(r, listener)),
            RequestBody::OffsetForLeaderEpoch(r) => {
                respond!(self.handle_offset_for_leader_epoch(r))
            }
            RequestBody::ElectLeaders(r) => {
                respond!(Box::pin(self.handle_elect_leaders(r, version)).await)
            }
            RequestBody::AlterPartitionReassignments(r) => {
                respond!(Box::pin(self.handle_alter_partition_reassignments(r)).await)
            }
            RequestBody::ListPartitionReassignments(r) => {
                respond!(self.handle_list_partition_reassignments(r))
            }
            RequestBody::UnregisterBroker(r) => {
                respond!(Box::pin(self.handle_unregister_broker(r)).await)
            }
            RequestBody::DescribeLogDirs(r) => respond!(self.handle_describe_log_dirs(r)),
            RequestBody::AlterReplicaLogDirs(r) => {
                respond!(self.handle_alter_replica_log_dirs(r))
            }
            RequestBody::DescribeQuorum(r) => {
                respond!(Box::pin(self.handle_describe_quorum(r)).await)
            }
            RequestBody::AddRaftVoter(r) => respond!(Box::pin(self.handle_add_raft_voter(r)).await),
            RequestBody::RemoveRaftVoter(r) => {
                respond!(Box::pin(self.handle_remove_raft_voter(r)).await)
            }
            RequestBody::DescribeTopicPartitions(r) => {
                respond!(self.handle_describe_topic_partitions(r))
            }
            RequestBody::UpdateFeatures(r) => {
                respond!(Box::pin(self.handle_update_features(r, version)).await)
            }
            RequestBody::ListConfigResources(r) => {
                respond!(config_resources::list(&self.image(), &r, version))
            }
            RequestBody::JoinGroup(r) => {
                let client_id = header.client_id.as_deref().unwrap_or_default();
                respond!(Box::pin(self.handle_join_group(r, version, client_id, peer)).await)
            }
            RequestBody::SyncGroup(r) => respond!(Box::pin(self.handle_sync_group(r)).await),
            RequestBody::Heartbeat(r) => respond!(Box::pin(self.handle_heartbeat(r)).await),
            RequestBody::LeaveGroup(r) => {
                respond!(Box::pin(self.handle_leave_group(r, version)).await)
            }
            RequestBody::OffsetCommit(r) => {
                respond!(Box::pin(self.handle_offset_commit(r, version)).await)
            }
            RequestBody::OffsetFetch(r) => {
                respond!(Box::pin(self.handle_offset_fetch(r, version)).await)
            }
            RequestBody::OffsetDelete(r) => respond!(Box::pin(self.handle_offset_delete(r)).await),
            RequestBody::DescribeGroups(r) => {
                respond!(Box::pin(self.handle_describe_groups(r, version)).await)
            }
            RequestBody::ListGroups(r) => respond!(Box::pin(self.handle_list_groups(r)).await),
            RequestBody::DeleteGroups(r) => {
                let groups = r.groups_names.clone();
                let answer = Box::pin(self.handle_delete_groups(r)).await;
                for group in &groups {
                    self.share_partitions.forget_group(group);
                }
                respond!(answer)
            }
            RequestBody::ConsumerGroupHeartbeat(r) => {
                let client_id = header.client_id.as_deref().unwrap_or_default();
                respond!(Box::pin(self.handle_consumer_group_heartbeat(r, client_id, peer)).await)
            }
            RequestBody::ConsumerGroupDescribe(r) => {
                respond!(Box::pin(self.handle_consumer_group_describe(r)).await)
            }
            RequestBody::ShareGroupHeartbeat(r) => {
                let client_id = header.client_id.as_deref().unwrap_or_default();
                respond!(Box::pin(self.handle_share_group_heartbeat(r, client_id, peer)).await)
            }
            RequestBody::ShareGroupDescribe(r) => {
                respond!(Box::pin(self.handle_share_group_describe(r)).await)
            }
            RequestBody::ShareFetch(r) => {
                respond!(Box::pin(self.handle_share_fetch(r, session)).await)
            }
            RequestBody::ShareAcknowledge(r) => {
                respond!(Box::pin(self.handle_share_acknowledge(r, session)).await)
            }
            RequestBody::DescribeShareGroupOffsets(r) => {
                respond!(Box::pin(self.handle_describe_share_group_offsets(r)).await)
            }
            RequestBody::AlterShareGroupOffsets(r) => {
                let group = r.group_id.clone();
                let answer = Box::pin(self.handle_alter_share_group_offsets(r)).await;
                self.share_partitions.forget_group(&group);
                respond!(answer)
            }
            RequestBody::DeleteShareGroupOffsets(r) => {
                let group = r.group_id.clone();
                let answer = Box::pin(self.handle_delete_share_group_offsets(r)).await;
                self.share_partitions.forget_group(&group);
                respond!(answer)
            }
            RequestBody::AddPartitionsToTxn(r) => {
                respond!(Box::pin(self.handle_add_partitions_to_txn(r, version)).await)
            }
            RequestBody::AddOffsetsToTxn(r) => {
                respond!(Box::pin(self.handle_add_offsets_to_txn(r, version)).await)
            }
            RequestBody::EndTxn(r) => respond!(Box::pin(self.handle_end_txn(r, version)).await),
            RequestBody::TxnOffsetCommit(r) => {
                respond!(Box::pin(self.handle_txn_offset_commit(r, version)).await)
            }
            RequestBody::DescribeTransactions(r) => {
                respond!(Box::pin(self.handle_describe_transactions(r)).await)
            }
            RequestBody::ListTransactions(r) => {
                respond!(Box::pin(self.handle_list_transactions(r)).await)
            }
            RequestBody::WriteTxnMarkers(r) => {
                respond!(Box::pin(self.handle_write_txn_markers(r)).await)
            }
            RequestBody::InitializeShareGroupState(r) => {
                respond!(Box::pin(self.handle_initialize_share_group_state(r)).await)
            }
            RequestBody::ReadShareGroupState(r) => {
                respond!(Box::pin(self.handle_read_share_group_state(r)).await)
            }
            RequestBody::WriteShareGroupState(r) => {
                respond!(Box::pin(self.handle_write_share_group_state(r)).await)
            }
            RequestBody::DeleteShareGroupState(r) => {
                respond!(Box::pin(self.handle_delete_share_group_state(r)).await)
            }
            RequestBody::ReadShareGroupStateSummary(r) => {
                respond!(Box::pin(self.handle_read_share_group_state_summary(r)).await)
            }
            RequestBody::DescribeProducers(r) => respond!(self.handle_describe_producers(r)),
            RequestBody::DescribeUserScramCredentials(r) => {
                respond!(self.handle_describe_user_scram_credentials(r))
            }
            RequestBody::AlterUserScramCredentials(r) => {
                respond!(Box::pin(self.handle_alter_user_scram_credentials(r)).await)
            }
            RequestBody::CreateDelegationToken(r) => {
                respond!(Box::pin(self.handle_create_delegation_token(r, session, &authz)).await)
            }
            RequestBody::RenewDelegationToken(r) => {
                respond!(Box::pin(self.handle_renew_delegation_token(r, session)).await)
            }
            RequestBody::ExpireDelegationToken(r) => {
                respond!(Box::pin(self.handle_expire_delegation_token(r, session)).await)
            }
            RequestBody::DescribeDelegationToken(r) => {
                respond!(self.handle_describe_delegation_token(r, session, &authz))
            }
            RequestBody::DescribeAcls(r) => respond!(self.handle_describe_acls(r)),
            RequestBody::CreateAcls(r) => respond!(Box::pin(self.handle_create_acls(r)).await),
            RequestBody::DeleteAcls(r) => respond!(Box::pin(self.handle_delete_acls(r)).await),
            RequestBody::DescribeClientQuotas(r) => {
                respond!(self.handle_describe_client_quotas(r))
            }
            RequestBody::AlterClientQuotas(r) => {
                respond!(Box::pin(self.handle_alter_client_quotas(r)).await)
            }
            _ => Err(format!("{} is not handled", api.name())),
        }
    }
}

impl RequestHandler for Broker {
    async fn handle_request(
        &self,
        header: &RequestHeader,
        api_key: Option<ApiKey>,
        body: Bytes,
        session: &Session,
    ) -> Result<Reply, String> {
        // A broker that lost its controller lease leads nothing, and its image may be
        // stale; a client that keeps asking it for metadata (librdkafka asks the broker it
        // is connected to) would never learn the new leaders. Closing the connection
        // sends the client to another broker, as a dead one would. ApiVersions is still
        // answered: a connection closed under it makes librdkafka assume a pre-0.10
        // broker for a long while.
        if api_key != Some(ApiKey::ApiVersions)
            && self.lost_lease.load(std::sync::atomic::Ordering::Acquire)
        {
            return Err(
                "this broker lost its controller lease; the client must ask another".into(),
            );
        }
        let image = self.image();
        if image.client_quotas.is_empty() {
            // No quota anywhere: nothing is measured.
            return if api_key == Some(ApiKey::Fetch) {
                let (chunks, _) =
                    Box::pin(self.handle_fetch_chunks(header, body, session, None)).await?;
                Ok(Reply::new(chunks))
            } else {
                let response = self.handle(header, api_key, body, session, None).await?;
                Ok(Reply::new(
                    response.map(|b| vec![ResponseChunk::Bytes(b.freeze())]),
                ))
            };
        }
        let scope = QuotaScope {
            image,
            who: ClientIdentity {
                user: session
                    .principal
                    .strip_prefix("User:")
                    .unwrap_or(&session.principal),
                client_id: header.client_id.as_deref().unwrap_or_default(),
            },
        };
        // Boxed for the reason `handle` boxes its handlers: inline, this path's future
        // made every request's future, quota or not, several times larger.
        Box::pin(self.handle_with_quotas(header, api_key, body, session, &scope)).await
    }

    fn broker_config_value(&self, key: &str) -> Option<String> {
        crate::config::broker_config_value(&self.config, &self.image(), self.node_id, key)
            .map(|(v, _)| v)
    }

    fn connection_closed(&self, connection_id: u64) {
        self.share_partitions.connection_closed(connection_id);
    }

    fn connection_generation(&self) -> u64 {
        self.lease_losses.load(std::sync::atomic::Ordering::Acquire)
    }

    fn scram_credential(&self, name: ScramName<'_>) -> Option<ScramIdentity> {
        let image = self.image();
        if name.token {
            return self
                .delegation_tokens
                .identity(&image, name.name, name.mechanism);
        }
        sasl::scram_credential(&image, name.name, name.mechanism).map(ScramIdentity::user)
    }

    fn connection_creation_rate(&self, ip: std::net::IpAddr) -> Option<f64> {
        let image = self.image();
        if image.client_quotas.is_empty() {
            return None;
        }
        rill_metadata::client_quotas::ip_quota(&image, ip)
    }
}

/// What the quotas of one request are measured against.
pub(crate) struct QuotaScope<'a> {
    pub(crate) image: Arc<rill_metadata::MetadataImage>,
    pub(crate) who: ClientIdentity<'a>,
}

impl QuotaScope<'_> {
    pub(crate) fn governed(&self, kind: QuotaKind) -> Option<quotas::Governed> {
        ClientQuotaManager::governed(&self.image, kind, self.who)
    }
}

/// The quotas of one request being handled, and the throttle they have put on it.
pub(crate) struct Throttling<'a, 'b> {
    pub(crate) scope: &'a QuotaScope<'b>,
    pub(crate) throttle: Duration,
}

/// Request time as Kafka's request quota counts it: percent of one thread for a second.
fn request_percentage(spent: Duration) -> f64 {
    spent.as_secs_f64() * 100.0
}

impl Broker {
    /// [`RequestHandler::handle_request`] when some quota exists (see `quotas`).
    async fn handle_with_quotas(
        &self,
        header: &RequestHeader,
        api_key: Option<ApiKey>,
        body: Bytes,
        session: &Session,
        scope: &QuotaScope<'_>,
    ) -> Result<Reply, String> {
        let now = Instant::now();
        let version = header.request_api_version;
        let mut spent = Duration::ZERO;
        if api_key == Some(ApiKey::Fetch) {
            let fetch = self.handle_fetch_chunks(header, body, session, Some(scope));
            let (chunks, throttle) = poll_timed(fetch, &mut spent).await?;
            // A follower's fetch is exempt; the handler said so by measuring nothing.
            if let Some((throttle, request)) = throttle {
                if let Some(g) = request {
                    self.quotas
                        .record(&g, request_percentage(spent), Instant::now());
                }
                return Ok(Reply {
                    chunks,
                    throttle,
                    hold_response: !quotas::client_throttles(ApiKey::Fetch, version),
                });
            }
            return Ok(Reply::new(chunks));
        }
        let acks_zero_produce =
            api_key == Some(ApiKey::Produce) && produce_acks(&body, version) == Some(0);
        // Cluster actions are exempt from the request quota, as in Kafka, and so is an
        // acks=0 produce, which has no response to carry a throttle.
        let exempt = matches!(api_key, Some(ApiKey::WriteTxnMarkers)) || acks_zero_produce;
        let request = if exempt {
            None
        } else {
            scope.governed(QuotaKind::Request)
        };
        let mut throttle = request
            .as_ref()
            .map_or(Duration::ZERO, |g| self.quotas.check(g, now));
        if api_key == Some(ApiKey::Produce) {
            if let Some(g) = scope.governed(QuotaKind::Produce) {
                let header_len =
                    header.encoded_len(ApiKey::Produce.request_header_version(version));
                let size = (header_len + body.len()) as f64;
                throttle = throttle.max(self.quotas.record(&g, size, now));
            }
        }
        let mut throttling = Throttling { scope, throttle };
        let response = poll_timed(
            self.handle(header, api_key, body, session, Some(&mut throttling)),
            &mut spent,
        )
        .await?;
        let throttle = throttling.throttle;
        if let Some(g) = &request {
            self.quotas
                .record(g, request_percentage(spent), Instant::now());
        }
        let hold_response = api_key.is_some_and(|api| !quotas::client_throttles(api, version));
        Ok(Reply {
            chunks: response.map(|b| vec![ResponseChunk::Bytes(b.freeze())]),
            throttle,
            hold_response,
        })
    }
}

/// Runs `fut`, adding the time spent in its polls to `spent`: the time the request held
/// a thread, not the time it waited.
async fn poll_timed<F: std::future::Future>(fut: F, spent: &mut Duration) -> F::Output {
    let mut fut = std::pin::pin!(fut);
    std::future::poll_fn(|cx| {
        let start = Instant::now();
        let r = fut.as_mut().poll(cx);
        *spent += start.elapsed();
        r
    })
    .await
}

/// The `acks` of a produce request body: the fields before it are the transactional id
/// alone (a nullable string, compact from version 9).
fn produce_acks(body: &Bytes, version: i16) -> Option<i16> {
    use bytes::Buf;
    let mut b = body.clone();
    let len = if version >= 9 {
        let n = rill_protocol::primitives::read_unsigned_varint(&mut b).ok()?;
        n.saturating_sub(1) as usize
    } else {
        if b.remaining() < 2 {
            return None;
        }
        b.get_i16().max(0) as usize
    };
    if b.remaining() < len + 2 {
        return None;
    }
    b.advance(len);
    Some(b.get_i16())
}

impl ControllerChannel for Broker {
    fn broker_id(&self) -> i32 {
        self.node_id
    }

    fn broker_epoch(&self) -> i64 {
        Broker::broker_epoch(self)
    }

    async fn controller_call(
        &self,
        event: rill_metadata::ControllerEvent,
    ) -> Result<rill_metadata::ControllerResponse, ErrorCode> {
        Broker::controller_call(self, event).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn supported_versions_lie_within_the_specs() {
        for (api, lo, hi) in SUPPORTED_APIS {
            let (spec_lo, spec_hi) = api.valid_versions();
            assert!(spec_lo <= *lo && hi <= &spec_hi, "{} {lo}-{hi}", api.name());
        }
    }
}
