//! The transaction coordinator of Kafka's exactly-once delivery (KIP-98), as a pure state
//! machine: requests and the current time in, records for `__transaction_state` and
//! responses out, and the transaction markers the broker must write to the partitions of
//! a transaction that ends.
//!
//! It is hosted by the broker the way the group coordinator is: on the leader of each
//! `__transaction_state` partition it coordinates (a transactional id lives on
//! `partition_for(transactional.id, transaction.state.log.num.partitions)`), fed the
//! partition's records when it becomes leader ([`TransactionCoordinator::load`]), and told
//! when its writes are replicated. Nothing here does I/O or reads a clock.
//!
//! See [`coordinator`] for the protocol and why a transaction's state is visible only
//! once its record is replicated.

pub mod coordinator;
pub mod record;
pub mod state;

#[cfg(test)]
mod tests;

pub use coordinator::*;
pub use record::{TransactionLogRecord, TransactionPartition};
pub use state::{TransactionMetadata, TransactionState};

/// The internal topic that holds the coordinator's records.
pub const TRANSACTION_STATE_TOPIC: &str = "__transaction_state";
