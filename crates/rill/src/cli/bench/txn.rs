//! `rill bench txn`: what transactions cost, measured against the idempotent producer in
//! the same run.
//!
//! 1. An idempotent producer (acks=all) sends `--records` records to `<topic>-idempotent`.
//! 2. A transactional producer sends as many to `<topic>-transactional`, committing every
//!    `--commit-interval-ms` (Kafka Streams' `commit.interval.ms` is 100 ms under
//!    exactly-once); each commit (the flush of what is in flight, then
//!    `commit_transaction`'s EndTxn) goes into an HDR histogram, and its EndTxn part into
//!    another, and the time to acknowledge each transaction's first record into a third.
//!    The two producers take turns by quarters (A B B A B A A B), so that neither always
//!    writes into the fuller page cache.
//! 3. The transactional topic is read back four times by a consumer each:
//!    read_uncommitted, read_committed, read_committed, read_uncommitted; each level's two
//!    reads are added up.
//!
//! The report is each phase's records/s and MB/s, the transactional producer's throughput
//! as a fraction of the idempotent one's, the commit latencies, and read_committed's
//! fetch throughput as a fraction of read_uncommitted's. Both producers share the
//! settings (batch size, linger, acks=all) and the topics their partition count and
//! replication factor, so that the transactions are the only difference.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::Bytes;
use clap::Args;
use rill_client::{Admin, NewTopic, OffsetSpec, Producer, ProducerConfig, ProducerRecord};
use serde_json::json;

use super::{
    ensure_new_topic, random_pool, read_records, records_between, spawn_progress, Latencies,
    Progress, Read, Reader,
};
use crate::cli::{print_json, Common};

impl Read {
    /// Two reads as one: their records, bytes and times added up.
    fn and(self, other: &Read) -> Read {
        let bytes = self.bytes + other.bytes;
        let cpu_s = self.cpu_s + other.cpu_s;
        Read {
            records: self.records + other.records,
            bytes,
            secs: self.secs + other.secs,
            cpu_s,
            cpu_per_gb: if bytes == 0 {
                0.0
            } else {
                cpu_s / (bytes as f64 / 1e9)
            },
        }
    }
}

#[derive(Args, Debug)]
pub struct TxnBench {
    /// Base name of the two topics, `<topic>-idempotent` and `<topic>-transactional`.
    #[arg(long)]
    pub topic: String,
    /// Records each producer sends.
    #[arg(long, default_value_t = 200_000)]
    pub records: u64,
    /// Bytes of random value per record.
    #[arg(long, default_value_t = 1024)]
    pub record_size: usize,
    /// How often the transactional producer commits.
    #[arg(long, default_value_t = 100)]
    pub commit_interval_ms: u64,
    /// Partitions of each topic when it has to be created.
    #[arg(long, default_value_t = 6)]
    pub partitions: i32,
    /// Replication factor of each topic when it has to be created (-1: the broker's
    /// `default.replication.factor`).
    #[arg(long, default_value_t = -1)]
    pub replication_factor: i16,
    /// `batch.size` in bytes.
    #[arg(long, default_value_t = 1 << 20)]
    pub batch_size: usize,
    /// `linger.ms`.
    #[arg(long, default_value_t = 5)]
    pub linger_ms: u64,
    /// The transactional producer's `transactional.id` (default: one per process).
    #[arg(long)]
    pub transactional_id: Option<String>,
}

/// One producer's phase.
struct Sent {
    secs: f64,
    /// Each commit: the flush of what the transaction still had in flight, then
    /// `commit_transaction` (EndTxn), for the transactional phase.
    commits: Latencies,
    /// The EndTxn part of each commit alone.
    end_txns: Latencies,
    /// From the send of each transaction's first record to its acknowledgement: the
    /// wait a transaction version 2 producer's next transaction has for its partitions
    /// to be added while the previous one's markers are written.
    firsts: Latencies,
}

pub async fn run(common: &Common, args: TxnBench) -> anyhow::Result<()> {
    anyhow::ensure!(args.records > 0, "--records must be positive");
    anyhow::ensure!(
        args.commit_interval_ms > 0,
        "--commit-interval-ms must be positive"
    );
    let idempotent_topic = format!("{}-idempotent", args.topic);
    let transactional_topic = format!("{}-transactional", args.topic);
    for topic in [&idempotent_topic, &transactional_topic] {
        ensure_new_topic(
            common,
            NewTopic::new(topic, args.partitions).replication_factor(args.replication_factor),
        )
        .await?;
    }
    let pool = random_pool((1 << 20) + args.record_size);
    let config = ProducerConfig::new(common.client()?)
        .batch_size(args.batch_size)
        .linger(Duration::from_millis(args.linger_ms));

    let idempotent = Producer::new(config.clone())?;
    let id = args
        .transactional_id
        .clone()
        .unwrap_or_else(|| format!("rill-bench-{}", std::process::id()));
    let transactional = Producer::new(config.transactional_id(id))?;
    transactional
        .init_transactions()
        .await
        .context("init_transactions")?;
    let interval = Duration::from_millis(args.commit_interval_ms);
    // Each producer sends a quarter of its records four times, the two taking turns in
    // the order A B B A B A A B, so that what the broker's disk does over the run (the
    // page cache filling, writeback setting in after the first gigabytes, which is not
    // a steady drift) weighs on both alike: the second producer of a plain A B would
    // always write into the dirtier cache.
    let quarter = |k: u64| (args.records * (k + 1)) / 4 - (args.records * k) / 4;
    let (mut plain, mut txn): (Option<Sent>, Option<Sent>) = (None, None);
    let (mut plain_quarters, mut txn_quarters) = (0, 0);
    for transactional_phase in [false, true, true, false, true, false, false, true] {
        let done = if transactional_phase {
            &mut txn_quarters
        } else {
            &mut plain_quarters
        };
        let records = quarter(*done);
        *done += 1;
        let sent = if transactional_phase {
            send(
                &transactional,
                &transactional_topic,
                (records, args.record_size),
                &pool,
                Some(interval),
            )
            .await
            .context("the transactional producer")?
        } else {
            send(
                &idempotent,
                &idempotent_topic,
                (records, args.record_size),
                &pool,
                None,
            )
            .await
            .context("the idempotent producer")?
        };
        let sum = if transactional_phase {
            &mut txn
        } else {
            &mut plain
        };
        *sum = Some(match sum.take() {
            None => sent,
            Some(earlier) => earlier.and(sent)?,
        });
    }
    idempotent.close().await?;
    transactional.close().await?;
    let (Some(plain), Some(txn)) = (plain, txn) else {
        anyhow::bail!("both producers were to send");
    };

    let admin = Admin::new(common.client()?)?;
    let partitions = admin.partitions_of(&transactional_topic).await?;
    // Everything is committed, so the last stable offsets are the ends: both readers get
    // every record, and read_committed skips the markers as read_uncommitted does.
    let target = args.records;
    let stable = records_between(&admin, &partitions, OffsetSpec::Latest).await?;
    anyhow::ensure!(
        stable >= target,
        "{transactional_topic} holds {stable} offsets, fewer than the {target} records sent"
    );
    // Each isolation level reads twice, in the order A B B A, so that a drift of the
    // machine's speed over the reads (the page cache warming, a neighbour's load) counts
    // against both alike.
    let (mut uncommitted, mut committed): (Option<Read>, Option<Read>) = (None, None);
    for read_committed in [false, true, true, false] {
        let reader = Reader {
            group: None,
            target,
            read_committed,
            idle: Duration::from_secs(30),
        };
        let read = read_records(common, &transactional_topic, &partitions, reader).await?;
        let sum = if read_committed {
            &mut committed
        } else {
            &mut uncommitted
        };
        *sum = Some(match sum.take() {
            None => read,
            Some(earlier) => earlier.and(&read),
        });
    }
    let (Some(uncommitted), Some(committed)) = (uncommitted, committed) else {
        anyhow::bail!("both isolation levels were to be read");
    };
    report(common, &args, &plain, &txn, &uncommitted, &committed);
    Ok(())
}

impl Sent {
    /// Two phases of one producer as one: their times and commits added up.
    fn and(mut self, other: Sent) -> anyhow::Result<Sent> {
        self.secs += other.secs;
        self.commits.add(&other.commits)?;
        self.end_txns.add(&other.end_txns)?;
        self.firsts.add(&other.firsts)?;
        Ok(self)
    }
}

/// Sends `records` records of `size` bytes to `topic`; with `commit_interval`, inside
/// transactions committed that often (and once more at the end).
async fn send(
    producer: &Producer,
    topic: &str,
    (records, size): (u64, usize),
    pool: &Bytes,
    commit_interval: Option<Duration>,
) -> anyhow::Result<Sent> {
    let progress = Arc::new(Progress::default());
    let reporter = spawn_progress(
        progress.clone(),
        if commit_interval.is_some() {
            "transactional"
        } else {
            "idempotent"
        },
    );
    // Deliveries are awaited on their own task, in send order, so that sending never
    // waits for an answer.
    // A transaction's first record comes with the time it was sent.
    let (tx, mut rx) =
        tokio::sync::mpsc::unbounded_channel::<(rill_client::DeliveryFuture, Option<Instant>)>();
    let collector = tokio::spawn({
        let progress = progress.clone();
        let mut firsts = Latencies::new()?;
        async move {
            while let Some((delivery, first)) = rx.recv().await {
                delivery.await?;
                if let Some(sent) = first {
                    firsts.record(sent.elapsed());
                }
                progress.records.fetch_add(1, Ordering::Relaxed);
                progress.bytes.fetch_add(size as u64, Ordering::Relaxed);
            }
            anyhow::Ok(firsts)
        }
    });
    let mut commits = Latencies::new()?;
    let mut end_txns = Latencies::new()?;
    // The flush first, so that the EndTxn round trip shows apart from it.
    let commit = async |commits: &mut Latencies, end_txns: &mut Latencies| {
        let begun = Instant::now();
        producer.flush().await?;
        let ending = Instant::now();
        producer.commit_transaction().await?;
        end_txns.record(ending.elapsed());
        commits.record(begun.elapsed());
        anyhow::Ok(())
    };
    let started = Instant::now();
    if commit_interval.is_some() {
        producer.begin_transaction()?;
    }
    let mut last_commit = Instant::now();
    let mut first = commit_interval.is_some();
    for i in 0..records {
        if let Some(interval) = commit_interval {
            if last_commit.elapsed() >= interval {
                commit(&mut commits, &mut end_txns).await?;
                producer.begin_transaction()?;
                last_commit = Instant::now();
                first = true;
            }
        }
        let offset = (i as usize).wrapping_mul(7919) % (1 << 20);
        let value = pool.slice(offset..offset + size);
        let sent = std::mem::take(&mut first).then(Instant::now);
        let delivery = producer.send(ProducerRecord::new(topic, value)).await?;
        if tx.send((delivery, sent)).is_err() {
            break;
        }
    }
    if commit_interval.is_some() {
        commit(&mut commits, &mut end_txns).await?;
    } else {
        producer.flush().await?;
    }
    drop(tx);
    let firsts = collector.await??;
    let secs = started.elapsed().as_secs_f64().max(1e-9);
    reporter.abort();
    Ok(Sent {
        secs,
        commits,
        end_txns,
        firsts,
    })
}

fn report(
    common: &Common,
    args: &TxnBench,
    plain: &Sent,
    txn: &Sent,
    uncommitted: &Read,
    committed: &Read,
) {
    let bytes = args.records * args.record_size as u64;
    let rate = |secs: f64| (args.records as f64 / secs, bytes as f64 / secs / 1e6);
    let (plain_rps, plain_mbps) = rate(plain.secs);
    let (txn_rps, txn_mbps) = rate(txn.secs);
    let txn_fraction = txn_rps / plain_rps;
    let read_rate = |r: &Read| (r.records as f64 / r.secs, r.bytes as f64 / r.secs / 1e6);
    let (uncommitted_rps, uncommitted_mbps) = read_rate(uncommitted);
    let (committed_rps, committed_mbps) = read_rate(committed);
    let read_fraction = committed_rps / uncommitted_rps;
    let summary = txn.commits.summary();
    let end_txn = txn.end_txns.summary();
    let first = txn.firsts.summary();
    if common.json() {
        print_json(&json!({
            "records": args.records,
            "record_size": args.record_size,
            "commit_interval_ms": args.commit_interval_ms,
            "idempotent": {"seconds": plain.secs, "records_per_sec": plain_rps, "mb_per_sec": plain_mbps},
            "transactional": {"seconds": txn.secs, "records_per_sec": txn_rps, "mb_per_sec": txn_mbps},
            "commits": {
                "count": txn.commits.len(),
                "latency_ms": summary.to_json(),
                "latency_histogram": txn.commits.table_json(),
                "end_txn_latency_ms": end_txn.to_json(),
                "first_record_latency_ms": first.to_json(),
            },
            "transactional_fraction_of_idempotent": txn_fraction,
            "read_uncommitted": {"seconds": uncommitted.secs, "records": uncommitted.records, "records_per_sec": uncommitted_rps, "mb_per_sec": uncommitted_mbps},
            "read_committed": {"seconds": committed.secs, "records": committed.records, "records_per_sec": committed_rps, "mb_per_sec": committed_mbps},
            "read_committed_fraction_of_read_uncommitted": read_fraction,
        }));
    } else {
        println!(
            "idempotent: {} records in {:.2} s, {plain_rps:.0} records/s, {plain_mbps:.2} MB/s",
            args.records, plain.secs
        );
        println!(
            "transactional (commit every {} ms): {} records in {:.2} s, {txn_rps:.0} records/s, \
             {txn_mbps:.2} MB/s = {txn_fraction:.3} of idempotent; {} commits, latency avg {:.2} ms, \
             p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms (EndTxn alone p50 {:.2} ms, p99 {:.2} ms); \
             a transaction's first record acknowledged in p50 {:.2} ms, p99 {:.2} ms",
            args.commit_interval_ms,
            args.records,
            txn.secs,
            txn.commits.len(),
            summary.avg,
            summary.p50,
            summary.p99,
            summary.max,
            end_txn.p50,
            end_txn.p99,
            first.p50,
            first.p99
        );
        println!(
            "read_uncommitted: {uncommitted_rps:.0} records/s, {uncommitted_mbps:.2} MB/s; \
             read_committed: {committed_rps:.0} records/s, {committed_mbps:.2} MB/s = \
             {read_fraction:.3} of read_uncommitted"
        );
        txn.commits.print_table("commit_transaction latency");
    }
}
