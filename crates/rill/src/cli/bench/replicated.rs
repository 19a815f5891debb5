//! `rill bench replicated`: the replicated write path of issue #25, acks=all on a topic
//! with replication factor 3 and `min.insync.replicas=2`, on a three-node cluster this
//! command starts (or one it is pointed at with `--bootstrap-server` and `--metrics`).
//!
//! How it measures:
//! 1. Two phases, each open loop at a fixed offered rate: *unbatched* (`linger.ms=0` and a
//!    `batch.size` that holds one record, so one record per partition per Produce request)
//!    and *batched* (a MB/s rate, `linger.ms=5`, 1 MiB batches).
//! 2. Record `i` of a phase is due at `start + i / rate`; its latency runs from its due
//!    time to its acknowledgement, so a stall delays everything queued behind it instead
//!    of lowering the offered rate (coordinated omission, as `bench e2e` explains).
//! 3. The longest stall is the longest time an acknowledgement kept a record waiting past
//!    both its due time and the acknowledgement before it: how long the producer saw
//!    nothing complete while it had something due.
//! 4. Every node's `/metrics` page is read before and after each phase: the differences
//!    give the Produce requests the leaders answered, the Fetch requests they served, the
//!    CPU seconds each process used (`process_cpu_seconds_total`, utime + stime), and the
//!    per-request breakdown (Kafka's RequestMetrics: request queue, local, remote,
//!    response queue, send, total) as means and bucket-bound p99s summed over the nodes.
//!
//! 5. For nodes it started, each node's context switches (voluntary and not, from
//!    `/proc/<pid>/task/*/status`) before and after: per Produce request, the thread
//!    wake-ups that most of an unbatched request's CPU goes to (BENCHMARKS.md, #25).
//!
//! Requests per broker CPU-second (Produce requests over the CPU seconds of all three
//! nodes together) is the figure that resists a busy machine: it counts work done per
//! unit of CPU, not per unit of wall time.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use rill_client::{Acks, NewTopic, Producer, ProducerConfig, ProducerRecord};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{ensure_new_topic, random_pool, Latencies, LatencySummary};
use crate::cli::{print_json, Common};

/// Batch overhead (the batch header and one record's framing, with room to spare) that
/// the unbatched phase's `batch.size` adds to a record, so that a second record never fits.
const ONE_RECORD_SLACK_BYTES: usize = 128;

/// How long the started nodes get to become ready.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// The stages of a request, by their metric names, as the breakdown prints them.
const STAGES: [(&str, &str); 6] = [
    (
        "request_queue",
        "kafka_network_requestmetrics_request_queue_time_seconds",
    ),
    ("local", "kafka_network_requestmetrics_local_time_seconds"),
    ("remote", "kafka_network_requestmetrics_remote_time_seconds"),
    (
        "response_queue",
        "kafka_network_requestmetrics_response_queue_time_seconds",
    ),
    (
        "send",
        "kafka_network_requestmetrics_response_send_time_seconds",
    ),
    ("total", "kafka_network_requestmetrics_total_time_seconds"),
];

#[derive(Args, Debug)]
pub struct ReplicatedBench {
    /// HTTP listeners (host:port) of the brokers of the cluster at --bootstrap-server, one
    /// per node, comma-separated. Without them three nodes are started here.
    #[arg(long, value_delimiter = ',')]
    pub metrics: Vec<String>,
    /// Where started nodes keep their data and logs (default: a new directory in the
    /// system's temporary directory, removed at the end).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Topic to write (created with replication factor 3 and min.insync.replicas=2).
    #[arg(long, default_value = "bench-replicated")]
    pub topic: String,
    /// Partitions of the topic when it has to be created (3: one led by each node).
    #[arg(long, default_value_t = 3)]
    pub partitions: i32,
    /// A broker config of each node started here, `key=value`; repeatable (a sustained
    /// run wants `log.retention.check.interval.ms` short enough to keep the disk from
    /// filling).
    #[arg(long = "node-config", value_name = "KEY=VALUE")]
    pub node_configs: Vec<String>,
    /// A config of the topic when it is created here, `key=value`; repeatable (a
    /// sustained run wants `retention.bytes` and `segment.bytes` that fit the disk).
    #[arg(long = "topic-config", value_name = "KEY=VALUE")]
    pub topic_configs: Vec<String>,
    /// Bytes of random value per record.
    #[arg(long, default_value_t = 1024)]
    pub record_size: usize,
    /// Records/s offered one record per request; 0 skips the phase.
    #[arg(long, default_value_t = 2000)]
    pub unbatched_rate: u64,
    /// MB/s offered in batches; 0 skips the phase.
    #[arg(long, default_value_t = 20.0)]
    pub batched_mb_per_sec: f64,
    /// `linger.ms` of the batched phase.
    #[arg(long, default_value_t = 5)]
    pub batched_linger_ms: u64,
    /// Seconds of sending per phase.
    #[arg(long, default_value_t = 30.0)]
    pub duration: f64,
    /// Seconds of the sustained phase (0 skips it): batched acks=all produce as fast as
    /// the cluster takes it, reported per `--bulk-interval` so that a fall as the page
    /// cache's writeback grows shows (issue #25).
    #[arg(long, default_value_t = 0.0)]
    pub bulk_duration: f64,
    /// Seconds per line of the sustained phase's report.
    #[arg(long, default_value_t = 60.0)]
    pub bulk_interval: f64,
}

/// One phase's producer settings.
struct Phase {
    name: &'static str,
    records_per_sec: f64,
    linger: Duration,
    batch_size: usize,
}

pub async fn run(common: &Common, args: ReplicatedBench) -> anyhow::Result<()> {
    anyhow::ensure!(args.duration > 0.0, "--duration must be positive");
    anyhow::ensure!(args.record_size > 0, "--record-size must be positive");
    let mut started = if args.metrics.is_empty() {
        Some(StartedCluster::start(
            args.data_dir.clone(),
            &args.node_configs,
        )?)
    } else {
        None
    };
    let measured = measure(common, &args, started.as_ref()).await;
    if measured.is_err() {
        // The nodes' logs say what went wrong on their side: kept rather than removed.
        if let Some(dir) = started.as_mut().and_then(|c| c.remove.take()) {
            eprintln!("the nodes' logs are kept in {}", dir.display());
        }
    }
    drop(started);
    measured
}

/// Everything after the start: the topic, the phases and the report.
async fn measure(
    common: &Common,
    args: &ReplicatedBench,
    started: Option<&StartedCluster>,
) -> anyhow::Result<()> {
    let pids: Vec<u32> = started
        .as_ref()
        .map(|c| c.children.iter().map(Child::id).collect())
        .unwrap_or_default();
    let (common, http) = match started {
        Some(c) => {
            c.wait_ready().await?;
            let mut common = common.clone();
            common.bootstrap_server = c.bootstrap.clone();
            (common, c.http.clone())
        }
        None => (common.clone(), args.metrics.clone()),
    };
    let mut topic = NewTopic::new(&args.topic, args.partitions)
        .replication_factor(3)
        .config("min.insync.replicas", "2");
    for kv in &args.topic_configs {
        let (key, value) = kv
            .split_once('=')
            .ok_or_else(|| anyhow::anyhow!("--topic-config {kv:?}: expected key=value"))?;
        topic = topic.config(key.trim(), value.trim());
    }
    ensure_new_topic(&common, topic).await?;
    let mut phases = Vec::new();
    if args.unbatched_rate > 0 {
        phases.push(Phase {
            name: "unbatched",
            records_per_sec: args.unbatched_rate as f64,
            linger: Duration::ZERO,
            batch_size: args.record_size + ONE_RECORD_SLACK_BYTES,
        });
    }
    if args.batched_mb_per_sec > 0.0 {
        phases.push(Phase {
            name: "batched",
            records_per_sec: args.batched_mb_per_sec * 1e6 / args.record_size as f64,
            linger: Duration::from_millis(args.batched_linger_ms),
            batch_size: 1 << 20,
        });
    }
    let mut reports = Vec::new();
    for phase in &phases {
        let report = run_phase(&common, args, phase, &http, &pids).await?;
        if !common.json() {
            report.print();
        }
        reports.push(report.to_json());
    }
    let mut bulk = Vec::new();
    if args.bulk_duration > 0.0 {
        bulk = run_bulk(&common, args, &http).await?;
    }
    if common.json() {
        print_json(&json!({ "phases": reports, "bulk": bulk }));
    }
    Ok(())
}

/// What one phase measured.
struct PhaseReport {
    name: &'static str,
    offered_per_sec: f64,
    records: u64,
    seconds: f64,
    latency: LatencySummary,
    longest_stall_ms: f64,
    /// When the longest stall ended, in seconds from the phase's start.
    longest_stall_end_s: f64,
    produce_requests: f64,
    fetch_requests: f64,
    broker_cpu_s: f64,
    /// Each node's CPU seconds and Produce requests, in the order of the metrics
    /// addresses.
    node_cpu_s: Vec<f64>,
    node_produce_requests: Vec<f64>,
    /// Each started node's context switches (empty for a cluster not started here).
    node_context_switches: Vec<u64>,
    /// (stage, mean ms, p99 bucket bound ms) of Produce requests, over every node.
    breakdown: Vec<(&'static str, f64, f64)>,
}

impl PhaseReport {
    fn requests_per_cpu_s(&self) -> f64 {
        self.produce_requests / self.broker_cpu_s.max(1e-9)
    }

    fn context_switches(&self) -> u64 {
        self.node_context_switches.iter().sum()
    }

    fn print(&self) {
        let LatencySummary {
            p50,
            p99,
            p999,
            max,
            ..
        } = self.latency;
        println!(
            "{}: {} records in {:.1} s at {:.0}/s offered ({:.0}/s delivered); acks=all latency \
             p50 {p50:.2} ms, p99 {p99:.2} ms, p99.9 {p999:.2} ms, max {max:.2} ms; \
             longest stall {:.1} ms (ended {:.1} s in)",
            self.name,
            self.records,
            self.seconds,
            self.offered_per_sec,
            self.records as f64 / self.seconds.max(1e-9),
            self.longest_stall_ms,
            self.longest_stall_end_s,
        );
        let cpus: Vec<String> = self.node_cpu_s.iter().map(|c| format!("{c:.2}")).collect();
        let led: Vec<String> = self
            .node_produce_requests
            .iter()
            .map(|c| format!("{c:.0}"))
            .collect();
        println!(
            "  {:.0} Produce requests ({}; {:.2} records each), {:.0} Fetch requests; brokers \
             used {:.2} CPU-s ({}): {:.0} Produce requests per broker CPU-second",
            self.produce_requests,
            led.join(" + "),
            self.records as f64 / self.produce_requests.max(1.0),
            self.fetch_requests,
            self.broker_cpu_s,
            cpus.join(" + "),
            self.requests_per_cpu_s(),
        );
        if !self.node_context_switches.is_empty() {
            let each: Vec<String> = self
                .node_context_switches
                .iter()
                .map(u64::to_string)
                .collect();
            println!(
                "  brokers switched context {} times ({}): {:.2} per Produce request",
                self.context_switches(),
                each.join(" + "),
                self.context_switches() as f64 / self.produce_requests.max(1.0),
            );
        }
        println!("  Produce on the leaders, mean / p99 (bucket bound), ms:");
        for (stage, mean, p99) in &self.breakdown {
            println!("    {stage:<15} {mean:>9.3} {p99:>9.3}");
        }
    }

    fn to_json(&self) -> serde_json::Value {
        let breakdown: serde_json::Map<String, serde_json::Value> = self
            .breakdown
            .iter()
            .map(|(s, mean, p99)| (s.to_string(), json!({ "mean_ms": mean, "p99_ms": p99 })))
            .collect();
        json!({
            "phase": self.name,
            "offered_records_per_sec": self.offered_per_sec,
            "records": self.records,
            "seconds": self.seconds,
            "latency_ms": self.latency.to_json(),
            "longest_stall_ms": self.longest_stall_ms,
            "longest_stall_end_s": self.longest_stall_end_s,
            "produce_requests": self.produce_requests,
            "fetch_requests": self.fetch_requests,
            "broker_cpu_s": self.broker_cpu_s,
            "node_cpu_s": self.node_cpu_s,
            "node_produce_requests": self.node_produce_requests,
            "produce_requests_per_broker_cpu_s": self.requests_per_cpu_s(),
            "node_context_switches": self.node_context_switches,
            "produce_breakdown": breakdown,
        })
    }
}

async fn run_phase(
    common: &Common,
    args: &ReplicatedBench,
    phase: &Phase,
    http: &[String],
    pids: &[u32],
) -> anyhow::Result<PhaseReport> {
    let count = (phase.records_per_sec * args.duration).ceil() as u64;
    let config = ProducerConfig::new(common.client()?)
        .acks(Acks::All)
        .idempotence(true)
        .linger(phase.linger)
        .batch_size(phase.batch_size);
    let producer = Producer::new(config)?;
    // One record first, so that metadata and the producer id are fetched before the clock
    // and the scrapes start.
    producer
        .send(ProducerRecord::new(
            &args.topic,
            bytes::Bytes::from_static(b"warm-up"),
        ))
        .await?
        .await?;
    const POOL: usize = 1 << 20;
    let pool = random_pool(POOL + args.record_size);
    let before = scrape_all(http).await?;
    let switches_before: Vec<Option<u64>> = pids.iter().map(|p| context_switches(*p)).collect();
    let (tx, mut rx) =
        tokio::sync::mpsc::unbounded_channel::<(Instant, rill_client::DeliveryFuture)>();
    // Deliveries complete in send order per partition and nearly so across them; they are
    // awaited in send order, so each is timed when it and every earlier one are done.
    let collector = tokio::spawn(async move {
        let mut latencies = Latencies::new()?;
        let mut last_ack: Option<Instant> = None;
        let mut stall = Duration::ZERO;
        // When the longest stall ended, from the phase's start.
        let mut stall_end: Option<Instant> = None;
        while let Some((due, delivery)) = rx.recv().await {
            delivery.await?;
            let now = Instant::now();
            latencies.record(now.saturating_duration_since(due));
            let waiting_since = last_ack.map_or(due, |l| l.max(due));
            let waited = now.saturating_duration_since(waiting_since);
            if waited > stall {
                stall = waited;
                stall_end = Some(now);
            }
            last_ack = Some(now);
        }
        anyhow::Ok((latencies, stall, stall_end))
    });
    let begin = Instant::now();
    for i in 0..count {
        let due = begin + Duration::from_secs_f64(i as f64 / phase.records_per_sec);
        tokio::time::sleep_until(due.into()).await;
        let offset = (i as usize).wrapping_mul(7919) % POOL;
        let value = pool.slice(offset..offset + args.record_size);
        let delivery = producer
            .send(ProducerRecord::new(&args.topic, value))
            .await?;
        if tx.send((due, delivery)).is_err() {
            break;
        }
    }
    drop(tx);
    producer.flush().await?;
    let (latencies, stall, stall_end) = collector.await??;
    let seconds = begin.elapsed().as_secs_f64();
    let after = scrape_all(http).await?;
    // A node whose status cannot be read (it exited) leaves the figure out altogether
    // rather than undercounting it.
    let node_context_switches: Vec<u64> = pids
        .iter()
        .zip(&switches_before)
        .map(|(p, before)| Some(context_switches(*p)?.saturating_sub((*before)?)))
        .collect::<Option<_>>()
        .unwrap_or_default();
    producer.close().await?;

    let produce = [("request", "Produce")];
    let per_node = |name: &str, labels: &[(&str, &str)]| -> Vec<f64> {
        before
            .iter()
            .zip(&after)
            .map(|(b, a)| sum_of(a, name, labels) - sum_of(b, name, labels))
            .collect()
    };
    let node_cpu_s = per_node("process_cpu_seconds_total", &[]);
    let node_produce_requests = per_node("kafka_network_requestmetrics_requests_total", &produce);
    let breakdown = STAGES
        .iter()
        .map(|(stage, name)| {
            let n: f64 = per_node(&format!("{name}_count"), &produce).iter().sum();
            let sum: f64 = per_node(&format!("{name}_sum"), &produce).iter().sum();
            let mean_ms = sum / n.max(1.0) * 1e3;
            let p99_ms = bucket_quantile(&before, &after, name, 0.99) * 1e3;
            (*stage, mean_ms, p99_ms)
        })
        .collect();
    Ok(PhaseReport {
        name: phase.name,
        offered_per_sec: phase.records_per_sec,
        records: latencies.len(),
        seconds,
        latency: latencies.summary(),
        longest_stall_ms: stall.as_secs_f64() * 1e3,
        longest_stall_end_s: stall_end.map_or(0.0, |e| e.duration_since(begin).as_secs_f64()),
        produce_requests: node_produce_requests.iter().sum(),
        fetch_requests: per_node(
            "kafka_network_requestmetrics_requests_total",
            &[("request", "Fetch")],
        )
        .iter()
        .sum(),
        broker_cpu_s: node_cpu_s.iter().sum(),
        node_cpu_s,
        node_produce_requests,
        node_context_switches,
        breakdown,
    })
}

/// A process's context switches so far, voluntary (a thread waited: for a socket, a
/// lock, a worker's park) and not (its time slice ran out), summed over its threads'
/// `/proc/<pid>/task/<tid>/status` (the process's own status counts its first thread
/// only). A thread that has exited is no longer counted: tokio's blocking threads come
/// and go, the workers stay.
fn context_switches(pid: u32) -> Option<u64> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut total = 0;
    for task in tasks.flatten() {
        let Ok(status) = std::fs::read_to_string(task.path().join("status")) else {
            continue;
        };
        total += parse_context_switches(&status).unwrap_or(0);
    }
    Some(total)
}

fn parse_context_switches(status: &str) -> Option<u64> {
    let field = |key: &str| -> Option<u64> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))?
            .trim()
            .parse()
            .ok()
    };
    Some(field("voluntary_ctxt_switches:")? + field("nonvoluntary_ctxt_switches:")?)
}

/// The sustained phase: one producer (`linger.ms=5`, 1 MiB batches, acks=all) sends
/// as fast as `buffer.memory` lets it for `--bulk-duration` seconds; every
/// `--bulk-interval` a line gives the MB/s acknowledged in it, the brokers' CPU seconds
/// per GB, the machine's user, system and iowait CPU seconds per GB (the kernel's
/// writeback threads are not the brokers'), and the page cache's dirty and writeback
/// bytes at its end.
async fn run_bulk(
    common: &Common,
    args: &ReplicatedBench,
    http: &[String],
) -> anyhow::Result<Vec<serde_json::Value>> {
    anyhow::ensure!(args.bulk_interval > 0.0, "--bulk-interval must be positive");
    let config = ProducerConfig::new(common.client()?)
        .acks(Acks::All)
        .idempotence(true)
        .linger(Duration::from_millis(args.batched_linger_ms))
        .batch_size(1 << 20);
    let producer = Producer::new(config)?;
    const POOL: usize = 1 << 20;
    let pool = random_pool(POOL + args.record_size);
    let acked = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let (tx, mut rx) = tokio::sync::mpsc::channel::<rill_client::DeliveryFuture>(1 << 16);
    let counter = acked.clone();
    let record_size = args.record_size as u64;
    let collector = tokio::spawn(async move {
        while let Some(delivery) = rx.recv().await {
            delivery.await?;
            counter.fetch_add(record_size, std::sync::atomic::Ordering::Relaxed);
        }
        anyhow::Ok(())
    });
    let topic = args.topic.clone();
    let size = args.record_size;
    let sender = tokio::spawn(async move {
        let mut i = 0usize;
        loop {
            let offset = i.wrapping_mul(7919) % POOL;
            i += 1;
            let value = pool.slice(offset..offset + size);
            let delivery = producer.send(ProducerRecord::new(&topic, value)).await?;
            if tx.send(delivery).await.is_err() {
                break;
            }
        }
        anyhow::Ok(producer)
    });
    let begin = Instant::now();
    let end = begin + Duration::from_secs_f64(args.bulk_duration);
    let mut lines = Vec::new();
    let mut last = (
        Instant::now(),
        0u64,
        scrape_all(http).await?,
        MachineCpu::read(),
    );
    while Instant::now() < end {
        let next = (last.0 + Duration::from_secs_f64(args.bulk_interval)).min(end);
        tokio::time::sleep_until(next.into()).await;
        anyhow::ensure!(!sender.is_finished(), "the bulk producer stopped");
        let now = (
            Instant::now(),
            acked.load(std::sync::atomic::Ordering::Relaxed),
            scrape_all(http).await?,
            MachineCpu::read(),
        );
        let seconds = now.0.duration_since(last.0).as_secs_f64();
        let gb = (now.1 - last.1) as f64 / 1e9;
        let cpu: f64 = now
            .2
            .iter()
            .zip(&last.2)
            .map(|(a, b)| {
                sum_of(a, "process_cpu_seconds_total", &[])
                    - sum_of(b, "process_cpu_seconds_total", &[])
            })
            .sum();
        let machine = now.3.since(&last.3);
        let (dirty, writeback) = page_cache_dirty();
        let per_gb = |v: f64| if gb > 0.0 { v / gb } else { f64::NAN };
        let line = json!({
            "from_s": last.0.duration_since(begin).as_secs_f64(),
            "to_s": now.0.duration_since(begin).as_secs_f64(),
            "mb_per_sec": gb * 1e3 / seconds,
            "broker_cpu_s_per_gb": per_gb(cpu),
            "machine_user_s_per_gb": per_gb(machine.user),
            "machine_system_s_per_gb": per_gb(machine.system),
            "machine_iowait_s_per_gb": per_gb(machine.iowait),
            "dirty_mb": dirty / 1e6,
            "writeback_mb": writeback / 1e6,
        });
        if !common.json() {
            println!(
                "bulk {:>5.0}-{:<5.0} s: {:>7.1} MB/s acknowledged; per GB: brokers {:.2} CPU-s, \
                 machine user {:.2} / system {:.2} / iowait {:.2} s; dirty {:.0} MB, \
                 writeback {:.0} MB",
                last.0.duration_since(begin).as_secs_f64(),
                now.0.duration_since(begin).as_secs_f64(),
                gb * 1e3 / seconds,
                per_gb(cpu),
                per_gb(machine.user),
                per_gb(machine.system),
                per_gb(machine.iowait),
                dirty / 1e6,
                writeback / 1e6,
            );
        }
        lines.push(line);
        last = now;
    }
    sender.abort();
    let _ = sender.await;
    let _ = collector.await;
    Ok(lines)
}

/// The machine's CPU seconds by kind, from `/proc/stat` (zero where it cannot be read).
#[derive(Default)]
struct MachineCpu {
    user: f64,
    system: f64,
    iowait: f64,
}

impl MachineCpu {
    fn read() -> Self {
        let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        Self::parse(&stat)
    }

    /// `cpu  user nice system idle iowait irq softirq ...` in USER_HZ ticks (100 a second
    /// on Linux).
    fn parse(stat: &str) -> Self {
        let ticks: Vec<f64> = stat
            .lines()
            .find(|l| l.starts_with("cpu "))
            .map(|l| {
                l.split_whitespace()
                    .skip(1)
                    .filter_map(|v| v.parse().ok())
                    .collect()
            })
            .unwrap_or_default();
        let at = |i: usize| ticks.get(i).copied().unwrap_or(0.0) / 100.0;
        Self {
            user: at(0) + at(1),
            system: at(2) + at(5) + at(6),
            iowait: at(4),
        }
    }

    fn since(&self, earlier: &Self) -> Self {
        Self {
            user: self.user - earlier.user,
            system: self.system - earlier.system,
            iowait: self.iowait - earlier.iowait,
        }
    }
}

/// The page cache's `Dirty` and `Writeback` bytes, from `/proc/meminfo`.
fn page_cache_dirty() -> (f64, f64) {
    let info = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let kb = |key: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
            * 1024.0
    };
    (kb("Dirty:"), kb("Writeback:"))
}

/// One node's page as (series name, labels, value).
type Page = Vec<(String, String, f64)>;

async fn scrape_all(http: &[String]) -> anyhow::Result<Vec<Page>> {
    let mut pages = Vec::with_capacity(http.len());
    for address in http {
        let (status, body) = http_get(address, "/metrics").await?;
        anyhow::ensure!(status == 200, "GET {address}/metrics answered {status}");
        pages.push(parse_page(&body));
    }
    Ok(pages)
}

/// The samples of an OpenMetrics page (comments and malformed lines skipped).
fn parse_page(body: &str) -> Page {
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let value: f64 = value.parse().ok()?;
            let (name, labels) = match series.split_once('{') {
                Some((n, rest)) => (n, rest.trim_end_matches('}')),
                None => (series, ""),
            };
            Some((name.to_string(), labels.to_string(), value))
        })
        .collect()
}

/// The sum of the samples of `name` whose labels include every one of `labels`.
fn sum_of(page: &Page, name: &str, labels: &[(&str, &str)]) -> f64 {
    page.iter()
        .filter(|(n, l, _)| n == name && labels.iter().all(|(k, v)| has_label(l, k, v)))
        .map(|(_, _, v)| v)
        .sum()
}

fn has_label(labels: &str, key: &str, value: &str) -> bool {
    labels
        .split(',')
        .any(|kv| kv.split_once('=') == Some((key, &format!("\"{value}\""))))
}

/// The upper bound (seconds) of the bucket holding quantile `q` of the Produce requests
/// observed between the two scrapes in histogram `name`, over every node.
fn bucket_quantile(before: &[Page], after: &[Page], name: &str, q: f64) -> f64 {
    let bucket = format!("{name}_bucket");
    let mut cumulative: BTreeMap<u64, f64> = BTreeMap::new();
    for (b, a) in before.iter().zip(after) {
        for (n, labels, value) in a {
            if *n != bucket || !has_label(labels, "request", "Produce") {
                continue;
            }
            let Some(le) = labels
                .split(',')
                .find_map(|kv| kv.strip_prefix("le=\""))
                .map(|v| v.trim_end_matches('"'))
            else {
                continue;
            };
            let bound = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().unwrap_or(f64::INFINITY)
            };
            let earlier = b
                .iter()
                .find(|(bn, bl, _)| bn == n && bl == labels)
                .map_or(0.0, |s| s.2);
            *cumulative.entry(bound.to_bits()).or_default() += value - earlier;
        }
    }
    // Positive floats order as their bits do.
    let total = cumulative.values().last().copied().unwrap_or(0.0);
    if total <= 0.0 {
        return 0.0;
    }
    cumulative
        .iter()
        .find(|(_, c)| **c >= q * total)
        .map_or(f64::INFINITY, |(bits, _)| f64::from_bits(*bits))
}

/// A plain HTTP/1.0 GET: (status, body).
async fn http_get(address: &str, path: &str) -> anyhow::Result<(u16, String)> {
    let mut stream = tokio::time::timeout(
        Duration::from_secs(10),
        tokio::net::TcpStream::connect(address),
    )
    .await
    .with_context(|| format!("connecting to {address}"))??;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n").as_bytes())
        .await?;
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut raw))
        .await
        .with_context(|| format!("reading {address}{path}"))??;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow::anyhow!("{address}{path}: no HTTP header"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("{address}{path}: no status in {head:?}"))?;
    Ok((status, body.to_string()))
}

/// Three `rill server` processes of this binary, each a voter of the controller quorum
/// and a broker, on free loopback ports; killed (and their directory removed, if it was
/// made here) when dropped.
struct StartedCluster {
    children: Vec<Child>,
    bootstrap: String,
    http: Vec<String>,
    /// The directory to remove at the end, when it was made here.
    remove: Option<PathBuf>,
}

/// `n` free loopback ports, all different: each is held until all are found.
fn free_ports(n: usize) -> anyhow::Result<Vec<u16>> {
    let held = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()?;
    held.iter().map(|l| Ok(l.local_addr()?.port())).collect()
}

impl StartedCluster {
    fn start(dir: Option<PathBuf>, node_configs: &[String]) -> anyhow::Result<Self> {
        let (dir, remove) = match dir {
            Some(d) => (d, None),
            None => {
                let d = std::env::temp_dir()
                    .join(format!("rill-bench-replicated-{}", std::process::id()));
                (d.clone(), Some(d))
            }
        };
        let exe = std::env::current_exe().context("finding the rill binary")?;
        let nodes = 1..=3u32;
        let ports = free_ports(9)?;
        let (client_ports, rest) = ports.split_at(3);
        let (controller_ports, http_ports) = rest.split_at(3);
        let voters: Vec<String> = nodes
            .clone()
            .zip(controller_ports)
            .map(|(id, port)| format!("{id}@127.0.0.1:{port}"))
            .collect();
        let mut cluster = Self {
            children: Vec::new(),
            bootstrap: client_ports
                .iter()
                .map(|p| format!("127.0.0.1:{p}"))
                .collect::<Vec<_>>()
                .join(","),
            http: http_ports
                .iter()
                .map(|p| format!("127.0.0.1:{p}"))
                .collect(),
            remove,
        };
        for (i, id) in nodes.enumerate() {
            let node_dir = dir.join(format!("node{id}"));
            std::fs::create_dir_all(&node_dir)
                .with_context(|| format!("creating {}", node_dir.display()))?;
            let log = std::fs::File::create(node_dir.join("rill.log"))?;
            let child = Command::new(&exe)
                .arg("server")
                .args(["--node-id", &id.to_string()])
                .args(["--listen", &format!("127.0.0.1:{}", client_ports[i])])
                .args(["--data-dir", &node_dir.join("data").display().to_string()])
                .args([
                    "--controller-listen",
                    &format!("127.0.0.1:{}", controller_ports[i]),
                ])
                .args(["--controller-quorum", &voters.join(",")])
                .args([
                    "--override",
                    &format!("http.listeners=127.0.0.1:{}", http_ports[i]),
                ])
                .args(
                    node_configs
                        .iter()
                        .flat_map(|kv| ["--override", kv.as_str()]),
                )
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .spawn()
                .context("starting rill server")?;
            cluster.children.push(child);
        }
        eprintln!(
            "started three nodes in {} (bootstrap {}, metrics {})",
            dir.display(),
            cluster.bootstrap,
            cluster.http.join(",")
        );
        Ok(cluster)
    }

    /// Waits until every node answers `/health/ready` with 200.
    async fn wait_ready(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        for address in &self.http {
            loop {
                if let Ok((200, _)) = http_get(address, "/health/ready").await {
                    break;
                }
                anyhow::ensure!(
                    Instant::now() < deadline,
                    "node {address} not ready after {READY_TIMEOUT:?}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        Ok(())
    }
}

impl Drop for StartedCluster {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Some(dir) = &self.remove {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: &str = "# TYPE x histogram\n\
        process_cpu_seconds_total 1.5\n\
        t_seconds_bucket{request=\"Produce\",le=\"0.001\"} 10\n\
        t_seconds_bucket{request=\"Produce\",le=\"0.01\"} 99\n\
        t_seconds_bucket{request=\"Produce\",le=\"+Inf\"} 100\n\
        t_seconds_bucket{request=\"Fetch\",le=\"+Inf\"} 7\n\
        t_seconds_count{request=\"Produce\"} 100\n";

    #[test]
    fn machine_cpu_is_read_from_proc_stat_ticks() {
        let cpu = MachineCpu::parse("cpu  100 20 300 9000 50 6 4 0 0 0\ncpu0 1 2 3\n");
        assert!((cpu.user - 1.2).abs() < 1e-9);
        assert!((cpu.system - 3.1).abs() < 1e-9);
        assert!((cpu.iowait - 0.5).abs() < 1e-9);
        assert_eq!(MachineCpu::parse("").user, 0.0);
    }

    #[test]
    fn context_switches_are_both_kinds_from_proc_status() {
        let status = "Name:\trill\nThreads:\t12\nvoluntary_ctxt_switches:\t1500\n\
                      nonvoluntary_ctxt_switches:\t42\n";
        assert_eq!(parse_context_switches(status), Some(1542));
        assert_eq!(
            parse_context_switches("voluntary_ctxt_switches:\t1500\n"),
            None
        );
        let mine = context_switches(std::process::id()).expect("this process's status");
        std::thread::sleep(Duration::from_millis(2));
        assert!(context_switches(std::process::id()).unwrap() > mine);
    }

    #[test]
    fn pages_are_read_by_name_and_label() {
        let page = parse_page(PAGE);
        assert_eq!(sum_of(&page, "process_cpu_seconds_total", &[]), 1.5);
        assert_eq!(
            sum_of(&page, "t_seconds_count", &[("request", "Produce")]),
            100.0
        );
        assert_eq!(
            sum_of(&page, "t_seconds_count", &[("request", "Fetch")]),
            0.0
        );
    }

    #[test]
    fn the_quantile_is_the_bound_of_its_bucket_over_the_difference() {
        let before = vec![parse_page("")];
        let after = vec![parse_page(PAGE)];
        assert_eq!(bucket_quantile(&before, &after, "t_seconds", 0.5), 0.01);
        assert_eq!(
            bucket_quantile(&before, &after, "t_seconds", 0.995),
            f64::INFINITY
        );
        assert_eq!(bucket_quantile(&after, &after, "t_seconds", 0.99), 0.0);
    }
}
