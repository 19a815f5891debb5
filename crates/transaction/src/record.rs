//! The records of `__transaction_state`: one per transactional id and change, keyed by the
//! id (so that compaction keeps the latest), in Kafka's byte format: a key of version 0
//! (`TransactionLogKey`) and a value of version 0 or 1 (`TransactionLogValue`), each
//! after its `i16` version; a `None` value is a tombstone (the id expired).

use std::collections::{BTreeMap, BTreeSet};

use bytes::{BufMut, Bytes, BytesMut};
use rill_protocol::generated::transaction_coordinator::transaction_log_key::TransactionLogKey;
use rill_protocol::generated::transaction_coordinator::transaction_log_value::{
    PartitionsSchema, TransactionLogValue,
};
use rill_protocol::{Decodable, DecodeError, Encodable, EncodeError};

use crate::state::{TransactionMetadata, TransactionState};

/// The key version Kafka writes.
const KEY_VERSION: i16 = 0;
/// The value version written: 1 carries the tagged fields (previous and next producer
/// id, the client's transaction version) that Kafka 3.x+ readers understand; readers of
/// either version are accepted.
const VALUE_VERSION: i16 = 1;

/// A partition of a transaction, as the record lists it.
pub type TransactionPartition = (String, i32);

/// One record of `__transaction_state`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransactionLogRecord {
    pub transactional_id: String,
    /// `None`: a tombstone.
    pub value: Option<TransactionMetadata>,
}

/// Why a record could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordError(pub String);

impl std::fmt::Display for RecordError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "bad __transaction_state record: {}", self.0)
    }
}

impl std::error::Error for RecordError {}

impl From<DecodeError> for RecordError {
    fn from(e: DecodeError) -> Self {
        RecordError(e.to_string())
    }
}

impl From<EncodeError> for RecordError {
    fn from(e: EncodeError) -> Self {
        RecordError(e.to_string())
    }
}

impl TransactionLogRecord {
    /// The record's key bytes.
    pub fn key_bytes(&self) -> Result<Bytes, RecordError> {
        let key = TransactionLogKey {
            transactional_id: self.transactional_id.clone(),
        };
        let mut buf = BytesMut::with_capacity(2 + key.encoded_len(KEY_VERSION));
        buf.put_i16(KEY_VERSION);
        key.encode(&mut buf, KEY_VERSION)?;
        Ok(buf.freeze())
    }

    /// The record's value bytes; `None` for a tombstone.
    pub fn value_bytes(&self) -> Result<Option<Bytes>, RecordError> {
        let Some(m) = &self.value else {
            return Ok(None);
        };
        let mut by_topic: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
        for (topic, p) in &m.partitions {
            by_topic.entry(topic).or_default().push(*p);
        }
        let value = TransactionLogValue {
            producer_id: m.producer_id,
            previous_producer_id: m.previous_producer_id,
            next_producer_id: m.next_producer_id,
            producer_epoch: m.producer_epoch,
            transaction_timeout_ms: m.txn_timeout_ms,
            transaction_status: m.state.id(),
            transaction_partitions: Some(
                by_topic
                    .into_iter()
                    .map(|(topic, partition_ids)| PartitionsSchema {
                        topic: topic.to_owned(),
                        partition_ids,
                        ..Default::default()
                    })
                    .collect(),
            ),
            transaction_last_update_timestamp_ms: m.txn_last_update_timestamp_ms,
            transaction_start_timestamp_ms: m.txn_start_timestamp_ms,
            client_transaction_version: m.client_transaction_version,
            unknown_tagged_fields: Vec::new(),
        };
        let mut buf = BytesMut::with_capacity(2 + value.encoded_len(VALUE_VERSION));
        buf.put_i16(VALUE_VERSION);
        value.encode(&mut buf, VALUE_VERSION)?;
        Ok(Some(buf.freeze()))
    }

    /// Reads a record from its key and value bytes, as stored.
    pub fn decode(key: &[u8], value: Option<&[u8]>) -> Result<Self, RecordError> {
        let (key_version, mut key) = split_version(key)?;
        if key_version != KEY_VERSION {
            return Err(RecordError(format!("unknown key version {key_version}")));
        }
        let key = TransactionLogKey::decode(&mut key, key_version)?;
        let Some(value) = value else {
            return Ok(TransactionLogRecord {
                transactional_id: key.transactional_id,
                value: None,
            });
        };
        let (value_version, mut value) = split_version(value)?;
        if !(0..=1).contains(&value_version) {
            return Err(RecordError(format!(
                "unknown value version {value_version}"
            )));
        }
        let v = TransactionLogValue::decode(&mut value, value_version)?;
        let state = TransactionState::from_id(v.transaction_status)
            .ok_or_else(|| RecordError(format!("unknown state {}", v.transaction_status)))?;
        let partitions: BTreeSet<(String, i32)> = v
            .transaction_partitions
            .unwrap_or_default()
            .into_iter()
            .flat_map(|t| {
                let topic = t.topic;
                t.partition_ids.into_iter().map(move |p| (topic.clone(), p))
            })
            .collect();
        Ok(TransactionLogRecord {
            transactional_id: key.transactional_id.clone(),
            value: Some(TransactionMetadata {
                transactional_id: key.transactional_id,
                producer_id: v.producer_id,
                previous_producer_id: v.previous_producer_id,
                producer_epoch: v.producer_epoch,
                last_producer_epoch: -1,
                txn_timeout_ms: v.transaction_timeout_ms,
                state,
                partitions,
                txn_start_timestamp_ms: v.transaction_start_timestamp_ms,
                txn_last_update_timestamp_ms: v.transaction_last_update_timestamp_ms,
                next_producer_id: v.next_producer_id,
                client_transaction_version: v.client_transaction_version,
            }),
        })
    }
}

fn split_version(bytes: &[u8]) -> Result<(i16, Bytes), RecordError> {
    let (version, rest) = bytes
        .split_first_chunk::<2>()
        .ok_or_else(|| RecordError("shorter than its version".into()))?;
    Ok((i16::from_be_bytes(*version), Bytes::copy_from_slice(rest)))
}
