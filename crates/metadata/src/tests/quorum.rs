//! Three quorum nodes on loopback inside one test: election, replication, failover,
//! and a restarted node catching up from its disk.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use rill_protocol::Uuid;

use super::free_addr;
use crate::quorum::{CommittedRecords, MetadataQuorum, QuorumConfig};
use crate::*;

fn fast() -> QuorumConfig {
    QuorumConfig {
        heartbeat_interval_ms: 50,
        election_timeout_min_ms: 300,
        election_timeout_max_ms: 600,
        // Small, so that snapshots and log purges happen during the test.
        snapshot_every_entries: 10,
        controller: ControllerConfig::default(),
        ..QuorumConfig::default()
    }
}

async fn start(id: u64, voters: &BTreeMap<u64, SocketAddr>, dir: &Path) -> MetadataQuorum {
    MetadataQuorum::start_with(id, voters.clone(), dir.join(id.to_string()), fast())
        .await
        .unwrap()
}

async fn wait_leader(nodes: &[&MetadataQuorum]) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let leaders: Vec<u64> = nodes
            .iter()
            .filter(|n| n.is_leader())
            .map(|n| n.node_id())
            .collect();
        if leaders.len() == 1 {
            let id = leaders[0];
            // Once its event loop has finalized metadata.version (its first tick), so
            // that the test's own proposals do not race that record.
            let bootstrapped = nodes.iter().any(|n| {
                n.node_id() == id
                    && n.image()
                        .features
                        .contains_key(crate::features::METADATA_VERSION)
            });
            if bootstrapped && nodes.iter().all(|n| n.leader_id() == Some(id)) {
                return id;
            }
        }
        assert!(Instant::now() < deadline, "no leader elected");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The active controller's loop, once: decide against the leader's image, propose.
async fn decide(
    leader: &MetadataQuorum,
    controller: &mut QuorumController,
    event: ControllerEvent,
) -> ControllerResult {
    let image = leader.leader_image().await.unwrap();
    let result = controller.handle(event, &image, 0, 0);
    if !result.records.is_empty() {
        let offset = leader.propose(result.records.clone()).await.unwrap();
        assert_eq!(offset, image.next_offset);
    }
    result
}

fn register(id: i32) -> ControllerEvent {
    ControllerEvent::BrokerRegistration(BrokerRegistrationRequest {
        broker_id: id,
        incarnation_id: Uuid::from_u64_pair(id as u64, 1),
        listeners: vec![],
        rack: None,
        log_dirs: vec![],
    })
}

/// A broker following the log: applies what `read_committed` hands it.
fn follow(node: &MetadataQuorum, image: &mut MetadataImage) {
    match node.read_committed(image.next_offset) {
        CommittedRecords::Records(rs) => {
            for (offset, r) in rs {
                assert_eq!(offset, image.next_offset);
                image.apply(&r).unwrap();
            }
        }
        CommittedRecords::Image(i) => *image = *i,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_elect_replicate_fail_over_and_catch_up() {
    let dir = tempfile::tempdir().unwrap();
    let voters: BTreeMap<u64, SocketAddr> = (1..=3).map(|id| (id, free_addr())).collect();
    let mut n1 = Some(start(1, &voters, dir.path()).await);
    let mut n2 = Some(start(2, &voters, dir.path()).await);
    let mut n3 = Some(start(3, &voters, dir.path()).await);
    let leader_id = wait_leader(&[
        n1.as_ref().unwrap(),
        n2.as_ref().unwrap(),
        n3.as_ref().unwrap(),
    ])
    .await;
    let nodes = [&mut n1, &mut n2, &mut n3];
    let idx = (leader_id - 1) as usize;
    let leader = nodes[idx].as_ref().unwrap();

    // A follower refuses proposals and names the leader.
    let follower = nodes[(idx + 1) % 3].as_ref().unwrap();
    match follower.propose(vec![]).await {
        Err(MetadataError::NotController { leader_id: l }) => assert_eq!(l, Some(leader_id)),
        other => panic!("{other:?}"),
    }

    // The controller registers brokers and creates topics through the quorum. The
    // brokers' ids are not the quorum nodes' ids: the node's own event loop fences a
    // broker whose id's quorum port refused a dial (its process is gone), and at start
    // the nodes refuse each other's dials until all listen.
    let mut controller = QuorumController::new(ControllerConfig::default());
    for b in 11..=13 {
        decide(leader, &mut controller, register(b)).await;
    }
    let image = leader.leader_image().await.unwrap();
    for b in 11..=13 {
        let epoch = image.broker(b).unwrap().epoch;
        decide(
            leader,
            &mut controller,
            ControllerEvent::BrokerHeartbeat(BrokerHeartbeatRequest {
                broker_id: b,
                broker_epoch: epoch,
                current_metadata_offset: image.last_offset(),
                want_fence: false,
                want_shut_down: false,
                offline_log_dirs: vec![],
            }),
        )
        .await;
    }
    for t in 0..15 {
        let r = decide(
            leader,
            &mut controller,
            ControllerEvent::CreateTopics(CreateTopicsRequest {
                topics: vec![CreatableTopic::new(&format!("t{t}"), 3, 3)],
                validate_only: false,
            }),
        )
        .await;
        let ControllerResponse::CreateTopics(v) = r.response else {
            panic!()
        };
        assert_eq!(v[0].error_code, rill_protocol::ErrorCode::NONE);
    }
    let committed = leader.committed_offset();
    assert!(committed > 60);
    for n in nodes.iter() {
        let n = n.as_ref().unwrap();
        assert!(
            n.wait_for_offset(committed, Duration::from_secs(10)).await,
            "node {} behind",
            n.node_id()
        );
    }
    let reference = leader.image();
    check_image_invariants(&reference).unwrap();
    // More entries than snapshot_every_entries: a snapshot was taken and the log purged.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !dir
        .path()
        .join(leader_id.to_string())
        .join("snapshot")
        .exists()
    {
        assert!(Instant::now() < deadline, "no snapshot written");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(reference.topics.len(), 15);
    for n in nodes.iter() {
        let n = n.as_ref().unwrap();
        assert_eq!(n.image(), reference);
        // A broker following the log from offset 0 rebuilds the same image.
        let mut mine = MetadataImage::new();
        follow(n, &mut mine);
        assert_eq!(mine, reference);
    }

    // Kill the leader: the others elect a new one, which still has every record.
    let old = nodes[idx].take().unwrap();
    old.shutdown().await.unwrap();
    let survivors: Vec<&MetadataQuorum> = nodes.iter().filter_map(|n| n.as_ref()).collect();
    let new_leader_id = wait_leader(&survivors).await;
    assert_ne!(new_leader_id, leader_id);
    let new_leader = survivors
        .iter()
        .find(|n| n.node_id() == new_leader_id)
        .unwrap();
    assert!(new_leader.controller_epoch() > 0);
    let image = new_leader.leader_image().await.unwrap();
    assert_eq!(
        image.topics, reference.topics,
        "committed records survive the failover"
    );
    let mut controller = QuorumController::new(ControllerConfig::default());
    decide(
        new_leader,
        &mut controller,
        ControllerEvent::CreateTopics(CreateTopicsRequest {
            topics: vec![CreatableTopic::new("after-failover", 1, 2)],
            validate_only: false,
        }),
    )
    .await;
    let committed = new_leader.committed_offset();
    for n in &survivors {
        assert!(n.wait_for_offset(committed, Duration::from_secs(10)).await);
    }

    // Restart the old leader from its directory: it catches up.
    let restarted = start(leader_id, &voters, dir.path()).await;
    assert!(
        restarted
            .wait_for_offset(committed, Duration::from_secs(20))
            .await,
        "restarted node stuck at {}",
        restarted.committed_offset()
    );
    let final_image = new_leader.image();
    assert!(final_image.topic("after-failover").is_some());
    // Give the restarted node a moment to apply the same entry the leader has.
    let deadline = Instant::now() + Duration::from_secs(10);
    while restarted.image() != final_image {
        assert!(Instant::now() < deadline, "restarted node diverged");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    restarted.shutdown().await.unwrap();
    for n in nodes.into_iter() {
        if let Some(n) = n.take() {
            n.shutdown().await.unwrap();
        }
    }
}

/// Three voters with the given election timeout (heartbeats every 50 ms), and the leader.
async fn three(
    dir: &Path,
    timeout_ms: (u64, u64),
) -> (BTreeMap<u64, SocketAddr>, Vec<MetadataQuorum>, u64) {
    let voters: BTreeMap<u64, SocketAddr> = (1..=3).map(|id| (id, free_addr())).collect();
    let config = QuorumConfig {
        election_timeout_min_ms: timeout_ms.0,
        election_timeout_max_ms: timeout_ms.1,
        ..fast()
    };
    let mut nodes = Vec::new();
    for id in 1..=3 {
        nodes.push(
            MetadataQuorum::start_with(
                id,
                voters.clone(),
                dir.join(id.to_string()),
                config.clone(),
            )
            .await
            .unwrap(),
        );
    }
    let leader = wait_leader(&nodes.iter().collect::<Vec<_>>()).await;
    (voters, nodes, leader)
}

/// Issue #14, item 3 (Pre-Vote): a voter cut off from its peers for many election
/// timeouts asks for pre-votes, gets none, and so never raises its term; when the
/// partition heals it follows the same leader in the same term, with no election. Before
/// Pre-Vote its term rose at every timeout, and its return deposed the leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_voter_comes_back_without_an_election() {
    let dir = tempfile::tempdir().unwrap();
    let (_, nodes, leader) = three(dir.path(), (300, 600)).await;
    let term = nodes[0].controller_epoch();
    let follower = nodes.iter().find(|n| n.node_id() != leader).unwrap();
    follower.isolate(true);
    // Ten election timeouts and more.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        follower.controller_epoch(),
        term,
        "the cut-off voter stood for election"
    );
    for n in &nodes {
        assert_eq!(n.controller_epoch(), term, "node {}", n.node_id());
    }
    follower.isolate(false);
    let deadline = Instant::now() + Duration::from_secs(10);
    while follower.leader_id() != Some(leader) {
        assert!(
            Instant::now() < deadline,
            "the healed voter found no leader"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A few more timeouts after the heal: still the same leader and term everywhere.
    tokio::time::sleep(Duration::from_secs(2)).await;
    for n in &nodes {
        assert_eq!(
            n.controller_epoch(),
            term,
            "node {} after heal",
            n.node_id()
        );
        assert_eq!(
            n.leader_id(),
            Some(leader),
            "node {} after heal",
            n.node_id()
        );
    }
    for n in nodes {
        n.shutdown().await.unwrap();
    }
}

/// A leader cut off from its peers is replaced after an election timeout (the others
/// have not heard from it, so they grant each other's pre-votes), stops acting, and
/// follows the new leader when the partition heals, without raising the term again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_leader_is_replaced_and_follows_after_the_heal() {
    let dir = tempfile::tempdir().unwrap();
    let (_, nodes, old) = three(dir.path(), (300, 600)).await;
    let term = nodes[0].controller_epoch();
    let cut = nodes.iter().find(|n| n.node_id() == old).unwrap();
    cut.isolate(true);
    let others: Vec<&MetadataQuorum> = nodes.iter().filter(|n| n.node_id() != old).collect();
    let new = wait_leader(&others).await;
    assert_ne!(new, old);
    let new_term = others[0].controller_epoch();
    assert!(new_term > term);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        cut.controller_epoch(),
        term,
        "the cut-off leader raised its term"
    );
    cut.isolate(false);
    let deadline = Instant::now() + Duration::from_secs(10);
    while cut.leader_id() != Some(new) || cut.is_leader() {
        assert!(
            Instant::now() < deadline,
            "the old leader did not follow the new one"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    for n in &nodes {
        assert_eq!(
            n.controller_epoch(),
            new_term,
            "node {} after heal",
            n.node_id()
        );
        assert_eq!(n.leader_id(), Some(new), "node {} after heal", n.node_id());
    }
    for n in nodes {
        n.shutdown().await.unwrap();
    }
}

/// A leader whose process is gone (its quorum port refuses) is replaced without waiting
/// for an election timeout, while one that is only cut off is not: the election timeout
/// here is 6 s, so only the fast path of `pre_vote.rs` (late heartbeats, a refused dial,
/// pre-votes granted on the same evidence) can elect a new leader within the test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gone_leader_is_replaced_without_an_election_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let (_, mut nodes, old) = three(dir.path(), (6_000, 7_000)).await;
    let term = nodes[0].controller_epoch();
    let i = nodes.iter().position(|n| n.node_id() == old).unwrap();
    // Cut off, the leader is late but not gone: nobody stands.
    nodes[i].isolate(true);
    tokio::time::sleep(Duration::from_secs(3)).await;
    for n in &nodes {
        assert_eq!(n.controller_epoch(), term, "node {} stood", n.node_id());
    }
    nodes[i].isolate(false);
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Gone: replaced at once.
    nodes.remove(i).shutdown().await.unwrap();
    let started = Instant::now();
    let new = wait_leader(&nodes.iter().collect::<Vec<_>>()).await;
    assert_ne!(new, old);
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "took {:?}: the election waited for a timeout",
        started.elapsed()
    );
    for n in nodes {
        n.shutdown().await.unwrap();
    }
}

#[test]
fn voters_parse() {
    let v = crate::quorum::parse_voters("1@127.0.0.1:9093, 2@127.0.0.1:9094").unwrap();
    assert_eq!(v.len(), 2);
    assert_eq!(v[&2].port(), 9094);
    assert!(crate::quorum::parse_voters("").is_err());
    assert!(crate::quorum::parse_voters("x@127.0.0.1:1").is_err());
    assert!(crate::quorum::parse_voters("1@nohost").is_err());
    assert!(crate::quorum::parse_voters("1@127.0.0.1:1,1@127.0.0.1:2").is_err());
    let shared = crate::quorum::parse_voters("1@127.0.0.1:9093,2@127.0.0.1:9093")
        .unwrap_err()
        .to_string();
    assert!(
        shared.contains("nodes 1 and 2 are both at 127.0.0.1:9093"),
        "{shared}"
    );
}

#[test]
fn log_store_survives_a_torn_tail() {
    use openraft::storage::RaftLogStorage;
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut store = crate::quorum::LogStore::open(dir.path()).unwrap();
        let vote = openraft::Vote::new(3, 1);
        store.save_vote(&vote).await.unwrap();
        drop(store);
        // Append garbage (a torn frame) to the log file.
        std::fs::write(dir.path().join("raft.log"), [0u8, 0, 0, 9, 1, 2]).unwrap();
        let mut store = crate::quorum::LogStore::open(dir.path()).unwrap();
        assert_eq!(store.read_vote().await.unwrap(), Some(vote));
        let state = store.get_log_state().await.unwrap();
        assert_eq!(state.last_log_id, None);
        assert_eq!(
            std::fs::metadata(dir.path().join("raft.log"))
                .unwrap()
                .len(),
            0
        );
    });
}

/// DescribeQuorum (issue #19): every node answers with the leader's view, asking the
/// leader when it is not it; each follower's log end and last contact are known, and a
/// follower that is cut off falls behind while its last contact stops moving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn describe_quorum_reports_the_leaders_view_from_any_node() {
    let dir = tempfile::tempdir().unwrap();
    let (_, nodes, leader) = three(dir.path(), (300, 600)).await;
    let leader_node = nodes.iter().find(|n| n.node_id() == leader).unwrap();
    let mut controller = QuorumController::new(ControllerConfig::default());
    // Not the quorum nodes' ids (see `three_nodes_elect_replicate_fail_over_and_catch_up`).
    for id in 11..=13 {
        decide(leader_node, &mut controller, register(id)).await;
    }
    // A few heartbeats, so each follower has answered one holding the whole log.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for n in &nodes {
        let d = n.describe(Duration::from_secs(5)).await.unwrap();
        assert_eq!(d.leader_id, leader as i32, "asked node {}", n.node_id());
        assert_eq!(d.leader_epoch as u64, n.controller_epoch());
        assert!(d.high_watermark >= 3, "{d:?}");
        assert_eq!(d.voters.len(), 3, "{d:?}");
        assert!(d.observers.is_empty(), "{d:?}");
        let leader_end = d
            .voters
            .iter()
            .find(|v| v.replica_id == leader as i32)
            .unwrap()
            .log_end_offset;
        for v in &d.voters {
            assert_eq!(v.log_end_offset, leader_end, "{d:?}");
            assert!(v.last_caught_up_timestamp > 0, "{d:?}");
            if v.replica_id != leader as i32 {
                assert!(v.last_fetch_timestamp > 0, "{d:?}");
            }
        }
    }

    let cut = nodes.iter().find(|n| n.node_id() != leader).unwrap();
    cut.isolate(true);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = leader_node.describe(Duration::from_secs(5)).await.unwrap();
    decide(leader_node, &mut controller, register(14)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = leader_node.describe(Duration::from_secs(5)).await.unwrap();
    let of = |d: &crate::QuorumDescription, id: u64| {
        d.voters
            .iter()
            .find(|v| v.replica_id == id as i32)
            .unwrap()
            .clone()
    };
    let (was, now) = (of(&before, cut.node_id()), of(&after, cut.node_id()));
    assert_eq!(
        now.last_fetch_timestamp, was.last_fetch_timestamp,
        "{after:?}"
    );
    assert!(
        now.log_end_offset < of(&after, leader).log_end_offset,
        "{after:?}"
    );
    assert!(after.high_watermark > before.high_watermark, "{after:?}");
    cut.isolate(false);
    for n in nodes {
        n.shutdown().await.unwrap();
    }
}
