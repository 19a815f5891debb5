//! Share groups of KIP-932 in the [`GroupCoordinator`]: ShareGroupHeartbeat v1,
//! ShareGroupDescribe, the members' sessions, the `simple` assignor's runs, the
//! initialisation of share-partition state before a partition is assigned, and the replay
//! of the share group records. Kafka 4.2's `GroupMetadataManager.shareGroupHeartbeat` and
//! its helpers.
//!
//! # Design note: a heartbeat
//!
//! 1. The request is checked as Kafka 4.2 checks it: the member id is the client's own
//!    (v1), so an empty one is INVALID_REQUEST; epoch 0 joins and must name topics, -1
//!    leaves, a positive epoch heartbeats; anything else is INVALID_REQUEST. A group id
//!    taken by a classic or consumer group is GROUP_ID_NOT_FOUND ("is not a share group",
//!    as Kafka answers; a JoinGroup or ConsumerGroupHeartbeat to a share group's id is
//!    answered INCONSISTENT_GROUP_PROTOCOL / GROUP_ID_NOT_FOUND by their handlers).
//! 2. The group is found, or made by a join (else GROUP_ID_NOT_FOUND); a new member beyond
//!    `group.share.max.size` is GROUP_MAX_SIZE_REACHED. The member is found, or made by a join; an unknown member
//!    that does not join is UNKNOWN_MEMBER_ID; an epoch other than the member's, or its
//!    previous one (a lost response), is FENCED_MEMBER_EPOCH.
//! 3. A changed subscription bumps the group epoch; so does a different metadata hash of
//!    the subscribed topics (created, deleted, grown) when the topics changed since the
//!    group last looked.
//! 4. Subscribed partitions whose share-partition state is neither initialised nor being
//!    initialised are marked initializing (`ShareGroupStatePartitionMetadata`) and handed
//!    to the broker in [`Output::InitializeShareGroupState`]; once the share coordinator
//!    has initialised them the broker calls
//!    [`GroupCoordinator::share_group_state_initialized`], which marks them initialised and
//!    bumps the group epoch. Only initialised partitions are assigned: a share-partition
//!    leader needs that state to know where the group starts reading.
//! 5. A group epoch ahead of the target's runs the `simple` assignor over every member;
//!    the members whose target changed get a record, and the target's epoch becomes the
//!    group epoch.
//! 6. The member takes its target at once, at the target's epoch: a share group member
//!    owns no offsets, so nothing has to be revoked first (KIP-932).
//! 7. Every change is a record, replayed into the live group at once and answered once
//!    replicated; an answer without records waits for the partition's pending writes
//!    (`committed_consumer_groups.rs`), and ShareGroupDescribe and ListGroups read the
//!    group as of the high watermark.
//!
//! Why it is correct: as for consumer groups (`consumer_protocol.rs`), the live group
//! changes only through the replay a new coordinator runs over the log, so a failover
//! rebuilds exactly what was acknowledged; a partition is in a target only if its
//! initialised mark was written before, so no member is sent to a share-partition with no
//! state; and a member whose session ends is removed with tombstones and the group epoch
//! bumped, so the others get its partitions at their next heartbeat.

use std::collections::{BTreeMap, BTreeSet};

use rill_protocol::Uuid;

use crate::api::*;
use crate::assignor::{simple_assign, MemberSpec};
use crate::consumer_group_member::LEAVE_GROUP_MEMBER_EPOCH;
use crate::consumer_group_record::{to_topic_partitions, Assignment};
use crate::consumer_protocol::{described, err, HeartbeatError};
use crate::coordinator::{Effects, GroupCoordinator};
use crate::error::error_code;
use crate::record::Record;
use crate::share_group::{member_tombstones, ShareGroup, ShareGroupMember, TopicPartitionSets};
use crate::share_group_record::*;
use crate::timer::TimerKey;

/// The share groups' only assignor (KIP-932).
pub const SHARE_GROUP_ASSIGNOR: &str = "simple";

/// The protocol type share groups list with (Kafka's `ShareGroup.PROTOCOL_TYPE`).
pub const SHARE_PROTOCOL_TYPE: &str = "share";

pub(crate) fn share_session_key(group_id: &str, member_id: &str) -> TimerKey {
    TimerKey::ShareSession {
        group_id: group_id.to_owned(),
        member_id: member_id.to_owned(),
    }
}

/// What a heartbeat decided: its records, its answer, and the partitions it asks to have
/// initialised.
struct SharePlan {
    records: Vec<ShareGroupRecord>,
    response: ShareGroupHeartbeatResponse,
    initialize: Vec<ShareTopicPartitions>,
}

fn share_group_not_found<T>(group_id: &str) -> Result<T, HeartbeatError> {
    err(
        error_code::GROUP_ID_NOT_FOUND,
        format!("Share group {group_id} not found."),
    )
}

fn to_share_topics(sets: &TopicPartitionSets) -> Vec<ShareTopicPartitions> {
    sets.iter()
        .filter(|(_, (_, ps))| !ps.is_empty())
        .map(|(id, (name, ps))| ShareTopicPartitions {
            topic_id: *id,
            topic_name: name.clone(),
            partitions: ps.iter().copied().collect(),
        })
        .collect()
}

impl GroupCoordinator {
    /// Replays one share group record into the live groups (load or handler).
    pub(crate) fn replay_share_group_record(&mut self, partition: i32, record: &ShareGroupRecord) {
        let group_id = record.group_id().to_owned();
        if !self.share_groups.contains_key(&group_id) {
            if record.is_tombstone() {
                return;
            }
            self.share_groups
                .insert(group_id.clone(), ShareGroup::new(&group_id, partition));
        }
        let keep = self
            .share_groups
            .get_mut(&group_id)
            .is_some_and(|g| g.replay(record));
        if !keep {
            self.share_groups.remove(&group_id);
            self.timer.cancel_group(&group_id);
        }
    }

    fn apply_share_records(&mut self, partition: i32, records: &[ShareGroupRecord]) {
        for r in records {
            self.replay_share_group_record(partition, r);
        }
    }

    /// A load ended: members' sessions start now (with the broker's default session
    /// until their first heartbeat here), and every group looks at its topics and at the
    /// partitions left initializing (their request died with the old coordinator) at its
    /// next heartbeat.
    pub(crate) fn share_groups_loaded(&mut self, partition: i32, now_ms: i64) {
        let session = i64::from(self.config.share_group_session_timeout_ms);
        let mut timers = Vec::new();
        for g in self.share_groups.values_mut() {
            if g.partition != partition {
                continue;
            }
            g.metadata_refresh = true;
            g.initialize_requested.clear();
            for m in g.members.values() {
                timers.push((
                    share_session_key(&g.group_id, &m.member_id),
                    now_ms + session,
                ));
            }
        }
        for (key, at) in timers {
            self.timer.schedule(key, at);
        }
    }

    /// The partition is no longer coordinated here: its share groups go.
    pub(crate) fn unload_share_groups(&mut self, partition: i32) {
        let ids: Vec<String> = self
            .share_groups
            .values()
            .filter(|g| g.partition == partition)
            .map(|g| g.group_id.clone())
            .collect();
        for id in ids {
            self.share_groups.remove(&id);
            self.timer.cancel_group(&id);
        }
    }

    /// ShareGroupHeartbeat v1 (KIP-932). The answer follows the records it wrote, or the
    /// partition's pending writes when it wrote none; an
    /// [`Output::InitializeShareGroupState`] follows when partitions need their state.
    pub fn handle_share_group_heartbeat(
        &mut self,
        req: ShareGroupHeartbeatRequest,
        now_ms: i64,
        responder: ResponderId,
    ) -> Vec<Output> {
        let partition = self.partition_for(&req.group_id);
        let outcome = match self.coordinator_error(&req.group_id) {
            Some(code) => err(code, "This node cannot serve the group now."),
            None => self.share_heartbeat(&req, now_ms),
        };
        let plan = match outcome {
            Ok(plan) => plan,
            Err((code, message)) => {
                return vec![Output::Respond(Respond {
                    responder,
                    response: Response::ShareGroupHeartbeat(ShareGroupHeartbeatResponse::error(
                        code, message,
                    )),
                })];
            }
        };
        let respond = Respond {
            responder,
            response: Response::ShareGroupHeartbeat(plan.response),
        };
        let mut outputs = if plan.records.is_empty() {
            match self.committed_consumer.hold(partition, respond) {
                Some(now) => vec![Output::Respond(now)],
                None => Vec::new(),
            }
        } else {
            let mut fx = Effects::default();
            for r in plan.records {
                fx.record(partition, Record::ShareGroup(r));
            }
            fx.responses.push(respond);
            self.finish(fx)
        };
        if !plan.initialize.is_empty() {
            let group_epoch = self
                .share_groups
                .get(&req.group_id)
                .map_or(0, |g| g.group_epoch);
            outputs.push(Output::InitializeShareGroupState {
                group_id: req.group_id.clone(),
                group_epoch,
                topics: plan.initialize,
            });
        }
        outputs
    }

    fn validate_share_heartbeat(req: &ShareGroupHeartbeatRequest) -> Result<(), HeartbeatError> {
        // Kafka 4.2's order (`GroupCoordinatorService`): member id, group id, rack, epoch.
        let invalid = |m: &str| err(error_code::INVALID_REQUEST, m);
        if req.member_id.is_empty() {
            return invalid("MemberId can't be empty.");
        }
        if req.group_id.is_empty() {
            return invalid("GroupId can't be empty.");
        }
        if req.rack_id.as_deref() == Some("") {
            return invalid("RackId can't be empty.");
        }
        match req.member_epoch {
            e if e > 0 || e == LEAVE_GROUP_MEMBER_EPOCH => Ok(()),
            0 => {
                if req
                    .subscribed_topic_names
                    .as_ref()
                    .is_none_or(|n| n.is_empty())
                {
                    return invalid("SubscribedTopicNames must be set in first request.");
                }
                Ok(())
            }
            _ => invalid("MemberEpoch is invalid."),
        }
    }

    /// GROUP_ID_NOT_FOUND when the id belongs to a classic or consumer group.
    fn check_share_group_type(&self, group_id: &str) -> Result<(), HeartbeatError> {
        if self.groups.contains_key(group_id) || self.consumer_groups.contains_key(group_id) {
            return err(
                error_code::GROUP_ID_NOT_FOUND,
                format!("Group {group_id} is not a share group."),
            );
        }
        Ok(())
    }

    /// Whether the id belongs to a share group (for the other group types' handlers).
    pub fn is_share_group(&self, group_id: &str) -> bool {
        self.share_groups.contains_key(group_id)
    }

    fn share_heartbeat(
        &mut self,
        req: &ShareGroupHeartbeatRequest,
        now_ms: i64,
    ) -> Result<SharePlan, HeartbeatError> {
        Self::validate_share_heartbeat(req)?;
        self.check_share_group_type(&req.group_id)?;
        if req.member_epoch == LEAVE_GROUP_MEMBER_EPOCH {
            return self.share_leave(req);
        }
        let partition = self.partition_for(&req.group_id);
        let plan = self.plan_share_heartbeat(req, partition)?;
        self.apply_share_records(partition, &plan.records);
        if let Some(g) = self.share_groups.get_mut(&req.group_id) {
            g.metadata_refresh = false;
            for t in &plan.initialize {
                for p in &t.partitions {
                    g.initialize_requested.insert((t.topic_id, *p));
                }
            }
        }
        self.timer.schedule(
            share_session_key(&req.group_id, &req.member_id),
            now_ms + i64::from(req.session_timeout_ms.max(0)),
        );
        Ok(plan)
    }

    /// Steps 2-6 of the design note, as records, without changing anything.
    fn plan_share_heartbeat(
        &self,
        req: &ShareGroupHeartbeatRequest,
        partition: i32,
    ) -> Result<SharePlan, HeartbeatError> {
        let join = req.member_epoch == 0;
        let gid = || req.group_id.clone();
        let fresh;
        let group = match self.share_groups.get(&req.group_id) {
            Some(g) => g,
            None if join => {
                fresh = ShareGroup::new(&req.group_id, partition);
                &fresh
            }
            // Only a join makes a group (Kafka 4.2's `getOrMaybeCreateShareGroup`).
            None => return share_group_not_found(&req.group_id),
        };
        let existing = group.members.get(&req.member_id);
        let max = usize::try_from(self.config.share_group_max_size).unwrap_or(0);
        if existing.is_none() && group.members.len() >= max {
            return err(
                error_code::GROUP_MAX_SIZE_REACHED,
                format!(
                    "The share group has reached its maximum capacity of {} members.",
                    self.config.share_group_max_size
                ),
            );
        }
        let member = match existing {
            Some(m) => {
                if req.member_epoch > m.member_epoch
                    || (req.member_epoch < m.member_epoch
                        && req.member_epoch != m.previous_member_epoch)
                {
                    return err(
                        error_code::FENCED_MEMBER_EPOCH,
                        format!(
                            "The share group member has a member epoch ({}) other than the one \
                             known by the group coordinator ({}). The member must abandon all \
                             its partitions and rejoin.",
                            req.member_epoch, m.member_epoch
                        ),
                    );
                }
                m.clone()
            }
            None if join => ShareGroupMember::new(&req.member_id),
            None => {
                return err(
                    error_code::UNKNOWN_MEMBER_ID,
                    format!(
                        "Member {} is not a member of group {}.",
                        req.member_id, req.group_id
                    ),
                )
            }
        };
        let mut records = Vec::new();

        // 2-3. The member's subscription, and the group epoch.
        let mut updated = member.clone();
        if let Some(r) = &req.rack_id {
            updated.rack_id = Some(r.clone());
        }
        if let Some(names) = &req.subscribed_topic_names {
            let mut names = names.clone();
            names.sort();
            names.dedup();
            updated.subscribed_topic_names = names;
        }
        updated.client_id = req.client_id.clone();
        updated.client_host = req.client_host.clone();
        let is_new = existing.is_none();
        let mut bump = is_new || updated.subscribed_topic_names != member.subscribed_topic_names;
        if is_new || updated.metadata_value() != member.metadata_value() {
            records.push(ShareGroupRecord::MemberMetadata {
                group_id: gid(),
                member_id: req.member_id.clone(),
                value: Some(updated.metadata_value()),
            });
        }
        let members_after: BTreeMap<&str, &ShareGroupMember> = group
            .members
            .iter()
            .filter(|(id, _)| **id != req.member_id)
            .map(|(id, m)| (id.as_str(), m))
            .chain(std::iter::once((req.member_id.as_str(), &updated)))
            .collect();
        let names = ShareGroup::subscribed_topic_names(members_after.values().copied());
        let mut group_epoch = group.group_epoch;
        let mut metadata_hash = group.metadata_hash;
        let mut initialize = Vec::new();
        if bump || group.metadata_refresh {
            let hash = ShareGroup::compute_metadata_hash(&names, &self.topics);
            if hash != group.metadata_hash {
                bump = true;
                metadata_hash = hash;
            }
            // 4. Partitions that need their state, and marks of topics that are gone.
            let exists = |id: &Uuid| self.topics.name_of(id).is_some();
            let mut initialized = group.initialized.clone();
            let mut initializing = group.initializing.clone();
            initialized.retain(|id, _| exists(id));
            initializing.retain(|id, _| exists(id));
            let mut wanted = TopicPartitionSets::new();
            for t in names.iter().filter_map(|n| self.topics.topic(n)) {
                for p in 0..t.num_partitions.max(0) {
                    let known = |s: &TopicPartitionSets| {
                        s.get(&t.id).is_some_and(|(_, ps)| ps.contains(&p))
                    };
                    if !known(&initialized) && !known(&initializing) {
                        wanted
                            .entry(t.id)
                            .or_insert_with(|| (t.name.clone(), BTreeSet::new()))
                            .1
                            .insert(p);
                    }
                }
            }
            for (id, (name, ps)) in &wanted {
                initializing
                    .entry(*id)
                    .or_insert_with(|| (name.clone(), BTreeSet::new()))
                    .1
                    .extend(ps.iter().copied());
            }
            if initialized != group.initialized || initializing != group.initializing {
                let mut next = group.clone();
                next.initialized = initialized;
                next.initializing = initializing;
                records.push(ShareGroupRecord::StatePartitionMetadata {
                    group_id: gid(),
                    value: Some(next.state_partition_metadata()),
                });
                if next.initialized != group.initialized {
                    // An assigned partition's topic is gone.
                    bump = true;
                }
            }
        }
        // Partitions still initializing that no live request covers (a coordinator
        // failover lost it) are asked for again.
        let mut again = TopicPartitionSets::new();
        let initializing_now = match records.iter().rev().find_map(|r| match r {
            ShareGroupRecord::StatePartitionMetadata { value: Some(v), .. } => {
                Some(v.initializing_topics.clone())
            }
            _ => None,
        }) {
            Some(infos) => infos
                .into_iter()
                .map(|t| {
                    (
                        t.topic_id,
                        (t.topic_name, t.partitions.into_iter().collect()),
                    )
                })
                .collect(),
            None => group.initializing.clone(),
        };
        // One initialised as well (an AlterShareGroupOffsets whose new state was not
        // written) keeps its state: asking without a start offset would reset it.
        let initialized_now = |id: &Uuid, p: &i32| {
            group
                .initialized
                .get(id)
                .is_some_and(|(_, ps)| ps.contains(p))
        };
        for (id, (name, ps)) in &initializing_now {
            for p in ps {
                if !group.initialize_requested.contains(&(*id, *p)) && !initialized_now(id, p) {
                    again
                        .entry(*id)
                        .or_insert_with(|| (name.clone(), BTreeSet::new()))
                        .1
                        .insert(*p);
                }
            }
        }
        initialize.extend(to_share_topics(&again));
        if bump {
            group_epoch += 1;
        }
        if group_epoch != group.group_epoch || metadata_hash != group.metadata_hash {
            records.push(ShareGroupRecord::Metadata {
                group_id: gid(),
                value: Some(ShareGroupMetadataValue {
                    epoch: group_epoch,
                    metadata_hash,
                }),
            });
        }

        // 5. The target assignment.
        let (assignment_epoch, target) = if group_epoch > group.assignment_epoch {
            let initialized = self.assignable_partitions(group, &records);
            let specs: Vec<MemberSpec<'_>> = members_after
                .values()
                .map(|m| MemberSpec {
                    member_id: &m.member_id,
                    instance_id: None,
                    subscribed: m
                        .subscribed_topic_names
                        .iter()
                        .filter_map(|n| self.topics.topic(n).map(|t| t.id))
                        .collect(),
                    previous: group.target_assignment.get(&m.member_id),
                })
                .collect();
            let targets = simple_assign(&specs, &initialized);
            for (member_id, a) in &targets {
                if group.target_assignment.get(member_id) != Some(a) {
                    records.push(ShareGroupRecord::TargetAssignmentMember {
                        group_id: gid(),
                        member_id: member_id.clone(),
                        value: Some(ShareGroupTargetAssignmentMemberValue {
                            topic_partitions: to_topic_partitions(a),
                        }),
                    });
                }
            }
            records.push(ShareGroupRecord::TargetAssignmentMetadata {
                group_id: gid(),
                value: Some(ShareGroupTargetAssignmentMetadataValue {
                    assignment_epoch: group_epoch,
                }),
            });
            let mine = targets.get(&req.member_id).cloned().unwrap_or_default();
            (group_epoch, mine)
        } else {
            (group.assignment_epoch, group.target_of(&req.member_id))
        };

        // 6. The member takes its target at once.
        let mut reconciled = updated.clone();
        if is_new
            || reconciled.member_epoch != assignment_epoch
            || reconciled.assigned_partitions != target
        {
            if reconciled.member_epoch != assignment_epoch {
                reconciled.previous_member_epoch = reconciled.member_epoch;
                reconciled.member_epoch = assignment_epoch;
            }
            reconciled.assigned_partitions = target;
            records.push(ShareGroupRecord::CurrentMemberAssignment {
                group_id: gid(),
                member_id: req.member_id.clone(),
                value: Some(reconciled.current_assignment_value()),
            });
        }
        let changed = join || reconciled.assigned_partitions != member.assigned_partitions;
        let response = ShareGroupHeartbeatResponse {
            error_code: error_code::NONE,
            error_message: None,
            member_id: Some(req.member_id.clone()),
            member_epoch: reconciled.member_epoch,
            heartbeat_interval_ms: req.heartbeat_interval_ms,
            assignment: changed.then(|| to_topic_partitions(&reconciled.assigned_partitions)),
        };
        Ok(SharePlan {
            records,
            response,
            initialize,
        })
    }

    /// The partitions the assignor may hand out: initialised ones (as `records` leave
    /// them) of topics that still exist, below their partition count.
    fn assignable_partitions(
        &self,
        group: &ShareGroup,
        records: &[ShareGroupRecord],
    ) -> BTreeMap<Uuid, BTreeSet<i32>> {
        let initialized = records
            .iter()
            .rev()
            .find_map(|r| match r {
                ShareGroupRecord::StatePartitionMetadata { value: Some(v), .. } => Some(
                    v.initialized_topics
                        .iter()
                        .map(|t| (t.topic_id, t.partitions.iter().copied().collect()))
                        .collect::<BTreeMap<Uuid, BTreeSet<i32>>>(),
                ),
                _ => None,
            })
            .unwrap_or_else(|| {
                group
                    .initialized
                    .iter()
                    .map(|(id, (_, ps))| (*id, ps.clone()))
                    .collect()
            });
        initialized
            .into_iter()
            .filter_map(|(id, ps)| {
                let name = self.topics.name_of(&id)?;
                let count = self.topics.topic(name)?.num_partitions;
                let ps: BTreeSet<i32> = ps.into_iter().filter(|p| *p < count).collect();
                Some((id, ps))
            })
            .collect()
    }

    /// Epoch -1: the member leaves; its records get tombstones and the group epoch is
    /// bumped so the others take its partitions.
    fn share_leave(
        &mut self,
        req: &ShareGroupHeartbeatRequest,
    ) -> Result<SharePlan, HeartbeatError> {
        let Some(g) = self.share_groups.get(&req.group_id) else {
            // Kafka's `shareGroupLeave` looks the group up as describe does.
            return err(
                error_code::GROUP_ID_NOT_FOUND,
                format!("Group {} not found.", req.group_id),
            );
        };
        if !g.members.contains_key(&req.member_id) {
            return err(
                error_code::UNKNOWN_MEMBER_ID,
                format!(
                    "Member {} is not a member of group {}.",
                    req.member_id, req.group_id
                ),
            );
        }
        let records = self.fence_share_member(&req.group_id, &req.member_id);
        Ok(SharePlan {
            records,
            response: ShareGroupHeartbeatResponse {
                error_code: error_code::NONE,
                error_message: None,
                member_id: Some(req.member_id.clone()),
                member_epoch: LEAVE_GROUP_MEMBER_EPOCH,
                heartbeat_interval_ms: req.heartbeat_interval_ms,
                assignment: None,
            },
            initialize: Vec::new(),
        })
    }

    /// Removes a member (it left, or its session ended): tombstones, and the group epoch
    /// bumped with the hash of what the others subscribe to. The records are replayed
    /// here and returned for writing.
    fn fence_share_member(&mut self, group_id: &str, member_id: &str) -> Vec<ShareGroupRecord> {
        self.timer.cancel(&share_session_key(group_id, member_id));
        let Some(g) = self.share_groups.get(group_id) else {
            return Vec::new();
        };
        let mut records = member_tombstones(group_id, member_id);
        let names = ShareGroup::subscribed_topic_names(
            g.members.values().filter(|m| m.member_id != member_id),
        );
        records.push(ShareGroupRecord::Metadata {
            group_id: group_id.to_owned(),
            value: Some(ShareGroupMetadataValue {
                epoch: g.group_epoch + 1,
                metadata_hash: ShareGroup::compute_metadata_hash(&names, &self.topics),
            }),
        });
        let partition = g.partition;
        self.apply_share_records(partition, &records);
        records
    }

    /// A share member's session ended.
    pub(crate) fn on_share_session_timeout(
        &mut self,
        group_id: &str,
        member_id: &str,
        fx: &mut Effects,
    ) {
        let Some(partition) = self
            .share_groups
            .get(group_id)
            .filter(|g| g.members.contains_key(member_id))
            .map(|g| g.partition)
        else {
            return;
        };
        for r in self.fence_share_member(group_id, member_id) {
            fx.record(partition, Record::ShareGroup(r));
        }
    }

    /// The share coordinator initialised these partitions' share-partition state for the
    /// group (InitializeShareGroupState succeeded), asked for by an
    /// [`Output::InitializeShareGroupState`]: they become assignable, and the group epoch
    /// is bumped so the next heartbeat assigns them. Partitions no longer initializing
    /// (the topic went, the group was deleted) are ignored.
    pub fn share_group_state_initialized(
        &mut self,
        group_id: &str,
        topics: &[ShareTopicPartitions],
        _now_ms: i64,
    ) -> Vec<Output> {
        if self.coordinator_error(group_id).is_some() {
            return Vec::new();
        }
        let Some(live) = self.share_groups.get_mut(group_id) else {
            return Vec::new();
        };
        // Answered: no longer an ask in flight (keeps the set bounded by what is
        // initializing).
        for t in topics {
            for p in &t.partitions {
                live.initialize_requested.remove(&(t.topic_id, *p));
            }
        }
        let g = live.clone();
        let mut next = g.clone();
        let mut moved = false;
        for t in topics {
            let Some((name, initializing)) = next.initializing.get_mut(&t.topic_id) else {
                continue;
            };
            let name = name.clone();
            for p in &t.partitions {
                if initializing.remove(p) {
                    moved = true;
                    next.initialized
                        .entry(t.topic_id)
                        .or_insert_with(|| (name.clone(), BTreeSet::new()))
                        .1
                        .insert(*p);
                }
            }
        }
        if !moved {
            return Vec::new();
        }
        next.initializing.retain(|_, (_, ps)| !ps.is_empty());
        let records = vec![
            ShareGroupRecord::StatePartitionMetadata {
                group_id: group_id.to_owned(),
                value: Some(next.state_partition_metadata()),
            },
            ShareGroupRecord::Metadata {
                group_id: group_id.to_owned(),
                value: Some(ShareGroupMetadataValue {
                    epoch: g.group_epoch + 1,
                    metadata_hash: g.metadata_hash,
                }),
            },
        ];
        let partition = g.partition;
        self.apply_share_records(partition, &records);
        let mut fx = Effects::default();
        for r in records {
            fx.record(partition, Record::ShareGroup(r));
        }
        self.finish(fx)
    }

    /// ShareGroupDescribe, from the groups as of the high watermark.
    pub fn handle_share_group_describe(
        &self,
        req: &ShareGroupDescribeRequest,
    ) -> ShareGroupDescribeResponse {
        let groups = req
            .group_ids
            .iter()
            .map(|id| {
                if let Some(code) = self.coordinator_error(id) {
                    return DescribedShareGroup::error(id, code, None);
                }
                let Some(g) = self.committed_consumer.share_group(id) else {
                    let message =
                        if self.groups.contains_key(id) || self.consumer_groups.contains_key(id) {
                            format!("Group {id} is not a share group.")
                        } else {
                            format!("Group {id} not found.")
                        };
                    return DescribedShareGroup::error(
                        id,
                        error_code::GROUP_ID_NOT_FOUND,
                        Some(message),
                    );
                };
                DescribedShareGroup {
                    error_code: error_code::NONE,
                    error_message: None,
                    group_id: id.clone(),
                    group_state: g.state().to_string(),
                    group_epoch: g.group_epoch,
                    assignment_epoch: g.assignment_epoch,
                    assignor_name: SHARE_GROUP_ASSIGNOR.to_owned(),
                    members: g
                        .members
                        .values()
                        .map(|m| DescribedShareGroupMember {
                            member_id: m.member_id.clone(),
                            rack_id: m.rack_id.clone(),
                            member_epoch: m.member_epoch,
                            client_id: m.client_id.clone(),
                            client_host: m.client_host.clone(),
                            subscribed_topic_names: m.subscribed_topic_names.clone(),
                            assignment: described(&m.assigned_partitions, &self.topics),
                        })
                        .collect(),
                }
            })
            .collect();
        ShareGroupDescribeResponse { groups }
    }

    /// The share groups as of the high watermark, for ListGroups (an id another group
    /// type has taken since is left out).
    pub(crate) fn listed_share_groups(&self) -> impl Iterator<Item = &ShareGroup> {
        self.committed_consumer.share_groups().filter(|g| {
            !self.groups.contains_key(&g.group_id)
                && !self.consumer_groups.contains_key(&g.group_id)
        })
    }

    /// DeleteGroups of a share group: an Empty one gets tombstones for all its records.
    /// (Its share-partition state is the share coordinator's to delete.)
    pub(crate) fn delete_share_group(&mut self, group_id: &str, fx: &mut Effects) -> i16 {
        let Some(g) = self.share_groups.get(group_id) else {
            return error_code::GROUP_ID_NOT_FOUND;
        };
        if !g.members.is_empty() {
            return error_code::NON_EMPTY_GROUP;
        }
        let partition = g.partition;
        let records = g.tombstones();
        self.apply_share_records(partition, &records);
        for r in records {
            fx.record(partition, Record::ShareGroup(r));
        }
        self.timer.cancel_group(group_id);
        error_code::NONE
    }

    /// Every share group this node knows (as of the high watermark), with its state,
    /// group epoch and members, for the broker's metrics.
    pub fn share_group_overview(&self) -> Vec<(String, crate::ShareGroupState, i32, usize)> {
        self.committed_consumer
            .share_groups()
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

    /// The share group's state, if this node knows the group (newest state).
    pub fn share_group_state(&self, group_id: &str) -> Option<crate::ShareGroupState> {
        self.share_groups.get(group_id).map(ShareGroup::state)
    }

    /// The share group's (group epoch, assignment epoch), newest state.
    pub fn share_group_epochs(&self, group_id: &str) -> Option<(i32, i32)> {
        self.share_groups
            .get(group_id)
            .map(|g| (g.group_epoch, g.assignment_epoch))
    }

    /// A member of a share group, newest state.
    pub fn share_group_member(&self, group_id: &str, member_id: &str) -> Option<&ShareGroupMember> {
        self.share_groups
            .get(group_id)
            .and_then(|g| g.members.get(member_id))
    }

    /// Every member's assignment in a share group, newest state.
    pub fn share_group_assignments(&self, group_id: &str) -> BTreeMap<String, Assignment> {
        self.share_groups
            .get(group_id)
            .map(|g| {
                g.members
                    .values()
                    .map(|m| (m.member_id.clone(), m.assigned_partitions.clone()))
                    .collect()
            })
            .unwrap_or_default()
    }
}
