//! [`MetadataImage`]: the cluster metadata as the records of the metadata log build it.
//!
//! Every node (controller or broker) keeps one image and calls
//! [`MetadataImage::apply`] with each committed record in log order; two nodes that
//! applied the same records hold equal images. That is the whole replication contract,
//! so the image holds nothing that is not in a record: broker heartbeats and leases are
//! the active controller's private, in-memory business (as in Kafka's
//! `BrokerHeartbeatManager`), and a controller that takes over starts every lease anew.
//!
//! Epochs follow Kafka's KRaft rules and are derived here, not carried by change
//! records: a `PartitionChangeRecord` bumps the partition epoch always and the leader
//! epoch whenever it names a leader (even the same one, which is how reassignment forces
//! a new epoch). A broker's epoch is the offset of its `RegisterBrokerRecord`, so a
//! broker has caught up with the log once it has applied its own registration.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use rill_protocol::generated::metadata::register_broker_record::BrokerEndpoint;
use rill_protocol::generated::metadata::{
    AccessControlEntryRecord, ConfigRecord, FeatureLevelRecord, PartitionRecord, ProducerIdsRecord,
    RegisterBrokerRecord, TopicRecord, UserScramCredentialRecord,
};
use rill_protocol::Uuid;

use crate::acl::{AclOperation, AclPermissionType, PatternType, ResourceType, StandardAcl};
use crate::authorizer::AclCache;
use crate::error::MetadataError;
use crate::record::{decode_batch, encode_batch, MetadataRecord};

/// `leader` value of a partition that has none (Kafka's `LeaderConstants.NO_LEADER`).
pub const NO_LEADER: i32 = -1;
/// `leader` value of a `PartitionChangeRecord` that leaves the leader as it is.
pub const NO_LEADER_CHANGE: i32 = -2;
/// `ConfigRecord.resource_type` of a topic (Kafka's `ConfigResource.Type.TOPIC`).
pub const RESOURCE_TOPIC: i8 = 2;
/// `ConfigRecord.resource_type` of a broker (Kafka's `ConfigResource.Type.BROKER`).
pub const RESOURCE_BROKER: i8 = 4;
/// Kafka's `ConfigResource.Type.GROUP`.
pub const RESOURCE_GROUP: i8 = 32;
/// Kafka's `ConfigResource.Type.CLIENT_METRICS`: a client telemetry subscription (KIP-714).
pub const RESOURCE_CLIENT_METRICS: i8 = 16;

/// Kafka's reserved log directory ids (`DirectoryId`, KIP-858): a replica's directory in
/// a partition's `directories` is one of a broker's registered `log_dirs`, or one of these.
pub mod directory_id {
    use rill_protocol::Uuid;

    /// A replica placed before directories were tracked: online wherever its broker is.
    pub const MIGRATING: Uuid = Uuid::from_u64_pair(0, 0);
    /// A new replica its broker has not placed yet (a broker with several log
    /// directories picks one and reports it, AssignReplicasToDirs).
    pub const UNASSIGNED: Uuid = Uuid::from_u64_pair(0, 1);
    /// A replica whose directory is offline, which directory unknown.
    pub const LOST: Uuid = Uuid::from_u64_pair(0, 2);

    /// Whether `dir` is one of the first 100 ids, which Kafka reserves.
    pub fn reserved(dir: Uuid) -> bool {
        let (most, least) = dir.as_u64_pair();
        most == 0 && least < 100
    }

    /// Kafka's `DirectoryId.isOnline`: whether a replica assigned to `dir` is on one of
    /// the `online` directories its broker registered (an empty list: a broker that
    /// registers none, every replica counts as online).
    pub fn is_online(dir: Uuid, online: &[Uuid]) -> bool {
        if dir == UNASSIGNED || dir == MIGRATING {
            return true;
        }
        if dir == LOST {
            return false;
        }
        online.is_empty() || online.contains(&dir)
    }
}

/// One listener a broker registered.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Endpoint {
    pub name: String,
    pub host: String,
    pub port: u16,
    pub security_protocol: i16,
}

/// A registered broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerRegistration {
    pub id: i32,
    /// The offset of the `RegisterBrokerRecord` that registered this incarnation.
    pub epoch: i64,
    pub incarnation_id: Uuid,
    pub endpoints: Vec<Endpoint>,
    pub rack: Option<String>,
    /// Fenced brokers lead nothing and are in no ISR (except as the last member kept so
    /// that the partition's last leader can come back, see the controller).
    pub fenced: bool,
    pub in_controlled_shutdown: bool,
    /// The ids of the broker's online log directories (KIP-858), sorted; a directory
    /// the broker reported failed leaves the list.
    pub log_dirs: Vec<Uuid>,
}

impl BrokerRegistration {
    /// May lead and may join ISRs: registered, unfenced and not shutting down.
    pub fn is_live(&self) -> bool {
        !self.fenced && !self.in_controlled_shutdown
    }

    /// Whether a replica assigned to `dir` is on an online directory of this broker.
    pub fn has_online_dir(&self, dir: Uuid) -> bool {
        directory_id::is_online(dir, &self.log_dirs)
    }
}

/// One partition's replicas, ISR and leadership.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionRegistration {
    /// In preferred order; during a reassignment the target replicas come first, then
    /// those being removed.
    pub replicas: Vec<i32>,
    pub isr: Vec<i32>,
    pub removing_replicas: Vec<i32>,
    pub adding_replicas: Vec<i32>,
    /// [`NO_LEADER`] when the partition has none.
    pub leader: i32,
    /// 1 while a leader chosen by unclean election is recovering.
    pub leader_recovery_state: i8,
    pub leader_epoch: i32,
    pub partition_epoch: i32,
    /// Each replica's log directory, in the order of `replicas` (KIP-858): one of its
    /// broker's `log_dirs` or a [`directory_id`] constant. Empty when the partition's
    /// records carry none (written before directories were tracked).
    pub directories: Vec<Uuid>,
}

impl PartitionRegistration {
    /// The log directory `broker`'s replica is assigned to ([`directory_id::MIGRATING`]
    /// when the partition tracks none).
    pub fn directory(&self, broker: i32) -> Uuid {
        self.replicas
            .iter()
            .position(|b| *b == broker)
            .and_then(|i| self.directories.get(i))
            .copied()
            .unwrap_or(directory_id::MIGRATING)
    }

    /// The preferred leader: the first replica.
    pub fn preferred_leader(&self) -> Option<i32> {
        self.replicas.first().copied()
    }

    /// A reassignment is in progress.
    pub fn is_reassigning(&self) -> bool {
        !self.adding_replicas.is_empty() || !self.removing_replicas.is_empty()
    }

    /// The replicas a finished reassignment keeps: all but those being removed.
    pub fn target_replicas(&self) -> Vec<i32> {
        self.replicas
            .iter()
            .copied()
            .filter(|r| !self.removing_replicas.contains(r))
            .collect()
    }
}

/// A topic and its partitions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicImage {
    pub name: String,
    pub id: Uuid,
    pub partitions: BTreeMap<i32, PartitionRegistration>,
}

/// The resource a config belongs to: `(resource_type, resource_name)` as in
/// `ConfigRecord` ([`RESOURCE_TOPIC`] with the topic name, [`RESOURCE_BROKER`] with the
/// broker id, or `""` for the cluster-wide default).
pub type ConfigResource = (i8, String);

/// The cluster metadata, as built by applying records in order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MetadataImage {
    /// How many records the image has applied: the offset the next record gets.
    pub next_offset: i64,
    pub brokers: BTreeMap<i32, BrokerRegistration>,
    pub topics: BTreeMap<Uuid, TopicImage>,
    pub topics_by_name: BTreeMap<String, Uuid>,
    pub configs: BTreeMap<ConfigResource, BTreeMap<String, String>>,
    /// The first producer id of the next block the controller hands out.
    pub next_producer_id: i64,
    pub features: BTreeMap<String, i16>,
    /// SCRAM credentials by `(user, mechanism)` (Kafka's `ScramMechanism` type: 1 for
    /// SCRAM-SHA-256, 2 for SCRAM-SHA-512), from `UserScramCredentialRecord`s.
    pub scram_credentials: BTreeMap<(String, i8), ScramCredentialImage>,
    /// The ACLs, from `AccessControlEntryRecord`s. Shared between the images a broker
    /// publishes until one changes them: ACLs change rarely, images often.
    pub acls: Arc<AclCache>,
    /// Client quotas by entity, from `ClientQuotaRecord`s.
    pub client_quotas: BTreeMap<crate::client_quotas::QuotaEntity, BTreeMap<String, f64>>,
    /// Delegation tokens by id, from `DelegationTokenRecord`s.
    pub delegation_tokens: crate::delegation_tokens::DelegationTokens,
    /// Tiered storage: every partition's remote segments, from the remote log segment
    /// records (see [`crate::remote_log`]).
    pub remote_log: crate::remote_log::RemoteLogImage,
}

/// What is stored of a password for SCRAM: never the password, nor its salted form.
#[derive(Clone, PartialEq, Eq)]
pub struct ScramCredentialImage {
    pub salt: Bytes,
    pub stored_key: Bytes,
    pub server_key: Bytes,
    pub iterations: i32,
}

impl std::fmt::Debug for ScramCredentialImage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScramCredentialImage")
            .field("iterations", &self.iterations)
            .finish_non_exhaustive()
    }
}

impl MetadataImage {
    /// An empty image: what a node holds before it has applied any record.
    pub fn new() -> Self {
        Self::default()
    }

    /// The offset of the last record applied, -1 before the first.
    pub fn last_offset(&self) -> i64 {
        self.next_offset - 1
    }

    pub fn topic(&self, name: &str) -> Option<&TopicImage> {
        self.topics_by_name
            .get(name)
            .and_then(|id| self.topics.get(id))
    }

    /// The remote segments of a partition (tiered storage), by segment id.
    pub fn remote_segments(
        &self,
        topic_id: Uuid,
        partition: i32,
    ) -> Option<&crate::remote_log::PartitionRemoteSegments> {
        self.remote_log.get(&(topic_id, partition)).map(|p| &**p)
    }

    pub fn partition(&self, topic: &str, partition: i32) -> Option<&PartitionRegistration> {
        self.topic(topic).and_then(|t| t.partitions.get(&partition))
    }

    pub fn broker(&self, id: i32) -> Option<&BrokerRegistration> {
        self.brokers.get(&id)
    }

    /// The broker is registered, unfenced and not in controlled shutdown.
    pub fn is_live(&self, id: i32) -> bool {
        self.brokers
            .get(&id)
            .is_some_and(BrokerRegistration::is_live)
    }

    /// `broker`'s replica of `p` may lead and be in sync: the broker is live and the
    /// replica's log directory is one of its online ones (Kafka's `isAcceptableReplica`).
    pub fn is_live_replica(&self, p: &PartitionRegistration, broker: i32) -> bool {
        self.brokers
            .get(&broker)
            .is_some_and(|b| b.is_live() && b.has_online_dir(p.directory(broker)))
    }

    /// Where the controller places a new replica on `broker` (Kafka's
    /// `ClusterControlManager.defaultDir`): its only log directory when it registered one,
    /// [`directory_id::UNASSIGNED`] when several (the broker picks and reports one),
    /// [`directory_id::MIGRATING`] when none.
    pub fn default_dir(&self, broker: i32) -> Uuid {
        match self.brokers.get(&broker).map(|b| b.log_dirs.as_slice()) {
            Some([only]) => *only,
            Some([]) | None => directory_id::MIGRATING,
            Some(_) => directory_id::UNASSIGNED,
        }
    }

    /// Ids of the live brokers, ascending.
    pub fn live_brokers(&self) -> Vec<i32> {
        self.brokers
            .values()
            .filter(|b| b.is_live())
            .map(|b| b.id)
            .collect()
    }

    /// A topic's config override, if set.
    pub fn topic_config(&self, topic: &str, key: &str) -> Option<&str> {
        self.configs
            .get(&(RESOURCE_TOPIC, topic.to_string()))
            .and_then(|c| c.get(key))
            .map(String::as_str)
    }

    /// A cluster-wide dynamic broker config (the default broker resource, named ""), if
    /// set: Kafka's `DYNAMIC_DEFAULT_BROKER_CONFIG`.
    pub fn cluster_default_config(&self, key: &str) -> Option<&str> {
        self.configs
            .get(&(RESOURCE_BROKER, String::new()))
            .and_then(|c| c.get(key))
            .map(String::as_str)
    }

    /// Applies one committed record. The offset advances even when the record does not
    /// fit (the error says why), so that every replica agrees on offsets.
    pub fn apply(&mut self, record: &MetadataRecord) -> Result<(), MetadataError> {
        self.next_offset += 1;
        match record {
            MetadataRecord::RegisterBroker(r) => {
                let endpoints = r
                    .end_points
                    .iter()
                    .map(|e| Endpoint {
                        name: e.name.clone(),
                        host: e.host.clone(),
                        port: e.port,
                        security_protocol: e.security_protocol,
                    })
                    .collect();
                self.brokers.insert(
                    r.broker_id,
                    BrokerRegistration {
                        id: r.broker_id,
                        epoch: r.broker_epoch,
                        incarnation_id: r.incarnation_id,
                        endpoints,
                        rack: r.rack.clone(),
                        fenced: r.fenced,
                        in_controlled_shutdown: r.in_controlled_shutdown,
                        log_dirs: sorted(&r.log_dirs),
                    },
                );
            }
            MetadataRecord::UnregisterBroker(r) => {
                self.brokers.remove(&r.broker_id);
            }
            MetadataRecord::Topic(r) => {
                if self.topics_by_name.contains_key(&r.name)
                    || self.topics.contains_key(&r.topic_id)
                {
                    return Err(inconsistent(format!("topic {} exists", r.name)));
                }
                self.topics_by_name.insert(r.name.clone(), r.topic_id);
                self.topics.insert(
                    r.topic_id,
                    TopicImage {
                        name: r.name.clone(),
                        id: r.topic_id,
                        partitions: BTreeMap::new(),
                    },
                );
            }
            MetadataRecord::Partition(r) => {
                let topic = self.topics.get_mut(&r.topic_id).ok_or_else(|| {
                    inconsistent(format!("partition of unknown topic {}", r.topic_id))
                })?;
                topic.partitions.insert(
                    r.partition_id,
                    PartitionRegistration {
                        replicas: r.replicas.clone(),
                        isr: r.isr.clone(),
                        removing_replicas: r.removing_replicas.clone(),
                        adding_replicas: r.adding_replicas.clone(),
                        leader: r.leader,
                        leader_recovery_state: r.leader_recovery_state,
                        leader_epoch: r.leader_epoch,
                        partition_epoch: r.partition_epoch,
                        directories: r.directories.clone(),
                    },
                );
            }
            MetadataRecord::Config(r) => {
                let key = (r.resource_type, r.resource_name.clone());
                match &r.value {
                    Some(value) => {
                        self.configs
                            .entry(key)
                            .or_default()
                            .insert(r.name.clone(), value.clone());
                    }
                    None => {
                        if let Some(entries) = self.configs.get_mut(&key) {
                            entries.remove(&r.name);
                            if entries.is_empty() {
                                self.configs.remove(&key);
                            }
                        }
                    }
                }
            }
            MetadataRecord::PartitionChange(r) => {
                let p = self
                    .topics
                    .get_mut(&r.topic_id)
                    .and_then(|t| t.partitions.get_mut(&r.partition_id))
                    .ok_or_else(|| {
                        inconsistent(format!(
                            "change of unknown partition {}-{}",
                            r.topic_id, r.partition_id
                        ))
                    })?;
                if let Some(isr) = &r.isr {
                    p.isr.clone_from(isr);
                }
                if let Some(replicas) = &r.replicas {
                    // Directories travel with the replicas; a change that names no
                    // directories keeps each remaining replica's and leaves a new one
                    // unassigned (Kafka fills in MIGRATING where a record has none).
                    if r.directories.is_none() && !p.directories.is_empty() {
                        p.directories = replicas
                            .iter()
                            .map(|b| {
                                if p.replicas.contains(b) {
                                    p.directory(*b)
                                } else {
                                    directory_id::UNASSIGNED
                                }
                            })
                            .collect();
                    }
                    p.replicas.clone_from(replicas);
                }
                if let Some(directories) = &r.directories {
                    p.directories.clone_from(directories);
                }
                if let Some(removing) = &r.removing_replicas {
                    p.removing_replicas.clone_from(removing);
                }
                if let Some(adding) = &r.adding_replicas {
                    p.adding_replicas.clone_from(adding);
                }
                if r.leader != NO_LEADER_CHANGE {
                    p.leader = r.leader;
                    p.leader_epoch += 1;
                }
                if r.leader_recovery_state != -1 {
                    p.leader_recovery_state = r.leader_recovery_state;
                }
                p.partition_epoch += 1;
            }
            MetadataRecord::FenceBroker(r) => {
                let b = self.brokers.get_mut(&r.id).ok_or_else(|| {
                    inconsistent(format!("fence of unregistered broker {}", r.id))
                })?;
                if b.epoch != r.epoch {
                    return Err(inconsistent(format!(
                        "fence of broker {} epoch {} but it is at {}",
                        r.id, r.epoch, b.epoch
                    )));
                }
                b.fenced = true;
            }
            MetadataRecord::UnfenceBroker(r) => {
                let b = self.brokers.get_mut(&r.id).ok_or_else(|| {
                    inconsistent(format!("unfence of unregistered broker {}", r.id))
                })?;
                if b.epoch != r.epoch {
                    return Err(inconsistent(format!(
                        "unfence of broker {} epoch {} but it is at {}",
                        r.id, r.epoch, b.epoch
                    )));
                }
                b.fenced = false;
            }
            MetadataRecord::BrokerRegistrationChange(r) => {
                let b = self.brokers.get_mut(&r.broker_id).ok_or_else(|| {
                    inconsistent(format!("change of unregistered broker {}", r.broker_id))
                })?;
                match r.fenced {
                    1 => b.fenced = true,
                    -1 => b.fenced = false,
                    _ => {}
                }
                if r.in_controlled_shutdown == 1 {
                    b.in_controlled_shutdown = true;
                }
                // Empty: no change (Kafka's `ClusterControlManager.replay`).
                if !r.log_dirs.is_empty() {
                    b.log_dirs = sorted(&r.log_dirs);
                }
            }
            MetadataRecord::RemoveTopic(r) => {
                let topic = self.topics.remove(&r.topic_id).ok_or_else(|| {
                    inconsistent(format!("removal of unknown topic {}", r.topic_id))
                })?;
                self.topics_by_name.remove(&topic.name);
                self.configs.remove(&(RESOURCE_TOPIC, topic.name));
                // The deleted topic's remote objects are the brokers' to delete (by
                // prefix); its metadata goes with it.
                self.remote_log.retain(|(id, _), _| *id != r.topic_id);
            }
            MetadataRecord::FeatureLevel(r) => {
                self.features.insert(r.name.clone(), r.feature_level);
            }
            MetadataRecord::ProducerIds(r) => {
                if r.next_producer_id < self.next_producer_id {
                    return Err(inconsistent(format!(
                        "producer id block going back from {} to {}",
                        self.next_producer_id, r.next_producer_id
                    )));
                }
                self.next_producer_id = r.next_producer_id;
            }
            MetadataRecord::NoOp(_) => {}
            MetadataRecord::UserScramCredential(r) => {
                self.scram_credentials.insert(
                    (r.name.clone(), r.mechanism),
                    ScramCredentialImage {
                        salt: r.salt.clone(),
                        stored_key: r.stored_key.clone(),
                        server_key: r.server_key.clone(),
                        iterations: r.iterations,
                    },
                );
            }
            MetadataRecord::RemoveUserScramCredential(r) => {
                self.scram_credentials
                    .remove(&(r.name.clone(), r.mechanism));
            }
            MetadataRecord::AccessControlEntry(r) => {
                let acl = StandardAcl {
                    resource_type: ResourceType::from_code(r.resource_type),
                    resource_name: r.resource_name.clone(),
                    pattern_type: PatternType::from_code(r.pattern_type),
                    principal: r.principal.clone(),
                    host: r.host.clone(),
                    operation: AclOperation::from_code(r.operation),
                    permission_type: AclPermissionType::from_code(r.permission_type),
                };
                if !Arc::make_mut(&mut self.acls).add(r.id, acl) {
                    return Err(inconsistent(format!("an ACL with id {} exists", r.id)));
                }
            }
            MetadataRecord::RemoveAccessControlEntry(r) => {
                if Arc::make_mut(&mut self.acls).remove(&r.id).is_none() {
                    return Err(inconsistent(format!("removal of unknown ACL {}", r.id)));
                }
            }
            MetadataRecord::ClientQuota(r) => {
                crate::client_quotas::apply(&mut self.client_quotas, r)
            }
            MetadataRecord::DelegationToken(_) | MetadataRecord::RemoveDelegationToken(_) => {
                crate::delegation_tokens::apply(&mut self.delegation_tokens, record)
            }
            MetadataRecord::RemoteLogSegmentMetadata(r) => {
                crate::remote_log::apply_segment(&mut self.remote_log, r)
            }
            MetadataRecord::RemoteLogSegmentMetadataUpdate(r) => {
                crate::remote_log::apply_update(&mut self.remote_log, r)
            }
        }
        Ok(())
    }

    /// Records that rebuild this image from empty (Kafka writes its snapshots the same
    /// way), apart from [`MetadataImage::next_offset`], which the snapshot carries beside
    /// them.
    pub fn to_records(&self) -> Vec<MetadataRecord> {
        let mut out = Vec::new();
        for (name, level) in &self.features {
            out.push(MetadataRecord::FeatureLevel(FeatureLevelRecord {
                name: name.clone(),
                feature_level: *level,
                ..Default::default()
            }));
        }
        for b in self.brokers.values() {
            out.push(MetadataRecord::RegisterBroker(RegisterBrokerRecord {
                broker_id: b.id,
                incarnation_id: b.incarnation_id,
                broker_epoch: b.epoch,
                end_points: b
                    .endpoints
                    .iter()
                    .map(|e| BrokerEndpoint {
                        name: e.name.clone(),
                        host: e.host.clone(),
                        port: e.port,
                        security_protocol: e.security_protocol,
                        ..Default::default()
                    })
                    .collect(),
                rack: b.rack.clone(),
                fenced: b.fenced,
                in_controlled_shutdown: b.in_controlled_shutdown,
                log_dirs: b.log_dirs.clone(),
                ..Default::default()
            }));
        }
        for t in self.topics.values() {
            out.push(MetadataRecord::Topic(TopicRecord {
                name: t.name.clone(),
                topic_id: t.id,
                ..Default::default()
            }));
            for (id, p) in &t.partitions {
                out.push(MetadataRecord::Partition(PartitionRecord {
                    partition_id: *id,
                    topic_id: t.id,
                    replicas: p.replicas.clone(),
                    isr: p.isr.clone(),
                    removing_replicas: p.removing_replicas.clone(),
                    adding_replicas: p.adding_replicas.clone(),
                    leader: p.leader,
                    leader_recovery_state: p.leader_recovery_state,
                    leader_epoch: p.leader_epoch,
                    partition_epoch: p.partition_epoch,
                    directories: p.directories.clone(),
                    ..Default::default()
                }));
            }
        }
        for ((resource_type, resource_name), entries) in &self.configs {
            for (name, value) in entries {
                out.push(MetadataRecord::Config(ConfigRecord {
                    resource_type: *resource_type,
                    resource_name: resource_name.clone(),
                    name: name.clone(),
                    value: Some(value.clone()),
                    ..Default::default()
                }));
            }
        }
        for ((name, mechanism), c) in &self.scram_credentials {
            out.push(MetadataRecord::UserScramCredential(
                UserScramCredentialRecord {
                    name: name.clone(),
                    mechanism: *mechanism,
                    salt: c.salt.clone(),
                    stored_key: c.stored_key.clone(),
                    server_key: c.server_key.clone(),
                    iterations: c.iterations,
                    ..Default::default()
                },
            ));
        }
        for (id, acl) in self.acls.iter() {
            out.push(MetadataRecord::AccessControlEntry(acl_record(*id, acl)));
        }
        out.extend(crate::client_quotas::records(&self.client_quotas));
        out.extend(crate::delegation_tokens::records(&self.delegation_tokens));
        for ((topic_id, partition), segments) in &self.remote_log {
            let topic = self.topics.get(topic_id).map_or("", |t| t.name.as_str());
            for m in segments.values() {
                out.push(MetadataRecord::RemoteLogSegmentMetadata(
                    crate::remote_log::segment_record(topic, *topic_id, *partition, m),
                ));
            }
        }
        if self.next_producer_id > 0 {
            out.push(MetadataRecord::ProducerIds(ProducerIdsRecord {
                broker_id: -1,
                broker_epoch: -1,
                next_producer_id: self.next_producer_id,
                ..Default::default()
            }));
        }
        out
    }

    /// The image as snapshot bytes: `i64` big-endian next offset, then the batch of
    /// [`MetadataImage::to_records`].
    pub fn to_snapshot(&self) -> Result<Bytes, MetadataError> {
        let batch = encode_batch(&self.to_records())?;
        let mut buf = BytesMut::with_capacity(8 + batch.len());
        buf.put_i64(self.next_offset);
        buf.put_slice(&batch);
        Ok(buf.freeze())
    }

    /// Rebuilds an image from [`MetadataImage::to_snapshot`] bytes.
    pub fn from_snapshot(mut bytes: Bytes) -> Result<MetadataImage, MetadataError> {
        if bytes.remaining() < 8 {
            return Err(MetadataError::Corrupt {
                reason: "metadata snapshot shorter than its header",
            });
        }
        let next_offset = bytes.get_i64();
        let mut image = MetadataImage::new();
        for record in decode_batch(bytes)? {
            image.apply(&record)?;
        }
        image.next_offset = next_offset;
        Ok(image)
    }
}

/// The record that stores `acl` under `id`.
pub fn acl_record(id: Uuid, acl: &StandardAcl) -> AccessControlEntryRecord {
    AccessControlEntryRecord {
        id,
        resource_type: acl.resource_type.code(),
        resource_name: acl.resource_name.clone(),
        pattern_type: acl.pattern_type.code(),
        principal: acl.principal.clone(),
        host: acl.host.clone(),
        operation: acl.operation.code(),
        permission_type: acl.permission_type.code(),
        ..Default::default()
    }
}

fn sorted(dirs: &[Uuid]) -> Vec<Uuid> {
    let mut dirs = dirs.to_vec();
    dirs.sort_by_key(|d| d.0);
    dirs.dedup();
    dirs
}

fn inconsistent(reason: String) -> MetadataError {
    MetadataError::Inconsistent { reason }
}

/// A partition named the way the broker's replica manager names it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TopicPartition {
    pub topic: String,
    pub partition: i32,
}

/// What one broker must do after its image moved from `old` to `new` (Kafka's
/// `LocalReplicaChanges`): become leader, become follower, or stop and delete a replica.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LocalReplicaChanges {
    /// Partitions this broker now leads, whose registration changed (a new leader or
    /// partition epoch).
    pub leaders: Vec<(TopicPartition, Uuid, PartitionRegistration)>,
    /// Partitions this broker now follows, whose registration changed.
    pub followers: Vec<(TopicPartition, Uuid, PartitionRegistration)>,
    /// Replicas this broker no longer hosts (topic deleted or reassigned away).
    pub deletes: Vec<(TopicPartition, Uuid)>,
}

impl LocalReplicaChanges {
    /// The changes for `broker_id` between two images.
    pub fn between(old: &MetadataImage, new: &MetadataImage, broker_id: i32) -> Self {
        let mut changes = LocalReplicaChanges::default();
        for t in new.topics.values() {
            for (id, p) in &t.partitions {
                if !p.replicas.contains(&broker_id) {
                    continue;
                }
                let before = old.topics.get(&t.id).and_then(|ot| ot.partitions.get(id));
                // Any new partition epoch, even one that ends where an earlier state was
                // (an ISR shrunk by the controller back to what it was two epochs ago):
                // a leader that proposed the change in between must hear of it.
                let changed = before.is_none_or(|b| {
                    b.leader != p.leader
                        || b.leader_epoch != p.leader_epoch
                        || b.partition_epoch != p.partition_epoch
                        || b.replicas != p.replicas
                        || b.isr != p.isr
                });
                if !changed {
                    continue;
                }
                let tp = TopicPartition {
                    topic: t.name.clone(),
                    partition: *id,
                };
                if p.leader == broker_id {
                    changes.leaders.push((tp, t.id, p.clone()));
                } else {
                    changes.followers.push((tp, t.id, p.clone()));
                }
            }
        }
        for t in old.topics.values() {
            for (id, p) in &t.partitions {
                if !p.replicas.contains(&broker_id) {
                    continue;
                }
                let still = new
                    .topics
                    .get(&t.id)
                    .and_then(|nt| nt.partitions.get(id))
                    .is_some_and(|np| np.replicas.contains(&broker_id));
                if !still {
                    changes.deletes.push((
                        TopicPartition {
                            topic: t.name.clone(),
                            partition: *id,
                        },
                        t.id,
                    ));
                }
            }
        }
        changes
    }
}
