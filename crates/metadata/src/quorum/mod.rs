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

mod log_store;
mod network;
mod state_machine;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Cursor;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{CheckIsLeaderError, ClientWriteError, InitializeError, RaftError};
use openraft::{BasicNode, Config, Raft, ServerState, SnapshotPolicy};
use serde::{Deserialize, Serialize};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use log_store::LogStore;
pub use network::{TcpNetwork, TcpNetworkFactory, MAX_RPC_BYTES};
pub use state_machine::StateMachineStore;

use crate::error::MetadataError;
use crate::image::MetadataImage;
use crate::record::{encode_batch, MetadataRecord};

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
}

impl Default for QuorumConfig {
    fn default() -> Self {
        Self {
            heartbeat_interval_ms: 100,
            election_timeout_min_ms: 500,
            election_timeout_max_ms: 1_000,
            snapshot_every_entries: 5_000,
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
}

fn quorum_err(e: impl std::fmt::Display) -> MetadataError {
    MetadataError::Quorum(e.to_string())
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
    /// address, and joins (or initializes) the quorum.
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
        let server = tokio::spawn(network::serve(listener, raft.clone()));
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
    pub async fn propose(&self, records: Vec<MetadataRecord>) -> Result<i64, MetadataError> {
        let batch = encode_batch(&records)?.to_vec();
        match self.raft.client_write(MetadataEntry { batch }).await {
            Ok(resp) => Ok(resp.data.first_offset),
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
                Err(MetadataError::NotController {
                    leader_id: f.leader_id,
                })
            }
            Err(e) => Err(quorum_err(e)),
        }
    }

    /// On the leader: the committed image once every entry of earlier terms is applied,
    /// which is what the active controller must decide from.
    pub async fn leader_image(&self) -> Result<MetadataImage, MetadataError> {
        match self.raft.ensure_linearizable().await {
            Ok(_) => Ok(self.image()),
            Err(RaftError::APIError(CheckIsLeaderError::ForwardToLeader(f))) => {
                Err(MetadataError::NotController {
                    leader_id: f.leader_id,
                })
            }
            Err(e) => Err(quorum_err(e)),
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
        self.raft.shutdown().await.map_err(quorum_err)
    }
}

impl Drop for MetadataQuorum {
    fn drop(&mut self) {
        self.server.abort();
    }
}
