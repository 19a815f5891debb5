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

mod event_loop;
mod log_store;
mod network;
mod state_machine;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Cursor;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::error::{CheckIsLeaderError, ClientWriteError, InitializeError, RaftError};
use openraft::{BasicNode, Config, Raft, ServerState, SnapshotPolicy};
use serde::{Deserialize, Serialize};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

pub use log_store::LogStore;
pub use network::{TcpNetwork, TcpNetworkFactory, MAX_RPC_BYTES};
pub use state_machine::StateMachineStore;

use crate::api::{ControllerEvent, SubmitResult};
use crate::controller::ControllerConfig;
use crate::error::MetadataError;
use crate::image::MetadataImage;
use crate::record::{encode_batch, MetadataRecord};
use event_loop::{EventLoop, Submission, EVENT_QUEUE_CAPACITY};
use network::ForwardError;
use state_machine::Shared;

/// First pause of [`MetadataQuorum::submit`] between attempts; it doubles up to
/// [`SUBMIT_BACKOFF_MAX`].
const SUBMIT_BACKOFF_MIN: Duration = Duration::from_millis(10);
const SUBMIT_BACKOFF_MAX: Duration = Duration::from_millis(200);
/// Idle forwarding connections kept per peer.
const FORWARD_IDLE_MAX: usize = 4;

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
        if voters.insert(id, addr).is_some() {
            return Err(bad(format!("node {id} listed twice")));
        }
    }
    if voters.is_empty() {
        return Err(bad("no voters".into()));
    }
    Ok(voters)
}

/// Timing of the quorum. The defaults suit a LAN; tests shorten them.
#[derive(Debug, Clone)]
pub struct QuorumConfig {
    pub heartbeat_interval_ms: u64,
    pub election_timeout_min_ms: u64,
    pub election_timeout_max_ms: u64,
    /// Take a snapshot (and purge the log before it) every this many entries.
    pub snapshot_every_entries: u64,
    /// The active controller's configuration, used by this node's event loop while it
    /// leads.
    pub controller: ControllerConfig,
}

impl Default for QuorumConfig {
    fn default() -> Self {
        Self {
            heartbeat_interval_ms: 100,
            election_timeout_min_ms: 500,
            election_timeout_max_ms: 1_000,
            snapshot_every_entries: 5_000,
            controller: ControllerConfig::default(),
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
    Image(MetadataImage),
}

/// A running quorum node.
pub struct MetadataQuorum {
    node_id: u64,
    raft: Raft<TypeConfig>,
    shared: Arc<state_machine::Shared>,
    server: JoinHandle<()>,
    local_addr: SocketAddr,
    voters: BTreeMap<u64, SocketAddr>,
    /// This node's controller event loop (see `event_loop.rs`).
    events: mpsc::Sender<Submission>,
    event_loop: JoinHandle<()>,
    /// Idle connections to peers for forwarded submissions; never locked across an
    /// await.
    forward_idle: Mutex<BTreeMap<u64, Vec<TcpStream>>>,
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

    /// Starts this node: opens its log and snapshot in `dir`, listens on its own voter
    /// address, joins (or initializes) the quorum, and runs the controller event loop
    /// with `config.controller`.
    pub async fn start_with(
        node_id: u64,
        voters: BTreeMap<u64, SocketAddr>,
        dir: impl AsRef<Path>,
        config: QuorumConfig,
    ) -> Result<MetadataQuorum, MetadataError> {
        let dir = dir.as_ref();
        let io = |source: std::io::Error| MetadataError::Io {
            path: dir.display().to_string(),
            source,
        };
        let own = *voters
            .get(&node_id)
            .ok_or_else(|| quorum_err(format!("node {node_id} is not among the voters")))?;
        let log_store = LogStore::open(dir).map_err(io)?;
        let state_machine = StateMachineStore::open(dir).map_err(io)?;
        let shared = state_machine.shared.clone();
        let listener = TcpListener::bind(own).await.map_err(io)?;
        let local_addr = listener.local_addr().map_err(io)?;
        let raft_config = Config {
            cluster_name: "rill-metadata".into(),
            heartbeat_interval: config.heartbeat_interval_ms,
            election_timeout_min: config.election_timeout_min_ms,
            election_timeout_max: config.election_timeout_max_ms,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(config.snapshot_every_entries),
            max_in_snapshot_log_to_keep: 100,
            ..Default::default()
        }
        .validate()
        .map_err(quorum_err)?;
        let network = TcpNetworkFactory {
            voters: voters.clone(),
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
        let (events, events_rx) = mpsc::channel(EVENT_QUEUE_CAPACITY);
        let event_loop = tokio::spawn(
            EventLoop::new(node_id, raft.clone(), shared.clone(), config.controller).run(events_rx),
        );
        let server = tokio::spawn(network::serve(listener, raft.clone(), events.clone()));
        let members: BTreeMap<u64, BasicNode> = voters
            .iter()
            .map(|(id, addr)| (*id, BasicNode::new(addr.to_string())))
            .collect();
        match raft.initialize(members).await {
            Ok(()) => {}
            // Already initialized (a restart, or a peer's entries arrived first).
            Err(RaftError::APIError(InitializeError::NotAllowed(_))) => {}
            Err(e) => {
                server.abort();
                event_loop.abort();
                let _ = raft.shutdown().await;
                return Err(quorum_err(e));
            }
        }
        Ok(MetadataQuorum {
            node_id,
            raft,
            shared,
            server,
            local_addr,
            voters,
            events,
            event_loop,
            forward_idle: Mutex::new(BTreeMap::new()),
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
            let target = hint.take().or_else(|| self.leader_id());
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
                }
                Ok(Err(e)) => return Err(e),
            }
            let remaining = deadline.saturating_duration_since(Instant::now());
            tokio::time::sleep(backoff.min(remaining)).await;
            backoff = (backoff * 2).min(SUBMIT_BACKOFF_MAX);
        }
    }

    /// Puts `event` on this node's event loop and waits for its answer (NotController
    /// unless this node leads).
    pub(crate) async fn submit_local(
        &self,
        event: ControllerEvent,
    ) -> Result<SubmitResult, MetadataError> {
        submit_to_loop(&self.events, event).await
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
            .voters
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
            None => {
                let s = TcpStream::connect(addr)
                    .await
                    .map_err(|e| unreachable(e.to_string()))?;
                let _ = s.set_nodelay(true);
                s
            }
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
            _ => CommittedRecords::Image(st.image.clone()),
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

    /// Stops Raft and the listener. The files stay; a later start recovers from them.
    pub async fn shutdown(self) -> Result<(), MetadataError> {
        self.server.abort();
        self.event_loop.abort();
        self.raft.shutdown().await.map_err(quorum_err)
    }
}

impl Drop for MetadataQuorum {
    fn drop(&mut self) {
        self.server.abort();
        self.event_loop.abort();
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
        .send(Submission { event, reply })
        .await
        .map_err(|_| stopped())?;
    answer.await.map_err(|_| stopped())?
}
