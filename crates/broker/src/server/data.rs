//! The data path: Produce, Fetch, ListOffsets and InitProducerId.

use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};

use rill_protocol::generated::delete_records_request::DeleteRecordsRequest;
use rill_protocol::generated::delete_records_response::{
    DeleteRecordsPartitionResult, DeleteRecordsResponse, DeleteRecordsTopicResult,
};
use rill_protocol::generated::fetch_request::{FetchRequest, FetchTopic};
use rill_protocol::generated::fetch_response::{
    AbortedTransaction, FetchResponse, FetchableTopicResponse, PartitionData,
};
use rill_protocol::generated::init_producer_id_request::InitProducerIdRequest;
use rill_protocol::generated::init_producer_id_response::InitProducerIdResponse;
use rill_protocol::generated::list_offsets_request::ListOffsetsRequest;
use rill_protocol::generated::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsResponse, ListOffsetsTopicResponse,
};
use rill_protocol::generated::produce_request::ProduceRequest;
use rill_protocol::generated::produce_response::{
    BatchIndexAndErrorMessage, PartitionProduceResponse, ProduceResponse, TopicProduceResponse,
};
use rill_protocol::generated::request_header::RequestHeader;
use rill_protocol::generated::response_header::ResponseHeader;
use rill_protocol::generated::{ApiKey, ResponseBody};
use rill_protocol::primitives::{
    put_unsigned_varint, write_array_len, write_nullable_bytes, write_string, write_tagged_count,
    Decodable, Encodable,
};
use rill_protocol::{EncodeError, ErrorCode};
use rill_storage::{
    AppendOrigin, FileRange, PendingFlush, RecordErrorKind, RecordErrors, TopicPartition,
};

use crate::coordinator::group_coordinator::OFFSETS_TOPIC;
use crate::metrics;
use crate::network::request_slot;
use crate::network::{ResponseChunk, Session};
use crate::remote_log;
use crate::replication::append_signal::AppendSignals;
use crate::replication::replica_fetcher::replica_throttled;
use crate::replication::replica_manager::{AppendRefused, DeferredAppend};
use crate::server::fetch_session::{FetchContext, FetchSessionCache};
use crate::server::quotas::{Governed, QuotaKind};
use crate::server::request_authorization::Gate;
use crate::server::{txn_verification, Broker, QuotaScope};
use rill_metadata::{AllocateProducerIdsRequest, ControllerEvent, ControllerResponse};
use rill_protocol::generated::offset_for_leader_epoch_request::OffsetForLeaderEpochRequest;
use rill_protocol::generated::offset_for_leader_epoch_response::{
    EpochEndOffset, OffsetForLeaderEpochResponse, OffsetForLeaderTopicResult,
};

/// The first Produce version of transaction version 2 clients (KIP-890 part 2): their
/// transactional batches are added to the transaction by the leader.
const TV2_PRODUCE_VERSION: i16 = 12;

/// What KIP-890's verification decided for a produce request's partitions.
#[derive(Default)]
struct ProduceVerification {
    /// The verification guard of each partition with a transactional batch (`None`: its
    /// producer's transaction is open there, nothing to verify).
    guards: std::collections::HashMap<(String, i32), Option<u64>>,
    /// The partitions refused, with the verification's error.
    unverified: txn_verification::Unverified,
}

/// ListOffsets' special timestamps.
const LATEST_TIMESTAMP: i64 = -1;
const EARLIEST_TIMESTAMP: i64 = -2;
const MAX_TIMESTAMP: i64 = -3;
const EARLIEST_LOCAL_TIMESTAMP: i64 = -4;
const LATEST_TIERED_TIMESTAMP: i64 = -5;

/// The longest a fetch may park, whatever it asks for: bounds the tasks a client can hold.
const MAX_FETCH_WAIT: Duration = Duration::from_secs(30);

/// A consumer's read that the remote tier serves (see `remote_log`): found by
/// `read_fetch` under no lock, made by `fetch_wait`, which may wait on the store.
struct RemoteRead {
    partition: remote_log::storage::RemotePartition,
    segment: rill_metadata::RemoteLogSegmentMetadata,
    next: Option<rill_metadata::RemoteLogSegmentMetadata>,
    offset: i64,
    max_bytes: usize,
    max_offset: i64,
    read_committed: bool,
    /// The whole log's start, for the response.
    log_start_offset: i64,
    /// Where the partition is in the response: (topic, partition) indexes.
    response_index: (usize, usize),
}

/// A Produce response's `record_errors` and `error_message` for records that failed their
/// checks, worded as Kafka's `LogValidator` and `processRecordErrors` word them.
fn record_errors_response(
    tp: &TopicPartition,
    refused: &RecordErrors,
) -> (Vec<BatchIndexAndErrorMessage>, String) {
    // Java's TopicPartition prints as `topic-partition`.
    let partition = format!("{}-{}", tp.topic, tp.partition);
    let listed: Vec<BatchIndexAndErrorMessage> = refused
        .errors
        .iter()
        .map(|error| BatchIndexAndErrorMessage {
            batch_index: i32::try_from(error.batch_index).unwrap_or(i32::MAX),
            batch_index_error_message: Some(match &error.kind {
                RecordErrorKind::MissingKey => format!(
                    "Compacted topic cannot accept message without key in topic partition \
                     {partition}"
                ),
                RecordErrorKind::Timestamp {
                    timestamp,
                    offset,
                    earliest,
                    latest,
                } => format!(
                    "Timestamp {timestamp} of message with offset {offset} is out of range. \
                     The timestamp should be within [{earliest}, {latest}]"
                ),
            }),
            ..Default::default()
        })
        .collect();
    let message = if refused.any_timestamp {
        "One or more records have been rejected due to invalid timestamp".to_string()
    } else {
        // Java's `RecordError.toString()` for the first three, as in a List's toString.
        let first: Vec<String> = listed
            .iter()
            .take(3)
            .map(|e| {
                format!(
                    "RecordError(batchIndex={}, message='{}')",
                    e.batch_index,
                    e.batch_index_error_message.as_deref().unwrap_or_default()
                )
            })
            .collect();
        format!(
            "One or more records have been rejected due to {} record errors in total, and \
             only showing the first three errors at most: [{}]",
            refused.total,
            first.join(", ")
        )
    };
    (listed, message)
}

/// A throttle as a response's `throttle_time_ms`.
fn throttle_ms(throttle: Duration) -> i32 {
    throttle.as_millis().min(i32::MAX as u128) as i32
}

impl Broker {
    /// Returns `None` for `acks=0`: Kafka sends no response then. With `acks=all` the
    /// answer waits (bounded by the request's timeout) until every in-sync replica has
    /// the records, i.e. the high watermark passed them. When the topic's flush policy
    /// asks for an fsync, no answer (nor the high watermark) passes the records before
    /// it is made.
    pub(crate) async fn handle_produce(
        &self,
        request: ProduceRequest,
        version: i16,
    ) -> Option<ProduceResponse> {
        let acks = request.acks;
        let acks_valid = matches!(acks, -1..=1);
        let deadline = tokio::time::Instant::now()
            + Duration::from_millis(u64::try_from(request.timeout_ms).unwrap_or(0));
        let image = self.image();
        // A transaction version 2 producer (v12+) never adds partitions itself: the
        // leader adds them, whatever `transaction.partition.verification.enable` says.
        let tv2 = version >= TV2_PRODUCE_VERSION;
        let verify = tv2
            || self
                .txn_verification
                .load(std::sync::atomic::Ordering::Relaxed);
        let verification = if acks_valid && verify {
            Some(self.verify_txn_partitions(&request, version).await)
        } else {
            None
        };
        let mut responses = Vec::with_capacity(request.topic_data.len());
        // (topic index, partition index, tp, epoch, required offset, min.insync)
        let mut waits = Vec::new();
        // (topic index, partition index, tp, the append, its fsync still to make)
        let mut flushes: Vec<(usize, usize, TopicPartition, DeferredAppend, PendingFlush)> =
            Vec::new();
        // (topic index, partition index, its topic's counters) of every append made.
        let mut appended_to: Vec<(usize, usize, metrics::TopicHandle)> = Vec::new();
        for topic in request.topic_data {
            let mut partition_responses = Vec::with_capacity(topic.partition_data.len());
            let min_insync: usize = self
                .topic_config_value(&image, &topic.name, "min.insync.replicas")
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(1);
            for p in topic.partition_data {
                let mut resp = PartitionProduceResponse {
                    index: p.index,
                    base_offset: -1,
                    log_append_time_ms: -1,
                    log_start_offset: -1,
                    ..Default::default()
                };
                let tp = TopicPartition {
                    topic: topic.name.clone(),
                    partition: p.index,
                };
                let refused_verification = verification
                    .as_ref()
                    .and_then(|v| v.unverified.get(&(tp.topic.clone(), tp.partition)));
                let guard = verification.as_ref().map(|v| {
                    v.guards
                        .get(&(tp.topic.clone(), tp.partition))
                        .copied()
                        .flatten()
                });
                let outcome = if !acks_valid {
                    Err(ErrorCode::INVALID_REQUIRED_ACKS.into())
                } else if let Some(error) = refused_verification {
                    let (code, message) = txn_verification::produce_error(*error, tv2);
                    resp.error_message = message;
                    Err(code.into())
                } else if tp.topic == OFFSETS_TOPIC {
                    // Only the group coordinator writes its topic; a client's bytes there
                    // would be replayed as group state.
                    Err(ErrorCode::INVALID_TOPIC_EXCEPTION.into())
                } else {
                    match &p.records {
                        None => Err(ErrorCode::INVALID_RECORD.into()),
                        Some(records) => {
                            self.append_checked(&tp, records, (acks, min_insync), guard)
                        }
                    }
                };
                match outcome {
                    Ok((mut appended, epoch)) => {
                        let info = &appended.info;
                        let counters = appended.partition().topic_metrics.clone();
                        if !info.duplicate {
                            let bytes = u64::try_from(info.valid_bytes).unwrap_or(0);
                            let messages = u64::try_from(info.record_count).unwrap_or(0);
                            counters.add(|t| &t.bytes_in, bytes);
                            counters.add(|t| &t.messages_in, messages);
                        }
                        appended_to.push((responses.len(), partition_responses.len(), counters));
                        resp.base_offset = info.first_offset;
                        resp.log_append_time_ms = info.log_append_time_ms;
                        resp.log_start_offset = appended.log_start_offset;
                        if acks == -1 && info.last_offset >= 0 {
                            waits.push((
                                responses.len(),
                                partition_responses.len(),
                                tp.clone(),
                                epoch,
                                info.last_offset + 1,
                                min_insync,
                            ));
                        }
                        if let Some(flush) = appended.take_flush() {
                            flushes.push((
                                responses.len(),
                                partition_responses.len(),
                                tp.clone(),
                                appended,
                                flush,
                            ));
                        }
                    }
                    Err(refused) => {
                        tracing::debug!(%tp, error = refused.code.name(), "produce refused");
                        resp.error_code = refused.code.code();
                        if let Some(record_errors) = &refused.record_errors {
                            let (listed, message) = record_errors_response(&tp, record_errors);
                            resp.record_errors = listed;
                            resp.error_message = Some(message);
                        }
                    }
                }
                partition_responses.push(resp);
            }
            responses.push(TopicProduceResponse {
                name: topic.name,
                partition_responses,
                ..Default::default()
            });
        }
        if !flushes.is_empty() {
            let failed = self.sync_appends(flushes, &mut responses).await;
            waits.retain(|w| !failed.contains(&(w.0, w.1)));
        }
        if acks == 0 {
            self.account_produce(&responses, &appended_to);
            return None;
        }
        if !waits.is_empty() {
            // Waiting for the replicas is not work: give the request slot back, and let
            // the connection append its next Produce meanwhile (the order of appends is
            // all that orders two of them).
            request_slot::settle();
        }
        for (t, p, tp, epoch, required, min_insync) in waits {
            let code = self
                .replicas
                .wait_for_commit(&tp, epoch, required, min_insync, deadline)
                .await;
            if code != ErrorCode::NONE {
                if let Some(resp) = responses
                    .get_mut(t)
                    .and_then(|r| r.partition_responses.get_mut(p))
                {
                    resp.error_code = code.code();
                }
            }
        }
        self.account_produce(&responses, &appended_to);
        Some(ProduceResponse {
            responses,
            ..Default::default()
        })
    }

    /// Kafka's produce request metrics of a final answer: one produce request per
    /// partition named, a failed one and its error code for each partition answered with
    /// an error. A partition that was appended to has its counters at hand; one that was
    /// refused before an append is looked up (an error path), and counted for all topics
    /// only when this broker does not host it, so that a client naming made-up topics
    /// cannot grow the page.
    fn account_produce(
        &self,
        responses: &[TopicProduceResponse],
        appended_to: &[(usize, usize, metrics::TopicHandle)],
    ) {
        let m = metrics::global();
        let mut appended = appended_to.iter().peekable();
        for (t, topic) in responses.iter().enumerate() {
            for (p, resp) in topic.partition_responses.iter().enumerate() {
                let counters = match appended.peek() {
                    Some((at, ap, c)) if (*at, *ap) == (t, p) => {
                        let c = c.clone();
                        appended.next();
                        Some(c)
                    }
                    _ if resp.error_code != 0 => self
                        .replicas
                        .get(&TopicPartition {
                            topic: topic.name.clone(),
                            partition: resp.index,
                        })
                        .map(|p| p.topic_metrics.clone()),
                    _ => None,
                };
                let failed = resp.error_code != 0;
                if failed {
                    m.requests.error(ApiKey::Produce as i16, resp.error_code);
                }
                match counters {
                    Some(c) => {
                        c.add(|t| &t.produce_requests, 1);
                        if failed {
                            c.add(|t| &t.failed_produce_requests, 1);
                        }
                    }
                    None => {
                        metrics::inc(&m.topics.all.produce_requests);
                        if failed {
                            metrics::inc(&m.topics.all.failed_produce_requests);
                        }
                    }
                }
            }
        }
    }

    /// Appends as leader; with acks=all, refuses first (NOT_ENOUGH_REPLICAS) when the
    /// ISR is below `min.insync.replicas`, as Kafka does, so that nothing is written
    /// that could not be acknowledged. The fsync the flush policy may ask for is left to
    /// [`Self::sync_appends`].
    ///
    /// `txn_verification` is `Some` when KIP-890's verification is on: a batch that
    /// would open a transaction must then carry its producer's verification guard.
    fn append_checked(
        &self,
        tp: &TopicPartition,
        records: &Bytes,
        (acks, min_insync): (i16, usize),
        txn_verification: Option<Option<u64>>,
    ) -> Result<(DeferredAppend, i32), AppendRefused> {
        let (isr, epoch) = self.replicas.isr_size(tp)?;
        if acks == -1 && isr < min_insync {
            return Err(ErrorCode::NOT_ENOUGH_REPLICAS.into());
        }
        let appended = self.replicas.append_deferred_verified(
            tp,
            records,
            AppendOrigin::Client,
            txn_verification,
        )?;
        Ok((appended, epoch))
    }

    /// KIP-890 part 1 for a produce request (see [`txn_verification`]): the partitions
    /// whose transactional batch opens its producer's transaction here are verified
    /// with the coordinator before anything is appended; the produce parks meanwhile.
    async fn verify_txn_partitions(
        &self,
        request: &ProduceRequest,
        version: i16,
    ) -> ProduceVerification {
        let mut verification = ProduceVerification::default();
        let mut producer = None;
        let mut to_verify = Vec::new();
        for topic in &request.topic_data {
            for p in &topic.partition_data {
                let Some((producer_id, epoch)) = p
                    .records
                    .as_deref()
                    .and_then(rill_storage::transactional_producer)
                else {
                    continue;
                };
                let key = (topic.name.clone(), p.index);
                let tp = TopicPartition {
                    topic: topic.name.clone(),
                    partition: p.index,
                };
                let guard = match self.replicas.start_txn_verification(
                    &tp,
                    (producer_id, epoch),
                    version >= TV2_PRODUCE_VERSION,
                ) {
                    Ok(guard) => guard,
                    Err(ErrorCode::INVALID_PRODUCER_EPOCH) => {
                        verification
                            .unverified
                            .insert(key, ErrorCode::INVALID_PRODUCER_EPOCH);
                        continue;
                    }
                    // A partition this broker cannot append to is refused by the append.
                    Err(_) => continue,
                };
                verification.guards.insert(key.clone(), guard);
                if guard.is_none() {
                    continue;
                }
                match producer {
                    None => producer = Some((producer_id, epoch)),
                    // Kafka refuses transactional records of two producers in one request.
                    Some(first) if first != (producer_id, epoch) => {
                        verification
                            .unverified
                            .insert(key, ErrorCode::INVALID_RECORD);
                        continue;
                    }
                    Some(_) => {}
                }
                to_verify.push(key);
            }
        }
        let (Some(producer), false) = (producer, to_verify.is_empty()) else {
            return verification;
        };
        let Some(transactional_id) = request
            .transactional_id
            .as_deref()
            .filter(|t| !t.is_empty())
        else {
            // Transactional records need their transactional id.
            for key in to_verify {
                verification
                    .unverified
                    .insert(key, ErrorCode::INVALID_TXN_STATE);
            }
            return verification;
        };
        // Waiting for the coordinator is not work: give the request slot back.
        request_slot::park();
        let unverified = if version >= TV2_PRODUCE_VERSION {
            self.txn_verifier
                .add_retrying(transactional_id, producer, to_verify, version)
                .await
        } else {
            self.txn_verifier
                .verify(transactional_id, producer, &to_verify, version, false)
                .await
        };
        verification.unverified.extend(unverified);
        verification
    }

    /// Makes the fsyncs a produce's appends owe (group commit, see
    /// `rill_storage::flush`) and records their outcome; a partition whose fsync failed
    /// gets KAFKA_STORAGE_ERROR. Returns the (topic index, partition index) of those.
    ///
    /// The fsyncs run on tokio's blocking pool (bounded, by default at 512 threads), not
    /// on an async worker: the runtime has two workers, and a worker held by an fsync
    /// could neither write the next produce requests (which would then miss this fsync
    /// and need one of their own) nor serve anything else. `block_in_place` would free
    /// the worker too but panics on a current-thread runtime, which tests use; one hop
    /// to the pool per produce request costs microseconds against the milliseconds of
    /// an fsync.
    async fn sync_appends(
        &self,
        flushes: Vec<(usize, usize, TopicPartition, DeferredAppend, PendingFlush)>,
        responses: &mut [TopicProduceResponse],
    ) -> Vec<(usize, usize)> {
        let syncs: Vec<PendingFlush> = flushes.iter().map(|f| f.4.clone()).collect();
        let synced = tokio::task::spawn_blocking(move || {
            let started = Instant::now();
            let synced = syncs.iter().map(PendingFlush::sync).collect();
            metrics::global()
                .flush
                .produce_fsync_wait
                .observe(started.elapsed());
            synced
        })
        .await
        .unwrap_or_else(|e| {
            tracing::error!(error = %e, "produce fsync task failed");
            Vec::new()
        });
        let mut synced = synced.into_iter();
        let mut failed = Vec::new();
        for (t, p, tp, appended, _) in flushes {
            let outcome = match synced.next() {
                Some(r) => self.replicas.complete_flush(&tp, appended.partition(), r),
                // The task died: whether the fsync was made is unknown, so the append
                // cannot be acknowledged.
                None => Err(ErrorCode::KAFKA_STORAGE_ERROR),
            };
            if let Err(code) = outcome {
                tracing::debug!(%tp, error = code.name(), "produce refused");
                if let Some(resp) = responses
                    .get_mut(t)
                    .and_then(|r| r.partition_responses.get_mut(p))
                {
                    resp.error_code = code.code();
                    resp.base_offset = -1;
                    resp.log_append_time_ms = -1;
                    resp.log_start_offset = -1;
                }
                failed.push((t, p));
            }
        }
        failed
    }

    pub(crate) async fn handle_fetch(
        &self,
        mut request: FetchRequest,
        version: i16,
    ) -> FetchResponse {
        let (context, asked) = self.fetch_session_context(&mut request, version);
        if let FetchContext::Error(_) = context {
            let mut response = FetchResponse::default();
            self.answer_in_session(context, asked.as_deref(), &mut response, &mut Vec::new());
            return response;
        }
        let shards = self.fetch_shards(&request, version);
        let (mut response, mut ranges) = self.fetch_wait(&request, version, false, shards).await;
        self.answer_in_session(context, asked.as_deref(), &mut response, &mut ranges);
        response
    }

    /// KIP-227, before a Fetch is read (`fetch_session`, step 1): what it is to its
    /// session, and for a full fetch the partitions it asked for (a session it opens
    /// holds them all, those the authorizer refuses too).
    fn fetch_session_context(
        &self,
        request: &mut FetchRequest,
        version: i16,
    ) -> (FetchContext, Option<Vec<FetchTopic>>) {
        if FetchSessionCache::sessionless(request, version) {
            return (FetchContext::Sessionless, None);
        }
        let follower = fetch_replica_id(request, version) >= 0;
        let context = match self.fetch_sessions.lock() {
            Ok(mut cache) => cache.new_context(request, version, follower, session_clock_ms()),
            // A panic under the lock: sessions are an optimisation, so none is used.
            Err(_) => FetchContext::Sessionless,
        };
        let asked = matches!(context, FetchContext::Full { .. }).then(|| request.topics.clone());
        (context, asked)
    }

    /// KIP-227, once a Fetch has been read (`fetch_session`, steps 2 to 4): opens the
    /// session of a full fetch, or drops from an incremental one's answer (and from
    /// `ranges`, which goes with it) the partitions with nothing new.
    fn answer_in_session(
        &self,
        context: FetchContext,
        asked: Option<&[FetchTopic]>,
        response: &mut FetchResponse,
        ranges: &mut Vec<Option<FileRange>>,
    ) {
        if context == FetchContext::Sessionless {
            response.session_id = 0;
            return;
        }
        let records: Vec<usize> = response
            .responses
            .iter()
            .flat_map(|t| &t.partitions)
            .zip(ranges.iter().chain(std::iter::repeat(&None)))
            .map(|(p, range)| match range {
                Some(r) => usize::try_from(r.len).unwrap_or(usize::MAX),
                None => p.records.as_ref().map_or(0, Bytes::len),
            })
            .collect();
        let keep = match self.fetch_sessions.lock() {
            Ok(mut cache) => cache.answer(
                context,
                asked.unwrap_or_default(),
                response,
                &records,
                session_clock_ms(),
            ),
            Err(_) => {
                response.session_id = 0;
                return;
            }
        };
        if keep.len() == ranges.len() {
            let mut keep = keep.into_iter();
            ranges.retain(|_| keep.next().unwrap_or(true));
        } else if response.responses.is_empty() {
            ranges.clear();
        }
    }

    /// Answers a Fetch as a frame of chunks whose record sets are ranges of segment files,
    /// for the connection to send with `sendfile` (DESIGN.md §3): the records never pass
    /// through user space. Same answers as [`Broker::handle`] otherwise.
    /// A Fetch, answered with ranges of segment files beside its bytes (zero-copy). With a
    /// quota scope, the second value is the throttle the consumer's quotas put on it and
    /// the request quota to record its time against; `None` when nothing was measured (a
    /// follower's fetch is exempt, as in Kafka).
    #[allow(clippy::type_complexity)]
    pub(crate) async fn handle_fetch_chunks(
        &self,
        header: &RequestHeader,
        mut body: Bytes,
        session: &Session,
        scope: Option<&QuotaScope<'_>>,
    ) -> Result<
        (
            Option<Vec<ResponseChunk>>,
            Option<(Duration, Option<Governed>)>,
        ),
        String,
    > {
        let peer = session.peer;
        let version = header.request_api_version;
        let supported = super::supported_range(ApiKey::Fetch)
            .is_some_and(|(lo, hi)| (lo..=hi).contains(&version));
        if !supported {
            // Unsupported: answered by closing.
            let response = self
                .handle(header, Some(ApiKey::Fetch), body, session, None)
                .await?;
            return Ok((
                response.map(|b| vec![ResponseChunk::Bytes(b.freeze())]),
                None,
            ));
        }
        let mut request = FetchRequest::decode(&mut body, version)
            .map_err(|e| format!("Fetch v{version} from {peer}: {e}"))?;
        let replica_id = fetch_replica_id(&request, version);
        let (context, asked) = self.fetch_session_context(&mut request, version);
        let now = Instant::now();
        let scope = scope.filter(|_| replica_id < 0);
        let request_quota = scope.and_then(|s| s.governed(QuotaKind::Request));
        let fetch_quota = scope.and_then(|s| s.governed(QuotaKind::Fetch));
        let mut throttle = request_quota
            .as_ref()
            .map_or(Duration::ZERO, |g| self.quotas.check(g, now));
        if let Some(g) = &fetch_quota {
            // No more than the quota could let through at all (Kafka's
            // `getMaxValueInQuotaWindow`).
            let cap = self.quotas.max_value_in_window(g).min(i32::MAX as f64) as i32;
            request.max_bytes = request.max_bytes.min(cap.max(1));
        }
        let measured = |throttle: Duration| scope.map(|_| (throttle, request_quota.clone()));
        let correlation_id = header.correlation_id;
        if let FetchContext::Error(_) = context {
            let mut response = FetchResponse {
                throttle_time_ms: throttle_ms(throttle),
                ..Default::default()
            };
            self.answer_in_session(context, None, &mut response, &mut Vec::new());
            let frame = super::encode_response(correlation_id, ApiKey::Fetch, version, &response)?;
            return Ok((
                Some(vec![ResponseChunk::Bytes(frame.freeze())]),
                measured(throttle),
            ));
        }
        let authz = self.authz(session);
        let patch = match self.fetch_gate(&authz, &mut request, version, &session.listener) {
            Gate::Proceed(patch) => patch,
            Gate::Respond(mut body) => {
                if let ResponseBody::Fetch(response) = &mut body {
                    self.answer_in_session(context, asked.as_deref(), response, &mut Vec::new());
                }
                body.raise_throttle_time_ms(throttle_ms(throttle));
                let frame = super::encode_response(
                    correlation_id,
                    ApiKey::Fetch,
                    version,
                    &super::AnyResponse(&body),
                )?;
                return Ok((
                    Some(vec![ResponseChunk::Bytes(frame.freeze())]),
                    measured(throttle),
                ));
            }
            Gate::Close(reason) => return Err(reason),
        };
        // The partitions the gate let through: what the fetch waits on, and where its
        // connection belongs (see `network::threads`).
        let shards = self.fetch_shards(&request, version);
        if session.affinity.matters() {
            session.affinity.vote(shards.iter().copied());
        }
        let (mut response, mut ranges) = self.fetch_wait(&request, version, true, shards).await;
        if let Some(patch) = patch {
            // The refused partitions come after the read ones and carry no records.
            let mut body = ResponseBody::Fetch(response);
            patch(&mut body);
            let ResponseBody::Fetch(patched) = body else {
                return Err("a Fetch patch changed the response's type".into());
            };
            response = patched;
            let partitions: usize = response.responses.iter().map(|t| t.partitions.len()).sum();
            let missing = partitions.saturating_sub(ranges.len());
            ranges.extend(std::iter::repeat_with(|| None).take(missing));
        }
        let mut held = false;
        if let Some(g) = &fetch_quota {
            let size: u64 = ranges.iter().flatten().map(|r| r.len).sum();
            let now = Instant::now();
            let earned = self.quotas.record(g, size as f64, now);
            if !earned.is_zero() {
                // Over the quota: nothing is sent, and nothing counted (Kafka's
                // throttled response has no topics, and a full fetch opens no session).
                self.quotas.unrecord(g, size as f64, now);
                match self.fetch_sessions.lock() {
                    Ok(cache) => cache.throttled(context, &mut response),
                    Err(_) => response.responses.clear(),
                }
                ranges.clear();
                throttle = throttle.max(earned);
                held = true;
            }
        }
        if !held {
            self.answer_in_session(context, asked.as_deref(), &mut response, &mut ranges);
        }
        response.throttle_time_ms = response.throttle_time_ms.max(throttle_ms(throttle));
        if let Some(chunks) = encode_fetch_chunks(correlation_id, version, &response, &ranges)? {
            return Ok((Some(chunks), measured(throttle)));
        }
        // A response the chunk encoder does not cover: read the ranges, encode as usual.
        fill_records(&mut response, &ranges).map_err(|e| format!("reading records: {e}"))?;
        let frame = super::encode_response(correlation_id, ApiKey::Fetch, version, &response)?;
        Ok((
            Some(vec![ResponseChunk::Bytes(frame.freeze())]),
            measured(throttle),
        ))
    }

    /// Reads until `min_bytes` are there, a partition fails or the wait is over. With
    /// `zero_copy` the records stay in their files: the second value holds, for each
    /// partition in response order, the file range that stands for its (empty) records.
    async fn fetch_wait(
        &self,
        request: &FetchRequest,
        version: i16,
        zero_copy: bool,
        shards: Vec<usize>,
    ) -> (FetchResponse, Vec<Option<FileRange>>) {
        let max_wait = Duration::from_millis(request.max_wait_ms.max(0) as u64).min(MAX_FETCH_WAIT);
        let deadline = tokio::time::Instant::now() + max_wait;
        let min_bytes = request.min_bytes.max(0) as usize;
        let replica_id = fetch_replica_id(request, version);
        loop {
            // Registered before reading so that an append between the read and the wait
            // still wakes this fetch. A follower reads to the log end, so a move of the
            // high watermark alone gives it nothing to read (see `append_signal`).
            let signals = self.replicas.signals();
            let appended = if replica_id >= 0 {
                signals.log_end_of(&shards)
            } else {
                signals.any_of(&shards)
            };
            let (mut response, ranges, bytes, errored, counters, throttled, remote) =
                self.read_fetch(request, version, zero_copy);
            // A read from the remote tier answers at once, as Kafka's DelayedRemoteFetch
            // completes when its read does.
            let remote_read = !remote.is_empty();
            if remote_read {
                self.serve_remote_reads(&mut response, remote).await;
            }
            if bytes >= min_bytes
                || errored
                || remote_read
                || follower_high_watermark_behind(request, version, &response)
                || tokio::time::Instant::now() >= deadline
            {
                if let Some((_, sent)) = throttled.filter(|(_, sent)| *sent > 0) {
                    self.quotas
                        .record_leader_replication(sent as f64, Instant::now());
                }
                self.account_fetch(request, version, &response, &ranges, &counters);
                return (response, ranges);
            }
            // Parked until data or the deadline: the request slot is for work.
            request_slot::park();
            tokio::select! {
                _ = appended => {}
                _ = tokio::time::sleep_until(deadline) => {}
            }
        }
    }

    /// Kafka's fetch metrics of the answer a fetch returns (not of the reads it made
    /// while it waited): per partition a fetch request, its record bytes out (to a
    /// consumer, or replication bytes to a follower), a failed one and its error code.
    /// The counters come with each read; a partition that failed is looked up (an
    /// error path), and counted for all topics only when this broker does not host it.
    fn account_fetch(
        &self,
        request: &FetchRequest,
        version: i16,
        response: &FetchResponse,
        ranges: &[Option<FileRange>],
        counters: &[Option<metrics::TopicHandle>],
    ) {
        let m = metrics::global();
        let replica_id = fetch_replica_id(request, version);
        let bytes_field: fn(&metrics::TopicMetrics) -> &std::sync::atomic::AtomicU64 =
            if replica_id >= 0 {
                |t| &t.replication_bytes_out
            } else {
                |t| &t.bytes_out
            };
        let mut range = ranges.iter();
        let mut found = counters.iter();
        for (topic, answered) in request.topics.iter().zip(&response.responses) {
            for p in &answered.partitions {
                let file = range.next().and_then(Option::as_ref);
                let bytes = match file {
                    Some(r) => r.len as usize,
                    None => p.records.as_ref().map_or(0, |r| r.len()),
                };
                let failed = p.error_code != 0;
                let counters = match found.next().cloned().flatten() {
                    Some(c) => Some(c),
                    None if failed => {
                        let name = if version >= 13 {
                            self.topic_name_by_id(&topic.topic_id)
                        } else {
                            Some(topic.topic.clone())
                        };
                        name.and_then(|topic| {
                            self.replicas.get(&TopicPartition {
                                topic,
                                partition: p.partition_index,
                            })
                        })
                        .map(|p| p.topic_metrics.clone())
                    }
                    None => None,
                };
                if failed {
                    m.requests.error(ApiKey::Fetch as i16, p.error_code);
                }
                match counters {
                    Some(c) => {
                        c.add(|t| &t.fetch_requests, 1);
                        c.add(bytes_field, u64::try_from(bytes).unwrap_or(0));
                        if failed {
                            c.add(|t| &t.failed_fetch_requests, 1);
                        }
                    }
                    None => {
                        metrics::inc(&m.topics.all.fetch_requests);
                        if failed {
                            metrics::inc(&m.topics.all.failed_fetch_requests);
                        }
                    }
                }
            }
        }
    }

    /// The append-signal shards of a fetch's partitions (see `append_signal`). A topic
    /// id this broker does not know has none: its partitions answer with an error at
    /// once, and a topic created meanwhile is found by the next fetch.
    fn fetch_shards(&self, request: &FetchRequest, version: i16) -> Vec<usize> {
        let mut shards = Vec::new();
        for topic in &request.topics {
            let name = if version >= 13 {
                self.topic_name_by_id(&topic.topic_id)
            } else {
                Some(topic.topic.clone())
            };
            if let Some(name) = name {
                shards.extend(
                    topic
                        .partitions
                        .iter()
                        .map(|p| AppendSignals::shard(&name, p.partition)),
                );
            }
        }
        shards.sort_unstable();
        shards.dedup();
        shards
    }

    /// One pass over the fetch's partitions: the response, the record bytes in it,
    /// whether any partition failed (which answers the fetch at once), each partition's
    /// topic counters (for the metrics), and for a follower's fetch under `leader.replication.throttled.rate` that rate and the bytes
    /// of throttled replicas sent (Kafka's `ReplicationQuotaManager` on the leader: while
    /// the rate is over, a throttled replica is answered without records).
    #[allow(clippy::type_complexity)]
    fn read_fetch(
        &self,
        request: &FetchRequest,
        version: i16,
        zero_copy: bool,
    ) -> (
        FetchResponse,
        Vec<Option<FileRange>>,
        usize,
        bool,
        Vec<Option<metrics::TopicHandle>>,
        Option<(f64, usize)>,
        Vec<RemoteRead>,
    ) {
        let mut remote_reads = Vec::new();
        let mut ranges = Vec::new();
        // Each partition's topic counters, in response order (`None` where it failed).
        let mut counters = Vec::new();
        let mut remaining = if request.max_bytes > 0 {
            request.max_bytes as usize
        } else {
            0
        };
        let mut total = 0usize;
        let mut errored = false;
        let by_id = version >= 13;
        // A follower names itself: in the body up to v14, in `replica_state` from v15.
        let replica_id = fetch_replica_id(request, version);
        let image = self.image();
        let throttle = (replica_id >= 0)
            .then(|| self.quotas.leader_replication_limit())
            .flatten();
        let exceeded = throttle.is_some_and(|limit| {
            self.quotas
                .leader_replication_exceeded(limit, Instant::now())
        });
        let mut throttled_sent = 0usize;
        let mut responses = Vec::with_capacity(request.topics.len());
        for topic in &request.topics {
            let name = if by_id {
                self.topic_name_by_id(&topic.topic_id)
            } else {
                Some(topic.topic.clone())
            };
            let throttled_replicas = match (&name, throttle) {
                (Some(n), Some(_)) => self
                    .topic_config_value(&image, n, "leader.replication.throttled.replicas")
                    .unwrap_or_default(),
                _ => String::new(),
            };
            let mut partitions = Vec::with_capacity(topic.partitions.len());
            for p in &topic.partitions {
                let mut data = PartitionData {
                    partition_index: p.partition,
                    high_watermark: -1,
                    last_stable_offset: -1,
                    log_start_offset: -1,
                    preferred_read_replica: -1,
                    // Never null: librdkafka refuses a null record set even beside an error.
                    records: Some(bytes::Bytes::new()),
                    ..Default::default()
                };
                let Some(name) = &name else {
                    data.error_code = ErrorCode::UNKNOWN_TOPIC_ID.code();
                    errored = true;
                    ranges.push(None);
                    counters.push(None);
                    partitions.push(data);
                    continue;
                };
                let tp = TopicPartition {
                    topic: name.clone(),
                    partition: p.partition,
                };
                let max = (p.partition_max_bytes.max(0) as usize).min(remaining);
                let read = if replica_id >= 0 {
                    self.replicas.read_for_follower(
                        &tp,
                        replica_id,
                        p.current_leader_epoch,
                        p.fetch_offset,
                        p.log_start_offset,
                        max,
                        zero_copy,
                    )
                } else {
                    self.replicas.read_maybe_zero_copy(
                        &tp,
                        p.current_leader_epoch,
                        p.fetch_offset,
                        max,
                        total == 0,
                        zero_copy,
                        request.isolation_level == 1,
                    )
                };
                let mut range = None;
                match read {
                    Ok(result) => {
                        counters.push(Some(result.topic_metrics.clone()));
                        data.high_watermark = result.offsets.high_watermark;
                        data.last_stable_offset = result.offsets.last_stable_offset;
                        // read_committed: the aborted transactions in the range read, for
                        // the consumer to drop their records (null when there are none,
                        // as Kafka sends).
                        if let Some(aborted) = &result.aborted_transactions {
                            data.aborted_transactions = (!aborted.is_empty()).then(|| {
                                aborted
                                    .iter()
                                    .map(|a| AbortedTransaction {
                                        producer_id: a.producer_id,
                                        first_offset: a.first_offset,
                                        ..Default::default()
                                    })
                                    .collect()
                            });
                        }
                        // A follower tracks the leader's local log start; a consumer
                        // sees the whole log's, remote tier included.
                        data.log_start_offset = if replica_id < 0 {
                            self.log_start_offset_of(&image, &tp, result.offsets.log_start_offset)
                        } else {
                            result.offsets.log_start_offset
                        };
                        let len = result.byte_len();
                        // Only a replica outside the ISR is throttled, as in Kafka.
                        let throttled =
                            replica_throttled(&throttled_replicas, p.partition, replica_id)
                                && !image
                                    .topic(name)
                                    .and_then(|t| t.partitions.get(&p.partition))
                                    .is_some_and(|reg| reg.isr.contains(&replica_id));
                        if throttled && exceeded {
                            // The follower's position is taken; its records wait.
                        } else {
                            if throttled {
                                throttled_sent += len;
                            }
                            total += len;
                            remaining = remaining.saturating_sub(len);
                            // A leader's follower may get the records from the
                            // leader's tail copy: then they go out from memory.
                            if zero_copy && result.records.is_empty() {
                                range = result.file_range;
                            } else {
                                data.records = Some(result.records);
                            }
                        }
                    }
                    Err((ErrorCode::OFFSET_OUT_OF_RANGE, Some(o)))
                        if replica_id < 0 && p.fetch_offset < o.log_start_offset =>
                    {
                        // Below the local log start: the remote tier's, when it has it
                        // (read by `fetch_wait`, which may wait on the store).
                        match self.remote_read_of(
                            &image,
                            &tp,
                            p.fetch_offset,
                            max,
                            &o,
                            request.isolation_level == 1,
                        ) {
                            Some(mut read) => {
                                data.high_watermark = o.high_watermark;
                                data.last_stable_offset = o.last_stable_offset;
                                data.log_start_offset = read.log_start_offset;
                                read.response_index = (responses.len(), partitions.len());
                                remote_reads.push(read);
                                counters.push(None);
                            }
                            None => {
                                data.high_watermark = o.high_watermark;
                                data.last_stable_offset = o.last_stable_offset;
                                data.log_start_offset =
                                    self.log_start_offset_of(&image, &tp, o.log_start_offset);
                                data.error_code = ErrorCode::OFFSET_OUT_OF_RANGE.code();
                                errored = true;
                                counters.push(None);
                            }
                        }
                    }
                    Err((code, offsets)) => {
                        if let Some(o) = offsets {
                            data.high_watermark = o.high_watermark;
                            data.last_stable_offset = o.last_stable_offset;
                            data.log_start_offset = o.log_start_offset;
                        }
                        data.error_code = code.code();
                        errored = true;
                        counters.push(None);
                    }
                }
                ranges.push(range);
                partitions.push(data);
            }
            responses.push(FetchableTopicResponse {
                topic: topic.topic.clone(),
                topic_id: topic.topic_id,
                partitions,
                ..Default::default()
            });
        }
        let response = FetchResponse {
            session_id: 0,
            responses,
            ..Default::default()
        };
        let throttled = throttle.map(|limit| (limit, throttled_sent));
        (
            response,
            ranges,
            total,
            errored,
            counters,
            throttled,
            remote_reads,
        )
    }

    /// A consumer's read at `offset`, below the local log start of `tp`, that the remote
    /// tier can serve (`None` when it cannot: the offset is out of range there too).
    fn remote_read_of(
        &self,
        image: &rill_metadata::MetadataImage,
        tp: &TopicPartition,
        offset: i64,
        max_bytes: usize,
        offsets: &crate::replication::replica_manager::PartitionOffsets,
        read_committed: bool,
    ) -> Option<RemoteRead> {
        self.remote_log.as_ref()?;
        let topic_id = image.topic(&tp.topic)?.id;
        image.remote_segments(topic_id, tp.partition)?;
        let rp = remote_log::storage::RemotePartition {
            topic: tp.topic.clone(),
            topic_id,
            partition: tp.partition,
        };
        // Only copies in this leader's epoch lineage are read (after an unclean
        // election a deposed leader's copies past the divergence are not this log's).
        let readable = self
            .replicas
            .get(tp)?
            .with_log(|log| remote_log::readable_segments(image, &rp, log))
            .ok()?;
        let segment = readable
            .iter()
            .filter(|m| m.start_offset <= offset && offset <= m.end_offset)
            .max_by_key(|m| m.start_offset)?
            .clone();
        let next = readable
            .iter()
            .find(|m| m.start_offset > segment.end_offset)
            .cloned();
        Some(RemoteRead {
            partition: rp,
            segment,
            next,
            offset,
            max_bytes,
            max_offset: if read_committed {
                offsets.last_stable_offset
            } else {
                offsets.high_watermark
            },
            read_committed,
            log_start_offset: remote_log::log_start_offset(
                image,
                topic_id,
                tp.partition,
                offsets.log_start_offset,
            ),
            response_index: (0, 0),
        })
    }

    /// The whole log's start of `tp` for a consumer: below the local log start when the
    /// remote tier holds older data.
    fn log_start_offset_of(
        &self,
        image: &rill_metadata::MetadataImage,
        tp: &TopicPartition,
        local_log_start_offset: i64,
    ) -> i64 {
        match image.topic(&tp.topic) {
            Some(t) if self.remote_log.is_some() => {
                remote_log::log_start_offset(image, t.id, tp.partition, local_log_start_offset)
            }
            _ => local_log_start_offset,
        }
    }

    /// Serves the remote reads `read_fetch` found into `response`: each partition's
    /// records, or its error when the store fails (KAFKA_STORAGE_ERROR, as Kafka's
    /// remote fetch answers a storage failure). Returns the bytes read.
    async fn serve_remote_reads(
        &self,
        response: &mut FetchResponse,
        reads: Vec<RemoteRead>,
    ) -> usize {
        let Some(reader) = self.remote_log.clone() else {
            return 0;
        };
        let mut total = 0;
        for read in reads {
            let (t, p) = read.response_index;
            let Some(data) = response
                .responses
                .get_mut(t)
                .and_then(|topic| topic.partitions.get_mut(p))
            else {
                continue;
            };
            let got = reader
                .read(
                    &read.partition,
                    &read.segment,
                    read.next.as_ref(),
                    read.offset,
                    read.max_bytes,
                    read.max_offset,
                    true,
                )
                .await;
            match got {
                Ok(Some(info)) => {
                    if read.read_committed && !info.records.is_empty() {
                        let end = read.segment.end_offset + 1;
                        match reader
                            .aborted_txns(&read.partition, &read.segment, read.offset, end)
                            .await
                        {
                            Ok(aborted) => {
                                data.aborted_transactions = (!aborted.is_empty()).then(|| {
                                    aborted
                                        .iter()
                                        .map(|a| AbortedTransaction {
                                            producer_id: a.producer_id,
                                            first_offset: a.first_offset,
                                            ..Default::default()
                                        })
                                        .collect()
                                });
                            }
                            Err(e) => {
                                tracing::warn!(topic = %read.partition.topic, partition = read.partition.partition, error = %e, "remote read failed");
                                data.error_code = ErrorCode::KAFKA_STORAGE_ERROR.code();
                                continue;
                            }
                        }
                    }
                    total += info.records.len();
                    data.records = Some(info.records);
                }
                Ok(None) => {}
                Err(e) => {
                    // Retention deleted the segment since the read was planned: the
                    // offset is out of range now, as a local read below the log start is.
                    let image = self.image();
                    let still_there = image
                        .remote_segments(read.partition.topic_id, read.partition.partition)
                        .and_then(|s| s.get(&read.segment.segment_id))
                        .is_some_and(|m| {
                            m.state == rill_metadata::RemoteLogSegmentState::CopySegmentFinished
                        });
                    if still_there {
                        metrics::inc(&metrics::global().remote_log.fetch_errors);
                        tracing::warn!(topic = %read.partition.topic, partition = read.partition.partition, offset = read.offset, error = %e, "remote read failed");
                        data.error_code = ErrorCode::KAFKA_STORAGE_ERROR.code();
                    } else {
                        data.error_code = ErrorCode::OFFSET_OUT_OF_RANGE.code();
                        data.log_start_offset = self.log_start_offset_of(
                            &image,
                            &TopicPartition {
                                topic: read.partition.topic.clone(),
                                partition: read.partition.partition,
                            },
                            data.log_start_offset,
                        );
                    }
                }
            }
        }
        total
    }

    pub(crate) async fn handle_list_offsets(
        &self,
        request: ListOffsetsRequest,
        _version: i16,
    ) -> ListOffsetsResponse {
        // READ_COMMITTED (v2+): the latest offset is the last stable offset, and a
        // timestamp lookup finds only records below it.
        let read_committed = request.isolation_level == 1;
        // A partition named twice cannot be answered unambiguously; Kafka refuses both.
        let mut seen = std::collections::HashMap::new();
        for topic in &request.topics {
            for p in &topic.partitions {
                *seen
                    .entry((topic.name.clone(), p.partition_index))
                    .or_insert(0) += 1;
            }
        }
        let mut topics = Vec::with_capacity(request.topics.len());
        for topic in request.topics {
            let mut partitions = Vec::with_capacity(topic.partitions.len());
            for p in topic.partitions {
                let tp = TopicPartition {
                    topic: topic.name.clone(),
                    partition: p.partition_index,
                };
                let mut resp = ListOffsetsPartitionResponse {
                    partition_index: p.partition_index,
                    timestamp: -1,
                    offset: -1,
                    leader_epoch: -1,
                    ..Default::default()
                };
                let duplicate = seen.get(&(tp.topic.clone(), tp.partition)) > Some(&1);
                let answer = if duplicate {
                    Err(ErrorCode::INVALID_REQUEST)
                } else {
                    match self
                        .replicas
                        .check_leader_epoch(&tp, p.current_leader_epoch)
                    {
                        Ok((_, epoch)) => self
                            .list_offset(&tp, p.timestamp, read_committed)
                            .await
                            .map(|found| (found, epoch)),
                        Err(code) => Err(code),
                    }
                };
                match answer {
                    Ok((Some((offset, timestamp)), epoch)) => {
                        resp.offset = offset;
                        resp.timestamp = timestamp;
                        // LATEST_TIERED of a log with nothing remote: Kafka's -1 epoch.
                        resp.leader_epoch = if p.timestamp == LATEST_TIERED_TIMESTAMP && offset < 0
                        {
                            -1
                        } else {
                            epoch
                        };
                    }
                    Ok((None, _)) => {}
                    Err(code) => resp.error_code = code.code(),
                }
                partitions.push(resp);
            }
            topics.push(ListOffsetsTopicResponse {
                name: topic.name,
                partitions,
                ..Default::default()
            });
        }
        ListOffsetsResponse {
            topics,
            ..Default::default()
        }
    }

    /// `(offset, timestamp)` for one ListOffsets partition, `None` when no record matches.
    /// `read_committed` bounds the answers by the last stable offset instead of the high
    /// watermark (Kafka's `fetchOffsetForTimestamp` with its `isolationLevel`). On a
    /// tiered partition EARLIEST is the whole log's start, EARLIEST_LOCAL the local
    /// log's (KIP-1005), LATEST_TIERED the highest offset in the remote tier (-1: none),
    /// and a timestamp is looked up in the remote tier before the local log.
    async fn list_offset(
        &self,
        tp: &TopicPartition,
        timestamp: i64,
        read_committed: bool,
    ) -> Result<Option<(i64, i64)>, ErrorCode> {
        let last_fetchable = |offsets: crate::replication::replica_manager::PartitionOffsets| {
            if read_committed {
                offsets.last_stable_offset
            } else {
                offsets.high_watermark
            }
        };
        let image = self.image();
        let tiered = self.remote_log.is_some()
            && self
                .topic_config_value(&image, &tp.topic, "remote.storage.enable")
                .is_some_and(|v| v.trim() == "true");
        match timestamp {
            EARLIEST_TIMESTAMP => {
                let local = self.replicas.offsets(tp)?.log_start_offset;
                Ok(Some((self.log_start_offset_of(&image, tp, local), -1)))
            }
            EARLIEST_LOCAL_TIMESTAMP => Ok(Some((self.replicas.offsets(tp)?.log_start_offset, -1))),
            LATEST_TIMESTAMP => Ok(Some((last_fetchable(self.replicas.offsets(tp)?), -1))),
            LATEST_TIERED_TIMESTAMP => {
                let highest = if tiered {
                    self.replicas.highest_offset_in_remote_storage(tp)?
                } else {
                    -1
                };
                Ok(Some((highest, -1)))
            }
            MAX_TIMESTAMP => self.replicas.max_timestamp(tp),
            ts if ts < 0 => Err(ErrorCode::INVALID_REQUEST),
            ts => {
                let offsets = self.replicas.offsets(tp)?;
                let hw = last_fetchable(offsets);
                if tiered {
                    if let Some(found) = self
                        .remote_offset_for_timestamp(&image, tp, ts, offsets.log_start_offset)
                        .await?
                    {
                        return Ok(Some(found));
                    }
                }
                Ok(self
                    .replicas
                    .offset_for_timestamp(tp, ts)?
                    .filter(|(offset, _, _)| *offset < hw)
                    .map(|(offset, ts, _)| (offset, ts)))
            }
        }
    }

    /// ListOffsets by timestamp in the remote tier: the first finished copy below the
    /// local log start whose newest record reaches `timestamp`.
    async fn remote_offset_for_timestamp(
        &self,
        image: &rill_metadata::MetadataImage,
        tp: &TopicPartition,
        timestamp: i64,
        local_log_start_offset: i64,
    ) -> Result<Option<(i64, i64)>, ErrorCode> {
        let (Some(reader), Some(topic)) = (&self.remote_log, image.topic(&tp.topic)) else {
            return Ok(None);
        };
        let Some(segments) = image.remote_segments(topic.id, tp.partition) else {
            return Ok(None);
        };
        let rp = remote_log::storage::RemotePartition {
            topic: tp.topic.clone(),
            topic_id: topic.id,
            partition: tp.partition,
        };
        for seg in remote_log::reader::finished_segments(segments) {
            if seg.max_timestamp_ms < timestamp || seg.start_offset >= local_log_start_offset {
                continue;
            }
            match reader.offset_for_timestamp(&rp, seg, timestamp).await {
                Ok(Some((offset, ts, _))) => return Ok(Some((offset, ts))),
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(%tp, error = %e, "remote ListOffsets failed");
                    return Err(ErrorCode::KAFKA_STORAGE_ERROR);
                }
            }
        }
        Ok(None)
    }

    pub(crate) async fn handle_init_producer_id(
        &self,
        request: InitProducerIdRequest,
        version: i16,
    ) -> InitProducerIdResponse {
        let mut resp = InitProducerIdResponse {
            producer_id: -1,
            producer_epoch: -1,
            ..Default::default()
        };
        if let Some(transactional_id) = request.transactional_id.clone() {
            return self
                .handle_init_producer_id_transactional(request, transactional_id, version)
                .await;
        }
        // KIP-360: a producer that knows its id asks for an epoch bump to reset sequences.
        if request.producer_id >= 0
            && request.producer_epoch >= 0
            && request.producer_epoch < i16::MAX - 1
        {
            resp.producer_id = request.producer_id;
            resp.producer_epoch = request.producer_epoch + 1;
            return resp;
        }
        match self.next_producer_id().await {
            Ok(id) => {
                resp.producer_id = id;
                resp.producer_epoch = 0;
            }
            Err(code) => resp.error_code = code.code(),
        }
        resp
    }

    /// The next producer id from this broker's block, asking the controller for a new
    /// block (Kafka's AllocateProducerIds) when it is used up. Ids are unique across the
    /// cluster because the controller hands out each block once, through the metadata log.
    pub(crate) async fn next_producer_id(&self) -> Result<i64, ErrorCode> {
        let mut block = self.producer_ids.lock().await;
        if block.next >= block.end {
            let event = ControllerEvent::AllocateProducerIds(AllocateProducerIdsRequest {
                broker_id: self.node_id,
                broker_epoch: self.broker_epoch(),
            });
            match self.controller_call(event).await? {
                ControllerResponse::AllocateProducerIds(r) if r.error_code == ErrorCode::NONE => {
                    block.next = r.producer_id_start;
                    block.end = r.producer_id_start + i64::from(r.producer_id_len);
                }
                ControllerResponse::AllocateProducerIds(r) => {
                    tracing::warn!(error = r.error_code.name(), "producer id block refused");
                    return Err(ErrorCode::COORDINATOR_LOAD_IN_PROGRESS);
                }
                _ => return Err(ErrorCode::UNKNOWN_SERVER_ERROR),
            }
        }
        let id = block.next;
        block.next += 1;
        Ok(id)
    }

    /// OffsetForLeaderEpoch (KIP-101, KIP-279, KIP-320): where each requested epoch ends
    /// in the leader's log, so that a follower (or a consumer after a leader change) can
    /// find where its history diverges.
    pub(crate) fn handle_offset_for_leader_epoch(
        &self,
        request: OffsetForLeaderEpochRequest,
    ) -> OffsetForLeaderEpochResponse {
        let topics = request
            .topics
            .into_iter()
            .map(|topic| {
                let partitions = topic
                    .partitions
                    .into_iter()
                    .map(|p| {
                        let tp = TopicPartition {
                            topic: topic.topic.clone(),
                            partition: p.partition,
                        };
                        let mut out = EpochEndOffset {
                            partition: p.partition,
                            leader_epoch: -1,
                            end_offset: -1,
                            ..Default::default()
                        };
                        let answer = self
                            .replicas
                            .check_leader_epoch(&tp, p.current_leader_epoch)
                            .and_then(|(partition, _)| {
                                partition.with_log(|log| log.end_offset_for_epoch(p.leader_epoch))
                            });
                        match answer {
                            Ok((epoch, end)) => {
                                out.leader_epoch = epoch;
                                out.end_offset = end;
                            }
                            Err(code) => out.error_code = code.code(),
                        }
                        out
                    })
                    .collect();
                OffsetForLeaderTopicResult {
                    topic: topic.topic,
                    partitions,
                    ..Default::default()
                }
            })
            .collect();
        OffsetForLeaderEpochResponse {
            topics,
            ..Default::default()
        }
    }

    /// DeleteRecords: advances each partition's log start offset (its low watermark).
    /// DeleteRecords. On a tiered partition the remote copies wholly below the offset
    /// are deleted too, and the low watermark is the whole log's start: the start of the
    /// copy that holds the offset when it is below the local log (Kafka keeps a log start
    /// inside it; Rill keeps the copy whole, so up to one segment more stays readable).
    pub(crate) async fn handle_delete_records(
        &self,
        request: DeleteRecordsRequest,
    ) -> DeleteRecordsResponse {
        let mut topics = Vec::with_capacity(request.topics.len());
        for t in request.topics {
            let mut partitions = Vec::with_capacity(t.partitions.len());
            for p in &t.partitions {
                let tp = TopicPartition {
                    topic: t.name.clone(),
                    partition: p.partition_index,
                };
                let (low_watermark, error_code) = if tp.topic == OFFSETS_TOPIC {
                    (-1, ErrorCode::INVALID_TOPIC_EXCEPTION.code())
                } else {
                    match self.replicas.delete_records(&tp, p.offset) {
                        Ok(low) => match self.delete_remote_records(&tp, p.offset, low).await {
                            Ok(low) => (low, 0),
                            Err(code) => (-1, code.code()),
                        },
                        Err(code) => (-1, code.code()),
                    }
                };
                partitions.push(DeleteRecordsPartitionResult {
                    partition_index: p.partition_index,
                    low_watermark,
                    error_code,
                    ..Default::default()
                });
            }
            topics.push(DeleteRecordsTopicResult {
                partitions,
                name: t.name,
                ..Default::default()
            });
        }
        DeleteRecordsResponse {
            topics,
            ..Default::default()
        }
    }

    /// The remote tier's side of DeleteRecords (see [`Self::handle_delete_records`]):
    /// `offset` as asked (-1: the high watermark, which the local delete moved the local
    /// log start to: `local_low`); returns the low watermark.
    async fn delete_remote_records(
        &self,
        tp: &TopicPartition,
        offset: i64,
        local_low: i64,
    ) -> Result<i64, ErrorCode> {
        let image = self.image();
        let (Some(reader), Some(topic)) = (&self.remote_log, image.topic(&tp.topic)) else {
            return Ok(local_low);
        };
        if image.remote_segments(topic.id, tp.partition).is_none() {
            return Ok(local_low);
        }
        let (_, epoch) = self.replicas.leader_partition(tp)?;
        let rp = remote_log::storage::RemotePartition {
            topic: tp.topic.clone(),
            topic_id: topic.id,
            partition: tp.partition,
        };
        let offset = if offset == -1 { local_low } else { offset };
        remote_log::delete_records_below(self, reader, || self.image(), &rp, epoch, offset)
            .await
            .map_err(|e| {
                tracing::warn!(%tp, error = %e, "deleting remote records failed");
                ErrorCode::KAFKA_STORAGE_ERROR
            })?;
        let local_start = self.replicas.offsets(tp)?.log_start_offset;
        Ok(self.log_start_offset_of(&self.image(), tp, local_start))
    }
}

/// Milliseconds on a monotonic clock, for the fetch sessions' ages.
fn session_clock_ms() -> u64 {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let start = *START.get_or_init(Instant::now);
    u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// KIP-1166 (Fetch v18): a follower sends the high watermark it knows; when the leader's
/// has moved past it, the fetch is answered at once rather than parked, so that the
/// follower (which may serve consumers) learns it without waiting for new records.
fn follower_high_watermark_behind(
    request: &FetchRequest,
    version: i16,
    response: &FetchResponse,
) -> bool {
    version >= 18
        && fetch_replica_id(request, version) >= 0
        && request
            .topics
            .iter()
            .zip(&response.responses)
            .any(|(asked, answered)| {
                asked
                    .partitions
                    .iter()
                    .zip(&answered.partitions)
                    .any(|(p, a)| {
                        p.high_watermark != i64::MAX && a.high_watermark > p.high_watermark
                    })
            })
}

/// The chunk encoder covers what `read_fetch` builds: no tagged field of any kind set.
/// Anything else returns `Ok(None)` and takes the generated encoder's path instead.
/// The replica id of a fetch: in the body before v15, in its replica state since (KIP-903);
/// negative for a consumer.
fn fetch_replica_id(request: &FetchRequest, version: i16) -> i32 {
    if version >= 15 {
        request.replica_state.replica_id
    } else {
        request.replica_id
    }
}

fn chunkable(response: &FetchResponse, ranges: &[Option<FileRange>]) -> bool {
    let partitions: usize = response.responses.iter().map(|t| t.partitions.len()).sum();
    partitions == ranges.len()
        && response.unknown_tagged_fields.is_empty()
        && response.node_endpoints.is_empty()
        && response.responses.iter().all(|t| {
            t.unknown_tagged_fields.is_empty()
                && t.partitions.iter().all(|p| {
                    p.unknown_tagged_fields.is_empty()
                        && p.diverging_epoch == Default::default()
                        && p.current_leader == Default::default()
                        && p.snapshot_id == Default::default()
                })
        })
}

/// Encodes a whole Fetch response frame (size prefix, header, body) as chunks, byte for
/// byte what the generated encoder writes once each partition's records are those of its
/// file range (`ranges` holds one entry per partition in response order; a `None` entry
/// keeps the partition's own `records`). Versions 4 to 18, the ones the broker serves.
fn encode_fetch_chunks(
    correlation_id: i32,
    version: i16,
    response: &FetchResponse,
    ranges: &[Option<FileRange>],
) -> Result<Option<Vec<ResponseChunk>>, String> {
    if !(4..=18).contains(&version) || !chunkable(response, ranges) {
        return Ok(None);
    }
    let err = |e: EncodeError| format!("encoding Fetch: {e}");
    let flexible = version >= 12;
    let mut chunks = Vec::new();
    let mut total = 0usize;
    let mut buf = BytesMut::with_capacity(256);
    ResponseHeader {
        correlation_id,
        ..Default::default()
    }
    .encode(&mut buf, ApiKey::Fetch.response_header_version(version))
    .map_err(err)?;
    buf.put_i32(response.throttle_time_ms);
    if version >= 7 {
        buf.put_i16(response.error_code);
        buf.put_i32(response.session_id);
    }
    write_array_len(&mut buf, flexible, Some(response.responses.len())).map_err(err)?;
    let mut ranges = ranges.iter();
    for topic in &response.responses {
        if version <= 12 {
            write_string(&mut buf, flexible, &topic.topic).map_err(err)?;
        } else {
            buf.put_slice(topic.topic_id.as_bytes());
        }
        write_array_len(&mut buf, flexible, Some(topic.partitions.len())).map_err(err)?;
        for p in &topic.partitions {
            buf.put_i32(p.partition_index);
            buf.put_i16(p.error_code);
            buf.put_i64(p.high_watermark);
            buf.put_i64(p.last_stable_offset);
            if version >= 5 {
                buf.put_i64(p.log_start_offset);
            }
            match &p.aborted_transactions {
                Some(v) => {
                    write_array_len(&mut buf, flexible, Some(v.len())).map_err(err)?;
                    for a in v {
                        a.encode(&mut buf, version).map_err(err)?;
                    }
                }
                None => write_array_len(&mut buf, flexible, None).map_err(err)?,
            }
            if version >= 11 {
                buf.put_i32(p.preferred_read_replica);
            }
            match ranges.next().and_then(Option::as_ref) {
                Some(range) => {
                    let len = usize::try_from(range.len).map_err(|_| "records too large")?;
                    let prefix = u32::try_from(len)
                        .ok()
                        .filter(|l| *l < i32::MAX as u32)
                        .ok_or("records too large")?;
                    if flexible {
                        put_unsigned_varint(&mut buf, prefix + 1);
                    } else {
                        buf.put_i32(prefix as i32);
                    }
                    total += buf.len() + len;
                    chunks.push(ResponseChunk::Bytes(buf.split().freeze()));
                    chunks.push(ResponseChunk::File {
                        file: range.file.clone(),
                        offset: range.position,
                        len,
                    });
                }
                None => {
                    write_nullable_bytes(&mut buf, flexible, true, p.records.as_deref(), "Records")
                        .map_err(err)?
                }
            }
            if flexible {
                write_tagged_count(&mut buf, 0).map_err(err)?;
            }
        }
        if flexible {
            write_tagged_count(&mut buf, 0).map_err(err)?;
        }
    }
    if flexible {
        write_tagged_count(&mut buf, 0).map_err(err)?;
    }
    total += buf.len();
    chunks.push(ResponseChunk::Bytes(buf.freeze()));
    let size = i32::try_from(total).map_err(|_| format!("Fetch response of {total} bytes"))?;
    chunks.insert(
        0,
        ResponseChunk::Bytes(Bytes::copy_from_slice(&size.to_be_bytes())),
    );
    Ok(Some(chunks))
}

/// Reads each partition's file range into its `records` (the path without `sendfile`).
fn fill_records(response: &mut FetchResponse, ranges: &[Option<FileRange>]) -> std::io::Result<()> {
    let partitions = response
        .responses
        .iter_mut()
        .flat_map(|t| t.partitions.iter_mut());
    for (p, range) in partitions.zip(ranges) {
        if let Some(r) = range {
            let mut buf = vec![0u8; r.len as usize];
            r.file.read_exact_at(&mut buf, r.position)?;
            p.records = Some(Bytes::from(buf));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {

    use super::*;
    use rill_protocol::generated::fetch_response::AbortedTransaction;
    use rill_protocol::Uuid;
    use std::io::Write;
    use std::sync::Arc;

    fn materialise(chunks: &[ResponseChunk]) -> Vec<u8> {
        let mut out = Vec::new();
        for c in chunks {
            match c {
                ResponseChunk::Bytes(b) => out.extend_from_slice(b),
                ResponseChunk::File { file, offset, len } => {
                    let mut buf = vec![0u8; *len];
                    file.read_exact_at(&mut buf, *offset).unwrap();
                    out.extend_from_slice(&buf);
                }
            }
        }
        out
    }

    #[test]
    fn chunks_match_the_generated_encoder_for_every_version() {
        let mut file = tempfile::tempfile().unwrap();
        // 200 bytes of "records" after 17 bytes of something else; a second set of 300.
        let junk = vec![0xEEu8; 17];
        let a: Vec<u8> = (0..200u32).map(|i| i as u8).collect();
        let b: Vec<u8> = (0..300u32).map(|i| (i * 7) as u8).collect();
        file.write_all(&junk).unwrap();
        file.write_all(&a).unwrap();
        file.write_all(&b).unwrap();
        let file = Arc::new(file);
        let range = |position: u64, len: u64| FileRange {
            file: file.clone(),
            path: "segment".into(),
            position,
            len,
        };
        let partition = |index: i32, records: Option<Bytes>, aborted| PartitionData {
            partition_index: index,
            error_code: if index == 2 { 1 } else { 0 },
            high_watermark: 1000 + i64::from(index),
            last_stable_offset: 999,
            log_start_offset: 3,
            aborted_transactions: aborted,
            preferred_read_replica: -1,
            records,
            ..Default::default()
        };
        for version in 4..=18i16 {
            let topic = |name: &str, id: u8, partitions| FetchableTopicResponse {
                topic: if version <= 12 {
                    name.into()
                } else {
                    String::new()
                },
                topic_id: if version >= 13 {
                    Uuid::from_bytes([id; 16])
                } else {
                    Uuid::default()
                },
                partitions,
                ..Default::default()
            };
            let txn = AbortedTransaction {
                producer_id: 7,
                first_offset: 8,
                ..Default::default()
            };
            let build = |filled: bool| FetchResponse {
                throttle_time_ms: 5,
                error_code: 0,
                session_id: 0,
                responses: vec![
                    topic(
                        "alpha",
                        1,
                        vec![
                            partition(
                                0,
                                Some(if filled {
                                    Bytes::from(a.clone())
                                } else {
                                    Bytes::new()
                                }),
                                None,
                            ),
                            partition(
                                1,
                                Some(Bytes::from_static(b"inline")),
                                Some(vec![txn.clone()]),
                            ),
                        ],
                    ),
                    topic(
                        "beta",
                        2,
                        vec![
                            partition(2, Some(Bytes::new()), Some(Vec::new())),
                            partition(
                                3,
                                Some(if filled {
                                    Bytes::from(b.clone())
                                } else {
                                    Bytes::new()
                                }),
                                None,
                            ),
                        ],
                    ),
                ],
                ..Default::default()
            };
            let ranges = vec![Some(range(17, 200)), None, None, Some(range(217, 300))];
            let chunks = encode_fetch_chunks(42, version, &build(false), &ranges)
                .unwrap()
                .unwrap();
            let expected =
                super::super::encode_response(42, ApiKey::Fetch, version, &build(true)).unwrap();
            assert_eq!(materialise(&chunks), expected.to_vec(), "version {version}");
            let mut filled = build(false);
            fill_records(&mut filled, &ranges).unwrap();
            let again = super::super::encode_response(42, ApiKey::Fetch, version, &filled).unwrap();
            assert_eq!(again, expected, "fill_records, version {version}");
        }
    }

    #[test]
    fn tagged_fields_fall_back() {
        let response = FetchResponse {
            node_endpoints: vec![Default::default()],
            ..Default::default()
        };
        assert!(encode_fetch_chunks(1, 16, &response, &[])
            .unwrap()
            .is_none());
    }
}
