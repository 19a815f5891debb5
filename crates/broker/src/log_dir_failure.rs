//! The log directories' failure state (Kafka's `LogDirFailureChannel`).
//!
//! Any write or fsync that fails in a log directory — an append, a flush, a roll, a
//! checkpoint, the cleaner's swap, a follower's truncation — and any read that fails
//! with an I/O error reports here, naming the directory. The first report marks that
//! directory failed for good (KIP-858's directory failure):
//!
//! 1. From then on every partition in it is offline on this broker: the replica manager
//!    answers its reads and writes with `KAFKA_STORAGE_ERROR` without touching the disk,
//!    stops fetching it, and opens nothing in the directory again.
//! 2. The broker's next heartbeat (sent at once, [`LogDirFailureChannel::changed`]) names
//!    the directory's id in `offline_log_dirs`; the controller takes this broker out of
//!    the ISR of the partitions whose replica is in it and moves their leaderships away,
//!    while the partitions in the other directories keep being served.
//! 3. When no log directory is left, or the one that failed holds the metadata log
//!    (`metadata.log.dir`), the failure is fatal, as in Kafka ("Shutdown broker because
//!    all log dirs in ... have failed", "... the metadata log dir ... has failed"): the
//!    server's main task, which waits on [`LogDirFailureChannel::failed`], stops the
//!    process.
//!
//! Why a directory is not used again after a failed write: the segment may end in a
//! torn batch, and after a failed fsync the kernel may have dropped the dirty pages, so
//! the in-memory offsets no longer describe the disk. Acknowledging anything more from
//! it could lose it; recovery at the next start (the directory is not marked clean)
//! truncates the torn tail and keeps every acknowledged record.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use tokio::sync::watch;

/// Why a log directory failed: the first error reported in it. As the broker's fatal
/// failure, it says why the broker stops.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogDirFailure {
    pub dir: PathBuf,
    /// What was being done, e.g. "append to orders-0".
    pub context: String,
    pub cause: String,
    /// Why the broker stops: every directory failed, or the metadata log's did.
    pub shutdown: String,
}

impl std::fmt::Display for LogDirFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if !self.shutdown.is_empty() {
            write!(f, "{}: ", self.shutdown)?;
        }
        write!(f, "{}: {}", self.context, self.cause)
    }
}

pub struct LogDirFailureChannel {
    /// The log directories, in `log.dirs` order; failures name them by index.
    dirs: Vec<PathBuf>,
    /// The index of the directory that holds the metadata log, if it is a log directory.
    metadata_dir: Option<usize>,
    failures: Vec<OnceLock<LogDirFailure>>,
    fatal: OnceLock<LogDirFailure>,
    /// The number of failed directories, for those that act on each failure.
    notify: watch::Sender<usize>,
}

impl LogDirFailureChannel {
    /// One log directory, which holds the metadata log too.
    pub fn new(dir: &Path) -> Self {
        Self::with_dirs(vec![dir.to_path_buf()], Some(0))
    }

    /// The log directories `dirs`; `metadata_dir` is the one that holds the metadata
    /// log, if any does.
    pub fn with_dirs(dirs: Vec<PathBuf>, metadata_dir: Option<usize>) -> Self {
        let (notify, _) = watch::channel(0);
        Self {
            failures: dirs.iter().map(|_| OnceLock::new()).collect(),
            dirs,
            metadata_dir,
            fatal: OnceLock::new(),
            notify,
        }
    }

    /// The log directories, in order.
    pub fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }

    /// Marks directory `dir` failed (Kafka's `maybeAddOfflineLogDir`); only the first
    /// report is kept, later ones are logged.
    pub fn maybe_add_offline_log_dir(
        &self,
        dir: usize,
        context: &str,
        cause: &dyn std::fmt::Display,
    ) {
        let Some((path, slot)) = self.dirs.get(dir).zip(self.failures.get(dir)) else {
            tracing::error!(dir, context, error = %cause, "failure of an unknown log directory");
            return;
        };
        let failure = LogDirFailure {
            dir: path.clone(),
            context: context.to_string(),
            cause: cause.to_string(),
            shutdown: String::new(),
        };
        if slot.set(failure.clone()).is_err() {
            tracing::warn!(context, error = %cause, "another i/o error in the failed log directory");
            return;
        }
        let failed = self.offline_dirs().len();
        tracing::error!(
            dir = %path.display(),
            context,
            error = %cause,
            online = self.dirs.len() - failed,
            "log directory failed; its partitions are offline on this broker"
        );
        let shutdown = if failed == self.dirs.len() {
            let all: Vec<String> = self.dirs.iter().map(|d| d.display().to_string()).collect();
            Some(format!(
                "Shutdown broker because all log dirs in {} have failed",
                all.join(", ")
            ))
        } else if self.metadata_dir == Some(dir) {
            Some(format!(
                "Shutdown broker because the metadata log dir {} has failed",
                path.display()
            ))
        } else {
            None
        };
        if let Some(shutdown) = shutdown {
            let _ = self.fatal.set(LogDirFailure {
                shutdown,
                ..failure
            });
        }
        self.notify.send_replace(failed);
    }

    /// The broker's fatal failure, once it has one (point 3 of the module docs).
    pub fn failure(&self) -> Option<&LogDirFailure> {
        self.fatal.get()
    }

    /// Whether directory `dir` has failed.
    pub fn is_offline(&self, dir: usize) -> bool {
        self.failures.get(dir).is_some_and(|f| f.get().is_some())
    }

    /// The failure of directory `dir`, once it has failed.
    pub fn dir_failure(&self, dir: usize) -> Option<&LogDirFailure> {
        self.failures.get(dir).and_then(OnceLock::get)
    }

    /// The indexes of the failed directories.
    pub fn offline_dirs(&self) -> Vec<usize> {
        (0..self.dirs.len())
            .filter(|d| self.is_offline(*d))
            .collect()
    }

    /// A receiver that sees each new directory failure.
    pub fn changed(&self) -> watch::Receiver<usize> {
        self.notify.subscribe()
    }

    /// Waits until the failure is fatal.
    pub async fn failed(&self) -> LogDirFailure {
        let mut rx = self.notify.subscribe();
        loop {
            if let Some(f) = self.fatal.get() {
                return f.clone();
            }
            if rx.changed().await.is_err() {
                // The sender lives as long as `self`; this is unreachable while borrowed.
                std::future::pending::<()>().await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_first_failure_is_kept_and_wakes_the_waiter() {
        let channel = std::sync::Arc::new(LogDirFailureChannel::new(Path::new("/data")));
        let waiter = tokio::spawn({
            let c = channel.clone();
            async move { c.failed().await }
        });
        assert!(!channel.is_offline(0));
        channel.maybe_add_offline_log_dir(0, "append to t-0", &"No space left on device");
        channel.maybe_add_offline_log_dir(0, "flush of t-1", &"later");
        let failure = waiter.await.unwrap();
        assert_eq!(failure.context, "append to t-0");
        assert!(channel.is_offline(0));
        assert_eq!(
            failure.to_string(),
            "Shutdown broker because all log dirs in /data have failed: \
             append to t-0: No space left on device"
        );
    }

    #[test]
    fn one_of_several_directories_fails_alone_unless_it_holds_the_metadata_log() {
        let dirs: Vec<PathBuf> = ["/a", "/b", "/c"].iter().map(PathBuf::from).collect();
        let channel = LogDirFailureChannel::with_dirs(dirs.clone(), Some(0));
        let rx = channel.changed();
        channel.maybe_add_offline_log_dir(2, "roll of t-0", &"Read-only file system");
        assert!(rx.has_changed().unwrap());
        assert_eq!(channel.offline_dirs(), vec![2]);
        assert!(channel.failure().is_none(), "two directories are left");
        channel.maybe_add_offline_log_dir(1, "append to t-1", &"EIO");
        assert!(channel.failure().is_none());
        channel.maybe_add_offline_log_dir(0, "append to t-2", &"EIO");
        let fatal = channel.failure().unwrap().to_string();
        assert!(
            fatal.starts_with("Shutdown broker because all log dirs in /a, /b, /c have failed"),
            "{fatal}"
        );

        let channel = LogDirFailureChannel::with_dirs(dirs, Some(0));
        channel.maybe_add_offline_log_dir(0, "append to t-0", &"EIO");
        let fatal = channel.failure().unwrap().to_string();
        assert!(
            fatal.starts_with("Shutdown broker because the metadata log dir /a has failed"),
            "{fatal}"
        );
    }
}
