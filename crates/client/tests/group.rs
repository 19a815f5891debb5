//! Consumer groups against a real `rill server`: three Rill consumers on six partitions
//! settle 2/2/2 and rebalance to 3/3 when one leaves, reading every record once (commit
//! before rejoin); positions come from committed offsets, else `auto.offset.reset`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test harness: a failure is a test failure

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::RillServer;
use rill_client::{
    Admin, Assignor, AutoOffsetReset, ClientConfig, Consumer, ConsumerConfig, Error, NewTopic,
    Producer, ProducerConfig, ProducerRecord, RebalanceEvent, TopicPartition,
};

fn client(server: &RillServer) -> ClientConfig {
    ClientConfig::new(&server.addr).request_timeout(Duration::from_secs(10))
}

fn consumer_config(server: &RillServer, group: &str, assignor: Assignor) -> ConsumerConfig {
    ConsumerConfig::new(client(server))
        .group_id(group)
        .auto_offset_reset(AutoOffsetReset::Earliest)
        .assignors(vec![assignor])
        .session_timeout(Duration::from_secs(10))
        .heartbeat_interval(Duration::from_millis(200))
}

async fn produce(server: &RillServer, topic: &str, from: usize, to: usize) {
    let producer = Producer::new(ProducerConfig::new(client(server))).unwrap();
    for i in from..to {
        producer
            .send(ProducerRecord::new(topic, format!("v{i}")).key(format!("k{i}")))
            .await
            .unwrap();
    }
    producer.close().await.unwrap();
}

/// What the member tasks report.
#[derive(Default)]
struct Seen {
    /// Every record read: (partition, offset) -> member index.
    records: BTreeMap<(i32, i64), usize>,
    duplicates: Vec<(i32, i64)>,
    assignments: BTreeMap<usize, Vec<TopicPartition>>,
}

struct Member {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Vec<RebalanceEvent>>,
}

fn spawn_member(
    index: usize,
    config: ConsumerConfig,
    topic: &'static str,
    seen: Arc<Mutex<Seen>>,
) -> Member {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let task = tokio::spawn(async move {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut consumer = Consumer::new(config).unwrap();
        consumer.set_rebalance_listener(tx);
        consumer.subscribe(&[topic]).unwrap();
        while !flag.load(Ordering::Relaxed) {
            let records = consumer.poll(Duration::from_millis(200)).await.unwrap();
            let mut s = seen.lock().unwrap();
            for r in records {
                if s.records.insert((r.partition, r.offset), index).is_some() {
                    s.duplicates.push((r.partition, r.offset));
                }
            }
            s.assignments.insert(index, consumer.assignment());
        }
        consumer.close().await.unwrap();
        seen.lock().unwrap().assignments.remove(&index);
        let mut events = Vec::new();
        while let Ok(e) = rx.try_recv() {
            events.push(e);
        }
        events
    });
    Member { stop, task }
}

/// Waits until the live members' assignment sizes are `sizes` (sorted) and cover the
/// topic's partitions exactly once.
async fn wait_for_balance(seen: &Arc<Mutex<Seen>>, sizes: &[usize], partitions: usize) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        {
            let s = seen.lock().unwrap();
            let mut got: Vec<usize> = s.assignments.values().map(Vec::len).collect();
            got.sort();
            let all: BTreeSet<&TopicPartition> = s.assignments.values().flatten().collect();
            if got == sizes && all.len() == partitions {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "group did not settle on {sizes:?}: {:?}",
                s.assignments
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn wait_for_records(seen: &Arc<Mutex<Seen>>, count: usize) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        {
            let s = seen.lock().unwrap();
            if s.records.len() >= count {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "read {} of {count} records",
                s.records.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn three_members_settle_and_rebalance(assignor: Assignor) {
    let Some(server) = RillServer::start() else {
        return;
    };
    let topic: &'static str = "six";
    let group = format!("g-{}", assignor.name());
    Admin::new(client(&server))
        .unwrap()
        .create_topics(&[NewTopic::new(topic, 6)])
        .await
        .unwrap();
    produce(&server, topic, 0, 600).await;

    let seen = Arc::new(Mutex::new(Seen::default()));
    let members: Vec<Member> = (0..3)
        .map(|i| {
            spawn_member(
                i,
                consumer_config(&server, &group, assignor),
                topic,
                seen.clone(),
            )
        })
        .collect();
    wait_for_balance(&seen, &[2, 2, 2], 6).await;
    wait_for_records(&seen, 600).await;

    // One member leaves: the other two take its partitions and carry on from its commits.
    produce(&server, topic, 600, 1200).await;
    let mut members = members.into_iter();
    let leaving = members.next().unwrap();
    leaving.stop.store(true, Ordering::Relaxed);
    let events = leaving.task.await.unwrap();
    assert!(
        events
            .iter()
            .any(|e| matches!(e, RebalanceEvent::Revoked(p) if !p.is_empty())),
        "the leaving member revokes its partitions: {events:?}"
    );
    wait_for_balance(&seen, &[3, 3], 6).await;
    produce(&server, topic, 1200, 1800).await;
    wait_for_records(&seen, 1800).await;

    for m in members {
        m.stop.store(true, Ordering::Relaxed);
        m.task.await.unwrap();
    }
    {
        let s = seen.lock().unwrap();
        assert!(
            s.duplicates.is_empty(),
            "records read twice: {:?}",
            s.duplicates
        );
        assert_eq!(s.records.len(), 1800);
        // Every offset of every partition, with no gap.
        let mut per_partition: BTreeMap<i32, Vec<i64>> = BTreeMap::new();
        for (p, o) in s.records.keys() {
            per_partition.entry(*p).or_default().push(*o);
        }
        for (p, offsets) in per_partition {
            assert_eq!(
                offsets,
                (0..offsets.len() as i64).collect::<Vec<_>>(),
                "partition {p}"
            );
        }
    }

    // The group's committed offsets are the log end offsets.
    let admin = Admin::new(client(&server)).unwrap();
    let committed = admin.list_group_offsets(&group, None).await.unwrap();
    let tps: Vec<TopicPartition> = (0..6).map(|p| TopicPartition::new(topic, p)).collect();
    let ends = admin
        .list_offsets(&tps, rill_client::OffsetSpec::Latest)
        .await
        .unwrap();
    assert_eq!(committed, ends);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn range_three_members_settle_2_2_2_and_rebalance() {
    three_members_settle_and_rebalance(Assignor::Range).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roundrobin_three_members_settle_2_2_2_and_rebalance() {
    three_members_settle_and_rebalance(Assignor::RoundRobin).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sticky_three_members_settle_2_2_2_and_rebalance() {
    three_members_settle_and_rebalance(Assignor::Sticky).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cooperative_sticky_three_members_settle_2_2_2_and_rebalance() {
    three_members_settle_and_rebalance(Assignor::CooperativeSticky).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn positions_come_from_commits_else_auto_offset_reset() {
    let Some(server) = RillServer::start() else {
        return;
    };
    Admin::new(client(&server))
        .unwrap()
        .create_topics(&[NewTopic::new("p", 1)])
        .await
        .unwrap();
    produce(&server, "p", 0, 10).await;
    let tp = TopicPartition::new("p", 0);

    // none: no committed offset is an error.
    let mut strict = Consumer::new(
        consumer_config(&server, "strict", Assignor::Range)
            .auto_offset_reset(AutoOffsetReset::None),
    )
    .unwrap();
    strict.subscribe(&["p"]).unwrap();
    let err = strict.poll(Duration::from_secs(5)).await.unwrap_err();
    assert!(matches!(err, Error::NoOffsetForPartition { .. }), "{err}");
    strict.close().await.unwrap();

    // latest: starts at the end.
    let mut late = Consumer::new(
        consumer_config(&server, "late", Assignor::Range)
            .auto_offset_reset(AutoOffsetReset::Latest),
    )
    .unwrap();
    late.subscribe(&["p"]).unwrap();
    assert!(late.poll(Duration::from_secs(2)).await.unwrap().is_empty());
    assert_eq!(late.position(&tp), Some(10));
    late.close().await.unwrap();

    // earliest, commit 4, close; the next member of the group starts at 4.
    let mut first = Consumer::new(
        consumer_config(&server, "resume", Assignor::Range).enable_auto_commit(false),
    )
    .unwrap();
    first.subscribe(&["p"]).unwrap();
    let mut read = Vec::new();
    while read.len() < 10 {
        read.extend(first.poll(Duration::from_secs(2)).await.unwrap());
    }
    assert_eq!(read[0].offset, 0);
    first
        .commit_offsets(&BTreeMap::from([(tp.clone(), 4)]))
        .await
        .unwrap();
    assert_eq!(
        first.committed(std::slice::from_ref(&tp)).await.unwrap()[&tp],
        4
    );
    first.close().await.unwrap();

    let mut second = Consumer::new(consumer_config(&server, "resume", Assignor::Range)).unwrap();
    second.subscribe(&["p"]).unwrap();
    let mut read = Vec::new();
    while read.len() < 6 {
        read.extend(second.poll(Duration::from_secs(2)).await.unwrap());
    }
    assert_eq!(
        read.iter().map(|r| r.offset).collect::<Vec<_>>(),
        (4..10).collect::<Vec<_>>()
    );
    // Auto-commit on close stores the position.
    second.close().await.unwrap();
    let admin = Admin::new(client(&server)).unwrap();
    assert_eq!(
        admin.list_group_offsets("resume", None).await.unwrap()[&tp],
        10
    );
}
