//! The group coordinator's state machine for Kafka's classic group protocol (JoinGroup,
//! SyncGroup, Heartbeat, LeaveGroup) and the offset store (OffsetCommit, OffsetFetch,
//! OffsetDelete), plus DescribeGroups, ListGroups and DeleteGroups, and KIP-848's consumer
//! groups (ConsumerGroupHeartbeat, ConsumerGroupDescribe: `consumer_protocol.rs` has their
//! design note) and KIP-932's share groups (ShareGroupHeartbeat, ShareGroupDescribe:
//! `share_protocol.rs`); pure and clock-injected: no I/O, no tasks, time passed in as
//! `now_ms`.
//!
//! The broker owns the sockets and the `__consumer_offsets` log. It calls
//! [`GroupCoordinator`] with each request, a responder token and the time; it appends
//! the [`Record`]s of every [`Output::Persist`], says where they landed
//! ([`GroupCoordinator::appended`]), and once its high watermark has passed them says so
//! ([`GroupCoordinator::commit_up_to`]) and sends the responses; it calls
//! [`GroupCoordinator::tick`] when [`GroupCoordinator::next_deadline`] is due; and when it
//! becomes coordinator of a partition it replays the partition's records between
//! [`GroupCoordinator::load_partition_start`] and
//! [`GroupCoordinator::load_partition_done`] (those at or above the high watermark with
//! [`GroupCoordinator::replay_uncommitted`]). OffsetFetch serves only offsets whose
//! records are below the high watermark (DESIGN.md's invariant 9).
//!
//! ```
//! use rill_group::*;
//!
//! let mut c = GroupCoordinator::new(GroupConfig::default(), 0x5eed);
//! let p = c.partition_for("my-group");
//! c.load_partition_start(p);
//! c.load_partition_done(p, 0);
//! let join = |member_id: &str| JoinGroupRequest {
//!     group_id: "my-group".into(),
//!     session_timeout_ms: 10_000,
//!     rebalance_timeout_ms: 60_000,
//!     member_id: member_id.into(),
//!     group_instance_id: None,
//!     protocol_type: "consumer".into(),
//!     protocols: vec![("range".into(), encode_subscription(&["orders"]))],
//!     reason: None,
//!     client_id: "app".into(),
//!     client_host: "/127.0.0.1".into(),
//!     api_version: 9,
//! };
//! // First JoinGroup: answered at once with MEMBER_ID_REQUIRED and an id.
//! let out = c.handle_join(join(""), 0, 1);
//! let Output::Respond(Respond { response: Response::JoinGroup(r), .. }) = &out[0] else { panic!() };
//! assert_eq!(r.error_code, error_code::MEMBER_ID_REQUIRED);
//! // Second JoinGroup: parked until the initial rebalance delay ends.
//! assert!(c.handle_join(join(&r.member_id), 0, 2).is_empty());
//! assert_eq!(c.next_deadline(), Some(3_000));
//! let out = c.tick(3_000);
//! let Output::Respond(Respond { responder: 2, response: Response::JoinGroup(r) }) = &out[0] else { panic!() };
//! assert_eq!((r.generation_id, r.leader == r.member_id), (1, true));
//! ```
//!
//! Ordering: outputs of successive calls must be acted on in order, and a response that
//! follows a `Persist` of the same partition should not overtake its write (Kafka's
//! coordinator runtime holds such responses until the write is committed).
//!
//! # Design note: the rebalance protocol
//!
//! 1. A consumer sends JoinGroup with an empty member id. From v4 the coordinator
//!    answers MEMBER_ID_REQUIRED with a fresh id `{client_id}-{uuid}` (static members,
//!    which send `group.instance.id`, get `{instance_id}-{uuid}` and go on directly).
//! 2. The JoinGroup with the id adds the member and parks the request. If the group
//!    was Empty or Stable it moves to PreparingRebalance; an Empty (new) group waits
//!    `group.initial.rebalance.delay.ms`, again each time a member arrived during the
//!    last delay, but never past the rebalance timeout; a running group waits until every
//!    known member has rejoined or the largest member rebalance timeout has passed.
//!    Members learn of the rebalance from REBALANCE_IN_PROGRESS on their heartbeats.
//! 3. The join phase ends: dynamic members that did not rejoin are removed, the
//!    generation id is incremented, the protocol is voted (each member votes for its
//!    most preferred protocol among those all members support), the first joiner still
//!    present is the leader, and the group is CompletingRebalance. Every parked JoinGroup
//!    is answered; only the leader's answer carries every member's metadata.
//! 4. Followers send SyncGroup at once and are parked; the leader runs the assignor and
//!    sends SyncGroup with the assignment. The group becomes Stable, its metadata record
//!    (members and assignment) is written, and all parked SyncGroups are answered with
//!    their member's assignment after the record is durable. Members that never sync
//!    within the rebalance timeout are removed and the group rebalances.
//! 5. In Stable, heartbeats keep sessions alive. A session that expires, a LeaveGroup, a
//!    member joining or changing its metadata, or the leader rejoining starts step 2
//!    again. When the last member goes, the group becomes Empty (a record is written),
//!    and its offsets start to age towards `offsets.retention.minutes`.
//!
//! Why it is correct: every member that receives an assignment for generation N got the
//! JoinGroup response of generation N, and the leader assigned to exactly the members of
//! that response (a member who joins later forces generation N+1, and every parked
//! SyncGroup of generation N is answered REBALANCE_IN_PROGRESS); a request carrying
//! an older generation is refused with ILLEGAL_GENERATION, and an offset commit must
//! carry the current generation and member id, so a member that was removed (zombie)
//! can neither sync nor commit over the current owners. Each assignment is persisted
//! before it is given out, so a new coordinator replaying the log resumes at the last
//! Stable generation, never at one nobody saw. Every parked request is answered exactly
//! once: by the end of its phase, by an error when its member is removed or fenced, or
//! NOT_COORDINATOR when the partition is unloaded. Liveness: each phase has a
//! deadline (initial delay ≤ rebalance timeout, rebalance timeout, pending-sync timeout,
//! session timeout), after which the members that hold it up are removed.

mod api;
mod assignor;
mod committed_consumer_groups;
mod committed_offsets;
mod consumer_group;
mod consumer_group_member;
mod consumer_group_migration;
mod consumer_group_record;
mod consumer_protocol;
mod coordinator;
mod current_assignment_builder;
mod error;
mod group;
mod record;
mod share_group;
mod share_group_offsets;
mod share_group_record;
mod share_protocol;
mod subscription;
mod timer;
mod topics_image;
mod txn_offsets;

#[cfg(test)]
mod tests;

pub use api::*;
pub use assignor::{simple_assign, MemberSpec, ServerAssignor};
pub use committed_offsets::WriteId;
pub use consumer_group::ConsumerGroupState;
pub use consumer_group_member::{
    ConsumerGroupMember, MemberState, LEAVE_GROUP_MEMBER_EPOCH, LEAVE_GROUP_STATIC_MEMBER_EPOCH,
};
pub use consumer_group_migration::ConsumerGroupMigrationPolicy;
pub use consumer_group_record::*;
pub use coordinator::{GroupConfig, GroupCoordinator};
pub use error::{error_code, GroupError};
pub use group::{ClassicGroupState, UnknownGroupState};
pub use record::*;
pub use share_group::{ShareGroupMember, ShareGroupState};
pub use share_group_record::*;
pub use share_protocol::{SHARE_GROUP_ASSIGNOR, SHARE_PROTOCOL_TYPE};
pub use subscription::{
    decode_classic_assignment, decode_classic_subscription, decode_subscribed_topics,
    encode_classic_assignment, encode_subscription, ClassicSubscription, CONSUMER_PROTOCOL_TYPE,
};
pub use topics_image::{TopicImage, TopicsImage};

/// Where a group lives: `partition_for(group_id, offsets.topic.num.partitions)`.
pub use rill_protocol::{java_string_hash_code, partition_for};
