//! Reports where this broker placed its replicas (Kafka's `AssignmentsManager`, KIP-858):
//! each log created in a directory other than the one the metadata assigned is sent to
//! the controller as AssignReplicasToDirs, which records it in the partition.
//!
//! Placements wait in the replica manager (one per partition, the latest wins); this
//! task sends all that are waiting in one request, drops each one the controller
//! recorded (or refused for good: the partition or the replica is gone), and retries
//! the rest after a pause, so that a placement is never lost while the controller is
//! unreachable and never sent twice at once.

use std::sync::Arc;
use std::time::Duration;

use rill_metadata::{
    AssignReplicasToDirsRequest, ControllerEvent, ControllerResponse, ReplicaDirAssignment,
};
use rill_protocol::ErrorCode;
use tokio::sync::watch;

use crate::replication::alter_partition::ControllerChannel;
use crate::replication::replica_manager::ReplicaManager;

/// Pause before sending placements again after a failure, and between two requests.
const RETRY_BACKOFF: Duration = Duration::from_millis(200);
/// At most this many placements per request (a restart may place thousands).
const MAX_PER_REQUEST: usize = 1000;

pub fn start<C: ControllerChannel>(
    channel: Arc<C>,
    replicas: Arc<ReplicaManager>,
    shutdown: watch::Receiver<bool>,
) {
    tokio::spawn(send_loop(channel, replicas, shutdown));
}

async fn send_loop<C: ControllerChannel>(
    channel: Arc<C>,
    replicas: Arc<ReplicaManager>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let pending = replicas.pending_assignments();
        if pending.is_empty() || channel.broker_epoch() < 0 {
            tokio::select! {
                _ = replicas.assignments_added() => {}
                _ = tokio::time::sleep(RETRY_BACKOFF) => {}
                _ = shutdown.changed() => return,
            }
            continue;
        }
        let batch: Vec<_> = pending.into_iter().take(MAX_PER_REQUEST).collect();
        let event = ControllerEvent::AssignReplicasToDirs(AssignReplicasToDirsRequest {
            broker_id: channel.broker_id(),
            broker_epoch: channel.broker_epoch(),
            assignments: batch
                .iter()
                .map(|(tp, topic_id, dir)| ReplicaDirAssignment {
                    topic_id: *topic_id,
                    partition: tp.partition,
                    directory: *dir,
                })
                .collect(),
        });
        match channel.controller_call(event).await {
            Ok(ControllerResponse::AssignReplicasToDirs(r)) if r.error_code == ErrorCode::NONE => {
                for ((tp, _, dir), result) in batch.iter().zip(&r.results) {
                    match result.error_code {
                        ErrorCode::NONE => {
                            tracing::debug!(%tp, %dir, "replica placement recorded");
                            replicas.assignment_done(tp, *dir);
                        }
                        // The partition, or this broker's replica of it, is gone.
                        ErrorCode::UNKNOWN_TOPIC_ID
                        | ErrorCode::UNKNOWN_TOPIC_OR_PARTITION
                        | ErrorCode::NOT_LEADER_OR_FOLLOWER => {
                            tracing::debug!(%tp, error = result.error_code.name(), "replica placement not recorded");
                            replicas.assignment_done(tp, *dir);
                        }
                        code => {
                            tracing::info!(%tp, error = code.name(), "replica placement refused; retrying")
                        }
                    }
                }
            }
            Ok(other) => tracing::info!(answer = ?other, "replica placements refused; retrying"),
            Err(code) => {
                tracing::info!(error = code.name(), "replica placements not sent; retrying")
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(RETRY_BACKOFF) => {}
            _ = shutdown.changed() => return,
        }
    }
}
