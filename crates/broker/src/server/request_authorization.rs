//! Every API checks its operation, as Kafka's `KafkaApis` and `ControllerApis` do, in
//! one place: a gate per API that runs before its handler ([`Broker::authorize_request`]).
//!
//! # Protocol
//!
//! 1. The gate looks at the decoded request and the session ([`Authz`]).
//! 2. A request refused as a whole (a cluster operation, a group the principal may not
//!    READ, a transactional id it may not WRITE) is answered at once with Kafka's error
//!    response for that API ([`Gate::Respond`]); the handler never runs.
//! 3. Otherwise the gate takes out of the request the parts the principal may not touch
//!    (topics it may not WRITE to, groups it may not DESCRIBE, ...) and keeps them in a
//!    patch; the handler runs on what is left; the patch then adds the refused parts to
//!    the response with TOPIC_AUTHORIZATION_FAILED and its kin, and fills what KIP-430's
//!    authorized operations ask for ([`Gate::Proceed`]). Responses that list what the
//!    principal may see (Metadata of every topic, ListGroups, ListTransactions, offsets of
//!    every topic) are filtered by the patch instead.
//! 4. A refused part of a request that gets no response (an `acks=0` produce) closes the
//!    connection, as Kafka does when such a produce has an error.
//!
//! Without an authorizer every check passes, so the gates change nothing but the
//! authorized operations, which are then every operation the resource supports.
//!
//! # Why in front of the handlers
//!
//! The handlers stay as they were: none of them reads the principal, and one module says
//! what each API demands, in Kafka's order, so that it can be read against `KafkaApis`.
//! Clients match responses to requests by name, not by position, so refused parts may
//! come after the rest.

use rill_metadata::{AclOperation, ResourceType};
use rill_protocol::generated::add_partitions_to_txn_response::{
    AddPartitionsToTxnPartitionResult, AddPartitionsToTxnResult, AddPartitionsToTxnTopicResult,
};
use rill_protocol::generated::alter_configs_response::AlterConfigsResourceResponse;
use rill_protocol::generated::create_acls_response::AclCreationResult;
use rill_protocol::generated::create_partitions_response::CreatePartitionsTopicResult;
use rill_protocol::generated::create_topics_response::CreatableTopicResult;
use rill_protocol::generated::delete_acls_response::DeleteAclsFilterResult;
use rill_protocol::generated::delete_groups_response::DeletableGroupResult;
use rill_protocol::generated::delete_records_response::{
    DeleteRecordsPartitionResult, DeleteRecordsTopicResult,
};
use rill_protocol::generated::delete_topics_response::DeletableTopicResult;
use rill_protocol::generated::describe_configs_response::DescribeConfigsResult;
use rill_protocol::generated::describe_groups_response::DescribedGroup;
use rill_protocol::generated::describe_producers_response::{PartitionResponse, TopicResponse};
use rill_protocol::generated::describe_topic_partitions_response::DescribeTopicPartitionsResponseTopic;
use rill_protocol::generated::describe_transactions_response::TransactionState;
use rill_protocol::generated::elect_leaders_response::{PartitionResult, ReplicaElectionResult};
use rill_protocol::generated::fetch_request::FetchRequest;
use rill_protocol::generated::fetch_response::{FetchableTopicResponse, PartitionData};
use rill_protocol::generated::find_coordinator_response::Coordinator;
use rill_protocol::generated::incremental_alter_configs_response::AlterConfigsResourceResponse as IncrementalResourceResponse;
use rill_protocol::generated::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use rill_protocol::generated::metadata_response::MetadataResponseTopic;
use rill_protocol::generated::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use rill_protocol::generated::offset_delete_response::{
    OffsetDeleteResponsePartition, OffsetDeleteResponseTopic,
};
use rill_protocol::generated::offset_fetch_response::{
    OffsetFetchResponseGroup, OffsetFetchResponsePartition, OffsetFetchResponsePartitions,
    OffsetFetchResponseTopic, OffsetFetchResponseTopics,
};
use rill_protocol::generated::offset_for_leader_epoch_response::{
    EpochEndOffset, OffsetForLeaderTopicResult,
};
use rill_protocol::generated::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use rill_protocol::generated::txn_offset_commit_response::{
    TxnOffsetCommitResponsePartition, TxnOffsetCommitResponseTopic,
};
use rill_protocol::generated::write_txn_markers_response::{
    WritableTxnMarkerPartitionResult, WritableTxnMarkerResult, WritableTxnMarkerTopicResult,
};
use rill_protocol::generated::*;
use rill_protocol::{ErrorCode, Uuid};

use crate::server::auth_helper::Authz;
use crate::server::share_group_offsets;
use crate::server::share_state;
use crate::server::Broker;

/// What is done to a handler's response (step 3 of the module's protocol).
pub(crate) type Patch = Box<dyn FnOnce(&mut ResponseBody) + Send>;

/// The gate's verdict on one request.
pub(crate) enum Gate {
    /// Run the handler, then apply the patch to its response.
    Proceed(Option<Patch>),
    /// Answer with this response; the handler does not run.
    Respond(ResponseBody),
    /// Close the connection.
    Close(String),
}

use AclOperation::{
    Alter, AlterConfigs, Create, Delete, Describe, DescribeConfigs, IdempotentWrite, Read, Write,
};

const TAF: ErrorCode = ErrorCode::TOPIC_AUTHORIZATION_FAILED;
const GAF: ErrorCode = ErrorCode::GROUP_AUTHORIZATION_FAILED;
const CAF: ErrorCode = ErrorCode::CLUSTER_AUTHORIZATION_FAILED;
const TIAF: ErrorCode = ErrorCode::TRANSACTIONAL_ID_AUTHORIZATION_FAILED;

/// `ConfigResource.Type` codes, as DescribeConfigs and AlterConfigs carry them.
const CONFIG_TOPIC: i8 = 2;
const CONFIG_BROKER: i8 = 4;
const CONFIG_BROKER_LOGGER: i8 = 8;
const CONFIG_CLIENT_METRICS: i8 = 16;
const CONFIG_GROUP: i8 = 32;

/// Moves out of `items` those `allowed` refuses, keeping the order of both.
pub(crate) fn take_denied<T>(items: &mut Vec<T>, mut allowed: impl FnMut(&T) -> bool) -> Vec<T> {
    let mut denied = Vec::new();
    let mut kept = Vec::with_capacity(items.len());
    for item in items.drain(..) {
        if allowed(&item) {
            kept.push(item);
        } else {
            denied.push(item);
        }
    }
    *items = kept;
    denied
}

/// A patch that applies `f` to the response when it is of the variant `$v`.
macro_rules! patch {
    ($v:ident, |$r:ident| $body:expr) => {
        Gate::Proceed(Some(Box::new(move |resp: &mut ResponseBody| {
            if let ResponseBody::$v($r) = resp {
                $body
            }
        })))
    };
}

/// The error of a refused config resource (Kafka's `ConfigHelper` and `ControllerApis`).
fn config_error(resource_type: i8) -> ErrorCode {
    match resource_type {
        CONFIG_TOPIC => TAF,
        CONFIG_GROUP => GAF,
        _ => CAF,
    }
}

fn config_allowed(a: &Authz, op: AclOperation, resource_type: i8, name: &str) -> bool {
    match resource_type {
        CONFIG_TOPIC => a.topic(op, name),
        CONFIG_GROUP => a.group(op, name),
        CONFIG_BROKER | CONFIG_BROKER_LOGGER | CONFIG_CLIENT_METRICS => a.cluster(op),
        // An unknown type is the handler's to refuse.
        _ => true,
    }
}

impl Broker {
    /// The gate of one request (see the module docs).
    pub(crate) fn authorize_request(
        &self,
        a: &Authz,
        version: i16,
        listener: &str,
        request: &mut RequestBody,
    ) -> Gate {
        match request {
            RequestBody::Produce(r) => produce(a, r),
            RequestBody::Fetch(r) => self.fetch_gate(a, r, version, listener),
            RequestBody::ListOffsets(r) => list_offsets(a, r),
            RequestBody::Metadata(r) => self.metadata_gate(a, r, version),
            RequestBody::OffsetCommit(r) => offset_commit(a, r),
            RequestBody::OffsetFetch(r) => offset_fetch(a, r, version),
            RequestBody::FindCoordinator(r) => find_coordinator(a, r, version),
            RequestBody::JoinGroup(r) => group_read(a, &r.group_id, || {
                JoinGroupResponse {
                    error_code: GAF.code(),
                    generation_id: -1,
                    protocol_name: (version < 7).then(String::new),
                    ..Default::default()
                }
                .into()
            }),
            RequestBody::SyncGroup(r) => group_read(a, &r.group_id, || {
                SyncGroupResponse {
                    error_code: GAF.code(),
                    ..Default::default()
                }
                .into()
            }),
            RequestBody::Heartbeat(r) => group_read(a, &r.group_id, || {
                HeartbeatResponse {
                    error_code: GAF.code(),
                    ..Default::default()
                }
                .into()
            }),
            RequestBody::LeaveGroup(r) => group_read(a, &r.group_id, || {
                LeaveGroupResponse {
                    error_code: GAF.code(),
                    ..Default::default()
                }
                .into()
            }),
            RequestBody::DescribeGroups(r) => describe_groups(a, r, version),
            RequestBody::ConsumerGroupHeartbeat(r) => consumer_group_heartbeat(a, r),
            RequestBody::ConsumerGroupDescribe(r) => consumer_group_describe(a, r),
            RequestBody::ShareGroupHeartbeat(r) => share_group_heartbeat(a, r),
            RequestBody::ShareGroupDescribe(r) => share_group_describe(a, r),
            RequestBody::ShareFetch(r) => share_fetch(a, r),
            RequestBody::ShareAcknowledge(r) => share_acknowledge(a, r),
            RequestBody::DescribeShareGroupOffsets(r) => share_group_offsets::describe_gate(a, r),
            RequestBody::AlterShareGroupOffsets(r) => share_group_offsets::alter_gate(a, r),
            RequestBody::DeleteShareGroupOffsets(r) => share_group_offsets::delete_gate(a, r),
            RequestBody::ListGroups(_) => list_groups(a),
            RequestBody::DeleteGroups(r) => delete_groups(a, r),
            RequestBody::OffsetDelete(r) => offset_delete(a, r),
            RequestBody::CreateTopics(r) => create_topics(a, r),
            RequestBody::DeleteTopics(r) => delete_topics(a, r, version),
            RequestBody::DeleteRecords(r) => delete_records(a, r),
            RequestBody::InitProducerId(r) => init_producer_id(a, r),
            RequestBody::DescribeConfigs(r) => describe_configs(a, r),
            RequestBody::AlterConfigs(r) => alter_configs(a, r),
            RequestBody::IncrementalAlterConfigs(r) => incremental_alter_configs(a, r),
            RequestBody::CreatePartitions(r) => create_partitions(a, r),
            RequestBody::DescribeCluster(r) => describe_cluster(a, r),
            RequestBody::OffsetForLeaderEpoch(r) => offset_for_leader_epoch(a, r),
            RequestBody::ElectLeaders(r) => elect_leaders(a, r),
            RequestBody::AlterPartitionReassignments(r) => alter_reassignments(a, r),
            RequestBody::ListPartitionReassignments(_) => cluster_or(a, Describe, || {
                ListPartitionReassignmentsResponse {
                    error_code: CAF.code(),
                    ..Default::default()
                }
                .into()
            }),
            RequestBody::UnregisterBroker(_) => cluster_or(a, Alter, || {
                UnregisterBrokerResponse {
                    error_code: CAF.code(),
                    ..Default::default()
                }
                .into()
            }),
            RequestBody::AlterReplicaLogDirs(r) => alter_replica_log_dirs(a, r),
            RequestBody::DescribeLogDirs(_) => cluster_or(a, Describe, || {
                DescribeLogDirsResponse {
                    error_code: CAF.code(),
                    ..Default::default()
                }
                .into()
            }),
            RequestBody::AddRaftVoter(_) => cluster_or(a, Alter, || {
                rill_protocol::generated::add_raft_voter_response::AddRaftVoterResponse {
                    error_code: CAF.code(),
                    ..Default::default()
                }
                .into()
            }),
            RequestBody::RemoveRaftVoter(_) => cluster_or(a, Alter, || {
                rill_protocol::generated::remove_raft_voter_response::RemoveRaftVoterResponse {
                    error_code: CAF.code(),
                    ..Default::default()
                }
                .into()
            }),
            RequestBody::DescribeQuorum(_) => cluster_or(a, Describe, || {
                DescribeQuorumResponse {
                    error_code: CAF.code(),
                    ..Default::default()
                }
                .into()
            }),
            RequestBody::UpdateFeatures(r) => update_features(a, r),
            RequestBody::DescribeTopicPartitions(r) => describe_topic_partitions(a, r),
            RequestBody::AddPartitionsToTxn(r) => add_partitions_to_txn(a, r, version),
            RequestBody::AddOffsetsToTxn(r) => {
                if !a.transactional_id(Write, &r.transactional_id) {
                    return respond(AddOffsetsToTxnResponse {
                        error_code: TIAF.code(),
                        ..Default::default()
                    });
                }
                group_read(a, &r.group_id, || {
                    AddOffsetsToTxnResponse {
                        error_code: GAF.code(),
                        ..Default::default()
                    }
                    .into()
                })
            }
            RequestBody::EndTxn(r) => {
                if a.transactional_id(Write, &r.transactional_id) {
                    Gate::Proceed(None)
                } else {
                    respond(EndTxnResponse {
                        error_code: TIAF.code(),
                        producer_id: -1,
                        producer_epoch: -1,
                        ..Default::default()
                    })
                }
            }
            RequestBody::TxnOffsetCommit(r) => txn_offset_commit(a, r),
            RequestBody::WriteTxnMarkers(r) => write_txn_markers(a, r),
            RequestBody::InitializeShareGroupState(r) => share_state_gate(a, || {
                share_state::initialize_response(refused(share_state::initialize_calls(r)))
            }),
            RequestBody::ReadShareGroupState(r) => share_state_gate(a, || {
                share_state::read_response(refused(share_state::read_calls(r)))
            }),
            RequestBody::WriteShareGroupState(r) => share_state_gate(a, || {
                let calls = share_state::write_calls(r)
                    .into_iter()
                    .map(|c| c.unwrap_or_else(|c| c))
                    .collect();
                share_state::write_response(refused(calls))
            }),
            RequestBody::DeleteShareGroupState(r) => share_state_gate(a, || {
                share_state::delete_response(refused(share_state::delete_calls(r)))
            }),
            RequestBody::ReadShareGroupStateSummary(r) => share_state_gate(a, || {
                share_state::summary_response(refused(share_state::summary_calls(r)))
            }),
            RequestBody::DescribeTransactions(r) => describe_transactions(a, r),
            RequestBody::ListTransactions(_) => list_transactions(a),
            RequestBody::DescribeProducers(r) => describe_producers(a, r),
            RequestBody::DescribeUserScramCredentials(_) => cluster_or(a, Describe, || {
                DescribeUserScramCredentialsResponse {
                    error_code: CAF.code(),
                    error_message: Some("Cluster authorization failed.".into()),
                    ..Default::default()
                }
                .into()
            }),
            RequestBody::AlterUserScramCredentials(r) => alter_user_scram_credentials(a, r),
            RequestBody::ListConfigResources(_) => cluster_or(a, DescribeConfigs, || {
                ListConfigResourcesResponse {
                    error_code: CAF.code(),
                    ..Default::default()
                }
                .into()
            }),
            RequestBody::DescribeClientQuotas(_) => cluster_or(a, DescribeConfigs, || {
                DescribeClientQuotasResponse {
                    error_code: CAF.code(),
                    error_message: Some("Cluster authorization failed.".into()),
                    ..Default::default()
                }
                .into()
            }),
            RequestBody::AlterClientQuotas(r) => cluster_or(a, AlterConfigs, || {
                use alter_client_quotas_response::{EntityData, EntryData};
                AlterClientQuotasResponse {
                    entries: r
                        .entries
                        .iter()
                        .map(|e| EntryData {
                            error_code: CAF.code(),
                            error_message: Some("Cluster authorization failed.".into()),
                            entity: e
                                .entity
                                .iter()
                                .map(|d| EntityData {
                                    entity_type: d.entity_type.clone(),
                                    entity_name: d.entity_name.clone(),
                                    ..Default::default()
                                })
                                .collect(),
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                }
                .into()
            }),
            RequestBody::DescribeAcls(_) => cluster_or(a, Describe, || {
                DescribeAclsResponse {
                    error_code: CAF.code(),
                    error_message: Some("Cluster authorization failed.".into()),
                    ..Default::default()
                }
                .into()
            }),
            RequestBody::CreateAcls(r) => {
                let n = r.creations.len();
                cluster_or(a, Alter, || {
                    CreateAclsResponse {
                        results: (0..n)
                            .map(|_| AclCreationResult {
                                error_code: CAF.code(),
                                ..Default::default()
                            })
                            .collect(),
                        ..Default::default()
                    }
                    .into()
                })
            }
            RequestBody::DeleteAcls(r) => {
                let n = r.filters.len();
                cluster_or(a, Alter, || {
                    DeleteAclsResponse {
                        filter_results: (0..n)
                            .map(|_| DeleteAclsFilterResult {
                                error_code: CAF.code(),
                                ..Default::default()
                            })
                            .collect(),
                        ..Default::default()
                    }
                    .into()
                })
            }
            _ => Gate::Proceed(None),
        }
    }

    /// Fetch: a follower fetch (a replica id) only from a broker, a consumer's READ on
    /// each topic. `listener` is the one the request came in on.
    ///
    /// "From a broker", with an authorizer, is Kafka's rule: the principal has
    /// CLUSTER_ACTION on the cluster. Without one, Kafka lets anyone send a follower
    /// fetch; Rill asks that it come in on `inter.broker.listener.name`, where brokers
    /// send theirs. In both cases the replica id must name a follower of the partition
    /// (the replica manager's check), and a refused fetch answers
    /// TOPIC_AUTHORIZATION_FAILED for every partition, as Kafka does (CVE-2018-1288).
    pub(crate) fn fetch_gate(
        &self,
        a: &Authz,
        r: &mut FetchRequest,
        version: i16,
        listener: &str,
    ) -> Gate {
        let replica_id = if version >= 15 {
            r.replica_state.replica_id
        } else {
            r.replica_id
        };
        let denied = if replica_id >= 0 {
            let from_broker = if a.enabled() {
                a.is_broker()
            } else {
                listener == self.inter_broker_listener
            };
            if from_broker {
                return Gate::Proceed(None);
            }
            std::mem::take(&mut r.topics)
        } else {
            let image = a.image();
            take_denied(&mut r.topics, |t| {
                let name = if version >= 13 {
                    image.topics.get(&t.topic_id).map(|t| t.name.as_str())
                } else {
                    Some(t.topic.as_str())
                };
                // An unknown topic id is the handler's to answer (UNKNOWN_TOPIC_ID).
                name.is_none_or(|n| a.topic(Read, n))
            })
        };
        if denied.is_empty() {
            return Gate::Proceed(None);
        }
        let refused: Vec<FetchableTopicResponse> = denied
            .into_iter()
            .map(|t| FetchableTopicResponse {
                topic: t.topic,
                topic_id: t.topic_id,
                partitions: t
                    .partitions
                    .iter()
                    .map(|p| PartitionData {
                        partition_index: p.partition,
                        error_code: TAF.code(),
                        high_watermark: -1,
                        last_stable_offset: -1,
                        log_start_offset: -1,
                        preferred_read_replica: -1,
                        records: Some(bytes::Bytes::new()),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            })
            .collect();
        // Nothing left to wait for: answer at once rather than after `max_wait_ms`.
        if r.topics.is_empty() {
            return respond(FetchResponse {
                responses: refused,
                ..Default::default()
            });
        }
        patch!(Fetch, |resp| resp.responses.extend(refused))
    }

    /// Metadata: DESCRIBE on each topic; a topic the request would create needs CREATE;
    /// topics listed as "every topic" are filtered, topics named are refused with
    /// TOPIC_AUTHORIZATION_FAILED (without disclosing whether they exist); KIP-430's
    /// operations when asked for.
    fn metadata_gate(&self, a: &Authz, r: &mut MetadataRequest, version: i16) -> Gate {
        let all = match &r.topics {
            None => true,
            Some(list) => version == 0 && list.is_empty(),
        };
        let auto_create = r.allow_auto_topic_creation && self.config.auto_create_topics();
        let mut refused: Vec<MetadataResponseTopic> = Vec::new();
        if let Some(topics) = r.topics.as_mut().filter(|_| !all) {
            let image = a.image();
            let may_create_any = auto_create && a.cluster(Create);
            for t in take_denied(topics, |t| match &t.name {
                Some(name) => {
                    a.topic(Describe, name)
                        && (!auto_create
                            || may_create_any
                            || image.topic(name).is_some()
                            || a.topic(Create, name))
                }
                None => image
                    .topics
                    .get(&t.topic_id)
                    .is_none_or(|known| a.topic(Describe, &known.name)),
            }) {
                refused.push(match t.name {
                    Some(name) => MetadataResponseTopic {
                        error_code: TAF.code(),
                        is_internal: name.starts_with("__") && a.topic(Describe, &name),
                        name: Some(name),
                        topic_id: Uuid::ZERO,
                        ..Default::default()
                    },
                    // Topic ids are not secret: the id is echoed, the name is not told.
                    None => MetadataResponseTopic {
                        error_code: TAF.code(),
                        name: None,
                        topic_id: t.topic_id,
                        ..Default::default()
                    },
                });
            }
        }
        // Every named topic was refused: an empty list in v0 would mean "every topic".
        let only_refused = !all && r.topics.as_ref().is_some_and(Vec::is_empty);
        let topic_ops = version >= 8 && r.include_topic_authorized_operations;
        let cluster_ops = (8..=10).contains(&version) && r.include_cluster_authorized_operations;
        let cluster_bits = cluster_ops.then(|| a.cluster_operations());
        let filter_all = all && a.enabled();
        // The checks below run after the handler, on its topics.
        let describable: Option<std::collections::HashSet<String>> = filter_all.then(|| {
            a.image()
                .topics_by_name
                .keys()
                .filter(|n| a.topic(Describe, n))
                .cloned()
                .collect()
        });
        let ops: Option<std::collections::HashMap<String, i32>> = topic_ops.then(|| {
            let image = a.image();
            let names: Vec<&String> = match &r.topics {
                Some(list) if !all => list.iter().filter_map(|t| t.name.as_ref()).collect(),
                _ => image.topics_by_name.keys().collect(),
            };
            let by_id: Vec<&String> = r
                .topics
                .iter()
                .flatten()
                .filter(|t| t.name.is_none())
                .filter_map(|t| image.topics.get(&t.topic_id).map(|t| &t.name))
                .collect();
            names
                .into_iter()
                .chain(by_id)
                .map(|n| (n.clone(), a.operations(ResourceType::Topic, n)))
                .collect()
        });
        patch!(Metadata, |resp| {
            if only_refused {
                resp.topics.clear();
            }
            if let Some(describable) = &describable {
                resp.topics
                    .retain(|t| t.name.as_ref().is_some_and(|n| describable.contains(n)));
            }
            if let Some(ops) = &ops {
                for t in &mut resp.topics {
                    if let Some(bits) = t.name.as_ref().and_then(|n| ops.get(n)) {
                        t.topic_authorized_operations = *bits;
                    }
                }
            }
            if let Some(bits) = cluster_bits {
                resp.cluster_authorized_operations = bits;
            }
            resp.topics.extend(refused);
        })
    }
}

fn respond(body: impl Into<ResponseBody>) -> Gate {
    Gate::Respond(body.into())
}

/// A request refused as a whole unless the cluster operation is allowed.
fn cluster_or(a: &Authz, op: AclOperation, refused: impl FnOnce() -> ResponseBody) -> Gate {
    if a.cluster(op) {
        Gate::Proceed(None)
    } else {
        Gate::Respond(refused())
    }
}

/// A group request refused as a whole unless the principal may READ the group.
fn group_read(a: &Authz, group: &str, refused: impl FnOnce() -> ResponseBody) -> Gate {
    if a.group(Read, group) {
        Gate::Proceed(None)
    } else {
        Gate::Respond(refused())
    }
}

fn produce(a: &Authz, r: &mut ProduceRequest) -> Gate {
    let refuse_all = |r: &ProduceRequest, code: ErrorCode| ProduceResponse {
        responses: r
            .topic_data
            .iter()
            .map(|t| produce_refused(&t.name, &t.partition_data, code))
            .collect(),
        ..Default::default()
    };
    if let Some(id) = &r.transactional_id {
        if !a.transactional_id(Write, id) {
            if r.acks == 0 {
                return Gate::Close("acks=0 produce under a refused transactional id".into());
            }
            return respond(refuse_all(r, TIAF));
        }
    }
    let denied = take_denied(&mut r.topic_data, |t| a.topic(Write, &t.name));
    if denied.is_empty() {
        return Gate::Proceed(None);
    }
    let refused: Vec<TopicProduceResponse> = denied
        .iter()
        .map(|t| produce_refused(&t.name, &t.partition_data, TAF))
        .collect();
    patch!(Produce, |resp| resp.responses.extend(refused))
}

fn produce_refused(
    name: &str,
    partitions: &[produce_request::PartitionProduceData],
    code: ErrorCode,
) -> TopicProduceResponse {
    TopicProduceResponse {
        name: name.to_string(),
        partition_responses: partitions
            .iter()
            .map(|p| PartitionProduceResponse {
                index: p.index,
                error_code: code.code(),
                base_offset: -1,
                log_append_time_ms: -1,
                log_start_offset: -1,
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

fn list_offsets(a: &Authz, r: &mut ListOffsetsRequest) -> Gate {
    let denied = take_denied(&mut r.topics, |t| a.topic(Describe, &t.name));
    if denied.is_empty() {
        return Gate::Proceed(None);
    }
    let refused: Vec<ListOffsetsTopicResponse> = denied
        .into_iter()
        .map(|t| ListOffsetsTopicResponse {
            name: t.name,
            partitions: t
                .partitions
                .iter()
                .map(|p| ListOffsetsPartitionResponse {
                    partition_index: p.partition_index,
                    error_code: TAF.code(),
                    timestamp: -1,
                    offset: -1,
                    leader_epoch: -1,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        })
        .collect();
    patch!(ListOffsets, |resp| resp.topics.extend(refused))
}

fn offset_commit(a: &Authz, r: &mut OffsetCommitRequest) -> Gate {
    let partitions_with = |topics: &[offset_commit_request::OffsetCommitRequestTopic],
                           code: ErrorCode| {
        topics
            .iter()
            .map(|t| OffsetCommitResponseTopic {
                name: t.name.clone(),
                partitions: t
                    .partitions
                    .iter()
                    .map(|p| OffsetCommitResponsePartition {
                        partition_index: p.partition_index,
                        error_code: code.code(),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            })
            .collect::<Vec<_>>()
    };
    if !a.group(Read, &r.group_id) {
        return respond(OffsetCommitResponse {
            topics: partitions_with(&r.topics, GAF),
            ..Default::default()
        });
    }
    let denied = take_denied(&mut r.topics, |t| a.topic(Read, &t.name));
    if denied.is_empty() {
        return Gate::Proceed(None);
    }
    let refused = partitions_with(&denied, TAF);
    patch!(OffsetCommit, |resp| resp.topics.extend(refused))
}

fn offset_fetch(a: &Authz, r: &mut OffsetFetchRequest, version: i16) -> Gate {
    if version < 8 {
        if !a.group(Describe, &r.group_id) {
            return respond(OffsetFetchResponse {
                error_code: GAF.code(),
                ..Default::default()
            });
        }
        let Some(topics) = r.topics.as_mut() else {
            // Every topic: only those the principal may describe are shown.
            let describable = a.describable_topics();
            return patch!(OffsetFetch, |resp| resp
                .topics
                .retain(|t| describable.contains(&t.name)));
        };
        let denied = take_denied(topics, |t| a.topic(Describe, &t.name));
        if denied.is_empty() {
            return Gate::Proceed(None);
        }
        let refused: Vec<OffsetFetchResponseTopic> = denied
            .into_iter()
            .map(|t| OffsetFetchResponseTopic {
                name: t.name,
                partitions: t
                    .partition_indexes
                    .iter()
                    .map(|p| OffsetFetchResponsePartition {
                        partition_index: *p,
                        committed_offset: -1,
                        committed_leader_epoch: -1,
                        error_code: TAF.code(),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            })
            .collect();
        return patch!(OffsetFetch, |resp| resp.topics.extend(refused));
    }
    let denied_groups = take_denied(&mut r.groups, |g| a.group(Describe, &g.group_id));
    let mut refused_topics: Vec<(String, Vec<OffsetFetchResponseTopics>)> = Vec::new();
    let mut filter_all: Vec<String> = Vec::new();
    for g in &mut r.groups {
        match g.topics.as_mut() {
            None => filter_all.push(g.group_id.clone()),
            Some(topics) => {
                let denied = take_denied(topics, |t| a.topic(Describe, &t.name));
                if !denied.is_empty() {
                    refused_topics.push((
                        g.group_id.clone(),
                        denied
                            .into_iter()
                            .map(|t| OffsetFetchResponseTopics {
                                name: t.name,
                                partitions: t
                                    .partition_indexes
                                    .iter()
                                    .map(|p| OffsetFetchResponsePartitions {
                                        partition_index: *p,
                                        committed_offset: -1,
                                        committed_leader_epoch: -1,
                                        error_code: TAF.code(),
                                        ..Default::default()
                                    })
                                    .collect(),
                                ..Default::default()
                            })
                            .collect(),
                    ));
                }
            }
        }
    }
    if denied_groups.is_empty() && refused_topics.is_empty() && filter_all.is_empty() {
        return Gate::Proceed(None);
    }
    let describable = (!filter_all.is_empty()).then(|| a.describable_topics());
    patch!(OffsetFetch, |resp| {
        for g in &mut resp.groups {
            if let Some(d) = &describable {
                if filter_all.contains(&g.group_id) {
                    g.topics.retain(|t| d.contains(&t.name));
                }
            }
            if g.error_code == ErrorCode::NONE.code() {
                if let Some((_, refused)) =
                    refused_topics.iter_mut().find(|(id, _)| *id == g.group_id)
                {
                    g.topics.append(refused);
                }
            }
        }
        resp.groups
            .extend(denied_groups.into_iter().map(|g| OffsetFetchResponseGroup {
                group_id: g.group_id,
                error_code: GAF.code(),
                ..Default::default()
            }));
    })
}

/// The share-group state RPCs: inter-broker, CLUSTER_ACTION on the cluster (Kafka's
/// `authorizeClusterOperation`), every share-partition refused otherwise.
fn share_state_gate<B: Into<ResponseBody>>(a: &Authz, refused: impl FnOnce() -> B) -> Gate {
    if a.is_broker() {
        Gate::Proceed(None)
    } else {
        respond(refused())
    }
}

/// Every call answered CLUSTER_AUTHORIZATION_FAILED.
fn refused(calls: Vec<share_state::Call>) -> Vec<(Uuid, i32, rill_share::Response)> {
    calls
        .into_iter()
        .map(|c| {
            let answer = rill_share::Response::error(&c.request, CAF);
            (c.topic_id, c.partition, answer)
        })
        .collect()
}

fn find_coordinator(a: &Authz, r: &mut FindCoordinatorRequest, version: i16) -> Gate {
    let check = |key_type: i8, key: &str| -> Option<ErrorCode> {
        match key_type {
            0 if !a.group(Describe, key) => Some(GAF),
            1 if !a.transactional_id(Describe, key) => Some(TIAF),
            // SHARE (v6+; older versions are the handler's INVALID_REQUEST): only brokers
            // look share coordinators up.
            2 if version >= 6 && !a.is_broker() => Some(CAF),
            _ => None,
        }
    };
    if version < 4 {
        return match check(r.key_type, &r.key) {
            None => Gate::Proceed(None),
            Some(code) => respond(FindCoordinatorResponse {
                error_code: code.code(),
                error_message: Some(code.name().to_string()),
                node_id: -1,
                host: String::new(),
                port: -1,
                ..Default::default()
            }),
        };
    }
    let key_type = r.key_type;
    let mut refused = Vec::new();
    r.coordinator_keys.retain(|key| match check(key_type, key) {
        None => true,
        Some(code) => {
            refused.push(Coordinator {
                key: key.clone(),
                node_id: -1,
                host: String::new(),
                port: -1,
                error_code: code.code(),
                error_message: Some(code.name().to_string()),
                ..Default::default()
            });
            false
        }
    });
    if refused.is_empty() {
        return Gate::Proceed(None);
    }
    if r.coordinator_keys.is_empty() {
        return respond(FindCoordinatorResponse {
            coordinators: refused,
            ..Default::default()
        });
    }
    patch!(FindCoordinator, |resp| resp.coordinators.extend(refused))
}

fn describe_groups(a: &Authz, r: &mut DescribeGroupsRequest, version: i16) -> Gate {
    let denied = take_denied(&mut r.groups, |g| a.group(Describe, g));
    let ops: Option<Vec<(String, i32)>> =
        (version >= 3 && r.include_authorized_operations).then(|| {
            r.groups
                .iter()
                .map(|g| (g.clone(), a.operations(ResourceType::Group, g)))
                .collect()
        });
    if denied.is_empty() && ops.is_none() {
        return Gate::Proceed(None);
    }
    patch!(DescribeGroups, |resp| {
        if let Some(ops) = &ops {
            for g in &mut resp.groups {
                if g.error_code == ErrorCode::NONE.code() {
                    if let Some((_, bits)) = ops.iter().find(|(id, _)| *id == g.group_id) {
                        g.authorized_operations = *bits;
                    }
                }
            }
        }
        resp.groups
            .extend(denied.into_iter().map(|g| DescribedGroup {
                error_code: GAF.code(),
                group_id: g,
                ..Default::default()
            }));
    })
}

/// Kafka's `handleConsumerGroupHeartbeat`: READ on the group, then DESCRIBE on every
/// subscribed topic name (a client may not learn of topics it cannot describe).
fn consumer_group_heartbeat(a: &Authz, r: &ConsumerGroupHeartbeatRequest) -> Gate {
    let refused = |code: ErrorCode| {
        Gate::Respond(
            ConsumerGroupHeartbeatResponse {
                error_code: code.code(),
                ..Default::default()
            }
            .into(),
        )
    };
    if !a.group(Read, &r.group_id) {
        return refused(GAF);
    }
    let topics_denied = r
        .subscribed_topic_names
        .as_ref()
        .is_some_and(|names| names.iter().any(|t| !a.topic(Describe, t)));
    if topics_denied {
        return refused(TAF);
    }
    Gate::Proceed(None)
}

/// DESCRIBE on each group; the authorized operations when asked.
fn consumer_group_describe(a: &Authz, r: &mut ConsumerGroupDescribeRequest) -> Gate {
    let denied = take_denied(&mut r.group_ids, |g| a.group(Describe, g));
    let ops: Option<Vec<(String, i32)>> = r.include_authorized_operations.then(|| {
        r.group_ids
            .iter()
            .map(|g| (g.clone(), a.operations(ResourceType::Group, g)))
            .collect()
    });
    if denied.is_empty() && ops.is_none() {
        return Gate::Proceed(None);
    }
    patch!(ConsumerGroupDescribe, |resp| {
        if let Some(ops) = &ops {
            for g in &mut resp.groups {
                if g.error_code == ErrorCode::NONE.code() {
                    if let Some((_, bits)) = ops.iter().find(|(id, _)| *id == g.group_id) {
                        g.authorized_operations = *bits;
                    }
                }
            }
        }
        resp.groups.extend(denied.into_iter().map(|g| {
            consumer_group_describe_response::DescribedGroup {
                error_code: GAF.code(),
                error_message: Some("Group authorization failed.".into()),
                group_id: g,
                ..Default::default()
            }
        }));
    })
}

/// Kafka's `handleShareGroupHeartbeat`: READ on the group, then DESCRIBE on every
/// subscribed topic name.
fn share_group_heartbeat(a: &Authz, r: &ShareGroupHeartbeatRequest) -> Gate {
    let refused = |code: ErrorCode| {
        Gate::Respond(
            ShareGroupHeartbeatResponse {
                error_code: code.code(),
                ..Default::default()
            }
            .into(),
        )
    };
    if !a.group(Read, &r.group_id) {
        return refused(GAF);
    }
    let topics_denied = r
        .subscribed_topic_names
        .as_ref()
        .is_some_and(|names| names.iter().any(|t| !a.topic(Describe, t)));
    if topics_denied {
        return refused(TAF);
    }
    Gate::Proceed(None)
}

/// Kafka's `handleShareFetchRequest`: READ on the group, then READ on each topic; the
/// partitions of a refused topic are answered TOPIC_AUTHORIZATION_FAILED and never join
/// the share session.
fn share_fetch(a: &Authz, r: &mut ShareFetchRequest) -> Gate {
    let group = r.group_id.as_deref().unwrap_or_default();
    if !a.group(Read, group) {
        return respond(ShareFetchResponse {
            error_code: GAF.code(),
            ..Default::default()
        });
    }
    let image = a.image();
    let denied = take_denied(&mut r.topics, |t| {
        // An unknown topic id is the handler's to answer (UNKNOWN_TOPIC_ID).
        image
            .topics
            .get(&t.topic_id)
            .is_none_or(|t| a.topic(Read, &t.name))
    });
    if denied.is_empty() {
        return Gate::Proceed(None);
    }
    let refused: Vec<share_fetch_response::ShareFetchableTopicResponse> = denied
        .into_iter()
        .map(|t| share_fetch_response::ShareFetchableTopicResponse {
            topic_id: t.topic_id,
            partitions: t
                .partitions
                .iter()
                .map(|p| share_fetch_response::PartitionData {
                    partition_index: p.partition_index,
                    error_code: TAF.code(),
                    records: Some(Default::default()),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        })
        .collect();
    patch!(ShareFetch, |resp| resp.responses.extend(refused))
}

/// Kafka's `handleShareAcknowledgeRequest`: READ on the group, then READ on each topic.
fn share_acknowledge(a: &Authz, r: &mut ShareAcknowledgeRequest) -> Gate {
    let group = r.group_id.as_deref().unwrap_or_default();
    if !a.group(Read, group) {
        return respond(ShareAcknowledgeResponse {
            error_code: GAF.code(),
            ..Default::default()
        });
    }
    let image = a.image();
    let denied = take_denied(&mut r.topics, |t| {
        image
            .topics
            .get(&t.topic_id)
            .is_none_or(|t| a.topic(Read, &t.name))
    });
    if denied.is_empty() {
        return Gate::Proceed(None);
    }
    let refused: Vec<share_acknowledge_response::ShareAcknowledgeTopicResponse> = denied
        .into_iter()
        .map(
            |t| share_acknowledge_response::ShareAcknowledgeTopicResponse {
                topic_id: t.topic_id,
                partitions: t
                    .partitions
                    .iter()
                    .map(|p| share_acknowledge_response::PartitionData {
                        partition_index: p.partition_index,
                        error_code: TAF.code(),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            },
        )
        .collect();
    patch!(ShareAcknowledge, |resp| resp.responses.extend(refused))
}

/// Kafka's `handleShareGroupDescribe`: DESCRIBE on each group; the authorized operations
/// when asked; and (v1) a group whose members subscribe to or are assigned a topic the
/// client may not DESCRIBE is answered TOPIC_AUTHORIZATION_FAILED instead of shown.
fn share_group_describe(a: &Authz, r: &mut ShareGroupDescribeRequest) -> Gate {
    let denied = take_denied(&mut r.group_ids, |g| a.group(Describe, g));
    let ops: Option<Vec<(String, i32)>> = r.include_authorized_operations.then(|| {
        r.group_ids
            .iter()
            .map(|g| (g.clone(), a.operations(ResourceType::Group, g)))
            .collect()
    });
    let topic_allowed = a
        .enabled()
        .then(|| a.checker(Describe, ResourceType::Topic));
    if denied.is_empty() && ops.is_none() && topic_allowed.is_none() {
        return Gate::Proceed(None);
    }
    patch!(ShareGroupDescribe, |resp| {
        for g in &mut resp.groups {
            if g.error_code != ErrorCode::NONE.code() {
                continue;
            }
            let hidden = topic_allowed.as_ref().is_some_and(|allowed| {
                g.members.iter().any(|m| {
                    m.subscribed_topic_names.iter().any(|t| !allowed(t))
                        || m.assignment
                            .topic_partitions
                            .iter()
                            .any(|tp| !allowed(&tp.topic_name))
                })
            });
            if hidden {
                *g = share_group_describe_response::DescribedGroup {
                    error_code: TAF.code(),
                    error_message: Some(
                        "The described group uses topics that the client is not authorized \
                         to describe."
                            .into(),
                    ),
                    group_id: std::mem::take(&mut g.group_id),
                    ..Default::default()
                };
            } else if let Some((_, bits)) = ops
                .as_ref()
                .and_then(|ops| ops.iter().find(|(id, _)| *id == g.group_id))
            {
                g.authorized_operations = *bits;
            }
        }
        resp.groups.extend(denied.into_iter().map(|g| {
            share_group_describe_response::DescribedGroup {
                error_code: GAF.code(),
                group_id: g,
                ..Default::default()
            }
        }));
    })
}

fn list_groups(a: &Authz) -> Gate {
    if !a.enabled() || a.cluster(Describe) {
        return Gate::Proceed(None);
    }
    let checker = a.checker(Describe, ResourceType::Group);
    patch!(ListGroups, |resp| resp
        .groups
        .retain(|g| checker(&g.group_id)))
}

fn delete_groups(a: &Authz, r: &mut DeleteGroupsRequest) -> Gate {
    let denied = take_denied(&mut r.groups_names, |g| a.group(Delete, g));
    if denied.is_empty() {
        return Gate::Proceed(None);
    }
    let refused: Vec<DeletableGroupResult> = denied
        .into_iter()
        .map(|g| DeletableGroupResult {
            group_id: g,
            error_code: GAF.code(),
            ..Default::default()
        })
        .collect();
    if r.groups_names.is_empty() {
        return respond(DeleteGroupsResponse {
            results: refused,
            ..Default::default()
        });
    }
    patch!(DeleteGroups, |resp| resp.results.extend(refused))
}

fn offset_delete(a: &Authz, r: &mut OffsetDeleteRequest) -> Gate {
    if !a.group(Delete, &r.group_id) {
        return respond(OffsetDeleteResponse {
            error_code: GAF.code(),
            ..Default::default()
        });
    }
    let denied = take_denied(&mut r.topics, |t| a.topic(Read, &t.name));
    if denied.is_empty() {
        return Gate::Proceed(None);
    }
    let refused: Vec<OffsetDeleteResponseTopic> = denied
        .into_iter()
        .map(|t| OffsetDeleteResponseTopic {
            name: t.name,
            partitions: t
                .partitions
                .iter()
                .map(|p| OffsetDeleteResponsePartition {
                    partition_index: p.partition_index,
                    error_code: TAF.code(),
                })
                .collect(),
        })
        .collect();
    patch!(OffsetDelete, |resp| resp.topics.extend(refused))
}

fn create_topics(a: &Authz, r: &mut CreateTopicsRequest) -> Gate {
    let cluster = a.cluster(Create);
    let denied = take_denied(&mut r.topics, |t| cluster || a.topic(Create, &t.name));
    let undescribable: Vec<String> = r
        .topics
        .iter()
        .filter(|t| !a.topic(DescribeConfigs, &t.name))
        .map(|t| t.name.clone())
        .collect();
    if denied.is_empty() && undescribable.is_empty() {
        return Gate::Proceed(None);
    }
    let refused: Vec<CreatableTopicResult> = denied
        .into_iter()
        .map(|t| CreatableTopicResult {
            name: t.name,
            error_code: TAF.code(),
            error_message: Some("Authorization failed.".into()),
            num_partitions: -1,
            replication_factor: -1,
            ..Default::default()
        })
        .collect();
    patch!(CreateTopics, |resp| {
        for t in &mut resp.topics {
            if t.error_code == ErrorCode::NONE.code() && undescribable.contains(&t.name) {
                t.configs = Some(Vec::new());
                t.topic_config_error_code = TAF.code();
            }
        }
        resp.topics.extend(refused);
    })
}

fn delete_topics(a: &Authz, r: &mut DeleteTopicsRequest, version: i16) -> Gate {
    if a.cluster(Delete) {
        return Gate::Proceed(None);
    }
    let mut refused: Vec<DeletableTopicResult> = Vec::new();
    let refuse = |name: Option<String>, topic_id: Uuid| DeletableTopicResult {
        name,
        topic_id,
        error_code: TAF.code(),
        error_message: Some("Authorization failed.".into()),
        ..Default::default()
    };
    if version < 6 {
        for name in take_denied(&mut r.topic_names, |n| a.topic(Delete, n)) {
            refused.push(refuse(Some(name), Uuid::ZERO));
        }
    } else {
        let image = a.image();
        for t in take_denied(&mut r.topics, |t| match &t.name {
            Some(name) => a.topic(Delete, name),
            None => image
                .topics
                .get(&t.topic_id)
                .is_none_or(|known| a.topic(Delete, &known.name)),
        }) {
            match t.name {
                Some(name) => refused.push(refuse(Some(name), Uuid::ZERO)),
                None => {
                    // The name is told only to a principal that may describe the topic.
                    let name = image
                        .topics
                        .get(&t.topic_id)
                        .map(|known| known.name.clone())
                        .filter(|n| a.topic(Describe, n));
                    refused.push(refuse(name, t.topic_id));
                }
            }
        }
    }
    if refused.is_empty() {
        return Gate::Proceed(None);
    }
    if r.topic_names.is_empty() && r.topics.is_empty() {
        return respond(DeleteTopicsResponse {
            responses: refused,
            ..Default::default()
        });
    }
    patch!(DeleteTopics, |resp| resp.responses.extend(refused))
}

fn delete_records(a: &Authz, r: &mut DeleteRecordsRequest) -> Gate {
    let denied = take_denied(&mut r.topics, |t| a.topic(Delete, &t.name));
    if denied.is_empty() {
        return Gate::Proceed(None);
    }
    let refused: Vec<DeleteRecordsTopicResult> = denied
        .into_iter()
        .map(|t| DeleteRecordsTopicResult {
            name: t.name,
            partitions: t
                .partitions
                .iter()
                .map(|p| DeleteRecordsPartitionResult {
                    partition_index: p.partition_index,
                    low_watermark: -1,
                    error_code: TAF.code(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        })
        .collect();
    patch!(DeleteRecords, |resp| resp.topics.extend(refused))
}

fn init_producer_id(a: &Authz, r: &InitProducerIdRequest) -> Gate {
    let refused = |code: ErrorCode| {
        respond(InitProducerIdResponse {
            error_code: code.code(),
            producer_id: -1,
            producer_epoch: -1,
            ..Default::default()
        })
    };
    match &r.transactional_id {
        Some(id) if !a.transactional_id(Write, id) => refused(TIAF),
        Some(_) => Gate::Proceed(None),
        // An idempotent producer: IDEMPOTENT_WRITE on the cluster, or WRITE on some topic.
        None if a.cluster(IdempotentWrite) || a.any_of_type(Write, ResourceType::Topic) => {
            Gate::Proceed(None)
        }
        None => refused(CAF),
    }
}

/// The config resources `op` is refused on, taken out of `resources`, each turned into its
/// response entry by `refuse(resource_type, resource_name, error)`.
fn refuse_config_resources<R, T>(
    a: &Authz,
    op: AclOperation,
    resources: &mut Vec<R>,
    key: impl Fn(&R) -> (i8, &str),
    refuse: impl Fn(i8, String, ErrorCode) -> T,
) -> Vec<T> {
    take_denied(resources, |res| {
        let (rt, name) = key(res);
        config_allowed(a, op, rt, name)
    })
    .iter()
    .map(|res| {
        let (rt, name) = key(res);
        refuse(rt, name.to_string(), config_error(rt))
    })
    .collect()
}

/// The gate of a config API: `$op` on each resource, the refused ones answered with
/// `$result` entries in the response's `$field`.
macro_rules! config_gate {
    ($name:ident, $request:ty, $op:expr, $variant:ident, $field:ident, $result:ident) => {
        fn $name(a: &Authz, r: &mut $request) -> Gate {
            let refused = refuse_config_resources(
                a,
                $op,
                &mut r.resources,
                |res| (res.resource_type, res.resource_name.as_str()),
                |resource_type, resource_name, code| $result {
                    error_code: code.code(),
                    error_message: Some(code.name().to_string()),
                    resource_type,
                    resource_name,
                    ..Default::default()
                },
            );
            if refused.is_empty() {
                return Gate::Proceed(None);
            }
            patch!($variant, |resp| resp.$field.extend(refused))
        }
    };
}

config_gate!(
    describe_configs,
    DescribeConfigsRequest,
    DescribeConfigs,
    DescribeConfigs,
    results,
    DescribeConfigsResult
);
config_gate!(
    alter_configs,
    AlterConfigsRequest,
    AlterConfigs,
    AlterConfigs,
    responses,
    AlterConfigsResourceResponse
);
config_gate!(
    incremental_alter_configs,
    IncrementalAlterConfigsRequest,
    AlterConfigs,
    IncrementalAlterConfigs,
    responses,
    IncrementalResourceResponse
);

fn create_partitions(a: &Authz, r: &mut CreatePartitionsRequest) -> Gate {
    let denied = take_denied(&mut r.topics, |t| a.topic(Alter, &t.name));
    if denied.is_empty() {
        return Gate::Proceed(None);
    }
    let refused: Vec<CreatePartitionsTopicResult> = denied
        .into_iter()
        .map(|t| CreatePartitionsTopicResult {
            name: t.name,
            error_code: TAF.code(),
            error_message: Some("The topic authorization is failed.".into()),
            ..Default::default()
        })
        .collect();
    patch!(CreatePartitions, |resp| resp.results.extend(refused))
}

fn describe_cluster(a: &Authz, r: &DescribeClusterRequest) -> Gate {
    if !r.include_cluster_authorized_operations {
        return Gate::Proceed(None);
    }
    let bits = a.cluster_operations();
    patch!(DescribeCluster, |resp| {
        if resp.error_code == ErrorCode::NONE.code() {
            resp.cluster_authorized_operations = bits;
        }
    })
}

fn offset_for_leader_epoch(a: &Authz, r: &mut OffsetForLeaderEpochRequest) -> Gate {
    if a.is_broker() {
        return Gate::Proceed(None);
    }
    let denied = take_denied(&mut r.topics, |t| a.topic(Describe, &t.topic));
    if denied.is_empty() {
        return Gate::Proceed(None);
    }
    let refused: Vec<OffsetForLeaderTopicResult> = denied
        .into_iter()
        .map(|t| OffsetForLeaderTopicResult {
            topic: t.topic,
            partitions: t
                .partitions
                .iter()
                .map(|p| EpochEndOffset {
                    error_code: TAF.code(),
                    partition: p.partition,
                    leader_epoch: -1,
                    end_offset: -1,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        })
        .collect();
    patch!(OffsetForLeaderEpoch, |resp| resp.topics.extend(refused))
}

fn elect_leaders(a: &Authz, r: &ElectLeadersRequest) -> Gate {
    cluster_or(a, Alter, || {
        ElectLeadersResponse {
            error_code: CAF.code(),
            replica_election_results: r
                .topic_partitions
                .iter()
                .flatten()
                .map(|t| ReplicaElectionResult {
                    topic: t.topic.clone(),
                    partition_result: t
                        .partitions
                        .iter()
                        .map(|p| PartitionResult {
                            partition_id: *p,
                            error_code: CAF.code(),
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
        .into()
    })
}

fn alter_reassignments(a: &Authz, r: &AlterPartitionReassignmentsRequest) -> Gate {
    use alter_partition_reassignments_response::{
        ReassignablePartitionResponse, ReassignableTopicResponse,
    };
    cluster_or(a, Alter, || {
        AlterPartitionReassignmentsResponse {
            error_code: CAF.code(),
            responses: r
                .topics
                .iter()
                .map(|t| ReassignableTopicResponse {
                    name: t.name.clone(),
                    partitions: t
                        .partitions
                        .iter()
                        .map(|p| ReassignablePartitionResponse {
                            partition_index: p.partition_index,
                            error_code: CAF.code(),
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
        .into()
    })
}

/// AlterReplicaLogDirs needs ALTER on the cluster; refused, every partition says so.
fn alter_replica_log_dirs(
    a: &Authz,
    r: &rill_protocol::generated::alter_replica_log_dirs_request::AlterReplicaLogDirsRequest,
) -> Gate {
    use rill_protocol::generated::alter_replica_log_dirs_response::{
        AlterReplicaLogDirPartitionResult, AlterReplicaLogDirTopicResult,
        AlterReplicaLogDirsResponse,
    };
    cluster_or(a, Alter, || {
        AlterReplicaLogDirsResponse {
            results: r
                .dirs
                .iter()
                .flat_map(|d| &d.topics)
                .map(|t| AlterReplicaLogDirTopicResult {
                    topic_name: t.name.clone(),
                    partitions: t
                        .partitions
                        .iter()
                        .map(|p| AlterReplicaLogDirPartitionResult {
                            partition_index: *p,
                            error_code: CAF.code(),
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
        .into()
    })
}

fn update_features(a: &Authz, r: &UpdateFeaturesRequest) -> Gate {
    use update_features_response::UpdatableFeatureResult;
    cluster_or(a, Alter, || {
        UpdateFeaturesResponse {
            error_code: CAF.code(),
            results: r
                .feature_updates
                .iter()
                .map(|f| UpdatableFeatureResult {
                    feature: f.feature.clone(),
                    error_code: CAF.code(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
        .into()
    })
}

fn describe_topic_partitions(a: &Authz, r: &mut DescribeTopicPartitionsRequest) -> Gate {
    let all = r.topics.is_empty();
    let cursor = r.cursor.as_ref().map(|c| c.topic_name.clone());
    let mut refused: Vec<DescribeTopicPartitionsResponseTopic> = Vec::new();
    if !all {
        // The cursor's topic stays in the request, refused or not: the handler checks
        // that it is listed, as Kafka does before authorizing.
        let denied = take_denied(&mut r.topics, |t| {
            a.topic(Describe, &t.name) || cursor.as_deref() == Some(t.name.as_str())
        });
        refused.extend(
            denied
                .into_iter()
                .map(|t| DescribeTopicPartitionsResponseTopic {
                    error_code: TAF.code(),
                    name: Some(t.name),
                    topic_id: Uuid::ZERO,
                    ..Default::default()
                }),
        );
    }
    let checker = a.checker(Describe, ResourceType::Topic);
    let ops = {
        let a = a.clone();
        move |name: &str| a.operations(ResourceType::Topic, name)
    };
    patch!(DescribeTopicPartitions, |resp| {
        resp.topics
            .retain(|t| t.name.as_deref().is_some_and(&checker));
        for t in &mut resp.topics {
            if let Some(n) = &t.name {
                t.topic_authorized_operations = ops(n);
            }
        }
        resp.topics.extend(refused);
    })
}

fn add_partitions_to_txn(a: &Authz, r: &mut AddPartitionsToTxnRequest, version: i16) -> Gate {
    let result_of = |topics: &[add_partitions_to_txn_request::AddPartitionsToTxnTopic],
                     code: &dyn Fn(&str) -> ErrorCode| {
        topics
            .iter()
            .map(|t| AddPartitionsToTxnTopicResult {
                name: t.name.clone(),
                results_by_partition: t
                    .partitions
                    .iter()
                    .map(|p| AddPartitionsToTxnPartitionResult {
                        partition_index: *p,
                        partition_error_code: code(&t.name).code(),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            })
            .collect::<Vec<_>>()
    };
    if version >= 4 {
        // Batched by brokers verifying transactions (KIP-890): a broker's request.
        if a.is_broker() {
            return Gate::Proceed(None);
        }
        return respond(AddPartitionsToTxnResponse {
            error_code: CAF.code(),
            results_by_transaction: r
                .transactions
                .iter()
                .map(|t| AddPartitionsToTxnResult {
                    transactional_id: t.transactional_id.clone(),
                    topic_results: result_of(&t.topics, &|_| CAF),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        });
    }
    if !a.transactional_id(Write, &r.v3_and_below_transactional_id) {
        return respond(AddPartitionsToTxnResponse {
            results_by_topic_v3_and_below: result_of(&r.v3_and_below_topics, &|_| TIAF),
            ..Default::default()
        });
    }
    // Any topic refused, and nothing is added: the others are OPERATION_NOT_ATTEMPTED.
    let refused: Vec<&str> = r
        .v3_and_below_topics
        .iter()
        .filter(|t| !a.topic(Write, &t.name))
        .map(|t| t.name.as_str())
        .collect();
    if refused.is_empty() {
        return Gate::Proceed(None);
    }
    respond(AddPartitionsToTxnResponse {
        results_by_topic_v3_and_below: result_of(&r.v3_and_below_topics, &|name| {
            if refused.contains(&name) {
                TAF
            } else {
                ErrorCode::OPERATION_NOT_ATTEMPTED
            }
        }),
        ..Default::default()
    })
}

fn txn_offset_commit(a: &Authz, r: &mut TxnOffsetCommitRequest) -> Gate {
    let with = |topics: &[txn_offset_commit_request::TxnOffsetCommitRequestTopic],
                code: ErrorCode| {
        topics
            .iter()
            .map(|t| TxnOffsetCommitResponseTopic {
                name: t.name.clone(),
                partitions: t
                    .partitions
                    .iter()
                    .map(|p| TxnOffsetCommitResponsePartition {
                        partition_index: p.partition_index,
                        error_code: code.code(),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            })
            .collect::<Vec<_>>()
    };
    if !a.transactional_id(Write, &r.transactional_id) {
        return respond(TxnOffsetCommitResponse {
            topics: with(&r.topics, TIAF),
            ..Default::default()
        });
    }
    if !a.group(Read, &r.group_id) {
        return respond(TxnOffsetCommitResponse {
            topics: with(&r.topics, GAF),
            ..Default::default()
        });
    }
    let denied = take_denied(&mut r.topics, |t| a.topic(Read, &t.name));
    if denied.is_empty() {
        return Gate::Proceed(None);
    }
    let refused = with(&denied, TAF);
    patch!(TxnOffsetCommit, |resp| resp.topics.extend(refused))
}

fn write_txn_markers(a: &Authz, r: &WriteTxnMarkersRequest) -> Gate {
    if a.cluster(Alter) || a.is_broker() {
        return Gate::Proceed(None);
    }
    respond(WriteTxnMarkersResponse {
        markers: r
            .markers
            .iter()
            .map(|m| WritableTxnMarkerResult {
                producer_id: m.producer_id,
                topics: m
                    .topics
                    .iter()
                    .map(|t| WritableTxnMarkerTopicResult {
                        name: t.name.clone(),
                        partitions: t
                            .partition_indexes
                            .iter()
                            .map(|p| WritableTxnMarkerPartitionResult {
                                partition_index: *p,
                                error_code: CAF.code(),
                                ..Default::default()
                            })
                            .collect(),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    })
}

fn describe_transactions(a: &Authz, r: &mut DescribeTransactionsRequest) -> Gate {
    let denied = take_denied(&mut r.transactional_ids, |id| {
        a.transactional_id(Describe, id)
    });
    if !a.enabled() {
        return Gate::Proceed(None);
    }
    let checker = a.checker(Describe, ResourceType::Topic);
    patch!(DescribeTransactions, |resp| {
        // The partitions of topics the principal may not describe are left out.
        for state in &mut resp.transaction_states {
            state.topics.retain(|t| checker(&t.topic));
        }
        resp.transaction_states
            .extend(denied.into_iter().map(|id| TransactionState {
                error_code: TIAF.code(),
                transactional_id: id,
                transaction_timeout_ms: -1,
                transaction_start_time_ms: -1,
                producer_id: -1,
                producer_epoch: -1,
                ..Default::default()
            }));
    })
}

fn list_transactions(a: &Authz) -> Gate {
    if !a.enabled() {
        return Gate::Proceed(None);
    }
    let checker = a.checker(Describe, ResourceType::TransactionalId);
    patch!(ListTransactions, |resp| resp
        .transaction_states
        .retain(|s| checker(&s.transactional_id)))
}

fn describe_producers(a: &Authz, r: &mut DescribeProducersRequest) -> Gate {
    let denied = take_denied(&mut r.topics, |t| a.topic(Read, &t.name));
    if denied.is_empty() {
        return Gate::Proceed(None);
    }
    let refused: Vec<TopicResponse> = denied
        .into_iter()
        .map(|t| TopicResponse {
            name: t.name,
            partitions: t
                .partition_indexes
                .iter()
                .map(|p| PartitionResponse {
                    partition_index: *p,
                    error_code: TAF.code(),
                    error_message: Some(TAF.name().to_string()),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        })
        .collect();
    patch!(DescribeProducers, |resp| resp.topics.extend(refused))
}

fn alter_user_scram_credentials(a: &Authz, r: &AlterUserScramCredentialsRequest) -> Gate {
    use alter_user_scram_credentials_response::AlterUserScramCredentialsResult;
    cluster_or(a, Alter, || {
        let mut users: Vec<&String> = Vec::new();
        for name in r
            .deletions
            .iter()
            .map(|d| &d.name)
            .chain(r.upsertions.iter().map(|u| &u.name))
        {
            if !users.contains(&name) {
                users.push(name);
            }
        }
        AlterUserScramCredentialsResponse {
            results: users
                .into_iter()
                .map(|u| AlterUserScramCredentialsResult {
                    user: u.clone(),
                    error_code: CAF.code(),
                    error_message: Some("Cluster authorization failed.".into()),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
        .into()
    })
}
