//! [`SharePartition`]: the partition leader's state of one share-partition (a share group's
//! view of one topic partition, KIP-932): which records are in flight, who holds which, how
//! often each was delivered, and what must be persisted for it all to survive a failover.
//!
//! # Protocol (KIP-932, Kafka's `SharePartition`)
//! 1. The share-partition start offset (SPSO) is the first record whose delivery is not
//!    over; every record below it is acknowledged or archived. The end offset (SPEO, kept
//!    exclusive here) is the first record never taken in flight. The in-flight records
//!    `SPSO..SPEO` are runs of records with one state, delivery count and holder; a run is
//!    split where a partial acknowledgement gives its records different fates, down to one
//!    record per run, and runs that agree again are joined.
//! 2. Acquire: the broker reads the log from [`SharePartition::next_fetch_offset`] and hands
//!    over the offset ranges of the batches it read ([`ShareFetch`]). Records in flight and
//!    AVAILABLE, and records past SPEO, become ACQUIRED by the member with their delivery
//!    count incremented and a lock until `now + group.share.record.lock.duration.ms`; the
//!    answer is Kafka's `AcquiredRecords` (first, last offset, delivery count). At most
//!    `group.share.partition.max.record.locks` records are in flight: nothing past
//!    `SPSO + limit` is taken. `max_records` is a soft limit in the batch-optimized acquire
//!    mode (whole batches, KIP-932) and a hard one in record-limit mode (KIP-1206).
//!    Offsets a reader must not see (aborted transactions under read_committed, control
//!    batches: the `skip` hook) and offsets the log no longer holds are ARCHIVED instead.
//!    Records near the delivery limit go out in smaller and smaller groups, and a record on
//!    its last delivery alone (Kafka 4.2's throttling, see `acquire_range`).
//! 3. Acknowledge: a member's ACCEPT, RELEASE, REJECT (and GAP, for offsets the log does
//!    not hold) move records it holds to ACKNOWLEDGED, AVAILABLE, ARCHIVED; RENEW (KIP-1222)
//!    extends the lock and changes nothing else. Every record named must be ACQUIRED by
//!    that member, else INVALID_RECORD_STATE and nothing changes; malformed batches are
//!    INVALID_REQUEST.
//! 4. A lock that expires ([`SharePartition::expire`]) makes the record AVAILABLE again;
//!    a RELEASE does the same. Either archives the record instead once its delivery count
//!    has reached `group.share.delivery.count.limit`.
//! 5. A member that leaves ([`SharePartition::release_member`]) gives its records back
//!    AVAILABLE with the delivery count of before its acquisition, never archived: Kafka
//!    (since 4.1, `DeliveryCountOps.DECREASE`) counts them as fetched, not delivered.
//! 6. After every change the SPSO moves past the prefix of ACKNOWLEDGED and ARCHIVED runs,
//!    which are then forgotten.
//! 7. Every change that must survive returns a [`StateWrite`] (what the broker sends as
//!    WriteShareGroupState): the changed ranges with their new state and delivery count,
//!    the SPSO, the state epoch and the leader epoch. ACQUIRED is never written, and neither
//!    are RENEWs. The broker answers the acknowledgement only once the write succeeded; if
//!    it fails, the broker rebuilds the share-partition from what is persisted.
//! 8. A new leader rebuilds the share-partition from ReadShareGroupState's answer
//!    ([`SharePartition::from_persisted`]): offsets between the persisted batches are
//!    AVAILABLE with delivery count 0 (never delivered, or delivered and never written), and
//!    a share-partition with no persisted state starts at the offset
//!    `share.auto.offset.reset` gives.
//!
//! # Why it is correct (DESIGN.md, invariant 12)
//! An accepted record is never delivered again: ACKNOWLEDGED is terminal (no transition
//! leaves it), acquire takes only AVAILABLE records and records past SPEO, and the SPSO
//! passes an ACKNOWLEDGED record only together with everything below it, so neither the
//! in-flight map nor the log read from `next_fetch_offset` (never below the SPSO) brings it
//! back. Across a failover: the acknowledgement was answered only after its write was
//! persisted, and the new leader rebuilds from persisted state, in which the record is
//! ACKNOWLEDGED or below the start offset.
//!
//! An acquired record whose lock expires is delivered again, at most the limit times: the
//! expiry makes it AVAILABLE while its count is below the limit, so the next acquire takes
//! it; each acquisition adds one to the count and the count is checked before it is, so no
//! delivery ever carries a count above the limit. What is not counted is what Kafka does not
//! count either: acquisitions undone by the member leaving (step 5), and acquisitions that
//! a failover undid before any write of the record (ACQUIRED is never persisted).

use std::collections::BTreeMap;
use std::sync::Arc;

use rill_protocol::Uuid;

use crate::acknowledgement::{AcknowledgeType, AcknowledgementBatch};
use crate::error::ShareError;
use crate::persister::{PersistedState, StateWrite};
use crate::share_fetch::{Acquired, AcquiredRecords, OffsetRange, ShareAcquireMode, ShareFetch};
use crate::state_batch::{RecordState, StateBatch};

/// The leader's limits for its share-partitions, under Kafka's broker config names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharePartitionConfig {
    /// `group.share.record.lock.duration.ms`: how long an acquired record is held.
    pub record_lock_duration_ms: i64,
    /// `group.share.delivery.count.limit`: deliveries of a record before it is archived.
    pub delivery_count_limit: i16,
    /// `group.share.partition.max.record.locks`: records in flight per share-partition.
    pub partition_max_record_locks: i64,
}

impl Default for SharePartitionConfig {
    fn default() -> Self {
        SharePartitionConfig {
            record_lock_duration_ms: 30_000,
            delivery_count_limit: 5,
            partition_max_record_locks: 2_000,
        }
    }
}

/// The answer to [`SharePartition::expire`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Expired {
    /// Records that became AVAILABLE: parked fetches of the share-partition may be answered.
    pub available: Vec<OffsetRange>,
    pub write: Option<StateWrite>,
}

/// How far one acquire has got, across the batches it reads.
#[derive(Debug, Default)]
struct AcquireProgress {
    /// Records acquired so far.
    count: i64,
    /// Nothing more is taken (a throttled or last-attempt record was reached).
    stop: bool,
    /// The most records this acquire may take, once it met a throttled record.
    throttle_cap: Option<i64>,
}

/// One run of in-flight records.
#[derive(Debug, Clone, PartialEq, Eq)]
struct InFlight {
    last_offset: i64,
    state: RecordState,
    delivery_count: i16,
    /// The holder, while ACQUIRED (shared: a split of a run copies it).
    member_id: Option<Arc<str>>,
    /// When the acquisition lock expires, while ACQUIRED.
    lock_deadline_ms: i64,
}

impl InFlight {
    fn new(last_offset: i64, state: RecordState, delivery_count: i16) -> Self {
        InFlight {
            last_offset,
            state,
            delivery_count,
            member_id: None,
            lock_deadline_ms: 0,
        }
    }

    fn joins(&self, next: &InFlight) -> bool {
        self.state == next.state
            && self.delivery_count == next.delivery_count
            && self.member_id == next.member_id
            && self.lock_deadline_ms == next.lock_deadline_ms
    }
}

/// One view of an in-flight run, for tests and descriptions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InFlightRecords {
    pub first_offset: i64,
    pub last_offset: i64,
    pub state: RecordState,
    pub delivery_count: i16,
    pub member_id: Option<String>,
    pub lock_deadline_ms: Option<i64>,
}

/// The leader's state of one share-partition. See the module's design note.
#[derive(Debug, Clone)]
pub struct SharePartition {
    group_id: String,
    topic_id: Uuid,
    partition: i32,
    config: SharePartitionConfig,
    leader_epoch: i32,
    state_epoch: i32,
    /// SPSO.
    start_offset: i64,
    /// SPEO, exclusive: `start_offset..end_offset` are in flight.
    end_offset: i64,
    /// first offset -> run; the runs cover `start_offset..end_offset` without gap or overlap.
    in_flight: BTreeMap<i64, InFlight>,
}

impl SharePartition {
    /// The share-partition as a new leader at `leader_epoch` finds it: from `persisted`
    /// (ReadShareGroupState's answer), or, when nothing is persisted, starting at
    /// `reset_offset` (the offset the broker resolved `share.auto.offset.reset` to).
    pub fn from_persisted(
        group_id: impl Into<String>,
        topic_id: Uuid,
        partition: i32,
        config: SharePartitionConfig,
        leader_epoch: i32,
        persisted: &PersistedState,
        reset_offset: i64,
    ) -> Result<SharePartition, ShareError> {
        let start = if persisted.start_offset < 0 {
            reset_offset.max(0)
        } else {
            persisted.start_offset
        };
        let mut sp = SharePartition {
            group_id: group_id.into(),
            topic_id,
            partition,
            config,
            leader_epoch,
            state_epoch: persisted.state_epoch,
            start_offset: start,
            end_offset: start,
            in_flight: BTreeMap::new(),
        };
        if persisted.start_offset < 0 {
            return Ok(sp);
        }
        for b in &persisted.state_batches {
            if b.is_empty() || b.first_offset < 0 || b.last_offset == i64::MAX {
                return Err(ShareError::BadPersistedState(format!(
                    "batch {}..={} is empty or out of range",
                    b.first_offset, b.last_offset
                )));
            }
            if b.first_offset < sp.end_offset {
                return Err(ShareError::BadPersistedState(format!(
                    "batch {}..={} overlaps what is before it (start offset {})",
                    b.first_offset, b.last_offset, start
                )));
            }
            if b.first_offset > sp.end_offset {
                // Never delivered, or delivered and never written.
                sp.in_flight.insert(
                    sp.end_offset,
                    InFlight::new(b.first_offset - 1, RecordState::Available, 0),
                );
            }
            // ACQUIRED is never written; if it were, the holder is gone.
            let state = match b.delivery_state {
                RecordState::Acquired => RecordState::Available,
                s => s,
            };
            sp.in_flight.insert(
                b.first_offset,
                InFlight::new(b.last_offset, state, b.delivery_count.max(0)),
            );
            sp.end_offset = b.last_offset + 1;
        }
        sp.coalesce(sp.start_offset, sp.end_offset);
        sp.advance_start();
        sp.check();
        Ok(sp)
    }

    pub fn group_id(&self) -> &str {
        &self.group_id
    }

    pub fn topic_id(&self) -> Uuid {
        self.topic_id
    }

    pub fn partition(&self) -> i32 {
        self.partition
    }

    pub fn config(&self) -> &SharePartitionConfig {
        &self.config
    }

    pub fn leader_epoch(&self) -> i32 {
        self.leader_epoch
    }

    pub fn state_epoch(&self) -> i32 {
        self.state_epoch
    }

    /// SPSO: every record below it is acknowledged or archived.
    pub fn start_offset(&self) -> i64 {
        self.start_offset
    }

    /// SPEO (exclusive): the first offset never taken in flight.
    pub fn end_offset(&self) -> i64 {
        self.end_offset
    }

    /// Records in flight whose delivery is over (acknowledged or archived): with the start
    /// offset and the partition's high watermark, a share group's lag (KIP-1226).
    pub fn delivery_complete_count(&self) -> i32 {
        let n: i64 = self
            .in_flight
            .iter()
            .filter(|(_, r)| r.state.is_terminal())
            .map(|(first, r)| r.last_offset - first + 1)
            .sum();
        i32::try_from(n).unwrap_or(i32::MAX)
    }

    /// Where the broker should read the log for the next acquire: the first AVAILABLE
    /// record in flight, else the end offset.
    pub fn next_fetch_offset(&self) -> i64 {
        self.in_flight
            .iter()
            .find(|(_, r)| r.state == RecordState::Available)
            .map_or(self.end_offset, |(first, _)| *first)
    }

    /// Whether an acquire could take anything: a record in flight is AVAILABLE, or the limit
    /// of records in flight leaves room (Kafka's `canAcquireRecords`).
    pub fn can_acquire(&self) -> bool {
        self.next_fetch_offset() < self.end_offset
            || self.end_offset - self.start_offset < self.config.partition_max_record_locks
    }

    /// When the earliest acquisition lock expires.
    pub fn next_deadline(&self) -> Option<i64> {
        self.in_flight
            .values()
            .filter(|r| r.state == RecordState::Acquired)
            .map(|r| r.lock_deadline_ms)
            .min()
    }

    /// The in-flight runs, in offset order.
    pub fn in_flight(&self) -> Vec<InFlightRecords> {
        self.in_flight
            .iter()
            .map(|(first, r)| InFlightRecords {
                first_offset: *first,
                last_offset: r.last_offset,
                state: r.state,
                delivery_count: r.delivery_count,
                member_id: r.member_id.as_deref().map(str::to_owned),
                lock_deadline_ms: (r.state == RecordState::Acquired).then_some(r.lock_deadline_ms),
            })
            .collect()
    }

    /// The state and delivery count of one record, if it is in flight.
    pub fn record_state(&self, offset: i64) -> Option<(RecordState, i16)> {
        self.in_flight
            .range(..=offset)
            .next_back()
            .filter(|(_, r)| r.last_offset >= offset)
            .map(|(_, r)| (r.state, r.delivery_count))
    }

    /// Acquires for `member_id` what `fetch` read (protocol step 2).
    pub fn acquire(&mut self, member_id: &str, fetch: &ShareFetch<'_>, now_ms: i64) -> Acquired {
        let mut out = Acquired::default();
        if fetch.max_records <= 0 || fetch.batches.is_empty() {
            return out;
        }
        let max = i64::from(fetch.max_records);
        let deadline = now_ms.saturating_add(self.config.record_lock_duration_ms);
        let mut changes = Vec::new();
        let start_before = self.start_offset;
        let mut progress = AcquireProgress::default();
        // Offsets from here to the next batch's base are not in the log.
        let mut covered_to = fetch.fetch_offset.max(self.start_offset);
        for batch in fetch.batches {
            if batch.last_offset < batch.base_offset || batch.last_offset < covered_to {
                continue;
            }
            if progress.count >= max || progress.stop {
                break;
            }
            if batch.base_offset > covered_to {
                self.archive_missing(covered_to, batch.base_offset - 1, &mut changes);
            }
            let lo = batch.base_offset.max(covered_to);
            covered_to = batch.last_offset + 1;
            // Take in flight what the limit allows, as AVAILABLE never delivered.
            let cap_last = self.cap_last();
            let hi = batch.last_offset.min(cap_last);
            if hi >= self.end_offset {
                self.extend(hi, RecordState::Available);
            }
            let hi = hi.min(self.end_offset - 1);
            if lo > hi {
                break;
            }
            for skip in fetch.skip {
                let (f, l) = (skip.first.max(lo), skip.last.min(hi));
                if f <= l {
                    self.transition(f, l, &mut changes, |r| {
                        (r.state == RecordState::Available).then(|| {
                            InFlight::new(r.last_offset, RecordState::Archived, r.delivery_count)
                        })
                    });
                }
            }
            let limit = match fetch.acquire_mode {
                ShareAcquireMode::BatchOptimized => i64::MAX,
                ShareAcquireMode::RecordLimit => max,
            };
            self.acquire_range(
                member_id,
                lo,
                hi,
                limit,
                deadline,
                &mut progress,
                &mut out.records,
                &mut changes,
            );
        }
        self.advance_start();
        out.write = self.write_for(changes, start_before);
        self.check();
        out
    }

    /// Acquires the AVAILABLE records of `lo..=hi` (all in flight) until `progress` reaches
    /// `limit`.
    ///
    /// Records near the delivery limit go out in ever smaller groups (Kafka 4.2's
    /// throttling, so that one record that makes its consumers fail does not use up the
    /// deliveries of a whole batch with it): a run whose delivery count has reached
    /// `max(2, ceil(limit / 2))` is not taken together with records acquired before it, and
    /// is itself taken only `len >> (count - threshold + 1)` records at a time (at least
    /// one); a record on its last delivery (limit above 2) goes out alone.
    #[allow(clippy::too_many_arguments)]
    fn acquire_range(
        &mut self,
        member_id: &str,
        lo: i64,
        hi: i64,
        limit: i64,
        deadline: i64,
        progress: &mut AcquireProgress,
        acquired: &mut Vec<AcquiredRecords>,
        changes: &mut Vec<StateBatch>,
    ) {
        let delivery_limit = self.config.delivery_count_limit;
        let throttle_from = (delivery_limit.saturating_add(1) / 2).max(2);
        let holder: Arc<str> = Arc::from(member_id);
        self.split_at(lo);
        self.split_at(hi + 1);
        for first in self.keys_in(lo, hi) {
            let cap = progress.throttle_cap.map_or(limit, |c| c.min(limit));
            if progress.stop || progress.count >= cap {
                break;
            }
            let Some(run) = self.in_flight.get(&first) else {
                continue;
            };
            if run.state != RecordState::Available {
                continue;
            }
            let count_now = run.delivery_count;
            if count_now >= delivery_limit {
                // Already delivered the limit times (a rebuilt state can say so): it may not
                // go out again.
                let last = run.last_offset;
                self.in_flight
                    .insert(first, InFlight::new(last, RecordState::Archived, count_now));
                changes.push(StateBatch::new(
                    first,
                    last,
                    RecordState::Archived,
                    count_now,
                ));
                continue;
            }
            let last_attempt = delivery_limit > 2 && count_now == delivery_limit - 1;
            let throttled = count_now >= throttle_from;
            if (last_attempt || throttled) && progress.count > 0 {
                // Delivered apart, in a later fetch.
                progress.stop = true;
                break;
            }
            let mut take = cap - progress.count;
            if last_attempt {
                take = 1;
                progress.stop = true;
            } else if throttled && progress.throttle_cap.is_none() {
                let len = run.last_offset - first + 1;
                let shift = u32::try_from(count_now - throttle_from + 1)
                    .unwrap_or(63)
                    .min(63);
                let throttle_cap = (len >> shift).max(1);
                progress.throttle_cap = Some(throttle_cap);
                take = take.min(throttle_cap);
            }
            let last = run.last_offset.min(first.saturating_add(take - 1));
            self.split_at(last + 1);
            let Some(run) = self.in_flight.get_mut(&first) else {
                continue;
            };
            run.state = RecordState::Acquired;
            run.delivery_count += 1;
            run.member_id = Some(Arc::clone(&holder));
            run.lock_deadline_ms = deadline;
            let delivery_count = run.delivery_count;
            progress.count += last - first + 1;
            match acquired.last_mut() {
                Some(prev)
                    if prev.last_offset + 1 == first && prev.delivery_count == delivery_count =>
                {
                    prev.last_offset = last;
                }
                _ => acquired.push(AcquiredRecords {
                    first_offset: first,
                    last_offset: last,
                    delivery_count,
                }),
            }
        }
        self.coalesce(lo, hi + 1);
    }

    /// Offsets `first..=last` read as absent from the log: archived if in flight and
    /// AVAILABLE, taken in flight as ARCHIVED if past the end offset.
    fn archive_missing(&mut self, first: i64, last: i64, changes: &mut Vec<StateBatch>) {
        let first = first.max(self.start_offset);
        let in_flight_last = last.min(self.end_offset - 1);
        if first <= in_flight_last {
            self.transition(first, in_flight_last, changes, |r| {
                (r.state == RecordState::Available)
                    .then(|| InFlight::new(r.last_offset, RecordState::Archived, r.delivery_count))
            });
        }
        let new_last = last.min(self.cap_last());
        if new_last >= self.end_offset {
            let from = self.end_offset;
            self.extend(new_last, RecordState::Archived);
            changes.push(StateBatch::new(from, new_last, RecordState::Archived, 0));
        }
    }

    /// Applies a member's acknowledgements (protocol step 3): all of them, or none.
    pub fn acknowledge(
        &mut self,
        member_id: &str,
        batches: &[AcknowledgementBatch],
        now_ms: i64,
    ) -> Result<Option<StateWrite>, ShareError> {
        self.validate_acknowledgements(member_id, batches)?;
        let start_before = self.start_offset;
        let mut changes = Vec::new();
        let limit = self.config.delivery_count_limit;
        let renewed_deadline = now_ms.saturating_add(self.config.record_lock_duration_ms);
        for batch in batches {
            let first = batch.first_offset.max(self.start_offset);
            if first > batch.last_offset {
                continue;
            }
            // Runs of offsets with one acknowledge type.
            let mut from = first;
            while from <= batch.last_offset {
                // Validated: the types cover the batch.
                let Some(ty) = batch.type_of(from) else {
                    debug_assert!(false, "acknowledge types do not cover offset {from}");
                    break;
                };
                let mut to = from;
                while to < batch.last_offset && batch.type_of(to + 1) == Some(ty) {
                    to += 1;
                }
                self.transition(from, to, &mut changes, |r| {
                    let last = r.last_offset;
                    let count = r.delivery_count;
                    Some(match ty {
                        AcknowledgeType::Accept => {
                            InFlight::new(last, RecordState::Acknowledged, count)
                        }
                        AcknowledgeType::Release if count >= limit => {
                            InFlight::new(last, RecordState::Archived, count)
                        }
                        AcknowledgeType::Release => {
                            InFlight::new(last, RecordState::Available, count)
                        }
                        AcknowledgeType::Reject | AcknowledgeType::Gap => {
                            InFlight::new(last, RecordState::Archived, count)
                        }
                        AcknowledgeType::Renew => InFlight {
                            lock_deadline_ms: renewed_deadline,
                            ..r.clone()
                        },
                    })
                });
                from = to + 1;
            }
        }
        self.advance_start();
        let write = self.write_for(changes, start_before);
        self.check();
        Ok(write)
    }

    fn validate_acknowledgements(
        &self,
        member_id: &str,
        batches: &[AcknowledgementBatch],
    ) -> Result<(), ShareError> {
        let mut previous_last: Option<i64> = None;
        for b in batches {
            if b.first_offset > b.last_offset {
                return Err(ShareError::InvalidRequest(format!(
                    "acknowledgement batch {}..={} ends before it starts",
                    b.first_offset, b.last_offset
                )));
            }
            if previous_last.is_some_and(|p| b.first_offset <= p) {
                return Err(ShareError::InvalidRequest(
                    "acknowledgement batches overlap or are out of order".into(),
                ));
            }
            previous_last = Some(b.last_offset);
            let len = b
                .last_offset
                .saturating_sub(b.first_offset)
                .saturating_add(1);
            let types = b.acknowledge_types.len() as i64;
            if types != 1 && types != len {
                return Err(ShareError::InvalidRequest(format!(
                    "{types} acknowledge types for {len} offsets"
                )));
            }
            let first = b.first_offset.max(self.start_offset);
            if first > b.last_offset {
                // Already acknowledged or archived: nothing to do (Kafka skips it too).
                continue;
            }
            if b.last_offset >= self.end_offset {
                return Err(ShareError::InvalidRequest(format!(
                    "offset {} was never acquired",
                    b.last_offset.max(self.end_offset)
                )));
            }
            let mut runs = self
                .in_flight
                .range(..=first)
                .next_back()
                .into_iter()
                .chain(
                    self.keys_in(first + 1, b.last_offset)
                        .into_iter()
                        .filter_map(|k| self.in_flight.get_key_value(&k)),
                );
            if let Some((offset, r)) = runs.find(|(_, r)| {
                r.state != RecordState::Acquired || r.member_id.as_deref() != Some(member_id)
            }) {
                return Err(ShareError::InvalidRecordState(format!(
                    "offset {} is {}{}, not acquired by {member_id}",
                    (*offset).max(first),
                    r.state,
                    r.member_id
                        .as_deref()
                        .map(|m| format!(" by {m}"))
                        .unwrap_or_default()
                )));
            }
        }
        Ok(())
    }

    /// Releases the locks that expired at `now_ms` (protocol step 4).
    pub fn expire(&mut self, now_ms: i64) -> Expired {
        let limit = self.config.delivery_count_limit;
        let due: Vec<(i64, i64)> = self
            .in_flight
            .iter()
            .filter(|(_, r)| r.state == RecordState::Acquired && r.lock_deadline_ms <= now_ms)
            .map(|(first, r)| (*first, r.last_offset))
            .collect();
        if due.is_empty() {
            return Expired::default();
        }
        let start_before = self.start_offset;
        let mut changes = Vec::new();
        let mut available = Vec::new();
        for (first, last) in due {
            self.transition(first, last, &mut changes, |r| {
                let state = if r.delivery_count >= limit {
                    RecordState::Archived
                } else {
                    RecordState::Available
                };
                Some(InFlight::new(r.last_offset, state, r.delivery_count))
            });
            if self
                .record_state(first)
                .is_some_and(|(s, _)| s == RecordState::Available)
            {
                available.push(OffsetRange::new(first, last));
            }
        }
        self.advance_start();
        let write = self.write_for(changes, start_before);
        self.check();
        Expired { available, write }
    }

    /// Gives back what `member_id` holds, because it left the group or closed its share
    /// session (protocol step 5).
    pub fn release_member(&mut self, member_id: &str) -> Option<StateWrite> {
        let held: Vec<(i64, i64)> = self
            .in_flight
            .iter()
            .filter(|(_, r)| {
                r.state == RecordState::Acquired && r.member_id.as_deref() == Some(member_id)
            })
            .map(|(first, r)| (*first, r.last_offset))
            .collect();
        if held.is_empty() {
            return None;
        }
        let start_before = self.start_offset;
        let mut changes = Vec::new();
        for (first, last) in held {
            self.transition(first, last, &mut changes, |r| {
                Some(InFlight::new(
                    r.last_offset,
                    RecordState::Available,
                    (r.delivery_count - 1).max(0),
                ))
            });
        }
        self.advance_start();
        let write = self.write_for(changes, start_before);
        self.check();
        write
    }

    /// The log start offset moved to `log_start_offset` (retention, DeleteRecords): records
    /// below it are gone, whatever their state. Acknowledgements of them succeed without
    /// effect, as Kafka's do.
    pub fn log_start_offset_moved(&mut self, log_start_offset: i64) -> Option<StateWrite> {
        if log_start_offset <= self.start_offset {
            return None;
        }
        let start_before = self.start_offset;
        self.split_at(log_start_offset);
        let gone: Vec<i64> = self
            .in_flight
            .range(..log_start_offset)
            .map(|(k, _)| *k)
            .collect();
        for k in gone {
            self.in_flight.remove(&k);
        }
        self.start_offset = log_start_offset;
        self.end_offset = self.end_offset.max(log_start_offset);
        self.advance_start();
        let write = self.write_for(Vec::new(), start_before);
        self.check();
        write
    }

    /// The last offset a record may have to be taken in flight.
    fn cap_last(&self) -> i64 {
        self.start_offset
            .saturating_add(self.config.partition_max_record_locks)
            .saturating_sub(1)
    }

    /// Takes `end_offset..=last` in flight in `state`, never delivered.
    fn extend(&mut self, last: i64, state: RecordState) {
        if last < self.end_offset {
            return;
        }
        let first = self.end_offset;
        self.in_flight.insert(first, InFlight::new(last, state, 0));
        self.end_offset = last + 1;
        self.coalesce(first - 1, last + 1);
    }

    /// Applies `f` to every run of `first..=last` (in flight), splitting runs at both
    /// ends; `f` returns the run's new value or `None` to leave it. Changes of a persisted
    /// state are recorded in `changes`.
    fn transition(
        &mut self,
        first: i64,
        last: i64,
        changes: &mut Vec<StateBatch>,
        mut f: impl FnMut(&InFlight) -> Option<InFlight>,
    ) {
        self.split_at(first);
        self.split_at(last + 1);
        let keys = self.keys_in(first, last);
        for k in keys {
            let Some(run) = self.in_flight.get(&k) else {
                continue;
            };
            let Some(next) = f(run) else {
                continue;
            };
            if next.state != RecordState::Acquired
                && (next.state != run.state || next.delivery_count != run.delivery_count)
            {
                changes.push(StateBatch::new(
                    k,
                    next.last_offset,
                    next.state,
                    next.delivery_count,
                ));
            }
            self.in_flight.insert(k, next);
        }
        self.coalesce(first, last + 1);
    }

    /// The first offsets of the runs that start in `first..=last` (none if it is empty:
    /// `BTreeMap::range` would panic on a reversed range).
    fn keys_in(&self, first: i64, last: i64) -> Vec<i64> {
        if first > last {
            return Vec::new();
        }
        self.in_flight
            .range(first..=last)
            .map(|(k, _)| *k)
            .collect()
    }

    /// Makes `offset` the first offset of a run, if a run covers it.
    fn split_at(&mut self, offset: i64) {
        let Some((first, run)) = self.in_flight.range(..offset).next_back() else {
            return;
        };
        if run.last_offset < offset {
            return;
        }
        let first = *first;
        let tail = run.clone();
        if let Some(head) = self.in_flight.get_mut(&first) {
            head.last_offset = offset - 1;
        }
        self.in_flight.insert(offset, tail);
    }

    /// Joins the runs that agree, from the run that covers `from` to the one after `to`.
    fn coalesce(&mut self, from: i64, to: i64) {
        let begin = self
            .in_flight
            .range(..=from)
            .next_back()
            .map_or(from, |(k, _)| *k);
        let keys = self.keys_in(begin, to.saturating_add(1));
        let mut current: Option<i64> = None;
        for k in keys {
            let joined = match current.and_then(|c| self.in_flight.get(&c).map(|r| (c, r))) {
                Some((c, prev)) => match self.in_flight.get(&k) {
                    Some(next) if prev.last_offset + 1 == k && prev.joins(next) => {
                        let last = next.last_offset;
                        self.in_flight.remove(&k);
                        if let Some(prev) = self.in_flight.get_mut(&c) {
                            prev.last_offset = last;
                        }
                        true
                    }
                    _ => false,
                },
                None => false,
            };
            if !joined {
                current = Some(k);
            }
        }
    }

    /// Moves the SPSO past the acknowledged and archived prefix (protocol step 6).
    fn advance_start(&mut self) {
        while let Some((first, run)) = self.in_flight.iter().next() {
            if !run.state.is_terminal() {
                break;
            }
            let (first, last) = (*first, run.last_offset);
            self.in_flight.remove(&first);
            self.start_offset = last + 1;
        }
        if self.in_flight.is_empty() {
            self.start_offset = self.end_offset;
        }
    }

    /// The write of `changes`, if anything changed (protocol step 7).
    fn write_for(&self, changes: Vec<StateBatch>, start_before: i64) -> Option<StateWrite> {
        if changes.is_empty() && self.start_offset == start_before {
            return None;
        }
        let state_batches = crate::state_batch::combine(&[], &changes, self.start_offset);
        Some(StateWrite {
            state_epoch: self.state_epoch,
            leader_epoch: self.leader_epoch,
            start_offset: self.start_offset,
            delivery_complete_count: self.delivery_complete_count(),
            state_batches,
        })
    }

    /// Asserts the shape the module relies on (STYLE.md, example 4): runs cover
    /// `start..end` exactly, the first is not terminal, and only ACQUIRED runs have a holder.
    fn check(&self) {
        let mut next = self.start_offset;
        for (first, run) in &self.in_flight {
            debug_assert_eq!(
                *first, next,
                "in-flight runs leave a gap or overlap at {next}"
            );
            debug_assert!(run.last_offset >= *first, "empty run at {first}");
            debug_assert_eq!(
                run.member_id.is_some(),
                run.state == RecordState::Acquired,
                "run at {first} is {} with holder {:?}",
                run.state,
                run.member_id
            );
            next = run.last_offset + 1;
        }
        debug_assert_eq!(
            next, self.end_offset,
            "in-flight runs do not reach the end offset"
        );
        debug_assert!(
            self.in_flight
                .values()
                .next()
                .is_none_or(|r| !r.state.is_terminal()),
            "the start offset was not advanced"
        );
    }
}
