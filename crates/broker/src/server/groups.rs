//! Consumer groups on the wire: JoinGroup, SyncGroup, Heartbeat, LeaveGroup, OffsetCommit,
//! OffsetFetch, OffsetDelete, DescribeGroups, ListGroups and DeleteGroups.
//!
//! Each handler turns the versioned wire request into `rill-group`'s plain request, asks
//! the coordinator task, and shapes the answer for the request's version (the single-member
//! LeaveGroup of v0-2, the single-group OffsetFetch of v0-7, non-null strings before the
//! version that made them nullable).

use std::net::SocketAddr;

use rill_group as g;
use rill_protocol::generated::{
    delete_groups_request, delete_groups_response, describe_groups_request,
    describe_groups_response, heartbeat_request, heartbeat_response, join_group_request,
    join_group_response, leave_group_request, leave_group_response, list_groups_request,
    list_groups_response, offset_commit_request, offset_commit_response, offset_delete_request,
    offset_delete_response, offset_fetch_request, offset_fetch_response, sync_group_request,
    sync_group_response,
};
use rill_protocol::ErrorCode;

use crate::coordinator::group_coordinator::{GroupCall, GroupReply};
use crate::server::Broker;

/// The coordinator answered with something other than what was asked: a bug, reported as
/// an error to the one client rather than a panic.
fn mismatched() -> ErrorCode {
    tracing::error!("group coordinator answered with the wrong response type");
    ErrorCode::UNKNOWN_SERVER_ERROR
}

impl Broker {
    async fn group_call(&self, call: GroupCall) -> Result<GroupReply, ErrorCode> {
        self.groups.call(call).await
    }

    pub(crate) async fn handle_join_group(
        &self,
        r: join_group_request::JoinGroupRequest,
        version: i16,
        client_id: &str,
        peer: SocketAddr,
    ) -> join_group_response::JoinGroupResponse {
        let request = g::JoinGroupRequest {
            group_id: r.group_id,
            session_timeout_ms: r.session_timeout_ms,
            // v0 had no rebalance timeout: the session timeout served for both.
            rebalance_timeout_ms: if version == 0 {
                r.session_timeout_ms
            } else {
                r.rebalance_timeout_ms
            },
            member_id: r.member_id.clone(),
            group_instance_id: r.group_instance_id,
            protocol_type: r.protocol_type,
            protocols: r
                .protocols
                .into_iter()
                .map(|p| (p.name, p.metadata))
                .collect(),
            reason: r.reason,
            client_id: client_id.to_string(),
            client_host: format!("/{}", peer.ip()),
            api_version: version,
        };
        let answer = match self.group_call(GroupCall::Join(request)).await {
            Ok(GroupReply::Response(g::Response::JoinGroup(resp))) => resp,
            Ok(_) => g::JoinGroupResponse::error(&r.member_id, mismatched().code()),
            Err(code) => g::JoinGroupResponse::error(&r.member_id, code.code()),
        };
        let nullable = version >= 7;
        join_group_response::JoinGroupResponse {
            error_code: answer.error_code,
            generation_id: answer.generation_id,
            protocol_type: answer.protocol_type,
            protocol_name: if nullable {
                answer.protocol_name
            } else {
                Some(answer.protocol_name.unwrap_or_default())
            },
            leader: answer.leader,
            skip_assignment: answer.skip_assignment,
            member_id: answer.member_id,
            members: answer
                .members
                .into_iter()
                .map(|m| join_group_response::JoinGroupResponseMember {
                    member_id: m.member_id,
                    group_instance_id: m.group_instance_id,
                    metadata: m.metadata,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    pub(crate) async fn handle_sync_group(
        &self,
        r: sync_group_request::SyncGroupRequest,
    ) -> sync_group_response::SyncGroupResponse {
        let request = g::SyncGroupRequest {
            group_id: r.group_id,
            generation_id: r.generation_id,
            member_id: r.member_id,
            group_instance_id: r.group_instance_id,
            protocol_type: r.protocol_type,
            protocol_name: r.protocol_name,
            assignments: r
                .assignments
                .into_iter()
                .map(|a| (a.member_id, a.assignment))
                .collect(),
        };
        let answer = match self.group_call(GroupCall::Sync(request)).await {
            Ok(GroupReply::Response(g::Response::SyncGroup(resp))) => resp,
            Ok(_) => g::SyncGroupResponse::error(mismatched().code()),
            Err(code) => g::SyncGroupResponse::error(code.code()),
        };
        sync_group_response::SyncGroupResponse {
            error_code: answer.error_code,
            protocol_type: answer.protocol_type,
            protocol_name: answer.protocol_name,
            assignment: answer.assignment,
            ..Default::default()
        }
    }

    pub(crate) async fn handle_heartbeat(
        &self,
        r: heartbeat_request::HeartbeatRequest,
    ) -> heartbeat_response::HeartbeatResponse {
        let request = g::HeartbeatRequest {
            group_id: r.group_id,
            generation_id: r.generation_id,
            member_id: r.member_id,
            group_instance_id: r.group_instance_id,
        };
        let error_code = match self.group_call(GroupCall::Heartbeat(request)).await {
            Ok(GroupReply::Heartbeat(resp)) => resp.error_code,
            Ok(_) => mismatched().code(),
            Err(code) => code.code(),
        };
        heartbeat_response::HeartbeatResponse {
            error_code,
            ..Default::default()
        }
    }

    pub(crate) async fn handle_leave_group(
        &self,
        r: leave_group_request::LeaveGroupRequest,
        version: i16,
    ) -> leave_group_response::LeaveGroupResponse {
        let members = if version <= 2 {
            vec![g::MemberIdentity {
                member_id: r.member_id,
                group_instance_id: None,
                reason: None,
            }]
        } else {
            r.members
                .into_iter()
                .map(|m| g::MemberIdentity {
                    member_id: m.member_id,
                    group_instance_id: m.group_instance_id,
                    reason: m.reason,
                })
                .collect()
        };
        let request = g::LeaveGroupRequest {
            group_id: r.group_id,
            members,
        };
        let answer = match self.group_call(GroupCall::Leave(request)).await {
            Ok(GroupReply::Response(g::Response::LeaveGroup(resp))) => resp,
            Ok(_) => g::LeaveGroupResponse {
                error_code: mismatched().code(),
                members: vec![],
            },
            Err(code) => g::LeaveGroupResponse {
                error_code: code.code(),
                members: vec![],
            },
        };
        let mut error_code = answer.error_code;
        if version <= 2 && error_code == 0 {
            // One member, no per-member list: its error is the response's error.
            error_code = answer.members.first().map_or(0, |m| m.error_code);
        }
        leave_group_response::LeaveGroupResponse {
            error_code,
            members: answer
                .members
                .into_iter()
                .map(|m| leave_group_response::MemberResponse {
                    member_id: m.member_id,
                    group_instance_id: m.group_instance_id,
                    error_code: m.error_code,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    pub(crate) async fn handle_offset_commit(
        &self,
        r: offset_commit_request::OffsetCommitRequest,
        version: i16,
    ) -> offset_commit_response::OffsetCommitResponse {
        // As Kafka: a partition of a topic that does not exist is answered
        // UNKNOWN_TOPIC_OR_PARTITION and not committed; a request left with nothing to
        // commit does not reach the coordinator.
        let image = self.image();
        let exists = |topic: &str, partition: i32| {
            image
                .topic(topic)
                .is_some_and(|t| t.partitions.contains_key(&partition))
        };
        let mut r = r;
        let mut unknown: Vec<(String, i32)> = Vec::new();
        for t in &mut r.topics {
            t.partitions.retain(|p| {
                let known = exists(&t.name, p.partition_index);
                if !known {
                    unknown.push((t.name.clone(), p.partition_index));
                }
                known
            });
        }
        r.topics.retain(|t| !t.partitions.is_empty());
        let mut response = if r.topics.is_empty() && !unknown.is_empty() {
            offset_commit_response::OffsetCommitResponse::default()
        } else {
            self.offset_commit_known(r, version).await
        };
        for (name, partition_index) in unknown {
            let partition = offset_commit_response::OffsetCommitResponsePartition {
                partition_index,
                error_code: ErrorCode::UNKNOWN_TOPIC_OR_PARTITION.code(),
                ..Default::default()
            };
            match response.topics.iter_mut().find(|t| t.name == name) {
                Some(t) => t.partitions.push(partition),
                None => response
                    .topics
                    .push(offset_commit_response::OffsetCommitResponseTopic {
                        name,
                        partitions: vec![partition],
                        ..Default::default()
                    }),
            }
        }
        response
    }

    /// OffsetCommit of partitions that exist, through the group coordinator.
    async fn offset_commit_known(
        &self,
        r: offset_commit_request::OffsetCommitRequest,
        version: i16,
    ) -> offset_commit_response::OffsetCommitResponse {
        let topics: Vec<g::OffsetCommitRequestTopic> = r
            .topics
            .iter()
            .map(|t| g::OffsetCommitRequestTopic {
                name: t.name.clone(),
                partitions: t
                    .partitions
                    .iter()
                    .map(|p| g::OffsetCommitRequestPartition {
                        partition_index: p.partition_index,
                        committed_offset: p.committed_offset,
                        committed_leader_epoch: p.committed_leader_epoch,
                        committed_metadata: p.committed_metadata.clone(),
                    })
                    .collect(),
            })
            .collect();
        let request = g::OffsetCommitRequest {
            group_id: r.group_id,
            generation_id_or_member_epoch: r.generation_id_or_member_epoch,
            member_id: r.member_id,
            group_instance_id: r.group_instance_id,
            retention_time_ms: r.retention_time_ms,
            topics,
            api_version: version,
        };
        let answer = self.group_call(GroupCall::OffsetCommit(request)).await;
        let answer = match answer {
            Ok(GroupReply::Response(g::Response::OffsetCommit(resp))) => Ok(resp),
            Ok(_) => Err(mismatched()),
            Err(code) => Err(code),
        };
        let topics = match answer {
            Ok(resp) => resp
                .topics
                .into_iter()
                .map(|t| offset_commit_response::OffsetCommitResponseTopic {
                    name: t.name,
                    partitions: t
                        .partitions
                        .into_iter()
                        .map(|p| offset_commit_response::OffsetCommitResponsePartition {
                            partition_index: p.partition_index,
                            error_code: p.error_code,
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                })
                .collect(),
            Err(code) => r
                .topics
                .into_iter()
                .map(|t| offset_commit_response::OffsetCommitResponseTopic {
                    name: t.name,
                    partitions: t
                        .partitions
                        .into_iter()
                        .map(|p| offset_commit_response::OffsetCommitResponsePartition {
                            partition_index: p.partition_index,
                            error_code: code.code(),
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                })
                .collect(),
        };
        offset_commit_response::OffsetCommitResponse {
            topics,
            ..Default::default()
        }
    }

    pub(crate) async fn handle_offset_fetch(
        &self,
        r: offset_fetch_request::OffsetFetchRequest,
        version: i16,
    ) -> offset_fetch_response::OffsetFetchResponse {
        let requests: Vec<g::OffsetFetchRequest> = if version >= 8 {
            r.groups
                .into_iter()
                .map(|grp| g::OffsetFetchRequest {
                    group_id: grp.group_id,
                    // v9+: a consumer group member's id and epoch, checked (KIP-848).
                    member_id: grp.member_id,
                    member_epoch: grp.member_epoch,
                    topics: grp.topics.map(|ts| {
                        ts.into_iter()
                            .map(|t| g::OffsetFetchRequestTopic {
                                name: t.name,
                                partition_indexes: t.partition_indexes,
                            })
                            .collect()
                    }),
                    require_stable: r.require_stable,
                })
                .collect()
        } else {
            vec![g::OffsetFetchRequest {
                group_id: r.group_id,
                member_id: None,
                member_epoch: -1,
                topics: r.topics.map(|ts| {
                    ts.into_iter()
                        .map(|t| g::OffsetFetchRequestTopic {
                            name: t.name,
                            partition_indexes: t.partition_indexes,
                        })
                        .collect()
                }),
                require_stable: r.require_stable,
            }]
        };
        let group_ids: Vec<String> = requests.iter().map(|q| q.group_id.clone()).collect();
        // What a v0-1 answer lists when the whole request failed (see below).
        let requested: Vec<(String, Vec<i32>)> = requests
            .first()
            .and_then(|q| q.topics.as_ref())
            .map(|ts| {
                ts.iter()
                    .map(|t| (t.name.clone(), t.partition_indexes.clone()))
                    .collect()
            })
            .unwrap_or_default();
        let answers: Vec<g::OffsetFetchResponse> =
            match self.group_call(GroupCall::OffsetFetch(requests)).await {
                Ok(GroupReply::OffsetFetch(list)) => list,
                other => {
                    let code = match other {
                        Err(code) => code,
                        Ok(_) => mismatched(),
                    };
                    group_ids
                        .iter()
                        .map(|_| g::OffsetFetchResponse {
                            error_code: code.code(),
                            topics: vec![],
                        })
                        .collect()
                }
            };
        if version >= 8 {
            let groups = group_ids
                .into_iter()
                .zip(answers)
                .map(
                    |(group_id, a)| offset_fetch_response::OffsetFetchResponseGroup {
                        group_id,
                        error_code: a.error_code,
                        topics: a
                            .topics
                            .into_iter()
                            .map(|t| offset_fetch_response::OffsetFetchResponseTopics {
                                name: t.name,
                                partitions: t
                                    .partitions
                                    .into_iter()
                                    .map(|p| offset_fetch_response::OffsetFetchResponsePartitions {
                                        partition_index: p.partition_index,
                                        committed_offset: p.committed_offset,
                                        committed_leader_epoch: p.committed_leader_epoch,
                                        metadata: p.metadata,
                                        error_code: p.error_code,
                                        ..Default::default()
                                    })
                                    .collect(),
                                ..Default::default()
                            })
                            .collect(),
                        ..Default::default()
                    },
                )
                .collect();
            return offset_fetch_response::OffsetFetchResponse {
                groups,
                ..Default::default()
            };
        }
        let mut a = answers
            .into_iter()
            .next()
            .unwrap_or(g::OffsetFetchResponse {
                error_code: 0,
                topics: vec![],
            });
        if version < 2 && a.error_code != 0 && a.topics.is_empty() {
            // Kafka answers a v0-1 request that failed as a whole (NOT_COORDINATOR, a
            // load in progress) with the error on every partition it asked for: with no
            // top-level error field, an empty answer would read as "nothing committed".
            a.topics = requested
                .into_iter()
                .map(|(name, partitions)| g::OffsetFetchResponseTopic {
                    name,
                    partitions: partitions
                        .into_iter()
                        .map(|partition_index| g::OffsetFetchResponsePartition {
                            partition_index,
                            committed_offset: -1,
                            committed_leader_epoch: -1,
                            metadata: Some(String::new()),
                            error_code: a.error_code,
                        })
                        .collect(),
                })
                .collect();
        }
        // Before v2 there was no top-level error: it went on every partition.
        let partition_error = |code: i16| {
            if version < 2 && a.error_code != 0 {
                a.error_code
            } else {
                code
            }
        };
        let topics = a
            .topics
            .iter()
            .map(|t| offset_fetch_response::OffsetFetchResponseTopic {
                name: t.name.clone(),
                partitions: t
                    .partitions
                    .iter()
                    .map(|p| offset_fetch_response::OffsetFetchResponsePartition {
                        partition_index: p.partition_index,
                        committed_offset: p.committed_offset,
                        committed_leader_epoch: p.committed_leader_epoch,
                        metadata: p.metadata.clone(),
                        error_code: partition_error(p.error_code),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            })
            .collect();
        offset_fetch_response::OffsetFetchResponse {
            error_code: a.error_code,
            topics,
            ..Default::default()
        }
    }

    pub(crate) async fn handle_offset_delete(
        &self,
        r: offset_delete_request::OffsetDeleteRequest,
    ) -> offset_delete_response::OffsetDeleteResponse {
        let request = g::OffsetDeleteRequest {
            group_id: r.group_id,
            topics: r
                .topics
                .into_iter()
                .map(|t| g::OffsetDeleteRequestTopic {
                    name: t.name,
                    partitions: t
                        .partitions
                        .into_iter()
                        .map(|p| p.partition_index)
                        .collect(),
                })
                .collect(),
        };
        let answer = match self.group_call(GroupCall::OffsetDelete(request)).await {
            Ok(GroupReply::Response(g::Response::OffsetDelete(resp))) => resp,
            Ok(_) => g::OffsetDeleteResponse {
                error_code: mismatched().code(),
                topics: vec![],
            },
            Err(code) => g::OffsetDeleteResponse {
                error_code: code.code(),
                topics: vec![],
            },
        };
        offset_delete_response::OffsetDeleteResponse {
            error_code: answer.error_code,
            topics: answer
                .topics
                .into_iter()
                .map(|t| offset_delete_response::OffsetDeleteResponseTopic {
                    name: t.name,
                    partitions: t
                        .partitions
                        .into_iter()
                        .map(|p| offset_delete_response::OffsetDeleteResponsePartition {
                            partition_index: p.partition_index,
                            error_code: p.error_code,
                        })
                        .collect(),
                })
                .collect(),
            ..Default::default()
        }
    }

    pub(crate) async fn handle_describe_groups(
        &self,
        r: describe_groups_request::DescribeGroupsRequest,
        version: i16,
    ) -> describe_groups_response::DescribeGroupsResponse {
        let ids = r.groups.clone();
        let request = g::DescribeGroupsRequest {
            groups: r.groups,
            api_version: version,
        };
        let groups = match self.group_call(GroupCall::DescribeGroups(request)).await {
            Ok(GroupReply::DescribeGroups(resp)) => resp
                .groups
                .into_iter()
                .map(|d| describe_groups_response::DescribedGroup {
                    // Version 6 (KIP-1043) says why, as Kafka 4.1 does.
                    error_message: (d.error_code == ErrorCode::GROUP_ID_NOT_FOUND.code())
                        .then(|| format!("Group {} not found.", d.group_id)),
                    error_code: d.error_code,
                    group_id: d.group_id,
                    group_state: d.group_state,
                    protocol_type: d.protocol_type,
                    protocol_data: d.protocol_data,
                    members: d
                        .members
                        .into_iter()
                        .map(|m| describe_groups_response::DescribedGroupMember {
                            member_id: m.member_id,
                            group_instance_id: m.group_instance_id,
                            client_id: m.client_id,
                            client_host: m.client_host,
                            member_metadata: m.member_metadata,
                            member_assignment: m.member_assignment,
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                })
                .collect(),
            other => {
                let code = match other {
                    Err(code) => code,
                    Ok(_) => mismatched(),
                };
                ids.into_iter()
                    .map(|group_id| describe_groups_response::DescribedGroup {
                        error_code: code.code(),
                        group_id,
                        ..Default::default()
                    })
                    .collect()
            }
        };
        describe_groups_response::DescribeGroupsResponse {
            groups,
            ..Default::default()
        }
    }

    pub(crate) async fn handle_list_groups(
        &self,
        r: list_groups_request::ListGroupsRequest,
    ) -> list_groups_response::ListGroupsResponse {
        let request = g::ListGroupsRequest {
            states_filter: r.states_filter,
            types_filter: r.types_filter,
        };
        match self.group_call(GroupCall::ListGroups(request)).await {
            Ok(GroupReply::ListGroups(resp)) => list_groups_response::ListGroupsResponse {
                error_code: resp.error_code,
                groups: resp
                    .groups
                    .into_iter()
                    .map(|l| list_groups_response::ListedGroup {
                        group_id: l.group_id,
                        protocol_type: l.protocol_type,
                        group_state: l.group_state,
                        group_type: l.group_type,
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            },
            other => {
                let code = match other {
                    Err(code) => code,
                    Ok(_) => mismatched(),
                };
                list_groups_response::ListGroupsResponse {
                    error_code: code.code(),
                    ..Default::default()
                }
            }
        }
    }

    pub(crate) async fn handle_delete_groups(
        &self,
        r: delete_groups_request::DeleteGroupsRequest,
    ) -> delete_groups_response::DeleteGroupsResponse {
        // Share groups' share-partition state goes first; a group whose state could not
        // be deleted (or that has members) keeps its records.
        let refused = self.delete_share_groups_state(&r.groups_names).await;
        let ids: Vec<String> = r
            .groups_names
            .into_iter()
            .filter(|id| !refused.iter().any(|(g, _)| g == id))
            .collect();
        let request = g::DeleteGroupsRequest {
            groups_names: ids.clone(),
        };
        let results: Vec<delete_groups_response::DeletableGroupResult> =
            match self.group_call(GroupCall::DeleteGroups(request)).await {
                Ok(GroupReply::Response(g::Response::DeleteGroups(resp))) => resp
                    .results
                    .into_iter()
                    .map(|d| delete_groups_response::DeletableGroupResult {
                        group_id: d.group_id,
                        error_code: d.error_code,
                        ..Default::default()
                    })
                    .collect(),
                other => {
                    let code = match other {
                        Err(code) => code,
                        Ok(_) => mismatched(),
                    };
                    ids.into_iter()
                        .map(|group_id| delete_groups_response::DeletableGroupResult {
                            group_id,
                            error_code: code.code(),
                            ..Default::default()
                        })
                        .collect()
                }
            };
        let mut results = results;
        results.extend(refused.into_iter().map(|(group_id, error_code)| {
            delete_groups_response::DeletableGroupResult {
                group_id,
                error_code,
                ..Default::default()
            }
        }));
        delete_groups_response::DeleteGroupsResponse {
            results,
            ..Default::default()
        }
    }
}
