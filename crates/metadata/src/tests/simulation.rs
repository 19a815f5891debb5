//! A seeded randomized run of the controller: brokers register, heartbeat, die, come
//! back and shut down; time passes; topics are created, ISRs shrink and grow,
//! reassignments and elections run. After every step the DESIGN.md §4 invariants are
//! checked: leader ∈ ISR ⊆ replicas, no fenced leader, epochs never go back, and at most
//! one leader per partition per leader epoch over the whole run. A failure prints the
//! seed; `RILL_SEED=<seed> cargo test -p rill-metadata simulation` replays it.

use std::collections::{BTreeMap, BTreeSet};
use std::panic::{catch_unwind, AssertUnwindSafe};

use rill_protocol::{ErrorCode, Uuid};

use super::Harness;
use crate::*;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn pick<T: Clone>(&mut self, v: &[T]) -> Option<T> {
        if v.is_empty() {
            None
        } else {
            Some(v[self.below(v.len() as u64) as usize].clone())
        }
    }
}

/// What the simulated brokers do: alive ones heartbeat; dead ones are silent.
struct World {
    h: Harness,
    rng: Rng,
    alive: BTreeSet<i32>,
    incarnation: u64,
    /// (topic id, partition, leader epoch) → the leader seen at that epoch.
    leaders: BTreeMap<(Uuid, i32, i32), i32>,
    /// (topic id, partition) → (leader epoch, partition epoch) last seen.
    epochs: BTreeMap<(Uuid, i32), (i32, i32)>,
    topics: u32,
}

impl World {
    fn check(&mut self) {
        let image = &self.h.image;
        check_image_invariants(image).unwrap();
        for t in image.topics.values() {
            for (pid, p) in &t.partitions {
                if p.leader != NO_LEADER {
                    let seen = self
                        .leaders
                        .entry((t.id, *pid, p.leader_epoch))
                        .or_insert(p.leader);
                    assert_eq!(
                        *seen, p.leader,
                        "two leaders of {}-{} in epoch {}",
                        t.name, pid, p.leader_epoch
                    );
                }
                let now = (p.leader_epoch, p.partition_epoch);
                if let Some(before) = self.epochs.insert((t.id, *pid), now) {
                    assert!(
                        now.0 >= before.0 && now.1 >= before.1,
                        "epochs went back: {before:?} -> {now:?}"
                    );
                }
            }
        }
    }

    fn step(&mut self) {
        let brokers: Vec<i32> = (1..=5).collect();
        match self.rng.below(100) {
            // A broker process starts (new incarnation) or restarts.
            0..=7 => {
                let id = self.rng.pick(&brokers).unwrap_or(1);
                self.incarnation += 1;
                let r = self.h.register_with(id, self.incarnation);
                if r.error_code == ErrorCode::NONE {
                    self.alive.insert(id);
                } else {
                    assert_eq!(r.error_code, ErrorCode::DUPLICATE_BROKER_REGISTRATION);
                }
            }
            // Live brokers heartbeat.
            8..=39 => {
                for id in self.alive.clone() {
                    if self.h.image.broker(id).is_some() {
                        let r = self.h.heartbeat(id);
                        if r.should_shut_down {
                            self.alive.remove(&id);
                        }
                    }
                }
            }
            // Time passes and leases are checked.
            40..=54 => {
                self.h.now += self.rng.below(6_000) as i64;
                self.h.tick();
            }
            // A broker dies.
            55..=59 => {
                let alive: Vec<i32> = self.alive.iter().copied().collect();
                if let Some(id) = self.rng.pick(&alive) {
                    self.alive.remove(&id);
                }
            }
            // Controlled shutdown.
            60..=62 => {
                let alive: Vec<i32> = self.alive.iter().copied().collect();
                if let Some(id) = self.rng.pick(&alive) {
                    if self.h.image.broker(id).is_some() {
                        self.h.heartbeat_full(id, false, true);
                    }
                }
            }
            // A topic is created.
            63..=70 => {
                self.topics += 1;
                let name = format!("t{}", self.topics);
                let partitions = 1 + self.rng.below(4) as i32;
                let rf = 1 + self.rng.below(3) as i16;
                self.h.create_topic(&name, partitions, rf);
            }
            // A leader changes its ISR: drops a random follower or adds a live replica.
            71..=90 => {
                let parts: Vec<(String, i32)> = self
                    .h
                    .image
                    .topics
                    .values()
                    .flat_map(|t| t.partitions.keys().map(move |p| (t.name.clone(), *p)))
                    .collect();
                if let Some((topic, pid)) = self.rng.pick(&parts) {
                    let p = self.h.partition(&topic, pid);
                    if p.leader != NO_LEADER && self.alive.contains(&p.leader) {
                        let mut isr = p.isr.clone();
                        if self.rng.below(2) == 0 && isr.len() > 1 {
                            let victim = self.rng.pick(&isr).unwrap_or(p.leader);
                            if victim != p.leader {
                                isr.retain(|b| *b != victim);
                            }
                        } else if let Some(b) = self.rng.pick(&p.replicas) {
                            if !isr.contains(&b) {
                                isr.push(b);
                            }
                        }
                        let r = self.h.alter_isr(&topic, pid, &isr);
                        let code = r.partitions.first().map_or(r.error_code, |x| x.error_code);
                        assert!(
                            code == ErrorCode::NONE || code == ErrorCode::INELIGIBLE_REPLICA,
                            "{code:?}"
                        );
                    }
                }
            }
            // A reassignment to random replicas, or a cancel.
            91..=94 => {
                let names: Vec<String> = self.h.image.topics_by_name.keys().cloned().collect();
                if let Some(topic) = self.rng.pick(&names) {
                    let target = if self.rng.below(4) == 0 {
                        None
                    } else {
                        let mut t: Vec<i32> = brokers.clone();
                        t.retain(|b| self.h.image.broker(*b).is_some());
                        let n = 1 + self.rng.below(t.len() as u64) as usize;
                        let start = self.rng.below(t.len() as u64) as usize;
                        Some((0..n).map(|i| t[(start + i) % t.len()]).collect())
                    };
                    self.h.run(ControllerEvent::AlterPartitionReassignments(
                        AlterPartitionReassignmentsRequest {
                            partitions: vec![(topic, 0, target)],
                        },
                    ));
                }
            }
            // Elections.
            95..=97 => {
                let election_type = if self.rng.below(3) == 0 {
                    ElectionType::Unclean
                } else {
                    ElectionType::Preferred
                };
                self.h
                    .run(ControllerEvent::ElectLeaders(ElectLeadersRequest {
                        election_type,
                        partitions: None,
                    }));
            }
            // A topic is deleted.
            _ => {
                let names: Vec<String> = self.h.image.topics_by_name.keys().cloned().collect();
                if let Some(topic) = self.rng.pick(&names) {
                    self.h
                        .run(ControllerEvent::DeleteTopics(DeleteTopicsRequest {
                            names: vec![topic],
                        }));
                }
            }
        }
        self.check();
    }
}

/// What a run did, so that the test can tell it exercised the interesting paths.
#[derive(Default, Debug)]
struct Coverage {
    fences: usize,
    leader_changes: usize,
    no_leader: usize,
    reassignments_done: usize,
}

fn run_seed(seed: u64, steps: usize) -> Coverage {
    let unclean = seed.is_multiple_of(4);
    let mut world = World {
        h: Harness::with_config(ControllerConfig {
            seed,
            unclean_leader_election_enable: unclean,
            ..Default::default()
        }),
        rng: Rng(seed),
        alive: BTreeSet::new(),
        incarnation: 0,
        leaders: BTreeMap::new(),
        epochs: BTreeMap::new(),
        topics: 0,
    };
    for _ in 0..steps {
        world.step();
    }
    world.h.check_replay();
    let snapshot = MetadataImage::from_snapshot(world.h.image.to_snapshot().unwrap()).unwrap();
    assert_eq!(snapshot, world.h.image);
    let mut c = Coverage::default();
    for r in &world.h.log {
        match r {
            MetadataRecord::FenceBroker(_) => c.fences += 1,
            MetadataRecord::PartitionChange(p) => {
                if p.leader == NO_LEADER {
                    c.no_leader += 1;
                } else if p.leader != NO_LEADER_CHANGE {
                    c.leader_changes += 1;
                }
                if p.adding_replicas.as_ref().is_some_and(|a| a.is_empty()) && p.replicas.is_some()
                {
                    c.reassignments_done += 1;
                }
            }
            _ => {}
        }
    }
    c
}

#[test]
fn simulation() {
    let seeds: Vec<u64> = match std::env::var("RILL_SEED") {
        Ok(s) => vec![s.parse().expect("RILL_SEED is a number")],
        Err(_) => (0..64).map(|i| 0xC0FFEE + i).collect(),
    };
    let mut total = Coverage::default();
    for seed in seeds {
        match catch_unwind(AssertUnwindSafe(|| run_seed(seed, 400))) {
            Ok(c) => {
                total.fences += c.fences;
                total.leader_changes += c.leader_changes;
                total.no_leader += c.no_leader;
                total.reassignments_done += c.reassignments_done;
            }
            Err(_) => panic!("controller simulation failed; replay with RILL_SEED={seed}"),
        }
    }
    eprintln!("simulation coverage: {total:?}");
    if std::env::var("RILL_SEED").is_err() {
        assert!(total.fences > 0 && total.leader_changes > 0 && total.no_leader > 0);
        assert!(total.reassignments_done > 0);
    }
}
