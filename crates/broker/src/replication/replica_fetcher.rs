//! Follower fetchers: the replicas this broker follows pull from their leaders (Kafka's
//! `ReplicaFetcherThread`).
//!
//! # Design note
//!
//! 1. One task per leader broker, with one connection and one outstanding request at a
//!    time, batched over every partition this broker follows from that leader (the seeds'
//!    "followers pull, one outstanding fetch at a time").
//! 2. A partition that becomes a follower (or gets a new leader epoch) first truncates:
//!    the fetcher asks the leader for the end offset of the follower's latest epoch
//!    (OffsetForLeaderEpoch, KIP-101/KIP-279) and truncates to the lesser of that and what
//!    it holds itself for the epoch the leader answered with. Never by high watermark
//!    alone: that could drop records the new leader committed, or keep ones it never had.
//! 3. Then it fetches from its log end offset with its replica id and the leader epoch it
//!    knows; the leader answers from its log end (not the high watermark), records the
//!    fetch offset as the follower's progress, and sends its high watermark, which the
//!    follower adopts up to its own log end.
//! 4. FENCED_LEADER_EPOCH / NOT_LEADER_OR_FOLLOWER / UNKNOWN_LEADER_EPOCH /
//!    UNKNOWN_TOPIC_OR_PARTITION mean the two brokers disagree on the metadata, usually
//!    because one applied the latest records a moment before the other: the partition
//!    backs off briefly and tries again (new metadata replaces its state meanwhile).
//!    Never a permanent stop: a leader that is only behind would otherwise lose its
//!    followers for good. Connection failures back off and redial; the partition keeps
//!    its place.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use rill_protocol::frame::decode_frame;
use rill_protocol::generated::fetch_request::{FetchPartition, FetchRequest};
use rill_protocol::generated::fetch_response::FetchResponse;
use rill_protocol::generated::offset_for_leader_epoch_request::{
    OffsetForLeaderEpochRequest, OffsetForLeaderPartition, OffsetForLeaderTopic,
};
use rill_protocol::generated::offset_for_leader_epoch_response::OffsetForLeaderEpochResponse;
use rill_protocol::generated::{RequestHeader, ResponseHeader};
use rill_protocol::{encode_request_frame, ApiKey, Decodable, ErrorCode, Request, Uuid};
use rill_storage::TopicPartition;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Notify;

use crate::metrics;
use crate::network::inter_broker::{InterBrokerConnector, InterBrokerStream, PeerEndpoint};
use crate::rate::{QuotaWindows, Rate};
use crate::replication::fetch_session_handler::FetchSessionHandler;
use crate::replication::replica_manager::{RemoteTierLookup, ReplicaManager};

/// Fetch v12: topic names (the follower may not know ids before its image does), leader
/// epochs, and the replica id in the body.
const FETCH_VERSION: i16 = 12;
const OFFSET_FOR_LEADER_EPOCH_VERSION: i16 = 4;
/// The largest response a fetcher reads (replica.fetch.response.max.bytes's default).
const MAX_RESPONSE_BYTES: usize = 10 << 20;
const RETRY_BACKOFF: Duration = Duration::from_millis(200);

/// Settings of the fetchers, from `replica.*` broker configs.
#[derive(Debug, Clone)]
pub struct FetcherConfig {
    pub local_id: i32,
    pub max_wait: Duration,
    pub partition_max_bytes: i32,
    /// Shared by every fetcher of this broker.
    pub throttle: Arc<FollowerThrottle>,
    /// How fetchers dial leaders on the inter-broker listener (TLS, SASL).
    pub connector: Arc<InterBrokerConnector>,
}

/// Whether a topic's `*.replication.throttled.replicas` value (`*`, or
/// `partition:broker` pairs) names this partition's replica on `broker`.
pub fn replica_throttled(value: &str, partition: i32, broker: i32) -> bool {
    let value = value.trim();
    if value.is_empty() {
        return false;
    }
    value == "*"
        || value.split(',').any(|pair| {
            pair.trim().split_once(':').is_some_and(|(p, b)| {
                p.trim().parse() == Ok(partition) && b.trim().parse() == Ok(broker)
            })
        })
}

/// What the follower side of the replication throttle limits: `follower.replication.
/// throttled.rate` (`None`: no limit) and each topic's `follower.replication.throttled.
/// replicas`, as the metadata publisher last set them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ThrottleSettings {
    pub limit: Option<f64>,
    pub replicas: HashMap<String, String>,
}

/// The follower side of Kafka's replication quotas (`ReplicationQuotaManager` on the
/// follower): while the bytes fetched for throttled replicas are over the rate, a
/// throttled replica that is not in the ISR is left out of the fetch. Replicas in the ISR
/// are never throttled, as in Kafka: the throttle is for replicas catching up
/// (reassignment, a broker back from an outage), not for the write path.
#[derive(Debug)]
pub struct FollowerThrottle {
    settings: std::sync::RwLock<ThrottleSettings>,
    fetched: Mutex<Rate>,
    windows: QuotaWindows,
    epoch: std::time::Instant,
}

impl Default for FollowerThrottle {
    fn default() -> Self {
        Self::new(QuotaWindows::default())
    }
}

impl FollowerThrottle {
    pub fn new(windows: QuotaWindows) -> Self {
        Self {
            settings: std::sync::RwLock::new(ThrottleSettings::default()),
            fetched: Mutex::new(Rate::default()),
            windows,
            epoch: std::time::Instant::now(),
        }
    }

    pub fn set(&self, settings: ThrottleSettings) {
        let mut current = self.settings.write().unwrap_or_else(|e| e.into_inner());
        if *current != settings {
            *current = settings;
        }
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Whether `tp`'s replica on `broker` is throttled, and whether the rate is over now.
    fn throttled(&self, tp: &TopicPartition, broker: i32) -> (bool, bool) {
        let settings = self.settings.read().unwrap_or_else(|e| e.into_inner());
        let Some(limit) = settings.limit else {
            return (false, false);
        };
        let named = settings
            .replicas
            .get(&tp.topic)
            .is_some_and(|v| replica_throttled(v, tp.partition, broker));
        if !named {
            return (false, false);
        }
        let mut fetched = self.fetched.lock().unwrap_or_else(|e| e.into_inner());
        let (observed, _) = fetched.measure(self.now_ms(), self.windows);
        (true, observed > limit)
    }

    fn record(&self, bytes: usize) {
        if bytes == 0 {
            return;
        }
        let now_ms = self.now_ms();
        let mut fetched = self.fetched.lock().unwrap_or_else(|e| e.into_inner());
        fetched.record(bytes as f64, now_ms, self.windows);
    }
}

/// One followed partition as its fetcher sees it.
#[derive(Debug, Clone)]
struct FetchState {
    topic_id: Uuid,
    leader_epoch: i32,
    /// Epoch validation (truncation) is due before the next fetch.
    needs_truncation: bool,
    /// The leader refused the partition: leave it alone until then (Kafka's
    /// `replica.fetch.backoff.ms`), or until new metadata replaces this state.
    delayed_until: Option<tokio::time::Instant>,
    /// Refusals in a row that meant the two brokers' metadata differ (see
    /// [`backoff`]); 0 again once the leader answers the partition.
    lag_refusals: u32,
    /// Tiered storage: since when this follower, behind the leader's local log start,
    /// waits for the remote tier's copy below it to be known here (see
    /// [`REMOTE_TIER_WAIT`]).
    remote_tier_wait_since: Option<tokio::time::Instant>,
}

/// How long a follower behind a tiered leader's local log start waits for the copy that
/// ends below it to appear in its metadata image (the leader deletes local segments only
/// once they are copied, so the copy is there but may not be applied here yet) before it
/// starts its log without the leader's epochs and producer state: a log start that
/// DeleteRecords moved past every copy has none to wait for.
const REMOTE_TIER_WAIT: Duration = Duration::from_secs(30);

struct Fetcher {
    addr: Mutex<PeerEndpoint>,
    partitions: Mutex<BTreeMap<TopicPartition, FetchState>>,
    changed: Notify,
    stopped: std::sync::atomic::AtomicBool,
    /// The authorization error last logged at WARN for this leader (see `note_refusal`).
    refusal_logged: Mutex<Option<ErrorCode>>,
}

impl Fetcher {
    fn partitions(&self) -> std::sync::MutexGuard<'_, BTreeMap<TopicPartition, FetchState>> {
        self.partitions.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The fetchers of this broker, one per leader it follows.
pub struct ReplicaFetcherManager {
    config: FetcherConfig,
    fetchers: Mutex<HashMap<i32, Arc<Fetcher>>>,
}

impl ReplicaFetcherManager {
    pub fn new(config: FetcherConfig) -> Self {
        Self {
            config,
            fetchers: Mutex::new(HashMap::new()),
        }
    }

    pub fn follower_throttle(&self) -> &FollowerThrottle {
        &self.config.throttle
    }

    fn fetchers(&self) -> std::sync::MutexGuard<'_, HashMap<i32, Arc<Fetcher>>> {
        self.fetchers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Follows `tp` from `leader` at `addr` in `leader_epoch`, truncating first.
    pub fn add_partition(
        &self,
        replicas: &Arc<ReplicaManager>,
        leader: i32,
        addr: PeerEndpoint,
        tp: &TopicPartition,
        topic_id: Uuid,
        leader_epoch: i32,
    ) {
        if let Some(f) = self.fetchers().get(&leader) {
            let same = f
                .partitions()
                .get(tp)
                .is_some_and(|s| s.leader_epoch == leader_epoch && s.topic_id == topic_id);
            if same {
                // Only the ISR changed: keep fetching where we are.
                return;
            }
        }
        self.remove_partition(tp);
        let mut fetchers = self.fetchers();
        let fetcher = fetchers
            .entry(leader)
            .or_insert_with(|| {
                let f = Arc::new(Fetcher {
                    addr: Mutex::new(addr.clone()),
                    partitions: Mutex::new(BTreeMap::new()),
                    changed: Notify::new(),
                    stopped: std::sync::atomic::AtomicBool::new(false),
                    refusal_logged: Mutex::new(None),
                });
                start(
                    run(
                        f.clone(),
                        Arc::downgrade(replicas),
                        self.config.clone(),
                        leader,
                        tokio::runtime::Handle::current(),
                    ),
                    leader,
                );
                f
            })
            .clone();
        *fetcher.addr.lock().unwrap_or_else(|e| e.into_inner()) = addr;
        fetcher.partitions().insert(
            tp.clone(),
            FetchState {
                topic_id,
                leader_epoch,
                needs_truncation: true,
                delayed_until: None,
                lag_refusals: 0,
                remote_tier_wait_since: None,
            },
        );
        fetcher.changed.notify_one();
    }

    /// Stops following `tp` (it became leader, or moved away).
    pub fn remove_partition(&self, tp: &TopicPartition) {
        let mut fetchers = self.fetchers();
        let mut idle = Vec::new();
        for (leader, f) in fetchers.iter() {
            let mut parts = f.partitions();
            if parts.remove(tp).is_some() && parts.is_empty() {
                idle.push(*leader);
            }
        }
        for leader in idle {
            if let Some(f) = fetchers.remove(&leader) {
                f.stopped.store(true, std::sync::atomic::Ordering::Release);
                f.changed.notify_one();
            }
        }
    }

    /// Stops every fetcher.
    pub fn shutdown(&self) {
        for (_, f) in self.fetchers().drain() {
            f.stopped.store(true, std::sync::atomic::Ordering::Release);
            f.changed.notify_one();
        }
    }
}

/// Runs one leader's fetcher on a thread of its own (`rill-fetcher-<leader>`), a
/// single-threaded runtime, as Kafka runs each `ReplicaFetcherThread`; on the runtime's
/// workers if that thread cannot start.
///
/// On the work-stealing runtime, every response the fetcher waited for woke a worker that
/// then unparked a second one to steal from it, for one task that never has anything to
/// share: that was a tenth of a follower's CPU on one-record acks=all requests
/// (BENCHMARKS.md, #25). The thread ends when `run` returns (the fetcher stopped, or its
/// replica manager is gone).
fn start<F>(task: F, leader: i32)
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            tracing::warn!(leader, error = %e, "cannot start the replica fetcher's runtime; fetching on the broker's workers");
            tokio::spawn(task);
            return;
        }
    };
    // The thread takes the task from here; a thread that never started leaves it.
    let slot = Arc::new(Mutex::new(Some(task)));
    let theirs = slot.clone();
    let spawned = std::thread::Builder::new()
        .name(format!("rill-fetcher-{leader}"))
        .spawn(move || {
            let task = theirs.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(task) = task {
                runtime.block_on(task);
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(leader, error = %e, "cannot start the replica fetcher's thread; fetching on the broker's workers");
        if let Some(task) = slot.lock().unwrap_or_else(|e| e.into_inner()).take() {
            tokio::spawn(task);
        }
    }
}

/// One connection to a leader.
struct LeaderConnection {
    stream: InterBrokerStream,
    correlation_id: i32,
    client_id: String,
    buf: BytesMut,
    /// The connection's incremental fetch session with the leader (KIP-227).
    session: FetchSessionHandler,
}

impl LeaderConnection {
    async fn connect(
        connector: &InterBrokerConnector,
        leader: &PeerEndpoint,
        local_id: i32,
    ) -> std::io::Result<Self> {
        let client_id = format!("rill-replica-fetcher-{local_id}");
        let stream = connector.connect(leader, &client_id).await?;
        Ok(Self {
            stream,
            correlation_id: 0,
            client_id,
            buf: BytesMut::with_capacity(64 * 1024),
            session: FetchSessionHandler::default(),
        })
    }

    async fn send<R: Request>(
        &mut self,
        request: &R,
        version: i16,
        timeout: Duration,
    ) -> std::io::Result<R::Response> {
        let io_err = |e: String| std::io::Error::new(std::io::ErrorKind::InvalidData, e);
        let api = ApiKey::from_i16(R::API_KEY).ok_or_else(|| io_err("unknown api".into()))?;
        self.correlation_id = self.correlation_id.wrapping_add(1);
        let header = RequestHeader {
            request_api_key: R::API_KEY,
            request_api_version: version,
            correlation_id: self.correlation_id,
            client_id: Some(self.client_id.clone()),
            ..Default::default()
        };
        let mut frame = BytesMut::new();
        encode_request_frame(&mut frame, &header, request).map_err(|e| io_err(e.to_string()))?;
        let exchange = async {
            self.stream.write_all(&frame).await?;
            // TLS may hold the last record until flushed.
            self.stream.flush().await?;
            loop {
                match decode_frame(&mut self.buf, MAX_RESPONSE_BYTES) {
                    Ok(Some(frame)) => return Ok(frame.freeze()),
                    Ok(None) => {}
                    Err(e) => return Err(io_err(e.to_string())),
                }
                if self.stream.read_buf(&mut self.buf).await? == 0 {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        "leader closed the connection",
                    ));
                }
            }
        };
        let mut bytes: Bytes = tokio::time::timeout(timeout, exchange)
            .await
            .map_err(|_| {
                std::io::Error::new(std::io::ErrorKind::TimedOut, "request timed out")
            })??;
        let header = ResponseHeader::decode(&mut bytes, api.response_header_version(version))
            .map_err(|e| io_err(e.to_string()))?;
        if header.correlation_id != self.correlation_id {
            return Err(io_err("correlation id mismatch".into()));
        }
        R::Response::decode(&mut bytes, version).map_err(|e| io_err(e.to_string()))
    }
}

async fn run(
    fetcher: Arc<Fetcher>,
    replicas: Weak<ReplicaManager>,
    config: FetcherConfig,
    leader: i32,
    broker_runtime: tokio::runtime::Handle,
) {
    let mut conn: Option<LeaderConnection> = None;
    // The last connection failure logged at WARN: a leader that stays unreachable, or
    // refuses our login, is reported once per distinct reason, not every backoff.
    let mut last_warning: Option<String> = None;
    let request_timeout = config.max_wait + Duration::from_secs(10);
    loop {
        if fetcher.stopped.load(std::sync::atomic::Ordering::Acquire) {
            return;
        }
        let Some(replicas) = replicas.upgrade() else {
            return;
        };
        let now = tokio::time::Instant::now();
        let snapshot: Vec<(TopicPartition, FetchState)> = fetcher
            .partitions()
            .iter()
            .filter(|(_, s)| s.delayed_until.is_none_or(|t| t <= now))
            .map(|(tp, s)| (tp.clone(), s.clone()))
            .collect();
        if snapshot.is_empty() {
            drop(replicas);
            // Until the first refused partition is due again (or the partitions change).
            let due = fetcher
                .partitions()
                .values()
                .filter_map(|s| s.delayed_until)
                .min()
                .unwrap_or(now + RETRY_BACKOFF);
            tokio::select! {
                _ = fetcher.changed.notified() => {}
                _ = tokio::time::sleep_until(due) => {}
            }
            continue;
        }
        let c = match conn.as_mut() {
            Some(c) => c,
            None => {
                let addr = fetcher
                    .addr
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone();
                match LeaderConnection::connect(&config.connector, &addr, config.local_id).await {
                    Ok(c) => {
                        if last_warning.take().is_some() {
                            tracing::info!(leader, %addr, "connected to the leader again");
                        }
                        conn.insert(c)
                    }
                    Err(e) => {
                        metrics::inc(&metrics::global().replication.fetcher_connect_failures);
                        let reason = e.to_string();
                        if last_warning.as_deref() != Some(reason.as_str()) {
                            tracing::warn!(
                                leader,
                                %addr,
                                listener = config.connector.listener(),
                                error = %e,
                                "cannot connect to the leader to replicate; retrying"
                            );
                            last_warning = Some(reason);
                        } else {
                            tracing::debug!(leader, %addr, error = %e, "cannot reach leader");
                        }
                        drop(replicas);
                        tokio::time::sleep(RETRY_BACKOFF).await;
                        continue;
                    }
                }
            }
        };
        let truncate: Vec<_> = snapshot
            .iter()
            .filter(|(_, s)| s.needs_truncation)
            .collect();
        let result = if truncate.is_empty() {
            fetch_once(
                c,
                &fetcher,
                &replicas,
                &broker_runtime,
                &config,
                &snapshot,
                request_timeout,
            )
            .await
        } else {
            truncate_once(c, &fetcher, &replicas, &config, &truncate, request_timeout).await
        };
        drop(replicas);
        if let Err(e) = result {
            metrics::inc(&metrics::global().replication.fetcher_request_failures);
            tracing::debug!(leader, error = %e, "replica fetch failed; reconnecting");
            conn = None;
            tokio::time::sleep(RETRY_BACKOFF).await;
        }
    }
}

/// Updates a partition (delays it, or marks its truncation done) if its fetcher still follows it in the
/// same epoch.
fn update_state(
    fetcher: &Fetcher,
    tp: &TopicPartition,
    epoch: i32,
    f: impl FnOnce(&mut FetchState),
) {
    if let Some(s) = fetcher.partitions().get_mut(tp) {
        if s.leader_epoch == epoch {
            f(s);
        }
    }
}

async fn truncate_once(
    conn: &mut LeaderConnection,
    fetcher: &Fetcher,
    replicas: &ReplicaManager,
    config: &FetcherConfig,
    partitions: &[&(TopicPartition, FetchState)],
    timeout: Duration,
) -> std::io::Result<()> {
    let mut topics: BTreeMap<String, Vec<OffsetForLeaderPartition>> = BTreeMap::new();
    let mut asked: HashMap<TopicPartition, (i32, i32)> = HashMap::new();
    for (tp, state) in partitions {
        let Some(latest) = replicas.follower_latest_epoch(tp) else {
            continue;
        };
        match latest {
            // An empty epoch cache: nothing to validate, fetch from the log end.
            None => update_state(fetcher, tp, state.leader_epoch, |s| {
                s.needs_truncation = false
            }),
            Some(epoch) => {
                asked.insert(tp.clone(), (epoch, state.leader_epoch));
                topics
                    .entry(tp.topic.clone())
                    .or_default()
                    .push(OffsetForLeaderPartition {
                        partition: tp.partition,
                        current_leader_epoch: state.leader_epoch,
                        leader_epoch: epoch,
                        ..Default::default()
                    });
            }
        }
    }
    if topics.is_empty() {
        return Ok(());
    }
    let request = OffsetForLeaderEpochRequest {
        replica_id: config.local_id,
        topics: topics
            .into_iter()
            .map(|(topic, partitions)| OffsetForLeaderTopic {
                topic,
                partitions,
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
    metrics::inc(&metrics::global().replication.fetcher_requests);
    let response: OffsetForLeaderEpochResponse = conn
        .send(&request, OFFSET_FOR_LEADER_EPOCH_VERSION, timeout)
        .await?;
    for topic in response.topics {
        for p in topic.partitions {
            let tp = TopicPartition {
                topic: topic.topic.clone(),
                partition: p.partition,
            };
            let Some((asked_epoch, leader_epoch)) = asked.get(&tp).copied() else {
                continue;
            };
            let code = ErrorCode(p.error_code);
            if code != ErrorCode::NONE {
                metrics::global()
                    .replication
                    .fetcher_partition_error(code.0);
                note_refusal(fetcher, &tp, code, "epoch validation");
                update_state(fetcher, &tp, leader_epoch, |s| s.refused(code));
                continue;
            }
            match replicas.truncate_to_leader_epoch(
                &tp,
                leader_epoch,
                asked_epoch,
                p.leader_epoch,
                p.end_offset,
            ) {
                Ok(()) => update_state(fetcher, &tp, leader_epoch, |s| {
                    s.needs_truncation = false;
                    s.lag_refusals = 0;
                }),
                Err(e) => tracing::debug!(%tp, error = %e, "truncation skipped"),
            }
        }
    }
    Ok(())
}

/// Logs a partition error from the leader. An authorization error means this broker's
/// principal lacks CLUSTER_ACTION there, which no retry mends: the operator is told at
/// WARN, once per leader and error, and the partition keeps retrying (the grant may come).
fn note_refusal(fetcher: &Fetcher, tp: &TopicPartition, code: ErrorCode, what: &str) {
    let authorization = code == ErrorCode::TOPIC_AUTHORIZATION_FAILED
        || code == ErrorCode::CLUSTER_AUTHORIZATION_FAILED;
    if authorization {
        let mut logged = fetcher
            .refusal_logged
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if *logged != Some(code) {
            *logged = Some(code);
            tracing::warn!(
                %tp,
                error = code.name(),
                "the leader refuses this broker's {what}: its principal on the inter-broker \
                 listener needs CLUSTER_ACTION on the cluster (super.users or an ACL); retrying"
            );
            return;
        }
    }
    tracing::debug!(%tp, error = code.name(), "{what} refused");
}

impl FetchState {
    /// The leader refused the partition with `code`: wait before asking again.
    fn refused(&mut self, code: ErrorCode) {
        if metadata_lag(code) {
            self.lag_refusals = self.lag_refusals.saturating_add(1);
        }
        self.delayed_until = Some(tokio::time::Instant::now() + backoff(code, self.lag_refusals));
    }
}

/// Whether a refusal means the two brokers' metadata differ: one of them has not applied
/// the latest records yet.
fn metadata_lag(code: ErrorCode) -> bool {
    code == ErrorCode::FENCED_LEADER_EPOCH
        || code == ErrorCode::NOT_LEADER_OR_FOLLOWER
        || code == ErrorCode::UNKNOWN_TOPIC_OR_PARTITION
        || code == ErrorCode::UNKNOWN_LEADER_EPOCH
}

/// How long a refused partition waits before it is asked for again. A metadata lag
/// usually clears within milliseconds, either by new metadata here, which replaces the
/// state, or there: the wait starts at [`FIRST_LAG_BACKOFF`] and doubles with each
/// refusal in a row up to [`RETRY_BACKOFF`]. A flat 200 ms held every acks=all produce
/// to a new topic, or to a partition that just changed leader, for that long while its
/// leader applied the record its follower had already seen (issue #25's stall). Other
/// errors wait Kafka's `replica.fetch.backoff.ms` (1 s).
fn backoff(code: ErrorCode, lag_refusals: u32) -> Duration {
    if metadata_lag(code) {
        let doublings = lag_refusals.saturating_sub(1).min(8);
        (FIRST_LAG_BACKOFF * (1u32 << doublings)).min(RETRY_BACKOFF)
    } else {
        Duration::from_secs(1)
    }
}

/// The first wait after a metadata-lag refusal (see [`backoff`]).
const FIRST_LAG_BACKOFF: Duration = Duration::from_millis(5);

async fn fetch_once(
    conn: &mut LeaderConnection,
    fetcher: &Fetcher,
    replicas: &Arc<ReplicaManager>,
    broker_runtime: &tokio::runtime::Handle,
    config: &FetcherConfig,
    partitions: &[(TopicPartition, FetchState)],
    timeout: Duration,
) -> std::io::Result<()> {
    let mut wanted: Vec<(TopicPartition, FetchPartition)> = Vec::with_capacity(partitions.len());
    let mut epochs: HashMap<TopicPartition, i32> = HashMap::new();
    let mut throttled = std::collections::HashSet::new();
    let refused_before: std::collections::HashSet<&TopicPartition> = partitions
        .iter()
        .filter(|(_, s)| s.lag_refusals > 0)
        .map(|(tp, _)| tp)
        .collect();
    for (tp, state) in partitions {
        let (named, over) = config.throttle.throttled(tp, config.local_id);
        if named && !replicas.in_sync(tp) {
            if over {
                continue;
            }
            throttled.insert(tp.clone());
        }
        let Some((log_end, log_start)) = replicas.follower_fetch_position(tp) else {
            continue;
        };
        epochs.insert(tp.clone(), state.leader_epoch);
        wanted.push((
            tp.clone(),
            FetchPartition {
                partition: tp.partition,
                current_leader_epoch: state.leader_epoch,
                fetch_offset: log_end,
                last_fetched_epoch: -1,
                log_start_offset: log_start,
                partition_max_bytes: config.partition_max_bytes,
                ..Default::default()
            },
        ));
    }
    if wanted.is_empty() {
        tokio::time::sleep(RETRY_BACKOFF).await;
        return Ok(());
    }
    // Grouped by topic, in name order, as before sessions: the order a full fetch names
    // them in is the order the leader's session reads them in.
    wanted.sort_by(|(a, _), (b, _)| a.cmp(b));
    let mut sent = conn.session.build(wanted);
    let request = FetchRequest {
        replica_id: config.local_id,
        max_wait_ms: i32::try_from(config.max_wait.as_millis()).unwrap_or(500),
        min_bytes: 1,
        max_bytes: i32::try_from(MAX_RESPONSE_BYTES).unwrap_or(i32::MAX) - 1024,
        isolation_level: 0,
        session_id: sent.session_id,
        session_epoch: sent.session_epoch,
        topics: std::mem::take(&mut sent.topics),
        forgotten_topics_data: std::mem::take(&mut sent.forgotten),
        ..Default::default()
    };
    metrics::inc(&metrics::global().replication.fetcher_requests);
    let response: FetchResponse = conn.send(&request, FETCH_VERSION, timeout).await?;
    if !conn.session.answered(&sent, &response) {
        tracing::debug!(
            error = ErrorCode(response.error_code).name(),
            session = sent.session_id,
            epoch = sent.session_epoch,
            "fetch session refused or closed; the next fetch is full"
        );
        if sent.full {
            // A full fetch refused as a whole: not a session that went stale, so the
            // next one waits rather than follow at once.
            tokio::time::sleep(RETRY_BACKOFF).await;
        }
        return Ok(());
    }
    let mut throttled_bytes = 0usize;
    for topic in response.responses {
        for p in topic.partitions {
            let tp = TopicPartition {
                topic: topic.topic.clone(),
                partition: p.partition_index,
            };
            let Some(epoch) = epochs.get(&tp).copied() else {
                continue;
            };
            let code = ErrorCode(p.error_code);
            if code != ErrorCode::NONE {
                metrics::global()
                    .replication
                    .fetcher_partition_error(code.0);
            }
            if code == ErrorCode::NONE {
                if refused_before.contains(&tp) {
                    update_state(fetcher, &tp, epoch, |s| s.lag_refusals = 0);
                }
                let records = p.records.unwrap_or_default();
                if throttled.contains(&tp) {
                    throttled_bytes += records.len();
                }
                if let Err(code) = replicas.append_as_follower(
                    &tp,
                    epoch,
                    records,
                    p.high_watermark,
                    p.log_start_offset,
                ) {
                    metrics::inc(&metrics::global().replication.fetcher_append_failures);
                    tracing::warn!(%tp, error = code.name(), "appending fetched records failed");
                    update_state(fetcher, &tp, epoch, |s| s.needs_truncation = true);
                }
            } else if code == ErrorCode::OFFSET_OUT_OF_RANGE {
                // Tiered: what is below the leader's local log start is in the remote
                // tier; start there with the leader's epochs and producer state.
                // On the broker's runtime: the remote tier's client keeps its connections
                // there, and this thread's runtime is not the one they belong to.
                let lookup = {
                    let (replicas, tp, start) = (replicas.clone(), tp.clone(), p.log_start_offset);
                    broker_runtime
                        .spawn(async move { replicas.remote_tier_state(&tp, start).await })
                };
                let aux = match lookup.await.unwrap_or(RemoteTierLookup::NotYet) {
                    RemoteTierLookup::Found(aux) => Some(aux),
                    RemoteTierLookup::NotTiered => None,
                    RemoteTierLookup::NotYet => {
                        let now = tokio::time::Instant::now();
                        let since = fetcher
                            .partitions()
                            .get(&tp)
                            .and_then(|s| s.remote_tier_wait_since)
                            .unwrap_or(now);
                        if now.duration_since(since) < REMOTE_TIER_WAIT {
                            update_state(fetcher, &tp, epoch, |s| {
                                s.remote_tier_wait_since = Some(since);
                                s.delayed_until = Some(now + RETRY_BACKOFF);
                            });
                            continue;
                        }
                        tracing::warn!(%tp, start = p.log_start_offset, "the remote tier's copy below the leader's log start is not known here; starting without the leader's epochs and producer state");
                        None
                    }
                };
                update_state(fetcher, &tp, epoch, |s| s.remote_tier_wait_since = None);
                match replicas.handle_out_of_range(&tp, p.log_start_offset, aux) {
                    Ok(true) => {}
                    // Our log end lies above the leader's: validate the epoch again.
                    _ => update_state(fetcher, &tp, epoch, |s| s.needs_truncation = true),
                }
            } else {
                note_refusal(fetcher, &tp, code, "replica fetch");
                update_state(fetcher, &tp, epoch, |s| s.refused(code));
            }
        }
    }
    config.throttle.record(throttled_bytes);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_lag_refusals_back_off_from_milliseconds_and_others_wait_a_second() {
        let lag = ErrorCode::NOT_LEADER_OR_FOLLOWER;
        let waits: Vec<u128> = (1..=8).map(|n| backoff(lag, n).as_millis()).collect();
        assert_eq!(waits, [5, 10, 20, 40, 80, 160, 200, 200]);
        assert_eq!(
            backoff(ErrorCode::UNKNOWN_TOPIC_OR_PARTITION, 1).as_millis(),
            5
        );
        assert_eq!(
            backoff(ErrorCode::KAFKA_STORAGE_ERROR, 0),
            Duration::from_secs(1)
        );
        let mut state = FetchState {
            topic_id: Uuid::ZERO,
            leader_epoch: 0,
            needs_truncation: false,
            delayed_until: None,
            lag_refusals: 0,
            remote_tier_wait_since: None,
        };
        state.refused(ErrorCode::FENCED_LEADER_EPOCH);
        state.refused(ErrorCode::FENCED_LEADER_EPOCH);
        assert_eq!(state.lag_refusals, 2);
        state.refused(ErrorCode::TOPIC_AUTHORIZATION_FAILED);
        assert_eq!(state.lag_refusals, 2, "only metadata lags count");
    }

    #[test]
    fn throttled_replicas_are_named_by_partition_and_broker_or_star() {
        assert!(replica_throttled("*", 3, 2));
        assert!(replica_throttled(" 0:1, 3:2 ", 3, 2));
        assert!(!replica_throttled("0:1,3:2", 3, 1));
        assert!(!replica_throttled("", 0, 1));
        assert!(!replica_throttled("x:y", 0, 1));
    }

    #[test]
    fn a_follower_throttle_holds_named_replicas_once_over_its_rate() {
        let throttle = FollowerThrottle::new(QuotaWindows {
            samples: 2,
            window: Duration::from_secs(1),
        });
        let tp = TopicPartition {
            topic: "t".into(),
            partition: 0,
        };
        assert_eq!(throttle.throttled(&tp, 1), (false, false));
        throttle.set(ThrottleSettings {
            limit: Some(1000.0),
            replicas: HashMap::from([("t".to_string(), "0:1".to_string())]),
        });
        assert_eq!(throttle.throttled(&tp, 1), (true, false));
        assert_eq!(throttle.throttled(&tp, 2), (false, false));
        // A fresh rate spans one window: 1,001 bytes are over 1,000 a second.
        throttle.record(1001);
        assert_eq!(throttle.throttled(&tp, 1), (true, true));
    }

    #[tokio::test]
    async fn a_fetcher_runs_alone_on_a_single_threaded_runtime_of_its_own() {
        let (tx, rx) = tokio::sync::oneshot::channel();
        start(
            async move {
                let flavor = tokio::runtime::Handle::current().runtime_flavor();
                let name = std::thread::current().name().map(str::to_owned);
                let _ = tx.send((name, flavor));
            },
            7,
        );
        let (name, flavor) = rx.await.unwrap();
        assert_eq!(name.as_deref(), Some("rill-fetcher-7"));
        assert_eq!(flavor, tokio::runtime::RuntimeFlavor::CurrentThread);
        assert_ne!(
            std::thread::current().name(),
            Some("rill-fetcher-7"),
            "not the caller's thread"
        );
    }
}
