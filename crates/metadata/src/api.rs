//! The controller's inputs and outputs: one request type per event the active controller
//! handles, and its answer.
//!
//! These are the fields the controller decides on, not the wire messages: the broker
//! shell maps a Kafka request (whatever version it came in) onto one of these and maps
//! the answer back, copying the error codes unchanged. Error codes are Kafka's
//! ([`rill_protocol::ErrorCode`]).
//!
//! Every type here is serde-serializable because a node that is not the active
//! controller forwards events to it over the quorum's RPC (postcard); `Uuid` and
//! `ErrorCode` come from `rill-protocol`, which has no serde, so their fields go through
//! the two remote definitions at the end of this file.

use rill_protocol::{ErrorCode, Uuid};
use serde::{Deserialize, Serialize};

use crate::image::Endpoint;
use crate::record::MetadataRecord;

/// One event for the controller's single-threaded loop.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ControllerEvent {
    BrokerRegistration(BrokerRegistrationRequest),
    BrokerHeartbeat(BrokerHeartbeatRequest),
    CreateTopics(CreateTopicsRequest),
    DeleteTopics(DeleteTopicsRequest),
    CreatePartitions(CreatePartitionsRequest),
    AlterPartition(AlterPartitionRequest),
    ElectLeaders(ElectLeadersRequest),
    AlterPartitionReassignments(AlterPartitionReassignmentsRequest),
    AllocateProducerIds(AllocateProducerIdsRequest),
    IncrementalAlterConfigs(IncrementalAlterConfigsRequest),
    /// An operator removes a broker's registration (Kafka's UnregisterBroker, for a
    /// broker that is gone for good).
    UnregisterBroker(UnregisterBrokerRequest),
    /// The active controller found the broker's process gone (its quorum port refused a
    /// connection): fence it now rather than when its lease lapses. Rill's own; Kafka
    /// waits for the session timeout.
    BrokerProcessGone(BrokerProcessGoneRequest),
    /// UpdateFeatures: finalize feature levels (all of them or none).
    UpdateFeatures(UpdateFeaturesRequest),
    /// AlterUserScramCredentials: credentials the broker derived from the client's salted
    /// passwords, and deletions.
    AlterUserScramCredentials(AlterUserScramCredentialsRequest),
    /// CreateAcls: the bindings to store, in request order.
    CreateAcls(CreateAclsRequest),
    /// DeleteAcls: the filters whose matching bindings to remove.
    DeleteAcls(DeleteAclsRequest),
    /// AlterClientQuotas: quotas to set and remove, per entity.
    AlterClientQuotas(AlterClientQuotasRequest),
    CreateDelegationToken(crate::delegation_tokens::CreateDelegationTokenRequest),
    RenewDelegationToken(crate::delegation_tokens::ChangeDelegationTokenRequest),
    ExpireDelegationToken(crate::delegation_tokens::ChangeDelegationTokenRequest),
    /// AssignReplicasToDirs (KIP-858): the log directories a broker placed its replicas
    /// in.
    AssignReplicasToDirs(AssignReplicasToDirsRequest),
    /// Tiered storage: a partition leader's change to one of its remote segments (Rill's
    /// own; Kafka's leaders write `__remote_log_metadata` instead, see
    /// [`crate::remote_log`]).
    RemoteLogSegmentUpdate(crate::remote_log::RemoteLogSegmentUpdateRequest),
}

/// What the controller decided: records to append to the metadata log (in this order,
/// as one batch) and the answer to send once they are committed.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ControllerResult {
    pub records: Vec<MetadataRecord>,
    pub response: ControllerResponse,
}

/// The answer to a [`ControllerEvent`]; `None` for the timer ([`crate::QuorumController::tick`]).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub enum ControllerResponse {
    #[default]
    None,
    BrokerRegistration(BrokerRegistrationResponse),
    BrokerHeartbeat(BrokerHeartbeatResponse),
    CreateTopics(Vec<CreatableTopicResult>),
    DeleteTopics(Vec<DeletableTopicResult>),
    CreatePartitions(Vec<CreatePartitionsTopicResult>),
    AlterPartition(AlterPartitionResponse),
    ElectLeaders(Vec<PartitionResult>),
    AlterPartitionReassignments(Vec<PartitionResult>),
    AllocateProducerIds(AllocateProducerIdsResponse),
    IncrementalAlterConfigs(Vec<AlterConfigsResourceResult>),
    UnregisterBroker(UnregisterBrokerResponse),
    /// Per feature asked for: its error (NONE when the whole update applies).
    UpdateFeatures(Vec<UpdateFeatureResult>),
    AlterUserScramCredentials(Vec<AlterUserScramCredentialsResult>),
    /// Per creation, in request order.
    CreateAcls(Vec<AclCreateResult>),
    /// Per filter, in request order.
    DeleteAcls(Vec<AclDeleteResult>),
    /// Per entity, in the order the request first names it.
    AlterClientQuotas(Vec<crate::client_quotas::ClientQuotaResult>),
    CreateDelegationToken(crate::delegation_tokens::CreateDelegationTokenResponse),
    /// A renewal's or an expiry's answer.
    ChangeDelegationToken(crate::delegation_tokens::DelegationTokenExpiryResponse),
    AssignReplicasToDirs(AssignReplicasToDirsResponse),
    /// NONE when the change is in the log.
    RemoteLogSegmentUpdate(#[serde(with = "ErrorCodeDef")] ErrorCode),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CreateAclsRequest {
    pub creations: Vec<crate::acl::StandardAcl>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AclCreateResult {
    #[serde(with = "ErrorCodeDef")]
    pub error_code: ErrorCode,
    pub error_message: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeleteAclsRequest {
    pub filters: Vec<crate::acl::AclBindingFilter>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AclDeleteResult {
    #[serde(with = "ErrorCodeDef")]
    pub error_code: ErrorCode,
    pub error_message: Option<String>,
    /// The bindings the filter matched, now deleted.
    pub deleted: Vec<crate::acl::StandardAcl>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UpdateFeaturesRequest {
    pub updates: Vec<crate::features::FeatureUpdate>,
    pub validate_only: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UpdateFeatureResult {
    pub feature: String,
    #[serde(with = "ErrorCodeDef")]
    pub error_code: ErrorCode,
    pub error_message: Option<String>,
}

/// One credential to store: the user, Kafka's mechanism type (1: SCRAM-SHA-256, 2:
/// SCRAM-SHA-512) and what the server keeps of the password.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScramCredentialUpsertion {
    pub name: String,
    pub mechanism: i8,
    pub salt: Vec<u8>,
    pub stored_key: Vec<u8>,
    pub server_key: Vec<u8>,
    pub iterations: i32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AlterUserScramCredentialsRequest {
    /// `(user, mechanism)` to delete.
    pub deletions: Vec<(String, i8)>,
    pub upsertions: Vec<ScramCredentialUpsertion>,
}

/// The outcome for one user named in the request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AlterUserScramCredentialsResult {
    pub user: String,
    #[serde(with = "ErrorCodeDef")]
    pub error_code: ErrorCode,
    pub error_message: Option<String>,
}

/// One entity's changes in an AlterClientQuotas request: `(key, Some(value))` sets a
/// quota, `(key, None)` removes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClientQuotaAlteration {
    pub entity: crate::client_quotas::QuotaEntity,
    pub ops: Vec<(String, Option<f64>)>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AlterClientQuotasRequest {
    pub entries: Vec<ClientQuotaAlteration>,
    pub validate_only: bool,
}

/// See [`ControllerEvent::BrokerProcessGone`]; the epoch is the registration that was
/// found gone, so that a broker that has registered again since is left alone.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BrokerProcessGoneRequest {
    pub broker_id: i32,
    pub broker_epoch: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UnregisterBrokerRequest {
    pub broker_id: i32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UnregisterBrokerResponse {
    #[serde(with = "ErrorCodeDef")]
    pub error_code: ErrorCode,
    pub error_message: Option<String>,
}

/// A broker asks to join the cluster (Kafka's BrokerRegistrationRequest).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BrokerRegistrationRequest {
    /// The configured `node.id`, or -1 to have one generated above
    /// `reserved.broker.max.id` (when `broker.id.generation.enable`).
    pub broker_id: i32,
    /// Unique per process start: a restart with the same id is told apart from a
    /// second live broker claiming it.
    #[serde(with = "UuidDef")]
    pub incarnation_id: Uuid,
    pub listeners: Vec<Endpoint>,
    pub rack: Option<String>,
    /// The ids of the broker's online log directories (KIP-858; Kafka's `LogDirs`).
    #[serde(with = "uuid_list")]
    pub log_dirs: Vec<Uuid>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BrokerRegistrationResponse {
    #[serde(with = "ErrorCodeDef")]
    pub error_code: ErrorCode,
    pub broker_id: i32,
    /// The broker's new epoch; the broker sends it with every heartbeat.
    pub broker_epoch: i64,
}

/// A broker's periodic heartbeat (Kafka's BrokerHeartbeatRequest).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BrokerHeartbeatRequest {
    pub broker_id: i32,
    pub broker_epoch: i64,
    /// The offset of the last metadata record the broker has applied.
    pub current_metadata_offset: i64,
    /// The broker wants to stay fenced (it is still starting up).
    pub want_fence: bool,
    /// The broker wants to shut down: the controller moves its leaderships away first.
    pub want_shut_down: bool,
    /// Log directories that failed on the broker (KIP-858): the controller moves the
    /// leaderships of the replicas in them away and takes them out of their ISRs.
    #[serde(with = "uuid_list")]
    pub offline_log_dirs: Vec<Uuid>,
}

/// AssignReplicasToDirs: where a broker placed replicas (Kafka's
/// `AssignReplicasToDirsRequest`, flattened).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AssignReplicasToDirsRequest {
    pub broker_id: i32,
    pub broker_epoch: i64,
    pub assignments: Vec<ReplicaDirAssignment>,
}

/// One replica of the requesting broker and the log directory it is in.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplicaDirAssignment {
    #[serde(with = "UuidDef")]
    pub topic_id: Uuid,
    pub partition: i32,
    #[serde(with = "UuidDef")]
    pub directory: Uuid,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AssignReplicasToDirsResponse {
    /// STALE_BROKER_EPOCH or BROKER_ID_NOT_REGISTERED for the whole request.
    #[serde(with = "ErrorCodeDef")]
    pub error_code: ErrorCode,
    /// Per assignment, in request order.
    pub results: Vec<ReplicaDirAssignmentResult>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplicaDirAssignmentResult {
    #[serde(with = "UuidDef")]
    pub topic_id: Uuid,
    pub partition: i32,
    #[serde(with = "ErrorCodeDef")]
    pub error_code: ErrorCode,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BrokerHeartbeatResponse {
    #[serde(with = "ErrorCodeDef")]
    pub error_code: ErrorCode,
    /// The broker has applied its own registration.
    pub is_caught_up: bool,
    pub is_fenced: bool,
    /// Controlled shutdown is complete: the broker leads nothing and may exit.
    pub should_shut_down: bool,
}

/// CreateTopics: one entry per topic.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct CreateTopicsRequest {
    pub topics: Vec<CreatableTopic>,
    pub validate_only: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CreatableTopic {
    pub name: String,
    /// -1 for `num.partitions`; must be -1 when `assignments` is given.
    pub num_partitions: i32,
    /// -1 for `default.replication.factor`; must be -1 when `assignments` is given.
    pub replication_factor: i16,
    /// Manual assignment: the replicas of partition 0, 1, … in order.
    pub assignments: Vec<Vec<i32>>,
    pub configs: Vec<(String, Option<String>)>,
}

impl CreatableTopic {
    /// A topic with `num_partitions` partitions of `replication_factor` replicas, placed
    /// by the controller.
    pub fn new(name: &str, num_partitions: i32, replication_factor: i16) -> Self {
        Self {
            name: name.to_string(),
            num_partitions,
            replication_factor,
            assignments: Vec::new(),
            configs: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CreatableTopicResult {
    pub name: String,
    #[serde(with = "UuidDef")]
    pub topic_id: Uuid,
    #[serde(with = "ErrorCodeDef")]
    pub error_code: ErrorCode,
    pub error_message: Option<String>,
    pub num_partitions: i32,
    pub replication_factor: i16,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct DeleteTopicsRequest {
    pub names: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeletableTopicResult {
    pub name: String,
    #[serde(with = "UuidDef")]
    pub topic_id: Uuid,
    #[serde(with = "ErrorCodeDef")]
    pub error_code: ErrorCode,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct CreatePartitionsRequest {
    pub topics: Vec<CreatePartitionsTopic>,
    pub validate_only: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CreatePartitionsTopic {
    pub name: String,
    /// The new total partition count.
    pub count: i32,
    /// Replicas of each new partition, or empty to let the controller place them.
    pub assignments: Vec<Vec<i32>>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CreatePartitionsTopicResult {
    pub name: String,
    #[serde(with = "ErrorCodeDef")]
    pub error_code: ErrorCode,
    pub error_message: Option<String>,
}

/// AlterPartition: a partition leader asks to change its ISR.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AlterPartitionRequest {
    pub broker_id: i32,
    pub broker_epoch: i64,
    pub partitions: Vec<AlterPartitionData>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AlterPartitionData {
    #[serde(with = "UuidDef")]
    pub topic_id: Uuid,
    pub partition_index: i32,
    /// The leader epoch the leader believes is current.
    pub leader_epoch: i32,
    /// The partition epoch the leader last saw; a stale one is refused, so that two
    /// concurrent changes cannot both apply.
    pub partition_epoch: i32,
    /// The proposed ISR: each member with the broker epoch the leader saw it at, or -1.
    pub new_isr: Vec<(i32, i64)>,
    pub leader_recovery_state: i8,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AlterPartitionResponse {
    /// Top-level error (STALE_BROKER_EPOCH, …): when set, no partition was changed.
    #[serde(with = "ErrorCodeDef")]
    pub error_code: ErrorCode,
    pub partitions: Vec<AlterPartitionResult>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AlterPartitionResult {
    #[serde(with = "UuidDef")]
    pub topic_id: Uuid,
    pub partition_index: i32,
    #[serde(with = "ErrorCodeDef")]
    pub error_code: ErrorCode,
    /// The partition's state after the change (or as it is, on error).
    pub leader_id: i32,
    pub leader_epoch: i32,
    pub isr: Vec<i32>,
    pub leader_recovery_state: i8,
    pub partition_epoch: i32,
}

/// Kafka's `ElectionType`: preferred (0) or unclean (1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ElectionType {
    Preferred,
    Unclean,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ElectLeadersRequest {
    pub election_type: ElectionType,
    /// `None`: every partition.
    pub partitions: Option<Vec<(String, i32)>>,
}

/// One partition's outcome (ElectLeaders, AlterPartitionReassignments).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PartitionResult {
    pub topic: String,
    pub partition: i32,
    #[serde(with = "ErrorCodeDef")]
    pub error_code: ErrorCode,
    pub error_message: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct AlterPartitionReassignmentsRequest {
    /// `(topic, partition, target replicas)`; `None` cancels the partition's
    /// reassignment.
    pub partitions: Vec<(String, i32, Option<Vec<i32>>)>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AllocateProducerIdsRequest {
    pub broker_id: i32,
    pub broker_epoch: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AllocateProducerIdsResponse {
    #[serde(with = "ErrorCodeDef")]
    pub error_code: ErrorCode,
    pub producer_id_start: i64,
    pub producer_id_len: i32,
}

/// Kafka's `AlterConfigOp.OpType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum AlterConfigOp {
    Set,
    Delete,
    Append,
    Subtract,
}

#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct IncrementalAlterConfigsRequest {
    pub resources: Vec<AlterConfigsResource>,
    pub validate_only: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AlterConfigsResource {
    /// [`crate::RESOURCE_TOPIC`] or [`crate::RESOURCE_BROKER`].
    pub resource_type: i8,
    pub resource_name: String,
    pub configs: Vec<(String, AlterConfigOp, Option<String>)>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AlterConfigsResourceResult {
    pub resource_type: i8,
    pub resource_name: String,
    #[serde(with = "ErrorCodeDef")]
    pub error_code: ErrorCode,
    pub error_message: Option<String>,
}

/// The answer of [`crate::MetadataQuorum::submit`]: the controller's response, and where
/// in the metadata log its decision ends.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SubmitResult {
    pub response: ControllerResponse,
    /// The metadata offset after the records of this decision: once a node's committed
    /// offset reaches it ([`crate::MetadataQuorum::wait_for_offset`]), its image reflects
    /// the decision.
    pub next_offset: i64,
}

/// serde's view of [`Uuid`]: its 16 bytes.
#[derive(Serialize, Deserialize)]
#[serde(remote = "Uuid")]
struct UuidDef(pub [u8; 16]);

/// serde's view of a list of [`Uuid`]s.
mod uuid_list {
    use rill_protocol::Uuid;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};

    pub fn serialize<S: Serializer>(list: &[Uuid], s: S) -> Result<S::Ok, S::Error> {
        let bytes: Vec<[u8; 16]> = list.iter().map(|u| u.0).collect();
        bytes.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Uuid>, D::Error> {
        Ok(Vec::<[u8; 16]>::deserialize(d)?
            .into_iter()
            .map(Uuid)
            .collect())
    }
}

/// serde's view of [`ErrorCode`]: the Kafka code number.
#[derive(Serialize, Deserialize)]
#[serde(remote = "ErrorCode")]
pub(crate) struct ErrorCodeDef(pub i16);
