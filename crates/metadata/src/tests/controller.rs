//! Deterministic tests of every controller event, with the clock in the harness.

use rill_protocol::{ErrorCode, Uuid};

use super::Harness;
use crate::*;

#[test]
fn registration_assigns_epoch_and_starts_fenced() {
    let mut h = Harness::new();
    let r = h.register(1);
    assert_eq!(r.error_code, ErrorCode::NONE);
    assert_eq!(
        r.broker_epoch, 2,
        "epoch is the offset of the registration record (after the bootstrapped features')"
    );
    let b = h.image.broker(1).unwrap();
    assert!(b.fenced);
    assert_eq!(b.endpoints[0].port, 9092);
    // A heartbeat from a broker that has not applied its registration keeps it fenced.
    let epoch = h.epochs[&1];
    let r = h.run(ControllerEvent::BrokerHeartbeat(BrokerHeartbeatRequest {
        broker_id: 1,
        broker_epoch: epoch,
        current_metadata_offset: -1,
        want_fence: false,
        want_shut_down: false,
        offline_log_dirs: vec![],
    }));
    let ControllerResponse::BrokerHeartbeat(resp) = r.response else {
        panic!()
    };
    assert!(resp.is_fenced && !resp.is_caught_up);
    // Caught up: unfenced.
    let resp = h.heartbeat(1);
    assert!(!resp.is_fenced && resp.is_caught_up);
    assert!(!h.image.broker(1).unwrap().fenced);
}

#[test]
fn duplicate_live_broker_id_is_refused() {
    let mut h = Harness::new();
    h.brokers(&[1]);
    let r = h.register_with(1, 2);
    assert_eq!(r.error_code, ErrorCode::DUPLICATE_BROKER_REGISTRATION);
    // The same incarnation retrying is accepted, with a new epoch.
    let old = h.epochs[&1];
    let r = h.register_with(1, 1);
    assert_eq!(r.error_code, ErrorCode::NONE);
    assert!(r.broker_epoch > old);
    // Once the lease lapses, another incarnation may take the id.
    h.heartbeat(1);
    h.now += 9_001;
    let r = h.register_with(1, 3);
    assert_eq!(r.error_code, ErrorCode::NONE);
}

#[test]
fn restarted_broker_takes_its_replicas_back() {
    let mut h = Harness::new();
    h.brokers(&[1, 2]);
    h.create_topic("t", 2, 2);
    let p0 = h.partition("t", 0);
    let leader = p0.leader;
    // The leader dies and comes back with a new incarnation before its lease lapses:
    // the new registration is fenced, so its leaderships move first.
    let r = h.register_with(leader, 9);
    assert_eq!(r.error_code, ErrorCode::DUPLICATE_BROKER_REGISTRATION);
    h.now += 10_000;
    let other = if leader == 1 { 2 } else { 1 };
    h.heartbeat(other);
    let r = h.register_with(leader, 9);
    assert_eq!(r.error_code, ErrorCode::NONE);
    let p = h.partition("t", 0);
    assert_eq!(p.leader, other);
    assert!(p.leader_epoch > p0.leader_epoch);
    h.heartbeat(leader);
    // It is a replica again; the leader re-admits it to the ISR, and a preferred
    // election gives it back its leadership.
    h.alter_isr("t", 0, &[other, leader]);
    let r = h.run(ControllerEvent::ElectLeaders(ElectLeadersRequest {
        election_type: ElectionType::Preferred,
        partitions: Some(vec![("t".into(), 0)]),
    }));
    let ControllerResponse::ElectLeaders(v) = r.response else {
        panic!()
    };
    assert_eq!(v[0].error_code, ErrorCode::NONE);
    assert_eq!(h.partition("t", 0).leader, leader);
}

#[test]
fn generated_ids_are_above_reserved_max() {
    let mut h = Harness::new();
    let a = h.register(-1);
    let b = h.register(-1);
    assert_eq!(a.broker_id, 1001);
    assert_eq!(b.broker_id, 1002);
    h.register(5);
    assert_eq!(h.register(-1).broker_id, 1003);
    let mut h = Harness::with_config(ControllerConfig {
        broker_id_generation_enable: false,
        ..Default::default()
    });
    assert_eq!(h.register(-1).error_code, ErrorCode::INVALID_REQUEST);
}

#[test]
fn heartbeat_errors() {
    let mut h = Harness::new();
    assert_eq!(
        h.heartbeat(7).error_code,
        ErrorCode::BROKER_ID_NOT_REGISTERED
    );
    h.register(7);
    h.epochs.insert(7, 12345);
    assert_eq!(h.heartbeat(7).error_code, ErrorCode::STALE_BROKER_EPOCH);
}

fn unregister(h: &mut Harness, id: i32) -> UnregisterBrokerResponse {
    match h
        .run(ControllerEvent::UnregisterBroker(UnregisterBrokerRequest {
            broker_id: id,
        }))
        .response
    {
        ControllerResponse::UnregisterBroker(r) => r,
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn unregistered_broker_leaves_every_isr_and_may_register_again() {
    let mut h = Harness::new();
    h.brokers(&[1, 2, 3]);
    h.create_topic("t", 3, 3);
    let before: Vec<_> = (0..3).map(|p| h.partition("t", p)).collect();
    assert_eq!(
        unregister(&mut h, 9).error_code,
        ErrorCode::BROKER_ID_NOT_REGISTERED
    );

    assert_eq!(unregister(&mut h, 1).error_code, ErrorCode::NONE);
    assert!(h.image.broker(1).is_none());
    for (p, old) in before.iter().enumerate() {
        let new = h.partition("t", p as i32);
        assert!(
            !new.isr.contains(&1),
            "an unregistered broker leaves the ISR"
        );
        assert_ne!(new.leader, 1);
        assert_eq!(
            new.replicas, old.replicas,
            "replica lists stay as they were"
        );
    }
    // Forgotten: a second unregistration, and its heartbeats, are refused.
    assert_eq!(
        unregister(&mut h, 1).error_code,
        ErrorCode::BROKER_ID_NOT_REGISTERED
    );
    assert_eq!(
        h.heartbeat(1).error_code,
        ErrorCode::BROKER_ID_NOT_REGISTERED
    );
    // Its lease is gone too: ticking never fences it.
    h.now += 60_000;
    h.heartbeat(2);
    h.heartbeat(3);
    assert!(!h
        .tick()
        .records
        .iter()
        .any(|r| matches!(r, MetadataRecord::FenceBroker(f) if f.id == 1)));
    // It may come back as a new registration.
    assert_eq!(h.register(1).error_code, ErrorCode::NONE);
    assert!(h.image.broker(1).is_some());
    h.check_replay();
}

#[test]
fn lapsed_lease_fences_and_moves_leadership() {
    let mut h = Harness::new();
    h.brokers(&[1, 2, 3]);
    h.create_topic("t", 3, 3);
    let before: Vec<_> = (0..3).map(|p| h.partition("t", p)).collect();
    // Brokers 2 and 3 keep heartbeating; 1 goes silent.
    for _ in 0..3 {
        h.now += 3_000;
        h.heartbeat(2);
        h.heartbeat(3);
        assert!(h.tick().records.is_empty());
    }
    assert_eq!(h.controller.next_deadline(&h.image), Some(9_000));
    h.now = 9_001;
    let r = h.tick();
    assert!(r
        .records
        .iter()
        .any(|r| matches!(r, MetadataRecord::FenceBroker(f) if f.id == 1)));
    assert!(h.image.broker(1).unwrap().fenced);
    for (p, old) in before.iter().enumerate() {
        let new = h.partition("t", p as i32);
        assert!(!new.isr.contains(&1), "fenced broker leaves the ISR");
        assert_ne!(new.leader, 1);
        if old.leader == 1 {
            assert_eq!(new.leader_epoch, old.leader_epoch + 1);
            assert!(old.isr.contains(&new.leader));
        } else {
            assert_eq!(
                new.leader_epoch, old.leader_epoch,
                "no leader change, no epoch bump"
            );
        }
        assert!(new.partition_epoch > old.partition_epoch);
    }
    // A second tick does nothing more.
    assert!(h.tick().records.is_empty());
    h.check_replay();
}

/// Issue #14, item 4: a broker whose process is gone is fenced at once, its leaderships
/// moved as a lapsed lease would; a stale report (an older registration) changes
/// nothing.
#[test]
fn a_gone_process_is_fenced_without_waiting_for_its_lease() {
    let mut h = Harness::new();
    h.brokers(&[1, 2, 3]);
    h.create_topic("t", 3, 3);
    let epoch = h.image.broker(1).unwrap().epoch;
    let stale = h.run(ControllerEvent::BrokerProcessGone(
        BrokerProcessGoneRequest {
            broker_id: 1,
            broker_epoch: epoch - 1,
        },
    ));
    assert!(stale.records.is_empty(), "{stale:?}");
    h.now += 100;
    let r = h.run(ControllerEvent::BrokerProcessGone(
        BrokerProcessGoneRequest {
            broker_id: 1,
            broker_epoch: epoch,
        },
    ));
    assert!(r
        .records
        .iter()
        .any(|r| matches!(r, MetadataRecord::FenceBroker(f) if f.id == 1)));
    assert!(h.image.broker(1).unwrap().fenced);
    for p in 0..3 {
        let part = h.partition("t", p);
        assert_ne!(part.leader, 1);
        assert!(!part.isr.contains(&1));
    }
    // Reported again (another refused dial): nothing more to do.
    let again = h.run(ControllerEvent::BrokerProcessGone(
        BrokerProcessGoneRequest {
            broker_id: 1,
            broker_epoch: epoch,
        },
    ));
    assert!(again.records.is_empty());
    // The restarted process registers and is unfenced as usual.
    assert_eq!(h.register_with(1, 2).error_code, ErrorCode::NONE);
    assert!(!h.heartbeat(1).is_fenced);
    h.check_replay();
}

#[test]
fn no_live_isr_member_means_no_leader_until_it_returns() {
    let mut h = Harness::new();
    h.brokers(&[1, 2]);
    h.create_topic("t", 1, 2);
    let p = h.partition("t", 0);
    let (leader, follower) = (p.replicas[0], p.replicas[1]);
    // The follower falls out of the ISR, then the leader dies.
    h.alter_isr("t", 0, &[leader]);
    h.now += 5_000;
    h.heartbeat(follower);
    h.now += 5_000;
    h.tick();
    let p = h.partition("t", 0);
    assert_eq!(p.leader, NO_LEADER, "the out-of-sync follower may not lead");
    assert_eq!(p.isr, vec![leader], "the ISR keeps its last member");
    // The old leader comes back (new incarnation) and leads again once unfenced.
    h.register_with(leader, 2);
    h.heartbeat(leader);
    let q = h.partition("t", 0);
    assert_eq!(q.leader, leader);
    assert!(q.leader_epoch > p.leader_epoch);
}

/// Topic "t", one partition on brokers 1 and 2: the follower falls out of the ISR, then
/// the leader's lease lapses, leaving the partition without a leader. Returns the
/// out-of-sync follower.
fn leaderless_with_an_out_of_sync_follower() -> (Harness, i32) {
    let mut h = Harness::new();
    h.brokers(&[1, 2]);
    h.create_topic("t", 1, 2);
    let p = h.partition("t", 0);
    let (leader, follower) = (p.replicas[0], p.replicas[1]);
    h.alter_isr("t", 0, &[leader]);
    h.now += 5_000;
    h.heartbeat(follower);
    h.now += 5_000;
    h.tick();
    (h, follower)
}

#[test]
fn unclean_election_when_enabled_for_the_topic() {
    let (mut h, follower) = leaderless_with_an_out_of_sync_follower();
    assert_eq!(h.partition("t", 0).leader, NO_LEADER);
    // Turning unclean election on for the topic elects the out-of-sync follower.
    let r = h.run(ControllerEvent::IncrementalAlterConfigs(
        IncrementalAlterConfigsRequest {
            resources: vec![AlterConfigsResource {
                resource_type: RESOURCE_TOPIC,
                resource_name: "t".into(),
                configs: vec![(
                    "unclean.leader.election.enable".into(),
                    AlterConfigOp::Set,
                    Some("true".into()),
                )],
            }],
            validate_only: false,
        },
    ));
    let ControllerResponse::IncrementalAlterConfigs(v) = r.response else {
        panic!()
    };
    assert_eq!(v[0].error_code, ErrorCode::NONE);
    let p = h.partition("t", 0);
    assert_eq!(p.leader, follower);
    assert_eq!(p.isr, vec![follower]);
    assert_eq!(p.leader_recovery_state, 1);
}

#[test]
fn unclean_election_from_cluster_default_and_elect_leaders() {
    let (mut h, follower) = leaderless_with_an_out_of_sync_follower();
    let elect = |h: &mut Harness, t| {
        let r = h.run(ControllerEvent::ElectLeaders(ElectLeadersRequest {
            election_type: t,
            partitions: Some(vec![("t".into(), 0)]),
        }));
        let ControllerResponse::ElectLeaders(v) = r.response else {
            panic!()
        };
        v[0].error_code
    };
    assert_eq!(
        elect(&mut h, ElectionType::Preferred),
        ErrorCode::PREFERRED_LEADER_NOT_AVAILABLE
    );
    assert_eq!(elect(&mut h, ElectionType::Unclean), ErrorCode::NONE);
    assert_eq!(h.partition("t", 0).leader, follower);
    assert_eq!(
        elect(&mut h, ElectionType::Unclean),
        ErrorCode::ELECTION_NOT_NEEDED
    );
}

#[test]
fn unclean_election_from_a_dynamic_cluster_default() {
    let (mut h, follower) = leaderless_with_an_out_of_sync_follower();
    assert_eq!(h.partition("t", 0).leader, NO_LEADER);
    let set_default = |h: &mut Harness, value: &str| {
        let r = h.run(ControllerEvent::IncrementalAlterConfigs(
            IncrementalAlterConfigsRequest {
                resources: vec![AlterConfigsResource {
                    resource_type: RESOURCE_BROKER,
                    resource_name: String::new(),
                    configs: vec![(
                        "unclean.leader.election.enable".into(),
                        AlterConfigOp::Set,
                        Some(value.into()),
                    )],
                }],
                validate_only: false,
            },
        ));
        let ControllerResponse::IncrementalAlterConfigs(v) = r.response else {
            panic!()
        };
        assert_eq!(v[0].error_code, ErrorCode::NONE);
    };
    // A topic override of false wins over the cluster default.
    let r = h.run(ControllerEvent::IncrementalAlterConfigs(
        IncrementalAlterConfigsRequest {
            resources: vec![AlterConfigsResource {
                resource_type: RESOURCE_TOPIC,
                resource_name: "t".into(),
                configs: vec![(
                    "unclean.leader.election.enable".into(),
                    AlterConfigOp::Set,
                    Some("false".into()),
                )],
            }],
            validate_only: false,
        },
    ));
    assert!(matches!(
        r.response,
        ControllerResponse::IncrementalAlterConfigs(_)
    ));
    set_default(&mut h, "true");
    assert_eq!(h.partition("t", 0).leader, NO_LEADER, "the topic says no");
    // Without the override, the cluster default elects the out-of-sync follower at once.
    let r = h.run(ControllerEvent::IncrementalAlterConfigs(
        IncrementalAlterConfigsRequest {
            resources: vec![AlterConfigsResource {
                resource_type: RESOURCE_TOPIC,
                resource_name: "t".into(),
                configs: vec![(
                    "unclean.leader.election.enable".into(),
                    AlterConfigOp::Delete,
                    None,
                )],
            }],
            validate_only: false,
        },
    ));
    assert!(matches!(
        r.response,
        ControllerResponse::IncrementalAlterConfigs(_)
    ));
    let p = h.partition("t", 0);
    assert_eq!(p.leader, follower);
    assert_eq!(p.leader_recovery_state, 1);
    h.check_replay();
}

#[test]
fn create_topics_validation() {
    let mut h = Harness::new();
    h.brokers(&[1, 2]);
    let create = |h: &mut Harness, t: CreatableTopic| {
        let r = h.run(ControllerEvent::CreateTopics(CreateTopicsRequest {
            topics: vec![t],
            validate_only: false,
        }));
        let ControllerResponse::CreateTopics(v) = r.response else {
            panic!()
        };
        v[0].error_code
    };
    assert_eq!(
        create(&mut h, CreatableTopic::new("", 1, 1)),
        ErrorCode::INVALID_TOPIC_EXCEPTION
    );
    assert_eq!(
        create(&mut h, CreatableTopic::new("..", 1, 1)),
        ErrorCode::INVALID_TOPIC_EXCEPTION
    );
    assert_eq!(
        create(&mut h, CreatableTopic::new("a b", 1, 1)),
        ErrorCode::INVALID_TOPIC_EXCEPTION
    );
    assert_eq!(
        create(&mut h, CreatableTopic::new(&"x".repeat(250), 1, 1)),
        ErrorCode::INVALID_TOPIC_EXCEPTION
    );
    assert_eq!(
        create(&mut h, CreatableTopic::new("t", 0, 1)),
        ErrorCode::INVALID_PARTITIONS
    );
    assert_eq!(
        create(&mut h, CreatableTopic::new("t", 1, 0)),
        ErrorCode::INVALID_REPLICATION_FACTOR
    );
    assert_eq!(
        create(&mut h, CreatableTopic::new("t", 1, 3)),
        ErrorCode::INVALID_REPLICATION_FACTOR
    );
    let mut bad_config = CreatableTopic::new("t", 1, 1);
    bad_config.configs = vec![("no.such.config".into(), Some("1".into()))];
    assert_eq!(create(&mut h, bad_config), ErrorCode::INVALID_CONFIG);
    let mut bad_value = CreatableTopic::new("t", 1, 1);
    bad_value.configs = vec![("min.insync.replicas".into(), Some("0".into()))];
    assert_eq!(create(&mut h, bad_value), ErrorCode::INVALID_CONFIG);
    let mut manual = CreatableTopic::new("m", -1, -1);
    manual.assignments = vec![vec![1, 1]];
    assert_eq!(
        create(&mut h, manual.clone()),
        ErrorCode::INVALID_REPLICA_ASSIGNMENT
    );
    manual.assignments = vec![vec![1, 9]];
    assert_eq!(
        create(&mut h, manual.clone()),
        ErrorCode::INVALID_REPLICA_ASSIGNMENT
    );
    manual.assignments = vec![vec![2, 1], vec![1, 2]];
    manual.num_partitions = 2;
    assert_eq!(create(&mut h, manual.clone()), ErrorCode::INVALID_REQUEST);
    manual.num_partitions = -1;
    assert_eq!(create(&mut h, manual), ErrorCode::NONE);
    assert_eq!(h.partition("m", 0).leader, 2);
    assert_eq!(h.partition("m", 1).leader, 1);
    assert_eq!(h.image.topics.len(), 1, "failed creations leave no records");
    // Defaults, configs, and the name taken.
    let mut t = CreatableTopic::new("t", -1, -1);
    t.configs = vec![("retention.ms".into(), Some("1000".into()))];
    assert_eq!(create(&mut h, t), ErrorCode::NONE);
    assert_eq!(h.image.topic("t").unwrap().partitions.len(), 1);
    assert_eq!(h.image.topic_config("t", "retention.ms"), Some("1000"));
    assert_eq!(
        create(&mut h, CreatableTopic::new("t", 1, 1)),
        ErrorCode::TOPIC_ALREADY_EXISTS
    );
    // The same name twice in one request.
    let r = h.run(ControllerEvent::CreateTopics(CreateTopicsRequest {
        topics: vec![
            CreatableTopic::new("d", 1, 1),
            CreatableTopic::new("d", 1, 1),
        ],
        validate_only: false,
    }));
    let ControllerResponse::CreateTopics(v) = r.response else {
        panic!()
    };
    assert!(v.iter().all(|t| t.error_code == ErrorCode::INVALID_REQUEST));
    // validate_only writes nothing.
    let r = h.run(ControllerEvent::CreateTopics(CreateTopicsRequest {
        topics: vec![CreatableTopic::new("v", 3, 2)],
        validate_only: true,
    }));
    assert!(r.records.is_empty());
    let ControllerResponse::CreateTopics(v) = r.response else {
        panic!()
    };
    assert_eq!(
        (
            v[0].error_code,
            v[0].num_partitions,
            v[0].replication_factor
        ),
        (ErrorCode::NONE, 3, 2)
    );
}

#[test]
fn fenced_brokers_get_no_replicas() {
    let mut h = Harness::new();
    h.brokers(&[1, 2]);
    h.register(3); // registered, still fenced
    let t = h.create_topic("t", 6, 2);
    assert_eq!(t.error_code, ErrorCode::NONE);
    for p in 0..6 {
        assert!(!h.partition("t", p).replicas.contains(&3));
    }
    assert_eq!(
        h.create_topic("u", 1, 3).error_code,
        ErrorCode::INVALID_REPLICATION_FACTOR
    );
}

#[test]
fn placement_spreads_leaders() {
    let mut h = Harness::new();
    h.brokers(&[1, 2, 3]);
    h.create_topic("t", 9, 3);
    let mut per_broker = std::collections::BTreeMap::new();
    for p in 0..9 {
        let part = h.partition("t", p);
        assert_eq!(part.leader, part.replicas[0], "the preferred replica leads");
        assert_eq!(part.isr.len(), 3);
        assert_eq!((part.leader_epoch, part.partition_epoch), (0, 0));
        *per_broker.entry(part.leader).or_insert(0) += 1;
    }
    assert_eq!(
        per_broker.values().copied().collect::<Vec<_>>(),
        vec![3, 3, 3]
    );
}

#[test]
fn delete_topics() {
    let mut h = Harness::new();
    h.brokers(&[1]);
    let id = h.create_topic("t", 2, 1).topic_id;
    let r = h.run(ControllerEvent::DeleteTopics(DeleteTopicsRequest {
        names: vec!["t".into(), "nope".into()],
    }));
    let ControllerResponse::DeleteTopics(v) = r.response else {
        panic!()
    };
    assert_eq!((v[0].error_code, v[0].topic_id), (ErrorCode::NONE, id));
    assert_eq!(v[1].error_code, ErrorCode::UNKNOWN_TOPIC_OR_PARTITION);
    assert!(h.image.topic("t").is_none());
    // The name can be used again, with a new id.
    let again = h.create_topic("t", 1, 1);
    assert_eq!(again.error_code, ErrorCode::NONE);
    assert_ne!(again.topic_id, id);
}

#[test]
fn create_partitions() {
    let mut h = Harness::new();
    h.brokers(&[1, 2, 3]);
    h.create_topic("t", 2, 2);
    let run = |h: &mut Harness, name: &str, count, assignments: Vec<Vec<i32>>| {
        let r = h.run(ControllerEvent::CreatePartitions(CreatePartitionsRequest {
            topics: vec![CreatePartitionsTopic {
                name: name.into(),
                count,
                assignments,
            }],
            validate_only: false,
        }));
        let ControllerResponse::CreatePartitions(v) = r.response else {
            panic!()
        };
        v[0].error_code
    };
    assert_eq!(
        run(&mut h, "nope", 3, vec![]),
        ErrorCode::UNKNOWN_TOPIC_OR_PARTITION
    );
    assert_eq!(run(&mut h, "t", 1, vec![]), ErrorCode::INVALID_PARTITIONS);
    assert_eq!(run(&mut h, "t", 2, vec![]), ErrorCode::INVALID_PARTITIONS);
    assert_eq!(
        run(&mut h, "t", 3, vec![vec![1, 2, 3]]),
        ErrorCode::INVALID_REPLICA_ASSIGNMENT
    );
    assert_eq!(run(&mut h, "t", 3, vec![vec![3, 1]]), ErrorCode::NONE);
    assert_eq!(h.partition("t", 2).replicas, vec![3, 1]);
    assert_eq!(run(&mut h, "t", 6, vec![]), ErrorCode::NONE);
    let t = h.image.topic("t").unwrap();
    assert_eq!(t.partitions.len(), 6);
    assert!(t
        .partitions
        .values()
        .all(|p| p.replicas.len() == 2 && p.isr.len() == 2));
}

#[test]
fn alter_partition_shrinks_and_expands_isr() {
    let mut h = Harness::new();
    h.brokers(&[1, 2, 3]);
    h.create_topic("t", 1, 3);
    let p = h.partition("t", 0);
    let leader = p.leader;
    let followers: Vec<i32> = p
        .replicas
        .iter()
        .copied()
        .filter(|b| *b != leader)
        .collect();
    // Shrink to the leader alone: allowed (min.insync.replicas is a produce-time rule).
    let r = h.alter_isr("t", 0, &[leader]);
    assert_eq!(r.partitions[0].error_code, ErrorCode::NONE);
    let q = h.partition("t", 0);
    assert_eq!(q.isr, vec![leader]);
    assert_eq!(q.leader_epoch, p.leader_epoch);
    assert_eq!(q.partition_epoch, p.partition_epoch + 1);
    assert_eq!(r.partitions[0].partition_epoch, q.partition_epoch);
    assert_eq!(r.partitions[0].isr, vec![leader]);
    // Expand again.
    let r = h.alter_isr("t", 0, &[leader, followers[0]]);
    assert_eq!(r.partitions[0].error_code, ErrorCode::NONE);
    assert_eq!(h.partition("t", 0).isr, vec![leader, followers[0]]);
}

#[test]
fn alter_partition_is_fenced_by_epochs() {
    let mut h = Harness::new();
    h.brokers(&[1, 2, 3]);
    h.create_topic("t", 1, 3);
    let p = h.partition("t", 0);
    let id = h.image.topic("t").unwrap().id;
    let leader = p.leader;
    let follower = p.replicas.iter().copied().find(|b| *b != leader).unwrap();
    let code = |r: AlterPartitionResponse| r.partitions[0].error_code;
    // Stale leader epoch.
    let r = h.alter_isr_raw(
        leader,
        id,
        0,
        p.leader_epoch - 1,
        p.partition_epoch,
        &[leader],
    );
    assert_eq!(code(r), ErrorCode::FENCED_LEADER_EPOCH);
    // Stale partition epoch.
    let r = h.alter_isr_raw(
        leader,
        id,
        0,
        p.leader_epoch,
        p.partition_epoch + 5,
        &[leader],
    );
    assert_eq!(code(r), ErrorCode::INVALID_UPDATE_VERSION);
    // Not the leader.
    let r = h.alter_isr_raw(
        follower,
        id,
        0,
        p.leader_epoch,
        p.partition_epoch,
        &[follower],
    );
    assert_eq!(code(r), ErrorCode::NOT_LEADER_OR_FOLLOWER);
    // ISR without the leader, or with a non-replica.
    let r = h.alter_isr_raw(
        leader,
        id,
        0,
        p.leader_epoch,
        p.partition_epoch,
        &[follower],
    );
    assert_eq!(code(r), ErrorCode::INVALID_REQUEST);
    let r = h.alter_isr_raw(
        leader,
        id,
        0,
        p.leader_epoch,
        p.partition_epoch,
        &[leader, 42],
    );
    assert_eq!(code(r), ErrorCode::INVALID_REQUEST);
    // Unknown topic id / partition.
    let r = h.alter_isr_raw(leader, Uuid::from_u64_pair(9, 9), 0, 0, 0, &[leader]);
    assert_eq!(code(r), ErrorCode::UNKNOWN_TOPIC_ID);
    let r = h.alter_isr_raw(leader, id, 7, 0, 0, &[leader]);
    assert_eq!(code(r), ErrorCode::UNKNOWN_TOPIC_OR_PARTITION);
    // Stale broker epoch: top-level error.
    let real = h.epochs[&leader];
    h.epochs.insert(leader, real - 1);
    let r = h.alter_isr_raw(leader, id, 0, p.leader_epoch, p.partition_epoch, &[leader]);
    assert_eq!(r.error_code, ErrorCode::STALE_BROKER_EPOCH);
    h.epochs.insert(leader, real);
    assert_eq!(
        h.partition("t", 0),
        p,
        "no refused request changed anything"
    );
    // Adding a fenced broker to the ISR: INELIGIBLE_REPLICA.
    h.alter_isr("t", 0, &[leader]);
    h.run(ControllerEvent::BrokerHeartbeat(BrokerHeartbeatRequest {
        broker_id: follower,
        broker_epoch: h.epochs[&follower],
        current_metadata_offset: h.image.last_offset(),
        want_fence: true,
        want_shut_down: false,
        offline_log_dirs: vec![],
    }));
    assert!(h.image.broker(follower).unwrap().fenced);
    let r = h.alter_isr("t", 0, &[leader, follower]);
    assert_eq!(code(r), ErrorCode::INELIGIBLE_REPLICA);
}

#[test]
fn controlled_shutdown_moves_leadership_first() {
    let mut h = Harness::new();
    h.brokers(&[1, 2, 3]);
    h.create_topic("t", 6, 3);
    let led_by_1 = (0..6).filter(|p| h.partition("t", *p).leader == 1).count();
    assert!(led_by_1 > 0);
    let r = h.heartbeat_full(1, false, true);
    assert!(r.should_shut_down, "it leads nothing any more");
    assert!(h.image.broker(1).unwrap().in_controlled_shutdown);
    for p in 0..6 {
        let part = h.partition("t", p);
        assert_ne!(part.leader, 1);
        assert!(!part.isr.contains(&1));
    }
    // Done: fenced at once, so it can neither lead nor join an ISR until it restarts.
    assert!(r.is_fenced);
    assert!(h.image.broker(1).unwrap().fenced);
    let r = h.alter_isr("t", 0, &[h.partition("t", 0).leader, 1]);
    assert_eq!(r.partitions[0].error_code, ErrorCode::INELIGIBLE_REPLICA);
    // Its restart (a new incarnation) registers at once, no session timeout to wait.
    let again = h.register_with(1, 99);
    assert_eq!(again.error_code, ErrorCode::NONE);
    h.check_replay();
}

#[test]
fn controlled_shutdown_of_the_last_isr_member_leaves_no_leader() {
    let mut h = Harness::new();
    h.brokers(&[1]);
    h.create_topic("t", 1, 1);
    let r = h.heartbeat_full(1, false, true);
    assert!(r.should_shut_down);
    let p = h.partition("t", 0);
    assert_eq!(p.leader, NO_LEADER);
    assert_eq!(p.isr, vec![1]);
}

#[test]
fn preferred_leader_election() {
    let mut h = Harness::new();
    h.brokers(&[1, 2]);
    h.create_topic("t", 2, 2);
    // Fence the preferred leader of partition 0, then let it come back.
    let preferred = h.partition("t", 0).replicas[0];
    let other = h.partition("t", 0).replicas[1];
    h.run(ControllerEvent::BrokerHeartbeat(BrokerHeartbeatRequest {
        broker_id: preferred,
        broker_epoch: h.epochs[&preferred],
        current_metadata_offset: h.image.last_offset(),
        want_fence: true,
        want_shut_down: false,
        offline_log_dirs: vec![],
    }));
    assert_eq!(h.partition("t", 0).leader, other);
    h.heartbeat(preferred);
    let elect = |h: &mut Harness, partitions| {
        let r = h.run(ControllerEvent::ElectLeaders(ElectLeadersRequest {
            election_type: ElectionType::Preferred,
            partitions,
        }));
        let ControllerResponse::ElectLeaders(v) = r.response else {
            panic!()
        };
        v
    };
    // Not back in the ISR yet.
    let v = elect(&mut h, Some(vec![("t".into(), 0)]));
    assert_eq!(v[0].error_code, ErrorCode::PREFERRED_LEADER_NOT_AVAILABLE);
    h.alter_isr("t", 0, &[other, preferred]);
    h.alter_isr("t", 1, &h.partition("t", 1).replicas.clone());
    // All partitions: only those that needed it are reported.
    let before = h.partition("t", 0).leader_epoch;
    let v = elect(&mut h, None);
    assert!(v.iter().all(|r| r.error_code == ErrorCode::NONE), "{v:?}");
    assert_eq!(h.partition("t", 0).leader, preferred);
    assert_eq!(h.partition("t", 0).leader_epoch, before + 1);
    let v = elect(&mut h, Some(vec![("t".into(), 0), ("nope".into(), 0)]));
    assert_eq!(v[0].error_code, ErrorCode::ELECTION_NOT_NEEDED);
    assert_eq!(v[1].error_code, ErrorCode::UNKNOWN_TOPIC_OR_PARTITION);
}

fn reassign(h: &mut Harness, topic: &str, p: i32, target: Option<Vec<i32>>) -> ErrorCode {
    let r = h.run(ControllerEvent::AlterPartitionReassignments(
        AlterPartitionReassignmentsRequest {
            partitions: vec![(topic.into(), p, target)],
        },
    ));
    let ControllerResponse::AlterPartitionReassignments(v) = r.response else {
        panic!()
    };
    v[0].error_code
}

#[test]
fn reassignment_adds_first_and_removes_after_isr_join() {
    let mut h = Harness::new();
    h.brokers(&[1, 2, 3, 4]);
    let mut t = CreatableTopic::new("t", -1, -1);
    t.assignments = vec![vec![1, 2]];
    h.run(ControllerEvent::CreateTopics(CreateTopicsRequest {
        topics: vec![t],
        validate_only: false,
    }));
    let start = h.partition("t", 0);
    assert_eq!(reassign(&mut h, "t", 0, Some(vec![3, 4])), ErrorCode::NONE);
    let p = h.partition("t", 0);
    assert_eq!(p.replicas, vec![3, 4, 1, 2]);
    assert_eq!(p.adding_replicas, vec![3, 4]);
    assert_eq!(p.removing_replicas, vec![1, 2]);
    assert_eq!(p.isr, vec![1, 2]);
    assert_eq!(
        p.leader, 1,
        "the old leader keeps leading while the new replicas catch up"
    );
    // One new replica joins: not complete.
    h.alter_isr("t", 0, &[1, 2, 3]);
    assert!(h.partition("t", 0).is_reassigning());
    // The second joins: the reassignment completes in the same step.
    h.alter_isr("t", 0, &[1, 2, 3, 4]);
    let p = h.partition("t", 0);
    assert!(!p.is_reassigning());
    assert_eq!(p.replicas, vec![3, 4]);
    assert_eq!(p.isr, vec![3, 4]);
    assert_eq!(p.leader, 3);
    assert!(p.leader_epoch > start.leader_epoch);
    assert_eq!(
        reassign(&mut h, "t", 0, None),
        ErrorCode::NO_REASSIGNMENT_IN_PROGRESS
    );
}

#[test]
fn reassignment_cancel_pure_removal_and_validation() {
    let mut h = Harness::new();
    h.brokers(&[1, 2, 3]);
    let mut t = CreatableTopic::new("t", -1, -1);
    t.assignments = vec![vec![1, 2]];
    h.run(ControllerEvent::CreateTopics(CreateTopicsRequest {
        topics: vec![t],
        validate_only: false,
    }));
    assert_eq!(
        reassign(&mut h, "t", 0, Some(vec![])),
        ErrorCode::INVALID_REPLICA_ASSIGNMENT
    );
    assert_eq!(
        reassign(&mut h, "t", 0, Some(vec![1, 1])),
        ErrorCode::INVALID_REPLICA_ASSIGNMENT
    );
    assert_eq!(
        reassign(&mut h, "t", 0, Some(vec![1, 9])),
        ErrorCode::INVALID_REPLICA_ASSIGNMENT
    );
    assert_eq!(
        reassign(&mut h, "x", 0, Some(vec![1])),
        ErrorCode::UNKNOWN_TOPIC_OR_PARTITION
    );
    // Start, then cancel: back to the original replicas.
    assert_eq!(reassign(&mut h, "t", 0, Some(vec![3, 2])), ErrorCode::NONE);
    assert!(h.partition("t", 0).is_reassigning());
    assert_eq!(reassign(&mut h, "t", 0, None), ErrorCode::NONE);
    let p = h.partition("t", 0);
    assert!(!p.is_reassigning());
    // As in Kafka, the original replicas come back, though not in their first order.
    let mut replicas = p.replicas.clone();
    replicas.sort_unstable();
    assert_eq!(replicas, vec![1, 2]);
    // A pure removal completes at once; removing the leader moves leadership.
    assert_eq!(reassign(&mut h, "t", 0, Some(vec![2])), ErrorCode::NONE);
    let p = h.partition("t", 0);
    assert_eq!(
        (p.replicas.clone(), p.isr.clone(), p.leader),
        (vec![2], vec![2], 2)
    );
}

#[test]
fn allocate_producer_ids_in_blocks() {
    let mut h = Harness::new();
    h.brokers(&[1]);
    let alloc = |h: &mut Harness, epoch| {
        let r = h.run(ControllerEvent::AllocateProducerIds(
            AllocateProducerIdsRequest {
                broker_id: 1,
                broker_epoch: epoch,
            },
        ));
        let ControllerResponse::AllocateProducerIds(a) = r.response else {
            panic!()
        };
        a
    };
    let e = h.epochs[&1];
    let a = alloc(&mut h, e);
    assert_eq!(
        (a.error_code, a.producer_id_start, a.producer_id_len),
        (ErrorCode::NONE, 0, 1000)
    );
    let b = alloc(&mut h, e);
    assert_eq!(b.producer_id_start, 1000);
    assert_eq!(
        alloc(&mut h, e + 100).error_code,
        ErrorCode::STALE_BROKER_EPOCH
    );
    assert_eq!(h.image.next_producer_id, 2000);
    h.check_replay();
}

#[test]
fn incremental_alter_configs() {
    let mut h = Harness::new();
    h.brokers(&[1]);
    h.create_topic("t", 1, 1);
    let alter = |h: &mut Harness,
                 name: &str,
                 configs: Vec<(String, AlterConfigOp, Option<String>)>,
                 validate_only| {
        let r = h.run(ControllerEvent::IncrementalAlterConfigs(
            IncrementalAlterConfigsRequest {
                resources: vec![AlterConfigsResource {
                    resource_type: RESOURCE_TOPIC,
                    resource_name: name.into(),
                    configs,
                }],
                validate_only,
            },
        ));
        let ControllerResponse::IncrementalAlterConfigs(v) = r.response else {
            panic!()
        };
        v[0].error_code
    };
    let set = |k: &str, v: &str| (k.to_string(), AlterConfigOp::Set, Some(v.to_string()));
    assert_eq!(
        alter(&mut h, "nope", vec![set("retention.ms", "1")], false),
        ErrorCode::UNKNOWN_TOPIC_OR_PARTITION
    );
    assert_eq!(
        alter(&mut h, "t", vec![set("bogus", "1")], false),
        ErrorCode::INVALID_CONFIG
    );
    assert_eq!(
        alter(&mut h, "t", vec![set("retention.ms", "soon")], false),
        ErrorCode::INVALID_CONFIG
    );
    assert_eq!(
        alter(&mut h, "t", vec![set("retention.ms", "5")], true),
        ErrorCode::NONE
    );
    assert_eq!(
        h.image.topic_config("t", "retention.ms"),
        None,
        "validate_only"
    );
    assert_eq!(
        alter(
            &mut h,
            "t",
            vec![set("retention.ms", "5"), set("cleanup.policy", "delete")],
            false
        ),
        ErrorCode::NONE
    );
    assert_eq!(h.image.topic_config("t", "retention.ms"), Some("5"));
    let append = (
        "cleanup.policy".to_string(),
        AlterConfigOp::Append,
        Some("compact".to_string()),
    );
    assert_eq!(alter(&mut h, "t", vec![append], false), ErrorCode::NONE);
    assert_eq!(
        h.image.topic_config("t", "cleanup.policy"),
        Some("delete,compact")
    );
    let subtract = (
        "cleanup.policy".to_string(),
        AlterConfigOp::Subtract,
        Some("delete".to_string()),
    );
    assert_eq!(alter(&mut h, "t", vec![subtract], false), ErrorCode::NONE);
    assert_eq!(h.image.topic_config("t", "cleanup.policy"), Some("compact"));
    let bad_append = (
        "retention.ms".to_string(),
        AlterConfigOp::Append,
        Some("1".to_string()),
    );
    assert_eq!(
        alter(&mut h, "t", vec![bad_append], false),
        ErrorCode::INVALID_CONFIG
    );
    let delete = ("retention.ms".to_string(), AlterConfigOp::Delete, None);
    assert_eq!(alter(&mut h, "t", vec![delete], false), ErrorCode::NONE);
    assert_eq!(h.image.topic_config("t", "retention.ms"), None);
    h.check_replay();
}

#[test]
fn new_controller_gives_every_broker_a_fresh_lease() {
    let mut h = Harness::new();
    h.brokers(&[1, 2]);
    h.now = 100_000;
    // A controller that takes over knows no lease: nobody is fenced at once.
    h.controller = QuorumController::new(ControllerConfig::default());
    assert!(h.tick().records.is_empty());
    h.now += 9_001;
    h.heartbeat(2);
    h.tick();
    assert!(h.image.broker(1).unwrap().fenced);
    assert!(!h.image.broker(2).unwrap().fenced);
}

#[test]
fn a_lease_assumed_at_takeover_does_not_block_a_restarted_broker() {
    let mut h = Harness::new();
    h.brokers(&[1, 2]);
    // A single controller crashed together with broker 1 and came back: broker 1's new
    // incarnation registers at once, it does not wait a session for its own ghost.
    h.controller = QuorumController::new(ControllerConfig::default());
    h.tick();
    h.now += 10;
    assert_eq!(h.register_with(1, 77).error_code, ErrorCode::NONE);
    // A broker this controller has heard from is still protected against a second
    // process claiming its id.
    h.heartbeat(2);
    assert_eq!(
        h.register_with(2, 78).error_code,
        ErrorCode::DUPLICATE_BROKER_REGISTRATION
    );
    h.check_replay();
}

#[test]
fn automatic_preferred_leader_election_after_a_broker_returns() {
    let mut h = Harness::new();
    h.brokers(&[1, 2]);
    h.create_topic("t", 2, 2);
    let preferred = h.partition("t", 0).replicas[0];
    let other = h.partition("t", 0).replicas[1];
    h.tick(); // starts the imbalance check clock
    h.run(ControllerEvent::BrokerHeartbeat(BrokerHeartbeatRequest {
        broker_id: preferred,
        broker_epoch: h.epochs[&preferred],
        current_metadata_offset: h.image.last_offset(),
        want_fence: true,
        want_shut_down: false,
        offline_log_dirs: vec![],
    }));
    assert_eq!(h.partition("t", 0).leader, other);
    h.heartbeat(preferred);
    h.alter_isr("t", 0, &[other, preferred]);
    // Not before the check interval.
    h.now += 1_000;
    h.heartbeat(1);
    h.heartbeat(2);
    h.tick();
    assert_eq!(h.partition("t", 0).leader, other);
    h.now = 300_000;
    h.heartbeat(1);
    h.heartbeat(2);
    assert_eq!(h.controller.next_deadline(&h.image), Some(300_000));
    h.tick();
    assert_eq!(h.partition("t", 0).leader, preferred);
    // Disabled: nothing moves.
    let mut h = Harness::with_config(ControllerConfig {
        auto_leader_rebalance_enable: false,
        ..Default::default()
    });
    h.brokers(&[1, 2]);
    h.create_topic("t", 1, 2);
    let preferred = h.partition("t", 0).replicas[0];
    h.run(ControllerEvent::BrokerHeartbeat(BrokerHeartbeatRequest {
        broker_id: preferred,
        broker_epoch: h.epochs[&preferred],
        current_metadata_offset: h.image.last_offset(),
        want_fence: true,
        want_shut_down: false,
        offline_log_dirs: vec![],
    }));
    h.heartbeat(preferred);
    let leader = h.partition("t", 0).leader;
    h.alter_isr("t", 0, &[leader, preferred]);
    h.tick();
    assert_eq!(h.partition("t", 0).leader, leader);
}

/// KIP-584: the first controller finalizes metadata.version and transaction.version
/// (Kafka 4's defaults); UpdateFeatures upgrades them
/// within the supported range, refuses a downgrade, an unknown feature and a level the
/// software does not support, all or nothing, and writes nothing when validating only.
#[test]
fn feature_levels_are_bootstrapped_and_updated_all_or_nothing() {
    use crate::features::{
        FeatureUpdate, METADATA_VERSION, METADATA_VERSION_LATEST, SAFE_DOWNGRADE,
        TRANSACTION_VERSION, UPGRADE,
    };
    let mut fresh = QuorumController::new(ControllerConfig::default());
    let empty = MetadataImage::new();
    let first = fresh.tick(&empty, 0, 0);
    assert!(
        matches!(&first.records[..], [MetadataRecord::FeatureLevel(m), MetadataRecord::FeatureLevel(t)]
            if m.name == METADATA_VERSION && m.feature_level == METADATA_VERSION_LATEST
                && t.name == TRANSACTION_VERSION && t.feature_level == 2),
        "{:?}",
        first.records
    );

    let mut h = Harness::new();
    assert_eq!(
        h.image.features.get(METADATA_VERSION),
        Some(&METADATA_VERSION_LATEST)
    );
    assert!(h.tick().records.is_empty(), "finalized once");
    let update = |feature: &str, level: i16, upgrade_type: i8| FeatureUpdate {
        feature: feature.into(),
        max_version_level: level,
        upgrade_type,
    };
    let run = |h: &mut Harness, updates: Vec<FeatureUpdate>, validate_only: bool| {
        let r = h.run(ControllerEvent::UpdateFeatures(UpdateFeaturesRequest {
            updates,
            validate_only,
        }));
        match r.response {
            ControllerResponse::UpdateFeatures(results) => (r.records.len(), results),
            other => panic!("{other:?}"),
        }
    };
    // A downgrade of metadata.version is refused, even as a "safe" one.
    let (written, results) = run(
        &mut h,
        vec![update(METADATA_VERSION, 20, SAFE_DOWNGRADE)],
        false,
    );
    assert_eq!(written, 0);
    assert_eq!(results[0].error_code, ErrorCode::INVALID_UPDATE_VERSION);
    // One bad update refuses the whole request.
    let (written, results) = run(
        &mut h,
        vec![
            update("group.version", 0, UPGRADE),
            update("no.such.feature", 1, UPGRADE),
        ],
        false,
    );
    assert_eq!(written, 0);
    assert!(
        results
            .iter()
            .all(|r| r.error_code == ErrorCode::INVALID_UPDATE_VERSION),
        "{results:?}"
    );
    // Not above what the software knows: group.version 1 (KIP-848) is, 2 is not.
    let (_, results) = run(&mut h, vec![update("group.version", 2, UPGRADE)], false);
    assert_eq!(results[0].error_code, ErrorCode::INVALID_UPDATE_VERSION);
    let (written, results) = run(&mut h, vec![update("group.version", 1, UPGRADE)], false);
    assert_eq!((written, results[0].error_code), (1, ErrorCode::NONE));
    assert_eq!(h.image.features.get("group.version"), Some(&1));
    let (_, results) = run(&mut h, vec![update(TRANSACTION_VERSION, 3, UPGRADE)], false);
    assert_eq!(results[0].error_code, ErrorCode::INVALID_UPDATE_VERSION);
    // transaction.version goes down and back up (a downgrade must say so).
    let (_, results) = run(&mut h, vec![update(TRANSACTION_VERSION, 0, UPGRADE)], false);
    assert_eq!(results[0].error_code, ErrorCode::INVALID_UPDATE_VERSION);
    let (written, results) = run(
        &mut h,
        vec![update(TRANSACTION_VERSION, 0, SAFE_DOWNGRADE)],
        false,
    );
    assert_eq!((written, results[0].error_code), (1, ErrorCode::NONE));
    assert_eq!(
        h.image
            .features
            .get(TRANSACTION_VERSION)
            .copied()
            .unwrap_or(0),
        0
    );
    let (written, results) = run(&mut h, vec![update(TRANSACTION_VERSION, 2, UPGRADE)], false);
    assert_eq!((written, results[0].error_code), (1, ErrorCode::NONE));
    assert_eq!(h.image.features.get(TRANSACTION_VERSION), Some(&2));
    let (_, results) = run(
        &mut h,
        vec![update(
            METADATA_VERSION,
            METADATA_VERSION_LATEST + 1,
            UPGRADE,
        )],
        false,
    );
    assert_eq!(results[0].error_code, ErrorCode::INVALID_UPDATE_VERSION);
    // The same level is no change and no record.
    let (written, results) = run(
        &mut h,
        vec![update(METADATA_VERSION, METADATA_VERSION_LATEST, UPGRADE)],
        false,
    );
    assert_eq!((written, results[0].error_code), (0, ErrorCode::NONE));

    // An upgrade from an older level: validated only, then applied.
    let mut h = Harness::new();
    h.image.features.insert(METADATA_VERSION.into(), 21);
    let (written, results) = run(&mut h, vec![update(METADATA_VERSION, 25, UPGRADE)], true);
    assert_eq!((written, results[0].error_code), (0, ErrorCode::NONE));
    assert_eq!(h.image.features.get(METADATA_VERSION), Some(&21));
    let (written, results) = run(&mut h, vec![update(METADATA_VERSION, 25, UPGRADE)], false);
    assert_eq!((written, results[0].error_code), (1, ErrorCode::NONE));
    assert_eq!(h.image.features.get(METADATA_VERSION), Some(&25));
}

fn upsertion(name: &str, mechanism: i8, iterations: i32) -> ScramCredentialUpsertion {
    ScramCredentialUpsertion {
        name: name.into(),
        mechanism,
        salt: vec![1; 16],
        stored_key: vec![2; 32],
        server_key: vec![3; 32],
        iterations,
    }
}

fn alter_scram(
    h: &mut Harness,
    deletions: Vec<(String, i8)>,
    upsertions: Vec<ScramCredentialUpsertion>,
) -> Vec<(String, ErrorCode)> {
    let r = h.run(ControllerEvent::AlterUserScramCredentials(
        AlterUserScramCredentialsRequest {
            deletions,
            upsertions,
        },
    ));
    let ControllerResponse::AlterUserScramCredentials(results) = r.response else {
        panic!("{:?}", r.response)
    };
    results
        .into_iter()
        .map(|r| (r.user, r.error_code))
        .collect()
}

#[test]
fn scram_credentials_are_stored_checked_deleted_and_snapshotted() {
    let mut h = Harness::new();
    let results = alter_scram(
        &mut h,
        vec![],
        vec![
            upsertion("alice", 1, 4096),
            upsertion("alice", 2, 8192),
            upsertion("bob", 2, 4095),
            upsertion("carol", 3, 4096),
            upsertion("dave", 1, 16385),
            upsertion("erin", 2, 4096),
            upsertion("erin", 2, 5000),
        ],
    );
    assert_eq!(
        results,
        [
            ("alice".to_string(), ErrorCode::NONE),
            ("bob".to_string(), ErrorCode::UNACCEPTABLE_CREDENTIAL),
            ("carol".to_string(), ErrorCode::UNSUPPORTED_SASL_MECHANISM),
            ("dave".to_string(), ErrorCode::UNACCEPTABLE_CREDENTIAL),
            ("erin".to_string(), ErrorCode::DUPLICATE_RESOURCE),
        ]
    );
    let keys: Vec<_> = h.image.scram_credentials.keys().cloned().collect();
    assert_eq!(keys, [("alice".to_string(), 1), ("alice".to_string(), 2)]);
    assert_eq!(
        h.image.scram_credentials[&("alice".to_string(), 2)].iterations,
        8192
    );
    // A snapshot carries them.
    let restored = MetadataImage::from_snapshot(h.image.to_snapshot().unwrap()).unwrap();
    assert_eq!(restored.scram_credentials, h.image.scram_credentials);
    // Deleting what does not exist is RESOURCE_NOT_FOUND and changes nothing.
    let results = alter_scram(&mut h, vec![("alice".into(), 1), ("bob".into(), 2)], vec![]);
    assert_eq!(
        results,
        [
            ("alice".to_string(), ErrorCode::NONE),
            ("bob".to_string(), ErrorCode::RESOURCE_NOT_FOUND),
        ]
    );
    let keys: Vec<_> = h.image.scram_credentials.keys().cloned().collect();
    assert_eq!(keys, [("alice".to_string(), 2)]);
}

fn binding(rt: ResourceType, name: &str, pt: PatternType, principal: &str) -> StandardAcl {
    StandardAcl {
        resource_type: rt,
        resource_name: name.into(),
        pattern_type: pt,
        principal: principal.into(),
        host: "*".into(),
        operation: AclOperation::Write,
        permission_type: AclPermissionType::Allow,
    }
}

fn create_acls(h: &mut Harness, creations: Vec<StandardAcl>) -> (usize, Vec<ErrorCode>) {
    let r = h.run(ControllerEvent::CreateAcls(CreateAclsRequest { creations }));
    let ControllerResponse::CreateAcls(results) = r.response else {
        panic!("{:?}", r.response)
    };
    (
        r.records.len(),
        results.into_iter().map(|r| r.error_code).collect(),
    )
}

fn delete_acls(h: &mut Harness, filters: Vec<AclBindingFilter>) -> (usize, Vec<AclDeleteResult>) {
    let r = h.run(ControllerEvent::DeleteAcls(DeleteAclsRequest { filters }));
    let ControllerResponse::DeleteAcls(results) = r.response else {
        panic!("{:?}", r.response)
    };
    (r.records.len(), results)
}

#[test]
fn acls_are_validated_stored_once_deleted_by_filter_and_snapshotted() {
    use AclOperation as Op;
    use PatternType::{Literal, Match, Prefixed};
    use ResourceType::{Cluster, Group, Topic};
    let mut h = Harness::new();
    let good = binding(Topic, "orders-", Prefixed, "User:alice");
    let mut bad_op = binding(Topic, "t", Literal, "User:alice");
    bad_op.operation = Op::Any;
    let mut bad_perm = binding(Topic, "t", Literal, "User:alice");
    bad_perm.permission_type = AclPermissionType::Unknown;
    let (written, codes) = create_acls(
        &mut h,
        vec![
            good.clone(),
            good.clone(),
            binding(Cluster, "my-cluster", Literal, "User:alice"),
            binding(Cluster, CLUSTER_NAME, Literal, "User:alice"),
            binding(Topic, "", Literal, "User:alice"),
            binding(ResourceType::Any, "t", Literal, "User:alice"),
            binding(ResourceType::Unknown, "t", Literal, "User:alice"),
            binding(Topic, "t", Match, "User:alice"),
            binding(Topic, "t", PatternType::Any, "User:alice"),
            bad_op,
            bad_perm,
            binding(Topic, "t", Literal, "alice"),
            binding(Group, "g", Literal, "User:*"),
        ],
    );
    let bad = ErrorCode::INVALID_REQUEST;
    let ok = ErrorCode::NONE;
    assert_eq!(
        codes,
        [ok, ok, bad, ok, bad, bad, bad, bad, bad, bad, bad, bad, ok]
    );
    assert_eq!(written, 3, "the duplicate binding is stored once");
    assert_eq!(h.image.acls.len(), 3);
    // Creating an existing binding again succeeds and writes nothing.
    assert_eq!(create_acls(&mut h, vec![good.clone()]), (0, vec![ok]));
    let restored = MetadataImage::from_snapshot(h.image.to_snapshot().unwrap()).unwrap();
    assert_eq!(restored.acls, h.image.acls);

    // Deletion: an unknown part is refused; a binding two filters match is removed once.
    let topics = AclBindingFilter {
        resource_type: Topic,
        ..AclBindingFilter::any()
    };
    let alice = AclBindingFilter {
        principal: Some("User:alice".into()),
        ..AclBindingFilter::any()
    };
    let unknown = AclBindingFilter {
        pattern_type: PatternType::Unknown,
        ..AclBindingFilter::any()
    };
    let unknown_entry = AclBindingFilter {
        operation: Op::Unknown,
        ..AclBindingFilter::any()
    };
    let (written, results) = delete_acls(&mut h, vec![topics, alice, unknown, unknown_entry]);
    assert_eq!(written, 2);
    let codes: Vec<ErrorCode> = results.iter().map(|r| r.error_code).collect();
    assert_eq!(codes, [ok, ok, bad, bad]);
    assert_eq!(results[0].deleted, std::slice::from_ref(&good));
    assert_eq!(results[1].deleted.len(), 2);
    assert_eq!(h.image.acls.len(), 1);
    let left: Vec<&StandardAcl> = h.image.acls.iter().map(|(_, a)| a).collect();
    assert_eq!(left[0].resource_type, Group);
    // A MATCH filter by a topic's name finds the prefixed bindings that apply to it.
    create_acls(&mut h, vec![good.clone()]);
    let matching = AclBindingFilter {
        resource_type: Topic,
        resource_name: Some("orders-eu".into()),
        pattern_type: Match,
        ..AclBindingFilter::any()
    };
    let (written, results) = delete_acls(&mut h, vec![matching]);
    assert_eq!((written, results[0].deleted.clone()), (1, vec![good]));
}
