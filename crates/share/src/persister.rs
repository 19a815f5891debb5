//! What a share-partition exchanges with the persister (Kafka's `Persister`, the share
//! coordinator behind it): the state a lasting change writes (WriteShareGroupState) and the
//! state a new leader starts from (ReadShareGroupState's answer).

use crate::state_batch::StateBatch;

/// What the broker persists with WriteShareGroupState.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateWrite {
    pub state_epoch: i32,
    pub leader_epoch: i32,
    pub start_offset: i64,
    /// In-flight records whose delivery is over (KIP-1226's `DeliveryCompleteCount`, from
    /// which a share group's lag is computed).
    pub delivery_complete_count: i32,
    pub state_batches: Vec<StateBatch>,
}

/// What ReadShareGroupState answered: the persisted state a leader starts from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PersistedState {
    pub state_epoch: i32,
    /// `-1`: nothing was persisted (or it was reset); `share.auto.offset.reset` decides.
    pub start_offset: i64,
    pub state_batches: Vec<StateBatch>,
}
