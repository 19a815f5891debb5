//! [`ShareStatePersister`] (Kafka's `DefaultStatePersister` with its
//! `PersisterStateManager`): how a share-partition leader initialises, reads, writes and
//! deletes the persisted state of a share-partition, wherever its share coordinator is.
//!
//! # Protocol
//! 1. The coordinator of a share-partition is the leader of its `__share_group_state`
//!    partition (`abs(hash("group:topicId:partition")) % partitions`, as FindCoordinator's
//!    SHARE key), read from this broker's metadata image; the topic is created on first
//!    use.
//! 2. When that is this broker, the call goes to the share coordinator in-process; else the
//!    one-share-partition RPC goes to it over the inter-broker listener.
//! 3. NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE, a
//!    coordinator not known yet and a failed connection are retried with exponential
//!    backoff ([`RETRY_BACKOFF`] to [`RETRY_BACKOFF_MAX`]) until [`RETRY_DEADLINE`], the
//!    coordinator looked up again each time; any other answer (fencing among them) is
//!    the caller's.
//!
//! # Why it is correct
//! The coordinator answers a write only once its records are replicated, and every answer
//! names one share-partition, so a retry after an unanswered call repeats a write that is
//! idempotent for its epochs (the same batches laid over the same state), and a leader
//! never hears of a persisted state that a coordinator failover could take back.

use std::future::Future;
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use rill_protocol::generated::{
    delete_share_group_state_request as del_req, initialize_share_group_state_request as init_req,
    read_share_group_state_request as read_req, read_share_group_state_summary_request as sum_req,
    write_share_group_state_request as wr_req,
};
use rill_protocol::ErrorCode;
use rill_share::{
    PersistedState, Request, Response, SharePartitionKey, StateBatch, StateWrite,
    SHARE_GROUP_STATE_TOPIC,
};

use crate::network::inter_broker::{InterBrokerConnector, PeerEndpoint};
use crate::server::metadata::broker_endpoint;
use crate::server::Broker;

/// First wait before a retry (Kafka's persister starts at 100 ms too).
pub const RETRY_BACKOFF: Duration = Duration::from_millis(100);
/// Longest wait between retries.
pub const RETRY_BACKOFF_MAX: Duration = Duration::from_secs(2);
/// How long a call is retried in all before its last error is the answer.
pub const RETRY_DEADLINE: Duration = Duration::from_secs(30);
/// One RPC to a remote coordinator.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
const MAX_RESPONSE_BYTES: usize = 16 << 20;

/// Where a share-partition's coordinator is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    Local,
    Remote(PeerEndpoint),
}

/// Whether a call answered `error` is worth another try, at another coordinator or later.
pub fn retriable(error: ErrorCode) -> bool {
    matches!(
        error,
        ErrorCode::NOT_COORDINATOR
            | ErrorCode::COORDINATOR_LOAD_IN_PROGRESS
            | ErrorCode::COORDINATOR_NOT_AVAILABLE
            | ErrorCode::NETWORK_EXCEPTION
            | ErrorCode::REQUEST_TIMED_OUT
    )
}

/// Protocol step 3: `attempt` until its answer is not [`retriable`] or `deadline` has
/// passed, sleeping with exponential backoff between attempts.
pub async fn retrying<F, Fut>(
    request: &Request,
    deadline: tokio::time::Instant,
    (backoff, backoff_max): (Duration, Duration),
    mut attempt: F,
) -> Response
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Response>,
{
    let mut wait = backoff;
    loop {
        let answer = attempt().await;
        let error = answer.error_code();
        if !retriable(error) {
            return answer;
        }
        let now = tokio::time::Instant::now();
        if now + wait > deadline {
            tracing::debug!(key = %request.key(), error = error.name(), "share state call gives up");
            return answer;
        }
        tokio::time::sleep(wait).await;
        wait = (wait * 2).min(backoff_max);
    }
}

/// The share-partition leaders' persister; see the module's protocol.
pub struct ShareStatePersister {
    broker: OnceLock<Weak<Broker>>,
    connector: Arc<InterBrokerConnector>,
}

impl ShareStatePersister {
    pub fn new(connector: Arc<InterBrokerConnector>) -> Self {
        ShareStatePersister {
            broker: OnceLock::new(),
            connector,
        }
    }

    /// The broker it works for, once it exists.
    pub fn set(&self, broker: &Arc<Broker>) {
        let _ = self.broker.set(Arc::downgrade(broker));
    }

    fn broker(&self) -> Option<Arc<Broker>> {
        self.broker.get().and_then(Weak::upgrade)
    }

    /// InitializeShareGroupState: the share-partition starts at `start_offset` under
    /// `state_epoch`.
    pub async fn initialize(
        &self,
        key: SharePartitionKey,
        state_epoch: i32,
        start_offset: i64,
    ) -> Result<(), ErrorCode> {
        let answer = self
            .call(Request::Initialize {
                key,
                state_epoch,
                start_offset,
            })
            .await;
        into_result(answer.error_code())
    }

    /// ReadShareGroupState as the share-partition's leader at `leader_epoch`: the state it
    /// starts from.
    pub async fn read(
        &self,
        key: SharePartitionKey,
        leader_epoch: i32,
    ) -> Result<PersistedState, ErrorCode> {
        match self.call(Request::Read { key, leader_epoch }).await {
            Response::Read {
                error: ErrorCode::NONE,
                state_epoch,
                start_offset,
                state_batches,
            } => Ok(PersistedState {
                state_epoch,
                start_offset,
                state_batches,
            }),
            other => Err(error_of(&other)),
        }
    }

    /// WriteShareGroupState: what a lasting change of the share-partition persists.
    pub async fn write(&self, key: SharePartitionKey, write: &StateWrite) -> Result<(), ErrorCode> {
        let answer = self
            .call(Request::Write {
                key,
                state_epoch: write.state_epoch,
                leader_epoch: write.leader_epoch,
                start_offset: write.start_offset,
                delivery_complete_count: write.delivery_complete_count,
                state_batches: write.state_batches.clone(),
            })
            .await;
        into_result(answer.error_code())
    }

    /// DeleteShareGroupState.
    pub async fn delete(&self, key: SharePartitionKey) -> Result<(), ErrorCode> {
        into_result(self.call(Request::Delete { key }).await.error_code())
    }

    /// ReadShareGroupStateSummary: the answer as the coordinator gave it.
    pub async fn read_summary(&self, key: SharePartitionKey, leader_epoch: i32) -> Response {
        self.call(Request::ReadSummary { key, leader_epoch }).await
    }

    /// One share-partition's call, routed and retried (protocol steps 1 to 3).
    pub async fn call(&self, request: Request) -> Response {
        let deadline = tokio::time::Instant::now() + RETRY_DEADLINE;
        retrying(
            &request,
            deadline,
            (RETRY_BACKOFF, RETRY_BACKOFF_MAX),
            || self.attempt(&request),
        )
        .await
    }

    async fn attempt(&self, request: &Request) -> Response {
        let Some(broker) = self.broker() else {
            return Response::error(request, ErrorCode::COORDINATOR_NOT_AVAILABLE);
        };
        let route = match route(&broker, request.key()).await {
            Ok(route) => route,
            Err(code) => return Response::error(request, code),
        };
        match route {
            Route::Local => broker
                .shares
                .call(request.clone())
                .await
                .unwrap_or_else(|code| Response::error(request, code)),
            Route::Remote(peer) => {
                let client_id = format!("rill-share-persister-{}", broker.node_id);
                drop(broker);
                self.remote(&peer, &client_id, request).await
            }
        }
    }

    async fn remote(&self, peer: &PeerEndpoint, client_id: &str, request: &Request) -> Response {
        let limits = (REQUEST_TIMEOUT, MAX_RESPONSE_BYTES);
        let failed = |e: std::io::Error| {
            tracing::debug!(peer = %peer.host, error = %e, "share state call failed");
            Response::error(request, ErrorCode::NETWORK_EXCEPTION)
        };
        let answers = match wire_request(request) {
            WireRequest::Initialize(r) => self
                .connector
                .call(peer, client_id, &r, 0, limits)
                .await
                .map(|resp| super::share_state::initialize_calls_answers(&resp)),
            WireRequest::Read(r) => self
                .connector
                .call(peer, client_id, &r, 0, limits)
                .await
                .map(|resp| super::share_state::read_calls_answers(&resp)),
            WireRequest::Write(r) => self
                .connector
                .call(peer, client_id, &r, WRITE_VERSION, limits)
                .await
                .map(|resp| super::share_state::write_calls_answers(&resp)),
            WireRequest::Delete(r) => self
                .connector
                .call(peer, client_id, &r, 0, limits)
                .await
                .map(|resp| super::share_state::delete_calls_answers(&resp)),
            WireRequest::Summary(r) => self
                .connector
                .call(peer, client_id, &r, SUMMARY_VERSION, limits)
                .await
                .map(|resp| super::share_state::summary_calls_answers(&resp)),
        };
        match answers {
            // One share-partition asked, one answered; anything else is a coordinator
            // that did not work on it (Kafka's empty answer to a request it refuses).
            Ok(mut answers) if answers.len() == 1 => answers.remove(0),
            Ok(_) => Response::error(request, ErrorCode::UNKNOWN_SERVER_ERROR),
            Err(e) => failed(e),
        }
    }
}

/// KIP-1226's versions, which carry the delivery complete count.
const WRITE_VERSION: i16 = 1;
const SUMMARY_VERSION: i16 = 1;

fn into_result(error: ErrorCode) -> Result<(), ErrorCode> {
    if error == ErrorCode::NONE {
        Ok(())
    } else {
        Err(error)
    }
}

/// An answer that carried no state: its error, or, for a success of the wrong kind, a bug.
fn error_of(answer: &Response) -> ErrorCode {
    match answer.error_code() {
        ErrorCode::NONE => ErrorCode::UNKNOWN_SERVER_ERROR,
        e => e,
    }
}

/// Protocol step 1: where the share coordinator of `key` is.
async fn route(broker: &Broker, key: &SharePartitionKey) -> Result<Route, ErrorCode> {
    let partitions = broker.share_state_partitions();
    if broker.image().topic(SHARE_GROUP_STATE_TOPIC).is_none() {
        broker.ensure_share_group_state_topic(partitions).await?;
    }
    let image = broker.image();
    let leader = image
        .partition(SHARE_GROUP_STATE_TOPIC, key.partition_for(partitions))
        .map(|p| p.leader)
        .filter(|l| *l >= 0)
        .ok_or(ErrorCode::COORDINATOR_NOT_AVAILABLE)?;
    if leader == broker.node_id {
        return Ok(Route::Local);
    }
    let (host, port) = broker_endpoint(&image, leader, &broker.inter_broker_listener)
        .ok_or(ErrorCode::COORDINATOR_NOT_AVAILABLE)?;
    PeerEndpoint::resolve(host, port)
        .map(Route::Remote)
        .ok_or(ErrorCode::COORDINATOR_NOT_AVAILABLE)
}

enum WireRequest {
    Initialize(init_req::InitializeShareGroupStateRequest),
    Read(read_req::ReadShareGroupStateRequest),
    Write(wr_req::WriteShareGroupStateRequest),
    Delete(del_req::DeleteShareGroupStateRequest),
    Summary(sum_req::ReadShareGroupStateSummaryRequest),
}

fn wire_batches(batches: &[StateBatch]) -> Vec<wr_req::StateBatch> {
    batches
        .iter()
        .map(|b| wr_req::StateBatch {
            first_offset: b.first_offset,
            last_offset: b.last_offset,
            delivery_state: b.delivery_state.id(),
            delivery_count: b.delivery_count,
            ..Default::default()
        })
        .collect()
}

/// The one-share-partition RPC of a call.
fn wire_request(request: &Request) -> WireRequest {
    let key = request.key();
    let group_id = key.group_id.clone();
    match request {
        Request::Initialize {
            state_epoch,
            start_offset,
            ..
        } => WireRequest::Initialize(init_req::InitializeShareGroupStateRequest {
            group_id,
            topics: vec![init_req::InitializeStateData {
                topic_id: key.topic_id,
                partitions: vec![init_req::PartitionData {
                    partition: key.partition,
                    state_epoch: *state_epoch,
                    start_offset: *start_offset,
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }),
        Request::Read { leader_epoch, .. } => {
            WireRequest::Read(read_req::ReadShareGroupStateRequest {
                group_id,
                topics: vec![read_req::ReadStateData {
                    topic_id: key.topic_id,
                    partitions: vec![read_req::PartitionData {
                        partition: key.partition,
                        leader_epoch: *leader_epoch,
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            })
        }
        Request::Write {
            state_epoch,
            leader_epoch,
            start_offset,
            delivery_complete_count,
            state_batches,
            ..
        } => WireRequest::Write(wr_req::WriteShareGroupStateRequest {
            group_id,
            topics: vec![wr_req::WriteStateData {
                topic_id: key.topic_id,
                partitions: vec![wr_req::PartitionData {
                    partition: key.partition,
                    state_epoch: *state_epoch,
                    leader_epoch: *leader_epoch,
                    start_offset: *start_offset,
                    delivery_complete_count: *delivery_complete_count,
                    state_batches: wire_batches(state_batches),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }),
        Request::Delete { .. } => WireRequest::Delete(del_req::DeleteShareGroupStateRequest {
            group_id,
            topics: vec![del_req::DeleteStateData {
                topic_id: key.topic_id,
                partitions: vec![del_req::PartitionData {
                    partition: key.partition,
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }),
        Request::ReadSummary { leader_epoch, .. } => {
            WireRequest::Summary(sum_req::ReadShareGroupStateSummaryRequest {
                group_id,
                topics: vec![sum_req::ReadStateSummaryData {
                    topic_id: key.topic_id,
                    partitions: vec![sum_req::PartitionData {
                        partition: key.partition,
                        leader_epoch: *leader_epoch,
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use rill_protocol::Uuid;

    use rill_share::RecordState;

    use super::*;

    fn request() -> Request {
        Request::Write {
            key: SharePartitionKey::new("g", Uuid::from_u64_pair(1, 2), 0),
            state_epoch: 0,
            leader_epoch: 3,
            start_offset: 5,
            delivery_complete_count: -1,
            state_batches: vec![StateBatch::new(5, 9, RecordState::Acknowledged, 1)],
        }
    }

    /// Answers `script` in order, then NONE; counts the attempts.
    async fn run(
        script: &[ErrorCode],
        deadline: Duration,
        backoff: (Duration, Duration),
    ) -> (ErrorCode, usize) {
        let r = request();
        let attempts = RefCell::new(0usize);
        let answer = retrying(&r, tokio::time::Instant::now() + deadline, backoff, || {
            let n = {
                let mut a = attempts.borrow_mut();
                *a += 1;
                *a
            };
            let error = script.get(n - 1).copied().unwrap_or(ErrorCode::NONE);
            async move { Response::Write { error } }
        })
        .await;
        (answer.error_code(), attempts.into_inner())
    }

    #[tokio::test]
    async fn coordinator_moves_and_loads_are_retried() {
        let script = [
            ErrorCode::NOT_COORDINATOR,
            ErrorCode::COORDINATOR_LOAD_IN_PROGRESS,
            ErrorCode::COORDINATOR_NOT_AVAILABLE,
            ErrorCode::NETWORK_EXCEPTION,
        ];
        let started = tokio::time::Instant::now();
        let backoff = (Duration::from_millis(10), Duration::from_millis(40));
        assert_eq!(
            run(&script, Duration::from_secs(30), backoff).await,
            (ErrorCode::NONE, 5)
        );
        // 10 + 20 + 40 + 40 ms of backoff, capped at the maximum.
        assert!(started.elapsed() >= Duration::from_millis(110));
    }

    #[tokio::test]
    async fn fencing_is_the_callers_at_once() {
        assert_eq!(
            run(
                &[ErrorCode::FENCED_LEADER_EPOCH],
                Duration::from_secs(30),
                (Duration::from_millis(10), Duration::from_millis(40))
            )
            .await,
            (ErrorCode::FENCED_LEADER_EPOCH, 1)
        );
    }

    #[tokio::test]
    async fn retries_stop_at_the_deadline() {
        let script = [ErrorCode::NOT_COORDINATOR; 100];
        let backoff = (Duration::from_millis(100), Duration::from_millis(400));
        let (error, attempts) = run(&script, Duration::from_secs(1), backoff).await;
        assert_eq!(error, ErrorCode::NOT_COORDINATOR);
        // 100 + 200 + 400 ms fit in a second; the next 400 would not.
        assert_eq!(attempts, 4);
    }

    /// The remote path on a real socket: a peer that decodes the WriteShareGroupState
    /// frame as a broker does and answers FENCED_LEADER_EPOCH for the one share-partition.
    #[tokio::test]
    async fn a_remote_coordinator_is_called_over_the_inter_broker_listener() {
        use bytes::BytesMut;
        use rill_protocol::generated::request_header::RequestHeader;
        use rill_protocol::generated::ApiKey;
        use rill_protocol::{decode_frame, Decodable};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let peer = tokio::spawn(async move {
            let (mut sock, _) = listener.accept().await.unwrap();
            let mut buf = BytesMut::new();
            let mut frame = loop {
                if let Some(f) = decode_frame(&mut buf, 1 << 20).unwrap() {
                    break f.freeze();
                }
                assert!(sock.read_buf(&mut buf).await.unwrap() > 0);
            };
            let api = ApiKey::WriteShareGroupState;
            let probe = RequestHeader::decode(&mut frame.clone(), 2).unwrap();
            assert_eq!(probe.request_api_key, api.as_i16());
            let version = probe.request_api_version;
            let header =
                RequestHeader::decode(&mut frame, api.request_header_version(version)).unwrap();
            let request = wr_req::WriteShareGroupStateRequest::decode(&mut frame, version).unwrap();
            let calls = crate::server::share_state::write_calls(&request);
            let answers = calls
                .into_iter()
                .map(|c| {
                    let c = c.unwrap_or_else(|c| c);
                    (
                        c.topic_id,
                        c.partition,
                        Response::error(&c.request, ErrorCode::FENCED_LEADER_EPOCH),
                    )
                })
                .collect();
            let body = crate::server::share_state::write_response(answers);
            let out =
                crate::server::encode_response(header.correlation_id, api, version, &body).unwrap();
            sock.write_all(&out).await.unwrap();
            (version, request)
        });
        let config = crate::config::BrokerConfig::default();
        let persister = ShareStatePersister::new(Arc::new(
            InterBrokerConnector::from_config(&config).unwrap(),
        ));
        let r = request();
        let answer = persister
            .remote(&PeerEndpoint::of_addr(addr), "test", &r)
            .await;
        assert_eq!(
            answer,
            Response::Write {
                error: ErrorCode::FENCED_LEADER_EPOCH
            }
        );
        let (version, sent) = peer.await.unwrap();
        assert_eq!(version, WRITE_VERSION);
        assert_eq!(sent.group_id, "g");
        assert_eq!(sent.topics[0].partitions[0].leader_epoch, 3);
        assert_eq!(sent.topics[0].partitions[0].delivery_complete_count, -1);
    }

    #[test]
    fn calls_travel_as_one_share_partition_rpcs_and_back() {
        use crate::server::share_state::{write_calls, write_calls_answers, write_response};
        let r = request();
        let WireRequest::Write(wire) = wire_request(&r) else {
            panic!("a write travels as WriteShareGroupState");
        };
        let calls = write_calls(&wire);
        assert_eq!(calls.len(), 1);
        let Ok(call) = &calls[0] else {
            panic!("a valid write")
        };
        assert_eq!(call.request, r);
        let answered = write_response(vec![(
            call.topic_id,
            call.partition,
            Response::Write {
                error: ErrorCode::FENCED_STATE_EPOCH,
            },
        )]);
        assert_eq!(
            write_calls_answers(&answered),
            vec![Response::Write {
                error: ErrorCode::FENCED_STATE_EPOCH
            }]
        );
    }
}
