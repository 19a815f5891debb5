//! Criterion benchmarks of the hot codec paths: the Produce request the broker decodes
//! for every write, the Fetch response it encodes for every read, the Metadata response
//! a client asks for on every refresh, and the record-batch check (header view and
//! CRC32C) that every produced batch goes through before it is stored.
//!
//! Run with `cargo bench -p rill-protocol --bench codec`. Under `cargo test
//! --all-targets` each benchmark runs once, as a smoke test, so the inputs are built
//! small enough to keep that quick.
#![allow(clippy::expect_used)] // benchmark inputs are built here: a failure is a bug in the bench

use std::hint::black_box;

use bytes::{Bytes, BytesMut};
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use rill_protocol::generated::fetch_response::{FetchableTopicResponse, PartitionData};
use rill_protocol::generated::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use rill_protocol::generated::produce_request::{PartitionProduceData, TopicProduceData};
use rill_protocol::generated::{FetchResponse, MetadataResponse, ProduceRequest};
use rill_protocol::records::{CompressionType, RecordBatch, RecordBatchBuilder};
use rill_protocol::{Decodable, Encodable, Uuid};

/// The versions current clients send (librdkafka 2.x and the Java client 3.x both reach
/// these flexible versions).
const PRODUCE_VERSION: i16 = 9;
const FETCH_VERSION: i16 = 12;
const METADATA_VERSION: i16 = 12;

/// An uncompressed batch of `count` records of `value_len` bytes with 8-byte keys, the
/// shape `rill bench produce` sends.
fn batch(count: usize, value_len: usize) -> Bytes {
    let value: Vec<u8> = (0..value_len).map(|i| (i * 31 % 251) as u8).collect();
    let mut b = RecordBatchBuilder::new(CompressionType::None, 0);
    for i in 0..count {
        let key = (i as u64).to_be_bytes();
        b.append(1_700_000_000_000 + i as i64, Some(&key), Some(&value), &[])
            .expect("record fits");
    }
    b.build().expect("batch builds")
}

/// One topic, six partitions, one 64 KiB batch of 1 KiB records each: what a producer
/// with `batch.size` >= 64 KiB sends to a broker leading six partitions.
fn produce_request() -> ProduceRequest {
    let records = batch(62, 1024);
    ProduceRequest {
        transactional_id: None,
        acks: 1,
        timeout_ms: 30_000,
        topic_data: vec![TopicProduceData {
            name: "bench-topic".into(),
            partition_data: (0..6)
                .map(|p| PartitionProduceData {
                    index: p,
                    records: Some(records.clone()),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// One topic, six partitions, 256 KiB of whole batches each: a consumer's fetch with the
/// default `max.partition.fetch.bytes` of 1 MiB that caught up to a busy producer.
fn fetch_response() -> FetchResponse {
    let one = batch(62, 1024);
    let mut records = BytesMut::new();
    for _ in 0..4 {
        records.extend_from_slice(&one);
    }
    let records = records.freeze();
    FetchResponse {
        responses: vec![FetchableTopicResponse {
            topic: "bench-topic".into(),
            topic_id: Uuid::default(),
            partitions: (0..6)
                .map(|p| PartitionData {
                    partition_index: p,
                    high_watermark: 1_000_000,
                    last_stable_offset: 1_000_000,
                    log_start_offset: 0,
                    records: Some(records.clone()),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// One broker, 100 topics of 10 partitions: the answer to a full Metadata refresh of a
/// node with 1,000 partitions.
fn metadata_response() -> MetadataResponse {
    MetadataResponse {
        brokers: vec![MetadataResponseBroker {
            node_id: 1,
            host: "127.0.0.1".into(),
            port: 9092,
            rack: None,
            ..Default::default()
        }],
        cluster_id: Some("rill-bench-cluster".into()),
        controller_id: 1,
        topics: (0..100)
            .map(|t| MetadataResponseTopic {
                name: Some(format!("topic-{t:03}")),
                partitions: (0..10)
                    .map(|p| MetadataResponsePartition {
                        partition_index: p,
                        leader_id: 1,
                        leader_epoch: 3,
                        replica_nodes: vec![1],
                        isr_nodes: vec![1],
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

fn encoded<T: Encodable>(msg: &T, version: i16) -> Bytes {
    let mut buf = BytesMut::with_capacity(msg.encoded_len(version));
    msg.encode(&mut buf, version).expect("encodes");
    buf.freeze()
}

fn bench_codec<T: Encodable + Decodable>(c: &mut Criterion, name: &str, msg: &T, version: i16) {
    let bytes = encoded(msg, version);
    let mut g = c.benchmark_group(name);
    g.throughput(Throughput::Bytes(bytes.len() as u64));
    g.bench_function("encode", |b| {
        b.iter(|| {
            let mut buf = BytesMut::with_capacity(msg.encoded_len(version));
            msg.encode(&mut buf, version).expect("encodes");
            black_box(buf)
        })
    });
    g.bench_function("decode", |b| {
        b.iter(|| {
            let mut buf = bytes.clone();
            black_box(T::decode(&mut buf, version).expect("decodes"))
        })
    });
    g.finish();
}

fn codec(c: &mut Criterion) {
    bench_codec(
        c,
        "produce_request_6x64KiB",
        &produce_request(),
        PRODUCE_VERSION,
    );
    bench_codec(
        c,
        "fetch_response_6x256KiB",
        &fetch_response(),
        FETCH_VERSION,
    );
    bench_codec(
        c,
        "metadata_response_1000_partitions",
        &metadata_response(),
        METADATA_VERSION,
    );
}

/// What the broker does with every produced batch before storing it: split it off the
/// record set (length checks) and validate it (magic, CRC32C over the whole batch, codec,
/// counts). The CRC dominates, so the figure is close to crc32c's bandwidth.
fn batch_validation(c: &mut Criterion) {
    let mut g = c.benchmark_group("batch_validate");
    for (name, count) in [("16KiB", 15), ("1MiB", 1000)] {
        let bytes = batch(count, 1024);
        g.throughput(Throughput::Bytes(bytes.len() as u64));
        g.bench_function(name, |b| {
            b.iter_batched(
                || bytes.clone(),
                |mut set| {
                    let batch = RecordBatch::split_from(&mut set).expect("whole batch");
                    batch.validate().expect("valid batch");
                    black_box(batch.last_offset())
                },
                BatchSize::SmallInput,
            )
        });
    }
    g.finish();
}

criterion_group!(benches, codec, batch_validation);
criterion_main!(benches);
