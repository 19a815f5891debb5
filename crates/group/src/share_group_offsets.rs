//! The share group's side of KIP-932's administration of share-partition state:
//! AlterShareGroupOffsets, DeleteShareGroupOffsets, DeleteGroups of a share group, and
//! what DescribeShareGroupOffsets needs of the group (its initialised partitions). Kafka
//! 4.2's `GroupMetadataManager` and `GroupCoordinatorShard` (`alterShareGroupOffsets`,
//! `initiateDeleteShareGroupOffsets`, `sharePartitionDeleteRequests`, ...).
//!
//! # Design note
//!
//! The state itself is the share coordinator's; this coordinator only keeps which
//! share-partitions of a group are initialising, initialised or being deleted
//! (`ShareGroupStatePartitionMetadata`). Each operation is therefore two or three steps,
//! the broker calling the share coordinator in between:
//!
//! 1. A write here decides and marks: altered partitions become initializing (those
//!    initialised already stay so, as in Kafka: their old state stands until the new one
//!    replaces it, and a failed alter leaves it), deleted topics move from initialized to
//!    deleting. Only an empty group may be changed (NON_EMPTY_GROUP): its share-partition
//!    leaders hold no members' acquisitions that a new state would contradict.
//! 2. Once that mark is replicated the answer hands the broker the share-partitions to
//!    initialise (with their start offsets, under the group epoch as state epoch) or to
//!    delete.
//! 3. The broker reports the outcome: [`GroupCoordinator::share_group_state_initialized`]
//!    (or [`GroupCoordinator::share_group_state_initialize_failed`]),
//!    [`GroupCoordinator::complete_delete_share_group_offsets`], or, for DeleteGroups, the
//!    ordinary DeleteGroups that writes the group's tombstones.
//!
//! Why it is correct: a partition is assignable only while it is initialised; a delete
//! takes it out of that set before the share coordinator's state goes, so no member is
//! sent to a share-partition without state, and an alter replaces one state by another.
//! A broker that dies between the steps leaves the marks: partitions only initializing
//! are asked for again by the next heartbeat (one initialised too is not: asking with no
//! start offset would reset the state an alter failed to replace), and deleting topics
//! are deleted again by the next DeleteGroups (the share coordinator's delete is
//! idempotent).

use std::collections::{BTreeMap, BTreeSet};

use rill_protocol::Uuid;

use crate::api::*;
use crate::coordinator::{Effects, GroupCoordinator};
use crate::error::error_code;
use crate::record::Record;
use crate::share_group::{ShareGroup, TopicPartitionSets};
use crate::share_group_record::ShareGroupRecord;

fn not_share_group(c: &GroupCoordinator, group_id: &str) -> (i16, String) {
    let message = if c.groups.contains_key(group_id) || c.consumer_groups.contains_key(group_id) {
        format!("Group {group_id} is not a share group.")
    } else {
        format!("Group {group_id} not found.")
    };
    (error_code::GROUP_ID_NOT_FOUND, message)
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
    /// The empty share group `group_id`, or why it cannot be changed (step 1).
    fn alterable_share_group(&self, group_id: &str) -> Result<&ShareGroup, (i16, String)> {
        if let Some(code) = self.coordinator_error(group_id) {
            return Err((code, String::new()));
        }
        let Some(g) = self.share_groups.get(group_id) else {
            return Err(not_share_group(self, group_id));
        };
        if !g.members.is_empty() {
            return Err((
                error_code::NON_EMPTY_GROUP,
                format!("Group {group_id} is not empty."),
            ));
        }
        Ok(g)
    }

    /// Writes `next`'s partition metadata (and replays it) and answers `response` once it
    /// is replicated.
    fn write_state_partition_metadata(
        &mut self,
        next: &ShareGroup,
        responder: Option<(ResponderId, Response)>,
    ) -> Vec<Output> {
        let record = ShareGroupRecord::StatePartitionMetadata {
            group_id: next.group_id.clone(),
            value: Some(next.state_partition_metadata()),
        };
        let partition = next.partition;
        self.replay_share_group_record(partition, &record);
        let mut fx = Effects::default();
        fx.record(partition, Record::ShareGroup(record));
        if let Some((id, response)) = responder {
            fx.respond(id, response);
        }
        self.finish(fx)
    }

    /// AlterShareGroupOffsets, step 1: the existing partitions named become initializing,
    /// and the answer (once that is written) lists them with their start offsets for the
    /// broker to initialise. A topic or partition that does not exist is
    /// UNKNOWN_TOPIC_OR_PARTITION; a group that is not an empty share group is refused as
    /// a whole.
    pub fn handle_alter_share_group_offsets(
        &mut self,
        req: AlterShareGroupOffsetsRequest,
        responder: ResponderId,
    ) -> Vec<Output> {
        let refused = |code: i16, message: String| {
            vec![Output::Respond(Respond {
                responder,
                response: Response::AlterShareGroupOffsets(AlterShareGroupOffsetsPlan {
                    error_code: code,
                    error_message: (!message.is_empty()).then_some(message),
                    group_epoch: 0,
                    topics: Vec::new(),
                    initialize: Vec::new(),
                }),
            })]
        };
        let group = match self.alterable_share_group(&req.group_id) {
            Ok(g) => g.clone(),
            Err((code, message)) => return refused(code, message),
        };
        let mut topics = Vec::with_capacity(req.topics.len());
        let mut initialize: Vec<ShareTopicStartOffsets> = Vec::new();
        let mut next = group.clone();
        for (name, partitions) in req.topics {
            let Some(t) = self.topics.topic(&name) else {
                topics.push(AlteredShareTopic {
                    topic_name: name,
                    topic_id: None,
                    partitions: partitions
                        .iter()
                        .map(|(p, _)| (*p, error_code::UNKNOWN_TOPIC_OR_PARTITION))
                        .collect(),
                });
                continue;
            };
            let mut answers = Vec::with_capacity(partitions.len());
            let mut offsets: BTreeMap<i32, i64> = BTreeMap::new();
            for (p, start_offset) in partitions {
                if (0..t.num_partitions).contains(&p) {
                    answers.push((p, error_code::NONE));
                    offsets.insert(p, start_offset);
                } else {
                    answers.push((p, error_code::UNKNOWN_TOPIC_OR_PARTITION));
                }
            }
            if !offsets.is_empty() {
                next.initializing
                    .entry(t.id)
                    .or_insert_with(|| (t.name.clone(), BTreeSet::new()))
                    .1
                    .extend(offsets.keys().copied());
                // A topic initialised again is no longer being deleted (Kafka does the
                // same in `addInitializingTopicsRecords`).
                next.deleting.remove(&t.id);
                initialize.push(ShareTopicStartOffsets {
                    topic_id: t.id,
                    topic_name: t.name.clone(),
                    partitions: offsets.into_iter().collect(),
                });
            }
            topics.push(AlteredShareTopic {
                topic_name: name,
                topic_id: Some(t.id),
                partitions: answers,
            });
        }
        let plan = AlterShareGroupOffsetsPlan {
            error_code: error_code::NONE,
            error_message: None,
            group_epoch: group.group_epoch,
            topics,
            initialize,
        };
        if plan.initialize.is_empty() {
            return vec![Output::Respond(Respond {
                responder,
                response: Response::AlterShareGroupOffsets(plan),
            })];
        }
        // These are asked for by this request: a heartbeat must not ask again meanwhile.
        if let Some(live) = self.share_groups.get_mut(&req.group_id) {
            for t in &plan.initialize {
                for (p, _) in &t.partitions {
                    live.initialize_requested.insert((t.topic_id, *p));
                }
            }
        }
        self.write_state_partition_metadata(
            &next,
            Some((responder, Response::AlterShareGroupOffsets(plan))),
        )
    }

    /// The share coordinator could not initialise these partitions (asked for by an
    /// [`Output::InitializeShareGroupState`] or an AlterShareGroupOffsets): they stay
    /// initializing and unassigned, and the group's next heartbeat asks for them again.
    pub fn share_group_state_initialize_failed(
        &mut self,
        group_id: &str,
        topics: &[ShareTopicPartitions],
    ) {
        if let Some(g) = self.share_groups.get_mut(group_id) {
            for t in topics {
                for p in &t.partitions {
                    g.initialize_requested.remove(&(t.topic_id, *p));
                }
            }
        }
    }

    /// DeleteShareGroupOffsets, step 1: the named topics' initialised partitions are
    /// marked deleting and handed to the broker to delete; a topic that does not exist,
    /// or of which the group has no state, is UNKNOWN_TOPIC_OR_PARTITION. A topic already
    /// deleting (a delete that did not finish) is deleted again, all its partitions.
    pub fn handle_delete_share_group_offsets(
        &mut self,
        req: DeleteShareGroupOffsetsRequest,
        responder: ResponderId,
    ) -> Vec<Output> {
        let respond = |plan: DeleteShareGroupOffsetsPlan| {
            vec![Output::Respond(Respond {
                responder,
                response: Response::DeleteShareGroupOffsets(plan),
            })]
        };
        let group = match self.alterable_share_group(&req.group_id) {
            Ok(g) => g.clone(),
            Err((code, message)) => {
                return respond(DeleteShareGroupOffsetsPlan {
                    error_code: code,
                    error_message: (!message.is_empty()).then_some(message),
                    errors: Vec::new(),
                    delete: Vec::new(),
                })
            }
        };
        let mut next = group.clone();
        let mut errors = Vec::new();
        let mut delete = Vec::new();
        for name in req.topic_names {
            let unknown = |message: &str| DeletedShareTopic {
                topic_name: name.clone(),
                topic_id: Uuid::ZERO,
                error_code: error_code::UNKNOWN_TOPIC_OR_PARTITION,
                error_message: Some(message.to_owned()),
            };
            let Some(t) = self.topics.topic(&name) else {
                errors.push(unknown("This server does not host this topic-partition."));
                continue;
            };
            if let Some((_, ps)) = next.initialized.remove(&t.id) {
                delete.push(ShareTopicPartitions {
                    topic_id: t.id,
                    topic_name: t.name.clone(),
                    partitions: ps.into_iter().collect(),
                });
                next.deleting.insert(t.id, t.name.clone());
            } else if next.deleting.contains_key(&t.id) {
                delete.push(ShareTopicPartitions {
                    topic_id: t.id,
                    topic_name: t.name.clone(),
                    partitions: (0..t.num_partitions.max(0)).collect(),
                });
            } else {
                errors.push(unknown("There is no offset information to delete."));
            }
        }
        let plan = DeleteShareGroupOffsetsPlan {
            error_code: error_code::NONE,
            error_message: None,
            errors,
            delete,
        };
        if next.initialized == group.initialized && next.deleting == group.deleting {
            return respond(plan);
        }
        self.write_state_partition_metadata(
            &next,
            Some((responder, Response::DeleteShareGroupOffsets(plan))),
        )
    }

    /// DeleteShareGroupOffsets, step 3: the share coordinator deleted these topics'
    /// state, so they are no longer deleting. Returns the write (no answer waits on it).
    pub fn complete_delete_share_group_offsets(
        &mut self,
        group_id: &str,
        topic_ids: &[Uuid],
    ) -> Vec<Output> {
        if self.coordinator_error(group_id).is_some() {
            return Vec::new();
        }
        let Some(g) = self.share_groups.get(group_id) else {
            return Vec::new();
        };
        let mut next = g.clone();
        for id in topic_ids {
            next.deleting.remove(id);
        }
        if next.deleting == g.deleting {
            return Vec::new();
        }
        self.write_state_partition_metadata(&next, None)
    }

    /// DeleteGroups of share groups, step 1 (Kafka's `sharePartitionDeleteRequests`): for
    /// each of `group_ids` that is a share group, NON_EMPTY_GROUP while it has members,
    /// else every share-partition it has state for (initialised, initialising, or left
    /// deleting by an earlier attempt), which are marked deleting. Ids of other groups
    /// are left out: the ordinary DeleteGroups answers them.
    pub fn handle_share_groups_delete_start(
        &mut self,
        group_ids: Vec<String>,
        responder: ResponderId,
    ) -> Vec<Output> {
        let mut fx = Effects::default();
        let mut answers = Vec::new();
        for group_id in group_ids {
            if let Some(code) = self.coordinator_error(&group_id) {
                answers.push(ShareGroupStateDeletion {
                    group_id,
                    error_code: code,
                    topics: Vec::new(),
                });
                continue;
            }
            let Some(g) = self.share_groups.get(&group_id) else {
                continue;
            };
            if !g.members.is_empty() {
                answers.push(ShareGroupStateDeletion {
                    group_id,
                    error_code: error_code::NON_EMPTY_GROUP,
                    topics: Vec::new(),
                });
                continue;
            }
            let mut candidates = g.initialized.clone();
            for (id, (name, ps)) in &g.initializing {
                candidates
                    .entry(*id)
                    .or_insert_with(|| (name.clone(), BTreeSet::new()))
                    .1
                    .extend(ps.iter().copied());
            }
            for (id, name) in &g.deleting {
                // A topic gone from the cluster has had its state deleted with it.
                if let Some(t) = self.topics.topic(name).filter(|t| t.id == *id) {
                    candidates
                        .entry(*id)
                        .or_insert_with(|| (name.clone(), BTreeSet::new()))
                        .1
                        .extend(0..t.num_partitions.max(0));
                }
            }
            let topics = to_share_topics(&candidates);
            if !topics.is_empty() {
                let mut next = g.clone();
                next.initialized.clear();
                next.initializing.clear();
                next.deleting = candidates
                    .iter()
                    .map(|(id, (name, _))| (*id, name.clone()))
                    .collect();
                let record = ShareGroupRecord::StatePartitionMetadata {
                    group_id: group_id.clone(),
                    value: Some(next.state_partition_metadata()),
                };
                let partition = next.partition;
                self.replay_share_group_record(partition, &record);
                fx.record(partition, Record::ShareGroup(record));
            }
            answers.push(ShareGroupStateDeletion {
                group_id,
                error_code: error_code::NONE,
                topics,
            });
        }
        fx.respond(responder, Response::ShareGroupStateDeletions(answers));
        self.finish(fx)
    }

    /// The share-partitions of `group_id` whose state is initialised, as of the high
    /// watermark (DescribeShareGroupOffsets of all the group's topics); empty for a group
    /// this node does not know, the coordinator's error when it does not serve the group.
    pub fn initialized_share_partitions(
        &self,
        group_id: &str,
    ) -> Result<Vec<ShareTopicPartitions>, i16> {
        if let Some(code) = self.coordinator_error(group_id) {
            return Err(code);
        }
        Ok(self
            .committed_consumer
            .share_group(group_id)
            .map(|g| to_share_topics(&g.initialized))
            .unwrap_or_default())
    }
}
