//! A consumer group of KIP-848's protocol (Kafka's `ConsumerGroup`): group epoch, target
//! assignment and its epoch, members with their epochs and current assignments, the
//! subscription metadata, and the group's committed offsets. It changes only by replaying
//! its records ([`ConsumerGroup::replay`]); the handlers that decide live in
//! `consumer_protocol.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use regex::Regex;
use rill_protocol::Uuid;

use crate::consumer_group_member::{ConsumerGroupMember, LEAVE_GROUP_MEMBER_EPOCH};
use crate::consumer_group_record::*;
use crate::record::OffsetCommitValue;
use crate::topics_image::TopicsImage;

/// Kafka's `ConsumerGroupState`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ConsumerGroupState {
    /// No members.
    Empty,
    /// The group epoch is ahead of the target assignment's.
    Assigning,
    /// Some member is not yet at the target assignment.
    Reconciling,
    /// Every member owns its target.
    Stable,
    /// Deleted.
    Dead,
}

impl ConsumerGroupState {
    pub const ALL: [ConsumerGroupState; 5] = [
        ConsumerGroupState::Empty,
        ConsumerGroupState::Assigning,
        ConsumerGroupState::Reconciling,
        ConsumerGroupState::Stable,
        ConsumerGroupState::Dead,
    ];
}

impl fmt::Display for ConsumerGroupState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ConsumerGroupState::Empty => "Empty",
            ConsumerGroupState::Assigning => "Assigning",
            ConsumerGroupState::Reconciling => "Reconciling",
            ConsumerGroupState::Stable => "Stable",
            ConsumerGroupState::Dead => "Dead",
        })
    }
}

/// Regular expressions by pattern, with the topic names each matched.
pub(crate) type ResolvedRegexes = BTreeMap<String, BTreeSet<String>>;

/// A regular expression subscription in Kafka's (RE2J) syntax, which the `regex` crate
/// shares for everything but back-references and look-around (RE2J has neither). Kafka
/// matches a topic name whole (`Matcher.matches`).
pub(crate) fn compile_subscription_regex(pattern: &str) -> Result<Regex, regex::Error> {
    regex::RegexBuilder::new(&format!("^(?:{pattern})$"))
        // A member's pattern must not make the coordinator build something huge.
        .size_limit(1 << 20)
        .build()
}

#[derive(Debug, Clone)]
pub struct ConsumerGroup {
    pub(crate) group_id: String,
    pub(crate) partition: i32,
    pub(crate) group_epoch: i32,
    pub(crate) assignment_epoch: i32,
    pub(crate) members: BTreeMap<String, ConsumerGroupMember>,
    /// group.instance.id -> member id.
    pub(crate) static_members: BTreeMap<String, String>,
    pub(crate) target_assignment: BTreeMap<String, Assignment>,
    /// The epoch of each partition's current owner (assigned to it or pending its
    /// revocation); absent when the partition is free.
    pub(crate) partition_epochs: BTreeMap<(Uuid, i32), i32>,
    /// The subscribed topics that exist, by name, as last persisted.
    pub(crate) subscription_metadata: BTreeMap<String, ConsumerGroupTopicMetadata>,
    /// (topic, partition) -> committed offset (the newest, not only replicated ones).
    pub(crate) offsets: BTreeMap<(String, i32), OffsetCommitValue>,
    /// Not persisted: the topics changed since the subscription metadata was computed,
    /// so the next heartbeat computes it again (Kafka's metadata refresh).
    pub(crate) metadata_refresh: bool,
    /// Not persisted: each regular expression the members use, with the topics it
    /// matched when last resolved. Like Kafka's (whose resolution runs in the
    /// background), a new pattern is resolved one heartbeat after it arrives, and every
    /// pattern again after the topics change.
    pub(crate) resolved_regexes: ResolvedRegexes,
    /// Not persisted: the epoch each member's rebalance timeout was armed at.
    pub(crate) rebalance_timeout_epochs: BTreeMap<String, i32>,
}

impl ConsumerGroup {
    pub(crate) fn new(group_id: &str, partition: i32) -> Self {
        ConsumerGroup {
            group_id: group_id.to_owned(),
            partition,
            group_epoch: 0,
            assignment_epoch: 0,
            members: BTreeMap::new(),
            static_members: BTreeMap::new(),
            target_assignment: BTreeMap::new(),
            partition_epochs: BTreeMap::new(),
            subscription_metadata: BTreeMap::new(),
            offsets: BTreeMap::new(),
            metadata_refresh: true,
            resolved_regexes: ResolvedRegexes::new(),
            rebalance_timeout_epochs: BTreeMap::new(),
        }
    }

    pub fn state(&self) -> ConsumerGroupState {
        if self.members.is_empty() {
            ConsumerGroupState::Empty
        } else if self.group_epoch > self.assignment_epoch {
            ConsumerGroupState::Assigning
        } else if self
            .members
            .values()
            .any(|m| !m.is_reconciled_to(self.assignment_epoch))
        {
            ConsumerGroupState::Reconciling
        } else {
            ConsumerGroupState::Stable
        }
    }

    pub(crate) fn static_member(&self, instance_id: &str) -> Option<&ConsumerGroupMember> {
        self.static_members
            .get(instance_id)
            .and_then(|id| self.members.get(id))
    }

    /// The epoch of the member that owns the partition now, or -1.
    pub(crate) fn current_partition_epoch(&self, topic: &Uuid, partition: i32) -> i32 {
        self.partition_epochs
            .get(&(*topic, partition))
            .copied()
            .unwrap_or(-1)
    }

    pub(crate) fn target_of(&self, member_id: &str) -> Assignment {
        self.target_assignment
            .get(member_id)
            .cloned()
            .unwrap_or_default()
    }

    /// Every regular expression the members use, resolved against `topics` (a pattern
    /// that does not compile matches nothing; the heartbeat that brought it was refused).
    pub(crate) fn resolve_regexes<'a>(
        members: impl Iterator<Item = &'a ConsumerGroupMember>,
        topics: &TopicsImage,
    ) -> ResolvedRegexes {
        let patterns: BTreeSet<&str> = members
            .filter_map(|m| m.subscribed_topic_regex.as_deref())
            .collect();
        patterns
            .into_iter()
            .map(|p| {
                let matched = compile_subscription_regex(p)
                    .map(|re| {
                        topics
                            .topics()
                            .filter(|t| re.is_match(&t.name))
                            .map(|t| t.name.clone())
                            .collect()
                    })
                    .unwrap_or_default();
                (p.to_owned(), matched)
            })
            .collect()
    }

    /// The topic names the members subscribe to: their names, and what their regular
    /// expressions matched when `resolved` (one not resolved yet adds nothing).
    pub(crate) fn subscribed_topic_names<'a>(
        members: impl Iterator<Item = &'a ConsumerGroupMember>,
        resolved: &ResolvedRegexes,
    ) -> BTreeSet<String> {
        let mut names = BTreeSet::new();
        for m in members {
            names.extend(m.subscribed_topic_names.iter().cloned());
            if let Some(topics) = m
                .subscribed_topic_regex
                .as_ref()
                .and_then(|p| resolved.get(p))
            {
                names.extend(topics.iter().cloned());
            }
        }
        names
    }

    /// One member's subscribed topic ids among `metadata`: its names, and what its regular
    /// expression matched when `resolved`.
    pub(crate) fn member_topic_ids(
        member: &ConsumerGroupMember,
        metadata: &BTreeMap<String, ConsumerGroupTopicMetadata>,
        resolved: &ResolvedRegexes,
    ) -> BTreeSet<Uuid> {
        let matched = member
            .subscribed_topic_regex
            .as_ref()
            .and_then(|p| resolved.get(p));
        member
            .subscribed_topic_names
            .iter()
            .chain(matched.into_iter().flatten())
            .filter_map(|n| metadata.get(n).map(|t| t.topic_id))
            .collect()
    }

    /// The subscription metadata for `names`: those that exist, with id and partitions.
    pub(crate) fn compute_subscription_metadata(
        names: &BTreeSet<String>,
        topics: &TopicsImage,
    ) -> BTreeMap<String, ConsumerGroupTopicMetadata> {
        names
            .iter()
            .filter_map(|n| topics.topic(n))
            .map(|t| {
                (
                    t.name.clone(),
                    ConsumerGroupTopicMetadata {
                        topic_id: t.id,
                        topic_name: t.name.clone(),
                        num_partitions: t.num_partitions,
                    },
                )
            })
            .collect()
    }

    /// Whether the group consumes `topic` now (OffsetDelete, offset expiry).
    pub(crate) fn is_subscribed_to_topic(&self, topic: &str) -> bool {
        self.subscription_metadata.contains_key(topic)
            || self
                .members
                .values()
                .any(|m| m.subscribed_topic_names.iter().any(|n| n == topic))
    }

    fn remove_partition_epochs(&mut self, member: &ConsumerGroupMember) {
        for (t, ps) in member
            .assigned_partitions
            .iter()
            .chain(member.partitions_pending_revocation.iter())
        {
            for p in ps {
                if self.partition_epochs.get(&(*t, *p)) == Some(&member.member_epoch) {
                    self.partition_epochs.remove(&(*t, *p));
                }
            }
        }
    }

    fn add_partition_epochs(&mut self, member: &ConsumerGroupMember) {
        for (t, ps) in member
            .assigned_partitions
            .iter()
            .chain(member.partitions_pending_revocation.iter())
        {
            for p in ps {
                self.partition_epochs.insert((*t, *p), member.member_epoch);
            }
        }
    }

    fn update_member(&mut self, member: ConsumerGroupMember) {
        if let Some(old) = self.members.get(&member.member_id).cloned() {
            self.remove_partition_epochs(&old);
            if let Some(i) = &old.instance_id {
                if self.static_members.get(i) == Some(&old.member_id)
                    && member.instance_id.as_ref() != Some(i)
                {
                    self.static_members.remove(i);
                }
            }
        }
        self.add_partition_epochs(&member);
        if let Some(i) = &member.instance_id {
            self.static_members
                .insert(i.clone(), member.member_id.clone());
        }
        self.members.insert(member.member_id.clone(), member);
    }

    fn remove_member(&mut self, member_id: &str) {
        if let Some(old) = self.members.remove(member_id) {
            self.remove_partition_epochs(&old);
            if let Some(i) = &old.instance_id {
                if self.static_members.get(i).map(String::as_str) == Some(member_id) {
                    self.static_members.remove(i);
                }
            }
        }
        self.rebalance_timeout_epochs.remove(member_id);
    }

    /// Applies one of the group's records (Kafka's `GroupMetadataManager.replay` for the
    /// consumer group record types). Returns false for a tombstone of the whole group
    /// (`ConsumerGroupMetadata` with no value): the caller forgets the group.
    pub(crate) fn replay(&mut self, record: &ConsumerGroupRecord) -> bool {
        match record {
            ConsumerGroupRecord::Metadata { value, .. } => match value {
                Some(v) => self.group_epoch = v.epoch,
                None => return false,
            },
            ConsumerGroupRecord::PartitionMetadata { value, .. } => {
                self.subscription_metadata = value
                    .as_ref()
                    .map(|v| {
                        v.topics
                            .iter()
                            .map(|t| (t.topic_name.clone(), t.clone()))
                            .collect()
                    })
                    .unwrap_or_default();
            }
            ConsumerGroupRecord::MemberMetadata {
                member_id, value, ..
            } => match value {
                Some(v) => {
                    let mut m = self
                        .members
                        .get(member_id)
                        .cloned()
                        .unwrap_or_else(|| ConsumerGroupMember::new(member_id));
                    m.apply_metadata(v);
                    self.update_member(m);
                }
                None => self.remove_member(member_id),
            },
            ConsumerGroupRecord::TargetAssignmentMetadata { value, .. } => {
                self.assignment_epoch = value.as_ref().map_or(-1, |v| v.assignment_epoch);
            }
            ConsumerGroupRecord::TargetAssignmentMember {
                member_id, value, ..
            } => match value {
                Some(v) => {
                    self.target_assignment.insert(
                        member_id.clone(),
                        from_topic_partitions(&v.topic_partitions),
                    );
                }
                None => {
                    self.target_assignment.remove(member_id);
                }
            },
            ConsumerGroupRecord::CurrentMemberAssignment {
                member_id, value, ..
            } => match value {
                Some(v) => {
                    let mut m = self
                        .members
                        .get(member_id)
                        .cloned()
                        .unwrap_or_else(|| ConsumerGroupMember::new(member_id));
                    m.apply_current_assignment(v);
                    self.update_member(m);
                }
                None => {
                    if let Some(mut m) = self.members.get(member_id).cloned() {
                        m.member_epoch = LEAVE_GROUP_MEMBER_EPOCH;
                        m.previous_member_epoch = LEAVE_GROUP_MEMBER_EPOCH;
                        m.assigned_partitions.clear();
                        m.partitions_pending_revocation.clear();
                        self.update_member(m);
                    }
                }
            },
        }
        true
    }

    /// Tombstones for every record of the group (Kafka's `createGroupTombstoneRecords`),
    /// in the order that replays cleanly: members' assignments, targets, the target's
    /// epoch, subscriptions, the subscription metadata, the epoch.
    pub(crate) fn tombstones(&self) -> Vec<ConsumerGroupRecord> {
        let g = || self.group_id.clone();
        let mut out = Vec::new();
        for id in self.members.keys() {
            out.push(ConsumerGroupRecord::CurrentMemberAssignment {
                group_id: g(),
                member_id: id.clone(),
                value: None,
            });
        }
        for id in self.members.keys() {
            out.push(ConsumerGroupRecord::TargetAssignmentMember {
                group_id: g(),
                member_id: id.clone(),
                value: None,
            });
        }
        out.push(ConsumerGroupRecord::TargetAssignmentMetadata {
            group_id: g(),
            value: None,
        });
        for id in self.members.keys() {
            out.push(ConsumerGroupRecord::MemberMetadata {
                group_id: g(),
                member_id: id.clone(),
                value: None,
            });
        }
        out.push(ConsumerGroupRecord::PartitionMetadata {
            group_id: g(),
            value: None,
        });
        out.push(ConsumerGroupRecord::Metadata {
            group_id: g(),
            value: None,
        });
        out
    }
}
