//! Elections behind a Pre-Vote (KIP-996, the Raft thesis §9.6): a voter asks its peers
//! whether they would vote for it before it raises its term, so that a node that was cut
//! off, or whose leader is merely slow, never forces an election by coming back with a
//! higher term.
//!
//! openraft 0.9 has no Pre-Vote. It has the switch this needs: with `enable_elect` off
//! its timer never starts an election, and `Raft::trigger().elect()` starts one when we
//! say. This module is the timer that says so.
//!
//! # Protocol
//! 1. Every voter keeps the time it last heard from a leader: an AppendEntries or
//!    InstallSnapshot that openraft accepted (not one it refused for a stale vote), or
//!    being the leader itself ([`ElectionTimer::heard_from_leader`]).
//! 2. A voter that has not heard from a leader for its election timeout (drawn at random
//!    in `election_timeout_min..election_timeout_max` after each attempt), or whose
//!    leader's process is gone, asks every other voter for a pre-vote: its id, the term
//!    it would stand in and its last log id. Nothing changes on either side.
//! 3. A voter grants the pre-vote when all of these hold:
//!    - it is not the leader itself;
//!    - the proposed term is above its own term, and the candidate's last log id is at
//!      least its own (the vote's own rule, so a candidate that would lose is stopped
//!      here);
//!    - it has not heard from a leader for `election_timeout_min` either, or the leader
//!      it follows is gone.
//! 4. With grants from a majority of the voters (itself included), the voter calls
//!    `trigger().elect()`: openraft then runs the real election, term + 1.
//! 5. "Gone" is what [`super::DialLog`] also relies on: a dial of the leader's quorum
//!    port that the leader's host refuses. Only a process that has exited leaves a port
//!    refusing; a leader that is frozen or cut off only times out, and then step 3's
//!    timeout decides. A voter dials its leader only once the heartbeats are late
//!    ([`LATE_HEARTBEATS`]), so a live cluster sees no probes.
//!
//! openraft's followers also refuse real votes for `election_timeout_max` of its own
//! config after the last heartbeat (its "leader lease"). Since every election now passes
//! step 3 first, that lease no longer has to be long: the quorum gives openraft a short
//! one ([`raft_lease_ms`]), and the fast path of step 5 waits for it to pass before it
//! asks. A leader lost to `kill -9` is replaced within a few heartbeats instead of an
//! election timeout plus a lease.
//!
//! # Why it is safe
//! Pre-Vote decides only *when* openraft holds an election; who wins, and everything
//! about terms and logs, is still openraft's vote. A pre-vote that is granted wrongly
//! costs an election at worst (what every election cost before); one refused wrongly
//! delays an election, never forever, because the timeout path of step 3 asks nothing
//! of the leader's process.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use openraft::{LogId, Raft, ServerState};
use rand::Rng;
use serde::{Deserialize, Serialize};
use tokio::net::TcpStream;

use super::transport::QuorumTransport;

use super::{QuorumConfig, TypeConfig};

type NodeId = u64;

/// Heartbeats this many intervals late make a voter check whether its leader's process
/// is still there (step 5).
pub(crate) const LATE_HEARTBEATS: u32 = 2;

/// How long a dial of the leader may take before it counts as "not refused".
const PROBE_TIMEOUT: Duration = Duration::from_millis(200);

/// How long a probe's answer is reused (a pre-vote round asks every peer at once).
const PROBE_REUSE: Duration = Duration::from_millis(100);

/// The longest a pre-vote round waits for a peer's answer.
const PRE_VOTE_TIMEOUT: Duration = Duration::from_millis(300);

/// openraft's own leader lease (its `election_timeout_max`): three heartbeats, so that
/// one late heartbeat does not end it. Must stay below `election_timeout_min`.
pub(crate) fn raft_lease_ms(config: &QuorumConfig) -> u64 {
    (config.heartbeat_interval_ms * 3).min(config.election_timeout_min_ms.saturating_sub(1))
}

/// A pre-vote request (step 2).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct PreVoteRequest {
    pub candidate: NodeId,
    /// The term the candidate would stand in: its own term + 1.
    pub term: u64,
    pub last_log_id: Option<LogId<NodeId>>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct PreVoteResponse {
    pub granted: bool,
    /// The voter's own term, for the logs.
    pub term: u64,
}

/// A test's partition of one node: while set, the node's quorum RPCs neither leave nor
/// get answers, as when its network is cut (not as when its process is gone: nothing is
/// refused, everything times out).
#[derive(Debug, Default)]
pub(crate) struct Isolation(AtomicBool);

impl Isolation {
    pub(crate) fn is_on(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    #[cfg(test)]
    pub(crate) fn set(&self, on: bool) {
        self.0.store(on, Ordering::Relaxed);
    }
}

/// What the last probe of the leader found.
#[derive(Debug, Clone, Copy)]
struct Probe {
    leader: NodeId,
    at: Instant,
    gone: bool,
}

/// One voter's election timer and pre-vote answers (see the module docs). The voters are
/// those of the membership this node has applied (KIP-853: AddRaftVoter and
/// RemoveRaftVoter change them), the configured ones until it has one.
pub(crate) struct ElectionTimer {
    node_id: NodeId,
    configured: BTreeMap<NodeId, SocketAddr>,
    raft: Raft<TypeConfig>,
    heartbeat: Duration,
    timeout_min: Duration,
    timeout_max: Duration,
    raft_lease: Duration,
    last_contact: Mutex<Instant>,
    probe: Mutex<Option<Probe>>,
    isolation: Arc<Isolation>,
    transport: Arc<dyn QuorumTransport>,
}

impl ElectionTimer {
    pub(crate) fn new(
        node_id: NodeId,
        voters: BTreeMap<NodeId, SocketAddr>,
        raft: Raft<TypeConfig>,
        config: &QuorumConfig,
        isolation: Arc<Isolation>,
    ) -> Self {
        Self {
            node_id,
            configured: voters,
            raft,
            heartbeat: Duration::from_millis(config.heartbeat_interval_ms),
            timeout_min: Duration::from_millis(config.election_timeout_min_ms),
            timeout_max: Duration::from_millis(config.election_timeout_max_ms),
            raft_lease: Duration::from_millis(raft_lease_ms(config)),
            last_contact: Mutex::new(Instant::now()),
            probe: Mutex::new(None),
            isolation,
            transport: config.transport.clone(),
        }
    }

    /// The voters now, with their quorum addresses.
    fn voters(&self) -> BTreeMap<NodeId, SocketAddr> {
        super::voter_addrs(&self.raft, &self.configured)
    }

    /// Step 1: a leader's AppendEntries or InstallSnapshot was accepted.
    pub(crate) fn heard_from_leader(&self) {
        *self.last_contact.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
    }

    fn heard_since(&self, at: Instant) -> bool {
        *self.last_contact.lock().unwrap_or_else(|p| p.into_inner()) > at
    }

    fn since_contact(&self) -> Duration {
        self.last_contact
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .elapsed()
    }

    /// Step 3: the answer to a peer's pre-vote.
    pub(crate) async fn handle(&self, req: PreVoteRequest) -> PreVoteResponse {
        let (state, term, leader) = {
            let m = self.raft.metrics();
            let m = m.borrow();
            (m.state, m.current_term, m.current_leader)
        };
        let last_log_id = self.raft.data_metrics().borrow().last_log;
        let answer = |granted: bool| PreVoteResponse { granted, term };
        if !self.voters().contains_key(&self.node_id) || state == ServerState::Leader {
            return answer(false);
        }
        if req.term <= term || req.last_log_id < last_log_id {
            return answer(false);
        }
        if self.since_contact() >= self.timeout_min {
            return answer(true);
        }
        // Heard from the leader recently: grant only if its process is gone.
        let gone = match leader.filter(|l| *l != req.candidate && *l != self.node_id) {
            Some(l) => self.leader_gone(l).await,
            None => false,
        };
        tracing::debug!(
            candidate = req.candidate,
            term = req.term,
            granted = gone,
            "pre-vote asked while the leader was heard from recently"
        );
        answer(gone)
    }

    /// Step 5: whether `leader`'s quorum port refuses a dial (its process is gone).
    async fn leader_gone(&self, leader: NodeId) -> bool {
        let cached = *self.probe.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = cached.filter(|p| p.leader == leader && p.at.elapsed() < PROBE_REUSE) {
            return p.gone;
        }
        let Some(addr) = self.voters().get(&leader).copied() else {
            return false;
        };
        // A bare TCP dial, whatever the transport: a refusal is all this asks about,
        // and a connection that sends nothing is dropped by the peer's accept.
        let gone = if self.isolation.is_on() {
            false
        } else {
            matches!(
                tokio::time::timeout(PROBE_TIMEOUT, TcpStream::connect(addr)).await,
                Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused
            )
        };
        *self.probe.lock().unwrap_or_else(|p| p.into_inner()) = Some(Probe {
            leader,
            at: Instant::now(),
            gone,
        });
        gone
    }

    fn draw_timeout(&self) -> Duration {
        if self.timeout_max <= self.timeout_min {
            return self.timeout_min;
        }
        rand::thread_rng().gen_range(self.timeout_min..self.timeout_max)
    }

    /// Steps 2 and 4, until the task is aborted.
    pub(crate) async fn run(self: Arc<Self>) {
        let tick = (self.heartbeat / 2).max(Duration::from_millis(10));
        let mut timeout = self.draw_timeout();
        // When this node last stood (or started): the timeout counts from the later of
        // that and the last contact, so that a failed round is not repeated at once.
        let mut last_attempt = Instant::now();
        // The fast path's own pace: a refused dial is strong evidence, but a round that
        // failed on it (the others still hear the leader) is not repeated at once.
        let mut last_fast: Option<Instant> = None;
        loop {
            tokio::time::sleep(tick).await;
            let (state, term, leader) = {
                let m = self.raft.metrics();
                let m = m.borrow();
                if m.running_state.is_err() {
                    return;
                }
                (m.state, m.current_term, m.current_leader)
            };
            if state == ServerState::Leader {
                self.heard_from_leader();
                continue;
            }
            if state == ServerState::Learner || state == ServerState::Shutdown {
                continue;
            }
            let voters = self.voters();
            if !voters.contains_key(&self.node_id) {
                // An observer waiting to be added (AddRaftVoter), or a voter removed:
                // it never stands.
                continue;
            }
            let quiet = self.since_contact().min(last_attempt.elapsed());
            let mut fast = false;
            if voters.len() == 1 {
                // Alone: nobody to disturb or to ask. Stand at once, and again only if
                // that did not make this node the leader within a timeout.
                if state == ServerState::Candidate && quiet < timeout {
                    continue;
                }
            } else if quiet < timeout {
                // Step 5: late heartbeats from a leader whose process may be gone.
                let late = self.since_contact() >= self.heartbeat * LATE_HEARTBEATS;
                let leader = leader.filter(|l| *l != self.node_id);
                let paced = last_fast.is_none_or(|at| at.elapsed() >= self.raft_lease * 2);
                fast = match leader {
                    Some(l) if late && paced => self.leader_gone(l).await,
                    _ => false,
                };
                if !fast {
                    continue;
                }
                // openraft's followers refuse votes until its lease has passed since
                // their last heartbeat, which came about when ours did; a little jitter
                // keeps two followers from standing at the same moment.
                let jitter = rand::thread_rng().gen_range(Duration::ZERO..self.heartbeat * 2);
                let wait = (self.raft_lease + jitter).saturating_sub(self.since_contact());
                tokio::time::sleep(wait).await;
                last_fast = Some(Instant::now());
            }
            last_attempt = Instant::now();
            timeout = self.draw_timeout();
            let granted = self.ask_peers(term, &voters).await;
            let majority = voters.len() / 2 + 1;
            // A leader may have come forward while the round was out (another voter's
            // round won first): standing now would depose it.
            let moved = {
                let m = self.raft.metrics();
                let m = m.borrow();
                m.current_term != term || m.state == ServerState::Leader
            };
            if moved || self.heard_since(last_attempt) {
                continue;
            }
            if granted >= majority {
                tracing::info!(
                    node = self.node_id,
                    term = term + 1,
                    granted,
                    leader_gone = fast,
                    "pre-vote won; standing for election"
                );
                if self.raft.trigger().elect().await.is_err() {
                    return;
                }
            } else {
                tracing::debug!(
                    node = self.node_id,
                    term = term + 1,
                    granted,
                    "pre-vote lost; not standing"
                );
            }
        }
    }

    /// Asks every other voter for a pre-vote for `term + 1`; returns the grants, this
    /// node's own included.
    async fn ask_peers(&self, term: u64, voters: &BTreeMap<NodeId, SocketAddr>) -> usize {
        let request = PreVoteRequest {
            candidate: self.node_id,
            term: term + 1,
            last_log_id: self.raft.data_metrics().borrow().last_log,
        };
        let mut asks = tokio::task::JoinSet::new();
        for (&id, &addr) in voters {
            if id == self.node_id {
                continue;
            }
            let request = request.clone();
            let isolated = self.isolation.is_on();
            let transport = self.transport.clone();
            asks.spawn(async move {
                if isolated {
                    return false;
                }
                let call = async {
                    let mut stream = transport.dial(addr).await?;
                    super::network::call_pre_vote(&mut stream, request).await
                };
                match tokio::time::timeout(PRE_VOTE_TIMEOUT, call).await {
                    Ok(Ok(r)) => r.granted,
                    _ => false,
                }
            });
        }
        let mut granted = 1;
        while let Some(answer) = asks.join_next().await {
            if answer.unwrap_or(false) {
                granted += 1;
            }
        }
        granted
    }
}
