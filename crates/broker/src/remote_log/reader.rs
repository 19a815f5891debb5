//! Reads from the remote tier (Kafka's `RemoteLogReader` and its index cache): a remote
//! segment is downloaded whole into a directory of the data directory's
//! `remote-log-cache`, opened as a segment (`rill_storage::RemoteSegmentReader`), and
//! read there like a local one. The cache holds at most
//! `remote.log.reader.cache.size.bytes`, least recently used copies going first; a
//! reader that holds an evicted copy's files keeps reading them (they are unlinked, not
//! truncated). A read near the end of a segment fetches the next one in the background
//! (the read-ahead: a consumer catching up from the remote tier reads them in order).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rill_metadata::remote_log::PartitionRemoteSegments;
use rill_metadata::{RemoteLogSegmentMetadata, RemoteLogSegmentState};
use rill_protocol::Uuid;
use rill_storage::segment::segment_file;
use rill_storage::{AbortedTxn, EpochEntry, FetchDataInfo, RemoteSegmentReader};

use super::storage::{self, RemotePartition, RemoteStorageError, RemoteStorageManager};
use crate::metrics;

/// The cache directory under the data directory (not a partition's name, so the stray
/// partition sweep leaves it alone).
pub const CACHE_DIR: &str = "remote-log-cache";

/// The remote segment whose records hold `offset`: a finished copy starting at or below
/// it and ending at or above it (the latest-starting one when copies overlap, as they
/// may after a leader change).
pub fn segment_for_offset(
    segments: &PartitionRemoteSegments,
    offset: i64,
) -> Option<&RemoteLogSegmentMetadata> {
    segments
        .values()
        .filter(|m| {
            m.state == RemoteLogSegmentState::CopySegmentFinished
                && m.start_offset <= offset
                && offset <= m.end_offset
        })
        .max_by_key(|m| m.start_offset)
}

/// The finished copies, oldest first by start offset.
pub fn finished_segments(segments: &PartitionRemoteSegments) -> Vec<&RemoteLogSegmentMetadata> {
    let mut v: Vec<_> = segments
        .values()
        .filter(|m| m.state == RemoteLogSegmentState::CopySegmentFinished)
        .collect();
    v.sort_by_key(|m| (m.start_offset, m.end_offset));
    v
}

struct CachedSegment {
    reader: Arc<Mutex<RemoteSegmentReader>>,
    dir: PathBuf,
    bytes: u64,
    last_used: u64,
}

pub struct RemoteLogReader {
    rsm: Arc<RemoteStorageManager>,
    dir: PathBuf,
    max_bytes: u64,
    cached: Mutex<HashMap<Uuid, CachedSegment>>,
    /// One download per segment at a time: a second reader of a cold segment waits for
    /// the first one's download instead of starting its own.
    loading: Mutex<HashMap<Uuid, Arc<tokio::sync::Mutex<()>>>>,
    tick: AtomicU64,
    /// Per partition, held by whoever changes its remote segments (the periodic task,
    /// DeleteRecords), so that two never mark or delete the same segment at once.
    changing: Mutex<HashMap<(Uuid, i32), ChangeLock>>,
}

/// See `RemoteLogReader::changing`.
type ChangeLock = Arc<tokio::sync::Mutex<()>>;

impl std::fmt::Debug for RemoteLogReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteLogReader")
            .field("dir", &self.dir)
            .field("max_bytes", &self.max_bytes)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl RemoteLogReader {
    /// A reader with its cache in `data_dir/remote-log-cache`, emptied now (a copy left
    /// by an earlier run may be torn).
    pub fn new(
        rsm: Arc<RemoteStorageManager>,
        data_dir: &std::path::Path,
        max_bytes: u64,
    ) -> std::io::Result<Self> {
        let dir = data_dir.join(CACHE_DIR);
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        std::fs::create_dir_all(&dir)?;
        Ok(Self {
            rsm,
            dir,
            max_bytes,
            cached: Mutex::new(HashMap::new()),
            loading: Mutex::new(HashMap::new()),
            tick: AtomicU64::new(0),
            changing: Mutex::new(HashMap::new()),
        })
    }

    pub fn storage(&self) -> &Arc<RemoteStorageManager> {
        &self.rsm
    }

    /// The lock of a partition's remote segment changes (see `changing`).
    pub fn change_lock(&self, topic_id: Uuid, partition: i32) -> ChangeLock {
        lock(&self.changing)
            .entry((topic_id, partition))
            .or_default()
            .clone()
    }

    /// Whole batches from the one holding `offset` in the remote segment `seg`, as a
    /// local read returns them; `None` when the copy has nothing at or after it.
    #[allow(clippy::too_many_arguments, reason = "one Fetch partition's fields")]
    pub async fn read(
        self: &Arc<Self>,
        p: &RemotePartition,
        seg: &RemoteLogSegmentMetadata,
        next: Option<&RemoteLogSegmentMetadata>,
        offset: i64,
        max_bytes: usize,
        max_offset: i64,
        min_one_message: bool,
    ) -> Result<Option<FetchDataInfo>, RemoteStorageError> {
        let reader = self.segment(p, seg).await?;
        let read = {
            let r = lock(&reader);
            r.read(offset, max_bytes, max_offset, min_one_message)
        };
        let info = read.map_err(|e| RemoteStorageError::Io {
            path: format!("remote copy of {}", seg.segment_id),
            source: std::io::Error::other(e.to_string()),
        })?;
        let m = &metrics::global().remote_log;
        m.fetch_requests.fetch_add(1, Ordering::Relaxed);
        if let Some(i) = &info {
            m.fetch_bytes
                .fetch_add(i.records.len() as u64, Ordering::Relaxed);
            // Read-ahead: past the middle of this copy, fetch the next one now.
            let past_middle = offset > seg.start_offset + (seg.end_offset - seg.start_offset) / 2;
            if let Some(next) = next.filter(|_| past_middle).cloned() {
                let this = self.clone();
                let p = p.clone();
                tokio::spawn(async move {
                    if let Err(e) = this.segment(&p, &next).await {
                        tracing::debug!(error = %e, "remote read-ahead failed");
                    }
                });
            }
        }
        Ok(info)
    }

    /// ListOffsets by timestamp in one remote segment: `(offset, timestamp, epoch)`.
    pub async fn offset_for_timestamp(
        &self,
        p: &RemotePartition,
        seg: &RemoteLogSegmentMetadata,
        timestamp: i64,
    ) -> Result<Option<(i64, i64, i32)>, RemoteStorageError> {
        let reader = self.segment(p, seg).await?;
        let found = lock(&reader).offset_for_timestamp(timestamp);
        found.map_err(|e| RemoteStorageError::Io {
            path: format!("remote copy of {}", seg.segment_id),
            source: std::io::Error::other(e.to_string()),
        })
    }

    /// The aborted transactions of a remote segment overlapping `[from, to)`.
    pub async fn aborted_txns(
        &self,
        p: &RemotePartition,
        seg: &RemoteLogSegmentMetadata,
        from: i64,
        to: i64,
    ) -> Result<Vec<AbortedTxn>, RemoteStorageError> {
        let reader = self.segment(p, seg).await?;
        let found = lock(&reader).aborted_txns(from, to);
        found.map_err(|e| RemoteStorageError::Io {
            path: format!("remote copy of {}", seg.segment_id),
            source: std::io::Error::other(e.to_string()),
        })
    }

    /// What a replica that starts its log at `seg.end_offset + 1` needs of the leader's
    /// state there: the leader epochs and the producer snapshot the copy carries.
    pub async fn aux_state(
        &self,
        p: &RemotePartition,
        seg: &RemoteLogSegmentMetadata,
    ) -> Result<(Vec<EpochEntry>, Option<bytes::Bytes>), RemoteStorageError> {
        let checkpoint = self
            .rsm
            .fetch_bytes(
                p,
                seg.start_offset,
                seg.segment_id,
                storage::LEADER_EPOCH_CHECKPOINT,
            )
            .await?;
        let epochs = checkpoint
            .as_deref()
            .and_then(rill_storage::remote::parse_epoch_checkpoint)
            .unwrap_or_default();
        let snapshot = self
            .rsm
            .fetch_bytes(
                p,
                seg.start_offset,
                seg.segment_id,
                storage::PRODUCER_SNAPSHOT,
            )
            .await?;
        Ok((epochs, snapshot))
    }

    /// The cached copy of `seg`, downloaded first when it is not cached.
    async fn segment(
        &self,
        p: &RemotePartition,
        seg: &RemoteLogSegmentMetadata,
    ) -> Result<Arc<Mutex<RemoteSegmentReader>>, RemoteStorageError> {
        let m = &metrics::global().remote_log;
        if let Some(r) = self.hit(seg.segment_id) {
            m.cache_hits.fetch_add(1, Ordering::Relaxed);
            return Ok(r);
        }
        let gate = lock(&self.loading)
            .entry(seg.segment_id)
            .or_default()
            .clone();
        let _loading = gate.lock().await;
        if let Some(r) = self.hit(seg.segment_id) {
            m.cache_hits.fetch_add(1, Ordering::Relaxed);
            return Ok(r);
        }
        m.cache_misses.fetch_add(1, Ordering::Relaxed);
        let loaded = self.download(p, seg).await;
        lock(&self.loading).remove(&seg.segment_id);
        let (reader, dir, bytes) = loaded?;
        let reader = Arc::new(Mutex::new(reader));
        let tick = self.tick.fetch_add(1, Ordering::Relaxed);
        let evicted = {
            let mut cached = lock(&self.cached);
            cached.insert(
                seg.segment_id,
                CachedSegment {
                    reader: reader.clone(),
                    dir,
                    bytes,
                    last_used: tick,
                },
            );
            let mut evicted = Vec::new();
            let mut total: u64 = cached.values().map(|c| c.bytes).sum();
            while total > self.max_bytes && cached.len() > 1 {
                let Some(oldest) = cached
                    .iter()
                    .filter(|(id, _)| **id != seg.segment_id)
                    .min_by_key(|(_, c)| c.last_used)
                    .map(|(id, _)| *id)
                else {
                    break;
                };
                if let Some(c) = cached.remove(&oldest) {
                    total = total.saturating_sub(c.bytes);
                    evicted.push(c.dir);
                }
            }
            m.cache_bytes.store(total, Ordering::Relaxed);
            evicted
        };
        for dir in evicted {
            let _ = tokio::fs::remove_dir_all(&dir).await;
        }
        Ok(reader)
    }

    fn hit(&self, id: Uuid) -> Option<Arc<Mutex<RemoteSegmentReader>>> {
        let tick = self.tick.fetch_add(1, Ordering::Relaxed);
        let mut cached = lock(&self.cached);
        let c = cached.get_mut(&id)?;
        c.last_used = tick;
        Some(c.reader.clone())
    }

    async fn download(
        &self,
        p: &RemotePartition,
        seg: &RemoteLogSegmentMetadata,
    ) -> Result<(RemoteSegmentReader, PathBuf, u64), RemoteStorageError> {
        let dir = self.dir.join(seg.segment_id.to_string());
        let io = |e| RemoteStorageError::Io {
            path: dir.display().to_string(),
            source: e,
        };
        let _ = tokio::fs::remove_dir_all(&dir).await;
        tokio::fs::create_dir_all(&dir).await.map_err(io)?;
        let started = std::time::Instant::now();
        let mut bytes = 0;
        for suffix in [
            storage::OFFSET_INDEX,
            storage::TIME_INDEX,
            storage::TXN_INDEX,
            storage::LOG,
        ] {
            let dest = segment_file(&dir, seg.start_offset, suffix);
            let found = self
                .rsm
                .fetch_to_file(p, seg.start_offset, seg.segment_id, suffix, &dest)
                .await;
            match found {
                Ok(true) => {
                    bytes += tokio::fs::metadata(&dest)
                        .await
                        .map(|m| m.len())
                        .unwrap_or(0)
                }
                Ok(false) if suffix == storage::LOG => {
                    let _ = tokio::fs::remove_dir_all(&dir).await;
                    return Err(RemoteStorageError::Io {
                        path: format!(
                            "{}",
                            self.rsm.object(p, seg.start_offset, seg.segment_id, suffix)
                        ),
                        source: std::io::Error::new(
                            std::io::ErrorKind::NotFound,
                            "a finished remote segment's log object is missing",
                        ),
                    });
                }
                Ok(false) => {}
                Err(e) => {
                    let _ = tokio::fs::remove_dir_all(&dir).await;
                    return Err(e);
                }
            }
        }
        let m = &metrics::global().remote_log;
        m.download_bytes.fetch_add(bytes, Ordering::Relaxed);
        tracing::debug!(
            segment = %seg.segment_id,
            start = seg.start_offset,
            bytes,
            ms = started.elapsed().as_millis() as u64,
            "remote segment fetched into the cache"
        );
        let (open_dir, base) = (dir.clone(), seg.start_offset);
        let reader =
            tokio::task::spawn_blocking(move || RemoteSegmentReader::open(&open_dir, base))
                .await
                .map_err(|e| RemoteStorageError::Io {
                    path: dir.display().to_string(),
                    source: std::io::Error::other(e.to_string()),
                })?
                .map_err(|e| RemoteStorageError::Io {
                    path: dir.display().to_string(),
                    source: std::io::Error::other(e.to_string()),
                })?;
        Ok((reader, dir, bytes))
    }
}
