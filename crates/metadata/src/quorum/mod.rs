//! The controller quorum: the metadata log replicated by Raft (openraft 0.9) among the
//! controller nodes, behind [`MetadataQuorum`].
//!
//! Nothing outside this module names an openraft type: the rest of the crate, and the
//! broker, see records ([`MetadataRecord`]) and offsets, so the Raft library can be
//! replaced without touching the records or the controller.
//!
//! # How the broker shell uses it
//! 1. [`MetadataQuorum::start`] with this node's id, every voter's address (from
//!    `controller.quorum.voters`, see [`parse_voters`]) and a directory. The first start
//!    of a cluster initializes it with the voters as members (every node does so with the
//!    same membership, which Raft allows); later starts recover from disk.
//! 2. Every node, leader or not, follows the committed records in order with
//!    [`MetadataQuorum::read_committed`] (waiting on [`MetadataQuorum::subscribe`]) and
//!    applies them to its own image.
//! 3. The node that [`MetadataQuorum::is_leader`] is the active controller: it takes
//!    [`MetadataQuorum::leader_image`] (which waits until everything committed in earlier
//!    terms is applied), runs the [`crate::QuorumController`] against it, applies each
//!    decision's records to that working image and hands them to
//!    [`MetadataQuorum::propose`]. If a proposal fails it drops the working image and
//!    starts again from `leader_image`. The Raft term is the controller epoch.
//!    [`MetadataQuorum::start_with`] runs exactly that loop on every node (see
//!    `quorum/event_loop.rs`); it acts only while its node leads.
//! 4. Whatever the node, the shell hands each controller request to
//!    [`MetadataQuorum::submit`], which finds the active controller (this node's loop, or
//!    the leader's over the quorum RPC), retries through elections until its timeout,
//!    and answers once the decision is committed.
//!
//! # Observers (broker-only nodes)
//! A broker that is not a controller follows the log as KRaft's observers do (KIP-595),
//! built on openraft's learners: [`MetadataQuorum::start_observer`] listens on its own
//! quorum address, votes never and never stands for election (`enable_elect` is off and
//! openraft only elects voters), and runs no controller event loop. A background task
//! asks the active controller ([`network::add_observer`] over the quorum RPC) to add it
//! to the membership as a learner at that address, retrying through elections until it
//! is in. From then on the leader replicates the log to it like to any follower — the
//! entries, or a snapshot when the observer is behind the purged log — and steps 2 and 4
//! work unchanged. Why this is safe:
//! - learners are outside every quorum in openraft: commits and elections count voters
//!   only, so observers can neither block nor make a decision;
//! - the membership (with the learners in it) is itself in the log, so a new leader
//!   already knows every observer and replicates to it without a new join;
//! - the join is idempotent (a broker restarted with the same id and address changes
//!   nothing; another address replaces the old one once that broker's lease has lapsed,
//!   so that a second process with a live broker's id cannot take its log away), and
//!   refused for a voter's id.
//!
//! A learner stays in the membership after its broker is gone until an operator
//! unregisters that broker (UnregisterBroker): the controller then removes a fenced
//! broker's learner too. Until then the leader keeps trying to reach it, which costs a
//! reconnect attempt per heartbeat and nothing else. A joined observer asks to join again
//! every few seconds (an immediate yes for a member), so that one unregistered while it
//! was cut off gets back in once it is reachable and registers again.

mod describe;
mod event_loop;
mod log_store;
mod network;
mod pre_vote;
mod state_machine;
mod stats;
mod transport;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Cursor;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::error::{CheckIsLeaderError, ClientWriteError, InitializeError, RaftError};
use openraft::{BasicNode, Config, Raft, ServerState, SnapshotPolicy};
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

pub use describe::{QuorumDescription, ReplicaProgress};
pub use log_store::LogStore;
#[cfg(test)]
pub(crate) use network::call_add_observer;
pub use network::{DialLog, TcpNetwork, TcpNetworkFactory, MAX_OBSERVERS, MAX_RPC_BYTES};
pub use state_machine::StateMachineStore;
pub use stats::{set_controller_stats, ControllerStats};
pub use transport::{
    ImageView, Plaintext, QuorumIo, QuorumStream, QuorumTransport, TransportFuture,
};

use crate::api::{ControllerEvent, SubmitResult};
use crate::controller::ControllerConfig;
use crate::error::MetadataError;
use crate::image::MetadataImage;
use crate::record::{encode_batch, MetadataRecord};
use event_loop::{EventLoop, Submission, EVENT_QUEUE_CAPACITY};
pub(crate) use network::ForwardError;
pub use network::VoterChangeError;
use pre_vote::{ElectionTimer, Isolation};
use state_machine::Shared;

/// First pause of [`MetadataQuorum::submit`] between attempts; it doubles up to
/// [`SUBMIT_BACKOFF_MAX`].
const SUBMIT_BACKOFF_MIN: Duration = Duration::from_millis(10);
const SUBMIT_BACKOFF_MAX: Duration = Duration::from_millis(200);
/// Idle forwarding connections kept per peer.
const FORWARD_IDLE_MAX: usize = 4;
/// Pauses of an observer's join attempts (doubling between them), and how long one
/// attempt may take.
const JOIN_BACKOFF_MIN: Duration = Duration::from_millis(50);
const JOIN_BACKOFF_MAX: Duration = Duration::from_secs(1);
const JOIN_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);
/// How often a joined observer asks again to be a learner (see `join_as_observer`).
const REJOIN_CHECK: Duration = Duration::from_secs(5);

/// A Raft log entry's payload: one batch of records ([`crate::encode_batch`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetadataEntry {
    pub batch: Vec<u8>,
}

/// What applying one entry did: its records got offsets `first_offset..next_offset`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetadataApplied {
    pub first_offset: i64,
    pub next_offset: i64,
}

openraft::declare_raft_types!(
    /// The openraft type configuration of the metadata quorum.
    pub TypeConfig:
        D = MetadataEntry,
        R = MetadataApplied,
        SnapshotData = Cursor<Vec<u8>>,
);

/// Parses `controller.quorum.voters`: `1@127.0.0.1:9093,2@127.0.0.1:9094,…`.
pub fn parse_voters(s: &str) -> Result<BTreeMap<u64, SocketAddr>, MetadataError> {
    let bad = |reason: String| MetadataError::Quorum(format!("controller.quorum.voters: {reason}"));
    let mut voters = BTreeMap::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (id, addr) = part
            .split_once('@')
            .ok_or_else(|| bad(format!("{part} is not id@host:port")))?;
        let id: u64 = id
            .parse()
            .map_err(|_| bad(format!("{id} is not a node id")))?;
        let addr: SocketAddr = addr
            .parse()
            .map_err(|_| bad(format!("{addr} is not a host:port address")))?;
        if voters.contains_key(&id) {
            return Err(bad(format!("node {id} listed twice")));
        }
        // Two voters at one address would each take the other's votes and entries.
        if let Some((other, _)) = voters.iter().find(|(_, a)| **a == addr) {
            return Err(bad(format!(
                "nodes {other} and {id} are both at {addr}; each voter needs its own address"
            )));
        }
        voters.insert(id, addr);
    }
    if voters.is_empty() {
        return Err(bad("no voters".into()));
    }
    Ok(voters)
}

/// Timing and transport of the quorum. The defaults suit a LAN; tests shorten them.
#[derive(Debug, Clone)]
pub struct QuorumConfig {
    pub heartbeat_interval_ms: u64,
    /// A voter that has not heard from a leader for a time drawn from
    /// `election_timeout_min_ms..election_timeout_max_ms` asks for pre-votes; a voter
    /// grants one only when it has not heard from a leader for `election_timeout_min_ms`
    /// either (or the leader's process is gone). See `pre_vote.rs`. The minimum must be
    /// above three heartbeat intervals.
    pub election_timeout_min_ms: u64,
    pub election_timeout_max_ms: u64,
    /// Take a snapshot (and purge the log before it) every this many entries.
    pub snapshot_every_entries: u64,
    /// The active controller's configuration, used by this node's event loop while it
    /// leads.
    pub controller: ControllerConfig,
    /// How quorum connections are dialed and accepted (plain TCP unless the broker
    /// hands in the controller listener's TLS/SASL; see `transport.rs`).
    pub transport: Arc<dyn QuorumTransport>,
}

impl Default for QuorumConfig {
    fn default() -> Self {
        Self {
            heartbeat_interval_ms: 100,
            election_timeout_min_ms: 500,
            election_timeout_max_ms: 1_000,
            snapshot_every_entries: 5_000,
            controller: ControllerConfig::default(),
            transport: Arc::new(Plaintext),
        }
    }
}

/// What [`MetadataQuorum::read_committed`] returns.
#[derive(Debug, Clone, PartialEq)]
pub enum CommittedRecords {
    /// The committed records from the requested offset on, with their offsets (empty
    /// when the reader is up to date).
    Records(Vec<(i64, MetadataRecord)>),
    /// The reader is behind what is kept in memory (or behind a snapshot): here is the
    /// whole committed image; continue from its `next_offset`.
    Image(Box<MetadataImage>),
}

/// A running quorum node: a voter, or an observer (see the module docs).
pub struct MetadataQuorum {
    node_id: u64,
    raft: Raft<TypeConfig>,
    shared: Arc<state_machine::Shared>,
    server: JoinHandle<()>,
    local_addr: SocketAddr,
    voters: BTreeMap<u64, SocketAddr>,
    /// This node's controller event loop (see `event_loop.rs`); `None` on an observer.
    events: Option<mpsc::Sender<Submission>>,
    event_loop: Option<JoinHandle<()>>,
    /// An observer's task that asks to be added as a learner, and asks again now and
    /// then in case it was removed.
    join: Option<JoinHandle<()>>,
    /// A voter's election timer, which holds elections behind a pre-vote.
    election: Option<JoinHandle<()>>,
    /// A test's partition of this node (`pre_vote::Isolation`); the RPC paths hold
    /// their own handles, this one is for the test's switch.
    #[cfg_attr(not(test), allow(dead_code))]
    isolation: Arc<Isolation>,
    /// Idle connections to peers for forwarded submissions; never locked across an
    /// await.
    forward_idle: Mutex<BTreeMap<u64, Vec<QuorumStream>>>,
    /// How this node dials its peers (the quorum config's).
    transport: Arc<dyn QuorumTransport>,
    /// Round-robin position over the voters, for an observer that knows no leader yet.
    next_voter: AtomicUsize,
}

/// The voters of the membership `raft` has applied, with their quorum addresses (the
/// address each was added with, else the configured one); the `configured` voters until
/// a membership is applied (a node that never started). KIP-853's changes (AddRaftVoter,
/// RemoveRaftVoter) move the membership, not the configuration, so this is what counts.
pub(crate) fn voter_addrs(
    raft: &Raft<TypeConfig>,
    configured: &BTreeMap<u64, SocketAddr>,
) -> BTreeMap<u64, SocketAddr> {
    let m = raft.metrics();
    let m = m.borrow();
    let membership = m.membership_config.membership();
    let voters: BTreeMap<u64, SocketAddr> = membership
        .voter_ids()
        .filter_map(|id| {
            // A single node's implicit quorum records port 0 (its listener's before
            // binding): the configured address is the reachable one then.
            let addr = membership
                .get_node(&id)
                .and_then(|n| n.addr.parse::<SocketAddr>().ok())
                .filter(|a| a.port() != 0)
                .or_else(|| configured.get(&id).copied())?;
            Some((id, addr))
        })
        .collect();
    if voters.is_empty() {
        configured.clone()
    } else {
        voters
    }
}

fn quorum_err(e: impl std::fmt::Display) -> MetadataError {
    MetadataError::Quorum(e.to_string())
}

/// Appends `records` as one batch through `raft` and waits until it is committed and
/// applied here.
pub(crate) async fn propose_batch(
    raft: &Raft<TypeConfig>,
    records: &[MetadataRecord],
) -> Result<MetadataApplied, MetadataError> {
    let batch = encode_batch(records)?.to_vec();
    match raft.client_write(MetadataEntry { batch }).await {
        Ok(resp) => Ok(resp.data),
        Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
            Err(MetadataError::NotController {
                leader_id: f.leader_id,
            })
        }
        Err(e) => Err(quorum_err(e)),
    }
}

/// See [`MetadataQuorum::leader_image`].
pub(crate) async fn leader_image_of(
    raft: &Raft<TypeConfig>,
    shared: &Shared,
) -> Result<MetadataImage, MetadataError> {
    match raft.ensure_linearizable().await {
        Ok(_) => Ok(shared.lock().image.clone()),
        Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(f))) => {
            Err(MetadataError::NotController {
                leader_id: f.leader_id,
            })
        }
        Err(e) => Err(quorum_err(e)),
    }
}

impl MetadataQuorum {
    /// Starts this node with default timing.
    pub async fn start(
        node_id: u64,
        voters: BTreeMap<u64, SocketAddr>,
        dir: impl AsRef<Path>,
    ) -> Result<MetadataQuorum, MetadataError> {
        Self::start_with(node_id, voters, dir, QuorumConfig::default()).await
    }

    /// Starts this node as a voter: opens its log and snapshot in `dir`, listens on its own
    /// voter address, joins (or initializes) the quorum, and runs the controller event
    /// loop with `config.controller`.
    pub async fn start_with(
        node_id: u64,
        voters: BTreeMap<u64, SocketAddr>,
        dir: impl AsRef<Path>,
        config: QuorumConfig,
    ) -> Result<MetadataQuorum, MetadataError> {
        let own = *voters
            .get(&node_id)
            .ok_or_else(|| quorum_err(format!("node {node_id} is not among the voters")))?;
        Self::start_controller_at(node_id, own, voters, dir.as_ref(), config, true).await
    }

    /// Starts a controller that is not among the configured `voters` (KIP-853): it
    /// listens on `listen`, asks to follow the log as an observer (a learner) and runs
    /// the controller event loop and the pre-vote timer as a voter does, which act only
    /// once the membership names it a voter — after AddRaftVoter, or at a restart of a
    /// node added earlier. `listen` must be an address the voters can reach.
    pub async fn start_controller(
        node_id: u64,
        listen: SocketAddr,
        voters: BTreeMap<u64, SocketAddr>,
        dir: impl AsRef<Path>,
        config: QuorumConfig,
    ) -> Result<MetadataQuorum, MetadataError> {
        if listen.ip().is_unspecified() {
            return Err(quorum_err(format!(
                "a controller's quorum address must be one the voters can reach, not {listen}"
            )));
        }
        Self::start_controller_at(node_id, listen, voters, dir.as_ref(), config, false).await
    }

    /// A controller node at `own`: one of the configured voters (`bootstrap`: it
    /// initializes the membership on the cluster's first start), or one that joins.
    async fn start_controller_at(
        node_id: u64,
        own: SocketAddr,
        voters: BTreeMap<u64, SocketAddr>,
        dir: &Path,
        config: QuorumConfig,
        bootstrap: bool,
    ) -> Result<MetadataQuorum, MetadataError> {
        let (raft, shared, listener, dials, isolation) =
            open(node_id, own, &voters, dir, &config).await?;
        let local_addr = listener.local_addr().map_err(quorum_err)?;
        let (events, events_rx) = mpsc::channel(EVENT_QUEUE_CAPACITY);
        let event_loop = tokio::spawn(
            EventLoop::new(
                node_id,
                raft.clone(),
                shared.clone(),
                config.controller.clone(),
                dials,
                Duration::from_millis(config.election_timeout_min_ms),
            )
            .run(events_rx),
        );
        let timer = Arc::new(ElectionTimer::new(
            node_id,
            voters.clone(),
            raft.clone(),
            &config,
            isolation.clone(),
        ));
        let election = tokio::spawn(timer.clone().run());
        let server = tokio::spawn(network::serve(
            listener,
            raft.clone(),
            shared.clone(),
            Some(events.clone()),
            Some(timer),
            isolation.clone(),
            config.transport.clone(),
        ));
        let members: BTreeMap<u64, BasicNode> = voters
            .iter()
            .map(|(id, addr)| (*id, BasicNode::new(addr.to_string())))
            .collect();
        // Every controller runs the join task: one that is no voter (yet, or any more:
        // RemoveRaftVoter) follows the log as an observer; a voter's task only waits.
        let join = Some(tokio::spawn(join_as_observer(
            node_id,
            local_addr,
            voters.clone(),
            raft.clone(),
            config.transport.clone(),
        )));
        let quorum = MetadataQuorum {
            node_id,
            raft,
            shared,
            server,
            local_addr,
            voters,
            events: Some(events),
            event_loop: Some(event_loop),
            join,
            election: Some(election),
            isolation,
            forward_idle: Mutex::new(BTreeMap::new()),
            transport: config.transport.clone(),
            next_voter: AtomicUsize::new(0),
        };
        if !bootstrap {
            return Ok(quorum);
        }
        match quorum.raft.initialize(members).await {
            Ok(()) => {}
            // Already initialized (a restart, or a peer's entries arrived first).
            Err(RaftError::APIError(InitializeError::NotAllowed(_))) => {}
            Err(e) => {
                let _ = quorum.shutdown().await;
                return Err(quorum_err(e));
            }
        }
        Ok(quorum)
    }

    /// Starts this node as an observer (a broker that is not a controller): opens its
    /// log and snapshot in `dir`, listens on `listen` for the leader's replication, and
    /// asks the active controller, found through `voters`, to add it as a learner (in the
    /// background, retrying until it is in; see the module docs). It never votes, never
    /// stands for election and runs no controller loop; [`MetadataQuorum::submit`]
    /// forwards to the active controller.
    ///
    /// `listen` must be an address the voters can reach (not 0.0.0.0): it is the one
    /// they are told to replicate to (its port may be 0: the one bound is told).
    pub async fn start_observer(
        node_id: u64,
        listen: SocketAddr,
        voters: BTreeMap<u64, SocketAddr>,
        dir: impl AsRef<Path>,
        config: QuorumConfig,
    ) -> Result<MetadataQuorum, MetadataError> {
        if voters.contains_key(&node_id) {
            return Err(quorum_err(format!(
                "node {node_id} is a voter, so it cannot start as an observer"
            )));
        }
        if listen.ip().is_unspecified() {
            return Err(quorum_err(format!(
                "an observer's quorum address must be one the voters can reach, not {listen}"
            )));
        }
        // An observer never leads, so what its dials find decides nothing.
        let (raft, shared, listener, _dials, isolation) =
            open(node_id, listen, &voters, dir.as_ref(), &config).await?;
        let local_addr = listener.local_addr().map_err(quorum_err)?;
        let server = tokio::spawn(network::serve(
            listener,
            raft.clone(),
            shared.clone(),
            None,
            None,
            isolation.clone(),
            config.transport.clone(),
        ));
        let join = tokio::spawn(join_as_observer(
            node_id,
            local_addr,
            voters.clone(),
            raft.clone(),
            config.transport.clone(),
        ));
        Ok(MetadataQuorum {
            node_id,
            raft,
            shared,
            server,
            local_addr,
            voters,
            events: None,
            event_loop: None,
            join: Some(join),
            election: None,
            isolation,
            forward_idle: Mutex::new(BTreeMap::new()),
            transport: config.transport.clone(),
            next_voter: AtomicUsize::new(0),
        })
    }

    pub fn node_id(&self) -> u64 {
        self.node_id
    }

    /// The address the quorum listener is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// This node is the quorum's leader, i.e. the active controller.
    pub fn is_leader(&self) -> bool {
        let m = self.raft.metrics();
        let m = m.borrow();
        m.state == ServerState::Leader && m.current_leader == Some(self.node_id)
    }

    /// The leader this node knows of.
    pub fn leader_id(&self) -> Option<u64> {
        self.raft.metrics().borrow().current_leader
    }

    /// The Raft term: the controller epoch.
    pub fn controller_epoch(&self) -> u64 {
        self.raft.metrics().borrow().current_term
    }

    /// This node is one of the voters (a controller); `false` on an observer, and on a
    /// controller that is not a voter yet (or no more: KIP-853).
    pub fn is_voter(&self) -> bool {
        self.current_voters().contains_key(&self.node_id)
    }

    /// The voters now and their quorum addresses (see [`voter_addrs`]).
    pub fn current_voters(&self) -> BTreeMap<u64, SocketAddr> {
        voter_addrs(&self.raft, &self.voters)
    }

    /// This node is in the membership it has applied, as a voter or as a learner (an
    /// observer is once its join is committed and replicated to it).
    pub fn is_member(&self) -> bool {
        self.raft
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .get_node(&self.node_id)
            .is_some()
    }

    /// The observers (learners) in this node's membership, with the address each is
    /// replicated to.
    pub fn observers(&self) -> BTreeMap<u64, String> {
        let m = self.raft.metrics();
        let m = m.borrow();
        let membership = m.membership_config.membership();
        membership
            .learner_ids()
            .filter_map(|id| membership.get_node(&id).map(|n| (id, n.addr.clone())))
            .collect()
    }

    /// The voters' quorum addresses, as configured.
    pub fn voter_addrs(&self) -> &BTreeMap<u64, SocketAddr> {
        &self.voters
    }

    /// The voters this node has in its committed membership.
    pub fn voters(&self) -> BTreeSet<u64> {
        self.raft
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .voter_ids()
            .collect()
    }

    /// Appends `records` as one batch and waits until it is committed and applied here.
    /// Returns the offset of the first record. Only the leader accepts proposals; any
    /// other node answers [`MetadataError::NotController`] with the leader it knows.
    ///
    /// The controller event loop proposes its own decisions; records proposed here go
    /// around it, and it re-reads its image when it notices them. The broker shell uses
    /// [`MetadataQuorum::submit`].
    pub async fn propose(&self, records: Vec<MetadataRecord>) -> Result<i64, MetadataError> {
        propose_batch(&self.raft, &records)
            .await
            .map(|applied| applied.first_offset)
    }

    /// On the leader: the committed image once every entry of earlier terms is applied,
    /// which is what the active controller must decide from.
    pub async fn leader_image(&self) -> Result<MetadataImage, MetadataError> {
        leader_image_of(&self.raft, &self.shared).await
    }

    /// Hands `event` to the active controller wherever it runs: this node's own event
    /// loop when it leads, else the leader over the quorum RPC. Retries
    /// [`MetadataError::NotController`] and an unreachable leader (waiting for an
    /// election, with a bounded backoff) until `timeout`; then answers the last
    /// NotController, or [`MetadataError::Timeout`] when an attempt was still under way.
    /// Returns once the decision's records are committed (on the controller's node; see
    /// [`SubmitResult::next_offset`] for this one).
    ///
    /// A retried event may have been decided already by a controller that lost its
    /// leadership while committing it; the controller's answers to a repeat (a topic
    /// that already exists, …) are then what the caller sees, as with Kafka's
    /// NOT_CONTROLLER retries.
    pub async fn submit(
        &self,
        event: ControllerEvent,
        timeout: Duration,
    ) -> Result<SubmitResult, MetadataError> {
        let deadline = Instant::now() + timeout;
        let mut backoff = SUBMIT_BACKOFF_MIN;
        let mut hint: Option<u64> = None;
        let mut last = MetadataError::NotController { leader_id: None };
        loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(last);
            }
            let target = hint
                .take()
                .or_else(|| self.leader_id())
                .or_else(|| self.any_voter());
            let attempt = async {
                match target {
                    Some(id) if id == self.node_id => self.submit_local(event.clone()).await,
                    Some(id) => self.forward(id, event.clone(), remaining).await,
                    None => Err(MetadataError::NotController { leader_id: None }),
                }
            };
            match tokio::time::timeout(remaining, attempt).await {
                Err(_) => return Err(MetadataError::Timeout { timeout }),
                Ok(Ok(result)) => return Ok(result),
                Ok(Err(MetadataError::NotController { leader_id })) => {
                    // A peer that is not the leader names the one it knows; try it next.
                    hint = leader_id.filter(|l| Some(*l) != target);
                    last = MetadataError::NotController { leader_id };
                }
                Ok(Err(MetadataError::Unreachable { node_id, reason })) => {
                    tracing::debug!(node_id, %reason, "controller unreachable; retrying");
                    last = MetadataError::NotController { leader_id: None };
                    // An observer may know a dead leader until the new one replicates
                    // to it: ask the voters meanwhile.
                    hint = self.any_voter().filter(|v| Some(*v) != target);
                }
                Ok(Err(e)) => return Err(e),
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            tokio::time::sleep(backoff.min(remaining)).await;
            backoff = (backoff * 2).min(SUBMIT_BACKOFF_MAX);
        }
    }

    /// Puts `event` on this node's event loop and waits for its answer (NotController
    /// unless this node leads; always on an observer, which has no loop).
    pub(crate) async fn submit_local(
        &self,
        event: ControllerEvent,
    ) -> Result<SubmitResult, MetadataError> {
        match &self.events {
            Some(events) => submit_to_loop(events, event).await,
            None => Err(MetadataError::NotController {
                leader_id: self.leader_id().filter(|l| *l != self.node_id),
            }),
        }
    }

    /// On an observer that knows no leader: the next voter in turn, to ask for the leader
    /// (a voter that does not lead answers with the one it knows). `None` on a voter,
    /// which learns the leader from Raft and forwards nothing before it does.
    fn any_voter(&self) -> Option<u64> {
        if self.is_voter() {
            return None;
        }
        let i = self.next_voter.fetch_add(1, Ordering::Relaxed);
        let voters = self.current_voters();
        voters.keys().nth(i % voters.len().max(1)).copied()
    }

    /// Sends `event` to node `node_id`'s event loop over the quorum RPC.
    async fn forward(
        &self,
        node_id: u64,
        event: ControllerEvent,
        ttl: Duration,
    ) -> Result<SubmitResult, MetadataError> {
        let unreachable = |reason: String| MetadataError::Unreachable { node_id, reason };
        let addr = *self
            .current_voters()
            .get(&node_id)
            .ok_or_else(|| unreachable("not among the voters".into()))?;
        let idle = self
            .forward_idle
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_mut(&node_id)
            .and_then(Vec::pop);
        let mut stream = match idle {
            Some(s) => s,
            None => self
                .transport
                .dial(addr)
                .await
                .map_err(|e| unreachable(e.to_string()))?,
        };
        // On a timeout the stream is dropped with the future: it may hold half a frame.
        let answer = tokio::time::timeout(ttl, network::call_controller(&mut stream, event))
            .await
            .map_err(|_| unreachable("no answer in time".into()))?
            .map_err(|e| unreachable(e.to_string()))?;
        {
            let mut idle = self.forward_idle.lock().unwrap_or_else(|p| p.into_inner());
            let conns = idle.entry(node_id).or_default();
            if conns.len() < FORWARD_IDLE_MAX {
                conns.push(stream);
            }
        }
        answer.map_err(|e| match e {
            ForwardError::NotController { leader_id } => MetadataError::NotController { leader_id },
            ForwardError::Other(reason) => MetadataError::Quorum(reason),
        })
    }

    /// The quorum's state as its leader sees it (DescribeQuorum), asked of the leader
    /// when this node is not it, following the leader each voter names, within
    /// `timeout`.
    /// The quorum as this node sees it when it leads (each replica's log end and last
    /// contact), else `None`: what the active controller's metrics page serves without
    /// asking anyone.
    pub fn describe_if_leader(&self) -> Option<QuorumDescription> {
        describe::describe_local(&self.raft, &self.shared.contacts).ok()
    }

    pub async fn describe(&self, timeout: Duration) -> Result<QuorumDescription, MetadataError> {
        let deadline = Instant::now() + timeout;
        let mut hint: Option<u64> = None;
        let mut last = MetadataError::NotController { leader_id: None };
        let mut turn = 0usize;
        loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(last);
            }
            let voters = self.current_voters();
            let target = hint.take().or_else(|| self.leader_id()).or_else(|| {
                turn += 1;
                voters.keys().nth(turn % voters.len().max(1)).copied()
            });
            let answer = match target {
                Some(id) if id == self.node_id => {
                    describe::describe_local(&self.raft, &self.shared.contacts)
                }
                Some(id) => {
                    let Some(addr) = voters.get(&id).copied() else {
                        return Err(last);
                    };
                    let attempt = async {
                        let mut stream = self.transport.dial(addr).await?;
                        network::call_describe_quorum(&mut stream).await
                    };
                    match tokio::time::timeout(remaining, attempt).await {
                        Ok(Ok(answer)) => answer,
                        Ok(Err(e)) => {
                            last = MetadataError::Unreachable {
                                node_id: id,
                                reason: e.to_string(),
                            };
                            tokio::time::sleep(SUBMIT_BACKOFF_MIN.min(remaining)).await;
                            continue;
                        }
                        Err(_) => return Err(MetadataError::Timeout { timeout }),
                    }
                }
                None => return Err(last),
            };
            match answer {
                Ok(description) => return Ok(description),
                Err(ForwardError::NotController { leader_id }) => {
                    hint = leader_id.filter(|l| Some(*l) != target);
                    last = MetadataError::NotController { leader_id };
                    tokio::time::sleep(SUBMIT_BACKOFF_MIN.min(remaining)).await;
                }
                Err(ForwardError::Other(reason)) => return Err(MetadataError::Quorum(reason)),
            }
        }
    }

    /// AddRaftVoter (KIP-853): makes `node_id`, whose quorum port is `addr`, a voter;
    /// asked of the leader wherever it is, within `timeout`.
    pub async fn add_voter(
        &self,
        node_id: u64,
        addr: SocketAddr,
        timeout: Duration,
    ) -> Result<(), VoterChangeError> {
        let request = || network::RpcRequest::AddVoter {
            node_id,
            addr: addr.to_string(),
        };
        let raft = self.raft.clone();
        self.change_voters(request, timeout, move || {
            let raft = raft.clone();
            let addr = addr.to_string();
            async move { network::add_voter(&raft, node_id, addr).await }
        })
        .await
    }

    /// RemoveRaftVoter (KIP-853): `node_id` votes no more (it stays an observer); asked
    /// of the leader wherever it is, within `timeout`.
    pub async fn remove_voter(
        &self,
        node_id: u64,
        timeout: Duration,
    ) -> Result<(), VoterChangeError> {
        let request = || network::RpcRequest::RemoveVoter { node_id };
        let raft = self.raft.clone();
        self.change_voters(request, timeout, move || {
            let raft = raft.clone();
            async move { network::remove_voter(&raft, node_id).await }
        })
        .await
    }

    /// A change of the voters, made here when this node leads, else sent to the leader
    /// (following the leader each voter names) until `timeout`.
    async fn change_voters<F, Fut>(
        &self,
        request: impl Fn() -> network::RpcRequest,
        timeout: Duration,
        local: F,
    ) -> Result<(), VoterChangeError>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<(), VoterChangeError>>,
    {
        let timed_out = || VoterChangeError::Refused {
            error_code: rill_protocol::ErrorCode::REQUEST_TIMED_OUT.code(),
            message: format!("no answer from the quorum's leader within {timeout:?}"),
        };
        let deadline = Instant::now() + timeout;
        let mut hint: Option<u64> = None;
        let mut turn = 0usize;
        loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                return Err(timed_out());
            }
            let voters = self.current_voters();
            let target = hint.take().or_else(|| self.leader_id()).or_else(|| {
                turn += 1;
                voters.keys().nth(turn % voters.len().max(1)).copied()
            });
            let answer = match target {
                Some(id) if id == self.node_id => {
                    match tokio::time::timeout(remaining, local()).await {
                        Ok(answer) => answer,
                        Err(_) => return Err(timed_out()),
                    }
                }
                Some(id) => {
                    let Some(addr) = voters.get(&id).copied() else {
                        return Err(timed_out());
                    };
                    let attempt = async {
                        let mut stream = self.transport.dial(addr).await?;
                        network::call_change_voters(&mut stream, request()).await
                    };
                    match tokio::time::timeout(remaining, attempt).await {
                        Ok(Ok(answer)) => answer,
                        Ok(Err(_)) => Err(VoterChangeError::NotController { leader_id: None }),
                        Err(_) => return Err(timed_out()),
                    }
                }
                None => Err(VoterChangeError::NotController { leader_id: None }),
            };
            match answer {
                Err(VoterChangeError::NotController { leader_id }) => {
                    hint = leader_id.filter(|l| Some(*l) != target);
                    tokio::time::sleep(SUBMIT_BACKOFF_MAX.min(remaining)).await;
                }
                other => return other,
            }
        }
    }

    /// The image of every record committed and applied on this node so far.
    pub fn image(&self) -> MetadataImage {
        self.shared.lock().image.clone()
    }

    /// The offset the next committed record will get.
    pub fn committed_offset(&self) -> i64 {
        *self.shared.committed.borrow()
    }

    /// Changes whenever records are committed here; its value is
    /// [`MetadataQuorum::committed_offset`].
    pub fn subscribe(&self) -> watch::Receiver<i64> {
        self.shared.committed.subscribe()
    }

    /// The committed records from `from_offset` on (see [`CommittedRecords`]).
    pub fn read_committed(&self, from_offset: i64) -> CommittedRecords {
        let st = self.shared.lock();
        let next = st.image.next_offset;
        if from_offset >= next {
            return CommittedRecords::Records(Vec::new());
        }
        match st.tail.front() {
            Some((first, _)) if *first <= from_offset => {
                let skip = usize::try_from(from_offset - first).unwrap_or(usize::MAX);
                CommittedRecords::Records(st.tail.iter().skip(skip).cloned().collect())
            }
            _ => CommittedRecords::Image(Box::new(st.image.clone())),
        }
    }

    /// Waits until records up to (not including) `offset` are committed here, or
    /// `timeout` passes; returns whether they were.
    pub async fn wait_for_offset(&self, offset: i64, timeout: Duration) -> bool {
        let mut rx = self.subscribe();
        tokio::time::timeout(timeout, rx.wait_for(|next| *next >= offset))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// Resolves when Raft has stopped on its own: a write or fsync of the metadata log or
    /// of the vote failed (openraft then stops this node for good), or Raft panicked.
    /// Never resolves while Raft runs. The node cannot take part in the quorum any more,
    /// and its image stops at what it had applied; the caller halts the process, as
    /// Kafka's brokers and controllers do on a metadata-log fault, rather than serve
    /// from that frozen image.
    pub async fn fatal(&self) -> String {
        let mut metrics = self.raft.metrics();
        loop {
            if let Err(fatal) = &metrics.borrow_and_update().running_state {
                return fatal.to_string();
            }
            if metrics.changed().await.is_err() {
                return "the Raft core stopped without saying why".to_owned();
            }
        }
    }

    /// Stops Raft and the listener. The files stay; a later start recovers from them.
    pub async fn shutdown(self) -> Result<(), MetadataError> {
        self.abort_tasks();
        self.raft.shutdown().await.map_err(quorum_err)
    }

    fn abort_tasks(&self) {
        self.server.abort();
        for task in [&self.event_loop, &self.join, &self.election]
            .into_iter()
            .flatten()
        {
            task.abort();
        }
    }

    /// Cuts this node off from its peers (`on`), or heals it: its quorum RPCs time out
    /// both ways, as behind a network partition.
    #[cfg(test)]
    pub(crate) fn isolate(&self, on: bool) {
        self.isolation.set(on);
    }
}

impl Drop for MetadataQuorum {
    fn drop(&mut self) {
        self.abort_tasks();
    }
}

/// What `open` hands back: Raft, the state machine's shared half, the quorum listener
/// (not yet served), the dial log, and the node's test partition switch.
type Opened = (
    Raft<TypeConfig>,
    Arc<Shared>,
    TcpListener,
    Arc<DialLog>,
    Arc<Isolation>,
);

/// What voters and observers share: the log and state machine in `dir`, Raft over them,
/// and the quorum listener bound to `listen` (not yet served).
async fn open(
    node_id: u64,
    listen: SocketAddr,
    voters: &BTreeMap<u64, SocketAddr>,
    dir: &Path,
    config: &QuorumConfig,
) -> Result<Opened, MetadataError> {
    if config.election_timeout_min_ms <= config.heartbeat_interval_ms * 3
        || config.election_timeout_max_ms < config.election_timeout_min_ms
    {
        return Err(quorum_err(format!(
            "the election timeout ({}..{} ms) must start above three heartbeat intervals ({} ms)",
            config.election_timeout_min_ms,
            config.election_timeout_max_ms,
            config.heartbeat_interval_ms
        )));
    }
    let io = |source: std::io::Error| MetadataError::Io {
        path: dir.display().to_string(),
        source,
    };
    let log_store = LogStore::open(dir).map_err(io)?;
    let state_machine = StateMachineStore::open(dir).map_err(io)?;
    let shared = state_machine.shared.clone();
    let listener = TcpListener::bind(listen).await.map_err(io)?;
    // openraft's election timeout is only its followers' leader lease here (they refuse
    // votes for `election_timeout_max` after a heartbeat): its own timer never elects,
    // the pre-vote timer does (`pre_vote.rs`), and only on voters. An observer never
    // stands, whatever its membership says, so it can never disturb the voters' terms.
    let raft_lease_ms = pre_vote::raft_lease_ms(config);
    let raft_config = Config {
        cluster_name: "rill-metadata".into(),
        heartbeat_interval: config.heartbeat_interval_ms,
        election_timeout_min: config.heartbeat_interval_ms + 1,
        election_timeout_max: raft_lease_ms,
        snapshot_policy: SnapshotPolicy::LogsSinceLast(config.snapshot_every_entries),
        max_in_snapshot_log_to_keep: 100,
        enable_elect: false,
        ..Default::default()
    }
    .validate()
    .map_err(quorum_err)?;
    let dials = Arc::new(DialLog::default());
    let isolation = Arc::new(Isolation::default());
    let network = TcpNetworkFactory {
        voters: voters.clone(),
        dials: dials.clone(),
        isolation: isolation.clone(),
        shared: shared.clone(),
        transport: config.transport.clone(),
    };
    let raft = Raft::new(
        node_id,
        Arc::new(raft_config),
        network,
        log_store,
        state_machine,
    )
    .await
    .map_err(quorum_err)?;
    Ok((raft, shared, listener, dials, isolation))
}

/// An observer's join: asks the leader it knows (else each voter in turn, which names
/// the leader when it is not one) to add it as a learner at `addr`, until one says it is
/// in. Bounded per attempt, with a doubling pause between attempts; it never gives up,
/// because a broker whose controllers are not up yet must join when they come.
async fn join_as_observer(
    node_id: u64,
    addr: SocketAddr,
    voters: BTreeMap<u64, SocketAddr>,
    raft: Raft<TypeConfig>,
    transport: Arc<dyn QuorumTransport>,
) {
    let mut backoff = JOIN_BACKOFF_MIN;
    let mut hint: Option<u64> = None;
    // After a failed attempt at the leader this node knew (it may be dead, and an
    // observer that is not a member yet hears of no new one), ask the voters instead.
    let mut skip_known = false;
    let mut round = 0usize;
    let mut joined = false;
    loop {
        let (is_voter, no_voters) = {
            let m = raft.metrics();
            let m = m.borrow();
            let membership = m.membership_config.membership();
            let no_voters = membership.voter_ids().next().is_none();
            (membership.voter_ids().any(|v| v == node_id), no_voters)
        };
        // A voter has nothing to join; nor has a configured voter whose membership is
        // not applied yet (it starts the quorum, or hears of it, in a moment).
        if is_voter || no_voters && voters.contains_key(&node_id) {
            tokio::time::sleep(REJOIN_CHECK).await;
            continue;
        }
        // The voters as this node knows them (its membership once it has one: a voter
        // added since the configuration was written is asked too), never itself.
        let current = voter_addrs(&raft, &voters);
        let others: Vec<u64> = current.keys().copied().filter(|v| *v != node_id).collect();
        let known = raft
            .metrics()
            .borrow()
            .current_leader
            .filter(|l| *l != node_id);
        let target = match (hint.take().filter(|h| *h != node_id), known) {
            (Some(h), _) => h,
            (None, Some(k)) if !skip_known && current.contains_key(&k) => k,
            _ if others.is_empty() => {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(JOIN_BACKOFF_MAX);
                continue;
            }
            _ => {
                round = round.wrapping_add(1);
                others[round % others.len()]
            }
        };
        skip_known = false;
        let Some(target_addr) = current.get(&target).copied() else {
            tokio::time::sleep(backoff).await;
            continue;
        };
        let attempt = async {
            let mut stream = transport.dial(target_addr).await?;
            network::call_add_observer(&mut stream, node_id, addr.to_string()).await
        };
        match tokio::time::timeout(JOIN_ATTEMPT_TIMEOUT, attempt).await {
            Ok(Ok(Ok(()))) => {
                if !joined {
                    tracing::info!(node_id, %addr, controller = target, "joined the metadata quorum as an observer");
                    joined = true;
                }
                // Asked again now and then (the answer is immediate for a member): an
                // operator may have unregistered this broker while it was cut off, which
                // removes it from the learners, and it would hear no more of the log.
                backoff = JOIN_BACKOFF_MIN;
                tokio::time::sleep(REJOIN_CHECK).await;
                continue;
            }
            Ok(Ok(Err(ForwardError::NotController { leader_id }))) => {
                hint = leader_id.filter(|l| *l != target);
            }
            Ok(Ok(Err(ForwardError::Other(reason)))) => {
                tracing::warn!(controller = target, %reason, "not added to the metadata quorum yet; retrying");
            }
            Ok(Err(e)) => {
                skip_known = true;
                tracing::debug!(controller = target, error = %e, "controller unreachable; retrying the join");
            }
            Err(_) => {
                skip_known = true;
                tracing::debug!(controller = target, "join attempt timed out; retrying");
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(JOIN_BACKOFF_MAX);
    }
}

/// Hands `event` to the active controller from a process that is not (yet) part of the
/// quorum: asks the voters in turn, following the leader each names, until one answers
/// or `timeout` passes. A broker that has no `node.id` registers this way to have one
/// generated (`broker.id.generation.enable`) before it can join as an observer, which
/// needs its id. `transport` dials the voters as the quorum would.
pub async fn submit_to_voters(
    voters: &BTreeMap<u64, SocketAddr>,
    event: ControllerEvent,
    timeout: Duration,
    transport: &dyn QuorumTransport,
) -> Result<SubmitResult, MetadataError> {
    let deadline = Instant::now() + timeout;
    let mut backoff = SUBMIT_BACKOFF_MIN;
    let mut hint: Option<u64> = None;
    let mut turn = 0usize;
    let mut last = MetadataError::NotController { leader_id: None };
    loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() || voters.is_empty() {
            return Err(last);
        }
        let target = hint
            .take()
            .filter(|h| voters.contains_key(h))
            .unwrap_or_else(|| {
                turn += 1;
                voters
                    .keys()
                    .nth(turn % voters.len())
                    .copied()
                    .unwrap_or_default()
            });
        let Some(addr) = voters.get(&target).copied() else {
            return Err(last);
        };
        let attempt = async {
            let mut stream = transport.dial(addr).await?;
            network::call_controller(&mut stream, event.clone()).await
        };
        match tokio::time::timeout(remaining, attempt).await {
            Ok(Ok(Ok(result))) => return Ok(result),
            Ok(Ok(Err(ForwardError::NotController { leader_id }))) => {
                hint = leader_id;
                last = MetadataError::NotController { leader_id };
            }
            Ok(Ok(Err(ForwardError::Other(reason)))) => return Err(MetadataError::Quorum(reason)),
            Ok(Err(e)) => {
                last = MetadataError::Unreachable {
                    node_id: target,
                    reason: e.to_string(),
                }
            }
            Err(_) => return Err(MetadataError::Timeout { timeout }),
        }
        let remaining = deadline.saturating_duration_since(Instant::now());
        tokio::time::sleep(backoff.min(remaining)).await;
        backoff = (backoff * 2).min(SUBMIT_BACKOFF_MAX);
    }
}

/// Puts `event` on an event loop's queue and waits for its answer.
pub(crate) async fn submit_to_loop(
    events: &mpsc::Sender<Submission>,
    event: ControllerEvent,
) -> Result<SubmitResult, MetadataError> {
    let stopped = || MetadataError::Quorum("the controller event loop has stopped".into());
    let (reply, answer) = oneshot::channel();
    events
        .send(Submission {
            event,
            reply,
            queued_at: std::time::Instant::now(),
        })
        .await
        .map_err(|_| stopped())?;
    answer.await.map_err(|_| stopped())?
}
