//! Tiered storage's remote segment metadata (KIP-405's `RemoteLogMetadataManager`) as
//! records of the metadata log: the state machine of one remote segment, the image of
//! every partition's remote segments, and the controller's check of each change.
//!
//! # Design note: why the metadata log
//!
//! Kafka's default manager (`TopicBasedRemoteLogMetadataManager`) keeps these records in
//! the internal topic `__remote_log_metadata`, which every broker consumes for the
//! partitions it hosts; KIP-405 allows another store. Rill keeps them in the metadata
//! log, as Kafka's own record types (`RemoteLogSegmentMetadataRecord`,
//! `RemoteLogSegmentMetadataUpdateRecord`) under record keys of Rill's:
//!
//! - the controller fences every change by the partition's leader and leader epoch,
//!   which the internal topic cannot: a deposed leader that finishes an upload after a
//!   new leader took over is refused, instead of each reader sorting it out;
//! - every broker already holds the image, so a new leader (or a follower that starts
//!   from the remote tail) knows the remote segments at once, with no consumer, producer
//!   or second replication path inside the broker;
//! - a change is visible once committed, like every other record (DESIGN.md's
//!   invariant 9), and a snapshot of the image carries the live segments only, so the
//!   log does not grow with the segments that retention deleted.
//!
//! The cost is one metadata record per state change (three per uploaded segment, two
//! more when it is deleted): a few records per segment per `segment.bytes` of produce,
//! far below the controller's rate for any segment size worth tiering.
//!
//! # Protocol (one segment)
//!
//! 1. COPY_SEGMENT_STARTED: the leader records the segment (id, offsets, epochs, size)
//!    before it uploads a byte; readers ignore it.
//! 2. COPY_SEGMENT_FINISHED: after every file of the copy is in the store. From then on
//!    readers may serve it and followers may delete their local copies up to its end.
//! 3. DELETE_SEGMENT_STARTED: retention (or a cleanup of a copy a failed leader left at
//!    step 1) takes it out of reads before any object is deleted.
//! 4. DELETE_SEGMENT_FINISHED: after every object is gone; the segment leaves the image.
//!
//! Only these transitions are accepted ([`RemoteLogSegmentState::can_transition_to`],
//! Kafka's `isValidTransition`), and only from the partition's current leader at its
//! current leader epoch. A half-uploaded segment (a leader killed between steps 1 and 2)
//! is therefore never read, and the next leader, which sees it in state 1 with an
//! older broker's id, deletes its objects through steps 3 and 4.

use std::collections::BTreeMap;
use std::sync::Arc;

use rill_protocol::generated::storage::{
    remote_log_segment_metadata_record as seg_rec,
    remote_log_segment_metadata_update_record as upd_rec, RemoteLogSegmentMetadataRecord,
    RemoteLogSegmentMetadataUpdateRecord,
};
use rill_protocol::{ErrorCode, Uuid};
use serde::{Deserialize, Serialize};

use crate::api::{ControllerResponse, ControllerResult};
use crate::controller::Scratch;
use crate::image::MetadataImage;
use crate::record::MetadataRecord;

/// Kafka's `RemoteLogSegmentState`, with its ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum RemoteLogSegmentState {
    CopySegmentStarted = 0,
    CopySegmentFinished = 1,
    DeleteSegmentStarted = 2,
    DeleteSegmentFinished = 3,
}

impl RemoteLogSegmentState {
    pub fn id(self) -> i8 {
        self as i8
    }

    pub fn from_id(id: i8) -> Option<Self> {
        Some(match id {
            0 => Self::CopySegmentStarted,
            1 => Self::CopySegmentFinished,
            2 => Self::DeleteSegmentStarted,
            3 => Self::DeleteSegmentFinished,
            _ => return None,
        })
    }

    /// Kafka's `RemoteLogSegmentState.isValidTransition`.
    pub fn can_transition_to(self, next: Self) -> bool {
        use RemoteLogSegmentState::*;
        matches!(
            (self, next),
            (CopySegmentStarted, CopySegmentFinished)
                | (CopySegmentStarted, DeleteSegmentStarted)
                | (CopySegmentFinished, DeleteSegmentStarted)
                | (DeleteSegmentStarted, DeleteSegmentFinished)
        )
    }
}

/// One remote segment as the image holds it (Kafka's `RemoteLogSegmentMetadata`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteLogSegmentMetadata {
    #[serde(with = "UuidDef")]
    pub segment_id: Uuid,
    pub start_offset: i64,
    pub end_offset: i64,
    /// The broker that copied it.
    pub broker_id: i32,
    pub max_timestamp_ms: i64,
    pub event_timestamp_ms: i64,
    /// Epoch → its first offset in the segment.
    pub segment_leader_epochs: BTreeMap<i32, i64>,
    pub segment_size_in_bytes: i32,
    pub state: RemoteLogSegmentState,
}

/// One partition's remote segments by segment id.
pub type PartitionRemoteSegments = BTreeMap<Uuid, RemoteLogSegmentMetadata>;

/// Every partition's remote segments, by `(topic id, partition)`. Shared between the
/// images a broker publishes (as the ACLs are): each level is copied only where a record
/// changes it.
pub type RemoteLogImage = BTreeMap<(Uuid, i32), Arc<PartitionRemoteSegments>>;

/// A change the partition's leader asks the controller for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum RemoteLogSegmentChange {
    /// Step 1 of the protocol: a new segment in COPY_SEGMENT_STARTED.
    Add(RemoteLogSegmentMetadata),
    /// Steps 2 to 4.
    Update {
        #[serde(with = "UuidDef")]
        segment_id: Uuid,
        state: RemoteLogSegmentState,
        event_timestamp_ms: i64,
    },
}

/// The event: a partition leader's change to one of its remote segments.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RemoteLogSegmentUpdateRequest {
    pub broker_id: i32,
    pub broker_epoch: i64,
    pub topic: String,
    #[serde(with = "UuidDef")]
    pub topic_id: Uuid,
    pub partition: i32,
    /// The leader epoch the broker leads the partition at.
    pub leader_epoch: i32,
    pub change: RemoteLogSegmentChange,
}

/// The record that makes `change` (for the image and the metadata log).
fn record_of(req: &RemoteLogSegmentUpdateRequest) -> MetadataRecord {
    match &req.change {
        RemoteLogSegmentChange::Add(m) => MetadataRecord::RemoteLogSegmentMetadata(segment_record(
            &req.topic,
            req.topic_id,
            req.partition,
            m,
        )),
        RemoteLogSegmentChange::Update {
            segment_id,
            state,
            event_timestamp_ms,
        } => MetadataRecord::RemoteLogSegmentMetadataUpdate(RemoteLogSegmentMetadataUpdateRecord {
            remote_log_segment_id: upd_rec::RemoteLogSegmentIdEntry {
                topic_id_partition: upd_rec::TopicIdPartitionEntry {
                    name: req.topic.clone(),
                    id: req.topic_id,
                    partition: req.partition,
                    ..Default::default()
                },
                id: *segment_id,
                ..Default::default()
            },
            broker_id: req.broker_id,
            event_timestamp_ms: *event_timestamp_ms,
            custom_metadata: None,
            remote_log_segment_state: state.id(),
            ..Default::default()
        }),
    }
}

/// A segment as Kafka's `RemoteLogSegmentMetadataRecord` (also what a snapshot holds).
pub fn segment_record(
    topic: &str,
    topic_id: Uuid,
    partition: i32,
    m: &RemoteLogSegmentMetadata,
) -> RemoteLogSegmentMetadataRecord {
    RemoteLogSegmentMetadataRecord {
        remote_log_segment_id: seg_rec::RemoteLogSegmentIdEntry {
            topic_id_partition: seg_rec::TopicIdPartitionEntry {
                name: topic.to_string(),
                id: topic_id,
                partition,
                ..Default::default()
            },
            id: m.segment_id,
            ..Default::default()
        },
        start_offset: m.start_offset,
        end_offset: m.end_offset,
        broker_id: m.broker_id,
        max_timestamp_ms: m.max_timestamp_ms,
        event_timestamp_ms: m.event_timestamp_ms,
        segment_leader_epochs: m
            .segment_leader_epochs
            .iter()
            .map(
                |(&leader_epoch, &offset)| seg_rec::SegmentLeaderEpochEntry {
                    leader_epoch,
                    offset,
                    ..Default::default()
                },
            )
            .collect(),
        segment_size_in_bytes: m.segment_size_in_bytes,
        custom_metadata: None,
        remote_log_segment_state: m.state.id(),
        ..Default::default()
    }
}

/// Applies a `RemoteLogSegmentMetadataRecord`: a new segment (in any state, since a
/// snapshot writes each live segment in its current one).
pub(crate) fn apply_segment(image: &mut RemoteLogImage, r: &RemoteLogSegmentMetadataRecord) {
    let Some(state) = RemoteLogSegmentState::from_id(r.remote_log_segment_state) else {
        return;
    };
    let tp = &r.remote_log_segment_id.topic_id_partition;
    let m = RemoteLogSegmentMetadata {
        segment_id: r.remote_log_segment_id.id,
        start_offset: r.start_offset,
        end_offset: r.end_offset,
        broker_id: r.broker_id,
        max_timestamp_ms: r.max_timestamp_ms,
        event_timestamp_ms: r.event_timestamp_ms,
        segment_leader_epochs: r
            .segment_leader_epochs
            .iter()
            .map(|e| (e.leader_epoch, e.offset))
            .collect(),
        segment_size_in_bytes: r.segment_size_in_bytes,
        state,
    };
    let segments = image.entry((tp.id, tp.partition)).or_default();
    Arc::make_mut(segments).insert(m.segment_id, m);
}

/// Applies a `RemoteLogSegmentMetadataUpdateRecord`: a state change, the segment leaving
/// the image at DELETE_SEGMENT_FINISHED. The controller wrote only valid transitions; a
/// record that is not one (of a segment a topic deletion already dropped) changes nothing.
pub(crate) fn apply_update(image: &mut RemoteLogImage, r: &RemoteLogSegmentMetadataUpdateRecord) {
    let tp = &r.remote_log_segment_id.topic_id_partition;
    let key = (tp.id, tp.partition);
    let Some(state) = RemoteLogSegmentState::from_id(r.remote_log_segment_state) else {
        return;
    };
    let Some(segments) = image.get_mut(&key) else {
        return;
    };
    let id = r.remote_log_segment_id.id;
    if !segments
        .get(&id)
        .is_some_and(|m| m.state.can_transition_to(state))
    {
        return;
    }
    let segments = Arc::make_mut(segments);
    if state == RemoteLogSegmentState::DeleteSegmentFinished {
        segments.remove(&id);
    } else if let Some(m) = segments.get_mut(&id) {
        m.state = state;
        m.event_timestamp_ms = r.event_timestamp_ms;
    }
    if segments.is_empty() {
        image.remove(&key);
    }
}

/// The controller's decision on a leader's change (see the module's protocol): the
/// record, or the error the leader gets.
pub(crate) fn update_remote_log_segment(
    req: RemoteLogSegmentUpdateRequest,
    image: &MetadataImage,
) -> ControllerResult {
    let mut s = Scratch::new(image);
    let code = check(&req, image);
    if code == ErrorCode::NONE {
        s.emit(record_of(&req));
    }
    s.finish(ControllerResponse::RemoteLogSegmentUpdate(code))
}

fn check(req: &RemoteLogSegmentUpdateRequest, image: &MetadataImage) -> ErrorCode {
    match image.broker(req.broker_id) {
        Some(b) if b.epoch == req.broker_epoch => {}
        _ => return ErrorCode::STALE_BROKER_EPOCH,
    }
    let Some(partition) = image
        .topics
        .get(&req.topic_id)
        .and_then(|t| t.partitions.get(&req.partition))
    else {
        return ErrorCode::UNKNOWN_TOPIC_ID;
    };
    if partition.leader != req.broker_id {
        return ErrorCode::NOT_LEADER_OR_FOLLOWER;
    }
    if partition.leader_epoch != req.leader_epoch {
        return ErrorCode::FENCED_LEADER_EPOCH;
    }
    let existing = image
        .remote_log
        .get(&(req.topic_id, req.partition))
        .and_then(|p| match &req.change {
            RemoteLogSegmentChange::Add(m) => p.get(&m.segment_id),
            RemoteLogSegmentChange::Update { segment_id, .. } => p.get(segment_id),
        });
    match (&req.change, existing) {
        (RemoteLogSegmentChange::Add(m), None)
            if m.state == RemoteLogSegmentState::CopySegmentStarted
                && m.start_offset >= 0
                && m.start_offset <= m.end_offset
                && !m.segment_leader_epochs.is_empty() =>
        {
            ErrorCode::NONE
        }
        (RemoteLogSegmentChange::Update { state, .. }, Some(m))
            if m.state.can_transition_to(*state) =>
        {
            ErrorCode::NONE
        }
        _ => ErrorCode::INVALID_REQUEST,
    }
}

/// serde's view of [`Uuid`]: its 16 bytes.
#[derive(Serialize, Deserialize)]
#[serde(remote = "Uuid")]
struct UuidDef(pub [u8; 16]);

#[cfg(test)]
mod tests;
