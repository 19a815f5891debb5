//! `TransactionMetadata`: what the coordinator knows of one transactional id, and the
//! states of Kafka's `TransactionState` with their byte ids, which `__transaction_state`
//! stores.

use std::collections::BTreeSet;
use std::fmt;

/// Kafka's `TransactionState`. The numbers are the `transaction_status` byte of
/// `TransactionLogValue`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TransactionState {
    /// No transaction in progress (an id just initialized, or after a completed one was
    /// cleaned up).
    Empty,
    /// Partitions were added: a transaction is running.
    Ongoing,
    /// EndTxn(commit) was accepted; the markers are being written.
    PrepareCommit,
    /// EndTxn(abort), a timeout or a fence; the markers are being written.
    PrepareAbort,
    /// Every marker of a commit is written.
    CompleteCommit,
    /// Every marker of an abort is written.
    CompleteAbort,
    /// The id expired and is being removed (its record is a tombstone).
    Dead,
    /// A new producer with the same id fenced the running transaction; it is aborted with
    /// the fencing epoch (KIP-360).
    PrepareEpochFence,
}

impl TransactionState {
    pub fn id(self) -> i8 {
        match self {
            TransactionState::Empty => 0,
            TransactionState::Ongoing => 1,
            TransactionState::PrepareCommit => 2,
            TransactionState::PrepareAbort => 3,
            TransactionState::CompleteCommit => 4,
            TransactionState::CompleteAbort => 5,
            TransactionState::Dead => 6,
            TransactionState::PrepareEpochFence => 7,
        }
    }

    pub fn from_id(id: i8) -> Option<TransactionState> {
        Some(match id {
            0 => TransactionState::Empty,
            1 => TransactionState::Ongoing,
            2 => TransactionState::PrepareCommit,
            3 => TransactionState::PrepareAbort,
            4 => TransactionState::CompleteCommit,
            5 => TransactionState::CompleteAbort,
            6 => TransactionState::Dead,
            7 => TransactionState::PrepareEpochFence,
            _ => return None,
        })
    }

    /// The name DescribeTransactions and ListTransactions use (Kafka's `stateName`).
    pub fn name(self) -> &'static str {
        match self {
            TransactionState::Empty => "Empty",
            TransactionState::Ongoing => "Ongoing",
            TransactionState::PrepareCommit => "PrepareCommit",
            TransactionState::PrepareAbort => "PrepareAbort",
            TransactionState::CompleteCommit => "CompleteCommit",
            TransactionState::CompleteAbort => "CompleteAbort",
            TransactionState::Dead => "Dead",
            TransactionState::PrepareEpochFence => "PrepareEpochFence",
        }
    }

    /// Kafka's state names are also what ListTransactions filters on.
    pub fn from_name(name: &str) -> Option<TransactionState> {
        (0..=7)
            .filter_map(TransactionState::from_id)
            .find(|s| s.name() == name)
    }

    /// Markers are being written: the transaction is ending.
    pub fn is_preparing(self) -> bool {
        matches!(
            self,
            TransactionState::PrepareCommit
                | TransactionState::PrepareAbort
                | TransactionState::PrepareEpochFence
        )
    }

    /// No transaction runs and none is ending: a new one may start.
    pub fn is_idle(self) -> bool {
        matches!(
            self,
            TransactionState::Empty
                | TransactionState::CompleteCommit
                | TransactionState::CompleteAbort
        )
    }
}

impl fmt::Display for TransactionState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What the coordinator keeps for one transactional id (Kafka's `TransactionMetadata`,
/// without its pending-state field: the coordinator keeps pending transitions apart).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransactionMetadata {
    pub transactional_id: String,
    pub producer_id: i64,
    /// The producer id before the last rotation (an exhausted epoch), or -1.
    pub previous_producer_id: i64,
    pub producer_epoch: i16,
    /// The epoch before the last bump, so that a retried InitProducerId of the producer
    /// that caused the bump is recognised (KIP-360), or -1.
    pub last_producer_epoch: i16,
    pub txn_timeout_ms: i32,
    pub state: TransactionState,
    /// `(topic, partition)` of every partition in the running transaction.
    pub partitions: BTreeSet<(String, i32)>,
    /// When the running transaction started (its first partition was added), or -1.
    pub txn_start_timestamp_ms: i64,
    pub txn_last_update_timestamp_ms: i64,
    /// While a transaction version 2 commit or abort spends the last epoch: the producer
    /// id the producer continues with once the markers are written (at epoch 0), else -1.
    pub next_producer_id: i64,
    /// The transaction version of the client's last request that set it (0, or 2 for
    /// KIP-890's second part), as `__transaction_state` records it.
    pub client_transaction_version: i16,
}

impl TransactionMetadata {
    /// Whether `epoch` is the epoch this id's producer holds now.
    pub fn is_current(&self, producer_id: i64, epoch: i16) -> bool {
        self.producer_id == producer_id && self.producer_epoch == epoch
    }

    /// No epoch is left to bump to without rotating the producer id (Kafka's
    /// `isEpochExhausted`: the last one is kept for the markers of that rotation).
    pub fn epoch_exhausted(&self) -> bool {
        self.producer_epoch >= i16::MAX - 1
    }

    /// The producer id and epoch the producer holds once the transaction that is
    /// preparing completes: under transaction version 2 the bumped epoch, or the next
    /// producer id at epoch 0 when the bump spent the last epoch.
    pub fn completed_producer(&self) -> (i64, i16) {
        if self.next_producer_id >= 0 {
            (self.next_producer_id, 0)
        } else {
            (self.producer_id, self.producer_epoch)
        }
    }

    /// The running transaction aborted under a bumped epoch, which fences the producer
    /// that holds the current one (a timeout, or a new producer of the same id); an
    /// epoch that is spent is kept, and the next InitProducerId rotates the id.
    pub fn fenced_abort(&self, now_ms: i64) -> TransactionMetadata {
        let mut next = self.clone();
        next.state = TransactionState::PrepareAbort;
        if self.producer_epoch < i16::MAX - 1 {
            next.last_producer_epoch = self.producer_epoch;
            next.producer_epoch = self.producer_epoch + 1;
        }
        next.txn_last_update_timestamp_ms = now_ms;
        next
    }
}
