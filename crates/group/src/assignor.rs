//! The server-side assignors of consumer groups (KIP-848): `uniform` (Kafka's
//! `UniformAssignor`, the default) and `range` (Kafka's `RangeAssignor`), chosen with the
//! broker's `group.consumer.assignors` (the first is the default) and by the members'
//! `group.remote.assignor`.
//!
//! Share groups (KIP-932) have one assignor, `simple` (Kafka's `SimpleAssignor`),
//! [`simple_assign`]; see its design note below.
//!
//! All are written here rather than taken from a crate: no crate implements Kafka's
//! assignors, and they are pure functions of the members' subscriptions, the topics'
//! partition counts and the previous target assignment.
//!
//! # Design note (uniform)
//!
//! 1. Every member keeps the partitions of its previous target that still exist and that
//!    it still subscribes to (stickiness: a partition that stays put does not pause).
//! 2. The partitions nobody holds go, topic by topic, each to the least loaded member
//!    subscribed to the topic.
//! 3. Then, topic by topic and until a pass moves nothing, a partition of the topic moves
//!    from the most loaded member holding one to the least loaded member subscribed to it
//!    while their loads differ by more than one.
//!
//! Why it is balanced and sticky: when every member subscribes to the same topics, step 3
//! ends only with every load within one of every other (any larger gap has a partition to
//! move), and only the excess of a member moves; with different subscriptions it is
//! Kafka's heuristic too (balance within each topic's subscribers), not an optimum.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::fmt;
use std::str::FromStr;

use rill_protocol::Uuid;

use crate::consumer_group_record::Assignment;

/// A server-side assignor, by Kafka's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerAssignor {
    Uniform,
    Range,
}

impl FromStr for ServerAssignor {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "uniform" => Ok(ServerAssignor::Uniform),
            "range" => Ok(ServerAssignor::Range),
            other => Err(other.to_owned()),
        }
    }
}

impl fmt::Display for ServerAssignor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ServerAssignor::Uniform => "uniform",
            ServerAssignor::Range => "range",
        })
    }
}

/// One member as an assignor sees it.
#[derive(Debug, Clone)]
pub struct MemberSpec<'a> {
    pub member_id: &'a str,
    pub instance_id: Option<&'a str>,
    /// The ids of the existing topics it subscribes to.
    pub subscribed: BTreeSet<Uuid>,
    /// Its previous target assignment.
    pub previous: Option<&'a Assignment>,
}

impl ServerAssignor {
    /// Every member's new target (an empty one for members that get nothing); `topics`
    /// gives each subscribed topic's partition count.
    pub fn assign(
        self,
        members: &[MemberSpec<'_>],
        topics: &BTreeMap<Uuid, i32>,
    ) -> BTreeMap<String, Assignment> {
        match self {
            ServerAssignor::Uniform => uniform(members, topics),
            ServerAssignor::Range => range(members, topics),
        }
    }
}

fn partitions_of(topics: &BTreeMap<Uuid, i32>, topic: &Uuid) -> i32 {
    topics.get(topic).copied().unwrap_or(0).max(0)
}

fn uniform(
    members: &[MemberSpec<'_>],
    topics: &BTreeMap<Uuid, i32>,
) -> BTreeMap<String, Assignment> {
    const FREE: u32 = u32::MAX;
    let n = members.len();
    // Topics by index, and each partition's owner (a member's index, or FREE).
    let topic_ids: Vec<Uuid> = topics.keys().copied().collect();
    let topic_index: BTreeMap<Uuid, usize> =
        topic_ids.iter().enumerate().map(|(i, t)| (*t, i)).collect();
    let mut owner: Vec<Vec<u32>> = topic_ids
        .iter()
        .map(|t| vec![FREE; usize::try_from(partitions_of(topics, t)).unwrap_or(0)])
        .collect();
    let mut load = vec![0usize; n];
    // Per member, the partitions it holds, by topic index.
    let mut held: Vec<BTreeMap<usize, Vec<i32>>> = vec![BTreeMap::new(); n];
    let mut subscribers: Vec<Vec<usize>> = vec![Vec::new(); topic_ids.len()];
    for (i, m) in members.iter().enumerate() {
        for t in &m.subscribed {
            if let Some(ti) = topic_index.get(t) {
                subscribers[*ti].push(i);
            }
        }
    }
    // 1. Stickiness.
    for (i, m) in members.iter().enumerate() {
        let Some(previous) = m.previous else { continue };
        let Ok(index) = u32::try_from(i) else {
            continue;
        };
        for (t, partitions) in previous {
            let Some(ti) = topic_index.get(t).copied() else {
                continue;
            };
            if !m.subscribed.contains(t) {
                continue;
            }
            for p in partitions {
                let Some(slot) = usize::try_from(*p).ok().and_then(|p| owner[ti].get_mut(p)) else {
                    continue;
                };
                if *slot == FREE {
                    *slot = index;
                    held[i].entry(ti).or_default().push(*p);
                    load[i] += 1;
                }
            }
        }
    }
    // 2. The rest to the least loaded subscriber.
    for (ti, subs) in subscribers.iter().enumerate() {
        let mut heap: BinaryHeap<Reverse<(usize, usize)>> =
            subs.iter().map(|i| Reverse((load[*i], *i))).collect();
        for (p, slot) in owner[ti].iter_mut().enumerate() {
            if *slot != FREE {
                continue;
            }
            let Some(Reverse((_, i))) = heap.pop() else {
                break;
            };
            let (Ok(index), Ok(p)) = (u32::try_from(i), i32::try_from(p)) else {
                continue;
            };
            *slot = index;
            held[i].entry(ti).or_default().push(p);
            load[i] += 1;
            heap.push(Reverse((load[i], i)));
        }
    }
    // 3. Balance within each topic's subscribers, until nothing moves.
    for _pass in 0..64 {
        let mut moved = false;
        for (ti, subs) in subscribers.iter().enumerate() {
            loop {
                let from = subs
                    .iter()
                    .copied()
                    .filter(|i| held[*i].get(&ti).is_some_and(|s| !s.is_empty()))
                    .max_by_key(|i| (load[*i], Reverse(*i)));
                let to = subs.iter().copied().min_by_key(|i| (load[*i], *i));
                let (Some(from), Some(to)) = (from, to) else {
                    break;
                };
                if load[from] <= load[to] + 1 {
                    break;
                }
                let Some(p) = held[from].get_mut(&ti).and_then(|s| s.pop()) else {
                    break;
                };
                held[to].entry(ti).or_default().push(p);
                load[from] -= 1;
                load[to] += 1;
                moved = true;
            }
        }
        if !moved {
            break;
        }
    }
    members
        .iter()
        .zip(held)
        .map(|(m, h)| {
            let assignment: Assignment = h
                .into_iter()
                .filter(|(_, s)| !s.is_empty())
                .map(|(ti, s)| (topic_ids[ti], s.into_iter().collect()))
                .collect();
            (m.member_id.to_owned(), assignment)
        })
        .collect()
}

fn range(members: &[MemberSpec<'_>], topics: &BTreeMap<Uuid, i32>) -> BTreeMap<String, Assignment> {
    let mut out: BTreeMap<String, Assignment> = members
        .iter()
        .map(|m| (m.member_id.to_owned(), Assignment::new()))
        .collect();
    for (t, count) in topics {
        // Static members by instance id, so that a rolling restart keeps the ranges.
        let mut subs: Vec<&MemberSpec<'_>> = members
            .iter()
            .filter(|m| m.subscribed.contains(t))
            .collect();
        if subs.is_empty() {
            continue;
        }
        subs.sort_by(|a, b| {
            (a.instance_id.unwrap_or(a.member_id), a.member_id)
                .cmp(&(b.instance_id.unwrap_or(b.member_id), b.member_id))
        });
        let count = (*count).max(0) as usize;
        let quota = count / subs.len();
        let extra = count % subs.len();
        let mut start = 0usize;
        for (i, m) in subs.iter().enumerate() {
            let len = quota + usize::from(i < extra);
            if len > 0 {
                let range: BTreeSet<i32> = (start..start + len)
                    .filter_map(|p| i32::try_from(p).ok())
                    .collect();
                if let Some(a) = out.get_mut(m.member_id) {
                    a.insert(*t, range);
                }
            }
            start += len;
        }
    }
    out
}

/// The share groups' `simple` assignor (KIP-932). Unlike a consumer group's, a share
/// group's partition may go to several members: every partition in `partitions` that some
/// member subscribes to is assigned, and with more subscribers than partitions a partition
/// is shared.
///
/// # Design note (simple)
///
/// Over every subscribed partition when all members subscribe to the same topics (Kafka's
/// `SimpleHomogeneousAssignmentBuilder`), else topic by topic among its subscribers
/// (Kafka's heterogeneous builder works per topic too); members in member id order,
/// partitions ascending:
///
/// 1. With no more subscribers than partitions, each partition goes to exactly one
///    subscriber and each subscriber gets ⌊P/M⌋ or ⌈P/M⌉ of them; with more subscribers
///    than partitions, each subscriber gets exactly one partition and each partition goes
///    to ⌊M/P⌋ or ⌈M/P⌉ subscribers. Both are one problem: place every *item* (the
///    partitions, or the subscribers) in one *bin* (the subscribers, or the partitions) so
///    that the bins' sizes differ by at most one (`balanced_placement`).
/// 2. Stickiness: an item first goes back to a bin it was in (its member's previous
///    target) while that bin is under ⌊I/B⌋, then, while ⌈I/B⌉ places remain, to a
///    previous bin at ⌊I/B⌋; only the rest goes to the first bin under ⌊I/B⌋, then to the
///    first at ⌊I/B⌋ while ⌈I/B⌉ places remain.
///
/// Why every partition is assigned and the sizes are balanced: the bins hold at most
/// ⌊I/B⌋ each, plus one for at most `I mod B` of them, which is exactly I places, so the
/// last step always finds a bin and every item is placed; when subscribers outnumber
/// partitions ⌊M/P⌋ ≥ 1, and the ⌊I/B⌋ places of every bin are filled before any bin gets
/// a ⌈I/B⌉-th, so every partition has a member. Members with different subscriptions are
/// balanced within each topic, not across topics (a heuristic there, as Kafka's is).
pub fn simple_assign(
    members: &[MemberSpec<'_>],
    partitions: &BTreeMap<Uuid, BTreeSet<i32>>,
) -> BTreeMap<String, Assignment> {
    let mut out: BTreeMap<String, Assignment> = members
        .iter()
        .map(|m| (m.member_id.to_owned(), Assignment::new()))
        .collect();
    let homogeneous = members
        .windows(2)
        .all(|w| w[0].subscribed == w[1].subscribed);
    // One problem over every subscribed partition when the members all subscribe to the
    // same topics, else one per topic among its subscribers.
    let problems: Vec<Vec<(Uuid, i32)>> = if homogeneous {
        vec![partitions
            .iter()
            .filter(|(t, _)| members.first().is_some_and(|m| m.subscribed.contains(t)))
            .flat_map(|(t, ps)| ps.iter().map(move |p| (*t, *p)))
            .collect()]
    } else {
        partitions
            .iter()
            .map(|(t, ps)| ps.iter().map(|p| (*t, *p)).collect())
            .collect()
    };
    for parts in problems {
        let Some((topic, _)) = parts.first() else {
            continue;
        };
        let mut subs: Vec<&MemberSpec<'_>> = members
            .iter()
            .filter(|m| m.subscribed.contains(topic))
            .collect();
        if subs.is_empty() {
            continue;
        }
        subs.sort_by_key(|m| m.member_id);
        // (subscriber index, partition index) pairs of the previous targets.
        let mut previous = BTreeSet::new();
        for (mi, m) in subs.iter().enumerate() {
            let Some(prev) = m.previous else { continue };
            for (pi, (t, p)) in parts.iter().enumerate() {
                if prev.get(t).is_some_and(|set| set.contains(p)) {
                    previous.insert((mi, pi));
                }
            }
        }
        let pairs: Vec<(usize, usize)> = if subs.len() <= parts.len() {
            let prev: BTreeSet<(usize, usize)> = previous.iter().map(|(m, p)| (*p, *m)).collect();
            balanced_placement(parts.len(), subs.len(), &prev)
                .into_iter()
                .map(|(p, m)| (m, p))
                .collect()
        } else {
            balanced_placement(subs.len(), parts.len(), &previous)
        };
        for (mi, pi) in pairs {
            if let (Some(m), Some((t, p))) = (subs.get(mi), parts.get(pi)) {
                if let Some(a) = out.get_mut(m.member_id) {
                    a.entry(*t).or_default().insert(*p);
                }
            }
        }
    }
    out
}

/// Step 2 of [`simple_assign`]'s note: places each of `items` items in one of `bins`
/// (> 0) bins, sizes within one of each other, keeping the `(item, bin)` pairs of
/// `previous` where it can. Returns the `(item, bin)` pairs.
fn balanced_placement(
    items: usize,
    bins: usize,
    previous: &BTreeSet<(usize, usize)>,
) -> Vec<(usize, usize)> {
    if bins == 0 {
        return Vec::new();
    }
    let floor = items / bins;
    let mut extra = items % bins;
    let mut size = vec![0usize; bins];
    let mut placed: Vec<Option<usize>> = vec![None; items];
    let previous_bins = |item: usize| {
        previous
            .range((item, 0)..(item, usize::MAX))
            .map(|(_, b)| *b)
    };
    for (item, slot) in placed.iter_mut().enumerate() {
        if let Some(b) = previous_bins(item).find(|b| size[*b] < floor) {
            size[b] += 1;
            *slot = Some(b);
        }
    }
    for (item, slot) in placed.iter_mut().enumerate() {
        if slot.is_some() || extra == 0 {
            continue;
        }
        if let Some(b) = previous_bins(item).find(|b| size[*b] == floor) {
            size[b] += 1;
            extra -= 1;
            *slot = Some(b);
        }
    }
    for slot in placed.iter_mut().filter(|s| s.is_none()) {
        let b = match size.iter().position(|s| *s < floor) {
            Some(b) => b,
            None if extra > 0 => match size.iter().position(|s| *s == floor) {
                Some(b) => {
                    extra -= 1;
                    b
                }
                None => continue,
            },
            None => continue,
        };
        size[b] += 1;
        *slot = Some(b);
    }
    placed
        .into_iter()
        .enumerate()
        .filter_map(|(i, b)| b.map(|b| (i, b)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(list: &[(u8, i32)]) -> BTreeMap<Uuid, BTreeSet<i32>> {
        let mut out: BTreeMap<Uuid, BTreeSet<i32>> = BTreeMap::new();
        for (topic, n) in list {
            out.entry(t(*topic)).or_default().extend(0..*n);
        }
        out
    }

    fn shared_by(a: &BTreeMap<String, Assignment>, topic: u8, p: i32) -> usize {
        a.values()
            .filter(|x| x.get(&t(topic)).is_some_and(|s| s.contains(&p)))
            .count()
    }

    #[test]
    fn simple_gives_every_partition_once_when_partitions_outnumber_members() {
        let topics = parts(&[(1, 7)]);
        let counts: BTreeMap<Uuid, i32> = [(t(1), 7)].into_iter().collect();
        let a = simple_assign(&[spec("a", &[1], None), spec("b", &[1], None)], &topics);
        every_partition_once(&a, &counts);
        let mut s = sizes(&a);
        s.sort_unstable();
        assert_eq!(s, vec![3, 4]);
    }

    #[test]
    fn simple_shares_partitions_when_members_outnumber_them() {
        let topics = parts(&[(1, 2)]);
        let ids = ["a", "b", "c", "d", "e"];
        let specs: Vec<MemberSpec<'_>> = ids.iter().map(|id| spec(id, &[1], None)).collect();
        let a = simple_assign(&specs, &topics);
        // Each member one partition, each partition two or three members.
        assert_eq!(sizes(&a), vec![1; 5]);
        let mut shared = [shared_by(&a, 1, 0), shared_by(&a, 1, 1)];
        shared.sort_unstable();
        assert_eq!(shared, [2, 3]);
        // One member more keeps everyone's partition and fills the smaller side.
        let mut specs: Vec<MemberSpec<'_>> =
            ids.iter().map(|id| spec(id, &[1], a.get(*id))).collect();
        specs.push(spec("f", &[1], None));
        let b = simple_assign(&specs, &topics);
        for id in ids {
            assert_eq!(b[id], a[id], "{id} moved");
        }
        assert_eq!((shared_by(&b, 1, 0), shared_by(&b, 1, 1)), (3, 3));
    }

    #[test]
    fn simple_is_sticky_when_a_member_joins() {
        let topics = parts(&[(1, 12)]);
        let first = simple_assign(
            &[
                spec("a", &[1], None),
                spec("b", &[1], None),
                spec("c", &[1], None),
            ],
            &topics,
        );
        let second = simple_assign(
            &[
                spec("a", &[1], first.get("a")),
                spec("b", &[1], first.get("b")),
                spec("c", &[1], first.get("c")),
                spec("d", &[1], None),
            ],
            &topics,
        );
        assert_eq!(sizes(&second), vec![3, 3, 3, 3]);
        for id in ["a", "b", "c"] {
            assert!(second[id][&t(1)].is_subset(&first[id][&t(1)]), "{id}");
        }
    }

    proptest::proptest! {
        /// One topic, any number of members and partitions, with or without a previous
        /// target: every partition is assigned, and either each partition has one member
        /// and loads differ by at most one, or each member has one partition and the
        /// partitions' member counts differ by at most one.
        #[test]
        fn simple_covers_and_balances(members in 1usize..12, partitions in 1i32..12, prev_members in 0usize..12) {
            let topics = parts(&[(1, partitions)]);
            let ids: Vec<String> = (0..members).map(|i| format!("m{i:02}")).collect();
            let prev_ids: Vec<String> = (0..prev_members).map(|i| format!("m{i:02}")).collect();
            let prev_specs: Vec<MemberSpec<'_>> = prev_ids.iter().map(|id| spec(id, &[1], None)).collect();
            let previous = simple_assign(&prev_specs, &topics);
            let specs: Vec<MemberSpec<'_>> = ids.iter().map(|id| spec(id, &[1], previous.get(id))).collect();
            let a = simple_assign(&specs, &topics);
            let counts: Vec<usize> = (0..partitions).map(|p| shared_by(&a, 1, p)).collect();
            proptest::prop_assert!(counts.iter().all(|c| *c >= 1), "{counts:?}");
            let s = sizes(&a);
            let spread = |v: &[usize]| v.iter().max().unwrap() - v.iter().min().unwrap();
            if members <= partitions as usize {
                proptest::prop_assert!(counts.iter().all(|c| *c == 1));
                proptest::prop_assert!(spread(&s) <= 1, "{s:?}");
            } else {
                proptest::prop_assert!(s.iter().all(|n| *n == 1), "{s:?}");
                proptest::prop_assert!(spread(&counts) <= 1, "{counts:?}");
            }
        }
    }

    #[test]
    fn simple_balances_across_topics_when_subscriptions_are_the_same() {
        // Two one-partition topics, two members: one partition each, nothing shared.
        let topics = parts(&[(1, 1), (2, 1)]);
        let a = simple_assign(
            &[spec("a", &[1, 2], None), spec("b", &[1, 2], None)],
            &topics,
        );
        assert_eq!(sizes(&a), vec![1, 1]);
        assert_eq!((shared_by(&a, 1, 0), shared_by(&a, 2, 0)), (1, 1));
    }

    #[test]
    fn simple_assigns_only_the_given_partitions_of_subscribed_topics() {
        let mut topics = parts(&[(1, 4), (2, 2)]);
        // Partition 3 of topic 1 is not initialised yet.
        topics.entry(t(1)).or_default().remove(&3);
        let a = simple_assign(&[spec("a", &[1], None), spec("b", &[1, 2], None)], &topics);
        assert!(!a["a"].contains_key(&t(2)));
        assert_eq!(a["b"][&t(2)], [0, 1].into_iter().collect());
        for p in 0..3 {
            assert_eq!(shared_by(&a, 1, p), 1);
        }
        assert_eq!(shared_by(&a, 1, 3), 0);
    }

    fn t(n: u8) -> Uuid {
        Uuid([n; 16])
    }

    fn spec<'a>(id: &'a str, topics: &[u8], previous: Option<&'a Assignment>) -> MemberSpec<'a> {
        MemberSpec {
            member_id: id,
            instance_id: None,
            subscribed: topics.iter().map(|n| t(*n)).collect(),
            previous,
        }
    }

    fn sizes(a: &BTreeMap<String, Assignment>) -> Vec<usize> {
        a.values()
            .map(|x| x.values().map(|s| s.len()).sum())
            .collect()
    }

    fn every_partition_once(a: &BTreeMap<String, Assignment>, topics: &BTreeMap<Uuid, i32>) {
        let mut seen = BTreeSet::new();
        for x in a.values() {
            for (topic, ps) in x {
                for p in ps {
                    assert!(seen.insert((*topic, *p)), "{topic:?}-{p} twice");
                }
            }
        }
        let total: i32 = topics.values().sum();
        assert_eq!(seen.len(), total as usize);
    }

    #[test]
    fn uniform_balances_and_moves_only_the_excess() {
        let topics: BTreeMap<Uuid, i32> = [(t(1), 12)].into_iter().collect();
        let first = ServerAssignor::Uniform.assign(
            &[
                spec("a", &[1], None),
                spec("b", &[1], None),
                spec("c", &[1], None),
            ],
            &topics,
        );
        assert_eq!(sizes(&first), vec![4, 4, 4]);
        every_partition_once(&first, &topics);
        let second = ServerAssignor::Uniform.assign(
            &[
                spec("a", &[1], first.get("a")),
                spec("b", &[1], first.get("b")),
                spec("c", &[1], first.get("c")),
                spec("d", &[1], None),
            ],
            &topics,
        );
        assert_eq!(sizes(&second), vec![3, 3, 3, 3]);
        every_partition_once(&second, &topics);
        // Each old member keeps three of its four.
        for id in ["a", "b", "c"] {
            let kept = second[id][&t(1)].intersection(&first[id][&t(1)]).count();
            assert_eq!(kept, 3, "{id}");
        }
    }

    #[test]
    fn uniform_with_different_subscriptions_assigns_only_subscribed_topics() {
        let topics: BTreeMap<Uuid, i32> = [(t(1), 4), (t(2), 2)].into_iter().collect();
        let a = ServerAssignor::Uniform
            .assign(&[spec("a", &[1], None), spec("b", &[1, 2], None)], &topics);
        every_partition_once(&a, &topics);
        assert!(!a["a"].contains_key(&t(2)));
        assert_eq!(sizes(&a), vec![3, 3]);
    }

    #[test]
    fn range_gives_contiguous_ranges_in_member_order() {
        let topics: BTreeMap<Uuid, i32> = [(t(1), 5), (t(2), 5)].into_iter().collect();
        let a = ServerAssignor::Range.assign(
            &[spec("b", &[1, 2], None), spec("a", &[1, 2], None)],
            &topics,
        );
        every_partition_once(&a, &topics);
        assert_eq!(a["a"][&t(1)], [0, 1, 2].into_iter().collect());
        assert_eq!(a["b"][&t(1)], [3, 4].into_iter().collect());
        assert_eq!(a["a"][&t(2)], [0, 1, 2].into_iter().collect());
    }

    #[test]
    fn assignor_names() {
        assert_eq!("uniform".parse(), Ok(ServerAssignor::Uniform));
        assert_eq!("range".parse(), Ok(ServerAssignor::Range));
        assert!("sticky".parse::<ServerAssignor>().is_err());
        assert_eq!(ServerAssignor::Range.to_string(), "range");
    }
}
