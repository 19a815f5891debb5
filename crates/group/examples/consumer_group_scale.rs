//! How long the consumer group state machine takes, and how much memory it holds, for a
//! group of 1,000 members over 10,000 partitions (issue #20's figure):
//! `cargo run --release -p rill-group --example consumer_group_scale [members] [partitions]`.
//!
//! The members join one heartbeat each (every join runs the `uniform` assignor over the
//! whole group), then heartbeat round after round, reporting what they own and revoking
//! at once, until the group is Stable; then one more member joins the settled group and
//! the group settles again. Every write is taken as replicated at once, as the unit
//! tests' harness does. Memory is the process's resident set (`/proc/self/status`).

use std::time::Instant;

use rill_group::*;
use rill_protocol::Uuid;

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

struct Member {
    id: String,
    epoch: i32,
    owned: Assignment,
}

struct Driver {
    c: GroupCoordinator,
    now: i64,
    responder: u64,
    end: std::collections::BTreeMap<i32, i64>,
    topics: Vec<String>,
    heartbeats: u64,
}

impl Driver {
    fn heartbeat(&mut self, m: &mut Member) {
        self.responder += 1;
        let join = m.epoch == 0;
        let req = ConsumerGroupHeartbeatRequest {
            group_id: "big".into(),
            member_id: m.id.clone(),
            member_epoch: m.epoch,
            instance_id: None,
            rack_id: None,
            rebalance_timeout_ms: if join { 60_000 } else { -1 },
            subscribed_topic_names: join.then(|| self.topics.clone()),
            subscribed_topic_regex: None,
            server_assignor: None,
            topic_partitions: Some(to_topic_partitions(&m.owned)),
            client_id: "scale".into(),
            client_host: "/127.0.0.1".into(),
            session_timeout_ms: 45_000,
            heartbeat_interval_ms: 5_000,
        };
        self.heartbeats += 1;
        let out = self
            .c
            .handle_consumer_group_heartbeat(req, self.now, self.responder);
        let mut responses = Vec::new();
        for o in out {
            match o {
                Output::Respond(r) => responses.push(r),
                Output::Persist {
                    write,
                    records,
                    responses: held,
                } => {
                    let mut ends = std::collections::BTreeMap::new();
                    for (p, _) in &records {
                        let e = self.end.entry(*p).or_insert(0);
                        *e += 1;
                        ends.insert(*p, *e);
                    }
                    for (p, e) in ends {
                        self.c.appended(write, p, e);
                        self.c.commit_up_to(p, e);
                    }
                    responses.extend(held);
                    for r in self.c.take_released() {
                        if let Output::Respond(r) = r {
                            responses.push(r);
                        }
                    }
                }
                Output::PersistTransactional { .. } | Output::InitializeShareGroupState { .. } => {}
            }
        }
        for r in responses {
            if let Response::ConsumerGroupHeartbeat(resp) = r.response {
                assert_eq!(resp.error_code, 0, "{:?}", resp.error_message);
                if let Some(id) = resp.member_id {
                    m.id = id;
                }
                m.epoch = resp.member_epoch;
                if let Some(a) = resp.assignment {
                    m.owned = from_topic_partitions(&a);
                }
            }
        }
    }

    fn settle(&mut self, members: &mut [Member]) -> usize {
        for round in 1..=50 {
            for m in members.iter_mut() {
                self.heartbeat(m);
            }
            if self.c.consumer_group_state("big") == Some(ConsumerGroupState::Stable) {
                return round;
            }
        }
        eprintln!("the group did not settle in 50 rounds");
        std::process::exit(1);
    }
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let members_n = args.first().copied().unwrap_or(1_000);
    let partitions_n = args.get(1).copied().unwrap_or(10_000);
    let topics_n = 10usize;
    let per_topic = i32::try_from(partitions_n / topics_n).unwrap_or(i32::MAX);
    let rss_start = rss_kib();
    let mut c = GroupCoordinator::new(GroupConfig::default(), 1);
    for p in 0..c.config().offsets_topic_num_partitions {
        c.load_partition_start(p);
        c.load_partition_done(p, 0);
    }
    let names: Vec<String> = (0..topics_n).map(|i| format!("topic-{i}")).collect();
    c.update_topics(TopicsImage::new(names.iter().enumerate().map(|(i, n)| {
        TopicImage {
            id: Uuid::from_u64_pair(0xfeed, i as u64 + 1),
            name: n.clone(),
            num_partitions: per_topic,
        }
    })));
    let mut d = Driver {
        c,
        now: 0,
        responder: 0,
        end: Default::default(),
        topics: names,
        heartbeats: 0,
    };
    let mut members: Vec<Member> = (0..members_n)
        .map(|_| Member {
            id: String::new(),
            epoch: 0,
            owned: Assignment::new(),
        })
        .collect();
    let started = Instant::now();
    for m in members.iter_mut() {
        d.heartbeat(m);
    }
    let joined = started.elapsed();
    let rounds = d.settle(&mut members);
    let settled = started.elapsed();
    let heartbeats = d.heartbeats;
    let rss_settled = rss_kib();
    let owned: usize = members
        .iter()
        .map(|m| m.owned.values().map(|s| s.len()).sum::<usize>())
        .sum();
    assert_eq!(owned, per_topic as usize * topics_n);

    let mut extra = Member {
        id: String::new(),
        epoch: 0,
        owned: Assignment::new(),
    };
    let one = Instant::now();
    d.heartbeat(&mut extra);
    let one_join = one.elapsed();
    members.push(extra);
    let rounds_again = d.settle(&mut members);
    let settled_again = one.elapsed();
    println!(
        "{members_n} members, {} partitions in {topics_n} topics",
        per_topic as usize * topics_n
    );
    println!(
        "  {members_n} joins (each runs the assignor): {:.2} s; settled after {rounds} more rounds, {:.2} s in all, {heartbeats} heartbeats",
        joined.as_secs_f64(),
        settled.as_secs_f64()
    );
    println!(
        "  one more member joining the settled group: {:.1} ms for its heartbeat; settled again after {rounds_again} rounds, {:.2} s",
        one_join.as_secs_f64() * 1e3,
        settled_again.as_secs_f64()
    );
    println!(
        "  resident memory: {:.1} MiB more than at start (live and committed views of the group, and the timers)",
        (rss_settled.saturating_sub(rss_start)) as f64 / 1024.0
    );
}
