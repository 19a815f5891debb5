//! Cluster discovery: Metadata, FindCoordinator and DescribeCluster.
//!
//! On a single node this broker is the controller, the leader of every partition and the
//! coordinator of every group, so the answers are built from the local topic table.

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
use rill_protocol::ErrorCode;

use crate::metadata_store::TopicMeta;
use crate::replica_manager::SINGLE_NODE_LEADER_EPOCH;
use crate::Broker;

/// `FindCoordinator` key types.
const KEY_TYPE_GROUP: i8 = 0;

impl Broker {
    fn metadata_topic(&self, topic: &TopicMeta) -> MetadataResponseTopic {
        let partitions = (0..topic.partitions)
            .map(|p| MetadataResponsePartition {
                error_code: 0,
                partition_index: p,
                leader_id: self.node_id,
                leader_epoch: SINGLE_NODE_LEADER_EPOCH,
                replica_nodes: vec![self.node_id],
                isr_nodes: vec![self.node_id],
                offline_replicas: Vec::new(),
                ..Default::default()
            })
            .collect();
        MetadataResponseTopic {
            error_code: 0,
            name: Some(topic.name.clone()),
            topic_id: topic.topic_id(),
            is_internal: topic.internal,
            partitions,
            ..Default::default()
        }
    }

    pub(crate) fn handle_metadata(
        &self,
        request: MetadataRequest,
        version: i16,
    ) -> MetadataResponse {
        let all = match &request.topics {
            None => true,
            // In v0 an empty list meant every topic; null was introduced in v1 for that.
            Some(list) => version == 0 && list.is_empty(),
        };
        let allow_auto_create =
            request.allow_auto_topic_creation && self.config.auto_create_topics();
        let topics = if all {
            self.topics()
                .iter()
                .map(|t| self.metadata_topic(t))
                .collect()
        } else {
            let requested = request.topics.unwrap_or_default();
            requested
                .into_iter()
                .map(|req| {
                    let found = match &req.name {
                        Some(name) => self.topic(name),
                        None => self
                            .topic_name_by_id(&req.topic_id)
                            .and_then(|name| self.topic(&name)),
                    };
                    if let Some(t) = found {
                        return self.metadata_topic(&t);
                    }
                    let Some(name) = req.name else {
                        return MetadataResponseTopic {
                            error_code: ErrorCode::UNKNOWN_TOPIC_ID.code(),
                            topic_id: req.topic_id,
                            ..Default::default()
                        };
                    };
                    if !allow_auto_create {
                        return MetadataResponseTopic {
                            error_code: ErrorCode::UNKNOWN_TOPIC_OR_PARTITION.code(),
                            name: Some(name),
                            ..Default::default()
                        };
                    }
                    let partitions = self.config.num_partitions().unwrap_or(1);
                    let rf = self.config.default_replication_factor().unwrap_or(1);
                    match self.create_topic(&name, partitions, rf, Default::default(), false) {
                        Ok(t) => {
                            tracing::info!(topic = %name, partitions, "auto-created topic");
                            self.metadata_topic(&t)
                        }
                        // Lost a race with another creator: the topic exists now.
                        Err((code, _)) if code == ErrorCode::TOPIC_ALREADY_EXISTS => {
                            match self.topic(&name) {
                                Some(t) => self.metadata_topic(&t),
                                None => MetadataResponseTopic {
                                    error_code: ErrorCode::LEADER_NOT_AVAILABLE.code(),
                                    name: Some(name),
                                    ..Default::default()
                                },
                            }
                        }
                        Err((code, _)) => MetadataResponseTopic {
                            error_code: code.code(),
                            name: Some(name),
                            ..Default::default()
                        },
                    }
                })
                .collect()
        };
        MetadataResponse {
            brokers: vec![MetadataResponseBroker {
                node_id: self.node_id,
                host: self.advertised_host.clone(),
                port: self.advertised_port,
                rack: None,
                ..Default::default()
            }],
            cluster_id: Some(self.cluster_id()),
            controller_id: self.node_id,
            topics,
            ..Default::default()
        }
    }

    pub(crate) fn handle_find_coordinator(
        &self,
        request: FindCoordinatorRequest,
        version: i16,
    ) -> FindCoordinatorResponse {
        let answer = |key: String| -> Coordinator {
            if request.key_type == KEY_TYPE_GROUP {
                Coordinator {
                    key,
                    node_id: self.node_id,
                    host: self.advertised_host.clone(),
                    port: self.advertised_port,
                    error_code: 0,
                    error_message: None,
                    ..Default::default()
                }
            } else {
                // Transaction coordinators are not built yet.
                Coordinator {
                    key,
                    node_id: -1,
                    host: String::new(),
                    port: -1,
                    error_code: ErrorCode::COORDINATOR_NOT_AVAILABLE.code(),
                    error_message: Some("transactions are not supported yet".into()),
                    ..Default::default()
                }
            }
        };
        if version >= 4 {
            let coordinators = request
                .coordinator_keys
                .iter()
                .cloned()
                .map(answer)
                .collect();
            FindCoordinatorResponse {
                coordinators,
                ..Default::default()
            }
        } else {
            let c = answer(request.key.clone());
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
        _request: DescribeClusterRequest,
    ) -> DescribeClusterResponse {
        DescribeClusterResponse {
            cluster_id: self.cluster_id(),
            controller_id: self.node_id,
            brokers: vec![DescribeClusterBroker {
                broker_id: self.node_id,
                host: self.advertised_host.clone(),
                port: self.advertised_port,
                rack: None,
                ..Default::default()
            }],
            ..Default::default()
        }
    }
}
