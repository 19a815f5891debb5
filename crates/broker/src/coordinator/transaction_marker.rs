//! The marker sender (Kafka's `TransactionMarkerChannelManager`): it writes the COMMIT or
//! ABORT markers of an ending transaction to the leader of every partition in it, with
//! WriteTxnMarkers requests over the inter-broker connection, and tells the transaction
//! coordinator once all are written.
//!
//! # Protocol
//! 1. The coordinator's shard hands over a [`MarkerJob`] when a PrepareCommit or
//!    PrepareAbort record is replicated (or found preparing by a load).
//! 2. The job's partitions are grouped by their leader in the metadata image
//!    ([`PartitionLeaders`]); each leader gets one WriteTxnMarkers request (v1) with one
//!    marker naming its partitions, fenced by the coordinator epoch.
//! 3. A partition answered NONE is done; one whose topic is gone (no such partition in
//!    the image) is done too, as Kafka drops it; a retriable error (the leader moved, not
//!    enough replicas, a timeout, a connection that failed, UNKNOWN_TOPIC_OR_PARTITION
//!    from a broker that has not made its replicas yet) is sent again after a backoff, to
//!    whichever broker leads it then. A fatal error (the coordinator was fenced by a
//!    newer epoch, the producer fenced) ends the job: the newer coordinator owns it.
//! 4. Before every retry the job asks the coordinator whether it still waits for these
//!    markers ([`TxnCall::StillPreparing`]); a coordinator that resigned or finished says
//!    no, and the job ends.
//! 5. When every partition is done, [`TxnCall::MarkersWritten`] moves the transaction to
//!    CompleteCommit or CompleteAbort.
//!
//! Each job is a task of its own, so that a slow leader delays only the transactions
//! that wrote to it; there is at most one job per ending transaction.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use rill_protocol::generated::write_txn_markers_request::{
    WritableTxnMarker, WritableTxnMarkerTopic, WriteTxnMarkersRequest,
};
use rill_protocol::generated::write_txn_markers_response::WriteTxnMarkersResponse;
use rill_protocol::ErrorCode;
use rill_transaction::TransactionPartition;
use tokio::sync::mpsc;

use crate::network::inter_broker::{InterBrokerConnector, PeerEndpoint};

use super::transaction_coordinator::{by_topic, TransactionCoordinatorHandle, TxnCall, TxnReply};

/// The WriteTxnMarkers version sent (Kafka's inter-broker version for transaction
/// version 1; flexible).
const WRITE_TXN_MARKERS_VERSION: i16 = 1;
/// A leader appends markers with acks=all; Kafka's `request.timeout.ms` bounds the wait.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
const MAX_RESPONSE_BYTES: usize = 1 << 20;
/// Backoff between rounds for the partitions still to do, doubling up to the cap.
const RETRY_BACKOFF_MIN: Duration = Duration::from_millis(50);
const RETRY_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// The markers of one ending transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MarkerJob {
    pub transactional_id: String,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub commit: bool,
    pub coordinator_epoch: i32,
    pub partitions: Vec<TransactionPartition>,
}

/// Where a partition's leader is, as this broker's metadata image says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Leader {
    /// The leader's id and its endpoint on the inter-broker listener.
    At(i32, PeerEndpoint),
    /// The partition has no leader now (an election, or a leader without an endpoint).
    Unavailable,
    /// The topic or partition does not exist (deleted): its marker is not needed.
    Unknown,
}

/// The metadata image's view of partition leaders, given by the server (the
/// coordinator does not name it).
pub trait PartitionLeaders: Send + Sync + 'static {
    fn leader(&self, topic: &str, partition: i32) -> Leader;
}

/// What a round does with a partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Done,
    Retry,
    /// The job must stop: another coordinator or producer epoch owns the transaction.
    Fatal,
}

/// Kafka's handling of a WriteTxnMarkers partition error in the coordinator
/// (`TransactionMarkerRequestCompletionHandler`).
pub fn outcome(error: ErrorCode) -> Outcome {
    match error {
        ErrorCode::NONE => Outcome::Done,
        ErrorCode::TRANSACTION_COORDINATOR_FENCED
        | ErrorCode::INVALID_PRODUCER_EPOCH
        | ErrorCode::PRODUCER_FENCED
        | ErrorCode::CLUSTER_AUTHORIZATION_FAILED
        | ErrorCode::UNSUPPORTED_FOR_MESSAGE_FORMAT
        | ErrorCode::INVALID_REQUEST => Outcome::Fatal,
        // NOT_LEADER_OR_FOLLOWER, NOT_ENOUGH_REPLICAS(_AFTER_APPEND), REQUEST_TIMED_OUT,
        // KAFKA_STORAGE_ERROR, UNKNOWN_SERVER_ERROR, ...: the next round asks the leader
        // of then. UNKNOWN_TOPIC_OR_PARTITION too: a broker answers it while it has no
        // replica of the partition (just restarted, or its log directory failed), which
        // says nothing of the topic; a deleted one leaves the image, and `plan` drops it.
        _ => Outcome::Retry,
    }
}

/// One round's requests: the partitions of `todo` per leader address, and those known
/// done or waiting without a leader.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub requests: BTreeMap<PeerEndpoint, Vec<TransactionPartition>>,
    pub unknown: Vec<TransactionPartition>,
    pub no_leader: Vec<TransactionPartition>,
}

/// Groups the partitions still to mark by their leader.
pub fn plan(todo: &BTreeSet<TransactionPartition>, leaders: &dyn PartitionLeaders) -> Plan {
    let mut plan = Plan::default();
    for tp in todo {
        match leaders.leader(&tp.0, tp.1) {
            Leader::At(_, addr) => plan.requests.entry(addr).or_default().push(tp.clone()),
            Leader::Unavailable => plan.no_leader.push(tp.clone()),
            Leader::Unknown => plan.unknown.push(tp.clone()),
        }
    }
    plan
}

/// The request for one leader.
pub fn request(job: &MarkerJob, partitions: &[TransactionPartition]) -> WriteTxnMarkersRequest {
    WriteTxnMarkersRequest {
        markers: vec![WritableTxnMarker {
            producer_id: job.producer_id,
            producer_epoch: job.producer_epoch,
            transaction_result: job.commit,
            coordinator_epoch: job.coordinator_epoch,
            topics: by_topic(partitions)
                .into_iter()
                .map(|(name, partition_indexes)| WritableTxnMarkerTopic {
                    name,
                    partition_indexes,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// The error of each partition sent, from a response (a partition the response leaves
/// out is retried).
pub fn results(
    job: &MarkerJob,
    sent: &[TransactionPartition],
    response: &WriteTxnMarkersResponse,
) -> Vec<(TransactionPartition, ErrorCode)> {
    let mut answered: BTreeMap<TransactionPartition, ErrorCode> = BTreeMap::new();
    for marker in response
        .markers
        .iter()
        .filter(|m| m.producer_id == job.producer_id)
    {
        for topic in &marker.topics {
            for p in &topic.partitions {
                answered.insert(
                    (topic.name.clone(), p.partition_index),
                    ErrorCode::from_code(p.error_code),
                );
            }
        }
    }
    sent.iter()
        .map(|tp| {
            let error = answered
                .get(tp)
                .copied()
                .unwrap_or(ErrorCode::UNKNOWN_SERVER_ERROR);
            (tp.clone(), error)
        })
        .collect()
}

/// Starts the sender: a task per job read from `jobs`.
pub fn start(
    mut jobs: mpsc::UnboundedReceiver<MarkerJob>,
    coordinator: TransactionCoordinatorHandle,
    leaders: Arc<dyn PartitionLeaders>,
    local_id: i32,
    connector: Arc<InterBrokerConnector>,
) {
    tokio::spawn(async move {
        while let Some(job) = jobs.recv().await {
            tokio::spawn(run_job(
                job,
                coordinator.clone(),
                leaders.clone(),
                local_id,
                connector.clone(),
            ));
        }
    });
}

async fn run_job(
    job: MarkerJob,
    coordinator: TransactionCoordinatorHandle,
    leaders: Arc<dyn PartitionLeaders>,
    local_id: i32,
    connector: Arc<InterBrokerConnector>,
) {
    let mut todo: BTreeSet<TransactionPartition> = job.partitions.iter().cloned().collect();
    let mut backoff = RETRY_BACKOFF_MIN;
    let mut round = 0u64;
    while !todo.is_empty() {
        if round > 0 {
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(RETRY_BACKOFF_MAX);
            let still = coordinator
                .call(TxnCall::StillPreparing {
                    transactional_id: job.transactional_id.clone(),
                    producer_id: job.producer_id,
                    producer_epoch: job.producer_epoch,
                })
                .await;
            if !matches!(still, Ok(TxnReply::Done(true))) {
                tracing::debug!(transactional_id = %job.transactional_id, "markers no longer needed here");
                return;
            }
        }
        round += 1;
        let plan = plan(&todo, leaders.as_ref());
        for tp in &plan.unknown {
            todo.remove(tp);
        }
        let mut sends = tokio::task::JoinSet::new();
        for (addr, partitions) in plan.requests {
            let request = request(&job, &partitions);
            let job = job.clone();
            let connector = connector.clone();
            sends.spawn(async move {
                match send(&connector, &addr, local_id, &request).await {
                    Ok(response) => results(&job, &partitions, &response),
                    Err(e) => {
                        // A refused login or TLS handshake is a misconfiguration the
                        // operator must see (at most once a second per job, the backoff's
                        // cap); a leader that is down or moved is routine.
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::InvalidData
                        ) {
                            tracing::warn!(
                                %addr,
                                listener = connector.listener(),
                                error = %e,
                                "WriteTxnMarkers failed; retrying"
                            );
                        } else {
                            tracing::debug!(%addr, error = %e, "WriteTxnMarkers failed");
                        }
                        partitions
                            .into_iter()
                            .map(|tp| (tp, ErrorCode::NETWORK_EXCEPTION))
                            .collect()
                    }
                }
            });
        }
        let mut answered = Vec::new();
        while let Some(result) = sends.join_next().await {
            answered.extend(result.unwrap_or_default());
        }
        for (tp, error) in answered {
            match outcome(error) {
                Outcome::Done => {
                    todo.remove(&tp);
                }
                Outcome::Retry => {
                    tracing::debug!(topic = %tp.0, partition = tp.1, error = error.name(), "marker to be retried");
                }
                Outcome::Fatal => {
                    tracing::warn!(
                        transactional_id = %job.transactional_id,
                        topic = %tp.0,
                        partition = tp.1,
                        error = error.name(),
                        "marker refused; the transaction is left to its newer owner"
                    );
                    return;
                }
            }
        }
    }
    let _ = coordinator
        .call(TxnCall::MarkersWritten {
            transactional_id: job.transactional_id.clone(),
            producer_id: job.producer_id,
            producer_epoch: job.producer_epoch,
        })
        .await;
}

/// Sends one WriteTxnMarkers request on a connection of its own.
async fn send(
    connector: &InterBrokerConnector,
    addr: &PeerEndpoint,
    local_id: i32,
    request: &WriteTxnMarkersRequest,
) -> std::io::Result<WriteTxnMarkersResponse> {
    let client_id = format!("rill-txn-marker-sender-{local_id}");
    connector
        .call(
            addr,
            &client_id,
            request,
            WRITE_TXN_MARKERS_VERSION,
            (REQUEST_TIMEOUT, MAX_RESPONSE_BYTES),
        )
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;
    use rill_protocol::frame::decode_frame;
    use rill_protocol::generated::write_txn_markers_response::{
        WritableTxnMarkerPartitionResult, WritableTxnMarkerResult, WritableTxnMarkerTopicResult,
    };
    use rill_protocol::{ApiKey, Decodable, Request};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    struct Leaders(BTreeMap<(String, i32), Leader>);

    impl PartitionLeaders for Leaders {
        fn leader(&self, topic: &str, partition: i32) -> Leader {
            self.0
                .get(&(topic.to_string(), partition))
                .cloned()
                .unwrap_or(Leader::Unknown)
        }
    }

    fn addr(port: u16) -> PeerEndpoint {
        PeerEndpoint::of_addr(std::net::SocketAddr::from(([127, 0, 0, 1], port)))
    }

    fn job(partitions: &[(&str, i32)]) -> MarkerJob {
        MarkerJob {
            transactional_id: "t".into(),
            producer_id: 7,
            producer_epoch: 3,
            commit: true,
            coordinator_epoch: 5,
            partitions: partitions
                .iter()
                .map(|(t, p)| (t.to_string(), *p))
                .collect(),
        }
    }

    #[test]
    fn partitions_are_grouped_by_leader_and_missing_ones_set_apart() {
        let leaders = Leaders(
            [
                (("a".to_string(), 0), Leader::At(1, addr(1))),
                (("a".to_string(), 1), Leader::At(2, addr(2))),
                (("b".to_string(), 0), Leader::At(1, addr(1))),
                (("c".to_string(), 0), Leader::Unavailable),
            ]
            .into_iter()
            .collect(),
        );
        let todo: BTreeSet<TransactionPartition> =
            job(&[("a", 0), ("a", 1), ("b", 0), ("c", 0), ("gone", 3)])
                .partitions
                .into_iter()
                .collect();
        let plan = plan(&todo, &leaders);
        assert_eq!(
            plan.requests.get(&addr(1)),
            Some(&vec![("a".to_string(), 0), ("b".to_string(), 0)])
        );
        assert_eq!(
            plan.requests.get(&addr(2)),
            Some(&vec![("a".to_string(), 1)])
        );
        assert_eq!(plan.no_leader, vec![("c".to_string(), 0)]);
        assert_eq!(plan.unknown, vec![("gone".to_string(), 3)]);
    }

    #[test]
    fn a_request_carries_one_marker_with_the_coordinator_epoch_per_topic() {
        let j = job(&[("a", 0), ("a", 2), ("b", 1)]);
        let r = request(&j, &j.partitions);
        assert_eq!(r.markers.len(), 1);
        let m = &r.markers[0];
        assert_eq!((m.producer_id, m.producer_epoch), (7, 3));
        assert!(m.transaction_result);
        assert_eq!(m.coordinator_epoch, 5);
        let topics: Vec<(String, Vec<i32>)> = m
            .topics
            .iter()
            .map(|t| (t.name.clone(), t.partition_indexes.clone()))
            .collect();
        assert_eq!(
            topics,
            vec![("a".to_string(), vec![0, 2]), ("b".to_string(), vec![1])]
        );
        // It encodes at the version sent and decodes back the same.
        let mut buf = BytesMut::new();
        rill_protocol::Encodable::encode(&r, &mut buf, WRITE_TXN_MARKERS_VERSION).unwrap();
        let back =
            WriteTxnMarkersRequest::decode(&mut buf.freeze(), WRITE_TXN_MARKERS_VERSION).unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn errors_decide_done_retry_or_stop() {
        assert_eq!(outcome(ErrorCode::NONE), Outcome::Done);
        for retriable in [
            ErrorCode::UNKNOWN_TOPIC_OR_PARTITION,
            ErrorCode::NOT_LEADER_OR_FOLLOWER,
            ErrorCode::NOT_ENOUGH_REPLICAS,
            ErrorCode::NOT_ENOUGH_REPLICAS_AFTER_APPEND,
            ErrorCode::REQUEST_TIMED_OUT,
            ErrorCode::NETWORK_EXCEPTION,
            ErrorCode::KAFKA_STORAGE_ERROR,
        ] {
            assert_eq!(outcome(retriable), Outcome::Retry, "{}", retriable.name());
        }
        for fatal in [
            ErrorCode::TRANSACTION_COORDINATOR_FENCED,
            ErrorCode::INVALID_PRODUCER_EPOCH,
            ErrorCode::PRODUCER_FENCED,
        ] {
            assert_eq!(outcome(fatal), Outcome::Fatal, "{}", fatal.name());
        }
    }

    #[test]
    fn a_partition_missing_from_the_response_is_retried() {
        let j = job(&[("a", 0), ("a", 1)]);
        let response = WriteTxnMarkersResponse {
            markers: vec![WritableTxnMarkerResult {
                producer_id: 7,
                topics: vec![WritableTxnMarkerTopicResult {
                    name: "a".into(),
                    partitions: vec![WritableTxnMarkerPartitionResult {
                        partition_index: 0,
                        error_code: 0,
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        };
        let r = results(&j, &j.partitions, &response);
        assert_eq!(
            r,
            vec![
                (("a".to_string(), 0), ErrorCode::NONE),
                (("a".to_string(), 1), ErrorCode::UNKNOWN_SERVER_ERROR)
            ]
        );
        assert_eq!(outcome(r[1].1), Outcome::Retry);
    }

    /// A leader that answers `first` to the first WriteTxnMarkers and NONE after: the
    /// job must retry over a new connection, then report the markers written, once.
    async fn a_job_retries_a_leader_that_first_answered(first: ErrorCode) {
        use crate::coordinator::runtime::test_handle;
        use rill_protocol::generated::write_txn_markers_response::{
            WritableTxnMarkerPartitionResult, WritableTxnMarkerResult, WritableTxnMarkerTopicResult,
        };
        use rill_protocol::header::decode_request_header;
        use std::sync::atomic::{AtomicUsize, Ordering};

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let leader_addr = PeerEndpoint::of_addr(listener.local_addr().unwrap());
        let requests = Arc::new(AtomicUsize::new(0));
        let seen = requests.clone();
        tokio::spawn(async move {
            loop {
                let (mut stream, _) = listener.accept().await.unwrap();
                let mut buf = BytesMut::new();
                let frame = loop {
                    if let Some(f) = decode_frame(&mut buf, 1 << 20).unwrap() {
                        break f.freeze();
                    }
                    assert!(stream.read_buf(&mut buf).await.unwrap() > 0);
                };
                let mut frame = frame;
                let (header, _) = decode_request_header(&mut frame).unwrap();
                assert_eq!(header.request_api_key, WriteTxnMarkersRequest::API_KEY);
                let request = WriteTxnMarkersRequest::decode(&mut frame, 1).unwrap();
                let marker = &request.markers[0];
                assert_eq!(marker.coordinator_epoch, 5);
                let n = seen.fetch_add(1, Ordering::SeqCst);
                let error = if n == 0 { first } else { ErrorCode::NONE };
                let response = WriteTxnMarkersResponse {
                    markers: vec![WritableTxnMarkerResult {
                        producer_id: marker.producer_id,
                        topics: marker
                            .topics
                            .iter()
                            .map(|t| WritableTxnMarkerTopicResult {
                                name: t.name.clone(),
                                partitions: t
                                    .partition_indexes
                                    .iter()
                                    .map(|p| WritableTxnMarkerPartitionResult {
                                        partition_index: *p,
                                        error_code: error.code(),
                                        ..Default::default()
                                    })
                                    .collect(),
                                ..Default::default()
                            })
                            .collect(),
                        ..Default::default()
                    }],
                    ..Default::default()
                };
                let bytes = crate::server::encode_response(
                    header.correlation_id,
                    ApiKey::WriteTxnMarkers,
                    1,
                    &response,
                )
                .unwrap();
                stream.write_all(&bytes).await.unwrap();
            }
        });
        let leaders = Arc::new(Leaders(
            [
                (("a".to_string(), 0), Leader::At(1, leader_addr.clone())),
                (("a".to_string(), 1), Leader::At(1, leader_addr.clone())),
            ]
            .into_iter()
            .collect(),
        ));
        let (handle, mut calls) = test_handle();
        tokio::spawn(run_job(
            job(&[("a", 0), ("a", 1)]),
            handle,
            leaders,
            9,
            Default::default(),
        ));
        let mut still_preparing = 0;
        let written = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                let (call, reply) = calls.recv().await.unwrap();
                match call {
                    TxnCall::StillPreparing { .. } => {
                        still_preparing += 1;
                        let _ = reply.send(TxnReply::Done(true));
                    }
                    TxnCall::MarkersWritten {
                        transactional_id,
                        producer_id,
                        producer_epoch,
                    } => {
                        let _ = reply.send(TxnReply::Done(true));
                        return (transactional_id, producer_id, producer_epoch);
                    }
                    _ => panic!("unexpected call"),
                }
            }
        })
        .await
        .expect("markers reported written");
        assert_eq!(written, ("t".to_string(), 7, 3));
        assert_eq!(
            requests.load(Ordering::SeqCst),
            2,
            "{} must be retried",
            first.name()
        );
        assert_eq!(still_preparing, 1, "asked once before the retry");
    }

    #[tokio::test]
    async fn a_job_retries_a_leader_that_refused_and_then_reports_the_markers_written() {
        a_job_retries_a_leader_that_first_answered(ErrorCode::NOT_LEADER_OR_FOLLOWER).await;
    }

    /// A broker that has just restarted (or whose log directory failed) answers
    /// UNKNOWN_TOPIC_OR_PARTITION until it has made its replicas again: the marker was
    /// not written, so it must be sent again, as Kafka's
    /// `TransactionMarkerRequestCompletionHandler` does. Taking that answer for "the
    /// topic is gone" completed a transaction without its marker on that partition, and
    /// the producer's next commit there made the aborted records visible (chaos seed 101).
    #[tokio::test]
    async fn a_leader_that_does_not_host_the_partition_yet_is_asked_again() {
        a_job_retries_a_leader_that_first_answered(ErrorCode::UNKNOWN_TOPIC_OR_PARTITION).await;
    }

    /// A coordinator that no longer waits for the markers (it resigned, or the
    /// transaction ended) stops the job: nothing is reported.
    #[tokio::test]
    async fn a_job_stops_when_the_coordinator_no_longer_waits() {
        use crate::coordinator::runtime::test_handle;
        let leaders = Arc::new(Leaders(
            [(("a".to_string(), 0), Leader::Unavailable)]
                .into_iter()
                .collect(),
        ));
        let (handle, mut calls) = test_handle();
        let task = tokio::spawn(run_job(
            job(&[("a", 0)]),
            handle,
            leaders,
            9,
            Default::default(),
        ));
        let (call, reply) = tokio::time::timeout(Duration::from_secs(10), calls.recv())
            .await
            .unwrap()
            .unwrap();
        assert!(matches!(call, TxnCall::StillPreparing { .. }));
        let _ = reply.send(TxnReply::Done(false));
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("the job ended")
            .unwrap();
        assert!(calls.try_recv().is_err(), "nothing reported after the stop");
    }
}
