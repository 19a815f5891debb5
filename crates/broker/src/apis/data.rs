//! The data path: Produce, Fetch, ListOffsets and InitProducerId.

use std::time::Duration;

use rill_protocol::generated::delete_records_request::DeleteRecordsRequest;
use rill_protocol::generated::delete_records_response::{
    DeleteRecordsPartitionResult, DeleteRecordsResponse, DeleteRecordsTopicResult,
};
use rill_protocol::generated::fetch_request::FetchRequest;
use rill_protocol::generated::fetch_response::{
    FetchResponse, FetchableTopicResponse, PartitionData,
};
use rill_protocol::generated::init_producer_id_request::InitProducerIdRequest;
use rill_protocol::generated::init_producer_id_response::InitProducerIdResponse;
use rill_protocol::generated::list_offsets_request::ListOffsetsRequest;
use rill_protocol::generated::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsResponse, ListOffsetsTopicResponse,
};
use rill_protocol::generated::produce_request::ProduceRequest;
use rill_protocol::generated::produce_response::{
    PartitionProduceResponse, ProduceResponse, TopicProduceResponse,
};
use rill_protocol::ErrorCode;
use rill_storage::TopicPartition;

use crate::group_coordinator::OFFSETS_TOPIC;
use crate::replica_manager::SINGLE_NODE_LEADER_EPOCH;
use crate::Broker;

/// ListOffsets' special timestamps.
const LATEST_TIMESTAMP: i64 = -1;
const EARLIEST_TIMESTAMP: i64 = -2;
const MAX_TIMESTAMP: i64 = -3;
const EARLIEST_LOCAL_TIMESTAMP: i64 = -4;
const LATEST_TIERED_TIMESTAMP: i64 = -5;

/// The longest a fetch may park, whatever it asks for: bounds the tasks a client can hold.
const MAX_FETCH_WAIT: Duration = Duration::from_secs(30);

impl Broker {
    /// Returns `None` for `acks=0`: Kafka sends no response then.
    pub(crate) fn handle_produce(
        &self,
        request: ProduceRequest,
        _version: i16,
    ) -> Option<ProduceResponse> {
        let acks = request.acks;
        let acks_valid = matches!(acks, -1..=1);
        let mut responses = Vec::with_capacity(request.topic_data.len());
        for topic in request.topic_data {
            let mut partition_responses = Vec::with_capacity(topic.partition_data.len());
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
                let outcome = if !acks_valid {
                    Err(ErrorCode::INVALID_REQUIRED_ACKS)
                } else if tp.topic == OFFSETS_TOPIC {
                    // Only the group coordinator writes its topic; a client's bytes there
                    // would be replayed as group state.
                    Err(ErrorCode::INVALID_TOPIC_EXCEPTION)
                } else if request.transactional_id.is_some() {
                    // Transactions need the transaction coordinator, which is not built yet.
                    Err(ErrorCode::TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
                } else {
                    match &p.records {
                        None => Err(ErrorCode::INVALID_RECORD),
                        Some(records) => self.replicas.append(&tp, records),
                    }
                };
                match outcome {
                    Ok((info, log_start_offset)) => {
                        resp.base_offset = info.first_offset;
                        resp.log_append_time_ms = info.log_append_time_ms;
                        resp.log_start_offset = log_start_offset;
                    }
                    Err(code) => {
                        tracing::debug!(%tp, error = code.name(), "produce refused");
                        resp.error_code = code.code();
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
        if acks == 0 {
            return None;
        }
        Some(ProduceResponse {
            responses,
            ..Default::default()
        })
    }

    pub(crate) async fn handle_fetch(&self, request: FetchRequest, version: i16) -> FetchResponse {
        let max_wait = Duration::from_millis(request.max_wait_ms.max(0) as u64).min(MAX_FETCH_WAIT);
        let deadline = tokio::time::Instant::now() + max_wait;
        let min_bytes = request.min_bytes.max(0) as usize;
        loop {
            // Registered before reading so that an append between the read and the wait
            // still wakes this fetch.
            let appended = self.replicas.appended();
            tokio::pin!(appended);
            appended.as_mut().enable();
            let (response, bytes, errored) = self.read_fetch(&request, version);
            if bytes >= min_bytes || errored || tokio::time::Instant::now() >= deadline {
                return response;
            }
            tokio::select! {
                _ = appended => {}
                _ = tokio::time::sleep_until(deadline) => {}
            }
        }
    }

    /// One pass over the fetch's partitions: the response, the record bytes in it, and
    /// whether any partition failed (which answers the fetch at once).
    fn read_fetch(&self, request: &FetchRequest, version: i16) -> (FetchResponse, usize, bool) {
        let mut remaining = if request.max_bytes > 0 {
            request.max_bytes as usize
        } else {
            0
        };
        let mut total = 0usize;
        let mut errored = false;
        let by_id = version >= 13;
        let mut responses = Vec::with_capacity(request.topics.len());
        for topic in &request.topics {
            let name = if by_id {
                self.topics()
                    .into_iter()
                    .find(|t| t.topic_id() == topic.topic_id)
                    .map(|t| t.name)
            } else {
                Some(topic.topic.clone())
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
                    partitions.push(data);
                    continue;
                };
                let tp = TopicPartition {
                    topic: name.clone(),
                    partition: p.partition,
                };
                if p.current_leader_epoch > SINGLE_NODE_LEADER_EPOCH {
                    data.error_code = ErrorCode::UNKNOWN_LEADER_EPOCH.code();
                    errored = true;
                    partitions.push(data);
                    continue;
                }
                let max = (p.partition_max_bytes.max(0) as usize).min(remaining);
                match self.replicas.read(&tp, p.fetch_offset, max, total == 0) {
                    Ok(result) => {
                        data.high_watermark = result.offsets.high_watermark;
                        data.last_stable_offset = result.offsets.high_watermark;
                        data.log_start_offset = result.offsets.log_start_offset;
                        total += result.records.len();
                        remaining = remaining.saturating_sub(result.records.len());
                        data.records = Some(result.records);
                    }
                    Err((code, offsets)) => {
                        if let Some(o) = offsets {
                            data.high_watermark = o.high_watermark;
                            data.last_stable_offset = o.high_watermark;
                            data.log_start_offset = o.log_start_offset;
                        }
                        data.error_code = code.code();
                        errored = true;
                    }
                }
                if request.isolation_level == 1 {
                    data.aborted_transactions = Some(Vec::new());
                }
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
        (response, total, errored)
    }

    pub(crate) fn handle_list_offsets(
        &self,
        request: ListOffsetsRequest,
        _version: i16,
    ) -> ListOffsetsResponse {
        // A partition named twice cannot be answered unambiguously; Kafka refuses both.
        let mut seen = std::collections::HashMap::new();
        for topic in &request.topics {
            for p in &topic.partitions {
                *seen
                    .entry((topic.name.clone(), p.partition_index))
                    .or_insert(0) += 1;
            }
        }
        let topics = request
            .topics
            .into_iter()
            .map(|topic| {
                let partitions = topic
                    .partitions
                    .into_iter()
                    .map(|p| {
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
                            self.list_offset(&tp, p.timestamp)
                        };
                        match answer {
                            Ok(Some((offset, timestamp))) => {
                                resp.offset = offset;
                                resp.timestamp = timestamp;
                                resp.leader_epoch = SINGLE_NODE_LEADER_EPOCH;
                            }
                            Ok(None) => {}
                            Err(code) => resp.error_code = code.code(),
                        }
                        resp
                    })
                    .collect();
                ListOffsetsTopicResponse {
                    name: topic.name,
                    partitions,
                    ..Default::default()
                }
            })
            .collect();
        ListOffsetsResponse {
            topics,
            ..Default::default()
        }
    }

    /// `(offset, timestamp)` for one ListOffsets partition, `None` when no record matches.
    fn list_offset(
        &self,
        tp: &TopicPartition,
        timestamp: i64,
    ) -> Result<Option<(i64, i64)>, ErrorCode> {
        match timestamp {
            EARLIEST_TIMESTAMP | EARLIEST_LOCAL_TIMESTAMP => {
                Ok(Some((self.replicas.offsets(tp)?.log_start_offset, -1)))
            }
            LATEST_TIMESTAMP | LATEST_TIERED_TIMESTAMP => {
                Ok(Some((self.replicas.offsets(tp)?.high_watermark, -1)))
            }
            MAX_TIMESTAMP => self.replicas.max_timestamp(tp),
            ts if ts < 0 => Err(ErrorCode::INVALID_REQUEST),
            ts => {
                let hw = self.replicas.offsets(tp)?.high_watermark;
                Ok(self
                    .replicas
                    .offset_for_timestamp(tp, ts)?
                    .filter(|(offset, _, _)| *offset < hw)
                    .map(|(offset, ts, _)| (offset, ts)))
            }
        }
    }

    pub(crate) fn handle_init_producer_id(
        &self,
        request: InitProducerIdRequest,
    ) -> InitProducerIdResponse {
        let mut resp = InitProducerIdResponse {
            producer_id: -1,
            producer_epoch: -1,
            ..Default::default()
        };
        if request.transactional_id.is_some() {
            // Transactional producers need the transaction coordinator (not built yet).
            resp.error_code = ErrorCode::COORDINATOR_NOT_AVAILABLE.code();
            return resp;
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
        match self.metadata().next_producer_id() {
            Ok(id) => {
                resp.producer_id = id;
                resp.producer_epoch = 0;
            }
            Err(e) => {
                tracing::error!(error = %e, "allocating a producer id failed");
                resp.error_code = ErrorCode::UNKNOWN_SERVER_ERROR.code();
            }
        }
        resp
    }

    /// DeleteRecords: advances each partition's log start offset (its low watermark).
    pub(crate) fn handle_delete_records(
        &self,
        request: DeleteRecordsRequest,
    ) -> DeleteRecordsResponse {
        let topics = request
            .topics
            .into_iter()
            .map(|t| DeleteRecordsTopicResult {
                partitions: t
                    .partitions
                    .iter()
                    .map(|p| {
                        let tp = TopicPartition {
                            topic: t.name.clone(),
                            partition: p.partition_index,
                        };
                        let (low_watermark, error_code) = if tp.topic == OFFSETS_TOPIC {
                            (-1, ErrorCode::INVALID_TOPIC_EXCEPTION.code())
                        } else {
                            match self.replicas.delete_records(&tp, p.offset) {
                                Ok(low) => (low, 0),
                                Err(code) => (-1, code.code()),
                            }
                        };
                        DeleteRecordsPartitionResult {
                            partition_index: p.partition_index,
                            low_watermark,
                            error_code,
                            ..Default::default()
                        }
                    })
                    .collect(),
                name: t.name,
                ..Default::default()
            })
            .collect();
        DeleteRecordsResponse {
            topics,
            ..Default::default()
        }
    }
}
