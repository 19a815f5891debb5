//! `ProducerStateManager`: per idempotent producer, its epoch and its last five batches,
//! which is what lets the leader drop a producer's retried batch instead of writing it
//! twice (KIP-98, invariant 7 of DESIGN.md §4).
//!
//! The rules are Kafka's (`ProducerStateManager`, `ProducerAppendInfo`):
//! 1. A batch whose producer epoch is below the known one is from a fenced zombie:
//!    `InvalidProducerEpoch` (a replicated batch is accepted: the leader decided).
//! 2. A client batch with the known epoch and the same first and last sequence as one
//!    of the producer's last five batches is a duplicate: the log answers with that
//!    batch's original offsets and writes nothing.
//! 3. Otherwise a client batch's first sequence must follow the last one (`last + 1`,
//!    wrapping from `i32::MAX` to 0). A new epoch must start at sequence 0, unless the
//!    log knows no epoch for the producer: a producer whose state was never seen, or was
//!    removed with the segments that held it, is accepted at any sequence.
//! 4. Coordinator and replication appends do not check sequences.
//!
//! State is changed only after the whole record set passed validation (the log works on
//! copies of the entries it touches).
//!
//! # Snapshots
//!
//! `<offset, 20 digits>.snapshot` holds the state of every batch below `offset` (the
//! checkpoint text format: one line per producer, `producerId epoch lastTimestamp n` then
//! `lastSeq lastOffset offsetDelta timestamp` for each remembered batch), as Kafka's
//! `ProducerStateManager.takeSnapshot` does:
//! - a clean close writes one at the log end; the next clean open loads it when its
//!   offset is the log end, replays nothing, and deletes it;
//! - each segment roll writes one, fsynced, named by the new segment's base offset,
//!   after the old segment (and its `.txnindex`) was fsynced; the newest
//!   [`SNAPSHOTS_RETAINED`] are kept. An open after an unclean shutdown loads the newest
//!   one that is a segment's base offset and reads only the batch headers from there on,
//!   instead of the whole log (see `UnifiedLog::open`);
//! - a truncation deletes the snapshots above the new log end, since they describe
//!   batches that are gone.
//!
//! Otherwise the state is rebuilt by reading the batch headers of the log in order,
//! applying each as a replicated batch; both give the same state, since live appends and
//! replay go through the same `validate_and_stage`.
//!
//! # Transactions (KIP-98)
//!
//! 5. A transactional data batch (attribute bit 4) of a producer with no open
//!    transaction opens one at the batch's first offset (`current_txn_first_offset`);
//!    a non-transactional data batch while one is open is refused (`InvalidTxnState`).
//! 6. A control batch holding an `EndTxnMarker` (COMMIT or ABORT) closes the producer's
//!    transaction (a marker for a producer with none open closes an empty one at the
//!    marker). A marker whose coordinator epoch is below the one the producer's last
//!    marker carried is from a fenced coordinator (`TransactionCoordinatorFenced`), one
//!    with an older producer epoch from a fenced producer (rule 1).
//! 7. The *first unstable offset* is the first offset of the oldest transaction that is
//!    open, or that is closed by a marker the high watermark has not passed yet
//!    (Kafka's `unreplicatedTxns`: until every in-sync replica has the marker, a new
//!    leader could still see the transaction open). The log's last stable offset is the
//!    smaller of it and the high watermark.
//! 8. An ABORT marker yields an [`AbortedTxn`] for the transaction index, whose
//!    `last_stable_offset` is the first offset of the oldest other open transaction, or
//!    the marker's offset + 1.
//!
//! The snapshot line ends with `currentTxnFirstOffset (-1: none) coordinatorEpoch`; a
//! line without them (an earlier version's snapshot) is refused and the state rebuilt
//! from the log. A close with a closed transaction whose marker is above the high
//! watermark writes no snapshot (nor does a roll then), so that the next open replays
//! the log from an earlier snapshot, or from its start, and finds it.

use std::collections::{BTreeMap, HashMap, VecDeque};

use std::fs;
use std::path::Path;

use crate::checkpoint::{self, Durability};
use crate::error::AppendError;
use crate::header::BatchHeader;
pub use crate::records::EndTxnMarker;
use crate::segment::segment_file;
use crate::transaction_index::AbortedTxn;
use crate::StorageError;

pub const PRODUCER_SNAPSHOT_SUFFIX: &str = "snapshot";

/// How many snapshots a roll or a close leaves in the partition directory: the newest,
/// and one older in case the newest cannot be used (corrupt, or no longer at a segment
/// boundary after a clean merged segments).
pub const SNAPSHOTS_RETAINED: usize = 2;

/// How many batches per producer are remembered for duplicate detection (Kafka's
/// `NUM_BATCHES_TO_RETAIN`, and the client's max in-flight requests).
pub const NUM_BATCHES_TO_RETAIN: usize = 5;
pub const NO_PRODUCER_EPOCH: i16 = -1;
pub const NO_SEQUENCE: i32 = -1;
/// The coordinator epoch of a producer that has written no marker yet.
pub const NO_COORDINATOR_EPOCH: i32 = -1;

/// A transaction a marker closed (Kafka's `CompletedTxn`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompletedTxn {
    pub producer_id: i64,
    pub first_offset: i64,
    /// The marker's offset.
    pub last_offset: i64,
    pub aborted: bool,
}

/// Who is appending: decides which checks apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AppendOrigin {
    /// A producer, through Produce: full validation, no control batches.
    Client,
    /// The group or transaction coordinator: may write control batches.
    Coordinator,
    /// A follower copying the leader: offsets kept, sequences not checked.
    Replication,
}

/// One remembered batch of a producer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchMetadata {
    pub last_seq: i32,
    pub last_offset: i64,
    pub offset_delta: i32,
    pub timestamp: i64,
}

impl BatchMetadata {
    pub fn first_seq(&self) -> i32 {
        decrement_sequence(self.last_seq, self.offset_delta)
    }
    pub fn first_offset(&self) -> i64 {
        self.last_offset - i64::from(self.offset_delta)
    }
}

/// `seq - delta`, wrapping below 0 to `i32::MAX` as sequences do.
fn decrement_sequence(seq: i32, delta: i32) -> i32 {
    if seq < delta {
        (i64::from(i32::MAX) - i64::from(delta) + i64::from(seq) + 1) as i32
    } else {
        seq - delta
    }
}

/// Sequence of a batch's last record, wrapping at `i32::MAX`.
pub(crate) fn last_sequence(base_sequence: i32, last_offset_delta: i32) -> i32 {
    if base_sequence < 0 {
        return base_sequence;
    }
    ((i64::from(base_sequence) + i64::from(last_offset_delta)) % (i64::from(i32::MAX) + 1)) as i32
}

fn in_sequence(last_seq: i32, next_seq: i32) -> bool {
    i64::from(next_seq) == i64::from(last_seq) + 1 || (next_seq == 0 && last_seq == i32::MAX)
}

/// What the log knows of one producer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProducerStateEntry {
    pub producer_id: i64,
    pub producer_epoch: i16,
    /// Oldest first, at most [`NUM_BATCHES_TO_RETAIN`].
    pub batches: VecDeque<BatchMetadata>,
    pub last_timestamp: i64,
    /// The epoch of the transaction coordinator that wrote this producer's last marker.
    pub coordinator_epoch: i32,
    /// The first offset of the producer's open transaction in this partition.
    pub current_txn_first_offset: Option<i64>,
}

impl ProducerStateEntry {
    fn empty(producer_id: i64) -> Self {
        Self {
            producer_id,
            producer_epoch: NO_PRODUCER_EPOCH,
            batches: VecDeque::new(),
            last_timestamp: -1,
            coordinator_epoch: NO_COORDINATOR_EPOCH,
            current_txn_first_offset: None,
        }
    }

    pub fn last_seq(&self) -> i32 {
        self.batches.back().map_or(NO_SEQUENCE, |b| b.last_seq)
    }

    pub fn last_data_offset(&self) -> i64 {
        self.batches.back().map_or(-1, |b| b.last_offset)
    }

    /// The remembered batch with exactly this epoch and sequence range.
    pub fn find_duplicate_batch(
        &self,
        producer_epoch: i16,
        first_seq: i32,
        last_seq: i32,
    ) -> Option<BatchMetadata> {
        if producer_epoch != self.producer_epoch {
            return None;
        }
        self.batches
            .iter()
            .find(|b| b.first_seq() == first_seq && b.last_seq == last_seq)
            .copied()
    }

    /// A new epoch forgets the old epoch's batches.
    fn maybe_update_producer_epoch(&mut self, producer_epoch: i16) {
        if self.producer_epoch != producer_epoch {
            self.batches.clear();
            self.producer_epoch = producer_epoch;
        }
    }

    fn add_batch(&mut self, producer_epoch: i16, meta: BatchMetadata) {
        self.maybe_update_producer_epoch(producer_epoch);
        if self.batches.len() == NUM_BATCHES_TO_RETAIN {
            self.batches.pop_front();
        }
        self.batches.push_back(meta);
        self.last_timestamp = meta.timestamp;
    }
}

/// The producers of one partition.
#[derive(Debug, Default, Clone)]
pub struct ProducerStateManager {
    producers: HashMap<i64, ProducerStateEntry>,
    /// Open transactions: first offset → producer id.
    ongoing_txns: BTreeMap<i64, i64>,
    /// Transactions closed by a marker the high watermark has not passed yet (rule 7):
    /// first offset → (producer id, marker offset).
    unreplicated_txns: BTreeMap<i64, (i64, i64)>,
    /// KIP-890 part 1: the producers whose first transactional batch here is being
    /// verified with the transaction coordinator, by producer id. In memory only: a
    /// restart loses them, and the producer's retry is verified again.
    verifications: HashMap<i64, VerificationEntry>,
    /// The last guard handed out (guards are never 0, so that no default matches).
    last_guard: u64,
    /// The partition's directory name, which every log line names.
    partition: std::sync::Arc<str>,
}

/// What a leader asked the transaction coordinator about (Kafka's
/// `VerificationStateEntry`). Its guard is what the verified append must bring back: a
/// marker or the transaction's first batch removes the entry, so that an append
/// verified before an abort landed cannot open a transaction after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct VerificationEntry {
    guard: u64,
    producer_epoch: i16,
    started_ms: i64,
    /// For a transaction version 2 producer (KIP-890 part 2), whose every transaction
    /// ends with a marker at the epoch the next one runs at: that marker leaves the
    /// verification standing.
    supports_epoch_bump: bool,
}

/// The producer fields of one batch, as the log hands them over.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ProducerBatch {
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    pub last_offset_delta: i32,
    pub max_timestamp: i64,
    pub is_control: bool,
    pub is_transactional: bool,
    /// The marker a control batch holds (`None`: not a transaction marker).
    pub marker: Option<EndTxnMarker>,
}

impl ProducerBatch {
    /// The batch's producer fields; `marker` is what its control record says, when it
    /// is a control batch (the header alone cannot tell COMMIT from ABORT).
    pub fn from_header(h: &BatchHeader, marker: Option<EndTxnMarker>) -> Self {
        Self {
            producer_id: h.producer_id,
            producer_epoch: h.producer_epoch,
            base_sequence: h.base_sequence,
            last_offset_delta: h.last_offset_delta,
            max_timestamp: h.max_timestamp,
            is_control: h.is_control(),
            is_transactional: h.is_transactional(),
            marker: marker.filter(|_| h.is_control()),
        }
    }
    pub fn last_sequence(&self) -> i32 {
        last_sequence(self.base_sequence, self.last_offset_delta)
    }
}

/// Validated but not yet applied changes for the producers of one record set.
#[derive(Debug, Default)]
pub(crate) struct ProducerAppendInfo {
    updated: HashMap<i64, ProducerStateEntry>,
    /// Transactions opened and closed by the record set, in offset order.
    txn_events: Vec<TxnEvent>,
}

#[derive(Debug, Clone, Copy)]
enum TxnEvent {
    Started {
        producer_id: i64,
        first_offset: i64,
    },
    /// A marker ended the producer's transaction; the marker's producer epoch.
    Completed(CompletedTxn, i16),
}

impl ProducerStateManager {
    /// Names the partition (its directory's name) in what this state logs.
    pub fn set_partition(&mut self, name: &str) {
        self.partition = name.into();
    }

    pub fn get(&self, producer_id: i64) -> Option<&ProducerStateEntry> {
        self.producers.get(&producer_id)
    }

    pub fn len(&self) -> usize {
        self.producers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.producers.is_empty()
    }

    /// Every producer the partition knows, by producer id (DescribeProducers).
    pub fn producers(&self) -> impl Iterator<Item = &ProducerStateEntry> {
        self.producers.values()
    }

    /// Rule 7: the first offset of the oldest transaction that is open or whose marker
    /// is not below the high watermark yet.
    pub fn first_unstable_offset(&self) -> Option<i64> {
        let ongoing = self.ongoing_txns.keys().next().copied();
        let unreplicated = self.unreplicated_txns.keys().next().copied();
        match (ongoing, unreplicated) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Whether the producer has a transaction open here in this epoch (Kafka's
    /// `hasOngoingTransaction`): then its batch needs no verification.
    pub fn has_ongoing_txn(&self, producer_id: i64, producer_epoch: i16) -> bool {
        self.producers.get(&producer_id).is_some_and(|e| {
            e.current_txn_first_offset.is_some() && e.producer_epoch == producer_epoch
        })
    }

    /// Starts the verification of a transactional batch of `producer_id` at
    /// `producer_epoch`: `None` when it needs none (a transaction of the producer is open
    /// here in this epoch), else the guard the append must carry. A verification already
    /// under way for the producer is shared (its guard returned), so that the in-flight
    /// batches of one producer all pass once the first of them opened the transaction.
    pub(crate) fn start_verification(
        &mut self,
        producer_id: i64,
        producer_epoch: i16,
        supports_epoch_bump: bool,
        now_ms: i64,
    ) -> Result<Option<u64>, AppendError> {
        // An epoch older than the producer's here is fenced at once, without asking the
        // coordinator (Kafka's `maybeStartTransactionVerification`): a late write of a
        // transaction whose marker carried a newer epoch.
        if let Some(e) = self.producers.get(&producer_id) {
            if producer_epoch < e.producer_epoch {
                return Err(AppendError::InvalidProducerEpoch {
                    producer_id,
                    current: e.producer_epoch,
                    found: producer_epoch,
                });
            }
        }
        if self.has_ongoing_txn(producer_id, producer_epoch) {
            return Ok(None);
        }
        if let Some(e) = self.verifications.get_mut(&producer_id) {
            if e.producer_epoch >= producer_epoch {
                return Ok(Some(e.guard));
            }
        }
        self.last_guard = self.last_guard.wrapping_add(1).max(1);
        let entry = VerificationEntry {
            guard: self.last_guard,
            producer_epoch,
            started_ms: now_ms,
            supports_epoch_bump,
        };
        self.verifications.insert(producer_id, entry);
        Ok(Some(entry.guard))
    }

    /// Whether batch `b` of a verified client append may be written: a data batch that
    /// opens a transaction (none open for its producer in this epoch, counting the
    /// earlier batches of the same record set staged in `info`) needs the producer's
    /// current verification guard.
    pub(crate) fn verified(
        &self,
        info: &ProducerAppendInfo,
        b: &ProducerBatch,
        guard: Option<u64>,
    ) -> bool {
        if !b.is_transactional || b.is_control {
            return true;
        }
        let entry = info
            .updated
            .get(&b.producer_id)
            .or_else(|| self.producers.get(&b.producer_id));
        let open = entry.is_some_and(|e| {
            e.current_txn_first_offset.is_some() && e.producer_epoch == b.producer_epoch
        });
        open || guard.is_some_and(|g| {
            self.verifications
                .get(&b.producer_id)
                .is_some_and(|e| e.guard == g)
        })
    }

    /// The open transactions: `(first offset, producer id)`, oldest first.
    pub fn ongoing_txns(&self) -> impl Iterator<Item = (i64, i64)> + '_ {
        self.ongoing_txns.iter().map(|(o, p)| (*o, *p))
    }

    /// The high watermark moved to `hw`: closed transactions whose marker is below it
    /// no longer hold the last stable offset back.
    pub(crate) fn on_high_watermark_updated(&mut self, hw: i64) {
        self.unreplicated_txns
            .retain(|_, (_, marker)| *marker >= hw);
    }

    /// Whether a closed transaction's marker is still above the high watermark.
    pub(crate) fn has_unreplicated_txns(&self) -> bool {
        !self.unreplicated_txns.is_empty()
    }

    /// The last offset of each producer's latest batch: the batches the cleaner must
    /// keep (emptied if need be) so that a rebuild from the log finds every producer's
    /// last sequence again.
    pub(crate) fn last_batch_offsets(&self) -> std::collections::HashSet<i64> {
        self.producers
            .values()
            .map(ProducerStateEntry::last_data_offset)
            .filter(|o| *o >= 0)
            .collect()
    }

    /// Forgets the producers whose last batch is `expiration_ms` or more older than
    /// `now_ms` and that have no open transaction (Kafka's `removeExpiredProducers`,
    /// `producer.id.expiration.ms`): the state of producers that are gone would
    /// otherwise grow without end. A producer forgotten that writes again is new to
    /// the log, as in Kafka. Returns how many were forgotten.
    pub(crate) fn remove_expired(&mut self, now_ms: i64, expiration_ms: i64) -> usize {
        // A verification whose append never came (refused, or the client gone).
        self.verifications
            .retain(|_, v| now_ms.saturating_sub(v.started_ms) < expiration_ms);
        let before = self.producers.len();
        self.producers.retain(|_, p| {
            p.current_txn_first_offset.is_some()
                || now_ms.saturating_sub(p.last_timestamp) < expiration_ms
        });
        before - self.producers.len()
    }

    /// Each producer's epoch and the last offset of its latest data batch (-1 when it
    /// has none): a marker after that batch in the producer's current epoch carries the
    /// epoch fencing depends on, and the cleaner keeps it.
    pub(crate) fn last_epochs(&self) -> HashMap<i64, (i16, i64)> {
        self.producers
            .values()
            .map(|p| (p.producer_id, (p.producer_epoch, p.last_data_offset())))
            .collect()
    }

    pub(crate) fn clear(&mut self) {
        self.producers.clear();
        self.ongoing_txns.clear();
        self.unreplicated_txns.clear();
        self.verifications.clear();
    }

    /// Rule 2: a client batch that repeats one of the producer's last five.
    pub(crate) fn find_duplicate(&self, b: &ProducerBatch) -> Option<BatchMetadata> {
        self.producers.get(&b.producer_id).and_then(|e| {
            e.find_duplicate_batch(b.producer_epoch, b.base_sequence, b.last_sequence())
        })
    }

    /// Rules 1, 3 and 4 for one batch whose last offset will be `last_offset`, recorded
    /// in `info` (checked against earlier batches of the same record set).
    pub(crate) fn validate_and_stage(
        &self,
        info: &mut ProducerAppendInfo,
        b: &ProducerBatch,
        last_offset: i64,
        origin: AppendOrigin,
    ) -> Result<(), AppendError> {
        let current_epoch = self
            .producers
            .get(&b.producer_id)
            .map_or(NO_PRODUCER_EPOCH, |e| e.producer_epoch);
        let entry = info.updated.entry(b.producer_id).or_insert_with(|| {
            self.producers
                .get(&b.producer_id)
                .cloned()
                .unwrap_or_else(|| ProducerStateEntry::empty(b.producer_id))
        });
        if b.producer_epoch < entry.producer_epoch {
            if origin == AppendOrigin::Replication {
                tracing::warn!(
                    partition = %self.partition,
                    producer_id = b.producer_id,
                    epoch = b.producer_epoch,
                    current = entry.producer_epoch,
                    "replicated batch with an older producer epoch"
                );
            } else {
                return Err(AppendError::InvalidProducerEpoch {
                    producer_id: b.producer_id,
                    current: entry.producer_epoch,
                    found: b.producer_epoch,
                });
            }
        }
        if b.is_control {
            let Some(marker) = b.marker else {
                // A control record of a type this version does not know: no effect on
                // the transaction, as Kafka's `ProducerAppendInfo` ignores it.
                entry.maybe_update_producer_epoch(b.producer_epoch);
                entry.last_timestamp = b.max_timestamp;
                return Ok(());
            };
            if marker.coordinator_epoch < entry.coordinator_epoch {
                if origin == AppendOrigin::Replication {
                    tracing::warn!(
                        partition = %self.partition,
                        producer_id = b.producer_id,
                        coordinator_epoch = marker.coordinator_epoch,
                        current = entry.coordinator_epoch,
                        "replicated marker from an older coordinator epoch"
                    );
                } else {
                    return Err(AppendError::TransactionCoordinatorFenced {
                        producer_id: b.producer_id,
                        current: entry.coordinator_epoch,
                        found: marker.coordinator_epoch,
                    });
                }
            }
            let first_offset = entry.current_txn_first_offset.unwrap_or(last_offset);
            entry.maybe_update_producer_epoch(b.producer_epoch);
            entry.current_txn_first_offset = None;
            entry.coordinator_epoch = marker.coordinator_epoch;
            entry.last_timestamp = b.max_timestamp;
            info.txn_events.push(TxnEvent::Completed(
                CompletedTxn {
                    producer_id: b.producer_id,
                    first_offset,
                    last_offset,
                    aborted: !marker.commit,
                },
                b.producer_epoch,
            ));
            return Ok(());
        }
        if origin == AppendOrigin::Client {
            let first = b.base_sequence;
            // A transaction version 2 producer starts at sequence 0 after every marker
            // (its epoch was bumped), so without state here only 0 is in order (Kafka's
            // `checkSequence`).
            if first != 0
                && entry.batches.is_empty()
                && entry.current_txn_first_offset.is_none()
                && self
                    .verifications
                    .get(&b.producer_id)
                    .is_some_and(|v| v.supports_epoch_bump)
            {
                return Err(AppendError::OutOfOrderSequence {
                    producer_id: b.producer_id,
                    producer_epoch: b.producer_epoch,
                    expected: 0,
                    found: first,
                });
            }
            if b.producer_epoch != entry.producer_epoch {
                if first != 0 && entry.producer_epoch != NO_PRODUCER_EPOCH {
                    return Err(AppendError::OutOfOrderSequence {
                        producer_id: b.producer_id,
                        producer_epoch: b.producer_epoch,
                        expected: 0,
                        found: first,
                    });
                }
            } else {
                let last = entry.last_seq();
                if !(current_epoch == NO_PRODUCER_EPOCH || in_sequence(last, first)) {
                    return Err(AppendError::OutOfOrderSequence {
                        producer_id: b.producer_id,
                        producer_epoch: b.producer_epoch,
                        expected: if last == i32::MAX {
                            0
                        } else {
                            last.wrapping_add(1)
                        },
                        found: first,
                    });
                }
            }
        }
        let first_offset = last_offset - i64::from(b.last_offset_delta);
        match (entry.current_txn_first_offset, b.is_transactional) {
            (Some(_), false) => {
                return Err(AppendError::InvalidTxnState {
                    producer_id: b.producer_id,
                    reason: "non-transactional batch while a transaction is open",
                })
            }
            (None, true) => {
                entry.current_txn_first_offset = Some(first_offset);
                info.txn_events.push(TxnEvent::Started {
                    producer_id: b.producer_id,
                    first_offset,
                });
            }
            _ => {}
        }
        entry.add_batch(
            b.producer_epoch,
            BatchMetadata {
                last_seq: b.last_sequence(),
                last_offset,
                offset_delta: b.last_offset_delta,
                timestamp: b.max_timestamp,
            },
        );
        Ok(())
    }

    /// Applies what [`Self::validate_and_stage`] staged, once the append succeeded, and
    /// returns the transaction index entries of the ABORT markers in it (rule 8).
    pub(crate) fn apply(&mut self, info: ProducerAppendInfo) -> Vec<AbortedTxn> {
        self.producers.extend(info.updated);
        let mut aborted = Vec::new();
        for event in info.txn_events {
            // A verification is used up by the transaction it let open, and void once a
            // marker ended the producer's transaction (the coordinator's answer was
            // about that one).
            match event {
                TxnEvent::Started { producer_id, .. } => {
                    self.verifications.remove(&producer_id);
                }
                // Under transaction version 2 a verification at the marker's epoch is
                // for the producer's next transaction, which the coordinator let start
                // once this marker's was complete (Kafka's `isV2NextTransactionStarted`).
                TxnEvent::Completed(txn, epoch) => {
                    let next_started = self
                        .verifications
                        .get(&txn.producer_id)
                        .is_some_and(|v| v.supports_epoch_bump && v.producer_epoch == epoch);
                    if !next_started {
                        self.verifications.remove(&txn.producer_id);
                    }
                }
            }
            match event {
                TxnEvent::Started {
                    producer_id,
                    first_offset,
                } => {
                    self.ongoing_txns.insert(first_offset, producer_id);
                }
                TxnEvent::Completed(txn, _) => {
                    if self.ongoing_txns.get(&txn.first_offset) == Some(&txn.producer_id) {
                        self.ongoing_txns.remove(&txn.first_offset);
                    }
                    if txn.aborted {
                        let last_stable_offset = self
                            .ongoing_txns
                            .keys()
                            .next()
                            .copied()
                            .unwrap_or(txn.last_offset + 1);
                        aborted.push(AbortedTxn {
                            producer_id: txn.producer_id,
                            first_offset: txn.first_offset,
                            last_offset: txn.last_offset,
                            last_stable_offset,
                        });
                    }
                    self.unreplicated_txns
                        .insert(txn.first_offset, (txn.producer_id, txn.last_offset));
                }
            }
        }
        aborted
    }

    /// Writes the snapshot of the state at `offset` (the log end), and removes all but
    /// the newest [`SNAPSHOTS_RETAINED`] snapshots.
    ///
    /// Snapshots above `keep_above` are kept whatever their number: those of a tiered
    /// log's segments not yet copied to the remote tier, whose copies carry them (see
    /// [`crate::remote`]).
    pub(crate) fn write_snapshot(
        &self,
        dir: &Path,
        offset: i64,
        keep_above: i64,
        durability: Durability,
    ) -> Result<(), StorageError> {
        let mut ids: Vec<_> = self.producers.keys().copied().collect();
        ids.sort_unstable();
        let mut lines = Vec::with_capacity(ids.len());
        for id in ids {
            let Some(e) = self.producers.get(&id) else {
                continue;
            };
            let mut line = format!(
                "{} {} {} {}",
                e.producer_id,
                e.producer_epoch,
                e.last_timestamp,
                e.batches.len()
            );
            for b in &e.batches {
                line.push_str(&format!(
                    " {} {} {} {}",
                    b.last_seq, b.last_offset, b.offset_delta, b.timestamp
                ));
            }
            line.push_str(&format!(
                " {} {}",
                e.current_txn_first_offset.unwrap_or(-1),
                e.coordinator_epoch
            ));
            lines.push(line);
        }
        let path = segment_file(dir, offset, PRODUCER_SNAPSHOT_SUFFIX);
        checkpoint::write(&path, &lines, durability)?;
        let offsets = Self::snapshot_offsets(dir)?;
        let doomed = offsets.len().saturating_sub(SNAPSHOTS_RETAINED);
        for &old in offsets[..doomed].iter().filter(|&&o| o <= keep_above) {
            Self::delete_snapshot(dir, old)?;
        }
        Ok(())
    }

    /// The offsets of the snapshots in `dir`, ascending.
    pub(crate) fn snapshot_offsets(dir: &Path) -> Result<Vec<i64>, StorageError> {
        let mut offsets = Vec::new();
        for entry in fs::read_dir(dir).map_err(|e| StorageError::io(dir, e))? {
            let entry = entry.map_err(|e| StorageError::io(dir, e))?;
            let name = entry.file_name();
            let Some(stem) = name
                .to_str()
                .and_then(|n| n.strip_suffix(PRODUCER_SNAPSHOT_SUFFIX))
                .and_then(|n| n.strip_suffix('.'))
            else {
                continue;
            };
            if stem.len() == 20 && stem.bytes().all(|b| b.is_ascii_digit()) {
                if let Ok(offset) = stem.parse() {
                    offsets.push(offset);
                }
            }
        }
        offsets.sort_unstable();
        Ok(offsets)
    }

    /// The newest snapshot whose offset `usable` accepts and that loads, with its offset:
    /// an older one is tried when a newer one is corrupt.
    pub(crate) fn latest_snapshot(
        dir: &Path,
        usable: impl Fn(i64) -> bool,
    ) -> Result<Option<(i64, Self)>, StorageError> {
        for offset in Self::snapshot_offsets(dir)?.into_iter().rev() {
            if !usable(offset) {
                continue;
            }
            match Self::read_snapshot(dir, offset)? {
                Some(state) => return Ok(Some((offset, state))),
                None => {
                    tracing::warn!(dir = %dir.display(), offset, "unreadable producer snapshot ignored");
                }
            }
        }
        Ok(None)
    }

    /// Removes the snapshot taken at `offset`, if there is one.
    pub(crate) fn delete_snapshot(dir: &Path, offset: i64) -> Result<(), StorageError> {
        let path = segment_file(dir, offset, PRODUCER_SNAPSHOT_SUFFIX);
        match fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(StorageError::io(&path, e)),
        }
    }

    /// Removes the snapshots taken above `offset` (a truncation to `offset`: what they
    /// describe is no longer in the log).
    pub(crate) fn delete_snapshots_above(dir: &Path, offset: i64) -> Result<(), StorageError> {
        Self::delete_snapshots_where(dir, |o| o > offset)
    }

    /// Removes the snapshots taken below `offset` (a clean below it removed a marker, or
    /// the first records of an aborted transaction: a replay from such a snapshot would
    /// find the transaction as it was, or never closed).
    pub(crate) fn delete_snapshots_below(dir: &Path, offset: i64) -> Result<(), StorageError> {
        Self::delete_snapshots_where(dir, |o| o < offset)
    }

    fn delete_snapshots_where(
        dir: &Path,
        doomed: impl Fn(i64) -> bool,
    ) -> Result<(), StorageError> {
        for old in Self::snapshot_offsets(dir)? {
            if doomed(old) {
                Self::delete_snapshot(dir, old)?;
            }
        }
        Ok(())
    }

    /// Loads the snapshot taken at `offset`; `None` when there is none or it is corrupt.
    pub(crate) fn read_snapshot(dir: &Path, offset: i64) -> Result<Option<Self>, StorageError> {
        let path = segment_file(dir, offset, PRODUCER_SNAPSHOT_SUFFIX);
        let lines = match checkpoint::read(&path) {
            Ok(Some(lines)) => lines,
            Ok(None) | Err(StorageError::Corrupt { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        let mut producers = HashMap::with_capacity(lines.len());
        let mut ongoing_txns = BTreeMap::new();
        for f in lines {
            let header = f.get(..4).and_then(|h| {
                Some((
                    h[0],
                    i16::try_from(h[1]).ok()?,
                    h[2],
                    usize::try_from(h[3]).ok()?,
                ))
            });
            let Some((producer_id, producer_epoch, last_timestamp, n)) = header else {
                return Ok(None);
            };
            if n > NUM_BATCHES_TO_RETAIN || f.len() != 4 + 4 * n + 2 {
                return Ok(None);
            }
            let txn_first = f[4 + 4 * n];
            let Ok(coordinator_epoch) = i32::try_from(f[4 + 4 * n + 1]) else {
                return Ok(None);
            };
            let current_txn_first_offset = (txn_first >= 0).then_some(txn_first);
            let mut batches = VecDeque::with_capacity(n);
            for b in f[4..4 + 4 * n].chunks_exact(4) {
                let (Ok(last_seq), Ok(offset_delta)) = (i32::try_from(b[0]), i32::try_from(b[2]))
                else {
                    return Ok(None);
                };
                batches.push_back(BatchMetadata {
                    last_seq,
                    last_offset: b[1],
                    offset_delta,
                    timestamp: b[3],
                });
            }
            if let Some(first) = current_txn_first_offset {
                ongoing_txns.insert(first, producer_id);
            }
            producers.insert(
                producer_id,
                ProducerStateEntry {
                    producer_id,
                    producer_epoch,
                    batches,
                    last_timestamp,
                    coordinator_epoch,
                    current_txn_first_offset,
                },
            );
        }
        Ok(Some(Self {
            producers,
            ongoing_txns,
            unreplicated_txns: BTreeMap::new(),
            ..Self::default()
        }))
    }

    /// Removes every snapshot in `dir` but `keep`.
    pub(crate) fn delete_snapshots(dir: &Path, keep: Option<&Path>) -> Result<(), StorageError> {
        for entry in fs::read_dir(dir).map_err(|e| StorageError::io(dir, e))? {
            let path = entry.map_err(|e| StorageError::io(dir, e))?.path();
            let is_snapshot = path
                .extension()
                .is_some_and(|e| e == PRODUCER_SNAPSHOT_SUFFIX);
            if is_snapshot && Some(path.as_path()) != keep {
                fs::remove_file(&path).map_err(|e| StorageError::io(&path, e))?;
            }
        }
        Ok(())
    }

    /// Applies a batch read back from the log (recovery, truncation, a follower's
    /// append): as replication. `marker` is what a control batch's record says. Returns
    /// the transaction index entry of an ABORT marker.
    pub(crate) fn replay(
        &mut self,
        h: &BatchHeader,
        marker: Option<EndTxnMarker>,
    ) -> Option<AbortedTxn> {
        if h.producer_id < 0 {
            return None;
        }
        let b = ProducerBatch::from_header(h, marker);
        let mut info = ProducerAppendInfo::default();
        // Replication never fails the epoch checks; a batch that breaks the transaction
        // rules (which a leader would have refused) is skipped rather than stop a load.
        match self.validate_and_stage(&mut info, &b, h.last_offset(), AppendOrigin::Replication) {
            Ok(()) => self.apply(info).pop(),
            Err(e) => {
                tracing::warn!(
                    partition = %self.partition,
                    offset = h.base_offset,
                    error = %e,
                    "batch skipped by producer state"
                );
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(pid: i64, epoch: i16, seq: i32, n: i32) -> ProducerBatch {
        ProducerBatch {
            producer_id: pid,
            producer_epoch: epoch,
            base_sequence: seq,
            last_offset_delta: n - 1,
            max_timestamp: 0,
            is_control: false,
            is_transactional: false,
            marker: None,
        }
    }

    fn append(
        m: &mut ProducerStateManager,
        b: ProducerBatch,
        last: i64,
    ) -> Result<(), AppendError> {
        let mut info = ProducerAppendInfo::default();
        m.validate_and_stage(&mut info, &b, last, AppendOrigin::Client)?;
        m.apply(info);
        Ok(())
    }

    #[test]
    fn sequence_rules() {
        let mut m = ProducerStateManager::default();
        // Unknown producer: any first sequence is accepted.
        append(&mut m, batch(1, 0, 7, 3), 2).unwrap();
        assert_eq!(m.get(1).unwrap().last_seq(), 9);
        assert!(matches!(
            append(&mut m, batch(1, 0, 11, 1), 3),
            Err(AppendError::OutOfOrderSequence {
                expected: 10,
                found: 11,
                ..
            })
        ));
        append(&mut m, batch(1, 0, 10, 1), 3).unwrap();
        assert_eq!(m.find_duplicate(&batch(1, 0, 7, 3)).unwrap().last_offset, 2);
        // A new epoch must restart at 0.
        assert!(matches!(
            append(&mut m, batch(1, 1, 11, 1), 4),
            Err(AppendError::OutOfOrderSequence { expected: 0, .. })
        ));
        append(&mut m, batch(1, 1, 0, 1), 4).unwrap();
        assert!(m.find_duplicate(&batch(1, 0, 7, 3)).is_none());
        assert!(matches!(
            append(&mut m, batch(1, 0, 11, 1), 5),
            Err(AppendError::InvalidProducerEpoch {
                current: 1,
                found: 0,
                ..
            })
        ));
    }

    #[test]
    fn sequences_wrap() {
        assert_eq!(last_sequence(i32::MAX - 1, 3), 1);
        assert_eq!(decrement_sequence(1, 3), i32::MAX - 1);
        assert!(in_sequence(i32::MAX, 0));
        let mut m = ProducerStateManager::default();
        append(&mut m, batch(9, 0, i32::MAX - 1, 2), 1).unwrap();
        append(&mut m, batch(9, 0, 0, 2), 3).unwrap();
        assert_eq!(
            m.find_duplicate(&batch(9, 0, i32::MAX - 1, 2))
                .unwrap()
                .last_offset,
            1
        );
    }

    #[test]
    fn only_five_batches_are_remembered() {
        let mut m = ProducerStateManager::default();
        for i in 0..7 {
            append(&mut m, batch(2, 0, i, 1), i64::from(i)).unwrap();
        }
        assert!(m.find_duplicate(&batch(2, 0, 1, 1)).is_none());
        assert_eq!(m.find_duplicate(&batch(2, 0, 2, 1)).unwrap().last_offset, 2);
    }
}
