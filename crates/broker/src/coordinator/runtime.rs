//! The coordinator runtime (Kafka's `CoordinatorRuntime`): one task that hosts a pure
//! coordinator state machine (a [`CoordinatorShard`]) on the partitions of an internal
//! topic this broker leads. The shard decides; the runtime does the I/O — it loads a
//! partition by replaying its log, appends the shard's records with acks=all, reports
//! the high watermark, runs the shard's timers and drops a partition's state when its
//! leadership moves away. The group coordinator (`__consumer_offsets`) and the
//! transaction coordinator (`__transaction_state`) are its two users.
//!
//! # Design note
//!
//! 1. One task owns the shard. Connections send it calls over a bounded channel with a
//!    oneshot for the answer, so the shard sees one event at a time and needs no lock
//!    (the seeds' single-threaded event loop).
//! 2. A call the shard cannot answer at once gets a responder id; its oneshot waits in
//!    `pending` until an output names that id, possibly many calls or ticks later.
//! 3. [`CoordinatorOutput::Append`] records are appended to their partitions in the
//!    order the outputs came, and the shard is told where each batch ended
//!    ([`CoordinatorShard::appended`]). The replies held with them wait until the high
//!    watermark has passed every batch (Kafka appends these with acks=all), so no client
//!    hears of a change that a crash of this broker could lose. The wait runs beside the
//!    task, which goes on serving; when it ends, the task tells the shard
//!    ([`CoordinatorShard::replicated`], which makes the change visible) before it sends
//!    the held replies, so a client reads its own write.
//! 4. A failed append answers the held replies with [`WriteFailure::Append`] and reloads
//!    the partition from the log, which rebuilds exactly what was written. A failed wait
//!    (leadership moved, timeout) answers them with [`WriteFailure::Replication`]; the
//!    records stay in the log, and a shard that keeps records above the high watermark
//!    apart (the group coordinator) agrees with the log whether they later commit or are
//!    truncated, while one that does not ([`CoordinatorShard::RELOAD_AFTER_FAILED_WAIT`])
//!    is reloaded from the log.
//! 5. While the shard holds records above the high watermark
//!    ([`CoordinatorShard::uncommitted_partitions`]: a timed-out wait, or a loaded tail),
//!    the task polls those partitions' high watermarks every [`HW_POLL`] and reports
//!    them ([`CoordinatorShard::commit_up_to`]), so they become visible once replicated
//!    without a later write.
//! 6. Between events the task sleeps until [`CoordinatorShard::next_deadline`] and then
//!    calls [`CoordinatorShard::tick`].
//! 7. [`CoordinatorOutput::DeleteRecordsBefore`] moves the partition's log start offset
//!    (DeleteRecords on this leader; followers follow it), for a shard whose topic is not
//!    compacted and that knows which prefix no replay needs.
//! 8. The metadata publisher elects the runtime for a partition this broker now leads
//!    ([`CoordinatorHandle::elect`]): the shard replays the partition's log, what is at or
//!    above the high watermark marked uncommitted, before it serves the partition; a
//!    resignation drops the partition's state and the shard answers its clients
//!    NOT_COORDINATOR, so that they find the new coordinator, which replays the same
//!    records.
//!
//! # Why reads see only replicated state
//! Every change reaches the shard's served state through `replicated` or `commit_up_to`,
//! both called with a high watermark this broker read from its own partition after the
//! records were appended; a load marks everything from the high watermark on as
//! uncommitted. So nothing a reader is told can be lost by a failover (DESIGN.md,
//! invariant 9).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use rill_protocol::records::{CompressionType, RecordBatch, RecordBatchBuilder};
use rill_protocol::ErrorCode;
use rill_storage::{AppendOrigin, TopicPartition};
use tokio::sync::{mpsc, oneshot};

use crate::replication::replica_manager::ReplicaManager;

/// Calls waiting for a coordinator task; senders wait (back-pressure) beyond this.
const CALL_QUEUE_DEPTH: usize = 1024;
/// Largest batch of a coordinator's partition decoded while loading.
const LOAD_MAX_DECOMPRESSED_BYTES: usize = 64 * 1024 * 1024;
const LOAD_READ_BYTES: usize = 1024 * 1024;
/// Ended replication waits queued for the coordinator task; waiters wait beyond this.
const REPLICATED_QUEUE_DEPTH: usize = 1024;
/// How often the high watermark of a partition with uncommitted records is read.
pub const HW_POLL: Duration = Duration::from_millis(200);

/// The runtime's handle of a call waiting for its answer.
pub type ResponderId = u64;

/// Why a write's held replies fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteFailure {
    /// The records could not be appended to the local log.
    Append,
    /// Appended, but the high watermark did not pass them: the error of the wait
    /// (NOT_LEADER_OR_FOLLOWER, REQUEST_TIMED_OUT, ...).
    Replication(ErrorCode),
}

/// What a shard asks the runtime to do.
pub enum CoordinatorOutput<R, Y> {
    /// Answer a call now.
    Respond { responder: ResponderId, reply: Y },
    /// Append `records` (partition, record) with acks=all; once every batch is below its
    /// partition's high watermark, call [`CoordinatorShard::replicated`] and then send
    /// `replies`.
    Append {
        write: u64,
        records: Vec<(i32, R)>,
        replies: Vec<(ResponderId, Y)>,
        /// `Some((producer id, epoch))`: in a transactional batch of that producer
        /// (TxnOffsetCommit's offsets, which its transaction's marker settles).
        transactional: Option<(i64, i16)>,
    },
    /// Delete the records of `partition` below `offset`, which no replay needs (Kafka's
    /// share coordinator prunes `__share_group_state` so); at most its high watermark.
    DeleteRecordsBefore { partition: i32, offset: i64 },
}

/// A shard's answer to a call.
pub enum Handled<R, Y> {
    /// The answer, at once (reads of committed state, refusals).
    Reply(Y),
    /// Outputs; the call's answer is one of them now or later, under its responder id.
    Outputs(Vec<CoordinatorOutput<R, Y>>),
}

/// Outputs of shard `S`.
pub type Outputs<S> =
    Vec<CoordinatorOutput<<S as CoordinatorShard>::Record, <S as CoordinatorShard>::Reply>>;

/// A pure coordinator as the runtime hosts it (Kafka's `CoordinatorShard`): inputs and
/// the current time in, records to append and replies out; replaying the records
/// rebuilds the state. Implementations adapt a state machine of a pure crate
/// (`rill-group`, `rill-transaction`) and encode its records in Kafka's formats.
pub trait CoordinatorShard: Send + 'static {
    type Record: Send + 'static;
    type Call: Send + 'static;
    type Reply: Send + 'static;

    /// Whether a failed replication wait reloads the partition from its log (a shard
    /// that cannot hold appended records apart from its served state).
    const RELOAD_AFTER_FAILED_WAIT: bool;

    /// The internal topic, e.g. `__consumer_offsets`.
    fn topic(&self) -> &'static str;
    fn num_partitions(&self) -> i32;
    /// How long a write waits for the high watermark (acks=all) before it fails.
    fn write_timeout(&self) -> Duration;

    /// A record's key and value (`None`: a tombstone) in the topic's format.
    fn encode(&self, record: &Self::Record) -> Result<(Vec<u8>, Option<Vec<u8>>), String>;
    /// A stored record; `None` for records this shard does not own or cannot read.
    fn decode(&self, key: Option<&[u8]>, value: Option<&[u8]>) -> Option<Self::Record>;

    /// Handles a call; `responder` names it in later outputs.
    fn handle(
        &mut self,
        call: Self::Call,
        responder: ResponderId,
        now_ms: i64,
    ) -> Handled<Self::Record, Self::Reply>;
    fn tick(&mut self, now_ms: i64) -> Outputs<Self>;
    /// When [`CoordinatorShard::tick`] should next run.
    fn next_deadline(&self) -> Option<i64>;

    /// A load of `partition` begins: its clients are told to wait.
    fn load_start(&mut self, partition: i32) -> Outputs<Self>;
    /// One record of the partition's log, in order; `committed` when it is below the high
    /// watermark read at the start of the load; `producer_id` when it is in a
    /// transactional batch.
    fn replay(
        &mut self,
        partition: i32,
        offset: i64,
        record: Self::Record,
        committed: bool,
        producer_id: Option<i64>,
    ) -> Result<(), String>;
    /// A transaction marker (COMMIT when `commit`) of `producer_id` in the partition's log.
    fn replay_control(&mut self, _partition: i32, _producer_id: i64, _commit: bool) {}
    /// The log is replayed; `leader_epoch` is this broker's epoch as the partition's
    /// leader (Kafka's coordinator epoch).
    fn load_done(&mut self, partition: i32, leader_epoch: i32, now_ms: i64) -> Outputs<Self>;
    /// The partition's state is dropped (leadership moved, or before a reload).
    fn unload(&mut self, partition: i32) -> Outputs<Self>;
    /// The partitions loaded or loading.
    fn loaded_partitions(&self) -> Vec<i32>;

    /// The batch of write `write` to `partition` ended at `end_offset` (exclusive).
    fn appended(&mut self, write: u64, partition: i32, end_offset: i64);
    /// Every batch of write `write` is below its high watermark: `reached` lists
    /// (partition, end offset).
    fn replicated(&mut self, write: u64, reached: &[(i32, i64)]) -> Outputs<Self>;
    /// Write `write` failed; the runtime answers its held replies with
    /// [`CoordinatorShard::failed_reply`].
    fn write_failed(&mut self, write: u64, failure: WriteFailure) -> Outputs<Self>;
    /// A held reply, answered with the error `failure` maps to for its call.
    fn failed_reply(&self, reply: Self::Reply, failure: WriteFailure) -> Self::Reply;

    /// Partitions with records above the high watermark the shard waits for.
    fn uncommitted_partitions(&self) -> Vec<i32>;
    /// The high watermark of `partition` is `offset`.
    fn commit_up_to(&mut self, partition: i32, offset: i64) -> Outputs<Self>;
}

enum Message<S: CoordinatorShard> {
    Call(S::Call, oneshot::Sender<S::Reply>),
    /// This broker became the leader of the partition: load it.
    Elect(i32, oneshot::Sender<()>),
    /// This broker no longer leads the partition: drop it.
    Resign(i32, oneshot::Sender<()>),
    /// This broker lost its controller lease: drop every partition.
    ResignAll(oneshot::Sender<()>),
    /// This broker holds its lease again: load every partition it leads that is not.
    ElectLed(oneshot::Sender<()>),
}

/// Where connections send a coordinator's calls, and the metadata publisher its
/// elections.
pub struct CoordinatorHandle<S: CoordinatorShard> {
    tx: mpsc::Sender<Message<S>>,
}

impl<S: CoordinatorShard> Clone for CoordinatorHandle<S> {
    fn clone(&self) -> Self {
        Self {
            tx: self.tx.clone(),
        }
    }
}

impl<S: CoordinatorShard> CoordinatorHandle<S> {
    /// A handle with no coordinator behind it (every call answers
    /// COORDINATOR_NOT_AVAILABLE).
    pub fn detached() -> Self {
        let (tx, _) = mpsc::channel(1);
        Self { tx }
    }

    /// Sends a call and waits for its answer. `Err` means the coordinator is gone
    /// (shutting down): clients get COORDINATOR_NOT_AVAILABLE and retry elsewhere.
    pub async fn call(&self, call: S::Call) -> Result<S::Reply, ErrorCode> {
        let rx = self.submit(call).await?;
        // A JoinGroup may wait here for the whole rebalance: the request that made the
        // call gives its slot back (see `request_slot`).
        crate::network::request_slot::park();
        rx.await.map_err(|_| ErrorCode::COORDINATOR_NOT_AVAILABLE)
    }

    /// Queues `call` and returns where its reply will come, so that a request of many
    /// calls (a leader's batched AddPartitionsToTxn) has them all under way at once and
    /// one the coordinator holds does not hold up the others.
    pub async fn submit(&self, call: S::Call) -> Result<oneshot::Receiver<S::Reply>, ErrorCode> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Message::Call(call, reply))
            .await
            .map_err(|_| ErrorCode::COORDINATOR_NOT_AVAILABLE)?;
        Ok(rx)
    }

    async fn control(&self, make: impl FnOnce(oneshot::Sender<()>) -> Message<S>) {
        let (done, rx) = oneshot::channel();
        if self.tx.send(make(done)).await.is_ok() {
            let _ = rx.await;
        }
    }

    /// Loads a partition (this broker now leads it); returns once loaded.
    pub async fn elect(&self, partition: i32) {
        self.control(|done| Message::Elect(partition, done)).await
    }

    /// Drops a partition (this broker no longer leads it).
    pub async fn resign(&self, partition: i32) {
        self.control(|done| Message::Resign(partition, done)).await
    }

    /// Drops every partition: the broker lost its controller lease, so another broker
    /// may coordinate them already.
    pub async fn resign_all(&self) {
        self.control(Message::ResignAll).await
    }

    /// Loads every partition this broker leads and does not serve (the lease is back;
    /// leaderships it kept were not announced again).
    pub async fn elect_led(&self) {
        self.control(Message::ElectLed).await
    }
}

/// The calls a [`test_handle`] passes on, each with its reply sender.
#[cfg(test)]
pub(crate) type TestCalls<S> = mpsc::Receiver<(
    <S as CoordinatorShard>::Call,
    oneshot::Sender<<S as CoordinatorShard>::Reply>,
)>;

/// A handle whose calls a test answers itself: every [`CoordinatorHandle::call`] comes
/// out of the receiver with its reply sender; elections are acknowledged and dropped.
#[cfg(test)]
pub(crate) fn test_handle<S: CoordinatorShard>() -> (CoordinatorHandle<S>, TestCalls<S>) {
    let (tx, mut rx) = mpsc::channel::<Message<S>>(CALL_QUEUE_DEPTH);
    let (calls, calls_rx) = mpsc::channel(CALL_QUEUE_DEPTH);
    tokio::spawn(async move {
        while let Some(message) = rx.recv().await {
            match message {
                Message::Call(call, reply) => {
                    if calls.send((call, reply)).await.is_err() {
                        return;
                    }
                }
                Message::Elect(_, done) | Message::Resign(_, done) => {
                    let _ = done.send(());
                }
                Message::ResignAll(done) | Message::ElectLed(done) => {
                    let _ = done.send(());
                }
            }
        }
    });
    (CoordinatorHandle { tx }, calls_rx)
}

pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Starts the task that runs `shard`; it serves no partition until
/// [`CoordinatorHandle::elect`].
pub fn start<S: CoordinatorShard>(shard: S, replicas: Arc<ReplicaManager>) -> CoordinatorHandle<S> {
    let (replicated, replicated_rx) = mpsc::channel(REPLICATED_QUEUE_DEPTH);
    let runtime = Runtime {
        shard,
        replicas,
        pending: HashMap::new(),
        next_responder: 1,
        replicated,
    };
    let (tx, rx) = mpsc::channel(CALL_QUEUE_DEPTH);
    tokio::spawn(runtime.run(rx, replicated_rx));
    CoordinatorHandle { tx }
}

struct Runtime<S: CoordinatorShard> {
    shard: S,
    replicas: Arc<ReplicaManager>,
    pending: HashMap<ResponderId, oneshot::Sender<S::Reply>>,
    next_responder: ResponderId,
    replicated: mpsc::Sender<WaitEnded<S::Reply>>,
}

/// A wait for the high watermark that ended.
struct WaitEnded<Y> {
    write: u64,
    partitions: Vec<i32>,
    /// `Ok`: each (partition, offset) was passed.
    outcome: Result<Vec<(i32, i64)>, ErrorCode>,
    replies: Vec<(oneshot::Sender<Y>, Y)>,
}

/// Where a batch of records ended in its partition.
struct Appended {
    tp: TopicPartition,
    leader_epoch: i32,
    end_offset: i64,
}

impl<S: CoordinatorShard> Runtime<S> {
    async fn run(
        mut self,
        mut rx: mpsc::Receiver<Message<S>>,
        mut replicated_rx: mpsc::Receiver<WaitEnded<S::Reply>>,
    ) {
        let mut hw_poll = tokio::time::interval(HW_POLL);
        hw_poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let polling = !self.shard.uncommitted_partitions().is_empty();
            let deadline = self.shard.next_deadline();
            let sleep = async {
                match deadline {
                    Some(at) => {
                        let wait = (at - now_ms()).max(0) as u64;
                        tokio::time::sleep(Duration::from_millis(wait)).await
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                message = rx.recv() => match message {
                    Some(message) => self.dispatch(message),
                    None => return,
                },
                Some(done) = replicated_rx.recv() => self.on_wait_ended(done),
                _ = hw_poll.tick(), if polling => self.report_high_watermarks(),
                _ = sleep => {
                    let outputs = self.shard.tick(now_ms());
                    self.act(outputs);
                }
            }
        }
    }

    fn tp(&self, partition: i32) -> TopicPartition {
        TopicPartition {
            topic: self.shard.topic().to_string(),
            partition,
        }
    }

    fn on_wait_ended(&mut self, done: WaitEnded<S::Reply>) {
        match done.outcome {
            Ok(reached) => {
                let outputs = self.shard.replicated(done.write, &reached);
                self.act(outputs);
                for (tx, reply) in done.replies {
                    let _ = tx.send(reply);
                }
            }
            Err(error) => {
                let failure = WriteFailure::Replication(error);
                let outputs = self.shard.write_failed(done.write, failure);
                self.act(outputs);
                for (tx, reply) in done.replies {
                    let _ = tx.send(self.shard.failed_reply(reply, failure));
                }
                if S::RELOAD_AFTER_FAILED_WAIT {
                    for p in done.partitions {
                        self.reload(p);
                    }
                }
            }
        }
    }

    /// Tells the shard the high watermark of every partition with records it waits for.
    fn report_high_watermarks(&mut self) {
        for partition in self.shard.uncommitted_partitions() {
            let tp = self.tp(partition);
            if let Ok(o) = self.replicas.offsets(&tp) {
                let outputs = self.shard.commit_up_to(partition, o.high_watermark);
                self.act(outputs);
            }
        }
    }

    fn dispatch(&mut self, message: Message<S>) {
        match message {
            Message::Call(call, reply) => {
                let id = self.next_responder;
                self.next_responder += 1;
                match self.shard.handle(call, id, now_ms()) {
                    // A dropped receiver (client gone) is not an error.
                    Handled::Reply(answer) => {
                        let _ = reply.send(answer);
                    }
                    Handled::Outputs(outputs) => {
                        self.pending.insert(id, reply);
                        self.act(outputs);
                    }
                }
            }
            Message::Elect(p, done) => {
                self.load(p);
                let _ = done.send(());
            }
            Message::Resign(p, done) => {
                let outputs = self.shard.unload(p);
                self.act(outputs);
                let _ = done.send(());
            }
            Message::ResignAll(done) => {
                for p in self.shard.loaded_partitions() {
                    let outputs = self.shard.unload(p);
                    self.act(outputs);
                }
                let _ = done.send(());
            }
            Message::ElectLed(done) => {
                let loaded = self.shard.loaded_partitions();
                for p in 0..self.shard.num_partitions() {
                    if !loaded.contains(&p) && self.replicas.leader_partition(&self.tp(p)).is_ok() {
                        self.load(p);
                    }
                }
                let _ = done.send(());
            }
        }
    }

    fn act(&mut self, outputs: Outputs<S>) {
        for output in outputs {
            match output {
                CoordinatorOutput::Respond { responder, reply } => {
                    if let Some(tx) = self.pending.remove(&responder) {
                        let _ = tx.send(reply);
                    }
                }
                CoordinatorOutput::DeleteRecordsBefore { partition, offset } => {
                    let tp = self.tp(partition);
                    match self.replicas.delete_records(&tp, offset) {
                        Ok(start) => {
                            tracing::debug!(%tp, log_start_offset = start, "coordinator records pruned")
                        }
                        // Not the leader any more, or the log moved on: the next prune
                        // (of the next leader) tries again.
                        Err(code) => {
                            tracing::debug!(%tp, error = code.name(), "coordinator prune skipped")
                        }
                    }
                }
                CoordinatorOutput::Append {
                    write,
                    records,
                    replies,
                    transactional,
                } => {
                    let (appended, failed) = self.append(&records, transactional);
                    for a in &appended {
                        self.shard.appended(write, a.tp.partition, a.end_offset);
                    }
                    if failed.is_empty() {
                        self.answer_when_replicated(write, appended, replies);
                        continue;
                    }
                    let outputs = self.shard.write_failed(write, WriteFailure::Append);
                    self.act(outputs);
                    for (responder, reply) in replies {
                        if let Some(tx) = self.pending.remove(&responder) {
                            let _ = tx.send(self.shard.failed_reply(reply, WriteFailure::Append));
                        }
                    }
                    for p in failed {
                        self.reload(p);
                    }
                }
            }
        }
    }

    /// Drops a partition's state and loads it again from the log.
    fn reload(&mut self, p: i32) {
        let outputs = self.shard.unload(p);
        self.act(outputs);
        self.load(p);
    }

    /// Sends `replies` once every appended batch is below its partition's high
    /// watermark (Kafka's DelayedProduce with acks=all, bounded by the shard's write
    /// timeout), through the task so that the shard hears of it first.
    fn answer_when_replicated(
        &mut self,
        write: u64,
        appended: Vec<Appended>,
        replies: Vec<(ResponderId, S::Reply)>,
    ) {
        let waiting: Vec<(oneshot::Sender<S::Reply>, S::Reply)> = replies
            .into_iter()
            .filter_map(|(id, reply)| self.pending.remove(&id).map(|tx| (tx, reply)))
            .collect();
        let replicas = self.replicas.clone();
        let replicated = self.replicated.clone();
        let deadline = tokio::time::Instant::now() + self.shard.write_timeout();
        tokio::spawn(async move {
            let mut error = ErrorCode::NONE;
            for a in &appended {
                // One in-sync replica is enough once the high watermark has passed the
                // batch: every ISR member has it. min.insync.replicas was Kafka's check
                // before the append; an internal topic below it still commits here.
                error = replicas
                    .wait_for_commit(&a.tp, a.leader_epoch, a.end_offset, 1, deadline)
                    .await;
                if error != ErrorCode::NONE {
                    tracing::debug!(tp = %a.tp, error = error.name(), "coordinator records not replicated");
                    break;
                }
            }
            let outcome = if error == ErrorCode::NONE {
                Ok(appended
                    .iter()
                    .map(|a| (a.tp.partition, a.end_offset))
                    .collect())
            } else {
                Err(error)
            };
            let done = WaitEnded {
                write,
                partitions: appended.iter().map(|a| a.tp.partition).collect(),
                outcome,
                replies: waiting,
            };
            // Fails only when the coordinator is gone; the dropped senders then answer
            // COORDINATOR_NOT_AVAILABLE.
            let _ = replicated.send(done).await;
        });
    }

    /// Appends records to their partitions, one batch per partition; says where each
    /// batch ended and which partitions failed.
    fn append(
        &self,
        records: &[(i32, S::Record)],
        transactional: Option<(i64, i16)>,
    ) -> (Vec<Appended>, Vec<i32>) {
        let mut by_partition: Vec<(i32, Vec<&S::Record>)> = Vec::new();
        for (p, r) in records {
            match by_partition.iter_mut().find(|(q, _)| q == p) {
                Some((_, list)) => list.push(r),
                None => by_partition.push((*p, vec![r])),
            }
        }
        let now = now_ms();
        let mut failed = Vec::new();
        let mut appended = Vec::new();
        for (p, records) in by_partition {
            let tp = self.tp(p);
            let written = self
                .build_batch(&records, now, transactional)
                .and_then(|batch| {
                    let (_, leader_epoch) = self
                        .replicas
                        .isr_size(&tp)
                        .map_err(|code| format!("append: {}", code.name()))?;
                    self.replicas
                        .append_with_origin(&tp, &batch, AppendOrigin::Coordinator)
                        .map(|(info, _)| (leader_epoch, info.last_offset + 1))
                        .map_err(|code| format!("append: {}", code.name()))
                });
            match written {
                Ok((leader_epoch, end_offset)) => appended.push(Appended {
                    tp,
                    leader_epoch,
                    end_offset,
                }),
                Err(e) => {
                    tracing::error!(%tp, error = %e, "writing coordinator records failed");
                    failed.push(p);
                }
            }
        }
        (appended, failed)
    }

    fn build_batch(
        &self,
        records: &[&S::Record],
        now: i64,
        transactional: Option<(i64, i16)>,
    ) -> Result<Bytes, String> {
        let mut builder = RecordBatchBuilder::new(CompressionType::None, 0);
        if let Some((producer_id, producer_epoch)) = transactional {
            // Kafka writes a transaction's offsets without a sequence (coordinator
            // appends are not deduplicated).
            builder = builder
                .producer(producer_id, producer_epoch, -1)
                .transactional(true);
        }
        for r in records {
            let (key, value) = self.shard.encode(r).map_err(|e| format!("encode: {e}"))?;
            builder
                .append(now, Some(&key), value.as_deref(), &[])
                .map_err(|e| format!("batch: {e}"))?;
        }
        builder.build().map_err(|e| format!("batch: {e}"))
    }

    /// Replays one partition into the shard.
    fn load(&mut self, p: i32) {
        if p >= self.shard.num_partitions() {
            return;
        }
        let outputs = self.shard.load_start(p);
        self.act(outputs);
        let tp = self.tp(p);
        // Records at or above the high watermark may not be on every in-sync replica
        // yet: they are replayed as uncommitted, served once the mark passes them.
        let leader = self
            .replicas
            .offsets(&tp)
            .and_then(|o| Ok((o, self.replicas.isr_size(&tp)?.1)));
        let (mut offset, high_watermark, leader_epoch) = match leader {
            Ok((o, epoch)) => (o.log_start_offset, o.high_watermark, epoch),
            Err(code) => {
                // Not the leader (any more, or without a lease): serving from an empty
                // state would answer as if nothing had been written.
                tracing::debug!(%tp, error = code.name(), "not loading coordinator partition");
                let outputs = self.shard.unload(p);
                self.act(outputs);
                return;
            }
        };
        let mut replayed = 0usize;
        loop {
            let Ok(chunk) = self.replicas.read_to_log_end(&tp, offset, LOAD_READ_BYTES) else {
                break;
            };
            if chunk.records.is_empty() {
                break;
            }
            let before = offset;
            for batch in RecordBatch::iter(chunk.records) {
                let Ok(batch) = batch else { break };
                offset = batch.next_offset();
                if batch.is_control() {
                    if let Some(commit) = control_commit(&batch) {
                        self.shard.replay_control(p, batch.producer_id(), commit);
                    }
                    continue;
                }
                let producer_id = batch.is_transactional().then(|| batch.producer_id());
                let Ok(records) = batch.records(LOAD_MAX_DECOMPRESSED_BYTES) else {
                    tracing::warn!(%tp, base_offset = batch.base_offset(), "undecodable batch skipped");
                    continue;
                };
                for r in records {
                    let Some(record) = self.shard.decode(r.key.as_deref(), r.value.as_deref())
                    else {
                        continue;
                    };
                    let committed = r.offset < high_watermark;
                    if let Err(e) = self
                        .shard
                        .replay(p, r.offset, record, committed, producer_id)
                    {
                        tracing::warn!(%tp, offset = r.offset, error = %e, "record not replayed");
                    }
                    replayed += 1;
                }
            }
            if offset <= before {
                break;
            }
        }
        let outputs = self.shard.load_done(p, leader_epoch, now_ms());
        self.act(outputs);
        if let Ok(o) = self.replicas.offsets(&tp) {
            let outputs = self.shard.commit_up_to(p, o.high_watermark);
            self.act(outputs);
        }
        if replayed > 0 {
            tracing::info!(%tp, records = replayed, "loaded coordinator partition");
        }
    }
}

/// Whether a control batch is a COMMIT (`Some(true)`) or ABORT (`Some(false)`) marker:
/// its record's key is Kafka's `EndTxnMarker` key, a version (0) and a type (0 abort,
/// 1 commit), big-endian `i16`s.
fn control_commit(batch: &RecordBatch) -> Option<bool> {
    let records = batch.records(LOAD_MAX_DECOMPRESSED_BYTES).ok()?;
    let key = records.into_iter().next()?.key?;
    match key.get(2..4)? {
        [0, 0] => Some(false),
        [0, 1] => Some(true),
        _ => None,
    }
}
