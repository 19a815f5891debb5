//! KIP-848's consumer group APIs on the wire: ConsumerGroupHeartbeat (v0-1) and
//! ConsumerGroupDescribe (v0).
//!
//! The heartbeat handler resolves what the broker decides for the group — its session
//! timeout and heartbeat interval, the group's own `consumer.session.timeout.ms` and
//! `consumer.heartbeat.interval.ms` (GROUP configs) over the broker's
//! `group.consumer.*` — and hands the request to the group coordinator, whose answer
//! comes once its records are replicated. Authorization (READ on the group, DESCRIBE on
//! the subscribed topics; DESCRIBE on each described group) is the request gate's
//! (`request_authorization.rs`).

use std::net::SocketAddr;

use rill_group as g;
use rill_metadata::{MetadataImage, RESOURCE_GROUP};
use rill_protocol::generated::{
    consumer_group_describe_request as cdq, consumer_group_describe_response as cds,
    consumer_group_heartbeat_request as chq, consumer_group_heartbeat_response as chs,
};
use rill_protocol::ErrorCode;

use crate::coordinator::group_coordinator::{GroupCall, GroupReply};
use crate::server::Broker;

/// The cluster's topics as the group coordinator needs them: name, id, partitions.
pub(crate) fn topics_image(image: &MetadataImage) -> g::TopicsImage {
    g::TopicsImage::new(image.topics.values().map(|t| g::TopicImage {
        id: t.id,
        name: t.name.clone(),
        num_partitions: i32::try_from(t.partitions.len()).unwrap_or(i32::MAX),
    }))
}

/// Whether the topics (names, ids, partition counts) differ between two images.
pub(crate) fn topics_changed(old: &MetadataImage, new: &MetadataImage) -> bool {
    old.topics.len() != new.topics.len()
        || old
            .topics
            .iter()
            .zip(new.topics.iter())
            .any(|((a, x), (b, y))| {
                a != b || x.name != y.name || x.partitions.len() != y.partitions.len()
            })
}

fn heartbeat_error(code: i16, message: Option<String>) -> chs::ConsumerGroupHeartbeatResponse {
    chs::ConsumerGroupHeartbeatResponse {
        error_code: code,
        error_message: message,
        ..Default::default()
    }
}

impl Broker {
    /// A GROUP config of `group_id` as an int: its override, else the broker's key.
    pub(crate) fn group_config_ms(&self, group_id: &str, name: &str, broker_key: &str) -> i32 {
        let image = self.image();
        let own = image
            .configs
            .get(&(RESOURCE_GROUP, group_id.to_owned()))
            .and_then(|o| o.get(name))
            .and_then(|v| v.trim().parse().ok());
        own.or_else(|| {
            crate::config::broker_config_synonyms(&self.config, &image, self.node_id, broker_key)
                .first()
                .and_then(|(v, _)| v.trim().parse().ok())
        })
        .unwrap_or(0)
    }

    pub(crate) async fn handle_consumer_group_heartbeat(
        &self,
        r: chq::ConsumerGroupHeartbeatRequest,
        client_id: &str,
        peer: SocketAddr,
    ) -> chs::ConsumerGroupHeartbeatResponse {
        let session_timeout_ms = self.group_config_ms(
            &r.group_id,
            "consumer.session.timeout.ms",
            "group.consumer.session.timeout.ms",
        );
        let heartbeat_interval_ms = self.group_config_ms(
            &r.group_id,
            "consumer.heartbeat.interval.ms",
            "group.consumer.heartbeat.interval.ms",
        );
        let request = g::ConsumerGroupHeartbeatRequest {
            group_id: r.group_id,
            member_id: r.member_id,
            member_epoch: r.member_epoch,
            instance_id: r.instance_id,
            rack_id: r.rack_id,
            rebalance_timeout_ms: r.rebalance_timeout_ms,
            subscribed_topic_names: r.subscribed_topic_names,
            subscribed_topic_regex: r.subscribed_topic_regex,
            server_assignor: r.server_assignor,
            topic_partitions: r.topic_partitions.map(|list| {
                list.into_iter()
                    .map(|tp| g::TopicPartitions {
                        topic_id: tp.topic_id,
                        partitions: tp.partitions,
                    })
                    .collect()
            }),
            client_id: client_id.to_owned(),
            client_host: format!("/{}", peer.ip()),
            session_timeout_ms,
            heartbeat_interval_ms,
        };
        let answer = match self
            .groups
            .call(GroupCall::ConsumerGroupHeartbeat(request))
            .await
        {
            Ok(GroupReply::Response(g::Response::ConsumerGroupHeartbeat(resp))) => resp,
            Ok(_) => {
                tracing::error!("group coordinator answered with the wrong response type");
                return heartbeat_error(ErrorCode::UNKNOWN_SERVER_ERROR.code(), None);
            }
            Err(code) => return heartbeat_error(code.code(), None),
        };
        chs::ConsumerGroupHeartbeatResponse {
            error_code: answer.error_code,
            error_message: answer.error_message,
            member_id: answer.member_id,
            member_epoch: answer.member_epoch,
            heartbeat_interval_ms: answer.heartbeat_interval_ms,
            assignment: answer.assignment.map(|list| chs::Assignment {
                topic_partitions: list
                    .into_iter()
                    .map(|tp| chs::TopicPartitions {
                        topic_id: tp.topic_id,
                        partitions: tp.partitions,
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    pub(crate) async fn handle_consumer_group_describe(
        &self,
        r: cdq::ConsumerGroupDescribeRequest,
    ) -> cds::ConsumerGroupDescribeResponse {
        let ids = r.group_ids.clone();
        let request = g::ConsumerGroupDescribeRequest {
            group_ids: r.group_ids,
        };
        let described = match self
            .groups
            .call(GroupCall::ConsumerGroupDescribe(request))
            .await
        {
            Ok(GroupReply::ConsumerGroupDescribe(resp)) => resp.groups,
            other => {
                let code = match other {
                    Err(code) => code,
                    Ok(_) => ErrorCode::UNKNOWN_SERVER_ERROR,
                };
                ids.iter()
                    .map(|id| g::DescribedConsumerGroup::error(id, code.code(), None))
                    .collect()
            }
        };
        let assignment = |list: Vec<g::DescribedTopicPartitions>| cds::Assignment {
            topic_partitions: list
                .into_iter()
                .map(|tp| cds::TopicPartitions {
                    topic_id: tp.topic_id,
                    topic_name: tp.topic_name,
                    partitions: tp.partitions,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        cds::ConsumerGroupDescribeResponse {
            groups: described
                .into_iter()
                .map(|d| cds::DescribedGroup {
                    error_code: d.error_code,
                    error_message: d.error_message,
                    group_id: d.group_id,
                    group_state: d.group_state,
                    group_epoch: d.group_epoch,
                    assignment_epoch: d.assignment_epoch,
                    assignor_name: d.assignor_name,
                    members: d
                        .members
                        .into_iter()
                        .map(|m| cds::Member {
                            member_id: m.member_id,
                            instance_id: m.instance_id,
                            rack_id: m.rack_id,
                            member_epoch: m.member_epoch,
                            client_id: m.client_id,
                            client_host: m.client_host,
                            subscribed_topic_names: m.subscribed_topic_names,
                            subscribed_topic_regex: m.subscribed_topic_regex,
                            assignment: assignment(m.assignment),
                            target_assignment: assignment(m.target_assignment),
                            // KIP-1099's MemberType (version 1): 0 classic, 1 consumer.
                            member_type: if m.uses_classic_protocol { 0 } else { 1 },
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }
}
