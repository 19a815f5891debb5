//! Partition assignors and Kafka's embedded consumer protocol.
//!
//! In the classic group protocol the coordinator does not assign partitions: the group
//! leader does, with the assignor every member listed (`protocol_name` in the JoinGroup
//! response). Members describe themselves with a `ConsumerProtocolSubscription` and
//! receive a `ConsumerProtocolAssignment`, both written as an `int16` version followed by
//! the struct at that version — the format the Java client and librdkafka use, so a
//! group may mix them with Rill members as long as they share an assignor name.
//!
//! The assignors:
//! - `range`: per topic, members sorted by (group instance id or) member id each take a
//!   contiguous range; the first `partitions % members` take one more.
//! - `roundrobin`: all partitions sorted by topic and partition, dealt in turn to the
//!   sorted members that subscribe to the topic.
//! - `sticky`: balanced (member counts differ by at most one when subscriptions agree)
//!   while keeping each member's `owned_partitions` where the balance allows.
//! - `cooperative-sticky`: the sticky result, minus every partition that moves from a
//!   member still in the group to another member. The old owner revokes it and rejoins,
//!   and the next rebalance hands it over; nothing is revoked from anyone else (KIP-429).

use std::collections::{BTreeMap, BTreeSet};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use rill_protocol::generated::consumer_protocol_assignment::{
    self as cpa, ConsumerProtocolAssignment,
};
use rill_protocol::generated::consumer_protocol_subscription::{
    self as cps, ConsumerProtocolSubscription,
};
use rill_protocol::{Decodable, Encodable};

use crate::error::{Error, Result};
use crate::types::TopicPartition;

/// Highest embedded-protocol version this client reads.
const MAX_PROTOCOL_VERSION: i16 = 3;
/// Version written: 1 carries `owned_partitions`, which the sticky assignors need, and
/// every Kafka client since 2.4 reads it.
const SUBSCRIPTION_VERSION: i16 = 1;
const ASSIGNMENT_VERSION: i16 = 1;

/// One member's subscription, as the group leader sees it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MemberSubscription {
    pub member_id: String,
    pub group_instance_id: Option<String>,
    pub topics: Vec<String>,
    /// Partitions the member owns now (cooperative and sticky assignors).
    pub owned_partitions: Vec<TopicPartition>,
}

impl MemberSubscription {
    fn sort_key(&self) -> (&str, &str) {
        (
            self.group_instance_id.as_deref().unwrap_or(&self.member_id),
            &self.member_id,
        )
    }
}

/// Every member's subscription and the partition count of every subscribed topic.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GroupSubscription {
    pub members: Vec<MemberSubscription>,
    pub partitions_per_topic: BTreeMap<String, i32>,
}

/// A partition assignor, run by the group leader.
///
/// ```
/// use std::collections::BTreeMap;
/// use rill_client::{Assignor, GroupSubscription, MemberSubscription};
///
/// let members = (0..3)
///     .map(|i| MemberSubscription { member_id: format!("m{i}"), topics: vec!["t".into()], ..Default::default() })
///     .collect();
/// let group = GroupSubscription { members, partitions_per_topic: BTreeMap::from([("t".into(), 6)]) };
/// let assignment = Assignor::Range.assign(&group);
/// assert!(assignment.values().all(|ps| ps.len() == 2));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Assignor {
    Range,
    RoundRobin,
    Sticky,
    CooperativeSticky,
}

impl Assignor {
    /// The protocol name members announce (Kafka's `partition.assignment.strategy` names).
    pub fn name(self) -> &'static str {
        match self {
            Assignor::Range => "range",
            Assignor::RoundRobin => "roundrobin",
            Assignor::Sticky => "sticky",
            Assignor::CooperativeSticky => "cooperative-sticky",
        }
    }

    /// Whether members keep their partitions across a rebalance (revoking only what
    /// moves) instead of revoking everything before rejoining.
    pub fn is_cooperative(self) -> bool {
        self == Assignor::CooperativeSticky
    }

    /// Computes every member's partitions (members without any get an empty list).
    pub fn assign(self, group: &GroupSubscription) -> BTreeMap<String, Vec<TopicPartition>> {
        let mut out = match self {
            Assignor::Range => range(group),
            Assignor::RoundRobin => round_robin(group),
            Assignor::Sticky => sticky(group),
            Assignor::CooperativeSticky => cooperative(group),
        };
        for m in &group.members {
            out.entry(m.member_id.clone()).or_default().sort();
        }
        out
    }
}

impl std::str::FromStr for Assignor {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim() {
            "range" | "org.apache.kafka.clients.consumer.RangeAssignor" => Ok(Assignor::Range),
            "roundrobin" | "org.apache.kafka.clients.consumer.RoundRobinAssignor" => {
                Ok(Assignor::RoundRobin)
            }
            "sticky" | "org.apache.kafka.clients.consumer.StickyAssignor" => Ok(Assignor::Sticky),
            "cooperative-sticky"
            | "org.apache.kafka.clients.consumer.CooperativeStickyAssignor" => {
                Ok(Assignor::CooperativeSticky)
            }
            other => Err(Error::InvalidConfig(format!("unknown assignor {other}"))),
        }
    }
}

fn sorted_members(group: &GroupSubscription) -> Vec<&MemberSubscription> {
    let mut members: Vec<&MemberSubscription> = group.members.iter().collect();
    members.sort_by(|a, b| a.sort_key().cmp(&b.sort_key()));
    members
}

fn range(group: &GroupSubscription) -> BTreeMap<String, Vec<TopicPartition>> {
    let mut out: BTreeMap<String, Vec<TopicPartition>> = BTreeMap::new();
    let members = sorted_members(group);
    for (topic, &count) in &group.partitions_per_topic {
        let subscribers: Vec<&&MemberSubscription> = members
            .iter()
            .filter(|m| m.topics.contains(topic))
            .collect();
        if subscribers.is_empty() || count <= 0 {
            continue;
        }
        let n = subscribers.len() as i32;
        let per = count / n;
        let extra = count % n;
        for (i, m) in subscribers.iter().enumerate() {
            let i = i as i32;
            let start = per * i + i.min(extra);
            let len = per + i32::from(i < extra);
            let list = out.entry(m.member_id.clone()).or_default();
            list.extend((start..start + len).map(|p| TopicPartition::new(topic.clone(), p)));
        }
    }
    out
}

fn round_robin(group: &GroupSubscription) -> BTreeMap<String, Vec<TopicPartition>> {
    let mut out: BTreeMap<String, Vec<TopicPartition>> = BTreeMap::new();
    let members = sorted_members(group);
    if members.is_empty() {
        return out;
    }
    let mut next = 0usize;
    for (topic, &count) in &group.partitions_per_topic {
        for p in 0..count.max(0) {
            // The next member in the circle that subscribes to this topic.
            for step in 0..members.len() {
                let m = members[(next + step) % members.len()];
                if m.topics.contains(topic) {
                    out.entry(m.member_id.clone())
                        .or_default()
                        .push(TopicPartition::new(topic.clone(), p));
                    next = (next + step + 1) % members.len();
                    break;
                }
            }
        }
    }
    out
}

fn sticky(group: &GroupSubscription) -> BTreeMap<String, Vec<TopicPartition>> {
    let members = sorted_members(group);
    let mut out: BTreeMap<String, Vec<TopicPartition>> = members
        .iter()
        .map(|m| (m.member_id.clone(), Vec::new()))
        .collect();
    if members.is_empty() {
        return out;
    }
    let all: BTreeSet<TopicPartition> = group
        .partitions_per_topic
        .iter()
        .filter(|(t, _)| members.iter().any(|m| m.topics.contains(t)))
        .flat_map(|(t, &n)| (0..n.max(0)).map(move |p| TopicPartition::new(t.clone(), p)))
        .collect();
    let total = all.len();
    let floor = total / members.len();
    let mut ceil_slots = total % members.len();
    let mut taken: BTreeSet<TopicPartition> = BTreeSet::new();
    // 1. Keep owned partitions that are still valid, up to the member's quota. Members
    //    owning the most go first, so that they are the ones allowed the extra partition.
    let mut by_owned: Vec<&&MemberSubscription> = members.iter().collect();
    by_owned.sort_by_key(|m| std::cmp::Reverse(m.owned_partitions.len()));
    for m in by_owned {
        let mut keep: Vec<TopicPartition> = m
            .owned_partitions
            .iter()
            .filter(|tp| m.topics.contains(&tp.topic) && all.contains(tp) && !taken.contains(*tp))
            .cloned()
            .collect();
        keep.sort();
        keep.dedup();
        let quota = if keep.len() > floor && ceil_slots > 0 {
            ceil_slots -= 1;
            floor + 1
        } else {
            floor
        };
        keep.truncate(quota);
        for tp in &keep {
            taken.insert(tp.clone());
        }
        if let Some(list) = out.get_mut(&m.member_id) {
            list.extend(keep);
        }
    }
    // 2. Hand out the rest, each to the least-loaded member subscribed to its topic.
    for tp in all.iter().filter(|tp| !taken.contains(*tp)) {
        let best = members
            .iter()
            .filter(|m| m.topics.contains(&tp.topic))
            .min_by_key(|m| out.get(&m.member_id).map_or(0, Vec::len));
        if let Some(m) = best {
            if let Some(list) = out.get_mut(&m.member_id) {
                list.push(tp.clone());
            }
        }
    }
    out
}

fn cooperative(group: &GroupSubscription) -> BTreeMap<String, Vec<TopicPartition>> {
    let mut out = sticky(group);
    let mut owner: BTreeMap<&TopicPartition, &str> = BTreeMap::new();
    for m in &group.members {
        for tp in &m.owned_partitions {
            owner.entry(tp).or_insert(&m.member_id);
        }
    }
    for (member, list) in out.iter_mut() {
        list.retain(|tp| owner.get(tp).is_none_or(|o| *o == member.as_str()));
    }
    out
}

/// Writes a subscription in the embedded consumer protocol.
pub(crate) fn encode_subscription(topics: &[String], owned: &[TopicPartition]) -> Result<Bytes> {
    let sub = ConsumerProtocolSubscription {
        topics: topics.to_vec(),
        user_data: None,
        owned_partitions: group_by_topic(owned)
            .into_iter()
            .map(|(topic, partitions)| cps::TopicPartition { topic, partitions })
            .collect(),
        ..Default::default()
    };
    let mut buf = BytesMut::new();
    buf.put_i16(SUBSCRIPTION_VERSION);
    sub.encode(&mut buf, SUBSCRIPTION_VERSION)?;
    Ok(buf.freeze())
}

/// Reads a member's subscription (any version; newer ones are read as the newest known,
/// since the format only ever appends fields).
pub(crate) fn decode_subscription(
    member_id: &str,
    group_instance_id: Option<String>,
    bytes: &Bytes,
) -> Result<MemberSubscription> {
    let (version, mut body) = split_version(bytes)?;
    let sub = ConsumerProtocolSubscription::decode(&mut body, version)
        .map_err(|e| Error::ConsumerProtocol(format!("subscription of {member_id}: {e}")))?;
    Ok(MemberSubscription {
        member_id: member_id.to_string(),
        group_instance_id,
        topics: sub.topics,
        owned_partitions: sub
            .owned_partitions
            .into_iter()
            .flat_map(|t| {
                let topic = t.topic;
                t.partitions
                    .into_iter()
                    .map(move |p| TopicPartition::new(topic.clone(), p))
            })
            .collect(),
    })
}

/// Writes an assignment in the embedded consumer protocol.
pub(crate) fn encode_assignment(partitions: &[TopicPartition]) -> Result<Bytes> {
    let assignment = ConsumerProtocolAssignment {
        assigned_partitions: group_by_topic(partitions)
            .into_iter()
            .map(|(topic, partitions)| cpa::TopicPartition { topic, partitions })
            .collect(),
        user_data: None,
    };
    let mut buf = BytesMut::new();
    buf.put_i16(ASSIGNMENT_VERSION);
    assignment.encode(&mut buf, ASSIGNMENT_VERSION)?;
    Ok(buf.freeze())
}

/// Reads an assignment; empty bytes (a member the leader gave nothing) is no partitions.
pub(crate) fn decode_assignment(bytes: &Bytes) -> Result<Vec<TopicPartition>> {
    if bytes.is_empty() {
        return Ok(Vec::new());
    }
    let (version, mut body) = split_version(bytes)?;
    let a = ConsumerProtocolAssignment::decode(&mut body, version)
        .map_err(|e| Error::ConsumerProtocol(format!("assignment: {e}")))?;
    let mut out: Vec<TopicPartition> = a
        .assigned_partitions
        .into_iter()
        .flat_map(|t| {
            let topic = t.topic;
            t.partitions
                .into_iter()
                .map(move |p| TopicPartition::new(topic.clone(), p))
        })
        .collect();
    out.sort();
    Ok(out)
}

fn split_version(bytes: &Bytes) -> Result<(i16, Bytes)> {
    if bytes.len() < 2 {
        return Err(Error::ConsumerProtocol("missing version".into()));
    }
    let mut body = bytes.clone();
    let version = body.get_i16();
    if version < 0 {
        return Err(Error::ConsumerProtocol(format!(
            "negative version {version}"
        )));
    }
    Ok((version.min(MAX_PROTOCOL_VERSION), body))
}

fn group_by_topic(partitions: &[TopicPartition]) -> BTreeMap<String, Vec<i32>> {
    let mut out: BTreeMap<String, Vec<i32>> = BTreeMap::new();
    for tp in partitions {
        out.entry(tp.topic.clone()).or_default().push(tp.partition);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    type Member<'a> = (&'a str, &'a [&'a str], &'a [(&'a str, i32)]);

    fn group(members: &[Member<'_>], topics: &[(&str, i32)]) -> GroupSubscription {
        GroupSubscription {
            members: members
                .iter()
                .map(|(id, ts, owned)| MemberSubscription {
                    member_id: id.to_string(),
                    group_instance_id: None,
                    topics: ts.iter().map(|t| t.to_string()).collect(),
                    owned_partitions: owned
                        .iter()
                        .map(|(t, p)| TopicPartition::new(*t, *p))
                        .collect(),
                })
                .collect(),
            partitions_per_topic: topics.iter().map(|(t, n)| (t.to_string(), *n)).collect(),
        }
    }

    fn check_complete(g: &GroupSubscription, a: &BTreeMap<String, Vec<TopicPartition>>) {
        let mut seen = BTreeSet::new();
        for list in a.values() {
            for tp in list {
                assert!(seen.insert(tp.clone()), "{tp} assigned twice");
            }
        }
        let total: i32 = g.partitions_per_topic.values().sum();
        assert_eq!(seen.len() as i32, total);
    }

    #[test]
    fn range_gives_contiguous_ranges_with_extras_first() {
        let g = group(&[("a", &["t"], &[]), ("b", &["t"], &[])], &[("t", 5)]);
        let a = Assignor::Range.assign(&g);
        assert_eq!(
            a["a"].iter().map(|tp| tp.partition).collect::<Vec<_>>(),
            vec![0, 1, 2]
        );
        assert_eq!(
            a["b"].iter().map(|tp| tp.partition).collect::<Vec<_>>(),
            vec![3, 4]
        );
    }

    #[test]
    fn roundrobin_deals_in_turn() {
        let g = group(
            &[("a", &["t", "u"], &[]), ("b", &["t", "u"], &[])],
            &[("t", 3), ("u", 1)],
        );
        let a = Assignor::RoundRobin.assign(&g);
        check_complete(&g, &a);
        assert_eq!(
            a["a"],
            vec![TopicPartition::new("t", 0), TopicPartition::new("t", 2)]
        );
        assert_eq!(
            a["b"],
            vec![TopicPartition::new("t", 1), TopicPartition::new("u", 0)]
        );
    }

    #[test]
    fn every_assignor_balances_six_partitions_over_three() {
        for assignor in [
            Assignor::Range,
            Assignor::RoundRobin,
            Assignor::Sticky,
            Assignor::CooperativeSticky,
        ] {
            let g = group(
                &[("a", &["t"], &[]), ("b", &["t"], &[]), ("c", &["t"], &[])],
                &[("t", 6)],
            );
            let a = assignor.assign(&g);
            check_complete(&g, &a);
            assert!(a.values().all(|l| l.len() == 2), "{assignor:?}: {a:?}");
        }
    }

    #[test]
    fn sticky_keeps_owned_partitions_when_a_member_joins() {
        let owned_a: &[(&str, i32)] = &[("t", 0), ("t", 1), ("t", 2)];
        let owned_b: &[(&str, i32)] = &[("t", 3), ("t", 4), ("t", 5)];
        let g = group(
            &[
                ("a", &["t"], owned_a),
                ("b", &["t"], owned_b),
                ("c", &["t"], &[]),
            ],
            &[("t", 6)],
        );
        let a = Assignor::Sticky.assign(&g);
        check_complete(&g, &a);
        assert_eq!(a["a"].len(), 2);
        assert!(a["a"].iter().all(|tp| tp.partition < 3));
        assert!(a["b"].iter().all(|tp| tp.partition >= 3));
    }

    #[test]
    fn cooperative_withholds_partitions_that_move() {
        let owned_a: &[(&str, i32)] = &[("t", 0), ("t", 1), ("t", 2), ("t", 3)];
        let g = group(&[("a", &["t"], owned_a), ("b", &["t"], &[])], &[("t", 4)]);
        let a = Assignor::CooperativeSticky.assign(&g);
        assert_eq!(a["a"].len(), 2);
        assert!(
            a["b"].is_empty(),
            "moving partitions wait for the next round"
        );
        // Next round: a owns only its two.
        let owned_a: &[(&str, i32)] = &[("t", 0), ("t", 1)];
        let g = group(&[("a", &["t"], owned_a), ("b", &["t"], &[])], &[("t", 4)]);
        let a = Assignor::CooperativeSticky.assign(&g);
        check_complete(&g, &a);
        assert_eq!(a["b"].len(), 2);
    }

    #[test]
    fn embedded_protocol_round_trips() {
        let owned = vec![TopicPartition::new("t", 1)];
        let bytes = encode_subscription(&["t".into(), "u".into()], &owned).unwrap();
        assert_eq!(&bytes[..2], &[0, 1]);
        let sub = decode_subscription("m", None, &bytes).unwrap();
        assert_eq!(sub.topics, vec!["t", "u"]);
        assert_eq!(sub.owned_partitions, owned);
        let parts = vec![TopicPartition::new("t", 0), TopicPartition::new("u", 3)];
        assert_eq!(
            decode_assignment(&encode_assignment(&parts).unwrap()).unwrap(),
            parts
        );
        assert!(decode_assignment(&Bytes::new()).unwrap().is_empty());
        assert!(decode_assignment(&Bytes::from_static(&[0xff, 0xff])).is_err());
    }

    /// A version 0 subscription as the Java client wrote it before 2.4 (and librdkafka
    /// still may): topics and null user data, nothing after.
    #[test]
    fn reads_version_zero() {
        let bytes = Bytes::from_static(&[0, 0, 0, 0, 0, 1, 0, 1, b't', 0xff, 0xff, 0xff, 0xff]);
        let sub = decode_subscription("m", None, &bytes).unwrap();
        assert_eq!(sub.topics, vec!["t"]);
        assert!(sub.owned_partitions.is_empty());
    }
}
