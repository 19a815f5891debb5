//! KIP-848's online migration: a classic group becomes a consumer group when a member of
//! the consumer protocol joins, its classic members keep their partitions and are served
//! by the consumer group (JoinGroup, SyncGroup, Heartbeat, OffsetCommit, LeaveGroup), and
//! no partition ever has two owners on the way.

use std::collections::BTreeSet;

use bytes::{BufMut, Bytes, BytesMut};
use rill_protocol::generated::consumer_protocol_subscription::{
    ConsumerProtocolSubscription, TopicPartition as OwnedTopicPartition,
};
use rill_protocol::{Encodable, Uuid};

use super::harness::*;
use crate::*;

const PARTITIONS: i32 = 12;

fn orders_id() -> Uuid {
    Uuid([3; 16])
}

fn topics() -> TopicsImage {
    TopicsImage::new([TopicImage {
        id: orders_id(),
        name: "orders".into(),
        num_partitions: PARTITIONS,
    }])
}

/// A cooperative client's subscription (version 1): the topics and what it owns.
fn subscription(owned: &[i32]) -> Bytes {
    let s = ConsumerProtocolSubscription {
        topics: vec!["orders".into()],
        user_data: None,
        owned_partitions: if owned.is_empty() {
            Vec::new()
        } else {
            vec![OwnedTopicPartition {
                topic: "orders".into(),
                partitions: owned.to_vec(),
            }]
        },
        ..Default::default()
    };
    let mut b = BytesMut::new();
    b.put_i16(1);
    s.encode(&mut b, 1).unwrap();
    b.freeze()
}

fn protocols(owned: &[i32]) -> Vec<(String, Bytes)> {
    vec![("cooperative-sticky".to_owned(), subscription(owned))]
}

fn assigned(bytes: &Bytes) -> BTreeSet<i32> {
    decode_classic_assignment(bytes)
        .unwrap()
        .into_iter()
        .flat_map(|(_, ps)| ps)
        .collect()
}

fn hb(h: &mut H, req: ConsumerGroupHeartbeatRequest) -> ConsumerGroupHeartbeatResponse {
    let r = h.responder();
    let out = h.c.handle_consumer_group_heartbeat(req, h.now, r);
    let sent = h.absorb(out);
    sent.iter()
        .find_map(|s| match &s.response {
            Response::ConsumerGroupHeartbeat(x) if s.responder == r => Some(x.clone()),
            _ => None,
        })
        .expect("answered")
}

fn consumer_join(group: &str) -> ConsumerGroupHeartbeatRequest {
    ConsumerGroupHeartbeatRequest {
        group_id: group.into(),
        member_id: String::new(),
        member_epoch: 0,
        instance_id: None,
        rack_id: None,
        rebalance_timeout_ms: 30_000,
        subscribed_topic_names: Some(vec!["orders".into()]),
        subscribed_topic_regex: None,
        server_assignor: None,
        topic_partitions: Some(Vec::new()),
        client_id: "new".into(),
        client_host: "/127.0.0.1".into(),
        session_timeout_ms: 45_000,
        heartbeat_interval_ms: 5_000,
    }
}

/// Two classic members, Stable, owning 0-5 and 6-11.
fn classic_group(h: &mut H, group: &str) -> (Vec<String>, i32) {
    let mut members = Vec::new();
    for _ in 0..2 {
        let first = h.join_req(group, "", protocols(&[]));
        let (r, sent) = h.join_with(first);
        let id = join_resp(&sent, r).unwrap().member_id;
        let req = h.join_req(group, &id, protocols(&[]));
        let (r, _) = h.join_with(req);
        members.push((id, r));
    }
    let responders: Vec<u64> = members.iter().map(|(_, r)| *r).collect();
    let sent = h.finish_initial(&responders);
    let generation = join_resp(&sent, members[0].1).unwrap().generation_id;
    let ids: Vec<String> = members.into_iter().map(|(id, _)| id).collect();
    h.sync(group, &ids[1], generation, vec![]);
    let assignment = |ps: std::ops::Range<i32>| {
        encode_classic_assignment(1, &[("orders".to_owned(), ps.collect())])
    };
    h.sync(
        group,
        &ids[0],
        generation,
        vec![
            (ids[0].clone(), assignment(0..6)),
            (ids[1].clone(), assignment(6..12)),
        ],
    );
    (ids, generation)
}

fn classic_heartbeat(h: &mut H, group: &str, member: &str, generation: i32) -> i16 {
    h.c.handle_heartbeat(
        HeartbeatRequest {
            group_id: group.into(),
            generation_id: generation,
            member_id: member.into(),
            group_instance_id: None,
        },
        h.now,
    )
    .error_code
}

/// A classic member's JoinGroup then SyncGroup: (generation, assigned partitions).
fn classic_rejoin(h: &mut H, group: &str, member: &str, owned: &[i32]) -> (i32, BTreeSet<i32>) {
    let req = h.join_req(group, member, protocols(owned));
    let (r, sent) = h.join_with(req);
    let j = join_resp(&sent, r)
        .expect("a classic member's join in a consumer group is answered at once");
    assert_eq!(j.error_code, error_code::NONE, "{j:?}");
    assert_eq!(j.protocol_name.as_deref(), Some("cooperative-sticky"));
    assert!(
        j.members.is_empty() && j.leader.is_empty(),
        "no leader assigns"
    );
    let (s, sent) = h.sync(group, member, j.generation_id, vec![]);
    let s = sync_resp(&sent, s).expect("sync answered");
    assert_eq!(s.error_code, error_code::NONE, "{s:?}");
    (j.generation_id, assigned(&s.assignment))
}

#[test]
fn a_consumer_member_converts_a_classic_group_and_takes_over_one_partition_at_a_time() {
    let mut h = H::new();
    h.c.update_topics(topics());
    let (ids, generation) = classic_group(&mut h, "g");
    h.commit("g", &ids[0], generation, "orders", 0, 10);

    // The first consumer protocol member converts the group.
    let joined = hb(&mut h, consumer_join("g"));
    assert_eq!(joined.error_code, error_code::NONE, "{joined:?}");
    assert_eq!(h.c.group_state("g"), None, "no classic group any more");
    let (group_epoch, _) = h.c.consumer_group_epochs("g").unwrap();
    assert_eq!(group_epoch, generation + 1);
    let new_id = joined.member_id.clone().unwrap();
    // Its target is held by the classic members: nothing yet.
    assert_eq!(joined.assignment.as_ref().map(Vec::len), Some(0));
    for id in &ids {
        let m = h.c.consumer_group_member("g", id).unwrap();
        assert!(m.uses_classic_protocol());
        assert_eq!(m.member_epoch, generation);
    }
    // The offsets came along.
    let fetched = h.c.handle_offset_fetch(&OffsetFetchRequest {
        group_id: "g".into(),
        topics: None,
        require_stable: false,
        member_id: None,
        member_epoch: -1,
    });
    assert_eq!(fetched.topics[0].partitions[0].committed_offset, 10);
    // A classic member still commits with its generation.
    assert_eq!(
        h.commit("g", &ids[0], generation, "orders", 1, 11),
        error_code::NONE
    );
    assert_eq!(
        h.commit("g", &ids[0], generation - 1, "orders", 1, 11),
        error_code::ILLEGAL_GENERATION
    );

    // The classic members are told to rejoin; each gives up what the new one gets.
    let mut owned: Vec<BTreeSet<i32>> = vec![(0..6).collect(), (6..12).collect()];
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(
            classic_heartbeat(&mut h, "g", id, generation),
            error_code::REBALANCE_IN_PROGRESS
        );
        let list: Vec<i32> = owned[i].iter().copied().collect();
        let (epoch, kept) = classic_rejoin(&mut h, "g", id, &list);
        assert!(kept.is_subset(&owned[i]) && kept.len() == 4, "{kept:?}");
        assert_eq!(epoch, generation, "still revoking: the same epoch");
        owned[i] = kept;
        // Revoked: it rejoins with what it kept and moves to the group's epoch.
        let list: Vec<i32> = owned[i].iter().copied().collect();
        let (epoch, again) = classic_rejoin(&mut h, "g", id, &list);
        assert_eq!((epoch, &again), (group_epoch, &owned[i]));
        assert_eq!(classic_heartbeat(&mut h, "g", id, epoch), error_code::NONE);
        assert_eq!(
            classic_heartbeat(&mut h, "g", id, generation),
            error_code::ILLEGAL_GENERATION
        );
    }
    // Now the new member gets the four released partitions.
    let mut req = consumer_join("g");
    req.member_id = new_id.clone();
    req.member_epoch = group_epoch;
    req.rebalance_timeout_ms = -1;
    req.subscribed_topic_names = None;
    let r = hb(&mut h, req);
    let got: BTreeSet<i32> = r
        .assignment
        .unwrap()
        .iter()
        .flat_map(|t| t.partitions.clone())
        .collect();
    assert_eq!(got.len(), 4);
    assert!(got.is_disjoint(&owned[0]) && got.is_disjoint(&owned[1]));
    assert_eq!(
        h.c.consumer_group_state("g"),
        Some(ConsumerGroupState::Stable)
    );

    // A classic member leaves with LeaveGroup; its partitions go to the others.
    let r = h.responder();
    let out = h.c.handle_leave(
        LeaveGroupRequest {
            group_id: "g".into(),
            members: vec![identity(&ids[0])],
        },
        h.now,
        r,
    );
    let sent = h.absorb(out);
    match &sent.iter().find(|s| s.responder == r).unwrap().response {
        Response::LeaveGroup(l) => assert_eq!(l.members[0].error_code, error_code::NONE),
        other => panic!("{other:?}"),
    }
    assert!(h.c.consumer_group_member("g", &ids[0]).is_none());

    // Replaying the log rebuilds the group, classic members included.
    let config = h.c.config().clone();
    let n = config.offsets_topic_num_partitions;
    let mut fresh = GroupCoordinator::new(config, 5);
    fresh.update_topics(topics());
    for p in 0..n {
        fresh.load_partition_start(p);
    }
    for (p, rec) in &h.log {
        fresh.replay(*p, rec).unwrap();
    }
    for p in 0..n {
        fresh.load_partition_done(p, h.now);
    }
    assert_eq!(fresh.group_state("g"), None);
    assert_eq!(
        fresh.consumer_group_epochs("g"),
        h.c.consumer_group_epochs("g")
    );
    for id in [&ids[1], &new_id] {
        assert_eq!(
            fresh.consumer_group_member("g", id),
            h.c.consumer_group_member("g", id)
        );
    }
    assert_eq!(fresh.committed_offsets(), h.c.committed_offsets());
}

#[test]
fn the_migration_policy_can_forbid_the_upgrade() {
    let mut h = H::with_config(GroupConfig {
        consumer_group_migration_policy: ConsumerGroupMigrationPolicy::Disabled,
        ..GroupConfig::default()
    });
    h.c.update_topics(topics());
    classic_group(&mut h, "g");
    let r = hb(&mut h, consumer_join("g"));
    assert_eq!(r.error_code, error_code::GROUP_ID_NOT_FOUND);
    assert_eq!(h.c.group_state("g"), Some(ClassicGroupState::Stable));
    assert_eq!(
        "downgrade".parse(),
        Ok(ConsumerGroupMigrationPolicy::Downgrade)
    );
    assert!("sideways".parse::<ConsumerGroupMigrationPolicy>().is_err());
}

#[test]
fn a_classic_member_joins_a_consumer_group_and_gets_its_share() {
    let mut h = H::new();
    h.c.update_topics(topics());
    let first = hb(&mut h, consumer_join("g"));
    let first_id = first.member_id.clone().unwrap();
    // A classic JoinGroup (v4+): a member id first, then the join itself.
    let req = h.join_req("g", "", protocols(&[]));
    let (r, sent) = h.join_with(req);
    let j = join_resp(&sent, r).unwrap();
    assert_eq!(j.error_code, error_code::MEMBER_ID_REQUIRED);
    let (epoch, got) = classic_rejoin(&mut h, "g", &j.member_id, &[]);
    assert!(got.is_empty(), "everything is still the first member's");
    let m = h.c.consumer_group_member("g", &j.member_id).unwrap();
    assert_eq!(m.state, MemberState::UnreleasedPartitions);
    // The consumer member revokes half; then the classic one is told to rejoin for it.
    let mut req = consumer_join("g");
    req.member_id = first_id.clone();
    req.member_epoch = first.member_epoch;
    req.topic_partitions = Some(first.assignment.clone().unwrap());
    let told = hb(&mut h, req.clone());
    let kept = told.assignment.clone().unwrap();
    assert_eq!(kept.iter().map(|t| t.partitions.len()).sum::<usize>(), 6);
    req.topic_partitions = Some(kept);
    hb(&mut h, req);
    assert_eq!(
        classic_heartbeat(&mut h, "g", &j.member_id, epoch),
        error_code::REBALANCE_IN_PROGRESS
    );
    let (_, got) = classic_rejoin(&mut h, "g", &j.member_id, &[]);
    assert_eq!(got.len(), 6);
    assert_eq!(
        h.c.consumer_group_state("g"),
        Some(ConsumerGroupState::Stable)
    );
    // A JoinGroup with a protocol the classic members do not share is refused.
    let mut req = h.join_req("g", "", vec![("range".into(), subscription(&[]))]);
    req.api_version = 3;
    let (r, sent) = h.join_with(req);
    assert_eq!(
        join_resp(&sent, r).unwrap().error_code,
        error_code::INCONSISTENT_GROUP_PROTOCOL
    );
}

#[test]
fn a_classic_member_that_never_rejoins_is_fenced_after_its_rebalance_timeout() {
    let mut h = H::new();
    h.c.update_topics(topics());
    let (ids, generation) = classic_group(&mut h, "g");
    let joined = hb(&mut h, consumer_join("g"));
    let mut keep_alive = consumer_join("g");
    keep_alive.member_id = joined.member_id.unwrap();
    keep_alive.member_epoch = joined.member_epoch;
    keep_alive.rebalance_timeout_ms = -1;
    keep_alive.subscribed_topic_names = None;
    keep_alive.topic_partitions = None;
    // The first classic member rejoins as told (twice: it revokes, then moves on); the
    // second only heartbeats; the consumer member heartbeats too (alone with classic
    // members the group would go back to the classic protocol).
    let (_, kept) = classic_rejoin(&mut h, "g", &ids[0], &(0..6).collect::<Vec<_>>());
    let (epoch, _) = classic_rejoin(&mut h, "g", &ids[0], &kept.into_iter().collect::<Vec<_>>());
    let mut fenced_after = None;
    for step in 1..=20 {
        h.advance(5_000);
        classic_heartbeat(&mut h, "g", &ids[0], epoch);
        let r = hb(&mut h, keep_alive.clone());
        keep_alive.member_epoch = r.member_epoch;
        let code = classic_heartbeat(&mut h, "g", &ids[1], generation);
        if code == error_code::UNKNOWN_MEMBER_ID {
            fenced_after = Some(step * 5_000);
            break;
        }
        assert_eq!(code, error_code::REBALANCE_IN_PROGRESS);
    }
    // Its rebalance timeout (the harness's 60 s), not its session (10 s), ended it.
    assert_eq!(fenced_after, Some(65_000));
    assert!(h.c.consumer_group_member("g", &ids[0]).is_some());
}

#[test]
fn the_last_consumer_member_leaving_turns_the_group_back_into_a_classic_group() {
    let mut h = H::new();
    h.c.update_topics(topics());
    let (ids, generation) = classic_group(&mut h, "g");
    let joined = hb(&mut h, consumer_join("g"));
    let new_id = joined.member_id.clone().unwrap();
    let (group_epoch, _) = h.c.consumer_group_epochs("g").unwrap();
    // The classic members revoke what the new member is to get.
    let mut kept = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        let owned: Vec<i32> = (i as i32 * 6..i as i32 * 6 + 6).collect();
        let (_, k) = classic_rejoin(&mut h, "g", id, &owned);
        let (_, k) = classic_rejoin(&mut h, "g", id, &k.into_iter().collect::<Vec<_>>());
        kept.push(k);
    }
    // The consumer member leaves: only classic members remain, the group is classic again.
    let mut leave = consumer_join("g");
    leave.member_id = new_id.clone();
    leave.member_epoch = LEAVE_GROUP_MEMBER_EPOCH;
    assert_eq!(hb(&mut h, leave).error_code, error_code::NONE);
    assert_eq!(h.c.consumer_group_state("g"), None);
    assert_eq!(
        h.c.group_state("g"),
        Some(ClassicGroupState::PreparingRebalance)
    );
    // The group epoch is the generation: the members' epochs carry on.
    assert_eq!(h.c.group_generation("g"), Some(group_epoch));
    // The members hear of it and join the classic way; the next generation follows.
    assert_eq!(
        classic_heartbeat(&mut h, "g", &ids[0], group_epoch),
        error_code::REBALANCE_IN_PROGRESS
    );
    let mut responders = Vec::new();
    for id in &ids {
        let req = h.join_req("g", id, protocols(&[]));
        let (r, _) = h.join_with(req);
        responders.push(r);
    }
    let sent = h.sent.clone();
    let j = join_resp(&sent, responders[1]).expect("the join phase ended");
    assert_eq!(j.generation_id, group_epoch + 1);
    assert_eq!(
        h.c.group_state("g"),
        Some(ClassicGroupState::CompletingRebalance)
    );
    // Replaying the log rebuilds the classic group.
    let config = h.c.config().clone();
    let n = config.offsets_topic_num_partitions;
    let mut fresh = GroupCoordinator::new(config, 5);
    fresh.update_topics(topics());
    for p in 0..n {
        fresh.load_partition_start(p);
    }
    for (p, rec) in &h.log {
        fresh.replay(*p, rec).unwrap();
    }
    for p in 0..n {
        fresh.load_partition_done(p, h.now);
    }
    assert_eq!(fresh.consumer_group_state("g"), None);
    assert_eq!(fresh.group_generation("g"), Some(group_epoch));
    let _ = (generation, kept);
}
