//! The producer: batching, compression, idempotence and per-record delivery futures.
//!
//! How a record travels (Kafka's `RecordAccumulator` + `Sender`, in tasks):
//!
//! 1. [`Producer::send`] picks the partition (explicit, murmur2 of the key, or the
//!    topic's sticky partition), reserves `buffer.memory`, and appends the record to the
//!    last open batch of that partition, or starts a batch when it is full
//!    (`batch.size`). It returns a [`DeliveryFuture`] at once.
//! 2. The sender task takes a partition's first batch when it is full, older than
//!    `linger.ms`, or a flush/close is waiting, and while the partition has fewer than
//!    `max.in.flight.requests.per.connection` batches in flight. With idempotence it then
//!    stamps the batch with the producer id, epoch and the partition's next sequence number.
//!    Batches for the same leader share Produce requests, at most one batch per
//!    partition in each (answers are keyed by partition), compressed by
//!    `RecordBatchBuilder`.
//! 3. The answer completes each record's future with its offset. A retriable error puts
//!    the batch back at the head of its partition, in sequence order, with its sequence
//!    kept, so that the broker drops a duplicate instead of writing it twice; such retried
//!    batches go out one at a time. A batch is failed once `delivery.timeout.ms` has passed
//!    since it was created, or on a non-retriable error.
//!
//! Why the order holds: the sender task writes every Produce request itself, one after
//! the other, so one partition's batches reach its connection in sequence order (only the
//! answers are awaited on other tasks); and a retried batch is only resent when nothing
//! else of its partition is in flight.

use std::collections::hash_map::RandomState;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::BufMut;
use bytes::Bytes;
use rill_protocol::generated::{InitProducerIdRequest, ProduceRequest, ProduceResponse};
use rill_protocol::primitives::{
    put_unsigned_varint, write_array_len, write_nullable_string, write_string, write_tagged_count,
};
use rill_protocol::records::{CompressionType, Header, RecordBatchBuilder};
use rill_protocol::ErrorCode;
use tokio::sync::{Notify, Semaphore, TryAcquireError};
use tokio::task::JoinHandle;

use crate::config::ClientConfig;
use crate::connection::SplicedFrame;
use crate::error::{Error, Result};
use crate::network::NetworkClient;
use crate::partitioner::partition_for_key;
use crate::transaction::TransactionCoordinator;
use crate::types::TopicPartition;

const PRODUCE_VERSION: i16 = 11;
/// Produce v12 is v11 on the wire; it tells the leader that the producer runs at
/// transaction version 2 and adds no partitions itself (KIP-890 part 2).
const PRODUCE_TV2_VERSION: i16 = 12;
const INIT_PRODUCER_ID_VERSION: i16 = 4;

/// `acks`: how many replicas must have a record before the broker answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acks {
    /// `acks=0`: no answer at all; offsets are unknown (-1).
    None,
    /// `acks=1`: the leader has it.
    Leader,
    /// `acks=all` (-1): every in-sync replica has it.
    All,
}

impl Acks {
    fn wire(self) -> i16 {
        match self {
            Acks::None => 0,
            Acks::Leader => 1,
            Acks::All => -1,
        }
    }
}

impl std::str::FromStr for Acks {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "0" => Ok(Acks::None),
            "1" => Ok(Acks::Leader),
            "all" | "-1" => Ok(Acks::All),
            other => Err(Error::InvalidConfig(format!("acks={other}"))),
        }
    }
}

/// Producer settings, with the Java client's defaults.
///
/// ```
/// use std::time::Duration;
/// use rill_client::{ClientConfig, ProducerConfig};
/// use rill_client::records::CompressionType;
///
/// let config = ProducerConfig::new(ClientConfig::new("127.0.0.1:9092"))
///     .compression(CompressionType::Zstd)
///     .linger(Duration::from_millis(10));
/// assert!(config.enable_idempotence);
/// ```
#[derive(Debug, Clone)]
pub struct ProducerConfig {
    pub client: ClientConfig,
    /// `acks` (default all). Idempotence needs `all`; with another value it is off.
    pub acks: Acks,
    /// `batch.size` in bytes (uncompressed).
    pub batch_size: usize,
    /// `linger.ms`.
    pub linger: Duration,
    /// `compression.type`.
    pub compression: CompressionType,
    /// `enable.idempotence` (default on).
    pub enable_idempotence: bool,
    /// `max.in.flight.requests.per.connection` (at most 5 with idempotence).
    pub max_in_flight: usize,
    /// `delivery.timeout.ms`: a record not acknowledged by then fails.
    pub delivery_timeout: Duration,
    /// `buffer.memory`: bytes of records waiting to be sent before `send` waits.
    pub buffer_memory: usize,
    /// `max.request.size`: the largest record accepted.
    pub max_request_size: usize,
    /// `max.block.ms`: how long `send` waits for metadata of a new topic, and the bound
    /// on each call to the transaction coordinator.
    pub max_block: Duration,
    /// `transactional.id`: makes the producer transactional (see
    /// [`Producer::init_transactions`]); needs idempotence.
    pub transactional_id: Option<String>,
    /// `transaction.timeout.ms`: how long the coordinator lets a transaction stay open
    /// before it aborts it.
    pub transaction_timeout: Duration,
}

impl ProducerConfig {
    pub fn new(client: ClientConfig) -> Self {
        Self {
            client,
            acks: Acks::All,
            batch_size: 16 * 1024,
            linger: Duration::from_millis(5),
            compression: CompressionType::None,
            enable_idempotence: true,
            max_in_flight: 5,
            delivery_timeout: Duration::from_secs(120),
            buffer_memory: 32 << 20,
            max_request_size: 1 << 20,
            max_block: Duration::from_secs(60),
            transactional_id: None,
            transaction_timeout: Duration::from_secs(60),
        }
    }

    /// `transactional.id`: records are sent only inside transactions, which commit or
    /// abort as a whole.
    pub fn transactional_id(mut self, id: impl Into<String>) -> Self {
        self.transactional_id = Some(id.into());
        self
    }

    pub fn transaction_timeout(mut self, timeout: Duration) -> Self {
        self.transaction_timeout = timeout;
        self
    }

    pub fn acks(mut self, acks: Acks) -> Self {
        self.acks = acks;
        self
    }

    pub fn compression(mut self, compression: CompressionType) -> Self {
        self.compression = compression;
        self
    }

    pub fn linger(mut self, linger: Duration) -> Self {
        self.linger = linger;
        self
    }

    pub fn batch_size(mut self, bytes: usize) -> Self {
        self.batch_size = bytes;
        self
    }

    pub fn idempotence(mut self, on: bool) -> Self {
        self.enable_idempotence = on;
        self
    }

    pub fn delivery_timeout(mut self, timeout: Duration) -> Self {
        self.delivery_timeout = timeout;
        self
    }

    fn idempotent(&self) -> bool {
        self.enable_idempotence && self.acks == Acks::All
    }
}

/// A record to send.
///
/// ```
/// use rill_client::ProducerRecord;
/// let record = ProducerRecord::new("orders", "{\"id\":1}")
///     .key("customer-7")
///     .header("source", "web");
/// assert_eq!(record.partition, None);
/// ```
#[derive(Debug, Clone, Default)]
pub struct ProducerRecord {
    pub topic: String,
    /// Explicit partition; otherwise chosen from the key.
    pub partition: Option<i32>,
    pub key: Option<Bytes>,
    pub value: Option<Bytes>,
    pub headers: Vec<Header>,
    /// Create time in ms since the epoch; now when `None`.
    pub timestamp: Option<i64>,
}

impl ProducerRecord {
    pub fn new(topic: impl Into<String>, value: impl Into<Bytes>) -> Self {
        Self {
            topic: topic.into(),
            value: Some(value.into()),
            ..Default::default()
        }
    }

    /// A record with a null value (a tombstone, once it has a key).
    pub fn tombstone(topic: impl Into<String>) -> Self {
        Self {
            topic: topic.into(),
            ..Default::default()
        }
    }

    pub fn key(mut self, key: impl Into<Bytes>) -> Self {
        self.key = Some(key.into());
        self
    }

    pub fn partition(mut self, partition: i32) -> Self {
        self.partition = Some(partition);
        self
    }

    pub fn header(mut self, key: impl Into<String>, value: impl Into<Bytes>) -> Self {
        self.headers.push(Header {
            key: key.into(),
            value: Some(value.into()),
        });
        self
    }

    pub fn timestamp(mut self, ms: i64) -> Self {
        self.timestamp = Some(ms);
        self
    }

    fn size_estimate(&self) -> usize {
        32 + self.key.as_ref().map_or(0, Bytes::len)
            + self.value.as_ref().map_or(0, Bytes::len)
            + self
                .headers
                .iter()
                .map(|h| 8 + h.key.len() + h.value.as_ref().map_or(0, Bytes::len))
                .sum::<usize>()
    }
}

/// Where a record was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordMetadata {
    pub topic: String,
    pub partition: i32,
    /// The record's offset; -1 with `acks=0` or for a retried duplicate.
    pub offset: i64,
    /// Create time, or the broker's append time when the topic uses `LogAppendTime`.
    pub timestamp: i64,
}

/// Resolves when the broker has acknowledged (or refused) one record.
///
/// Every record of a batch waits on the batch's one [`BatchOutcome`]: a shared pointer
/// and the record's place in the batch, instead of a channel allocated per record.
pub struct DeliveryFuture {
    outcome: Arc<BatchOutcome>,
    /// The record's offset delta in its batch.
    index: u32,
    timestamp: i64,
    /// Where this future's waker is in the outcome's list, once it has been polled.
    waker_slot: Option<usize>,
}

impl Future for DeliveryFuture {
    type Output = Result<RecordMetadata>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let Ok(mut state) = this.outcome.state.lock() else {
            return Poll::Ready(Err(Error::Closed));
        };
        match &state.result {
            Some(Ok((base, append_time))) => Poll::Ready(Ok(RecordMetadata {
                topic: this.outcome.topic.clone(),
                partition: this.outcome.partition,
                offset: if *base >= 0 {
                    base + i64::from(this.index)
                } else {
                    -1
                },
                timestamp: if *append_time >= 0 {
                    *append_time
                } else {
                    this.timestamp
                },
            })),
            Some(Err(e)) => Poll::Ready(Err(e.clone())),
            None => {
                let waker = cx.waker();
                match this.waker_slot.and_then(|i| state.wakers.get_mut(i)) {
                    Some(w) => {
                        if !w.will_wake(waker) {
                            w.clone_from(waker);
                        }
                    }
                    None => {
                        this.waker_slot = Some(state.wakers.len());
                        state.wakers.push(waker.clone());
                    }
                }
                Poll::Pending
            }
        }
    }
}

/// The outcome of one batch, which each of its records' [`DeliveryFuture`]s reads.
struct BatchOutcome {
    topic: String,
    partition: i32,
    state: Mutex<OutcomeState>,
}

#[derive(Default)]
struct OutcomeState {
    /// Base offset and log append time, or why the batch failed; set once.
    result: Option<Result<(i64, i64)>>,
    wakers: Vec<std::task::Waker>,
}

/// The batch's side of its [`BatchOutcome`]: sets it when the batch completes, and to
/// [`Error::Closed`] when the batch is dropped without completing (the producer went
/// away), so that no delivery future waits forever.
struct OutcomeSender(Arc<BatchOutcome>);

impl OutcomeSender {
    fn new(tp: &TopicPartition) -> Self {
        Self(Arc::new(BatchOutcome {
            topic: tp.topic.clone(),
            partition: tp.partition,
            state: Mutex::new(OutcomeState::default()),
        }))
    }

    fn set(&self, result: Result<(i64, i64)>) {
        let wakers = match self.0.state.lock() {
            Ok(mut state) if state.result.is_none() => {
                state.result = Some(result);
                std::mem::take(&mut state.wakers)
            }
            _ => return,
        };
        for w in wakers {
            w.wake();
        }
    }
}

impl Drop for OutcomeSender {
    fn drop(&mut self) {
        self.set(Err(Error::Closed));
    }
}

struct ProducerBatch {
    tp: TopicPartition,
    builder: RecordBatchBuilder,
    created: Instant,
    outcome: OutcomeSender,
    /// Records in the batch, each with a [`DeliveryFuture`] on `outcome`.
    records: usize,
    memory: usize,
    /// Set when the batch is first drained (idempotence), kept across retries.
    base_sequence: Option<i32>,
    /// The finished batch, written to the socket from here (and kept for retries); its
    /// buffer goes back to the accumulator's pool once the batch is done.
    encoded: Option<Vec<u8>>,
    retry_after: Option<Instant>,
    full: bool,
}

/// A transactional producer's view of its transaction, kept with the accumulator so
/// that `send` and the sender see it under the one lock they take anyway.
#[derive(Default)]
struct TxnPartitions {
    /// From `begin_transaction` until its commit or abort is done.
    open: bool,
    /// Partitions AddPartitionsToTxn has added to the open transaction: only their batches
    /// are sent.
    added: HashSet<TopicPartition>,
    /// Partitions with records in the open transaction, not added yet.
    pending: BTreeSet<TopicPartition>,
    /// The first record batch of the open transaction that failed: it can only abort.
    failed: Option<Error>,
}

#[derive(Default)]
struct PartitionQueue {
    batches: VecDeque<ProducerBatch>,
    in_flight: usize,
    next_sequence: i32,
}

struct Accumulator {
    queues: HashMap<TopicPartition, PartitionQueue>,
    /// Per topic: the sticky partition and the record bytes sent to it since it was
    /// chosen.
    sticky: HashMap<String, (i32, usize)>,
    flushing: usize,
    closed: bool,
    producer_id: i64,
    producer_epoch: i16,
    /// Records appended and not yet completed.
    pending: usize,
    rng: u64,
    /// Partition counts of topics, valid while the metadata generation is unchanged and
    /// until the topic's metadata is due for a refresh (the sender drops them then):
    /// `send` asks the network client only when this has none, not for every record.
    partition_counts: HashMap<String, CachedPartitionCount>,
    /// Buffers of sent batches, reused for new ones (Kafka's `BufferPool`): a fresh
    /// buffer costs a page fault per 4 KiB, as much as copying the records into it.
    pool: Vec<Vec<u8>>,
    pool_bytes: usize,
    /// The transaction, for a producer with a `transactional.id`.
    txn: Option<TxnPartitions>,
    /// The transactions run at transaction version 2 (KIP-890 part 2): the leaders add
    /// the partitions, and every commit or abort bumps the epoch.
    tv2: bool,
}

#[derive(Clone, Copy)]
struct CachedPartitionCount {
    count: usize,
    generation: u64,
    fresh_until: Instant,
}

impl Accumulator {
    fn random(&mut self) -> u64 {
        // xorshift64: enough to spread sticky partitions, no dependency needed.
        let mut x = self.rng;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.rng = x;
        x
    }
}

struct ProducerInner {
    net: Arc<NetworkClient>,
    config: ProducerConfig,
    /// The transactional id's coordinator, for a transactional producer.
    coordinator: Option<TransactionCoordinator>,
    state: Mutex<Accumulator>,
    wake: Notify,
    idle: Notify,
    memory: Semaphore,
}

/// An asynchronous, batching, idempotent producer.
///
/// ```no_run
/// use rill_client::{ClientConfig, Producer, ProducerConfig, ProducerRecord};
///
/// # async fn run() -> rill_client::Result<()> {
/// let producer = Producer::new(ProducerConfig::new(ClientConfig::new("127.0.0.1:9092")))?;
/// let delivery = producer.send(ProducerRecord::new("orders", "hello").key("k1")).await?;
/// let metadata = delivery.await?;
/// println!("written at {}-{}@{}", metadata.topic, metadata.partition, metadata.offset);
/// producer.close().await?;
/// # Ok(()) }
/// ```
pub struct Producer {
    inner: Arc<ProducerInner>,
    sender: Mutex<Option<JoinHandle<()>>>,
}

impl Producer {
    /// Creates a producer and starts its sender task; call from within a tokio runtime.
    /// Nothing is connected until the first record is sent.
    pub fn new(config: ProducerConfig) -> Result<Self> {
        if config.batch_size == 0 {
            return Err(Error::InvalidConfig("batch.size must be positive".into()));
        }
        if config.idempotent() && config.max_in_flight > 5 {
            return Err(Error::InvalidConfig(
                "max.in.flight.requests.per.connection must be at most 5 with idempotence".into(),
            ));
        }
        if config.transactional_id.is_some() && !config.idempotent() {
            return Err(Error::InvalidConfig(
                "transactional.id needs enable.idempotence and acks=all".into(),
            ));
        }
        let net = NetworkClient::new(config.client.clone())?;
        let coordinator = config
            .transactional_id
            .clone()
            .map(|id| TransactionCoordinator::new(id, config.transaction_timeout));
        let txn = coordinator.as_ref().map(|_| TxnPartitions::default());
        let seed = RandomState::new().build_hasher().finish() | 1;
        let inner = Arc::new(ProducerInner {
            net,
            coordinator,
            memory: Semaphore::new(config.buffer_memory.min(Semaphore::MAX_PERMITS)),
            config,
            state: Mutex::new(Accumulator {
                queues: HashMap::new(),
                sticky: HashMap::new(),
                flushing: 0,
                closed: false,
                producer_id: -1,
                producer_epoch: -1,
                pending: 0,
                rng: seed,
                partition_counts: HashMap::new(),
                pool: Vec::new(),
                pool_bytes: 0,
                txn,
                tv2: false,
            }),
            wake: Notify::new(),
            idle: Notify::new(),
        });
        let sender = tokio::spawn(run_sender(inner.clone()));
        Ok(Self {
            inner,
            sender: Mutex::new(Some(sender)),
        })
    }

    /// Queues `record` and returns a future of its delivery. Waits only for metadata of
    /// a topic not seen before (at most `max.block.ms`) and for buffer space.
    pub async fn send(&self, record: ProducerRecord) -> Result<DeliveryFuture> {
        let inner = &self.inner;
        let size = record.size_estimate();
        if size > inner.config.max_request_size {
            return Err(Error::InvalidConfig(format!(
                "record of {size} bytes exceeds max.request.size {}",
                inner.config.max_request_size
            )));
        }
        let permits = u32::try_from(size).unwrap_or(u32::MAX);
        match inner.memory.try_acquire_many(permits) {
            Ok(p) => p.forget(),
            Err(TryAcquireError::Closed) => return Err(Error::Closed),
            Err(TryAcquireError::NoPermits) => {
                // A closed producer fails at once instead of waiting for memory.
                if inner.lock()?.closed {
                    return Err(Error::Closed);
                }
                inner
                    .memory
                    .acquire_many(permits)
                    .await
                    .map_err(|_| Error::Closed)?
                    .forget();
            }
        }
        let result = self.append(record, permits).await;
        if result.is_err() {
            inner.memory.add_permits(permits as usize);
        }
        result
    }

    /// The rest of [`Self::send`], once `permits` bytes of buffer memory are held: picks
    /// the partition and appends the record under one lock of the accumulator, which also
    /// holds the topic's partition count unless that has to be fetched first.
    async fn append(&self, mut record: ProducerRecord, permits: u32) -> Result<DeliveryFuture> {
        let inner = &self.inner;
        let timestamp = record.timestamp.unwrap_or_else(now_ms);
        let mut fetched: Option<usize> = None;
        loop {
            let generation = inner.net.metadata_generation();
            let appended = {
                let mut state = inner.lock()?;
                if state.closed {
                    return Err(Error::Closed);
                }
                let count = fetched.or_else(|| {
                    state
                        .partition_counts
                        .get(&record.topic)
                        .filter(|c| c.generation == generation)
                        .map(|c| c.count)
                });
                count.map(|count| {
                    self.append_locked(&mut state, &mut record, count, timestamp, permits)
                })
            };
            match appended {
                Some(Ok((delivery, wake))) => {
                    if wake {
                        inner.wake.notify_one();
                    }
                    return Ok(delivery);
                }
                Some(Err(e)) => return Err(e),
                None => {}
            }
            let count = self.partition_count(&record.topic).await?;
            fetched = Some(count);
            if let Some(fresh_until) = inner.net.topic_fresh_until(&record.topic) {
                inner.lock()?.partition_counts.insert(
                    record.topic.clone(),
                    CachedPartitionCount {
                        count,
                        // The generation from before the fetch: anything that changed the
                        // metadata since makes the next record look again.
                        generation,
                        fresh_until,
                    },
                );
            }
        }
    }

    /// Appends `record` to its partition's open batch (starting one when needed) and
    /// returns its delivery future and whether the sender should be woken.
    fn append_locked(
        &self,
        state: &mut Accumulator,
        record: &mut ProducerRecord,
        partition_count: usize,
        timestamp: i64,
        permits: u32,
    ) -> Result<(DeliveryFuture, bool)> {
        let config = &self.inner.config;
        if let Some(p) = record.partition {
            if p < 0 || p as usize >= partition_count {
                return Err(Error::UnknownPartition {
                    topic: record.topic.clone(),
                    partition: p,
                });
            }
        }
        // The record's own topic string becomes the key: no allocation per record.
        let mut tp = TopicPartition {
            topic: std::mem::take(&mut record.topic),
            partition: 0,
        };
        tp.partition = match (record.partition, &record.key) {
            (Some(p), _) => p,
            (None, Some(key)) => partition_for_key(key, partition_count),
            (None, None) => sticky_partition(
                state,
                &mut tp,
                partition_count,
                config.batch_size,
                permits as usize,
            ),
        };
        if let Some(txn) = state.txn.as_mut() {
            if !txn.open {
                return Err(Error::IllegalState(
                    "a transactional producer sends only inside a transaction (begin_transaction)"
                        .into(),
                ));
            }
            if !txn.added.contains(&tp) && !txn.pending.contains(&tp) {
                txn.pending.insert(tp.clone());
            }
        }
        if !state.queues.contains_key(&tp) {
            state.queues.insert(tp.clone(), PartitionQueue::default());
        }
        let Accumulator {
            queues,
            pool,
            pool_bytes,
            pending,
            ..
        } = state;
        let Some(queue) = queues.get_mut(&tp) else {
            return Err(Error::IllegalState("no partition queue".into()));
        };
        let mut wake = false;
        let size = permits as usize;
        let needs_new = match queue.batches.back() {
            Some(b) => {
                b.full
                    || b.base_sequence.is_some()
                    || b.builder.size_in_bytes() + size > config.batch_size
            }
            None => true,
        };
        if needs_new {
            if let Some(last) = queue.batches.back_mut() {
                if !last.full {
                    last.full = true;
                    wake = true;
                }
            }
            let buffer = match pool.pop() {
                Some(b) => {
                    *pool_bytes -= b.capacity();
                    b
                }
                None => Vec::new(),
            };
            let mut builder = RecordBatchBuilder::with_buffer(config.compression, 0, buffer);
            // Room for the whole batch at once: growing step by step would copy it again.
            builder.reserve(config.batch_size.min(config.max_request_size).max(size));
            queue.batches.push_back(ProducerBatch {
                outcome: OutcomeSender::new(&tp),
                tp,
                builder,
                created: Instant::now(),
                records: 0,
                memory: 0,
                base_sequence: None,
                encoded: None,
                retry_after: None,
                full: false,
            });
        }
        let Some(batch) = queue.batches.back_mut() else {
            return Err(Error::IllegalState("no open batch".into()));
        };
        batch.builder.append(
            timestamp,
            record.key.as_deref(),
            record.value.as_deref(),
            &record.headers,
        )?;
        let delivery = DeliveryFuture {
            outcome: batch.outcome.0.clone(),
            index: u32::try_from(batch.records).unwrap_or(u32::MAX),
            timestamp,
            waker_slot: None,
        };
        batch.records += 1;
        batch.memory += size;
        if batch.builder.size_in_bytes() >= config.batch_size {
            batch.full = true;
            wake = true;
        }
        wake |= *pending == 0;
        *pending += 1;
        Ok((delivery, wake))
    }

    /// Sends `record` and waits for its delivery.
    pub async fn send_and_wait(&self, record: ProducerRecord) -> Result<RecordMetadata> {
        self.send(record).await?.await
    }

    /// Sends everything queued now, and waits until every record sent so far is
    /// acknowledged or failed.
    pub async fn flush(&self) -> Result<()> {
        self.inner.lock()?.flushing += 1;
        self.inner.wake.notify_one();
        let result = self.wait_idle().await;
        if let Ok(mut s) = self.inner.lock() {
            s.flushing -= 1;
        }
        result
    }

    async fn wait_idle(&self) -> Result<()> {
        loop {
            let notified = self.inner.idle.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.inner.lock()?.pending == 0 {
                return Ok(());
            }
            // The sender may have stopped (a bug or a panic); do not wait forever on it.
            if self
                .sender
                .lock()
                .map(|s| s.as_ref().is_none_or(|h| h.is_finished()))
                .unwrap_or(true)
            {
                return Err(Error::Closed);
            }
            let _ = tokio::time::timeout(Duration::from_millis(500), notified).await;
        }
    }

    /// Registers the `transactional.id` with its transaction coordinator
    /// (InitProducerId): this producer gets the id's producer id under a new epoch, which
    /// fences any older producer of the same id and aborts a transaction one left open.
    /// Call once, before the first [`Self::begin_transaction`].
    ///
    /// ```no_run
    /// use rill_client::{ClientConfig, Producer, ProducerConfig, ProducerRecord};
    ///
    /// # async fn run() -> rill_client::Result<()> {
    /// let config = ProducerConfig::new(ClientConfig::new("127.0.0.1:9092"))
    ///     .transactional_id("orders-copier");
    /// let producer = Producer::new(config)?;
    /// producer.init_transactions().await?;
    /// producer.begin_transaction()?;
    /// producer.send(ProducerRecord::new("orders", "one")).await?;
    /// producer.send(ProducerRecord::new("orders", "two")).await?;
    /// // Both or neither reach read_committed consumers.
    /// producer.commit_transaction().await?;
    /// # Ok(()) }
    /// ```
    pub async fn init_transactions(&self) -> Result<()> {
        let coordinator = self.coordinator()?;
        if self.inner.lock()?.txn.as_ref().is_some_and(|t| t.open) {
            return Err(Error::IllegalState(
                "init_transactions with a transaction open".into(),
            ));
        }
        let (producer_id, producer_epoch) = coordinator
            .init_producer_id(&self.inner.net, self.inner.config.max_block)
            .await?;
        let tv2 = coordinator
            .transaction_version_2(&self.inner.net, self.inner.config.max_block)
            .await?;
        let mut s = self.inner.lock()?;
        s.producer_id = producer_id;
        s.producer_epoch = producer_epoch;
        s.tv2 = tv2;
        for q in s.queues.values_mut() {
            q.next_sequence = 0;
        }
        s.txn = Some(TxnPartitions::default());
        Ok(())
    }

    /// Opens a transaction: the records sent until [`Self::commit_transaction`] or
    /// [`Self::abort_transaction`] become visible to read_committed consumers together,
    /// or never.
    pub fn begin_transaction(&self) -> Result<()> {
        self.coordinator()?;
        let mut s = self.inner.lock()?;
        if s.producer_id < 0 {
            return Err(Error::IllegalState(
                "begin_transaction before init_transactions".into(),
            ));
        }
        let Some(txn) = s.txn.as_mut() else {
            return Err(Error::IllegalState("not a transactional producer".into()));
        };
        if txn.open {
            return Err(Error::IllegalState("a transaction is open already".into()));
        }
        *txn = TxnPartitions {
            open: true,
            ..Default::default()
        };
        Ok(())
    }

    /// Sends what the transaction still holds, waits for every record of it, then commits
    /// it (EndTxn). When a record of the transaction failed, the commit is refused with
    /// that error and the transaction stays open, to be aborted.
    pub async fn commit_transaction(&self) -> Result<()> {
        self.end_transaction(true).await
    }

    /// Waits for the records already sent, then aborts the transaction (EndTxn): none of
    /// its records reach read_committed consumers.
    pub async fn abort_transaction(&self) -> Result<()> {
        self.end_transaction(false).await
    }

    async fn end_transaction(&self, commit: bool) -> Result<()> {
        let coordinator = self.coordinator()?;
        if !self.inner.lock()?.txn.as_ref().is_some_and(|t| t.open) {
            return Err(Error::IllegalState("no transaction is open".into()));
        }
        self.flush().await?;
        let (ids, started) = {
            let mut s = self.inner.lock()?;
            let ids = (s.producer_id, s.producer_epoch);
            let Some(txn) = s.txn.as_mut() else {
                return Err(Error::IllegalState("not a transactional producer".into()));
            };
            if commit {
                if let Some(e) = txn.failed.clone() {
                    return Err(e);
                }
            }
            (ids, !txn.added.is_empty())
        };
        // A transaction that wrote nothing has nothing for the coordinator to end (the
        // Java client completes it without EndTxn too).
        if started {
            let tv2 = self.inner.lock()?.tv2;
            let next = coordinator
                .end_txn(
                    &self.inner.net,
                    self.inner.config.max_block,
                    ids,
                    commit,
                    tv2,
                )
                .await?;
            if let Some((producer_id, producer_epoch)) = next {
                // The epoch was bumped (or the id rotated): the next transaction starts
                // every partition at sequence 0 again.
                let mut s = self.inner.lock()?;
                s.producer_id = producer_id;
                s.producer_epoch = producer_epoch;
                for q in s.queues.values_mut() {
                    q.next_sequence = 0;
                }
            }
        }
        if let Some(txn) = self.inner.lock()?.txn.as_mut() {
            *txn = TxnPartitions::default();
        }
        Ok(())
    }

    fn coordinator(&self) -> Result<&TransactionCoordinator> {
        self.inner.coordinator.as_ref().ok_or_else(|| {
            Error::IllegalState("not a transactional producer (no transactional.id)".into())
        })
    }

    /// Flushes, stops the sender task and closes the connections. A transaction left open
    /// is not ended here: its coordinator aborts it after `transaction.timeout.ms`.
    pub async fn close(&self) -> Result<()> {
        let flushed = self.flush().await;
        self.inner.lock()?.closed = true;
        self.inner.wake.notify_one();
        let handle = self.sender.lock().ok().and_then(|mut s| s.take());
        if let Some(h) = handle {
            let _ = h.await;
        }
        self.inner.net.close();
        flushed
    }

    /// Partitions of `topic`, fetching its metadata if need be (auto-creating it when
    /// the broker allows).
    pub async fn partitions_for(&self, topic: &str) -> Result<usize> {
        self.partition_count(topic).await
    }

    async fn partition_count(&self, topic: &str) -> Result<usize> {
        let deadline = Instant::now() + self.inner.config.max_block;
        let topics = [topic.to_string()];
        loop {
            let md = match self.inner.net.ensure_topics(&topics).await {
                Ok(md) => Some(md),
                Err(e) if e.is_retriable() && Instant::now() < deadline => None,
                Err(e) => return Err(e),
            };
            if let Some(n) = md.as_ref().and_then(|m| m.partition_count(topic)) {
                if n > 0 {
                    return Ok(n);
                }
            }
            if Instant::now() >= deadline {
                return Err(Error::UnknownTopic(topic.to_string()));
            }
            // An auto-created topic may take a moment to show up.
            tokio::time::sleep(self.inner.config.client.retry_backoff).await;
            self.inner.net.invalidate_metadata();
        }
    }
}

impl Drop for Producer {
    fn drop(&mut self) {
        if let Ok(mut s) = self.inner.state.lock() {
            s.closed = true;
        }
        self.inner.wake.notify_one();
    }
}

impl ProducerInner {
    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Accumulator>> {
        self.state
            .lock()
            .map_err(|_| Error::IllegalState("producer state poisoned".into()))
    }

    fn complete(&self, batch: ProducerBatch, result: Result<(i64, i64)>) {
        let n = batch.records;
        let failed = result.as_ref().err().cloned();
        batch.outcome.set(result);
        self.memory.add_permits(batch.memory);
        if let Ok(mut s) = self.state.lock() {
            s.pending = s.pending.saturating_sub(n);
            if let (Some(e), Some(txn)) = (failed, s.txn.as_mut()) {
                txn.failed.get_or_insert(e);
            }
            if let Some(q) = s.queues.get_mut(&batch.tp) {
                q.in_flight = q.in_flight.saturating_sub(1);
            }
            if let Some(buffer) = batch.encoded {
                // Keep at most buffer.memory in the pool: what the producer may hold in
                // records anyway.
                if s.pool_bytes + buffer.capacity() <= self.config.buffer_memory {
                    s.pool_bytes += buffer.capacity();
                    s.pool.push(buffer);
                }
            }
        }
        self.idle.notify_waiters();
        self.wake.notify_one();
    }

    /// Puts a batch that failed with a retriable error back at the head of its queue,
    /// or fails it once its delivery timeout has passed.
    fn retry(&self, mut batch: ProducerBatch, error: Error) {
        if batch.created.elapsed() >= self.config.delivery_timeout {
            self.complete(batch, Err(error));
            return;
        }
        tracing::debug!(partition = %batch.tp, %error, "retrying batch");
        batch.retry_after = Some(Instant::now() + self.config.client.retry_backoff);
        batch.full = true;
        if let Ok(mut s) = self.state.lock() {
            let q = s.queues.entry(batch.tp.clone()).or_default();
            q.in_flight = q.in_flight.saturating_sub(1);
            // Keep sequence order among batches that already have one.
            let pos = q
                .batches
                .iter()
                .position(|b| match (b.base_sequence, batch.base_sequence) {
                    (Some(other), Some(mine)) => other > mine,
                    _ => true,
                })
                .unwrap_or(q.batches.len());
            q.batches.insert(pos, batch);
        }
        self.wake.notify_one();
    }

    /// Takes the batches that may be sent now; returns them and when to look again.
    fn drain(&self) -> (Vec<ProducerBatch>, Option<Instant>, bool) {
        let Ok(mut s) = self.state.lock() else {
            return (Vec::new(), None, true);
        };
        let now = Instant::now();
        // Partition counts due for a refresh are dropped here rather than checked on every
        // record (a clock read each): the sender comes by at least every 200 ms.
        s.partition_counts.retain(|_, c| c.fresh_until > now);
        let linger = self.config.linger;
        let urgent = s.flushing > 0 || s.closed;
        let max_in_flight = self.config.max_in_flight.max(1);
        let idempotent = self.config.idempotent();
        let transactional = self.coordinator.is_some();
        let (pid, epoch) = (s.producer_id, s.producer_epoch);
        let mut ready = Vec::new();
        let mut next: Option<Instant> = None;
        let mut expired = Vec::new();
        let Accumulator { queues, txn, .. } = &mut *s;
        for (tp, q) in queues.iter_mut() {
            // A transaction's partition is sent to once AddPartitionsToTxn has added it.
            let sendable = txn.as_ref().is_none_or(|t| t.added.contains(tp));
            while let Some(front) = q.batches.front() {
                if front.records == 0 {
                    q.batches.pop_front();
                    continue;
                }
                if front.base_sequence.is_none()
                    && front.created.elapsed() >= self.config.delivery_timeout
                {
                    if let Some(b) = q.batches.pop_front() {
                        expired.push(b);
                    }
                    continue;
                }
                let retried = front.base_sequence.is_some();
                if !sendable || q.in_flight >= max_in_flight || (retried && q.in_flight > 0) {
                    break;
                }
                if let Some(at) = front.retry_after {
                    if at > now {
                        next = Some(next.map_or(at, |n: Instant| n.min(at)));
                        break;
                    }
                }
                let due = front.created + linger;
                let is_ready = front.full || urgent || q.batches.len() > 1 || due <= now || retried;
                if !is_ready {
                    next = Some(next.map_or(due, |n: Instant| n.min(due)));
                    break;
                }
                let Some(mut batch) = q.batches.pop_front() else {
                    break;
                };
                if idempotent && batch.base_sequence.is_none() {
                    if pid < 0 {
                        q.batches.push_front(batch);
                        break;
                    }
                    let seq = q.next_sequence;
                    q.next_sequence = seq.wrapping_add(batch.records as i32) & i32::MAX;
                    batch.base_sequence = Some(seq);
                    let builder = std::mem::replace(
                        &mut batch.builder,
                        RecordBatchBuilder::new(CompressionType::None, 0),
                    );
                    batch.builder = builder
                        .producer(pid, epoch, seq)
                        .transactional(transactional);
                }
                q.in_flight += 1;
                ready.push(batch);
                if !idempotent && retried {
                    break;
                }
            }
        }
        let done = s.closed && s.pending == 0;
        drop(s);
        for b in expired {
            // Counted as in flight by `complete`'s bookkeeping; balance it.
            if let Ok(mut s) = self.state.lock() {
                s.queues.entry(b.tp.clone()).or_default().in_flight += 1;
            }
            let after = self.config.delivery_timeout;
            self.complete(
                b,
                Err(Error::Timeout {
                    what: "record delivery".into(),
                    after,
                }),
            );
        }
        (ready, next, done)
    }
}

/// The topic's sticky partition for a record of `record_bytes` without key or partition,
/// set in `tp.partition`; `tp` is only a key for lookups here. As Kafka's built-in
/// partitioner (KIP-794): the partition changes once `batch.size` bytes went to it, and
/// also when its batch was closed (KIP-480). Without the first rule a producer whose
/// batches leave at once (`linger.ms=0`) never finds a batch closed and sends everything
/// to one partition.
fn sticky_partition(
    state: &mut Accumulator,
    tp: &mut TopicPartition,
    partition_count: usize,
    batch_size: usize,
    record_bytes: usize,
) -> i32 {
    let n = partition_count.max(1) as u64;
    let current = state.sticky.get(&tp.topic).copied();
    if let Some((p, produced)) = current {
        tp.partition = p;
        let queue = state.queues.get(tp);
        let open = queue.and_then(|q| q.batches.back()).is_some_and(|b| {
            !b.full && b.base_sequence.is_none() && b.builder.size_in_bytes() < batch_size
        });
        let any_batch = queue.is_some_and(|q| !q.batches.is_empty());
        if produced < batch_size && (open || !any_batch) && (p as u64) < n {
            if let Some(entry) = state.sticky.get_mut(&tp.topic) {
                entry.1 = produced.saturating_add(record_bytes);
            }
            return p;
        }
    }
    let mut p = (state.random() % n) as i32;
    if n > 1 && current.is_some_and(|(c, _)| c == p) {
        p = ((p as u64 + 1) % n) as i32;
    }
    state.sticky.insert(tp.topic.clone(), (p, record_bytes));
    p
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

async fn run_sender(inner: Arc<ProducerInner>) {
    loop {
        // A transactional producer has its id from init_transactions.
        let needs_pid = inner.config.idempotent()
            && inner.coordinator.is_none()
            && inner
                .state
                .lock()
                .map(|s| s.producer_id < 0 && s.pending > 0)
                .unwrap_or(false);
        if needs_pid {
            if let Err(e) = init_producer_id(&inner).await {
                tracing::warn!(error = %e, "InitProducerId failed, retrying");
                let closed = inner.state.lock().map(|s| s.closed).unwrap_or(true);
                if closed {
                    fail_all(&inner, e);
                    return;
                }
                tokio::time::sleep(inner.config.client.retry_backoff).await;
                continue;
            }
        }
        let notified = inner.wake.notified();
        if let Some(coordinator) = &inner.coordinator {
            add_partitions(&inner, coordinator).await;
        }
        let (ready, next, done) = inner.drain();
        if done {
            return;
        }
        if !ready.is_empty() {
            dispatch(&inner, ready).await;
        }
        let wait = next
            .map(|at| at.saturating_duration_since(Instant::now()))
            .unwrap_or(Duration::from_millis(200));
        let _ = tokio::time::timeout(wait, notified).await;
    }
}

fn fail_all(inner: &ProducerInner, error: Error) {
    let batches: Vec<ProducerBatch> = match inner.state.lock() {
        Ok(mut s) => s
            .queues
            .values_mut()
            .flat_map(|q| {
                q.in_flight += q.batches.len();
                q.batches.drain(..).collect::<Vec<_>>()
            })
            .collect(),
        Err(_) => return,
    };
    for b in batches {
        inner.complete(b, Err(error.clone()));
    }
}

/// AddPartitionsToTxn for the open transaction's partitions that have records and are
/// not in it yet. When it fails (after the coordinator call's own retries), their batches
/// fail with its error, and so does the transaction's commit.
async fn add_partitions(inner: &ProducerInner, coordinator: &TransactionCoordinator) {
    let (pending, ids) = match inner.state.lock() {
        Ok(mut s) if s.producer_id >= 0 => {
            let ids = (s.producer_id, s.producer_epoch);
            let tv2 = s.tv2;
            match s.txn.as_mut() {
                // Transaction version 2: the leaders add the partitions on Produce v12.
                Some(t) if tv2 => {
                    let pending = std::mem::take(&mut t.pending);
                    t.added.extend(pending);
                    return;
                }
                Some(t) if !t.pending.is_empty() => (
                    std::mem::take(&mut t.pending)
                        .into_iter()
                        .collect::<Vec<_>>(),
                    ids,
                ),
                _ => return,
            }
        }
        _ => return,
    };
    let result = coordinator
        .add_partitions(&inner.net, inner.config.max_block, ids, &pending)
        .await;
    let Err(error) = result else {
        if let Ok(mut s) = inner.state.lock() {
            if let Some(t) = s.txn.as_mut() {
                t.added.extend(pending);
            }
        }
        return;
    };
    tracing::warn!(%error, "AddPartitionsToTxn failed; the transaction can only abort");
    let mut batches: Vec<ProducerBatch> = Vec::new();
    if let Ok(mut s) = inner.state.lock() {
        for tp in &pending {
            if let Some(q) = s.queues.get_mut(tp) {
                // `complete` takes each one out of flight.
                q.in_flight += q.batches.len();
                batches.extend(q.batches.drain(..));
            }
        }
    }
    for b in batches {
        inner.complete(b, Err(error.clone()));
    }
}

async fn init_producer_id(inner: &ProducerInner) -> Result<()> {
    let request = InitProducerIdRequest {
        transactional_id: None,
        transaction_timeout_ms: -1,
        producer_id: -1,
        producer_epoch: -1,
        ..Default::default()
    };
    let response = inner
        .net
        .send_any(&request, INIT_PRODUCER_ID_VERSION)
        .await?;
    crate::error::check(response.error_code, || "InitProducerId".into())?;
    let mut s = inner.lock()?;
    s.producer_id = response.producer_id;
    s.producer_epoch = response.producer_epoch;
    for q in s.queues.values_mut() {
        q.next_sequence = 0;
    }
    Ok(())
}

/// Groups ready batches by leader and sends one Produce request per leader, each on its
/// own task so a slow broker does not hold up the others.
async fn dispatch(inner: &Arc<ProducerInner>, ready: Vec<ProducerBatch>) {
    let md = inner.net.metadata();
    let mut by_leader: BTreeMap<i32, Vec<ProducerBatch>> = BTreeMap::new();
    let mut leaderless = Vec::new();
    for mut batch in ready {
        if batch.encoded.is_none() {
            // The placeholder is never appended to: the batch is closed once taken.
            let builder = std::mem::replace(
                &mut batch.builder,
                RecordBatchBuilder::new(CompressionType::None, 0),
            );
            match builder.finish() {
                Ok(bytes) => batch.encoded = Some(bytes),
                Err(e) => {
                    inner.complete(batch, Err(e.into()));
                    continue;
                }
            }
        }
        let leader = md
            .topics
            .get(&batch.tp.topic)
            .and_then(|t| {
                t.partitions
                    .iter()
                    .find(|p| p.partition == batch.tp.partition)
            })
            .map(|p| p.leader)
            .filter(|l| *l >= 0 && md.brokers.contains_key(l));
        match leader {
            Some(l) => by_leader.entry(l).or_default().push(batch),
            None => leaderless.push(batch),
        }
    }
    if !leaderless.is_empty() {
        let topics: Vec<String> = leaderless.iter().map(|b| b.tp.topic.clone()).collect();
        inner.net.invalidate_metadata();
        let net = inner.net.clone();
        tokio::spawn(async move {
            let _ = net.refresh_metadata(Some(&topics)).await;
        });
        for b in leaderless {
            let error = Error::kafka(
                ErrorCode::LEADER_NOT_AVAILABLE,
                format!("producing to {}", b.tp),
            );
            inner.retry(b, error);
        }
    }
    for (leader, batches) in by_leader {
        // One batch per partition per request (Kafka's rule: answers are keyed by
        // partition), so the i-th batch of every partition goes in the i-th request.
        let mut rounds: Vec<Vec<ProducerBatch>> = Vec::new();
        let mut next_round: HashMap<TopicPartition, usize> = HashMap::new();
        for b in batches {
            let round = next_round.entry(b.tp.clone()).or_insert(0);
            if rounds.len() <= *round {
                rounds.push(Vec::new());
            }
            if let Some(r) = rounds.get_mut(*round) {
                r.push(b);
            }
            *round += 1;
        }
        for round in rounds {
            send_produce(inner, leader, round).await;
        }
    }
}

/// One topic of a Produce request: its name and, per partition, the index and the
/// record batch to splice in.
type TopicBatches<'a> = (&'a str, Vec<(i32, &'a [u8])>);

/// Error, base offset, log append time and message of one partition's answer.
type PartitionResult = (ErrorCode, i64, i64, Option<String>);

/// Writes one Produce request on the sender task, so that requests reach the broker in
/// the order the sender took the batches (one partition's batches in sequence order),
/// and awaits its answer on a task of its own.
async fn send_produce(inner: &Arc<ProducerInner>, leader: i32, batches: Vec<ProducerBatch>) {
    let conn = match inner.net.node_connection(leader).await {
        Ok(c) => c,
        Err(e) => {
            inner.net.invalidate_metadata();
            for b in batches {
                inner.retry(b, e.clone());
            }
            return;
        }
    };
    // Partitions grouped by topic, as the request lists them; the batches themselves are
    // not copied into the frame but written from their own buffers.
    let mut topics: BTreeMap<&str, Vec<(i32, &[u8])>> = BTreeMap::new();
    for b in &batches {
        topics
            .entry(&b.tp.topic)
            .or_default()
            .push((b.tp.partition, b.encoded.as_deref().unwrap_or_default()));
    }
    let topics: Vec<TopicBatches<'_>> = topics.into_iter().collect();
    let timeout_ms =
        i32::try_from(inner.config.client.request_timeout.as_millis()).unwrap_or(i32::MAX);
    let acks = inner.config.acks;
    let transactional_id = inner.config.transactional_id.as_deref();
    let tv2 = inner.state.lock().map(|s| s.tv2).unwrap_or(false);
    let frame = conn
        .begin_spliced::<ProduceRequest>(if tv2 {
            PRODUCE_TV2_VERSION
        } else {
            PRODUCE_VERSION
        })
        .and_then(|mut frame| {
            encode_produce(
                &mut frame,
                transactional_id,
                acks.wire(),
                timeout_ms,
                &topics,
            )?;
            Ok(frame)
        });
    let spliced: Vec<&[u8]> = topics
        .iter()
        .flat_map(|(_, partitions)| partitions.iter().map(|(_, records)| *records))
        .collect();
    let written = match frame {
        Ok(frame) => {
            conn.write_spliced::<ProduceRequest>(frame, &spliced, acks != Acks::None)
                .await
        }
        Err(e) => Err(e),
    };
    drop(spliced);
    drop(topics);
    if acks == Acks::None {
        let result = written.map(|_| (-1, -1));
        for b in batches {
            inner.complete(b, result.clone());
        }
        return;
    }
    let in_flight = match written {
        Ok(Some(f)) => f,
        Ok(None) => {
            let e = Error::IllegalState("no answer expected for a Produce request".into());
            fail_request(inner, batches, e);
            return;
        }
        Err(e) => {
            fail_request(inner, batches, e);
            return;
        }
    };
    let inner = inner.clone();
    tokio::spawn(async move {
        match in_flight.response().await {
            Ok(response) => handle_produce_response(&inner, batches, response),
            Err(e) => fail_request(&inner, batches, e),
        }
    });
}

/// Encodes a ProduceRequest body (any version up to 11) after the header in `frame`,
/// with each partition's record batch spliced in rather than copied: the same bytes as
/// the generated `ProduceRequest` encoder, without its copy of every batch.
fn encode_produce(
    frame: &mut SplicedFrame,
    transactional_id: Option<&str>,
    acks: i16,
    timeout_ms: i32,
    topics: &[TopicBatches<'_>],
) -> Result<()> {
    let version = frame.version;
    // From 3, as Kafka 4's spec (KIP-896 removed 0-2); the client sends 11 or 12.
    if !(3..=PRODUCE_TV2_VERSION).contains(&version) {
        return Err(Error::Encode(
            rill_protocol::EncodeError::UnsupportedVersion {
                message: "ProduceRequest",
                version,
            },
        ));
    }
    let flexible = version >= 9;
    if version >= 3 {
        write_nullable_string(
            &mut frame.head,
            flexible,
            true,
            transactional_id,
            "TransactionalId",
        )?;
    }
    frame.head.put_i16(acks);
    frame.head.put_i32(timeout_ms);
    write_array_len(&mut frame.head, flexible, Some(topics.len()))?;
    for (name, partitions) in topics {
        write_string(&mut frame.head, flexible, name)?;
        write_array_len(&mut frame.head, flexible, Some(partitions.len()))?;
        for (index, records) in partitions {
            frame.head.put_i32(*index);
            let len = records.len();
            if flexible {
                // Compact nullable bytes: length + 1.
                let len = u32::try_from(len + 1)
                    .map_err(|_| Error::Encode(rill_protocol::EncodeError::TooLong(len)))?;
                put_unsigned_varint(&mut frame.head, len);
            } else {
                let len = i32::try_from(len)
                    .map_err(|_| Error::Encode(rill_protocol::EncodeError::TooLong(len)))?;
                frame.head.put_i32(len);
            }
            frame.splice_here();
            if flexible {
                write_tagged_count(&mut frame.head, 0)?;
            }
        }
        if flexible {
            write_tagged_count(&mut frame.head, 0)?;
        }
    }
    if flexible {
        write_tagged_count(&mut frame.head, 0)?;
    }
    Ok(())
}

/// A request that got no answer: retry its batches if that may help.
fn fail_request(inner: &ProducerInner, batches: Vec<ProducerBatch>, e: Error) {
    if e.is_retriable() {
        inner.net.invalidate_metadata();
        for b in batches {
            inner.retry(b, e.clone());
        }
    } else {
        for b in batches {
            inner.complete(b, Err(e.clone()));
        }
    }
}

fn handle_produce_response(
    inner: &ProducerInner,
    batches: Vec<ProducerBatch>,
    response: ProduceResponse,
) {
    let mut results: HashMap<(String, i32), PartitionResult> = HashMap::new();
    for t in response.responses {
        for p in t.partition_responses {
            results.insert(
                (t.name.clone(), p.index),
                (
                    ErrorCode::from_code(p.error_code),
                    p.base_offset,
                    p.log_append_time_ms,
                    p.error_message,
                ),
            );
        }
    }
    for b in batches {
        let key = (b.tp.topic.clone(), b.tp.partition);
        let Some((code, base, append_time, message)) = results.remove(&key) else {
            let e = Error::kafka(
                ErrorCode::UNKNOWN_SERVER_ERROR,
                format!("no answer for {}", b.tp),
            );
            inner.retry(b, e);
            continue;
        };
        let context = format!("producing to {}", b.tp);
        match code {
            c if c.is_ok() => inner.complete(b, Ok((base, append_time))),
            ErrorCode::DUPLICATE_SEQUENCE_NUMBER => inner.complete(b, Ok((base, append_time))),
            ErrorCode::OUT_OF_ORDER_SEQUENCE_NUMBER => {
                // An earlier batch of this partition failed; ours comes back after it.
                inner.retry(b, Error::kafka_msg(code, context, message));
            }
            c if c.is_retriable() => {
                if matches!(
                    c,
                    ErrorCode::NOT_LEADER_OR_FOLLOWER
                        | ErrorCode::UNKNOWN_TOPIC_OR_PARTITION
                        | ErrorCode::LEADER_NOT_AVAILABLE
                ) {
                    inner.net.invalidate_metadata();
                    let net = inner.net.clone();
                    let topic = b.tp.topic.clone();
                    tokio::spawn(async move {
                        let _ = net.refresh_metadata(Some(&[topic])).await;
                    });
                }
                inner.retry(b, Error::kafka_msg(c, context, message));
            }
            c => inner.complete(b, Err(Error::kafka_msg(c, context, message))),
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::BytesMut;
    use rill_protocol::encode_request_frame;
    use rill_protocol::generated::produce_request::{PartitionProduceData, TopicProduceData};
    use rill_protocol::generated::RequestHeader;
    use rill_protocol::ApiKey;

    use super::*;

    /// The spliced Produce frame must be byte for byte what the generated encoder writes
    /// for the same request, at every version.
    #[test]
    fn spliced_produce_frame_matches_the_generated_encoder() {
        let big: Vec<u8> = (0..70_000u32).map(|i| (i * 31 % 251) as u8).collect();
        let topics: Vec<TopicBatches<'_>> = vec![
            (
                "orders",
                vec![(0, &b"batch-0"[..]), (3, &big[..]), (5, &[][..])],
            ),
            ("t", vec![(1, &big[..1000])]),
        ];
        let empty: Vec<TopicBatches<'_>> = Vec::new();
        let cases = [(&topics, None), (&empty, None), (&topics, Some("copier-7"))];
        for version in 3..=PRODUCE_TV2_VERSION {
            for (topics, transactional_id) in cases {
                let header = RequestHeader {
                    request_api_key: ApiKey::Produce.as_i16(),
                    request_api_version: version,
                    correlation_id: 77,
                    client_id: Some("rill-test".into()),
                    ..Default::default()
                };
                let request = ProduceRequest {
                    // Below v3 there is no field for it.
                    transactional_id: transactional_id.filter(|_| version >= 3).map(String::from),
                    acks: -1,
                    timeout_ms: 30_000,
                    topic_data: topics
                        .iter()
                        .map(|(name, partitions)| TopicProduceData {
                            name: name.to_string(),
                            partition_data: partitions
                                .iter()
                                .map(|(index, records)| PartitionProduceData {
                                    index: *index,
                                    records: Some(Bytes::copy_from_slice(records)),
                                    ..Default::default()
                                })
                                .collect(),
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                };
                let mut expected = BytesMut::new();
                encode_request_frame(&mut expected, &header, &request).unwrap();

                let header_version = ApiKey::Produce.request_header_version(version);
                let mut frame = SplicedFrame::new(&header, header_version).unwrap();
                encode_produce(&mut frame, transactional_id, -1, 30_000, topics).unwrap();
                let spliced: Vec<&[u8]> = topics
                    .iter()
                    .flat_map(|(_, ps)| ps.iter().map(|(_, r)| *r))
                    .collect();
                assert_eq!(
                    frame.assemble(&spliced),
                    expected.to_vec(),
                    "version {version}, transactional id {transactional_id:?}"
                );
            }
        }
    }
}
