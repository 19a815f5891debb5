//! The partition side of transactions (KIP-98): WriteTxnMarkers, which the transaction
//! coordinator sends to each partition leader to end a transaction there, and
//! DescribeProducers (KIP-664), which shows a partition's producers and open
//! transactions so that a hanging one can be found.
//!
//! # WriteTxnMarkers, as Kafka's `KafkaApis.handleWriteTxnMarkersRequest`
//!
//! 1. For every marker and every partition in it: a partition this broker does not host
//!    gets UNKNOWN_TOPIC_OR_PARTITION, one it hosts but does not lead
//!    NOT_LEADER_OR_FOLLOWER (the coordinator's sender looks the leader up again).
//! 2. The marker is appended as a control batch by the leader
//!    ([`crate::replication::replica_manager::ReplicaManager::append_txn_marker`]): an
//!    ISR below the topic's `min.insync.replicas` gets NOT_ENOUGH_REPLICAS, a marker from
//!    a fenced coordinator TRANSACTION_COORDINATOR_FENCED, one for an older producer
//!    epoch INVALID_PRODUCER_EPOCH.
//! 3. Every appended marker is then waited for as an acks=all produce: NONE only once the
//!    high watermark passed it, so that the coordinator completes the transaction only
//!    when no leader change can lose the marker; REQUEST_TIMED_OUT after
//!    [`MARKER_TIMEOUT`], NOT_LEADER_OR_FOLLOWER when leadership moved meanwhile.
//!    The appends of the whole request are made before the first wait, so the waits
//!    overlap.
//!
//! Errors are per marker and partition; the request itself never fails.

use std::time::Duration;

use rill_protocol::generated::describe_producers_request::DescribeProducersRequest;
use rill_protocol::generated::describe_producers_response::{
    DescribeProducersResponse, PartitionResponse, ProducerState, TopicResponse,
};
use rill_protocol::generated::write_txn_markers_request::WriteTxnMarkersRequest;
use rill_protocol::generated::write_txn_markers_response::{
    WritableTxnMarkerPartitionResult, WritableTxnMarkerResult, WritableTxnMarkerTopicResult,
    WriteTxnMarkersResponse,
};
use rill_protocol::ErrorCode;
use rill_storage::{PendingFlush, TopicPartition};

use crate::network::request_slot;
use crate::replication::replica_manager::{DeferredAppend, TxnMarker};
use crate::server::Broker;

/// How long a marker may wait for the ISR (Kafka uses `request.timeout.ms`, 30 s).
pub const MARKER_TIMEOUT: Duration = Duration::from_secs(30);

/// One appended marker still to be made durable and replicated.
struct PendingMarker {
    /// Indexes of its result in the response: marker, topic, partition.
    at: (usize, usize, usize),
    tp: TopicPartition,
    marker: TxnMarker,
    leader_epoch: i32,
    required_offset: i64,
    min_insync: usize,
    appended: DeferredAppend,
}

impl Broker {
    pub(crate) async fn handle_write_txn_markers(
        &self,
        request: WriteTxnMarkersRequest,
    ) -> WriteTxnMarkersResponse {
        let deadline = tokio::time::Instant::now() + MARKER_TIMEOUT;
        let image = self.image();
        let mut pending: Vec<PendingMarker> = Vec::new();
        let mut markers = Vec::with_capacity(request.markers.len());
        for (m, marker) in request.markers.iter().enumerate() {
            let txn_marker = TxnMarker {
                producer_id: marker.producer_id,
                producer_epoch: marker.producer_epoch,
                coordinator_epoch: marker.coordinator_epoch,
                commit: marker.transaction_result,
            };
            let mut topics = Vec::with_capacity(marker.topics.len());
            for (t, topic) in marker.topics.iter().enumerate() {
                let min_insync: usize = self
                    .topic_config_value(&image, &topic.name, "min.insync.replicas")
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(1);
                let mut partitions = Vec::with_capacity(topic.partition_indexes.len());
                for (p, &index) in topic.partition_indexes.iter().enumerate() {
                    let tp = TopicPartition {
                        topic: topic.name.clone(),
                        partition: index,
                    };
                    let outcome = if self.replicas.get(&tp).is_none() {
                        Err(ErrorCode::UNKNOWN_TOPIC_OR_PARTITION)
                    } else {
                        self.replicas
                            .append_txn_marker(&tp, &txn_marker, min_insync)
                    };
                    let error_code = match outcome {
                        Ok((appended, leader_epoch)) => {
                            pending.push(PendingMarker {
                                at: (m, t, p),
                                tp: tp.clone(),
                                marker: txn_marker,
                                leader_epoch,
                                required_offset: appended.info.last_offset + 1,
                                min_insync,
                                appended,
                            });
                            ErrorCode::NONE
                        }
                        Err(code) => {
                            tracing::debug!(%tp, error = code.name(), "transaction marker refused");
                            code
                        }
                    };
                    partitions.push(WritableTxnMarkerPartitionResult {
                        partition_index: index,
                        error_code: error_code.code(),
                        ..Default::default()
                    });
                }
                topics.push(WritableTxnMarkerTopicResult {
                    name: topic.name.clone(),
                    partitions,
                    ..Default::default()
                });
            }
            markers.push(WritableTxnMarkerResult {
                producer_id: marker.producer_id,
                topics,
                ..Default::default()
            });
        }
        let mut response = WriteTxnMarkersResponse {
            markers,
            ..Default::default()
        };
        if pending.is_empty() {
            return response;
        }
        // Waiting for fsyncs and replicas is not work: give the request slot back.
        request_slot::park();
        for mut marker in pending {
            let mut code = match marker.appended.take_flush() {
                Some(flush) => self.sync_marker(&marker, flush).await,
                None => ErrorCode::NONE,
            };
            if code == ErrorCode::NONE {
                code = self
                    .replicas
                    .wait_for_commit(
                        &marker.tp,
                        marker.leader_epoch,
                        marker.required_offset,
                        marker.min_insync,
                        deadline,
                    )
                    .await;
            }
            // A marker on a `__consumer_offsets` partition makes that producer's pending
            // transactional offsets visible (commit) or drops them (abort), once the
            // marker is replicated, as Kafka's handler calls
            // `groupCoordinator.completeTransaction` here.
            if code == ErrorCode::NONE
                && marker.tp.topic == crate::coordinator::group_coordinator::OFFSETS_TOPIC
            {
                if let Err(e) = self
                    .groups
                    .complete_transaction(
                        marker.tp.partition,
                        marker.marker.producer_id,
                        marker.marker.commit,
                    )
                    .await
                {
                    tracing::debug!(
                        error = e.name(),
                        "group coordinator stopping; offsets left pending"
                    );
                }
            }
            if code != ErrorCode::NONE {
                tracing::debug!(
                    tp = %marker.tp,
                    producer_id = marker.marker.producer_id,
                    commit = marker.marker.commit,
                    error = code.name(),
                    "transaction marker not written"
                );
            }
            let (m, t, p) = marker.at;
            if let Some(result) = response
                .markers
                .get_mut(m)
                .and_then(|r| r.topics.get_mut(t))
                .and_then(|r| r.partitions.get_mut(p))
            {
                result.error_code = code.code();
            }
        }
        response
    }

    /// Makes the fsync a marker's append owes (the topic's flush policy), off the async
    /// workers, as the produce path does.
    async fn sync_marker(&self, marker: &PendingMarker, flush: PendingFlush) -> ErrorCode {
        let synced = tokio::task::spawn_blocking(move || flush.sync()).await;
        let outcome = match synced {
            Ok(r) => self
                .replicas
                .complete_flush(&marker.tp, marker.appended.partition(), r),
            Err(_) => Err(ErrorCode::KAFKA_STORAGE_ERROR),
        };
        outcome.err().unwrap_or(ErrorCode::NONE)
    }

    /// DescribeProducers: the producers each partition's leader knows, with the first
    /// offset of each one's open transaction (-1: none).
    pub(crate) fn handle_describe_producers(
        &self,
        request: DescribeProducersRequest,
    ) -> DescribeProducersResponse {
        let topics = request
            .topics
            .into_iter()
            .map(|topic| {
                let partitions = topic
                    .partition_indexes
                    .iter()
                    .map(|&index| {
                        let tp = TopicPartition {
                            topic: topic.name.clone(),
                            partition: index,
                        };
                        let mut resp = PartitionResponse {
                            partition_index: index,
                            ..Default::default()
                        };
                        let answer = if self.replicas.get(&tp).is_none() {
                            Err(ErrorCode::UNKNOWN_TOPIC_OR_PARTITION)
                        } else {
                            self.replicas.active_producers(&tp)
                        };
                        match answer {
                            Ok(producers) => {
                                resp.active_producers = producers
                                    .into_iter()
                                    .map(|e| ProducerState {
                                        producer_id: e.producer_id,
                                        producer_epoch: i32::from(e.producer_epoch),
                                        last_sequence: e.last_seq(),
                                        last_timestamp: e.last_timestamp,
                                        coordinator_epoch: e.coordinator_epoch,
                                        current_txn_start_offset: e
                                            .current_txn_first_offset
                                            .unwrap_or(-1),
                                        ..Default::default()
                                    })
                                    .collect();
                            }
                            Err(code) => {
                                resp.error_code = code.code();
                                resp.error_message = Some(code.name().to_owned());
                            }
                        }
                        resp
                    })
                    .collect();
                TopicResponse {
                    name: topic.name,
                    partitions,
                    ..Default::default()
                }
            })
            .collect();
        DescribeProducersResponse {
            topics,
            ..Default::default()
        }
    }
}
