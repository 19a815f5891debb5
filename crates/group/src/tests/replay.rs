//! Replaying the persisted records into a fresh coordinator rebuilds the same committed
//! offsets and group metadata.

use std::collections::BTreeMap;

use bytes::Bytes;
use proptest::prelude::*;

use super::harness::*;
use crate::*;

/// The durable view of a coordinator: offsets and the last metadata of each group.
fn durable(
    c: &GroupCoordinator,
    from_fields: bool,
) -> (
    BTreeMap<OffsetCommitKey, OffsetCommitValue>,
    BTreeMap<String, GroupMetadataValue>,
) {
    let metadata = c
        .groups
        .values()
        .filter_map(|g| {
            let v = if from_fields {
                g.last_persisted.as_ref().map(|_| g.metadata_value())
            } else {
                g.last_persisted.clone()
            };
            v.map(|v| (g.group_id.clone(), v))
        })
        .collect();
    (c.committed_offsets(), metadata)
}

fn replay_into_fresh(h: &H) -> GroupCoordinator {
    let config = h.c.config().clone();
    let n = config.offsets_topic_num_partitions;
    let mut fresh = GroupCoordinator::new(config, 7);
    for p in 0..n {
        fresh.load_partition_start(p);
    }
    for (p, r) in &h.log {
        fresh.replay(*p, r).unwrap();
    }
    for p in 0..n {
        fresh.load_partition_done(p, h.now);
    }
    fresh
}

#[test]
fn replay_rebuilds_stable_group() {
    let mut h = H::new();
    let (ids, gen) = h.stable_group("g", 3);
    h.commit("g", &ids[0], gen, "t", 0, 10);
    h.commit("s", "", -1, "t", 1, 11);
    let fresh = replay_into_fresh(&h);
    assert_eq!(durable(&fresh, true), durable(&h.c, false));
    assert_eq!(fresh.group_state("g"), Some(ClassicGroupState::Stable));
    assert_eq!(fresh.group_generation("g"), Some(gen));
    // The members carry on heartbeating against the new coordinator.
    let mut h2 = H::new();
    h2.c = fresh;
    h2.now = h.now;
    assert_eq!(h2.heartbeat("g", &ids[1], gen), error_code::NONE);
    // Members that never heartbeat expire a session timeout after the load.
    h2.advance_to(h.now + 5_000);
    assert_eq!(h2.heartbeat("g", &ids[1], gen), error_code::NONE);
    h2.advance_to(h.now + i64::from(SESSION_MS) + 1);
    assert_eq!(h2.state("g"), Some(ClassicGroupState::PreparingRebalance));
}

#[test]
fn replay_rejects_records_outside_a_load() {
    let mut c = GroupCoordinator::new(GroupConfig::default(), 1);
    let r = Record::GroupMetadata(GroupMetadataRecord {
        key: GroupMetadataKey { group: "g".into() },
        value: None,
    });
    let p = c.partition_for("g");
    assert_eq!(
        c.replay(p, &r),
        Err(GroupError::PartitionNotLoading { partition: p })
    );
    c.load_partition_start(p);
    let other = (p + 1) % 50;
    c.load_partition_start(other);
    assert!(matches!(
        c.replay(other, &r),
        Err(GroupError::WrongPartition { .. })
    ));
    assert_eq!(c.replay(p, &r), Ok(()));
}

#[derive(Debug, Clone)]
enum Op {
    Join {
        group: u8,
        slot: u8,
        topics: u8,
    },
    Sync {
        group: u8,
        slot: u8,
    },
    Heartbeat {
        group: u8,
        slot: u8,
    },
    Leave {
        group: u8,
        slot: u8,
    },
    Commit {
        group: u8,
        slot: u8,
        partition: u8,
        offset: u16,
    },
    SimpleCommit {
        group: u8,
        partition: u8,
        offset: u16,
    },
    DeleteOffsets {
        group: u8,
        partition: u8,
    },
    DeleteGroup {
        group: u8,
    },
    Advance {
        ms: u32,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..3u8, 0..4u8, 0..2u8).prop_map(|(group, slot, topics)| Op::Join { group, slot, topics }),
        3 => (0..3u8, 0..4u8).prop_map(|(group, slot)| Op::Sync { group, slot }),
        3 => (0..3u8, 0..4u8).prop_map(|(group, slot)| Op::Heartbeat { group, slot }),
        1 => (0..3u8, 0..4u8).prop_map(|(group, slot)| Op::Leave { group, slot }),
        3 => (0..3u8, 0..4u8, 0..3u8, any::<u16>()).prop_map(|(group, slot, partition, offset)| Op::Commit { group, slot, partition, offset }),
        2 => (0..4u8, 0..3u8, any::<u16>()).prop_map(|(group, partition, offset)| Op::SimpleCommit { group, partition, offset }),
        1 => (0..4u8, 0..3u8).prop_map(|(group, partition)| Op::DeleteOffsets { group, partition }),
        1 => (0..4u8).prop_map(|group| Op::DeleteGroup { group }),
        3 => prop_oneof![0..5_000u32, 5_000..70_000u32, Just(8 * 24 * 3_600_000u32)].prop_map(|ms| Op::Advance { ms }),
    ]
}

/// What each client (group, slot) believes about itself.
#[derive(Default, Clone)]
struct Client {
    member_id: String,
    generation: i32,
}

fn run(ops: Vec<Op>) {
    let mut h = H::new();
    let mut clients: BTreeMap<(u8, u8), Client> = BTreeMap::new();
    let mut pending_joins: BTreeMap<u64, (u8, u8)> = BTreeMap::new();
    let gname = |g: u8| format!("group-{g}");
    // Responders of JoinGroup/SyncGroup requests (the others are answered in the call).
    let mut issued: Vec<u64> = Vec::new();
    for op in ops {
        let sent = match op {
            Op::Join {
                group,
                slot,
                topics,
            } => {
                let c = clients.entry((group, slot)).or_default().clone();
                let topics: &[&str] = if topics == 0 { &["t"] } else { &["t", "u"] };
                let mut req = h.join_req(&gname(group), &c.member_id, consumer_protocols(topics));
                if slot == 3 {
                    // Slot 3 is a static member (KIP-345).
                    req.group_instance_id = Some(format!("instance-{group}"));
                }
                let (r, sent) = h.join_with(req);
                pending_joins.insert(r, (group, slot));
                issued.push(r);
                sent
            }
            Op::Sync { group, slot } => {
                let c = clients.entry((group, slot)).or_default().clone();
                let assignment = vec![(c.member_id.clone(), Bytes::from_static(b"x"))];
                h.sync(&gname(group), &c.member_id, c.generation, assignment)
                    .1
            }
            Op::Heartbeat { group, slot } => {
                let c = clients.entry((group, slot)).or_default().clone();
                h.heartbeat(&gname(group), &c.member_id, c.generation);
                vec![]
            }
            Op::Leave { group, slot } => {
                let c = clients.entry((group, slot)).or_default().clone();
                h.leave(&gname(group), vec![identity(&c.member_id)]).1
            }
            Op::Commit {
                group,
                slot,
                partition,
                offset,
            } => {
                let c = clients.entry((group, slot)).or_default().clone();
                h.commit(
                    &gname(group),
                    &c.member_id,
                    c.generation,
                    "t",
                    i32::from(partition),
                    i64::from(offset),
                );
                vec![]
            }
            Op::SimpleCommit {
                group,
                partition,
                offset,
            } => {
                h.commit(
                    &gname(group),
                    "",
                    -1,
                    "u",
                    i32::from(partition),
                    i64::from(offset),
                );
                vec![]
            }
            Op::DeleteOffsets { group, partition } => {
                let r = h.responder();
                let out = h.c.handle_offset_delete(
                    OffsetDeleteRequest {
                        group_id: gname(group),
                        topics: vec![OffsetDeleteRequestTopic {
                            name: "u".into(),
                            partitions: vec![i32::from(partition)],
                        }],
                    },
                    h.now,
                    r,
                );
                h.absorb(out)
            }
            Op::DeleteGroup { group } => {
                let r = h.responder();
                let out = h.c.handle_delete_groups(
                    DeleteGroupsRequest {
                        groups_names: vec![gname(group)],
                    },
                    h.now,
                    r,
                );
                h.absorb(out)
            }
            Op::Advance { ms } => h.advance_to(h.now + i64::from(ms)),
        };
        // Clients learn their member id and generation from join responses.
        for s in &sent {
            if let (Response::JoinGroup(j), Some(key)) =
                (&s.response, pending_joins.remove(&s.responder))
            {
                let c = clients.entry(key).or_default();
                if j.error_code == error_code::NONE
                    || j.error_code == error_code::MEMBER_ID_REQUIRED
                {
                    c.member_id = j.member_id.clone();
                    c.generation = j.generation_id;
                } else if j.error_code == error_code::UNKNOWN_MEMBER_ID
                    || j.error_code == error_code::FENCED_INSTANCE_ID
                {
                    *c = Client::default();
                }
            }
        }
        // Invariant: every group that is Stable or Empty matches its last record.
        for g in h.c.groups.values() {
            if let (Some(p), true) = (
                &g.last_persisted,
                g.is(ClassicGroupState::Stable) || g.is(ClassicGroupState::Empty),
            ) {
                let mut now = g.metadata_value();
                now.current_state_timestamp = p.current_state_timestamp;
                if g.is(ClassicGroupState::Stable) {
                    assert_eq!(&now, p, "group {}", g.group_id);
                }
            }
        }
    }
    // Every parked JoinGroup/SyncGroup is answered exactly once: once the clients go
    // quiet, the timeouts answer whatever is still parked.
    h.advance_to(h.now + 400_000);
    let mut answered = BTreeMap::new();
    for s in &h.sent {
        *answered.entry(s.responder).or_insert(0) += 1;
    }
    for (r, n) in &answered {
        assert_eq!(*n, 1, "responder {r} answered {n} times");
    }
    for r in &issued {
        assert!(answered.contains_key(r), "responder {r} never answered");
    }
    let fresh = replay_into_fresh(&h);
    assert_eq!(durable(&fresh, true), durable(&h.c, false));
    // Groups that are Stable or Empty come back in the same state.
    for g in h.c.groups.values() {
        if g.last_persisted.is_some()
            && (g.is(ClassicGroupState::Stable) || g.is(ClassicGroupState::Empty))
        {
            assert_eq!(
                fresh.group_state(&g.group_id),
                Some(g.state),
                "{}",
                g.group_id
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn replaying_persisted_records_rebuilds_state(ops in proptest::collection::vec(op(), 1..80)) {
        run(ops);
    }
}
