//! The Rill server: listeners, connections, request dispatch and the replica manager.
//!
//! [`Server::start`] opens the data directory (metadata, then every partition log, with
//! recovery), binds the listener and serves until [`Server::shutdown`]. The [`Broker`] is
//! the state every connection shares; its request handlers live in [`apis`], one module
//! per group of APIs. This crate is the thin shell that does the I/O: record validation,
//! offsets and recovery live in `rill-storage`, the codec in `rill-protocol`.

pub mod apis;
pub mod config;
pub mod error;
pub mod group_coordinator;
pub mod isr;
pub mod log_manager;
pub mod metadata_store;
pub mod network;
pub mod replica_manager;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use rill_storage::{LogConfig, TopicPartition};
use tokio::net::TcpListener;
use tokio::sync::watch;

pub use config::BrokerConfig;
pub use error::BrokerError;
use group_coordinator::{GroupCoordinatorHandle, OFFSETS_TOPIC};
use metadata_store::{MetadataStore, TopicMeta};
use replica_manager::ReplicaManager;

/// State shared by every connection.
pub struct Broker {
    pub config: BrokerConfig,
    pub node_id: i32,
    /// Host and port that clients are told to connect to.
    pub advertised_host: String,
    pub advertised_port: i32,
    pub max_request_bytes: usize,
    metadata: Mutex<MetadataStore>,
    pub replicas: Arc<ReplicaManager>,
    pub groups: GroupCoordinatorHandle,
}

impl Broker {
    /// Locks the metadata store. Changes are applied whole by `MetadataStore::update`, so a
    /// lock poisoned by a panicking reader still guards a consistent image.
    fn metadata(&self) -> std::sync::MutexGuard<'_, MetadataStore> {
        self.metadata.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn cluster_id(&self) -> String {
        self.metadata().image().cluster_id.clone()
    }

    pub fn topic(&self, name: &str) -> Option<TopicMeta> {
        self.metadata().image().topics.get(name).cloned()
    }

    /// The name of the topic with this id.
    pub fn topic_name_by_id(&self, id: &rill_protocol::Uuid) -> Option<String> {
        self.metadata().topic_name(id).map(str::to_string)
    }

    pub fn topics(&self) -> Vec<TopicMeta> {
        self.metadata().image().topics.values().cloned().collect()
    }

    /// The value of a topic config: the topic's override, else the broker's default.
    pub fn topic_config_value(&self, topic: &TopicMeta, name: &str) -> Option<String> {
        if let Some(v) = topic.configs.get(name) {
            return Some(v.clone());
        }
        let def = config::topic_config_def(name)?;
        self.config.get(def.broker_key).map(str::to_string)
    }

    /// The storage settings of a topic, from its configs and the broker's defaults.
    pub fn log_config(&self, topic: &TopicMeta) -> LogConfig {
        let get = |name: &str| self.topic_config_value(topic, name).unwrap_or_default();
        let int = |name: &str| get(name).trim().parse::<i64>().ok();
        let mut c = LogConfig::default();
        if let Some(v) = int("segment.bytes") {
            c.segment_bytes = v.max(1) as u64;
        }
        if let Some(v) = int("segment.ms") {
            c.segment_ms = v;
        }
        if let Some(v) = int("index.interval.bytes") {
            c.index_interval_bytes = v.max(1) as u64;
        }
        if let Some(v) = int("segment.index.bytes") {
            c.segment_index_bytes = v.max(8) as u64;
        }
        if let Some(v) = int("max.message.bytes") {
            c.max_message_bytes = v.max(0) as usize;
        }
        c.flush_messages = int("flush.messages")
            .filter(|v| *v != i64::MAX)
            .map(|v| v as u64);
        c.flush_ms = int("flush.ms").filter(|v| *v != i64::MAX);
        if let Some(v) = int("retention.ms") {
            c.retention_ms = v;
        }
        if let Some(v) = int("retention.bytes") {
            c.retention_bytes = v;
        }
        if let Ok(policy) = get("cleanup.policy").parse() {
            c.cleanup_policy = policy;
        }
        if let Some(v) = int("delete.retention.ms") {
            c.delete_retention_ms = v;
        }
        if let Ok(v) = get("min.cleanable.dirty.ratio").trim().parse::<f64>() {
            if v.is_finite() {
                c.min_cleanable_dirty_ratio = v.clamp(0.0, 1.0);
            }
        }
        if let Some(v) = int("min.compaction.lag.ms") {
            c.min_compaction_lag_ms = v;
        }
        if let Some(v) = int("max.compaction.lag.ms") {
            c.max_compaction_lag_ms = v;
        }
        if get("message.timestamp.type") == "LogAppendTime" {
            c.message_timestamp_type = rill_storage::MessageTimestampType::LogAppendTime;
        }
        c
    }

    /// Creates `__consumer_offsets` (compacted, `offsets.topic.num.partitions`) when it is
    /// missing; the group coordinator keeps its records there.
    fn ensure_offsets_topic(&self, partitions: i32) -> Result<(), BrokerError> {
        if self.topic(OFFSETS_TOPIC).is_some() {
            return Ok(());
        }
        let configs = [
            ("cleanup.policy", "compact"),
            ("compression.type", "producer"),
            ("segment.bytes", "104857600"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        self.create_topic(OFFSETS_TOPIC, partitions, 1, configs, false)
            .map(|_| ())
            .map_err(|(code, m)| BrokerError::Metadata(format!("{}: {m}", code.name())))
    }

    fn open_topic_partitions(&self, topic: &TopicMeta, from: i32) -> Result<(), BrokerError> {
        let config = self.log_config(topic);
        for p in from..topic.partitions {
            let tp = TopicPartition {
                topic: topic.name.clone(),
                partition: p,
            };
            self.replicas
                .open_partition(tp, topic.topic_id(), config.clone())?;
        }
        Ok(())
    }
}

/// Deletes partition directories that no topic owns: what a crash between forgetting a
/// topic (or shrinking nothing — partitions only grow) and removing its logs leaves behind.
/// Directories whose names are not partition names are left alone.
fn remove_stray_partitions(data_dir: &std::path::Path, topics: &[TopicMeta]) {
    let Ok(entries) = std::fs::read_dir(data_dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Ok(tp) = rill_storage::parse_partition_dir_name(&name) else {
            continue;
        };
        let owned = topics
            .iter()
            .any(|t| t.name == tp.topic && tp.partition < t.partitions);
        if !owned && entry.path().is_dir() {
            tracing::warn!(dir = %entry.path().display(), "removing the log of a deleted topic");
            if let Err(e) = std::fs::remove_dir_all(entry.path()) {
                tracing::error!(dir = %entry.path().display(), error = %e, "removal failed");
            }
        }
    }
}

/// A running server; dropping it does not stop it, [`Server::shutdown`] does.
pub struct Server {
    pub local_addr: SocketAddr,
    pub broker: Arc<Broker>,
    shutdown: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Server {
    /// Opens the data directory, recovers every log, binds the listener and starts serving.
    pub async fn start(config: BrokerConfig) -> Result<Self, BrokerError> {
        config.validate()?;
        let data_dir = config.data_dir();
        std::fs::create_dir_all(&data_dir).map_err(|e| BrokerError::io(data_dir.display(), e))?;
        let metadata = MetadataStore::open(&data_dir)?;
        let addr = config.listen_addr()?;
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|e| BrokerError::io(addr, e))?;
        let local_addr = listener
            .local_addr()
            .map_err(|e| BrokerError::io(addr, e))?;
        let advertised_host = config
            .get("advertised.host.name")
            .map(str::to_string)
            .unwrap_or_else(|| local_addr.ip().to_string());
        let replicas = Arc::new(ReplicaManager::new(&data_dir));
        let group_config = config.group_config()?;
        let topics: Vec<TopicMeta> = metadata.image().topics.values().cloned().collect();
        let metadata_created = metadata.created;
        let mut broker = Broker {
            node_id: config.node_id()?,
            max_request_bytes: config.socket_request_max_bytes()?,
            advertised_host,
            advertised_port: i32::from(local_addr.port()),
            replicas: replicas.clone(),
            metadata: Mutex::new(metadata),
            config,
            groups: GroupCoordinatorHandle::detached(),
        };
        // Only with metadata that existed before: a lost metadata file must not turn every
        // log into a "stray" one.
        if !metadata_created {
            remove_stray_partitions(&data_dir, &topics);
        }
        for topic in &topics {
            broker.open_topic_partitions(topic, 0)?;
        }
        broker.ensure_offsets_topic(group_config.offsets_topic_num_partitions)?;
        broker.groups = group_coordinator::start(group_config, replicas);
        let broker = Arc::new(broker);
        let (shutdown, rx) = watch::channel(false);
        log_manager::start(
            broker.replicas.clone(),
            broker.config.log_manager_config()?,
            rx.clone(),
        );
        let task = tokio::spawn(network::serve(listener, broker.clone(), rx));
        Ok(Self {
            local_addr,
            broker,
            shutdown,
            task,
        })
    }

    /// Stops accepting, closes connections and flushes every log.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        let _ = self.task.await;
        self.broker.replicas.shutdown();
    }
}
