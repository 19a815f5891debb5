//! The active controller's event loop: the one task per node that owns a
//! [`QuorumController`] and turns events into committed metadata records.
//!
//! Kafka's controller moved from many threads sharing state under locks to one thread
//! draining an event queue (the seed's `EventExecutorThread`, KRaft's `KafkaEventQueue`);
//! this is that loop. Nothing else touches the controller or its working image, so there
//! is no locking of controller state: every event, timer and leadership change is handled
//! here, one at a time.
//!
//! # Protocol
//! 1. Events arrive on a bounded queue ([`EVENT_QUEUE_CAPACITY`]), each with a oneshot
//!    for its answer: from [`super::MetadataQuorum::submit`] on this node, or from a
//!    peer that forwarded its submission over the quorum RPC.
//! 2. Before an event or timer is handled, the loop checks that this node is the Raft
//!    leader and that a quorum acknowledged it within `election_timeout_min`, after
//!    which its followers may grant another voter's pre-vote (`pre_vote.rs`; a
//!    check-quorum: a leader cut off from its quorum stops deciding what it cannot
//!    commit). If not, the event is answered
//!    [`MetadataError::NotController`] with the leader this node knows, and any
//!    working state is dropped.
//! 3. The first time it handles something in a new term as leader, it takes
//!    [`super::MetadataQuorum::leader_image`] (everything committed in earlier terms,
//!    applied) as its working image and makes a fresh [`QuorumController`], then ticks
//!    it at once: the tick counts every registered, unfenced broker as heard from now,
//!    so leases restart at takeover, as in Kafka's `BrokerHeartbeatManager` on a new
//!    active controller.
//! 4. Each event: `handle(event, working image, now)`, apply the records to the working
//!    image, propose them as one batch, and answer once they are committed with the
//!    response and the offset after the batch. A decision with no records is answered
//!    at once (its `next_offset` is the working image's, which is committed).
//! 5. Timer: while leading, [`QuorumController::tick`] runs at
//!    [`QuorumController::next_deadline`] and at least every [`TICK_INTERVAL_MAX`]; its
//!    records (lease expiry fencing, preferred-leader election) are proposed the same way.
//! 6. A proposal that fails drops the working image and controller: the next event
//!    starts again from step 3, and the event is answered NotController so that the
//!    submitter retries against whoever leads now.
//! 7. Every [`PROCESS_GONE_CHECK`] the loop takes the peers whose quorum port refused
//!    this node's last dial ([`DialLog::take_refused`]: Raft replicates to every voter
//!    and observer every heartbeat interval, so it dials a peer again within one after
//!    its connection drops). A refusal means the peer's process is gone; while leading,
//!    the loop hands each such unfenced broker to the controller
//!    ([`ControllerEvent::BrokerProcessGone`]), which fences it and moves its
//!    leaderships at once instead of a session timeout later. A peer that is cut off or
//!    frozen does not refuse, and only its lease decides.
//!
//! The loop reads a monotonic clock (milliseconds since it started), not the wall
//! clock: the controller only measures intervals with it (leases, the rebalance check),
//! and a wall clock stepped by NTP would fence every broker at once, or none for hours.
//! The wall clock is read too, and passed beside it, only for times the controller
//! records for others to compare with their own clocks (a delegation token's expiry).
//! A fresh controller per term means no time is carried between loops.
//!
//! # Why at most one controller acts per term
//! Only the Raft leader proposes, and Raft commits an entry only with a quorum of the
//! term it was proposed in: a deposed leader's proposals fail (or are overwritten by the
//! new leader's log), so its decisions never become records, and its working image is
//! thrown away on the failure. The working image only ever runs ahead of the committed
//! image by the batch in flight, because proposals are awaited one at a time; if the
//! committed offsets ever disagree with the working image (someone proposed around the
//! loop), the image is re-read rather than trusted.
//!
//! A proposal is awaited without a timeout on purpose: until Raft says whether it
//! committed (it commits, or a new leader truncates it and openraft answers
//! ForwardToLeader), no next decision could know which image it starts from. A leader
//! cut off from its quorum therefore holds its loop until the partition heals or the
//! node stops; submitters are bounded by their own timeouts and the queue's capacity,
//! and every other node forwards to the new leader meanwhile.

use std::sync::Arc;
use std::time::Duration;

use std::collections::BTreeSet;

use openraft::{ChangeMembers, Raft, ServerState};
use rill_protocol::ErrorCode;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::network::DialLog;
use super::stats;
use super::{leader_image_of, propose_batch, Shared, TypeConfig};
use crate::api::{BrokerProcessGoneRequest, ControllerEvent, ControllerResponse, SubmitResult};
use crate::controller::{ControllerConfig, QuorumController};
use crate::error::MetadataError;
use crate::image::MetadataImage;
use crate::record::MetadataRecord;

/// Events waiting for the loop; a full queue makes submitters wait (their own timeout
/// bounds that).
pub(crate) const EVENT_QUEUE_CAPACITY: usize = 1_024;

/// The longest the loop sleeps between ticks while leading.
pub(crate) const TICK_INTERVAL_MAX: Duration = Duration::from_secs(1);

/// How often refused dials are looked at (step 7).
pub(crate) const PROCESS_GONE_CHECK: Duration = Duration::from_millis(100);

/// Bound on taking the leader image (a quorum round trip, no side effect), so that a
/// leader cut off from its quorum answers NotController rather than holding the loop.
pub(crate) const LEADER_IMAGE_TIMEOUT: Duration = Duration::from_secs(5);

/// One event on the queue and where its answer goes.
pub(crate) struct Submission {
    pub event: ControllerEvent,
    pub reply: oneshot::Sender<Result<SubmitResult, MetadataError>>,
    /// When it was put on the queue, for the queue-time metric.
    pub queued_at: std::time::Instant,
}

/// The controller state of the term this node leads.
struct Active {
    term: u64,
    /// When this node began to act as the controller of `term`.
    since: std::time::Instant,
    controller: QuorumController,
    /// The committed image plus the records of the batch in flight (none between
    /// events).
    image: MetadataImage,
}

/// The loop's state; see the module docs.
pub(crate) struct EventLoop {
    pub node_id: u64,
    pub raft: Raft<TypeConfig>,
    pub shared: Arc<Shared>,
    pub config: ControllerConfig,
    active: Option<Active>,
    /// Time zero of the controller's clock.
    started: Instant,
    /// What this node's Raft connections found of its peers (step 7).
    dials: Arc<DialLog>,
    /// How long a leader acts without a quorum's acknowledgement (step 2).
    lease: Duration,
}

impl EventLoop {
    pub(crate) fn new(
        node_id: u64,
        raft: Raft<TypeConfig>,
        shared: Arc<Shared>,
        config: ControllerConfig,
        dials: Arc<DialLog>,
        lease: Duration,
    ) -> Self {
        Self {
            node_id,
            raft,
            shared,
            config,
            active: None,
            started: Instant::now(),
            dials,
            lease,
        }
    }

    /// The controller's clock: monotonic milliseconds since the loop started.
    fn now_ms(&self) -> i64 {
        i64::try_from(self.started.elapsed().as_millis()).unwrap_or(i64::MAX)
    }

    /// Runs until every sender of `events` is gone or Raft stops.
    pub(crate) async fn run(mut self, mut events: mpsc::Receiver<Submission>) {
        let mut metrics = self.raft.metrics();
        let mut gone_check = tokio::time::interval(PROCESS_GONE_CHECK);
        gone_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let wake = self.next_wake();
            tokio::select! {
                submission = events.recv() => match submission {
                    Some(s) => self.on_event(s).await,
                    None => return,
                },
                changed = metrics.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    // Leadership moved: start (or stop) acting without waiting for an
                    // event, so that leases restart and expire on time.
                    let (leading, term) = self.leadership();
                    let stale = self.active.as_ref().is_some_and(|a| a.term != term);
                    if !leading || stale {
                        self.active = None;
                    }
                    if leading && self.active.is_none() {
                        self.on_timer().await;
                    }
                }
                () = tokio::time::sleep_until(wake) => self.on_timer().await,
                _ = gone_check.tick() => self.on_refused_dials().await,
            }
        }
    }

    /// Step 7: fences the unfenced brokers whose process is gone.
    async fn on_refused_dials(&mut self) {
        let (leading, term) = self.leadership();
        let Some(active) = self.active.as_ref().filter(|a| leading && a.term == term) else {
            return;
        };
        // Only what this controller's own term saw: an older refusal may be of a
        // process that has restarted since, and Raft dials every peer again within a
        // heartbeat interval or two of the takeover.
        let refused = self.dials.take_refused(active.since);
        if refused.is_empty() {
            return;
        }
        let gone: Vec<(i32, i64)> = refused
            .into_iter()
            .filter_map(|id| i32::try_from(id).ok())
            .filter(|id| u64::try_from(*id).ok() != Some(self.node_id))
            .filter_map(|id| active.image.broker(id).filter(|b| !b.fenced))
            .map(|b| (b.id, b.epoch))
            .collect();
        for (broker_id, broker_epoch) in gone {
            tracing::info!(
                broker = broker_id,
                "the broker's quorum port refused a connection: its process is gone"
            );
            let event = ControllerEvent::BrokerProcessGone(BrokerProcessGoneRequest {
                broker_id,
                broker_epoch,
            });
            if let Err(e) = self.decide(event).await {
                tracing::debug!(broker = broker_id, error = %e, "fencing a gone broker not applied");
            }
        }
    }

    /// Whether this node leads, and the current term. A leader that has not heard a
    /// quorum acknowledge it for longer than its followers wait before they grant a
    /// pre-vote does not act (a check-quorum): the others may have elected a new leader
    /// already, so its decisions could never commit, and an event is better answered
    /// NotController and retried where a quorum is.
    fn leadership(&self) -> (bool, u64) {
        let lease_ms = u64::try_from(self.lease.as_millis()).unwrap_or(u64::MAX);
        let m = self.raft.metrics();
        let m = m.borrow();
        let quorum_recent = m.millis_since_quorum_ack.is_none_or(|ms| ms <= lease_ms);
        (
            m.state == ServerState::Leader
                && m.current_leader == Some(self.node_id)
                && quorum_recent,
            m.current_term,
        )
    }

    /// The leader to name in a NotController answer (never this node: it just failed).
    fn known_leader(&self) -> Option<u64> {
        self.raft
            .metrics()
            .borrow()
            .current_leader
            .filter(|l| *l != self.node_id)
    }

    fn next_wake(&self) -> Instant {
        let now = Instant::now();
        let Some(active) = &self.active else {
            return now + TICK_INTERVAL_MAX;
        };
        let latest = now + TICK_INTERVAL_MAX;
        match active.controller.next_deadline(&active.image) {
            // One ms late rather than early: a lease lapses strictly after its deadline.
            Some(deadline_ms) => u64::try_from(deadline_ms.saturating_add(1))
                .map(|ms| self.started + Duration::from_millis(ms))
                .map_or(latest, |at| at.min(latest)),
            None => latest,
        }
    }

    /// Makes sure the loop acts as the controller of the current term (steps 2 and 3).
    async fn ensure_active(&mut self) -> Result<(), MetadataError> {
        let (leading, term) = self.leadership();
        if !leading {
            self.active = None;
            return Err(MetadataError::NotController {
                leader_id: self.known_leader(),
            });
        }
        if self.active.as_ref().is_some_and(|a| a.term == term) {
            return Ok(());
        }
        self.active = None;
        let image = match tokio::time::timeout(
            LEADER_IMAGE_TIMEOUT,
            leader_image_of(&self.raft, &self.shared),
        )
        .await
        {
            Ok(Ok(image)) => image,
            Ok(Err(e)) => return Err(e),
            Err(_) => {
                return Err(MetadataError::NotController {
                    leader_id: self.known_leader(),
                })
            }
        };
        // A fresh random source per term, so that a new controller does not hand out
        // the topic ids its predecessor already used for topics since deleted.
        let seed = self.config.seed
            ^ term.rotate_left(32)
            ^ u64::try_from(image.next_offset).unwrap_or(0).rotate_left(7);
        let controller = QuorumController::new(ControllerConfig {
            seed,
            ..self.config.clone()
        });
        tracing::info!(
            node = self.node_id,
            term,
            offset = image.next_offset,
            "became the active controller"
        );
        if let Some(stats) = stats::stats() {
            stats.activated();
        }
        self.active = Some(Active {
            term,
            since: std::time::Instant::now(),
            controller,
            image,
        });
        // Restart every lease now (see the module docs, step 3).
        self.tick().await
    }

    async fn on_event(&mut self, submission: Submission) {
        let taken = std::time::Instant::now();
        let queued = taken.saturating_duration_since(submission.queued_at);
        let answer = self.decide(submission.event).await;
        if let Some(stats) = stats::stats() {
            stats.event(queued, taken.elapsed());
        }
        // The submitter may have given up; nothing to do then.
        let _ = submission.reply.send(answer);
    }

    async fn decide(&mut self, event: ControllerEvent) -> Result<SubmitResult, MetadataError> {
        self.ensure_active().await?;
        let now_ms = self.now_ms();
        let Some(active) = self.active.as_mut() else {
            return Err(MetadataError::NotController {
                leader_id: self.known_leader(),
            });
        };
        // A broker-only node gone for good also leaves the quorum's learners (openraft
        // keeps them in its membership, and a cap bounds how many there may be). One
        // that is still running keeps its place: it registers again and needs the log.
        let departing_observer = match &event {
            ControllerEvent::UnregisterBroker(r) if !active.image.is_live(r.broker_id) => {
                u64::try_from(r.broker_id).ok()
            }
            _ => None,
        };
        let result = active
            .controller
            .handle(event, &active.image, now_ms, unix_ms());
        let next_offset = self.commit(result.records).await?;
        if let (Some(id), ControllerResponse::UnregisterBroker(r)) =
            (departing_observer, &result.response)
        {
            if r.error_code == ErrorCode::NONE {
                self.remove_learner(id).await;
            }
        }
        Ok(SubmitResult {
            response: result.response,
            next_offset,
        })
    }

    /// Removes `id` from the quorum's learners, if it is one (never a voter). Best
    /// effort: the registration is gone either way, and a learner left behind costs only
    /// its replication.
    async fn remove_learner(&self, id: u64) {
        let is_learner = self
            .raft
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .learner_ids()
            .any(|l| l == id);
        if !is_learner {
            return;
        }
        let change = ChangeMembers::RemoveNodes(BTreeSet::from([id]));
        match self.raft.change_membership(change, false).await {
            Ok(_) => tracing::info!(node = id, "removed the unregistered broker's observer"),
            Err(e) => tracing::warn!(node = id, error = %e, "could not remove the observer"),
        }
    }

    async fn on_timer(&mut self) {
        let (leading, term) = self.leadership();
        if !leading {
            self.active = None;
            return;
        }
        let result = if self.active.as_ref().is_some_and(|a| a.term == term) {
            self.tick().await
        } else {
            self.ensure_active().await
        };
        if let Err(e) = result {
            tracing::debug!(node = self.node_id, error = %e, "controller tick not applied");
        }
    }

    async fn tick(&mut self) -> Result<(), MetadataError> {
        let now_ms = self.now_ms();
        let Some(active) = self.active.as_mut() else {
            return Ok(());
        };
        let result = active.controller.tick(&active.image, now_ms, unix_ms());
        self.commit(result.records).await.map(|_| ())
    }

    /// Applies `records` to the working image, proposes them and waits for the commit;
    /// returns the offset after them (step 4, and 6 on failure).
    async fn commit(&mut self, records: Vec<MetadataRecord>) -> Result<i64, MetadataError> {
        let Some(active) = self.active.as_mut() else {
            return Err(MetadataError::NotController {
                leader_id: self.known_leader(),
            });
        };
        let expected_first = active.image.next_offset;
        if records.is_empty() {
            return Ok(expected_first);
        }
        for record in &records {
            // The controller built these against this image, so they apply; if one
            // does not (a controller bug), every replica skips it alike.
            if let Err(e) = active.image.apply(record) {
                tracing::error!(error = %e, "controller record does not apply to its own image");
            }
        }
        match propose_batch(&self.raft, &records).await {
            Ok(applied) => {
                if let Some(stats) = stats::stats() {
                    let (elections, unclean) = stats::leader_elections(&records);
                    if elections > 0 {
                        stats.leader_elections(elections, unclean);
                    }
                }
                if applied.first_offset != expected_first {
                    // Records were committed that this loop did not decide: its working
                    // image is not the log's. Re-read it before the next decision.
                    tracing::warn!(
                        expected_first,
                        first = applied.first_offset,
                        "metadata log moved under the controller; re-reading the image"
                    );
                    self.active = None;
                }
                Ok(applied.next_offset)
            }
            Err(e) => {
                tracing::info!(node = self.node_id, error = %e, "proposal failed; controller steps back");
                self.active = None;
                Err(MetadataError::NotController {
                    leader_id: self.known_leader(),
                })
            }
        }
    }
}

/// The wall clock in milliseconds since the epoch, for the times the controller records
/// (delegation tokens); intervals use the monotonic clock ([`EventLoop::now_ms`]).
fn unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}
