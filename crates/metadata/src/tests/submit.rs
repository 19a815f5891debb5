//! The controller event loop and `MetadataQuorum::submit`: one node alone, three nodes
//! with forwarding and failover, lease expiry, and a quorum that is gone.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use rill_protocol::{ErrorCode, Uuid};

use super::free_addr;
use crate::quorum::{MetadataQuorum, QuorumConfig};
use crate::*;

fn fast(session_timeout_ms: i64) -> QuorumConfig {
    QuorumConfig {
        heartbeat_interval_ms: 50,
        election_timeout_min_ms: 300,
        election_timeout_max_ms: 600,
        snapshot_every_entries: 1_000,
        controller: ControllerConfig {
            broker_session_timeout_ms: session_timeout_ms,
            ..ControllerConfig::default()
        },
        ..QuorumConfig::default()
    }
}

async fn start(
    id: u64,
    voters: &BTreeMap<u64, SocketAddr>,
    dir: &Path,
    config: QuorumConfig,
) -> MetadataQuorum {
    MetadataQuorum::start_with(id, voters.clone(), dir.join(id.to_string()), config)
        .await
        .unwrap()
}

const TIMEOUT: Duration = Duration::from_secs(10);

fn register(id: i32) -> ControllerEvent {
    ControllerEvent::BrokerRegistration(BrokerRegistrationRequest {
        broker_id: id,
        incarnation_id: Uuid::from_u64_pair(id as u64, 7),
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

fn heartbeat(id: i32, epoch: i64, offset: i64) -> ControllerEvent {
    ControllerEvent::BrokerHeartbeat(BrokerHeartbeatRequest {
        broker_id: id,
        broker_epoch: epoch,
        current_metadata_offset: offset,
        want_fence: false,
        want_shut_down: false,
        offline_log_dirs: vec![],
    })
}

fn create(name: &str, partitions: i32, rf: i16) -> ControllerEvent {
    ControllerEvent::CreateTopics(CreateTopicsRequest {
        topics: vec![CreatableTopic::new(name, partitions, rf)],
        validate_only: false,
    })
}

/// Registers broker `id` and heartbeats it until it is unfenced; returns its epoch.
async fn join(node: &MetadataQuorum, id: i32) -> i64 {
    let r = node.submit(register(id), TIMEOUT).await.unwrap();
    let ControllerResponse::BrokerRegistration(reg) = r.response else {
        panic!("{:?}", r.response)
    };
    assert_eq!(reg.error_code, ErrorCode::NONE);
    assert!(node.wait_for_offset(r.next_offset, TIMEOUT).await);
    let r = node
        .submit(heartbeat(id, reg.broker_epoch, r.next_offset - 1), TIMEOUT)
        .await
        .unwrap();
    let ControllerResponse::BrokerHeartbeat(hb) = r.response else {
        panic!("{:?}", r.response)
    };
    assert_eq!(hb.error_code, ErrorCode::NONE);
    assert!(hb.is_caught_up);
    assert!(node.wait_for_offset(r.next_offset, TIMEOUT).await);
    reg.broker_epoch
}

fn created(r: &SubmitResult) {
    let ControllerResponse::CreateTopics(v) = &r.response else {
        panic!("{:?}", r.response)
    };
    assert_eq!(v[0].error_code, ErrorCode::NONE, "{v:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_node_registers_unfences_and_creates_a_topic() {
    let dir = tempfile::tempdir().unwrap();
    let voters: BTreeMap<u64, SocketAddr> = [(1, free_addr())].into();
    let node = start(1, &voters, dir.path(), fast(9_000)).await;
    join(&node, 1).await;
    assert!(!node.image().broker(1).unwrap().fenced);

    let r = node.submit(create("orders", 3, 1), TIMEOUT).await.unwrap();
    created(&r);
    assert!(node.wait_for_offset(r.next_offset, TIMEOUT).await);
    let image = node.image();
    assert_eq!(image.topic("orders").unwrap().partitions.len(), 3);
    check_image_invariants(&image).unwrap();

    // A decision with no records (a refused duplicate) answers at once.
    let r = node.submit(create("orders", 3, 1), TIMEOUT).await.unwrap();
    let ControllerResponse::CreateTopics(v) = &r.response else {
        panic!()
    };
    assert_eq!(v[0].error_code, ErrorCode::TOPIC_ALREADY_EXISTS);
    assert_eq!(r.next_offset, node.committed_offset());
    node.shutdown().await.unwrap();
}

/// The controller port is reachable before anyone authenticates: a frame that claims
/// 64 MiB and sends ten bytes, a frame of garbage and a frame above the cap each cost
/// their connection only, and the node keeps deciding.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_frames_on_the_controller_port_close_only_their_connection() {
    use tokio::io::AsyncWriteExt;
    let dir = tempfile::tempdir().unwrap();
    let voters: BTreeMap<u64, SocketAddr> = [(1, free_addr())].into();
    let node = start(1, &voters, dir.path(), fast(9_000)).await;
    join(&node, 1).await;
    let addr = node.local_addr();
    let mut held = Vec::new();
    let frames: [Vec<u8>; 3] = [
        [&((64u32 << 20) - 1).to_be_bytes()[..], &[7u8; 10][..]].concat(),
        [&8u32.to_be_bytes()[..], &[0xff; 8][..]].concat(),
        u32::MAX.to_be_bytes().to_vec(),
    ];
    for frame in &frames {
        // Many connections at once: none of them may reserve what its prefix claims.
        for _ in 0..64 {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            s.write_all(frame).await.unwrap();
            held.push(s);
        }
    }
    let r = node
        .submit(create("still-here", 1, 1), TIMEOUT)
        .await
        .unwrap();
    created(&r);
    drop(held);
    node.shutdown().await.unwrap();
}

async fn wait_leader(nodes: &[&MetadataQuorum]) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let leaders: Vec<u64> = nodes
            .iter()
            .filter(|n| n.is_leader())
            .map(|n| n.node_id())
            .collect();
        if let [id] = leaders[..] {
            if nodes.iter().all(|n| n.leader_id() == Some(id)) {
                return id;
            }
        }
        assert!(Instant::now() < deadline, "no leader elected");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn cluster(dir: &Path, config: QuorumConfig) -> Vec<MetadataQuorum> {
    // The ports are found free and bound later, and a test running beside this one can
    // take one in between: such a clash starts the three over, on new ports and empty
    // directories.
    let mut attempts = 0;
    let nodes = 'start: loop {
        attempts += 1;
        let voters: BTreeMap<u64, SocketAddr> = (1..=3).map(|id| (id, free_addr())).collect();
        let mut nodes = Vec::new();
        for id in 1..=3 {
            let started = MetadataQuorum::start_with(
                id,
                voters.clone(),
                dir.join(id.to_string()),
                config.clone(),
            )
            .await;
            match started {
                Ok(node) => nodes.push(node),
                Err(MetadataError::Io { source, .. })
                    if source.kind() == std::io::ErrorKind::AddrInUse && attempts < 5 =>
                {
                    for node in nodes {
                        node.shutdown().await.unwrap();
                    }
                    for id in 1..=3 {
                        let _ = std::fs::remove_dir_all(dir.join(id.to_string()));
                    }
                    continue 'start;
                }
                Err(e) => panic!("node {id} did not start: {e}"),
            }
        }
        break nodes;
    };
    wait_leader(&nodes.iter().collect::<Vec<_>>()).await;
    // The first controller finalizes metadata.version at once; let that record commit
    // everywhere before a test takes nodes away.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !nodes.iter().all(|n| {
        n.image()
            .features
            .contains_key(crate::features::METADATA_VERSION)
    }) {
        assert!(
            Instant::now() < deadline,
            "metadata.version never finalized"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    nodes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_forward_to_the_leader_and_fail_over() {
    let dir = tempfile::tempdir().unwrap();
    let mut nodes = cluster(dir.path(), fast(9_000)).await;
    let leader = nodes.iter().position(|n| n.is_leader()).unwrap();
    let follower = (leader + 1) % 3;

    // A follower's own loop does not act as controller: it names the leader.
    let leader_id = nodes[leader].node_id();
    match nodes[follower].submit_local(register(9)).await {
        Err(MetadataError::NotController { leader_id: l }) => assert_eq!(l, Some(leader_id)),
        other => panic!("{other:?}"),
    }
    assert!(nodes[follower].image().broker(9).is_none());

    // Everything goes through a follower: it forwards to the leader's loop. The brokers
    // are not the quorum's nodes (whose broker ids would be fenced when their process
    // goes, as `a_gone_process_is_fenced_without_waiting_for_its_lease` shows).
    for b in 11..=13 {
        join(&nodes[follower], b).await;
    }
    let r = nodes[follower]
        .submit(create("orders", 3, 3), TIMEOUT)
        .await
        .unwrap();
    created(&r);
    for n in &nodes {
        assert!(n.wait_for_offset(r.next_offset, TIMEOUT).await);
        let image = n.image();
        assert_eq!(image.topic("orders").unwrap().partitions.len(), 3);
        check_image_invariants(&image).unwrap();
    }

    // Kill the leader: a survivor's submit waits out the election and succeeds.
    let old = nodes.remove(leader);
    old.shutdown().await.unwrap();
    let started = Instant::now();
    let r = nodes[0]
        .submit(create("after-failover", 2, 2), TIMEOUT)
        .await
        .unwrap();
    created(&r);
    assert!(started.elapsed() < TIMEOUT);
    for n in &nodes {
        assert!(n.wait_for_offset(r.next_offset, TIMEOUT).await);
        let image = n.image();
        assert!(image.topic("after-failover").is_some());
        assert!(image.topic("orders").is_some());
    }
    // The new controller restarted the leases: nobody was fenced by the takeover.
    let image = nodes[0].image();
    assert!((11..=13).all(|b| !image.broker(b).unwrap().fenced));
    // And it answers from the other survivor too.
    let r = nodes[1]
        .submit(create("third", 1, 1), TIMEOUT)
        .await
        .unwrap();
    created(&r);
    for n in nodes {
        n.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_fence_a_broker_whose_heartbeats_stop() {
    let dir = tempfile::tempdir().unwrap();
    let nodes = cluster(dir.path(), fast(1_000)).await;
    let leader = nodes.iter().position(|n| n.is_leader()).unwrap();
    let follower = &nodes[(leader + 1) % 3];
    let epoch1 = join(follower, 1).await;
    join(follower, 2).await;
    let r = follower.submit(create("t", 2, 2), TIMEOUT).await.unwrap();
    created(&r);

    // Broker 1 keeps heartbeating; broker 2 has stopped. Only the leader's tick can fence
    // broker 2, since nobody submits anything about it.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let offset = follower.committed_offset() - 1;
        follower
            .submit(heartbeat(1, epoch1, offset), TIMEOUT)
            .await
            .unwrap();
        let image = follower.image();
        if image.broker(2).unwrap().fenced {
            assert!(!image.broker(1).unwrap().fenced);
            let t = image.topic("t").unwrap();
            for p in t.partitions.values() {
                assert_ne!(p.leader, 2, "a fenced broker leads nothing");
                assert!(!p.isr.contains(&2) || p.isr == vec![2]);
            }
            check_image_invariants(&image).unwrap();
            break;
        }
        assert!(Instant::now() < deadline, "broker 2 never fenced");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for n in nodes {
        n.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submit_without_a_quorum_fails() {
    let short = Duration::from_millis(1_500);
    // Once with the leader left alone (its proposal cannot commit), once with a
    // follower left alone (no leader can be elected).
    for keep_leader in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let mut nodes = cluster(dir.path(), fast(9_000)).await;
        let leader = nodes.iter().position(|n| n.is_leader()).unwrap();
        let keep = if keep_leader {
            leader
        } else {
            (leader + 1) % 3
        };
        let survivor = nodes.remove(keep);
        for n in nodes {
            n.shutdown().await.unwrap();
        }
        let started = Instant::now();
        let r = survivor.submit(register(1), short).await;
        let took = started.elapsed();
        assert!(
            matches!(
                r,
                Err(MetadataError::NotController { .. } | MetadataError::Timeout { .. })
            ),
            "keep_leader={keep_leader}: {r:?}"
        );
        assert!(
            took >= short && took < short + Duration::from_secs(1),
            "{took:?}"
        );
        survivor.shutdown().await.unwrap();
    }
}

/// Issue #14, item 3 (check-quorum): a leader left without its quorum stops acting as
/// the controller once the followers' leader lease has passed, rather than holding
/// events it can never commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_without_its_quorum_stops_deciding() {
    let dir = tempfile::tempdir().unwrap();
    let mut nodes = cluster(dir.path(), fast(9_000)).await;
    let leader = nodes.iter().position(|n| n.is_leader()).unwrap();
    let alone = nodes.remove(leader);
    for n in nodes {
        n.shutdown().await.unwrap();
    }
    // Past the lease (election_timeout_max) and a heartbeat or two.
    tokio::time::sleep(Duration::from_millis(2_000)).await;
    let started = Instant::now();
    // Without the check it would propose and wait for a commit that cannot come.
    let r = tokio::time::timeout(Duration::from_secs(2), alone.submit_local(register(1))).await;
    assert!(
        matches!(r, Ok(Err(MetadataError::NotController { .. }))),
        "{r:?}"
    );
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "{:?}",
        started.elapsed()
    );
    alone.shutdown().await.unwrap();
}

#[test]
fn controller_messages_round_trip_through_postcard() {
    let events = [
        register(3),
        heartbeat(3, 17, 42),
        create("x", 1, 1),
        ControllerEvent::AlterPartition(AlterPartitionRequest {
            broker_id: 1,
            broker_epoch: 5,
            partitions: vec![AlterPartitionData {
                topic_id: Uuid::from_u64_pair(9, 9),
                partition_index: 0,
                leader_epoch: 1,
                partition_epoch: 2,
                new_isr: vec![(1, 5), (2, -1)],
                leader_recovery_state: 0,
            }],
        }),
    ];
    for e in events {
        let bytes = postcard::to_allocvec(&e).unwrap();
        assert_eq!(postcard::from_bytes::<ControllerEvent>(&bytes).unwrap(), e);
    }
    let answer = SubmitResult {
        response: ControllerResponse::CreateTopics(vec![CreatableTopicResult {
            name: "x".into(),
            topic_id: Uuid::from_u64_pair(1, 2),
            error_code: ErrorCode::TOPIC_ALREADY_EXISTS,
            error_message: Some("exists".into()),
            num_partitions: 1,
            replication_factor: 1,
        }]),
        next_offset: 12,
    };
    let bytes = postcard::to_allocvec(&answer).unwrap();
    assert_eq!(
        postcard::from_bytes::<SubmitResult>(&bytes).unwrap(),
        answer
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_controller_restarts_leases_then_fences_the_silent() {
    let dir = tempfile::tempdir().unwrap();
    let mut nodes = cluster(dir.path(), fast(1_000)).await;
    let leader = nodes.iter().position(|n| n.is_leader()).unwrap();
    // Not a quorum node's id: a gone node's broker is fenced at once (step 7 of the
    // event loop), and this test is about a broker that went silent.
    join(&nodes[leader], 11).await;
    // Every survivor has seen broker 11 unfenced before the leader goes.
    let committed = nodes[leader].committed_offset();
    for n in &nodes {
        assert!(n.wait_for_offset(committed, TIMEOUT).await);
        assert!(!n.image().broker(11).unwrap().fenced);
    }
    let old = nodes.remove(leader);
    old.shutdown().await.unwrap();
    let killed = Instant::now();

    // No event reaches the new controller: its own loop takes over on the election,
    // counts broker 11 as heard from at takeover, and fences it a session later.
    let deadline = killed + Duration::from_secs(10);
    loop {
        let image = nodes[0].image();
        if image.broker(11).unwrap().fenced {
            break;
        }
        assert!(Instant::now() < deadline, "broker 11 never fenced");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        killed.elapsed() >= Duration::from_millis(1_000),
        "fenced at takeover, not a session after it"
    );
    for n in nodes {
        n.shutdown().await.unwrap();
    }
}
