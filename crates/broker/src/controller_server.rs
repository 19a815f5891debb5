//! A controller-only node (`process.roles=controller`, Kafka's `ControllerServer`): a
//! voter of the metadata quorum whose event loop acts while it leads, and nothing of a
//! broker.
//!
//! It opens no client listener, never registers as a broker (so Metadata never lists
//! it), hosts no partitions and runs no metadata publisher: the quorum's own state
//! machine applies the committed records to the image the controller decides from, and
//! that is all a controller needs. Brokers reach it over the quorum port only, with
//! forwarded controller events and, for broker-only nodes, their join as observers. Its
//! HTTP listener (`http.listeners`) serves the health checks and the process's and the
//! quorum's metrics.

use std::net::SocketAddr;
use std::sync::Arc;

use rill_metadata::MetadataQuorum;
use tokio::sync::watch;

use crate::config::BrokerConfig;
use crate::data_dir_lock::DataDirLock;
use crate::error::BrokerError;

/// A running controller-only node.
pub struct ControllerServer {
    /// Where the quorum (Raft and forwarded controller requests) listens.
    pub controller_addr: SocketAddr,
    pub cluster_id: String,
    pub quorum: Arc<MetadataQuorum>,
    /// The HTTP listener's address (`http.listeners`), `None` when it is off.
    pub http_addr: Option<SocketAddr>,
    /// The data directory's lock (the metadata log is in it), held while this node runs.
    data_dir_lock: Arc<DataDirLock>,
    shutdown: watch::Sender<bool>,
    http_task: Option<tokio::task::JoinHandle<()>>,
}

impl ControllerServer {
    /// Joins (or forms, with the other voters) the controller quorum and runs the
    /// controller event loop. Returns once the quorum listener is up; it does not wait
    /// for an election, which needs a majority of the voters.
    pub async fn start(config: BrokerConfig) -> Result<Self, BrokerError> {
        let lock = Arc::new(DataDirLock::acquire_all(&config.all_dirs())?);
        Self::start_with_lock(config, lock).await
    }

    /// As [`ControllerServer::start`], in the data directory that `lock` holds.
    pub async fn start_with_lock(
        config: BrokerConfig,
        data_dir_lock: Arc<DataDirLock>,
    ) -> Result<Self, BrokerError> {
        crate::shared_server::check_lock_is_for(&config, &data_dir_lock)?;
        // Before anything else can fail, so that a typo is seen even when it is why.
        config.warn_unknown_keys();
        config.validate()?;
        let roles = config.process_roles()?;
        if roles.broker {
            return Err(BrokerError::Config(
                "process.roles has the broker role: start it with Server::start (Node::start \
                 picks)"
                    .into(),
            ));
        }
        let metrics_settings = crate::http::MetricsSettings::from_config(&config)?;
        crate::shared_server::log_data_dir(&data_dir_lock, None);
        let (quorum, cluster_id) = crate::shared_server::start_quorum(&config, roles).await?;
        let quorum = Arc::new(quorum);
        crate::shared_server::apply_bootstrap_scram(&config, &quorum)?;
        let http_listener = crate::http::bind(&config).await?;
        let http_addr = http_listener
            .as_ref()
            .map(crate::http::HttpListener::local_addr);
        if let Some(l) = &http_listener {
            tracing::info!(
                addr = %l.local_addr(),
                security = %l.describe(),
                "http listener (/metrics, /health/live, /health/ready)"
            );
        }
        let (shutdown, rx) = watch::channel(false);
        let http_task = http_listener.map(|l| {
            tokio::spawn(crate::http::serve(
                l,
                crate::http::Source::Controller(quorum.clone()),
                metrics_settings,
                crate::http::ExtraRoutes::default(),
                rx,
            ))
        });
        Ok(Self {
            controller_addr: quorum.local_addr(),
            cluster_id,
            quorum,
            http_addr,
            data_dir_lock,
            shutdown,
            http_task,
        })
    }

    /// The lock on the data directory (see `Server::data_dir_lock`).
    pub fn data_dir_lock(&self) -> Arc<DataDirLock> {
        self.data_dir_lock.clone()
    }

    /// Leaves the quorum: stops Raft and the listener. The files stay for the next start.
    pub async fn shutdown(self) {
        // The listener holds the quorum: stopped first, so that the quorum can stop.
        let _ = self.shutdown.send(true);
        if let Some(http) = self.http_task {
            let _ = http.await;
        }
        match Arc::try_unwrap(self.quorum) {
            Ok(quorum) => {
                if let Err(e) = quorum.shutdown().await {
                    tracing::warn!(error = %e, "controller quorum did not stop cleanly");
                }
            }
            // Someone still holds the quorum; dropping this handle aborts nothing, the
            // process exit does.
            Err(_) => tracing::debug!("controller quorum still shared at shutdown"),
        }
        drop(self.data_dir_lock);
    }
}
