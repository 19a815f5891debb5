//! Kafka's `__consumer_offsets` format for the consumer group records of KIP-848: the key
//! is the record type as an `i16` version (3 `ConsumerGroupMetadataKey` ... 8
//! `ConsumerGroupCurrentMemberAssignmentKey`) and the key's fields; the value is an `i16`
//! version (0) and the value's flexible body, or null for a tombstone. Kafka's own tools
//! (`kafka-dump-log --offsets-decoder`) read them.

use bytes::Bytes;
use rill_group::*;
use rill_protocol::generated::group_coordinator::{
    consumer_group_current_member_assignment_key as cak,
    consumer_group_current_member_assignment_value as cav,
    consumer_group_member_metadata_key as mmk, consumer_group_member_metadata_value as mmv,
    consumer_group_metadata_key as gmk, consumer_group_metadata_value as gmv,
    consumer_group_partition_metadata_key as pmk, consumer_group_partition_metadata_value as pmv,
    consumer_group_target_assignment_member_key as tak,
    consumer_group_target_assignment_member_value as tav,
    consumer_group_target_assignment_metadata_key as tmk,
    consumer_group_target_assignment_metadata_value as tmv,
};
use rill_protocol::{Decodable, Encodable};

use super::group_coordinator::encode_versioned;

const METADATA: i16 = 3;
const PARTITION_METADATA: i16 = 4;
const MEMBER_METADATA: i16 = 5;
const TARGET_ASSIGNMENT_METADATA: i16 = 6;
const TARGET_ASSIGNMENT_MEMBER: i16 = 7;
const CURRENT_MEMBER_ASSIGNMENT: i16 = 8;
const VALUE_VERSION: i16 = 0;

/// Whether a key version is one of the consumer group record types.
pub fn is_consumer_group_key(version: i16) -> bool {
    (METADATA..=CURRENT_MEMBER_ASSIGNMENT).contains(&version)
}

/// A value in Kafka's format (version 0), or `None` for a tombstone; the share groups'
/// codec writes its values the same way.
pub(crate) fn value<T: Encodable>(v: Option<T>) -> Result<Option<Vec<u8>>, String> {
    v.map(|v| encode_versioned(VALUE_VERSION, &v)).transpose()
}

fn wire_partitions(list: &[TopicPartitions]) -> Vec<cav::TopicPartitions> {
    list.iter()
        .map(|tp| cav::TopicPartitions {
            topic_id: tp.topic_id,
            partitions: tp.partitions.clone(),
            ..Default::default()
        })
        .collect()
}

fn our_partitions(list: Vec<cav::TopicPartitions>) -> Vec<TopicPartitions> {
    list.into_iter()
        .map(|tp| TopicPartitions {
            topic_id: tp.topic_id,
            partitions: tp.partitions,
        })
        .collect()
}

/// A consumer group record's key and value in Kafka's format.
pub fn encode(record: &ConsumerGroupRecord) -> Result<(Vec<u8>, Option<Vec<u8>>), String> {
    match record {
        ConsumerGroupRecord::Metadata { group_id, value: v } => Ok((
            encode_versioned(
                METADATA,
                &gmk::ConsumerGroupMetadataKey {
                    group_id: group_id.clone(),
                },
            )?,
            value(v.as_ref().map(|v| gmv::ConsumerGroupMetadataValue {
                epoch: v.epoch,
                ..Default::default()
            }))?,
        )),
        ConsumerGroupRecord::PartitionMetadata { group_id, value: v } => Ok((
            encode_versioned(
                PARTITION_METADATA,
                &pmk::ConsumerGroupPartitionMetadataKey {
                    group_id: group_id.clone(),
                },
            )?,
            value(v.as_ref().map(|v| {
                pmv::ConsumerGroupPartitionMetadataValue {
                    topics: v
                        .topics
                        .iter()
                        .map(|t| pmv::TopicMetadata {
                            topic_id: t.topic_id,
                            topic_name: t.topic_name.clone(),
                            num_partitions: t.num_partitions,
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                }
            }))?,
        )),
        ConsumerGroupRecord::MemberMetadata {
            group_id,
            member_id,
            value: v,
        } => Ok((
            encode_versioned(
                MEMBER_METADATA,
                &mmk::ConsumerGroupMemberMetadataKey {
                    group_id: group_id.clone(),
                    member_id: member_id.clone(),
                },
            )?,
            value(v.as_ref().map(|v| mmv::ConsumerGroupMemberMetadataValue {
                instance_id: v.instance_id.clone(),
                rack_id: v.rack_id.clone(),
                client_id: v.client_id.clone(),
                client_host: v.client_host.clone(),
                subscribed_topic_names: v.subscribed_topic_names.clone(),
                subscribed_topic_regex: v.subscribed_topic_regex.clone(),
                rebalance_timeout_ms: v.rebalance_timeout_ms,
                server_assignor: v.server_assignor.clone(),
                classic_member_metadata: v.classic_member_metadata.as_ref().map(|c| {
                    mmv::ClassicMemberMetadata {
                        session_timeout_ms: c.session_timeout_ms,
                        supported_protocols: c
                            .supported_protocols
                            .iter()
                            .map(|(name, metadata)| mmv::ClassicProtocol {
                                name: name.clone(),
                                metadata: metadata.clone(),
                                ..Default::default()
                            })
                            .collect(),
                        ..Default::default()
                    }
                }),
                ..Default::default()
            }))?,
        )),
        ConsumerGroupRecord::TargetAssignmentMetadata { group_id, value: v } => Ok((
            encode_versioned(
                TARGET_ASSIGNMENT_METADATA,
                &tmk::ConsumerGroupTargetAssignmentMetadataKey {
                    group_id: group_id.clone(),
                },
            )?,
            value(
                v.as_ref()
                    .map(|v| tmv::ConsumerGroupTargetAssignmentMetadataValue {
                        assignment_epoch: v.assignment_epoch,
                        ..Default::default()
                    }),
            )?,
        )),
        ConsumerGroupRecord::TargetAssignmentMember {
            group_id,
            member_id,
            value: v,
        } => Ok((
            encode_versioned(
                TARGET_ASSIGNMENT_MEMBER,
                &tak::ConsumerGroupTargetAssignmentMemberKey {
                    group_id: group_id.clone(),
                    member_id: member_id.clone(),
                },
            )?,
            value(v.as_ref().map(|v| {
                tav::ConsumerGroupTargetAssignmentMemberValue {
                    topic_partitions: v
                        .topic_partitions
                        .iter()
                        .map(|tp| tav::TopicPartition {
                            topic_id: tp.topic_id,
                            partitions: tp.partitions.clone(),
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                }
            }))?,
        )),
        ConsumerGroupRecord::CurrentMemberAssignment {
            group_id,
            member_id,
            value: v,
        } => Ok((
            encode_versioned(
                CURRENT_MEMBER_ASSIGNMENT,
                &cak::ConsumerGroupCurrentMemberAssignmentKey {
                    group_id: group_id.clone(),
                    member_id: member_id.clone(),
                },
            )?,
            value(
                v.as_ref()
                    .map(|v| cav::ConsumerGroupCurrentMemberAssignmentValue {
                        member_epoch: v.member_epoch,
                        previous_member_epoch: v.previous_member_epoch,
                        state: v.state,
                        assigned_partitions: wire_partitions(&v.assigned_partitions),
                        partitions_pending_revocation: wire_partitions(
                            &v.partitions_pending_revocation,
                        ),
                        ..Default::default()
                    }),
            )?,
        )),
    }
}

/// Decodes a value of `T` at its version; `None` when it does not decode.
pub(crate) fn body<T: Decodable>(v: Option<(i16, Bytes)>) -> Result<Option<T>, ()> {
    match v {
        None => Ok(None),
        Some((version, mut b)) => T::decode(&mut b, version).map(Some).map_err(|_| ()),
    }
}

/// A consumer group record from its key (version and body) and value; `None` for one
/// that does not decode.
pub fn decode(
    key_version: i16,
    mut key: Bytes,
    value: Option<(i16, Bytes)>,
) -> Option<ConsumerGroupRecord> {
    let r = match key_version {
        METADATA => {
            let k = gmk::ConsumerGroupMetadataKey::decode(&mut key, key_version).ok()?;
            let v: Option<gmv::ConsumerGroupMetadataValue> = body(value).ok()?;
            ConsumerGroupRecord::Metadata {
                group_id: k.group_id,
                value: v.map(|v| ConsumerGroupMetadataValue { epoch: v.epoch }),
            }
        }
        PARTITION_METADATA => {
            let k = pmk::ConsumerGroupPartitionMetadataKey::decode(&mut key, key_version).ok()?;
            let v: Option<pmv::ConsumerGroupPartitionMetadataValue> = body(value).ok()?;
            ConsumerGroupRecord::PartitionMetadata {
                group_id: k.group_id,
                value: v.map(|v| ConsumerGroupPartitionMetadataValue {
                    topics: v
                        .topics
                        .into_iter()
                        .map(|t| ConsumerGroupTopicMetadata {
                            topic_id: t.topic_id,
                            topic_name: t.topic_name,
                            num_partitions: t.num_partitions,
                        })
                        .collect(),
                }),
            }
        }
        MEMBER_METADATA => {
            let k = mmk::ConsumerGroupMemberMetadataKey::decode(&mut key, key_version).ok()?;
            let v: Option<mmv::ConsumerGroupMemberMetadataValue> = body(value).ok()?;
            ConsumerGroupRecord::MemberMetadata {
                group_id: k.group_id,
                member_id: k.member_id,
                value: v.map(|v| ConsumerGroupMemberMetadataValue {
                    instance_id: v.instance_id,
                    rack_id: v.rack_id,
                    client_id: v.client_id,
                    client_host: v.client_host,
                    subscribed_topic_names: v.subscribed_topic_names,
                    subscribed_topic_regex: v.subscribed_topic_regex,
                    rebalance_timeout_ms: v.rebalance_timeout_ms,
                    server_assignor: v.server_assignor,
                    classic_member_metadata: v.classic_member_metadata.map(|c| {
                        ClassicMemberMetadata {
                            session_timeout_ms: c.session_timeout_ms,
                            supported_protocols: c
                                .supported_protocols
                                .into_iter()
                                .map(|p| (p.name, p.metadata))
                                .collect(),
                        }
                    }),
                }),
            }
        }
        TARGET_ASSIGNMENT_METADATA => {
            let k = tmk::ConsumerGroupTargetAssignmentMetadataKey::decode(&mut key, key_version)
                .ok()?;
            let v: Option<tmv::ConsumerGroupTargetAssignmentMetadataValue> = body(value).ok()?;
            ConsumerGroupRecord::TargetAssignmentMetadata {
                group_id: k.group_id,
                value: v.map(|v| ConsumerGroupTargetAssignmentMetadataValue {
                    assignment_epoch: v.assignment_epoch,
                }),
            }
        }
        TARGET_ASSIGNMENT_MEMBER => {
            let k =
                tak::ConsumerGroupTargetAssignmentMemberKey::decode(&mut key, key_version).ok()?;
            let v: Option<tav::ConsumerGroupTargetAssignmentMemberValue> = body(value).ok()?;
            ConsumerGroupRecord::TargetAssignmentMember {
                group_id: k.group_id,
                member_id: k.member_id,
                value: v.map(|v| ConsumerGroupTargetAssignmentMemberValue {
                    topic_partitions: v
                        .topic_partitions
                        .into_iter()
                        .map(|tp| TopicPartitions {
                            topic_id: tp.topic_id,
                            partitions: tp.partitions,
                        })
                        .collect(),
                }),
            }
        }
        CURRENT_MEMBER_ASSIGNMENT => {
            let k =
                cak::ConsumerGroupCurrentMemberAssignmentKey::decode(&mut key, key_version).ok()?;
            let v: Option<cav::ConsumerGroupCurrentMemberAssignmentValue> = body(value).ok()?;
            ConsumerGroupRecord::CurrentMemberAssignment {
                group_id: k.group_id,
                member_id: k.member_id,
                value: v.map(|v| ConsumerGroupCurrentMemberAssignmentValue {
                    member_epoch: v.member_epoch,
                    previous_member_epoch: v.previous_member_epoch,
                    state: v.state,
                    assigned_partitions: our_partitions(v.assigned_partitions),
                    partitions_pending_revocation: our_partitions(v.partitions_pending_revocation),
                }),
            }
        }
        _ => return None,
    };
    Some(r)
}
