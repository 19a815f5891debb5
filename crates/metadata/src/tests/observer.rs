//! Observers (broker-only nodes, openraft learners) beside three voters: joining and
//! following the log, forwarding controller events, a late join served by a snapshot,
//! restarts on the same and on another address, a leader change, and that observers
//! never count toward the quorum nor lead.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use rill_protocol::{ErrorCode, Uuid};

use super::free_addr;
use crate::quorum::{self, CommittedRecords, MetadataQuorum, QuorumConfig};
use crate::*;

const TIMEOUT: Duration = Duration::from_secs(10);

/// Topics created before the late observer starts: enough entries that the leader's log
/// is purged past its beginning (a snapshot every 10 entries, 100 kept behind it).
const TOPICS: usize = 150;

fn fast() -> QuorumConfig {
    QuorumConfig {
        heartbeat_interval_ms: 50,
        election_timeout_min_ms: 300,
        election_timeout_max_ms: 600,
        // Small, so that a late observer is behind the purged log and needs a snapshot.
        snapshot_every_entries: 10,
        // No heartbeats here after the first: the one broker must stay unfenced.
        controller: ControllerConfig {
            broker_session_timeout_ms: 600_000,
            ..ControllerConfig::default()
        },
        ..QuorumConfig::default()
    }
}

async fn voter(id: u64, voters: &BTreeMap<u64, SocketAddr>, dir: &Path) -> MetadataQuorum {
    MetadataQuorum::start_with(id, voters.clone(), dir.join(id.to_string()), fast())
        .await
        .unwrap()
}

async fn observer(
    id: u64,
    listen: SocketAddr,
    voters: &BTreeMap<u64, SocketAddr>,
    dir: &Path,
) -> MetadataQuorum {
    MetadataQuorum::start_observer(id, listen, voters.clone(), dir.join(id.to_string()), fast())
        .await
        .unwrap()
}

async fn wait_until(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn register(id: i32, incarnation: u64) -> ControllerEvent {
    ControllerEvent::BrokerRegistration(BrokerRegistrationRequest {
        broker_id: id,
        incarnation_id: Uuid::from_u64_pair(id as u64, incarnation),
        listeners: vec![Endpoint {
            name: "PLAINTEXT".into(),
            host: "127.0.0.1".into(),
            port: 9092,
            security_protocol: 0,
        }],
        rack: None,
        log_dirs: vec![],
    })
}

/// Registers broker `id` through `node` and heartbeats it unfenced.
async fn register_unfenced(node: &MetadataQuorum, id: i32, incarnation: u64) {
    let r = submit(node, register(id, incarnation)).await;
    let ControllerResponse::BrokerRegistration(reg) = &r.response else {
        panic!("{:?}", r.response)
    };
    assert_eq!(reg.error_code, ErrorCode::NONE);
    let hb = ControllerEvent::BrokerHeartbeat(BrokerHeartbeatRequest {
        broker_id: id,
        broker_epoch: reg.broker_epoch,
        current_metadata_offset: r.next_offset - 1,
        want_fence: false,
        want_shut_down: false,
        offline_log_dirs: vec![],
    });
    let r = submit(node, hb).await;
    let ControllerResponse::BrokerHeartbeat(hb) = &r.response else {
        panic!("{:?}", r.response)
    };
    assert!(!hb.is_fenced, "{hb:?}");
    assert!(!node.image().broker(id).unwrap().fenced);
}

/// Creates topic `name`, one partition on the one broker, and checks it was.
fn create(name: &str) -> ControllerEvent {
    ControllerEvent::CreateTopics(CreateTopicsRequest {
        topics: vec![CreatableTopic::new(name, 1, 1)],
        validate_only: false,
    })
}

/// Submits through `node` (forwarded to the active controller) and waits until the
/// decision is applied on `node` itself.
async fn submit(node: &MetadataQuorum, event: ControllerEvent) -> SubmitResult {
    let r = node.submit(event, TIMEOUT).await.unwrap();
    assert!(node.wait_for_offset(r.next_offset, TIMEOUT).await);
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observers_follow_the_log_forward_events_and_never_count() {
    let dir = tempfile::tempdir().unwrap();
    let voters: BTreeMap<u64, SocketAddr> = (1..=3).map(|id| (id, free_addr())).collect();
    let mut nodes = Vec::new();
    for id in 1..=3 {
        nodes.push(Some(voter(id, &voters, dir.path()).await));
    }

    // 1. An observer started with the voters joins as a learner and follows the log;
    //    its events are forwarded to the active controller.
    let obs_addr = free_addr();
    let obs = observer(10, obs_addr, &voters, dir.path()).await;
    assert!(!obs.is_voter());
    wait_until("observer 10 is a member", || obs.is_member()).await;
    register_unfenced(&obs, 10, 1).await;
    let voter_view = nodes[0].as_ref().unwrap();
    assert_eq!(voter_view.voters(), [1, 2, 3].into());
    wait_until("the voters see observer 10", || {
        voter_view.observers() == [(10, obs_addr.to_string())].into()
    })
    .await;

    // 2. A late observer, after enough entries that the leader has snapshotted and
    //    purged the log's beginning: it gets the snapshot, then the entries after it.
    for i in 0..TOPICS {
        submit(&obs, create(&format!("t{i}"))).await;
    }
    let late = observer(11, free_addr(), &voters, dir.path()).await;
    let target = obs.committed_offset();
    assert!(late.wait_for_offset(target, TIMEOUT).await);
    assert_eq!(late.image().topics_by_name.len(), TOPICS);
    // It started from a snapshot: it holds no records from the log's beginning.
    assert!(matches!(late.read_committed(0), CommittedRecords::Image(_)));
    submit(&late, create("after-snapshot")).await;
    assert!(late.image().topic("after-snapshot").is_some());

    // 3. Restart with the same id and address: the join changes nothing and the
    //    observer catches up with what it missed.
    late.shutdown().await.unwrap();
    obs.shutdown().await.unwrap();
    // Its quorum port closed with the process: the active controller fences broker 10
    // at once, without waiting for its lease (issue #14, item 4).
    wait_until("broker 10 is fenced", || {
        voter_view.image().broker(10).is_some_and(|b| b.fenced)
    })
    .await;
    let obs = observer(10, obs_addr, &voters, dir.path()).await;
    let target = voter_view.committed_offset();
    assert!(obs.wait_for_offset(target, TIMEOUT).await);
    // What it missed: its own fencing.
    assert!(obs.image().broker(10).is_some_and(|b| b.fenced));
    assert_eq!(
        voter_view.observers().keys().copied().collect::<Vec<_>>(),
        [10, 11]
    );
    // Fenced while it was down, a restarted broker registers again, as `rill server`
    // does.
    register_unfenced(&obs, 10, 2).await;

    // A second process with live broker 10's id, at another address, is not given
    // broker 10's log: the membership keeps the live one's address.
    let imposter_addr = free_addr();
    let imposter = observer(10, imposter_addr, &voters, &dir.path().join("imposter")).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(voter_view.observers()[&10], obs_addr.to_string());
    imposter.shutdown().await.unwrap();

    // 4. Restart on another address: the membership takes the new one and replication
    //    goes there.
    let late = observer(11, free_addr(), &voters, dir.path()).await;
    submit(voter_view, create("after-move")).await;
    let target = voter_view.committed_offset();
    assert!(late.wait_for_offset(target, TIMEOUT).await);
    assert!(late.image().topic("after-move").is_some());

    // 5. The active controller dies: a voter takes over, the observers follow the new
    //    leader without joining again, and never lead.
    let leader = nodes
        .iter()
        .flatten()
        .find(|n| n.is_leader())
        .map(|n| n.node_id())
        .unwrap();
    nodes[leader as usize - 1]
        .take()
        .unwrap()
        .shutdown()
        .await
        .unwrap();
    submit(&obs, create("after-failover")).await;
    let target = obs.committed_offset();
    assert!(late.wait_for_offset(target, TIMEOUT).await);
    assert!(late.image().topic("after-failover").is_some());
    let new_leader = obs.leader_id().unwrap();
    assert_ne!(new_leader, leader);
    assert!(voters.contains_key(&new_leader));
    assert!(!obs.is_leader() && !late.is_leader());

    // 6. With a second voter gone, two observers and one voter are no quorum: nothing
    //    commits, and the observers stay observers.
    let second = nodes
        .iter()
        .flatten()
        .find(|n| n.node_id() != new_leader)
        .map(|n| n.node_id())
        .unwrap();
    nodes[second as usize - 1]
        .take()
        .unwrap()
        .shutdown()
        .await
        .unwrap();
    let before = obs.committed_offset();
    let r = obs
        .submit(create("no-quorum"), Duration::from_secs(3))
        .await;
    assert!(r.is_err(), "committed without a quorum of voters: {r:?}");
    assert_eq!(obs.committed_offset(), before);
    assert!(!obs.is_leader() && !late.is_leader());
    assert!(obs.image().topic("no-quorum").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_is_refused_a_voter_id_and_an_unreachable_address() {
    let dir = tempfile::tempdir().unwrap();
    let voters: BTreeMap<u64, SocketAddr> = [(1, free_addr())].into();
    // Refused before anything starts, on the observer's side…
    let voter_id = MetadataQuorum::start_observer(
        1,
        free_addr(),
        voters.clone(),
        dir.path().join("a"),
        fast(),
    )
    .await;
    assert!(voter_id.is_err());
    let wildcard = MetadataQuorum::start_observer(
        2,
        "0.0.0.0:0".parse().unwrap(),
        voters.clone(),
        dir.path().join("b"),
        fast(),
    )
    .await;
    assert!(wildcard.is_err());

    // …and by the active controller, whoever asks over the quorum port.
    let leader = voter(1, &voters, dir.path()).await;
    wait_until("node 1 leads", || leader.is_leader()).await;
    let leader_addr = voters[&1];
    let ask = |id: u64| async move {
        let mut stream: quorum::QuorumStream =
            Box::new(tokio::net::TcpStream::connect(leader_addr).await.unwrap());
        quorum::call_add_observer(&mut stream, id, "127.0.0.1:1".into())
            .await
            .unwrap()
    };
    for id in [1, u64::from(u32::MAX)] {
        match ask(id).await {
            Err(quorum::ForwardError::Other(reason)) => {
                assert!(reason.contains("node"), "{reason}")
            }
            other => panic!("node {id} added as an observer: {other:?}"),
        }
    }
    assert!(leader.observers().is_empty());
    ask(7).await.unwrap();
    assert_eq!(leader.observers()[&7], "127.0.0.1:1");
}
