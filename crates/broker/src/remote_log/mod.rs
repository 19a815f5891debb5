//! Tiered storage (KIP-405; Kafka's `RemoteLogManager`): the partition leader copies
//! closed segments to an S3-compatible store, retention deletes them there, and reads
//! below the local log start are served from the copies. Invisible to Fetch's clients.
//!
//! - [`storage`]: the store (`object_store`), Kafka's `RemoteStorageManager`.
//! - [`reader`]: reads from the remote tier through a bounded cache on local disk.
//! - this module: the periodic task of each partition (copy, expiration, cleanup of
//!   copies a failed leader left, and the followers' view of what is remote).
//!
//! The remote segment metadata lives in the metadata log (`rill_metadata::remote_log`
//! says why and holds the segment state machine); the log's side (which segments are
//! candidates, local retention held to what is remote, the epoch lineage check) is
//! `rill_storage::remote`. This module does the I/O between them.
//!
//! # Protocol (each partition, every `remote.log.manager.task.interval.ms`)
//!
//! Up to `remote.log.manager.copier.thread.pool.size` partitions (Kafka's default, 10)
//! run their pass at once; within a pass a partition's steps go in order.
//!
//! 1. The finished copies that belong to the log's leader epoch lineage give the highest
//!    offset in the remote tier; the log is told (on leaders and followers alike), so
//!    that its local retention may delete what is below it and nothing else.
//! 2. On the leader only (at its current leader epoch, holding its lease):
//!    - (a) copies a failed leader left half-made (COPY_SEGMENT_STARTED; nothing of
//!      this broker's is in flight between two passes), once older than
//!      `remote.log.manager.copy.cleanup.delay.ms` (a PUT the dead leader had sent must
//!      not land after the cleanup), and deletions it left unfinished
//!      (DELETE_SEGMENT_STARTED) are finished: marked, objects deleted, marked done;
//!    - (b) unless `remote.log.copy.disable`, each copy candidate (a closed segment
//!      wholly below the last stable offset, above the highest remote offset) gets a
//!      new segment id, COPY_SEGMENT_STARTED, its files uploaded, then
//!      COPY_SEGMENT_FINISHED, and the log's highest remote offset moves to its end;
//!    - (c) the whole log's retention (`retention.ms`, `retention.bytes` counted over
//!      the remote copies and the local segments not yet copied) deletes the oldest
//!      copies through DELETE_SEGMENT_STARTED and DELETE_SEGMENT_FINISHED.
//! 3. A failure (the store down or slow, the controller unreachable, a change refused
//!    because leadership moved) ends the pass for that partition; it is tried again
//!    after `remote.log.manager.task.retry.backoff.ms`, doubling up to
//!    `remote.log.manager.task.retry.backoff.max.ms`.
//!
//! # Why it is correct
//!
//! - Nothing is read before it is whole: readers serve COPY_SEGMENT_FINISHED only, which
//!   is written after every object of the copy is in the store; a leader killed between
//!   the two leaves a COPY_SEGMENT_STARTED entry that no one reads and the next leader
//!   deletes (2a).
//! - Nothing is deleted locally before it is remote: the log deletes a local segment only
//!   below the highest remote offset of step 1, which only finished copies raise.
//! - No duplicate and no hole: copies are made in offset order from the highest remote
//!   offset of the lineage, so a new leader continues where the finished copies end
//!   (its first copy may overlap the last one, which readers resolve by offset).
//! - A deposed leader cannot finish a copy: the controller refuses its changes by leader
//!   and leader epoch (`rill_metadata::remote_log`).
//! - Produce never waits for the store: copies are made by this task from closed
//!   segments, after the fact; a store that is down only lets the local tier grow.

pub mod reader;
pub mod storage;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use rill_metadata::remote_log::RemoteLogSegmentChange;
use rill_metadata::{
    ControllerEvent, ControllerResponse, MetadataImage, RemoteLogSegmentMetadata,
    RemoteLogSegmentState, RemoteLogSegmentUpdateRequest,
};
use rill_protocol::{ErrorCode, Uuid};
use rill_storage::remote::{
    epoch_checkpoint_bytes, is_segment_within_leader_epochs, remote_segments_to_delete,
    RemoteSegmentSummary,
};
use rill_storage::TopicPartition;
use tokio::sync::watch;

use self::reader::{finished_segments, RemoteLogReader};
use self::storage::{RemotePartition, RemoteStorageConfig, RemoteStorageManager};
use crate::config::BrokerConfig;
use crate::error::BrokerError;
use crate::metrics;
use crate::replication::alter_partition::ControllerChannel;
use crate::replication::replica_manager::{
    Partition, RemoteTierLookup, RemoteTierState, ReplicaManager,
};

/// Copies made per partition in one pass, so that one partition far behind does not
/// hold back the others' passes (the next pass goes on).
const COPIES_PER_PASS: usize = 8;

/// The task's settings (Kafka's `RemoteLogManagerConfig`).
#[derive(Debug, Clone, Copy)]
pub struct RemoteLogManagerConfig {
    /// `remote.log.manager.task.interval.ms`.
    pub task_interval: Duration,
    /// `remote.log.manager.task.retry.backoff.ms` and `.max.ms`.
    pub retry_backoff: Duration,
    pub retry_backoff_max: Duration,
    /// `remote.log.reader.cache.size.bytes` (Rill's).
    pub cache_bytes: u64,
    /// `remote.log.manager.copier.thread.pool.size`: partitions whose passes run at once
    /// (Kafka's copier threads; here tasks on the runtime, as the work is I/O).
    pub copier_pool_size: usize,
    /// `remote.log.manager.copy.cleanup.delay.ms` (Rill's): how old a copy a failed
    /// leader left must be before it is deleted (step 2a), so that the PUTs that leader
    /// had already sent have landed (or failed) first and none lands after the cleanup.
    pub copy_cleanup_delay: Duration,
}

impl RemoteLogManagerConfig {
    pub fn from_config(config: &BrokerConfig) -> Result<Self, BrokerError> {
        let ms = |k: &str| {
            config
                .parse::<u64>(k)
                .map(|v| Duration::from_millis(v.max(10)))
        };
        Ok(Self {
            task_interval: ms("remote.log.manager.task.interval.ms")?,
            retry_backoff: ms("remote.log.manager.task.retry.backoff.ms")?,
            retry_backoff_max: ms("remote.log.manager.task.retry.backoff.max.ms")?,
            cache_bytes: config.parse("remote.log.reader.cache.size.bytes")?,
            copier_pool_size: config.parse("remote.log.manager.copier.thread.pool.size")?,
            copy_cleanup_delay: ms("remote.log.manager.copy.cleanup.delay.ms")?,
        })
    }
}

/// The remote tier's reader when `remote.log.storage.system.enable` is on (`None` when
/// it is off), with its cache under `data_dir`.
pub fn build(
    config: &BrokerConfig,
    data_dir: &std::path::Path,
) -> Result<Option<Arc<RemoteLogReader>>, BrokerError> {
    let Some(store) = RemoteStorageConfig::from_config(config)? else {
        return Ok(None);
    };
    let settings = RemoteLogManagerConfig::from_config(config)?;
    let rsm = Arc::new(RemoteStorageManager::new(&store)?);
    let reader = RemoteLogReader::new(rsm, data_dir, settings.cache_bytes)
        .map_err(|e| BrokerError::io(data_dir.join(reader::CACHE_DIR).display(), e))?;
    tracing::info!(bucket = %store.bucket, prefix = %store.prefix, endpoint = ?store.endpoint, "tiered storage on");
    Ok(Some(Arc::new(reader)))
}

/// Where the task reads the metadata image it acts on (the broker's latest).
pub type ImageSource = Box<dyn Fn() -> Option<Arc<MetadataImage>> + Send + Sync>;

/// A follower's view of the remote tier: the leader's epochs and producer snapshot at
/// the end of the copy that ends just below the offset it starts its log at.
struct FollowerState {
    reader: Arc<RemoteLogReader>,
    image: ImageSource,
}

impl RemoteTierState for FollowerState {
    fn state_at(
        &self,
        tp: &TopicPartition,
        topic_id: Uuid,
        offset: i64,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = RemoteTierLookup> + Send + '_>> {
        let image = (self.image)();
        let rp = RemotePartition {
            topic: tp.topic.clone(),
            topic_id,
            partition: tp.partition,
        };
        Box::pin(async move {
            let Some(image) = image else {
                return RemoteTierLookup::NotYet;
            };
            let tiered = image.topic_config(&rp.topic, "remote.storage.enable") == Some("true")
                || image.remote_segments(topic_id, rp.partition).is_some();
            if !tiered {
                return RemoteTierLookup::NotTiered;
            }
            let Some(segments) = image.remote_segments(topic_id, rp.partition) else {
                return RemoteTierLookup::NotYet;
            };
            // The copy that ends just below `offset` carries the state at `offset`; one
            // that only holds `offset - 1` is the next best.
            let Some(seg) = reader::finished_segments(segments)
                .into_iter()
                .find(|m| m.end_offset == offset - 1)
                .or_else(|| reader::segment_for_offset(segments, offset - 1))
                .cloned()
            else {
                return RemoteTierLookup::NotYet;
            };
            match self.reader.aux_state(&rp, &seg).await {
                Ok((epochs, snapshot)) if !epochs.is_empty() => {
                    RemoteTierLookup::Found((epochs, snapshot))
                }
                Ok(_) => RemoteTierLookup::NotTiered,
                Err(e) => {
                    tracing::warn!(topic = %rp.topic, partition = rp.partition, error = %e, "the remote tier's state for a new replica is unreadable; asking again");
                    RemoteTierLookup::NotYet
                }
            }
        })
    }
}

/// Starts the periodic task of the module's protocol, and gives the replica manager's
/// followers the remote tier's state; the task stops when `shutdown` turns true.
pub fn start<C: ControllerChannel>(
    channel: Arc<C>,
    reader: Arc<RemoteLogReader>,
    replicas: Arc<ReplicaManager>,
    image: ImageSource,
    config: RemoteLogManagerConfig,
    shutdown: watch::Receiver<bool>,
) {
    let image: Arc<ImageSource> = Arc::new(image);
    let follower_image = image.clone();
    replicas.set_remote_tier_state(Arc::new(FollowerState {
        reader: reader.clone(),
        image: Box::new(move || follower_image()),
    }));
    let task = RemoteLogTask {
        channel,
        reader,
        replicas,
        image: Box::new(move || image()),
        config,
    };
    tokio::spawn(task.run(shutdown));
}

/// Why a partition's pass stopped.
#[derive(Debug, thiserror::Error)]
enum TaskError {
    #[error(transparent)]
    Store(#[from] storage::RemoteStorageError),
    #[error("the controller refused a remote segment change: {}", .0.name())]
    Refused(ErrorCode),
    #[error("log: {}", .0.name())]
    Log(ErrorCode),
    #[error("storage: {0}")]
    Storage(#[from] rill_storage::StorageError),
}

struct RemoteLogTask<C> {
    channel: Arc<C>,
    reader: Arc<RemoteLogReader>,
    replicas: Arc<ReplicaManager>,
    image: ImageSource,
    config: RemoteLogManagerConfig,
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// The finished copies of `segments` in the log's lineage, oldest first (step 1).
fn lineage<'a>(
    segments: &'a [RemoteLogSegmentMetadata],
    log_epochs: &BTreeMap<i32, i64>,
    log_end_offset: i64,
) -> Vec<&'a RemoteLogSegmentMetadata> {
    let mut v: Vec<_> = segments
        .iter()
        .filter(|m| m.state == RemoteLogSegmentState::CopySegmentFinished)
        .filter(|m| {
            is_segment_within_leader_epochs(
                &m.segment_leader_epochs,
                m.end_offset,
                log_epochs,
                log_end_offset,
            )
        })
        .collect();
    v.sort_by_key(|m| (m.start_offset, m.end_offset));
    v
}

impl<C: ControllerChannel> RemoteLogTask<C> {
    async fn run(self, mut shutdown: watch::Receiver<bool>) {
        // Per partition: when it may be tried again, and the backoff that follows.
        let mut backoff: HashMap<TopicPartition, (Instant, Duration)> = HashMap::new();
        loop {
            tokio::select! {
                _ = tokio::time::sleep(self.config.task_interval) => {}
                _ = shutdown.changed() => return,
            }
            let Some(image) = (self.image)() else {
                continue;
            };
            let partitions = self.replicas.partitions();
            let hosted: std::collections::HashSet<&TopicPartition> =
                partitions.iter().map(|(tp, _)| tp).collect();
            backoff.retain(|tp, _| hosted.contains(tp));
            let now = Instant::now();
            let due: Vec<(TopicPartition, Arc<Partition>)> = partitions
                .iter()
                .filter(|(tp, _)| backoff.get(tp).is_none_or(|(until, _)| now >= *until))
                .cloned()
                .collect();
            // Partitions in parallel, `remote.log.manager.copier.thread.pool.size` at a
            // time (each partition's copies stay in offset order within its pass).
            let (this, shutdown, image) = (&self, &shutdown, &image);
            let outcomes: Vec<(TopicPartition, Result<(), TaskError>)> = futures::stream::iter(due)
                .map(move |(tp, partition)| async move {
                    if *shutdown.borrow() {
                        return (tp, Ok(()));
                    }
                    let outcome = this.pass(&tp, &partition, image).await;
                    (tp, outcome)
                })
                .buffer_unordered(self.config.copier_pool_size.max(1))
                .collect()
                .await;
            if *shutdown.borrow() {
                return;
            }
            for (tp, outcome) in outcomes {
                match outcome {
                    Ok(()) => {
                        backoff.remove(&tp);
                    }
                    Err(e) => {
                        metrics::inc(&metrics::global().remote_log.task_failures);
                        let next = backoff
                            .get(&tp)
                            .map_or(self.config.retry_backoff, |(_, d)| {
                                (*d * 2).min(self.config.retry_backoff_max)
                            });
                        tracing::warn!(%tp, error = %e, retry_in_ms = next.as_millis() as u64, "remote log task failed");
                        backoff.insert(tp, (Instant::now() + next, next));
                    }
                }
            }
        }
    }

    async fn pass(
        &self,
        tp: &TopicPartition,
        partition: &Arc<Partition>,
        image: &MetadataImage,
    ) -> Result<(), TaskError> {
        let config = partition
            .with_log(|log| log.config().clone())
            .map_err(TaskError::Log)?;
        let rp = RemotePartition {
            topic: tp.topic.clone(),
            topic_id: partition.topic_id,
            partition: tp.partition,
        };
        if !config.remote_storage_enable {
            // Turned off with `remote.log.delete.on.disable` (KIP-950): the leader deletes
            // the remote part; otherwise it stays readable.
            let state = partition.state();
            let leads = state.leader == self.channel.broker_id() && self.replicas.lease_held();
            let any = image.remote_segments(rp.topic_id, rp.partition).is_some();
            if config.remote_log_delete_on_disable && leads && any {
                let lock = self.reader.change_lock(rp.topic_id, rp.partition);
                let _changing = lock.lock().await;
                let image = (self.image)().unwrap_or_else(|| Arc::new(image.clone()));
                for m in remote_segments(&image, &rp) {
                    let mark = m.state != RemoteLogSegmentState::DeleteSegmentStarted;
                    tracing::info!(%tp, segment = %m.segment_id, "remote.storage.enable off: deleting a remote segment");
                    self.delete_copy(&rp, state.leader_epoch, &m, mark).await?;
                }
            }
            return Ok(());
        }
        // Deletions hold the partition's change lock (DeleteRecords takes it too); copies
        // need not: they touch only the new segment.
        let lock = self.reader.change_lock(rp.topic_id, rp.partition);
        let changing = lock.lock().await;
        let image = (self.image)().unwrap_or_else(|| Arc::new(image.clone()));
        let segments = remote_segments(&image, &rp);
        // Step 1.
        let highest = self.sync_highest_offset(partition, &segments)?;
        let state = partition.state();
        if state.leader != self.channel.broker_id() || !self.replicas.lease_held() {
            return Ok(());
        }
        let epoch = state.leader_epoch;
        // Step 2a.
        for m in &segments {
            match m.state {
                RemoteLogSegmentState::CopySegmentStarted => {
                    let age_ms = now_ms().saturating_sub(m.event_timestamp_ms);
                    if age_ms < self.config.copy_cleanup_delay.as_millis() as i64 {
                        continue;
                    }
                    tracing::info!(%tp, segment = %m.segment_id, start = m.start_offset, broker = m.broker_id, "deleting a copy a failed upload left");
                    self.delete_copy(&rp, epoch, m, true).await?;
                }
                RemoteLogSegmentState::DeleteSegmentStarted => {
                    self.delete_copy(&rp, epoch, m, false).await?;
                }
                _ => {}
            }
        }
        drop(changing);
        // Step 2b.
        if !config.remote_log_copy_disable {
            let candidates = partition
                .with_log(|log| log.remote_copy_candidates(highest))
                .map_err(TaskError::Log)?;
            for c in candidates.iter().take(COPIES_PER_PASS) {
                self.copy(&rp, partition, epoch, c).await?;
            }
        }
        // Step 2c, against the image as the copies left it.
        let _changing = lock.lock().await;
        let image = (self.image)().ok_or(TaskError::Log(ErrorCode::UNKNOWN_SERVER_ERROR))?;
        let segments = remote_segments(&image, &rp);
        let (log_epochs, log_end, highest, local_only) = partition
            .with_log(|log| {
                (
                    epochs_of(log),
                    log.log_end_offset(),
                    log.highest_offset_in_remote_storage(),
                    log.local_bytes_above(log.highest_offset_in_remote_storage()),
                )
            })
            .map_err(TaskError::Log)?;
        let copies = lineage(&segments, &log_epochs, log_end);
        let summaries: Vec<RemoteSegmentSummary> = copies
            .iter()
            .map(|m| RemoteSegmentSummary {
                start_offset: m.start_offset,
                end_offset: m.end_offset,
                size_bytes: u64::try_from(m.segment_size_in_bytes).unwrap_or(0),
                max_timestamp: m.max_timestamp_ms,
            })
            .collect();
        let delete = config.cleanup_policy.is_delete();
        let doomed = remote_segments_to_delete(
            &summaries,
            -1,
            if delete { config.retention_ms } else { -1 },
            if delete { config.retention_bytes } else { -1 },
            local_only,
            now_ms(),
        );
        for m in copies.iter().take(doomed) {
            tracing::info!(%tp, segment = %m.segment_id, start = m.start_offset, end = m.end_offset, "remote retention deletes a segment");
            self.delete_copy(&rp, epoch, m, true).await?;
            metrics::inc(&metrics::global().remote_log.deleted_segments);
        }
        if doomed > 0 {
            let new_start = copies.get(doomed).map_or(highest + 1, |m| m.start_offset);
            partition
                .with_log(|log| log.truncate_leader_epochs_below(new_start))
                .map_err(TaskError::Log)??;
        }
        Ok(())
    }

    /// Step 1: the highest offset of the lineage's finished copies, told to the log.
    fn sync_highest_offset(
        &self,
        partition: &Partition,
        segments: &[RemoteLogSegmentMetadata],
    ) -> Result<i64, TaskError> {
        partition
            .with_log(|log| {
                let copies = lineage(segments, &epochs_of(log), log.log_end_offset());
                let highest = copies.iter().map(|m| m.end_offset).max().unwrap_or(-1);
                log.set_highest_offset_in_remote_storage(highest);
                log.highest_offset_in_remote_storage()
            })
            .map_err(TaskError::Log)
    }

    async fn change(
        &self,
        rp: &RemotePartition,
        leader_epoch: i32,
        change: RemoteLogSegmentChange,
    ) -> Result<(), TaskError> {
        change_segment(&*self.channel, rp, leader_epoch, change).await
    }

    fn update(segment_id: Uuid, state: RemoteLogSegmentState) -> RemoteLogSegmentChange {
        RemoteLogSegmentChange::Update {
            segment_id,
            state,
            event_timestamp_ms: now_ms(),
        }
    }

    /// Step 2b for one candidate.
    async fn copy(
        &self,
        rp: &RemotePartition,
        partition: &Partition,
        leader_epoch: i32,
        c: &rill_storage::RemoteCopyCandidate,
    ) -> Result<(), TaskError> {
        let segment_id = Uuid(*uuid::Uuid::new_v4().as_bytes());
        let started = Instant::now();
        let meta = RemoteLogSegmentMetadata {
            segment_id,
            start_offset: c.base_offset,
            end_offset: c.end_offset,
            broker_id: self.channel.broker_id(),
            max_timestamp_ms: c.max_timestamp,
            event_timestamp_ms: now_ms(),
            segment_leader_epochs: c.segment_leader_epochs.clone(),
            segment_size_in_bytes: i32::try_from(c.size_bytes).unwrap_or(i32::MAX),
            state: RemoteLogSegmentState::CopySegmentStarted,
        };
        self.change(rp, leader_epoch, RemoteLogSegmentChange::Add(meta))
            .await?;
        let m = &metrics::global().remote_log;
        let checkpoint = bytes::Bytes::from(epoch_checkpoint_bytes(&c.leader_epochs_to_end));
        let sent = match self
            .reader
            .storage()
            .copy_log_segment_data(rp, segment_id, c, checkpoint)
            .await
        {
            Ok(sent) => sent,
            Err(e) => {
                metrics::inc(&m.copy_errors);
                // Best effort now; the next pass deletes what is left (step 2a).
                let _ = self
                    .reader
                    .storage()
                    .delete_log_segment_data(rp, c.base_offset, segment_id)
                    .await;
                return Err(e.into());
            }
        };
        self.change(
            rp,
            leader_epoch,
            Self::update(segment_id, RemoteLogSegmentState::CopySegmentFinished),
        )
        .await?;
        partition
            .with_log(|log| log.set_highest_offset_in_remote_storage(c.end_offset))
            .map_err(TaskError::Log)?;
        metrics::inc(&m.copy_requests);
        m.copy_bytes.fetch_add(sent, Ordering::Relaxed);
        let elapsed = started.elapsed();
        tracing::info!(
            topic = %rp.topic,
            partition = rp.partition,
            segment = %segment_id,
            start = c.base_offset,
            end = c.end_offset,
            bytes = sent,
            ms = elapsed.as_millis() as u64,
            mb_per_s = sent as f64 / 1e6 / elapsed.as_secs_f64().max(1e-6),
            "copied segment to the remote tier"
        );
        Ok(())
    }

    async fn delete_copy(
        &self,
        rp: &RemotePartition,
        leader_epoch: i32,
        m: &RemoteLogSegmentMetadata,
        mark_start: bool,
    ) -> Result<(), TaskError> {
        delete_copy(
            &*self.channel,
            &self.reader,
            rp,
            leader_epoch,
            m,
            mark_start,
        )
        .await
    }
}

/// One change of a remote segment, through the controller (which refuses it unless this
/// broker leads the partition at `leader_epoch`).
async fn change_segment<C: ControllerChannel>(
    channel: &C,
    rp: &RemotePartition,
    leader_epoch: i32,
    change: RemoteLogSegmentChange,
) -> Result<(), TaskError> {
    let event = ControllerEvent::RemoteLogSegmentUpdate(RemoteLogSegmentUpdateRequest {
        broker_id: channel.broker_id(),
        broker_epoch: channel.broker_epoch(),
        topic: rp.topic.clone(),
        topic_id: rp.topic_id,
        partition: rp.partition,
        leader_epoch,
        change,
    });
    match channel.controller_call(event).await {
        Ok(ControllerResponse::RemoteLogSegmentUpdate(ErrorCode::NONE)) => Ok(()),
        Ok(ControllerResponse::RemoteLogSegmentUpdate(code)) | Err(code) => {
            Err(TaskError::Refused(code))
        }
        Ok(_) => Err(TaskError::Refused(ErrorCode::UNKNOWN_SERVER_ERROR)),
    }
}

/// DELETE_SEGMENT_STARTED (when `mark_start`), the objects deleted,
/// DELETE_SEGMENT_FINISHED.
async fn delete_copy<C: ControllerChannel>(
    channel: &C,
    reader: &RemoteLogReader,
    rp: &RemotePartition,
    leader_epoch: i32,
    m: &RemoteLogSegmentMetadata,
    mark_start: bool,
) -> Result<(), TaskError> {
    let update = |state| RemoteLogSegmentChange::Update {
        segment_id: m.segment_id,
        state,
        event_timestamp_ms: now_ms(),
    };
    if mark_start {
        change_segment(
            channel,
            rp,
            leader_epoch,
            update(RemoteLogSegmentState::DeleteSegmentStarted),
        )
        .await?;
    }
    if let Err(e) = reader
        .storage()
        .delete_log_segment_data(rp, m.start_offset, m.segment_id)
        .await
    {
        metrics::inc(&metrics::global().remote_log.delete_errors);
        return Err(e.into());
    }
    change_segment(
        channel,
        rp,
        leader_epoch,
        update(RemoteLogSegmentState::DeleteSegmentFinished),
    )
    .await
}

/// DeleteRecords on a tiered partition led here at `leader_epoch`: every finished copy
/// wholly below `offset` is deleted (a copy holding `offset` stays whole: the whole
/// log's start is a copy's start, see the caller). Returns the copies deleted.
pub async fn delete_records_below<C: ControllerChannel>(
    channel: &C,
    reader: &RemoteLogReader,
    image: impl Fn() -> Arc<MetadataImage>,
    rp: &RemotePartition,
    leader_epoch: i32,
    offset: i64,
) -> Result<usize, String> {
    let lock = reader.change_lock(rp.topic_id, rp.partition);
    let _changing = lock.lock().await;
    let segments = remote_segments(&image(), rp);
    let mut deleted = 0;
    for m in finished_segments_owned(&segments)
        .into_iter()
        .filter(|m| m.end_offset < offset)
    {
        delete_copy(channel, reader, rp, leader_epoch, m, true)
            .await
            .map_err(|e| e.to_string())?;
        deleted += 1;
    }
    Ok(deleted)
}

fn finished_segments_owned(
    segments: &[RemoteLogSegmentMetadata],
) -> Vec<&RemoteLogSegmentMetadata> {
    let mut v: Vec<_> = segments
        .iter()
        .filter(|m| m.state == RemoteLogSegmentState::CopySegmentFinished)
        .collect();
    v.sort_by_key(|m| (m.start_offset, m.end_offset));
    v
}

/// A partition's remote segments in `image`.
pub fn remote_segments(
    image: &MetadataImage,
    rp: &RemotePartition,
) -> Vec<RemoteLogSegmentMetadata> {
    image
        .remote_segments(rp.topic_id, rp.partition)
        .map(|s| s.values().cloned().collect())
        .unwrap_or_default()
}

/// The finished copies of a partition that a leader serves reads from: those in its
/// log's leader epoch lineage (Kafka's `RemoteLogManager.read` finds the copy by the
/// epoch of the offset in the leader's cache), oldest first.
pub fn readable_segments(
    image: &MetadataImage,
    rp: &RemotePartition,
    log: &rill_storage::UnifiedLog,
) -> Vec<RemoteLogSegmentMetadata> {
    let segments = remote_segments(image, rp);
    lineage(&segments, &epochs_of(log), log.log_end_offset())
        .into_iter()
        .cloned()
        .collect()
}

/// The log's leader epochs as epoch → start offset.
fn epochs_of(log: &rill_storage::UnifiedLog) -> BTreeMap<i32, i64> {
    log.leader_epoch_cache()
        .entries()
        .iter()
        .map(|e| (e.epoch, e.start_offset))
        .collect()
}

/// The start of the whole log of a tiered partition: its first finished copy's start
/// when that is below the local log start.
pub fn log_start_offset(
    image: &MetadataImage,
    topic_id: Uuid,
    partition: i32,
    local_log_start_offset: i64,
) -> i64 {
    image
        .remote_segments(topic_id, partition)
        .and_then(|s| finished_segments(s).first().map(|m| m.start_offset))
        .map_or(local_log_start_offset, |s| s.min(local_log_start_offset))
}

/// Deletes the remote objects of a deleted topic's partition (its last leader does it).
pub async fn delete_partition(
    reader: &RemoteLogReader,
    topic: &str,
    topic_id: Uuid,
    partition: i32,
) {
    match reader
        .storage()
        .delete_partition(&RemotePartition {
            topic: topic.to_string(),
            topic_id,
            partition,
        })
        .await
    {
        Ok(n) => tracing::info!(
            topic,
            partition,
            objects = n,
            "deleted the remote objects of a deleted partition"
        ),
        Err(e) => {
            tracing::warn!(topic, partition, error = %e, "deleting a deleted partition's remote objects failed; they are left in the store")
        }
    }
}

#[cfg(test)]
mod tests;
