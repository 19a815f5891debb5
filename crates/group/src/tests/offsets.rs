//! OffsetCommit, OffsetFetch, OffsetDelete and offset retention.

use super::harness::*;
use crate::ClassicGroupState::*;
use crate::*;

const DAY_MS: i64 = 24 * 60 * 60 * 1000;

#[test]
fn member_commit_and_fetch() {
    let mut h = H::new();
    let (ids, gen) = h.stable_group("g", 2);
    assert_eq!(h.commit("g", &ids[1], gen, "t", 0, 42), error_code::NONE);
    assert_eq!(h.fetch("g", "t", 0), (42, 5, Some("meta".into())));
    assert_eq!(h.fetch("g", "t", 1), (-1, -1, Some(String::new())));
    assert_eq!(h.fetch("other", "t", 0).0, -1);
    assert_eq!(
        h.commit("g", &ids[1], gen + 1, "t", 0, 43),
        error_code::ILLEGAL_GENERATION
    );
    assert_eq!(
        h.commit("g", "stranger", gen, "t", 0, 43),
        error_code::UNKNOWN_MEMBER_ID
    );
    // A simple commit is refused while the group has members.
    assert_eq!(
        h.commit("g", "", -1, "t", 0, 43),
        error_code::UNKNOWN_MEMBER_ID
    );
    assert_eq!(h.fetch("g", "t", 0).0, 42);
    // Fetch of all offsets.
    h.commit("g", &ids[0], gen, "u", 3, 7);
    let all = h.c.handle_offset_fetch(&OffsetFetchRequest {
        group_id: "g".into(),
        topics: None,
        require_stable: true,
        member_id: None,
        member_epoch: -1,
    });
    let names: Vec<_> = all.topics.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, vec!["t", "u"]);
}

#[test]
fn commit_during_rebalance() {
    let mut h = H::new();
    let (ids, gen) = h.stable_group("g", 2);
    let req = h.join_req("g", &ids[0], consumer_protocols(&["t"]));
    h.join_with(req);
    assert_eq!(h.state("g"), Some(PreparingRebalance));
    // The old generation can still commit while preparing.
    assert_eq!(h.commit("g", &ids[1], gen, "t", 0, 1), error_code::NONE);
    let req = h.join_req("g", &ids[1], consumer_protocols(&["t"]));
    h.join_with(req);
    assert_eq!(h.state("g"), Some(CompletingRebalance));
    assert_eq!(
        h.commit("g", &ids[1], gen + 1, "t", 0, 2),
        error_code::REBALANCE_IN_PROGRESS
    );
}

#[test]
fn simple_commit_creates_group_and_unknown_generation_fails() {
    let mut h = H::new();
    assert_eq!(h.commit("s", "", -1, "t", 0, 9), error_code::NONE);
    assert_eq!(h.state("s"), Some(Empty));
    assert_eq!(h.fetch("s", "t", 0).0, 9);
    assert_eq!(
        h.commit("nog", "m", 3, "t", 0, 9),
        error_code::ILLEGAL_GENERATION
    );
    assert_eq!(h.state("nog"), None);
}

#[test]
fn metadata_too_large() {
    let mut h = H::with_config(GroupConfig {
        offset_metadata_max_bytes: 2,
        ..GroupConfig::default()
    });
    assert_eq!(
        h.commit("s", "", -1, "t", 0, 9),
        error_code::OFFSET_METADATA_TOO_LARGE
    );
    assert_eq!(h.fetch("s", "t", 0).0, -1);
}

#[test]
fn offset_delete_rules() {
    let mut h = H::new();
    let (ids, gen) = h.stable_group("g", 1);
    h.commit("g", &ids[0], gen, "t", 0, 1);
    h.commit("g", &ids[0], gen, "other", 0, 1);
    let del = |h: &mut H, group: &str, topic: &str| {
        let r = h.responder();
        let out = h.c.handle_offset_delete(
            OffsetDeleteRequest {
                group_id: group.into(),
                topics: vec![OffsetDeleteRequestTopic {
                    name: topic.into(),
                    partitions: vec![0],
                }],
            },
            h.now,
            r,
        );
        let sent = h.absorb(out);
        let Response::OffsetDelete(d) = &sent[0].response else {
            panic!()
        };
        (
            d.error_code,
            d.topics.first().map(|t| t.partitions[0].error_code),
        )
    };
    // The group consumes "t".
    assert_eq!(
        del(&mut h, "g", "t"),
        (
            error_code::NONE,
            Some(error_code::GROUP_SUBSCRIBED_TO_TOPIC)
        )
    );
    assert_eq!(h.fetch("g", "t", 0).0, 1);
    assert_eq!(
        del(&mut h, "g", "other"),
        (error_code::NONE, Some(error_code::NONE))
    );
    assert_eq!(h.fetch("g", "other", 0).0, -1);
    assert!(matches!(h.log.last(), Some((_, r)) if r.is_tombstone()));
    assert_eq!(
        del(&mut h, "missing", "t").0,
        error_code::GROUP_ID_NOT_FOUND
    );
    // After everyone leaves, "t" can be deleted.
    h.leave("g", vec![identity(&ids[0])]);
    assert_eq!(h.state("g"), Some(Empty));
    assert_eq!(
        del(&mut h, "g", "t"),
        (error_code::NONE, Some(error_code::NONE))
    );
}

#[test]
fn offset_delete_non_consumer_group_is_non_empty() {
    let mut h = H::new();
    let id = h.member_id_for("c");
    let mut req = h.join_req("c", &id, vec![("x".into(), bytes::Bytes::new())]);
    req.protocol_type = "connect".into();
    h.join_with(req);
    let r = h.responder();
    let out = h.c.handle_offset_delete(
        OffsetDeleteRequest {
            group_id: "c".into(),
            topics: vec![],
        },
        h.now,
        r,
    );
    let sent = h.absorb(out);
    let Response::OffsetDelete(d) = &sent[0].response else {
        panic!()
    };
    assert_eq!(d.error_code, error_code::NON_EMPTY_GROUP);
}

#[test]
fn offsets_expire_only_while_empty() {
    let mut h = H::new();
    let (ids, gen) = h.stable_group("g", 1);
    h.commit("g", &ids[0], gen, "t", 0, 1);
    // The member leaves at time L: the group is Empty and its offsets age from L, not
    // from the commit.
    h.advance_to(h.now + 5_000);
    h.leave("g", vec![identity(&ids[0])]);
    assert_eq!(h.state("g"), Some(Empty));
    let left = h.now;
    h.advance_to(left + 7 * DAY_MS - 700_000);
    assert_eq!(h.fetch("g", "t", 0).0, 1, "not yet");
    h.advance_to(left + 7 * DAY_MS + 700_000);
    assert_eq!(h.fetch("g", "t", 0).0, -1, "expired");
    // With no offsets left, the Empty group is deleted as well.
    assert_eq!(h.state("g"), None);
    let n = h.log.len();
    assert!(h.log[n - 2..].iter().all(|(_, r)| r.is_tombstone()));
    assert!(matches!(&h.log[n - 1].1, Record::GroupMetadata(_)));
}

#[test]
fn offsets_of_stable_group_do_not_expire() {
    let mut h = H::new();
    let id = h.member_id_for("g");
    let mut req = h.join_req("g", &id, consumer_protocols(&["t"]));
    req.session_timeout_ms = 1_800_000;
    let (r, _) = h.join_with(req);
    let sent = h.advance(3_000);
    let gen = join_resp(&sent, r).unwrap().generation_id;
    h.sync("g", &id, gen, vec![]);
    h.commit("g", &id, gen, "t", 0, 1);
    let start = h.now;
    while h.now < start + 8 * DAY_MS {
        h.advance_to(h.now + 1_000_000);
        assert_eq!(h.heartbeat("g", &id, gen), error_code::NONE);
    }
    assert_eq!(h.fetch("g", "t", 0).0, 1);
    assert_eq!(h.state("g"), Some(Stable));
}

#[test]
fn simple_group_offsets_expire_by_commit_time() {
    let mut h = H::new();
    h.commit("s", "", -1, "t", 0, 1);
    h.advance_to(3 * DAY_MS);
    h.commit("s", "", -1, "t", 1, 1);
    h.advance_to(7 * DAY_MS + 700_000);
    assert_eq!(h.fetch("s", "t", 0).0, -1);
    assert_eq!(h.fetch("s", "t", 1).0, 1);
    assert_eq!(h.state("s"), Some(Empty));
    h.advance_to(10 * DAY_MS + 700_000);
    assert_eq!(h.state("s"), None);
}

#[test]
fn explicit_retention_time_sets_expire_timestamp() {
    let mut h = H::new();
    let r = h.responder();
    let out = h.c.handle_offset_commit(
        OffsetCommitRequest {
            group_id: "s".into(),
            generation_id_or_member_epoch: -1,
            member_id: String::new(),
            group_instance_id: None,
            retention_time_ms: 1_000_000,
            topics: vec![OffsetCommitRequestTopic {
                name: "t".into(),
                partitions: vec![OffsetCommitRequestPartition {
                    partition_index: 0,
                    committed_offset: 5,
                    committed_leader_epoch: -1,
                    committed_metadata: None,
                }],
            }],
            api_version: 2,
        },
        h.now,
        r,
    );
    h.absorb(out);
    assert_eq!(h.fetch("s", "t", 0), (5, -1, Some(String::new())));
    h.advance_to(1_200_000);
    assert_eq!(h.fetch("s", "t", 0).0, -1);
}

#[test]
fn commit_returns_one_persist_with_its_response() {
    let mut h = H::new();
    let r = h.responder();
    let out = h.c.handle_offset_commit(
        OffsetCommitRequest {
            group_id: "s".into(),
            generation_id_or_member_epoch: -1,
            member_id: String::new(),
            group_instance_id: None,
            retention_time_ms: -1,
            topics: vec![OffsetCommitRequestTopic {
                name: "t".into(),
                partitions: vec![
                    OffsetCommitRequestPartition {
                        partition_index: 0,
                        committed_offset: 5,
                        committed_leader_epoch: 2,
                        committed_metadata: None,
                    },
                    OffsetCommitRequestPartition {
                        partition_index: 1,
                        committed_offset: 6,
                        committed_leader_epoch: 2,
                        committed_metadata: Some("x".into()),
                    },
                ],
            }],
            api_version: 8,
        },
        0,
        r,
    );
    assert_eq!(out.len(), 1);
    let Output::Persist {
        records, responses, ..
    } = &out[0]
    else {
        panic!("{out:?}")
    };
    let p = h.c.partition_for("s");
    assert_eq!(records.len(), 2);
    assert!(records.iter().all(|(rp, _)| *rp == p));
    let (_, Record::OffsetCommit(first)) = &records[0] else {
        panic!()
    };
    assert_eq!(
        first.key,
        OffsetCommitKey {
            group: "s".into(),
            topic: "t".into(),
            partition: 0
        }
    );
    assert_eq!(
        first.value,
        Some(OffsetCommitValue {
            offset: 5,
            leader_epoch: 2,
            metadata: String::new(),
            commit_timestamp: 0,
            expire_timestamp: -1,
        })
    );
    assert_eq!(responses.len(), 1);
    assert_eq!(responses[0].responder, r);
    // A failed write turns every partition into the error.
    let Response::OffsetCommit(failed) = responses[0]
        .response
        .clone()
        .failed(error_code::NOT_COORDINATOR)
    else {
        panic!()
    };
    assert!(failed
        .topics
        .iter()
        .flat_map(|t| &t.partitions)
        .all(|p| p.error_code == error_code::NOT_COORDINATOR));
}

#[test]
fn offset_fetch_while_loading_and_elsewhere() {
    let mut c = GroupCoordinator::new(GroupConfig::default(), 3);
    let req = OffsetFetchRequest {
        group_id: "g".into(),
        topics: None,
        require_stable: false,
        member_id: None,
        member_epoch: -1,
    };
    assert_eq!(
        c.handle_offset_fetch(&req).error_code,
        error_code::NOT_COORDINATOR
    );
    c.load_partition_start(c.partition_for("g"));
    assert_eq!(
        c.handle_offset_fetch(&req).error_code,
        error_code::COORDINATOR_LOAD_IN_PROGRESS
    );
}
