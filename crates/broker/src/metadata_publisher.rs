//! The metadata publisher: follows the committed metadata log into this broker's image
//! and acts on what changed (Kafka's `BrokerMetadataPublisher`).
//!
//! # Design note
//!
//! 1. One task waits for the quorum's committed offset to move, reads the records after
//!    its image's `next_offset` (or a whole image when it fell behind a snapshot) and
//!    applies them to a copy of the image.
//! 2. It diffs the old and new images for this broker ([`LocalReplicaChanges`]): replicas
//!    it now leads become leaders, those it follows become followers, those it no longer
//!    hosts are deleted; topics whose configs changed are reconfigured; the group
//!    coordinator loads the `__consumer_offsets` partitions this broker now leads and drops
//!    those it lost, after it has heard of the topics that changed (consumer groups
//!    resolve their subscriptions against them).
//! 3. Only then is the new image published to request handlers, and its offset to
//!    waiters ([`crate::server::Broker::wait_published`]): a client that learns from this broker
//!    that it leads a partition finds the partition's log open.
//!
//! 4. A starting broker acts on nothing until its image holds the registration of its
//!    own incarnation (Kafka's brokers likewise wait to catch up before their publishers
//!    run); it then acts on everything that image says at once. Until then the image
//!    it reads at start-up is a past state: one where this broker led a partition with
//!    itself alone in the ISR would make it leader again and declare all of its log
//!    committed, including what it wrote after that state and what the partition's
//!    real leader has since replaced (found by `replication_sim`).
//!
//! The log is applied in order by one task, so every broker's image passes through the
//! same sequence of states as every other's; acting on each diff in that order makes the
//! replica set converge to what the metadata says.

use std::collections::BTreeSet;
use std::sync::Arc;

use rill_metadata::{CommittedRecords, LocalReplicaChanges, MetadataImage};
use rill_storage::TopicPartition;
use tokio::sync::watch;

use crate::config::{BrokerConfig, METADATA_LOG_DIR};
use crate::coordinator::group_coordinator::OFFSETS_TOPIC;
use crate::replication::replica_fetcher::ThrottleSettings;
use crate::replication::replica_manager::PartitionChange;
use crate::server::Broker;
use rill_share::SHARE_GROUP_STATE_TOPIC;
use rill_transaction::TRANSACTION_STATE_TOPIC;

pub fn start(broker: Arc<Broker>, shutdown: watch::Receiver<bool>) {
    tokio::spawn(run(broker, shutdown));
}

async fn run(broker: Arc<Broker>, mut shutdown: watch::Receiver<bool>) {
    let mut committed = broker.quorum.subscribe();
    let mut current = broker.image();
    let mut caught_up = false;
    loop {
        let next = match broker.quorum.read_committed(current.next_offset) {
            CommittedRecords::Records(records) if records.is_empty() => None,
            CommittedRecords::Records(records) => {
                let mut image = (*current).clone();
                for (offset, record) in &records {
                    if let Err(e) = image.apply(record) {
                        // Every replica skips the same record alike (see MetadataImage).
                        tracing::warn!(offset, error = %e, "metadata record skipped");
                    }
                }
                Some(image)
            }
            CommittedRecords::Image(image) => Some(*image),
        };
        if let Some(new) = next {
            let new = Arc::new(new);
            if caught_up {
                publish(&broker, &current, &new).await;
            } else if holds_own_registration(&broker, &new) {
                caught_up = true;
                publish(&broker, &MetadataImage::new(), &new).await;
            } else {
                install(&broker, &new);
            }
            current = new;
        }
        tokio::select! {
            changed = committed.changed() => if changed.is_err() { return },
            _ = shutdown.changed() => return,
        }
    }
}

/// Whether `image` has caught up with this process: it holds the registration of this
/// incarnation (design note, point 4).
fn holds_own_registration(broker: &Broker, image: &MetadataImage) -> bool {
    image
        .broker(broker.node_id)
        .is_some_and(|b| b.incarnation_id == broker.incarnation_id)
}

/// Makes `new` the image request handlers read and waiters wait on, without acting on it.
fn install(broker: &Broker, new: &MetadataImage) {
    let offset = new.next_offset;
    *broker.image.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(new.clone());
    broker.published.send_replace(offset);
}

async fn publish(broker: &Broker, old: &MetadataImage, new: &MetadataImage) {
    if crate::server::consumer_groups::topics_changed(old, new) {
        // Consumer groups (KIP-848) follow topic creation, deletion and new partitions;
        // the coordinator hears of them before it loads any partition of this image.
        let topics = crate::server::consumer_groups::topics_image(new);
        if let Ok(answer) = broker
            .groups
            .submit(crate::coordinator::group_coordinator::GroupCall::UpdateTopics(topics))
            .await
        {
            let _ = answer.await;
        }
    }
    broker.replicas.set_broker_statuses(
        new.brokers
            .values()
            .map(|b| {
                (
                    b.id,
                    crate::replication::isr::BrokerStatus {
                        broker_epoch: b.epoch,
                        fenced: b.fenced,
                        in_controlled_shutdown: b.in_controlled_shutdown,
                    },
                )
            })
            .collect(),
    );
    let changes = LocalReplicaChanges::between(old, new, broker.node_id);
    let to_tp = |tp: &rill_metadata::TopicPartition| TopicPartition {
        topic: tp.topic.clone(),
        partition: tp.partition,
    };
    let led_before = |tp: &rill_metadata::TopicPartition| {
        old.partition(&tp.topic, tp.partition)
            .is_some_and(|p| p.leader == broker.node_id)
    };
    for (tp, topic_id) in &changes.deletes {
        if led_before(tp) {
            resign_coordinator(broker, tp).await;
            // A deleted tiered topic: its last leader deletes the partition's objects
            // from the remote tier (in the background; a failure leaves them, logged).
            let tiered = old.topic_config(&tp.topic, "remote.storage.enable") == Some("true")
                || old.remote_segments(*topic_id, tp.partition).is_some();
            if let (Some(reader), true, false) = (
                broker.remote_log.clone(),
                tiered,
                new.topics.contains_key(topic_id),
            ) {
                let (topic, id, partition) = (tp.topic.clone(), *topic_id, tp.partition);
                tokio::spawn(async move {
                    crate::remote_log::delete_partition(&reader, &topic, id, partition).await
                });
            }
        }
        if let Err(e) = broker.replicas.delete_partition(&to_tp(tp)) {
            tracing::error!(topic = %tp.topic, partition = tp.partition, error = %e, "deleting replica failed");
        }
    }
    // Opening logs and recording leader epochs does blocking file I/O for every partition
    // (thousands at a restart): it runs on blocking threads, several partitions at once,
    // rather than stalling a runtime worker for its whole length.
    let as_changes = |list: &[(
        rill_metadata::TopicPartition,
        rill_protocol::Uuid,
        rill_metadata::PartitionRegistration,
    )]| {
        list.iter()
            .map(|(tp, topic_id, registration)| PartitionChange {
                tp: to_tp(tp),
                topic_id: *topic_id,
                registration: registration.clone(),
                config: broker.log_config(new, &tp.topic),
            })
            .collect::<Vec<_>>()
    };
    let leaders = as_changes(&changes.leaders);
    let followers = as_changes(&changes.followers);
    // Kafka refuses to start with tiered topics and tiered storage off; Rill serves
    // them, but their local tier only grows (nothing is ever copied): say so.
    if broker.remote_log.is_none() {
        let mut tiered: Vec<&str> = leaders
            .iter()
            .chain(&followers)
            .filter(|c| c.config.remote_storage_enable)
            .map(|c| c.tp.topic.as_str())
            .collect();
        tiered.dedup();
        for topic in tiered {
            tracing::warn!(topic, "topic has remote.storage.enable=true but this broker has remote.log.storage.system.enable off: its segments stay local and are never deleted by local retention");
        }
    }
    // Every log first, leaders' and followers' alike (at a start-up, every log this
    // broker hosts): the data directory's clean-shutdown marker is removed once they are
    // all open and before any of them changes (see `replica_manager`).
    let to_open: Vec<PartitionChange> = leaders.iter().chain(&followers).cloned().collect();
    let replicas = broker.replicas.clone();
    if let Err(e) = tokio::task::spawn_blocking(move || replicas.open_logs(&to_open)).await {
        tracing::error!(error = %e, "opening logs failed");
    }
    let replicas = broker.replicas.clone();
    let results = match tokio::task::spawn_blocking(move || replicas.become_leaders(&leaders)).await
    {
        Ok(results) => results,
        Err(e) => {
            tracing::error!(error = %e, "applying leaderships failed");
            Vec::new()
        }
    };
    for ((tp, _, _), result) in changes.leaders.iter().zip(results) {
        match result {
            Ok(()) => {
                if !led_before(tp) {
                    elect_coordinator(broker, tp).await;
                }
            }
            Err(e) => report_failure(tp, "becoming leader failed", &e),
        }
    }
    for (tp, topic_id, registration) in &changes.followers {
        if led_before(tp) {
            resign_coordinator(broker, tp).await;
        }
        let config = broker.log_config(new, &tp.topic);
        let leader_addr = crate::server::metadata::broker_endpoint(
            new,
            registration.leader,
            &broker.inter_broker_listener,
        )
        .and_then(|(host, port)| crate::network::inter_broker::PeerEndpoint::resolve(host, port));
        if let Err(e) = broker.replicas.become_follower(
            &to_tp(tp),
            *topic_id,
            registration,
            &config,
            leader_addr,
        ) {
            report_failure(tp, "becoming follower failed", &e);
        }
    }
    let mut reconfigured = BTreeSet::new();
    for topic in changed_topic_configs(old, new) {
        broker
            .replicas
            .reconfigure(&topic, &broker.log_config(new, &topic));
        reconfigured.insert(topic);
    }
    // A broker-level default changed (this broker's or the cluster's): every topic that
    // inherits it takes it live.
    for topic in broker.topics_affected_by_broker_config_change(old, new) {
        if !reconfigured.contains(&topic) {
            broker
                .replicas
                .reconfigure(&topic, &broker.log_config(new, &topic));
        }
    }
    broker
        .replicas
        .follower_throttle()
        .set(follower_throttle(broker, new));
    broker.quotas.set_leader_replication_limit(replication_rate(
        broker,
        new,
        "leader.replication.throttled.rate",
    ));
    let verification = txn_verification(&broker.config, new, broker.node_id);
    broker
        .txn_verification
        .store(verification, std::sync::atomic::Ordering::Relaxed);
    let registered_now = new.broker(broker.node_id).map(|b| b.epoch);
    if registered_now != old.broker(broker.node_id).map(|b| b.epoch) {
        if let Some(epoch) = registered_now {
            tracing::debug!(epoch, "applied this broker's registration");
        }
    }
    install(broker, new);
}

/// `transaction.partition.verification.enable` (dynamic, default true).
pub(crate) fn txn_verification(config: &BrokerConfig, image: &MetadataImage, node_id: i32) -> bool {
    crate::config::broker_config_value(
        config,
        image,
        node_id,
        "transaction.partition.verification.enable",
    )
    .is_none_or(|(v, _)| !v.trim().eq_ignore_ascii_case("false"))
}

/// A replication throttle rate (`leader.` or `follower.replication.throttled.rate`, at
/// its highest level) when it limits anything: its default, `Long.MAX_VALUE`, does not;
/// 0 stops throttled replicas altogether.
fn replication_rate(broker: &Broker, image: &MetadataImage, key: &str) -> Option<f64> {
    let (value, _) =
        crate::config::broker_config_value(&broker.config, image, broker.node_id, key)?;
    let limit: i64 = value.trim().parse().ok()?;
    (0..i64::MAX).contains(&limit).then_some(limit as f64)
}

/// The follower side of the replication throttle as the image sets it: this broker's
/// `follower.replication.throttled.rate` (at its highest level) and every topic's
/// `follower.replication.throttled.replicas`.
fn follower_throttle(broker: &Broker, image: &MetadataImage) -> ThrottleSettings {
    let limit = replication_rate(broker, image, "follower.replication.throttled.rate");
    let replicas = match limit {
        None => Default::default(),
        Some(_) => image
            .configs
            .iter()
            .filter(|((resource_type, _), _)| *resource_type == rill_metadata::RESOURCE_TOPIC)
            .filter_map(|((_, topic), entries)| {
                entries
                    .get("follower.replication.throttled.replicas")
                    .map(|v| (topic.clone(), v.clone()))
            })
            .collect(),
    };
    ThrottleSettings { limit, replicas }
}

/// Logs a partition the publisher could not act on. Refusals because the broker is
/// shutting down are expected (the controlled shutdown's own leadership changes arrive
/// while the logs are being closed), and so are those of a partition whose log directory
/// failed: both are logged at debug level only.
fn report_failure(tp: &rill_metadata::TopicPartition, what: &str, e: &crate::error::BrokerError) {
    if matches!(e, crate::error::BrokerError::ShuttingDown) {
        tracing::debug!(topic = %tp.topic, partition = tp.partition, "{what}: shutting down");
    } else if matches!(e, crate::error::BrokerError::LogDirOffline(_)) {
        // Said once, when the directory failed; every later update of its partitions
        // is ignored here, as Kafka ignores those of its offline partitions.
        tracing::debug!(topic = %tp.topic, partition = tp.partition, error = %e, "{what}");
    } else {
        tracing::error!(topic = %tp.topic, partition = tp.partition, error = %e, "{what}");
    }
}

/// Topics (present in both images) whose config overrides differ.
fn changed_topic_configs(old: &MetadataImage, new: &MetadataImage) -> Vec<String> {
    let names: BTreeSet<&String> = new.topics_by_name.keys().collect();
    names
        .into_iter()
        .filter(|name| old.topics_by_name.contains_key(*name))
        .filter(|name| Broker::topic_overrides(old, name) != Broker::topic_overrides(new, name))
        .cloned()
        .collect()
}

/// Deletes partition directories that the metadata does not place on this broker, in
/// every online log directory: what a crash between a topic's deletion (or a
/// reassignment away) and the removal of its logs leaves behind. Called only once this broker has caught up with the metadata log,
/// so that a log is never taken for a stray because the image was behind. Directories
/// whose names are not partition names (the metadata log among them) are left alone.
pub fn remove_stray_partitions(broker: &Broker) {
    let image = broker.image();
    let failures = broker.replicas.log_dir_failure().clone();
    for (index, log_dir) in broker.replicas.log_dirs().into_iter().enumerate() {
        // A failed directory is not written to again, not even to remove from it.
        if failures.is_offline(index) {
            continue;
        }
        let Ok(entries) = std::fs::read_dir(&log_dir.path) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name == METADATA_LOG_DIR {
                continue;
            }
            let Ok(tp) = rill_storage::parse_partition_dir_name(&name) else {
                continue;
            };
            let hosted = image
                .partition(&tp.topic, tp.partition)
                .is_some_and(|p| p.replicas.contains(&broker.node_id));
            if !hosted && entry.path().is_dir() && broker.replicas.get(&tp).is_none() {
                tracing::warn!(dir = %entry.path().display(), "removing a log the metadata does not place here");
                if let Err(e) = std::fs::remove_dir_all(entry.path()) {
                    tracing::error!(dir = %entry.path().display(), error = %e, "removal failed");
                }
            }
        }
    }
}

/// Loads a coordinator's partition this broker now leads.
async fn elect_coordinator(broker: &Broker, tp: &rill_metadata::TopicPartition) {
    if tp.topic == OFFSETS_TOPIC {
        broker.groups.elect(tp.partition).await;
    } else if tp.topic == TRANSACTION_STATE_TOPIC {
        broker.transactions.elect(tp.partition).await;
    } else if tp.topic == SHARE_GROUP_STATE_TOPIC {
        broker.shares.elect(tp.partition).await;
    }
}

/// Drops a coordinator's partition this broker no longer leads.
async fn resign_coordinator(broker: &Broker, tp: &rill_metadata::TopicPartition) {
    if tp.topic == OFFSETS_TOPIC {
        broker.groups.resign(tp.partition).await;
    } else if tp.topic == TRANSACTION_STATE_TOPIC {
        broker.transactions.resign(tp.partition).await;
    } else if tp.topic == SHARE_GROUP_STATE_TOPIC {
        broker.shares.resign(tp.partition).await;
    }
}
