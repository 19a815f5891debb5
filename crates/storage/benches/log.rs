//! Criterion benchmarks of the partition log's data path: a producer's 64 KiB batch
//! appended as leader (validation, offset assignment, the write to the page cache, index
//! upkeep; no fsync, as with Kafka's default `flush.messages`), and reads by offset, both
//! as bytes (the TLS path) and as a file range (the sendfile path); and the open of a log
//! after a kill -9, from the last roll's producer snapshot and, as before snapshots were
//! taken at rolls, by reading every batch header.
//!
//! Run with `cargo bench -p rill-storage --bench log`. The logs live in temporary
//! directories under the system's temp dir, so the append figure is the page cache's
//! speed on this machine, not the device's. Under `cargo test --all-targets` each
//! benchmark runs once as a smoke test.
#![allow(clippy::expect_used)] // benchmark set-up: a failure is a bug in the bench

use std::hint::black_box;
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use rill_protocol::records::{CompressionType, RecordBatchBuilder};
use rill_storage::{AppendOrigin, LogConfig, MessageTimestampType, PreviousShutdown, UnifiedLog};

const NOW_MS: i64 = 1_700_000_000_000;

/// Appends to one log before it is thrown away and a fresh one opened (outside the
/// timed part): 256 MiB of 64 KiB batches, so that a long measurement neither rolls a
/// segment (a roll fsyncs, which is not what this measures) nor fills the disk.
const APPENDS_PER_LOG: u64 = 4096;

/// 62 records of 1 KiB with 8-byte keys: one 64 KiB batch as `rill bench produce` sends.
fn batch_64k() -> Bytes {
    let value: Vec<u8> = (0..1024).map(|i| (i * 31 % 251) as u8).collect();
    let mut b = RecordBatchBuilder::new(CompressionType::None, 0);
    for i in 0..62u64 {
        b.append(NOW_MS + i as i64, Some(&i.to_be_bytes()), Some(&value), &[])
            .expect("record fits");
    }
    b.build().expect("batch builds")
}

fn append(c: &mut Criterion) {
    let records = batch_64k();
    let mut g = c.benchmark_group("log_append");
    g.throughput(Throughput::Bytes(records.len() as u64));
    // CreateTime: the header is rewritten without touching the CRC. LogAppendTime: the
    // header's new timestamp changes the CRC, so the batch is read once more to recompute it.
    let log_append_time = LogConfig {
        message_timestamp_type: MessageTimestampType::LogAppendTime,
        ..LogConfig::default()
    };
    for (name, config) in [
        ("64KiB_batch_as_leader", LogConfig::default()),
        ("64KiB_batch_as_leader_log_append_time", log_append_time),
    ] {
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let mut elapsed = Duration::ZERO;
                let mut left = iters;
                while left > 0 {
                    let dir = tempfile::tempdir().expect("tempdir");
                    let mut log = UnifiedLog::open(
                        dir.path(),
                        config.clone(),
                        NOW_MS,
                        PreviousShutdown::Unclean,
                    )
                    .expect("opens");
                    let n = left.min(APPENDS_PER_LOG);
                    let start = Instant::now();
                    for _ in 0..n {
                        let info = log
                            .append_as_leader(records.clone(), 0, AppendOrigin::Client, NOW_MS)
                            .expect("appends");
                        black_box(info.last_offset);
                    }
                    elapsed += start.elapsed();
                    left -= n;
                }
                elapsed
            })
        });
    }
    g.finish();
}

fn read(c: &mut Criterion) {
    // 16 MiB of 64 KiB batches; reads of up to 1 MiB (a consumer's
    // max.partition.fetch.bytes) starting at offsets spread over the log.
    let records = batch_64k();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut log = UnifiedLog::open(
        dir.path(),
        LogConfig::default(),
        NOW_MS,
        PreviousShutdown::Unclean,
    )
    .expect("opens");
    for _ in 0..256 {
        log.append_as_leader(records.clone(), 0, AppendOrigin::Client, NOW_MS)
            .expect("appends");
    }
    let end = log.log_end_offset();
    log.update_high_watermark(end);
    let step = end / 97;
    // Whole batches up to 1 MiB: 15 of them, so that is the throughput's unit.
    let returned = log
        .read(0, 1 << 20, end, true)
        .expect("reads")
        .records
        .len();
    let mut g = c.benchmark_group("log_read");
    g.throughput(Throughput::Bytes(returned as u64));
    for (name, zero_copy) in [("1MiB_as_bytes", false), ("1MiB_as_file_range", true)] {
        let mut next = 0i64;
        g.bench_function(name, |b| {
            b.iter(|| {
                // Start inside a batch, as a consumer resuming after a partial batch does.
                next = (next + step) % (end - 1024);
                let info = if zero_copy {
                    log.read_file_range(next, 1 << 20, end, true)
                } else {
                    log.read(next, 1 << 20, end, true)
                }
                .expect("reads");
                black_box(info)
            })
        });
    }
    g.finish();
}

/// Opens after a kill -9 of a log of 32 segments of 1 MiB, each holding about 5,000
/// small batches of an idempotent producer: from the last roll's snapshot (the headers
/// of the active segment only) against every header of the log (the snapshots removed,
/// which is what every unclean open did before rolls took snapshots).
fn recovery(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = LogConfig {
        segment_bytes: 1 << 20,
        ..LogConfig::default()
    };
    {
        let mut log = UnifiedLog::open(
            dir.path(),
            config.clone(),
            NOW_MS,
            PreviousShutdown::Unclean,
        )
        .expect("opens");
        let mut seq = 0i32;
        while log.segment_base_offsets().len() < 33 {
            let mut b = RecordBatchBuilder::new(CompressionType::None, 0).producer(1, 0, seq);
            b.append(NOW_MS, Some(b"key"), Some(&[7u8; 100]), &[])
                .expect("record fits");
            log.append_as_leader(
                b.build().expect("batch builds"),
                0,
                AppendOrigin::Client,
                NOW_MS,
            )
            .expect("appends");
            seq += 1;
            if seq % 1000 == 0 {
                let end = log.log_end_offset();
                log.update_high_watermark(end);
            }
        }
        // Dropped without close: a kill -9.
    }
    let snapshots: Vec<(std::path::PathBuf, Vec<u8>)> = std::fs::read_dir(dir.path())
        .expect("lists")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "snapshot"))
        .map(|p| {
            let bytes = std::fs::read(&p).expect("reads");
            (p, bytes)
        })
        .collect();
    assert!(!snapshots.is_empty(), "the rolls took snapshots");
    let mut g = c.benchmark_group("log_recovery");
    g.sample_size(10);
    for (name, from_snapshot) in [
        ("unclean_open_32x1MiB_from_roll_snapshot", true),
        ("unclean_open_32x1MiB_every_header", false),
    ] {
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let mut elapsed = Duration::ZERO;
                for _ in 0..iters {
                    for (path, bytes) in &snapshots {
                        if from_snapshot {
                            std::fs::write(path, bytes).expect("writes");
                        } else {
                            let _ = std::fs::remove_file(path);
                        }
                    }
                    let start = Instant::now();
                    let log = UnifiedLog::open(
                        dir.path(),
                        config.clone(),
                        NOW_MS,
                        PreviousShutdown::Unclean,
                    )
                    .expect("opens");
                    elapsed += start.elapsed();
                    black_box(log.log_end_offset());
                }
                elapsed
            })
        });
    }
    g.finish();
}

criterion_group!(benches, append, read, recovery);
criterion_main!(benches);
