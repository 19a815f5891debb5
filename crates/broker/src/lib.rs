//! The Rill server: listeners, connections, request dispatch and the replica manager.
//!
//! [`Node::start`] starts what `process.roles` asks for, after locking the data directory
//! against a second process ([`data_dir_lock`]) and before reading anything in it. A broker ([`Server::start`],
//! alone or with the controller) joins the controller quorum — as a voter when it is a
//! controller too, else as an observer that only follows the log — registers with the
//! active controller, follows the metadata log into its own [`MetadataImage`] (see
//! [`metadata_publisher`]), binds the client listener and serves until
//! [`Server::shutdown`]. A controller-only node ([`ControllerServer`]) is a quorum voter
//! with its controller event loop and nothing of a broker. The [`Broker`] is the state every connection shares; its request
//! handlers live in [`apis`], one module per group of APIs. This crate is the thin shell
//! that does the I/O: record validation, offsets and recovery live in `rill-storage`,
//! the controller's decisions in `rill-metadata`, the group state machine in `rill-group`,
//! the codec in `rill-protocol`.

pub mod alter_partition;
pub mod apis;
pub mod append_signal;
pub mod broker_lifecycle;
pub mod config;
pub mod controller_server;
pub mod data_dir_lock;
pub mod error;
pub mod group_coordinator;
pub mod isr;
pub mod log_dir_failure;
pub mod log_manager;
pub mod meta_properties;
pub mod metadata_publisher;
pub mod network;
pub mod replica_fetcher;
pub mod replica_manager;
#[cfg(test)]
mod replication_sim;
pub mod request_slot;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rill_metadata::{
    ControllerEvent, ControllerResponse, MetadataImage, MetadataQuorum, QuorumConfig, TopicImage,
    RESOURCE_TOPIC,
};
use rill_protocol::ErrorCode;
use rill_storage::LogConfig;
use tokio::net::TcpListener;
use tokio::sync::watch;

pub use config::{BrokerConfig, ProcessRoles};
pub use controller_server::ControllerServer;
pub use data_dir_lock::DataDirLock;
pub use error::BrokerError;
use group_coordinator::GroupCoordinatorHandle;
use replica_manager::ReplicaManager;

/// How long an admin request waits for the controller (Kafka's request timeouts are of
/// this order; clients retry after it).
pub const CONTROLLER_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// State shared by every connection.
pub struct Broker {
    pub config: BrokerConfig,
    pub node_id: i32,
    pub cluster_id: String,
    /// Host and port that clients are told to connect to.
    pub advertised_host: String,
    pub advertised_port: i32,
    pub max_request_bytes: usize,
    /// The controller quorum this node votes in or observes; controller requests go
    /// through it.
    pub quorum: Arc<MetadataQuorum>,
    /// The metadata image this broker has applied and acted on.
    image: RwLock<Arc<MetadataImage>>,
    /// The `next_offset` of the published image, for waiting on a controller decision.
    published: watch::Sender<i64>,
    /// This broker's epoch from its registration (-1 before it registered).
    broker_epoch: AtomicI64,
    /// This process's incarnation, which it registers with; the metadata publisher acts
    /// on the image only once it holds that registration (see `metadata_publisher`).
    pub incarnation_id: rill_protocol::Uuid,
    pub replicas: Arc<ReplicaManager>,
    pub groups: GroupCoordinatorHandle,
    producer_ids: tokio::sync::Mutex<ProducerIdBlock>,
}

/// The block of producer ids the controller gave this broker.
#[derive(Default)]
struct ProducerIdBlock {
    next: i64,
    end: i64,
}

impl Broker {
    /// The metadata image as last published.
    pub fn image(&self) -> Arc<MetadataImage> {
        // A panic while holding the lock cannot tear an `Arc` swap, so a poisoned lock
        // still guards a whole image.
        self.image.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn topic(&self, name: &str) -> Option<TopicImage> {
        self.image().topic(name).cloned()
    }

    /// The name of the topic with this id.
    pub fn topic_name_by_id(&self, id: &rill_protocol::Uuid) -> Option<String> {
        self.image().topics.get(id).map(|t| t.name.clone())
    }

    pub fn broker_epoch(&self) -> i64 {
        self.broker_epoch.load(Ordering::Acquire)
    }

    /// Sends an event to the active controller, wherever it runs, and waits until this
    /// broker has applied the records it decided on, so that the caller's next read of
    /// the image sees the change.
    pub async fn controller_call(
        &self,
        event: ControllerEvent,
    ) -> Result<ControllerResponse, ErrorCode> {
        let result = self
            .quorum
            .submit(event, CONTROLLER_REQUEST_TIMEOUT)
            .await
            .map_err(|e| {
                tracing::debug!(error = %e, "controller request failed");
                match e {
                    rill_metadata::MetadataError::NotController { .. } => ErrorCode::NOT_CONTROLLER,
                    _ => ErrorCode::REQUEST_TIMED_OUT,
                }
            })?;
        self.wait_published(result.next_offset, CONTROLLER_REQUEST_TIMEOUT)
            .await;
        Ok(result.response)
    }

    /// Waits until the published image has applied records up to `offset`.
    pub async fn wait_published(&self, offset: i64, timeout: Duration) -> bool {
        let mut rx = self.published.subscribe();
        tokio::time::timeout(timeout, rx.wait_for(|next| *next >= offset))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// The value of a topic config: the topic's override, else the broker's default at
    /// its highest level (dynamic for this broker, dynamic cluster-wide, static, built-in).
    pub fn topic_config_value(
        &self,
        image: &MetadataImage,
        topic: &str,
        name: &str,
    ) -> Option<String> {
        config::topic_config_value(&self.config, image, self.node_id, topic, name).map(|(v, _)| v)
    }

    /// A topic's config overrides.
    pub fn topic_overrides(
        image: &MetadataImage,
        topic: &str,
    ) -> std::collections::BTreeMap<String, String> {
        image
            .configs
            .get(&(RESOURCE_TOPIC, topic.to_string()))
            .cloned()
            .unwrap_or_default()
    }

    /// The storage settings of a topic, from its overrides and the broker's defaults at
    /// their highest level: dynamic for this broker, dynamic cluster-wide, static, built-in
    /// (see [`config::log_config`]).
    pub fn log_config(&self, image: &MetadataImage, topic: &str) -> LogConfig {
        config::log_config(&self.config, image, self.node_id, topic)
    }
}

/// A running server; dropping it does not stop it, [`Server::shutdown`] does.
pub struct Server {
    pub local_addr: SocketAddr,
    /// Where the controller quorum listens on this node (on a broker-only node: where it
    /// receives the metadata log as an observer).
    pub controller_addr: SocketAddr,
    pub broker: Arc<Broker>,
    shutdown: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
    lifecycle: broker_lifecycle::LifecycleHandle,
    /// The data directory's lock, held while this server may write to it.
    data_dir_lock: Arc<DataDirLock>,
}

impl Server {
    /// Joins the controller quorum (a voter when this node is a controller too, an
    /// observer otherwise), binds the client listener, recovers the logs this broker
    /// hosts as the metadata log names them, registers with the controller and starts
    /// serving. Returns once the controller has unfenced this broker (or after
    /// `broker.session.timeout.ms` × 3, serving anyway so that clients can retry).
    ///
    /// Locks the data directory first (see [`data_dir_lock`]); use
    /// [`Server::start_with_lock`] to hold the lock beyond the server's life.
    pub async fn start(config: BrokerConfig) -> Result<Self, BrokerError> {
        let lock = Arc::new(DataDirLock::acquire(&config.data_dir())?);
        Self::start_with_lock(config, lock).await
    }

    /// As [`Server::start`], in the data directory that `lock` holds; nothing reads the
    /// directory before it is locked.
    pub async fn start_with_lock(
        config: BrokerConfig,
        data_dir_lock: Arc<DataDirLock>,
    ) -> Result<Self, BrokerError> {
        check_lock_is_for(&config, &data_dir_lock)?;
        // Before anything else can fail, so that a typo is seen even when it is why.
        config.warn_unknown_keys();
        let config = resolve_node_id(config).await?;
        config.validate()?;
        let roles = config.process_roles()?;
        if !roles.broker {
            return Err(BrokerError::Config(
                "process.roles has no broker role: start a controller-only node with \
                 ControllerServer::start (Node::start picks)"
                    .into(),
            ));
        }
        let node_id = config.node_id()?;
        let data_dir = config.data_dir();
        let (quorum, cluster_id) = start_quorum(&config, roles).await?;
        let controller_addr = quorum.local_addr();
        let quorum = Arc::new(quorum);

        let addr = config.listen_addr()?;
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|e| BrokerError::io(addr, e))?;
        let local_addr = listener
            .local_addr()
            .map_err(|e| BrokerError::io(addr, e))?;
        let (advertised_host, advertised_port) = match config.advertised_listener()? {
            Some((host, port)) => (host, port),
            None => {
                let ip = local_addr.ip();
                let host = if ip.is_unspecified() {
                    "127.0.0.1".to_string()
                } else {
                    ip.to_string()
                };
                (host, local_addr.port())
            }
        };
        let fetcher_config = replica_fetcher::FetcherConfig {
            local_id: node_id,
            max_wait: config.duration_ms("replica.fetch.wait.max.ms")?,
            partition_max_bytes: config
                .get("replica.fetch.max.bytes")
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(1 << 20),
        };
        let lag_ms = config.duration_ms("replica.lag.time.max.ms")?;
        let lag_ms = i64::try_from(lag_ms.as_millis()).unwrap_or(i64::MAX);
        let (replicas, alter_partition_rx) = ReplicaManager::new(&data_dir, fetcher_config, lag_ms);
        log_data_dir(&data_dir_lock, Some(replicas.previous_shutdown()));
        let replicas = Arc::new(replicas);
        let group_config = config.group_config()?;
        let groups = group_coordinator::start(group_config, replicas.clone());
        let (published, _) = watch::channel(0);
        let broker = Arc::new(Broker {
            node_id,
            cluster_id,
            max_request_bytes: config.socket_request_max_bytes()?,
            advertised_host,
            advertised_port: i32::from(advertised_port),
            quorum: quorum.clone(),
            image: RwLock::new(Arc::new(MetadataImage::new())),
            published,
            broker_epoch: AtomicI64::new(-1),
            incarnation_id: rill_protocol::Uuid(*uuid::Uuid::new_v4().as_bytes()),
            replicas: replicas.clone(),
            groups,
            producer_ids: tokio::sync::Mutex::new(ProducerIdBlock::default()),
            config,
        });
        let (shutdown, rx) = watch::channel(false);
        metadata_publisher::start(broker.clone(), rx.clone());
        let weak = Arc::downgrade(&broker);
        log_manager::start(
            broker.replicas.clone(),
            Box::new(move || match weak.upgrade() {
                Some(b) => config::cleaner_config(&b.config, &b.image(), b.node_id),
                None => rill_storage::CleanerConfig::default(),
            }),
            broker.config.log_manager_config()?,
            rx.clone(),
        );
        alter_partition::start(broker.clone(), alter_partition_rx, rx.clone());
        let task = tokio::spawn(network::serve(listener, broker.clone(), rx.clone()));
        let lifecycle = broker_lifecycle::start(broker.clone(), rx);
        lifecycle.wait_unfenced().await;
        Ok(Self {
            local_addr,
            controller_addr,
            broker,
            shutdown,
            task,
            lifecycle,
            data_dir_lock,
        })
    }

    /// The lock on the data directory, for a caller that must hold it until the
    /// process exits (background tasks may write until the runtime stops).
    pub fn data_dir_lock(&self) -> Arc<DataDirLock> {
        self.data_dir_lock.clone()
    }

    /// Controlled shutdown: asks the controller to move this broker's leaderships away
    /// (bounded by `broker.session.timeout.ms`), then stops accepting, closes
    /// connections, flushes every log and leaves the quorum.
    pub async fn shutdown(self) {
        if self.broker.config.get("controlled.shutdown.enable") == Some("true") {
            self.lifecycle.controlled_shutdown().await;
        }
        let _ = self.shutdown.send(true);
        let _ = self.task.await;
        self.broker.replicas.shutdown();
        // Released only now that the logs are closed and the clean-shutdown marker is
        // written (the caller may hold it longer, see `data_dir_lock`).
        drop(self.data_dir_lock);
    }
}

/// A lock must be the one of the directory the config names, or it protects nothing.
pub(crate) fn check_lock_is_for(
    config: &BrokerConfig,
    lock: &DataDirLock,
) -> Result<(), BrokerError> {
    if lock.dir() != config.data_dir() {
        return Err(BrokerError::Config(format!(
            "the lock held is on {}, but log.dirs is {}",
            lock.dir().display(),
            config.data_dir().display()
        )));
    }
    Ok(())
}

/// Says at start-up what state the data directory was found in: new (nothing to
/// recover), or how the previous run ended (a controller-only node has no partition
/// logs, so it passes `None`).
pub(crate) fn log_data_dir(
    lock: &DataDirLock,
    previous_shutdown: Option<rill_storage::PreviousShutdown>,
) {
    let dir = lock.dir().display();
    if lock.was_new() {
        tracing::info!(%dir, "data directory is new");
    } else if let Some(previous_shutdown) = previous_shutdown {
        tracing::info!(%dir, ?previous_shutdown, "data directory");
    } else {
        tracing::info!(%dir, "data directory");
    }
}

/// A broker-only node started without `node.id` takes the id an earlier start stored in
/// `meta.properties`, else registers once with the active controller (reached through
/// the voters, as it is not in the quorum yet) to have one generated above
/// `reserved.broker.max.id`, when `broker.id.generation.enable` (Kafka's scheme from
/// before KRaft); `meta.properties` then keeps it. The registration starts fenced and
/// the broker's own, made once it runs, replaces it.
async fn resolve_node_id(mut config: BrokerConfig) -> Result<BrokerConfig, BrokerError> {
    let roles = config.process_roles()?;
    let explicit = config.explicit().any(|(k, _)| k == "node.id");
    let voters_given = config
        .get("controller.quorum.voters")
        .is_some_and(|v| !v.trim().is_empty());
    // Without voters there is no controller to ask: the roles check says so later.
    if roles.controller || !roles.broker || explicit || !voters_given {
        return Ok(config);
    }
    if let Some(id) = meta_properties::stored_node_id(&config.data_dir())? {
        config.set("node.id", &id.to_string());
        return Ok(config);
    }
    if config.get("broker.id.generation.enable") != Some("true") {
        return Err(BrokerError::Config(
            "a broker-only node needs node.id (or broker.id.generation.enable=true to have \
             one generated)"
                .into(),
        ));
    }
    let voters = config.quorum_voters()?;
    let (host, port) = match config.advertised_listener()? {
        Some(hp) => hp,
        None => {
            let addr = config.listen_addr()?;
            (addr.ip().to_string(), addr.port())
        }
    };
    let event = rill_metadata::ControllerEvent::BrokerRegistration(
        rill_metadata::BrokerRegistrationRequest {
            broker_id: -1,
            incarnation_id: rill_protocol::Uuid(*uuid::Uuid::new_v4().as_bytes()),
            listeners: vec![rill_metadata::Endpoint {
                name: "PLAINTEXT".into(),
                host,
                port,
                security_protocol: 0,
            }],
            rack: config.get("broker.rack").map(str::to_string),
        },
    );
    let generated =
        rill_metadata::submit_to_voters(&voters, event, std::time::Duration::from_secs(30))
            .await
            .map_err(|e| BrokerError::Metadata(format!("generating a node.id: {e}")))?;
    match generated.response {
        rill_metadata::ControllerResponse::BrokerRegistration(r)
            if r.error_code == ErrorCode::NONE =>
        {
            tracing::info!(node_id = r.broker_id, "node.id generated by the controller");
            config.set("node.id", &r.broker_id.to_string());
            Ok(config)
        }
        other => Err(BrokerError::Metadata(format!(
            "generating a node.id: the controller answered {other:?}"
        ))),
    }
}

/// Starts this node's part of the controller quorum as `roles` ask: a voter with the
/// controller event loop when it is a controller, else an observer that follows the log
/// (see `rill_metadata::MetadataQuorum::start_observer`). Creates the data directory and
/// `meta.properties` first; returns the quorum and the cluster id.
pub(crate) async fn start_quorum(
    config: &BrokerConfig,
    roles: ProcessRoles,
) -> Result<(MetadataQuorum, String), BrokerError> {
    config.check_roles_against_voters()?;
    let node_id = config.node_id()?;
    let data_dir = config.data_dir();
    std::fs::create_dir_all(&data_dir).map_err(|e| BrokerError::io(data_dir.display(), e))?;
    let voters = config.quorum_voters()?;
    let own_id = u64::try_from(node_id)
        .map_err(|_| BrokerError::Config("node.id must not be negative".into()))?;
    let cluster_id = meta_properties::load_or_create(&data_dir, config, node_id, &voters)?;
    let election_ms = config.duration_ms("controller.quorum.election.timeout.ms")?;
    let election_ms = u64::try_from(election_ms.as_millis())
        .unwrap_or(1000)
        .max(50);
    // Ten heartbeats to an election timeout: the pre-vote timer needs the minimum (half
    // of it) above three heartbeats, openraft's lease on the followers.
    let quorum_config = QuorumConfig {
        heartbeat_interval_ms: (election_ms / 10).max(5),
        election_timeout_min_ms: election_ms / 2,
        election_timeout_max_ms: election_ms,
        controller: config.controller_config()?,
        ..QuorumConfig::default()
    };
    let quorum_dir = data_dir.join(metadata_publisher::METADATA_LOG_DIR);
    let quorum = if roles.controller {
        MetadataQuorum::start_with(own_id, voters, &quorum_dir, quorum_config).await
    } else {
        let listen = config.observer_listen_addr()?;
        MetadataQuorum::start_observer(own_id, listen, voters, &quorum_dir, quorum_config).await
    };
    let quorum = quorum.map_err(|e| BrokerError::Metadata(e.to_string()))?;
    Ok((quorum, cluster_id))
}

/// A running node, whatever `process.roles` made it (Kafka's `KafkaRaftServer`).
pub enum Node {
    /// A broker, alone (a quorum observer) or with the controller (a voter).
    Broker(Server),
    /// A controller only: a quorum voter, no client listener, not a broker.
    Controller(ControllerServer),
}

impl Node {
    /// Starts what `process.roles` asks for; the default (both) is [`Server::start`].
    pub async fn start(config: BrokerConfig) -> Result<Node, BrokerError> {
        let lock = Arc::new(DataDirLock::acquire(&config.data_dir())?);
        Self::start_with_lock(config, lock).await
    }

    /// As [`Node::start`], in the data directory that `lock` holds. The binary takes the
    /// lock itself and keeps it until the process exits, after every task has stopped.
    pub async fn start_with_lock(
        config: BrokerConfig,
        lock: Arc<DataDirLock>,
    ) -> Result<Node, BrokerError> {
        if config.process_roles()?.broker {
            Server::start_with_lock(config, lock)
                .await
                .map(Node::Broker)
        } else {
            ControllerServer::start_with_lock(config, lock)
                .await
                .map(Node::Controller)
        }
    }

    /// Where the controller quorum listens on this node.
    pub fn controller_addr(&self) -> SocketAddr {
        match self {
            Node::Broker(s) => s.controller_addr,
            Node::Controller(c) => c.controller_addr,
        }
    }

    /// The lock on the node's data directory.
    pub fn data_dir_lock(&self) -> Arc<DataDirLock> {
        match self {
            Node::Broker(s) => s.data_dir_lock(),
            Node::Controller(c) => c.data_dir_lock(),
        }
    }

    /// Stops the node: a broker's controlled shutdown, or a controller leaving the quorum.
    pub async fn shutdown(self) {
        match self {
            Node::Broker(s) => s.shutdown().await,
            Node::Controller(c) => c.shutdown().await,
        }
    }
}
