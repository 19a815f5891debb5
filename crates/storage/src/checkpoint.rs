//! Small checkpoint files in Kafka's text format, written atomically.
//!
//! Kafka's checkpoint files (`leader-epoch-checkpoint`, `replication-offset-checkpoint`,
//! …) are text: a version line (`0`), a count line, then one entry per line with
//! space-separated fields. Rill keeps that shape for its per-partition files
//! (`leader-epoch-checkpoint`, `high-watermark`, `log-start-offset`).
//!
//! A write goes to `<name>.tmp`, is fsynced, renamed over the old file and the directory
//! is fsynced: after a crash the file is either the old or the new version, never a
//! mixture, which is why a reader may treat any malformed file as corrupt rather than
//! torn.
//!
//! A [`Durability::Deferred`] write skips both fsyncs (two device flushes per file, the
//! cost that dominated a clean stop and a restart with thousands of partitions). The
//! rename still replaces the file whole, but after a crash the file may be the old
//! version, or, where the file system did not write the data before the rename, empty
//! or partly written: readers already take any malformed file as missing. It is for
//! writes that are made durable later by one `syncfs` of the whole file system (a clean
//! close), or whose loss the next open repairs (see `UnifiedLog::open`).

use std::fs::{self, File};
use std::io::Write;
use std::path::Path;

use crate::StorageError;

const VERSION: &str = "0";

/// Whether a checkpoint write waits for the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Durability {
    /// Fsync the file and its directory: the new version survives a crash once the
    /// write returns.
    Durable,
    /// No fsync: atomic against readers, but a crash may leave the old version or a
    /// malformed file (see the module docs).
    Deferred,
}

/// Writes `entries` (each already formatted as one line) atomically to `path`.
pub(crate) fn write(
    path: &Path,
    entries: &[String],
    durability: Durability,
) -> Result<(), StorageError> {
    let mut text = format!("{VERSION}\n{}\n", entries.len());
    for e in entries {
        text.push_str(e);
        text.push('\n');
    }
    let tmp = path.with_extension("tmp");
    let mut f = File::create(&tmp).map_err(|e| StorageError::io(&tmp, e))?;
    f.write_all(text.as_bytes())
        .map_err(|e| StorageError::io(&tmp, e))?;
    if durability == Durability::Durable {
        f.sync_all().map_err(|e| StorageError::io(&tmp, e))?;
    }
    fs::rename(&tmp, path).map_err(|e| StorageError::io(path, e))?;
    if durability == Durability::Durable {
        if let Some(dir) = path.parent() {
            sync_dir(dir)?;
        }
    }
    Ok(())
}

/// Reads the entry lines of a checkpoint file; `Ok(None)` when the file does not exist.
pub(crate) fn read(path: &Path) -> Result<Option<Vec<Vec<i64>>>, StorageError> {
    let text = match fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(StorageError::io(path, e)),
    };
    let corrupt = |reason: &str| StorageError::Corrupt {
        path: path.to_owned(),
        reason: reason.to_owned(),
    };
    let mut lines = text.lines();
    if lines.next() != Some(VERSION) {
        return Err(corrupt("unknown version"));
    }
    let count: usize = lines
        .next()
        .and_then(|l| l.trim().parse().ok())
        .ok_or_else(|| corrupt("bad entry count"))?;
    let mut entries = Vec::new();
    for line in lines {
        let fields: Result<Vec<i64>, _> = line.split_whitespace().map(str::parse).collect();
        entries.push(fields.map_err(|_| corrupt("bad entry"))?);
    }
    if entries.len() != count {
        return Err(corrupt("entry count does not match"));
    }
    Ok(Some(entries))
}

/// Reads a checkpoint that holds a single offset.
pub(crate) fn read_offset(path: &Path) -> Result<Option<i64>, StorageError> {
    match read(path)? {
        None => Ok(None),
        Some(entries) => match entries.as_slice() {
            [e] if e.len() == 1 => Ok(Some(e[0])),
            _ => Err(StorageError::Corrupt {
                path: path.to_owned(),
                reason: "expected one offset".to_owned(),
            }),
        },
    }
}

pub(crate) fn write_offset(
    path: &Path,
    offset: i64,
    durability: Durability,
) -> Result<(), StorageError> {
    write(path, &[offset.to_string()], durability)
}

/// Makes a create, rename or unlink in `dir` durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<(), StorageError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| StorageError::io(dir, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_corruption() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("high-watermark");
        assert_eq!(read_offset(&p).unwrap(), None);
        write_offset(&p, 42, Durability::Durable).unwrap();
        assert_eq!(read_offset(&p).unwrap(), Some(42));
        write_offset(&p, 43, Durability::Deferred).unwrap();
        assert_eq!(read_offset(&p).unwrap(), Some(43));
        write(&p, &["1 0".into(), "3 10".into()], Durability::Durable).unwrap();
        assert_eq!(read(&p).unwrap().unwrap(), vec![vec![1, 0], vec![3, 10]]);
        fs::write(&p, "0\n2\n1 0\n").unwrap();
        assert!(read(&p).is_err());
        fs::write(&p, "garbage").unwrap();
        assert!(read(&p).is_err());
        // What a deferred write may leave after a crash: an empty file.
        fs::write(&p, "").unwrap();
        assert!(read(&p).is_err());
    }
}
