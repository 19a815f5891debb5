//! KIP-848's online migration between the classic protocol and the consumer protocol
//! (Kafka 4's `group.consumer.migration.policy`): a classic group becomes a consumer group
//! when a member of the consumer protocol joins it, members that still speak the classic
//! protocol (JoinGroup, SyncGroup, Heartbeat, LeaveGroup) are served by the consumer group
//! meanwhile, and the group goes back to a classic group when its last member of the
//! consumer protocol leaves: an application can be switched one process at a time, both
//! ways.
//!
//! # Design note
//!
//! 1. Upgrade (`upgrade` or `bidirectional`): a ConsumerGroupHeartbeat that joins a
//!    classic group of the `consumer` protocol type with members converts it (Kafka's
//!    `ConsumerGroup.fromClassicGroup`): every classic member becomes a consumer group
//!    member at the generation as its epoch, Stable, owning and targeted with its last
//!    assignment (decoded from the consumer protocol bytes, topics by name to id), with
//!    its JoinGroup protocols and session timeout kept as classic member metadata; the
//!    group epoch and target epoch are the generation. The classic group's metadata gets
//!    a tombstone, the consumer group its records, and the joining member then goes
//!    through the usual heartbeat: a new group epoch, a new target, reconciliation.
//!    Requests the classic group had parked get REBALANCE_IN_PROGRESS.
//! 2. A classic member's JoinGroup to a consumer group is a heartbeat of that member: its
//!    subscription and owned partitions come from its protocol metadata, it is created
//!    if it is new, and it is reconciled like any member (revocation first). The answer
//!    is its epoch as the generation and its first protocol, no leader: it syncs as a
//!    follower and SyncGroup gives it its current assignment in the consumer protocol's
//!    bytes.
//! 3. A classic member's Heartbeat answers REBALANCE_IN_PROGRESS when it must join again
//!    to move on: the group epoch is ahead of its epoch, it must revoke, or a partition it
//!    waits for has been released; one that has not rejoined within its rebalance timeout
//!    is fenced. LeaveGroup removes it as a leaving consumer member is
//!    removed (tombstones, a new group epoch).
//! 4. Its generation is checked as a classic group checks it (ILLEGAL_GENERATION) on
//!    SyncGroup, Heartbeat and OffsetCommit.
//!
//! Why it is correct: the converted group is exactly the classic group's last Stable
//! assignment, so no partition gains a second owner at the switch; from then on every
//! member, whatever its protocol, is reconciled by the same builder, which gives a
//! partition away only once its owner no longer reports it (a classic member reports
//! what it owns in each JoinGroup; an eager one owns nothing when it rejoins).
//!
//! 5. Downgrade (`downgrade` or `bidirectional`): when the member leaving (or fenced) is
//!    the last one of the consumer protocol and classic members remain, the group goes back
//!    to a classic group (Kafka's `ClassicGroup.fromConsumerGroup`): the consumer group's
//!    tombstones and a classic group metadata record with the group epoch as generation,
//!    a protocol every member supports, each member's current assignment; then a
//!    rebalance, so that the members join it the classic way.

use std::fmt;
use std::str::FromStr;

use crate::api::*;
use crate::consumer_group::ConsumerGroup;
use crate::consumer_group_member::{ConsumerGroupMember, MemberState};
use crate::consumer_group_record::*;
use crate::consumer_protocol::{err, new_member_id, rebalance_key, session_key, HeartbeatError};
use crate::coordinator::{Effects, GroupCoordinator};
use crate::error::error_code;
use crate::group::ClassicGroup;
use crate::record::{
    GroupMetadataKey, GroupMetadataRecord, GroupMetadataValue, MemberMetadata, Record,
};
use crate::subscription::{
    decode_classic_assignment, decode_classic_subscription, encode_classic_assignment,
    CONSUMER_PROTOCOL_TYPE,
};

/// `group.consumer.migration.policy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ConsumerGroupMigrationPolicy {
    Disabled,
    Upgrade,
    Downgrade,
    #[default]
    Bidirectional,
}

impl ConsumerGroupMigrationPolicy {
    pub fn upgrade_enabled(self) -> bool {
        matches!(self, Self::Upgrade | Self::Bidirectional)
    }

    pub fn downgrade_enabled(self) -> bool {
        matches!(self, Self::Downgrade | Self::Bidirectional)
    }
}

impl FromStr for ConsumerGroupMigrationPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "disabled" => Ok(Self::Disabled),
            "upgrade" => Ok(Self::Upgrade),
            "downgrade" => Ok(Self::Downgrade),
            "bidirectional" => Ok(Self::Bidirectional),
            other => Err(other.to_owned()),
        }
    }
}

impl fmt::Display for ConsumerGroupMigrationPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Disabled => "disabled",
            Self::Upgrade => "upgrade",
            Self::Downgrade => "downgrade",
            Self::Bidirectional => "bidirectional",
        })
    }
}

/// A classic member's protocols and session, as kept in its metadata record.
fn classic_metadata(
    session_timeout_ms: i32,
    protocols: &[(String, bytes::Bytes)],
) -> ClassicMemberMetadata {
    ClassicMemberMetadata {
        session_timeout_ms,
        supported_protocols: protocols.to_vec(),
    }
}

impl GroupCoordinator {
    /// Step 5: the classic group's metadata when removing `leaving` leaves only classic
    /// members (Kafka's `validateOnlineDowngradeWithFencedMember` and
    /// `ClassicGroup.fromConsumerGroup`): the group epoch as the generation, a protocol
    /// every member supports (the first member's first such), each member's subscription
    /// for it and its current assignment in the consumer protocol's bytes.
    pub(crate) fn downgrade_value(
        &self,
        group_id: &str,
        leaving: &str,
        now_ms: i64,
    ) -> Option<GroupMetadataValue> {
        let g = self.consumer_groups.get(group_id)?;
        let remaining: Vec<&ConsumerGroupMember> = g
            .members
            .values()
            .filter(|m| m.member_id != leaving)
            .collect();
        let max = usize::try_from(self.config.group_max_size).unwrap_or(0);
        if !self
            .config
            .consumer_group_migration_policy
            .downgrade_enabled()
            || remaining.is_empty()
            || remaining.len() > max
            || !remaining.iter().all(|m| m.uses_classic_protocol())
        {
            return None;
        }
        let protocols: Vec<&ClassicMemberMetadata> = remaining
            .iter()
            .filter_map(|m| m.classic.as_ref())
            .collect();
        let protocol = protocols
            .first()?
            .supported_protocols
            .iter()
            .find(|(name, _)| {
                protocols
                    .iter()
                    .all(|c| c.supported_protocols.iter().any(|(n, _)| n == name))
            })?;
        let protocol = protocol.0.clone();
        let members = remaining
            .iter()
            .map(|m| {
                let classic = m.classic.as_ref();
                let subscription = classic
                    .and_then(|c| c.supported_protocols.iter().find(|(n, _)| *n == protocol))
                    .map(|(_, s)| s.clone())
                    .unwrap_or_default();
                let version = decode_classic_subscription(&subscription).map_or(0, |s| s.version);
                MemberMetadata {
                    member_id: m.member_id.clone(),
                    group_instance_id: m.instance_id.clone(),
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    rebalance_timeout: m.rebalance_timeout_ms,
                    session_timeout: classic.map_or(0, |c| c.session_timeout_ms),
                    subscription,
                    assignment: encode_classic_assignment(
                        version,
                        &self.by_topic_name(&m.assigned_partitions),
                    ),
                }
            })
            .collect();
        Some(GroupMetadataValue {
            protocol_type: CONSUMER_PROTOCOL_TYPE.to_owned(),
            generation: g.group_epoch,
            protocol: Some(protocol),
            leader: remaining.first().map(|m| m.member_id.clone()),
            current_state_timestamp: now_ms,
            members,
        })
    }

    /// Step 5: the consumer group's tombstones and the classic group's metadata, replayed
    /// here as a load would, then a rebalance so that the members join the classic way.
    pub(crate) fn downgrade(
        &mut self,
        group_id: &str,
        value: GroupMetadataValue,
        now_ms: i64,
        fx: &mut Effects,
    ) -> Vec<Record> {
        let partition = self.partition_for(group_id);
        let tombstones = self
            .consumer_groups
            .get(group_id)
            .map(ConsumerGroup::tombstones)
            .unwrap_or_default();
        self.apply_consumer_records(partition, &tombstones, now_ms);
        self.timer.cancel_group(group_id);
        let mut join_seq = self.join_seq;
        let g = self
            .groups
            .entry(group_id.to_owned())
            .or_insert_with(|| ClassicGroup::new(group_id.to_owned(), partition, Some(now_ms)));
        g.apply_metadata(&value, &mut join_seq);
        g.last_persisted = Some(value.clone());
        self.join_seq = join_seq;
        let (groups, mut cx) = self.split(now_ms, fx);
        if let Some(g) = groups.get_mut(group_id) {
            let ids: Vec<String> = g.members.keys().cloned().collect();
            for id in &ids {
                cx.reschedule_member_heartbeat(g, id);
            }
            cx.prepare_rebalance(g);
        }
        let mut records: Vec<Record> = tombstones.into_iter().map(Record::ConsumerGroup).collect();
        records.push(Record::GroupMetadata(GroupMetadataRecord {
            key: GroupMetadataKey {
                group: group_id.to_owned(),
            },
            value: Some(value),
        }));
        records
    }

    /// Partitions named by topic as an assignment by topic id; topics this node does not
    /// know are left out.
    fn by_topic_id(&self, partitions: &[(String, Vec<i32>)]) -> Assignment {
        let mut out = Assignment::new();
        for (topic, ps) in partitions {
            if let Some(t) = self.topics.topic(topic) {
                out.entry(t.id).or_default().extend(ps.iter().copied());
            }
        }
        out
    }

    fn by_topic_name(&self, assignment: &Assignment) -> Vec<(String, Vec<i32>)> {
        assignment
            .iter()
            .filter_map(|(id, ps)| {
                self.topics
                    .name_of(id)
                    .map(|n| (n.to_owned(), ps.iter().copied().collect()))
            })
            .collect()
    }

    /// Step 1 of the design note: the consumer group a classic group becomes, its
    /// records, and per converted member its session and parked requests' answers.
    #[allow(clippy::type_complexity)]
    pub(crate) fn convert_classic_group(
        &self,
        classic: &ClassicGroup,
    ) -> Result<
        (
            ConsumerGroup,
            Vec<ConsumerGroupRecord>,
            Vec<(String, i32, Vec<Respond>)>,
        ),
        HeartbeatError,
    > {
        let not_convertible = |why: &str| {
            err(
                error_code::GROUP_ID_NOT_FOUND,
                format!(
                    "Cannot upgrade the classic group {} to a consumer group: {why}.",
                    classic.group_id
                ),
            )
        };
        if classic.protocol_type.as_deref() != Some(CONSUMER_PROTOCOL_TYPE) {
            return not_convertible("it does not use the consumer protocol type");
        }
        let max = usize::try_from(self.config.consumer_group_max_size).unwrap_or(0);
        if classic.members.len() > max {
            return not_convertible("it has more members than group.consumer.max.size");
        }
        let protocol = classic.protocol_name.clone().unwrap_or_default();
        let generation = classic.generation_id;
        let group_id = classic.group_id.clone();
        let mut members = Vec::new();
        let mut parked = Vec::new();
        for m in classic.members.values() {
            let Ok(subscription) = decode_classic_subscription(&m.metadata(&protocol)) else {
                return not_convertible("its embedded consumer protocol is malformed");
            };
            let Ok(assigned) = decode_classic_assignment(&m.assignment) else {
                return not_convertible("its embedded consumer protocol is malformed");
            };
            let mut topics = subscription.topics.clone();
            topics.sort();
            topics.dedup();
            let member = ConsumerGroupMember {
                member_id: m.member_id.clone(),
                instance_id: m.group_instance_id.clone(),
                rack_id: subscription.rack_id.clone(),
                client_id: m.client_id.clone(),
                client_host: m.client_host.clone(),
                subscribed_topic_names: topics,
                subscribed_topic_regex: None,
                rebalance_timeout_ms: m.rebalance_timeout_ms,
                server_assignor: None,
                classic: Some(classic_metadata(
                    m.session_timeout_ms,
                    &m.supported_protocols,
                )),
                member_epoch: generation,
                previous_member_epoch: generation,
                state: MemberState::Stable,
                assigned_partitions: self.by_topic_id(&assigned),
                partitions_pending_revocation: Assignment::new(),
            };
            let mut answers = Vec::new();
            if let Some(r) = m.awaiting_join {
                answers.push(Respond {
                    responder: r,
                    response: Response::JoinGroup(JoinGroupResponse::error(
                        &m.member_id,
                        error_code::REBALANCE_IN_PROGRESS,
                    )),
                });
            }
            if let Some(r) = m.awaiting_sync {
                answers.push(Respond {
                    responder: r,
                    response: Response::SyncGroup(SyncGroupResponse::error(
                        error_code::REBALANCE_IN_PROGRESS,
                    )),
                });
            }
            parked.push((m.member_id.clone(), m.session_timeout_ms, answers));
            members.push(member);
        }
        // A group in the middle of a rebalance converts from its members' last
        // assignments; they learn of the new target when they heartbeat or rejoin.
        let names = ConsumerGroup::subscribed_topic_names(members.iter(), &Default::default());
        let metadata = ConsumerGroup::compute_subscription_metadata(&names, &self.topics);
        let g = || group_id.clone();
        let mut records = Vec::new();
        for m in &members {
            records.push(ConsumerGroupRecord::MemberMetadata {
                group_id: g(),
                member_id: m.member_id.clone(),
                value: Some(m.metadata_value()),
            });
        }
        records.push(ConsumerGroupRecord::Metadata {
            group_id: g(),
            value: Some(ConsumerGroupMetadataValue { epoch: generation }),
        });
        records.push(ConsumerGroupRecord::PartitionMetadata {
            group_id: g(),
            value: Some(ConsumerGroupPartitionMetadataValue {
                topics: metadata.values().cloned().collect(),
            }),
        });
        for m in &members {
            records.push(ConsumerGroupRecord::TargetAssignmentMember {
                group_id: g(),
                member_id: m.member_id.clone(),
                value: Some(ConsumerGroupTargetAssignmentMemberValue {
                    topic_partitions: to_topic_partitions(&m.assigned_partitions),
                }),
            });
        }
        records.push(ConsumerGroupRecord::TargetAssignmentMetadata {
            group_id: g(),
            value: Some(ConsumerGroupTargetAssignmentMetadataValue {
                assignment_epoch: generation,
            }),
        });
        for m in &members {
            records.push(ConsumerGroupRecord::CurrentMemberAssignment {
                group_id: g(),
                member_id: m.member_id.clone(),
                value: Some(m.current_assignment_value()),
            });
        }
        // The group as those records make it: one path, the replay's.
        let mut group = ConsumerGroup::new(&group_id, classic.partition);
        for r in &records {
            group.replay(r);
        }
        group.metadata_refresh = false;
        Ok((group, records, parked))
    }

    /// Whether a JoinGroup's protocols can join the group's classic members (Kafka's
    /// `ConsumerGroup.supportsClassicProtocols`): the consumer protocol type, and a
    /// protocol every classic member supports too.
    fn supports_classic_protocols(group: &ConsumerGroup, req: &JoinGroupRequest) -> bool {
        if req.protocol_type != CONSUMER_PROTOCOL_TYPE || req.protocols.is_empty() {
            return false;
        }
        group
            .members
            .values()
            .filter_map(|m| m.classic.as_ref())
            .all(|c| {
                c.supported_protocols
                    .iter()
                    .any(|(name, _)| req.protocols.iter().any(|(n, _)| n == name))
            })
    }

    /// Step 2: JoinGroup to a consumer group with members.
    pub(crate) fn classic_join_to_consumer_group(
        &mut self,
        req: JoinGroupRequest,
        now_ms: i64,
        responder: ResponderId,
    ) -> Vec<Output> {
        let answer = |response: JoinGroupResponse| {
            vec![Output::Respond(Respond {
                responder,
                response: Response::JoinGroup(response),
            })]
        };
        let Some(group) = self.consumer_groups.get(&req.group_id) else {
            return answer(JoinGroupResponse::error(
                &req.member_id,
                error_code::UNKNOWN_MEMBER_ID,
            ));
        };
        if !Self::supports_classic_protocols(group, &req) {
            return answer(JoinGroupResponse::error(
                &req.member_id,
                error_code::INCONSISTENT_GROUP_PROTOCOL,
            ));
        }
        let mut member_id = req.member_id.clone();
        if member_id.is_empty() {
            member_id = new_member_id(&mut self.rng);
            if req.group_instance_id.is_none() && req.api_version >= 4 {
                // The member comes back with this id (KIP-394), as from a classic group.
                return answer(JoinGroupResponse::error(
                    &member_id,
                    error_code::MEMBER_ID_REQUIRED,
                ));
            }
        }
        let Some((protocol_name, metadata)) = req.protocols.first().cloned() else {
            return answer(JoinGroupResponse::error(
                &member_id,
                error_code::INCONSISTENT_GROUP_PROTOCOL,
            ));
        };
        let Ok(subscription) = decode_classic_subscription(&metadata) else {
            return answer(JoinGroupResponse::error(
                &member_id,
                error_code::INCONSISTENT_GROUP_PROTOCOL,
            ));
        };
        let owned = self.by_topic_id(&subscription.owned_partitions);
        let classic = classic_metadata(req.session_timeout_ms, &req.protocols);
        let heartbeat = ConsumerGroupHeartbeatRequest {
            group_id: req.group_id.clone(),
            member_id: member_id.clone(),
            member_epoch: 0,
            instance_id: req.group_instance_id.clone(),
            rack_id: subscription.rack_id.clone(),
            rebalance_timeout_ms: req.rebalance_timeout_ms,
            subscribed_topic_names: Some(subscription.topics.clone()),
            subscribed_topic_regex: None,
            server_assignor: None,
            topic_partitions: Some(to_topic_partitions(&owned)),
            client_id: req.client_id.clone(),
            client_host: req.client_host.clone(),
            session_timeout_ms: req.session_timeout_ms,
            heartbeat_interval_ms: 0,
        };
        let partition = self.partition_for(&req.group_id);
        let plan =
            match self.plan_heartbeat(&heartbeat, member_id.clone(), partition, Some(&classic)) {
                Ok(plan) => plan,
                Err((code, _)) => return answer(JoinGroupResponse::error(&member_id, code)),
            };
        let protocol = plan.protocol_name.clone().unwrap_or(protocol_name);
        let (records, response, parked) = self.apply_plan(&heartbeat, plan, now_ms);
        let join = JoinGroupResponse {
            error_code: error_code::NONE,
            generation_id: response.member_epoch,
            protocol_type: Some(CONSUMER_PROTOCOL_TYPE.to_owned()),
            protocol_name: Some(protocol),
            leader: String::new(),
            skip_assignment: false,
            member_id: response.member_id.unwrap_or(member_id),
            members: Vec::new(),
        };
        let respond = Respond {
            responder,
            response: Response::JoinGroup(join),
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

    /// The classic member a request names (by member id, or instance id and member id).
    fn classic_member<'a>(
        group: &'a ConsumerGroup,
        member_id: &str,
        instance_id: Option<&str>,
    ) -> Result<&'a ConsumerGroupMember, i16> {
        let member = match instance_id {
            Some(i) => {
                let m = group
                    .static_member(i)
                    .ok_or(error_code::UNKNOWN_MEMBER_ID)?;
                if m.member_id != member_id {
                    return Err(error_code::FENCED_INSTANCE_ID);
                }
                m
            }
            None => group
                .members
                .get(member_id)
                .ok_or(error_code::UNKNOWN_MEMBER_ID)?,
        };
        if !member.uses_classic_protocol() {
            return Err(error_code::UNKNOWN_MEMBER_ID);
        }
        Ok(member)
    }

    /// SyncGroup to a consumer group: the member's current assignment.
    pub(crate) fn classic_sync_to_consumer_group(
        &mut self,
        req: SyncGroupRequest,
        now_ms: i64,
        responder: ResponderId,
    ) -> Vec<Output> {
        let answer = |response: SyncGroupResponse| {
            vec![Output::Respond(Respond {
                responder,
                response: Response::SyncGroup(response),
            })]
        };
        let Some(group) = self.consumer_groups.get(&req.group_id) else {
            return answer(SyncGroupResponse::error(error_code::UNKNOWN_MEMBER_ID));
        };
        let member =
            match Self::classic_member(group, &req.member_id, req.group_instance_id.as_deref()) {
                Ok(m) => m,
                Err(code) => return answer(SyncGroupResponse::error(code)),
            };
        if member.member_epoch != req.generation_id {
            return answer(SyncGroupResponse::error(error_code::ILLEGAL_GENERATION));
        }
        let protocol = member
            .classic
            .as_ref()
            .and_then(|c| c.supported_protocols.first().cloned());
        let mismatch = |asked: &Option<String>, have: Option<&str>| matches!((asked, have), (Some(a), Some(h)) if a != h);
        if mismatch(&req.protocol_type, Some(CONSUMER_PROTOCOL_TYPE))
            || mismatch(
                &req.protocol_name,
                protocol.as_ref().map(|(n, _)| n.as_str()),
            )
        {
            return answer(SyncGroupResponse::error(
                error_code::INCONSISTENT_GROUP_PROTOCOL,
            ));
        }
        if group.group_epoch > member.member_epoch
            && member.state != MemberState::UnrevokedPartitions
        {
            return answer(SyncGroupResponse::error(error_code::REBALANCE_IN_PROGRESS));
        }
        let version = protocol
            .as_ref()
            .and_then(|(_, m)| decode_classic_subscription(m).ok())
            .map_or(0, |s| s.version);
        let assignment =
            encode_classic_assignment(version, &self.by_topic_name(&member.assigned_partitions));
        let (protocol_type, protocol_name) = (
            Some(CONSUMER_PROTOCOL_TYPE.to_owned()),
            protocol.map(|(n, _)| n),
        );
        let session = member.classic.as_ref().map_or(0, |c| c.session_timeout_ms);
        let key = session_key(&req.group_id, &member.member_id);
        self.timer.schedule(key, now_ms + i64::from(session.max(0)));
        let partition = self.partition_for(&req.group_id);
        let respond = Respond {
            responder,
            response: Response::SyncGroup(SyncGroupResponse {
                error_code: error_code::NONE,
                protocol_type,
                protocol_name,
                assignment,
            }),
        };
        match self.committed_consumer.hold(partition, respond) {
            Some(now) => vec![Output::Respond(now)],
            None => Vec::new(),
        }
    }

    /// Step 3: Heartbeat to a consumer group.
    pub(crate) fn classic_heartbeat_to_consumer_group(
        &mut self,
        req: &HeartbeatRequest,
        now_ms: i64,
    ) -> i16 {
        let Some(group) = self.consumer_groups.get(&req.group_id) else {
            return error_code::UNKNOWN_MEMBER_ID;
        };
        let member =
            match Self::classic_member(group, &req.member_id, req.group_instance_id.as_deref()) {
                Ok(m) => m,
                Err(code) => return code,
            };
        if member.member_epoch != req.generation_id {
            return error_code::ILLEGAL_GENERATION;
        }
        // A partition it waits for that nobody holds any more: it can have it now.
        let released = member.state == MemberState::UnreleasedPartitions
            && group.target_of(&member.member_id).iter().any(|(t, ps)| {
                ps.iter().any(|p| {
                    !member
                        .assigned_partitions
                        .get(t)
                        .is_some_and(|s| s.contains(p))
                        && group.current_partition_epoch(t, *p) == -1
                })
            });
        let rejoin = member.member_epoch < group.group_epoch
            || member.state == MemberState::UnrevokedPartitions
            || released;
        let session = member.classic.as_ref().map_or(0, |c| c.session_timeout_ms);
        let (member_id, epoch, rebalance_timeout_ms) = (
            member.member_id.clone(),
            member.member_epoch,
            member.rebalance_timeout_ms,
        );
        let key = session_key(&req.group_id, &member_id);
        self.timer.schedule(key, now_ms + i64::from(session.max(0)));
        if !rejoin {
            return error_code::NONE;
        }
        // Kafka's join timeout: a member told to rejoin that has not within its rebalance
        // timeout is fenced (its JoinGroup cancels the timer).
        let key = rebalance_key(&req.group_id, &member_id);
        if !self.timer.is_scheduled(&key) {
            if let Some(g) = self.consumer_groups.get_mut(&req.group_id) {
                g.rebalance_timeout_epochs.insert(member_id, epoch);
            }
            self.timer
                .schedule(key, now_ms + i64::from(rebalance_timeout_ms.max(0)));
        }
        error_code::REBALANCE_IN_PROGRESS
    }

    /// LeaveGroup to a consumer group: each classic member named leaves as a fenced one.
    pub(crate) fn classic_leave_to_consumer_group(
        &mut self,
        req: LeaveGroupRequest,
        now_ms: i64,
        fx: &mut Effects,
    ) -> LeaveGroupResponse {
        let partition = self.partition_for(&req.group_id);
        let mut results = Vec::with_capacity(req.members.len());
        for ident in req.members {
            let found = self.consumer_groups.get(&req.group_id).map(|group| {
                match &ident.group_instance_id {
                    // Administrative removal by instance id carries no member id.
                    Some(i) if ident.member_id.is_empty() => group
                        .static_member(i)
                        .filter(|m| m.uses_classic_protocol())
                        .map(|m| m.member_id.clone())
                        .ok_or(error_code::UNKNOWN_MEMBER_ID),
                    instance => Self::classic_member(group, &ident.member_id, instance.as_deref())
                        .map(|m| m.member_id.clone()),
                }
            });
            let code = match found {
                Some(Ok(member_id)) => {
                    for r in self.fence_member(&req.group_id, &member_id, now_ms, fx) {
                        fx.record(partition, r);
                    }
                    error_code::NONE
                }
                Some(Err(code)) => code,
                None => error_code::UNKNOWN_MEMBER_ID,
            };
            results.push(LeaveGroupMemberResponse {
                member_id: ident.member_id,
                group_instance_id: ident.group_instance_id,
                error_code: code,
            });
        }
        LeaveGroupResponse {
            error_code: error_code::NONE,
            members: results,
        }
    }
}
