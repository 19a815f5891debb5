//! The admin client: topics, partitions (leader elections and reassignments), configs,
//! consumer groups and their offsets, partition offsets and the cluster.
//!
//! Topic, partition and config changes go to the controller when metadata names one
//! (any broker otherwise: a KRaft broker forwards them); group requests go to the group's
//! coordinator, found with FindCoordinator; `list_groups` asks every broker, since each
//! knows only the groups it coordinates. ACLs are in `admin/acls.rs`.

mod acls;
mod consumer_groups;
mod delegation_tokens;
mod quotas;
mod share_groups;
pub use consumer_groups::{ConsumerGroupDescription, ConsumerGroupMemberDescription};
pub use delegation_tokens::{hmac_from_base64, DelegationToken};
pub use quotas::{QuotaAlteration, QuotaEntity, QuotaMatch, QuotaValues};
pub use share_groups::{ShareGroupDescription, ShareGroupMemberDescription, ShareGroupOffset};

use std::collections::BTreeMap;
use std::sync::Arc;

use rill_protocol::generated::alter_partition_reassignments_request::{
    ReassignablePartition, ReassignableTopic,
};
use rill_protocol::generated::create_partitions_request::CreatePartitionsTopic;
use rill_protocol::generated::create_topics_request::{CreatableTopic, CreatableTopicConfig};
use rill_protocol::generated::delete_topics_request::DeleteTopicState;
use rill_protocol::generated::describe_configs_request::DescribeConfigsResource;
use rill_protocol::generated::elect_leaders_request::TopicPartitions;
use rill_protocol::generated::incremental_alter_configs_request::{
    AlterConfigsResource, AlterableConfig,
};
use rill_protocol::generated::list_partition_reassignments_request::ListPartitionReassignmentsTopics;
use rill_protocol::generated::{
    AlterPartitionReassignmentsRequest, AlterUserScramCredentialsRequest, CreatePartitionsRequest,
    CreateTopicsRequest, DeleteGroupsRequest, DeleteTopicsRequest, DescribeClusterRequest,
    DescribeConfigsRequest, DescribeGroupsRequest, DescribeLogDirsRequest,
    DescribeTransactionsRequest, DescribeUserScramCredentialsRequest, ElectLeadersRequest,
    IncrementalAlterConfigsRequest, ListGroupsRequest, ListPartitionReassignmentsRequest,
    ListTransactionsRequest, UnregisterBrokerRequest,
};
use rill_protocol::{ErrorCode, Request};

use crate::assignor::{decode_assignment, decode_subscription};
use crate::config::ClientConfig;
use crate::error::{check, Error, Result};
use crate::network::{BrokerMetadata, ClusterMetadata, NetworkClient, TopicMetadata};
use crate::ops;
use crate::types::{ElectionType, OffsetSpec, PartitionReassignment, TopicPartition};

const CREATE_TOPICS_VERSION: i16 = 7;
const DELETE_TOPICS_VERSION: i16 = 5;
const CREATE_PARTITIONS_VERSION: i16 = 3;
const DESCRIBE_CONFIGS_VERSION: i16 = 4;
const INCREMENTAL_ALTER_CONFIGS_VERSION: i16 = 1;
const DESCRIBE_CLUSTER_VERSION: i16 = 1;
const DESCRIBE_LOG_DIRS_VERSION: i16 = 4;
const LIST_GROUPS_VERSION: i16 = 5;
const DESCRIBE_GROUPS_VERSION: i16 = 5;
const DELETE_GROUPS_VERSION: i16 = 2;
const ELECT_LEADERS_VERSION: i16 = 2;
const UNREGISTER_BROKER_VERSION: i16 = 0;
const ALTER_PARTITION_REASSIGNMENTS_VERSION: i16 = 0;
const LIST_PARTITION_REASSIGNMENTS_VERSION: i16 = 0;
const LIST_TRANSACTIONS_VERSION: i16 = 0;
const DESCRIBE_TRANSACTIONS_VERSION: i16 = 0;

const DESCRIBE_USER_SCRAM_CREDENTIALS_VERSION: i16 = 0;
const ALTER_USER_SCRAM_CREDENTIALS_VERSION: i16 = 0;

/// A SCRAM credential to set with [`Admin::alter_user_scram_credentials`]: Kafka's
/// mechanism type (1: SCRAM-SHA-256, 2: SCRAM-SHA-512), and the salted password, never
/// the password.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScramCredentialUpsertion {
    pub name: String,
    pub mechanism: i8,
    pub iterations: i32,
    pub salt: Vec<u8>,
    pub salted_password: Vec<u8>,
}

/// Each partition's outcome of an election or a reassignment request: `Ok(())`, or the
/// error the controller gave that partition (an [`Error::Kafka`] with its code).
pub type PartitionResults = BTreeMap<TopicPartition, Result<()>>;

/// `partitions` grouped by topic, each topic once (the wire's topic lists are keyed by
/// name), partitions in order.
fn by_topic(partitions: &[TopicPartition]) -> BTreeMap<String, Vec<i32>> {
    let mut grouped: BTreeMap<String, Vec<i32>> = BTreeMap::new();
    for tp in partitions {
        let ids = grouped.entry(tp.topic.clone()).or_default();
        if !ids.contains(&tp.partition) {
            ids.push(tp.partition);
        }
    }
    grouped
}

/// A partition's error code and message as a `Result`.
fn partition_result(
    what: &str,
    tp: &TopicPartition,
    code: i16,
    message: Option<String>,
) -> Result<()> {
    let code = ErrorCode::from_code(code);
    if code.is_ok() {
        Ok(())
    } else {
        Err(Error::kafka_msg(code, format!("{what} {tp}"), message))
    }
}

/// A topic to create.
///
/// ```
/// use rill_client::NewTopic;
/// let topic = NewTopic::new("orders", 6).config("retention.ms", "86400000");
/// assert_eq!(topic.replication_factor, -1);
/// ```
#[derive(Debug, Clone)]
pub struct NewTopic {
    pub name: String,
    /// -1 for the broker's `num.partitions`.
    pub num_partitions: i32,
    /// -1 for the broker's `default.replication.factor`.
    pub replication_factor: i16,
    pub configs: BTreeMap<String, String>,
}

impl NewTopic {
    pub fn new(name: impl Into<String>, num_partitions: i32) -> Self {
        Self {
            name: name.into(),
            num_partitions,
            replication_factor: -1,
            configs: BTreeMap::new(),
        }
    }

    pub fn replication_factor(mut self, rf: i16) -> Self {
        self.replication_factor = rf;
        self
    }

    pub fn config(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.configs.insert(key.into(), value.into());
        self
    }
}

/// A request to grow a topic to `total_count` partitions.
#[derive(Debug, Clone)]
pub struct NewPartitions {
    pub topic: String,
    pub total_count: i32,
}

/// The kind of thing configs belong to (Kafka's `ConfigResource.Type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigResourceType {
    Topic,
    Broker,
}

impl ConfigResourceType {
    fn wire(self) -> i8 {
        match self {
            ConfigResourceType::Topic => 2,
            ConfigResourceType::Broker => 4,
        }
    }
}

/// A topic or broker whose configs are described or altered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigResource {
    pub resource_type: ConfigResourceType,
    /// Topic name, or broker id as a string.
    pub name: String,
}

impl ConfigResource {
    pub fn topic(name: impl Into<String>) -> Self {
        Self {
            resource_type: ConfigResourceType::Topic,
            name: name.into(),
        }
    }

    pub fn broker(id: i32) -> Self {
        Self {
            resource_type: ConfigResourceType::Broker,
            name: id.to_string(),
        }
    }
}

/// One config and its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigEntry {
    pub name: String,
    pub value: Option<String>,
    pub is_default: bool,
    pub read_only: bool,
    pub is_sensitive: bool,
}

/// One incremental config change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AlterConfigOp {
    Set(String, String),
    Delete(String),
}

/// A transactional id as `ListTransactions` shows it (KIP-664).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransactionListing {
    pub transactional_id: String,
    pub producer_id: i64,
    pub state: String,
    pub coordinator: i32,
}

/// A transactional id as `DescribeTransactions` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransactionDescription {
    pub transactional_id: String,
    pub coordinator: i32,
    pub state: String,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub transaction_timeout_ms: i32,
    /// When the running transaction started, or -1.
    pub transaction_start_time_ms: i64,
    pub partitions: Vec<TopicPartition>,
}

/// A group as `ListGroups` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupListing {
    pub group_id: String,
    pub protocol_type: String,
    pub state: String,
    /// `classic`, `consumer` (KIP-848) or `share` (KIP-932), as ListGroups v5 tells it
    /// (KIP-1043).
    pub group_type: String,
    pub coordinator: i32,
}

/// A member of a described group, with its assignment decoded when the group is a
/// consumer group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberDescription {
    pub member_id: String,
    pub group_instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub subscribed_topics: Vec<String>,
    pub assignment: Vec<TopicPartition>,
}

/// A group as `DescribeGroups` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupDescription {
    pub group_id: String,
    pub state: String,
    pub protocol_type: String,
    /// The assignor in use (`range`, ...).
    pub protocol: String,
    pub members: Vec<MemberDescription>,
    pub coordinator: BrokerMetadata,
}

impl From<ConsumerGroupDescription> for GroupDescription {
    /// A consumer group (KIP-848) in DescribeGroups' shape: the assignor as the protocol,
    /// each member's current assignment.
    fn from(cg: ConsumerGroupDescription) -> Self {
        GroupDescription {
            group_id: cg.group_id,
            state: cg.state,
            protocol_type: "consumer".into(),
            protocol: cg.assignor,
            members: cg
                .members
                .into_iter()
                .map(|m| MemberDescription {
                    member_id: m.member_id,
                    group_instance_id: m.instance_id,
                    client_id: m.client_id,
                    client_host: m.client_host,
                    subscribed_topics: m.subscribed_topic_names,
                    assignment: m.assignment,
                })
                .collect(),
            coordinator: cg.coordinator,
        }
    }
}

/// Cluster administration.
///
/// ```no_run
/// use rill_client::{Admin, ClientConfig, NewTopic};
///
/// # async fn run() -> rill_client::Result<()> {
/// let admin = Admin::new(ClientConfig::new("127.0.0.1:9092"))?;
/// admin.create_topics(&[NewTopic::new("orders", 6)]).await?;
/// for topic in admin.list_topics(false).await? {
///     println!("{} ({} partitions)", topic.name, topic.partitions.len());
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Admin {
    net: Arc<NetworkClient>,
}

impl Admin {
    /// Creates an admin client; nothing is connected until the first call.
    pub fn new(config: ClientConfig) -> Result<Self> {
        Ok(Self {
            net: NetworkClient::new(config)?,
        })
    }

    /// The connections, for the admin calls kept in modules of their own.
    pub(crate) fn net(&self) -> &NetworkClient {
        &self.net
    }

    fn timeout_ms(&self) -> i32 {
        i32::try_from(self.net.config.request_timeout.as_millis()).unwrap_or(i32::MAX)
    }

    async fn send_controller<R: Request>(&self, request: &R, ours: i16) -> Result<R::Response> {
        let md = match self.net.metadata() {
            m if m.brokers.is_empty() => {
                self.net.refresh_metadata(Some(&[])).await?;
                self.net.metadata()
            }
            m => m,
        };
        if md.brokers.contains_key(&md.controller_id) {
            self.net.send_to(md.controller_id, request, ours).await
        } else {
            self.net.send_any(request, ours).await
        }
    }

    /// Creates topics; fails on the first topic the broker refused.
    pub async fn create_topics(&self, topics: &[NewTopic]) -> Result<()> {
        let request = CreateTopicsRequest {
            topics: topics
                .iter()
                .map(|t| CreatableTopic {
                    name: t.name.clone(),
                    num_partitions: t.num_partitions,
                    replication_factor: t.replication_factor,
                    configs: t
                        .configs
                        .iter()
                        .map(|(k, v)| CreatableTopicConfig {
                            name: k.clone(),
                            value: Some(v.clone()),
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                })
                .collect(),
            timeout_ms: self.timeout_ms(),
            validate_only: false,
            ..Default::default()
        };
        let response = self
            .send_controller(&request, CREATE_TOPICS_VERSION)
            .await?;
        for t in response.topics {
            let code = ErrorCode::from_code(t.error_code);
            if !code.is_ok() {
                return Err(Error::kafka_msg(
                    code,
                    format!("creating topic {}", t.name),
                    t.error_message,
                ));
            }
        }
        self.net.invalidate_metadata();
        Ok(())
    }

    /// Deletes topics by name.
    pub async fn delete_topics(&self, names: &[String]) -> Result<()> {
        let request = DeleteTopicsRequest {
            topics: names
                .iter()
                .map(|n| DeleteTopicState {
                    name: Some(n.clone()),
                    ..Default::default()
                })
                .collect(),
            topic_names: names.to_vec(),
            timeout_ms: self.timeout_ms(),
            ..Default::default()
        };
        let response = self
            .send_controller(&request, DELETE_TOPICS_VERSION)
            .await?;
        for t in response.responses {
            let code = ErrorCode::from_code(t.error_code);
            if !code.is_ok() {
                let name = t.name.unwrap_or_default();
                return Err(Error::kafka_msg(
                    code,
                    format!("deleting topic {name}"),
                    t.error_message,
                ));
            }
        }
        self.net.invalidate_metadata();
        Ok(())
    }

    /// Every topic (internal ones only when asked), sorted by name.
    pub async fn list_topics(&self, include_internal: bool) -> Result<Vec<TopicMetadata>> {
        self.net.refresh_metadata(None).await?;
        Ok(self
            .net
            .metadata()
            .topics
            .values()
            .filter(|t| include_internal || !t.is_internal)
            .cloned()
            .collect())
    }

    /// The named topics; [`Error::UnknownTopic`] for one that does not exist.
    pub async fn describe_topics(&self, names: &[String]) -> Result<Vec<TopicMetadata>> {
        let mut net_config = self.net.config.clone();
        // Describing must not create.
        net_config.allow_auto_create_topics = false;
        let net = NetworkClient::new(net_config)?;
        net.refresh_metadata(Some(names)).await?;
        let md = net.metadata();
        names
            .iter()
            .map(|n| {
                md.topics
                    .get(n)
                    .cloned()
                    .ok_or_else(|| Error::UnknownTopic(n.clone()))
            })
            .collect()
    }

    /// Grows topics to the given partition counts.
    pub async fn create_partitions(&self, changes: &[NewPartitions]) -> Result<()> {
        let request = CreatePartitionsRequest {
            topics: changes
                .iter()
                .map(|c| CreatePartitionsTopic {
                    name: c.topic.clone(),
                    count: c.total_count,
                    assignments: None,
                    ..Default::default()
                })
                .collect(),
            timeout_ms: self.timeout_ms(),
            validate_only: false,
            ..Default::default()
        };
        let response = self
            .send_controller(&request, CREATE_PARTITIONS_VERSION)
            .await?;
        for r in response.results {
            let code = ErrorCode::from_code(r.error_code);
            if !code.is_ok() {
                return Err(Error::kafka_msg(
                    code,
                    format!("adding partitions to {}", r.name),
                    r.error_message,
                ));
            }
        }
        self.net.invalidate_metadata();
        Ok(())
    }

    /// The configs of a topic or broker.
    pub async fn describe_configs(&self, resource: &ConfigResource) -> Result<Vec<ConfigEntry>> {
        let request = DescribeConfigsRequest {
            resources: vec![DescribeConfigsResource {
                resource_type: resource.resource_type.wire(),
                resource_name: resource.name.clone(),
                configuration_keys: None,
                ..Default::default()
            }],
            ..Default::default()
        };
        let response = match resource.resource_type {
            ConfigResourceType::Broker => {
                let id = resource
                    .name
                    .parse::<i32>()
                    .map_err(|_| Error::InvalidConfig(format!("broker id {}", resource.name)))?;
                self.net
                    .send_to(id, &request, DESCRIBE_CONFIGS_VERSION)
                    .await?
            }
            ConfigResourceType::Topic => {
                self.net
                    .send_any(&request, DESCRIBE_CONFIGS_VERSION)
                    .await?
            }
        };
        let mut out = Vec::new();
        for r in response.results {
            let code = ErrorCode::from_code(r.error_code);
            if !code.is_ok() {
                return Err(Error::kafka_msg(
                    code,
                    format!("describing configs of {}", r.resource_name),
                    r.error_message,
                ));
            }
            for c in r.configs {
                out.push(ConfigEntry {
                    is_default: c.is_default || c.config_source == 5,
                    name: c.name,
                    value: c.value,
                    read_only: c.read_only,
                    is_sensitive: c.is_sensitive,
                });
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Sets or deletes configs of one resource (IncrementalAlterConfigs).
    pub async fn alter_configs(
        &self,
        resource: &ConfigResource,
        ops: &[AlterConfigOp],
    ) -> Result<()> {
        let request = IncrementalAlterConfigsRequest {
            resources: vec![AlterConfigsResource {
                resource_type: resource.resource_type.wire(),
                resource_name: resource.name.clone(),
                configs: ops
                    .iter()
                    .map(|op| match op {
                        AlterConfigOp::Set(k, v) => AlterableConfig {
                            name: k.clone(),
                            config_operation: 0,
                            value: Some(v.clone()),
                            ..Default::default()
                        },
                        AlterConfigOp::Delete(k) => AlterableConfig {
                            name: k.clone(),
                            config_operation: 1,
                            value: None,
                            ..Default::default()
                        },
                    })
                    .collect(),
                ..Default::default()
            }],
            validate_only: false,
            ..Default::default()
        };
        let response = self
            .send_controller(&request, INCREMENTAL_ALTER_CONFIGS_VERSION)
            .await?;
        for r in response.responses {
            let code = ErrorCode::from_code(r.error_code);
            if !code.is_ok() {
                return Err(Error::kafka_msg(
                    code,
                    format!("altering configs of {}", r.resource_name),
                    r.error_message,
                ));
            }
        }
        Ok(())
    }

    /// Cluster id, controller and brokers.
    pub async fn describe_cluster(&self) -> Result<ClusterMetadata> {
        let request = DescribeClusterRequest::default();
        match self.net.send_any(&request, DESCRIBE_CLUSTER_VERSION).await {
            Ok(r) => {
                check(r.error_code, || "DescribeCluster".into())?;
                Ok(ClusterMetadata {
                    cluster_id: Some(r.cluster_id),
                    controller_id: r.controller_id,
                    brokers: r
                        .brokers
                        .into_iter()
                        .map(|b| {
                            (
                                b.broker_id,
                                BrokerMetadata {
                                    node_id: b.broker_id,
                                    host: b.host,
                                    port: b.port,
                                    rack: b.rack,
                                },
                            )
                        })
                        .collect(),
                    topics: BTreeMap::new(),
                })
            }
            // Older brokers: Metadata says the same.
            Err(Error::UnsupportedVersion { .. }) => {
                self.net.refresh_metadata(Some(&[])).await?;
                let mut md = (*self.net.metadata()).clone();
                md.topics.clear();
                Ok(md)
            }
            Err(e) => Err(e),
        }
    }

    /// Every group of every broker, sorted by id.
    pub async fn list_groups(&self) -> Result<Vec<GroupListing>> {
        self.net.refresh_metadata(Some(&[])).await?;
        let md = self.net.metadata();
        let mut out = Vec::new();
        for id in md.brokers.keys() {
            let response = self
                .net
                .send_to(*id, &ListGroupsRequest::default(), LIST_GROUPS_VERSION)
                .await?;
            check(response.error_code, || format!("ListGroups on broker {id}"))?;
            out.extend(response.groups.into_iter().map(|g| GroupListing {
                group_id: g.group_id,
                protocol_type: g.protocol_type,
                state: g.group_state,
                group_type: g.group_type,
                coordinator: *id,
            }));
        }
        out.sort_by(|a, b| a.group_id.cmp(&b.group_id));
        Ok(out)
    }

    /// Every transactional id of every broker (in one of `states` when not empty), sorted
    /// by id.
    pub async fn list_transactions(&self, states: &[String]) -> Result<Vec<TransactionListing>> {
        self.list_transactions_filtered(states, &[]).await
    }

    /// [`Self::list_transactions`] of the transactional ids whose producer id is one of
    /// `producer_ids` (every one when empty).
    pub async fn list_transactions_filtered(
        &self,
        states: &[String],
        producer_ids: &[i64],
    ) -> Result<Vec<TransactionListing>> {
        self.net.refresh_metadata(Some(&[])).await?;
        let md = self.net.metadata();
        let mut out = Vec::new();
        for id in md.brokers.keys() {
            let request = ListTransactionsRequest {
                state_filters: states.to_vec(),
                producer_id_filters: producer_ids.to_vec(),
                duration_filter: -1,
                ..Default::default()
            };
            let response = self
                .net
                .send_to(*id, &request, LIST_TRANSACTIONS_VERSION)
                .await?;
            check(response.error_code, || {
                format!("ListTransactions on broker {id}")
            })?;
            out.extend(
                response
                    .transaction_states
                    .into_iter()
                    .map(|t| TransactionListing {
                        transactional_id: t.transactional_id,
                        producer_id: t.producer_id,
                        state: t.transaction_state,
                        coordinator: *id,
                    }),
            );
        }
        out.sort_by(|a, b| a.transactional_id.cmp(&b.transactional_id));
        Ok(out)
    }

    /// Describes transactional ids, each asked of its transaction coordinator.
    pub async fn describe_transactions(
        &self,
        transactional_ids: &[String],
    ) -> Result<Vec<TransactionDescription>> {
        let mut out = Vec::new();
        for id in transactional_ids {
            let coordinator =
                ops::find_coordinator_of(&self.net, id, ops::COORDINATOR_TRANSACTION).await?;
            let conn = self.net.connection(&coordinator.addr()).await?;
            let request = DescribeTransactionsRequest {
                transactional_ids: vec![id.clone()],
                ..Default::default()
            };
            let response = conn.send(&request, DESCRIBE_TRANSACTIONS_VERSION).await?;
            for t in response.transaction_states {
                check(t.error_code, || {
                    format!("describing transactional id {}", t.transactional_id)
                })?;
                out.push(TransactionDescription {
                    transactional_id: t.transactional_id,
                    coordinator: coordinator.node_id,
                    state: t.transaction_state,
                    producer_id: t.producer_id,
                    producer_epoch: t.producer_epoch,
                    transaction_timeout_ms: t.transaction_timeout_ms,
                    transaction_start_time_ms: t.transaction_start_time_ms,
                    partitions: t
                        .topics
                        .into_iter()
                        .flat_map(|topic| {
                            let name = topic.topic;
                            topic
                                .partitions
                                .into_iter()
                                .map(move |p| TopicPartition::new(name.clone(), p))
                        })
                        .collect(),
                });
            }
        }
        Ok(out)
    }

    /// Describes groups: state, assignor and members with their assignments.
    pub async fn describe_groups(&self, groups: &[String]) -> Result<Vec<GroupDescription>> {
        let mut out = Vec::new();
        for group in groups {
            let coordinator = ops::find_coordinator(&self.net, group).await?;
            let conn = self.net.connection(&coordinator.addr()).await?;
            let request = DescribeGroupsRequest {
                groups: vec![group.clone()],
                ..Default::default()
            };
            let response = conn.send(&request, DESCRIBE_GROUPS_VERSION).await?;
            for g in response.groups {
                check(g.error_code, || format!("describing group {}", g.group_id))?;
                let consumer = g.protocol_type == "consumer";
                let members: Vec<MemberDescription> = g
                    .members
                    .into_iter()
                    .map(|m| {
                        let (subscribed_topics, assignment) = if consumer {
                            (
                                decode_subscription(&m.member_id, None, &m.member_metadata)
                                    .map(|s| s.topics)
                                    .unwrap_or_default(),
                                decode_assignment(&m.member_assignment).unwrap_or_default(),
                            )
                        } else {
                            (Vec::new(), Vec::new())
                        };
                        MemberDescription {
                            member_id: m.member_id,
                            group_instance_id: m.group_instance_id,
                            client_id: m.client_id,
                            client_host: m.client_host,
                            subscribed_topics,
                            assignment,
                        }
                    })
                    .collect();
                if g.group_state == "Dead" && members.is_empty() {
                    // DescribeGroups shows a consumer group of KIP-848's protocol as no
                    // group (Kafka does too); ConsumerGroupDescribe shows it, as Kafka's
                    // `Admin.describeConsumerGroups` falls back between the two.
                    if let Some(cg) = self.describe_consumer_group(group).await? {
                        out.push(GroupDescription::from(cg));
                        continue;
                    }
                    // Nor a share group (KIP-932): ShareGroupDescribe shows it.
                    if let Some(sg) = self.describe_share_group(group).await? {
                        out.push(GroupDescription::from(sg));
                        continue;
                    }
                }
                out.push(GroupDescription {
                    group_id: g.group_id,
                    state: g.group_state,
                    protocol_type: g.protocol_type,
                    protocol: g.protocol_data,
                    members,
                    coordinator: coordinator.clone(),
                });
            }
        }
        Ok(out)
    }

    /// Deletes groups (which must be empty).
    pub async fn delete_groups(&self, groups: &[String]) -> Result<()> {
        for group in groups {
            let coordinator = ops::find_coordinator(&self.net, group).await?;
            let conn = self.net.connection(&coordinator.addr()).await?;
            let request = DeleteGroupsRequest {
                groups_names: vec![group.clone()],
                ..Default::default()
            };
            let response = conn.send(&request, DELETE_GROUPS_VERSION).await?;
            for r in response.results {
                check(r.error_code, || format!("deleting group {}", r.group_id))?;
            }
        }
        Ok(())
    }

    /// The committed offsets of `group` (all partitions it committed when `partitions`
    /// is `None`).
    pub async fn list_group_offsets(
        &self,
        group: &str,
        partitions: Option<&[TopicPartition]>,
    ) -> Result<BTreeMap<TopicPartition, i64>> {
        ops::fetch_committed(&self.net, group, partitions).await
    }

    /// Overwrites committed offsets of `group`; the group must have no active members.
    pub async fn alter_group_offsets(
        &self,
        group: &str,
        offsets: &BTreeMap<TopicPartition, i64>,
    ) -> Result<()> {
        ops::commit_offsets(&self.net, group, -1, "", None, offsets).await
    }

    /// The offsets `spec` names for each partition.
    pub async fn list_offsets(
        &self,
        partitions: &[TopicPartition],
        spec: OffsetSpec,
    ) -> Result<BTreeMap<TopicPartition, i64>> {
        ops::list_offsets(&self.net, partitions, spec).await
    }

    /// Elects leaders (ElectLeaders): the preferred replica, or for
    /// [`ElectionType::Unclean`] any live replica of a partition that has no leader.
    ///
    /// `partitions: None` means every partition of the cluster; the answer then leaves
    /// out the partitions that needed no election. A partition whose election failed or
    /// was not needed carries its error (`ELECTION_NOT_NEEDED`,
    /// `PREFERRED_LEADER_NOT_AVAILABLE`, `ELIGIBLE_LEADERS_NOT_AVAILABLE`,
    /// `UNKNOWN_TOPIC_OR_PARTITION`); only a failure of the whole request is an `Err`.
    ///
    /// ```no_run
    /// use rill_client::{Admin, ClientConfig, ElectionType, TopicPartition};
    ///
    /// # async fn run() -> rill_client::Result<()> {
    /// let admin = Admin::new(ClientConfig::new("127.0.0.1:9092"))?;
    /// let asked = [TopicPartition::new("orders", 0)];
    /// for (tp, outcome) in admin.elect_leaders(ElectionType::Preferred, Some(&asked)).await? {
    ///     match outcome {
    ///         Ok(()) => println!("{tp}: leader is the preferred replica again"),
    ///         Err(e) => println!("{tp}: {e}"),
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn elect_leaders(
        &self,
        election_type: ElectionType,
        partitions: Option<&[TopicPartition]>,
    ) -> Result<PartitionResults> {
        let request = ElectLeadersRequest {
            election_type: election_type.wire(),
            topic_partitions: partitions.map(|ps| {
                by_topic(ps)
                    .into_iter()
                    .map(|(topic, partitions)| TopicPartitions {
                        topic,
                        partitions,
                        ..Default::default()
                    })
                    .collect()
            }),
            timeout_ms: self.timeout_ms(),
            ..Default::default()
        };
        let response = self
            .send_controller(&request, ELECT_LEADERS_VERSION)
            .await?;
        check(response.error_code, || "electing leaders".into())?;
        let mut out = BTreeMap::new();
        for t in response.replica_election_results {
            for p in t.partition_result {
                let tp = TopicPartition::new(t.topic.clone(), p.partition_id);
                let result =
                    partition_result("electing a leader for", &tp, p.error_code, p.error_message);
                out.insert(tp, result);
            }
        }
        self.net.invalidate_metadata();
        Ok(out)
    }

    /// Removes a broker's registration from the cluster (UnregisterBroker, KIP-631), for
    /// a broker that is gone for good: it leaves every ISR and leads nothing, and the
    /// controller forgets it. Its replicas stay in the partitions' replica lists; move
    /// them with [`Admin::alter_partition_reassignments`]. A broker that is still running
    /// registers again at its next heartbeat. `BROKER_ID_NOT_REGISTERED` when the
    /// controller does not know the id.
    ///
    /// ```no_run
    /// use rill_client::{Admin, ClientConfig};
    ///
    /// # async fn run() -> rill_client::Result<()> {
    /// let admin = Admin::new(ClientConfig::new("127.0.0.1:9092"))?;
    /// admin.unregister_broker(4).await?;
    /// # Ok(()) }
    /// ```
    pub async fn unregister_broker(&self, broker_id: i32) -> Result<()> {
        let request = UnregisterBrokerRequest {
            broker_id,
            ..Default::default()
        };
        let response = self
            .send_controller(&request, UNREGISTER_BROKER_VERSION)
            .await?;
        let message = response.error_message;
        check(response.error_code, || match message {
            Some(m) => format!("unregistering broker {broker_id}: {m}"),
            None => format!("unregistering broker {broker_id}"),
        })?;
        self.net.invalidate_metadata();
        Ok(())
    }

    /// Starts, replaces or cancels partition reassignments
    /// (AlterPartitionReassignments): `Some(replicas)` moves the partition onto those
    /// brokers, the first being the preferred leader; `None` cancels its reassignment
    /// in progress.
    ///
    /// The call returns once the controller has accepted the change, not when the data
    /// has moved: the new replicas copy the log from the leader and the old ones leave
    /// once every new one is in the ISR. [`Admin::list_partition_reassignments`] shows
    /// what is still under way. Each partition carries its own outcome
    /// (`INVALID_REPLICA_ASSIGNMENT`, `NO_REASSIGNMENT_IN_PROGRESS`,
    /// `UNKNOWN_TOPIC_OR_PARTITION`, ...); only a failure of the whole request is an `Err`.
    ///
    /// ```no_run
    /// use std::collections::BTreeMap;
    /// use rill_client::{Admin, ClientConfig, TopicPartition};
    ///
    /// # async fn run() -> rill_client::Result<()> {
    /// let admin = Admin::new(ClientConfig::new("127.0.0.1:9092"))?;
    /// let plan = BTreeMap::from([(TopicPartition::new("orders", 0), Some(vec![2, 3]))]);
    /// for (tp, outcome) in admin.alter_partition_reassignments(&plan).await? {
    ///     outcome?;
    ///     println!("{tp}: moving to brokers 2 and 3");
    /// }
    /// while !admin.list_partition_reassignments(None).await?.is_empty() {
    ///     tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn alter_partition_reassignments(
        &self,
        reassignments: &BTreeMap<TopicPartition, Option<Vec<i32>>>,
    ) -> Result<PartitionResults> {
        let mut topics: BTreeMap<String, Vec<ReassignablePartition>> = BTreeMap::new();
        for (tp, replicas) in reassignments {
            topics
                .entry(tp.topic.clone())
                .or_default()
                .push(ReassignablePartition {
                    partition_index: tp.partition,
                    replicas: replicas.clone(),
                    ..Default::default()
                });
        }
        let request = AlterPartitionReassignmentsRequest {
            timeout_ms: self.timeout_ms(),
            topics: topics
                .into_iter()
                .map(|(name, partitions)| ReassignableTopic {
                    name,
                    partitions,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        let response = self
            .send_controller(&request, ALTER_PARTITION_REASSIGNMENTS_VERSION)
            .await?;
        let top = ErrorCode::from_code(response.error_code);
        if !top.is_ok() {
            return Err(Error::kafka_msg(
                top,
                "reassigning partitions",
                response.error_message,
            ));
        }
        let mut out = BTreeMap::new();
        for t in response.responses {
            for p in t.partitions {
                let tp = TopicPartition::new(t.name.clone(), p.partition_index);
                let result = partition_result("reassigning", &tp, p.error_code, p.error_message);
                out.insert(tp, result);
            }
        }
        self.net.invalidate_metadata();
        Ok(out)
    }

    /// The partition reassignments in progress (ListPartitionReassignments): of the
    /// whole cluster when `partitions` is `None`, else of those partitions (the ones not
    /// being reassigned, or unknown, are simply absent).
    ///
    /// ```no_run
    /// use rill_client::{Admin, ClientConfig};
    ///
    /// # async fn run() -> rill_client::Result<()> {
    /// let admin = Admin::new(ClientConfig::new("127.0.0.1:9092"))?;
    /// for (tp, r) in admin.list_partition_reassignments(None).await? {
    ///     println!("{tp}: adding {:?}, removing {:?}", r.adding_replicas, r.removing_replicas);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn list_partition_reassignments(
        &self,
        partitions: Option<&[TopicPartition]>,
    ) -> Result<BTreeMap<TopicPartition, PartitionReassignment>> {
        let request = ListPartitionReassignmentsRequest {
            timeout_ms: self.timeout_ms(),
            topics: partitions.map(|ps| {
                by_topic(ps)
                    .into_iter()
                    .map(
                        |(name, partition_indexes)| ListPartitionReassignmentsTopics {
                            name,
                            partition_indexes,
                            ..Default::default()
                        },
                    )
                    .collect()
            }),
            ..Default::default()
        };
        let response = self
            .send_controller(&request, LIST_PARTITION_REASSIGNMENTS_VERSION)
            .await?;
        let top = ErrorCode::from_code(response.error_code);
        if !top.is_ok() {
            return Err(Error::kafka_msg(
                top,
                "listing partition reassignments",
                response.error_message,
            ));
        }
        Ok(response
            .topics
            .into_iter()
            .flat_map(|t| {
                let name = t.name;
                t.partitions.into_iter().map(move |p| {
                    (
                        TopicPartition::new(name.clone(), p.partition_index),
                        PartitionReassignment {
                            replicas: p.replicas,
                            adding_replicas: p.adding_replicas,
                            removing_replicas: p.removing_replicas,
                        },
                    )
                })
            })
            .collect())
    }

    /// The SCRAM credentials of `users` (all users with one when `None`)
    /// (DescribeUserScramCredentials): per user, its `(mechanism, iterations)` pairs, with
    /// Kafka's mechanism types (1: SCRAM-SHA-256, 2: SCRAM-SHA-512), or the error for that
    /// user (RESOURCE_NOT_FOUND when it has none).
    pub async fn describe_user_scram_credentials(
        &self,
        users: Option<&[String]>,
    ) -> Result<Vec<(String, Result<Vec<(i8, i32)>>)>> {
        use rill_protocol::generated::describe_user_scram_credentials_request::UserName;
        let request = DescribeUserScramCredentialsRequest {
            users: users.map(|u| {
                u.iter()
                    .map(|name| UserName {
                        name: name.clone(),
                        ..Default::default()
                    })
                    .collect()
            }),
            ..Default::default()
        };
        let response = self
            .send_controller(&request, DESCRIBE_USER_SCRAM_CREDENTIALS_VERSION)
            .await?;
        let message = response.error_message;
        check(response.error_code, || match message {
            Some(m) => format!("describing SCRAM credentials: {m}"),
            None => "describing SCRAM credentials".to_string(),
        })?;
        Ok(response
            .results
            .into_iter()
            .map(|r| {
                let user = r.user;
                let outcome = check(r.error_code, || match &r.error_message {
                    Some(m) => format!("SCRAM credentials of {user}: {m}"),
                    None => format!("SCRAM credentials of {user}"),
                })
                .map(|()| {
                    r.credential_infos
                        .iter()
                        .map(|c| (c.mechanism, c.iterations))
                        .collect()
                });
                (user, outcome)
            })
            .collect())
    }

    /// Deletes and sets SCRAM credentials (AlterUserScramCredentials). Deletions are
    /// `(user, mechanism)`; an upsertion carries the salt and the salted password
    /// (`Hi(password, salt, iterations)`), which the client computes as Kafka's does, so
    /// that the password itself never leaves it. Per user, its outcome.
    pub async fn alter_user_scram_credentials(
        &self,
        deletions: &[(String, i8)],
        upsertions: &[ScramCredentialUpsertion],
    ) -> Result<Vec<(String, Result<()>)>> {
        use rill_protocol::generated::alter_user_scram_credentials_request as wire;
        let request = AlterUserScramCredentialsRequest {
            deletions: deletions
                .iter()
                .map(|(name, mechanism)| wire::ScramCredentialDeletion {
                    name: name.clone(),
                    mechanism: *mechanism,
                    ..Default::default()
                })
                .collect(),
            upsertions: upsertions
                .iter()
                .map(|u| wire::ScramCredentialUpsertion {
                    name: u.name.clone(),
                    mechanism: u.mechanism,
                    iterations: u.iterations,
                    salt: u.salt.clone().into(),
                    salted_password: u.salted_password.clone().into(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        let response = self
            .send_controller(&request, ALTER_USER_SCRAM_CREDENTIALS_VERSION)
            .await?;
        Ok(response
            .results
            .into_iter()
            .map(|r| {
                let user = r.user;
                let outcome = check(r.error_code, || match &r.error_message {
                    Some(m) => format!("altering SCRAM credentials of {user}: {m}"),
                    None => format!("altering SCRAM credentials of {user}"),
                });
                (user, outcome)
            })
            .collect())
    }

    /// The size on disk of each partition replica every broker hosts (DescribeLogDirs for
    /// all topics, asked of each broker): `(broker id, partition) -> bytes`. Future
    /// replicas (a move between log directories) are left out.
    ///
    /// ```no_run
    /// use rill_client::{Admin, ClientConfig};
    ///
    /// # async fn run() -> rill_client::Result<()> {
    /// let admin = Admin::new(ClientConfig::new("127.0.0.1:9092"))?;
    /// for ((broker, tp), bytes) in admin.describe_replica_sizes().await? {
    ///     println!("broker {broker}: {tp} holds {bytes} bytes");
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn describe_replica_sizes(&self) -> Result<BTreeMap<(i32, TopicPartition), i64>> {
        self.net.refresh_metadata(Some(&[])).await?;
        let md = self.net.metadata();
        // `topics: None` asks for every topic (the default, an empty list, for none).
        let all_log_dirs = DescribeLogDirsRequest {
            topics: None,
            ..Default::default()
        };
        let mut out = BTreeMap::new();
        for id in md.brokers.keys() {
            let response = self
                .net
                .send_to(*id, &all_log_dirs, DESCRIBE_LOG_DIRS_VERSION)
                .await?;
            check(response.error_code, || {
                format!("DescribeLogDirs on broker {id}")
            })?;
            for dir in response.results {
                check(dir.error_code, || {
                    format!("log directory {} of broker {id}", dir.log_dir)
                })?;
                for topic in dir.topics {
                    for p in topic.partitions.into_iter().filter(|p| !p.is_future_key) {
                        out.insert(
                            (
                                *id,
                                TopicPartition::new(topic.name.clone(), p.partition_index),
                            ),
                            p.partition_size,
                        );
                    }
                }
            }
        }
        Ok(out)
    }

    /// Every partition of `topic`, from metadata.
    pub async fn partitions_of(&self, topic: &str) -> Result<Vec<TopicPartition>> {
        let t = self.describe_topics(&[topic.to_string()]).await?;
        Ok(t.into_iter()
            .flat_map(|t| {
                let name = t.name;
                t.partitions
                    .into_iter()
                    .map(move |p| TopicPartition::new(name.clone(), p.partition))
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitions_are_grouped_by_topic_without_duplicates() {
        let grouped = by_topic(&[
            TopicPartition::new("b", 2),
            TopicPartition::new("a", 0),
            TopicPartition::new("b", 0),
            TopicPartition::new("b", 2),
        ]);
        assert_eq!(grouped.len(), 2);
        assert_eq!(grouped["a"], [0]);
        assert_eq!(grouped["b"], [2, 0]);
    }

    #[test]
    fn a_partition_error_keeps_its_code_and_message() {
        let tp = TopicPartition::new("t", 1);
        assert!(partition_result("electing", &tp, 0, None).is_ok());
        let err = partition_result(
            "electing",
            &tp,
            ErrorCode::ELECTION_NOT_NEEDED.code(),
            Some("already".into()),
        )
        .unwrap_err();
        assert_eq!(err.code(), Some(ErrorCode::ELECTION_NOT_NEEDED));
        assert!(err.to_string().contains("t-1"), "{err}");
    }
}
