//! Deterministic tests of the coordinator with an injected clock.

mod consumer;
mod harness;
mod migration;
mod offsets;
mod rebalance;
mod replay;
mod share;
mod transactional;
mod visibility;
