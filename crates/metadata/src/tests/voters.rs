//! KIP-853 on the quorum: a controller started outside the configured voters follows the
//! log until AddRaftVoter makes it a voter; RemoveRaftVoter takes one out (the leader
//! included), and the quorum keeps electing and committing with the voters it has.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use super::free_addr;
use crate::quorum::{MetadataQuorum, QuorumConfig, VoterChangeError};
use crate::*;

fn fast() -> QuorumConfig {
    QuorumConfig {
        heartbeat_interval_ms: 50,
        election_timeout_min_ms: 300,
        election_timeout_max_ms: 600,
        controller: ControllerConfig::default(),
        ..QuorumConfig::default()
    }
}

async fn voter(id: u64, voters: &BTreeMap<u64, SocketAddr>, dir: &Path) -> MetadataQuorum {
    MetadataQuorum::start_with(id, voters.clone(), dir.join(id.to_string()), fast())
        .await
        .unwrap()
}

async fn joiner(
    id: u64,
    addr: SocketAddr,
    voters: &BTreeMap<u64, SocketAddr>,
    dir: &Path,
) -> MetadataQuorum {
    MetadataQuorum::start_controller(id, addr, voters.clone(), dir.join(id.to_string()), fast())
        .await
        .unwrap()
}

async fn until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The one leader every node in `nodes` agrees on.
async fn agreed_leader(nodes: &[&MetadataQuorum]) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let leaders: Vec<u64> = nodes
            .iter()
            .filter(|n| n.is_leader())
            .map(|n| n.node_id())
            .collect();
        if let [l] = leaders.as_slice() {
            if nodes.iter().all(|n| n.leader_id() == Some(*l)) {
                return *l;
            }
        }
        if Instant::now() > deadline {
            let seen: Vec<String> = nodes
                .iter()
                .map(|n| {
                    format!(
                        "{}: leader {:?} voters {:?} term {}",
                        n.node_id(),
                        n.leader_id(),
                        n.voters(),
                        n.controller_epoch()
                    )
                })
                .collect();
            panic!("no leader all agree on: {}", seen.join("; "));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A topic created through `node`'s submit (forwarded to the leader), committed on all.
async fn commit_topic(node: &MetadataQuorum, all: &[&MetadataQuorum], name: &str) {
    let r = node
        .submit(
            ControllerEvent::CreateTopics(CreateTopicsRequest {
                topics: vec![CreatableTopic::new(name, 1, 1)],
                validate_only: false,
            }),
            Duration::from_secs(20),
        )
        .await
        .unwrap();
    for n in all {
        assert!(
            n.wait_for_offset(r.next_offset, Duration::from_secs(20))
                .await,
            "node {} did not commit {name}",
            n.node_id()
        );
        assert!(n.image().topic(name).is_some());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_joins_as_a_voter_and_another_leaves() {
    let dir = tempfile::tempdir().unwrap();
    let voters: BTreeMap<u64, SocketAddr> = (1..=3).map(|id| (id, free_addr())).collect();
    let n1 = voter(1, &voters, dir.path()).await;
    let n2 = voter(2, &voters, dir.path()).await;
    let n3 = voter(3, &voters, dir.path()).await;
    agreed_leader(&[&n1, &n2, &n3]).await;
    // A broker needs a registered broker for topics: one that is a quorum id of none.
    let r = n1
        .submit(
            ControllerEvent::BrokerRegistration(BrokerRegistrationRequest {
                broker_id: 100,
                incarnation_id: rill_protocol::Uuid::from_u64_pair(100, 1),
                listeners: vec![],
                rack: None,
                log_dirs: vec![],
            }),
            Duration::from_secs(20),
        )
        .await
        .unwrap();
    let ControllerResponse::BrokerRegistration(reg) = r.response else {
        panic!("{r:?}")
    };
    n1.submit(
        ControllerEvent::BrokerHeartbeat(BrokerHeartbeatRequest {
            broker_id: 100,
            broker_epoch: reg.broker_epoch,
            current_metadata_offset: r.next_offset,
            want_fence: false,
            want_shut_down: false,
            offline_log_dirs: vec![],
        }),
        Duration::from_secs(20),
    )
    .await
    .unwrap();

    // Node 4 is no configured voter: it follows the log, votes never.
    let addr4 = free_addr();
    let n4 = joiner(4, addr4, &voters, dir.path()).await;
    until("node 4 in the membership as an observer", || n4.is_member()).await;
    assert!(!n4.is_voter());
    commit_topic(&n2, &[&n1, &n2, &n3, &n4], "before").await;

    // AddRaftVoter, asked of any node: it reaches the leader.
    n3.add_voter(4, addr4, Duration::from_secs(30))
        .await
        .unwrap();
    until("node 4 a voter everywhere", || {
        [&n1, &n2, &n3, &n4].iter().all(|n| n.voters().contains(&4))
    })
    .await;
    assert!(n4.is_voter());
    assert_eq!(
        n1.add_voter(4, addr4, Duration::from_secs(5)).await,
        Err(VoterChangeError::Refused {
            error_code: rill_protocol::ErrorCode::DUPLICATE_VOTER.code(),
            message: "node 4 is already a voter".into()
        })
    );
    commit_topic(&n4, &[&n1, &n2, &n3, &n4], "with-four").await;

    // RemoveRaftVoter of the leader itself: the others elect one among them.
    let all = [&n1, &n2, &n3, &n4];
    let leader = agreed_leader(&all).await;
    let asker = all.iter().find(|n| n.node_id() != leader).unwrap();
    asker
        .remove_voter(leader, Duration::from_secs(30))
        .await
        .unwrap();
    let rest: Vec<&MetadataQuorum> = all
        .iter()
        .copied()
        .filter(|n| n.node_id() != leader)
        .collect();
    until("the removed leader out of every membership", || {
        rest.iter().all(|n| !n.voters().contains(&leader))
    })
    .await;
    let new_leader = agreed_leader(&rest).await;
    assert_ne!(new_leader, leader);
    let removed = all.iter().find(|n| n.node_id() == leader).unwrap();
    assert!(!removed.is_voter());
    // It follows the log as an observer again.
    until("the removed voter back as an observer", || {
        rest.iter().all(|n| n.observers().contains_key(&leader))
    })
    .await;
    commit_topic(rest[0], &all, "after-removal").await;
    assert_eq!(
        rest[0].remove_voter(leader, Duration::from_secs(5)).await,
        Err(VoterChangeError::Refused {
            error_code: rill_protocol::ErrorCode::VOTER_NOT_FOUND.code(),
            message: format!("node {leader} is not a voter")
        })
    );

    // A joined voter restarted (still no configured voter) is a voter from its log.
    let other_ids: Vec<u64> = rest
        .iter()
        .map(|n| n.node_id())
        .filter(|id| *id != 4)
        .collect();
    drop(rest);
    if leader != 4 {
        n4.shutdown().await.unwrap();
        let n4 = joiner(4, addr4, &voters, dir.path()).await;
        let others: Vec<&MetadataQuorum> = [&n1, &n2, &n3]
            .into_iter()
            .filter(|n| other_ids.contains(&n.node_id()))
            .collect();
        let mut everyone = others.clone();
        everyone.push(&n4);
        until("node 4 a voter again after its restart", || n4.is_voter()).await;
        agreed_leader(&everyone).await;
        commit_topic(others[0], &everyone, "after-restart").await;
        n4.shutdown().await.unwrap();
    } else {
        n4.shutdown().await.unwrap();
    }
    for n in [n1, n2, n3] {
        n.shutdown().await.unwrap();
    }
}
