//! A share group of KIP-932 (Kafka's `ShareGroup`): group epoch and metadata hash, target
//! assignment and its epoch, members with their epochs and assignments, and which topics'
//! share-partition state is initialised. It changes only by replaying its records
//! ([`ShareGroup::replay`]); the handlers that decide live in `share_protocol.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use rill_protocol::Uuid;

use crate::consumer_group_member::LEAVE_GROUP_MEMBER_EPOCH;
use crate::consumer_group_record::{from_topic_partitions, to_topic_partitions, Assignment};
use crate::share_group_record::*;
use crate::topics_image::TopicsImage;

/// Kafka's `ShareGroup.ShareGroupState`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ShareGroupState {
    /// No members.
    Empty,
    /// Members; a share group member never waits on another, so there is no assigning or
    /// reconciling state.
    Stable,
    /// Deleted.
    Dead,
}

impl ShareGroupState {
    pub const ALL: [ShareGroupState; 3] = [
        ShareGroupState::Empty,
        ShareGroupState::Stable,
        ShareGroupState::Dead,
    ];
}

impl fmt::Display for ShareGroupState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ShareGroupState::Empty => "Empty",
            ShareGroupState::Stable => "Stable",
            ShareGroupState::Dead => "Dead",
        })
    }
}

/// A share group member (Kafka's `ShareGroupMember`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareGroupMember {
    pub member_id: String,
    pub member_epoch: i32,
    pub previous_member_epoch: i32,
    pub rack_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub subscribed_topic_names: Vec<String>,
    pub assigned_partitions: Assignment,
}

impl ShareGroupMember {
    pub(crate) fn new(member_id: &str) -> Self {
        ShareGroupMember {
            member_id: member_id.to_owned(),
            member_epoch: 0,
            previous_member_epoch: 0,
            rack_id: None,
            client_id: String::new(),
            client_host: String::new(),
            subscribed_topic_names: Vec::new(),
            assigned_partitions: Assignment::new(),
        }
    }

    pub(crate) fn metadata_value(&self) -> ShareGroupMemberMetadataValue {
        ShareGroupMemberMetadataValue {
            rack_id: self.rack_id.clone(),
            client_id: self.client_id.clone(),
            client_host: self.client_host.clone(),
            subscribed_topic_names: self.subscribed_topic_names.clone(),
        }
    }

    pub(crate) fn current_assignment_value(&self) -> ShareGroupCurrentMemberAssignmentValue {
        ShareGroupCurrentMemberAssignmentValue {
            member_epoch: self.member_epoch,
            previous_member_epoch: self.previous_member_epoch,
            state: 0,
            assigned_partitions: to_topic_partitions(&self.assigned_partitions),
        }
    }
}

/// Per topic id, its name and partitions: the sets of `ShareGroupStatePartitionMetadata`.
pub(crate) type TopicPartitionSets = BTreeMap<Uuid, (String, BTreeSet<i32>)>;

fn to_infos(sets: &TopicPartitionSets) -> Vec<ShareTopicPartitionsInfo> {
    sets.iter()
        .filter(|(_, (_, ps))| !ps.is_empty())
        .map(|(id, (name, ps))| ShareTopicPartitionsInfo {
            topic_id: *id,
            topic_name: name.clone(),
            partitions: ps.iter().copied().collect(),
        })
        .collect()
}

fn from_infos(infos: &[ShareTopicPartitionsInfo]) -> TopicPartitionSets {
    let mut out = TopicPartitionSets::new();
    for t in infos {
        out.entry(t.topic_id)
            .or_insert_with(|| (t.topic_name.clone(), BTreeSet::new()))
            .1
            .extend(t.partitions.iter().copied());
    }
    out
}

#[derive(Debug, Clone)]
pub struct ShareGroup {
    pub(crate) group_id: String,
    pub(crate) partition: i32,
    pub(crate) group_epoch: i32,
    pub(crate) metadata_hash: i64,
    pub(crate) assignment_epoch: i32,
    pub(crate) members: BTreeMap<String, ShareGroupMember>,
    pub(crate) target_assignment: BTreeMap<String, Assignment>,
    /// Partitions whose share-partition state the share coordinator has initialised: the
    /// only ones the assignor may hand out (a share-partition leader reads its start
    /// offset from that state).
    pub(crate) initialized: TopicPartitionSets,
    /// Partitions asked to be initialised and not confirmed yet.
    pub(crate) initializing: TopicPartitionSets,
    /// Topics whose state is being deleted (the group was deleted or stopped using them).
    pub(crate) deleting: BTreeMap<Uuid, String>,
    /// Not persisted: the topics changed since the group last looked, so the next
    /// heartbeat looks again.
    pub(crate) metadata_refresh: bool,
    /// Not persisted: the initializing partitions this coordinator has asked the broker
    /// to initialise; after a load it is empty, so the next heartbeat asks again.
    pub(crate) initialize_requested: BTreeSet<(Uuid, i32)>,
}

impl ShareGroup {
    pub(crate) fn new(group_id: &str, partition: i32) -> Self {
        ShareGroup {
            group_id: group_id.to_owned(),
            partition,
            group_epoch: 0,
            metadata_hash: 0,
            assignment_epoch: 0,
            members: BTreeMap::new(),
            target_assignment: BTreeMap::new(),
            initialized: TopicPartitionSets::new(),
            initializing: TopicPartitionSets::new(),
            deleting: BTreeMap::new(),
            metadata_refresh: true,
            initialize_requested: BTreeSet::new(),
        }
    }

    pub fn state(&self) -> ShareGroupState {
        if self.members.is_empty() {
            ShareGroupState::Empty
        } else {
            ShareGroupState::Stable
        }
    }

    pub(crate) fn target_of(&self, member_id: &str) -> Assignment {
        self.target_assignment
            .get(member_id)
            .cloned()
            .unwrap_or_default()
    }

    pub(crate) fn state_partition_metadata(&self) -> ShareGroupStatePartitionMetadataValue {
        ShareGroupStatePartitionMetadataValue {
            initializing_topics: to_infos(&self.initializing),
            initialized_topics: to_infos(&self.initialized),
            deleting_topics: self
                .deleting
                .iter()
                .map(|(id, name)| ShareTopicInfo {
                    topic_id: *id,
                    topic_name: name.clone(),
                })
                .collect(),
        }
    }

    /// The topic names the members subscribe to.
    pub(crate) fn subscribed_topic_names<'a>(
        members: impl Iterator<Item = &'a ShareGroupMember>,
    ) -> BTreeSet<String> {
        members
            .flat_map(|m| m.subscribed_topic_names.iter().cloned())
            .collect()
    }

    /// The group's metadata hash over `names` as they are in `topics` (Kafka 4.2's
    /// `MetadataHash`): FNV-1a over each existing topic's name, id and partition count, in
    /// name order. Only ever compared with a hash made here, so it need not be Kafka's
    /// Murmur3 value; 0 when no subscribed topic exists, as Kafka's.
    pub(crate) fn compute_metadata_hash(names: &BTreeSet<String>, topics: &TopicsImage) -> i64 {
        const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
        const PRIME: u64 = 0x0000_0100_0000_01b3;
        let mut any = false;
        let mut h = OFFSET;
        let mut eat = |bytes: &[u8]| {
            for b in bytes {
                h ^= u64::from(*b);
                h = h.wrapping_mul(PRIME);
            }
        };
        for t in names.iter().filter_map(|n| topics.topic(n)) {
            any = true;
            eat(t.name.as_bytes());
            eat(&[0]);
            eat(&t.id.0);
            eat(&t.num_partitions.to_be_bytes());
        }
        if any {
            i64::from_be_bytes(h.to_be_bytes())
        } else {
            0
        }
    }

    fn update_member(&mut self, member: ShareGroupMember) {
        self.members.insert(member.member_id.clone(), member);
    }

    /// Applies one of the group's records (Kafka's `GroupMetadataManager.replay` for the
    /// share group record types). Returns false for a tombstone of the whole group
    /// (`ShareGroupMetadata` with no value): the caller forgets the group.
    pub(crate) fn replay(&mut self, record: &ShareGroupRecord) -> bool {
        match record {
            ShareGroupRecord::Metadata { value, .. } => match value {
                Some(v) => {
                    self.group_epoch = v.epoch;
                    self.metadata_hash = v.metadata_hash;
                }
                None => return false,
            },
            ShareGroupRecord::MemberMetadata {
                member_id, value, ..
            } => match value {
                Some(v) => {
                    let mut m = self
                        .members
                        .get(member_id)
                        .cloned()
                        .unwrap_or_else(|| ShareGroupMember::new(member_id));
                    m.rack_id = v.rack_id.clone();
                    m.client_id = v.client_id.clone();
                    m.client_host = v.client_host.clone();
                    m.subscribed_topic_names = v.subscribed_topic_names.clone();
                    self.update_member(m);
                }
                None => {
                    self.members.remove(member_id);
                }
            },
            ShareGroupRecord::TargetAssignmentMetadata { value, .. } => {
                self.assignment_epoch = value.as_ref().map_or(-1, |v| v.assignment_epoch);
            }
            ShareGroupRecord::TargetAssignmentMember {
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
            ShareGroupRecord::CurrentMemberAssignment {
                member_id, value, ..
            } => match value {
                Some(v) => {
                    let mut m = self
                        .members
                        .get(member_id)
                        .cloned()
                        .unwrap_or_else(|| ShareGroupMember::new(member_id));
                    m.member_epoch = v.member_epoch;
                    m.previous_member_epoch = v.previous_member_epoch;
                    m.assigned_partitions = from_topic_partitions(&v.assigned_partitions);
                    self.update_member(m);
                }
                None => {
                    if let Some(m) = self.members.get_mut(member_id) {
                        m.member_epoch = LEAVE_GROUP_MEMBER_EPOCH;
                        m.previous_member_epoch = LEAVE_GROUP_MEMBER_EPOCH;
                        m.assigned_partitions.clear();
                    }
                }
            },
            ShareGroupRecord::StatePartitionMetadata { value, .. } => {
                let v = value.clone().unwrap_or_default();
                self.initializing = from_infos(&v.initializing_topics);
                self.initialized = from_infos(&v.initialized_topics);
                self.deleting = v
                    .deleting_topics
                    .iter()
                    .map(|t| (t.topic_id, t.topic_name.clone()))
                    .collect();
            }
        }
        true
    }

    /// Tombstones for every record of the group (Kafka's `createGroupTombstoneRecords`),
    /// in the order that replays cleanly: members' assignments, targets, the target's
    /// epoch, subscriptions, the state metadata, the epoch.
    pub(crate) fn tombstones(&self) -> Vec<ShareGroupRecord> {
        let g = || self.group_id.clone();
        let mut out = Vec::new();
        for id in self.members.keys() {
            out.extend(member_tombstones(&self.group_id, id));
        }
        out.push(ShareGroupRecord::TargetAssignmentMetadata {
            group_id: g(),
            value: None,
        });
        out.push(ShareGroupRecord::StatePartitionMetadata {
            group_id: g(),
            value: None,
        });
        out.push(ShareGroupRecord::Metadata {
            group_id: g(),
            value: None,
        });
        out
    }
}

/// The tombstones that remove one member: its current assignment, target and subscription.
pub(crate) fn member_tombstones(group_id: &str, member_id: &str) -> Vec<ShareGroupRecord> {
    vec![
        ShareGroupRecord::CurrentMemberAssignment {
            group_id: group_id.to_owned(),
            member_id: member_id.to_owned(),
            value: None,
        },
        ShareGroupRecord::TargetAssignmentMember {
            group_id: group_id.to_owned(),
            member_id: member_id.to_owned(),
            value: None,
        },
        ShareGroupRecord::MemberMetadata {
            group_id: group_id.to_owned(),
            member_id: member_id.to_owned(),
            value: None,
        },
    ]
}
