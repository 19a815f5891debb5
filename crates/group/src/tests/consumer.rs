//! The consumer group protocol (KIP-848): joins, leaves, fencing, reconciliation,
//! static members, regular expressions, replay and what reads see, with an injected
//! clock and simulated clients that do what librdkafka and the Java client do: report
//! what they own, take what a response assigns, revoke at once.

use std::collections::BTreeSet;

use super::harness::*;
use crate::*;

const SESSION: i32 = 45_000;
const INTERVAL: i32 = 5_000;
const REBALANCE: i32 = 30_000;

fn req(group: &str, member_id: &str, epoch: i32) -> ConsumerGroupHeartbeatRequest {
    ConsumerGroupHeartbeatRequest {
        group_id: group.to_owned(),
        member_id: member_id.to_owned(),
        member_epoch: epoch,
        instance_id: None,
        rack_id: None,
        rebalance_timeout_ms: -1,
        subscribed_topic_names: None,
        subscribed_topic_regex: None,
        server_assignor: None,
        topic_partitions: None,
        client_id: "client".to_owned(),
        client_host: "/127.0.0.1".to_owned(),
        session_timeout_ms: SESSION,
        heartbeat_interval_ms: INTERVAL,
    }
}

fn cgh(sent: &[Respond], responder: u64) -> Option<ConsumerGroupHeartbeatResponse> {
    sent.iter().find_map(|r| match &r.response {
        Response::ConsumerGroupHeartbeat(resp) if r.responder == responder => Some(resp.clone()),
        _ => None,
    })
}

impl H {
    /// Sends a heartbeat; returns its responder and what was answered now.
    fn send_hb(&mut self, r: ConsumerGroupHeartbeatRequest) -> (u64, Vec<Respond>) {
        let responder = self.responder();
        let out = self
            .c
            .handle_consumer_group_heartbeat(r, self.now, responder);
        let sent = self.absorb(out);
        (responder, sent)
    }

    /// Sends a heartbeat that must be answered at once.
    fn hb(&mut self, r: ConsumerGroupHeartbeatRequest) -> ConsumerGroupHeartbeatResponse {
        let (responder, sent) = self.send_hb(r);
        cgh(&sent, responder).expect("answered at once")
    }
}

/// A consumer as the clients behave: it reports what it owns and gives up what a
/// response no longer lists before its next heartbeat.
#[derive(Debug, Clone)]
struct Client {
    group: String,
    member_id: String,
    epoch: i32,
    owned: Assignment,
    topics: Vec<String>,
    regex: Option<String>,
    instance_id: Option<String>,
    assignor: Option<String>,
    fenced: bool,
}

impl Client {
    fn new(group: &str, topics: &[&str]) -> Client {
        Client {
            group: group.to_owned(),
            member_id: String::new(),
            epoch: 0,
            owned: Assignment::new(),
            topics: topics.iter().map(|t| (*t).to_owned()).collect(),
            regex: None,
            instance_id: None,
            assignor: None,
            fenced: false,
        }
    }

    fn request(&self) -> ConsumerGroupHeartbeatRequest {
        let mut r = req(&self.group, &self.member_id, self.epoch);
        r.instance_id = self.instance_id.clone();
        r.topic_partitions = Some(to_topic_partitions(&self.owned));
        if self.epoch == 0 {
            r.rebalance_timeout_ms = REBALANCE;
            r.subscribed_topic_names = Some(self.topics.clone());
            r.subscribed_topic_regex = self.regex.clone();
            r.server_assignor = self.assignor.clone();
        }
        r
    }

    fn take(&mut self, resp: &ConsumerGroupHeartbeatResponse) {
        if resp.error_code != error_code::NONE {
            if resp.error_code == error_code::FENCED_MEMBER_EPOCH
                || resp.error_code == error_code::UNKNOWN_MEMBER_ID
            {
                self.fenced = true;
            }
            return;
        }
        if let Some(id) = &resp.member_id {
            self.member_id = id.clone();
        }
        self.epoch = resp.member_epoch;
        if let Some(a) = &resp.assignment {
            self.owned = from_topic_partitions(a);
        }
    }

    fn step(&mut self, h: &mut H) -> ConsumerGroupHeartbeatResponse {
        let resp = h.hb(self.request());
        self.take(&resp);
        resp
    }

    fn count(&self) -> usize {
        self.owned.values().map(|s| s.len()).sum()
    }
}

fn settle(h: &mut H, clients: &mut [Client]) {
    for _ in 0..20 {
        for c in clients.iter_mut() {
            c.step(h);
        }
        if h.c.consumer_group_state(&clients[0].group) == Some(ConsumerGroupState::Stable) {
            // One more round so that every client has heard its final assignment.
            for c in clients.iter_mut() {
                c.step(h);
            }
            return;
        }
    }
    panic!("group did not settle");
}

fn assert_disjoint_cover(clients: &[Client], total: usize) {
    let mut seen = BTreeSet::new();
    for c in clients {
        for (t, ps) in &c.owned {
            for p in ps {
                assert!(seen.insert((*t, *p)), "partition {p} owned twice");
            }
        }
    }
    assert_eq!(seen.len(), total);
}

fn consumer_h() -> H {
    let mut h = H::new();
    h.c.update_topics(topics(&[("orders", 12), ("payments", 4)]));
    h
}

#[test]
fn three_members_join_and_settle_on_a_balanced_assignment() {
    let mut h = consumer_h();
    let mut clients: Vec<Client> = (0..3).map(|_| Client::new("g", &["orders"])).collect();
    let first = clients[0].step(&mut h);
    assert_eq!(first.error_code, error_code::NONE);
    assert_eq!(first.heartbeat_interval_ms, INTERVAL);
    assert_eq!(
        first.member_epoch, 1,
        "the first member bumps the group epoch to 1"
    );
    assert_eq!(clients[0].count(), 12, "a lone member gets everything");
    settle(&mut h, &mut clients);
    assert_eq!(
        clients.iter().map(Client::count).collect::<Vec<_>>(),
        vec![4, 4, 4]
    );
    assert_disjoint_cover(&clients, 12);
    let (group_epoch, assignment_epoch) = h.c.consumer_group_epochs("g").unwrap();
    assert_eq!((group_epoch, assignment_epoch), (3, 3));
    assert!(clients.iter().all(|c| c.epoch == 3));
    // Member ids are made by the coordinator in Kafka's Uuid form.
    assert!(clients.iter().all(|c| c.member_id.len() == 22));
}

#[test]
fn a_new_member_gets_a_partition_only_after_its_owner_revoked_it() {
    let mut h = consumer_h();
    let mut clients: Vec<Client> = (0..3).map(|_| Client::new("g", &["orders"])).collect();
    settle(&mut h, &mut clients);
    let before: Vec<Assignment> = clients.iter().map(|c| c.owned.clone()).collect();
    let mut d = Client::new("g", &["orders"]);
    let resp = d.step(&mut h);
    assert_eq!(resp.member_epoch, 4);
    // Every partition of its target is still owned: nothing yet.
    assert_eq!(d.count(), 0);
    let m = h.c.consumer_group_member("g", &d.member_id).unwrap();
    assert_eq!(m.state, MemberState::UnreleasedPartitions);
    assert_eq!(
        h.c.consumer_group_state("g"),
        Some(ConsumerGroupState::Reconciling)
    );
    let target = h.c.consumer_group_target("g", &d.member_id).unwrap();
    assert_eq!(target.values().map(|s| s.len()).sum::<usize>(), 3);
    // The first old member is told to revoke one partition, staying at its epoch.
    let a_before = clients[0].owned.clone();
    let resp = h.hb({
        let mut r = clients[0].request();
        r.topic_partitions = Some(to_topic_partitions(&a_before));
        r
    });
    assert_eq!(resp.member_epoch, 3);
    let shrunk = from_topic_partitions(resp.assignment.as_ref().unwrap());
    assert_eq!(shrunk.values().map(|s| s.len()).sum::<usize>(), 3);
    let m =
        h.c.consumer_group_member("g", &clients[0].member_id)
            .unwrap();
    assert_eq!(m.state, MemberState::UnrevokedPartitions);
    // Still reporting the partition: no progress, and d still does not get it.
    let again = h.hb({
        let mut r = clients[0].request();
        r.topic_partitions = Some(to_topic_partitions(&a_before));
        r
    });
    assert_eq!(again.member_epoch, 3);
    d.step(&mut h);
    assert_eq!(d.count(), 0);
    // Revoked: epoch 4; d gets it on its next heartbeat.
    clients[0].owned = shrunk;
    let resp = clients[0].step(&mut h);
    assert_eq!(resp.member_epoch, 4);
    d.step(&mut h);
    assert_eq!(d.count(), 1);
    clients.push(d);
    settle(&mut h, &mut clients);
    assert_eq!(
        clients.iter().map(Client::count).collect::<Vec<_>>(),
        vec![3, 3, 3, 3]
    );
    assert_disjoint_cover(&clients, 12);
    // Stickiness: every old member kept three of its four.
    for (c, b) in clients.iter().zip(&before) {
        let kept: usize = c
            .owned
            .iter()
            .map(|(t, s)| s.intersection(b.get(t).unwrap_or(&BTreeSet::new())).count())
            .sum();
        assert_eq!(kept, 3);
    }
}

#[test]
fn a_member_that_leaves_frees_its_partitions() {
    let mut h = consumer_h();
    let mut clients: Vec<Client> = (0..3).map(|_| Client::new("g", &["orders"])).collect();
    settle(&mut h, &mut clients);
    let leaving = clients.pop().unwrap();
    let resp = h.hb(req("g", &leaving.member_id, LEAVE_GROUP_MEMBER_EPOCH));
    assert_eq!(resp.error_code, error_code::NONE);
    assert_eq!(resp.member_epoch, LEAVE_GROUP_MEMBER_EPOCH);
    assert!(h.c.consumer_group_member("g", &leaving.member_id).is_none());
    assert_eq!(h.c.consumer_group_epochs("g"), Some((4, 3)));
    assert_eq!(
        h.c.consumer_group_state("g"),
        Some(ConsumerGroupState::Assigning)
    );
    settle(&mut h, &mut clients);
    assert_eq!(
        clients.iter().map(Client::count).collect::<Vec<_>>(),
        vec![6, 6]
    );
    // Its heartbeats are refused from now on.
    let resp = h.hb(leaving.request());
    assert_eq!(resp.error_code, error_code::UNKNOWN_MEMBER_ID);
}

#[test]
fn an_expired_session_fences_the_member() {
    let mut h = consumer_h();
    let mut clients: Vec<Client> = (0..2).map(|_| Client::new("g", &["orders"])).collect();
    settle(&mut h, &mut clients);
    // Only the first one keeps heartbeating.
    for _ in 0..10 {
        h.advance(INTERVAL as i64);
        clients[0].step(&mut h);
    }
    assert!(h
        .c
        .consumer_group_member("g", &clients[1].member_id)
        .is_none());
    assert_eq!(
        clients[0].count(),
        12,
        "the survivor took the partitions over"
    );
    let resp = h.hb(clients[1].request());
    assert_eq!(resp.error_code, error_code::UNKNOWN_MEMBER_ID);
}

#[test]
fn a_member_that_does_not_revoke_in_its_rebalance_timeout_is_fenced() {
    let mut h = consumer_h();
    let mut a = Client::new("g", &["orders"]);
    a.step(&mut h);
    assert_eq!(a.count(), 12);
    let mut b = Client::new("g", &["orders"]);
    b.step(&mut h);
    // a hears it must revoke, then heartbeats forever without revoking.
    let owned_all = a.owned.clone();
    let told = h.hb(a.request());
    assert_eq!(
        from_topic_partitions(told.assignment.as_ref().unwrap())
            .values()
            .map(|s| s.len())
            .sum::<usize>(),
        6
    );
    for _ in 0..((REBALANCE / INTERVAL) + 1) {
        h.advance(INTERVAL as i64);
        let mut r = a.request();
        r.topic_partitions = Some(to_topic_partitions(&owned_all));
        let resp = h.hb(r);
        if resp.error_code != error_code::NONE {
            assert_eq!(resp.error_code, error_code::UNKNOWN_MEMBER_ID);
            break;
        }
        b.step(&mut h);
    }
    assert!(h.c.consumer_group_member("g", &a.member_id).is_none());
    b.step(&mut h);
    b.step(&mut h);
    assert_eq!(b.count(), 12);
}

#[test]
fn epochs_that_do_not_match_are_fenced_except_a_lost_response() {
    let mut h = consumer_h();
    let mut a = Client::new("g", &["orders"]);
    a.step(&mut h);
    let mut b = Client::new("g", &["orders"]);
    b.step(&mut h);
    let mut clients = vec![a, b, Client::new("g", &["orders"])];
    settle(&mut h, &mut clients);
    let a = &clients[0];
    let m =
        h.c.consumer_group_member("g", &a.member_id)
            .unwrap()
            .clone();
    assert!(m.previous_member_epoch < m.member_epoch);
    // Greater than known.
    let mut r = a.request();
    r.member_epoch = m.member_epoch + 1;
    assert_eq!(h.hb(r).error_code, error_code::FENCED_MEMBER_EPOCH);
    // The previous epoch with a subset of the assignment: a lost response, accepted.
    let mut r = a.request();
    r.member_epoch = m.previous_member_epoch;
    let resp = h.hb(r);
    assert_eq!(resp.error_code, error_code::NONE);
    assert_eq!(resp.member_epoch, m.member_epoch);
    // The previous epoch owning something it should not: fenced.
    let mut r = a.request();
    r.member_epoch = m.previous_member_epoch;
    let mut wrong = a.owned.clone();
    wrong.entry(topic_id("payments")).or_default().insert(0);
    r.topic_partitions = Some(to_topic_partitions(&wrong));
    assert_eq!(h.hb(r).error_code, error_code::FENCED_MEMBER_EPOCH);
    // Older still: fenced.
    let mut r = a.request();
    r.member_epoch = m.previous_member_epoch - 1;
    assert_eq!(h.hb(r).error_code, error_code::FENCED_MEMBER_EPOCH);
    // Unknown member and unknown group.
    assert_eq!(
        h.hb(req("g", "nobody", 3)).error_code,
        error_code::UNKNOWN_MEMBER_ID
    );
    assert_eq!(
        h.hb(req("other", "nobody", 3)).error_code,
        error_code::GROUP_ID_NOT_FOUND
    );
    // A fenced client rejoins with its own id at epoch 0 and is reconciled afresh.
    let mut again = clients[0].clone();
    again.epoch = 0;
    again.owned.clear();
    let resp = again.step(&mut h);
    assert_eq!(resp.error_code, error_code::NONE);
    assert_eq!(again.count(), 4, "it gets its own partitions back at once");
}

#[test]
fn invalid_heartbeats_are_refused_as_kafka_refuses_them() {
    let mut h = consumer_h();
    let base = Client::new("g", &["orders"]).request();
    let mut r = base.clone();
    r.group_id.clear();
    assert_eq!(h.hb(r).error_code, error_code::INVALID_REQUEST);
    let mut r = base.clone();
    r.rebalance_timeout_ms = -1;
    assert_eq!(h.hb(r).error_code, error_code::INVALID_REQUEST);
    let mut r = base.clone();
    r.subscribed_topic_names = None;
    assert_eq!(h.hb(r).error_code, error_code::INVALID_REQUEST);
    let mut r = base.clone();
    r.member_epoch = -3;
    assert_eq!(h.hb(r).error_code, error_code::INVALID_REQUEST);
    let mut r = base.clone();
    r.server_assignor = Some("sticky".into());
    let resp = h.hb(r);
    assert_eq!(resp.error_code, error_code::UNSUPPORTED_ASSIGNOR);
    assert!(resp.error_message.unwrap().contains("uniform, range"));
    let mut r = base.clone();
    r.subscribed_topic_regex = Some("orders-(".into());
    assert_eq!(h.hb(r).error_code, error_code::INVALID_REGULAR_EXPRESSION);
    let mut r = base;
    r.member_epoch = 5;
    assert_eq!(
        h.hb(r).error_code,
        error_code::INVALID_REQUEST,
        "no member id"
    );
}

#[test]
fn the_range_assignor_when_members_ask_for_it() {
    let mut h = consumer_h();
    let mut clients: Vec<Client> = (0..2)
        .map(|_| {
            let mut c = Client::new("g", &["orders", "payments"]);
            c.assignor = Some("range".into());
            c
        })
        .collect();
    settle(&mut h, &mut clients);
    let d =
        h.c.handle_consumer_group_describe(&ConsumerGroupDescribeRequest {
            group_ids: vec!["g".into()],
        });
    assert_eq!(d.groups[0].assignor_name, "range");
    // Contiguous ranges of each topic, in member id order.
    clients.sort_by(|a, b| a.member_id.cmp(&b.member_id));
    let range = |c: &Client, t: &str| c.owned[&topic_id(t)].iter().copied().collect::<Vec<_>>();
    assert_eq!(range(&clients[0], "orders"), (0..6).collect::<Vec<_>>());
    assert_eq!(range(&clients[1], "orders"), (6..12).collect::<Vec<_>>());
    assert_eq!(range(&clients[0], "payments"), vec![0, 1]);
    assert_eq!(range(&clients[1], "payments"), vec![2, 3]);
}

#[test]
fn static_members_leave_for_now_and_come_back_to_their_partitions() {
    let mut h = consumer_h();
    let mut a = Client::new("g", &["orders"]);
    a.instance_id = Some("instance-a".into());
    let mut b = Client::new("g", &["orders"]);
    b.instance_id = Some("instance-b".into());
    let mut clients = vec![a, b];
    settle(&mut h, &mut clients);
    let (epoch_before, _) = h.c.consumer_group_epochs("g").unwrap();
    let a = clients[0].clone();
    // Another process with the same instance id while a is there.
    let mut intruder = Client::new("g", &["orders"]);
    intruder.instance_id = Some("instance-a".into());
    assert_eq!(
        h.hb(intruder.request()).error_code,
        error_code::UNRELEASED_INSTANCE_ID
    );
    // a leaves for now (-2): it stays a member, at epoch -2, keeping its partitions.
    let mut r = req("g", &a.member_id, LEAVE_GROUP_STATIC_MEMBER_EPOCH);
    r.instance_id = a.instance_id.clone();
    let resp = h.hb(r);
    assert_eq!(resp.member_epoch, LEAVE_GROUP_STATIC_MEMBER_EPOCH);
    let m = h.c.consumer_group_member("g", &a.member_id).unwrap();
    assert_eq!(m.member_epoch, LEAVE_GROUP_STATIC_MEMBER_EPOCH);
    assert_eq!(m.assigned_partitions, a.owned);
    // b does not get a's partitions meanwhile.
    clients[1].step(&mut h);
    assert_eq!(clients[1].count(), 6);
    // The restarted process: a new member id, the same instance id, the same
    // partitions at once, no new group epoch.
    let mut back = Client::new("g", &["orders"]);
    back.instance_id = Some("instance-a".into());
    back.step(&mut h);
    assert_ne!(back.member_id, a.member_id);
    assert_eq!(back.owned, a.owned);
    assert_eq!(h.c.consumer_group_epochs("g").unwrap().0, epoch_before);
    assert!(h.c.consumer_group_member("g", &a.member_id).is_none());
    // The old member id is fenced by the new one.
    let mut r = a.request();
    r.instance_id = a.instance_id.clone();
    assert_eq!(h.hb(r).error_code, error_code::FENCED_INSTANCE_ID);
    // A static member whose session ends is removed like any other.
    for _ in 0..10 {
        h.advance(INTERVAL as i64);
        clients[1].step(&mut h);
    }
    assert!(h.c.consumer_group_member("g", &back.member_id).is_none());
    assert_eq!(clients[1].count(), 12);
}

#[test]
fn regular_expressions_follow_topic_creation_and_deletion() {
    let mut h = H::new();
    h.c.update_topics(topics(&[("orders-eu", 2), ("audit", 1)]));
    let mut c = Client::new("g", &[]);
    c.regex = Some("orders-.*".into());
    c.step(&mut h);
    assert_eq!(c.count(), 2);
    assert!(c.owned.contains_key(&topic_id("orders-eu")));
    let (epoch, _) = h.c.consumer_group_epochs("g").unwrap();
    // A new topic that matches: the next heartbeat sees it, the epoch goes up.
    h.c.update_topics(topics(&[("orders-eu", 2), ("orders-us", 3), ("audit", 1)]));
    c.step(&mut h);
    assert_eq!(h.c.consumer_group_epochs("g").unwrap().0, epoch + 1);
    assert_eq!(c.count(), 5);
    // More partitions: a new target.
    h.c.update_topics(topics(&[("orders-eu", 4), ("orders-us", 3), ("audit", 1)]));
    c.step(&mut h);
    assert_eq!(c.count(), 7);
    // A deleted topic leaves the assignment.
    h.c.update_topics(topics(&[("orders-us", 3), ("audit", 1)]));
    c.step(&mut h);
    c.step(&mut h);
    assert_eq!(c.count(), 3);
    assert!(!c.owned.contains_key(&topic_id("orders-eu")));
    // Kafka matches whole names: `orders-.*` is not `xorders-1`.
    h.c.update_topics(topics(&[("orders-us", 3), ("xorders-1", 1)]));
    c.step(&mut h);
    assert_eq!(c.count(), 3);
    // A pattern new to the group is resolved one heartbeat later, as Kafka resolves
    // them in the background: the first heartbeat bumps the epoch for the subscription,
    // the next one for what the pattern matched.
    let mut d = Client::new("g", &[]);
    d.regex = Some("x.*".into());
    let (before, _) = h.c.consumer_group_epochs("g").unwrap();
    d.step(&mut h);
    assert_eq!(h.c.consumer_group_epochs("g").unwrap().0, before + 1);
    assert_eq!(
        h.c.consumer_group_target("g", &d.member_id),
        Some(Assignment::new())
    );
    c.step(&mut h);
    assert_eq!(h.c.consumer_group_epochs("g").unwrap().0, before + 2);
    let target = h.c.consumer_group_target("g", &d.member_id).unwrap();
    assert_eq!(
        target.keys().copied().collect::<Vec<_>>(),
        vec![topic_id("xorders-1")]
    );
    d.step(&mut h);
    assert_eq!(d.count(), 1);
    // A member that leaves takes its pattern with it; subscribing to it again waits for
    // it to be resolved again.
    h.hb(req("g", &d.member_id, LEAVE_GROUP_MEMBER_EPOCH));
    let mut e = Client::new("g", &[]);
    e.regex = Some("x.*".into());
    e.step(&mut h);
    assert_eq!(e.count(), 0);
    c.step(&mut h);
    e.step(&mut h);
    assert_eq!(e.count(), 1);
}

#[test]
fn replay_rebuilds_epochs_and_assignments() {
    let mut h = consumer_h();
    let mut clients: Vec<Client> = (0..3).map(|_| Client::new("g", &["orders"])).collect();
    settle(&mut h, &mut clients);
    let mut d = Client::new("g", &["orders", "payments"]);
    d.instance_id = Some("static-d".into());
    d.step(&mut h);
    clients[0].step(&mut h); // mid-rebalance: someone is revoking
    let leaving = clients.pop().unwrap();
    h.hb(req("g", &leaving.member_id, LEAVE_GROUP_MEMBER_EPOCH));
    h.commit(
        "g",
        &clients[0].member_id,
        clients[0].epoch,
        "orders",
        0,
        42,
    );

    let config = h.c.config().clone();
    let n = config.offsets_topic_num_partitions;
    let mut fresh = GroupCoordinator::new(config, 9);
    fresh.update_topics(topics(&[("orders", 12), ("payments", 4)]));
    for p in 0..n {
        fresh.load_partition_start(p);
    }
    for (p, r) in &h.log {
        fresh.replay(*p, r).unwrap();
    }
    for p in 0..n {
        fresh.load_partition_done(p, h.now);
    }
    assert_eq!(
        fresh.consumer_group_epochs("g"),
        h.c.consumer_group_epochs("g")
    );
    assert_eq!(
        fresh.consumer_group_state("g"),
        h.c.consumer_group_state("g")
    );
    let ids: Vec<String> = clients
        .iter()
        .map(|c| c.member_id.clone())
        .chain([d.member_id.clone()])
        .collect();
    for id in &ids {
        assert_eq!(
            fresh.consumer_group_member("g", id),
            h.c.consumer_group_member("g", id),
            "{id}"
        );
        assert_eq!(
            fresh.consumer_group_target("g", id),
            h.c.consumer_group_target("g", id)
        );
    }
    assert!(fresh
        .consumer_group_member("g", &leaving.member_id)
        .is_none());
    assert_eq!(fresh.committed_offsets(), h.c.committed_offsets());
    // The members carry on against the new coordinator.
    let mut h2 = H::new();
    h2.c = fresh;
    let mut all: Vec<Client> = clients.into_iter().chain([d]).collect();
    settle(&mut h2, &mut all);
    assert_disjoint_cover(&all, 16);
}

#[test]
fn answers_and_describe_wait_for_replication() {
    let mut h = consumer_h();
    h.hold_commits = true;
    let mut a = Client::new("g", &["orders"]);
    let p = h.c.partition_for("g");
    let (r1, sent) = h.send_hb(a.request());
    assert!(cgh(&sent, r1).is_none(), "held until replicated");
    let describe = |h: &H| {
        h.c.handle_consumer_group_describe(&ConsumerGroupDescribeRequest {
            group_ids: vec!["g".into()],
        })
        .groups
        .remove(0)
    };
    assert_eq!(describe(&h).error_code, error_code::GROUP_ID_NOT_FOUND);
    let listed = h.c.handle_list_groups(&ListGroupsRequest::default());
    assert!(listed.groups.is_empty());
    let end = h.end_of(p);
    let released = h.commit_up_to(p, end);
    let resp = cgh(&released, r1).unwrap();
    a.take(&resp);
    let d = describe(&h);
    assert_eq!(d.error_code, error_code::NONE);
    assert_eq!(d.group_state, "Stable");
    assert_eq!((d.group_epoch, d.assignment_epoch), (1, 1));
    assert_eq!(d.members[0].member_epoch, 1);
    assert_eq!(d.members[0].assignment[0].topic_name, "orders");
    assert_eq!(d.members[0].assignment[0].partitions.len(), 12);
    assert_eq!(d.members[0].target_assignment, d.members[0].assignment);
    // An offset commit is written but not replicated; a heartbeat that writes nothing
    // waits behind it.
    let rc = h.responder();
    let out = h.c.handle_offset_commit(
        OffsetCommitRequest {
            group_id: "g".into(),
            generation_id_or_member_epoch: a.epoch,
            member_id: a.member_id.clone(),
            group_instance_id: None,
            retention_time_ms: -1,
            topics: vec![OffsetCommitRequestTopic {
                name: "orders".into(),
                partitions: vec![OffsetCommitRequestPartition {
                    partition_index: 1,
                    committed_offset: 10,
                    committed_leader_epoch: -1,
                    committed_metadata: None,
                }],
            }],
            api_version: 9,
        },
        h.now,
        rc,
    );
    h.absorb(out);
    let before = h.end_of(p);
    let mut quiet = a.request();
    quiet.topic_partitions = None;
    let (ra, sent) = h.send_hb(quiet);
    assert_eq!(h.end_of(p), before, "the quiet heartbeat wrote nothing");
    assert!(cgh(&sent, ra).is_none(), "held behind the pending write");
    let released = h.commit_up_to(p, before);
    assert!(cgh(&released, ra).is_some());
    // A second member's join: describe sees it only once it is replicated.
    let b = Client::new("g", &["orders"]);
    let (rb, sent) = h.send_hb(b.request());
    assert!(cgh(&sent, rb).is_none());
    assert_eq!(
        describe(&h).members.len(),
        1,
        "describe sees only replicated state"
    );
    assert_eq!(describe(&h).group_epoch, 1);
    let end = h.end_of(p);
    let released = h.commit_up_to(p, end);
    assert!(cgh(&released, rb).is_some());
    let d = describe(&h);
    assert_eq!((d.members.len(), d.group_epoch), (2, 2));
    assert_eq!(d.group_state, "Reconciling");
}

#[test]
fn offset_commits_check_the_member_epoch() {
    let mut h = consumer_h();
    let mut clients: Vec<Client> = (0..2).map(|_| Client::new("g", &["orders"])).collect();
    settle(&mut h, &mut clients);
    let a = &clients[0];
    let commit = |h: &mut H, member: &str, epoch: i32, version: i16| {
        let r = h.responder();
        let out = h.c.handle_offset_commit(
            OffsetCommitRequest {
                group_id: "g".into(),
                generation_id_or_member_epoch: epoch,
                member_id: member.into(),
                group_instance_id: None,
                retention_time_ms: -1,
                topics: vec![OffsetCommitRequestTopic {
                    name: "orders".into(),
                    partitions: vec![OffsetCommitRequestPartition {
                        partition_index: 0,
                        committed_offset: 7,
                        committed_leader_epoch: -1,
                        committed_metadata: None,
                    }],
                }],
                api_version: version,
            },
            h.now,
            r,
        );
        let sent = h.absorb(out);
        sent.iter()
            .find_map(|s| match &s.response {
                Response::OffsetCommit(c) if s.responder == r => {
                    Some(c.topics[0].partitions[0].error_code)
                }
                _ => None,
            })
            .unwrap()
    };
    assert_eq!(
        commit(&mut h, &a.member_id, a.epoch - 1, 9),
        error_code::STALE_MEMBER_EPOCH
    );
    assert_eq!(
        commit(&mut h, "ghost", a.epoch, 9),
        error_code::UNKNOWN_MEMBER_ID
    );
    assert_eq!(
        commit(&mut h, &a.member_id, a.epoch, 8),
        error_code::UNSUPPORTED_VERSION
    );
    assert_eq!(
        commit(&mut h, "", -1, 9),
        error_code::UNKNOWN_MEMBER_ID,
        "group not empty"
    );
    assert_eq!(commit(&mut h, &a.member_id, a.epoch, 9), error_code::NONE);
    let fetch = |h: &H, member: Option<&str>, epoch: i32| {
        h.c.handle_offset_fetch(&OffsetFetchRequest {
            group_id: "g".into(),
            topics: None,
            require_stable: false,
            member_id: member.map(str::to_owned),
            member_epoch: epoch,
        })
    };
    let ok = fetch(&h, Some(&a.member_id), a.epoch);
    assert_eq!(ok.error_code, error_code::NONE);
    assert_eq!(ok.topics[0].partitions[0].committed_offset, 7);
    assert_eq!(fetch(&h, None, -1).error_code, error_code::NONE);
    assert_eq!(
        fetch(&h, Some(&a.member_id), a.epoch + 1).error_code,
        error_code::STALE_MEMBER_EPOCH
    );
    assert_eq!(
        fetch(&h, Some("ghost"), 1).error_code,
        error_code::UNKNOWN_MEMBER_ID
    );
}

#[test]
fn classic_and_consumer_groups_share_one_id_space() {
    let mut h = consumer_h();
    // A classic group with members whose assignments are not the consumer protocol's:
    // the consumer protocol cannot take it over (the upgrade is `migration.rs`'s).
    let (_, _gen) = h.stable_group("classic", 1);
    let c = Client::new("classic", &["orders"]);
    let resp = h.hb(c.request());
    assert_eq!(resp.error_code, error_code::GROUP_ID_NOT_FOUND);
    assert!(resp.error_message.unwrap().contains("malformed"));
    assert_eq!(h.c.group_state("classic"), Some(ClassicGroupState::Stable));
    // A consumer group with members: a classic JoinGroup of another protocol type is
    // refused; one of the consumer protocol type joins it (MEMBER_ID_REQUIRED first).
    let mut clients = vec![Client::new("modern", &["orders"])];
    settle(&mut h, &mut clients);
    let mut join = h.join_req("modern", "", consumer_protocols(&["orders"]));
    join.protocol_type = "connect".into();
    let (r, sent) = h.join_with(join);
    assert_eq!(
        join_resp(&sent, r).unwrap().error_code,
        error_code::INCONSISTENT_GROUP_PROTOCOL
    );
    let join = h.join_req("modern", "", consumer_protocols(&["orders"]));
    let (r, sent) = h.join_with(join);
    assert_eq!(
        join_resp(&sent, r).unwrap().error_code,
        error_code::MEMBER_ID_REQUIRED
    );
    // An Empty classic group (offsets only) is taken over, its offsets kept.
    h.commit("simple", "", -1, "orders", 3, 99);
    let mut s = Client::new("simple", &["orders"]);
    assert_eq!(s.step(&mut h).error_code, error_code::NONE);
    assert_eq!(h.c.group_state("simple"), None);
    let fetched = h.c.handle_offset_fetch(&OffsetFetchRequest {
        group_id: "simple".into(),
        topics: None,
        require_stable: false,
        member_id: None,
        member_epoch: -1,
    });
    assert_eq!(fetched.topics[0].partitions[0].committed_offset, 99);
    // ListGroups tells the types apart, and filters by type and state.
    let list = |types: &[&str], states: &[&str]| {
        let mut names: Vec<(String, String, String)> =
            h.c.handle_list_groups(&ListGroupsRequest {
                states_filter: states.iter().map(|s| (*s).to_owned()).collect(),
                types_filter: types.iter().map(|s| (*s).to_owned()).collect(),
            })
            .groups
            .into_iter()
            .map(|g| (g.group_id, g.group_type, g.group_state))
            .collect();
        names.sort();
        names
    };
    let consumers = list(&["Consumer"], &[]);
    assert_eq!(
        consumers.iter().map(|g| g.0.as_str()).collect::<Vec<_>>(),
        vec!["modern", "simple"]
    );
    assert!(consumers.iter().all(|g| g.1 == "consumer"));
    assert_eq!(list(&["classic"], &[]).len(), 1);
    assert_eq!(list(&[], &["stable"]).len(), 3);
    // DescribeGroups does not describe a consumer group; ConsumerGroupDescribe does
    // not describe a classic one.
    let dg = h.c.handle_describe_groups(&DescribeGroupsRequest {
        groups: vec!["modern".into()],
        api_version: 6,
    });
    assert_eq!(dg.groups[0].error_code, error_code::GROUP_ID_NOT_FOUND);
    let cd =
        h.c.handle_consumer_group_describe(&ConsumerGroupDescribeRequest {
            group_ids: vec!["classic".into()],
        });
    assert_eq!(cd.groups[0].error_code, error_code::GROUP_ID_NOT_FOUND);
    assert!(cd.groups[0]
        .error_message
        .as_deref()
        .unwrap()
        .contains("not a consumer group"));
}

#[test]
fn only_an_empty_consumer_group_can_be_deleted() {
    let mut h = consumer_h();
    let mut clients = vec![Client::new("g", &["orders"])];
    settle(&mut h, &mut clients);
    h.commit("g", &clients[0].member_id, clients[0].epoch, "orders", 0, 5);
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
        match &sent[0].response {
            Response::DeleteGroups(d) => d.results[0].error_code,
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(delete(&mut h), error_code::NON_EMPTY_GROUP);
    h.hb(req("g", &clients[0].member_id, LEAVE_GROUP_MEMBER_EPOCH));
    assert_eq!(
        h.c.consumer_group_state("g"),
        Some(ConsumerGroupState::Empty)
    );
    assert_eq!(delete(&mut h), error_code::NONE);
    assert_eq!(h.c.consumer_group_state("g"), None);
    assert!(h.c.committed_offsets().is_empty());
    // Replaying the tombstones leaves nothing either.
    let config = h.c.config().clone();
    let n = config.offsets_topic_num_partitions;
    let mut fresh = GroupCoordinator::new(config, 3);
    for p in 0..n {
        fresh.load_partition_start(p);
    }
    for (p, r) in &h.log {
        fresh.replay(*p, r).unwrap();
    }
    for p in 0..n {
        fresh.load_partition_done(p, h.now);
    }
    assert_eq!(fresh.consumer_group_state("g"), None);
    assert!(fresh.committed_offsets().is_empty());
}

#[test]
fn a_hundred_members_over_a_thousand_partitions() {
    // Not a benchmark (the 1,000 members over 10,000 partitions of BENCHMARKS.md are
    // `cargo run --release -p rill-group --example consumer_group_scale`): the group
    // settles, every partition is owned once, and every member has its share.
    let mut h = H::new();
    let names: Vec<String> = (0..10).map(|i| format!("t{i}")).collect();
    h.c.update_topics(TopicsImage::new(names.iter().map(|n| TopicImage {
        id: topic_id(n),
        name: n.clone(),
        num_partitions: 100,
    })));
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut clients: Vec<Client> = (0..100).map(|_| Client::new("big", &refs)).collect();
    for c in clients.iter_mut() {
        c.step(&mut h);
    }
    settle(&mut h, &mut clients);
    assert_disjoint_cover(&clients, 1_000);
    assert!(clients.iter().all(|c| c.count() == 10));
}
