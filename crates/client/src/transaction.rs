//! The transactional producer's requests to its transaction coordinator (KIP-98; the
//! coordinator side of Kafka's `TransactionManager`): FindCoordinator with key type
//! TRANSACTION, InitProducerId with the transactional id, AddPartitionsToTxn and EndTxn.
//!
//! Every call goes to the coordinator of the transactional id, found once and looked up
//! again when it answers NOT_COORDINATOR or COORDINATOR_NOT_AVAILABLE or its connection
//! fails. COORDINATOR_LOAD_IN_PROGRESS and CONCURRENT_TRANSACTIONS (the previous
//! transaction's markers are still being written) are waited out. CONCURRENT_TRANSACTIONS
//! is retried after 20 ms rather than `retry.backoff.ms`, as the Java client does for
//! AddPartitionsToTxn: it clears within a marker round trip, and the next transaction waits
//! on it. Everything is bounded by `max.block.ms` in total.
//!
//! Transaction version 2 (KIP-890 part 2) is used when the coordinator says the cluster
//! finalized `transaction.version` 2 and offers EndTxn v5, as the Java client decides: the
//! producer then sends no AddPartitionsToTxn (the partition leaders add partitions on
//! Produce v12), and every EndTxn answers with the epoch (or producer id) to go on with.
//!
//! The producer's own state (which partitions are in the transaction, whether one is open)
//! lives with its accumulator in `producer.rs`; this module only speaks to the coordinator.

use std::time::{Duration, Instant};

use rill_protocol::generated::add_partitions_to_txn_request::AddPartitionsToTxnTopic;
use rill_protocol::generated::{AddPartitionsToTxnRequest, EndTxnRequest, InitProducerIdRequest};
use rill_protocol::{ErrorCode, Request};

use crate::error::{Error, Result};
use crate::network::{BrokerMetadata, NetworkClient};
use crate::ops;
use crate::types::{by_topic, TopicPartition};

/// Versions of transaction version 1: AddPartitionsToTxn v3 is the last the clients send
/// (v4 and up are the brokers' batched form), EndTxn v4 the last before version 2.
const INIT_PRODUCER_ID_VERSION: i16 = 4;
const ADD_PARTITIONS_TO_TXN_VERSION: i16 = 3;
const END_TXN_VERSION: i16 = 4;
/// EndTxn of transaction version 2: the answer carries the producer id and epoch.
pub(crate) const END_TXN_V2_VERSION: i16 = 5;
/// The feature whose level 2 makes clients use transaction version 2.
const TRANSACTION_VERSION_FEATURE: &str = "transaction.version";
/// The wait before asking again while the previous transaction completes.
const CONCURRENT_TRANSACTIONS_BACKOFF: Duration = Duration::from_millis(20);

/// A transactional id's coordinator, cached between calls.
pub(crate) struct TransactionCoordinator {
    pub(crate) transactional_id: String,
    pub(crate) timeout: Duration,
    coordinator: tokio::sync::Mutex<Option<BrokerMetadata>>,
}

impl TransactionCoordinator {
    pub(crate) fn new(transactional_id: String, timeout: Duration) -> Self {
        Self {
            transactional_id,
            timeout,
            coordinator: tokio::sync::Mutex::new(None),
        }
    }

    /// InitProducerId with the transactional id: the producer id and the new epoch, which
    /// fences every older producer of the id (and aborts a transaction one left open).
    pub(crate) async fn init_producer_id(
        &self,
        net: &NetworkClient,
        max_block: Duration,
    ) -> Result<(i64, i16)> {
        let request = InitProducerIdRequest {
            transactional_id: Some(self.transactional_id.clone()),
            transaction_timeout_ms: i32::try_from(self.timeout.as_millis()).unwrap_or(i32::MAX),
            producer_id: -1,
            producer_epoch: -1,
            ..Default::default()
        };
        let response = self
            .call(
                net,
                &request,
                INIT_PRODUCER_ID_VERSION,
                max_block,
                "InitProducerId",
                |r| r.error_code,
            )
            .await?;
        Ok((response.producer_id, response.producer_epoch))
    }

    /// Whether the producer's transactions run at transaction version 2: the
    /// coordinator's cluster finalized it and the coordinator speaks EndTxn v5.
    pub(crate) async fn transaction_version_2(
        &self,
        net: &NetworkClient,
        max_block: Duration,
    ) -> Result<bool> {
        let deadline = Instant::now() + max_block;
        loop {
            let found = async {
                let coordinator = self.coordinator(net).await?;
                let conn = net.connection(&coordinator.addr()).await?;
                Ok::<_, Error>(
                    conn.finalized_feature(TRANSACTION_VERSION_FEATURE) >= 2
                        && conn.version(rill_protocol::ApiKey::EndTxn, END_TXN_V2_VERSION)
                            == Ok(END_TXN_V2_VERSION),
                )
            }
            .await;
            match found {
                Ok(tv2) => return Ok(tv2),
                Err(e) if e.is_retriable() && Instant::now() < deadline => {
                    *self.coordinator.lock().await = None;
                    tokio::time::sleep(CONCURRENT_TRANSACTIONS_BACKOFF).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// AddPartitionsToTxn: `partitions` join the open transaction, so that their
    /// transactional batches are accepted and the commit or abort writes their markers.
    pub(crate) async fn add_partitions(
        &self,
        net: &NetworkClient,
        max_block: Duration,
        (producer_id, producer_epoch): (i64, i16),
        partitions: &[TopicPartition],
    ) -> Result<()> {
        let topics = by_topic(partitions)
            .into_iter()
            .map(|(name, partitions)| AddPartitionsToTxnTopic {
                name,
                partitions,
                ..Default::default()
            })
            .collect();
        let request = AddPartitionsToTxnRequest {
            v3_and_below_transactional_id: self.transactional_id.clone(),
            v3_and_below_producer_id: producer_id,
            v3_and_below_producer_epoch: producer_epoch,
            v3_and_below_topics: topics,
            ..Default::default()
        };
        // The answer has a code per partition; the first that is not NONE speaks for all
        // (a refusal is of the whole request: fenced, concurrent, not coordinator).
        self.call(
            net,
            &request,
            ADD_PARTITIONS_TO_TXN_VERSION,
            max_block,
            "AddPartitionsToTxn",
            |r| {
                r.results_by_topic_v3_and_below
                    .iter()
                    .flat_map(|t| &t.results_by_partition)
                    .map(|p| p.partition_error_code)
                    .find(|c| *c != 0)
                    .unwrap_or(r.error_code)
            },
        )
        .await
        .map(|_| ())
    }

    /// EndTxn: commit or abort the open transaction. Answered once the coordinator has
    /// recorded the decision (PrepareCommit or PrepareAbort); the markers follow. At
    /// transaction version 2 (`tv2`), the producer id and epoch to go on with.
    pub(crate) async fn end_txn(
        &self,
        net: &NetworkClient,
        max_block: Duration,
        (producer_id, producer_epoch): (i64, i16),
        commit: bool,
        tv2: bool,
    ) -> Result<Option<(i64, i16)>> {
        let request = EndTxnRequest {
            transactional_id: self.transactional_id.clone(),
            producer_id,
            producer_epoch,
            committed: commit,
            ..Default::default()
        };
        let version = if tv2 {
            END_TXN_V2_VERSION
        } else {
            END_TXN_VERSION
        };
        let response = self
            .call(net, &request, version, max_block, "EndTxn", |r| {
                r.error_code
            })
            .await?;
        Ok((tv2 && response.producer_id >= 0)
            .then_some((response.producer_id, response.producer_epoch)))
    }

    /// Sends `request` to the coordinator until it is answered without a retriable error
    /// (see the module doc), or `max_block` has passed.
    async fn call<R: Request>(
        &self,
        net: &NetworkClient,
        request: &R,
        version: i16,
        max_block: Duration,
        what: &str,
        code_of: impl Fn(&R::Response) -> i16,
    ) -> Result<R::Response> {
        let deadline = Instant::now() + max_block;
        loop {
            let result = async {
                let coordinator = self.coordinator(net).await?;
                let conn = net.connection(&coordinator.addr()).await?;
                conn.send(request, version).await
            }
            .await;
            let error = match result {
                Ok(response) => {
                    let code = ErrorCode::from_code(code_of(&response));
                    if code.is_ok() {
                        return Ok(response);
                    }
                    Error::kafka(code, format!("{what} for {}", self.transactional_id))
                }
                Err(e) => e,
            };
            let backoff = match error.code() {
                Some(ErrorCode::CONCURRENT_TRANSACTIONS) => CONCURRENT_TRANSACTIONS_BACKOFF,
                Some(ErrorCode::COORDINATOR_LOAD_IN_PROGRESS) => net.config.retry_backoff,
                Some(ErrorCode::NOT_COORDINATOR | ErrorCode::COORDINATOR_NOT_AVAILABLE) | None
                    if error.is_retriable() =>
                {
                    *self.coordinator.lock().await = None;
                    net.config.retry_backoff
                }
                _ => return Err(error),
            };
            if Instant::now() + backoff > deadline {
                return Err(error);
            }
            tracing::debug!(transactional_id = %self.transactional_id, %error, "{what} retried");
            tokio::time::sleep(backoff).await;
        }
    }

    async fn coordinator(&self, net: &NetworkClient) -> Result<BrokerMetadata> {
        let mut cached = self.coordinator.lock().await;
        if let Some(c) = cached.as_ref() {
            return Ok(c.clone());
        }
        let found =
            ops::find_coordinator_of(net, &self.transactional_id, ops::COORDINATOR_TRANSACTION)
                .await?;
        *cached = Some(found.clone());
        Ok(found)
    }
}
