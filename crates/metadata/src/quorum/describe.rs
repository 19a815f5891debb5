//! DescribeQuorum (KIP-595, KIP-836): the state of the metadata quorum as its leader sees
//! it, for `kafka-metadata-quorum.sh describe --status|--replication` and
//! `Admin.describeMetadataQuorum`.
//!
//! Only the leader knows how far each replica got, so any other node asks it over the
//! quorum RPC ([`super::MetadataQuorum::describe`]). Offsets are Raft log indexes (the
//! high watermark is the committed index), so each replica's lag is the leader's log
//! end minus its own. openraft 0.9 reports what each follower matched but not when, so
//! the leader's side of the quorum network keeps the wall-clock times itself
//! ([`FollowerContacts`]): the last AppendEntries a follower answered ("last fetch"), and
//! the last one that left it holding the whole log ("last caught up").

use std::collections::BTreeMap;
use std::sync::Mutex;

use openraft::{Raft, ServerState};
use serde::{Deserialize, Serialize};

use super::network::ForwardError;
use super::TypeConfig;

/// One replica's progress, as Kafka's `ReplicaState`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaProgress {
    pub replica_id: i32,
    /// The last log index known to be on the replica, -1 if unknown.
    pub log_end_offset: i64,
    /// Wall-clock ms of the replica's last answered fetch (AppendEntries), -1 if unknown
    /// and for the leader itself.
    pub last_fetch_timestamp: i64,
    /// Wall-clock ms when the replica last held the whole log; now for the leader.
    pub last_caught_up_timestamp: i64,
}

/// What DescribeQuorum answers for the metadata partition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuorumDescription {
    pub leader_id: i32,
    /// The Raft term.
    pub leader_epoch: i32,
    /// The committed log index.
    pub high_watermark: i64,
    pub voters: Vec<ReplicaProgress>,
    pub observers: Vec<ReplicaProgress>,
}

/// The leader's record of when each follower last answered an AppendEntries, and when
/// it last answered one that carried it to the end of the log.
#[derive(Debug, Default)]
pub struct FollowerContacts {
    peers: Mutex<BTreeMap<u64, (i64, i64)>>,
}

impl FollowerContacts {
    /// A follower accepted an AppendEntries; `caught_up` when it sent no entries (a
    /// heartbeat: the follower already held everything before it) .
    pub(crate) fn answered(&self, peer: u64, caught_up: bool) {
        let now = now_ms();
        let mut peers = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        let entry = peers.entry(peer).or_insert((-1, -1));
        entry.0 = now;
        if caught_up {
            entry.1 = now;
        }
    }

    fn get(&self, peer: u64) -> (i64, i64) {
        let peers = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        peers.get(&peer).copied().unwrap_or((-1, -1))
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

fn index(log_id: Option<openraft::LogId<u64>>) -> i64 {
    log_id.map_or(-1, |l| i64::try_from(l.index).unwrap_or(i64::MAX))
}

/// The description from this node, which must be the leader (else NotController with the
/// leader it knows).
pub(crate) fn describe_local(
    raft: &Raft<TypeConfig>,
    contacts: &FollowerContacts,
) -> Result<QuorumDescription, ForwardError> {
    let m = raft.metrics().borrow().clone();
    let Some(replication) = m
        .replication
        .as_ref()
        .filter(|_| m.state == ServerState::Leader)
    else {
        return Err(ForwardError::NotController {
            leader_id: m.current_leader.filter(|l| *l != m.id),
        });
    };
    let membership = m.membership_config.membership();
    let leader_end = m
        .last_log_index
        .map_or(-1, |i| i64::try_from(i).unwrap_or(i64::MAX));
    let now = now_ms();
    let progress = |id: u64| {
        let id32 = i32::try_from(id).unwrap_or(-1);
        if id == m.id {
            return ReplicaProgress {
                replica_id: id32,
                log_end_offset: leader_end,
                last_fetch_timestamp: -1,
                last_caught_up_timestamp: now,
            };
        }
        let (fetch, caught_up) = contacts.get(id);
        let matched = replication.get(&id).copied().flatten();
        ReplicaProgress {
            replica_id: id32,
            log_end_offset: index(matched),
            last_fetch_timestamp: fetch,
            // Holding the leader's whole log now is being caught up now.
            last_caught_up_timestamp: if index(matched) >= leader_end && fetch >= 0 {
                fetch.max(caught_up)
            } else {
                caught_up
            },
        }
    };
    Ok(QuorumDescription {
        leader_id: i32::try_from(m.id).unwrap_or(-1),
        leader_epoch: i32::try_from(m.current_term).unwrap_or(i32::MAX),
        high_watermark: index(m.last_applied),
        voters: membership.voter_ids().map(progress).collect(),
        observers: membership.learner_ids().map(progress).collect(),
    })
}
