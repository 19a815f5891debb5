//! The log directories of `log.dirs` (JBOD, KIP-858) as the replica manager keeps them
//! (Kafka's `LogManager` part of it): where each log is and where a new one goes, each
//! directory's clean-shutdown marker and failure, and the placements to report to the
//! controller (AssignReplicasToDirs). The protocol is in the parent module's docs.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use rill_protocol::primitives::Uuid;
use rill_storage::{
    clean_shutdown, parse_partition_dir_name, DataDirSync, PreviousShutdown, TopicPartition,
};

use super::{Partition, ReplicaManager};
use crate::error::BrokerError;
use crate::log_dir_failure::LogDirFailureChannel;
use std::sync::Arc;

/// One log directory of `log.dirs`, with its own clean-shutdown marker (Kafka keeps one
/// `.kafka_cleanshutdown` and one set of checkpoints per directory; Rill's other
/// checkpoints are per partition, so inside it).
pub(super) struct LogDir {
    pub(super) path: PathBuf,
    /// Its `directory.id` (KIP-858).
    pub(super) id: Uuid,
    /// How the previous run left this directory's logs, from its marker at creation:
    /// every log this run opens in it is opened so.
    pub(super) previous_shutdown: PreviousShutdown,
    /// Whether the marker is gone (removed by this run, or never there); held while it
    /// is removed, so that no log becomes reachable before.
    pub(super) marker_removed: Mutex<bool>,
    /// Opened at creation, before any log is written, so that the `syncfs` through it
    /// at shutdown reports any write-back error since (`None`: the directory could not
    /// be opened, and no clean shutdown is recorded).
    pub(super) sync: Option<DataDirSync>,
}

/// A log directory as the replica manager is given it: its path and `directory.id`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogDirConfig {
    pub path: PathBuf,
    pub id: Uuid,
}

/// The log directory of every log on disk, and how many logs each directory holds.
#[derive(Debug, Default)]
pub(super) struct LogLocations {
    pub(super) dirs: HashMap<TopicPartition, usize>,
    pub(super) counts: Vec<usize>,
}

impl LogLocations {
    pub(super) fn get(&self, tp: &TopicPartition) -> Option<&usize> {
        self.dirs.get(tp)
    }

    pub(super) fn count(&self, dir: usize) -> usize {
        self.counts.get(dir).copied().unwrap_or(0)
    }

    pub(super) fn insert(&mut self, tp: TopicPartition, dir: usize) {
        if let Some(old) = self.dirs.insert(tp, dir) {
            if let Some(c) = self.counts.get_mut(old) {
                *c = c.saturating_sub(1);
            }
        }
        if self.counts.len() <= dir {
            self.counts.resize(dir + 1, 0);
        }
        if let Some(c) = self.counts.get_mut(dir) {
            *c += 1;
        }
    }

    pub(super) fn remove(&mut self, tp: &TopicPartition) {
        if let Some(old) = self.dirs.remove(tp) {
            if let Some(c) = self.counts.get_mut(old) {
                *c = c.saturating_sub(1);
            }
        }
    }
}

/// Where a partition's log is, or is to be created.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Placement {
    pub(super) dir: usize,
    /// The log is there already (found at start, or created by this run).
    pub(super) exists: bool,
}

impl ReplicaManager {
    /// Refuses a start that found a partition's log in two directories, as Kafka does:
    /// which one is the replica is not for the broker to guess.
    pub fn check_log_dirs(&self) -> Result<(), BrokerError> {
        match self.duplicates.first() {
            None => Ok(()),
            Some(d) => Err(BrokerError::Config(d.clone())),
        }
    }

    /// The log directories, in `log.dirs` order: path and `directory.id`.
    pub fn log_dirs(&self) -> Vec<LogDirConfig> {
        self.log_dirs
            .iter()
            .map(|d| LogDirConfig {
                path: d.path.clone(),
                id: d.id,
            })
            .collect()
    }

    /// The first log directory (the only one, unless `log.dirs` names several).
    pub fn data_dir(&self) -> &Path {
        self.log_dirs
            .first()
            .map_or(Path::new(""), |d| d.path.as_path())
    }

    /// How the previous run left the logs: unclean if any directory was.
    pub fn previous_shutdown(&self) -> PreviousShutdown {
        if self
            .log_dirs
            .iter()
            .all(|d| d.previous_shutdown == PreviousShutdown::Clean)
        {
            PreviousShutdown::Clean
        } else {
            PreviousShutdown::Unclean
        }
    }

    /// The log directories' failure state; the server stops when it is fatal.
    pub fn log_dir_failure(&self) -> &Arc<LogDirFailureChannel> {
        &self.log_dir_failure
    }

    /// A write (or read) of `partition`'s log failed: its log directory goes offline.
    pub fn log_dir_failed(
        &self,
        partition: &Partition,
        context: std::fmt::Arguments<'_>,
        error: &dyn std::fmt::Display,
    ) {
        self.dir_failed(partition.log_dir(), context, error);
    }

    /// A write in log directory `dir` failed: it goes offline (see `log_dir_failure`).
    pub(super) fn dir_failed(
        &self,
        dir: usize,
        context: std::fmt::Arguments<'_>,
        error: &dyn std::fmt::Display,
    ) {
        self.log_dir_failure
            .maybe_add_offline_log_dir(dir, &context.to_string(), error);
    }

    /// The ids of the log directories that failed, for the broker's heartbeat.
    pub fn offline_log_dir_ids(&self) -> Vec<Uuid> {
        self.log_dir_failure
            .offline_dirs()
            .into_iter()
            .filter_map(|d| self.log_dirs.get(d).map(|d| d.id))
            .collect()
    }

    /// The ids of the online log directories, for the broker's registration.
    pub fn online_log_dir_ids(&self) -> Vec<Uuid> {
        self.log_dirs
            .iter()
            .enumerate()
            .filter(|(i, _)| !self.log_dir_failure.is_offline(*i))
            .map(|(_, d)| d.id)
            .collect()
    }

    /// Takes the partitions of the failed log directories out of service (Kafka's
    /// `handleLogDirFailure`): their fetchers stop, their leader state goes, and whoever
    /// waits on them wakes to find them offline. Their reads and writes already answer
    /// KAFKA_STORAGE_ERROR (see [`Partition::with_log`]); this only stops the work.
    pub fn handle_log_dir_failure(&self) {
        for (tp, p) in self.partitions() {
            if !p.is_offline() {
                continue;
            }
            self.fetchers.remove_partition(&tp);
            *p.leader_state() = None;
            self.appended.notify(&tp);
        }
        // A move into a failed directory stops (its future replica is dropped as it is).
        for (_, p) in self.partitions() {
            let failed_future = p
                .future_lock()
                .as_ref()
                .is_some_and(|f| self.log_dir_failure.is_offline(f.dir));
            if failed_future {
                *p.future_lock() = None;
            }
        }
    }

    /// Replicas placed in a directory other than the metadata's, not yet reported.
    pub(crate) fn pending_assignments(&self) -> Vec<(TopicPartition, Uuid, Uuid)> {
        self.pending_assignments
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(tp, (topic_id, dir))| (tp.clone(), *topic_id, *dir))
            .collect()
    }

    /// The controller recorded (or refused for good) `tp`'s placement in `dir`.
    pub(crate) fn assignment_done(&self, tp: &TopicPartition, dir: Uuid) {
        let mut pending = self
            .pending_assignments
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if pending.get(tp).is_some_and(|(_, d)| *d == dir) {
            pending.remove(tp);
        }
    }

    /// Waits until a placement is added to report.
    pub(crate) async fn assignments_added(&self) {
        self.assignments_added.notified().await;
    }

    /// Queues the report of `tp`'s placement in log directory `dir`.
    pub(super) fn assign(&self, tp: &TopicPartition, topic_id: Uuid, dir: usize) {
        let Some(id) = self.log_dirs.get(dir).map(|d| d.id) else {
            return;
        };
        if rill_metadata::directory_id::reserved(id) {
            // A replica manager given no directory ids (a test's) reports nothing.
            return;
        }
        self.pending_assignments
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(tp.clone(), (topic_id, id));
        self.assignments_added.notify_one();
    }

    /// Where `tp`'s log is, or goes (module docs): where it is on disk; else where the
    /// metadata `assigned` it when that is an online directory of this broker; else the
    /// online directory with the fewest logs. A log whose directory failed is offline,
    /// and so is one assigned elsewhere while a directory is offline (it may be in the
    /// failed one: Kafka refuses to create it anew then, and so does this).
    pub(super) fn place(
        &self,
        tp: &TopicPartition,
        assigned: Uuid,
    ) -> Result<Placement, BrokerError> {
        use rill_metadata::directory_id;
        let offline = |d: usize| self.log_dir_failure.is_offline(d);
        let storage_error = |d: usize| {
            BrokerError::LogDirOffline(
                self.log_dirs
                    .get(d)
                    .map(|d| d.path.display().to_string())
                    .unwrap_or_default(),
            )
        };
        let located = self.located.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&dir) = located.get(tp) {
            if offline(dir) {
                return Err(storage_error(dir));
            }
            return Ok(Placement { dir, exists: true });
        }
        let preferred = self
            .preferred_dirs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(tp);
        if let Some(dir) = preferred.filter(|d| !offline(*d)) {
            return Ok(Placement { dir, exists: false });
        }
        if let Some(dir) = self.log_dirs.iter().position(|d| d.id == assigned) {
            if !directory_id::reserved(assigned) {
                if offline(dir) {
                    return Err(storage_error(dir));
                }
                return Ok(Placement { dir, exists: false });
            }
        }
        let failed = self.log_dir_failure.offline_dirs();
        let is_new = assigned == directory_id::UNASSIGNED || assigned == directory_id::MIGRATING;
        if let (Some(&dir), false) = (failed.first(), is_new) {
            return Err(storage_error(dir));
        }
        (0..self.log_dirs.len())
            .filter(|d| !offline(*d))
            .min_by_key(|d| (located.count(*d), *d))
            .map(|dir| Placement { dir, exists: false })
            .ok_or_else(|| storage_error(0))
    }

    pub(super) fn log_dir_path(&self, dir: usize) -> &Path {
        self.log_dirs
            .get(dir)
            .map_or(Path::new(""), |d| d.path.as_path())
    }

    /// Removes log directory `dir`'s clean-shutdown marker, once: from the moment a log
    /// in it is reachable it may change, and a crash after that must not be taken for a
    /// clean shutdown. A failure is the directory's (fail-stop).
    pub(super) fn remove_clean_shutdown_marker(&self, dir: usize) -> Result<(), BrokerError> {
        let Some(log_dir) = self.log_dirs.get(dir) else {
            return Ok(());
        };
        let mut removed = log_dir
            .marker_removed
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if !*removed {
            if let Err(e) = clean_shutdown::remove_marker(&log_dir.path) {
                self.dir_failed(dir, format_args!("removing the clean-shutdown marker"), &e);
                return Err(e.into());
            }
            *removed = true;
        }
        Ok(())
    }
}

/// The log directory of every partition log found in `dirs`, and a message for each
/// found in two (the metadata log and names that are no partition's are not logs).
pub(super) fn locate_logs(dirs: &[LogDir]) -> (LogLocations, Vec<String>) {
    let mut located = LogLocations::default();
    let mut duplicates = Vec::new();
    for (index, dir) in dirs.iter().enumerate() {
        let entries = match std::fs::read_dir(&dir.path) {
            Ok(entries) => entries,
            Err(e) => {
                // Opening any log in it will fail and take the directory offline then.
                tracing::error!(dir = %dir.path.display(), error = %e, "log directory unreadable");
                continue;
            }
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name == crate::config::METADATA_LOG_DIR || !entry.path().is_dir() {
                continue;
            }
            let Ok(tp) = parse_partition_dir_name(&name) else {
                continue;
            };
            if let Some(first) = located.get(&tp) {
                let first = dirs.get(*first).map(|d| d.path.display().to_string());
                duplicates.push(format!(
                    "the log of {tp} is in two log directories, {} and {}: remove the one \
                     that is not the replica",
                    first.unwrap_or_default(),
                    dir.path.display()
                ));
                continue;
            }
            located.insert(tp, index);
        }
    }
    (located, duplicates)
}
