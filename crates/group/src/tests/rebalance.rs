//! The join/sync/heartbeat/leave state machine, its timeouts and its errors.

use bytes::Bytes;

use super::harness::*;
use crate::ClassicGroupState::*;
use crate::*;

#[test]
fn partition_for_matches_java() {
    // Values of Java's String.hashCode, checked with a JVM.
    assert_eq!(java_string_hash_code(""), 0);
    assert_eq!(java_string_hash_code("a"), 97);
    assert_eq!(java_string_hash_code("hello"), 99_162_322);
    assert_eq!(java_string_hash_code("hello world"), 1_794_106_052);
    assert_eq!(java_string_hash_code("polygenelubricants"), i32::MIN);
    assert_eq!(partition_for("", 50), 0);
    assert_eq!(partition_for("hello", 50), 99_162_322 % 50);
    // Utils.abs(Integer.MIN_VALUE) == 0.
    assert_eq!(partition_for("polygenelubricants", 50), 0);
    assert_eq!(partition_for("hello world", 50), 1_794_106_052 % 50);
    assert_eq!(java_string_hash_code("my-group"), -1_906_497_762);
    assert_eq!(partition_for("my-group", 50), 12);
    // Non-ASCII is hashed over UTF-16 units.
    assert_eq!(java_string_hash_code("é"), 0xE9);
    assert_eq!(java_string_hash_code("😀"), 0xD83D * 31 + 0xDE00);
}

#[test]
fn first_join_v4_requires_member_id_and_v3_does_not() {
    let mut h = H::new();
    let id = h.member_id_for("g");
    assert!(id.len() > "client-".len() + 30, "{id}");
    assert_eq!(h.state("g"), Some(Empty));
    let mut req = h.join_req("g2", "", consumer_protocols(&["t"]));
    req.api_version = 3;
    let (r, sent) = h.join_with(req);
    assert!(join_resp(&sent, r).is_none(), "parked");
    assert_eq!(h.state("g2"), Some(PreparingRebalance));
}

#[test]
fn single_member_waits_the_initial_delay() {
    let mut h = H::new();
    let (id, r) = h.new_member("g", &["t"]);
    assert_eq!(h.state("g"), Some(PreparingRebalance));
    assert_eq!(h.c.next_deadline(), Some(3_000));
    assert!(h.advance(2_999).is_empty());
    let sent = h.advance(1);
    let j = join_resp(&sent, r).unwrap();
    assert_eq!(j.error_code, error_code::NONE);
    assert_eq!(j.generation_id, 1);
    assert_eq!(j.leader, id);
    assert_eq!(j.protocol_name.as_deref(), Some("range"));
    assert_eq!(j.protocol_type.as_deref(), Some("consumer"));
    assert_eq!(j.members.len(), 1);
    assert_eq!(h.state("g"), Some(CompletingRebalance));
    let (rs, sent) = h.sync("g", &id, 1, vec![(id.clone(), Bytes::from_static(b"A"))]);
    let s = sync_resp(&sent, rs).unwrap();
    assert_eq!(s.error_code, error_code::NONE);
    assert_eq!(s.assignment, Bytes::from_static(b"A"));
    assert_eq!(h.state("g"), Some(Stable));
    // The assignment was persisted before the response.
    assert!(
        matches!(h.log.last(), Some((_, Record::GroupMetadata(r))) if r.value.as_ref().unwrap().generation == 1)
    );
}

#[test]
fn initial_delay_extends_while_members_arrive() {
    let mut h = H::new();
    let (a, ra) = h.new_member("g", &["t"]);
    h.advance(2_000);
    let (b, rb) = h.new_member("g", &["t"]);
    // At 3 s a member had arrived during the delay: wait another 3 s.
    assert!(h.advance(1_000).is_empty());
    assert_eq!(h.c.next_deadline(), Some(6_000));
    h.advance(2_000);
    let (c, rc) = h.new_member("g", &["t"]);
    assert!(h.advance(1_000).is_empty(), "extended again to 9 s");
    let sent = h.advance(3_000);
    assert_eq!(h.now, 9_000);
    let ja = join_resp(&sent, ra).unwrap();
    let jb = join_resp(&sent, rb).unwrap();
    let jc = join_resp(&sent, rc).unwrap();
    // The first joiner leads and alone sees every member's metadata.
    assert_eq!(ja.leader, a);
    assert_eq!(jb.leader, a);
    let ids: Vec<_> = ja.members.iter().map(|m| m.member_id.clone()).collect();
    assert_eq!(ids, vec![a.clone(), b.clone(), c.clone()]);
    assert_eq!(ja.members[0].metadata, encode_subscription(&["t"]));
    assert!(jb.members.is_empty());
    assert!(jc.members.is_empty());
    assert!([ja.generation_id, jb.generation_id, jc.generation_id]
        .iter()
        .all(|g| *g == 1));
}

#[test]
fn initial_delay_is_bounded_by_rebalance_timeout() {
    let mut h = H::new();
    let id = h.member_id_for("g");
    let mut req = h.join_req("g", &id, consumer_protocols(&["t"]));
    req.rebalance_timeout_ms = 7_000;
    let (r, _) = h.join_with(req);
    let mut t = 0;
    let mut answered = None;
    // A new member every 2 s: the delay cannot extend past ~rebalance timeout.
    while answered.is_none() && t < 30_000 {
        t += 2_000;
        let sent = h.advance_to(t);
        answered = join_resp(&sent, r).map(|_| t);
        if answered.is_none() {
            h.new_member("g", &["t"]);
        }
    }
    let done = answered.unwrap();
    assert!(done <= 10_000, "completed at {done}");
}

#[test]
fn sync_of_followers_waits_for_leader() {
    let mut h = H::new();
    let (a, ra) = h.new_member("g", &["t"]);
    let (b, rb) = h.new_member("g", &["t"]);
    let sent = h.finish_initial(&[ra, rb]);
    let gen = join_resp(&sent, ra).unwrap().generation_id;
    assert!(join_resp(&sent, rb).is_some());
    let (sb, sent) = h.sync("g", &b, gen, vec![]);
    assert!(sync_resp(&sent, sb).is_none(), "follower parked");
    let (sa, sent) = h.sync(
        "g",
        &a,
        gen,
        vec![
            (a.clone(), Bytes::from_static(b"A")),
            (b.clone(), Bytes::from_static(b"B")),
        ],
    );
    assert_eq!(
        sync_resp(&sent, sa).unwrap().assignment,
        Bytes::from_static(b"A")
    );
    assert_eq!(
        sync_resp(&sent, sb).unwrap().assignment,
        Bytes::from_static(b"B")
    );
    // A late sync in Stable is answered at once.
    let (sb2, sent) = h.sync("g", &b, gen, vec![]);
    assert_eq!(
        sync_resp(&sent, sb2).unwrap().assignment,
        Bytes::from_static(b"B")
    );
}

#[test]
fn sync_errors() {
    let mut h = H::new();
    let (ids, gen) = h.stable_group("g", 2);
    let (r, sent) = h.sync("g", &ids[1], gen + 1, vec![]);
    assert_eq!(
        sync_resp(&sent, r).unwrap().error_code,
        error_code::ILLEGAL_GENERATION
    );
    let (r, sent) = h.sync("g", "nobody", gen, vec![]);
    assert_eq!(
        sync_resp(&sent, r).unwrap().error_code,
        error_code::UNKNOWN_MEMBER_ID
    );
    let (r, sent) = h.sync("nogroup", "nobody", gen, vec![]);
    assert_eq!(
        sync_resp(&sent, r).unwrap().error_code,
        error_code::UNKNOWN_MEMBER_ID
    );
    let r2 = h.responder();
    let out = h.c.handle_sync(
        SyncGroupRequest {
            group_id: "g".into(),
            generation_id: gen,
            member_id: ids[1].clone(),
            group_instance_id: None,
            protocol_type: Some("connect".into()),
            protocol_name: None,
            assignments: vec![],
        },
        h.now,
        r2,
    );
    let sent = h.absorb(out);
    assert_eq!(
        sync_resp(&sent, r2).unwrap().error_code,
        error_code::INCONSISTENT_GROUP_PROTOCOL
    );
    // During a rebalance.
    let req = h.join_req("g", &ids[0], consumer_protocols(&["t"]));
    h.join_with(req);
    assert_eq!(h.state("g"), Some(PreparingRebalance));
    let (r, sent) = h.sync("g", &ids[1], gen, vec![]);
    assert_eq!(
        sync_resp(&sent, r).unwrap().error_code,
        error_code::REBALANCE_IN_PROGRESS
    );
}

#[test]
fn heartbeat_rebalance_in_progress_then_rejoin() {
    let mut h = H::new();
    let (ids, gen) = h.stable_group("g", 2);
    assert_eq!(h.heartbeat("g", &ids[1], gen), error_code::NONE);
    assert_eq!(
        h.heartbeat("g", &ids[1], gen + 5),
        error_code::ILLEGAL_GENERATION
    );
    assert_eq!(h.heartbeat("g", "x", gen), error_code::UNKNOWN_MEMBER_ID);
    assert_eq!(h.heartbeat("none", "x", gen), error_code::UNKNOWN_MEMBER_ID);
    // A third member joins: the group rebalances.
    let (c, rc) = h.new_member("g", &["t"]);
    assert_eq!(h.state("g"), Some(PreparingRebalance));
    assert_eq!(
        h.heartbeat("g", &ids[1], gen),
        error_code::REBALANCE_IN_PROGRESS
    );
    // The old members rejoin; once all three have, the phase ends without waiting.
    let req = h.join_req("g", &ids[1], consumer_protocols(&["t"]));
    let (r1, sent) = h.join_with(req);
    assert!(sent.is_empty());
    let req = h.join_req("g", &ids[0], consumer_protocols(&["t"]));
    let (r0, sent) = h.join_with(req);
    let j0 = join_resp(&sent, r0).unwrap();
    assert_eq!(j0.generation_id, gen + 1);
    assert_eq!(j0.leader, ids[0]);
    assert_eq!(j0.members.len(), 3);
    assert!(join_resp(&sent, r1).is_some());
    assert_eq!(join_resp(&sent, rc).unwrap().member_id, c);
    assert_eq!(h.state("g"), Some(CompletingRebalance));
    assert_eq!(h.heartbeat("g", &ids[1], gen + 1), error_code::NONE);
}

#[test]
fn follower_rejoin_in_stable_with_same_metadata_needs_no_rebalance() {
    let mut h = H::new();
    let (ids, gen) = h.stable_group("g", 2);
    let req = h.join_req("g", &ids[1], consumer_protocols(&["t"]));
    let (r, sent) = h.join_with(req);
    let j = join_resp(&sent, r).unwrap();
    assert_eq!((j.error_code, j.generation_id), (error_code::NONE, gen));
    assert_eq!(h.state("g"), Some(Stable));
    // Changed metadata forces a rebalance.
    let req = h.join_req("g", &ids[1], consumer_protocols(&["t", "u"]));
    let (_, sent) = h.join_with(req);
    assert!(sent.is_empty());
    assert_eq!(h.state("g"), Some(PreparingRebalance));
}

#[test]
fn session_expiry_removes_member_and_rebalances() {
    let mut h = H::new();
    let (ids, gen) = h.stable_group("g", 2);
    // Only the leader heartbeats.
    for _ in 0..2 {
        h.advance(4_000);
        assert_eq!(h.heartbeat("g", &ids[0], gen), error_code::NONE);
    }
    assert_eq!(h.state("g"), Some(Stable));
    h.advance(4_000);
    assert_eq!(h.state("g"), Some(PreparingRebalance));
    assert_eq!(
        h.heartbeat("g", &ids[1], gen),
        error_code::UNKNOWN_MEMBER_ID
    );
    assert_eq!(
        h.heartbeat("g", &ids[0], gen),
        error_code::REBALANCE_IN_PROGRESS
    );
    let req = h.join_req("g", &ids[0], consumer_protocols(&["t"]));
    let (r, sent) = h.join_with(req);
    let j = join_resp(&sent, r).unwrap();
    assert_eq!(j.members.len(), 1);
    assert_eq!(j.generation_id, gen + 1);
}

#[test]
fn rebalance_timeout_removes_members_that_do_not_rejoin() {
    let mut h = H::new();
    let (ids, gen) = h.stable_group("g", 3);
    // A follower with a new subscription rejoins.
    let req = h.join_req("g", &ids[1], consumer_protocols(&["t", "u"]));
    let (r1, _) = h.join_with(req);
    assert_eq!(h.state("g"), Some(PreparingRebalance));
    // Members 0 and 2 keep heartbeating but never rejoin.
    let mut sent = Vec::new();
    let mut t = 0;
    while sent.is_empty() && t < i64::from(REBALANCE_MS) {
        sent = h.advance(3_000);
        t += 3_000;
        for id in [&ids[0], &ids[2]] {
            let code = h.heartbeat("g", id, gen);
            assert!(
                code == error_code::REBALANCE_IN_PROGRESS || code == error_code::UNKNOWN_MEMBER_ID
            );
        }
    }
    assert_eq!(t, i64::from(REBALANCE_MS));
    let j = join_resp(&sent, r1).unwrap();
    assert_eq!(j.generation_id, gen + 1);
    // The old leader did not rejoin: the rejoined member leads.
    assert_eq!(j.leader, ids[1]);
    assert_eq!(j.members.len(), 1);
    assert_eq!(
        h.heartbeat("g", &ids[0], gen + 1),
        error_code::UNKNOWN_MEMBER_ID
    );
}

#[test]
fn leader_that_never_syncs_is_removed_after_rebalance_timeout() {
    let mut h = H::new();
    let (a, ra) = h.new_member("g", &["t"]);
    let (b, rb) = h.new_member("g", &["t"]);
    let sent = h.finish_initial(&[ra, rb]);
    let gen = join_resp(&sent, ra).unwrap().generation_id;
    let (sb, _) = h.sync("g", &b, gen, vec![]);
    let sent = h.advance(i64::from(REBALANCE_MS));
    assert_eq!(
        sync_resp(&sent, sb).unwrap().error_code,
        error_code::REBALANCE_IN_PROGRESS
    );
    assert_eq!(h.state("g"), Some(PreparingRebalance));
    assert_eq!(h.heartbeat("g", &a, gen), error_code::UNKNOWN_MEMBER_ID);
}

#[test]
fn leave_single_and_batched() {
    let mut h = H::new();
    let (ids, gen) = h.stable_group("g", 3);
    let (resp, _) = h.leave("g", vec![identity(&ids[2])]);
    assert_eq!(resp.error_code, error_code::NONE);
    assert_eq!(resp.members[0].error_code, error_code::NONE);
    assert_eq!(h.state("g"), Some(PreparingRebalance));
    // Batched: one known, one unknown, one by unknown instance id.
    let (resp, _) = h.leave(
        "g",
        vec![
            identity(&ids[1]),
            identity("ghost"),
            MemberIdentity {
                member_id: String::new(),
                group_instance_id: Some("nope".into()),
                reason: Some("bye".into()),
            },
        ],
    );
    let codes: Vec<i16> = resp.members.iter().map(|m| m.error_code).collect();
    assert_eq!(
        codes,
        vec![
            error_code::NONE,
            error_code::UNKNOWN_MEMBER_ID,
            error_code::UNKNOWN_MEMBER_ID
        ]
    );
    // The last member leaves: the rebalance ends with no members, the group is Empty.
    let (resp, sent) = h.leave("g", vec![identity(&ids[0])]);
    assert_eq!(resp.members[0].error_code, error_code::NONE);
    assert!(!sent.is_empty());
    assert_eq!(h.state("g"), Some(Empty));
    assert_eq!(h.c.group_generation("g"), Some(gen + 1));
    let (resp, _) = h.leave("nogroup", vec![identity("x")]);
    assert_eq!(resp.error_code, error_code::UNKNOWN_MEMBER_ID);
}

#[test]
fn leave_during_join_answers_parked_join() {
    let mut h = H::new();
    let (ids, _) = h.stable_group("g", 2);
    let req = h.join_req("g", &ids[1], consumer_protocols(&["t", "u"]));
    let (r1, _) = h.join_with(req);
    let (_, sent) = h.leave("g", vec![identity(&ids[1])]);
    assert_eq!(
        join_resp(&sent, r1).unwrap().error_code,
        error_code::UNKNOWN_MEMBER_ID
    );
}

#[test]
fn pending_member_expires_after_session_timeout() {
    let mut h = H::new();
    let id = h.member_id_for("g");
    h.advance(i64::from(SESSION_MS));
    // The id was never used: it is forgotten and the stale id is unknown.
    let req = h.join_req("g", &id, consumer_protocols(&["t"]));
    let (r, sent) = h.join_with(req);
    assert_eq!(
        join_resp(&sent, r).unwrap().error_code,
        error_code::UNKNOWN_MEMBER_ID
    );
}

#[test]
fn new_member_join_is_bounded_by_new_member_timeout() {
    let mut h = H::new();
    let (ids, _) = h.stable_group("g", 1);
    let (_c, rc) = h.new_member("g", &["t"]);
    // The old member never rejoins and never heartbeats, so the group keeps rebalancing;
    // the new member's parked join times out on its own clock (KIP-394) if not done.
    let sent = h.advance_to(i64::from(REBALANCE_MS) + 10);
    let j = join_resp(&h.sent, rc)
        .or_else(|| join_resp(&sent, rc))
        .unwrap();
    assert_eq!(j.error_code, error_code::NONE);
    assert_eq!(j.members.len(), 1, "old member {} was removed", ids[0]);
}

#[test]
fn join_validation_errors() {
    let mut h = H::new();
    let mut req = h.join_req("", "", consumer_protocols(&["t"]));
    let (r, sent) = h.join_with(req.clone());
    assert_eq!(
        join_resp(&sent, r).unwrap().error_code,
        error_code::INVALID_GROUP_ID
    );
    req.group_id = "g".into();
    req.session_timeout_ms = 10;
    let (r, sent) = h.join_with(req.clone());
    assert_eq!(
        join_resp(&sent, r).unwrap().error_code,
        error_code::INVALID_SESSION_TIMEOUT
    );
    req.session_timeout_ms = SESSION_MS;
    req.member_id = "made-up".into();
    let (r, sent) = h.join_with(req.clone());
    assert_eq!(
        join_resp(&sent, r).unwrap().error_code,
        error_code::UNKNOWN_MEMBER_ID
    );
    req.member_id = String::new();
    req.protocols = vec![];
    let (r, sent) = h.join_with(req);
    assert_eq!(
        join_resp(&sent, r).unwrap().error_code,
        error_code::INCONSISTENT_GROUP_PROTOCOL
    );
}

#[test]
fn inconsistent_protocols() {
    let mut h = H::new();
    let (_ids, _) = h.stable_group("g", 1);
    let mut req = h.join_req("g", "", vec![("sticky".into(), Bytes::new())]);
    let (r, sent) = h.join_with(req.clone());
    assert_eq!(
        join_resp(&sent, r).unwrap().error_code,
        error_code::INCONSISTENT_GROUP_PROTOCOL
    );
    req.protocol_type = "connect".into();
    req.protocols = consumer_protocols(&["t"]);
    let (r, sent) = h.join_with(req);
    assert_eq!(
        join_resp(&sent, r).unwrap().error_code,
        error_code::INCONSISTENT_GROUP_PROTOCOL
    );
}

#[test]
fn protocol_vote_follows_preferences() {
    let mut h = H::new();
    let proto = |names: &[&str]| -> Vec<(String, Bytes)> {
        names
            .iter()
            .map(|n| ((*n).to_owned(), encode_subscription(&["t"])))
            .collect()
    };
    let mut ids = Vec::new();
    for names in [
        &["rr", "range"][..],
        &["range", "rr", "sticky"][..],
        &["rr", "range"][..],
    ] {
        let id = h.member_id_for("g");
        let req = h.join_req("g", &id, proto(names));
        let (r, _) = h.join_with(req);
        ids.push(r);
    }
    let sent = h.finish_initial(&ids);
    assert_eq!(
        join_resp(&sent, ids[0]).unwrap().protocol_name.as_deref(),
        Some("rr")
    );
    // A member that supports neither is refused.
    let req = h.join_req("g", "", proto(&["sticky"]));
    let (r, sent) = h.join_with(req);
    assert_eq!(
        join_resp(&sent, r).unwrap().error_code,
        error_code::INCONSISTENT_GROUP_PROTOCOL
    );
}

#[test]
fn other_protocol_types_are_opaque() {
    let mut h = H::new();
    let id = h.member_id_for("c");
    let mut req = h.join_req(
        "c",
        &id,
        vec![("default".into(), Bytes::from_static(b"\x01\x02opaque"))],
    );
    req.protocol_type = "connect".into();
    let (r, _) = h.join_with(req);
    let sent = h.advance(3_000);
    let j = join_resp(&sent, r).unwrap();
    assert_eq!(j.protocol_type.as_deref(), Some("connect"));
    assert_eq!(j.members[0].metadata, Bytes::from_static(b"\x01\x02opaque"));
}

#[test]
fn group_max_size() {
    let mut h = H::with_config(GroupConfig {
        group_max_size: 2,
        ..GroupConfig::default()
    });
    let (_a, ra) = h.new_member("g", &["t"]);
    let (_b, rb) = h.new_member("g", &["t"]);
    // Two members are awaiting join: a third is refused before it gets a member id.
    let req = h.join_req("g", "", consumer_protocols(&["t"]));
    let (r, sent) = h.join_with(req);
    assert_eq!(
        join_resp(&sent, r).unwrap().error_code,
        error_code::GROUP_MAX_SIZE_REACHED
    );
    h.finish_initial(&[ra, rb]);
    assert_eq!(h.state("g"), Some(CompletingRebalance));
    let req = h.join_req("g", "", consumer_protocols(&["t"]));
    let (r, sent) = h.join_with(req);
    assert_eq!(
        join_resp(&sent, r).unwrap().error_code,
        error_code::GROUP_MAX_SIZE_REACHED
    );
}

fn static_join(
    h: &mut H,
    group: &str,
    member_id: &str,
    instance: &str,
    topics: &[&str],
) -> (u64, Vec<Respond>) {
    let mut req = h.join_req(group, member_id, consumer_protocols(topics));
    req.group_instance_id = Some(instance.to_owned());
    h.join_with(req)
}

#[test]
fn static_member_rejoins_without_rebalance_and_old_id_is_fenced() {
    let mut h = H::new();
    let (ra, _) = static_join(&mut h, "g", "", "inst-a", &["t"]);
    let (rb, _) = static_join(&mut h, "g", "", "inst-b", &["t"]);
    let sent = h.finish_initial(&[ra, rb]);
    let ja = join_resp(&sent, ra).unwrap();
    let jb = join_resp(&sent, rb).unwrap();
    assert!(ja.member_id.starts_with("inst-a-"));
    assert_eq!(ja.members[0].group_instance_id.as_deref(), Some("inst-a"));
    let gen = ja.generation_id;
    h.sync("g", &jb.member_id, gen, vec![]);
    h.sync(
        "g",
        &ja.member_id,
        gen,
        vec![
            (ja.member_id.clone(), Bytes::from_static(b"A")),
            (jb.member_id.clone(), Bytes::from_static(b"B")),
        ],
    );
    assert_eq!(h.state("g"), Some(Stable));
    let records_before = h.log.len();
    // inst-b restarts (empty member id, same instance id, same protocols).
    let (rb2, sent) = static_join(&mut h, "g", "", "inst-b", &["t"]);
    let jb2 = join_resp(&sent, rb2).unwrap();
    assert_eq!(jb2.error_code, error_code::NONE);
    assert_eq!(jb2.generation_id, gen);
    assert_ne!(jb2.member_id, jb.member_id);
    assert!(!jb2.skip_assignment);
    assert_eq!(h.state("g"), Some(Stable), "no rebalance");
    assert_eq!(h.log.len(), records_before + 1, "new member id persisted");
    // It gets its old assignment.
    let r = h.responder();
    let out = h.c.handle_sync(
        SyncGroupRequest {
            group_id: "g".into(),
            generation_id: gen,
            member_id: jb2.member_id.clone(),
            group_instance_id: Some("inst-b".into()),
            protocol_type: None,
            protocol_name: None,
            assignments: vec![],
        },
        h.now,
        r,
    );
    let sent = h.absorb(out);
    assert_eq!(
        sync_resp(&sent, r).unwrap().assignment,
        Bytes::from_static(b"B")
    );
    // The old member id of inst-b is fenced.
    let hb = h.c.handle_heartbeat(
        HeartbeatRequest {
            group_id: "g".into(),
            generation_id: gen,
            member_id: jb.member_id.clone(),
            group_instance_id: Some("inst-b".into()),
        },
        h.now,
    );
    assert_eq!(hb.error_code, error_code::FENCED_INSTANCE_ID);
    let (r, sent) = static_join(&mut h, "g", &jb.member_id, "inst-b", &["t"]);
    assert_eq!(
        join_resp(&sent, r).unwrap().error_code,
        error_code::FENCED_INSTANCE_ID
    );
    // The static leader rejoining is told to skip the assignment (KIP-814).
    let (ra2, sent) = static_join(&mut h, "g", "", "inst-a", &["t"]);
    let ja2 = join_resp(&sent, ra2).unwrap();
    assert!(ja2.skip_assignment);
    assert_eq!(ja2.leader, ja2.member_id);
    assert_eq!(ja2.members.len(), 2);
    assert_eq!(h.state("g"), Some(Stable));
    // Before JoinGroup v9 the returning leader is answered as a follower.
    let mut req = h.join_req("g", "", consumer_protocols(&["t"]));
    req.group_instance_id = Some("inst-a".to_owned());
    req.api_version = 8;
    let (ra3, sent) = h.join_with(req);
    let ja3 = join_resp(&sent, ra3).unwrap();
    assert_eq!(ja3.error_code, error_code::NONE);
    assert!(!ja3.skip_assignment);
    assert!(ja3.members.is_empty());
    assert_eq!(ja3.leader, ja2.member_id);
    assert_eq!(h.state("g"), Some(Stable));
}

#[test]
fn static_member_with_new_protocol_triggers_rebalance() {
    let mut h = H::new();
    let (ra, _) = static_join(&mut h, "g", "", "inst-a", &["t"]);
    let sent = h.advance(3_000);
    let ja = join_resp(&sent, ra).unwrap();
    h.sync("g", &ja.member_id, ja.generation_id, vec![]);
    let mut protocols = consumer_protocols(&["t"]);
    protocols.reverse();
    let mut req = h.join_req("g", "", protocols);
    req.group_instance_id = Some("inst-a".into());
    let (r, sent) = h.join_with(req);
    // The only member changes the protocol: the vote changes, so a rebalance runs (and
    // ends at once, as the only member has rejoined).
    let j = join_resp(&sent, r).unwrap();
    assert_eq!(j.generation_id, ja.generation_id + 1);
    assert_eq!(j.protocol_name.as_deref(), Some("roundrobin"));
    assert_eq!(h.state("g"), Some(CompletingRebalance));
}

#[test]
fn static_member_is_not_removed_by_join_completion() {
    let mut h = H::new();
    let (ra, _) = static_join(&mut h, "g", "", "inst-a", &["t"]);
    let (rb, _) = static_join(&mut h, "g", "", "inst-b", &["t"]);
    let sent = h.finish_initial(&[ra, rb]);
    let ja = join_resp(&sent, ra).unwrap();
    let jb = join_resp(&sent, rb).unwrap();
    let gen = ja.generation_id;
    h.sync("g", &jb.member_id, gen, vec![]);
    h.sync("g", &ja.member_id, gen, vec![]);
    // Leader rejoins; inst-b does not but keeps heartbeating.
    let mut req = h.join_req("g", &ja.member_id, consumer_protocols(&["t"]));
    req.group_instance_id = Some("inst-a".into());
    let (ra2, _) = h.join_with(req);
    let mut sent = Vec::new();
    for _ in 0..30 {
        h.advance(3_000);
        if let Some(j) = join_resp(&h.sent, ra2) {
            sent.push(j);
            break;
        }
        let hb = h.c.handle_heartbeat(
            HeartbeatRequest {
                group_id: "g".into(),
                generation_id: gen,
                member_id: jb.member_id.clone(),
                group_instance_id: Some("inst-b".into()),
            },
            h.now,
        );
        assert_eq!(hb.error_code, error_code::REBALANCE_IN_PROGRESS);
    }
    let j = &sent[0];
    assert_eq!(j.members.len(), 2, "the static member keeps its slot");
}

#[test]
fn leave_by_instance_id() {
    let mut h = H::new();
    let (ra, _) = static_join(&mut h, "g", "", "inst-a", &["t"]);
    let sent = h.advance(3_000);
    let ja = join_resp(&sent, ra).unwrap();
    h.sync("g", &ja.member_id, ja.generation_id, vec![]);
    let (resp, _) = h.leave(
        "g",
        vec![MemberIdentity {
            member_id: String::new(),
            group_instance_id: Some("inst-a".into()),
            reason: None,
        }],
    );
    assert_eq!(resp.members[0].error_code, error_code::NONE);
    // Nobody is left to wait for: the group is Empty at once.
    assert_eq!(h.state("g"), Some(Empty));
}

#[test]
fn coordinator_load_in_progress_and_not_coordinator() {
    let mut c = GroupCoordinator::new(GroupConfig::default(), 1);
    let p = c.partition_for("g");
    let hb = |c: &mut GroupCoordinator| {
        c.handle_heartbeat(
            HeartbeatRequest {
                group_id: "g".into(),
                generation_id: 1,
                member_id: "m".into(),
                group_instance_id: None,
            },
            0,
        )
        .error_code
    };
    assert_eq!(hb(&mut c), error_code::NOT_COORDINATOR);
    c.load_partition_start(p);
    assert_eq!(hb(&mut c), error_code::COORDINATOR_LOAD_IN_PROGRESS);
    assert_eq!(
        c.handle_list_groups(&ListGroupsRequest::default())
            .error_code,
        error_code::COORDINATOR_LOAD_IN_PROGRESS
    );
    c.load_partition_done(p, 0);
    assert_eq!(hb(&mut c), error_code::UNKNOWN_MEMBER_ID);
}

#[test]
fn unload_answers_parked_requests_not_coordinator() {
    let mut h = H::new();
    let (_a, ra) = h.new_member("g", &["t"]);
    let p = h.c.partition_for("g");
    let out = h.c.unload_partition(p);
    let sent = h.absorb(out);
    assert_eq!(
        join_resp(&sent, ra).unwrap().error_code,
        error_code::NOT_COORDINATOR
    );
    assert_eq!(h.state("g"), None);
}

#[test]
fn describe_list_delete() {
    let mut h = H::new();
    let (ids, _) = h.stable_group("g", 2);
    h.commit("simple", "", -1, "t", 0, 1);
    let d = h.c.handle_describe_groups(&DescribeGroupsRequest {
        groups: vec!["g".into(), "missing".into()],
        api_version: 5,
    });
    let g = &d.groups[0];
    assert_eq!(
        (
            g.group_state.as_str(),
            g.protocol_type.as_str(),
            g.protocol_data.as_str()
        ),
        ("Stable", "consumer", "range")
    );
    assert_eq!(g.members.len(), 2);
    assert_eq!(g.members[0].member_id, ids[0]);
    assert_eq!(
        g.members[1].member_assignment,
        Bytes::from(format!("assign-{}", ids[1]))
    );
    assert_eq!(g.members[0].member_metadata, encode_subscription(&["t"]));
    assert_eq!(
        (d.groups[1].error_code, d.groups[1].group_state.as_str()),
        (error_code::NONE, "Dead")
    );
    let d6 = h.c.handle_describe_groups(&DescribeGroupsRequest {
        groups: vec!["missing".into()],
        api_version: 6,
    });
    assert_eq!(d6.groups[0].error_code, error_code::GROUP_ID_NOT_FOUND);

    let all = h.c.handle_list_groups(&ListGroupsRequest::default());
    assert_eq!(all.groups.len(), 2);
    let stable = h.c.handle_list_groups(&ListGroupsRequest {
        states_filter: vec!["stable".into()],
        types_filter: vec![],
    });
    assert_eq!(
        stable
            .groups
            .iter()
            .map(|g| g.group_id.as_str())
            .collect::<Vec<_>>(),
        vec!["g"]
    );
    let empty = h.c.handle_list_groups(&ListGroupsRequest {
        states_filter: vec!["Empty".into()],
        types_filter: vec!["classic".into()],
    });
    assert_eq!(empty.groups.len(), 1);
    assert_eq!(empty.groups[0].protocol_type, "");
    let consumer = h.c.handle_list_groups(&ListGroupsRequest {
        states_filter: vec![],
        types_filter: vec!["consumer".into()],
    });
    assert!(consumer.groups.is_empty());

    let r = h.responder();
    let out = h.c.handle_delete_groups(
        DeleteGroupsRequest {
            groups_names: vec!["g".into(), "simple".into(), "missing".into()],
        },
        h.now,
        r,
    );
    let before = h.log.len();
    let sent = h.absorb(out);
    let Response::DeleteGroups(d) = &sent[0].response else {
        panic!()
    };
    let codes: Vec<i16> = d.results.iter().map(|r| r.error_code).collect();
    assert_eq!(
        codes,
        vec![
            error_code::NON_EMPTY_GROUP,
            error_code::NONE,
            error_code::GROUP_ID_NOT_FOUND
        ]
    );
    // An offset tombstone and a group tombstone.
    assert_eq!(h.log.len(), before + 2);
    assert!(h.log[before..].iter().all(|(_, r)| r.is_tombstone()));
    assert_eq!(h.state("simple"), None);
    assert_eq!(h.fetch("simple", "t", 0).0, -1);
}

#[test]
fn state_names_parse_case_insensitively() {
    for s in ClassicGroupState::ALL {
        assert_eq!(
            s.to_string().to_lowercase().parse::<ClassicGroupState>(),
            Ok(s)
        );
    }
    assert!("bogus".parse::<ClassicGroupState>().is_err());
}

#[test]
fn parked_new_member_times_out_with_unknown_member_id() {
    let mut h = H::new();
    // An existing member with a rebalance timeout longer than the new-member timeout
    // keeps heartbeating but never rejoins, so the join phase outlasts 5 minutes.
    let id = h.member_id_for("g");
    let mut req = h.join_req("g", &id, consumer_protocols(&["t"]));
    req.rebalance_timeout_ms = 600_000;
    let (r, _) = h.join_with(req);
    let sent = h.finish_initial(&[r]);
    let gen = join_resp(&sent, r).unwrap().generation_id;
    h.sync("g", &id, gen, vec![]);
    let (_new, rn) = h.new_member("g", &["t"]);
    let joined_at = h.now;
    let mut answer = None;
    while answer.is_none() && h.now < joined_at + 400_000 {
        h.advance(5_000);
        let _ = h.heartbeat("g", &id, gen);
        answer = join_resp(&h.sent, rn).map(|j| (j.error_code, h.now - joined_at));
    }
    let (code, after) = answer.unwrap();
    assert_eq!(code, error_code::UNKNOWN_MEMBER_ID);
    assert!((300_000..305_000).contains(&after), "{after}");
}

#[test]
fn duplicate_parked_join_answers_the_first() {
    let mut h = H::new();
    let (ids, _) = h.stable_group("g", 2);
    let req = h.join_req("g", &ids[1], consumer_protocols(&["t", "u"]));
    let (r1, _) = h.join_with(req.clone());
    let (_r2, sent) = h.join_with(req);
    assert_eq!(
        join_resp(&sent, r1).unwrap().error_code,
        error_code::REBALANCE_IN_PROGRESS
    );
}
