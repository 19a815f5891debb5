//! Group commit of a log's fsyncs (`flush.messages`, `flush.ms`): the append writes under
//! the partition's lock and takes a [`PendingFlush`]; the fsync happens after the lock is
//! released, and one fsync covers every append written before it started.
//!
//! # Design note: group commit
//!
//! State, shared between the log and every pending flush of it ([`LogFlusher`]):
//! - `written`: the active segment's `.log` file and the log end offset after the last
//!   append (what a sync started now would cover), and a `generation` that a truncation
//!   bumps; updated by the log under its lock.
//! - `synced`: every offset below it is known to be fsynced, in `generation`.
//! - a token mutex that serialises the syncs.
//!
//! Protocol:
//! 1. Append (log lock held): the batches are written; the log records
//!    `written = (active file, log end)`; when the flush policy asks for a flush, the
//!    append returns a [`PendingFlush`] for `target = log end` in the current generation.
//! 2. The caller releases the log lock and calls [`PendingFlush::sync`]: it takes the
//!    token; when `synced >= target` in the same generation, an fsync that started after
//!    this append's write already covered it, and it returns at once. Otherwise it reads
//!    `written`, fsyncs that file (outside every lock but the token), then advances
//!    `synced` to the `written` end it read, unless the generation changed meanwhile.
//! 3. The caller re-takes the log lock and hands the [`FlushDone`] to
//!    [`crate::UnifiedLog::complete_flush`], which moves the recovery point.
//!
//! Why it is correct: every byte below the `written` end read in step 2 was written
//! before the read, either into that file or into an older segment, and a roll fsyncs
//! the old segment (under the log lock) before the new file is recorded in `written`; so
//! the fsync of step 2 makes everything below that end durable, and `synced` never
//! claims more. A truncation (log lock held) bumps the generation and lowers `written`
//! and `synced` to the new log end: a sync that was in flight across it syncs a file
//! that may have lost its tail or been deleted (harmless) and does not move `synced`,
//! and [`crate::UnifiedLog::complete_flush`] ignores a result of an older generation, so
//! the recovery point never passes the log end. A failed fsync is never retried: the
//! flusher remembers the failure and every later sync fails with it (the kernel may
//! have dropped the dirty pages, so a later success would prove nothing); the caller
//! takes the log offline.
//!
//! Index files are not fsynced here: they are derived from the `.log`, every segment
//! but the last is fsynced whole at its roll, and the last is rebuilt by recovery after
//! any unclean shutdown (see [`crate::index`]).

use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::error::StorageError;

/// Where the time of each log flush goes (Kafka's `LogFlushRateAndTimeMs`): the broker
/// installs its histogram once; unset, flushes are timed by no one.
static FLUSH_OBSERVER: std::sync::OnceLock<fn(std::time::Duration)> = std::sync::OnceLock::new();

/// Has `observer` told the time of every log flush: a group commit's fsync and a roll's
/// (the old segment, its indexes, the producer snapshot and the directory). The first
/// call wins; a process has one metrics registry.
pub fn observe_log_flushes(observer: fn(std::time::Duration)) {
    let _ = FLUSH_OBSERVER.set(observer);
}

/// Reports one flush's time to the observer, if there is one.
pub(crate) fn flushed(started: std::time::Instant) {
    if let Some(observe) = FLUSH_OBSERVER.get() {
        observe(started.elapsed());
    }
}

/// What a sync would cover: the active segment's file and the log end written into it.
#[derive(Debug)]
struct Written {
    file: Option<(Arc<File>, PathBuf)>,
    end: i64,
    generation: u64,
    /// Everything below is fsynced (in `generation`).
    synced: i64,
    /// The first fsync failure; every later sync fails with it.
    failed: Option<String>,
}

/// The shared flush state of one log (see the module's design note).
#[derive(Debug)]
pub struct LogFlusher {
    written: Mutex<Written>,
    /// Held for the whole of a sync, so that syncs of one log never overlap and a waiter
    /// finds the watermark the previous one left.
    token: Mutex<()>,
    fsyncs: AtomicU64,
}

/// An append's promise that its records will be fsynced before it is acknowledged:
/// call [`PendingFlush::sync`] without the log lock, then hand the result to
/// [`crate::UnifiedLog::complete_flush`] with the lock.
#[derive(Debug, Clone)]
#[must_use = "the append is not durable until the pending flush is synced"]
pub struct PendingFlush {
    flusher: Arc<LogFlusher>,
    target: i64,
    generation: u64,
}

/// What a sync made durable: every offset below `synced`, in `generation`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlushDone {
    pub(crate) synced: i64,
    pub(crate) generation: u64,
}

impl FlushDone {
    /// Every offset below this one is fsynced.
    pub fn synced(&self) -> i64 {
        self.synced
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section here only assigns plain fields: a panic cannot leave the
    // state half-updated, so a poisoned lock is still safe to use.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl LogFlusher {
    /// A flusher for a log whose every offset below `log_end` is durable.
    pub(crate) fn new(file: Option<(Arc<File>, PathBuf)>, log_end: i64) -> Arc<Self> {
        Arc::new(Self {
            written: Mutex::new(Written {
                file,
                end: log_end,
                generation: 0,
                synced: log_end,
                failed: None,
            }),
            token: Mutex::new(()),
            fsyncs: AtomicU64::new(0),
        })
    }

    /// Step 1, log lock held: the log now ends at `end` in `file`.
    pub(crate) fn record_written(&self, file: Option<(Arc<File>, PathBuf)>, end: i64) {
        let mut w = lock(&self.written);
        w.file = file;
        w.end = end;
    }

    /// The log was truncated to `end` (or started over there) with `file` active: syncs
    /// in flight must not move the watermark (see the design note).
    pub(crate) fn record_truncated(&self, file: Option<(Arc<File>, PathBuf)>, end: i64) {
        let mut w = lock(&self.written);
        w.generation += 1;
        w.file = file;
        w.end = end;
        w.synced = w.synced.min(end);
    }

    /// Everything below `end` was fsynced by the log itself (a roll, a full flush).
    pub(crate) fn record_synced(&self, end: i64) {
        let mut w = lock(&self.written);
        w.synced = w.synced.max(end.min(w.end));
    }

    /// The log went offline (a write or fsync failed elsewhere): no later sync may
    /// claim anything, since the kernel may have dropped dirty pages.
    pub(crate) fn fail(&self, cause: &str) {
        let mut w = lock(&self.written);
        if w.failed.is_none() {
            w.failed = Some(cause.to_owned());
        }
    }

    /// A promise for everything written so far.
    pub(crate) fn pending(self: &Arc<Self>) -> PendingFlush {
        let w = lock(&self.written);
        PendingFlush {
            flusher: Arc::clone(self),
            target: w.end,
            generation: w.generation,
        }
    }

    /// The current generation (bumped by every truncation).
    pub(crate) fn generation(&self) -> u64 {
        lock(&self.written).generation
    }

    /// How many fsyncs group commit has done for this log (for tests and metrics).
    pub fn fsync_count(&self) -> u64 {
        self.fsyncs.load(Ordering::Relaxed)
    }
}

impl PendingFlush {
    /// The log end offset this flush must make durable.
    pub fn target(&self) -> i64 {
        self.target
    }

    /// Step 2, without the log lock: returns once everything below [`Self::target`] is
    /// fsynced, doing the fsync itself unless one that started after the append did.
    /// Blocking I/O. An error means the fsync failed (now or in an earlier sync of this
    /// log): the log must go offline.
    pub fn sync(&self) -> Result<FlushDone, StorageError> {
        let f = &*self.flusher;
        let _token = lock(&f.token);
        let (file, end, generation) = {
            let w = lock(&f.written);
            if let Some(cause) = &w.failed {
                return Err(StorageError::Offline {
                    path: w.file.as_ref().map(|(_, p)| p.clone()).unwrap_or_default(),
                    cause: cause.clone(),
                });
            }
            if w.generation != self.generation || w.synced >= self.target {
                // Covered by an earlier sync, or truncated away: nothing of ours is left
                // unsynced in this generation.
                return Ok(FlushDone {
                    synced: w.synced,
                    generation: w.generation,
                });
            }
            (w.file.clone(), w.end, w.generation)
        };
        let Some((file, path)) = file else {
            // In the middle of a truncation (which holds the log lock, so no append of
            // this generation can be waiting): nothing to sync, nothing to claim.
            return Ok(FlushDone {
                synced: lock(&f.written).synced,
                generation,
            });
        };
        f.fsyncs.fetch_add(1, Ordering::Relaxed);
        let started = std::time::Instant::now();
        // Never retried: see the module's design note.
        let synced = file.sync_data();
        flushed(started);
        if let Err(e) = synced {
            let e = StorageError::io(&path, e);
            lock(&f.written).failed = Some(e.to_string());
            return Err(e);
        }
        let mut w = lock(&f.written);
        if w.generation == generation {
            w.synced = w.synced.max(end);
        }
        Ok(FlushDone {
            synced: end,
            generation,
        })
    }
}
