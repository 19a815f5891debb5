//! The shared core of every client: connections per broker and the metadata cache.
//!
//! Kafka's Java client splits this into `NetworkClient` and `Metadata`; here one
//! [`NetworkClient`] holds both, shared behind an `Arc` by the producer's sender task, the
//! consumer, its heartbeat task and the admin client.
//!
//! - Connections are keyed by `host:port`. The first use of an address connects (and
//!   negotiates api versions); a closed connection is replaced on next use; a failed
//!   connect is remembered for `retry.backoff.ms` so that many callers do not each wait
//!   for the same dead address.
//! - Metadata is an immutable [`ClusterMetadata`] snapshot swapped on refresh. Requests
//!   for some topics merge into it; a request for all topics replaces the topic list.
//!   Callers refresh when they see `NOT_LEADER_OR_FOLLOWER`/`UNKNOWN_TOPIC_OR_PARTITION`
//!   ([`NetworkClient::invalidate_metadata`]) and whenever it is older than
//!   `metadata.max.age.ms`.
//! - "Least-loaded node": the live connection with the fewest requests in flight, then
//!   known brokers, then the bootstrap list — the order in which [`NetworkClient::send_any`]
//!   tries them.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use rill_protocol::generated::metadata_request::MetadataRequestTopic;
use rill_protocol::generated::{MetadataRequest, MetadataResponse};
use rill_protocol::{ErrorCode, Request, Uuid};

use crate::config::ClientConfig;
use crate::connection::BrokerConnection;
use crate::error::{Error, Result};

/// Highest Metadata version this client reads.
const METADATA_VERSION: i16 = 12;

/// One broker, as metadata describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerMetadata {
    pub node_id: i32,
    pub host: String,
    pub port: i32,
    pub rack: Option<String>,
}

impl BrokerMetadata {
    /// `host:port`.
    pub fn addr(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }
}

/// One partition of a topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionMetadata {
    pub partition: i32,
    /// Leader broker id, -1 when there is none.
    pub leader: i32,
    pub leader_epoch: i32,
    pub replicas: Vec<i32>,
    pub isr: Vec<i32>,
    pub offline_replicas: Vec<i32>,
    pub error: ErrorCode,
}

/// One topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicMetadata {
    pub name: String,
    pub topic_id: Uuid,
    pub is_internal: bool,
    pub error: ErrorCode,
    /// Sorted by partition id.
    pub partitions: Vec<PartitionMetadata>,
}

/// A snapshot of what the cluster said about itself.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterMetadata {
    pub cluster_id: Option<String>,
    pub controller_id: i32,
    pub brokers: BTreeMap<i32, BrokerMetadata>,
    /// Topics that exist (topics the broker reported as errors are left out).
    pub topics: BTreeMap<String, TopicMetadata>,
}

impl ClusterMetadata {
    /// The leader of `topic`-`partition`, when known.
    pub fn leader(&self, topic: &str, partition: i32) -> Option<&BrokerMetadata> {
        let t = self.topics.get(topic)?;
        let p = t.partitions.iter().find(|p| p.partition == partition)?;
        self.brokers.get(&p.leader)
    }

    /// Partition count of `topic`, when known.
    pub fn partition_count(&self, topic: &str) -> Option<usize> {
        self.topics.get(topic).map(|t| t.partitions.len())
    }
}

#[derive(Default)]
struct Slot {
    conn: Option<Arc<BrokerConnection>>,
    failed: Option<(Instant, Error)>,
}

struct MetadataState {
    snapshot: Arc<ClusterMetadata>,
    /// When each topic was last refreshed; all-topic refreshes stamp `all`.
    refreshed: HashMap<String, Instant>,
    all: Option<Instant>,
    stale: bool,
}

/// Connections and metadata shared by the clients of one producer, consumer or admin.
pub(crate) struct NetworkClient {
    pub(crate) config: ClientConfig,
    slots: Mutex<HashMap<String, Arc<tokio::sync::Mutex<Slot>>>>,
    metadata: RwLock<MetadataState>,
    /// Bumped whenever the snapshot is replaced or marked stale, so that a caller may keep
    /// what it derived from the metadata (the producer: partition counts) until then
    /// without asking for it on every record.
    generation: AtomicU64,
    refresh_lock: tokio::sync::Mutex<()>,
}

impl NetworkClient {
    pub(crate) fn new(config: ClientConfig) -> Result<Arc<Self>> {
        if config.bootstrap_servers.is_empty() {
            return Err(Error::InvalidConfig("bootstrap.servers is empty".into()));
        }
        Ok(Arc::new(Self {
            config,
            slots: Mutex::new(HashMap::new()),
            metadata: RwLock::new(MetadataState {
                snapshot: Arc::new(ClusterMetadata::default()),
                refreshed: HashMap::new(),
                all: None,
                stale: true,
            }),
            generation: AtomicU64::new(0),
            refresh_lock: tokio::sync::Mutex::new(()),
        }))
    }

    /// A live connection to `addr`, opened if need be.
    pub(crate) async fn connection(&self, addr: &str) -> Result<Arc<BrokerConnection>> {
        let slot = {
            let mut slots = self.slots.lock().map_err(|_| Error::Closed)?;
            slots.entry(addr.to_string()).or_default().clone()
        };
        let mut slot = slot.lock().await;
        if let Some(c) = &slot.conn {
            if !c.is_closed() {
                return Ok(c.clone());
            }
        }
        if let Some((at, e)) = &slot.failed {
            if at.elapsed() < self.config.retry_backoff {
                return Err(e.clone());
            }
        }
        match BrokerConnection::connect(
            addr,
            &self.config.client_id,
            self.config.connect_timeout,
            self.config.request_timeout,
            &self.config.security,
        )
        .await
        {
            Ok(c) => {
                slot.conn = Some(c.clone());
                slot.failed = None;
                Ok(c)
            }
            Err(e) => {
                slot.conn = None;
                slot.failed = Some((Instant::now(), e.clone()));
                Err(e)
            }
        }
    }

    /// A connection to broker `node_id`, refreshing metadata once if the broker is unknown.
    pub(crate) async fn node_connection(&self, node_id: i32) -> Result<Arc<BrokerConnection>> {
        let addr = match self.metadata().brokers.get(&node_id) {
            Some(b) => b.addr(),
            None => {
                self.refresh_metadata(None).await?;
                self.metadata()
                    .brokers
                    .get(&node_id)
                    .map(BrokerMetadata::addr)
                    .ok_or_else(|| {
                        Error::NoBrokerAvailable(format!("broker {node_id} is not in metadata"))
                    })?
            }
        };
        self.connection(&addr).await
    }

    /// Addresses in least-loaded order: live connections by requests in flight, then
    /// brokers and bootstrap servers not connected yet.
    pub(crate) fn least_loaded(&self) -> Vec<String> {
        let mut addrs: Vec<String> = self
            .metadata()
            .brokers
            .values()
            .map(BrokerMetadata::addr)
            .collect();
        for b in &self.config.bootstrap_servers {
            if !addrs.contains(b) {
                addrs.push(b.clone());
            }
        }
        let load = |addr: &String| -> usize {
            let Ok(slots) = self.slots.lock() else {
                return usize::MAX;
            };
            let Some(slot) = slots.get(addr) else {
                return usize::MAX / 2;
            };
            let Ok(slot) = slot.try_lock() else {
                return usize::MAX / 2;
            };
            match (&slot.conn, &slot.failed) {
                (Some(c), _) if !c.is_closed() => c.in_flight(),
                (_, Some(_)) => usize::MAX,
                _ => usize::MAX / 2,
            }
        };
        addrs.sort_by_key(load);
        addrs
    }

    /// Sends `request` to the least-loaded broker that answers, trying the others when a
    /// connection fails.
    pub(crate) async fn send_any<R: Request>(&self, request: &R, ours: i16) -> Result<R::Response> {
        let mut last = Error::NoBrokerAvailable("no address to try".into());
        for addr in self.least_loaded() {
            let conn = match self.connection(&addr).await {
                Ok(c) => c,
                Err(e) => {
                    last = e;
                    continue;
                }
            };
            match conn.send(request, ours).await {
                Ok(r) => return Ok(r),
                Err(e @ (Error::Disconnected { .. } | Error::Timeout { .. })) => last = e,
                Err(e) => return Err(e),
            }
        }
        Err(last)
    }

    /// Sends `request` to broker `node_id`.
    pub(crate) async fn send_to<R: Request>(
        &self,
        node_id: i32,
        request: &R,
        ours: i16,
    ) -> Result<R::Response> {
        let conn = self.node_connection(node_id).await?;
        conn.send(request, ours).await
    }

    /// The current snapshot.
    pub(crate) fn metadata(&self) -> Arc<ClusterMetadata> {
        self.metadata
            .read()
            .map(|m| m.snapshot.clone())
            .unwrap_or_default()
    }

    /// Marks the metadata stale: the next [`Self::ensure_topics`] refreshes.
    pub(crate) fn invalidate_metadata(&self) {
        if let Ok(mut m) = self.metadata.write() {
            m.stale = true;
        }
        self.generation.fetch_add(1, Ordering::Release);
    }

    /// See the field: changes whenever what [`Self::ensure_topics`] would do may change.
    pub(crate) fn metadata_generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Until when [`Self::ensure_topics`] would take `topic`'s metadata as fresh, if it
    /// would now (the same test it makes).
    pub(crate) fn topic_fresh_until(&self, topic: &str) -> Option<Instant> {
        let m = self.metadata.read().ok()?;
        if m.stale || !m.snapshot.topics.contains_key(topic) {
            return None;
        }
        let at = m.refreshed.get(topic).or(m.all.as_ref())?;
        at.checked_add(self.config.metadata_max_age)
    }

    /// Makes sure the metadata of `topics` is known and younger than
    /// `metadata.max.age.ms` (refreshing if not), and returns the snapshot.
    pub(crate) async fn ensure_topics(&self, topics: &[String]) -> Result<Arc<ClusterMetadata>> {
        let fresh = {
            let m = self.metadata.read().map_err(|_| Error::Closed)?;
            let max_age = self.config.metadata_max_age;
            !m.stale
                && topics.iter().all(|t| {
                    m.snapshot.topics.contains_key(t)
                        && m.refreshed
                            .get(t)
                            .or(m.all.as_ref())
                            .is_some_and(|at| at.elapsed() < max_age)
                })
        };
        if !fresh {
            self.refresh_metadata(Some(topics)).await?;
        }
        Ok(self.metadata())
    }

    /// Asks for the metadata of `topics` (all topics when `None`) and merges it in.
    pub(crate) async fn refresh_metadata(&self, topics: Option<&[String]>) -> Result<()> {
        let started = Instant::now();
        let _guard = self.refresh_lock.lock().await;
        // Someone else refreshed while we waited for the lock: their answer will do.
        if let Ok(m) = self.metadata.read() {
            let done_since = |at: Option<&Instant>| at.is_some_and(|at| *at >= started);
            let covered = match topics {
                None => done_since(m.all.as_ref()),
                Some(ts) => {
                    !m.stale
                        && ts
                            .iter()
                            .all(|t| done_since(m.refreshed.get(t)) || done_since(m.all.as_ref()))
                }
            };
            if covered {
                return Ok(());
            }
        }
        let request = MetadataRequest {
            topics: topics.map(|ts| {
                ts.iter()
                    .map(|t| MetadataRequestTopic {
                        name: Some(t.clone()),
                        ..Default::default()
                    })
                    .collect()
            }),
            allow_auto_topic_creation: self.config.allow_auto_create_topics,
            ..Default::default()
        };
        let response: MetadataResponse = self.send_any(&request, METADATA_VERSION).await?;
        let now = Instant::now();
        let mut m = self.metadata.write().map_err(|_| Error::Closed)?;
        let mut snapshot = (*m.snapshot).clone();
        snapshot.cluster_id = response.cluster_id.clone();
        snapshot.controller_id = response.controller_id;
        snapshot.brokers = response
            .brokers
            .iter()
            .map(|b| {
                (
                    b.node_id,
                    BrokerMetadata {
                        node_id: b.node_id,
                        host: b.host.clone(),
                        port: b.port,
                        rack: b.rack.clone(),
                    },
                )
            })
            .collect();
        if topics.is_none() {
            snapshot.topics.clear();
            m.all = Some(now);
        }
        for t in &response.topics {
            let Some(name) = t.name.clone() else { continue };
            m.refreshed.insert(name.clone(), now);
            let error = ErrorCode::from_code(t.error_code);
            if !error.is_ok() {
                snapshot.topics.remove(&name);
                continue;
            }
            let mut partitions: Vec<PartitionMetadata> = t
                .partitions
                .iter()
                .map(|p| PartitionMetadata {
                    partition: p.partition_index,
                    leader: p.leader_id,
                    leader_epoch: p.leader_epoch,
                    replicas: p.replica_nodes.clone(),
                    isr: p.isr_nodes.clone(),
                    offline_replicas: p.offline_replicas.clone(),
                    error: ErrorCode::from_code(p.error_code),
                })
                .collect();
            partitions.sort_by_key(|p| p.partition);
            snapshot.topics.insert(
                name.clone(),
                TopicMetadata {
                    name,
                    topic_id: t.topic_id,
                    is_internal: t.is_internal,
                    error,
                    partitions,
                },
            );
        }
        m.snapshot = Arc::new(snapshot);
        m.stale = false;
        self.generation.fetch_add(1, Ordering::Release);
        Ok(())
    }

    /// Closes every connection.
    pub(crate) fn close(&self) {
        if let Ok(slots) = self.slots.lock() {
            for slot in slots.values() {
                if let Ok(s) = slot.try_lock() {
                    if let Some(c) = &s.conn {
                        c.close("client closed");
                    }
                }
            }
        }
    }
}
