//! The client against a real `rill server`: produce and consume with every codec,
//! partitioning by key, admin operations, and a stopped broker surfacing as a timeout.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test harness: a failure is a test failure

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::RillServer;
use rill_client::records::CompressionType;
use rill_client::{
    partition_for_key, Admin, AlterConfigOp, ClientConfig, ConfigResource, Consumer,
    ConsumerConfig, Error, NewPartitions, NewTopic, OffsetSpec, Producer, ProducerConfig,
    ProducerRecord, TopicPartition,
};

fn client(server: &RillServer) -> ClientConfig {
    ClientConfig::new(&server.addr).request_timeout(Duration::from_secs(10))
}

async fn read_all(
    config: ClientConfig,
    topic: &str,
    partitions: i32,
    expected: usize,
) -> Vec<rill_client::ConsumerRecord> {
    let mut consumer = Consumer::new(ConsumerConfig::new(config)).unwrap();
    let tps: Vec<TopicPartition> = (0..partitions)
        .map(|p| TopicPartition::new(topic, p))
        .collect();
    consumer.assign(&tps).unwrap();
    consumer.seek_to(&tps, OffsetSpec::Earliest).await.unwrap();
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while out.len() < expected && Instant::now() < deadline {
        out.extend(consumer.poll(Duration::from_millis(500)).await.unwrap());
    }
    consumer.close().await.unwrap();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn produce_and_consume_with_every_codec() {
    let Some(server) = RillServer::start() else {
        return;
    };
    let admin = Admin::new(client(&server)).unwrap();
    for codec in [
        CompressionType::None,
        CompressionType::Gzip,
        CompressionType::Snappy,
        CompressionType::Lz4,
        CompressionType::Zstd,
    ] {
        let topic = format!("codec-{codec:?}").to_lowercase();
        admin
            .create_topics(&[NewTopic::new(&topic, 3)])
            .await
            .unwrap();
        let producer =
            Producer::new(ProducerConfig::new(client(&server)).compression(codec)).unwrap();
        let mut deliveries = Vec::new();
        for i in 0..300 {
            let record = ProducerRecord::new(&topic, format!("value-{i}-{}", "x".repeat(i % 50)))
                .key(format!("key-{i}"))
                .header("i", i.to_string());
            deliveries.push(producer.send(record).await.unwrap());
        }
        producer.flush().await.unwrap();
        let mut offsets = BTreeSet::new();
        for (i, d) in deliveries.into_iter().enumerate() {
            let md = d.await.unwrap();
            assert_eq!(
                md.partition,
                partition_for_key(format!("key-{i}").as_bytes(), 3)
            );
            assert!(
                offsets.insert((md.partition, md.offset)),
                "offset given twice"
            );
        }
        producer.close().await.unwrap();

        let records = read_all(client(&server), &topic, 3, 300).await;
        assert_eq!(records.len(), 300, "{codec:?}");
        let mut seen = BTreeMap::new();
        for r in records {
            let key = String::from_utf8(r.key.unwrap().to_vec()).unwrap();
            let i: usize = key.trim_start_matches("key-").parse().unwrap();
            assert_eq!(r.partition, partition_for_key(key.as_bytes(), 3));
            assert_eq!(
                r.value.unwrap(),
                format!("value-{i}-{}", "x".repeat(i % 50)).as_bytes()
            );
            assert_eq!(
                r.headers[0].value.as_deref(),
                Some(i.to_string().as_bytes())
            );
            assert!(seen.insert(i, r.offset).is_none(), "record {i} read twice");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyless_records_stick_to_a_partition_per_batch() {
    let Some(server) = RillServer::start() else {
        return;
    };
    let admin = Admin::new(client(&server)).unwrap();
    admin
        .create_topics(&[NewTopic::new("sticky", 4)])
        .await
        .unwrap();
    let producer =
        Producer::new(ProducerConfig::new(client(&server)).linger(Duration::from_millis(50)))
            .unwrap();
    let mut deliveries = Vec::new();
    for i in 0..20 {
        deliveries.push(
            producer
                .send(ProducerRecord::new("sticky", format!("v{i}")))
                .await
                .unwrap(),
        );
    }
    let mut partitions = BTreeSet::new();
    for d in deliveries {
        partitions.insert(d.await.unwrap().partition);
    }
    assert_eq!(
        partitions.len(),
        1,
        "20 small keyless records fill one batch"
    );
    producer.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyless_records_sent_one_at_a_time_move_on_after_batch_size_bytes() {
    // linger.ms=0, each record awaited: every batch leaves before the next record comes,
    // so no batch is ever found closed. The partition must still change once batch.size
    // bytes went to it (KIP-794), or every record lands in one partition.
    let Some(server) = RillServer::start() else {
        return;
    };
    let admin = Admin::new(client(&server)).unwrap();
    admin
        .create_topics(&[NewTopic::new("unbatched", 4)])
        .await
        .unwrap();
    let producer = Producer::new(
        ProducerConfig::new(client(&server))
            .linger(Duration::ZERO)
            .batch_size(1_000),
    )
    .unwrap();
    let mut counts = std::collections::BTreeMap::new();
    for _ in 0..40 {
        let record = ProducerRecord::new("unbatched", vec![7u8; 400]);
        let delivered = producer.send(record).await.unwrap().await.unwrap();
        *counts.entry(delivered.partition).or_insert(0) += 1;
    }
    assert!(
        counts.len() >= 3,
        "40 records, 3 to a batch.size: {counts:?}"
    );
    assert!(
        counts.values().all(|&c| c <= 30),
        "no partition takes nearly all: {counts:?}"
    );
    producer.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_operations() {
    let Some(server) = RillServer::start() else {
        return;
    };
    let admin = Admin::new(client(&server)).unwrap();
    admin
        .create_topics(&[NewTopic::new("a", 2).config("retention.ms", "3600000")])
        .await
        .unwrap();
    let err = admin
        .create_topics(&[NewTopic::new("a", 2)])
        .await
        .unwrap_err();
    assert_eq!(
        err.code(),
        Some(rill_protocol::ErrorCode::TOPIC_ALREADY_EXISTS),
        "{err}"
    );
    let topics = admin.list_topics(false).await.unwrap();
    assert!(topics
        .iter()
        .any(|t| t.name == "a" && t.partitions.len() == 2));
    admin
        .create_partitions(&[NewPartitions {
            topic: "a".into(),
            total_count: 5,
        }])
        .await
        .unwrap();
    let described = admin.describe_topics(&["a".into()]).await.unwrap();
    assert_eq!(described[0].partitions.len(), 5);
    assert!(matches!(
        admin.describe_topics(&["nope".into()]).await,
        Err(Error::UnknownTopic(_))
    ));

    let configs = admin
        .describe_configs(&ConfigResource::topic("a"))
        .await
        .unwrap();
    assert_eq!(
        configs
            .iter()
            .find(|c| c.name == "retention.ms")
            .and_then(|c| c.value.clone())
            .as_deref(),
        Some("3600000")
    );
    admin
        .alter_configs(
            &ConfigResource::topic("a"),
            &[AlterConfigOp::Set("retention.ms".into(), "7200000".into())],
        )
        .await
        .unwrap();
    let configs = admin
        .describe_configs(&ConfigResource::topic("a"))
        .await
        .unwrap();
    assert_eq!(
        configs
            .iter()
            .find(|c| c.name == "retention.ms")
            .and_then(|c| c.value.clone())
            .as_deref(),
        Some("7200000")
    );

    let producer = Producer::new(ProducerConfig::new(client(&server))).unwrap();
    for i in 0..10 {
        producer
            .send(ProducerRecord::new("a", "v").partition(i % 2))
            .await
            .unwrap();
    }
    producer.close().await.unwrap();
    let tps = vec![TopicPartition::new("a", 0), TopicPartition::new("a", 1)];
    let ends = admin.list_offsets(&tps, OffsetSpec::Latest).await.unwrap();
    assert_eq!(ends.values().copied().collect::<Vec<_>>(), vec![5, 5]);
    let starts = admin
        .list_offsets(&tps, OffsetSpec::Earliest)
        .await
        .unwrap();
    assert_eq!(starts.values().copied().collect::<Vec<_>>(), vec![0, 0]);

    let cluster = admin.describe_cluster().await.unwrap();
    assert_eq!(cluster.brokers.len(), 1);
    assert!(cluster.cluster_id.is_some());

    admin.delete_topics(&["a".into()]).await.unwrap();
    let topics = admin.list_topics(false).await.unwrap();
    assert!(!topics.iter().any(|t| t.name == "a"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_broker_is_a_timeout_not_a_hang() {
    let Some(server) = RillServer::start() else {
        return;
    };
    let config = ClientConfig::new(&server.addr).request_timeout(Duration::from_secs(1));
    let admin = Admin::new(config.clone()).unwrap();
    admin.create_topics(&[NewTopic::new("t", 1)]).await.unwrap();
    let producer =
        Producer::new(ProducerConfig::new(config.clone()).delivery_timeout(Duration::from_secs(3)))
            .unwrap();
    producer
        .send_and_wait(ProducerRecord::new("t", "before"))
        .await
        .unwrap();

    server.stop();
    let started = Instant::now();
    let err = tokio::time::timeout(Duration::from_secs(20), admin.list_topics(false))
        .await
        .expect("admin call hung")
        .unwrap_err();
    assert!(matches!(err, Error::Timeout { .. }), "{err}");
    let err = tokio::time::timeout(
        Duration::from_secs(20),
        producer.send_and_wait(ProducerRecord::new("t", "during")),
    )
    .await
    .expect("produce hung")
    .unwrap_err();
    assert!(matches!(err, Error::Timeout { .. }), "{err}");
    let mut consumer = Consumer::new(ConsumerConfig::new(config.clone())).unwrap();
    consumer.assign(&[TopicPartition::new("t", 0)]).unwrap();
    let err = tokio::time::timeout(
        Duration::from_secs(20),
        consumer.seek_to(&[TopicPartition::new("t", 0)], OffsetSpec::Earliest),
    )
    .await
    .expect("list offsets hung")
    .unwrap_err();
    assert!(matches!(err, Error::Timeout { .. }), "{err}");
    assert!(started.elapsed() < Duration::from_secs(30));

    // And the client recovers once the broker runs again.
    server.signal("-CONT");
    let md = producer
        .send_and_wait(ProducerRecord::new("t", "after"))
        .await
        .unwrap();
    assert!(md.offset >= 1);
}

/// Many small batches of one partition in flight at once: each request carries at most
/// one batch per partition, the batches arrive in sequence order, and every delivery
/// reports its own offset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_batches_of_one_partition_keep_order_and_offsets() {
    let Some(server) = RillServer::start() else {
        return;
    };
    let admin = Admin::new(client(&server)).unwrap();
    admin
        .create_topics(&[NewTopic::new("one", 1)])
        .await
        .unwrap();
    let producer = Producer::new(ProducerConfig::new(client(&server)).batch_size(1024)).unwrap();
    let mut deliveries = Vec::new();
    for i in 0..5000 {
        deliveries.push(
            producer
                .send(ProducerRecord::new("one", format!("{i:0>100}")))
                .await
                .unwrap(),
        );
    }
    for (i, d) in deliveries.into_iter().enumerate() {
        assert_eq!(d.await.unwrap().offset, i as i64);
    }
    producer.close().await.unwrap();
    let records = read_all(client(&server), "one", 1, 5000).await;
    for (i, r) in records.iter().enumerate() {
        assert_eq!(r.offset, i as i64);
        assert_eq!(r.value.as_deref().unwrap(), format!("{i:0>100}").as_bytes());
    }
}
