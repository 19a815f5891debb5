//! The transaction coordinator's shard: the pure `rill-transaction` state machine as the
//! coordinator runtime ([`super::runtime`]) hosts it on `__transaction_state`, with the
//! markers of ending transactions handed to the marker sender
//! ([`super::transaction_marker`]).
//!
//! # Design note
//!
//! 1. Requests (InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, EndTxn) go to the
//!    state machine, which holds their answer until its record is replicated: the
//!    runtime reports the high watermark through [`CoordinatorShard::replicated`], which
//!    is `write_completed`, and the answers come out then. Reads (DescribeTransactions,
//!    ListTransactions) are answered at once from the committed state.
//! 2. A load replays the partition's whole log, but the state machine hears of it only
//!    once the high watermark has reached the last record read: until then the
//!    partition's ids answer COORDINATOR_LOAD_IN_PROGRESS and the runtime polls the high
//!    watermark. So a new coordinator never acts on a record a failover could still
//!    truncate, and a transaction found preparing has its markers sent again.
//! 3. A failed wait for replication reloads the partition from the log: the state
//!    machine dropped the change, but the record may still commit, and the log decides.
//! 4. `Output::WriteMarkers` goes to the marker sender, which reports back with
//!    [`TxnCall::MarkersWritten`]; it asks [`TxnCall::StillPreparing`] before every retry,
//!    so that it gives up once another coordinator owns the id or the transaction ended.
//! 5. `tick` runs every `transaction.abort.timed.out.transaction.cleanup.interval.ms`:
//!    transactions past their timeout are aborted and idle ids expire; and at the
//!    deadline of an add the state machine holds while the id's previous transaction
//!    ends, which it then answers CONCURRENT_TRANSACTIONS.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use rill_protocol::ErrorCode;
use rill_transaction::{
    Output, Request, Response, TransactionConfig, TransactionCoordinator, TransactionListing,
    TransactionLogRecord, TransactionMetadata, TransactionPartition, TransactionState, WriteId,
    TRANSACTION_STATE_TOPIC,
};
use tokio::sync::mpsc;

use super::runtime::{
    self, CoordinatorHandle, CoordinatorOutput, CoordinatorShard, Handled, Outputs, ResponderId,
    WriteFailure,
};
use super::transaction_marker::{self, MarkerJob, PartitionLeaders};
use crate::replication::replica_manager::ReplicaManager;

/// How long a write of `__transaction_state` waits for the high watermark (Kafka's
/// `transaction.state.log` appends use the request timeout, 30 s by default; a shorter
/// bound answers the client sooner, which retries).
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// A call to the transaction coordinator.
pub enum TxnCall {
    Request(Request),
    /// DescribeTransactions.
    Describe(Vec<String>),
    /// ListTransactions: filters are empty for all; `min_duration_ms` < 0 for any.
    List {
        states: Vec<TransactionState>,
        producer_ids: Vec<i64>,
        min_duration_ms: i64,
    },
    /// The marker sender wrote every marker of this transaction.
    MarkersWritten {
        transactional_id: String,
        producer_id: i64,
        producer_epoch: i16,
    },
    /// Whether this coordinator still waits for these markers.
    StillPreparing {
        transactional_id: String,
        producer_id: i64,
        producer_epoch: i16,
    },
}

/// The coordinator's answer to a [`TxnCall`].
pub enum TxnReply {
    Response(Response),
    Describe(Vec<(String, Result<TransactionMetadata, ErrorCode>)>),
    List(Result<Vec<TransactionListing>, ErrorCode>),
    Done(bool),
}

/// Where connections send transaction calls, and the metadata publisher elections of
/// `__transaction_state` partitions.
pub type TransactionCoordinatorHandle = CoordinatorHandle<TransactionShard>;

/// A partition being loaded: its records wait for the high watermark.
struct Loading {
    records: Vec<TransactionLogRecord>,
    /// One past the last record read.
    end_offset: i64,
    /// Set once the whole log is read.
    coordinator_epoch: Option<i32>,
}

/// The `rill-transaction` state machine under the runtime.
pub struct TransactionShard {
    coordinator: TransactionCoordinator,
    loading: BTreeMap<i32, Loading>,
    /// Partitions loaded or loading.
    served: BTreeSet<i32>,
    next_tick_ms: i64,
    markers: mpsc::UnboundedSender<MarkerJob>,
}

/// Starts the coordinator task and its marker sender; it serves no partition until
/// [`CoordinatorHandle::elect`].
pub fn start(
    config: TransactionConfig,
    replicas: Arc<ReplicaManager>,
    leaders: Arc<dyn PartitionLeaders>,
    local_id: i32,
    connector: Arc<crate::network::inter_broker::InterBrokerConnector>,
) -> TransactionCoordinatorHandle {
    // Unbounded: it holds at most one job per transaction that is ending, and the state
    // machine holds at most one transaction per transactional id.
    let (markers, jobs) = mpsc::unbounded_channel();
    let shard = TransactionShard {
        coordinator: TransactionCoordinator::new(config),
        loading: BTreeMap::new(),
        served: BTreeSet::new(),
        next_tick_ms: runtime::now_ms(),
        markers,
    };
    let handle = runtime::start(shard, replicas);
    transaction_marker::start(jobs, handle.clone(), leaders, local_id, connector);
    handle
}

impl TransactionShard {
    fn outputs(&mut self, outputs: Vec<Output>) -> Outputs<Self> {
        let mut out = Vec::with_capacity(outputs.len());
        for o in outputs {
            match o {
                Output::Persist {
                    write,
                    partition,
                    records,
                } => out.push(CoordinatorOutput::Append {
                    write: write.0,
                    records: records.into_iter().map(|r| (partition, r)).collect(),
                    replies: Vec::new(),
                    transactional: None,
                }),
                Output::Respond {
                    responder,
                    response,
                } => out.push(CoordinatorOutput::Respond {
                    responder,
                    reply: TxnReply::Response(response),
                }),
                Output::WriteMarkers {
                    transactional_id,
                    producer_id,
                    producer_epoch,
                    commit,
                    coordinator_epoch,
                    partitions,
                } => {
                    let job = MarkerJob {
                        transactional_id,
                        producer_id,
                        producer_epoch,
                        commit,
                        coordinator_epoch,
                        partitions,
                    };
                    // Fails only when the marker sender is gone (shutting down); a new
                    // coordinator sends the markers again after its load.
                    let _ = self.markers.send(job);
                }
            }
        }
        out
    }

    fn is_preparing(&self, transactional_id: &str, producer_id: i64, producer_epoch: i16) -> bool {
        self.coordinator
            .describe(transactional_id)
            .is_ok_and(|m| m.state.is_preparing() && m.is_current(producer_id, producer_epoch))
    }

    /// Hands a loaded partition to the state machine once the high watermark has
    /// reached the end of what was read.
    fn finish_load(&mut self, partition: i32, high_watermark: i64) -> Outputs<Self> {
        let ready = self
            .loading
            .get(&partition)
            .is_some_and(|l| l.coordinator_epoch.is_some() && high_watermark >= l.end_offset);
        if !ready {
            return Vec::new();
        }
        let Some(loading) = self.loading.remove(&partition) else {
            return Vec::new();
        };
        let epoch = loading.coordinator_epoch.unwrap_or(0);
        let count = loading.records.len();
        let out = self.coordinator.load(partition, epoch, loading.records);
        tracing::info!(
            partition,
            coordinator_epoch = epoch,
            records = count,
            "transaction coordinator partition loaded"
        );
        self.outputs(out)
    }
}

/// Kafka's mapping of a failed `__transaction_state` write to what a transactional
/// client retries on: another coordinator, or this one later.
fn write_error(failure: WriteFailure) -> ErrorCode {
    match failure {
        WriteFailure::Append => ErrorCode::NOT_COORDINATOR,
        WriteFailure::Replication(
            ErrorCode::NOT_LEADER_OR_FOLLOWER | ErrorCode::KAFKA_STORAGE_ERROR,
        ) => ErrorCode::NOT_COORDINATOR,
        WriteFailure::Replication(_) => ErrorCode::COORDINATOR_NOT_AVAILABLE,
    }
}

impl CoordinatorShard for TransactionShard {
    type Record = TransactionLogRecord;
    type Call = TxnCall;
    type Reply = TxnReply;

    const RELOAD_AFTER_FAILED_WAIT: bool = true;

    fn topic(&self) -> &'static str {
        TRANSACTION_STATE_TOPIC
    }

    fn num_partitions(&self) -> i32 {
        self.coordinator
            .config()
            .transaction_state_log_num_partitions
    }

    fn write_timeout(&self) -> Duration {
        WRITE_TIMEOUT
    }

    fn encode(&self, record: &TransactionLogRecord) -> Result<(Vec<u8>, Option<Vec<u8>>), String> {
        let key = record.key_bytes().map_err(|e| e.to_string())?;
        let value = record.value_bytes().map_err(|e| e.to_string())?;
        Ok((key.to_vec(), value.map(|v| v.to_vec())))
    }

    fn decode(&self, key: Option<&[u8]>, value: Option<&[u8]>) -> Option<TransactionLogRecord> {
        match TransactionLogRecord::decode(key?, value) {
            Ok(r) => Some(r),
            Err(e) => {
                tracing::warn!(error = %e, "unreadable __transaction_state record skipped");
                None
            }
        }
    }

    fn handle(
        &mut self,
        call: TxnCall,
        responder: ResponderId,
        now_ms: i64,
    ) -> Handled<TransactionLogRecord, TxnReply> {
        match call {
            TxnCall::Request(request) => {
                let out = self.coordinator.handle(responder, request, now_ms);
                Handled::Outputs(self.outputs(out))
            }
            TxnCall::Describe(ids) => Handled::Reply(TxnReply::Describe(
                ids.into_iter()
                    .map(|id| {
                        let found = self.coordinator.describe(&id).cloned();
                        (id, found)
                    })
                    .collect(),
            )),
            TxnCall::List {
                states,
                producer_ids,
                min_duration_ms,
            } => {
                if !self.loading.is_empty() {
                    return Handled::Reply(TxnReply::List(Err(
                        ErrorCode::COORDINATOR_LOAD_IN_PROGRESS,
                    )));
                }
                let listed = self
                    .coordinator
                    .list(&states, &producer_ids)
                    .into_iter()
                    .filter(|l| {
                        min_duration_ms < 0
                            || self
                                .coordinator
                                .describe(&l.transactional_id)
                                .is_ok_and(|m| {
                                    m.txn_start_timestamp_ms >= 0
                                        && now_ms - m.txn_start_timestamp_ms >= min_duration_ms
                                })
                    })
                    .collect();
                Handled::Reply(TxnReply::List(Ok(listed)))
            }
            TxnCall::MarkersWritten {
                transactional_id,
                producer_id,
                producer_epoch,
            } => {
                let out = self.coordinator.markers_written(
                    &transactional_id,
                    producer_id,
                    producer_epoch,
                    now_ms,
                );
                let mut out = self.outputs(out);
                out.push(CoordinatorOutput::Respond {
                    responder,
                    reply: TxnReply::Done(true),
                });
                Handled::Outputs(out)
            }
            TxnCall::StillPreparing {
                transactional_id,
                producer_id,
                producer_epoch,
            } => Handled::Reply(TxnReply::Done(self.is_preparing(
                &transactional_id,
                producer_id,
                producer_epoch,
            ))),
        }
    }

    fn tick(&mut self, now_ms: i64) -> Outputs<Self> {
        // Held adds have deadlines of their own, far sooner than the cleanup's.
        let mut out = self.coordinator.expire_held(now_ms);
        if now_ms >= self.next_tick_ms {
            let interval = self
                .coordinator
                .config()
                .transaction_abort_timed_out_transaction_cleanup_interval_ms
                .max(1);
            self.next_tick_ms = now_ms + interval;
            out.extend(self.coordinator.tick(now_ms));
        }
        self.outputs(out)
    }

    fn next_deadline(&self) -> Option<i64> {
        let cleanup = (!self.served.is_empty()).then_some(self.next_tick_ms);
        match (cleanup, self.coordinator.next_deadline()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn load_start(&mut self, partition: i32) -> Outputs<Self> {
        let out = self.unload(partition);
        self.served.insert(partition);
        self.coordinator.begin_load(partition);
        self.loading.insert(
            partition,
            Loading {
                records: Vec::new(),
                end_offset: 0,
                coordinator_epoch: None,
            },
        );
        out
    }

    fn replay(
        &mut self,
        partition: i32,
        offset: i64,
        record: TransactionLogRecord,
        _committed: bool,
        _producer_id: Option<i64>,
    ) -> Result<(), String> {
        let loading = self
            .loading
            .get_mut(&partition)
            .ok_or_else(|| format!("partition {partition} is not loading"))?;
        loading.records.push(record);
        loading.end_offset = loading.end_offset.max(offset.saturating_add(1));
        Ok(())
    }

    fn load_done(&mut self, partition: i32, leader_epoch: i32, _now_ms: i64) -> Outputs<Self> {
        if let Some(l) = self.loading.get_mut(&partition) {
            l.coordinator_epoch = Some(leader_epoch);
        }
        // `commit_up_to` follows with the high watermark and finishes the load.
        Vec::new()
    }

    fn unload(&mut self, partition: i32) -> Outputs<Self> {
        self.loading.remove(&partition);
        self.served.remove(&partition);
        let out = self.coordinator.unload(partition);
        self.outputs(out)
    }

    fn loaded_partitions(&self) -> Vec<i32> {
        self.served.iter().copied().collect()
    }

    fn appended(&mut self, _write: u64, _partition: i32, _end_offset: i64) {}

    fn replicated(&mut self, write: u64, _reached: &[(i32, i64)]) -> Outputs<Self> {
        let out = self
            .coordinator
            .write_completed(WriteId(write), runtime::now_ms());
        self.outputs(out)
    }

    fn write_failed(&mut self, write: u64, failure: WriteFailure) -> Outputs<Self> {
        let out = self
            .coordinator
            .write_failed(WriteId(write), write_error(failure));
        self.outputs(out)
    }

    fn failed_reply(&self, reply: TxnReply, _failure: WriteFailure) -> TxnReply {
        // The state machine answers its own requests (`write_failed`); nothing is held.
        reply
    }

    fn uncommitted_partitions(&self) -> Vec<i32> {
        self.loading
            .iter()
            .filter(|(_, l)| l.coordinator_epoch.is_some())
            .map(|(p, _)| *p)
            .collect()
    }

    fn commit_up_to(&mut self, partition: i32, offset: i64) -> Outputs<Self> {
        self.finish_load(partition, offset)
    }
}

/// The partitions of a transaction grouped by topic, as the wire lists them.
pub fn by_topic(partitions: &[TransactionPartition]) -> Vec<(String, Vec<i32>)> {
    let mut topics: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
    for (topic, p) in partitions {
        topics.entry(topic).or_default().push(*p);
    }
    topics
        .into_iter()
        .map(|(t, ps)| (t.to_owned(), ps))
        .collect()
}
