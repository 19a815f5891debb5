//! The coordinator with an injected clock: every transition, fencing, timeouts, pending
//! writes held and failed, replay, and the record format.

use proptest::prelude::*;
use rill_protocol::ErrorCode;

use crate::*;

const T: &str = "tx-1";
const TIMEOUT_MS: i32 = 60_000;

/// A coordinator serving every partition, and what it has persisted (in order), as the
/// broker's log would hold it.
struct Harness {
    c: TransactionCoordinator,
    log: Vec<TransactionLogRecord>,
    /// Writes persisted but not yet reported replicated.
    held: Vec<WriteId>,
    next_responder: ResponderId,
    /// The clock of the last call, at which held writes are reported replicated.
    now_ms: i64,
}

impl Harness {
    fn new() -> Harness {
        let mut c = TransactionCoordinator::new(TransactionConfig::default());
        for p in 0..c.config().transaction_state_log_num_partitions {
            assert!(c.load(p, 7, Vec::new()).is_empty());
        }
        Harness {
            c,
            log: Vec::new(),
            held: Vec::new(),
            next_responder: 0,
            now_ms: 0,
        }
    }

    /// Takes the persist outputs into the log (held) and returns the rest.
    fn absorb(&mut self, out: Vec<Output>) -> Vec<Output> {
        let mut rest = Vec::new();
        for o in out {
            match o {
                Output::Persist {
                    write,
                    records,
                    partition,
                } => {
                    for r in &records {
                        assert_eq!(self.c.partition_for(&r.transactional_id), partition);
                    }
                    self.log.extend(records);
                    self.held.push(write);
                }
                o => rest.push(o),
            }
        }
        rest
    }

    /// Reports every held write replicated, and those they lead to.
    fn replicate(&mut self) -> Vec<Output> {
        let mut out = Vec::new();
        while !self.held.is_empty() {
            for w in std::mem::take(&mut self.held) {
                let o = self.c.write_completed(w, self.now_ms);
                out.extend(self.absorb(o));
            }
        }
        out
    }

    /// Sends a request and replicates every write; returns its responder and every
    /// output but the writes (answers, markers), for a request that may be held.
    fn send(&mut self, request: Request, now_ms: i64) -> (ResponderId, Vec<Output>) {
        self.next_responder += 1;
        let me = self.next_responder;
        self.now_ms = now_ms;
        let out = self.c.handle(me, request, now_ms);
        let mut rest = self.absorb(out);
        rest.extend(self.replicate());
        (me, rest)
    }

    /// Sends a request; returns its answer once every write is replicated, with the
    /// other outputs (markers).
    fn call(&mut self, request: Request, now_ms: i64) -> (Response, Vec<Output>) {
        let (me, rest) = self.send(request, now_ms);
        let mut response = None;
        let mut others = Vec::new();
        for o in rest {
            match o {
                Output::Respond {
                    responder,
                    response: r,
                } if responder == me => response = Some(r),
                o => others.push(o),
            }
        }
        (response.expect("no answer"), others)
    }

    fn init(&mut self, pid: i64, epoch: i16, new_pid: i64, now_ms: i64) -> (ErrorCode, i64, i16) {
        match self.call(init_req(pid, epoch, new_pid), now_ms).0 {
            Response::InitProducerId {
                error,
                producer_id,
                producer_epoch,
            } => (error, producer_id, producer_epoch),
            r => panic!("{r:?}"),
        }
    }

    fn add(&mut self, pid: i64, epoch: i16, parts: &[(&str, i32)], now_ms: i64) -> Vec<ErrorCode> {
        match self.call(add_req(pid, epoch, parts, false), now_ms).0 {
            Response::AddPartitionsToTxn { results } => {
                results.into_iter().map(|(_, e)| e).collect()
            }
            r => panic!("{r:?}"),
        }
    }

    fn end(&mut self, pid: i64, epoch: i16, commit: bool, now_ms: i64) -> (ErrorCode, Vec<Output>) {
        let (error, _, others) = self.end_v(0, (pid, epoch), commit, -1, now_ms);
        (error, others)
    }

    /// EndTxn at transaction version `tv`: the error, the producer id and epoch the
    /// answer gives, and the other outputs.
    fn end_v(
        &mut self,
        tv: i16,
        (pid, epoch): (i64, i16),
        commit: bool,
        new_pid: i64,
        now_ms: i64,
    ) -> (ErrorCode, (i64, i16), Vec<Output>) {
        let (r, others) = self.call(
            Request::EndTxn {
                transactional_id: T.into(),
                producer_id: pid,
                producer_epoch: epoch,
                commit,
                client_transaction_version: tv,
                new_producer_id: new_pid,
            },
            now_ms,
        );
        match r {
            Response::EndTxn {
                error,
                producer_id,
                producer_epoch,
            } => (error, (producer_id, producer_epoch), others),
            r => panic!("{r:?}"),
        }
    }

    /// A partition leader's add for a transaction version 2 producer.
    fn add_v2(
        &mut self,
        pid: i64,
        epoch: i16,
        parts: &[(&str, i32)],
        now_ms: i64,
    ) -> Vec<ErrorCode> {
        let mut request = add_req(pid, epoch, parts, false);
        if let Request::AddPartitionsToTxn {
            client_transaction_version,
            ..
        } = &mut request
        {
            *client_transaction_version = 2;
        }
        match self.call(request, now_ms).0 {
            Response::AddPartitionsToTxn { results } => {
                results.into_iter().map(|(_, e)| e).collect()
            }
            r => panic!("{r:?}"),
        }
    }

    fn state(&self) -> TransactionState {
        self.c.describe(T).unwrap().state
    }

    /// Reports the markers of `out` written.
    fn write_markers(&mut self, out: &[Output], now_ms: i64) {
        let rest = self.markers_done(out, now_ms);
        assert!(rest.is_empty(), "{rest:?}");
    }

    /// Reports the markers of `out` written and replicates what follows; returns the
    /// answers that come out (held adds decided).
    fn markers_done(&mut self, out: &[Output], now_ms: i64) -> Vec<Output> {
        self.now_ms = now_ms;
        let mut answers = Vec::new();
        for o in out {
            if let Output::WriteMarkers {
                transactional_id,
                producer_id,
                producer_epoch,
                ..
            } = o
            {
                let done =
                    self.c
                        .markers_written(transactional_id, *producer_id, *producer_epoch, now_ms);
                let rest = self.absorb(done);
                assert!(rest.is_empty(), "{rest:?}");
                answers.extend(self.replicate());
            }
        }
        answers
    }
}

/// The answer to `responder` among `out`, if there is one.
fn answer_to(out: &[Output], responder: ResponderId) -> Option<Response> {
    out.iter().find_map(|o| match o {
        Output::Respond {
            responder: r,
            response,
        } if *r == responder => Some(response.clone()),
        _ => None,
    })
}

fn init_req(pid: i64, epoch: i16, new_pid: i64) -> Request {
    Request::InitProducerId {
        transactional_id: T.into(),
        transaction_timeout_ms: TIMEOUT_MS,
        producer_id: pid,
        producer_epoch: epoch,
        new_producer_id: new_pid,
    }
}

fn add_req(pid: i64, epoch: i16, parts: &[(&str, i32)], verify_only: bool) -> Request {
    Request::AddPartitionsToTxn {
        transactional_id: T.into(),
        producer_id: pid,
        producer_epoch: epoch,
        partitions: parts.iter().map(|(t, p)| (t.to_string(), *p)).collect(),
        verify_only,
        client_transaction_version: 0,
    }
}

fn markers(out: &[Output]) -> Vec<(bool, i16, Vec<TransactionPartition>)> {
    out.iter()
        .filter_map(|o| match o {
            Output::WriteMarkers {
                commit,
                producer_epoch,
                partitions,
                coordinator_epoch,
                ..
            } => {
                assert_eq!(*coordinator_epoch, 7);
                Some((*commit, *producer_epoch, partitions.clone()))
            }
            _ => None,
        })
        .collect()
}

#[test]
fn a_new_id_gets_the_allocated_producer_id_only_once_its_record_is_replicated() {
    let mut h = Harness::new();
    let out = h.c.handle(1, init_req(-1, -1, 1000), 0);
    let rest = h.absorb(out);
    assert!(rest.is_empty(), "answered before the write: {rest:?}");
    assert_eq!(h.c.describe(T), Err(ErrorCode::TRANSACTIONAL_ID_NOT_FOUND));
    // Another request meanwhile waits for it.
    let out = h.c.handle(2, init_req(-1, -1, 1001), 0);
    assert!(matches!(
        &out[..],
        [Output::Respond {
            response: Response::InitProducerId {
                error: ErrorCode::CONCURRENT_TRANSACTIONS,
                ..
            },
            ..
        }]
    ));
    let out = h.replicate();
    assert_eq!(
        out,
        vec![Output::Respond {
            responder: 1,
            response: Response::InitProducerId {
                error: ErrorCode::NONE,
                producer_id: 1000,
                producer_epoch: 0
            }
        }]
    );
    assert_eq!(h.state(), TransactionState::Empty);
}

#[test]
fn commit_and_abort_go_through_prepare_markers_and_complete() {
    let mut h = Harness::new();
    assert_eq!(h.init(-1, -1, 1000, 0), (ErrorCode::NONE, 1000, 0));
    assert_eq!(
        h.add(1000, 0, &[("a", 0), ("b", 1)], 10),
        vec![ErrorCode::NONE; 2]
    );
    assert_eq!(h.state(), TransactionState::Ongoing);
    assert_eq!(h.c.describe(T).unwrap().txn_start_timestamp_ms, 10);
    // Adding what is there already writes nothing.
    let before = h.log.len();
    assert_eq!(h.add(1000, 0, &[("a", 0)], 20), vec![ErrorCode::NONE]);
    assert_eq!(h.log.len(), before);
    let (e, out) = h.end(1000, 0, true, 30);
    assert_eq!(e, ErrorCode::NONE);
    assert_eq!(h.state(), TransactionState::PrepareCommit);
    assert_eq!(
        markers(&out),
        vec![(true, 0, vec![("a".into(), 0), ("b".into(), 1)])]
    );
    // A retry while the markers are out waits; a request of the next transaction is held
    // until the commit completes, or for 20 ms, then waits too.
    assert_eq!(
        h.end(1000, 0, true, 31).0,
        ErrorCode::CONCURRENT_TRANSACTIONS
    );
    let (held, out_now) = h.send(add_req(1000, 0, &[("a", 0)], false), 31);
    assert!(out_now.is_empty(), "{out_now:?}");
    assert_eq!(h.c.next_deadline(), Some(51));
    assert!(h.c.expire_held(50).is_empty());
    assert_eq!(
        answer_to(&h.c.expire_held(51), held),
        Some(Response::AddPartitionsToTxn {
            results: vec![(("a".into(), 0), ErrorCode::CONCURRENT_TRANSACTIONS)]
        })
    );
    assert_eq!(h.c.next_deadline(), None);
    assert_eq!(h.end(1000, 0, false, 31).0, ErrorCode::INVALID_TXN_STATE);
    h.write_markers(&out, 40);
    assert_eq!(h.state(), TransactionState::CompleteCommit);
    assert!(h.c.describe(T).unwrap().partitions.is_empty());
    assert_eq!(
        h.end(1000, 0, true, 41).0,
        ErrorCode::NONE,
        "a retried commit"
    );
    assert_eq!(h.end(1000, 0, false, 41).0, ErrorCode::INVALID_TXN_STATE);

    // The next transaction, aborted.
    assert_eq!(h.add(1000, 0, &[("c", 2)], 50), vec![ErrorCode::NONE]);
    assert_eq!(h.c.describe(T).unwrap().txn_start_timestamp_ms, 50);
    let (e, out) = h.end(1000, 0, false, 60);
    assert_eq!(e, ErrorCode::NONE);
    assert_eq!(markers(&out), vec![(false, 0, vec![("c".into(), 2)])]);
    h.write_markers(&out, 70);
    assert_eq!(h.state(), TransactionState::CompleteAbort);
    // EndTxn with nothing running.
    assert_eq!(h.init(1000, 0, -1, 80), (ErrorCode::NONE, 1000, 1));
    assert_eq!(h.end(1000, 1, true, 90).0, ErrorCode::INVALID_TXN_STATE);
}

#[test]
fn add_offsets_adds_the_groups_offsets_partition() {
    let mut h = Harness::new();
    h.init(-1, -1, 5, 0);
    let (r, _) = h.call(
        Request::AddOffsetsToTxn {
            transactional_id: T.into(),
            producer_id: 5,
            producer_epoch: 0,
            offsets_partition: 17,
        },
        1,
    );
    assert_eq!(
        r,
        Response::AddOffsetsToTxn {
            error: ErrorCode::NONE
        }
    );
    let m = h.c.describe(T).unwrap();
    assert_eq!(m.state, TransactionState::Ongoing);
    assert!(m
        .partitions
        .contains(&(CONSUMER_OFFSETS_TOPIC.to_owned(), 17)));
}

#[test]
fn a_second_producer_fences_the_first_and_aborts_its_transaction() {
    let mut h = Harness::new();
    assert_eq!(h.init(-1, -1, 1000, 0), (ErrorCode::NONE, 1000, 0));
    h.add(1000, 0, &[("a", 0)], 1);
    // The new producer (same id, no producer id of its own) arrives mid-transaction.
    let (r, out) = h.call(init_req(-1, -1, 2000), 2);
    assert_eq!(
        r,
        Response::InitProducerId {
            error: ErrorCode::CONCURRENT_TRANSACTIONS,
            producer_id: -1,
            producer_epoch: -1
        }
    );
    assert_eq!(h.state(), TransactionState::PrepareAbort);
    assert_eq!(
        markers(&out),
        vec![(false, 1, vec![("a".into(), 0)])],
        "aborted under the fencing epoch"
    );
    // The old producer is fenced everywhere.
    assert_eq!(
        h.add(1000, 0, &[("b", 0)], 3),
        vec![ErrorCode::PRODUCER_FENCED]
    );
    assert_eq!(h.end(1000, 0, true, 3).0, ErrorCode::PRODUCER_FENCED);
    // Its retry waits for the abort, then gets the next epoch.
    assert_eq!(
        h.init(-1, -1, 2001, 4).0,
        ErrorCode::CONCURRENT_TRANSACTIONS
    );
    h.write_markers(&out, 5);
    assert_eq!(h.state(), TransactionState::CompleteAbort);
    assert_eq!(h.init(-1, -1, 2002, 6), (ErrorCode::NONE, 1000, 2));
    assert_eq!(h.end(1000, 1, true, 7).0, ErrorCode::PRODUCER_FENCED);
    // A producer id that is not this id's.
    assert_eq!(
        h.add(1234, 2, &[("a", 0)], 8),
        vec![ErrorCode::INVALID_PRODUCER_ID_MAPPING]
    );
}

#[test]
fn kip_360_a_producer_bumps_its_own_epoch_and_a_lost_answer_is_repeated() {
    let mut h = Harness::new();
    h.init(-1, -1, 1000, 0);
    assert_eq!(h.init(1000, 0, -1, 1), (ErrorCode::NONE, 1000, 1));
    let log_len = h.log.len();
    // The same request again (its answer was lost): the same answer, nothing written.
    assert_eq!(h.init(1000, 0, -1, 2), (ErrorCode::NONE, 1000, 1));
    assert_eq!(h.log.len(), log_len);
    // An older epoch, or another producer id, is fenced.
    assert_eq!(h.init(1000, 5, -1, 3).0, ErrorCode::PRODUCER_FENCED);
    assert_eq!(h.init(999, 1, -1, 3).0, ErrorCode::PRODUCER_FENCED);
}

#[test]
fn an_exhausted_epoch_takes_a_new_producer_id() {
    let mut h = Harness::new();
    h.init(-1, -1, 1000, 0);
    assert_eq!(
        h.init(1000, 0, 5000, 1),
        (ErrorCode::NONE, 1000, 1),
        "a bump keeps the id"
    );
    // The last usable epoch, as a replayed record holds it: the next bump rotates.
    let mut m = h.c.describe(T).unwrap().clone();
    m.producer_epoch = i16::MAX - 1;
    let p = h.c.partition_for(T);
    h.c.load(
        p,
        7,
        vec![TransactionLogRecord {
            transactional_id: T.into(),
            value: Some(m),
        }],
    );
    assert_eq!(h.init(-1, -1, 5000, 2), (ErrorCode::NONE, 5000, 0));
    assert_eq!(h.c.describe(T).unwrap().previous_producer_id, 1000);
}

#[test]
fn verify_only_answers_from_the_state_and_writes_nothing() {
    let mut h = Harness::new();
    h.init(-1, -1, 1000, 0);
    h.add(1000, 0, &[("a", 0)], 1);
    let before = h.log.len();
    let (r, _) = h.call(add_req(1000, 0, &[("a", 0), ("b", 0)], true), 2);
    assert_eq!(
        r,
        Response::AddPartitionsToTxn {
            results: vec![
                (("a".into(), 0), ErrorCode::NONE),
                // Kafka 4's answer; a v4 request gets INVALID_TXN_STATE (the handler).
                (("b".into(), 0), ErrorCode::TRANSACTION_ABORTABLE)
            ]
        }
    );
    assert_eq!(h.log.len(), before);
    let (r, _) = h.call(add_req(1000, 9, &[("a", 0)], true), 2);
    assert_eq!(
        r,
        Response::AddPartitionsToTxn {
            results: vec![(("a".into(), 0), ErrorCode::PRODUCER_FENCED)]
        }
    );
}

#[test]
fn verify_only_while_the_markers_are_written_and_after_the_transaction_ended() {
    let mut h = Harness::new();
    h.init(-1, -1, 1000, 0);
    h.add(1000, 0, &[("a", 0)], 1);
    let verify = |h: &mut Harness, now| h.call(add_req(1000, 0, &[("a", 0)], true), now).0;
    let answer = |e| Response::AddPartitionsToTxn {
        results: vec![(("a".into(), 0), e)],
    };
    let (error, out) = h.end(1000, 0, false, 2);
    assert_eq!(error, ErrorCode::NONE);
    assert_eq!(h.state(), TransactionState::PrepareAbort);
    // The transaction is ending: the leader's check is held until it has ended, and
    // then finds the partition no longer in a transaction.
    let (held, now) = h.send(add_req(1000, 0, &[("a", 0)], true), 3);
    assert!(now.is_empty(), "{now:?}");
    let answers = h.markers_done(&out, 4);
    assert_eq!(h.state(), TransactionState::CompleteAbort);
    assert_eq!(
        answer_to(&answers, held),
        Some(answer(ErrorCode::TRANSACTION_ABORTABLE))
    );
    // A late batch of the aborted transaction: no longer part of any.
    assert_eq!(verify(&mut h, 5), answer(ErrorCode::TRANSACTION_ABORTABLE));
    // An id the coordinator does not know.
    let (r, _) = h.call(
        Request::AddPartitionsToTxn {
            transactional_id: "nobody".into(),
            producer_id: 1000,
            producer_epoch: 0,
            partitions: vec![("a".into(), 0)],
            verify_only: true,
            client_transaction_version: 0,
        },
        6,
    );
    assert_eq!(r, answer(ErrorCode::INVALID_PRODUCER_ID_MAPPING));
}

#[test]
fn a_transaction_past_its_timeout_is_aborted_and_its_producer_fenced() {
    let mut h = Harness::new();
    h.init(-1, -1, 1000, 0);
    h.add(1000, 0, &[("a", 0)], 100);
    assert!(h.c.tick(100 + i64::from(TIMEOUT_MS)).is_empty(), "not yet");
    let out = h.c.tick(101 + i64::from(TIMEOUT_MS));
    let rest = h.absorb(out);
    assert!(rest.is_empty());
    assert_eq!(
        h.state(),
        TransactionState::Ongoing,
        "visible only once replicated"
    );
    let out = h.replicate();
    assert_eq!(h.state(), TransactionState::PrepareAbort);
    assert_eq!(markers(&out), vec![(false, 1, vec![("a".into(), 0)])]);
    assert_eq!(h.end(1000, 0, true, 200_000).0, ErrorCode::PRODUCER_FENCED);
    h.write_markers(&out, 200_001);
    assert_eq!(h.state(), TransactionState::CompleteAbort);
}

#[test]
fn an_idle_id_expires_and_a_busy_one_does_not() {
    let mut h = Harness::new();
    let expiry = h.c.config().transactional_id_expiration_ms;
    h.init(-1, -1, 1000, 0);
    assert!(h.c.tick(expiry).is_empty());
    let out = h.c.tick(expiry + 1);
    h.absorb(out);
    assert_eq!(h.log.last().unwrap().value, None, "a tombstone");
    h.replicate();
    assert_eq!(h.c.describe(T), Err(ErrorCode::TRANSACTIONAL_ID_NOT_FOUND));
    // Ongoing, the id never expires (its timeout aborts it instead).
    h.init(-1, -1, 2000, expiry + 2);
    h.add(2000, 0, &[("a", 0)], expiry + 3);
    let mut c2 = h.c.tick(expiry * 2 + 10);
    let persisted = h.absorb(std::mem::take(&mut c2));
    assert!(persisted.is_empty());
    assert!(
        h.log.last().unwrap().value.is_some(),
        "aborted, not removed"
    );
}

#[test]
fn a_failed_write_changes_nothing_and_answers_the_error() {
    let mut h = Harness::new();
    h.init(-1, -1, 1000, 0);
    let out = h.c.handle(9, add_req(1000, 0, &[("a", 0)], false), 1);
    let Output::Persist { write, .. } = out[0] else {
        panic!("{out:?}")
    };
    let out = h.c.write_failed(write, ErrorCode::NOT_ENOUGH_REPLICAS);
    assert_eq!(
        out,
        vec![Output::Respond {
            responder: 9,
            response: Response::AddPartitionsToTxn {
                results: vec![(("a".into(), 0), ErrorCode::NOT_ENOUGH_REPLICAS)]
            }
        }]
    );
    assert_eq!(h.state(), TransactionState::Empty);
    assert_eq!(
        h.add(1000, 0, &[("a", 0)], 2),
        vec![ErrorCode::NONE],
        "not blocked"
    );
}

#[test]
fn requests_outside_the_served_partitions_and_bad_timeouts_are_refused() {
    let mut c = TransactionCoordinator::new(TransactionConfig::default());
    let p = c.partition_for(T);
    let error = |out: Vec<Output>| match &out[..] {
        [Output::Respond {
            response: Response::InitProducerId { error, .. },
            ..
        }] => *error,
        o => panic!("{o:?}"),
    };
    assert_eq!(
        error(c.handle(1, init_req(-1, -1, 1), 0)),
        ErrorCode::NOT_COORDINATOR
    );
    c.begin_load(p);
    assert_eq!(
        error(c.handle(1, init_req(-1, -1, 1), 0)),
        ErrorCode::COORDINATOR_LOAD_IN_PROGRESS
    );
    c.load(p, 1, Vec::new());
    let mut bad = init_req(-1, -1, 1);
    if let Request::InitProducerId {
        transaction_timeout_ms,
        ..
    } = &mut bad
    {
        *transaction_timeout_ms = c.config().transaction_max_timeout_ms + 1;
    }
    assert_eq!(
        error(c.handle(1, bad, 0)),
        ErrorCode::INVALID_TRANSACTION_TIMEOUT
    );
    assert_eq!(c.describe(T), Err(ErrorCode::TRANSACTIONAL_ID_NOT_FOUND));
    // Unloading answers what waits on a write, and stops serving.
    let out = c.handle(2, init_req(-1, -1, 1), 0);
    assert!(matches!(out[0], Output::Persist { .. }));
    assert_eq!(error(c.unload(p)), ErrorCode::NOT_COORDINATOR);
    assert_eq!(c.describe(T), Err(ErrorCode::NOT_COORDINATOR));
}

#[test]
fn a_new_coordinator_replays_the_log_and_finishes_a_commit_in_flight() {
    let mut h = Harness::new();
    h.init(-1, -1, 1000, 0);
    h.add(1000, 0, &[("a", 0), ("b", 3)], 1);
    let (_, out) = h.end(1000, 0, true, 2);
    assert_eq!(markers(&out).len(), 1);
    // The coordinator dies before the markers are written; another loads the log.
    let mut other = TransactionCoordinator::new(TransactionConfig::default());
    let p = other.partition_for(T);
    let encoded: Vec<(bytes::Bytes, Option<bytes::Bytes>)> = h
        .log
        .iter()
        .map(|r| (r.key_bytes().unwrap(), r.value_bytes().unwrap()))
        .collect();
    let records = encoded
        .iter()
        .map(|(k, v)| TransactionLogRecord::decode(k, v.as_deref()).unwrap());
    let out = other.load(p, 8, records);
    match &out[..] {
        [Output::WriteMarkers {
            commit: true,
            producer_epoch: 0,
            coordinator_epoch: 8,
            partitions,
            ..
        }] => {
            assert_eq!(partitions, &vec![("a".to_owned(), 0), ("b".to_owned(), 3)]);
        }
        o => panic!("{o:?}"),
    }
    let m = other.describe(T).unwrap();
    assert_eq!(m.state, TransactionState::PrepareCommit);
    assert_eq!(m.producer_id, 1000);
    let out = other.markers_written(T, 1000, 0, 3);
    let Output::Persist { write, .. } = out[0] else {
        panic!()
    };
    assert!(other.write_completed(write, 0).is_empty());
    assert_eq!(
        other.describe(T).unwrap().state,
        TransactionState::CompleteCommit
    );
    // A stale report changes nothing.
    assert!(other.markers_written(T, 1000, 0, 4).is_empty());
    assert_eq!(
        other.list(&[TransactionState::CompleteCommit], &[]),
        vec![TransactionListing {
            transactional_id: T.into(),
            producer_id: 1000,
            state: TransactionState::CompleteCommit
        }]
    );
    assert!(other.list(&[TransactionState::Ongoing], &[]).is_empty());
    assert!(other.list(&[], &[7]).is_empty());
}

#[test]
fn tv2_every_commit_and_abort_bumps_the_epoch_and_markers_carry_the_new_one() {
    let mut h = Harness::new();
    h.init(-1, -1, 1000, 0);
    // The leader adds the partition on the first produce; the transaction starts there.
    assert_eq!(h.add_v2(1000, 0, &[("a", 0)], 1), vec![ErrorCode::NONE]);
    let m = h.c.describe(T).unwrap();
    assert_eq!(
        (m.state, m.client_transaction_version),
        (TransactionState::Ongoing, 2)
    );
    let (e, producer, out) = h.end_v(2, (1000, 0), true, -1, 2);
    assert_eq!((e, producer), (ErrorCode::NONE, (1000, 1)));
    // The markers fence the epoch the transaction ran at.
    assert_eq!(markers(&out), vec![(true, 1, vec![("a".to_owned(), 0)])]);
    // A retry while the markers are written: the epoch one behind is recognised.
    let (e, _, _) = h.end_v(2, (1000, 0), true, -1, 3);
    assert_eq!(e, ErrorCode::CONCURRENT_TRANSACTIONS);
    h.write_markers(&out, 4);
    assert_eq!(h.state(), TransactionState::CompleteCommit);
    // A retry after completion is answered with what the producer holds now.
    let (e, producer, out) = h.end_v(2, (1000, 0), true, -1, 5);
    assert_eq!((e, producer), (ErrorCode::NONE, (1000, 1)));
    assert!(markers(&out).is_empty());
    // ... but the same retry asking for the other outcome is refused.
    assert_eq!(
        h.end_v(2, (1000, 0), false, -1, 5).0,
        ErrorCode::INVALID_TXN_STATE
    );
    // The old epoch is fenced for anything new.
    assert_eq!(
        h.add_v2(1000, 0, &[("a", 0)], 6),
        vec![ErrorCode::PRODUCER_FENCED]
    );
    // The next transaction runs at the bumped epoch; an abort bumps it again.
    assert_eq!(h.add_v2(1000, 1, &[("b", 2)], 7), vec![ErrorCode::NONE]);
    let (e, producer, out) = h.end_v(2, (1000, 1), false, -1, 8);
    assert_eq!((e, producer), (ErrorCode::NONE, (1000, 2)));
    assert_eq!(markers(&out), vec![(false, 2, vec![("b".to_owned(), 2)])]);
    h.write_markers(&out, 9);
    assert_eq!(h.state(), TransactionState::CompleteAbort);
    assert!(h.c.describe(T).unwrap().partitions.is_empty());
    // A commit with nothing in it is refused, as at version 1.
    assert_eq!(
        h.end_v(2, (1000, 2), true, -1, 10).0,
        ErrorCode::INVALID_TXN_STATE
    );
}

#[test]
fn tv2_an_abort_needs_no_partitions_and_a_wrong_epoch_is_fenced() {
    let mut h = Harness::new();
    h.init(-1, -1, 1000, 0);
    // Empty: abort with nothing added still bumps (and writes no markers to anyone).
    let (e, producer, out) = h.end_v(2, (1000, 0), false, -1, 1);
    assert_eq!((e, producer), (ErrorCode::NONE, (1000, 1)));
    assert_eq!(markers(&out), vec![(false, 1, vec![])]);
    h.write_markers(&out, 2);
    assert_eq!(h.state(), TransactionState::CompleteAbort);
    // CompleteAbort at the current epoch: another empty abort is a new one, not a retry.
    let (e, producer, out) = h.end_v(2, (1000, 1), false, -1, 3);
    assert_eq!((e, producer), (ErrorCode::NONE, (1000, 2)));
    h.write_markers(&out, 4);
    // Ongoing: only the current epoch may end it; one ahead or two behind is fenced.
    assert_eq!(h.add_v2(1000, 2, &[("a", 0)], 5), vec![ErrorCode::NONE]);
    assert_eq!(
        h.end_v(2, (1000, 3), true, -1, 6).0,
        ErrorCode::PRODUCER_FENCED
    );
    assert_eq!(
        h.end_v(2, (1000, 1), true, -1, 6).0,
        ErrorCode::PRODUCER_FENCED
    );
    assert_eq!(
        h.end_v(2, (77, 2), true, -1, 6).0,
        ErrorCode::INVALID_PRODUCER_ID_MAPPING
    );
    // A version-1 EndTxn of a transaction a version-2 leader added to does not bump.
    let (e, producer, out) = h.end_v(0, (1000, 2), true, -1, 7);
    assert_eq!((e, producer), (ErrorCode::NONE, (-1, -1)));
    assert_eq!(markers(&out), vec![(true, 2, vec![("a".to_owned(), 0)])]);
}

#[test]
fn tv2_an_abort_at_the_bumped_epoch_while_the_commits_markers_are_written_waits() {
    // franz-go's transactional ETL: a commit is answered (epoch 0 -> 1) as soon as it is
    // prepared; the producer begins the next transaction at epoch 1, gives it up before
    // anything was added and aborts it while the commit's markers are still written. That
    // abort must be told to wait, not be fenced with the producer's own epoch (KAFKA-18464).
    let mut h = Harness::new();
    h.init(-1, -1, 1000, 0);
    assert_eq!(h.add_v2(1000, 0, &[("a", 0)], 1), vec![ErrorCode::NONE]);
    let (e, producer, out) = h.end_v(2, (1000, 0), true, -1, 2);
    assert_eq!((e, producer), (ErrorCode::NONE, (1000, 1)));
    assert_eq!(h.state(), TransactionState::PrepareCommit);
    for (epoch, commit) in [(1, false), (1, true), (0, false), (2, false)] {
        assert_eq!(
            h.end_v(2, (1000, epoch), commit, -1, 3).0,
            ErrorCode::CONCURRENT_TRANSACTIONS,
            "epoch {epoch}, commit {commit}"
        );
    }
    h.write_markers(&out, 4);
    assert_eq!(h.state(), TransactionState::CompleteCommit);
    // Retried once the commit completed, the abort is a new, empty one, and bumps.
    let (e, producer, out) = h.end_v(2, (1000, 1), false, -1, 5);
    assert_eq!((e, producer), (ErrorCode::NONE, (1000, 2)));
    assert_eq!(markers(&out), vec![(false, 2, vec![])]);
    h.write_markers(&out, 6);
    // An epoch the producer never held is still fenced once nothing is in flight.
    assert_eq!(
        h.end_v(2, (1000, 4), false, -1, 7).0,
        ErrorCode::PRODUCER_FENCED
    );
}

#[test]
fn tv2_the_bump_that_spends_the_last_epoch_moves_the_producer_to_a_new_id() {
    let mut h = Harness::new();
    h.init(-1, -1, 1000, 0);
    // Bring the epoch to the last one a producer may hold (KIP-360 bumps).
    let mut epoch = 0;
    while epoch < i16::MAX - 1 {
        let (e, _, next) = h.init(1000, epoch, -1, 1);
        assert_eq!(e, ErrorCode::NONE);
        epoch = next;
    }
    assert_eq!(h.add_v2(1000, epoch, &[("a", 0)], 2), vec![ErrorCode::NONE]);
    // Without an id to move to, the coordinator cannot end it yet (retriable).
    assert_eq!(
        h.end_v(2, (1000, epoch), true, -1, 3).0,
        ErrorCode::COORDINATOR_NOT_AVAILABLE
    );
    let (e, producer, out) = h.end_v(2, (1000, epoch), true, 2000, 3);
    assert_eq!((e, producer), (ErrorCode::NONE, (2000, 0)));
    // The markers spend the last epoch under the old id.
    assert_eq!(
        markers(&out),
        vec![(true, i16::MAX, vec![("a".to_owned(), 0)])]
    );
    let m = h.c.describe(T).unwrap();
    assert_eq!((m.producer_id, m.next_producer_id), (1000, 2000));
    h.write_markers(&out, 4);
    let m = h.c.describe(T).unwrap().clone();
    assert_eq!(
        (
            m.state,
            m.producer_id,
            m.producer_epoch,
            m.previous_producer_id,
            m.next_producer_id
        ),
        (TransactionState::CompleteCommit, 2000, 0, 1000, -1)
    );
    // A retry from the old id at the old epoch is recognised and told the new one.
    let (e, producer, _) = h.end_v(2, (1000, i16::MAX - 1), true, -1, 5);
    assert_eq!((e, producer), (ErrorCode::NONE, (2000, 0)));
    // The rotation survives a replay (next_producer_id and the version are recorded).
    let last = h.log.last().unwrap().clone();
    let back = TransactionLogRecord::decode(
        &last.key_bytes().unwrap(),
        last.value_bytes().unwrap().as_deref(),
    )
    .unwrap();
    // (The epoch before the last bump is not recorded, as in Kafka.)
    let mut expected = last.clone();
    if let Some(v) = expected.value.as_mut() {
        v.last_producer_epoch = -1;
    }
    assert_eq!(back, expected);
    let preparing = h
        .log
        .iter()
        .rev()
        .find(|r| {
            r.value
                .as_ref()
                .is_some_and(|v| v.state == TransactionState::PrepareCommit)
        })
        .unwrap();
    let v = preparing.value.as_ref().unwrap();
    assert_eq!(
        (v.next_producer_id, v.client_transaction_version),
        (2000, 2)
    );
}

#[test]
fn tombstones_and_later_records_win_in_replay() {
    let mut h = Harness::new();
    h.init(-1, -1, 1000, 0);
    h.add(1000, 0, &[("a", 0)], 1);
    let p = h.c.partition_for(T);
    let mut log = h.log.clone();
    log.push(TransactionLogRecord {
        transactional_id: T.into(),
        value: None,
    });
    let mut other = TransactionCoordinator::new(TransactionConfig::default());
    assert!(other.load(p, 1, log.clone()).is_empty());
    assert_eq!(
        other.describe(T),
        Err(ErrorCode::TRANSACTIONAL_ID_NOT_FOUND)
    );
    log.pop();
    other.load(p, 2, log);
    assert_eq!(other.describe(T).unwrap(), h.c.describe(T).unwrap());
}

#[test]
fn state_ids_and_names_round_trip() {
    for id in 0..=7 {
        let s = TransactionState::from_id(id).unwrap();
        assert_eq!(s.id(), id);
        assert_eq!(TransactionState::from_name(s.name()), Some(s));
    }
    assert_eq!(TransactionState::from_id(8), None);
}

#[test]
fn a_truncated_or_unknown_record_is_an_error_not_a_panic() {
    assert!(TransactionLogRecord::decode(&[], None).is_err());
    assert!(TransactionLogRecord::decode(&[0, 9, 0, 1, b'x'], None).is_err());
    let r = TransactionLogRecord {
        transactional_id: "x".into(),
        value: None,
    };
    let key = r.key_bytes().unwrap();
    assert!(TransactionLogRecord::decode(&key, Some(&[0, 1, 0])).is_err());
    assert!(TransactionLogRecord::decode(&key, Some(&[0, 7])).is_err());
}

proptest! {
    #[test]
    fn records_round_trip(
        id in "[a-z]{1,12}",
        pid in -1i64..1_000_000,
        epoch in -1i16..i16::MAX,
        state in 0i8..=7,
        parts in proptest::collection::btree_set(("[a-c]{1,3}", 0i32..50), 0..6),
        start in -1i64..1_000_000,
        update in 0i64..1_000_000,
        next_pid in -1i64..1_000_000,
        tv in prop_oneof![Just(0i16), Just(2i16)],
    ) {
        let m = TransactionMetadata {
            transactional_id: id.clone(),
            producer_id: pid,
            previous_producer_id: -1,
            producer_epoch: epoch,
            last_producer_epoch: -1,
            txn_timeout_ms: 60_000,
            state: TransactionState::from_id(state).unwrap(),
            partitions: parts,
            txn_start_timestamp_ms: start,
            txn_last_update_timestamp_ms: update,
            next_producer_id: next_pid,
            client_transaction_version: tv,
        };
        let r = TransactionLogRecord { transactional_id: id, value: Some(m) };
        let back = TransactionLogRecord::decode(
            &r.key_bytes().unwrap(),
            r.value_bytes().unwrap().as_deref(),
        )
        .unwrap();
        prop_assert_eq!(back, r);
    }
}

#[test]
fn tv2_the_next_transactions_add_is_held_while_the_commit_ends() {
    let mut h = Harness::new();
    h.init(-1, -1, 1000, 0);
    assert_eq!(h.add_v2(1000, 0, &[("a", 0)], 1), vec![ErrorCode::NONE]);
    let (e, producer, out) = h.end_v(2, (1000, 0), true, -1, 2);
    assert_eq!((e, producer), (ErrorCode::NONE, (1000, 1)));
    // The producer goes on at once with the bumped epoch; the leader's add for it finds
    // the markers being written and is held, with an AddOffsetsToTxn of the same id.
    let mut add = add_req(1000, 1, &[("b", 1)], false);
    if let Request::AddPartitionsToTxn {
        client_transaction_version,
        ..
    } = &mut add
    {
        *client_transaction_version = 2;
    }
    let (held_add, now) = h.send(add, 3);
    assert!(now.is_empty(), "{now:?}");
    let offsets = Request::AddOffsetsToTxn {
        transactional_id: T.into(),
        producer_id: 1000,
        producer_epoch: 1,
        offsets_partition: 4,
    };
    let (held_offsets, now) = h.send(offsets, 4);
    assert!(now.is_empty(), "{now:?}");
    assert_eq!(h.c.next_deadline(), Some(23));
    // The markers are written at 6: both are decided in arrival order, and the next
    // transaction starts then.
    let answers = h.markers_done(&out, 6);
    assert_eq!(
        answer_to(&answers, held_add),
        Some(Response::AddPartitionsToTxn {
            results: vec![(("b".into(), 1), ErrorCode::NONE)]
        })
    );
    assert_eq!(
        answer_to(&answers, held_offsets),
        Some(Response::AddOffsetsToTxn {
            error: ErrorCode::NONE
        })
    );
    let m = h.c.describe(T).unwrap();
    assert_eq!(m.state, TransactionState::Ongoing);
    assert_eq!(m.txn_start_timestamp_ms, 6);
    assert_eq!(
        m.partitions.iter().cloned().collect::<Vec<_>>(),
        vec![("__consumer_offsets".to_owned(), 4), ("b".to_owned(), 1)]
    );
    assert_eq!(h.c.next_deadline(), None);

    // A held add goes when its partition does, answered NOT_COORDINATOR.
    let (e, _, out) = h.end_v(2, (1000, 1), true, -1, 10);
    assert_eq!(e, ErrorCode::NONE);
    assert!(!markers(&out).is_empty());
    let (held, now) = h.send(add_req(1000, 2, &[("c", 0)], true), 11);
    assert!(now.is_empty(), "{now:?}");
    let p = h.c.partition_for(T);
    assert_eq!(
        answer_to(&h.c.unload(p), held),
        Some(Response::AddPartitionsToTxn {
            results: vec![(("c".into(), 0), ErrorCode::NOT_COORDINATOR)]
        })
    );
    assert_eq!(h.c.next_deadline(), None);
}

#[test]
fn a_held_add_is_answered_when_the_write_it_waits_for_fails() {
    let mut h = Harness::new();
    h.init(-1, -1, 1000, 0);
    let out = h.c.handle(9, add_req(1000, 0, &[("a", 0)], false), 1);
    let Output::Persist { write, .. } = out[0] else {
        panic!("{out:?}")
    };
    // The first add's record is being replicated: a second add of the id is held.
    assert!(h
        .c
        .handle(10, add_req(1000, 0, &[("b", 0)], false), 2)
        .is_empty());
    let out = h.c.write_failed(write, ErrorCode::NOT_ENOUGH_REPLICAS);
    assert_eq!(
        answer_to(&out, 10),
        Some(Response::AddPartitionsToTxn {
            results: vec![(("b".into(), 0), ErrorCode::CONCURRENT_TRANSACTIONS)]
        })
    );
    assert_eq!(h.c.next_deadline(), None);
}

#[test]
fn with_no_wait_an_add_that_finds_the_transaction_ending_is_answered_at_once() {
    let mut c = TransactionCoordinator::new(TransactionConfig {
        concurrent_wait_ms: 0,
        ..TransactionConfig::default()
    });
    let p = c.partition_for(T);
    assert!(c.load(p, 7, Vec::new()).is_empty());
    let out = c.handle(1, add_req(1000, 0, &[("a", 0)], false), 1);
    assert!(matches!(out[..], [Output::Respond { .. }]), "{out:?}");
    let out = c.handle(2, init_req(-1, -1, 1000), 1);
    let Output::Persist { write, .. } = out[0] else {
        panic!("{out:?}")
    };
    // Kafka's answer while the id's record is replicated.
    assert_eq!(
        c.handle(3, add_req(1000, 0, &[("a", 0)], false), 2),
        vec![Output::Respond {
            responder: 3,
            response: Response::AddPartitionsToTxn {
                results: vec![(("a".into(), 0), ErrorCode::CONCURRENT_TRANSACTIONS)]
            }
        }]
    );
    assert_eq!(c.next_deadline(), None);
    assert!(!c.write_completed(write, 3).is_empty());
}
