//! The data directory's clean-shutdown marker (Kafka's `.kafka_cleanshutdown`, one per
//! log directory) and the single `syncfs` that makes a clean close durable.
//!
//! # Design note
//!
//! A log closed cleanly skips recovery at its next open: its active segment is loaded
//! rather than scanned, its producer state comes from the snapshot, its index files are
//! trusted. That is only safe when everything the close wrote reached the disk and
//! nothing changed the log afterwards. One marker for the whole data directory says
//! that of every log in it:
//!
//! 1. At start-up the owner of the data directory reads whether the marker exists
//!    ([`PreviousShutdown::read`]) and opens every log with that answer.
//! 2. It removes the marker ([`remove_marker`]: unlink, then one directory fsync) after
//!    the logs that existed are open and before anything is appended, truncated or
//!    recorded as a new leader epoch. A crash before the removal leaves the marker and
//!    the logs as the last clean close left them (opening only reads, or replaces files
//!    atomically); a crash after it makes the next start recover every log.
//! 3. At a clean stop it closes every log ([`crate::UnifiedLog::close`], which writes
//!    the checkpoints without fsync), then makes all of it durable with one `syncfs(2)`
//!    of the file system ([`DataDirSync::sync`]), and only then writes the marker
//!    ([`write_marker`]: the file fsynced, then its directory). A log that failed, was
//!    still in use, or was never opened after an unclean start leaves the marker
//!    unwritten, and the next start recovers everything.
//!
//! Why `syncfs` rather than an fsync per file: a clean close of 10,000 partitions wrote
//! five files each, and each fsync is a device flush (about a millisecond here); the
//! kernel writes back the dirty pages of the whole file system in one pass instead.
//! `syncfs` reports a write-back error that happened on the file system since the
//! descriptor it is called through was opened (Linux 5.8 and later), so
//! [`DataDirSync`] opens that descriptor when the data directory is taken into use,
//! before any log is written.

use std::fs::{self, File};
use std::path::{Path, PathBuf};

use crate::checkpoint::sync_dir;
use crate::StorageError;

/// The marker's name: in a data directory, the marker of all its logs; in a partition
/// directory, the marker earlier versions wrote per log (still honoured, see
/// [`crate::UnifiedLog::open`]).
pub const CLEAN_SHUTDOWN_FILE: &str = ".clean_shutdown";

/// How the previous run left the logs (Kafka's `hadCleanShutdown`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreviousShutdown {
    /// Every log was closed and made durable, and the marker written afterwards.
    Clean,
    /// Anything else (a crash, a failed disk, a first start): recover each log's
    /// active segment and rebuild what is derived from the batches.
    Unclean,
}

impl PreviousShutdown {
    /// Whether the marker exists in `data_dir`.
    pub fn read(data_dir: &Path) -> Result<Self, StorageError> {
        let marker = data_dir.join(CLEAN_SHUTDOWN_FILE);
        match marker.try_exists() {
            Ok(true) => Ok(Self::Clean),
            Ok(false) => Ok(Self::Unclean),
            Err(e) => Err(StorageError::io(&marker, e)),
        }
    }
}

/// Removes the marker of `data_dir` durably (step 2); nothing when there is none.
pub fn remove_marker(data_dir: &Path) -> Result<(), StorageError> {
    let marker = data_dir.join(CLEAN_SHUTDOWN_FILE);
    match fs::remove_file(&marker) {
        Ok(()) => sync_dir(data_dir),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(StorageError::io(&marker, e)),
    }
}

/// Writes the marker of `data_dir` durably (step 3); call it only after
/// [`DataDirSync::sync`] succeeded.
pub fn write_marker(data_dir: &Path) -> Result<(), StorageError> {
    let marker = data_dir.join(CLEAN_SHUTDOWN_FILE);
    File::create(&marker)
        .and_then(|f| f.sync_all())
        .map_err(|e| StorageError::io(&marker, e))?;
    sync_dir(data_dir)
}

/// A descriptor of the data directory, opened before the logs are written, through
/// which one `syncfs(2)` makes every file on its file system durable.
#[derive(Debug)]
pub struct DataDirSync {
    dir: PathBuf,
    fd: File,
}

impl DataDirSync {
    pub fn open(data_dir: &Path) -> Result<Self, StorageError> {
        let fd = File::open(data_dir).map_err(|e| StorageError::io(data_dir, e))?;
        Ok(Self {
            dir: data_dir.to_owned(),
            fd,
        })
    }

    /// Writes back every dirty page of the file system and waits for it; an error
    /// means some write since [`Self::open`] may not have reached the disk. Never
    /// retried, as an fsync is not.
    pub fn sync(&self) -> Result<(), StorageError> {
        rustix::fs::syncfs(&self.fd).map_err(|e| StorageError::io(&self.dir, e.into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marker_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(
            PreviousShutdown::read(dir.path()).unwrap(),
            PreviousShutdown::Unclean
        );
        remove_marker(dir.path()).unwrap();
        DataDirSync::open(dir.path()).unwrap().sync().unwrap();
        write_marker(dir.path()).unwrap();
        assert_eq!(
            PreviousShutdown::read(dir.path()).unwrap(),
            PreviousShutdown::Clean
        );
        remove_marker(dir.path()).unwrap();
        assert_eq!(
            PreviousShutdown::read(dir.path()).unwrap(),
            PreviousShutdown::Unclean
        );
    }
}
