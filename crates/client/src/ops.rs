//! Requests that both the consumer and the admin client make: finding a group's
//! coordinator, fetching and committing group offsets, and listing partition offsets.
//!
//! Each function retries what Kafka calls retriable (coordinator moving or loading, leader
//! changing) with `retry.backoff.ms` between attempts, until `request.timeout.ms` has
//! passed in total, then returns the last error.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use rill_protocol::generated::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use rill_protocol::generated::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use rill_protocol::generated::offset_fetch_request::OffsetFetchRequestTopic;
use rill_protocol::generated::{
    FindCoordinatorRequest, ListOffsetsRequest, OffsetCommitRequest, OffsetFetchRequest,
};
use rill_protocol::ErrorCode;

use crate::error::{Error, Result};
use crate::network::{BrokerMetadata, NetworkClient};
use crate::types::{OffsetSpec, TopicPartition};

pub(crate) const FIND_COORDINATOR_VERSION: i16 = 3;
pub(crate) const OFFSET_FETCH_VERSION: i16 = 7;
/// 9: the first version a consumer-protocol group takes (KIP-848: the member epoch in
/// `generation_id_or_member_epoch`); the same fields as 8.
pub(crate) const OFFSET_COMMIT_VERSION: i16 = 9;
pub(crate) const LIST_OFFSETS_VERSION: i16 = 7;
/// FindCoordinator's key type of a transactional id (a group's is 0).
pub(crate) const COORDINATOR_TRANSACTION: i8 = 1;

/// The coordinator of `group`, asked of the least-loaded broker (the seeds' step 1 of
/// `ensureCoordinatorReady`), retrying while it is not available yet.
pub(crate) async fn find_coordinator(net: &NetworkClient, group: &str) -> Result<BrokerMetadata> {
    find_coordinator_of(net, group, 0).await
}

/// The coordinator of `key`: a group's (`key_type` 0) or a transactional id's (1).
pub(crate) async fn find_coordinator_of(
    net: &NetworkClient,
    group: &str,
    key_type: i8,
) -> Result<BrokerMetadata> {
    let deadline = Instant::now() + net.config.request_timeout;
    loop {
        let request = FindCoordinatorRequest {
            key: group.to_string(),
            key_type,
            ..Default::default()
        };
        let result = net
            .send_any(&request, FIND_COORDINATOR_VERSION)
            .await
            .and_then(|r| {
                let code = ErrorCode::from_code(r.error_code);
                if code.is_ok() {
                    Ok(BrokerMetadata {
                        node_id: r.node_id,
                        host: r.host,
                        port: r.port,
                        rack: None,
                    })
                } else {
                    Err(Error::kafka_msg(
                        code,
                        format!("FindCoordinator for group {group}"),
                        r.error_message,
                    ))
                }
            });
        match result {
            Ok(b) => return Ok(b),
            Err(e) if e.is_retriable() && Instant::now() < deadline => {
                tracing::debug!(group, error = %e, "coordinator discovery failed, retrying");
                tokio::time::sleep(net.config.retry_backoff).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// The committed offsets of `group` for `partitions` (every partition it has an offset
/// for when `None`). Partitions without a committed offset are left out.
pub(crate) async fn fetch_committed(
    net: &NetworkClient,
    group: &str,
    partitions: Option<&[TopicPartition]>,
) -> Result<BTreeMap<TopicPartition, i64>> {
    let deadline = Instant::now() + net.config.request_timeout;
    let topics = partitions.map(|ps| {
        let mut by_topic: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
        for tp in ps {
            by_topic.entry(&tp.topic).or_default().push(tp.partition);
        }
        by_topic
            .into_iter()
            .map(|(name, partition_indexes)| OffsetFetchRequestTopic {
                name: name.to_string(),
                partition_indexes,
                ..Default::default()
            })
            .collect()
    });
    let request = OffsetFetchRequest {
        group_id: group.to_string(),
        topics,
        require_stable: true,
        ..Default::default()
    };
    loop {
        let result = async {
            let coordinator = find_coordinator(net, group).await?;
            let conn = net.connection(&coordinator.addr()).await?;
            let response = conn.send(&request, OFFSET_FETCH_VERSION).await?;
            crate::error::check(response.error_code, || {
                format!("OffsetFetch for group {group}")
            })?;
            let mut out = BTreeMap::new();
            for t in response.topics {
                for p in t.partitions {
                    let code = ErrorCode::from_code(p.error_code);
                    if !code.is_ok() {
                        return Err(Error::kafka(
                            code,
                            format!("OffsetFetch for {}-{}", t.name, p.partition_index),
                        ));
                    }
                    if p.committed_offset >= 0 {
                        out.insert(
                            TopicPartition::new(t.name.clone(), p.partition_index),
                            p.committed_offset,
                        );
                    }
                }
            }
            Ok(out)
        }
        .await;
        match result {
            Err(e) if e.is_retriable() && Instant::now() < deadline => {
                tokio::time::sleep(net.config.retry_backoff).await;
            }
            other => return other,
        }
    }
}

/// Commits `offsets` for `group` as member `member_id` of `generation` (-1 and "" for a
/// commit from outside the group: admin tools, or a consumer without subscription).
pub(crate) async fn commit_offsets(
    net: &NetworkClient,
    group: &str,
    generation: i32,
    member_id: &str,
    group_instance_id: Option<&str>,
    offsets: &BTreeMap<TopicPartition, i64>,
) -> Result<()> {
    if offsets.is_empty() {
        return Ok(());
    }
    let mut by_topic: BTreeMap<&str, Vec<OffsetCommitRequestPartition>> = BTreeMap::new();
    for (tp, offset) in offsets {
        by_topic
            .entry(&tp.topic)
            .or_default()
            .push(OffsetCommitRequestPartition {
                partition_index: tp.partition,
                committed_offset: *offset,
                committed_leader_epoch: -1,
                committed_metadata: Some(String::new()),
                ..Default::default()
            });
    }
    let request = OffsetCommitRequest {
        group_id: group.to_string(),
        generation_id_or_member_epoch: generation,
        member_id: member_id.to_string(),
        group_instance_id: group_instance_id.map(String::from),
        retention_time_ms: -1,
        topics: by_topic
            .into_iter()
            .map(|(name, partitions)| OffsetCommitRequestTopic {
                name: name.to_string(),
                partitions,
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
    let deadline = Instant::now() + net.config.request_timeout;
    loop {
        let result = async {
            let coordinator = find_coordinator(net, group).await?;
            let conn = net.connection(&coordinator.addr()).await?;
            let response = conn.send(&request, OFFSET_COMMIT_VERSION).await?;
            for t in response.topics {
                for p in t.partitions {
                    let code = ErrorCode::from_code(p.error_code);
                    if !code.is_ok() {
                        return Err(Error::kafka(
                            code,
                            format!(
                                "committing offset of {}-{} for group {group}",
                                t.name, p.partition_index
                            ),
                        ));
                    }
                }
            }
            Ok(())
        }
        .await;
        match result {
            // A commit refused for the generation must not be retried: the caller rejoins.
            Err(Error::Kafka {
                code:
                    ErrorCode::ILLEGAL_GENERATION
                    | ErrorCode::UNKNOWN_MEMBER_ID
                    | ErrorCode::REBALANCE_IN_PROGRESS,
                ..
            }) => {
                return result;
            }
            Err(e) if e.is_retriable() && Instant::now() < deadline => {
                tokio::time::sleep(net.config.retry_backoff).await;
            }
            other => return other,
        }
    }
}

/// The offsets `spec` names for each partition, asking each partition's leader.
pub(crate) async fn list_offsets(
    net: &NetworkClient,
    partitions: &[TopicPartition],
    spec: OffsetSpec,
) -> Result<BTreeMap<TopicPartition, i64>> {
    ask_leaders(net, partitions, "ListOffsets", |leader, tps| async move {
        let mut by_topic: BTreeMap<&str, Vec<ListOffsetsPartition>> = BTreeMap::new();
        for tp in &tps {
            by_topic
                .entry(&tp.topic)
                .or_default()
                .push(ListOffsetsPartition {
                    partition_index: tp.partition,
                    current_leader_epoch: -1,
                    timestamp: spec.as_timestamp(),
                    ..Default::default()
                });
        }
        let request = ListOffsetsRequest {
            replica_id: -1,
            isolation_level: 0,
            topics: by_topic
                .into_iter()
                .map(|(name, partitions)| ListOffsetsTopic {
                    name: name.to_string(),
                    partitions,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        let response = net.send_to(leader, &request, LIST_OFFSETS_VERSION).await?;
        Ok(response
            .topics
            .into_iter()
            .flat_map(|t| {
                let name = t.name;
                t.partitions.into_iter().map(move |p| {
                    let code = ErrorCode::from_code(p.error_code);
                    let tp = TopicPartition::new(name.clone(), p.partition_index);
                    (
                        tp,
                        if code.is_ok() {
                            Ok(p.offset)
                        } else {
                            Err(code)
                        },
                    )
                })
            })
            .collect())
    })
    .await
}

/// One partition's answer from its leader: a value, or the error code the leader gave.
pub(crate) type PartitionAnswer<T> = (TopicPartition, std::result::Result<T, ErrorCode>);

/// Asks each partition's leader with `ask(leader, its partitions)`, one call per leader,
/// and retries the partitions whose leader is unknown, unreachable or answered a
/// retriable code (after a metadata refresh) until `request.timeout.ms` has passed.
/// `what` names the request in errors.
pub(crate) async fn ask_leaders<T, F, Fut>(
    net: &NetworkClient,
    partitions: &[TopicPartition],
    what: &str,
    ask: F,
) -> Result<BTreeMap<TopicPartition, T>>
where
    F: Fn(i32, Vec<TopicPartition>) -> Fut,
    Fut: std::future::Future<Output = Result<Vec<PartitionAnswer<T>>>>,
{
    let deadline = Instant::now() + net.config.request_timeout;
    let mut out = BTreeMap::new();
    let mut todo: Vec<TopicPartition> = partitions.to_vec();
    while !todo.is_empty() {
        let topics: Vec<String> = {
            let mut t: Vec<String> = todo.iter().map(|tp| tp.topic.clone()).collect();
            t.sort();
            t.dedup();
            t
        };
        let md = net.ensure_topics(&topics).await?;
        let mut by_leader: HashMap<i32, Vec<TopicPartition>> = HashMap::new();
        let mut retry = Vec::new();
        let mut last_error = None;
        for tp in todo.drain(..) {
            match md.topics.get(&tp.topic) {
                None => return Err(Error::UnknownTopic(tp.topic.clone())),
                Some(t) => match t.partitions.iter().find(|p| p.partition == tp.partition) {
                    None => {
                        return Err(Error::UnknownPartition {
                            topic: tp.topic.clone(),
                            partition: tp.partition,
                        })
                    }
                    Some(p) if p.leader >= 0 => by_leader.entry(p.leader).or_default().push(tp),
                    Some(_) => retry.push(tp),
                },
            }
        }
        for (leader, tps) in by_leader {
            match ask(leader, tps.clone()).await {
                Ok(answers) => {
                    for (tp, answer) in answers {
                        match answer {
                            Ok(value) => {
                                out.insert(tp, value);
                            }
                            Err(code) if code.is_retriable() => {
                                last_error = Some(Error::kafka(code, format!("{what} for {tp}")));
                                retry.push(tp);
                            }
                            Err(code) => {
                                return Err(Error::kafka(code, format!("{what} for {tp}")))
                            }
                        }
                    }
                }
                Err(e) if e.is_retriable() => {
                    last_error = Some(e);
                    retry.extend(tps);
                }
                Err(e) => return Err(e),
            }
        }
        if !retry.is_empty() {
            if Instant::now() >= deadline {
                return Err(
                    last_error.unwrap_or(Error::kafka(ErrorCode::LEADER_NOT_AVAILABLE, what))
                );
            }
            net.invalidate_metadata();
            tokio::time::sleep(net.config.retry_backoff).await;
        }
        todo = retry;
    }
    Ok(out)
}
