//! A classic group (Kafka's `ClassicGroup`): its state, members, generation and committed
//! offsets, with the bookkeeping that must stay consistent (leader, static members,
//! protocol support counts, members awaiting join). The transitions that need time or
//! produce outputs live in the coordinator.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;

use bytes::Bytes;

use crate::api::{JoinGroupResponseMember, ResponderId};
use crate::error::error_code;
use crate::record::{GroupMetadataValue, MemberMetadata, OffsetCommitValue};
use crate::subscription::{decode_subscribed_topics, CONSUMER_PROTOCOL_TYPE};

/// The states of a classic group (Kafka's `ClassicGroupState`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ClassicGroupState {
    /// No members; offsets may remain (and expire in this state only).
    Empty,
    /// Collecting JoinGroups for the next generation.
    PreparingRebalance,
    /// The generation is chosen; waiting for the leader's SyncGroup with the assignment.
    CompletingRebalance,
    /// Every member has its assignment.
    Stable,
    /// Deleted or unloaded; about to be forgotten.
    Dead,
}

impl ClassicGroupState {
    /// Kafka's allowed previous states for each state.
    fn valid_previous(self, from: ClassicGroupState) -> bool {
        use ClassicGroupState::*;
        match self {
            Empty => from == PreparingRebalance,
            PreparingRebalance => matches!(from, Stable | CompletingRebalance | Empty),
            CompletingRebalance => from == PreparingRebalance,
            Stable => from == CompletingRebalance,
            Dead => true,
        }
    }

    pub const ALL: [ClassicGroupState; 5] = [
        ClassicGroupState::Empty,
        ClassicGroupState::PreparingRebalance,
        ClassicGroupState::CompletingRebalance,
        ClassicGroupState::Stable,
        ClassicGroupState::Dead,
    ];
}

impl fmt::Display for ClassicGroupState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ClassicGroupState::Empty => "Empty",
            ClassicGroupState::PreparingRebalance => "PreparingRebalance",
            ClassicGroupState::CompletingRebalance => "CompletingRebalance",
            ClassicGroupState::Stable => "Stable",
            ClassicGroupState::Dead => "Dead",
        })
    }
}

/// Unknown state name (ListGroups filters are matched case-insensitively).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownGroupState(pub String);

impl FromStr for ClassicGroupState {
    type Err = UnknownGroupState;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|st| st.to_string().eq_ignore_ascii_case(s))
            .ok_or_else(|| UnknownGroupState(s.to_owned()))
    }
}

/// How the current join phase ends (Kafka's `InitialDelayedJoin` and `DelayedJoin`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum JoinTimer {
    /// A new group waits `delay_ms` for more members, again while they keep coming, until
    /// `remaining_ms` of the rebalance timeout is used up.
    InitialDelayed { delay_ms: i64, remaining_ms: i64 },
    /// The rebalance timeout: members that have not rejoined by then are removed.
    Rebalance,
}

#[derive(Debug, Clone)]
pub(crate) struct ClassicGroupMember {
    pub(crate) member_id: String,
    pub(crate) group_instance_id: Option<String>,
    pub(crate) client_id: String,
    pub(crate) client_host: String,
    pub(crate) rebalance_timeout_ms: i32,
    pub(crate) session_timeout_ms: i32,
    pub(crate) protocol_type: String,
    pub(crate) supported_protocols: Vec<(String, Bytes)>,
    pub(crate) assignment: Bytes,
    /// The parked JoinGroup, if any.
    pub(crate) awaiting_join: Option<ResponderId>,
    /// The parked SyncGroup, if any.
    pub(crate) awaiting_sync: Option<ResponderId>,
    /// Joined during the current rebalance and not yet answered (KIP-394: such members
    /// expire after `group.new.member.join.timeout` even while parked).
    pub(crate) is_new: bool,
    /// Order of arrival; the next leader is the earliest remaining member.
    pub(crate) join_seq: u64,
}

impl ClassicGroupMember {
    pub(crate) fn metadata(&self, protocol: &str) -> Bytes {
        self.supported_protocols
            .iter()
            .find(|(n, _)| n == protocol)
            .map(|(_, m)| m.clone())
            .unwrap_or_default()
    }

    /// Same protocols, same metadata, same order.
    pub(crate) fn matches(&self, protocols: &[(String, Bytes)]) -> bool {
        self.supported_protocols == protocols
    }

    /// A member parked in a join or sync is kept alive by the rebalance, not by
    /// heartbeats (it cannot send them); a new member is not (KIP-394).
    pub(crate) fn has_satisfied_heartbeat(&self) -> bool {
        !self.is_new && (self.awaiting_join.is_some() || self.awaiting_sync.is_some())
    }

    fn protocol_names(&self) -> BTreeSet<&str> {
        self.supported_protocols
            .iter()
            .map(|(n, _)| n.as_str())
            .collect()
    }

    /// The member's first preference among `candidates`.
    fn vote<'a>(&'a self, candidates: &BTreeSet<&str>) -> Option<&'a str> {
        self.supported_protocols
            .iter()
            .map(|(n, _)| n.as_str())
            .find(|n| candidates.contains(n))
    }
}

#[derive(Debug)]
pub(crate) struct ClassicGroup {
    pub(crate) group_id: String,
    pub(crate) partition: i32,
    pub(crate) state: ClassicGroupState,
    pub(crate) previous_state: ClassicGroupState,
    pub(crate) current_state_timestamp_ms: Option<i64>,
    /// `None` for a "simple" group created by an offset commit from outside group
    /// management.
    pub(crate) protocol_type: Option<String>,
    pub(crate) protocol_name: Option<String>,
    pub(crate) generation_id: i32,
    pub(crate) leader_id: Option<String>,
    pub(crate) members: BTreeMap<String, ClassicGroupMember>,
    /// group.instance.id -> member id.
    pub(crate) static_members: BTreeMap<String, String>,
    /// Member ids handed out with MEMBER_ID_REQUIRED and not yet used to join.
    pub(crate) pending_join_members: BTreeSet<String>,
    /// Members that got this generation's JoinGroup response but have not synced.
    pub(crate) pending_sync_members: BTreeSet<String>,
    num_members_awaiting_join: usize,
    /// protocol name -> number of members supporting it.
    supported_protocols: BTreeMap<String, usize>,
    /// Set when a member joins during the initial delay, to extend it.
    pub(crate) new_member_added: bool,
    pub(crate) join_timer: Option<JoinTimer>,
    /// Topics the members subscribe to under the `consumer` protocol; `None` when they
    /// cannot be known (another protocol type, or undecodable metadata).
    pub(crate) subscribed_topics: Option<BTreeSet<String>>,
    /// (topic, partition) -> committed offset.
    pub(crate) offsets: BTreeMap<(String, i32), OffsetCommitValue>,
    /// The last metadata record written or replayed for this group.
    pub(crate) last_persisted: Option<GroupMetadataValue>,
}

impl ClassicGroup {
    pub(crate) fn new(group_id: String, partition: i32, state_timestamp_ms: Option<i64>) -> Self {
        ClassicGroup {
            group_id,
            partition,
            state: ClassicGroupState::Empty,
            previous_state: ClassicGroupState::Empty,
            current_state_timestamp_ms: state_timestamp_ms,
            protocol_type: None,
            protocol_name: None,
            generation_id: 0,
            leader_id: None,
            members: BTreeMap::new(),
            static_members: BTreeMap::new(),
            pending_join_members: BTreeSet::new(),
            pending_sync_members: BTreeSet::new(),
            num_members_awaiting_join: 0,
            supported_protocols: BTreeMap::new(),
            new_member_added: false,
            join_timer: None,
            subscribed_topics: None,
            offsets: BTreeMap::new(),
            last_persisted: None,
        }
    }

    pub(crate) fn is(&self, state: ClassicGroupState) -> bool {
        self.state == state
    }

    pub(crate) fn transition_to(&mut self, state: ClassicGroupState, now_ms: i64) {
        assert!(
            state.valid_previous(self.state),
            "group {} cannot go from {} to {}",
            self.group_id,
            self.state,
            state
        );
        self.previous_state = self.state;
        self.state = state;
        self.current_state_timestamp_ms = Some(now_ms);
    }

    pub(crate) fn has_member(&self, member_id: &str) -> bool {
        self.members.contains_key(member_id)
    }

    pub(crate) fn is_leader(&self, member_id: &str) -> bool {
        self.leader_id.as_deref() == Some(member_id)
    }

    pub(crate) fn leader_or_empty(&self) -> String {
        self.leader_id.clone().unwrap_or_default()
    }

    pub(crate) fn can_rebalance(&self) -> bool {
        matches!(
            self.state,
            ClassicGroupState::Stable
                | ClassicGroupState::CompletingRebalance
                | ClassicGroupState::Empty
        )
    }

    pub(crate) fn num_awaiting_join(&self) -> usize {
        self.num_members_awaiting_join
    }

    pub(crate) fn has_all_members_joined(&self) -> bool {
        self.members.len() == self.num_members_awaiting_join && self.pending_join_members.is_empty()
    }

    /// The largest rebalance timeout of the members bounds the join phase.
    pub(crate) fn rebalance_timeout_ms(&self) -> i64 {
        self.members
            .values()
            .map(|m| i64::from(m.rebalance_timeout_ms))
            .max()
            .unwrap_or(0)
    }

    fn index_protocols(&mut self, member_id: &str, add: bool) {
        let Some(member) = self.members.get(member_id) else {
            return;
        };
        let names: Vec<String> = member
            .protocol_names()
            .into_iter()
            .map(str::to_owned)
            .collect();
        for name in names {
            if add {
                *self.supported_protocols.entry(name).or_insert(0) += 1;
            } else if let Some(n) = self.supported_protocols.get_mut(&name) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    self.supported_protocols.remove(&name);
                }
            }
        }
    }

    /// Kafka's `supportsProtocols`: an empty group takes any non-empty protocol type and
    /// protocol list; otherwise the type must match and at least one of the protocols
    /// must be supported by every current member.
    pub(crate) fn supports_protocols(
        &self,
        protocol_type: &str,
        protocols: &[(String, Bytes)],
    ) -> bool {
        if self.members.is_empty() {
            !protocol_type.is_empty() && !protocols.is_empty()
        } else {
            self.protocol_type.as_deref() == Some(protocol_type)
                && protocols.iter().any(|(name, _)| {
                    self.supported_protocols.get(name).copied() == Some(self.members.len())
                })
        }
    }

    /// Kafka's vote: the candidates are the protocols every member supports; each member
    /// votes for its most preferred candidate; the most voted wins. Ties go to the
    /// candidate that the leader prefers, so the choice is deterministic.
    pub(crate) fn select_protocol(&self) -> Option<String> {
        let n = self.members.len();
        let candidates: BTreeSet<&str> = self
            .supported_protocols
            .iter()
            .filter(|(_, c)| **c == n)
            .map(|(p, _)| p.as_str())
            .collect();
        let mut votes: BTreeMap<&str, usize> = BTreeMap::new();
        for m in self.members.values() {
            if let Some(v) = m.vote(&candidates) {
                *votes.entry(v).or_insert(0) += 1;
            }
        }
        let best = votes.values().copied().max()?;
        let tied: BTreeSet<&str> = votes
            .iter()
            .filter(|(_, c)| **c == best)
            .map(|(p, _)| *p)
            .collect();
        let leader = self.leader_id.as_ref().and_then(|l| self.members.get(l));
        leader
            .and_then(|l| l.vote(&tied))
            .or_else(|| tied.iter().next().copied())
            .map(str::to_owned)
    }

    pub(crate) fn add_member(&mut self, member: ClassicGroupMember) {
        if self.members.is_empty() {
            self.protocol_type = Some(member.protocol_type.clone());
        }
        if self.leader_id.is_none() {
            self.leader_id = Some(member.member_id.clone());
        }
        if let Some(instance) = &member.group_instance_id {
            self.static_members
                .insert(instance.clone(), member.member_id.clone());
        }
        if member.awaiting_join.is_some() {
            self.num_members_awaiting_join += 1;
        }
        self.pending_join_members.remove(&member.member_id);
        let id = member.member_id.clone();
        self.members.insert(id.clone(), member);
        self.index_protocols(&id, true);
    }

    /// Removes a member and re-elects the leader (earliest remaining member). The caller
    /// answers any request the member had parked.
    pub(crate) fn remove_member(&mut self, member_id: &str) -> Option<ClassicGroupMember> {
        self.index_protocols(member_id, false);
        let member = self.members.remove(member_id)?;
        if member.awaiting_join.is_some() {
            self.num_members_awaiting_join = self.num_members_awaiting_join.saturating_sub(1);
        }
        if let Some(instance) = &member.group_instance_id {
            if self.static_members.get(instance).map(String::as_str) == Some(member_id) {
                self.static_members.remove(instance);
            }
        }
        self.pending_join_members.remove(member_id);
        self.pending_sync_members.remove(member_id);
        if self.is_leader(member_id) {
            self.leader_id = self
                .members
                .values()
                .min_by_key(|m| m.join_seq)
                .map(|m| m.member_id.clone());
        }
        Some(member)
    }

    /// Parks (or unparks) a member's JoinGroup; returns the one it replaces.
    pub(crate) fn set_awaiting_join(
        &mut self,
        member_id: &str,
        responder: Option<ResponderId>,
    ) -> Option<ResponderId> {
        let member = self.members.get_mut(member_id)?;
        let old = std::mem::replace(&mut member.awaiting_join, responder);
        match (old.is_some(), responder.is_some()) {
            (false, true) => self.num_members_awaiting_join += 1,
            (true, false) => {
                self.num_members_awaiting_join = self.num_members_awaiting_join.saturating_sub(1)
            }
            _ => {}
        }
        old
    }

    /// Replaces a member's protocols and timeouts (a rejoin).
    pub(crate) fn update_member(
        &mut self,
        member_id: &str,
        protocols: Vec<(String, Bytes)>,
        rebalance_timeout_ms: i32,
        session_timeout_ms: i32,
    ) {
        self.index_protocols(member_id, false);
        if let Some(m) = self.members.get_mut(member_id) {
            m.supported_protocols = protocols;
            m.rebalance_timeout_ms = rebalance_timeout_ms;
            m.session_timeout_ms = session_timeout_ms;
        }
        self.index_protocols(member_id, true);
    }

    /// Moves a static member to a new member id (KIP-345); returns the old member's
    /// parked requests so that the caller fences them.
    pub(crate) fn replace_static_member(
        &mut self,
        instance_id: &str,
        old_member_id: &str,
        new_member_id: &str,
    ) -> (Option<ResponderId>, Option<ResponderId>) {
        let was_leader = self.is_leader(old_member_id);
        let was_pending_sync = self.pending_sync_members.contains(old_member_id);
        let Some(mut member) = self.remove_member(old_member_id) else {
            return (None, None);
        };
        let parked = (member.awaiting_join.take(), member.awaiting_sync.take());
        member.member_id = new_member_id.to_owned();
        member.group_instance_id = Some(instance_id.to_owned());
        self.add_member(member);
        if was_leader {
            self.leader_id = Some(new_member_id.to_owned());
        }
        if was_pending_sync {
            self.pending_sync_members.insert(new_member_id.to_owned());
        }
        parked
    }

    /// Kafka's `validateMember`: a static member must present the member id that holds
    /// its instance id; a dynamic one must be known.
    pub(crate) fn validate_member(
        &self,
        member_id: &str,
        instance_id: Option<&str>,
    ) -> Result<(), i16> {
        match instance_id {
            Some(instance) => match self.static_members.get(instance) {
                None => Err(error_code::UNKNOWN_MEMBER_ID),
                Some(existing) if existing != member_id => Err(error_code::FENCED_INSTANCE_ID),
                Some(_) => Ok(()),
            },
            None if self.has_member(member_id) => Ok(()),
            None => Err(error_code::UNKNOWN_MEMBER_ID),
        }
    }

    /// Kafka's `maybeElectNewJoinedLeader`: keep the leader if it rejoined, else pick the
    /// earliest member that did; false when nobody rejoined.
    pub(crate) fn maybe_elect_new_joined_leader(&mut self) -> bool {
        let Some(leader) = self.leader_id.as_ref().and_then(|l| self.members.get(l)) else {
            return false;
        };
        if leader.awaiting_join.is_some() {
            return true;
        }
        let next = self
            .members
            .values()
            .filter(|m| m.awaiting_join.is_some())
            .min_by_key(|m| m.join_seq)
            .map(|m| m.member_id.clone());
        match next {
            Some(id) => {
                self.leader_id = Some(id);
                true
            }
            None => false,
        }
    }

    /// Every member with its metadata for the selected protocol, in arrival order.
    pub(crate) fn current_member_metadata(&self) -> Vec<JoinGroupResponseMember> {
        let protocol = self.protocol_name.clone().unwrap_or_default();
        let mut members: Vec<&ClassicGroupMember> = self.members.values().collect();
        members.sort_by_key(|m| m.join_seq);
        members
            .into_iter()
            .map(|m| JoinGroupResponseMember {
                member_id: m.member_id.clone(),
                group_instance_id: m.group_instance_id.clone(),
                metadata: m.metadata(&protocol),
            })
            .collect()
    }

    pub(crate) fn compute_subscribed_topics(&self) -> Option<BTreeSet<String>> {
        if self.protocol_type.as_deref() != Some(CONSUMER_PROTOCOL_TYPE) {
            return None;
        }
        if self.members.is_empty() {
            return Some(BTreeSet::new());
        }
        let protocol = self.protocol_name.as_deref()?;
        let mut topics = BTreeSet::new();
        for m in self.members.values() {
            topics.extend(decode_subscribed_topics(&m.metadata(protocol)).ok()?);
        }
        Some(topics)
    }

    /// Whether OffsetDelete must refuse the topic. When the subscription is unknown the
    /// answer is yes: deleting offsets a member is using would rewind it.
    pub(crate) fn is_subscribed_to_topic(&self, topic: &str) -> bool {
        if self.members.is_empty() {
            return false;
        }
        match &self.subscribed_topics {
            Some(t) => t.contains(topic),
            None => true,
        }
    }

    /// The group's metadata record value from its current fields.
    pub(crate) fn metadata_value(&self) -> GroupMetadataValue {
        let protocol = self.protocol_name.clone().unwrap_or_default();
        let mut members: Vec<&ClassicGroupMember> = self.members.values().collect();
        members.sort_by_key(|m| m.join_seq);
        GroupMetadataValue {
            protocol_type: self.protocol_type.clone().unwrap_or_default(),
            generation: self.generation_id,
            protocol: self.protocol_name.clone(),
            leader: self.leader_id.clone(),
            current_state_timestamp: self.current_state_timestamp_ms.unwrap_or(-1),
            members: members
                .into_iter()
                .map(|m| MemberMetadata {
                    member_id: m.member_id.clone(),
                    group_instance_id: m.group_instance_id.clone(),
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    rebalance_timeout: m.rebalance_timeout_ms,
                    session_timeout: m.session_timeout_ms,
                    subscription: m.metadata(&protocol),
                    assignment: m.assignment.clone(),
                })
                .collect(),
        }
    }

    /// Rebuilds the group's membership from a metadata record (load). A group with
    /// members is Stable, else Empty, as in Kafka: records are only written at those
    /// points, so a load never resumes a rebalance half-way.
    pub(crate) fn apply_metadata(&mut self, value: &GroupMetadataValue, join_seq: &mut u64) {
        self.members.clear();
        self.static_members.clear();
        self.supported_protocols.clear();
        self.pending_join_members.clear();
        self.pending_sync_members.clear();
        self.num_members_awaiting_join = 0;
        self.join_timer = None;
        self.new_member_added = false;
        self.protocol_type = (!value.protocol_type.is_empty()).then(|| value.protocol_type.clone());
        self.generation_id = value.generation;
        self.protocol_name = value.protocol.clone();
        self.leader_id = None;
        let protocol = value.protocol.clone().unwrap_or_default();
        for m in &value.members {
            *join_seq += 1;
            self.add_member(ClassicGroupMember {
                member_id: m.member_id.clone(),
                group_instance_id: m.group_instance_id.clone(),
                client_id: m.client_id.clone(),
                client_host: m.client_host.clone(),
                rebalance_timeout_ms: m.rebalance_timeout,
                session_timeout_ms: m.session_timeout,
                protocol_type: value.protocol_type.clone(),
                supported_protocols: vec![(protocol.clone(), m.subscription.clone())],
                assignment: m.assignment.clone(),
                awaiting_join: None,
                awaiting_sync: None,
                is_new: false,
                join_seq: *join_seq,
            });
        }
        self.leader_id = value
            .leader
            .clone()
            .filter(|l| self.members.contains_key(l));
        if self.leader_id.is_none() {
            self.leader_id = self
                .members
                .values()
                .min_by_key(|m| m.join_seq)
                .map(|m| m.member_id.clone());
        }
        self.previous_state = self.state;
        self.state = if self.members.is_empty() {
            ClassicGroupState::Empty
        } else {
            ClassicGroupState::Stable
        };
        self.current_state_timestamp_ms =
            (value.current_state_timestamp >= 0).then_some(value.current_state_timestamp);
        self.subscribed_topics = self.compute_subscribed_topics();
        self.last_persisted = Some(value.clone());
    }
}
