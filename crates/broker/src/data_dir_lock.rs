//! The exclusive locks on the node's directories (Kafka's `.lock` in every log
//! directory), which keep a second server off a directory that one is already writing:
//! every path of `log.dirs` and `metadata.log.dir`.
//!
//! # Design note
//!
//! Two processes on one directory would append to the same segments and the same
//! metadata log, and the one that stops first would write the clean-shutdown marker
//! while the other is still writing, so that the next start skips recovery of a torn
//! tail. Kafka's `LogManager.lockLogDirs` refuses to start instead; so does this.
//!
//! 1. Before anything in the directories is read or written, [`DataDirLock::acquire_all`]
//!    creates each directory if needed, opens (never truncates before locking) its
//!    `.lock` and takes `flock(LOCK_EX | LOCK_NB)` on it, in the configured order; a
//!    refusal releases the ones already taken.
//! 2. When another open file holds the lock the start fails with
//!    [`BrokerError::DataDirLocked`], naming the directory and the PID that the holder
//!    wrote into the file.
//! 3. Once locked it replaces the file's contents with this process's PID (only a
//!    holder writes the file, so a reader never sees a half-written PID of a live
//!    holder for long, and a wrong one only makes the message less helpful).
//! 4. The locks live as long as the returned value; the node keeps it until the process
//!    exits.
//!
//! # Why it is correct
//!
//! `flock` locks belong to the open file description, and the kernel drops them when
//! the last descriptor of it closes, which includes every way a process ends (`kill -9`
//! too), so a stale `.lock` left behind never blocks a start and needs no clean-up.
//! The metadata log (`__cluster_metadata`) lives inside `metadata.log.dir` and every
//! partition log in one of `log.dirs`, so the locks cover every file this process writes. A lock taken a second time in the same
//! process through a fresh `open` is refused as well (a new open file description),
//! which is what the unit test checks. `flock` is advisory: it keeps out other Rill
//! processes, not someone's `rm`.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use rustix::fs::{flock, FlockOperation};
use rustix::io::Errno;

use crate::error::BrokerError;

/// The lock file's name, as Kafka names it.
pub const LOCK_FILE: &str = ".lock";

/// Longest PID text read back from a lock file (a PID has at most 10 digits); bounds
/// the read of a file that someone filled with something else.
const PID_TEXT_MAX_BYTES: u64 = 32;

/// The held locks on the node's directories; dropping it releases them.
#[derive(Debug)]
pub struct DataDirLock {
    dirs: Vec<PathBuf>,
    /// Whether every directory held nothing (but possibly a `.lock`) when it was locked:
    /// a first start, as opposed to one after an unclean shutdown.
    was_new: bool,
    // Kept open only to hold the locks: closing them releases the locks.
    _files: Vec<File>,
}

impl DataDirLock {
    /// Creates `dir` if it does not exist and locks it (see the module's design note).
    pub fn acquire(dir: &Path) -> Result<Self, BrokerError> {
        Self::acquire_all(&[dir.to_path_buf()])
    }

    /// Locks every directory of `dirs`, in order (see the module's design note).
    pub fn acquire_all(dirs: &[PathBuf]) -> Result<Self, BrokerError> {
        let mut files = Vec::with_capacity(dirs.len());
        let mut was_new = true;
        for dir in dirs {
            let (file, new) = lock_one(dir)?;
            files.push(file);
            was_new &= new;
        }
        Ok(Self {
            dirs: dirs.to_vec(),
            was_new,
            _files: files,
        })
    }

    /// The first directory locked: the metadata log's, as the callers order them.
    pub fn dir(&self) -> &Path {
        self.dirs.first().map_or(Path::new(""), PathBuf::as_path)
    }

    /// Every directory locked, in order.
    pub fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }

    /// Whether the directories were empty when locked: a brand-new node.
    pub fn was_new(&self) -> bool {
        self.was_new
    }
}

/// Locks one directory: its open lock file, and whether it held nothing else.
fn lock_one(dir: &Path) -> Result<(File, bool), BrokerError> {
    std::fs::create_dir_all(dir).map_err(|e| BrokerError::io(dir.display(), e))?;
    let path = dir.join(LOCK_FILE);
    let io = |e: std::io::Error| BrokerError::io(path.display(), e);
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(io)?;
    match flock(&file, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => {}
        Err(Errno::WOULDBLOCK) => {
            return Err(BrokerError::DataDirLocked {
                dir: dir.display().to_string(),
                pid: holder_pid(&mut file),
            });
        }
        Err(e) => return Err(io(e.into())),
    }
    // Read only now that no other process can be creating files in it.
    let was_new = is_empty_but_lock(dir).map_err(|e| BrokerError::io(dir.display(), e))?;
    let pid = std::process::id();
    file.set_len(0).map_err(io)?;
    file.seek(SeekFrom::Start(0)).map_err(io)?;
    // No fsync: the PID only helps the message of a refused start while this
    // process runs; after a crash the file's contents do not matter.
    file.write_all(format!("{pid}\n").as_bytes()).map_err(io)?;
    Ok((file, was_new))
}

/// The PID the holder wrote into the lock file, if the file holds one.
fn holder_pid(file: &mut File) -> Option<u32> {
    let mut text = String::new();
    file.seek(SeekFrom::Start(0)).ok()?;
    file.take(PID_TEXT_MAX_BYTES)
        .read_to_string(&mut text)
        .ok()?;
    text.trim().parse().ok().filter(|pid| *pid > 0)
}

fn is_empty_but_lock(dir: &Path) -> std::io::Result<bool> {
    for entry in std::fs::read_dir(dir)? {
        if entry?.file_name() != LOCK_FILE {
            return Ok(false);
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_on_the_directory_is_refused_and_names_the_holder() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let held = DataDirLock::acquire(&data).unwrap();
        assert!(held.was_new(), "a directory that did not exist is new");
        // A fresh open is a new open file description, which flock treats like another
        // process: refused even from within this one.
        match DataDirLock::acquire(&data) {
            Err(BrokerError::DataDirLocked { dir, pid }) => {
                assert_eq!(dir, data.display().to_string());
                assert_eq!(pid, Some(std::process::id()));
            }
            other => panic!("second lock: {other:?}"),
        }
        let message = DataDirLock::acquire(&data).unwrap_err().to_string();
        assert!(message.contains(&data.display().to_string()), "{message}");
        assert!(
            message.contains(&format!("pid {}", std::process::id())),
            "{message}"
        );
        // One locked directory among others refuses the whole set.
        let other = dir.path().join("other");
        assert!(matches!(
            DataDirLock::acquire_all(&[other.clone(), data.clone()]),
            Err(BrokerError::DataDirLocked { .. })
        ));
        drop(held);
        let both = DataDirLock::acquire_all(&[data.clone(), other.clone()]).unwrap();
        assert_eq!(both.dirs(), &[data.clone(), other.clone()]);
        assert!(matches!(
            DataDirLock::acquire(&other),
            Err(BrokerError::DataDirLocked { .. })
        ));
        drop(both);
        // Released with the descriptor; a directory with only the lock file is still new.
        let again = DataDirLock::acquire(&data).unwrap();
        assert!(again.was_new());
        drop(again);
        std::fs::write(data.join("meta.properties"), "node.id=1\n").unwrap();
        assert!(!DataDirLock::acquire(&data).unwrap().was_new());
    }

    #[test]
    fn a_lock_file_without_a_pid_still_refuses() {
        let dir = tempfile::tempdir().unwrap();
        let _held = DataDirLock::acquire(dir.path()).unwrap();
        std::fs::write(dir.path().join(LOCK_FILE), "not a pid").unwrap();
        match DataDirLock::acquire(dir.path()) {
            Err(BrokerError::DataDirLocked { pid: None, .. }) => {}
            other => panic!("second lock: {other:?}"),
        }
    }
}
