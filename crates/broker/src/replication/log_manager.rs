//! Background log maintenance: time-based rolls and retention (`cleanup.policy=delete`),
//! and the log cleaner (`cleanup.policy=compact`), as Kafka's `LogManager` and
//! `LogCleaner` threads do.
//!
//! Neither blocks produce or fetch for long: retention takes each partition's lock only to
//! roll and unlink whole segments; the cleaner takes it to prepare a clean and to swap the
//! result in, and rewrites the segments on a blocking thread with no lock held (the
//! segments it reads are immutable, see `rill_storage::cleaner`).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use rill_storage::CleanerConfig;
use tokio::sync::watch;

use crate::config::BrokerConfig;
use crate::error::BrokerError;
use crate::replication::replica_manager::ReplicaManager;

/// How often retention runs (`log.retention.check.interval.ms`); the cleaner's wait,
/// `log.cleaner.backoff.ms`, is dynamic and comes with its [`CleanerSettings`].
#[derive(Debug, Clone, Copy)]
pub struct LogManagerConfig {
    pub retention_check_interval: Duration,
    /// `producer.id.expiration.check.interval.ms`.
    pub producer_expiration_check_interval: Duration,
}

impl LogManagerConfig {
    /// The interval from `log.retention.check.interval.ms`.
    pub fn from_config(config: &BrokerConfig) -> Result<Self, BrokerError> {
        let retention: u64 = config.parse("log.retention.check.interval.ms")?;
        let producers: u64 = config.parse("producer.id.expiration.check.interval.ms")?;
        Ok(Self {
            retention_check_interval: Duration::from_millis(retention.max(10)),
            producer_expiration_check_interval: Duration::from_millis(producers.max(10)),
        })
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// The cleaner's settings as they are now (they are dynamic): what a clean is given, and
/// how long the cleaner waits after running out of logs to clean.
pub struct CleanerSettings {
    pub clean: CleanerConfig,
    /// `log.cleaner.backoff.ms`.
    pub backoff: Duration,
}

impl CleanerSettings {
    /// This broker's settings as they are now: each key's dynamic value for this broker,
    /// then the cluster-wide one, then the static config, then Kafka's default.
    pub fn of(config: &BrokerConfig, image: &rill_metadata::MetadataImage, node_id: i32) -> Self {
        let backoff_ms =
            crate::config::broker_config_value(config, image, node_id, "log.cleaner.backoff.ms")
                .and_then(|(v, _)| v.trim().parse::<u64>().ok())
                .unwrap_or(DEFAULT_BACKOFF_MS);
        Self {
            clean: crate::config::cleaner_config(config, image, node_id),
            backoff: Duration::from_millis(backoff_ms),
        }
    }
}

impl Default for CleanerSettings {
    fn default() -> Self {
        Self {
            clean: CleanerConfig::default(),
            backoff: Duration::from_millis(DEFAULT_BACKOFF_MS),
        }
    }
}

/// Kafka's `log.cleaner.backoff.ms`.
const DEFAULT_BACKOFF_MS: u64 = 15_000;

/// Where the cleaner reads its settings, before each clean and during each wait.
pub type CleanerConfigSource = Box<dyn Fn() -> CleanerSettings + Send + Sync>;

/// The longest the cleaner sleeps before it reads `log.cleaner.backoff.ms` again, so
/// that a shortened wait applies within this.
const BACKOFF_RECHECK: Duration = Duration::from_secs(1);

/// Where the producer expiration reads `producer.id.expiration.ms` (dynamic) each time.
pub type ProducerExpirationSource = Box<dyn Fn() -> i64 + Send + Sync>;

/// Starts the retention, cleaner and producer expiration loops; they stop when
/// `shutdown` turns true.
pub fn start(
    replicas: Arc<ReplicaManager>,
    cleaner_config: CleanerConfigSource,
    producer_expiration: ProducerExpirationSource,
    config: LogManagerConfig,
    shutdown: watch::Receiver<bool>,
) {
    tokio::spawn(retention_loop(
        replicas.clone(),
        config.retention_check_interval,
        shutdown.clone(),
    ));
    tokio::spawn(producer_expiration_loop(
        replicas.clone(),
        producer_expiration,
        config.producer_expiration_check_interval,
        shutdown.clone(),
    ));
    tokio::spawn(cleaner_loop(replicas, cleaner_config, shutdown));
}

/// Kafka's `PeriodicProducerExpirationCheck`: every
/// `producer.id.expiration.check.interval.ms`, each log forgets the producers idle for
/// `producer.id.expiration.ms` that have no open transaction.
async fn producer_expiration_loop(
    replicas: Arc<ReplicaManager>,
    expiration_ms: ProducerExpirationSource,
    interval: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = shutdown.changed() => return,
        }
        let (now, expiration) = (now_ms(), expiration_ms());
        for (tp, partition) in replicas.partitions() {
            match partition.with_log(|log| log.remove_expired_producers(now, expiration)) {
                Ok(0) => {}
                Ok(removed) => tracing::debug!(%tp, removed, "expired producers forgotten"),
                Err(_) => tracing::error!(%tp, "log lock poisoned"),
            }
        }
    }
}

async fn retention_loop(
    replicas: Arc<ReplicaManager>,
    interval: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = shutdown.changed() => return,
        }
        let now = now_ms();
        for (tp, partition) in replicas.partitions() {
            // A pass over thousands of logs takes a while; a stop does not wait for it.
            if *shutdown.borrow() {
                return;
            }
            let outcome = partition.with_log(|log| {
                log.maybe_roll(now)?;
                let result = if log.config().cleanup_policy.is_delete() {
                    Some(log.delete_old_segments(now)?)
                } else {
                    None
                };
                log.checkpoint_high_watermark()?;
                Ok::<_, rill_storage::StorageError>(result)
            });
            match outcome {
                Ok(Ok(Some(r))) if r.deleted_segments > 0 => {
                    let m = &crate::metrics::global().retention;
                    m.deleted_segments
                        .fetch_add(r.deleted_segments as u64, Ordering::Relaxed);
                    m.deleted_bytes
                        .fetch_add(r.deleted_bytes, Ordering::Relaxed);
                    tracing::info!(
                        %tp,
                        segments = r.deleted_segments,
                        bytes = r.deleted_bytes,
                        log_start_offset = r.log_start_offset,
                        "retention deleted segments"
                    )
                }
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    replicas.log_dir_failed(&partition, format_args!("retention of {tp}"), &e);
                }
                Err(_) => tracing::error!(%tp, "log lock poisoned"),
            }
        }
    }
}

async fn cleaner_loop(
    replicas: Arc<ReplicaManager>,
    cleaner_config: CleanerConfigSource,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let mut waited = Duration::ZERO;
        loop {
            let backoff = cleaner_config().backoff.max(Duration::from_millis(10));
            let Some(left) = backoff.checked_sub(waited).filter(|d| !d.is_zero()) else {
                break;
            };
            let step = left.min(BACKOFF_RECHECK);
            tokio::select! {
                _ = tokio::time::sleep(step) => waited += step,
                _ = shutdown.changed() => return,
            }
        }
        // Clean logs one at a time, dirtiest first, until none needs it.
        loop {
            let now = now_ms();
            let dirtiest = replicas
                .partitions()
                .into_iter()
                .filter_map(|(tp, p)| {
                    let ratio = p
                        .with_log(|log| {
                            (log.config().cleanup_policy.is_compact() && log.needs_cleaning(now))
                                .then(|| log.dirty_ratio(now))
                        })
                        .ok()
                        .flatten()?;
                    Some((ratio, tp, p))
                })
                .max_by(|a, b| a.0.total_cmp(&b.0));
            let Some((_, tp, partition)) = dirtiest else {
                break;
            };
            let cleaner = cleaner_config().clean;
            let Ok(Some(task)) = partition.with_log(|log| log.prepare_clean(now, &cleaner)) else {
                break;
            };
            let started = std::time::Instant::now();
            let ran = tokio::task::spawn_blocking(move || task.run()).await;
            let elapsed = started.elapsed();
            let applied = match ran {
                Ok(Ok(cleaned)) => partition.with_log(|log| log.apply_clean(cleaned)),
                Ok(Err(e)) => {
                    // Kafka's cleaner takes the log directory offline on an I/O error
                    // (a full disk while writing the cleaned segments, most likely).
                    if e.io_error().is_some() {
                        replicas.log_dir_failed(&partition, format_args!("cleaning of {tp}"), &e);
                    } else {
                        tracing::error!(%tp, error = %e, "cleaning failed");
                    }
                    let _ = partition.with_log(|log| log.abort_clean());
                    break;
                }
                Err(e) => {
                    tracing::error!(%tp, error = %e, "cleaner task panicked");
                    let _ = partition.with_log(|log| log.abort_clean());
                    break;
                }
            };
            match applied {
                Ok(Ok(Some(stats))) => {
                    crate::metrics::global().cleaner.cleaned(&stats, elapsed);
                    tracing::info!(
                    %tp,
                    bytes_read = stats.bytes_read,
                    bytes_written = stats.bytes_written,
                    records_retained = stats.records_retained,
                    // The rewrite alone, with no lock held: the cleaner's throughput
                    // (bench/cleaner.sh reads these).
                    clean_ms = elapsed.as_secs_f64() * 1e3,
                    mb_per_s = stats.bytes_read as f64 / 1e6 / elapsed.as_secs_f64().max(1e-9),
                    throttled_ms = stats.throttled.as_secs_f64() * 1e3,
                    aborted_removed = stats.aborted_removed,
                    markers_removed = stats.markers_removed,
                    "cleaned log"
                    )
                }
                Ok(Ok(None)) => {}
                Ok(Err(e)) => {
                    // The swap failed on disk: the log is offline now, and reopening it
                    // at the next start finishes or rolls back the swap.
                    replicas.log_dir_failed(
                        &partition,
                        format_args!("swapping in cleaned segments of {tp}"),
                        &e,
                    );
                    break;
                }
                Err(_) => break,
            }
            if *shutdown.borrow() {
                return;
            }
        }
        crate::metrics::global()
            .cleaner
            .last_run_end_ms
            .store(now_ms(), std::sync::atomic::Ordering::Relaxed);
    }
}
