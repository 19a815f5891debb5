//! Share groups (KIP-932, "queues for Kafka"): the two pure state machines behind them.
//!
//! - [`SharePartition`] is the partition leader's state of one share-partition: which
//!   records are in flight, acquired by whom until when, delivered how often, and what must
//!   be persisted. ShareFetch acquires through it, ShareAcknowledge (and the acknowledgements
//!   piggybacked on ShareFetch) acknowledges through it, and its acquisition locks expire
//!   through [`SharePartition::expire`]. Its design note says why an accepted record is
//!   never delivered again (DESIGN.md, invariant 12).
//! - [`ShareCoordinator`] is the share coordinator's shard on the `__share_group_state`
//!   partitions this node leads: it persists share-partition state as Kafka's `ShareSnapshot`
//!   and `ShareUpdate` records and answers the share-group state RPCs from replicated state
//!   only (invariant 9).
//!
//! Both are sans-I/O, like `rill-group` and `rill-transaction`: inputs and the current time
//! in (`now_ms`), records to persist and answers out; no clock is read, no task spawned, no
//! file or socket touched. The broker hosts the coordinator on its coordinator runtime and
//! keeps one [`SharePartition`] per share group and partition it leads. The records and RPCs
//! are plain Rust types here; their Kafka byte formats are the broker's thin layer.
//!
//! ```
//! use rill_protocol::Uuid;
//! use rill_share::*;
//!
//! let empty = PersistedState { state_epoch: 0, start_offset: -1, state_batches: vec![] };
//! let config = SharePartitionConfig::default();
//! let mut sp = SharePartition::from_persisted("g", Uuid::from_u64_pair(1, 1), 0, config, 0, &empty, 0).unwrap();
//! let batches = [FetchedBatch { base_offset: 0, last_offset: 9 }];
//! let fetch = ShareFetch { fetch_offset: sp.next_fetch_offset(), batches: &batches, max_records: 500,
//!                          acquire_mode: ShareAcquireMode::BatchOptimized, skip: &[] };
//! let acquired = sp.acquire("member-1", &fetch, 1_000);
//! assert_eq!(acquired.records, vec![AcquiredRecords { first_offset: 0, last_offset: 9, delivery_count: 1 }]);
//! // The member accepts them: the start offset moves past them, and the write says so.
//! let write = sp.acknowledge("member-1", &[AcknowledgementBatch::new(0, 9, AcknowledgeType::Accept)], 2_000)
//!     .unwrap()
//!     .unwrap();
//! assert_eq!((sp.start_offset(), write.start_offset), (10, 10));
//! ```

mod acknowledgement;
mod auto_offset_reset;
mod coordinator;
mod error;
mod persister;
mod record;
mod share_fetch;
mod share_partition;
mod state_batch;

#[cfg(test)]
mod tests;

pub use acknowledgement::{AcknowledgeType, AcknowledgementBatch};
pub use auto_offset_reset::{ResetSpec, ShareAutoOffsetReset};
pub use coordinator::{
    ColdSnapshot, Output, Request, Response, ShareCoordinator, ShareCoordinatorConfig,
    ShareGroupOffset, WriteId,
};
pub use error::ShareError;
pub use persister::{PersistedState, StateWrite};
pub use record::{
    ShareCoordinatorRecord, SharePartitionKey, ShareSnapshotValue, ShareUpdateValue,
    SHARE_GROUP_STATE_TOPIC,
};
pub use share_fetch::{
    Acquired, AcquiredRecords, FetchedBatch, OffsetRange, ShareAcquireMode, ShareFetch,
};
pub use share_partition::{Expired, InFlightRecords, SharePartition, SharePartitionConfig};
pub use state_batch::{combine, RecordState, StateBatch};
