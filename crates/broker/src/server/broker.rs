//! The state every connection shares (Kafka's `KafkaApis` with what it holds: the metadata
//! cache, the replica manager, the group coordinator), and the calls its handlers make to
//! the controller. The handlers are the `impl Broker` blocks of the sibling modules, one per
//! group of APIs.
//!
//! The metadata publisher is the only writer of the published image and its offset
//! ([`Broker::image`], [`Broker::wait_published`]); this module never calls it.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use rill_metadata::{
    ControllerEvent, ControllerResponse, MetadataImage, MetadataQuorum, TopicImage, RESOURCE_TOPIC,
};
use rill_protocol::ErrorCode;
use rill_storage::LogConfig;
use tokio::sync::watch;

use crate::config::{self, BrokerConfig};
use crate::coordinator::group_coordinator::GroupCoordinatorHandle;
use crate::coordinator::transaction_coordinator::TransactionCoordinatorHandle;
use crate::replication::replica_manager::ReplicaManager;

/// How long an admin request waits for the controller (Kafka's request timeouts are of
/// this order; clients retry after it).
pub const CONTROLLER_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// How long `/health/ready` gives the image to reach the committed metadata offset.
pub const READY_CATCH_UP: Duration = Duration::from_secs(1);

/// State shared by every connection.
pub struct Broker {
    pub config: BrokerConfig,
    pub node_id: i32,
    pub cluster_id: String,
    /// Host and port that clients are told to connect to.
    pub advertised_host: String,
    pub advertised_port: i32,
    /// Every client listener's advertised endpoint, as this broker registers them.
    pub endpoints: Vec<rill_metadata::Endpoint>,
    /// `inter.broker.listener.name`: the listener followers fetch from leaders on.
    pub inter_broker_listener: String,
    pub max_request_bytes: usize,
    /// `authorizer.class.name`'s authorizer; `None` when none is configured, and then
    /// every request is allowed, as in Kafka (see `server::auth_helper`).
    pub authorizer: Option<Arc<rill_metadata::StandardAuthorizer>>,
    /// The controller quorum this node votes in or observes; controller requests go
    /// through it.
    pub quorum: Arc<MetadataQuorum>,
    /// The metadata image this broker has applied and acted on.
    pub(crate) image: RwLock<Arc<MetadataImage>>,
    /// The `next_offset` of the published image, for waiting on a controller decision.
    pub(crate) published: watch::Sender<i64>,
    /// This broker's epoch from its registration (-1 before it registered).
    pub(crate) broker_epoch: AtomicI64,
    /// This process's incarnation, which it registers with; the metadata publisher acts
    /// on the image only once it holds that registration (see `metadata_publisher`).
    pub incarnation_id: rill_protocol::Uuid,
    pub replicas: Arc<ReplicaManager>,
    pub groups: GroupCoordinatorHandle,
    pub transactions: TransactionCoordinatorHandle,
    /// KIP-932's share coordinator, on `__share_group_state`.
    pub shares: crate::coordinator::share_coordinator::ShareCoordinatorHandle,
    /// The share-partition leaders' way to the share coordinators.
    pub share_persister: Arc<crate::server::share_persister::ShareStatePersister>,
    /// The share-partitions this broker leads and the share sessions on it.
    pub share_partitions: crate::server::share_partitions::SharePartitions,
    /// KIP-890 part 1: the partition leader's verification of transactional produces.
    pub(crate) txn_verifier: Arc<crate::server::txn_verification::TxnVerifier>,
    pub(crate) producer_ids: tokio::sync::Mutex<ProducerIdBlock>,
    /// This broker held its controller lease and lost it (cut off from the controller, or
    /// fenced): its clients' connections are closed at their next request, so that they
    /// ask another broker for metadata (see `server::Broker::handle_request`).
    pub(crate) lost_lease: std::sync::atomic::AtomicBool,
    /// How many times this broker lost a lease it held: the connection generation
    /// ([`crate::network::RequestHandler::connection_generation`]). A connection that was
    /// served before a loss is closed at its next request even once the lease is back, so
    /// that no client carries on a pipeline of which some produce requests were refused
    /// while the lease was gone: the next one would be answered OUT_OF_ORDER_SEQUENCE, and
    /// librdkafka reads that as "the refused batches were not written" and re-sends them
    /// under a new epoch, duplicating any that were.
    pub(crate) lease_losses: std::sync::atomic::AtomicU64,
    /// `transaction.partition.verification.enable` as the latest image sets it (dynamic,
    /// default true): taken when an image is applied, not worked out for every produce.
    pub(crate) txn_verification: std::sync::atomic::AtomicBool,
    /// KIP-227's incremental fetch sessions (see `server::fetch_session`).
    pub(crate) fetch_sessions: std::sync::Mutex<crate::server::fetch_session::FetchSessionCache>,
    /// The rates of the clients that quotas govern (see `server::quotas`).
    pub(crate) quotas: crate::server::quotas::ClientQuotaManager,
    /// `delegation.token.secret.key` and the SCRAM credentials of tokens.
    pub(crate) delegation_tokens: crate::server::delegation_tokens::DelegationTokenSecrets,
    /// The remote tier's reader, when `remote.log.storage.system.enable` is on (see
    /// `remote_log`).
    pub remote_log: Option<Arc<crate::remote_log::reader::RemoteLogReader>>,
}

/// The block of producer ids the controller gave this broker.
#[derive(Default)]
pub(crate) struct ProducerIdBlock {
    pub(crate) next: i64,
    pub(crate) end: i64,
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

    /// Whether this broker is ready for traffic (`/health/ready`): registered with the
    /// controller and holding its lease, its image caught up with what the metadata
    /// quorum has committed, its data directory online, and every partition its image
    /// names it leader of open here as leader. `Err` carries the first reason it is not.
    ///
    /// Caught up means the image reaches, within [`READY_CATCH_UP`], the offset the
    /// quorum had committed when asked: the image always trails the log by the moment it
    /// takes to apply a record, and a check of the two at one instant would flap.
    pub async fn readiness(&self) -> Result<(), String> {
        if self.broker_epoch() < 0 {
            return Err("not registered with the controller".into());
        }
        if self.lost_lease.load(Ordering::Acquire) || !self.replicas.lease_held() {
            return Err("no controller lease (fenced or cut off)".into());
        }
        let committed = self.quorum.committed_offset();
        if !self.wait_published(committed, READY_CATCH_UP).await {
            let published = *self.published.borrow();
            return Err(format!(
                "metadata log applied up to {published}, committed up to {committed}"
            ));
        }
        if let Some(failure) = self.replicas.log_dir_failure().failure() {
            return Err(format!("data directory offline: {failure}"));
        }
        let image = self.image();
        for topic in image.topics.values() {
            for (index, p) in &topic.partitions {
                if p.leader != self.node_id {
                    continue;
                }
                let tp = rill_storage::TopicPartition {
                    topic: topic.name.clone(),
                    partition: *index,
                };
                if self.replicas.leader_partition(&tp).is_err() {
                    return Err(format!(
                        "leads {tp} in the metadata image but has it offline"
                    ));
                }
            }
        }
        Ok(())
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
    /// Kafka's checks of a topic's tiered-storage configs against each other and against
    /// this broker's `remote.log.storage.system.enable`, with `overrides` the topic's
    /// overrides after the change (see [`crate::config::validate_remote_log_configs`]).
    pub fn check_remote_log_configs(
        &self,
        image: &MetadataImage,
        overrides: &std::collections::BTreeMap<String, String>,
        was_enabled: bool,
    ) -> Result<(), String> {
        let value = |name: &str| {
            overrides.get(name).cloned().unwrap_or_else(|| {
                crate::config::topic_config_def(name)
                    .and_then(|d| {
                        if d.broker_key == crate::config::NO_BROKER_KEY {
                            Some(d.default.to_string())
                        } else {
                            crate::config::broker_config_value(
                                &self.config,
                                image,
                                self.node_id,
                                d.broker_key,
                            )
                            .map(|(v, _)| v)
                        }
                    })
                    .unwrap_or_default()
            })
        };
        let system_enabled = crate::config::broker_config_value(
            &self.config,
            image,
            self.node_id,
            "remote.log.storage.system.enable",
        )
        .is_some_and(|(v, _)| v.trim().eq_ignore_ascii_case("true"));
        crate::config::validate_remote_log_configs(&value, was_enabled, system_enabled)
    }

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
