//! The remote segment state machine, its image, and the controller's fencing of changes.

use std::collections::BTreeMap;

use rill_protocol::{ErrorCode, Uuid};

use super::*;
use crate::tests::Harness;
use crate::{ControllerEvent, ControllerResponse};

use RemoteLogSegmentState::*;

#[test]
fn only_kafkas_transitions_are_valid() {
    let all = [
        CopySegmentStarted,
        CopySegmentFinished,
        DeleteSegmentStarted,
        DeleteSegmentFinished,
    ];
    let valid: Vec<_> = all
        .iter()
        .flat_map(|a| all.iter().map(move |b| (*a, *b)))
        .filter(|(a, b)| a.can_transition_to(*b))
        .collect();
    assert_eq!(
        valid,
        vec![
            (CopySegmentStarted, CopySegmentFinished),
            (CopySegmentStarted, DeleteSegmentStarted),
            (CopySegmentFinished, DeleteSegmentStarted),
            (DeleteSegmentStarted, DeleteSegmentFinished),
        ]
    );
    for s in all {
        assert_eq!(RemoteLogSegmentState::from_id(s.id()), Some(s));
    }
    assert_eq!(RemoteLogSegmentState::from_id(4), None);
}

fn segment(id: u64, start: i64, end: i64) -> RemoteLogSegmentMetadata {
    RemoteLogSegmentMetadata {
        segment_id: Uuid::from_u64_pair(7, id),
        start_offset: start,
        end_offset: end,
        broker_id: 1,
        max_timestamp_ms: 1000,
        event_timestamp_ms: 5,
        segment_leader_epochs: BTreeMap::from([(0, start)]),
        segment_size_in_bytes: 4096,
        state: CopySegmentStarted,
    }
}

struct Cluster {
    h: Harness,
    topic_id: Uuid,
}

impl Cluster {
    fn new() -> Self {
        let mut h = Harness::new();
        h.brokers(&[1, 2, 3]);
        let created = h.create_topic("t", 1, 3);
        assert_eq!(created.error_code, ErrorCode::NONE);
        Self {
            topic_id: created.topic_id,
            h,
        }
    }

    fn send(
        &mut self,
        broker: i32,
        leader_epoch: i32,
        change: RemoteLogSegmentChange,
    ) -> ErrorCode {
        let broker_epoch = self.h.epochs.get(&broker).copied().unwrap_or(-1);
        let r = self.h.run(ControllerEvent::RemoteLogSegmentUpdate(
            RemoteLogSegmentUpdateRequest {
                broker_id: broker,
                broker_epoch,
                topic: "t".into(),
                topic_id: self.topic_id,
                partition: 0,
                leader_epoch,
                change,
            },
        ));
        let ControllerResponse::RemoteLogSegmentUpdate(code) = r.response else {
            panic!("{r:?}")
        };
        assert_eq!(r.records.is_empty(), code != ErrorCode::NONE);
        code
    }

    fn leader(&self) -> (i32, i32) {
        let p = self.h.partition("t", 0);
        (p.leader, p.leader_epoch)
    }

    fn states(&self) -> Vec<(i64, RemoteLogSegmentState)> {
        let mut v: Vec<_> = self
            .h
            .image
            .remote_segments(self.topic_id, 0)
            .map(|p| p.values().map(|m| (m.start_offset, m.state)).collect())
            .unwrap_or_default();
        v.sort();
        v
    }
}

fn update(id: u64, state: RemoteLogSegmentState) -> RemoteLogSegmentChange {
    RemoteLogSegmentChange::Update {
        segment_id: Uuid::from_u64_pair(7, id),
        state,
        event_timestamp_ms: 9,
    }
}

#[test]
fn a_segment_goes_through_its_states_and_leaves_the_image() {
    let mut c = Cluster::new();
    let (leader, epoch) = c.leader();
    let add = RemoteLogSegmentChange::Add(segment(1, 0, 99));
    assert_eq!(c.send(leader, epoch, add.clone()), ErrorCode::NONE);
    assert_eq!(c.states(), vec![(0, CopySegmentStarted)]);
    // The same segment twice, or a skipped step, is refused.
    assert_eq!(c.send(leader, epoch, add), ErrorCode::INVALID_REQUEST);
    assert_eq!(
        c.send(leader, epoch, update(1, DeleteSegmentFinished)),
        ErrorCode::INVALID_REQUEST
    );
    assert_eq!(
        c.send(leader, epoch, update(1, CopySegmentFinished)),
        ErrorCode::NONE
    );
    assert_eq!(c.states(), vec![(0, CopySegmentFinished)]);
    assert_eq!(
        c.send(leader, epoch, update(1, CopySegmentFinished)),
        ErrorCode::INVALID_REQUEST
    );
    assert_eq!(
        c.send(leader, epoch, update(1, DeleteSegmentStarted)),
        ErrorCode::NONE
    );
    assert_eq!(
        c.send(leader, epoch, update(1, DeleteSegmentFinished)),
        ErrorCode::NONE
    );
    assert!(c.states().is_empty());
    assert!(c.h.image.remote_log.is_empty());
    // An unknown segment, a new one not in COPY_SEGMENT_STARTED, or with no epochs.
    assert_eq!(
        c.send(leader, epoch, update(2, CopySegmentFinished)),
        ErrorCode::INVALID_REQUEST
    );
    let finished = RemoteLogSegmentMetadata {
        state: CopySegmentFinished,
        ..segment(3, 0, 9)
    };
    assert_eq!(
        c.send(leader, epoch, RemoteLogSegmentChange::Add(finished)),
        ErrorCode::INVALID_REQUEST
    );
    let no_epochs = RemoteLogSegmentMetadata {
        segment_leader_epochs: BTreeMap::new(),
        ..segment(4, 0, 9)
    };
    assert_eq!(
        c.send(leader, epoch, RemoteLogSegmentChange::Add(no_epochs)),
        ErrorCode::INVALID_REQUEST
    );
    c.h.check_replay();
}

#[test]
fn only_the_current_leader_at_its_epoch_may_change_segments() {
    let mut c = Cluster::new();
    let (leader, epoch) = c.leader();
    let follower = [1, 2, 3].into_iter().find(|b| *b != leader).unwrap();
    assert_eq!(
        c.send(
            follower,
            epoch,
            RemoteLogSegmentChange::Add(segment(1, 0, 9))
        ),
        ErrorCode::NOT_LEADER_OR_FOLLOWER
    );
    assert_eq!(
        c.send(
            leader,
            epoch + 1,
            RemoteLogSegmentChange::Add(segment(1, 0, 9))
        ),
        ErrorCode::FENCED_LEADER_EPOCH
    );
    assert_eq!(
        c.send(leader, epoch, RemoteLogSegmentChange::Add(segment(1, 0, 9))),
        ErrorCode::NONE
    );
    // The leader goes: the next one takes over; the old one, mid-upload, is fenced and
    // its COPY_SEGMENT_STARTED entry stays unread until the new leader cleans it up.
    c.h.heartbeat_full(leader, true, false);
    let (new_leader, new_epoch) = c.leader();
    assert_ne!(new_leader, leader);
    assert_eq!(
        c.send(leader, epoch, update(1, CopySegmentFinished)),
        ErrorCode::NOT_LEADER_OR_FOLLOWER
    );
    assert_eq!(c.states(), vec![(0, CopySegmentStarted)]);
    assert_eq!(
        c.send(new_leader, new_epoch, update(1, DeleteSegmentStarted)),
        ErrorCode::NONE
    );
    assert_eq!(
        c.send(new_leader, new_epoch, update(1, DeleteSegmentFinished)),
        ErrorCode::NONE
    );
    // A stale broker epoch is refused like Kafka's AlterPartition.
    let r = c.h.run(ControllerEvent::RemoteLogSegmentUpdate(
        RemoteLogSegmentUpdateRequest {
            broker_id: new_leader,
            broker_epoch: -5,
            topic: "t".into(),
            topic_id: c.topic_id,
            partition: 0,
            leader_epoch: new_epoch,
            change: RemoteLogSegmentChange::Add(segment(5, 10, 19)),
        },
    ));
    assert_eq!(
        r.response,
        ControllerResponse::RemoteLogSegmentUpdate(ErrorCode::STALE_BROKER_EPOCH)
    );
    c.h.check_replay();
}

#[test]
fn records_round_trip_and_a_snapshot_keeps_the_live_segments() {
    let mut c = Cluster::new();
    let (leader, epoch) = c.leader();
    for (id, start) in [(1, 0), (2, 100), (3, 200)] {
        let add = RemoteLogSegmentChange::Add(segment(id, start, start + 99));
        assert_eq!(c.send(leader, epoch, add), ErrorCode::NONE);
    }
    assert_eq!(
        c.send(leader, epoch, update(1, CopySegmentFinished)),
        ErrorCode::NONE
    );
    assert_eq!(
        c.send(leader, epoch, update(2, CopySegmentFinished)),
        ErrorCode::NONE
    );
    assert_eq!(
        c.send(leader, epoch, update(2, DeleteSegmentStarted)),
        ErrorCode::NONE
    );
    for r in &c.h.log {
        let bytes = r.to_bytes().unwrap();
        assert_eq!(&MetadataRecord::decode(bytes).unwrap(), r);
    }
    let snapshot = c.h.image.to_snapshot().unwrap();
    let restored = MetadataImage::from_snapshot(snapshot).unwrap();
    assert_eq!(restored.remote_log, c.h.image.remote_log);
    assert_eq!(
        c.states(),
        vec![
            (0, CopySegmentFinished),
            (100, DeleteSegmentStarted),
            (200, CopySegmentStarted)
        ]
    );
    // Deleting the topic drops its remote metadata.
    let r =
        c.h.run(ControllerEvent::DeleteTopics(crate::DeleteTopicsRequest {
            names: vec!["t".into()],
        }));
    assert!(!r.records.is_empty());
    assert!(c.h.image.remote_log.is_empty());
    c.h.check_replay();
}
