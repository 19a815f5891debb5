//! Listener and connections: frames in, responses out, in order per connection, with a
//! bound on every resource a peer can make the server hold.
//!
//! Each connection is one task that reads one length-prefixed frame, decodes the header,
//! hands the request to its [`RequestHandler`] (the server's dispatch) and writes the
//! response before it looks at the next frame, which is how Kafka keeps responses in
//! request order (it mutes a channel while a request is in flight). Different connections
//! run in parallel on the network threads (`num.network.threads`), and a connection moves
//! to the thread of the partitions it works on (see [`threads`]). A frame that cannot be
//! decoded closes that connection only.
//!
//! # Pipelined produce
//!
//! One exception, which Kafka does not make: a Produce that has appended its records and
//! only waits for its replicas (`acks=all`) lets its connection read the next request.
//! If that is a Produce too it is handled at once, up to [`MAX_PIPELINED_PRODUCES`] at a
//! time; anything else waits until every request before it has been answered. Responses
//! still go out in request order. Nothing a client can see changes but time: the appends
//! happen in request order, as before, and a Produce's answer still says whether its own
//! records are committed. What changes is that a connection no longer carries at most one
//! acks=all request per replication round trip: a producer with five requests in flight
//! (the Java client's and librdkafka's default with idempotence) gets five appended per
//! round trip, and the followers fetch them together (issue #25).
//!
//! # Limits (Kafka's names and defaults)
//!
//! 1. `max.connections`, `max.connections.per.ip`: checked at accept; a connection over
//!    either is closed at once, before a byte is read (Kafka's acceptor does the same).
//! 2. `socket.request.max.bytes` (100 MiB): the size prefix is checked as soon as its four
//!    bytes are in, before anything of the frame is buffered; a negative or larger size
//!    closes the connection. Until a connection has completed one request the cap is
//!    `sasl.server.max.receive.size` (512 KiB), Kafka's limit for unauthenticated peers, so
//!    that a stranger's first frame cannot make us reserve 100 MiB.
//! 3. `queued.max.request.bytes` (100 MiB here; Kafka's default -1 means unbounded): once
//!    a connection has completed a request, each frame takes its size (clamped to the
//!    pool) from a byte pool *before its body is read*, as Kafka's memory pool does, and
//!    gives it back when its request has been handled (a pipelined Produce: appended). When the pool is empty the
//!    connection simply stops reading, so TCP pushes back on the client. A first frame is
//!    not charged: it is at most 512 KiB (limit 2) and costs memory only as its bytes
//!    arrive, and charging it would let strangers that send a size prefix and stall hold
//!    the pool (200 of them would hold 100 MiB) until their idle timeout.
//! 4. `queued.max.requests` (500): a request takes a slot once its frame is complete and
//!    holds it while it is handled, until it parks (a fetch waiting for data, an acks=all
//!    produce waiting for its replicas, a group call waiting for its group: see
//!    `request_slot`). Taking the slot only then matters: connections that stall
//!    half-way into a frame must not hold slots (500 of them would stop the broker), nor
//!    may parked requests (500 idle consumers would).
//! 5. `connections.max.idle.ms` (10 min): a connection that neither sends a byte nor
//!    accepts one of its response for that long is closed (a read or a write that makes no
//!    progress for that long ends the connection), which also bounds a slow-loris peer
//!    to one byte per idle period on one task.
//!
//! 6. Client quotas: when the handler's [`Reply`] carries a throttle, the connection reads
//!    no further request for that long (Kafka mutes the channel): after sending the
//!    response to a client that waits out throttles itself (KIP-219's versions), before
//!    sending it to an older one. Slots and pool bytes are given back before the wait.
//!
//! The read buffer holds at most one frame plus [`READ_AHEAD_BYTES`]: reads are limited to
//! the bytes the current frame still needs, or to the read-ahead while waiting for the next
//! size prefix, so pipelined requests cannot pile up in memory either.
//!
//! # Zero-copy Fetch
//!
//! A Fetch is answered as [`ResponseChunk`]s: encoded bytes interleaved with ranges of
//! segment files. The bytes before each file range are sent with `MSG_MORE` (one
//! `sendmsg` of their slices) and the range goes out with `sendfile`, so record bytes
//! never pass through user space (DESIGN.md §3), and the few bytes of framing ride in
//! the file's first segment instead of a tiny TCP segment of their own (which over
//! loopback costs the broker a whole receive path and the client a wake-up). The bytes
//! after the last range go through the connection's buffer like any response. A socket `sendfile` refuses falls back to reading
//! the range and writing it; a file that turns out shorter than its range (truncated
//! under the response) closes the connection rather than send a short frame.
//!
//! On a TLS listener (`SSL`, `SASL_SSL`) the stream is rustls's, and a Fetch's file
//! ranges are read and encrypted through it: zero-copy is for plaintext listeners only.
//! On a SASL listener the connection authenticates first (`sasl`): until it has, only
//! ApiVersions and the SASL requests pass, every frame stays under
//! `sasl.server.max.receive.size` and none is charged to the byte pool.
//!
//! Why this cannot deadlock: a connection holds at most one frame's bytes (its size
//! clamped to the pool) and one slot, acquires them in the same order (bytes, then slot)
//! and releases both once the [`RequestHandler`] returns (pipelined Produce requests
//! waiting for their replicas hold neither, and are answered while the connection waits); a slot holder is handling a request
//! and never waits for bytes or for another connection to read. A long-polling Fetch holds its slot for at most its `max_wait_ms` (itself
//! capped), so a full request pool delays requests but cannot stop them.

use std::collections::HashMap;
use std::fs::File;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::os::unix::fs::FileExt;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use futures::stream::{FuturesOrdered, StreamExt};
use futures::FutureExt;
use rill_protocol::frame::FRAME_PREFIX_LEN;
use rill_protocol::{decode_frame, decode_request_header, ApiKey, FrameError};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufWriter, Interest};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};

use rill_protocol::generated::RequestHeader;

use crate::config::{BrokerConfig, SecurityProtocol};
use crate::error::BrokerError;
use crate::metrics;

pub mod bootstrap_scram;
pub mod controller_channel;
pub mod inter_broker;
pub mod oauthbearer;
pub mod request_slot;
pub mod sasl;
pub mod scram;
pub mod security;
pub mod threads;

use sasl::{AuthTime, Authenticator, Verdict};
use scram::{ScramIdentity, ScramName};
use security::{ListenerSecurity, ANONYMOUS};
use threads::{Affinity, LiveGuard, NetworkThreads, Placement};

/// Who is on the other end of a connection, as the server sees each of its requests.
#[derive(Debug, Clone)]
pub struct Session {
    pub peer: SocketAddr,
    /// The peer's address as ACLs name hosts (`acl::host_address`), written once here
    /// rather than for every request that is authorized.
    pub host: Arc<str>,
    /// The listener the connection came in on: Metadata answers with the brokers'
    /// endpoints on this listener, as Kafka does.
    pub listener: Arc<str>,
    pub security_protocol: SecurityProtocol,
    /// `User:ANONYMOUS`, `User:<sasl user>`, or `User:<certificate subject>`.
    pub principal: Arc<str>,
    /// The principal authenticated with a delegation token (KIP-48): it may not ask for
    /// delegation tokens.
    pub token_authenticated: bool,
    /// This connection among all of the process's, for state that lives as long as it
    /// (a share session, KIP-932); see [`RequestHandler::connection_closed`].
    pub connection_id: u64,
    /// Which network thread this connection's data requests belong on: the Produce and
    /// Fetch handlers vote, the connection moves (see `threads`).
    pub affinity: Arc<Affinity>,
}

/// The id the next connection gets.
static NEXT_CONNECTION_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// A bound client listener and what it demands of its connections.
pub struct Listener {
    pub tcp: TcpListener,
    pub security: Arc<ListenerSecurity>,
}

/// What the network layer hands each complete request to (Kafka's `RequestChannel`, seen
/// from its `SocketServer`): the server's dispatch. This layer knows frames, connections,
/// limits and the order of responses; what a request means (and any partition) is the
/// handler's.
pub trait RequestHandler: Send + Sync + 'static {
    /// Answers one request: the response as chunks (bytes, and for a Fetch ranges of
    /// segment files) with the throttle a quota put on the connection, or a reason to
    /// close the connection.
    fn handle_request(
        &self,
        header: &RequestHeader,
        api_key: Option<ApiKey>,
        body: Bytes,
        session: &Session,
    ) -> impl std::future::Future<Output = Result<Reply, String>> + Send;

    /// A broker config's current value at its highest level (this broker's dynamic
    /// value, then the cluster-wide default, then the static config), for the limits that
    /// can change at run time.
    fn broker_config_value(&self, key: &str) -> Option<String>;

    /// The generation of what this handler told its clients. A connection that served a
    /// request under one generation is closed before it serves one under a later one: the
    /// handler bumps it when its earlier answers may have become wrong, so that each
    /// client starts over on a new connection rather than carrying on in the middle of a
    /// pipeline that the handler refused in part.
    fn connection_generation(&self) -> u64 {
        0
    }

    /// The connection `connection_id` is closed, however it ended.
    fn connection_closed(&self, _connection_id: u64) {}

    /// The `connection_creation_rate` quota of connections from `ip` (an `ip` entity's, else
    /// the default `ip` entity's), if there is one.
    fn connection_creation_rate(&self, _ip: IpAddr) -> Option<f64> {
        None
    }

    /// The SCRAM credential of a user, or of a delegation token, for one mechanism, for
    /// SASL/SCRAM authentication.
    fn scram_credential(&self, _name: ScramName<'_>) -> Option<ScramIdentity> {
        None
    }
}

/// Bytes read past the current frame while waiting for the next size prefix: enough for a
/// handful of pipelined small requests per read system call, small enough that thousands
/// of idle connections cost little.
pub const READ_AHEAD_BYTES: usize = 8 * 1024;

/// A connection's buffer larger than this is dropped once empty, so that one large request
/// does not pin its allocation for the rest of a long-lived connection.
const KEEP_BUFFER_BYTES: usize = 64 * 1024;

/// One piece of a response frame: encoded bytes, or a range of a segment file that the
/// connection sends with `sendfile` so that record bytes never pass through user space
/// (DESIGN.md §3). The `Arc<File>` keeps the inode alive if retention deletes the segment
/// while the response is in flight.
#[derive(Debug, Clone)]
pub enum ResponseChunk {
    Bytes(Bytes),
    File {
        file: Arc<File>,
        offset: u64,
        len: usize,
    },
}

/// The handler's answer to one request.
#[derive(Debug, Default)]
pub struct Reply {
    /// The response; `None` when nothing is to be sent (`acks=0` produce).
    pub chunks: Option<Vec<ResponseChunk>>,
    /// How long the connection reads no further request: a client quota's throttle
    /// (Kafka mutes the channel for it, KIP-219), so that a client that does not wait out
    /// the throttle it was told gains nothing by sending more.
    pub throttle: Duration,
    /// The client is too old to wait out a throttle itself: the response is held back for
    /// the throttle time instead of sent at once (Kafka before KIP-219).
    pub hold_response: bool,
}

impl Reply {
    pub fn new(chunks: Option<Vec<ResponseChunk>>) -> Self {
        Self {
            chunks,
            ..Self::default()
        }
    }
}

/// The connection-layer limits, read from the broker config under Kafka's names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// `socket.request.max.bytes`: largest frame once a connection has made one request.
    pub socket_request_max_bytes: usize,
    /// `sasl.server.max.receive.size`: largest frame before that.
    pub first_request_max_bytes: usize,
    /// `queued.max.request.bytes`: bytes all connections' frames may hold at once.
    pub queued_max_request_bytes: usize,
    /// `queued.max.requests`: requests being read or handled at once.
    pub queued_max_requests: usize,
    /// `max.connections`.
    pub max_connections: usize,
    /// `max.connections.per.ip`.
    pub max_connections_per_ip: usize,
    /// `connections.max.idle.ms`.
    pub connections_max_idle: Duration,
    /// `connection.failed.authentication.delay.ms`: how long a connection that failed to
    /// authenticate is held (its answer sent) before it is closed, as in Kafka. It slows
    /// down password guessing, and some clients (kafka-python) lose an answer whose
    /// connection closes at once.
    pub failed_authentication_delay: Duration,
    /// `quota.window.num` and `quota.window.size.seconds`: what connection creation rates
    /// are measured over.
    pub quota_windows: crate::rate::QuotaWindows,
    /// `num.network.threads`: the threads connections are served on (see `threads`).
    pub network_threads: usize,
}

impl Default for ConnectionLimits {
    /// Kafka's defaults, except `queued.max.request.bytes` (Kafka: unbounded).
    fn default() -> Self {
        Self {
            socket_request_max_bytes: 104_857_600,
            first_request_max_bytes: 524_288,
            queued_max_request_bytes: 104_857_600,
            queued_max_requests: 500,
            max_connections: i32::MAX as usize,
            max_connections_per_ip: i32::MAX as usize,
            connections_max_idle: Duration::from_millis(600_000),
            failed_authentication_delay: Duration::from_millis(100),
            quota_windows: crate::rate::QuotaWindows::default(),
            network_threads: 3,
        }
    }
}

impl ConnectionLimits {
    /// Kafka's value for "no limit" in `max.connections*` is `Int.MaxValue`; -1 in
    /// `queued.max.request.bytes` means unbounded. Both map to `usize::MAX` here, and any
    /// non-positive count to "unbounded" too rather than to a server that serves nobody.
    pub fn from_config(config: &BrokerConfig) -> Result<Self, BrokerError> {
        let int = |key: &str, default: i64| -> Result<i64, BrokerError> {
            match config.get(key) {
                None => Ok(default),
                Some(raw) => raw.trim().parse::<i64>().map_err(|_| {
                    BrokerError::Config(format!(
                        "{key}: invalid value {raw:?}: must be an integer from {} to {}",
                        i64::MIN,
                        i64::MAX
                    ))
                }),
            }
        };
        let bound = |v: i64| if v <= 0 { usize::MAX } else { v as usize };
        let socket_request_max_bytes = int("socket.request.max.bytes", 104_857_600)?.max(0);
        let first = int("sasl.server.max.receive.size", 524_288)?.max(0);
        let idle_ms = int("connections.max.idle.ms", 600_000)?;
        let auth_delay_ms = int("connection.failed.authentication.delay.ms", 100)?.max(0);
        let (samples, seconds) = config.quota_windows()?;
        Ok(Self {
            quota_windows: crate::rate::QuotaWindows {
                samples,
                window: Duration::from_secs(seconds),
            },
            socket_request_max_bytes: socket_request_max_bytes as usize,
            first_request_max_bytes: first.min(socket_request_max_bytes) as usize,
            queued_max_request_bytes: bound(int("queued.max.request.bytes", -1)?),
            queued_max_requests: bound(int("queued.max.requests", 500)?),
            max_connections: bound(int("max.connections", i64::from(i32::MAX))?),
            max_connections_per_ip: bound(int("max.connections.per.ip", i64::from(i32::MAX))?),
            // Kafka treats -1 as "never close"; a huge duration does the same here.
            connections_max_idle: if idle_ms < 0 {
                Duration::from_secs(u64::from(u32::MAX))
            } else {
                Duration::from_millis(idle_ms as u64)
            },
            failed_authentication_delay: Duration::from_millis(auth_delay_ms as u64),
            network_threads: int("num.network.threads", 3)?.max(1) as usize,
        })
    }
}

/// Raises this process's soft limit on open files (`RLIMIT_NOFILE`) to its hard limit, the
/// way Kafka's start scripts expect the operator to; each connection costs a descriptor,
/// and distributions default the soft limit to 1024. Returns the soft limit in force
/// afterwards (`None` when it is unlimited). Call once at start-up, before serving.
pub fn raise_fd_limit() -> Option<u64> {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let limit = getrlimit(Resource::Nofile);
    if let (Some(current), Some(maximum)) = (limit.current, limit.maximum) {
        if current < maximum {
            let raised = Rlimit {
                current: Some(maximum),
                maximum: Some(maximum),
            };
            match setrlimit(Resource::Nofile, raised) {
                Ok(()) => return Some(maximum),
                Err(e) => {
                    tracing::warn!(error = %e, current, maximum, "cannot raise RLIMIT_NOFILE")
                }
            }
        }
    }
    limit.current
}

/// Counts open connections, in total and per peer address, and the rates at which they
/// are made, for the accept-time limits.
struct ConnectionQuotas {
    total: usize,
    per_ip: HashMap<IpAddr, usize>,
    /// Connections accepted, for `max.connection.creation.rate`.
    created: crate::rate::Rate,
    /// Connections accepted per address with a `connection_creation_rate` quota.
    created_per_ip: HashMap<IpAddr, crate::rate::Rate>,
    windows: crate::rate::QuotaWindows,
    epoch: std::time::Instant,
}

/// Rates of addresses idle this long are forgotten once there are many.
const IP_RATE_IDLE_MS: u64 = 3_600_000;

/// Releases a connection's place in [`ConnectionQuotas`] when the connection ends.
struct ConnectionSlot {
    quotas: Arc<Mutex<ConnectionQuotas>>,
    ip: IpAddr,
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        let mut q = self.quotas.lock().unwrap_or_else(|e| e.into_inner());
        q.total = q.total.saturating_sub(1);
        if let Some(n) = q.per_ip.get_mut(&self.ip) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                q.per_ip.remove(&self.ip);
            }
        }
    }
}

/// The accept-time limits as they are now: `max.connections`,
/// `max.connections.per.ip` and its overrides can be changed dynamically (this broker's
/// value, then the cluster-wide default, then the static config).
#[derive(Clone, Copy)]
struct LiveConnectionLimits {
    max_connections: usize,
    max_connections_per_ip: usize,
    /// `max.connection.creation.rate`, connections a second.
    max_connection_creation_rate: f64,
}

impl LiveConnectionLimits {
    fn of(handler: &impl RequestHandler, limits: &ConnectionLimits) -> Self {
        let get = |key: &str, fallback: usize| {
            handler
                .broker_config_value(key)
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(fallback)
        };
        Self {
            max_connections: get("max.connections", limits.max_connections),
            max_connections_per_ip: get("max.connections.per.ip", limits.max_connections_per_ip),
            max_connection_creation_rate: handler
                .broker_config_value("max.connection.creation.rate")
                .and_then(|v| v.trim().parse::<f64>().ok())
                .unwrap_or(f64::from(i32::MAX)),
        }
    }
}

/// `max.connections.per.ip.overrides` by address, as last read. Host names are resolved
/// when the value changes (Kafka resolves them when it applies the config), not at every
/// accept.
#[derive(Default)]
struct PerIpOverrides {
    raw: String,
    limits: HashMap<IpAddr, usize>,
}

impl PerIpOverrides {
    async fn refresh(&mut self, handler: &impl RequestHandler) {
        let raw = handler
            .broker_config_value("max.connections.per.ip.overrides")
            .unwrap_or_default();
        if raw == self.raw {
            return;
        }
        let mut limits = HashMap::new();
        // The value was checked when it was set; one that no longer parses counts as none.
        for (host, count) in crate::config::parse_per_ip_overrides(&raw).unwrap_or_default() {
            if let Ok(ip) = host.parse::<IpAddr>() {
                limits.insert(ip, count);
                continue;
            }
            match tokio::net::lookup_host((host.as_str(), 0)).await {
                Ok(addresses) => limits.extend(addresses.map(|a| (a.ip(), count))),
                Err(e) => tracing::warn!(
                    host,
                    error = %e,
                    "max.connections.per.ip.overrides: host not resolved; its override does not apply"
                ),
            }
        }
        self.raw = raw;
        self.limits = limits;
    }
}

/// Why a connection is not served.
#[derive(Debug, PartialEq)]
enum Refusal {
    /// Over a count limit: closed at once.
    Limit(&'static str),
    /// Over its address's `connection_creation_rate`: closed after the throttle time, as
    /// Kafka does, so that the client does not come straight back.
    Throttled(Duration),
}

/// Admits a connection, or says why not; with it, how long to stop accepting because the
/// broker is over `max.connection.creation.rate` (Kafka's acceptor blocks as long).
fn admit(
    quotas: &Arc<Mutex<ConnectionQuotas>>,
    limits: LiveConnectionLimits,
    overrides: &PerIpOverrides,
    ip: IpAddr,
    ip_rate: Option<f64>,
    now: std::time::Instant,
) -> Result<(ConnectionSlot, Duration), Refusal> {
    let mut q = quotas.lock().unwrap_or_else(|e| e.into_inner());
    if q.total >= limits.max_connections {
        return Err(Refusal::Limit("max.connections"));
    }
    let from_ip = q.per_ip.get(&ip).copied().unwrap_or(0);
    let per_ip = overrides
        .limits
        .get(&ip)
        .copied()
        .unwrap_or(limits.max_connections_per_ip);
    if from_ip >= per_ip {
        return Err(Refusal::Limit("max.connections.per.ip"));
    }
    let now_ms = now.saturating_duration_since(q.epoch).as_millis() as u64;
    let windows = q.windows;
    if let Some(limit) = ip_rate {
        if q.created_per_ip.len() > 65_536 {
            q.created_per_ip
                .retain(|_, r| now_ms.saturating_sub(r.last_ms) < IP_RATE_IDLE_MS);
        }
        let r = q.created_per_ip.entry(ip).or_default();
        let throttle = r.record_and_throttle(1.0, limit, now_ms, windows);
        if !throttle.is_zero() {
            // A refused connection is not counted (Kafka takes it back too).
            r.record(-1.0, now_ms, windows);
            return Err(Refusal::Throttled(throttle));
        }
    }
    let broker_throttle =
        q.created
            .record_and_throttle(1.0, limits.max_connection_creation_rate, now_ms, windows);
    q.total += 1;
    q.per_ip.insert(ip, from_ip + 1);
    Ok((
        ConnectionSlot {
            quotas: quotas.clone(),
            ip,
        },
        broker_throttle,
    ))
}

/// The pools every connection draws from (limit 3 of the module docs).
struct RequestPools {
    requests: Arc<Semaphore>,
    bytes: Semaphore,
    /// The byte pool's size in permits; a frame asks for at most this many.
    bytes_cap: u32,
}

impl RequestPools {
    fn new(limits: &ConnectionLimits) -> Self {
        // Semaphores count in u32 per acquisition and up to usize::MAX >> 3 in total.
        let bytes_cap = limits.queued_max_request_bytes.min(u32::MAX as usize) as u32;
        let requests = limits.queued_max_requests.min(Semaphore::MAX_PERMITS);
        Self {
            requests: Arc::new(Semaphore::new(requests)),
            bytes: Semaphore::new(bytes_cap as usize),
            bytes_cap,
        }
    }
}

/// Accepts connections on every listener until `shutdown` turns true, within `limits`
/// (see [`ConnectionLimits::from_config`]), which all listeners share.
pub async fn serve<H: RequestHandler>(
    listeners: Vec<Listener>,
    handler: Arc<H>,
    limits: ConnectionLimits,
    shutdown: watch::Receiver<bool>,
) {
    let limits = Arc::new(limits);
    let pools = Arc::new(RequestPools::new(&limits));
    metrics::global().network.memory_pool_capacity_bytes.store(
        i64::from(pools.bytes_cap),
        std::sync::atomic::Ordering::Relaxed,
    );
    let quotas = Arc::new(Mutex::new(ConnectionQuotas {
        total: 0,
        per_ip: HashMap::new(),
        created: crate::rate::Rate::default(),
        created_per_ip: HashMap::new(),
        windows: limits.quota_windows,
        epoch: std::time::Instant::now(),
    }));
    let threads = match NetworkThreads::start(limits.network_threads) {
        Ok(threads) => Some(Arc::new(threads)),
        Err(e) => {
            tracing::error!(error = %e, "cannot start the network threads; serving connections on the runtime's workers");
            None
        }
    };
    let mut accepting = tokio::task::JoinSet::new();
    if let Some(threads) = &threads {
        accepting.spawn(follow_thread_count(
            threads.clone(),
            handler.clone(),
            limits.network_threads,
            shutdown.clone(),
        ));
    }
    for listener in listeners {
        accepting.spawn(accept_loop(
            listener,
            handler.clone(),
            limits.clone(),
            pools.clone(),
            quotas.clone(),
            threads.clone(),
            shutdown.clone(),
        ));
    }
    while accepting.join_next().await.is_some() {}
    if let Some(threads) = threads {
        threads.stop();
    }
}

/// How often a change of `num.network.threads` is looked for.
const THREAD_COUNT_CHECK: Duration = Duration::from_secs(1);

/// Resizes the network threads when `num.network.threads` changes (a dynamic broker
/// config, as in Kafka), until shutdown.
async fn follow_thread_count<H: RequestHandler>(
    threads: Arc<NetworkThreads>,
    handler: Arc<H>,
    fallback: usize,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(THREAD_COUNT_CHECK) => {}
            _ = shutdown.changed() => return,
        }
        let n = handler
            .broker_config_value("num.network.threads")
            .and_then(|v| v.trim().parse::<usize>().ok())
            .unwrap_or(fallback);
        threads.resize(n);
    }
}

async fn accept_loop<H: RequestHandler>(
    listener: Listener,
    handler: Arc<H>,
    limits: Arc<ConnectionLimits>,
    pools: Arc<RequestPools>,
    quotas: Arc<Mutex<ConnectionQuotas>>,
    threads: Option<Arc<NetworkThreads>>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut overrides = PerIpOverrides::default();
    loop {
        tokio::select! {
            accepted = listener.tcp.accept() => match accepted {
                Ok((stream, peer)) => {
                    let live = LiveConnectionLimits::of(handler.as_ref(), &limits);
                    overrides.refresh(handler.as_ref()).await;
                    let ip_rate = handler.connection_creation_rate(peer.ip());
                    let now = std::time::Instant::now();
                    let (slot, pause) = match admit(&quotas, live, &overrides, peer.ip(), ip_rate, now) {
                        Ok(admitted) => admitted,
                        Err(Refusal::Limit(limit)) => {
                            tracing::debug!(%peer, limit, "connection refused");
                            drop(stream);
                            continue;
                        }
                        Err(Refusal::Throttled(delay)) => {
                            tracing::debug!(%peer, ?delay, "connection_creation_rate exceeded; closing after the throttle");
                            let mut shutdown = shutdown.clone();
                            tokio::spawn(async move {
                                tokio::select! {
                                    _ = tokio::time::sleep(delay) => {}
                                    _ = shutdown.changed() => {}
                                }
                                drop(stream);
                            });
                            continue;
                        }
                    };
                    let conn = Conn {
                        handler: handler.clone(),
                        security: listener.security.clone(),
                        limits: limits.clone(),
                        pools: pools.clone(),
                        shutdown: shutdown.clone(),
                        peer,
                        id: NEXT_CONNECTION_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
                        threads: threads.clone(),
                        _counted: metrics::global().connections.open(&listener.security.name),
                        _slot: slot,
                    };
                    match &threads {
                        Some(t) => match stream.into_std() {
                            Ok(stream) => {
                                let on = t.next();
                                launch(conn, Start::Handed(stream), on);
                            }
                            Err(e) => tracing::debug!(%peer, error = %e, "connection lost at accept"),
                        },
                        None => launch(conn, Start::Accepted(stream), 0),
                    }
                    if !pause.is_zero() {
                        tracing::debug!(?pause, "max.connection.creation.rate exceeded; not accepting for a while");
                        tokio::select! {
                            _ = tokio::time::sleep(pause) => {}
                            _ = shutdown.changed() => return,
                        }
                    }
                }
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            _ = shutdown.changed() => return,
        }
    }
}

#[derive(Debug, thiserror::Error)]
enum ConnectionError {
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("frame: {0}")]
    Frame(#[from] FrameError),
    #[error("first frame of {size} bytes is over sasl.server.max.receive.size ({max})")]
    FirstFrameTooLarge { size: usize, max: usize },
    #[error("idle for {0:?} (connections.max.idle.ms)")]
    Idle(Duration),
    #[error("shutting down")]
    Shutdown,
    #[error("{0}")]
    Protocol(String),
    #[error("TLS handshake: {0}")]
    Tls(std::io::Error),
}

/// Reads frames off one connection, never buffering more than the frame being read plus
/// [`READ_AHEAD_BYTES`].
struct FrameReader<R> {
    reader: R,
    buf: BytesMut,
    idle: Duration,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    /// One read of at most `limit` bytes; an error when it makes no progress within the
    /// idle limit, `Ok(false)` at end of stream.
    async fn fill(&mut self, limit: usize) -> Result<bool, ConnectionError> {
        if self.buf.capacity() - self.buf.len() < limit {
            self.buf.reserve(limit);
        }
        let mut limited = (&mut self.reader).take(limit as u64);
        let read = limited.read_buf(&mut self.buf);
        match tokio::time::timeout(self.idle, read).await {
            Ok(n) => Ok(n? > 0),
            Err(_) => Err(ConnectionError::Idle(self.idle)),
        }
    }

    /// The size prefix of the next frame, `None` at a clean end of stream (between frames).
    async fn next_size(&mut self) -> Result<Option<i32>, ConnectionError> {
        if self.buf.is_empty() && self.buf.capacity() > KEEP_BUFFER_BYTES {
            self.buf = BytesMut::new();
        }
        while self.buf.len() < FRAME_PREFIX_LEN {
            if !self.fill(READ_AHEAD_BYTES).await? {
                if self.buf.is_empty() {
                    return Ok(None);
                }
                return Err(ConnectionError::Protocol(
                    "end of stream inside a size prefix".into(),
                ));
            }
        }
        Ok(Some((&self.buf[..FRAME_PREFIX_LEN]).get_i32()))
    }

    /// Reads the rest of a frame whose size prefix is buffered and checked, and splits it
    /// off (without the prefix). Reads stop at the frame's end.
    async fn frame(&mut self, size: usize) -> Result<Bytes, ConnectionError> {
        let total = FRAME_PREFIX_LEN + size;
        while self.buf.len() < total {
            let missing = total - self.buf.len();
            if !self.fill(missing).await? {
                return Err(ConnectionError::Protocol(format!(
                    "end of stream {missing} bytes before the end of a frame"
                )));
            }
        }
        match decode_frame(&mut self.buf, size)? {
            Some(frame) => Ok(frame.freeze()),
            None => Err(ConnectionError::Protocol("frame incomplete".into())),
        }
    }
}

/// A connection's task and what it holds for its whole life, wherever it runs.
struct Conn<H> {
    handler: Arc<H>,
    security: Arc<ListenerSecurity>,
    limits: Arc<ConnectionLimits>,
    pools: Arc<RequestPools>,
    shutdown: watch::Receiver<bool>,
    peer: SocketAddr,
    id: u64,
    threads: Option<Arc<NetworkThreads>>,
    _counted: metrics::ConnectionGuard,
    _slot: ConnectionSlot,
}

/// How a connection's task begins.
enum Start {
    /// Accepted on this runtime (no network threads).
    Accepted(TcpStream),
    /// Handed to a network thread at accept.
    Handed(std::net::TcpStream),
    /// Moved from another network thread between two requests.
    Moved(Box<Moving>),
}

/// A plaintext connection on its way to another network thread: its socket, the bytes
/// read but not yet used, and what its requests have set up.
struct Moving {
    stream: std::net::TcpStream,
    buf: BytesMut,
    session: Session,
    carried: Carried,
    target: usize,
}

/// What a connection keeps from one request to the next besides its session.
struct Carried {
    sasl: Option<Authenticator>,
    /// The handler's generation when this connection's first request came.
    generation: Option<u64>,
    served_one: bool,
}

/// A connection paused between two requests to move, with its two halves back.
struct Paused<R, W> {
    reader: R,
    buf: BytesMut,
    writer: W,
    session: Session,
    carried: Carried,
    target: usize,
}

/// Runs a connection's task on network thread `on`, or on this runtime without them.
fn launch<H: RequestHandler>(conn: Conn<H>, start: Start, on: usize) {
    match conn.threads.clone() {
        Some(threads) => {
            let peer = conn.peer;
            if !threads.spawn(on, move |live| conn.run(start, Some(on), Some(live))) {
                tracing::debug!(%peer, "connection dropped: the network threads are stopping");
            }
        }
        None => {
            tokio::spawn(conn.run(start, None, None));
        }
    }
}

impl<H: RequestHandler> Conn<H> {
    /// Boxed with its type spelled out: a moving connection launches this again from
    /// inside it.
    fn run(
        self,
        start: Start,
        here: Option<usize>,
        live: Option<LiveGuard>,
    ) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        Box::pin(async move {
            let placement = here.map(Placement::new);
            let result = match start {
                Start::Accepted(stream) => self.connection(stream, None).await,
                Start::Handed(stream) => match TcpStream::from_std(stream) {
                    Ok(stream) => self.connection(stream, placement).await,
                    Err(e) => Err(e.into()),
                },
                Start::Moved(moving) => self.resume(*moving, placement).await,
            };
            match result {
                Ok(Some(moving)) => {
                    tracing::trace!(peer = %self.peer, from = ?here, to = moving.target, "connection moves");
                    drop(live);
                    let target = moving.target;
                    launch(self, Start::Moved(Box::new(moving)), target);
                }
                ended => {
                    self.handler.connection_closed(self.id);
                    if let Err(e) = ended {
                        tracing::debug!(peer = %self.peer, listener = %self.security.name, error = %e, "connection closed");
                    }
                }
            }
        })
    }

    fn session(&self) -> Session {
        Session {
            peer: self.peer,
            host: Arc::from(rill_protocol::acl::host_address(self.peer.ip())),
            listener: Arc::from(self.security.name.as_str()),
            security_protocol: self.security.protocol,
            principal: Arc::from(ANONYMOUS),
            token_authenticated: false,
            connection_id: self.id,
            affinity: Arc::new(
                self.threads
                    .as_ref()
                    .map_or_else(|| Affinity::new(1), |t| t.affinity()),
            ),
        }
    }

    async fn connection(
        &self,
        stream: TcpStream,
        placement: Option<Placement>,
    ) -> Result<Option<Moving>, ConnectionError> {
        stream.set_nodelay(true)?;
        let mut session = self.session();
        let security = self.security.as_ref();
        let carried = Carried {
            sasl: security.sasl.clone().map(Authenticator::new),
            generation: None,
            served_one: false,
        };
        let Some(tls) = &security.tls else {
            return self
                .plaintext(stream, BytesMut::new(), session, carried, placement)
                .await;
        };
        let mut shutdown = self.shutdown.clone();
        let limits = self.limits.as_ref();
        let handler = &self.handler;
        let peer = self.peer;
        let acceptor = tls.acceptor(|key| handler.broker_config_value(key));
        // rustls reads the socket 4 KiB at a time; a buffer under it makes that one system
        // call per 64 KiB.
        let stream = tokio::io::BufReader::with_capacity(TLS_READ_BUFFER_BYTES, stream);
        // The handshake is bounded by the idle limit like any read.
        let tls = tokio::select! {
            tls = tokio::time::timeout(limits.connections_max_idle, acceptor.accept(stream)) => match tls {
                Ok(tls) => tls.map_err(ConnectionError::Tls)?,
                Err(_) => return Err(ConnectionError::Idle(limits.connections_max_idle)),
            },
            _ = shutdown.changed() => return Ok(None),
        };
        if let Some(cert) = tls.get_ref().1.peer_certificates().and_then(|c| c.first()) {
            // A certificate the chain check accepted but whose subject no mapping rule
            // matches is refused, as Kafka's `SslPrincipalMapper` does.
            let principal = security.principal_of_certificate(cert).ok_or_else(|| {
                ConnectionError::Protocol(
                    "no ssl.principal.mapping.rules rule matches the client certificate".into(),
                )
            })?;
            session.principal = Arc::from(principal.as_str());
        }
        tracing::trace!(%peer, principal = %session.principal, "TLS handshake done");
        let (reader, writer) = tokio::io::split(tls);
        // A TLS connection stays on its thread: no placement.
        self.serve(
            reader,
            BufWriter::new(writer),
            BytesMut::new(),
            session,
            carried,
            None,
        )
        .await?;
        Ok(None)
    }

    /// A moved connection, served on from where it paused.
    async fn resume(
        &self,
        moving: Moving,
        placement: Option<Placement>,
    ) -> Result<Option<Moving>, ConnectionError> {
        let stream = TcpStream::from_std(moving.stream)?;
        self.plaintext(
            stream,
            moving.buf,
            moving.session,
            moving.carried,
            placement,
        )
        .await
    }

    /// Serves a plaintext connection until it ends or pauses to move.
    async fn plaintext(
        &self,
        stream: TcpStream,
        buf: BytesMut,
        session: Session,
        carried: Carried,
        placement: Option<Placement>,
    ) -> Result<Option<Moving>, ConnectionError> {
        let (reader, writer) = stream.into_split();
        let paused = self
            .serve(
                reader,
                BufWriter::new(writer),
                buf,
                session,
                carried,
                placement,
            )
            .await?;
        paused.map(Self::unsplit).transpose()
    }

    fn unsplit(
        paused: Paused<tokio::net::tcp::OwnedReadHalf, BufWriter<OwnedWriteHalf>>,
    ) -> Result<Moving, ConnectionError> {
        let stream = paused
            .reader
            .reunite(paused.writer.into_inner())
            .map_err(|e| ConnectionError::Protocol(format!("moving the connection: {e}")))?
            .into_std()?;
        Ok(Moving {
            stream,
            buf: paused.buf,
            session: paused.session,
            carried: paused.carried,
            target: paused.target,
        })
    }

    async fn serve<R: AsyncRead + Unpin, W: ResponseWriter>(
        &self,
        reader: R,
        writer: W,
        buf: BytesMut,
        session: Session,
        carried: Carried,
        placement: Option<Placement>,
    ) -> Result<Option<Paused<R, W>>, ConnectionError> {
        let frames = FrameReader {
            reader,
            buf,
            idle: self.limits.connections_max_idle,
        };
        let responder = Responder {
            writer,
            limits: &self.limits,
            shutdown: self.shutdown.clone(),
            in_flight: FuturesOrdered::new(),
            unflushed: false,
            muted_until: None,
            served_one: carried.served_one,
        };
        let served = serve_requests(
            frames,
            responder,
            session,
            carried,
            placement,
            &self.security,
            self.handler.clone(),
            &self.pools,
        )
        .await;
        match served {
            Err(ConnectionError::Shutdown) => Ok(None),
            ended => ended,
        }
    }
}

/// Where a connection writes its responses: a plaintext socket, whose Fetch ranges go
/// out with `sendfile`, or a TLS stream, through which they are read and encrypted.
trait ResponseWriter: AsyncWrite + Unpin + Send {
    /// The socket to `sendfile` to, on plaintext only.
    fn zero_copy_socket(&self) -> Option<&TcpStream>;
}

impl ResponseWriter for BufWriter<OwnedWriteHalf> {
    fn zero_copy_socket(&self) -> Option<&TcpStream> {
        Some(self.get_ref().as_ref())
    }
}

/// The socket read buffer of a TLS connection (see `connection`).
const TLS_READ_BUFFER_BYTES: usize = 64 * 1024;

impl ResponseWriter
    for BufWriter<
        tokio::io::WriteHalf<tokio_rustls::server::TlsStream<tokio::io::BufReader<TcpStream>>>,
    >
{
    fn zero_copy_socket(&self) -> Option<&TcpStream> {
        None
    }
}

/// Produce requests one connection works on at once (see the module notes on pipelined
/// produce): what the Java client and librdkafka keep in flight with idempotence. A
/// client that sends more waits in its socket, as every client did before.
const MAX_PIPELINED_PRODUCES: usize = 5;

/// A request its handler is done with, and what its metrics need.
struct Handled {
    api_key: i16,
    response: Result<Reply, String>,
    received: Instant,
    dequeued: Instant,
    parked_at: Option<Instant>,
    handled: Instant,
}

/// A connection's requests being handled, in the order they came.
type InFlight<'a> = FuturesOrdered<Pin<Box<dyn Future<Output = Handled> + Send + 'a>>>;

/// The writing side of a connection: the requests in flight, their responses written in
/// request order, and what a response leaves behind (a quota's mute, bytes to flush).
struct Responder<'a, W> {
    writer: W,
    limits: &'a ConnectionLimits,
    shutdown: watch::Receiver<bool>,
    in_flight: InFlight<'a>,
    /// Responses written since the last flush.
    unflushed: bool,
    /// No request is read before then: a quota's throttle (Kafka mutes the channel).
    muted_until: Option<Instant>,
    /// A request has been answered (the connection's first frame was not refused).
    served_one: bool,
}

impl<'a, W: ResponseWriter> Responder<'a, W> {
    /// Awaits `work` (reading, waiting for the byte pool or a slot) while answering the
    /// requests in flight as they complete. Written responses are flushed before the
    /// connection waits, and only then: responses to requests that were already buffered
    /// go out together. Shutting down ends the wait unless `finish` (a request still
    /// appending is not cut off half-way, as none was before pipelining).
    async fn answering<T>(
        &mut self,
        work: impl Future<Output = Result<T, ConnectionError>>,
        finish: bool,
    ) -> Result<T, ConnectionError> {
        let mut work = std::pin::pin!(work);
        loop {
            if let Some(out) = (&mut work).now_or_never() {
                return out;
            }
            if self.unflushed {
                self.flush().await?;
                continue;
            }
            tokio::select! {
                biased;
                _ = self.shutdown.changed(), if !finish => return Err(ConnectionError::Shutdown),
                Some(done) = self.in_flight.next(), if !self.in_flight.is_empty() => {
                    self.respond(done).await?;
                    // A high watermark move completes several acks=all produces at
                    // once: their answers go out in one send, not one each. The select
                    // above polls the requests again with this task's waker before it
                    // waits.
                    while let Some(Some(done)) = self.in_flight.next().now_or_never() {
                        self.respond(done).await?;
                    }
                }
                out = &mut work => return out,
            }
        }
    }

    /// Answers the requests in flight, oldest first, until at most `keep` are left. A
    /// request being handled is finished, shutdown or not, as before pipelining.
    async fn answer_down_to(&mut self, keep: usize) -> Result<(), ConnectionError> {
        while self.in_flight.len() > keep {
            let done = match self.in_flight.next().now_or_never() {
                Some(done) => done,
                None => {
                    if self.unflushed {
                        self.flush().await?;
                    }
                    self.in_flight.next().await
                }
            };
            let Some(done) = done else { break };
            self.respond(done).await?;
        }
        Ok(())
    }

    async fn flush(&mut self) -> Result<(), ConnectionError> {
        flush_within(&mut self.writer, self.limits.connections_max_idle).await?;
        self.unflushed = false;
        Ok(())
    }

    /// Writes a handled request's response (unflushed) and takes its metrics; a handler's
    /// refusal closes the connection.
    async fn respond(&mut self, done: Handled) -> Result<(), ConnectionError> {
        let idle = self.limits.connections_max_idle;
        let reply = match done.response {
            Ok(reply) => reply,
            Err(reason) => {
                let _ = tokio::time::timeout(idle, self.writer.flush()).await;
                return Err(ConnectionError::Protocol(reason));
            }
        };
        self.served_one = true;
        let throttled = !reply.throttle.is_zero();
        if throttled && reply.hold_response {
            if self.unflushed {
                self.flush().await?;
            }
            tokio::select! {
                _ = tokio::time::sleep(reply.throttle) => {}
                _ = self.shutdown.changed() => return Err(ConnectionError::Shutdown),
            }
        }
        // When the response began to be written: later than `handled` when a quota holds
        // it back or an earlier request's response was not done (Kafka's response queue
        // time).
        let writing = Instant::now();
        if let Some(chunks) = &reply.chunks {
            write_chunks(&mut self.writer, chunks, idle).await?;
            self.unflushed = true;
        }
        if throttled && !reply.hold_response {
            // Muted: the response goes out now, the next request is read after the throttle.
            let until = Instant::now() + reply.throttle;
            self.muted_until = Some(self.muted_until.map_or(until, |t| t.max(until)));
        }
        let api = metrics::global().requests.api(done.api_key);
        let parked_at = done.parked_at.unwrap_or(done.handled);
        metrics::inc(&api.requests);
        api.request_queue.observe(done.dequeued - done.received);
        api.local
            .observe(parked_at.saturating_duration_since(done.dequeued));
        api.remote
            .observe(done.handled.saturating_duration_since(parked_at));
        api.response_queue
            .observe(writing.saturating_duration_since(done.handled));
        api.send.observe(writing.elapsed());
        api.total.observe(done.received.elapsed());
        api.throttle_time.observe(reply.throttle);
        Ok(())
    }

    /// Writes a SASL exchange's answer (no request is in flight then).
    async fn write_frame(&mut self, body: &[u8]) -> Result<(), ConnectionError> {
        let idle = self.limits.connections_max_idle;
        let len = i32::try_from(body.len()).unwrap_or(i32::MAX);
        write_within(&mut self.writer, &len.to_be_bytes(), idle).await?;
        write_within(&mut self.writer, body, idle).await?;
        self.unflushed = true;
        Ok(())
    }
}

/// Serves requests until the connection ends (`None`) or pauses to move to another
/// network thread (see `threads`).
#[allow(clippy::too_many_arguments)]
async fn serve_requests<'a, H: RequestHandler, R: AsyncRead + Unpin, W: ResponseWriter>(
    mut frames: FrameReader<R>,
    mut out: Responder<'a, W>,
    mut session: Session,
    carried: Carried,
    mut placement: Option<Placement>,
    security: &ListenerSecurity,
    handler: Arc<H>,
    pools: &'a RequestPools,
) -> Result<Option<Paused<R, W>>, ConnectionError> {
    let limits = out.limits;
    let Carried {
        mut sasl,
        mut generation,
        ..
    } = carried;
    loop {
        while let Some(until) = out.muted_until.take() {
            out.answering(
                async {
                    tokio::time::sleep_until(until.into()).await;
                    Ok(())
                },
                false,
            )
            .await?;
        }
        // Between two requests, with no SASL exchange under way: move if the data
        // requests keep naming another thread's partitions. What is in flight is
        // answered first, so that the answers still go out in order.
        let target = placement
            .as_mut()
            .and_then(|p| p.observe(&session.affinity));
        if let Some(target) = target.filter(|_| {
            sasl.as_ref()
                .is_none_or(|a| !a.exchanging() && !a.expects_raw_token())
        }) {
            out.answer_down_to(0).await?;
            out.flush().await?;
            if out.muted_until.is_none() {
                return Ok(Some(Paused {
                    reader: frames.reader,
                    buf: frames.buf,
                    writer: out.writer,
                    session,
                    carried: Carried {
                        sasl,
                        generation,
                        served_one: out.served_one,
                    },
                    target,
                }));
            }
            continue;
        }
        let Some(size) = out.answering(frames.next_size(), false).await? else {
            out.answer_down_to(0).await?;
            out.flush().await?;
            return Ok(None);
        };
        // Until a SASL connection has authenticated, every frame is held to the
        // pre-authentication limit and none is charged to the pool (see the module docs).
        // A re-authentication's frames are held to it as well (KIP-368).
        let trusted = out.served_one
            && sasl
                .as_ref()
                .is_none_or(|a| a.principal().is_some() && !a.exchanging());
        let size = check_size(size, trusted, limits)?;
        // Back-pressure: until the byte pool has room this connection reads nothing more.
        let bytes = if trusted {
            let permit = out
                .answering(
                    async {
                        acquire_bytes(pools, size)
                            .await
                            .ok_or(ConnectionError::Shutdown)
                    },
                    false,
                )
                .await?;
            Some(permit)
        } else {
            None
        };
        let frame = out.answering(frames.frame(size), false).await?;
        // Kafka's request clock starts when the whole request has been read.
        let received = Instant::now();
        if let Some(auth) = sasl.as_mut().filter(|a| a.expects_raw_token()) {
            out.answer_down_to(0).await?;
            // After a v0 SaslHandshake the tokens come as bare frames (before KIP-152).
            let verdict = auth.raw_token(&frame, AuthTime::now(), |name| {
                handler.scram_credential(name)
            });
            match verdict {
                Verdict::Respond(token) => {
                    out.write_frame(&token).await?;
                    if let Some(p) = auth.principal() {
                        session.principal = Arc::from(p);
                        session.token_authenticated = auth.token_authenticated();
                    }
                    out.served_one = true;
                    continue;
                }
                Verdict::Close { reason, .. } => {
                    let _ = out.flush().await;
                    return Err(ConnectionError::Protocol(reason));
                }
                Verdict::Expired => return Err(expired()),
                Verdict::Pass => {}
            }
        }
        let mut body = frame;
        let (header, api_key) = decode_request_header(&mut body)
            .map_err(|e| ConnectionError::Protocol(format!("request header: {e}")))?;
        // A Produce after a Produce starts as soon as the one before it has appended; any
        // other request waits until everything before it has been answered, as in Kafka.
        let pipelined = trusted && api_key == Some(ApiKey::Produce);
        if !pipelined {
            out.answer_down_to(0).await?;
        }
        let verdict = match sasl.as_mut() {
            Some(auth) => auth.request(
                header.request_api_key,
                header.request_api_version,
                header.correlation_id,
                &mut body,
                AuthTime::now(),
                |name| handler.scram_credential(name),
            ),
            // Kafka answers SaslHandshake on a listener without SASL with
            // ILLEGAL_SASL_STATE; closing says as much to a client and costs less.
            None if matches!(
                api_key,
                Some(ApiKey::SaslHandshake | ApiKey::SaslAuthenticate)
            ) =>
            {
                Verdict::Close {
                    response: None,
                    reason: format!("SASL request on the {} listener", security.name),
                }
            }
            None => Verdict::Pass,
        };
        if !matches!(verdict, Verdict::Pass) {
            out.answer_down_to(0).await?;
        }
        match verdict {
            Verdict::Pass => {}
            Verdict::Respond(body) => {
                out.write_frame(&body).await?;
                if let Some(auth) = sasl.as_ref() {
                    if let Some(p) = auth.principal() {
                        session.principal = Arc::from(p);
                        session.token_authenticated = auth.token_authenticated();
                    }
                }
                out.served_one = true;
                continue;
            }
            Verdict::Close { response, reason } => {
                if let Some(body) = response {
                    out.write_frame(&body).await?;
                    let _ = out.flush().await;
                    let mut shutdown = out.shutdown.clone();
                    tokio::select! {
                        _ = tokio::time::sleep(limits.failed_authentication_delay) => {}
                        _ = shutdown.changed() => {}
                    }
                }
                return Err(ConnectionError::Protocol(reason));
            }
            Verdict::Expired => return Err(expired()),
        }
        let slot = out
            .answering(
                async {
                    pools
                        .requests
                        .clone()
                        .acquire_owned()
                        .await
                        .map_err(|_| ConnectionError::Shutdown)
                },
                false,
            )
            .await?;
        let dequeued = Instant::now();
        let now = handler.connection_generation();
        if *generation.get_or_insert(now) != now {
            out.answer_down_to(0).await?;
            let _ = out.flush().await;
            return Err(ConnectionError::Protocol(
                "the server's answers on this connection may be stale; start over".into(),
            ));
        }
        // A pipelined Produce gives its frame's bytes back to the pool once it has
        // appended, as Kafka releases a request's buffer when its handler returns
        // (before the purgatory): the pool bounds requests being read and worked on, and
        // a Produce waiting for its replicas must not keep the followers' fetches out.
        let (settled, appended, bytes, held_until_appended) = match pipelined {
            true => {
                let (tx, rx) = tokio::sync::oneshot::channel();
                (Some(tx), Some(rx), None, bytes)
            }
            false => (None, None, bytes, None),
        };
        let handler = handler.clone();
        let request_session = session.clone();
        out.in_flight.push_back(Box::pin(async move {
            // The slot goes back when the request ends or parks (see `request_slot`).
            let (response, parked_at) = request_slot::holding_settled(
                slot,
                settled,
                // Boxed on its own: each layer of future around it would hold it twice
                // (rustc keeps an async fn's argument beside the state that moved it).
                Box::pin(handler.handle_request(&header, api_key, body, &request_session)),
            )
            .await;
            let handled = Instant::now();
            drop(bytes);
            Handled {
                api_key: header.request_api_key,
                response,
                received,
                dequeued,
                parked_at,
                handled,
            }
        }));
        match appended {
            Some(appended) => {
                // Whether it appended or ended, the next Produce may start.
                out.answering(
                    async {
                        let _ = appended.await;
                        Ok(())
                    },
                    true,
                )
                .await?;
                drop(held_until_appended);
                out.answer_down_to(MAX_PIPELINED_PRODUCES - 1).await?;
            }
            None => out.answer_down_to(0).await?,
        }
    }
}

async fn flush_within<W: AsyncWrite + Unpin>(
    writer: &mut W,
    idle: Duration,
) -> Result<(), ConnectionError> {
    match tokio::time::timeout(idle, writer.flush()).await {
        Ok(r) => Ok(r?),
        Err(_) => Err(ConnectionError::Idle(idle)),
    }
}

/// Checks a size prefix against the cap that applies to this connection now.
/// A SASL session past its end whose client sent something other than a
/// re-authentication (KIP-368): closed without an answer, as Kafka closes it.
fn expired() -> ConnectionError {
    crate::metrics::global()
        .network
        .expired_connections_killed
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    ConnectionError::Protocol(
        "the SASL session ended (connections.max.reauth.ms or the token's expiry) and the \
         client did not re-authenticate"
            .into(),
    )
}

fn check_size(
    size: i32,
    trusted: bool,
    limits: &ConnectionLimits,
) -> Result<usize, ConnectionError> {
    if size < 0 {
        return Err(FrameError::NegativeSize(size).into());
    }
    let size = size as usize;
    if !trusted && size > limits.first_request_max_bytes {
        return Err(ConnectionError::FirstFrameTooLarge {
            size,
            max: limits.first_request_max_bytes,
        });
    }
    if size > limits.socket_request_max_bytes {
        return Err(FrameError::TooLarge {
            size,
            max: limits.socket_request_max_bytes,
        }
        .into());
    }
    Ok(size)
}

/// A frame's `size` bytes (clamped to the pool) from the byte pool; `None` only if the
/// pool was closed.
async fn acquire_bytes(pools: &RequestPools, size: usize) -> Option<PooledBytes<'_>> {
    let want = (FRAME_PREFIX_LEN + size).min(pools.bytes_cap as usize) as u32;
    let permit = pools.bytes.acquire_many(want).await.ok()?;
    let used = &metrics::global().network.memory_pool_used_bytes;
    used.fetch_add(i64::from(want), std::sync::atomic::Ordering::Relaxed);
    Some(PooledBytes {
        _permit: permit,
        used,
        bytes: want,
    })
}

/// A frame's share of the byte pool, given back (and taken off Kafka's `MemoryPoolUsed`)
/// when the request is done with its bytes.
struct PooledBytes<'a> {
    _permit: tokio::sync::SemaphorePermit<'a>,
    used: &'static std::sync::atomic::AtomicI64,
    bytes: u32,
}

impl Drop for PooledBytes<'_> {
    fn drop(&mut self) {
        self.used
            .fetch_sub(i64::from(self.bytes), std::sync::atomic::Ordering::Relaxed);
    }
}

/// Writes a response made of chunks: the bytes before each file range corked, the
/// range with `sendfile` straight from the page cache, the bytes after the last range
/// through the buffer (see the module note).
async fn write_chunks<W: ResponseWriter>(
    writer: &mut W,
    chunks: &[ResponseChunk],
    idle: Duration,
) -> Result<(), ConnectionError> {
    if writer.zero_copy_socket().is_none() {
        // TLS: every byte goes through the stream, the file ranges read in pieces.
        for chunk in chunks {
            match chunk {
                ResponseChunk::Bytes(b) => write_within(writer, b, idle).await?,
                ResponseChunk::File { file, offset, len } => {
                    let end = offset.saturating_add(*len as u64);
                    copy_file(writer, file, *offset, end, idle).await?;
                }
            }
        }
        return Ok(());
    }
    let mut rest = chunks;
    while !rest.is_empty() {
        let bytes = rest
            .iter()
            .take_while(|c| matches!(c, ResponseChunk::Bytes(_)))
            .count();
        let (run, after) = rest.split_at(bytes);
        let Some((ResponseChunk::File { file, offset, len }, after)) = after.split_first() else {
            for chunk in run {
                if let ResponseChunk::Bytes(b) = chunk {
                    write_within(writer, b, idle).await?;
                }
            }
            return Ok(());
        };
        rest = after;
        // An earlier pipelined response may still be buffered: it goes first.
        flush_within(writer, idle).await?;
        let Some(socket) = writer.zero_copy_socket() else {
            return Err(ConnectionError::Protocol("no socket for sendfile".into()));
        };
        let slices: Vec<&[u8]> = run
            .iter()
            .filter_map(|c| match c {
                ResponseChunk::Bytes(b) => Some(&b[..]),
                ResponseChunk::File { .. } => None,
            })
            .collect();
        send_corked(socket, &slices, idle).await?;
        let end = offset.saturating_add(*len as u64);
        let sent = send_file(socket, file, *offset, end, idle).await?;
        if sent < end {
            copy_file(writer, file, sent, end, idle).await?;
        }
    }
    Ok(())
}

/// Sends `parts` with `MSG_MORE`: the kernel holds them until the next send without the
/// flag (the `sendfile` that follows, whose last piece pushes), so that they go out in
/// the same segment as the file's first bytes.
async fn send_corked(
    socket: &TcpStream,
    parts: &[&[u8]],
    idle: Duration,
) -> Result<(), ConnectionError> {
    let mut slices: Vec<std::io::IoSlice<'_>> = parts
        .iter()
        .filter(|p| !p.is_empty())
        .map(|p| std::io::IoSlice::new(p))
        .collect();
    let mut rest = &mut slices[..];
    let flags = rustix::net::SendFlags::MORE | rustix::net::SendFlags::NOSIGNAL;
    while !rest.is_empty() {
        match tokio::time::timeout(idle, socket.writable()).await {
            Ok(r) => r?,
            Err(_) => return Err(ConnectionError::Idle(idle)),
        }
        let sent = socket.try_io(Interest::WRITABLE, || {
            let mut control = rustix::net::SendAncillaryBuffer::default();
            rustix::net::sendmsg(socket, rest, &mut control, flags).map_err(Into::into)
        });
        match sent {
            Ok(0) => return Err(std::io::Error::from(std::io::ErrorKind::WriteZero).into()),
            Ok(n) => std::io::IoSlice::advance_slices(&mut rest, n),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Sends `[offset, end)` of `file` with `sendfile`, handling partial writes and a full
/// socket buffer. Returns where it stopped: `end`, or earlier when the kernel cannot
/// `sendfile` to this socket (EINVAL, ENOSYS before any byte went), for the copying path.
/// A file that ends early (it was truncated under us) closes the connection: a short
/// frame would desynchronise the peer.
async fn send_file(
    socket: &TcpStream,
    file: &File,
    mut offset: u64,
    end: u64,
    idle: Duration,
) -> Result<u64, ConnectionError> {
    let start = offset;
    while offset < end {
        match tokio::time::timeout(idle, socket.writable()).await {
            Ok(r) => r?,
            Err(_) => return Err(ConnectionError::Idle(idle)),
        }
        // Linux sends at most 0x7ffff000 bytes per call.
        let count = (end - offset).min(0x7fff_f000) as usize;
        let sent = socket.try_io(Interest::WRITABLE, || {
            rustix::fs::sendfile(socket, file, Some(&mut offset), count).map_err(Into::into)
        });
        match sent {
            Ok(0) => {
                return Err(ConnectionError::Protocol(format!(
                    "segment file ended {} bytes early under a fetch response",
                    end - offset
                )))
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) if offset == start && unsupported(&e) => return Ok(offset),
            Err(e) => return Err(e.into()),
        }
    }
    Ok(offset)
}

fn unsupported(e: &std::io::Error) -> bool {
    let raw = e.raw_os_error();
    raw == Some(rustix::io::Errno::INVAL.raw_os_error())
        || raw == Some(rustix::io::Errno::NOSYS.raw_os_error())
}

/// The fallback for sockets `sendfile` refuses: the range read in pieces and written.
async fn copy_file<W: AsyncWrite + Unpin>(
    writer: &mut W,
    file: &File,
    mut offset: u64,
    end: u64,
    idle: Duration,
) -> Result<(), ConnectionError> {
    let mut buf = vec![0u8; 64 * 1024];
    while offset < end {
        let n = ((end - offset) as usize).min(buf.len());
        let piece = buf.get_mut(..n).unwrap_or_default();
        file.read_exact_at(piece, offset)?;
        write_within(writer, piece, idle).await?;
        offset += n as u64;
    }
    Ok(())
}

/// Writes a response; a peer that accepts none of it within the idle limit is closed.
async fn write_within<W: AsyncWrite + Unpin>(
    writer: &mut W,
    data: &[u8],
    idle: Duration,
) -> Result<(), ConnectionError> {
    let mut rest = data;
    while !rest.is_empty() {
        match tokio::time::timeout(idle, writer.write(rest)).await {
            Ok(Ok(0)) => return Err(std::io::Error::from(std::io::ErrorKind::WriteZero).into()),
            Ok(Ok(n)) => rest = rest.get(n..).unwrap_or_default(),
            Ok(Err(e)) => return Err(e.into()),
            Err(_) => return Err(ConnectionError::Idle(idle)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Server;
    use bytes::BufMut;
    use rill_protocol::generated::{ApiVersionsRequest, MetadataRequest, RequestHeader};
    use rill_protocol::{encode_request_frame, ApiKey};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const WAIT: Duration = Duration::from_secs(5);

    async fn server(overrides: &[(&str, &str)]) -> (Server, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let mut config = BrokerConfig::default();
        config.set("listeners", "127.0.0.1:0");
        config.set("log.dirs", &dir.path().display().to_string());
        // Off: tests run in parallel and would all take the default 9644.
        config.set("http.listeners", "");
        for (k, v) in overrides {
            config.set(k, v);
        }
        (Server::start(config).await.unwrap(), dir)
    }

    fn request<B: rill_protocol::Encodable>(
        api: ApiKey,
        version: i16,
        id: i32,
        body: &B,
    ) -> BytesMut {
        let header = RequestHeader {
            request_api_key: api.as_i16(),
            request_api_version: version,
            correlation_id: id,
            client_id: Some("network-test".into()),
            ..Default::default()
        };
        let mut buf = BytesMut::new();
        encode_request_frame(&mut buf, &header, body).unwrap();
        buf
    }

    fn api_versions(id: i32) -> BytesMut {
        request(ApiKey::ApiVersions, 0, id, &ApiVersionsRequest::default())
    }

    /// The correlation id of the next response, or `None` when the server closed.
    async fn response(sock: &mut TcpStream) -> Option<i32> {
        let read = async {
            let size = sock.read_i32().await.ok()?;
            let mut body = vec![0; usize::try_from(size).ok()?];
            sock.read_exact(&mut body).await.ok()?;
            Some(i32::from_be_bytes(body[..4].try_into().unwrap()))
        };
        tokio::time::timeout(WAIT, read)
            .await
            .expect("no answer and no close")
    }

    async fn closed(sock: &mut TcpStream) -> bool {
        let mut byte = [0u8; 1];
        matches!(
            tokio::time::timeout(WAIT, sock.read(&mut byte)).await,
            Ok(Ok(0) | Err(_))
        )
    }

    #[tokio::test]
    async fn huge_and_negative_prefixes_close_before_buffering() {
        let (server, _dir) = server(&[]).await;
        for prefix in [i32::MAX, i32::MIN, -1] {
            let mut sock = TcpStream::connect(server.local_addr).await.unwrap();
            sock.write_all(&prefix.to_be_bytes()).await.unwrap();
            assert!(closed(&mut sock).await, "prefix {prefix}");
        }
        server.shutdown().await;
    }

    #[tokio::test]
    async fn first_frame_over_the_pre_auth_limit_closes_later_ones_pass() {
        let (server, _dir) = server(&[("sasl.server.max.receive.size", "1024")]).await;
        let big = MetadataRequest {
            topics: Some(
                (0..40)
                    .map(
                        |i| rill_protocol::generated::metadata_request::MetadataRequestTopic {
                            name: Some(format!("topic-with-a-long-name-{i:040}")),
                            ..Default::default()
                        },
                    )
                    .collect(),
            ),
            ..Default::default()
        };
        let big = request(ApiKey::Metadata, 1, 2, &big);
        assert!(big.len() > 1024 + 4);

        let mut sock = TcpStream::connect(server.local_addr).await.unwrap();
        sock.write_all(&big).await.unwrap();
        assert_eq!(
            response(&mut sock).await,
            None,
            "first frame over the limit"
        );

        let mut sock = TcpStream::connect(server.local_addr).await.unwrap();
        sock.write_all(&api_versions(1)).await.unwrap();
        assert_eq!(response(&mut sock).await, Some(1));
        sock.write_all(&big).await.unwrap();
        assert_eq!(
            response(&mut sock).await,
            Some(2),
            "limit lifted after one request"
        );
        server.shutdown().await;
    }

    #[tokio::test]
    async fn pipelined_requests_are_answered_in_order() {
        let (server, _dir) = server(&[]).await;
        let mut sock = TcpStream::connect(server.local_addr).await.unwrap();
        let mut all = BytesMut::new();
        for id in 0..50 {
            all.put(api_versions(id));
        }
        sock.write_all(&all).await.unwrap();
        for id in 0..50 {
            assert_eq!(response(&mut sock).await, Some(id));
        }
        server.shutdown().await;
    }

    /// A response that is only its correlation id.
    fn answer(id: i32) -> Reply {
        let mut frame = BytesMut::new();
        frame.put_i32(4);
        frame.put_i32(id);
        Reply::new(Some(vec![ResponseChunk::Bytes(frame.freeze())]))
    }

    /// A handler that notes when each request starts and ends. A Produce settles (as one
    /// that has appended) and then waits until the test releases its correlation id.
    struct Scripted {
        log: Mutex<Vec<(&'static str, i32)>>,
        released: watch::Sender<Vec<i32>>,
    }

    impl RequestHandler for Scripted {
        fn handle_request(
            &self,
            header: &RequestHeader,
            api_key: Option<ApiKey>,
            _body: Bytes,
            _session: &Session,
        ) -> impl std::future::Future<Output = Result<Reply, String>> + Send {
            let id = header.correlation_id;
            let mut released = self.released.subscribe();
            async move {
                self.log.lock().unwrap().push(("start", id));
                if api_key == Some(ApiKey::Produce) {
                    request_slot::settle();
                    released.wait_for(|r| r.contains(&id)).await.unwrap();
                }
                self.log.lock().unwrap().push(("end", id));
                Ok(answer(id))
            }
        }

        fn broker_config_value(&self, _key: &str) -> Option<String> {
            None
        }
    }

    /// Serves `handler` on a plaintext loopback listener until the sender is dropped or
    /// set.
    async fn serve_plaintext<H: RequestHandler>(
        handler: Arc<H>,
        limits: ConnectionLimits,
    ) -> (SocketAddr, watch::Sender<bool>) {
        let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = tcp.local_addr().unwrap();
        let listener = Listener {
            tcp,
            security: Arc::new(ListenerSecurity::plaintext("PLAINTEXT")),
        };
        let (stop, shutdown) = watch::channel(false);
        tokio::spawn(serve(vec![listener], handler, limits, shutdown));
        (addr, stop)
    }

    /// A server with the scripted handler, and a connection to it that has been answered
    /// once (so that its frames are trusted, which pipelining asks).
    async fn scripted_server() -> (Arc<Scripted>, TcpStream, watch::Sender<bool>) {
        let handler = Arc::new(Scripted {
            log: Mutex::new(Vec::new()),
            released: watch::channel(Vec::new()).0,
        });
        let (addr, stop) = serve_plaintext(handler.clone(), ConnectionLimits::default()).await;
        let mut sock = TcpStream::connect(addr).await.unwrap();
        sock.write_all(&api_versions(0)).await.unwrap();
        assert_eq!(response(&mut sock).await, Some(0));
        (handler, sock, stop)
    }

    fn produce(id: i32) -> BytesMut {
        request(
            ApiKey::Produce,
            9,
            id,
            &rill_protocol::generated::ProduceRequest::default(),
        )
    }

    async fn until(what: &str, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + WAIT;
        while !done() {
            assert!(Instant::now() < deadline, "never: {what}");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    #[tokio::test]
    async fn a_produce_that_appended_lets_the_next_produce_start_and_answers_stay_in_order() {
        let (handler, mut sock, _stop) = scripted_server().await;
        let mut all = BytesMut::new();
        all.put(produce(1));
        all.put(produce(2));
        all.put(request(
            ApiKey::Metadata,
            12,
            3,
            &MetadataRequest::default(),
        ));
        sock.write_all(&all).await.unwrap();
        let started = |id| handler.log.lock().unwrap().contains(&("start", id));
        until("the second Produce starts while the first waits", || {
            started(2)
        })
        .await;
        // Anything else waits for the answers before it.
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!started(3), "{:?}", handler.log.lock().unwrap());
        // The second is done first; its answer still waits for the first's.
        handler.released.send_modify(|r| r.push(2));
        until("the second Produce ends", || {
            handler.log.lock().unwrap().contains(&("end", 2))
        })
        .await;
        let early = tokio::time::timeout(Duration::from_millis(50), sock.read_i32()).await;
        assert!(
            early.is_err(),
            "an answer before the first Produce's: {early:?}"
        );
        handler.released.send_modify(|r| r.push(1));
        for id in 1..=3 {
            assert_eq!(response(&mut sock).await, Some(id));
        }
        let log = handler.log.lock().unwrap().clone();
        let at = |e| log.iter().position(|x| *x == e).unwrap();
        assert!(at(("start", 3)) > at(("end", 1)) && at(("start", 3)) > at(("end", 2)));
    }

    /// A handler whose Produce requests all name partitions of network thread 1, and
    /// which notes the thread and connection each request was served on.
    #[derive(Default)]
    struct Placing {
        served: Mutex<Vec<(i32, Option<String>, u64)>>,
    }

    impl RequestHandler for Placing {
        fn handle_request(
            &self,
            header: &RequestHeader,
            api_key: Option<ApiKey>,
            _body: Bytes,
            session: &Session,
        ) -> impl std::future::Future<Output = Result<Reply, String>> + Send {
            let id = header.correlation_id;
            if api_key == Some(ApiKey::Produce) {
                session.affinity.vote([3]);
            }
            self.served.lock().unwrap().push((
                id,
                std::thread::current().name().map(str::to_owned),
                session.connection_id,
            ));
            async move { Ok(answer(id)) }
        }

        fn broker_config_value(&self, _key: &str) -> Option<String> {
            None
        }
    }

    #[tokio::test]
    async fn a_connection_moves_to_the_thread_of_its_partitions_between_requests() {
        let handler = Arc::new(Placing::default());
        let limits = ConnectionLimits {
            network_threads: 2,
            ..ConnectionLimits::default()
        };
        let (addr, _stop) = serve_plaintext(handler.clone(), limits).await;
        // The first connection goes to thread 0.
        let mut sock = TcpStream::connect(addr).await.unwrap();
        sock.write_all(&api_versions(0)).await.unwrap();
        assert_eq!(response(&mut sock).await, Some(0));
        // Twenty requests in one write: the move happens with the rest of them read
        // and not yet served, and they go along.
        let mut all = BytesMut::new();
        for id in 1..=20 {
            all.put(produce(id));
        }
        sock.write_all(&all).await.unwrap();
        for id in 1..=20 {
            assert_eq!(response(&mut sock).await, Some(id));
        }
        // Still the same connection, served on.
        sock.write_all(&api_versions(21)).await.unwrap();
        assert_eq!(response(&mut sock).await, Some(21));
        let served = handler.served.lock().unwrap().clone();
        assert_eq!(served.len(), 22, "{served:?}");
        let ids: Vec<i32> = served.iter().map(|s| s.0).collect();
        assert_eq!(ids, (0..=21).collect::<Vec<_>>(), "served in order");
        assert!(served.iter().all(|s| s.2 == served[0].2), "one connection");
        let thread = |id: usize| served[id].1.as_deref();
        assert_eq!(thread(0), Some("rill-network-0"));
        let moved = (1..=21)
            .find(|&id| thread(id) == Some("rill-network-1"))
            .expect("never moved");
        assert!(
            moved > threads::MOVE_AFTER as usize,
            "moved after {moved} requests"
        );
        assert!(
            (moved..=21).all(|id| thread(id) == Some("rill-network-1")),
            "{served:?}"
        );
    }

    /// A writer that keeps what it is given and counts its flushes (the sends a
    /// `BufWriter` around a socket would make).
    #[derive(Default)]
    struct CountingWriter {
        written: Vec<u8>,
        flushes: usize,
    }

    impl AsyncWrite for CountingWriter {
        fn poll_write(
            mut self: Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            buf: &[u8],
        ) -> std::task::Poll<std::io::Result<usize>> {
            self.written.extend_from_slice(buf);
            std::task::Poll::Ready(Ok(buf.len()))
        }

        fn poll_flush(
            mut self: Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            self.flushes += 1;
            std::task::Poll::Ready(Ok(()))
        }

        fn poll_shutdown(
            self: Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
    }

    impl ResponseWriter for CountingWriter {
        fn zero_copy_socket(&self) -> Option<&TcpStream> {
            None
        }
    }

    #[tokio::test]
    async fn answers_completed_together_go_out_in_one_flush() {
        let limits = ConnectionLimits::default();
        let (_shutdown_tx, shutdown) = watch::channel(false);
        let mut out = Responder {
            writer: CountingWriter::default(),
            limits: &limits,
            shutdown,
            in_flight: FuturesOrdered::new(),
            unflushed: false,
            muted_until: None,
            served_one: false,
        };
        // Three pipelined produces waiting for one high watermark move.
        let (moved_tx, moved) = watch::channel(false);
        for id in 0u8..3 {
            let mut moved = moved.clone();
            out.in_flight.push_back(Box::pin(async move {
                let _ = moved.wait_for(|m| *m).await;
                let now = Instant::now();
                Handled {
                    api_key: ApiKey::Produce.as_i16(),
                    response: Ok(Reply::new(Some(vec![ResponseChunk::Bytes(Bytes::from(
                        vec![id; 4],
                    ))]))),
                    received: now,
                    dequeued: now,
                    parked_at: None,
                    handled: now,
                }
            }));
        }
        // The connection waits for its next request meanwhile; the move comes first.
        let (next_tx, next) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let _ = moved_tx.send(true);
            tokio::time::sleep(Duration::from_millis(50)).await;
            let _ = next_tx.send(());
        });
        out.answering(
            async {
                let _ = next.await;
                Ok(())
            },
            false,
        )
        .await
        .unwrap();
        assert_eq!(out.writer.written, [[0u8; 4], [1; 4], [2; 4]].concat());
        assert_eq!(
            out.writer.flushes, 1,
            "three answers ready at once were sent apart"
        );
    }

    #[tokio::test]
    async fn no_more_than_five_produces_are_pipelined() {
        let (handler, mut sock, _stop) = scripted_server().await;
        let mut all = BytesMut::new();
        for id in 1..=7 {
            all.put(produce(id));
        }
        sock.write_all(&all).await.unwrap();
        let starts = || {
            let log = handler.log.lock().unwrap();
            log.iter()
                .filter(|(what, id)| *what == "start" && *id > 0)
                .count()
        };
        until("five Produce requests start", || starts() == 5).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(starts(), MAX_PIPELINED_PRODUCES);
        handler.released.send_modify(|r| r.push(1));
        assert_eq!(response(&mut sock).await, Some(1));
        until("the sixth starts once the first is answered", || {
            starts() == 6
        })
        .await;
        handler.released.send_modify(|r| r.extend(2..=7));
        for id in 2..=7 {
            assert_eq!(response(&mut sock).await, Some(id));
        }
    }

    async fn admitted(addr: SocketAddr) -> Option<TcpStream> {
        let mut sock = TcpStream::connect(addr).await.ok()?;
        sock.write_all(&api_versions(9)).await.ok()?;
        (response(&mut sock).await == Some(9)).then_some(sock)
    }

    #[tokio::test]
    async fn max_connections_refuses_at_accept() {
        for key in ["max.connections", "max.connections.per.ip"] {
            let (server, _dir) = server(&[(key, "2")]).await;
            let a = admitted(server.local_addr).await.unwrap();
            let _b = admitted(server.local_addr).await.unwrap();
            assert!(
                admitted(server.local_addr).await.is_none(),
                "{key}: third admitted"
            );
            drop(a);
            // The slot comes back when the server notices the close.
            let mut again = None;
            for _ in 0..50 {
                again = admitted(server.local_addr).await;
                if again.is_some() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            assert!(again.is_some(), "{key}: slot not released");
            server.shutdown().await;
        }
    }

    fn connection_quotas(epoch: std::time::Instant) -> Arc<Mutex<ConnectionQuotas>> {
        Arc::new(Mutex::new(ConnectionQuotas {
            total: 0,
            per_ip: HashMap::new(),
            created: crate::rate::Rate::default(),
            created_per_ip: HashMap::new(),
            windows: crate::rate::QuotaWindows {
                samples: 2,
                window: Duration::from_secs(1),
            },
            epoch,
        }))
    }

    #[test]
    fn connection_creation_rates_throttle_an_address_and_pause_the_acceptor() {
        let t0 = std::time::Instant::now();
        let quotas = connection_quotas(t0);
        let limits = LiveConnectionLimits {
            max_connections: usize::MAX,
            max_connections_per_ip: usize::MAX,
            max_connection_creation_rate: 1000.0,
        };
        let overrides = PerIpOverrides::default();
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let other: IpAddr = "10.0.0.2".parse().unwrap();
        // Two samples of 1 s: a fresh rate spans 1 s, so 3 connections at once are 3/s,
        // within a quota of 3; the 4th is over by a third: closed after 333 ms, and not
        // counted.
        let mut open = Vec::new();
        for _ in 0..3 {
            let (slot, pause) = admit(&quotas, limits, &overrides, ip, Some(3.0), t0).unwrap();
            assert_eq!(pause, Duration::ZERO);
            open.push(slot);
        }
        let refused = admit(&quotas, limits, &overrides, ip, Some(3.0), t0);
        assert_eq!(
            refused.err(),
            Some(Refusal::Throttled(Duration::from_millis(333)))
        );
        assert!(admit(&quotas, limits, &overrides, other, None, t0).is_ok());
        let later = t0 + Duration::from_secs(2);
        assert!(admit(&quotas, limits, &overrides, ip, Some(3.0), later).is_ok());

        // max.connection.creation.rate: the connection over it is served, and the
        // acceptor pauses for the throttle.
        let quotas = connection_quotas(t0);
        let limits = LiveConnectionLimits {
            max_connection_creation_rate: 2.0,
            ..limits
        };
        assert_eq!(
            admit(&quotas, limits, &overrides, ip, None, t0).unwrap().1,
            Duration::ZERO
        );
        assert_eq!(
            admit(&quotas, limits, &overrides, ip, None, t0).unwrap().1,
            Duration::ZERO
        );
        let (_slot, pause) = admit(&quotas, limits, &overrides, ip, None, t0).unwrap();
        assert_eq!(pause, Duration::from_millis(500));
    }

    #[tokio::test]
    async fn idle_and_stalled_connections_are_closed() {
        let (server, _dir) = server(&[("connections.max.idle.ms", "200")]).await;
        let mut idle = TcpStream::connect(server.local_addr).await.unwrap();
        let mut stalled = TcpStream::connect(server.local_addr).await.unwrap();
        // A frame that promises 100 bytes and delivers 3.
        stalled.write_all(&[0, 0, 0, 100, 0, 18, 0]).await.unwrap();
        let started = std::time::Instant::now();
        assert!(closed(&mut idle).await);
        assert!(closed(&mut stalled).await);
        assert!(started.elapsed() < Duration::from_secs(3));
        server.shutdown().await;
    }

    #[tokio::test]
    async fn the_byte_pool_waits_and_clamps() {
        let limits = ConnectionLimits {
            queued_max_request_bytes: 100,
            queued_max_requests: 2,
            ..ConnectionLimits::default()
        };
        let pools = RequestPools::new(&limits);
        // Larger than the pool: clamped, so it can still be served alone.
        let first = acquire_bytes(&pools, 1_000).await.unwrap();
        let second = acquire_bytes(&pools, 10);
        tokio::pin!(second);
        assert!(tokio::time::timeout(Duration::from_millis(50), &mut second)
            .await
            .is_err());
        drop(first);
        let _second = tokio::time::timeout(WAIT, second).await.unwrap().unwrap();
        assert_eq!(pools.bytes.available_permits(), 100 - 14);
    }

    #[tokio::test]
    async fn stalled_frames_hold_no_request_slot() {
        let (server, _dir) = server(&[("queued.max.requests", "2")]).await;
        let mut stalled = Vec::new();
        for _ in 0..4 {
            let mut sock = TcpStream::connect(server.local_addr).await.unwrap();
            sock.write_all(&api_versions(1)).await.unwrap();
            assert_eq!(response(&mut sock).await, Some(1));
            // A frame that promises 50 bytes and delivers 2.
            sock.write_all(&[0, 0, 0, 50, 0, 18]).await.unwrap();
            stalled.push(sock);
        }
        assert!(admitted(server.local_addr).await.is_some());
        server.shutdown().await;
    }

    /// Creates a one-partition topic over `sock` (correlation id 1) and waits for the answer.
    async fn create_topic(sock: &mut TcpStream, name: &str) {
        use rill_protocol::generated::create_topics_request::{
            CreatableTopic, CreateTopicsRequest,
        };
        let create = CreateTopicsRequest {
            topics: vec![CreatableTopic {
                name: name.into(),
                num_partitions: 1,
                replication_factor: 1,
                ..Default::default()
            }],
            timeout_ms: 5_000,
            ..Default::default()
        };
        sock.write_all(&request(ApiKey::CreateTopics, 4, 1, &create))
            .await
            .unwrap();
        response_body(sock).await;
    }

    #[tokio::test]
    async fn parked_fetches_hold_no_request_slot() {
        use rill_protocol::generated::fetch_request::{FetchPartition, FetchRequest, FetchTopic};

        let (server, _dir) = server(&[("queued.max.requests", "2")]).await;
        let mut admin = TcpStream::connect(server.local_addr).await.unwrap();
        create_topic(&mut admin, "quiet").await;
        // Four fetches of an empty partition, each parked for a minute: twice the slots.
        let fetch = FetchRequest {
            replica_id: -1,
            max_wait_ms: 60_000,
            min_bytes: 1,
            max_bytes: 1 << 20,
            topics: vec![FetchTopic {
                topic: "quiet".into(),
                partitions: vec![FetchPartition {
                    partition: 0,
                    fetch_offset: 0,
                    partition_max_bytes: 1 << 20,
                    current_leader_epoch: -1,
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        };
        let mut parked = Vec::new();
        for id in 0..4 {
            let mut sock = admitted(server.local_addr).await.unwrap();
            sock.write_all(&request(ApiKey::Fetch, 4, id, &fetch))
                .await
                .unwrap();
            parked.push(sock);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        // Others are still served, well before the fetches' minute is up...
        for _ in 0..3 {
            assert!(admitted(server.local_addr).await.is_some());
        }
        admin.write_all(&api_versions(7)).await.unwrap();
        assert_eq!(response(&mut admin).await, Some(7));
        // ...and the fetches are still parked.
        let mut byte = [0u8; 1];
        let early = tokio::time::timeout(Duration::from_millis(100), parked[0].read(&mut byte));
        assert!(early.await.is_err(), "a parked fetch was answered early");
        server.shutdown().await;
    }

    /// The body of the next response frame, without its size prefix.
    async fn response_body<S: AsyncRead + Unpin>(sock: &mut S) -> Bytes {
        let size = tokio::time::timeout(WAIT, sock.read_i32())
            .await
            .unwrap()
            .unwrap();
        let mut body = vec![0; usize::try_from(size).unwrap()];
        tokio::time::timeout(WAIT, sock.read_exact(&mut body))
            .await
            .unwrap()
            .unwrap();
        Bytes::from(body)
    }

    /// The brokers' ports a Metadata v1 response names.
    fn metadata_ports(mut body: Bytes) -> Vec<i32> {
        use rill_protocol::Decodable;
        body.advance(4); // correlation id
        let response = rill_protocol::generated::MetadataResponse::decode(&mut body, 1).unwrap();
        response.brokers.iter().map(|b| b.port).collect()
    }

    #[tokio::test]
    async fn a_sasl_listener_gates_requests_and_metadata_names_each_listener() {
        let (server, _dir) = server(&[
            (
                "listeners",
                "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
            ),
            (
                "plain.sasl.jaas.config",
                "PlainLoginModule required user_alice=\"pw\";",
            ),
        ])
        .await;
        let names: Vec<&str> = server.listeners.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["PLAINTEXT", "SASL_PLAINTEXT"]);
        let plain = server.listeners[0].1;
        let sasl = server.listeners[1].1;
        let metadata = || {
            request(
                ApiKey::Metadata,
                1,
                9,
                &MetadataRequest {
                    topics: Some(vec![]),
                    ..Default::default()
                },
            )
        };
        let mut sock = TcpStream::connect(plain).await.unwrap();
        sock.write_all(&metadata()).await.unwrap();
        assert_eq!(
            metadata_ports(response_body(&mut sock).await),
            [i32::from(plain.port())]
        );

        // Before authentication: ApiVersions passes, Metadata closes.
        let mut sock = TcpStream::connect(sasl).await.unwrap();
        sock.write_all(&api_versions(1)).await.unwrap();
        assert_eq!(response(&mut sock).await, Some(1));
        sock.write_all(&metadata()).await.unwrap();
        assert!(closed(&mut sock).await);
        // Before authentication every frame is held to the pre-authentication limit,
        // not only the first.
        let mut sock = TcpStream::connect(sasl).await.unwrap();
        sock.write_all(&api_versions(1)).await.unwrap();
        assert_eq!(response(&mut sock).await, Some(1));
        sock.write_all(&(600 * 1024i32).to_be_bytes())
            .await
            .unwrap();
        assert!(closed(&mut sock).await);

        // PLAIN, then Metadata names the SASL listener's port.
        let mut sock = TcpStream::connect(sasl).await.unwrap();
        let handshake = rill_protocol::generated::SaslHandshakeRequest {
            mechanism: "PLAIN".into(),
        };
        sock.write_all(&request(ApiKey::SaslHandshake, 1, 2, &handshake))
            .await
            .unwrap();
        assert_eq!(response(&mut sock).await, Some(2));
        let auth = rill_protocol::generated::SaslAuthenticateRequest {
            auth_bytes: Bytes::from_static(b"\0alice\0pw"),
            ..Default::default()
        };
        sock.write_all(&request(ApiKey::SaslAuthenticate, 1, 3, &auth))
            .await
            .unwrap();
        let body = response_body(&mut sock).await;
        assert_eq!(&body[4..6], &[0, 0], "SaslAuthenticate error code");
        sock.write_all(&metadata()).await.unwrap();
        assert_eq!(
            metadata_ports(response_body(&mut sock).await),
            [i32::from(sasl.port())]
        );
        server.shutdown().await;
    }

    /// A CA, and a key with a certificate for `localhost` only (server and client use),
    /// written as a PEM keystore; returns (keystore, CA file).
    fn broker_pki(dir: &std::path::Path) -> (String, String) {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = ca.self_signed(&ca_key).unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let mut leaf = rcgen::CertificateParams::new(vec!["localhost".into()]).unwrap();
        leaf.extended_key_usages = vec![
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
            rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let leaf = leaf.signed_by(&key, &ca, &ca_key).unwrap();
        let keystore = dir.join("broker.pem");
        std::fs::write(&keystore, format!("{}{}", key.serialize_pem(), leaf.pem())).unwrap();
        let ca_file = dir.join("ca.pem");
        std::fs::write(&ca_file, ca.pem()).unwrap();
        (
            keystore.display().to_string(),
            ca_file.display().to_string(),
        )
    }

    /// The inter-broker connector against a real SASL_SSL listener that asks for client
    /// certificates: TLS with the broker's keystore as client certificate, the host
    /// check, then SASL PLAIN; each way of getting it wrong is an error, never a panic.
    #[tokio::test]
    async fn the_inter_broker_connector_passes_a_sasl_ssl_mtls_listener() {
        use crate::network::inter_broker::{InterBrokerConnector, PeerEndpoint};

        let pki = tempfile::tempdir().unwrap();
        let (keystore, ca) = broker_pki(pki.path());
        let settings = [
            (
                "listeners",
                "PLAINTEXT://127.0.0.1:0,INTERNAL://127.0.0.1:0",
            ),
            ("listener.security.protocol.map", "INTERNAL:SASL_SSL"),
            ("inter.broker.listener.name", "INTERNAL"),
            ("ssl.keystore.location", keystore.as_str()),
            ("ssl.truststore.location", ca.as_str()),
            ("listener.name.internal.ssl.client.auth", "required"),
            ("listener.name.internal.sasl.enabled.mechanisms", "PLAIN"),
            (
                "listener.name.internal.plain.sasl.jaas.config",
                "PlainLoginModule required username=\"broker\" password=\"pw\" \
                 user_broker=\"pw\";",
            ),
        ];
        let (server, _dir) = server(&settings).await;
        let internal = server.listeners[1].1;
        let config = |extra: &[(&str, &str)]| {
            let mut c = BrokerConfig::default();
            for (k, v) in settings.iter().chain(extra) {
                c.set(k, v);
            }
            c
        };
        let connector = InterBrokerConnector::from_config(&config(&[])).unwrap();
        let localhost = PeerEndpoint {
            host: "localhost".into(),
            addr: internal,
        };
        let mut stream = connector.connect(&localhost, "test").await.unwrap();
        let metadata = MetadataRequest {
            topics: Some(vec![]),
            ..Default::default()
        };
        stream
            .write_all(&request(ApiKey::Metadata, 1, 9, &metadata))
            .await
            .unwrap();
        stream.flush().await.unwrap();
        assert_eq!(
            metadata_ports(response_body(&mut stream).await),
            [i32::from(internal.port())]
        );

        // The certificate names localhost, not 127.0.0.1: Kafka's default `https`
        // refuses, an empty algorithm checks the chain only.
        let by_ip = PeerEndpoint::of_addr(internal);
        let e = connector.connect(&by_ip, "test").await.err().unwrap();
        assert!(e.to_string().contains("TLS handshake"), "{e}");
        let lenient = config(&[("ssl.endpoint.identification.algorithm", "")]);
        InterBrokerConnector::from_config(&lenient)
            .unwrap()
            .connect(&by_ip, "test")
            .await
            .unwrap();

        // A wrong password is refused by the server, and said so.
        let wrong = config(&[(
            "listener.name.internal.plain.sasl.jaas.config",
            "PlainLoginModule required username=\"broker\" password=\"nope\";",
        )]);
        let e = InterBrokerConnector::from_config(&wrong)
            .unwrap()
            .connect(&localhost, "test")
            .await
            .err()
            .unwrap();
        assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied, "{e}");
        assert!(e.to_string().contains("SASL_AUTHENTICATION_FAILED"), "{e}");

        // Without a client certificate the mTLS listener does not let the broker in.
        let no_cert = config(&[("listener.name.internal.ssl.keystore.location", "")]);
        assert!(InterBrokerConnector::from_config(&no_cert)
            .unwrap()
            .connect(&localhost, "test")
            .await
            .is_err());
        server.shutdown().await;
    }

    #[tokio::test]
    async fn fetch_sends_records_from_the_segment_files() {
        use rill_protocol::generated::fetch_request::{FetchPartition, FetchRequest, FetchTopic};
        use rill_protocol::generated::fetch_response::FetchResponse;
        use rill_protocol::generated::produce_request::{
            PartitionProduceData, ProduceRequest, TopicProduceData,
        };
        use rill_protocol::records::{CompressionType, RecordBatchBuilder};
        use rill_protocol::Decodable;

        let (server, _dir) = server(&[]).await;
        let mut sock = TcpStream::connect(server.local_addr).await.unwrap();
        create_topic(&mut sock, "zc").await;
        // Batches larger than a socket buffer, so that sendfile writes partially.
        let mut sent = Vec::new();
        for i in 0..6u8 {
            let mut builder = RecordBatchBuilder::new(CompressionType::None, 0);
            for j in 0..4u8 {
                let value = vec![i ^ j; 150_000];
                builder.append(0, None, Some(&value), &[]).unwrap();
            }
            let batch = builder.build().unwrap();
            let produce = ProduceRequest {
                acks: 1,
                timeout_ms: 5_000,
                topic_data: vec![TopicProduceData {
                    name: "zc".into(),
                    partition_data: vec![PartitionProduceData {
                        index: 0,
                        records: Some(batch.clone()),
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            };
            sock.write_all(&request(ApiKey::Produce, 3, 2, &produce))
                .await
                .unwrap();
            response_body(&mut sock).await;
            sent.push(batch);
        }
        for version in [4i16, 11, 12] {
            let fetch = FetchRequest {
                replica_id: -1,
                max_wait_ms: 0,
                max_bytes: 50 << 20,
                topics: vec![FetchTopic {
                    topic: "zc".into(),
                    partitions: vec![FetchPartition {
                        partition: 0,
                        fetch_offset: 0,
                        partition_max_bytes: 50 << 20,
                        current_leader_epoch: -1,
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            };
            sock.write_all(&request(ApiKey::Fetch, version, 3, &fetch))
                .await
                .unwrap();
            let mut body = response_body(&mut sock).await;
            assert_eq!(body.get_i32(), 3);
            if version >= 12 {
                assert_eq!(body.get_u8(), 0, "no header tagged fields");
            }
            let response = FetchResponse::decode(&mut body, version).unwrap();
            assert!(body.is_empty());
            let p = &response.responses[0].partitions[0];
            assert_eq!(p.error_code, 0);
            let mut records = p.records.clone().unwrap();
            for batch in &sent {
                let got = records.split_to(batch.len());
                // The broker sets the offsets and leader epoch; from the magic byte on
                // the batch is as produced.
                assert_eq!(got[16..], batch[16..], "version {version}");
            }
            assert!(records.is_empty());
        }
        // The connection is still in step.
        sock.write_all(&api_versions(4)).await.unwrap();
        assert_eq!(response(&mut sock).await, Some(4));
        server.shutdown().await;
    }

    #[test]
    fn limits_parse_kafka_names() {
        let mut config = BrokerConfig::default();
        let defaults = ConnectionLimits::from_config(&config).unwrap();
        assert_eq!(defaults, ConnectionLimits::default());
        config.set("max.connections.per.ip", "7");
        config.set("connections.max.idle.ms", "-1");
        config.set("socket.request.max.bytes", "1000");
        let l = ConnectionLimits::from_config(&config).unwrap();
        assert_eq!(l.max_connections_per_ip, 7);
        assert_eq!(l.first_request_max_bytes, 1000, "never above the frame cap");
        assert!(l.connections_max_idle > Duration::from_secs(1 << 30));
        config.set("max.connections", "lots");
        assert!(ConnectionLimits::from_config(&config).is_err());
    }

    #[test]
    fn fd_limit_is_raised_to_the_hard_limit() {
        let soft = raise_fd_limit();
        let now = rustix::process::getrlimit(rustix::process::Resource::Nofile);
        assert_eq!(soft, now.current);
        assert_eq!(now.current, now.maximum);
    }
}
