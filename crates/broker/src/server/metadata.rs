//! Cluster discovery: Metadata, FindCoordinator and DescribeCluster; and
//! UnregisterBroker, which removes a broker from what they describe.
//!
//! Every broker answers from its own metadata image: the registered, unfenced brokers
//! with the endpoints they registered, each partition's leader, leader epoch, replicas
//! and ISR as the controller last decided them. A group's coordinator is the leader of
//! its `__consumer_offsets` partition (created on the first FindCoordinator, as Kafka
//! does).

use rill_metadata::{
    ControllerEvent, ControllerResponse, CreatableTopic, MetadataImage, TopicImage,
    UnregisterBrokerRequest as CtlUnregisterBroker,
};
use rill_protocol::generated::describe_cluster_request::DescribeClusterRequest;
use rill_protocol::generated::describe_cluster_response::{
    DescribeClusterBroker, DescribeClusterResponse,
};
use rill_protocol::generated::find_coordinator_request::FindCoordinatorRequest;
use rill_protocol::generated::find_coordinator_response::{Coordinator, FindCoordinatorResponse};
use rill_protocol::generated::metadata_request::MetadataRequest;
use rill_protocol::generated::metadata_response::{
    MetadataResponse, MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use rill_protocol::generated::unregister_broker_request::UnregisterBrokerRequest;
use rill_protocol::generated::unregister_broker_response::UnregisterBrokerResponse;
use rill_protocol::ErrorCode;

use crate::coordinator::group_coordinator::OFFSETS_TOPIC;
use crate::server::Broker;

/// Kafka's default replication factor for `__consumer_offsets` and `__transaction_state`.
const INTERNAL_TOPIC_REPLICATION_FACTOR: i16 = 3;

/// `FindCoordinator` key types.
const KEY_TYPE_GROUP: i8 = 0;
const KEY_TYPE_TRANSACTION: i8 = 1;
/// KIP-932's share coordinator, FindCoordinator v6 on.
const KEY_TYPE_SHARE: i8 = 2;

/// A broker's endpoint on one listener as registered: `(host, port)`; `None` when the
/// broker has no such listener (Kafka then leaves it out of what it tells that
/// listener's clients).
pub(crate) fn broker_endpoint(
    image: &MetadataImage,
    id: i32,
    listener: &str,
) -> Option<(String, i32)> {
    let b = image.broker(id)?;
    let e = b.endpoints.iter().find(|e| e.name == listener)?;
    Some((e.host.clone(), i32::from(e.port)))
}

/// The unfenced brokers with their endpoint on `listener`: `(id, host, port, rack)`,
/// what Metadata and DescribeCluster list (Kafka leaves fenced brokers out).
fn live_brokers<'a>(
    image: &'a MetadataImage,
    listener: &'a str,
) -> impl Iterator<Item = (i32, String, i32, Option<String>)> + 'a {
    image
        .brokers
        .values()
        .filter(|b| !b.fenced)
        .filter_map(move |b| {
            let (host, port) = broker_endpoint(image, b.id, listener)?;
            Some((b.id, host, port, b.rack.clone()))
        })
}

/// The id clients are told is the controller: the active controller when it is a
/// registered broker (clients cannot talk to a controller-only node), else the lowest
/// live broker, as KRaft brokers do.
pub(crate) fn controller_id_for_clients(broker: &Broker, image: &MetadataImage) -> i32 {
    let leader = broker
        .quorum
        .leader_id()
        .and_then(|id| i32::try_from(id).ok());
    match leader {
        Some(id) if image.is_live(id) => id,
        _ => image.live_brokers().first().copied().unwrap_or(-1),
    }
}

impl Broker {
    pub(crate) fn metadata_topic(
        &self,
        image: &MetadataImage,
        topic: &TopicImage,
    ) -> MetadataResponseTopic {
        let partitions = topic
            .partitions
            .iter()
            .map(|(index, p)| {
                let offline = p
                    .replicas
                    .iter()
                    .copied()
                    // Fenced, or in a log directory that failed (KIP-858), as Kafka's
                    // `KRaftMetadataCache.isReplicaOffline` says.
                    .filter(|r| {
                        image
                            .broker(*r)
                            .is_none_or(|b| b.fenced || !b.has_online_dir(p.directory(*r)))
                    })
                    .collect();
                // Without its controller lease this broker leads nothing, whatever its
                // (possibly stale) image says: naming itself would send clients back.
                let leader = if p.leader == self.node_id && !self.replicas.lease_held() {
                    -1
                } else {
                    p.leader
                };
                let error_code = if leader < 0 {
                    ErrorCode::LEADER_NOT_AVAILABLE.code()
                } else {
                    0
                };
                MetadataResponsePartition {
                    error_code,
                    partition_index: *index,
                    leader_id: leader,
                    leader_epoch: p.leader_epoch,
                    replica_nodes: p.replicas.clone(),
                    isr_nodes: p.isr.clone(),
                    offline_replicas: offline,
                    ..Default::default()
                }
            })
            .collect();
        MetadataResponseTopic {
            error_code: 0,
            name: Some(topic.name.clone()),
            topic_id: topic.id,
            is_internal: topic.name.starts_with("__"),
            partitions,
            ..Default::default()
        }
    }

    /// Creates a topic that a client named (Metadata with auto-creation allowed).
    async fn auto_create(&self, name: &str) -> ErrorCode {
        let results = self
            .create_topics(vec![CreatableTopic::new(name, -1, -1)], false)
            .await;
        match results.first() {
            Some(r) if r.error_code == ErrorCode::NONE => {
                tracing::info!(topic = %name, "auto-created topic");
                ErrorCode::NONE
            }
            Some(r) if r.error_code == ErrorCode::TOPIC_ALREADY_EXISTS => ErrorCode::NONE,
            Some(r) => r.error_code,
            None => ErrorCode::UNKNOWN_SERVER_ERROR,
        }
    }

    pub(crate) async fn handle_metadata(
        &self,
        request: MetadataRequest,
        version: i16,
        listener: &str,
    ) -> MetadataResponse {
        let all = match &request.topics {
            None => true,
            // In v0 an empty list meant every topic; null was introduced in v1 for that.
            Some(list) => version == 0 && list.is_empty(),
        };
        let allow_auto_create =
            request.allow_auto_topic_creation && self.config.auto_create_topics();
        // Auto-creation first, so that the answer below comes from one image.
        let mut create_errors = std::collections::HashMap::new();
        if !all && allow_auto_create {
            let image = self.image();
            for req in request.topics.iter().flatten() {
                if let Some(name) = &req.name {
                    if image.topic(name).is_none() {
                        let code = self.auto_create(name).await;
                        if code != ErrorCode::NONE {
                            create_errors.insert(name.clone(), code);
                        }
                    }
                }
            }
        }
        let image = self.image();
        let topics = if all {
            image
                .topics_by_name
                .values()
                .filter_map(|id| image.topics.get(id))
                .map(|t| self.metadata_topic(&image, t))
                .collect()
        } else {
            let requested = request.topics.unwrap_or_default();
            requested
                .into_iter()
                .map(|req| {
                    let found = match &req.name {
                        Some(name) => image.topic(name),
                        None => image.topics.get(&req.topic_id),
                    };
                    if let Some(t) = found {
                        return self.metadata_topic(&image, t);
                    }
                    match req.name {
                        None => MetadataResponseTopic {
                            error_code: ErrorCode::UNKNOWN_TOPIC_ID.code(),
                            topic_id: req.topic_id,
                            ..Default::default()
                        },
                        Some(name) => {
                            let code = if let Some(code) = create_errors.get(&name) {
                                *code
                            } else if allow_auto_create {
                                // Created, but not yet in this image.
                                ErrorCode::LEADER_NOT_AVAILABLE
                            } else {
                                ErrorCode::UNKNOWN_TOPIC_OR_PARTITION
                            };
                            MetadataResponseTopic {
                                error_code: code.code(),
                                name: Some(name),
                                ..Default::default()
                            }
                        }
                    }
                })
                .collect()
        };
        let brokers = live_brokers(&image, listener)
            .map(|(node_id, host, port, rack)| MetadataResponseBroker {
                node_id,
                host,
                port,
                rack,
                ..Default::default()
            })
            .collect();
        MetadataResponse {
            brokers,
            cluster_id: Some(self.cluster_id.clone()),
            controller_id: controller_id_for_clients(self, &image),
            topics,
            ..Default::default()
        }
    }

    /// The coordinator of a group: the leader of its `__consumer_offsets` partition,
    /// creating the topic on first use.
    async fn group_coordinator_node(
        &self,
        group_id: &str,
        listener: &str,
    ) -> Result<(i32, String, i32), ErrorCode> {
        let partitions = self
            .config
            .group_config()
            .map(|c| c.offsets_topic_num_partitions)
            .unwrap_or(50);
        if self.image().topic(OFFSETS_TOPIC).is_none() {
            self.ensure_offsets_topic(partitions).await?;
        }
        let image = self.image();
        let p = rill_group::partition_for(group_id, partitions);
        let leader = image
            .partition(OFFSETS_TOPIC, p)
            .map(|p| p.leader)
            .filter(|l| *l >= 0 && (*l != self.node_id || self.replicas.lease_held()))
            .ok_or(ErrorCode::COORDINATOR_NOT_AVAILABLE)?;
        let (host, port) = broker_endpoint(&image, leader, listener)
            .ok_or(ErrorCode::COORDINATOR_NOT_AVAILABLE)?;
        Ok((leader, host, port))
    }

    /// Creates `__consumer_offsets` (compacted, `offsets.topic.num.partitions` partitions
    /// of `offsets.topic.replication.factor` replicas).
    async fn ensure_offsets_topic(&self, partitions: i32) -> Result<(), ErrorCode> {
        let rf = self.internal_topic_replication_factor("offsets.topic.replication.factor");
        let segment_bytes = self
            .config
            .get("offsets.topic.segment.bytes")
            .unwrap_or("104857600");
        let mut topic = CreatableTopic::new(OFFSETS_TOPIC, partitions, rf);
        topic.configs = [
            ("cleanup.policy", "compact"),
            ("compression.type", "producer"),
            ("segment.bytes", segment_bytes.trim()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), Some(v.to_string())))
        .collect();
        self.create_internal_topic(topic).await
    }

    /// The replication factor of an internal topic: the key's value when set, as Kafka
    /// takes it (creation fails until that many brokers are live); unset, Kafka's default
    /// of 3 capped at the brokers live now, so that a single node and a small cluster work
    /// without configuration while a cluster of three or more gets coordinators that fail
    /// over (Kafka's default would leave a single node without groups or transactions).
    pub(crate) fn internal_topic_replication_factor(&self, key: &str) -> i16 {
        if self.config.is_set(key) {
            return self
                .config
                .get(key)
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(INTERNAL_TOPIC_REPLICATION_FACTOR);
        }
        let live = i16::try_from(self.image().live_brokers().len()).unwrap_or(i16::MAX);
        live.clamp(1, INTERNAL_TOPIC_REPLICATION_FACTOR)
    }

    /// Creates an internal topic a coordinator lives on (`__consumer_offsets`,
    /// `__transaction_state`); one that exists already is fine. A refusal makes the
    /// coordinator unavailable for now, as Kafka answers while it cannot create it.
    pub(crate) async fn create_internal_topic(
        &self,
        topic: CreatableTopic,
    ) -> Result<(), ErrorCode> {
        let name = topic.name.clone();
        let event =
            rill_metadata::ControllerEvent::CreateTopics(rill_metadata::CreateTopicsRequest {
                topics: vec![topic],
                validate_only: false,
            });
        match self.controller_call(event).await? {
            rill_metadata::ControllerResponse::CreateTopics(r) => match r.first() {
                Some(r)
                    if r.error_code == ErrorCode::NONE
                        || r.error_code == ErrorCode::TOPIC_ALREADY_EXISTS =>
                {
                    Ok(())
                }
                Some(r) => {
                    tracing::warn!(error = r.error_code.name(), message = ?r.error_message, "cannot create {name}");
                    Err(ErrorCode::COORDINATOR_NOT_AVAILABLE)
                }
                None => Err(ErrorCode::COORDINATOR_NOT_AVAILABLE),
            },
            _ => Err(ErrorCode::COORDINATOR_NOT_AVAILABLE),
        }
    }

    pub(crate) async fn handle_find_coordinator(
        &self,
        request: FindCoordinatorRequest,
        version: i16,
        listener: &str,
    ) -> FindCoordinatorResponse {
        let keys: Vec<String> = if version >= 4 {
            request.coordinator_keys.clone()
        } else {
            vec![request.key.clone()]
        };
        let mut coordinators = Vec::with_capacity(keys.len());
        for key in keys {
            let found = if request.key_type == KEY_TYPE_GROUP {
                self.group_coordinator_node(&key, listener).await
            } else if request.key_type == KEY_TYPE_TRANSACTION {
                self.transaction_coordinator_node(&key, listener).await
            } else if request.key_type == KEY_TYPE_SHARE && version >= 6 {
                self.share_coordinator_node(&key, listener).await
            } else {
                Err(ErrorCode::INVALID_REQUEST)
            };
            coordinators.push(match found {
                Ok((node_id, host, port)) => Coordinator {
                    key,
                    node_id,
                    host,
                    port,
                    ..Default::default()
                },
                Err(code) => Coordinator {
                    key,
                    node_id: -1,
                    host: String::new(),
                    port: -1,
                    error_code: code.code(),
                    error_message: Some(code.name().to_string()),
                    ..Default::default()
                },
            });
        }
        if version >= 4 {
            FindCoordinatorResponse {
                coordinators,
                ..Default::default()
            }
        } else {
            let c = coordinators.pop().unwrap_or_default();
            FindCoordinatorResponse {
                error_code: c.error_code,
                error_message: c.error_message,
                node_id: c.node_id,
                host: c.host,
                port: c.port,
                ..Default::default()
            }
        }
    }

    pub(crate) fn handle_describe_cluster(
        &self,
        request: DescribeClusterRequest,
        listener: &str,
    ) -> DescribeClusterResponse {
        let image = self.image();
        // Version 2 (KIP-1073) may ask for the fenced brokers too, marked as such, so that
        // an operator can find a broker that registered but never caught up.
        let brokers = image
            .brokers
            .values()
            .filter(|b| !b.fenced || request.include_fenced_brokers)
            .filter_map(|b| {
                let (host, port) = broker_endpoint(&image, b.id, listener)?;
                Some(DescribeClusterBroker {
                    broker_id: b.id,
                    host,
                    port,
                    rack: b.rack.clone(),
                    is_fenced: b.fenced,
                    ..Default::default()
                })
            })
            .collect();
        DescribeClusterResponse {
            cluster_id: self.cluster_id.clone(),
            controller_id: controller_id_for_clients(self, &image),
            brokers,
            ..Default::default()
        }
    }

    /// UnregisterBroker (KIP-631): the controller forgets the broker's registration; see
    /// `QuorumController::unregister_broker`.
    pub(crate) async fn handle_unregister_broker(
        &self,
        request: UnregisterBrokerRequest,
    ) -> UnregisterBrokerResponse {
        let event = ControllerEvent::UnregisterBroker(CtlUnregisterBroker {
            broker_id: request.broker_id,
        });
        let (code, message) = match self.controller_call(event).await {
            Ok(ControllerResponse::UnregisterBroker(r)) => (r.error_code, r.error_message),
            Ok(other) => {
                tracing::error!(?other, "unexpected controller answer to UnregisterBroker");
                (ErrorCode::UNKNOWN_SERVER_ERROR, None)
            }
            Err(code) => (code, None),
        };
        if code == ErrorCode::NONE {
            tracing::info!(broker = request.broker_id, "unregistered broker");
        }
        UnregisterBrokerResponse {
            error_code: code.code(),
            error_message: message,
            ..Default::default()
        }
    }
}
