//! The log directory's failure state (Kafka's `LogDirFailureChannel`).
//!
//! Any write or fsync that fails in the log directory — an append, a flush, a roll, a
//! checkpoint, the cleaner's swap, a follower's truncation — and any read that fails
//! with an I/O error reports here. The first
//! report marks the directory failed for good: from then on the replica manager
//! refuses every append with `KAFKA_STORAGE_ERROR` without touching the disk, and the
//! server's main task, which waits on [`LogDirFailureChannel::failed`], stops the
//! process. Kafka takes only the failed directory offline and shuts the broker down
//! when none is left ("Shutdown broker because all log dirs in ... have failed"); Rill
//! has exactly one log directory, so the first failure is the last one.
//!
//! Why stop rather than carry on: after a failed write the segment may end in a torn
//! batch, and after a failed fsync the kernel may have dropped the dirty pages, so the
//! in-memory offsets no longer describe the disk. Acknowledging anything more could lose
//! it; recovery at the next start (the log is not marked clean) truncates the torn tail
//! and keeps every acknowledged record.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use tokio::sync::watch;

/// Why the log directory failed: the first error reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogDirFailure {
    pub dir: PathBuf,
    /// What was being done, e.g. "append to orders-0".
    pub context: String,
    pub cause: String,
}

impl std::fmt::Display for LogDirFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Shutdown broker because all log dirs in {} have failed: {}: {}",
            self.dir.display(),
            self.context,
            self.cause
        )
    }
}

pub struct LogDirFailureChannel {
    dir: PathBuf,
    failure: OnceLock<LogDirFailure>,
    notify: watch::Sender<bool>,
}

impl LogDirFailureChannel {
    pub fn new(dir: &Path) -> Self {
        let (notify, _) = watch::channel(false);
        Self {
            dir: dir.to_path_buf(),
            failure: OnceLock::new(),
            notify,
        }
    }

    /// Marks the log directory failed (Kafka's `maybeAddOfflineLogDir`); only the first
    /// report is kept, later ones are logged.
    pub fn maybe_add_offline_log_dir(&self, context: &str, cause: &dyn std::fmt::Display) {
        let failure = LogDirFailure {
            dir: self.dir.clone(),
            context: context.to_string(),
            cause: cause.to_string(),
        };
        if self.failure.set(failure).is_ok() {
            tracing::error!(
                dir = %self.dir.display(),
                context,
                error = %cause,
                "log directory failed; no more writes are accepted"
            );
            self.notify.send_replace(true);
        } else {
            tracing::warn!(context, error = %cause, "another i/o error in the failed log directory");
        }
    }

    /// The failure, once the directory has failed.
    pub fn failure(&self) -> Option<&LogDirFailure> {
        self.failure.get()
    }

    pub fn is_offline(&self) -> bool {
        self.failure.get().is_some()
    }

    /// Waits until the directory fails.
    pub async fn failed(&self) -> LogDirFailure {
        let mut rx = self.notify.subscribe();
        loop {
            if let Some(f) = self.failure.get() {
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
        assert!(!channel.is_offline());
        channel.maybe_add_offline_log_dir("append to t-0", &"No space left on device");
        channel.maybe_add_offline_log_dir("flush of t-1", &"later");
        let failure = waiter.await.unwrap();
        assert_eq!(failure.context, "append to t-0");
        assert!(channel.is_offline());
        assert_eq!(
            failure.to_string(),
            "Shutdown broker because all log dirs in /data have failed: \
             append to t-0: No space left on device"
        );
    }
}
