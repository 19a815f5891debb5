//! The consumer: consumer groups (the classic protocol, as the seeds describe it, or
//! KIP-848's with `group.protocol=consumer`, in `consumer_protocol`) or manual assignment,
//! fetching, positions and commits.
//!
//! `poll(timeout)` follows Kafka's `KafkaConsumer.poll`, keeping one time budget across
//! its steps:
//!
//! 1. With a subscription, make sure the group is joined (`ensureActiveGroup`):
//!    a. the coordinator is known — FindCoordinator to the least-loaded broker, retried
//!    with `retry.backoff.ms` until the budget is spent (then an empty poll);
//!    b. the heartbeat task runs (it starts with the first generation, and marks the
//!    member for rejoin on `REBALANCE_IN_PROGRESS`, `ILLEGAL_GENERATION`,
//!    `UNKNOWN_MEMBER_ID`, and forgets the coordinator on `NOT_COORDINATOR`);
//!    c. when a rejoin is needed: prepare (commit synchronously if auto-commit is on, call
//!    the listener's revoked — or lost when the member was fenced), then JoinGroup
//!    (member id empty on the first join; `MEMBER_ID_REQUIRED` hands one out and is
//!    answered at once), then SyncGroup — the leader runs the assignor named by the
//!    coordinator over every member's subscription first, followers send theirs empty
//!    and the coordinator holds them until the leader's arrives. `UNKNOWN_MEMBER_ID`,
//!    `REBALANCE_IN_PROGRESS` and `ILLEGAL_GENERATION` restart the join; coordinator
//!    errors rediscover it; other errors are returned.
//! 2. Partitions without a position take the committed offset (OffsetFetch), else the
//!    `auto.offset.reset` policy via ListOffsets (`none` is an error).
//! 3. Auto-commit when `auto.commit.interval.ms` has passed (in the background).
//! 4. Return buffered records, or fetch: one Fetch in flight per leader at a time, sent
//!    to every leader that has none (for its partitions), and return what the first
//!    answers brought (waiting at most `fetch.max.wait.ms` or what is left of the
//!    budget), up to `max.poll.records`; repeat until records arrive or the budget is
//!    spent. A Fetch still parked on a broker with nothing new stays in flight across
//!    polls, as in Kafka's `Fetcher`: waiting for every leader's answer before the
//!    next round let one quiet broker's `fetch.max.wait.ms` pace the reads from all
//!    the others.
//!
//! JoinGroup and SyncGroup are not cut short by the poll budget: a rebalance must finish
//! for the member to stay in the group, and the coordinator bounds it by the rebalance
//! timeout.
//!
//! The cooperative assignor (KIP-429): members keep their partitions while rejoining;
//! after SyncGroup a member revokes only what it lost and, if it lost any, rejoins at once
//! so that the next round can give those partitions to their new owner.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use rill_protocol::generated::fetch_request::{FetchPartition, FetchTopic};
use rill_protocol::generated::join_group_request::JoinGroupRequestProtocol;
use rill_protocol::generated::leave_group_request::MemberIdentity;
use rill_protocol::generated::sync_group_request::SyncGroupRequestAssignment;
use rill_protocol::generated::{
    FetchRequest, FetchResponse, HeartbeatRequest, JoinGroupRequest, LeaveGroupRequest,
    SyncGroupRequest,
};
use rill_protocol::records::{AbortedTransactions, Header, RecordBatch};
use rill_protocol::{ErrorCode, Uuid};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::assignor::{
    decode_assignment, decode_subscription, encode_assignment, encode_subscription, Assignor,
    GroupSubscription,
};
use crate::config::ClientConfig;
use crate::consumer_protocol::{MemberState, Subscribed};
use crate::error::{Error, Result};
use crate::network::{BrokerMetadata, NetworkClient};
use crate::ops;
use crate::types::{OffsetSpec, TopicPartition};

const FETCH_VERSION: i16 = 12;
const JOIN_GROUP_VERSION: i16 = 9;
const SYNC_GROUP_VERSION: i16 = 5;
const HEARTBEAT_VERSION: i16 = 4;
const LEAVE_GROUP_VERSION: i16 = 5;
/// How many times a commit refused with STALE_MEMBER_EPOCH is sent (see `commit_offsets`).
const STALE_EPOCH_COMMIT_ATTEMPTS: u32 = 5;

/// `auto.offset.reset`: where to start when there is no committed offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AutoOffsetReset {
    Earliest,
    Latest,
    /// Fail with [`Error::NoOffsetForPartition`].
    None,
}

impl std::str::FromStr for AutoOffsetReset {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "earliest" | "smallest" | "beginning" => Ok(Self::Earliest),
            "latest" | "largest" | "end" => Ok(Self::Latest),
            "none" | "error" => Ok(Self::None),
            other => Err(Error::InvalidConfig(format!("auto.offset.reset={other}"))),
        }
    }
}

/// Consumer settings, with the Java client's defaults.
///
/// ```
/// use rill_client::{AutoOffsetReset, ClientConfig, ConsumerConfig, Assignor};
/// let config = ConsumerConfig::new(ClientConfig::new("127.0.0.1:9092"))
///     .group_id("billing")
///     .auto_offset_reset(AutoOffsetReset::Earliest)
///     .assignors(vec![Assignor::CooperativeSticky]);
/// assert!(config.enable_auto_commit);
/// ```
#[derive(Debug, Clone)]
pub struct ConsumerConfig {
    pub client: ClientConfig,
    /// `group.id`; needed for `subscribe` and for commits.
    pub group_id: Option<String>,
    /// `group.instance.id`: static membership (KIP-345).
    pub group_instance_id: Option<String>,
    /// `session.timeout.ms`.
    pub session_timeout: Duration,
    /// `heartbeat.interval.ms`.
    pub heartbeat_interval: Duration,
    /// `max.poll.interval.ms`; also the rebalance timeout sent in JoinGroup.
    pub max_poll_interval: Duration,
    /// `auto.offset.reset` (default latest).
    pub auto_offset_reset: AutoOffsetReset,
    /// `enable.auto.commit`.
    pub enable_auto_commit: bool,
    /// `auto.commit.interval.ms`.
    pub auto_commit_interval: Duration,
    /// `partition.assignment.strategy`, in preference order.
    pub assignors: Vec<Assignor>,
    /// `fetch.min.bytes`.
    pub fetch_min_bytes: i32,
    /// `fetch.max.bytes`.
    pub fetch_max_bytes: i32,
    /// `max.partition.fetch.bytes`.
    pub max_partition_fetch_bytes: i32,
    /// `fetch.max.wait.ms`.
    pub fetch_max_wait: Duration,
    /// `max.poll.records`.
    pub max_poll_records: usize,
    /// `isolation.level=read_committed`: reads up to the last stable offset, and skips the
    /// records of aborted transactions.
    pub read_committed: bool,
    /// `group.protocol`: the classic protocol (JoinGroup and SyncGroup, the assignment
    /// made by a member), or KIP-848's, where the coordinator assigns.
    pub group_protocol: GroupProtocol,
    /// `group.remote.assignor`: with the consumer protocol, the coordinator's assignor to
    /// use (`uniform` or `range`); the group's default when `None`.
    pub group_remote_assignor: Option<String>,
}

/// `group.protocol`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GroupProtocol {
    #[default]
    Classic,
    /// KIP-848's consumer group protocol (ConsumerGroupHeartbeat).
    Consumer,
}

impl std::str::FromStr for GroupProtocol {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "classic" => Ok(Self::Classic),
            "consumer" => Ok(Self::Consumer),
            other => Err(Error::InvalidConfig(format!(
                "group.protocol {other:?} is not classic or consumer"
            ))),
        }
    }
}

impl ConsumerConfig {
    pub fn new(client: ClientConfig) -> Self {
        Self {
            client,
            group_id: None,
            group_instance_id: None,
            session_timeout: Duration::from_secs(45),
            heartbeat_interval: Duration::from_secs(3),
            max_poll_interval: Duration::from_secs(300),
            auto_offset_reset: AutoOffsetReset::Latest,
            enable_auto_commit: true,
            auto_commit_interval: Duration::from_secs(5),
            assignors: vec![Assignor::Range, Assignor::CooperativeSticky],
            fetch_min_bytes: 1,
            fetch_max_bytes: 50 << 20,
            max_partition_fetch_bytes: 1 << 20,
            fetch_max_wait: Duration::from_millis(500),
            max_poll_records: 500,
            read_committed: false,
            group_protocol: GroupProtocol::Classic,
            group_remote_assignor: None,
        }
    }

    pub fn group_id(mut self, group: impl Into<String>) -> Self {
        self.group_id = Some(group.into());
        self
    }

    pub fn group_instance_id(mut self, id: impl Into<String>) -> Self {
        self.group_instance_id = Some(id.into());
        self
    }

    pub fn auto_offset_reset(mut self, reset: AutoOffsetReset) -> Self {
        self.auto_offset_reset = reset;
        self
    }

    /// `isolation.level`: `read_committed` when `on`, else `read_uncommitted`.
    pub fn read_committed(mut self, on: bool) -> Self {
        self.read_committed = on;
        self
    }

    pub fn enable_auto_commit(mut self, on: bool) -> Self {
        self.enable_auto_commit = on;
        self
    }

    pub fn assignors(mut self, assignors: Vec<Assignor>) -> Self {
        self.assignors = assignors;
        self
    }

    pub fn session_timeout(mut self, timeout: Duration) -> Self {
        self.session_timeout = timeout;
        self
    }

    pub fn heartbeat_interval(mut self, interval: Duration) -> Self {
        self.heartbeat_interval = interval;
        self
    }

    /// `group.protocol` (see [`GroupProtocol`]).
    pub fn group_protocol(mut self, protocol: GroupProtocol) -> Self {
        self.group_protocol = protocol;
        self
    }

    /// `group.remote.assignor`: the coordinator's assignor, for the consumer protocol.
    pub fn group_remote_assignor(mut self, assignor: impl Into<String>) -> Self {
        self.group_remote_assignor = Some(assignor.into());
        self
    }

    pub fn max_poll_interval(mut self, interval: Duration) -> Self {
        self.max_poll_interval = interval;
        self
    }
}

/// A record read from a partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerRecord {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    /// ms since the epoch (create or log-append time, as the topic says).
    pub timestamp: i64,
    pub key: Option<Bytes>,
    pub value: Option<Bytes>,
    pub headers: Vec<Header>,
}

/// What happened to the member's partitions in a rebalance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RebalanceEvent {
    Revoked(Vec<TopicPartition>),
    Assigned(Vec<TopicPartition>),
    Lost(Vec<TopicPartition>),
}

/// Called by `poll` during a rebalance (Kafka's `ConsumerRebalanceListener`).
///
/// An `mpsc::UnboundedSender<RebalanceEvent>` is a listener that forwards every event.
pub trait RebalanceListener: Send {
    /// Before giving partitions up: the last chance to commit their offsets.
    fn on_partitions_revoked(&mut self, _partitions: &[TopicPartition]) {}
    /// After receiving partitions, before fetching from them.
    fn on_partitions_assigned(&mut self, _partitions: &[TopicPartition]) {}
    /// Partitions taken away without a clean revoke (the member was fenced): others may
    /// own them already, so do not commit.
    fn on_partitions_lost(&mut self, partitions: &[TopicPartition]) {
        self.on_partitions_revoked(partitions);
    }
}

impl RebalanceListener for tokio::sync::mpsc::UnboundedSender<RebalanceEvent> {
    fn on_partitions_revoked(&mut self, partitions: &[TopicPartition]) {
        let _ = self.send(RebalanceEvent::Revoked(partitions.to_vec()));
    }
    fn on_partitions_assigned(&mut self, partitions: &[TopicPartition]) {
        let _ = self.send(RebalanceEvent::Assigned(partitions.to_vec()));
    }
    fn on_partitions_lost(&mut self, partitions: &[TopicPartition]) {
        let _ = self.send(RebalanceEvent::Lost(partitions.to_vec()));
    }
}

enum Subscription {
    None,
    Topics(Vec<String>),
    Pattern(regex::Regex),
    Assigned,
}

#[derive(Debug, Clone, Default)]
struct PartitionState {
    /// Next offset to hand to the application (what commits store).
    position: Option<i64>,
    /// Next offset to fetch (ahead of `position` while records are buffered).
    fetch_offset: Option<i64>,
    paused: bool,
    /// Skip the committed offset: the position was out of range.
    reset_pending: bool,
    high_watermark: i64,
}

/// State the heartbeat task shares with `poll`.
#[derive(Debug)]
pub(crate) struct GroupState {
    pub(crate) member_id: String,
    pub(crate) generation: i32,
    pub(crate) coordinator: Option<BrokerMetadata>,
    pub(crate) rejoin_needed: bool,
    /// The member was fenced: its partitions are lost, not revoked.
    pub(crate) lost: bool,
    /// Another live member took our `group.instance.id` (FENCED_INSTANCE_ID): fatal, as
    /// in Kafka. Rejoining would fence that member in turn, and the two would take the
    /// partitions from each other forever.
    pub(crate) fenced: bool,
    pub(crate) joining: bool,
    pub(crate) last_poll: Instant,
    pub(crate) closed: bool,
    /// The consumer protocol's state (`group.protocol=consumer`); `generation` is the
    /// member epoch then.
    pub(crate) member: MemberState,
}

pub(crate) type Shared = Arc<Mutex<GroupState>>;

/// A Kafka consumer.
///
/// ```no_run
/// use std::time::Duration;
/// use rill_client::{AutoOffsetReset, ClientConfig, Consumer, ConsumerConfig, TopicPartition};
///
/// # async fn run() -> rill_client::Result<()> {
/// // In a group:
/// let config = ConsumerConfig::new(ClientConfig::new("127.0.0.1:9092"))
///     .group_id("billing")
///     .auto_offset_reset(AutoOffsetReset::Earliest);
/// let mut consumer = Consumer::new(config)?;
/// consumer.subscribe(&["orders"])?;
/// let records = consumer.poll(Duration::from_secs(1)).await?;
/// consumer.commit_sync().await?;
///
/// // Without a group, from a chosen offset:
/// let mut reader = Consumer::new(ConsumerConfig::new(ClientConfig::new("127.0.0.1:9092")))?;
/// reader.assign(&[TopicPartition::new("orders", 0)])?;
/// reader.seek(&TopicPartition::new("orders", 0), 42)?;
/// let records = reader.poll(Duration::from_secs(1)).await?;
/// # Ok(()) }
/// ```
pub struct Consumer {
    net: Arc<NetworkClient>,
    config: ConsumerConfig,
    subscription: Subscription,
    /// Topics the pattern matched when last checked.
    matched_topics: Vec<String>,
    last_pattern_check: Option<Instant>,
    assignment: BTreeMap<TopicPartition, PartitionState>,
    buffered: VecDeque<ConsumerRecord>,
    group: Shared,
    heartbeat: Option<JoinHandle<()>>,
    listener: Option<Box<dyn RebalanceListener>>,
    last_auto_commit: Instant,
    last_committed: BTreeMap<TopicPartition, i64>,
    /// The assignor the coordinator chose in the current generation.
    protocol: Option<Assignor>,
    /// Fetches sent and not yet handled, one at most per leader (see [`Self::fetch`]).
    in_flight: tokio::task::JoinSet<FetchOutcome>,
    in_flight_leaders: BTreeSet<i32>,
    /// The consumer protocol: wakes the heartbeat task to heartbeat now (an assignment
    /// was reconciled), and `poll` when an answer came.
    heartbeat_wake: Arc<Notify>,
    group_changed: Arc<Notify>,
}

/// How long past its `max_wait` a poll waits for a Fetch's answer (the round trip).
const FETCH_ANSWER_SLACK: Duration = Duration::from_millis(100);

/// A Fetch's answer with what it asked for: the leader, and each partition with the
/// offset it was fetched from.
type FetchOutcome = (i32, Vec<(TopicPartition, i64)>, Result<FetchResponse>);

impl Consumer {
    /// Creates a consumer; nothing is connected until the first poll. Call from within a
    /// tokio runtime (the heartbeat task is spawned on it).
    pub fn new(config: ConsumerConfig) -> Result<Self> {
        if config.assignors.is_empty() {
            return Err(Error::InvalidConfig(
                "partition.assignment.strategy is empty".into(),
            ));
        }
        if config.heartbeat_interval >= config.session_timeout {
            return Err(Error::InvalidConfig(
                "heartbeat.interval.ms must be below session.timeout.ms".into(),
            ));
        }
        let net = NetworkClient::new(config.client.clone())?;
        Ok(Self {
            net,
            config,
            subscription: Subscription::None,
            matched_topics: Vec::new(),
            last_pattern_check: None,
            assignment: BTreeMap::new(),
            buffered: VecDeque::new(),
            group: Arc::new(Mutex::new(GroupState {
                member_id: String::new(),
                generation: -1,
                coordinator: None,
                rejoin_needed: true,
                lost: false,
                fenced: false,
                joining: false,
                last_poll: Instant::now(),
                closed: false,
                member: MemberState::default(),
            })),
            heartbeat: None,
            listener: None,
            last_auto_commit: Instant::now(),
            last_committed: BTreeMap::new(),
            protocol: None,
            in_flight: tokio::task::JoinSet::new(),
            in_flight_leaders: BTreeSet::new(),
            heartbeat_wake: Arc::new(Notify::new()),
            group_changed: Arc::new(Notify::new()),
        })
    }

    /// Subscribes to topics; partitions come from the group. Needs `group.id`.
    pub fn subscribe(&mut self, topics: &[&str]) -> Result<()> {
        self.require_group()?;
        if matches!(self.subscription, Subscription::Assigned) {
            return Err(Error::IllegalState(
                "already assigned partitions manually".into(),
            ));
        }
        let mut topics: Vec<String> = topics.iter().map(|t| t.to_string()).collect();
        topics.sort();
        topics.dedup();
        self.set_member_subscription(Subscribed::Topics(topics.clone()));
        self.subscription = Subscription::Topics(topics);
        self.request_rejoin();
        Ok(())
    }

    /// The consumer protocol: the subscription the next heartbeat carries.
    fn set_member_subscription(&self, subscribed: Subscribed) {
        if self.config.group_protocol != GroupProtocol::Consumer {
            return;
        }
        if let Ok(mut g) = self.group.lock() {
            g.member.subscribed = Some(subscribed);
        }
        self.heartbeat_wake.notify_one();
    }

    /// Subscribes to every topic whose whole name matches `pattern` (a regex); new
    /// matching topics are picked up every `metadata.max.age.ms`.
    pub fn subscribe_pattern(&mut self, pattern: &str) -> Result<()> {
        self.require_group()?;
        if matches!(self.subscription, Subscription::Assigned) {
            return Err(Error::IllegalState(
                "already assigned partitions manually".into(),
            ));
        }
        let re = regex::Regex::new(&format!("^(?:{pattern})$"))
            .map_err(|e| Error::InvalidConfig(format!("pattern: {e}")))?;
        // The consumer protocol: the broker matches the expression (KIP-848's
        // `subscribed_topic_regex`, a whole-name match as here).
        self.set_member_subscription(Subscribed::Regex(pattern.to_string()));
        self.subscription = Subscription::Pattern(re);
        self.last_pattern_check = None;
        self.request_rejoin();
        Ok(())
    }

    /// Sets the listener called on rebalances.
    pub fn set_rebalance_listener(&mut self, listener: impl RebalanceListener + 'static) {
        self.listener = Some(Box::new(listener));
    }

    /// Reads exactly these partitions, without group membership (commits still go to
    /// `group.id` when one is set).
    pub fn assign(&mut self, partitions: &[TopicPartition]) -> Result<()> {
        if matches!(
            self.subscription,
            Subscription::Topics(_) | Subscription::Pattern(_)
        ) {
            return Err(Error::IllegalState(
                "already subscribed; unsubscribe first".into(),
            ));
        }
        self.subscription = Subscription::Assigned;
        let keep: BTreeSet<&TopicPartition> = partitions.iter().collect();
        self.assignment.retain(|tp, _| keep.contains(tp));
        for tp in partitions {
            self.assignment.entry(tp.clone()).or_default();
        }
        self.buffered
            .retain(|r| keep.contains(&TopicPartition::new(r.topic.clone(), r.partition)));
        Ok(())
    }

    /// Leaves the group (if any) and drops every partition.
    pub async fn unsubscribe(&mut self) -> Result<()> {
        if matches!(
            self.subscription,
            Subscription::Topics(_) | Subscription::Pattern(_)
        ) {
            self.leave_group().await;
        }
        self.subscription = Subscription::None;
        self.assignment.clear();
        self.buffered.clear();
        Ok(())
    }

    /// The partitions this consumer reads now.
    pub fn assignment(&self) -> Vec<TopicPartition> {
        self.assignment.keys().cloned().collect()
    }

    /// Member id and generation in the group (empty and -1 outside one).
    pub fn group_metadata(&self) -> (String, i32) {
        self.group
            .lock()
            .map(|g| (g.member_id.clone(), g.generation))
            .unwrap_or_default()
    }

    /// Next offset to be returned for `tp`, when known.
    pub fn position(&self, tp: &TopicPartition) -> Option<i64> {
        self.assignment.get(tp).and_then(|s| s.position)
    }

    /// Last high watermark seen for `tp` (-1 before the first fetch).
    pub fn high_watermark(&self, tp: &TopicPartition) -> Option<i64> {
        self.assignment.get(tp).map(|s| s.high_watermark)
    }

    /// Makes the next poll read `tp` from `offset`.
    pub fn seek(&mut self, tp: &TopicPartition, offset: i64) -> Result<()> {
        let state = self
            .assignment
            .get_mut(tp)
            .ok_or_else(|| Error::IllegalState(format!("{tp} is not assigned")))?;
        state.position = Some(offset);
        state.fetch_offset = Some(offset);
        state.reset_pending = false;
        self.buffered
            .retain(|r| !(r.topic == tp.topic && r.partition == tp.partition));
        Ok(())
    }

    /// Seeks to the earliest or latest offset (or the first at a timestamp).
    pub async fn seek_to(&mut self, partitions: &[TopicPartition], spec: OffsetSpec) -> Result<()> {
        let offsets = ops::list_offsets(&self.net, partitions, spec).await?;
        for (tp, offset) in offsets {
            self.seek(&tp, offset)?;
        }
        Ok(())
    }

    /// Stops fetching from `partitions` until [`Self::resume`]; the group still counts
    /// them as ours.
    pub fn pause(&mut self, partitions: &[TopicPartition]) {
        for tp in partitions {
            if let Some(s) = self.assignment.get_mut(tp) {
                s.paused = true;
                s.fetch_offset = s.position;
            }
        }
        let paused: BTreeSet<&TopicPartition> = partitions.iter().collect();
        self.buffered
            .retain(|r| !paused.contains(&TopicPartition::new(r.topic.clone(), r.partition)));
    }

    pub fn resume(&mut self, partitions: &[TopicPartition]) {
        for tp in partitions {
            if let Some(s) = self.assignment.get_mut(tp) {
                s.paused = false;
            }
        }
    }

    pub fn paused(&self) -> Vec<TopicPartition> {
        self.assignment
            .iter()
            .filter(|(_, s)| s.paused)
            .map(|(tp, _)| tp.clone())
            .collect()
    }

    /// Committed offsets of the group for `partitions`.
    pub async fn committed(
        &self,
        partitions: &[TopicPartition],
    ) -> Result<BTreeMap<TopicPartition, i64>> {
        let group = self.require_group()?;
        ops::fetch_committed(&self.net, &group, Some(partitions)).await
    }

    fn require_group(&self) -> Result<String> {
        self.config
            .group_id
            .clone()
            .ok_or_else(|| Error::InvalidConfig("group.id is required".into()))
    }

    fn request_rejoin(&self) {
        if let Ok(mut g) = self.group.lock() {
            g.rejoin_needed = true;
        }
    }

    fn group_managed(&self) -> bool {
        matches!(
            self.subscription,
            Subscription::Topics(_) | Subscription::Pattern(_)
        )
    }

    /// Waits up to `timeout` for records and returns them (empty when none came).
    pub async fn poll(&mut self, timeout: Duration) -> Result<Vec<ConsumerRecord>> {
        let deadline = Instant::now() + timeout;
        if matches!(self.subscription, Subscription::None) {
            return Err(Error::IllegalState(
                "poll without subscription or assignment".into(),
            ));
        }
        if let Ok(mut g) = self.group.lock() {
            g.last_poll = Instant::now();
        }
        loop {
            if self.group_managed() && !self.ensure_active_group(deadline).await? {
                return Ok(Vec::new());
            }
            self.update_positions().await?;
            self.maybe_auto_commit();
            if !self.buffered.is_empty() {
                return Ok(self.take_buffered());
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            let wait = remaining.min(self.config.fetch_max_wait);
            self.fetch(wait).await?;
            if !self.buffered.is_empty() {
                return Ok(self.take_buffered());
            }
            if Instant::now() >= deadline {
                return Ok(Vec::new());
            }
        }
    }

    fn take_buffered(&mut self) -> Vec<ConsumerRecord> {
        let n = self.buffered.len().min(self.config.max_poll_records.max(1));
        let out: Vec<ConsumerRecord> = self.buffered.drain(..n).collect();
        // Records come in runs of one partition, in offset order: one position update per
        // run rather than a key built and looked up per record.
        let mut run_start = 0;
        while run_start < out.len() {
            let first = &out[run_start];
            let run_len = out[run_start..]
                .iter()
                .take_while(|r| r.partition == first.partition && r.topic == first.topic)
                .count();
            let last = &out[run_start + run_len - 1];
            if let Some(s) = self
                .assignment
                .get_mut(&TopicPartition::new(first.topic.clone(), first.partition))
            {
                s.position = Some(last.offset + 1);
            }
            run_start += run_len;
        }
        // Once the buffer is empty the consumed position catches up with the fetch
        // position (which may have skipped control records or compacted offsets).
        if self.buffered.is_empty() {
            for s in self.assignment.values_mut() {
                if s.fetch_offset.is_some() && !s.paused {
                    s.position = s.fetch_offset;
                }
            }
        }
        out
    }

    // ---- group membership -------------------------------------------------------------

    /// `ensureActiveGroup`: returns false when the budget ran out before the member is in
    /// a stable generation.
    async fn ensure_active_group(&mut self, deadline: Instant) -> Result<bool> {
        self.check_fenced()?;
        if self.config.group_protocol == GroupProtocol::Consumer {
            return self.ensure_consumer_member(deadline).await;
        }
        self.check_pattern().await?;
        loop {
            let (coordinator_known, rejoin) = {
                let g = self.group.lock().map_err(|_| Error::Closed)?;
                (g.coordinator.is_some(), g.rejoin_needed || g.generation < 0)
            };
            if !coordinator_known && !self.ensure_coordinator(deadline).await? {
                return Ok(false);
            }
            if !rejoin {
                return Ok(true);
            }
            self.start_heartbeat();
            match self.join_group().await {
                Ok(()) => {
                    let rejoin = self.group.lock().map(|g| g.rejoin_needed).unwrap_or(false);
                    if !rejoin {
                        return Ok(true);
                    }
                }
                Err(e) if e.is_retriable() || matches!(e.code(), Some(c) if is_rejoin_error(c)) => {
                    tracing::debug!(error = %e, "join failed, retrying");
                    if matches!(e.code(), Some(c) if is_coordinator_error(c))
                        || matches!(
                            e,
                            Error::Timeout { .. }
                                | Error::Disconnected { .. }
                                | Error::Connect { .. }
                        )
                    {
                        self.mark_coordinator_unknown();
                    }
                    if Instant::now() >= deadline {
                        return Ok(false);
                    }
                    if !matches!(e.code(), Some(c) if is_rejoin_error(c)) {
                        tokio::time::sleep(self.config.client.retry_backoff).await;
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The consumer protocol's `ensureActiveGroup` (see `consumer_protocol`): the
    /// coordinator is known, the heartbeat task runs, the member has joined (an epoch
    /// above 0), and the latest assignment is reconciled. False when the budget ran out
    /// first.
    async fn ensure_consumer_member(&mut self, deadline: Instant) -> Result<bool> {
        loop {
            let (coordinator_known, joined, lost, fatal) = {
                let mut g = self.group.lock().map_err(|_| Error::Closed)?;
                (
                    g.coordinator.is_some(),
                    g.generation > 0,
                    std::mem::take(&mut g.lost),
                    g.member.fatal.clone(),
                )
            };
            if let Some((code, message)) = fatal {
                return Err(Error::kafka(code, message));
            }
            if lost {
                self.lose_partitions();
            }
            if !coordinator_known {
                if !self.ensure_coordinator(deadline).await? {
                    return Ok(false);
                }
                self.heartbeat_wake.notify_one();
            }
            self.start_heartbeat();
            if joined {
                self.reconcile().await?;
                return Ok(true);
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Ok(false);
            }
            let changed = self.group_changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            // The answer may have come between the check above and the wait.
            if self.group.lock().map(|g| g.generation > 0).unwrap_or(false) {
                continue;
            }
            let _ = tokio::time::timeout(remaining, changed).await;
        }
    }

    /// The member was fenced: its partitions are gone without a commit.
    fn lose_partitions(&mut self) {
        let owned = self.assignment();
        if !owned.is_empty() {
            if let Some(l) = self.listener.as_mut() {
                l.on_partitions_lost(&owned);
            }
        }
        self.assignment.clear();
        self.buffered.clear();
        if let Ok(mut g) = self.group.lock() {
            g.member.owned.clear();
        }
    }

    /// Step 3 of `consumer_protocol`: moves the assignment to the one the coordinator
    /// sent last, revoking before assigning, and has the heartbeat report it at once.
    async fn reconcile(&mut self) -> Result<()> {
        let Some(target) = self
            .group
            .lock()
            .ok()
            .and_then(|mut g| g.member.target.take())
        else {
            return Ok(());
        };
        let mut names = topic_names(&self.net, target.keys()).await?;
        let mut new_set = BTreeSet::new();
        let mut unresolved = BTreeMap::new();
        for (id, partitions) in &target {
            match names.remove(id) {
                Some(name) => new_set.extend(
                    partitions
                        .iter()
                        .map(|p| TopicPartition::new(name.clone(), *p)),
                ),
                // A topic this client's metadata does not know yet: kept for a later poll.
                None => {
                    unresolved.insert(*id, partitions.clone());
                }
            }
        }
        let old_set: BTreeSet<TopicPartition> = self.assignment.keys().cloned().collect();
        let revoked: Vec<TopicPartition> = old_set.difference(&new_set).cloned().collect();
        let added: Vec<TopicPartition> = new_set.difference(&old_set).cloned().collect();
        if !revoked.is_empty() {
            if self.config.enable_auto_commit {
                let offsets: BTreeMap<TopicPartition, i64> = self
                    .positions()
                    .into_iter()
                    .filter(|(tp, _)| revoked.contains(tp))
                    .collect();
                if let Err(e) = self.commit_offsets(&offsets).await {
                    tracing::warn!(error = %e, "commit of revoked partitions failed");
                }
            }
            if let Some(l) = self.listener.as_mut() {
                l.on_partitions_revoked(&revoked);
            }
            for tp in &revoked {
                self.assignment.remove(tp);
            }
            let keep = &new_set;
            self.buffered
                .retain(|r| keep.contains(&TopicPartition::new(r.topic.clone(), r.partition)));
        }
        for tp in &added {
            self.assignment.entry(tp.clone()).or_default();
        }
        if !revoked.is_empty() || !added.is_empty() {
            tracing::info!(assigned = ?new_set, ?revoked, "reconciled the group's assignment");
        }
        if !added.is_empty() {
            if let Some(l) = self.listener.as_mut() {
                l.on_partitions_assigned(&added);
            }
        }
        if let Ok(mut g) = self.group.lock() {
            let mut owned = target;
            owned.retain(|id, _| !unresolved.contains_key(id));
            g.member.owned = owned;
            if !unresolved.is_empty() && g.member.target.is_none() {
                // Reconciled again once metadata names those topics.
                let mut again = g.member.owned.clone();
                again.extend(unresolved);
                g.member.target = Some(again);
            }
        }
        self.heartbeat_wake.notify_one();
        Ok(())
    }

    /// `ensureCoordinatorReady`: FindCoordinator until found or the budget is spent.
    async fn ensure_coordinator(&mut self, deadline: Instant) -> Result<bool> {
        let group = self.require_group()?;
        loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(
                remaining.max(Duration::from_millis(1)),
                ops::find_coordinator(&self.net, &group),
            )
            .await
            {
                Ok(Ok(c)) => {
                    tracing::debug!(
                        group,
                        coordinator = c.node_id,
                        "discovered group coordinator"
                    );
                    if let Ok(mut g) = self.group.lock() {
                        g.coordinator = Some(c);
                    }
                    return Ok(true);
                }
                Ok(Err(e)) if e.is_retriable() => {
                    if Instant::now() + self.config.client.retry_backoff >= deadline {
                        return Ok(false);
                    }
                    tokio::time::sleep(self.config.client.retry_backoff).await;
                }
                Ok(Err(e)) => return Err(e),
                Err(_) => return Ok(false),
            }
        }
    }

    /// Errors with FENCED_INSTANCE_ID once another member has taken our instance id.
    fn check_fenced(&self) -> Result<()> {
        if self.group.lock().map(|g| g.fenced).unwrap_or(false) {
            return Err(Error::kafka(
                ErrorCode::FENCED_INSTANCE_ID,
                format!(
                    "group.instance.id {} is used by another member",
                    self.config.group_instance_id.as_deref().unwrap_or_default()
                ),
            ));
        }
        Ok(())
    }

    fn mark_coordinator_unknown(&self) {
        if let Ok(mut g) = self.group.lock() {
            g.coordinator = None;
        }
    }

    async fn check_pattern(&mut self) -> Result<()> {
        let Subscription::Pattern(re) = &self.subscription else {
            return Ok(());
        };
        let due = self
            .last_pattern_check
            .is_none_or(|at| at.elapsed() >= self.config.client.metadata_max_age);
        if !due {
            return Ok(());
        }
        let re = re.clone();
        self.net.refresh_metadata(None).await?;
        let matched: Vec<String> = self
            .net
            .metadata()
            .topics
            .values()
            .filter(|t| !t.is_internal && re.is_match(&t.name))
            .map(|t| t.name.clone())
            .collect();
        self.last_pattern_check = Some(Instant::now());
        if matched != self.matched_topics {
            self.matched_topics = matched;
            self.request_rejoin();
        }
        Ok(())
    }

    fn subscribed_topics(&self) -> Vec<String> {
        match &self.subscription {
            Subscription::Topics(t) => t.clone(),
            Subscription::Pattern(_) => self.matched_topics.clone(),
            _ => Vec::new(),
        }
    }

    fn coordinator(&self) -> Result<BrokerMetadata> {
        self.group
            .lock()
            .ok()
            .and_then(|g| g.coordinator.clone())
            .ok_or_else(|| {
                Error::kafka(
                    ErrorCode::COORDINATOR_NOT_AVAILABLE,
                    "group coordinator unknown",
                )
            })
    }

    /// `onJoinPrepare`: commit, then tell the listener what is revoked (eager) or lost.
    async fn on_join_prepare(&mut self) {
        let lost = self.group.lock().map(|g| g.lost).unwrap_or(false);
        let owned = self.assignment();
        if lost {
            if let Ok(mut g) = self.group.lock() {
                g.lost = false;
            }
            if !owned.is_empty() {
                if let Some(l) = self.listener.as_mut() {
                    l.on_partitions_lost(&owned);
                }
            }
            self.assignment.clear();
            self.buffered.clear();
            return;
        }
        if self.config.enable_auto_commit {
            if let Err(e) = self.commit_positions().await {
                tracing::warn!(error = %e, "commit before rejoin failed");
            }
        }
        let cooperative = self.config.assignors.iter().all(|a| a.is_cooperative());
        if !cooperative && !owned.is_empty() {
            if let Some(l) = self.listener.as_mut() {
                l.on_partitions_revoked(&owned);
            }
            self.assignment.clear();
            self.buffered.clear();
        }
    }

    async fn join_group(&mut self) -> Result<()> {
        let group = self.require_group()?;
        self.on_join_prepare().await;
        if let Ok(mut g) = self.group.lock() {
            g.joining = true;
        }
        let result = self.join_and_sync(&group).await;
        if let Ok(mut g) = self.group.lock() {
            g.joining = false;
        }
        result
    }

    async fn join_and_sync(&mut self, group: &str) -> Result<()> {
        let topics = self.subscribed_topics();
        let owned = self.assignment();
        let member_id = self
            .group
            .lock()
            .map(|g| g.member_id.clone())
            .unwrap_or_default();
        let mut protocols = Vec::new();
        for a in &self.config.assignors {
            protocols.push(JoinGroupRequestProtocol {
                name: a.name().to_string(),
                metadata: encode_subscription(&topics, &owned)?,
                ..Default::default()
            });
        }
        let request = JoinGroupRequest {
            group_id: group.to_string(),
            session_timeout_ms: ms(self.config.session_timeout),
            rebalance_timeout_ms: ms(self.config.max_poll_interval),
            member_id,
            group_instance_id: self.config.group_instance_id.clone(),
            protocol_type: "consumer".into(),
            protocols,
            reason: None,
            ..Default::default()
        };
        let coordinator = self.coordinator()?;
        let conn = self.net.connection(&coordinator.addr()).await?;
        // The coordinator holds JoinGroup until every member has rejoined, up to the
        // rebalance timeout.
        let join_timeout = self.config.max_poll_interval + Duration::from_secs(5);
        let response = conn
            .send_with_timeout(&request, JOIN_GROUP_VERSION, join_timeout)
            .await?;
        let code = ErrorCode::from_code(response.error_code);
        match code {
            c if c.is_ok() => {}
            ErrorCode::MEMBER_ID_REQUIRED => {
                if let Ok(mut g) = self.group.lock() {
                    g.member_id = response.member_id.clone();
                }
                return Err(Error::kafka(code, format!("JoinGroup {group}")));
            }
            ErrorCode::UNKNOWN_MEMBER_ID => {
                if let Ok(mut g) = self.group.lock() {
                    g.member_id.clear();
                    g.generation = -1;
                }
                return Err(Error::kafka(code, format!("JoinGroup {group}")));
            }
            c => {
                if c == ErrorCode::FENCED_INSTANCE_ID {
                    self.mark_fenced();
                }
                return Err(Error::kafka(c, format!("JoinGroup {group}")));
            }
        }
        let generation = response.generation_id;
        let my_id = response.member_id.clone();
        let protocol_name = response.protocol_name.clone().unwrap_or_default();
        let assignor: Assignor = protocol_name.parse()?;
        if let Ok(mut g) = self.group.lock() {
            g.member_id = my_id.clone();
            g.generation = generation;
        }
        let mut assignments = Vec::new();
        if response.leader == my_id && !response.skip_assignment {
            let mut subs = GroupSubscription::default();
            for m in &response.members {
                subs.members.push(decode_subscription(
                    &m.member_id,
                    m.group_instance_id.clone(),
                    &m.metadata,
                )?);
            }
            let mut all_topics: Vec<String> =
                subs.members.iter().flat_map(|m| m.topics.clone()).collect();
            all_topics.sort();
            all_topics.dedup();
            self.net.invalidate_metadata();
            let md = self.net.ensure_topics(&all_topics).await?;
            for t in &all_topics {
                if let Some(n) = md.partition_count(t) {
                    subs.partitions_per_topic.insert(t.clone(), n as i32);
                }
            }
            let result = assignor.assign(&subs);
            tracing::debug!(group, generation, ?result, "leader computed assignment");
            for (member_id, partitions) in result {
                assignments.push(SyncGroupRequestAssignment {
                    member_id,
                    assignment: encode_assignment(&partitions)?,
                    ..Default::default()
                });
            }
        }
        let sync = SyncGroupRequest {
            group_id: group.to_string(),
            generation_id: generation,
            member_id: my_id.clone(),
            group_instance_id: self.config.group_instance_id.clone(),
            protocol_type: Some("consumer".into()),
            protocol_name: Some(protocol_name.clone()),
            assignments,
            ..Default::default()
        };
        let response = conn
            .send_with_timeout(&sync, SYNC_GROUP_VERSION, join_timeout)
            .await?;
        let code = ErrorCode::from_code(response.error_code);
        if !code.is_ok() {
            if code == ErrorCode::UNKNOWN_MEMBER_ID {
                if let Ok(mut g) = self.group.lock() {
                    g.member_id.clear();
                    g.generation = -1;
                }
            }
            if code == ErrorCode::FENCED_INSTANCE_ID {
                self.mark_fenced();
            }
            return Err(Error::kafka(code, format!("SyncGroup {group}")));
        }
        let new: Vec<TopicPartition> = decode_assignment(&response.assignment)?;
        self.protocol = Some(assignor);
        self.on_join_complete(new, assignor);
        Ok(())
    }

    fn mark_fenced(&self) {
        if let Ok(mut g) = self.group.lock() {
            g.fenced = true;
            g.member_id.clear();
            g.generation = -1;
        }
    }

    fn on_join_complete(&mut self, new: Vec<TopicPartition>, assignor: Assignor) {
        let new_set: BTreeSet<TopicPartition> = new.iter().cloned().collect();
        let old_set: BTreeSet<TopicPartition> = self.assignment.keys().cloned().collect();
        let revoked: Vec<TopicPartition> = old_set.difference(&new_set).cloned().collect();
        let added: Vec<TopicPartition> = new_set.difference(&old_set).cloned().collect();
        if !revoked.is_empty() {
            if let Some(l) = self.listener.as_mut() {
                l.on_partitions_revoked(&revoked);
            }
            for tp in &revoked {
                self.assignment.remove(tp);
            }
            let keep = &new_set;
            self.buffered
                .retain(|r| keep.contains(&TopicPartition::new(r.topic.clone(), r.partition)));
        }
        for tp in &added {
            self.assignment.entry(tp.clone()).or_default();
        }
        let rejoin = assignor.is_cooperative() && !revoked.is_empty();
        if let Ok(mut g) = self.group.lock() {
            // Cooperative: the partitions we gave up go to their new owner next round.
            g.rejoin_needed = rejoin;
        }
        tracing::info!(assigned = ?new, "joined group");
        if let Some(l) = self.listener.as_mut() {
            l.on_partitions_assigned(&added);
        }
    }

    fn start_heartbeat(&mut self) {
        if self.heartbeat.as_ref().is_some_and(|h| !h.is_finished()) {
            return;
        }
        let Some(group) = self.config.group_id.clone() else {
            return;
        };
        let net = self.net.clone();
        let shared = self.group.clone();
        let config = self.config.clone();
        self.heartbeat = Some(match config.group_protocol {
            GroupProtocol::Classic => tokio::spawn(heartbeat_loop(net, shared, group, config)),
            GroupProtocol::Consumer => tokio::spawn(crate::consumer_protocol::heartbeat_loop(
                net,
                shared,
                group,
                config,
                self.heartbeat_wake.clone(),
                self.group_changed.clone(),
            )),
        });
    }

    async fn leave_group(&mut self) {
        let Some(group) = self.config.group_id.clone() else {
            return;
        };
        if self.config.group_protocol == GroupProtocol::Consumer {
            if let Some(h) = self.heartbeat.take() {
                h.abort();
            }
            crate::consumer_protocol::leave(&self.net, &self.group, &group, &self.config).await;
            return;
        }
        let (member_id, coordinator) = match self.group.lock() {
            Ok(mut g) => {
                let m = std::mem::take(&mut g.member_id);
                g.generation = -1;
                g.rejoin_needed = true;
                (m, g.coordinator.clone())
            }
            Err(_) => return,
        };
        if let Some(h) = self.heartbeat.take() {
            h.abort();
        }
        // Static members stay in the group across restarts (KIP-345): no LeaveGroup.
        if member_id.is_empty() || self.config.group_instance_id.is_some() {
            return;
        }
        let Some(coordinator) = coordinator else {
            return;
        };
        let request = LeaveGroupRequest {
            group_id: group,
            member_id: member_id.clone(),
            members: vec![MemberIdentity {
                member_id,
                group_instance_id: None,
                reason: Some("the consumer is being closed".into()),
                ..Default::default()
            }],
            ..Default::default()
        };
        if let Ok(conn) = self.net.connection(&coordinator.addr()).await {
            if let Err(e) = conn.send(&request, LEAVE_GROUP_VERSION).await {
                tracing::debug!(error = %e, "LeaveGroup failed");
            }
        }
    }

    // ---- positions and commits ---------------------------------------------------------

    async fn update_positions(&mut self) -> Result<()> {
        let missing: Vec<TopicPartition> = self
            .assignment
            .iter()
            .filter(|(_, s)| s.position.is_none() && !s.reset_pending)
            .map(|(tp, _)| tp.clone())
            .collect();
        if !missing.is_empty() {
            if let Some(group) = self.config.group_id.clone() {
                let committed = ops::fetch_committed(&self.net, &group, Some(&missing)).await?;
                for (tp, offset) in committed {
                    if let Some(s) = self.assignment.get_mut(&tp) {
                        s.position = Some(offset);
                        s.fetch_offset = Some(offset);
                    }
                }
            }
        }
        let reset: Vec<TopicPartition> = self
            .assignment
            .iter()
            .filter(|(_, s)| s.position.is_none())
            .map(|(tp, _)| tp.clone())
            .collect();
        if reset.is_empty() {
            return Ok(());
        }
        let spec = match self.config.auto_offset_reset {
            AutoOffsetReset::Earliest => OffsetSpec::Earliest,
            AutoOffsetReset::Latest => OffsetSpec::Latest,
            AutoOffsetReset::None => {
                let tp = &reset[0];
                return Err(Error::NoOffsetForPartition {
                    topic: tp.topic.clone(),
                    partition: tp.partition,
                });
            }
        };
        let offsets = ops::list_offsets(&self.net, &reset, spec).await?;
        for (tp, offset) in offsets {
            if let Some(s) = self.assignment.get_mut(&tp) {
                s.position = Some(offset);
                s.fetch_offset = Some(offset);
                s.reset_pending = false;
            }
        }
        Ok(())
    }

    fn positions(&self) -> BTreeMap<TopicPartition, i64> {
        self.assignment
            .iter()
            .filter_map(|(tp, s)| s.position.map(|p| (tp.clone(), p)))
            .collect()
    }

    fn maybe_auto_commit(&mut self) {
        if !self.config.enable_auto_commit || self.config.group_id.is_none() {
            return;
        }
        if self.last_auto_commit.elapsed() < self.config.auto_commit_interval {
            return;
        }
        self.last_auto_commit = Instant::now();
        self.commit_async();
    }

    /// Commits the current positions in the background; failures are logged (the next
    /// commit carries newer offsets anyway).
    pub fn commit_async(&mut self) {
        let Some(group) = self.config.group_id.clone() else {
            return;
        };
        let offsets: BTreeMap<TopicPartition, i64> = self
            .positions()
            .into_iter()
            .filter(|(tp, o)| self.last_committed.get(tp) != Some(o))
            .collect();
        if offsets.is_empty() {
            return;
        }
        let (member, generation) = self.commit_identity();
        let net = self.net.clone();
        let instance = self.config.group_instance_id.clone();
        let shared = self.group.clone();
        self.last_committed.extend(offsets.clone());
        tokio::spawn(async move {
            if let Err(e) = ops::commit_offsets(
                &net,
                &group,
                generation,
                &member,
                instance.as_deref(),
                &offsets,
            )
            .await
            {
                tracing::warn!(error = %e, "async commit failed");
                if e.code().is_some_and(is_rejoin_error) {
                    if let Ok(mut g) = shared.lock() {
                        g.rejoin_needed = true;
                    }
                }
            }
        });
    }

    fn commit_identity(&self) -> (String, i32) {
        if self.group_managed() {
            self.group_metadata()
        } else {
            (String::new(), -1)
        }
    }

    async fn commit_positions(&mut self) -> Result<()> {
        let offsets = self.positions();
        self.commit_offsets(&offsets).await
    }

    /// Commits the current position of every assigned partition and waits for it.
    pub async fn commit_sync(&mut self) -> Result<()> {
        self.commit_positions().await
    }

    /// Commits the given offsets (the next offset to read, as Kafka stores them).
    pub async fn commit_offsets(&mut self, offsets: &BTreeMap<TopicPartition, i64>) -> Result<()> {
        let group = self.require_group()?;
        if offsets.is_empty() {
            return Ok(());
        }
        // A consumer-protocol member's epoch can move on while a commit is out; the
        // coordinator then answers STALE_MEMBER_EPOCH and the commit goes again with the
        // epoch the next heartbeat brought (Kafka's commitSync retries it the same way).
        let mut attempts = 0;
        let result = loop {
            let (member, generation) = self.commit_identity();
            let result = ops::commit_offsets(
                &self.net,
                &group,
                generation,
                &member,
                self.config.group_instance_id.as_deref(),
                offsets,
            )
            .await;
            attempts += 1;
            match &result {
                Err(e)
                    if e.code() == Some(ErrorCode::STALE_MEMBER_EPOCH)
                        && attempts < STALE_EPOCH_COMMIT_ATTEMPTS =>
                {
                    self.heartbeat_wake.notify_one();
                    tokio::time::sleep(self.config.client.retry_backoff).await;
                }
                _ => break result,
            }
        };
        match &result {
            Ok(()) => self.last_committed.extend(offsets.clone()),
            Err(e) if e.code().is_some_and(is_rejoin_error) => self.request_rejoin(),
            Err(_) => {}
        }
        result
    }

    /// Commits (with auto-commit on), leaves the group and stops the heartbeat task.
    pub async fn close(&mut self) -> Result<()> {
        let mut result = Ok(());
        // A fenced member's partitions belong to the member that took its id.
        let fenced = self.group.lock().map(|g| g.fenced).unwrap_or(false);
        if self.config.enable_auto_commit
            && self.config.group_id.is_some()
            && !self.assignment.is_empty()
            && !fenced
        {
            result = self.commit_positions().await;
        }
        if self.group_managed() {
            let owned = self.assignment();
            if !owned.is_empty() {
                if let Some(l) = self.listener.as_mut() {
                    l.on_partitions_revoked(&owned);
                }
            }
            self.leave_group().await;
        }
        if let Ok(mut g) = self.group.lock() {
            g.closed = true;
        }
        if let Some(h) = self.heartbeat.take() {
            h.abort();
        }
        self.assignment.clear();
        self.buffered.clear();
        self.in_flight.abort_all();
        self.in_flight_leaders.clear();
        self.net.close();
        result
    }

    // ---- fetching --------------------------------------------------------------------

    /// Sends a Fetch to each leader of fetchable partitions that has none in flight,
    /// then handles the answers: the first to come (within `max_wait`) and any others
    /// already there. Fetches still waiting on their broker stay in flight for the next
    /// call; their answers are checked against the partitions' state when they arrive
    /// (a seek, pause or revocation meanwhile drops them, see [`Self::handle_fetch`]).
    async fn fetch(&mut self, max_wait: Duration) -> Result<()> {
        self.send_fetches(max_wait).await?;
        if self.in_flight.is_empty() {
            tokio::time::sleep(max_wait.min(Duration::from_millis(100))).await;
            return Ok(());
        }
        // The fetches just sent answer within `max_wait` plus a round trip; one that is
        // slower stays in flight and is handled by a later call.
        let wait = max_wait + FETCH_ANSWER_SLACK;
        let first = match tokio::time::timeout(wait, self.in_flight.join_next()).await {
            Ok(Some(joined)) => joined,
            Ok(None) | Err(_) => return Ok(()),
        };
        self.handle_fetch_outcome(first)?;
        while let Some(joined) = self.in_flight.try_join_next() {
            self.handle_fetch_outcome(joined)?;
        }
        Ok(())
    }

    fn handle_fetch_outcome(
        &mut self,
        joined: std::result::Result<FetchOutcome, tokio::task::JoinError>,
    ) -> Result<()> {
        let Ok((leader, partitions, result)) = joined else {
            // A fetch task that panicked or was aborted: its leader is free again, but
            // which one is lost with it; start over with every leader.
            self.in_flight_leaders.clear();
            self.in_flight.abort_all();
            return Ok(());
        };
        self.in_flight_leaders.remove(&leader);
        match result {
            Ok(response) => self.handle_fetch(&partitions, response),
            Err(e) if e.is_retriable() => {
                tracing::debug!(error = %e, "fetch failed");
                self.net.invalidate_metadata();
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// The sending half of [`Self::fetch`].
    async fn send_fetches(&mut self, max_wait: Duration) -> Result<()> {
        let fetchable: Vec<(TopicPartition, i64)> = self
            .assignment
            .iter()
            .filter(|(_, s)| !s.paused)
            .filter_map(|(tp, s)| s.fetch_offset.map(|o| (tp.clone(), o)))
            .collect();
        if fetchable.is_empty() {
            return Ok(());
        }
        let mut topics: Vec<String> = fetchable.iter().map(|(tp, _)| tp.topic.clone()).collect();
        topics.sort();
        topics.dedup();
        let md = self.net.ensure_topics(&topics).await?;
        let mut by_leader: BTreeMap<i32, Vec<(TopicPartition, i64)>> = BTreeMap::new();
        let mut leaderless = false;
        for (tp, offset) in fetchable {
            let leader = md
                .topics
                .get(&tp.topic)
                .and_then(|t| t.partitions.iter().find(|p| p.partition == tp.partition))
                .map(|p| p.leader)
                .filter(|l| *l >= 0);
            match leader {
                // A leader with a Fetch in flight gets the next one after its answer.
                Some(l) if self.in_flight_leaders.contains(&l) => {}
                Some(l) => by_leader.entry(l).or_default().push((tp, offset)),
                None => leaderless = true,
            }
        }
        if leaderless {
            self.net.invalidate_metadata();
        }
        if by_leader.is_empty() && self.in_flight.is_empty() {
            tokio::time::sleep(self.config.client.retry_backoff.min(max_wait)).await;
            return Ok(());
        }
        for (leader, partitions) in by_leader {
            let request = self.fetch_request(&partitions, max_wait);
            let net = self.net.clone();
            let timeout = max_wait + self.config.client.request_timeout;
            self.in_flight_leaders.insert(leader);
            self.in_flight.spawn(async move {
                let result = async {
                    let conn = net.node_connection(leader).await?;
                    conn.send_with_timeout(&request, FETCH_VERSION, timeout)
                        .await
                }
                .await;
                (leader, partitions, result)
            });
        }
        Ok(())
    }

    fn fetch_request(
        &self,
        partitions: &[(TopicPartition, i64)],
        max_wait: Duration,
    ) -> FetchRequest {
        let mut by_topic: BTreeMap<&str, Vec<FetchPartition>> = BTreeMap::new();
        for (tp, offset) in partitions {
            by_topic.entry(&tp.topic).or_default().push(FetchPartition {
                partition: tp.partition,
                current_leader_epoch: -1,
                fetch_offset: *offset,
                last_fetched_epoch: -1,
                log_start_offset: -1,
                partition_max_bytes: self.config.max_partition_fetch_bytes,
                ..Default::default()
            });
        }
        FetchRequest {
            replica_id: -1,
            max_wait_ms: ms(max_wait),
            min_bytes: self.config.fetch_min_bytes,
            max_bytes: self.config.fetch_max_bytes,
            isolation_level: i8::from(self.config.read_committed),
            session_id: 0,
            session_epoch: -1,
            topics: by_topic
                .into_iter()
                .map(|(topic, partitions)| FetchTopic {
                    topic: topic.to_string(),
                    partitions,
                    ..Default::default()
                })
                .collect(),
            rack_id: String::new(),
            ..Default::default()
        }
    }

    fn handle_fetch(
        &mut self,
        sent: &[(TopicPartition, i64)],
        response: FetchResponse,
    ) -> Result<()> {
        let code = ErrorCode::from_code(response.error_code);
        if !code.is_ok() {
            tracing::debug!(%code, "fetch failed");
            self.net.invalidate_metadata();
            return Ok(());
        }
        let sent: HashMap<&TopicPartition, i64> = sent.iter().map(|(tp, o)| (tp, *o)).collect();
        let max_bytes = usize::try_from(self.config.fetch_max_bytes)
            .unwrap_or(usize::MAX)
            .max(1 << 20)
            * 4;
        for topic in response.responses {
            for p in topic.partitions {
                let tp = TopicPartition::new(topic.topic.clone(), p.partition_index);
                let Some(&fetched_at) = sent.get(&tp) else {
                    continue;
                };
                let Some(state) = self.assignment.get_mut(&tp) else {
                    continue;
                };
                // A seek (or revoke and re-assign) since the request: drop the answer.
                if state.fetch_offset != Some(fetched_at) || state.paused {
                    continue;
                }
                let code = ErrorCode::from_code(p.error_code);
                match code {
                    c if c.is_ok() => {}
                    ErrorCode::OFFSET_OUT_OF_RANGE => {
                        if self.config.auto_offset_reset == AutoOffsetReset::None {
                            return Err(Error::OffsetOutOfRange {
                                topic: tp.topic.clone(),
                                partition: tp.partition,
                                offset: fetched_at,
                            });
                        }
                        tracing::info!(partition = %tp, offset = fetched_at, "offset out of range, resetting");
                        state.position = None;
                        state.fetch_offset = None;
                        state.reset_pending = true;
                        continue;
                    }
                    c if c.is_retriable() => {
                        self.net.invalidate_metadata();
                        continue;
                    }
                    c => return Err(Error::kafka(c, format!("fetching {tp}"))),
                }
                state.high_watermark = p.high_watermark;
                // Listed only for read_committed (a read_uncommitted answer has none).
                let mut aborted = AbortedTransactions::new(
                    p.aborted_transactions
                        .as_deref()
                        .filter(|_| self.config.read_committed),
                );
                let Some(records) = p.records else { continue };
                let mut next = fetched_at;
                for batch in RecordBatch::iter(records) {
                    // A trailing partial batch is normal: the broker cuts at max bytes.
                    let Ok(batch) = batch else { break };
                    if batch.next_offset() <= next {
                        continue;
                    }
                    if aborted.deliver(&batch) {
                        for record in batch.records(max_bytes)? {
                            if record.offset < next {
                                continue;
                            }
                            self.buffered.push_back(ConsumerRecord {
                                topic: tp.topic.clone(),
                                partition: tp.partition,
                                offset: record.offset,
                                timestamp: record.timestamp,
                                key: record.key,
                                value: record.value,
                                headers: record.headers,
                            });
                        }
                    }
                    next = batch.next_offset();
                }
                state.fetch_offset = Some(next);
                // Nothing buffered for this partition means position can move too (a
                // control batch or compacted gap was skipped).
            }
        }
        Ok(())
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        if let Some(h) = self.heartbeat.take() {
            h.abort();
        }
    }
}

fn ms(d: Duration) -> i32 {
    i32::try_from(d.as_millis()).unwrap_or(i32::MAX)
}

fn is_rejoin_error(code: ErrorCode) -> bool {
    matches!(
        code,
        ErrorCode::UNKNOWN_MEMBER_ID
            | ErrorCode::REBALANCE_IN_PROGRESS
            | ErrorCode::ILLEGAL_GENERATION
            | ErrorCode::MEMBER_ID_REQUIRED
    )
}

/// Names of the topics with these ids, from metadata (refreshed once when an id is
/// unknown, as a topic created a moment ago may be).
async fn topic_names<'a>(
    net: &NetworkClient,
    ids: impl Iterator<Item = &'a Uuid> + Clone,
) -> Result<BTreeMap<Uuid, String>> {
    let lookup = |md: &crate::network::ClusterMetadata| -> BTreeMap<Uuid, String> {
        md.topics
            .values()
            .map(|t| (t.topic_id, t.name.clone()))
            .collect()
    };
    let mut known = lookup(&net.metadata());
    if ids.clone().any(|id| !known.contains_key(id)) {
        net.refresh_metadata(None).await?;
        known = lookup(&net.metadata());
    }
    Ok(ids
        .filter_map(|id| known.get(id).map(|n| (*id, n.clone())))
        .collect())
}

fn is_coordinator_error(code: ErrorCode) -> bool {
    matches!(
        code,
        ErrorCode::NOT_COORDINATOR
            | ErrorCode::COORDINATOR_NOT_AVAILABLE
            | ErrorCode::COORDINATOR_LOAD_IN_PROGRESS
    )
}

/// Sends Heartbeat every `heartbeat.interval.ms` while the member is in a generation and
/// not joining, and turns the answers into flags `poll` acts on. Also leaves the group
/// when `poll` has not been called within `max.poll.interval.ms`, as Kafka does, so that
/// a stuck application does not hold partitions.
async fn heartbeat_loop(
    net: Arc<NetworkClient>,
    shared: Shared,
    group: String,
    config: ConsumerConfig,
) {
    loop {
        tokio::time::sleep(config.heartbeat_interval).await;
        let (member_id, generation, coordinator, skip, stale_poll) = {
            let Ok(g) = shared.lock() else { return };
            if g.closed {
                return;
            }
            (
                g.member_id.clone(),
                g.generation,
                g.coordinator.clone(),
                g.joining || g.generation < 0 || g.member_id.is_empty(),
                g.last_poll.elapsed() > config.max_poll_interval,
            )
        };
        if skip {
            continue;
        }
        let Some(coordinator) = coordinator else {
            continue;
        };
        if stale_poll {
            tracing::warn!(
                group,
                "poll not called within max.poll.interval.ms; leaving the group"
            );
            let request = LeaveGroupRequest {
                group_id: group.clone(),
                member_id: member_id.clone(),
                members: vec![MemberIdentity {
                    member_id: member_id.clone(),
                    group_instance_id: config.group_instance_id.clone(),
                    reason: Some("max.poll.interval.ms expired".into()),
                    ..Default::default()
                }],
                ..Default::default()
            };
            if let Ok(conn) = net.connection(&coordinator.addr()).await {
                let _ = conn.send(&request, LEAVE_GROUP_VERSION).await;
            }
            if let Ok(mut g) = shared.lock() {
                g.member_id.clear();
                g.generation = -1;
                g.rejoin_needed = true;
                g.lost = true;
            }
            continue;
        }
        let request = HeartbeatRequest {
            group_id: group.clone(),
            generation_id: generation,
            member_id,
            group_instance_id: config.group_instance_id.clone(),
            ..Default::default()
        };
        let result = async {
            let conn = net.connection(&coordinator.addr()).await?;
            conn.send(&request, HEARTBEAT_VERSION).await
        }
        .await;
        let Ok(mut g) = shared.lock() else { return };
        // The member rejoined while the heartbeat was out: its answer is about an old
        // generation, or an old member id. A static member that rejoins a stable group
        // gets a new member id in the same generation (KIP-345), and the answer to a
        // heartbeat sent under the id it replaced is FENCED_INSTANCE_ID, which must not
        // fence the member that replaced it: itself.
        if g.generation != generation || g.joining || g.member_id != request.member_id {
            continue;
        }
        match result {
            Ok(r) => match ErrorCode::from_code(r.error_code) {
                c if c.is_ok() => {}
                ErrorCode::REBALANCE_IN_PROGRESS | ErrorCode::ILLEGAL_GENERATION => {
                    g.rejoin_needed = true
                }
                ErrorCode::FENCED_INSTANCE_ID => {
                    // Not a rejoin: that would fence the member that took our id.
                    g.fenced = true;
                    g.member_id.clear();
                    g.generation = -1;
                    return;
                }
                ErrorCode::UNKNOWN_MEMBER_ID => {
                    g.member_id.clear();
                    g.generation = -1;
                    g.rejoin_needed = true;
                    g.lost = true;
                }
                c if is_coordinator_error(c) => g.coordinator = None,
                c => tracing::warn!(group, code = %c, "heartbeat failed"),
            },
            Err(e) => {
                tracing::debug!(group, error = %e, "heartbeat failed; rediscovering the coordinator");
                g.coordinator = None;
            }
        }
    }
}
