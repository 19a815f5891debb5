//! KIP-858 on the controller: replicas placed in log directories, and a failed
//! directory's partitions moved away (see `directories.rs`).

use rill_protocol::{ErrorCode, Uuid};

use super::Harness;
use crate::*;

fn dir(broker: i32, n: u64) -> Uuid {
    Uuid::from_u64_pair(1000 + broker as u64, n)
}

/// Registers `ids` with `dirs_each` log directories each, and unfences them.
fn brokers_with_dirs(h: &mut Harness, ids: &[i32], dirs_each: u64) {
    for id in ids {
        let r = h.run(ControllerEvent::BrokerRegistration(
            BrokerRegistrationRequest {
                broker_id: *id,
                incarnation_id: Uuid::from_u64_pair(*id as u64, 1),
                listeners: vec![],
                rack: None,
                log_dirs: (1..=dirs_each).map(|n| dir(*id, n)).collect(),
            },
        ));
        let ControllerResponse::BrokerRegistration(resp) = r.response else {
            panic!("{r:?}")
        };
        assert_eq!(resp.error_code, ErrorCode::NONE);
        h.epochs.insert(*id, resp.broker_epoch);
    }
    for id in ids {
        assert!(!h.heartbeat(*id).is_fenced);
    }
}

fn assign(h: &mut Harness, broker: i32, topic: &str, p: i32, to: Uuid) -> ErrorCode {
    let topic_id = h.image.topic(topic).unwrap().id;
    let r = h.run(ControllerEvent::AssignReplicasToDirs(
        AssignReplicasToDirsRequest {
            broker_id: broker,
            broker_epoch: h.epochs.get(&broker).copied().unwrap_or(-1),
            assignments: vec![ReplicaDirAssignment {
                topic_id,
                partition: p,
                directory: to,
            }],
        },
    ));
    let ControllerResponse::AssignReplicasToDirs(resp) = r.response else {
        panic!("{r:?}")
    };
    if resp.error_code != ErrorCode::NONE {
        return resp.error_code;
    }
    resp.results[0].error_code
}

fn offline(h: &mut Harness, broker: i32, dirs: Vec<Uuid>) {
    let r = h.run(ControllerEvent::BrokerHeartbeat(BrokerHeartbeatRequest {
        broker_id: broker,
        broker_epoch: h.epochs[&broker],
        current_metadata_offset: h.image.last_offset(),
        want_fence: false,
        want_shut_down: false,
        offline_log_dirs: dirs,
    }));
    let ControllerResponse::BrokerHeartbeat(resp) = r.response else {
        panic!("{r:?}")
    };
    assert_eq!(resp.error_code, ErrorCode::NONE);
    assert!(
        !resp.is_fenced,
        "a failed directory does not fence the broker"
    );
}

#[test]
fn a_broker_with_one_directory_gets_it_and_one_with_several_places_its_replicas() {
    let mut h = Harness::new();
    brokers_with_dirs(&mut h, &[1], 1);
    brokers_with_dirs(&mut h, &[2], 3);
    h.create_topic("t", 2, 2);
    let p = h.partition("t", 0);
    assert_eq!(p.directory(1), dir(1, 1), "the only directory, at once");
    assert_eq!(
        p.directory(2),
        directory_id::UNASSIGNED,
        "left to the broker"
    );

    let before = h.partition("t", 0);
    assert_eq!(assign(&mut h, 2, "t", 0, dir(2, 3)), ErrorCode::NONE);
    let after = h.partition("t", 0);
    assert_eq!(after.directory(2), dir(2, 3));
    assert_eq!(after.directory(1), dir(1, 1));
    assert_eq!(after.partition_epoch, before.partition_epoch + 1);
    assert_eq!(
        (after.leader, after.leader_epoch, &after.isr),
        (before.leader, before.leader_epoch, &before.isr)
    );
    // Again: nothing to record.
    let records = h.log.len();
    assert_eq!(assign(&mut h, 2, "t", 0, dir(2, 3)), ErrorCode::NONE);
    assert_eq!(h.log.len(), records);

    assert_eq!(
        assign(&mut h, 3, "t", 0, dir(3, 1)),
        ErrorCode::BROKER_ID_NOT_REGISTERED
    );
    h.create_topic("one", 1, 1);
    let holder = h.partition("one", 0).replicas[0];
    let other = if holder == 1 { 2 } else { 1 };
    assert_eq!(
        assign(&mut h, other, "one", 0, dir(other, 1)),
        ErrorCode::NOT_LEADER_OR_FOLLOWER
    );
    h.check_replay();
    let snapshot = MetadataImage::from_snapshot(h.image.to_snapshot().unwrap()).unwrap();
    assert_eq!(snapshot, h.image, "directories survive a snapshot");
}

#[test]
fn a_failed_directory_moves_only_its_partitions_leaders_and_isr_away() {
    let mut h = Harness::new();
    brokers_with_dirs(&mut h, &[1, 2, 3], 2);
    h.create_topic("t", 6, 3);
    // Broker 1 places partitions 0-2 in its first directory, 3-5 in its second.
    for p in 0..6 {
        let to = if p < 3 { dir(1, 1) } else { dir(1, 2) };
        assert_eq!(assign(&mut h, 1, "t", p, to), ErrorCode::NONE);
    }
    let before: Vec<_> = (0..6).map(|p| h.partition("t", p)).collect();
    assert!(before.iter().any(|p| p.leader == 1));

    offline(&mut h, 1, vec![dir(1, 2)]);
    assert_eq!(h.image.broker(1).unwrap().log_dirs, vec![dir(1, 1)]);
    assert!(h.image.is_live(1), "the broker itself stays");
    for (p, was) in before.iter().enumerate() {
        let now = h.partition("t", p as i32);
        if p < 3 {
            assert_eq!(&now, was, "partition {p} is on an online directory");
        } else {
            assert_ne!(now.leader, 1, "partition {p}");
            assert!(now.leader >= 0, "partition {p} has another leader");
            assert!(!now.isr.contains(&1), "partition {p}: {:?}", now.isr);
            assert!(!h.image.is_live_replica(&now, 1));
        }
    }
    // The same report again changes nothing.
    let records = h.log.len();
    offline(&mut h, 1, vec![dir(1, 2)]);
    assert_eq!(h.log.len(), records);

    // Its leader may not take the replica back while it sits in the failed directory...
    let p = h.partition("t", 3);
    let mut isr = p.isr.clone();
    isr.push(1);
    let r = h.alter_isr("t", 3, &isr);
    assert_eq!(r.partitions[0].error_code, ErrorCode::INELIGIBLE_REPLICA);
    // ...and may once the broker has placed it in an online one.
    assert_eq!(assign(&mut h, 1, "t", 3, dir(1, 1)), ErrorCode::NONE);
    let r = h.alter_isr("t", 3, &isr);
    assert_eq!(r.partitions[0].error_code, ErrorCode::NONE);
    assert!(h.partition("t", 3).isr.contains(&1));
    h.check_replay();
}

#[test]
fn a_replica_alone_in_a_failed_directory_leaves_its_partition_leaderless_until_placed_again() {
    let mut h = Harness::new();
    brokers_with_dirs(&mut h, &[1], 2);
    h.create_topic("solo", 1, 1);
    assert_eq!(assign(&mut h, 1, "solo", 0, dir(1, 2)), ErrorCode::NONE);
    offline(&mut h, 1, vec![dir(1, 2)]);
    let p = h.partition("solo", 0);
    assert_eq!(p.leader, NO_LEADER);
    assert_eq!(p.isr, vec![1], "the last ISR member stays, as when fencing");
    // Placed again in an online directory (a restart found the log gone and made it
    // anew there, as Kafka does): it may lead again.
    assert_eq!(assign(&mut h, 1, "solo", 0, dir(1, 1)), ErrorCode::NONE);
    assert_eq!(h.partition("solo", 0).leader, 1);
    h.check_replay();
}
