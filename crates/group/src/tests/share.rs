//! Share groups (KIP-932): joins, leaves, fencing, the `simple` assignor's runs as
//! topics change, the initialisation of share-partition state before assignment, replay,
//! what reads see, group-type conflicts and limits, with an injected clock and simulated
//! clients that do what confluent-kafka's `ShareConsumer` does: make their own member id,
//! heartbeat at the interval, take what a response assigns.

use std::collections::BTreeSet;

use rill_protocol::Uuid;

use super::harness::*;
use crate::*;

const SESSION: i32 = 45_000;
const INTERVAL: i32 = 5_000;

fn req(group: &str, member_id: &str, epoch: i32) -> ShareGroupHeartbeatRequest {
    ShareGroupHeartbeatRequest {
        group_id: group.to_owned(),
        member_id: member_id.to_owned(),
        member_epoch: epoch,
        rack_id: None,
        subscribed_topic_names: None,
        client_id: "share-client".to_owned(),
        client_host: "/127.0.0.1".to_owned(),
        session_timeout_ms: SESSION,
        heartbeat_interval_ms: INTERVAL,
    }
}

fn sgh(sent: &[Respond], responder: u64) -> Option<ShareGroupHeartbeatResponse> {
    sent.iter().find_map(|r| match &r.response {
        Response::ShareGroupHeartbeat(resp) if r.responder == responder => Some(resp.clone()),
        _ => None,
    })
}

impl H {
    fn send_share(&mut self, req: ShareGroupHeartbeatRequest) -> (u64, Vec<Respond>) {
        let r = self.responder();
        let out = self.c.handle_share_group_heartbeat(req, self.now, r);
        let sent = self.absorb(out);
        (r, sent)
    }

    /// A heartbeat answered at once (writes replicate at once unless held).
    fn share(&mut self, req: ShareGroupHeartbeatRequest) -> ShareGroupHeartbeatResponse {
        let (r, sent) = self.send_share(req);
        sgh(&sent, r).expect("answered")
    }

    fn describe_share(&self, group: &str) -> DescribedShareGroup {
        self.c
            .handle_share_group_describe(&ShareGroupDescribeRequest {
                group_ids: vec![group.to_owned()],
            })
            .groups
            .remove(0)
    }
}

/// A share consumer: its own member id, its epoch, what it was given.
struct Client {
    group: String,
    member_id: String,
    topics: Vec<String>,
    epoch: i32,
    assigned: BTreeSet<(Uuid, i32)>,
}

impl Client {
    fn new(group: &str, n: u32, topics: &[&str]) -> Client {
        Client {
            group: group.to_owned(),
            // confluent-kafka makes a UUID; any non-empty string will do here.
            member_id: format!("member-{n:04}"),
            topics: topics.iter().map(|t| (*t).to_owned()).collect(),
            epoch: 0,
            assigned: BTreeSet::new(),
        }
    }

    fn request(&self) -> ShareGroupHeartbeatRequest {
        let mut r = req(&self.group, &self.member_id, self.epoch);
        if self.epoch == 0 {
            r.subscribed_topic_names = Some(self.topics.clone());
        }
        r
    }

    fn take(&mut self, resp: &ShareGroupHeartbeatResponse) {
        assert_eq!(resp.error_code, error_code::NONE, "{resp:?}");
        self.epoch = resp.member_epoch;
        if let Some(a) = &resp.assignment {
            self.assigned = a
                .iter()
                .flat_map(|tp| tp.partitions.iter().map(move |p| (tp.topic_id, *p)))
                .collect();
        }
    }

    fn step(&mut self, h: &mut H) -> ShareGroupHeartbeatResponse {
        let resp = h.share(self.request());
        self.take(&resp);
        resp
    }
}

/// Every client heartbeats until a round changes no epoch.
fn settle(h: &mut H, clients: &mut [Client]) {
    for _ in 0..10 {
        let before: Vec<i32> = clients.iter().map(|c| c.epoch).collect();
        for c in clients.iter_mut() {
            c.step(h);
        }
        if clients.iter().map(|c| c.epoch).collect::<Vec<_>>() == before {
            return;
        }
    }
    panic!("the group did not settle");
}

fn loads(clients: &[Client]) -> Vec<usize> {
    clients.iter().map(|c| c.assigned.len()).collect()
}

fn covered(clients: &[Client]) -> BTreeSet<(Uuid, i32)> {
    clients
        .iter()
        .flat_map(|c| c.assigned.iter().copied())
        .collect()
}

fn all_of(name: &str, n: i32) -> BTreeSet<(Uuid, i32)> {
    (0..n).map(|p| (topic_id(name), p)).collect()
}

fn share_h() -> H {
    let mut h = H::new();
    h.c.update_topics(topics(&[("orders", 4), ("payments", 2)]));
    h
}

#[test]
fn a_member_joins_and_gets_every_partition_once_its_state_is_initialised() {
    let mut h = share_h();
    h.auto_initialize = false;
    let mut a = Client::new("g", 1, &["orders"]);
    let first = a.step(&mut h);
    assert_eq!(first.member_id.as_deref(), Some("member-0001"));
    assert_eq!(first.heartbeat_interval_ms, INTERVAL);
    assert_eq!(first.member_epoch, 1);
    // Nothing is assigned before the share coordinator has the partitions' state.
    assert_eq!(first.assignment, Some(Vec::new()));
    assert_eq!(h.initialize_asks.len(), 1);
    let (group, _, asked) = h.initialize_asks.remove(0);
    assert_eq!(group, "g");
    assert_eq!(asked.len(), 1);
    assert_eq!(
        (asked[0].topic_name.as_str(), &asked[0].partitions[..]),
        ("orders", &[0, 1, 2, 3][..])
    );
    // Heartbeats meanwhile neither assign nor ask again.
    let quiet = a.step(&mut h);
    assert_eq!((quiet.member_epoch, quiet.assignment.clone()), (1, None));
    assert!(h.initialize_asks.is_empty());
    let out = h.c.share_group_state_initialized("g", &asked, h.now);
    h.absorb(out);
    let next = a.step(&mut h);
    assert_eq!(next.member_epoch, 2);
    assert_eq!(a.assigned, all_of("orders", 4));
    let d = h.describe_share("g");
    assert_eq!(d.error_code, error_code::NONE);
    assert_eq!(
        (d.group_state.as_str(), d.group_epoch, d.assignment_epoch),
        ("Stable", 2, 2)
    );
    assert_eq!(d.assignor_name, "simple");
    assert_eq!(d.members[0].assignment[0].topic_name, "orders");
    assert_eq!(d.members[0].assignment[0].partitions, vec![0, 1, 2, 3]);
    assert_eq!(
        d.members[0].subscribed_topic_names,
        vec!["orders".to_owned()]
    );
}

#[test]
fn a_second_member_gets_its_partitions_at_once_without_a_revocation() {
    let mut h = share_h();
    let mut a = Client::new("g", 1, &["orders"]);
    a.step(&mut h);
    a.step(&mut h);
    assert_eq!(a.assigned.len(), 4);
    let mut b = Client::new("g", 2, &["orders"]);
    b.step(&mut h);
    // b holds two partitions that a has not given up yet: a share group allows that.
    assert_eq!(b.assigned.len(), 2);
    assert_eq!(a.assigned.len(), 4);
    a.step(&mut h);
    assert_eq!(a.assigned.len(), 2);
    assert!(a.assigned.is_disjoint(&b.assigned));
    assert_eq!(covered(&[a, b]), all_of("orders", 4));
}

#[test]
fn more_members_than_partitions_share_them() {
    let mut h = share_h();
    let mut clients: Vec<Client> = (0..5).map(|i| Client::new("g", i, &["payments"])).collect();
    settle(&mut h, &mut clients);
    assert_eq!(loads(&clients), vec![1; 5]);
    assert_eq!(covered(&clients), all_of("payments", 2));
    let mut per_partition = [0, 0];
    for c in &clients {
        for (_, p) in &c.assigned {
            per_partition[usize::try_from(*p).unwrap()] += 1;
        }
    }
    per_partition.sort_unstable();
    assert_eq!(per_partition, [2, 3]);
}

#[test]
fn a_member_that_leaves_hands_its_partitions_to_the_others() {
    let mut h = share_h();
    let mut clients: Vec<Client> = (0..2).map(|i| Client::new("g", i, &["orders"])).collect();
    settle(&mut h, &mut clients);
    assert_eq!(loads(&clients), vec![2, 2]);
    let leaving = clients.pop().unwrap();
    let resp = h.share(req("g", &leaving.member_id, LEAVE_GROUP_MEMBER_EPOCH));
    assert_eq!(resp.error_code, error_code::NONE);
    assert_eq!(resp.member_epoch, LEAVE_GROUP_MEMBER_EPOCH);
    settle(&mut h, &mut clients);
    assert_eq!(clients[0].assigned, all_of("orders", 4));
    // Its heartbeat now finds no such member.
    let again = h.share(req("g", &leaving.member_id, leaving.epoch));
    assert_eq!(again.error_code, error_code::UNKNOWN_MEMBER_ID);
    // A second leave likewise.
    let twice = h.share(req("g", &leaving.member_id, LEAVE_GROUP_MEMBER_EPOCH));
    assert_eq!(twice.error_code, error_code::UNKNOWN_MEMBER_ID);
}

#[test]
fn a_session_that_expires_fences_the_member() {
    let mut h = share_h();
    let mut clients: Vec<Client> = (0..2).map(|i| Client::new("g", i, &["orders"])).collect();
    settle(&mut h, &mut clients);
    let silent = clients.pop().unwrap();
    // The live member heartbeats at its interval; the other stops.
    for _ in 0..10 {
        h.advance_to(h.now + i64::from(INTERVAL));
        clients[0].step(&mut h);
    }
    assert!(h.c.share_group_member("g", &silent.member_id).is_none());
    assert_eq!(clients[0].assigned, all_of("orders", 4));
    let resp = h.share(req("g", &silent.member_id, silent.epoch));
    assert_eq!(resp.error_code, error_code::UNKNOWN_MEMBER_ID);
    // Nobody left at all: the group is Empty once the last session ends.
    h.advance_to(h.now + i64::from(SESSION) + 1);
    assert_eq!(h.c.share_group_state("g"), Some(ShareGroupState::Empty));
    assert_eq!(h.describe_share("g").group_state, "Empty");
}

#[test]
fn epochs_that_do_not_match_are_fenced_except_a_lost_response() {
    let mut h = share_h();
    let mut a = Client::new("g", 1, &["orders"]);
    a.step(&mut h);
    a.step(&mut h);
    assert_eq!(a.epoch, 2);
    let ahead = h.share(req("g", &a.member_id, 3));
    assert_eq!(ahead.error_code, error_code::FENCED_MEMBER_EPOCH);
    // The response that bumped it to 2 was lost: epoch 1 is still accepted.
    let lost = h.share(req("g", &a.member_id, 1));
    assert_eq!((lost.error_code, lost.member_epoch), (error_code::NONE, 2));
    let mut behind = req("g", &a.member_id, 0);
    behind.subscribed_topic_names = Some(vec!["orders".into()]);
    assert_eq!(h.share(behind).error_code, error_code::FENCED_MEMBER_EPOCH);
}

#[test]
fn invalid_heartbeats_are_refused_as_kafka_refuses_them() {
    let mut h = share_h();
    let mut no_id = req("g", "", 0);
    no_id.subscribed_topic_names = Some(vec!["orders".into()]);
    let r = h.share(no_id);
    assert_eq!(r.error_code, error_code::INVALID_REQUEST);
    assert_eq!(r.error_message.as_deref(), Some("MemberId can't be empty."));
    // The member id is checked before the group id, as Kafka 4.2 does.
    let r = h.share(req("", "", 0));
    assert_eq!(r.error_message.as_deref(), Some("MemberId can't be empty."));
    let r = h.share(req("g", "m", 0));
    assert_eq!(r.error_code, error_code::INVALID_REQUEST);
    let mut empty = req("g", "m", 0);
    empty.subscribed_topic_names = Some(Vec::new());
    assert_eq!(h.share(empty).error_code, error_code::INVALID_REQUEST);
    assert_eq!(
        h.share(req("g", "m", -2)).error_code,
        error_code::INVALID_REQUEST
    );
    let mut rack = req("g", "m", 0);
    rack.subscribed_topic_names = Some(vec!["orders".into()]);
    rack.rack_id = Some(String::new());
    assert_eq!(h.share(rack).error_code, error_code::INVALID_REQUEST);
    let mut no_group = req("", "m", 0);
    no_group.subscribed_topic_names = Some(vec!["orders".into()]);
    assert_eq!(h.share(no_group).error_code, error_code::INVALID_REQUEST);
    assert!(h.log.is_empty(), "nothing refused wrote anything");
    // No group but by a join, as Kafka 4.2 answers.
    let r = h.share(req("g", "m", 5));
    assert_eq!(r.error_code, error_code::GROUP_ID_NOT_FOUND);
    assert_eq!(r.error_message.as_deref(), Some("Share group g not found."));
    let r = h.share(req("g", "m", LEAVE_GROUP_MEMBER_EPOCH));
    assert_eq!(r.error_code, error_code::GROUP_ID_NOT_FOUND);
    assert_eq!(r.error_message.as_deref(), Some("Group g not found."));
    // In a group it never joined, a member is unknown.
    let mut other = req("g", "other", 0);
    other.subscribed_topic_names = Some(vec!["orders".into()]);
    assert_eq!(h.share(other).error_code, error_code::NONE);
    assert_eq!(
        h.share(req("g", "m", 5)).error_code,
        error_code::UNKNOWN_MEMBER_ID
    );
}

#[test]
fn a_topic_that_grows_is_initialised_and_assigned() {
    let mut h = share_h();
    let mut clients: Vec<Client> = (0..2).map(|i| Client::new("g", i, &["orders"])).collect();
    settle(&mut h, &mut clients);
    let epoch = clients[0].epoch;
    h.auto_initialize = false;
    h.c.update_topics(topics(&[("orders", 6), ("payments", 2)]));
    clients[0].step(&mut h);
    assert_eq!(h.initialize_asks.len(), 1);
    assert_eq!(h.initialize_asks[0].2[0].partitions, vec![4, 5]);
    // The new partitions are not assigned before they are initialised.
    assert!(covered(&clients).is_subset(&all_of("orders", 4)));
    let (group, _, asked) = h.initialize_asks.remove(0);
    let out = h.c.share_group_state_initialized(&group, &asked, h.now);
    h.absorb(out);
    settle(&mut h, &mut clients);
    assert!(clients[0].epoch > epoch);
    assert_eq!(loads(&clients), vec![3, 3]);
    assert_eq!(covered(&clients), all_of("orders", 6));
}

#[test]
fn a_deleted_topic_leaves_the_assignment_and_the_initialised_set() {
    let mut h = share_h();
    let mut clients: Vec<Client> = (0..2)
        .map(|i| Client::new("g", i, &["orders", "payments"]))
        .collect();
    settle(&mut h, &mut clients);
    assert_eq!(loads(&clients), vec![3, 3]);
    h.c.update_topics(topics(&[("orders", 4)]));
    settle(&mut h, &mut clients);
    assert_eq!(covered(&clients), all_of("orders", 4));
    // The last state record no longer names the deleted topic.
    let state = h
        .log
        .iter()
        .rev()
        .find_map(|(_, r)| match r {
            Record::ShareGroup(ShareGroupRecord::StatePartitionMetadata {
                value: Some(v), ..
            }) => Some(v.clone()),
            _ => None,
        })
        .unwrap();
    let names: Vec<&str> = state
        .initialized_topics
        .iter()
        .map(|t| t.topic_name.as_str())
        .collect();
    assert_eq!(names, vec!["orders"]);
    // A topic of the same name made again is a new topic: initialised afresh.
    let mut again = topics(&[("orders", 4)])
        .topics()
        .cloned()
        .collect::<Vec<_>>();
    again.push(TopicImage {
        id: Uuid([7; 16]),
        name: "payments".into(),
        num_partitions: 1,
    });
    h.c.update_topics(TopicsImage::new(again));
    settle(&mut h, &mut clients);
    assert!(covered(&clients).contains(&(Uuid([7; 16]), 0)));
}

#[test]
fn replay_rebuilds_the_group() {
    let mut h = share_h();
    let mut clients: Vec<Client> = (0..3)
        .map(|i| Client::new("g", i, &["orders", "payments"]))
        .collect();
    settle(&mut h, &mut clients);
    let leaving = clients.pop().unwrap();
    h.share(req("g", &leaving.member_id, LEAVE_GROUP_MEMBER_EPOCH));
    clients[0].step(&mut h);
    h.auto_initialize = false;
    h.c.update_topics(topics(&[("orders", 5), ("payments", 2)]));
    clients[1].step(&mut h);
    assert_eq!(h.initialize_asks.len(), 1, "partition 4 is initializing");

    let config = h.c.config().clone();
    let n = config.offsets_topic_num_partitions;
    let mut fresh = GroupCoordinator::new(config, 9);
    fresh.update_topics(topics(&[("orders", 5), ("payments", 2)]));
    for p in 0..n {
        fresh.load_partition_start(p);
    }
    for (p, r) in &h.log {
        fresh.replay(*p, r).unwrap();
    }
    for p in 0..n {
        fresh.load_partition_done(p, h.now);
    }
    assert_eq!(fresh.share_group_epochs("g"), h.c.share_group_epochs("g"));
    assert_eq!(fresh.share_group_state("g"), h.c.share_group_state("g"));
    assert_eq!(
        fresh.share_group_assignments("g"),
        h.c.share_group_assignments("g")
    );
    for c in &clients {
        assert_eq!(
            fresh.share_group_member("g", &c.member_id),
            h.c.share_group_member("g", &c.member_id)
        );
    }
    assert!(fresh.share_group_member("g", &leaving.member_id).is_none());
    let describe = |c: &GroupCoordinator| {
        c.handle_share_group_describe(&ShareGroupDescribeRequest {
            group_ids: vec!["g".into()],
        })
    };
    assert_eq!(describe(&fresh), describe(&h.c));
    // The members carry on against the new coordinator, which asks again for the
    // partition whose initialisation the old one never saw finish.
    let mut h2 = H::new();
    h2.c = fresh;
    h2.now = h.now;
    h2.auto_initialize = false;
    clients[0].step(&mut h2);
    assert_eq!(h2.initialize_asks.len(), 1);
    assert_eq!(h2.initialize_asks[0].2[0].partitions, vec![4]);
    h2.auto_initialize = true;
    let (group, _, asked) = h2.initialize_asks.remove(0);
    let out = h2.c.share_group_state_initialized(&group, &asked, h2.now);
    h2.absorb(out);
    settle(&mut h2, &mut clients);
    let mut all = all_of("orders", 5);
    all.extend(all_of("payments", 2));
    assert_eq!(covered(&clients), all);
}

#[test]
fn share_classic_and_consumer_groups_share_one_id_space() {
    let mut h = share_h();
    // A classic group with a member.
    let (_id, _) = h.new_member("classic", &["orders"]);
    let mut r = req("classic", "m", 0);
    r.subscribed_topic_names = Some(vec!["orders".into()]);
    let resp = h.share(r);
    assert_eq!(resp.error_code, error_code::GROUP_ID_NOT_FOUND);
    assert_eq!(
        resp.error_message.as_deref(),
        Some("Group classic is not a share group.")
    );
    // A share group's id refuses a classic member and a consumer group member.
    Client::new("s", 1, &["orders"]).step(&mut h);
    let join = h.join_req("s", "", consumer_protocols(&["orders"]));
    let (rj, sent) = h.join_with(join);
    assert_eq!(
        join_resp(&sent, rj).unwrap().error_code,
        error_code::INCONSISTENT_GROUP_PROTOCOL
    );
    let rc = h.responder();
    let out = h.c.handle_consumer_group_heartbeat(
        ConsumerGroupHeartbeatRequest {
            group_id: "s".into(),
            member_id: String::new(),
            member_epoch: 0,
            instance_id: None,
            rack_id: None,
            rebalance_timeout_ms: 30_000,
            subscribed_topic_names: Some(vec!["orders".into()]),
            subscribed_topic_regex: None,
            server_assignor: None,
            topic_partitions: Some(Vec::new()),
            client_id: "c".into(),
            client_host: "/127.0.0.1".into(),
            session_timeout_ms: SESSION,
            heartbeat_interval_ms: INTERVAL,
        },
        h.now,
        rc,
    );
    let sent = h.absorb(out);
    let code = sent.iter().find_map(|r| match &r.response {
        Response::ConsumerGroupHeartbeat(x) if r.responder == rc => Some(x.error_code),
        _ => None,
    });
    assert_eq!(code, Some(error_code::GROUP_ID_NOT_FOUND));
    // DescribeGroups (the classic api) does not know a share group, as Kafka answers.
    let d = h.c.handle_describe_groups(&DescribeGroupsRequest {
        groups: vec!["s".into()],
        api_version: 6,
    });
    assert_eq!(d.groups[0].error_code, error_code::GROUP_ID_NOT_FOUND);
    // Nor does ConsumerGroupDescribe.
    let d =
        h.c.handle_consumer_group_describe(&ConsumerGroupDescribeRequest {
            group_ids: vec!["s".into()],
        })
        .groups
        .remove(0);
    assert_eq!(d.error_code, error_code::GROUP_ID_NOT_FOUND);
    assert_eq!(
        d.error_message.as_deref(),
        Some("Group s is not a consumer group.")
    );
    // ShareGroupDescribe does not know the classic group.
    let d = h.describe_share("classic");
    assert_eq!(d.error_code, error_code::GROUP_ID_NOT_FOUND);
    assert_eq!(
        d.error_message.as_deref(),
        Some("Group classic is not a share group.")
    );
}

#[test]
fn the_group_is_full_at_its_max_size() {
    let mut h = H::with_config(GroupConfig {
        share_group_max_size: 2,
        ..GroupConfig::default()
    });
    h.c.update_topics(topics(&[("orders", 4)]));
    let mut a = Client::new("g", 1, &["orders"]);
    let mut b = Client::new("g", 2, &["orders"]);
    a.step(&mut h);
    b.step(&mut h);
    let c = Client::new("g", 3, &["orders"]);
    let resp = h.share(c.request());
    assert_eq!(resp.error_code, error_code::GROUP_MAX_SIZE_REACHED);
    // Members already in keep heartbeating.
    a.step(&mut h);
    assert_eq!(h.c.share_group_epochs("g").map(|e| e.0), Some(a.epoch));
}

#[test]
fn answers_list_and_describe_wait_for_replication() {
    let mut h = share_h();
    h.hold_commits = true;
    let a = Client::new("g", 1, &["orders"]);
    let p = h.c.partition_for("g");
    let (r1, sent) = h.send_share(a.request());
    assert!(sgh(&sent, r1).is_none(), "held until replicated");
    assert_eq!(
        h.describe_share("g").error_code,
        error_code::GROUP_ID_NOT_FOUND
    );
    let listed = h.c.handle_list_groups(&ListGroupsRequest::default());
    assert!(listed.groups.is_empty());
    let end = h.end_of(p);
    let released = h.commit_up_to(p, end);
    assert!(sgh(&released, r1).is_some());
    assert_eq!(h.describe_share("g").members.len(), 1);
    let list = |h: &H, types: &[&str], states: &[&str]| -> Vec<(String, String, String)> {
        h.c.handle_list_groups(&ListGroupsRequest {
            states_filter: states.iter().map(|s| (*s).to_owned()).collect(),
            types_filter: types.iter().map(|s| (*s).to_owned()).collect(),
        })
        .groups
        .into_iter()
        .map(|g| (g.group_id, g.group_type, g.protocol_type))
        .collect()
    };
    let share = ("g".to_owned(), "share".to_owned(), "share".to_owned());
    assert_eq!(list(&h, &[], &[]), vec![share.clone()]);
    assert_eq!(list(&h, &["Share"], &["stable"]), vec![share.clone()]);
    assert!(list(&h, &["consumer", "classic"], &[]).is_empty());
    assert!(list(&h, &["share"], &["Empty"]).is_empty());
}

#[test]
fn only_an_empty_share_group_can_be_deleted() {
    let mut h = share_h();
    let mut a = Client::new("g", 1, &["orders"]);
    a.step(&mut h);
    let delete = |h: &mut H| {
        let r = h.responder();
        let out = h.c.handle_delete_groups(
            DeleteGroupsRequest {
                groups_names: vec!["g".into()],
            },
            h.now,
            r,
        );
        let sent = h.absorb(out);
        sent.iter()
            .find_map(|x| match &x.response {
                Response::DeleteGroups(d) if x.responder == r => Some(d.results[0].error_code),
                _ => None,
            })
            .unwrap()
    };
    assert_eq!(delete(&mut h), error_code::NON_EMPTY_GROUP);
    h.share(req("g", &a.member_id, LEAVE_GROUP_MEMBER_EPOCH));
    assert_eq!(delete(&mut h), error_code::NONE);
    assert!(h.c.share_group_state("g").is_none());
    assert_eq!(
        h.describe_share("g").error_code,
        error_code::GROUP_ID_NOT_FOUND
    );
    assert_eq!(delete(&mut h), error_code::GROUP_ID_NOT_FOUND);
    // The id is free for any group type, and a replay ends with no group.
    let n = h.c.config().offsets_topic_num_partitions;
    let mut fresh = GroupCoordinator::new(h.c.config().clone(), 1);
    for p in 0..n {
        fresh.load_partition_start(p);
    }
    for (p, r) in &h.log {
        fresh.replay(*p, r).unwrap();
    }
    assert!(fresh.share_group_state("g").is_none());
    a.epoch = 0;
    a.step(&mut h);
    assert_eq!(h.c.share_group_state("g"), Some(ShareGroupState::Stable));
}

impl H {
    /// The answer of the call `r` among `sent`.
    fn answer_of(&self, sent: &[Respond], r: u64) -> Response {
        sent.iter()
            .find(|x| x.responder == r)
            .map(|x| x.response.clone())
            .expect("answered")
    }

    fn alter_share_offsets(
        &mut self,
        group: &str,
        topics: &[(&str, &[(i32, i64)])],
    ) -> AlterShareGroupOffsetsPlan {
        let r = self.responder();
        let out = self.c.handle_alter_share_group_offsets(
            AlterShareGroupOffsetsRequest {
                group_id: group.to_owned(),
                topics: topics
                    .iter()
                    .map(|(t, ps)| ((*t).to_owned(), ps.to_vec()))
                    .collect(),
            },
            r,
        );
        let sent = self.absorb(out);
        match self.answer_of(&sent, r) {
            Response::AlterShareGroupOffsets(plan) => plan,
            other => panic!("{other:?}"),
        }
    }

    fn delete_share_offsets(
        &mut self,
        group: &str,
        topics: &[&str],
    ) -> DeleteShareGroupOffsetsPlan {
        let r = self.responder();
        let out = self.c.handle_delete_share_group_offsets(
            DeleteShareGroupOffsetsRequest {
                group_id: group.to_owned(),
                topic_names: topics.iter().map(|t| (*t).to_owned()).collect(),
            },
            r,
        );
        let sent = self.absorb(out);
        match self.answer_of(&sent, r) {
            Response::DeleteShareGroupOffsets(plan) => plan,
            other => panic!("{other:?}"),
        }
    }

    fn share_delete_start(&mut self, groups: &[&str]) -> Vec<ShareGroupStateDeletion> {
        let r = self.responder();
        let out = self
            .c
            .handle_share_groups_delete_start(groups.iter().map(|g| (*g).to_owned()).collect(), r);
        let sent = self.absorb(out);
        match self.answer_of(&sent, r) {
            Response::ShareGroupStateDeletions(d) => d,
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn a_failed_initialisation_is_asked_for_again_at_the_next_heartbeat() {
    let mut h = share_h();
    h.auto_initialize = false;
    let mut a = Client::new("g", 1, &["payments"]);
    a.step(&mut h);
    let (_, epoch, asked) = h.initialize_asks.remove(0);
    assert_eq!(epoch, 1, "the state epoch is the group epoch");
    a.step(&mut h);
    assert!(h.initialize_asks.is_empty(), "one ask in flight at a time");
    h.c.share_group_state_initialize_failed("g", &asked);
    a.step(&mut h);
    assert!(a.assigned.is_empty(), "nothing is assigned without state");
    let (_, _, again) = h.initialize_asks.remove(0);
    assert_eq!(again, asked);
    let out = h.c.share_group_state_initialized("g", &again, h.now);
    h.absorb(out);
    a.step(&mut h);
    assert_eq!(a.assigned, all_of("payments", 2));
}

#[test]
fn share_group_offsets_are_altered_only_in_an_empty_group_and_become_initialised() {
    let mut h = share_h();
    let mut a = Client::new("g", 1, &["orders"]);
    settle(&mut h, std::slice::from_mut(&mut a));
    assert_eq!(a.assigned, all_of("orders", 4));

    let busy = h.alter_share_offsets("g", &[("orders", &[(0, 5)])]);
    assert_eq!(busy.error_code, error_code::NON_EMPTY_GROUP);
    assert!(busy.initialize.is_empty());
    let missing = h.alter_share_offsets("nobody", &[("orders", &[(0, 5)])]);
    assert_eq!(missing.error_code, error_code::GROUP_ID_NOT_FOUND);

    h.share(req("g", &a.member_id, LEAVE_GROUP_MEMBER_EPOCH));
    let plan = h.alter_share_offsets(
        "g",
        &[("orders", &[(0, 5), (1, 7), (9, 1)]), ("ghost", &[(0, 1)])],
    );
    assert_eq!(plan.error_code, error_code::NONE);
    assert_eq!(plan.group_epoch, h.c.share_group_epochs("g").unwrap().0);
    assert_eq!(
        plan.topics[0].partitions,
        vec![
            (0, error_code::NONE),
            (1, error_code::NONE),
            (9, error_code::UNKNOWN_TOPIC_OR_PARTITION)
        ]
    );
    assert_eq!(plan.topics[1].topic_id, None);
    assert_eq!(
        plan.topics[1].partitions,
        vec![(0, error_code::UNKNOWN_TOPIC_OR_PARTITION)]
    );
    assert_eq!(
        plan.initialize,
        vec![ShareTopicStartOffsets {
            topic_id: topic_id("orders"),
            topic_name: "orders".into(),
            partitions: vec![(0, 5), (1, 7)],
        }]
    );
    // Altered partitions keep their old state until the share coordinator has the new
    // one (Kafka leaves them initialised), and no heartbeat asks for them meanwhile,
    // not even after the alter's initialisation failed: that would reset their state.
    h.auto_initialize = false;
    let mut b = Client::new("g", 2, &["orders"]);
    settle(&mut h, std::slice::from_mut(&mut b));
    assert_eq!(b.assigned, all_of("orders", 4));
    let asked_by_alter: Vec<ShareTopicPartitions> = plan
        .initialize
        .iter()
        .map(|t| ShareTopicPartitions {
            topic_id: t.topic_id,
            topic_name: t.topic_name.clone(),
            partitions: t.partitions.iter().map(|(p, _)| *p).collect(),
        })
        .collect();
    h.c.share_group_state_initialize_failed("g", &asked_by_alter);
    settle(&mut h, std::slice::from_mut(&mut b));
    b.step(&mut h);
    assert!(h.initialize_asks.is_empty());
    let done: Vec<ShareTopicPartitions> = plan
        .initialize
        .iter()
        .map(|t| ShareTopicPartitions {
            topic_id: t.topic_id,
            topic_name: t.topic_name.clone(),
            partitions: t.partitions.iter().map(|(p, _)| *p).collect(),
        })
        .collect();
    let out = h.c.share_group_state_initialized("g", &done, h.now);
    h.absorb(out);
    settle(&mut h, std::slice::from_mut(&mut b));
    assert_eq!(b.assigned, all_of("orders", 4));
}

#[test]
fn share_group_offsets_are_deleted_topic_by_topic() {
    let mut h = share_h();
    let mut a = Client::new("g", 1, &["orders", "payments"]);
    settle(&mut h, std::slice::from_mut(&mut a));
    assert_eq!(
        h.delete_share_offsets("g", &["orders"]).error_code,
        error_code::NON_EMPTY_GROUP
    );
    h.share(req("g", &a.member_id, LEAVE_GROUP_MEMBER_EPOCH));
    assert_eq!(
        h.c.initialized_share_partitions("g")
            .unwrap()
            .iter()
            .map(|t| t.topic_name.as_str())
            .collect::<Vec<_>>(),
        ["orders", "payments"]
    );
    let plan = h.delete_share_offsets("g", &["orders", "ghost"]);
    assert_eq!(plan.error_code, error_code::NONE);
    assert_eq!(plan.delete.len(), 1);
    assert_eq!(plan.delete[0].partitions, vec![0, 1, 2, 3]);
    assert_eq!(plan.errors.len(), 1);
    assert_eq!(
        (
            plan.errors[0].topic_name.as_str(),
            plan.errors[0].error_code
        ),
        ("ghost", error_code::UNKNOWN_TOPIC_OR_PARTITION)
    );
    assert_eq!(h.c.initialized_share_partitions("g").unwrap().len(), 1);
    // Until the share coordinator has deleted it, asking again deletes it again.
    let again = h.delete_share_offsets("g", &["orders"]);
    assert_eq!(again.delete, plan.delete);
    let out =
        h.c.complete_delete_share_group_offsets("g", &[topic_id("orders")]);
    h.absorb(out);
    let gone = h.delete_share_offsets("g", &["orders"]);
    assert!(gone.delete.is_empty());
    assert_eq!(
        gone.errors[0].error_code,
        error_code::UNKNOWN_TOPIC_OR_PARTITION
    );
}

#[test]
fn deleting_a_share_group_first_hands_over_its_share_partitions() {
    let mut h = share_h();
    let mut a = Client::new("g", 1, &["payments"]);
    settle(&mut h, std::slice::from_mut(&mut a));
    // A classic group's id is not the share delete's to answer.
    h.c.update_topics(topics(&[("orders", 4), ("payments", 2)]));
    let busy = h.share_delete_start(&["g", "not-a-share-group"]);
    assert_eq!(busy.len(), 1);
    assert_eq!(busy[0].error_code, error_code::NON_EMPTY_GROUP);
    h.share(req("g", &a.member_id, LEAVE_GROUP_MEMBER_EPOCH));
    let first = h.share_delete_start(&["g"]);
    assert_eq!(first[0].error_code, error_code::NONE);
    assert_eq!(first[0].topics.len(), 1);
    assert_eq!(first[0].topics[0].partitions, vec![0, 1]);
    assert!(h.c.initialized_share_partitions("g").unwrap().is_empty());
    // The share coordinator's delete failed: a second attempt deletes the same again.
    let second = h.share_delete_start(&["g"]);
    assert_eq!(second, first);
}
