use rill_protocol::generated::fetch_request::{
    FetchPartition, FetchRequest, FetchTopic, ForgottenTopic,
};
use rill_protocol::generated::fetch_response::{
    FetchResponse, FetchableTopicResponse, PartitionData,
};
use rill_protocol::{ErrorCode, Uuid};

use super::*;

const V12: i16 = 12;
const V13: i16 = 13;

fn part(partition: i32, fetch_offset: i64) -> FetchPartition {
    FetchPartition {
        partition,
        fetch_offset,
        partition_max_bytes: 1 << 20,
        ..Default::default()
    }
}

/// A v12 request (topic names) for `parts` of `(topic, partition, fetch offset)`.
fn request(id: i32, epoch: i32, parts: &[(&str, i32, i64)]) -> FetchRequest {
    let mut topics: Vec<FetchTopic> = Vec::new();
    for &(topic, partition, offset) in parts {
        match topics.last_mut() {
            Some(t) if t.topic == topic => t.partitions.push(part(partition, offset)),
            _ => topics.push(FetchTopic {
                topic: topic.into(),
                partitions: vec![part(partition, offset)],
                ..Default::default()
            }),
        }
    }
    FetchRequest {
        session_id: id,
        session_epoch: epoch,
        topics,
        ..Default::default()
    }
}

/// What `request` names, as `(topic, partition, fetch offset)`.
fn named(request: &FetchRequest) -> Vec<(String, i32, i64)> {
    request
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions
                .iter()
                .map(|p| (t.topic.clone(), p.partition, p.fetch_offset))
        })
        .collect()
}

/// The broker's answer to `request` as read: every partition, with the high watermark
/// `hw`, and `records` bytes where `with_records` names it.
fn read(
    request: &FetchRequest,
    hw: i64,
    with_records: &[(&str, i32)],
) -> (FetchResponse, Vec<usize>) {
    let mut records = Vec::new();
    let responses = request
        .topics
        .iter()
        .map(|t| FetchableTopicResponse {
            topic: t.topic.clone(),
            topic_id: t.topic_id,
            partitions: t
                .partitions
                .iter()
                .map(|p| {
                    let has = with_records.contains(&(t.topic.as_str(), p.partition));
                    records.push(if has { 100 } else { 0 });
                    PartitionData {
                        partition_index: p.partition,
                        high_watermark: hw,
                        last_stable_offset: hw,
                        log_start_offset: 0,
                        preferred_read_replica: -1,
                        ..Default::default()
                    }
                })
                .collect(),
            ..Default::default()
        })
        .collect();
    (
        FetchResponse {
            responses,
            ..Default::default()
        },
        records,
    )
}

fn answered(response: &FetchResponse) -> Vec<(String, i32)> {
    response
        .responses
        .iter()
        .flat_map(|t| {
            t.partitions
                .iter()
                .map(|p| (t.topic.clone(), p.partition_index))
        })
        .collect()
}

/// Opens a session of `parts` with a full fetch at high watermark 10; its id.
fn open(
    cache: &mut FetchSessionCache,
    parts: &[(&str, i32, i64)],
    follower: bool,
    now: u64,
) -> i32 {
    let mut req = request(0, 0, parts);
    let context = cache.new_context(&mut req, V12, follower, now);
    assert!(matches!(context, FetchContext::Full { .. }), "{context:?}");
    let asked = req.topics.clone();
    let (mut response, records) = read(&req, 10, &[]);
    let keep = cache.answer(context, &asked, &mut response, &records, now);
    assert!(keep.iter().all(|k| *k));
    response.session_id
}

#[test]
fn a_sessionless_fetch_is_read_as_it_is_and_opens_nothing() {
    let mut cache = FetchSessionCache::new(10);
    let mut req = request(0, -1, &[("t", 0, 5)]);
    let context = cache.new_context(&mut req, V12, false, 0);
    assert_eq!(context, FetchContext::Sessionless);
    let (mut response, records) = read(&req, 10, &[]);
    let keep = cache.answer(context, &[], &mut response, &records, 0);
    assert_eq!(keep, vec![true]);
    assert_eq!(response.session_id, 0);
    assert_eq!(cache.len(), 0);
    // Before v7 there are no sessions, whatever the fields say.
    let mut old = request(0, 0, &[("t", 0, 5)]);
    assert_eq!(
        cache.new_context(&mut old, 6, false, 0),
        FetchContext::Sessionless
    );
}

#[test]
fn an_incremental_fetch_reads_the_whole_session_and_answers_only_what_is_new() {
    let mut cache = FetchSessionCache::new(10);
    let id = open(
        &mut cache,
        &[("a", 0, 0), ("a", 1, 0), ("b", 0, 0)],
        false,
        0,
    );
    assert_ne!(id, 0);
    assert_eq!((cache.len(), cache.partitions()), (1, 3));

    // Epoch 1 names only a:1, with a new offset; the read covers all three.
    let mut req = request(id, 1, &[("a", 1, 7)]);
    let context = cache.new_context(&mut req, V12, false, 1);
    assert_eq!(context, FetchContext::Incremental { id, epoch: 1 });
    assert_eq!(
        named(&req),
        vec![("a".into(), 0, 0), ("a".into(), 1, 7), ("b".into(), 0, 0)]
    );
    // b:0 has records; nothing else changed.
    let (mut response, records) = read(&req, 10, &[("b", 0)]);
    let keep = cache.answer(context, &[], &mut response, &records, 1);
    assert_eq!(keep, vec![false, false, true]);
    assert_eq!(answered(&response), vec![("b".into(), 0)]);
    assert_eq!(response.session_id, id);
    // A topic left with no partitions is not answered at all.
    assert_eq!(response.responses.len(), 1);

    // Epoch 2: the high watermark moved everywhere, so all three are answered; b:0,
    // which had records, is now read last.
    let mut req = request(id, 2, &[]);
    let context = cache.new_context(&mut req, V12, false, 2);
    assert_eq!(
        named(&req),
        vec![("a".into(), 0, 0), ("a".into(), 1, 7), ("b".into(), 0, 0)]
    );
    let (mut response, records) = read(&req, 11, &[]);
    assert_eq!(
        cache.answer(context, &[], &mut response, &records, 2),
        vec![true; 3]
    );

    // Epoch 3: nothing new at all: an empty answer, still in the session.
    let mut req = request(id, 3, &[]);
    let context = cache.new_context(&mut req, V12, false, 3);
    let (mut response, records) = read(&req, 11, &[]);
    assert_eq!(
        cache.answer(context, &[], &mut response, &records, 3),
        vec![false; 3]
    );
    assert!(response.responses.is_empty());
    assert_eq!((response.session_id, response.error_code), (id, 0));
}

#[test]
fn partitions_that_answered_with_records_are_read_last_next_time() {
    let mut cache = FetchSessionCache::new(10);
    let id = open(
        &mut cache,
        &[("a", 0, 0), ("a", 1, 0), ("a", 2, 0)],
        false,
        0,
    );
    let mut req = request(id, 1, &[]);
    let context = cache.new_context(&mut req, V12, false, 0);
    let (mut response, records) = read(&req, 10, &[("a", 0)]);
    cache.answer(context, &[], &mut response, &records, 0);
    let mut req = request(id, 2, &[]);
    cache.new_context(&mut req, V12, false, 0);
    assert_eq!(
        named(&req),
        vec![("a".into(), 1, 0), ("a".into(), 2, 0), ("a".into(), 0, 0)]
    );
    // Regrouped by neighbours: a, then a again would be one topic entry here.
    assert_eq!(req.topics.len(), 1);
}

#[test]
fn an_error_is_answered_and_the_partition_comes_back_once_it_clears() {
    let mut cache = FetchSessionCache::new(10);
    let id = open(&mut cache, &[("a", 0, 0)], false, 0);
    let mut req = request(id, 1, &[]);
    let context = cache.new_context(&mut req, V12, false, 0);
    let (mut response, records) = read(&req, -1, &[]);
    response.responses[0].partitions[0].error_code = ErrorCode::NOT_LEADER_OR_FOLLOWER.code();
    assert_eq!(
        cache.answer(context, &[], &mut response, &records, 0),
        vec![true]
    );
    // The error is gone and the high watermark is what it was before it: still sent.
    let mut req = request(id, 2, &[]);
    let context = cache.new_context(&mut req, V12, false, 0);
    let (mut response, records) = read(&req, 10, &[]);
    assert_eq!(
        cache.answer(context, &[], &mut response, &records, 0),
        vec![true]
    );
}

#[test]
fn session_errors_are_answered_alone() {
    let mut cache = FetchSessionCache::new(10);
    let id = open(&mut cache, &[("a", 0, 0)], false, 0);
    let unknown = if id == 1 { 2 } else { 1 };
    for (sid, epoch, version, code) in [
        (unknown, 1, V12, ErrorCode::FETCH_SESSION_ID_NOT_FOUND),
        (id, 5, V12, ErrorCode::INVALID_FETCH_SESSION_EPOCH),
        (id, 1, V13, ErrorCode::FETCH_SESSION_TOPIC_ID_ERROR),
    ] {
        let mut req = request(sid, epoch, &[("a", 0, 3)]);
        let context = cache.new_context(&mut req, version, false, 0);
        assert_eq!(context, FetchContext::Error(code));
        let (mut response, records) = read(&req, 10, &[]);
        assert!(cache
            .answer(context, &[], &mut response, &records, 0)
            .is_empty());
        assert!(response.responses.is_empty());
        assert_eq!((response.error_code, response.session_id), (code.code(), 0));
    }
    // None of them moved the session on: epoch 1 still works.
    let mut req = request(id, 1, &[]);
    assert_eq!(
        cache.new_context(&mut req, V12, false, 0),
        FetchContext::Incremental { id, epoch: 1 }
    );
}

#[test]
fn a_duplicate_request_finds_the_session_moved_on() {
    let mut cache = FetchSessionCache::new(10);
    let id = open(&mut cache, &[("a", 0, 0)], false, 0);
    let mut first = request(id, 1, &[]);
    let context = cache.new_context(&mut first, V12, false, 0);
    // The same epoch again, while the first is still being read.
    let mut again = request(id, 1, &[]);
    assert_eq!(
        cache.new_context(&mut again, V12, false, 0),
        FetchContext::Error(ErrorCode::INVALID_FETCH_SESSION_EPOCH)
    );
    // The next epoch moves the session on before the first is answered.
    let mut next = request(id, 2, &[]);
    cache.new_context(&mut next, V12, false, 0);
    let (mut response, records) = read(&first, 10, &[("a", 0)]);
    assert!(cache
        .answer(context, &[], &mut response, &records, 0)
        .is_empty());
    assert_eq!(
        (response.error_code, response.session_id),
        (ErrorCode::INVALID_FETCH_SESSION_EPOCH.code(), id)
    );
    // So is a throttled answer.
    let mut held = FetchResponse::default();
    cache.throttled(context, &mut held);
    assert_eq!(
        held.error_code,
        ErrorCode::INVALID_FETCH_SESSION_EPOCH.code()
    );
}

#[test]
fn forgetting_every_partition_closes_the_session() {
    let mut cache = FetchSessionCache::new(10);
    let id = open(&mut cache, &[("a", 0, 0), ("b", 0, 0)], false, 0);
    let mut req = request(id, 1, &[]);
    req.forgotten_topics_data = vec![ForgottenTopic {
        topic: "a".into(),
        partitions: vec![0, 9],
        ..Default::default()
    }];
    cache.new_context(&mut req, V12, false, 0);
    assert_eq!(named(&req), vec![("b".into(), 0, 0)]);
    assert!(req.forgotten_topics_data.is_empty());
    assert_eq!(cache.partitions(), 1);

    let mut req = request(id, 2, &[]);
    req.forgotten_topics_data = vec![ForgottenTopic {
        topic: "b".into(),
        partitions: vec![0],
        ..Default::default()
    }];
    assert_eq!(
        cache.new_context(&mut req, V12, false, 0),
        FetchContext::Sessionless
    );
    assert_eq!(cache.len(), 0);
}

#[test]
fn a_full_fetch_or_the_final_epoch_closes_the_session_it_names() {
    let mut cache = FetchSessionCache::new(10);
    let id = open(&mut cache, &[("a", 0, 0)], false, 0);
    let mut req = request(id, -1, &[("a", 0, 4)]);
    assert_eq!(
        cache.new_context(&mut req, V12, false, 0),
        FetchContext::Sessionless
    );
    assert_eq!(cache.len(), 0);
    assert_eq!(named(&req), vec![("a".into(), 0, 4)]);

    let id = open(&mut cache, &[("a", 0, 0)], false, 0);
    let mut req = request(id, 0, &[("a", 0, 4)]);
    let context = cache.new_context(&mut req, V12, false, 0);
    assert_eq!(cache.len(), 0);
    let asked = req.topics.clone();
    let (mut response, records) = read(&req, 10, &[]);
    cache.answer(context, &asked, &mut response, &records, 0);
    assert_ne!(response.session_id, 0);
    assert_eq!(cache.len(), 1);
}

#[test]
fn a_full_fetch_held_back_by_its_quota_opens_no_session() {
    let mut cache = FetchSessionCache::new(10);
    let mut req = request(0, 0, &[("a", 0, 0)]);
    let context = cache.new_context(&mut req, V12, false, 0);
    let (mut response, _) = read(&req, 10, &[]);
    cache.throttled(context, &mut response);
    assert_eq!((response.session_id, response.responses.len()), (0, 0));
    assert_eq!(cache.len(), 0);
}

#[test]
fn sessions_by_topic_id_key_on_the_id() {
    let mut cache = FetchSessionCache::new(10);
    let id_a = Uuid([7; 16]);
    let mut req = FetchRequest {
        session_epoch: 0,
        topics: vec![FetchTopic {
            topic_id: id_a,
            partitions: vec![part(0, 0), part(1, 0)],
            ..Default::default()
        }],
        ..Default::default()
    };
    let context = cache.new_context(&mut req, V13, true, 0);
    assert_eq!(
        context,
        FetchContext::Full {
            privileged: true,
            topic_ids: true
        }
    );
    let asked = req.topics.clone();
    let (mut response, records) = read(&req, 10, &[]);
    cache.answer(context, &asked, &mut response, &records, 0);
    let id = response.session_id;
    let mut req = FetchRequest {
        session_id: id,
        session_epoch: 1,
        forgotten_topics_data: vec![ForgottenTopic {
            topic_id: id_a,
            partitions: vec![1],
            ..Default::default()
        }],
        ..Default::default()
    };
    cache.new_context(&mut req, V13, true, 0);
    assert_eq!(req.topics.len(), 1);
    assert_eq!(req.topics[0].topic_id, id_a);
    assert_eq!(req.topics[0].partitions.len(), 1);
}

#[test]
fn the_epoch_wraps_to_one() {
    assert_eq!(next_epoch(i32::MAX), 1);
    assert_eq!(next_epoch(0), 1);
    assert_eq!(next_epoch(-1), -1);
}

#[test]
fn a_full_cache_takes_a_follower_over_a_consumer_and_anyone_over_a_stale_session() {
    let mut cache = FetchSessionCache::new(2);
    let c1 = open(&mut cache, &[("a", 0, 0)], false, 0);
    let c2 = open(&mut cache, &[("a", 0, 0), ("a", 1, 0)], false, 1_000);
    // Full of young consumer sessions: another consumer's gets none.
    assert_eq!(
        open(
            &mut cache,
            &[("b", 0, 0), ("b", 1, 0), ("b", 2, 0)],
            false,
            2_000
        ),
        0
    );
    assert_eq!(cache.len(), 2);
    // A follower's takes the place of the smallest consumer session.
    let f = open(&mut cache, &[("b", 0, 0)], true, 3_000);
    assert_ne!(f, 0);
    assert_eq!(cache.evictions(), 1);
    let mut req = request(c1, 1, &[]);
    assert_eq!(
        cache.new_context(&mut req, V12, false, 3_000),
        FetchContext::Error(ErrorCode::FETCH_SESSION_ID_NOT_FOUND)
    );
    // A young follower session is not given up for a consumer's...
    let mut req = request(c2, 1, &[]);
    cache.new_context(&mut req, V12, false, 100_000);
    assert_eq!(open(&mut cache, &[("c", 0, 0)], false, 100_000), 0);
    // ...but one unused for two minutes is, to anyone.
    let c3 = open(&mut cache, &[("c", 0, 0)], false, 3_000 + EVICTION_MS + 1);
    assert_ne!(c3, 0);
    assert_eq!(cache.evictions(), 2);
    let mut req = request(f, 1, &[]);
    assert_eq!(
        cache.new_context(&mut req, V12, true, 3_000 + EVICTION_MS + 1),
        FetchContext::Error(ErrorCode::FETCH_SESSION_ID_NOT_FOUND)
    );
}

#[test]
fn an_answer_out_of_the_sessions_order_is_matched_by_name() {
    // The authorizer's refusals come after the partitions read: a1 here.
    let mut cache = FetchSessionCache::new(10);
    let id = open(
        &mut cache,
        &[("a", 0, 0), ("a", 1, 0), ("a", 2, 0)],
        false,
        0,
    );
    let mut req = request(id, 1, &[]);
    let context = cache.new_context(&mut req, V12, false, 0);
    let read_only = request(0, 0, &[("a", 0, 0), ("a", 2, 0)]);
    let (mut response, mut records) = read(&read_only, 10, &[("a", 0)]);
    response.responses.push(FetchableTopicResponse {
        topic: "a".into(),
        partitions: vec![PartitionData {
            partition_index: 1,
            error_code: ErrorCode::TOPIC_AUTHORIZATION_FAILED.code(),
            high_watermark: -1,
            ..Default::default()
        }],
        ..Default::default()
    });
    records.push(0);
    let keep = cache.answer(context, &[], &mut response, &records, 0);
    assert_eq!(keep, vec![true, false, true]);
    assert_eq!(answered(&response), vec![("a".into(), 0), ("a".into(), 1)]);
    let mut req = request(id, 2, &[]);
    cache.new_context(&mut req, V12, false, 0);
    assert_eq!(
        named(&req),
        vec![("a".into(), 1, 0), ("a".into(), 2, 0), ("a".into(), 0, 0)]
    );
}
