//! Kafka 4.2's `__consumer_offsets` format for the share group records of KIP-932
//! (kafka-group-coordinator-4.2.2.jar's `ShareGroup*` specs, `coordinator-key` and
//! `coordinator-value` records): the key is the record type as an `i16` (10
//! `ShareGroupMemberMetadataKey` ... 15 `ShareGroupStatePartitionMetadataKey`) and the
//! key's fields at version 0; the value is an `i16` version (0) and the value's flexible
//! body, or null for a tombstone.

use bytes::{BufMut, Bytes, BytesMut};
use rill_group::*;
use rill_protocol::generated::group_coordinator::{
    share_group_current_member_assignment_key as cak,
    share_group_current_member_assignment_value as cav, share_group_member_metadata_key as mmk,
    share_group_member_metadata_value as mmv, share_group_metadata_key as gmk,
    share_group_metadata_value as gmv, share_group_state_partition_metadata_key as spk,
    share_group_state_partition_metadata_value as spv,
    share_group_target_assignment_member_key as tak,
    share_group_target_assignment_member_value as tav,
    share_group_target_assignment_metadata_key as tmk,
    share_group_target_assignment_metadata_value as tmv,
};
use rill_protocol::{Decodable, Encodable};

use super::consumer_group_codec::{body, value};

/// The version of every share group key and value body (their specs have only 0).
const VERSION: i16 = 0;

/// Whether a key's type prefix is one of the share group record types.
pub fn is_share_group_key(record_type: i16) -> bool {
    (mmk::ShareGroupMemberMetadataKey::RECORD_TYPE
        ..=spk::ShareGroupStatePartitionMetadataKey::RECORD_TYPE)
        .contains(&record_type)
}

/// A key: its record type, then its body at version 0.
fn key<T: Encodable>(record_type: i16, body: &T) -> Result<Vec<u8>, String> {
    let mut buf = BytesMut::with_capacity(2 + body.encoded_len(VERSION));
    buf.put_i16(record_type);
    body.encode(&mut buf, VERSION).map_err(|e| e.to_string())?;
    Ok(buf.to_vec())
}

fn infos(list: &[ShareTopicPartitionsInfo]) -> Vec<spv::TopicPartitionsInfo> {
    list.iter()
        .map(|t| spv::TopicPartitionsInfo {
            topic_id: t.topic_id,
            topic_name: t.topic_name.clone(),
            partitions: t.partitions.clone(),
            ..Default::default()
        })
        .collect()
}

fn our_infos(list: Vec<spv::TopicPartitionsInfo>) -> Vec<ShareTopicPartitionsInfo> {
    list.into_iter()
        .map(|t| ShareTopicPartitionsInfo {
            topic_id: t.topic_id,
            topic_name: t.topic_name,
            partitions: t.partitions,
        })
        .collect()
}

/// A share group record's key and value in Kafka's format.
pub fn encode(record: &ShareGroupRecord) -> Result<(Vec<u8>, Option<Vec<u8>>), String> {
    match record {
        ShareGroupRecord::Metadata { group_id, value: v } => Ok((
            key(
                gmk::ShareGroupMetadataKey::RECORD_TYPE,
                &gmk::ShareGroupMetadataKey {
                    group_id: group_id.clone(),
                },
            )?,
            value(v.as_ref().map(|v| gmv::ShareGroupMetadataValue {
                epoch: v.epoch,
                metadata_hash: v.metadata_hash,
                ..Default::default()
            }))?,
        )),
        ShareGroupRecord::MemberMetadata {
            group_id,
            member_id,
            value: v,
        } => Ok((
            key(
                mmk::ShareGroupMemberMetadataKey::RECORD_TYPE,
                &mmk::ShareGroupMemberMetadataKey {
                    group_id: group_id.clone(),
                    member_id: member_id.clone(),
                },
            )?,
            value(v.as_ref().map(|v| mmv::ShareGroupMemberMetadataValue {
                rack_id: v.rack_id.clone(),
                client_id: v.client_id.clone(),
                client_host: v.client_host.clone(),
                subscribed_topic_names: v.subscribed_topic_names.clone(),
                ..Default::default()
            }))?,
        )),
        ShareGroupRecord::TargetAssignmentMetadata { group_id, value: v } => Ok((
            key(
                tmk::ShareGroupTargetAssignmentMetadataKey::RECORD_TYPE,
                &tmk::ShareGroupTargetAssignmentMetadataKey {
                    group_id: group_id.clone(),
                },
            )?,
            value(
                v.as_ref()
                    .map(|v| tmv::ShareGroupTargetAssignmentMetadataValue {
                        assignment_epoch: v.assignment_epoch,
                        ..Default::default()
                    }),
            )?,
        )),
        ShareGroupRecord::TargetAssignmentMember {
            group_id,
            member_id,
            value: v,
        } => Ok((
            key(
                tak::ShareGroupTargetAssignmentMemberKey::RECORD_TYPE,
                &tak::ShareGroupTargetAssignmentMemberKey {
                    group_id: group_id.clone(),
                    member_id: member_id.clone(),
                },
            )?,
            value(v.as_ref().map(|v| {
                tav::ShareGroupTargetAssignmentMemberValue {
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
        ShareGroupRecord::CurrentMemberAssignment {
            group_id,
            member_id,
            value: v,
        } => Ok((
            key(
                cak::ShareGroupCurrentMemberAssignmentKey::RECORD_TYPE,
                &cak::ShareGroupCurrentMemberAssignmentKey {
                    group_id: group_id.clone(),
                    member_id: member_id.clone(),
                },
            )?,
            value(v.as_ref().map(|v| {
                cav::ShareGroupCurrentMemberAssignmentValue {
                    member_epoch: v.member_epoch,
                    previous_member_epoch: v.previous_member_epoch,
                    state: v.state,
                    assigned_partitions: v
                        .assigned_partitions
                        .iter()
                        .map(|tp| cav::TopicPartitions {
                            topic_id: tp.topic_id,
                            partitions: tp.partitions.clone(),
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                }
            }))?,
        )),
        ShareGroupRecord::StatePartitionMetadata { group_id, value: v } => Ok((
            key(
                spk::ShareGroupStatePartitionMetadataKey::RECORD_TYPE,
                &spk::ShareGroupStatePartitionMetadataKey {
                    group_id: group_id.clone(),
                },
            )?,
            value(v.as_ref().map(|v| {
                spv::ShareGroupStatePartitionMetadataValue {
                    initializing_topics: infos(&v.initializing_topics),
                    initialized_topics: infos(&v.initialized_topics),
                    deleting_topics: v
                        .deleting_topics
                        .iter()
                        .map(|t| spv::TopicInfo {
                            topic_id: t.topic_id,
                            topic_name: t.topic_name.clone(),
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                }
            }))?,
        )),
    }
}

/// A share group record from its key (type prefix and body) and value; `None` for one
/// that does not decode.
pub fn decode(
    record_type: i16,
    mut key: Bytes,
    value: Option<(i16, Bytes)>,
) -> Option<ShareGroupRecord> {
    let r = match record_type {
        gmk::ShareGroupMetadataKey::RECORD_TYPE => {
            let k = gmk::ShareGroupMetadataKey::decode(&mut key, VERSION).ok()?;
            let v: Option<gmv::ShareGroupMetadataValue> = body(value).ok()?;
            ShareGroupRecord::Metadata {
                group_id: k.group_id,
                value: v.map(|v| ShareGroupMetadataValue {
                    epoch: v.epoch,
                    metadata_hash: v.metadata_hash,
                }),
            }
        }
        mmk::ShareGroupMemberMetadataKey::RECORD_TYPE => {
            let k = mmk::ShareGroupMemberMetadataKey::decode(&mut key, VERSION).ok()?;
            let v: Option<mmv::ShareGroupMemberMetadataValue> = body(value).ok()?;
            ShareGroupRecord::MemberMetadata {
                group_id: k.group_id,
                member_id: k.member_id,
                value: v.map(|v| ShareGroupMemberMetadataValue {
                    rack_id: v.rack_id,
                    client_id: v.client_id,
                    client_host: v.client_host,
                    subscribed_topic_names: v.subscribed_topic_names,
                }),
            }
        }
        tmk::ShareGroupTargetAssignmentMetadataKey::RECORD_TYPE => {
            let k = tmk::ShareGroupTargetAssignmentMetadataKey::decode(&mut key, VERSION).ok()?;
            let v: Option<tmv::ShareGroupTargetAssignmentMetadataValue> = body(value).ok()?;
            ShareGroupRecord::TargetAssignmentMetadata {
                group_id: k.group_id,
                value: v.map(|v| ShareGroupTargetAssignmentMetadataValue {
                    assignment_epoch: v.assignment_epoch,
                }),
            }
        }
        tak::ShareGroupTargetAssignmentMemberKey::RECORD_TYPE => {
            let k = tak::ShareGroupTargetAssignmentMemberKey::decode(&mut key, VERSION).ok()?;
            let v: Option<tav::ShareGroupTargetAssignmentMemberValue> = body(value).ok()?;
            ShareGroupRecord::TargetAssignmentMember {
                group_id: k.group_id,
                member_id: k.member_id,
                value: v.map(|v| ShareGroupTargetAssignmentMemberValue {
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
        cak::ShareGroupCurrentMemberAssignmentKey::RECORD_TYPE => {
            let k = cak::ShareGroupCurrentMemberAssignmentKey::decode(&mut key, VERSION).ok()?;
            let v: Option<cav::ShareGroupCurrentMemberAssignmentValue> = body(value).ok()?;
            ShareGroupRecord::CurrentMemberAssignment {
                group_id: k.group_id,
                member_id: k.member_id,
                value: v.map(|v| ShareGroupCurrentMemberAssignmentValue {
                    member_epoch: v.member_epoch,
                    previous_member_epoch: v.previous_member_epoch,
                    state: v.state,
                    assigned_partitions: v
                        .assigned_partitions
                        .into_iter()
                        .map(|tp| TopicPartitions {
                            topic_id: tp.topic_id,
                            partitions: tp.partitions,
                        })
                        .collect(),
                }),
            }
        }
        spk::ShareGroupStatePartitionMetadataKey::RECORD_TYPE => {
            let k = spk::ShareGroupStatePartitionMetadataKey::decode(&mut key, VERSION).ok()?;
            let v: Option<spv::ShareGroupStatePartitionMetadataValue> = body(value).ok()?;
            ShareGroupRecord::StatePartitionMetadata {
                group_id: k.group_id,
                value: v.map(|v| ShareGroupStatePartitionMetadataValue {
                    initializing_topics: our_infos(v.initializing_topics),
                    initialized_topics: our_infos(v.initialized_topics),
                    deleting_topics: v
                        .deleting_topics
                        .into_iter()
                        .map(|t| ShareTopicInfo {
                            topic_id: t.topic_id,
                            topic_name: t.topic_name,
                        })
                        .collect(),
                }),
            }
        }
        _ => return None,
    };
    Some(r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rill_protocol::Uuid;

    fn round_trip(r: ShareGroupRecord) {
        let (k, v) = encode(&r).unwrap();
        let mut key = Bytes::from(k);
        let record_type = i16::from_be_bytes([key[0], key[1]]);
        assert!(is_share_group_key(record_type));
        key = key.slice(2..);
        let value = v.map(|v| (i16::from_be_bytes([v[0], v[1]]), Bytes::from(v).slice(2..)));
        assert_eq!(decode(record_type, key, value), Some(r));
    }

    #[test]
    fn share_group_records_round_trip_through_kafka_4_2_formats() {
        let g = || "g".to_owned();
        let m = || "m".to_owned();
        let tps = vec![TopicPartitions {
            topic_id: Uuid([3; 16]),
            partitions: vec![0, 2],
        }];
        let info = ShareTopicPartitionsInfo {
            topic_id: Uuid([3; 16]),
            topic_name: "orders".into(),
            partitions: vec![0, 1],
        };
        for r in [
            ShareGroupRecord::Metadata {
                group_id: g(),
                value: Some(ShareGroupMetadataValue {
                    epoch: 4,
                    metadata_hash: -77,
                }),
            },
            ShareGroupRecord::Metadata {
                group_id: g(),
                value: None,
            },
            ShareGroupRecord::MemberMetadata {
                group_id: g(),
                member_id: m(),
                value: Some(ShareGroupMemberMetadataValue {
                    rack_id: Some("r1".into()),
                    client_id: "c".into(),
                    client_host: "/10.0.0.1".into(),
                    subscribed_topic_names: vec!["orders".into()],
                }),
            },
            ShareGroupRecord::TargetAssignmentMetadata {
                group_id: g(),
                value: Some(ShareGroupTargetAssignmentMetadataValue {
                    assignment_epoch: 4,
                }),
            },
            ShareGroupRecord::TargetAssignmentMember {
                group_id: g(),
                member_id: m(),
                value: Some(ShareGroupTargetAssignmentMemberValue {
                    topic_partitions: tps.clone(),
                }),
            },
            ShareGroupRecord::CurrentMemberAssignment {
                group_id: g(),
                member_id: m(),
                value: Some(ShareGroupCurrentMemberAssignmentValue {
                    member_epoch: 4,
                    previous_member_epoch: 3,
                    state: 0,
                    assigned_partitions: tps.clone(),
                }),
            },
            ShareGroupRecord::CurrentMemberAssignment {
                group_id: g(),
                member_id: m(),
                value: None,
            },
            ShareGroupRecord::StatePartitionMetadata {
                group_id: g(),
                value: Some(ShareGroupStatePartitionMetadataValue {
                    initializing_topics: vec![info.clone()],
                    initialized_topics: vec![info.clone()],
                    deleting_topics: vec![ShareTopicInfo {
                        topic_id: Uuid([9; 16]),
                        topic_name: "gone".into(),
                    }],
                }),
            },
        ] {
            round_trip(r);
        }
    }

    /// The key layout Kafka's `CoordinatorRecordSerde` writes: the record type, then the
    /// group id as an `i16`-length string (the key specs are not flexible).
    #[test]
    fn a_share_group_metadata_key_has_kafkas_bytes() {
        let (k, _) = encode(&ShareGroupRecord::Metadata {
            group_id: "g".into(),
            value: None,
        })
        .unwrap();
        assert_eq!(k, vec![0, 11, 0, 1, b'g']);
    }
}
