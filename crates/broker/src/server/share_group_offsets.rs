//! KIP-932's administration of a share group's share-partition state, as Kafka 4.2's
//! `KafkaApis` and `GroupCoordinatorService` serve it: DescribeShareGroupOffsets (v0-1),
//! AlterShareGroupOffsets (v0), DeleteShareGroupOffsets (v0), and the share coordinator's
//! part of DeleteGroups. Their authorization gates are here too
//! (`request_authorization.rs` calls them).
//!
//! # Protocol
//! Each write is two or three steps (the group coordinator's design note is in
//! `rill-group`'s `share_group_offsets.rs`):
//! 1. the group coordinator decides and marks the share-partitions (initializing or
//!    deleting), answering once the mark is replicated;
//! 2. the share state persister initialises them at the given start offsets (state epoch
//!    = the group epoch) or deletes their state, each share-partition at its share
//!    coordinator, retried while that moves or loads;
//! 3. the group coordinator hears what succeeded (initialised; no longer deleting). A
//!    DeleteGroups deletes the group's records only when every share-partition's state
//!    is gone, so a share group is never forgotten while its state remains.
//!
//! Describe reads: the share coordinator's summary of each share-partition (its start
//! offset, leader epoch, and for v1's lag, KIP-1226, the delivery complete count: lag is
//! the high watermark less the start offset less the records delivered for good, -1 where
//! any is unknown — the high watermark is known where this broker holds a replica).

use rill_group as g;
use rill_metadata::{AclOperation, ResourceType};
use rill_protocol::generated::{
    alter_share_group_offsets_request as alt_req, alter_share_group_offsets_response as alt_resp,
    delete_share_group_offsets_request as del_req, delete_share_group_offsets_response as del_resp,
    describe_share_group_offsets_request as desc_req,
    describe_share_group_offsets_response as desc_resp, ResponseBody,
};
use rill_protocol::{ErrorCode, Uuid};
use rill_share::{Response as ShareResponse, SharePartitionKey};
use rill_storage::TopicPartition;

use futures::StreamExt;

use crate::coordinator::group_coordinator::{GroupCall, GroupReply};
use crate::server::auth_helper::Authz;
use crate::server::request_authorization::{take_denied, Gate};
use crate::server::Broker;

/// Share-partition calls of one request running at once.
const CALLS_AT_ONCE: usize = 32;

fn mismatched() -> ErrorCode {
    tracing::error!("group coordinator answered with the wrong reply type");
    ErrorCode::UNKNOWN_SERVER_ERROR
}

/// One share-partition's summary as DescribeShareGroupOffsets shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    pub start_offset: i64,
    pub leader_epoch: i32,
    pub lag: i64,
}

/// KIP-1226's lag of a share-partition: the records from the start offset to the high
/// watermark not yet delivered for good; -1 where any part is unknown.
pub fn share_lag(high_watermark: Option<i64>, start_offset: i64, delivery_complete: i32) -> i64 {
    match high_watermark {
        Some(hw) if start_offset >= 0 && delivery_complete >= 0 => {
            (hw - start_offset - i64::from(delivery_complete)).max(0)
        }
        _ => -1,
    }
}

impl Broker {
    fn share_key(group_id: &str, topic_id: Uuid, partition: i32) -> SharePartitionKey {
        SharePartitionKey {
            group_id: group_id.to_owned(),
            topic_id,
            partition,
        }
    }

    /// Runs `call` for every key, a bounded number at once; the answers in key order.
    async fn each_share_partition<T, F, Fut>(&self, keys: Vec<SharePartitionKey>, call: F) -> Vec<T>
    where
        F: Fn(SharePartitionKey) -> Fut,
        Fut: std::future::Future<Output = T>,
    {
        futures::stream::iter(keys.into_iter().map(call))
            .buffered(CALLS_AT_ONCE)
            .collect()
            .await
    }

    fn high_watermark(&self, topic: &str, partition: i32) -> Option<i64> {
        let tp = TopicPartition {
            topic: topic.to_owned(),
            partition,
        };
        self.replicas.offsets(&tp).ok().map(|o| o.high_watermark)
    }

    async fn summary(&self, group_id: &str, topic: &str, topic_id: Uuid, p: i32) -> Summary {
        let key = Self::share_key(group_id, topic_id, p);
        match self.share_persister.read_summary(key, -1).await {
            ShareResponse::ReadSummary {
                error: ErrorCode::NONE,
                leader_epoch,
                start_offset,
                delivery_complete_count,
                ..
            } => Summary {
                start_offset,
                leader_epoch,
                lag: share_lag(
                    self.high_watermark(topic, p),
                    start_offset,
                    delivery_complete_count,
                ),
            },
            // Absence of data, not an error (Kafka: as OffsetFetch with nothing to fetch).
            _ => Summary {
                start_offset: -1,
                leader_epoch: -1,
                lag: -1,
            },
        }
    }

    pub(crate) async fn handle_describe_share_group_offsets(
        &self,
        r: desc_req::DescribeShareGroupOffsetsRequest,
    ) -> desc_resp::DescribeShareGroupOffsetsResponse {
        let mut groups = Vec::with_capacity(r.groups.len());
        for group in r.groups {
            groups.push(self.describe_share_group_offsets(group).await);
        }
        desc_resp::DescribeShareGroupOffsetsResponse {
            groups,
            ..Default::default()
        }
    }

    async fn describe_share_group_offsets(
        &self,
        group: desc_req::DescribeShareGroupOffsetsRequestGroup,
    ) -> desc_resp::DescribeShareGroupOffsetsResponseGroup {
        let group_id = group.group_id;
        let error = |code: ErrorCode| desc_resp::DescribeShareGroupOffsetsResponseGroup {
            group_id: group_id.clone(),
            error_code: code.code(),
            error_message: None,
            ..Default::default()
        };
        let image = self.image();
        // (name, id if the topic exists, partitions)
        let wanted: Vec<(String, Option<Uuid>, Vec<i32>)> = match group.topics {
            Some(topics) => topics
                .into_iter()
                .map(|t| {
                    let id = image.topic(&t.topic_name).map(|x| x.id);
                    (t.topic_name, id, t.partitions)
                })
                .collect(),
            None => match self
                .groups
                .call(GroupCall::InitializedSharePartitions(group_id.clone()))
                .await
            {
                Ok(GroupReply::SharePartitions(Ok(topics))) => topics
                    .into_iter()
                    // A topic deleted since is left out, as Kafka's image lookup does.
                    .filter_map(|t| {
                        let name = self.topic_name_by_id(&t.topic_id)?;
                        Some((name, Some(t.topic_id), t.partitions))
                    })
                    .collect(),
                Ok(GroupReply::SharePartitions(Err(code))) => return error(code.into()),
                Ok(_) => return error(mismatched()),
                Err(code) => return error(code),
            },
        };
        let mut topics = Vec::with_capacity(wanted.len());
        for (name, id, partitions) in wanted {
            let Some(topic_id) = id else {
                // A topic that does not exist has no offsets: -1, not an error (Kafka).
                topics.push(desc_resp::DescribeShareGroupOffsetsResponseTopic {
                    topic_name: name,
                    topic_id: Uuid::ZERO,
                    partitions: partitions
                        .into_iter()
                        .map(|p| desc_resp::DescribeShareGroupOffsetsResponsePartition {
                            partition_index: p,
                            start_offset: -1,
                            leader_epoch: -1,
                            lag: -1,
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                });
                continue;
            };
            let summaries = futures::stream::iter(partitions.iter().copied())
                .map(|p| self.summary(&group_id, &name, topic_id, p))
                .buffered(CALLS_AT_ONCE)
                .collect::<Vec<_>>()
                .await;
            topics.push(desc_resp::DescribeShareGroupOffsetsResponseTopic {
                topic_name: name,
                topic_id,
                partitions: partitions
                    .iter()
                    .zip(summaries)
                    .map(
                        |(p, s)| desc_resp::DescribeShareGroupOffsetsResponsePartition {
                            partition_index: *p,
                            start_offset: s.start_offset,
                            leader_epoch: s.leader_epoch,
                            lag: s.lag,
                            ..Default::default()
                        },
                    )
                    .collect(),
                ..Default::default()
            });
        }
        desc_resp::DescribeShareGroupOffsetsResponseGroup {
            group_id,
            topics,
            ..Default::default()
        }
    }

    pub(crate) async fn handle_alter_share_group_offsets(
        &self,
        r: alt_req::AlterShareGroupOffsetsRequest,
    ) -> alt_resp::AlterShareGroupOffsetsResponse {
        let refused =
            |code: i16, message: Option<String>, r: &alt_req::AlterShareGroupOffsetsRequest| {
                alt_resp::AlterShareGroupOffsetsResponse {
                    error_code: code,
                    error_message: message,
                    responses: r
                        .topics
                        .iter()
                        .map(|t| alt_resp::AlterShareGroupOffsetsResponseTopic {
                            topic_name: t.topic_name.clone(),
                            partitions: t
                                .partitions
                                .iter()
                                .map(|p| alt_resp::AlterShareGroupOffsetsResponsePartition {
                                    partition_index: p.partition_index,
                                    error_code: code,
                                    ..Default::default()
                                })
                                .collect(),
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                }
            };
        if r.group_id.is_empty() {
            return refused(ErrorCode::INVALID_GROUP_ID.code(), None, &r);
        }
        let request = g::AlterShareGroupOffsetsRequest {
            group_id: r.group_id.clone(),
            topics: r
                .topics
                .iter()
                .map(|t| {
                    (
                        t.topic_name.clone(),
                        t.partitions
                            .iter()
                            .map(|p| (p.partition_index, p.start_offset))
                            .collect(),
                    )
                })
                .collect(),
        };
        let plan = match self
            .groups
            .call(GroupCall::AlterShareGroupOffsets(request))
            .await
        {
            Ok(GroupReply::Response(g::Response::AlterShareGroupOffsets(plan))) => plan,
            Ok(_) => return refused(mismatched().code(), None, &r),
            Err(code) => return refused(code.code(), None, &r),
        };
        if plan.error_code != ErrorCode::NONE.code() {
            return refused(plan.error_code, plan.error_message, &r);
        }
        // Step 2: each share-partition initialised at its start offset.
        let mut keys = Vec::new();
        let mut offsets = Vec::new();
        for t in &plan.initialize {
            for (p, offset) in &t.partitions {
                keys.push(Self::share_key(&r.group_id, t.topic_id, *p));
                offsets.push(*offset);
            }
        }
        let epoch = plan.group_epoch;
        let persister = self.share_persister.clone();
        let started: Vec<(SharePartitionKey, i64)> = keys.into_iter().zip(offsets).collect();
        let answers: Vec<(SharePartitionKey, Result<(), ErrorCode>)> =
            futures::stream::iter(started)
                .map(|(key, offset)| {
                    let persister = persister.clone();
                    async move {
                        let answer = persister.initialize(key.clone(), epoch, offset).await;
                        (key, answer)
                    }
                })
                .buffered(CALLS_AT_ONCE)
                .collect()
                .await;
        // Step 3: what has its new state is initialised; the rest keeps what it had.
        let split = |ok: bool| -> Vec<g::ShareTopicPartitions> {
            plan.initialize
                .iter()
                .map(|t| g::ShareTopicPartitions {
                    topic_id: t.topic_id,
                    topic_name: t.topic_name.clone(),
                    partitions: answers
                        .iter()
                        .filter(|(k, a)| k.topic_id == t.topic_id && a.is_ok() == ok)
                        .map(|(k, _)| k.partition)
                        .collect(),
                })
                .filter(|t| !t.partitions.is_empty())
                .collect()
        };
        let (done, failed) = (split(true), split(false));
        if !done.is_empty() {
            let _ = self
                .groups
                .call(GroupCall::ShareGroupStateInitialized {
                    group_id: r.group_id.clone(),
                    topics: done,
                })
                .await;
        }
        if !failed.is_empty() {
            let _ = self
                .groups
                .call(GroupCall::ShareGroupStateInitializeFailed {
                    group_id: r.group_id.clone(),
                    topics: failed,
                })
                .await;
        }
        let failure = |topic_id: Uuid, p: i32| {
            answers.iter().find_map(|(k, a)| match a {
                Err(code) if k.topic_id == topic_id && k.partition == p => Some(*code),
                _ => None,
            })
        };
        alt_resp::AlterShareGroupOffsetsResponse {
            responses: plan
                .topics
                .into_iter()
                .map(|t| {
                    let topic_id = t.topic_id.unwrap_or(Uuid::ZERO);
                    alt_resp::AlterShareGroupOffsetsResponseTopic {
                        topic_name: t.topic_name,
                        topic_id,
                        partitions: t
                            .partitions
                            .into_iter()
                            .map(|(p, code)| {
                                let code = match failure(topic_id, p) {
                                    Some(e) if code == ErrorCode::NONE.code() => e,
                                    _ => ErrorCode::from(code),
                                };
                                alt_resp::AlterShareGroupOffsetsResponsePartition {
                                    partition_index: p,
                                    error_code: code.code(),
                                    ..Default::default()
                                }
                            })
                            .collect(),
                        ..Default::default()
                    }
                })
                .collect(),
            ..Default::default()
        }
    }

    pub(crate) async fn handle_delete_share_group_offsets(
        &self,
        r: del_req::DeleteShareGroupOffsetsRequest,
    ) -> del_resp::DeleteShareGroupOffsetsResponse {
        let refused =
            |code: i16, message: Option<String>| del_resp::DeleteShareGroupOffsetsResponse {
                error_code: code,
                error_message: message,
                ..Default::default()
            };
        if r.group_id.is_empty() {
            return refused(ErrorCode::INVALID_GROUP_ID.code(), None);
        }
        let request = g::DeleteShareGroupOffsetsRequest {
            group_id: r.group_id.clone(),
            topic_names: r.topics.iter().map(|t| t.topic_name.clone()).collect(),
        };
        let plan = match self
            .groups
            .call(GroupCall::DeleteShareGroupOffsets(request))
            .await
        {
            Ok(GroupReply::Response(g::Response::DeleteShareGroupOffsets(plan))) => plan,
            Ok(_) => return refused(mismatched().code(), None),
            Err(code) => return refused(code.code(), None),
        };
        if plan.error_code != ErrorCode::NONE.code() {
            return refused(plan.error_code, plan.error_message);
        }
        let failures = self.delete_share_state(&r.group_id, &plan.delete).await;
        let deleted: Vec<Uuid> = plan
            .delete
            .iter()
            .map(|t| t.topic_id)
            .filter(|id| !failures.iter().any(|(f, _)| f == id))
            .collect();
        if !deleted.is_empty() {
            let _ = self
                .groups
                .call(GroupCall::CompleteDeleteShareGroupOffsets {
                    group_id: r.group_id.clone(),
                    topic_ids: deleted.clone(),
                })
                .await;
        }
        let mut responses: Vec<del_resp::DeleteShareGroupOffsetsResponseTopic> = plan
            .delete
            .iter()
            .map(|t| {
                let code = failures
                    .iter()
                    .find(|(id, _)| *id == t.topic_id)
                    .map_or(ErrorCode::NONE, |(_, c)| *c);
                del_resp::DeleteShareGroupOffsetsResponseTopic {
                    topic_name: t.topic_name.clone(),
                    topic_id: t.topic_id,
                    error_code: code.code(),
                    ..Default::default()
                }
            })
            .collect();
        responses.extend(plan.errors.into_iter().map(|e| {
            del_resp::DeleteShareGroupOffsetsResponseTopic {
                topic_name: e.topic_name,
                topic_id: e.topic_id,
                error_code: e.error_code,
                error_message: e.error_message,
                ..Default::default()
            }
        }));
        del_resp::DeleteShareGroupOffsetsResponse {
            responses,
            ..Default::default()
        }
    }

    /// Deletes the state of these share-partitions of the group; returns the topics
    /// some of whose partitions failed, with one error each.
    async fn delete_share_state(
        &self,
        group_id: &str,
        topics: &[g::ShareTopicPartitions],
    ) -> Vec<(Uuid, ErrorCode)> {
        let keys: Vec<SharePartitionKey> = topics
            .iter()
            .flat_map(|t| {
                t.partitions
                    .iter()
                    .map(|p| Self::share_key(group_id, t.topic_id, *p))
            })
            .collect();
        let persister = self.share_persister.clone();
        let answers = self
            .each_share_partition(keys, |key| {
                let persister = persister.clone();
                async move {
                    let topic_id = key.topic_id;
                    (topic_id, persister.delete(key).await)
                }
            })
            .await;
        let mut failed: Vec<(Uuid, ErrorCode)> = Vec::new();
        for (topic_id, answer) in answers {
            if let Err(code) = answer {
                if !failed.iter().any(|(id, _)| *id == topic_id) {
                    failed.push((topic_id, code));
                }
            }
        }
        failed
    }

    /// DeleteGroups, the share groups' first step (Kafka's `deleteShareGroups`): the
    /// share-partition state of every empty share group among `ids` is deleted; returns
    /// the groups that may not be deleted now, with their errors (NON_EMPTY_GROUP, or
    /// the share coordinator's), which the ordinary DeleteGroups must leave alone.
    pub(crate) async fn delete_share_groups_state(&self, ids: &[String]) -> Vec<(String, i16)> {
        let plan = match self
            .groups
            .call(GroupCall::ShareGroupsDeleteStart(ids.to_vec()))
            .await
        {
            Ok(GroupReply::Response(g::Response::ShareGroupStateDeletions(plan))) => plan,
            // The ordinary DeleteGroups meets the same coordinator and answers for all.
            _ => return Vec::new(),
        };
        let mut refused = Vec::new();
        for group in plan {
            if group.error_code != ErrorCode::NONE.code() {
                refused.push((group.group_id, group.error_code));
                continue;
            }
            let failed = self
                .delete_share_state(&group.group_id, &group.topics)
                .await;
            if let Some((_, code)) = failed.first() {
                tracing::warn!(group = %group.group_id, error = code.name(), "share group state not deleted");
                refused.push((group.group_id, code.code()));
            }
        }
        refused
    }
}

/// DescribeShareGroupOffsets: DESCRIBE on each group (else GROUP_AUTHORIZATION_FAILED for
/// it), and only the topics the client may DESCRIBE are shown: named ones it may not are
/// answered TOPIC_AUTHORIZATION_FAILED, and of all a group's topics the others are left
/// out (Kafka's `KafkaApis`).
pub(crate) fn describe_gate(a: &Authz, r: &mut desc_req::DescribeShareGroupOffsetsRequest) -> Gate {
    if !a.enabled() {
        return Gate::Proceed(None);
    }
    let mut denied_groups = Vec::new();
    let mut denied_topics: Vec<(String, Vec<desc_req::DescribeShareGroupOffsetsRequestTopic>)> =
        Vec::new();
    r.groups.retain_mut(|g| {
        if !a.group(AclOperation::Describe, &g.group_id) {
            denied_groups.push(g.group_id.clone());
            return false;
        }
        if let Some(topics) = &mut g.topics {
            let no = take_denied(topics, |t| a.topic(AclOperation::Describe, &t.topic_name));
            if !no.is_empty() {
                denied_topics.push((g.group_id.clone(), no));
            }
        }
        true
    });
    let allowed = a.checker(AclOperation::Describe, ResourceType::Topic);
    Gate::Proceed(Some(Box::new(move |resp: &mut ResponseBody| {
        let ResponseBody::DescribeShareGroupOffsets(resp) = resp else {
            return;
        };
        for g in &mut resp.groups {
            g.topics
                .retain(|t| t.topic_id.is_zero() || allowed(&t.topic_name));
            if let Some((_, denied)) = denied_topics.iter().find(|(id, _)| *id == g.group_id) {
                let code = ErrorCode::TOPIC_AUTHORIZATION_FAILED;
                g.topics.extend(denied.iter().map(|t| {
                    desc_resp::DescribeShareGroupOffsetsResponseTopic {
                        topic_name: t.topic_name.clone(),
                        topic_id: Uuid::ZERO,
                        partitions: t
                            .partitions
                            .iter()
                            .map(|p| desc_resp::DescribeShareGroupOffsetsResponsePartition {
                                partition_index: *p,
                                start_offset: -1,
                                leader_epoch: -1,
                                lag: -1,
                                error_code: code.code(),
                                error_message: None,
                                ..Default::default()
                            })
                            .collect(),
                        ..Default::default()
                    }
                }));
            }
        }
        resp.groups
            .extend(denied_groups.into_iter().map(|group_id| {
                desc_resp::DescribeShareGroupOffsetsResponseGroup {
                    group_id,
                    error_code: ErrorCode::GROUP_AUTHORIZATION_FAILED.code(),
                    ..Default::default()
                }
            }));
    })))
}

/// AlterShareGroupOffsets: READ on the group (else the whole request is refused) and READ
/// on each topic (else its partitions are TOPIC_AUTHORIZATION_FAILED).
pub(crate) fn alter_gate(a: &Authz, r: &mut alt_req::AlterShareGroupOffsetsRequest) -> Gate {
    let gaf = ErrorCode::GROUP_AUTHORIZATION_FAILED;
    if !a.group(AclOperation::Read, &r.group_id) {
        return Gate::Respond(ResponseBody::AlterShareGroupOffsets(
            alt_resp::AlterShareGroupOffsetsResponse {
                error_code: gaf.code(),
                ..Default::default()
            },
        ));
    }
    let denied = take_denied(&mut r.topics, |t| {
        a.topic(AclOperation::Read, &t.topic_name)
    });
    if denied.is_empty() {
        return Gate::Proceed(None);
    }
    let taf = ErrorCode::TOPIC_AUTHORIZATION_FAILED;
    let refused: Vec<alt_resp::AlterShareGroupOffsetsResponseTopic> = denied
        .into_iter()
        .map(|t| alt_resp::AlterShareGroupOffsetsResponseTopic {
            topic_name: t.topic_name,
            topic_id: Uuid::ZERO,
            partitions: t
                .partitions
                .iter()
                .map(|p| alt_resp::AlterShareGroupOffsetsResponsePartition {
                    partition_index: p.partition_index,
                    error_code: taf.code(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        })
        .collect();
    Gate::Proceed(Some(Box::new(move |resp: &mut ResponseBody| {
        if let ResponseBody::AlterShareGroupOffsets(resp) = resp {
            if resp.error_code == ErrorCode::NONE.code() {
                resp.responses.extend(refused);
            }
        }
    })))
}

/// DeleteShareGroupOffsets: DELETE on the group (else the whole request is refused) and
/// READ on each topic (else TOPIC_AUTHORIZATION_FAILED for it).
pub(crate) fn delete_gate(a: &Authz, r: &mut del_req::DeleteShareGroupOffsetsRequest) -> Gate {
    let gaf = ErrorCode::GROUP_AUTHORIZATION_FAILED;
    if !a.group(AclOperation::Delete, &r.group_id) {
        return Gate::Respond(ResponseBody::DeleteShareGroupOffsets(
            del_resp::DeleteShareGroupOffsetsResponse {
                error_code: gaf.code(),
                ..Default::default()
            },
        ));
    }
    let denied = take_denied(&mut r.topics, |t| {
        a.topic(AclOperation::Read, &t.topic_name)
    });
    if denied.is_empty() {
        return Gate::Proceed(None);
    }
    let taf = ErrorCode::TOPIC_AUTHORIZATION_FAILED;
    let refused: Vec<del_resp::DeleteShareGroupOffsetsResponseTopic> = denied
        .into_iter()
        .map(|t| del_resp::DeleteShareGroupOffsetsResponseTopic {
            topic_name: t.topic_name,
            topic_id: Uuid::ZERO,
            error_code: taf.code(),
            ..Default::default()
        })
        .collect();
    Gate::Proceed(Some(Box::new(move |resp: &mut ResponseBody| {
        if let ResponseBody::DeleteShareGroupOffsets(resp) = resp {
            if resp.error_code == ErrorCode::NONE.code() {
                resp.responses.extend(refused);
            }
        }
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lag_is_what_lies_between_the_start_offset_and_the_high_watermark_undelivered() {
        assert_eq!(share_lag(Some(100), 40, 10), 50);
        assert_eq!(share_lag(Some(100), 100, 0), 0);
        // Unknown parts make an unknown lag.
        assert_eq!(share_lag(None, 40, 10), -1);
        assert_eq!(share_lag(Some(100), -1, 0), -1);
        assert_eq!(share_lag(Some(100), 40, -1), -1);
        // A high watermark read behind the state's (a follower's) is no negative lag.
        assert_eq!(share_lag(Some(30), 40, 0), 0);
    }
}
