//! KIP-932's share-group state RPCs on the wire (Kafka's `ShareCoordinatorService`):
//! InitializeShareGroupState, ReadShareGroupState, WriteShareGroupState,
//! DeleteShareGroupState and ReadShareGroupStateSummary, which share-partition leaders send
//! the share coordinator; FindCoordinator's SHARE key type; and `__share_group_state`,
//! created on first use.
//!
//! A request names many share-partitions of one group; each becomes one call of the share
//! coordinator's shard, all submitted at once so that a held write does not hold up the
//! others, and the answers are put back in the request's shape. The conversions both ways
//! are here too, for the [`super::share_persister`] that sends these requests. Refusals
//! follow Kafka's service: no topics or an empty group id get an empty answer, a
//! share-partition this broker does not coordinate NOT_COORDINATOR, one loading
//! COORDINATOR_LOAD_IN_PROGRESS, and no coordinator at all COORDINATOR_NOT_AVAILABLE.

use rill_metadata::CreatableTopic;
use rill_protocol::generated::{
    delete_share_group_state_request as del_req, delete_share_group_state_response as del_resp,
    initialize_share_group_state_request as init_req,
    initialize_share_group_state_response as init_resp, read_share_group_state_request as read_req,
    read_share_group_state_response as read_resp,
    read_share_group_state_summary_request as sum_req,
    read_share_group_state_summary_response as sum_resp, write_share_group_state_request as wr_req,
    write_share_group_state_response as wr_resp,
};
use rill_protocol::{ErrorCode, Uuid};
use rill_share::{
    RecordState, Request, Response, SharePartitionKey, StateBatch, SHARE_GROUP_STATE_TOPIC,
};

use crate::server::metadata::broker_endpoint;
use crate::server::Broker;

/// One share-partition's call, with where its answer goes in the response.
pub(crate) struct Call {
    pub topic_id: Uuid,
    pub partition: i32,
    pub request: Request,
}

fn key(group_id: &str, topic_id: Uuid, partition: i32) -> SharePartitionKey {
    SharePartitionKey::new(group_id, topic_id, partition)
}

/// A state batch from the wire; a delivery state Kafka does not define is refused.
fn state_batch(
    first_offset: i64,
    last_offset: i64,
    delivery_state: i8,
    delivery_count: i16,
) -> Option<StateBatch> {
    RecordState::from_id(delivery_state)
        .map(|s| StateBatch::new(first_offset, last_offset, s, delivery_count))
}

/// The calls of an InitializeShareGroupState request.
pub(crate) fn initialize_calls(r: &init_req::InitializeShareGroupStateRequest) -> Vec<Call> {
    r.topics
        .iter()
        .flat_map(|t| {
            t.partitions.iter().map(|p| Call {
                topic_id: t.topic_id,
                partition: p.partition,
                request: Request::Initialize {
                    key: key(&r.group_id, t.topic_id, p.partition),
                    state_epoch: p.state_epoch,
                    start_offset: p.start_offset,
                },
            })
        })
        .collect()
}

pub(crate) fn read_calls(r: &read_req::ReadShareGroupStateRequest) -> Vec<Call> {
    r.topics
        .iter()
        .flat_map(|t| {
            t.partitions.iter().map(|p| Call {
                topic_id: t.topic_id,
                partition: p.partition,
                request: Request::Read {
                    key: key(&r.group_id, t.topic_id, p.partition),
                    leader_epoch: p.leader_epoch,
                },
            })
        })
        .collect()
}

/// The calls of a WriteShareGroupState request; a partition whose batches Kafka could not
/// have written (an unknown delivery state) is a call that fails INVALID_REQUEST.
pub(crate) fn write_calls(r: &wr_req::WriteShareGroupStateRequest) -> Vec<Result<Call, Call>> {
    r.topics
        .iter()
        .flat_map(|t| {
            t.partitions.iter().map(|p| {
                let batches: Option<Vec<StateBatch>> = p
                    .state_batches
                    .iter()
                    .map(|b| {
                        state_batch(
                            b.first_offset,
                            b.last_offset,
                            b.delivery_state,
                            b.delivery_count,
                        )
                    })
                    .collect();
                let valid = batches.is_some();
                let call = Call {
                    topic_id: t.topic_id,
                    partition: p.partition,
                    request: Request::Write {
                        key: key(&r.group_id, t.topic_id, p.partition),
                        state_epoch: p.state_epoch,
                        leader_epoch: p.leader_epoch,
                        start_offset: p.start_offset,
                        delivery_complete_count: p.delivery_complete_count,
                        state_batches: batches.unwrap_or_default(),
                    },
                };
                if valid {
                    Ok(call)
                } else {
                    Err(call)
                }
            })
        })
        .collect()
}

pub(crate) fn delete_calls(r: &del_req::DeleteShareGroupStateRequest) -> Vec<Call> {
    r.topics
        .iter()
        .flat_map(|t| {
            t.partitions.iter().map(|p| Call {
                topic_id: t.topic_id,
                partition: p.partition,
                request: Request::Delete {
                    key: key(&r.group_id, t.topic_id, p.partition),
                },
            })
        })
        .collect()
}

pub(crate) fn summary_calls(r: &sum_req::ReadShareGroupStateSummaryRequest) -> Vec<Call> {
    r.topics
        .iter()
        .flat_map(|t| {
            t.partitions.iter().map(|p| Call {
                topic_id: t.topic_id,
                partition: p.partition,
                request: Request::ReadSummary {
                    key: key(&r.group_id, t.topic_id, p.partition),
                    leader_epoch: p.leader_epoch,
                },
            })
        })
        .collect()
}

/// Answers grouped by topic, topics in the order they first appear.
fn by_topic<T>(answers: Vec<(Uuid, T)>) -> Vec<(Uuid, Vec<T>)> {
    let mut topics: Vec<(Uuid, Vec<T>)> = Vec::new();
    for (topic_id, a) in answers {
        match topics.iter_mut().find(|(t, _)| *t == topic_id) {
            Some((_, list)) => list.push(a),
            None => topics.push((topic_id, vec![a])),
        }
    }
    topics
}

fn message(error: ErrorCode) -> Option<String> {
    (error != ErrorCode::NONE).then(|| error.name().to_string())
}

/// The answers, shaped as the RPC of `api`'s response.
pub(crate) fn initialize_response(
    answers: Vec<(Uuid, i32, Response)>,
) -> init_resp::InitializeShareGroupStateResponse {
    let results = by_topic(answers.into_iter().map(|(t, p, r)| (t, (p, r))).collect())
        .into_iter()
        .map(|(topic_id, parts)| init_resp::InitializeStateResult {
            topic_id,
            partitions: parts
                .into_iter()
                .map(|(partition, r)| init_resp::PartitionResult {
                    partition,
                    error_code: r.error_code().code(),
                    error_message: message(r.error_code()),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        })
        .collect();
    init_resp::InitializeShareGroupStateResponse {
        results,
        ..Default::default()
    }
}

pub(crate) fn read_response(
    answers: Vec<(Uuid, i32, Response)>,
) -> read_resp::ReadShareGroupStateResponse {
    let results = by_topic(answers.into_iter().map(|(t, p, r)| (t, (p, r))).collect())
        .into_iter()
        .map(|(topic_id, parts)| read_resp::ReadStateResult {
            topic_id,
            partitions: parts
                .into_iter()
                .map(|(partition, r)| {
                    let error = r.error_code();
                    let (state_epoch, start_offset, batches) = match r {
                        Response::Read {
                            state_epoch,
                            start_offset,
                            state_batches,
                            ..
                        } => (state_epoch, start_offset, state_batches),
                        _ => (0, -1, Vec::new()),
                    };
                    read_resp::PartitionResult {
                        partition,
                        error_code: error.code(),
                        error_message: message(error),
                        state_epoch,
                        start_offset,
                        state_batches: batches
                            .iter()
                            .map(|b| read_resp::StateBatch {
                                first_offset: b.first_offset,
                                last_offset: b.last_offset,
                                delivery_state: b.delivery_state.id(),
                                delivery_count: b.delivery_count,
                                ..Default::default()
                            })
                            .collect(),
                        ..Default::default()
                    }
                })
                .collect(),
            ..Default::default()
        })
        .collect();
    read_resp::ReadShareGroupStateResponse {
        results,
        ..Default::default()
    }
}

pub(crate) fn write_response(
    answers: Vec<(Uuid, i32, Response)>,
) -> wr_resp::WriteShareGroupStateResponse {
    let results = by_topic(answers.into_iter().map(|(t, p, r)| (t, (p, r))).collect())
        .into_iter()
        .map(|(topic_id, parts)| wr_resp::WriteStateResult {
            topic_id,
            partitions: parts
                .into_iter()
                .map(|(partition, r)| wr_resp::PartitionResult {
                    partition,
                    error_code: r.error_code().code(),
                    error_message: message(r.error_code()),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        })
        .collect();
    wr_resp::WriteShareGroupStateResponse {
        results,
        ..Default::default()
    }
}

pub(crate) fn delete_response(
    answers: Vec<(Uuid, i32, Response)>,
) -> del_resp::DeleteShareGroupStateResponse {
    let results = by_topic(answers.into_iter().map(|(t, p, r)| (t, (p, r))).collect())
        .into_iter()
        .map(|(topic_id, parts)| del_resp::DeleteStateResult {
            topic_id,
            partitions: parts
                .into_iter()
                .map(|(partition, r)| del_resp::PartitionResult {
                    partition,
                    error_code: r.error_code().code(),
                    error_message: message(r.error_code()),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        })
        .collect();
    del_resp::DeleteShareGroupStateResponse {
        results,
        ..Default::default()
    }
}

pub(crate) fn summary_response(
    answers: Vec<(Uuid, i32, Response)>,
) -> sum_resp::ReadShareGroupStateSummaryResponse {
    let results = by_topic(answers.into_iter().map(|(t, p, r)| (t, (p, r))).collect())
        .into_iter()
        .map(|(topic_id, parts)| sum_resp::ReadStateSummaryResult {
            topic_id,
            partitions: parts
                .into_iter()
                .map(|(partition, r)| {
                    let error = r.error_code();
                    let (state_epoch, leader_epoch, start_offset, dcc) = match r {
                        Response::ReadSummary {
                            state_epoch,
                            leader_epoch,
                            start_offset,
                            delivery_complete_count,
                            ..
                        } => (
                            state_epoch,
                            leader_epoch,
                            start_offset,
                            delivery_complete_count,
                        ),
                        _ => (0, -1, -1, -1),
                    };
                    sum_resp::PartitionResult {
                        partition,
                        error_code: error.code(),
                        error_message: message(error),
                        state_epoch,
                        leader_epoch,
                        start_offset,
                        delivery_complete_count: dcc,
                        ..Default::default()
                    }
                })
                .collect(),
            ..Default::default()
        })
        .collect();
    sum_resp::ReadShareGroupStateSummaryResponse {
        results,
        ..Default::default()
    }
}

fn error(code: i16) -> ErrorCode {
    ErrorCode::from_code(code)
}

/// The answers of an InitializeShareGroupState response, in its order (the persister's
/// side of [`initialize_response`]).
pub(crate) fn initialize_calls_answers(
    r: &init_resp::InitializeShareGroupStateResponse,
) -> Vec<Response> {
    r.results
        .iter()
        .flat_map(|t| &t.partitions)
        .map(|p| Response::Initialize {
            error: error(p.error_code),
        })
        .collect()
}

/// The answers of a ReadShareGroupState response; a batch of a delivery state Kafka does
/// not define makes its answer UNKNOWN_SERVER_ERROR rather than a state half read.
pub(crate) fn read_calls_answers(r: &read_resp::ReadShareGroupStateResponse) -> Vec<Response> {
    r.results
        .iter()
        .flat_map(|t| &t.partitions)
        .map(|p| {
            let batches: Option<Vec<StateBatch>> = p
                .state_batches
                .iter()
                .map(|b| {
                    state_batch(
                        b.first_offset,
                        b.last_offset,
                        b.delivery_state,
                        b.delivery_count,
                    )
                })
                .collect();
            match batches {
                Some(state_batches) => Response::Read {
                    error: error(p.error_code),
                    state_epoch: p.state_epoch,
                    start_offset: p.start_offset,
                    state_batches,
                },
                None => Response::Read {
                    error: ErrorCode::UNKNOWN_SERVER_ERROR,
                    state_epoch: 0,
                    start_offset: -1,
                    state_batches: Vec::new(),
                },
            }
        })
        .collect()
}

pub(crate) fn write_calls_answers(r: &wr_resp::WriteShareGroupStateResponse) -> Vec<Response> {
    r.results
        .iter()
        .flat_map(|t| &t.partitions)
        .map(|p| Response::Write {
            error: error(p.error_code),
        })
        .collect()
}

pub(crate) fn delete_calls_answers(r: &del_resp::DeleteShareGroupStateResponse) -> Vec<Response> {
    r.results
        .iter()
        .flat_map(|t| &t.partitions)
        .map(|p| Response::Delete {
            error: error(p.error_code),
        })
        .collect()
}

pub(crate) fn summary_calls_answers(
    r: &sum_resp::ReadShareGroupStateSummaryResponse,
) -> Vec<Response> {
    r.results
        .iter()
        .flat_map(|t| &t.partitions)
        .map(|p| Response::ReadSummary {
            error: error(p.error_code),
            state_epoch: p.state_epoch,
            leader_epoch: p.leader_epoch,
            start_offset: p.start_offset,
            delivery_complete_count: p.delivery_complete_count,
        })
        .collect()
}

/// A FindCoordinator SHARE key, `group:topicId:partition` (Kafka's
/// `SharePartitionKey.getInstance`); `None` for one that is not (INVALID_REQUEST).
pub(crate) fn parse_coordinator_key(key: &str) -> Option<SharePartitionKey> {
    let mut parts = key.rsplitn(3, ':');
    let partition: i32 = parts.next()?.parse().ok()?;
    let topic_id: Uuid = parts.next()?.parse().ok()?;
    let group_id = parts.next()?;
    (!group_id.is_empty() && partition >= 0)
        .then(|| SharePartitionKey::new(group_id, topic_id, partition))
}

/// Whether a request names anything Kafka's service would work on: a group id and, in
/// every topic, partitions.
fn answerable<T>(group_id: &str, topics: &[T], partitions: impl Fn(&T) -> usize) -> bool {
    !group_id.is_empty() && !topics.is_empty() && topics.iter().all(|t| partitions(t) > 0)
}

impl Broker {
    pub(crate) fn share_state_partitions(&self) -> i32 {
        self.config
            .share_coordinator_config()
            .map(|(c, _, _)| c.state_topic_num_partitions)
            .unwrap_or(50)
    }

    /// Runs one share-partition call per entry on the share coordinator, all under way at
    /// once; each answer is the coordinator's or the error that stopped it.
    pub(crate) async fn share_calls(&self, calls: Vec<Call>) -> Vec<(Uuid, i32, Response)> {
        let mut waiting = Vec::with_capacity(calls.len());
        for c in calls {
            let rx = self.shares.submit(c.request.clone()).await;
            waiting.push((c, rx));
        }
        if !waiting.is_empty() {
            // Writes wait for their replication: the request's slot goes back meanwhile.
            crate::network::request_slot::park();
        }
        let mut answers = Vec::with_capacity(waiting.len());
        for (c, rx) in waiting {
            let answer = match rx {
                Ok(rx) => rx.await.unwrap_or_else(|_| {
                    Response::error(&c.request, ErrorCode::COORDINATOR_NOT_AVAILABLE)
                }),
                Err(code) => Response::error(&c.request, code),
            };
            answers.push((c.topic_id, c.partition, answer));
        }
        answers
    }

    pub(crate) async fn handle_initialize_share_group_state(
        &self,
        r: init_req::InitializeShareGroupStateRequest,
    ) -> init_resp::InitializeShareGroupStateResponse {
        if !answerable(&r.group_id, &r.topics, |t| t.partitions.len()) {
            return Default::default();
        }
        initialize_response(self.share_calls(initialize_calls(&r)).await)
    }

    pub(crate) async fn handle_read_share_group_state(
        &self,
        r: read_req::ReadShareGroupStateRequest,
    ) -> read_resp::ReadShareGroupStateResponse {
        if !answerable(&r.group_id, &r.topics, |t| t.partitions.len()) {
            return Default::default();
        }
        read_response(self.share_calls(read_calls(&r)).await)
    }

    pub(crate) async fn handle_write_share_group_state(
        &self,
        r: wr_req::WriteShareGroupStateRequest,
    ) -> wr_resp::WriteShareGroupStateResponse {
        if !answerable(&r.group_id, &r.topics, |t| t.partitions.len()) {
            return Default::default();
        }
        let mut valid = Vec::new();
        let mut refused = Vec::new();
        for c in write_calls(&r) {
            match c {
                Ok(c) => valid.push(c),
                Err(c) => refused.push((
                    c.topic_id,
                    c.partition,
                    Response::error(&c.request, ErrorCode::INVALID_REQUEST),
                )),
            }
        }
        let mut answers = self.share_calls(valid).await;
        answers.extend(refused);
        write_response(answers)
    }

    pub(crate) async fn handle_delete_share_group_state(
        &self,
        r: del_req::DeleteShareGroupStateRequest,
    ) -> del_resp::DeleteShareGroupStateResponse {
        if !answerable(&r.group_id, &r.topics, |t| t.partitions.len()) {
            return Default::default();
        }
        delete_response(self.share_calls(delete_calls(&r)).await)
    }

    pub(crate) async fn handle_read_share_group_state_summary(
        &self,
        r: sum_req::ReadShareGroupStateSummaryRequest,
    ) -> sum_resp::ReadShareGroupStateSummaryResponse {
        if !answerable(&r.group_id, &r.topics, |t| t.partitions.len()) {
            return Default::default();
        }
        summary_response(self.share_calls(summary_calls(&r)).await)
    }

    /// The share coordinator of a FindCoordinator SHARE key (`group:topicId:partition`):
    /// the leader of its `__share_group_state` partition, creating the topic on first use.
    pub(crate) async fn share_coordinator_node(
        &self,
        key: &str,
        listener: &str,
    ) -> Result<(i32, String, i32), ErrorCode> {
        let key = parse_coordinator_key(key).ok_or(ErrorCode::INVALID_REQUEST)?;
        let partitions = self.share_state_partitions();
        if self.image().topic(SHARE_GROUP_STATE_TOPIC).is_none() {
            self.ensure_share_group_state_topic(partitions).await?;
        }
        let image = self.image();
        let p = key.partition_for(partitions);
        let leader = image
            .partition(SHARE_GROUP_STATE_TOPIC, p)
            .map(|p| p.leader)
            .filter(|l| *l >= 0 && (*l != self.node_id || self.replicas.lease_held()))
            .ok_or(ErrorCode::COORDINATOR_NOT_AVAILABLE)?;
        let (host, port) = broker_endpoint(&image, leader, listener)
            .ok_or(ErrorCode::COORDINATOR_NOT_AVAILABLE)?;
        Ok((leader, host, port))
    }

    /// Creates `__share_group_state` as Kafka's `shareGroupStateTopicConfigs`: cleanup
    /// policy delete (KIP-932: the coordinator deletes what no replay needs), compression
    /// as produced, `share.coordinator.state.topic.segment.bytes`; with
    /// `share.coordinator.state.topic.num.partitions` partitions of
    /// `share.coordinator.state.topic.replication.factor` replicas and `min.insync.replicas`
    /// = `share.coordinator.state.topic.min.isr`.
    pub(crate) async fn ensure_share_group_state_topic(
        &self,
        partitions: i32,
    ) -> Result<(), ErrorCode> {
        let get = |key: &str, default: &str| {
            self.config
                .get(key)
                .map(|v| v.trim().to_string())
                .unwrap_or_else(|| default.to_string())
        };
        let rf = self
            .internal_topic_replication_factor("share.coordinator.state.topic.replication.factor");
        // Unset, Kafka's min ISR of 2, but never above the replicas the topic gets.
        let min_isr = if self.config.is_set("share.coordinator.state.topic.min.isr") {
            get("share.coordinator.state.topic.min.isr", "2")
        } else {
            rf.min(2).to_string()
        };
        let segment_bytes = get("share.coordinator.state.topic.segment.bytes", "104857600");
        let mut topic = CreatableTopic::new(SHARE_GROUP_STATE_TOPIC, partitions, rf);
        topic.configs = [
            ("cleanup.policy", "delete".to_string()),
            ("compression.type", "producer".to_string()),
            ("min.insync.replicas", min_isr),
            ("segment.bytes", segment_bytes),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), Some(v)))
        .collect();
        self.create_internal_topic(topic).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_grouped_by_topic_in_request_order() {
        let (a, b) = (Uuid::from_u64_pair(1, 1), Uuid::from_u64_pair(2, 2));
        let ok = Response::Write {
            error: ErrorCode::NONE,
        };
        let fenced = Response::Write {
            error: ErrorCode::FENCED_LEADER_EPOCH,
        };
        let resp = write_response(vec![(b, 0, ok.clone()), (a, 3, fenced), (b, 1, ok)]);
        let shape: Vec<(Uuid, Vec<(i32, i16)>)> = resp
            .results
            .iter()
            .map(|t| {
                (
                    t.topic_id,
                    t.partitions
                        .iter()
                        .map(|p| (p.partition, p.error_code))
                        .collect(),
                )
            })
            .collect();
        assert_eq!(
            shape,
            vec![
                (b, vec![(0, 0), (1, 0)]),
                (a, vec![(3, ErrorCode::FENCED_LEADER_EPOCH.code())]),
            ]
        );
        assert_eq!(
            resp.results[1].partitions[0].error_message.as_deref(),
            Some("FENCED_LEADER_EPOCH")
        );
    }

    #[test]
    fn an_unknown_delivery_state_is_refused() {
        let r = wr_req::WriteShareGroupStateRequest {
            group_id: "g".into(),
            topics: vec![wr_req::WriteStateData {
                topic_id: Uuid::from_u64_pair(1, 1),
                partitions: vec![
                    wr_req::PartitionData {
                        partition: 0,
                        state_batches: vec![wr_req::StateBatch {
                            first_offset: 0,
                            last_offset: 1,
                            delivery_state: 3,
                            delivery_count: 1,
                            ..Default::default()
                        }],
                        ..Default::default()
                    },
                    wr_req::PartitionData {
                        partition: 1,
                        state_batches: vec![wr_req::StateBatch {
                            first_offset: 0,
                            last_offset: 1,
                            delivery_state: 2,
                            delivery_count: 1,
                            ..Default::default()
                        }],
                        ..Default::default()
                    },
                ],
                ..Default::default()
            }],
            ..Default::default()
        };
        let calls = write_calls(&r);
        assert!(calls[0].is_err());
        assert!(
            matches!(&calls[1], Ok(c) if matches!(&c.request, Request::Write { state_batches, .. }
            if state_batches == &[StateBatch::new(0, 1, RecordState::Acknowledged, 1)]))
        );
    }

    #[test]
    fn coordinator_keys_are_kafkas_share_partition_keys() {
        let topic_id = Uuid::from_u64_pair(0x0102_0304_0506_0708, 0x090a_0b0c_0d0e_0f10);
        let key = format!("g:1:{topic_id}:7");
        let parsed = parse_coordinator_key(&key).unwrap();
        assert_eq!(parsed, SharePartitionKey::new("g:1", topic_id, 7));
        assert_eq!(parsed.coordinator_key(), key);
        for bad in [
            "",
            "g",
            &format!(":{topic_id}:0"),
            &format!("g:{topic_id}:-1"),
            &format!("g:{topic_id}:x"),
            "g:not-a-topic-id:0",
        ] {
            assert_eq!(parse_coordinator_key(bad), None, "{bad}");
        }
    }

    #[test]
    fn requests_without_partitions_or_group_are_not_answerable() {
        assert!(!answerable("", &[1], |_| 1));
        assert!(!answerable("g", &[] as &[i32], |_| 1));
        assert!(!answerable("g", &[1, 2], |t| usize::from(*t == 1)));
        assert!(answerable("g", &[1], |_| 1));
    }
}
