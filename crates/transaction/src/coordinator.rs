//! [`TransactionCoordinator`]: the transactional ids of the `__transaction_state`
//! partitions this node leads, driven by requests, the clock ([`TransactionCoordinator::tick`])
//! and the partitions' records ([`TransactionCoordinator::load`]).
//!
//! # Protocol (Kafka's `TransactionCoordinator` and `TransactionStateManager`)
//! 1. A request that changes an id's state computes the new [`TransactionMetadata`] and
//!    returns it as a record to persist ([`Output::Persist`]); the change is *pending*
//!    until the broker reports the write replicated
//!    ([`TransactionCoordinator::write_completed`]). Only then does the id take the new
//!    state, and only then is the request answered. Meanwhile every other request for
//!    that id gets CONCURRENT_TRANSACTIONS, which clients retry. A write that fails
//!    ([`TransactionCoordinator::write_failed`]) drops the pending change.
//! 2. InitProducerId gives a new id producer id (one the broker allocated beforehand and
//!    passes in, so that this stays pure) at epoch 0, and otherwise bumps the epoch, which
//!    fences every older producer of the id. If a transaction is running, it is aborted
//!    with the bumped epoch first (PrepareAbort) and the caller is told to retry
//!    (CONCURRENT_TRANSACTIONS). An epoch about to overflow takes a new producer id.
//! 3. AddPartitionsToTxn / AddOffsetsToTxn move the id to Ongoing (starting the
//!    transaction's timeout at the first one) and add the partitions; `verify_only` (the
//!    partition leader's check of KIP-890 part 1) answers from the current state and
//!    writes nothing.
//! 4. EndTxn moves Ongoing to PrepareCommit or PrepareAbort. Once that is replicated the
//!    producer is answered and [`Output::WriteMarkers`] asks the broker to write the
//!    markers to every partition of the transaction; when all are written the broker
//!    calls [`TransactionCoordinator::markers_written`], and the id moves to
//!    CompleteCommit / CompleteAbort. A retried EndTxn is answered from those states.
//!    Under transaction version 2 (EndTxn v5+, KIP-890 part 2) the prepare also bumps
//!    the epoch (the markers carry the new one, which fences every late write of the
//!    ended transaction), the producer is told the epoch to go on with, an abort needs
//!    no partitions, and a retry is known by its epoch being one behind; the bump that
//!    spends the last epoch moves the producer to a new producer id at completion.
//! 5. [`TransactionCoordinator::tick`] aborts the transactions that ran past their
//!    timeout (bumping the epoch, so that the producer that let it expire is fenced) and
//!    removes the ids idle for `transactional.id.expiration.ms` (a tombstone).
//! 6. [`TransactionCoordinator::load`] replays a partition's records when this node
//!    becomes its leader; a transaction found preparing has its markers sent again, so a
//!    coordinator that fails over in the middle of a commit finishes it.
//! 7. An AddPartitionsToTxn or AddOffsetsToTxn that finds its id's previous transaction
//!    still ending (its markers being written, or a record of the id being replicated)
//!    is held, for at most `concurrent_wait_ms`, and decided again as soon as the id
//!    settles; only one still waiting at the deadline ([`TransactionCoordinator::next_deadline`],
//!    [`TransactionCoordinator::expire_held`]) gets CONCURRENT_TRANSACTIONS. Kafka answers
//!    at once, and the partition leader (transaction version 2) or the producer
//!    (version 1) retries after 20 ms; the markers of a commit take about a millisecond
//!    on one node, so a transaction that starts right after a commit would otherwise
//!    lose 20 ms on every partition it writes first.
//!
//! # Why reads see only replicated state
//! The map of ids holds only states whose records were replicated; pending changes sit
//! apart until [`TransactionCoordinator::write_completed`]. So DescribeTransactions,
//! ListTransactions and every decision read committed state, and a coordinator that loses
//! its partition before a write replicates has told nobody about it (DESIGN.md, invariant
//! 9).

use std::collections::{BTreeMap, BTreeSet};

use rill_protocol::{partition_for, ErrorCode};

use crate::record::{TransactionLogRecord, TransactionPartition};
use crate::state::{TransactionMetadata, TransactionState};

/// The internal topic of committed offsets, which AddOffsetsToTxn adds a partition of.
pub const CONSUMER_OFFSETS_TOPIC: &str = "__consumer_offsets";

/// The coordinator's settings, under Kafka's broker config names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransactionConfig {
    /// `transaction.state.log.num.partitions`.
    pub transaction_state_log_num_partitions: i32,
    /// `transaction.max.timeout.ms`: the longest `transaction.timeout.ms` a producer may
    /// ask for.
    pub transaction_max_timeout_ms: i32,
    /// `transactional.id.expiration.ms`: an id idle this long is removed.
    pub transactional_id_expiration_ms: i64,
    /// `transaction.abort.timed.out.transaction.cleanup.interval.ms`: how often the
    /// broker should call [`TransactionCoordinator::tick`].
    pub transaction_abort_timed_out_transaction_cleanup_interval_ms: i64,
    /// How long an add that finds the id's previous transaction ending is held for it
    /// (protocol step 7); 0 answers CONCURRENT_TRANSACTIONS at once, as Kafka does.
    pub concurrent_wait_ms: i64,
}

/// The default of [`TransactionConfig::concurrent_wait_ms`]: the retry backoff of the
/// callers it saves a retry (Kafka's `add.partitions.to.txn.retry.backoff.ms`), so that a
/// held add is never answered later than its retry would have been sent.
pub const DEFAULT_CONCURRENT_WAIT_MS: i64 = 20;

impl Default for TransactionConfig {
    fn default() -> Self {
        TransactionConfig {
            transaction_state_log_num_partitions: 50,
            transaction_max_timeout_ms: 900_000,
            transactional_id_expiration_ms: 604_800_000,
            transaction_abort_timed_out_transaction_cleanup_interval_ms: 10_000,
            concurrent_wait_ms: DEFAULT_CONCURRENT_WAIT_MS,
        }
    }
}

/// The broker's handle of a request waiting for its answer.
pub type ResponderId = u64;

/// Names one write of records, for [`TransactionCoordinator::write_completed`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WriteId(pub u64);

/// A request to the coordinator (the fields of the wire requests it reads).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    InitProducerId {
        transactional_id: String,
        transaction_timeout_ms: i32,
        /// The producer's current id and epoch when it asks for a bump (KIP-360), or -1.
        producer_id: i64,
        producer_epoch: i16,
        /// A producer id the broker allocated, used if the id needs a new one.
        new_producer_id: i64,
    },
    AddPartitionsToTxn {
        transactional_id: String,
        producer_id: i64,
        producer_epoch: i16,
        partitions: Vec<TransactionPartition>,
        verify_only: bool,
        /// 2 when a partition leader adds the partition for a transaction version 2
        /// producer (AddPartitionsToTxn v4+ without `verifyOnly`), else 0.
        client_transaction_version: i16,
    },
    AddOffsetsToTxn {
        transactional_id: String,
        producer_id: i64,
        producer_epoch: i16,
        /// The `__consumer_offsets` partition of the group (`partition_for(group, n)`).
        offsets_partition: i32,
    },
    EndTxn {
        transactional_id: String,
        producer_id: i64,
        producer_epoch: i16,
        commit: bool,
        /// 2 for EndTxn v5+ (KIP-890 part 2: the epoch is bumped at every commit and
        /// abort, and an abort needs no partitions), else 0.
        client_transaction_version: i16,
        /// A producer id the broker allocated, used if the bump spends the last epoch;
        /// -1 when the producer's epoch is not near the end.
        new_producer_id: i64,
    },
}

impl Request {
    pub fn transactional_id(&self) -> &str {
        match self {
            Request::InitProducerId {
                transactional_id, ..
            }
            | Request::AddPartitionsToTxn {
                transactional_id, ..
            }
            | Request::AddOffsetsToTxn {
                transactional_id, ..
            }
            | Request::EndTxn {
                transactional_id, ..
            } => transactional_id,
        }
    }
}

/// The coordinator's answer to a [`Request`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Response {
    InitProducerId {
        error: ErrorCode,
        producer_id: i64,
        producer_epoch: i16,
    },
    AddPartitionsToTxn {
        results: Vec<(TransactionPartition, ErrorCode)>,
    },
    AddOffsetsToTxn {
        error: ErrorCode,
    },
    EndTxn {
        error: ErrorCode,
        /// What the producer continues with (transaction version 2), else -1.
        producer_id: i64,
        producer_epoch: i16,
    },
}

impl Response {
    /// The answer to `request` when it fails as a whole with `error`.
    pub fn error(request: &Request, error: ErrorCode) -> Response {
        match request {
            Request::InitProducerId { .. } => Response::InitProducerId {
                error,
                producer_id: -1,
                producer_epoch: -1,
            },
            Request::AddPartitionsToTxn { partitions, .. } => Response::AddPartitionsToTxn {
                results: partitions.iter().map(|p| (p.clone(), error)).collect(),
            },
            Request::AddOffsetsToTxn { .. } => Response::AddOffsetsToTxn { error },
            Request::EndTxn { .. } => Response::EndTxn {
                error,
                producer_id: -1,
                producer_epoch: -1,
            },
        }
    }
}

/// What the broker must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// Append `records` to `__transaction_state` partition `partition` with acks=all and
    /// report the outcome with `write_completed` or `write_failed`.
    Persist {
        write: WriteId,
        partition: i32,
        records: Vec<TransactionLogRecord>,
    },
    /// Send `response` to the request `responder`.
    Respond {
        responder: ResponderId,
        response: Response,
    },
    /// Write a COMMIT or ABORT marker for this producer to every partition, fenced by
    /// `coordinator_epoch` (the leader epoch of the coordinator's partition), then call
    /// `markers_written`.
    WriteMarkers {
        transactional_id: String,
        producer_id: i64,
        producer_epoch: i16,
        commit: bool,
        coordinator_epoch: i32,
        partitions: Vec<TransactionPartition>,
    },
}

/// One id in ListTransactions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransactionListing {
    pub transactional_id: String,
    pub producer_id: i64,
    pub state: TransactionState,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PartitionState {
    Loading,
    Active { coordinator_epoch: i32 },
}

/// A change waiting for its record to be replicated.
#[derive(Debug, Clone)]
struct Pending {
    write: WriteId,
    /// The id's next state; `None` removes it (expiration).
    next: Option<TransactionMetadata>,
    /// The request to answer once the write is replicated, with the answer.
    reply: Option<(ResponderId, Request, Response)>,
}

/// An add held while its id's previous transaction ends (protocol step 7).
#[derive(Debug, Clone)]
struct Held {
    responder: ResponderId,
    request: Request,
    /// When it is answered CONCURRENT_TRANSACTIONS if the id has not settled.
    deadline_ms: i64,
}

/// The transaction coordinator's state machine.
#[derive(Debug)]
pub struct TransactionCoordinator {
    config: TransactionConfig,
    partitions: BTreeMap<i32, PartitionState>,
    /// Committed state of every id of the active partitions.
    transactions: BTreeMap<String, TransactionMetadata>,
    pending: BTreeMap<String, Pending>,
    /// Adds held per id, in arrival order.
    held: BTreeMap<String, Vec<Held>>,
    /// The ids each write in flight holds pending.
    writes: BTreeMap<WriteId, Vec<String>>,
    next_write: u64,
}

impl TransactionCoordinator {
    pub fn new(config: TransactionConfig) -> Self {
        TransactionCoordinator {
            config,
            partitions: BTreeMap::new(),
            transactions: BTreeMap::new(),
            pending: BTreeMap::new(),
            held: BTreeMap::new(),
            writes: BTreeMap::new(),
            next_write: 0,
        }
    }

    pub fn config(&self) -> &TransactionConfig {
        &self.config
    }

    /// The `__transaction_state` partition of `transactional_id`.
    pub fn partition_for(&self, transactional_id: &str) -> i32 {
        partition_for(
            transactional_id,
            self.config.transaction_state_log_num_partitions,
        )
    }

    /// This node became the leader of `partition`: requests for its ids are answered
    /// COORDINATOR_LOAD_IN_PROGRESS until [`TransactionCoordinator::load`].
    pub fn begin_load(&mut self, partition: i32) {
        self.partitions.insert(partition, PartitionState::Loading);
    }

    /// Replays `records` (the partition's log, in order) and starts serving its ids at
    /// `coordinator_epoch`. Returns the markers of the transactions that were ending when
    /// the last coordinator stopped.
    pub fn load(
        &mut self,
        partition: i32,
        coordinator_epoch: i32,
        records: impl IntoIterator<Item = TransactionLogRecord>,
    ) -> Vec<Output> {
        self.drop_partition(partition, ErrorCode::NOT_COORDINATOR);
        let mut loaded: BTreeMap<String, TransactionMetadata> = BTreeMap::new();
        for r in records {
            if self.partition_for(&r.transactional_id) != partition {
                continue;
            }
            match r.value {
                Some(mut m) => {
                    // A fence is aborted under the bumped epoch (Kafka writes it so).
                    if m.state == TransactionState::PrepareEpochFence {
                        m.state = TransactionState::PrepareAbort;
                    }
                    loaded.insert(r.transactional_id, m);
                }
                None => {
                    loaded.remove(&r.transactional_id);
                }
            }
        }
        self.partitions
            .insert(partition, PartitionState::Active { coordinator_epoch });
        let mut out = Vec::new();
        for (id, m) in loaded {
            if m.state.is_preparing() {
                out.push(self.markers_for(&m, coordinator_epoch));
            }
            self.transactions.insert(id, m);
        }
        out
    }

    /// This node is no longer the leader of `partition`: its ids are forgotten, and the
    /// requests waiting on its writes are answered NOT_COORDINATOR.
    pub fn unload(&mut self, partition: i32) -> Vec<Output> {
        let out = self.drop_partition(partition, ErrorCode::NOT_COORDINATOR);
        self.partitions.remove(&partition);
        out
    }

    fn drop_partition(&mut self, partition: i32, error: ErrorCode) -> Vec<Output> {
        let n = self.config.transaction_state_log_num_partitions;
        self.transactions
            .retain(|id, _| partition_for(id, n) != partition);
        let dropped: Vec<String> = self
            .pending
            .keys()
            .filter(|id| partition_for(id, n) == partition)
            .cloned()
            .collect();
        let mut out = self.release_held(|id| partition_for(id, n) == partition, error);
        for id in dropped {
            if let Some(p) = self.pending.remove(&id) {
                self.forget_write(p.write, &id);
                if let Some((responder, request, _)) = p.reply {
                    out.push(Output::Respond {
                        responder,
                        response: Response::error(&request, error),
                    });
                }
            }
        }
        out
    }

    fn forget_write(&mut self, write: WriteId, id: &str) {
        if let Some(ids) = self.writes.get_mut(&write) {
            ids.retain(|i| i != id);
            if ids.is_empty() {
                self.writes.remove(&write);
            }
        }
    }

    /// Whether this node serves `transactional_id` now, else the error to answer.
    fn serving(&self, transactional_id: &str) -> Result<i32, ErrorCode> {
        match self.partitions.get(&self.partition_for(transactional_id)) {
            Some(PartitionState::Active { coordinator_epoch }) => Ok(*coordinator_epoch),
            Some(PartitionState::Loading) => Err(ErrorCode::COORDINATOR_LOAD_IN_PROGRESS),
            None => Err(ErrorCode::NOT_COORDINATOR),
        }
    }

    /// The committed state of `transactional_id` (DescribeTransactions).
    pub fn describe(&self, transactional_id: &str) -> Result<&TransactionMetadata, ErrorCode> {
        self.serving(transactional_id)?;
        self.transactions
            .get(transactional_id)
            .ok_or(ErrorCode::TRANSACTIONAL_ID_NOT_FOUND)
    }

    /// The ids of the active partitions in one of `states` (all when empty) whose
    /// producer is one of `producer_ids` (all when empty): ListTransactions.
    pub fn list(
        &self,
        states: &[TransactionState],
        producer_ids: &[i64],
    ) -> Vec<TransactionListing> {
        self.transactions
            .values()
            .filter(|m| states.is_empty() || states.contains(&m.state))
            .filter(|m| producer_ids.is_empty() || producer_ids.contains(&m.producer_id))
            .map(|m| TransactionListing {
                transactional_id: m.transactional_id.clone(),
                producer_id: m.producer_id,
                state: m.state,
            })
            .collect()
    }

    /// Handles one request at `now_ms`.
    pub fn handle(&mut self, responder: ResponderId, request: Request, now_ms: i64) -> Vec<Output> {
        let deadline_ms = now_ms.saturating_add(self.config.concurrent_wait_ms);
        self.decide_or_hold(responder, request, now_ms, deadline_ms)
    }

    fn decide_or_hold(
        &mut self,
        responder: ResponderId,
        request: Request,
        now_ms: i64,
        deadline_ms: i64,
    ) -> Vec<Output> {
        let id = request.transactional_id().to_owned();
        let decision = self.decide(&request, now_ms);
        match decision {
            Decision::Answer(response) if now_ms < deadline_ms && waits_for_end(&response) => {
                self.held.entry(id).or_default().push(Held {
                    responder,
                    request,
                    deadline_ms,
                });
                Vec::new()
            }
            Decision::Answer(response) => vec![Output::Respond {
                responder,
                response,
            }],
            Decision::Write(next, response) => {
                let partition = self.partition_for(&id);
                let write = self.new_write();
                self.writes.insert(write, vec![id.clone()]);
                let record = TransactionLogRecord {
                    transactional_id: id.clone(),
                    value: Some((*next).clone()),
                };
                self.pending.insert(
                    id,
                    Pending {
                        write,
                        next: Some(*next),
                        reply: Some((responder, request, response)),
                    },
                );
                vec![Output::Persist {
                    write,
                    partition,
                    records: vec![record],
                }]
            }
        }
    }

    fn new_write(&mut self) -> WriteId {
        self.next_write += 1;
        WriteId(self.next_write)
    }

    fn decide(&self, request: &Request, now_ms: i64) -> Decision {
        let fail = |e: ErrorCode| Decision::Answer(Response::error(request, e));
        if let Request::InitProducerId {
            transaction_timeout_ms,
            ..
        } = request
        {
            if *transaction_timeout_ms <= 0
                || *transaction_timeout_ms > self.config.transaction_max_timeout_ms
            {
                return fail(ErrorCode::INVALID_TRANSACTION_TIMEOUT);
            }
        }
        let id = request.transactional_id();
        if id.is_empty() {
            return fail(ErrorCode::INVALID_REQUEST);
        }
        if let Err(e) = self.serving(id) {
            return fail(e);
        }
        if self.pending.contains_key(id) {
            return fail(ErrorCode::CONCURRENT_TRANSACTIONS);
        }
        let current = self.transactions.get(id);
        match request {
            Request::InitProducerId {
                transaction_timeout_ms,
                producer_id,
                producer_epoch,
                new_producer_id,
                ..
            } => init_producer_id(
                id,
                current,
                *transaction_timeout_ms,
                (*producer_id, *producer_epoch),
                *new_producer_id,
                now_ms,
            ),
            Request::AddPartitionsToTxn {
                producer_id,
                producer_epoch,
                partitions,
                verify_only,
                client_transaction_version,
                ..
            } => add_partitions(
                current,
                (*producer_id, *producer_epoch),
                partitions,
                (*verify_only, *client_transaction_version),
                now_ms,
            )
            .map_response(|results| Response::AddPartitionsToTxn { results }),
            Request::AddOffsetsToTxn {
                producer_id,
                producer_epoch,
                offsets_partition,
                ..
            } => {
                let partition = (CONSUMER_OFFSETS_TOPIC.to_owned(), *offsets_partition);
                add_partitions(
                    current,
                    (*producer_id, *producer_epoch),
                    std::slice::from_ref(&partition),
                    (false, 0),
                    now_ms,
                )
                .map_response(|results| Response::AddOffsetsToTxn {
                    error: results.first().map_or(ErrorCode::NONE, |(_, e)| *e),
                })
            }
            Request::EndTxn {
                producer_id,
                producer_epoch,
                commit,
                client_transaction_version,
                new_producer_id,
                ..
            } if *client_transaction_version >= 2 => end_txn_v2(
                current,
                (*producer_id, *producer_epoch),
                *commit,
                *new_producer_id,
                now_ms,
            ),
            Request::EndTxn {
                producer_id,
                producer_epoch,
                commit,
                ..
            } => end_txn(current, (*producer_id, *producer_epoch), *commit, now_ms),
        }
    }

    /// The write `write` is replicated at `now_ms`: its changes take effect, their
    /// requests are answered, the transactions that now end get their markers, and the
    /// adds held for ids that settled are decided again.
    pub fn write_completed(&mut self, write: WriteId, now_ms: i64) -> Vec<Output> {
        let mut out = Vec::new();
        let ids = self.writes.remove(&write).unwrap_or_default();
        for id in &ids {
            let id = id.clone();
            let Some(p) = self.pending.remove(&id) else {
                continue;
            };
            let coordinator_epoch = match self.serving(&id) {
                Ok(e) => e,
                // Unloaded meanwhile: unload answered the request already.
                Err(_) => continue,
            };
            match p.next {
                Some(next) => {
                    if next.state.is_preparing() {
                        out.push(self.markers_for(&next, coordinator_epoch));
                    }
                    self.transactions.insert(id, next);
                }
                None => {
                    self.transactions.remove(&id);
                }
            }
            if let Some((responder, _, response)) = p.reply {
                out.push(Output::Respond {
                    responder,
                    response,
                });
            }
        }
        for id in &ids {
            out.extend(self.decide_held(id, now_ms));
        }
        out
    }

    /// Decides again the adds held for `id`, in arrival order; those that still find the
    /// transaction ending are held again until their own deadline.
    fn decide_held(&mut self, id: &str, now_ms: i64) -> Vec<Output> {
        let mut out = Vec::new();
        for h in self.held.remove(id).unwrap_or_default() {
            out.extend(self.decide_or_hold(h.responder, h.request, now_ms, h.deadline_ms));
        }
        out
    }

    /// Answers `error` to every add held for an id that `which` picks.
    fn release_held(&mut self, which: impl Fn(&str) -> bool, error: ErrorCode) -> Vec<Output> {
        let ids: Vec<String> = self.held.keys().filter(|id| which(id)).cloned().collect();
        ids.into_iter()
            .flat_map(|id| self.held.remove(&id).unwrap_or_default())
            .map(|h| Output::Respond {
                responder: h.responder,
                response: Response::error(&h.request, error),
            })
            .collect()
    }

    /// When the first held add reaches its deadline, for the broker to call
    /// [`TransactionCoordinator::expire_held`] then.
    pub fn next_deadline(&self) -> Option<i64> {
        self.held.values().flatten().map(|h| h.deadline_ms).min()
    }

    /// Answers CONCURRENT_TRANSACTIONS to the held adds whose deadline has come, as Kafka
    /// would have answered them when they arrived; the caller retries.
    pub fn expire_held(&mut self, now_ms: i64) -> Vec<Output> {
        let mut out = Vec::new();
        self.held.retain(|_, held| {
            held.retain(|h| {
                if h.deadline_ms > now_ms {
                    return true;
                }
                out.push(Output::Respond {
                    responder: h.responder,
                    response: Response::error(&h.request, ErrorCode::CONCURRENT_TRANSACTIONS),
                });
                false
            });
            !held.is_empty()
        });
        out
    }

    /// The write `write` failed (not replicated in time, or this node lost the
    /// partition): its changes are dropped and their requests answered `error`; the adds
    /// held for its ids get CONCURRENT_TRANSACTIONS, and their callers retry against
    /// what the log decides.
    pub fn write_failed(&mut self, write: WriteId, error: ErrorCode) -> Vec<Output> {
        let mut out = Vec::new();
        let ids = self.writes.remove(&write).unwrap_or_default();
        for id in &ids {
            if let Some(Pending {
                reply: Some((responder, request, _)),
                ..
            }) = self.pending.remove(id)
            {
                out.push(Output::Respond {
                    responder,
                    response: Response::error(&request, error),
                });
            }
        }
        out.extend(self.release_held(
            |id| ids.iter().any(|i| i == id),
            ErrorCode::CONCURRENT_TRANSACTIONS,
        ));
        out
    }

    /// Every marker of the transaction of `producer_id` at `producer_epoch` is written:
    /// the id moves to CompleteCommit or CompleteAbort. A stale report (another epoch, or
    /// the id no longer preparing) changes nothing.
    pub fn markers_written(
        &mut self,
        transactional_id: &str,
        producer_id: i64,
        producer_epoch: i16,
        now_ms: i64,
    ) -> Vec<Output> {
        if self.serving(transactional_id).is_err() || self.pending.contains_key(transactional_id) {
            return Vec::new();
        }
        let Some(m) = self.transactions.get(transactional_id) else {
            return Vec::new();
        };
        let complete = match m.state {
            TransactionState::PrepareCommit => TransactionState::CompleteCommit,
            TransactionState::PrepareAbort => TransactionState::CompleteAbort,
            _ => return Vec::new(),
        };
        if !m.is_current(producer_id, producer_epoch) {
            return Vec::new();
        }
        let mut next = m.clone();
        next.state = complete;
        next.partitions.clear();
        next.txn_last_update_timestamp_ms = now_ms;
        if m.next_producer_id >= 0 {
            // The bump spent the last epoch: the producer goes on with the next id.
            (next.producer_id, next.producer_epoch) = m.completed_producer();
            next.previous_producer_id = m.producer_id;
            next.next_producer_id = -1;
        }
        self.persist_without_reply(vec![(transactional_id.to_owned(), Some(next))])
    }

    /// Aborts the transactions past their timeout and removes the ids idle for
    /// `transactional.id.expiration.ms`.
    pub fn tick(&mut self, now_ms: i64) -> Vec<Output> {
        let mut changes: Vec<(String, Option<TransactionMetadata>)> = Vec::new();
        for (id, m) in &self.transactions {
            if self.pending.contains_key(id) || self.serving(id).is_err() {
                continue;
            }
            if m.state == TransactionState::Ongoing
                && now_ms > m.txn_start_timestamp_ms + i64::from(m.txn_timeout_ms)
            {
                // Fence the producer that let it expire.
                changes.push((id.clone(), Some(m.fenced_abort(now_ms))));
            } else if m.state.is_idle()
                && now_ms
                    > m.txn_last_update_timestamp_ms + self.config.transactional_id_expiration_ms
            {
                changes.push((id.clone(), None));
            }
        }
        self.persist_without_reply(changes)
    }

    /// One write per partition for changes that answer no request (markers written,
    /// timeouts, expiration).
    fn persist_without_reply(
        &mut self,
        changes: Vec<(String, Option<TransactionMetadata>)>,
    ) -> Vec<Output> {
        let mut by_partition: BTreeMap<i32, Vec<(String, Option<TransactionMetadata>)>> =
            BTreeMap::new();
        for (id, next) in changes {
            by_partition
                .entry(self.partition_for(&id))
                .or_default()
                .push((id, next));
        }
        let mut out = Vec::new();
        for (partition, changes) in by_partition {
            let write = self.new_write();
            let mut records = Vec::new();
            let mut ids = Vec::new();
            for (id, next) in changes {
                records.push(TransactionLogRecord {
                    transactional_id: id.clone(),
                    value: next.clone(),
                });
                ids.push(id.clone());
                self.pending.insert(
                    id,
                    Pending {
                        write,
                        next,
                        reply: None,
                    },
                );
            }
            self.writes.insert(write, ids);
            out.push(Output::Persist {
                write,
                partition,
                records,
            });
        }
        out
    }

    fn markers_for(&self, m: &TransactionMetadata, coordinator_epoch: i32) -> Output {
        Output::WriteMarkers {
            transactional_id: m.transactional_id.clone(),
            producer_id: m.producer_id,
            producer_epoch: m.producer_epoch,
            commit: m.state == TransactionState::PrepareCommit,
            coordinator_epoch,
            partitions: m.partitions.iter().cloned().collect(),
        }
    }
}

/// Whether `response` is an add's CONCURRENT_TRANSACTIONS, which only an id whose
/// transaction is ending gets (a record being replicated, or markers being written), so
/// that it can be held for the end (protocol step 7).
fn waits_for_end(response: &Response) -> bool {
    match response {
        Response::AddPartitionsToTxn { results } => {
            !results.is_empty()
                && results
                    .iter()
                    .all(|(_, e)| *e == ErrorCode::CONCURRENT_TRANSACTIONS)
        }
        Response::AddOffsetsToTxn { error } => *error == ErrorCode::CONCURRENT_TRANSACTIONS,
        Response::InitProducerId { .. } | Response::EndTxn { .. } => false,
    }
}

/// What a request leads to: an answer now, or a state to persist and the answer to give
/// once it is replicated.
enum Decision {
    Answer(Response),
    Write(Box<TransactionMetadata>, Response),
}

/// A decision on partitions, before it is shaped as AddPartitions or AddOffsets.
enum PartitionsDecision {
    Answer(Vec<(TransactionPartition, ErrorCode)>),
    Write(
        Box<TransactionMetadata>,
        Vec<(TransactionPartition, ErrorCode)>,
    ),
}

impl PartitionsDecision {
    fn map_response(
        self,
        shape: impl Fn(Vec<(TransactionPartition, ErrorCode)>) -> Response,
    ) -> Decision {
        match self {
            PartitionsDecision::Answer(r) => Decision::Answer(shape(r)),
            PartitionsDecision::Write(m, r) => Decision::Write(m, shape(r)),
        }
    }
}

fn init_producer_id(
    id: &str,
    current: Option<&TransactionMetadata>,
    timeout_ms: i32,
    (expected_id, expected_epoch): (i64, i16),
    new_producer_id: i64,
    now_ms: i64,
) -> Decision {
    let answer =
        |error: ErrorCode, producer_id: i64, producer_epoch: i16| Response::InitProducerId {
            error,
            producer_id,
            producer_epoch,
        };
    let fail = |e: ErrorCode| Decision::Answer(answer(e, -1, -1));
    let Some(m) = current else {
        if new_producer_id < 0 {
            return fail(ErrorCode::COORDINATOR_NOT_AVAILABLE);
        }
        let fresh = TransactionMetadata {
            transactional_id: id.to_owned(),
            producer_id: new_producer_id,
            previous_producer_id: -1,
            producer_epoch: 0,
            last_producer_epoch: -1,
            txn_timeout_ms: timeout_ms,
            state: TransactionState::Empty,
            partitions: BTreeSet::new(),
            txn_start_timestamp_ms: -1,
            txn_last_update_timestamp_ms: now_ms,
            next_producer_id: -1,
            client_transaction_version: 0,
        };
        return Decision::Write(Box::new(fresh), answer(ErrorCode::NONE, new_producer_id, 0));
    };
    // KIP-360: a producer that names itself must be this id's current one (or the one
    // just bumped, retrying an answer it lost).
    if expected_id >= 0 {
        let current_epoch = m.producer_id == expected_id && m.producer_epoch == expected_epoch;
        let bumped_from = m.producer_id == expected_id && m.last_producer_epoch == expected_epoch;
        if bumped_from && m.state.is_idle() {
            return Decision::Answer(answer(ErrorCode::NONE, m.producer_id, m.producer_epoch));
        }
        if !current_epoch {
            return fail(ErrorCode::PRODUCER_FENCED);
        }
    }
    match m.state {
        TransactionState::PrepareCommit
        | TransactionState::PrepareAbort
        | TransactionState::PrepareEpochFence
        | TransactionState::Dead => fail(ErrorCode::CONCURRENT_TRANSACTIONS),
        TransactionState::Ongoing => {
            // Fence the running transaction's producer and abort it under the new
            // epoch; the caller retries once the abort is complete.
            Decision::Write(
                Box::new(m.fenced_abort(now_ms)),
                answer(ErrorCode::CONCURRENT_TRANSACTIONS, -1, -1),
            )
        }
        TransactionState::Empty
        | TransactionState::CompleteCommit
        | TransactionState::CompleteAbort => {
            let mut next = m.clone();
            if m.producer_epoch >= i16::MAX - 1 {
                if new_producer_id < 0 {
                    return fail(ErrorCode::COORDINATOR_NOT_AVAILABLE);
                }
                next.previous_producer_id = m.producer_id;
                next.producer_id = new_producer_id;
                next.producer_epoch = 0;
                next.last_producer_epoch = -1;
            } else {
                next.last_producer_epoch = m.producer_epoch;
                next.producer_epoch = m.producer_epoch + 1;
            }
            next.state = TransactionState::Empty;
            next.partitions.clear();
            next.txn_timeout_ms = timeout_ms;
            next.txn_start_timestamp_ms = -1;
            next.txn_last_update_timestamp_ms = now_ms;
            let response = answer(ErrorCode::NONE, next.producer_id, next.producer_epoch);
            Decision::Write(Box::new(next), response)
        }
    }
}

/// The checks every request of a running producer passes: its id is this id's producer
/// and its epoch the current one.
fn check_producer(
    current: Option<&TransactionMetadata>,
    (producer_id, producer_epoch): (i64, i16),
) -> Result<&TransactionMetadata, ErrorCode> {
    let m = current.ok_or(ErrorCode::INVALID_PRODUCER_ID_MAPPING)?;
    if m.producer_id != producer_id {
        return Err(ErrorCode::INVALID_PRODUCER_ID_MAPPING);
    }
    if m.producer_epoch != producer_epoch {
        return Err(ErrorCode::PRODUCER_FENCED);
    }
    Ok(m)
}

fn add_partitions(
    current: Option<&TransactionMetadata>,
    producer: (i64, i16),
    partitions: &[TransactionPartition],
    (verify_only, client_transaction_version): (bool, i16),
    now_ms: i64,
) -> PartitionsDecision {
    let all = |e: ErrorCode| {
        partitions
            .iter()
            .map(|p| (p.clone(), e))
            .collect::<Vec<_>>()
    };
    let m = match check_producer(current, producer) {
        Ok(m) => m,
        Err(e) => return PartitionsDecision::Answer(all(e)),
    };
    if verify_only {
        // As Kafka's `handleVerifyPartitionsInTransaction`: while the markers are being
        // written the leader's produce is to be retried; otherwise a partition is in the
        // transaction exactly when the state lists it (the list is emptied when the
        // transaction completes), and one that is not makes the transaction abortable.
        if matches!(
            m.state,
            TransactionState::PrepareCommit | TransactionState::PrepareAbort
        ) {
            return PartitionsDecision::Answer(all(ErrorCode::CONCURRENT_TRANSACTIONS));
        }
        let results = partitions
            .iter()
            .map(|p| {
                let e = if m.partitions.contains(p) {
                    ErrorCode::NONE
                } else {
                    ErrorCode::TRANSACTION_ABORTABLE
                };
                (p.clone(), e)
            })
            .collect();
        return PartitionsDecision::Answer(results);
    }
    match m.state {
        TransactionState::PrepareCommit
        | TransactionState::PrepareAbort
        | TransactionState::PrepareEpochFence => {
            PartitionsDecision::Answer(all(ErrorCode::CONCURRENT_TRANSACTIONS))
        }
        TransactionState::Dead => {
            PartitionsDecision::Answer(all(ErrorCode::INVALID_PRODUCER_ID_MAPPING))
        }
        TransactionState::Ongoing if partitions.iter().all(|p| m.partitions.contains(p)) => {
            PartitionsDecision::Answer(all(ErrorCode::NONE))
        }
        TransactionState::Ongoing
        | TransactionState::Empty
        | TransactionState::CompleteCommit
        | TransactionState::CompleteAbort => {
            let mut next = m.clone();
            if m.state != TransactionState::Ongoing {
                next.partitions.clear();
                next.txn_start_timestamp_ms = now_ms;
            }
            next.state = TransactionState::Ongoing;
            next.partitions.extend(partitions.iter().cloned());
            next.txn_last_update_timestamp_ms = now_ms;
            next.client_transaction_version = client_transaction_version;
            PartitionsDecision::Write(Box::new(next), all(ErrorCode::NONE))
        }
    }
}

fn end_txn(
    current: Option<&TransactionMetadata>,
    producer: (i64, i16),
    commit: bool,
    now_ms: i64,
) -> Decision {
    let answer = |error: ErrorCode| Response::EndTxn {
        error,
        producer_id: -1,
        producer_epoch: -1,
    };
    let m = match check_producer(current, producer) {
        Ok(m) => m,
        Err(e) => return Decision::Answer(answer(e)),
    };
    let error = match (m.state, commit) {
        (TransactionState::Ongoing, _) => {
            let mut next = m.clone();
            next.state = if commit {
                TransactionState::PrepareCommit
            } else {
                TransactionState::PrepareAbort
            };
            next.txn_last_update_timestamp_ms = now_ms;
            return Decision::Write(Box::new(next), answer(ErrorCode::NONE));
        }
        // A retry while the markers are written.
        (TransactionState::PrepareCommit, true) | (TransactionState::PrepareAbort, false) => {
            ErrorCode::CONCURRENT_TRANSACTIONS
        }
        // A retry of an EndTxn that completed.
        (TransactionState::CompleteCommit, true) | (TransactionState::CompleteAbort, false) => {
            ErrorCode::NONE
        }
        _ => ErrorCode::INVALID_TXN_STATE,
    };
    Decision::Answer(answer(error))
}

/// EndTxn under transaction version 2 (Kafka's `endTransaction` for TV2): every commit
/// and abort bumps the epoch, so that a produce or a marker of the ended transaction can
/// never be taken for one of the next (the leader fences the older epoch); the bump that
/// spends the last epoch moves the producer to `new_producer_id` at epoch 0. With the same
/// epoch meaning "the next transaction", a retry is recognised by the epoch being one
/// behind (or the id being the previous one, after a rotation), and is answered with what
/// the producer holds now. An abort needs no partitions: a producer may abort a
/// transaction it never added anything to.
fn end_txn_v2(
    current: Option<&TransactionMetadata>,
    (producer_id, producer_epoch): (i64, i16),
    commit: bool,
    new_producer_id: i64,
    now_ms: i64,
) -> Decision {
    let answer = |error: ErrorCode, (producer_id, producer_epoch): (i64, i16)| {
        Decision::Answer(Response::EndTxn {
            error,
            producer_id,
            producer_epoch,
        })
    };
    let fail = |error: ErrorCode| answer(error, (-1, -1));
    let Some(m) = current else {
        return fail(ErrorCode::INVALID_PRODUCER_ID_MAPPING);
    };
    let retry_on_overflow = m.previous_producer_id == producer_id
        && producer_epoch == i16::MAX - 1
        && m.producer_epoch == 0;
    let retry_on_bump = m.producer_id == producer_id
        && i32::from(m.producer_epoch) == i32::from(producer_epoch) + 1;
    if m.producer_id != producer_id && !retry_on_overflow {
        return fail(ErrorCode::INVALID_PRODUCER_ID_MAPPING);
    }
    // While the last transaction's markers are written, whatever comes is asked to wait,
    // before the epoch is looked at (KAFKA-18464): the producer already holds the bumped
    // epoch, and its next EndTxn (an abort of a transaction it never added to, say) carries
    // it, which the stored epoch only reaches once the transaction completes. Fencing it
    // here would fence the producer with its own epoch.
    if matches!(
        m.state,
        TransactionState::PrepareCommit | TransactionState::PrepareAbort
    ) {
        return fail(ErrorCode::CONCURRENT_TRANSACTIONS);
    }
    let same_epoch = m.producer_epoch == producer_epoch;
    let valid_epoch = match m.state {
        TransactionState::CompleteCommit | TransactionState::CompleteAbort => {
            retry_on_bump || retry_on_overflow || same_epoch
        }
        _ => same_epoch,
    };
    if !valid_epoch {
        return fail(ErrorCode::PRODUCER_FENCED);
    }
    let retry = retry_on_bump || retry_on_overflow;
    let prepare = |commit: bool, nothing_added: bool| -> Decision {
        let mut next = m.clone();
        if m.epoch_exhausted() {
            if new_producer_id < 0 {
                return fail(ErrorCode::COORDINATOR_NOT_AVAILABLE);
            }
            next.next_producer_id = new_producer_id;
        }
        next.state = if commit {
            TransactionState::PrepareCommit
        } else {
            TransactionState::PrepareAbort
        };
        next.last_producer_epoch = m.producer_epoch;
        next.producer_epoch = m.producer_epoch.saturating_add(1);
        next.client_transaction_version = 2;
        if nothing_added {
            next.partitions.clear();
            next.txn_start_timestamp_ms = now_ms;
        }
        next.txn_last_update_timestamp_ms = now_ms;
        let (producer_id, producer_epoch) = next.completed_producer();
        Decision::Write(
            Box::new(next),
            Response::EndTxn {
                error: ErrorCode::NONE,
                producer_id,
                producer_epoch,
            },
        )
    };
    match (m.state, commit) {
        (TransactionState::Ongoing, _) => prepare(commit, false),
        (TransactionState::CompleteCommit, true) | (TransactionState::CompleteAbort, false)
            if retry =>
        {
            answer(ErrorCode::NONE, (m.producer_id, m.producer_epoch))
        }
        (TransactionState::CompleteCommit, false) if !retry => prepare(false, true),
        (TransactionState::CompleteAbort, false) | (TransactionState::Empty, false) => {
            prepare(false, true)
        }
        _ => fail(ErrorCode::INVALID_TXN_STATE),
    }
}
