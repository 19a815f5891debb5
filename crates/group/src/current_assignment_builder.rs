//! A member's reconciliation towards the target assignment (Kafka's
//! `CurrentAssignmentBuilder`, KIP-848's "member reconciliation").
//!
//! # Design note
//!
//! 1. A Stable member whose epoch is behind the target's computes its next assignment:
//!    it keeps `assigned ∩ target`, must revoke `assigned − target`, and may get
//!    `target − assigned` except the partitions another member still owns (their
//!    partition epoch is set: assigned to, or pending revocation by, someone else).
//! 2. With partitions to revoke (and the member still reporting any of them as owned) it
//!    stays at its epoch in UnrevokedPartitions, owning only what it keeps; it gets
//!    nothing new.
//! 3. Otherwise it moves to the target epoch with `kept + free new partitions`: Stable,
//!    or UnreleasedPartitions while some of its target is still held by others.
//! 4. An UnrevokedPartitions member moves on (to epoch + 1, then as in step 1) once its
//!    heartbeat no longer lists any partition pending revocation; an
//!    UnreleasedPartitions member is recomputed on each heartbeat and picks up the
//!    partitions released meanwhile.
//!
//! Why it is correct: a partition is added to a member only when no other member holds
//! it (step 1's exclusion reads the partition epochs, which cover assigned and pending
//! revocation partitions of every member), and a member gives a partition up (it leaves
//! its pending revocation) only after the member's own heartbeat stopped listing it. So a
//! partition never has two owners, and a move waits for the old owner's revocation.

use std::collections::BTreeSet;

use rill_protocol::Uuid;

use crate::consumer_group_member::{ConsumerGroupMember, MemberState};
use crate::consumer_group_record::{Assignment, TopicPartitions};

/// Why a member cannot be reconciled: it must give up everything and join again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberFenced;

/// The member's next state towards `target` (at `target_epoch`); `partition_epoch`
/// tells the epoch of a partition's current owner or -1 when it is free; `owned` is what
/// the member's heartbeat says it owns (`None`: not said in this heartbeat).
pub fn next_member_state(
    member: &ConsumerGroupMember,
    target_epoch: i32,
    target: &Assignment,
    partition_epoch: &dyn Fn(&Uuid, i32) -> i32,
    owned: Option<&[TopicPartitions]>,
) -> Result<ConsumerGroupMember, MemberFenced> {
    match member.state {
        MemberState::Stable => {
            if member.member_epoch != target_epoch {
                Ok(compute_next(
                    member,
                    member.member_epoch,
                    target_epoch,
                    target,
                    partition_epoch,
                    owned,
                ))
            } else {
                Ok(member.clone())
            }
        }
        MemberState::UnrevokedPartitions => {
            if owns_any(owned, &member.partitions_pending_revocation) {
                return Ok(member.clone());
            }
            Ok(compute_next(
                member,
                member.member_epoch.saturating_add(1),
                target_epoch,
                target,
                partition_epoch,
                owned,
            ))
        }
        MemberState::UnreleasedPartitions => Ok(compute_next(
            member,
            member.member_epoch,
            target_epoch,
            target,
            partition_epoch,
            owned,
        )),
        MemberState::Unknown => {
            // Only a newer coordinator's records lead here: start the member afresh,
            // once it has given up everything.
            if owned.is_none_or(|o| o.iter().any(|tp| !tp.partitions.is_empty())) {
                return Err(MemberFenced);
            }
            Ok(compute_next(
                member,
                target_epoch,
                target_epoch,
                target,
                partition_epoch,
                owned,
            ))
        }
    }
}

/// Whether the member's heartbeat lists any of `partitions` as owned; a heartbeat that
/// does not list its partitions counts as still owning them.
fn owns_any(owned: Option<&[TopicPartitions]>, partitions: &Assignment) -> bool {
    let Some(owned) = owned else {
        return true;
    };
    owned.iter().any(|tp| {
        partitions
            .get(&tp.topic_id)
            .is_some_and(|set| tp.partitions.iter().any(|p| set.contains(p)))
    })
}

fn compute_next(
    member: &ConsumerGroupMember,
    member_epoch: i32,
    target_epoch: i32,
    target: &Assignment,
    partition_epoch: &dyn Fn(&Uuid, i32) -> i32,
    owned: Option<&[TopicPartitions]>,
) -> ConsumerGroupMember {
    let mut has_unreleased = false;
    let mut assigned = Assignment::new();
    let mut pending_revocation = Assignment::new();
    let mut pending_assignment = Assignment::new();
    let empty = BTreeSet::new();
    let topics: BTreeSet<&Uuid> = target
        .keys()
        .chain(member.assigned_partitions.keys())
        .collect();
    for topic in topics {
        let target_set = target.get(topic).unwrap_or(&empty);
        let current = member.assigned_partitions.get(topic).unwrap_or(&empty);
        let kept: BTreeSet<i32> = current.intersection(target_set).copied().collect();
        let revoke: BTreeSet<i32> = current.difference(&kept).copied().collect();
        let mut new: BTreeSet<i32> = target_set.difference(&kept).copied().collect();
        let before = new.len();
        new.retain(|p| partition_epoch(topic, *p) == -1);
        has_unreleased |= new.len() != before;
        if !kept.is_empty() {
            assigned.insert(*topic, kept);
        }
        if !revoke.is_empty() {
            pending_revocation.insert(*topic, revoke);
        }
        if !new.is_empty() {
            pending_assignment.insert(*topic, new);
        }
    }
    let mut next = member.clone();
    if !pending_revocation.is_empty() && owns_any(owned, &pending_revocation) {
        next.state = MemberState::UnrevokedPartitions;
        next.update_member_epoch(member_epoch);
        next.assigned_partitions = assigned;
        next.partitions_pending_revocation = pending_revocation;
        return next;
    }
    for (topic, partitions) in pending_assignment.iter() {
        assigned
            .entry(*topic)
            .or_default()
            .extend(partitions.iter().copied());
    }
    next.state = if has_unreleased {
        MemberState::UnreleasedPartitions
    } else {
        MemberState::Stable
    };
    next.update_member_epoch(target_epoch);
    next.assigned_partitions = assigned;
    next.partitions_pending_revocation = Assignment::new();
    next
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn t(n: u8) -> Uuid {
        Uuid([n; 16])
    }

    fn asg(list: &[(u8, &[i32])]) -> Assignment {
        list.iter()
            .map(|(t_, ps)| (t(*t_), ps.iter().copied().collect()))
            .collect()
    }

    fn owned(list: &[(u8, &[i32])]) -> Vec<TopicPartitions> {
        list.iter()
            .map(|(t_, ps)| TopicPartitions {
                topic_id: t(*t_),
                partitions: ps.to_vec(),
            })
            .collect()
    }

    fn member(epoch: i32, assigned: Assignment) -> ConsumerGroupMember {
        ConsumerGroupMember {
            member_epoch: epoch,
            previous_member_epoch: epoch - 1,
            assigned_partitions: assigned,
            ..ConsumerGroupMember::new("m")
        }
    }

    #[test]
    fn stable_member_revokes_before_getting_new_partitions() {
        let m = member(10, asg(&[(1, &[0, 1, 2])]));
        let target = asg(&[(1, &[0, 1]), (2, &[0])]);
        let free = |_: &Uuid, _: i32| -1;
        let o = owned(&[(1, &[0, 1, 2])]);
        let next = next_member_state(&m, 11, &target, &free, Some(&o)).unwrap();
        assert_eq!(next.state, MemberState::UnrevokedPartitions);
        assert_eq!(next.member_epoch, 10);
        assert_eq!(next.assigned_partitions, asg(&[(1, &[0, 1])]));
        assert_eq!(next.partitions_pending_revocation, asg(&[(1, &[2])]));
        // Still owning partition 2: nothing moves.
        let again = next_member_state(&next, 11, &target, &free, Some(&o)).unwrap();
        assert_eq!(again, next);
        // Revoked: epoch 11 with the new partition.
        let o = owned(&[(1, &[0, 1])]);
        let done = next_member_state(&next, 11, &target, &free, Some(&o)).unwrap();
        assert_eq!(done.state, MemberState::Stable);
        assert_eq!((done.member_epoch, done.previous_member_epoch), (11, 10));
        assert_eq!(done.assigned_partitions, target);
        assert!(done.partitions_pending_revocation.is_empty());
    }

    #[test]
    fn partition_held_by_another_member_is_not_assigned_until_released() {
        let m = member(3, asg(&[]));
        let target = asg(&[(1, &[0, 1])]);
        let mut owners: BTreeMap<(Uuid, i32), i32> = BTreeMap::new();
        owners.insert((t(1), 1), 3);
        let held = |topic: &Uuid, p: i32| owners.get(&(*topic, p)).copied().unwrap_or(-1);
        let next = next_member_state(&m, 4, &target, &held, Some(&[])).unwrap();
        assert_eq!(next.state, MemberState::UnreleasedPartitions);
        assert_eq!(next.member_epoch, 4);
        assert_eq!(next.assigned_partitions, asg(&[(1, &[0])]));
        let free = |_: &Uuid, _: i32| -1;
        let next = next_member_state(&next, 4, &target, &free, None).unwrap();
        assert_eq!(next.state, MemberState::Stable);
        assert_eq!(next.assigned_partitions, target);
    }

    #[test]
    fn a_member_that_does_not_report_owned_partitions_still_owns_them() {
        let m = ConsumerGroupMember {
            state: MemberState::UnrevokedPartitions,
            partitions_pending_revocation: asg(&[(1, &[5])]),
            ..member(2, asg(&[]))
        };
        let free = |_: &Uuid, _: i32| -1;
        let next = next_member_state(&m, 3, &asg(&[]), &free, None).unwrap();
        assert_eq!(next, m);
    }
}
