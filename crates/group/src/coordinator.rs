//! The [`GroupCoordinator`]: every classic group of the `__consumer_offsets` partitions
//! this node coordinates, driven by requests, the clock ([`GroupCoordinator::tick`]) and
//! the records it replays when it becomes coordinator of a partition.
//!
//! Each call returns [`Output`]s. A call that wrote records returns exactly one
//! [`Output::Persist`] holding the records and every response of the call, so nothing
//! is acknowledged before it is durable; a call without records returns plain
//! [`Output::Respond`]s. The groups are updated when the records are produced, so that
//! the next decision sees them; reads of offsets see only what is replicated
//! ([`crate::committed_offsets`]: the broker reports each write's end offset with
//! [`GroupCoordinator::appended`] and the high watermark with
//! [`GroupCoordinator::commit_up_to`]). If a write fails the broker reloads the
//! partition, which rebuilds the state that was written (the same outcome as Kafka's
//! revert to the last committed snapshot).

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;

use crate::api::*;
use crate::committed_consumer_groups::CommittedConsumerGroups;
use crate::committed_offsets::{CommittedOffsets, WriteId};
use crate::consumer_group::ConsumerGroup;
use crate::consumer_group_migration::ConsumerGroupMigrationPolicy;
use crate::error::{error_code, GroupError};
use crate::group::{ClassicGroup, ClassicGroupMember, ClassicGroupState, JoinTimer};
use crate::partition_for;
use crate::record::*;
use crate::share_group::ShareGroup;
use crate::subscription::CONSUMER_PROTOCOL_TYPE;
use crate::timer::{Timer, TimerKey};
use crate::topics_image::TopicsImage;
use crate::txn_offsets::PendingTxnOffsets;

use ClassicGroupState::{CompletingRebalance, Dead, Empty, PreparingRebalance, Stable};

/// Bound on the deadlines one `tick` fires, so a burst cannot stall the caller; the rest
/// fire on the next call (`next_deadline` is then already due).
const MAX_TIMERS_PER_TICK: usize = 10_000;

/// The coordinator's settings, under Kafka's broker config names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupConfig {
    /// `offsets.topic.num.partitions`.
    pub offsets_topic_num_partitions: i32,
    /// `group.min.session.timeout.ms`.
    pub group_min_session_timeout_ms: i32,
    /// `group.max.session.timeout.ms`.
    pub group_max_session_timeout_ms: i32,
    /// `group.initial.rebalance.delay.ms`.
    pub group_initial_rebalance_delay_ms: i32,
    /// `group.max.size`.
    pub group_max_size: i32,
    /// How long a new member's JoinGroup may stay parked (Kafka's internal
    /// `group.classic.new.member.join.timeout.ms`, KIP-394).
    pub group_new_member_join_timeout_ms: i32,
    /// `offsets.retention.minutes`.
    pub offsets_retention_minutes: i32,
    /// `offsets.retention.check.interval.ms`.
    pub offsets_retention_check_interval_ms: i64,
    /// `offset.metadata.max.bytes`.
    pub offset_metadata_max_bytes: i32,
    /// `offsets.commit.timeout.ms`: how long the runtime waits for the records of a
    /// commit (or an assignment) to reach every in-sync replica before answering with an
    /// error. The state machine itself does not read it.
    pub offsets_commit_timeout_ms: i32,
    /// `group.consumer.assignors`: the server-side assignors of consumer groups (KIP-848)
    /// by name, the first the default.
    pub consumer_group_assignors: Vec<String>,
    /// `group.consumer.max.size`.
    pub consumer_group_max_size: i32,
    /// `group.consumer.migration.policy`: whether a classic group becomes a consumer group
    /// when a member of the consumer protocol joins it (KIP-848's online upgrade).
    pub consumer_group_migration_policy: ConsumerGroupMigrationPolicy,
    /// `group.consumer.session.timeout.ms`: the session a consumer group member gets
    /// when a load makes this node its coordinator, until its first heartbeat here
    /// brings the group's own value.
    pub consumer_group_session_timeout_ms: i32,
    /// `group.share.max.size`.
    pub share_group_max_size: i32,
    /// `group.share.session.timeout.ms`: the session a share group member gets when a
    /// load makes this node its coordinator, until its first heartbeat here brings the
    /// group's own value.
    pub share_group_session_timeout_ms: i32,
}

impl Default for GroupConfig {
    fn default() -> Self {
        GroupConfig {
            offsets_topic_num_partitions: 50,
            group_min_session_timeout_ms: 6_000,
            group_max_session_timeout_ms: 1_800_000,
            group_initial_rebalance_delay_ms: 3_000,
            group_max_size: i32::MAX,
            group_new_member_join_timeout_ms: 300_000,
            offsets_retention_minutes: 7 * 24 * 60,
            offsets_retention_check_interval_ms: 600_000,
            offset_metadata_max_bytes: 4096,
            offsets_commit_timeout_ms: 5_000,
            consumer_group_assignors: vec!["uniform".to_owned(), "range".to_owned()],
            consumer_group_max_size: i32::MAX,
            consumer_group_migration_policy: ConsumerGroupMigrationPolicy::Bidirectional,
            consumer_group_session_timeout_ms: 45_000,
            share_group_max_size: 200,
            share_group_session_timeout_ms: 45_000,
        }
    }
}

impl GroupConfig {
    fn offsets_retention_ms(&self) -> i64 {
        i64::from(self.offsets_retention_minutes) * 60_000
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PartitionState {
    Loading,
    Active,
}

/// What one call produced, turned into outputs at its end.
#[derive(Debug, Default)]
pub(crate) struct Effects {
    pub(crate) records: Vec<(i32, Record)>,
    pub(crate) responses: Vec<Respond>,
}

impl Effects {
    pub(crate) fn respond(&mut self, responder: ResponderId, response: Response) {
        self.responses.push(Respond {
            responder,
            response,
        });
    }

    pub(crate) fn record(&mut self, partition: i32, record: Record) {
        self.records.push((partition, record));
    }

    /// The call's outputs; a write is named `write` and its offset records are queued
    /// in `read` until they are replicated.
    fn into_outputs(self, write: WriteId, read: &mut CommittedOffsets) -> Vec<Output> {
        if self.records.is_empty() {
            return self.responses.into_iter().map(Output::Respond).collect();
        }
        let mut by_partition: BTreeMap<i32, Vec<OffsetCommitRecord>> = BTreeMap::new();
        for (p, r) in &self.records {
            if let Record::OffsetCommit(r) = r {
                by_partition.entry(*p).or_default().push(r.clone());
            }
        }
        for (p, records) in by_partition {
            read.written(p, write, None, records);
        }
        vec![Output::Persist {
            write,
            records: self.records,
            responses: self.responses,
        }]
    }
}

/// The group coordinator's state machine for the classic group protocol.
#[derive(Debug)]
pub struct GroupCoordinator {
    pub(crate) config: GroupConfig,
    pub(crate) groups: BTreeMap<String, ClassicGroup>,
    partitions: BTreeMap<i32, PartitionState>,
    pub(crate) timer: Timer,
    /// SplitMix64 state for member ids; seeded by the broker so that ids differ across
    /// coordinators and restarts while tests stay deterministic.
    pub(crate) rng: u64,
    pub(crate) join_seq: u64,
    /// What OffsetFetch serves: offsets as of each partition's high watermark.
    read: CommittedOffsets,
    next_write: u64,
    /// Per partition, the end of the tail a load replayed above the high watermark,
    /// until the mark reaches it. A new leader cannot tell which of those records the
    /// old leader acknowledged: serving the older committed offsets could hide an
    /// acknowledged commit, serving the tail could show one the next leader lacks. So
    /// OffsetFetch answers COORDINATOR_LOAD_IN_PROGRESS (retriable) meanwhile.
    unsettled_tail: BTreeMap<i32, i64>,
    /// Offsets of open transactions (TxnOffsetCommit), served only after their COMMIT.
    txn_offsets: PendingTxnOffsets,
    /// Consumer groups (KIP-848), with the newest state; a group id is a key of
    /// `groups` or of this map, never of both.
    pub(crate) consumer_groups: BTreeMap<String, ConsumerGroup>,
    /// The consumer groups as of the high watermark, and the writes above it.
    pub(crate) committed_consumer: CommittedConsumerGroups,
    /// Answers released by `commit_up_to`, for [`GroupCoordinator::take_released`].
    released: Vec<Respond>,
    /// The cluster's topics, as the broker last said.
    pub(crate) topics: Arc<TopicsImage>,
    /// Share groups (KIP-932), with the newest state; their ids are in neither `groups`
    /// nor `consumer_groups`. Their committed view is in `committed_consumer`.
    pub(crate) share_groups: BTreeMap<String, ShareGroup>,
}

/// Everything a group transition may touch besides the group itself.
pub(crate) struct Ctx<'a> {
    config: &'a GroupConfig,
    timer: &'a mut Timer,
    rng: &'a mut u64,
    join_seq: &'a mut u64,
    now: i64,
    fx: &'a mut Effects,
}

fn heartbeat_key(g: &ClassicGroup, member_id: &str) -> TimerKey {
    TimerKey::Heartbeat {
        group_id: g.group_id.clone(),
        member_id: member_id.to_owned(),
    }
}

pub(crate) fn next_u64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A random (version 4) UUID in Java's `UUID.toString()` form.
fn uuid_string(state: &mut u64) -> String {
    let hi = (next_u64(state) & !0xF000) | 0x4000;
    let lo = (next_u64(state) & 0x3FFF_FFFF_FFFF_FFFF) | 0x8000_0000_0000_0000;
    format!(
        "{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        hi >> 32,
        (hi >> 16) & 0xFFFF,
        hi & 0xFFFF,
        lo >> 48,
        lo & 0xFFFF_FFFF_FFFF
    )
}

fn join_response(g: &ClassicGroup, member_id: &str, skip_assignment: bool) -> JoinGroupResponse {
    JoinGroupResponse {
        error_code: error_code::NONE,
        generation_id: g.generation_id,
        protocol_type: g.protocol_type.clone(),
        protocol_name: g.protocol_name.clone(),
        leader: g.leader_or_empty(),
        skip_assignment,
        member_id: member_id.to_owned(),
        members: if g.is_leader(member_id) {
            g.current_member_metadata()
        } else {
            Vec::new()
        },
    }
}

/// Kafka's `acceptJoiningMember`: the group size is checked against members awaiting
/// join while rebalancing (so that the last joiners are the ones refused), and against
/// all members otherwise.
fn accept_joining_member(g: &ClassicGroup, member_id: &str, max_size: usize) -> bool {
    match g.state {
        Empty | Dead => true,
        PreparingRebalance => {
            g.members
                .get(member_id)
                .is_some_and(|m| m.awaiting_join.is_some())
                || g.num_awaiting_join() < max_size
        }
        CompletingRebalance | Stable => g.has_member(member_id) || g.members.len() < max_size,
    }
}

fn commit_response(req: &OffsetCommitRequest, code: i16) -> OffsetCommitResponse {
    OffsetCommitResponse {
        topics: req
            .topics
            .iter()
            .map(|t| OffsetCommitResponseTopic {
                name: t.name.clone(),
                partitions: t
                    .partitions
                    .iter()
                    .map(|p| OffsetCommitResponsePartition {
                        partition_index: p.partition_index,
                        error_code: code,
                    })
                    .collect(),
            })
            .collect(),
    }
}

fn offset_commit_record(
    group: &str,
    topic: &str,
    partition: i32,
    value: Option<OffsetCommitValue>,
) -> Record {
    Record::OffsetCommit(OffsetCommitRecord {
        key: OffsetCommitKey {
            group: group.to_owned(),
            topic: topic.to_owned(),
            partition,
        },
        value,
    })
}

fn group_tombstone(group: &str) -> Record {
    Record::GroupMetadata(GroupMetadataRecord {
        key: GroupMetadataKey {
            group: group.to_owned(),
        },
        value: None,
    })
}

impl Ctx<'_> {
    fn respond_join(&mut self, responder: ResponderId, response: JoinGroupResponse) {
        self.fx.respond(responder, Response::JoinGroup(response));
    }

    fn respond_sync(&mut self, responder: ResponderId, response: SyncGroupResponse) {
        self.fx.respond(responder, Response::SyncGroup(response));
    }

    fn schedule_heartbeat(&mut self, g: &ClassicGroup, member_id: &str, timeout_ms: i32) {
        self.timer.schedule(
            heartbeat_key(g, member_id),
            self.now + i64::from(timeout_ms),
        );
    }

    pub(crate) fn reschedule_member_heartbeat(&mut self, g: &ClassicGroup, member_id: &str) {
        if let Some(m) = g.members.get(member_id) {
            let timeout = m.session_timeout_ms;
            self.schedule_heartbeat(g, member_id, timeout);
        }
    }

    /// Answers the requests a member that is going away had parked.
    fn answer_parked(&mut self, member: &ClassicGroupMember, join_member_id: &str, code: i16) {
        if let Some(r) = member.awaiting_join {
            self.respond_join(r, JoinGroupResponse::error(join_member_id, code));
        }
        if let Some(r) = member.awaiting_sync {
            self.respond_sync(r, SyncGroupResponse::error(code));
        }
    }

    fn write_group_metadata(&mut self, g: &mut ClassicGroup) {
        let value = g.metadata_value();
        g.last_persisted = Some(value.clone());
        self.fx.record(
            g.partition,
            Record::GroupMetadata(GroupMetadataRecord {
                key: GroupMetadataKey {
                    group: g.group_id.clone(),
                },
                value: Some(value),
            }),
        );
    }

    fn generate_member_id(&mut self, g: &ClassicGroup, prefix: &str) -> String {
        loop {
            let id = format!("{prefix}-{}", uuid_string(self.rng));
            // A 122-bit collision is practically impossible; checking keeps the member
            // map's invariant without relying on that.
            if !g.has_member(&id) && !g.pending_join_members.contains(&id) {
                return id;
            }
        }
    }

    // ----- join phase ---------------------------------------------------------------

    pub(crate) fn prepare_rebalance(&mut self, g: &mut ClassicGroup) {
        if g.is(CompletingRebalance) {
            self.reset_and_propagate_assignment_with_error(g, error_code::REBALANCE_IN_PROGRESS);
        }
        self.timer.cancel(&TimerKey::PendingSync {
            group_id: g.group_id.clone(),
        });
        let join_key = TimerKey::Join {
            group_id: g.group_id.clone(),
        };
        if g.is(Empty) {
            let delay_ms = i64::from(self.config.group_initial_rebalance_delay_ms);
            let remaining_ms = (g.rebalance_timeout_ms() - delay_ms).max(0);
            g.join_timer = Some(JoinTimer::InitialDelayed {
                delay_ms,
                remaining_ms,
            });
            g.new_member_added = false;
            self.timer.schedule(join_key, self.now + delay_ms);
            g.transition_to(PreparingRebalance, self.now);
        } else {
            g.transition_to(PreparingRebalance, self.now);
            if g.has_all_members_joined() {
                // Everyone is already here (a lone member rejoining, or the last one
                // leaving): nothing to wait for.
                self.complete_join(g);
            } else {
                g.join_timer = Some(JoinTimer::Rebalance);
                self.timer
                    .schedule(join_key, self.now + g.rebalance_timeout_ms());
            }
        }
    }

    fn maybe_prepare_rebalance_or_complete_join(&mut self, g: &mut ClassicGroup) {
        if g.can_rebalance() {
            self.prepare_rebalance(g);
        } else {
            self.maybe_complete_join_phase(g);
        }
    }

    /// The join phase ends early once every member has rejoined, except for a new group,
    /// which always waits out its initial delay so that more members can arrive.
    fn maybe_complete_join_phase(&mut self, g: &mut ClassicGroup) {
        if g.is(PreparingRebalance) && g.has_all_members_joined() && g.previous_state != Empty {
            self.complete_join(g);
        }
    }

    fn on_join_timer(&mut self, g: &mut ClassicGroup) {
        match g.join_timer {
            Some(JoinTimer::InitialDelayed {
                delay_ms,
                remaining_ms,
            }) if g.new_member_added && remaining_ms != 0 => {
                // Members are still arriving: wait another delay, within the rebalance
                // timeout.
                g.new_member_added = false;
                let new_delay_ms = delay_ms.min(remaining_ms);
                g.join_timer = Some(JoinTimer::InitialDelayed {
                    delay_ms: new_delay_ms,
                    remaining_ms: (remaining_ms - delay_ms).max(0),
                });
                self.timer.schedule(
                    TimerKey::Join {
                        group_id: g.group_id.clone(),
                    },
                    self.now + new_delay_ms,
                );
            }
            Some(_) => self.complete_join(g),
            None => {}
        }
    }

    fn complete_join(&mut self, g: &mut ClassicGroup) {
        if !g.is(PreparingRebalance) {
            return;
        }
        self.timer.cancel(&TimerKey::Join {
            group_id: g.group_id.clone(),
        });
        g.join_timer = None;
        // Dynamic members that did not rejoin in time are gone; static members keep
        // their place until their session expires (KIP-345).
        let failed: Vec<String> = g
            .members
            .values()
            .filter(|m| m.awaiting_join.is_none() && m.group_instance_id.is_none())
            .map(|m| m.member_id.clone())
            .collect();
        for id in failed {
            self.timer.cancel(&heartbeat_key(g, &id));
            if let Some(m) = g.remove_member(&id) {
                self.answer_parked(&m, "", error_code::UNKNOWN_MEMBER_ID);
            }
        }
        if !g.maybe_elect_new_joined_leader() && !g.members.is_empty() {
            // Only static members that have not rejoined remain: wait for them to rejoin
            // or for their sessions to expire.
            g.join_timer = Some(JoinTimer::Rebalance);
            self.timer.schedule(
                TimerKey::Join {
                    group_id: g.group_id.clone(),
                },
                self.now + g.rebalance_timeout_ms().max(1),
            );
            return;
        }
        g.generation_id = g.generation_id.wrapping_add(1);
        g.pending_sync_members.clear();
        if g.members.is_empty() {
            g.protocol_name = None;
            g.transition_to(Empty, self.now);
            g.subscribed_topics = g.compute_subscribed_topics();
            self.write_group_metadata(g);
            return;
        }
        g.protocol_name = g.select_protocol();
        g.subscribed_topics = g.compute_subscribed_topics();
        g.transition_to(CompletingRebalance, self.now);
        let mut ids: Vec<(u64, String)> = g
            .members
            .values()
            .map(|m| (m.join_seq, m.member_id.clone()))
            .collect();
        ids.sort();
        for (_, id) in ids {
            if let Some(r) = g.set_awaiting_join(&id, None) {
                let response = join_response(g, &id, false);
                self.respond_join(r, response);
            }
            self.reschedule_member_heartbeat(g, &id);
            if let Some(m) = g.members.get_mut(&id) {
                m.is_new = false;
            }
            g.pending_sync_members.insert(id);
        }
        self.timer.schedule(
            TimerKey::PendingSync {
                group_id: g.group_id.clone(),
            },
            self.now + g.rebalance_timeout_ms(),
        );
    }

    // ----- sync phase ---------------------------------------------------------------

    fn reset_and_propagate_assignment_with_error(&mut self, g: &mut ClassicGroup, code: i16) {
        for m in g.members.values_mut() {
            m.assignment = Bytes::new();
        }
        self.propagate_assignment(g, code);
    }

    fn propagate_assignment(&mut self, g: &mut ClassicGroup, code: i16) {
        let ok = code == error_code::NONE;
        let ids: Vec<String> = g.members.keys().cloned().collect();
        for id in ids {
            let Some(m) = g.members.get_mut(&id) else {
                continue;
            };
            let Some(r) = m.awaiting_sync.take() else {
                continue;
            };
            let response = SyncGroupResponse {
                error_code: code,
                protocol_type: if ok { g.protocol_type.clone() } else { None },
                protocol_name: if ok { g.protocol_name.clone() } else { None },
                assignment: if ok {
                    m.assignment.clone()
                } else {
                    Bytes::new()
                },
            };
            self.respond_sync(r, response);
            // The member could not heartbeat while parked; its session restarts now.
            self.reschedule_member_heartbeat(g, &id);
        }
    }

    fn remove_pending_sync_member(&mut self, g: &mut ClassicGroup, member_id: &str) {
        g.pending_sync_members.remove(member_id);
        if g.pending_sync_members.is_empty() {
            self.timer.cancel(&TimerKey::PendingSync {
                group_id: g.group_id.clone(),
            });
        }
    }

    fn on_pending_sync_expired(&mut self, g: &mut ClassicGroup) {
        if !(g.is(CompletingRebalance) || g.is(Stable)) || g.pending_sync_members.is_empty() {
            return;
        }
        let ids: Vec<String> = g.pending_sync_members.iter().cloned().collect();
        for id in ids {
            self.timer.cancel(&heartbeat_key(g, &id));
            if let Some(m) = g.remove_member(&id) {
                self.answer_parked(&m, "", error_code::UNKNOWN_MEMBER_ID);
            }
        }
        self.prepare_rebalance(g);
    }

    // ----- membership ---------------------------------------------------------------

    /// Kafka's `removeMemberAndUpdateClassicGroup` (session expiry).
    fn remove_member_and_update(&mut self, g: &mut ClassicGroup, member_id: &str) {
        self.timer.cancel(&heartbeat_key(g, member_id));
        if let Some(m) = g.remove_member(member_id) {
            self.answer_parked(&m, "", error_code::UNKNOWN_MEMBER_ID);
        }
        match g.state {
            Stable | CompletingRebalance => self.maybe_prepare_rebalance_or_complete_join(g),
            PreparingRebalance if g.has_all_members_joined() => self.complete_join(g),
            _ => {}
        }
    }

    fn on_heartbeat_expired(&mut self, g: &mut ClassicGroup, member_id: &str) {
        if g.is(Dead) {
            return;
        }
        if g.pending_join_members.remove(member_id) {
            if g.is(PreparingRebalance) && g.has_all_members_joined() {
                self.complete_join(g);
            }
            return;
        }
        let expired = g
            .members
            .get(member_id)
            .is_some_and(|m| !m.has_satisfied_heartbeat());
        if expired {
            self.remove_member_and_update(g, member_id);
        }
    }

    fn add_member_then_rejoin(
        &mut self,
        g: &mut ClassicGroup,
        req: JoinGroupRequest,
        member_id: String,
        responder: ResponderId,
    ) {
        *self.join_seq += 1;
        let member = ClassicGroupMember {
            member_id: member_id.clone(),
            group_instance_id: req.group_instance_id,
            client_id: req.client_id,
            client_host: req.client_host,
            rebalance_timeout_ms: req.rebalance_timeout_ms,
            session_timeout_ms: req.session_timeout_ms,
            protocol_type: req.protocol_type,
            supported_protocols: req.protocols,
            assignment: Bytes::new(),
            awaiting_join: Some(responder),
            awaiting_sync: None,
            is_new: true,
            join_seq: *self.join_seq,
        };
        if g.is(PreparingRebalance) && g.previous_state == Empty {
            g.new_member_added = true;
        }
        g.add_member(member);
        // A parked new member cannot heartbeat, and a client that gave up would leave a
        // defunct member behind; bound how long it may wait (KIP-394).
        let timeout = self.config.group_new_member_join_timeout_ms;
        self.schedule_heartbeat(g, &member_id, timeout);
        self.maybe_prepare_rebalance_or_complete_join(g);
    }

    fn update_member_then_rejoin(
        &mut self,
        g: &mut ClassicGroup,
        req: JoinGroupRequest,
        responder: ResponderId,
    ) {
        let member_id = req.member_id.clone();
        g.update_member(
            &member_id,
            req.protocols,
            req.rebalance_timeout_ms,
            req.session_timeout_ms,
        );
        if let Some(old) = g.set_awaiting_join(&member_id, Some(responder)) {
            // A second JoinGroup while the first is parked (a client retry): the first
            // one is answered so that no request is left without a response.
            self.respond_join(
                old,
                JoinGroupResponse::error(&member_id, error_code::REBALANCE_IN_PROGRESS),
            );
        }
        self.maybe_prepare_rebalance_or_complete_join(g);
    }

    fn update_static_member_then_rejoin(
        &mut self,
        g: &mut ClassicGroup,
        req: JoinGroupRequest,
        instance_id: &str,
        old_member_id: &str,
        new_member_id: String,
        responder: ResponderId,
    ) {
        let req_api_version = req.api_version;
        let old_session = g
            .members
            .get(old_member_id)
            .map(|m| m.session_timeout_ms)
            .unwrap_or(req.session_timeout_ms);
        let leader_before = g.leader_or_empty();
        let (parked_join, parked_sync) =
            g.replace_static_member(instance_id, old_member_id, &new_member_id);
        if let Some(r) = parked_join {
            self.respond_join(
                r,
                JoinGroupResponse::error(old_member_id, error_code::FENCED_INSTANCE_ID),
            );
        }
        if let Some(r) = parked_sync {
            self.respond_sync(r, SyncGroupResponse::error(error_code::FENCED_INSTANCE_ID));
        }
        self.timer.cancel(&heartbeat_key(g, old_member_id));
        self.schedule_heartbeat(g, &new_member_id, old_session);
        g.update_member(
            &new_member_id,
            req.protocols,
            req.rebalance_timeout_ms,
            req.session_timeout_ms,
        );
        match g.state {
            Stable => {
                if g.select_protocol() == g.protocol_name {
                    // Same protocol for the next generation: the member keeps its
                    // assignment and the group needs no rebalance; only the new member
                    // id is persisted.
                    self.write_group_metadata(g);
                    let mut response = join_response(g, &new_member_id, false);
                    if req_api_version >= 9 {
                        // KIP-814: a returning leader gets the members but must not
                        // assign again.
                        response.skip_assignment = g.is_leader(&new_member_id);
                    } else {
                        // Older clients cannot be told to skip the assignment: they are
                        // answered as a follower, naming the leader as it was.
                        response.members.clear();
                        response.leader = leader_before;
                    }
                    self.respond_join(responder, response);
                } else {
                    g.set_awaiting_join(&new_member_id, Some(responder));
                    self.maybe_prepare_rebalance_or_complete_join(g);
                }
            }
            CompletingRebalance => {
                // The leader may already be assigning to the old member id; rebalance so
                // that the new id gets an assignment.
                g.set_awaiting_join(&new_member_id, Some(responder));
                self.prepare_rebalance(g);
            }
            PreparingRebalance => {
                g.set_awaiting_join(&new_member_id, Some(responder));
                self.maybe_complete_join_phase(g);
            }
            Empty | Dead => self.respond_join(
                responder,
                JoinGroupResponse::error(&new_member_id, error_code::UNKNOWN_MEMBER_ID),
            ),
        }
    }

    fn join(&mut self, g: &mut ClassicGroup, req: JoinGroupRequest, responder: ResponderId) {
        let max_size = usize::try_from(self.config.group_max_size).unwrap_or(0);
        if !accept_joining_member(g, &req.member_id, max_size) {
            // A member over the limit (the limit may have been lowered) is removed.
            self.timer.cancel(&heartbeat_key(g, &req.member_id));
            if let Some(m) = g.remove_member(&req.member_id) {
                self.answer_parked(&m, "", error_code::GROUP_MAX_SIZE_REACHED);
            }
            self.respond_join(
                responder,
                JoinGroupResponse::error("", error_code::GROUP_MAX_SIZE_REACHED),
            );
        } else if req.member_id.is_empty() {
            self.join_new_member(g, req, responder);
        } else {
            self.join_existing_member(g, req, responder);
        }
        self.maybe_complete_join_phase(g);
    }

    fn join_new_member(
        &mut self,
        g: &mut ClassicGroup,
        req: JoinGroupRequest,
        responder: ResponderId,
    ) {
        if g.is(Dead) {
            return self.respond_join(
                responder,
                JoinGroupResponse::error("", error_code::COORDINATOR_NOT_AVAILABLE),
            );
        }
        if !g.supports_protocols(&req.protocol_type, &req.protocols) {
            return self.respond_join(
                responder,
                JoinGroupResponse::error("", error_code::INCONSISTENT_GROUP_PROTOCOL),
            );
        }
        let prefix = req
            .group_instance_id
            .clone()
            .unwrap_or_else(|| req.client_id.clone());
        let member_id = self.generate_member_id(g, &prefix);
        if let Some(instance) = req.group_instance_id.clone() {
            match g.static_members.get(&instance).cloned() {
                Some(old) => self.update_static_member_then_rejoin(
                    g, req, &instance, &old, member_id, responder,
                ),
                None => self.add_member_then_rejoin(g, req, member_id, responder),
            }
        } else if req.api_version >= 4 {
            // The member must come back with this id, so that a client that retries after
            // a lost response does not leave a stray member behind.
            g.pending_join_members.insert(member_id.clone());
            self.schedule_heartbeat(g, &member_id, req.session_timeout_ms);
            self.respond_join(
                responder,
                JoinGroupResponse::error(&member_id, error_code::MEMBER_ID_REQUIRED),
            );
        } else {
            self.add_member_then_rejoin(g, req, member_id, responder);
        }
    }

    fn join_existing_member(
        &mut self,
        g: &mut ClassicGroup,
        req: JoinGroupRequest,
        responder: ResponderId,
    ) {
        let member_id = req.member_id.clone();
        if g.is(Dead) {
            return self.respond_join(
                responder,
                JoinGroupResponse::error(&member_id, error_code::COORDINATOR_NOT_AVAILABLE),
            );
        }
        if !g.supports_protocols(&req.protocol_type, &req.protocols) {
            return self.respond_join(
                responder,
                JoinGroupResponse::error(&member_id, error_code::INCONSISTENT_GROUP_PROTOCOL),
            );
        }
        if req.group_instance_id.is_none() && g.pending_join_members.contains(&member_id) {
            return self.add_member_then_rejoin(g, req, member_id, responder);
        }
        if let Err(code) = g.validate_member(&member_id, req.group_instance_id.as_deref()) {
            return self.respond_join(responder, JoinGroupResponse::error(&member_id, code));
        }
        let (is_leader, matches) = match g.members.get(&member_id) {
            Some(m) => (g.is_leader(&member_id), m.matches(&req.protocols)),
            None => (false, false),
        };
        match g.state {
            PreparingRebalance => self.update_member_then_rejoin(g, req, responder),
            CompletingRebalance if matches => {
                // Probably a retry after a lost response: answer with this generation.
                let response = join_response(g, &member_id, false);
                self.respond_join(responder, response);
            }
            CompletingRebalance => self.update_member_then_rejoin(g, req, responder),
            // The leader's JoinGroup always rebalances: it is how a leader reacts to
            // changes the metadata does not show (e.g. new partitions).
            Stable if is_leader || !matches => self.update_member_then_rejoin(g, req, responder),
            Stable => {
                let response = join_response(g, &member_id, false);
                self.respond_join(responder, response);
            }
            Empty | Dead => self.respond_join(
                responder,
                JoinGroupResponse::error(&member_id, error_code::UNKNOWN_MEMBER_ID),
            ),
        }
    }

    fn sync(&mut self, g: &mut ClassicGroup, req: SyncGroupRequest, responder: ResponderId) {
        if g.is(Dead) {
            return self.respond_sync(
                responder,
                SyncGroupResponse::error(error_code::COORDINATOR_NOT_AVAILABLE),
            );
        }
        if let Err(code) = g.validate_member(&req.member_id, req.group_instance_id.as_deref()) {
            return self.respond_sync(responder, SyncGroupResponse::error(code));
        }
        if req.generation_id != g.generation_id {
            return self.respond_sync(
                responder,
                SyncGroupResponse::error(error_code::ILLEGAL_GENERATION),
            );
        }
        let inconsistent = |asked: &Option<String>, have: &Option<String>| matches!((asked, have), (Some(a), Some(h)) if a != h);
        if inconsistent(&req.protocol_type, &g.protocol_type)
            || inconsistent(&req.protocol_name, &g.protocol_name)
        {
            return self.respond_sync(
                responder,
                SyncGroupResponse::error(error_code::INCONSISTENT_GROUP_PROTOCOL),
            );
        }
        match g.state {
            Empty | Dead => self.respond_sync(
                responder,
                SyncGroupResponse::error(error_code::UNKNOWN_MEMBER_ID),
            ),
            PreparingRebalance => self.respond_sync(
                responder,
                SyncGroupResponse::error(error_code::REBALANCE_IN_PROGRESS),
            ),
            CompletingRebalance => {
                let member_id = req.member_id.clone();
                let old = g
                    .members
                    .get_mut(&member_id)
                    .and_then(|m| m.awaiting_sync.replace(responder));
                if let Some(old) = old {
                    self.respond_sync(
                        old,
                        SyncGroupResponse::error(error_code::REBALANCE_IN_PROGRESS),
                    );
                }
                self.remove_pending_sync_member(g, &member_id);
                if g.is_leader(&member_id) {
                    let assignments: BTreeMap<String, Bytes> =
                        req.assignments.into_iter().collect();
                    // Members the leader left out get an empty assignment.
                    for m in g.members.values_mut() {
                        m.assignment = assignments.get(&m.member_id).cloned().unwrap_or_default();
                    }
                    g.transition_to(Stable, self.now);
                    self.write_group_metadata(g);
                    self.propagate_assignment(g, error_code::NONE);
                }
            }
            Stable => {
                self.remove_pending_sync_member(g, &req.member_id);
                let assignment = g
                    .members
                    .get(&req.member_id)
                    .map(|m| m.assignment.clone())
                    .unwrap_or_default();
                let response = SyncGroupResponse {
                    error_code: error_code::NONE,
                    protocol_type: g.protocol_type.clone(),
                    protocol_name: g.protocol_name.clone(),
                    assignment,
                };
                self.respond_sync(responder, response);
            }
        }
    }

    fn heartbeat(&mut self, g: &mut ClassicGroup, req: &HeartbeatRequest) -> i16 {
        if g.is(Dead) {
            return error_code::COORDINATOR_NOT_AVAILABLE;
        }
        if let Err(code) = g.validate_member(&req.member_id, req.group_instance_id.as_deref()) {
            return code;
        }
        if req.generation_id != g.generation_id {
            return error_code::ILLEGAL_GENERATION;
        }
        match g.state {
            Empty | Dead => error_code::UNKNOWN_MEMBER_ID,
            PreparingRebalance => {
                self.reschedule_member_heartbeat(g, &req.member_id);
                error_code::REBALANCE_IN_PROGRESS
            }
            CompletingRebalance | Stable => {
                self.reschedule_member_heartbeat(g, &req.member_id);
                error_code::NONE
            }
        }
    }

    fn remove_current_member(&mut self, g: &mut ClassicGroup, member_id: &str) {
        self.timer.cancel(&heartbeat_key(g, member_id));
        if let Some(m) = g.remove_member(member_id) {
            self.answer_parked(&m, "", error_code::UNKNOWN_MEMBER_ID);
        }
    }

    fn leave(&mut self, g: &mut ClassicGroup, req: LeaveGroupRequest) -> LeaveGroupResponse {
        if g.is(Dead) {
            return LeaveGroupResponse {
                error_code: error_code::COORDINATOR_NOT_AVAILABLE,
                members: Vec::new(),
            };
        }
        let mut results = Vec::with_capacity(req.members.len());
        let mut any_left = false;
        for ident in req.members {
            let code = if ident.member_id.is_empty() {
                // Administrative removal by group.instance.id (KIP-345).
                let static_id = ident
                    .group_instance_id
                    .as_ref()
                    .and_then(|i| g.static_members.get(i))
                    .cloned();
                match static_id {
                    Some(id) => {
                        self.remove_current_member(g, &id);
                        error_code::NONE
                    }
                    None => error_code::UNKNOWN_MEMBER_ID,
                }
            } else if g.pending_join_members.remove(&ident.member_id) {
                self.timer.cancel(&heartbeat_key(g, &ident.member_id));
                error_code::NONE
            } else {
                match g.validate_member(&ident.member_id, ident.group_instance_id.as_deref()) {
                    Ok(()) => {
                        self.remove_current_member(g, &ident.member_id);
                        error_code::NONE
                    }
                    Err(code) => code,
                }
            };
            any_left |= code == error_code::NONE;
            results.push(LeaveGroupMemberResponse {
                member_id: ident.member_id,
                group_instance_id: ident.group_instance_id,
                error_code: code,
            });
        }
        if any_left {
            match g.state {
                Stable | CompletingRebalance => self.maybe_prepare_rebalance_or_complete_join(g),
                PreparingRebalance => self.maybe_complete_join_phase(g),
                Empty | Dead => {}
            }
        }
        LeaveGroupResponse {
            error_code: error_code::NONE,
            members: results,
        }
    }

    // ----- offsets --------------------------------------------------------------------

    /// Kafka's `ClassicGroup.validateOffsetCommit`.
    fn validate_offset_commit(g: &ClassicGroup, req: &OffsetCommitRequest) -> Result<(), i16> {
        if g.is(Dead) {
            return Err(error_code::COORDINATOR_NOT_AVAILABLE);
        }
        let generation = req.generation_id_or_member_epoch;
        if generation < 0 && g.is(Empty) {
            // A commit from outside group management (admin tools, assign()-based
            // consumers) is allowed while nobody else owns the partitions.
            return Ok(());
        }
        if generation >= 0 || !req.member_id.is_empty() || req.group_instance_id.is_some() {
            g.validate_member(&req.member_id, req.group_instance_id.as_deref())?;
            if generation != g.generation_id {
                return Err(error_code::ILLEGAL_GENERATION);
            }
        } else if !g.is(Empty) {
            return Err(error_code::UNKNOWN_MEMBER_ID);
        }
        if g.is(CompletingRebalance) {
            // The member has its new generation but not yet its assignment.
            return Err(error_code::REBALANCE_IN_PROGRESS);
        }
        Ok(())
    }

    fn offset_commit(
        &mut self,
        g: &mut ClassicGroup,
        req: &OffsetCommitRequest,
    ) -> OffsetCommitResponse {
        if let Err(code) = Self::validate_offset_commit(g, req) {
            return commit_response(req, code);
        }
        if g.has_member(&req.member_id) && (g.is(Stable) || g.is(PreparingRebalance)) {
            // A commit shows the member is alive, like a heartbeat.
            self.reschedule_member_heartbeat(g, &req.member_id);
        }
        let max_metadata = usize::try_from(self.config.offset_metadata_max_bytes).unwrap_or(0);
        let expire_timestamp = if req.retention_time_ms >= 0 {
            self.now.saturating_add(req.retention_time_ms)
        } else {
            -1
        };
        let mut response = commit_response(req, error_code::NONE);
        for (t, rt) in req.topics.iter().zip(response.topics.iter_mut()) {
            for (p, rp) in t.partitions.iter().zip(rt.partitions.iter_mut()) {
                let metadata = p.committed_metadata.clone().unwrap_or_default();
                if metadata.len() > max_metadata {
                    rp.error_code = error_code::OFFSET_METADATA_TOO_LARGE;
                    continue;
                }
                let value = OffsetCommitValue {
                    offset: p.committed_offset,
                    leader_epoch: p.committed_leader_epoch,
                    metadata,
                    commit_timestamp: self.now,
                    expire_timestamp,
                };
                self.fx.record(
                    g.partition,
                    offset_commit_record(
                        &g.group_id,
                        &t.name,
                        p.partition_index,
                        Some(value.clone()),
                    ),
                );
                g.offsets.insert((t.name.clone(), p.partition_index), value);
            }
        }
        response
    }
}

impl GroupCoordinator {
    /// A coordinator that owns no partition yet; `seed` feeds the member id generator
    /// (the broker passes fresh randomness, tests a constant).
    pub fn new(config: GroupConfig, seed: u64) -> Self {
        GroupCoordinator {
            config,
            groups: BTreeMap::new(),
            partitions: BTreeMap::new(),
            timer: Timer::default(),
            rng: seed,
            join_seq: 0,
            read: CommittedOffsets::default(),
            next_write: 0,
            unsettled_tail: BTreeMap::new(),
            txn_offsets: PendingTxnOffsets::default(),
            consumer_groups: BTreeMap::new(),
            committed_consumer: CommittedConsumerGroups::default(),
            released: Vec::new(),
            topics: Arc::new(TopicsImage::default()),
            share_groups: BTreeMap::new(),
        }
    }

    /// Turns a call's effects into its outputs, naming its write if it has one. Every
    /// write is queued per partition for the consumer groups' committed view, with its
    /// consumer group records, so that reads can wait for it.
    pub(crate) fn finish(&mut self, fx: Effects) -> Vec<Output> {
        let write = WriteId(self.next_write);
        if !fx.records.is_empty() {
            self.next_write += 1;
            let mut by_partition: BTreeMap<i32, Vec<Record>> = BTreeMap::new();
            for (p, r) in &fx.records {
                let list = by_partition.entry(*p).or_default();
                if matches!(r, Record::ConsumerGroup(_) | Record::ShareGroup(_)) {
                    list.push(r.clone());
                }
            }
            for (p, records) in by_partition {
                self.committed_consumer.written(p, write, None, records);
            }
        }
        fx.into_outputs(write, &mut self.read)
    }

    /// The broker appended the `partition` records of `write` (an [`Output::Persist`]);
    /// its batch ended before `end_offset` (its last offset + 1).
    pub fn appended(&mut self, write: WriteId, partition: i32, end_offset: i64) {
        self.read.appended(partition, write, end_offset);
        self.committed_consumer
            .appended(partition, write, end_offset);
    }

    /// Answers that waited for writes `commit_up_to` found replicated (a consumer group
    /// heartbeat that wrote nothing after one that did): the broker sends them after the
    /// call to `commit_up_to` that released them.
    pub fn take_released(&mut self) -> Vec<Output> {
        std::mem::take(&mut self.released)
            .into_iter()
            .map(Output::Respond)
            .collect()
    }

    /// The high watermark of `partition` reached `offset`: the offset records written
    /// below it become visible to OffsetFetch. Returns how many records that made visible.
    pub fn commit_up_to(&mut self, partition: i32, offset: i64) -> usize {
        if !self.partitions.contains_key(&partition) {
            return 0;
        }
        if self
            .unsettled_tail
            .get(&partition)
            .is_some_and(|end| offset >= *end)
        {
            self.unsettled_tail.remove(&partition);
        }
        let released = self.committed_consumer.commit_up_to(partition, offset);
        self.released.extend(released);
        self.read.commit_up_to(partition, offset)
    }

    /// The partitions with offset records that OffsetFetch does not serve yet, whose high
    /// watermark the broker should report when it moves.
    pub fn uncommitted_partitions(&self) -> Vec<i32> {
        let mut partitions: Vec<i32> = self.read.pending_partitions().collect();
        // A loaded tail may end in records that are not offsets (group metadata): its
        // partition is watched until the mark passes it too.
        partitions.extend(self.unsettled_tail.keys().copied());
        partitions.extend(self.committed_consumer.pending_partitions());
        partitions.sort_unstable();
        partitions.dedup();
        partitions
    }

    /// Offset records written to `partition` that OffsetFetch does not serve yet.
    pub fn uncommitted_offset_records(&self, partition: i32) -> usize {
        self.read.pending_records(partition)
    }

    pub fn config(&self) -> &GroupConfig {
        &self.config
    }

    /// The `__consumer_offsets` partition of a group.
    pub fn partition_for(&self, group_id: &str) -> i32 {
        partition_for(group_id, self.config.offsets_topic_num_partitions)
    }

    pub(crate) fn split<'a>(
        &'a mut self,
        now_ms: i64,
        fx: &'a mut Effects,
    ) -> (&'a mut BTreeMap<String, ClassicGroup>, Ctx<'a>) {
        let GroupCoordinator {
            config,
            groups,
            timer,
            rng,
            join_seq,
            ..
        } = self;
        (
            groups,
            Ctx {
                config,
                timer,
                rng,
                join_seq,
                now: now_ms,
                fx,
            },
        )
    }

    /// NOT_COORDINATOR or COORDINATOR_LOAD_IN_PROGRESS when this node cannot answer for
    /// the group now.
    pub(crate) fn coordinator_error(&self, group_id: &str) -> Option<i16> {
        match self.partitions.get(&self.partition_for(group_id)) {
            None => Some(error_code::NOT_COORDINATOR),
            Some(PartitionState::Loading) => Some(error_code::COORDINATOR_LOAD_IN_PROGRESS),
            Some(PartitionState::Active) => None,
        }
    }

    /// JoinGroup. The response is usually parked until the join phase ends (a later
    /// call or `tick` returns it under `responder`).
    pub fn handle_join(
        &mut self,
        req: JoinGroupRequest,
        now_ms: i64,
        responder: ResponderId,
    ) -> Vec<Output> {
        let mut fx = Effects::default();
        let early = if req.group_id.is_empty() {
            Some(error_code::INVALID_GROUP_ID)
        } else if let Some(code) = self.coordinator_error(&req.group_id) {
            Some(code)
        } else if self.share_groups.contains_key(&req.group_id) {
            // The id is a share group's (KIP-932): Kafka answers a classic member so.
            Some(error_code::INCONSISTENT_GROUP_PROTOCOL)
        } else if req.session_timeout_ms < self.config.group_min_session_timeout_ms
            || req.session_timeout_ms > self.config.group_max_session_timeout_ms
        {
            Some(error_code::INVALID_SESSION_TIMEOUT)
        } else if !self.groups.contains_key(&req.group_id)
            && !self.consumer_groups.contains_key(&req.group_id)
            && !req.member_id.is_empty()
        {
            // A known member id for a group that does not exist: the member must reset.
            Some(error_code::UNKNOWN_MEMBER_ID)
        } else {
            None
        };
        if let Some(code) = early {
            fx.respond(
                responder,
                Response::JoinGroup(JoinGroupResponse::error(&req.member_id, code)),
            );
            return self.finish(fx);
        }
        if self
            .consumer_groups
            .get(&req.group_id)
            .is_some_and(|g| !g.members.is_empty())
        {
            // A consumer group (KIP-848) with members serves classic members too: the
            // online migration (`consumer_group_migration.rs`).
            return self.classic_join_to_consumer_group(req, now_ms, responder);
        }
        if self.consumer_groups.contains_key(&req.group_id) {
            // Kafka's `maybeDeleteEmptyConsumerGroup`: an Empty consumer group gives its
            // id (and its offsets) to the classic group.
            let partition = self.partition_for(&req.group_id);
            let offsets = self
                .consumer_groups
                .get(&req.group_id)
                .map(|g| g.offsets.clone())
                .unwrap_or_default();
            if let Some(g) = self.consumer_groups.remove(&req.group_id) {
                for r in g.tombstones() {
                    fx.record(partition, Record::ConsumerGroup(r));
                }
                self.timer.cancel_group(&req.group_id);
            }
            let mut classic = ClassicGroup::new(req.group_id.clone(), partition, Some(now_ms));
            classic.offsets = offsets;
            self.groups.insert(req.group_id.clone(), classic);
        }
        let partition = self.partition_for(&req.group_id);
        self.groups
            .entry(req.group_id.clone())
            .or_insert_with(|| ClassicGroup::new(req.group_id.clone(), partition, Some(now_ms)));
        let group_id = req.group_id.clone();
        let (groups, mut cx) = self.split(now_ms, &mut fx);
        if let Some(g) = groups.get_mut(&group_id) {
            cx.join(g, req, responder);
        }
        self.finish(fx)
    }

    /// SyncGroup. A follower's response is parked until the leader's SyncGroup arrives.
    pub fn handle_sync(
        &mut self,
        req: SyncGroupRequest,
        now_ms: i64,
        responder: ResponderId,
    ) -> Vec<Output> {
        let mut fx = Effects::default();
        let early = if req.group_id.is_empty() {
            Some(error_code::INVALID_GROUP_ID)
        } else if let Some(code) = self.coordinator_error(&req.group_id) {
            Some(code)
        } else if !self.groups.contains_key(&req.group_id) {
            Some(error_code::UNKNOWN_MEMBER_ID)
        } else {
            None
        };
        if let Some(code) = early {
            if code == error_code::UNKNOWN_MEMBER_ID
                && self.consumer_groups.contains_key(&req.group_id)
            {
                return self.classic_sync_to_consumer_group(req, now_ms, responder);
            }
            fx.respond(
                responder,
                Response::SyncGroup(SyncGroupResponse::error(code)),
            );
            return self.finish(fx);
        }
        let group_id = req.group_id.clone();
        let (groups, mut cx) = self.split(now_ms, &mut fx);
        if let Some(g) = groups.get_mut(&group_id) {
            cx.sync(g, req, responder);
        }
        self.finish(fx)
    }

    /// Heartbeat; answered at once and never writes records.
    pub fn handle_heartbeat(&mut self, req: HeartbeatRequest, now_ms: i64) -> HeartbeatResponse {
        let error_code = if req.group_id.is_empty() {
            error_code::INVALID_GROUP_ID
        } else if let Some(code) = self.coordinator_error(&req.group_id) {
            code
        } else {
            if self.consumer_groups.contains_key(&req.group_id) {
                return HeartbeatResponse {
                    error_code: self.classic_heartbeat_to_consumer_group(&req, now_ms),
                };
            }
            let mut fx = Effects::default();
            let (groups, mut cx) = self.split(now_ms, &mut fx);
            match groups.get_mut(&req.group_id) {
                Some(g) => cx.heartbeat(g, &req),
                None => error_code::UNKNOWN_MEMBER_ID,
            }
        };
        HeartbeatResponse { error_code }
    }

    /// LeaveGroup (v3+ batched form; older versions are one identity).
    pub fn handle_leave(
        &mut self,
        req: LeaveGroupRequest,
        now_ms: i64,
        responder: ResponderId,
    ) -> Vec<Output> {
        let mut fx = Effects::default();
        let early = if req.group_id.is_empty() {
            Some(error_code::INVALID_GROUP_ID)
        } else if let Some(code) = self.coordinator_error(&req.group_id) {
            Some(code)
        } else if !self.groups.contains_key(&req.group_id) {
            Some(error_code::UNKNOWN_MEMBER_ID)
        } else {
            None
        };
        let response = match early {
            Some(error_code::UNKNOWN_MEMBER_ID)
                if self.consumer_groups.contains_key(&req.group_id) =>
            {
                self.classic_leave_to_consumer_group(req, now_ms, &mut fx)
            }
            Some(code) => LeaveGroupResponse {
                error_code: code,
                members: Vec::new(),
            },
            None => {
                let group_id = req.group_id.clone();
                let (groups, mut cx) = self.split(now_ms, &mut fx);
                match groups.get_mut(&group_id) {
                    Some(g) => cx.leave(g, req),
                    None => LeaveGroupResponse {
                        error_code: error_code::UNKNOWN_MEMBER_ID,
                        members: Vec::new(),
                    },
                }
            }
        };
        fx.respond(responder, Response::LeaveGroup(response));
        self.finish(fx)
    }

    /// OffsetCommit; the response waits for the offset records.
    pub fn handle_offset_commit(
        &mut self,
        req: OffsetCommitRequest,
        now_ms: i64,
        responder: ResponderId,
    ) -> Vec<Output> {
        let mut fx = Effects::default();
        if self.coordinator_error(&req.group_id).is_none()
            && self.consumer_groups.contains_key(&req.group_id)
        {
            let response = self.consumer_offset_commit(&req, now_ms, &mut fx);
            fx.respond(responder, Response::OffsetCommit(response));
            return self.finish(fx);
        }
        let early = if let Some(code) = self.coordinator_error(&req.group_id) {
            Some(code)
        } else if self.share_groups.contains_key(&req.group_id) {
            // A share group commits no offsets (KIP-932); Kafka finds no group to take them.
            Some(error_code::GROUP_ID_NOT_FOUND)
        } else if !self.groups.contains_key(&req.group_id) {
            if req.generation_id_or_member_epoch < 0 {
                // A simple group: offsets only, no membership.
                let partition = self.partition_for(&req.group_id);
                self.groups.insert(
                    req.group_id.clone(),
                    ClassicGroup::new(req.group_id.clone(), partition, Some(now_ms)),
                );
                None
            } else if req.api_version >= 9 {
                Some(error_code::GROUP_ID_NOT_FOUND)
            } else {
                Some(error_code::ILLEGAL_GENERATION)
            }
        } else {
            None
        };
        let response = match early {
            Some(code) => commit_response(&req, code),
            None => {
                let (groups, mut cx) = self.split(now_ms, &mut fx);
                match groups.get_mut(&req.group_id) {
                    Some(g) => cx.offset_commit(g, &req),
                    None => commit_response(&req, error_code::ILLEGAL_GENERATION),
                }
            }
        };
        fx.respond(responder, Response::OffsetCommit(response));
        self.finish(fx)
    }

    /// OffsetCommit to a consumer group: the member epoch is checked (STALE_MEMBER_EPOCH,
    /// UNKNOWN_MEMBER_ID), then the offsets are written as for a classic group.
    fn consumer_offset_commit(
        &mut self,
        req: &OffsetCommitRequest,
        now_ms: i64,
        fx: &mut Effects,
    ) -> OffsetCommitResponse {
        let max_metadata = usize::try_from(self.config.offset_metadata_max_bytes).unwrap_or(0);
        let Some(g) = self.consumer_groups.get_mut(&req.group_id) else {
            return commit_response(req, error_code::GROUP_ID_NOT_FOUND);
        };
        if let Err(code) = Self::validate_consumer_offset_commit(g, req, false) {
            return commit_response(req, code);
        }
        let expire_timestamp = if req.retention_time_ms >= 0 {
            now_ms.saturating_add(req.retention_time_ms)
        } else {
            -1
        };
        let mut response = commit_response(req, error_code::NONE);
        for (t, rt) in req.topics.iter().zip(response.topics.iter_mut()) {
            for (p, rp) in t.partitions.iter().zip(rt.partitions.iter_mut()) {
                let metadata = p.committed_metadata.clone().unwrap_or_default();
                if metadata.len() > max_metadata {
                    rp.error_code = error_code::OFFSET_METADATA_TOO_LARGE;
                    continue;
                }
                let value = OffsetCommitValue {
                    offset: p.committed_offset,
                    leader_epoch: p.committed_leader_epoch,
                    metadata,
                    commit_timestamp: now_ms,
                    expire_timestamp,
                };
                fx.record(
                    g.partition,
                    offset_commit_record(
                        &g.group_id,
                        &t.name,
                        p.partition_index,
                        Some(value.clone()),
                    ),
                );
                g.offsets.insert((t.name.clone(), p.partition_index), value);
            }
        }
        response
    }

    /// TxnOffsetCommit: the offsets are written in the producer's transactional batch
    /// and kept pending, apart from the group's offsets, until
    /// [`GroupCoordinator::complete_transaction`]; the response waits for the records
    /// like an OffsetCommit's. Kafka's checks: a commit without a generation (-1, from a
    /// producer that does not send the group's metadata) is accepted without a member;
    /// one with a generation must come from a current member.
    pub fn handle_txn_offset_commit(
        &mut self,
        req: TxnOffsetCommitRequest,
        now_ms: i64,
        responder: ResponderId,
    ) -> Vec<Output> {
        let commit = &req.commit;
        let check = if let Some(code) = self.coordinator_error(&commit.group_id) {
            Err(code)
        } else {
            match self.groups.get(&commit.group_id) {
                _ if commit.generation_id_or_member_epoch < 0 && commit.member_id.is_empty() => {
                    Ok(())
                }
                None if self.consumer_groups.contains_key(&commit.group_id) => self
                    .consumer_groups
                    .get(&commit.group_id)
                    .map_or(Ok(()), |g| {
                        Self::validate_consumer_offset_commit(g, commit, true)
                    }),
                Some(g) if g.is(Dead) => Err(error_code::COORDINATOR_NOT_AVAILABLE),
                Some(_) | None
                    if commit.generation_id_or_member_epoch < 0 && commit.member_id.is_empty() =>
                {
                    Ok(())
                }
                Some(g) => Ctx::validate_offset_commit(g, commit),
                None => Err(error_code::ILLEGAL_GENERATION),
            }
        };
        if let Err(code) = check {
            return vec![Output::Respond(Respond {
                responder,
                response: Response::OffsetCommit(commit_response(commit, code)),
            })];
        }
        let partition = self.partition_for(&commit.group_id);
        let max_metadata = usize::try_from(self.config.offset_metadata_max_bytes).unwrap_or(0);
        let mut response = commit_response(commit, error_code::NONE);
        let mut records = Vec::new();
        for (t, rt) in commit.topics.iter().zip(response.topics.iter_mut()) {
            for (p, rp) in t.partitions.iter().zip(rt.partitions.iter_mut()) {
                let metadata = p.committed_metadata.clone().unwrap_or_default();
                if metadata.len() > max_metadata {
                    rp.error_code = error_code::OFFSET_METADATA_TOO_LARGE;
                    continue;
                }
                let record = OffsetCommitRecord {
                    key: OffsetCommitKey {
                        group: commit.group_id.clone(),
                        topic: t.name.clone(),
                        partition: p.partition_index,
                    },
                    value: Some(OffsetCommitValue {
                        offset: p.committed_offset,
                        leader_epoch: p.committed_leader_epoch,
                        metadata,
                        commit_timestamp: now_ms,
                        expire_timestamp: -1,
                    }),
                };
                self.txn_offsets
                    .add(req.producer_id, partition, record.clone());
                records.push((partition, Record::OffsetCommit(record)));
            }
        }
        let respond = Respond {
            responder,
            response: Response::OffsetCommit(response),
        };
        if records.is_empty() {
            return vec![Output::Respond(respond)];
        }
        let write = WriteId(self.next_write);
        self.next_write += 1;
        vec![Output::PersistTransactional {
            write,
            producer_id: req.producer_id,
            producer_epoch: req.producer_epoch,
            records,
            responses: vec![respond],
        }]
    }

    /// The COMMIT (`commit`) or ABORT marker of `producer_id`'s transaction is on
    /// `partition` and replicated: its pending offsets become the groups' committed
    /// offsets, visible to OffsetFetch, or are dropped. Returns how many were committed.
    pub fn complete_transaction(
        &mut self,
        partition: i32,
        producer_id: i64,
        commit: bool,
    ) -> usize {
        let records = self.txn_offsets.take(partition, producer_id);
        if !commit {
            return 0;
        }
        for r in &records {
            let group_id = r.key.group.clone();
            if let Some(g) = self.consumer_groups.get_mut(&group_id) {
                if let Some(value) = &r.value {
                    g.offsets
                        .insert((r.key.topic.clone(), r.key.partition), value.clone());
                }
                self.read.apply(r);
                continue;
            }
            let g = self
                .groups
                .entry(group_id.clone())
                .or_insert_with(|| ClassicGroup::new(group_id, partition, None));
            if let Some(value) = &r.value {
                g.offsets
                    .insert((r.key.topic.clone(), r.key.partition), value.clone());
            }
            self.read.apply(r);
        }
        records.len()
    }

    /// Offset records of open transactions on `partition`.
    pub fn pending_transactional_offsets(&self, partition: i32) -> usize {
        self.txn_offsets.pending_records(partition)
    }

    /// OffsetFetch for one group; answered at once.
    pub fn handle_offset_fetch(&self, req: &OffsetFetchRequest) -> OffsetFetchResponse {
        let unsettled = self
            .unsettled_tail
            .contains_key(&self.partition_for(&req.group_id))
            .then_some(error_code::COORDINATOR_LOAD_IN_PROGRESS);
        if let Some(code) = self.coordinator_error(&req.group_id).or(unsettled) {
            return OffsetFetchResponse {
                error_code: code,
                topics: Vec::new(),
            };
        }
        if let Err(code) = self.validate_consumer_offset_fetch(req) {
            return OffsetFetchResponse {
                error_code: code,
                topics: Vec::new(),
            };
        }
        // Only what is replicated: a commit still above the high watermark could be
        // truncated, and a committed offset must never go backwards.
        let group = self.read.group(&req.group_id);
        let partition_response = |topic: &str, partition: i32| match group
            .and_then(|offsets| offsets.get(&(topic.to_owned(), partition)))
        {
            _ if req.require_stable
                && self.txn_offsets.is_pending(&req.group_id, topic, partition) =>
            {
                OffsetFetchResponsePartition {
                    partition_index: partition,
                    committed_offset: -1,
                    committed_leader_epoch: -1,
                    metadata: Some(String::new()),
                    error_code: error_code::UNSTABLE_OFFSET_COMMIT,
                }
            }
            Some(v) => OffsetFetchResponsePartition {
                partition_index: partition,
                committed_offset: v.offset,
                committed_leader_epoch: v.leader_epoch,
                metadata: Some(v.metadata.clone()),
                error_code: error_code::NONE,
            },
            None => OffsetFetchResponsePartition {
                partition_index: partition,
                committed_offset: -1,
                committed_leader_epoch: -1,
                metadata: Some(String::new()),
                error_code: error_code::NONE,
            },
        };
        let topics = match &req.topics {
            Some(topics) => topics
                .iter()
                .map(|t| OffsetFetchResponseTopic {
                    name: t.name.clone(),
                    partitions: t
                        .partition_indexes
                        .iter()
                        .map(|p| partition_response(&t.name, *p))
                        .collect(),
                })
                .collect(),
            None => {
                let mut by_topic: BTreeMap<&str, Vec<OffsetFetchResponsePartition>> =
                    BTreeMap::new();
                if let Some(offsets) = group {
                    for (topic, partition) in offsets.keys() {
                        by_topic
                            .entry(topic.as_str())
                            .or_default()
                            .push(partition_response(topic, *partition));
                    }
                }
                by_topic
                    .into_iter()
                    .map(|(name, partitions)| OffsetFetchResponseTopic {
                        name: name.to_owned(),
                        partitions,
                    })
                    .collect()
            }
        };
        OffsetFetchResponse {
            error_code: error_code::NONE,
            topics,
        }
    }

    /// OffsetDelete: tombstones for the partitions the group does not consume.
    pub fn handle_offset_delete(
        &mut self,
        req: OffsetDeleteRequest,
        _now_ms: i64,
        responder: ResponderId,
    ) -> Vec<Output> {
        let mut fx = Effects::default();
        let top = |code| OffsetDeleteResponse {
            error_code: code,
            topics: Vec::new(),
        };
        let response = if let Some(code) = self.coordinator_error(&req.group_id) {
            top(code)
        } else if let Some(g) = self.consumer_groups.get_mut(&req.group_id) {
            let mut topics = Vec::with_capacity(req.topics.len());
            for t in &req.topics {
                let subscribed = g.is_subscribed_to_topic(&t.name);
                let mut partitions = Vec::with_capacity(t.partitions.len());
                for p in &t.partitions {
                    let code = if subscribed {
                        error_code::GROUP_SUBSCRIBED_TO_TOPIC
                    } else {
                        if g.offsets.remove(&(t.name.clone(), *p)).is_some() {
                            fx.record(
                                g.partition,
                                offset_commit_record(&g.group_id, &t.name, *p, None),
                            );
                        }
                        error_code::NONE
                    };
                    partitions.push(OffsetDeleteResponsePartition {
                        partition_index: *p,
                        error_code: code,
                    });
                }
                topics.push(OffsetDeleteResponseTopic {
                    name: t.name.clone(),
                    partitions,
                });
            }
            OffsetDeleteResponse {
                error_code: error_code::NONE,
                topics,
            }
        } else {
            match self.groups.get_mut(&req.group_id) {
                None => top(error_code::GROUP_ID_NOT_FOUND),
                Some(g) if g.is(Dead) => top(error_code::GROUP_ID_NOT_FOUND),
                Some(g)
                    if !g.is(Empty)
                        && g.protocol_type.as_deref() != Some(CONSUMER_PROTOCOL_TYPE) =>
                {
                    // Without the consumer protocol there is no way to tell which topics
                    // the members use.
                    top(error_code::NON_EMPTY_GROUP)
                }
                Some(g) => {
                    let mut topics = Vec::with_capacity(req.topics.len());
                    for t in &req.topics {
                        let subscribed = g.is_subscribed_to_topic(&t.name);
                        let mut partitions = Vec::with_capacity(t.partitions.len());
                        for p in &t.partitions {
                            let code = if subscribed {
                                error_code::GROUP_SUBSCRIBED_TO_TOPIC
                            } else {
                                if g.offsets.remove(&(t.name.clone(), *p)).is_some() {
                                    fx.record(
                                        g.partition,
                                        offset_commit_record(&g.group_id, &t.name, *p, None),
                                    );
                                }
                                error_code::NONE
                            };
                            partitions.push(OffsetDeleteResponsePartition {
                                partition_index: *p,
                                error_code: code,
                            });
                        }
                        topics.push(OffsetDeleteResponseTopic {
                            name: t.name.clone(),
                            partitions,
                        });
                    }
                    OffsetDeleteResponse {
                        error_code: error_code::NONE,
                        topics,
                    }
                }
            }
        };
        fx.respond(responder, Response::OffsetDelete(response));
        self.finish(fx)
    }

    /// DescribeGroups; answered at once.
    pub fn handle_describe_groups(&self, req: &DescribeGroupsRequest) -> DescribeGroupsResponse {
        let groups = req
            .groups
            .iter()
            .map(|group_id| {
                let blank = |code: i16, state: &str| DescribedGroup {
                    error_code: code,
                    group_id: group_id.clone(),
                    group_state: state.to_owned(),
                    protocol_type: String::new(),
                    protocol_data: String::new(),
                    members: Vec::new(),
                };
                if let Some(code) = self.coordinator_error(group_id) {
                    return blank(code, "");
                }
                let Some(g) = self.groups.get(group_id) else {
                    let code = if req.api_version >= 6 {
                        error_code::GROUP_ID_NOT_FOUND
                    } else {
                        error_code::NONE
                    };
                    return blank(code, "Dead");
                };
                let stable = g.is(Stable);
                let protocol = g.protocol_name.clone().unwrap_or_default();
                let mut members: Vec<&ClassicGroupMember> = g.members.values().collect();
                members.sort_by_key(|m| m.join_seq);
                DescribedGroup {
                    error_code: error_code::NONE,
                    group_id: group_id.clone(),
                    group_state: g.state.to_string(),
                    protocol_type: g.protocol_type.clone().unwrap_or_default(),
                    protocol_data: if stable {
                        protocol.clone()
                    } else {
                        String::new()
                    },
                    members: members
                        .into_iter()
                        .map(|m| DescribedGroupMember {
                            member_id: m.member_id.clone(),
                            group_instance_id: m.group_instance_id.clone(),
                            client_id: m.client_id.clone(),
                            client_host: m.client_host.clone(),
                            member_metadata: if stable {
                                m.metadata(&protocol)
                            } else {
                                Bytes::new()
                            },
                            member_assignment: if stable {
                                m.assignment.clone()
                            } else {
                                Bytes::new()
                            },
                        })
                        .collect(),
                }
            })
            .collect();
        DescribeGroupsResponse { groups }
    }

    /// ListGroups over the partitions this node coordinates.
    pub fn handle_list_groups(&self, req: &ListGroupsRequest) -> ListGroupsResponse {
        if self
            .partitions
            .values()
            .any(|s| *s == PartitionState::Loading)
        {
            return ListGroupsResponse {
                error_code: error_code::COORDINATOR_LOAD_IN_PROGRESS,
                groups: Vec::new(),
            };
        }
        let type_ok = |name: &str| {
            req.types_filter.is_empty()
                || req
                    .types_filter
                    .iter()
                    .any(|t| t.eq_ignore_ascii_case(name))
        };
        let state_ok = |state: &str| {
            req.states_filter.is_empty()
                || req
                    .states_filter
                    .iter()
                    .any(|s| s.eq_ignore_ascii_case(state))
        };
        let mut groups: Vec<ListedGroup> = Vec::new();
        if type_ok("classic") {
            groups.extend(
                self.groups
                    .values()
                    .filter(|g| state_ok(&g.state.to_string()))
                    .map(|g| ListedGroup {
                        group_id: g.group_id.clone(),
                        protocol_type: g.protocol_type.clone().unwrap_or_default(),
                        group_state: g.state.to_string(),
                        group_type: "classic".to_owned(),
                    }),
            );
        }
        if type_ok("share") {
            groups.extend(
                self.listed_share_groups()
                    .filter(|g| state_ok(&g.state().to_string()))
                    .map(|g| ListedGroup {
                        group_id: g.group_id.clone(),
                        protocol_type: crate::SHARE_PROTOCOL_TYPE.to_owned(),
                        group_state: g.state().to_string(),
                        group_type: "share".to_owned(),
                    }),
            );
        }
        if type_ok("consumer") {
            // As of the high watermark (KIP-848's groups are read at the last committed
            // offset), except an id the classic side has taken since.
            groups.extend(
                self.committed_consumer
                    .groups()
                    .filter(|g| !self.groups.contains_key(&g.group_id))
                    .filter(|g| state_ok(&g.state().to_string()))
                    .map(|g| ListedGroup {
                        group_id: g.group_id.clone(),
                        protocol_type: CONSUMER_PROTOCOL_TYPE.to_owned(),
                        group_state: g.state().to_string(),
                        group_type: "consumer".to_owned(),
                    }),
            );
        }
        ListGroupsResponse {
            error_code: error_code::NONE,
            groups,
        }
    }

    /// DeleteGroups: only Empty groups; their offsets and metadata get tombstones.
    pub fn handle_delete_groups(
        &mut self,
        req: DeleteGroupsRequest,
        now_ms: i64,
        responder: ResponderId,
    ) -> Vec<Output> {
        let mut fx = Effects::default();
        let mut results = Vec::with_capacity(req.groups_names.len());
        for group_id in req.groups_names {
            let consumer_empty = self
                .consumer_groups
                .get(&group_id)
                .map(|g| g.members.is_empty());
            let code = if let Some(code) = self.coordinator_error(&group_id) {
                code
            } else if self.share_groups.contains_key(&group_id) {
                self.delete_share_group(&group_id, &mut fx)
            } else if let Some(empty) = consumer_empty {
                if empty {
                    self.delete_consumer_group(&group_id, &mut fx);
                    error_code::NONE
                } else {
                    error_code::NON_EMPTY_GROUP
                }
            } else {
                match self.groups.get(&group_id).map(|g| g.state) {
                    None | Some(Dead) => error_code::GROUP_ID_NOT_FOUND,
                    Some(Stable | PreparingRebalance | CompletingRebalance) => {
                        error_code::NON_EMPTY_GROUP
                    }
                    Some(Empty) => {
                        self.delete_group(&group_id, now_ms, &mut fx);
                        error_code::NONE
                    }
                }
            };
            results.push(DeletableGroupResult {
                group_id,
                error_code: code,
            });
        }
        fx.respond(
            responder,
            Response::DeleteGroups(DeleteGroupsResponse { results }),
        );
        self.finish(fx)
    }

    /// Tombstones for every offset and the metadata; the group is forgotten.
    fn delete_group(&mut self, group_id: &str, now_ms: i64, fx: &mut Effects) {
        let Some(mut g) = self.groups.remove(group_id) else {
            return;
        };
        for (topic, partition) in g.offsets.keys() {
            fx.record(
                g.partition,
                offset_commit_record(group_id, topic, *partition, None),
            );
        }
        fx.record(g.partition, group_tombstone(group_id));
        g.transition_to(Dead, now_ms);
        self.timer.cancel_group(group_id);
    }

    /// Fires every deadline due at `now_ms`: session expiry, the end of a join phase
    /// (initial delay or rebalance timeout), pending-sync expiry, offset retention.
    pub fn tick(&mut self, now_ms: i64) -> Vec<Output> {
        let mut fx = Effects::default();
        for _ in 0..MAX_TIMERS_PER_TICK {
            let Some(key) = self.timer.pop_expired(now_ms) else {
                break;
            };
            self.fire(key, now_ms, &mut fx);
        }
        self.finish(fx)
    }

    /// When `tick` next has something to do.
    pub fn next_deadline(&self) -> Option<i64> {
        self.timer.next_deadline()
    }

    fn fire(&mut self, key: TimerKey, now_ms: i64, fx: &mut Effects) {
        match key {
            TimerKey::OffsetExpiration => {
                self.expire_offsets(now_ms, fx);
                if !self.partitions.is_empty() {
                    self.timer.schedule(
                        TimerKey::OffsetExpiration,
                        now_ms + self.config.offsets_retention_check_interval_ms.max(1),
                    );
                }
            }
            TimerKey::Heartbeat {
                group_id,
                member_id,
            } => {
                let (groups, mut cx) = self.split(now_ms, fx);
                if let Some(g) = groups.get_mut(&group_id) {
                    cx.on_heartbeat_expired(g, &member_id);
                }
            }
            TimerKey::Join { group_id } => {
                let (groups, mut cx) = self.split(now_ms, fx);
                if let Some(g) = groups.get_mut(&group_id) {
                    cx.on_join_timer(g);
                }
            }
            TimerKey::PendingSync { group_id } => {
                let (groups, mut cx) = self.split(now_ms, fx);
                if let Some(g) = groups.get_mut(&group_id) {
                    cx.on_pending_sync_expired(g);
                }
            }
            TimerKey::ConsumerSession {
                group_id,
                member_id,
            } => self.on_consumer_member_timeout(&group_id, &member_id, false, now_ms, fx),
            TimerKey::ConsumerRebalance {
                group_id,
                member_id,
            } => self.on_consumer_member_timeout(&group_id, &member_id, true, now_ms, fx),
            TimerKey::ShareSession {
                group_id,
                member_id,
            } => self.on_share_session_timeout(&group_id, &member_id, fx),
        }
    }

    /// Kafka's offset retention (KIP-211): offsets expire only while the group is Empty,
    /// once `offsets.retention.minutes` have passed since the group became Empty (or,
    /// without that time, since the commit); offsets of a simple group (no protocol
    /// type) expire by commit time; an explicit expire timestamp (OffsetCommit v2-v4)
    /// wins. An Empty group left with no offsets is deleted.
    fn expire_offsets(&mut self, now_ms: i64, fx: &mut Effects) {
        let retention_ms = self.config.offsets_retention_ms();
        let mut deleted = Vec::new();
        for g in self.groups.values_mut() {
            if self.partitions.get(&g.partition) != Some(&PartitionState::Active) {
                continue;
            }
            let base: Option<Option<i64>> = match (&g.protocol_type, g.state) {
                (None, _) => Some(None),
                (Some(_), Empty) => Some(g.current_state_timestamp_ms),
                _ => None,
            };
            if let Some(state_base) = base {
                let expired: Vec<(String, i32)> = g
                    .offsets
                    .iter()
                    .filter(|(_, v)| {
                        if v.expire_timestamp >= 0 {
                            now_ms >= v.expire_timestamp
                        } else {
                            now_ms - state_base.unwrap_or(v.commit_timestamp) >= retention_ms
                        }
                    })
                    .map(|(k, _)| k.clone())
                    .collect();
                for (topic, partition) in expired {
                    g.offsets.remove(&(topic.clone(), partition));
                    fx.record(
                        g.partition,
                        offset_commit_record(&g.group_id, &topic, partition, None),
                    );
                }
            }
            if g.is(Empty)
                && g.offsets.is_empty()
                && g.members.is_empty()
                && g.pending_join_members.is_empty()
            {
                deleted.push(g.group_id.clone());
            }
        }
        for group_id in deleted {
            self.delete_group(&group_id, now_ms, fx);
        }
        // Consumer groups (Kafka's `ConsumerGroup.offsetExpirationCondition`): by commit
        // time, only for topics the group does not consume; an Empty group left with no
        // offsets is deleted.
        let mut deleted = Vec::new();
        for g in self.consumer_groups.values_mut() {
            if self.partitions.get(&g.partition) != Some(&PartitionState::Active) {
                continue;
            }
            let expired: Vec<(String, i32)> = g
                .offsets
                .iter()
                .filter(|((topic, _), v)| {
                    !g.is_subscribed_to_topic(topic)
                        && if v.expire_timestamp >= 0 {
                            now_ms >= v.expire_timestamp
                        } else {
                            now_ms - v.commit_timestamp >= retention_ms
                        }
                })
                .map(|(k, _)| k.clone())
                .collect();
            for (topic, partition) in expired {
                g.offsets.remove(&(topic.clone(), partition));
                fx.record(
                    g.partition,
                    offset_commit_record(&g.group_id, &topic, partition, None),
                );
            }
            if g.members.is_empty() && g.offsets.is_empty() {
                deleted.push(g.group_id.clone());
            }
        }
        for group_id in deleted {
            self.delete_consumer_group(&group_id, fx);
        }
    }

    /// Starts loading a partition (this node became its coordinator): until
    /// `load_partition_done`, its groups answer COORDINATOR_LOAD_IN_PROGRESS. Any state
    /// left from an earlier ownership is dropped first.
    pub fn load_partition_start(&mut self, partition: i32) -> Vec<Output> {
        let outputs = self.unload_partition(partition);
        self.partitions.insert(partition, PartitionState::Loading);
        outputs
    }

    /// Applies one record read from `__consumer_offsets` during a load, one that is below
    /// the partition's high watermark (committed). Later records win; a tombstone deletes.
    pub fn replay(&mut self, partition: i32, record: &Record) -> Result<(), GroupError> {
        self.replay_into_groups(partition, record)?;
        match record {
            Record::OffsetCommit(r) => self.read.apply(r),
            Record::ConsumerGroup(_) | Record::ShareGroup(_) => {
                self.committed_consumer.apply(partition, record)
            }
            Record::GroupMetadata(_) => {}
        }
        Ok(())
    }

    /// Like [`GroupCoordinator::replay`] for a record at `offset` at or above the
    /// high watermark: the groups take it at once, OffsetFetch only once
    /// [`GroupCoordinator::commit_up_to`] passes it (a new leader's tail may not be on
    /// every in-sync replica yet).
    pub fn replay_uncommitted(
        &mut self,
        partition: i32,
        offset: i64,
        record: &Record,
    ) -> Result<(), GroupError> {
        self.replay_into_groups(partition, record)?;
        let end = offset.saturating_add(1);
        let tail = self.unsettled_tail.entry(partition).or_insert(end);
        *tail = (*tail).max(end);
        let write = WriteId(self.next_write);
        self.next_write += 1;
        if let Record::OffsetCommit(r) = record {
            self.read.written(
                partition,
                write,
                Some(offset.saturating_add(1)),
                vec![r.clone()],
            );
        }
        let consumer = match record {
            Record::ConsumerGroup(_) | Record::ShareGroup(_) => vec![record.clone()],
            _ => Vec::new(),
        };
        self.committed_consumer
            .written(partition, write, Some(offset.saturating_add(1)), consumer);
        Ok(())
    }

    fn replay_into_groups(&mut self, partition: i32, record: &Record) -> Result<(), GroupError> {
        if self.partitions.get(&partition) != Some(&PartitionState::Loading) {
            return Err(GroupError::PartitionNotLoading { partition });
        }
        let group_id = record.group_id().to_owned();
        let expected = self.partition_for(&group_id);
        if expected != partition {
            return Err(GroupError::WrongPartition {
                group_id,
                partition,
                expected,
            });
        }
        match record {
            Record::ConsumerGroup(r) => self.replay_consumer_group_record(partition, r, None),
            Record::ShareGroup(r) => self.replay_share_group_record(partition, r),
            Record::OffsetCommit(r) if self.consumer_groups.contains_key(&group_id) => {
                let key = (r.key.topic.clone(), r.key.partition);
                if let Some(g) = self.consumer_groups.get_mut(&group_id) {
                    match &r.value {
                        Some(value) => {
                            g.offsets.insert(key, value.clone());
                        }
                        None => {
                            g.offsets.remove(&key);
                        }
                    }
                }
            }
            Record::GroupMetadata(r) => match &r.value {
                Some(value) => {
                    let g = self
                        .groups
                        .entry(group_id.clone())
                        .or_insert_with(|| ClassicGroup::new(group_id.clone(), partition, None));
                    g.apply_metadata(value, &mut self.join_seq);
                }
                None => {
                    if let Some(g) = self.groups.remove(&group_id) {
                        if !g.offsets.is_empty() {
                            // Offsets outlive the metadata: keep them in a simple group.
                            let mut simple = ClassicGroup::new(group_id.clone(), partition, None);
                            simple.offsets = g.offsets;
                            self.groups.insert(group_id, simple);
                        }
                    }
                }
            },
            Record::OffsetCommit(r) => {
                let key = (r.key.topic.clone(), r.key.partition);
                match &r.value {
                    Some(value) => {
                        let g = self.groups.entry(group_id.clone()).or_insert_with(|| {
                            ClassicGroup::new(group_id.clone(), partition, None)
                        });
                        g.offsets.insert(key, value.clone());
                    }
                    None => {
                        if let Some(g) = self.groups.get_mut(&group_id) {
                            g.offsets.remove(&key);
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Replays an offset record of a transactional batch of `producer_id`: pending until
    /// that transaction's marker is replayed ([`GroupCoordinator::replay_control`]).
    pub fn replay_transactional(
        &mut self,
        partition: i32,
        producer_id: i64,
        record: &Record,
    ) -> Result<(), GroupError> {
        if self.partitions.get(&partition) != Some(&PartitionState::Loading) {
            return Err(GroupError::PartitionNotLoading { partition });
        }
        if let Record::OffsetCommit(r) = record {
            self.txn_offsets.add(producer_id, partition, r.clone());
        }
        Ok(())
    }

    /// Replays a COMMIT or ABORT marker of `producer_id` found in the log.
    pub fn replay_control(&mut self, partition: i32, producer_id: i64, commit: bool) {
        self.complete_transaction(partition, producer_id, commit);
    }

    /// Ends a load: the partition's groups serve requests, and their members' sessions
    /// start now (they could not heartbeat a coordinator that did not know them).
    pub fn load_partition_done(&mut self, partition: i32, now_ms: i64) {
        if self.partitions.get(&partition) != Some(&PartitionState::Loading) {
            return;
        }
        self.partitions.insert(partition, PartitionState::Active);
        self.consumer_groups_loaded(partition, now_ms);
        self.share_groups_loaded(partition, now_ms);
        for g in self.groups.values().filter(|g| g.partition == partition) {
            for m in g.members.values() {
                self.timer.schedule(
                    heartbeat_key(g, &m.member_id),
                    now_ms + i64::from(m.session_timeout_ms),
                );
            }
        }
        if !self.timer.is_scheduled(&TimerKey::OffsetExpiration) {
            self.timer.schedule(
                TimerKey::OffsetExpiration,
                now_ms + self.config.offsets_retention_check_interval_ms.max(1),
            );
        }
    }

    /// This node is no longer the partition's coordinator: its groups are dropped and
    /// parked requests are answered NOT_COORDINATOR so that clients look it up again.
    pub fn unload_partition(&mut self, partition: i32) -> Vec<Output> {
        let mut fx = Effects::default();
        self.partitions.remove(&partition);
        let n = self.config.offsets_topic_num_partitions;
        self.read.unload(partition, |group| partition_for(group, n));
        self.unsettled_tail.remove(&partition);
        self.txn_offsets.unload(partition);
        self.unload_consumer_groups(partition, &mut fx);
        self.unload_share_groups(partition);
        let ids: Vec<String> = self
            .groups
            .values()
            .filter(|g| g.partition == partition)
            .map(|g| g.group_id.clone())
            .collect();
        for id in ids {
            if let Some(g) = self.groups.remove(&id) {
                for m in g.members.values() {
                    if let Some(r) = m.awaiting_join {
                        fx.respond(
                            r,
                            Response::JoinGroup(JoinGroupResponse::error(
                                &m.member_id,
                                error_code::NOT_COORDINATOR,
                            )),
                        );
                    }
                    if let Some(r) = m.awaiting_sync {
                        fx.respond(
                            r,
                            Response::SyncGroup(SyncGroupResponse::error(
                                error_code::NOT_COORDINATOR,
                            )),
                        );
                    }
                }
                self.timer.cancel_group(&id);
            }
        }
        if self.partitions.is_empty() {
            self.timer.cancel(&TimerKey::OffsetExpiration);
        }
        self.finish(fx)
    }

    /// The partitions being loaded or served.
    pub fn loaded_partitions(&self) -> Vec<i32> {
        self.partitions.keys().copied().collect()
    }

    /// The group's state, if this node knows the group.
    pub fn group_state(&self, group_id: &str) -> Option<ClassicGroupState> {
        self.groups.get(group_id).map(|g| g.state)
    }

    /// Every group this node knows, with its state and generation (for the broker's
    /// metrics: groups by state, rebalances as generations gone by).
    pub fn group_overview(&self) -> Vec<(String, ClassicGroupState, i32)> {
        self.groups
            .values()
            .map(|g| (g.group_id.clone(), g.state, g.generation_id))
            .collect()
    }

    /// Every group this node knows, with its number of members.
    pub fn group_sizes(&self) -> Vec<(String, usize)> {
        self.groups
            .values()
            .map(|g| (g.group_id.clone(), g.members.len()))
            .collect()
    }

    /// The group's generation id, if this node knows the group.
    pub fn group_generation(&self, group_id: &str) -> Option<i32> {
        self.groups.get(group_id).map(|g| g.generation_id)
    }

    /// Every committed offset this node holds: what OffsetFetch would serve.
    pub fn committed_offsets(&self) -> BTreeMap<OffsetCommitKey, OffsetCommitValue> {
        self.read.all()
    }
}
