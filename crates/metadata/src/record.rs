//! [`MetadataRecord`]: one entry of the cluster metadata log, and its bytes.
//!
//! # Frame
//! A record is written as Kafka writes it in its `__cluster_metadata` log
//! (`MetadataRecordSerde`), so that a reader who knows KRaft can read ours:
//!
//! 1. frame version, unsigned varint, always `1`;
//! 2. the record's `apiKey` from its JSON spec, unsigned varint;
//! 3. the record's version, unsigned varint;
//! 4. the record body as the generated codec writes it at that version.
//!
//! We always write the highest version the generated codec knows, and read any version
//! it knows.
//!
//! # Batch
//! Records proposed together (one controller decision) travel and are committed as one
//! batch: `u32` big-endian record count, then per record a `u32` big-endian length and
//! the frame. Counts and lengths are checked against the bytes that remain before
//! anything is allocated, as everywhere in Rill.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use rill_protocol::generated::metadata::{
    AccessControlEntryRecord, BrokerRegistrationChangeRecord, ClientQuotaRecord, ConfigRecord,
    DelegationTokenRecord, FeatureLevelRecord, FenceBrokerRecord, NoOpRecord,
    PartitionChangeRecord, PartitionRecord, ProducerIdsRecord, RegisterBrokerRecord,
    RemoveAccessControlEntryRecord, RemoveDelegationTokenRecord, RemoveTopicRecord,
    RemoveUserScramCredentialRecord, TopicRecord, UnfenceBrokerRecord, UnregisterBrokerRecord,
    UserScramCredentialRecord,
};
use rill_protocol::generated::storage::{
    RemoteLogSegmentMetadataRecord, RemoteLogSegmentMetadataUpdateRecord,
};
use rill_protocol::primitives::{put_unsigned_varint, read_unsigned_varint};
use rill_protocol::{Decodable, Encodable};

use crate::error::MetadataError;

/// The only frame version Kafka has defined.
const FRAME_VERSION: u32 = 1;

/// Record keys of Rill's own in the metadata log, far above Kafka's so that they never
/// meet one: the remote segment metadata of tiered storage (see [`crate::remote_log`]),
/// as Kafka's `storage` record types (whose own keys, 0 and 1, name other metadata
/// records).
pub const REMOTE_LOG_SEGMENT_METADATA_KEY: u32 = 10_000;
pub const REMOTE_LOG_SEGMENT_METADATA_UPDATE_KEY: u32 = 10_001;

/// One record of the metadata log, wrapping the struct generated from Kafka's spec.
#[derive(Debug, Clone, PartialEq)]
pub enum MetadataRecord {
    RegisterBroker(RegisterBrokerRecord),
    UnregisterBroker(UnregisterBrokerRecord),
    Topic(TopicRecord),
    Partition(PartitionRecord),
    Config(ConfigRecord),
    PartitionChange(PartitionChangeRecord),
    FenceBroker(FenceBrokerRecord),
    UnfenceBroker(UnfenceBrokerRecord),
    RemoveTopic(RemoveTopicRecord),
    FeatureLevel(FeatureLevelRecord),
    ProducerIds(ProducerIdsRecord),
    BrokerRegistrationChange(BrokerRegistrationChangeRecord),
    NoOp(NoOpRecord),
    UserScramCredential(UserScramCredentialRecord),
    RemoveUserScramCredential(RemoveUserScramCredentialRecord),
    AccessControlEntry(AccessControlEntryRecord),
    RemoveAccessControlEntry(RemoveAccessControlEntryRecord),
    ClientQuota(ClientQuotaRecord),
    DelegationToken(DelegationTokenRecord),
    RemoveDelegationToken(RemoveDelegationTokenRecord),
    /// Tiered storage: a remote segment (see [`crate::remote_log`]).
    RemoteLogSegmentMetadata(RemoteLogSegmentMetadataRecord),
    /// Tiered storage: a remote segment's state change.
    RemoteLogSegmentMetadataUpdate(RemoteLogSegmentMetadataUpdateRecord),
}

/// `(apiKey, highest version)` of every record type we write, from the JSON specs.
impl MetadataRecord {
    /// The record type's `apiKey` in Kafka's metadata specs.
    pub fn api_key(&self) -> u32 {
        self.key_version().0
    }

    fn key_version(&self) -> (u32, i16) {
        match self {
            MetadataRecord::RegisterBroker(_) => (0, 3),
            MetadataRecord::UnregisterBroker(_) => (1, 0),
            MetadataRecord::Topic(_) => (2, 0),
            MetadataRecord::Partition(_) => (3, 2),
            MetadataRecord::Config(_) => (4, 0),
            MetadataRecord::PartitionChange(_) => (5, 2),
            MetadataRecord::FenceBroker(_) => (7, 0),
            MetadataRecord::UnfenceBroker(_) => (8, 0),
            MetadataRecord::RemoveTopic(_) => (9, 0),
            MetadataRecord::FeatureLevel(_) => (12, 0),
            MetadataRecord::ProducerIds(_) => (15, 0),
            MetadataRecord::BrokerRegistrationChange(_) => (17, 2),
            MetadataRecord::NoOp(_) => (20, 0),
            MetadataRecord::UserScramCredential(_) => (11, 0),
            MetadataRecord::RemoveUserScramCredential(_) => (22, 0),
            MetadataRecord::AccessControlEntry(_) => (18, 0),
            MetadataRecord::RemoveAccessControlEntry(_) => (19, 0),
            MetadataRecord::ClientQuota(_) => (14, 0),
            MetadataRecord::DelegationToken(_) => (10, 0),
            MetadataRecord::RemoveDelegationToken(_) => (26, 0),
            MetadataRecord::RemoteLogSegmentMetadata(_) => (REMOTE_LOG_SEGMENT_METADATA_KEY, 0),
            MetadataRecord::RemoteLogSegmentMetadataUpdate(_) => {
                (REMOTE_LOG_SEGMENT_METADATA_UPDATE_KEY, 0)
            }
        }
    }

    /// Appends this record's frame (see the module docs) to `buf`.
    pub fn encode(&self, buf: &mut BytesMut) -> Result<(), MetadataError> {
        let (api_key, version) = self.key_version();
        put_unsigned_varint(buf, FRAME_VERSION);
        put_unsigned_varint(buf, api_key);
        put_unsigned_varint(buf, version as u32);
        match self {
            MetadataRecord::RegisterBroker(r) => r.encode(buf, version)?,
            MetadataRecord::UnregisterBroker(r) => r.encode(buf, version)?,
            MetadataRecord::Topic(r) => r.encode(buf, version)?,
            MetadataRecord::Partition(r) => r.encode(buf, version)?,
            MetadataRecord::Config(r) => r.encode(buf, version)?,
            MetadataRecord::PartitionChange(r) => r.encode(buf, version)?,
            MetadataRecord::FenceBroker(r) => r.encode(buf, version)?,
            MetadataRecord::UnfenceBroker(r) => r.encode(buf, version)?,
            MetadataRecord::RemoveTopic(r) => r.encode(buf, version)?,
            MetadataRecord::FeatureLevel(r) => r.encode(buf, version)?,
            MetadataRecord::ProducerIds(r) => r.encode(buf, version)?,
            MetadataRecord::BrokerRegistrationChange(r) => r.encode(buf, version)?,
            MetadataRecord::NoOp(r) => r.encode(buf, version)?,
            MetadataRecord::UserScramCredential(r) => r.encode(buf, version)?,
            MetadataRecord::RemoveUserScramCredential(r) => r.encode(buf, version)?,
            MetadataRecord::AccessControlEntry(r) => r.encode(buf, version)?,
            MetadataRecord::RemoveAccessControlEntry(r) => r.encode(buf, version)?,
            MetadataRecord::ClientQuota(r) => r.encode(buf, version)?,
            MetadataRecord::DelegationToken(r) => r.encode(buf, version)?,
            MetadataRecord::RemoveDelegationToken(r) => r.encode(buf, version)?,
            MetadataRecord::RemoteLogSegmentMetadata(r) => r.encode(buf, version)?,
            MetadataRecord::RemoteLogSegmentMetadataUpdate(r) => r.encode(buf, version)?,
        }
        Ok(())
    }

    /// This record's frame as bytes.
    pub fn to_bytes(&self) -> Result<Bytes, MetadataError> {
        let mut buf = BytesMut::new();
        self.encode(&mut buf)?;
        Ok(buf.freeze())
    }

    /// Reads one whole frame; trailing bytes are an error.
    pub fn decode(mut frame: Bytes) -> Result<MetadataRecord, MetadataError> {
        let frame_version = read_unsigned_varint(&mut frame)?;
        if frame_version != FRAME_VERSION {
            return Err(MetadataError::Corrupt {
                reason: "unknown metadata frame version",
            });
        }
        let api_key = read_unsigned_varint(&mut frame)?;
        let raw_version = read_unsigned_varint(&mut frame)?;
        let unknown = MetadataError::UnknownRecord {
            api_key,
            version: raw_version,
        };
        let version = i16::try_from(raw_version).map_err(|_| MetadataError::UnknownRecord {
            api_key,
            version: raw_version,
        })?;
        let max = match api_key {
            0 => 3,
            1 | 2 | 4 | 7 | 8 | 9 | 10 | 11 | 12 | 14 | 15 | 18 | 19 | 20 | 22 | 26 => 0,
            3 | 5 | 17 => 2,
            REMOTE_LOG_SEGMENT_METADATA_KEY | REMOTE_LOG_SEGMENT_METADATA_UPDATE_KEY => 0,
            _ => return Err(unknown),
        };
        if version > max {
            return Err(unknown);
        }
        let b = &mut frame;
        let record = match api_key {
            0 => MetadataRecord::RegisterBroker(RegisterBrokerRecord::decode(b, version)?),
            1 => MetadataRecord::UnregisterBroker(UnregisterBrokerRecord::decode(b, version)?),
            2 => MetadataRecord::Topic(TopicRecord::decode(b, version)?),
            3 => MetadataRecord::Partition(PartitionRecord::decode(b, version)?),
            4 => MetadataRecord::Config(ConfigRecord::decode(b, version)?),
            5 => MetadataRecord::PartitionChange(PartitionChangeRecord::decode(b, version)?),
            7 => MetadataRecord::FenceBroker(FenceBrokerRecord::decode(b, version)?),
            8 => MetadataRecord::UnfenceBroker(UnfenceBrokerRecord::decode(b, version)?),
            9 => MetadataRecord::RemoveTopic(RemoveTopicRecord::decode(b, version)?),
            12 => MetadataRecord::FeatureLevel(FeatureLevelRecord::decode(b, version)?),
            15 => MetadataRecord::ProducerIds(ProducerIdsRecord::decode(b, version)?),
            17 => MetadataRecord::BrokerRegistrationChange(BrokerRegistrationChangeRecord::decode(
                b, version,
            )?),
            20 => MetadataRecord::NoOp(NoOpRecord::decode(b, version)?),
            11 => {
                MetadataRecord::UserScramCredential(UserScramCredentialRecord::decode(b, version)?)
            }
            22 => MetadataRecord::RemoveUserScramCredential(
                RemoveUserScramCredentialRecord::decode(b, version)?,
            ),
            18 => MetadataRecord::AccessControlEntry(AccessControlEntryRecord::decode(b, version)?),
            19 => MetadataRecord::RemoveAccessControlEntry(RemoveAccessControlEntryRecord::decode(
                b, version,
            )?),
            14 => MetadataRecord::ClientQuota(ClientQuotaRecord::decode(b, version)?),
            10 => MetadataRecord::DelegationToken(DelegationTokenRecord::decode(b, version)?),
            26 => MetadataRecord::RemoveDelegationToken(RemoveDelegationTokenRecord::decode(
                b, version,
            )?),
            REMOTE_LOG_SEGMENT_METADATA_KEY => MetadataRecord::RemoteLogSegmentMetadata(
                RemoteLogSegmentMetadataRecord::decode(b, version)?,
            ),
            REMOTE_LOG_SEGMENT_METADATA_UPDATE_KEY => {
                MetadataRecord::RemoteLogSegmentMetadataUpdate(
                    RemoteLogSegmentMetadataUpdateRecord::decode(b, version)?,
                )
            }
            _ => return Err(unknown),
        };
        if !frame.is_empty() {
            return Err(MetadataError::Corrupt {
                reason: "bytes after the metadata record",
            });
        }
        Ok(record)
    }
}

/// Encodes `records` as one batch (see the module docs).
pub fn encode_batch(records: &[MetadataRecord]) -> Result<Bytes, MetadataError> {
    let mut buf = BytesMut::new();
    let count = u32::try_from(records.len()).map_err(|_| MetadataError::Corrupt {
        reason: "batch has more than u32::MAX records",
    })?;
    buf.put_u32(count);
    let mut frame = BytesMut::new();
    for record in records {
        frame.clear();
        record.encode(&mut frame)?;
        let len = u32::try_from(frame.len()).map_err(|_| MetadataError::Corrupt {
            reason: "record larger than u32::MAX bytes",
        })?;
        buf.put_u32(len);
        buf.put_slice(&frame);
    }
    Ok(buf.freeze())
}

/// Decodes a batch written by [`encode_batch`].
pub fn decode_batch(mut batch: Bytes) -> Result<Vec<MetadataRecord>, MetadataError> {
    const SHORT: MetadataError = MetadataError::Corrupt {
        reason: "metadata batch shorter than its header says",
    };
    if batch.remaining() < 4 {
        return Err(SHORT);
    }
    let count = batch.get_u32() as usize;
    // Every record takes at least its 4-byte length and a 3-byte frame header, so a
    // count the remaining bytes cannot hold is rejected before we reserve for it.
    if count > batch.remaining() / 7 {
        return Err(SHORT);
    }
    let mut records = Vec::with_capacity(count);
    for _ in 0..count {
        if batch.remaining() < 4 {
            return Err(SHORT);
        }
        let len = batch.get_u32() as usize;
        if batch.remaining() < len {
            return Err(SHORT);
        }
        records.push(MetadataRecord::decode(batch.split_to(len))?);
    }
    if !batch.is_empty() {
        return Err(MetadataError::Corrupt {
            reason: "bytes after the last record of a metadata batch",
        });
    }
    Ok(records)
}
