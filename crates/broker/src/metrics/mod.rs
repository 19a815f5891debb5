//! The broker's metrics as the work updates them: counters and histograms of plain
//! atomics, one registry per process (Kafka's Yammer `KafkaYammerMetrics.defaultRegistry`
//! is one per JVM too), read and encoded only when `/metrics` is scraped (`http/`).
//!
//! What is here is only what a hot path writes: bytes and messages per topic
//! ([`TopicMetrics`], held by each partition so that a produce or a fetch finds its
//! counters without a lookup), per-API request counts, errors and time histograms
//! ([`RequestMetrics`], an array indexed by api key), connections per listener, ISR
//! shrinks and expands, group rebalances. Gauges that are a view of state (partition
//! counts, consumer lag, group states, the process's RSS) are computed at scrape time
//! from the state itself and never stored here.
//!
//! No lock is taken on a produce or fetch path: every update is a `fetch_add` with
//! `Relaxed` ordering. The only locks are on the maps of topics and listeners, taken
//! when a partition is opened, a connection's listener is first seen, or a scrape reads.
//!
//! The names each value is served under, and the Kafka JMX metric each maps to, are in
//! METRICS.md at the root of the repository.

pub mod process;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// The process's metrics.
pub fn global() -> &'static BrokerMetrics {
    static METRICS: OnceLock<BrokerMetrics> = OnceLock::new();
    METRICS.get_or_init(BrokerMetrics::new)
}

/// Api keys below this get per-API metrics; Kafka 4.1's highest is 92. A request with a
/// higher key is counted under [`RequestMetrics::other`].
pub const API_KEYS: usize = 128;

/// Error codes from -1 up to this (exclusive) are counted one by one; higher ones fall
/// into the -1 (UNKNOWN_SERVER_ERROR) slot. Kafka 4.1's highest code is 133.
pub const ERROR_CODES: usize = 160;

/// Upper bounds of the latency histograms' buckets, in microseconds: from 0.1 ms (an
/// ApiVersions) to 30 s (a Fetch's `max.wait.ms` ceiling), about three per decade.
pub const LATENCY_BOUNDS_US: [u64; 18] = [
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000, 5_000_000, 10_000_000, 15_000_000, 30_000_000,
];

/// A latency histogram of atomics: one count per bucket (not cumulative; the encoder
/// sums them), a sum in microseconds and a count.
#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [AtomicU64; LATENCY_BOUNDS_US.len() + 1],
    sum_us: AtomicU64,
    count: AtomicU64,
}

/// A histogram as read at one instant.
#[derive(Debug, Clone, PartialEq)]
pub struct HistogramSnapshot {
    pub sum_seconds: f64,
    pub count: u64,
    /// (upper bound in seconds, count in that bucket alone); the last bound is
    /// `f64::MAX`, which the encoder writes as `+Inf`.
    pub buckets: Vec<(f64, u64)>,
}

impl Histogram {
    pub fn observe(&self, elapsed: Duration) {
        let us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        let bucket = LATENCY_BOUNDS_US
            .iter()
            .position(|b| us <= *b)
            .unwrap_or(LATENCY_BOUNDS_US.len());
        if let Some(b) = self.buckets.get(bucket) {
            b.fetch_add(1, Ordering::Relaxed);
        }
        self.sum_us.fetch_add(us, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// The values now. Read without a lock, so a scrape during an update may see a
    /// count one ahead of the buckets; the next scrape is consistent again.
    pub fn snapshot(&self) -> HistogramSnapshot {
        let buckets = self
            .buckets
            .iter()
            .enumerate()
            .map(|(i, b)| {
                let bound = LATENCY_BOUNDS_US
                    .get(i)
                    .map_or(f64::MAX, |us| *us as f64 / 1e6);
                (bound, b.load(Ordering::Relaxed))
            })
            .collect();
        HistogramSnapshot {
            sum_seconds: self.sum_us.load(Ordering::Relaxed) as f64 / 1e6,
            count: self.count.load(Ordering::Relaxed),
            buckets,
        }
    }
}

/// One API's request metrics, as Kafka's `RequestMetrics` splits a request's life:
/// waiting for an I/O slot (`queued.max.requests`), in the handler before it parks
/// (local), parked in a purgatory (remote: acks=all, a long-polling fetch), from the
/// handler's answer to the start of its write (response queue), writing the response
/// (send), and all of it (total). Rill has no response queue between threads: the
/// connection's task writes the response as soon as the handler returns it, so the
/// response-queue time is near zero except where a quota holds the response back.
#[derive(Debug, Default)]
pub struct ApiMetrics {
    pub requests: AtomicU64,
    pub request_queue: Histogram,
    pub local: Histogram,
    pub remote: Histogram,
    pub response_queue: Histogram,
    pub send: Histogram,
    pub total: Histogram,
    /// The quota throttle each response carried (`ThrottleTimeMs`; zero when none).
    pub throttle_time: Histogram,
}

/// Per-API metrics and errors by (API, error code).
#[derive(Debug)]
pub struct RequestMetrics {
    apis: Vec<ApiMetrics>,
    /// Requests whose api key is not below [`API_KEYS`].
    pub other: ApiMetrics,
    /// `API_KEYS × ERROR_CODES` counters: slot `api * ERROR_CODES + (code + 1)`.
    errors: Vec<AtomicU64>,
}

impl RequestMetrics {
    fn new() -> Self {
        Self {
            apis: (0..API_KEYS).map(|_| ApiMetrics::default()).collect(),
            other: ApiMetrics::default(),
            errors: (0..API_KEYS * ERROR_CODES)
                .map(|_| AtomicU64::new(0))
                .collect(),
        }
    }

    /// The metrics of one api key.
    pub fn api(&self, key: i16) -> &ApiMetrics {
        usize::try_from(key)
            .ok()
            .and_then(|k| self.apis.get(k))
            .unwrap_or(&self.other)
    }

    /// Counts one error code in a response of `api` (Kafka's `ErrorsPerSec`, which
    /// counts each partition's error of a Produce or Fetch). NONE is not counted.
    pub fn error(&self, api: i16, code: i16) {
        if code == 0 {
            return;
        }
        if let Some(slot) = error_slot(api, code).and_then(|s| self.errors.get(s)) {
            slot.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Every (api key, error code, count) with a count above zero.
    pub fn errors(&self) -> Vec<(i16, i16, u64)> {
        let mut out = Vec::new();
        for (slot, c) in self.errors.iter().enumerate() {
            let n = c.load(Ordering::Relaxed);
            if n > 0 {
                let api = (slot / ERROR_CODES) as i16;
                let code = (slot % ERROR_CODES) as i16 - 1;
                out.push((api, code, n));
            }
        }
        out
    }

    /// Each api key below [`API_KEYS`] that has served a request, with its metrics.
    pub fn served(&self) -> impl Iterator<Item = (i16, &ApiMetrics)> {
        self.apis
            .iter()
            .enumerate()
            .filter(|(_, m)| m.requests.load(Ordering::Relaxed) > 0)
            .map(|(k, m)| (k as i16, m))
    }
}

/// The counter slot of (api, code); codes out of range count as UNKNOWN_SERVER_ERROR.
fn error_slot(api: i16, code: i16) -> Option<usize> {
    let api = usize::try_from(api).ok().filter(|a| *a < API_KEYS)?;
    let code = usize::try_from(i32::from(code) + 1)
        .ok()
        .filter(|c| *c < ERROR_CODES)
        .unwrap_or(0);
    Some(api * ERROR_CODES + code)
}

/// Kafka's `BrokerTopicMetrics`, for one topic or for all of them.
#[derive(Debug, Default)]
pub struct TopicMetrics {
    /// Record-batch bytes appended by clients (BytesInPerSec).
    pub bytes_in: AtomicU64,
    /// Record bytes sent to consumers (BytesOutPerSec).
    pub bytes_out: AtomicU64,
    /// Record bytes sent to follower replicas (ReplicationBytesOutPerSec).
    pub replication_bytes_out: AtomicU64,
    /// Record bytes appended from the leader as a follower (ReplicationBytesInPerSec).
    pub replication_bytes_in: AtomicU64,
    /// Records appended by clients (MessagesInPerSec).
    pub messages_in: AtomicU64,
    /// Produce requests naming a partition of the topic, one per partition
    /// (TotalProduceRequestsPerSec).
    pub produce_requests: AtomicU64,
    pub fetch_requests: AtomicU64,
    pub failed_produce_requests: AtomicU64,
    pub failed_fetch_requests: AtomicU64,
}

/// The per-topic counters and the all-topics ones, which each update also adds to.
#[derive(Debug, Default)]
pub struct BrokerTopicStats {
    pub all: TopicMetrics,
    topics: Mutex<BTreeMap<String, Arc<TopicMetrics>>>,
}

/// Adds to a topic's counter and to the all-topics one.
#[derive(Debug, Clone)]
pub struct TopicHandle {
    topic: Arc<TopicMetrics>,
}

impl TopicHandle {
    /// Adds `n` to the field `f` picks, for this topic and for all topics.
    pub fn add(&self, f: fn(&TopicMetrics) -> &AtomicU64, n: u64) {
        f(&self.topic).fetch_add(n, Ordering::Relaxed);
        f(&global().topics.all).fetch_add(n, Ordering::Relaxed);
    }
}

impl BrokerTopicStats {
    /// The counters of `topic`, created on first use (when a partition of it is opened,
    /// not on a request's path).
    pub fn topic(&self, topic: &str) -> TopicHandle {
        let mut map = self.topics.lock().unwrap_or_else(|e| e.into_inner());
        let topic = map.entry(topic.to_string()).or_default().clone();
        TopicHandle { topic }
    }

    /// Forgets a deleted topic's counters (its series leave the page).
    pub fn remove(&self, topic: &str) {
        self.topics
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(topic);
    }

    /// Every topic with its counters, by name.
    pub fn topics(&self) -> Vec<(String, Arc<TopicMetrics>)> {
        self.topics
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }
}

/// Open connections per client listener (Kafka's `connection-count` of the socket
/// server's metrics).
#[derive(Debug, Default)]
pub struct ConnectionMetrics {
    listeners: Mutex<BTreeMap<String, Arc<AtomicI64>>>,
}

/// One open connection, counted until dropped.
#[derive(Debug)]
pub struct ConnectionGuard(Arc<AtomicI64>);

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl ConnectionMetrics {
    /// Counts a connection on `listener` until the guard is dropped.
    pub fn open(&self, listener: &str) -> ConnectionGuard {
        let gauge = self
            .listeners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(listener.to_string())
            .or_default()
            .clone();
        gauge.fetch_add(1, Ordering::Relaxed);
        ConnectionGuard(gauge)
    }

    /// Every listener that has had a connection, with how many are open.
    pub fn counts(&self) -> Vec<(String, i64)> {
        self.listeners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(k, v)| (k.clone(), v.load(Ordering::Relaxed)))
            .collect()
    }
}

/// The request byte pool of `queued.max.request.bytes` (Kafka's `MemoryPoolAvailable` and
/// `MemoryPoolUsed`): what the frames read and not yet handled hold; and the SASL
/// sessions that were renewed or ran out (KIP-368).
#[derive(Debug, Default)]
pub struct NetworkMetrics {
    pub memory_pool_capacity_bytes: AtomicI64,
    pub memory_pool_used_bytes: AtomicI64,
    /// Re-authentications that succeeded (`successful-reauthentication-total`).
    pub successful_reauthentications: AtomicU64,
    /// Connections closed because their session ended without a re-authentication
    /// (`expired-connections-killed-count`).
    pub expired_connections_killed: AtomicU64,
}

/// Counters of the replica manager (Kafka's `ReplicaManager` metrics) and of its
/// follower fetchers (`FetcherStats`, and their errors).
#[derive(Debug)]
pub struct ReplicationMetrics {
    /// ISR shrinks this broker (as leader) had the controller accept (IsrShrinksPerSec).
    pub isr_shrinks: AtomicU64,
    pub isr_expands: AtomicU64,
    /// Fetch and OffsetForLeaderEpoch requests the followers sent to leaders
    /// (FetcherStats RequestsPerSec, over every fetcher).
    pub fetcher_requests: AtomicU64,
    /// Dials to a leader that failed: unreachable, or the TLS or SASL login refused.
    pub fetcher_connect_failures: AtomicU64,
    /// Requests to a leader that failed as a whole: the connection broke, the answer
    /// timed out or could not be read (the fetcher dials again).
    pub fetcher_request_failures: AtomicU64,
    /// Partition errors in leaders' answers, by code (slot `code + 1`, as
    /// [`RequestMetrics`] counts them); OFFSET_OUT_OF_RANGE included, which the fetcher
    /// mends itself.
    fetcher_partition_errors: Vec<AtomicU64>,
    /// Fetched records the follower's log refused to append.
    pub fetcher_append_failures: AtomicU64,
}

impl Default for ReplicationMetrics {
    fn default() -> Self {
        Self {
            isr_shrinks: AtomicU64::new(0),
            isr_expands: AtomicU64::new(0),
            fetcher_requests: AtomicU64::new(0),
            fetcher_connect_failures: AtomicU64::new(0),
            fetcher_request_failures: AtomicU64::new(0),
            fetcher_partition_errors: (0..ERROR_CODES).map(|_| AtomicU64::new(0)).collect(),
            fetcher_append_failures: AtomicU64::new(0),
        }
    }
}

impl ReplicationMetrics {
    /// Counts a partition error a leader answered a follower's request with.
    pub fn fetcher_partition_error(&self, code: i16) {
        let slot = usize::try_from(i32::from(code) + 1)
            .ok()
            .filter(|c| *c < ERROR_CODES)
            .unwrap_or(0);
        if let Some(c) = self.fetcher_partition_errors.get(slot) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Every (error code, count) with a count above zero.
    pub fn fetcher_partition_errors(&self) -> Vec<(i16, u64)> {
        self.fetcher_partition_errors
            .iter()
            .enumerate()
            .filter_map(|(slot, c)| {
                let n = c.load(Ordering::Relaxed);
                (n > 0).then(|| (slot as i16 - 1, n))
            })
            .collect()
    }
}

/// Counters of the group coordinator.
#[derive(Debug, Default)]
pub struct GroupMetrics {
    /// Rebalances completed: a group entered a new generation
    /// (`classic-group-completed-rebalance-count`).
    pub completed_rebalances: AtomicU64,
}

/// How long produce requests waited for the fsync their `flush.messages`/`flush.ms`
/// asked for (Kafka's `LogFlushStats` `LogFlushRateAndTimeMs` times each log flush; here
/// a group commit's one fsync settles every append written before it began, so this
/// times what each request waited, its own fsync or one already under way).
#[derive(Debug, Default)]
pub struct FlushMetrics {
    pub produce_fsync_wait: Histogram,
    /// Each log flush: a group commit's fsync or a segment roll's (LogFlushRateAndTimeMs).
    pub log_flush: Histogram,
}

/// The log's flush observer (`rill_storage::flush::observe_log_flushes`).
pub fn log_flushed(elapsed: Duration) {
    global().flush.log_flush.observe(elapsed);
}

/// What retention (`retention.ms`, `retention.bytes`, and the log start offset that
/// DeleteRecords moved) deleted.
#[derive(Debug, Default)]
pub struct RetentionMetrics {
    pub deleted_segments: AtomicU64,
    pub deleted_bytes: AtomicU64,
}

/// What the remote tier did (tiered storage, `remote_log`; Kafka's `RemoteCopy*`,
/// `RemoteFetch*` and `RemoteDelete*` BrokerTopicMetrics, for all topics).
#[derive(Debug, Default)]
pub struct RemoteLogMetrics {
    /// Segments copied, their bytes, and copies that failed.
    pub copy_requests: AtomicU64,
    pub copy_bytes: AtomicU64,
    pub copy_errors: AtomicU64,
    /// Reads served from the remote tier, and their record bytes.
    pub fetch_requests: AtomicU64,
    pub fetch_bytes: AtomicU64,
    pub fetch_errors: AtomicU64,
    /// Segments remote retention deleted, and deletions that failed.
    pub deleted_segments: AtomicU64,
    pub delete_errors: AtomicU64,
    /// The read cache: reads that found their segment there or fetched it, the bytes
    /// fetched into it, and the bytes it holds.
    pub cache_hits: AtomicU64,
    pub cache_misses: AtomicU64,
    pub download_bytes: AtomicU64,
    pub cache_bytes: AtomicU64,
    /// Passes of a partition's task that failed (and back off).
    pub task_failures: AtomicU64,
}

/// What the log cleaner did (Kafka's `LogCleaner` and `LogCleanerManager` metrics).
#[derive(Debug, Default)]
pub struct CleanerMetrics {
    /// Cleans applied, and the bytes they read and wrote.
    pub cleans: AtomicU64,
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
    /// Records of aborted transactions and markers the cleans removed.
    pub aborted_records_removed: AtomicU64,
    pub markers_removed: AtomicU64,
    /// The last clean: how long its rewrite took, and the share of what it read that it
    /// wrote, in thousandths (`max-clean-time-secs`, `cleaner-recopy-percent`).
    pub last_clean_us: AtomicU64,
    pub last_recopy_permille: AtomicU64,
    /// When the cleaner last finished a round of cleans, in ms since the Unix epoch (0:
    /// never), for `time-since-last-run-ms`.
    pub last_run_end_ms: AtomicI64,
}

impl CleanerMetrics {
    /// Counts one clean applied.
    pub fn cleaned(&self, stats: &rill_storage::CleanStats, elapsed: Duration) {
        self.cleans.fetch_add(1, Ordering::Relaxed);
        self.bytes_read
            .fetch_add(stats.bytes_read, Ordering::Relaxed);
        self.bytes_written
            .fetch_add(stats.bytes_written, Ordering::Relaxed);
        self.aborted_records_removed
            .fetch_add(stats.aborted_removed, Ordering::Relaxed);
        self.markers_removed
            .fetch_add(stats.markers_removed, Ordering::Relaxed);
        self.last_clean_us.store(
            u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
        let permille = stats.bytes_written.saturating_mul(1000) / stats.bytes_read.max(1);
        self.last_recopy_permille.store(permille, Ordering::Relaxed);
    }
}

/// Every metric a hot path writes.
#[derive(Debug)]
pub struct BrokerMetrics {
    pub requests: RequestMetrics,
    pub topics: BrokerTopicStats,
    pub connections: ConnectionMetrics,
    pub network: NetworkMetrics,
    pub replication: ReplicationMetrics,
    pub groups: GroupMetrics,
    pub cleaner: CleanerMetrics,
    pub flush: FlushMetrics,
    pub retention: RetentionMetrics,
    pub remote_log: RemoteLogMetrics,
    pub controller: ControllerMetrics,
}

/// The controller event loop's figures (Kafka's `ControllerEventManager` and
/// `ControllerStats`), written by the loop through [`ControllerStatsSink`]; they move on
/// the node that is or was the active controller.
#[derive(Debug, Default)]
pub struct ControllerMetrics {
    /// Events' wait on the queue (EventQueueTimeMs).
    pub event_queue_time: Histogram,
    /// Events' decision and commit (EventQueueProcessingTimeMs).
    pub event_processing_time: Histogram,
    /// Times this node became the active controller (NewActiveControllersCount).
    pub new_active_controllers: AtomicU64,
    /// Partition leader elections committed (LeaderElectionRateAndTimeMs' count).
    pub leader_elections: AtomicU64,
    /// Of them, unclean ones (UncleanLeaderElectionsPerSec).
    pub unclean_leader_elections: AtomicU64,
}

/// The sink the metadata crate's controller loop writes to: the process's
/// [`ControllerMetrics`].
pub struct ControllerStatsSink;

impl rill_metadata::ControllerStats for ControllerStatsSink {
    fn event(&self, queued: Duration, processed: Duration) {
        let c = &global().controller;
        c.event_queue_time.observe(queued);
        c.event_processing_time.observe(processed);
    }

    fn activated(&self) {
        inc(&global().controller.new_active_controllers);
    }

    fn leader_elections(&self, elections: u64, unclean: u64) {
        let c = &global().controller;
        c.leader_elections.fetch_add(elections, Ordering::Relaxed);
        c.unclean_leader_elections
            .fetch_add(unclean, Ordering::Relaxed);
    }
}

impl BrokerMetrics {
    fn new() -> Self {
        Self {
            requests: RequestMetrics::new(),
            topics: BrokerTopicStats::default(),
            connections: ConnectionMetrics::default(),
            network: NetworkMetrics::default(),
            replication: ReplicationMetrics::default(),
            groups: GroupMetrics::default(),
            cleaner: CleanerMetrics::default(),
            flush: FlushMetrics::default(),
            retention: RetentionMetrics::default(),
            remote_log: RemoteLogMetrics::default(),
            controller: ControllerMetrics::default(),
        }
    }
}

/// Adds one to a counter (shorthand for the call sites).
pub fn inc(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_by_upper_bound() {
        let h = Histogram::default();
        h.observe(Duration::from_micros(100)); // on a bound: that bucket
        h.observe(Duration::from_micros(101));
        h.observe(Duration::from_secs(60)); // past the last bound: +Inf
        let s = h.snapshot();
        assert_eq!(s.count, 3);
        assert_eq!(s.buckets.len(), LATENCY_BOUNDS_US.len() + 1);
        assert_eq!(s.buckets[0], (0.0001, 1));
        assert_eq!(s.buckets[1], (0.00025, 1));
        assert_eq!(s.buckets.last(), Some(&(f64::MAX, 1)));
        assert!(
            (s.sum_seconds - 60.000201).abs() < 1e-9,
            "{}",
            s.sum_seconds
        );
    }

    #[test]
    fn errors_count_by_api_and_code_and_clamp_unknown_codes() {
        let r = RequestMetrics::new();
        r.error(0, 6);
        r.error(0, 6);
        r.error(1, -1);
        r.error(1, 0); // NONE is not an error
        r.error(1, 30_000); // out of range: UNKNOWN_SERVER_ERROR
        r.error(500, 6); // no such api: dropped, not misfiled
        r.error(-3, 6);
        assert_eq!(r.errors(), vec![(0, 6, 2), (1, -1, 2)]);
    }

    #[test]
    fn unknown_api_keys_share_the_other_slot() {
        let r = RequestMetrics::new();
        inc(&r.api(3).requests);
        inc(&r.api(200).requests);
        inc(&r.api(-1).requests);
        assert_eq!(r.other.requests.load(Ordering::Relaxed), 2);
        let served: Vec<i16> = r.served().map(|(k, _)| k).collect();
        assert_eq!(served, vec![3]);
    }

    #[test]
    fn a_connection_is_counted_until_its_guard_drops() {
        let c = ConnectionMetrics::default();
        let a = c.open("PLAINTEXT");
        let b = c.open("PLAINTEXT");
        assert_eq!(c.counts(), vec![("PLAINTEXT".to_string(), 2)]);
        drop(a);
        drop(b);
        assert_eq!(c.counts(), vec![("PLAINTEXT".to_string(), 0)]);
    }
}
