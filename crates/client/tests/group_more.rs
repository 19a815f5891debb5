//! More of the consumer against a real `rill server`: pattern subscriptions (new matching
//! topics picked up on the metadata refresh), static membership (`group.instance.id`: a
//! restart within the session timeout gets its old partitions back without a rebalance),
//! seek and pause/resume, and the rebalance listener's revoked/assigned calls.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test harness: a failure is a test failure

mod common;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::RillServer;
use rill_client::{
    Admin, Assignor, AutoOffsetReset, ClientConfig, Consumer, ConsumerConfig, ConsumerRecord,
    NewTopic, Producer, ProducerConfig, ProducerRecord, RebalanceEvent, TopicPartition,
};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};

fn client(server: &RillServer) -> ClientConfig {
    ClientConfig::new(&server.addr).request_timeout(Duration::from_secs(10))
}

fn consumer_config(server: &RillServer, group: &str) -> ConsumerConfig {
    ConsumerConfig::new(client(server))
        .group_id(group)
        .auto_offset_reset(AutoOffsetReset::Earliest)
        .assignors(vec![Assignor::Range])
        .session_timeout(Duration::from_secs(10))
        .heartbeat_interval(Duration::from_millis(200))
}

async fn create(server: &RillServer, topics: &[(&str, i32)]) {
    let new: Vec<NewTopic> = topics.iter().map(|(t, n)| NewTopic::new(*t, *n)).collect();
    Admin::new(client(server))
        .unwrap()
        .create_topics(&new)
        .await
        .unwrap();
}

/// `count` records to each partition in `0..partitions` of `topic`.
async fn produce(server: &RillServer, topic: &str, partitions: i32, count: usize) {
    let producer = Producer::new(ProducerConfig::new(client(server))).unwrap();
    for p in 0..partitions {
        for i in 0..count {
            producer
                .send(ProducerRecord::new(topic, format!("{topic}-{p}-{i}")).partition(p))
                .await
                .unwrap();
        }
    }
    producer.close().await.unwrap();
}

/// Polls until `done` holds for everything read so far, or fails after 30 s.
async fn poll_until(
    consumer: &mut Consumer,
    read: &mut Vec<ConsumerRecord>,
    done: impl Fn(&[ConsumerRecord]) -> bool,
) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done(read) {
        assert!(
            Instant::now() < deadline,
            "gave up after {} records: {:?}",
            read.len(),
            read.iter()
                .map(|r| (r.topic.clone(), r.partition, r.offset))
                .collect::<Vec<_>>()
        );
        read.extend(consumer.poll(Duration::from_millis(200)).await.unwrap());
    }
}

fn count_from(read: &[ConsumerRecord], topic: &str) -> usize {
    read.iter().filter(|r| r.topic == topic).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pattern_subscription_picks_up_new_matching_topics() {
    let Some(server) = RillServer::start() else {
        return;
    };
    create(&server, &[("pat-a", 1), ("pat-b", 2), ("other", 1)]).await;
    produce(&server, "pat-a", 1, 5).await;
    produce(&server, "pat-b", 2, 5).await;
    produce(&server, "other", 1, 5).await;

    let config = consumer_config(&server, "pattern");
    let config = ConsumerConfig {
        client: config
            .client
            .clone()
            .metadata_max_age(Duration::from_millis(500)),
        ..config
    };
    let mut consumer = Consumer::new(config).unwrap();
    consumer.subscribe_pattern("^pat-.*").unwrap();
    let mut read = Vec::new();
    poll_until(&mut consumer, &mut read, |r| {
        count_from(r, "pat-a") == 5 && count_from(r, "pat-b") == 10
    })
    .await;
    assert_eq!(read.len(), 15, "only the matching topics are read");
    let assigned: BTreeSet<TopicPartition> = consumer.assignment().into_iter().collect();
    assert_eq!(
        assigned,
        BTreeSet::from([
            TopicPartition::new("pat-a", 0),
            TopicPartition::new("pat-b", 0),
            TopicPartition::new("pat-b", 1),
        ])
    );

    // A topic created later that matches is picked up after a metadata refresh; one that
    // does not match is not.
    create(&server, &[("pat-c", 1), ("nopat-d", 1)]).await;
    produce(&server, "pat-c", 1, 5).await;
    produce(&server, "nopat-d", 1, 5).await;
    poll_until(&mut consumer, &mut read, |r| count_from(r, "pat-c") == 5).await;
    // A little longer, to give a wrong subscription the chance to read more.
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until {
        read.extend(consumer.poll(Duration::from_millis(200)).await.unwrap());
    }
    assert_eq!(count_from(&read, "other"), 0);
    assert_eq!(count_from(&read, "nopat-d"), 0);
    assert_eq!(read.len(), 20);
    assert!(consumer
        .assignment()
        .contains(&TopicPartition::new("pat-c", 0)));
    assert!(!consumer
        .assignment()
        .iter()
        .any(|tp| tp.topic == "other" || tp.topic == "nopat-d"));
    consumer.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seek_pause_and_resume() {
    let Some(server) = RillServer::start() else {
        return;
    };
    create(&server, &[("sp", 2)]).await;
    produce(&server, "sp", 2, 20).await;
    let p0 = TopicPartition::new("sp", 0);
    let p1 = TopicPartition::new("sp", 1);

    let mut consumer = Consumer::new(
        ConsumerConfig::new(client(&server)).auto_offset_reset(AutoOffsetReset::Earliest),
    )
    .unwrap();
    consumer.assign(&[p0.clone(), p1.clone()]).unwrap();
    consumer.seek(&p0, 10).unwrap();
    consumer.pause(std::slice::from_ref(&p1));
    assert_eq!(consumer.paused(), vec![p1.clone()]);

    let mut read = Vec::new();
    poll_until(&mut consumer, &mut read, |r| r.len() >= 10).await;
    let until = Instant::now() + Duration::from_secs(1);
    while Instant::now() < until {
        read.extend(consumer.poll(Duration::from_millis(200)).await.unwrap());
    }
    assert!(
        read.iter().all(|r| r.partition == 0),
        "nothing from the paused partition"
    );
    assert_eq!(
        read.iter().map(|r| r.offset).collect::<Vec<_>>(),
        (10..20).collect::<Vec<_>>(),
        "read from the seek offset"
    );
    assert_eq!(consumer.position(&p0), Some(20));

    consumer.resume(std::slice::from_ref(&p1));
    assert!(consumer.paused().is_empty());
    let mut read = Vec::new();
    poll_until(&mut consumer, &mut read, |r| r.len() >= 20).await;
    assert!(read.iter().all(|r| r.partition == 1));
    assert_eq!(
        read.iter().map(|r| r.offset).collect::<Vec<_>>(),
        (0..20).collect::<Vec<_>>()
    );

    // Seeking back re-reads, also after a pause/resume round.
    consumer.seek(&p1, 15).unwrap();
    let mut read = Vec::new();
    poll_until(&mut consumer, &mut read, |r| r.len() >= 5).await;
    assert_eq!(
        read.iter().map(|r| r.offset).collect::<Vec<_>>(),
        (15..20).collect::<Vec<_>>()
    );
    consumer.close().await.unwrap();
}

/// What a member task publishes while it polls.
#[derive(Default, Clone, Debug)]
struct View {
    assignment: Vec<TopicPartition>,
    generation: i32,
    member_id: String,
}

struct Member {
    stop: Arc<AtomicBool>,
    view: Arc<Mutex<Option<View>>>,
    events: UnboundedReceiver<RebalanceEvent>,
    task: tokio::task::JoinHandle<()>,
}

fn spawn_member(config: ConsumerConfig, topic: &'static str) -> Member {
    let stop = Arc::new(AtomicBool::new(false));
    let view = Arc::new(Mutex::new(None));
    let (tx, events): (UnboundedSender<RebalanceEvent>, _) = tokio::sync::mpsc::unbounded_channel();
    let (flag, shared) = (stop.clone(), view.clone());
    let task = tokio::spawn(async move {
        let mut consumer = Consumer::new(config).unwrap();
        consumer.set_rebalance_listener(tx);
        consumer.subscribe(&[topic]).unwrap();
        while !flag.load(Ordering::Relaxed) {
            consumer.poll(Duration::from_millis(100)).await.unwrap();
            let (member_id, generation) = consumer.group_metadata();
            *shared.lock().unwrap() = Some(View {
                assignment: consumer.assignment(),
                generation,
                member_id,
            });
        }
        consumer.close().await.unwrap();
    });
    Member {
        stop,
        view,
        events,
        task,
    }
}

impl Member {
    fn view(&self) -> Option<View> {
        self.view.lock().unwrap().clone()
    }

    async fn stop(self) -> Vec<RebalanceEvent> {
        let Member {
            stop,
            mut events,
            task,
            ..
        } = self;
        stop.store(true, Ordering::Relaxed);
        task.await.unwrap();
        let mut out = Vec::new();
        while let Ok(e) = events.try_recv() {
            out.push(e);
        }
        out
    }
}

/// Waits until the members' assignment sizes are `sizes` and cover `partitions` once.
async fn wait_for_balance(members: &[&Member], sizes: &[usize], partitions: usize) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let views: Vec<Option<View>> = members.iter().map(|m| m.view()).collect();
        let got: Vec<usize> = views
            .iter()
            .map(|v| v.as_ref().map_or(0, |v| v.assignment.len()))
            .collect();
        let all: BTreeSet<TopicPartition> = views
            .iter()
            .flatten()
            .flat_map(|v| v.assignment.clone())
            .collect();
        if got == sizes && all.len() == partitions {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "group did not settle on {sizes:?}: {views:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn static_member_restart_gets_its_partitions_back_without_rebalance() {
    let Some(server) = RillServer::start() else {
        return;
    };
    create(&server, &[("static", 4)]).await;
    let config =
        |id: &str| consumer_config(&server, "static-group").group_instance_id(id.to_string());
    let a = spawn_member(config("a"), "static");
    let b = spawn_member(config("b"), "static");
    wait_for_balance(&[&a, &b], &[2, 2], 4).await;
    // Both in the same generation before the restart.
    let deadline = Instant::now() + Duration::from_secs(30);
    let (a_before, b_before) = loop {
        let (va, vb) = (a.view().unwrap(), b.view().unwrap());
        if va.generation == vb.generation {
            break (va, vb);
        }
        assert!(Instant::now() < deadline, "{va:?} {vb:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };

    // "a" closes (a static member sends no LeaveGroup) and restarts within the session
    // timeout under the same instance id.
    let events = a.stop().await;
    assert!(matches!(events.last(), Some(RebalanceEvent::Revoked(p)) if p == &a_before.assignment));
    let a2 = spawn_member(config("a"), "static");
    let deadline = Instant::now() + Duration::from_secs(30);
    let a2_view = loop {
        if let Some(v) = a2.view().filter(|v| !v.assignment.is_empty()) {
            break v;
        }
        assert!(
            Instant::now() < deadline,
            "the restarted member got nothing"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        a2_view.assignment, a_before.assignment,
        "same partitions back"
    );
    assert_eq!(a2_view.generation, a_before.generation, "no new generation");
    assert_ne!(a2_view.member_id, a_before.member_id, "a new member id");
    // Well past a few heartbeats: "b" saw no rebalance.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let b_after = b.view().unwrap();
    assert_eq!(b_after.generation, b_before.generation, "b's generation");
    assert_eq!(b_after.assignment, b_before.assignment);
    let b_events = b.stop().await;
    assert_eq!(
        b_events
            .iter()
            .filter(|e| matches!(e, RebalanceEvent::Assigned(_)))
            .count(),
        1,
        "b was assigned once: {b_events:?}"
    );
    a2.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rebalance_listener_sees_revoked_and_assigned_when_a_member_joins() {
    let Some(server) = RillServer::start() else {
        return;
    };
    create(&server, &[("listen", 4)]).await;
    let all: Vec<TopicPartition> = (0..4).map(|p| TopicPartition::new("listen", p)).collect();
    let first = spawn_member(consumer_config(&server, "listen-group"), "listen");
    wait_for_balance(&[&first], &[4], 4).await;
    let second = spawn_member(consumer_config(&server, "listen-group"), "listen");
    wait_for_balance(&[&first, &second], &[2, 2], 4).await;
    let first_final = first.view().unwrap().assignment;
    let second_final = second.view().unwrap().assignment;
    let first_events = first.stop().await;
    let second_events = second.stop().await;

    // Eager: everything is revoked before the rejoin, then the new share assigned; close
    // revokes what is left.
    assert_eq!(
        first_events,
        vec![
            RebalanceEvent::Assigned(all.clone()),
            RebalanceEvent::Revoked(all.clone()),
            RebalanceEvent::Assigned(first_final.clone()),
            RebalanceEvent::Revoked(first_final.clone()),
        ]
    );
    // The second member is closed after the first one left: it may have been given all
    // four partitions in between.
    assert_eq!(
        second_events.first(),
        Some(&RebalanceEvent::Assigned(second_final.clone()))
    );
    assert!(matches!(
        second_events.last(),
        Some(RebalanceEvent::Revoked(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cooperative_listener_revokes_only_what_moves() {
    let Some(server) = RillServer::start() else {
        return;
    };
    create(&server, &[("coop", 4)]).await;
    let config =
        || consumer_config(&server, "coop-group").assignors(vec![Assignor::CooperativeSticky]);
    let first = spawn_member(config(), "coop");
    wait_for_balance(&[&first], &[4], 4).await;
    let second = spawn_member(config(), "coop");
    wait_for_balance(&[&first, &second], &[2, 2], 4).await;
    let first_final = first.view().unwrap().assignment;
    let second_final = second.view().unwrap().assignment;
    let first_events = first.stop().await;
    second.stop().await;

    let revoked: Vec<&Vec<TopicPartition>> = first_events
        .iter()
        .filter_map(|e| match e {
            RebalanceEvent::Revoked(p) => Some(p),
            _ => None,
        })
        .collect();
    // One revoke of exactly the partitions that moved, then the close.
    assert_eq!(
        revoked,
        vec![&second_final, &first_final],
        "{first_events:?}"
    );
    assert!(!first_events
        .iter()
        .any(|e| matches!(e, RebalanceEvent::Lost(_))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn second_live_member_with_the_same_instance_id_fences_the_first() {
    let Some(server) = RillServer::start() else {
        return;
    };
    create(&server, &[("fence", 2)]).await;
    let config = || consumer_config(&server, "fence-group").group_instance_id("a");
    let mut old = Consumer::new(config()).unwrap();
    old.subscribe(&["fence"]).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while old.assignment().len() != 2 {
        assert!(Instant::now() < deadline, "the first member got nothing");
        old.poll(Duration::from_millis(100)).await.unwrap();
    }

    // A second live consumer joins under the same instance id: it takes over, and the
    // first one's next heartbeat is answered FENCED_INSTANCE_ID, which poll returns.
    let newer = spawn_member(config(), "fence");
    let deadline = Instant::now() + Duration::from_secs(30);
    let err = loop {
        assert!(
            Instant::now() < deadline,
            "the first member was never fenced"
        );
        match old.poll(Duration::from_millis(100)).await {
            Ok(_) => {}
            Err(e) => break e,
        }
    };
    assert_eq!(
        err.code(),
        Some(rill_protocol::ErrorCode::FENCED_INSTANCE_ID),
        "{err}"
    );
    // Fenced stays fenced: the old member does not rejoin and steal the id back.
    assert!(old.poll(Duration::from_millis(100)).await.is_err());
    let deadline = Instant::now() + Duration::from_secs(30);
    while newer.view().is_none_or(|v| v.assignment.len() != 2) {
        assert!(Instant::now() < deadline, "{:?}", newer.view());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let generation = newer.view().unwrap().generation;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(newer.view().unwrap().generation, generation, "no ping-pong");
    let _ = old.close().await;
    newer.stop().await;
}
