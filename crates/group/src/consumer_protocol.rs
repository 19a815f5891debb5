//! The consumer group protocol of KIP-848 (`group.protocol=consumer`) in the
//! [`GroupCoordinator`]: ConsumerGroupHeartbeat, ConsumerGroupDescribe, the members'
//! session and rebalance timeouts, metadata changes, and the replay of the consumer
//! group records. Kafka's `GroupMetadataManager.consumerGroupHeartbeat` and its helpers.
//!
//! # Design note: a heartbeat
//!
//! 1. The request is checked as Kafka checks it (INVALID_REQUEST for a malformed one,
//!    UNSUPPORTED_ASSIGNOR, INVALID_REGULAR_EXPRESSION). Epoch -1 leaves (the member is
//!    fenced: its records get tombstones and the group epoch is bumped); epoch -2 is a
//!    static member leaving for now (its epoch becomes -2, it keeps its partitions until
//!    its session ends or its instance id comes back).
//! 2. The group is found, or made by a join (epoch 0). An Empty classic group of the same
//!    id is replaced (its metadata gets a tombstone, its offsets carry over); a classic
//!    group with members is converted when `group.consumer.migration.policy` allows the
//!    upgrade (`consumer_group_migration.rs`), else the heartbeat fails with
//!    GROUP_ID_NOT_FOUND, as Kafka answers.
//! 3. The member is found or made: a dynamic one by member id, a static one by
//!    `group.instance.id` (a rejoin after a static leave takes over the old member's
//!    partitions and target under the new member id; an instance id another member
//!    still uses is UNRELEASED_INSTANCE_ID; a heartbeat from a replaced member is
//!    FENCED_INSTANCE_ID). Its epoch must be the member's, or its previous one with no
//!    partition it should not own (a lost response); otherwise FENCED_MEMBER_EPOCH.
//! 4. A changed subscription, or topics that changed since the group last looked
//!    (topic creation and deletion, partition counts, what a regular expression
//!    matches), recomputes the subscription metadata; a change of either bumps the group
//!    epoch. A regular expression new to the group is resolved at the next heartbeat of
//!    any member, as Kafka resolves them in the background (its first heartbeat gets the
//!    topics named literally; librdkafka's tests expect exactly that).
//! 5. A group epoch ahead of the target assignment's epoch runs the assignor over every
//!    member: the members whose target changed get a record, and the target's epoch
//!    becomes the group epoch.
//! 6. The member is reconciled towards its target (`current_assignment_builder.rs`): it
//!    revokes first, and gets a partition only once nobody else owns it. A member that
//!    must revoke has its rebalance timeout armed; it is fenced if it has not moved on
//!    when the timeout fires.
//! 7. Every change is a record; the records are replayed into the live group at once
//!    (the next decision sees them) and the answer is sent once they are replicated. An
//!    answer without records waits for the partition's pending writes
//!    (`committed_consumer_groups.rs`).
//!
//! Why it is correct: every change reaches the live group only through the same replay
//! that a new coordinator runs over the log, so a failover rebuilds the group epoch,
//! target, member epochs and assignments that were acknowledged; the member epoch only
//! moves forward past a revocation the member reported; and a member whose session or
//! rebalance timeout ends is removed with tombstones, so its partitions become free for
//! the others' next reconciliation.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::api::*;
use crate::assignor::{MemberSpec, ServerAssignor};
use crate::consumer_group::{compile_subscription_regex, ConsumerGroup};
use crate::consumer_group_member::{
    ConsumerGroupMember, MemberState, LEAVE_GROUP_MEMBER_EPOCH, LEAVE_GROUP_STATIC_MEMBER_EPOCH,
};
use crate::consumer_group_record::*;
use crate::coordinator::{Effects, GroupCoordinator};
use crate::error::error_code;
use crate::group::ClassicGroup;
use crate::record::{GroupMetadataKey, GroupMetadataRecord, Record};
use crate::timer::TimerKey;
use crate::topics_image::TopicsImage;

pub(crate) type HeartbeatError = (i16, String);

/// What a heartbeat changes, decided before anything changes.
pub(crate) struct HeartbeatPlan {
    /// The tombstone of the classic group the consumer group replaces.
    pub(crate) classic_records: Vec<Record>,
    pub(crate) consumer_records: Vec<ConsumerGroupRecord>,
    /// The group's regular expressions as resolved by this heartbeat, if it looked.
    pub(crate) resolved: Option<crate::consumer_group::ResolvedRegexes>,
    /// A regular expression is left to resolve: the next heartbeat looks again.
    pub(crate) refresh_next: bool,
    /// The static member this one replaces.
    pub(crate) replaced: Option<String>,
    /// (epoch, rebalance timeout) while the member must revoke partitions.
    pub(crate) revoking: Option<(i32, i32)>,
    /// The members of a classic group converted to the consumer group: (member id,
    /// session timeout) and the requests they had parked, answered REBALANCE_IN_PROGRESS.
    pub(crate) converted_from_classic: Vec<(String, i32, Vec<Respond>)>,
    /// A classic member's protocol (its first), for its JoinGroup response.
    pub(crate) protocol_name: Option<String>,
    pub(crate) response: ConsumerGroupHeartbeatResponse,
}

/// The assignor most members asked for (ties to the first name), else `default`.
fn preferred_assignor<'a>(
    members: impl Iterator<Item = &'a ConsumerGroupMember>,
    default: &'a str,
) -> &'a str {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for m in members {
        if let Some(a) = &m.server_assignor {
            *counts.entry(a.as_str()).or_default() += 1;
        }
    }
    counts
        .into_iter()
        .max_by(|(a, x), (b, y)| x.cmp(y).then(b.cmp(a)))
        .map_or(default, |(name, _)| name)
}

pub(crate) fn err<T>(code: i16, message: impl Into<String>) -> Result<T, HeartbeatError> {
    Err((code, message.into()))
}

pub(crate) fn session_key(group_id: &str, member_id: &str) -> TimerKey {
    TimerKey::ConsumerSession {
        group_id: group_id.to_owned(),
        member_id: member_id.to_owned(),
    }
}

pub(crate) fn rebalance_key(group_id: &str, member_id: &str) -> TimerKey {
    TimerKey::ConsumerRebalance {
        group_id: group_id.to_owned(),
        member_id: member_id.to_owned(),
    }
}

fn is_subset(owned: Option<&[TopicPartitions]>, assigned: &Assignment) -> bool {
    let Some(owned) = owned else {
        return false;
    };
    owned.iter().all(|tp| {
        tp.partitions.is_empty()
            || assigned
                .get(&tp.topic_id)
                .is_some_and(|set| tp.partitions.iter().all(|p| set.contains(p)))
    })
}

/// Kafka's `throwIfConsumerGroupMemberEpochIsInvalid`.
fn check_member_epoch(
    member: &ConsumerGroupMember,
    epoch: i32,
    owned: Option<&[TopicPartitions]>,
) -> Result<(), HeartbeatError> {
    if epoch > member.member_epoch {
        return err(
            error_code::FENCED_MEMBER_EPOCH,
            format!(
                "The consumer group member has a greater member epoch ({epoch}) than the one known by the group coordinator ({}). The member must abandon all its partitions and rejoin.",
                member.member_epoch
            ),
        );
    }
    if epoch < member.member_epoch
        && (epoch != member.previous_member_epoch || !is_subset(owned, &member.assigned_partitions))
    {
        return err(
            error_code::FENCED_MEMBER_EPOCH,
            format!(
                "The consumer group member has a smaller member epoch ({epoch}) than the one known by the group coordinator ({}). The member must abandon all its partitions and rejoin.",
                member.member_epoch
            ),
        );
    }
    Ok(())
}

/// A 16-byte random id in Kafka's `Uuid.toString()` form (URL-safe base64).
pub(crate) fn new_member_id(rng: &mut u64) -> String {
    let hi = crate::coordinator::next_u64(rng);
    let lo = crate::coordinator::next_u64(rng);
    rill_protocol::Uuid::from_u64_pair(hi, lo).to_string()
}

pub(crate) fn described(
    assignment: &Assignment,
    topics: &TopicsImage,
) -> Vec<DescribedTopicPartitions> {
    assignment
        .iter()
        .filter(|(_, ps)| !ps.is_empty())
        .map(|(id, ps)| DescribedTopicPartitions {
            topic_id: *id,
            topic_name: topics.name_of(id).unwrap_or_default().to_owned(),
            partitions: ps.iter().copied().collect(),
        })
        .collect()
}

impl GroupCoordinator {
    /// The cluster's topics changed (created, deleted, partitions added): every consumer
    /// group looks at its subscription again at its next heartbeat.
    pub fn update_topics(&mut self, topics: TopicsImage) {
        if *self.topics == topics {
            return;
        }
        self.topics = Arc::new(topics);
        for g in self.consumer_groups.values_mut() {
            g.metadata_refresh = true;
        }
        for g in self.share_groups.values_mut() {
            g.metadata_refresh = true;
        }
    }

    /// Replays one consumer group record into the live groups (load or handler).
    pub(crate) fn replay_consumer_group_record(
        &mut self,
        partition: i32,
        record: &ConsumerGroupRecord,
        now_ms: Option<i64>,
    ) {
        let group_id = record.group_id().to_owned();
        if !self.consumer_groups.contains_key(&group_id) {
            if record.is_tombstone() {
                return;
            }
            let mut g = ConsumerGroup::new(&group_id, partition);
            // A classic group of this id can only be one without members (offsets, or
            // an Empty group the handler replaced): its offsets carry over.
            if let Some(classic) = self.groups.remove(&group_id) {
                g.offsets = classic.offsets;
            }
            self.consumer_groups.insert(group_id.clone(), g);
        }
        let keep = self
            .consumer_groups
            .get_mut(&group_id)
            .is_some_and(|g| g.replay(record));
        if !keep {
            if let Some(g) = self.consumer_groups.remove(&group_id) {
                self.timer.cancel_group(&group_id);
                if !g.offsets.is_empty() {
                    // Offsets outlive the group's records, as a classic group's do.
                    let mut simple = ClassicGroup::new(group_id.clone(), partition, now_ms);
                    simple.offsets = g.offsets;
                    self.groups.insert(group_id, simple);
                }
            }
        }
    }

    pub(crate) fn apply_consumer_records(
        &mut self,
        partition: i32,
        records: &[ConsumerGroupRecord],
        now_ms: i64,
    ) {
        for r in records {
            self.replay_consumer_group_record(partition, r, Some(now_ms));
        }
    }

    /// A load ended: members' sessions start now (with the broker's default session
    /// until their first heartbeat here) and revoking members get their rebalance
    /// timeout again, as Kafka's coordinator does on load.
    pub(crate) fn consumer_groups_loaded(&mut self, partition: i32, now_ms: i64) {
        let session = i64::from(self.config.consumer_group_session_timeout_ms);
        let mut timers = Vec::new();
        for g in self.consumer_groups.values_mut() {
            if g.partition != partition {
                continue;
            }
            g.metadata_refresh = true;
            for m in g.members.values() {
                let session = m
                    .classic
                    .as_ref()
                    .map_or(session, |c| i64::from(c.session_timeout_ms));
                timers.push((session_key(&g.group_id, &m.member_id), now_ms + session));
                if m.state == MemberState::UnrevokedPartitions {
                    g.rebalance_timeout_epochs
                        .insert(m.member_id.clone(), m.member_epoch);
                    timers.push((
                        rebalance_key(&g.group_id, &m.member_id),
                        now_ms + i64::from(m.rebalance_timeout_ms.max(0)),
                    ));
                }
            }
        }
        for (key, at) in timers {
            self.timer.schedule(key, at);
        }
    }

    /// The partition is no longer coordinated here: its consumer groups go, and answers
    /// that waited on its writes get NOT_COORDINATOR.
    pub(crate) fn unload_consumer_groups(&mut self, partition: i32, fx: &mut Effects) {
        let ids: Vec<String> = self
            .consumer_groups
            .values()
            .filter(|g| g.partition == partition)
            .map(|g| g.group_id.clone())
            .collect();
        for id in ids {
            self.consumer_groups.remove(&id);
            self.timer.cancel_group(&id);
        }
        for held in self.committed_consumer.unload(partition) {
            fx.respond(
                held.responder,
                held.response.failed(error_code::NOT_COORDINATOR),
            );
        }
    }

    /// ConsumerGroupHeartbeat (KIP-848). The answer follows the records it wrote, or the
    /// partition's pending writes when it wrote none.
    pub fn handle_consumer_group_heartbeat(
        &mut self,
        req: ConsumerGroupHeartbeatRequest,
        now_ms: i64,
        responder: ResponderId,
    ) -> Vec<Output> {
        let partition = self.partition_for(&req.group_id);
        let outcome = match self.coordinator_error(&req.group_id) {
            Some(code) => err(code, "This node cannot serve the group now."),
            None => self.consumer_heartbeat(&req, now_ms),
        };
        let (records, response, parked) = match outcome {
            Ok(done) => done,
            Err((code, message)) => {
                return vec![Output::Respond(Respond {
                    responder,
                    response: Response::ConsumerGroupHeartbeat(
                        ConsumerGroupHeartbeatResponse::error(code, message),
                    ),
                })];
            }
        };
        let respond = Respond {
            responder,
            response: Response::ConsumerGroupHeartbeat(response),
        };
        if records.is_empty() {
            return match self.committed_consumer.hold(partition, respond) {
                Some(now) => vec![Output::Respond(now)],
                None => Vec::new(),
            };
        }
        let mut fx = Effects::default();
        for r in records {
            fx.record(partition, r);
        }
        fx.responses.extend(parked);
        fx.responses.push(respond);
        self.finish(fx)
    }

    fn validate_heartbeat(
        &self,
        req: &ConsumerGroupHeartbeatRequest,
    ) -> Result<(), HeartbeatError> {
        let invalid = |m: &str| err(error_code::INVALID_REQUEST, m);
        if req.group_id.is_empty() {
            return invalid("GroupId can't be empty.");
        }
        if req.instance_id.as_deref() == Some("") {
            return invalid("InstanceId can't be empty.");
        }
        if req.rack_id.as_deref() == Some("") {
            return invalid("RackId can't be empty.");
        }
        match req.member_epoch {
            e if e > 0 || e == LEAVE_GROUP_MEMBER_EPOCH => {
                if req.member_id.is_empty() {
                    return invalid("MemberId can't be empty.");
                }
            }
            0 => {
                if req.rebalance_timeout_ms == -1 {
                    return invalid("RebalanceTimeoutMs must be provided in first request.");
                }
                if req.topic_partitions.as_ref().is_none_or(|t| !t.is_empty()) {
                    return invalid("TopicPartitions must be empty when (re-)joining.");
                }
                let names = req
                    .subscribed_topic_names
                    .as_ref()
                    .is_some_and(|n| !n.is_empty());
                if !names && req.subscribed_topic_regex.is_none() {
                    return invalid(
                        "SubscribedTopicNames or SubscribedTopicRegex must be set in first request.",
                    );
                }
            }
            LEAVE_GROUP_STATIC_MEMBER_EPOCH => {
                if req.member_id.is_empty() {
                    return invalid("MemberId can't be empty.");
                }
                if req.instance_id.is_none() {
                    return invalid("InstanceId can't be null.");
                }
            }
            _ => return invalid("MemberEpoch is invalid."),
        }
        if let Some(a) = &req.server_assignor {
            if !self.config.consumer_group_assignors.iter().any(|x| x == a) {
                return err(
                    error_code::UNSUPPORTED_ASSIGNOR,
                    format!(
                        "ServerAssignor {a} is not supported. Supported assignors: {}.",
                        self.config.consumer_group_assignors.join(", ")
                    ),
                );
            }
        }
        if let Some(p) = &req.subscribed_topic_regex {
            if let Err(e) = compile_subscription_regex(p) {
                return err(
                    error_code::INVALID_REGULAR_EXPRESSION,
                    format!("SubscribedTopicRegex `{p}` is not a valid regular expression: {e}."),
                );
            }
        }
        Ok(())
    }

    fn consumer_heartbeat(
        &mut self,
        req: &ConsumerGroupHeartbeatRequest,
        now_ms: i64,
    ) -> Result<(Vec<Record>, ConsumerGroupHeartbeatResponse, Vec<Respond>), HeartbeatError> {
        self.validate_heartbeat(req)?;
        if req.member_epoch == LEAVE_GROUP_MEMBER_EPOCH
            || req.member_epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH
        {
            return self.consumer_leave(req, now_ms);
        }
        let partition = self.partition_for(&req.group_id);
        let member_id = if req.member_id.is_empty() {
            new_member_id(&mut self.rng)
        } else {
            req.member_id.clone()
        };
        let plan = self.plan_heartbeat(req, member_id, partition, None)?;
        Ok(self.apply_plan(req, plan, now_ms))
    }

    /// Step 7 of the design note: the plan's records replayed, its timers armed; returns
    /// the records to write, the answer, and the answers of a converted classic group's
    /// parked requests.
    pub(crate) fn apply_plan(
        &mut self,
        req: &ConsumerGroupHeartbeatRequest,
        plan: HeartbeatPlan,
        now_ms: i64,
    ) -> (Vec<Record>, ConsumerGroupHeartbeatResponse, Vec<Respond>) {
        let partition = self.partition_for(&req.group_id);
        let mut parked = Vec::new();
        if !plan.converted_from_classic.is_empty() {
            // The classic group's deadlines (sessions, join and sync phases) end with it.
            self.timer.cancel_group(&req.group_id);
        }
        self.apply_consumer_records(partition, &plan.consumer_records, now_ms);
        for (member_id, session_ms, responses) in plan.converted_from_classic {
            self.timer.schedule(
                session_key(&req.group_id, &member_id),
                now_ms + i64::from(session_ms.max(0)),
            );
            parked.extend(responses);
        }
        if let Some(g) = self.consumer_groups.get_mut(&req.group_id) {
            g.metadata_refresh = plan.refresh_next;
            if let Some(resolved) = plan.resolved {
                g.resolved_regexes = resolved;
            }
        }
        let member_id = plan.response.member_id.clone().unwrap_or_default();
        if let Some(old) = &plan.replaced {
            self.timer.cancel(&session_key(&req.group_id, old));
            self.timer.cancel(&rebalance_key(&req.group_id, old));
        }
        self.timer.schedule(
            session_key(&req.group_id, &member_id),
            now_ms + i64::from(req.session_timeout_ms.max(0)),
        );
        let key = rebalance_key(&req.group_id, &member_id);
        match plan.revoking {
            Some((epoch, timeout_ms)) => {
                let armed = self
                    .consumer_groups
                    .get(&req.group_id)
                    .and_then(|g| g.rebalance_timeout_epochs.get(&member_id))
                    == Some(&epoch);
                if !armed || !self.timer.is_scheduled(&key) {
                    if let Some(g) = self.consumer_groups.get_mut(&req.group_id) {
                        g.rebalance_timeout_epochs.insert(member_id.clone(), epoch);
                    }
                    self.timer
                        .schedule(key, now_ms + i64::from(timeout_ms.max(0)));
                }
            }
            None => {
                self.timer.cancel(&key);
                if let Some(g) = self.consumer_groups.get_mut(&req.group_id) {
                    g.rebalance_timeout_epochs.remove(&member_id);
                }
            }
        }
        let mut records = plan.classic_records;
        records.extend(plan.consumer_records.into_iter().map(Record::ConsumerGroup));
        (records, plan.response, parked)
    }

    /// Steps 2-6 of the design note: what the heartbeat changes, as records, without
    /// changing anything.
    /// `classic`: the member joins with the classic protocol (JoinGroup to a consumer
    /// group, KIP-848's online migration): it is created or updated whatever its epoch,
    /// and keeps what it says it owns.
    pub(crate) fn plan_heartbeat(
        &self,
        req: &ConsumerGroupHeartbeatRequest,
        member_id: String,
        partition: i32,
        classic: Option<&ClassicMemberMetadata>,
    ) -> Result<HeartbeatPlan, HeartbeatError> {
        let join = req.member_epoch == 0 || classic.is_some();
        let mut classic_records: Vec<Record> = Vec::new();
        let mut consumer_records: Vec<ConsumerGroupRecord> = Vec::new();
        let mut converted_from_classic = Vec::new();
        let mut converted = None;

        // 2. The group.
        if self.is_share_group(&req.group_id) {
            return err(
                error_code::GROUP_ID_NOT_FOUND,
                format!("Group {} is not a consumer group.", req.group_id),
            );
        }
        if let Some(classic_group) = self.groups.get(&req.group_id) {
            let empty =
                classic_group.members.is_empty() && classic_group.pending_join_members.is_empty();
            if join
                && !empty
                && self
                    .config
                    .consumer_group_migration_policy
                    .upgrade_enabled()
            {
                // KIP-848's online upgrade: the classic group becomes a consumer group
                // whose members keep their generation as epoch and their assignment.
                let (group, records, parked) = self.convert_classic_group(classic_group)?;
                consumer_records.extend(records);
                converted_from_classic = parked;
                converted = Some(group);
            } else if !(join && empty) {
                return err(
                    error_code::GROUP_ID_NOT_FOUND,
                    format!("Group {} is not a consumer group.", req.group_id),
                );
            }
            // Kafka's `maybeDeleteEmptyClassicGroup` (and its conversion): the classic
            // group's metadata goes, its offsets stay with the consumer group that takes
            // the id (creating the consumer group takes both, as replaying the records
            // does).
            classic_records.push(Record::GroupMetadata(GroupMetadataRecord {
                key: GroupMetadataKey {
                    group: req.group_id.clone(),
                },
                value: None,
            }));
        }
        let fresh;
        let group: &ConsumerGroup =
            match (converted.as_ref(), self.consumer_groups.get(&req.group_id)) {
                (Some(g), _) => g,
                (None, Some(g)) => g,
                (None, None) if join => {
                    fresh = ConsumerGroup::new(&req.group_id, partition);
                    &fresh
                }
                (None, None) => {
                    return err(
                        error_code::GROUP_ID_NOT_FOUND,
                        format!("Consumer group {} not found.", req.group_id),
                    )
                }
            };
        let max = usize::try_from(self.config.consumer_group_max_size).unwrap_or(0);
        if group.members.len() >= max
            && (req.member_id.is_empty() || !group.members.contains_key(&member_id))
        {
            return err(
                error_code::GROUP_MAX_SIZE_REACHED,
                format!("The consumer group has reached its maximum capacity of {max} members."),
            );
        }

        // 3. The member.
        let owned = req.topic_partitions.as_deref();
        // The member this one replaces (a static member back under a new member id).
        let mut replaced: Option<String> = None;
        let member = match &req.instance_id {
            // A classic member is created or updated whatever it sends (its generation
            // is checked by SyncGroup, Heartbeat and OffsetCommit).
            None if classic.is_some() => group
                .members
                .get(&member_id)
                .cloned()
                .unwrap_or_else(|| ConsumerGroupMember::new(&member_id)),
            Some(instance_id) if classic.is_some() && group.static_member(instance_id).is_some_and(|m| m.member_id == member_id) => {
                group.static_member(instance_id).cloned().unwrap_or_else(|| ConsumerGroupMember::new(&member_id))
            }
            None => match group.members.get(&member_id) {
                None if join => ConsumerGroupMember::new(&member_id),
                None => {
                    return err(
                        error_code::UNKNOWN_MEMBER_ID,
                        format!("Member {member_id} is not a member of group {}.", req.group_id),
                    )
                }
                Some(m) if join => rejoined(m),
                Some(m) => {
                    check_member_epoch(m, req.member_epoch, owned)?;
                    m.clone()
                }
            },
            Some(instance_id) => match group.static_member(instance_id) {
                None if join => match group.members.get(&member_id) {
                    Some(m) => rejoined(m),
                    None => ConsumerGroupMember::new(&member_id),
                },
                None => {
                    return err(
                        error_code::UNKNOWN_MEMBER_ID,
                        format!("Instance id {instance_id} is unknown."),
                    )
                }
                Some(old) if join && old.member_id == member_id => rejoined(old),
                Some(old) if join => {
                    // Kafka checks the release only between two consumer protocol members.
                    if old.member_epoch != LEAVE_GROUP_STATIC_MEMBER_EPOCH
                        && classic.is_none()
                        && !old.uses_classic_protocol()
                    {
                        return err(
                            error_code::UNRELEASED_INSTANCE_ID,
                            format!(
                                "Static member {member_id} with instance id {instance_id} cannot join the group because the instance id is owned by {} member.",
                                old.member_id
                            ),
                        );
                    }
                    // Kafka's `replaceMember`: the old member's records go, the new one
                    // takes its subscription, target and partitions at epoch 0.
                    let mut new = old.clone();
                    new.member_id = member_id.clone();
                    new.member_epoch = 0;
                    new.previous_member_epoch = 0;
                    consumer_records.extend(member_tombstones(&req.group_id, &old.member_id));
                    consumer_records.push(ConsumerGroupRecord::MemberMetadata {
                        group_id: req.group_id.clone(),
                        member_id: member_id.clone(),
                        value: Some(new.metadata_value()),
                    });
                    consumer_records.push(ConsumerGroupRecord::TargetAssignmentMember {
                        group_id: req.group_id.clone(),
                        member_id: member_id.clone(),
                        value: Some(ConsumerGroupTargetAssignmentMemberValue {
                            topic_partitions: to_topic_partitions(&group.target_of(&old.member_id)),
                        }),
                    });
                    consumer_records.push(ConsumerGroupRecord::CurrentMemberAssignment {
                        group_id: req.group_id.clone(),
                        member_id: member_id.clone(),
                        value: Some(new.current_assignment_value()),
                    });
                    replaced = Some(old.member_id.clone());
                    new
                }
                Some(old) if old.member_id != member_id => {
                    return err(
                        error_code::FENCED_INSTANCE_ID,
                        format!(
                            "Static member {member_id} with instance id {instance_id} was fenced by member {}.",
                            old.member_id
                        ),
                    )
                }
                Some(old) => {
                    check_member_epoch(old, req.member_epoch, owned)?;
                    old.clone()
                }
            },
        };

        // 4. The subscription.
        let mut updated = member.clone();
        if let Some(i) = &req.instance_id {
            updated.instance_id = Some(i.clone());
        }
        if let Some(r) = &req.rack_id {
            updated.rack_id = Some(r.clone());
        }
        if req.rebalance_timeout_ms != -1 {
            updated.rebalance_timeout_ms = req.rebalance_timeout_ms;
        }
        if let Some(a) = &req.server_assignor {
            updated.server_assignor = Some(a.clone());
        }
        match classic {
            Some(c) => {
                updated.classic = Some(c.clone());
                updated.server_assignor = None;
            }
            None => updated.classic = None,
        }
        if let Some(names) = &req.subscribed_topic_names {
            let mut names = names.clone();
            names.sort();
            names.dedup();
            updated.subscribed_topic_names = names;
        }
        if let Some(p) = &req.subscribed_topic_regex {
            updated.subscribed_topic_regex = (!p.is_empty()).then(|| p.clone());
        }
        updated.client_id = req.client_id.clone();
        updated.client_host = req.client_host.clone();
        let is_new = !group.members.contains_key(&member_id);
        let mut bump = false;
        if is_new || updated.metadata_value() != member.metadata_value() {
            consumer_records.push(ConsumerGroupRecord::MemberMetadata {
                group_id: req.group_id.clone(),
                member_id: member_id.clone(),
                value: Some(updated.metadata_value()),
            });
            bump = updated.subscription_differs(&member);
        }
        // The members as they will be: this one updated, a replaced one gone.
        let members_after = || {
            group
                .members
                .values()
                .filter(|m| m.member_id != member_id && Some(&m.member_id) != replaced.as_ref())
                .chain(std::iter::once(&updated))
        };
        let mut group_epoch = group.group_epoch;
        let computed;
        let mut metadata = &group.subscription_metadata;
        let mut resolved = None;
        let mut refresh_next = false;
        if bump || group.metadata_refresh {
            // The regular expressions: all resolved again after the topics changed, else
            // the ones known kept and a new one left for the next heartbeat (Kafka
            // resolves them in the background).
            let regexes = if group.metadata_refresh {
                ConsumerGroup::resolve_regexes(members_after(), &self.topics)
            } else {
                let in_use: BTreeSet<&str> = members_after()
                    .filter_map(|m| m.subscribed_topic_regex.as_deref())
                    .collect();
                refresh_next = in_use
                    .iter()
                    .any(|p| !group.resolved_regexes.contains_key(*p));
                group
                    .resolved_regexes
                    .iter()
                    .filter(|(p, _)| in_use.contains(p.as_str()))
                    .map(|(p, t)| (p.clone(), t.clone()))
                    .collect()
            };
            let names = ConsumerGroup::subscribed_topic_names(members_after(), &regexes);
            resolved = Some(regexes);
            computed = ConsumerGroup::compute_subscription_metadata(&names, &self.topics);
            if computed != group.subscription_metadata {
                bump = true;
                consumer_records.push(ConsumerGroupRecord::PartitionMetadata {
                    group_id: req.group_id.clone(),
                    value: Some(ConsumerGroupPartitionMetadataValue {
                        topics: computed.values().cloned().collect(),
                    }),
                });
            }
            metadata = &computed;
            if bump {
                group_epoch = group_epoch.saturating_add(1);
                consumer_records.push(ConsumerGroupRecord::Metadata {
                    group_id: req.group_id.clone(),
                    value: Some(ConsumerGroupMetadataValue { epoch: group_epoch }),
                });
            }
        }

        // 5. The target assignment.
        let previous_target = |id: &str| -> Option<&Assignment> {
            match &replaced {
                Some(old) if id == member_id => group.target_assignment.get(old),
                _ => group.target_assignment.get(id),
            }
        };
        let (target_epoch, target) = if group_epoch > group.assignment_epoch {
            let default = self
                .config
                .consumer_group_assignors
                .first()
                .map(String::as_str)
                .unwrap_or("uniform");
            let assignor: ServerAssignor = preferred_assignor(members_after(), default)
                .parse()
                .unwrap_or(ServerAssignor::Uniform);
            let specs: Vec<MemberSpec<'_>> = members_after()
                .map(|m| MemberSpec {
                    member_id: &m.member_id,
                    instance_id: m.instance_id.as_deref(),
                    subscribed: ConsumerGroup::member_topic_ids(
                        m,
                        metadata,
                        resolved.as_ref().unwrap_or(&group.resolved_regexes),
                    ),
                    previous: previous_target(&m.member_id),
                })
                .collect();
            let topics: BTreeMap<rill_protocol::Uuid, i32> = metadata
                .values()
                .map(|t| (t.topic_id, t.num_partitions))
                .collect();
            let new_target = assignor.assign(&specs, &topics);
            for (id, a) in &new_target {
                if previous_target(id) != Some(a) {
                    consumer_records.push(ConsumerGroupRecord::TargetAssignmentMember {
                        group_id: req.group_id.clone(),
                        member_id: id.clone(),
                        value: Some(ConsumerGroupTargetAssignmentMemberValue {
                            topic_partitions: to_topic_partitions(a),
                        }),
                    });
                }
            }
            consumer_records.push(ConsumerGroupRecord::TargetAssignmentMetadata {
                group_id: req.group_id.clone(),
                value: Some(ConsumerGroupTargetAssignmentMetadataValue {
                    assignment_epoch: group_epoch,
                }),
            });
            let mine = new_target.get(&member_id).cloned().unwrap_or_default();
            (group_epoch, mine)
        } else {
            (
                group.assignment_epoch,
                previous_target(&member_id).cloned().unwrap_or_default(),
            )
        };

        // 6. Reconciliation.
        let mut next = updated.clone();
        if !updated.is_reconciled_to(target_epoch) {
            // A member rejoining under its own id gave its partitions up: they are free
            // for it, though its old state still holds them.
            let released = group.members.get(&member_id).filter(|_| join);
            let epochs = |t: &rill_protocol::Uuid, p: i32| {
                let own = released.is_some_and(|m| {
                    [&m.assigned_partitions, &m.partitions_pending_revocation]
                        .iter()
                        .any(|a| a.get(t).is_some_and(|set| set.contains(&p)))
                });
                if own {
                    -1
                } else {
                    group.current_partition_epoch(t, p)
                }
            };
            next = crate::current_assignment_builder::next_member_state(
                &updated,
                target_epoch,
                &target,
                &epochs,
                owned,
            )
            .map_err(|_| {
                (
                    error_code::FENCED_MEMBER_EPOCH,
                    "The consumer group member is in a unknown state. The member must abandon all its partitions and rejoin.".to_owned(),
                )
            })?;
        }
        // Against the member as it is now (a rejoin reset it; a new one has no record).
        let live = group
            .members
            .get(&member_id)
            .map(ConsumerGroupMember::current_assignment_value);
        if live != Some(next.current_assignment_value()) {
            consumer_records.push(ConsumerGroupRecord::CurrentMemberAssignment {
                group_id: req.group_id.clone(),
                member_id: member_id.clone(),
                value: Some(next.current_assignment_value()),
            });
        }
        let full = join
            || (req.rebalance_timeout_ms != -1
                && req.subscribed_topic_names.is_some()
                && req.topic_partitions.is_some());
        let assignment = (full || next.assigned_partitions != member.assigned_partitions)
            .then(|| to_topic_partitions(&next.assigned_partitions));
        let revoking = (next.state == MemberState::UnrevokedPartitions && classic.is_none())
            .then_some((next.member_epoch, next.rebalance_timeout_ms));
        Ok(HeartbeatPlan {
            classic_records,
            consumer_records,
            resolved,
            refresh_next,
            replaced,
            revoking,
            converted_from_classic,
            protocol_name: classic
                .and_then(|c| c.supported_protocols.first())
                .map(|(name, _)| name.clone()),
            response: ConsumerGroupHeartbeatResponse {
                error_code: error_code::NONE,
                error_message: None,
                member_id: Some(member_id),
                member_epoch: next.member_epoch,
                heartbeat_interval_ms: req.heartbeat_interval_ms,
                assignment,
            },
        })
    }

    /// Epoch -1 (leave) and -2 (a static member leaving for now).
    fn consumer_leave(
        &mut self,
        req: &ConsumerGroupHeartbeatRequest,
        now_ms: i64,
    ) -> Result<(Vec<Record>, ConsumerGroupHeartbeatResponse, Vec<Respond>), HeartbeatError> {
        let partition = self.partition_for(&req.group_id);
        let Some(group) = self.consumer_groups.get(&req.group_id) else {
            return err(
                error_code::GROUP_ID_NOT_FOUND,
                format!("Consumer group {} not found.", req.group_id),
            );
        };
        let member = match &req.instance_id {
            None => group.members.get(&req.member_id).ok_or_else(|| {
                (
                    error_code::UNKNOWN_MEMBER_ID,
                    format!(
                        "Member {} is not a member of group {}.",
                        req.member_id, req.group_id
                    ),
                )
            })?,
            Some(instance_id) => {
                let m = group.static_member(instance_id).ok_or_else(|| {
                    (
                        error_code::UNKNOWN_MEMBER_ID,
                        format!("Instance id {instance_id} is unknown."),
                    )
                })?;
                if m.member_id != req.member_id {
                    return err(
                        error_code::FENCED_INSTANCE_ID,
                        format!(
                            "Static member {} with instance id {instance_id} was fenced by member {}.",
                            req.member_id, m.member_id
                        ),
                    );
                }
                m
            }
        };
        let member_id = member.member_id.clone();
        let mut scratch = Effects::default();
        let records: Vec<Record> =
            if req.member_epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH && req.instance_id.is_some() {
                let mut leaving = member.clone();
                leaving.member_epoch = LEAVE_GROUP_STATIC_MEMBER_EPOCH;
                leaving.partitions_pending_revocation.clear();
                let records = vec![ConsumerGroupRecord::CurrentMemberAssignment {
                    group_id: req.group_id.clone(),
                    member_id: member_id.clone(),
                    value: Some(leaving.current_assignment_value()),
                }];
                self.apply_consumer_records(partition, &records, now_ms);
                self.timer.cancel(&rebalance_key(&req.group_id, &member_id));
                records.into_iter().map(Record::ConsumerGroup).collect()
            } else {
                self.fence_member(&req.group_id, &member_id, now_ms, &mut scratch)
            };
        Ok((
            records,
            ConsumerGroupHeartbeatResponse {
                error_code: error_code::NONE,
                error_message: None,
                member_id: Some(member_id),
                member_epoch: req.member_epoch,
                heartbeat_interval_ms: 0,
                assignment: None,
            },
            scratch.responses,
        ))
    }

    /// Kafka's `consumerGroupFenceMember`: the member's records get tombstones, the
    /// subscription metadata is computed without it, and the group epoch goes up so that
    /// the next heartbeat assigns its partitions to the others.
    pub(crate) fn fence_records(
        &self,
        group_id: &str,
        member_id: &str,
    ) -> Vec<ConsumerGroupRecord> {
        let Some(group) = self.consumer_groups.get(group_id) else {
            return Vec::new();
        };
        let mut records = member_tombstones(group_id, member_id);
        let names = ConsumerGroup::subscribed_topic_names(
            group.members.values().filter(|m| m.member_id != member_id),
            &group.resolved_regexes,
        );
        let metadata = ConsumerGroup::compute_subscription_metadata(&names, &self.topics);
        if metadata != group.subscription_metadata {
            records.push(ConsumerGroupRecord::PartitionMetadata {
                group_id: group_id.to_owned(),
                value: Some(ConsumerGroupPartitionMetadataValue {
                    topics: metadata.values().cloned().collect(),
                }),
            });
        }
        records.push(ConsumerGroupRecord::Metadata {
            group_id: group_id.to_owned(),
            value: Some(ConsumerGroupMetadataValue {
                epoch: group.group_epoch.saturating_add(1),
            }),
        });
        records
    }

    /// Fences a member whose session ended, or who did not revoke within its rebalance
    /// timeout (`revoking_epoch`: the epoch the timeout was armed at).
    pub(crate) fn on_consumer_member_timeout(
        &mut self,
        group_id: &str,
        member_id: &str,
        revoking_epoch: bool,
        now_ms: i64,
        fx: &mut Effects,
    ) {
        let Some(group) = self.consumer_groups.get(group_id) else {
            return;
        };
        let Some(member) = group.members.get(member_id) else {
            return;
        };
        if revoking_epoch
            && group.rebalance_timeout_epochs.get(member_id) != Some(&member.member_epoch)
        {
            // The member moved on since the timeout was armed.
            return;
        }
        let partition = group.partition;
        for r in self.fence_member(group_id, member_id, now_ms, fx) {
            fx.record(partition, r);
        }
    }

    /// Removes a member (it left, or its session or rebalance timeout ended), or — when
    /// only classic members would remain and the migration policy allows — turns the
    /// group back into a classic group (`consumer_group_migration.rs`). The records are
    /// replayed here and returned for writing; answers go to `fx`.
    pub(crate) fn fence_member(
        &mut self,
        group_id: &str,
        member_id: &str,
        now_ms: i64,
        fx: &mut Effects,
    ) -> Vec<Record> {
        let partition = self.partition_for(group_id);
        self.timer.cancel(&session_key(group_id, member_id));
        self.timer.cancel(&rebalance_key(group_id, member_id));
        if let Some(value) = self.downgrade_value(group_id, member_id, now_ms) {
            return self.downgrade(group_id, value, now_ms, fx);
        }
        let records = self.fence_records(group_id, member_id);
        self.apply_consumer_records(partition, &records, now_ms);
        if let Some(g) = self.consumer_groups.get_mut(group_id) {
            // A pattern no member uses any more is forgotten (Kafka deletes its resolved
            // regular expression): a member that subscribes to it again waits for it.
            let in_use: BTreeSet<String> = g
                .members
                .values()
                .filter_map(|m| m.subscribed_topic_regex.clone())
                .collect();
            g.resolved_regexes.retain(|p, _| in_use.contains(p));
        }
        records.into_iter().map(Record::ConsumerGroup).collect()
    }

    /// ConsumerGroupDescribe, from the groups as of the high watermark.
    pub fn handle_consumer_group_describe(
        &self,
        req: &ConsumerGroupDescribeRequest,
    ) -> ConsumerGroupDescribeResponse {
        let default = self
            .config
            .consumer_group_assignors
            .first()
            .map(String::as_str)
            .unwrap_or("uniform");
        let groups = req
            .group_ids
            .iter()
            .map(|id| {
                if let Some(code) = self.coordinator_error(id) {
                    return DescribedConsumerGroup::error(id, code, None);
                }
                let Some(g) = self.committed_consumer.group(id) else {
                    let message = if self.groups.contains_key(id) || self.is_share_group(id) {
                        format!("Group {id} is not a consumer group.")
                    } else {
                        format!("Group {id} not found.")
                    };
                    return DescribedConsumerGroup::error(
                        id,
                        error_code::GROUP_ID_NOT_FOUND,
                        Some(message),
                    );
                };
                DescribedConsumerGroup {
                    error_code: error_code::NONE,
                    error_message: None,
                    group_id: id.clone(),
                    group_state: g.state().to_string(),
                    group_epoch: g.group_epoch,
                    assignment_epoch: g.assignment_epoch,
                    assignor_name: preferred_assignor(g.members.values(), default).to_owned(),
                    members: g
                        .members
                        .values()
                        .map(|m| DescribedConsumerGroupMember {
                            member_id: m.member_id.clone(),
                            instance_id: m.instance_id.clone(),
                            rack_id: m.rack_id.clone(),
                            member_epoch: m.member_epoch,
                            client_id: m.client_id.clone(),
                            client_host: m.client_host.clone(),
                            subscribed_topic_names: m.subscribed_topic_names.clone(),
                            subscribed_topic_regex: m.subscribed_topic_regex.clone(),
                            assignment: described(&m.assigned_partitions, &self.topics),
                            target_assignment: described(&g.target_of(&m.member_id), &self.topics),
                            uses_classic_protocol: m.uses_classic_protocol(),
                        })
                        .collect(),
                }
            })
            .collect();
        ConsumerGroupDescribeResponse { groups }
    }

    /// Kafka's `ConsumerGroup.validateOffsetCommit` (`transactional`: TxnOffsetCommit).
    pub(crate) fn validate_consumer_offset_commit(
        g: &ConsumerGroup,
        req: &OffsetCommitRequest,
        transactional: bool,
    ) -> Result<(), i16> {
        let epoch = req.generation_id_or_member_epoch;
        if epoch < 0 && g.members.is_empty() {
            return Ok(());
        }
        let Some(member) = g.members.get(&req.member_id) else {
            return Err(error_code::UNKNOWN_MEMBER_ID);
        };
        if member.uses_classic_protocol() {
            // A classic member in a consumer group commits with its generation.
            return if epoch == member.member_epoch {
                Ok(())
            } else {
                Err(error_code::ILLEGAL_GENERATION)
            };
        }
        if !transactional && req.api_version < 9 {
            return Err(error_code::UNSUPPORTED_VERSION);
        }
        if epoch != member.member_epoch {
            return Err(error_code::STALE_MEMBER_EPOCH);
        }
        Ok(())
    }

    /// Kafka's `ConsumerGroup.validateOffsetFetch`, against the replicated state.
    pub(crate) fn validate_consumer_offset_fetch(
        &self,
        req: &OffsetFetchRequest,
    ) -> Result<(), i16> {
        let Some(g) = self.committed_consumer.group(&req.group_id) else {
            return Ok(());
        };
        let Some(member_id) = &req.member_id else {
            return if req.member_epoch < 0 {
                Ok(())
            } else {
                Err(error_code::UNKNOWN_MEMBER_ID)
            };
        };
        if member_id.is_empty() && req.member_epoch < 0 {
            return Ok(());
        }
        let Some(member) = g.members.get(member_id) else {
            return Err(error_code::UNKNOWN_MEMBER_ID);
        };
        if req.member_epoch != member.member_epoch {
            // A classic member's epoch is its generation.
            return Err(if member.uses_classic_protocol() {
                error_code::ILLEGAL_GENERATION
            } else {
                error_code::STALE_MEMBER_EPOCH
            });
        }
        Ok(())
    }

    /// Tombstones for a consumer group and its offsets (DeleteGroups, expiry); the live
    /// group goes at once.
    pub(crate) fn delete_consumer_group(&mut self, group_id: &str, fx: &mut Effects) {
        let Some(g) = self.consumer_groups.remove(group_id) else {
            return;
        };
        for (topic, partition) in g.offsets.keys() {
            fx.record(
                g.partition,
                Record::OffsetCommit(crate::record::OffsetCommitRecord {
                    key: crate::record::OffsetCommitKey {
                        group: group_id.to_owned(),
                        topic: topic.clone(),
                        partition: *partition,
                    },
                    value: None,
                }),
            );
        }
        for r in g.tombstones() {
            fx.record(g.partition, Record::ConsumerGroup(r));
        }
        self.timer.cancel_group(group_id);
    }

    /// The consumer group's state, if this node knows the group (newest state).
    pub fn consumer_group_state(&self, group_id: &str) -> Option<crate::ConsumerGroupState> {
        self.consumer_groups.get(group_id).map(ConsumerGroup::state)
    }

    /// The consumer group's (group epoch, assignment epoch), newest state.
    pub fn consumer_group_epochs(&self, group_id: &str) -> Option<(i32, i32)> {
        self.consumer_groups
            .get(group_id)
            .map(|g| (g.group_epoch, g.assignment_epoch))
    }

    /// A member of a consumer group, newest state.
    pub fn consumer_group_member(
        &self,
        group_id: &str,
        member_id: &str,
    ) -> Option<&ConsumerGroupMember> {
        self.consumer_groups
            .get(group_id)
            .and_then(|g| g.members.get(member_id))
    }

    /// A consumer group's target assignment of a member, newest state.
    pub fn consumer_group_target(&self, group_id: &str, member_id: &str) -> Option<Assignment> {
        self.consumer_groups
            .get(group_id)
            .and_then(|g| g.target_assignment.get(member_id).cloned())
    }

    /// Every consumer group this node knows (as of the high watermark), with its state,
    /// group epoch and members, for the broker's metrics.
    pub fn consumer_group_overview(&self) -> Vec<(String, crate::ConsumerGroupState, i32, usize)> {
        self.committed_consumer
            .groups()
            .map(|g| {
                (
                    g.group_id.clone(),
                    g.state(),
                    g.group_epoch,
                    g.members.len(),
                )
            })
            .collect()
    }
}

/// A member that joins again (epoch 0) under its own member id, having given up its
/// partitions (a join lists none): it starts afresh at epoch 0 and is reconciled again,
/// as a client that was fenced does under KIP-1082's client-made member ids.
fn rejoined(m: &ConsumerGroupMember) -> ConsumerGroupMember {
    let mut m = m.clone();
    m.member_epoch = 0;
    m.previous_member_epoch = 0;
    m.state = MemberState::Stable;
    m.assigned_partitions.clear();
    m.partitions_pending_revocation.clear();
    m
}

/// A member's tombstones in the order Kafka writes them (`removeMember`).
fn member_tombstones(group_id: &str, member_id: &str) -> Vec<ConsumerGroupRecord> {
    vec![
        ConsumerGroupRecord::CurrentMemberAssignment {
            group_id: group_id.to_owned(),
            member_id: member_id.to_owned(),
            value: None,
        },
        ConsumerGroupRecord::TargetAssignmentMember {
            group_id: group_id.to_owned(),
            member_id: member_id.to_owned(),
            value: None,
        },
        ConsumerGroupRecord::MemberMetadata {
            group_id: group_id.to_owned(),
            member_id: member_id.to_owned(),
            value: None,
        },
    ]
}
