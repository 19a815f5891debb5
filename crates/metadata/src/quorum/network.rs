//! Raft RPCs between quorum nodes (voters and observers) over TCP, or whatever the
//! quorum's transport (`transport.rs`: TLS, SASL) puts between them.
//!
//! Each message is a frame: `u32` big-endian length, then the postcard encoding of an
//! [`RpcRequest`] or [`RpcResponse`]. A client keeps one connection per peer and sends
//! one request at a time on it (openraft drives each peer with one `&mut` network
//! object), so responses need no correlation ids. The same port carries controller
//! events that a node forwards to the leader ([`RpcRequest::Controller`]): the server
//! puts them on its own controller event loop and answers with what the loop decided.
//! It also carries an observer's request to be added to the membership as a learner
//! ([`RpcRequest::AddObserver`], see [`add_observer`]), a voter's pre-vote
//! ([`RpcRequest::PreVote`], see `pre_vote.rs`), and KIP-853's changes of the voters
//! ([`RpcRequest::AddVoter`], [`RpcRequest::RemoveVoter`], see [`add_voter`]). Any I/O
//! error drops the
//! connection; the next call dials again. Frames above [`MAX_RPC_BYTES`] are refused
//! before anything is allocated for them.

use std::collections::BTreeMap;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{
    ClientWriteError, InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError,
    Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{BasicNode, ChangeMembers, Raft, ServerState};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use super::describe::{describe_local, QuorumDescription};
use super::event_loop::Submission;
use super::pre_vote::{ElectionTimer, Isolation, PreVoteRequest, PreVoteResponse};
use super::state_machine::Shared;
use super::transport::{ImageView, QuorumStream, QuorumTransport};
use super::{submit_to_loop, TypeConfig};
use crate::api::{ControllerEvent, SubmitResult};
use crate::error::MetadataError;

type NodeId = u64;

/// What a frame's buffer starts at; it grows with the bytes that actually arrive.
const RPC_INITIAL_BUFFER: usize = 64 << 10;

/// The most observers the membership takes: each costs the leader a replication stream,
/// and the quorum port takes joins from anyone who can reach it.
pub const MAX_OBSERVERS: usize = 1_024;

/// The largest RPC frame accepted (snapshot chunks are far smaller).
pub const MAX_RPC_BYTES: usize = 64 << 20;

/// How long a new voter has to catch up with the log as an observer (AddRaftVoter).
const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(30);

/// How long an accepted connection has to pass the transport's checks (a TLS handshake
/// and a SASL exchange, SCRAM's PBKDF2 included).
const ACCEPT_TIMEOUT: Duration = Duration::from_secs(15);

#[derive(Serialize, Deserialize)]
pub(crate) enum RpcRequest {
    AppendEntries(AppendEntriesRequest<TypeConfig>),
    Vote(VoteRequest<NodeId>),
    InstallSnapshot(InstallSnapshotRequest<TypeConfig>),
    /// An event for the active controller, forwarded by a node that does not lead.
    Controller(ControllerEvent),
    /// An observer (a broker-only node) asks the active controller to add it to the
    /// membership as a learner, reachable at `addr`, so that the log is replicated to it.
    AddObserver {
        node_id: NodeId,
        addr: String,
    },
    /// Would the receiver vote for this candidate? Changes nothing (`pre_vote.rs`).
    PreVote(PreVoteRequest),
    /// The quorum's state as the leader sees it (`describe.rs`).
    DescribeQuorum,
    /// AddRaftVoter (KIP-853): make `node_id`, reachable at `addr`, a voter.
    AddVoter {
        node_id: NodeId,
        addr: String,
    },
    /// RemoveRaftVoter (KIP-853): `node_id` votes no more.
    RemoveVoter {
        node_id: NodeId,
    },
}

#[derive(Serialize, Deserialize)]
pub(crate) enum RpcResponse {
    AppendEntries(Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>),
    Vote(Result<VoteResponse<NodeId>, RaftError<NodeId>>),
    InstallSnapshot(
        Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>>,
    ),
    Controller(Result<SubmitResult, ForwardError>),
    AddObserver(Result<(), ForwardError>),
    PreVote(PreVoteResponse),
    DescribeQuorum(Result<QuorumDescription, ForwardError>),
    ChangeVoters(Result<(), VoterChangeError>),
}

/// Why a change of the voters was not made: not the leader (ask it), or refused with
/// Kafka's error code (DUPLICATE_VOTER, VOTER_NOT_FOUND, INVALID_REQUEST, …).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum VoterChangeError {
    NotController { leader_id: Option<u64> },
    Refused { error_code: i16, message: String },
}

fn refused(code: rill_protocol::ErrorCode, message: String) -> VoterChangeError {
    VoterChangeError::Refused {
        error_code: code.code(),
        message,
    }
}

/// Why a forwarded controller event was not decided: what of [`MetadataError`] the
/// submitter needs to tell apart (retry elsewhere, or give up).
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum ForwardError {
    NotController { leader_id: Option<u64> },
    Other(String),
}

impl From<MetadataError> for ForwardError {
    fn from(e: MetadataError) -> Self {
        match e {
            MetadataError::NotController { leader_id } => ForwardError::NotController { leader_id },
            e => ForwardError::Other(e.to_string()),
        }
    }
}

/// Sends one controller event on `stream` and reads the answer.
pub(crate) async fn call_controller(
    stream: &mut QuorumStream,
    event: ControllerEvent,
) -> io::Result<Result<SubmitResult, ForwardError>> {
    write_msg(stream, &RpcRequest::Controller(event)).await?;
    match read_msg::<RpcResponse>(stream).await? {
        RpcResponse::Controller(answer) => Ok(answer),
        _ => Err(io::Error::other("unexpected rpc response")),
    }
}

/// Sends an observer's join request on `stream` and reads the answer.
pub(crate) async fn call_add_observer(
    stream: &mut QuorumStream,
    node_id: NodeId,
    addr: String,
) -> io::Result<Result<(), ForwardError>> {
    write_msg(stream, &RpcRequest::AddObserver { node_id, addr }).await?;
    match read_msg::<RpcResponse>(stream).await? {
        RpcResponse::AddObserver(answer) => Ok(answer),
        _ => Err(io::Error::other("unexpected rpc response")),
    }
}

/// Sends a pre-vote request on `stream` and reads the answer.
pub(crate) async fn call_pre_vote(
    stream: &mut QuorumStream,
    request: PreVoteRequest,
) -> io::Result<PreVoteResponse> {
    write_msg(stream, &RpcRequest::PreVote(request)).await?;
    match read_msg::<RpcResponse>(stream).await? {
        RpcResponse::PreVote(answer) => Ok(answer),
        _ => Err(io::Error::other("unexpected rpc response")),
    }
}

/// Sends a change of the voters on `stream` and reads the answer.
pub(crate) async fn call_change_voters(
    stream: &mut QuorumStream,
    request: RpcRequest,
) -> io::Result<Result<(), VoterChangeError>> {
    write_msg(stream, &request).await?;
    match read_msg::<RpcResponse>(stream).await? {
        RpcResponse::ChangeVoters(answer) => Ok(answer),
        _ => Err(io::Error::other("unexpected rpc response")),
    }
}

/// On the leader (KIP-853's AddRaftVoter): makes `node_id` a voter at `addr`. The node
/// must be running and reachable there: it is added as a learner (an observer) first,
/// if it is not one yet, and that waits until it has caught up with the log; then the
/// membership changes through openraft's joint consensus, committed by a majority of
/// the old voters and of the new. A voter already at `addr` is DUPLICATE_VOTER, as in
/// Kafka.
pub(crate) async fn add_voter(
    raft: &Raft<TypeConfig>,
    node_id: NodeId,
    addr: String,
) -> Result<(), VoterChangeError> {
    use rill_protocol::ErrorCode;
    if addr.parse::<SocketAddr>().is_err() {
        return Err(refused(
            ErrorCode::INVALID_REQUEST,
            format!("the new voter's address {addr} is not host:port"),
        ));
    }
    let (leading, leader_id, is_voter, known) = {
        let m = raft.metrics();
        let m = m.borrow();
        let membership = m.membership_config.membership();
        (
            m.state == ServerState::Leader && m.current_leader == Some(m.id),
            m.current_leader.filter(|l| *l != m.id),
            membership.voter_ids().any(|v| v == node_id),
            membership.get_node(&node_id).map(|n| n.addr.clone()),
        )
    };
    if !leading {
        return Err(VoterChangeError::NotController { leader_id });
    }
    if is_voter {
        return Err(refused(
            ErrorCode::DUPLICATE_VOTER,
            format!("node {node_id} is already a voter"),
        ));
    }
    if known.as_deref() != Some(addr.as_str()) {
        tracing::info!(node_id, %addr, "adding the new voter as an observer first");
        let caught_up = raft.add_learner(node_id, BasicNode::new(addr.clone()), true);
        match tokio::time::timeout(CATCH_UP_TIMEOUT, caught_up).await {
            Ok(added) => {
                added.map_err(membership_error)?;
            }
            Err(_) => {
                return Err(refused(
                    ErrorCode::REQUEST_TIMED_OUT,
                    format!("node {node_id} at {addr} did not catch up with the log in time"),
                ))
            }
        }
    }
    tracing::info!(node_id, %addr, "adding a voter to the metadata quorum");
    raft.change_membership(ChangeMembers::AddVoterIds([node_id].into()), false)
        .await
        .map(|_| ())
        .map_err(membership_error)
}

/// On the leader (KIP-853's RemoveRaftVoter): `node_id` votes no more; the last voter
/// cannot go. It leaves the membership altogether: openraft keeps a leader that is still
/// a member (a learner) leading, so a removed leader would never step down otherwise. A
/// controller process still running asks to follow the log as an observer again (its
/// join task), as KIP-853's removed voters do.
pub(crate) async fn remove_voter(
    raft: &Raft<TypeConfig>,
    node_id: NodeId,
) -> Result<(), VoterChangeError> {
    use rill_protocol::ErrorCode;
    let (leading, leader_id, voters) = {
        let m = raft.metrics();
        let m = m.borrow();
        (
            m.state == ServerState::Leader && m.current_leader == Some(m.id),
            m.current_leader.filter(|l| *l != m.id),
            m.membership_config
                .membership()
                .voter_ids()
                .collect::<Vec<_>>(),
        )
    };
    if !leading {
        return Err(VoterChangeError::NotController { leader_id });
    }
    if !voters.contains(&node_id) {
        return Err(refused(
            ErrorCode::VOTER_NOT_FOUND,
            format!("node {node_id} is not a voter"),
        ));
    }
    if voters.len() == 1 {
        return Err(refused(
            ErrorCode::INVALID_REQUEST,
            format!("node {node_id} is the only voter"),
        ));
    }
    tracing::info!(node_id, "removing a voter from the metadata quorum");
    raft.change_membership(ChangeMembers::RemoveVoters([node_id].into()), false)
        .await
        .map(|_| ())
        .map_err(membership_error)
}

/// openraft's refusal of a membership change as Kafka's error.
fn membership_error(e: RaftError<NodeId, ClientWriteError<NodeId, BasicNode>>) -> VoterChangeError {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => {
            VoterChangeError::NotController {
                leader_id: f.leader_id,
            }
        }
        // Another change still in flight (Kafka answers REQUEST_TIMED_OUT and the
        // operator retries), or the node could not be reached to catch up.
        e => refused(rill_protocol::ErrorCode::REQUEST_TIMED_OUT, e.to_string()),
    }
}

pub(crate) async fn call_describe_quorum(
    stream: &mut QuorumStream,
) -> io::Result<Result<QuorumDescription, ForwardError>> {
    write_msg(stream, &RpcRequest::DescribeQuorum).await?;
    match read_msg::<RpcResponse>(stream).await? {
        RpcResponse::DescribeQuorum(answer) => Ok(answer),
        _ => Err(io::Error::other("unexpected rpc response")),
    }
}

/// On the active controller: makes `node_id` a learner reachable at `addr`.
///
/// Idempotent, because a broker asks at every start: a learner already known at `addr`
/// changes nothing; one known at another address (restarted on another port) gets its
/// address replaced, which is safe for a learner as it never votes, but only once the
/// broker of that id is not live in the committed image (a second process started with
/// a live broker's id must not take that broker's log away; a restarted one waits at most
/// a session timeout, as its registration does); a new one is added.
/// Only the leader changes the membership (openraft would refuse elsewhere), and a voter's
/// id is refused, so that a misconfigured broker can never demote or shadow a voter.
pub(crate) async fn add_observer(
    raft: &Raft<TypeConfig>,
    shared: &Shared,
    node_id: NodeId,
    addr: String,
) -> Result<(), ForwardError> {
    if i32::try_from(node_id).is_err() {
        return Err(ForwardError::Other(format!(
            "node {node_id} is not a broker id (0..=2147483647)"
        )));
    }
    let (leading, leader_id, is_voter, known, observers, committed) = {
        let m = raft.metrics();
        let m = m.borrow();
        let membership = m.membership_config.membership();
        (
            m.state == ServerState::Leader && m.current_leader == Some(m.id),
            m.current_leader.filter(|l| *l != m.id),
            membership.voter_ids().any(|v| v == node_id),
            membership.get_node(&node_id).map(|n| n.addr.clone()),
            membership.learner_ids().count(),
            // The membership openraft acts on may not be committed yet; applied is.
            *m.membership_config.log_id() <= m.last_applied,
        )
    };
    if is_voter {
        return Err(ForwardError::Other(format!(
            "node {node_id} is a voter of the controller quorum, so it cannot join as an \
             observer (a broker-only node needs an id outside controller.quorum.voters)"
        )));
    }
    if !leading {
        return Err(ForwardError::NotController { leader_id });
    }
    let node = BasicNode::new(addr.clone());
    let changed = match known {
        // Answer "in" only once that is committed: an uncommitted join (an earlier
        // attempt's, still in flight) could yet be lost with this leader.
        Some(old) if old == addr && committed => return Ok(()),
        Some(old) if old == addr => {
            return Err(ForwardError::Other(format!(
                "node {node_id}'s join is not committed yet"
            )));
        }
        Some(old) if broker_is_live(shared, node_id) => {
            return Err(ForwardError::Other(format!(
                "broker {node_id} is live and replicated to at {old}; it moves to {addr} once \
                 its lease lapses"
            )));
        }
        Some(old) => {
            tracing::info!(node_id, %old, new = %addr, "observer moved; updating its address");
            raft.change_membership(
                ChangeMembers::SetNodes(BTreeMap::from([(node_id, node)])),
                true,
            )
            .await
        }
        None if observers >= MAX_OBSERVERS => {
            return Err(ForwardError::Other(format!(
                "the metadata quorum already has {observers} observers, the most it takes"
            )));
        }
        None => {
            tracing::info!(node_id, %addr, "adding an observer (learner) to the metadata quorum");
            raft.add_learner(node_id, node, false).await
        }
    };
    match changed {
        Ok(_) => Ok(()),
        Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => {
            Err(ForwardError::NotController {
                leader_id: f.leader_id,
            })
        }
        // A membership change still in flight, or a fatal error: the observer retries.
        Err(e) => Err(ForwardError::Other(e.to_string())),
    }
}

fn broker_is_live(shared: &Shared, node_id: NodeId) -> bool {
    i32::try_from(node_id).is_ok_and(|id| shared.lock().image.is_live(id))
}

async fn write_msg<T: Serialize>(stream: &mut QuorumStream, msg: &T) -> io::Result<()> {
    let payload = postcard::to_allocvec(msg).map_err(|e| io::Error::other(e.to_string()))?;
    let len = u32::try_from(payload.len())
        .ok()
        .filter(|l| (*l as usize) <= MAX_RPC_BYTES)
        .ok_or_else(|| io::Error::other("rpc frame too large"))?;
    let mut buf = Vec::with_capacity(4 + payload.len());
    buf.extend_from_slice(&len.to_be_bytes());
    buf.extend_from_slice(&payload);
    stream.write_all(&buf).await?;
    // A TLS stream may hold the record until flushed.
    stream.flush().await
}

async fn read_msg<T: for<'de> Deserialize<'de>>(stream: &mut QuorumStream) -> io::Result<T> {
    let mut len = [0u8; 4];
    stream.read_exact(&mut len).await?;
    let len = u32::from_be_bytes(len) as usize;
    if len > MAX_RPC_BYTES {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "rpc frame too large",
        ));
    }
    // Grow the buffer as bytes arrive rather than trusting the length prefix: anyone who
    // can reach the controller port could otherwise make this node allocate 64 MiB per
    // connection with four bytes.
    let mut payload = Vec::with_capacity(len.min(RPC_INITIAL_BUFFER));
    let read = (&mut *stream)
        .take(len as u64)
        .read_to_end(&mut payload)
        .await?;
    if read != len {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "rpc frame truncated",
        ));
    }
    postcard::from_bytes(&payload)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))
}

/// Serves Raft RPCs and forwarded controller events from peers on `listener` until the
/// task is aborted. The connections' tasks live in a `JoinSet` owned by this task, so
/// aborting it closes them too: a stopped node must not keep answering peers on
/// connections they opened before it stopped.
///
/// `events` is `None` on an observer: it runs no controller event loop, so controller
/// events sent to it are answered NotController with the leader it knows. `election` is
/// `None` there too: an observer grants no pre-vote.
pub(crate) async fn serve(
    listener: TcpListener,
    raft: Raft<TypeConfig>,
    shared: Arc<Shared>,
    events: Option<mpsc::Sender<Submission>>,
    election: Option<Arc<ElectionTimer>>,
    isolation: Arc<Isolation>,
    transport: Arc<dyn QuorumTransport>,
) {
    let image: ImageView = {
        let shared = shared.clone();
        Arc::new(move || shared.lock().image.clone())
    };
    let mut connections = tokio::task::JoinSet::new();
    loop {
        // Reap finished connections so the set stays as large as the open ones.
        while connections.try_join_next().is_some() {}
        let (stream, peer) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "quorum listener accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let raft = raft.clone();
        let shared = shared.clone();
        let events = events.clone();
        let election = election.clone();
        let isolation = isolation.clone();
        let transport = transport.clone();
        let image = image.clone();
        connections.spawn(async move {
            // In the connection's own task, so that a slow or silent peer holds up no
            // other accept.
            let accepted =
                tokio::time::timeout(ACCEPT_TIMEOUT, transport.accept(stream, peer, image)).await;
            let stream = match accepted {
                Ok(Ok(stream)) => stream,
                Ok(Err(e)) => {
                    tracing::warn!(%peer, error = %e, "quorum connection refused");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer, "quorum connection did not authenticate in time");
                    return;
                }
            };
            let served = serve_connection(stream, raft, shared, events, election, &isolation);
            if let Err(e) = served.await {
                if e.kind() != io::ErrorKind::UnexpectedEof {
                    tracing::debug!(%peer, error = %e, "quorum connection closed");
                }
            }
        });
    }
}

async fn serve_connection(
    mut stream: QuorumStream,
    raft: Raft<TypeConfig>,
    shared: Arc<Shared>,
    events: Option<mpsc::Sender<Submission>>,
    election: Option<Arc<ElectionTimer>>,
    isolation: &Isolation,
) -> io::Result<()> {
    // Whether the sender's vote was accepted: only a current leader's message counts
    // as hearing from the leader (pre_vote.rs, step 1).
    let heard = |accepted: bool| {
        if let Some(e) = election.as_ref().filter(|_| accepted) {
            e.heard_from_leader();
        }
    };
    loop {
        let request: RpcRequest = read_msg(&mut stream).await?;
        if isolation.is_on() {
            // A test's partition: the request is lost, and so is everything after it.
            while isolation.is_on() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            return Ok(());
        }
        let response = match request {
            RpcRequest::AppendEntries(r) => {
                let answer = raft.append_entries(r).await;
                heard(matches!(
                    &answer,
                    Ok(r) if !matches!(r, AppendEntriesResponse::HigherVote(_))
                ));
                RpcResponse::AppendEntries(answer)
            }
            RpcRequest::Vote(r) => RpcResponse::Vote(raft.vote(r).await),
            RpcRequest::InstallSnapshot(r) => {
                let answer = raft.install_snapshot(r).await;
                heard(answer.is_ok());
                RpcResponse::InstallSnapshot(answer)
            }
            RpcRequest::PreVote(r) => RpcResponse::PreVote(match &election {
                Some(e) => e.handle(r).await,
                None => PreVoteResponse {
                    granted: false,
                    term: raft.metrics().borrow().current_term,
                },
            }),
            RpcRequest::Controller(event) => RpcResponse::Controller(match &events {
                Some(events) => match submit_to_loop(events, event).await {
                    // The loop is gone: this node is stopping and controls nothing.
                    Err(_) if events.is_closed() => {
                        Err(ForwardError::NotController { leader_id: None })
                    }
                    answer => answer.map_err(ForwardError::from),
                },
                None => Err(ForwardError::NotController {
                    leader_id: raft.metrics().borrow().current_leader,
                }),
            }),
            RpcRequest::AddObserver { node_id, addr } => {
                RpcResponse::AddObserver(add_observer(&raft, &shared, node_id, addr).await)
            }
            RpcRequest::DescribeQuorum => {
                RpcResponse::DescribeQuorum(describe_local(&raft, &shared.contacts))
            }
            RpcRequest::AddVoter { node_id, addr } => {
                RpcResponse::ChangeVoters(add_voter(&raft, node_id, addr).await)
            }
            RpcRequest::RemoveVoter { node_id } => {
                RpcResponse::ChangeVoters(remove_voter(&raft, node_id).await)
            }
        };
        write_msg(&mut stream, &response).await?;
    }
}

/// What this node's last dial of each peer found, for the active controller's check
/// that a broker's process is gone ([`DialLog::take_refused`]).
///
/// A refused connection to a peer's quorum port means nothing listens there: that port
/// is served by the peer's own process (a voter's, or a broker-only node's observer
/// port), so the process has exited or crashed. A peer that is partitioned away or
/// frozen does not refuse; its dials time out, and the session timeout judges it.
#[derive(Debug, Default)]
pub struct DialLog {
    peers: std::sync::Mutex<BTreeMap<NodeId, PeerDials>>,
}

#[derive(Debug, Default, Clone, Copy)]
struct PeerDials {
    /// When the last dial was refused (or an open connection was closed under it);
    /// `None` once a dial succeeded since.
    refused_at: Option<std::time::Instant>,
    /// Whether [`DialLog::take_refused`] reported this refusal already.
    reported: bool,
}

impl DialLog {
    fn record<S>(&self, peer: NodeId, result: &io::Result<S>) {
        match result {
            Ok(_) => self.update(peer, |d| *d = PeerDials::default()),
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => self.refused(peer),
            // Anything else (a time-out, no route) says nothing about the process.
            Err(_) => {}
        }
    }

    /// An open connection to `peer` ended with `error`. A reset or an end of stream in
    /// the middle of an exchange is the peer's kernel closing the socket of a process
    /// that exited (the server never closes a connection that speaks the protocol); it
    /// counts as a refusal. A time-out does not.
    fn record_broken(&self, peer: NodeId, error: &io::Error) {
        if matches!(
            error.kind(),
            io::ErrorKind::UnexpectedEof
                | io::ErrorKind::ConnectionReset
                | io::ErrorKind::BrokenPipe
        ) {
            self.refused(peer);
        }
    }

    fn refused(&self, peer: NodeId) {
        let now = std::time::Instant::now();
        self.update(peer, |d| d.refused_at = Some(now));
    }

    fn update(&self, peer: NodeId, f: impl FnOnce(&mut PeerDials)) {
        let mut peers = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        f(peers.entry(peer).or_default());
    }

    /// The peers whose last dial was refused at or after `since` (when this node began
    /// to act on them: a refusal seen before may be of a process that has restarted
    /// since), each refusal reported once; a successful dial withdraws it.
    pub fn take_refused(&self, since: std::time::Instant) -> Vec<NodeId> {
        let mut peers = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        peers
            .iter_mut()
            .filter(|(_, d)| !d.reported && d.refused_at.is_some_and(|at| at >= since))
            .map(|(id, d)| {
                d.reported = true;
                *id
            })
            .collect()
    }
}

/// Dials peers by node id: voters at their configured address, observers at the address
/// they joined with (kept in the membership).
#[derive(Clone)]
pub struct TcpNetworkFactory {
    pub(crate) voters: BTreeMap<NodeId, SocketAddr>,
    pub(crate) dials: Arc<DialLog>,
    pub(crate) isolation: Arc<Isolation>,
    pub(crate) shared: Arc<Shared>,
    pub(crate) transport: Arc<dyn QuorumTransport>,
}

impl RaftNetworkFactory<TypeConfig> for TcpNetworkFactory {
    type Network = TcpNetwork;

    async fn new_client(&mut self, target: NodeId, node: &BasicNode) -> TcpNetwork {
        let addr = self
            .voters
            .get(&target)
            .copied()
            .or_else(|| node.addr.parse().ok());
        TcpNetwork {
            target,
            addr,
            stream: None,
            dials: self.dials.clone(),
            isolation: self.isolation.clone(),
            shared: self.shared.clone(),
            transport: self.transport.clone(),
        }
    }
}

/// One peer's connection.
pub struct TcpNetwork {
    target: NodeId,
    addr: Option<SocketAddr>,
    stream: Option<QuorumStream>,
    dials: Arc<DialLog>,
    isolation: Arc<Isolation>,
    shared: Arc<Shared>,
    transport: Arc<dyn QuorumTransport>,
}

impl TcpNetwork {
    async fn call(&mut self, request: &RpcRequest, ttl: Duration) -> io::Result<RpcResponse> {
        if self.isolation.is_on() {
            // As a partition does: nothing comes back, after a while.
            self.stream = None;
            tokio::time::sleep(ttl.min(Duration::from_millis(100))).await;
            return Err(io::Error::new(io::ErrorKind::TimedOut, "isolated"));
        }
        let reused = self.stream.is_some();
        let exchange = async {
            if self.stream.is_none() {
                let addr = self.addr.ok_or_else(|| {
                    io::Error::other(format!("no address for node {}", self.target))
                })?;
                let dialed = self.transport.dial(addr).await;
                self.dials.record(self.target, &dialed);
                self.stream = Some(dialed?);
            }
            let stream = self
                .stream
                .as_mut()
                .ok_or_else(|| io::Error::other("not connected"))?;
            write_msg(stream, request).await?;
            read_msg::<RpcResponse>(stream).await
        };
        let result = match tokio::time::timeout(ttl, exchange).await {
            Ok(r) => r,
            Err(_) => Err(io::Error::new(io::ErrorKind::TimedOut, "rpc timed out")),
        };
        if let Err(e) = &result {
            if reused {
                self.dials.record_broken(self.target, e);
            }
            // The stream may hold half a frame: never reuse it.
            self.stream = None;
        }
        result
    }
}

fn unexpected<E: std::error::Error>() -> RPCError<NodeId, BasicNode, E> {
    RPCError::Network(NetworkError::new(&io::Error::other(
        "unexpected rpc response",
    )))
}

fn transport<E: std::error::Error>(e: io::Error) -> RPCError<NodeId, BasicNode, E> {
    if matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused | io::ErrorKind::NotFound
    ) {
        RPCError::Unreachable(Unreachable::new(&e))
    } else {
        RPCError::Network(NetworkError::new(&e))
    }
}

impl RaftNetwork<TypeConfig> for TcpNetwork {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        let heartbeat = rpc.entries.is_empty();
        match self
            .call(&RpcRequest::AppendEntries(rpc), option.hard_ttl())
            .await
        {
            Ok(RpcResponse::AppendEntries(Ok(r))) => {
                if matches!(r, AppendEntriesResponse::Success) {
                    self.shared.contacts.answered(self.target, heartbeat);
                }
                Ok(r)
            }
            Ok(RpcResponse::AppendEntries(Err(e))) => {
                Err(RPCError::RemoteError(RemoteError::new(self.target, e)))
            }
            Ok(_) => Err(unexpected()),
            Err(e) => Err(transport(e)),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, BasicNode, RaftError<NodeId, InstallSnapshotError>>,
    > {
        match self
            .call(&RpcRequest::InstallSnapshot(rpc), option.hard_ttl())
            .await
        {
            Ok(RpcResponse::InstallSnapshot(Ok(r))) => Ok(r),
            Ok(RpcResponse::InstallSnapshot(Err(e))) => {
                Err(RPCError::RemoteError(RemoteError::new(self.target, e)))
            }
            Ok(_) => Err(unexpected()),
            Err(e) => Err(transport(e)),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, BasicNode, RaftError<NodeId>>> {
        match self.call(&RpcRequest::Vote(rpc), option.hard_ttl()).await {
            Ok(RpcResponse::Vote(Ok(r))) => Ok(r),
            Ok(RpcResponse::Vote(Err(e))) => {
                Err(RPCError::RemoteError(RemoteError::new(self.target, e)))
            }
            Ok(_) => Err(unexpected()),
            Err(e) => Err(transport(e)),
        }
    }
}

#[cfg(test)]
mod dial_log_tests {
    use super::*;

    fn refused() -> io::Result<()> {
        Err(io::Error::from(io::ErrorKind::ConnectionRefused))
    }

    #[test]
    fn a_refusal_is_reported_once_and_withdrawn_by_a_connection() {
        let log = DialLog::default();
        let start = std::time::Instant::now();
        log.record::<()>(1, &Err(io::Error::from(io::ErrorKind::TimedOut)));
        assert!(
            log.take_refused(start).is_empty(),
            "a time-out says nothing"
        );
        log.record(1, &refused());
        log.record(2, &refused());
        let later = std::time::Instant::now();
        assert!(
            log.take_refused(later + Duration::from_secs(1)).is_empty(),
            "too old"
        );
        assert_eq!(log.take_refused(start), vec![1, 2]);
        log.record(1, &refused());
        assert!(log.take_refused(start).is_empty(), "each refusal once");
        log.update(2, |d| *d = PeerDials::default());
        log.record_broken(2, &io::Error::from(io::ErrorKind::TimedOut));
        assert!(log.take_refused(start).is_empty());
        log.record_broken(2, &io::Error::from(io::ErrorKind::UnexpectedEof));
        assert_eq!(
            log.take_refused(start),
            vec![2],
            "a closed stream after a connection"
        );
    }
}
