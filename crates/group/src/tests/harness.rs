//! A test driver: a coordinator owning every partition, a clock, and helpers that send
//! requests and pick responses out of the outputs.

use std::collections::BTreeMap;

use bytes::Bytes;

use rill_protocol::Uuid;

use crate::*;

pub(crate) const SESSION_MS: i32 = 10_000;
pub(crate) const REBALANCE_MS: i32 = 60_000;

/// A write's (partition, end offset) pairs and the responses that wait for them.
type HeldWrite = (Vec<(i32, i64)>, Vec<Respond>);

pub(crate) struct H {
    pub c: GroupCoordinator,
    pub now: i64,
    next: u64,
    /// Every record persisted so far, in order.
    pub log: Vec<(i32, Record)>,
    /// The offset of each record of `log` in its partition.
    pub log_offsets: Vec<i64>,
    /// Each partition's log end offset.
    pub log_end: BTreeMap<i32, i64>,
    /// Each partition's high watermark, moved by `commit_up_to`.
    pub hw: BTreeMap<i32, i64>,
    /// While set, writes stay above the high watermark (their responses held) until
    /// `commit_up_to` passes them, as when the followers cannot fetch; otherwise every
    /// write is replicated at once.
    pub hold_commits: bool,
    /// Responses of held writes, with the (partition, end offset) each waits for.
    held: Vec<HeldWrite>,
    /// Every response sent so far.
    pub sent: Vec<Respond>,
    /// While set, share groups' InitializeShareGroupState asks are answered at once (as
    /// the broker shell does until the share coordinator exists); otherwise they queue
    /// in `initialize_asks`.
    pub auto_initialize: bool,
    /// (group id, group epoch, partitions) of each ask not answered.
    pub initialize_asks: Vec<(String, i32, Vec<ShareTopicPartitions>)>,
}

/// A topic id made from the name, so that tests can name ids.
pub(crate) fn topic_id(name: &str) -> Uuid {
    let mut b = [0u8; 16];
    for (i, c) in name.bytes().enumerate() {
        b[i % 16] ^= c.wrapping_add(i as u8);
    }
    b[15] ^= 0x5a;
    Uuid(b)
}

pub(crate) fn topics(list: &[(&str, i32)]) -> TopicsImage {
    TopicsImage::new(list.iter().map(|(n, p)| TopicImage {
        id: topic_id(n),
        name: (*n).to_owned(),
        num_partitions: *p,
    }))
}

pub(crate) fn consumer_protocols(topics: &[&str]) -> Vec<(String, Bytes)> {
    vec![
        ("range".to_owned(), encode_subscription(topics)),
        ("roundrobin".to_owned(), encode_subscription(topics)),
    ]
}

impl H {
    pub fn new() -> H {
        H::with_config(GroupConfig::default())
    }

    pub fn with_config(config: GroupConfig) -> H {
        let n = config.offsets_topic_num_partitions;
        let mut c = GroupCoordinator::new(config, 42);
        for p in 0..n {
            c.load_partition_start(p);
            c.load_partition_done(p, 0);
        }
        H {
            c,
            now: 0,
            next: 0,
            log: Vec::new(),
            log_offsets: Vec::new(),
            log_end: BTreeMap::new(),
            hw: BTreeMap::new(),
            hold_commits: false,
            held: Vec::new(),
            sent: Vec::new(),
            auto_initialize: true,
            initialize_asks: Vec::new(),
        }
    }

    pub fn responder(&mut self) -> u64 {
        self.next += 1;
        self.next
    }

    pub fn absorb(&mut self, outputs: Vec<Output>) -> Vec<Respond> {
        let mut out = Vec::new();
        // Answers of nested calls, already in `sent`.
        let mut nested = Vec::new();
        for o in outputs {
            match o {
                Output::Respond(r) => out.push(r),
                Output::InitializeShareGroupState {
                    group_id,
                    group_epoch,
                    topics,
                } => {
                    if self.auto_initialize {
                        let more = self
                            .c
                            .share_group_state_initialized(&group_id, &topics, self.now);
                        nested.extend(self.absorb(more));
                    } else {
                        self.initialize_asks.push((group_id, group_epoch, topics));
                    }
                }
                Output::Persist {
                    write,
                    records,
                    responses,
                }
                | Output::PersistTransactional {
                    write,
                    records,
                    responses,
                    ..
                } => {
                    let mut ends: BTreeMap<i32, i64> = BTreeMap::new();
                    for (p, r) in records {
                        let end = self.log_end.entry(p).or_insert(0);
                        self.log_offsets.push(*end);
                        *end += 1;
                        ends.insert(p, *end);
                        self.log.push((p, r));
                    }
                    for (p, end) in &ends {
                        self.c.appended(write, *p, *end);
                    }
                    if self.hold_commits {
                        self.held.push((ends.into_iter().collect(), responses));
                    } else {
                        for (p, end) in ends {
                            self.hw.insert(p, end);
                            self.c.commit_up_to(p, end);
                        }
                        out.extend(responses);
                        out.extend(self.released());
                    }
                }
            }
        }
        self.sent.extend(out.iter().cloned());
        out.extend(nested);
        out
    }

    /// The high watermark of `partition` reaches `offset` (capped at its log end): the
    /// coordinator hears of it, then the held responses whose writes are all below their
    /// partitions' high watermarks are sent, as the broker does.
    pub fn commit_up_to(&mut self, partition: i32, offset: i64) -> Vec<Respond> {
        let end = self.log_end.get(&partition).copied().unwrap_or(0);
        let hw = self.hw.entry(partition).or_insert(0);
        *hw = (*hw).max(offset.min(end));
        let hw = *hw;
        self.c.commit_up_to(partition, hw);
        let mut out = self.released();
        let held = std::mem::take(&mut self.held);
        for (ends, responses) in held {
            if ends
                .iter()
                .all(|(p, end)| self.hw.get(p).copied().unwrap_or(0) >= *end)
            {
                out.extend(responses);
            } else {
                self.held.push((ends, responses));
            }
        }
        self.sent.extend(out.iter().cloned());
        out
    }

    /// Answers the coordinator released at the last `commit_up_to`.
    fn released(&mut self) -> Vec<Respond> {
        self.c
            .take_released()
            .into_iter()
            .filter_map(|o| match o {
                Output::Respond(r) => Some(r),
                _ => None,
            })
            .collect()
    }

    /// The log end offset of `partition`.
    pub fn end_of(&self, partition: i32) -> i64 {
        self.log_end.get(&partition).copied().unwrap_or(0)
    }

    pub fn advance(&mut self, ms: i64) -> Vec<Respond> {
        self.now += ms;
        let out = self.c.tick(self.now);
        self.absorb(out)
    }

    /// Advances the clock to `t` firing every deadline on the way, in order.
    pub fn advance_to(&mut self, t: i64) -> Vec<Respond> {
        let mut all = Vec::new();
        while let Some(d) = self.c.next_deadline() {
            if d > t {
                break;
            }
            self.now = self.now.max(d);
            let out = self.c.tick(self.now);
            all.extend(self.absorb(out));
        }
        self.now = t;
        all
    }

    /// Advances by initial delays (which extend while members arrive) until every
    /// given JoinGroup is answered; returns what was sent meanwhile.
    pub fn finish_initial(&mut self, responders: &[u64]) -> Vec<Respond> {
        let delay = i64::from(self.c.config().group_initial_rebalance_delay_ms);
        let mut sent = Vec::new();
        for _ in 0..100 {
            sent.extend(self.advance(delay));
            if responders.iter().all(|r| join_resp(&sent, *r).is_some()) {
                break;
            }
        }
        sent
    }

    pub fn join_req(
        &self,
        group: &str,
        member_id: &str,
        protocols: Vec<(String, Bytes)>,
    ) -> JoinGroupRequest {
        JoinGroupRequest {
            group_id: group.to_owned(),
            session_timeout_ms: SESSION_MS,
            rebalance_timeout_ms: REBALANCE_MS,
            member_id: member_id.to_owned(),
            group_instance_id: None,
            protocol_type: "consumer".to_owned(),
            protocols,
            reason: None,
            client_id: "client".to_owned(),
            client_host: "/127.0.0.1".to_owned(),
            api_version: 9,
        }
    }

    /// Sends a JoinGroup; returns its responder and whatever was answered now.
    pub fn join_with(&mut self, req: JoinGroupRequest) -> (u64, Vec<Respond>) {
        let r = self.responder();
        let out = self.c.handle_join(req, self.now, r);
        let sent = self.absorb(out);
        (r, sent)
    }

    /// First JoinGroup (v4+): returns the member id from MEMBER_ID_REQUIRED.
    pub fn member_id_for(&mut self, group: &str) -> String {
        let req = self.join_req(group, "", consumer_protocols(&["t"]));
        let (r, sent) = self.join_with(req);
        let resp = join_resp(&sent, r).expect("answered at once");
        assert_eq!(resp.error_code, error_code::MEMBER_ID_REQUIRED);
        assert!(resp.member_id.starts_with("client-"));
        resp.member_id
    }

    /// Gets a member id and joins with it (the JoinGroup is usually parked).
    pub fn new_member(&mut self, group: &str, topics: &[&str]) -> (String, u64) {
        let id = self.member_id_for(group);
        let req = self.join_req(group, &id, consumer_protocols(topics));
        let (r, _) = self.join_with(req);
        (id, r)
    }

    pub fn sync(
        &mut self,
        group: &str,
        member: &str,
        generation: i32,
        assignments: Vec<(String, Bytes)>,
    ) -> (u64, Vec<Respond>) {
        let r = self.responder();
        let out = self.c.handle_sync(
            SyncGroupRequest {
                group_id: group.to_owned(),
                generation_id: generation,
                member_id: member.to_owned(),
                group_instance_id: None,
                protocol_type: Some("consumer".to_owned()),
                protocol_name: None,
                assignments,
            },
            self.now,
            r,
        );
        let sent = self.absorb(out);
        (r, sent)
    }

    pub fn heartbeat(&mut self, group: &str, member: &str, generation: i32) -> i16 {
        self.c
            .handle_heartbeat(
                HeartbeatRequest {
                    group_id: group.to_owned(),
                    generation_id: generation,
                    member_id: member.to_owned(),
                    group_instance_id: None,
                },
                self.now,
            )
            .error_code
    }

    pub fn leave(
        &mut self,
        group: &str,
        members: Vec<MemberIdentity>,
    ) -> (LeaveGroupResponse, Vec<Respond>) {
        let r = self.responder();
        let out = self.c.handle_leave(
            LeaveGroupRequest {
                group_id: group.to_owned(),
                members,
            },
            self.now,
            r,
        );
        let sent = self.absorb(out);
        let resp = sent
            .iter()
            .find_map(|s| match &s.response {
                Response::LeaveGroup(l) if s.responder == r => Some(l.clone()),
                _ => None,
            })
            .expect("leave answered");
        (resp, sent)
    }

    pub fn commit(
        &mut self,
        group: &str,
        member: &str,
        generation: i32,
        topic: &str,
        partition: i32,
        offset: i64,
    ) -> i16 {
        let r = self.commit_unanswered(group, member, generation, topic, partition, offset);
        self.commit_answer(r).expect("answered")
    }

    /// The error code of OffsetCommit `responder`, once answered.
    pub fn commit_answer(&self, responder: u64) -> Option<i16> {
        self.sent
            .iter()
            .rev()
            .find(|s| s.responder == responder)
            .map(|s| match &s.response {
                Response::OffsetCommit(c) => c.topics[0].partitions[0].error_code,
                other => panic!("unexpected {other:?}"),
            })
    }

    /// Sends an OffsetCommit as a member without waiting for an answer (which a held
    /// write keeps back); returns its responder.
    pub fn commit_unanswered(
        &mut self,
        group: &str,
        member: &str,
        generation: i32,
        topic: &str,
        partition: i32,
        offset: i64,
    ) -> u64 {
        let r = self.responder();
        let out = self.c.handle_offset_commit(
            OffsetCommitRequest {
                group_id: group.to_owned(),
                generation_id_or_member_epoch: generation,
                member_id: member.to_owned(),
                group_instance_id: None,
                retention_time_ms: -1,
                topics: vec![OffsetCommitRequestTopic {
                    name: topic.to_owned(),
                    partitions: vec![OffsetCommitRequestPartition {
                        partition_index: partition,
                        committed_offset: offset,
                        committed_leader_epoch: 5,
                        committed_metadata: Some("meta".to_owned()),
                    }],
                }],
                api_version: 8,
            },
            self.now,
            r,
        );
        self.absorb(out);
        r
    }

    pub fn fetch(&self, group: &str, topic: &str, partition: i32) -> (i64, i32, Option<String>) {
        let resp = self.c.handle_offset_fetch(&OffsetFetchRequest {
            group_id: group.to_owned(),
            topics: Some(vec![OffsetFetchRequestTopic {
                name: topic.to_owned(),
                partition_indexes: vec![partition],
            }]),
            require_stable: false,
            member_id: None,
            member_epoch: -1,
        });
        assert_eq!(resp.error_code, error_code::NONE);
        let p = &resp.topics[0].partitions[0];
        (
            p.committed_offset,
            p.committed_leader_epoch,
            p.metadata.clone(),
        )
    }

    pub fn state(&self, group: &str) -> Option<ClassicGroupState> {
        self.c.group_state(group)
    }

    /// Runs a whole first rebalance for `n` members; returns their ids (leader first)
    /// and the generation.
    pub fn stable_group(&mut self, group: &str, n: usize) -> (Vec<String>, i32) {
        let mut members = Vec::new();
        for _ in 0..n {
            members.push(self.new_member(group, &["t"]));
        }
        let responders: Vec<u64> = members.iter().map(|(_, r)| *r).collect();
        let sent = self.finish_initial(&responders);
        let mut generation = -1;
        for (id, r) in &members {
            let j = join_resp(&sent, *r).expect("join answered");
            assert_eq!(j.error_code, error_code::NONE);
            assert_eq!(&j.member_id, id);
            generation = j.generation_id;
        }
        let leader = members[0].0.clone();
        let ids: Vec<String> = members.iter().map(|(id, _)| id.clone()).collect();
        for id in ids.iter().skip(1) {
            self.sync(group, id, generation, vec![]);
        }
        let assignments = ids
            .iter()
            .map(|id| (id.clone(), Bytes::from(format!("assign-{id}"))))
            .collect();
        self.sync(group, &leader, generation, assignments);
        assert_eq!(self.state(group), Some(ClassicGroupState::Stable));
        (ids, generation)
    }
}

pub(crate) fn join_resp(sent: &[Respond], responder: u64) -> Option<JoinGroupResponse> {
    sent.iter().find_map(|s| match &s.response {
        Response::JoinGroup(j) if s.responder == responder => Some(j.clone()),
        _ => None,
    })
}

pub(crate) fn sync_resp(sent: &[Respond], responder: u64) -> Option<SyncGroupResponse> {
    sent.iter().find_map(|s| match &s.response {
        Response::SyncGroup(j) if s.responder == responder => Some(j.clone()),
        _ => None,
    })
}

pub(crate) fn identity(member_id: &str) -> MemberIdentity {
    MemberIdentity {
        member_id: member_id.to_owned(),
        group_instance_id: None,
        reason: None,
    }
}
