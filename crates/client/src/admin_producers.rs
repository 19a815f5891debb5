//! The admin calls on partitions' producer state (KIP-664, Kafka's
//! `Admin.describeProducers` and `Admin.abortTransaction`): what each partition leader
//! knows of the producers writing to it, and aborting a transaction the coordinator has
//! lost track of (a hanging transaction) with a marker written straight to the leader.

use rill_protocol::generated::describe_producers_request::TopicRequest;
use rill_protocol::generated::write_txn_markers_request::{
    WritableTxnMarker, WritableTxnMarkerTopic,
};
use rill_protocol::generated::{DescribeProducersRequest, WriteTxnMarkersRequest};
use rill_protocol::ErrorCode;
use std::collections::BTreeMap;

use crate::admin::Admin;
use crate::error::{Error, Result};
use crate::ops;
use crate::types::{by_topic, TopicPartition};

const DESCRIBE_PRODUCERS_VERSION: i16 = 0;
const WRITE_TXN_MARKERS_VERSION: i16 = 1;

/// One producer of a partition as its leader's `DescribeProducers` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProducerState {
    pub producer_id: i64,
    pub producer_epoch: i32,
    pub last_sequence: i32,
    /// The timestamp of the producer's last batch in the partition.
    pub last_timestamp: i64,
    /// The epoch of the transaction coordinator that wrote this producer's last marker
    /// here, or -1.
    pub coordinator_epoch: i32,
    /// The first offset of the producer's open transaction in the partition, or -1.
    pub current_txn_start_offset: i64,
}

/// The transaction [`Admin::abort_transaction`] ends: Kafka's `AbortTransactionSpec`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AbortTransactionSpec {
    pub partition: TopicPartition,
    pub producer_id: i64,
    pub producer_epoch: i16,
    /// Written into the marker; it must not be below the epoch of the producer's last
    /// marker in the partition (the leader refuses it as from a fenced coordinator).
    pub coordinator_epoch: i32,
}

impl Admin {
    /// The producers each partition's leader keeps state for, with their open
    /// transactions.
    ///
    /// ```no_run
    /// use rill_client::{Admin, ClientConfig, TopicPartition};
    ///
    /// # async fn run() -> rill_client::Result<()> {
    /// let admin = Admin::new(ClientConfig::new("127.0.0.1:9092"))?;
    /// let tp = TopicPartition::new("orders", 0);
    /// for p in &admin.describe_producers(&[tp.clone()]).await?[&tp] {
    ///     if p.current_txn_start_offset >= 0 {
    ///         println!("producer {} has a transaction open from offset {}", p.producer_id, p.current_txn_start_offset);
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn describe_producers(
        &self,
        partitions: &[TopicPartition],
    ) -> Result<BTreeMap<TopicPartition, Vec<ProducerState>>> {
        let net = self.net();
        ops::ask_leaders(
            net,
            partitions,
            "DescribeProducers",
            |leader, tps| async move {
                let topics = by_topic(&tps)
                    .into_iter()
                    .map(|(name, partition_indexes)| TopicRequest {
                        name,
                        partition_indexes,
                        ..Default::default()
                    })
                    .collect();
                let request = DescribeProducersRequest {
                    topics,
                    ..Default::default()
                };
                let response = net
                    .send_to(leader, &request, DESCRIBE_PRODUCERS_VERSION)
                    .await?;
                Ok(response
                    .topics
                    .into_iter()
                    .flat_map(|t| {
                        let name = t.name;
                        t.partitions.into_iter().map(move |p| {
                            let tp = TopicPartition::new(name.clone(), p.partition_index);
                            let code = ErrorCode::from_code(p.error_code);
                            if !code.is_ok() {
                                return (tp, Err(code));
                            }
                            let producers = p
                                .active_producers
                                .into_iter()
                                .map(|s| ProducerState {
                                    producer_id: s.producer_id,
                                    producer_epoch: s.producer_epoch,
                                    last_sequence: s.last_sequence,
                                    last_timestamp: s.last_timestamp,
                                    coordinator_epoch: s.coordinator_epoch,
                                    current_txn_start_offset: s.current_txn_start_offset,
                                })
                                .collect();
                            (tp, Ok(producers))
                        })
                    })
                    .collect())
            },
        )
        .await
    }

    /// Aborts a producer's open transaction in one partition by writing an ABORT marker
    /// there (WriteTxnMarkers to the partition's leader), as `kafka-transactions.sh abort`
    /// does for a hanging transaction. Its records become invisible to read_committed
    /// consumers and the last stable offset moves past them.
    pub async fn abort_transaction(&self, spec: &AbortTransactionSpec) -> Result<()> {
        let net = self.net();
        let tp = &spec.partition;
        let done = ops::ask_leaders(
            net,
            std::slice::from_ref(tp),
            "WriteTxnMarkers",
            |leader, _| async move {
                let request = WriteTxnMarkersRequest {
                    markers: vec![WritableTxnMarker {
                        producer_id: spec.producer_id,
                        producer_epoch: spec.producer_epoch,
                        transaction_result: false,
                        topics: vec![WritableTxnMarkerTopic {
                            name: tp.topic.clone(),
                            partition_indexes: vec![tp.partition],
                            ..Default::default()
                        }],
                        coordinator_epoch: spec.coordinator_epoch,
                        ..Default::default()
                    }],
                    ..Default::default()
                };
                let response = net
                    .send_to(leader, &request, WRITE_TXN_MARKERS_VERSION)
                    .await?;
                Ok(response
                    .markers
                    .into_iter()
                    .flat_map(|m| m.topics)
                    .flat_map(|t| {
                        let name = t.name;
                        t.partitions.into_iter().map(move |p| {
                            let code = ErrorCode::from_code(p.error_code);
                            let tp = TopicPartition::new(name.clone(), p.partition_index);
                            (tp, if code.is_ok() { Ok(()) } else { Err(code) })
                        })
                    })
                    .collect())
            },
        )
        .await?;
        if done.contains_key(tp) {
            Ok(())
        } else {
            Err(Error::kafka(
                ErrorCode::UNKNOWN_SERVER_ERROR,
                format!("WriteTxnMarkers for {tp}: no answer for the partition"),
            ))
        }
    }
}
