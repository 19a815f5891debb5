//! The record codec and the image: frames round-trip, hostile batches are refused,
//! replay and snapshots rebuild equal images.

use bytes::{BufMut, Bytes, BytesMut};
use proptest::prelude::*;
use rill_protocol::generated::metadata::*;
use rill_protocol::Uuid;

use super::Harness;
use crate::*;

fn uuid() -> impl Strategy<Value = Uuid> {
    any::<[u8; 16]>().prop_map(Uuid)
}

fn ids() -> impl Strategy<Value = Vec<i32>> {
    proptest::collection::vec(0..10i32, 0..5)
}

fn record() -> impl Strategy<Value = MetadataRecord> {
    prop_oneof![
        (
            0..2000i32,
            uuid(),
            any::<i64>(),
            any::<bool>(),
            proptest::option::of("[a-z]{0,5}")
        )
            .prop_map(
                |(id, inc, epoch, fenced, rack)| MetadataRecord::RegisterBroker(
                    RegisterBrokerRecord {
                        broker_id: id,
                        incarnation_id: inc,
                        broker_epoch: epoch,
                        fenced,
                        rack,
                        ..Default::default()
                    }
                )
            ),
        ("[a-z]{1,8}", uuid()).prop_map(|(name, id)| MetadataRecord::Topic(TopicRecord {
            name,
            topic_id: id,
            ..Default::default()
        })),
        (0..100i32, uuid(), ids(), ids(), any::<i32>(), any::<i32>()).prop_map(
            |(p, id, replicas, isr, leader, epoch)| MetadataRecord::Partition(PartitionRecord {
                partition_id: p,
                topic_id: id,
                replicas,
                isr,
                leader,
                leader_epoch: epoch,
                partition_epoch: epoch,
                ..Default::default()
            })
        ),
        (0..100i32, uuid(), proptest::option::of(ids()), any::<i32>()).prop_map(
            |(p, id, isr, leader)| MetadataRecord::PartitionChange(PartitionChangeRecord {
                partition_id: p,
                topic_id: id,
                isr,
                leader,
                ..Default::default()
            })
        ),
        ("[a-z.]{1,12}", proptest::option::of("[a-z0-9]{0,6}")).prop_map(|(name, value)| {
            MetadataRecord::Config(ConfigRecord {
                resource_type: RESOURCE_TOPIC,
                resource_name: "t".into(),
                name,
                value,
                ..Default::default()
            })
        }),
        (0..10i32, any::<i64>()).prop_map(|(id, epoch)| MetadataRecord::FenceBroker(
            FenceBrokerRecord {
                id,
                epoch,
                ..Default::default()
            }
        )),
        (0..10i32, any::<i64>()).prop_map(|(id, epoch)| MetadataRecord::UnfenceBroker(
            UnfenceBrokerRecord {
                id,
                epoch,
                ..Default::default()
            }
        )),
        uuid().prop_map(|id| MetadataRecord::RemoveTopic(RemoveTopicRecord {
            topic_id: id,
            ..Default::default()
        })),
        any::<i64>().prop_map(|n| MetadataRecord::ProducerIds(ProducerIdsRecord {
            broker_id: 1,
            broker_epoch: 2,
            next_producer_id: n,
            ..Default::default()
        })),
        Just(MetadataRecord::NoOp(NoOpRecord::default())),
    ]
}

proptest! {
    #[test]
    fn frame_round_trip(r in record()) {
        let bytes = r.to_bytes().unwrap();
        prop_assert_eq!(MetadataRecord::decode(bytes).unwrap(), r);
    }

    #[test]
    fn batch_round_trip(rs in proptest::collection::vec(record(), 0..20)) {
        let bytes = encode_batch(&rs).unwrap();
        prop_assert_eq!(decode_batch(bytes).unwrap(), rs);
    }

    #[test]
    fn arbitrary_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = decode_batch(Bytes::from(b.clone()));
        let _ = MetadataRecord::decode(Bytes::from(b.clone()));
        let _ = MetadataImage::from_snapshot(Bytes::from(b));
    }

    /// Any sequence of records (even ones that do not fit) applied twice from empty
    /// gives equal images, and the snapshot of the image rebuilds it.
    #[test]
    fn replay_rebuilds_equal_image(rs in proptest::collection::vec(record(), 0..40)) {
        let mut a = MetadataImage::new();
        let mut b = MetadataImage::new();
        for r in &rs {
            let _ = a.apply(r);
        }
        let decoded = decode_batch(encode_batch(&rs).unwrap()).unwrap();
        for r in &decoded {
            let _ = b.apply(r);
        }
        prop_assert_eq!(&a, &b);
        prop_assert_eq!(a.next_offset, rs.len() as i64);
        let restored = MetadataImage::from_snapshot(a.to_snapshot().unwrap()).unwrap();
        prop_assert_eq!(restored, a);
    }
}

#[test]
fn frame_is_kafkas_layout() {
    let r = MetadataRecord::FenceBroker(FenceBrokerRecord {
        id: 1,
        epoch: 2,
        ..Default::default()
    });
    let bytes = r.to_bytes().unwrap();
    // frame version 1, apiKey 7, version 0, then the body: id, epoch, no tagged fields.
    assert_eq!(&bytes[..3], &[1, 7, 0]);
    assert_eq!(&bytes[3..7], &1i32.to_be_bytes());
    assert_eq!(&bytes[7..15], &2i64.to_be_bytes());
    assert_eq!(bytes.len(), 16);
}

#[test]
fn hostile_batches_are_refused() {
    // A count of 2^32-1 records with nothing behind it must not allocate.
    let mut b = BytesMut::new();
    b.put_u32(u32::MAX);
    assert!(decode_batch(b.freeze()).is_err());
    // A length past the end.
    let mut b = BytesMut::new();
    b.put_u32(1);
    b.put_u32(1_000);
    b.put_slice(&[1, 20, 0]);
    assert!(decode_batch(b.freeze()).is_err());
    // Unknown api key and unknown version.
    assert!(matches!(
        MetadataRecord::decode(Bytes::from_static(&[1, 99, 0])),
        Err(MetadataError::UnknownRecord { .. })
    ));
    assert!(matches!(
        MetadataRecord::decode(Bytes::from_static(&[1, 20, 9, 0])),
        Err(MetadataError::UnknownRecord { .. })
    ));
    // Trailing bytes.
    let mut noop = MetadataRecord::NoOp(NoOpRecord::default())
        .to_bytes()
        .unwrap()
        .to_vec();
    noop.push(0);
    assert!(MetadataRecord::decode(Bytes::from(noop)).is_err());
}

#[test]
fn partition_change_derives_epochs() {
    let mut image = MetadataImage::new();
    let id = Uuid::from_u64_pair(1, 2);
    let apply = |image: &mut MetadataImage, r| image.apply(&r).unwrap();
    apply(
        &mut image,
        MetadataRecord::Topic(TopicRecord {
            name: "t".into(),
            topic_id: id,
            ..Default::default()
        }),
    );
    apply(
        &mut image,
        MetadataRecord::Partition(PartitionRecord {
            partition_id: 0,
            topic_id: id,
            replicas: vec![1, 2],
            isr: vec![1, 2],
            leader: 1,
            leader_epoch: 0,
            partition_epoch: 0,
            ..Default::default()
        }),
    );
    // ISR shrink: partition epoch only.
    apply(
        &mut image,
        MetadataRecord::PartitionChange(PartitionChangeRecord {
            partition_id: 0,
            topic_id: id,
            isr: Some(vec![1]),
            leader: NO_LEADER_CHANGE,
            ..Default::default()
        }),
    );
    let p = image.partition("t", 0).unwrap();
    assert_eq!(
        (p.leader, p.leader_epoch, p.partition_epoch, p.isr.clone()),
        (1, 0, 1, vec![1])
    );
    // Leader named (even the same): leader epoch too.
    apply(
        &mut image,
        MetadataRecord::PartitionChange(PartitionChangeRecord {
            partition_id: 0,
            topic_id: id,
            leader: 1,
            ..Default::default()
        }),
    );
    let p = image.partition("t", 0).unwrap();
    assert_eq!((p.leader_epoch, p.partition_epoch), (1, 2));
    // Removing the topic removes its configs.
    apply(
        &mut image,
        MetadataRecord::Config(ConfigRecord {
            resource_type: RESOURCE_TOPIC,
            resource_name: "t".into(),
            name: "retention.ms".into(),
            value: Some("1".into()),
            ..Default::default()
        }),
    );
    assert_eq!(image.topic_config("t", "retention.ms"), Some("1"));
    apply(
        &mut image,
        MetadataRecord::RemoveTopic(RemoveTopicRecord {
            topic_id: id,
            ..Default::default()
        }),
    );
    assert!(image.topic("t").is_none());
    assert!(image.configs.is_empty());
    assert_eq!(image.next_offset, 6);
}

#[test]
fn records_that_do_not_fit_still_advance_the_offset() {
    let mut image = MetadataImage::new();
    let r = MetadataRecord::FenceBroker(FenceBrokerRecord {
        id: 3,
        epoch: 0,
        ..Default::default()
    });
    assert!(image.apply(&r).is_err());
    assert_eq!(image.next_offset, 1);
}

#[test]
fn controller_log_replays_and_snapshots() {
    let mut h = Harness::new();
    h.brokers(&[1, 2, 3]);
    h.create_topic("a", 6, 3);
    h.create_topic("b", 2, 2);
    h.alter_isr("a", 0, &[h.partition("a", 0).leader]);
    h.check_replay();
    let restored = MetadataImage::from_snapshot(h.image.to_snapshot().unwrap()).unwrap();
    assert_eq!(restored, h.image);
}

#[test]
fn local_replica_changes() {
    let mut h = Harness::new();
    h.brokers(&[1, 2]);
    let before = h.image.clone();
    h.create_topic("t", 2, 2);
    let c = LocalReplicaChanges::between(&before, &h.image, 1);
    assert_eq!(c.leaders.len() + c.followers.len(), 2);
    assert_eq!(c.leaders.len(), 1);
    let before = h.image.clone();
    h.run(ControllerEvent::DeleteTopics(DeleteTopicsRequest {
        names: vec!["t".into()],
    }));
    let c = LocalReplicaChanges::between(&before, &h.image, 2);
    assert_eq!(c.deletes.len(), 2);
    assert!(c.leaders.is_empty() && c.followers.is_empty());
}

#[test]
fn local_replica_changes_include_an_isr_that_came_back_to_where_it_was() {
    // Found by replication_sim: the leader grows the ISR, the controller shrinks it back
    // (the follower's lease lapsed), and the leader applies both records in one go. The
    // ISR looks unchanged, but the partition epoch moved twice and the leader's own view
    // (the grown ISR) is stale: it must be told.
    let mut h = Harness::new();
    h.brokers(&[1, 2]);
    h.create_topic("t", 1, 2);
    let p = h.partition("t", 0);
    let (leader, follower) = (
        p.leader,
        p.replicas.iter().copied().find(|b| *b != p.leader).unwrap(),
    );
    h.alter_isr("t", 0, &[leader]);
    let before = h.image.clone();
    h.alter_isr("t", 0, &[leader, follower]);
    h.alter_isr("t", 0, &[leader]);
    assert_eq!(
        h.partition("t", 0).isr,
        before.partition("t", 0).unwrap().isr
    );
    let c = LocalReplicaChanges::between(&before, &h.image, leader);
    assert_eq!(
        c.leaders.len(),
        1,
        "the leader must apply the new partition epoch"
    );
    assert_eq!(
        c.leaders[0].2.partition_epoch,
        h.partition("t", 0).partition_epoch
    );
}
