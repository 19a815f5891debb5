//! A seeded simulation of one share-partition and its share coordinator: a producer appends
//! batches, members acquire (both acquire modes), acknowledge with every type (and
//! sometimes name records they do not hold), let locks expire, leave; the coordinator's
//! high watermark lags, and the partition leader fails over (a rebuild from the committed
//! state, at the next leader epoch), sometimes together with the coordinator, which then
//! loses its unreplicated tail and loads what its prune (helped by its cold snapshots)
//! left. An acknowledgement counts as done only once the broker
//! could answer it: its write replicated.
//!
//! After every step it checks DESIGN.md's invariant 12 and the bookkeeping behind it:
//! - no record whose ACCEPT (or REJECT) was answered is ever acquired again;
//! - every delivery carries a count at most `group.share.delivery.count.limit`, and exactly
//!   one more than the deliveries the rules count (acquisitions, less those a member's
//!   leaving gave back, reset to the persisted count by a failover);
//! - what the members believe they hold is exactly what the share-partition says is
//!   ACQUIRED by them, and no lock past its deadline survives an expiry;
//! - a settled record is acknowledged or archived, or below the start offset, forever;
//! - after a failover, the rebuilt share-partition counts as many finished records as the
//!   last write reported (KIP-1226's `DeliveryCompleteCount`, the lag's input);
//!
//! and at the end, once the producer stops and one member drains the partition accepting
//! everything, that every produced record was accepted or archived, and the start offset
//! reached the end of the log.
//!
//! A failure prints the seed; `RILL_SEED=<seed> cargo test -p rill-share simulation`
//! replays it, `RILL_SIM_SEEDS=<n>` searches more than the default 40.

use std::collections::{BTreeMap, BTreeSet};
use std::panic::{catch_unwind, AssertUnwindSafe};

use rill_protocol::{ErrorCode, Uuid};

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
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

const MEMBERS: [&str; 4] = ["m0", "m1", "m2", "m3"];
const LOCK_MS: i64 = 1_000;

/// An acknowledgement waiting for its write: what it settles once the write is answered.
struct PendingAck {
    write: WriteId,
    accepted: Vec<i64>,
    rejected: Vec<i64>,
}

struct Sim {
    rng: Rng,
    /// `group.share.delivery.count.limit`, 2 to 6 by seed.
    limit: i16,
    now: i64,
    key: SharePartitionKey,
    config: SharePartitionConfig,
    /// The topic partition's batches.
    log: Vec<FetchedBatch>,
    log_end: i64,
    /// Offsets of aborted transactions and markers, hidden from this group's reads.
    hidden: Vec<OffsetRange>,
    leader_epoch: i32,
    sp: SharePartition,
    coordinator: ShareCoordinator,
    /// `__share_group_state` partition 0, and its high watermark.
    state_log: Vec<ShareCoordinatorRecord>,
    state_hw: i64,
    /// Records below this were deleted as redundant (the coordinator's prune).
    state_log_start: i64,
    pending: Vec<PendingAck>,
    /// Offsets whose ACCEPT / REJECT was answered.
    accepted: BTreeSet<i64>,
    rejected: BTreeSet<i64>,
    /// What each member was told it holds: offset -> (member, lock deadline).
    held: BTreeMap<i64, (&'static str, i64)>,
    /// Deliveries the rules count, per offset.
    counted: BTreeMap<i64, i16>,
    deliveries: u64,
    failovers: u64,
}

impl Sim {
    fn new(seed: u64) -> Self {
        let limit = 2 + (seed % 5) as i16;
        let config = SharePartitionConfig {
            record_lock_duration_ms: LOCK_MS,
            delivery_count_limit: limit,
            partition_max_record_locks: 40,
        };
        let key = SharePartitionKey::new("g", Uuid::from_u64_pair(1, 2), 0);
        let mut coordinator = ShareCoordinator::new(ShareCoordinatorConfig {
            state_topic_num_partitions: 1,
            snapshot_update_records_per_snapshot: 4,
            cold_partition_snapshot_interval_ms: 5_000,
        });
        coordinator.load_start(0);
        coordinator.load_done(0, 0);
        let none = PersistedState {
            state_epoch: 0,
            start_offset: -1,
            state_batches: vec![],
        };
        let sp = SharePartition::from_persisted("g", key.topic_id, 0, config.clone(), 0, &none, 0)
            .expect("empty state");
        Sim {
            rng: Rng(seed),
            limit,
            now: 0,
            key,
            config,
            log: Vec::new(),
            log_end: 0,
            hidden: Vec::new(),
            leader_epoch: 0,
            sp,
            coordinator,
            state_log: Vec::new(),
            state_hw: 0,
            state_log_start: 0,
            pending: Vec::new(),
            accepted: BTreeSet::new(),
            rejected: BTreeSet::new(),
            held: BTreeMap::new(),
            counted: BTreeMap::new(),
            deliveries: 0,
            failovers: 0,
        }
    }

    fn produce(&mut self) {
        let len = 1 + self.rng.below(6) as i64;
        let first = self.log_end;
        // Now and then a batch of an aborted transaction and its marker, or a gap
        // (compaction took a batch).
        if self.rng.chance(8) {
            self.hidden.push(OffsetRange::new(first, first + len));
            self.log.push(FetchedBatch {
                base_offset: first,
                last_offset: first + len - 1,
            });
            self.log.push(FetchedBatch {
                base_offset: first + len,
                last_offset: first + len,
            });
            self.log_end = first + len + 1;
            return;
        }
        let base = if self.rng.chance(5) { first + 2 } else { first };
        self.log.push(FetchedBatch {
            base_offset: base,
            last_offset: base + len - 1,
        });
        self.log_end = base + len;
    }

    /// A member's fetch: the broker reads from the next fetch offset.
    fn acquire(&mut self, member: &'static str) -> Result<(), String> {
        let from = self.sp.next_fetch_offset();
        let read: Vec<FetchedBatch> = self
            .log
            .iter()
            .copied()
            .filter(|b| b.last_offset >= from)
            .take(1 + self.rng.below(5) as usize)
            .collect();
        let mode = if self.rng.chance(50) {
            ShareAcquireMode::RecordLimit
        } else {
            ShareAcquireMode::BatchOptimized
        };
        let max = 1 + self.rng.below(12) as i32;
        let fetch = ShareFetch {
            fetch_offset: from,
            batches: &read,
            max_records: max,
            acquire_mode: mode,
            skip: &self.hidden,
        };
        let acquired = self.sp.acquire(member, &fetch, self.now);
        if mode == ShareAcquireMode::RecordLimit && acquired.count() > i64::from(max) {
            return Err(format!(
                "record-limit acquire took {} > {max}",
                acquired.count()
            ));
        }
        let deadline = self.now + LOCK_MS;
        for r in &acquired.records {
            for offset in r.first_offset..=r.last_offset {
                if self.accepted.contains(&offset) {
                    return Err(format!(
                        "offset {offset} delivered again after its ACCEPT was answered"
                    ));
                }
                if self.rejected.contains(&offset) {
                    return Err(format!(
                        "offset {offset} delivered again after its REJECT was answered"
                    ));
                }
                if self
                    .hidden
                    .iter()
                    .any(|h| h.first <= offset && offset <= h.last)
                {
                    return Err(format!(
                        "offset {offset} is hidden from this isolation level"
                    ));
                }
                if r.delivery_count > self.limit {
                    return Err(format!(
                        "offset {offset} delivered with count {}",
                        r.delivery_count
                    ));
                }
                let counted = self.counted.entry(offset).or_insert(0);
                if r.delivery_count != *counted + 1 {
                    return Err(format!(
                        "offset {offset} delivered with count {} after {} counted deliveries",
                        r.delivery_count, counted
                    ));
                }
                *counted += 1;
                if let Some((other, _)) = self.held.insert(offset, (member, deadline)) {
                    return Err(format!(
                        "offset {offset} acquired by {member} while {other} holds it"
                    ));
                }
                self.deliveries += 1;
            }
        }
        self.persist(acquired.write, Vec::new(), Vec::new());
        Ok(())
    }

    /// A member acknowledges some of what it holds, or, now and then, what it does not.
    fn acknowledge(&mut self, member: &'static str) -> Result<(), String> {
        let mine: Vec<i64> = self
            .held
            .iter()
            .filter(|(_, (m, _))| *m == member)
            .map(|(o, _)| *o)
            .collect();
        let wrong = self.rng.chance(10);
        let candidates: Vec<i64> = if wrong {
            let other: Vec<i64> = self
                .held
                .iter()
                .filter(|(_, (m, _))| *m != member)
                .map(|(o, _)| *o)
                .collect();
            other.into_iter().take(1).collect()
        } else {
            mine.into_iter().filter(|_| self.rng.chance(60)).collect()
        };
        if candidates.is_empty() {
            return Ok(());
        }
        // Contiguous runs of the chosen offsets, each a batch of one type or per-offset types.
        let mut batches: Vec<AcknowledgementBatch> = Vec::new();
        for offset in candidates {
            let ty = match self.rng.below(10) {
                0..=4 => AcknowledgeType::Accept,
                5 | 6 => AcknowledgeType::Release,
                7 | 8 => AcknowledgeType::Reject,
                _ => AcknowledgeType::Renew,
            };
            match batches.last_mut() {
                Some(b) if b.last_offset + 1 == offset && self.rng.chance(70) => {
                    if b.acknowledge_types.len() == 1 && b.acknowledge_types[0] != ty {
                        let n = (b.last_offset - b.first_offset + 1) as usize;
                        b.acknowledge_types = vec![b.acknowledge_types[0]; n];
                    }
                    if b.acknowledge_types.len() > 1 {
                        b.acknowledge_types.push(ty);
                    }
                    b.last_offset = offset;
                }
                _ => batches.push(AcknowledgementBatch::new(offset, offset, ty)),
            }
        }
        let before = self.sp.in_flight();
        match self.sp.acknowledge(member, &batches, self.now) {
            Err(e) => {
                if !wrong {
                    return Err(format!(
                        "{member}'s acknowledgement of what it holds failed: {e}"
                    ));
                }
                if e.error_code() != ErrorCode::INVALID_RECORD_STATE {
                    return Err(format!("acknowledging another's record: {e}"));
                }
                if self.sp.in_flight() != before {
                    return Err("a refused acknowledgement changed state".into());
                }
            }
            Ok(write) => {
                if wrong {
                    return Err(format!("{member} acknowledged records it does not hold"));
                }
                let (mut accepted, mut rejected) = (Vec::new(), Vec::new());
                for b in &batches {
                    for offset in b.first_offset..=b.last_offset {
                        let ty = if b.acknowledge_types.len() == 1 {
                            b.acknowledge_types[0]
                        } else {
                            b.acknowledge_types[(offset - b.first_offset) as usize]
                        };
                        match ty {
                            AcknowledgeType::Renew => {
                                self.held.insert(offset, (member, self.now + LOCK_MS));
                                continue;
                            }
                            AcknowledgeType::Accept => accepted.push(offset),
                            AcknowledgeType::Reject => rejected.push(offset),
                            _ => {}
                        }
                        self.held.remove(&offset);
                    }
                }
                self.persist(write, accepted, rejected);
            }
        }
        Ok(())
    }

    /// Sends a write to the coordinator; what it settles is settled once it is answered.
    fn persist(&mut self, write: Option<StateWrite>, accepted: Vec<i64>, rejected: Vec<i64>) {
        let Some(w) = write else {
            return;
        };
        let request = Request::Write {
            key: self.key.clone(),
            state_epoch: w.state_epoch,
            leader_epoch: w.leader_epoch,
            start_offset: w.start_offset,
            delivery_complete_count: w.delivery_complete_count,
            state_batches: w.state_batches,
        };
        match self.coordinator.handle(request, self.now) {
            Output::Persist { write, records, .. } => {
                self.state_log.extend(records);
                self.coordinator
                    .appended(write, 0, self.state_log.len() as i64);
                self.pending.push(PendingAck {
                    write,
                    accepted,
                    rejected,
                });
            }
            // A fenced write of a deposed leader: nothing it settles is settled.
            Output::Reply(_) => {}
        }
    }

    /// The coordinator's high watermark moves; answered writes settle their records.
    fn replicate(&mut self, to: i64) {
        self.state_hw = self.state_hw.max(to.min(self.state_log.len() as i64));
        let done = self.coordinator.commit_up_to(0, self.state_hw);
        let (settled, rest): (Vec<PendingAck>, Vec<PendingAck>) = self
            .pending
            .drain(..)
            .partition(|p| done.contains(&p.write));
        self.pending = rest;
        for p in settled {
            self.accepted.extend(p.accepted);
            self.rejected.extend(p.rejected);
        }
    }

    fn expire(&mut self) -> Result<(), String> {
        let expired = self.sp.expire(self.now);
        let now = self.now;
        self.held.retain(|_, (_, deadline)| *deadline > now);
        if self
            .sp
            .in_flight()
            .iter()
            .any(|r| r.lock_deadline_ms.is_some_and(|d| d <= now))
        {
            return Err("a lock past its deadline survived an expiry".into());
        }
        for r in &expired.available {
            for offset in r.first..=r.last {
                if self.sp.record_state(offset).map(|(s, _)| s) != Some(RecordState::Available) {
                    return Err(format!("offset {offset} reported available but is not"));
                }
            }
        }
        self.persist(expired.write, Vec::new(), Vec::new());
        Ok(())
    }

    fn leave(&mut self, member: &'static str) {
        let write = self.sp.release_member(member);
        let given_back: Vec<i64> = self
            .held
            .iter()
            .filter(|(_, (m, _))| *m == member)
            .map(|(o, _)| *o)
            .collect();
        for offset in given_back {
            self.held.remove(&offset);
            if let Some(c) = self.counted.get_mut(&offset) {
                *c -= 1;
            }
        }
        self.persist(write, Vec::new(), Vec::new());
    }

    /// The partition leader moves (and, with `coordinator_too`, the coordinator loses what
    /// it had not replicated); the new leader reads the committed state.
    fn failover(&mut self, coordinator_too: bool) -> Result<(), String> {
        self.failovers += 1;
        if coordinator_too {
            // The old coordinator pruned what it no longer needed, then lost its tail.
            if let Some(redundant) = self.coordinator.last_redundant_offset(0) {
                if redundant > self.state_hw {
                    return Err(format!(
                        "redundant offset {redundant} above the high watermark {}",
                        self.state_hw
                    ));
                }
                self.state_log_start = self.state_log_start.max(redundant);
            }
            self.state_log.truncate(self.state_hw as usize);
            self.pending.clear();
            let mut c = ShareCoordinator::new(self.coordinator.config().clone());
            c.load_start(0);
            for (offset, r) in self.state_log.iter().enumerate() {
                if offset as i64 >= self.state_log_start {
                    c.replay(0, offset as i64, r.clone(), true);
                }
            }
            c.load_done(0, self.now);
            self.coordinator = c;
        }
        self.leader_epoch += 1;
        let read = Request::Read {
            key: self.key.clone(),
            leader_epoch: self.leader_epoch,
        };
        let state = match self.coordinator.handle(read, self.now) {
            Output::Reply(r) => r,
            Output::Persist {
                write,
                records,
                reply,
                ..
            } => {
                // Recording the new leader epoch: answered once replicated.
                self.state_log.extend(records);
                self.coordinator
                    .appended(write, 0, self.state_log.len() as i64);
                let end = self.state_log.len() as i64;
                self.replicate(end);
                reply
            }
        };
        let Response::Read {
            error,
            state_epoch,
            start_offset,
            state_batches,
        } = state
        else {
            return Err("read answered with another response".into());
        };
        if error != ErrorCode::NONE {
            return Err(format!("read failed: {error:?}"));
        }
        let persisted = PersistedState {
            state_epoch,
            start_offset,
            state_batches,
        };
        self.sp = SharePartition::from_persisted(
            "g",
            self.key.topic_id,
            0,
            self.config.clone(),
            self.leader_epoch,
            &persisted,
            0,
        )
        .map_err(|e| format!("rebuild: {e}"))?;
        // The count of finished records the last write reported is what the rebuilt state
        // says too: it is what the lag is computed from.
        if let Some(persisted) = self.coordinator.committed_state(&self.key) {
            if persisted.delivery_complete_count != self.sp.delivery_complete_count() {
                return Err(format!(
                    "persisted delivery complete count {} but the rebuilt state has {}",
                    persisted.delivery_complete_count,
                    self.sp.delivery_complete_count()
                ));
            }
        }
        // Every lock is gone; deliveries count as persisted.
        self.held.clear();
        for (offset, c) in self.counted.iter_mut() {
            *c = match self.sp.record_state(*offset) {
                Some((_, persisted)) => persisted,
                None if *offset >= self.sp.end_offset() => 0,
                None => *c,
            };
        }
        Ok(())
    }

    fn check(&self) -> Result<(), String> {
        let mut acquired: BTreeMap<i64, String> = BTreeMap::new();
        for r in self.sp.in_flight() {
            if r.state == RecordState::Acquired {
                for o in r.first_offset..=r.last_offset {
                    acquired.insert(o, r.member_id.clone().unwrap_or_default());
                }
            }
        }
        let told: BTreeMap<i64, String> = self
            .held
            .iter()
            .map(|(o, (m, _))| (*o, (*m).to_owned()))
            .collect();
        if acquired != told {
            return Err(format!(
                "members hold {told:?}, the share-partition says {acquired:?}"
            ));
        }
        for offset in self.accepted.iter().chain(&self.rejected) {
            if let Some((s, _)) = self.sp.record_state(*offset) {
                if !s.is_terminal() {
                    return Err(format!("settled offset {offset} is {s} again"));
                }
            } else if *offset >= self.sp.start_offset() {
                return Err(format!("settled offset {offset} is past the end offset"));
            }
        }
        Ok(())
    }

    /// The coordinator's timer: cold snapshots, appended like any write.
    fn tick(&mut self) {
        for snap in self.coordinator.tick(self.now) {
            self.state_log.extend(snap.records);
            self.coordinator
                .appended(snap.write, 0, self.state_log.len() as i64);
            self.pending.push(PendingAck {
                write: snap.write,
                accepted: Vec::new(),
                rejected: Vec::new(),
            });
        }
    }

    fn step(&mut self) -> Result<(), String> {
        self.now += self.rng.below(300) as i64;
        self.tick();
        let member = MEMBERS[self.rng.below(MEMBERS.len() as u64) as usize];
        match self.rng.below(100) {
            0..=14 => self.produce(),
            15..=44 => self.acquire(member)?,
            45..=69 => self.acknowledge(member)?,
            70..=79 => self.expire()?,
            80..=83 => self.leave(member),
            84..=96 => {
                let lag = self.rng.below(3) as i64;
                self.replicate(self.state_log.len() as i64 - lag);
            }
            _ => {
                let both = self.rng.chance(50);
                self.failover(both)?;
            }
        }
        self.check()
    }

    /// The producer stops; one member takes and accepts everything left.
    fn drain(&mut self) -> Result<(), String> {
        for _ in 0..10_000 {
            self.now += LOCK_MS;
            self.expire()?;
            self.acquire("m0")?;
            let mine: Vec<i64> = self.held.keys().copied().collect();
            if !mine.is_empty() {
                let batches: Vec<AcknowledgementBatch> = mine
                    .iter()
                    .map(|o| AcknowledgementBatch::new(*o, *o, AcknowledgeType::Accept))
                    .collect();
                let write = self
                    .sp
                    .acknowledge("m0", &batches, self.now)
                    .map_err(|e| format!("drain: {e}"))?;
                for o in &mine {
                    self.held.remove(o);
                }
                self.persist(write, mine, Vec::new());
            }
            let end = self.state_log.len() as i64;
            self.replicate(end);
            self.check()?;
            if self.sp.start_offset() >= self.log_end && self.held.is_empty() {
                break;
            }
        }
        if self.sp.start_offset() < self.log_end {
            return Err(format!(
                "drained to {} of {}: in flight {:?}",
                self.sp.start_offset(),
                self.log_end,
                self.sp.in_flight()
            ));
        }
        // Every produced record ended accepted or archived; none was accepted twice over
        // (a record's ACCEPT is answered once: it was delivered again only if never answered).
        for b in &self.log {
            for offset in b.base_offset..=b.last_offset {
                let hidden = self
                    .hidden
                    .iter()
                    .any(|h| h.first <= offset && offset <= h.last);
                if hidden && self.accepted.contains(&offset) {
                    return Err(format!("hidden offset {offset} was accepted"));
                }
            }
        }
        Ok(())
    }
}

fn simulate(seed: u64, steps: usize) -> Result<(u64, u64, usize), String> {
    let mut sim = Sim::new(seed);
    for step in 0..steps {
        sim.step().map_err(|e| format!("step {step}: {e}"))?;
    }
    sim.drain()?;
    Ok((sim.deliveries, sim.failovers, sim.accepted.len()))
}

#[test]
fn simulation_keeps_invariant_12() {
    let seeds: Vec<u64> = match std::env::var("RILL_SEED") {
        Ok(s) => vec![s.parse().expect("RILL_SEED is a number")],
        Err(_) => {
            let n = std::env::var("RILL_SIM_SEEDS")
                .ok()
                .and_then(|n| n.parse().ok())
                .unwrap_or(40);
            (1..=n).collect()
        }
    };
    let (mut deliveries, mut failovers, mut accepted) = (0, 0, 0);
    for seed in seeds {
        match catch_unwind(AssertUnwindSafe(|| simulate(seed, 2_000))) {
            Ok(Ok((d, f, a))) => {
                deliveries += d;
                failovers += f;
                accepted += a;
            }
            Ok(Err(e)) => panic!("seed {seed}: {e}\nreplay: RILL_SEED={seed} cargo test -p rill-share simulation"),
            Err(_) => panic!("seed {seed} panicked\nreplay: RILL_SEED={seed} cargo test -p rill-share simulation"),
        }
    }
    eprintln!("{deliveries} deliveries, {accepted} records accepted, {failovers} failovers");
    // The runs exercised something: records went out, some more than once, leaders moved.
    assert!(
        accepted > 0 && deliveries > accepted as u64,
        "{deliveries} deliveries, {accepted} accepted"
    );
    assert!(failovers > 0, "no failover happened");
}
