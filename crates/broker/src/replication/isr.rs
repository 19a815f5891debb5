//! The partition leader's in-sync replica set (ISR) and high watermark, as a pure state
//! machine: Kafka's `kafka.cluster.Partition` (leader side) and `kafka.cluster.Replica`,
//! without the log, the locks, the purgatory or the AlterPartition channel.
//!
//! [`LeaderState`] does no I/O, reads no clock (every method that needs the time takes
//! `now_ms`), spawns nothing and is deterministic. The replica manager owns one per
//! partition it leads, feeds it follower fetches, local appends, AlterPartition responses
//! and metadata, and acts on what it returns: a new high watermark (complete the delayed
//! produces and fetches waiting on it) or an [`AlterPartitionProposal`] (send it to the
//! controller).
//!
//! # Protocol
//!
//! 1. **Become leader.** From the partition's registration (replicas, ISR, leader epoch,
//!    partition epoch) and the local log's offsets, [`LeaderState::become_leader`] records
//!    the leader epoch start offset (the local log end offset, KIP-101/KAFKA-7128) and gives
//!    every follower an unknown log end offset (-1). Followers in the ISR get
//!    `last_caught_up_time = now`, so that they are not shrunk before they had a chance to
//!    fetch; the others get "never".
//! 2. **Follower fetch.** A Fetch from replica `r` at offset `o` means `r`'s log ends at `o`.
//!    [`LeaderState::update_follower_fetch`] refuses a replica that is not assigned and a
//!    fetch carrying a broker epoch older than the one registered (a zombie incarnation of
//!    the follower). Otherwise `r` was caught up at the fetch time when `o` reaches the
//!    leader's current log end offset, or at its previous fetch time when `o` reaches the
//!    leader's log end offset as it was at that previous fetch (KAFKA-4485: under a steady
//!    trickle of produce a follower never fetches exactly at the leader's end, yet it is
//!    never more than one fetch behind).
//! 3. **Expand.** When no ISR change is in flight, `r` is not in the ISR, is ISR-eligible
//!    (unfenced, not in controlled shutdown, fetching with its registered broker epoch —
//!    KIP-841), and its log end offset is at least the high watermark *and* at least the
//!    start offset of the current leader epoch, the leader proposes `ISR ∪ {r}` and marks
//!    the change pending (Kafka's `PendingExpandIsr`).
//! 4. **High watermark.** After a follower's log end offset moved, a local append, an ISR
//!    change, or a new leadership: the candidate is the leader's log end offset, lowered to
//!    the log end offset of every follower that is in the *maximal* ISR, or that is caught
//!    up (within `replica.lag.time.max.ms`) and ISR-eligible although not yet in the ISR
//!    (KAFKA-15021: wait for a replica about to join rather than run away from it). The
//!    high watermark moves to the candidate only when that is higher.
//! 5. **Shrink.** [`LeaderState::maybe_shrink_isr`], called periodically: with no change in
//!    flight, every ISR follower (never the leader) that has not been caught up for more
//!    than `replica.lag.time.max.ms` and is not at the leader's log end offset is out of
//!    sync; the leader proposes the ISR without them (Kafka's `PendingShrinkIsr`).
//! 6. **AlterPartition answer.** Success for the proposal in flight, in the current leader
//!    epoch and at a partition epoch not older than ours, commits the returned ISR and
//!    partition epoch and re-runs step 4. `OPERATION_NOT_ATTEMPTED` and `INELIGIBLE_REPLICA`
//!    (the controller says the request was not applied) go back to the last committed
//!    state. The errors that mean "your view is stale" (`FENCED_LEADER_EPOCH`,
//!    `INVALID_UPDATE_VERSION`, `UNKNOWN_TOPIC_OR_PARTITION`, `UNKNOWN_TOPIC_ID`,
//!    `INVALID_REQUEST`, `NEW_LEADER_ELECTED`) leave the change pending, so that nothing
//!    more is proposed on a stale partition epoch, until metadata decides. Any other error
//!    is transient: send the same proposal again.
//! 7. **Metadata.** A registration at an older partition epoch than ours is ignored; a
//!    newer one replaces replicas and the committed ISR and drops a pending change (the
//!    controller has decided, whichever way); a newer leader epoch also starts a new leader
//!    epoch as in step 1 (follower log end offsets are kept). A registration that names
//!    another leader is refused: the replica manager must make this replica a follower.
//!
//! # Why it is correct
//!
//! *The high watermark never passes an ISR member's log end offset* (DESIGN invariant 3):
//! the candidate in step 4 is a minimum that includes every member of the maximal ISR,
//! which contains the committed ISR; a member whose log end offset is unknown (-1) holds
//! the candidate below any high watermark, so nothing moves until it has fetched. Members
//! join only from step 3, with a log end offset at least the high watermark, and follower
//! log end offsets only grow while the leader is leader (a follower truncates only when the
//! leader epoch changes). The leader is always in the ISR: shrinks never remove it and a
//! registration or commit without it is refused.
//!
//! *Why the maximal ISR while a change is in flight* (KIP-497): the controller may commit
//! the change at any moment, and the leader learns of it only later. For an expansion the
//! leader must act as if the new member were already in, otherwise it could advance the
//! high watermark past the new member's log end offset while the controller already counts
//! that member as in sync, and a later election of that member would lose committed
//! records. Counting it early only makes the minimum stricter, so a failed expansion costs
//! nothing. For a shrink the reverse holds: the leader must keep counting the members it
//! proposed to remove until the controller confirms, because if the shrink fails they are
//! still in the ISR and may be elected. Hence maximal ISR = committed ∪ proposed. Only one
//! change is in flight at a time so that each proposal is based on a committed state and
//! its partition epoch, which the controller checks (compare-and-set).
//!
//! *Why the current-epoch start offset for expansion* (KAFKA-7128): a follower at the high
//! watermark but below the start of the current leader epoch may still hold a divergent
//! suffix from an older epoch, and the records between the high watermark and the epoch
//! start may be committed by the new leader; admitting it could let it become leader
//! without them.
//!
//! The high watermark never decreases: step 4 only ever moves it up.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use rill_protocol::ErrorCode;

/// Kafka's `UnifiedLog.UnknownOffset`: a follower's log end offset before its first fetch
/// in this leadership.
pub const UNKNOWN_OFFSET: i64 = -1;

/// The broker epoch a Fetch or an AlterPartition ISR entry carries when it does not know
/// one (older request versions): accepted without the KIP-841 check.
pub const NO_BROKER_EPOCH: i64 = -1;

/// Refusals of [`LeaderState`]'s inputs; [`IsrError::error_code`] gives the wire error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IsrError {
    #[error("broker {local_broker_id} is not the leader (registration names {leader})")]
    NotLeader { local_broker_id: i32, leader: i32 },
    #[error(
        "replica {replica_id} is not a follower of this partition in leader epoch {leader_epoch}"
    )]
    UnknownReplica { replica_id: i32, leader_epoch: i32 },
    #[error("stale fetch from replica {replica_id}: broker epoch {fetch_broker_epoch}, registered {registered_broker_epoch}")]
    StaleBrokerEpoch {
        replica_id: i32,
        fetch_broker_epoch: i64,
        registered_broker_epoch: i64,
    },
    #[error("fetch offset {fetch_offset} outside the leader's log [{log_start_offset}, {log_end_offset}]")]
    FetchOffsetOutOfRange {
        fetch_offset: i64,
        log_start_offset: i64,
        log_end_offset: i64,
    },
    #[error("leader log end offset would move back from {current} to {proposed}")]
    LogEndOffsetBackwards { current: i64, proposed: i64 },
    #[error("invalid registration: {0}")]
    InvalidRegistration(&'static str),
}

impl IsrError {
    /// The Kafka error a Fetch or the replica manager answers with.
    ///
    /// An unknown replica is `UNKNOWN_LEADER_EPOCH`, as Kafka's
    /// `Partition.followerReplicaOrThrow` answers a Fetch that carries a current leader epoch
    /// (every version Rill followers send): the pair (replica, epoch) is not known *yet*, for
    /// example while a reassignment adds the replica, so the follower retries. A caller
    /// serving a Fetch without a leader epoch (v8 and older) should answer
    /// `NOT_LEADER_OR_FOLLOWER` instead, as Kafka does. A stale broker epoch is
    /// `NOT_LEADER_OR_FOLLOWER` (Kafka's `Replica.updateFetchStateOrThrow`).
    pub fn error_code(&self) -> ErrorCode {
        match self {
            IsrError::NotLeader { .. } | IsrError::StaleBrokerEpoch { .. } => {
                ErrorCode::NOT_LEADER_OR_FOLLOWER
            }
            IsrError::UnknownReplica { .. } => ErrorCode::UNKNOWN_LEADER_EPOCH,
            IsrError::FetchOffsetOutOfRange { .. } => ErrorCode::OFFSET_OUT_OF_RANGE,
            IsrError::LogEndOffsetBackwards { .. } | IsrError::InvalidRegistration(_) => {
                ErrorCode::UNKNOWN_SERVER_ERROR
            }
        }
    }
}

/// `acks=all` refused before the append: the committed ISR is smaller than
/// `min.insync.replicas` (Kafka's `Partition.appendRecordsToLeader`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the ISR has {isr_size} members, below min.insync.replicas {min_insync_replicas}")]
pub struct NotEnoughReplicas {
    pub isr_size: usize,
    pub min_insync_replicas: usize,
}

impl NotEnoughReplicas {
    pub fn error_code(&self) -> ErrorCode {
        ErrorCode::NOT_ENOUGH_REPLICAS
    }
}

/// The fields of a partition's metadata registration the leader needs (a subset of
/// `rill_metadata::PartitionRegistration`, copied by the replica manager, which owns the
/// dependency on the metadata image).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionRegistration {
    pub replicas: Vec<i32>,
    pub isr: Vec<i32>,
    pub leader: i32,
    pub leader_epoch: i32,
    pub partition_epoch: i32,
}

/// The local log's offsets when this broker becomes leader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogOffsets {
    pub log_start_offset: i64,
    pub log_end_offset: i64,
    /// From the high watermark checkpoint; clamped to the log end offset.
    pub high_watermark: i64,
}

/// Settings fixed for the life of one leadership.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaderConfig {
    pub local_broker_id: i32,
    /// This broker's own epoch, sent for itself in AlterPartition ISR entries.
    pub local_broker_epoch: i64,
    /// `replica.lag.time.max.ms`, for the caught-up rule of the high watermark (step 4).
    pub replica_lag_time_max_ms: i64,
}

/// Another broker as the metadata image sees it (Kafka's `BrokerRegistration`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BrokerStatus {
    pub broker_epoch: i64,
    pub fenced: bool,
    pub in_controlled_shutdown: bool,
}

/// The leader's view of the other brokers, from the metadata image, for the KIP-841 rules.
/// `None`: the broker is not registered.
pub trait BrokerLiveness {
    fn broker_status(&self, broker_id: i32) -> Option<BrokerStatus>;
}

impl BrokerLiveness for HashMap<i32, BrokerStatus> {
    fn broker_status(&self, broker_id: i32) -> Option<BrokerStatus> {
        self.get(&broker_id).copied()
    }
}

impl BrokerLiveness for BTreeMap<i32, BrokerStatus> {
    fn broker_status(&self, broker_id: i32) -> Option<BrokerStatus> {
        self.get(&broker_id).copied()
    }
}

impl<F: Fn(i32) -> Option<BrokerStatus>> BrokerLiveness for F {
    fn broker_status(&self, broker_id: i32) -> Option<BrokerStatus> {
        self(broker_id)
    }
}

/// The leader's record of one follower (Kafka's `ReplicaState`).
///
/// Times that Kafka sets to 0 for "never" are `None` here, so that a clock that starts
/// near zero (a simulation's) does not count "never" as recent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FollowerState {
    pub log_start_offset: i64,
    /// The offset of its last fetch; [`UNKNOWN_OFFSET`] before the first in this leadership.
    pub log_end_offset: i64,
    /// The leader's log end offset at the follower's previous fetch (the highest seen).
    pub last_fetch_leader_log_end_offset: i64,
    pub last_fetch_time_ms: Option<i64>,
    /// The last time `t` at which the follower had everything the leader had at `t`.
    pub last_caught_up_time_ms: Option<i64>,
    /// The broker epoch its last fetch carried.
    pub broker_epoch: Option<i64>,
}

impl FollowerState {
    fn empty() -> Self {
        Self {
            log_start_offset: UNKNOWN_OFFSET,
            log_end_offset: UNKNOWN_OFFSET,
            last_fetch_leader_log_end_offset: UNKNOWN_OFFSET,
            last_fetch_time_ms: None,
            last_caught_up_time_ms: None,
            broker_epoch: None,
        }
    }

    /// Kafka's `ReplicaState.isCaughtUp`: at the leader's end now, or caught up recently.
    pub fn is_caught_up(
        &self,
        leader_log_end_offset: i64,
        now_ms: i64,
        replica_lag_time_max_ms: i64,
    ) -> bool {
        leader_log_end_offset == self.log_end_offset
            || self
                .last_caught_up_time_ms
                .is_some_and(|t| now_ms.saturating_sub(t) <= replica_lag_time_max_ms)
    }
}

/// The ISR entry of an AlterPartition request: a broker and the epoch it was seen at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct IsrMember {
    pub broker_id: i32,
    /// [`NO_BROKER_EPOCH`] when the leader has not seen the follower fetch in this leadership.
    pub broker_epoch: i64,
}

/// What to send the controller in one AlterPartition partition entry (Kafka's
/// `sentLeaderAndIsr`). The replica manager hands the same value back to
/// [`LeaderState::on_alter_partition_response`] with the answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AlterPartitionProposal {
    pub leader_id: i32,
    pub leader_epoch: i32,
    /// The partition epoch the proposal is based on; the controller refuses it when stale.
    pub partition_epoch: i32,
    /// Sorted by broker id.
    pub new_isr: Vec<IsrMember>,
}

impl AlterPartitionProposal {
    /// The proposed ISR's broker ids.
    pub fn isr(&self) -> Vec<i32> {
        self.new_isr.iter().map(|m| m.broker_id).collect()
    }
}

/// Which way the change in flight goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PendingIsrChangeKind {
    /// Kafka's `PendingExpandIsr`.
    Expand { new_in_sync_replica: i32 },
    /// Kafka's `PendingShrinkIsr`.
    Shrink { out_of_sync_replicas: Vec<i32> },
}

/// An AlterPartition sent and not yet answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingIsrChange {
    pub kind: PendingIsrChangeKind,
    pub proposal: AlterPartitionProposal,
}

/// A successful AlterPartition answer for one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderAndIsr {
    pub leader_epoch: i32,
    pub partition_epoch: i32,
    pub isr: Vec<i32>,
}

/// What a follower fetch changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FollowerFetchOutcome {
    /// The new high watermark, when it moved.
    pub high_watermark: Option<i64>,
    /// An ISR expansion to send to the controller.
    pub alter_partition: Option<AlterPartitionProposal>,
}

/// What an AlterPartition answer did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AlterPartitionOutcome {
    /// Not the answer to the change in flight (metadata moved on first): ignored.
    Stale,
    /// The change is committed; `high_watermark` is the new one when it moved.
    Committed { high_watermark: Option<i64> },
    /// The controller did not apply it: back to the last committed ISR.
    Reverted,
    /// Our view is stale: the change stays pending until a metadata update decides.
    AwaitMetadata,
    /// A transient error: send this proposal again.
    Retry(AlterPartitionProposal),
}

/// What a metadata update did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetadataOutcome {
    /// Older than (or the same as) what the leader has: nothing changed.
    Ignored,
    /// Applied; `high_watermark` is the new one when it moved.
    Applied { high_watermark: Option<i64> },
}

/// How far an `acks=all` produce waiting for `required_offset` is (Kafka's
/// `Partition.checkEnoughReplicasReachOffset`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcksAllProgress {
    /// The high watermark is below the offset: keep waiting.
    Waiting,
    /// Committed on the whole (maximal) ISR, which has at least `min.insync.replicas`.
    Done,
    /// Committed, but the ISR shrank below `min.insync.replicas` meanwhile:
    /// `NOT_ENOUGH_REPLICAS_AFTER_APPEND`.
    NotEnoughReplicasAfterAppend,
}

/// One partition as its leader sees it.
#[derive(Debug, Clone)]
pub struct LeaderState {
    config: LeaderConfig,
    leader_epoch: i32,
    partition_epoch: i32,
    /// The local log end offset when this leader epoch began.
    leader_epoch_start_offset: i64,
    replicas: Vec<i32>,
    /// As last committed by the controller.
    isr: BTreeSet<i32>,
    pending: Option<PendingIsrChange>,
    log_start_offset: i64,
    log_end_offset: i64,
    high_watermark: i64,
    /// Every assigned replica but the leader.
    followers: BTreeMap<i32, FollowerState>,
}

impl LeaderState {
    /// Step 1: this broker becomes leader of the partition. The high watermark may already
    /// move here (an ISR of the leader alone); compare [`LeaderState::high_watermark`] with
    /// `log.high_watermark`.
    pub fn become_leader(
        config: LeaderConfig,
        registration: &PartitionRegistration,
        log: LogOffsets,
        brokers: &impl BrokerLiveness,
        now_ms: i64,
    ) -> Result<Self, IsrError> {
        validate(config.local_broker_id, registration)?;
        if log.log_end_offset < log.log_start_offset || log.log_start_offset < 0 {
            return Err(IsrError::InvalidRegistration(
                "log end offset below log start offset",
            ));
        }
        let mut state = Self {
            config,
            leader_epoch: registration.leader_epoch,
            partition_epoch: registration.partition_epoch,
            leader_epoch_start_offset: log.log_end_offset,
            replicas: registration.replicas.clone(),
            isr: registration.isr.iter().copied().collect(),
            pending: None,
            log_start_offset: log.log_start_offset,
            log_end_offset: log.log_end_offset,
            high_watermark: log.high_watermark.clamp(0, log.log_end_offset),
            followers: BTreeMap::new(),
        };
        for &id in &registration.replicas {
            if id != config.local_broker_id {
                let mut f = FollowerState::empty();
                // In the ISR: caught up as of now, so that it is not shrunk before it had a
                // chance to fetch from the new leader.
                if state.isr.contains(&id) {
                    f.last_caught_up_time_ms = Some(now_ms);
                }
                state.followers.insert(id, f);
            }
        }
        state.maybe_increment_high_watermark(brokers, now_ms);
        Ok(state)
    }

    pub fn local_broker_id(&self) -> i32 {
        self.config.local_broker_id
    }
    pub fn leader_epoch(&self) -> i32 {
        self.leader_epoch
    }
    pub fn partition_epoch(&self) -> i32 {
        self.partition_epoch
    }
    pub fn leader_epoch_start_offset(&self) -> i64 {
        self.leader_epoch_start_offset
    }
    pub fn replicas(&self) -> &[i32] {
        &self.replicas
    }
    /// The committed ISR.
    pub fn isr(&self) -> &BTreeSet<i32> {
        &self.isr
    }
    /// The committed ISR plus a member being added (Kafka's `maximalIsr`).
    pub fn maximal_isr(&self) -> BTreeSet<i32> {
        let mut isr = self.isr.clone();
        if let Some(PendingIsrChange {
            kind: PendingIsrChangeKind::Expand {
                new_in_sync_replica,
            },
            ..
        }) = &self.pending
        {
            isr.insert(*new_in_sync_replica);
        }
        isr
    }
    pub fn pending(&self) -> Option<&PendingIsrChange> {
        self.pending.as_ref()
    }
    pub fn follower(&self, replica_id: i32) -> Option<&FollowerState> {
        self.followers.get(&replica_id)
    }
    pub fn log_start_offset(&self) -> i64 {
        self.log_start_offset
    }
    pub fn log_end_offset(&self) -> i64 {
        self.log_end_offset
    }
    pub fn high_watermark(&self) -> i64 {
        self.high_watermark
    }

    /// The size of the committed ISR: what `min.insync.replicas` is checked against before
    /// an `acks=all` append.
    pub fn isr_size(&self) -> usize {
        self.isr.len()
    }

    /// Before an `acks=all` append: the committed ISR must have `min.insync.replicas`.
    pub fn check_enough_replicas(
        &self,
        min_insync_replicas: usize,
    ) -> Result<(), NotEnoughReplicas> {
        if self.isr.len() < min_insync_replicas {
            return Err(NotEnoughReplicas {
                isr_size: self.isr.len(),
                min_insync_replicas,
            });
        }
        Ok(())
    }

    /// A record below `required_offset` (exclusive: pass the last offset + 1) is on every
    /// ISR member: the high watermark has reached it.
    pub fn is_committed(&self, required_offset: i64) -> bool {
        self.high_watermark >= required_offset
    }

    /// For the `acks=all` purgatory: done once committed, with Kafka's after-append check
    /// of `min.insync.replicas` against the maximal ISR.
    pub fn check_enough_replicas_reach_offset(
        &self,
        required_offset: i64,
        min_insync_replicas: usize,
    ) -> AcksAllProgress {
        if !self.is_committed(required_offset) {
            AcksAllProgress::Waiting
        } else if self.maximal_isr().len() >= min_insync_replicas {
            AcksAllProgress::Done
        } else {
            AcksAllProgress::NotEnoughReplicasAfterAppend
        }
    }

    /// Steps 2 to 4: a Fetch from follower `replica_id` at `fetch_offset`, read by the
    /// replica manager (which answered any diverging epoch itself, without calling this).
    pub fn update_follower_fetch(
        &mut self,
        replica_id: i32,
        fetch_offset: i64,
        follower_log_start_offset: i64,
        now_ms: i64,
        broker_epoch: i64,
        brokers: &impl BrokerLiveness,
    ) -> Result<FollowerFetchOutcome, IsrError> {
        let leader_end = self.log_end_offset;
        let Some(follower) = self.followers.get(&replica_id).copied() else {
            return Err(IsrError::UnknownReplica {
                replica_id,
                leader_epoch: self.leader_epoch,
            });
        };
        if fetch_offset < self.log_start_offset || fetch_offset > leader_end {
            return Err(IsrError::FetchOffsetOutOfRange {
                fetch_offset,
                log_start_offset: self.log_start_offset,
                log_end_offset: leader_end,
            });
        }
        // A fetch from an older incarnation of the follower's broker (KIP-841) must not
        // move its state: the new incarnation may have lost what the old one had.
        if let Some(registered) = alive_broker_epoch(brokers, replica_id) {
            if broker_epoch != NO_BROKER_EPOCH && registered > broker_epoch {
                return Err(IsrError::StaleBrokerEpoch {
                    replica_id,
                    fetch_broker_epoch: broker_epoch,
                    registered_broker_epoch: registered,
                });
            }
        }
        let last_caught_up_time_ms = if fetch_offset >= leader_end {
            follower.last_caught_up_time_ms.max(Some(now_ms))
        } else if fetch_offset >= follower.last_fetch_leader_log_end_offset {
            follower
                .last_caught_up_time_ms
                .max(follower.last_fetch_time_ms)
        } else {
            follower.last_caught_up_time_ms
        };
        let updated = FollowerState {
            log_start_offset: follower_log_start_offset,
            log_end_offset: fetch_offset,
            last_fetch_leader_log_end_offset: leader_end
                .max(follower.last_fetch_leader_log_end_offset),
            last_fetch_time_ms: Some(now_ms),
            last_caught_up_time_ms,
            broker_epoch: Some(broker_epoch),
        };
        self.followers.insert(replica_id, updated);

        let alter_partition = self.maybe_expand_isr(replica_id, brokers);
        // As Kafka: the high watermark is re-evaluated only when this follower's log end
        // offset moved (or the ISR grew, which can only hold it back).
        let high_watermark = if updated.log_end_offset != follower.log_end_offset {
            self.maybe_increment_high_watermark(brokers, now_ms)
        } else {
            None
        };
        Ok(FollowerFetchOutcome {
            high_watermark,
            alter_partition,
        })
    }

    /// After a local append: the leader's new log end offset. Returns the new high
    /// watermark when it moved (at once when the ISR is the leader alone).
    pub fn update_leader_log_end(
        &mut self,
        log_end_offset: i64,
        now_ms: i64,
        brokers: &impl BrokerLiveness,
    ) -> Result<Option<i64>, IsrError> {
        // A leader never truncates its own log; going back would break HW <= LEO.
        if log_end_offset < self.log_end_offset {
            return Err(IsrError::LogEndOffsetBackwards {
                current: self.log_end_offset,
                proposed: log_end_offset,
            });
        }
        self.log_end_offset = log_end_offset;
        Ok(self.maybe_increment_high_watermark(brokers, now_ms))
    }

    /// The local log start offset moved (retention, DeleteRecords). It never passes the
    /// high watermark in Kafka; it is clamped to it here.
    pub fn update_log_start_offset(&mut self, log_start_offset: i64) {
        self.log_start_offset = log_start_offset
            .min(self.high_watermark)
            .max(self.log_start_offset);
    }

    /// Step 5: the proposal that removes out-of-sync followers, if any and if no change is
    /// in flight. `replica_lag_time_max_ms` is `replica.lag.time.max.ms`.
    pub fn maybe_shrink_isr(
        &mut self,
        now_ms: i64,
        replica_lag_time_max_ms: i64,
    ) -> Option<AlterPartitionProposal> {
        if self.pending.is_some() {
            return None;
        }
        let out_of_sync = self.out_of_sync_replicas(now_ms, replica_lag_time_max_ms);
        if out_of_sync.is_empty() {
            return None;
        }
        let new_isr: BTreeSet<i32> = self
            .isr
            .iter()
            .copied()
            .filter(|id| !out_of_sync.contains(id))
            .collect();
        let proposal = self.proposal(&new_isr);
        self.pending = Some(PendingIsrChange {
            kind: PendingIsrChangeKind::Shrink {
                out_of_sync_replicas: out_of_sync,
            },
            proposal: proposal.clone(),
        });
        Some(proposal)
    }

    /// ISR members (never the leader) out of sync at `now_ms`; empty while a change is in
    /// flight (Kafka's `getOutOfSyncReplicas`).
    pub fn out_of_sync_replicas(&self, now_ms: i64, replica_lag_time_max_ms: i64) -> Vec<i32> {
        if self.pending.is_some() {
            return Vec::new();
        }
        self.isr
            .iter()
            .copied()
            .filter(|&id| id != self.config.local_broker_id)
            .filter(|id| {
                self.followers.get(id).is_none_or(|f| {
                    !f.is_caught_up(self.log_end_offset, now_ms, replica_lag_time_max_ms)
                })
            })
            .collect()
    }

    /// Step 6: the controller's answer to `sent` (the proposal returned earlier), or the
    /// error for this partition (or the request-level error when it applies to all).
    pub fn on_alter_partition_response(
        &mut self,
        sent: &AlterPartitionProposal,
        result: Result<LeaderAndIsr, ErrorCode>,
        now_ms: i64,
        brokers: &impl BrokerLiveness,
    ) -> AlterPartitionOutcome {
        if self.pending.as_ref().map(|p| &p.proposal) != Some(sent) {
            return AlterPartitionOutcome::Stale;
        }
        match result {
            Ok(committed) => {
                // Another leader epoch, or older than what we know: the answer does not
                // describe our state; stay pending until metadata says what happened.
                if committed.leader_epoch != self.leader_epoch
                    || committed.partition_epoch < self.partition_epoch
                    || !committed.isr.contains(&self.config.local_broker_id)
                {
                    return AlterPartitionOutcome::AwaitMetadata;
                }
                self.isr = committed.isr.iter().copied().collect();
                self.partition_epoch = committed.partition_epoch;
                self.pending = None;
                AlterPartitionOutcome::Committed {
                    high_watermark: self.maybe_increment_high_watermark(brokers, now_ms),
                }
            }
            Err(code)
                if code == ErrorCode::OPERATION_NOT_ATTEMPTED
                    || code == ErrorCode::INELIGIBLE_REPLICA =>
            {
                // The controller states that the request was not applied and that our
                // partition epoch is current, so the last committed state is still true.
                self.pending = None;
                AlterPartitionOutcome::Reverted
            }
            Err(code)
                if code == ErrorCode::UNKNOWN_TOPIC_OR_PARTITION
                    || code == ErrorCode::UNKNOWN_TOPIC_ID
                    || code == ErrorCode::FENCED_LEADER_EPOCH
                    || code == ErrorCode::INVALID_UPDATE_VERSION
                    || code == ErrorCode::INVALID_REQUEST
                    || code == ErrorCode::NEW_LEADER_ELECTED =>
            {
                AlterPartitionOutcome::AwaitMetadata
            }
            Err(_) => AlterPartitionOutcome::Retry(sent.clone()),
        }
    }

    /// Step 7: the partition's registration changed in the metadata image.
    pub fn on_metadata_update(
        &mut self,
        registration: &PartitionRegistration,
        now_ms: i64,
        brokers: &impl BrokerLiveness,
    ) -> Result<MetadataOutcome, IsrError> {
        // Equal partition epochs describe the same state (every controller change bumps
        // it); Kafka re-applies it, which would drop a pending change whose answer is on
        // its way and allow a duplicate proposal.
        if registration.partition_epoch <= self.partition_epoch {
            return Ok(MetadataOutcome::Ignored);
        }
        validate(self.config.local_broker_id, registration)?;
        let new_leader_epoch = registration.leader_epoch > self.leader_epoch;
        let isr: BTreeSet<i32> = registration.isr.iter().copied().collect();
        let local = self.config.local_broker_id;
        self.followers
            .retain(|id, _| registration.replicas.contains(id));
        for &id in &registration.replicas {
            if id != local {
                self.followers
                    .entry(id)
                    .or_insert_with(FollowerState::empty);
            }
        }
        if new_leader_epoch {
            // Kafka's `resetReplicaState` for a leader that stays leader: log end offsets
            // are kept, the fetch history starts again from the new epoch's start.
            self.leader_epoch_start_offset = self.log_end_offset;
            self.leader_epoch = registration.leader_epoch;
            for (id, f) in self.followers.iter_mut() {
                let in_sync = isr.contains(id);
                f.last_fetch_leader_log_end_offset = self.log_end_offset;
                f.last_fetch_time_ms = in_sync.then_some(now_ms);
                f.last_caught_up_time_ms = in_sync.then_some(now_ms);
            }
        }
        self.replicas = registration.replicas.clone();
        self.isr = isr;
        self.partition_epoch = registration.partition_epoch;
        self.pending = None;
        Ok(MetadataOutcome::Applied {
            high_watermark: self.maybe_increment_high_watermark(brokers, now_ms),
        })
    }

    /// Step 3 for `replica_id`, which has just fetched.
    fn maybe_expand_isr(
        &mut self,
        replica_id: i32,
        brokers: &impl BrokerLiveness,
    ) -> Option<AlterPartitionProposal> {
        if self.pending.is_some()
            || self.isr.contains(&replica_id)
            || !self.is_replica_isr_eligible(replica_id, brokers)
        {
            return None;
        }
        let leo = self.followers.get(&replica_id)?.log_end_offset;
        if leo < self.high_watermark || leo < self.leader_epoch_start_offset {
            return None;
        }
        let mut new_isr = self.isr.clone();
        new_isr.insert(replica_id);
        let proposal = self.proposal(&new_isr);
        self.pending = Some(PendingIsrChange {
            kind: PendingIsrChangeKind::Expand {
                new_in_sync_replica: replica_id,
            },
            proposal: proposal.clone(),
        });
        Some(proposal)
    }

    /// KIP-841: an assigned follower, registered, unfenced, not shutting down, whose last
    /// fetch carried its registered broker epoch (or none).
    fn is_replica_isr_eligible(&self, replica_id: i32, brokers: &impl BrokerLiveness) -> bool {
        let Some(follower) = self.followers.get(&replica_id) else {
            return false;
        };
        let Some(status) = brokers.broker_status(replica_id) else {
            return false;
        };
        !status.fenced
            && !status.in_controlled_shutdown
            && follower
                .broker_epoch
                .is_some_and(|e| e == NO_BROKER_EPOCH || e == status.broker_epoch)
    }

    /// Step 4. Returns the new high watermark when it moved.
    fn maybe_increment_high_watermark(
        &mut self,
        brokers: &impl BrokerLiveness,
        now_ms: i64,
    ) -> Option<i64> {
        let maximal = self.maximal_isr();
        let mut candidate = self.log_end_offset;
        for (&id, f) in &self.followers {
            if f.log_end_offset >= candidate {
                continue;
            }
            let waits = maximal.contains(&id)
                || (f.is_caught_up(
                    self.log_end_offset,
                    now_ms,
                    self.config.replica_lag_time_max_ms,
                ) && self.is_replica_isr_eligible(id, brokers));
            if waits {
                candidate = f.log_end_offset;
            }
        }
        if candidate > self.high_watermark {
            self.high_watermark = candidate;
            Some(candidate)
        } else {
            None
        }
    }

    fn proposal(&self, isr: &BTreeSet<i32>) -> AlterPartitionProposal {
        let new_isr = isr
            .iter()
            .map(|&broker_id| IsrMember {
                broker_id,
                broker_epoch: if broker_id == self.config.local_broker_id {
                    self.config.local_broker_epoch
                } else {
                    // A member that has not fetched in this leadership is sent with -1:
                    // the controller then skips its epoch check (Kafka does the same).
                    self.followers
                        .get(&broker_id)
                        .and_then(|f| f.broker_epoch)
                        .unwrap_or(NO_BROKER_EPOCH)
                },
            })
            .collect();
        AlterPartitionProposal {
            leader_id: self.config.local_broker_id,
            leader_epoch: self.leader_epoch,
            partition_epoch: self.partition_epoch,
            new_isr,
        }
    }
}

/// The broker epoch of `broker_id` while it is registered and unfenced (Kafka's
/// `getAliveBrokerEpoch`).
fn alive_broker_epoch(brokers: &impl BrokerLiveness, broker_id: i32) -> Option<i64> {
    brokers
        .broker_status(broker_id)
        .filter(|s| !s.fenced)
        .map(|s| s.broker_epoch)
}

fn validate(local_broker_id: i32, registration: &PartitionRegistration) -> Result<(), IsrError> {
    if registration.leader != local_broker_id {
        return Err(IsrError::NotLeader {
            local_broker_id,
            leader: registration.leader,
        });
    }
    if !registration.replicas.contains(&local_broker_id) {
        return Err(IsrError::InvalidRegistration("leader is not a replica"));
    }
    if !registration.isr.contains(&local_broker_id) {
        return Err(IsrError::InvalidRegistration("leader is not in the ISR"));
    }
    if registration
        .isr
        .iter()
        .any(|id| !registration.replicas.contains(id))
    {
        return Err(IsrError::InvalidRegistration("ISR member is not a replica"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEADER: i32 = 1;
    const LAG_MS: i64 = 10_000;
    const T0: i64 = 1_000_000;
    const EPOCH: i64 = 100;

    fn brokers() -> BTreeMap<i32, BrokerStatus> {
        (1..=4)
            .map(|id| {
                (
                    id,
                    BrokerStatus {
                        broker_epoch: EPOCH,
                        fenced: false,
                        in_controlled_shutdown: false,
                    },
                )
            })
            .collect()
    }

    fn config() -> LeaderConfig {
        LeaderConfig {
            local_broker_id: LEADER,
            local_broker_epoch: EPOCH,
            replica_lag_time_max_ms: LAG_MS,
        }
    }

    fn registration(
        replicas: &[i32],
        isr: &[i32],
        leader_epoch: i32,
        partition_epoch: i32,
    ) -> PartitionRegistration {
        PartitionRegistration {
            replicas: replicas.to_vec(),
            isr: isr.to_vec(),
            leader: LEADER,
            leader_epoch,
            partition_epoch,
        }
    }

    fn leader(
        replicas: &[i32],
        isr: &[i32],
        log_end_offset: i64,
        high_watermark: i64,
    ) -> LeaderState {
        LeaderState::become_leader(
            config(),
            &registration(replicas, isr, 5, 10),
            LogOffsets {
                log_start_offset: 0,
                log_end_offset,
                high_watermark,
            },
            &brokers(),
            T0,
        )
        .unwrap()
    }

    fn fetch(s: &mut LeaderState, id: i32, offset: i64, now: i64) -> FollowerFetchOutcome {
        s.update_follower_fetch(id, offset, 0, now, EPOCH, &brokers())
            .unwrap()
    }

    fn append(s: &mut LeaderState, leo: i64, now: i64) -> Option<i64> {
        s.update_leader_log_end(leo, now, &brokers()).unwrap()
    }

    fn commit_at(
        s: &mut LeaderState,
        p: &AlterPartitionProposal,
        now: i64,
    ) -> AlterPartitionOutcome {
        let result = LeaderAndIsr {
            leader_epoch: p.leader_epoch,
            partition_epoch: p.partition_epoch + 1,
            isr: p.isr(),
        };
        s.on_alter_partition_response(p, Ok(result), now, &brokers())
    }

    fn commit(s: &mut LeaderState, p: &AlterPartitionProposal) -> AlterPartitionOutcome {
        commit_at(s, p, T0)
    }

    #[test]
    fn high_watermark_is_the_minimum_over_three_replicas() {
        let mut s = leader(&[1, 2, 3], &[1, 2, 3], 10, 0);
        // Follower 3 has not fetched yet: its unknown end holds the high watermark.
        assert_eq!(fetch(&mut s, 2, 5, T0).high_watermark, None);
        assert_eq!(fetch(&mut s, 3, 7, T0).high_watermark, Some(5));
        assert_eq!(fetch(&mut s, 2, 10, T0).high_watermark, Some(7));
        assert_eq!(fetch(&mut s, 3, 10, T0).high_watermark, Some(10));
        assert_eq!(s.high_watermark(), 10);
        assert!(s.is_committed(10));
        assert!(!s.is_committed(11));
    }

    #[test]
    fn lagging_follower_holds_the_high_watermark_until_shrunk() {
        let mut s = leader(&[1, 2, 3], &[1, 2, 3], 10, 0);
        fetch(&mut s, 2, 10, T0);
        assert_eq!(fetch(&mut s, 3, 2, T0).high_watermark, Some(2));
        assert_eq!(append(&mut s, 20, T0 + 1), None);
        assert_eq!(fetch(&mut s, 2, 20, T0 + 2).high_watermark, None);
        assert_eq!(s.high_watermark(), 2);
        let p = s.maybe_shrink_isr(T0 + LAG_MS + 1, LAG_MS).unwrap();
        assert_eq!(p.isr(), vec![1, 2]);
        assert_eq!(p.partition_epoch, 10);
        // A shrink in flight still counts the member it removes.
        assert_eq!(append(&mut s, 21, T0 + LAG_MS + 2), None);
        assert_eq!(s.high_watermark(), 2);
        assert_eq!(
            commit_at(&mut s, &p, T0 + LAG_MS + 3),
            AlterPartitionOutcome::Committed {
                high_watermark: Some(20)
            }
        );
        assert_eq!(s.isr().iter().copied().collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!(s.partition_epoch(), 11);
    }

    #[test]
    fn shrink_after_the_lag_max_and_not_before() {
        let mut s = leader(&[1, 2], &[1, 2], 10, 0);
        fetch(&mut s, 2, 5, T0);
        // Caught up as of becoming leader (T0): lag measured from there.
        assert_eq!(s.maybe_shrink_isr(T0 + LAG_MS, LAG_MS), None);
        assert!(s.pending().is_none());
        let p = s.maybe_shrink_isr(T0 + LAG_MS + 1, LAG_MS).unwrap();
        assert_eq!(p.isr(), vec![LEADER]);
        assert_eq!(
            s.pending().map(|p| &p.kind),
            Some(&PendingIsrChangeKind::Shrink {
                out_of_sync_replicas: vec![2]
            })
        );
    }

    #[test]
    fn follower_at_the_leader_end_is_never_out_of_sync() {
        let mut s = leader(&[1, 2], &[1, 2], 10, 0);
        fetch(&mut s, 2, 10, T0);
        assert_eq!(s.maybe_shrink_isr(T0 + 50 * LAG_MS, LAG_MS), None);
        // Once the leader appends, the lag counts from the last time it was caught up.
        append(&mut s, 11, T0 + 50 * LAG_MS);
        assert!(s.maybe_shrink_isr(T0 + 50 * LAG_MS, LAG_MS).is_some());
    }

    #[test]
    fn caught_up_time_from_the_previous_fetch() {
        let mut s = leader(&[1, 2], &[1, 2], 10, 0);
        fetch(&mut s, 2, 10, T0);
        append(&mut s, 20, T0 + 1);
        // Behind the current end, and at the end the leader had at its previous fetch:
        // caught up as of that previous fetch.
        fetch(&mut s, 2, 10, T0 + 5_000);
        assert_eq!(s.follower(2).unwrap().last_caught_up_time_ms, Some(T0));
        append(&mut s, 30, T0 + 5_001);
        fetch(&mut s, 2, 20, T0 + 9_000);
        assert_eq!(
            s.follower(2).unwrap().last_caught_up_time_ms,
            Some(T0 + 5_000)
        );
        assert_eq!(s.maybe_shrink_isr(T0 + 5_000 + LAG_MS, LAG_MS), None);
        // Still behind what the leader had at the previous fetch: no progress.
        append(&mut s, 40, T0 + 9_001);
        fetch(&mut s, 2, 25, T0 + 12_000);
        assert_eq!(
            s.follower(2).unwrap().last_caught_up_time_ms,
            Some(T0 + 5_000)
        );
        assert!(s.maybe_shrink_isr(T0 + 5_001 + LAG_MS, LAG_MS).is_some());
    }

    #[test]
    fn expand_only_at_the_high_watermark_and_the_epoch_start() {
        // Follower 2 has not fetched, so the high watermark stays at 5 while the current
        // leader epoch starts at 10.
        let mut s = leader(&[1, 2, 3], &[1, 2], 10, 5);
        assert_eq!(s.leader_epoch_start_offset(), 10);
        assert_eq!(fetch(&mut s, 3, 4, T0).alter_partition, None);
        assert_eq!(fetch(&mut s, 3, 7, T0).alter_partition, None);
        let p = fetch(&mut s, 3, 10, T0).alter_partition.unwrap();
        assert_eq!(p.isr(), vec![1, 2, 3]);
        assert_eq!(
            p.new_isr,
            vec![
                IsrMember {
                    broker_id: 1,
                    broker_epoch: EPOCH
                },
                IsrMember {
                    broker_id: 2,
                    broker_epoch: NO_BROKER_EPOCH
                },
                IsrMember {
                    broker_id: 3,
                    broker_epoch: EPOCH
                },
            ]
        );
        assert_eq!(s.maximal_isr().len(), 3);
        assert_eq!(s.isr_size(), 2);
    }

    #[test]
    fn ineligible_replicas_do_not_join() {
        let mut s = leader(&[1, 2], &[1], 10, 10);
        let mut b = brokers();
        b.get_mut(&2).unwrap().fenced = true;
        let o = s.update_follower_fetch(2, 10, 0, T0, EPOCH, &b).unwrap();
        assert_eq!(o.alter_partition, None);
        let mut b = brokers();
        b.get_mut(&2).unwrap().in_controlled_shutdown = true;
        let o = s.update_follower_fetch(2, 10, 0, T0, EPOCH, &b).unwrap();
        assert_eq!(o.alter_partition, None);
        // Fetching with an epoch newer than the registered one: not eligible yet.
        let o = s
            .update_follower_fetch(2, 10, 0, T0, EPOCH + 1, &brokers())
            .unwrap();
        assert_eq!(o.alter_partition, None);
        // Unregistered broker.
        let none = |_: i32| None;
        let o = s.update_follower_fetch(2, 10, 0, T0, EPOCH, &none).unwrap();
        assert_eq!(o.alter_partition, None);
        let o = s
            .update_follower_fetch(2, 10, 0, T0, NO_BROKER_EPOCH, &brokers())
            .unwrap();
        assert!(o.alter_partition.is_some());
    }

    #[test]
    fn stale_broker_epoch_is_refused() {
        let mut s = leader(&[1, 2], &[1, 2], 10, 0);
        let e = s
            .update_follower_fetch(2, 10, 0, T0, EPOCH - 1, &brokers())
            .unwrap_err();
        assert_eq!(e.error_code(), ErrorCode::NOT_LEADER_OR_FOLLOWER);
        assert_eq!(s.follower(2).unwrap().log_end_offset, UNKNOWN_OFFSET);
        assert_eq!(s.high_watermark(), 0);
    }

    #[test]
    fn pending_change_blocks_proposals_and_uses_the_maximal_isr() {
        let mut s = leader(&[1, 2, 3, 4], &[1, 2], 10, 0);
        fetch(&mut s, 2, 10, T0);
        assert_eq!(s.high_watermark(), 10);
        let p = fetch(&mut s, 3, 10, T0).alter_partition.unwrap();
        append(&mut s, 20, T0);
        // Follower 3 is not committed yet, but counted: the high watermark waits for it.
        assert_eq!(fetch(&mut s, 2, 20, T0).high_watermark, None);
        assert_eq!(s.high_watermark(), 10);
        // No second proposal while one is in flight: neither expand nor shrink.
        assert_eq!(fetch(&mut s, 4, 20, T0).alter_partition, None);
        assert_eq!(s.maybe_shrink_isr(T0 + 10 * LAG_MS, LAG_MS), None);
        assert_eq!(
            s.out_of_sync_replicas(T0 + 10 * LAG_MS, LAG_MS),
            Vec::<i32>::new()
        );
        assert_eq!(fetch(&mut s, 3, 20, T0).high_watermark, Some(20));
        assert_eq!(
            commit(&mut s, &p),
            AlterPartitionOutcome::Committed {
                high_watermark: None
            }
        );
        // Now follower 4 may join.
        assert!(fetch(&mut s, 4, 20, T0 + 1).alter_partition.is_some());
    }

    #[test]
    fn caught_up_replica_outside_the_isr_holds_the_high_watermark() {
        // KAFKA-15021: an eligible, caught-up replica about to join is waited for.
        let mut s = leader(&[1, 2, 3], &[1], 10, 10);
        let p = fetch(&mut s, 2, 10, T0).alter_partition.unwrap();
        fetch(&mut s, 3, 10, T0); // Caught up, but the expansion of 2 is in flight.
        commit(&mut s, &p);
        append(&mut s, 20, T0 + 1);
        fetch(&mut s, 2, 20, T0 + 1);
        assert_eq!(s.high_watermark(), 10);
        // Once 3 lags beyond the limit it no longer holds the high watermark.
        assert_eq!(append(&mut s, 21, T0 + LAG_MS + 1), Some(20));
        assert_eq!(
            fetch(&mut s, 2, 21, T0 + LAG_MS + 1).high_watermark,
            Some(21)
        );
    }

    #[test]
    fn alter_partition_answers() {
        let mut s = leader(&[1, 2, 3], &[1, 2], 10, 10);
        let p = fetch(&mut s, 3, 10, T0).alter_partition.unwrap();
        let t = T0;
        let b = brokers();
        // Transient: same proposal again, still pending.
        assert_eq!(
            s.on_alter_partition_response(&p, Err(ErrorCode::REQUEST_TIMED_OUT), t, &b),
            AlterPartitionOutcome::Retry(p.clone())
        );
        // Stale view: stays pending until metadata.
        for code in [
            ErrorCode::FENCED_LEADER_EPOCH,
            ErrorCode::INVALID_UPDATE_VERSION,
        ] {
            assert_eq!(
                s.on_alter_partition_response(&p, Err(code), t, &b),
                AlterPartitionOutcome::AwaitMetadata
            );
            assert!(s.pending().is_some());
        }
        // Success in another leader epoch: ignored, still pending.
        let other = LeaderAndIsr {
            leader_epoch: 6,
            partition_epoch: 11,
            isr: vec![1, 2, 3],
        };
        assert_eq!(
            s.on_alter_partition_response(&p, Ok(other), t, &b),
            AlterPartitionOutcome::AwaitMetadata
        );
        // Not applied: back to the committed ISR, and a new proposal may go.
        assert_eq!(
            s.on_alter_partition_response(&p, Err(ErrorCode::INELIGIBLE_REPLICA), t, &b),
            AlterPartitionOutcome::Reverted
        );
        assert!(s.pending().is_none());
        assert_eq!(s.maximal_isr().len(), 2);
        // The answer to a change no longer in flight is ignored.
        assert_eq!(commit(&mut s, &p), AlterPartitionOutcome::Stale);
        let p2 = fetch(&mut s, 3, 10, T0 + 1).alter_partition.unwrap();
        assert_eq!(
            commit(&mut s, &p2),
            AlterPartitionOutcome::Committed {
                high_watermark: None
            }
        );
        assert_eq!(s.isr_size(), 3);
        assert_eq!(s.partition_epoch(), 11);
    }

    #[test]
    fn metadata_update_supersedes_a_pending_change() {
        let mut s = leader(&[1, 2, 3], &[1, 2], 10, 10);
        let p = fetch(&mut s, 3, 10, T0).alter_partition.unwrap();
        let b = brokers();
        // Older or same partition epoch: nothing.
        assert_eq!(
            s.on_metadata_update(&registration(&[1, 2, 3], &[1], 5, 10), T0, &b),
            Ok(MetadataOutcome::Ignored)
        );
        assert!(s.pending().is_some());
        // The controller applied the expansion; metadata arrives before the answer.
        assert_eq!(
            s.on_metadata_update(&registration(&[1, 2, 3], &[1, 2, 3], 5, 11), T0, &b),
            Ok(MetadataOutcome::Applied {
                high_watermark: None
            })
        );
        assert!(s.pending().is_none());
        assert_eq!(s.isr_size(), 3);
        assert_eq!(commit(&mut s, &p), AlterPartitionOutcome::Stale);
        // Another leader: refused, the replica manager makes this replica a follower.
        let mut other = registration(&[1, 2, 3], &[2, 3], 6, 12);
        other.leader = 2;
        let e = s.on_metadata_update(&other, T0, &b).unwrap_err();
        assert_eq!(e.error_code(), ErrorCode::NOT_LEADER_OR_FOLLOWER);
        // A new leader epoch starts at the current end; a follower must reach it to join.
        append(&mut s, 15, T0);
        s.on_metadata_update(&registration(&[1, 2, 3, 4], &[1, 2, 3], 6, 12), T0, &b)
            .unwrap();
        assert_eq!(s.leader_epoch(), 6);
        assert_eq!(s.leader_epoch_start_offset(), 15);
        assert_eq!(s.follower(3).unwrap().log_end_offset, 10);
        assert_eq!(fetch(&mut s, 4, 12, T0).alter_partition, None);
        assert!(fetch(&mut s, 4, 15, T0).alter_partition.is_some());
    }

    #[test]
    fn leader_only_isr_moves_the_high_watermark_with_the_log_end() {
        let s = leader(&[1, 2], &[1], 10, 3);
        assert_eq!(s.high_watermark(), 10);
        let mut s = s;
        assert_eq!(append(&mut s, 11, T0), Some(11));
        assert_eq!(append(&mut s, 11, T0), None);
        assert_eq!(append(&mut s, 30, T0), Some(30));
        assert_eq!(s.check_enough_replicas(1), Ok(()));
        assert_eq!(
            s.check_enough_replicas(2),
            Err(NotEnoughReplicas {
                isr_size: 1,
                min_insync_replicas: 2
            })
        );
        assert_eq!(
            s.check_enough_replicas_reach_offset(30, 1),
            AcksAllProgress::Done
        );
        assert_eq!(
            s.check_enough_replicas_reach_offset(31, 1),
            AcksAllProgress::Waiting
        );
        assert_eq!(
            s.check_enough_replicas_reach_offset(30, 2),
            AcksAllProgress::NotEnoughReplicasAfterAppend
        );
    }

    #[test]
    fn fetch_from_an_unknown_replica() {
        let mut s = leader(&[1, 2], &[1, 2], 10, 0);
        for id in [9, LEADER] {
            let e = s
                .update_follower_fetch(id, 10, 0, T0, EPOCH, &brokers())
                .unwrap_err();
            assert_eq!(
                e,
                IsrError::UnknownReplica {
                    replica_id: id,
                    leader_epoch: 5
                }
            );
            assert_eq!(e.error_code(), ErrorCode::UNKNOWN_LEADER_EPOCH);
        }
        let e = s
            .update_follower_fetch(2, 11, 0, T0, EPOCH, &brokers())
            .unwrap_err();
        assert_eq!(e.error_code(), ErrorCode::OFFSET_OUT_OF_RANGE);
    }

    #[test]
    fn high_watermark_never_decreases() {
        let mut s = leader(&[1, 2, 3], &[1, 2, 3], 10, 8);
        assert_eq!(s.high_watermark(), 8);
        fetch(&mut s, 2, 3, T0);
        fetch(&mut s, 3, 3, T0);
        assert_eq!(s.high_watermark(), 8);
        assert!(matches!(
            s.update_leader_log_end(9, T0, &brokers()),
            Err(IsrError::LogEndOffsetBackwards { .. })
        ));
        // A registration at a lower checkpoint than the log end is clamped to it.
        let s = leader(&[1], &[1], 4, 8);
        assert_eq!(s.high_watermark(), 4);
    }

    #[test]
    fn invalid_registrations_are_refused() {
        let b = brokers();
        let log = LogOffsets {
            log_start_offset: 0,
            log_end_offset: 0,
            high_watermark: 0,
        };
        for (replicas, isr) in [
            (&[1, 2][..], &[2][..]),
            (&[2][..], &[1, 2][..]),
            (&[1][..], &[1, 3][..]),
        ] {
            let r = registration(replicas, isr, 0, 0);
            assert!(LeaderState::become_leader(config(), &r, log, &b, T0).is_err());
        }
    }

    mod prop {
        use super::*;
        use proptest::prelude::*;

        #[derive(Debug, Clone)]
        enum Op {
            /// Follower (2..=4) fetches, advancing `step` offsets towards the leader's end.
            Fetch {
                follower: i32,
                step: i64,
            },
            Append {
                records: i64,
            },
            Tick {
                ms: i64,
            },
            Shrink,
            Respond {
                answer: u8,
            },
            /// The controller applied the pending change and metadata brings it.
            MetadataCommitsPending,
            MetadataNewLeaderEpoch,
            ToggleFenced {
                broker: i32,
            },
        }

        fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                4 => (2..=4i32, 0..6i64).prop_map(|(follower, step)| Op::Fetch { follower, step }),
                2 => (0..5i64).prop_map(|records| Op::Append { records }),
                2 => (0..6_000i64).prop_map(|ms| Op::Tick { ms }),
                1 => Just(Op::Shrink),
                2 => (0..4u8).prop_map(|answer| Op::Respond { answer }),
                1 => Just(Op::MetadataCommitsPending),
                1 => Just(Op::MetadataNewLeaderEpoch),
                1 => (2..=4i32).prop_map(|broker| Op::ToggleFenced { broker }),
            ]
        }

        fn check(s: &LeaderState, previous_hw: i64) {
            assert!(
                s.high_watermark() >= previous_hw,
                "high watermark went back"
            );
            assert!(s.high_watermark() <= s.log_end_offset());
            assert!(s.isr().contains(&LEADER), "leader left the ISR");
            assert!(s.maximal_isr().is_superset(s.isr()));
            for id in s.isr() {
                if let Some(f) = s.follower(*id) {
                    if f.log_end_offset != UNKNOWN_OFFSET {
                        assert!(
                            s.high_watermark() <= f.log_end_offset,
                            "high watermark {} above ISR member {id} at {}",
                            s.high_watermark(),
                            f.log_end_offset
                        );
                    }
                }
            }
            if let Some(p) = s.pending() {
                assert!(p.proposal.isr().contains(&LEADER));
            }
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]
            #[test]
            fn invariants_hold_after_every_step(
                isr_mask in 0u8..8,
                leo0 in 0..20i64,
                hw_frac in 0..=100i64,
                follower_frac in proptest::collection::vec(0..=100i64, 3),
                ops in proptest::collection::vec(op(), 1..120),
            ) {
                let hw0 = leo0 * hw_frac / 100;
                let mut isr = vec![LEADER];
                for (i, id) in (2..=4).enumerate() {
                    if isr_mask & (1 << i) != 0 {
                        isr.push(id);
                    }
                }
                // The followers' real log ends: an ISR member has at least the high
                // watermark (it is how the previous leader computed it).
                let mut real_leo: BTreeMap<i32, i64> = BTreeMap::new();
                for (i, id) in (2..=4).enumerate() {
                    let low = if isr.contains(&id) { hw0 } else { 0 };
                    real_leo.insert(id, low + (leo0 - low) * follower_frac[i] / 100);
                }
                let mut b = brokers();
                let mut now = T0;
                let mut leader_epoch = 5;
                let mut s = LeaderState::become_leader(
                    config(),
                    &registration(&[1, 2, 3, 4], &isr, leader_epoch, 10),
                    LogOffsets { log_start_offset: 0, log_end_offset: leo0, high_watermark: hw0 },
                    &b,
                    now,
                ).unwrap();
                check(&s, hw0);
                for op in ops {
                    let hw = s.high_watermark();
                    match op {
                        Op::Fetch { follower, step } => {
                            let leo = real_leo.get_mut(&follower).unwrap();
                            *leo = (*leo + step).min(s.log_end_offset());
                            let o = s.update_follower_fetch(follower, *leo, 0, now, EPOCH, &b).unwrap();
                            if let Some(new) = o.high_watermark {
                                prop_assert_eq!(new, s.high_watermark());
                                prop_assert!(new > hw);
                            }
                            if let Some(p) = o.alter_partition {
                                prop_assert_eq!(Some(&p), s.pending().map(|p| &p.proposal));
                            }
                        }
                        Op::Append { records } => {
                            let leo = s.log_end_offset() + records;
                            s.update_leader_log_end(leo, now, &b).unwrap();
                        }
                        Op::Tick { ms } => now += ms,
                        Op::Shrink => {
                            let had_pending = s.pending().is_some();
                            let p = s.maybe_shrink_isr(now, LAG_MS);
                            if had_pending {
                                prop_assert!(p.is_none());
                            }
                        }
                        Op::Respond { answer } => {
                            if let Some(p) = s.pending().map(|p| p.proposal.clone()) {
                                let result = match answer {
                                    0 => Ok(LeaderAndIsr {
                                        leader_epoch: p.leader_epoch,
                                        partition_epoch: p.partition_epoch + 1,
                                        isr: p.isr(),
                                    }),
                                    1 => Err(ErrorCode::OPERATION_NOT_ATTEMPTED),
                                    2 => Err(ErrorCode::INVALID_UPDATE_VERSION),
                                    _ => Err(ErrorCode::REQUEST_TIMED_OUT),
                                };
                                s.on_alter_partition_response(&p, result, now, &b);
                            }
                        }
                        Op::MetadataCommitsPending => {
                            if let Some(p) = s.pending().map(|p| p.proposal.clone()) {
                                let r = registration(&[1, 2, 3, 4], &p.isr(), leader_epoch, s.partition_epoch() + 1);
                                s.on_metadata_update(&r, now, &b).unwrap();
                                prop_assert!(s.pending().is_none());
                            }
                        }
                        Op::MetadataNewLeaderEpoch => {
                            leader_epoch += 1;
                            let isr: Vec<i32> = s.isr().iter().copied().collect();
                            let r = registration(&[1, 2, 3, 4], &isr, leader_epoch, s.partition_epoch() + 1);
                            s.on_metadata_update(&r, now, &b).unwrap();
                        }
                        Op::ToggleFenced { broker } => {
                            let st = b.get_mut(&broker).unwrap();
                            st.fenced = !st.fenced;
                        }
                    }
                    check(&s, hw);
                }
            }
        }
    }
}
