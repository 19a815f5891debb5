//! KIP-932's ShareFetch (v1-2) and ShareAcknowledge (v1-2) on the partition leader:
//! share sessions, the acknowledgements a request carries, and acquisitions that park
//! until records arrive or become available again. The share-partitions themselves are
//! `share_partitions.rs`'s.
//!
//! # Protocol (Kafka's `SharePartitionManager.newContext` and `KafkaApis`)
//! 1. A member's share session is keyed by group and member id. ShareFetch at epoch 0
//!    opens it (replacing one that was open, and refusing acknowledgements, which only
//!    an open session can carry: INVALID_REQUEST) with the partitions it names, and the
//!    next request must carry epoch 1, then 2, and so on (wrapping to 1 past `i32::MAX`).
//!    A later epoch adds the partitions it names and drops the forgotten ones. Epoch -1
//!    closes the session after its acknowledgements: the member's acquired records are
//!    released at once. An unknown session is SHARE_SESSION_NOT_FOUND, a wrong epoch
//!    INVALID_SHARE_SESSION_EPOCH; ShareAcknowledge cannot open one (epoch 0 is
//!    INVALID_SHARE_SESSION_EPOCH). At most `group.share.max.share.sessions` sessions are
//!    open (SHARE_SESSION_LIMIT_REACHED beyond), an idle one giving way.
//!    The session lives as long as the connection its last request came on
//!    (`share_partitions.rs`, step 6).
//! 2. Acknowledgements are applied first, each partition's answered once persisted
//!    (`AcknowledgeErrorCode` in ShareFetch, `ErrorCode` in ShareAcknowledge).
//! 3. A ShareFetch then acquires from every partition of the session (not only those the
//!    request names), splitting `MaxBytes` evenly. With nothing acquired and no error it
//!    waits, up to `MaxWaitMs`, for an append to one of them or for records to become
//!    AVAILABLE again (a release, an expired lock), and tries again.
//! 4. A session opened by the request answers every partition it names; a later one
//!    answers the partitions with records, an error or an acknowledgement result.
//!    `AcquisitionLockTimeoutMs` is the group's lock duration.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use bytes::Bytes;
use rill_protocol::generated::{
    share_acknowledge_request as saq, share_acknowledge_response as sas,
    share_fetch_request as sfq, share_fetch_response as sfs,
};
use rill_protocol::{ErrorCode, Uuid};
use rill_share::{AcknowledgeType, AcknowledgementBatch, ShareAcquireMode, SharePartitionKey};

use crate::network::{request_slot, Session};
use crate::replication::append_signal::AppendSignals;
use crate::server::metadata::broker_endpoint;
use crate::server::share_partitions::ShareSession;
use crate::server::Broker;

/// The longest a ShareFetch parks, whatever it asks for.
const MAX_SHARE_FETCH_WAIT: Duration = Duration::from_secs(30);
/// Most bytes one partition's acquisition reads.
const MAX_PARTITION_BYTES: usize = 8 << 20;
/// An idle session older than this may give way to a new one when the cache is full.
const EVICTABLE_AFTER: Duration = Duration::from_secs(120);
/// `group.share.max.share.sessions`' default.
const DEFAULT_MAX_SESSIONS: usize = 2_000;

/// The epoch after `epoch` (Kafka's `ShareRequestMetadata.nextEpoch`).
fn next_epoch(epoch: i32) -> i32 {
    if epoch == i32::MAX {
        1
    } else {
        epoch + 1
    }
}

/// One partition's acknowledgement batches as the state machine takes them.
fn ack_batches(
    wire: impl Iterator<Item = (i64, i64, Vec<i8>)>,
) -> Result<Vec<AcknowledgementBatch>, ErrorCode> {
    wire.map(|(first, last, types)| {
        let acknowledge_types = types
            .into_iter()
            .map(AcknowledgeType::try_from)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| ErrorCode::INVALID_REQUEST)?;
        Ok(AcknowledgementBatch {
            first_offset: first,
            last_offset: last,
            acknowledge_types,
        })
    })
    .collect()
}

/// What a request asks of its session.
struct SessionRequest<'a> {
    epoch: i32,
    add: &'a [(Uuid, i32)],
    forget: &'a [(Uuid, i32)],
    /// ShareFetch may open a session; ShareAcknowledge may not.
    may_open: bool,
    has_acks: bool,
    connection_id: u64,
}

/// The group and member ids of a ShareFetch or ShareAcknowledge, both required.
fn share_request_ids(
    group: &Option<String>,
    member: &Option<String>,
) -> Result<(String, String), ErrorCode> {
    match (group.as_deref(), member.as_deref()) {
        (None | Some(""), _) => Err(ErrorCode::INVALID_GROUP_ID),
        (_, None | Some("")) => Err(ErrorCode::INVALID_REQUEST),
        (Some(g), Some(m)) => Ok((g.to_owned(), m.to_owned())),
    }
}

/// `(node id, host, port, rack)` on `listener` of each leader a response names.
fn leader_endpoints<'a>(
    image: &'a rill_metadata::MetadataImage,
    leaders: BTreeSet<i32>,
    listener: &'a str,
) -> impl Iterator<Item = (i32, String, i32, Option<String>)> + 'a {
    leaders.into_iter().filter_map(move |id| {
        let (host, port) = broker_endpoint(image, id, listener)?;
        Some((
            id,
            host,
            port,
            image.broker(id).and_then(|b| b.rack.clone()),
        ))
    })
}

/// A session step's outcome: the partitions to fetch from, or a top-level error.
enum SessionStep {
    /// The session's partitions after the request, and whether the request opened it.
    Open {
        partitions: BTreeSet<(Uuid, i32)>,
        opened: bool,
    },
    /// Epoch -1: acknowledge, then close; these partitions release the member's records.
    Close {
        partitions: BTreeSet<(Uuid, i32)>,
    },
    Refused(ErrorCode),
}

impl Broker {
    fn max_share_sessions(&self) -> usize {
        crate::config::broker_config_value(
            &self.config,
            &self.image(),
            self.node_id,
            "group.share.max.share.sessions",
        )
        .and_then(|(v, _)| v.trim().parse().ok())
        .filter(|n: &usize| *n > 0)
        .unwrap_or(DEFAULT_MAX_SESSIONS)
    }

    /// Protocol step 1 for one request.
    fn share_session_step(
        &self,
        group: &str,
        member: &str,
        req: SessionRequest<'_>,
    ) -> SessionStep {
        let SessionRequest {
            epoch,
            add,
            forget,
            may_open,
            has_acks,
            connection_id,
        } = req;
        let max = self.max_share_sessions();
        let mut sessions = self
            .share_partitions
            .sessions
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let key = (group.to_owned(), member.to_owned());
        let now = Instant::now();
        match epoch {
            0 if !may_open => SessionStep::Refused(ErrorCode::INVALID_SHARE_SESSION_EPOCH),
            0 if has_acks => SessionStep::Refused(ErrorCode::INVALID_REQUEST),
            0 => {
                if !sessions.contains_key(&key) && sessions.len() >= max {
                    let idle = sessions
                        .iter()
                        .filter(|(_, s)| now.duration_since(s.last_used) >= EVICTABLE_AFTER)
                        .min_by_key(|(_, s)| s.last_used)
                        .map(|(k, _)| k.clone());
                    match idle {
                        Some(k) => {
                            sessions.remove(&k);
                        }
                        None => {
                            return SessionStep::Refused(ErrorCode::SHARE_SESSION_LIMIT_REACHED)
                        }
                    }
                }
                let partitions: BTreeSet<_> = add.iter().copied().collect();
                sessions.insert(
                    key,
                    ShareSession {
                        next_epoch: 1,
                        partitions: partitions.clone(),
                        last_used: now,
                        connection_id,
                    },
                );
                SessionStep::Open {
                    partitions,
                    opened: true,
                }
            }
            -1 => match sessions.remove(&key) {
                Some(s) => SessionStep::Close {
                    partitions: s.partitions,
                },
                None => SessionStep::Refused(ErrorCode::SHARE_SESSION_NOT_FOUND),
            },
            e if e < -1 => SessionStep::Refused(ErrorCode::INVALID_SHARE_SESSION_EPOCH),
            e => match sessions.get_mut(&key) {
                None => SessionStep::Refused(ErrorCode::SHARE_SESSION_NOT_FOUND),
                Some(s) if s.next_epoch != e => {
                    SessionStep::Refused(ErrorCode::INVALID_SHARE_SESSION_EPOCH)
                }
                Some(s) => {
                    s.partitions.extend(add.iter().copied());
                    for f in forget {
                        s.partitions.remove(f);
                    }
                    s.next_epoch = next_epoch(e);
                    s.last_used = now;
                    s.connection_id = connection_id;
                    SessionStep::Open {
                        partitions: s.partitions.clone(),
                        opened: false,
                    }
                }
            },
        }
    }

    /// The leader the image names for a partition: `(leader id, leader epoch)`.
    fn share_current_leader(&self, topic_id: &Uuid, partition: i32) -> (i32, i32) {
        let image = self.image();
        self.topic_name_by_id(topic_id)
            .and_then(|name| {
                image
                    .topic(&name)
                    .and_then(|t| t.partitions.get(&partition))
                    .map(|p| (p.leader, p.leader_epoch))
            })
            .unwrap_or((-1, -1))
    }

    /// Protocol step 2 for one partition: the acknowledge error code.
    async fn share_ack_partition(
        &self,
        group: &str,
        member: &str,
        topic_id: Uuid,
        partition: i32,
        batches: Result<Vec<AcknowledgementBatch>, ErrorCode>,
    ) -> ErrorCode {
        let batches = match batches {
            Ok(b) => b,
            Err(code) => return code,
        };
        let key = SharePartitionKey::new(group, topic_id, partition);
        match self.share_acknowledge(&key, member, &batches).await {
            Ok(()) => ErrorCode::NONE,
            Err(code) => code,
        }
    }

    /// Epoch -1's release of what the member holds in the session's partitions.
    async fn share_close_session(
        &self,
        group: &str,
        member: &str,
        partitions: &BTreeSet<(Uuid, i32)>,
    ) {
        for (topic_id, partition) in partitions {
            let key = SharePartitionKey::new(group, *topic_id, *partition);
            self.share_release_member(&key, member).await;
        }
        self.share_partitions.session_ended(group);
    }

    pub(crate) async fn handle_share_fetch(
        &self,
        r: sfq::ShareFetchRequest,
        session: &Session,
    ) -> sfs::ShareFetchResponse {
        let listener: &str = &session.listener;
        let top_error = |code: ErrorCode| sfs::ShareFetchResponse {
            error_code: code.code(),
            ..Default::default()
        };
        let (group, member) = match share_request_ids(&r.group_id, &r.member_id) {
            Ok(ids) => ids,
            Err(code) => return top_error(code),
        };
        let named: Vec<(Uuid, i32)> = r
            .topics
            .iter()
            .flat_map(|t| t.partitions.iter().map(|p| (t.topic_id, p.partition_index)))
            .collect();
        let forgotten: Vec<(Uuid, i32)> = r
            .forgotten_topics_data
            .iter()
            .flat_map(|t| t.partitions.iter().map(|p| (t.topic_id, *p)))
            .collect();
        let has_acks = r.topics.iter().any(|t| {
            t.partitions
                .iter()
                .any(|p| !p.acknowledgement_batches.is_empty())
        });
        let step = self.share_session_step(
            &group,
            &member,
            SessionRequest {
                epoch: r.share_session_epoch,
                add: &named,
                forget: &forgotten,
                may_open: true,
                has_acks,
                connection_id: session.connection_id,
            },
        );
        let (partitions, opened, closing) = match step {
            SessionStep::Refused(code) => return top_error(code),
            SessionStep::Open { partitions, opened } => (partitions, opened, false),
            SessionStep::Close { partitions } => (partitions, false, true),
        };

        // Protocol step 2.
        let mut answers: BTreeMap<(Uuid, i32), sfs::PartitionData> = BTreeMap::new();
        for t in &r.topics {
            for p in &t.partitions {
                if p.acknowledgement_batches.is_empty() {
                    continue;
                }
                let batches = ack_batches(
                    p.acknowledgement_batches
                        .iter()
                        .map(|b| (b.first_offset, b.last_offset, b.acknowledge_types.clone())),
                );
                let code = self
                    .share_ack_partition(&group, &member, t.topic_id, p.partition_index, batches)
                    .await;
                let entry = answers.entry((t.topic_id, p.partition_index)).or_default();
                entry.acknowledge_error_code = code.code();
            }
        }
        if closing {
            self.share_close_session(&group, &member, &partitions).await;
        } else if !r.is_renew_ack {
            // Protocol step 3 (a renewal only extends locks and fetches nothing).
            self.share_fetch_wait(&r, &group, &member, &partitions, &mut answers)
                .await;
        }

        // Protocol step 4.
        if opened {
            for tp in &named {
                answers.entry(*tp).or_default();
            }
        }
        let image = self.image();
        let mut leaders = BTreeSet::new();
        let mut topics: BTreeMap<Uuid, Vec<sfs::PartitionData>> = BTreeMap::new();
        for ((topic_id, partition), mut data) in answers {
            data.partition_index = partition;
            if data.records.is_none() {
                data.records = Some(Bytes::new());
            }
            let (leader_id, leader_epoch) = self.share_current_leader(&topic_id, partition);
            if data.error_code == ErrorCode::NOT_LEADER_OR_FOLLOWER.code() && leader_id >= 0 {
                leaders.insert(leader_id);
            }
            data.current_leader = sfs::LeaderIdAndEpoch {
                leader_id,
                leader_epoch,
                ..Default::default()
            };
            topics.entry(topic_id).or_default().push(data);
        }
        sfs::ShareFetchResponse {
            acquisition_lock_timeout_ms: self.share_lock_duration_ms(&group),
            responses: topics
                .into_iter()
                .map(|(topic_id, partitions)| sfs::ShareFetchableTopicResponse {
                    topic_id,
                    partitions,
                    ..Default::default()
                })
                .collect(),
            node_endpoints: leader_endpoints(&image, leaders, listener)
                .map(|(node_id, host, port, rack)| sfs::NodeEndpoint {
                    node_id,
                    host,
                    port,
                    rack,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    /// Protocol step 3: acquires from `partitions` into `answers`, parking while nothing
    /// is there.
    async fn share_fetch_wait(
        &self,
        r: &sfq::ShareFetchRequest,
        group: &str,
        member: &str,
        partitions: &BTreeSet<(Uuid, i32)>,
        answers: &mut BTreeMap<(Uuid, i32), sfs::PartitionData>,
    ) {
        if partitions.is_empty() {
            return;
        }
        let max_wait = Duration::from_millis(u64::try_from(r.max_wait_ms).unwrap_or(0))
            .min(MAX_SHARE_FETCH_WAIT);
        let deadline = tokio::time::Instant::now() + max_wait;
        let max_bytes = usize::try_from(r.max_bytes).unwrap_or(0).max(1);
        let per_partition = (max_bytes / partitions.len()).clamp(1, MAX_PARTITION_BYTES);
        let max_records = if r.max_records > 0 {
            r.max_records
        } else {
            500
        };
        let mode = ShareAcquireMode::try_from(r.share_acquire_mode).unwrap_or_default();
        let mut shards: Vec<usize> = partitions
            .iter()
            .filter_map(|(id, p)| {
                self.topic_name_by_id(id)
                    .map(|name| AppendSignals::shard(&name, *p))
            })
            .collect();
        shards.sort_unstable();
        shards.dedup();
        loop {
            // Registered before acquiring, so that an append or a release in between
            // still wakes this fetch.
            let signals = self.replicas.signals();
            let appended = signals.any_of(&shards);
            let released = self.share_partitions.available.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            let mut done = false;
            for (topic_id, partition) in partitions {
                let key = SharePartitionKey::new(group, *topic_id, *partition);
                match self
                    .share_acquire(&key, member, max_records, per_partition, mode)
                    .await
                {
                    Ok(a) if a.acquired.is_empty() => {}
                    Ok(a) => {
                        let entry = answers.entry((*topic_id, *partition)).or_default();
                        entry.records = Some(a.records);
                        entry.acquired_records = a
                            .acquired
                            .into_iter()
                            .map(|x| sfs::AcquiredRecords {
                                first_offset: x.first_offset,
                                last_offset: x.last_offset,
                                delivery_count: x.delivery_count,
                                ..Default::default()
                            })
                            .collect();
                        done = true;
                    }
                    Err(code) => {
                        let entry = answers.entry((*topic_id, *partition)).or_default();
                        entry.error_code = code.code();
                        done = true;
                    }
                }
            }
            if done || tokio::time::Instant::now() >= deadline {
                return;
            }
            request_slot::park();
            tokio::select! {
                _ = appended => {}
                _ = released => {}
                _ = tokio::time::sleep_until(deadline) => {}
            }
        }
    }

    pub(crate) async fn handle_share_acknowledge(
        &self,
        r: saq::ShareAcknowledgeRequest,
        session: &Session,
    ) -> sas::ShareAcknowledgeResponse {
        let listener: &str = &session.listener;
        let top_error = |code: ErrorCode| sas::ShareAcknowledgeResponse {
            error_code: code.code(),
            ..Default::default()
        };
        let (group, member) = match share_request_ids(&r.group_id, &r.member_id) {
            Ok(ids) => ids,
            Err(code) => return top_error(code),
        };
        let step = self.share_session_step(
            &group,
            &member,
            SessionRequest {
                epoch: r.share_session_epoch,
                add: &[],
                forget: &[],
                may_open: false,
                has_acks: true,
                connection_id: session.connection_id,
            },
        );
        let closing = match step {
            SessionStep::Refused(code) => return top_error(code),
            SessionStep::Open { .. } => None,
            SessionStep::Close { partitions } => Some(partitions),
        };
        let image = self.image();
        let mut leaders = BTreeSet::new();
        let mut responses = Vec::with_capacity(r.topics.len());
        for t in &r.topics {
            let mut partitions = Vec::with_capacity(t.partitions.len());
            for p in &t.partitions {
                let batches = ack_batches(
                    p.acknowledgement_batches
                        .iter()
                        .map(|b| (b.first_offset, b.last_offset, b.acknowledge_types.clone())),
                );
                let code = self
                    .share_ack_partition(&group, &member, t.topic_id, p.partition_index, batches)
                    .await;
                let (leader_id, leader_epoch) =
                    self.share_current_leader(&t.topic_id, p.partition_index);
                if code == ErrorCode::NOT_LEADER_OR_FOLLOWER && leader_id >= 0 {
                    leaders.insert(leader_id);
                }
                partitions.push(sas::PartitionData {
                    partition_index: p.partition_index,
                    error_code: code.code(),
                    current_leader: sas::LeaderIdAndEpoch {
                        leader_id,
                        leader_epoch,
                        ..Default::default()
                    },
                    ..Default::default()
                });
            }
            responses.push(sas::ShareAcknowledgeTopicResponse {
                topic_id: t.topic_id,
                partitions,
                ..Default::default()
            });
        }
        if let Some(partitions) = closing {
            self.share_close_session(&group, &member, &partitions).await;
        }
        sas::ShareAcknowledgeResponse {
            acquisition_lock_timeout_ms: self.share_lock_duration_ms(&group),
            responses,
            node_endpoints: leader_endpoints(&image, leaders, listener)
                .map(|(node_id, host, port, rack)| sas::NodeEndpoint {
                    node_id,
                    host,
                    port,
                    rack,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epochs_wrap_to_one() {
        assert_eq!(next_epoch(1), 2);
        assert_eq!(next_epoch(i32::MAX), 1);
    }

    #[test]
    fn unknown_acknowledge_types_are_invalid_requests() {
        let ok = ack_batches([(0, 2, vec![1]), (3, 4, vec![2, 3])].into_iter()).unwrap();
        assert_eq!(
            ok[1].acknowledge_types,
            vec![AcknowledgeType::Release, AcknowledgeType::Reject]
        );
        assert_eq!(
            ack_batches([(0, 0, vec![9])].into_iter()),
            Err(ErrorCode::INVALID_REQUEST)
        );
    }
}
