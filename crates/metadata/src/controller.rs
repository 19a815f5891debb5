//! [`QuorumController`]: the active controller's decisions as a pure state machine.
//!
//! # Design
//! The controller is a single-threaded event loop (the seed's `EventExecutorThread`):
//! the broker shell takes one [`ControllerEvent`] off its queue, calls
//! [`QuorumController::handle`] with the current [`MetadataImage`] and the time, appends
//! the returned records to the metadata log as one batch, applies them to its image, and
//! answers once they are committed. Nothing here does I/O or reads a clock.
//!
//! 1. Every decision is computed against a scratch copy of the image to which each
//!    record is applied as soon as it is emitted ([`Scratch`]), so a handler that emits
//!    several records (fence a broker, then move each of its leaderships) sees their
//!    combined effect, exactly as every replica will when it applies the batch.
//! 2. Broker liveness is a lease: each heartbeat renews it, [`QuorumController::tick`]
//!    fences the brokers whose lease (`broker.session.timeout.ms`) lapsed. Leases are
//!    in memory only (they are not records): a newly active controller starts each
//!    registered broker's lease at the first time it sees it.
//! 3. A broker that is fenced or shutting down leaves every ISR (unless it is the last
//!    member: the ISR is never empty, so that the last leader can come back and lead
//!    again, as in Kafka) and every leadership moves to a live ISR member, in replica
//!    order. With no live ISR member the partition gets no leader (-1), unless unclean
//!    leader election is enabled for the topic, when the first live replica leads with
//!    an ISR of itself.
//! 4. A broker's epoch is the offset of its registration record; it is unfenced by the
//!    first heartbeat that reports a metadata offset at or past it (it has caught up),
//!    and it then takes back the leadership of leaderless partitions in its ISR.
//!
//! Why this keeps "at most one leader per partition per leader epoch": every leader
//! change goes through one `PartitionChangeRecord` that names a leader, and applying it
//! bumps the leader epoch, so two different leaders never share an epoch; brokers
//! compare epochs, and a stale leader's AlterPartition is refused (FENCED_LEADER_EPOCH,
//! INVALID_UPDATE_VERSION).

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use rill_protocol::generated::metadata::register_broker_record::BrokerEndpoint;
use rill_protocol::generated::metadata::{
    BrokerRegistrationChangeRecord, ConfigRecord, FeatureLevelRecord, FenceBrokerRecord,
    PartitionChangeRecord, PartitionRecord, ProducerIdsRecord, RegisterBrokerRecord,
    RemoveTopicRecord, TopicRecord, UnfenceBrokerRecord, UnregisterBrokerRecord,
};
use rill_protocol::{ErrorCode, Uuid};

use crate::api::*;
use crate::image::{
    MetadataImage, PartitionRegistration, NO_LEADER, NO_LEADER_CHANGE, RESOURCE_BROKER,
    RESOURCE_CLIENT_METRICS, RESOURCE_GROUP, RESOURCE_TOPIC,
};
use crate::placement::place_replicas;
use crate::record::MetadataRecord;

/// The controller's configuration, under Kafka's names.
#[derive(Debug, Clone, PartialEq)]
pub struct ControllerConfig {
    /// `broker.session.timeout.ms`: a broker not heard from for this long is fenced.
    pub broker_session_timeout_ms: i64,
    /// `broker.id.generation.enable`.
    pub broker_id_generation_enable: bool,
    /// `reserved.broker.max.id`: generated ids are above it.
    pub reserved_broker_max_id: i32,
    /// `num.partitions`: partitions of a topic created with -1.
    pub num_partitions: i32,
    /// `default.replication.factor`.
    pub default_replication_factor: i16,
    /// `unclean.leader.election.enable`, the cluster default (a topic config overrides).
    pub unclean_leader_election_enable: bool,
    /// Producer ids handed out per AllocateProducerIds (Kafka's block size, 1000).
    pub producer_id_block_size: i64,
    /// `auto.leader.rebalance.enable`: [`QuorumController::tick`] moves leadership
    /// back to preferred replicas that are live and in sync.
    pub auto_leader_rebalance_enable: bool,
    /// `leader.imbalance.check.interval.seconds`, in ms.
    pub leader_imbalance_check_interval_ms: i64,
    /// Seeds topic ids and placement, so tests are reproducible.
    pub seed: u64,
    /// `delegation.token.*`.
    pub delegation_tokens: crate::delegation_tokens::DelegationTokenConfig,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        Self {
            broker_session_timeout_ms: 9_000,
            broker_id_generation_enable: true,
            reserved_broker_max_id: 1_000,
            num_partitions: 1,
            default_replication_factor: 1,
            unclean_leader_election_enable: false,
            producer_id_block_size: 1_000,
            auto_leader_rebalance_enable: true,
            leader_imbalance_check_interval_ms: 300_000,
            seed: 0x5eed,
            delegation_tokens: Default::default(),
        }
    }
}

/// Topic config names the controller accepts (Kafka's `TopicConfig`).
pub const TOPIC_CONFIGS: &[&str] = &[
    "cleanup.policy",
    "compression.type",
    "compression.gzip.level",
    "compression.lz4.level",
    "compression.zstd.level",
    "delete.retention.ms",
    "file.delete.delay.ms",
    "flush.messages",
    "flush.ms",
    "index.interval.bytes",
    "max.compaction.lag.ms",
    "max.message.bytes",
    "message.downconversion.enable",
    "message.format.version",
    "message.timestamp.after.max.ms",
    "message.timestamp.before.max.ms",
    "message.timestamp.type",
    "min.cleanable.dirty.ratio",
    "min.compaction.lag.ms",
    "min.insync.replicas",
    "preallocate",
    "retention.bytes",
    "retention.ms",
    "segment.bytes",
    "segment.index.bytes",
    "segment.jitter.ms",
    "segment.ms",
    "unclean.leader.election.enable",
    "local.retention.bytes",
    "local.retention.ms",
    "remote.storage.enable",
    "remote.log.copy.disable",
    "remote.log.delete.on.disable",
    "follower.replication.throttled.replicas",
    "leader.replication.throttled.replicas",
];

/// The longest topic name Kafka accepts.
const MAX_TOPIC_NAME_LEN: usize = 249;

/// The active controller: configuration, broker leases and a random source. Everything
/// else it decides from is the image passed to each call.
#[derive(Debug, Clone)]
pub struct QuorumController {
    config: ControllerConfig,
    /// Last heartbeat (or registration) per broker, in ms.
    last_contact_ms: BTreeMap<i32, i64>,
    /// Brokers that registered or heartbeated to this controller itself. A lease that a
    /// new controller only assumed at takeover keeps a broker unfenced, but does not make
    /// a new registration of its id a duplicate: after a crash the restarted process
    /// must not wait a whole session for a lease nobody holds.
    heard_from: std::collections::BTreeSet<i32>,
    /// When [`QuorumController::tick`] last checked for leader imbalance.
    last_rebalance_ms: Option<i64>,
    /// When [`QuorumController::tick`] last removed expired delegation tokens.
    last_token_sweep_ms: Option<i64>,
    rng: u64,
}

/// The image as it will be once the records emitted so far are applied.
pub(crate) struct Scratch<'a> {
    image: Cow<'a, MetadataImage>,
    records: Vec<MetadataRecord>,
}

impl<'a> Scratch<'a> {
    pub(crate) fn new(image: &'a MetadataImage) -> Self {
        Self {
            image: Cow::Borrowed(image),
            records: Vec::new(),
        }
    }

    pub(crate) fn image(&self) -> &MetadataImage {
        &self.image
    }

    pub(crate) fn emit(&mut self, record: MetadataRecord) {
        // Records the controller builds always fit the image it built them against; an
        // error here is a controller bug, and the record is still emitted so replicas
        // and the scratch image stay in step.
        if let Err(e) = self.image.to_mut().apply(&record) {
            tracing::error!(error = %e, "controller emitted a record that does not apply");
        }
        self.records.push(record);
    }

    pub(crate) fn finish(self, response: ControllerResponse) -> ControllerResult {
        ControllerResult {
            records: self.records,
            response,
        }
    }
}

/// How a new leader may be chosen for one partition change.
#[derive(Clone, Copy)]
pub(crate) struct Election {
    /// Move leadership to the preferred replica if it is a live ISR member.
    pub(crate) preferred: bool,
    /// Fall back to an out-of-sync live replica.
    pub(crate) unclean: bool,
    /// Re-name the current leader even if it stays, to bump the leader epoch
    /// (replicas removed by a reassignment must see a new epoch).
    pub(crate) bump_epoch: bool,
}

pub(crate) const REGULAR: Election = Election {
    preferred: false,
    unclean: false,
    bump_epoch: false,
};

/// The target state of one partition; [`change_record`] turns it into a record.
pub(crate) struct Target {
    pub(crate) replicas: Vec<i32>,
    pub(crate) isr: Vec<i32>,
    adding: Vec<i32>,
    removing: Vec<i32>,
    recovery_state: Option<i8>,
}

impl Target {
    pub(crate) fn from(p: &PartitionRegistration) -> Self {
        Self {
            replicas: p.replicas.clone(),
            isr: p.isr.clone(),
            adding: p.adding_replicas.clone(),
            removing: p.removing_replicas.clone(),
            recovery_state: None,
        }
    }
}

/// The record that moves `current` to `target`, electing a leader among the brokers
/// `eligible` accepts whose replica's log directory is online (KIP-858); `None` when
/// nothing changes. A new replica's directory is where the controller places it
/// ([`MetadataImage::default_dir`]).
pub(crate) fn change_record(
    image: &MetadataImage,
    topic_id: Uuid,
    partition_id: i32,
    current: &PartitionRegistration,
    mut target: Target,
    eligible: &dyn Fn(i32) -> bool,
    election: Election,
) -> Option<PartitionChangeRecord> {
    let eligible = |b: i32| {
        eligible(b)
            && image
                .broker(b)
                .is_none_or(|r| r.has_online_dir(current.directory(b)))
    };
    let in_isr = |b: i32, isr: &[i32]| isr.contains(&b) && eligible(b);
    let mut leader = None;
    if election.preferred {
        if let Some(p) = target.replicas.first().copied() {
            if in_isr(p, &target.isr) {
                leader = Some(p);
            }
        }
    }
    if leader.is_none() && current.leader != NO_LEADER && in_isr(current.leader, &target.isr) {
        leader = Some(current.leader);
    }
    if leader.is_none() {
        leader = target
            .replicas
            .iter()
            .copied()
            .find(|b| in_isr(*b, &target.isr));
    }
    if leader.is_none() && election.unclean {
        if let Some(b) = target.replicas.iter().copied().find(|b| eligible(*b)) {
            leader = Some(b);
            target.isr = vec![b];
            target.recovery_state = Some(1);
        }
    }
    let new_leader = leader.unwrap_or(NO_LEADER);
    let mut record = PartitionChangeRecord {
        partition_id,
        topic_id,
        leader: NO_LEADER_CHANGE,
        ..Default::default()
    };
    let mut changed = false;
    if new_leader != current.leader || (election.bump_epoch && new_leader != NO_LEADER) {
        record.leader = new_leader;
        changed = true;
    }
    if target.isr != current.isr {
        record.isr = Some(target.isr);
        changed = true;
    }
    if target.replicas != current.replicas {
        record.directories = Some(
            target
                .replicas
                .iter()
                .map(|b| {
                    if current.replicas.contains(b) {
                        current.directory(*b)
                    } else {
                        image.default_dir(*b)
                    }
                })
                .collect(),
        );
        record.replicas = Some(target.replicas);
        changed = true;
    }
    if target.adding != current.adding_replicas {
        record.adding_replicas = Some(target.adding);
        changed = true;
    }
    if target.removing != current.removing_replicas {
        record.removing_replicas = Some(target.removing);
        changed = true;
    }
    if let Some(state) = target.recovery_state {
        if state != current.leader_recovery_state {
            record.leader_recovery_state = state;
            changed = true;
        }
    }
    changed.then_some(record)
}

fn has_duplicates(ids: &[i32]) -> bool {
    let set: BTreeSet<i32> = ids.iter().copied().collect();
    set.len() != ids.len()
}

/// Kafka's topic name rule: 1-249 characters of `[a-zA-Z0-9._-]`, not `.` or `..`.
pub fn validate_topic_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("topic name is empty".into());
    }
    if name == "." || name == ".." {
        return Err(format!("topic name cannot be \"{name}\""));
    }
    if name.len() > MAX_TOPIC_NAME_LEN {
        return Err(format!(
            "topic name is longer than {MAX_TOPIC_NAME_LEN} characters"
        ));
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '_' || c == '-')
    {
        return Err(format!(
            "topic name \"{name}\" contains characters other than ASCII alphanumerics, '.', '_' and '-'"
        ));
    }
    Ok(())
}

fn validate_config_value(key: &str, value: &str) -> Result<(), String> {
    let bad = || format!("invalid value {value} for configuration {key}");
    match key {
        "unclean.leader.election.enable"
        | "preallocate"
        | "message.downconversion.enable"
        | "remote.storage.enable"
        | "remote.log.copy.disable"
        | "remote.log.delete.on.disable" => match value {
            "true" | "false" => Ok(()),
            _ => Err(bad()),
        },
        "cleanup.policy" => {
            if value
                .split(',')
                .map(str::trim)
                .all(|p| p == "delete" || p == "compact")
            {
                Ok(())
            } else {
                Err(bad())
            }
        }
        "min.insync.replicas" => match value.parse::<i32>() {
            Ok(n) if n >= 1 => Ok(()),
            _ => Err(bad()),
        },
        "min.cleanable.dirty.ratio" => match value.parse::<f64>() {
            Ok(r) if (0.0..=1.0).contains(&r) => Ok(()),
            _ => Err(bad()),
        },
        "compression.type" => match value {
            "uncompressed" | "zstd" | "lz4" | "snappy" | "gzip" | "producer" => Ok(()),
            _ => Err(bad()),
        },
        "message.timestamp.type" => match value {
            "CreateTime" | "LogAppendTime" => Ok(()),
            _ => Err(bad()),
        },
        "retention.ms" | "retention.bytes" | "local.retention.ms" | "local.retention.bytes" => {
            match value.parse::<i64>() {
                Ok(n) if n >= -2 => Ok(()),
                _ => Err(bad()),
            }
        }
        "segment.bytes"
        | "segment.ms"
        | "segment.index.bytes"
        | "segment.jitter.ms"
        | "max.message.bytes"
        | "flush.messages"
        | "flush.ms"
        | "index.interval.bytes"
        | "delete.retention.ms"
        | "file.delete.delay.ms"
        | "max.compaction.lag.ms"
        | "min.compaction.lag.ms"
        | "message.timestamp.after.max.ms"
        | "message.timestamp.before.max.ms" => match value.parse::<i64>() {
            Ok(n) if n >= 0 => Ok(()),
            _ => Err(bad()),
        },
        _ => Ok(()),
    }
}

fn validate_topic_config(key: &str, value: Option<&str>) -> Result<(), String> {
    if !TOPIC_CONFIGS.contains(&key) {
        return Err(format!("unknown topic configuration {key}"));
    }
    match value {
        Some(v) => validate_config_value(key, v),
        None => Ok(()),
    }
}

fn partition_result(
    topic: &str,
    partition: i32,
    code: ErrorCode,
    msg: Option<String>,
) -> PartitionResult {
    PartitionResult {
        topic: topic.to_string(),
        partition,
        error_code: code,
        error_message: msg,
    }
}

impl QuorumController {
    pub fn new(config: ControllerConfig) -> Self {
        let rng = config.seed;
        Self {
            config,
            last_contact_ms: BTreeMap::new(),
            heard_from: std::collections::BTreeSet::new(),
            last_rebalance_ms: None,
            last_token_sweep_ms: None,
            rng,
        }
    }

    pub fn config(&self) -> &ControllerConfig {
        &self.config
    }

    /// splitmix64: topic ids and placement starts.
    fn next_random(&mut self) -> u64 {
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn new_topic_id(&mut self, image: &MetadataImage) -> Uuid {
        loop {
            let id = Uuid::from_u64_pair(self.next_random(), self.next_random());
            // Kafka never hands out the zero id, nor one whose base64 form starts with
            // '-' (it would read as a command-line flag).
            if !id.is_zero() && !id.to_string().starts_with('-') && !image.topics.contains_key(&id)
            {
                return id;
            }
        }
    }

    /// A fresh id for an ACL, as Kafka's `AclControlManager.newAclId` draws one.
    fn new_acl_id(&mut self, image: &MetadataImage) -> Uuid {
        loop {
            let id = Uuid::from_u64_pair(self.next_random(), self.next_random());
            if !id.is_zero() && image.acls.get(&id).is_none() {
                return id;
            }
        }
    }

    /// Kafka's precedence for a decision the controller makes: the topic's config, then
    /// the cluster-wide dynamic default, then the controller's own static config.
    fn unclean_enabled(&self, image: &MetadataImage, topic: &str) -> bool {
        const KEY: &str = "unclean.leader.election.enable";
        match image
            .topic_config(topic, KEY)
            .or_else(|| image.cluster_default_config(KEY))
        {
            Some(v) => v == "true",
            None => self.config.unclean_leader_election_enable,
        }
    }

    /// When the next lease may lapse: the shell calls [`QuorumController::tick`] then.
    pub fn next_deadline(&self, image: &MetadataImage) -> Option<i64> {
        image
            .brokers
            .values()
            .filter(|b| !b.fenced)
            .filter_map(|b| self.last_contact_ms.get(&b.id))
            .map(|t| t + self.config.broker_session_timeout_ms)
            .chain(
                self.config
                    .auto_leader_rebalance_enable
                    .then(|| {
                        self.last_rebalance_ms
                            .map(|t| t + self.config.leader_imbalance_check_interval_ms)
                    })
                    .flatten(),
            )
            .chain(
                (!image.delegation_tokens.is_empty())
                    .then(|| {
                        self.last_token_sweep_ms
                            .map(|t| t + self.config.delegation_tokens.expiry_check_interval_ms)
                    })
                    .flatten(),
            )
            .min()
    }

    /// Handles one event against `image` at `now_ms` (a monotonic clock, for intervals:
    /// leases, checks) and `unix_ms` (the wall clock, for times that are recorded and
    /// compared across nodes and with clients: delegation tokens' lifetimes).
    pub fn handle(
        &mut self,
        event: ControllerEvent,
        image: &MetadataImage,
        now_ms: i64,
        unix_ms: i64,
    ) -> ControllerResult {
        match event {
            ControllerEvent::BrokerRegistration(r) => self.register_broker(r, image, now_ms),
            ControllerEvent::BrokerHeartbeat(r) => self.heartbeat(r, image, now_ms),
            ControllerEvent::CreateTopics(r) => self.create_topics(r, image),
            ControllerEvent::DeleteTopics(r) => self.delete_topics(r, image),
            ControllerEvent::CreatePartitions(r) => self.create_partitions(r, image),
            ControllerEvent::AlterPartition(r) => self.alter_partition(r, image),
            ControllerEvent::ElectLeaders(r) => self.elect_leaders(r, image),
            ControllerEvent::AlterPartitionReassignments(r) => self.alter_reassignments(r, image),
            ControllerEvent::AllocateProducerIds(r) => self.allocate_producer_ids(r, image),
            ControllerEvent::IncrementalAlterConfigs(r) => self.alter_configs(r, image),
            ControllerEvent::UnregisterBroker(r) => self.unregister_broker(r, image),
            ControllerEvent::BrokerProcessGone(r) => self.broker_process_gone(r, image),
            ControllerEvent::UpdateFeatures(r) => self.update_features(r, image),
            ControllerEvent::AlterUserScramCredentials(r) => alter_user_scram_credentials(r, image),
            ControllerEvent::CreateAcls(r) => {
                let mut new_id = |image: &MetadataImage| self.new_acl_id(image);
                crate::acl_control::create_acls(r, image, &mut new_id)
            }
            ControllerEvent::DeleteAcls(r) => crate::acl_control::delete_acls(r, image),
            ControllerEvent::AlterClientQuotas(r) => {
                crate::client_quotas::alter_client_quotas(r, image)
            }
            ControllerEvent::CreateDelegationToken(r) => {
                crate::delegation_tokens::create(&self.config.delegation_tokens, r, image, unix_ms)
            }
            ControllerEvent::RenewDelegationToken(r) => {
                crate::delegation_tokens::renew(&self.config.delegation_tokens, r, image, unix_ms)
            }
            ControllerEvent::ExpireDelegationToken(r) => {
                crate::delegation_tokens::expire(&self.config.delegation_tokens, r, image, unix_ms)
            }
            ControllerEvent::AssignReplicasToDirs(r) => {
                crate::directories::assign_replicas_to_dirs(r, image)
            }
            ControllerEvent::RemoteLogSegmentUpdate(r) => {
                crate::remote_log::update_remote_log_segment(r, image)
            }
        }
    }

    /// UpdateFeatures: every update checked (`features::check_update`); one refused
    /// refuses them all, as Kafka's controller does, and `validate_only` writes nothing.
    fn update_features(
        &mut self,
        req: crate::api::UpdateFeaturesRequest,
        image: &MetadataImage,
    ) -> ControllerResult {
        let mut s = Scratch::new(image);
        let checks: Vec<_> = req
            .updates
            .iter()
            .map(|u| (u, crate::features::check_update(image, u)))
            .collect();
        let all_ok = checks.iter().all(|(_, c)| c.is_ok());
        if all_ok && !req.validate_only {
            for u in &req.updates {
                let level = u.max_version_level.max(0);
                if image.features.get(&u.feature).copied().unwrap_or(0) != level {
                    tracing::info!(feature = %u.feature, level, "finalizing feature level");
                    s.emit(MetadataRecord::FeatureLevel(FeatureLevelRecord {
                        name: u.feature.clone(),
                        feature_level: level,
                        ..Default::default()
                    }));
                }
            }
        }
        let results = checks
            .into_iter()
            .map(|(u, c)| {
                let (error_code, error_message) = match c {
                    Ok(()) if all_ok => (ErrorCode::NONE, None),
                    Ok(()) => (
                        ErrorCode::INVALID_UPDATE_VERSION,
                        Some("another update in the request was refused".to_string()),
                    ),
                    Err((code, why)) => (code, Some(why)),
                };
                crate::api::UpdateFeatureResult {
                    feature: u.feature.clone(),
                    error_code,
                    error_message,
                }
            })
            .collect();
        s.finish(ControllerResponse::UpdateFeatures(results))
    }

    /// Fences a broker whose process is gone, as a lapsed lease would, if that
    /// registration is still the current one and unfenced.
    fn broker_process_gone(
        &mut self,
        req: BrokerProcessGoneRequest,
        image: &MetadataImage,
    ) -> ControllerResult {
        let mut s = Scratch::new(image);
        let current = image
            .broker(req.broker_id)
            .is_some_and(|b| b.epoch == req.broker_epoch && !b.fenced);
        if current {
            tracing::info!(broker = req.broker_id, "broker process gone; fencing it");
            self.fence(&mut s, req.broker_id, req.broker_epoch);
        }
        s.finish(ControllerResponse::None)
    }

    /// Takes `id` out of every ISR and leadership and fences that registration.
    fn fence(&mut self, s: &mut Scratch<'_>, id: i32, epoch: i64) {
        self.remove_from_partitions(s, id);
        s.emit(MetadataRecord::FenceBroker(FenceBrokerRecord {
            id,
            epoch,
            ..Default::default()
        }));
        self.heard_from.remove(&id);
    }

    /// UnregisterBroker: forgets a broker's registration, as Kafka's controller does for
    /// an operator removing a broker that is gone for good. Its replicas stay in the
    /// partitions' replica lists (a reassignment moves them), but it leaves every ISR and
    /// leads nothing, as a fenced broker. A broker that is still running finds its next
    /// heartbeat refused and registers again, as in Kafka.
    fn unregister_broker(
        &mut self,
        req: UnregisterBrokerRequest,
        image: &MetadataImage,
    ) -> ControllerResult {
        let mut s = Scratch::new(image);
        let Some(broker) = image.broker(req.broker_id).cloned() else {
            return s.finish(ControllerResponse::UnregisterBroker(
                UnregisterBrokerResponse {
                    error_code: ErrorCode::BROKER_ID_NOT_REGISTERED,
                    error_message: Some(format!(
                        "Broker ID {} is not currently registered",
                        req.broker_id
                    )),
                },
            ));
        };
        tracing::info!(
            broker = broker.id,
            fenced = broker.fenced,
            "unregistering broker"
        );
        self.remove_from_partitions(&mut s, broker.id);
        s.emit(MetadataRecord::UnregisterBroker(UnregisterBrokerRecord {
            broker_id: broker.id,
            broker_epoch: broker.epoch,
            ..Default::default()
        }));
        self.last_contact_ms.remove(&broker.id);
        self.heard_from.remove(&broker.id);
        s.finish(ControllerResponse::UnregisterBroker(
            UnregisterBrokerResponse {
                error_code: ErrorCode::NONE,
                error_message: None,
            },
        ))
    }

    /// Fences every unfenced broker whose lease lapsed by `now_ms`, moving its
    /// leaderships away.
    /// The timers, at `now_ms` and `unix_ms` (the two clocks of [`QuorumController::handle`]).
    pub fn tick(&mut self, image: &MetadataImage, now_ms: i64, unix_ms: i64) -> ControllerResult {
        let mut s = Scratch::new(image);
        // A new cluster's first controller finalizes metadata.version and
        // transaction.version, as Kafka's bootstrap records do (`kafka-storage format`).
        if !image
            .features
            .contains_key(crate::features::METADATA_VERSION)
        {
            for (name, level) in [
                (
                    crate::features::METADATA_VERSION,
                    crate::features::METADATA_VERSION_LATEST,
                ),
                (
                    crate::features::TRANSACTION_VERSION,
                    crate::features::TRANSACTION_VERSION_LATEST,
                ),
            ] {
                s.emit(MetadataRecord::FeatureLevel(FeatureLevelRecord {
                    name: name.to_string(),
                    feature_level: level,
                    ..Default::default()
                }));
            }
        }
        let unfenced: Vec<(i32, i64)> = image
            .brokers
            .values()
            .filter(|b| !b.fenced)
            .map(|b| (b.id, b.epoch))
            .collect();
        for (id, epoch) in unfenced {
            let last = *self.last_contact_ms.entry(id).or_insert(now_ms);
            if now_ms - last > self.config.broker_session_timeout_ms {
                tracing::info!(broker = id, "broker session expired; fencing it");
                self.fence(&mut s, id, epoch);
            }
        }
        if self.config.auto_leader_rebalance_enable {
            let due = self
                .last_rebalance_ms
                .is_none_or(|t| now_ms - t >= self.config.leader_imbalance_check_interval_ms);
            if due {
                self.last_rebalance_ms = Some(now_ms);
                self.elect_preferred_where_possible(&mut s);
            }
        }
        let sweep_due = self
            .last_token_sweep_ms
            .is_none_or(|t| now_ms - t >= self.config.delegation_tokens.expiry_check_interval_ms);
        if sweep_due {
            self.last_token_sweep_ms = Some(now_ms);
            crate::delegation_tokens::sweep(&mut s, unix_ms);
        }
        s.finish(ControllerResponse::None)
    }

    /// Moves leadership to each partition's preferred replica where it is live, in the
    /// ISR and not already leading (Kafka's automatic preferred-leader election), so that
    /// a broker that came back gets its share of leaders again.
    fn elect_preferred_where_possible(&self, s: &mut Scratch<'_>) {
        let mut changes = Vec::new();
        {
            let image = s.image();
            let eligible = |b: i32| image.is_live(b);
            for t in image.topics.values() {
                for (pid, p) in &t.partitions {
                    let Some(preferred) = p.preferred_leader() else {
                        continue;
                    };
                    if preferred == p.leader || !p.isr.contains(&preferred) || !eligible(preferred)
                    {
                        continue;
                    }
                    let election = Election {
                        preferred: true,
                        ..REGULAR
                    };
                    if let Some(r) =
                        change_record(image, t.id, *pid, p, Target::from(p), &eligible, election)
                    {
                        changes.push(r);
                    }
                }
            }
        }
        for r in changes {
            s.emit(MetadataRecord::PartitionChange(r));
        }
    }

    /// Takes `broker` out of every ISR (keeping it when it is the last member) and
    /// moves each leadership it holds elsewhere. The broker counts as not eligible to
    /// lead whatever its registration says, because the caller is about to fence it or
    /// put it in controlled shutdown.
    fn remove_from_partitions(&self, s: &mut Scratch<'_>, broker: i32) {
        self.remove_from_partitions_where(s, broker, &|_| true);
    }

    /// [`Self::remove_from_partitions`] for the partitions `which` selects only (those
    /// whose replica on `broker` sits in a log directory that failed, KIP-858).
    pub(crate) fn remove_from_partitions_where(
        &self,
        s: &mut Scratch<'_>,
        broker: i32,
        which: &dyn Fn(&PartitionRegistration) -> bool,
    ) {
        let mut changes = Vec::new();
        {
            let image = s.image();
            let eligible = |b: i32| b != broker && image.is_live(b);
            for t in image.topics.values() {
                let unclean = self.unclean_enabled(image, &t.name);
                for (pid, p) in &t.partitions {
                    if p.leader != broker && !p.isr.contains(&broker) {
                        continue;
                    }
                    if !which(p) {
                        continue;
                    }
                    let mut target = Target::from(p);
                    let isr: Vec<i32> = p.isr.iter().copied().filter(|b| *b != broker).collect();
                    if !isr.is_empty() {
                        target.isr = isr;
                    }
                    let election = Election { unclean, ..REGULAR };
                    if let Some(r) =
                        change_record(image, t.id, *pid, p, target, &eligible, election)
                    {
                        changes.push(r);
                    }
                }
            }
        }
        for r in changes {
            s.emit(MetadataRecord::PartitionChange(r));
        }
    }

    /// Elects a leader for every leaderless partition that `broker` (just unfenced)
    /// could lead.
    fn elect_leaderless(&self, s: &mut Scratch<'_>, only_topic: Option<Uuid>) {
        let mut changes = Vec::new();
        {
            let image = s.image();
            let eligible = |b: i32| image.is_live(b);
            for t in image.topics.values() {
                if only_topic.is_some_and(|id| id != t.id) {
                    continue;
                }
                let unclean = self.unclean_enabled(image, &t.name);
                for (pid, p) in &t.partitions {
                    if p.leader != NO_LEADER {
                        continue;
                    }
                    let election = Election { unclean, ..REGULAR };
                    if let Some(r) =
                        change_record(image, t.id, *pid, p, Target::from(p), &eligible, election)
                    {
                        changes.push(r);
                    }
                }
            }
        }
        for r in changes {
            s.emit(MetadataRecord::PartitionChange(r));
        }
    }

    fn register_broker(
        &mut self,
        req: BrokerRegistrationRequest,
        image: &MetadataImage,
        now_ms: i64,
    ) -> ControllerResult {
        let mut s = Scratch::new(image);
        let refuse = |s: Scratch<'_>, code: ErrorCode, id: i32| {
            s.finish(ControllerResponse::BrokerRegistration(
                BrokerRegistrationResponse {
                    error_code: code,
                    broker_id: id,
                    broker_epoch: -1,
                },
            ))
        };
        let broker_id = if req.broker_id < 0 {
            if !self.config.broker_id_generation_enable {
                return refuse(s, ErrorCode::INVALID_REQUEST, req.broker_id);
            }
            let above = image
                .brokers
                .keys()
                .next_back()
                .copied()
                .unwrap_or(0)
                .max(self.config.reserved_broker_max_id);
            above.saturating_add(1)
        } else {
            req.broker_id
        };
        if let Some(existing) = image.broker(broker_id) {
            let lease_alive = self.heard_from.contains(&broker_id)
                && self
                    .last_contact_ms
                    .get(&broker_id)
                    .is_some_and(|t| now_ms - t <= self.config.broker_session_timeout_ms);
            if !existing.fenced && existing.incarnation_id != req.incarnation_id && lease_alive {
                return refuse(s, ErrorCode::DUPLICATE_BROKER_REGISTRATION, broker_id);
            }
            if !existing.fenced {
                // The same broker restarted (or its lease lapsed unnoticed): its new
                // registration starts fenced, so it must lead nothing first.
                self.remove_from_partitions(&mut s, broker_id);
            }
        }
        let broker_epoch = s.image().next_offset;
        s.emit(MetadataRecord::RegisterBroker(RegisterBrokerRecord {
            broker_id,
            incarnation_id: req.incarnation_id,
            broker_epoch,
            end_points: req
                .listeners
                .iter()
                .map(|e| BrokerEndpoint {
                    name: e.name.clone(),
                    host: e.host.clone(),
                    port: e.port,
                    security_protocol: e.security_protocol,
                    ..Default::default()
                })
                .collect(),
            rack: req.rack,
            fenced: true,
            in_controlled_shutdown: false,
            log_dirs: req.log_dirs,
            ..Default::default()
        }));
        self.last_contact_ms.insert(broker_id, now_ms);
        self.heard_from.insert(broker_id);
        s.finish(ControllerResponse::BrokerRegistration(
            BrokerRegistrationResponse {
                error_code: ErrorCode::NONE,
                broker_id,
                broker_epoch,
            },
        ))
    }

    fn heartbeat(
        &mut self,
        req: BrokerHeartbeatRequest,
        image: &MetadataImage,
        now_ms: i64,
    ) -> ControllerResult {
        let mut s = Scratch::new(image);
        let answer = |s: Scratch<'_>, code: ErrorCode| {
            s.finish(ControllerResponse::BrokerHeartbeat(
                BrokerHeartbeatResponse {
                    error_code: code,
                    is_caught_up: false,
                    is_fenced: true,
                    should_shut_down: false,
                },
            ))
        };
        let Some(broker) = image.broker(req.broker_id).cloned() else {
            return answer(s, ErrorCode::BROKER_ID_NOT_REGISTERED);
        };
        if broker.epoch != req.broker_epoch {
            return answer(s, ErrorCode::STALE_BROKER_EPOCH);
        }
        self.last_contact_ms.insert(req.broker_id, now_ms);
        self.heard_from.insert(req.broker_id);
        if !req.offline_log_dirs.is_empty() {
            crate::directories::handle_directories_offline(
                self,
                &mut s,
                &broker,
                &req.offline_log_dirs,
            );
        }
        let caught_up = req.current_metadata_offset >= broker.epoch;
        if req.want_shut_down {
            if !broker.fenced && !broker.in_controlled_shutdown {
                tracing::info!(broker = req.broker_id, "controlled shutdown");
                s.emit(MetadataRecord::BrokerRegistrationChange(
                    BrokerRegistrationChangeRecord {
                        broker_id: req.broker_id,
                        broker_epoch: broker.epoch,
                        fenced: 0,
                        in_controlled_shutdown: 1,
                        ..Default::default()
                    },
                ));
            }
            // Also on later heartbeats: an ISR may have re-admitted it meanwhile.
            if !broker.fenced {
                self.remove_from_partitions(&mut s, req.broker_id);
            }
        } else if broker.fenced && caught_up && !req.want_fence {
            tracing::info!(broker = req.broker_id, "broker caught up; unfencing it");
            s.emit(MetadataRecord::UnfenceBroker(UnfenceBrokerRecord {
                id: req.broker_id,
                epoch: broker.epoch,
                ..Default::default()
            }));
            self.elect_leaderless(&mut s, None);
        } else if !broker.fenced && req.want_fence {
            self.remove_from_partitions(&mut s, req.broker_id);
            s.emit(MetadataRecord::FenceBroker(FenceBrokerRecord {
                id: req.broker_id,
                epoch: broker.epoch,
                ..Default::default()
            }));
        }
        let after = s.image();
        let mut is_fenced = after.broker(req.broker_id).is_none_or(|b| b.fenced);
        let leads_something = after
            .topics
            .values()
            .flat_map(|t| t.partitions.values())
            .any(|p| p.leader == req.broker_id);
        let should_shut_down = req.want_shut_down && (is_fenced || !leads_something);
        if should_shut_down && !is_fenced {
            // Controlled shutdown done (Kafka's SHUTDOWN_NOW): fence the broker now rather
            // than a session later, so that its restart registers at once and no ISR
            // admits it meanwhile.
            s.emit(MetadataRecord::FenceBroker(FenceBrokerRecord {
                id: req.broker_id,
                epoch: broker.epoch,
                ..Default::default()
            }));
            is_fenced = true;
        }
        s.finish(ControllerResponse::BrokerHeartbeat(
            BrokerHeartbeatResponse {
                error_code: ErrorCode::NONE,
                is_caught_up: caught_up,
                is_fenced,
                should_shut_down,
            },
        ))
    }

    fn create_topics(
        &mut self,
        req: CreateTopicsRequest,
        image: &MetadataImage,
    ) -> ControllerResult {
        let mut s = Scratch::new(image);
        let mut results = Vec::with_capacity(req.topics.len());
        let mut names: BTreeMap<&str, usize> = BTreeMap::new();
        for t in &req.topics {
            *names.entry(t.name.as_str()).or_default() += 1;
        }
        for t in &req.topics {
            let fail = |code: ErrorCode, msg: String| CreatableTopicResult {
                name: t.name.clone(),
                topic_id: Uuid::ZERO,
                error_code: code,
                error_message: Some(msg),
                num_partitions: -1,
                replication_factor: -1,
            };
            if names.get(t.name.as_str()).copied().unwrap_or(0) > 1 {
                results.push(fail(
                    ErrorCode::INVALID_REQUEST,
                    format!("topic {} appears more than once in the request", t.name),
                ));
                continue;
            }
            match self.create_topic(&mut s, t, req.validate_only) {
                Ok(r) => results.push(r),
                Err((code, msg)) => results.push(fail(code, msg)),
            }
        }
        s.finish(ControllerResponse::CreateTopics(results))
    }

    fn create_topic(
        &mut self,
        s: &mut Scratch<'_>,
        t: &CreatableTopic,
        validate_only: bool,
    ) -> Result<CreatableTopicResult, (ErrorCode, String)> {
        validate_topic_name(&t.name).map_err(|m| (ErrorCode::INVALID_TOPIC_EXCEPTION, m))?;
        if s.image().topic(&t.name).is_some() {
            return Err((
                ErrorCode::TOPIC_ALREADY_EXISTS,
                format!("topic '{}' already exists", t.name),
            ));
        }
        for (key, value) in &t.configs {
            validate_topic_config(key, value.as_deref())
                .map_err(|m| (ErrorCode::INVALID_CONFIG, m))?;
        }
        let assignments = if t.assignments.is_empty() {
            let partitions = match t.num_partitions {
                -1 => self.config.num_partitions,
                n if n >= 1 => n,
                n => {
                    return Err((
                        ErrorCode::INVALID_PARTITIONS,
                        format!("number of partitions was set to {n}; it must be at least 1"),
                    ))
                }
            };
            let rf = match t.replication_factor {
                -1 => self.config.default_replication_factor,
                n if n >= 1 => n,
                n => {
                    return Err((
                        ErrorCode::INVALID_REPLICATION_FACTOR,
                        format!("replication factor was set to {n}; it must be at least 1"),
                    ))
                }
            };
            let live = s.image().live_brokers();
            let random = self.next_random();
            place_replicas(&live, 0, partitions, rf, random).ok_or_else(|| {
                (
                    ErrorCode::INVALID_REPLICATION_FACTOR,
                    format!(
                        "unable to replicate the partition {rf} time(s): the number of available brokers is {}",
                        live.len()
                    ),
                )
            })?
        } else {
            if t.num_partitions != -1 || t.replication_factor != -1 {
                return Err((
                    ErrorCode::INVALID_REQUEST,
                    "both numPartitions or replicationFactor and replicasAssignments were set"
                        .into(),
                ));
            }
            self.validate_assignment(s.image(), &t.assignments)?;
            t.assignments.clone()
        };
        let rf = assignments.first().map_or(0, Vec::len);
        let topic_id = self.new_topic_id(s.image());
        let result = CreatableTopicResult {
            name: t.name.clone(),
            topic_id,
            error_code: ErrorCode::NONE,
            error_message: None,
            num_partitions: i32::try_from(assignments.len()).unwrap_or(i32::MAX),
            replication_factor: i16::try_from(rf).unwrap_or(i16::MAX),
        };
        if validate_only {
            return Ok(result);
        }
        s.emit(MetadataRecord::Topic(TopicRecord {
            name: t.name.clone(),
            topic_id,
            ..Default::default()
        }));
        self.emit_partitions(s, topic_id, 0, &assignments);
        for (key, value) in &t.configs {
            if value.is_some() {
                s.emit(MetadataRecord::Config(ConfigRecord {
                    resource_type: RESOURCE_TOPIC,
                    resource_name: t.name.clone(),
                    name: key.clone(),
                    value: value.clone(),
                    ..Default::default()
                }));
            }
        }
        Ok(result)
    }

    /// Checks a manual assignment: every partition has the same number of distinct,
    /// registered replicas, and at least one of them is live.
    fn validate_assignment(
        &self,
        image: &MetadataImage,
        assignments: &[Vec<i32>],
    ) -> Result<(), (ErrorCode, String)> {
        let rf = assignments.first().map_or(0, Vec::len);
        for (i, replicas) in assignments.iter().enumerate() {
            let bad = |m: String| (ErrorCode::INVALID_REPLICA_ASSIGNMENT, m);
            if replicas.is_empty() {
                return Err(bad(format!("partition {i} has an empty replica list")));
            }
            if replicas.len() != rf {
                return Err(bad(format!(
                    "partition {i} has {} replicas where partition 0 has {rf}",
                    replicas.len()
                )));
            }
            if has_duplicates(replicas) {
                return Err(bad(format!("partition {i} lists a broker twice")));
            }
            if let Some(b) = replicas.iter().find(|b| image.broker(**b).is_none()) {
                return Err(bad(format!("partition {i} names unregistered broker {b}")));
            }
            if !replicas.iter().any(|b| image.is_live(*b)) {
                return Err(bad(format!(
                    "all brokers in the assignment of partition {i} are fenced"
                )));
            }
        }
        Ok(())
    }

    fn emit_partitions(
        &self,
        s: &mut Scratch<'_>,
        topic_id: Uuid,
        first_partition: i32,
        assignments: &[Vec<i32>],
    ) {
        for (i, replicas) in assignments.iter().enumerate() {
            let isr: Vec<i32> = replicas
                .iter()
                .copied()
                .filter(|b| s.image().is_live(*b))
                .collect();
            let leader = isr.first().copied().unwrap_or(NO_LEADER);
            let directories = replicas.iter().map(|b| s.image().default_dir(*b)).collect();
            s.emit(MetadataRecord::Partition(PartitionRecord {
                partition_id: first_partition + i32::try_from(i).unwrap_or(i32::MAX),
                topic_id,
                replicas: replicas.clone(),
                directories,
                isr,
                leader,
                leader_epoch: 0,
                partition_epoch: 0,
                ..Default::default()
            }));
        }
    }

    fn delete_topics(
        &mut self,
        req: DeleteTopicsRequest,
        image: &MetadataImage,
    ) -> ControllerResult {
        let mut s = Scratch::new(image);
        let mut results = Vec::with_capacity(req.names.len());
        for name in req.names {
            match s.image().topic(&name).map(|t| t.id) {
                Some(topic_id) => {
                    s.emit(MetadataRecord::RemoveTopic(RemoveTopicRecord {
                        topic_id,
                        ..Default::default()
                    }));
                    results.push(DeletableTopicResult {
                        name,
                        topic_id,
                        error_code: ErrorCode::NONE,
                    });
                }
                None => results.push(DeletableTopicResult {
                    name,
                    topic_id: Uuid::ZERO,
                    error_code: ErrorCode::UNKNOWN_TOPIC_OR_PARTITION,
                }),
            }
        }
        s.finish(ControllerResponse::DeleteTopics(results))
    }

    fn create_partitions(
        &mut self,
        req: CreatePartitionsRequest,
        image: &MetadataImage,
    ) -> ControllerResult {
        let mut s = Scratch::new(image);
        let mut results = Vec::with_capacity(req.topics.len());
        for t in &req.topics {
            let outcome = self.create_partitions_for(&mut s, t, req.validate_only);
            let (error_code, error_message) = match outcome {
                Ok(()) => (ErrorCode::NONE, None),
                Err((code, msg)) => (code, Some(msg)),
            };
            results.push(CreatePartitionsTopicResult {
                name: t.name.clone(),
                error_code,
                error_message,
            });
        }
        s.finish(ControllerResponse::CreatePartitions(results))
    }

    fn create_partitions_for(
        &mut self,
        s: &mut Scratch<'_>,
        t: &CreatePartitionsTopic,
        validate_only: bool,
    ) -> Result<(), (ErrorCode, String)> {
        let topic = s.image().topic(&t.name).cloned().ok_or_else(|| {
            (
                ErrorCode::UNKNOWN_TOPIC_OR_PARTITION,
                format!("topic {} does not exist", t.name),
            )
        })?;
        let current = i32::try_from(topic.partitions.len()).unwrap_or(i32::MAX);
        if t.count < current {
            return Err((
                ErrorCode::INVALID_PARTITIONS,
                format!(
                    "topic currently has {current} partitions, which is higher than the requested {}",
                    t.count
                ),
            ));
        }
        if t.count == current {
            return Err((
                ErrorCode::INVALID_PARTITIONS,
                format!("topic already has {current} partitions"),
            ));
        }
        let new = t.count - current;
        let rf = topic
            .partitions
            .values()
            .next()
            .map_or(1, |p| p.target_replicas().len());
        let assignments = if t.assignments.is_empty() {
            let live = s.image().live_brokers();
            let rf16 = i16::try_from(rf).unwrap_or(i16::MAX);
            let random = self.next_random();
            place_replicas(&live, current, new, rf16, random).ok_or_else(|| {
                (
                    ErrorCode::INVALID_REPLICATION_FACTOR,
                    format!(
                        "unable to replicate the partition {rf} time(s): the number of available brokers is {}",
                        live.len()
                    ),
                )
            })?
        } else {
            if t.assignments.len() != usize::try_from(new).unwrap_or(0) {
                return Err((
                    ErrorCode::INVALID_REPLICA_ASSIGNMENT,
                    format!(
                        "{} assignments given for {new} new partitions",
                        t.assignments.len()
                    ),
                ));
            }
            self.validate_assignment(s.image(), &t.assignments)?;
            if t.assignments.iter().any(|a| a.len() != rf) {
                return Err((
                    ErrorCode::INVALID_REPLICA_ASSIGNMENT,
                    format!("the topic's replication factor is {rf}"),
                ));
            }
            t.assignments.clone()
        };
        if !validate_only {
            self.emit_partitions(s, topic.id, current, &assignments);
        }
        Ok(())
    }

    fn alter_partition(
        &mut self,
        req: AlterPartitionRequest,
        image: &MetadataImage,
    ) -> ControllerResult {
        let mut s = Scratch::new(image);
        let Some(broker) = image.broker(req.broker_id) else {
            return s.finish(ControllerResponse::AlterPartition(AlterPartitionResponse {
                error_code: ErrorCode::STALE_BROKER_EPOCH,
                partitions: Vec::new(),
            }));
        };
        if broker.epoch != req.broker_epoch {
            return s.finish(ControllerResponse::AlterPartition(AlterPartitionResponse {
                error_code: ErrorCode::STALE_BROKER_EPOCH,
                partitions: Vec::new(),
            }));
        }
        let mut results = Vec::with_capacity(req.partitions.len());
        for data in &req.partitions {
            let code = self.alter_one_partition(&mut s, req.broker_id, data);
            let (leader_id, leader_epoch, isr, leader_recovery_state, partition_epoch) = s
                .image()
                .topics
                .get(&data.topic_id)
                .and_then(|t| t.partitions.get(&data.partition_index))
                .map_or((NO_LEADER, -1, Vec::new(), 0, -1), |p| {
                    (
                        p.leader,
                        p.leader_epoch,
                        p.isr.clone(),
                        p.leader_recovery_state,
                        p.partition_epoch,
                    )
                });
            results.push(AlterPartitionResult {
                topic_id: data.topic_id,
                partition_index: data.partition_index,
                error_code: code,
                leader_id,
                leader_epoch,
                isr,
                leader_recovery_state,
                partition_epoch,
            });
        }
        s.finish(ControllerResponse::AlterPartition(AlterPartitionResponse {
            error_code: ErrorCode::NONE,
            partitions: results,
        }))
    }

    fn alter_one_partition(
        &self,
        s: &mut Scratch<'_>,
        broker_id: i32,
        data: &AlterPartitionData,
    ) -> ErrorCode {
        let image = s.image();
        let Some(topic) = image.topics.get(&data.topic_id) else {
            return ErrorCode::UNKNOWN_TOPIC_ID;
        };
        let Some(p) = topic.partitions.get(&data.partition_index) else {
            return ErrorCode::UNKNOWN_TOPIC_OR_PARTITION;
        };
        if p.leader != broker_id {
            return ErrorCode::NOT_LEADER_OR_FOLLOWER;
        }
        if data.leader_epoch != p.leader_epoch {
            return ErrorCode::FENCED_LEADER_EPOCH;
        }
        if data.partition_epoch != p.partition_epoch {
            return ErrorCode::INVALID_UPDATE_VERSION;
        }
        let new_isr: Vec<i32> = data.new_isr.iter().map(|(b, _)| *b).collect();
        if new_isr.is_empty()
            || !new_isr.contains(&broker_id)
            || has_duplicates(&new_isr)
            || new_isr.iter().any(|b| !p.replicas.contains(b))
        {
            return ErrorCode::INVALID_REQUEST;
        }
        for (b, epoch) in &data.new_isr {
            if p.isr.contains(b) {
                continue;
            }
            // A replica joins the ISR only if it is live, and at the incarnation the
            // leader saw catch up (a restarted broker must catch up again).
            // And only from an online log directory (KIP-858).
            let ok = image.broker(*b).is_some_and(|r| {
                r.is_live()
                    && (*epoch == -1 || *epoch == r.epoch)
                    && r.has_online_dir(p.directory(*b))
            });
            if !ok {
                return ErrorCode::INELIGIBLE_REPLICA;
            }
        }
        let recovery = match (p.leader_recovery_state, data.leader_recovery_state) {
            (0, 1) => return ErrorCode::INVALID_REQUEST,
            (1, 1) if new_isr.len() > 1 => return ErrorCode::INVALID_REQUEST,
            (_, state) => state,
        };
        let mut target = Target::from(p);
        target.isr = new_isr;
        target.recovery_state = Some(recovery);
        let topic_id = topic.id;
        let pid = data.partition_index;
        let eligible = |b: i32| image.is_live(b) || b == broker_id;
        let Some(record) = change_record(image, topic_id, pid, p, target, &eligible, REGULAR)
        else {
            return ErrorCode::NONE;
        };
        s.emit(MetadataRecord::PartitionChange(record));
        self.maybe_complete_reassignment(s, topic_id, pid);
        ErrorCode::NONE
    }

    /// Finishes a reassignment whose added replicas have all joined the ISR: the
    /// replicas become the target, the removed ones leave, and the leader epoch is bumped
    /// so that the removed replicas are fenced.
    fn maybe_complete_reassignment(&self, s: &mut Scratch<'_>, topic_id: Uuid, pid: i32) {
        let image = s.image();
        let Some(p) = image
            .topics
            .get(&topic_id)
            .and_then(|t| t.partitions.get(&pid))
        else {
            return;
        };
        if !p.is_reassigning() || !p.adding_replicas.iter().all(|b| p.isr.contains(b)) {
            return;
        }
        let target_replicas = p.target_replicas();
        let target_isr: Vec<i32> = p
            .isr
            .iter()
            .copied()
            .filter(|b| target_replicas.contains(b))
            .collect();
        if target_isr.is_empty() {
            return;
        }
        let unclean = image
            .topics
            .get(&topic_id)
            .is_some_and(|t| self.unclean_enabled(image, &t.name));
        let target = Target {
            replicas: target_replicas,
            isr: target_isr,
            adding: Vec::new(),
            removing: Vec::new(),
            recovery_state: None,
        };
        let eligible = |b: i32| image.is_live(b);
        let election = Election {
            unclean,
            bump_epoch: true,
            ..REGULAR
        };
        if let Some(r) = change_record(image, topic_id, pid, p, target, &eligible, election) {
            s.emit(MetadataRecord::PartitionChange(r));
        }
    }

    fn elect_leaders(
        &mut self,
        req: ElectLeadersRequest,
        image: &MetadataImage,
    ) -> ControllerResult {
        let mut s = Scratch::new(image);
        let explicit = req.partitions.is_some();
        let partitions: Vec<(String, i32)> = match req.partitions {
            Some(p) => p,
            None => image
                .topics
                .values()
                .flat_map(|t| t.partitions.keys().map(move |p| (t.name.clone(), *p)))
                .collect(),
        };
        let mut results = Vec::new();
        for (topic, pid) in partitions {
            let image = s.image();
            let Some(t) = image.topic(&topic) else {
                results.push(partition_result(
                    &topic,
                    pid,
                    ErrorCode::UNKNOWN_TOPIC_OR_PARTITION,
                    None,
                ));
                continue;
            };
            let Some(p) = t.partitions.get(&pid) else {
                results.push(partition_result(
                    &topic,
                    pid,
                    ErrorCode::UNKNOWN_TOPIC_OR_PARTITION,
                    None,
                ));
                continue;
            };
            let eligible = |b: i32| image.is_live(b);
            let (code, record) = match req.election_type {
                ElectionType::Preferred => {
                    if p.preferred_leader() == Some(p.leader) {
                        (ErrorCode::ELECTION_NOT_NEEDED, None)
                    } else {
                        let election = Election {
                            preferred: true,
                            ..REGULAR
                        };
                        let r = change_record(
                            image,
                            t.id,
                            pid,
                            p,
                            Target::from(p),
                            &eligible,
                            election,
                        );
                        let moved = r
                            .as_ref()
                            .is_some_and(|r| Some(r.leader) == p.preferred_leader());
                        if moved {
                            (ErrorCode::NONE, r)
                        } else {
                            (ErrorCode::PREFERRED_LEADER_NOT_AVAILABLE, None)
                        }
                    }
                }
                ElectionType::Unclean => {
                    if p.leader != NO_LEADER {
                        (ErrorCode::ELECTION_NOT_NEEDED, None)
                    } else {
                        let election = Election {
                            unclean: true,
                            ..REGULAR
                        };
                        match change_record(
                            image,
                            t.id,
                            pid,
                            p,
                            Target::from(p),
                            &eligible,
                            election,
                        ) {
                            Some(r) if r.leader != NO_LEADER && r.leader != NO_LEADER_CHANGE => {
                                (ErrorCode::NONE, Some(r))
                            }
                            _ => (ErrorCode::ELIGIBLE_LEADERS_NOT_AVAILABLE, None),
                        }
                    }
                }
            };
            if !explicit && code == ErrorCode::ELECTION_NOT_NEEDED {
                continue;
            }
            if let Some(r) = record {
                s.emit(MetadataRecord::PartitionChange(r));
            }
            results.push(partition_result(&topic, pid, code, None));
        }
        s.finish(ControllerResponse::ElectLeaders(results))
    }

    fn alter_reassignments(
        &mut self,
        req: AlterPartitionReassignmentsRequest,
        image: &MetadataImage,
    ) -> ControllerResult {
        let mut s = Scratch::new(image);
        let mut results = Vec::with_capacity(req.partitions.len());
        for (topic, pid, target) in req.partitions {
            let outcome = self.reassign_one(&mut s, &topic, pid, target);
            let (code, msg) = match outcome {
                Ok(()) => (ErrorCode::NONE, None),
                Err((c, m)) => (c, Some(m)),
            };
            results.push(partition_result(&topic, pid, code, msg));
        }
        s.finish(ControllerResponse::AlterPartitionReassignments(results))
    }

    fn reassign_one(
        &self,
        s: &mut Scratch<'_>,
        topic: &str,
        pid: i32,
        target: Option<Vec<i32>>,
    ) -> Result<(), (ErrorCode, String)> {
        let image = s.image();
        let unknown = || {
            (
                ErrorCode::UNKNOWN_TOPIC_OR_PARTITION,
                format!("unknown partition {topic}-{pid}"),
            )
        };
        let t = image.topic(topic).ok_or_else(unknown)?;
        let p = t.partitions.get(&pid).ok_or_else(unknown)?;
        let topic_id = t.id;
        let unclean = self.unclean_enabled(image, topic);
        let eligible = |b: i32| image.is_live(b);
        // The replicas before any reassignment in progress.
        let original: Vec<i32> = p
            .replicas
            .iter()
            .copied()
            .filter(|b| !p.adding_replicas.contains(b))
            .collect();
        let Some(target) = target else {
            if !p.is_reassigning() {
                return Err((
                    ErrorCode::NO_REASSIGNMENT_IN_PROGRESS,
                    format!("no reassignment of {topic}-{pid} is in progress"),
                ));
            }
            let isr: Vec<i32> = p
                .isr
                .iter()
                .copied()
                .filter(|b| original.contains(b))
                .collect();
            if isr.is_empty() {
                return Err((
                    ErrorCode::INVALID_REPLICA_ASSIGNMENT,
                    "cannot cancel: no original replica is in sync".into(),
                ));
            }
            let t = Target {
                replicas: original,
                isr,
                adding: Vec::new(),
                removing: Vec::new(),
                recovery_state: None,
            };
            let election = Election {
                unclean,
                bump_epoch: true,
                ..REGULAR
            };
            if let Some(r) = change_record(image, topic_id, pid, p, t, &eligible, election) {
                s.emit(MetadataRecord::PartitionChange(r));
            }
            return Ok(());
        };
        let bad = |m: String| (ErrorCode::INVALID_REPLICA_ASSIGNMENT, m);
        if target.is_empty() {
            return Err(bad("the target replica list is empty".into()));
        }
        if has_duplicates(&target) {
            return Err(bad("the target replica list names a broker twice".into()));
        }
        if let Some(b) = target.iter().find(|b| image.broker(**b).is_none()) {
            return Err(bad(format!("broker {b} is not registered")));
        }
        if target == original && !p.is_reassigning() {
            return Ok(());
        }
        let adding: Vec<i32> = target
            .iter()
            .copied()
            .filter(|b| !original.contains(b))
            .collect();
        let removing: Vec<i32> = original
            .iter()
            .copied()
            .filter(|b| !target.contains(b))
            .collect();
        let mut replicas = target.clone();
        replicas.extend(removing.iter().copied());
        // ISR members that were being added by a replaced reassignment leave with it.
        let isr: Vec<i32> = p
            .isr
            .iter()
            .copied()
            .filter(|b| replicas.contains(b))
            .collect();
        if isr.is_empty() {
            return Err(bad(
                "the new assignment would leave no in-sync replica; cancel the reassignment in progress first"
                    .into(),
            ));
        }
        let t = Target {
            replicas,
            isr,
            adding,
            removing,
            recovery_state: None,
        };
        let election = Election { unclean, ..REGULAR };
        if let Some(r) = change_record(image, topic_id, pid, p, t, &eligible, election) {
            s.emit(MetadataRecord::PartitionChange(r));
        }
        // A pure removal (or a target already in sync) completes at once.
        self.maybe_complete_reassignment(s, topic_id, pid);
        Ok(())
    }

    fn allocate_producer_ids(
        &mut self,
        req: AllocateProducerIdsRequest,
        image: &MetadataImage,
    ) -> ControllerResult {
        let mut s = Scratch::new(image);
        let refuse = |s: Scratch<'_>, code| {
            s.finish(ControllerResponse::AllocateProducerIds(
                AllocateProducerIdsResponse {
                    error_code: code,
                    producer_id_start: -1,
                    producer_id_len: 0,
                },
            ))
        };
        let Some(broker) = image.broker(req.broker_id) else {
            return refuse(s, ErrorCode::BROKER_ID_NOT_REGISTERED);
        };
        if broker.epoch != req.broker_epoch {
            return refuse(s, ErrorCode::STALE_BROKER_EPOCH);
        }
        let start = image.next_producer_id;
        let len = self.config.producer_id_block_size;
        let Some(next) = start.checked_add(len) else {
            return refuse(s, ErrorCode::UNKNOWN_SERVER_ERROR);
        };
        s.emit(MetadataRecord::ProducerIds(ProducerIdsRecord {
            broker_id: req.broker_id,
            broker_epoch: req.broker_epoch,
            next_producer_id: next,
            ..Default::default()
        }));
        s.finish(ControllerResponse::AllocateProducerIds(
            AllocateProducerIdsResponse {
                error_code: ErrorCode::NONE,
                producer_id_start: start,
                producer_id_len: i32::try_from(len).unwrap_or(i32::MAX),
            },
        ))
    }

    fn alter_configs(
        &mut self,
        req: IncrementalAlterConfigsRequest,
        image: &MetadataImage,
    ) -> ControllerResult {
        let mut s = Scratch::new(image);
        let mut results = Vec::with_capacity(req.resources.len());
        for r in &req.resources {
            let outcome = self.alter_resource_configs(&mut s, r, req.validate_only);
            let (error_code, error_message) = match outcome {
                Ok(()) => (ErrorCode::NONE, None),
                Err((c, m)) => (c, Some(m)),
            };
            results.push(AlterConfigsResourceResult {
                resource_type: r.resource_type,
                resource_name: r.resource_name.clone(),
                error_code,
                error_message,
            });
        }
        s.finish(ControllerResponse::IncrementalAlterConfigs(results))
    }

    fn alter_resource_configs(
        &self,
        s: &mut Scratch<'_>,
        r: &AlterConfigsResource,
        validate_only: bool,
    ) -> Result<(), (ErrorCode, String)> {
        let topic_id = match r.resource_type {
            RESOURCE_TOPIC => Some(s.image().topic(&r.resource_name).map(|t| t.id).ok_or_else(
                || {
                    (
                        ErrorCode::UNKNOWN_TOPIC_OR_PARTITION,
                        format!("topic {} does not exist", r.resource_name),
                    )
                },
            )?),
            RESOURCE_BROKER => {
                if !r.resource_name.is_empty() && r.resource_name.parse::<i32>().is_err() {
                    return Err((
                        ErrorCode::INVALID_REQUEST,
                        format!("broker resource name {} is not an id", r.resource_name),
                    ));
                }
                None
            }
            // A group need not exist to have configs (Kafka's ControllerConfigurationValidator
            // asks only for a name); the broker validated names and values.
            RESOURCE_GROUP => {
                if r.resource_name.is_empty() {
                    return Err((
                        ErrorCode::INVALID_REQUEST,
                        "Group name must not be empty".to_string(),
                    ));
                }
                None
            }
            // A telemetry subscription, likewise validated whole by the broker.
            RESOURCE_CLIENT_METRICS => {
                if r.resource_name.is_empty() {
                    return Err((
                        ErrorCode::INVALID_REQUEST,
                        "Subscription name can't be empty".to_string(),
                    ));
                }
                None
            }
            other => {
                return Err((
                    ErrorCode::INVALID_REQUEST,
                    format!("resource type {other} cannot be altered here"),
                ))
            }
        };
        let key = (r.resource_type, r.resource_name.clone());
        let current = s.image().configs.get(&key).cloned().unwrap_or_default();
        let mut records = Vec::new();
        for (name, op, value) in &r.configs {
            if r.resource_type == RESOURCE_TOPIC {
                validate_topic_config(name, None).map_err(|m| (ErrorCode::INVALID_CONFIG, m))?;
            }
            let new_value = match op {
                AlterConfigOp::Set => {
                    let v = value.clone().ok_or_else(|| {
                        (
                            ErrorCode::INVALID_REQUEST,
                            format!("SET of {name} without a value"),
                        )
                    })?;
                    Some(v)
                }
                AlterConfigOp::Delete => None,
                AlterConfigOp::Append | AlterConfigOp::Subtract => {
                    if name != "cleanup.policy"
                        && name != "leader.replication.throttled.replicas"
                        && name != "follower.replication.throttled.replicas"
                    {
                        return Err((
                            ErrorCode::INVALID_CONFIG,
                            format!("{name} is not a list; APPEND and SUBTRACT do not apply"),
                        ));
                    }
                    let mut items: Vec<String> = current
                        .get(name)
                        .map(|v| {
                            v.split(',')
                                .map(|x| x.trim().to_string())
                                .filter(|x| !x.is_empty())
                                .collect()
                        })
                        .unwrap_or_default();
                    let given: Vec<String> = value
                        .as_deref()
                        .unwrap_or("")
                        .split(',')
                        .map(|x| x.trim().to_string())
                        .filter(|x| !x.is_empty())
                        .collect();
                    if *op == AlterConfigOp::Append {
                        for g in given {
                            if !items.contains(&g) {
                                items.push(g);
                            }
                        }
                    } else {
                        items.retain(|i| !given.contains(i));
                    }
                    if items.is_empty() {
                        None
                    } else {
                        Some(items.join(","))
                    }
                }
            };
            if let Some(v) = &new_value {
                validate_config_value(name, v).map_err(|m| (ErrorCode::INVALID_CONFIG, m))?;
            }
            records.push(MetadataRecord::Config(ConfigRecord {
                resource_type: r.resource_type,
                resource_name: r.resource_name.clone(),
                name: name.clone(),
                value: new_value,
                ..Default::default()
            }));
        }
        if validate_only {
            return Ok(());
        }
        for rec in records {
            s.emit(rec);
        }
        // Turning unclean election on gives leaderless partitions a leader at once, as
        // Kafka does: for the topic, or for every topic when the cluster default changed.
        if let Some(id) = topic_id {
            self.elect_leaderless(s, Some(id));
        } else if r.resource_type == RESOURCE_BROKER && r.resource_name.is_empty() {
            self.elect_leaderless(s, None);
        }
        Ok(())
    }
}

/// Checks the invariants of DESIGN.md §4 that hold within one image: every partition's
/// ISR is non-empty, duplicate-free and within its replicas; its leader, when it has
/// one, is an ISR member and a live broker; reassignment sets are within the replicas.
pub fn check_image_invariants(image: &MetadataImage) -> Result<(), String> {
    for t in image.topics.values() {
        for (pid, p) in &t.partitions {
            let name = format!("{}-{}", t.name, pid);
            if p.isr.is_empty() {
                return Err(format!("{name}: empty ISR"));
            }
            if has_duplicates(&p.replicas) || has_duplicates(&p.isr) {
                return Err(format!("{name}: duplicate replica in {p:?}"));
            }
            if let Some(b) = p.isr.iter().find(|b| !p.replicas.contains(b)) {
                return Err(format!("{name}: ISR member {b} is not a replica: {p:?}"));
            }
            if p.adding_replicas
                .iter()
                .chain(&p.removing_replicas)
                .any(|b| !p.replicas.contains(b))
            {
                return Err(format!("{name}: reassignment outside the replicas: {p:?}"));
            }
            if p.leader != NO_LEADER {
                if !p.isr.contains(&p.leader) {
                    return Err(format!(
                        "{name}: leader {} not in ISR {:?}",
                        p.leader, p.isr
                    ));
                }
                if image.broker(p.leader).is_none_or(|b| b.fenced) {
                    return Err(format!("{name}: leader {} is fenced", p.leader));
                }
            }
        }
    }
    Ok(())
}

/// Kafka's bounds on SCRAM iterations (`ScramMechanism`'s minimum, and the most
/// AlterUserScramCredentials accepts).
pub const SCRAM_MIN_ITERATIONS: i32 = 4096;
pub const SCRAM_MAX_ITERATIONS: i32 = 16384;

/// AlterUserScramCredentials as Kafka's `ScramControlManager` decides it: each (user,
/// mechanism) named once per request (else DUPLICATE_RESOURCE for that user), mechanisms 1
/// and 2 only, iterations within [`SCRAM_MIN_ITERATIONS`, `SCRAM_MAX_ITERATIONS`], a
/// deletion of a credential that does not exist is RESOURCE_NOT_FOUND. A user's changes
/// apply together or not at all.
fn alter_user_scram_credentials(
    req: AlterUserScramCredentialsRequest,
    image: &MetadataImage,
) -> ControllerResult {
    use rill_protocol::generated::metadata::{
        RemoveUserScramCredentialRecord, UserScramCredentialRecord,
    };
    let mut s = Scratch::new(image);
    let mut users: Vec<String> = Vec::new();
    // A (user, mechanism) pair named twice makes the whole user's change a duplicate.
    let mut pairs: BTreeMap<(String, i8), usize> = BTreeMap::new();
    for (name, mechanism) in req
        .deletions
        .iter()
        .map(|(n, m)| (n, *m))
        .chain(req.upsertions.iter().map(|u| (&u.name, u.mechanism)))
    {
        if !users.contains(name) {
            users.push(name.clone());
        }
        *pairs.entry((name.clone(), mechanism)).or_default() += 1;
    }
    let mut results = Vec::with_capacity(users.len());
    for user in users {
        let fail = |code: ErrorCode, message: &str| AlterUserScramCredentialsResult {
            user: user.clone(),
            error_code: code,
            error_message: Some(message.to_string()),
        };
        if pairs.iter().any(|((u, _), n)| *u == user && *n > 1) {
            results.push(fail(
                ErrorCode::DUPLICATE_RESOURCE,
                "A user credential cannot be altered twice in the same request",
            ));
            continue;
        }
        if user.is_empty() {
            results.push(fail(
                ErrorCode::UNACCEPTABLE_CREDENTIAL,
                "Username must not be empty",
            ));
            continue;
        }
        let mut records = Vec::new();
        let mut error = None;
        for (_, mechanism) in req.deletions.iter().filter(|(n, _)| *n == user) {
            if !(1..=2).contains(mechanism) {
                error = Some(fail(
                    ErrorCode::UNSUPPORTED_SASL_MECHANISM,
                    "Unknown SCRAM mechanism",
                ));
            } else if !s
                .image()
                .scram_credentials
                .contains_key(&(user.clone(), *mechanism))
            {
                error = Some(fail(
                    ErrorCode::RESOURCE_NOT_FOUND,
                    "Attempt to delete a user credential that does not exist",
                ));
            } else {
                records.push(MetadataRecord::RemoveUserScramCredential(
                    RemoveUserScramCredentialRecord {
                        name: user.clone(),
                        mechanism: *mechanism,
                        ..Default::default()
                    },
                ));
            }
        }
        for u in req.upsertions.iter().filter(|u| u.name == user) {
            if !(1..=2).contains(&u.mechanism) {
                error = Some(fail(
                    ErrorCode::UNSUPPORTED_SASL_MECHANISM,
                    "Unknown SCRAM mechanism",
                ));
            } else if u.iterations < SCRAM_MIN_ITERATIONS {
                error = Some(fail(
                    ErrorCode::UNACCEPTABLE_CREDENTIAL,
                    "Too few iterations",
                ));
            } else if u.iterations > SCRAM_MAX_ITERATIONS {
                error = Some(fail(
                    ErrorCode::UNACCEPTABLE_CREDENTIAL,
                    "Too many iterations",
                ));
            } else if u.salt.is_empty() || u.stored_key.is_empty() || u.server_key.is_empty() {
                error = Some(fail(
                    ErrorCode::UNACCEPTABLE_CREDENTIAL,
                    "Empty salt or key",
                ));
            } else {
                records.push(MetadataRecord::UserScramCredential(
                    UserScramCredentialRecord {
                        name: user.clone(),
                        mechanism: u.mechanism,
                        salt: u.salt.clone().into(),
                        stored_key: u.stored_key.clone().into(),
                        server_key: u.server_key.clone().into(),
                        iterations: u.iterations,
                        ..Default::default()
                    },
                ));
            }
        }
        match error {
            Some(e) => results.push(e),
            None => {
                for r in records {
                    s.emit(r);
                }
                results.push(AlterUserScramCredentialsResult {
                    user,
                    error_code: ErrorCode::NONE,
                    error_message: None,
                });
            }
        }
    }
    s.finish(ControllerResponse::AlterUserScramCredentials(results))
}
