//! The coordinators' runtime (Kafka's `CoordinatorRuntime`) and the shards it hosts: a
//! pure coordinator state machine on the partitions of an internal topic this broker
//! leads — loading a partition on leadership by replaying it, appending the state
//! machine's records with acks=all, reporting the high watermark so that reads see only
//! replicated state, running its timers — and dropping the partition's state when
//! leadership moves away.
//!
//! - [`runtime`]: the runtime, generic over a [`runtime::CoordinatorShard`].
//! - [`group_coordinator`]: the `rill-group` state machine on `__consumer_offsets`, with
//!   [`consumer_group_codec`] for the records of KIP-848's consumer groups.
//! - [`transaction_coordinator`]: the `rill-transaction` state machine on
//!   `__transaction_state`, and [`transaction_marker`], the sender of its markers.
//! - [`share_coordinator`]: the `rill-share` state machine on `__share_group_state`
//!   (KIP-932's share coordinator), with [`share_coordinator_codec`] for its records.
//!
//! Architecture Invariant: a coordinator names replication (for its partitions' logs and
//! high watermarks) and the network's request slots, nothing above: the metadata
//! publisher and the lifecycle tell it to load or drop partitions through its handle.

pub mod consumer_group_codec;
pub mod group_coordinator;
pub mod runtime;
pub mod share_coordinator;
pub mod share_coordinator_codec;
pub mod share_group_codec;
pub mod transaction_coordinator;
pub mod transaction_marker;
