//! Kafka's `__share_group_state` format for `rill-share`'s records: the key is the record
//! type as an `i16` (0 `ShareSnapshotKey`, 1 `ShareUpdateKey`) and the key's fields at
//! version 0; the value is an `i16` version (0) and the value's flexible body, or null for a
//! tombstone (Kafka's `CoordinatorRecordSerde`). Kafka's own tools
//! (`kafka-dump-log --share-group-state-decoder`) read them.

use bytes::{Buf, Bytes};
use rill_protocol::generated::share_coordinator::{
    share_snapshot_value as snap, share_update_value as upd, ShareSnapshotKey, ShareUpdateKey,
};
use rill_protocol::{Decodable, Encodable};
use rill_share::{
    RecordState, ShareCoordinatorRecord, SharePartitionKey, ShareSnapshotValue, ShareUpdateValue,
    StateBatch,
};

use super::group_coordinator::encode_versioned;

const SNAPSHOT: i16 = ShareSnapshotKey::RECORD_TYPE;
const UPDATE: i16 = ShareUpdateKey::RECORD_TYPE;
/// Both keys are written at version 0 after their record type.
const KEY_VERSION: i16 = 0;
const VALUE_VERSION: i16 = 0;

/// Why a stored record is not one of ours.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShareRecordError {
    #[error("record too short for its {0}")]
    Truncated(&'static str),
    #[error("unknown record type {0}")]
    UnknownType(i16),
    #[error("unreadable {what}: {reason}")]
    Body { what: &'static str, reason: String },
    #[error("unknown delivery state {0}")]
    DeliveryState(i8),
}

fn encode_key<T: Encodable>(record_type: i16, key: &T) -> Result<Vec<u8>, String> {
    let mut out = record_type.to_be_bytes().to_vec();
    let mut body = bytes::BytesMut::with_capacity(key.encoded_len(KEY_VERSION));
    key.encode(&mut body, KEY_VERSION)
        .map_err(|e| e.to_string())?;
    out.extend_from_slice(&body);
    Ok(out)
}

fn snapshot_batches(batches: &[StateBatch]) -> Vec<snap::StateBatch> {
    batches
        .iter()
        .map(|b| snap::StateBatch {
            first_offset: b.first_offset,
            last_offset: b.last_offset,
            delivery_state: b.delivery_state.id(),
            delivery_count: b.delivery_count,
            ..Default::default()
        })
        .collect()
}

fn update_batches(batches: &[StateBatch]) -> Vec<upd::StateBatch> {
    batches
        .iter()
        .map(|b| upd::StateBatch {
            first_offset: b.first_offset,
            last_offset: b.last_offset,
            delivery_state: b.delivery_state.id(),
            delivery_count: b.delivery_count,
            ..Default::default()
        })
        .collect()
}

fn our_batch(
    first_offset: i64,
    last_offset: i64,
    delivery_state: i8,
    delivery_count: i16,
) -> Result<StateBatch, ShareRecordError> {
    let state = RecordState::from_id(delivery_state)
        .ok_or(ShareRecordError::DeliveryState(delivery_state))?;
    Ok(StateBatch::new(
        first_offset,
        last_offset,
        state,
        delivery_count,
    ))
}

/// A record's key and value (`None` for a tombstone) in Kafka's format.
pub fn encode(record: &ShareCoordinatorRecord) -> Result<(Vec<u8>, Option<Vec<u8>>), String> {
    match record {
        ShareCoordinatorRecord::ShareSnapshot { key, value } => {
            let k = ShareSnapshotKey {
                group_id: key.group_id.clone(),
                topic_id: key.topic_id,
                partition: key.partition,
            };
            let v = value
                .as_ref()
                .map(|v| {
                    encode_versioned(
                        VALUE_VERSION,
                        &snap::ShareSnapshotValue {
                            snapshot_epoch: v.snapshot_epoch,
                            state_epoch: v.state_epoch,
                            leader_epoch: v.leader_epoch,
                            start_offset: v.start_offset,
                            delivery_complete_count: v.delivery_complete_count,
                            create_timestamp: v.create_timestamp_ms,
                            write_timestamp: v.write_timestamp_ms,
                            state_batches: snapshot_batches(&v.state_batches),
                            ..Default::default()
                        },
                    )
                })
                .transpose()?;
            Ok((encode_key(SNAPSHOT, &k)?, v))
        }
        ShareCoordinatorRecord::ShareUpdate { key, value } => {
            let k = ShareUpdateKey {
                group_id: key.group_id.clone(),
                topic_id: key.topic_id,
                partition: key.partition,
            };
            let v = value
                .as_ref()
                .map(|v| {
                    encode_versioned(
                        VALUE_VERSION,
                        &upd::ShareUpdateValue {
                            snapshot_epoch: v.snapshot_epoch,
                            leader_epoch: v.leader_epoch,
                            start_offset: v.start_offset,
                            delivery_complete_count: v.delivery_complete_count,
                            state_batches: update_batches(&v.state_batches),
                            ..Default::default()
                        },
                    )
                })
                .transpose()?;
            Ok((encode_key(UPDATE, &k)?, v))
        }
    }
}

fn read_i16(buf: &mut Bytes, what: &'static str) -> Result<i16, ShareRecordError> {
    if buf.remaining() < 2 {
        return Err(ShareRecordError::Truncated(what));
    }
    Ok(buf.get_i16())
}

fn body<T: Decodable>(
    buf: &mut Bytes,
    version: i16,
    what: &'static str,
) -> Result<T, ShareRecordError> {
    T::decode(buf, version).map_err(|e| ShareRecordError::Body {
        what,
        reason: e.to_string(),
    })
}

/// A stored record of `__share_group_state` from its key and value bytes.
pub fn decode(
    key: &[u8],
    value: Option<&[u8]>,
) -> Result<ShareCoordinatorRecord, ShareRecordError> {
    let mut key = Bytes::copy_from_slice(key);
    let record_type = read_i16(&mut key, "record type")?;
    let mut value = value.map(Bytes::copy_from_slice);
    let value_version = match value.as_mut() {
        Some(v) => Some(read_i16(v, "value version")?),
        None => None,
    };
    match record_type {
        SNAPSHOT => {
            let k: ShareSnapshotKey = body(&mut key, KEY_VERSION, "ShareSnapshotKey")?;
            let key = SharePartitionKey::new(k.group_id, k.topic_id, k.partition);
            let value = match (value, value_version) {
                (Some(mut v), Some(version)) => {
                    let v: snap::ShareSnapshotValue = body(&mut v, version, "ShareSnapshotValue")?;
                    let state_batches = v
                        .state_batches
                        .iter()
                        .map(|b| {
                            our_batch(
                                b.first_offset,
                                b.last_offset,
                                b.delivery_state,
                                b.delivery_count,
                            )
                        })
                        .collect::<Result<_, _>>()?;
                    Some(ShareSnapshotValue {
                        snapshot_epoch: v.snapshot_epoch,
                        state_epoch: v.state_epoch,
                        leader_epoch: v.leader_epoch,
                        start_offset: v.start_offset,
                        delivery_complete_count: v.delivery_complete_count,
                        create_timestamp_ms: v.create_timestamp,
                        write_timestamp_ms: v.write_timestamp,
                        state_batches,
                    })
                }
                _ => None,
            };
            Ok(ShareCoordinatorRecord::ShareSnapshot { key, value })
        }
        UPDATE => {
            let k: ShareUpdateKey = body(&mut key, KEY_VERSION, "ShareUpdateKey")?;
            let key = SharePartitionKey::new(k.group_id, k.topic_id, k.partition);
            let value = match (value, value_version) {
                (Some(mut v), Some(version)) => {
                    let v: upd::ShareUpdateValue = body(&mut v, version, "ShareUpdateValue")?;
                    let state_batches = v
                        .state_batches
                        .iter()
                        .map(|b| {
                            our_batch(
                                b.first_offset,
                                b.last_offset,
                                b.delivery_state,
                                b.delivery_count,
                            )
                        })
                        .collect::<Result<_, _>>()?;
                    Some(ShareUpdateValue {
                        snapshot_epoch: v.snapshot_epoch,
                        leader_epoch: v.leader_epoch,
                        start_offset: v.start_offset,
                        delivery_complete_count: v.delivery_complete_count,
                        state_batches,
                    })
                }
                _ => None,
            };
            Ok(ShareCoordinatorRecord::ShareUpdate { key, value })
        }
        other => Err(ShareRecordError::UnknownType(other)),
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use rill_protocol::Uuid;

    use super::*;

    fn key() -> SharePartitionKey {
        SharePartitionKey::new(
            "g1",
            Uuid::from_u64_pair(0x0102_0304_0506_0708, 0x090a_0b0c_0d0e_0f10),
            3,
        )
    }

    /// The bytes Kafka's `CoordinatorRecordSerde` writes for a `ShareUpdate`, laid out by
    /// hand from the specs: record type 1, the key at version 0; value version 0, the
    /// flexible body.
    #[test]
    fn share_update_golden_bytes() {
        let record = ShareCoordinatorRecord::ShareUpdate {
            key: key(),
            value: Some(ShareUpdateValue {
                snapshot_epoch: 2,
                leader_epoch: 5,
                start_offset: 100,
                delivery_complete_count: -1,
                state_batches: vec![StateBatch::new(100, 109, RecordState::Acknowledged, 1)],
            }),
        };
        let (k, v) = encode(&record).unwrap();
        let mut want_key = vec![0, 1, 0, 2, b'g', b'1'];
        want_key.extend_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]);
        want_key.extend_from_slice(&[0, 0, 0, 3]);
        assert_eq!(k, want_key);
        let mut want_value = vec![0, 0];
        want_value.extend_from_slice(&2i32.to_be_bytes());
        want_value.extend_from_slice(&5i32.to_be_bytes());
        want_value.extend_from_slice(&100i64.to_be_bytes());
        // One batch (compact array length + 1), its fields, its empty tagged fields.
        want_value.push(2);
        want_value.extend_from_slice(&100i64.to_be_bytes());
        want_value.extend_from_slice(&109i64.to_be_bytes());
        want_value.push(2);
        want_value.extend_from_slice(&1i16.to_be_bytes());
        want_value.push(0);
        // The value's tagged fields: DeliveryCompleteCount at its default is not written.
        want_value.push(0);
        assert_eq!(v.as_deref(), Some(&want_value[..]));
        assert_eq!(decode(&k, v.as_deref()).unwrap(), record);
    }

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// The bytes Kafka 4.2.2's own classes write (`MessageUtil.toCoordinatorTypePrefixedBytes`
    /// of the generated `ShareUpdateKey`/`ShareSnapshotKey`, `toVersionPrefixedBytes(0, ..)`
    /// of the values, as `CoordinatorRecordSerde` does), taken from a small Java program run
    /// against `kafka-share-coordinator-4.2.2.jar`; the snapshot carries the tagged
    /// DeliveryCompleteCount.
    #[test]
    fn kafkas_own_bytes_decode_and_encode_alike() {
        let update = (
            "0001000267310102030405060708090a0b0c0d0e0f1000000003",
            "000000000002000000050000000000000064020000000000000064000000000000006d0200010000",
            ShareCoordinatorRecord::ShareUpdate {
                key: key(),
                value: Some(ShareUpdateValue {
                    snapshot_epoch: 2,
                    leader_epoch: 5,
                    start_offset: 100,
                    delivery_complete_count: -1,
                    state_batches: vec![StateBatch::new(100, 109, RecordState::Acknowledged, 1)],
                }),
            },
        );
        let snapshot = (
            "0000000267310102030405060708090a0b0c0d0e0f1000000003",
            "000000000001000000020000000300000000000000280000018bcfe568000000018bcfe569f403000000\
             00000000280000000000000031040003000000000000000032000000000000003b0000010001000400000007",
            ShareCoordinatorRecord::ShareSnapshot {
                key: key(),
                value: Some(ShareSnapshotValue {
                    snapshot_epoch: 1,
                    state_epoch: 2,
                    leader_epoch: 3,
                    start_offset: 40,
                    delivery_complete_count: 7,
                    create_timestamp_ms: 1_700_000_000_000,
                    write_timestamp_ms: 1_700_000_000_500,
                    state_batches: vec![
                        StateBatch::new(40, 49, RecordState::Archived, 3),
                        StateBatch::new(50, 59, RecordState::Available, 1),
                    ],
                }),
            },
        );
        for (k, v, record) in [update, snapshot] {
            let (k, v) = (unhex(k), unhex(v));
            assert_eq!(decode(&k, Some(&v)).unwrap(), record);
            assert_eq!(encode(&record).unwrap(), (k, Some(v)));
        }
    }

    #[test]
    fn tombstones_round_trip() {
        for record in [
            ShareCoordinatorRecord::ShareSnapshot {
                key: key(),
                value: None,
            },
            ShareCoordinatorRecord::ShareUpdate {
                key: key(),
                value: None,
            },
        ] {
            let (k, v) = encode(&record).unwrap();
            assert!(v.is_none());
            assert_eq!(decode(&k, None).unwrap(), record);
        }
    }

    #[test]
    fn bad_bytes_are_errors() {
        assert_eq!(
            decode(&[0], None),
            Err(ShareRecordError::Truncated("record type"))
        );
        assert_eq!(
            decode(&[0, 9, 0, 0], None),
            Err(ShareRecordError::UnknownType(9))
        );
        assert!(matches!(
            decode(&[0, 0, 0, 5, b'g'], None),
            Err(ShareRecordError::Body { .. })
        ));
        // A consumer offsets key (version 1) is not ours either.
        assert!(decode(&[0, 1], None).is_err());
        let (k, _) = encode(&ShareCoordinatorRecord::ShareUpdate {
            key: key(),
            value: None,
        })
        .unwrap();
        assert!(matches!(
            decode(&k, Some(&[0])),
            Err(ShareRecordError::Truncated("value version"))
        ));
    }

    fn batch() -> impl Strategy<Value = StateBatch> {
        (
            0i64..1_000_000,
            0i64..1000,
            prop::sample::select(vec![
                RecordState::Available,
                RecordState::Acknowledged,
                RecordState::Archived,
            ]),
            0i16..10,
        )
            .prop_map(|(first, len, state, count)| {
                StateBatch::new(first, first + len, state, count)
            })
    }

    fn record() -> impl Strategy<Value = ShareCoordinatorRecord> {
        let key = ("[a-z]{1,12}", any::<u64>(), any::<u64>(), 0i32..100)
            .prop_map(|(g, a, b, p)| SharePartitionKey::new(g, Uuid::from_u64_pair(a, b), p));
        let batches = prop::collection::vec(batch(), 0..5);
        (
            key,
            any::<bool>(),
            any::<bool>(),
            any::<(i32, i32, i32, i64, i32, i64, i64)>(),
            batches,
        )
            .prop_map(
                |(key, snapshot, tombstone, (se, ste, le, so, dcc, ct, wt), state_batches)| match (
                    snapshot, tombstone,
                ) {
                    (true, true) => ShareCoordinatorRecord::ShareSnapshot { key, value: None },
                    (false, true) => ShareCoordinatorRecord::ShareUpdate { key, value: None },
                    (true, false) => ShareCoordinatorRecord::ShareSnapshot {
                        key,
                        value: Some(ShareSnapshotValue {
                            snapshot_epoch: se,
                            state_epoch: ste,
                            leader_epoch: le,
                            start_offset: so,
                            delivery_complete_count: dcc,
                            create_timestamp_ms: ct,
                            write_timestamp_ms: wt,
                            state_batches,
                        }),
                    },
                    (false, false) => ShareCoordinatorRecord::ShareUpdate {
                        key,
                        value: Some(ShareUpdateValue {
                            snapshot_epoch: se,
                            leader_epoch: le,
                            start_offset: so,
                            delivery_complete_count: dcc,
                            state_batches,
                        }),
                    },
                },
            )
    }

    proptest! {
        #[test]
        fn records_round_trip(r in record()) {
            let (k, v) = encode(&r).unwrap();
            prop_assert_eq!(decode(&k, v.as_deref()).unwrap(), r);
        }

        #[test]
        fn any_bytes_decode_without_panic(k in prop::collection::vec(any::<u8>(), 0..64),
                                          v in prop::option::of(prop::collection::vec(any::<u8>(), 0..64))) {
            let _ = decode(&k, v.as_deref());
        }
    }
}
