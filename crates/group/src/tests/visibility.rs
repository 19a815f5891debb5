//! Offsets become visible only once replicated (DESIGN.md's invariant 9): the harness
//! holds writes above the high watermark and moves it by hand (`commit_up_to`).

use proptest::prelude::*;

use super::harness::*;
use crate::*;

/// The bug of issue #14: a coordinator cut off from its followers appended commits it
/// could not replicate and served them to OffsetFetch; the new coordinator, which never
/// had them, served older offsets, so the committed offset went backwards.
#[test]
fn offset_fetch_serves_only_replicated_commits() {
    let mut h = H::new();
    let (ids, gen) = h.stable_group("g", 2);
    let p = h.c.partition_for("g");
    assert_eq!(h.commit("g", &ids[0], gen, "t", 0, 10), error_code::NONE);
    h.hold_commits = true;
    let r = h.commit_unanswered("g", &ids[0], gen, "t", 0, 20);
    assert_eq!(h.commit_answer(r), None, "acknowledged before replicated");
    assert_eq!(h.fetch("g", "t", 0).0, 10, "served before replicated");
    assert_eq!(h.c.uncommitted_offset_records(p), 1);
    // The high watermark short of the write's end: still pending.
    let end = h.end_of(p);
    h.commit_up_to(p, end - 1);
    assert_eq!(h.fetch("g", "t", 0).0, 10);
    assert_eq!(h.commit_answer(r), None);
    h.commit_up_to(p, end);
    assert_eq!(h.fetch("g", "t", 0).0, 20);
    assert_eq!(h.commit_answer(r), Some(error_code::NONE));
    assert_eq!(h.c.uncommitted_offset_records(p), 0);
}

/// The same cut-off leader loses the partition: what it never replicated is truncated by
/// the next leader, which replays only the replicated prefix. Neither coordinator ever
/// served the lost commit, so nothing goes backwards.
#[test]
fn a_commit_never_replicated_is_never_served_here_or_after_failover() {
    let mut h = H::new();
    let (ids, gen) = h.stable_group("g", 2);
    let p = h.c.partition_for("g");
    assert_eq!(h.commit("g", &ids[1], gen, "t", 3, 100), error_code::NONE);
    let hw = h.end_of(p);
    h.hold_commits = true;
    for offset in [200, 300, 400] {
        h.commit_unanswered("g", &ids[1], gen, "t", 3, offset);
        assert_eq!(h.fetch("g", "t", 3).0, 100);
    }
    // The group's own next decisions see the newest state (Kafka's writes read the
    // uncommitted timeline).
    assert_eq!(h.c.uncommitted_offset_records(p), 3);
    // Leadership moves: this node unloads, the new leader replays the log up to the
    // high watermark (its copy ends there; the rest is truncated on this node too).
    let out = h.c.unload_partition(p);
    h.absorb(out);
    assert_eq!(h.c.uncommitted_offset_records(p), 0);
    let mut next = GroupCoordinator::new(h.c.config().clone(), 9);
    next.load_partition_start(p);
    for ((rp, record), offset) in h.log.iter().zip(&h.log_offsets) {
        if *rp == p && *offset < hw {
            next.replay(p, record).unwrap();
        }
    }
    next.load_partition_done(p, h.now);
    let fetch = |c: &GroupCoordinator| {
        c.handle_offset_fetch(&OffsetFetchRequest {
            group_id: "g".into(),
            topics: None,
            require_stable: false,
            member_id: None,
            member_epoch: -1,
        })
        .topics[0]
            .partitions[0]
            .committed_offset
    };
    assert_eq!(fetch(&next), 100);
}

/// A new leader's tail above its high watermark was written by the old leader and may
/// not be on every in-sync replica yet: it is replayed into the groups at once, and
/// OffsetFetch waits (COORDINATOR_LOAD_IN_PROGRESS) until the high watermark passes it.
/// Found by the chaos suite (seed 41330180): a commit acknowledged just before its
/// coordinator was cut off was served as the older offset by the next one.
#[test]
fn replayed_tail_above_the_high_watermark_waits_for_it() {
    let mut h = H::new();
    let (ids, gen) = h.stable_group("g", 1);
    let p = h.c.partition_for("g");
    for offset in [5, 6, 7] {
        assert_eq!(
            h.commit("g", &ids[0], gen, "t", 0, offset),
            error_code::NONE
        );
    }
    let end = h.end_of(p);
    let hw = end - 2;
    let mut next = GroupCoordinator::new(h.c.config().clone(), 9);
    next.load_partition_start(p);
    for ((rp, record), offset) in h.log.iter().zip(&h.log_offsets) {
        if *rp != p {
            continue;
        }
        if *offset < hw {
            next.replay(p, record).unwrap();
        } else {
            next.replay_uncommitted(p, *offset, record).unwrap();
        }
    }
    next.load_partition_done(p, h.now);
    let mut h2 = H::new();
    h2.c = next;
    // Until the mark passes the whole tail the new leader cannot tell which of it the
    // old one acknowledged: neither 5 (an acknowledged 7 would look lost) nor 7 (it
    // might not survive) is served, only a retriable error.
    let fetch_error = |c: &GroupCoordinator| {
        c.handle_offset_fetch(&OffsetFetchRequest {
            group_id: "g".into(),
            topics: None,
            require_stable: false,
            member_id: None,
            member_epoch: -1,
        })
        .error_code
    };
    assert_eq!(fetch_error(&h2.c), error_code::COORDINATOR_LOAD_IN_PROGRESS);
    assert_eq!(
        h2.c.uncommitted_partitions(),
        vec![p],
        "watched until settled"
    );
    h2.c.commit_up_to(p, hw + 1);
    assert_eq!(fetch_error(&h2.c), error_code::COORDINATOR_LOAD_IN_PROGRESS);
    assert_eq!(
        h2.c.committed_offsets().values().next().map(|v| v.offset),
        Some(6)
    );
    h2.c.commit_up_to(p, end);
    assert_eq!(fetch_error(&h2.c), error_code::NONE);
    assert!(h2.c.uncommitted_partitions().is_empty());
    assert_eq!(h2.fetch("g", "t", 0).0, 7);
    // The group was restored from the whole log: its member can still commit.
    assert_eq!(h2.commit("g", &ids[0], gen, "t", 0, 8), error_code::NONE);
    assert_eq!(h2.fetch("g", "t", 0).0, 8);
}

/// Deletions are writes too: an OffsetDelete's tombstone and offset expiry hide an
/// offset only once replicated.
#[test]
fn tombstones_hide_offsets_only_once_replicated() {
    let mut h = H::new();
    assert_eq!(h.commit("s", "", -1, "t", 0, 10), error_code::NONE);
    let p = h.c.partition_for("s");
    h.hold_commits = true;
    let r = h.responder();
    let out = h.c.handle_offset_delete(
        OffsetDeleteRequest {
            group_id: "s".into(),
            topics: vec![OffsetDeleteRequestTopic {
                name: "t".into(),
                partitions: vec![0],
            }],
        },
        h.now,
        r,
    );
    h.absorb(out);
    assert_eq!(h.fetch("s", "t", 0).0, 10, "deleted before replicated");
    let end = h.end_of(p);
    h.commit_up_to(p, end);
    assert_eq!(h.fetch("s", "t", 0).0, -1);
    assert!(h.sent.iter().any(|s| s.responder == r));
}

/// Writes of two partitions commit independently, each in its own log order.
#[test]
fn partitions_commit_independently() {
    let mut h = H::new();
    let (a, b) = ("group-a", "group-b");
    let (pa, pb) = (h.c.partition_for(a), h.c.partition_for(b));
    assert_ne!(pa, pb);
    h.hold_commits = true;
    h.commit_unanswered(a, "", -1, "t", 0, 1);
    h.commit_unanswered(b, "", -1, "t", 0, 2);
    let end_b = h.end_of(pb);
    h.commit_up_to(pb, end_b);
    assert_eq!(h.fetch(a, "t", 0).0, -1);
    assert_eq!(h.fetch(b, "t", 0).0, 2);
    let end_a = h.end_of(pa);
    h.commit_up_to(pa, end_a);
    assert_eq!(h.fetch(a, "t", 0).0, 1);
}

proptest! {
    /// Commits of increasing offsets with the high watermark moving at random: what
    /// OffsetFetch serves never goes backwards, is never an offset whose write is above
    /// the high watermark, and is the newest one below it.
    #[test]
    fn served_offsets_follow_the_high_watermark(steps in prop::collection::vec(0u8..4, 1..60)) {
        let mut h = H::new();
        let (ids, gen) = h.stable_group("g", 1);
        let p = h.c.partition_for("g");
        h.hold_commits = true;
        // (end offset of its write, committed offset), in log order.
        let mut commits: Vec<(i64, i64)> = Vec::new();
        let mut next = 1;
        let mut last_served = -1;
        for step in steps {
            if step < 2 {
                h.commit_unanswered("g", &ids[0], gen, "t", 0, next);
                commits.push((h.end_of(p), next));
                next += 1;
            } else {
                let hw = h.hw.get(&p).copied().unwrap_or(0);
                let end = h.end_of(p);
                let to = if step == 2 { hw + (end - hw) / 2 } else { end };
                h.commit_up_to(p, to);
            }
            let hw = h.hw.get(&p).copied().unwrap_or(0);
            let served = h.fetch("g", "t", 0).0;
            let expected = commits
                .iter()
                .rev()
                .find(|(end, _)| *end <= hw)
                .map(|(_, o)| *o)
                .unwrap_or(-1);
            prop_assert_eq!(served, expected);
            prop_assert!(served >= last_served, "went backwards: {} after {}", served, last_served);
            last_served = served;
        }
    }
}
