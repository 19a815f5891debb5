//! The segment swap of a clean, on disk: the `.cleaned` and `.swap` file names, the
//! `cleaner-swap` manifest that commits a swap, the steps that carry it out, and the
//! recovery that finishes or rolls back a swap at open (Kafka's `LocalLog.replaceSegments`
//! and the swap-file handling of its `LogLoader`). The protocol and why it is correct are
//! step 6 of the design note in [`crate::cleaner`].
//!
//! It sits below both the cleaner, which writes the `.cleaned` segments and commits the
//! swap, and the log, whose open recovers an interrupted one; it knows neither.

use std::fs;
use std::path::{Path, PathBuf};

use crate::checkpoint::{self, Durability};
use crate::segment::{segment_file, INDEX_FILE_SUFFIX, LOG_FILE_SUFFIX, TIME_INDEX_FILE_SUFFIX};
use crate::StorageError;

/// The cleaner's progress in a partition directory: every segment below this offset has
/// been cleaned (Kafka's `cleaner-offset-checkpoint`, kept per partition here). The last
/// step of a swap writes it, and the log reads and writes it.
pub const CLEANER_OFFSET_CHECKPOINT_FILE: &str = "cleaner-offset-checkpoint";
/// The swap manifest: its presence means a committed swap is to be finished.
pub const CLEANER_SWAP_FILE: &str = "cleaner-swap";
pub(crate) const CLEANED_TAIL: &str = ".cleaned";
pub(crate) const SWAP_TAIL: &str = ".swap";
/// Index files first, the log last: see step 6.5 of the cleaner's design note.
pub(crate) const SWAP_ORDER: [&str; 3] =
    [INDEX_FILE_SUFFIX, TIME_INDEX_FILE_SUFFIX, LOG_FILE_SUFFIX];
const MANIFEST_OLD: i64 = 0;
const MANIFEST_NEW: i64 = 1;
const MANIFEST_END: i64 = 2;
pub(crate) fn remove_if_exists(path: &Path) -> Result<(), StorageError> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(StorageError::io(path, e)),
    }
}

pub(crate) fn rename_if_exists(from: &Path, to: &Path) -> Result<(), StorageError> {
    match fs::rename(from, to) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(StorageError::io(from, e)),
    }
}

pub(crate) fn tailed(dir: &Path, base: i64, suffix: &str, tail: &str) -> PathBuf {
    segment_file(dir, base, &format!("{suffix}{tail}"))
}

/// Writes the swap manifest (step 6.2).
pub(crate) fn write_manifest(
    dir: &Path,
    old: &[i64],
    new: &[i64],
    end: i64,
) -> Result<(), StorageError> {
    let mut lines: Vec<String> = old.iter().map(|b| format!("{MANIFEST_OLD} {b}")).collect();
    lines.extend(new.iter().map(|b| format!("{MANIFEST_NEW} {b}")));
    lines.push(format!("{MANIFEST_END} {end}"));
    checkpoint::write(&dir.join(CLEANER_SWAP_FILE), &lines, Durability::Durable)
}

/// Steps 5.3–5.6, each preceded by a call of `step` (which tests use to stop the swap
/// part-way, as a crash would).
pub(crate) fn finish_swap(
    dir: &Path,
    old: &[i64],
    new: &[i64],
    end: i64,
    step: &mut dyn FnMut() -> Result<(), StorageError>,
) -> Result<(), StorageError> {
    for &base in new {
        for suffix in SWAP_ORDER {
            step()?;
            rename_if_exists(
                &tailed(dir, base, suffix, CLEANED_TAIL),
                &tailed(dir, base, suffix, SWAP_TAIL),
            )?;
        }
    }
    checkpoint::sync_dir(dir)?;
    for &base in old.iter().filter(|b| !new.contains(b)) {
        step()?;
        for suffix in SWAP_ORDER {
            remove_if_exists(&segment_file(dir, base, suffix))?;
        }
    }
    for &base in new {
        for suffix in SWAP_ORDER {
            step()?;
            rename_if_exists(
                &tailed(dir, base, suffix, SWAP_TAIL),
                &segment_file(dir, base, suffix),
            )?;
        }
    }
    checkpoint::sync_dir(dir)?;
    step()?;
    checkpoint::write_offset(
        &dir.join(CLEANER_OFFSET_CHECKPOINT_FILE),
        end,
        Durability::Durable,
    )?;
    step()?;
    remove_if_exists(&dir.join(CLEANER_SWAP_FILE))?;
    checkpoint::sync_dir(dir)
}

/// Called by `UnifiedLog::open` before it looks at the segments: finishes a swap whose
/// manifest exists, or removes the leftovers of a clean that did not reach it.
pub(crate) fn recover_swap(dir: &Path) -> Result<(), StorageError> {
    let manifest = match checkpoint::read(&dir.join(CLEANER_SWAP_FILE)) {
        Ok(m) => m,
        // The manifest is written atomically; an unreadable one was never committed.
        Err(StorageError::Corrupt { .. }) => None,
        Err(e) => return Err(e),
    };
    if let Some(entries) = manifest {
        let (mut old, mut new, mut end) = (Vec::new(), Vec::new(), None);
        for e in &entries {
            match e.as_slice() {
                [MANIFEST_OLD, b] => old.push(*b),
                [MANIFEST_NEW, b] => new.push(*b),
                [MANIFEST_END, o] => end = Some(*o),
                _ => {}
            }
        }
        if let Some(end) = end {
            tracing::warn!(dir = %dir.display(), "finishing an interrupted segment swap");
            return finish_swap(dir, &old, &new, end, &mut || Ok(()));
        }
    }
    let mut removed = false;
    for entry in fs::read_dir(dir).map_err(|e| StorageError::io(dir, e))? {
        let entry = entry.map_err(|e| StorageError::io(dir, e))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.ends_with(CLEANED_TAIL) || name.ends_with(SWAP_TAIL) || name == CLEANER_SWAP_FILE {
            let p = entry.path();
            fs::remove_file(&p).map_err(|e| StorageError::io(&p, e))?;
            removed = true;
        }
    }
    if removed {
        tracing::warn!(dir = %dir.display(), "rolled back an interrupted clean");
        checkpoint::sync_dir(dir)?;
    }
    Ok(())
}
