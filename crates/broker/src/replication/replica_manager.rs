//! The replica manager: the partitions this broker hosts, and produce and fetch on them.
//!
//! The metadata publisher tells it which partitions this broker leads and which it
//! follows ([`ReplicaManager::become_leader`], [`ReplicaManager::become_follower`]); only
//! the leader appends client data (stamped with its leader epoch) and serves client
//! reads, everything else gets NOT_LEADER_OR_FOLLOWER so that clients refresh their
//! metadata. When the ISR is the leader alone, the high watermark moves to the log end
//! offset as soon as an append returns. Each partition's log sits behind its own lock,
//! held only for the append or the read itself, never across an `.await`. Fetches that
//! found too few bytes park on [`ReplicaManager::signals`] (the shards of their
//! partitions) until new data or their max wait.
//!
//! An append validates its records before it takes the partition's lock (against a
//! snapshot of the topic config), and the fsync that `flush.messages` or `flush.ms` asks
//! for happens after it released the lock, one fsync covering every append written
//! before it started (group commit, see `rill_storage::flush`): a produce is answered
//! only once its records are fsynced, and the leader counts them towards the high
//! watermark only then, so a consumer never sees what a crash could still take back
//! (as when the fsync was made under the lock).
//!
//! Transactions: each log keeps its last stable offset (LSO) beside the high watermark
//! (`rill_storage::UnifiedLog::last_stable_offset`); [`PartitionOffsets`] carries both,
//! a read_committed read stops at the LSO and reports the aborted transactions in its
//! range ([`FetchResult::aborted_transactions`]), and the leader appends the
//! transaction coordinator's markers with [`ReplicaManager::append_txn_marker`], which
//! the caller then waits for as an acks=all produce ([`ReplicaManager::wait_for_commit`]).
//!
//! Log directories (JBOD, `log.dirs` with several paths): every partition's log lives in
//! one of them. A log found on disk stays where it is; a new one goes where the metadata
//! assigned it (KIP-858), else to the online directory with the fewest partitions
//! (Kafka's `LogManager.nextLogDirs`), and the choice is reported to the controller
//! (`assignments`, AssignReplicasToDirs) when it differs from the assignment.
//!
//! Every write to a log that fails on disk reports to the [`LogDirFailureChannel`] with
//! the log's directory: from the first one on, every partition in that directory answers
//! KAFKA_STORAGE_ERROR before anything reaches its log, is fetched no more, and the
//! broker reports the directory offline to the controller, which moves its leaderships
//! away; partitions in the other directories carry on. The server stops when no
//! directory is left or the metadata log's failed (see `log_dir_failure`).
//!
//! The replica manager owns each log directory's clean-shutdown marker (the protocol is
//! in `rill_storage::clean_shutdown`): it reads them when created and opens every log
//! with its directory's answer, removes a directory's marker before the first log opened
//! in it becomes reachable to anything that could change it (after the whole batch of
//! logs a start-up opens, see [`ReplicaManager::open_logs`]), and writes them at
//! [`ReplicaManager::shutdown`] after every log of the directory closed and one `syncfs`
//! made them durable.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex, RwLock};

use bytes::Bytes;
use rill_protocol::primitives::Uuid;
use rill_protocol::ErrorCode;
use rill_storage::{
    clean_shutdown, end_txn_marker_batch, parse_partition_dir_name, partition_dir_name, AbortedTxn,
    AppendError, AppendOrigin, DataDirSync, FetchDataInfo, FileRange, FlushDone, LogAppendInfo,
    LogConfig, PendingFlush, PreviousShutdown, ReadError, RecordErrors, StorageError,
    TopicPartition, UnifiedLog,
};

use crate::error::BrokerError;
use crate::log_dir_failure::LogDirFailureChannel;
use crate::metrics;
use crate::replication::append_signal::AppendSignals;
use crate::replication::isr::{self, LeaderState};
use crate::replication::replica_fetcher::{FetcherConfig, ReplicaFetcherManager};

pub mod alter_log_dirs;
mod log_dirs;

pub use log_dirs::LogDirConfig;
use log_dirs::{locate_logs, LogDir, LogLocations};

/// How often a parked acks=all produce looks at its partition even without a wake-up.
const ACKS_ALL_RECHECK: std::time::Duration = std::time::Duration::from_millis(250);

/// Threads that open logs and apply leadership when one metadata update touches many
/// partitions (a restart, a large topic creation). The work is a few dozen file-system
/// calls per partition (reading a log's files, writing its leader-epoch checkpoint; after
/// an unclean shutdown, recovering and fsyncing its active segment), waits in the kernel
/// rather than CPU, so more threads than cores overlap them; Kafka's
/// `num.recovery.threads.per.data.dir` plays the same part.
const PARTITION_CHANGE_THREADS: usize = 8;
/// Updates touching fewer partitions than this are applied on the calling thread.
const PARALLEL_CHANGE_MIN: usize = 32;

/// One partition whose leadership (or ISR, or replica set) a metadata update changed.
#[derive(Debug, Clone)]
pub struct PartitionChange {
    pub tp: TopicPartition,
    pub topic_id: Uuid,
    pub registration: rill_metadata::PartitionRegistration,
    pub config: LogConfig,
}

/// Runs `f` on every item, on up to [`PARTITION_CHANGE_THREADS`] threads when there are
/// many, and returns the results in the items' order.
fn for_each_partition<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    for_each_owned(items.iter().collect(), f)
}

/// [`for_each_partition`] for items consumed by `f`.
fn for_each_owned<T: Send, R: Send>(items: Vec<T>, f: impl Fn(T) -> R + Sync) -> Vec<R> {
    if items.len() < PARALLEL_CHANGE_MIN {
        return items.into_iter().map(f).collect();
    }
    let chunk = items.len().div_ceil(PARTITION_CHANGE_THREADS);
    let mut parts = Vec::with_capacity(PARTITION_CHANGE_THREADS);
    let mut rest = items.into_iter();
    loop {
        let part: Vec<T> = rest.by_ref().take(chunk).collect();
        if part.is_empty() {
            break;
        }
        parts.push(part);
    }
    let f = &f;
    std::thread::scope(|scope| {
        let handles: Vec<_> = parts
            .into_iter()
            .map(|part| scope.spawn(move || part.into_iter().map(f).collect::<Vec<R>>()))
            .collect();
        // A panic in a worker is carried on to the caller rather than dropped.
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    })
}

/// An ISR change to send to the controller. Unbounded channel, but bounded in effect:
/// the ISR state machine keeps at most one change in flight per partition led here.
pub type AlterPartitionItem = (TopicPartition, Uuid, isr::AlterPartitionProposal);

/// What the metadata log says of a partition, as this broker acts on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionState {
    /// The leader's broker id (-1: none).
    pub leader: i32,
    pub leader_epoch: i32,
    pub partition_epoch: i32,
    pub replicas: Vec<i32>,
    pub isr: Vec<i32>,
}

impl PartitionState {
    fn from_registration(p: &rill_metadata::PartitionRegistration) -> Self {
        Self {
            leader: p.leader,
            leader_epoch: p.leader_epoch,
            partition_epoch: p.partition_epoch,
            replicas: p.replicas.clone(),
            isr: p.isr.clone(),
        }
    }
}

pub struct Partition {
    pub topic_id: Uuid,
    /// The index (in `log.dirs`) of the log directory the log lives in; it changes when
    /// AlterReplicaLogDirs swaps in the future replica (under the log's lock).
    dir: std::sync::atomic::AtomicUsize,
    /// Whether that directory failed: the partition is offline on this broker then.
    log_dirs: Arc<LogDirFailureChannel>,
    /// The replica being moved to another log directory (AlterReplicaLogDirs), caught
    /// up by the alter-log-dirs task; locked after `log` when both are needed.
    future: Mutex<Option<alter_log_dirs::FutureReplica>>,
    /// How many times the log was truncated: a future replica begun before a
    /// truncation copied records that may no longer be the partition's, and starts over.
    truncations: std::sync::atomic::AtomicU64,
    /// The topic's BrokerTopicMetrics, found once here so that appends and reads add to
    /// them without a lookup.
    pub topic_metrics: metrics::TopicHandle,
    log: Mutex<UnifiedLog>,
    /// Set, under the log's lock, when the partition is deleted: a user that still holds
    /// the partition (a follower's append of a fetch already in flight) must not touch
    /// files that are gone, or a new log of the same name made since.
    deleted: std::sync::atomic::AtomicBool,
    state: Mutex<PartitionState>,
    /// The ISR and high-watermark state while this broker leads the partition. Locked
    /// before the log when both are needed.
    leader: Mutex<Option<LeaderState>>,
}

impl Partition {
    pub(crate) fn leader_state(&self) -> std::sync::MutexGuard<'_, Option<LeaderState>> {
        self.leader.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The partition's metadata state as last applied.
    pub fn state(&self) -> PartitionState {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The leader epoch, when `local_id` leads the partition.
    fn leader_epoch_if_leader(&self, local_id: i32) -> Option<i32> {
        let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        (st.leader == local_id).then_some(st.leader_epoch)
    }

    /// The index (in `log.dirs`) of the log directory the partition's log is in.
    pub fn log_dir(&self) -> usize {
        self.dir.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Whether the partition's log directory failed: it is offline on this broker.
    pub fn is_offline(&self) -> bool {
        self.log_dirs.is_offline(self.log_dir())
    }

    /// Runs `f` with the log locked. A poisoned lock means an earlier holder panicked in
    /// the middle of a log operation: the log may be inconsistent, so it is not used again.
    /// A deleted partition answers UNKNOWN_TOPIC_OR_PARTITION without running `f`, one
    /// whose log directory failed KAFKA_STORAGE_ERROR.
    pub(crate) fn with_log<T>(&self, f: impl FnOnce(&mut UnifiedLog) -> T) -> Result<T, ErrorCode> {
        if self.is_offline() {
            return Err(ErrorCode::KAFKA_STORAGE_ERROR);
        }
        match self.log.lock() {
            Ok(_) if self.deleted.load(std::sync::atomic::Ordering::Acquire) => {
                Err(ErrorCode::UNKNOWN_TOPIC_OR_PARTITION)
            }
            Ok(mut log) => Ok(f(&mut log)),
            Err(_) => Err(ErrorCode::KAFKA_STORAGE_ERROR),
        }
    }

    /// The future replica, if the partition is being moved (lock after `log`).
    fn future_lock(&self) -> std::sync::MutexGuard<'_, Option<alter_log_dirs::FutureReplica>> {
        self.future.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The replica being moved to another log directory, if any (AlterReplicaLogDirs):
    /// its directory's index, its size and how far it is behind the current log.
    pub fn future_replica(&self) -> Option<(usize, u64, i64)> {
        alter_log_dirs::future_of(self)
    }

    /// Marks the partition deleted once its log's current user is done (see `deleted`).
    fn mark_deleted(&self) {
        let _log = self.log.lock();
        self.deleted
            .store(true, std::sync::atomic::Ordering::Release);
    }
}

/// A leader append that is written but may still owe its fsync
/// ([`ReplicaManager::append_deferred`]).
pub struct DeferredAppend {
    pub info: LogAppendInfo,
    /// The log start offset after the append.
    pub log_start_offset: i64,
    partition: Arc<Partition>,
    flush: Option<PendingFlush>,
}

impl DeferredAppend {
    /// The fsync to make (blocking, [`PendingFlush::sync`]) and hand to
    /// [`ReplicaManager::complete_flush`] before the append may be acknowledged; `None`
    /// when the flush policy asks for none.
    pub fn take_flush(&mut self) -> Option<PendingFlush> {
        self.flush.take()
    }

    /// The partition appended to, for [`ReplicaManager::complete_flush`].
    pub fn partition(&self) -> &Arc<Partition> {
        &self.partition
    }
}

/// The offsets a ListOffsets or Fetch reports next to the data.
#[derive(Debug, Clone, Copy)]
pub struct PartitionOffsets {
    pub log_start_offset: i64,
    pub high_watermark: i64,
    /// Never above the high watermark: read_committed readers stop here.
    pub last_stable_offset: i64,
    pub log_end_offset: i64,
}

impl PartitionOffsets {
    fn of(log: &UnifiedLog) -> Self {
        let offsets = Self {
            log_start_offset: log.log_start_offset(),
            high_watermark: log.high_watermark(),
            last_stable_offset: log.last_stable_offset(),
            log_end_offset: log.log_end_offset(),
        };
        debug_assert!(offsets.last_stable_offset <= offsets.high_watermark);
        offsets
    }
}

/// One transaction marker for one partition (an entry of WriteTxnMarkers): the leader
/// appends it as a control batch (see [`ReplicaManager::append_txn_marker`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxnMarker {
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub coordinator_epoch: i32,
    /// COMMIT (`true`) or ABORT.
    pub commit: bool,
}

/// The newest bytes a leader with followers keeps in memory per partition until the high
/// watermark passes them (`UnifiedLog::set_tail_copy_limit`): enough for the small
/// batches of low-latency producers, where a follower fetch's syscalls cost the most;
/// bigger batches go out with `sendfile`. Bounded per partition, and held only while
/// the ISR has not replicated them, so idle partitions hold nothing.
const LEADER_TAIL_COPY_BYTES: usize = 64 * 1024;

pub struct FetchResult {
    pub offsets: PartitionOffsets,
    /// The records; empty when read with `zero_copy`, where `file_range` holds them.
    pub records: Bytes,
    /// Where the records lie in their segment file (`None` when there are none).
    pub file_range: Option<FileRange>,
    /// For a read_committed read: the aborted transactions from the fetch offset up to
    /// the LSO (Fetch's `aborted_transactions`); `None` for other reads.
    pub aborted_transactions: Option<Vec<AbortedTxn>>,
    /// The partition's topic counters, for the bytes out.
    pub topic_metrics: metrics::TopicHandle,
}

impl FetchResult {
    /// The record bytes this result answers with, however they are held.
    pub fn byte_len(&self) -> usize {
        match &self.file_range {
            Some(r) if self.records.is_empty() => r.len as usize,
            _ => self.records.len(),
        }
    }
}

pub struct ReplicaManager {
    log_dirs: Vec<LogDir>,
    /// The log directory of every log on disk (found at creation, or made since), so
    /// that a log is opened where it is and new ones are spread by count.
    located: Mutex<LogLocations>,
    /// Partition logs found in more than one directory at creation (Kafka refuses to
    /// start then): the start refuses ([`ReplicaManager::check_log_dirs`]).
    duplicates: Vec<String>,
    /// Replicas placed in a directory other than the metadata's, to report to the
    /// controller (AssignReplicasToDirs): topic id and directory id by partition.
    pending_assignments: Mutex<BTreeMap<TopicPartition, (Uuid, Uuid)>>,
    assignments_added: tokio::sync::Notify,
    /// Where AlterReplicaLogDirs asked for a partition not hosted yet to be created.
    preferred_dirs: Mutex<HashMap<TopicPartition, usize>>,
    /// Wakes the alter-log-dirs task when a move starts.
    alter_log_dirs_added: tokio::sync::Notify,
    /// Liveness of the registered brokers (ISR eligibility, KIP-841).
    broker_statuses: RwLock<Arc<BTreeMap<i32, isr::BrokerStatus>>>,
    local_broker_epoch: std::sync::atomic::AtomicI64,
    replica_lag_time_max_ms: i64,
    /// ISR changes for the AlterPartition sender (see [`crate::server::Broker`]).
    alter_partition_tx: tokio::sync::mpsc::UnboundedSender<AlterPartitionItem>,
    /// The fetchers of the partitions this broker follows.
    fetchers: ReplicaFetcherManager,
    /// This broker's id.
    local_id: i32,
    partitions: RwLock<HashMap<TopicPartition, Arc<Partition>>>,
    appended: AppendSignals,
    /// Milliseconds since the epoch: the wall clock, or a simulation's.
    clock: Clock,
    /// Set by the first failed write in each log directory; stops every later one there.
    log_dir_failure: Arc<LogDirFailureChannel>,
    /// Set (under the map's write lock) when [`Self::shutdown`] starts closing the logs:
    /// from then on no log is opened, so that a metadata update still being applied
    /// cannot open a second `UnifiedLog` on a directory that is being closed.
    shutting_down: std::sync::atomic::AtomicBool,
    /// Whether this broker holds its controller lease (`broker_lifecycle`). Without it
    /// the controller may already have fenced it and moved its leaderships, so it acts
    /// as the leader of nothing: clients get NOT_LEADER_OR_FOLLOWER and look elsewhere,
    /// and no write is taken that the new leader would not have.
    lease_held: std::sync::atomic::AtomicBool,
    /// Tiered storage: what a follower that starts its log at the leader's local log
    /// start takes from the remote tier (installed once by `remote_log`).
    remote_tier: std::sync::OnceLock<Arc<dyn RemoteTierState>>,
}

/// The leader's state at an offset of a tiered partition below which the data is in the
/// remote tier: its leader epochs up to there and the producer snapshot there.
pub type RemoteTierAux = (Vec<rill_storage::EpochEntry>, Option<Bytes>);

/// What the remote tier says of a follower's new log start.
#[derive(Debug)]
pub enum RemoteTierLookup {
    /// The leader's state there, from the copy that ends just below it.
    Found(RemoteTierAux),
    /// The partition is not tiered (or tiered storage is off here): start without it.
    NotTiered,
    /// Tiered, but the copy is not known here yet, or the store did not answer: ask
    /// again shortly.
    NotYet,
}

/// Where a follower finds [`RemoteTierAux`] (KIP-405's "auxiliary state" a follower
/// builds from the remote tier before it fetches from the leader's local log start).
/// Implemented by `remote_log`, which replication does not name.
pub trait RemoteTierState: Send + Sync {
    /// The state at `offset` of `tp` (see [`RemoteTierLookup`]).
    fn state_at(
        &self,
        tp: &TopicPartition,
        topic_id: Uuid,
        offset: i64,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = RemoteTierLookup> + Send + '_>>;
}

/// Where a replica manager reads the time: every time-dependent rule below it (ISR
/// lag, caught-up times, segment rolls) takes the time from here, so that a seeded
/// simulation can drive it.
pub type Clock = Arc<dyn Fn() -> i64 + Send + Sync>;

/// The wall clock, as a [`Clock`].
pub fn wall_clock() -> Clock {
    Arc::new(now_ms)
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

impl ReplicaManager {
    /// A replica manager with one log directory (which holds the metadata log too) and
    /// the receiving end of its ISR-change proposals.
    pub fn new(
        data_dir: &Path,
        fetcher_config: FetcherConfig,
        replica_lag_time_max_ms: i64,
    ) -> (
        Self,
        tokio::sync::mpsc::UnboundedReceiver<AlterPartitionItem>,
    ) {
        Self::with_clock(
            data_dir,
            fetcher_config,
            replica_lag_time_max_ms,
            Arc::new(now_ms),
        )
    }

    /// As [`ReplicaManager::new`], reading the time from `clock`.
    pub fn with_clock(
        data_dir: &Path,
        fetcher_config: FetcherConfig,
        replica_lag_time_max_ms: i64,
        clock: Clock,
    ) -> (
        Self,
        tokio::sync::mpsc::UnboundedReceiver<AlterPartitionItem>,
    ) {
        let dirs = vec![LogDirConfig {
            path: data_dir.to_path_buf(),
            id: rill_metadata::directory_id::MIGRATING,
        }];
        Self::with_log_dirs(
            dirs,
            Some(0),
            fetcher_config,
            replica_lag_time_max_ms,
            clock,
        )
    }

    /// A replica manager over the log directories `dirs` (`log.dirs`, in order);
    /// `metadata_dir` is the index of the one that holds the metadata log, if any.
    pub fn with_log_dirs(
        dirs: Vec<LogDirConfig>,
        metadata_dir: Option<usize>,
        fetcher_config: FetcherConfig,
        replica_lag_time_max_ms: i64,
        clock: Clock,
    ) -> (
        Self,
        tokio::sync::mpsc::UnboundedReceiver<AlterPartitionItem>,
    ) {
        let local_id = fetcher_config.local_id;
        let (alter_partition_tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let log_dirs: Vec<LogDir> = dirs
            .iter()
            .map(|d| {
                // Either failure only costs a recovery of every log at the next start.
                let previous_shutdown = PreviousShutdown::read(&d.path).unwrap_or_else(|e| {
                    tracing::warn!(error = %e, "clean-shutdown marker unreadable; recovering every log");
                    PreviousShutdown::Unclean
                });
                let sync = DataDirSync::open(&d.path)
                    .inspect_err(|e| {
                        tracing::warn!(error = %e, "log directory not open for syncfs; no clean shutdown will be recorded");
                    })
                    .ok();
                // Said at info by the server, which also knows whether the directory is new.
                tracing::debug!(dir = %d.path.display(), ?previous_shutdown, "log directory");
                LogDir {
                    path: d.path.clone(),
                    id: d.id,
                    previous_shutdown,
                    marker_removed: Mutex::new(previous_shutdown == PreviousShutdown::Unclean),
                    sync,
                }
            })
            .collect();
        alter_log_dirs::recover_moves(&dirs.iter().map(|d| d.path.clone()).collect::<Vec<_>>());
        let (located, duplicates) = locate_logs(&log_dirs);
        let rm = Self {
            log_dirs,
            located: Mutex::new(located),
            duplicates,
            pending_assignments: Mutex::new(BTreeMap::new()),
            assignments_added: tokio::sync::Notify::new(),
            preferred_dirs: Mutex::new(HashMap::new()),
            alter_log_dirs_added: tokio::sync::Notify::new(),
            broker_statuses: RwLock::new(Arc::new(BTreeMap::new())),
            local_broker_epoch: std::sync::atomic::AtomicI64::new(-1),
            replica_lag_time_max_ms,
            alter_partition_tx,
            fetchers: ReplicaFetcherManager::new(fetcher_config),
            local_id,
            partitions: RwLock::new(HashMap::new()),
            appended: AppendSignals::default(),
            clock,
            log_dir_failure: Arc::new(LogDirFailureChannel::with_dirs(
                dirs.into_iter().map(|d| d.path).collect(),
                metadata_dir,
            )),
            shutting_down: std::sync::atomic::AtomicBool::new(false),
            lease_held: std::sync::atomic::AtomicBool::new(true),
            remote_tier: std::sync::OnceLock::new(),
        };
        (rm, rx)
    }

    fn now(&self) -> i64 {
        (self.clock)()
    }

    /// The replica manager's clock in milliseconds (the one the ISR state's times are
    /// on), for reporting how long ago they were.
    pub fn now_ms(&self) -> i64 {
        self.now()
    }

    fn read_map(&self) -> std::sync::RwLockReadGuard<'_, HashMap<TopicPartition, Arc<Partition>>> {
        // A panic while holding the map lock cannot leave the map half-updated (inserts
        // and removes are single calls), so a poisoned lock is still safe to read.
        self.partitions.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write_map(
        &self,
    ) -> std::sync::RwLockWriteGuard<'_, HashMap<TopicPartition, Arc<Partition>>> {
        self.partitions.write().unwrap_or_else(|e| e.into_inner())
    }

    fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The partition's hosted replica, opening (recovering if needed) or creating its log
    /// on first use, in the directory [`Self::place`] picks (`assigned`: the metadata's).
    /// A replica whose log directory failed is refused: it is offline here.
    fn ensure_open(
        &self,
        tp: &TopicPartition,
        topic_id: Uuid,
        state: &PartitionState,
        config: &LogConfig,
        assigned: Uuid,
    ) -> Result<Arc<Partition>, BrokerError> {
        if let Some(p) = self.get(tp) {
            if p.topic_id == topic_id {
                if p.is_offline() {
                    return Err(BrokerError::LogDirOffline(
                        self.log_dir_path(p.log_dir()).display().to_string(),
                    ));
                }
                return Ok(p);
            }
            // A topic deleted and created again under the same name: the old log goes.
            self.delete_partition(tp)?;
        }
        let (dir, log) = self.open_log(tp, topic_id, config, assigned)?;
        self.remove_clean_shutdown_marker(dir)?;
        self.insert_log(tp, topic_id, state, dir, log)
    }

    /// Opens (recovering if the previous run did not end cleanly) or creates the log of
    /// `tp`, without making it reachable; returns it with its directory's index. A new
    /// log placed elsewhere than `assigned` is reported to the controller.
    fn open_log(
        &self,
        tp: &TopicPartition,
        topic_id: Uuid,
        config: &LogConfig,
        assigned: Uuid,
    ) -> Result<(usize, UnifiedLog), BrokerError> {
        if self.is_shutting_down() {
            return Err(BrokerError::ShuttingDown);
        }
        let placement = self.place(tp, assigned)?;
        let Some(log_dir) = self.log_dirs.get(placement.dir) else {
            return Err(BrokerError::LogDirOffline(String::new()));
        };
        let path = log_dir
            .path
            .join(partition_dir_name(&tp.topic, tp.partition));
        let log =
            match UnifiedLog::open(&path, config.clone(), self.now(), log_dir.previous_shutdown) {
                Ok(log) => log,
                Err(e) => {
                    if let Some(io) = e.io_error() {
                        self.dir_failed(placement.dir, format_args!("opening the log of {tp}"), io);
                    }
                    return Err(e.into());
                }
            };
        if !placement.exists {
            self.located
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(tp.clone(), placement.dir);
        }
        if log_dir.id != assigned {
            self.assign(tp, topic_id, placement.dir);
        }
        Ok((placement.dir, log))
    }

    /// Makes an opened log reachable as the partition's replica; the marker must be gone.
    fn insert_log(
        &self,
        tp: &TopicPartition,
        topic_id: Uuid,
        state: &PartitionState,
        dir: usize,
        log: UnifiedLog,
    ) -> Result<Arc<Partition>, BrokerError> {
        let partition = Arc::new(Partition {
            topic_id,
            dir: std::sync::atomic::AtomicUsize::new(dir),
            log_dirs: self.log_dir_failure.clone(),
            future: Mutex::new(None),
            truncations: std::sync::atomic::AtomicU64::new(0),
            topic_metrics: metrics::global().topics.topic(&tp.topic),
            log: Mutex::new(log),
            deleted: std::sync::atomic::AtomicBool::new(false),
            state: Mutex::new(state.clone()),
            leader: Mutex::new(None),
        });
        let mut map = self.write_map();
        if self.is_shutting_down() {
            // Shutdown began while the log was opening and will not close it: drop it
            // unclosed. Opening changed nothing a recovery needs, and shutdown records
            // a clean shutdown only when no log needs recovering (see `shutdown`).
            return Err(BrokerError::ShuttingDown);
        }
        map.insert(tp.clone(), partition.clone());
        Ok(partition)
    }

    /// This broker now leads the partition (new leader epoch, or a changed ISR or
    /// replica set). With an ISR of this broker alone, everything in its log is committed.
    pub fn become_leader(
        &self,
        tp: &TopicPartition,
        topic_id: Uuid,
        registration: &rill_metadata::PartitionRegistration,
        config: &LogConfig,
    ) -> Result<(), BrokerError> {
        self.fetchers.remove_partition(tp);
        let state = PartitionState::from_registration(registration);
        let assigned = registration.directory(self.local_id);
        let partition = self.ensure_open(tp, topic_id, &state, config, assigned)?;
        let epoch = state.leader_epoch;
        let reg = isr::PartitionRegistration {
            replicas: state.replicas.clone(),
            isr: state.isr.clone(),
            leader: state.leader,
            leader_epoch: state.leader_epoch,
            partition_epoch: state.partition_epoch,
        };
        {
            let mut current = partition.state.lock().unwrap_or_else(|e| e.into_inner());
            // An ISR change the controller made on its own while this broker kept leading
            // (a fenced follower taken out, KIP-841) is a shrink or an expansion here as
            // much as one this leader proposed; one it proposed was recorded when accepted
            // (`on_alter_partition_response`), so the image brings no second change.
            if current.leader == self.local_id && state.leader == self.local_id {
                let m = &metrics::global().replication;
                match state.isr.len().cmp(&current.isr.len()) {
                    std::cmp::Ordering::Less => metrics::inc(&m.isr_shrinks),
                    std::cmp::Ordering::Greater => metrics::inc(&m.isr_expands),
                    std::cmp::Ordering::Equal => {}
                }
            }
            *current = state;
        }
        let now = self.now();
        let statuses = self.broker_statuses();
        let mut leader = partition.leader_state();
        let outcome = partition.with_log(|log| {
            let followers = reg.replicas.iter().any(|r| *r != self.local_id);
            log.set_tail_copy_limit(if followers { LEADER_TAIL_COPY_BYTES } else { 0 });
            let leo = log.log_end_offset();
            // KIP-101: the new epoch starts at this log's end, so that followers asking
            // for the end of the previous epoch get where this leader's history diverges.
            if log.latest_epoch().is_none_or(|e| e < epoch) {
                if let Err(e) = log.assign_epoch_start_offset(epoch, leo) {
                    self.log_dir_failed(
                        &partition,
                        format_args!("leader epoch checkpoint of {tp}"),
                        &e,
                    );
                }
            }
            let hw = match leader.as_mut() {
                Some(ls) => match ls.on_metadata_update(&reg, now, &*statuses) {
                    Ok(isr::MetadataOutcome::Applied { high_watermark }) => Ok(high_watermark),
                    Ok(isr::MetadataOutcome::Ignored) => Ok(None),
                    Err(e) => Err(e),
                },
                None => {
                    let offsets = isr::LogOffsets {
                        log_start_offset: log.log_start_offset(),
                        log_end_offset: leo,
                        high_watermark: log.high_watermark(),
                    };
                    LeaderState::become_leader(self.leader_config(), &reg, offsets, &*statuses, now)
                        .map(|ls| {
                            let hw = ls.high_watermark();
                            *leader = Some(ls);
                            Some(hw)
                        })
                }
            };
            if let Ok(Some(hw)) = hw {
                if hw > log.high_watermark() {
                    log.update_high_watermark(hw);
                }
            }
            hw.map(|_| ())
        });
        drop(leader);
        match outcome {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::error!(%tp, error = %e, "leader state refused the registration"),
            Err(code) => tracing::error!(%tp, error = code.name(), "partition log unusable"),
        }
        self.appended.notify(tp);
        Ok(())
    }

    /// [`Self::become_leader`] for each change, on several threads when there are many
    /// (see [`PARTITION_CHANGE_THREADS`]); results in the changes' order.
    pub fn become_leaders(&self, changes: &[PartitionChange]) -> Vec<Result<(), BrokerError>> {
        for_each_partition(changes, |c| {
            self.become_leader(&c.tp, c.topic_id, &c.registration, &c.config)
        })
    }

    /// Opens the logs of the partitions that are not open yet, on several threads when
    /// there are many, so that a following [`Self::become_leader`] or
    /// [`Self::become_follower`] for each finds its log open. A log that fails to open is
    /// left for those to report.
    ///
    /// All of them are opened before the clean-shutdown marker is removed and any is
    /// made reachable: a start-up that crashes while opening its logs leaves them, and
    /// the marker, as the last clean stop did, and the next start can still skip
    /// recovery.
    pub fn open_logs(&self, changes: &[PartitionChange]) {
        let opened: Vec<_> = for_each_owned(changes.iter().collect(), |c| {
            if self.get(&c.tp).is_some() {
                return None;
            }
            // Errors surface again, with the partition named, in become_leader/follower.
            let assigned = c.registration.directory(self.local_id);
            self.open_log(&c.tp, c.topic_id, &c.config, assigned)
                .ok()
                .map(|(dir, log)| (c, dir, log))
        })
        .into_iter()
        .flatten()
        .collect();
        let dirs: std::collections::BTreeSet<usize> = opened.iter().map(|(_, d, _)| *d).collect();
        let ready: std::collections::BTreeSet<usize> = dirs
            .into_iter()
            .filter(|d| self.remove_clean_shutdown_marker(*d).is_ok())
            .collect();
        for (c, dir, log) in opened {
            if ready.contains(&dir) {
                let state = PartitionState::from_registration(&c.registration);
                let _ = self.insert_log(&c.tp, c.topic_id, &state, dir, log);
            }
        }
    }

    /// This broker now follows the partition: it stops accepting client writes and reads
    /// and fetches from the leader at `leader_addr` (none: the partition has no leader
    /// now, or its address is unknown; the next metadata update brings one).
    pub fn become_follower(
        self: &Arc<Self>,
        tp: &TopicPartition,
        topic_id: Uuid,
        registration: &rill_metadata::PartitionRegistration,
        config: &LogConfig,
        leader_addr: Option<crate::network::inter_broker::PeerEndpoint>,
    ) -> Result<(), BrokerError> {
        let state = PartitionState::from_registration(registration);
        let assigned = registration.directory(self.local_id);
        let partition = self.ensure_open(tp, topic_id, &state, config, assigned)?;
        let epoch = state.leader_epoch;
        let leader = state.leader;
        *partition.state.lock().unwrap_or_else(|e| e.into_inner()) = state;
        *partition.leader_state() = None;
        let _ = partition.with_log(|log| log.set_tail_copy_limit(0));
        match leader_addr {
            Some(addr) if leader >= 0 && leader != self.local_id => self
                .fetchers
                .add_partition(self, leader, addr, tp, topic_id, epoch),
            _ => self.fetchers.remove_partition(tp),
        }
        self.appended.notify(tp);
        Ok(())
    }

    /// The partition when this broker follows it in `leader_epoch`.
    fn follower_partition(&self, tp: &TopicPartition, leader_epoch: i32) -> Option<Arc<Partition>> {
        let p = self.get(tp)?;
        let st = p.state();
        (st.leader != self.local_id && st.leader_epoch == leader_epoch).then_some(p)
    }

    /// The latest epoch in a followed partition's log (`None` inside: an empty epoch
    /// cache); `None` when the partition is not hosted.
    pub(crate) fn follower_latest_epoch(&self, tp: &TopicPartition) -> Option<Option<i32>> {
        let p = self.get(tp)?;
        p.with_log(|log| log.latest_epoch()).ok()
    }

    /// `(log end offset, log start offset)` of a followed partition: where to fetch from.
    /// Whether the metadata has this broker in `tp`'s ISR.
    pub(crate) fn in_sync(&self, tp: &TopicPartition) -> bool {
        self.get(tp)
            .is_some_and(|p| p.state().isr.contains(&self.local_id))
    }

    /// The follower side's replication throttle (see `replica_fetcher::FollowerThrottle`).
    pub fn follower_throttle(&self) -> &crate::replication::replica_fetcher::FollowerThrottle {
        self.fetchers.follower_throttle()
    }

    pub(crate) fn follower_fetch_position(&self, tp: &TopicPartition) -> Option<(i64, i64)> {
        let p = self.get(tp)?;
        p.with_log(|log| (log.log_end_offset(), log.log_start_offset()))
            .ok()
    }

    /// KIP-279 truncation: the leader answered `(answered_epoch, end_offset)` for the
    /// follower's latest epoch `asked_epoch`. Truncates to the end offset when the leader
    /// knows that epoch, else to the lesser of the leader's end offset and this log's own
    /// end of `answered_epoch`; an undefined answer (-1) falls back to the high watermark.
    pub(crate) fn truncate_to_leader_epoch(
        &self,
        tp: &TopicPartition,
        leader_epoch: i32,
        asked_epoch: i32,
        answered_epoch: i32,
        end_offset: i64,
    ) -> Result<(), String> {
        let p = self
            .follower_partition(tp, leader_epoch)
            .ok_or_else(|| "no longer a follower in this epoch".to_string())?;
        p.with_log(|log| {
            let leo = log.log_end_offset();
            let target = if answered_epoch < 0 || end_offset < 0 {
                log.high_watermark()
            } else if answered_epoch == asked_epoch {
                end_offset.min(leo)
            } else {
                let (_, own_end) = log.end_offset_for_epoch(answered_epoch);
                let own_end = if own_end < 0 { leo } else { own_end };
                end_offset.min(own_end).min(leo)
            };
            if target < leo {
                tracing::info!(%tp, from = leo, to = target, "truncating follower log by leader epoch");
                p.truncations
                    .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
                log.truncate_to(target, self.now()).map_err(|e| {
                    self.log_dir_failed(&p, format_args!("truncation of {tp}"), &e);
                    e.to_string()
                })?;
            }
            Ok(())
        })
        .map_err(|code| code.name().to_string())?
    }

    /// Appends records fetched from the leader, then adopts the leader's high watermark
    /// (up to this log's end) and log start offset.
    pub(crate) fn append_as_follower(
        &self,
        tp: &TopicPartition,
        leader_epoch: i32,
        records: Bytes,
        leader_high_watermark: i64,
        leader_log_start_offset: i64,
    ) -> Result<(), ErrorCode> {
        let p = self
            .follower_partition(tp, leader_epoch)
            .ok_or(ErrorCode::NOT_LEADER_OR_FOLLOWER)?;
        if p.is_offline() {
            return Err(ErrorCode::KAFKA_STORAGE_ERROR);
        }
        let now = self.now();
        let failed = |e: &AppendError| {
            if let AppendError::Io(io) = e {
                self.log_dir_failed(&p, format_args!("follower append to {tp}"), io);
            }
            append_error_code(e)
        };
        // Validated without the lock, against a snapshot of the config (see the module
        // docs); an offline log refuses before any check of the records, as before.
        let validated = if records.is_empty() {
            None
        } else {
            let config = p.with_log(|log| log.config_for_append())?;
            Some(
                config
                    .and_then(|c| {
                        UnifiedLog::validate_records(&c, &records, AppendOrigin::Replication, now)
                    })
                    .map_err(|e| failed(&e))?,
            )
        };
        let flush = p.with_log(|log| {
            let mut flush = None;
            if let Some(validated) = validated {
                let (_, pending) = log
                    .append_validated_as_follower(validated, now)
                    .map_err(|e| failed(&e))?;
                flush = pending;
            }
            let hw = leader_high_watermark.min(log.log_end_offset());
            if hw > log.high_watermark() {
                log.update_high_watermark(hw);
            }
            if leader_log_start_offset > log.log_start_offset() {
                if let Err(e) = log.maybe_increment_log_start_offset(leader_log_start_offset) {
                    self.log_dir_failed(&p, format_args!("log start checkpoint of {tp}"), &e);
                    return Err(ErrorCode::KAFKA_STORAGE_ERROR);
                }
            }
            Ok(flush)
        })??;
        p.topic_metrics.add(
            |t| &t.replication_bytes_in,
            u64::try_from(records.len()).unwrap_or(0),
        );
        // The fetcher fetches again only after this returns, so the next records of this
        // partition wait for the fsync as they did when it was made under the lock; the
        // lock is free meanwhile for reads and for the leader's other work. Blocking, on
        // the fetcher's task, as the append itself.
        match flush {
            Some(flush) => self.complete_flush(tp, &p, flush.sync()),
            None => Ok(()),
        }
    }

    /// Installs the remote tier's state source (tiered storage on); once.
    pub fn set_remote_tier_state(&self, source: Arc<dyn RemoteTierState>) {
        let _ = self.remote_tier.set(source);
    }

    /// What the remote tier says of `tp` at `offset` (see [`RemoteTierState`]).
    pub(crate) async fn remote_tier_state(
        &self,
        tp: &TopicPartition,
        offset: i64,
    ) -> RemoteTierLookup {
        let (Some(source), Some(p)) = (self.remote_tier.get(), self.get(tp)) else {
            return RemoteTierLookup::NotTiered;
        };
        let behind = p
            .with_log(|log| log.log_end_offset() < offset)
            .unwrap_or(false);
        if !behind {
            return RemoteTierLookup::NotTiered;
        }
        source.state_at(tp, p.topic_id, offset).await
    }

    /// The leader said the fetch offset is out of range. When this log ends below the
    /// leader's log start, start over there (returns true), with the leader's epochs and
    /// producer state from the remote tier when `aux` has them; otherwise the caller
    /// validates the epoch again.
    pub(crate) fn handle_out_of_range(
        &self,
        tp: &TopicPartition,
        leader_log_start_offset: i64,
        aux: Option<RemoteTierAux>,
    ) -> Result<bool, ErrorCode> {
        let p = self.get(tp).ok_or(ErrorCode::UNKNOWN_TOPIC_OR_PARTITION)?;
        p.with_log(|log| {
            if leader_log_start_offset >= 0 && log.log_end_offset() < leader_log_start_offset {
                tracing::info!(%tp, start = leader_log_start_offset, from_remote_tier = aux.is_some(), "follower behind the leader's log start; starting over");
                p.truncations
                    .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
                let started = match &aux {
                    Some((epochs, snapshot)) => log.start_from_remote_tier(
                        leader_log_start_offset,
                        epochs,
                        snapshot.as_deref(),
                        self.now(),
                    ),
                    None => log.truncate_fully_and_start_at(leader_log_start_offset, self.now()),
                };
                started
                    .map(|_| true)
                    .map_err(|e| {
                        self.log_dir_failed(&p, format_args!("truncation of {tp}"), &e);
                        ErrorCode::KAFKA_STORAGE_ERROR
                    })
            } else {
                Ok(false)
            }
        })?
    }

    /// The partition, when this broker leads it; NOT_LEADER_OR_FOLLOWER when it hosts
    /// it otherwise, UNKNOWN_TOPIC_OR_PARTITION when it does not host it at all.
    pub fn leader_partition(
        &self,
        tp: &TopicPartition,
    ) -> Result<(Arc<Partition>, i32), ErrorCode> {
        let partition = self.get(tp).ok_or(ErrorCode::UNKNOWN_TOPIC_OR_PARTITION)?;
        // Kafka's `getPartitionOrException` on an offline partition.
        if partition.is_offline() {
            return Err(ErrorCode::KAFKA_STORAGE_ERROR);
        }
        if !self.lease_held() {
            return Err(ErrorCode::NOT_LEADER_OR_FOLLOWER);
        }
        match partition.leader_epoch_if_leader(self.local_id) {
            Some(epoch) => Ok((partition, epoch)),
            None => Err(ErrorCode::NOT_LEADER_OR_FOLLOWER),
        }
    }

    /// Whether this broker holds its controller lease (see the field).
    pub fn lease_held(&self) -> bool {
        self.lease_held.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Records whether the lease is held; returns whether that changed. Every parked
    /// fetch and acks=all wait is woken to look again.
    pub fn set_lease_held(&self, held: bool) -> bool {
        let changed = self
            .lease_held
            .swap(held, std::sync::atomic::Ordering::AcqRel)
            != held;
        if changed {
            self.appended.notify_all();
        }
        changed
    }

    /// KIP-320: a client's view of the leader epoch against ours (-1: no check).
    pub fn check_leader_epoch(
        &self,
        tp: &TopicPartition,
        current_leader_epoch: i32,
    ) -> Result<(Arc<Partition>, i32), ErrorCode> {
        let (partition, epoch) = self.leader_partition(tp)?;
        if current_leader_epoch >= 0 {
            if current_leader_epoch < epoch {
                return Err(ErrorCode::FENCED_LEADER_EPOCH);
            }
            if current_leader_epoch > epoch {
                return Err(ErrorCode::UNKNOWN_LEADER_EPOCH);
            }
        }
        Ok((partition, epoch))
    }

    /// Every hosted partition, for background maintenance.
    pub fn partitions(&self) -> Vec<(TopicPartition, Arc<Partition>)> {
        self.read_map()
            .iter()
            .map(|(tp, p)| (tp.clone(), p.clone()))
            .collect()
    }

    /// DeleteRecords: moves the log start offset up to `offset` (-1: the high watermark)
    /// and returns the new low watermark.
    pub fn delete_records(&self, tp: &TopicPartition, offset: i64) -> Result<i64, ErrorCode> {
        let (partition, _) = self.leader_partition(tp)?;
        match partition.with_log(|log| log.delete_records_before(offset))? {
            Ok(result) => Ok(result.log_start_offset),
            Err(rill_storage::DeleteRecordsError::OffsetOutOfRange { .. }) => {
                Err(ErrorCode::OFFSET_OUT_OF_RANGE)
            }
            Err(rill_storage::DeleteRecordsError::PolicyViolation) => {
                Err(ErrorCode::POLICY_VIOLATION)
            }
            Err(rill_storage::DeleteRecordsError::Io(e)) => {
                self.log_dir_failed(&partition, format_args!("delete records of {tp}"), &e);
                Err(ErrorCode::KAFKA_STORAGE_ERROR)
            }
        }
    }

    pub fn get(&self, tp: &TopicPartition) -> Option<Arc<Partition>> {
        self.read_map().get(tp).cloned()
    }

    /// Stops hosting a partition and deletes its log from disk.
    pub fn delete_partition(&self, tp: &TopicPartition) -> Result<(), BrokerError> {
        self.fetchers.remove_partition(tp);
        let removed = {
            let mut map = self.write_map();
            let removed = map.remove(tp);
            // The topic's series leave /metrics with its last partition here, as Kafka's
            // `BrokerTopicStats.removeMetrics` does when a topic is deleted.
            if removed.is_some() && !map.keys().any(|other| other.topic == tp.topic) {
                metrics::global().topics.remove(&tp.topic);
            }
            removed
        };
        // Produces and fetches parked on the partition must learn that it is gone now,
        // not at their timeout.
        self.appended.notify(tp);
        if let Some(partition) = removed {
            // In-flight users hold their own Arc: from here on they find it deleted, so
            // none writes to a directory being removed (which would fail the whole log
            // directory) or to a new log made under the same name.
            partition.mark_deleted();
            self.drop_future(&partition);
            let offline = partition.is_offline();
            let dir = self
                .log_dir_path(partition.log_dir())
                .join(partition_dir_name(&tp.topic, tp.partition));
            drop(partition);
            self.located
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(tp);
            self.pending_assignments
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(tp);
            // Nothing is removed from a failed directory (Kafka leaves it alone too): the
            // stray logs go at a start that finds it working again.
            if offline {
                return Ok(());
            }
            match std::fs::remove_dir_all(&dir) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(BrokerError::io(dir.display(), e)),
            }
        }
        Ok(())
    }

    /// Applies new topic configs to the live logs of a topic.
    pub fn reconfigure(&self, topic: &str, config: &LogConfig) {
        for (tp, p) in self.read_map().iter() {
            if tp.topic == topic {
                match p.with_log(|log| log.update_config(config.clone())) {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => tracing::error!(%tp, error = %e, "reconfiguring log failed"),
                    Err(_) => tracing::error!(%tp, "log lock poisoned"),
                }
            }
        }
    }

    /// Appends a client's record set as leader. With an ISR of this broker alone the
    /// append is the commit, so the high watermark follows the log end offset at once.
    pub fn append(
        &self,
        tp: &TopicPartition,
        records: &Bytes,
    ) -> Result<(LogAppendInfo, i64), ErrorCode> {
        self.append_with_origin(tp, records, AppendOrigin::Client)
    }

    /// Appends as [`Self::append`] does, for a writer other than a client (the group
    /// coordinator writes `__consumer_offsets` as `Coordinator`).
    ///
    /// A flush the policy asks for is made here, on the calling thread (blocking), after
    /// the partition's lock is released; the produce path uses [`Self::append_deferred`]
    /// instead to make it off the async workers.
    pub fn append_with_origin(
        &self,
        tp: &TopicPartition,
        records: &Bytes,
        origin: AppendOrigin,
    ) -> Result<(LogAppendInfo, i64), ErrorCode> {
        let mut appended = self.append_deferred(tp, records, origin)?;
        if let Some(flush) = appended.take_flush() {
            self.complete_flush(tp, &appended.partition, flush.sync())?;
        }
        Ok((appended.info, appended.log_start_offset))
    }

    /// Appends as [`Self::append_with_origin`] but leaves the fsync the flush policy asks
    /// for to the caller: [`DeferredAppend::take_flush`], [`PendingFlush::sync`] where
    /// blocking is acceptable, then [`Self::complete_flush`], all before the append is
    /// acknowledged. Until then the records are not counted towards the high watermark.
    pub fn append_deferred(
        &self,
        tp: &TopicPartition,
        records: &Bytes,
        origin: AppendOrigin,
    ) -> Result<DeferredAppend, ErrorCode> {
        self.append_deferred_detailed(tp, records, origin)
            .map_err(|refused| refused.code)
    }

    /// [`Self::append_deferred`], whose refusal also names the records that failed their
    /// checks (KIP-467), for a Produce response's `record_errors`.
    pub fn append_deferred_detailed(
        &self,
        tp: &TopicPartition,
        records: &Bytes,
        origin: AppendOrigin,
    ) -> Result<DeferredAppend, AppendRefused> {
        self.append_deferred_verified(tp, records, origin, None)
    }

    /// KIP-890 part 1: whether a client's transactional batch of this producer needs
    /// the transaction coordinator's word before it is appended here (`Some(guard)`, see
    /// [`rill_storage::UnifiedLog::start_txn_verification`]) or not (`None`: its
    /// transaction is open here already). `supports_epoch_bump`: a transaction version
    /// 2 producer (Produce v12+).
    pub fn start_txn_verification(
        &self,
        tp: &TopicPartition,
        (producer_id, producer_epoch): (i64, i16),
        supports_epoch_bump: bool,
    ) -> Result<Option<u64>, ErrorCode> {
        let (partition, _) = self.leader_partition(tp)?;
        let now = self.now();
        partition
            .with_log(|log| {
                log.start_txn_verification(producer_id, producer_epoch, supports_epoch_bump, now)
            })?
            .map_err(|e| append_error_code(&e))
    }

    /// [`Self::append_deferred_detailed`]; with `txn_verification` `Some`, a batch that
    /// would open a transaction must carry the guard inside (KIP-890 part 1).
    pub fn append_deferred_verified(
        &self,
        tp: &TopicPartition,
        records: &Bytes,
        origin: AppendOrigin,
        txn_verification: Option<Option<u64>>,
    ) -> Result<DeferredAppend, AppendRefused> {
        let (partition, epoch) = self.leader_partition(tp)?;
        let now = self.now();
        // The storage treats `Replication` as `Coordinator` on a leader append.
        let origin = if origin == AppendOrigin::Replication {
            AppendOrigin::Coordinator
        } else {
            origin
        };
        // Validation (CRC, the record walk, a re-compression) without the lock: it needs
        // only the config, read under the lock, which also refuses an offline log first
        // as the append always did.
        let validated = partition
            .with_log(|log| log.config_for_append())?
            .and_then(|config| UnifiedLog::validate_records(&config, records, origin, now));
        let validated = match validated {
            Ok(mut v) => {
                if let Some(guard) = txn_verification {
                    v.require_txn_verification(guard);
                }
                v
            }
            Err(e) => {
                let code = self.append_failed(&partition, tp, &e);
                let record_errors = match e {
                    AppendError::RecordErrors(refused) => Some(refused),
                    _ => None,
                };
                return Err(AppendRefused {
                    code,
                    record_errors,
                });
            }
        };
        let statuses = self.broker_statuses();
        let mut leader = partition.leader_state();
        let result = partition.with_log(|log| {
            let (info, flush) = log.append_validated_as_leader(validated, epoch, now)?;
            // Records that still owe their fsync count towards the high watermark only
            // once it is made (`complete_flush`).
            let mut hw_moved = false;
            if flush.is_none() {
                if let Some(ls) = leader.as_mut() {
                    let leo = log.log_end_offset();
                    let hw = log.high_watermark();
                    update_leader_log_end(tp, ls, log, leo, now, &*statuses);
                    hw_moved = log.high_watermark() != hw;
                }
            }
            Ok::<_, AppendError>((info, log.log_start_offset(), flush, hw_moved))
        })?;
        drop(leader);
        match result {
            Ok((info, log_start_offset, flush, hw_moved)) => {
                if flush.is_none() {
                    // Followers wait for the log end; acks=all produces and consumers
                    // for the high watermark, which an append moves only when the
                    // leader is the whole ISR (see `append_signal`).
                    self.appended.notify_log_end(tp);
                    if hw_moved {
                        self.appended.notify_high_watermark(tp);
                    }
                }
                Ok(DeferredAppend {
                    info,
                    log_start_offset,
                    partition,
                    flush,
                })
            }
            Err(e) => Err(self.append_failed(&partition, tp, &e).into()),
        }
    }

    /// Step 3 of group commit, with the outcome of a [`PendingFlush::sync`] of `tp`'s
    /// log: moves the recovery point and, on a leader, counts what is now durable
    /// towards the high watermark; a failed fsync takes the log and the data directory
    /// offline and the append fails with KAFKA_STORAGE_ERROR, as a failed write does.
    pub fn complete_flush(
        &self,
        tp: &TopicPartition,
        partition: &Arc<Partition>,
        synced: Result<FlushDone, StorageError>,
    ) -> Result<(), ErrorCode> {
        let now = self.now();
        let statuses = self.broker_statuses();
        let mut leader = partition.leader_state();
        let result = partition.with_log(|log| match synced {
            Ok(done) => {
                log.complete_flush(done);
                if let Some(ls) = leader.as_mut() {
                    // Only what is fsynced: appends written after this sync started may
                    // still wait for theirs.
                    let durable = log.recovery_point().min(log.log_end_offset());
                    if durable > ls.log_end_offset() {
                        update_leader_log_end(tp, ls, log, durable, now, &*statuses);
                    }
                }
                Ok(())
            }
            Err(e) => Err(log.flush_failed(e)),
        })?;
        drop(leader);
        self.appended.notify(tp);
        result.map_err(|e| {
            self.log_dir_failed(partition, format_args!("flush of {tp}"), &e);
            ErrorCode::KAFKA_STORAGE_ERROR
        })
    }

    /// Maps a failed append to its error code, reporting a disk failure.
    fn append_failed(
        &self,
        partition: &Partition,
        tp: &TopicPartition,
        e: &AppendError,
    ) -> ErrorCode {
        if let AppendError::Io(io) = e {
            self.log_dir_failed(partition, format_args!("append to {tp}"), io);
        }
        append_error_code(e)
    }

    /// The committed ISR size of a partition this broker leads, for
    /// `min.insync.replicas`, with the leader epoch.
    pub fn isr_size(&self, tp: &TopicPartition) -> Result<(usize, i32), ErrorCode> {
        let (partition, epoch) = self.leader_partition(tp)?;
        let size = partition
            .leader_state()
            .as_ref()
            .map(LeaderState::isr_size)
            .ok_or(ErrorCode::NOT_LEADER_OR_FOLLOWER)?;
        Ok((size, epoch))
    }

    /// acks=all (Kafka's `DelayedProduce`): waits until the high watermark reaches
    /// `required_offset`, then answers NONE when the ISR still has `min_insync`
    /// members (NOT_ENOUGH_REPLICAS_AFTER_APPEND otherwise); REQUEST_TIMED_OUT at the
    /// deadline; NOT_LEADER_OR_FOLLOWER when leadership moved meanwhile (the records
    /// may or may not survive: the client retries, and idempotence dedups).
    pub async fn wait_for_commit(
        &self,
        tp: &TopicPartition,
        leader_epoch: i32,
        required_offset: i64,
        min_insync: usize,
        deadline: tokio::time::Instant,
    ) -> ErrorCode {
        loop {
            let notified = self.appended.high_watermark_of(tp);
            match self.commit_progress(tp, leader_epoch, required_offset, min_insync) {
                None => return ErrorCode::NOT_LEADER_OR_FOLLOWER,
                Some(isr::AcksAllProgress::Done) => return ErrorCode::NONE,
                Some(isr::AcksAllProgress::NotEnoughReplicasAfterAppend) => {
                    return ErrorCode::NOT_ENOUGH_REPLICAS_AFTER_APPEND
                }
                Some(isr::AcksAllProgress::Waiting) => {}
            }
            // The periodic re-check is a backstop: every change that can end the wait
            // notifies, but a missed one must cost a fraction of a second, not the
            // producer's whole timeout.
            let recheck = tokio::time::Instant::now() + ACKS_ALL_RECHECK;
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep_until(recheck.min(deadline)) => {
                    if tokio::time::Instant::now() >= deadline {
                        return ErrorCode::REQUEST_TIMED_OUT;
                    }
                }
            }
        }
    }

    /// Where an acks=all append stands: `None` when this broker no longer leads the
    /// partition in `leader_epoch` (see [`ReplicaManager::wait_for_commit`]).
    pub fn commit_progress(
        &self,
        tp: &TopicPartition,
        leader_epoch: i32,
        required_offset: i64,
        min_insync: usize,
    ) -> Option<isr::AcksAllProgress> {
        match self.leader_partition(tp) {
            Ok((p, epoch)) if epoch == leader_epoch => p
                .leader_state()
                .as_ref()
                .map(|ls| ls.check_enough_replicas_reach_offset(required_offset, min_insync)),
            _ => None,
        }
    }

    /// A follower's fetch, on the leader: records the follower's progress (which may
    /// move the high watermark or admit it to the ISR) and reads from its fetch offset up
    /// to the log end, not the high watermark.
    #[allow(clippy::too_many_arguments, reason = "one Fetch partition's fields")]
    pub fn read_for_follower(
        &self,
        tp: &TopicPartition,
        replica_id: i32,
        current_leader_epoch: i32,
        fetch_offset: i64,
        follower_log_start_offset: i64,
        max_bytes: usize,
        zero_copy: bool,
    ) -> Result<FetchResult, (ErrorCode, Option<PartitionOffsets>)> {
        let (partition, _) = self
            .check_leader_epoch(tp, current_leader_epoch)
            .map_err(|code| (code, None))?;
        let statuses = self.broker_statuses();
        let now = self.now();
        let proposal;
        let mut moved = false;
        {
            let mut leader = partition.leader_state();
            let Some(ls) = leader.as_mut() else {
                return Err((ErrorCode::NOT_LEADER_OR_FOLLOWER, None));
            };
            let updated = partition
                .with_log(|log| {
                    ls.update_log_start_offset(log.log_start_offset());
                    let outcome = ls.update_follower_fetch(
                        replica_id,
                        fetch_offset,
                        follower_log_start_offset,
                        now,
                        isr::NO_BROKER_EPOCH,
                        &*statuses,
                    )?;
                    if let Some(hw) = outcome.high_watermark {
                        if hw > log.high_watermark() {
                            log.update_high_watermark(hw);
                            moved = true;
                        }
                    }
                    Ok::<_, isr::IsrError>(outcome.alter_partition)
                })
                .map_err(|code| (code, None))?;
            match updated {
                Ok(p) => proposal = p,
                Err(e) => {
                    let offsets = partition.with_log(|log| PartitionOffsets::of(log)).ok();
                    return Err((e.error_code(), offsets));
                }
            }
        }
        if let Some(p) = proposal {
            self.send_alter_partition(tp, partition.topic_id, p);
        }
        if moved {
            // Only the high watermark moved: the acks=all produces and consumers waiting
            // on it wake, not the other followers' fetches parked at the log end.
            self.appended.notify_high_watermark(tp);
        }
        read_partition(
            &self.log_dir_failure,
            tp,
            &partition,
            ReadSpec {
                offset: fetch_offset,
                max_bytes,
                min_one_message: true,
                zero_copy,
                up_to: ReadUpTo::LogEnd,
            },
        )
    }

    /// Hands an ISR change to the AlterPartition sender.
    fn send_alter_partition(
        &self,
        tp: &TopicPartition,
        topic_id: Uuid,
        proposal: isr::AlterPartitionProposal,
    ) {
        tracing::info!(%tp, isr = ?proposal.isr(), "proposing an ISR change");
        let _ = self
            .alter_partition_tx
            .send((tp.clone(), topic_id, proposal));
    }

    /// Periodic ISR shrink (Kafka's `isr-expiration` task): followers that have not caught
    /// up within `replica.lag.time.max.ms` leave the ISR.
    pub fn maybe_shrink_isrs(&self) {
        let now = self.now();
        let lag = self.replica_lag_time_max_ms;
        for (tp, p) in self.partitions() {
            let proposal = p
                .leader_state()
                .as_mut()
                .and_then(|ls| ls.maybe_shrink_isr(now, lag));
            if let Some(proposal) = proposal {
                self.send_alter_partition(&tp, p.topic_id, proposal);
            }
        }
    }

    /// The controller's answer to an ISR change this broker proposed. Returns a proposal
    /// to send again when the answer was a transient error.
    pub fn on_alter_partition_response(
        &self,
        tp: &TopicPartition,
        sent: &isr::AlterPartitionProposal,
        result: Result<isr::LeaderAndIsr, ErrorCode>,
    ) -> Option<isr::AlterPartitionProposal> {
        let partition = self.get(tp)?;
        let statuses = self.broker_statuses();
        let mut leader = partition.leader_state();
        let ls = leader.as_mut()?;
        let outcome = ls.on_alter_partition_response(sent, result, self.now(), &*statuses);
        match outcome {
            isr::AlterPartitionOutcome::Committed { high_watermark } => {
                let isr: Vec<i32> = ls.isr().iter().copied().collect();
                drop(leader);
                let mut state = partition.state.lock().unwrap_or_else(|e| e.into_inner());
                // Counted once the controller has accepted the change, as Kafka's
                // `Partition` counts IsrShrinksPerSec and IsrExpandsPerSec.
                let m = &metrics::global().replication;
                match isr.len().cmp(&state.isr.len()) {
                    std::cmp::Ordering::Less => metrics::inc(&m.isr_shrinks),
                    std::cmp::Ordering::Greater => metrics::inc(&m.isr_expands),
                    std::cmp::Ordering::Equal => {}
                }
                state.isr = isr;
                drop(state);
                if let Some(hw) = high_watermark {
                    let _ = partition.with_log(|log| {
                        if hw > log.high_watermark() {
                            log.update_high_watermark(hw);
                        }
                    });
                }
                self.appended.notify(tp);
                None
            }
            isr::AlterPartitionOutcome::Retry(p) => Some(p),
            _ => None,
        }
    }

    /// Liveness of every registered broker, from the metadata image.
    pub fn set_broker_statuses(&self, statuses: BTreeMap<i32, isr::BrokerStatus>) {
        *self
            .broker_statuses
            .write()
            .unwrap_or_else(|e| e.into_inner()) = Arc::new(statuses);
    }

    fn broker_statuses(&self) -> Arc<BTreeMap<i32, isr::BrokerStatus>> {
        self.broker_statuses
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// This broker's epoch, for the ISR entries it proposes.
    pub fn set_local_broker_epoch(&self, epoch: i64) {
        self.local_broker_epoch
            .store(epoch, std::sync::atomic::Ordering::Release);
    }

    fn leader_config(&self) -> isr::LeaderConfig {
        isr::LeaderConfig {
            local_broker_id: self.local_id,
            local_broker_epoch: self
                .local_broker_epoch
                .load(std::sync::atomic::Ordering::Acquire),
            replica_lag_time_max_ms: self.replica_lag_time_max_ms,
        }
    }

    pub fn offsets(&self, tp: &TopicPartition) -> Result<PartitionOffsets, ErrorCode> {
        let (partition, _) = self.leader_partition(tp)?;
        partition.with_log(|log| PartitionOffsets::of(log))
    }

    /// Appends one transaction marker to a partition this broker leads, as the
    /// coordinator's write (Kafka's WriteTxnMarkers path: `requiredAcks = -1`, origin
    /// COORDINATOR): refused with NOT_ENOUGH_REPLICAS when the ISR is below
    /// `min_insync`, as an acks=all produce is. Returns the append, which may still owe
    /// its fsync ([`DeferredAppend::take_flush`], then [`Self::complete_flush`]), and the
    /// leader epoch to hand to [`Self::wait_for_commit`] with the marker's offset + 1:
    /// only once that answers NONE is the marker written in Kafka's sense.
    pub fn append_txn_marker(
        &self,
        tp: &TopicPartition,
        marker: &TxnMarker,
        min_insync: usize,
    ) -> Result<(DeferredAppend, i32), ErrorCode> {
        let (isr, epoch) = self.isr_size(tp)?;
        if isr < min_insync {
            return Err(ErrorCode::NOT_ENOUGH_REPLICAS);
        }
        let records = end_txn_marker_batch(
            marker.producer_id,
            marker.producer_epoch,
            marker.coordinator_epoch,
            marker.commit,
            self.now(),
        )
        .map_err(|e| append_error_code(&e))?;
        let appended = self.append_deferred(tp, &records, AppendOrigin::Coordinator)?;
        Ok((appended, epoch))
    }

    /// The producers a partition this broker leads knows (DescribeProducers), with the
    /// partition's open transactions.
    pub fn active_producers(
        &self,
        tp: &TopicPartition,
    ) -> Result<Vec<rill_storage::ProducerStateEntry>, ErrorCode> {
        let (partition, _) = self.leader_partition(tp)?;
        partition.with_log(|log| log.active_producers())
    }

    /// Reads committed data (below the high watermark) from `offset`.
    pub fn read(
        &self,
        tp: &TopicPartition,
        offset: i64,
        max_bytes: usize,
        min_one_message: bool,
    ) -> Result<FetchResult, (ErrorCode, Option<PartitionOffsets>)> {
        self.read_maybe_zero_copy(tp, -1, offset, max_bytes, min_one_message, false, false)
    }

    /// The leader's own read of its log up to the log end, not the high watermark: what
    /// the group coordinator replays when it takes over a `__consumer_offsets` partition.
    /// A new leader's high watermark lags its log (it learns it from fetches), yet every
    /// record in its log is the partition's from now on, acknowledged commits included
    /// (Kafka's coordinator loads to the log end too).
    pub fn read_to_log_end(
        &self,
        tp: &TopicPartition,
        offset: i64,
        max_bytes: usize,
    ) -> Result<FetchResult, (ErrorCode, Option<PartitionOffsets>)> {
        let (partition, _) = self.leader_partition(tp).map_err(|code| (code, None))?;
        read_partition(
            &self.log_dir_failure,
            tp,
            &partition,
            ReadSpec {
                offset,
                max_bytes,
                min_one_message: true,
                zero_copy: false,
                up_to: ReadUpTo::LogEnd,
            },
        )
    }

    /// As [`ReplicaManager::read`], but with `zero_copy` the records are not read: only
    /// their file range is returned, for the connection to send with `sendfile`. With
    /// `read_committed` (Fetch's `isolation_level` 1) the read stops at the last stable
    /// offset and reports the aborted transactions in its range.
    #[allow(clippy::too_many_arguments, reason = "one Fetch partition's fields")]
    pub fn read_maybe_zero_copy(
        &self,
        tp: &TopicPartition,
        current_leader_epoch: i32,
        offset: i64,
        max_bytes: usize,
        min_one_message: bool,
        zero_copy: bool,
        read_committed: bool,
    ) -> Result<FetchResult, (ErrorCode, Option<PartitionOffsets>)> {
        let (partition, _) = self
            .check_leader_epoch(tp, current_leader_epoch)
            .map_err(|code| (code, None))?;
        read_partition(
            &self.log_dir_failure,
            tp,
            &partition,
            ReadSpec {
                offset,
                max_bytes,
                min_one_message,
                zero_copy,
                up_to: if read_committed {
                    ReadUpTo::LastStableOffset
                } else {
                    ReadUpTo::HighWatermark
                },
            },
        )
    }

    /// ListOffsets by timestamp: `(offset, timestamp, leader_epoch)` of the first record at
    /// or after `timestamp`, or `None` when there is none.
    pub fn offset_for_timestamp(
        &self,
        tp: &TopicPartition,
        timestamp: i64,
    ) -> Result<Option<(i64, i64, i32)>, ErrorCode> {
        let (partition, _) = self.leader_partition(tp)?;
        let found = partition.with_log(|log| log.offset_for_timestamp(timestamp))?;
        Ok(storage_result(tp, found)?
            .map(|t| (t.offset, t.timestamp, t.leader_epoch.unwrap_or(-1))))
    }

    /// ListOffsets LATEST_TIERED (KIP-1005): the last offset the remote tier holds (-1:
    /// none).
    pub fn highest_offset_in_remote_storage(&self, tp: &TopicPartition) -> Result<i64, ErrorCode> {
        let (partition, _) = self.leader_partition(tp)?;
        partition.with_log(|log| log.highest_offset_in_remote_storage())
    }

    /// ListOffsets MAX_TIMESTAMP (KIP-734): the offset and timestamp of the record with the
    /// largest timestamp, if any.
    pub fn max_timestamp(&self, tp: &TopicPartition) -> Result<Option<(i64, i64)>, ErrorCode> {
        let (partition, _) = self.leader_partition(tp)?;
        let found = partition.with_log(|log| log.max_timestamp_and_offset())?;
        Ok(storage_result(tp, found)?.map(|t| (t.offset, t.timestamp)))
    }

    /// What parked requests wait on: a partition's shard is notified at each append
    /// to it, each move of its high watermark and each change of its leadership.
    /// Fetches take [`AppendSignals::any_of`] their partitions' shards before they
    /// read and await it after, racing their deadline, so no append between the read
    /// and the wait is missed; a spurious wake-up only costs one more read.
    pub fn signals(&self) -> &AppendSignals {
        &self.appended
    }

    /// Closes every log (index entries, checkpoints, producer snapshot; no fsync), makes
    /// all of it durable with one `syncfs`, and records the clean shutdown in the data
    /// directory's marker, so that the next start skips recovery. A partition still
    /// referenced by an in-flight request is only flushed, and then no clean shutdown
    /// is recorded: the next start recovers every log.
    pub fn shutdown(&self) {
        self.fetchers.shutdown();
        if let Some(failure) = self.log_dir_failure.failure() {
            // Nothing more is written to a failed directory; without the clean-shutdown
            // marker the logs are recovered from what is on disk at the next start.
            tracing::error!(%failure, "not closing the logs");
            return;
        }
        let partitions: Vec<_> = {
            let mut map = self.write_map();
            self.shutting_down
                .store(true, std::sync::atomic::Ordering::SeqCst);
            map.drain().collect()
        };
        // A failed directory's logs are left as they are (not written to again).
        let partitions: Vec<_> = partitions
            .into_iter()
            .filter(|(_, p)| !p.is_offline())
            .collect();
        // Each close only writes files (no fsync), several partitions at a time.
        let closed = for_each_owned(partitions, |(tp, p)| {
            let dir = p.log_dir();
            let result = match Arc::try_unwrap(p) {
                Ok(p) => match p.log.into_inner() {
                    Ok(log) => log.close(),
                    Err(_) => return (dir, None),
                },
                Err(p) => {
                    if let Ok(Err(e)) = p.with_log(|log| log.flush()) {
                        tracing::error!(%tp, error = %e, "flushing a log in use failed");
                    }
                    tracing::warn!(%tp, "log still in use at shutdown, not closed");
                    return (dir, None);
                }
            };
            match result {
                Ok(()) => (dir, Some(tp)),
                Err(e) => {
                    tracing::error!(%tp, error = %e, "closing log failed");
                    (dir, None)
                }
            }
        });
        for (index, log_dir) in self.log_dirs.iter().enumerate() {
            let mine: Vec<&Option<TopicPartition>> = closed
                .iter()
                .filter(|(d, _)| *d == index)
                .map(|(_, tp)| tp)
                .collect();
            let total = mine.len();
            let done: std::collections::HashSet<TopicPartition> =
                mine.into_iter().flatten().cloned().collect();
            let dir = log_dir.path.display();
            if done.len() != total {
                tracing::warn!(
                    %dir,
                    not_closed = total - done.len(),
                    "not every log closed; the next start recovers all of them"
                );
                continue;
            }
            if let Err(reason) = self.unopened_logs_are_clean(log_dir, &done) {
                tracing::warn!(%dir, %reason, "the next start recovers every log");
                continue;
            }
            if let Some(failure) = self.log_dir_failure.dir_failure(index) {
                tracing::error!(%dir, %failure, "not recording a clean shutdown");
                continue;
            }
            let Some(sync) = &log_dir.sync else {
                continue;
            };
            // One write-back of the whole file system instead of an fsync per file; the
            // marker only once it succeeded, never retried (as an fsync is not).
            let started = std::time::Instant::now();
            if let Err(e) = sync.sync() {
                self.dir_failed(index, format_args!("syncfs of the closed logs"), &e);
                continue;
            }
            let synced = started.elapsed();
            match clean_shutdown::write_marker(&log_dir.path) {
                Ok(()) => tracing::info!(
                    %dir,
                    logs = total,
                    syncfs_ms = synced.as_secs_f64() * 1e3,
                    "logs closed; clean shutdown recorded"
                ),
                Err(e) => {
                    tracing::error!(%dir, error = %e, "writing the clean-shutdown marker failed")
                }
            }
        }
    }

    /// After an unclean start, a log this run did not open was not recovered either: the
    /// marker would make the next start trust its tail. Every partition directory of
    /// `log_dir` must then be among the logs just `closed` (the metadata log is not a
    /// partition's).
    fn unopened_logs_are_clean(
        &self,
        log_dir: &LogDir,
        closed: &std::collections::HashSet<TopicPartition>,
    ) -> Result<(), String> {
        if log_dir.previous_shutdown == PreviousShutdown::Clean {
            // Untouched since the last clean stop: still clean.
            return Ok(());
        }
        let path = &log_dir.path;
        let entries =
            std::fs::read_dir(path).map_err(|e| format!("listing {}: {e}", path.display()))?;
        for entry in entries {
            let entry = entry.map_err(|e| format!("listing {}: {e}", path.display()))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name == crate::config::METADATA_LOG_DIR {
                continue;
            }
            let Ok(tp) = parse_partition_dir_name(&name) else {
                continue;
            };
            if !closed.contains(&tp) && entry.path().is_dir() {
                return Err(format!(
                    "log {name} was not opened since an unclean shutdown"
                ));
            }
        }
        Ok(())
    }
}

/// How far a read may go: consumers see committed records only, followers everything
/// the leader has.
#[derive(Clone, Copy)]
enum ReadUpTo {
    HighWatermark,
    /// read_committed consumers: the last stable offset, with the aborted transactions.
    LastStableOffset,
    LogEnd,
}

/// What one read asks of a partition's log.
struct ReadSpec {
    offset: i64,
    max_bytes: usize,
    min_one_message: bool,
    /// The file range that holds the records instead of the records (for sendfile).
    zero_copy: bool,
    up_to: ReadUpTo,
}

/// Reads from `offset` up to the bound, as record bytes or, with `zero_copy`, as the
/// file range that holds them; out-of-range and storage failures come back with the
/// partition's offsets so that the response can still carry its watermarks.
fn read_partition(
    failure: &LogDirFailureChannel,
    tp: &TopicPartition,
    partition: &Partition,
    spec: ReadSpec,
) -> Result<FetchResult, (ErrorCode, Option<PartitionOffsets>)> {
    let ReadSpec {
        offset,
        max_bytes,
        min_one_message,
        zero_copy,
        up_to,
    } = spec;
    let result = partition
        .with_log(|log| {
            let offsets = PartitionOffsets::of(log);
            let bound = match up_to {
                ReadUpTo::HighWatermark => offsets.high_watermark,
                ReadUpTo::LastStableOffset => offsets.last_stable_offset,
                ReadUpTo::LogEnd => offsets.log_end_offset,
            };
            let data: Result<FetchDataInfo, ReadError> = if zero_copy {
                log.read_file_range(offset, max_bytes, bound, min_one_message)
            } else {
                log.read(offset, max_bytes, bound, min_one_message)
            };
            // Every aborted transaction that overlaps [offset, LSO): a superset of the
            // ones the records read overlap, which the consumer filters by producer and
            // offset (Kafka bounds it by the fetched segment's end instead).
            let aborted = matches!(up_to, ReadUpTo::LastStableOffset)
                .then(|| log.collect_aborted_txns(offset, bound));
            (offsets, data, aborted)
        })
        .map_err(|code| (code, None))?;
    match result {
        (offsets, Ok(data), aborted_transactions) => Ok(FetchResult {
            offsets,
            records: data.records,
            file_range: data.file_range,
            aborted_transactions,
            topic_metrics: partition.topic_metrics.clone(),
        }),
        (offsets, Err(ReadError::OffsetOutOfRange { .. }), _) => {
            Err((ErrorCode::OFFSET_OUT_OF_RANGE, Some(offsets)))
        }
        (offsets, Err(e), _) => {
            tracing::error!(%tp, error = %e, "read failed");
            // A disk that fails reads fails the directory, as Kafka's
            // `maybeHandleIOException` does for reads too: what it returns can no longer
            // be trusted, and a follower or consumer would only retry into it. A corrupt
            // batch found by a read is not an I/O failure and stays this fetch's error.
            if let ReadError::Io(storage) = &e {
                if storage.io_error().is_some() {
                    failure.maybe_add_offline_log_dir(
                        partition.log_dir(),
                        &format!("read of {tp}"),
                        &e,
                    );
                }
            }
            Err((ErrorCode::KAFKA_STORAGE_ERROR, Some(offsets)))
        }
    }
}

fn storage_result<T>(
    tp: &TopicPartition,
    r: Result<T, rill_storage::StorageError>,
) -> Result<T, ErrorCode> {
    r.map_err(|e| {
        tracing::error!(%tp, error = %e, "storage error");
        ErrorCode::KAFKA_STORAGE_ERROR
    })
}

/// The leader's own log end moved to `leo` (all of it, or what is fsynced of it): the
/// high watermark may follow.
fn update_leader_log_end(
    tp: &TopicPartition,
    ls: &mut LeaderState,
    log: &mut UnifiedLog,
    leo: i64,
    now: i64,
    statuses: &impl isr::BrokerLiveness,
) {
    match ls.update_leader_log_end(leo, now, statuses) {
        Ok(Some(hw)) => {
            log.update_high_watermark(hw);
        }
        Ok(None) => {}
        Err(e) => tracing::error!(%tp, error = %e, "leader state out of step with the log"),
    }
}

/// Why a leader refused a client's append: the error code and, when records failed
/// their checks (KIP-467), which ones.
#[derive(Debug)]
pub struct AppendRefused {
    pub code: ErrorCode,
    pub record_errors: Option<RecordErrors>,
}

impl From<ErrorCode> for AppendRefused {
    fn from(code: ErrorCode) -> Self {
        AppendRefused {
            code,
            record_errors: None,
        }
    }
}

/// Maps the log's refusal of an append to the code Kafka gives for it.
pub fn append_error_code(e: &AppendError) -> ErrorCode {
    match e {
        AppendError::CorruptMessage(_) => ErrorCode::CORRUPT_MESSAGE,
        AppendError::InvalidRecord(_) => ErrorCode::INVALID_RECORD,
        AppendError::MessageTooLarge { .. } => ErrorCode::MESSAGE_TOO_LARGE,
        AppendError::OutOfOrderSequence { .. } => ErrorCode::OUT_OF_ORDER_SEQUENCE_NUMBER,
        AppendError::InvalidProducerEpoch { .. } => ErrorCode::INVALID_PRODUCER_EPOCH,
        // Kafka's `processRecordErrors`: a bad timestamp anywhere makes it INVALID_TIMESTAMP.
        AppendError::RecordErrors(refused) if refused.any_timestamp => ErrorCode::INVALID_TIMESTAMP,
        AppendError::RecordErrors(_) => ErrorCode::INVALID_RECORD,
        AppendError::InvalidTxnState { .. } => ErrorCode::INVALID_TXN_STATE,
        AppendError::TransactionCoordinatorFenced { .. } => {
            ErrorCode::TRANSACTION_COORDINATOR_FENCED
        }
        AppendError::Io(_) => ErrorCode::KAFKA_STORAGE_ERROR,
        #[allow(unreachable_patterns, reason = "the storage enum may grow")]
        _ => ErrorCode::UNKNOWN_SERVER_ERROR,
    }
}

#[cfg(test)]
mod tests {
    //! The data directory's clean-shutdown marker as the replica manager keeps it.

    use super::*;
    use rill_protocol::records::{CompressionType, RecordBatchBuilder};

    fn manager(dir: &Path) -> ReplicaManager {
        let config = FetcherConfig {
            local_id: 1,
            max_wait: std::time::Duration::from_millis(100),
            partition_max_bytes: 1 << 20,
            throttle: Default::default(),
            connector: Default::default(),
        };
        ReplicaManager::new(dir, config, 10_000).0
    }

    fn changes(n: i32, leader_epoch: i32) -> Vec<PartitionChange> {
        (0..n)
            .map(|partition| PartitionChange {
                tp: TopicPartition {
                    topic: "t".into(),
                    partition,
                },
                topic_id: Uuid([7; 16]),
                registration: rill_metadata::PartitionRegistration {
                    replicas: vec![1],
                    isr: vec![1],
                    removing_replicas: vec![],
                    adding_replicas: vec![],
                    leader: 1,
                    leader_recovery_state: 0,
                    leader_epoch,
                    partition_epoch: leader_epoch,
                    directories: vec![],
                },
                config: LogConfig::default(),
            })
            .collect()
    }

    fn record() -> Bytes {
        let mut builder = RecordBatchBuilder::new(CompressionType::None, 0);
        builder.append(0, Some(b"k"), Some(b"v"), &[]).unwrap();
        builder.build().unwrap()
    }

    fn marker(dir: &Path) -> bool {
        dir.join(clean_shutdown::CLEAN_SHUTDOWN_FILE).exists()
    }

    #[test]
    fn a_clean_shutdown_is_recorded_once_for_the_directory_and_removed_at_the_next_start() {
        let dir = tempfile::tempdir().unwrap();
        let rm = manager(dir.path());
        let cs = changes(40, 1);
        rm.open_logs(&cs);
        assert!(rm.become_leaders(&cs).iter().all(Result::is_ok));
        let tp = &cs[3].tp;
        rm.append(tp, &record()).unwrap();
        rm.shutdown();
        assert!(marker(dir.path()));
        for c in &cs {
            let pdir = dir
                .path()
                .join(partition_dir_name(&c.tp.topic, c.tp.partition));
            assert!(!marker(&pdir), "no marker per partition");
        }

        let rm = manager(dir.path());
        assert_eq!(rm.previous_shutdown(), PreviousShutdown::Clean);
        assert!(marker(dir.path()), "kept until the logs are open");
        rm.open_logs(&cs);
        assert!(!marker(dir.path()), "removed before any log can change");
        assert_eq!(rm.offsets(tp).unwrap().log_end_offset, 1);
        // A log still in use cannot be closed: no clean shutdown is recorded.
        let in_use = rm.get(tp).unwrap();
        rm.shutdown();
        assert!(!marker(dir.path()));
        drop(in_use);
        assert_eq!(
            manager(dir.path()).previous_shutdown(),
            PreviousShutdown::Unclean
        );
    }

    /// A user that held the partition across its deletion (a follower's fetch in flight)
    /// finds it deleted: it touches no file, so neither the log directory fails nor a new
    /// log made under the same name is written to. Seen as a whole broker stopping in
    /// sarama's suite, which deletes and recreates its test topics.
    #[test]
    fn a_partition_held_across_its_deletion_touches_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let rm = manager(dir.path());
        let cs = changes(1, 1);
        rm.open_logs(&cs);
        assert!(rm.become_leaders(&cs).iter().all(Result::is_ok));
        let tp = &cs[0].tp;
        rm.append(tp, &record()).unwrap();
        let held = rm.get(tp).unwrap();
        rm.delete_partition(tp).unwrap();
        let pdir = dir.path().join(partition_dir_name(&tp.topic, tp.partition));
        assert!(!pdir.exists());
        let late = held.with_log(|log| log.checkpoint_high_watermark());
        assert_eq!(late.err(), Some(ErrorCode::UNKNOWN_TOPIC_OR_PARTITION));
        assert!(!pdir.exists(), "nothing written where the log was");
        // The same name made again is a log of its own, untouched by the old holder.
        rm.open_logs(&cs);
        assert!(rm.become_leaders(&cs).iter().all(Result::is_ok));
        assert_eq!(rm.offsets(tp).unwrap().log_end_offset, 0);
        assert!(held.with_log(|_| ()).is_err());
        drop(held);
    }

    fn txn_record(producer_id: i64, sequence: i32) -> Bytes {
        let mut builder = RecordBatchBuilder::new(CompressionType::None, 0)
            .producer(producer_id, 0, sequence)
            .transactional(true);
        builder.append(0, Some(b"k"), Some(b"v"), &[]).unwrap();
        builder.build().unwrap()
    }

    #[test]
    fn markers_move_the_last_stable_offset_and_fill_read_committed_reads() {
        let dir = tempfile::tempdir().unwrap();
        let rm = manager(dir.path());
        let cs = changes(1, 1);
        rm.open_logs(&cs);
        assert!(rm.become_leaders(&cs).iter().all(Result::is_ok));
        let tp = &cs[0].tp;
        rm.append(tp, &txn_record(5, 0)).unwrap();
        rm.append(tp, &txn_record(6, 0)).unwrap();
        rm.append(tp, &record()).unwrap();
        let offsets = rm.offsets(tp).unwrap();
        assert_eq!((offsets.high_watermark, offsets.last_stable_offset), (3, 0));
        let read = |committed| {
            rm.read_maybe_zero_copy(tp, -1, 0, 1 << 20, true, false, committed)
                .ok()
                .unwrap()
        };
        assert!(read(true).records.is_empty(), "nothing stable yet");
        assert_eq!(read(false).aborted_transactions, None);

        let abort = TxnMarker {
            producer_id: 5,
            producer_epoch: 0,
            coordinator_epoch: 2,
            commit: false,
        };
        // Not with fewer in-sync replicas than min.insync.replicas.
        assert_eq!(
            rm.append_txn_marker(tp, &abort, 2).err(),
            Some(ErrorCode::NOT_ENOUGH_REPLICAS)
        );
        let (appended, epoch) = rm.append_txn_marker(tp, &abort, 1).unwrap();
        assert_eq!((appended.info.first_offset, epoch), (3, 1));
        // The ISR is this broker alone: the marker is committed at once.
        assert_eq!(
            rm.commit_progress(tp, epoch, 4, 1),
            Some(isr::AcksAllProgress::Done)
        );
        assert_eq!(rm.offsets(tp).unwrap().last_stable_offset, 1);
        let fenced = TxnMarker {
            coordinator_epoch: 1,
            ..abort
        };
        assert_eq!(
            rm.append_txn_marker(tp, &fenced, 1).err(),
            Some(ErrorCode::TRANSACTION_COORDINATOR_FENCED)
        );
        let commit = TxnMarker {
            producer_id: 6,
            commit: true,
            ..abort
        };
        rm.append_txn_marker(tp, &commit, 1).unwrap();
        let offsets = rm.offsets(tp).unwrap();
        assert_eq!((offsets.high_watermark, offsets.last_stable_offset), (5, 5));
        let committed = read(true);
        assert_eq!(committed.offsets.last_stable_offset, 5);
        let aborted = committed.aborted_transactions.unwrap();
        assert_eq!(aborted.len(), 1);
        assert_eq!((aborted[0].producer_id, aborted[0].first_offset), (5, 0));
        let producers = rm.active_producers(tp).unwrap();
        assert_eq!(producers.len(), 2);
        assert!(producers
            .iter()
            .all(|p| p.current_txn_first_offset.is_none()));
    }

    fn flushing_leader(dir: &Path) -> (ReplicaManager, TopicPartition) {
        let rm = manager(dir);
        let mut cs = changes(1, 1);
        cs[0].config = LogConfig {
            flush_messages: Some(1),
            ..LogConfig::default()
        };
        rm.open_logs(&cs);
        assert!(rm.become_leaders(&cs).iter().all(Result::is_ok));
        (rm, cs[0].tp.clone())
    }

    #[test]
    fn a_flushed_append_counts_towards_the_high_watermark_once_synced() {
        let dir = tempfile::tempdir().unwrap();
        let (rm, tp) = flushing_leader(dir.path());
        let mut a = rm
            .append_deferred(&tp, &record(), AppendOrigin::Client)
            .unwrap();
        let mut b = rm
            .append_deferred(&tp, &record(), AppendOrigin::Client)
            .unwrap();
        assert_eq!(rm.offsets(&tp).unwrap().log_end_offset, 2);
        assert_eq!(
            rm.offsets(&tp).unwrap().high_watermark,
            0,
            "nothing synced yet"
        );
        let (fa, fb) = (a.take_flush().unwrap(), b.take_flush().unwrap());
        rm.complete_flush(&tp, a.partition(), fa.sync()).unwrap();
        // The first sync started after both writes: it covered both.
        assert_eq!(rm.offsets(&tp).unwrap().high_watermark, 2);
        rm.complete_flush(&tp, b.partition(), fb.sync()).unwrap();
        let fsyncs = a.partition().with_log(|l| l.flusher().fsync_count());
        assert_eq!(fsyncs, Ok(1));
        // The blocking form syncs before it returns.
        rm.append(&tp, &record()).unwrap();
        assert_eq!(rm.offsets(&tp).unwrap().high_watermark, 3);
        let recovery_point = a.partition().with_log(|l| l.recovery_point());
        assert_eq!(recovery_point, Ok(3));
    }

    #[test]
    fn a_failed_flush_fails_the_append_and_takes_the_directory_offline() {
        let dir = tempfile::tempdir().unwrap();
        let (rm, tp) = flushing_leader(dir.path());
        let mut a = rm
            .append_deferred(&tp, &record(), AppendOrigin::Client)
            .unwrap();
        let flush = a.take_flush().unwrap();
        let injected = StorageError::Io {
            path: dir.path().to_owned(),
            source: std::io::Error::other("injected"),
        };
        assert_eq!(
            rm.complete_flush(&tp, a.partition(), Err(injected)),
            Err(ErrorCode::KAFKA_STORAGE_ERROR)
        );
        // The partition is offline now; its log, read past the offline check, never
        // counted the unsynced append.
        assert_eq!(
            rm.offsets(&tp).map(|_| ()),
            Err(ErrorCode::KAFKA_STORAGE_ERROR)
        );
        let log = a.partition().log.lock().unwrap();
        assert_eq!(log.high_watermark(), 0);
        assert!(log.offline_cause().is_some());
        drop(log);
        assert!(rm.log_dir_failure().is_offline(0));
        assert!(
            rm.log_dir_failure().failure().is_some(),
            "its only directory"
        );
        // Never retried: the promise fails without an fsync.
        assert!(flush.sync().is_err());
        assert_eq!(
            rm.append(&tp, &record()).map(|_| ()),
            Err(ErrorCode::KAFKA_STORAGE_ERROR)
        );
        let offline = a.partition().with_log(|l| l.offline_cause().is_some());
        assert_eq!(offline, Err(ErrorCode::KAFKA_STORAGE_ERROR));
    }

    #[test]
    fn after_an_unclean_start_a_log_not_opened_keeps_the_next_start_unclean() {
        let dir = tempfile::tempdir().unwrap();
        let rm = manager(dir.path());
        let cs = changes(2, 1);
        assert!(rm.become_leaders(&cs).iter().all(Result::is_ok));
        drop(rm); // kill -9: nothing closed
        let rm = manager(dir.path());
        assert_eq!(rm.previous_shutdown(), PreviousShutdown::Unclean);
        // Only one of the two logs is opened (and so recovered) in this run.
        assert!(rm.become_leaders(&cs[..1]).iter().all(Result::is_ok));
        rm.shutdown();
        assert!(!marker(dir.path()));
        // Once both were opened, the stop is clean again.
        let rm = manager(dir.path());
        assert!(rm.become_leaders(&cs).iter().all(Result::is_ok));
        rm.shutdown();
        assert!(marker(dir.path()));
    }

    fn jbod_manager(root: &Path, dirs: usize) -> ReplicaManager {
        let config = FetcherConfig {
            local_id: 1,
            max_wait: std::time::Duration::from_millis(100),
            partition_max_bytes: 1 << 20,
            throttle: Default::default(),
            connector: Default::default(),
        };
        let dirs = (0..dirs)
            .map(|i| LogDirConfig {
                path: root.join(format!("d{i}")),
                id: Uuid::from_u64_pair(100, i as u64 + 1),
            })
            .collect::<Vec<_>>();
        for d in &dirs {
            std::fs::create_dir_all(&d.path).unwrap();
        }
        ReplicaManager::with_log_dirs(dirs, Some(0), config, 10_000, wall_clock()).0
    }

    fn partition_dirs(rm: &ReplicaManager, cs: &[PartitionChange]) -> Vec<usize> {
        cs.iter()
            .map(|c| rm.get(&c.tp).unwrap().log_dir())
            .collect()
    }

    #[test]
    fn new_logs_go_to_the_directory_with_the_fewest_and_stay_where_they_are() {
        let root = tempfile::tempdir().unwrap();
        let rm = jbod_manager(root.path(), 3);
        let cs = changes(7, 1);
        rm.open_logs(&cs[..1]);
        for c in &cs[1..] {
            // One at a time, as topics are created.
            rm.become_leader(&c.tp, c.topic_id, &c.registration, &c.config)
                .unwrap();
        }
        let dirs = partition_dirs(&rm, &cs);
        let mut counts = [0; 3];
        for d in &dirs {
            counts[*d] += 1;
        }
        assert_eq!(counts, [3, 2, 2], "{dirs:?}");
        // Every placement differs from the metadata's (none), so each is reported.
        let pending = rm.pending_assignments();
        assert_eq!(pending.len(), 7);
        for (tp, _, id) in &pending {
            let dir = rm.get(tp).unwrap().log_dir();
            assert_eq!(*id, Uuid::from_u64_pair(100, dir as u64 + 1));
        }
        for c in &cs {
            rm.append(&c.tp, &record()).unwrap();
        }
        rm.shutdown();
        for (c, d) in cs.iter().zip(&dirs) {
            let path = root
                .path()
                .join(format!("d{d}"))
                .join(partition_dir_name(&c.tp.topic, c.tp.partition));
            assert!(path.is_dir(), "{}", path.display());
        }
        for d in 0..3 {
            assert!(marker(&root.path().join(format!("d{d}"))), "marker in d{d}");
        }

        // Reopened where they are, whatever the metadata says now; the one whose
        // metadata names another directory is reported again.
        let rm = jbod_manager(root.path(), 3);
        assert_eq!(rm.previous_shutdown(), PreviousShutdown::Clean);
        let mut cs = cs;
        for (c, d) in cs.iter_mut().zip(&dirs) {
            c.registration.directories = vec![Uuid::from_u64_pair(100, *d as u64 + 1)];
        }
        cs[0].registration.directories = vec![Uuid::from_u64_pair(100, 9)];
        rm.open_logs(&cs);
        assert!(rm.become_leaders(&cs).iter().all(Result::is_ok));
        assert_eq!(partition_dirs(&rm, &cs), dirs);
        let pending = rm.pending_assignments();
        assert_eq!(pending.len(), 1, "{pending:?}");
        assert_eq!(pending[0].0, cs[0].tp);
        for c in &cs {
            assert_eq!(rm.offsets(&c.tp).unwrap().log_end_offset, 1);
        }
        // A new log the metadata assigned to a directory goes there.
        let mut new = changes(8, 1).pop().unwrap();
        new.registration.directories = vec![Uuid::from_u64_pair(100, 2)];
        rm.become_leader(&new.tp, new.topic_id, &new.registration, &new.config)
            .unwrap();
        assert_eq!(rm.get(&new.tp).unwrap().log_dir(), 1);
        rm.shutdown();
    }

    #[test]
    fn a_failed_directory_takes_only_its_partitions_offline() {
        let root = tempfile::tempdir().unwrap();
        let rm = jbod_manager(root.path(), 3);
        let cs = changes(6, 1);
        rm.open_logs(&cs);
        assert!(rm.become_leaders(&cs).iter().all(Result::is_ok));
        let dirs = partition_dirs(&rm, &cs);
        let (failed, kept): (Vec<_>, Vec<_>) = cs.iter().zip(&dirs).partition(|(_, d)| **d == 2);
        assert_eq!((failed.len(), kept.len()), (2, 4));
        let victim = rm.get(&failed[0].0.tp).unwrap();
        rm.log_dir_failed(
            &victim,
            format_args!("append to {}", failed[0].0.tp),
            &"EIO",
        );
        assert_eq!(rm.offline_log_dir_ids(), vec![Uuid::from_u64_pair(100, 3)]);
        assert_eq!(rm.online_log_dir_ids().len(), 2);
        assert!(
            rm.log_dir_failure().failure().is_none(),
            "two directories are left"
        );
        rm.handle_log_dir_failure();
        for (c, _) in &failed {
            assert_eq!(
                rm.append(&c.tp, &record()).map(|_| ()),
                Err(ErrorCode::KAFKA_STORAGE_ERROR)
            );
            assert!(rm.read(&c.tp, 0, 1 << 20, true).is_err());
            // A metadata update about it is refused: nothing is opened or fetched.
            assert!(matches!(
                rm.become_leader(&c.tp, c.topic_id, &c.registration, &c.config),
                Err(BrokerError::LogDirOffline(_))
            ));
        }
        for (c, _) in &kept {
            rm.append(&c.tp, &record()).unwrap();
            assert_eq!(rm.offsets(&c.tp).unwrap().high_watermark, 1);
        }
        // New logs avoid the failed directory; a replica the metadata placed there is
        // not made anew elsewhere while it is offline (it may hold the data).
        let mut more = changes(9, 1).split_off(6);
        more[2].registration.directories = vec![Uuid::from_u64_pair(100, 3)];
        for c in &more[..2] {
            rm.become_leader(&c.tp, c.topic_id, &c.registration, &c.config)
                .unwrap();
            assert_ne!(rm.get(&c.tp).unwrap().log_dir(), 2);
        }
        assert!(rm
            .become_leader(
                &more[2].tp,
                more[2].topic_id,
                &more[2].registration,
                &more[2].config
            )
            .is_err());
        rm.shutdown();
        assert!(marker(&root.path().join("d0")) && marker(&root.path().join("d1")));
        assert!(
            !marker(&root.path().join("d2")),
            "the failed directory is recovered"
        );

        // Kill the other two as well: the last failure is fatal.
        let rm = jbod_manager(root.path(), 3);
        rm.dir_failed(1, format_args!("x"), &"EIO");
        rm.dir_failed(2, format_args!("x"), &"EIO");
        assert!(rm.log_dir_failure().failure().is_none());
        rm.dir_failed(0, format_args!("x"), &"EIO");
        assert!(rm.log_dir_failure().failure().is_some());
    }

    #[test]
    fn a_log_in_two_directories_refuses_the_start() {
        let root = tempfile::tempdir().unwrap();
        for d in ["d0", "d2"] {
            std::fs::create_dir_all(root.path().join(d).join("t-0")).unwrap();
        }
        let rm = jbod_manager(root.path(), 3);
        let e = rm.check_log_dirs().unwrap_err().to_string();
        assert!(
            e.contains("t-0") && e.contains("two log directories"),
            "{e}"
        );
    }

    /// Steps every move until none is left (the alter-log-dirs task's loop, inline).
    fn finish_moves(rm: &ReplicaManager) {
        for _ in 0..1000 {
            let moving = rm.moving_partitions();
            if moving.is_empty() {
                return;
            }
            for (tp, p) in moving {
                rm.alter_log_dir_step(&tp, &p);
            }
        }
        panic!("moves never finished");
    }

    fn read_values(rm: &ReplicaManager, tp: &TopicPartition) -> Vec<(i64, Vec<u8>)> {
        let mut out = Vec::new();
        let end = rm.offsets(tp).unwrap().high_watermark;
        let mut offset = 0;
        while offset < end {
            let r = rm.read(tp, offset, 1 << 20, true).unwrap();
            assert!(!r.records.is_empty());
            for batch in rill_protocol::records::RecordBatch::iter(r.records) {
                let batch = batch.unwrap();
                for rec in batch.records(1 << 20).unwrap() {
                    out.push((rec.offset, rec.value.unwrap().to_vec()));
                }
                offset = batch.next_offset();
            }
        }
        out
    }

    fn value_record(v: &str) -> Bytes {
        let mut builder = RecordBatchBuilder::new(CompressionType::None, 0);
        builder
            .append(0, Some(b"k"), Some(v.as_bytes()), &[])
            .unwrap();
        builder.build().unwrap()
    }

    #[test]
    fn a_replica_moves_to_another_log_directory_while_it_takes_writes() {
        let root = tempfile::tempdir().unwrap();
        let rm = jbod_manager(root.path(), 2);
        let cs = changes(1, 3);
        rm.open_logs(&cs);
        assert!(rm.become_leaders(&cs).iter().all(Result::is_ok));
        let tp = &cs[0].tp;
        let from = rm.get(tp).unwrap().log_dir();
        let to = 1 - from;
        for i in 0..3000 {
            rm.append(tp, &value_record(&format!("v{i}"))).unwrap();
        }
        let dest = root.path().join(format!("d{to}"));
        assert_eq!(
            rm.alter_replica_log_dir(tp, "/nowhere"),
            ErrorCode::LOG_DIR_NOT_FOUND
        );
        assert_eq!(
            rm.alter_replica_log_dir(&TopicPartition::new("other", 0), dest.to_str().unwrap()),
            ErrorCode::REPLICA_NOT_AVAILABLE
        );
        assert_eq!(
            rm.alter_replica_log_dir(tp, dest.to_str().unwrap()),
            ErrorCode::NONE
        );
        let p = rm.get(tp).unwrap();
        // Writes go on while the future catches up, step by step.
        let mut i = 3000;
        for _ in 0..5 {
            rm.alter_log_dir_step(tp, &p);
            for _ in 0..100 {
                rm.append(tp, &value_record(&format!("v{i}"))).unwrap();
                i += 1;
            }
            if let Some((dir, size, _lag)) = p.future_replica() {
                assert_eq!(dir, to);
                assert!(size > 0);
            }
        }
        finish_moves(&rm);
        assert_eq!(rm.get(tp).unwrap().log_dir(), to);
        assert!(p.future_replica().is_none());
        let name = partition_dir_name(&tp.topic, tp.partition);
        assert!(dest.join(&name).is_dir());
        let source = root.path().join(format!("d{from}"));
        let left: Vec<_> = std::fs::read_dir(&source)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("t-"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
        // Every record at its offset, the epochs kept, and it takes writes there.
        let values = read_values(&rm, tp);
        assert_eq!(values.len(), i);
        for (n, (offset, value)) in values.iter().enumerate() {
            assert_eq!(
                (*offset, value.as_slice()),
                (n as i64, format!("v{n}").as_bytes())
            );
        }
        let epoch = p.with_log(|l| l.latest_epoch()).unwrap();
        assert_eq!(epoch, Some(3));
        rm.append(tp, &value_record("after")).unwrap();
        // Reported to the controller with the new directory's id.
        let pending = rm.pending_assignments();
        assert!(pending
            .iter()
            .any(|(t, _, id)| t == tp && *id == Uuid::from_u64_pair(100, to as u64 + 1)));
        rm.shutdown();
        let rm = jbod_manager(root.path(), 2);
        rm.open_logs(&cs);
        assert_eq!(rm.get(tp).unwrap().log_dir(), to);
        // Reopened where it moved to, with everything.
        assert_eq!(rm.offsets(tp).map(|o| o.log_end_offset), Ok(i as i64 + 1));
    }

    #[test]
    fn a_start_settles_a_move_that_a_crash_cut_anywhere() {
        let root = tempfile::tempdir().unwrap();
        let setup = |current: Option<usize>, future: Option<usize>, delete: Option<usize>| {
            let _ = std::fs::remove_dir_all(root.path());
            for d in 0..2 {
                std::fs::create_dir_all(root.path().join(format!("d{d}"))).unwrap();
            }
            let id = "0123456789abcdef0123456789abcdef";
            let make = |dir: usize, name: String, content: &str| {
                let path = root.path().join(format!("d{dir}")).join(name);
                std::fs::create_dir_all(&path).unwrap();
                std::fs::write(path.join("which"), content).unwrap();
            };
            if let Some(d) = current {
                make(d, "t-0".into(), "current");
            }
            if let Some(d) = future {
                make(d, format!("t-0.{id}-future"), "future");
            }
            if let Some(d) = delete {
                make(d, format!("t-0.{id}-delete"), "old");
            }
        };
        let which = || {
            let mut found = Vec::new();
            for d in 0..2 {
                for e in std::fs::read_dir(root.path().join(format!("d{d}")))
                    .unwrap()
                    .flatten()
                {
                    let name = e.file_name().to_string_lossy().into_owned();
                    if name.starts_with("t-0") {
                        let content = std::fs::read_to_string(e.path().join("which")).unwrap();
                        found.push((d, name, content));
                    }
                }
            }
            found
        };
        let settled = |expect_dir: usize, expect: &str| {
            let rm = jbod_manager(root.path(), 2);
            rm.check_log_dirs().unwrap();
            assert_eq!(
                which(),
                vec![(expect_dir, "t-0".to_string(), expect.to_string())]
            );
        };
        // Killed while copying: the future goes, the current log stays.
        setup(Some(0), Some(1), None);
        settled(0, "current");
        // Killed between the two renames: the complete future becomes the log.
        setup(None, Some(1), Some(0));
        settled(1, "future");
        // Killed after both: the old log goes.
        setup(Some(1), None, Some(0));
        settled(1, "current");
        // Only the old log left (its future gone): it is the log again.
        setup(None, None, Some(0));
        settled(0, "old");
    }
}
