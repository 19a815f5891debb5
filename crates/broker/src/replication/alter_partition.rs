//! The leader's side of ISR changes (Kafka's `AlterPartitionManager`): proposals from the
//! ISR state machine go to the controller, and its answers come back to the partition.
//! A periodic pass shrinks the ISRs of the partitions this broker leads.
//!
//! Proposals are sent one at a time, in the order they were made; a transient failure
//! (the controller unreachable, an election) is retried after a pause with the proposal
//! the state machine returns, so that a change is never lost while its partition still
//! waits for it, and never sent twice concurrently.

use std::sync::Arc;
use std::time::Duration;

use rill_metadata::{
    AlterPartitionData, AlterPartitionRequest, ControllerEvent, ControllerResponse,
};
use rill_protocol::ErrorCode;
use tokio::sync::{mpsc, watch};

use crate::replication::isr::{AlterPartitionProposal, LeaderAndIsr};
use crate::replication::replica_manager::{AlterPartitionItem, ReplicaManager};

const RETRY_BACKOFF: Duration = Duration::from_millis(200);

/// How ISR changes reach the active controller (Kafka's `NodeToControllerChannelManager`),
/// owned here and implemented above by the server, so that replication names no part
/// above it.
pub trait ControllerChannel: Send + Sync + 'static {
    /// This broker's id.
    fn broker_id(&self) -> i32;
    /// This broker's epoch from its registration (-1 before it registered).
    fn broker_epoch(&self) -> i64;
    /// Sends an event to the active controller and waits until this broker has applied
    /// the records it decided on.
    fn controller_call(
        &self,
        event: ControllerEvent,
    ) -> impl std::future::Future<Output = Result<ControllerResponse, ErrorCode>> + Send;
}

/// Starts the sender of `rx`'s proposals and the periodic ISR shrink, which runs every
/// half of `replica_lag` (`replica.lag.time.max.ms`).
pub fn start<C: ControllerChannel>(
    channel: Arc<C>,
    replicas: Arc<ReplicaManager>,
    replica_lag: Duration,
    rx: mpsc::UnboundedReceiver<AlterPartitionItem>,
    shutdown: watch::Receiver<bool>,
) {
    tokio::spawn(send_loop(channel, replicas.clone(), rx, shutdown.clone()));
    tokio::spawn(shrink_loop(replicas, replica_lag, shutdown));
}

async fn shrink_loop(
    replicas: Arc<ReplicaManager>,
    lag: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    // Kafka checks at half the lag time, so a lagging follower leaves within 1.5× of it.
    let every = (lag / 2).max(Duration::from_millis(50));
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => replicas.maybe_shrink_isrs(),
            _ = shutdown.changed() => return,
        }
    }
}

async fn send_loop<C: ControllerChannel>(
    channel: Arc<C>,
    replicas: Arc<ReplicaManager>,
    mut rx: mpsc::UnboundedReceiver<AlterPartitionItem>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let item = tokio::select! {
            item = rx.recv() => match item {
                Some(item) => item,
                None => return,
            },
            _ = shutdown.changed() => return,
        };
        let (tp, topic_id, mut proposal) = item;
        loop {
            let result = send_one(channel.as_ref(), topic_id, tp.partition, &proposal).await;
            if let Err(code) = &result {
                tracing::info!(%tp, isr = ?proposal.isr(), error = code.name(), "ISR change refused");
            }
            match replicas.on_alter_partition_response(&tp, &proposal, result) {
                Some(again) => {
                    proposal = again;
                    tokio::select! {
                        _ = tokio::time::sleep(RETRY_BACKOFF) => {}
                        _ = shutdown.changed() => return,
                    }
                }
                None => break,
            }
        }
    }
}

async fn send_one<C: ControllerChannel>(
    channel: &C,
    topic_id: rill_protocol::Uuid,
    partition: i32,
    proposal: &AlterPartitionProposal,
) -> Result<LeaderAndIsr, ErrorCode> {
    let event = request(
        channel.broker_id(),
        channel.broker_epoch(),
        topic_id,
        partition,
        proposal,
    );
    let response = channel.controller_call(event).await?;
    result(response, topic_id, partition)
}

/// The controller event that proposes `proposal`.
pub fn request(
    broker_id: i32,
    broker_epoch: i64,
    topic_id: rill_protocol::Uuid,
    partition: i32,
    proposal: &AlterPartitionProposal,
) -> ControllerEvent {
    ControllerEvent::AlterPartition(AlterPartitionRequest {
        broker_id,
        broker_epoch,
        partitions: vec![AlterPartitionData {
            topic_id,
            partition_index: partition,
            leader_epoch: proposal.leader_epoch,
            partition_epoch: proposal.partition_epoch,
            new_isr: proposal
                .new_isr
                .iter()
                .map(|m| (m.broker_id, m.broker_epoch))
                .collect(),
            leader_recovery_state: 0,
        }],
    })
}

/// The controller's answer for one partition, as the ISR state machine takes it.
pub fn result(
    response: ControllerResponse,
    topic_id: rill_protocol::Uuid,
    partition: i32,
) -> Result<LeaderAndIsr, ErrorCode> {
    match response {
        ControllerResponse::AlterPartition(r) => {
            if r.error_code != ErrorCode::NONE {
                return Err(r.error_code);
            }
            let p = r
                .partitions
                .into_iter()
                .find(|p| p.topic_id == topic_id && p.partition_index == partition)
                .ok_or(ErrorCode::UNKNOWN_SERVER_ERROR)?;
            if p.error_code != ErrorCode::NONE {
                return Err(p.error_code);
            }
            Ok(LeaderAndIsr {
                leader_epoch: p.leader_epoch,
                partition_epoch: p.partition_epoch,
                isr: p.isr,
            })
        }
        _ => Err(ErrorCode::UNKNOWN_SERVER_ERROR),
    }
}
