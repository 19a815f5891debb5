//! Transactions on the wire (KIP-98, KIP-664): FindCoordinator's TRANSACTION key type,
//! InitProducerId with a transactional id, AddPartitionsToTxn (v0-3 from clients, v4+
//! batched from brokers, with `verifyOnly`), AddOffsetsToTxn, EndTxn,
//! DescribeTransactions and ListTransactions.
//!
//! Each handler turns the versioned wire request into `rill-transaction`'s plain request,
//! asks the transaction coordinator's task, and shapes the answer for the request's
//! version: PRODUCER_FENCED is INVALID_PRODUCER_EPOCH for versions older than the one that
//! introduced it, as Kafka does.

use rill_metadata::CreatableTopic;
use rill_protocol::generated::{
    add_offsets_to_txn_request, add_offsets_to_txn_response, add_partitions_to_txn_request,
    add_partitions_to_txn_response, describe_transactions_request, describe_transactions_response,
    end_txn_request, end_txn_response, init_producer_id_request, init_producer_id_response,
    list_transactions_request, list_transactions_response, txn_offset_commit_request,
    txn_offset_commit_response,
};
use rill_protocol::ErrorCode;
use rill_transaction::{
    Request, Response, TransactionPartition, TransactionState, TRANSACTION_STATE_TOPIC,
};

use crate::coordinator::group_coordinator::{GroupCall, GroupReply};
use crate::coordinator::transaction_coordinator::{by_topic, TxnCall, TxnReply};
use crate::coordinator::transaction_marker::{Leader, PartitionLeaders};
use crate::server::metadata::broker_endpoint;
use crate::server::Broker;

/// The coordinator answered with something other than what was asked: a bug, reported as
/// an error to the one client rather than a panic.
fn mismatched() -> ErrorCode {
    tracing::error!("transaction coordinator answered with the wrong response type");
    ErrorCode::UNKNOWN_SERVER_ERROR
}

/// PRODUCER_FENCED exists from these versions on; older clients get
/// INVALID_PRODUCER_EPOCH (Kafka's `maybeRemapProducerFenced`).
fn fenced_for(error: ErrorCode, version: i16, first_version: i16) -> ErrorCode {
    if error == ErrorCode::PRODUCER_FENCED && version < first_version {
        ErrorCode::INVALID_PRODUCER_EPOCH
    } else {
        error
    }
}

/// TRANSACTION_ABORTABLE exists for AddPartitionsToTxn from v5 on (KIP-890); a v4
/// verification is answered INVALID_TXN_STATE, what its leaders expect.
fn abortable_for(error: ErrorCode, version: i16) -> ErrorCode {
    if error == ErrorCode::TRANSACTION_ABORTABLE && version < 5 {
        ErrorCode::INVALID_TXN_STATE
    } else {
        error
    }
}

/// TxnOffsetCommit refused as a whole: `error` for every partition.
fn txn_offset_commit_error(
    request: &txn_offset_commit_request::TxnOffsetCommitRequest,
    error: ErrorCode,
) -> txn_offset_commit_response::TxnOffsetCommitResponse {
    use txn_offset_commit_response as resp;
    resp::TxnOffsetCommitResponse {
        topics: request
            .topics
            .iter()
            .map(|t| resp::TxnOffsetCommitResponseTopic {
                name: t.name.clone(),
                partitions: t
                    .partitions
                    .iter()
                    .map(|p| resp::TxnOffsetCommitResponsePartition {
                        partition_index: p.partition_index,
                        error_code: error.code(),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

/// The coordinator's answer to `request` as a response, whatever came back.
fn txn_response(request: &Request, reply: Result<TxnReply, ErrorCode>) -> Response {
    match reply {
        Ok(TxnReply::Response(r)) => r,
        Ok(_) => Response::error(request, mismatched()),
        Err(code) => Response::error(request, code),
    }
}

impl Broker {
    async fn txn_call(&self, call: TxnCall) -> Result<TxnReply, ErrorCode> {
        self.transactions.call(call).await
    }

    async fn txn_request(&self, request: Request) -> Response {
        let reply = self.txn_call(TxnCall::Request(request.clone())).await;
        txn_response(&request, reply)
    }

    pub(crate) fn transaction_state_partitions(&self) -> i32 {
        self.config
            .transaction_config()
            .map(|c| c.transaction_state_log_num_partitions)
            .unwrap_or(50)
    }

    /// The coordinator of a transactional id: the leader of its `__transaction_state`
    /// partition, creating the topic on first use.
    pub(crate) async fn transaction_coordinator_node(
        &self,
        transactional_id: &str,
        listener: &str,
    ) -> Result<(i32, String, i32), ErrorCode> {
        let partitions = self.transaction_state_partitions();
        if self.image().topic(TRANSACTION_STATE_TOPIC).is_none() {
            self.ensure_transaction_state_topic(partitions).await?;
        }
        let image = self.image();
        let p = rill_protocol::partition_for(transactional_id, partitions);
        let leader = image
            .partition(TRANSACTION_STATE_TOPIC, p)
            .map(|p| p.leader)
            .filter(|l| *l >= 0 && (*l != self.node_id || self.replicas.lease_held()))
            .ok_or(ErrorCode::COORDINATOR_NOT_AVAILABLE)?;
        let (host, port) = broker_endpoint(&image, leader, listener)
            .ok_or(ErrorCode::COORDINATOR_NOT_AVAILABLE)?;
        Ok((leader, host, port))
    }

    /// Creates `__transaction_state`: compacted, `transaction.state.log.num.partitions`
    /// partitions of `transaction.state.log.replication.factor` replicas, with
    /// `min.insync.replicas` = `transaction.state.log.min.isr`.
    async fn ensure_transaction_state_topic(&self, partitions: i32) -> Result<(), ErrorCode> {
        let get = |key: &str, default: &str| {
            self.config
                .get(key)
                .map(|v| v.trim().to_string())
                .unwrap_or_else(|| default.to_string())
        };
        let rf = self.internal_topic_replication_factor("transaction.state.log.replication.factor");
        // Unset, Kafka's min ISR of 2, but never above the replicas the topic gets, which
        // would refuse every write of a topic capped at one replica.
        let min_isr = if self.config.is_set("transaction.state.log.min.isr") {
            get("transaction.state.log.min.isr", "2")
        } else {
            rf.min(2).to_string()
        };
        let segment_bytes = get("transaction.state.log.segment.bytes", "104857600");
        let mut topic = CreatableTopic::new(TRANSACTION_STATE_TOPIC, partitions, rf);
        topic.configs = [
            ("cleanup.policy", "compact".to_string()),
            ("compression.type", "uncompressed".to_string()),
            ("min.insync.replicas", min_isr),
            ("segment.bytes", segment_bytes),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), Some(v)))
        .collect();
        self.create_internal_topic(topic).await
    }

    /// InitProducerId with a transactional id: a new producer id at epoch 0, or an epoch
    /// bump that fences the id's older producers.
    pub(crate) async fn handle_init_producer_id_transactional(
        &self,
        request: init_producer_id_request::InitProducerIdRequest,
        transactional_id: String,
        version: i16,
    ) -> init_producer_id_response::InitProducerIdResponse {
        // The coordinator needs a fresh producer id only for a new transactional id or an
        // exhausted epoch; it is taken beforehand so that the state machine stays pure.
        let new_producer_id = self.next_producer_id().await.unwrap_or(-1);
        let response = self
            .txn_request(Request::InitProducerId {
                transactional_id,
                transaction_timeout_ms: request.transaction_timeout_ms,
                producer_id: request.producer_id,
                producer_epoch: request.producer_epoch,
                new_producer_id,
            })
            .await;
        let (error, producer_id, producer_epoch) = match response {
            Response::InitProducerId {
                error,
                producer_id,
                producer_epoch,
            } => (error, producer_id, producer_epoch),
            _ => (mismatched(), -1, -1),
        };
        init_producer_id_response::InitProducerIdResponse {
            error_code: fenced_for(error, version, 4).code(),
            producer_id,
            producer_epoch,
            ..Default::default()
        }
    }

    pub(crate) async fn handle_add_partitions_to_txn(
        &self,
        request: add_partitions_to_txn_request::AddPartitionsToTxnRequest,
        version: i16,
    ) -> add_partitions_to_txn_response::AddPartitionsToTxnResponse {
        use add_partitions_to_txn_response as resp;
        let partitions_of =
            |topics: &[add_partitions_to_txn_request::AddPartitionsToTxnTopic]| {
                topics
                    .iter()
                    .flat_map(|t| t.partitions.iter().map(|p| (t.name.clone(), *p)))
                    .collect::<Vec<TransactionPartition>>()
            };
        let topic_results = |results: Vec<(TransactionPartition, ErrorCode)>| {
            let mut by_topic: std::collections::BTreeMap<
                String,
                Vec<resp::AddPartitionsToTxnPartitionResult>,
            > = std::collections::BTreeMap::new();
            for ((topic, partition), error) in results {
                by_topic
                    .entry(topic)
                    .or_default()
                    .push(resp::AddPartitionsToTxnPartitionResult {
                        partition_index: partition,
                        partition_error_code: abortable_for(fenced_for(error, version, 2), version)
                            .code(),
                        ..Default::default()
                    });
            }
            by_topic
                .into_iter()
                .map(
                    |(name, results_by_partition)| resp::AddPartitionsToTxnTopicResult {
                        name,
                        results_by_partition,
                        ..Default::default()
                    },
                )
                .collect::<Vec<_>>()
        };
        let added = |response: Response, partitions: &[TransactionPartition]| match response {
            Response::AddPartitionsToTxn { results } => results,
            _ => partitions
                .iter()
                .map(|p| (p.clone(), mismatched()))
                .collect(),
        };
        if version <= 3 {
            let partitions = partitions_of(&request.v3_and_below_topics);
            let response = self
                .txn_request(Request::AddPartitionsToTxn {
                    transactional_id: request.v3_and_below_transactional_id,
                    producer_id: request.v3_and_below_producer_id,
                    producer_epoch: request.v3_and_below_producer_epoch,
                    partitions: partitions.clone(),
                    verify_only: false,
                    client_transaction_version: 0,
                })
                .await;
            return resp::AddPartitionsToTxnResponse {
                results_by_topic_v3_and_below: topic_results(added(response, &partitions)),
                ..Default::default()
            };
        }
        // Every transaction of the batch goes to the coordinator before any answer is
        // awaited: it may hold one whose previous transaction is still ending.
        let mut submitted = Vec::with_capacity(request.transactions.len());
        for t in request.transactions {
            let partitions = partitions_of(&t.topics);
            let request = Request::AddPartitionsToTxn {
                transactional_id: t.transactional_id.clone(),
                producer_id: t.producer_id,
                producer_epoch: t.producer_epoch,
                partitions: partitions.clone(),
                verify_only: t.verify_only,
                // Kafka's `transactionVersionForAddPartitionsToTxn`: a broker's add
                // (v4+) is for a transaction version 2 producer.
                client_transaction_version: if t.verify_only { 0 } else { 2 },
            };
            let reply = self
                .transactions
                .submit(TxnCall::Request(request.clone()))
                .await;
            submitted.push((t, partitions, request, reply));
        }
        if !submitted.is_empty() {
            crate::network::request_slot::park();
        }
        let mut results_by_transaction = Vec::with_capacity(submitted.len());
        for (t, partitions, request, reply) in submitted {
            let reply = match reply {
                Ok(rx) => rx.await.map_err(|_| ErrorCode::COORDINATOR_NOT_AVAILABLE),
                Err(e) => Err(e),
            };
            let response = txn_response(&request, reply);
            results_by_transaction.push(resp::AddPartitionsToTxnResult {
                transactional_id: t.transactional_id,
                topic_results: topic_results(added(response, &partitions)),
                ..Default::default()
            });
        }
        resp::AddPartitionsToTxnResponse {
            results_by_transaction,
            ..Default::default()
        }
    }

    pub(crate) async fn handle_add_offsets_to_txn(
        &self,
        request: add_offsets_to_txn_request::AddOffsetsToTxnRequest,
        version: i16,
    ) -> add_offsets_to_txn_response::AddOffsetsToTxnResponse {
        let offsets_partitions = self
            .config
            .group_config()
            .map(|c| c.offsets_topic_num_partitions)
            .unwrap_or(50);
        let response = self
            .txn_request(Request::AddOffsetsToTxn {
                transactional_id: request.transactional_id,
                producer_id: request.producer_id,
                producer_epoch: request.producer_epoch,
                offsets_partition: rill_protocol::partition_for(
                    &request.group_id,
                    offsets_partitions,
                ),
            })
            .await;
        let error = match response {
            Response::AddOffsetsToTxn { error } => error,
            _ => mismatched(),
        };
        add_offsets_to_txn_response::AddOffsetsToTxnResponse {
            error_code: fenced_for(error, version, 2).code(),
            ..Default::default()
        }
    }

    pub(crate) async fn handle_end_txn(
        &self,
        request: end_txn_request::EndTxnRequest,
        version: i16,
    ) -> end_txn_response::EndTxnResponse {
        // v5+ is transaction version 2: the epoch is bumped, and the bump from the last
        // epoch needs a producer id to move to, taken beforehand (as for InitProducerId)
        // only when the producer is that close to the end.
        let tv2 = version >= 5;
        let new_producer_id = if tv2 && request.producer_epoch >= i16::MAX - 1 {
            self.next_producer_id().await.unwrap_or(-1)
        } else {
            -1
        };
        let response = self
            .txn_request(Request::EndTxn {
                transactional_id: request.transactional_id,
                producer_id: request.producer_id,
                producer_epoch: request.producer_epoch,
                commit: request.committed,
                client_transaction_version: if tv2 { 2 } else { 0 },
                new_producer_id,
            })
            .await;
        let (error, producer_id, producer_epoch) = match response {
            Response::EndTxn {
                error,
                producer_id,
                producer_epoch,
            } => (error, producer_id, producer_epoch),
            _ => (mismatched(), -1, -1),
        };
        end_txn_response::EndTxnResponse {
            error_code: fenced_for(error, version, 2).code(),
            producer_id,
            producer_epoch,
            ..Default::default()
        }
    }

    /// TxnOffsetCommit, sent to the group's coordinator: the offsets are written in the
    /// producer's transaction and become the group's only when its COMMIT marker lands
    /// on the group's `__consumer_offsets` partition.
    pub(crate) async fn handle_txn_offset_commit(
        &self,
        request: txn_offset_commit_request::TxnOffsetCommitRequest,
        version: i16,
    ) -> txn_offset_commit_response::TxnOffsetCommitResponse {
        use txn_offset_commit_response as resp;
        // v5+ is transaction version 2: the client sent no AddOffsetsToTxn, so the
        // group's offsets partition is added to its transaction here, before the offsets
        // are written (Kafka's group coordinator does so through the same manager as a
        // produce).
        if version >= 5 {
            let offsets_partitions = self
                .config
                .group_config()
                .map(|c| c.offsets_topic_num_partitions)
                .unwrap_or(50);
            let partition = (
                rill_transaction::CONSUMER_OFFSETS_TOPIC.to_string(),
                rill_protocol::partition_for(&request.group_id, offsets_partitions),
            );
            let refused = self
                .txn_verifier
                .add_retrying(
                    &request.transactional_id,
                    (request.producer_id, request.producer_epoch),
                    vec![partition],
                    i16::MAX,
                )
                .await;
            if let Some(error) = refused.into_values().next() {
                return txn_offset_commit_error(&request, error);
            }
        }
        let commit = rill_group::OffsetCommitRequest {
            group_id: request.group_id.clone(),
            generation_id_or_member_epoch: request.generation_id,
            member_id: request.member_id.clone(),
            group_instance_id: request.group_instance_id.clone(),
            retention_time_ms: -1,
            topics: request
                .topics
                .iter()
                .map(|t| rill_group::OffsetCommitRequestTopic {
                    name: t.name.clone(),
                    partitions: t
                        .partitions
                        .iter()
                        .map(|p| rill_group::OffsetCommitRequestPartition {
                            partition_index: p.partition_index,
                            committed_offset: p.committed_offset,
                            committed_leader_epoch: p.committed_leader_epoch,
                            committed_metadata: p.committed_metadata.clone(),
                        })
                        .collect(),
                })
                .collect(),
            api_version: version,
        };
        let call = GroupCall::TxnOffsetCommit(rill_group::TxnOffsetCommitRequest {
            producer_id: request.producer_id,
            producer_epoch: request.producer_epoch,
            commit,
        });
        let answered = match self.groups.call(call).await {
            Ok(GroupReply::Response(rill_group::Response::OffsetCommit(r))) => Ok(r),
            Ok(_) => Err(mismatched()),
            Err(code) => Err(code),
        };
        let topics = match answered {
            Ok(r) => r
                .topics
                .into_iter()
                .map(|t| resp::TxnOffsetCommitResponseTopic {
                    name: t.name,
                    partitions: t
                        .partitions
                        .into_iter()
                        .map(|p| resp::TxnOffsetCommitResponsePartition {
                            partition_index: p.partition_index,
                            error_code: p.error_code,
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                })
                .collect(),
            Err(code) => return txn_offset_commit_error(&request, code),
        };
        resp::TxnOffsetCommitResponse {
            topics,
            ..Default::default()
        }
    }

    pub(crate) async fn handle_describe_transactions(
        &self,
        request: describe_transactions_request::DescribeTransactionsRequest,
    ) -> describe_transactions_response::DescribeTransactionsResponse {
        use describe_transactions_response as resp;
        let ids = request.transactional_ids;
        let described = match self.txn_call(TxnCall::Describe(ids.clone())).await {
            Ok(TxnReply::Describe(d)) => d,
            Ok(_) => ids.into_iter().map(|id| (id, Err(mismatched()))).collect(),
            Err(code) => ids.into_iter().map(|id| (id, Err(code))).collect(),
        };
        let transaction_states = described
            .into_iter()
            .map(|(transactional_id, found)| match found {
                Ok(m) => {
                    let partitions: Vec<TransactionPartition> =
                        m.partitions.iter().cloned().collect();
                    resp::TransactionState {
                        error_code: 0,
                        transactional_id,
                        transaction_state: m.state.name().to_string(),
                        transaction_timeout_ms: m.txn_timeout_ms,
                        transaction_start_time_ms: m.txn_start_timestamp_ms,
                        producer_id: m.producer_id,
                        producer_epoch: m.producer_epoch,
                        topics: by_topic(&partitions)
                            .into_iter()
                            .map(|(topic, partitions)| resp::TopicData {
                                topic,
                                partitions,
                                ..Default::default()
                            })
                            .collect(),
                        ..Default::default()
                    }
                }
                Err(code) => resp::TransactionState {
                    error_code: code.code(),
                    transactional_id,
                    transaction_start_time_ms: -1,
                    producer_id: -1,
                    producer_epoch: -1,
                    ..Default::default()
                },
            })
            .collect();
        resp::DescribeTransactionsResponse {
            transaction_states,
            ..Default::default()
        }
    }

    pub(crate) async fn handle_list_transactions(
        &self,
        request: list_transactions_request::ListTransactionsRequest,
    ) -> list_transactions_response::ListTransactionsResponse {
        use list_transactions_response as resp;
        let mut states = Vec::new();
        let mut unknown_state_filters = Vec::new();
        for name in request.state_filters {
            match TransactionState::from_name(&name) {
                Some(s) => states.push(s),
                None => unknown_state_filters.push(name),
            }
        }
        // Only unknown states asked for: nothing can match (Kafka answers so).
        if states.is_empty() && !unknown_state_filters.is_empty() {
            return resp::ListTransactionsResponse {
                unknown_state_filters,
                ..Default::default()
            };
        }
        // Version 2 (KIP-1152): only the transactional ids the whole pattern matches (Java's
        // `Matcher.matches`); an empty pattern filters nothing.
        let pattern = match request.transactional_id_pattern.as_deref() {
            None | Some("") => None,
            Some(p) => match regex::Regex::new(&format!("^(?:{p})$")) {
                Ok(re) => Some(re),
                Err(_) => {
                    return resp::ListTransactionsResponse {
                        error_code: ErrorCode::INVALID_REGULAR_EXPRESSION.code(),
                        unknown_state_filters,
                        ..Default::default()
                    }
                }
            },
        };
        let call = TxnCall::List {
            states,
            producer_ids: request.producer_id_filters,
            min_duration_ms: request.duration_filter,
        };
        let (error, listed) = match self.txn_call(call).await {
            Ok(TxnReply::List(Ok(listed))) => (ErrorCode::NONE, listed),
            Ok(TxnReply::List(Err(code))) | Err(code) => (code, Vec::new()),
            Ok(_) => (mismatched(), Vec::new()),
        };
        resp::ListTransactionsResponse {
            error_code: error.code(),
            unknown_state_filters,
            transaction_states: listed
                .into_iter()
                .filter(|l| {
                    pattern
                        .as_ref()
                        .is_none_or(|re| re.is_match(&l.transactional_id))
                })
                .map(|l| resp::TransactionState {
                    transactional_id: l.transactional_id,
                    producer_id: l.producer_id,
                    transaction_state: l.state.name().to_string(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }
}

/// Partition leaders as the broker's published image says, for the marker sender. It is
/// made before the [`Broker`] it reads and given it once built ([`BrokerLeaders::set`]).
#[derive(Default)]
pub struct BrokerLeaders(std::sync::OnceLock<std::sync::Weak<Broker>>);

impl BrokerLeaders {
    pub fn set(&self, broker: &std::sync::Arc<Broker>) {
        let _ = self.0.set(std::sync::Arc::downgrade(broker));
    }
}

impl PartitionLeaders for BrokerLeaders {
    fn leader(&self, topic: &str, partition: i32) -> Leader {
        let Some(broker) = self.0.get().and_then(|w| w.upgrade()) else {
            return Leader::Unavailable;
        };
        let image = broker.image();
        let Some(p) = image.partition(topic, partition) else {
            return Leader::Unknown;
        };
        if p.leader < 0 {
            return Leader::Unavailable;
        }
        let addr = broker_endpoint(&image, p.leader, &broker.inter_broker_listener).and_then(
            |(host, port)| crate::network::inter_broker::PeerEndpoint::resolve(host, port),
        );
        match addr {
            Some(addr) => Leader::At(p.leader, addr),
            None => Leader::Unavailable,
        }
    }
}
