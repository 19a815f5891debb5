//! The share-partitions this broker leads (Kafka's `SharePartitionManager`): one
//! [`SharePartition`] per share group and partition, loaded from the share coordinator on
//! first use, fed with the log for acquisitions, and persisted through the
//! [`ShareStatePersister`](super::share_persister::ShareStatePersister) after every lasting
//! change; and the share sessions of ShareFetch and ShareAcknowledge (Kafka's
//! `ShareSessionCache`).
//!
//! # Protocol
//! 1. A share-partition is served only by the partition's leader. It is loaded at the
//!    leader epoch the replica manager holds, from ReadShareGroupState's answer; a state
//!    never persisted (start offset -1) starts where `share.auto.offset.reset` says
//!    (earliest: the log start; latest: the high watermark, or the last stable offset
//!    under read_committed; `by_duration`: the first record no older than that).
//! 2. A share-partition loaded under an older leader epoch, or whose leadership is gone,
//!    is dropped and loaded again: its in-memory acquisitions die with the leadership,
//!    as they do in Kafka (ACQUIRED is never persisted).
//! 3. One share-partition's operations run one at a time (an async mutex), each one up to
//!    its persisted write: an acknowledgement is answered only once WriteShareGroupState
//!    succeeded. A failed write drops the share-partition, which the next use loads from
//!    what is persisted, so memory never runs ahead of the share coordinator for long.
//! 4. Acquire reads the log from [`SharePartition::next_fetch_offset`] up to the high
//!    watermark (the last stable offset under read_committed, with the aborted
//!    transactions' batches skipped and so archived); control batches are acquired as the
//!    log holds them and acknowledged by the client as GAP, as with Kafka.
//! 5. A timer task expires acquisition locks ([`SharePartition::expire`]) every
//!    [`EXPIRY_TICK`], persists what the expiry changed, and wakes parked ShareFetches:
//!    records became AVAILABLE.
//! 6. A share session ends with the connection its last request came on (as Kafka 4.1's
//!    `ShareSessionCache` does): the next tick gives back the records its member holds,
//!    as a member's leaving does, so that a consumer that died is not waited for until
//!    its locks expire. A consumer that hangs with its connection open is.
//! 7. A group with no share session left on this broker (its last member closed its
//!    session, or its connection) has its share-partitions dropped, as Kafka's
//!    `onGroupEmpty` does: whatever replaced its persisted state meanwhile
//!    (AlterShareGroupOffsets, DeleteShareGroupOffsets, on whichever broker) is what the
//!    next member's fetch loads.
//!
//! # Why it is correct
//! Invariant 12 rests on the state machine's proof (`rill_share::SharePartition`) and on
//! two things here: every acknowledgement is persisted before it is answered, and a
//! share-partition is rebuilt from persisted state whenever memory and the coordinator
//! may disagree (a new leader epoch, a failed write) — so an accepted record is ACKNOWLEDGED
//! or below the start offset in every state a later leader loads.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use rill_metadata::RESOURCE_GROUP;
use rill_protocol::generated::fetch_response::AbortedTransaction;
use rill_protocol::records::{AbortedTransactions, RecordBatch};
use rill_protocol::{ErrorCode, Uuid};
use rill_share::{
    AcknowledgementBatch, AcquiredRecords, FetchedBatch, OffsetRange, ResetSpec, ShareAcquireMode,
    ShareAutoOffsetReset, ShareFetch, SharePartition, SharePartitionConfig, SharePartitionKey,
    StateWrite,
};
use rill_storage::TopicPartition;
use tokio::sync::{watch, Mutex, Notify};

use crate::server::Broker;

/// How often acquisition locks are checked for expiry.
pub const EXPIRY_TICK: Duration = Duration::from_millis(100);

/// One share-partition: loaded, or to be loaded at its next use.
#[derive(Default)]
pub struct Slot {
    loaded: Option<Loaded>,
}

struct Loaded {
    sp: SharePartition,
    tp: TopicPartition,
}

/// A member's share session: the partitions it fetches from and the epoch its next
/// request must carry.
#[derive(Debug, Clone)]
pub struct ShareSession {
    pub next_epoch: i32,
    pub partitions: BTreeSet<(Uuid, i32)>,
    pub last_used: Instant,
    /// The connection its last request came on: the session ends with it.
    pub connection_id: u64,
}

/// A member whose records are to be given back: its session's connection closed.
type Release = (String, String, BTreeSet<(Uuid, i32)>);

/// The share-partitions and share sessions of this broker.
#[derive(Default)]
pub struct SharePartitions {
    slots: StdMutex<HashMap<SharePartitionKey, Arc<Mutex<Slot>>>>,
    /// (group id, member id) -> session.
    pub(crate) sessions: StdMutex<HashMap<(String, String), ShareSession>>,
    /// Records became AVAILABLE again (released, lock expired): parked fetches try again.
    pub(crate) available: Notify,
    /// Sessions ended by their connection, released by the next timer tick.
    released: StdMutex<Vec<Release>>,
}

/// What one acquire gave a member.
#[derive(Debug, Default)]
pub struct Acquisition {
    pub records: Bytes,
    pub acquired: Vec<AcquiredRecords>,
}

impl SharePartitions {
    fn slot(&self, key: &SharePartitionKey) -> Arc<Mutex<Slot>> {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        slots.entry(key.clone()).or_default().clone()
    }

    fn all(&self) -> Vec<(SharePartitionKey, Arc<Mutex<Slot>>)> {
        let slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        slots.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    }

    fn forget(&self, key: &SharePartitionKey) {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        slots.remove(key);
    }

    /// Ends the sessions whose last request came on `connection_id` (protocol step 6):
    /// their members' records are given back at the next tick.
    pub fn connection_closed(&self, connection_id: u64) {
        let mut sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        let ended: Vec<(String, String)> = sessions
            .iter()
            .filter(|(_, s)| s.connection_id == connection_id)
            .map(|(k, _)| k.clone())
            .collect();
        if ended.is_empty() {
            return;
        }
        let mut released = self.released.lock().unwrap_or_else(|e| e.into_inner());
        for key in ended {
            if let Some(session) = sessions.remove(&key) {
                released.push((key.0, key.1, session.partitions));
            }
        }
    }

    fn take_released(&self) -> Vec<Release> {
        std::mem::take(&mut *self.released.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Whether any member of `group` has a share session on this broker.
    pub fn group_has_sessions(&self, group: &str) -> bool {
        let sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        sessions.keys().any(|(g, _)| g == group)
    }

    /// After a session of `group` ended: with none left here, the group's share-partitions
    /// are dropped (protocol step 7).
    pub fn session_ended(&self, group: &str) {
        if !self.group_has_sessions(group) {
            self.forget_group(group);
        }
    }

    /// Drops `group`'s loaded share-partitions: their persisted state was replaced
    /// (AlterShareGroupOffsets, DeleteShareGroupOffsets, DeleteGroups, all of them for an
    /// empty group), so the next use loads it again. A leader on another broker learns
    /// of it when its next write is fenced (FENCED_STATE_EPOCH).
    pub fn forget_group(&self, group: &str) {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        slots.retain(|key, _| key.group_id != group);
    }

    /// How many share-partitions are loaded (for tests and metrics).
    pub fn len(&self) -> usize {
        self.slots.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The offsets `batches` of a read cover, with those an isolation level hides.
struct ReadBatches {
    batches: Vec<FetchedBatch>,
    skip: Vec<OffsetRange>,
    /// Byte end of each batch in the read, for cutting the records after the last
    /// acquired one.
    ends: Vec<usize>,
}

fn read_batches(records: &Bytes, aborted: Option<&[AbortedTransaction]>) -> ReadBatches {
    let mut out = ReadBatches {
        batches: Vec::new(),
        skip: Vec::new(),
        ends: Vec::new(),
    };
    let mut filter = aborted.map(|a| AbortedTransactions::new(Some(a)));
    let mut end = 0usize;
    for batch in RecordBatch::iter(records.clone()) {
        let Ok(batch) = batch else { break };
        end += batch.size();
        let range = FetchedBatch {
            base_offset: batch.base_offset(),
            last_offset: batch.last_offset(),
        };
        if range.last_offset < range.base_offset {
            break;
        }
        if let Some(f) = filter.as_mut() {
            // Every batch goes through the filter, control batches too: an ABORT marker
            // ends its producer's aborted run. Control batches are acquired, not skipped.
            if !f.deliver(&batch) && !batch.is_control() {
                out.skip
                    .push(OffsetRange::new(range.base_offset, range.last_offset));
            }
        }
        out.batches.push(range);
        out.ends.push(end);
    }
    out
}

/// The leader's limits for `group`'s share-partitions.
fn share_partition_config(broker: &Broker, group: &str) -> SharePartitionConfig {
    let defaults = SharePartitionConfig::default();
    let lock = broker.group_config_ms(
        group,
        "share.record.lock.duration.ms",
        "group.share.record.lock.duration.ms",
    );
    let int = |key: &str| -> Option<i64> {
        crate::config::broker_config_value(&broker.config, &broker.image(), broker.node_id, key)
            .and_then(|(v, _)| v.trim().parse().ok())
    };
    SharePartitionConfig {
        record_lock_duration_ms: if lock > 0 {
            i64::from(lock)
        } else {
            defaults.record_lock_duration_ms
        },
        delivery_count_limit: int("group.share.delivery.count.limit")
            .and_then(|v| i16::try_from(v).ok())
            .filter(|v| *v > 0)
            .unwrap_or(defaults.delivery_count_limit),
        partition_max_record_locks: int("group.share.partition.max.record.locks")
            .filter(|v| *v > 0)
            .unwrap_or(defaults.partition_max_record_locks),
    }
}

/// A GROUP config of `group` as a string: its override, else `default`.
fn group_config_str(broker: &Broker, group: &str, name: &str, default: &str) -> String {
    broker
        .image()
        .configs
        .get(&(RESOURCE_GROUP, group.to_owned()))
        .and_then(|o| o.get(name))
        .map(|v| v.trim().to_owned())
        .unwrap_or_else(|| default.to_owned())
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

impl Broker {
    /// Whether `group` reads read_committed (`share.isolation.level`).
    pub(crate) fn share_read_committed(&self, group: &str) -> bool {
        group_config_str(self, group, "share.isolation.level", "read_uncommitted")
            == "read_committed"
    }

    /// The acquisition lock duration `group`'s members are told of.
    pub(crate) fn share_lock_duration_ms(&self, group: &str) -> i32 {
        i32::try_from(share_partition_config(self, group).record_lock_duration_ms)
            .unwrap_or(i32::MAX)
    }

    /// The partition behind a share-partition, with the leader epoch this broker leads
    /// it at (protocol step 1).
    fn share_partition_leader(
        &self,
        topic_id: &Uuid,
        partition: i32,
    ) -> Result<(TopicPartition, i32), ErrorCode> {
        let topic = self
            .topic_name_by_id(topic_id)
            .ok_or(ErrorCode::UNKNOWN_TOPIC_ID)?;
        let tp = TopicPartition { topic, partition };
        let (_, epoch) = self.replicas.leader_partition(&tp)?;
        Ok((tp, epoch))
    }

    /// Runs `f` on the loaded share-partition of `key`, loading it first when it is not
    /// loaded at the current leader epoch (protocol steps 1-3). `f`'s write, if any, is
    /// persisted before this returns; a failed write drops the share-partition.
    async fn with_share_partition<T>(
        &self,
        key: &SharePartitionKey,
        f: impl FnOnce(&mut SharePartition, &TopicPartition) -> (T, Option<StateWrite>),
    ) -> Result<T, ErrorCode> {
        let (tp, epoch) = self.share_partition_leader(&key.topic_id, key.partition)?;
        let slot = self.share_partitions.slot(key);
        let mut guard = slot.lock().await;
        if guard
            .loaded
            .as_ref()
            .is_none_or(|l| l.sp.leader_epoch() != epoch || l.tp != tp)
        {
            guard.loaded = None;
            let sp = self.load_share_partition(key, &tp, epoch).await?;
            guard.loaded = Some(Loaded { sp, tp });
        }
        let Some(loaded) = guard.loaded.as_mut() else {
            return Err(ErrorCode::UNKNOWN_SERVER_ERROR);
        };
        let (out, write) = f(&mut loaded.sp, &loaded.tp);
        if let Some(write) = write {
            if let Err(code) = self.share_persister.write(key.clone(), &write).await {
                tracing::warn!(%key, ?code, "persisting share-partition state failed; reloading it");
                guard.loaded = None;
                return Err(code);
            }
        }
        Ok(out)
    }

    async fn load_share_partition(
        &self,
        key: &SharePartitionKey,
        tp: &TopicPartition,
        leader_epoch: i32,
    ) -> Result<SharePartition, ErrorCode> {
        let persisted = self.share_persister.read(key.clone(), leader_epoch).await?;
        let offsets = self.replicas.offsets(tp)?;
        let read_committed = self.share_read_committed(&key.group_id);
        let reset = if persisted.start_offset < 0 {
            let policy: ShareAutoOffsetReset =
                group_config_str(self, &key.group_id, "share.auto.offset.reset", "latest")
                    .parse()
                    .unwrap_or_default();
            let latest = if read_committed {
                offsets.last_stable_offset
            } else {
                offsets.high_watermark
            };
            match policy.spec(now_ms()) {
                ResetSpec::Earliest => offsets.log_start_offset,
                ResetSpec::Latest => latest,
                ResetSpec::Timestamp(ts) => self
                    .replicas
                    .offset_for_timestamp(tp, ts)?
                    .map_or(latest, |(offset, _, _)| offset.min(latest)),
            }
        } else {
            0
        };
        let config = share_partition_config(self, &key.group_id);
        let mut sp = SharePartition::from_persisted(
            key.group_id.clone(),
            key.topic_id,
            key.partition,
            config,
            leader_epoch,
            &persisted,
            reset,
        )
        .map_err(|e| {
            tracing::error!(%key, error = %e, "cannot load share-partition state");
            e.error_code()
        })?;
        // Records deleted by retention since the state was written are gone for good.
        if sp.start_offset() < offsets.log_start_offset {
            if let Some(write) = sp.log_start_offset_moved(offsets.log_start_offset) {
                self.share_persister.write(key.clone(), &write).await?;
            }
        }
        tracing::debug!(%key, leader_epoch, start = sp.start_offset(), "share-partition loaded");
        Ok(sp)
    }

    /// Acquires records of the share-partition `key` for `member` (protocol step 4).
    pub(crate) async fn share_acquire(
        &self,
        key: &SharePartitionKey,
        member: &str,
        max_records: i32,
        max_bytes: usize,
        mode: ShareAcquireMode,
    ) -> Result<Acquisition, ErrorCode> {
        let read_committed = self.share_read_committed(&key.group_id);
        let replicas = self.replicas.clone();
        self.with_share_partition(key, |sp, tp| {
            if !sp.can_acquire() {
                return (Ok(Acquisition::default()), None);
            }
            let mut offset = sp.next_fetch_offset();
            let mut write = None;
            let read = loop {
                match replicas.read_maybe_zero_copy(
                    tp,
                    -1,
                    offset,
                    max_bytes.max(1),
                    true,
                    false,
                    read_committed,
                ) {
                    Ok(read) => break read,
                    Err((ErrorCode::OFFSET_OUT_OF_RANGE, Some(o)))
                        if offset < o.log_start_offset && write.is_none() =>
                    {
                        // Retention deleted what the share group had not delivered yet.
                        write = Some(sp.log_start_offset_moved(o.log_start_offset));
                        offset = sp.next_fetch_offset();
                    }
                    Err((code, _)) => return (Err(code), write.flatten()),
                }
            };
            let write = write.flatten();
            let aborted: Option<Vec<AbortedTransaction>> =
                read.aborted_transactions.as_ref().map(|list| {
                    list.iter()
                        .map(|a| AbortedTransaction {
                            producer_id: a.producer_id,
                            first_offset: a.first_offset,
                            ..Default::default()
                        })
                        .collect()
                });
            let read_batches = read_batches(&read.records, aborted.as_deref());
            if read_batches.batches.is_empty() {
                return (Ok(Acquisition::default()), write);
            }
            let fetch = ShareFetch {
                fetch_offset: offset,
                batches: &read_batches.batches,
                max_records,
                acquire_mode: mode,
                skip: &read_batches.skip,
            };
            let acquired = sp.acquire(member, &fetch, now_ms());
            let write = match (write, acquired.write) {
                // The acquire's write carries the start offset the retention moved.
                (_, Some(w)) => Some(w),
                (w, None) => w,
            };
            let Some(last) = acquired.records.iter().map(|r| r.last_offset).max() else {
                return (Ok(Acquisition::default()), write);
            };
            // The batches up to the last one holding an acquired record.
            let kept = read_batches
                .batches
                .iter()
                .position(|b| b.last_offset >= last)
                .map_or(read_batches.ends.len(), |i| i + 1);
            let end = read_batches
                .ends
                .get(kept.saturating_sub(1))
                .copied()
                .unwrap_or(0);
            let records = read.records.slice(..end.min(read.records.len()));
            (
                Ok(Acquisition {
                    records,
                    acquired: acquired.records,
                }),
                write,
            )
        })
        .await?
    }

    /// Applies `member`'s acknowledgements to the share-partition `key`, answered once
    /// persisted (protocol step 3).
    pub(crate) async fn share_acknowledge(
        &self,
        key: &SharePartitionKey,
        member: &str,
        batches: &[AcknowledgementBatch],
    ) -> Result<(), ErrorCode> {
        let result = self
            .with_share_partition(key, |sp, _| {
                match sp.acknowledge(member, batches, now_ms()) {
                    Ok(write) => (Ok(()), write),
                    Err(e) => (Err(e.error_code()), None),
                }
            })
            .await?;
        // A RELEASE made records available to others.
        self.share_partitions.available.notify_waiters();
        result
    }

    /// Gives back what `member` holds in the share-partition `key` (its session closed).
    pub(crate) async fn share_release_member(&self, key: &SharePartitionKey, member: &str) {
        let released = self
            .with_share_partition(key, |sp, _| ((), sp.release_member(member)))
            .await;
        if let Err(code) = released {
            tracing::debug!(%key, member, ?code, "releasing a closed session's records");
        }
        self.share_partitions.available.notify_waiters();
    }

    /// Protocol steps 2 and 5, once: expired locks made AVAILABLE (and persisted),
    /// share-partitions whose leadership is gone dropped.
    pub(crate) async fn share_expire_locks(&self) {
        for (group, member, partitions) in self.share_partitions.take_released() {
            tracing::debug!(
                group,
                member,
                "a share session's connection closed; releasing its records"
            );
            for (topic_id, partition) in partitions {
                let key = SharePartitionKey::new(&group, topic_id, partition);
                self.share_release_member(&key, &member).await;
            }
            self.share_partitions.session_ended(&group);
        }
        let now = now_ms();
        let mut woke = false;
        for (key, slot) in self.share_partitions.all() {
            // A share-partition busy with a request is looked at next tick.
            let Ok(mut guard) = slot.try_lock() else {
                continue;
            };
            let Some(loaded) = guard.loaded.as_mut() else {
                drop(guard);
                self.share_partitions.forget(&key);
                continue;
            };
            let leads = self
                .replicas
                .leader_partition(&loaded.tp)
                .is_ok_and(|(_, epoch)| epoch == loaded.sp.leader_epoch());
            if !leads {
                guard.loaded = None;
                drop(guard);
                self.share_partitions.forget(&key);
                continue;
            }
            if loaded.sp.next_deadline().is_none_or(|d| d > now) {
                continue;
            }
            let expired = loaded.sp.expire(now);
            woke |= !expired.available.is_empty();
            if let Some(write) = expired.write {
                if let Err(code) = self.share_persister.write(key.clone(), &write).await {
                    tracing::warn!(%key, ?code, "persisting expired locks failed; reloading");
                    guard.loaded = None;
                }
            }
        }
        if woke {
            self.share_partitions.available.notify_waiters();
        }
    }
}

/// Runs the lock-expiry timer (protocol step 5) until shutdown.
pub fn start_expiry(broker: std::sync::Weak<Broker>, mut shutdown: watch::Receiver<bool>) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(EXPIRY_TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = shutdown.changed() => return,
            }
            if *shutdown.borrow() {
                return;
            }
            let Some(broker) = broker.upgrade() else {
                return;
            };
            broker.share_expire_locks().await;
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use rill_protocol::records::{CompressionType, RecordBatchBuilder};

    fn batch(base: i64, n: i64, producer: Option<i64>) -> Bytes {
        let mut b = RecordBatchBuilder::new(CompressionType::None, base);
        if let Some(p) = producer {
            b = b.producer(p, 0, 0).transactional(true);
        }
        for i in 0..n {
            b.append(i, None, Some(b"v"), &[]).unwrap();
        }
        b.build().unwrap()
    }

    #[test]
    fn read_batches_lists_every_batch_and_their_byte_ends() {
        let mut all = Vec::new();
        let a = batch(0, 3, None);
        let b = batch(3, 2, None);
        all.extend_from_slice(&a);
        all.extend_from_slice(&b);
        // A trailing partial batch is not listed.
        all.extend_from_slice(&batch(5, 1, None)[..20]);
        let read = read_batches(&Bytes::from(all), None);
        assert_eq!(
            read.batches,
            vec![
                FetchedBatch {
                    base_offset: 0,
                    last_offset: 2
                },
                FetchedBatch {
                    base_offset: 3,
                    last_offset: 4
                }
            ]
        );
        assert_eq!(read.ends, vec![a.len(), a.len() + b.len()]);
        assert!(read.skip.is_empty());
    }

    #[test]
    fn read_committed_skips_the_batches_of_aborted_transactions() {
        let mut all = Vec::new();
        all.extend_from_slice(&batch(0, 2, Some(7)));
        all.extend_from_slice(&batch(2, 2, Some(8)));
        let aborted = [AbortedTransaction {
            producer_id: 7,
            first_offset: 0,
            ..Default::default()
        }];
        let read = read_batches(&Bytes::from(all), Some(&aborted));
        assert_eq!(read.batches.len(), 2);
        assert_eq!(read.skip, vec![OffsetRange::new(0, 1)]);
    }
}
