//! KIP-932's share group membership on the wire: ShareGroupHeartbeat (v1) and
//! ShareGroupDescribe (v1), as Kafka 4.2 serves them.
//!
//! The heartbeat handler resolves what the broker decides for the group — its session
//! timeout and heartbeat interval, the group's own `share.session.timeout.ms` and
//! `share.heartbeat.interval.ms` (GROUP configs) over the broker's `group.share.*` —
//! and hands the request to the group coordinator, whose answer comes once its records
//! are replicated. Authorization (READ on the group, DESCRIBE on the subscribed topics;
//! DESCRIBE on each described group, and the authorized operations when asked) is the
//! request gate's (`request_authorization.rs`).

use std::net::SocketAddr;

use rill_group as g;
use rill_protocol::generated::{
    share_group_describe_request as sdq, share_group_describe_response as sds,
    share_group_heartbeat_request as shq, share_group_heartbeat_response as shs,
};
use rill_protocol::ErrorCode;

use crate::coordinator::group_coordinator::{GroupCall, GroupReply};
use crate::server::Broker;

fn heartbeat_error(code: i16) -> shs::ShareGroupHeartbeatResponse {
    shs::ShareGroupHeartbeatResponse {
        error_code: code,
        ..Default::default()
    }
}

impl Broker {
    pub(crate) async fn handle_share_group_heartbeat(
        &self,
        r: shq::ShareGroupHeartbeatRequest,
        client_id: &str,
        peer: SocketAddr,
    ) -> shs::ShareGroupHeartbeatResponse {
        let session_timeout_ms = self.group_config_ms(
            &r.group_id,
            "share.session.timeout.ms",
            "group.share.session.timeout.ms",
        );
        let heartbeat_interval_ms = self.group_config_ms(
            &r.group_id,
            "share.heartbeat.interval.ms",
            "group.share.heartbeat.interval.ms",
        );
        let request = g::ShareGroupHeartbeatRequest {
            group_id: r.group_id,
            member_id: r.member_id,
            member_epoch: r.member_epoch,
            rack_id: r.rack_id,
            subscribed_topic_names: r.subscribed_topic_names,
            client_id: client_id.to_owned(),
            client_host: format!("/{}", peer.ip()),
            session_timeout_ms,
            heartbeat_interval_ms,
        };
        let answer = match self
            .groups
            .call(GroupCall::ShareGroupHeartbeat(request))
            .await
        {
            Ok(GroupReply::Response(g::Response::ShareGroupHeartbeat(resp))) => resp,
            Ok(_) => {
                tracing::error!("group coordinator answered with the wrong response type");
                return heartbeat_error(ErrorCode::UNKNOWN_SERVER_ERROR.code());
            }
            Err(code) => return heartbeat_error(code.code()),
        };
        shs::ShareGroupHeartbeatResponse {
            error_code: answer.error_code,
            error_message: answer.error_message,
            member_id: answer.member_id,
            member_epoch: answer.member_epoch,
            heartbeat_interval_ms: answer.heartbeat_interval_ms,
            assignment: answer.assignment.map(|list| shs::Assignment {
                topic_partitions: list
                    .into_iter()
                    .map(|tp| shs::TopicPartitions {
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

    pub(crate) async fn handle_share_group_describe(
        &self,
        r: sdq::ShareGroupDescribeRequest,
    ) -> sds::ShareGroupDescribeResponse {
        let ids = r.group_ids.clone();
        let request = g::ShareGroupDescribeRequest {
            group_ids: r.group_ids,
        };
        let described = match self
            .groups
            .call(GroupCall::ShareGroupDescribe(request))
            .await
        {
            Ok(GroupReply::ShareGroupDescribe(resp)) => resp.groups,
            other => {
                let code = match other {
                    Err(code) => code,
                    Ok(_) => ErrorCode::UNKNOWN_SERVER_ERROR,
                };
                ids.iter()
                    .map(|id| g::DescribedShareGroup::error(id, code.code(), None))
                    .collect()
            }
        };
        sds::ShareGroupDescribeResponse {
            groups: described
                .into_iter()
                .map(|d| sds::DescribedGroup {
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
                        .map(|m| sds::Member {
                            member_id: m.member_id,
                            rack_id: m.rack_id,
                            member_epoch: m.member_epoch,
                            client_id: m.client_id,
                            client_host: m.client_host,
                            subscribed_topic_names: m.subscribed_topic_names,
                            assignment: sds::Assignment {
                                topic_partitions: m
                                    .assignment
                                    .into_iter()
                                    .map(|tp| sds::TopicPartitions {
                                        topic_id: tp.topic_id,
                                        topic_name: tp.topic_name,
                                        partitions: tp.partitions,
                                        ..Default::default()
                                    })
                                    .collect(),
                                ..Default::default()
                            },
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
