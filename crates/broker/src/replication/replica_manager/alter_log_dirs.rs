//! AlterReplicaLogDirs: moving a replica to another log directory of this broker while it
//! keeps serving (Kafka's future replica, `ReplicaAlterLogDirsManager` and
//! `ReplicaAlterLogDirsThread`).
//!
//! # Protocol
//!
//! 1. [`ReplicaManager::alter_replica_log_dir`] creates an empty *future* log for the
//!    partition in the destination directory, named as Kafka names it,
//!    `<topic>-<partition>.<id>-future`, starting at the current log's start offset.
//! 2. The alter-log-dirs task ([`start`]) copies the current log's batches into it a
//!    chunk at a time, as a follower appends what it fetches (validated as replicated
//!    records, so offsets, leader epochs, producer state and aborted transactions are
//!    rebuilt as they were), taking the partition's log lock only to read a chunk; the
//!    partition keeps taking writes and serving reads meanwhile.
//! 3. Once the future is within one chunk of the log end, the task takes the log lock
//!    and keeps it: copies the rest, brings over the log start offset, the leader epochs
//!    (an epoch begun without records yet would otherwise be missing) and the high
//!    watermark, fsyncs and closes the future, then swaps it in: (a) renames the current
//!    log's directory to `<topic>-<partition>.<id>-delete`, (b) renames the future's to
//!    `<topic>-<partition>`, each rename made durable with its directory's fsync, then
//!    reopens it there and puts it in place of the current log under the same lock. The
//!    old directory is removed afterwards, and the new placement is reported to the
//!    controller (AssignReplicasToDirs).
//! 4. A truncation of the current log (a follower truncating to its new leader), or a log
//!    start moved past what the future holds, starts the future over; a deletion, a
//!    failed directory or a new destination drops it.
//!
//! # Why it survives kill -9 at any point
//!
//! Until (a) the current log is untouched and the future is only an extra directory: the
//! next start removes a `-future` directory found beside its current log (the move is
//! then asked for again, as `kafka-reassign-partitions.sh --verify` shows it not done).
//! Between (a) and (b) there is no current log, but a `-delete` and a `-future` of the
//! same id: the future was complete and durable before (a), so the next start finishes
//! the swap by renaming it. After (b) a `-delete` beside a current log is removed. A
//! `-delete` with neither is renamed back (it is still the whole log). So the next start
//! always finds exactly one current log holding every record the partition had.

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use rill_protocol::ErrorCode;
use rill_storage::{
    parse_partition_dir_name, partition_dir_name, AppendOrigin, PreviousShutdown, TopicPartition,
    UnifiedLog,
};
use tokio::sync::watch;

use super::{Partition, ReplicaManager};

/// Bytes copied per step (Kafka's `replica.fetch.max.bytes` plays this part). Once the
/// future is no more than one step's records behind, the last step holds the log's lock
/// until it has caught up, so a move ends under any produce rate the copy outpaces.
const CHUNK_BYTES: usize = 1 << 20;
/// Pause of the task when no future replica made progress.
const IDLE_WAIT: Duration = Duration::from_millis(50);

/// A replica being built in another log directory of this broker.
pub struct FutureReplica {
    /// The destination's index in `log.dirs`.
    pub(crate) dir: usize,
    /// `<destination>/<topic>-<partition>.<id>-future`.
    path: PathBuf,
    /// The id shared by its `-future` and, during the swap, the old log's `-delete`.
    id: String,
    log: UnifiedLog,
    /// The partition's truncation count when it began (see `Partition::truncations`).
    truncations: u64,
    /// How many offsets the last step copied: once the lag is no more, the next step
    /// swaps.
    last_step_offsets: i64,
}

impl FutureReplica {
    /// Its size and log end offset, for DescribeLogDirs.
    pub(crate) fn size_and_end(&self) -> (u64, i64) {
        (self.log.size_bytes(), self.log.log_end_offset())
    }
}

/// What one step of the task did for a partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Records copied (this many bytes), or a start over: more to do.
    Progress(usize),
    /// The future replica is the partition's log now (or was dropped), or it could not
    /// go on this time.
    Done,
}

/// The directory names of a move: `<topic>-<partition>.<id>-future` and `…-delete`.
fn moving_dir_name(tp: &TopicPartition, id: &str, suffix: &str) -> String {
    format!(
        "{}.{id}-{suffix}",
        partition_dir_name(&tp.topic, tp.partition)
    )
}

/// Parses `<topic>-<partition>.<id>-future` or `…-delete`: the partition, the id and
/// whether it is a future.
fn parse_moving_dir_name(name: &str) -> Option<(TopicPartition, String, bool)> {
    let (rest, future) = if let Some(rest) = name.strip_suffix("-future") {
        (rest, true)
    } else {
        (name.strip_suffix("-delete")?, false)
    };
    let (tp, id) = rest.rsplit_once('.')?;
    if id.is_empty() || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    Some((parse_partition_dir_name(tp).ok()?, id.to_string(), future))
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

fn rename_durably(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::rename(from, to)?;
    if let Some(parent) = to.parent() {
        sync_dir(parent)?;
    }
    Ok(())
}

/// Settles what an interrupted move left in the log directories (see the module's
/// "why it survives kill -9"): called before the logs are located, so that every
/// partition has exactly one current log afterwards.
pub(super) fn recover_moves(dirs: &[PathBuf]) {
    let mut current: std::collections::HashSet<TopicPartition> = Default::default();
    let mut moving: Vec<(usize, PathBuf, TopicPartition, String, bool)> = Vec::new();
    for (index, dir) in dirs.iter().enumerate() {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Ok(tp) = parse_partition_dir_name(&name) {
                current.insert(tp);
            } else if let Some((tp, id, future)) = parse_moving_dir_name(&name) {
                moving.push((index, entry.path(), tp, id, future));
            }
        }
    }
    let remove = |path: &Path, why: &str| {
        tracing::info!(dir = %path.display(), "{why}");
        if let Err(e) = std::fs::remove_dir_all(path) {
            tracing::error!(dir = %path.display(), error = %e, "removal failed");
        }
    };
    // Swaps cut between their two renames first: they make a current log.
    for (index, path, tp, id, future) in &moving {
        if *future || current.contains(tp) {
            continue;
        }
        let finished = moving
            .iter()
            .find(|(_, _, t, i, f)| *f && t == tp && i == id);
        let restored = match finished {
            Some((dest, future_path, ..)) => {
                let to = dirs[*dest].join(partition_dir_name(&tp.topic, tp.partition));
                tracing::info!(%tp, to = %to.display(), "finishing a log directory move cut short");
                rename_durably(future_path, &to)
            }
            None => {
                let to = dirs[*index].join(partition_dir_name(&tp.topic, tp.partition));
                tracing::warn!(%tp, to = %to.display(), "restoring a log whose move lost its future replica");
                rename_durably(path, &to)
            }
        };
        match restored {
            Ok(()) => {
                current.insert(tp.clone());
            }
            Err(e) => tracing::error!(%tp, error = %e, "settling a log directory move failed"),
        }
    }
    for (_, path, tp, _, future) in &moving {
        if !path.exists() {
            continue;
        }
        if !current.contains(tp) {
            // Nothing else of the partition is left: keep it for the operator.
            tracing::error!(dir = %path.display(), "a log directory move left this without a current log");
            continue;
        }
        if *future {
            remove(path, "dropping a log directory move the broker stopped in");
        } else {
            remove(
                path,
                "removing the old log of a finished log directory move",
            );
        }
    }
}

impl ReplicaManager {
    /// AlterReplicaLogDirs for one partition: starts moving its replica to the log
    /// directory `destination` (an absolute path of `log.dirs`), Kafka's errors otherwise.
    pub fn alter_replica_log_dir(&self, tp: &TopicPartition, destination: &str) -> ErrorCode {
        let wanted = std::fs::canonicalize(destination).ok();
        let dest = self.log_dirs.iter().position(|d| {
            d.path == Path::new(destination)
                || wanted.is_some() && std::fs::canonicalize(&d.path).ok() == wanted
        });
        let Some(dest) = dest else {
            return ErrorCode::LOG_DIR_NOT_FOUND;
        };
        // Kafka's limit: the future directory's name must fit a file name.
        if moving_dir_name(tp, &"0".repeat(32), "future").len() > 255 {
            return ErrorCode::INVALID_TOPIC_EXCEPTION;
        }
        if self.log_dir_failure.is_offline(dest) {
            return ErrorCode::KAFKA_STORAGE_ERROR;
        }
        let Some(partition) = self.get(tp) else {
            // Created there when the replica comes (Kafka's `maybeUpdatePreferredLogDir`).
            self.preferred_dirs
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(tp.clone(), dest);
            return ErrorCode::REPLICA_NOT_AVAILABLE;
        };
        if partition.is_offline() {
            return ErrorCode::KAFKA_STORAGE_ERROR;
        }
        let same_future = partition
            .future_lock()
            .as_ref()
            .is_some_and(|f| f.dir == dest);
        if same_future {
            return ErrorCode::NONE;
        }
        self.drop_future(&partition);
        if partition.log_dir() == dest {
            return ErrorCode::NONE;
        }
        // No future replica while a directory is offline: the partition's replica could
        // be found in two directories when it comes back (Kafka refuses too).
        if !self.log_dir_failure.offline_dirs().is_empty() {
            return ErrorCode::KAFKA_STORAGE_ERROR;
        }
        match self.create_future(tp, &partition, dest) {
            Ok(()) => {
                self.alter_log_dirs_added.notify_one();
                ErrorCode::NONE
            }
            Err(code) => code,
        }
    }

    fn create_future(
        &self,
        tp: &TopicPartition,
        partition: &Partition,
        dest: usize,
    ) -> Result<(), ErrorCode> {
        let Some(log_dir) = self.log_dirs.get(dest) else {
            return Err(ErrorCode::LOG_DIR_NOT_FOUND);
        };
        if self.remove_clean_shutdown_marker(dest).is_err() {
            return Err(ErrorCode::KAFKA_STORAGE_ERROR);
        }
        let (config, log_start) =
            partition.with_log(|log| (log.config().clone(), log.log_start_offset()))?;
        let id = uuid::Uuid::new_v4().simple().to_string();
        let path = log_dir.path.join(moving_dir_name(tp, &id, "future"));
        let opened = UnifiedLog::open(&path, config, self.now(), PreviousShutdown::Unclean)
            .and_then(|mut log| {
                log.truncate_fully_and_start_at(log_start, self.now())?;
                Ok(log)
            });
        let log = match opened {
            Ok(log) => log,
            Err(e) => {
                if let Some(io) = e.io_error() {
                    self.dir_failed(dest, format_args!("creating the future log of {tp}"), io);
                }
                return Err(ErrorCode::KAFKA_STORAGE_ERROR);
            }
        };
        tracing::info!(%tp, to = %log_dir.path.display(), "moving the replica to another log directory");
        *partition.future_lock() = Some(FutureReplica {
            dir: dest,
            path,
            id,
            log,
            truncations: partition.truncations.load(Ordering::Acquire),
            last_step_offsets: 0,
        });
        Ok(())
    }

    /// Drops the partition's future replica, if any, and its directory.
    pub(super) fn drop_future(&self, partition: &Partition) {
        let dropped = partition.future_lock().take();
        if let Some(f) = dropped {
            let path = f.path.clone();
            drop(f);
            if let Err(e) = std::fs::remove_dir_all(&path) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!(dir = %path.display(), error = %e, "removing a future log failed");
                }
            }
        }
    }

    /// The partitions being moved.
    pub(crate) fn moving_partitions(&self) -> Vec<(TopicPartition, Arc<Partition>)> {
        self.partitions()
            .into_iter()
            .filter(|(_, p)| p.future_lock().is_some())
            .collect()
    }

    /// One step of a move (protocol steps 2 to 4). Blocking file I/O.
    pub(crate) fn alter_log_dir_step(&self, tp: &TopicPartition, partition: &Partition) -> Step {
        // Step 2: a chunk read under the log's lock, appended under the future's only.
        let read = partition.with_log(|log| {
            let future = partition.future_lock();
            let f = future.as_ref()?;
            let from = f.log.log_end_offset();
            let stale = f.truncations != partition.truncations.load(Ordering::Acquire)
                || from < log.log_start_offset()
                || from > log.log_end_offset();
            let lag = log.log_end_offset() - from;
            Some((
                stale,
                lag <= f.last_step_offsets,
                from,
                log.log_start_offset(),
            ))
        });
        let Ok(Some((stale, near_end, from, log_start))) = read else {
            return Step::Done;
        };
        if stale {
            return self.restart_future(tp, partition, log_start);
        }
        if near_end {
            return self.swap_in_future(tp, partition);
        }
        let chunk =
            partition.with_log(|log| log.read(from, CHUNK_BYTES, log.log_end_offset(), true));
        let records = match chunk {
            Ok(Ok(data)) => data.records,
            Ok(Err(e)) => {
                tracing::info!(%tp, error = %e, "reading for the future replica; starting over");
                return self.restart_future(tp, partition, log_start);
            }
            Err(_) => return Step::Done,
        };
        if records.is_empty() {
            return Step::Progress(0);
        }
        let mut future = partition.future_lock();
        let Some(f) = future.as_mut() else {
            return Step::Done;
        };
        if f.log.log_end_offset() != from {
            return Step::Progress(0);
        }
        match append(&mut f.log, &records, self.now()) {
            Ok(()) => {
                f.last_step_offsets = f.log.log_end_offset() - from;
                Step::Progress(records.len())
            }
            Err(e) => {
                let dir = f.dir;
                *future = None;
                drop(future);
                self.dir_failed(dir, format_args!("copying {tp} to its future log"), &e);
                Step::Done
            }
        }
    }

    /// Step 4: the future replica starts over from the current log start.
    fn restart_future(&self, tp: &TopicPartition, partition: &Partition, log_start: i64) -> Step {
        let mut future = partition.future_lock();
        let Some(f) = future.as_mut() else {
            return Step::Done;
        };
        tracing::info!(%tp, from = log_start, "the current log changed under its future replica; starting over");
        f.truncations = partition.truncations.load(Ordering::Acquire);
        if let Err(e) = f.log.truncate_fully_and_start_at(log_start, self.now()) {
            let dir = f.dir;
            *future = None;
            drop(future);
            self.dir_failed(dir, format_args!("restarting the future log of {tp}"), &e);
            return Step::Done;
        }
        Step::Progress(0)
    }

    /// Step 3: catches up the rest under the log's lock and swaps the future in.
    fn swap_in_future(&self, tp: &TopicPartition, partition: &Partition) -> Step {
        let now = self.now();
        let swapped = partition.with_log(|log| {
            let mut future = partition.future_lock();
            let f = future.as_mut()?;
            if f.truncations != partition.truncations.load(Ordering::Acquire) {
                return None;
            }
            // The rest, a chunk at a time; no append can come in meanwhile.
            while f.log.log_end_offset() < log.log_end_offset() {
                let from = f.log.log_end_offset();
                let records = match log.read(from, CHUNK_BYTES, log.log_end_offset(), true) {
                    Ok(data) if !data.records.is_empty() => data.records,
                    _ => return None,
                };
                if let Err(e) = append(&mut f.log, &records, now) {
                    return Some(Err((f.dir, e.to_string())));
                }
            }
            if f.log.log_end_offset() != log.log_end_offset() {
                return None;
            }
            let f = future.take()?;
            Some(
                self.swap(tp, log, f)
                    .map_err(|(dir, e)| (dir, e.to_string())),
            )
        });
        match swapped {
            Ok(Some(Ok((old_dir_path, dest)))) => {
                partition.dir.store(dest, Ordering::Release);
                self.located
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(tp.clone(), dest);
                self.assign(tp, partition.topic_id, dest);
                if let Err(e) = std::fs::remove_dir_all(&old_dir_path) {
                    tracing::warn!(dir = %old_dir_path.display(), error = %e, "removing the moved log's old directory failed");
                }
                tracing::info!(%tp, dir = %self.log_dir_path(dest).display(), "replica moved to another log directory");
                Step::Done
            }
            Ok(Some(Err((dir, e)))) => {
                *partition.future_lock() = None;
                self.dir_failed(dir, format_args!("swapping in the future log of {tp}"), &e);
                Step::Done
            }
            Ok(None) => Step::Progress(0),
            Err(_) => Step::Done,
        }
    }

    /// The swap itself (step 3), with the partition's log locked as `log`: returns the
    /// old log's directory (now `-delete`) and the new one's index.
    fn swap(
        &self,
        tp: &TopicPartition,
        log: &mut UnifiedLog,
        mut f: FutureReplica,
    ) -> Result<(PathBuf, usize), (usize, rill_storage::StorageError)> {
        let dest = f.dir;
        let fail = |e: rill_storage::StorageError| (dest, e);
        if log.log_start_offset() > f.log.log_start_offset() {
            f.log
                .maybe_increment_log_start_offset(log.log_start_offset())
                .map_err(fail)?;
        }
        for entry in log.leader_epoch_cache().entries().to_vec() {
            f.log
                .assign_epoch_start_offset(entry.epoch, entry.start_offset)
                .map_err(fail)?;
        }
        f.log.update_high_watermark(log.high_watermark());
        f.log.flush().map_err(fail)?;
        let config = f.log.config().clone();
        let future_path = f.path.clone();
        f.log.close().map_err(fail)?;
        let name = partition_dir_name(&tp.topic, tp.partition);
        let current_path = log.dir().to_path_buf();
        let source_root = current_path
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default();
        let old = source_root.join(moving_dir_name(tp, &f.id, "delete"));
        let io = |path: &Path, e: std::io::Error| rill_storage::StorageError::Io {
            path: path.to_path_buf(),
            source: e,
        };
        let source = self
            .log_dirs
            .iter()
            .position(|d| d.path == source_root)
            .unwrap_or(dest);
        // (a) then (b); the reopen trusts what the close just wrote (the destination's
        // clean-shutdown marker is gone, so a crash from here on recovers it).
        rename_durably(&current_path, &old).map_err(|e| (source, io(&current_path, e)))?;
        let new_path = self.log_dir_path(dest).join(&name);
        if let Err(e) = rename_durably(&future_path, &new_path) {
            // The current log goes back where it was; the destination has failed.
            if let Err(back) = rename_durably(&old, &current_path) {
                tracing::error!(%tp, error = %back, "renaming the log back failed");
                return Err((source, io(&old, back)));
            }
            return Err(fail(io(&future_path, e)));
        }
        let reopened = UnifiedLog::open(&new_path, config, self.now(), PreviousShutdown::Clean)
            .map_err(fail)?;
        *log = reopened;
        Ok((old, dest))
    }
}

/// Appends fetched batches to a future log, as a follower appends, and syncs what the
/// flush policy asks for.
fn append(
    log: &mut UnifiedLog,
    records: &bytes::Bytes,
    now: i64,
) -> Result<(), rill_storage::StorageError> {
    let path = log.dir().to_path_buf();
    let to_storage = |e: rill_storage::AppendError| match e {
        rill_storage::AppendError::Io(io) => io,
        other => rill_storage::StorageError::Corrupt {
            path: path.clone(),
            reason: other.to_string(),
        },
    };
    let config = log.config_for_append().map_err(to_storage)?;
    let validated = UnifiedLog::validate_records(&config, records, AppendOrigin::Replication, now)
        .map_err(to_storage)?;
    let (_, pending) = log
        .append_validated_as_follower(validated, now)
        .map_err(to_storage)?;
    if let Some(flush) = pending {
        match flush.sync() {
            Ok(done) => log.complete_flush(done),
            Err(e) => return Err(log.flush_failed(e)),
        }
    }
    Ok(())
}

/// `replica.alter.log.dirs.io.max.bytes.per.second` as it is now (read at every step, so
/// a change applies at once); `None`: unbounded.
pub type IoLimit = Box<dyn Fn() -> Option<f64> + Send + Sync>;

/// Starts the alter-log-dirs task (Kafka's `ReplicaAlterLogDirsManager`): it steps every
/// move in turn on the blocking pool until none is left, then waits for the next. The
/// bytes it copies are held to `limit` over `windows` (`replication.quota.window.*`), as
/// Kafka's alter-log-dirs replication quota holds them.
pub fn start(
    replicas: Arc<ReplicaManager>,
    limit: IoLimit,
    windows: crate::rate::QuotaWindows,
    mut shutdown: watch::Receiver<bool>,
) {
    tokio::spawn(async move {
        let mut rate = crate::rate::Rate::default();
        let started = tokio::time::Instant::now();
        loop {
            let moving = replicas.moving_partitions();
            if moving.is_empty() {
                tokio::select! {
                    _ = replicas.alter_log_dirs_added.notified() => {}
                    _ = tokio::time::sleep(IDLE_WAIT * 10) => {}
                    _ = shutdown.changed() => return,
                }
                continue;
            }
            let rm = replicas.clone();
            let stepped = tokio::task::spawn_blocking(move || {
                moving
                    .iter()
                    .map(|(tp, p)| rm.alter_log_dir_step(tp, p))
                    .collect::<Vec<_>>()
            })
            .await
            .unwrap_or_default();
            let copied: usize = stepped
                .iter()
                .map(|s| match s {
                    Step::Progress(bytes) => *bytes,
                    Step::Done => 0,
                })
                .sum();
            let pause = match limit() {
                Some(limit) if copied > 0 => {
                    let now_ms = started.elapsed().as_millis() as u64;
                    rate.record_and_throttle(copied as f64, limit, now_ms, windows)
                }
                _ => Duration::ZERO,
            };
            // Nothing copied (a move waiting to swap, or starting over): no busy loop.
            let pause = if copied == 0 {
                pause.max(IDLE_WAIT)
            } else {
                pause
            };
            if !pause.is_zero() {
                tokio::select! {
                    _ = tokio::time::sleep(pause) => {}
                    _ = shutdown.changed() => return,
                }
            }
            if *shutdown.borrow() {
                return;
            }
        }
    });
}

/// What DescribeLogDirs reports of a moving partition: the future's directory, size and
/// how far it is behind the current log.
pub(crate) fn future_of(partition: &Partition) -> Option<(usize, u64, i64)> {
    let current_end = partition.with_log(|log| log.log_end_offset()).ok()?;
    let future = partition.future_lock();
    let f = future.as_ref()?;
    let (size, end) = f.size_and_end();
    Some((f.dir, size, (current_end - end).max(0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moving_dir_names_round_trip() {
        let tp = TopicPartition::new("my-topic.x", 3);
        let id = "0123456789abcdef0123456789abcdef";
        let name = moving_dir_name(&tp, id, "future");
        assert_eq!(name, "my-topic.x-3.0123456789abcdef0123456789abcdef-future");
        assert_eq!(
            parse_moving_dir_name(&name),
            Some((tp.clone(), id.to_string(), true))
        );
        let name = moving_dir_name(&tp, id, "delete");
        assert_eq!(
            parse_moving_dir_name(&name),
            Some((tp, id.to_string(), false))
        );
        for bad in [
            "t-0",
            "t-0.-future",
            "t-0.xyz-future",
            "t-x.ab-delete",
            "t-0.ab-gone",
        ] {
            assert_eq!(parse_moving_dir_name(bad), None, "{bad}");
        }
    }
}
