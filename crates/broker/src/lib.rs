//! The Rill server: listeners, connections, request dispatch, the replica manager and
//! the coordinators' runtime.
//!
//! [`Node::start`] starts what `process.roles` asks for, after locking the data directory
//! against a second process ([`data_dir_lock`]) and before reading anything in it. A broker ([`Server::start`],
//! alone or with the controller) joins the controller quorum — as a voter when it is a
//! controller too, else as an observer that only follows the log — registers with the
//! active controller, follows the metadata log into its own [`MetadataImage`](rill_metadata::MetadataImage) (see
//! [`metadata_publisher`]), binds the client listener and serves until
//! [`Server::shutdown`]. A controller-only node ([`ControllerServer`]) is a quorum voter
//! with its controller event loop and nothing of a broker.
//!
//! The crate is split along Kafka's seams, each part a top-level module that names only
//! the parts below it (ARCHITECTURE.md has the table; `xtask/src/layering.rs` checks it):
//! [`network`] (listeners, connections, framing, request slots), [`server`] (the shared
//! [`Broker`] state, dispatch and the request handlers), [`replication`] (partitions,
//! ISR, fetchers, log maintenance), [`coordinator`] (the runtime that hosts the group
//! coordinator on `__consumer_offsets`), [`metadata_publisher`] (metadata image changes
//! turned into actions on the parts above), [`broker_lifecycle`] (registration,
//! heartbeats, the lease), [`http`] (the HTTP listener: `/metrics`, `/health/live`,
//! `/health/ready`), and the leaves (`config`, `error`, `log_dir_failure`,
//! `data_dir_lock`, `meta_properties`, `shared_server`, [`metrics`], the counters the
//! request paths update). This file only assembles them.
//! Record validation, offsets and recovery live in `rill-storage`, the controller's
//! decisions in `rill-metadata`, the group state machine in `rill-group`, the codec in
//! `rill-protocol`.

pub mod broker_lifecycle;
pub mod config;
pub mod controller_server;
pub mod coordinator;
pub mod data_dir_lock;
pub mod error;
pub mod http;
pub mod log_dir_failure;
pub mod meta_properties;
pub mod metadata_publisher;
pub mod metrics;
pub mod network;
pub mod rate;
pub mod remote_log;
pub mod replication;
pub mod server;
mod shared_server;

use std::net::SocketAddr;
use std::sync::atomic::AtomicI64;
use std::sync::{Arc, RwLock};

use rill_metadata::MetadataImage;
use tokio::net::TcpListener;
use tokio::sync::watch;

pub use config::{BrokerConfig, ProcessRoles};
pub use controller_server::ControllerServer;
pub use data_dir_lock::DataDirLock;
pub use error::BrokerError;
pub use server::{Broker, CONTROLLER_REQUEST_TIMEOUT};

use coordinator::group_coordinator;
use network::security::ListenerSecurity;
use network::ConnectionLimits;
use replication::log_manager::{self, LogManagerConfig};
use replication::replica_manager::ReplicaManager;
use replication::{alter_partition, replica_fetcher};
use server::ProducerIdBlock;
use shared_server::{check_lock_is_for, log_data_dir, resolve_node_id, start_quorum};

/// A running server; dropping it does not stop it, [`Server::shutdown`] does.
pub struct Server {
    /// The first client listener's address.
    pub local_addr: SocketAddr,
    /// Every client listener: its name and the address bound.
    pub listeners: Vec<(String, SocketAddr)>,
    /// Where the controller quorum listens on this node (on a broker-only node: where it
    /// receives the metadata log as an observer).
    pub controller_addr: SocketAddr,
    /// The HTTP listener's address (`http.listeners`), `None` when it is off.
    pub http_addr: Option<SocketAddr>,
    pub broker: Arc<Broker>,
    /// Where the binary installs its console's routes on the HTTP listener.
    pub http_routes: http::ExtraRoutes,
    shutdown: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
    http_task: Option<tokio::task::JoinHandle<()>>,
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
        let lock = Arc::new(DataDirLock::acquire_all(&config.all_dirs())?);
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
        // Checked here rather than in `validate`: they are the network's and the log
        // manager's keys, and `config` sits below both.
        let connection_limits = ConnectionLimits::from_config(&config)?;
        let log_manager_config = LogManagerConfig::from_config(&config)?;
        let authorizer = config.authorizer()?.map(Arc::new);
        let roles = config.process_roles()?;
        if !roles.broker {
            return Err(BrokerError::Config(
                "process.roles has no broker role: start a controller-only node with \
                 ControllerServer::start (Node::start picks)"
                    .into(),
            ));
        }
        let node_id = config.node_id()?;
        let (quorum, cluster_id) = start_quorum(&config, roles).await?;
        // Every log directory's `meta.properties`, with its directory id (KIP-858).
        let log_dir_paths = config.log_dirs();
        let log_dir_ids =
            meta_properties::load_or_create_log_dirs(&log_dir_paths, &cluster_id, node_id)?;
        let metadata_log_dir = config.metadata_log_dir();
        let metadata_dir_index = log_dir_paths.iter().position(|d| *d == metadata_log_dir);
        let controller_addr = quorum.local_addr();
        let quorum = Arc::new(quorum);
        shared_server::apply_bootstrap_scram(&config, &quorum)?;

        let mut bound = Vec::new();
        let mut listeners = Vec::new();
        for l in config.client_listeners()? {
            // Key files are read before the port is taken, so that a bad one says so.
            let security = Arc::new(ListenerSecurity::from_config(&config, &l)?);
            let tcp = TcpListener::bind(l.addr)
                .await
                .map_err(|e| BrokerError::io(l.addr, e))?;
            let local = tcp.local_addr().map_err(|e| BrokerError::io(l.addr, e))?;
            bound.push((l, local));
            listeners.push(network::Listener { tcp, security });
        }
        // Bound before the broker registers, so that a port taken fails the start and
        // `/health/ready` answers 503 until the broker is ready.
        let metrics_settings = http::MetricsSettings::from_config(&config)?;
        let http_listener = http::bind(&config).await?;
        let http_addr = http_listener.as_ref().map(http::HttpListener::local_addr);
        if let Some(l) = &http_listener {
            tracing::info!(
                addr = %l.local_addr(),
                security = %l.describe(),
                "http listener (/metrics, /health/live, /health/ready)"
            );
        }
        let local_addr = bound
            .first()
            .map(|(_, a)| *a)
            .ok_or_else(|| BrokerError::Config("listeners: no client listener".into()))?;
        let listener_addrs: Vec<(String, SocketAddr)> =
            bound.iter().map(|(l, a)| (l.name.clone(), *a)).collect();
        let endpoints: Vec<rill_metadata::Endpoint> = config
            .advertised_endpoints(&bound)?
            .into_iter()
            .map(|(l, host, port)| rill_metadata::Endpoint {
                name: l.name,
                host,
                port,
                security_protocol: l.protocol.id(),
            })
            .collect();
        let (advertised_host, advertised_port) = endpoints
            .first()
            .map(|e| (e.host.clone(), e.port))
            .unwrap_or_else(|| ("127.0.0.1".into(), local_addr.port()));
        let inter_broker_listener = config.inter_broker_listener_name()?;
        let connector = Arc::new(network::inter_broker::InterBrokerConnector::from_config(
            &config,
        )?);
        tracing::info!(
            listener = connector.listener(),
            protocol = connector.protocol().name(),
            "brokers reach each other on the inter-broker listener"
        );
        let windows = |(samples, seconds): (u32, u64)| rate::QuotaWindows {
            samples,
            window: std::time::Duration::from_secs(seconds),
        };
        let quota_windows = windows(config.quota_windows()?);
        let replication_windows = windows(config.replication_quota_windows()?);
        let fetcher_config = replica_fetcher::FetcherConfig {
            local_id: node_id,
            max_wait: config.duration_ms("replica.fetch.wait.max.ms")?,
            partition_max_bytes: config
                .get("replica.fetch.max.bytes")
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(1 << 20),
            throttle: Arc::new(replication::replica_fetcher::FollowerThrottle::new(
                replication_windows,
            )),
            connector: connector.clone(),
        };
        let lag_ms = config.duration_ms("replica.lag.time.max.ms")?;
        let lag_ms = i64::try_from(lag_ms.as_millis()).unwrap_or(i64::MAX);
        let log_dirs = log_dir_paths
            .into_iter()
            .zip(log_dir_ids)
            .map(|(path, id)| replication::replica_manager::LogDirConfig { path, id })
            .collect();
        let (replicas, alter_partition_rx) = ReplicaManager::with_log_dirs(
            log_dirs,
            metadata_dir_index,
            fetcher_config,
            lag_ms,
            replication::replica_manager::wall_clock(),
        );
        replicas.check_log_dirs()?;
        log_data_dir(&data_dir_lock, Some(replicas.previous_shutdown()));
        let replicas = Arc::new(replicas);
        let group_config = config.group_config()?;
        let (groups, share_state_asks) = group_coordinator::start(group_config, replicas.clone());
        let leaders = Arc::new(server::BrokerLeaders::default());
        let transactions = coordinator::transaction_coordinator::start(
            config.transaction_config()?,
            replicas.clone(),
            leaders.clone(),
            node_id,
            connector.clone(),
        );
        let (share_config, share_write_timeout, share_prune_interval) =
            config.share_coordinator_config()?;
        let shares = coordinator::share_coordinator::start(
            share_config,
            share_write_timeout,
            share_prune_interval,
            replicas.clone(),
        );
        let share_persister = Arc::new(server::share_persister::ShareStatePersister::new(
            connector.clone(),
        ));
        let txn_verifier = Arc::new(server::txn_verification::TxnVerifier::new(connector));
        let remote_log = remote_log::build(&config, &metadata_log_dir)?;
        let remote_log_config = remote_log::RemoteLogManagerConfig::from_config(&config)?;
        let (published, _) = watch::channel(0);
        let broker = Arc::new(Broker {
            node_id,
            cluster_id,
            max_request_bytes: config.socket_request_max_bytes()?,
            authorizer,
            advertised_host,
            advertised_port: i32::from(advertised_port),
            endpoints,
            inter_broker_listener,
            quorum: quorum.clone(),
            image: RwLock::new(Arc::new(MetadataImage::new())),
            published,
            broker_epoch: AtomicI64::new(-1),
            incarnation_id: rill_protocol::Uuid(*uuid::Uuid::new_v4().as_bytes()),
            replicas: replicas.clone(),
            groups,
            transactions,
            shares,
            share_persister,
            share_partitions: Default::default(),
            txn_verifier,
            producer_ids: tokio::sync::Mutex::new(ProducerIdBlock::default()),
            lost_lease: std::sync::atomic::AtomicBool::new(false),
            lease_losses: std::sync::atomic::AtomicU64::new(0),
            txn_verification: std::sync::atomic::AtomicBool::new(
                metadata_publisher::txn_verification(&config, &MetadataImage::new(), node_id),
            ),
            fetch_sessions: std::sync::Mutex::new(server::fetch_session::FetchSessionCache::new(
                config
                    .max_incremental_fetch_sessions()
                    .unwrap_or(server::fetch_session::DEFAULT_MAX_SESSIONS),
            )),
            quotas: server::quotas::ClientQuotaManager::new(quota_windows, replication_windows),
            delegation_tokens: server::delegation_tokens::DelegationTokenSecrets::new(
                config.delegation_token_secret_key(),
            ),
            remote_log: remote_log.clone(),
            config,
        });
        leaders.set(&broker);
        broker.txn_verifier.set(&broker);
        broker.share_persister.set(&broker);
        server::share_state_initializer::start(Arc::downgrade(&broker), share_state_asks);
        let (shutdown, rx) = watch::channel(false);
        metadata_publisher::start(broker.clone(), rx.clone());
        server::share_partitions::start_expiry(Arc::downgrade(&broker), rx.clone());
        let weak = Arc::downgrade(&broker);
        let weak_broker = weak.clone();
        log_manager::start(
            broker.replicas.clone(),
            Box::new(move || match weak.upgrade() {
                Some(b) => log_manager::CleanerSettings::of(&b.config, &b.image(), b.node_id),
                None => log_manager::CleanerSettings::default(),
            }),
            Box::new(move || {
                weak_broker
                    .upgrade()
                    .and_then(|b| {
                        config::broker_config_value(
                            &b.config,
                            &b.image(),
                            b.node_id,
                            "producer.id.expiration.ms",
                        )
                    })
                    .and_then(|(v, _)| v.trim().parse().ok())
                    .unwrap_or(DEFAULT_PRODUCER_ID_EXPIRATION_MS)
            }),
            log_manager_config,
            rx.clone(),
        );
        replication::assignments::start(broker.clone(), broker.replicas.clone(), rx.clone());
        let weak_broker = Arc::downgrade(&broker);
        replication::replica_manager::alter_log_dirs::start(
            broker.replicas.clone(),
            Box::new(move || {
                let b = weak_broker.upgrade()?;
                config::broker_config_value(
                    &b.config,
                    &b.image(),
                    b.node_id,
                    "replica.alter.log.dirs.io.max.bytes.per.second",
                )
                .and_then(|(v, _)| v.trim().parse::<i64>().ok())
                .filter(|l| (0..i64::MAX).contains(l))
                .map(|l| l as f64)
            }),
            replication_windows,
            rx.clone(),
        );
        alter_partition::start(
            broker.clone(),
            broker.replicas.clone(),
            broker
                .config
                .duration_ms("replica.lag.time.max.ms")
                .unwrap_or(std::time::Duration::from_secs(10)),
            alter_partition_rx,
            rx.clone(),
        );
        if let Some(reader) = remote_log {
            let weak = Arc::downgrade(&broker);
            remote_log::start(
                broker.clone(),
                reader,
                broker.replicas.clone(),
                Box::new(move || weak.upgrade().map(|b| b.image())),
                remote_log_config,
                rx.clone(),
            );
        }
        let task = tokio::spawn(network::serve(
            listeners,
            broker.clone(),
            connection_limits,
            rx.clone(),
        ));
        let http_routes = http::ExtraRoutes::default();
        let http_task = http_listener.map(|l| {
            tokio::spawn(http::serve(
                l,
                http::Source::Broker(broker.clone()),
                metrics_settings,
                http_routes.clone(),
                rx.clone(),
            ))
        });
        let lifecycle = broker_lifecycle::start(broker.clone(), rx);
        lifecycle.wait_unfenced().await;
        Ok(Self {
            local_addr,
            listeners: listener_addrs,
            controller_addr,
            http_addr,
            broker,
            http_routes,
            shutdown,
            task,
            http_task,
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
            self.lifecycle.controlled_shutdown(&self.broker).await;
        }
        let _ = self.shutdown.send(true);
        let _ = self.task.await;
        if let Some(http) = self.http_task {
            let _ = http.await;
        }
        // Each step logged, so that a shutdown that hangs says where.
        tracing::info!("listeners closed");
        self.broker.replicas.shutdown();
        // Released only now that the logs are closed and the clean-shutdown marker is
        // written (the caller may hold it longer, see `data_dir_lock`).
        drop(self.data_dir_lock);
    }
}

/// Kafka's `producer.id.expiration.ms` (one day).
const DEFAULT_PRODUCER_ID_EXPIRATION_MS: i64 = 86_400_000;

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
        let lock = Arc::new(DataDirLock::acquire_all(&config.all_dirs())?);
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
