//! Tests of the share-partition and the share coordinator with an injected clock, and a
//! seeded simulation of both together.

mod coordinator;
mod share_partition;
mod simulation;
