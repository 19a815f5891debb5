//! A share group's membership (KIP-932) on the wire against a real `rill server`:
//! ShareGroupHeartbeat v1 and ShareGroupDescribe v1 built with the protocol crate's types
//! over a plain TCP connection, as a share consumer sends them (a made-up member id,
//! epoch 0 to join, the epoch it was given after), `rill group list|describe` showing
//! the group, and a `kill -9` restart replaying it. confluent-kafka's `ShareConsumer` cannot be used until ShareFetch is served
//! (it refuses a broker without it), so this is the client.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test harness: a failure is a test failure

mod support;

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use rill_protocol::generated::{
    alter_share_group_offsets_request as alt_req, delete_share_group_offsets_request as del_req,
    describe_share_group_offsets_request as desc_req,
    read_share_group_state_summary_request as sum_req,
    read_share_group_state_summary_response as sum_resp, DeleteGroupsRequest,
    FindCoordinatorRequest, RequestHeader, ShareGroupDescribeRequest, ShareGroupDescribeResponse,
    ShareGroupHeartbeatRequest, ShareGroupHeartbeatResponse,
};
use rill_protocol::{
    decode_response, encode_request_frame, ApiKey, Encodable, ErrorCode, ResponseBody, Uuid,
};
use support::{rill_json, start_server};

const SESSION_MS: u64 = 2_000;
const INTERVAL_MS: i32 = 300;

/// One connection, one request at a time.
struct Wire {
    stream: TcpStream,
    correlation_id: i32,
}

impl Wire {
    fn connect(addr: &str) -> Wire {
        let stream = TcpStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        Wire {
            stream,
            correlation_id: 0,
        }
    }

    fn call(&mut self, api: ApiKey, version: i16, body: &impl Encodable) -> ResponseBody {
        self.correlation_id += 1;
        let header = RequestHeader {
            request_api_key: api.as_i16(),
            request_api_version: version,
            correlation_id: self.correlation_id,
            client_id: Some("share-wire-test".into()),
            ..Default::default()
        };
        let mut buf = BytesMut::new();
        encode_request_frame(&mut buf, &header, body).unwrap();
        self.stream.write_all(&buf).unwrap();
        let mut size = [0u8; 4];
        self.stream.read_exact(&mut size).unwrap();
        let mut frame = vec![0u8; usize::try_from(i32::from_be_bytes(size)).unwrap()];
        self.stream.read_exact(&mut frame).unwrap();
        let (h, body) = decode_response(&mut Bytes::from(frame), api, version).unwrap();
        assert_eq!(h.correlation_id, self.correlation_id);
        body
    }

    fn heartbeat(&mut self, r: &ShareGroupHeartbeatRequest) -> ShareGroupHeartbeatResponse {
        // The coordinator's partition may still be loading right after it was made.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ResponseBody::ShareGroupHeartbeat(resp) =
                self.call(ApiKey::ShareGroupHeartbeat, 1, r)
            else {
                panic!("not a ShareGroupHeartbeat response");
            };
            let retriable = [
                ErrorCode::COORDINATOR_LOAD_IN_PROGRESS,
                ErrorCode::NOT_COORDINATOR,
                ErrorCode::COORDINATOR_NOT_AVAILABLE,
            ]
            .iter()
            .any(|c| c.code() == resp.error_code);
            if !retriable || Instant::now() > deadline {
                return resp;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// ReadShareGroupStateSummary v1 of the share coordinator (this single node), as a
    /// share-partition leader would ask it.
    fn state_summary(
        &mut self,
        group: &str,
        topic_id: Uuid,
        partitions: &[i32],
    ) -> Vec<sum_resp::PartitionResult> {
        let r = sum_req::ReadShareGroupStateSummaryRequest {
            group_id: group.into(),
            topics: vec![sum_req::ReadStateSummaryData {
                topic_id,
                partitions: partitions
                    .iter()
                    .map(|p| sum_req::PartitionData {
                        partition: *p,
                        leader_epoch: -1,
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let ResponseBody::ReadShareGroupStateSummary(resp) =
            self.call(ApiKey::ReadShareGroupStateSummary, 1, &r)
        else {
            panic!("not a ReadShareGroupStateSummary response");
        };
        let mut out: Vec<_> = resp
            .results
            .into_iter()
            .flat_map(|t| t.partitions)
            .collect();
        out.sort_by_key(|p| p.partition);
        out
    }

    fn describe(&mut self, group: &str) -> ShareGroupDescribeResponse {
        let r = ShareGroupDescribeRequest {
            group_ids: vec![group.into()],
            include_authorized_operations: true,
            ..Default::default()
        };
        let ResponseBody::ShareGroupDescribe(resp) = self.call(ApiKey::ShareGroupDescribe, 1, &r)
        else {
            panic!("not a ShareGroupDescribe response");
        };
        resp
    }
}

/// A share consumer's membership: its own member id, its epoch, what it was given.
struct Member {
    id: String,
    epoch: i32,
    assigned: BTreeSet<i32>,
    topic_id: Option<Uuid>,
}

impl Member {
    fn new(id: &str) -> Member {
        Member {
            id: id.into(),
            epoch: 0,
            assigned: BTreeSet::new(),
            topic_id: None,
        }
    }

    fn heartbeat(&mut self, wire: &mut Wire, group: &str) -> ShareGroupHeartbeatResponse {
        let r = ShareGroupHeartbeatRequest {
            group_id: group.into(),
            member_id: self.id.clone(),
            member_epoch: self.epoch,
            rack_id: None,
            subscribed_topic_names: (self.epoch == 0).then(|| vec!["orders".into()]),
            ..Default::default()
        };
        let resp = wire.heartbeat(&r);
        assert_eq!(resp.error_code, 0, "{resp:?}");
        assert_eq!(resp.member_id.as_deref(), Some(self.id.as_str()));
        assert_eq!(resp.heartbeat_interval_ms, INTERVAL_MS);
        self.epoch = resp.member_epoch;
        if let Some(a) = &resp.assignment {
            if let Some(tp) = a.topic_partitions.first() {
                self.topic_id = Some(tp.topic_id);
            }
            self.assigned = a
                .topic_partitions
                .iter()
                .flat_map(|tp| tp.partitions.iter().copied())
                .collect();
        }
        resp
    }

    /// Heartbeats until `done` holds (a few intervals at most).
    fn until(&mut self, wire: &mut Wire, group: &str, done: impl Fn(&Member) -> bool) {
        for _ in 0..50 {
            self.heartbeat(wire, group);
            if done(self) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("member {} never got there: {:?}", self.id, self.assigned);
    }
}

#[test]
fn share_group_membership_on_the_wire() {
    let mut server = start_server(&[
        "offsets.topic.num.partitions=1",
        "group.share.min.session.timeout.ms=1000",
        &format!("group.share.session.timeout.ms={SESSION_MS}"),
        "group.share.min.heartbeat.interval.ms=100",
        &format!("group.share.heartbeat.interval.ms={INTERVAL_MS}"),
    ]);
    let bootstrap = server.bootstrap.clone();
    let bootstrap = bootstrap.as_str();
    rill_json(bootstrap, &["topic", "create", "orders", "-p", "3"]);
    let mut wire = Wire::connect(bootstrap);
    // FindCoordinator makes `__consumer_offsets`; a single node coordinates every group.
    let find = FindCoordinatorRequest {
        key_type: 0,
        coordinator_keys: vec!["g".into()],
        ..Default::default()
    };
    let ResponseBody::FindCoordinator(found) = wire.call(ApiKey::FindCoordinator, 4, &find) else {
        panic!("not a FindCoordinator response");
    };
    assert!(!found.coordinators.is_empty());

    // A member id is the client's own in v1.
    let nameless = wire.heartbeat(&ShareGroupHeartbeatRequest {
        group_id: "g".into(),
        member_epoch: 0,
        subscribed_topic_names: Some(vec!["orders".into()]),
        ..Default::default()
    });
    assert_eq!(nameless.error_code, ErrorCode::INVALID_REQUEST.code());

    // One member gets every partition (once the broker has initialised their state).
    let mut a = Member::new("aaaaaaaaaaaaaaaaaaaaaa");
    let first = a.heartbeat(&mut wire, "g");
    assert!(first.member_epoch >= 1);
    a.until(&mut wire, "g", |m| m.assigned.len() == 3);
    // It got them only once the share coordinator held their state: initialised under
    // the group epoch that asked, leader epoch 0, and no start offset yet (the
    // share-partition leader applies `share.auto.offset.reset` when it loads it).
    let orders = a.topic_id.unwrap();
    for p in wire.state_summary("g", orders, &[0, 1, 2]) {
        assert_eq!(p.error_code, 0, "{p:?}");
        assert!(
            (1..=a.epoch).contains(&p.state_epoch),
            "{p:?} at epoch {}",
            a.epoch
        );
        assert_eq!((p.leader_epoch, p.start_offset), (0, -1), "{p:?}");
    }
    // A group that never asked has none.
    let none = wire.state_summary("nobody", orders, &[0]);
    assert_eq!((none[0].state_epoch, none[0].leader_epoch), (0, -1));

    // A second member gets its share at once; the first gives up the rest at its next
    // heartbeat.
    let mut b = Member::new("bbbbbbbbbbbbbbbbbbbbbb");
    b.until(&mut wire, "g", |m| !m.assigned.is_empty());
    a.until(&mut wire, "g", |m| m.assigned.len() < 3);
    assert!(a.assigned.is_disjoint(&b.assigned));
    assert_eq!(a.assigned.len() + b.assigned.len(), 3);

    // ShareGroupDescribe and the CLI see both.
    let described = wire.describe("g");
    let g = &described.groups[0];
    assert_eq!(g.error_code, 0, "{g:?}");
    assert_eq!(
        (g.group_state.as_str(), g.assignor_name.as_str()),
        ("Stable", "simple")
    );
    assert_eq!(g.members.len(), 2);
    assert_ne!(g.authorized_operations, i32::MIN, "asked for, so given");
    let listed = rill_json(bootstrap, &["group", "list"]);
    let entry = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["group"] == "g")
        .unwrap_or_else(|| panic!("g not listed: {listed}"));
    assert_eq!(entry["type"], "share");
    assert_eq!(entry["protocol_type"], "share");
    assert_eq!(entry["state"], "Stable");
    let describe = rill_json(bootstrap, &["group", "describe", "g"]);
    let d = &describe[0];
    assert_eq!(d["type"], "share");
    assert_eq!(d["assignor"], "simple");
    let members = d["members"].as_array().unwrap();
    assert_eq!(members.len(), 2);
    let listed_partitions: usize = members
        .iter()
        .flat_map(|m| m["assignment"].as_array().unwrap())
        .filter(|t| t["topic"] == "orders")
        .map(|t| t["partitions"].as_array().unwrap().len())
        .sum();
    assert_eq!(listed_partitions, 3, "{describe}");

    // A restart (kill -9) replays the group from `__consumer_offsets`: the same epochs,
    // members and assignments, and the members carry on where they were.
    let before = wire.describe("g").groups.remove(0);
    server.restart();
    let mut wire = Wire::connect(bootstrap);
    let deadline = Instant::now() + Duration::from_secs(30);
    let after = loop {
        let g = wire.describe("g").groups.remove(0);
        if g.error_code == 0 || Instant::now() > deadline {
            break g;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(after, before);
    let epochs = (a.epoch, b.epoch);
    a.heartbeat(&mut wire, "g");
    b.heartbeat(&mut wire, "g");
    assert_eq!((a.epoch, b.epoch), epochs);

    // The admin client's DescribeGroups falls back to ShareGroupDescribe (the console
    // shows groups through it).
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let described = runtime.block_on(async {
        let admin = rill_client::Admin::new(rill_client::ClientConfig::new(bootstrap)).unwrap();
        admin.describe_groups(&["g".to_owned()]).await.unwrap()
    });
    assert_eq!(described[0].protocol_type, "share");
    assert_eq!(described[0].state, "Stable");
    assert_eq!(described[0].members.len(), 2);

    // The second member goes silent: its session ends and the first gets everything.
    let silent_from = Instant::now();
    a.until(&mut wire, "g", |m| m.assigned.len() == 3);
    assert!(silent_from.elapsed() >= Duration::from_millis(SESSION_MS / 2));
    let gone = wire.heartbeat(&ShareGroupHeartbeatRequest {
        group_id: "g".into(),
        member_id: b.id.clone(),
        member_epoch: b.epoch,
        ..Default::default()
    });
    assert_eq!(gone.error_code, ErrorCode::UNKNOWN_MEMBER_ID.code());

    // An epoch from the future is fenced.
    let fenced = wire.heartbeat(&ShareGroupHeartbeatRequest {
        group_id: "g".into(),
        member_id: a.id.clone(),
        member_epoch: a.epoch + 5,
        ..Default::default()
    });
    assert_eq!(fenced.error_code, ErrorCode::FENCED_MEMBER_EPOCH.code());

    // Leaving: epoch -1, and the group is Empty.
    let left = wire.heartbeat(&ShareGroupHeartbeatRequest {
        group_id: "g".into(),
        member_id: a.id.clone(),
        member_epoch: -1,
        ..Default::default()
    });
    assert_eq!((left.error_code, left.member_epoch), (0, -1));
    assert_eq!(wire.describe("g").groups[0].group_state, "Empty");

    // A classic group's id (offsets committed by the CLI) is not a share group's.
    rill_json(
        bootstrap,
        &[
            "group",
            "reset-offsets",
            "classic",
            "--topic",
            "orders",
            "--to-earliest",
        ],
    );
    let other = wire.heartbeat(&ShareGroupHeartbeatRequest {
        group_id: "classic".into(),
        member_id: "cccccccccccccccccccccc".into(),
        member_epoch: 0,
        subscribed_topic_names: Some(vec!["orders".into()]),
        ..Default::default()
    });
    assert_eq!(other.error_code, ErrorCode::GROUP_ID_NOT_FOUND.code());
    assert_eq!(
        other.error_message.as_deref(),
        Some("Group classic is not a share group.")
    );
}

/// Polls `f` until it returns `Some`, for at most ten seconds (ACLs reach the broker
/// through the metadata log).
fn eventually<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "never: {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn share_group_apis_are_authorized_as_kafka_authorizes_them() {
    let server = start_server(&[
        "offsets.topic.num.partitions=1",
        "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        // The PLAINTEXT principal (User:ANONYMOUS) may do what no ACL speaks of.
        "allow.everyone.if.no.acl.found=true",
        &format!("group.share.heartbeat.interval.ms={INTERVAL_MS}"),
        "group.share.min.heartbeat.interval.ms=100",
    ]);
    let bootstrap = server.bootstrap.as_str();
    rill_json(bootstrap, &["topic", "create", "orders", "-p", "1"]);
    rill_json(bootstrap, &["topic", "create", "secret", "-p", "1"]);
    let mut wire = Wire::connect(bootstrap);
    let find = FindCoordinatorRequest {
        key_type: 0,
        coordinator_keys: vec!["g".into()],
        ..Default::default()
    };
    wire.call(ApiKey::FindCoordinator, 4, &find);
    let join = |group: &str, member: &str, topics: &[&str]| ShareGroupHeartbeatRequest {
        group_id: group.into(),
        member_id: member.into(),
        member_epoch: 0,
        subscribed_topic_names: Some(topics.iter().map(|t| (*t).to_owned()).collect()),
        ..Default::default()
    };
    assert_eq!(
        wire.heartbeat(&join("g", "m1", &["orders", "secret"]))
            .error_code,
        0
    );
    assert_eq!(
        wire.heartbeat(&join("open", "m2", &["orders"])).error_code,
        0
    );
    assert_eq!(wire.describe("g").groups[0].error_code, 0);

    for args in [
        ["--topic", "secret", "--operation", "Describe"],
        ["--group", "locked", "--operation", "All"],
    ] {
        let mut cmd = vec!["acl", "add", "--deny-principal", "User:ANONYMOUS"];
        cmd.extend(args);
        rill_json(bootstrap, &cmd);
    }
    // A group that uses a topic the client may not describe is not shown.
    let hidden = eventually("the topic ACL applies", || {
        let g = wire.describe("g").groups.remove(0);
        (g.error_code != 0).then_some(g)
    });
    assert_eq!(
        hidden.error_code,
        ErrorCode::TOPIC_AUTHORIZATION_FAILED.code()
    );
    assert!(hidden.members.is_empty());
    let open = wire.describe("open").groups.remove(0);
    assert_eq!((open.error_code, open.members.len()), (0, 1));
    // Nor may a member subscribe to it.
    let refused = wire.heartbeat(&join("g", "m3", &["orders", "secret"]));
    assert_eq!(
        refused.error_code,
        ErrorCode::TOPIC_AUTHORIZATION_FAILED.code()
    );
    // A group the client may not read or describe.
    let locked = eventually("the group ACL applies", || {
        let r = wire.heartbeat(&join("locked", "m4", &["orders"]));
        (r.error_code != 0).then_some(r)
    });
    assert_eq!(
        locked.error_code,
        ErrorCode::GROUP_AUTHORIZATION_FAILED.code()
    );
    let d = wire.describe("locked").groups.remove(0);
    assert_eq!(d.error_code, ErrorCode::GROUP_AUTHORIZATION_FAILED.code());
}

/// `(partition, start offset, lag)` of every partition DescribeShareGroupOffsets v1
/// shows for the group's topic `orders` (all its initialised partitions when `topics` is
/// None).
fn share_offsets(wire: &mut Wire, group: &str, partitions: Option<&[i32]>) -> Vec<(i32, i64, i64)> {
    let r = desc_req::DescribeShareGroupOffsetsRequest {
        groups: vec![desc_req::DescribeShareGroupOffsetsRequestGroup {
            group_id: group.into(),
            topics: partitions.map(|ps| {
                vec![desc_req::DescribeShareGroupOffsetsRequestTopic {
                    topic_name: "orders".into(),
                    partitions: ps.to_vec(),
                    ..Default::default()
                }]
            }),
            ..Default::default()
        }],
        ..Default::default()
    };
    let ResponseBody::DescribeShareGroupOffsets(resp) =
        wire.call(ApiKey::DescribeShareGroupOffsets, 1, &r)
    else {
        panic!("not a DescribeShareGroupOffsets response");
    };
    let g = &resp.groups[0];
    assert_eq!(g.error_code, 0, "{g:?}");
    let mut out: Vec<_> = g
        .topics
        .iter()
        .filter(|t| t.topic_name == "orders")
        .flat_map(|t| t.partitions.iter())
        .map(|p| (p.partition_index, p.start_offset, p.lag))
        .collect();
    out.sort();
    out
}

#[test]
fn share_group_offsets_are_described_altered_and_deleted_and_groups_deleted_with_their_state() {
    let server = start_server(&[
        "offsets.topic.num.partitions=1",
        &format!("group.share.heartbeat.interval.ms={INTERVAL_MS}"),
        "group.share.min.heartbeat.interval.ms=100",
    ]);
    let bootstrap = server.bootstrap.as_str();
    rill_json(bootstrap, &["topic", "create", "orders", "-p", "3"]);
    let mut wire = Wire::connect(bootstrap);
    let find = FindCoordinatorRequest {
        key_type: 0,
        coordinator_keys: vec!["s".into()],
        ..Default::default()
    };
    wire.call(ApiKey::FindCoordinator, 4, &find);
    let mut a = Member::new("aaaaaaaaaaaaaaaaaaaaaa");
    a.until(&mut wire, "s", |m| m.assigned.len() == 3);
    let orders = a.topic_id.unwrap();
    // Initialised by the heartbeat without a start offset: -1, and so no lag yet.
    assert_eq!(
        share_offsets(&mut wire, "s", None),
        vec![(0, -1, -1), (1, -1, -1), (2, -1, -1)]
    );

    let alter = |wire: &mut Wire, topics: Vec<(&str, Vec<(i32, i64)>)>| {
        let r = alt_req::AlterShareGroupOffsetsRequest {
            group_id: "s".into(),
            topics: topics
                .into_iter()
                .map(|(t, ps)| alt_req::AlterShareGroupOffsetsRequestTopic {
                    topic_name: t.into(),
                    partitions: ps
                        .into_iter()
                        .map(|(p, o)| alt_req::AlterShareGroupOffsetsRequestPartition {
                            partition_index: p,
                            start_offset: o,
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        let ResponseBody::AlterShareGroupOffsets(resp) =
            wire.call(ApiKey::AlterShareGroupOffsets, 0, &r)
        else {
            panic!("not an AlterShareGroupOffsets response");
        };
        resp
    };
    let delete_group = |wire: &mut Wire| {
        let r = DeleteGroupsRequest {
            groups_names: vec!["s".into()],
            ..Default::default()
        };
        let ResponseBody::DeleteGroups(resp) = wire.call(ApiKey::DeleteGroups, 2, &r) else {
            panic!("not a DeleteGroups response");
        };
        resp.results[0].error_code
    };
    // Only an empty group's offsets may change, and only an empty group may go.
    let busy = alter(&mut wire, vec![("orders", vec![(0, 5)])]);
    assert_eq!(busy.error_code, ErrorCode::NON_EMPTY_GROUP.code());
    assert_eq!(delete_group(&mut wire), ErrorCode::NON_EMPTY_GROUP.code());
    let left = wire.heartbeat(&ShareGroupHeartbeatRequest {
        group_id: "s".into(),
        member_id: a.id.clone(),
        member_epoch: -1,
        ..Default::default()
    });
    assert_eq!(left.error_code, 0);

    let altered = alter(
        &mut wire,
        vec![
            ("orders", vec![(0, 5), (1, 0), (7, 1)]),
            ("ghost", vec![(0, 1)]),
        ],
    );
    assert_eq!(altered.error_code, 0, "{altered:?}");
    let codes: Vec<(String, i32, i16)> = altered
        .responses
        .iter()
        .flat_map(|t| {
            t.partitions
                .iter()
                .map(move |p| (t.topic_name.clone(), p.partition_index, p.error_code))
        })
        .collect();
    let unknown = ErrorCode::UNKNOWN_TOPIC_OR_PARTITION.code();
    assert_eq!(
        codes,
        vec![
            ("orders".into(), 0, 0),
            ("orders".into(), 1, 0),
            ("orders".into(), 7, unknown),
            ("ghost".into(), 0, unknown)
        ]
    );
    assert_eq!(altered.responses[0].topic_id, orders);
    // The share coordinator holds the new start offsets; nothing is produced, so the
    // high watermark (0) leaves no lag.
    assert_eq!(
        share_offsets(&mut wire, "s", Some(&[0, 1, 2])),
        vec![(0, 5, 0), (1, 0, 0), (2, -1, -1)]
    );
    let summary = wire.state_summary("s", orders, &[0]);
    assert_eq!(summary[0].start_offset, 5);

    // DeleteShareGroupOffsets removes the topic's state; a topic without any is refused.
    let r = del_req::DeleteShareGroupOffsetsRequest {
        group_id: "s".into(),
        topics: vec![
            del_req::DeleteShareGroupOffsetsRequestTopic {
                topic_name: "orders".into(),
                ..Default::default()
            },
            del_req::DeleteShareGroupOffsetsRequestTopic {
                topic_name: "ghost".into(),
                ..Default::default()
            },
        ],
        ..Default::default()
    };
    let ResponseBody::DeleteShareGroupOffsets(deleted) =
        wire.call(ApiKey::DeleteShareGroupOffsets, 0, &r)
    else {
        panic!("not a DeleteShareGroupOffsets response");
    };
    assert_eq!(deleted.error_code, 0, "{deleted:?}");
    let codes: Vec<(&str, i16)> = deleted
        .responses
        .iter()
        .map(|t| (t.topic_name.as_str(), t.error_code))
        .collect();
    assert_eq!(codes, vec![("orders", 0), ("ghost", unknown)]);
    assert!(share_offsets(&mut wire, "s", None).is_empty());
    let gone = wire.state_summary("s", orders, &[0, 1, 2]);
    assert!(gone.iter().all(|p| p.leader_epoch == -1), "{gone:?}");

    // A member comes back (its partitions initialised again), leaves, and the group is
    // deleted with its share-partition state.
    let mut b = Member::new("bbbbbbbbbbbbbbbbbbbbbb");
    b.until(&mut wire, "s", |m| m.assigned.len() == 3);
    assert!(wire
        .state_summary("s", orders, &[0, 1, 2])
        .iter()
        .all(|p| p.leader_epoch == 0));
    wire.heartbeat(&ShareGroupHeartbeatRequest {
        group_id: "s".into(),
        member_id: b.id.clone(),
        member_epoch: -1,
        ..Default::default()
    });
    assert_eq!(delete_group(&mut wire), 0);
    let gone = wire.state_summary("s", orders, &[0, 1, 2]);
    assert!(gone.iter().all(|p| p.leader_epoch == -1), "{gone:?}");
    assert_eq!(
        wire.describe("s").groups[0].error_code,
        ErrorCode::GROUP_ID_NOT_FOUND.code()
    );
}
