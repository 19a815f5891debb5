//! TxnOffsetCommit (KIP-98, KIP-447): a transaction's offsets stay pending, apart from the
//! group's, until its marker lands — a commit makes them visible, an abort drops them.

use super::harness::*;
use crate::*;

fn txn_commit(
    h: &mut H,
    producer_id: i64,
    group: &str,
    generation: i32,
    member: &str,
    offset: i64,
) -> (u64, Vec<Output>) {
    let r = h.responder();
    let out = h.c.handle_txn_offset_commit(
        TxnOffsetCommitRequest {
            producer_id,
            producer_epoch: 3,
            commit: OffsetCommitRequest {
                group_id: group.to_owned(),
                generation_id_or_member_epoch: generation,
                member_id: member.to_owned(),
                group_instance_id: None,
                retention_time_ms: -1,
                topics: vec![OffsetCommitRequestTopic {
                    name: "t".to_owned(),
                    partitions: vec![OffsetCommitRequestPartition {
                        partition_index: 0,
                        committed_offset: offset,
                        committed_leader_epoch: 1,
                        committed_metadata: None,
                    }],
                }],
                api_version: 3,
            },
        },
        h.now,
        r,
    );
    (r, out)
}

fn fetch_stable(h: &H, group: &str) -> (i64, i16) {
    let resp = h.c.handle_offset_fetch(&OffsetFetchRequest {
        group_id: group.to_owned(),
        topics: Some(vec![OffsetFetchRequestTopic {
            name: "t".to_owned(),
            partition_indexes: vec![0],
        }]),
        require_stable: true,
        member_id: None,
        member_epoch: -1,
    });
    let p = &resp.topics[0].partitions[0];
    (p.committed_offset, p.error_code)
}

#[test]
fn transactional_offsets_are_written_in_the_producers_batch_and_pending_until_commit() {
    let mut h = H::new();
    let p = h.c.partition_for("g");
    let (r, out) = txn_commit(&mut h, 77, "g", -1, "", 42);
    let [Output::PersistTransactional {
        producer_id,
        producer_epoch,
        records,
        ..
    }] = &out[..]
    else {
        panic!("{out:?}")
    };
    assert_eq!((*producer_id, *producer_epoch), (77, 3));
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].0, p);
    let answered = h.absorb(out);
    assert_eq!(answered.len(), 1);
    assert_eq!(answered[0].responder, r);
    // Replicated, answered, but not visible: the transaction is open.
    assert_eq!(h.fetch("g", "t", 0).0, -1);
    assert_eq!(
        fetch_stable(&h, "g"),
        (-1, error_code::UNSTABLE_OFFSET_COMMIT)
    );
    assert_eq!(h.c.pending_transactional_offsets(p), 1);
    // Another producer's marker changes nothing.
    assert_eq!(h.c.complete_transaction(p, 78, true), 0);
    assert_eq!(h.fetch("g", "t", 0).0, -1);
    assert_eq!(h.c.complete_transaction(p, 77, true), 1);
    assert_eq!(h.fetch("g", "t", 0).0, 42);
    assert_eq!(fetch_stable(&h, "g"), (42, error_code::NONE));
    assert_eq!(h.c.pending_transactional_offsets(p), 0);
}

#[test]
fn an_aborted_transactions_offsets_are_never_visible() {
    let mut h = H::new();
    let (ids, gen) = h.stable_group("g", 1);
    let p = h.c.partition_for("g");
    assert_eq!(h.commit("g", &ids[0], gen, "t", 0, 10), error_code::NONE);
    let (_, out) = txn_commit(&mut h, 5, "g", gen, &ids[0], 20);
    h.absorb(out);
    assert_eq!(h.fetch("g", "t", 0).0, 10);
    assert_eq!(h.c.complete_transaction(p, 5, false), 0);
    assert_eq!(h.fetch("g", "t", 0).0, 10);
    assert_eq!(fetch_stable(&h, "g"), (10, error_code::NONE));
    // A marker that comes again finds nothing.
    assert_eq!(h.c.complete_transaction(p, 5, true), 0);
    assert_eq!(h.fetch("g", "t", 0).0, 10);
}

#[test]
fn a_txn_commit_with_a_stale_generation_is_refused_and_writes_nothing() {
    let mut h = H::new();
    let (ids, gen) = h.stable_group("g", 1);
    let (_, out) = txn_commit(&mut h, 5, "g", gen + 1, &ids[0], 20);
    let [Output::Respond(Respond {
        response: Response::OffsetCommit(c),
        ..
    })] = &out[..]
    else {
        panic!("{out:?}")
    };
    assert_eq!(
        c.topics[0].partitions[0].error_code,
        error_code::ILLEGAL_GENERATION
    );
    assert_eq!(h.c.pending_transactional_offsets(h.c.partition_for("g")), 0);
}

#[test]
fn replay_keeps_a_transaction_pending_until_its_marker_and_unload_forgets_it() {
    let mut h = H::new();
    let p = h.c.partition_for("g");
    let record = |offset| {
        Record::OffsetCommit(OffsetCommitRecord {
            key: OffsetCommitKey {
                group: "g".into(),
                topic: "t".into(),
                partition: 0,
            },
            value: Some(OffsetCommitValue {
                offset,
                leader_epoch: -1,
                metadata: String::new(),
                commit_timestamp: 1,
                expire_timestamp: -1,
            }),
        })
    };
    h.c.load_partition_start(p);
    h.c.replay(p, &record(5)).unwrap();
    h.c.replay_transactional(p, 9, &record(7)).unwrap();
    h.c.replay_transactional(p, 10, &record(8)).unwrap();
    h.c.replay_control(p, 9, true);
    h.c.load_partition_done(p, 0);
    // Producer 9 committed; producer 10's transaction is still open.
    assert_eq!(h.fetch("g", "t", 0).0, 7);
    assert_eq!(h.c.pending_transactional_offsets(p), 1);
    h.c.unload_partition(p);
    assert_eq!(h.c.pending_transactional_offsets(p), 0);
}
