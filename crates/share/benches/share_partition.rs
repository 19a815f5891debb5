//! Criterion benchmarks of the share-partition's hot path, what every ShareFetch and
//! ShareAcknowledge costs the partition leader beside the log read: acquiring a fetched
//! batch and accepting it (the steady state of a healthy consumer), the same with every
//! other record rejected (acknowledgement types per record, the worst split), and
//! a lock expiry of a whole window of in-flight records.
//!
//! Run with `cargo bench -p rill-share --bench share_partition`. Under
//! `cargo test --all-targets` each benchmark runs once as a smoke test.
#![allow(clippy::expect_used)] // benchmark set-up: a failure is a bug in the bench

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use rill_protocol::Uuid;
use rill_share::{
    AcknowledgeType, AcknowledgementBatch, FetchedBatch, PersistedState, ShareAcquireMode,
    ShareFetch, SharePartition, SharePartitionConfig,
};

/// Records per fetched batch: a 64 KiB batch of 1 KiB records, as `rill bench` sends.
const BATCH: i64 = 62;
/// Batches per ShareFetch: librdkafka's default `max.poll.records` of 500, in whole batches.
const BATCHES_PER_FETCH: i64 = 8;

fn fresh() -> SharePartition {
    let none = PersistedState {
        state_epoch: 0,
        start_offset: -1,
        state_batches: vec![],
    };
    SharePartition::from_persisted(
        "bench",
        Uuid::from_u64_pair(1, 1),
        0,
        SharePartitionConfig::default(),
        0,
        &none,
        0,
    )
    .expect("empty state")
}

/// One fetch's batches from `from`.
fn batches(from: i64) -> Vec<FetchedBatch> {
    (0..BATCHES_PER_FETCH)
        .map(|i| FetchedBatch {
            base_offset: from + i * BATCH,
            last_offset: from + (i + 1) * BATCH - 1,
        })
        .collect()
}

fn acquire_then_accept(c: &mut Criterion, name: &str, per_record: bool) {
    let mut group = c.benchmark_group("share_partition");
    group.throughput(Throughput::Elements((BATCH * BATCHES_PER_FETCH) as u64));
    let mut sp = fresh();
    let mut now = 0i64;
    group.bench_function(name, |b| {
        b.iter(|| {
            now += 1;
            let from = sp.next_fetch_offset();
            let read = batches(from);
            let fetch = ShareFetch {
                fetch_offset: from,
                batches: &read,
                max_records: 500,
                acquire_mode: ShareAcquireMode::BatchOptimized,
                skip: &[],
            };
            let acquired = sp.acquire("member", &fetch, now);
            let acks: Vec<AcknowledgementBatch> = acquired
                .records
                .iter()
                .map(|r| {
                    let n = (r.last_offset - r.first_offset + 1) as usize;
                    AcknowledgementBatch {
                        first_offset: r.first_offset,
                        last_offset: r.last_offset,
                        acknowledge_types: if per_record {
                            // Every other record rejected: the worst split, a run per record.
                            (0..n)
                                .map(|i| {
                                    if i % 2 == 0 {
                                        AcknowledgeType::Accept
                                    } else {
                                        AcknowledgeType::Reject
                                    }
                                })
                                .collect()
                        } else {
                            vec![AcknowledgeType::Accept]
                        },
                    }
                })
                .collect();
            black_box(
                sp.acknowledge("member", &acks, now)
                    .expect("accept what was acquired"),
            );
        })
    });
    group.finish();
}

fn accept_batches(c: &mut Criterion) {
    acquire_then_accept(c, "acquire_accept_500", false);
}

fn accept_records(c: &mut Criterion) {
    acquire_then_accept(c, "acquire_accept_500_per_record", true);
}

/// A full window of in-flight records (the default 2,000 locks) acquired by one fetch per
/// batch, then all of it expiring at once, as when a consumer dies holding them.
fn expire_window(c: &mut Criterion) {
    let mut group = c.benchmark_group("share_partition");
    group.throughput(Throughput::Elements(2_000));
    group.bench_function("expire_2000_in_32_runs", |b| {
        b.iter_batched(
            || {
                let mut sp = fresh();
                for i in 0..32 {
                    let read = [FetchedBatch {
                        base_offset: i * BATCH,
                        last_offset: (i + 1) * BATCH - 1,
                    }];
                    let fetch = ShareFetch {
                        fetch_offset: i * BATCH,
                        batches: &read,
                        max_records: 500,
                        acquire_mode: ShareAcquireMode::BatchOptimized,
                        skip: &[],
                    };
                    // A lock each, one after another: runs that do not join.
                    sp.acquire("member", &fetch, i);
                }
                sp
            },
            |mut sp| black_box(sp.expire(1_000_000)),
            criterion::BatchSize::SmallInput,
        )
    });
    group.finish();
}

criterion_group!(benches, accept_batches, accept_records, expire_window);
criterion_main!(benches);
