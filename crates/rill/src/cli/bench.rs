//! `rill bench`: throughput and latency of `rill-client` against a running cluster, in the
//! spirit of Kafka's `kafka-producer-perf-test`, `kafka-consumer-perf-test` and
//! `EndToEndLatency`, and the machine's own ceilings to compare them with.
//!
//! `produce` and `consume` live here; `e2e` (produce-to-consume latency at a fixed rate),
//! `limits` (loopback TCP, disk and memcpy bandwidth), `txn` (transactions against the
//! idempotent producer, read_committed against read_uncommitted) and `replicated` (acks=all
//! on a three-node cluster, with the brokers' CPU and per-request breakdown) in the
//! submodules.
//!
//! The producer side measures each record from `send` to its delivery acknowledgement,
//! into an HDR histogram (`latency`) printed at the end of the run.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use clap::{Args, Subcommand};
use rill_client::{
    Acks, Admin, AutoOffsetReset, Consumer, ConsumerConfig, NewTopic, OffsetSpec, Producer,
    ProducerConfig, ProducerRecord, TopicPartition,
};
use serde_json::json;

use super::produce::parse_compression;
use super::{print_json, Common};

mod cpu;
mod e2e;
mod latency;
mod limits;
mod replicated;
mod txn;

use latency::{Latencies, LatencySummary};

#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// Send records as fast as allowed; report records/s, MB/s and delivery latency.
    Produce(ProduceBench),
    /// Read a topic from the beginning; report records/s and MB/s.
    Consume(ConsumeBench),
    /// Produce at a fixed rate and consume in the same process; report produce-to-consume
    /// latency measured from each record's intended send time.
    E2e(e2e::E2eBench),
    /// Measure this machine's ceilings: loopback TCP, disk writes (with and without
    /// fdatasync) and memcpy bandwidth.
    Limits(limits::LimitsBench),
    /// A transactional producer committing every N ms against the idempotent producer in
    /// the same run; commit latency; read_committed against read_uncommitted reads.
    Txn(txn::TxnBench),
    /// acks=all on a replicated topic (RF 3, min.insync.replicas 2) of a three-node
    /// cluster it starts or is pointed at: latency, longest stall, Produce requests per
    /// broker CPU-second and the brokers' per-request time breakdown, unbatched and batched.
    Replicated(replicated::ReplicatedBench),
}

#[derive(Args, Debug)]
pub struct ProduceBench {
    #[arg(long)]
    pub topic: String,
    /// Records to send in all.
    #[arg(long, default_value_t = 100_000)]
    pub records: u64,
    /// Bytes of random value per record.
    #[arg(long, default_value_t = 1024)]
    pub record_size: usize,
    /// `acks`: 0, 1 or all.
    #[arg(long, default_value = "1")]
    pub acks: String,
    /// Upper bound on records/s over all producers (none when absent).
    #[arg(long)]
    pub rate: Option<u64>,
    /// Producers (each with its own connections) sharing the records.
    #[arg(long, default_value_t = 1)]
    pub producers: u64,
    #[arg(long, default_value = "none")]
    pub compression: String,
    /// `batch.size` in bytes.
    #[arg(long, default_value_t = 1 << 20)]
    pub batch_size: usize,
    /// `linger.ms`.
    #[arg(long, default_value_t = 5)]
    pub linger_ms: u64,
    /// Partitions of the topic when it has to be created.
    #[arg(long, default_value_t = 6)]
    pub partitions: i32,
}

#[derive(Args, Debug)]
pub struct ConsumeBench {
    #[arg(long)]
    pub topic: String,
    /// Records to read (default: everything up to the end offsets at the start).
    #[arg(long)]
    pub records: Option<u64>,
    /// Read in this consumer group (subscribe) instead of assigning every partition.
    #[arg(long)]
    pub group: Option<String>,
    /// Give up when no record arrives for this long.
    #[arg(long, default_value_t = 30_000)]
    pub idle_timeout_ms: u64,
}

pub async fn run(common: &Common, command: BenchCommand) -> anyhow::Result<()> {
    match command {
        BenchCommand::Produce(args) => produce(common, args).await,
        BenchCommand::Consume(args) => consume(common, args).await,
        BenchCommand::E2e(args) => e2e::run(common, args).await,
        BenchCommand::Limits(args) => limits::run(common, args).await,
        BenchCommand::Txn(args) => txn::run(common, args).await,
        BenchCommand::Replicated(args) => replicated::run(common, args).await,
    }
}

fn parse_acks(s: &str) -> anyhow::Result<Acks> {
    Ok(match s {
        "0" => Acks::None,
        "1" => Acks::Leader,
        "all" | "-1" => Acks::All,
        other => anyhow::bail!("unknown acks {other:?} (0, 1, all)"),
    })
}

/// Counters the progress line reads while the run goes on.
#[derive(Default)]
struct Progress {
    records: AtomicU64,
    bytes: AtomicU64,
}

/// Prints records/s and MB/s of the last second on stderr until aborted.
fn spawn_progress(progress: Arc<Progress>, what: &'static str) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.tick().await;
        let (mut last_records, mut last_bytes) = (0u64, 0u64);
        let mut last = Instant::now();
        loop {
            tick.tick().await;
            let records = progress.records.load(Ordering::Relaxed);
            let bytes = progress.bytes.load(Ordering::Relaxed);
            let secs = last.elapsed().as_secs_f64().max(1e-9);
            eprintln!(
                "{what}: {records} records, {:.0} records/s, {:.2} MB/s",
                (records - last_records) as f64 / secs,
                (bytes - last_bytes) as f64 / secs / 1e6
            );
            (last_records, last_bytes, last) = (records, bytes, Instant::now());
        }
    })
}

/// A buffer of pseudo-random bytes (xorshift) that records are sliced from, so that
/// compression sees data as incompressible as a real random payload.
fn random_pool(len: usize) -> Bytes {
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15 ^ u64::from(std::process::id());
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        out.extend_from_slice(&state.to_le_bytes());
    }
    out.truncate(len);
    Bytes::from(out)
}

/// Creates `topic` with `partitions` unless it exists already, and returns its
/// partitions once the broker the admin client asks knows them.
///
/// In a cluster, CreateTopics answers once the controller has committed the topic; the
/// other brokers learn it a moment later from the metadata log, and one of them may
/// still answer UNKNOWN_TOPIC_OR_PARTITION (as Kafka's brokers do), so that is waited
/// out for up to the request timeout.
async fn ensure_topic(
    common: &Common,
    topic: &str,
    partitions: i32,
) -> anyhow::Result<Vec<TopicPartition>> {
    ensure_new_topic(common, NewTopic::new(topic, partitions)).await
}

/// [`ensure_topic`] with every setting of the topic's creation.
async fn ensure_new_topic(
    common: &Common,
    new_topic: NewTopic,
) -> anyhow::Result<Vec<TopicPartition>> {
    let admin = Admin::new(common.client()?)?;
    let topic = new_topic.name.clone();
    let topic = topic.as_str();
    match admin.create_topics(&[new_topic]).await {
        Ok(()) => {}
        Err(e) if e.code() == Some(rill_protocol::ErrorCode::TOPIC_ALREADY_EXISTS) => {}
        Err(e) => return Err(e).context("creating the topic"),
    }
    let deadline = Instant::now() + Duration::from_millis(common.request_timeout_ms);
    loop {
        match admin.partitions_of(topic).await {
            Ok(found) if !found.is_empty() => return Ok(found),
            Ok(_) | Err(rill_client::Error::UnknownTopic(_)) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Ok(_) => anyhow::bail!("topic {topic} has no partitions"),
            Err(e) => return Err(e).context("describing the topic"),
        }
    }
}

async fn produce(common: &Common, args: ProduceBench) -> anyhow::Result<()> {
    let acks = parse_acks(&args.acks)?;
    let compression = parse_compression(&args.compression)?;
    anyhow::ensure!(args.producers >= 1, "--producers must be at least 1");
    ensure_topic(common, &args.topic, args.partitions).await?;

    const POOL: usize = 1 << 20;
    let pool = random_pool(POOL + args.record_size);
    let progress = Arc::new(Progress::default());
    let reporter = spawn_progress(progress.clone(), "produce");
    let started = Instant::now();
    let cpu_start = cpu::process_cpu();
    let mut workers = Vec::new();
    for w in 0..args.producers {
        let count = args.records / args.producers + u64::from(w < args.records % args.producers);
        let config = ProducerConfig::new(common.client()?)
            .acks(acks)
            .compression(compression)
            .batch_size(args.batch_size)
            .linger(Duration::from_millis(args.linger_ms))
            // Idempotence needs acks=all; other acks are a plain producer, as in Kafka.
            .idempotence(acks == Acks::All);
        let producer = Producer::new(config)?;
        let rate = args.rate.map(|r| r as f64 / args.producers as f64);
        let (topic, size, pool, progress) = (
            args.topic.clone(),
            args.record_size,
            pool.clone(),
            progress.clone(),
        );
        workers.push(tokio::spawn(async move {
            // Deliveries are awaited in send order on their own task, so sending never
            // waits for an answer; with one batch in flight per partition they complete
            // nearly in order, so the latency measured here is the acknowledgement's.
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
            let collector = tokio::spawn({
                let progress = progress.clone();
                async move {
                    let mut latencies = Latencies::new()?;
                    while let Some((sent, delivery)) = rx.recv().await {
                        let delivery: rill_client::DeliveryFuture = delivery;
                        let sent: Instant = sent;
                        delivery.await?;
                        latencies.record(sent.elapsed());
                        progress.records.fetch_add(1, Ordering::Relaxed);
                        progress.bytes.fetch_add(size as u64, Ordering::Relaxed);
                    }
                    anyhow::Ok(latencies)
                }
            });
            let begin = Instant::now();
            let begin_ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as i64);
            for i in 0..count {
                if let Some(rate) = rate {
                    let due = begin + Duration::from_secs_f64(i as f64 / rate);
                    tokio::time::sleep_until(due.into()).await;
                }
                let offset = ((i as usize).wrapping_mul(7919) ^ (w as usize * 104_729)) % POOL;
                let value = pool.slice(offset..offset + size);
                let sent = Instant::now();
                // The create time is the send time, from the clock read the latency needs
                // anyway rather than a second one in the producer.
                let timestamp = begin_ms + sent.duration_since(begin).as_millis() as i64;
                let record = ProducerRecord::new(&topic, value).timestamp(timestamp);
                let delivery = producer.send(record).await?;
                if tx.send((sent, delivery)).is_err() {
                    break;
                }
            }
            drop(tx);
            producer.flush().await?;
            let latencies = collector.await??;
            producer.close().await?;
            anyhow::Ok(latencies)
        }));
    }
    let mut latencies = Latencies::new()?;
    for worker in workers {
        latencies.add(&worker.await??)?;
    }
    let secs = started.elapsed().as_secs_f64().max(1e-9);
    reporter.abort();
    let records = latencies.len();
    let bytes = records * args.record_size as u64;
    let summary = latencies.summary();
    let LatencySummary {
        avg,
        p50,
        p99,
        p999,
        max,
    } = summary;
    let records_per_sec = records as f64 / secs;
    let mb_per_sec = bytes as f64 / secs / 1e6;
    let (cpu_s, cpu_per_gb) = cpu::report(cpu_start, bytes);
    if common.json() {
        print_json(&json!({
            "records": records,
            "record_size": args.record_size,
            "seconds": secs,
            "records_per_sec": records_per_sec,
            "mb_per_sec": mb_per_sec,
            "client_cpu_s": cpu_s,
            "client_cpu_s_per_gb": cpu_per_gb,
            "latency_ms": summary.to_json(),
            "latency_histogram": latencies.table_json(),
        }));
    } else {
        println!(
            "{records} records sent in {secs:.2} s: {records_per_sec:.0} records/s, \
             {mb_per_sec:.2} MB/s; latency avg {avg:.2} ms, p50 {p50:.2} ms, \
             p99 {p99:.2} ms, p99.9 {p999:.2} ms, max {max:.2} ms; \
             this client used {cpu_s:.2} CPU-s ({cpu_per_gb:.2} CPU-s/GB)"
        );
        latencies.print_table("delivery latency");
    }
    Ok(())
}

async fn consume(common: &Common, args: ConsumeBench) -> anyhow::Result<()> {
    let admin = Admin::new(common.client()?)?;
    let partitions = admin.partitions_of(&args.topic).await?;
    anyhow::ensure!(
        !partitions.is_empty(),
        "topic {} has no partitions",
        args.topic
    );
    let target = match args.records {
        Some(n) => n,
        None => records_between(&admin, &partitions, OffsetSpec::Latest).await?,
    };
    let read = read_records(
        common,
        &args.topic,
        &partitions,
        Reader {
            group: args.group.as_deref(),
            target,
            read_committed: false,
            idle: Duration::from_millis(args.idle_timeout_ms),
        },
    )
    .await?;
    let Read {
        records,
        bytes,
        secs,
        cpu_s,
        cpu_per_gb,
    } = read;
    let records_per_sec = records as f64 / secs;
    let mb_per_sec = bytes as f64 / secs / 1e6;
    if common.json() {
        print_json(&json!({
            "records": records,
            "bytes": bytes,
            "seconds": secs,
            "records_per_sec": records_per_sec,
            "mb_per_sec": mb_per_sec,
            "client_cpu_s": cpu_s,
            "client_cpu_s_per_gb": cpu_per_gb,
        }));
    } else {
        println!(
            "{records} records ({bytes} bytes) read in {secs:.2} s: \
             {records_per_sec:.0} records/s, {mb_per_sec:.2} MB/s; \
             this client used {cpu_s:.2} CPU-s ({cpu_per_gb:.2} CPU-s/GB)"
        );
    }
    Ok(())
}

/// The offsets between the partitions' starts and `end` (their ends, or last stable
/// offsets): what reading them all delivers when nothing was compacted or aborted.
async fn records_between(
    admin: &Admin,
    partitions: &[TopicPartition],
    end: OffsetSpec,
) -> anyhow::Result<u64> {
    let start = admin.list_offsets(partitions, OffsetSpec::Earliest).await?;
    let end = admin.list_offsets(partitions, end).await?;
    Ok(end
        .iter()
        .map(|(tp, &e)| (e - start.get(tp).copied().unwrap_or(0)).max(0) as u64)
        .sum())
}

/// How [`read_records`] reads.
struct Reader<'a> {
    /// Subscribe in this group instead of assigning every partition from the start.
    group: Option<&'a str>,
    /// Records to read before stopping.
    target: u64,
    read_committed: bool,
    /// Give up when no record arrives for this long.
    idle: Duration,
}

/// What [`read_records`] read, and what it cost this process.
struct Read {
    records: u64,
    bytes: u64,
    secs: f64,
    cpu_s: f64,
    cpu_per_gb: f64,
}

/// Reads `topic` from the start until `reader.target` records have arrived, printing
/// the rate each second.
async fn read_records(
    common: &Common,
    topic: &str,
    partitions: &[TopicPartition],
    reader: Reader<'_>,
) -> anyhow::Result<Read> {
    let mut config = ConsumerConfig::new(common.client()?)
        .auto_offset_reset(AutoOffsetReset::Earliest)
        .read_committed(reader.read_committed);
    if let Some(group) = reader.group {
        config = config.group_id(group);
    }
    let mut consumer = Consumer::new(config)?;
    if reader.group.is_some() {
        consumer.subscribe(&[topic])?;
    } else {
        consumer.assign(partitions)?;
        consumer.seek_to(partitions, OffsetSpec::Earliest).await?;
    }
    let progress = Arc::new(Progress::default());
    let reporter = spawn_progress(progress.clone(), "consume");
    let started = Instant::now();
    let cpu_start = cpu::process_cpu();
    let (mut records, mut bytes) = (0u64, 0u64);
    let mut last_record = Instant::now();
    let target = reader.target;
    while records < target {
        let batch = consumer.poll(Duration::from_millis(500)).await?;
        if batch.is_empty() {
            if last_record.elapsed() > reader.idle {
                reporter.abort();
                anyhow::bail!(
                    "no record for {:?} after {records} of {target} records",
                    reader.idle
                );
            }
            continue;
        }
        last_record = Instant::now();
        for r in &batch {
            bytes += (r.value.as_ref().map_or(0, Bytes::len) + r.key.as_ref().map_or(0, Bytes::len))
                as u64;
        }
        records += batch.len() as u64;
        progress.records.store(records, Ordering::Relaxed);
        progress.bytes.store(bytes, Ordering::Relaxed);
    }
    let secs = started.elapsed().as_secs_f64().max(1e-9);
    reporter.abort();
    consumer.close().await?;
    let (cpu_s, cpu_per_gb) = cpu::report(cpu_start, bytes);
    Ok(Read {
        records,
        bytes,
        secs,
        cpu_s,
        cpu_per_gb,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acks_names() {
        assert_eq!(parse_acks("all").ok(), Some(Acks::All));
        assert_eq!(parse_acks("0").ok(), Some(Acks::None));
        assert!(parse_acks("2").is_err());
    }
}
