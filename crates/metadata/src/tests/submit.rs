//! The controller event loop and `MetadataQuorum::submit`: one node alone, three nodes
//! with forwarding and failover, lease expiry, and a quorum that is gone.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use rill_protocol::{ErrorCode, Uuid};

use crate::quorum::{MetadataQuorum, QuorumConfig};
use crate::*;

fn free_addr() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

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
    })
}

fn heartbeat(id: i32, epoch: i64, offset: i64) -> ControllerEvent {
    ControllerEvent::BrokerHeartbeat(BrokerHeartbeatRequest {
        broker_id: id,
        broker_epoch: epoch,
        current_metadata_offset: offset,
        want_fence: false,
        want_shut_down: false,
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
