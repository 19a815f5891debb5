//! `rill bench e2e`: produce at a fixed rate and consume the same topic in the same
//! process, and report produce-to-consume latency (Kafka's `EndToEndLatency`, but open
//! loop).
//!
//! How it measures:
//! 1. The consumer is assigned every partition of the topic and positioned at the end
//!    offsets before the first record is sent, so it reads exactly this run's records.
//! 2. Record `i` is due at `start + i / rate`. The sender (a thread of its own, for the OS
//!    timer's precision) sleeps until it is due and sends it; it never waits for an
//!    acknowledgement, so the pace is the clock's.
//! 3. Each value begins with a header: a run id, the sequence number `i` and the due time
//!    as nanoseconds since `start` (one process, so one monotonic clock on both sides).
//! 4. The consumer's latency for a record is `now - due`, not `now - actually sent`: when
//!    the producer stalls (buffer full, slow acknowledgements), the records queued behind
//!    the stall are late from their due time and the stall shows up in the percentiles
//!    instead of silently lowering the offered rate (coordinated omission). How late the
//!    sender itself woke for each record is reported apart as the send lag, so that the
//!    generator's share can be told from the
//!    cluster's.
//! 5. After the last record is sent, the consumer drains until it has seen every sequence
//!    number or the drain timeout passes; what it never saw is reported as missing.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::{BufMut, Bytes, BytesMut};
use clap::Args;
use rill_client::{
    Acks, Consumer, ConsumerConfig, ConsumerRecord, OffsetSpec, Producer, ProducerConfig,
    ProducerRecord,
};
use serde_json::json;

use super::{ensure_topic, parse_acks, random_pool, spawn_progress, Latencies, Progress};
use crate::cli::{print_json, Common};

/// Bytes of the header at the start of every value: run id, sequence, due time.
const HEADER_BYTES: usize = 24;

/// One run's records are counted in memory (a flag, a latency and a send lag each, 9
/// bytes), so a run is bounded; 50 million records is 450 MB of bookkeeping.
const MAX_RECORDS: u64 = 50_000_000;

#[derive(Args, Debug)]
pub struct E2eBench {
    #[arg(long)]
    pub topic: String,
    /// Records per second offered, paced by the clock.
    #[arg(long, default_value_t = 1000)]
    pub rate: u64,
    /// Seconds of sending.
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,
    /// Bytes per value (at least the 24-byte timing header).
    #[arg(long, default_value_t = 1024)]
    pub record_size: usize,
    /// `acks`: 0, 1 or all.
    #[arg(long, default_value = "1")]
    pub acks: String,
    /// `linger.ms` of the producer; 0 sends as soon as the sender is free.
    #[arg(long, default_value_t = 0)]
    pub linger_ms: u64,
    /// `batch.size` in bytes.
    #[arg(long, default_value_t = 1 << 20)]
    pub batch_size: usize,
    /// Partitions of the topic when it has to be created.
    #[arg(long, default_value_t = 1)]
    pub partitions: i32,
    /// How long to wait for the last records after sending ends.
    #[arg(long, default_value_t = 10_000)]
    pub drain_timeout_ms: u64,
}

/// The header of one value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    run_id: u64,
    seq: u64,
    due_ns: u64,
}

impl Stamp {
    fn write(self, buf: &mut BytesMut) {
        buf.put_u64(self.run_id);
        buf.put_u64(self.seq);
        buf.put_u64(self.due_ns);
    }

    /// The stamp at the start of `value`, if there is one (other writers' records in the
    /// topic have none, or another run id).
    fn read(value: &[u8]) -> Option<Self> {
        let field = |i: usize| -> Option<u64> {
            let bytes = value.get(i * 8..i * 8 + 8)?;
            Some(u64::from_be_bytes(bytes.try_into().ok()?))
        };
        Some(Self {
            run_id: field(0)?,
            seq: field(1)?,
            due_ns: field(2)?,
        })
    }
}

/// What the consumer saw.
struct Received {
    /// Produce-to-consume latency of each record seen once.
    latencies: Latencies,
    /// Records of this run seen more than once.
    duplicates: u64,
    /// When the last record of this run arrived, from `start`.
    last_at: Duration,
}

pub async fn run(common: &Common, args: E2eBench) -> anyhow::Result<()> {
    let acks = parse_acks(&args.acks)?;
    anyhow::ensure!(args.rate >= 1, "--rate must be at least 1");
    anyhow::ensure!(
        args.duration.is_finite() && args.duration > 0.0,
        "--duration must be positive"
    );
    anyhow::ensure!(
        args.record_size >= HEADER_BYTES,
        "--record-size must be at least {HEADER_BYTES} (the timing header)"
    );
    let scheduled = (args.rate as f64 * args.duration).ceil() as u64;
    anyhow::ensure!(
        scheduled <= MAX_RECORDS,
        "--rate x --duration is {scheduled} records, more than {MAX_RECORDS}"
    );
    // 1. The consumer starts at the end offsets, before anything is sent.
    let partitions = ensure_topic(common, &args.topic, args.partitions).await?;
    let mut consumer = Consumer::new(ConsumerConfig::new(common.client()?))?;
    consumer.assign(&partitions)?;
    consumer
        .seek_to(&partitions, OffsetSpec::Latest)
        .await
        .context("seeking to the end offsets")?;

    let producer = Arc::new(Producer::new(
        ProducerConfig::new(common.client()?)
            .acks(acks)
            .batch_size(args.batch_size)
            .linger(Duration::from_millis(args.linger_ms))
            .idempotence(acks == Acks::All),
    )?);
    // Warm the producer's metadata for the topic, so that the first due record does not
    // carry the metadata round trip; this record has no stamp and the consumer skips it.
    producer
        .send_and_wait(ProducerRecord::new(&args.topic, Bytes::new()))
        .await
        .context("first send")?;

    let run_id = u64::from(std::process::id()) << 32
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
    let pool = random_pool(args.record_size);
    let progress = Arc::new(Progress::default());
    let reporter = spawn_progress(progress.clone(), "e2e");
    let sent = Arc::new(AtomicU64::new(0));
    let sending_done = Arc::new(AtomicBool::new(false));
    let start = Instant::now();

    let consumer_task = tokio::spawn(consume_loop(
        consumer,
        ConsumeLoop {
            run_id,
            start,
            scheduled,
            sent: sent.clone(),
            sending_done: sending_done.clone(),
            drain_timeout: Duration::from_millis(args.drain_timeout_ms),
            progress: progress.clone(),
        },
    ));

    // 2. Open-loop sending: record i is due at start + i / rate whatever the acks do.
    // Acknowledgements are awaited on their own task only to count failures.
    let (ack_tx, mut ack_rx) =
        tokio::sync::mpsc::unbounded_channel::<rill_client::DeliveryFuture>();
    let acks_task = tokio::spawn(async move {
        let mut failed = 0u64;
        let mut first_error = None;
        while let Some(delivery) = ack_rx.recv().await {
            if let Err(e) = delivery.await {
                failed += 1;
                first_error.get_or_insert_with(|| e.to_string());
            }
        }
        (failed, first_error)
    });
    // The pacing runs on a thread of its own that sleeps with the OS timer (tens of µs
    // late) rather than on tokio's, whose 1 ms wheel would make every record up to 1-2 ms
    // late before it is even sent, and `send` is driven from there on the runtime.
    let sender = std::thread::Builder::new()
        .name("rill-bench-e2e-sender".into())
        .spawn({
            let producer = producer.clone();
            let handle = tokio::runtime::Handle::current();
            let (topic, rate, record_size, sent) = (
                args.topic.clone(),
                args.rate,
                args.record_size,
                sent.clone(),
            );
            // How late each send began after its due time: the generator's own share
            // of the latency (a busy machine, a blocked `send`), reported apart.
            let mut send_lag = Latencies::new()?;
            move || {
                let mut send_error = None;
                for seq in 0..scheduled {
                    let due = Duration::from_secs_f64(seq as f64 / rate as f64);
                    let now = start.elapsed();
                    if due > now {
                        std::thread::sleep(due - now);
                    }
                    let lag = start.elapsed().saturating_sub(due);
                    send_lag.record(lag);
                    let mut value = BytesMut::with_capacity(record_size);
                    Stamp {
                        run_id,
                        seq,
                        due_ns: due.as_nanos() as u64,
                    }
                    .write(&mut value);
                    value.extend_from_slice(&pool[HEADER_BYTES..record_size]);
                    let record = ProducerRecord::new(&topic, value.freeze());
                    match handle.block_on(producer.send(record)) {
                        Ok(delivery) => {
                            sent.fetch_add(1, Ordering::Release);
                            let _ = ack_tx.send(delivery);
                        }
                        Err(e) => {
                            send_error = Some(e.to_string());
                            break;
                        }
                    }
                }
                (send_lag, send_error)
            }
        })
        .context("starting the sender thread")?;
    let (send_lag, send_error) = tokio::task::spawn_blocking(move || sender.join())
        .await?
        .map_err(|_| anyhow::anyhow!("the sender thread panicked"))?;
    let send_seconds = start.elapsed().as_secs_f64().max(1e-9);
    let flushed = producer.flush().await;
    sending_done.store(true, Ordering::Release);
    let (failed, ack_error) = acks_task.await?;
    let received = consumer_task.await??;
    reporter.abort();
    let _ = producer.close().await;
    if let Some(e) = send_error {
        anyhow::bail!(
            "send failed after {} records: {e}",
            sent.load(Ordering::Acquire)
        );
    }
    flushed.context("flushing the producer")?;

    let sent = sent.load(Ordering::Acquire);
    let Received {
        latencies,
        duplicates,
        last_at,
    } = received;
    let records_received = latencies.len();
    let missing = sent.saturating_sub(records_received);
    let summary = latencies.summary();
    let send_lag_summary = send_lag.summary();
    let produce_rate = sent as f64 / send_seconds;
    let consume_seconds = last_at.as_secs_f64().max(1e-9);
    let consume_rate = records_received as f64 / consume_seconds;
    let mb_per_sec = consume_rate * args.record_size as f64 / 1e6;
    if common.json() {
        print_json(&json!({
            "target_rate": args.rate,
            "record_size": args.record_size,
            "records_scheduled": scheduled,
            "records_sent": sent,
            "records_failed": failed,
            "records_received": records_received,
            "missing": missing,
            "duplicates": duplicates,
            "send_seconds": send_seconds,
            "produce_records_per_sec": produce_rate,
            "records_per_sec": consume_rate,
            "mb_per_sec": mb_per_sec,
            "latency_ms": summary.to_json(),
            "latency_histogram": latencies.table_json(),
            "send_lag_ms": send_lag_summary.to_json(),
        }));
    } else {
        println!(
            "{sent} of {scheduled} records sent in {send_seconds:.2} s \
             ({produce_rate:.0} records/s of {} offered), {records_received} received \
             ({consume_rate:.0} records/s, {mb_per_sec:.2} MB/s), {missing} missing, \
             {duplicates} duplicates, {failed} failed; produce-to-consume latency \
             avg {:.2} ms, p50 {:.2} ms, p99 {:.2} ms, p99.9 {:.2} ms, max {:.2} ms \
             (sends began late by p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms)",
            args.rate,
            summary.avg,
            summary.p50,
            summary.p99,
            summary.p999,
            summary.max,
            send_lag_summary.p50,
            send_lag_summary.p99,
            send_lag_summary.max
        );
        latencies.print_table("produce-to-consume latency");
    }
    if let Some(e) = ack_error {
        eprintln!("{failed} records failed; the first: {e}");
    }
    Ok(())
}

/// What the consume loop needs besides the consumer.
struct ConsumeLoop {
    run_id: u64,
    start: Instant,
    scheduled: u64,
    /// Records handed to the producer so far.
    sent: Arc<AtomicU64>,
    /// Set once the sender has stopped and the producer is flushed.
    sending_done: Arc<AtomicBool>,
    drain_timeout: Duration,
    progress: Arc<Progress>,
}

/// Reads until every sent record was seen after sending ended, or the drain timeout.
async fn consume_loop(mut consumer: Consumer, ctx: ConsumeLoop) -> anyhow::Result<Received> {
    let mut seen = vec![false; ctx.scheduled as usize];
    let mut received = Received {
        latencies: Latencies::new()?,
        duplicates: 0,
        last_at: Duration::ZERO,
    };
    let mut drain_deadline: Option<Instant> = None;
    loop {
        if ctx.sending_done.load(Ordering::Acquire) {
            let sent = ctx.sent.load(Ordering::Acquire);
            if received.latencies.len() >= sent {
                break;
            }
            let deadline =
                *drain_deadline.get_or_insert_with(|| Instant::now() + ctx.drain_timeout);
            if Instant::now() >= deadline {
                break;
            }
        }
        // A short poll so that the end of sending is noticed promptly.
        let batch = consumer.poll(Duration::from_millis(100)).await?;
        let now = ctx.start.elapsed();
        record_batch(&batch, &ctx, now, &mut seen, &mut received);
    }
    let _ = consumer.close().await;
    Ok(received)
}

fn record_batch(
    batch: &[ConsumerRecord],
    ctx: &ConsumeLoop,
    now: Duration,
    seen: &mut [bool],
    received: &mut Received,
) {
    let mut bytes = 0u64;
    let mut count = 0u64;
    for r in batch {
        let Some(value) = r.value.as_deref() else {
            continue;
        };
        let Some(stamp) = Stamp::read(value) else {
            continue;
        };
        if stamp.run_id != ctx.run_id {
            continue;
        }
        let Some(flag) = seen.get_mut(stamp.seq as usize) else {
            continue;
        };
        if *flag {
            received.duplicates += 1;
            continue;
        }
        *flag = true;
        let latency = now.saturating_sub(Duration::from_nanos(stamp.due_ns));
        received.latencies.record(latency);
        received.last_at = now;
        count += 1;
        bytes += value.len() as u64;
    }
    ctx.progress.records.fetch_add(count, Ordering::Relaxed);
    ctx.progress.bytes.fetch_add(bytes, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stamp_round_trip() {
        let stamp = Stamp {
            run_id: 7,
            seq: 42,
            due_ns: 1_000_000,
        };
        let mut buf = BytesMut::new();
        stamp.write(&mut buf);
        buf.extend_from_slice(b"padding");
        assert_eq!(buf.len(), HEADER_BYTES + 7);
        assert_eq!(Stamp::read(&buf), Some(stamp));
        assert_eq!(Stamp::read(&buf[..HEADER_BYTES - 1]), None);
        assert_eq!(Stamp::read(b""), None);
    }

    #[test]
    fn late_records_count_from_their_due_time() {
        let ctx = ConsumeLoop {
            run_id: 1,
            start: Instant::now(),
            scheduled: 3,
            sent: Arc::new(AtomicU64::new(3)),
            sending_done: Arc::new(AtomicBool::new(true)),
            drain_timeout: Duration::ZERO,
            progress: Arc::new(Progress::default()),
        };
        let record = |run_id: u64, seq: u64, due_ms: u64| {
            let mut buf = BytesMut::new();
            Stamp {
                run_id,
                seq,
                due_ns: due_ms * 1_000_000,
            }
            .write(&mut buf);
            ConsumerRecord {
                topic: "t".into(),
                partition: 0,
                offset: seq as i64,
                timestamp: 0,
                key: None,
                value: Some(buf.freeze()),
                headers: Vec::new(),
            }
        };
        let mut seen = vec![false; 3];
        let mut received = Received {
            latencies: Latencies::new().unwrap(),
            duplicates: 0,
            last_at: Duration::ZERO,
        };
        let batch = [
            record(1, 0, 0),
            record(1, 0, 0),
            record(2, 1, 0),
            record(1, 2, 10),
        ];
        record_batch(
            &batch,
            &ctx,
            Duration::from_millis(50),
            &mut seen,
            &mut received,
        );
        // A record due at 0 ms and read at 50 ms waited 50 ms, however late it was sent.
        let s = received.latencies.summary();
        assert_eq!(received.latencies.len(), 2);
        assert!(
            (s.max - 50.0).abs() < 0.05 && (s.avg - 45.0).abs() < 0.05,
            "{s:?}"
        );
        assert_eq!(received.duplicates, 1);
        assert_eq!(seen, vec![true, false, true]);
    }
}
