//! KIP-890 part 1, the partition leader's side (Kafka's `AddPartitionsToTxnManager`):
//! before a producer's first transactional batch on a partition is appended, the leader
//! asks the producer's transaction coordinator whether the partition is in the
//! producer's ongoing transaction (AddPartitionsToTxn v5, `verifyOnly`), and appends
//! only if it is. Without it a late or stray transactional produce (one retried after
//! its transaction was aborted, or for a partition the client never added) opens a
//! transaction no coordinator knows of: no marker ever ends it, and the partition's last
//! stable offset stays behind it for good ("hanging transactions").
//!
//! # Protocol
//! 1. The produce path asks the log ([`crate::replication::replica_manager::ReplicaManager::start_txn_verification`])
//!    whether the batch needs verifying (no transaction of the producer open there in
//!    its epoch) and gets a guard; then it calls [`TxnVerifier::verify`], parked (the
//!    request slot is given back), and only this request waits.
//! 2. Requests are batched per coordinator node: up to [`MAX_IN_FLIGHT_PER_NODE`]
//!    AddPartitionsToTxn in flight per node (Kafka has one; the coordinator may hold an
//!    add while the producer's previous transaction ends, and a second request keeps the
//!    other producers' checks from waiting behind it), and what arrives meanwhile goes
//!    out together in the next one, one entry per transactional id. A second entry of the same id while one waits: the one with the
//!    lower epoch gets INVALID_PRODUCER_EPOCH, and of two at the same epoch the older
//!    gets NETWORK_EXCEPTION (a client retry), as Kafka does.
//! 3. The coordinator's per-partition answers become the produce's: PRODUCER_FENCED is
//!    INVALID_PRODUCER_EPOCH (what producers expect there), TRANSACTION_ABORTABLE is
//!    INVALID_TXN_STATE for Produce before v11; a request-level error goes to every
//!    partition (CLUSTER_AUTHORIZATION_FAILED as INVALID_TXN_STATE: the client must not
//!    see it); a failed connection is NETWORK_EXCEPTION for all; UNSUPPORTED_VERSION
//!    (a coordinator without verification) lets the produce through unverified.
//!    [`produce_error`] then shapes the retriable ones for the produce response.
//! 4. The append carries the guard; a marker for the producer written meanwhile voids
//!    it, so the append is refused with INVALID_TXN_STATE (see
//!    `rill_storage::UnifiedLog::start_txn_verification`).
//!
//! A coordinator on this node is asked in-process, through the same handler a remote
//! broker's request reaches, and batched the same way.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use rill_protocol::generated::add_partitions_to_txn_request::{
    AddPartitionsToTxnRequest, AddPartitionsToTxnTopic, AddPartitionsToTxnTransaction,
};
use rill_protocol::generated::add_partitions_to_txn_response::AddPartitionsToTxnResponse;
use rill_protocol::ErrorCode;
use rill_transaction::{TransactionPartition, TRANSACTION_STATE_TOPIC};
use tokio::sync::oneshot;

use crate::network::inter_broker::{InterBrokerConnector, PeerEndpoint};
use crate::server::metadata::broker_endpoint;
use crate::server::Broker;

/// The AddPartitionsToTxn version leaders send: v5 knows TRANSACTION_ABORTABLE.
pub const VERIFY_VERSION: i16 = 5;
/// Kafka's `add.partitions.to.txn.retry.backoff.ms` and `.max.ms` defaults.
const ADD_RETRY_BACKOFF: Duration = Duration::from_millis(20);
const ADD_RETRY_MAX: Duration = Duration::from_millis(100);
/// Kafka bounds the exchange by `request.timeout.ms`.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
const MAX_RESPONSE_BYTES: usize = 1 << 20;
/// The first Produce version whose clients know TRANSACTION_ABORTABLE (Kafka's
/// `GENERIC_ERROR_SUPPORTED`).
const FIRST_ABORTABLE_PRODUCE_VERSION: i16 = 11;

/// The partitions of one verification that were not verified, with why.
pub type Unverified = BTreeMap<TransactionPartition, ErrorCode>;

/// One transaction's verification waiting for its node's next request.
struct Waiter {
    txn: AddPartitionsToTxnTransaction,
    reply: oneshot::Sender<Unverified>,
}

#[derive(Default)]
struct NodeQueue {
    /// Requests to the node that are out; at the limit, whatever arrives waits for the
    /// next.
    in_flight: usize,
    waiting: Vec<Waiter>,
}

/// How many verification requests a leader has out to one coordinator node at once.
const MAX_IN_FLIGHT_PER_NODE: usize = 2;

/// Where a coordinator node is reached.
#[derive(Clone)]
enum Route {
    Local,
    Remote(PeerEndpoint),
}

/// The leader's verifier, shared by every produce request of the broker.
pub struct TxnVerifier {
    broker: OnceLock<Weak<Broker>>,
    connector: Arc<InterBrokerConnector>,
    queues: Mutex<HashMap<i32, NodeQueue>>,
}

fn all_of(txn: &AddPartitionsToTxnTransaction, error: ErrorCode) -> Unverified {
    txn.topics
        .iter()
        .flat_map(|t| t.partitions.iter().map(|p| ((t.name.clone(), *p), error)))
        .collect()
}

impl TxnVerifier {
    pub fn new(connector: Arc<InterBrokerConnector>) -> Self {
        Self {
            broker: OnceLock::new(),
            connector,
            queues: Mutex::new(HashMap::new()),
        }
    }

    /// Given the broker once it is built (it owns this verifier).
    pub fn set(&self, broker: &Arc<Broker>) {
        let _ = self.broker.set(Arc::downgrade(broker));
    }

    fn broker(&self) -> Option<Arc<Broker>> {
        self.broker.get().and_then(Weak::upgrade)
    }

    /// Asks the coordinator of `transactional_id` whether `partitions` are in the
    /// producer's ongoing transaction; returns those that are not (or could not be
    /// verified), with the coordinator's answer as a leader passes it on (protocol
    /// step 3, before [`produce_error`]).
    pub async fn verify(
        self: &Arc<Self>,
        transactional_id: &str,
        (producer_id, producer_epoch): (i64, i16),
        partitions: &[TransactionPartition],
        produce_version: i16,
        add: bool,
    ) -> Unverified {
        let mut topics: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
        for (t, p) in partitions {
            topics.entry(t).or_default().push(*p);
        }
        let txn = AddPartitionsToTxnTransaction {
            transactional_id: transactional_id.to_string(),
            producer_id,
            producer_epoch,
            verify_only: !add,
            topics: topics
                .into_iter()
                .map(|(name, partitions)| AddPartitionsToTxnTopic {
                    name: name.to_string(),
                    partitions,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        let Some((node, route)) = self.coordinator(transactional_id) else {
            return all_of(&txn, ErrorCode::COORDINATOR_NOT_AVAILABLE);
        };
        let (reply, answer) = oneshot::channel();
        let start = {
            let mut queues = self.queues.lock().unwrap_or_else(|e| e.into_inner());
            let queue = queues.entry(node).or_default();
            if let Some(at) = queue
                .waiting
                .iter()
                .position(|w| w.txn.transactional_id == txn.transactional_id)
            {
                let existing = queue.waiting[at].txn.producer_epoch;
                if existing > producer_epoch {
                    return all_of(&txn, ErrorCode::INVALID_PRODUCER_EPOCH);
                }
                let older = queue.waiting.swap_remove(at);
                let error = if existing < producer_epoch {
                    ErrorCode::INVALID_PRODUCER_EPOCH
                } else {
                    ErrorCode::NETWORK_EXCEPTION
                };
                let _ = older.reply.send(all_of(&older.txn, error));
            }
            queue.waiting.push(Waiter { txn, reply });
            let start = queue.in_flight < MAX_IN_FLIGHT_PER_NODE;
            if start {
                queue.in_flight += 1;
            }
            start
        };
        if start {
            let verifier = self.clone();
            tokio::spawn(async move { verifier.drain(node, route).await });
        }
        let unverified = answer
            .await
            .unwrap_or_else(|_| all_of_partitions(partitions, ErrorCode::NETWORK_EXCEPTION));
        unverified
            .into_iter()
            .map(|(tp, e)| {
                let e = if e == ErrorCode::TRANSACTION_ABORTABLE
                    && produce_version < FIRST_ABORTABLE_PRODUCE_VERSION
                {
                    ErrorCode::INVALID_TXN_STATE
                } else {
                    e
                };
                (tp, e)
            })
            .collect()
    }

    /// KIP-890 part 2: adds `partitions` to the producer's transaction (AddPartitionsToTxn
    /// without `verifyOnly`), which starts the transaction if none runs. The
    /// CONCURRENT_TRANSACTIONS a coordinator answers while the producer's previous
    /// transaction is still writing its markers is common right after a commit, so it is
    /// retried here (every `add.partitions.to.txn.retry.backoff.ms`, for at most
    /// `add.partitions.to.txn.retry.backoff.max.ms`, Kafka's 20 and 100 ms) rather than
    /// by the producer, whose retry of a whole produce costs more.
    pub async fn add_retrying(
        self: &Arc<Self>,
        transactional_id: &str,
        producer: (i64, i16),
        mut partitions: Vec<TransactionPartition>,
        produce_version: i16,
    ) -> Unverified {
        let started = tokio::time::Instant::now();
        loop {
            let mut unverified = self
                .verify(
                    transactional_id,
                    producer,
                    &partitions,
                    produce_version,
                    true,
                )
                .await;
            let concurrent = unverified
                .values()
                .any(|e| *e == ErrorCode::CONCURRENT_TRANSACTIONS);
            if !concurrent || started.elapsed() >= ADD_RETRY_MAX {
                return unverified;
            }
            tokio::time::sleep(ADD_RETRY_BACKOFF).await;
            // Only what was refused for now is asked again; the rest stands.
            partitions = unverified
                .iter()
                .filter(|(_, e)| **e == ErrorCode::CONCURRENT_TRANSACTIONS)
                .map(|(tp, _)| tp.clone())
                .collect();
            unverified.retain(|_, e| *e != ErrorCode::CONCURRENT_TRANSACTIONS);
            if !unverified.is_empty() {
                return unverified;
            }
        }
    }

    /// The leader of the id's `__transaction_state` partition and how to reach it.
    fn coordinator(&self, transactional_id: &str) -> Option<(i32, Route)> {
        let broker = self.broker()?;
        let image = broker.image();
        let p =
            rill_protocol::partition_for(transactional_id, broker.transaction_state_partitions());
        let leader = image
            .partition(TRANSACTION_STATE_TOPIC, p)
            .map(|p| p.leader)
            .filter(|l| *l >= 0)?;
        if leader == broker.node_id {
            return Some((leader, Route::Local));
        }
        let (host, port) = broker_endpoint(&image, leader, &broker.inter_broker_listener)?;
        PeerEndpoint::resolve(host, port).map(|addr| (leader, Route::Remote(addr)))
    }

    /// Sends the node's waiting verifications, one request at a time, until none wait
    /// (one of the node's requests in flight).
    async fn drain(self: Arc<Self>, node: i32, route: Route) {
        loop {
            let batch = {
                let mut queues = self.queues.lock().unwrap_or_else(|e| e.into_inner());
                let Some(queue) = queues.get_mut(&node) else {
                    return;
                };
                if queue.waiting.is_empty() {
                    queue.in_flight = queue.in_flight.saturating_sub(1);
                    if queue.in_flight == 0 {
                        queues.remove(&node);
                    }
                    return;
                }
                std::mem::take(&mut queue.waiting)
            };
            let request = AddPartitionsToTxnRequest {
                transactions: batch.iter().map(|w| w.txn.clone()).collect(),
                ..Default::default()
            };
            let answered = self.send(&route, &request).await;
            for w in batch {
                let unverified = match &answered {
                    Ok(response) => unverified_of(&w.txn, response),
                    Err(error) => all_of(&w.txn, *error),
                };
                let _ = w.reply.send(unverified);
            }
        }
    }

    async fn send(
        &self,
        route: &Route,
        request: &AddPartitionsToTxnRequest,
    ) -> Result<AddPartitionsToTxnResponse, ErrorCode> {
        let broker = self.broker().ok_or(ErrorCode::NETWORK_EXCEPTION)?;
        match route {
            Route::Local => Ok(broker
                .handle_add_partitions_to_txn(request.clone(), VERIFY_VERSION)
                .await),
            Route::Remote(addr) => {
                let client_id = format!("rill-txn-verifier-{}", broker.node_id);
                drop(broker);
                self.connector
                    .call(
                        addr,
                        &client_id,
                        request,
                        VERIFY_VERSION,
                        (REQUEST_TIMEOUT, MAX_RESPONSE_BYTES),
                    )
                    .await
                    .map_err(|e| {
                        tracing::warn!(%addr, error = %e, "transaction verification failed");
                        ErrorCode::NETWORK_EXCEPTION
                    })
            }
        }
    }
}

fn all_of_partitions(partitions: &[TransactionPartition], error: ErrorCode) -> Unverified {
    partitions.iter().map(|p| (p.clone(), error)).collect()
}

/// Protocol step 3 for one transaction of a coordinator's answer.
fn unverified_of(
    txn: &AddPartitionsToTxnTransaction,
    response: &AddPartitionsToTxnResponse,
) -> Unverified {
    match ErrorCode::from_code(response.error_code) {
        ErrorCode::NONE => {}
        // A coordinator that cannot verify: the produce goes on as before KIP-890.
        ErrorCode::UNSUPPORTED_VERSION => return Unverified::new(),
        ErrorCode::CLUSTER_AUTHORIZATION_FAILED => {
            return all_of(txn, ErrorCode::INVALID_TXN_STATE)
        }
        e => return all_of(txn, e),
    }
    let Some(result) = response
        .results_by_transaction
        .iter()
        .find(|r| r.transactional_id == txn.transactional_id)
    else {
        // Not answered: asked again by the client's retry.
        return all_of(txn, ErrorCode::NETWORK_EXCEPTION);
    };
    let mut answers: HashMap<(&str, i32), i16> = HashMap::new();
    for t in &result.topic_results {
        for p in &t.results_by_partition {
            answers.insert((t.name.as_str(), p.partition_index), p.partition_error_code);
        }
    }
    let mut unverified = Unverified::new();
    for t in &txn.topics {
        for p in &t.partitions {
            let error = match answers.get(&(t.name.as_str(), *p)) {
                Some(code) => ErrorCode::from_code(*code),
                None => ErrorCode::NETWORK_EXCEPTION,
            };
            let error = if error == ErrorCode::PRODUCER_FENCED {
                ErrorCode::INVALID_PRODUCER_EPOCH
            } else {
                error
            };
            if error != ErrorCode::NONE {
                unverified.insert((t.name.clone(), *p), error);
            }
        }
    }
    unverified
}

/// A verification's failure as the produce response carries it (Kafka's
/// `ReplicaManager`): the coordinator's retriable errors, which older clients would not
/// retry on a produce, become NOT_ENOUGH_REPLICAS (retried, and no metadata refresh);
/// CONCURRENT_TRANSACTIONS too for transaction version 1 clients; a version 2 client
/// (`tv2`) gets CONCURRENT_TRANSACTIONS as it is, which it retries, as Kafka does.
pub fn produce_error(error: ErrorCode, tv2: bool) -> (ErrorCode, Option<String>) {
    match error {
        ErrorCode::CONCURRENT_TRANSACTIONS if tv2 => (error, None),
        ErrorCode::INVALID_TXN_STATE => (
            error,
            Some("Partition was not added to the transaction".to_string()),
        ),
        ErrorCode::NETWORK_EXCEPTION
        | ErrorCode::COORDINATOR_LOAD_IN_PROGRESS
        | ErrorCode::COORDINATOR_NOT_AVAILABLE
        | ErrorCode::NOT_COORDINATOR
        | ErrorCode::CONCURRENT_TRANSACTIONS => (
            ErrorCode::NOT_ENOUGH_REPLICAS,
            Some(format!(
                "Unable to verify the partition has been added to the transaction. Underlying error: {}",
                error.name()
            )),
        ),
        e => (e, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rill_protocol::generated::add_partitions_to_txn_response::{
        AddPartitionsToTxnPartitionResult, AddPartitionsToTxnResult, AddPartitionsToTxnTopicResult,
    };

    fn txn(id: &str, parts: &[(&str, i32)]) -> AddPartitionsToTxnTransaction {
        let mut topics: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
        for (t, p) in parts {
            topics.entry(t).or_default().push(*p);
        }
        AddPartitionsToTxnTransaction {
            transactional_id: id.into(),
            producer_id: 7,
            producer_epoch: 1,
            verify_only: true,
            topics: topics
                .into_iter()
                .map(|(name, partitions)| AddPartitionsToTxnTopic {
                    name: name.into(),
                    partitions,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    fn answer(id: &str, results: &[(&str, i32, ErrorCode)]) -> AddPartitionsToTxnResponse {
        AddPartitionsToTxnResponse {
            results_by_transaction: vec![AddPartitionsToTxnResult {
                transactional_id: id.into(),
                topic_results: results
                    .iter()
                    .map(|(t, p, e)| AddPartitionsToTxnTopicResult {
                        name: (*t).into(),
                        results_by_partition: vec![AddPartitionsToTxnPartitionResult {
                            partition_index: *p,
                            partition_error_code: e.code(),
                            ..Default::default()
                        }],
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn the_coordinators_answers_become_the_leaders() {
        let t = txn("a", &[("x", 0), ("x", 1), ("y", 0)]);
        let r = answer(
            "a",
            &[
                ("x", 0, ErrorCode::NONE),
                ("x", 1, ErrorCode::PRODUCER_FENCED),
                ("y", 0, ErrorCode::TRANSACTION_ABORTABLE),
            ],
        );
        let u = unverified_of(&t, &r);
        assert_eq!(u.len(), 2);
        assert_eq!(u[&("x".into(), 1)], ErrorCode::INVALID_PRODUCER_EPOCH);
        assert_eq!(u[&("y".into(), 0)], ErrorCode::TRANSACTION_ABORTABLE);
    }

    #[test]
    fn request_level_errors_and_missing_answers() {
        let t = txn("a", &[("x", 0)]);
        let mut r = answer("a", &[]);
        assert_eq!(
            unverified_of(&t, &r)[&("x".into(), 0)],
            ErrorCode::NETWORK_EXCEPTION
        );
        r.error_code = ErrorCode::CLUSTER_AUTHORIZATION_FAILED.code();
        assert_eq!(
            unverified_of(&t, &r)[&("x".into(), 0)],
            ErrorCode::INVALID_TXN_STATE
        );
        r.error_code = ErrorCode::UNSUPPORTED_VERSION.code();
        assert!(unverified_of(&t, &r).is_empty());
        let other = answer("b", &[("x", 0, ErrorCode::NONE)]);
        assert_eq!(
            unverified_of(&t, &other)[&("x".into(), 0)],
            ErrorCode::NETWORK_EXCEPTION
        );
    }

    #[test]
    fn retriable_coordinator_errors_are_retried_produces() {
        for e in [
            ErrorCode::NETWORK_EXCEPTION,
            ErrorCode::COORDINATOR_LOAD_IN_PROGRESS,
            ErrorCode::COORDINATOR_NOT_AVAILABLE,
            ErrorCode::NOT_COORDINATOR,
            ErrorCode::CONCURRENT_TRANSACTIONS,
        ] {
            assert_eq!(
                produce_error(e, false).0,
                ErrorCode::NOT_ENOUGH_REPLICAS,
                "{e:?}"
            );
        }
        // A transaction version 2 producer retries CONCURRENT_TRANSACTIONS itself.
        assert_eq!(
            produce_error(ErrorCode::CONCURRENT_TRANSACTIONS, true).0,
            ErrorCode::CONCURRENT_TRANSACTIONS
        );
        assert_eq!(
            produce_error(ErrorCode::COORDINATOR_NOT_AVAILABLE, true).0,
            ErrorCode::NOT_ENOUGH_REPLICAS
        );
        for tv2 in [false, true] {
            assert_eq!(
                produce_error(ErrorCode::INVALID_TXN_STATE, tv2).0,
                ErrorCode::INVALID_TXN_STATE
            );
            assert_eq!(
                produce_error(ErrorCode::INVALID_PRODUCER_EPOCH, tv2).0,
                ErrorCode::INVALID_PRODUCER_EPOCH
            );
        }
    }
}
