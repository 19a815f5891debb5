//! Replication (Kafka's `ReplicaManager`, `Partition`, `ReplicaFetcherManager`,
//! `AlterPartitionManager` and purgatories): the partitions this broker hosts as leader
//! or follower, the ISR and high watermark, acks=all waits and parked fetches, the
//! follower fetchers, ISR changes sent to the controller, background retention and
//! compaction, and the log directories (JBOD) with their failures.
//!
//! - [`replica_manager`]: `ReplicaManager`, the partitions and their logs.
//! - [`isr`]: the leader's ISR and high-watermark state machine (pure, clock passed in).
//! - [`replica_fetcher`]: follower fetchers, in incremental fetch sessions
//!   ([`fetch_session_handler`]).
//! - [`alter_partition`]: ISR changes to the controller through a [`ControllerChannel`]
//!   the server implements.
//! - [`assignments`]: the log directories replicas were placed in, reported to the
//!   controller (AssignReplicasToDirs, KIP-858) through the same channel.
//! - [`append_signal`]: the notifiers that wake parked fetches and acks=all waits.
//! - [`log_manager`]: retention and the log cleaner in the background.
//!
//! Architecture Invariant: replication names no part above it (server, coordinators,
//! metadata publisher, lifecycle); they call it, and it reaches the controller only
//! through [`ControllerChannel`].
//!
//! [`ControllerChannel`]: alter_partition::ControllerChannel

pub mod alter_partition;
pub mod append_signal;
pub mod assignments;
pub mod fetch_session_handler;
pub mod isr;
pub mod log_manager;
pub mod replica_fetcher;
pub mod replica_manager;
#[cfg(test)]
mod replication_sim;
